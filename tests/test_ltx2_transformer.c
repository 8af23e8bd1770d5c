/* The LTX-2 audio-video transformer against diffusers (tests/data/ltx2/transformer_{a,b},
 * tools/parity/make_ltx2_transformer_vectors.py): one forward per config (a: LTX-2.0
 * style, caption projections, interleaved RoPE with padding; b: LTX-2.3 style, split
 * RoPE, gated attention, prompt adaLN on the video stream only, 2 x 2 patches,
 * use_cross_timestep), both streams' outputs within 1e-4 of max|ref| in f32 and 2^-4
 * in bf16; a second call gives the same bytes; bad inputs and sizes are refused; the
 * parallel splits the config cannot run are refused by name (the splits it can run are
 * checked against one rank in test_parallel). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "difflet/ltx2.h"
#include "difflet/pipeline.h"
#include "test_util.h"

static dl_checkpoint *g_vec;

static float *vec(const char *cfg, const char *name, int64_t *n) {
    char nm[64];
    snprintf(nm, sizeof nm, "%s.%s", cfg, name);
    const dl_st_tensor *t = dl_ckpt_find(g_vec, nm);
    float *p = t ? malloc((size_t)t->numel * 4) : NULL;
    if (!p || dl_ckpt_read(t, DL_F32, p) != DL_OK) {
        fprintf(stderr, "no vector %s\n", nm);
        free(p);
        return NULL;
    }
    if (n) *n = t->numel;
    return p;
}

/* max |got - want| over max |want| of the whole output */
static double rel_err(const float *got, const float *want, int64_t n) {
    double mx = 0, e = 0;
    for (int64_t j = 0; j < n; j++) {
        if (!isfinite(got[j])) return INFINITY;
        mx = fmax(mx, fabs(want[j]));
        e = fmax(e, fabs((double)got[j] - want[j]));
    }
    return e / (mx > 0 ? mx : 1);
}

