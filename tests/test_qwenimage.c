/* Qwen-Image against diffusers (tests/data/qwenimage, tools/parity/make_qwenimage_vectors.py):
 * two tiny random-weight QwenImagePipelines differing in heads, depth, MSRoPE axes and
 * VAE. One QwenImageTransformer2DModel call per config (f32 <= 1e-4 x max|ref|, bf16
 * PSNR), the same call built for a longer text with the prompt as the valid key count
 * (padding never attended: identical), and the refusals. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "difflet/qwenimage.h"
#include "difflet/registry.h"
#include <unistd.h>
#include "difflet/wan_vae.h"
#include "test_util.h"

static dl_checkpoint *g_vec;

/* a: 48x32 (latent 12x8, packed grid 4x6... as diffusers: h = 32/4 = 8 -> 4 rows) */
static void test_step(const char *v, int W, int H, int scale, dl_dtype dt, int64_t pad) {
    char path[256], name[64];
    snprintf(path, sizeof path, DATA_DIR "/qwenimage/%s", v);
    dl_model_dir *dir;
    if (dl_model_dir_open(&dir, path) != DL_OK) {
        CHECK(0, "open %s: %s", path, dl_last_error());
        return;
    }
    int64_t ls[8] = {0}, ts[8] = {0}, os[8] = {0};
    snprintf(name, sizeof name, "%s.step.latents", v);
    float *lat = test_vec(g_vec, name, NULL, ls);
    snprintf(name, sizeof name, "%s.step.txt", v);
    float *txt = test_vec(g_vec, name, NULL, ts);
    snprintf(name, sizeof name, "%s.step.t", v);
    float *t = test_vec(g_vec, name, NULL, NULL);
    snprintf(name, sizeof name, "%s.step.out", v);
    float *want = test_vec(g_vec, name, NULL, os);
    const int64_t gh = H / scale / 2, gw = W / scale / 2, L = ts[0], T = L + pad;
    dl_qwenimage *m = NULL;
    if (lat && txt && t && want && dl_qwenimage_load(&m, dir, "transformer", gh, gw, T, dt, NULL, NULL) == DL_OK) {
        float *tp = calloc((size_t)(T * ts[1]), 4), *got = calloc((size_t)(os[0] * os[1]), 4);
        memcpy(tp, txt, (size_t)(L * ts[1]) * 4);
        for (int64_t i = L * ts[1]; i < T * ts[1]; i++) tp[i] = (float)((i * 7919) % 13) - 6.f; /* padding: anything */
        CHECK(dl_qwenimage_run(m, lat, tp, L, t[0], got) == DL_OK, "%s run: %s", v, dl_last_error());
        double e = test_rel_err(got, want, os[0] * os[1]);
        printf("qwen-image %s transformer %s (text %lld of %lld rows): max err %.3g of max|ref|\n", v, dl_dtype_name(dt),
               (long long)L, (long long)T, e);
        CHECK(e <= (dt == DL_F32 ? 1e-4 : 2e-2), "%s %s transformer: %.3g", v, dl_dtype_name(dt), e);
        free(tp), free(got);
        dl_qwenimage_free(m);
    } else
        CHECK(0, "%s load: %s", v, dl_last_error());
    free(lat), free(txt), free(t), free(want);
    dl_model_dir_free(dir);
}

/* AutoencoderKLQwenImage: the causal VAE on one frame */
static void test_vae(const char *v, dl_dtype dt) {
    char path[256], name[64];
    snprintf(path, sizeof path, DATA_DIR "/qwenimage/%s", v);
    dl_model_dir *dir;
    if (dl_model_dir_open(&dir, path) != DL_OK) return;
    int64_t zs[8] = {0}, is[8] = {0};
    snprintf(name, sizeof name, "%s.vae.z", v);
    float *z = test_vec(g_vec, name, NULL, zs);
    snprintf(name, sizeof name, "%s.vae.image", v);
    float *want = test_vec(g_vec, name, NULL, is);
    dl_wan_vae *m = NULL;
    if (z && want && dl_wan_vae_load(&m, dir, "vae", zs[1], zs[2], zs[3], dt, NULL) == DL_OK) {
        int64_t n = is[0] * is[1] * is[2] * is[3];
        float *got = calloc((size_t)n, 4);
        CHECK(dl_wan_vae_frames(m) == 1 && dl_wan_vae_decode(m, z, got, NULL, NULL) == DL_OK, "%s vae: %s", v, dl_last_error());
        double e = test_rel_err(got, want, n);
        printf("qwen-image %s vae %s: max err %.3g of max|ref|\n", v, dl_dtype_name(dt), e);
        CHECK(e <= (dt == DL_F32 ? 1e-4 : 3e-2), "%s vae %s: %.3g", v, dl_dtype_name(dt), e);
        free(got);
        dl_wan_vae_free(m);
    } else
        CHECK(0, "%s vae load: %s", v, dl_last_error());
    free(z), free(want);
    dl_model_dir_free(dir);
}

