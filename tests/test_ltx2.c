/* LTX-2 against diffusers, component by component (tests/data/ltx2,
 * tools/parity/make_ltx2_connector_vectors.py): the text connectors of both
 * generations (a: LTX-2.0, masked mean/range norm, registers, interleaved RoPE; b:
 * LTX-2.3, per-token RMS norm, per-modality projections, no registers, split RoPE,
 * gated attention), with a left-padded and a full prompt: each output row within
 * 1e-4 of its max|ref| in f32 (the component bar) and 2^-5 in bf16. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "difflet/gemma3.h"
#include "difflet/ltx2.h"
#include "difflet/text.h"
#include "test_util.h"

static dl_checkpoint *g_vec;

static void test_connectors(const char *cfg, dl_dtype dt) {
    const int64_t T = 16;
    char path[256], nm[64];
    snprintf(path, sizeof path, DATA_DIR "/ltx2/%s", cfg);
    dl_model_dir *dir;
    dl_ltx2_connectors *m = NULL;
    if (dl_model_dir_open(&dir, path) != DL_OK || dl_ltx2_connectors_load(&m, dir, "connectors", T, dt, NULL) != DL_OK) {
        CHECK(0, "connectors %s: %s", cfg, dl_last_error());
        if (dir) dl_model_dir_free(dir);
        return;
    }
    int64_t C, L1;
    dl_ltx2_connectors_text_dims(m, &C, &L1);
    const int64_t Dv = dl_ltx2_connectors_video_width(m), Da = dl_ltx2_connectors_audio_width(m);
    float *gv = malloc((size_t)(T * Dv) * 4), *ga = malloc((size_t)(T * Da) * 4);
    for (int k = 0; k < 2; k++) {
        const char *key = k ? "full" : "pad";
        int64_t n;
        snprintf(nm, sizeof nm, "%s.%s.hidden", cfg, key);
        float *hidden = test_vec(g_vec, nm, &n, NULL);
        snprintf(nm, sizeof nm, "%s.%s.valid", cfg, key);
        float *valid = test_vec(g_vec, nm, NULL, NULL);
        snprintf(nm, sizeof nm, "%s.%s.video", cfg, key);
        float *wv = test_vec(g_vec, nm, NULL, NULL);
        snprintf(nm, sizeof nm, "%s.%s.audio", cfg, key);
        float *wa = test_vec(g_vec, nm, NULL, NULL);
        if (!hidden || !valid || !wv || !wa || n != T * C * L1) {
            CHECK(0, "vectors of %s.%s", cfg, key);
        } else {
            CHECK(dl_ltx2_connectors_run(m, hidden, (int64_t)valid[0], gv, ga) == DL_OK, "%s", dl_last_error());
            double ev = test_row_err(gv, wv, T, Dv), ea = test_row_err(ga, wa, T, Da), bar = dt == DL_F32 ? 1e-4 : 1.0 / 32;
            CHECK(ev <= bar && ea <= bar, "connectors %s.%s (%s): worst rows video %.3g, audio %.3g of their max|ref| (bound %.3g)",
                  cfg, key, dl_dtype_name(dt), ev, ea, bar);
            if (getenv("DIFFLET_TEST_VERBOSE"))
                printf("connectors %s.%s %s: video %.3g audio %.3g\n", cfg, key, dl_dtype_name(dt), ev, ea);
            if (k == 0)
                CHECK(dl_ltx2_connectors_run(m, hidden, 0, gv, ga) == DL_ERR_INVALID &&
                          dl_ltx2_connectors_run(m, hidden, T + 1, gv, ga) == DL_ERR_INVALID,
                      "connectors: 0 or more than T real rows refused");
        }
        free(hidden), free(valid), free(wv), free(wa);
    }
    free(gv), free(ga);
    dl_ltx2_connectors_free(m);
    /* 12 rows are not a multiple of config a's 8 registers */
    if (cfg[0] == 'a')
        CHECK(dl_ltx2_connectors_load(&m, dir, "connectors", 12, dt, NULL) == DL_ERR_INVALID && strstr(dl_last_error(), "registers"),
              "a text length the registers do not divide: %s", dl_last_error());
    dl_model_dir_free(dir);
}

/* the text path end to end (tests/data/ltx2/text, make_ltx2_text_vectors.py): the
 * prompt stripped, Gemma's tokenizer left-padding or truncating to 16 tokens, every
 * Gemma 3 hidden state stacked, the connectors (LTX-2.3 generation): the stacked states
 * within 1e-5 and the streams within 1e-4 of their rows' max|ref| in f32 */
