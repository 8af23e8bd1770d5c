/* AutoencoderKLLTX2Video decoder against diffusers (tests/data/ltx2_vae/{a,b,c}/vae:
 * random weights; tests/data/ltx2_vae/vectors.safetensors: `vae.decode(z, temb).sample`
 * of diffusers 0.42.1, written by tools/parity/make_ltx2_vae_vectors.py).
 * a: timestep conditioning, non-causal, reflect padding, upsamplers spatiotemporal /
 * spatial / temporal (residual, factor 2), patch 3: 12x space, 4x time; b: no
 * timestep conditioning, causal, zeros padding, up-block conv_ins (LayerNorm + 1x1x1
 * shortcut), a block without upsampler, factor 1 and 2, residual on and off, layers
 * (1, 2, 0, 1), patch 2: 4x space, 4x time; c: b with patch_size_t 2, out_channels 6,
 * replicate padding; b.circular: b's weights under circular padding. Two frame
 * counts per VAE, non-square latents.
 * Bars: f32 max|err| <= 1e-4 * max|ref| (the issue's); bf16 PSNR >= 30 dB (peak to
 * peak 2). Also: decoding twice gives the same bytes, progress per stage in order,
 * the checkpoint's latents_mean / latents_std, refusals with messages for broken
 * folders, configs and checkpoints. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "difflet/ltx2_vae.h"
#include "test_util.h"

static dl_checkpoint *g_vec;
static int g_verbose;

typedef struct {
    const char *vae, *key;
    int64_t zc, F, h, w;
    int ss, ts, pt, stages, tc;
} tcase;

/* the latents_mean / latents_std buffers against the checkpoint's */
static void check_buffers(dl_ltx2_vae *m, const char *v, int64_t zc) {
    char p[256];
    snprintf(p, sizeof p, DATA_DIR "/ltx2_vae/%s/vae/diffusion_pytorch_model.safetensors", v);
    dl_checkpoint *ck;
    if (dl_ckpt_open(&ck, p, "vae") != DL_OK) {
        CHECK(0, "%s", dl_last_error());
        return;
    }
    int64_t n1 = 0, n2 = 0;
    float *mu = test_vec(ck, "latents_mean", &n1, NULL), *sd = test_vec(ck, "latents_std", &n2, NULL);
    CHECK(mu && sd && n1 == zc && n2 == zc && !memcmp(mu, dl_ltx2_vae_latents_mean(m), (size_t)zc * 4) &&
              !memcmp(sd, dl_ltx2_vae_latents_std(m), (size_t)zc * 4) && sd[0] != 1.f,
          "%s: latents_mean / latents_std differ from the checkpoint's", v);
    free(mu), free(sd);
    dl_ckpt_free(ck);
}

