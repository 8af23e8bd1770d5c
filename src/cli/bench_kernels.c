/* `difflet bench kernels`: throughput of the kernels every model runs, each as a
 * ratio to a reference measured in the same run (absolute times on shared machines
 * are noise):
 *   - difflet's matmul (OpenBLAS or oneDNN, named per shape) at FLUX projection shapes, f32 and bf16 (the peak);
 *   - fused attention, bf16, H=24, D=128: GFLOP/s (4 S^2 D H) / best bf16 matmul;
 *   - fused attention at OpenSora STDiT3's shapes (H=16, D=72): spatial over a frame's
 *     tokens, temporal as many 15-token sequences, whole sequences per thread;
 *   - element-wise kernels on bf16 activations: GB/s / parallel memcpy GB/s. */
#include <cjson/cJSON.h>
#include <unistd.h>

#ifndef DIFFLET_SOURCE_DIR
#define DIFFLET_SOURCE_DIR "."
#endif
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "difflet/check.h"
#include "difflet/kernels.h"

/* Best wall time of `reps` runs after one warm-up. */
#define TIME_BEST(reps, best, stmt)            \
    do {                                       \
        stmt;                                  \
        best = INFINITY;                       \
        for (int r_ = 0; r_ < (reps); r_++) {  \
            double t0_ = dl_now();             \
            stmt;                              \
            double dt_ = dl_now() - t0_;       \
            if (dt_ < best) best = dt_;        \
        }                                      \
    } while (0)

typedef struct {
    const void *src;
    void *dst;
    size_t n;
} copy_task;

static void copy_fn(void *ctx, int ith, int nth) {
    copy_task *t = ctx;
    int64_t b, e;
    dl_split((int64_t)t->n, ith, nth, &b, &e);
    memcpy((char *)t->dst + b, (const char *)t->src + b, (size_t)(e - b));
}

/* One element-wise op over a [rows, cols] bf16 activation, run on the pool. */
typedef struct {
    int op;
    int64_t rows, cols;
    void *x, *y;
    const float *v1, *v2, *cs, *sn;
} elem_task;

enum { E_LN_MOD, E_RMS, E_GELU, E_SILU, E_GATED, E_ROPE, E_SOFTMAX, E_CVT, E_COUNT };
static const char *elem_names[E_COUNT] = {"layernorm_modulate", "rmsnorm", "gelu_tanh", "silu",
                                          "gated_residual", "rope_pairs", "softmax", "convert_bf16_f32"};
/* bytes moved per element (bf16 = 2): read + write, plus an extra read where the op
 * reads two activations; convert writes f32 */
static const double elem_bytes[E_COUNT] = {4, 4, 4, 4, 6, 4, 4, 6};

static void elem_fn(void *ctx, int ith, int nth) {
    elem_task *t = ctx;
    int64_t n = t->rows * t->cols;
    switch (t->op) {
    case E_LN_MOD: dl_layernorm_modulate_t(DL_BF16, t->y, t->x, t->rows, t->cols, t->v1, t->v2, 1e-6f, ith, nth); break;
    case E_RMS: dl_rmsnorm_t(DL_BF16, t->y, t->x, t->rows, t->cols, t->v1, 1e-6f, ith, nth); break;
    case E_GELU: dl_activation_t(DL_ACT_GELU_TANH, DL_BF16, t->y, t->x, n, ith, nth); break;
    case E_SILU: dl_activation_t(DL_ACT_SILU, DL_BF16, t->y, t->x, n, ith, nth); break;
    case E_GATED: dl_gated_residual_t(DL_BF16, t->y, t->x, t->rows, t->cols, t->v1, ith, nth); break;
    case E_ROPE: dl_rope_t(DL_ROPE_PAIRS, DL_BF16, t->y, t->rows, t->cols / 128, 128, t->cols, t->cs, t->sn, ith, nth); break;
    case E_SOFTMAX: dl_softmax_t(DL_BF16, t->y, t->x, t->rows, t->cols, ith, nth); break;
    case E_CVT: dl_convert_t(DL_F32, t->y, DL_BF16, t->x, n, ith, nth); break;
    }
}

typedef struct {
    const dl_attn_args *a;
    void *scratch;
} attn_task;

