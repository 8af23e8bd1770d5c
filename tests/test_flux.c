/* FLUX against diffusers on the tiny random-weight pipeline (tests/data/flux):
 * one transformer call (every block's output compared, so a failure names the
 * first block that diverged), one VAE decode, and the whole FluxPipeline for 4
 * steps at 32x48 from fixed initial latents, with and without true CFG, for a
 * transformer with the guidance embedding (dev) and without (schnell).
 * Bounds: components max|err| <= 1e-4 * max|ref| in f32; final image PSNR >= 45 dB
 * in f32 and >= 30 dB in bf16 (the acceptance bars). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

#include "difflet/io.h"
#include "difflet/pipeline.h"
#include "test_util.h"
#include "difflet/flux.h"

static dl_checkpoint *g_vec;

static void test_step(const char *variant) {
    char dir[256], key[64];
    snprintf(dir, sizeof dir, DATA_DIR "/flux/%s", variant);
    dl_model_dir *md;
    if (dl_model_dir_open(&md, dir) != DL_OK) {
        CHECK(0, "%s", dl_last_error());
        return;
    }
    dl_flux *m;
    const int64_t gh = 12, gw = 8, T = 32, N = gh * gw;
    if (dl_flux_load(&m, md, "transformer", gh, gw, T, DL_F32, NULL) != DL_OK) {
        CHECK(0, "load %s: %s", variant, dl_last_error());
        dl_model_dir_free(md);
        return;
    }
    int ns, nd = dl_flux_blocks(m, &ns);
    const int64_t D = dl_flux_width(m), C = dl_flux_out_channels(m), S = T + N;
    snprintf(key, sizeof key, "%s.step", variant);
    char nm[256];
#define V(suffix) (snprintf(nm, sizeof nm, "%s.%s", key, suffix), test_vec(g_vec, nm, NULL, NULL))
    float *lat = V("latents"), *pe = V("prompt_embeds"), *pooled = V("pooled"), *want = V("out");
    float *out = malloc((size_t)(N * C) * 4), *blocks = malloc((size_t)((nd + ns) * S * D) * 4);
    CHECK(dl_flux_run(m, lat, pe, pooled, 0.7f, 3.5f, out, blocks) == DL_OK, "%s", dl_last_error());
    for (int b = 0; b < nd + ns; b++) {
        char bn[64];
        snprintf(bn, sizeof bn, "%s%d", b < nd ? "double" : "single", b < nd ? b : b - nd);
        float *wt = (snprintf(nm, sizeof nm, "%s.%s.txt", key, bn), test_vec(g_vec, nm, NULL, NULL));
        float *wi = (snprintf(nm, sizeof nm, "%s.%s.img", key, bn), test_vec(g_vec, nm, NULL, NULL));
        double et = test_rel_err(blocks + (size_t)b * (size_t)(S * D), wt, T * D);
        double ei = test_rel_err(blocks + (size_t)b * (size_t)(S * D) + T * D, wi, N * D);
        free(wt), free(wi);
        CHECK(et <= 1e-4 && ei <= 1e-4, "%s %s: text %.3g, image %.3g of max|ref|", key, bn, et, ei);
        if (et > 1e-4 || ei > 1e-4) break;
    }
    double e = test_rel_err(out, want, N * C);
    CHECK(e <= 1e-4, "%s transformer output: %.3g of max|ref|", key, e);
    if (getenv("DIFFLET_TEST_VERBOSE")) printf("%s output: %.3g\n", key, e);
#undef V
    free(lat), free(pe), free(pooled), free(want), free(out), free(blocks);
    dl_flux_free(m);
    dl_model_dir_free(md);
}

static void test_vae(void) {
    dl_model_dir *md;
    if (dl_model_dir_open(&md, DATA_DIR "/flux/dev") != DL_OK) {
        CHECK(0, "%s", dl_last_error());
        return;
    }
    dl_vae_decoder *v;
    if (dl_vae_decoder_load(&v, md, "vae", 24, 16, DL_F32, NULL) != DL_OK) {
        CHECK(0, "vae: %s", dl_last_error());
        dl_model_dir_free(md);
        return;
    }
    CHECK(dl_vae_scale(v) == 2 && dl_vae_latent_channels(v) == 4, "vae scale and channels");
    float *z = test_vec(g_vec, "vae.latent", NULL, NULL), *want = test_vec(g_vec, "vae.image", NULL, NULL),
          *img = malloc(3 * 48 * 32 * 4);
    CHECK(dl_vae_decode(v, z, img) == DL_OK, "%s", dl_last_error());
    double e = test_rel_err(img, want, 3 * 48 * 32);
    CHECK(e <= 1e-4, "VAE decode: %.3g of max|ref|", e);
    if (getenv("DIFFLET_TEST_VERBOSE")) printf("vae: %.3g\n", e);
    z[0] = NAN;
    CHECK(dl_vae_decode(v, z, img) == DL_ERR_INVALID, "non-finite latent refused");
    free(z), free(want), free(img);
    dl_vae_decoder_free(v);
    dl_model_dir_free(md);
}

static void test_pipeline(const char *variant, dl_dtype dt) {
    char dir[256];
    snprintf(dir, sizeof dir, DATA_DIR "/flux/%s", variant);
    dl_flux_shape shape = {.width = 32, .height = 48, .max_sequence_length = 32, .dt = dt};
    dl_flux_pipeline *p;
    if (dl_flux_pipeline_load(&p, dir, &shape) != DL_OK) {
        CHECK(0, "pipeline %s: %s", variant, dl_last_error());
        return;
    }
    for (int k = 0; k < 2; k++) {
        char nm[128];
        snprintf(nm, sizeof nm, "%s.gen%d.latents", variant, k);
        float *init = test_vec(g_vec, nm, NULL, NULL);
        snprintf(nm, sizeof nm, "%s.gen%d.image", variant, k);
        float *want = test_vec(g_vec, nm, NULL, NULL);
        float *img = malloc(48 * 32 * 3 * 4);
        uint8_t *rgb = malloc(48 * 32 * 3);
        dl_flux_request r = {.prompt = "a red circle on a blue background",
                             .negative_prompt = k ? "blurry green square" : NULL, .steps = 4, .guidance = 3.5f,
                             .true_cfg = k ? 2.f : 1.f, .init_latents = init};
        dl_flux_timing tm;
        CHECK(dl_flux_generate(p, &r, rgb, img, &tm) == DL_OK, "%s", dl_last_error());
        CHECK(tm.transformer_calls == (k ? 8 : 4), "transformer calls %d", tm.transformer_calls);
        double db = test_psnr(img, want, 48 * 32 * 3, 1.0), bar = dt == DL_F32 ? 45.0 : 30.0;
        CHECK(db >= bar, "%s %s gen%d: PSNR %.1f dB < %.0f", variant, dl_dtype_name(dt), k, db, bar);
        if (getenv("DIFFLET_TEST_VERBOSE")) printf("%s %s gen%d: PSNR %.1f dB\n", variant, dl_dtype_name(dt), k, db);
        free(init), free(want), free(img), free(rgb);
    }
    dl_flux_pipeline_free(p);
}

/* image-to-image and inpainting (tests/data/flux/edit*, make_flux_edit_vectors.py):
 * the VAE encoder alone, then FluxImg2ImgPipeline and FluxInpaintPipeline from the
 * committed PNG inputs (read and prepared as the CLI prepares them) and the noise
 * the pipelines drew. */
