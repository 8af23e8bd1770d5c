/* OpenSoraVAE v1.2 decoder against Open-Sora v1.2.0's VideoAutoencoderPipeline.decode
 * (tests/data/opensora/{a,b}/vae: random weights; {a,b}/vectors.safetensors: vae.z,
 * the temporal VAE's output vae.x_z, the decoded video vae.x and save_sample's uint8
 * vae.frames). a: 34 frames at 40x56 (two temporal chunks), filters 8, 1 res block,
 * 4 groups; b: 17 frames at 48x48 (one chunk), filters 4, 2 res blocks, 2 groups.
 * Bars: f32 x_z and video max|err| <= 1e-4 max|ref|; uint8 frames equal, or one
 * apart where the reference value sits within our float error of a rounding
 * boundary (counted); bf16 video PSNR >= 30 dB (peak to peak 2) against the f32
 * reference. Also: a short last chunk (a's first 6 latent frames, 20 frames) equals
 * its chunks decoded alone, progress per chunk in order, decoding twice gives the same
 * bytes, refusals with messages for bad sizes, configs and checkpoints. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "difflet/opensora.h"
#include "test_util.h"

typedef struct {
    const char *name;
    int64_t F, H, W, lat[3];
    int chunks;
} fixture;

static const fixture k_a = {"a", 34, 40, 56, {10, 5, 7}, 2}, k_b = {"b", 17, 48, 48, {5, 6, 6}, 1};

static dl_opensora_vae *load(const char *cfg, int64_t F, int64_t H, int64_t W, dl_dtype dt, dl_model_dir **md) {
    char dir[256];
    snprintf(dir, sizeof dir, DATA_DIR "/opensora/%s", cfg);
    dl_opensora_vae *m = NULL;
    if (dl_model_dir_open(md, dir) != DL_OK) {
        CHECK(0, "%s", dl_last_error());
        return NULL;
    }
    if (dl_opensora_vae_load(&m, *md, "vae", F, H, W, dt, NULL) != DL_OK) {
        CHECK(0, "load %s: %s", cfg, dl_last_error());
        dl_model_dir_free(*md);
        *md = NULL;
    }
    return m;
}

/* save_sample's uint8 (SPEC §6, in f32 as torch computes it): clamp(-1, 1), (x + 1) / 2,
 * x 255 + 0.5, clamp(0, 255), truncation */
static int to_u8(float x) {
    float v = fminf(fmaxf(x, -1.f), 1.f);
    v = (v + 1.f) / 2.f;
    v = v * 255.f + 0.5f;
    v = fminf(fmaxf(v, 0.f), 255.f);
    return (int)v;
}

/* video [3, F, H, W] against frames [F, H, W, 3]: *exact mismatches; *edge those one
 * apart where the reference's x 255 + 0.5 is within tol (our error, in those units) of
 * an integer; returns the mismatches that are neither */
static int64_t frames_cmp(const float *video, const float *ref, const float *frames, int64_t F, int64_t HW, double tol,
                          int64_t *edge) {
    int64_t bad = 0;
    *edge = 0;
    for (int64_t c = 0; c < 3; c++)
        for (int64_t f = 0; f < F; f++)
            for (int64_t i = 0; i < HW; i++) {
                const int64_t v = (c * F + f) * HW + i;
                const int got = to_u8(video[v]), want = (int)frames[(f * HW + i) * 3 + c];
                if (got == want) continue;
                const double u = ((fmin(fmax(ref[v], -1.0), 1.0) + 1.0) / 2.0) * 255.0 + 0.5;
                if (abs(got - want) == 1 && fabs(u - floor(u + 0.5)) <= tol) (*edge)++;
                else bad++;
            }
    return bad;
}

