/* Qwen-Image's text encoder (the language model of Qwen2_5_VLForConditionalGeneration
 * on text alone) against transformers 5.24: the tiny random-weight encoder of
 * tests/data/qwenimage/a (2 layers, hidden 64, 4 heads / 2 KV heads, mrope [2, 3, 3],
 * theta 1e6; make_qwenimage_vectors.py) on the two template-wrapped prompts of
 * vectors.safetensors (52 and 72 tokens), every row of hidden_states[-1].
 * Bounds, per row (max|err| over the row / max|ref| of the row): f32 1e-4. bf16
 * (weights, matmul inputs and attention in bf16, residual stream and norms f32):
 * 2^-7 from the same scheme emulated in torch (text_extra.safetensors,
 * make_qwen_text_vectors.py: every rounding written out, the flash kernel's blocked
 * softmax included, so what remains is summation order flipping a rounding here and
 * there: 0.0017 on a/, 2.5e-7 on text_x with AVX2), and 2^-5 from the f32 reference
 * (the scheme alone lands 0.021 from it on these unit-scale random weights; 0.025
 * on text_x, held to 2^-4).
 * A second encoder (text_x: head dim 32, the AVX-512 kernel's multiple, 2 query
 * heads on 1 KV head, theta 1e4, transformers 5 names) on 150 random ids: 2 chunks.
 * Also: a model built for more tokens than it is run on, 2 matmul chunks with the
 * reference rows as a causal prefix; the same weights renamed to transformers 5's
 * `model.language_model.*`, in two shards, under a transformers-4 config (text
 * fields at the top level) give the same output bit for bit; a rope_theta read from
 * that config matters; errors (a missing tensor, bad RoPE settings, ids, lengths). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "difflet/qwen.h"
#include "difflet/text.h"
#include "test_util.h"

#define QDIR DATA_DIR "/qwenimage"

static dl_checkpoint *g_vec, *g_extra; /* vectors.safetensors, text_extra.safetensors */

static int32_t *ids_of(const char *key, int64_t *n) {
    char name[128];
    snprintf(name, sizeof name, "%s.ids", key);
    const dl_st_tensor *t = dl_ckpt_find(g_vec, name);
    if (!t) t = dl_ckpt_find(g_extra, name);
    if (!t || t->dtype != DL_ST_I32) return NULL;
    int32_t *ids = malloc((size_t)t->numel * 4);
    memcpy(ids, t->data, (size_t)t->numel * 4);
    *n = t->numel;
    return ids;
}

/* <key>.<what> ([numel] floats) from either vectors file, or NULL */
static float *vec_of(const char *key, const char *what, int64_t numel) {
    char name[128];
    snprintf(name, sizeof name, "%s.%s", key, what);
    const dl_st_tensor *t = dl_ckpt_find(g_vec, name);
    if (!t) t = dl_ckpt_find(g_extra, name);
    if (!t || t->numel != numel) return NULL;
    float *p = malloc((size_t)numel * 4);
    dl_ckpt_read(t, DL_F32, p);
    return p;
}

static double bound_of(dl_dtype dt) { return dt == DL_F32 ? 1e-4 : 1.0 / 32; }
#define BOUND_EMU (1.0 / 128) /* bf16 against the emulated bf16 scheme */

/* bf16 output against <key>.bf16 (the scheme emulated in torch); returns the error.
 * The emulation rounds the attention probabilities as the AVX2 / AVX-512 kernels do;
 * the reference kernel (DIFFLET_KERNELS=ref) keeps them f32, another scheme: there
 * only the bound against the f32 reference applies (NaN: not compared). */
static double check_emu(const char *key, const float *got, int64_t n, int64_t D, int64_t head_dim) {
    dl_attn_args pa = {.dt = DL_BF16, .sq = 1, .sk = 1, .heads = 1, .head_dim = head_dim, .kv_end = 1};
    if (!strcmp(dl_attn_path_name(&pa), "reference")) return NAN; /* not compared */
    float *emu = vec_of(key, "bf16", n * D);
    double e = emu ? test_row_err(got, emu, n, D) : INFINITY;
    CHECK(e <= BOUND_EMU, "%s bf16: a row differs by %.3g of its max|ref| from the emulated bf16 scheme (bound %.3g)",
          key, e, BOUND_EMU);
    free(emu);
    return e;
}

static double g_worst_emu; /* bf16 against the emulated scheme, worst so far (NaN: not compared) */