static void attn_fn(void *ctx, int ith, int nth) {
    attn_task *t = ctx;
    dl_attn_t(t->a, t->scratch, ith, nth);
}

/* Sequences of an [T][P][3][H][D] fused QKV buffer (tokens P positions apart), each
 * thread whole ones on its own scratch slice: sequence i is position i % P. This is
 * how stdit3.c runs its temporal attention. */
typedef struct {
    const dl_attn_args *a; /* sq = sk = T, strides P * 3 * H * D, out_stride P * H * D */
    char *qkv, *out, *scratch;
    size_t slice;
    int64_t nseq, pos;
} seq_task;

static void seq_fn(void *ctx, int ith, int nth) {
    seq_task *t = ctx;
    const size_t es = dl_dtype_size(t->a->dt);
    const int64_t hd = t->a->heads * t->a->head_dim;
    dl_attn_args ai = *t->a;
    int64_t i0, i1;
    dl_split(t->nseq, ith, nth, &i0, &i1);
    for (int64_t i = i0; i < i1; i++) {
        int64_t p = i % t->pos;
        ai.q = t->qkv + (size_t)(p * 3 * hd) * es;
        ai.k = (const char *)ai.q + (size_t)hd * es;
        ai.v = (const char *)ai.q + (size_t)(2 * hd) * es;
        ai.out = t->out + (size_t)(p * hd) * es;
        dl_attn_t(&ai, t->scratch + (size_t)ith * t->slice, 0, 1);
    }
}

/* OpenSora 1.2 STDiT3 (hidden 1152, 16 heads: D = 72): spatial attention over one
 * frame's S tokens on the pool (S = 405 and 1590: 240p and 480p-ish frames), and the
 * temporal attention over T = 15 latent frames (51 frames), 6,000 sequences over
 * 1,000 positions. Flops 4 sq sk D H per sequence; the ratio is to the same-run
 * matmul peak of the dtype. Returns 0 when out of memory. */
static int bench_attn_opensora(cJSON *jat, int reps, int quick, double best_bf16, double best_f32) {
    const int64_t H = 16, D = 72, hd = H * D, T = 15, P = quick ? 200 : 1000, nseq = quick ? 600 : 6000;
    static const int64_t spatial[] = {405, 1590};
    for (int di = 0; di < 2; di++) {
        dl_dtype adt = di ? DL_F32 : DL_BF16;
        size_t es = dl_dtype_size(adt);
        double peak = di ? best_f32 : best_bf16;
        for (int si = 0; si < 3; si++) {
            const int temporal = si == 2;
            if (quick && si == 1) continue;
            const int64_t S = temporal ? T : spatial[si], rows = temporal ? T * P : S, nq = temporal ? nseq : 1;
            void *qkv = malloc((size_t)(rows * 3 * hd) * es), *o = malloc((size_t)(rows * hd) * es);
            dl_attn_args a = {.dt = adt, .sq = S, .sk = S, .heads = H, .head_dim = D, .q = qkv,
                              .k = (char *)qkv + (size_t)hd * es, .v = (char *)qkv + (size_t)(2 * hd) * es,
                              .q_stride = 3 * hd, .k_stride = 3 * hd, .v_stride = 3 * hd, .out = o,
                              .kv_begin = 0, .kv_end = S, .scale = 1.f / sqrtf((float)D)};
            if (temporal) {
                a.q_stride = a.k_stride = a.v_stride = P * 3 * hd;
                a.out_stride = P * hd;
            }
            size_t slice = dl_align_up(dl_attn_scratch_bytes(&a, 1), DL_ALIGN);
            void *scratch = dl_aligned_alloc(temporal ? slice * (size_t)dl_threads() + 64
                                                      : dl_attn_scratch_bytes(&a, dl_threads()) + 64);
            if (!qkv || !o || !scratch) {
                fprintf(stderr, "difflet: bench: out of memory\n");
                free(qkv), free(o), dl_aligned_free(scratch);
                return 0;
            }
            if (di == 0 && si == 0)
                printf("\nfused attention at OpenSora STDiT3 shapes (%s kernel), H=16, D=72\n  %-6s %-22s %10s %12s\n",
                       dl_attn_path_name(&a), "dtype", "shape", "GFLOP/s", "x matmul");
            dl_fill_uniform(adt, qkv, rows * 3 * hd, -1.f, 1.f, 12);
            attn_task at = {&a, scratch};
            seq_task st = {&a, qkv, o, scratch, slice, nseq, P};
            double t;
            if (temporal)
                TIME_BEST(reps, t, dl_parallel(seq_fn, &st));
            else
                TIME_BEST(reps, t, dl_parallel(attn_fn, &at));
            double gf = 4.0 * (double)S * (double)S * (double)D * (double)H * (double)nq / t * 1e-9;
            double ratio = peak > 0 ? gf / peak : 0;
            char shape[64];
            if (temporal)
                snprintf(shape, sizeof shape, "temporal %lld x T=%lld", (long long)nseq, (long long)T);
            else
                snprintf(shape, sizeof shape, "spatial S=%lld", (long long)S);
            printf("  %-6s %-22s %10.1f %12.2f\n", dl_dtype_name(adt), shape, gf, ratio);
            cJSON *e = cJSON_CreateObject();
            cJSON_AddStringToObject(e, "dtype", dl_dtype_name(adt));
            cJSON_AddStringToObject(e, "path", dl_attn_path_name(&a));
            cJSON_AddStringToObject(e, "model", "opensora-stdit3");
            cJSON_AddStringToObject(e, "kind", temporal ? "temporal" : "spatial");
            cJSON_AddNumberToObject(e, "seq", (double)S);
            cJSON_AddNumberToObject(e, "sequences", (double)nq);
            cJSON_AddNumberToObject(e, "heads", (double)H);
            cJSON_AddNumberToObject(e, "head_dim", (double)D);
            cJSON_AddNumberToObject(e, "gflops", gf);
            cJSON_AddNumberToObject(e, di ? "ratio_to_matmul_f32" : "ratio_to_matmul_bf16", ratio);
            cJSON_AddItemToArray(jat, e);
            free(qkv), free(o), dl_aligned_free(scratch);
        }
    }
    return 1;
}

