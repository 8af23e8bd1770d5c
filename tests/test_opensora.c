/* The whole OpenSora 1.2 text-to-video flow against Open-Sora v1.2.0's own sampling
 * path (tests/data/opensora/README.md: scripts/inference.py's prompt handling, the
 * T5 embedder, RFLOW with its timestep transform and CFG against the null caption,
 * OpenSoraVAE v1.2, save_sample's bytes) on the same initial noise, for the tiny
 * random models a (34 frames: two VAE chunks, 4 steps) and b (17 frames, patch
 * (2, 2, 2) with a padded latent, 3 steps). Every frame >= 45 dB in f32 and >= 30 dB
 * in bf16 (the bars); in f32 also the bytes (at most 1 in 1000 off by one). Then what
 * a request can get wrong. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "difflet/io.h"
#include "difflet/registry.h"
#include "test_util.h"

typedef struct {
    const char *key;
    int W, H, F, steps;
} pipe_case;

static void test_pipeline(const pipe_case *c, dl_dtype dt) {
    char path[256], vpath[256], lat_path[] = "/tmp/difflet_os_lat_XXXXXX";
    snprintf(path, sizeof path, DATA_DIR "/opensora/%s", c->key);
    snprintf(vpath, sizeof vpath, DATA_DIR "/opensora/%s/pipeline_vectors.safetensors", c->key);
    dl_checkpoint *vec = NULL;
    if (dl_ckpt_open(&vec, vpath, "pipeline vectors") != DL_OK) {
        CHECK(0, "%s", dl_last_error());
        return;
    }
    dl_gen_shape shape = {.width = c->W, .height = c->H, .frames = c->F, .dt = dt};
    dl_pipeline *p;
    if (dl_pipeline_load(&p, path, &shape) != DL_OK) {
        CHECK(0, "%s pipeline load: %s", c->key, dl_last_error());
        dl_ckpt_free(vec);
        return;
    }
    int fd = mkstemp(lat_path);
    if (fd >= 0) close(fd);
    int64_t n = 0, nv = 0, nb = 0;
    const dl_st_tensor *zt = dl_ckpt_find(vec, "pipe.z0"), *bt = dl_ckpt_find(vec, "pipe.frames");
    float *init = test_vec(vec, "pipe.z0", &n, NULL);
    float *video = test_vec(vec, "pipe.video", &nv, NULL);
    uint8_t *bytes = bt && bt->dtype == DL_ST_U8 ? malloc((size_t)bt->numel) : NULL;
    if (bytes) memcpy(bytes, bt->data, (size_t)bt->numel);
    nb = bt ? bt->numel : 0;
    dl_st_writer *w = dl_st_writer_new();
    dl_checkpoint *ck = NULL;
    const int64_t Hv = c->H / 8 * 8, Wv = c->W / 8 * 8, fr = Hv * Wv * 3;
    if (!zt || !init || !video || !bytes || nv != 3 * c->F * Hv * Wv || nb != c->F * fr ||
        dl_st_writer_add(w, "latents", DL_ST_F32, zt->ndim, zt->shape, init) != DL_OK ||
        dl_st_writer_save(w, lat_path) != DL_OK || dl_ckpt_open(&ck, lat_path, NULL) != DL_OK) {
        CHECK(0, "%s inputs: %s", c->key, dl_last_error());
    } else {
        dl_gen_request r = {.prompt = "a red fox runs through the snow", .steps = c->steps, .guidance = 7.f, .init = ck, .want_pixels = 1};
        dl_media m;
        dl_gen_timing tm;
        if (dl_pipeline_generate(p, &r, &m, &tm) == DL_OK) {
            CHECK(m.frames == c->F && m.width == Wv && m.height == Hv && m.kind == DL_MEDIA_VIDEO && m.fps == 24.0,
                  "%s: %d frames %dx%d at %g fps", c->key, m.frames, m.width, m.height, m.fps);
            double worst = 1e9;
            int64_t off = 0, off2 = 0;
            for (int f = 0; f < c->F; f++) {
                double se = 0;
                for (int64_t i = 0; i < fr; i++) {
                    int64_t ch = i % 3, px = i / 3; /* reference pixel: (clamp(x) + 1) / 2 of planar [3, F, H, W] */
                    float x = video[(ch * c->F + f) * Hv * Wv + px];
                    x = (x < -1.f ? -1.f : x > 1.f ? 1.f : x) + 1.f;
                    double d = (double)m.pixels[f * fr + i] - x / 2.f;
                    se += d * d;
                    int db = abs((int)m.rgb[f * fr + i] - (int)bytes[f * fr + i]);
                    off += db != 0, off2 += db > 1;
                }
                double ps = se == 0 ? 1e9 : 10.0 * log10(1.0 / (se / (double)fr));
                worst = ps < worst ? ps : worst;
            }
            printf("opensora pipeline %s %s: worst frame PSNR %.1f dB, %lld of %lld bytes differ (%lld by more than 1), "
                   "%d transformer calls\n",
                   c->key, dl_dtype_name(dt), worst, (long long)off, (long long)nb, (long long)off2, tm.denoiser_calls);
            CHECK(worst >= (dt == DL_F32 ? 45.0 : 30.0), "%s %s: %.1f dB", c->key, dl_dtype_name(dt), worst);
            CHECK(tm.denoiser_calls == 2 * c->steps, "%s: %d transformer calls, want %d", c->key, tm.denoiser_calls,
                  2 * c->steps);
            if (dt == DL_F32) {
                CHECK(off2 == 0 && off * 1000 <= nb, "%s: %lld bytes differ, %lld by more than 1", c->key, (long long)off,
                      (long long)off2);
            }
            dl_media_free(&m);
        } else
            CHECK(0, "%s: %s", c->key, dl_last_error());
    }
    dl_ckpt_free(ck);
    dl_st_writer_free(w);
    free(init), free(video), free(bytes);
    remove(lat_path);
    dl_ckpt_free(vec);
    dl_pipeline_free(p);
}