/* Both prompts on a model built for max_len; hidden rows past n stay untouched. */
static double test_parity(dl_model_dir *dir, const char *comp, int64_t max_len, dl_dtype dt) {
    dl_qwen2_text *m;
    if (dl_qwen2_text_load(&m, dir, comp, max_len, dt, NULL) != DL_OK) {
        CHECK(0, "load %s: %s", comp, dl_last_error());
        return INFINITY;
    }
    const int64_t D = dl_qwen2_text_width(m);
    CHECK(D == 64 && dl_qwen2_text_vocab(m) == 574 && dl_qwen2_text_layers(m) == 2 && dl_qwen2_text_max_len(m) == max_len,
          "sizes: width %lld vocab %lld layers %d", (long long)D, (long long)dl_qwen2_text_vocab(m), dl_qwen2_text_layers(m));
    double worst = 0;
    for (int p = 0; p < 2; p++) {
        char key[32];
        snprintf(key, sizeof key, "a.text%d", p);
        int64_t n = 0;
        int32_t *ids = ids_of(key, &n);
        float *want = ids ? vec_of(key, "hidden", n * D) : NULL;
        if (!want) {
            CHECK(0, "no vectors %s.ids / .hidden", key);
            free(ids);
            continue;
        }
        if (n > max_len) { /* this build is too short for the prompt: refused, then skipped */
            float h[1];
            CHECK(dl_qwen2_text_run(m, ids, n, h) == DL_ERR_INVALID, "%lld tokens on a model for %lld", (long long)n,
                  (long long)max_len);
            free(ids), free(want);
            continue;
        }
        const int64_t extra = 8;
        float *got = malloc((size_t)((n + extra) * D) * 4);
        for (int64_t i = 0; i < (n + extra) * D; i++) got[i] = 12345.f;
        CHECK(dl_qwen2_text_run(m, ids, n, got) == DL_OK, "%s", dl_last_error());
        int untouched = 1;
        for (int64_t i = n * D; i < (n + extra) * D; i++) untouched &= got[i] == 12345.f;
        CHECK(untouched, "%s: rows past n were written", key);
        double e = test_row_err(got, want, n, D);
        worst = fmax(worst, e);
        if (getenv("DIFFLET_TEST_VERBOSE"))
            printf("%s %s max_len %lld (%lld tokens): %.3g\n", key, dl_dtype_name(dt), (long long)max_len, (long long)n, e);
        CHECK(e <= bound_of(dt), "%s %s (max_len %lld): a row differs by %.3g of its max|ref| (bound %.3g)", key,
              dl_dtype_name(dt), (long long)max_len, e, bound_of(dt));
        if (dt == DL_BF16) {
            double ee = check_emu(key, got, n, D, 16);
            g_worst_emu = isnan(ee) ? ee : fmax(g_worst_emu, ee);
        }
        free(ids), free(want), free(got);
    }
    dl_qwen2_text_free(m);
    return worst;
}

/* 152 tokens (2 matmul chunks of 128) on a model for 200: the 72-token prompt is a
 * causal prefix, so its rows must still match the reference. */
static void test_chunks(dl_model_dir *dir, dl_dtype dt) {
    int64_t n0 = 0;
    int32_t *ids0 = ids_of("a.text1", &n0);
    float *want = ids0 ? vec_of("a.text1", "hidden", n0 * 64) : NULL;
    dl_qwen2_text *m;
    if (!want || dl_qwen2_text_load(&m, dir, "text_encoder", 200, dt, NULL) != DL_OK) {
        CHECK(0, "a.text1 / load: %s", dl_last_error());
        free(ids0), free(want);
        return;
    }
    const int64_t n = 152;
    int32_t ids[152];
    for (int64_t i = 0; i < n; i++) ids[i] = i < n0 ? ids0[i] : (int32_t)((i * 37) % 574);
    float *got = malloc((size_t)(n * 64) * 4);
    CHECK(dl_qwen2_text_run(m, ids, n, got) == DL_OK, "%s", dl_last_error());
    double e = test_row_err(got, want, n0, 64);
    printf("qwen text %s: 152 tokens in 2 chunks, the 72-token prefix %.3g of max|ref|\n", dl_dtype_name(dt), e);
    CHECK(e <= bound_of(dt), "prefix rows of a 2-chunk run: %.3g (bound %.3g)", e, bound_of(dt));
    int finite = 1;
    for (int64_t i = 0; i < n * 64; i++) finite &= isfinite(got[i]);
    CHECK(finite, "non-finite output past the prefix");
    free(ids0), free(want), free(got);
    dl_qwen2_text_free(m);
}

