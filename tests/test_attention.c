/* Fused attention: against a naive softmax(QK^T)V computed in double, at head dims
 * 8..136 (every multiple of 8 is a fast-path head dim: 8, 24, 40, 72 and 136 are not
 * multiples of 16) and sequence lengths that are not multiples of the kernel's blocks,
 * down to 1, 3, 15 and 17 (the fast paths trim their tiles to short sequences);
 * keys outside [kv_begin, kv_end) holding NaN change nothing; partial results over
 * split key sets merge into the unsplit result; thread splits are deterministic.
 * Tolerances: f32 max|err| <= 1e-5 * max|ref|; bf16 |err| <= 4e-3 * max|v| + 2^-8 |ref|
 * (probabilities are rounded to bf16 before the PV product, output rounded once). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "difflet/check.h"
#include "difflet/kernels.h"
#include "kernels/kernels_impl.h"
#include "test_util.h"

typedef struct {
    int64_t sq, sk, h, d;
    dl_dtype dt;
    void *q, *k, *v;
} problem;

static problem make(dl_dtype dt, int64_t sq, int64_t sk, int64_t h, int64_t d, uint64_t seed) {
    problem p = {sq, sk, h, d, dt, NULL, NULL, NULL};
    size_t es = dl_dtype_size(dt);
    p.q = malloc((size_t)(sq * h * d) * es);
    p.k = malloc((size_t)(sk * h * d) * es);
    p.v = malloc((size_t)(sk * h * d) * es);
    dl_fill_uniform(dt, p.q, sq * h * d, -1.5f, 1.5f, seed);
    dl_fill_uniform(dt, p.k, sk * h * d, -1.5f, 1.5f, seed + 1);
    dl_fill_uniform(dt, p.v, sk * h * d, -1.f, 1.f, seed + 2);
    return p;
}

static void drop(problem *p) { free(p->q), free(p->k), free(p->v); }

/* out: [sq, h, d] doubles; causal and bias_rel as in dl_attn_args */
static void naive_ext(const problem *p, int64_t kb, int64_t ke0, float scale, int causal, const float *bias_rel,
                      double *out) {
    double *s = malloc((size_t)(ke0 - kb + 1) * sizeof(double));
    for (int64_t hh = 0; hh < p->h; hh++)
        for (int64_t i = 0; i < p->sq; i++) {
            double mx = -INFINITY, sum = 0;
            int64_t ke = causal && i + 1 < ke0 ? (i + 1 > kb ? i + 1 : kb) : ke0;
            for (int64_t j = kb; j < ke; j++) {
                double acc = 0;
                for (int64_t t = 0; t < p->d; t++)
                    acc += (double)dl_load1(p->dt, p->q, (i * p->h + hh) * p->d + t) *
                           dl_load1(p->dt, p->k, (j * p->h + hh) * p->d + t);
                s[j - kb] = acc * scale + (bias_rel ? bias_rel[hh * (p->sq + p->sk - 1) + j - i + p->sq - 1] : 0.0);
                if (s[j - kb] > mx) mx = s[j - kb];
            }
            for (int64_t j = kb; j < ke; j++) sum += (s[j - kb] = exp(s[j - kb] - mx));
            for (int64_t t = 0; t < p->d; t++) {
                double acc = 0;
                for (int64_t j = kb; j < ke; j++)
                    acc += s[j - kb] * dl_load1(p->dt, p->v, (j * p->h + hh) * p->d + t);
                out[(i * p->h + hh) * p->d + t] = ke > kb ? acc / sum : 0.0;
            }
        }
    free(s);
}

static void naive(const problem *p, int64_t kb, int64_t ke, float scale, double *out) {
    naive_ext(p, kb, ke, scale, 0, NULL, out);
}

