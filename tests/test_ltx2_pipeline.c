/* LTX2Pipeline end to end against diffusers (tools/parity/make_ltx2_pipeline_vectors.py):
 * the tiny random pipeline in tests/data/ltx2/pipe with the reference call's initial
 * noise (`latents`, `audio_latents`, read from the vectors file as --latents reads
 * them), CFG with a negative prompt, STG on block 1, modality isolation and guidance
 * rescale at __call__'s default scales, 3 steps; every frame's PSNR and each audio
 * channel's SNR (dl_media's interleaved [samples, channels] against diffusers' stereo
 * [channels, samples] waveform, channel by channel: a mix or a swap fails) against
 * diffusers' f32 outputs. Also: the STG path of the transformer changes its output
 * (a test that STG is wired); the registry's layout check takes the layouts the
 * transformer can split into and refuses the others by name (the layouts themselves
 * are run against one rank in test_parallel).
 * Step caching (the pipeline's own loop): off, and a cadence whose kept steps cover
 * the whole run, leave the output byte-identical; cadence:2 with keep 1,1 on 6 steps
 * runs 2 steps x 4 passes fewer and stays close to the uncached output; online-delta
 * and calibrated run; the probe program scores 0 on a slot's first call and > 0 once
 * the latents change. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "difflet/io.h"
#include "difflet/ltx2.h"
#include "difflet/pipeline.h"
#include "difflet/registry.h"
#include "test_util.h"

#define PIPE DATA_DIR "/ltx2/pipe"

static void test_pipeline(dl_dtype dt) {
    dl_checkpoint *vec = NULL;
    if (dl_ckpt_open(&vec, PIPE "/vectors.safetensors", "pipeline vectors") != DL_OK) {
        CHECK(0, "%s", dl_last_error());
        return;
    }
    int64_t nf = 0, na = 0, fs[DL_ST_MAX_DIMS] = {0}, as[DL_ST_MAX_DIMS] = {0};
    float *want = test_vec(vec, "frames", &nf, fs), *wave = test_vec(vec, "audio", &na, as);
    const int F = (int)fs[0], H = (int)fs[1], W = (int)fs[2];
    dl_gen_shape shape = {.width = W, .height = H, .frames = F, .max_sequence_length = 16, .dt = dt};
    dl_pipeline *p = NULL;
    if (!want || !wave || dl_pipeline_load(&p, PIPE, &shape) != DL_OK) {
        CHECK(0, "pipeline load: %s", dl_last_error());
        free(want), free(wave), dl_ckpt_free(vec);
        return;
    }
    dl_gen_request r = {.prompt = "A red circle moves to the right.", .negative_prompt = "blurry, static", .steps = 3,
                        .guidance = 3.0f, .init = vec, .want_pixels = 1};
    dl_media m;
    dl_gen_timing tm;
    if (dl_pipeline_generate(p, &r, &m, &tm) == DL_OK) {
        const int64_t fr = (int64_t)H * W * 3;
        CHECK(m.kind == DL_MEDIA_VIDEO_AUDIO && m.frames == F && m.width == W && m.height == H && nf == F * fr,
              "%d frames %dx%d", m.frames, m.width, m.height);
        double worst = INFINITY;
        for (int f = 0; f < F && m.frames == F && nf == F * fr; f++) {
            double ps = test_psnr(m.pixels + f * fr, want + f * fr, fr, 1.0);
            worst = ps < worst ? ps : worst;
        }
        /* each channel against the reference's: wave [ch, S], m.audio [S, ch] */
        const int64_t ch = as[0], S = as[1];
        int audio_ok = ch == 2 && na == ch * S && m.audio && m.audio_channels == ch && m.audio_samples == S &&
                       m.audio_rate == 24000;
        CHECK(audio_ok, "audio: %lld samples x %d channels at %d Hz, want %lld x %lld at 24000",
              (long long)m.audio_samples, m.audio_channels, m.audio_rate, (long long)S, (long long)ch);
        double snr = INFINITY;
        for (int64_t c = 0; audio_ok && c < ch; c++) {
            double se = 0, sig = 0;
            for (int64_t i = 0; i < S; i++) {
                const double w = wave[c * S + i], d = m.audio[i * ch + c] - w;
                se += d * d, sig += w * w;
            }
            const double cs = se == 0 ? INFINITY : 10 * log10(sig / se);
            snr = cs < snr ? cs : snr;
        }
        if (!audio_ok) snr = -INFINITY;
        /* the test can fail: the reference's channels differ enough that their mix (what
         * dl_media carried before it had channels) is far below the SNR asked for */
        double mix_se = 0, mix_sig = 0;
        for (int64_t i = 0; ch == 2 && na == ch * S && i < S; i++) {
            const double l = wave[i], rt = wave[S + i], d = l - (l + rt) / 2;
            mix_se += d * d, mix_sig += l * l;
        }
        const double mix_snr = mix_se == 0 ? INFINITY : 10 * log10(mix_sig / mix_se);
        CHECK(mix_snr < 20.0, "the left channel against the mix: %.1f dB, want a mix to fail", mix_snr);
        printf("ltx2 pipeline %s: worst frame PSNR %.1f dB, worst channel's waveform SNR %.1f dB (%d transformer calls)\n",
               dl_dtype_name(dt), worst, snr, tm.denoiser_calls);
        CHECK(worst >= (dt == DL_F32 ? 45.0 : 30.0), "%s: worst frame %.1f dB", dl_dtype_name(dt), worst);
        CHECK(snr >= (dt == DL_F32 ? 40.0 : 20.0), "%s: worst channel's waveform SNR %.1f dB", dl_dtype_name(dt), snr);
        CHECK(tm.denoiser_calls == 12, "%d transformer calls, want 12 (4 passes x 3 steps)", tm.denoiser_calls);
        dl_media_free(&m);
    } else
        CHECK(0, "generate: %s", dl_last_error());
    /* the frame rate is the loaded one */
    r.fps = 30;
    CHECK(dl_pipeline_generate(p, &r, &m, &tm) != DL_OK && strstr(dl_last_error(), "frame_rate"), "fps 30: %s",
          dl_last_error());
    dl_pipeline_free(p);
    free(want), free(wave);
    dl_ckpt_free(vec);
}