static void test_edit(const char *name, int H, int W, dl_dtype dt) {
    char dir[256], nm[128];
    snprintf(dir, sizeof dir, DATA_DIR "/flux/%s", name);
    const int scale = !strcmp(name, "edit") ? 2 : 4;
    const int64_t lh = H / scale, lw = W / scale;
    dl_model_dir *md;
    dl_vae_encoder *e;
    if (dt == DL_F32 && dl_model_dir_open(&md, dir) == DL_OK) {
        if (dl_vae_encoder_load(&e, md, "vae", H, W, DL_F32, NULL) == DL_OK) {
            snprintf(nm, sizeof nm, "%s.enc.image", name);
            float *x = test_vec(g_vec, nm, NULL, NULL), *z = malloc((size_t)(4 * lh * lw) * 4);
            snprintf(nm, sizeof nm, "%s.enc.mean", name);
            float *want = test_vec(g_vec, nm, NULL, NULL);
            CHECK(dl_vae_encode(e, x, z) == DL_OK, "%s", dl_last_error());
            double err = test_rel_err(z, want, 4 * lh * lw);
            CHECK(err <= 1e-4, "%s VAE encode: %.3g of max|ref|", name, err);
            if (getenv("DIFFLET_TEST_VERBOSE")) printf("%s encoder: %.3g\n", name, err);
            x[5] = NAN;
            CHECK(dl_vae_encode(e, x, z) == DL_ERR_INVALID, "non-finite image refused");
            free(x), free(z), free(want);
            dl_vae_encoder_free(e);
        } else {
            CHECK(0, "%s encoder: %s", name, dl_last_error());
        }
        dl_model_dir_free(md);
    }
    dl_flux_shape shape = {.width = W, .height = H, .max_sequence_length = 32, .dt = dt};
    dl_flux_pipeline *p;
    if (dl_flux_pipeline_load(&p, dir, &shape) != DL_OK) {
        CHECK(0, "pipeline %s: %s", name, dl_last_error());
        return;
    }
    char path[300];
    dl_image im, mk;
    uint8_t *rgb_in = NULL, *mask = NULL;
    snprintf(path, sizeof path, "%s/init.png", dir);
    CHECK(dl_image_read(path, &im) == DL_OK && dl_image_prepare(&im, DL_IMAGE_RGB, W, H, &rgb_in) == DL_OK, "%s",
          dl_last_error());
    snprintf(path, sizeof path, "%s/mask.png", dir);
    CHECK(dl_image_read(path, &mk) == DL_OK && dl_image_prepare(&mk, DL_IMAGE_LUMA, W, H, &mask) == DL_OK, "%s",
          dl_last_error());
    dl_image_free(&im), dl_image_free(&mk);
    for (int k = 0; k < 2 && rgb_in && mask; k++) {
        const char *what = k ? "inp" : "i2i";
        snprintf(nm, sizeof nm, "%s.%s.latents", name, what);
        float *noise = test_vec(g_vec, nm, NULL, NULL);
        snprintf(nm, sizeof nm, "%s.%s.image", name, what);
        float *want = test_vec(g_vec, nm, NULL, NULL), *img = malloc((size_t)(H * W * 3) * 4);
        uint8_t *rgb = malloc((size_t)(H * W * 3));
        dl_flux_request r = {.prompt = "a red circle on a blue background", .negative_prompt = k ? "blurry green square" : NULL,
                             .steps = k ? 6 : 5, .guidance = 3.5f, .true_cfg = k ? 2.f : 1.f, .init_latents = noise,
                             .image = rgb_in, .mask = k ? mask : NULL, .strength = k ? 0.7 : 0.6};
        dl_flux_timing tm;
        CHECK(dl_flux_generate(p, &r, rgb, img, &tm) == DL_OK, "%s", dl_last_error());
        /* 5 x 0.6 = 3 of 5 steps run; 6 x 0.7 = 4.2: int(6 - 4.2) = 1 skipped, 5 run twice (CFG) */
        CHECK(tm.transformer_calls == (k ? 10 : 3), "%s %s: transformer calls %d", name, what, tm.transformer_calls);
        double db = test_psnr(img, want, (int64_t)H * W * 3, 1.0), bar = dt == DL_F32 ? 45.0 : 30.0;
        CHECK(db >= bar, "%s %s %s: PSNR %.1f dB < %.0f", name, what, dl_dtype_name(dt), db, bar);
        if (getenv("DIFFLET_TEST_VERBOSE")) printf("%s %s %s: PSNR %.1f dB\n", name, what, dl_dtype_name(dt), db);
        free(noise), free(want), free(img), free(rgb);
    }
    /* requests the flow refuses */
    uint8_t *rgb = malloc((size_t)(H * W * 3));
    dl_flux_request bad = {.prompt = "x", .steps = 4, .guidance = 3.5f, .true_cfg = 1.f, .image = rgb_in, .strength = 0.1};
    dl_flux_timing t1;
    CHECK(dl_flux_generate(p, &bad, rgb, NULL, &t1) == DL_OK && t1.transformer_calls == 1,
          "strength 0.1 of 4 steps runs int(4 - 0.4) = 3 skipped, 1 run (%d)", t1.transformer_calls);
    bad.strength = 1.5;
    CHECK(dl_flux_generate(p, &bad, rgb, NULL, NULL) == DL_ERR_INVALID, "strength 1.5 refused");
    bad.image = NULL, bad.mask = mask, bad.strength = 0.5;
    CHECK(dl_flux_generate(p, &bad, rgb, NULL, NULL) == DL_ERR_INVALID, "a mask without an image refused");
    free(rgb), free(rgb_in), free(mask);
    dl_flux_pipeline_free(p);
}

