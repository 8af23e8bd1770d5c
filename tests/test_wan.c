/* Wan 2.1 against diffusers (tests/data/wan, tools/parity/make_wan_vectors.py): two
 * tiny random-weight WanPipelines differing in heads, depth, patch, cross-attention
 * norm and VAE temporal layout. One WanTransformer3DModel call per config (f32:
 * ≤ 1e-4 × max|ref|; bf16: PSNR), and the refusals. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "difflet/registry.h"
#include "difflet/wan.h"
#include "test_util.h"

static dl_checkpoint *g_vec;

static void test_step(const char *v, dl_dtype dt) {
    char path[256], name[64];
    snprintf(path, sizeof path, DATA_DIR "/wan/%s", v);
    dl_model_dir *dir;
    if (dl_model_dir_open(&dir, path) != DL_OK) {
        CHECK(0, "open %s: %s", path, dl_last_error());
        return;
    }
    int64_t shape[8] = {0}, n = 0, ne = 0, tsh[8] = {0};
    snprintf(name, sizeof name, "%s.step.latents", v);
    float *lat = test_vec(g_vec, name, &n, shape);
    snprintf(name, sizeof name, "%s.text.embeds", v);
    float *emb = test_vec(g_vec, name, &ne, tsh);
    snprintf(name, sizeof name, "%s.step.t", v);
    float *t = test_vec(g_vec, name, NULL, NULL);
    snprintf(name, sizeof name, "%s.step.out", v);
    float *want = test_vec(g_vec, name, NULL, NULL);
    dl_wan *m = NULL;
    if (lat && emb && t && want &&
        dl_wan_load(&m, dir, "transformer", shape[1], shape[2], shape[3], tsh[0], dt, NULL, NULL) == DL_OK) {
        float *got = calloc((size_t)n, 4);
        CHECK(dl_wan_run(m, lat, emb, t[0], got) == DL_OK, "%s run: %s", v, dl_last_error());
        double e = test_rel_err(got, want, n), p = test_psnr(got, want, n, 8.0);
        printf("wan %s transformer %s: max err %.3g of max|ref|, PSNR %.1f dB (range 8)\n", v, dl_dtype_name(dt), e, p);
        if (dt == DL_F32)
            CHECK(e <= 1e-4, "%s f32 transformer: %.3g", v, e);
        else
            CHECK(p >= 40, "%s bf16 transformer: %.1f dB", v, p);
        free(got);
        dl_wan_free(m);
    } else
        CHECK(0, "%s load: %s", v, dl_last_error());
    free(lat), free(emb), free(t), free(want);
    dl_model_dir_free(dir);
}

/* The whole pipeline from the same initial latents (written as --latents would give
 * them), 4 steps of UniPC, CFG on (guidance 5, a negative prompt) and off: every
 * frame against diffusers' (f32 >= 45 dB, bf16 >= 30 dB); a_euler: a's components with
 * FlowMatchEulerDiscreteScheduler */
