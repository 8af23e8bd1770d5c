/* Kernel self-check: every element-wise/row op of the active path against its
 * reference on seeded random data, through the (ith, nth) split, with a tolerance
 * per dtype. Used by the test suite (many shapes) and by `difflet selfcheck`
 * (a user's quick proof that this CPU computes what the references compute). */
#include "difflet/check.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels_impl.h"

void dl_check_tolerance(dl_dtype dt, double *atol, double *rtol) {
    *atol = 1e-5; /* f32 */
    *rtol = 1e-5;
    if (dt == DL_BF16) { /* one bf16 ulp: each side rounds once */
        *atol = 1e-2;
        *rtol = 1.0 / 128;
    } else if (dt == DL_F16) {
        *atol = 1e-3;
        *rtol = 1.0 / 1024;
    }
}

uint64_t dl_rng_next(uint64_t *s) { /* splitmix64 */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

float dl_rng_uniform(uint64_t *s, float lo, float hi) {
    return lo + (hi - lo) * (float)((dl_rng_next(s) >> 40) * 0x1p-24);
}

void dl_fill_uniform(dl_dtype dt, void *p, int64_t n, float lo, float hi, uint64_t seed) {
    uint64_t s = seed;
    for (int64_t i = 0; i < n; i++) dl_store1(dt, p, i, dl_rng_uniform(&s, lo, hi));
}

double dl_compare(dl_dtype dt, const void *got, const void *ref, int64_t n, double atol,
                  double rtol, int64_t *bad_index) {
    double worst = 0.0; /* largest err / allowed */
    if (bad_index) *bad_index = -1;
    for (int64_t i = 0; i < n; i++) {
        double g = dl_load1(dt, got, i), r = dl_load1(dt, ref, i);
        double err = fabs(g - r), allow = atol + rtol * fabs(r);
        double q = (isnan(g) != isnan(r)) ? INFINITY : isnan(g) ? 0.0 : err / allow;
        if (q > worst) {
            worst = q;
            if (bad_index && q > 1.0) *bad_index = i;
        }
    }
    return worst;
}

/* ---- one op at a time ---------------------------------------------------------- */

typedef struct {
    dl_check_cb cb;
    void *ctx;
    int failures, nth;
} checker;

static void report(checker *c, const char *op, dl_dtype dt, int64_t rows, int64_t cols,
                   const void *got, const void *ref, int64_t n) {
    double atol, rtol;
    dl_check_tolerance(dt, &atol, &rtol);
    int64_t bad;
    dl_check_result r = {op, dt, rows, cols, 0, 0, 0, 0};
    r.worst = dl_compare(dt, got, ref, n, atol, rtol, &bad);
    r.ok = r.worst <= 1.0;
    if (!r.ok && bad >= 0) {
        r.got = dl_load1(dt, got, bad);
        r.want = dl_load1(dt, ref, bad);
    }
    if (!r.ok) c->failures++;
    if (c->cb) c->cb(&r, c->ctx);
}

int dl_kernels_check(const int64_t *shapes, int nshapes, int nth, dl_check_cb cb, void *ctx) {
    checker c = {cb, ctx, 0, nth};
    const dl_kernel_table *ref = &dl_kernels_ref;
    const dl_dtype dts[3] = {DL_F32, DL_BF16, DL_F16};
    for (int si = 0; si < nshapes; si++) {
        int64_t rows = shapes[2 * si], cols = shapes[2 * si + 1], n = rows * cols;
        int64_t wn = rows > cols ? rows : cols; /* w, b also serve as per-channel vectors */
        float *w = malloc((size_t)wn * 4), *b = malloc((size_t)wn * 4);
        float *sc = malloc((size_t)cols * 4), *sh = malloc((size_t)cols * 4);
        float *cs = malloc((size_t)n * 4), *sn = malloc((size_t)n * 4);
        void *x = malloc((size_t)n * 4), *y = malloc((size_t)n * 4), *want = malloc((size_t)n * 4);
        void *x2 = malloc((size_t)n * 4);
        DL_ASSERT(w && b && sc && sh && cs && sn && x && y && want && x2);
        dl_fill_uniform(DL_F32, w, wn, 0.5f, 1.5f, 1);
        dl_fill_uniform(DL_F32, b, wn, -0.5f, 0.5f, 2);
        dl_fill_uniform(DL_F32, sc, cols, -0.5f, 0.5f, 3);
        dl_fill_uniform(DL_F32, sh, cols, -0.5f, 0.5f, 4);
        dl_fill_uniform(DL_F32, cs, n, -1.f, 1.f, 5);
        for (int64_t i = 0; i < n; i++) sn[i] = sqrtf(1.f - cs[i] * cs[i]);
        for (int di = 0; di < 3; di++) {
            dl_dtype dt = dts[di];
            size_t bytes = (size_t)n * dl_dtype_size(dt);
            dl_fill_uniform(dt, x, n, -3.f, 3.f, 100 + (uint64_t)si);
            dl_fill_uniform(dt, x2, n, -3.f, 3.f, 200 + (uint64_t)si);
#define RUN_SPLIT(call) for (int ith = 0; ith < nth; ith++) call
            /* conversions: f32 source into dt */
            {
                float *src = malloc((size_t)n * 4);
                DL_ASSERT(src);
                dl_fill_uniform(DL_F32, src, n, -100.f, 100.f, 7);
                ref->convert(dt, want, DL_F32, src, n);
                RUN_SPLIT(dl_convert_t(dt, y, DL_F32, src, n, ith, nth));
                report(&c, "convert_from_f32", dt, rows, cols, y, want, n);
                ref->convert(DL_F32, want, dt, x, n);
                RUN_SPLIT(dl_convert_t(DL_F32, y, dt, x, n, ith, nth));
                report(&c, "convert_to_f32", DL_F32, rows, cols, y, want, n);
                free(src);
            }
            ref->layernorm(dt, dt, want, x, rows, cols, w, b, NULL, NULL, 1e-6f);
            RUN_SPLIT(dl_layernorm_t(dt, y, x, rows, cols, w, b, 1e-6f, ith, nth));
            report(&c, "layernorm_affine", dt, rows, cols, y, want, n);
            ref->layernorm(dt, dt, want, x, rows, cols, NULL, NULL, NULL, NULL, 1e-6f);
            RUN_SPLIT(dl_layernorm_t(dt, y, x, rows, cols, NULL, NULL, 1e-6f, ith, nth));
            report(&c, "layernorm", dt, rows, cols, y, want, n);
            ref->layernorm(dt, dt, want, x, rows, cols, NULL, NULL, sc, sh, 1e-6f);
            RUN_SPLIT(dl_layernorm_modulate_t(dt, y, x, rows, cols, sc, sh, 1e-6f, ith, nth));
            report(&c, "layernorm_modulate", dt, rows, cols, y, want, n);
            ref->rmsnorm(dt, dt, want, x, rows, cols, w, 1e-6f);
            RUN_SPLIT(dl_rmsnorm_t(dt, y, x, rows, cols, w, 1e-6f, ith, nth));
            report(&c, "rmsnorm", dt, rows, cols, y, want, n);
            /* mixed dtypes: x in dt, y in f32 and the reverse (f32 residual -> dt) */
            ref->layernorm(dt, DL_F32, want, x, rows, cols, w, b, sc, sh, 1e-6f);
            RUN_SPLIT(dl_layernorm_x_t(DL_F32, y, dt, x, rows, cols, w, b, sc, sh, 1e-6f, ith, nth));
            report(&c, "layernorm_x_to_f32", DL_F32, rows, cols, y, want, n);
            {
                float *xf = malloc((size_t)n * 4);
                DL_ASSERT(xf);
                dl_fill_uniform(DL_F32, xf, n, -3.f, 3.f, 300 + (uint64_t)si);
                ref->layernorm(DL_F32, dt, want, xf, rows, cols, w, b, NULL, NULL, 1e-6f);
                RUN_SPLIT(dl_layernorm_x_t(dt, y, DL_F32, xf, rows, cols, w, b, NULL, NULL, 1e-6f, ith, nth));
                report(&c, "layernorm_f32_to_x", dt, rows, cols, y, want, n);
                ref->rmsnorm(DL_F32, dt, want, xf, rows, cols, w, 1e-6f);
                RUN_SPLIT(dl_rmsnorm_x_t(dt, y, DL_F32, xf, rows, cols, w, 1e-6f, ith, nth));
                report(&c, "rmsnorm_f32_to_x", dt, rows, cols, y, want, n);
                free(xf);
            }
            ref->modulate(dt, want, x, rows, cols, sc, sh);
            RUN_SPLIT(dl_modulate_t(dt, y, x, rows, cols, sc, sh, ith, nth));
            report(&c, "modulate", dt, rows, cols, y, want, n);
            memcpy(want, x, bytes);
            ref->gated_residual(dt, want, x2, rows, cols, sc);
            memcpy(y, x, bytes);
            RUN_SPLIT(dl_gated_residual_t(dt, y, x2, rows, cols, sc, ith, nth));
            report(&c, "gated_residual", dt, rows, cols, y, want, n);
            static const dl_act acts[] = {DL_ACT_GELU_TANH, DL_ACT_GELU_ERF, DL_ACT_SILU, DL_ACT_QUICK_GELU, DL_ACT_RELU};
            for (int ai = 0; ai < 5; ai++) {
                ref->activation(acts[ai], dt, want, x, n);
                RUN_SPLIT(dl_activation_t(acts[ai], dt, y, x, n, ith, nth));
                report(&c, dl_act_name(acts[ai]), dt, rows, cols, y, want, n);
            }
            ref->mul(dt, want, x, x2, n);
            RUN_SPLIT(dl_mul_t(dt, y, x, x2, n, ith, nth));
            report(&c, "mul", dt, rows, cols, y, want, n);
            ref->softmax(dt, want, x, rows, cols);
            RUN_SPLIT(dl_softmax_t(dt, y, x, rows, cols, ith, nth));
            report(&c, "softmax", dt, rows, cols, y, want, n);
            /* group norm: rows = channels, cols = spatial; groups divide rows */
            int64_t groups = rows % 4 == 0 ? 4 : rows % 2 == 0 ? 2 : 1;
            for (int silu = 0; silu < 2; silu++) {
                int64_t cpg = rows / groups;
                for (int64_t g = 0; g < groups; g++)
                    ref->groupnorm(dt, (char *)want + (size_t)(g * cpg * cols) * dl_dtype_size(dt),
                                   (const char *)x + (size_t)(g * cpg * cols) * dl_dtype_size(dt), cpg,
                                   cols, w + g * cpg, b + g * cpg, 1e-6f, silu);
                RUN_SPLIT(dl_groupnorm_t(dt, y, x, rows, cols, groups, w, b, 1e-6f, silu, ith, nth));
                report(&c, silu ? "groupnorm_silu" : "groupnorm", dt, rows, cols, y, want, n);
            }
            /* RoPE: rows = tokens, cols = heads * head_dim with head_dim 32 or cols */
            if (cols % 2 == 0) {
                int64_t hd = cols % 32 == 0 ? 32 : cols, heads = cols / hd;
                for (int form = 0; form < 2; form++) {
                    if (form == DL_ROPE_HALVES && hd % 2) continue;
                    memcpy(want, x, bytes);
                    memcpy(y, x, bytes);
                    ref->rope((dl_rope_form)form, dt, want, rows, heads, hd, cols, cs, sn);
                    RUN_SPLIT(dl_rope_t((dl_rope_form)form, dt, y, rows, heads, hd, cols, cs, sn, ith, nth));
                    report(&c, form ? "rope_halves" : "rope_pairs", dt, rows, cols, y, want, n);
                }
            }
#undef RUN_SPLIT
        }
        free(w), free(b), free(sc), free(sh), free(cs), free(sn);
        free(x), free(y), free(want), free(x2);
    }
    return c.failures;
}
