/* The CUDA kernels against the CPU (docs/cuda.md). Needs a GPU: without one it prints
 * why and exits 77, which ctest reports as skipped (never as passed).
 * - attention (f32 and bf16; all keys, a key interval, causal, partial outputs merged
 *   over two key halves) against the CPU kernel on the same inputs: f32 within 1e-5 of
 *   max|ref|, bf16 within 2^-7 (one bf16 rounding of the output);
 * - RMSNorm, LayerNorm + modulate, RoPE, gated add, GELU-tanh, SiLU, f32 <-> bf16,
 *   against double references in this file;
 * - cuBLASLt GEMM (bf16 in, f32 and bf16 out; bias; GELU epilogue) against a double
 *   product of the same bf16 values;
 * - a step graph on CUDA: a gated add captured once, replayed with new scalars (the
 *   gate lives in the device buffer the host rewrites), every result checked. */
#include <cuda_runtime.h>
#include <math.h>
#include <string.h>

#include "difflet/cuda.h"
#include "test_util.h"

static float frand(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) & 0xffffff) / 8388608.f - 1.f;
}

/* n values of dt on the device from f32 host values (rounded to bf16 when dt is);
 * host keeps the values the device has */
static void *up(dl_dtype dt, float *host, int64_t n) {
    void *d = NULL;
    size_t es = dt == DL_BF16 ? 2 : 4;
    uint16_t *b = malloc((size_t)n * 2);
    for (int64_t i = 0; dt == DL_BF16 && i < n; i++) b[i] = dl_f32_to_bf16(host[i]), host[i] = dl_bf16_to_f32(b[i]);
    if (dl_cuda_alloc(&d, (size_t)n * es) || dl_cuda_copy(d, dt == DL_BF16 ? (void *)b : (void *)host, (size_t)n * es, 1))
        d = NULL;
    free(b);
    return d;
}

static void down(dl_dtype dt, float *host, const void *d, int64_t n) {
    if (dt == DL_F32) {
        dl_cuda_copy(host, d, (size_t)n * 4, 0);
        return;
    }
    uint16_t *b = malloc((size_t)n * 2);
    dl_cuda_copy(b, d, (size_t)n * 2, 0);
    for (int64_t i = 0; i < n; i++) host[i] = dl_bf16_to_f32(b[i]);
    free(b);
}

static double rel(const float *got, const float *want, int64_t n) {
    double e = 0, m = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) return INFINITY;
        e = fmax(e, fabs((double)got[i] - want[i])), m = fmax(m, fabs(want[i]));
    }
    return e / (m > 0 ? m : 1);
}