/* text_x: head dim 32, 2 query heads on 1 KV head, 150 tokens (2 chunks) on a model
 * built for exactly 150 (the last chunk reaches past S: Sp = 256 rows). */
static void test_x(dl_dtype dt) {
    dl_model_dir *dir;
    if (dl_model_dir_open(&dir, QDIR "/text_x") != DL_OK) {
        CHECK(0, "%s", dl_last_error());
        return;
    }
    int64_t n = 0;
    int32_t *ids = ids_of("x", &n);
    float *want = ids ? vec_of("x", "hidden", n * 64) : NULL;
    dl_qwen2_text *m = NULL;
    if (!want || dl_qwen2_text_load(&m, dir, "text_encoder", n, dt, NULL) != DL_OK) {
        CHECK(0, "text_x vectors / load: %s", dl_last_error());
    } else {
        float *got = malloc((size_t)(n * 64) * 4);
        CHECK(dl_qwen2_text_run(m, ids, n, got) == DL_OK, "%s", dl_last_error());
        double e = test_row_err(got, want, n, 64), bound = dt == DL_F32 ? 1e-4 : 1.0 / 16, emu = 0;
        if (dt == DL_BF16) emu = check_emu("x", got, n, 64, 32);
        printf("qwen text_x %s (head dim 32, 2 heads / 1 KV head, %lld tokens): worst row %.3g of its max|ref| (bound "
               "%.3g)",
               dl_dtype_name(dt), (long long)n, e, bound);
        if (dt == DL_BF16) printf("; %.3g from the emulated bf16 scheme (bound %.3g; nan: not compared)", emu, BOUND_EMU);
        printf("\n");
        CHECK(e <= bound, "text_x %s: a row differs by %.3g of its max|ref| (bound %.3g)", dl_dtype_name(dt), e, bound);
        free(got);
    }
    dl_qwen2_text_free(m);
    free(ids), free(want);
    dl_model_dir_free(dir);
}

/* ---- a transformers-5-named, sharded copy under a transformers-4 config -------- */

static const char *CFG4 =
    "{\"architectures\": [\"Qwen2_5_VLForConditionalGeneration\"], \"model_type\": \"qwen2_5_vl\", "
    "\"hidden_act\": \"silu\", \"hidden_size\": 64, \"intermediate_size\": 128, \"num_attention_heads\": 4, "
    "\"num_hidden_layers\": 2, \"num_key_value_heads\": 2, \"rms_norm_eps\": 1e-06, \"rope_theta\": 1000000.0, "
    "\"rope_scaling\": {\"type\": \"mrope\", \"mrope_section\": [2, 3, 3]}, \"sliding_window\": 32768, "
    "\"use_sliding_window\": false, \"max_window_layers\": 28, \"vocab_size\": 574, "
    "\"vision_config\": {\"depth\": 1, \"hidden_size\": 32}}";

/* transformers 5's names: the language model under `model.language_model.`, the
 * vision tower under `model.visual.` */
static int v5_renamed(void *ctx, const char *name, char *out, size_t cap) {
    if (!strncmp(name, "model.", 6)) snprintf(out, cap, "model.language_model.%s", name + 6);
    else if (!strncmp(name, "visual.", 7)) snprintf(out, cap, "model.%s", name);
    else snprintf(out, cap, "%s", name);
    return 1;
}

/* root/<name>/: config `cfg`, the fixture's tensors with the language model under
 * `model.language_model.` and the vision tower under `model.visual.` (transformers 5),
 * in two shards plus model.safetensors.index.json; `drop` (may be NULL) left out. */
static void write_comp(const char *root, const char *name, const char *cfg, const char *drop) {
    char path[600];
    snprintf(path, sizeof path, "%s/%s", root, name);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/%s/config.json", root, name);
    test_write_text(path, cfg);
    snprintf(path, sizeof path, "%s/%s", root, name);
    test_write_renamed(QDIR "/a/text_encoder/model.safetensors", path, 2, v5_renamed, NULL, drop, NULL);
}