static void test_config(const char *cfg, dl_dtype dt) {
    char path[256], comp[32];
    snprintf(path, sizeof path, DATA_DIR "/ltx2/transformer_%s", cfg);
    snprintf(comp, sizeof comp, "transformer");
    int64_t nv, na, nt, nat, nov, noa;
    float *grid = vec(cfg, "grid", NULL), *t = vec(cfg, "t", NULL), *video = vec(cfg, "video", &nv), *audio = vec(cfg, "audio", &na);
    float *text = vec(cfg, "text", &nt), *atext = vec(cfg, "audio_text", &nat), *wv = vec(cfg, "out_video", &nov),
          *wa = vec(cfg, "out_audio", &noa);
    dl_model_dir *dir = NULL;
    dl_ltx2_transformer *m = NULL;
    float *gv = NULL, *ga = NULL, *gv2 = NULL, *ga2 = NULL;
    if (!grid || !t || !video || !audio || !text || !atext || !wv || !wa) {
        CHECK(0, "vectors of %s", cfg);
        goto done;
    }
    dl_ltx2_transformer_shape sh = {.frames = (int64_t)grid[0], .height = (int64_t)grid[1], .width = (int64_t)grid[2],
                                    .audio_frames = (int64_t)grid[3], .text_rows = 8, .fps = grid[4]};
    clock_t c0 = clock();
    if (dl_model_dir_open(&dir, path) != DL_OK || dl_ltx2_transformer_load(&m, dir, comp, &sh, dt, NULL) != DL_OK) {
        CHECK(0, "transformer %s: %s", cfg, dl_last_error());
        goto done;
    }
    const dl_ltx2_transformer_info *in = dl_ltx2_transformer_get_info(m);
    const int sizes_ok = in->video_tokens * in->video_in == nv && in->audio_tokens * in->audio_in == na &&
                         in->text_rows * in->text_width == nt && in->text_rows * in->audio_text_width == nat &&
                         in->video_tokens * in->video_out == nov && in->audio_tokens * in->audio_out == noa;
    CHECK(sizes_ok, "transformer %s: sizes (%lld x %lld video, %lld x %lld audio) do not match the vectors", cfg,
          (long long)in->video_tokens, (long long)in->video_in, (long long)in->audio_tokens, (long long)in->audio_in);
    if (!sizes_ok) goto done;
    gv = malloc((size_t)nov * 4), ga = malloc((size_t)noa * 4), gv2 = malloc((size_t)nov * 4), ga2 = malloc((size_t)noa * 4);
    dl_ltx2_transformer_input x = {.video = video, .audio = audio, .text = text, .audio_text = atext,
                                   .video_tokens = in->video_tokens, .audio_tokens = in->audio_tokens, .text_rows = 8,
                                   .timestep = t[0], .audio_timestep = t[1], .sigma = t[2], .audio_sigma = t[3],
                                   .use_cross_timestep = t[4] != 0};
    clock_t c1 = clock();
    CHECK(dl_ltx2_transformer_run(m, &x, gv, ga) == DL_OK, "%s", dl_last_error());
    clock_t c2 = clock();
    double ev = rel_err(gv, wv, nov), ea = rel_err(ga, wa, noa), bar = dt == DL_F32 ? 1e-4 : 1.0 / 16;
    CHECK(ev <= bar && ea <= bar, "transformer %s (%s): video %.3g, audio %.3g of max|ref| (bound %.3g)", cfg,
          dl_dtype_name(dt), ev, ea, bar);
    if (getenv("DIFFLET_TEST_VERBOSE"))
        printf("transformer %s %s: video %.3g audio %.3g (load %.3fs, run %.3fs cpu)\n", cfg, dl_dtype_name(dt), ev, ea,
               (double)(c1 - c0) / CLOCKS_PER_SEC, (double)(c2 - c1) / CLOCKS_PER_SEC);
    /* determinism: a second call, the same bytes */
    CHECK(dl_ltx2_transformer_run(m, &x, gv2, ga2) == DL_OK && !memcmp(gv, gv2, (size_t)nov * 4) &&
              !memcmp(ga, ga2, (size_t)noa * 4),
          "transformer %s: a second call differs", cfg);
    /* the text cache: through a sequence of texts and sigmas, every call gives the bytes
     * of a second instance whose cache is emptied before each call */
    {
        dl_ltx2_transformer *e = NULL;
        float *ov = malloc((size_t)nov * 4), *oa = malloc((size_t)noa * 4);
        float *tv[3] = {text, malloc((size_t)nt * 4), malloc((size_t)nt * 4)};
        float *ta[3] = {atext, malloc((size_t)nat * 4), malloc((size_t)nat * 4)};
        int same = ov && oa && tv[1] && tv[2] && ta[1] && ta[2] &&
                   dl_ltx2_transformer_load(&e, dir, comp, &sh, dt, NULL) == DL_OK, differs = 0;
        for (int k = 1; same && k < 3; k++) {
            for (int64_t j = 0; j < nt; j++) tv[k][j] = text[j] * (1.f - 0.3f * k) + 0.1f * k;
            for (int64_t j = 0; j < nat; j++) ta[k][j] = atext[j] * (1.f - 0.3f * k) - 0.1f * k;
        }
        /* the prompt, another text, the prompt again, the prompt at another sigma (the keys
         * depend on it with cross_attn_mod), a third text (the least recently used entry
         * goes), the prompt with the other audio text, the prompt changed in place */
        static const int seq_t[8] = {0, 1, 0, 0, 2, 0, 0, 0}, seq_a[8] = {0, 1, 0, 0, 2, 0, 1, 0};
        static const float seq_s[8] = {-1, -1, -1, 0.25f, -1, -1, -1, -1};
        for (int i = 0; same && i < 8; i++) {
            if (i == 7) text[nt / 2] += 0.5f;
            x.text = tv[seq_t[i]], x.audio_text = ta[seq_a[i]];
            x.sigma = seq_s[i] < 0 ? t[2] : seq_s[i], x.audio_sigma = seq_s[i] < 0 ? t[3] : seq_s[i];
            dl_ltx2_transformer_forget_text(e);
            same = dl_ltx2_transformer_run(m, &x, gv2, ga2) == DL_OK && dl_ltx2_transformer_run(e, &x, ov, oa) == DL_OK &&
                   !memcmp(gv2, ov, (size_t)nov * 4) && !memcmp(ga2, oa, (size_t)noa * 4);
            if (!same) fprintf(stderr, "text cache: call %d differs from an empty cache's\n", i);
            if (i == 1 || i == 6 || i == 7) differs += memcmp(gv2, gv, (size_t)nov * 4) != 0;
        }
        text[nt / 2] -= 0.5f;
        x.text = text, x.audio_text = atext, x.sigma = t[2], x.audio_sigma = t[3];
        CHECK(same && differs == 3, "transformer %s: with the text cache, every call gives an empty cache's bytes (%d)", cfg,
              differs);
        dl_ltx2_transformer_free(e);
        free(ov), free(oa), free(tv[1]), free(tv[2]), free(ta[1]), free(ta[2]);
    }
    /* the modalities isolated: a different answer (a2v / v2a do something) */
    x.isolate_modalities = 1;
    CHECK(dl_ltx2_transformer_run(m, &x, gv2, ga2) == DL_OK && rel_err(gv2, wv, nov) > 1e-3, "isolate_modalities changes nothing");
    x.isolate_modalities = 0;
    /* bad inputs */
    x.timestep = NAN;
    CHECK(dl_ltx2_transformer_run(m, &x, gv2, ga2) == DL_ERR_INVALID && strstr(dl_last_error(), "timestep"),
          "a NaN timestep: %s", dl_last_error());
    x.timestep = t[0], x.audio_sigma = INFINITY;
    CHECK(dl_ltx2_transformer_run(m, &x, gv2, ga2) == DL_ERR_INVALID && strstr(dl_last_error(), "audio_sigma"),
          "an infinite audio_sigma: %s", dl_last_error());
    x.audio_sigma = t[3], x.video_tokens++;
    CHECK(dl_ltx2_transformer_run(m, &x, gv2, ga2) == DL_ERR_INVALID && strstr(dl_last_error(), "built for"),
          "a wrong token count: %s", dl_last_error());
    x.video_tokens--, x.text_rows = 9;
    CHECK(dl_ltx2_transformer_run(m, &x, gv2, ga2) == DL_ERR_INVALID, "a wrong text row count");
    x.text_rows = 8;
    float keep = video[3];
    video[3] = NAN;
    CHECK(dl_ltx2_transformer_run(m, &x, gv2, ga2) == DL_ERR_INVALID && strstr(dl_last_error(), "not finite"),
          "a NaN latent: %s", dl_last_error());
    video[3] = keep;
    CHECK(dl_ltx2_transformer_run(m, &x, gv2, ga2) == DL_OK && !memcmp(gv, gv2, (size_t)nov * 4), "after refusals, the same answer");
    /* bad shapes at load */
    dl_ltx2_transformer *m2 = NULL;
    dl_ltx2_transformer_shape bad = sh;
    bad.fps = 0;
    CHECK(dl_ltx2_transformer_load(&m2, dir, comp, &bad, dt, NULL) == DL_ERR_INVALID && !m2, "fps 0 refused");
    bad = sh, bad.audio_frames = 0;
    CHECK(dl_ltx2_transformer_load(&m2, dir, comp, &bad, dt, NULL) == DL_ERR_INVALID && !m2, "0 audio frames refused");
done:
    free(gv), free(ga), free(gv2), free(ga2);
    free(grid), free(t), free(video), free(audio), free(text), free(atext), free(wv), free(wa);
    dl_ltx2_transformer_free(m);
    dl_model_dir_free(dir);
}