static void test_case(const fixture *fx, dl_dtype dt) {
    char path[256];
    snprintf(path, sizeof path, DATA_DIR "/opensora/%s/vectors.safetensors", fx->name);
    dl_checkpoint *vec = NULL;
    if (dl_ckpt_open(&vec, path, "vectors") != DL_OK) {
        CHECK(0, "%s", dl_last_error());
        return;
    }
    dl_model_dir *md = NULL;
    dl_opensora_vae *m = load(fx->name, fx->F, fx->H, fx->W, dt, &md);
    const int64_t h = fx->lat[1], w = fx->lat[2], nz = 4 * fx->lat[0] * h * w, nxz = 4 * fx->F * h * w,
                  HW = fx->H * fx->W, nv = 3 * fx->F * HW;
    int64_t gz = 0, gxz = 0, gv = 0, gfr = 0;
    float *z = test_vec(vec, "vae.z", &gz, NULL), *xz_ref = test_vec(vec, "vae.x_z", &gxz, NULL),
          *v_ref = test_vec(vec, "vae.x", &gv, NULL), *fr = NULL;
    const dl_st_tensor *ft = dl_ckpt_find(vec, "vae.frames"); /* uint8 [F, H, W, 3] */
    if (ft && ft->dtype == DL_ST_U8 && (fr = malloc((size_t)ft->numel * 4))) {
        gfr = ft->numel;
        for (int64_t i = 0; i < gfr; i++) fr[i] = ft->data[i];
    }
    float *xz = malloc((size_t)nxz * 4), *video = malloc((size_t)nv * 4), *again = malloc((size_t)nv * 4);
    if (!m || !z || !xz_ref || !v_ref || !fr || gz != nz || gxz != nxz || gv != nv || gfr != nv) {
        CHECK(0, "%s: model or vectors missing, or vectors of the wrong size", fx->name);
        goto out;
    }
    int64_t lat[3];
    dl_opensora_vae_latent_size(m, lat);
    CHECK(lat[0] == fx->lat[0] && lat[1] == h && lat[2] == w && dl_opensora_vae_channels(m) == 4 &&
              dl_opensora_vae_chunks(m) == fx->chunks,
          "%s: latent %lld x %lld x %lld, %lld channels, %d chunks", fx->name, (long long)lat[0], (long long)lat[1],
          (long long)lat[2], (long long)dl_opensora_vae_channels(m), dl_opensora_vae_chunks(m));
    const char *tn = dl_dtype_name(dt);
    CHECK(dl_opensora_vae_decode_temporal(m, z, xz) == DL_OK, "%s", dl_last_error());
    const double exz = test_rel_err(xz, xz_ref, nxz);
    test_progress pg = {0};
    CHECK(dl_opensora_vae_decode(m, z, video, test_on_progress, &pg) == DL_OK, "%s", dl_last_error());
    CHECK(pg.calls == fx->chunks && pg.last == fx->chunks && pg.total == fx->chunks && !pg.out_of_order &&
              !pg.total_changed,
          "%s: progress %d calls, last %d of %d", fx->name, pg.calls, pg.last, pg.total);
    const double ev = test_rel_err(video, v_ref, nv), db = test_psnr(video, v_ref, nv, 2.0);
    if (dt == DL_F32) {
        CHECK(exz <= 1e-4, "%s f32: x_z max|err| %.3g of max|ref|", fx->name, exz);
        CHECK(ev <= 1e-4, "%s f32: video max|err| %.3g of max|ref|", fx->name, ev);
        int64_t edge, edge_ref;
        double mx = 0, e = 0;
        for (int64_t i = 0; i < nv; i++) mx = fmax(mx, fabs(v_ref[i])), e = fmax(e, fabs((double)video[i] - v_ref[i]));
        /* the reference's own float video gives its frames exactly (the conversion is right) */
        CHECK(frames_cmp(v_ref, v_ref, fr, fx->F, HW, 0, &edge_ref) == 0 && edge_ref == 0,
              "%s: the reference video does not convert to its frames", fx->name);
        const int64_t bad = frames_cmp(video, v_ref, fr, fx->F, HW, e * 255.0 / 2.0 + 1e-6, &edge);
        CHECK(bad == 0, "%s f32: %lld uint8 values differ away from a rounding boundary", fx->name, (long long)bad);
        printf("%s f32: x_z max|err| %.3g, video max|err| %.3g of max|ref| (%.3g), PSNR %.1f dB; uint8: %lld of %lld "
               "values one apart at a rounding boundary, %lld otherwise different\n",
               fx->name, exz, ev, mx, db, (long long)edge, (long long)nv, (long long)bad);
    } else {
        CHECK(db >= 30.0, "%s bf16: PSNR %.1f dB < 30", fx->name, db);
        printf("%s bf16: video PSNR %.1f dB (x_z max|err| %.3g, video %.3g of max|ref|)\n", fx->name, db, exz, ev);
    }
    memset(again, 0, (size_t)nv * 4);
    CHECK(dl_opensora_vae_decode(m, z, again, NULL, NULL) == DL_OK && !memcmp(video, again, (size_t)nv * 4),
          "%s %s: a second decode differs", fx->name, tn);
    printf("%s %s: %zu bytes of activations\n", fx->name, tn, dl_opensora_vae_activation_bytes(m));
    z[7] = NAN;
    CHECK(dl_opensora_vae_decode(m, z, again, NULL, NULL) == DL_ERR_INVALID && strstr(dl_last_error(), "finite"),
          "%s: non-finite latent refused", fx->name);
    CHECK(dl_opensora_vae_decode_temporal(m, z, xz) == DL_ERR_INVALID, "%s: non-finite latent refused (temporal)", fx->name);
out:
    free(z), free(xz_ref), free(v_ref), free(fr), free(xz), free(video), free(again);
    dl_opensora_vae_free(m);
    dl_model_dir_free(md);
    dl_ckpt_free(vec);
}