/* cfg with one substring replaced (static buffer) */
static const char *cfg_with(const char *from, const char *to) {
    static char out[4096];
    const char *at = strstr(CFG4, from);
    CHECK(at != NULL, "no `%s` in the config", from);
    if (!at) return CFG4;
    snprintf(out, sizeof out, "%.*s%s%s", (int)(at - CFG4), CFG4, to, at + strlen(from));
    return out;
}

static void test_layouts_and_errors(dl_model_dir *fixture) {
    char root[] = "/tmp/difflet_qwen_text_XXXXXX", path[600], cmd[700];
    CHECK(mkdtemp(root) != NULL, "mkdtemp");
    snprintf(path, sizeof path, "%s/model_index.json", root);
    test_write_text(path, "{\"_class_name\": \"QwenImagePipeline\", "
                     "\"v5\": [\"transformers\", \"Qwen2_5_VLForConditionalGeneration\"], "
                     "\"theta\": [\"transformers\", \"Qwen2_5_VLForConditionalGeneration\"], "
                     "\"missing\": [\"transformers\", \"Qwen2_5_VLForConditionalGeneration\"], "
                     "\"badsec\": [\"transformers\", \"Qwen2_5_VLForConditionalGeneration\"], "
                     "\"yarn\": [\"transformers\", \"Qwen2_5_VLForConditionalGeneration\"], "
                     "\"headdim\": [\"transformers\", \"Qwen2_5_VLForConditionalGeneration\"], "
                     "\"noembed\": [\"transformers\", \"Qwen2_5_VLForConditionalGeneration\"]}");
    write_comp(root, "v5", CFG4, NULL);
    write_comp(root, "theta", cfg_with("\"rope_theta\": 1000000.0", "\"rope_theta\": 10000.0"), NULL);
    write_comp(root, "missing", CFG4, "model.language_model.layers.1.self_attn.k_proj.bias");
    write_comp(root, "badsec", cfg_with("[2, 3, 3]", "[2, 3, 4]"), NULL);
    write_comp(root, "yarn", cfg_with("\"type\": \"mrope\"", "\"type\": \"yarn\""), NULL);
    write_comp(root, "headdim", cfg_with("\"hidden_size\": 64,", "\"hidden_size\": 64, \"head_dim\": 32,"), NULL);
    write_comp(root, "noembed", CFG4, "model.language_model.embed_tokens.weight");
    dl_model_dir *md;
    if (dl_model_dir_open(&md, root) != DL_OK) {
        CHECK(0, "%s", dl_last_error());
        return;
    }
    int64_t n = 0;
    int32_t *ids = ids_of("a.text1", &n);
    float *ref = ids ? vec_of("a.text1", "hidden", n * 64) : NULL;
    if (!ref) {
        CHECK(0, "no vectors a.text1");
        free(ids);
        dl_model_dir_free(md);
        return;
    }
    float *a = malloc((size_t)(n * 64) * 4), *b = malloc((size_t)(n * 64) * 4);
    for (int d = 0; d < 2; d++) {
        dl_dtype dt = d ? DL_BF16 : DL_F32;
        dl_qwen2_text *m0 = NULL, *m1 = NULL;
        CHECK(dl_qwen2_text_load(&m0, fixture, "text_encoder", 96, dt, NULL) == DL_OK, "%s", dl_last_error());
        CHECK(dl_qwen2_text_load(&m1, md, "v5", 96, dt, NULL) == DL_OK, "transformers-5 names, sharded: %s",
              dl_last_error());
        if (m0 && m1) {
            CHECK(dl_qwen2_text_run(m0, ids, n, a) == DL_OK && dl_qwen2_text_run(m1, ids, n, b) == DL_OK, "%s",
                  dl_last_error());
            CHECK(!memcmp(a, b, (size_t)(n * 64) * 4), "%s: the renamed, sharded checkpoint gives other numbers",
                  dl_dtype_name(dt));
        }
        dl_qwen2_text_free(m0), dl_qwen2_text_free(m1);
    }
    dl_qwen2_text *m;
    if (dl_qwen2_text_load(&m, md, "theta", 96, DL_F32, NULL) == DL_OK) {
        CHECK(dl_qwen2_text_run(m, ids, n, a) == DL_OK, "%s", dl_last_error());
        double e = test_row_err(a, ref, n, 64);
        CHECK(e > 1e-3, "rope_theta 1e4 instead of 1e6 should change the output: %.3g", e);
        dl_qwen2_text_free(m);
    } else {
        CHECK(0, "theta: %s", dl_last_error());
    }
    dl_status s = dl_qwen2_text_load(&m, md, "missing", 96, DL_F32, NULL);
    CHECK(s != DL_OK && strstr(dl_last_error(), "model.language_model.layers.1.self_attn.k_proj.bias"),
          "a missing tensor is named: %s", dl_last_error());
    s = dl_qwen2_text_load(&m, md, "noembed", 96, DL_F32, NULL);
    CHECK(s == DL_ERR_FORMAT && strstr(dl_last_error(), "model.embed_tokens.weight"), "no embedding: %s",
          dl_last_error());
    s = dl_qwen2_text_load(&m, md, "badsec", 96, DL_F32, NULL);
    CHECK(s == DL_ERR_FORMAT && strstr(dl_last_error(), "mrope_section"), "mrope_section [2, 3, 4]: %s", dl_last_error());
    s = dl_qwen2_text_load(&m, md, "yarn", 96, DL_F32, NULL);
    CHECK(s == DL_ERR_UNSUPPORTED && strstr(dl_last_error(), "yarn"), "rope type yarn: %s", dl_last_error());
    s = dl_qwen2_text_load(&m, md, "headdim", 96, DL_F32, NULL);
    CHECK(s == DL_ERR_UNSUPPORTED && strstr(dl_last_error(), "head_dim"), "head_dim 32 of hidden 64 / 4 heads: %s",
          dl_last_error());
    CHECK(dl_qwen2_text_load(&m, md, "v5", 0, DL_F32, NULL) == DL_ERR_INVALID, "max_len 0");
    CHECK(dl_qwen2_text_load(&m, md, "v5", 1 << 20, DL_F32, NULL) == DL_ERR_INVALID, "max_len 2^20");
    if (dl_qwen2_text_load(&m, md, "v5", 64, DL_F32, NULL) == DL_OK) {
        CHECK(dl_qwen2_text_run(m, ids, 65, a) == DL_ERR_INVALID && strstr(dl_last_error(), "1..64"),
              "65 tokens on a model for 64: %s", dl_last_error());
        CHECK(dl_qwen2_text_run(m, ids, 0, a) == DL_ERR_INVALID, "0 tokens");
        int32_t bad[8] = {1, 2, 3, 4, 5, 574, 6, 7};
        CHECK(dl_qwen2_text_run(m, bad, 8, a) == DL_ERR_INVALID && strstr(dl_last_error(), "position 5"),
              "id 574 of a 574 vocabulary: %s", dl_last_error());
        bad[5] = -1;
        CHECK(dl_qwen2_text_run(m, bad, 8, a) == DL_ERR_INVALID && strstr(dl_last_error(), "position 5"), "id -1: %s",
              dl_last_error());
        CHECK(dl_qwen2_text_run(m, ids, 64, a) == DL_OK, "64 tokens on a model for 64: %s", dl_last_error());
        dl_qwen2_text_free(m);
    } else {
        CHECK(0, "v5: %s", dl_last_error());
    }
    free(ids), free(ref), free(a), free(b);
    dl_model_dir_free(md);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    CHECK(system(cmd) == 0, "%s", cmd);
}

