/* HunyuanVideo against diffusers, component by component (tests/data/hunyuan,
 * tools/parity/make_hunyuan_vectors.py): the token refiner with a right-padded text
 * mask and with every row real, each row within 1e-4 of its max|ref| in f32 (the
 * issue's component bar) and 2^-5 in bf16. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "difflet/hunyuan.h"
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


static void test_refiner(dl_model_dir *dir, dl_dtype dt) {
    const int64_t T = 40;
    dl_hunyuan_refiner *m;
    if (dl_hunyuan_refiner_load(&m, dir, "transformer", T, dt, NULL) != DL_OK) {
        CHECK(0, "refiner: %s", dl_last_error());
        return;
    }
    const int64_t D = dl_hunyuan_refiner_width(m);
    CHECK(D == 32, "refiner width %lld", (long long)D);
    float *got = malloc((size_t)(T * D) * 4);
    for (int k = 0; k < 2; k++) {
        const char *key = k ? "refiner_full" : "refiner";
        char nm[64];
        int64_t n;
        snprintf(nm, sizeof nm, "%s.text", key);
        float *text = vec(nm, &n);
        snprintf(nm, sizeof nm, "%s.valid", key);
        float *valid = vec(nm, NULL);
        snprintf(nm, sizeof nm, "%s.t", key);
        float *t = vec(nm, NULL);
        snprintf(nm, sizeof nm, "%s.out", key);
        float *want = vec(nm, NULL);
        if (!text || !valid || !t || !want || n != T * 48) {
            CHECK(0, "vectors of %s", key);
        } else {
            CHECK(dl_hunyuan_refiner_run(m, text, (int64_t)valid[0], t[0], got) == DL_OK, "%s", dl_last_error());
            double e = test_row_err(got, want, T, D), bar = dt == DL_F32 ? 1e-4 : 1.0 / 32;
            CHECK(e <= bar, "token refiner (%s, %s): worst row %.3g of its max|ref| (bound %.3g)", key, dl_dtype_name(dt), e, bar);
            if (getenv("DIFFLET_TEST_VERBOSE")) printf("refiner %s %s: %.3g\n", key, dl_dtype_name(dt), e);
        }
        free(text), free(valid), free(t), free(want);
    }
    float z[40 * 48] = {0};
    CHECK(dl_hunyuan_refiner_run(m, z, 0, 1.f, got) == DL_ERR_INVALID && dl_hunyuan_refiner_run(m, z, T + 1, 1.f, got) == DL_ERR_INVALID &&
              dl_hunyuan_refiner_run(m, z, 3, NAN, got) == DL_ERR_INVALID,
          "refiner: 0 or more than T real rows, a non-finite timestep refused");
    free(got);
    dl_hunyuan_refiner_free(m);
}

int main(void) {
    if (dl_ckpt_open(&g_vec, DATA_DIR "/hunyuan/vectors.safetensors", "hunyuan vectors") != DL_OK) {
        fprintf(stderr, "%s\n", dl_last_error());
        return 1;
    }
    dl_model_dir *dir;
    if (dl_model_dir_open(&dir, DATA_DIR "/hunyuan") != DL_OK) {
        fprintf(stderr, "%s\n", dl_last_error());
        return 1;
    }
    test_refiner(dir, DL_F32);
    test_refiner(dir, DL_BF16);
    dl_model_dir_free(dir);
    dl_ckpt_free(g_vec);
    return test_done("test_hunyuan");
}