static dl_attn_args args_for(const problem *p, void *out, int64_t kb, int64_t ke) {
    dl_attn_args a = {.dt = p->dt, .sq = p->sq, .sk = p->sk, .heads = p->h, .head_dim = p->d,
                      .q = p->q, .k = p->k, .v = p->v, .out = out, .kv_begin = kb, .kv_end = ke,
                      .scale = 1.f / sqrtf((float)p->d)};
    return a;
}

/* worst |err| relative to the bound for this dtype */
static double against_naive(const problem *p, const void *out, const double *ref) {
    int64_t n = p->sq * p->h * p->d;
    double mref = 0, worst = 0;
    for (int64_t i = 0; i < n; i++) mref = fmax(mref, fabs(ref[i]));
    for (int64_t i = 0; i < n; i++) {
        double g = dl_load1(p->dt, out, i), err = fabs(g - ref[i]);
        double allow = p->dt == DL_F32 ? 1e-5 * mref : 4e-3 * 1.0 + fabs(ref[i]) / 256.0;
        if (isnan(g)) return INFINITY;
        worst = fmax(worst, err / fmax(allow, 1e-30));
    }
    return worst;
}

static void test_vs_naive(void) {
    static const int64_t cfg[][4] = { /* sq, sk, heads, head_dim */
        {1, 1, 1, 64}, {17, 33, 2, 64}, {130, 129, 3, 128}, {64, 300, 2, 32},
        {65, 257, 1, 96}, {200, 77, 2, 128}, {5, 513, 1, 64}, {40, 40, 2, 80},
        /* head dims 8 mod 16 and short sequences (OpenSora's 72 = 1152 / 16, its
           temporal attention over 15 latent frames) */
        {1, 1, 2, 8}, {3, 15, 2, 8}, {15, 15, 3, 24}, {17, 3, 1, 24}, {15, 17, 2, 40},
        {1, 17, 1, 40}, {15, 15, 4, 72}, {17, 17, 2, 72}, {3, 1, 2, 72}, {130, 129, 2, 72},
        {61, 405, 1, 72}, {15, 3, 2, 136}, {17, 150, 1, 136}, {200, 77, 1, 136}};
    for (int dti = 0; dti < 2; dti++) {
        dl_dtype dt = dti ? DL_BF16 : DL_F32;
        for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
            problem p = make(dt, cfg[c][0], cfg[c][1], cfg[c][2], cfg[c][3], 10 + c);
            int64_t n = p.sq * p.h * p.d;
            double *ref = malloc((size_t)n * sizeof(double));
            void *out = malloc((size_t)n * 4);
            int64_t intervals[3][2] = {{0, p.sk}, {p.sk / 3, p.sk - p.sk / 4}, {p.sk - 1, p.sk}};
            for (int iv = 0; iv < 3; iv++) {
                int64_t kb = intervals[iv][0], ke = intervals[iv][1];
                naive(&p, kb, ke, 1.f / sqrtf((float)p.d), ref);
                dl_attn_args a = args_for(&p, out, kb, ke);
                CHECK(dl_attn(&a, NULL) == DL_OK, "%s", dl_last_error());
                double w = against_naive(&p, out, ref);
                CHECK(w <= 1.0, "%s sq=%lld sk=%lld h=%lld d=%lld keys [%lld,%lld): %.3fx bound",
                      dl_dtype_name(dt), (long long)p.sq, (long long)p.sk, (long long)p.h,
                      (long long)p.d, (long long)kb, (long long)ke, w);
            }
            free(ref), free(out);
            drop(&p);
        }
    }
}