/* transformers' LlamaModel (HunyuanVideo's text encoder: no q/k/v biases, a bare
 * checkpoint, read at a layer counted from the end): every hidden_states[k] of
 * tests/data/llama (make_llama_vectors.py), each row within 1e-5 of its max|ref| in
 * f32; k outside 0..L refused */
static void test_llama(void) {
    dl_checkpoint *v;
    dl_model_dir *dir;
    if (dl_ckpt_open(&v, DATA_DIR "/llama/vectors.safetensors", "llama vectors") != DL_OK ||
        dl_model_dir_open(&dir, DATA_DIR "/llama") != DL_OK) {
        CHECK(0, "%s", dl_last_error());
        return;
    }
    dl_qwen2_text *m;
    if (dl_qwen2_text_load(&m, dir, "text_encoder", 64, DL_F32, NULL) != DL_OK) {
        CHECK(0, "llama: %s", dl_last_error());
    } else {
        const dl_st_tensor *t = dl_ckpt_find(v, "ids");
        const int64_t n = t ? t->numel : 0, D = dl_qwen2_text_width(m);
        float *f = malloc((size_t)n * 4), *got = malloc((size_t)(n * D) * 4), *want = malloc((size_t)(n * D) * 4);
        int32_t *ids = malloc((size_t)n * sizeof *ids);
        if (t) dl_ckpt_read(t, DL_F32, f);
        for (int64_t i = 0; i < n; i++) ids[i] = (int32_t)f[i];
        const int L = dl_qwen2_text_layers(m);
        CHECK(L == 3 && D == 64 && n == 37, "llama: 3 layers of width 64, 37 ids");
        for (int k = 0; k <= L; k++) {
            char key[32];
            snprintf(key, sizeof key, "hidden.%d", k);
            const dl_st_tensor *w = dl_ckpt_find(v, key);
            CHECK(w && w->numel == n * D && dl_ckpt_read(w, DL_F32, want) == DL_OK, "vector %s", key);
            CHECK(dl_qwen2_text_run_hidden(m, ids, n, n, k, got) == DL_OK, "%s", dl_last_error());
            double e = test_row_err(got, want, n, D);
            CHECK(e <= 1e-5, "llama hidden_states[%d]: worst row %.3g of its max|ref|", k, e);
            if (getenv("DIFFLET_TEST_VERBOSE")) printf("llama hidden_states[%d]: %.3g\n", k, e);
        }
        CHECK(dl_qwen2_text_run(m, ids, n, got) == DL_OK && test_row_err(got, want, n, D) <= 1e-5,
              "llama: run is hidden_states[-1]");
        CHECK(dl_qwen2_text_run_hidden(m, ids, n, n, L + 1, got) == DL_ERR_INVALID &&
                  dl_qwen2_text_run_hidden(m, ids, n, n, -1, got) == DL_ERR_INVALID,
              "llama: a hidden state outside 0..L refused");
        free(f), free(got), free(want), free(ids);
        dl_qwen2_text_free(m);
    }
    dl_model_dir_free(dir);
    dl_ckpt_free(v);
}