/* case c of the VAE in folder dir (weights of fixture c->vae) */
static void test_case(const tcase *c, const char *dir, dl_dtype dt) {
    char nm[64];
    dl_model_dir *md;
    if (dl_model_dir_open(&md, dir) != DL_OK) {
        CHECK(0, "%s", dl_last_error());
        return;
    }
    dl_ltx2_vae *m;
    if (dl_ltx2_vae_load(&m, md, "vae", c->F, c->h, c->w, dt, NULL) != DL_OK) {
        CHECK(0, "load %s: %s", c->vae, dl_last_error());
        dl_model_dir_free(md);
        return;
    }
    const int64_t nf = (1 + (c->F - 1) * c->ts) * c->pt, n = 3 * nf * c->h * c->ss * c->w * c->ss;
    CHECK(dl_ltx2_vae_latent_channels(m) == c->zc && dl_ltx2_vae_video_channels(m) == 3 &&
              dl_ltx2_vae_scale_spatial(m) == c->ss && dl_ltx2_vae_scale_temporal(m) == c->ts &&
              dl_ltx2_vae_frames(m) == nf && dl_ltx2_vae_timestep_conditioning(m) == c->tc,
          "%s: channels %lld, scales %d %d, frames %lld, tc %d", c->key, (long long)dl_ltx2_vae_latent_channels(m),
          dl_ltx2_vae_scale_spatial(m), dl_ltx2_vae_scale_temporal(m), (long long)dl_ltx2_vae_frames(m),
          dl_ltx2_vae_timestep_conditioning(m));
    const float sf = c->tc ? 0.7f : 1.f;
    CHECK(dl_ltx2_vae_scaling_factor(m) == sf, "%s: scaling_factor %g", c->key, dl_ltx2_vae_scaling_factor(m));
    check_buffers(m, c->vae, c->zc);
    int64_t nz = 0, nv = 0;
    float temb = 0;
    snprintf(nm, sizeof nm, "%s.z", c->key);
    float *z = test_vec(g_vec, nm, &nz, NULL);
    snprintf(nm, sizeof nm, "%s.video", c->key);
    float *want = test_vec(g_vec, nm, &nv, NULL);
    if (c->tc) {
        snprintf(nm, sizeof nm, "%s.temb", c->key);
        float *t = test_vec(g_vec, nm, NULL, NULL);
        CHECK(t != NULL, "%s: no temb", c->key);
        if (t) temb = *t;
        free(t);
    }
    float *got = malloc((size_t)n * 4), *again = malloc((size_t)n * 4);
    if (!z || !want || !got || !again || nz != c->zc * c->F * c->h * c->w || nv != n) {
        CHECK(0, "%s: vectors missing or of the wrong size", c->key);
        goto out;
    }
    test_progress pg = {0};
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    CHECK(dl_ltx2_vae_decode(m, z, temb, got, test_on_progress, &pg) == DL_OK, "%s", dl_last_error());
    clock_gettime(CLOCK_MONOTONIC, &t1);
    CHECK(pg.calls == c->stages && pg.last == c->stages && pg.total == c->stages && !pg.out_of_order &&
              !pg.total_changed,
          "%s: progress %d calls, last %d of %d", c->key, pg.calls, pg.last, pg.total);
    const double ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
    if (dt == DL_F32) {
        double e = test_rel_err(got, want, n);
        CHECK(e <= 1e-4, "%s f32: max|err| %.3g of max|ref|", c->key, e);
        if (g_verbose) printf("%s f32: max|err| = %.3g of max|ref| (%.1f ms)\n", c->key, e, ms);
    } else {
        double db = test_psnr(got, want, n, 2.0);
        CHECK(db >= 30.0, "%s bf16: PSNR %.1f dB < 30", c->key, db);
        if (g_verbose) printf("%s bf16: PSNR %.1f dB (%.1f ms)\n", c->key, db, ms);
    }
    memset(again, 0, (size_t)n * 4);
    CHECK(dl_ltx2_vae_decode(m, z, temb, again, NULL, NULL) == DL_OK, "%s", dl_last_error());
    CHECK(!memcmp(got, again, (size_t)n * 4), "%s %s: a second decode differs", c->key, dl_dtype_name(dt));
    if (c->tc) { /* the timestep matters, and must be finite */
        CHECK(dl_ltx2_vae_decode(m, z, temb + 0.25f, again, NULL, NULL) == DL_OK && memcmp(got, again, (size_t)n * 4),
              "%s: the decode timestep changes nothing", c->key);
        CHECK(dl_ltx2_vae_decode(m, z, NAN, again, NULL, NULL) == DL_ERR_INVALID, "%s: NaN timestep refused", c->key);
    }
    z[nz - 1] = NAN;
    CHECK(dl_ltx2_vae_decode(m, z, temb, again, NULL, NULL) == DL_ERR_INVALID, "%s: non-finite latent refused", c->key);
    if (g_verbose) printf("%s %s: %zu bytes of activations\n", c->key, dl_dtype_name(dt), dl_ltx2_vae_activation_bytes(m));
out:
    free(z), free(want), free(got), free(again);
    dl_ltx2_vae_free(m);
    dl_model_dir_free(md);
}

/* Makes tmp a folder whose vae is config `cfg` with fixture `from`'s weights (or,
 * weights given, a file holding those nw bytes). */
static void write_folder(const char *tmp, const char *from, const char *cfg, const char *weights, size_t nw) {
    char w[512];
    snprintf(w, sizeof w, DATA_DIR "/ltx2_vae/%s/vae/diffusion_pytorch_model.safetensors", from);
    test_write_folder(tmp, "{\"_class_name\": \"LTX2Pipeline\", \"vae\": [\"diffusers\", \"AutoencoderKLLTX2Video\"]}",
                      "vae", cfg, w, weights, nw);
}

/* load of such a folder gives `want` and a message containing `says` */
static void bad_folder_w(const char *tmp, const char *from, const char *cfg, const char *weights, size_t nw,
                         dl_status want, const char *says) {
    write_folder(tmp, from, cfg, weights, nw);
    dl_model_dir *md;
    if (dl_model_dir_open(&md, tmp) != DL_OK) {
        CHECK(0, "%s", dl_last_error());
        return;
    }
    dl_ltx2_vae *m = NULL;
    dl_status s = dl_ltx2_vae_load(&m, md, "vae", 2, 2, 3, DL_F32, NULL);
    CHECK(s == want && (m != NULL) == (want == DL_OK) && (want == DL_OK || strstr(dl_last_error(), says)),
          "config %s: status %d, \"%s\" (want %d, \"%s\")", cfg, (int)s, dl_last_error(), (int)want, says);
    if (g_verbose && want != DL_OK) printf("refused: %s\n", dl_last_error());
    dl_ltx2_vae_free(m);
    dl_model_dir_free(md);
}