/* previews (OpenAI's partial_images): after evenly spaced steps, never the last,
 * not changing the result */
typedef struct {
    int n, idx[4];
    double mean[4];
} partials;
static void on_partial(void *ctx, int index, const uint8_t *rgb, int w, int h) {
    partials *pa = ctx;
    double m = 0;
    for (int i = 0; i < w * h * 3; i++) m += rgb[i];
    if (pa->n < 4) pa->idx[pa->n] = index, pa->mean[pa->n] = m / (w * h * 3);
    pa->n++;
}

static void test_partial(void) {
    dl_flux_shape shape = {.width = 32, .height = 48, .max_sequence_length = 32, .dt = DL_F32};
    dl_flux_pipeline *p;
    if (dl_flux_pipeline_load(&p, DATA_DIR "/flux/dev", &shape) != DL_OK) {
        CHECK(0, "%s", dl_last_error());
        return;
    }
    uint8_t a[48 * 32 * 3], b[48 * 32 * 3];
    partials pa = {0};
    dl_flux_request r = {.prompt = "a red circle", .steps = 6, .guidance = 3.5f, .true_cfg = 1.f, .seed = 3};
    CHECK(dl_flux_generate(p, &r, a, NULL, NULL) == DL_OK, "%s", dl_last_error());
    r.partial_images = 2, r.on_partial = on_partial, r.ctx = &pa;
    CHECK(dl_flux_generate(p, &r, b, NULL, NULL) == DL_OK, "%s", dl_last_error());
    CHECK(pa.n == 2 && pa.idx[0] == 0 && pa.idx[1] == 1 && pa.mean[0] > 0, "two previews, in order (%d)", pa.n);
    CHECK(!memcmp(a, b, sizeof a), "previews do not change the image");
    pa.n = 0, r.steps = 1, r.partial_images = 3;
    CHECK(dl_flux_generate(p, &r, b, NULL, NULL) == DL_OK && pa.n == 0, "one step: no preview (%d)", pa.n);
    pa.n = 0, r.steps = 3;
    CHECK(dl_flux_generate(p, &r, b, NULL, NULL) == DL_OK && pa.n == 2, "three steps, three asked: two previews (%d)", pa.n);
    dl_flux_pipeline_free(p);
}