/* configs the C forward does not implement are refused by name at load (the config is
 * read before any weight, so a config.json alone shows it) */
static void test_refused(void) {
    static const char *const cases[][2] = { /* first in the object: cJSON reads the first of a duplicated key */
        {"\"norm_elementwise_affine\": true", "norm_elementwise_affine"},
        {"\"rope_type\": \"spiral\"", "rope_type"},
        {"\"audio_patch_size_t\": 2", "audio_patch_size"},
        {"\"cross_attention_dim\": 48", "cross_attention_dim"},
        {"\"activation_fn\": \"gelu\"", "activation_fn"},
    };
    char dir[] = "/tmp/dl_ltx2trXXXXXX", p[300];
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp");
        return;
    }
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(p, sizeof p, "%s/model_index.json", dir);
        FILE *f = fopen(p, "w");
        if (f) fputs("{\"_class_name\": \"LTX2Pipeline\", \"transformer\": [\"diffusers\", \"LTX2VideoTransformer3DModel\"]}", f), fclose(f);
        snprintf(p, sizeof p, "%s/transformer", dir);
        char cmd[400];
        snprintf(cmd, sizeof cmd, "mkdir -p %s", p);
        CHECK(system(cmd) == 0, "mkdir");
        snprintf(p, sizeof p, "%s/transformer/config.json", dir);
        f = fopen(p, "w");
        if (f) fprintf(f, "{%s, \"_class_name\": \"LTX2VideoTransformer3DModel\", \"num_attention_heads\": 2, \"attention_head_dim\": 16, "
                          "\"cross_attention_dim\": 32, \"audio_num_attention_heads\": 2, \"audio_attention_head_dim\": 8, "
                          "\"audio_cross_attention_dim\": 16}", cases[i][0]), fclose(f);
        dl_model_dir *md = NULL;
        dl_ltx2_transformer *m = NULL;
        dl_ltx2_transformer_shape sh = {.frames = 2, .height = 2, .width = 2, .audio_frames = 2, .text_rows = 4, .fps = 24};
        dl_status st = dl_model_dir_open(&md, dir);
        if (st == DL_OK) st = dl_ltx2_transformer_load(&m, md, "transformer", &sh, DL_F32, NULL);
        CHECK(st == DL_ERR_UNSUPPORTED && !m && strstr(dl_last_error(), cases[i][1]), "config with %s: %d %s", cases[i][0], (int)st,
              dl_last_error());
        dl_ltx2_transformer_free(m);
        dl_model_dir_free(md);
    }
    snprintf(p, sizeof p, "rm -rf %s", dir);
    CHECK(system(p) == 0, "cleanup");
}