/* NaN in every key and value outside the interval: output identical to zeros there. */
static void test_nan_outside(void) {
    static const int64_t cfg[][5] = {{70, 150, 64, 20, 131}, {15, 17, 72, 1, 16}, {17, 15, 40, 3, 4}}; /* sq, sk, d, kb, ke */
    for (int ci = 0; ci < 2 * 3; ci++) { /* (shape, dtype) pairs */
        dl_dtype dt = ci % 2 ? DL_BF16 : DL_F32;
        const int64_t *c = cfg[ci / 2];
        for (int force_ref = 0; force_ref < 2; force_ref++) {
            dl_isa isa = dl_kernel_isa();
            if (force_ref) dl_set_kernel_isa(DL_ISA_REF);
            problem p = make(dt, c[0], c[1], 2, c[2], 99);
            int64_t kb = c[3], ke = c[4], row = p.h * p.d, n = p.sq * row;
            size_t es = dl_dtype_size(dt);
            void *o1 = malloc((size_t)n * es), *o2 = malloc((size_t)n * es);
            for (int64_t j = 0; j < p.sk; j++)
                if (j < kb || j >= ke)
                    for (int64_t t = 0; t < row; t++) {
                        dl_store1(dt, p.k, j * row + t, 0.f);
                        dl_store1(dt, p.v, j * row + t, 0.f);
                    }
            dl_attn_args a = args_for(&p, o1, kb, ke);
            dl_attn(&a, NULL);
            for (int64_t j = 0; j < p.sk; j++)
                if (j < kb || j >= ke)
                    for (int64_t t = 0; t < row; t++) {
                        dl_store1(dt, p.k, j * row + t, NAN);
                        dl_store1(dt, p.v, j * row + t, NAN);
                    }
            a.out = o2;
            dl_attn(&a, NULL);
            int finite = 1;
            for (int64_t i = 0; i < n; i++) finite &= isfinite(dl_load1(dt, o2, i));
            CHECK(finite && !memcmp(o1, o2, (size_t)n * es), "%s %s d=%lld: NaN keys outside the interval changed the output",
                  dl_dtype_name(dt), force_ref ? "ref" : "fast", (long long)p.d);
            free(o1), free(o2);
            drop(&p);
            dl_set_kernel_isa(isa);
        }
    }
}

/* Partials over [0, a), [a, a) (empty) and [a, S) merge into the unsplit output. */
static void test_merge(void) {
    static const int64_t cfg[][4] = {{90, 333, 64, 150}, {15, 15, 72, 7}, {3, 17, 136, 16}}; /* sq, sk, d, cut */
    for (int ci = 0; ci < 2 * 3; ci++) { /* (shape, dtype) pairs */
        dl_dtype dt = ci % 2 ? DL_BF16 : DL_F32;
        const int64_t *c = cfg[ci / 2];
        problem p = make(dt, c[0], c[1], 3, c[2], 7);
        int64_t n = p.sq * p.h * p.d, ns = p.sq * p.h, cut = c[3];
        size_t es = dl_dtype_size(dt);
        void *whole = malloc((size_t)n * es), *merged = malloc((size_t)n * es);
        float *o[3], *m[3], *l[3];
        for (int i = 0; i < 3; i++) {
            o[i] = malloc((size_t)n * 4);
            m[i] = malloc((size_t)ns * 4);
            l[i] = malloc((size_t)ns * 4);
        }
        dl_attn_args a = args_for(&p, whole, 0, p.sk);
        dl_attn(&a, NULL);
        int64_t iv[3][2] = {{0, cut}, {cut, cut}, {cut, p.sk}};
        dl_attn_partial parts[3];
        for (int i = 0; i < 3; i++) {
            dl_attn_args pa = args_for(&p, NULL, iv[i][0], iv[i][1]);
            pa.o_part = o[i], pa.m = m[i], pa.l = l[i];
            CHECK(dl_attn(&pa, NULL) == DL_OK, "partial: %s", dl_last_error());
            parts[i] = (dl_attn_partial){o[i], m[i], l[i]};
        }
        CHECK(m[1][0] == -INFINITY && l[1][0] == 0.f, "empty interval: m=-inf, l=0");
        dl_attn_merge_t(parts, 3, p.sq, p.h, p.d, dt, merged, 0, NULL, NULL, NULL, 0, 1);
        double worst = 0, mx = 0;
        for (int64_t i = 0; i < n; i++) {
            double w = dl_load1(dt, whole, i), g = dl_load1(dt, merged, i);
            worst = fmax(worst, fabs(w - g));
            mx = fmax(mx, fabs(w));
        }
        /* f32: rounding only, within the forward error bound of an n-term f32 sum of
           probability-weighted values, n * 2^-24 * max|v| (v is in [-1, 1]); bf16: the
           two sides round P and the output differently, bounded by two output
           roundings of the largest value */
        double bound = dt == DL_F32 ? (double)p.sk * 0x1p-24 : 2.0 * mx / 256.0;
        CHECK(worst <= bound, "%s d=%lld merge vs unsplit: %g > %g", dl_dtype_name(dt), (long long)p.d, worst, bound);
        /* two-round merge equals one-round */
        float *om = malloc((size_t)n * 4), *mm = malloc((size_t)ns * 4), *lm = malloc((size_t)ns * 4);
        dl_attn_merge_t(parts, 2, p.sq, p.h, p.d, dt, NULL, 0, om, mm, lm, 0, 1);
        dl_attn_partial two[2] = {{om, mm, lm}, parts[2]};
        void *merged2 = malloc((size_t)n * es);
        dl_attn_merge_t(two, 2, p.sq, p.h, p.d, dt, merged2, 0, NULL, NULL, NULL, 0, 1);
        double w2 = 0;
        for (int64_t i = 0; i < n; i++)
            w2 = fmax(w2, fabs(dl_load1(dt, merged2, i) - dl_load1(dt, merged, i)));
        CHECK(w2 <= (dt == DL_F32 ? 1e-6 * mx : mx / 256.0), "merge in two rounds: %g", w2);
        free(om), free(mm), free(lm), free(merged2);
        for (int i = 0; i < 3; i++) free(o[i]), free(m[i]), free(l[i]);
        free(whole), free(merged);
        drop(&p);
    }
}

