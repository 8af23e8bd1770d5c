/* FlowMatchEulerDiscreteScheduler's schedule as diffusers' flow-matching pipelines
 * (FluxPipeline first) drive it, and the
 * latent noise generator. The arithmetic follows diffusers' float32 numpy/torch
 * path (sigmas in f32, exp(mu) rounded to f32 before the shift). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <stdio.h>

#include "difflet/pipeline.h"

dl_status dl_flowmatch_from_json(const cJSON *cfg, const char *file, dl_flowmatch *fm) {
    const char *cls, *tst;
    int karras, expo, beta, stoch, inv;
    dl_status s;
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
        (s = dl_cfg_float(cfg, file, "shift_terminal", 0.0, &fm->shift_terminal)))
        return s;
    if (strcmp(cls, "FlowMatchEulerDiscreteScheduler"))
        return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: scheduler %s is not supported (FlowMatchEulerDiscreteScheduler)", file, cls);
    if (karras + expo + beta > 1) /* diffusers refuses this too */
        return dl_fail(DL_ERR_FORMAT, "`%s`: only one of use_karras_sigmas, use_exponential_sigmas, use_beta_sigmas", file);
    if (stoch) return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: stochastic_sampling is not supported", file);
    if (strcmp(tst, "exponential") && strcmp(tst, "linear"))
        return dl_fail(DL_ERR_FORMAT, "`%s`: time_shift_type `%s` (exponential or linear)", file, tst);
    fm->exponential = !strcmp(tst, "exponential");
    fm->kind = karras ? DL_SIGMAS_KARRAS : expo ? DL_SIGMAS_EXPONENTIAL : beta ? DL_SIGMAS_BETA : DL_SIGMAS_PLAIN;
    fm->invert = inv;
    if (fm->num_train_timesteps <= 0 || fm->max_image_seq_len == fm->base_image_seq_len || fm->shift_terminal >= 1.0)
        return dl_fail(DL_ERR_FORMAT, "`%s`: inconsistent values", file);
    return DL_OK;
}

dl_status dl_flowmatch_load(dl_model_dir *dir, dl_flowmatch *fm) {
    const char *file = "scheduler/scheduler_config.json";
    char path[4096];
    snprintf(path, sizeof path, "%s/scheduler/scheduler_config.json", dl_model_dir_path(dir));
    cJSON *cfg;
    dl_status s = dl_json_read_object(path, file, &cfg);
    if (s != DL_OK) return s;
    s = dl_flowmatch_from_json(cfg, file, fm);
    cJSON_Delete(cfg);
    return s;
}

double dl_flowmatch_mu(const dl_flowmatch *fm, int64_t n) {
    double m = (fm->max_shift - fm->base_shift) / (double)(fm->max_image_seq_len - fm->base_image_seq_len);
    double b = fm->base_shift - m * (double)fm->base_image_seq_len;
    return (double)n * m + b;
}

/* numpy.linspace(a, b, n)[i] in float64: i * step + a, the last exactly b */
static double linspace(double a, double b, int n, int i) {
    if (n == 1) return a;
    if (i == n - 1) return b;
    return (double)i * ((b - a) / (double)(n - 1)) + a;
}

/* The regularized incomplete beta function I_x(a, b), by its continued fraction
 * (evaluated with the modified Lentz method) on the side where it converges fast. */
static double ibeta(double a, double b, double x) {
    if (x <= 0) return 0;
    if (x >= 1) return 1;
    if (x > (a + 1) / (a + b + 2)) return 1 - ibeta(b, a, 1 - x);
    double front = exp(a * log(x) + b * log1p(-x) - (lgamma(a) + lgamma(b) - lgamma(a + b))) / a;
    const double tiny = 1e-300;
    double f = 1, c = 1, d = 0;
    for (int i = 0; i <= 400; i++) {
        int m = i / 2;
        double num;
        if (i == 0) num = 1;
        else if (i % 2 == 0) num = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m));
        else num = -((a + m) * (a + b + m) * x) / ((a + 2 * m) * (a + 2 * m + 1));
        d = 1 + num * d;
        d = fabs(d) < tiny ? tiny : d;
        d = 1 / d;
        c = 1 + num / c;
        c = fabs(c) < tiny ? tiny : c;
        double cd = c * d;
        f *= cd;
        if (fabs(1 - cd) < 1e-16) break;
    }
    return front * (f - 1);
}

/* scipy.stats.beta.ppf(p, a, b): the x with I_x(a, b) = p, by bisection to the last bit */
static double beta_ppf(double p, double a, double b) {
    if (p <= 0) return 0;
    if (p >= 1) return 1;
    double lo = 0, hi = 1;
    for (int i = 0; i < 200 && hi - lo > 0; i++) {
        double mid = 0.5 * (lo + hi);
        if (mid <= lo || mid >= hi) break;
        if (ibeta(a, b, mid) < p) lo = mid;
        else hi = mid;
    }
    return 0.5 * (lo + hi);
}