/* The same matmul shapes in torch (tools venv), for "is oneDNN 2.6 what the peer
 * gets?": printed per shape as a ratio to difflet's, recorded in the JSON. */
static void matmul_peer(cJSON *root, int64_t M, int reps, int quick) {
    const char *py = DIFFLET_SOURCE_DIR "/tools/venv/bin/python";
    if (access(py, X_OK) != 0) {
        printf("  torch peer: not measured (no %s: run `make tools-venv`)\n", py);
        return;
    }
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s %s/tools/bench/matmul_peer.py %lld %d %d 3072:3072 3072:9216%s", py,
             DIFFLET_SOURCE_DIR, (long long)M, dl_threads(), reps, quick ? "" : " 3072:12288 12288:3072");
    FILE *f = popen(cmd, "r");
    char line[8192] = "";
    while (f && fgets(line, sizeof line, f))
        if (line[0] == '{') break;
    int prc = f ? pclose(f) : -1;
    cJSON *pj = prc == 0 ? cJSON_Parse(line) : NULL;
    const cJSON *g = cJSON_GetObjectItemCaseSensitive(pj, "gflops");
    if (!cJSON_IsObject(g)) {
        printf("  torch peer: the script failed (exit %d)\n", prc);
        cJSON_Delete(pj);
        return;
    }
    printf("  torch %s (same shapes, nn.functional.linear):\n  %-6s %6s %6s %10s %18s\n",
           cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(pj, "torch")), "dtype", "K", "N", "GFLOP/s",
           "difflet / torch");
    cJSON *jmm = cJSON_GetObjectItemCaseSensitive(root, "matmul"), *e;
    cJSON_ArrayForEach(e, jmm) {
        char key[64];
        snprintf(key, sizeof key, "%s %.0f %.0f", cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "dtype")),
                 cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(e, "k")),
                 cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(e, "n")));
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(g, key);
        if (!cJSON_IsNumber(p)) continue;
        double mine = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(e, "gflops"));
        printf("  %-18s %16.1f %18.2f\n", key, p->valuedouble, mine / p->valuedouble);
        cJSON_AddNumberToObject(e, "torch_gflops", p->valuedouble);
    }
    cJSON_AddStringToObject(root, "torch", cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(pj, "torch")));
    cJSON_Delete(pj);
}