/* PIL's LANCZOS resize, as VaeImageProcessor resizes a picture of another size:
 * byte-exact */
static void test_resize(void) {
    /* a small PNG claiming 5000 x 5000 pixels is refused before anything is decoded */
    uint8_t *png;
    size_t n;
    uint8_t px[3] = {1, 2, 3};
    if (dl_png_encode(px, 1, 1, &png, &n) == DL_OK) {
        png[16] = 0, png[17] = 0, png[18] = 0x13, png[19] = 0x88; /* IHDR width 5000 */
        png[20] = 0, png[21] = 0, png[22] = 0x13, png[23] = 0x88; /* height 5000 */
        uint32_t crc = 0xffffffffu; /* PNG's CRC-32 of the chunk type and data */
        for (int i = 12; i < 29; i++) {
            crc ^= png[i];
            for (int k = 0; k < 8; k++) crc = crc & 1 ? (crc >> 1) ^ 0xedb88320u : crc >> 1;
        }
        crc ^= 0xffffffffu;
        png[29] = (uint8_t)(crc >> 24), png[30] = (uint8_t)(crc >> 16), png[31] = (uint8_t)(crc >> 8), png[32] = (uint8_t)crc;
        dl_image big;
        CHECK(dl_image_decode(png, n, &big) == DL_ERR_INVALID && strstr(dl_last_error(), "pixels"),
              "a picture over the pixel bound refused: %s", dl_last_error());
        free(png);
    }
    dl_image src;
    if (dl_image_read(DATA_DIR "/flux/edit/resize_src.png", &src) != DL_OK) {
        CHECK(0, "%s", dl_last_error());
        return;
    }
    static const int sizes[2][2] = {{32, 48}, {20, 12}};
    for (int m = 0; m < 2; m++)
        for (int k = 0; k < 2; k++) {
            const int w = sizes[k][0], h = sizes[k][1], C = m ? 1 : 3;
            char nm[64];
            snprintf(nm, sizeof nm, "resize.%s.%dx%d", m ? "luma" : "rgb", w, h);
            float *want = test_vec(g_vec, nm, NULL, NULL);
            uint8_t *got = NULL;
            CHECK(dl_image_prepare(&src, m ? DL_IMAGE_LUMA : DL_IMAGE_RGB, w, h, &got) == DL_OK, "%s", dl_last_error());
            int diff = 0;
            for (int i = 0; got && want && i < w * h * C; i++) diff += got[i] != (uint8_t)want[i];
            CHECK(got && want && diff == 0, "%s: %d bytes differ from PIL", nm, diff);
            free(want), free(got);
        }
    dl_image_free(&src);
}

