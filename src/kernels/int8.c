/* int8 linears: y[M, N] = act(x[M, K] W^T + b) with W stored as int8.
 *
 * Weights: one symmetric scale per output channel, s[n] = max_k |W[n, k]| / 127 and
 * q[n, k] = round(W[n, k] / s[n]) in [-127, 127]; the column sums c[n] = sum_k q[n, k]
 * are kept beside the scales (the zero-point correction below).
 *
 * W8A8 (DL_QUANT_W8A8): each run quantizes every row of x (a token) on its own,
 * asymmetric: lo = min(0, min x), hi = max(0, max x), a = (hi - lo) / L, z = round(-lo / a),
 * xq = clamp(round(x / a) + z, 0, L). oneDNN multiplies u8 xq by s8 q into exact s32
 * sums, and y = a s[n] (acc - z c[n]) + b[n]. L is 255 where the CPU's int8 dot
 * product is exact over the whole u8 x s8 range (VNNI, AMX) and 127 elsewhere: AVX2
 * and AVX-512 without VNNI add pairs of u8 x s8 products in saturating 16-bit lanes,
 * and 2 x 255 x 127 overflows them while 2 x 127 x 127 does not. Which one holds is
 * measured once per process (a product whose exact sum is known), not assumed.
 *
 * Weight-only (DL_QUANT_W8): x stays in its dtype; each run dequantizes W a panel of
 * output channels at a time into f32 and multiplies through OpenBLAS's sgemm (oneDNN's
 * with DIFFLET_GEMM=onednn), so the weights are read as int8 (a quarter of f32's
 * bytes) and the arithmetic is f32. Where x is bf16 and oneDNN multiplies bf16
 * natively (AVX-512 BF16, AMX), the panel is dequantized to bf16 instead (q s[n]
 * rounded once) and multiplied by oneDNN's bf16 brgemm (make_bf16_panels): twice the
 * f32 rate.
 * A run of a few rows (modulation vectors) takes dot products straight from q.
 *
 * Nothing is allocated per run: the staging (quantized x, s32 sums, a dequantized
 * panel) is one buffer shared by every int8 linear of the process, sized at creation
 * and taken under a lock, as the bf16-emulation staging is. */
#include <cblas.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels_impl.h"
#include "kernels/onednn_impl.h"

/* Q8_MAX_K: acc and z c[n] both lie within 255 x 127 x K, so their difference fits
 * an int32 (and c[n] a float exactly) while 2 x 255 x 127 x K < 2^31 */
enum { Q8_PANEL = 2048, Q8_FEW_ROWS = 8, Q8_MAX_K = DL_Q8_MAX_K };

struct dl_q8 {
    dl_matmul_desc d;
    dnnl_primitive_t prim; /* W8A8: u8 [M, K] x s8 [K, N] -> s32 [M, N] */
    dnnl_memory_t src, wei, dst, scratch;
    void *wbuf, *sbuf;  /* packed weights when owned (else in place in the caller's mapping), scratchpad */
    const int8_t *w;    /* W8A8: in `wei`'s layout; W8: plain [N, K] */
    size_t wbytes;
    int64_t layout[MD_MAX_FIELDS];
    size_t layout_bytes;
    float *aux;     /* scales [N] then column sums [N] (as recorded) */
    int32_t *csum;  /* column sums [N] */
    float *bias;    /* [N] or NULL */
    /* weight-only with bf16 x on a CPU with native bf16 products: each panel
     * dequantized to bf16 and multiplied by oneDNN's bf16 matmul, one primitive per
     * panel width (full panels, the last) */
    dnnl_primitive_t bp[2], br[2];                        /* the matmul; the panel's reorder into its blocking */
    dnnl_memory_t bsrc[2], bwei[2], bdst[2], bscr[2], bplain[2];
    void *bsbuf[2];
    int64_t bnb[2];
    size_t bblk; /* the blocked panel's bytes (the widest) */
};

const char *dl_quant_name(dl_quant q) {
    return q == DL_QUANT_W8A8 ? "w8a8" : q == DL_QUANT_W8 ? "w8" : "none";
}

const char *dl_quant_scheme_name(dl_quant q) {
    return q == DL_QUANT_W8A8 ? "int8" : q == DL_QUANT_W8 ? "int8-wo" : "none";
}

static size_t al64(size_t b) { return (b + 63) / 64 * 64; }

/* ---- the shared staging buffer -------------------------------------------------------- */
static dl_staging g_q = {.lock = PTHREAD_MUTEX_INITIALIZER};

static size_t stage_bytes(const dl_matmul_desc *d) {
    size_t M = (size_t)d->m, K = (size_t)d->k, N = (size_t)d->n;
    if (d->quant == DL_QUANT_W8A8) return al64(M * K) + al64(M * N * 4) + al64(M * 8);
    return (d->dt != DL_F32 ? al64(M * K * 4) : 0) + al64((size_t)Q8_PANEL * K * 4) + al64(M * N * 4);
}

/* ---- the u8 x s8 primitive -------------------------------------------------------------- */