int bench_opts(int argc, char **argv, const char *name, const char **json_path, int *quick, dl_dtype *dt) {
    if (dt) *dt = dl_dtype_default();
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--json") && i + 1 < argc) *json_path = argv[++i];
        else if (!strcmp(argv[i], "--quick")) *quick = 1;
        else if (dt && !strcmp(argv[i], "--dtype") && i + 1 < argc && (!strcmp(argv[i + 1], "f32") || !strcmp(argv[i + 1], "bf16")))
            *dt = !strcmp(argv[++i], "bf16") ? DL_BF16 : DL_F32;
        else {
            fprintf(stderr, "difflet: bench %s: unknown option '%s' (options: --json FILE, --quick%s)\n", name, argv[i],
                    dt ? ", --dtype f32|bf16" : "");
            return 0;
        }
    }
    return 1;
}

void bench_machine_json(cJSON *root) {
    cJSON_AddStringToObject(root, "cpu_model", dl_cpu_model());
    cJSON_AddStringToObject(root, "isa", dl_isa_name(dl_kernel_isa()));
    cJSON_AddStringToObject(root, "matmul_isa", dl_onednn_isa());
    cJSON_AddStringToObject(root, "onednn", dl_onednn_version());
    cJSON_AddStringToObject(root, "openblas", dl_openblas_version());
    const char *g = getenv("DIFFLET_GEMM");
    cJSON_AddStringToObject(root, "gemm_env", g ? g : "");
    cJSON_AddNumberToObject(root, "threads", dl_threads());
}

