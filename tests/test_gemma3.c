/* LTX-2's text encoder (the language model of Gemma3ForConditionalGeneration on
 * text) against transformers 5.24: the tiny random encoder of tests/data/gemma3
 * (make_gemma3_vectors.py: hidden 72, 4 heads / 2 KV heads of dim 16,
 * query_pre_attn_scalar 24, 6 layers sliding, sliding, full x 2, sliding_window 4,
 * linear-scaled RoPE on full layers, weights stored bf16) on five left-padded id
 * sequences: every hidden state (embeddings, each layer, the final norm), every
 * row, padded rows included.
 * Bounds, per row (max|err| over the row / max|ref| of the row): f32 1e-5. bf16
 * (weights, matmul inputs and attention in bf16, residual stream and norms f32)
 * 2^-5 from the f32 reference; its hidden_states[0] rounded to bf16 equals
 * transformers' bf16 model's exactly (the embedding scale is bf16(sqrt 72) = 8.5).
 * Also: the same weights under the names transformers uses in memory
 * (`model.language_model.*`, two shards; save_pretrained writes the original
 * checkpoints' `language_model.model.*`, as the fixture has) under a transformers-4 config
 * (sliding_window_pattern, rope_theta, rope_local_base_freq, rope_scaling), and as
 * Gemma3ForCausalLM names them (`model.*`, text fields at the top level), give the
 * same numbers bit for bit, as does attn_logit_softcapping (transformers ignores
 * it); a wider window, or no linear RoPE factor, changes them; refusals (configs
 * named, a tensor of the wrong shape, a missing tensor), lengths, padding, ids. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "difflet/gemma3.h"
#include "test_util.h"

#define GDIR DATA_DIR "/gemma3"
#define L_ 6
#define D_ 72

static dl_checkpoint *g_vec;
static const char *SEQS[] = {"a", "b", "c", "d", "e"};
enum { NSEQ = 5 };

typedef struct {
    int32_t *ids;
    int64_t n, pad;
    float *hidden; /* [L+1, n, D] */
} seq;

static int seq_load(const char *key, seq *s) {
    char name[64];
    memset(s, 0, sizeof *s);
    snprintf(name, sizeof name, "%s.ids", key);
    const dl_st_tensor *ti = dl_ckpt_find(g_vec, name);
    snprintf(name, sizeof name, "%s.mask", key);
    const dl_st_tensor *tm = dl_ckpt_find(g_vec, name);
    snprintf(name, sizeof name, "%s.hidden", key);
    const dl_st_tensor *th = dl_ckpt_find(g_vec, name);
    if (!ti || !tm || !th || ti->dtype != DL_ST_I32 || tm->dtype != DL_ST_I32 || tm->numel != ti->numel ||
        th->numel != (L_ + 1) * ti->numel * D_)
        return 0;
    s->n = ti->numel;
    s->ids = malloc((size_t)s->n * 4);
    memcpy(s->ids, ti->data, (size_t)s->n * 4);
    const int32_t *mask = (const int32_t *)tm->data;
    while (s->pad < s->n && !mask[s->pad]) s->pad++;
    s->hidden = malloc((size_t)th->numel * 4);
    dl_ckpt_read(th, DL_F32, s->hidden);
    return 1;
}

static void seq_free(seq *s) { free(s->ids), free(s->hidden); }

/* worst row error of every hidden state of got against s; *first: the first state
 * over bound (-1: none) */
static double states_err(const float *got, const seq *s, double bound, int *first, double *per) {
    double worst = 0;
    *first = -1;
    for (int k = 0; k <= L_; k++) {
        size_t off = (size_t)k * (size_t)(s->n * D_);
        double e = test_row_err(got + off, s->hidden + off, s->n, D_);
        if (per) per[k] = fmax(per[k], e);
        if (e > bound && *first < 0) *first = k;
        worst = fmax(worst, e);
    }
    return worst;
}

static double bound_of(dl_dtype dt) { return dt == DL_F32 ? 1e-5 : 1.0 / 32; }

