/* AutoencoderKLHunyuanVideo decoder against diffusers (tests/data/hunyuan_vae/{a,b,c}/vae:
 * random weights; tests/data/hunyuan_vae/vectors.safetensors: `vae.decode(z).sample`
 * of diffusers 0.42.1, written by tools/parity/make_hunyuan_vae_vectors.py).
 * a: block_out_channels (4, 8, 8), mid attention, 4x space; b: (4, 4, 8, 8), no mid
 * attention, a space-only upsampler, 8x space; c: (4, 8, 8), layers_per_block 2,
 * 8x space with the last block upsampling. Cases: one decode (F 3, F 1) and
 * temporal tiling (F 5, 6, 7: two tiles blended; F 7's third tile adds nothing).
 * Bars: f32 max|err| <= 1e-4 * max|ref| (the issue's); bf16 PSNR >= 30 dB (peak to
 * peak 2). Also: decoding twice gives the same bytes, progress per tile in order,
 * refusals with messages for broken folders, configs and checkpoints. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "difflet/hunyuan_vae.h"
#include "test_util.h"

static dl_checkpoint *g_vec;
static int g_verbose;

/* fixture VAE v on vectors <key>.z -> <key>.video: F x h x w latents, spatial scale ss, `tiles` tiles */
static void test_case(const char *v, const char *key, int64_t F, int64_t h, int64_t w, int ss, int tiles, dl_dtype dt) {
    char dir[256], nm[64];
    snprintf(dir, sizeof dir, DATA_DIR "/hunyuan_vae/%s", v);
    dl_model_dir *md;
    if (dl_model_dir_open(&md, dir) != DL_OK) {
        CHECK(0, "%s", dl_last_error());
        return;
    }
    dl_hunyuan_vae *m;
    if (dl_hunyuan_vae_load(&m, md, "vae", F, h, w, dt, NULL) != DL_OK) {
        CHECK(0, "load %s: %s", v, dl_last_error());
        dl_model_dir_free(md);
        return;
    }
    const int64_t nf = 1 + (F - 1) * 4, n = 3 * nf * h * ss * w * ss;
    CHECK(dl_hunyuan_vae_latent_channels(m) == 4 && dl_hunyuan_vae_scale_spatial(m) == ss &&
              dl_hunyuan_vae_scale_temporal(m) == 4 && dl_hunyuan_vae_frames(m) == nf && dl_hunyuan_vae_tiles(m) == tiles,
          "%s: channels %lld, scales %d %d, frames %lld, tiles %d", key, (long long)dl_hunyuan_vae_latent_channels(m),
          dl_hunyuan_vae_scale_spatial(m), dl_hunyuan_vae_scale_temporal(m), (long long)dl_hunyuan_vae_frames(m),
          dl_hunyuan_vae_tiles(m));
    CHECK(fabsf(dl_hunyuan_vae_scaling_factor(m) - 0.476986f) < 1e-7f, "%s: scaling_factor %g", key,
          dl_hunyuan_vae_scaling_factor(m));
    int64_t nz, nv;
    snprintf(nm, sizeof nm, "%s.z", key);
    float *z = test_vec(g_vec, nm, &nz, NULL);
    snprintf(nm, sizeof nm, "%s.video", key);
    float *want = test_vec(g_vec, nm, &nv, NULL);
    float *got = malloc((size_t)n * 4), *again = malloc((size_t)n * 4);
    if (!z || !want || !got || !again || nz != 4 * F * h * w || nv != n) {
        CHECK(0, "%s: vectors missing or of the wrong size", key);
        goto out;
    }
    test_progress pg = {0};
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    CHECK(dl_hunyuan_vae_decode(m, z, got, test_on_progress, &pg) == DL_OK, "%s", dl_last_error());
    clock_gettime(CLOCK_MONOTONIC, &t1);
    CHECK(pg.calls == tiles && pg.last == tiles && pg.total == tiles && !pg.out_of_order && !pg.total_changed,
          "%s: progress %d calls, last %d of %d", key, pg.calls, pg.last, pg.total);
    const double ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
    if (dt == DL_F32) {
        double e = test_rel_err(got, want, n);
        CHECK(e <= 1e-4, "%s f32: max|err| %.3g of max|ref|", key, e);
        if (g_verbose) printf("%s f32: max|err| = %.3g of max|ref| (%.1f ms)\n", key, e, ms);
    } else {
        double db = test_psnr(got, want, n, 2.0);
        CHECK(db >= 30.0, "%s bf16: PSNR %.1f dB < 30", key, db);
        if (g_verbose) printf("%s bf16: PSNR %.1f dB (%.1f ms)\n", key, db, ms);
    }
    memset(again, 0, (size_t)n * 4);
    CHECK(dl_hunyuan_vae_decode(m, z, again, NULL, NULL) == DL_OK, "%s", dl_last_error());
    CHECK(!memcmp(got, again, (size_t)n * 4), "%s %s: a second decode differs", key, dl_dtype_name(dt));
    z[nz - 1] = NAN;
    CHECK(dl_hunyuan_vae_decode(m, z, again, NULL, NULL) == DL_ERR_INVALID, "%s: non-finite latent refused", key);
    if (g_verbose) printf("%s %s: %zu bytes of activations\n", key, dl_dtype_name(dt), dl_hunyuan_vae_activation_bytes(m));
out:
    free(z), free(want), free(got), free(again);
    dl_hunyuan_vae_free(m);
    dl_model_dir_free(md);
}

