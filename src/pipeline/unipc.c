/* UniPCMultistepScheduler (diffusers 0.42) for flow-matching models (Wan 2.1): the
 * schedule (set_timesteps), the UniP predictor (multistep_uni_p_bh_update), the UniC
 * corrector (multistep_uni_c_bh_update) and the x0 conversion of a flow prediction.
 *
 * Why the arithmetic looks the way it does: diffusers computes the schedule in
 * numpy float64 and stores it as float32; step() then works on float32 0-d tensors
 * for every coefficient and on float32 latents element by element, one torch op at a
 * time (no fused multiply-adds). The scalar code below is that sequence of float
 * operations, in torch's evaluation order, including what torch's CPU kernels do:
 *  - torch.expm1 is SLEEF's expm1f (u10): ported below operation for operation;
 *  - torch.linalg.solve (orders 3 and the order-2 corrector) is MKL's sgetrf/sgetrs
 *    on these 2x2 and 3x3 systems: the elimination order matched below;
 *  - torch.log is MKL's vsLn, which is not correctly rounded and is not public;
 *    here the logarithm is correctly rounded (a caller may substitute another,
 *    dl_unipc_state_set_log), so a step whose sigma meets a differently rounded
 *    logarithm differs from torch by an ulp or so in its coefficients.
 * Every a * b + c below must be rounded twice, as torch rounds it, so contraction
 * into fused multiply-adds is switched off for this file whatever the flags (GCC
 * contracts across statements under -std=gnu11 on an FMA target). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "difflet/unipc.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

/* ---- config --------------------------------------------------------------------- */

static dl_status refuse(const char *file, const char *what) {
    return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: UniPCMultistepScheduler option %s is not supported", file, what);
}

static dl_status invalid(const char *file, const char *key, const char *value, const char *accepted) {
    return dl_fail(DL_ERR_FORMAT, "`%s`: UniPCMultistepScheduler option %s `%s` is not valid (%s)", file, key, value,
                   accepted);
}