/* STG is live: perturbing block 1 changes both streams' outputs; block 28 of 2 does not */
static void test_stg(void) {
    dl_model_dir *dir;
    dl_ltx2_transformer *m = NULL;
    dl_ltx2_transformer_shape sh = {3, 8, 8, 9, 16, 24.0};
    if (dl_model_dir_open(&dir, PIPE) != DL_OK || dl_ltx2_transformer_load(&m, dir, "transformer", &sh, DL_F32, NULL) != DL_OK) {
        CHECK(0, "transformer: %s", dl_last_error());
        return;
    }
    const dl_ltx2_transformer_info *in = dl_ltx2_transformer_get_info(m);
    const int64_t nv = in->video_tokens * in->video_in, na = in->audio_tokens * in->audio_in;
    const int64_t nt = in->text_rows * in->text_width, nat = in->text_rows * in->audio_text_width;
    float *v = malloc(nv * 4), *a = malloc(na * 4), *t = malloc(nt * 4), *at = malloc(nat * 4);
    float *o[3][2];
    for (int k = 0; k < 3; k++) o[k][0] = malloc(nv * 4), o[k][1] = malloc(na * 4);
    dl_randn(1, v, nv), dl_randn(2, a, na), dl_randn(3, t, nt), dl_randn(4, at, nat);
    const int b1[1] = {1}, b28[1] = {28};
    dl_ltx2_transformer_input x = {.video = v, .audio = a, .text = t, .audio_text = at, .video_tokens = in->video_tokens,
                                   .audio_tokens = in->audio_tokens, .text_rows = in->text_rows, .timestep = 500,
                                   .audio_timestep = 500, .sigma = 500, .audio_sigma = 500, .use_cross_timestep = 1};
    int ok = in->perturbed_attn && in->layers == 2 && dl_ltx2_transformer_run(m, &x, o[0][0], o[0][1]) == DL_OK;
    x.stg_blocks = b1, x.stg_nblocks = 1;
    ok = ok && dl_ltx2_transformer_run(m, &x, o[1][0], o[1][1]) == DL_OK;
    x.stg_blocks = b28;
    ok = ok && dl_ltx2_transformer_run(m, &x, o[2][0], o[2][1]) == DL_OK;
    CHECK(ok, "STG runs: %s", dl_last_error());
    if (ok) {
        CHECK(test_rel_err(o[1][0], o[0][0], nv) > 1e-3 && test_rel_err(o[1][1], o[0][1], na) > 1e-3,
              "STG on block 1 changes nothing");
        CHECK(!memcmp(o[2][0], o[0][0], nv * 4) && !memcmp(o[2][1], o[0][1], na * 4), "STG on block 28 of 2 changed the output");
    }
    for (int k = 0; k < 3; k++) free(o[k][0]), free(o[k][1]);
    free(v), free(a), free(t), free(at);
    dl_ltx2_transformer_free(m);
    dl_model_dir_free(dir);
}