/* 4. Karras / exponential / beta between the ends of s (float64), into sigmas */
static void convert_sigmas(const dl_flowmatch *fm, int steps, const double *s, float *sigmas) {
    if (fm->kind == DL_SIGMAS_PLAIN) {
        for (int i = 0; i < steps; i++) sigmas[i] = (float)s[i];
        return;
    }
    double smin = s[steps - 1], smax = s[0];
    for (int i = 0; i < steps; i++) {
        double v;
        if (fm->kind == DL_SIGMAS_KARRAS) {
            const double rho = 7.0, lo = pow(smin, 1 / rho), hi = pow(smax, 1 / rho);
            v = pow(hi + linspace(0, 1, steps, i) * (lo - hi), rho);
        } else if (fm->kind == DL_SIGMAS_EXPONENTIAL) {
            v = exp(linspace(log(smax), log(smin), steps, i));
        } else {
            v = smin + beta_ppf(1 - linspace(0, 1, steps, i), 0.6, 0.6) * (smax - smin);
        }
        sigmas[i] = (float)v;
    }
}

static dl_status check_steps(const dl_flowmatch *fm, int steps) {
    if (steps <= 0 || steps > 10000) return dl_fail(DL_ERR_INVALID, "steps must be in 1..10000, got %d", steps);
    if (fm->shift_terminal != 0.0 && steps == 1)
        return dl_fail(DL_ERR_INVALID, "shift_terminal needs at least 2 steps (with one, diffusers divides by zero)");
    return DL_OK;
}

/* 6. the terminal value; inverted schedules (Mochi) run toward 1 */
static void terminal(const dl_flowmatch *fm, int steps, float *sigmas) {
    if (fm->invert)
        for (int i = 0; i < steps; i++) sigmas[i] = 1.f - sigmas[i];
    sigmas[steps] = fm->invert ? 1.f : 0.f;
}

dl_status dl_flowmatch_sigmas_default(const dl_flowmatch *fm, int steps, float *sigmas) {
    dl_status st = check_steps(fm, steps);
    if (st != DL_OK) return st;
    if (fm->use_dynamic_shifting)
        return dl_fail(DL_ERR_UNSUPPORTED, "dynamic shifting needs mu, which this pipeline does not pass");
    double *s = malloc((size_t)steps * sizeof *s);
    if (!s) return dl_fail(DL_ERR_NOMEM, "out of memory");
    /* the ends of the scheduler's training schedule, shifted in float32 (torch, at init) */
    const int N = (int)fm->num_train_timesteps;
    const float sh = (float)fm->shift, sh1 = (float)(fm->shift - 1.0), tmin = 1.f / (float)N;
    const double smax = (double)(sh * 1.f / (1.f + sh1 * 1.f)), smin = (double)(sh * tmin / (1.f + sh1 * tmin));
    /* 1-2. np.linspace(sigma_max N, sigma_min N, steps) / N, shifted again, in float64 */
    for (int i = 0; i < steps; i++) {
        double t = linspace(smax * N, smin * N, steps, i) / N;
        s[i] = fm->shift * t / (1 + (fm->shift - 1) * t);
    }
    /* 3. stretch to end at shift_terminal (float64) */
    if (fm->shift_terminal != 0.0) {
        double scale = (1 - s[steps - 1]) / (1 - fm->shift_terminal);
        for (int i = 0; i < steps; i++) s[i] = 1 - (1 - s[i]) / scale;
    }
    convert_sigmas(fm, steps, s, sigmas);
    free(s);
    terminal(fm, steps, sigmas);
    return DL_OK;
}

dl_status dl_flowmatch_sigmas(const dl_flowmatch *fm, int steps, double mu, float *sigmas) {
    dl_status st = check_steps(fm, steps);
    if (st != DL_OK) return st;
    /* 1-2. FluxPipeline's np.linspace(1.0, 1/steps, steps) as float32, shifted in float32
       (Python scalars meet float32 arrays as float32: NumPy's weak scalars) */
    for (int i = 0; i < steps; i++) {
        float t = (float)linspace(1.0, 1.0 / steps, steps, i), sg;
        if (fm->use_dynamic_shifting) {
            float e = fm->exponential ? (float)exp(mu) : (float)mu;
            float r = 1.f / t - 1.f;
            sg = e / (e + r);
        } else {
            float sh = (float)fm->shift, sh1 = (float)(fm->shift - 1.0);
            sg = sh * t / (1.f + sh1 * t);
        }
        sigmas[i] = sg;
    }
    /* 3. stretch to end at shift_terminal (float32) */
    if (fm->shift_terminal != 0.0) {
        float scale = (1.f - sigmas[steps - 1]) / (float)(1.0 - fm->shift_terminal);
        for (int i = 0; i < steps; i++) sigmas[i] = 1.f - (1.f - sigmas[i]) / scale;
    }
    /* 4. Karras / exponential / beta between the ends, in float64, then float32 */
    if (fm->kind != DL_SIGMAS_PLAIN) {
        double *s = malloc((size_t)steps * sizeof *s);
        if (!s) return dl_fail(DL_ERR_NOMEM, "out of memory");
        for (int i = 0; i < steps; i++) s[i] = sigmas[i];
        convert_sigmas(fm, steps, s, sigmas);
        free(s);
    }
    terminal(fm, steps, sigmas);
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
