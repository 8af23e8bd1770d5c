/* Text encoders against transformers: tiny random-weight CLIPTextModel (token-id
 * EOS pooling; legacy argmax pooling with `text_model.`-prefixed names) and
 * T5EncoderModel (gated-gelu; relu), on 4 prompts including a 512-token T5 input
 * that reaches the far position buckets; UMT5EncoderModel (Wan 2.1's: a bias per
 * layer) and T5 with an attention mask (padding to max_length), every row compared
 * including the padded ones (make_umt5_vectors.py). Every hidden state is compared,
 * so a failure names the first layer that diverged.
 * Bounds: f32 max|err| <= 1e-4 * max|ref| per hidden state; bf16 (weights and matmul
 * inputs rounded to bf16, residual stream f32) max|err| <= 2^-6 * max|ref|: each of
 * the few layers adds a few bf16 roundings (2^-9 relative each) of its inputs. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "difflet/models.h"
#include "test_util.h"

static dl_checkpoint *g_vec, *g_umt5; /* enc/vectors, enc/umt5_vectors (names distinct) */

/* `name` from the vectors file, else from the UMT5 one */
static float *vec(const char *name, int64_t *numel) {
    return test_vec(g_umt5 && !dl_ckpt_find(g_vec, name) ? g_umt5 : g_vec, name, numel, NULL);
}

/* Compares every hidden state within `bound`; returns the worst relative error seen. */
static double check_states_within(const char *key, const float *all, int nstates, int64_t sd, dl_dtype dt, double bound) {
    double worst = 0;
    char name[128];
    for (int k = 0; k < nstates; k++) {
        snprintf(name, sizeof name, "%s.h%d", key, k);
        float *want = vec(name, NULL);
        if (!want) {
            CHECK(0, "no vector %s", name);
            return INFINITY;
        }
        double e = test_rel_err(all + (size_t)k * (size_t)sd, want, sd);
        free(want);
        worst = fmax(worst, e);
        if (getenv("DIFFLET_TEST_VERBOSE")) printf("%s %s h%d: %.3g\n", key, dl_dtype_name(dt), k, e);
        CHECK(e <= bound, "%s %s: hidden state %d (0 = embeddings) differs: %.3g of max|ref| (bound %.3g)", key,
              dl_dtype_name(dt), k, e, bound);
        if (e > bound) return worst; /* later states follow from this one */
    }
    return worst;
}