/* every sequence on a model built for max_len (those longer refused); returns the worst */
static double test_parity(dl_model_dir *dir, const char *comp, int64_t max_len, dl_dtype dt, double *per) {
    dl_gemma3_text *m;
    if (dl_gemma3_text_load(&m, dir, comp, max_len, dt, NULL) != DL_OK) {
        CHECK(0, "load %s: %s", comp, dl_last_error());
        return INFINITY;
    }
    CHECK(dl_gemma3_text_width(m) == D_ && dl_gemma3_text_layers(m) == L_ && dl_gemma3_text_vocab(m) == 300 &&
              dl_gemma3_text_max_len(m) == max_len,
          "sizes: width %lld layers %d vocab %lld", (long long)dl_gemma3_text_width(m), dl_gemma3_text_layers(m),
          (long long)dl_gemma3_text_vocab(m));
    double worst = 0;
    for (int i = 0; i < NSEQ; i++) {
        seq s;
        if (!seq_load(SEQS[i], &s)) {
            CHECK(0, "no vectors %s.ids / .mask / .hidden", SEQS[i]);
            continue;
        }
        const size_t total = (size_t)((L_ + 1) * s.n * D_), extra = 64;
        float *got = malloc((total + extra) * 4);
        for (size_t j = 0; j < total + extra; j++) got[j] = 12345.f;
        if (s.n > max_len) {
            CHECK(dl_gemma3_text_run_all(m, s.ids, s.n, s.pad, got) == DL_ERR_INVALID, "%lld tokens on a model for %lld",
                  (long long)s.n, (long long)max_len);
        } else {
            CHECK(dl_gemma3_text_run_all(m, s.ids, s.n, s.pad, got) == DL_OK, "%s", dl_last_error());
            int untouched = 1;
            for (size_t j = total; j < total + extra; j++) untouched &= got[j] == 12345.f;
            CHECK(untouched, "%s: wrote past [L+1, n, D]", SEQS[i]);
            int first;
            double e = states_err(got, &s, bound_of(dt), &first, per);
            worst = fmax(worst, e);
            if (getenv("DIFFLET_TEST_VERBOSE"))
                printf("gemma3 %s %s max_len %lld (n %lld, pad %lld): %.3g\n", SEQS[i], dl_dtype_name(dt),
                       (long long)max_len, (long long)s.n, (long long)s.pad, e);
            CHECK(e <= bound_of(dt), "%s %s (max_len %lld): a row differs by %.3g of its max|ref| (bound %.3g), first in "
                  "hidden_states[%d]", SEQS[i], dl_dtype_name(dt), (long long)max_len, e, bound_of(dt), first);
            if (dt == DL_BF16 && !strcmp(SEQS[i], "a")) { /* the bf16 embedding scale */
                const dl_st_tensor *t = dl_ckpt_find(g_vec, "a.emb_bf16");
                float *ref = malloc((size_t)(s.n * D_) * 4);
                int same = t && t->numel == s.n * D_ && dl_ckpt_read(t, DL_F32, ref) == DL_OK, diff = 0;
                for (int64_t j = 0; same && j < s.n * D_; j++) diff += dl_bf16_to_f32(dl_f32_to_bf16(got[j])) != ref[j];
                CHECK(same && !diff, "bf16 hidden_states[0]: %d of %lld values differ from transformers' bf16 model", diff,
                      (long long)(s.n * D_));
                free(ref);
            }
        }
        free(got);
        seq_free(&s);
    }
    dl_gemma3_text_free(m);
    return worst;
}

/* ---- other layouts and configs, written to a temporary folder -------------------- */

static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    static char buf[8192];
    size_t len = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[len] = 0;
    return strdup(buf);
}

/* txt with `from` replaced by `to` (malloc'd; txt itself when from is absent, which fails) */
static char *with(const char *txt, const char *from, const char *to) {
    const char *at = strstr(txt, from);
    CHECK(at != NULL, "no `%s` in the config", from);
    if (!at) return strdup(txt);
    size_t n = strlen(txt) + strlen(to) + 1;
    char *out = malloc(n);
    snprintf(out, n, "%.*s%s%s", (int)(at - txt), txt, to, at + strlen(from));
    return out;
}

/* the fixture's language-model names, `language_model.model.` (what save_pretrained
 * writes) replaced by the prefix ctx; the vision tower left out */
static int lm_renamed(void *ctx, const char *name, char *out, size_t cap) {
    const char *lm = "language_model.model.";
    if (strncmp(name, lm, strlen(lm))) return 0;
    snprintf(out, cap, "%s%s", (const char *)ctx, name + strlen(lm));
    return 1;
}