/* The whole pipeline from the same packed latents, 4 steps, true CFG 4 with a negative
 * prompt (norm-preserving combination) and without one: the picture against
 * diffusers' (f32 >= 45 dB, bf16 >= 30 dB) */
static void test_pipeline(const char *v, int W, int H, dl_dtype dt) {
    static const char *prompts[2] = {"a red circle on a blue background",
                                     "A cosy kitchen: two cats bake a cake, sunlight through the window, flour everywhere, "
                                     "4K, ultra detailed, warm colours"};
    char path[256], name[64], lat_path[] = "/tmp/difflet_qi_lat_XXXXXX";
    snprintf(path, sizeof path, DATA_DIR "/qwenimage/%s", v);
    dl_gen_shape shape = {.width = W, .height = H, .frames = 1, .dt = dt};
    dl_pipeline *p;
    if (dl_pipeline_load(&p, path, &shape) != DL_OK) {
        CHECK(0, "%s pipeline load: %s", v, dl_last_error());
        return;
    }
    int fd = mkstemp(lat_path);
    if (fd >= 0) close(fd);
    for (int k = 0; k < 2; k++) {
        int64_t shp[8] = {0};
        snprintf(name, sizeof name, "%s.gen%d.latents", v, k);
        float *init = test_vec(g_vec, name, NULL, shp);
        snprintf(name, sizeof name, "%s.gen%d.image", v, k);
        float *want = test_vec(g_vec, name, NULL, NULL);
        dl_st_writer *w = dl_st_writer_new();
        dl_checkpoint *ck = NULL;
        if (!init || !want || dl_st_writer_add(w, "latents", DL_ST_F32, 2, shp, init) != DL_OK ||
            dl_st_writer_save(w, lat_path) != DL_OK || dl_ckpt_open(&ck, lat_path, NULL) != DL_OK) {
            CHECK(0, "%s gen%d inputs: %s", v, k, dl_last_error());
        } else {
            dl_gen_request r = {.prompt = prompts[k], .negative_prompt = k == 0 ? "blurry, low quality" : NULL, .steps = 4,
                                .true_cfg = 4.f, .guidance = 1.f, .init = ck, .want_pixels = 1};
            dl_media m;
            dl_gen_timing tm;
            if (dl_pipeline_generate(p, &r, &m, &tm) == DL_OK) {
                double db = test_psnr(m.pixels, want, (int64_t)W * H * 3, 1.0);
                printf("qwen-image %s pipeline %s, %s: PSNR %.1f dB (%d transformer calls)\n", v, dl_dtype_name(dt),
                       k == 0 ? "true CFG" : "no CFG", db, tm.denoiser_calls);
                CHECK(db >= (dt == DL_F32 ? 45.0 : 30.0), "%s gen%d %s: %.1f dB", v, k, dl_dtype_name(dt), db);
                CHECK(tm.denoiser_calls == (k == 0 ? 8 : 4), "%s gen%d: %d calls", v, k, tm.denoiser_calls);
                dl_media_free(&m);
            } else
                CHECK(0, "%s gen%d: %s", v, k, dl_last_error());
        }
        dl_ckpt_free(ck);
        dl_st_writer_free(w);
        free(init), free(want);
    }
    remove(lat_path);
    dl_pipeline_free(p);
}

int main(void) {
    if (dl_ckpt_open(&g_vec, DATA_DIR "/qwenimage/vectors.safetensors", "vectors") != DL_OK) {
        CHECK(0, "vectors: %s", dl_last_error());
        return test_done("test_qwenimage");
    }
    test_step("a", 48, 32, 4, DL_F32, 0);
    test_step("a", 48, 32, 4, DL_F32, 23);
    test_step("a", 48, 32, 4, DL_BF16, 0);
    test_step("b", 32, 64, 8, DL_F32, 0);
    test_step("b", 32, 64, 8, DL_F32, 9);
    test_step("b", 32, 64, 8, DL_BF16, 0);
    test_vae("a", DL_F32);
    test_vae("b", DL_F32);
    test_vae("a", DL_BF16);
    test_pipeline("a", 48, 32, DL_F32);
    test_pipeline("b", 32, 64, DL_F32);
    test_pipeline("a", 48, 32, DL_BF16);
    dl_ckpt_free(g_vec);
    return test_done("test_qwenimage");
}