/* Q, K, V inside one fused [S, 3, H, D] buffer; output into a wider row; any split
 * of the work over threads gives the same bits. */
static void test_strides_and_splits(void) {
    static const int64_t cfg[][2] = {{150, 64}, {150, 72}, {15, 72}, {17, 8}, {3, 136}}; /* S, head_dim */
    for (int ci = 0; ci < 2 * 5; ci++) { /* (shape, dtype) pairs */
        dl_dtype dt = ci % 2 ? DL_BF16 : DL_F32;
        const int64_t S = cfg[ci / 2][0], H = 2, D = cfg[ci / 2][1], hd = H * D;
        size_t es = dl_dtype_size(dt);
        void *qkv = malloc((size_t)(S * 3 * hd) * es);
        dl_fill_uniform(dt, qkv, S * 3 * hd, -1.f, 1.f, 5);
        problem p = make(dt, S, S, H, D, 1);
        for (int64_t s = 0; s < S; s++) /* the same data, packed */
            for (int w = 0; w < 3; w++) {
                void *dst = w == 0 ? p.q : w == 1 ? p.k : p.v;
                memcpy((char *)dst + (size_t)(s * hd) * es, (char *)qkv + (size_t)((s * 3 + w) * hd) * es, (size_t)hd * es);
            }
        void *o_plain = malloc((size_t)(S * hd) * es), *o_wide = malloc((size_t)(S * 2 * hd) * es);
        dl_attn_args a = args_for(&p, o_plain, S > 3 ? 3 : 1, S);
        dl_attn(&a, NULL);
        dl_attn_args b = a;
        b.q = qkv;
        b.k = (char *)qkv + (size_t)hd * es;
        b.v = (char *)qkv + (size_t)(2 * hd) * es;
        b.q_stride = b.k_stride = b.v_stride = 3 * hd;
        b.out = o_wide;
        b.out_stride = 2 * hd;
        int nth = 5;
        void *scratch = dl_aligned_alloc(dl_attn_scratch_bytes(&b, nth) + 64);
        for (int ith = nth - 1; ith >= 0; ith--) dl_attn_t(&b, scratch, ith, nth);
        int same = 1;
        for (int64_t s = 0; s < S; s++)
            same &= !memcmp((char *)o_plain + (size_t)(s * hd) * es, (char *)o_wide + (size_t)(s * 2 * hd) * es, (size_t)hd * es);
        CHECK(same, "%s S=%lld d=%lld: strided fused-QKV input, wide output and a 5-way split give the same bits",
              dl_dtype_name(dt), (long long)S, (long long)D);
        dl_aligned_free(scratch);
        free(qkv), free(o_plain), free(o_wide);
        drop(&p);
    }
}