static double check_states(const char *key, const float *all, int nstates, int64_t sd, dl_dtype dt) {
    return check_states_within(key, all, nstates, sd, dt, dt == DL_F32 ? 1e-4 : 1.0 / 64);
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
        double e = test_rel_err(hidden, want, n * D);
        CHECK(e <= bound, "%s %s last_hidden_state: %.3g", key, dl_dtype_name(dt), e);
        free(want);
        snprintf(name, sizeof name, "%s.pooled", key);
        want = vec(name, NULL);
        e = test_rel_err(pooled, want, D);
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

/* Padded prompts with transformers' attention_mask (make_umt5_vectors.py): cases
 * <prefix>.p0 .. p<n-1>, each with its valid-key count; every hidden state, all rows.
 * On the first case the mask must matter: run unmasked, the last state is off.
 * bf16: the tiny UMT5's unit-scale weights make sharp attention, and the bf16 scheme
 * itself (emulated in torch: <key>.bf16) lands up to 0.037 of max|ref| from the f32
 * reference; so bf16 is held to 2^-4 of the f32 reference and to the usual 2^-6 of
 * that emulation (the same roundings: what remains is summation order and the
 * kernel's bf16 probabilities). */
static void test_masked(dl_model_dir *dir, const char *comp, const char *prefix, int ncases, int umt5, dl_dtype dt) {
    double worst = 0, worst_emu = 0;
    for (int p = 0; p < ncases; p++) {
        char key[64], name[128];
        snprintf(key, sizeof key, "%s.p%d", prefix, p);
        snprintf(name, sizeof name, "%s.valid", key);
        int64_t n, one;
        int32_t *ids = ids_of(key, &n);
        float *vf = vec(name, &one);
        int64_t valid = (int64_t)vf[0];
        free(vf);
        dl_t5_encoder *m;
        if (dl_t5_encoder_load(&m, dir, comp, n, dt, NULL) != DL_OK) {
            CHECK(0, "load %s: %s", comp, dl_last_error());
            free(ids);
            return;
        }
        CHECK(dl_t5_encoder_is_umt5(m) == umt5, "%s: is_umt5 %d", comp, dl_t5_encoder_is_umt5(m));
        int64_t D = dl_t5_encoder_width(m), L = dl_t5_encoder_layers(m), sd = n * D;
        float *hidden = malloc((size_t)sd * 4), *all = malloc((size_t)((L + 1) * sd) * 4);
        CHECK(dl_t5_encoder_run_masked(m, ids, valid, hidden, all) == DL_OK, "%s", dl_last_error());
        CHECK(!memcmp(hidden, all + (size_t)L * (size_t)sd, (size_t)sd * 4), "%s: hidden is the last state", key);
        worst = fmax(worst, check_states_within(key, all, (int)L + 1, sd, dt,
                                                dt == DL_F32 ? 1e-4 : umt5 ? 1.0 / 16 : 1.0 / 64));
        /* the emulation keeps the probabilities in f32 as the reference attention does;
         * the fast paths (now also for UMT5's head dim 8) round them to bf16 before P.V,
         * which the emulation does not model: there the 2^-4 bound above is the check */
        dl_attn_args probe = {.dt = DL_BF16, .sq = n, .sk = n, .heads = 1, .head_dim = dl_t5_encoder_head_dim(m)};
        const int emu_models_path = !umt5 || !strcmp(dl_attn_path_name(&probe), "reference");
        if (dt == DL_BF16 && !emu_models_path)
            printf("%s bf16: the torch emulation models the reference attention, not the %s kernel's bf16 "
                   "probabilities: held to the f32 reference only\n", key, dl_attn_path_name(&probe));
        if (dt == DL_BF16 && emu_models_path) {
            snprintf(name, sizeof name, "%s.bf16", key);
            float *emu = vec(name, NULL);
            double e = emu ? test_rel_err(hidden, emu, sd) : INFINITY;
            worst_emu = fmax(worst_emu, e);
            CHECK(e <= 1.0 / 64, "%s bf16: %.3g of max|ref| from the bf16 scheme emulated in torch (bound %.3g)", key, e,
                  1.0 / 64);
            free(emu);
        }
        if (p == 0 && valid < n) {
            CHECK(dl_t5_encoder_run(m, ids, hidden, NULL) == DL_OK, "%s", dl_last_error());
            snprintf(name, sizeof name, "%s.h%d", key, (int)L);
            float *want = vec(name, NULL);
            double e = test_rel_err(hidden, want, sd);
            CHECK(e > 1e-2, "%s: without the mask the output should differ, %.3g of max|ref|", key, e);
            free(want);
        }
        free(ids), free(hidden), free(all);
        dl_t5_encoder_free(m);
    }
    printf("%s %s (%s) with attention masks: worst hidden-state error %.3g of max|ref| over %d cases", prefix,
           dl_dtype_name(dt), comp, worst, ncases);
    if (dt == DL_BF16) printf("; %.3g from the emulated bf16 scheme", worst_emu);
    printf("\n");
}

/* Wan's own vectors (make_wan_vectors.py): UMT5's last_hidden_state of the prompt
 * tokenized to 16, with its mask. */
static void test_wan_text(dl_dtype dt) {
    dl_checkpoint *v;
    dl_model_dir *dir;
    if (dl_ckpt_open(&v, DATA_DIR "/wan/vectors.safetensors", "wan") != DL_OK) {
        CHECK(0, "%s", dl_last_error());
        return;
    }
    if (dl_model_dir_open(&dir, DATA_DIR "/wan/a") != DL_OK) {
        CHECK(0, "%s", dl_last_error());
        dl_ckpt_free(v);
        return;
    }
    const dl_st_tensor *ti = dl_ckpt_find(v, "a.text.ids"), *tm = dl_ckpt_find(v, "a.text.mask"),
                       *th = dl_ckpt_find(v, "a.text.hidden");
    dl_t5_encoder *m = NULL;
    if (!ti || !tm || !th || ti->dtype != DL_ST_I32 || tm->dtype != DL_ST_I32 || ti->numel != tm->numel ||
        dl_t5_encoder_load(&m, dir, "text_encoder", ti->numel, dt, NULL) != DL_OK ||
        th->numel != ti->numel * dl_t5_encoder_width(m)) {
        CHECK(0, "wan text vectors / encoder: %s", dl_last_error());
    } else {
        int64_t n = ti->numel, valid = 0;
        int32_t *ids = malloc((size_t)n * 4), *mask = malloc((size_t)n * 4);
        float *want = malloc((size_t)th->numel * 4), *got = malloc((size_t)th->numel * 4);
        memcpy(ids, ti->data, (size_t)n * 4), memcpy(mask, tm->data, (size_t)n * 4);
        while (valid < n && mask[valid]) valid++;
        dl_ckpt_read(th, DL_F32, want);
        CHECK(dl_t5_encoder_is_umt5(m), "Wan's text encoder is UMT5");
        CHECK(dl_t5_encoder_run_masked(m, ids, valid, got, NULL) == DL_OK, "%s", dl_last_error());
        double e = test_rel_err(got, want, th->numel), bound = dt == DL_F32 ? 1e-4 : 1.0 / 16; /* as test_masked */
        printf("wan a.text %s (valid %lld of %lld): %.3g of max|ref|\n", dl_dtype_name(dt), (long long)valid, (long long)n, e);
        CHECK(e <= bound, "wan a.text.hidden %s: %.3g of max|ref| (bound %.3g)", dl_dtype_name(dt), e, bound);
        free(ids), free(mask), free(want), free(got);
    }
    dl_t5_encoder_free(m);
    dl_model_dir_free(dir);
    dl_ckpt_free(v);
}

/* dir/<name>/: src's weights (a link) and its config.json with up to two edits */
static void make_comp(const char *dir, const char *name, const char *src, const char *from1, const char *to1,
                      const char *from2, const char *to2) {
    char path[512], target[512], *txt, out[8192];
    size_t len;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/%s/model.safetensors", dir, name);
    snprintf(target, sizeof target, "%s/model.safetensors", src);
    CHECK(symlink(target, path) == 0, "symlink %s", path);
    snprintf(path, sizeof path, "%s/config.json", src);
    if (dl_file_read(path, 1 << 16, &txt, &len) != DL_OK || len >= sizeof out) {
        CHECK(0, "%s", dl_last_error());
        return;
    }
    snprintf(out, sizeof out, "%s", txt);
    const char *from[2] = {from1, from2}, *to[2] = {to1, to2};
    for (int i = 0; i < 2 && from[i]; i++) {
        char *at = strstr(out, from[i]), tail[8192];
        CHECK(at != NULL, "%s: no `%s` to replace", path, from[i]);
        if (!at) continue;
        snprintf(tail, sizeof tail, "%s", at + strlen(from[i]));
        snprintf(at, sizeof out - (size_t)(at - out), "%s%s", to[i], tail);
    }
    snprintf(path, sizeof path, "%s/%s/config.json", dir, name);
    CHECK(dl_file_write_atomic(path, out, strlen(out)) == DL_OK, "%s", dl_last_error());
    free(txt);
}

/* Checkpoints and configs that disagree on T5 / UMT5 are refused by name; the valid
 * count is bounded. */
static void test_umt5_errors(void) {
    char dir[] = "/tmp/difflet_umt5_XXXXXX", path[512], cmd[600];
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    const char *umt5 = DATA_DIR "/wan/a/text_encoder", *t5 = DATA_DIR "/enc/t5";
    snprintf(path, sizeof path, "%s/model_index.json", dir);
    const char *idx = "{\"_class_name\": \"X\", \"umt5_as_t5\": [\"transformers\", \"T5EncoderModel\"],"
                      " \"t5_as_umt5\": [\"transformers\", \"UMT5EncoderModel\"], \"disagree\": [\"transformers\", \"X\"],"
                      " \"arch_only\": [\"transformers\", \"UMT5EncoderModel\"]}";
    CHECK(dl_file_write_atomic(path, idx, strlen(idx)) == DL_OK, "%s", dl_last_error());
    make_comp(dir, "umt5_as_t5", umt5, "\"model_type\": \"umt5\"", "\"model_type\": \"t5\"", "\"UMT5EncoderModel\"",
              "\"T5EncoderModel\"");
    make_comp(dir, "t5_as_umt5", t5, "\"model_type\": \"t5\"", "\"model_type\": \"umt5\"", "\"T5EncoderModel\"",
              "\"UMT5EncoderModel\"");
    make_comp(dir, "disagree", umt5, "\"model_type\": \"umt5\"", "\"model_type\": \"t5\"", NULL, NULL);
    make_comp(dir, "arch_only", umt5, "\"model_type\": \"umt5\",", "", NULL, NULL);
    dl_model_dir *md;
    if (dl_model_dir_open(&md, dir) != DL_OK) {
        CHECK(0, "%s", dl_last_error());
    } else {
        dl_t5_encoder *m;
        dl_status s = dl_t5_encoder_load(&m, md, "umt5_as_t5", 16, DL_F32, NULL);
        CHECK(s == DL_ERR_FORMAT && strstr(dl_last_error(), "relative_attention_bias") && strstr(dl_last_error(), "declares T5"),
              "per-layer biases under a T5 config: %s", dl_last_error());
        s = dl_t5_encoder_load(&m, md, "t5_as_umt5", 16, DL_F32, NULL);
        CHECK(s == DL_ERR_FORMAT && strstr(dl_last_error(), "declares UMT5") && strstr(dl_last_error(), "encoder.block.1."),
              "a T5 checkpoint under a UMT5 config: %s", dl_last_error());
        s = dl_t5_encoder_load(&m, md, "disagree", 16, DL_F32, NULL);
        CHECK(s == DL_ERR_FORMAT && strstr(dl_last_error(), "disagree"), "model_type t5, UMT5EncoderModel: %s",
              dl_last_error());
        s = dl_t5_encoder_load(&m, md, "arch_only", 16, DL_F32, NULL);
        CHECK(s == DL_OK, "UMT5 by architectures alone: %s", dl_last_error());
        if (s == DL_OK) {
            CHECK(dl_t5_encoder_is_umt5(m), "UMT5 by architectures alone");
            int32_t ids[16] = {5, 6, 1};
            float h[16 * 32];
            CHECK(dl_t5_encoder_run_masked(m, ids, 0, h, NULL) == DL_ERR_INVALID && strstr(dl_last_error(), "1..16"),
                  "0 valid tokens: %s", dl_last_error());
            CHECK(dl_t5_encoder_run_masked(m, ids, 17, h, NULL) == DL_ERR_INVALID, "17 valid tokens of 16");
            CHECK(dl_t5_encoder_run_masked(m, ids, 3, h, NULL) == DL_OK, "%s", dl_last_error());
            dl_t5_encoder_free(m);
        }
        dl_model_dir_free(md);
    }
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0, "%s", cmd);
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
    if (dl_ckpt_open(&g_umt5, DATA_DIR "/enc/umt5_vectors.safetensors", "umt5 vectors") != DL_OK) {
        fprintf(stderr, "%s\n", dl_last_error());
        return 1;
    }
    dl_model_dir *wan;
    if (dl_model_dir_open(&wan, DATA_DIR "/wan/a") != DL_OK) {
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
        test_masked(wan, "text_encoder", "umt5", 4, 1, dt);
        test_masked(dir, "t5", "t5m", 1, 0, dt);
        test_wan_text(dt);
    }
    test_errors(dir);
    test_umt5_errors();
    dl_model_dir_free(wan);
    dl_model_dir_free(dir);
    dl_ckpt_free(g_umt5);
    dl_ckpt_free(g_vec);
    return test_done("test_encoders");
}
