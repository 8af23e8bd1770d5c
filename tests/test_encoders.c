/* Text encoders against transformers: tiny random-weight CLIPTextModel (token-id
 * EOS pooling; legacy argmax pooling with `text_model.`-prefixed names) and
 * T5EncoderModel (gated-gelu; relu), on 4 prompts including a 512-token T5 input
 * that reaches the far position buckets. Every hidden state is compared, so a
 * failure names the first layer that diverged.
 * Bounds: f32 max|err| <= 1e-4 * max|ref| per hidden state; bf16 (weights and matmul
 * inputs rounded to bf16, residual stream f32) max|err| <= 2^-6 * max|ref|: each of
 * the few layers adds a few bf16 roundings (2^-9 relative each) of its inputs. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "difflet/models.h"
#include "test_util.h"

static dl_checkpoint *g_vec;

static float *vec(const char *name, int64_t *numel) {
    const dl_st_tensor *t = dl_ckpt_find(g_vec, name);
    if (!t) return NULL;
    float *p = malloc((size_t)t->numel * 4);
    dl_ckpt_read(t, DL_F32, p);
    if (numel) *numel = t->numel;
    return p;
}

/* worst |err| / max|ref| */
static double rel_err(const float *got, const float *want, int64_t n) {
    double mx = 0, e = 0;
    for (int64_t i = 0; i < n; i++) {
        mx = fmax(mx, fabs(want[i]));
        e = fmax(e, fabs((double)got[i] - want[i]));
        if (isnan(got[i])) return INFINITY;
    }
    return e / (mx > 0 ? mx : 1);
}

static void check_states(const char *key, const float *all, int nstates, int64_t sd, dl_dtype dt) {
    double bound = dt == DL_F32 ? 1e-4 : 1.0 / 64;
    char name[128];
    for (int k = 0; k < nstates; k++) {
        snprintf(name, sizeof name, "%s.h%d", key, k);
        float *want = vec(name, NULL);
        if (!want) {
            CHECK(0, "no vector %s", name);
            return;
        }
        double e = rel_err(all + (size_t)k * (size_t)sd, want, sd);
        free(want);
        if (getenv("DIFFLET_TEST_VERBOSE")) printf("%s %s h%d: %.3g\n", key, dl_dtype_name(dt), k, e);
        CHECK(e <= bound, "%s %s: hidden state %d (0 = embeddings) differs: %.3g of max|ref| (bound %.3g)", key,
              dl_dtype_name(dt), k, e, bound);
        if (e > bound) return; /* later states follow from this one */
    }
}

static int32_t *ids_of(const char *key, int64_t *n) {
    char name[128];
    snprintf(name, sizeof name, "%s.ids", key);
    float *f = vec(name, n);
    int32_t *ids = malloc((size_t)*n * sizeof *ids);
    for (int64_t i = 0; i < *n; i++) ids[i] = (int32_t)f[i];
    free(f);
    return ids;
}

static void test_clip(dl_model_dir *dir, const char *comp, dl_dtype dt) {
    dl_clip_text *m;
    if (dl_clip_text_load(&m, dir, comp, 77, dt, NULL) != DL_OK) {
        CHECK(0, "load %s: %s", comp, dl_last_error());
        return;
    }
    int64_t D = dl_clip_text_width(m), L = dl_clip_text_layers(m);
    for (int p = 0; p < 4; p++) {
        char key[64], name[128];
        snprintf(key, sizeof key, "%s.p%d", comp, p);
        int64_t n;
        int32_t *ids = ids_of(key, &n);
        float *hidden = malloc((size_t)(n * D) * 4), *pooled = malloc((size_t)D * 4);
        float *all = malloc((size_t)((L + 1) * n * D) * 4);
        CHECK(dl_clip_text_run(m, ids, hidden, pooled, all) == DL_OK, "%s", dl_last_error());
        check_states(key, all, (int)L + 1, n * D, dt);
        double bound = dt == DL_F32 ? 1e-4 : 1.0 / 64;
        snprintf(name, sizeof name, "%s.last", key);
        float *want = vec(name, NULL);
        double e = rel_err(hidden, want, n * D);
        CHECK(e <= bound, "%s %s last_hidden_state: %.3g", key, dl_dtype_name(dt), e);
        free(want);
        snprintf(name, sizeof name, "%s.pooled", key);
        want = vec(name, NULL);
        e = rel_err(pooled, want, D);
        CHECK(e <= bound, "%s %s pooled: %.3g", key, dl_dtype_name(dt), e);
        free(want), free(ids), free(hidden), free(pooled), free(all);
    }
    dl_clip_text_free(m);
}