static void test_fast_vs_ref(void) {
    static const int64_t cfg[][5] = { /* sq, sk, d, kv_begin, kv_end */
        {97, 211, 128, 11, 200}, {97, 211, 72, 11, 200}, {15, 15, 72, 0, 15}, {17, 3, 24, 1, 3}};
    for (int ci = 0; ci < 2 * 4; ci++) { /* (shape, dtype) pairs */
        dl_dtype dt = ci % 2 ? DL_BF16 : DL_F32;
        const int64_t *c = cfg[ci / 2];
        problem p = make(dt, c[0], c[1], 3, c[2], 3);
        int64_t n = p.sq * p.h * p.d, ns = p.sq * p.h;
        float *o1 = malloc((size_t)n * 4), *o2 = malloc((size_t)n * 4);
        float *m1 = malloc((size_t)ns * 4), *m2 = malloc((size_t)ns * 4), *l1 = malloc((size_t)ns * 4), *l2 = malloc((size_t)ns * 4);
        dl_attn_args a = args_for(&p, NULL, c[3], c[4]);
        a.o_part = o1, a.m = m1, a.l = l1;
        dl_attn(&a, NULL);
        dl_isa isa = dl_kernel_isa();
        dl_set_kernel_isa(DL_ISA_REF);
        a.o_part = o2, a.m = m2, a.l = l2;
        dl_attn(&a, NULL);
        dl_set_kernel_isa(isa);
        double rt = dt == DL_F32 ? 1e-5 : 1.0 / 64; /* bf16: score products differ by accumulation order only; P rounding moves l */
        CHECK(dl_compare(DL_F32, m1, m2, ns, 1e-5, 1e-5, NULL) <= 1.0, "%s d=%lld row max matches the reference",
              dl_dtype_name(dt), (long long)p.d);
        CHECK(dl_compare(DL_F32, l1, l2, ns, 1e-4, rt, NULL) <= 1.0, "%s d=%lld row sum matches the reference",
              dl_dtype_name(dt), (long long)p.d);
        CHECK(dl_compare(DL_F32, o1, o2, n, dt == DL_F32 ? 1e-4 : 0.5, rt, NULL) <= 1.0,
              "%s d=%lld unnormalised output matches the reference", dl_dtype_name(dt), (long long)p.d);
        free(o1), free(o2), free(m1), free(m2), free(l1), free(l2);
        drop(&p);
    }
}

/* Causal masking (CLIP) and a relative-position bias (T5), alone and together,
 * with an interval that leaves some causal rows without any key. */