dl_status dl_unipc_from_json(const cJSON *cfg, const char *file, dl_unipc *u) {
    const char *cls, *pred, *stype, *spacing, *final, *betas;
    int64_t order;
    int thresh, x0, karras, expo, beta, flow, dyn;
    dl_status s;
    memset(u, 0, sizeof *u);
    if ((s = dl_cfg_str(cfg, file, "_class_name", "UniPCMultistepScheduler", &cls)) ||
        (s = dl_cfg_int(cfg, file, "num_train_timesteps", 1000, &u->num_train_timesteps)) ||
        (s = dl_cfg_str(cfg, file, "beta_schedule", "linear", &betas)) ||
        (s = dl_cfg_int(cfg, file, "solver_order", 2, &order)) ||
        (s = dl_cfg_str(cfg, file, "prediction_type", "epsilon", &pred)) ||
        (s = dl_cfg_bool(cfg, file, "thresholding", 0, &thresh)) ||
        (s = dl_cfg_bool(cfg, file, "predict_x0", 1, &x0)) ||
        (s = dl_cfg_str(cfg, file, "solver_type", "bh2", &stype)) ||
        (s = dl_cfg_bool(cfg, file, "lower_order_final", 1, &u->lower_order_final)) ||
        (s = dl_cfg_bool(cfg, file, "use_karras_sigmas", 0, &karras)) ||
        (s = dl_cfg_bool(cfg, file, "use_exponential_sigmas", 0, &expo)) ||
        (s = dl_cfg_bool(cfg, file, "use_beta_sigmas", 0, &beta)) ||
        (s = dl_cfg_bool(cfg, file, "use_flow_sigmas", 0, &flow)) ||
        (s = dl_cfg_float(cfg, file, "flow_shift", 1.0, &u->flow_shift)) ||
        (s = dl_cfg_str(cfg, file, "timestep_spacing", "linspace", &spacing)) ||
        (s = dl_cfg_str(cfg, file, "final_sigmas_type", "zero", &final)) ||
        (s = dl_cfg_bool(cfg, file, "use_dynamic_shifting", 0, &dyn)) ||
        (s = dl_cfg_float(cfg, file, "shift_terminal", 0.0, &u->shift_terminal)))
        return s;
    if (strcmp(cls, "UniPCMultistepScheduler"))
        return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: scheduler %s is not supported here (UniPCMultistepScheduler)", file,
                       cls);
    /* values diffusers itself rejects */
    if (u->num_train_timesteps <= 0)
        return dl_fail(DL_ERR_FORMAT, "`%s`: UniPCMultistepScheduler option num_train_timesteps %lld is not valid", file,
                       (long long)u->num_train_timesteps);
    if (order <= 0)
        return dl_fail(DL_ERR_FORMAT, "`%s`: UniPCMultistepScheduler option solver_order %lld is not valid", file,
                       (long long)order);
    if (karras + expo + beta > 1)
        return dl_fail(DL_ERR_FORMAT, "`%s`: UniPCMultistepScheduler options use_karras_sigmas, use_exponential_sigmas, "
                       "use_beta_sigmas: only one may be set", file);
    const cJSON *tb = cJSON_GetObjectItemCaseSensitive(cfg, "trained_betas");
    if ((!tb || cJSON_IsNull(tb)) && strcmp(betas, "linear") && strcmp(betas, "scaled_linear") &&
        strcmp(betas, "squaredcos_cap_v2")) /* unused by the flow path, but diffusers refuses others */
        return invalid(file, "beta_schedule", betas, "linear, scaled_linear or squaredcos_cap_v2");
    if (!strcmp(stype, "bh1")) u->bh2 = 0;
    else if (!strcmp(stype, "bh2") || !strcmp(stype, "midpoint") || !strcmp(stype, "heun") || !strcmp(stype, "logrho"))
        u->bh2 = 1; /* diffusers registers the last three as bh2 */
    else return invalid(file, "solver_type", stype, "bh1 or bh2");
    /* linspace, leading and trailing make timesteps that the flow path then replaces */
    if (strcmp(spacing, "linspace") && strcmp(spacing, "leading") && strcmp(spacing, "trailing"))
        return invalid(file, "timestep_spacing", spacing, "linspace, leading or trailing");
    if (!strcmp(final, "zero")) u->final_sigma_min = 0;
    else if (!strcmp(final, "sigma_min")) u->final_sigma_min = 1;
    else return invalid(file, "final_sigmas_type", final, "zero or sigma_min");
    /* valid in diffusers, outside this implementation */
    if (karras) return refuse(file, "use_karras_sigmas");
    if (expo) return refuse(file, "use_exponential_sigmas");
    if (beta) return refuse(file, "use_beta_sigmas");
    if (!flow) return refuse(file, "use_flow_sigmas false (the VP-type schedule)");
    if (dyn) return refuse(file, "use_dynamic_shifting");
    if (strcmp(pred, "flow_prediction")) {
        char what[128];
        snprintf(what, sizeof what, "prediction_type `%.64s` (only flow_prediction)", pred);
        return refuse(file, what);
    }
    if (!x0) return refuse(file, "predict_x0 false");
    if (thresh) return refuse(file, "thresholding");
    const cJSON *sp = cJSON_GetObjectItemCaseSensitive(cfg, "solver_p");
    if (sp && !cJSON_IsNull(sp)) return refuse(file, "solver_p");
    if (order > DL_UNIPC_MAX_ORDER) {
        char what[64];
        snprintf(what, sizeof what, "solver_order %lld (1 to %d)", (long long)order, DL_UNIPC_MAX_ORDER);
        return refuse(file, what);
    }
    u->solver_order = (int)order;
    if (u->num_train_timesteps > (1 << 24)) /* timesteps stay exact as floats */
        return refuse(file, "num_train_timesteps above 2^24");
    if (!u->bh2 && !u->final_sigma_min) /* the last step computes alpha_t * B(h) * 0 = 1 * -inf * 0 */
        return refuse(file, "solver_type bh1 with final_sigmas_type zero (diffusers' last step is NaN: B(h) = h is "
                            "infinite at sigma 0; use sigma_min or bh2)");
    if (!isfinite(u->flow_shift) || u->flow_shift <= 0)
        return dl_fail(DL_ERR_FORMAT, "`%s`: UniPCMultistepScheduler option flow_shift %g is not valid (positive)", file,
                       u->flow_shift);
    if (!isfinite(u->shift_terminal) || u->shift_terminal >= 1)
        return dl_fail(DL_ERR_FORMAT, "`%s`: UniPCMultistepScheduler option shift_terminal %g is not valid (below 1)",
                       file, u->shift_terminal);
    const cJSON *dc = cJSON_GetObjectItemCaseSensitive(cfg, "disable_corrector"), *e;
    if (dc && !cJSON_IsNull(dc)) {
        if (!cJSON_IsArray(dc))
            return dl_fail(DL_ERR_FORMAT, "`%s`: \"disable_corrector\" must be a list of step indices", file);
        cJSON_ArrayForEach(e, dc) {
            if (!cJSON_IsNumber(e))
                return dl_fail(DL_ERR_FORMAT, "`%s`: \"disable_corrector\" must be a list of step indices", file);
            if (u->ndisable == DL_UNIPC_MAX_DISABLE) {
                char what[64];
                snprintf(what, sizeof what, "disable_corrector with more than %d entries", DL_UNIPC_MAX_DISABLE);
                return refuse(file, what);
            }
            u->disable_corrector[u->ndisable++] = e->valuedouble;
        }
    }
    return DL_OK;
}

