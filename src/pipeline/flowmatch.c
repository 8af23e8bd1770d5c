/* FlowMatchEulerDiscreteScheduler's schedule as diffusers' flow-matching pipelines
 * (FluxPipeline first) drive it, and the
 * latent noise generator. The arithmetic follows diffusers' float32 numpy/torch
 * path (sigmas in f32, exp(mu) rounded to f32 before the shift). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "difflet/pipeline.h"

dl_status dl_flowmatch_load(dl_model_dir *dir, dl_flowmatch *fm) {
    const char *file = "scheduler/scheduler_config.json";
    char path[4096];
    snprintf(path, sizeof path, "%s/scheduler/scheduler_config.json", dl_model_dir_path(dir));
    cJSON *cfg;
    dl_status s = dl_json_read_object(path, file, &cfg);
    if (s != DL_OK) return s;
    const char *cls, *tst;
    int karras, expo, beta, stoch, inv;
    double term;
    memset(fm, 0, sizeof *fm);
    if ((s = dl_cfg_str(cfg, file, "_class_name", "FlowMatchEulerDiscreteScheduler", &cls)) ||
        (s = dl_cfg_int(cfg, file, "num_train_timesteps", 1000, &fm->num_train_timesteps)) ||
        (s = dl_cfg_float(cfg, file, "shift", 1.0, &fm->shift)) ||
        (s = dl_cfg_bool(cfg, file, "use_dynamic_shifting", 0, &fm->use_dynamic_shifting)) ||
        (s = dl_cfg_int(cfg, file, "base_image_seq_len", 256, &fm->base_image_seq_len)) ||
        (s = dl_cfg_int(cfg, file, "max_image_seq_len", 4096, &fm->max_image_seq_len)) ||
        (s = dl_cfg_float(cfg, file, "base_shift", 0.5, &fm->base_shift)) ||
        (s = dl_cfg_float(cfg, file, "max_shift", 1.15, &fm->max_shift)) ||
        (s = dl_cfg_str(cfg, file, "time_shift_type", "exponential", &tst)) ||
        (s = dl_cfg_bool(cfg, file, "use_karras_sigmas", 0, &karras)) ||
        (s = dl_cfg_bool(cfg, file, "use_exponential_sigmas", 0, &expo)) ||
        (s = dl_cfg_bool(cfg, file, "use_beta_sigmas", 0, &beta)) ||
        (s = dl_cfg_bool(cfg, file, "stochastic_sampling", 0, &stoch)) ||
        (s = dl_cfg_bool(cfg, file, "invert_sigmas", 0, &inv)) ||
        (s = dl_cfg_float(cfg, file, "shift_terminal", 0.0, &term)))
        goto done;
    if (strcmp(cls, "FlowMatchEulerDiscreteScheduler")) {
        s = dl_fail(DL_ERR_UNSUPPORTED, "`%s`: scheduler %s is not supported (FlowMatchEulerDiscreteScheduler)", file, cls);
        goto done;
    }
    const char *bad = karras ? "use_karras_sigmas" : expo ? "use_exponential_sigmas" : beta ? "use_beta_sigmas"
                      : stoch ? "stochastic_sampling" : inv ? "invert_sigmas" : term != 0.0 ? "shift_terminal" : NULL;
    if (bad) {
        s = dl_fail(DL_ERR_UNSUPPORTED, "`%s`: %s is not supported", file, bad);
        goto done;
    }
    fm->exponential = strcmp(tst, "linear") != 0;
    if (fm->num_train_timesteps <= 0 || fm->max_image_seq_len == fm->base_image_seq_len)
        s = dl_fail(DL_ERR_FORMAT, "`%s`: inconsistent values", file);
done:
    cJSON_Delete(cfg);
    return s;
}

double dl_flowmatch_mu(const dl_flowmatch *fm, int64_t n) {
    double m = (fm->max_shift - fm->base_shift) / (double)(fm->max_image_seq_len - fm->base_image_seq_len);
    double b = fm->base_shift - m * (double)fm->base_image_seq_len;
    return (double)n * m + b;
}

dl_status dl_flowmatch_sigmas(const dl_flowmatch *fm, int steps, double mu, float *sigmas) {
    if (steps <= 0 || steps > 10000) return dl_fail(DL_ERR_INVALID, "steps must be in 1..10000, got %d", steps);
    for (int i = 0; i < steps; i++) {
        /* np.linspace(1.0, 1/steps, steps) in f64 (i * step + start, last = stop),
         * then .astype(float32) */
        double end = 1.0 / steps, step = steps > 1 ? (end - 1.0) / (double)(steps - 1) : 0.0;
        double v = (double)i * step + 1.0;
        if (steps > 1 && i == steps - 1) v = end;
        float t = (float)v, sg;
        if (fm->use_dynamic_shifting) {
            float e = fm->exponential ? (float)exp(mu) : (float)mu;
            float r = 1.f / t - 1.f;
            sg = e / (e + r);
        } else {
            float sh = (float)fm->shift;
            sg = sh * t / (1.f + (sh - 1.f) * t);
        }
        sigmas[i] = sg;
    }
    sigmas[steps] = 0.f;
    return DL_OK;
}

/* xoshiro256** seeded by splitmix64 */
static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

void dl_randn(uint64_t seed, float *out, int64_t n) {
    uint64_t s[4], z = seed;
    for (int i = 0; i < 4; i++) {
        z += 0x9e3779b97f4a7c15ull;
        uint64_t v = z;
        v = (v ^ (v >> 30)) * 0xbf58476d1ce4e5b9ull;
        v = (v ^ (v >> 27)) * 0x94d049bb133111ebull;
        s[i] = v ^ (v >> 31);
    }
    for (int64_t i = 0; i < n; i += 2) {
        uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
        s[2] ^= s[0], s[3] ^= s[1], s[1] ^= s[2], s[0] ^= s[3], s[2] ^= t, s[3] = rotl(s[3], 45);
        double u1 = ((double)(r >> 40) + 1.0) * 0x1p-24; /* (0, 1] */
        double u2 = (double)((r >> 16) & 0xffffff) * 0x1p-24;
        double rad = sqrt(-2.0 * log(u1)), ang = 6.283185307179586 * u2;
        out[i] = (float)(rad * cos(ang));
        if (i + 1 < n) out[i + 1] = (float)(rad * sin(ang));
    }
}