static void test_causal_and_bias(void) {
    static const int64_t cfg[][2] = {{150, 64}, {17, 40}, {15, 72}}; /* S, head_dim */
    for (int ci = 0; ci < 2 * 3; ci++) { /* (shape, dtype) pairs */
        dl_dtype dt = ci % 2 ? DL_BF16 : DL_F32;
        problem p = make(dt, cfg[ci / 2][0], cfg[ci / 2][0], 2, cfg[ci / 2][1], 31);
        int64_t n = p.sq * p.h * p.d;
        float *bias = malloc((size_t)(p.h * (p.sq + p.sk - 1)) * sizeof(float));
        dl_fill_uniform(DL_F32, bias, p.h * (p.sq + p.sk - 1), -3.f, 3.f, 77);
        double *ref = malloc((size_t)n * sizeof(double));
        void *out = malloc((size_t)n * 4);
        for (int mode = 1; mode < 4; mode++) {
            int causal = mode & 1;
            const float *b = mode & 2 ? bias : NULL;
            int64_t kb = mode == 3 ? 5 : 0;
            for (int force_ref = 0; force_ref < 2; force_ref++) {
                dl_isa isa = dl_kernel_isa();
                if (force_ref) dl_set_kernel_isa(DL_ISA_REF);
                naive_ext(&p, kb, p.sk, 0.125f, causal, b, ref);
                dl_attn_args a = args_for(&p, out, kb, p.sk);
                a.scale = 0.125f;
                a.causal = causal;
                a.bias_rel = b;
                CHECK(dl_attn(&a, NULL) == DL_OK, "%s", dl_last_error());
                double w = against_naive(&p, out, ref);
                CHECK(w <= 1.0, "%s %s S=%lld d=%lld causal=%d bias=%d from key %lld: %.3fx bound", dl_dtype_name(dt),
                      force_ref ? "ref" : "fast", (long long)p.sq, (long long)p.d, causal, b != NULL, (long long)kb, w);
                dl_set_kernel_isa(isa);
            }
        }
        free(bias), free(ref), free(out);
        drop(&p);
    }
}

static void test_bad_args(void) {
    problem p = make(DL_F32, 4, 4, 1, 32, 1);
    float out[4 * 32];
    dl_attn_args a = args_for(&p, out, 2, 9);
    CHECK(dl_attn(&a, NULL) == DL_ERR_INVALID && strstr(dl_last_error(), "[2, 9)"), "interval past the end: %s", dl_last_error());
    a = args_for(&p, out, 3, 2);
    CHECK(dl_attn(&a, NULL) == DL_ERR_INVALID, "reversed interval");
    a = args_for(&p, NULL, 0, 4);
    CHECK(dl_attn(&a, NULL) == DL_ERR_INVALID, "no output");
    a = args_for(&p, out, 0, 4);
    a.q_stride = 16;
    CHECK(dl_attn(&a, NULL) == DL_ERR_INVALID, "stride too small");
    drop(&p);
}

int main(void) {
    /* every path this CPU has, best first (the fast-vs-reference checks compare each
       against the reference) */
    dl_isa best = dl_kernel_isa();
    for (int isa = (int)best; isa >= (int)DL_ISA_REF; isa--) {
        if (isa == DL_ISA_AVX512) continue; /* attention-wise the same as AVX2 */
        dl_set_kernel_isa((dl_isa)isa);
        dl_attn_args probe = {.dt = DL_BF16, .sq = 1, .sk = 1, .heads = 1, .head_dim = 64};
        printf("attention path: %s\n", dl_attn_path_name(&probe));
        /* every multiple of 8 up to 512 takes the fast path (OpenSora's 72 among them) */
        for (int64_t d = 8; d <= 520; d += 4) {
            probe.head_dim = d;
            int fast = strcmp(dl_attn_path_name(&probe), "reference") != 0;
            CHECK(fast == (isa >= (int)DL_ISA_AVX2 && d % 8 == 0 && d <= 512), "isa %s head_dim %lld: path %s",
                  dl_isa_name((dl_isa)isa), (long long)d, dl_attn_path_name(&probe));
        }
        test_vs_naive();
        test_nan_outside();
        test_merge();
        test_strides_and_splits();
        test_fast_vs_ref();
        test_causal_and_bias();
        test_bad_args();
    }
    dl_set_kernel_isa(best);
    return test_done("test_attention");
}
