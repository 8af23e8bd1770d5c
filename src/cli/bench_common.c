/* What the model benchmarks (bench_wan.c, bench_qwen.c, bench_hunyuan.c) share: the
 * random-weight folder they write, a standalone joint-attention timing, the process's
 * memory, a same-run matmul peak (the engine's own matmul: OpenBLAS or oneDNN), the diffusers peer in the tools virtualenv,
 * and the agreement of two outputs. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "difflet/check.h"
#include "difflet/kernels.h"

#ifndef DIFFLET_SOURCE_DIR
#define DIFFLET_SOURCE_DIR "."
#endif

void bench_rss_mib(double *cur, double *peak) {
    *cur = *peak = NAN;
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    while (f && fgets(line, sizeof line, f)) {
        if (!strncmp(line, "VmRSS:", 6)) *cur = atof(line + 6) / 1024.0;
        if (!strncmp(line, "VmHWM:", 6)) *peak = atof(line + 6) / 1024.0;
    }
    if (f) fclose(f);
}

int bench_rss_reset(void) {
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f) return 0;
    int ok = fputs("5", f) >= 0;
    return fclose(f) == 0 && ok;
}

double bench_matmul_peak(dl_dtype dt, int64_t M, int64_t K, int64_t Nn) {
    return bench_matmul_rate(dt, DL_QUANT_NONE, M, K, Nn);
}

static char g_mm_label[64] = "matmul";

const char *bench_matmul_label(void) { return g_mm_label; }

double bench_matmul_rate(dl_dtype dt, dl_quant quant, int64_t M, int64_t K, int64_t Nn) {
    const size_t es = dl_dtype_size(dt);
    void *w = malloc((size_t)(K * Nn) * es), *x = malloc((size_t)(M * K) * es), *y = malloc((size_t)(M * Nn) * es);
    double tb = INFINITY;
    dl_matmul *mm;
    dl_matmul_desc d = {.m = M, .k = K, .n = Nn, .dt = dt, .dst_dt = dt, .quant = quant};
    snprintf(g_mm_label, sizeof g_mm_label, "(failed) %s", dl_dtype_name(dt));
    if (w && x && y) {
        dl_fill_uniform(dt, w, K * Nn, -0.05f, 0.05f, 9);
        dl_fill_uniform(dt, x, M * K, -1.f, 1.f, 10);
        if (dl_matmul_new(&mm, &d, w, dt, NULL) == DL_OK) {
            snprintf(g_mm_label, sizeof g_mm_label, "%s %s", dl_gemm_name(mm), dl_dtype_name(dt));
            for (int i = 0; i < 3; i++) {
                double t = dl_now();
                dl_matmul_run(mm, x, y);
                if (i && dl_now() - t < tb) tb = dl_now() - t;
            }
            dl_matmul_free(mm);
        }
    }
    free(w), free(x), free(y);
    return 2.0 * (double)M * (double)K * (double)Nn / tb * 1e-9;
}

cJSON *bench_run_peer(const char *script, const char *dir, int reps, int warm, dl_dtype dt) {
    const char *py = DIFFLET_SOURCE_DIR "/tools/venv/bin/python";
    char cmd[8192], line[4096] = "";
    const char *env = getenv("DIFFLET_BENCH_PEER");
    if (env && !strcmp(env, "off")) {
        printf("  diffusers: not measured (DIFFLET_BENCH_PEER=off)\n");
        return NULL;
    }
    if (access(py, X_OK) != 0) {
        printf("  diffusers: not measured (no %s: run `make tools-venv`)\n", py);
        return NULL;
    }
    snprintf(cmd, sizeof cmd, "%s %s/tools/bench/%s %s %s/inputs.safetensors %s/peer_out.safetensors %d %d %s %d", py,
             DIFFLET_SOURCE_DIR, script, dir, dir, dir, dl_threads(), reps, dl_dtype_name(dt), warm);
    fflush(stdout);
    FILE *f = popen(cmd, "r");
    while (f && fgets(line, sizeof line, f))
        if (line[0] == '{') break;
    int prc = f ? pclose(f) : -1;
    cJSON *pj = prc == 0 ? cJSON_Parse(line) : NULL;
    if (!cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(pj, "step_s"))) {
        printf("  diffusers: not measured: the peer script failed (exit %d)\n", prc);
        cJSON_Delete(pj);
        return NULL;
    }
    return pj;
}

double bench_rel_diff(const char *path, const float *a, int64_t n) {
    dl_checkpoint *ck;
    double rel = NAN;
    if (dl_ckpt_open(&ck, path, NULL) != DL_OK) return rel;
    const dl_st_tensor *t = dl_ckpt_find(ck, "out");
    float *b = t && t->numel == n ? malloc((size_t)n * 4) : NULL;
    if (b && dl_ckpt_read(t, DL_F32, b) == DL_OK) {
        double e = 0, mx = 0;
        for (int64_t i = 0; i < n; i++) {
            e = fmax(e, fabs((double)a[i] - b[i]));
            mx = fmax(mx, fabs((double)b[i]));
        }
        rel = e / mx;
    }
    free(b);
    dl_ckpt_free(ck);
    return rel;
}

/* ---- the random-weight folder ----------------------------------------------------- */