/* A short last chunk: a's first 6 latent frames decode into 20 frames (chunks of 5
 * and 1 latent frames; 17 + 3 frames, the second cropping 1). The first 17 are the
 * reference's first chunk; the last 3 are what a model built for 3 frames (one chunk
 * of one latent frame) makes of latent frame 5 alone. */
static void test_short_chunk(void) {
    dl_checkpoint *vec = NULL;
    if (dl_ckpt_open(&vec, DATA_DIR "/opensora/a/vectors.safetensors", "vectors") != DL_OK) {
        CHECK(0, "%s", dl_last_error());
        return;
    }
    const int64_t h = 5, w = 7, hw = h * w;
    dl_model_dir *md = NULL, *md1 = NULL;
    dl_opensora_vae *m = load("a", 20, 40, 56, DL_F32, &md), *m1 = load("a", 3, 40, 56, DL_F32, &md1);
    float *z = test_vec(vec, "vae.z", NULL, NULL), *xz_ref = test_vec(vec, "vae.x_z", NULL, NULL);
    float *z6 = malloc(4 * 6 * hw * 4), *z1 = malloc(4 * hw * 4), *xz = malloc(4 * 20 * hw * 4), *xz1 = malloc(4 * 3 * hw * 4);
    float *want = malloc(4 * 17 * hw * 4), *got = malloc(4 * 17 * hw * 4), *v = malloc(3 * 20 * 40 * 56 * 4),
          *v1 = malloc(3 * 3 * 40 * 56 * 4);
    if (!m || !m1 || !z || !xz_ref) {
        CHECK(0, "short chunk: model or vectors missing");
        goto out;
    }
    int64_t lat[3];
    dl_opensora_vae_latent_size(m, lat);
    CHECK(lat[0] == 6 && dl_opensora_vae_chunks(m) == 2, "20 frames: %lld latent frames, %d chunks", (long long)lat[0],
          dl_opensora_vae_chunks(m));
    dl_opensora_vae_latent_size(m1, lat);
    CHECK(lat[0] == 1 && dl_opensora_vae_chunks(m1) == 1, "3 frames: %lld latent frames", (long long)lat[0]);
    for (int64_t c = 0; c < 4; c++) {
        memcpy(z6 + c * 6 * hw, z + c * 10 * hw, (size_t)(6 * hw) * 4);
        memcpy(z1 + c * hw, z + (c * 10 + 5) * hw, (size_t)hw * 4);
        memcpy(want + c * 17 * hw, xz_ref + c * 34 * hw, (size_t)(17 * hw) * 4);
    }
    CHECK(dl_opensora_vae_decode_temporal(m, z6, xz) == DL_OK && dl_opensora_vae_decode_temporal(m1, z1, xz1) == DL_OK,
          "%s", dl_last_error());
    for (int64_t c = 0; c < 4; c++) memcpy(got + c * 17 * hw, xz + c * 20 * hw, (size_t)(17 * hw) * 4);
    const double e0 = test_rel_err(got, want, 4 * 17 * hw);
    for (int64_t c = 0; c < 4; c++) memcpy(got + c * 3 * hw, xz + (c * 20 + 17) * hw, (size_t)(3 * hw) * 4);
    const double e1 = test_rel_err(got, xz1, 4 * 3 * hw);
    CHECK(e0 <= 1e-4, "20 frames: first chunk's x_z %.3g of the reference's", e0);
    CHECK(e1 <= 1e-5, "20 frames: the short chunk's x_z differs from its own decode by %.3g", e1);
    CHECK(dl_opensora_vae_decode(m, z6, v, NULL, NULL) == DL_OK && dl_opensora_vae_decode(m1, z1, v1, NULL, NULL) == DL_OK,
          "%s", dl_last_error());
    const int64_t HW = 40 * 56;
    double ev = 0, mx = 0;
    for (int64_t c = 0; c < 3; c++)
        for (int64_t i = 0; i < 3 * HW; i++) {
            const double a = v[(c * 20 + 17) * HW + i], b = v1[c * 3 * HW + i];
            ev = fmax(ev, fabs(a - b)), mx = fmax(mx, fabs(b));
        }
    CHECK(ev <= 1e-5 * mx, "20 frames: the short chunk's video differs from its own decode by %.3g", ev / mx);
    printf("short last chunk: first chunk x_z %.3g of the reference's; the 3-frame chunk %.3g (x_z), %.3g (video) "
           "from its own decode\n", e0, e1, ev / mx);
out:
    free(z), free(xz_ref), free(z6), free(z1), free(xz), free(xz1), free(want), free(got), free(v), free(v1);
    dl_opensora_vae_free(m), dl_opensora_vae_free(m1);
    dl_model_dir_free(md), dl_model_dir_free(md1);
    dl_ckpt_free(vec);
}

