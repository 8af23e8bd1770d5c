/* Step caching: the decision logic of every mode on synthetic sequences, the output
 * estimator, parsing, and the pipeline: call counts, no state crossing requests,
 * and the probe. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "difflet/pipeline.h"
#include "test_util.h"
#include "difflet/flux.h"

/* run `steps` decisions; full steps see outputs out_k = (1 + step) * scale(step) */
static int simulate(const dl_stepcache_config *c, int steps, const double *scores, const float *outs, int *pattern) {
    float prev[1], delta[1], out[1];
    dl_stepcache_state s = {.prev = prev, .delta = delta, .n = 1};
    dl_stepcache_reset(&s);
    int calls = 0;
    for (int i = 0; i < steps; i++) {
        if (dl_stepcache_decide(c, &s, i, steps, scores ? scores[i] : 0)) {
            dl_stepcache_estimate(&s, out);
            pattern[i] = 1;
        } else {
            out[0] = outs[i];
            dl_stepcache_full(c, &s, out);
            pattern[i] = 0;
            calls++;
        }
    }
    return calls;
}

static void test_modes(void) {
    enum { S = 50 };
    float outs[S];
    int pat[S];
    for (int i = 0; i < S; i++) outs[i] = 10.f + (float)i * (1.f - (float)i / S); /* changes shrink */
    dl_stepcache_config c;
    dl_stepcache_parse("cadence:2", &c);
    CHECK(simulate(&c, S, NULL, outs, pat) == 30, "cadence 2, 50 steps, keep 5+5: 30 calls");
    int ok = 1;
    for (int i = 0; i < S; i++) ok &= pat[i] == (i >= 5 && i < 45 && (i - 5) % 2 == 1);
    CHECK(ok, "cadence 2 caches every second middle step");
    dl_stepcache_parse("cadence:3", &c);
    c.keep_first = c.keep_last = 0;
    CHECK(simulate(&c, 30, NULL, outs, pat) == 20, "cadence 3 with no kept steps: every third step cached, 20 calls");
    /* online delta: never two cached steps in a row, and only after a slow full step */
    dl_stepcache_parse("online-delta:0.6", &c);
    int calls = simulate(&c, S, NULL, outs, pat);
    ok = 1;
    for (int i = 1; i < S; i++) ok &= !(pat[i] && pat[i - 1]);
    for (int i = 0; i < 5; i++) ok &= !pat[i] && !pat[S - 1 - i];
    CHECK(ok && calls < S && calls >= 30, "online-delta: alternates at most, keeps 5+5 (%d calls)", calls);
    dl_stepcache_parse("online-delta:0.000001", &c);
    CHECK(simulate(&c, S, NULL, outs, pat) == S, "online-delta with a tiny alpha caches nothing");
    /* calibrated, accumulated: f(x) = x, constant score 0.1, threshold 0.25: acc 0.1
       cache, then a full step (never two cached in a row: each one extrapolates from
       the last computed change), reset, ... in the middle region */
    c = (dl_stepcache_config){.mode = DL_STEPCACHE_CALIBRATED, .threshold = 0.25f, .keep_first = 2, .keep_last = 2,
                              .coef = {1.0, 0.0}, .ncoef = 2, .accumulate = 1};
    double sc[20];
    for (int i = 0; i < 20; i++) sc[i] = 0.1;
    simulate(&c, 20, sc, outs, pat);
    ok = 1;
    for (int i = 0; i < 20; i++) ok &= pat[i] == (i >= 2 && i < 18 && (i - 2) % 2 == 0);
    CHECK(ok, "calibrated (accumulated): cache, compute and reset, ...");
    for (int i = 0; i < 20; i++) sc[i] = 0.0; /* no predicted change at all: still alternates */
    simulate(&c, 20, sc, outs, pat);
    ok = 1;
    for (int i = 1; i < 20; i++) ok &= !(pat[i] && pat[i - 1]);
    CHECK(ok, "calibrated: never two cached steps in a row");
    c.accumulate = 0;
    for (int i = 0; i < 20; i++) sc[i] = i % 2 ? 0.5 : 0.1; /* per-step: below 0.25 only on even steps */
    simulate(&c, 20, sc, outs, pat);
    ok = 1;
    for (int i = 0; i < 20; i++) ok &= pat[i] == (i >= 2 && i < 18 && i % 2 == 0);
    CHECK(ok, "calibrated per step caches exactly the steps under the threshold");
    /* the estimator adds the last change */
    float prev[3], delta[3], o[3] = {1, 2, 3}, o2[3] = {2, 4, 6}, e[3];
    dl_stepcache_state s = {.prev = prev, .delta = delta, .n = 3};
    dl_stepcache_parse("off", &c);
    dl_stepcache_reset(&s);
    dl_stepcache_full(&c, &s, o);
    double ch = dl_stepcache_full(&c, &s, o2);
    dl_stepcache_estimate(&s, e);
    CHECK(fabs(ch - 1.0) < 1e-9 && e[0] == 3 && e[1] == 6 && e[2] == 9 && prev[2] == 9, "estimate = prev + delta (change %g)", ch);
}