void bench_wgen_init(bench_wgen *g, uint64_t seed) {
    *g = (bench_wgen){.w = dl_st_writer_new(), .seed = seed};
    if (!g->w) g->s = dl_fail(DL_ERR_NOMEM, "out of memory");
}

dl_status bench_wgen_save(bench_wgen *g, const char *path) {
    if (g->s == DL_OK) g->s = dl_st_writer_save(g->w, path);
    dl_st_writer_free(g->w);
    for (int i = 0; i < g->n; i++) free(g->keep[i]);
    free(g->keep);
    g->w = NULL, g->keep = NULL, g->n = g->cap = 0;
    return g->s;
}

/* U(+-sc) bf16 [shape], plus 1 when `one`, from the next seed */
/* a buffer of [shape] elements of `es` bytes that lives until the save (NULL: g->s says
 * why, or an earlier failure); *n its element count */
static void *keep_new(bench_wgen *g, int nd, const int64_t *shape, size_t es, int64_t *n) {
    if (g->s != DL_OK) return NULL;
    *n = 1;
    for (int i = 0; i < nd; i++) *n *= shape[i];
    if (g->n == g->cap) {
        void **k = realloc(g->keep, (size_t)(g->cap = g->cap ? 2 * g->cap : 64) * sizeof *k);
        if (!k) {
            g->s = dl_fail(DL_ERR_NOMEM, "out of memory");
            return NULL;
        }
        g->keep = k;
    }
    void *p = malloc((size_t)*n * es);
    if (!p) g->s = dl_fail(DL_ERR_NOMEM, "out of memory");
    else g->keep[g->n++] = p;
    return p;
}

static void put_scaled(bench_wgen *g, const char *name, int nd, const int64_t *shape, float sc, int one) {
    int64_t n;
    uint16_t *p = keep_new(g, nd, shape, 2, &n);
    if (!p) return;
    dl_fill_uniform(DL_BF16, p, n, -sc, sc, g->seed++);
    if (one)
        for (int64_t i = 0; i < n; i++) p[i] = dl_f32_to_bf16(1.f + dl_bf16_to_f32(p[i]));
    g->s = dl_st_writer_add(g->w, name, DL_ST_BF16, nd, shape, p);
}

void bench_put(bench_wgen *g, const char *name, int nd, const int64_t *shape) {
    int64_t fan = 1;
    for (int i = 1; i < nd; i++) fan *= shape[i];
    const size_t nl = strlen(name);
    const int gamma = nd == 1 && nl > 7 && !strcmp(name + nl - 7, ".weight");
    put_scaled(g, name, nd, shape, nd > 1 ? 1.f / sqrtf((float)fan) : 0.1f, gamma);
}

void bench_put_gamma(bench_wgen *g, const char *name, int nd, const int64_t *shape) {
    put_scaled(g, name, nd, shape, 0.1f, 1);
}

void bench_put_wb(bench_wgen *g, const char *prefix, const char *base, int nd, const int64_t *shape) {
    char nm[320];
    snprintf(nm, sizeof nm, "%s%s.weight", prefix, base);
    bench_put(g, nm, nd, shape);
    snprintf(nm, sizeof nm, "%s%s.bias", prefix, base);
    bench_put(g, nm, 1, shape);
}

void bench_put_lin(bench_wgen *g, const char *prefix, const char *base, int64_t out, int64_t in) {
    const int64_t sh[2] = {out, in};
    bench_put_wb(g, prefix, base, 2, sh);
}

void bench_put_vec(bench_wgen *g, const char *prefix, const char *base, int64_t n) {
    char nm[320];
    snprintf(nm, sizeof nm, "%s%s", prefix, base);
    bench_put(g, nm, 1, &n);
}