static void test_text_path(dl_dtype dt) {
    static const char *prompts[3] = {
        "  A red circle moves to the right.  ",
        "a small green square slides down on a blue background while the camera pans slowly and the light "
        "changes from morning to evening over the whole scene",
        "caf\xc3\xa9 \xf0\x9f\x8e\xa5 x"};
    const int T = 16;
    dl_model_dir *dir = NULL;
    dl_tokenizer *tok = NULL;
    dl_gemma3_text *te = NULL;
    dl_ltx2_connectors *cn = NULL;
    if (dl_model_dir_open(&dir, DATA_DIR "/ltx2/text") != DL_OK || dl_tokenizer_load(&tok, DATA_DIR "/ltx2/text/tokenizer") != DL_OK ||
        dl_gemma3_text_load(&te, dir, "text_encoder", T, dt, NULL) != DL_OK ||
        dl_ltx2_connectors_load(&cn, dir, "connectors", T, dt, NULL) != DL_OK) {
        CHECK(0, "text path: %s", dl_last_error());
    } else {
        int64_t C, L1;
        dl_ltx2_connectors_text_dims(cn, &C, &L1);
        const int64_t Dv = dl_ltx2_connectors_video_width(cn), Da = dl_ltx2_connectors_audio_width(cn);
        float *emb = malloc((size_t)(T * C * L1) * 4), *v = malloc((size_t)(T * Dv) * 4), *a = malloc((size_t)(T * Da) * 4);
        for (int i = 0; i < 3; i++) {
            char nm[32];
            snprintf(nm, sizeof nm, "%d.embeds", i);
            float *we = test_vec(g_vec, nm, NULL, NULL);
            snprintf(nm, sizeof nm, "%d.valid", i);
            float *wn = test_vec(g_vec, nm, NULL, NULL);
            snprintf(nm, sizeof nm, "%d.video", i);
            float *wv = test_vec(g_vec, nm, NULL, NULL);
            snprintf(nm, sizeof nm, "%d.audio", i);
            float *wa = test_vec(g_vec, nm, NULL, NULL);
            int64_t valid = 0;
            int ok = we && wn && wv && wa && dl_ltx2_text_embeds(tok, te, cn, prompts[i], T, emb, v, a, &valid, NULL) == DL_OK;
            CHECK(ok, "text path %d: %s", i, dl_last_error());
            if (ok) {
                double ee = test_row_err(emb, we, T, C * L1), ev = test_row_err(v, wv, T, Dv), ea = test_row_err(a, wa, T, Da);
                double be = dt == DL_F32 ? 1e-5 : 1.0 / 32, bs = dt == DL_F32 ? 1e-4 : 1.0 / 16;
                CHECK(valid == (int64_t)wn[0] && ee <= be && ev <= bs && ea <= bs,
                      "text path %d (%s): %lld valid (want %g), stacked states %.3g, video %.3g, audio %.3g", i,
                      dl_dtype_name(dt), (long long)valid, wn[0], ee, ev, ea);
                if (getenv("DIFFLET_TEST_VERBOSE"))
                    printf("text path %d %s: valid %lld, states %.3g, video %.3g, audio %.3g\n", i, dl_dtype_name(dt),
                           (long long)valid, ee, ev, ea);
            }
            free(we), free(wn), free(wv), free(wa);
        }
        free(emb), free(v), free(a);
    }
    dl_ltx2_connectors_free(cn);
    dl_gemma3_text_free(te);
    dl_tokenizer_free(tok);
    dl_model_dir_free(dir);
}

int main(void) {
    if (dl_ckpt_open(&g_vec, DATA_DIR "/ltx2/connector_vectors.safetensors", "ltx2 vectors") != DL_OK) {
        fprintf(stderr, "%s\n", dl_last_error());
        return 1;
    }
    test_connectors("a", DL_F32);
    test_connectors("b", DL_F32);
    test_connectors("a", DL_BF16);
    test_connectors("b", DL_BF16);
    dl_ckpt_free(g_vec);
    if (dl_ckpt_open(&g_vec, DATA_DIR "/ltx2/text_vectors.safetensors", "ltx2 text vectors") != DL_OK) {
        fprintf(stderr, "%s\n", dl_last_error());
        return 1;
    }
    test_text_path(DL_F32);
    test_text_path(DL_BF16);
    dl_ckpt_free(g_vec);
    return test_done("test_ltx2");
}