static void bad_folder(const char *tmp, const char *from, const char *cfg, dl_status want, const char *says) {
    bad_folder_w(tmp, from, cfg, NULL, 0, want, says);
}

/* fixture b's config (less what only the encoder reads) with fields overridden:
 * `extra` comes first, and a lookup finds a key's first occurrence */
#define B_CFG(extra)                                                                                              \
    "{\"_class_name\": \"AutoencoderKLLTX2Video\"" extra ", \"latent_channels\": 4, "                            \
    "\"decoder_block_out_channels\": [4, 8, 8], \"decoder_layers_per_block\": [1, 2, 0, 1], "                  \
    "\"decoder_spatio_temporal_scaling\": [false, true, true], \"decoder_inject_noise\": false, "               \
    "\"upsample_type\": [\"temporal\", \"spatiotemporal\", \"spatial\"], \"upsample_factor\": [1, 1, 2], "      \
    "\"upsample_residual\": [false, true, false], \"patch_size\": 2, \"decoder_causal\": true, "                \
    "\"decoder_spatial_padding_mode\": \"zeros\", \"timestep_conditioning\": false}"

/* b's weights under circular padding (a config of its own, no fixture folder) */
static void test_circular(dl_dtype dt) {
    static const tcase c = {"b", "b.circular", 4, 2, 2, 3, 4, 4, 1, 5, 0};
    char tmp[] = "/tmp/difflet_ltxvae_XXXXXX", cmd[600];
    if (!mkdtemp(tmp)) {
        CHECK(0, "mkdtemp");
        return;
    }
    write_folder(tmp, "b", B_CFG(", \"decoder_spatial_padding_mode\": \"circular\""), NULL, 0);
    test_case(&c, tmp, dt);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    CHECK(system(cmd) == 0, "cleanup %s", tmp);
}