dl_status dl_unipc_load(dl_model_dir *dir, dl_unipc *u) {
    const char *file = "scheduler/scheduler_config.json";
    char path[4096];
    snprintf(path, sizeof path, "%s/scheduler/scheduler_config.json", dl_model_dir_path(dir));
    cJSON *cfg;
    dl_status s = dl_json_read_object(path, file, &cfg);
    if (s != DL_OK) return s;
    s = dl_unipc_from_json(cfg, file, u);
    cJSON_Delete(cfg);
    return s;
}

/* ---- schedule ------------------------------------------------------------------- */

/* The step counts diffusers' arithmetic survives. Without lower_order_final the last
 * step keeps order min(solver_order, steps): toward sigma 0 it divides by h = inf
 * (D1 = (m1 - m0) / 0), and toward a repeated sigma_min order 3 solves a system
 * with rk = -inf (h = 0); both give inf or NaN samples. */
static dl_status check_steps(const dl_unipc *u, int steps) {
    if (steps < 1 || steps > DL_UNIPC_MAX_STEPS)
        return dl_fail(DL_ERR_INVALID, "UniPCMultistepScheduler: steps must be in 1..%d, got %d", DL_UNIPC_MAX_STEPS,
                       steps);
    if (u->shift_terminal != 0 && steps == 1)
        return dl_fail(DL_ERR_UNSUPPORTED, "UniPCMultistepScheduler option shift_terminal is not supported with 1 step "
                       "(diffusers divides 0 by 0 there)");
    int last = u->solver_order < steps ? u->solver_order : steps;
    if (!u->lower_order_final && !u->final_sigma_min && last >= 2)
        return dl_fail(DL_ERR_UNSUPPORTED, "UniPCMultistepScheduler options lower_order_final false with "
                       "final_sigmas_type zero are not supported at %d steps (diffusers' last step, of order %d, "
                       "gives inf/NaN; use sigma_min)", steps, last);
    if (!u->lower_order_final && u->final_sigma_min && last >= 3)
        return dl_fail(DL_ERR_UNSUPPORTED, "UniPCMultistepScheduler options lower_order_final false with "
                       "solver_order %d and final_sigmas_type sigma_min are not supported at %d steps (diffusers' last "
                       "step, of order %d, gives NaN)", u->solver_order, steps, last);
    return DL_OK;
}

/* numpy.linspace(a, b, n)[i] in float64: i * step + a, the last exactly b */
static double linspace(double a, double b, int n, int i) {
    if (n == 1) return a;
    if (i == n - 1) return b;
    return (double)i * ((b - a) / (double)(n - 1)) + a;
}

dl_status dl_unipc_schedule(const dl_unipc *u, int steps, float *timesteps, float *sigmas) {
    dl_status s = check_steps(u, steps);
    if (s != DL_OK) return s;
    double *sg = calloc((size_t)steps, sizeof *sg);
    if (!sg) return dl_fail(DL_ERR_NOMEM, "UniPCMultistepScheduler: out of memory for %d steps", steps);
    /* np.linspace(1, 1 / num_train_timesteps, steps + 1)[:-1], shifted, in float64 */
    double fs = u->flow_shift;
    for (int i = 0; i < steps; i++) {
        double t = linspace(1.0, 1.0 / (double)u->num_train_timesteps, steps + 1, i);
        sg[i] = fs * t / (1.0 + (fs - 1.0) * t);
    }
    if (u->shift_terminal != 0) { /* stretch_shift_to_terminal */
        double scale = (1.0 - sg[steps - 1]) / (1.0 - u->shift_terminal);
        for (int i = 0; i < steps; i++) sg[i] = 1.0 - (1.0 - sg[i]) / scale;
    }
    if (fabs(sg[0] - 1.0) < 1e-6) sg[0] -= 1e-6; /* diffusers keeps log(1 - sigma) finite */
    for (int i = 0; i < steps; i++) {
        /* torch.from_numpy(sigmas * num_train_timesteps).to(int64): truncation */
        if (timesteps) timesteps[i] = (float)(int64_t)(sg[i] * (double)u->num_train_timesteps);
        if (sigmas) sigmas[i] = (float)sg[i];
    }
    if (sigmas) sigmas[steps] = u->final_sigma_min ? (float)sg[steps - 1] : 0.0f;
    free(sg);
    return DL_OK;
}

