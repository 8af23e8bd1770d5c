/* AutoencoderKLWan decoder against diffusers (tests/data/wan/{a,b}/vae: random
 * weights; tests/data/wan/vectors.safetensors: `vae.decode(z)` of diffusers 0.42.1,
 * clamped). a: dim_mult [1, 2, 2], temperal_downsample [true, true] (4x time, 4x
 * space, 3 latent frames); b: dim_mult [1, 2, 2, 2], [false, true, true] (4x time,
 * 8x space, 2 latent frames, a 2-D resample level). Bars: f32 max|err| <= 1e-4 *
 * max|ref| (the issue's); bf16 PSNR >= 30 dB over the video (range 2). Also: decoding
 * twice gives the same bytes (the caches are cleared), progress per latent frame,
 * refusals with messages for broken folders and configs. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "difflet/wan_vae.h"
#include "test_util.h"

static dl_checkpoint *g_vec, *g_extra;
static int g_verbose;

/* fixture VAE v on vectors <key>.z -> <key>.video of ck: F x h x w latents, scales st / ss */
static void test_case(const char *v, dl_checkpoint *ck, const char *key, int64_t F, int64_t h, int64_t w, int st,
                      int ss, dl_dtype dt) {
    char dir[256], nm[64];
    snprintf(dir, sizeof dir, DATA_DIR "/wan/%s", v);
    dl_model_dir *md;
    if (dl_model_dir_open(&md, dir) != DL_OK) {
        CHECK(0, "%s", dl_last_error());
        return;
    }
    dl_wan_vae *m;
    if (dl_wan_vae_load(&m, md, "vae", F, h, w, dt, NULL) != DL_OK) {
        CHECK(0, "load %s: %s", v, dl_last_error());
        dl_model_dir_free(md);
        return;
    }
    const int64_t nf = 1 + (F - 1) * st, n = 3 * nf * h * ss * w * ss;
    CHECK(dl_wan_vae_z_dim(m) == 4 && dl_wan_vae_scale_spatial(m) == ss && dl_wan_vae_scale_temporal(m) == st &&
              dl_wan_vae_frames(m) == nf,
          "%s: z_dim %lld, scales %d %d, frames %lld", v, (long long)dl_wan_vae_z_dim(m), dl_wan_vae_scale_spatial(m),
          dl_wan_vae_scale_temporal(m), (long long)dl_wan_vae_frames(m));
    const float *mean = dl_wan_vae_latents_mean(m), *sd = dl_wan_vae_latents_std(m);
    CHECK(mean[0] == 0.1f && mean[3] == -0.05f && sd[1] == 0.8f && sd[2] == 2.0f, "%s: latents_mean / latents_std", v);
    int64_t nz, nv;
    snprintf(nm, sizeof nm, "%s.z", key);
    float *z = test_vec(ck, nm, &nz, NULL);
    snprintf(nm, sizeof nm, "%s.video", key);
    float *want = test_vec(ck, nm, &nv, NULL);
    float *got = malloc((size_t)n * 4), *again = malloc((size_t)n * 4);
    if (!z || !want || !got || !again || nz != 4 * F * h * w || nv != n) {
        CHECK(0, "%s: vectors missing or of the wrong size", key);
        goto out;
    }
    test_progress pg = {0};
    CHECK(dl_wan_vae_decode(m, z, got, test_on_progress, &pg) == DL_OK, "%s", dl_last_error());
    CHECK(pg.calls == F && pg.last == F && pg.total == F && !pg.out_of_order, "%s: progress %d calls, last %d of %d",
          key, pg.calls, pg.last, pg.total);
    if (dt == DL_F32) {
        double e = test_rel_err(got, want, n);
        CHECK(e <= 1e-4, "%s f32: max|err| %.3g of max|ref|", key, e);
        if (g_verbose) printf("%s f32: max|err| = %.3g of max|ref|\n", key, e);
    } else {
        double db = test_psnr(got, want, n, 2.0);
        CHECK(db >= 30.0, "%s bf16: PSNR %.1f dB < 30", key, db);
        if (g_verbose) printf("%s bf16: PSNR %.1f dB\n", key, db);
    }
    int clamped = 1;
    for (int64_t i = 0; i < n; i++) clamped &= got[i] >= -1.f && got[i] <= 1.f;
    CHECK(clamped, "%s: output outside [-1, 1]", key);
    memset(again, 0, (size_t)n * 4);
    CHECK(dl_wan_vae_decode(m, z, again, NULL, NULL) == DL_OK, "%s", dl_last_error());
    CHECK(!memcmp(got, again, (size_t)n * 4), "%s %s: a second decode differs (caches not cleared?)", key, dl_dtype_name(dt));
    z[5] = NAN;
    CHECK(dl_wan_vae_decode(m, z, again, NULL, NULL) == DL_ERR_INVALID, "%s: non-finite latent refused", key);
    if (g_verbose)
        printf("%s %s: %zu bytes of activations and caches\n", key, dl_dtype_name(dt), dl_wan_vae_activation_bytes(m));
out:
    free(z), free(want), free(got), free(again);
    dl_wan_vae_free(m);
    dl_model_dir_free(md);
}