/* HunyuanVideo's Llama prompt embeddings (make_hunyuan_text_vectors.py): the Llama 3
 * style tokenizer's ids, then diffusers' _get_llama_prompt_embeds for a padded and a
 * truncated prompt: embeds (every row, padding included) within 1e-5 of max|ref|,
 * masks equal */
static const char *HUNYUAN_TEMPLATE =
    "<|start_header_id|>system<|end_header_id|>\n\nDescribe the video by detailing the following aspects: "
    "1. The main content and theme of the video."
    "2. The color, shape, size, texture, quantity, text, and spatial relationships of the objects."
    "3. Actions, events, behaviors temporal relationships, physical movement changes of the objects."
    "4. background environment, light, style and atmosphere."
    "5. camera angles, movements, and transitions used in the video:<|eot_id|>"
    "<|start_header_id|>user<|end_header_id|>\n\n{}<|eot_id|>";

static void test_hunyuan_text(void) {
    static const char *prompts[2] = {
        "A cat walks.",
        "a red circle moving from left to right on a blue background, then a small green square appears and the camera "
        "pans slowly to the right while the light changes from morning to evening over the whole scene"};
    static const char *strings[5] = {"12345 items on 2024-12-01, 7.5% off", "I'm sure they'll say \"it's 1000000\"\n\n\tok",
                                     "  leading spaces, trailing   ",
                                     "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx 0123456789", "caf\u00e9 na\u00efve \u00fcber 42\u00b2"};
    enum { CROP = 285, M = 48, SKIP = 2 };
    dl_checkpoint *v;
    dl_model_dir *dir;
    dl_tokenizer *tok;
    if (dl_ckpt_open(&v, DATA_DIR "/llama/hunyuan_text.safetensors", "hunyuan text vectors") != DL_OK ||
        dl_model_dir_open(&dir, DATA_DIR "/llama") != DL_OK || dl_tokenizer_load(&tok, DATA_DIR "/llama/tokenizer") != DL_OK) {
        CHECK(0, "%s", dl_last_error());
        return;
    }
    int32_t ids[128];
    for (int i = 0; i < 5; i++) {
        char key[16];
        snprintf(key, sizeof key, "tok.%d", i);
        const dl_st_tensor *t = dl_ckpt_find(v, key);
        float want[128];
        int n = 0;
        CHECK(t && t->numel <= 128 && dl_ckpt_read(t, DL_F32, want) == DL_OK &&
                  dl_tokenizer_encode(tok, strings[i], strlen(strings[i]), 128, 0, ids, &n) == DL_OK, "%s", dl_last_error());
        int same = t && n == (int)t->numel;
        for (int j = 0; same && j < n; j++) same = ids[j] == (int32_t)want[j];
        CHECK(same, "Llama 3 tokenizer: ids of string %d differ from transformers'", i);
    }
    dl_qwen2_text *m;
    if (dl_qwen2_text_load(&m, dir, "text_encoder", CROP + M, DL_F32, NULL) != DL_OK) {
        CHECK(0, "%s", dl_last_error());
    } else {
        const int64_t D = dl_qwen2_text_width(m);
        float *got = malloc((size_t)(M * D) * 4), *want = malloc((size_t)(M * D) * 4), wm[M];
        int32_t mask[M];
        for (int i = 0; i < 2; i++) {
            char k1[16], k2[16];
            snprintf(k1, sizeof k1, "%d.embeds", i), snprintf(k2, sizeof k2, "%d.mask", i);
            const dl_st_tensor *te = dl_ckpt_find(v, k1), *tm = dl_ckpt_find(v, k2);
            CHECK(te && tm && te->numel == M * D && tm->numel == M && dl_ckpt_read(te, DL_F32, want) == DL_OK &&
                      dl_ckpt_read(tm, DL_F32, wm) == DL_OK, "vectors %s", k1);
            CHECK(dl_hunyuan_llama_embeds(tok, m, prompts[i], HUNYUAN_TEMPLATE, CROP, M, SKIP, got, mask) == DL_OK, "%s",
                  dl_last_error());
            int same = 1, valid = 0;
            for (int j = 0; j < M; j++) same &= mask[j] == (int32_t)wm[j], valid += mask[j];
            double e = test_row_err(got, want, M, D);
            CHECK(same && e <= 1e-5, "HunyuanVideo prompt %d: masks %s, worst row %.3g of max|ref|", i, same ? "equal" : "differ", e);
            if (getenv("DIFFLET_TEST_VERBOSE")) printf("hunyuan text %d: %d valid of %d, %.3g\n", i, valid, M, e);
        }
        CHECK(dl_hunyuan_llama_embeds(tok, m, "x", "no placeholder", CROP, M, SKIP, got, mask) == DL_ERR_INVALID &&
                  dl_hunyuan_llama_embeds(tok, m, "x", HUNYUAN_TEMPLATE, CROP, M + 10, SKIP, got, mask) == DL_ERR_INVALID,
              "a template without {} and a length past the encoder's refused");
        free(got), free(want);
        dl_qwen2_text_free(m);
    }
    dl_tokenizer_free(tok);
    dl_model_dir_free(dir);
    dl_ckpt_free(v);
}