/* ---- torch's scalar functions --------------------------------------------------- */

/* torch.expm1 on a float32 CPU tensor: SLEEF's expm1f (u10, the FMA build), i.e. e^a
 * in double-float arithmetic (x.hi + x.lo) minus 1. Each helper is one of SLEEF's
 * double-float primitives; fmaf is the hardware FMA those builds use. Checked
 * against torch on 2e7 arguments in (-20, 0]. */
typedef struct { float hi, lo; } df;

static df df_make(float hi, float lo) { df r = {hi, lo}; return r; }
/* x + y, any magnitudes */
static df df_add2_f(df x, float y) {
    float s = x.hi + y, v = s - x.hi;
    float t = (x.hi - (s - v)) + (y - v);
    return df_make(s, t + x.lo);
}
static df df_add2(df x, df y) {
    float s = x.hi + y.hi, v = s - x.hi;
    float t = (x.hi - (s - v)) + (y.hi - v);
    return df_make(s, t + (x.lo + y.lo));
}
/* x + y with |x| >= |y| */
static df f_add_df(float x, df y) {
    float s = x + y.hi;
    return df_make(s, ((x - s) + y.hi) + y.lo);
}
static df df_mul_f(df x, float y) {
    float s = x.hi * y;
    return df_make(s, fmaf(x.lo, y, fmaf(x.hi, y, -s)));
}
static df df_mul(df x, df y) {
    float s = x.hi * y.hi;
    return df_make(s, fmaf(x.hi, y.lo, fmaf(x.lo, y.hi, fmaf(x.hi, y.hi, -s))));
}
static df df_sqr(df x) {
    float s = x.hi * x.hi;
    return df_make(s, fmaf(x.hi + x.hi, x.lo, fmaf(x.hi, x.hi, -s)));
}
static float pow2i(int32_t q) {
    uint32_t b = (uint32_t)(q + 0x7f) << 23;
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}
static float ldexp2(float d, int32_t e) { return d * pow2i(e >> 1) * pow2i(e - (e >> 1)); }

/* e^d as a double-float (SLEEF's expk2f) */
static df expk2(df d) {
    float u = (d.hi + d.lo) * 1.442695040888963407359924681001892137426645954152985934135449406931f;
    int32_t q = (int32_t)nearbyintf(u); /* cvtps2dq: round to nearest even */
    df s = df_add2_f(d, (float)q * -0.693145751953125f);
    s = df_add2_f(s, (float)q * -1.428606765330187045e-06f);
    u = 0.1980960224e-3f;
    u = fmaf(u, s.hi, 0.1394256484e-2f);
    u = fmaf(u, s.hi, 0.8333456703e-2f);
    u = fmaf(u, s.hi, 0.4166637361e-1f);
    df t = df_add2_f(df_mul_f(s, u), 0.166666659414234244790680580464e+0f);
    t = df_add2_f(df_mul(s, t), 0.5f);
    t = df_add2(s, df_mul(df_sqr(s), t));
    t = f_add_df(1.0f, t);
    t.hi = ldexp2(t.hi, q);
    t.lo = ldexp2(t.lo, q);
    if (d.hi < -104) t = df_make(0, 0);
    return t;
}

static float torch_expm1f(float a) {
    if (isnan(a)) return a;
    if (a > 88.72283172607421875f) return INFINITY;
    if (a < -16.635532333438687426013570f) return -1.0f;
    if (a == 0 && signbit(a)) return -0.0f;
    df d = df_add2_f(expk2(df_make(a, 0)), -1.0f);
    return d.hi + d.lo;
}