/* the probe: 0 on a slot's first call and after a reset, > 0 once the latents change,
 * 0 again for the same input; slots are independent */
static void test_probe(void) {
    dl_model_dir *dir;
    dl_ltx2_probe *pr = NULL;
    dl_ltx2_transformer *m = NULL;
    dl_ltx2_transformer_shape sh = {3, 8, 8, 9, 16, 24.0};
    if (dl_model_dir_open(&dir, PIPE) != DL_OK || dl_ltx2_probe_load(&pr, dir, "transformer", &sh, DL_F32, NULL) != DL_OK ||
        dl_ltx2_transformer_load(&m, dir, "transformer", &sh, DL_F32, NULL) != DL_OK) {
        CHECK(0, "probe: %s", dl_last_error());
        return;
    }
    const dl_ltx2_transformer_info *in = dl_ltx2_transformer_get_info(m);
    const int64_t n = in->video_tokens * in->video_in; /* the latents the probe takes: the transformer's */
    dl_ltx2_transformer_free(m);
    float *v = malloc(n * 4);
    dl_randn(5, v, n);
    double a = -1, b = -1, c = -1, d = -1, e = -1;
    int ok = dl_ltx2_probe_run(pr, 0, v, 900.f, &a) == DL_OK;
    ok = ok && dl_ltx2_probe_run(pr, 0, v, 900.f, &b) == DL_OK;
    for (int64_t i = 0; i < n; i++) v[i] *= 0.9f;
    ok = ok && dl_ltx2_probe_run(pr, 0, v, 800.f, &c) == DL_OK;
    ok = ok && dl_ltx2_probe_run(pr, 1, v, 800.f, &d) == DL_OK;
    dl_ltx2_probe_reset(pr);
    ok = ok && dl_ltx2_probe_run(pr, 0, v, 800.f, &e) == DL_OK;
    CHECK(ok, "probe runs: %s", dl_last_error());
    printf("ltx2 probe: first %g, same input %g, changed %g, other slot's first %g, after reset %g\n", a, b, c, d, e);
    CHECK(a == 0 && b == 0 && c > 1e-3 && isfinite(c) && d == 0 && e == 0, "probe scores %g %g %g %g %g", a, b, c, d, e);
    CHECK(dl_ltx2_probe_run(pr, 2, v, 800.f, &a) != DL_OK && strstr(dl_last_error(), "slot"), "slot 2: %s", dl_last_error());
    v[7] = NAN;
    CHECK(dl_ltx2_probe_run(pr, 0, v, 800.f, &a) != DL_OK && strstr(dl_last_error(), "finite"), "NaN latents: %s", dl_last_error());
    free(v);
    dl_ltx2_probe_free(pr);
    dl_model_dir_free(dir);
}