/* root/<name>/: config cfg and the fixture's language-model tensors renamed from
 * `language_model.model.` (what save_pretrained writes) to `pre`, in `shards` files (with an index when 2);
 * `drop` left out, `bad` written with its first dimension one short. */
static void write_comp(const char *root, const char *name, const char *cfg, const char *pre, int shards, const char *drop,
                       const char *bad) {
    char path[700];
    snprintf(path, sizeof path, "%s/%s", root, name);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/%s/config.json", root, name);
    test_write_text(path, cfg);
    snprintf(path, sizeof path, "%s/%s", root, name);
    test_write_renamed(GDIR "/text_encoder/model.safetensors", path, shards, lm_renamed, (void *)pre, drop, bad);
}

/* run sequence s on <comp> (f32) into got; DL_OK or the load / run status */
static dl_status run_comp(dl_model_dir *md, const char *comp, const seq *s, float *got) {
    dl_gemma3_text *m;
    dl_status st = dl_gemma3_text_load(&m, md, comp, 32, DL_F32, NULL);
    if (st != DL_OK) return st;
    st = dl_gemma3_text_run_all(m, s->ids, s->n, s->pad, got);
    dl_gemma3_text_free(m);
    return st;
}

typedef struct {
    const char *name, *from, *to; /* config edit of the fixture's config.json */
    dl_status want;
    const char *says; /* in the message */
} refusal;