static void test_refusals(void) {
    dl_model_dir *md;
    if (dl_model_dir_open(&md, DATA_DIR "/ltx2_vae/a") == DL_OK) {
        dl_ltx2_vae *m = NULL;
        CHECK(dl_ltx2_vae_load(&m, md, "no_such_vae", 2, 4, 4, DL_F32, NULL) != DL_OK && !m &&
                  strstr(dl_last_error(), "no_such_vae"),
              "missing component: %s", dl_last_error());
        CHECK(dl_ltx2_vae_load(&m, md, "vae", 0, 4, 4, DL_F32, NULL) == DL_ERR_INVALID && !m, "zero frames refused");
        CHECK(dl_ltx2_vae_load(&m, md, "vae", 2, 4, 4, DL_F16, NULL) == DL_ERR_UNSUPPORTED && !m, "f16 refused");
        CHECK(dl_ltx2_vae_load(&m, md, "vae", 2, 1, 4, DL_F32, NULL) == DL_ERR_INVALID && !m &&
                  strstr(dl_last_error(), "reflect"),
              "a one-pixel latent under reflect padding: %s", dl_last_error());
        dl_model_dir_free(md);
    } else {
        CHECK(0, "%s", dl_last_error());
    }
    char tmp[] = "/tmp/difflet_ltxvae_XXXXXX";
    if (!mkdtemp(tmp)) {
        CHECK(0, "mkdtemp");
        return;
    }
    bad_folder(tmp, "b", B_CFG(""), DL_OK, ""); /* the folder itself is fine */
    /* checkpoint and config disagree: the tensor is named */
    bad_folder(tmp, "b", B_CFG(", \"latent_channels\": 8"), DL_ERR_FORMAT, "latents_mean");
    bad_folder(tmp, "b", B_CFG(", \"decoder_block_out_channels\": [4, 8, 16]"), DL_ERR_FORMAT, "decoder.conv_in.conv");
    bad_folder(tmp, "b", B_CFG(", \"decoder_layers_per_block\": [1, 2, 0, 2]"), DL_ERR_FORMAT, "mid_block.resnets.1.");
    bad_folder(tmp, "b", B_CFG(", \"decoder_layers_per_block\": [1, 1, 0, 1]"), DL_ERR_FORMAT, "up_blocks.1.resnets.1.");
    bad_folder(tmp, "b", B_CFG(", \"decoder_spatio_temporal_scaling\": [true, true, true]"), DL_ERR_FORMAT,
               "up_blocks.2.upsamplers.0");
    bad_folder(tmp, "b", B_CFG(", \"decoder_spatio_temporal_scaling\": [false, false, true]"), DL_ERR_FORMAT,
               "up_blocks.1.upsamplers.0");
    bad_folder(tmp, "b", B_CFG(", \"timestep_conditioning\": true"), DL_ERR_UNSUPPORTED, "conv_in");
    bad_folder(tmp, "a", B_CFG(", \"latent_channels\": 8, \"decoder_block_out_channels\": [4, 8, 16], "
                               "\"decoder_layers_per_block\": [1, 1, 1, 1], \"decoder_spatio_temporal_scaling\": true, "
                               "\"upsample_type\": [\"spatiotemporal\", \"spatial\", \"temporal\"], "
                               "\"upsample_factor\": [2, 2, 2], \"upsample_residual\": true"),
               DL_ERR_FORMAT, "timestep_scale_multiplier");
    bad_folder(tmp, "b", B_CFG(", \"upsample_type\": [\"temporal\", \"diagonal\", \"spatial\"]"), DL_ERR_UNSUPPORTED,
               "upsample_type[1]");
    bad_folder(tmp, "b", B_CFG(", \"decoder_inject_noise\": [false, true, false, false]"), DL_ERR_UNSUPPORTED,
               "decoder_inject_noise");
    bad_folder(tmp, "b", B_CFG(", \"decoder_spatial_padding_mode\": \"mirror\""), DL_ERR_UNSUPPORTED, "mirror");
    bad_folder(tmp, "b", B_CFG(", \"patch_size_t\": 2"), DL_ERR_UNSUPPORTED, "patch_size_t");
    bad_folder(tmp, "b", B_CFG(", \"decoder_layers_per_block\": [2, 0, 1]"), DL_ERR_FORMAT, "decoder_layers_per_block");
    bad_folder(tmp, "b", B_CFG(", \"upsample_factor\": [2, 2]"), DL_ERR_FORMAT, "upsample_factor");
    bad_folder(tmp, "b", B_CFG(", \"upsample_factor\": [1, 2, 2]"), DL_ERR_FORMAT, "up block 1");
    bad_folder(tmp, "b", B_CFG(", \"decoder_block_out_channels\": \"wide\""), DL_ERR_FORMAT, "decoder_block_out_channels");
    bad_folder(tmp, "b", "{\"_class_name\": \"AutoencoderKLWan\"}", DL_ERR_UNSUPPORTED, "AutoencoderKLWan");
    /* checkpoints that are not safetensors files: too short, a header that is not JSON */
    bad_folder_w(tmp, "b", B_CFG(""), "abc", 3, DL_ERR_FORMAT, "vae/diffusion_pytorch_model.safetensors");
    static const char bad_hdr[] = "\x10\0\0\0\0\0\0\0{not json}      ";
    bad_folder_w(tmp, "b", B_CFG(""), bad_hdr, sizeof bad_hdr - 1, DL_ERR_FORMAT, "vae/diffusion_pytorch_model.safetensors");
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    CHECK(system(cmd) == 0, "cleanup %s", tmp);
}

int main(void) {
    g_verbose = getenv("DIFFLET_TEST_VERBOSE") != NULL;
    if (dl_ckpt_open(&g_vec, DATA_DIR "/ltx2_vae/vectors.safetensors", "vectors") != DL_OK) {
        fprintf(stderr, "%s\n", dl_last_error());
        return 1;
    }
    static const tcase cases[] = {
        {"a", "a.three", 8, 3, 2, 3, 12, 4, 1, 5, 1}, {"a", "a.two", 8, 2, 3, 2, 12, 4, 1, 5, 1},
        {"b", "b.four", 4, 4, 3, 2, 4, 4, 1, 5, 0},   {"b", "b.one", 4, 1, 2, 5, 4, 4, 1, 5, 0},
        {"c", "c.two", 4, 2, 2, 3, 4, 4, 2, 5, 0},    {"c", "c.three", 4, 3, 1, 2, 4, 4, 2, 5, 0},
    };
    for (int k = 0; k < 2; k++) {
        const dl_dtype dt = k ? DL_BF16 : DL_F32;
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
            char dir[256];
            snprintf(dir, sizeof dir, DATA_DIR "/ltx2_vae/%s", cases[i].vae);
            test_case(&cases[i], dir, dt);
        }
        test_circular(dt);
    }
    test_refusals();
    dl_ckpt_free(g_vec);
    return test_done("test_ltx2_vae");
}