void bench_put_f32(bench_wgen *g, const char *name, int nd, const int64_t *shape, const float *v) {
    int64_t n;
    float *p = keep_new(g, nd, shape, 4, &n);
    if (!p) return;
    memcpy(p, v, (size_t)n * 4);
    g->s = dl_st_writer_add(g->w, name, DL_ST_F32, nd, shape, p);
}

dl_status bench_write_text(const char *path, const char *text) {
    return dl_file_write_atomic(path, text, strlen(text));
}

/* ---- a standalone joint attention -------------------------------------------------- */

typedef struct {
    const dl_attn_partial *parts;
    int64_t sq, heads, dh;
    dl_dtype dt;
    void *out;
    int64_t os;
} merge_ctx;

static void merge_task(void *ctx, int ith, int nth) {
    const merge_ctx *m = ctx;
    dl_attn_merge_t(m->parts, 2, m->sq, m->heads, m->dh, m->dt, m->out, m->os, NULL, NULL, NULL, ith, nth);
}

double bench_joint_attn_seconds(int64_t T, int64_t L, int64_t N, int64_t heads, int64_t head_dim, dl_dtype dt) {
    const int64_t D = heads * head_dim, S = T + N; /* qkv: [S, 3D]; out: [S, D] */
    const size_t es = dl_dtype_size(dt);
    void *qkv = malloc((size_t)(S * 3 * D) * es), *out = malloc((size_t)(S * D) * es);
    float *o[2] = {malloc((size_t)(S * D) * 4), malloc((size_t)(S * D) * 4)};
    float *ml = malloc((size_t)(4 * heads * S) * 4); /* each partial's m, l: [heads, S] */
    double best = NAN;
    if (qkv && out && o[0] && o[1] && ml) {
        dl_fill_uniform(dt, qkv, S * 3 * D, -1.f, 1.f, 11);
        const char *q = qkv, *k = q + (size_t)D * es, *v = q + (size_t)(2 * D) * es;
        const float scale = 1.f / sqrtf((float)head_dim);
        dl_attn_partial parts[2];
        dl_attn_args a[2];
        if (L == T) {
            a[0] = (dl_attn_args){.dt = dt, .sq = S, .sk = S, .heads = heads, .head_dim = head_dim, .q = q, .k = k,
                                  .v = v, .q_stride = 3 * D, .k_stride = 3 * D, .v_stride = 3 * D, .out = out,
                                  .out_stride = D, .kv_begin = 0, .kv_end = S, .scale = scale};
        } else {
            for (int p = 0; p < 2; p++) { /* p 0: the text keys (L of the first T), 1: the N image keys */
                float *m = ml + (size_t)(2 * p) * (size_t)(heads * S), *l = m + heads * S;
                const size_t off = p ? (size_t)(T * 3 * D) * es : 0;
                a[p] = (dl_attn_args){.dt = dt, .sq = S, .sk = p ? N : T + N, .heads = heads, .head_dim = head_dim,
                                      .q = q, .k = k + off, .v = v + off, .q_stride = 3 * D, .k_stride = 3 * D,
                                      .v_stride = 3 * D, .kv_begin = 0, .kv_end = p ? N : L, .scale = scale,
                                      .o_part = o[p], .m = m, .l = l};
                parts[p] = (dl_attn_partial){o[p], m, l};
            }
        }
        merge_ctx mc = {parts, S, heads, head_dim, dt, out, D};
        best = INFINITY;
        for (int i = 0; i < 2; i++) {
            double t0 = dl_now();
            if (dl_attn(&a[0], NULL) != DL_OK || (L != T && dl_attn(&a[1], NULL) != DL_OK)) {
                best = NAN;
                break;
            }
            if (L != T) dl_parallel(merge_task, &mc);
            if (dl_now() - t0 < best) best = dl_now() - t0;
        }
    }
    free(qkv), free(out), free(o[0]), free(o[1]), free(ml);
    return best;
}

dl_status bench_write_json(const cJSON *root, const char *path) {
    char *t = cJSON_Print(root);
    dl_status s = t ? dl_file_write_atomic(path, t, strlen(t)) : dl_fail(DL_ERR_NOMEM, "out of memory");
    free(t);
    return s;
}

void bench_remove_dir(const char *dir) {
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "difflet: bench: could not remove %s\n", dir);
}