/* src u8 [M, K] and dst s32 [M, N] contiguous (the staging); weights `wei` or any */
static dnnl_status_t u8_pd(int64_t m, int64_t k, int64_t n, const dnnl_memory_desc_t *wei, dnnl_primitive_attr_t attr,
                           dnnl_primitive_desc_t *pd) {
    dnnl_memory_desc_t src_md, wei_md, dst_md;
    dnnl_dims_t sdims = {m, k}, wdims = {k, n}, ddims = {m, n};
    dnnl_status_t st;
    if ((st = dnnl_memory_desc_init_by_tag(&src_md, 2, sdims, dnnl_u8, dnnl_ab)) != dnnl_success) return st;
    if (wei)
        wei_md = *wei;
    else if ((st = dnnl_memory_desc_init_by_tag(&wei_md, 2, wdims, dnnl_s8, dnnl_format_tag_any)) != dnnl_success)
        return st;
    if ((st = dnnl_memory_desc_init_by_tag(&dst_md, 2, ddims, dnnl_s32, dnnl_ab)) != dnnl_success) return st;
    dnnl_matmul_desc_t md;
    if ((st = dnnl_matmul_desc_init(&md, &src_md, &wei_md, NULL, &dst_md)) != dnnl_success) return st;
    return dnnl_primitive_desc_create(pd, &md, attr, dl_dnnl_eng, NULL);
}

/* the plain weights: q [N, K] row-major seen as [K, N] */
static void plain_s8(int64_t k, int64_t n, dnnl_memory_desc_t *md) {
    dnnl_dims_t wdims = {k, n}, wstr = {1, k};
    dnnl_memory_desc_init_by_strides(md, 2, wdims, dnnl_s8, wstr);
}

/* Is oneDNN's u8 x s8 product exact over the whole u8 range on this CPU? One product
 * whose exact sums are known: x = 255 everywhere, q = +-127 in a fixed pattern. */
static int g_levels;
static pthread_once_t g_levels_once = PTHREAD_ONCE_INIT;

static void levels_probe(void) {
    enum { M = 4, K = 256, N = 32 };
    g_levels = 127;
    if (dl_dnnl_engine() != DL_OK) {
        DL_WARN("int8: no oneDNN engine for the levels probe (%s); 7-bit activations", dl_last_error());
        return;
    }
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_t p = NULL;
    dnnl_memory_t ms = NULL, mw = NULL, md = NULL;
    uint8_t *x = malloc(M * K);
    int8_t *q = malloc(N * K), *qp = NULL;
    int32_t *y = malloc(M * N * 4);
    if (!x || !q || !y || u8_pd(M, K, N, NULL, NULL, &pd) != dnnl_success) goto out;
    const dnnl_memory_desc_t *wmd = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    if (!(qp = dl_aligned_alloc(dnnl_memory_desc_get_size(wmd)))) goto out;
    memset(x, 255, M * K);
    for (int i = 0; i < N * K; i++) q[i] = (int8_t)((i / K) % 3 == 0 ? -127 : 127);
    dnnl_memory_desc_t plain, smd, dmd;
    plain_s8(K, N, &plain);
    if (dl_dnnl_reorder(&plain, q, wmd, qp) != DL_OK) goto out;
    dnnl_dims_t sdims = {M, K}, ddims = {M, N};
    dnnl_memory_desc_init_by_tag(&smd, 2, sdims, dnnl_u8, dnnl_ab);
    dnnl_memory_desc_init_by_tag(&dmd, 2, ddims, dnnl_s32, dnnl_ab);
    if (dnnl_primitive_create(&p, pd) != dnnl_success || dnnl_memory_create(&ms, &smd, dl_dnnl_eng, x) != dnnl_success ||
        dnnl_memory_create(&mw, wmd, dl_dnnl_eng, qp) != dnnl_success || dnnl_memory_create(&md, &dmd, dl_dnnl_eng, y) != dnnl_success)
        goto out;
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, ms}, {DNNL_ARG_WEIGHTS, mw}, {DNNL_ARG_DST, md}};
    if (dnnl_primitive_execute(p, dl_dnnl_stream, 3, args) != dnnl_success || dnnl_stream_wait(dl_dnnl_stream) != dnnl_success) goto out;
    int exact = 1;
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) exact &= y[m * N + n] == 255 * K * (n % 3 == 0 ? -127 : 127);
    g_levels = exact ? 255 : 127;
out:
    if (p) dnnl_primitive_destroy(p);
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (ms) dnnl_memory_destroy(ms);
    if (mw) dnnl_memory_destroy(mw);
    if (md) dnnl_memory_destroy(md);
    dl_aligned_free(qp);
    free(x), free(q), free(y);
    DL_DEBUG("int8 activations: %d levels (u8 x s8 %s over the whole range)", g_levels,
             g_levels == 255 ? "exact" : "saturates or could not be measured");
}

static atomic_int g_created;
int dl_q8_count(void) { return atomic_load(&g_created); }

int dl_q8_levels(void) {
    pthread_once(&g_levels_once, levels_probe);
    return g_levels;
}

/* ---- weight quantization ------------------------------------------------------------------ */
typedef struct {
    const float *w;
    int64_t k, n;
    int8_t *q;
    float *aux;
} quant_w_ctx;