static void test_parse(void) {
    dl_stepcache_config c;
    CHECK(dl_stepcache_parse("cadence:1", &c) == DL_ERR_INVALID, "cadence:1 refused");
    CHECK(dl_stepcache_parse("bogus", &c) == DL_ERR_INVALID && strstr(dl_last_error(), "not one of"), "%s", dl_last_error());
    CHECK(dl_stepcache_parse("calibrated:", &c) == DL_ERR_INVALID, "calibrated without a file");
    CHECK(dl_stepcache_parse("online-delta", &c) == DL_OK && c.alpha == 0.6f && c.keep_first == 5, "online-delta default 0.6");
    CHECK(dl_stepcache_parse("calibrated:" SOURCE_DIR "/calibrations/teacache-flux.json", &c) == DL_OK && c.ncoef == 5 &&
              c.threshold == 0.4f && c.accumulate,
          "TeaCache's FLUX calibration loads: %s", dl_last_error());
    CHECK(dl_stepcache_parse("calibrated:" SOURCE_DIR "/calibrations/teacache-flux.json:0.8", &c) == DL_OK && c.threshold == 0.8f,
          "threshold override");
    double x = 0.1, want = (((498.651651 * x - 283.781631) * x + 55.8554382) * x - 3.82021401) * x + 0.264230861;
    CHECK(fabs(dl_stepcache_poly(&c, x) - want) < 1e-9, "polynomial, highest degree first");
}

static void test_pipeline(void) {
    dl_flux_shape shape = {.width = 32, .height = 48, .max_sequence_length = 32, .dt = DL_F32};
    dl_flux_pipeline *p;
    if (dl_flux_pipeline_load(&p, DATA_DIR "/flux/dev", &shape) != DL_OK) {
        CHECK(0, "%s", dl_last_error());
        return;
    }
    static uint8_t a[48 * 32 * 3], b[48 * 32 * 3], c0[48 * 32 * 3];
    dl_stepcache_config cad, off;
    dl_stepcache_parse("cadence:2", &cad);
    dl_stepcache_parse("off", &off);
    dl_flux_request r = {.prompt = "a red circle", .steps = 20, .guidance = 3.5f, .true_cfg = 1.f, .seed = 3, .cache = &cad};
    dl_flux_timing tm;
    CHECK(dl_flux_generate(p, &r, a, NULL, &tm) == DL_OK && tm.transformer_calls == 15 && tm.cached_steps == 5,
          "cadence 2, 20 steps: 15 calls, 5 cached (%d, %d)", tm.transformer_calls, tm.cached_steps);
    r.negative_prompt = "blurry", r.true_cfg = 2.f;
    CHECK(dl_flux_generate(p, &r, b, NULL, &tm) == DL_OK && tm.transformer_calls == 30 && tm.cached_steps == 10,
          "with true CFG each branch keeps its own state: 30 calls, 10 cached");
    /* no reuse crosses requests: B after A equals B on a fresh pipeline */
    r.negative_prompt = NULL, r.true_cfg = 1.f, r.prompt = "a blue square", r.seed = 4;
    dl_flux_generate(p, &r, b, NULL, NULL);
    dl_flux_pipeline_free(p);
    dl_flux_pipeline_load(&p, DATA_DIR "/flux/dev", &shape);
    dl_flux_generate(p, &r, c0, NULL, NULL);
    CHECK(!memcmp(b, c0, sizeof b), "request B after A equals B alone");
    /* mode off is the uncached pipeline */
    r.cache = &off;
    dl_flux_generate(p, &r, b, NULL, &tm);
    r.cache = NULL;
    dl_flux_generate(p, &r, c0, NULL, NULL);
    CHECK(!memcmp(b, c0, sizeof b) && tm.cached_steps == 0 && tm.transformer_calls == 20, "cache off = no cache");
    /* calibrated with the probe */
    dl_stepcache_config cal;
    if (dl_stepcache_parse("calibrated:" SOURCE_DIR "/calibrations/teacache-flux.json:0.5", &cal) == DL_OK) {
        r.cache = &cal;
        CHECK(dl_flux_generate(p, &r, b, NULL, &tm) == DL_OK && tm.probe_s > 0 && tm.transformer_calls + tm.cached_steps == 20,
              "calibrated mode runs the probe every step (%d calls, %d cached)", tm.transformer_calls, tm.cached_steps);
    }
    dl_flux_pipeline_free(p);
}

int main(void) {
    test_modes();
    test_parse();
    test_pipeline();
    return test_done("test_stepcache");
}