/* A folder whose vae is fixture a's weights with config `cfg`; load gives `want`
 * and a message containing `says`. */
static void bad_config(const char *tmp, const char *cfg, dl_status want, const char *says) {
    if (!test_write_folder(tmp, "{\"_class_name\": \"WanPipeline\", \"vae\": [\"diffusers\", \"AutoencoderKLWan\"]}",
                           "vae", cfg, DATA_DIR "/wan/a/vae/diffusion_pytorch_model.safetensors", NULL, 0))
        return;
    dl_model_dir *md;
    if (dl_model_dir_open(&md, tmp) != DL_OK) {
        CHECK(0, "%s", dl_last_error());
        return;
    }
    dl_wan_vae *m = NULL;
    dl_status s = dl_wan_vae_load(&m, md, "vae", 2, 4, 4, DL_F32, NULL);
    CHECK(s == want && (m != NULL) == (want == DL_OK) && (want == DL_OK || strstr(dl_last_error(), says)), "config %s: status %d, \"%s\" (want %d, \"%s\")", cfg,
          (int)s, dl_last_error(), (int)want, says);
    if (g_verbose && want != DL_OK) printf("refused: %s\n", dl_last_error());
    dl_wan_vae_free(m);
    dl_model_dir_free(md);
}

/* fixture a's config with dim_mult, num_res_blocks and extra fields given (cJSON
 * reads the first of duplicate keys, so each field appears once) */
#define CFG(mult, nrb, extra)                                                                               \
    "{\"_class_name\": \"AutoencoderKLWan\", \"base_dim\": 8, \"z_dim\": 4, \"dim_mult\": " mult ", "   \
    "\"num_res_blocks\": " nrb ", \"temperal_downsample\": [true, true], \"scale_factor_spatial\": 4, "  \
    "\"latents_mean\": [0.1, -0.2, 0.3, -0.05], \"latents_std\": [1.5, 0.8, 2.0, 1.2]" extra "}"
#define A_CFG(extra) CFG("[1, 2, 2]", "1", extra)

