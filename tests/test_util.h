/* Minimal test harness: CHECK counts, a failure prints file:line and a message,
 * and test_done() prints the closing "N passed, M failed" line and the exit code.
 * Also what the parity tests share: the measures (test_rel_err, test_row_err,
 * test_psnr), reading a reference vector (test_vec), a progress callback's record
 * (test_progress), and fixture writers (test_write_text, test_write_folder,
 * test_write_renamed). */
#ifndef DIFFLET_TEST_UTIL_H
#define DIFFLET_TEST_UTIL_H

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "difflet/io.h"
#include "difflet/kernels.h"

/* where the test data and the sources are (CMake passes both) */
#ifndef DATA_DIR
#define DATA_DIR "tests/data"
#endif
#ifndef SOURCE_DIR
#define SOURCE_DIR "."
#endif

static int g_pass, g_fail;

#define CHECK(cond, ...)                                                  \
    do {                                                                  \
        if (cond) {                                                       \
            g_pass++;                                                     \
        } else {                                                          \
            g_fail++;                                                     \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                 \
            fprintf(stderr, "\n");                                        \
        }                                                                 \
    } while (0)

/* The worst row's max |got - want| over that row's max |want| (rows x D, row-major;
 * INFINITY when got holds a non-finite value): the parity tests' per-row bound. */
static inline double test_row_err(const float *got, const float *want, long long rows, long long D) {
    double worst = 0;
    for (long long r = 0; r < rows; r++) {
        double mx = 0, e = 0;
        for (long long j = 0; j < D; j++) {
            double g = got[r * D + j], w = want[r * D + j];
            if (!(g - g == 0)) return 1.0 / 0.0;
            mx = w > mx ? w : -w > mx ? -w : mx;
            e = g - w > e ? g - w : w - g > e ? w - g : e;
        }
        e /= mx > 0 ? mx : 1;
        worst = e > worst ? e : worst;
    }
    return worst;
}

/* Tensor `name` of checkpoint ck (a reference-vectors file) read as f32 into a
 * malloc'd buffer the caller frees; *numel its element count and shape[0..ndim) its
 * dimensions (either may be NULL; shape holds DL_ST_MAX_DIMS). NULL (*numel 0), with a
 * line on stderr, when ck is NULL or has no such tensor, or on a failed read. */
static inline float *test_vec(const dl_checkpoint *ck, const char *name, int64_t *numel, int64_t *shape) {
    const dl_st_tensor *t = ck ? dl_ckpt_find(ck, name) : NULL;
    float *p = t ? malloc((size_t)t->numel * sizeof *p) : NULL;
    if (!p || dl_ckpt_read(t, DL_F32, p) != DL_OK) {
        fprintf(stderr, "no vector %s\n", name);
        free(p);
        if (numel) *numel = 0;
        return NULL;
    }
    if (numel) *numel = t->numel;
    if (shape) memcpy(shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
    return p;
}

/* max |got - want| over max |want| (over 1 when want is all zeros), over all n
 * values; INFINITY when got holds a non-finite value: the parity tests' bound. */
static inline double test_rel_err(const float *got, const float *want, int64_t n) {
    double mx = 0, e = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) return INFINITY;
        mx = fmax(mx, fabs(want[i]));
        e = fmax(e, fabs((double)got[i] - want[i]));
    }
    return e / (mx > 0 ? mx : 1);
}

/* PSNR in dB of a against b (n values) for signals of peak-to-peak `range` (1 for
 * pictures in [0, 1], 2 for video in [-1, 1]): 10 log10(range^2 / mean squared
 * error); INFINITY when they are equal, NaN when either holds a NaN. */
static inline double test_psnr(const float *a, const float *b, int64_t n, double range) {
    double se = 0;
    for (int64_t i = 0; i < n; i++) se += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    double mse = se / (double)n;
    return mse == 0 ? INFINITY : 10.0 * log10(range * range / mse);
}

/* What a progress callback (done, total) saw: how many calls, the last done and
 * total, whether done ever failed to rise by exactly one (out_of_order) and whether
 * total ever changed (total_changed). Start from {0}; pass test_on_progress. */
typedef struct {
    int calls, last, total, out_of_order, total_changed;
} test_progress;

static inline void test_on_progress(void *ctx, int done, int total) {
    test_progress *p = ctx;
    p->out_of_order |= done != p->last + 1;
    p->total_changed |= p->total && total != p->total;
    p->calls++, p->last = done, p->total = total;
}

/* Makes dir a one-component model folder for a refusal test: model_index.json holding
 * `index`, dir/<comp>/config.json holding cfg and dir/<comp>/diffusion_pytorch_model.safetensors,
 * a link to the file `link_to` or, weights given, a file holding those nw bytes (a file
 * already there is replaced). 0 (a failed CHECK) when dir/<comp> cannot be made. */