static void test_bad_input(void) {
    dl_flux_pipeline *p;
    dl_flux_shape bad = {.width = 30, .height = 48, .max_sequence_length = 32, .dt = DL_F32};
    CHECK(dl_flux_pipeline_load(&p, DATA_DIR "/flux/dev", &bad) == DL_ERR_INVALID && strstr(dl_last_error(), "multiples of 4"),
          "size not divisible: %s", dl_last_error());
    bad.width = 32;
    bad.max_sequence_length = 600;
    CHECK(dl_flux_pipeline_load(&p, DATA_DIR "/flux/dev", &bad) == DL_ERR_INVALID, "max_sequence_length 600");
    CHECK(dl_flux_pipeline_load(&p, DATA_DIR "/enc", &bad) != DL_OK && strstr(dl_last_error(), "FluxPipeline"),
          "not a FLUX folder: %s", dl_last_error());
    dl_flux_shape ok = {.width = 32, .height = 48, .max_sequence_length = 32, .dt = DL_F32};
    if (dl_flux_pipeline_load(&p, DATA_DIR "/flux/schnell", &ok) == DL_OK) {
        uint8_t rgb[48 * 32 * 3];
        dl_flux_request r = {.prompt = "x", .steps = 0};
        CHECK(dl_flux_generate(p, &r, rgb, NULL, NULL) == DL_ERR_INVALID, "steps 0 refused");
        r.steps = 1;
        r.prompt = "\xff";
        CHECK(dl_flux_generate(p, &r, rgb, NULL, NULL) == DL_ERR_INVALID, "invalid UTF-8 prompt refused");
        r.prompt = "a seed";
        r.seed = 42;
        uint8_t again[48 * 32 * 3];
        CHECK(dl_flux_generate(p, &r, rgb, NULL, NULL) == DL_OK && dl_flux_generate(p, &r, again, NULL, NULL) == DL_OK &&
                  !memcmp(rgb, again, sizeof rgb),
              "same seed, same bytes");
        dl_flux_pipeline_free(p);
    }
}