static float log_rounded(float x, void *ctx) {
    (void)ctx;
    return (float)log((double)x);
}

/* ---- state ---------------------------------------------------------------------- */

struct dl_unipc_state {
    dl_unipc u;
    int steps;
    int64_t n;
    float *sigmas;                   /* [steps + 1] */
    float *hist[DL_UNIPC_MAX_ORDER]; /* model outputs converted to x0, oldest first: [n] each */
    float *last;                     /* the sample the last predictor started from: [n] */
    float *buf;                      /* hist and last, one allocation */
    int next;                        /* the step expected next */
    int lower_order_nums, this_order;
    dl_unipc_log_fn log_fn;
    void *log_ctx;
};

dl_status dl_unipc_state_new(dl_unipc_state **out, const dl_unipc *u, int steps, int64_t n) {
    *out = NULL;
    DL_ASSERT(u->solver_order >= 1 && u->solver_order <= DL_UNIPC_MAX_ORDER);
    if (n <= 0 || (uint64_t)n > (uint64_t)(SIZE_MAX / sizeof(float) / (DL_UNIPC_MAX_ORDER + 1)))
        return dl_fail(DL_ERR_INVALID, "UniPCMultistepScheduler: %lld latent elements", (long long)n);
    dl_status s = check_steps(u, steps);
    if (s != DL_OK) return s;
    dl_unipc_state *st = calloc(1, sizeof *st);
    if (!st) return dl_fail(DL_ERR_NOMEM, "UniPCMultistepScheduler: out of memory");
    st->u = *u;
    st->steps = steps;
    st->n = n;
    st->sigmas = malloc(((size_t)steps + 1) * sizeof *st->sigmas);
    st->buf = malloc((size_t)(u->solver_order + 1) * (size_t)n * sizeof *st->buf);
    if (!st->sigmas || !st->buf) {
        dl_unipc_state_free(st);
        return dl_fail(DL_ERR_NOMEM, "UniPCMultistepScheduler: out of memory for %lld latent elements", (long long)n);
    }
    s = dl_unipc_schedule(u, steps, NULL, st->sigmas);
    if (s != DL_OK) {
        dl_unipc_state_free(st);
        return s;
    }
    for (int i = 0; i < u->solver_order; i++) st->hist[i] = st->buf + (size_t)i * (size_t)n;
    st->last = st->buf + (size_t)u->solver_order * (size_t)n;
    st->log_fn = log_rounded;
    dl_unipc_state_reset(st);
    *out = st;
    return DL_OK;
}

void dl_unipc_state_reset(dl_unipc_state *st) {
    st->next = 0;
    st->lower_order_nums = 0;
    st->this_order = 0;
}

const float *dl_unipc_state_sigmas(const dl_unipc_state *st) { return st->sigmas; }

void dl_unipc_state_set_log(dl_unipc_state *st, dl_unipc_log_fn fn, void *ctx) {
    st->log_fn = fn ? fn : log_rounded;
    st->log_ctx = fn ? ctx : NULL;
}

void dl_unipc_state_free(dl_unipc_state *st) {
    if (!st) return;
    free(st->sigmas);
    free(st->buf);
    free(st);
}

/* ---- one update's coefficients -------------------------------------------------- */

/* What an update from sigma[j] to sigma[j + 1] with history order p multiplies the
 * latents by (all float32, as torch holds them). */
typedef struct {
    int p;
    float c_x;  /* sigma_t / sigma_s0 */
    float c_m0; /* alpha_t * h_phi_1 */
    float c_b;  /* alpha_t * B(h) */
    float rk[DL_UNIPC_MAX_ORDER - 1];
    float rho[DL_UNIPC_MAX_ORDER]; /* predictor: rhos_p [p - 1]; corrector: rhos_c [p] */
} coefs;

/* lambda = log(alpha) - log(sigma), alpha = 1 - sigma */
static float lambda(const dl_unipc_state *st, float sigma) {
    float alpha = 1.0f - sigma;
    return st->log_fn(alpha, st->log_ctx) - st->log_fn(sigma, st->log_ctx);
}

/* torch.linalg.solve(A, b) for n <= 3 as MKL's sgetrf + sgetrs compute it on the CPU:
 * partial pivoting (first largest |a|); a column's multipliers by the reciprocal of
 * the pivot when there are two or more, by division when there is one; forward and
 * back substitution subtracting a sum of products; the diagonal by its reciprocal.
 * (Matched to the bit on 3,000 systems of the shape UniPC builds.) */