/* ---- refusals ------------------------------------------------------------------------ */

/* a's vae_temporal; an override placed first wins (cJSON reads the first of duplicates) */
#define TEMPORAL_A                                                                                          \
    "\"type\": \"VAE_Temporal\", \"in_out_channels\": 4, \"latent_embed_dim\": 4, \"embed_dim\": 4, "      \
    "\"filters\": 8, \"num_res_blocks\": 1, \"num_groups\": 4, \"channel_multipliers\": [1, 2, 2, 4], " \
    "\"temporal_downsample\": [false, true, true]"

/* a's config with `top` fields first, vae_2d.from_pretrained `from` (JSON), vae_temporal `vt` */
static void config_text(char *buf, size_t n, const char *top, const char *from, const char *vt) {
    snprintf(buf, n,
             "{%s\"model_type\": \"VideoAutoencoderPipeline\", \"micro_frame_size\": 17, \"scale\": [3.85, 2.32, 2.33, "
             "3.06], \"shift\": [-0.1, 0.34, 0.27, 0.98], \"vae_2d\": {\"type\": \"VideoAutoencoderKL\", "
             "\"from_pretrained\": %s, \"subfolder\": null, \"micro_batch_size\": 4}, \"vae_temporal\": {%s}}",
             top, from, vt);
}

static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    char *t = calloc(1, 1 << 16);
    if (f && t) fread(t, 1, (1 << 16) - 1, f);
    if (f) fclose(f);
    return t;
}

static char *g_spatial; /* a's vae/spatial_config.json */

/* A folder whose vae is a's weights with config `cfg` and spatial_config.json `spatial`
 * (NULL: none); loading 17 frames at 64x96 gives `want` and a message containing `says`. */