/* requests and shapes the pipeline refuses, with the reason */
static void test_refusals(void) {
    dl_gen_shape shape = {.width = 96, .height = 64, .frames = 34, .dt = DL_F32};
    dl_pipeline *p;
    if (dl_pipeline_load(&p, DATA_DIR "/opensora/a", &shape) != DL_OK) {
        CHECK(0, "load: %s", dl_last_error());
        return;
    }
    dl_media m;
    dl_gen_request r = {.prompt = "a fox", .negative_prompt = "blurry", .steps = 2, .guidance = 7.f};
    CHECK(dl_pipeline_generate(p, &r, &m, NULL) == DL_ERR_INVALID && strstr(dl_last_error(), "null caption"),
          "a negative prompt: %s", dl_last_error());
    r.negative_prompt = NULL, r.steps = 0;
    CHECK(dl_pipeline_generate(p, &r, &m, NULL) == DL_ERR_INVALID, "0 steps accepted");
    r.steps = 2, r.guidance = NAN;
    CHECK(dl_pipeline_generate(p, &r, &m, NULL) == DL_ERR_INVALID, "NaN guidance accepted");
    r.guidance = 7.f, r.prompt = NULL;
    CHECK(dl_pipeline_generate(p, &r, &m, NULL) == DL_ERR_INVALID, "no prompt accepted");
    /* a prompt that already carries a score keeps it; the run still succeeds */
    r.prompt = "A FOX!! aesthetic score: 5.0.";
    r.steps = 1;
    if (dl_pipeline_generate(p, &r, &m, NULL) == DL_OK) {
        CHECK(m.frames == 34 && m.width == 96 && m.height == 64, "one step: %d frames", m.frames);
        dl_media_free(&m);
    } else
        CHECK(0, "one step: %s", dl_last_error());
    dl_pipeline_free(p);
    dl_gen_shape bad[] = {{.width = 8, .height = 64, .frames = 34}, {.width = 96, .height = 64, .frames = 100001},
                          {.width = 96, .height = 64, .frames = 34, .max_sequence_length = 100}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        bad[i].dt = DL_F32;
        CHECK(dl_pipeline_load(&p, DATA_DIR "/opensora/a", &bad[i]) == DL_ERR_INVALID, "bad shape %zu accepted", i);
        if (p) dl_pipeline_free(p), p = NULL;
    }
}

/* DDiT's promotion on one rank: a request preempted at a step boundary hands over its
 * latents and resumes from them (here on the same pipeline); the video is the bytes of
 * an uninterrupted run, whichever step it stops at. What a resumable request refuses. */