/* Default text length: FluxPipeline's own (512) whatever tokenizer_2's model_max_length
 * says (schnell's test tokenizer says 512, difflet-tiny's 32); a model's difflet.json
 * overrides it (difflet-tiny: 32) */
static void test_default_length(void) {
    CHECK(dl_model_default_int(SOURCE_DIR "/models/difflet-tiny", "max_sequence_length", 2, 512, 512) == 32,
          "difflet-tiny's difflet.json: 32");
    CHECK(dl_model_default_int(DATA_DIR "/flux/dev", "max_sequence_length", 2, 512, 512) == 512, "no difflet.json: 512");
    char dir[] = "/tmp/difflet_defaults_XXXXXX", path[64];
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    snprintf(path, sizeof path, "%s/difflet.json", dir);
    const char *bodies[] = {"{\"defaults\": {\"max_sequence_length\": 7.5}}", "{\"defaults\": {\"max_sequence_length\": 9000}}",
                            "{\"defaults\": [", "{\"defaults\": {\"max_sequence_length\": 64}}"};
    const int64_t want[] = {512, 512, 512, 64};
    for (int i = 0; i < 4; i++) {
        FILE *f = fopen(path, "w");
        fputs(bodies[i], f);
        fclose(f);
        CHECK(dl_model_default_int(dir, "max_sequence_length", 2, 512, 512) == want[i], "difflet.json %s", bodies[i]);
    }
    remove(path);
    /* tokenizer_2 declaring 128 does not change FluxPipeline's default */
    char cmd[1024], model[128];
    snprintf(model, sizeof model, "%s/m", dir);
    snprintf(cmd, sizeof cmd,
             "cp -rL '%s' '%s' && sed -i 's/\"model_max_length\": 512/\"model_max_length\": 128/' '%s/tokenizer_2/tokenizer_config.json' && "
             "grep -q '\"model_max_length\": 128' '%s/tokenizer_2/tokenizer_config.json'",
             DATA_DIR "/flux/schnell", model, model, model);
    CHECK(system(cmd) == 0, "%s", cmd);
    dl_flux_shape sh = {.width = 32, .height = 48, .dt = DL_F32};
    dl_flux_pipeline *p;
    if (dl_flux_pipeline_load(&p, model, &sh) == DL_OK) {
        CHECK(dl_flux_pipeline_max_sequence_length(p) == 512, "FluxPipeline default 512, got %d",
              dl_flux_pipeline_max_sequence_length(p));
        dl_flux_pipeline_free(p);
    } else
        CHECK(0, "load: %s", dl_last_error());
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0, "%s", cmd);
}

/* The embedded model, difflet-tiny (models/difflet-tiny), against diffusers'
 * FluxPipeline on the same weights: 64x64, 8 steps, true CFG 3 with an empty negative
 * prompt, from the committed initial latents (tools/tiny/export_eval.py). Bars: PSNR
 * >= 40 dB in f32, >= 30 dB in bf16. */