static void test_layouts_and_errors(dl_model_dir *fixture) {
    char root[] = "/tmp/difflet_gemma3_XXXXXX", path[700], cmd[800];
    CHECK(mkdtemp(root) != NULL, "mkdtemp");
    char *cfg = read_text(GDIR "/text_encoder/config.json"), *v4 = read_text(GDIR "/config_v4.json");
    if (!cfg || !v4) {
        CHECK(0, "fixture configs");
        free(cfg), free(v4);
        return;
    }
    /* transformers 4.x: Gemma3ForConditionalGeneration with a v4 text_config, the
       names transformers uses in memory; Gemma3ForCausalLM: the v4 text config at
       the top level */
    size_t n4 = strlen(v4) + 256;
    char *cfg4 = malloc(n4);
    snprintf(cfg4, n4, "{\"architectures\": [\"Gemma3ForConditionalGeneration\"], \"model_type\": \"gemma3\", "
                       "\"text_config\": %s}", v4);
    const refusal R[] = {
        {"r_type", "\"model_type\": \"gemma3\"", "\"model_type\": \"gemma2\"", DL_ERR_UNSUPPORTED, "gemma2"},
        {"r_yarn", "\"rope_type\": \"linear\"", "\"rope_type\": \"yarn\"", DL_ERR_UNSUPPORTED, "yarn"},
        {"r_bidir", "\"use_bidirectional_attention\": false", "\"use_bidirectional_attention\": true", DL_ERR_UNSUPPORTED,
         "use_bidirectional_attention"},
        {"r_bias", "\"attention_bias\": false", "\"attention_bias\": true", DL_ERR_UNSUPPORTED, "attention_bias"},
        {"r_act", "\"gelu_pytorch_tanh\"", "\"silu\"", DL_ERR_UNSUPPORTED, "silu"},
        {"r_ltype", "\"full_attention\",\n      \"sliding_attention\"", "\"chunked_attention\",\n      \"sliding_attention\"",
         DL_ERR_UNSUPPORTED, "chunked_attention"},
        {"r_nltype", "\"sliding_attention\",\n      \"sliding_attention\",\n      \"full_attention\",\n      ", "",
         DL_ERR_FORMAT, "layer_types"},
        {"r_prf", "\"factor\": 8.0,", "\"factor\": 8.0, \"partial_rotary_factor\": 0.5,", DL_ERR_UNSUPPORTED,
         "partial_rotary_factor"},
        {"r_hd", "\"head_dim\": 16", "\"head_dim\": 8", DL_ERR_FORMAT, "q_proj"},
    };
    const int NR = (int)(sizeof R / sizeof R[0]);
    char mi[4096];
    size_t ml = (size_t)snprintf(mi, sizeof mi, "{\"_class_name\": \"LTX2Pipeline\"");
    const char *comps[] = {"v4", "causal", "softcap", "wide", "nolinear", "badshape", "missing", "noembed"};
    for (size_t i = 0; i < sizeof comps / sizeof *comps; i++)
        ml += (size_t)snprintf(mi + ml, sizeof mi - ml, ", \"%s\": [\"transformers\", \"Gemma3ForConditionalGeneration\"]",
                               comps[i]);
    for (int i = 0; i < NR; i++)
        ml += (size_t)snprintf(mi + ml, sizeof mi - ml, ", \"%s\": [\"transformers\", \"Gemma3ForConditionalGeneration\"]",
                               R[i].name);
    snprintf(mi + ml, sizeof mi - ml, "}");
    snprintf(path, sizeof path, "%s/model_index.json", root);
    test_write_text(path, mi);
    const char *lm = "language_model.model.";
    write_comp(root, "v4", cfg4, "model.language_model.", 2, NULL, NULL);
    write_comp(root, "causal", v4, "model.", 1, NULL, NULL);
    char *c1 = with(cfg, "\"attn_logit_softcapping\": null", "\"attn_logit_softcapping\": 50.0");
    write_comp(root, "softcap", c1, lm, 1, NULL, NULL);
    char *c2 = with(cfg, "\"sliding_window\": 4,", "\"sliding_window\": 1000,");
    write_comp(root, "wide", c2, lm, 1, NULL, NULL);
    char *c3 = with(cfg, "\"rope_type\": \"linear\"", "\"rope_type\": \"default\"");
    write_comp(root, "nolinear", c3, lm, 1, NULL, NULL);
    write_comp(root, "badshape", cfg, lm, 1, NULL, "language_model.model.layers.4.mlp.up_proj.weight");
    write_comp(root, "missing", cfg, lm, 2, "language_model.model.layers.5.self_attn.k_norm.weight", NULL);
    write_comp(root, "noembed", cfg, lm, 1, "language_model.model.embed_tokens.weight", NULL);
    free(c1), free(c2), free(c3);
    for (int i = 0; i < NR; i++) {
        char *c = with(cfg, R[i].from, R[i].to);
        write_comp(root, R[i].name, c, lm, 1, NULL, NULL);
        free(c);
    }
    dl_model_dir *md;
    seq s;
    if (dl_model_dir_open(&md, root) != DL_OK || !seq_load("a", &s)) {
        CHECK(0, "temporary folder / vectors a: %s", dl_last_error());
        free(cfg), free(v4), free(cfg4);
        return;
    }
    const size_t total = (size_t)((L_ + 1) * s.n * D_);
    float *ref = malloc(total * 4), *got = malloc(total * 4);
    CHECK(run_comp(fixture, "text_encoder", &s, ref) == DL_OK, "%s", dl_last_error());
    const char *same[] = {"v4", "causal", "softcap"};
    for (int i = 0; i < 3; i++) {
        dl_status st = run_comp(md, same[i], &s, got);
        CHECK(st == DL_OK, "%s: %s", same[i], dl_last_error());
        CHECK(st != DL_OK || !memcmp(got, ref, total * 4), "%s: other numbers than the fixture", same[i]);
    }
    const char *differ[] = {"wide", "nolinear"}; /* the window and the RoPE factor are read */
    for (int i = 0; i < 2; i++) {
        dl_status st = run_comp(md, differ[i], &s, got);
        int first;
        double e = st == DL_OK ? states_err(got, &s, 1e-3, &first, NULL) : 0;
        CHECK(st == DL_OK && e > 1e-3, "%s should change the output: %s %.3g", differ[i], dl_last_error(), e);
    }
    dl_status st = run_comp(md, "badshape", &s, got);
    CHECK(st == DL_ERR_FORMAT && strstr(dl_last_error(), "layers.4.mlp.up_proj.weight"), "a [127, 72] up_proj: %s",
          dl_last_error());
    st = run_comp(md, "missing", &s, got);
    CHECK(st != DL_OK && strstr(dl_last_error(), "layers.5.self_attn.k_norm.weight"), "a missing tensor is named: %s",
          dl_last_error());
    st = run_comp(md, "noembed", &s, got);
    CHECK(st == DL_ERR_FORMAT && strstr(dl_last_error(), "not a Gemma 3 checkpoint"), "no embedding: %s", dl_last_error());
    for (int i = 0; i < NR; i++) {
        st = run_comp(md, R[i].name, &s, got);
        CHECK(st == R[i].want && strstr(dl_last_error(), R[i].says), "%s: status %d: %s", R[i].name, (int)st,
              dl_last_error());
    }
    /* lengths, padding, ids, build arguments */
    dl_gemma3_text *m;
    CHECK(dl_gemma3_text_load(&m, fixture, "text_encoder", 0, DL_F32, NULL) == DL_ERR_INVALID, "max_len 0");
    CHECK(dl_gemma3_text_load(&m, fixture, "text_encoder", 1 << 20, DL_F32, NULL) == DL_ERR_INVALID, "max_len 2^20");
    CHECK(dl_gemma3_text_load(&m, fixture, "text_encoder", 16, DL_F16, NULL) == DL_ERR_UNSUPPORTED, "f16");
    if (dl_gemma3_text_load(&m, fixture, "text_encoder", 16, DL_F32, NULL) == DL_OK) {
        CHECK(dl_gemma3_text_run_all(m, s.ids, 17, 0, got) == DL_ERR_INVALID && strstr(dl_last_error(), "1..16"),
              "17 tokens on a model for 16: %s", dl_last_error());
        CHECK(dl_gemma3_text_run_all(m, s.ids, 0, 0, got) == DL_ERR_INVALID, "0 tokens");
        CHECK(dl_gemma3_text_run_all(m, s.ids, 16, 16, got) == DL_ERR_INVALID, "all 16 positions padded");
        CHECK(dl_gemma3_text_run_all(m, s.ids, 16, -1, got) == DL_ERR_INVALID, "pad_left -1");
        int32_t bad[8] = {0, 0, 3, 4, 5, 300, 6, 7};
        CHECK(dl_gemma3_text_run_all(m, bad, 8, 2, got) == DL_ERR_INVALID && strstr(dl_last_error(), "position 5"),
              "id 300 of a 300 vocabulary: %s", dl_last_error());
        bad[5] = -1;
        CHECK(dl_gemma3_text_run_all(m, bad, 8, 2, got) == DL_ERR_INVALID && strstr(dl_last_error(), "position 5"),
              "id -1: %s", dl_last_error());
        CHECK(dl_gemma3_text_run_all(m, s.ids, 16, s.pad, got) == DL_OK, "16 tokens on a model for 16: %s",
              dl_last_error());
        int first;
        double e = states_err(got, &s, 1e-5, &first, NULL);
        CHECK(e <= 1e-5, "a on a model built for exactly its 16 tokens: %.3g", e);
        dl_gemma3_text_free(m);
    } else {
        CHECK(0, "%s", dl_last_error());
    }
    free(ref), free(got), free(cfg), free(v4), free(cfg4);
    seq_free(&s);
    dl_model_dir_free(md);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    CHECK(system(cmd) == 0, "%s", cmd);
}

int main(void) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    dl_model_dir *dir;
    if (dl_ckpt_open(&g_vec, GDIR "/vectors.safetensors", "gemma3 vectors") != DL_OK ||
        dl_model_dir_open(&dir, GDIR) != DL_OK) {
        CHECK(0, "%s", dl_last_error());
        return test_done("gemma3");
    }
    for (int d = 0; d < 2; d++) {
        dl_dtype dt = d ? DL_BF16 : DL_F32;
        double per[L_ + 1] = {0};
        double e = test_parity(dir, "text_encoder", 160, dt, per);
        printf("gemma3 %s: 5 sequences (1..140 tokens, 0..9 left-padded), worst row %.3g of its max|ref| (bound %.3g); "
               "per hidden state:",
               dl_dtype_name(dt), e, bound_of(dt));
        for (int k = 0; k <= L_; k++) printf(" %.2g", per[k]);
        printf("\n");
        test_parity(dir, "text_encoder", 12, dt, NULL); /* one 12-row chunk; a, d and e refused */
    }
    test_layouts_and_errors(dir);
    dl_model_dir_free(dir);
    dl_ckpt_free(g_vec);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("gemma3: %.2f s\n", (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
    return test_done("gemma3");
}