static int solve(int n, float a[DL_UNIPC_MAX_ORDER][DL_UNIPC_MAX_ORDER], float *b, float *x) {
    for (int j = 0; j < n; j++) {
        int p = j;
        for (int i = j + 1; i < n; i++)
            if (fabsf(a[i][j]) > fabsf(a[p][j])) p = i;
        if (a[p][j] == 0 || isnan(a[p][j])) return -1; /* torch raises: singular */
        if (p != j) {
            for (int k = 0; k < n; k++) {
                float t = a[j][k];
                a[j][k] = a[p][k], a[p][k] = t;
            }
            float t = b[j];
            b[j] = b[p], b[p] = t;
        }
        if (n - 1 - j >= 2) {
            float r = 1.0f / a[j][j];
            for (int i = j + 1; i < n; i++) a[i][j] = a[i][j] * r;
        } else {
            for (int i = j + 1; i < n; i++) a[i][j] = a[i][j] / a[j][j];
        }
        for (int i = j + 1; i < n; i++)
            for (int k = j + 1; k < n; k++) a[i][k] = a[i][k] - a[i][j] * a[j][k];
    }
    for (int i = 1; i < n; i++) { /* L y = P b, L unit lower */
        float acc = a[i][0] * b[0];
        for (int k = 1; k < i; k++) acc = acc + a[i][k] * b[k];
        b[i] = b[i] - acc;
    }
    for (int i = n - 1; i >= 0; i--) { /* U x = y */
        float s = b[i];
        if (i + 1 < n) {
            float acc = a[i][i + 1] * x[i + 1];
            for (int k = i + 2; k < n; k++) acc = acc + a[i][k] * x[k];
            s = s - acc;
        }
        x[i] = s * (1.0f / a[i][i]);
    }
    return 0;
}

/* The update from sigma[j] to sigma[j + 1] of order p: the predictor's when
 * corrector is 0 (rhos_p: none for p = 1, 0.5 for p = 2, solved for p = 3), the
 * corrector's when 1 (rhos_c: 0.5 for p = 1, else solved). History i (1..p-1) is at
 * sigma[j - i]. */
static dl_status make_coefs(const dl_unipc_state *st, int j, int p, int corrector, coefs *c) {
    const float *sg = st->sigmas;
    float sigma_t = sg[j + 1], sigma_s0 = sg[j];
    float alpha_t = 1.0f - sigma_t;
    float lambda_s0 = lambda(st, sigma_s0);
    float h = lambda(st, sigma_t) - lambda_s0;
    float rks[DL_UNIPC_MAX_ORDER];
    for (int i = 1; i < p; i++) rks[i - 1] = (lambda(st, sg[j - i]) - lambda_s0) / h;
    rks[p - 1] = 1.0f;
    float hh = -h; /* predict_x0 */
    float h_phi_1 = torch_expm1f(hh);
    float h_phi_k = h_phi_1 / hh - 1.0f;
    float b_h = st->u.bh2 ? torch_expm1f(hh) : hh;
    float r[DL_UNIPC_MAX_ORDER][DL_UNIPC_MAX_ORDER], b[DL_UNIPC_MAX_ORDER];
    int64_t factorial = 1;
    for (int i = 1; i <= p; i++) {
        for (int k = 0; k < p; k++) /* torch.pow(rks, i - 1): 1, x, x * x */
            r[i - 1][k] = i == 1 ? 1.0f : i == 2 ? rks[k] : rks[k] * rks[k];
        b[i - 1] = h_phi_k * (float)factorial / b_h;
        factorial *= i + 1;
        h_phi_k = h_phi_k / hh - (float)(1.0 / (double)factorial); /* a Python float meets a float32 tensor */
    }
    c->p = p;
    c->c_x = sigma_t / sigma_s0;
    c->c_m0 = alpha_t * h_phi_1;
    c->c_b = alpha_t * b_h;
    for (int i = 0; i + 1 < p; i++) c->rk[i] = rks[i];
    int bad = 0;
    if (!corrector) {
        if (p == 2) c->rho[0] = 0.5f;
        else if (p == 3) {
            float r2[DL_UNIPC_MAX_ORDER][DL_UNIPC_MAX_ORDER] = {{r[0][0], r[0][1]}, {r[1][0], r[1][1]}};
            bad = solve(2, r2, b, c->rho);
        }
    } else {
        if (p == 1) c->rho[0] = 0.5f;
        else bad = solve(p, r, b, c->rho);
    }
    if (bad)
        return dl_fail(DL_ERR_INVALID, "UniPCMultistepScheduler: singular order-%d system from sigma %g to %g "
                       "(torch.linalg.solve fails here too)", p, (double)sigma_s0, (double)sigma_t);
    return DL_OK;
}