int main(void) {
    test_llama();
    test_hunyuan_text();
    if (dl_ckpt_open(&g_vec, QDIR "/vectors.safetensors", "qwenimage vectors") != DL_OK) {
        fprintf(stderr, "%s\n", dl_last_error());
        return 1;
    }
    if (dl_ckpt_open(&g_extra, QDIR "/text_extra.safetensors", "qwen text extra vectors") != DL_OK) {
        fprintf(stderr, "%s\n", dl_last_error());
        return 1;
    }
    dl_model_dir *dir;
    if (dl_model_dir_open(&dir, QDIR "/a") != DL_OK) {
        fprintf(stderr, "%s\n", dl_last_error());
        return 1;
    }
    for (int d = 0; d < 2; d++) {
        dl_dtype dt = d ? DL_BF16 : DL_F32;
        double worst = 0;
        /* too short for the longer prompt; exactly it; a little more; Qwen-Image's 34 + 1024 */
        const int64_t lens[4] = {60, 72, 80, 1058};
        for (int i = 0; i < 4; i++) worst = fmax(worst, test_parity(dir, "text_encoder", lens[i], dt));
        printf("qwen text %s: worst row %.3g of its max|ref| (bound %.3g) over 2 prompts x max_len 60, 72, 80, 1058",
               dl_dtype_name(dt), worst, bound_of(dt));
        if (dt == DL_BF16)
            printf("; %.3g from the emulated bf16 scheme (bound %.3g; nan: not compared)", g_worst_emu, BOUND_EMU);
        printf("\n");
        test_chunks(dir, dt);
        test_x(dt);
    }
    test_layouts_and_errors(dir);
    dl_model_dir_free(dir);
    dl_ckpt_free(g_extra);
    dl_ckpt_free(g_vec);
    return test_done("test_qwen_text");
}