static void quant_w_fn(void *ctx, int ith, int nth) {
    const quant_w_ctx *c = ctx;
    int64_t b, e;
    dl_split(c->n, ith, nth, &b, &e);
    for (int64_t r = b; r < e; r++) {
        const float *w = c->w + r * c->k;
        int8_t *q = c->q + r * c->k;
        float mx = 0.f;
        int bad = 0;
        for (int64_t i = 0; i < c->k; i++) {
            mx = fabsf(w[i]) > mx ? fabsf(w[i]) : mx;
            bad |= !isfinite(w[i]);
        }
        float s = mx / 127.f;
        if (!(s >= FLT_MIN)) s = 1.f; /* an all-zero (or all-subnormal) channel: q = 0 */
        int64_t sum = 0;
        for (int64_t i = 0; i < c->k && !bad; i++) {
            float v = nearbyintf(w[i] / s);
            v = v > 127.f ? 127.f : v < -127.f ? -127.f : v;
            q[i] = (int8_t)v;
            sum += q[i];
        }
        if (bad) memset(q, 0, (size_t)c->k); /* a non-finite weight poisons its channel, as it would in f32 */
        c->aux[r] = bad ? NAN : s;
        c->aux[c->n + r] = (float)sum;
    }
}

dl_status dl_q8_quantize(const float *w, int64_t n, int64_t k, int8_t *q, float *aux) {
    if (k > Q8_MAX_K) return dl_fail(DL_ERR_UNSUPPORTED, "int8 matmul: K=%lld is over %d", (long long)k, Q8_MAX_K);
    quant_w_ctx c = {w, k, n, q, aux};
    dl_parallel(quant_w_fn, &c);
    return DL_OK;
}

typedef struct {
    const float *w;
    int64_t k, n;
    double *err, *ref; /* per thread */
} werr_ctx;

static void werr_fn(void *ctx, int ith, int nth) {
    werr_ctx *c = ctx;
    int64_t b, e;
    dl_split(c->n, ith, nth, &b, &e);
    double err = 0, ref = 0;
    for (int64_t r = b; r < e; r++) {
        const float *w = c->w + r * c->k;
        float mx = 0.f;
        for (int64_t i = 0; i < c->k; i++) mx = fabsf(w[i]) > mx ? fabsf(w[i]) : mx;
        float s = mx / 127.f;
        if (!(s >= FLT_MIN)) s = 1.f;
        for (int64_t i = 0; i < c->k; i++) {
            double d = (double)nearbyintf(w[i] / s) * s - w[i];
            err += d * d;
            ref += (double)w[i] * w[i];
        }
    }
    c->err[ith] = err, c->ref[ith] = ref;
}

double dl_q8_weight_error(const float *w, int64_t n, int64_t k) {
    const int nt = dl_threads() > 0 ? dl_threads() : 1;
    werr_ctx c = {w, k, n, calloc((size_t)nt, sizeof(double)), calloc((size_t)nt, sizeof(double))};
    double err = 0, ref = 0;
    if (c.err && c.ref) {
        dl_parallel(werr_fn, &c);
        for (int i = 0; i < nt; i++) err += c.err[i], ref += c.ref[i];
    } else {
        err = INFINITY;
    }
    free(c.err), free(c.ref);
    if (!isfinite(err) || !isfinite(ref)) return INFINITY; /* non-finite weights: never "fits int8" */
    return ref > 0 ? sqrt(err / ref) : 0;
}

/* ---- creation ------------------------------------------------------------------------------ */

void dl_q8_free(dl_q8 *q) {
    if (!q) return;
    if (q->prim) dnnl_primitive_destroy(q->prim);
    for (int i = 0; i < 2; i++) {
        if (q->bp[i]) dnnl_primitive_destroy(q->bp[i]);
        if (q->br[i]) dnnl_primitive_destroy(q->br[i]);
        dnnl_memory_t bm[] = {q->bsrc[i], q->bwei[i], q->bdst[i], q->bscr[i], q->bplain[i]};
        for (size_t j = 0; j < 5; j++)
            if (bm[j]) dnnl_memory_destroy(bm[j]);
        dl_aligned_free(q->bsbuf[i]);
    }
    dnnl_memory_t mems[] = {q->src, q->wei, q->dst, q->scratch};
    for (size_t i = 0; i < sizeof mems / sizeof mems[0]; i++)
        if (mems[i]) dnnl_memory_destroy(mems[i]);
    dl_aligned_free(q->wbuf);
    dl_aligned_free(q->sbuf);
    free(q->aux), free(q->csum), free(q->bias);
    free(q);
}

int dl_q8_bf16_panels(const dl_q8 *q) { return q->bp[0] != NULL; }

/* Weight-only over bf16 x where oneDNN multiplies bf16 natively: x [M, K] (the
 * caller's rows) by a panel of nb dequantized output channels, f32 sums [M, nb]
 * (brgemm takes no wider row stride), copied into acc [M, N] at the panel's columns.
 * The panel is written plain ([nb, K] bf16) and
 * reordered into the blocking oneDNN's brgemm takes (it takes no plain bf16 weights);
 * only brgemm kernels, whose sums do not depend on the thread count: else (0
 * returned) the f32 panels stay. Staging: the plain panel, then the blocked one. */