int cli_bench_kernels(int argc, char **argv) {
    const char *json_path = NULL;
    int quick = 0;
    if (!bench_opts(argc, argv, "kernels", &json_path, &quick, NULL)) return 2;
    const int reps = quick ? 1 : 3;
    const int64_t M = quick ? 512 : 4608;
    printf("difflet bench kernels: %s, kernels %s, matmul %s, %d threads, oneDNN %s%s\n", dl_cpu_model(),
           dl_isa_name(dl_kernel_isa()), dl_onednn_isa(), dl_threads(), dl_onednn_version(),
           quick ? " (quick: small shapes, 1 rep)" : "");
    cJSON *root = cJSON_CreateObject();
    bench_machine_json(root);
    cJSON *jmm = cJSON_AddArrayToObject(root, "matmul");

    /* ---- matmul ---- */
    static const int64_t kn[][2] = {{3072, 3072}, {3072, 9216}, {3072, 12288}, {12288, 3072}};
    double best_bf16 = 0.0, best_f32 = 0.0;
    printf("\nmatmul (difflet's: weights pre-packed by oneDNN; the products in the library named), M=%lld\n"
           "  %-6s %6s %6s %10s  %s\n", (long long)M, "dtype", "K", "N", "GFLOP/s", "library");
    int rc = 1;
    for (int di = 0; di < 2; di++) {
        dl_dtype dt = di ? DL_BF16 : DL_F32;
        for (size_t si = 0; si < sizeof kn / sizeof kn[0]; si++) {
            int64_t K = kn[si][0], N = kn[si][1];
            if (quick && si > 1) break;
            void *w = malloc((size_t)(K * N) * 2), *x = malloc((size_t)(M * K) * 4), *y = malloc((size_t)(M * N) * 4);
            if (!w || !x || !y) {
                fprintf(stderr, "difflet: bench: out of memory\n");
                free(w), free(x), free(y);
                goto out;
            }
            dl_fill_uniform(DL_BF16, w, K * N, -0.05f, 0.05f, 1);
            dl_fill_uniform(dt, x, M * K, -1.f, 1.f, 2);
            dl_matmul *mm;
            dl_matmul_desc d = {.m = M, .k = K, .n = N, .dt = dt, .dst_dt = dt};
            if (dl_matmul_new(&mm, &d, w, DL_BF16, NULL) != DL_OK) {
                fprintf(stderr, "difflet: bench: %s\n", dl_last_error());
                free(w), free(x), free(y);
                goto out;
            }
            double t;
            TIME_BEST(reps, t, dl_matmul_run(mm, x, y));
            double gf = 2.0 * (double)M * (double)K * (double)N / t * 1e-9;
            printf("  %-6s %6lld %6lld %10.1f  %s\n", dl_dtype_name(dt), (long long)K, (long long)N, gf, dl_gemm_name(mm));
            if (dt == DL_BF16 && gf > best_bf16) best_bf16 = gf;
            if (dt == DL_F32 && gf > best_f32) best_f32 = gf;
            cJSON *e = cJSON_CreateObject();
            cJSON_AddStringToObject(e, "dtype", dl_dtype_name(dt));
            cJSON_AddStringToObject(e, "library", dl_gemm_name(mm));
            cJSON_AddNumberToObject(e, "m", (double)M);
            cJSON_AddNumberToObject(e, "k", (double)K);
            cJSON_AddNumberToObject(e, "n", (double)N);
            cJSON_AddNumberToObject(e, "gflops", gf);
            cJSON_AddItemToArray(jmm, e);
            dl_matmul_free(mm);
            free(w), free(x), free(y);
        }
    }
    matmul_peer(root, M, reps, quick);
    cJSON_AddNumberToObject(root, "matmul_bf16_peak_gflops", best_bf16);
    cJSON_AddNumberToObject(root, "matmul_f32_peak_gflops", best_f32);

    /* ---- attention: bf16 against the bf16 matmul, f32 against the f32 matmul ---- */
    cJSON *jat = cJSON_AddArrayToObject(root, "attention");
    static const int64_t seqs[] = {1024, 4608};
    for (int di = 0; di < 2; di++) {
        dl_dtype adt = di ? DL_F32 : DL_BF16;
        size_t es = dl_dtype_size(adt);
        double peak = di ? best_f32 : best_bf16;
        for (int si = 0; si < 2; si++) {
            const int64_t S = quick ? seqs[si] / 4 : seqs[si], H = 24, D = 128;
            size_t n = (size_t)(S * H * D);
            void *q = malloc(n * es), *k = malloc(n * es), *v = malloc(n * es), *o = malloc(n * es);
            dl_attn_args a = {.dt = adt, .sq = S, .sk = S, .heads = H, .head_dim = D, .q = q, .k = k,
                              .v = v, .out = o, .kv_begin = 0, .kv_end = S, .scale = 1.f / sqrtf((float)D)};
            if (si == 0)
                printf("\nfused attention %s (%s kernel), H=24, D=128 (4*S^2*D*H flops)\n  %6s %10s %16s\n",
                       dl_dtype_name(adt), dl_attn_path_name(&a), "S", "GFLOP/s", di ? "x f32 matmul" : "x bf16 matmul");
            void *scratch = dl_aligned_alloc(dl_attn_scratch_bytes(&a, dl_threads()) + 64);
            if (!q || !k || !v || !o || !scratch) {
                fprintf(stderr, "difflet: bench: out of memory\n");
                free(q), free(k), free(v), free(o), dl_aligned_free(scratch);
                goto out;
            }
            dl_fill_uniform(adt, q, (int64_t)n, -1.f, 1.f, 3);
            dl_fill_uniform(adt, k, (int64_t)n, -1.f, 1.f, 4);
            dl_fill_uniform(adt, v, (int64_t)n, -1.f, 1.f, 5);
            attn_task at = {&a, scratch};
            double t;
            TIME_BEST(reps, t, dl_parallel(attn_fn, &at));
            double gf = 4.0 * (double)S * (double)S * (double)D * (double)H / t * 1e-9;
            double ratio = peak > 0 ? gf / peak : 0;
            printf("  %6lld %10.1f %16.2f\n", (long long)S, gf, ratio);
            cJSON *e = cJSON_CreateObject();
            cJSON_AddStringToObject(e, "dtype", dl_dtype_name(adt));
            cJSON_AddStringToObject(e, "path", dl_attn_path_name(&a));
            cJSON_AddNumberToObject(e, "seq", (double)S);
            cJSON_AddNumberToObject(e, "gflops", gf);
            cJSON_AddNumberToObject(e, di ? "ratio_to_matmul_f32" : "ratio_to_matmul_bf16", ratio);
            cJSON_AddItemToArray(jat, e);
            free(q), free(k), free(v), free(o), dl_aligned_free(scratch);
        }
    }

    if (!bench_attn_opensora(jat, reps, quick, best_bf16, best_f32)) goto out;

    /* ---- element-wise ---- */
    {
        const int64_t rows = quick ? 512 : 4608, cols = 3072, n = rows * cols;
        /* the activations aligned as a program's arena aligns them (DL_ALIGN) */
        void *x = dl_aligned_alloc((size_t)n * 2), *y = dl_aligned_alloc((size_t)n * 4);
        void *c1 = dl_aligned_alloc((size_t)n * 2), *c2 = dl_aligned_alloc((size_t)n * 2);
        float *v1 = malloc((size_t)cols * 4), *v2 = malloc((size_t)cols * 4);
        float *cs = malloc((size_t)rows * 64 * 4), *sn = malloc((size_t)rows * 64 * 4);
        if (!x || !y || !c1 || !c2 || !v1 || !v2 || !cs || !sn) {
            fprintf(stderr, "difflet: bench: out of memory\n");
            dl_aligned_free(x), dl_aligned_free(y), dl_aligned_free(c1), dl_aligned_free(c2);
            free(v1), free(v2), free(cs), free(sn);
            goto out;
        }
        dl_fill_uniform(DL_BF16, x, n, -2.f, 2.f, 6);
        dl_fill_uniform(DL_BF16, y, n, -2.f, 2.f, 7);
        dl_fill_uniform(DL_F32, v1, cols, -0.5f, 0.5f, 8);
        dl_fill_uniform(DL_F32, v2, cols, -0.5f, 0.5f, 9);
        dl_fill_uniform(DL_F32, cs, rows * 64, -1.f, 1.f, 10);
        dl_fill_uniform(DL_F32, sn, rows * 64, -1.f, 1.f, 11);
        memset(c2, 1, (size_t)n * 2);
        copy_task ct = {c2, c1, (size_t)n * 2};
        double tc;
        TIME_BEST(reps + 2, tc, dl_parallel(copy_fn, &ct));
        double copy_gbs = 2.0 * (double)n * 2 / tc * 1e-9;
        printf("\nelement-wise, bf16 [%lld, %lld] (memcpy of the same bytes: %.1f GB/s read+write)\n  %-20s %8s %12s\n",
               (long long)rows, (long long)cols, copy_gbs, "op", "GB/s", "x memcpy");
        cJSON_AddNumberToObject(root, "memcpy_gbs", copy_gbs);
        cJSON *jel = cJSON_AddArrayToObject(root, "elementwise");
        for (int op = 0; op < E_COUNT; op++) {
            elem_task et = {op, rows, cols, x, y, v1, v2, cs, sn};
            double t;
            TIME_BEST(reps + 2, t, dl_parallel(elem_fn, &et));
            double gbs = elem_bytes[op] * (double)n / t * 1e-9;
            printf("  %-20s %8.1f %12.2f\n", elem_names[op], gbs, gbs / copy_gbs);
            cJSON *e = cJSON_CreateObject();
            cJSON_AddStringToObject(e, "op", elem_names[op]);
            cJSON_AddNumberToObject(e, "gbs", gbs);
            cJSON_AddNumberToObject(e, "ratio_to_memcpy", gbs / copy_gbs);
            cJSON_AddItemToArray(jel, e);
        }
        dl_aligned_free(x), dl_aligned_free(y), dl_aligned_free(c1), dl_aligned_free(c2);
        free(v1), free(v2), free(cs), free(sn);
    }
    rc = 0;
    if (json_path) {
        char *txt = cJSON_Print(root);
        if (!txt || dl_file_write_atomic(json_path, txt, strlen(txt)) != DL_OK) {
            fprintf(stderr, "difflet: bench: cannot write %s: %s\n", json_path, dl_last_error());
            rc = 1;
        } else {
            printf("\nwrote %s\n", json_path);
        }
        free(txt);
    }
out:
    cJSON_Delete(root);
    return rc;
}