typedef struct {
    int stop_after; /* set the flag when this step is done */
    atomic_int flag;
    int steps_done;
    float *lat;
    int64_t n;
} preempt_ctx;

static void pre_step(void *ctx, int step, int steps, double elapsed) {
    preempt_ctx *c = ctx;
    (void)steps, (void)elapsed;
    if (step == c->stop_after) atomic_store(&c->flag, 1);
}

static void pre_take(void *ctx, int steps_done, const float *lat, int64_t n) {
    preempt_ctx *c = ctx;
    c->steps_done = steps_done;
    free(c->lat);
    c->lat = malloc((size_t)n * sizeof *lat);
    if (c->lat) memcpy(c->lat, lat, (size_t)n * sizeof *lat);
    c->n = n;
}

static void test_resume(void) {
    dl_gen_shape shape = {.width = 56, .height = 40, .frames = 34, .dt = DL_F32};
    dl_pipeline *p;
    if (dl_pipeline_load(&p, DATA_DIR "/opensora/a", &shape) != DL_OK) {
        CHECK(0, "load: %s", dl_last_error());
        return;
    }
    CHECK(dl_pipeline_entry(p)->resumable, "OpenSoraPipeline is not resumable");
    dl_gen_request r = {.prompt = "a red fox runs through the snow", .steps = 5, .guidance = 7.f, .seed = 3};
    dl_media ref, m;
    if (dl_pipeline_generate(p, &r, &ref, NULL) != DL_OK) {
        CHECK(0, "uninterrupted: %s", dl_last_error());
        dl_pipeline_free(p);
        return;
    }
    for (int stop = 1; stop < r.steps; stop += 2) {
        preempt_ctx c = {.stop_after = stop};
        dl_gen_request a = r;
        a.preempt = &c.flag, a.on_step = pre_step, a.on_preempt = pre_take, a.ctx = &c;
        dl_status s = dl_pipeline_generate(p, &a, &m, NULL);
        CHECK(s == DL_ERR_PREEMPTED && c.steps_done == stop && c.lat && m.frames == 0,
              "preempt after step %d: status %d, %d steps done (%s)", stop, s, c.steps_done, dl_last_error());
        dl_gen_request b = r;
        b.resume_step = c.steps_done, b.resume_latents = c.lat, b.resume_numel = c.n;
        if (s == DL_ERR_PREEMPTED && dl_pipeline_generate(p, &b, &m, NULL) == DL_OK) {
            const size_t nb = (size_t)m.frames * m.width * m.height * 3;
            CHECK(m.frames == ref.frames && !memcmp(m.rgb, ref.rgb, nb), "resumed after step %d: not the uninterrupted bytes", stop);
            dl_media_free(&m);
        } else
            CHECK(0, "resume after step %d: %s", stop, dl_last_error());
        /* refused: a step out of range, latents of another size, step caching */
        b.resume_step = r.steps;
        CHECK(dl_pipeline_generate(p, &b, &m, NULL) == DL_ERR_INVALID, "resume at the last step accepted");
        b.resume_step = c.steps_done, b.resume_numel = c.n - 1;
        CHECK(dl_pipeline_generate(p, &b, &m, NULL) == DL_ERR_INVALID && strstr(dl_last_error(), "resume"),
              "short resume latents: %s", dl_last_error());
        b.resume_numel = c.n;
        dl_stepcache_config cc;
        if (dl_stepcache_parse("cadence:2", &cc) == DL_OK) {
            b.cache = &cc;
            CHECK(dl_pipeline_generate(p, &b, &m, NULL) == DL_ERR_INVALID && strstr(dl_last_error(), "step caching"),
                  "a resumed request with step caching: %s", dl_last_error());
        }
        free(c.lat);
    }
    dl_media_free(&ref);
    dl_pipeline_free(p);
}

static const pipe_case k_cases[] = {{"a", 56, 40, 34, 4}, {"b", 48, 48, 17, 3}};

int main(void) {
    for (size_t i = 0; i < sizeof k_cases / sizeof k_cases[0]; i++) {
        test_pipeline(&k_cases[i], DL_F32);
        test_pipeline(&k_cases[i], DL_BF16);
    }
    test_refusals();
    test_resume();
    return test_done("test_opensora");
}