static void test_tiny(dl_dtype dt) {
    dl_checkpoint *v;
    if (dl_ckpt_open(&v, DATA_DIR "/tiny/parity.safetensors", "tiny") != DL_OK) {
        CHECK(0, "%s", dl_last_error());
        return;
    }
    const dl_st_tensor *ti = dl_ckpt_find(v, "latents"), *tw = dl_ckpt_find(v, "image");
    dl_flux_shape shape = {.width = 64, .height = 64, .max_sequence_length = 32, .dt = dt};
    dl_flux_pipeline *p;
    if (!ti || !tw || ti->numel != 64 * 16 || tw->numel != 64 * 64 * 3 ||
        dl_flux_pipeline_load(&p, SOURCE_DIR "/models/difflet-tiny", &shape) != DL_OK) {
        CHECK(0, "difflet-tiny parity setup: %s", dl_last_error());
        dl_ckpt_free(v);
        return;
    }
    float *init = malloc(64 * 16 * 4), *want = malloc(64 * 64 * 3 * 4), *img = malloc(64 * 64 * 3 * 4);
    uint8_t *rgb = malloc(64 * 64 * 3);
    dl_ckpt_read(ti, DL_F32, init);
    dl_ckpt_read(tw, DL_F32, want);
    dl_flux_request r = {.prompt = "a large red circle in the top left on a blue background", .negative_prompt = "",
                         .steps = 8, .guidance = 3.5f, .true_cfg = 3.f, .init_latents = init};
    CHECK(dl_flux_generate(p, &r, rgb, img, NULL) == DL_OK, "%s", dl_last_error());
    double db = test_psnr(img, want, 64 * 64 * 3, 1.0), bar = dt == DL_F32 ? 40.0 : 30.0;
    CHECK(db >= bar, "difflet-tiny %s: PSNR %.1f dB < %.0f", dl_dtype_name(dt), db, bar);
    if (getenv("DIFFLET_TEST_VERBOSE")) printf("difflet-tiny %s: PSNR %.1f dB\n", dl_dtype_name(dt), db);
    free(init), free(want), free(img), free(rgb);
    dl_flux_pipeline_free(p);
    dl_ckpt_free(v);
}

/* FLUX transformer GGUF files as users have them (Black Forest Labs' names, weights
 * Q8_0 / Q4_0 / F16; tests/data/flux/gguf, tools/parity/make_flux_gguf_vectors.py) in
 * a component folder instead of safetensors: the dequantized tensors under diffusers'
 * names identical to what diffusers' GGUF loader holds, and one forward within 1e-4 of
 * diffusers' (FluxTransformer2DModel.from_single_file of the same file). */