static int make_bf16_panels(dl_q8 *q) {
    const dl_matmul_desc *d = &q->d;
    const char *isa = dl_onednn_isa();
    if (d->dt != DL_BF16 || d->m <= Q8_FEW_ROWS || (strcmp(isa, "avx512-bf16") && strcmp(isa, "avx512-amx"))) return 0;
    const int64_t widths[2] = {d->n < Q8_PANEL ? d->n : Q8_PANEL, d->n > Q8_PANEL ? d->n % Q8_PANEL : 0};
    int ok = 1;
    size_t blk = 0;
    for (int i = 0; i < 2 && ok; i++) {
        const int64_t nb = widths[i];
        if (!nb) continue;
        dnnl_memory_desc_t xs, ws, wp, ys;
        dnnl_dims_t xd = {d->m, d->k}, xst = {d->ldx, 1}, wd = {d->k, nb}, wst = {1, d->k}, yd = {d->m, nb}, yst = {nb, 1};
        dnnl_primitive_attr_t attr = NULL;
        dnnl_primitive_desc_t pd = NULL, rpd = NULL;
        dnnl_matmul_desc_t md;
        ok = dnnl_memory_desc_init_by_strides(&xs, 2, xd, dnnl_bf16, xst) == dnnl_success &&
             dnnl_memory_desc_init_by_tag(&ws, 2, wd, dnnl_bf16, dnnl_format_tag_any) == dnnl_success &&
             dnnl_memory_desc_init_by_strides(&wp, 2, wd, dnnl_bf16, wst) == dnnl_success &&
             dnnl_memory_desc_init_by_strides(&ys, 2, yd, dnnl_f32, yst) == dnnl_success &&
             dnnl_primitive_attr_create(&attr) == dnnl_success &&
             dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) == dnnl_success &&
             dnnl_matmul_desc_init(&md, &xs, &ws, NULL, &ys) == dnnl_success &&
             dnnl_primitive_desc_create(&pd, &md, attr, dl_dnnl_eng, NULL) == dnnl_success &&
             !strncmp(dl_dnnl_impl(pd), "brg", 3) &&
             dl_dnnl_bind(pd, NULL, &q->bp[i], &q->bsrc[i], &q->bwei[i], &q->bdst[i], &q->bscr[i], &q->bsbuf[i]) == DL_OK;
        if (ok) {
            const dnnl_memory_desc_t *wb = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
            size_t b = dnnl_memory_desc_get_size(wb);
            blk = b > blk ? b : blk;
            ok = dnnl_reorder_primitive_desc_create(&rpd, &wp, dl_dnnl_eng, wb, dl_dnnl_eng, NULL) == dnnl_success &&
                 dnnl_primitive_create(&q->br[i], rpd) == dnnl_success &&
                 dnnl_memory_create(&q->bplain[i], &wp, dl_dnnl_eng, DNNL_MEMORY_NONE) == dnnl_success;
        }
        q->bnb[i] = nb;
        if (rpd) dnnl_primitive_desc_destroy(rpd);
        if (pd) dnnl_primitive_desc_destroy(pd);
        if (attr) dnnl_primitive_attr_destroy(attr);
    }
    q->bblk = blk;
    ok = ok && dl_staging_reserve(&g_q, stage_bytes(d) + al64(blk) + al64((size_t)d->m * widths[0] * 4) + 64, "int8") ==
                   DL_OK;
    if (!ok)
        for (int i = 0; i < 2; i++) {
            if (q->bp[i]) dnnl_primitive_destroy(q->bp[i]);
            q->bp[i] = NULL;
        }
    return ok;
}

/* The W8A8 primitive over the plain quantized weights `plain_q` (fresh) or the
 * packed `pk` (used in place when its recorded layout is the one taken). */
static dl_status make_w8a8(dl_q8 *q, const int8_t *plain_q, const dl_packed *pk) {
    dl_status s = DL_OK;
    const dl_matmul_desc *d = &q->d;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_primitive_desc_t pd = NULL, pin = NULL;
    DNNL_TRY(dnnl_primitive_attr_create(&attr), "attr create");
    DNNL_TRY(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user), "scratchpad mode");
    dnnl_status_t st = u8_pd(d->m, d->k, d->n, NULL, attr, &pd);
    if (st != dnnl_success) {
        s = dl_fail(DL_ERR_BACKEND, "oneDNN: no u8 x s8 matmul for M=%lld K=%lld N=%lld on this CPU (status %d)",
                    (long long)d->m, (long long)d->k, (long long)d->n, (int)st);
        goto err;
    }
    const dnnl_memory_desc_t *wei_md = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    dnnl_memory_desc_t plain, from_md;
    plain_s8(d->k, d->n, &plain);
    const void *from = plain_q;
    from_md = plain;
    if (pk) {
        if ((s = dl_dnnl_md_parse(pk->layout, pk->layout_bytes, &plain, pk->bytes, &from_md)) != DL_OK) goto err;
        if (from_md.data_type != dnnl_s8) {
            s = dl_fail(DL_ERR_FORMAT, "packed int8 weights: the layout record is not int8");
            goto err;
        }
        from = pk->data;
        if (dnnl_memory_desc_equal(&from_md, wei_md)) {
            q->w = pk->data;
        } else if (u8_pd(d->m, d->k, d->n, &from_md, attr, &pin) == dnnl_success &&
                   !strcmp(dl_dnnl_impl(pin), dl_dnnl_impl(pd))) {
            dnnl_primitive_desc_destroy(pd);
            pd = pin;
            pin = NULL;
            wei_md = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
            q->w = pk->data;
        }
    }
    q->wbytes = dnnl_memory_desc_get_size(wei_md);
    if (!q->w) {
        if (!(q->wbuf = dl_aligned_alloc(q->wbytes))) goto nomem;
        if ((s = dl_dnnl_reorder(&from_md, from, wei_md, q->wbuf)) != DL_OK) goto err;
        q->w = q->wbuf;
    }
    q->layout_bytes = dl_dnnl_md_serialize(wei_md, q->layout) * 8;
    if ((s = dl_dnnl_bind(pd, q->w, &q->prim, &q->src, &q->wei, &q->dst, &q->scratch, &q->sbuf)) != DL_OK) goto err;
    DL_DEBUG("int8 w8a8 M=%lld K=%lld N=%lld: %s", (long long)d->m, (long long)d->k, (long long)d->n, dl_dnnl_impl(pd));
    goto err;