static void bad_config(const char *tmp, const char *top, const char *from, const char *vt, const char *spatial,
                       dl_status want, const char *says) {
    char cfg[4096], p[512];
    config_text(cfg, sizeof cfg, top, from, vt);
    if (!test_write_folder(tmp, "{\"_class_name\": \"OpenSoraPipeline\", \"vae\": [\"opensora\", \"VideoAutoencoderPipeline\"]}",
                           "vae", cfg, DATA_DIR "/opensora/a/vae/model.safetensors", NULL, 0))
        return;
    snprintf(p, sizeof p, "%s/vae/spatial_config.json", tmp);
    unlink(p);
    if (spatial) test_write_text(p, spatial);
    dl_model_dir *md;
    if (dl_model_dir_open(&md, tmp) != DL_OK) {
        CHECK(0, "%s", dl_last_error());
        return;
    }
    dl_opensora_vae *m = NULL;
    dl_status s = dl_opensora_vae_load(&m, md, "vae", 17, 64, 96, DL_F32, NULL);
    CHECK(s == want && (m != NULL) == (want == DL_OK) && (want == DL_OK || strstr(dl_last_error(), says)),
          "config %s: status %d, \"%s\" (want %d, \"%s\")", cfg, (int)s, dl_last_error(), (int)want, says);
    if (want != DL_OK) printf("refused: %s\n", dl_last_error());
    dl_opensora_vae_free(m);
    dl_model_dir_free(md);
}