static void test_gguf(const char *q) {
    char dir[] = "/tmp/difflet_gguf_XXXXXX", p[512], target[512], nm[160];
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp");
        return;
    }
    snprintf(p, sizeof p, "%s/model_index.json", dir);
    FILE *f = fopen(p, "w");
    if (f) fputs("{\"_class_name\": \"FluxPipeline\", \"transformer\": [\"diffusers\", \"FluxTransformer2DModel\"]}\n", f), fclose(f);
    snprintf(p, sizeof p, "%s/transformer", dir);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/transformer/config.json", dir);
    int ok = symlink(DATA_DIR "/flux/dev/transformer/config.json", p) == 0;
    snprintf(p, sizeof p, "%s/transformer/flux1-tiny-%s.gguf", dir, q);
    snprintf(target, sizeof target, DATA_DIR "/flux/gguf/flux-tiny-%s.gguf", q);
    ok &= symlink(target, p) == 0;
    CHECK(ok, "gguf %s: model folder", q);
    /* the dequantized tensors, renamed and split */
    dl_checkpoint *ck = NULL;
    CHECK(dl_ckpt_open_gguf(&ck, target, "gguf") == DL_OK, "gguf %s: %s", q, dl_last_error());
    static const char *const names[] = {"transformer_blocks.0.attn.to_q.weight", "single_transformer_blocks.0.proj_mlp.weight",
                                        "norm_out.linear.weight"};
    for (size_t i = 0; ck && i < sizeof names / sizeof names[0]; i++) {
        snprintf(nm, sizeof nm, "%s.dequant.%s", q, names[i]);
        const dl_st_tensor *w = dl_ckpt_find(g_vec, nm), *t = dl_ckpt_find(ck, names[i]);
        if (!w) continue; /* not recorded for this file */
        float *want = test_vec(g_vec, nm, NULL, NULL), *got = t ? malloc((size_t)t->numel * 4) : NULL;
        int same = got && t->numel == w->numel && dl_ckpt_read(t, DL_F32, got) == DL_OK &&
                   !memcmp(got, want, (size_t)t->numel * 4);
        CHECK(same, "gguf %s: `%s` dequantized is not diffusers' tensor", q, names[i]);
        free(want), free(got);
    }
    dl_ckpt_free(ck);
    dl_model_dir *md = NULL;
    dl_flux *m = NULL;
    if (ok && dl_model_dir_open(&md, dir) == DL_OK && dl_flux_load(&m, md, "transformer", 6, 8, 12, DL_F32, NULL) == DL_OK) {
        float *lat = test_vec(g_vec, "in.latents", NULL, NULL), *txt = test_vec(g_vec, "in.txt", NULL, NULL),
              *pooled = test_vec(g_vec, "in.pooled", NULL, NULL), *t = test_vec(g_vec, "in.t", NULL, NULL),
              *g = test_vec(g_vec, "in.g", NULL, NULL);
        snprintf(nm, sizeof nm, "%s.out", q);
        float *want = test_vec(g_vec, nm, NULL, NULL), *got = malloc(48 * 16 * 4);
        int run = lat && txt && pooled && t && g && want && dl_flux_run(m, lat, txt, pooled, t[0], g[0], got, NULL) == DL_OK;
        CHECK(run, "gguf %s: run: %s", q, dl_last_error());
        if (run) {
            double e = test_rel_err(got, want, 48 * 16);
            if (getenv("DIFFLET_TEST_VERBOSE")) printf("gguf %s: %.3g of max\n", q, e);
            CHECK(e <= 1e-4, "gguf %s: transformer output %.3g of max|diffusers| off", q, e);
        }
        free(lat), free(txt), free(pooled), free(t), free(g), free(want), free(got);
    } else {
        CHECK(0, "gguf %s: load: %s", q, dl_last_error());
    }
    dl_flux_free(m);
    dl_model_dir_free(md);
    snprintf(p, sizeof p, "%s/transformer/config.json", dir), remove(p);
    snprintf(p, sizeof p, "%s/transformer/flux1-tiny-%s.gguf", dir, q), remove(p);
    snprintf(p, sizeof p, "%s/transformer", dir), rmdir(p);
    snprintf(p, sizeof p, "%s/model_index.json", dir), remove(p);
    rmdir(dir);
}

int main(void) {
    if (dl_ckpt_open(&g_vec, DATA_DIR "/flux/vectors.safetensors", "vectors") != DL_OK) {
        fprintf(stderr, "%s\n", dl_last_error());
        return 1;
    }
    test_step("dev");
    test_step("schnell");
    test_vae();
    test_pipeline("dev", DL_F32);
    test_pipeline("schnell", DL_F32);
    test_pipeline("dev", DL_BF16);
    test_bad_input();
    dl_ckpt_free(g_vec);
    if (dl_ckpt_open(&g_vec, DATA_DIR "/flux/edit_vectors.safetensors", "edit vectors") != DL_OK) {
        fprintf(stderr, "%s\n", dl_last_error());
        return 1;
    }
    test_edit("edit", 48, 32, DL_F32);
    test_edit("edit_b", 64, 48, DL_F32);
    test_edit("edit", 48, 32, DL_BF16);
    test_resize();
    test_partial();
    test_default_length();
    test_tiny(DL_F32);
    test_tiny(DL_BF16);
    dl_ckpt_free(g_vec);
    if (dl_ckpt_open(&g_vec, DATA_DIR "/flux/gguf/vectors.safetensors", "gguf vectors") != DL_OK) {
        fprintf(stderr, "%s\n", dl_last_error());
        return 1;
    }
    test_gguf("Q8_0");
    test_gguf("Q4_0");
    test_gguf("F16");
    dl_ckpt_free(g_vec);
    return test_done("test_flux");
}