static void test_attention(dl_dtype dt) {
    const int64_t S = 77, T = 93, H = 3, D = 64, W = H * D;
    uint64_t seed = 7;
    float *q = malloc(S * W * 4), *k = malloc(T * W * 4), *v = malloc(T * W * 4), *ref = malloc(S * W * 4), *got = malloc(S * W * 4);
    for (int64_t i = 0; i < S * W; i++) q[i] = frand(&seed);
    for (int64_t i = 0; i < T * W; i++) k[i] = frand(&seed), v[i] = frand(&seed);
    void *dq = up(dt, q, S * W), *dk = up(dt, k, T * W), *dv = up(dt, v, T * W), *dout = NULL;
    dl_cuda_alloc(&dout, (size_t)(S * W) * 4);
    const double bar = dt == DL_F32 ? 1e-5 : 1.0 / 128;
    const int64_t ranges[3][3] = {{0, T, 0}, {20, 61, 0}, {0, T, 1}}; /* kv_begin, kv_end, causal */
    for (int c = 0; c < 3; c++) {
        /* the CPU's answer on the same (rounded) values, in f32 */
        dl_attn_args a = {.dt = DL_F32, .sq = S, .sk = T, .heads = H, .head_dim = D, .q = q, .k = k, .v = v, .out = ref,
                          .kv_begin = ranges[c][0], .kv_end = ranges[c][1], .scale = 0.125f, .causal = (int)ranges[c][2]};
        dl_attn(&a, NULL); /* its own scratch, for every thread */
        dl_attn_args g = a;
        g.dt = dt, g.q = dq, g.k = dk, g.v = dv, g.out = dout;
        dl_status s = dl_cuda_attention(&g, NULL);
        if (!s) s = dl_cuda_sync(NULL);
        down(dt, got, dout, S * W);
        const double e = rel(got, ref, S * W);
        CHECK(s == DL_OK && e <= bar, "%s attention, keys [%lld, %lld)%s: %.3g of max (bound %.3g) %s", dl_dtype_name(dt),
              (long long)a.kv_begin, (long long)a.kv_end, a.causal ? " causal" : "", e, bar, s ? dl_last_error() : "");
    }
    /* partial outputs over two key halves, merged on the CPU: the whole attention */
    float *op = NULL, *m = NULL, *l = NULL;
    dl_cuda_alloc((void **)&op, (size_t)(2 * S * W) * 4), dl_cuda_alloc((void **)&m, (size_t)(2 * H * S) * 4),
        dl_cuda_alloc((void **)&l, (size_t)(2 * H * S) * 4);
    float *hop = malloc(2 * S * W * 4), *hm = malloc(2 * H * S * 4), *hl = malloc(2 * H * S * 4);
    dl_status s = DL_OK;
    for (int half = 0; half < 2 && !s; half++) {
        dl_attn_args g = {.dt = dt, .sq = S, .sk = T, .heads = H, .head_dim = D, .q = dq, .k = dk, .v = dv,
                          .kv_begin = half ? 40 : 0, .kv_end = half ? T : 40, .scale = 0.125f, .o_part = op + half * S * W,
                          .m = m + half * H * S, .l = l + half * H * S};
        s = dl_cuda_attention(&g, NULL);
    }
    if (!s) s = dl_cuda_sync(NULL);
    dl_cuda_copy(hop, op, (size_t)(2 * S * W) * 4, 0), dl_cuda_copy(hm, m, (size_t)(2 * H * S) * 4, 0),
        dl_cuda_copy(hl, l, (size_t)(2 * H * S) * 4, 0);
    dl_attn_partial parts[2] = {{hop, hm, hl}, {hop + S * W, hm + H * S, hl + H * S}};
    dl_attn_merge_t(parts, 2, S, H, D, DL_F32, got, W, NULL, NULL, NULL, 0, 1);
    dl_attn_args a = {.dt = DL_F32, .sq = S, .sk = T, .heads = H, .head_dim = D, .q = q, .k = k, .v = v, .out = ref,
                      .kv_begin = 0, .kv_end = T, .scale = 0.125f};
    dl_attn(&a, NULL);
    CHECK(s == DL_OK && rel(got, ref, S * W) <= 1e-5, "%s partial attention merged: %.3g", dl_dtype_name(dt), rel(got, ref, S * W));
    dl_cuda_free(op), dl_cuda_free(m), dl_cuda_free(l), dl_cuda_free(dq), dl_cuda_free(dk), dl_cuda_free(dv), dl_cuda_free(dout);
    free(q), free(k), free(v), free(ref), free(got), free(hop), free(hm), free(hl);
}