static inline int test_write_folder(const char *dir, const char *index, const char *comp, const char *cfg,
                                    const char *link_to, const char *weights, size_t nw) {
    char p[512];
    snprintf(p, sizeof p, "%s/model_index.json", dir);
    FILE *f = fopen(p, "w");
    fputs(index, f);
    fclose(f);
    snprintf(p, sizeof p, "%s/%s", dir, comp);
    if (mkdir(p, 0755) != 0 && errno != EEXIST) {
        CHECK(0, "mkdir %s", p);
        return 0;
    }
    snprintf(p, sizeof p, "%s/%s/diffusion_pytorch_model.safetensors", dir, comp);
    unlink(p);
    if (weights) {
        f = fopen(p, "wb");
        CHECK(fwrite(weights, 1, nw, f) == nw, "write %s", p);
        fclose(f);
    } else {
        CHECK(symlink(link_to, p) == 0, "symlink %s", p);
    }
    snprintf(p, sizeof p, "%s/%s/config.json", dir, comp);
    f = fopen(p, "w");
    fputs(cfg, f);
    fclose(f);
    return 1;
}

/* txt written to path (atomically): a CHECK */
static inline void test_write_text(const char *path, const char *txt) {
    CHECK(dl_file_write_atomic(path, txt, strlen(txt)) == DL_OK, "%s", dl_last_error());
}

/* The tensors of the checkpoint at src written into folder dir as `shards` files:
 * model.safetensors (1), or model-0000{1,2}-of-00002.safetensors taking the tensors
 * in turn plus model.safetensors.index.json (2). Each tensor goes under the name
 * rename(ctx, name, out, cap) writes, or is left out where it returns 0; `drop` (a
 * new name; may be NULL) is left out, `bad` (may be NULL) written with its first
 * dimension one short. Every write is a CHECK. */
static inline void test_write_renamed(const char *src, const char *dir, int shards,
                                      int (*rename)(void *ctx, const char *name, char *out, size_t cap), void *ctx,
                                      const char *drop, const char *bad) {
    char path[1024], nm[256];
    dl_checkpoint *ck;
    if (dl_ckpt_open(&ck, src, NULL) != DL_OK) {
        CHECK(0, "%s", dl_last_error());
        return;
    }
    dl_st_writer *w[2] = {dl_st_writer_new(), dl_st_writer_new()};
    const int nt = dl_ckpt_count(ck);
    char **names = calloc((size_t)nt, sizeof *names);
    size_t cap = 1 << 16, len = 0;
    char *idx = malloc(cap);
    len += (size_t)snprintf(idx, cap, "{\"metadata\": {}, \"weight_map\": {");
    for (int i = 0, k = 0; i < nt; i++) {
        const dl_st_tensor *t = dl_ckpt_at(ck, i);
        if (!rename(ctx, t->name, nm, sizeof nm) || (drop && !strcmp(nm, drop))) continue;
        int64_t shape[DL_ST_MAX_DIMS];
        memcpy(shape, t->shape, sizeof shape);
        if (bad && !strcmp(nm, bad)) shape[0]--;
        names[i] = strdup(nm);
        CHECK(dl_st_writer_add(w[k % shards], names[i], t->dtype, t->ndim, shape, t->data) == DL_OK, "%s",
              dl_last_error());
        len += (size_t)snprintf(idx + len, cap - len, "%s\"%s\": \"model-0000%d-of-00002.safetensors\"", k ? ", " : "",
                                names[i], k % 2 + 1);
        k++;
    }
    snprintf(idx + len, cap - len, "}}");
    CHECK(len < cap - 4, "index too long");
    for (int s = 0; s < shards; s++) {
        if (shards == 1) snprintf(path, sizeof path, "%s/model.safetensors", dir);
        else snprintf(path, sizeof path, "%s/model-0000%d-of-00002.safetensors", dir, s + 1);
        CHECK(dl_st_writer_save(w[s], path) == DL_OK, "%s", dl_last_error());
    }
    dl_st_writer_free(w[0]), dl_st_writer_free(w[1]);
    if (shards == 2) {
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
        test_write_text(path, idx);
    }
    for (int i = 0; i < nt; i++) free(names[i]);
    free(names), free(idx);
    dl_ckpt_free(ck);
}

/* an activation in double, from its definition */
static inline double test_act(dl_act a, double v) {
    switch (a) {
    case DL_ACT_GELU_TANH: return 0.5 * v * (1 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
    case DL_ACT_GELU_ERF: return 0.5 * v * (1 + erf(v / sqrt(2.0)));
    case DL_ACT_SILU: return v / (1 + exp(-v));
    case DL_ACT_QUICK_GELU: return v / (1 + exp(-1.702 * v));
    case DL_ACT_RELU: return v > 0 ? v : 0;
    default: return v;
    }
}

static inline int test_done(const char *name) {
    printf("%s: %d passed, %d failed\n", name, g_pass, g_fail);
    return g_fail ? 1 : 0;
}

#endif