nomem:
    s = dl_fail(DL_ERR_NOMEM, "int8 matmul: out of memory");
err:
    if (pin) dnnl_primitive_desc_destroy(pin);
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (attr) dnnl_primitive_attr_destroy(attr);
    return s;
}

dl_status dl_q8_new(dl_q8 **out, const dl_matmul_desc *d, const void *w, dl_dtype w_dt, const dl_packed *pk,
                    const float *bias) {
    *out = NULL;
    dl_status s;
    if (d->quant != DL_QUANT_W8A8 && d->quant != DL_QUANT_W8)
        return dl_fail(DL_ERR_INVALID, "int8 matmul: unknown quantization %d", (int)d->quant);
    if (d->k > Q8_MAX_K)
        return dl_fail(DL_ERR_UNSUPPORTED, "int8 matmul: K=%lld is over %d (the exact int32 epilogue's limit)",
                       (long long)d->k, Q8_MAX_K);
    const int64_t N = d->n, K = d->k;
    dl_q8 *q = calloc(1, sizeof *q);
    if (!q) return dl_fail(DL_ERR_NOMEM, "int8 matmul: out of memory");
    q->d = *d;
    int8_t *plain = NULL;
    float *wf = NULL;
    q->aux = malloc((size_t)N * 8);
    q->csum = malloc((size_t)N * 4);
    if (!q->aux || !q->csum || (bias && !(q->bias = malloc((size_t)N * 4)))) goto nomem;
    if (bias) memcpy(q->bias, bias, (size_t)N * 4);
    if (pk) {
        if (!pk->aux || pk->aux_bytes != (size_t)N * 8) {
            s = dl_fail(DL_ERR_FORMAT, "packed int8 weights: the scales and column sums are missing or not %lld values",
                        (long long)(2 * N));
            goto err;
        }
        memcpy(q->aux, pk->aux, (size_t)N * 8);
    } else {
        if (!(plain = dl_aligned_alloc((size_t)(N * K)))) goto nomem;
        const float *wsrc = w;
        if (w_dt != DL_F32) {
            if (!(wf = malloc((size_t)(N * K) * 4))) goto nomem;
            dl_kernels()->convert(DL_F32, wf, w_dt, w, N * K);
            wsrc = wf;
        }
        if ((s = dl_q8_quantize(wsrc, N, K, plain, q->aux)) != DL_OK) goto err;
    }
    for (int64_t i = 0; i < N; i++) q->csum[i] = (int32_t)q->aux[N + i];
    if (d->quant == DL_QUANT_W8A8) {
        dl_q8_levels();
        if ((s = make_w8a8(q, plain, pk)) != DL_OK) goto err;
    } else { /* weight-only: the plain [N, K] bytes are the layout */
        dnnl_memory_desc_t pmd;
        plain_s8(K, N, &pmd);
        q->wbytes = (size_t)(N * K);
        if (pk) {
            dnnl_memory_desc_t got;
            if ((s = dl_dnnl_md_parse(pk->layout, pk->layout_bytes, &pmd, pk->bytes, &got)) != DL_OK) goto err;
            if (!dnnl_memory_desc_equal(&got, &pmd)) {
                s = dl_fail(DL_ERR_FORMAT, "packed weight-only int8 weights: the record is not the plain [N, K] layout");
                goto err;
            }
            q->w = pk->data;
        } else {
            q->w = q->wbuf = plain;
            plain = NULL;
        }
        q->layout_bytes = dl_dnnl_md_serialize(&pmd, q->layout) * 8;
        if (make_bf16_panels(q)) DL_DEBUG("int8-wo M=%lld K=%lld N=%lld: bf16 panels", (long long)d->m, (long long)K, (long long)N);
    }
    if ((s = dl_staging_reserve(&g_q, stage_bytes(d), "int8")) != DL_OK) goto err;
    dl_aligned_free(plain);
    free(wf);
    atomic_fetch_add(&g_created, 1);
    *out = q;
    return DL_OK;
nomem:
    s = dl_fail(DL_ERR_NOMEM, "int8 matmul: out of memory (N=%lld K=%lld)", (long long)N, (long long)K);
err:
    dl_aligned_free(plain);
    free(wf);
    dl_q8_free(q);
    return s;
}