typedef struct {
    int calls[2], scored;
} probe_log;
static void on_probe(void *ctx, int step, int branch, double probe, double change) {
    probe_log *l = ctx;
    (void)change;
    if (branch == 0 || branch == 1) l->calls[branch]++;
    l->scored += step > 0 && probe > 0;
}

/* one generation with caching spec (NULL: no config); 1 on success */
static int gen_cached(dl_pipeline *p, const char *spec, int keep, int steps, dl_media *m, dl_gen_timing *tm, probe_log *pl) {
    dl_stepcache_config c;
    if (spec && dl_stepcache_parse(spec, &c) != DL_OK) return 0;
    c.keep_first = c.keep_last = keep;
    dl_gen_request r = {.prompt = "A red circle moves to the right.", .negative_prompt = "blurry, static", .steps = steps,
                        .guidance = 3.0f, .seed = 7, .want_pixels = 1, .cache = spec ? &c : NULL};
    if (pl) r.on_probe = on_probe, r.ctx = pl;
    return dl_pipeline_generate(p, &r, m, tm) == DL_OK;
}

static void test_cache(void) {
    dl_gen_shape shape = {.width = 96, .height = 96, .frames = 9, .max_sequence_length = 16, .dt = DL_F32};
    dl_pipeline *p = NULL;
    if (dl_pipeline_load(&p, PIPE, &shape) != DL_OK) {
        CHECK(0, "pipeline load: %s", dl_last_error());
        return;
    }
    dl_media ref = {0}, m = {0};
    dl_gen_timing t0, tm;
    if (!gen_cached(p, NULL, 1, 6, &ref, &t0, NULL)) {
        CHECK(0, "uncached: %s", dl_last_error());
        dl_pipeline_free(p);
        return;
    }
    const int64_t np = (int64_t)ref.frames * ref.width * ref.height * 3;
    CHECK(t0.denoiser_calls == 24 && t0.cached_steps == 0, "uncached: %d calls, %d cached", t0.denoiser_calls, t0.cached_steps);
    /* same bytes: the output and the waveform */
#define SAME(a, b) ((a).frames == (b).frames && !memcmp((a).pixels, (b).pixels, (size_t)np * 4) && \
                    (a).audio_samples == (b).audio_samples && \
                    !memcmp((a).audio, (b).audio, (size_t)((a).audio_samples * (a).audio_channels) * 4))
    CHECK(gen_cached(p, "off", 1, 6, &m, &tm, NULL) && SAME(m, ref) && tm.denoiser_calls == 24, "cache off differs: %s",
          dl_last_error());
    dl_media_free(&m);
    /* the estimator tracks every step but the kept steps cover them: nothing cached, nothing changed */
    CHECK(gen_cached(p, "cadence:2", 3, 6, &m, &tm, NULL) && SAME(m, ref) && tm.cached_steps == 0, "cadence with keep 3,3: %s",
          dl_last_error());
    dl_media_free(&m);
    /* cadence:2, keep 1,1 on 6 steps: steps 2 and 4 are estimated, 4 passes each */
    if (gen_cached(p, "cadence:2", 1, 6, &m, &tm, NULL)) {
        const double ps = test_psnr(m.pixels, ref.pixels, np, 1.0);
        printf("ltx2 cadence:2 keep 1,1, 6 steps: %d transformer calls, %d cached passes, PSNR %.1f dB against uncached\n",
               tm.denoiser_calls, tm.cached_steps, ps);
        CHECK(tm.denoiser_calls == 16 && tm.cached_steps == 8, "cadence:2: %d calls, %d cached", tm.denoiser_calls, tm.cached_steps);
        CHECK(ps >= 20.0 && isfinite(ps), "cadence:2: PSNR %.1f dB against uncached", ps);
        CHECK(memcmp(m.pixels, ref.pixels, (size_t)np * 4), "cadence:2 changed nothing");
        dl_media_free(&m);
    } else
        CHECK(0, "cadence:2: %s", dl_last_error());
    CHECK(gen_cached(p, "online-delta", 1, 6, &m, &tm, NULL) && tm.denoiser_calls + tm.cached_steps == 24,
          "online-delta: %s (%d calls, %d cached)", dl_last_error(), tm.denoiser_calls, tm.cached_steps);
    dl_media_free(&m);
    /* calibrate's hook: a probe score and a change per step for the two CFG branches */
    probe_log pl = {{0, 0}, 0};
    CHECK(gen_cached(p, "off", 1, 6, &m, &tm, &pl) && SAME(m, ref) && pl.calls[0] == 6 && pl.calls[1] == 6 && pl.scored >= 8 &&
              tm.probe_s > 0,
          "on_probe: %d / %d calls, %d scored: %s", pl.calls[0], pl.calls[1], pl.scored, dl_last_error());
    dl_media_free(&m);
    /* calibrated: a polynomial that estimates a tiny change caches every allowed step */
    char path[] = "/tmp/difflet_ltx2_calXXXXXX";
    int fd = mkstemp(path);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (f) {
        fputs("{\"coefficients\": [0.0, 0.001], \"threshold\": 0.5, \"accumulate\": true}", f);
        fclose(f);
        char spec[64];
        snprintf(spec, sizeof spec, "calibrated:%s", path);
        CHECK(gen_cached(p, spec, 1, 6, &m, &tm, NULL) && tm.cached_steps == 8 && tm.denoiser_calls == 16,
              "calibrated: %s (%d calls, %d cached)", dl_last_error(), tm.denoiser_calls, tm.cached_steps);
        dl_media_free(&m);
        remove(path);
    } else
        CHECK(0, "temp file");