static int corrector_disabled(const dl_unipc *u, int i) {
    for (int k = 0; k < u->ndisable; k++)
        if (u->disable_corrector[k] == (double)i) return 1;
    return 0;
}

/* ---- step ----------------------------------------------------------------------- */

dl_status dl_unipc_step(dl_unipc_state *st, int i, const float *model_output, float *sample) {
    if (i != st->next || i >= st->steps)
        return dl_fail(DL_ERR_INVALID, "UniPCMultistepScheduler: step %d called, step %d of %d expected", i, st->next,
                       st->steps);
    const dl_unipc *u = &st->u;
    const int S = u->solver_order;
    /* the corrector refines the previous predictor's sample with this step's output */
    int corr = i > 0 && !corrector_disabled(u, i - 1);
    coefs cc = {0}, cp;
    dl_status s;
    if (corr && (s = make_coefs(st, i - 1, st->this_order, 1, &cc)) != DL_OK) return s;
    int order = u->lower_order_final && st->steps - i < S ? st->steps - i : S;
    if (order > st->lower_order_nums + 1) order = st->lower_order_nums + 1; /* warm-up */
    if ((s = make_coefs(st, i, order, 0, &cp)) != DL_OK) return s;
    const float sigma = st->sigmas[i];
    const float c_b0 = cp.c_b * 0.0f; /* alpha_t * B_h * pred_res with pred_res the integer 0 */
    const int pc = cc.p, pp = cp.p;
    float *const *hist = st->hist, *last = st->last, *oldest = st->hist[0];
    const float *newest = st->hist[S - 1];
    const int64_t n = st->n;
#pragma omp parallel for schedule(static) if (n >= 65536)
    for (int64_t e = 0; e < n; e++) {
        float x = sample[e];
        float x0 = x - sigma * model_output[e]; /* convert_model_output: flow_prediction, predict_x0 */
        if (corr) {
            /* x_t = sigma_t / sigma_s0 * last - alpha_t * h_phi_1 * m0
                     - alpha_t * B_h * (corr_res + rhos_c[-1] * (x0 - m0)) */
            float m0 = newest[e];
            float xt = cc.c_x * last[e] - cc.c_m0 * m0;
            float tail = cc.rho[pc - 1] * (x0 - m0);
            if (pc == 1) {
                tail = tail + 0.0f; /* corr_res is the integer 0: 0 + tensor */
            } else {
                /* einsum("k,bkc...->bc...", rhos_c[:-1], D1s), D1s[k] = (m_{k+1} - m0) / rk */
                float acc = cc.rho[0] * ((hist[S - 2][e] - m0) / cc.rk[0]);
                if (pc == 3) acc = acc + cc.rho[1] * ((hist[S - 3][e] - m0) / cc.rk[1]);
                tail = acc + tail;
            }
            x = xt - cc.c_b * tail;
        }
        /* the predictor's history after the shift: x0, then hist[S - 1], hist[S - 2] */
        float m1 = pp >= 2 ? hist[S - 1][e] : 0, m2 = pp >= 3 ? hist[S - 2][e] : 0;
        last[e] = x;
        oldest[e] = x0; /* becomes the newest when the ring turns */
        float xt = cp.c_x * x - cp.c_m0 * x0;
        if (pp == 1) {
            sample[e] = xt - c_b0;
        } else {
            float acc = cp.rho[0] * ((m1 - x0) / cp.rk[0]);
            if (pp == 3) acc = acc + cp.rho[1] * ((m2 - x0) / cp.rk[1]);
            sample[e] = xt - cp.c_b * acc;
        }
    }
    float *t = st->hist[0];
    for (int k = 0; k + 1 < S; k++) st->hist[k] = st->hist[k + 1];
    st->hist[S - 1] = t;
    st->this_order = order;
    if (st->lower_order_nums < S) st->lower_order_nums++;
    st->next++;
    return DL_OK;
}