void dl_q8_packed(const dl_q8 *q, dl_packed *out) {
    out->data = q->w;
    out->bytes = q->wbytes;
    out->layout = q->layout;
    out->layout_bytes = q->layout_bytes;
    out->aux = q->aux;
    out->aux_bytes = (size_t)q->d.n * 8;
}

size_t dl_q8_weight_bytes(const dl_q8 *q) { return q->wbytes + (size_t)q->d.n * 8; }

/* ---- runs ------------------------------------------------------------------------------------ */
typedef struct {
    const dl_q8 *q;
    const void *x;
    void *y;
    uint8_t *xq;
    float *rs; /* per row: scale, zero point */
    void *acc; /* s32 (W8A8) or f32 (W8) [M, N] */
    const float *xf;
    float *panel;
    int64_t n0, nb, ldxf;
    int levels;
} run_ctx;

/* The per-element loops, compiled twice (baseline x86-64 and AVX2) and picked at
 * load by the CPU (GCC's target_clones). They are plain IEEE operations in one
 * order per element (no reassociated sums), so both versions give the same bits. */
#define Q8_CLONES __attribute__((target_clones("avx2", "default")))

/* range of a block: min/max with 0 as the vector min/max instructions take them */
Q8_CLONES static void range_blk(const float *x, int64_t n, float *lo, float *hi, int *nan) {
    float l = *lo, h = *hi;
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        l = x[i] < l ? x[i] : l;
        h = x[i] > h ? x[i] : h;
        bad |= x[i] != x[i];
    }
    *lo = l, *hi = h, *nan |= bad;
}

Q8_CLONES static void quant_blk(const float *x, int64_t n, float inv, float z, float L, uint8_t *q) {
    for (int64_t i = 0; i < n; i++) {
        float v = x[i] * inv + z;
        v = v < 0.f ? 0.f : v > L ? L : v;
        q[i] = (uint8_t)(int32_t)(v + 0.5f);
    }
}

/* f[n] = (acc[n] - z c[n]) a s[n], a block at a time: acc and f are the same bytes */
Q8_CLONES static void rescale_row(void *row, const int32_t *cs, const float *s, float a, int32_t z, int64_t N) {
    for (int64_t n0 = 0; n0 < N; n0 += 256) {
        const int64_t nb = N - n0 < 256 ? N - n0 : 256;
        int32_t acc[256];
        float t[256];
        memcpy(acc, (const int32_t *)row + n0, (size_t)nb * 4);
        for (int64_t i = 0; i < nb; i++) t[i] = (float)(acc[i] - z * cs[n0 + i]) * (a * s[n0 + i]);
        memcpy((float *)row + n0, t, (size_t)nb * 4);
    }
}

/* every row of x to u8 with its own scale and zero point */
static void quant_x_fn(void *ctx, int ith, int nth) {
    const run_ctx *c = ctx;
    const dl_matmul_desc *d = &c->q->d;
    const int64_t K = d->k;
    const float L = (float)c->levels;
    int64_t b, e;
    dl_split(d->m, ith, nth, &b, &e);
    float row[512];
    for (int64_t m = b; m < e; m++) {
        const char *xr = (const char *)c->x + (size_t)(m * d->ldx) * dl_dtype_size(d->dt);
        uint8_t *q = c->xq + m * K;
        float lo = 0.f, hi = 0.f;
        int nan = 0;
        for (int64_t k0 = 0; k0 < K; k0 += 512) { /* the range, a block of the row at a time */
            int64_t nk = K - k0 < 512 ? K - k0 : 512;
            dl_kernels()->convert(DL_F32, row, d->dt, xr + (size_t)k0 * dl_dtype_size(d->dt), nk);
            range_blk(row, nk, &lo, &hi, &nan);
        }
        if (nan || !isfinite(hi - lo)) { /* a non-finite input poisons its row, as it would in f32 */
            memset(q, 0, (size_t)K);
            c->rs[2 * m] = NAN;
            c->rs[2 * m + 1] = 0.f;
            continue;
        }
        float a = (hi - lo) / L;
        if (!(a >= FLT_MIN)) a = 1.f; /* an all-zero (or all-subnormal) row: xq = z = 0 */
        float z = nearbyintf(-lo / a), inv = 1.f / a;
        for (int64_t k0 = 0; k0 < K; k0 += 512) {
            int64_t nk = K - k0 < 512 ? K - k0 : 512;
            dl_kernels()->convert(DL_F32, row, d->dt, xr + (size_t)k0 * dl_dtype_size(d->dt), nk);
            quant_blk(row, nk, inv, z, L, q + k0);
        }
        c->rs[2 * m] = a;
        c->rs[2 * m + 1] = z;
    }
}