static void test_elementwise(dl_dtype dt) {
    const int64_t R = 37, C = 320, n = R * C;
    uint64_t seed = 3;
    float *x = malloc(n * 4), *w = malloc(C * 4), *sc = malloc(C * 4), *sh = malloc(C * 4), *want = malloc(n * 4), *got = malloc(n * 4);
    for (int64_t i = 0; i < n; i++) x[i] = 2.f * frand(&seed);
    for (int64_t i = 0; i < C; i++) w[i] = frand(&seed), sc[i] = 0.5f * frand(&seed), sh[i] = frand(&seed);
    const double bar = dt == DL_F32 ? 2e-5 : 1.0 / 128;
    float *dxf = up(DL_F32, x, n), *dw = up(DL_F32, w, C), *dsc = up(DL_F32, sc, C), *dsh = up(DL_F32, sh, C);
    float *xr = malloc(n * 4);
    memcpy(xr, x, n * 4);
    void *dx = up(dt, xr, n), *dy = NULL;
    dl_cuda_alloc(&dy, (size_t)n * 4);
    /* RMSNorm with a weight */
    for (int64_t r = 0; r < R; r++) {
        double ss = 0;
        for (int64_t c = 0; c < C; c++) ss += (double)xr[r * C + c] * xr[r * C + c];
        for (int64_t c = 0; c < C; c++) want[r * C + c] = (float)(xr[r * C + c] / sqrt(ss / C + 1e-6) * w[c]);
    }
    dl_status s = dl_cuda_rmsnorm(dt, dx, dy, dw, R, C, 1e-6f, NULL);
    if (!s) s = dl_cuda_sync(NULL);
    down(dt, got, dy, n);
    CHECK(!s && rel(got, want, n) <= bar, "%s rmsnorm: %.3g", dl_dtype_name(dt), rel(got, want, n));
    /* LayerNorm + modulate from the f32 residual */
    for (int64_t r = 0; r < R; r++) {
        double mu = 0, var = 0;
        for (int64_t c = 0; c < C; c++) mu += x[r * C + c];
        mu /= C;
        for (int64_t c = 0; c < C; c++) var += (x[r * C + c] - mu) * (x[r * C + c] - mu);
        for (int64_t c = 0; c < C; c++) want[r * C + c] = (float)((x[r * C + c] - mu) / sqrt(var / C + 1e-6) * (1 + sc[c]) + sh[c]);
    }
    s = dl_cuda_ln_modulate(dt, dxf, dy, dsc, dsh, R, C, 1e-6f, NULL);
    if (!s) s = dl_cuda_sync(NULL);
    down(dt, got, dy, n);
    CHECK(!s && rel(got, want, n) <= bar, "%s layernorm + modulate: %.3g", dl_dtype_name(dt), rel(got, want, n));
    /* RoPE: 5 heads of 64 per row */
    const int64_t Hh = 5, Dd = 64;
    float *cs = malloc(R * Dd / 2 * 4), *sn = malloc(R * Dd / 2 * 4);
    for (int64_t i = 0; i < R * Dd / 2; i++) cs[i] = cosf(0.1f * (float)i), sn[i] = sinf(0.1f * (float)i);
    float *dcs = up(DL_F32, cs, R * Dd / 2), *dsn = up(DL_F32, sn, R * Dd / 2);
    for (int64_t r = 0; r < R; r++)
        for (int64_t h = 0; h < Hh; h++)
            for (int64_t p = 0; p < Dd / 2; p++) {
                const int64_t o = r * C + h * Dd + 2 * p;
                const double c = cs[r * Dd / 2 + p], si = sn[r * Dd / 2 + p];
                want[o] = (float)(xr[o] * c - xr[o + 1] * si), want[o + 1] = (float)(xr[o] * si + xr[o + 1] * c);
            }
    s = dl_cuda_rope(dt, dx, R, Hh, Dd, C, dcs, dsn, NULL);
    if (!s) s = dl_cuda_sync(NULL);
    down(dt, got, dx, n);
    CHECK(!s && rel(got, want, n) <= bar, "%s rope: %.3g", dl_dtype_name(dt), rel(got, want, n));
    /* activations, in place */
    for (int act = 0; act < 2; act++) {
        memcpy(xr, x, n * 4);
        void *da = up(dt, xr, n);
        for (int64_t i = 0; i < n; i++) {
            const double v = xr[i];
            want[i] = (float)(act ? v / (1 + exp(-v)) : 0.5 * v * (1 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v))));
        }
        s = dl_cuda_activation(dt, da, n, act ? DL_ACT_SILU : DL_ACT_GELU_TANH, NULL);
        if (!s) s = dl_cuda_sync(NULL);
        down(dt, got, da, n);
        CHECK(!s && rel(got, want, n) <= bar, "%s %s: %.3g", dl_dtype_name(dt), act ? "silu" : "gelu", rel(got, want, n));
        dl_cuda_free(da);
    }
    /* gated add (f32) and the conversions */
    float *u = malloc(n * 4), *du;
    for (int64_t i = 0; i < n; i++) u[i] = frand(&seed), want[i] = x[i] + sc[i % C] * u[i];
    du = up(DL_F32, u, n);
    s = dl_cuda_gated_add(dxf, du, dsc, R, C, NULL);
    if (!s) s = dl_cuda_sync(NULL);
    down(DL_F32, got, dxf, n);
    CHECK(!s && rel(got, want, n) <= 1e-6, "gated add: %.3g", rel(got, want, n));
    uint16_t *hb = malloc(n * 2), *gb = malloc(n * 2);
    for (int64_t i = 0; i < n; i++) hb[i] = dl_f32_to_bf16(got[i]); /* the device's own f32 values */
    void *db = NULL;
    dl_cuda_alloc(&db, (size_t)n * 2);
    s = dl_cuda_convert(DL_F32, dxf, DL_BF16, db, n, NULL);
    if (!s) s = dl_cuda_sync(NULL);
    dl_cuda_copy(gb, db, (size_t)n * 2, 0);
    CHECK(!s && !memcmp(hb, gb, (size_t)n * 2), "f32 -> bf16 rounds as the CPU does");
    dl_cuda_free(db), dl_cuda_free(du), dl_cuda_free(dcs), dl_cuda_free(dsn), dl_cuda_free(dx), dl_cuda_free(dy);
    dl_cuda_free(dxf), dl_cuda_free(dw), dl_cuda_free(dsc), dl_cuda_free(dsh);
    free(x), free(w), free(sc), free(sh), free(want), free(got), free(xr), free(cs), free(sn), free(u), free(hb), free(gb);
}

