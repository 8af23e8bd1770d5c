/* LTX-2 against diffusers, component by component (tests/data/ltx2,
 * tools/parity/make_ltx2_connector_vectors.py): the text connectors of both
 * generations (a: LTX-2.0, masked mean/range norm, registers, interleaved RoPE; b:
 * LTX-2.3, per-token RMS norm, per-modality projections, no registers, split RoPE,
 * gated attention), with a left-padded and a full prompt: each output row within
 * 1e-4 of its max|ref| in f32 (the component bar) and 2^-5 in bf16. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "difflet/ltx2.h"
#include "test_util.h"

static dl_checkpoint *g_vec;

static float *vec(const char *name, int64_t *n) {
    const dl_st_tensor *t = dl_ckpt_find(g_vec, name);
    float *p = t ? malloc((size_t)t->numel * 4) : NULL;
    if (!p || dl_ckpt_read(t, DL_F32, p) != DL_OK) {
        fprintf(stderr, "no vector %s\n", name);
        free(p);
        return NULL;
    }
    if (n) *n = t->numel;
    return p;
}

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
        float *hidden = vec(nm, &n);
        snprintf(nm, sizeof nm, "%s.%s.valid", cfg, key);
        float *valid = vec(nm, NULL);
        snprintf(nm, sizeof nm, "%s.%s.video", cfg, key);
        float *wv = vec(nm, NULL);
        snprintf(nm, sizeof nm, "%s.%s.audio", cfg, key);
        float *wa = vec(nm, NULL);
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
    return test_done("test_ltx2");
}