/* y row = act(rescaled acc row + b) in dst_dt, computed in f32 over the acc row itself */
static void epilogue_fn(void *ctx, int ith, int nth) {
    const run_ctx *c = ctx;
    const dl_q8 *q = c->q;
    const dl_matmul_desc *d = &q->d;
    const int64_t N = d->n;
    const float *s = q->aux;
    int64_t b, e;
    dl_split(d->m, ith, nth, &b, &e);
    for (int64_t m = b; m < e; m++) {
        float *f = (float *)c->acc + m * N;
        if (d->quant == DL_QUANT_W8A8) rescale_row(f, q->csum, s, c->rs[2 * m], (int32_t)c->rs[2 * m + 1], N);
        if (q->bias)
            for (int64_t n = 0; n < N; n++) f[n] += q->bias[n];
        if (d->act != DL_ACT_NONE) dl_kernels()->activation(d->act, DL_F32, f, f, N);
        dl_kernels()->convert(d->dst_dt, (char *)c->y + (size_t)(m * d->ldy) * dl_dtype_size(d->dst_dt), DL_F32, f, N);
    }
}

/* weight-only: dequantize output channels [n0, n0 + nb) into the panel [nb, K] */
static void panel_fn(void *ctx, int ith, int nth) {
    const run_ctx *c = ctx;
    const int64_t K = c->q->d.k;
    int64_t b, e;
    dl_split(c->nb, ith, nth, &b, &e);
    for (int64_t r = b; r < e; r++) {
        const int8_t *w = c->q->w + (c->n0 + r) * K;
        float s = c->q->aux[c->n0 + r], *p = c->panel + r * K;
        for (int64_t k = 0; k < K; k++) p[k] = (float)w[k] * s;
    }
}

/* weight-only, bf16 panels: output channels [n0, n0 + nb) dequantized and rounded to bf16 */
static void panel_bf16_fn(void *ctx, int ith, int nth) {
    const run_ctx *c = ctx;
    const int64_t K = c->q->d.k;
    int64_t b, e;
    dl_split(c->nb, ith, nth, &b, &e);
    float row[512];
    for (int64_t r = b; r < e; r++) {
        const int8_t *w = c->q->w + (c->n0 + r) * K;
        const float s = c->q->aux[c->n0 + r];
        uint16_t *p = (uint16_t *)c->panel + r * K;
        for (int64_t k0 = 0; k0 < K; k0 += 512) {
            const int64_t nk = K - k0 < 512 ? K - k0 : 512;
            for (int64_t k = 0; k < nk; k++) row[k] = (float)w[k0 + k] * s;
            dl_kernels()->convert(DL_BF16, p + k0, DL_F32, row, nk);
        }
    }
}

/* weight-only, bf16 panels: the panel's sums [M, nb] (in c->panel) into acc's columns [n0, n0 + nb) */
static void sums_to_acc_fn(void *ctx, int ith, int nth) {
    const run_ctx *c = ctx;
    const int64_t N = c->q->d.n;
    int64_t b, e;
    dl_split(c->q->d.m, ith, nth, &b, &e);
    for (int64_t m = b; m < e; m++) memcpy((float *)c->acc + m * N + c->n0, c->panel + m * c->nb, (size_t)c->nb * 4);
}

/* eight independent partial sums: the compiler vectorizes them without reordering
 * one sum's additions */
static float dot8(const float *a, const float *b, int64_t n) {
    float acc[8] = {0};
    int64_t k = 0;
    for (; k + 8 <= n; k += 8)
        for (int j = 0; j < 8; j++) acc[j] += a[k + j] * b[k + j];
    float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; k < n; k++) s += a[k] * b[k];
    return s;
}

/* weight-only, a few rows: y[m, n] = s[n] sum_k q[n, k] x[m, k], split over n; each
 * weight row widened once (into this thread's row of the panel) for all the rows */
static void few_rows_fn(void *ctx, int ith, int nth) {
    const run_ctx *c = ctx;
    const dl_matmul_desc *d = &c->q->d;
    const int64_t K = d->k, N = d->n;
    DL_ASSERT(ith < Q8_PANEL); /* a panel row per thread */
    float *wf = c->panel + (int64_t)ith * K;
    int64_t b, e;
    dl_split(N, ith, nth, &b, &e);
    for (int64_t n = b; n < e; n++) {
        const int8_t *w = c->q->w + n * K;
        for (int64_t k = 0; k < K; k++) wf[k] = (float)w[k];
        for (int64_t m = 0; m < d->m; m++)
            ((float *)c->acc)[m * N + n] = dot8(wf, c->xf + m * c->ldxf, K) * c->q->aux[n];
    }
}