static void test_pipeline(const char *v, dl_dtype dt, int ngen) {
    char path[256], name[64], lat_path[] = "/tmp/difflet_wan_lat_XXXXXX";
    snprintf(path, sizeof path, DATA_DIR "/wan/%s", v);
    const int a = v[0] == 'a', W = a ? 48 : 32, H = a ? 32 : 48, F = a ? 9 : 5;
    dl_gen_shape shape = {.width = W, .height = H, .frames = F, .max_sequence_length = 16, .dt = dt};
    dl_pipeline *p;
    if (dl_pipeline_load(&p, path, &shape) != DL_OK) {
        CHECK(0, "%s pipeline load: %s", v, dl_last_error());
        return;
    }
    int fd = mkstemp(lat_path);
    if (fd >= 0) close(fd);
    for (int k = 0; k < ngen; k++) {
        int64_t shp[8] = {0}, n = 0, nf = 0;
        snprintf(name, sizeof name, "%s.gen%d.latents", v, k);
        float *init = test_vec(g_vec, name, &n, shp);
        snprintf(name, sizeof name, "%s.gen%d.frames", v, k);
        float *want = test_vec(g_vec, name, &nf, NULL);
        dl_st_writer *w = dl_st_writer_new();
        dl_checkpoint *ck = NULL;
        if (!init || !want || dl_st_writer_add(w, "latents", DL_ST_F32, 4, shp, init) != DL_OK ||
            dl_st_writer_save(w, lat_path) != DL_OK || dl_ckpt_open(&ck, lat_path, NULL) != DL_OK) {
            CHECK(0, "%s gen%d inputs: %s", v, k, dl_last_error());
        } else {
            dl_gen_request r = {.prompt = "a red circle moving  from left to right &amp; a blue background",
                                .negative_prompt = k == 0 ? "blurry green square" : NULL, .steps = 4,
                                .guidance = k == 0 ? 5.f : 1.f, .init = ck, .want_pixels = 1};
            dl_media m;
            dl_gen_timing tm;
            if (dl_pipeline_generate(p, &r, &m, &tm) == DL_OK) {
                CHECK(m.frames == F && m.width == W && m.height == H && m.kind == DL_MEDIA_VIDEO && nf == (int64_t)F * H * W * 3,
                      "%s gen%d: %d frames %dx%d", v, k, m.frames, m.width, m.height);
                double worst = 1e9;
                for (int f = 0; f < F && nf == (int64_t)F * H * W * 3; f++) {
                    double ps = test_psnr(m.pixels + (size_t)f * H * W * 3, want + (size_t)f * H * W * 3,
                                          (int64_t)H * W * 3, 1.0);
                    worst = ps < worst ? ps : worst;
                }
                printf("wan %s pipeline %s, %s: worst frame PSNR %.1f dB (%d transformer calls)\n", v, dl_dtype_name(dt),
                       k == 0 ? "CFG" : "no CFG", worst, tm.denoiser_calls);
                CHECK(worst >= (dt == DL_F32 ? 45.0 : 30.0), "%s gen%d %s: %.1f dB", v, k, dl_dtype_name(dt), worst);
                CHECK(tm.denoiser_calls == (k == 0 ? 8 : 4), "%s gen%d: %d transformer calls", v, k, tm.denoiser_calls);
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

/* difflet-tiny-video (the embedded video model) against diffusers' WanPipeline on the
 * same initial latents (tests/data/tiny_video, tools/tiny_video/export_eval.py): its
 * own defaults (64x64, 9 frames, 32 text tokens from difflet.json), 8 steps, CFG 5
 * with an empty negative prompt; every frame >= 40 dB in f32 (the bar) */
static void test_tiny_video(void) { /* f32 only: no bf16 parity is asserted for this model (its README) */
    const dl_dtype dt = DL_F32;
    dl_checkpoint *ck;
    if (dl_ckpt_open(&ck, DATA_DIR "/tiny_video/parity.safetensors", "tiny_video") != DL_OK) {
        CHECK(0, "%s", dl_last_error());
        return;
    }
    const int S = 64, F = 9;
    const dl_st_tensor *tv = dl_ckpt_find(ck, "video");
    dl_gen_shape shape = {.dt = dt}; /* 0: the model's defaults */
    shape.width = shape.height = S, shape.frames = F;
    dl_pipeline *p;
    if (!tv || tv->numel != (int64_t)F * S * S * 3 || dl_pipeline_load(&p, SOURCE_DIR "/models/difflet-tiny-video", &shape) != DL_OK) {
        CHECK(0, "difflet-tiny-video parity setup: %s", dl_last_error());
        dl_ckpt_free(ck);
        return;
    }
    float *want = malloc(sizeof(float) * (size_t)tv->numel);
    dl_ckpt_read(tv, DL_F32, want);
    dl_gen_request r = {.prompt = "a large red circle moving from left to right on a blue background", .negative_prompt = "",
                        .steps = 8, .guidance = 5.f, .init = ck, .want_pixels = 1};
    dl_media m;
    if (dl_pipeline_generate(p, &r, &m, NULL) == DL_OK) {
        double worst = 1e9;
        for (int f = 0; f < F && m.frames == F && m.width == S && m.height == S; f++) {
            double ps =
                test_psnr(m.pixels + (size_t)f * S * S * 3, want + (size_t)f * S * S * 3, (int64_t)S * S * 3, 1.0);
            worst = ps < worst ? ps : worst;
        }
        printf("difflet-tiny-video %s: worst frame PSNR %.1f dB\n", dl_dtype_name(dt), worst);
        CHECK(m.frames == F && worst >= (dt == DL_F32 ? 40.0 : 30.0), "difflet-tiny-video %s: %d frames, worst %.1f dB",
              dl_dtype_name(dt), m.frames, worst);
        dl_media_free(&m);
    } else
        CHECK(0, "difflet-tiny-video: %s", dl_last_error());
    free(want);
    dl_pipeline_free(p);
    dl_ckpt_free(ck);
}

static void on_probe(void *ctx, int step, int branch, double probe, double change) {
    double *sc = ctx;
    (void)change;
    if (branch == 0 && step < 16) sc[step] = probe;
}

/* Step caching on Wan: the probe is its own program; cadence, online delta and the
 * calibrated probe all skip denoiser calls and keep the video finite */
static void test_cache(void) {
    dl_gen_shape shape = {.width = 48, .height = 32, .frames = 9, .max_sequence_length = 16, .dt = DL_F32};
    dl_pipeline *p;
    if (dl_pipeline_load(&p, DATA_DIR "/wan/a", &shape) != DL_OK) {
        CHECK(0, "load: %s", dl_last_error());
        return;
    }
    CHECK(strlen(dl_pipeline_program_id(p, 2)) == 16 && strcmp(dl_pipeline_program_id(p, 2), dl_pipeline_program_id(p, 3)),
          "the probe is a program of its own (%s, transformer %s)", dl_pipeline_program_id(p, 2), dl_pipeline_program_id(p, 3));
    char cal[] = "/tmp/difflet_wan_cal_XXXXXX";
    int fd = mkstemp(cal);
    const char *js = "{\"coefficients\": [1.0, 0.0], \"threshold\": 0.6, \"accumulate\": true}";
    CHECK(fd >= 0 && write(fd, js, strlen(js)) == (ssize_t)strlen(js), "calibration file");
    if (fd >= 0) close(fd);
    char spec[96];
    snprintf(spec, sizeof spec, "calibrated:%s", cal);
    const char *modes[] = {"off", "cadence:2", "online-delta:9.5", spec}; /* random weights: the change never shrinks 0.6x */
    int calls_off = 0;
    for (int k = 0; k < 4; k++) {
        dl_stepcache_config sc;
        CHECK(dl_stepcache_parse(modes[k], &sc) == DL_OK, "%s: %s", modes[k], dl_last_error());
        sc.keep_first = sc.keep_last = 2;
        double score[16] = {0};
        dl_gen_request r = {.prompt = "a red circle", .steps = 12, .guidance = 5.f, .seed = 3, .cache = &sc,
                            .on_probe = k == 3 ? on_probe : NULL, .ctx = score};
        dl_media m;
        dl_gen_timing tm;
        if (dl_pipeline_generate(p, &r, &m, &tm) != DL_OK) {
            CHECK(0, "%s: %s", modes[k], dl_last_error());
            continue;
        }
        int finite = 1;
        for (int64_t i = 0; i < (int64_t)m.frames * m.width * m.height * 3 && m.pixels; i++) finite &= isfinite(m.pixels[i]);
        if (k == 0) calls_off = tm.denoiser_calls;
        printf("wan step cache %-14s: %d transformer calls, %d cached steps\n", k == 3 ? "calibrated" : modes[k],
               tm.denoiser_calls, tm.cached_steps);
        CHECK(finite, "%s: finite video", modes[k]);
        CHECK(k == 0 ? tm.denoiser_calls == 24 : tm.denoiser_calls < calls_off && tm.cached_steps > 0,
              "%s: %d calls, %d cached", modes[k], tm.denoiser_calls, tm.cached_steps);
        if (k == 3) CHECK(score[0] == 0 && score[1] > 0 && score[5] > 0, "probe scores %g %g %g", score[0], score[1], score[5]);
        dl_media_free(&m);
    }
    remove(cal);
    dl_pipeline_free(p);
}

/* Batched CFG: one program for both branches gives each branch what the one-branch
 * program gives (the same linears over twice the rows; attention per branch) */
static void test_batch(const char *v, dl_dtype dt) {
    char path[256], name[64];
    snprintf(path, sizeof path, DATA_DIR "/wan/%s", v);
    dl_model_dir *dir;
    if (dl_model_dir_open(&dir, path) != DL_OK) return;
    int64_t shape[8] = {0}, n = 0, ne = 0, tsh[8] = {0};
    snprintf(name, sizeof name, "%s.step.latents", v);
    float *lat = test_vec(g_vec, name, &n, shape);
    snprintf(name, sizeof name, "%s.text.embeds", v);
    float *emb = test_vec(g_vec, name, &ne, tsh);
    float *neg = malloc((size_t)ne * 4), *a0 = malloc((size_t)n * 4), *a1 = malloc((size_t)n * 4);
    float *b0 = malloc((size_t)n * 4), *b1 = malloc((size_t)n * 4), *c0 = malloc((size_t)n * 4);
    for (int64_t i = 0; i < ne; i++) neg[i] = i < ne / 3 ? 0.5f * emb[ne - 1 - i] : 0.f; /* another, shorter text */
    dl_wan *one = NULL, *two = NULL;
    int ok = lat && emb && dl_wan_load(&one, dir, "transformer", shape[1], shape[2], shape[3], tsh[0], dt, NULL, NULL) == DL_OK &&
             dl_wan_load_batch(&two, dir, "transformer", shape[1], shape[2], shape[3], tsh[0], dt, NULL, NULL, 2) == DL_OK;
    CHECK(ok, "%s batch load: %s", v, dl_last_error());
    if (ok) {
        ok = dl_wan_run(one, lat, emb, 500.f, a0) == DL_OK && dl_wan_run(one, lat, neg, 500.f, a1) == DL_OK &&
             dl_wan_run2(two, lat, emb, neg, 500.f, b0, b1) == DL_OK && dl_wan_run(two, lat, emb, 500.f, c0) == DL_OK;
        CHECK(ok, "%s batch run: %s", v, dl_last_error());
        double e0 = test_rel_err(b0, a0, n), e1 = test_rel_err(b1, a1, n), e2 = test_rel_err(c0, a0, n),
               d = test_rel_err(a1, a0, n);
        printf("wan %s batched CFG %s: branch 0 %.2g, branch 1 %.2g, one-branch call %.2g (the branches differ by %.2g)\n", v,
               dl_dtype_name(dt), e0, e1, e2, d);
        double bound = dt == DL_F32 ? 1e-6 : 1e-2;
        CHECK(ok && e0 <= bound && e1 <= bound && e2 <= bound && d > 0.1, "%s batch: %g %g %g (branches %g)", v, e0, e1, e2, d);
        CHECK(dl_wan_batch(two) == 2 && dl_wan_run2(one, lat, emb, neg, 500.f, b0, b1) == DL_ERR_INVALID,
              "run2 needs a batch-2 program");
    }
    dl_wan_free(one), dl_wan_free(two);
    free(lat), free(emb), free(neg), free(a0), free(a1), free(b0), free(b1), free(c0);
    dl_model_dir_free(dir);
}

/* Batched CFG through the pipeline: the same video as sequential CFG (branch 1's rows
 * sit at another matmul row offset: rounding only), the same denoiser evaluations */
static void test_batch_pipeline(void) {
    dl_gen_shape sh = {.width = 48, .height = 32, .frames = 9, .max_sequence_length = 16, .dt = DL_F32};
    dl_pipeline *p1 = NULL, *p2 = NULL;
    dl_gen_shape sb = sh;
    sb.cfg_batch = 1;
    int ok = dl_pipeline_load(&p1, DATA_DIR "/wan/a", &sh) == DL_OK && dl_pipeline_load(&p2, DATA_DIR "/wan/a", &sb) == DL_OK;
    CHECK(ok, "batched pipeline load: %s", dl_last_error());
    dl_stepcache_config cad;
    dl_stepcache_parse("cadence:2", &cad);
    cad.keep_first = cad.keep_last = 2;
    for (int k = 0; ok && k < 2; k++) {
        dl_gen_request r = {.prompt = "a red circle moving", .negative_prompt = "blurry", .steps = 8, .guidance = 5.f,
                            .seed = 4, .want_pixels = 1, .cache = k ? &cad : NULL};
        dl_media a, b;
        dl_gen_timing ta, tb;
        ok = dl_pipeline_generate(p1, &r, &a, &ta) == DL_OK && dl_pipeline_generate(p2, &r, &b, &tb) == DL_OK;
        CHECK(ok, "batched generate: %s", dl_last_error());
        if (!ok) break;
        double db = test_psnr(a.pixels, b.pixels, (int64_t)a.frames * a.width * a.height * 3, 1.0);
        printf("wan batched CFG pipeline%s: %.1f dB against sequential, %d / %d evaluations\n", k ? " (cadence:2)" : "", db,
               tb.denoiser_calls, ta.denoiser_calls);
        CHECK(db >= 100 && ta.denoiser_calls == tb.denoiser_calls, "batched vs sequential: %.1f dB, %d vs %d calls", db,
              tb.denoiser_calls, ta.denoiser_calls);
        dl_media_free(&a), dl_media_free(&b);
    }
    dl_pipeline_free(p1), dl_pipeline_free(p2);
}

static void test_refusals(void) {
    dl_model_dir *dir;
    if (dl_model_dir_open(&dir, DATA_DIR "/wan/a") != DL_OK) return;
    dl_wan *m;
    /* grid not divisible by the patch (a: patch (1, 2, 2)) */
    CHECK(dl_wan_load(&m, dir, "transformer", 3, 7, 12, 16, DL_F32, NULL, NULL) == DL_ERR_INVALID &&
              strstr(dl_last_error(), "patch_size"),
          "odd grid: %s", dl_last_error());
    dl_dit_split tp4 = {.tp = 4, .cp = 1}; /* a has 2 heads */
    CHECK(dl_wan_load(&m, dir, "transformer", 3, 8, 12, 16, DL_F32, NULL, &tp4) == DL_ERR_INVALID &&
              strstr(dl_last_error(), "not divisible by tp=4"),
          "tp=4 refused for 2 heads: %s", dl_last_error());
    CHECK(dl_wan_load(&m, dir, "vae", 3, 8, 12, 16, DL_F32, NULL, NULL) != DL_OK, "not a transformer");
    dl_model_dir_free(dir);
}

int main(void) {
    if (dl_ckpt_open(&g_vec, DATA_DIR "/wan/vectors.safetensors", "vectors") != DL_OK) {
        CHECK(0, "vectors: %s", dl_last_error());
        return test_done("test_wan");
    }
    for (int i = 0; i < 2; i++) {
        test_step(i ? "b" : "a", DL_F32);
        test_step(i ? "b" : "a", DL_BF16);
    }
    for (int i = 0; i < 2; i++) {
        test_pipeline(i ? "b" : "a", DL_F32, 2);
        test_pipeline(i ? "b" : "a", DL_BF16, 2);
    }
    test_pipeline("a_euler", DL_F32, 1); /* FlowMatchEulerDiscreteScheduler, set_timesteps(steps) */
    test_tiny_video();
    test_batch("a", DL_F32);
    test_batch("b", DL_F32);
    test_batch("a", DL_BF16);
    test_batch_pipeline();
    test_cache();
    test_refusals();
    dl_ckpt_free(g_vec);
    return test_done("test_wan");
}