/* A folder whose vae is config `cfg` with fixture a's weights (or, weights given, a
 * file holding those nw bytes); load gives `want` and a message containing `says`. */
static void bad_folder_w(const char *tmp, const char *cfg, const char *weights, size_t nw, dl_status want,
                         const char *says) {
    if (!test_write_folder(
            tmp, "{\"_class_name\": \"HunyuanVideoPipeline\", \"vae\": [\"diffusers\", \"AutoencoderKLHunyuanVideo\"]}",
            "vae", cfg, DATA_DIR "/hunyuan_vae/a/vae/diffusion_pytorch_model.safetensors", weights, nw))
        return;
    dl_model_dir *md;
    if (dl_model_dir_open(&md, tmp) != DL_OK) {
        CHECK(0, "%s", dl_last_error());
        return;
    }
    dl_hunyuan_vae *m = NULL;
    dl_status s = dl_hunyuan_vae_load(&m, md, "vae", 2, 2, 3, DL_F32, NULL);
    CHECK(s == want && (m != NULL) == (want == DL_OK) && (want == DL_OK || strstr(dl_last_error(), says)),
          "config %s: status %d, \"%s\" (want %d, \"%s\")", cfg, (int)s, dl_last_error(), (int)want, says);
    if (g_verbose && want != DL_OK) printf("refused: %s\n", dl_last_error());
    dl_hunyuan_vae_free(m);
    dl_model_dir_free(md);
}

static void bad_folder(const char *tmp, const char *cfg, const char *weights, dl_status want, const char *says) {
    bad_folder_w(tmp, cfg, weights, weights ? strlen(weights) : 0, want, says);
}

/* a config with block_out_channels, layers_per_block and extra fields given */
#define CFG(boc, lpb, extra)                                                                            \
    "{\"_class_name\": \"AutoencoderKLHunyuanVideo\", \"latent_channels\": 4, \"block_out_channels\": " \
    boc ", \"layers_per_block\": " lpb extra "}"
#define UP3 ", \"up_block_types\": [\"HunyuanVideoUpBlock3D\", \"HunyuanVideoUpBlock3D\", \"HunyuanVideoUpBlock3D\"]"
#define A_CFG(extra) CFG("[4, 8, 8]", "1", extra UP3 ", \"norm_num_groups\": 4, \"spatial_compression_ratio\": 4")