dl_status dl_q8_run(dl_q8 *q, const void *x, void *y) {
    dl_status s = DL_OK;
    const dl_matmul_desc *d = &q->d;
    const size_t M = (size_t)d->m, K = (size_t)d->k, N = (size_t)d->n;
    pthread_mutex_lock(&g_q.lock);
    char *buf = g_q.buf;
    run_ctx c = {.q = q, .x = x, .y = y};
    if (d->quant == DL_QUANT_W8A8) {
        c.levels = dl_q8_levels();
        c.xq = (uint8_t *)buf;
        c.acc = buf + al64(M * K);
        c.rs = (float *)(buf + al64(M * K) + al64(M * N * 4));
        dl_parallel(quant_x_fn, &c);
        dnnl_exec_arg_t args[4];
        int na = 0;
        DNNL_TRY(dnnl_memory_set_data_handle(q->src, c.xq), "set src");
        DNNL_TRY(dnnl_memory_set_data_handle(q->dst, c.acc), "set dst");
        args[na++] = (dnnl_exec_arg_t){DNNL_ARG_SRC, q->src};
        args[na++] = (dnnl_exec_arg_t){DNNL_ARG_WEIGHTS, q->wei};
        args[na++] = (dnnl_exec_arg_t){DNNL_ARG_DST, q->dst};
        if (q->scratch) args[na++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, q->scratch};
        DNNL_TRY(dnnl_primitive_execute(q->prim, dl_dnnl_stream, na, args), "int8 matmul");
        DNNL_TRY(dnnl_stream_wait(dl_dnnl_stream), "stream wait");
    } else if (q->bp[0] && M > Q8_FEW_ROWS) { /* bf16 panels */
        c.panel = (float *)buf;
        c.acc = buf + al64((size_t)Q8_PANEL * K * 4);
        for (int64_t n0 = 0; n0 < (int64_t)N; n0 += Q8_PANEL) {
            c.n0 = n0;
            c.nb = (int64_t)N - n0 < Q8_PANEL ? (int64_t)N - n0 : Q8_PANEL;
            const int i = c.nb == q->bnb[0] ? 0 : 1;
            dl_parallel(panel_bf16_fn, &c);
            char *blocked = buf + al64((size_t)Q8_PANEL * K * 4) + al64(M * N * 4);
            dnnl_exec_arg_t rargs[2] = {{DNNL_ARG_FROM, q->bplain[i]}, {DNNL_ARG_TO, q->bwei[i]}};
            DNNL_TRY(dnnl_memory_set_data_handle(q->bplain[i], c.panel), "set panel");
            DNNL_TRY(dnnl_memory_set_data_handle(q->bwei[i], blocked), "set weights");
            DNNL_TRY(dnnl_primitive_execute(q->br[i], dl_dnnl_stream, 2, rargs), "panel reorder");
            dnnl_exec_arg_t args[4];
            int na = 0;
            DNNL_TRY(dnnl_memory_set_data_handle(q->bsrc[i], (void *)x), "set src");
            float *sums = (float *)(blocked + al64(q->bblk));
            DNNL_TRY(dnnl_memory_set_data_handle(q->bdst[i], sums), "set dst");
            args[na++] = (dnnl_exec_arg_t){DNNL_ARG_SRC, q->bsrc[i]};
            args[na++] = (dnnl_exec_arg_t){DNNL_ARG_WEIGHTS, q->bwei[i]};
            args[na++] = (dnnl_exec_arg_t){DNNL_ARG_DST, q->bdst[i]};
            if (q->bscr[i]) args[na++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, q->bscr[i]};
            DNNL_TRY(dnnl_primitive_execute(q->bp[i], dl_dnnl_stream, na, args), "bf16 panel matmul");
            DNNL_TRY(dnnl_stream_wait(dl_dnnl_stream), "stream wait");
            c.panel = sums; /* the panel's sums into acc's columns */
            dl_parallel(sums_to_acc_fn, &c);
            c.panel = (float *)buf;
        }
    } else {
        size_t off = 0;
        c.xf = x;
        c.ldxf = d->ldx;
        if (d->dt != DL_F32) { /* x widened to f32 rows */
            float *xf = (float *)buf;
            for (size_t m = 0; m < M; m++)
                dl_kernels()->convert(DL_F32, xf + m * K, d->dt, (const char *)x + m * (size_t)d->ldx * dl_dtype_size(d->dt), (int64_t)K);
            c.xf = xf;
            c.ldxf = (int64_t)K;
            off = al64(M * K * 4);
        }
        c.panel = (float *)(buf + off);
        c.acc = buf + off + al64((size_t)Q8_PANEL * K * 4);
        if (M <= Q8_FEW_ROWS) {
            dl_parallel(few_rows_fn, &c);
        } else {
            for (int64_t n0 = 0; n0 < (int64_t)N; n0 += Q8_PANEL) {
                c.n0 = n0;
                c.nb = (int64_t)N - n0 < Q8_PANEL ? (int64_t)N - n0 : Q8_PANEL;
                dl_parallel(panel_fn, &c);
                if (dl_gemm_blas() && M <= INT_MAX && K <= INT_MAX && N <= INT_MAX && c.ldxf <= INT_MAX) {
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)M, (int)c.nb, (int)K, 1.f, c.xf, (int)c.ldxf,
                                c.panel, (int)K, 0.f, (float *)c.acc + n0, (int)N);
                    continue;
                }
                dnnl_status_t st = dnnl_sgemm('N', 'T', (dnnl_dim_t)M, c.nb, (dnnl_dim_t)K, 1.f, c.xf, c.ldxf, c.panel,
                                              (dnnl_dim_t)K, 0.f, (float *)c.acc + n0, (dnnl_dim_t)N);
                if (st != dnnl_success) {
                    s = dl_fail(DL_ERR_BACKEND, "oneDNN: sgemm failed (status %d)", (int)st);
                    goto err;
                }
            }
        }
    }
    dl_parallel(epilogue_fn, &c);
err:
    pthread_mutex_unlock(&g_q.lock);
    return s;
}