#undef SAME
    dl_media_free(&ref);
    dl_pipeline_free(p);
}

/* the layouts `generate --parallel` takes or refuses for the tiny pipeline (2 video and
 * 2 audio heads), before anything is launched */
static void test_layouts(void) {
    static const struct {
        const char *spec;
        int passes;
        const char *refused; /* NULL: feasible */
    } cases[] = {
        {"tp=2", 2, NULL},
        {"cp=2:ulysses", 2, NULL},
        {"cp=4:ring", 2, NULL},
        {"tp=2,cp=3:gather", 2, NULL},
        {"cfg=2,cp=2:ring", 2, NULL},
        {"dp=2,tp=2", 1, NULL},
        {"tp=4", 2, "not divisible by tp=4"},
        {"cp=4:ulysses", 2, "tp x cp = 4"},
        {"tp=2,sp", 2, "sequence parallelism"},
        {"cfg=2", 1, "cfg=2 runs"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dl_par_config c;
        char buf[512];
        const char *why = dl_par_parse(cases[i].spec, &c) == DL_OK
                              ? dl_pipeline_layout_check(PIPE, &c, cases[i].passes, dl_par_ranks(&c), buf, sizeof buf)
                              : dl_last_error();
        if (cases[i].refused)
            CHECK(why && strstr(why, cases[i].refused), "%s: want refused (%s), got %s", cases[i].spec, cases[i].refused,
                  why ? why : "feasible");
        else
            CHECK(!why, "%s refused: %s", cases[i].spec, why);
    }
}

int main(void) {
    const dl_model_entry *e = dl_registry_find("LTX2Pipeline");
    CHECK(e && e->output == DL_MEDIA_VIDEO_AUDIO && e->split_check, "no LTX2Pipeline entry with a split check");
    test_layouts();
    test_stg();
    test_probe();
    test_cache();
    test_pipeline(DL_F32);
    test_pipeline(DL_BF16);
    return test_done("test_ltx2_pipeline");
}