static void test_refusals(void) {
    dl_model_dir *md;
    if (dl_model_dir_open(&md, DATA_DIR "/opensora/a") == DL_OK) {
        dl_opensora_vae *m = NULL;
        struct {
            int64_t F, H, W;
            dl_dtype dt;
            dl_status want;
            const char *says;
        } cs[] = {{0, 64, 96, DL_F32, DL_ERR_INVALID, "frames"},      {17, 60, 96, DL_F32, DL_ERR_INVALID, "multiple"},
                  {17, 64, 426, DL_F32, DL_ERR_INVALID, "multiple"}, {17, 0, 96, DL_F32, DL_ERR_INVALID, "size"},
                  {17, 64, 96, DL_F16, DL_ERR_UNSUPPORTED, "f16"}};
        for (size_t i = 0; i < sizeof cs / sizeof *cs; i++) {
            dl_status s = dl_opensora_vae_load(&m, md, "vae", cs[i].F, cs[i].H, cs[i].W, cs[i].dt, NULL);
            CHECK(s == cs[i].want && !m && strstr(dl_last_error(), cs[i].says), "%lld frames %lldx%lld %s: %d, %s",
                  (long long)cs[i].F, (long long)cs[i].W, (long long)cs[i].H, dl_dtype_name(cs[i].dt), (int)s,
                  dl_last_error());
            printf("refused: %s\n", dl_last_error());
        }
        CHECK(dl_opensora_vae_load(&m, md, "no_such_vae", 17, 64, 96, DL_F32, NULL) != DL_OK && !m &&
                  strstr(dl_last_error(), "no_such_vae"),
              "missing component: %s", dl_last_error());
        dl_model_dir_free(md);
    } else {
        CHECK(0, "%s", dl_last_error());
    }
    char tmp[] = "/tmp/difflet_osvae_XXXXXX";
    if (!mkdtemp(tmp)) {
        CHECK(0, "mkdtemp");
        return;
    }
    const char *sp = g_spatial, *sj = "\"spatial_config.json\"", *sdxl = "\"PixArt-alpha/pixart_sigma_sdxlvae_T5_diffusers\"";
    bad_config(tmp, "", sj, TEMPORAL_A, sp, DL_OK, ""); /* the folder itself is fine */
    bad_config(tmp, "\"model_type\": \"VideoAutoencoder\", ", sj, TEMPORAL_A, sp, DL_ERR_UNSUPPORTED, "model_type");
    bad_config(tmp, "\"micro_frame_size\": null, ", sj, TEMPORAL_A, sp, DL_ERR_UNSUPPORTED, "micro_frame_size");
    bad_config(tmp, "\"scale\": [1, 2, 3], ", sj, TEMPORAL_A, sp, DL_ERR_FORMAT, "\"scale\"");
    bad_config(tmp, "\"vae_2d\": {\"type\": \"VideoAutoencoderKLTemporalDecoder\"}, ", sj, TEMPORAL_A, sp,
               DL_ERR_UNSUPPORTED, "vae_2d.type");
    bad_config(tmp, "", "\"stabilityai/sd-vae-ft-ema\"", TEMPORAL_A, NULL, DL_ERR_UNSUPPORTED, "stabilityai/sd-vae-ft-ema");
    bad_config(tmp, "", "null", TEMPORAL_A, NULL, DL_ERR_UNSUPPORTED, "vae_2d.from_pretrained");
    /* the built-in SDXL config: a's small spatial VAE does not fit it, the tensor is named */
    bad_config(tmp, "", sdxl, TEMPORAL_A, NULL, DL_ERR_FORMAT, "spatial_vae.module.decoder.conv_in");
    bad_config(tmp, "", sj, TEMPORAL_A, "{\"_class_name\": \"AutoencoderKLWan\"}", DL_ERR_UNSUPPORTED, "AutoencoderKLWan");
    bad_config(tmp, "", sj, TEMPORAL_A, "{\"_class_name\": \"AutoencoderKL\", ", DL_ERR_FORMAT, "spatial_config.json");
    bad_config(tmp, "", sj, "\"type\": \"VAE_Temporal_XL\", " TEMPORAL_A, sp, DL_ERR_UNSUPPORTED, "VAE_Temporal_XL");
    bad_config(tmp, "", sj, TEMPORAL_A ", \"activation_fn\": \"relu\"", sp, DL_ERR_UNSUPPORTED, "vae_temporal.activation_fn");
    bad_config(tmp, "", sj, "\"type\": \"VAE_Temporal\", \"embed_dim\": 4", sp, DL_ERR_FORMAT, "vae_temporal.in_out_channels");
    bad_config(tmp, "", sj, "\"num_groups\": 3, " TEMPORAL_A, sp, DL_ERR_FORMAT, "num_groups");
    bad_config(tmp, "", sj, "\"channel_multipliers\": [1, 2, 4], " TEMPORAL_A, sp, DL_ERR_FORMAT, "temporal_downsample");
    /* configs the checkpoint disagrees with: the first tensor that does is named */
    bad_config(tmp, "", sj, "\"filters\": 16, " TEMPORAL_A, sp, DL_ERR_FORMAT, "temporal_vae.decoder.conv1.conv");
    bad_config(tmp, "", sj, "\"num_res_blocks\": 2, " TEMPORAL_A, sp, DL_ERR_FORMAT, "res_blocks.1.");
    bad_config(tmp, "", sj, "\"num_res_blocks\": 0, " TEMPORAL_A, sp, DL_ERR_FORMAT, "res_blocks.0.");
    bad_config(tmp, "", sj, "\"temporal_downsample\": [false, false, true], " TEMPORAL_A, sp, DL_ERR_FORMAT,
               "conv_blocks.1.");
    bad_config(tmp, "", sj, "\"temporal_downsample\": [true, true, true], " TEMPORAL_A, sp, DL_ERR_FORMAT,
               "conv_blocks.0.");
    bad_config(tmp, "", sj, "\"type\": \"VAE_Temporal_SD\"", sp, DL_ERR_FORMAT, "temporal_vae.decoder.conv1.conv");
    bad_config(tmp, "", sj, "\"type\": \"VAE_Temporal_SD\", \"filters\": 16", sp, DL_ERR_UNSUPPORTED, "fixed");
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    CHECK(system(cmd) == 0, "cleanup %s", tmp);
}

int main(void) {
    g_spatial = read_text(DATA_DIR "/opensora/a/vae/spatial_config.json");
    for (int k = 0; k < 2; k++) {
        const dl_dtype dt = k ? DL_BF16 : DL_F32;
        test_case(&k_a, dt);
        test_case(&k_b, dt);
    }
    test_short_chunk();
    test_refusals();
    free(g_spatial);
    return test_done("test_opensora_vae");
}