static void test_t5(dl_model_dir *dir, const char *comp, dl_dtype dt) {
    for (int p = 0; p < 4; p++) {
        char key[64];
        snprintf(key, sizeof key, "%s.p%d", comp, p);
        int64_t n;
        int32_t *ids = ids_of(key, &n);
        dl_t5_encoder *m;
        if (dl_t5_encoder_load(&m, dir, comp, n, dt, NULL) != DL_OK) {
            CHECK(0, "load %s: %s", comp, dl_last_error());
            free(ids);
            return;
        }
        int64_t D = dl_t5_encoder_width(m), L = dl_t5_encoder_layers(m);
        float *hidden = malloc((size_t)(n * D) * 4), *all = malloc((size_t)((L + 1) * n * D) * 4);
        CHECK(dl_t5_encoder_run(m, ids, hidden, all) == DL_OK, "%s", dl_last_error());
        check_states(key, all, (int)L + 1, n * D, dt);
        free(ids), free(hidden), free(all);
        dl_t5_encoder_free(m);
    }
}

/* transformers' _relative_position_bucket (bidirectional, 32 buckets, max distance
 * 128) for every relative position in -2000..2000, from t5_buckets.txt */
static void test_buckets(void) {
    char *txt;
    size_t len;
    if (dl_file_read(DATA_DIR "/enc/t5_buckets.txt", 1 << 20, &txt, &len) != DL_OK) {
        CHECK(0, "%s", dl_last_error());
        return;
    }
    int bad = 0, n = 0;
    char *p = txt;
    for (int64_t rel = -2000; rel <= 2000; rel++, n++) {
        long want = strtol(p, &p, 10);
        if (dl_t5_bucket(rel, 1, 32, 128) != want && bad++ < 5)
            fprintf(stderr, "bucket(%lld) = %d, transformers %ld\n", (long long)rel, dl_t5_bucket(rel, 1, 32, 128), want);
    }
    CHECK(bad == 0 && n == 4001, "%d of %d relative positions bucketed differently", bad, n);
    free(txt);
}

static void test_errors(dl_model_dir *dir) {
    dl_clip_text *m;
    CHECK(dl_clip_text_load(&m, dir, "clip", 78, DL_F32, NULL) == DL_ERR_INVALID && strstr(dl_last_error(), "max_position"),
          "sequence past max_position_embeddings: %s", dl_last_error());
    CHECK(dl_clip_text_load(&m, dir, "nothing", 77, DL_F32, NULL) != DL_OK, "missing component");
    if (dl_clip_text_load(&m, dir, "clip", 77, DL_F32, NULL) == DL_OK) {
        int32_t ids[77] = {0};
        ids[5] = 1 << 20;
        float h[77 * 64];
        CHECK(dl_clip_text_run(m, ids, h, NULL, NULL) == DL_ERR_INVALID && strstr(dl_last_error(), "position 5"),
              "token id outside the vocabulary: %s", dl_last_error());
        dl_clip_text_free(m);
    }
}

int main(void) {
    if (dl_ckpt_open(&g_vec, DATA_DIR "/enc/vectors.safetensors", "vectors") != DL_OK) {
        fprintf(stderr, "%s\n", dl_last_error());
        return 1;
    }
    dl_model_dir *dir;
    if (dl_model_dir_open(&dir, DATA_DIR "/enc") != DL_OK) {
        fprintf(stderr, "%s\n", dl_last_error());
        return 1;
    }
    test_buckets();
    for (int d = 0; d < 2; d++) {
        dl_dtype dt = d ? DL_BF16 : DL_F32;
        test_clip(dir, "clip", dt);
        test_clip(dir, "clip_legacy", dt);
        test_t5(dir, "t5", dt);
        test_t5(dir, "t5_relu", dt);
        test_t5(dir, "t5_silu", dt); /* feed_forward_proj "gated-silu" */
    }
    test_errors(dir);
    dl_model_dir_free(dir);
    dl_ckpt_free(g_vec);
    return test_done("test_encoders");
}