static void test_gemm(void) {
    const int64_t M = 129, K = 256, N = 96;
    uint64_t seed = 5;
    float *x = malloc(M * K * 4), *w = malloc(N * K * 4), *b = malloc(N * 4), *want = malloc(M * N * 4), *got = malloc(M * N * 4);
    for (int64_t i = 0; i < M * K; i++) x[i] = frand(&seed);
    for (int64_t i = 0; i < N * K; i++) w[i] = frand(&seed);
    for (int64_t i = 0; i < N; i++) b[i] = frand(&seed);
    void *dx = up(DL_BF16, x, M * K), *dw = up(DL_BF16, w, N * K), *dy = NULL;
    float *bo = malloc(N * 4);
    dl_cuda_alloc(&dy, (size_t)(M * N) * 4);
    for (int c = 0; c < 3; c++) { /* f32 out + bias; bf16 out + bias + GELU; f32 out, no bias */
        const dl_dtype od = c == 1 ? DL_BF16 : DL_F32;
        const dl_act act = c == 1 ? DL_ACT_GELU_TANH : DL_ACT_NONE;
        memcpy(bo, b, N * 4);
        void *db = up(od, bo, N); /* the bias in the output's type (bo: the values it holds) */
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                double acc = c == 2 ? 0 : bo[j];
                for (int64_t t = 0; t < K; t++) acc += (double)x[i * K + t] * w[j * K + t];
                if (act) acc = 0.5 * acc * (1 + tanh(0.7978845608028654 * (acc + 0.044715 * acc * acc * acc)));
                want[i * N + j] = (float)acc;
            }
        dl_cuda_gemm *g = NULL;
        dl_status s = dl_cuda_gemm_new(&g, M, K, N, DL_BF16, od, act);
        if (!s) s = dl_cuda_gemm_run(g, dx, dw, c == 2 ? NULL : db, dy, NULL);
        if (!s) s = dl_cuda_sync(NULL);
        down(od, got, dy, M * N);
        const double e = rel(got, want, M * N), bar = od == DL_BF16 ? 1.0 / 128 : 1e-5;
        CHECK(!s && e <= bar, "GEMM case %d: %.3g (bound %.3g) %s", c, e, bar, s ? dl_last_error() : "");
        dl_cuda_gemm_free(g);
        dl_cuda_free(db);
    }
    dl_cuda_free(dx), dl_cuda_free(dw), dl_cuda_free(dy);
    free(x), free(w), free(b), free(bo), free(want), free(got);
}

/* a step graph on CUDA: x += gate * u with the gate in the scalars' device buffer */
typedef struct {
    float *x, *u, *gate;
    int64_t n;
    void *stream; /* the capturing stream: the step's kernels go there */
} gstep;
static dl_status gstep_record(void *c) {
    gstep *g = c;
    return dl_cuda_gated_add(g->x, g->u, g->gate, 1, g->n, g->stream);
}

static void test_graph(void) {
    cudaStream_t st = NULL;
    /* capture needs a stream other than the legacy default one */
    if (cudaStreamCreate(&st) != cudaSuccess) {
        CHECK(0, "a stream");
        return;
    }
    const int64_t n = 256;
    float hx[256] = {0}, hu[256], got[256];
    for (int i = 0; i < n; i++) hu[i] = (float)i;
    gstep g = {up(DL_F32, hx, n), up(DL_F32, hu, n), NULL, n, st};
    dl_cuda_alloc((void **)&g.gate, (size_t)n * 4);
    dl_step_graph *sg = NULL;
    dl_status s = dl_step_graph_new(&sg, dl_cuda_graph_ops(), st, "prog", g.gate, (size_t)n * 4);
    float gates[256];
    double total = 0;
    for (int step = 0; step < 4 && !s; step++) {
        for (int i = 0; i < n; i++) gates[i] = (float)(step + 1);
        total += step + 1;
        s = dl_step_graph_run(sg, "prog", gates, sizeof gates, gstep_record, &g);
    }
    if (!s) s = dl_cuda_sync(st);
    dl_cuda_copy(got, g.x, sizeof got, 0);
    int ok = !s;
    for (int i = 0; i < n; i++) ok &= fabs(got[i] - total * hu[i]) <= 1e-3 * (1 + total * hu[i]);
    int cap = 0, rep = 0;
    if (sg) dl_step_graph_stats(sg, &cap, &rep);
    CHECK(ok && cap == 1 && rep == 3, "CUDA graph: captured %d, replayed %d, x[255] %g (want %g) %s", cap, rep, got[255],
          total * 255, s ? dl_last_error() : "");
    dl_step_graph_free(sg);
    dl_cuda_free(g.x), dl_cuda_free(g.u), dl_cuda_free(g.gate);
    cudaStreamDestroy(st);
}

int main(void) {
    dl_cuda_info in;
    if (dl_cuda_probe(&in) != DL_OK) {
        printf("test_cuda_gpu: skipped: %s\n", dl_last_error());
        return 77;
    }
    char key[128];
    dl_cuda_key(&in, key, sizeof key);
    printf("test_cuda_gpu on %s (%s, %.0f GiB)\n", in.name, key, in.mem_bytes / 1073741824.0);
    test_attention(DL_F32);
    test_attention(DL_BF16);
    test_elementwise(DL_F32);
    test_elementwise(DL_BF16);
    test_gemm();
    test_graph();
    return test_done("test_cuda_gpu");
}