/* dl_ltx2_split_check on configs the fixtures do not have (4 video heads, odd interleaved
 * column pairs) */
static void test_split_check(void) {
    static const struct {
        const char *cfg, *spec, *refused; /* refused NULL: feasible */
    } cases[] = {
        {"\"num_attention_heads\": 4, \"attention_head_dim\": 8, \"cross_attention_dim\": 32", "tp=2", NULL},
        {"\"num_attention_heads\": 4, \"attention_head_dim\": 8, \"cross_attention_dim\": 32", "tp=4", "audio attention heads"},
        {"\"num_attention_heads\": 4, \"attention_head_dim\": 8, \"cross_attention_dim\": 32", "tp=2,cp=2:ulysses", NULL},
        {"\"num_attention_heads\": 4, \"attention_head_dim\": 8, \"cross_attention_dim\": 32", "tp=2,cp=4:ulysses", "tp x cp = 8"},
        {"\"num_attention_heads\": 4, \"attention_head_dim\": 8, \"cross_attention_dim\": 32", "tp=2,cp=4:ring", NULL},
        {"\"num_attention_heads\": 4, \"attention_head_dim\": 8, \"cross_attention_dim\": 32", "tp=2,sp", "sequence parallelism"},
        {"\"num_attention_heads\": 2, \"attention_head_dim\": 3, \"cross_attention_dim\": 6", "tp=2", "column pairs"},
        {"\"num_attention_heads\": 2, \"attention_head_dim\": 3, \"cross_attention_dim\": 6", "cp=2:ring", NULL},
        {"\"num_attention_heads\": 2, \"attention_head_dim\": 8, \"cross_attention_dim\": 16", "cp=64:ring", NULL},
        {"\"num_attention_heads\": 2, \"attention_head_dim\": 8, \"cross_attention_dim\": 16, \"rope_type\": \"spiral\"", "cp=2",
         "rope_type"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char json[512], buf[512];
        snprintf(json, sizeof json, "{%s, \"audio_num_attention_heads\": 2, \"audio_attention_head_dim\": 8, "
                                    "\"audio_cross_attention_dim\": 16}", cases[i].cfg);
        cJSON *cfg = cJSON_Parse(json);
        dl_par_config pc;
        if (!cfg || dl_par_parse(cases[i].spec, &pc) != DL_OK) {
            CHECK(0, "case %zu: %s", i, cfg ? dl_last_error() : "bad JSON");
            cJSON_Delete(cfg);
            continue;
        }
        const dl_dit_split sp = {.tp = pc.tp, .cp = pc.cp, .sp = pc.sp, .cp_mode = pc.cp_mode};
        const char *why = dl_ltx2_split_check(cfg, &sp, buf, sizeof buf);
        if (cases[i].refused)
            CHECK(why && strstr(why, cases[i].refused), "%s on {%s}: want refused (%s), got %s", cases[i].spec, cases[i].cfg,
                  cases[i].refused, why ? why : "feasible");
        else
            CHECK(!why, "%s on {%s} refused: %s", cases[i].spec, cases[i].cfg, why);
        cJSON_Delete(cfg);
    }
    /* a split made in code, past what --parallel parses */
    cJSON *cfg = cJSON_Parse("{\"num_attention_heads\": 2, \"attention_head_dim\": 8, \"cross_attention_dim\": 16, "
                             "\"audio_num_attention_heads\": 2, \"audio_attention_head_dim\": 8, \"audio_cross_attention_dim\": 16}");
    const dl_dit_split wide = {.tp = 1, .cp = 65, .cp_mode = DL_CP_RING};
    char buf[512];
    const char *why = cfg ? dl_ltx2_split_check(cfg, &wide, buf, sizeof buf) : NULL;
    CHECK(why && strstr(why, "64 cp ranks"), "cp=65: %s", why ? why : "feasible");
    cJSON_Delete(cfg);
}

int main(void) {
    test_split_check();
    if (dl_ckpt_open(&g_vec, DATA_DIR "/ltx2/transformer_vectors.safetensors", "ltx2 transformer vectors") != DL_OK) {
        fprintf(stderr, "%s\n", dl_last_error());
        return 1;
    }
    test_config("a", DL_F32);
    test_config("b", DL_F32);
    test_config("a", DL_BF16);
    test_config("b", DL_BF16);
    dl_ckpt_free(g_vec);
    test_refused();
    return test_done("test_ltx2_transformer");
}