static void test_refusals(void) {
    dl_model_dir *md;
    if (dl_model_dir_open(&md, DATA_DIR "/hunyuan_vae/a") == DL_OK) {
        dl_hunyuan_vae *m = NULL;
        CHECK(dl_hunyuan_vae_load(&m, md, "no_such_vae", 2, 4, 4, DL_F32, NULL) != DL_OK && !m &&
                  strstr(dl_last_error(), "no_such_vae"),
              "missing component: %s", dl_last_error());
        CHECK(dl_hunyuan_vae_load(&m, md, "vae", 0, 4, 4, DL_F32, NULL) == DL_ERR_INVALID && !m, "zero frames refused");
        CHECK(dl_hunyuan_vae_load(&m, md, "vae", 2, 4, 4, DL_F16, NULL) == DL_ERR_UNSUPPORTED && !m, "f16 refused");
        dl_model_dir_free(md);
    } else {
        CHECK(0, "%s", dl_last_error());
    }
    char tmp[] = "/tmp/difflet_hvae_XXXXXX";
    if (!mkdtemp(tmp)) {
        CHECK(0, "mkdtemp");
        return;
    }
    bad_folder(tmp, A_CFG(""), NULL, DL_OK, ""); /* the folder itself is fine */
    /* wider channels than the checkpoint: the first tensor that disagrees is named */
    bad_folder(tmp, CFG("[4, 8, 16]", "1", UP3 ", \"norm_num_groups\": 4, \"spatial_compression_ratio\": 4"), NULL,
               DL_ERR_FORMAT, "decoder.conv_in.");
    bad_folder(tmp, CFG("[4, 8, 8]", "2", UP3 ", \"norm_num_groups\": 4, \"spatial_compression_ratio\": 4"), NULL,
               DL_ERR_FORMAT, "resnets.2.");
    bad_folder(tmp, CFG("[4, 8, 8]", "0", UP3 ", \"norm_num_groups\": 4, \"spatial_compression_ratio\": 4"), NULL,
               DL_ERR_FORMAT, "resnets.1.");
    bad_folder(tmp, A_CFG(", \"mid_block_add_attention\": false"), NULL, DL_ERR_FORMAT, "attentions.0");
    bad_folder(tmp, CFG("[4, 8, 8]", "1", UP3 ", \"norm_num_groups\": 4, \"spatial_compression_ratio\": 8"), NULL,
               DL_ERR_FORMAT, "upsamplers.0");
    bad_folder(tmp, CFG("[4, 8, 8]", "1", UP3 ", \"norm_num_groups\": 3"), NULL, DL_ERR_FORMAT, "norm_num_groups");
    bad_folder(tmp, A_CFG(", \"act_fn\": \"gelu\""), NULL, DL_ERR_UNSUPPORTED, "act_fn");
    bad_folder(tmp, A_CFG(", \"out_channels\": 4"), NULL, DL_ERR_UNSUPPORTED, "out_channels");
    bad_folder(tmp, A_CFG(", \"temporal_compression_ratio\": 8"), NULL, DL_ERR_UNSUPPORTED, "temporal_compression_ratio");
    bad_folder(tmp, CFG("[4, 8, 8]", "1", UP3 ", \"norm_num_groups\": 4, \"spatial_compression_ratio\": 6"), NULL,
               DL_ERR_UNSUPPORTED, "spatial_compression_ratio");
    bad_folder(tmp, CFG("[4, 8]", "1", ", \"up_block_types\": [\"HunyuanVideoUpBlock3D\", \"HunyuanVideoUpBlock3D\"], "
                                     "\"norm_num_groups\": 4, \"spatial_compression_ratio\": 4"),
               NULL, DL_ERR_UNSUPPORTED, "temporal_compression_ratio 4");
    bad_folder(tmp, CFG("[4, 8, 8]", "1", ", \"up_block_types\": [\"HunyuanVideoUpBlock3D\", \"UpDecoderBlock2D\", "
                                          "\"HunyuanVideoUpBlock3D\"], \"norm_num_groups\": 4, \"spatial_compression_ratio\": 4"),
               NULL, DL_ERR_UNSUPPORTED, "UpDecoderBlock2D");
    bad_folder(tmp, CFG("[4, 8, 8]", "1", ", \"norm_num_groups\": 4, \"spatial_compression_ratio\": 4"), NULL,
               DL_ERR_FORMAT, "up_block_types"); /* the default four blocks, three channel counts */
    bad_folder(tmp, CFG("\"wide\"", "1", UP3), NULL, DL_ERR_FORMAT, "block_out_channels");
    bad_folder(tmp, "{\"_class_name\": \"AutoencoderKLWan\"}", NULL, DL_ERR_UNSUPPORTED, "AutoencoderKLWan");
    /* checkpoints that are not safetensors files: too short, a header that is not JSON */
    bad_folder(tmp, A_CFG(""), "abc", DL_ERR_FORMAT, "vae/diffusion_pytorch_model.safetensors");
    static const char bad_hdr[] = "\x10\0\0\0\0\0\0\0{not json}      ";
    bad_folder_w(tmp, A_CFG(""), bad_hdr, sizeof bad_hdr - 1, DL_ERR_FORMAT, "vae/diffusion_pytorch_model.safetensors");
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    CHECK(system(cmd) == 0, "cleanup %s", tmp);
}

int main(void) {
    g_verbose = getenv("DIFFLET_TEST_VERBOSE") != NULL;
    if (dl_ckpt_open(&g_vec, DATA_DIR "/hunyuan_vae/vectors.safetensors", "vectors") != DL_OK) {
        fprintf(stderr, "%s\n", dl_last_error());
        return 1;
    }
    for (int k = 0; k < 2; k++) {
        dl_dtype dt = k ? DL_BF16 : DL_F32;
        test_case("a", "a.short", 3, 3, 5, 4, 1, dt);
        test_case("a", "a.long", 7, 2, 3, 4, 2, dt);
        test_case("b", "b.long", 6, 1, 2, 8, 2, dt);
        test_case("b", "b.one", 1, 1, 3, 8, 1, dt);
        test_case("c", "c.five", 5, 2, 1, 8, 2, dt);
    }
    test_refusals();
    dl_ckpt_free(g_vec);
    return test_done("test_hunyuan_vae");
}