static void test_refusals(void) {
    /* a component that is not there */
    dl_model_dir *md;
    if (dl_model_dir_open(&md, DATA_DIR "/wan/a") == DL_OK) {
        dl_wan_vae *m = NULL;
        CHECK(dl_wan_vae_load(&m, md, "no_such_vae", 2, 4, 4, DL_F32, NULL) != DL_OK && !m &&
                  strstr(dl_last_error(), "no_such_vae"),
              "missing component: %s", dl_last_error());
        CHECK(dl_wan_vae_load(&m, md, "vae", 0, 4, 4, DL_F32, NULL) == DL_ERR_INVALID && !m, "zero frames refused");
        CHECK(dl_wan_vae_load(&m, md, "vae", 2, 4, 4, DL_F16, NULL) == DL_ERR_UNSUPPORTED && !m, "f16 refused");
        dl_model_dir_free(md);
    } else {
        CHECK(0, "%s", dl_last_error());
    }
    char tmp[] = "/tmp/difflet_wanvae_XXXXXX";
    if (!mkdtemp(tmp)) {
        CHECK(0, "mkdtemp");
        return;
    }
    bad_config(tmp, A_CFG(""), DL_OK, ""); /* the folder itself is fine */
    /* wider channels than the checkpoint: the first tensor that disagrees is named */
    bad_config(tmp,
               "{\"base_dim\": 16, \"z_dim\": 4, \"dim_mult\": [1, 2, 2], \"num_res_blocks\": 1, "
               "\"temperal_downsample\": [true, true], \"scale_factor_spatial\": 4, "
               "\"latents_mean\": [0, 0, 0, 0], \"latents_std\": [1, 1, 1, 1]}",
               DL_ERR_FORMAT, "decoder.conv_in.");
    bad_config(tmp, CFG("[1, 2, 2]", "2", ""), DL_ERR_FORMAT, "resnets.2.");
    bad_config(tmp, A_CFG(", \"is_residual\": true"), DL_ERR_UNSUPPORTED, "is_residual");
    bad_config(tmp, A_CFG(", \"patch_size\": 2"), DL_ERR_UNSUPPORTED, "patch_size");
    bad_config(tmp, A_CFG(", \"scale_factor_temporal\": 8"), DL_ERR_FORMAT, "scale_factor_temporal");
    bad_config(tmp,
               "{\"base_dim\": 8, \"z_dim\": 4, \"dim_mult\": [1, 2, 2], \"num_res_blocks\": 1, "
               "\"temperal_downsample\": [true], \"latents_mean\": [0, 0, 0, 0], \"latents_std\": [1, 1, 1, 1]}",
               DL_ERR_FORMAT, "temperal_downsample");
    bad_config(tmp,
               "{\"base_dim\": 8, \"z_dim\": 4, \"dim_mult\": [1, 2, 2], \"num_res_blocks\": 1, "
               "\"temperal_downsample\": [true, true], \"scale_factor_spatial\": 4}",
               DL_ERR_FORMAT, "latents_mean");
    bad_config(tmp, "{\"_class_name\": \"AutoencoderKL\"}", DL_ERR_UNSUPPORTED, "AutoencoderKL");
    bad_config(tmp, CFG("\"wide\"", "1", ""), DL_ERR_FORMAT, "dim_mult");
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    CHECK(system(cmd) == 0, "cleanup %s", tmp);
}

int main(void) {
    g_verbose = getenv("DIFFLET_TEST_VERBOSE") != NULL;
    if (dl_ckpt_open(&g_vec, DATA_DIR "/wan/vectors.safetensors", "vectors") != DL_OK) {
        fprintf(stderr, "%s\n", dl_last_error());
        return 1;
    }
    if (dl_ckpt_open(&g_extra, DATA_DIR "/wan/vae_extra.safetensors", "vae_extra") != DL_OK) {
        fprintf(stderr, "%s\n", dl_last_error());
        return 1;
    }
    for (int k = 0; k < 2; k++) {
        dl_dtype dt = k ? DL_BF16 : DL_F32;
        test_case("a", g_vec, "a.vae", 3, 8, 12, 4, 4, dt);
        test_case("b", g_vec, "b.vae", 2, 6, 4, 4, 8, dt);
        test_case("b", g_extra, "one", 1, 2, 3, 4, 8, dt);
        test_case("a", g_extra, "long", 5, 3, 5, 4, 4, dt);
    }
    test_refusals();
    dl_ckpt_free(g_vec), dl_ckpt_free(g_extra);
    return test_done("test_wan_vae");
}
