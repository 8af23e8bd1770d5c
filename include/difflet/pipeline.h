/* difflet pipelines: host control flow per model family. What changes per request
 * (prompt, seed, steps, guidance) lives here; the models are built once for a
 * serving shape and reused. */
#ifndef DIFFLET_PIPELINE_H
#define DIFFLET_PIPELINE_H

#include "difflet/comm.h"
#include "difflet/models.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- FlowMatchEulerDiscreteScheduler (diffusers) ---------------------------------- */
typedef enum { DL_SIGMAS_PLAIN = 0, DL_SIGMAS_KARRAS, DL_SIGMAS_EXPONENTIAL, DL_SIGMAS_BETA } dl_sigma_kind;
typedef struct {
    int64_t num_train_timesteps;
    double shift;
    int use_dynamic_shifting, exponential; /* time_shift_type exponential (1) or linear (0) */
    int64_t base_image_seq_len, max_image_seq_len;
    double base_shift, max_shift;
    double shift_terminal;   /* 0: off; else the schedule is stretched to end there */
    dl_sigma_kind kind;      /* use_karras_sigmas / use_exponential_sigmas / use_beta_sigmas */
    int invert;              /* invert_sigmas (Mochi): sigmas 1 - s, the last one 1 */
} dl_flowmatch;

/* scheduler/scheduler_config.json; stochastic_sampling (a different step rule) is
 * refused by name. */
dl_status dl_flowmatch_load(dl_model_dir *dir, dl_flowmatch *fm);
/* The same from a config object (`file` names it in messages). */
dl_status dl_flowmatch_from_json(const struct cJSON *cfg, const char *file, dl_flowmatch *fm);
/* The pipelines' calculate_shift (FluxPipeline and others): mu from the packed image token count. */
double dl_flowmatch_mu(const dl_flowmatch *fm, int64_t image_seq_len);
/* set_timesteps(sigmas=linspace(1, 1/steps, steps), mu) as FluxPipeline calls it:
 * shifted (dynamic with mu, exponential or linear, else static `shift`), stretched
 * to shift_terminal, converted to Karras / exponential / beta(0.6, 0.6) sigmas,
 * inverted, in the float32 / float64 arithmetic diffusers uses; sigmas: steps + 1
 * entries (the last 0, or 1 when inverted). The model's timestep is sigma *
 * num_train_timesteps. */
dl_status dl_flowmatch_sigmas(const dl_flowmatch *fm, int steps, double mu, float *sigmas);
/* set_timesteps(num_inference_steps) with no custom sigmas, as WanPipeline calls it:
 * np.linspace(sigma_max, sigma_min) of the scheduler's own (shifted) training
 * schedule, shifted again, stretched, converted and inverted in float64 as diffusers
 * does, then float32. Dynamic shifting is refused (no mu). */
dl_status dl_flowmatch_sigmas_default(const dl_flowmatch *fm, int steps, float *sigmas);

/* ---- step caching (stepcache.c) ---------------------------------------------------- */
typedef enum { DL_STEPCACHE_OFF = 0, DL_STEPCACHE_CADENCE, DL_STEPCACHE_ONLINE_DELTA, DL_STEPCACHE_CALIBRATED } dl_stepcache_mode;
#define DL_STEPCACHE_MAX_COEF 8

typedef struct {
    dl_stepcache_mode mode;
    int cadence;                 /* cadence:N */
    float alpha;                 /* online-delta (default 0.6) */
    float threshold;             /* calibrated */
    int keep_first, keep_last;   /* K initial and K final full steps (default 5, 5) */
    double coef[DL_STEPCACHE_MAX_COEF]; /* calibration polynomial, highest degree first */
    int ncoef, accumulate;       /* accumulate: TeaCache's accumulated threshold; a cached
                                    step is always followed by a full one (each extrapolates
                                    from the last computed change; runs of them compound) */
} dl_stepcache_config;

/* "off" | "cadence:N" | "online-delta[:ALPHA]" | "calibrated:FILE[:THRESHOLD]" */
dl_status dl_stepcache_parse(const char *spec, dl_stepcache_config *c);
/* {"coefficients": [...], "threshold": t, "accumulate": true} */
dl_status dl_stepcache_load_calibration(const char *path, dl_stepcache_config *c);
double dl_stepcache_poly(const dl_stepcache_config *c, double x);

/* Per request and per CFG branch: the estimator's memory (prev, delta: n floats,
 * owned by the caller) and the decision state. Reset at every request start. */
typedef struct {
    float *prev, *delta;
    int64_t n;
    int have_prev, have_delta, have_first, arm, cached_last;
    double first_change, last_change, acc;
} dl_stepcache_state;
void dl_stepcache_reset(dl_stepcache_state *s);
/* 1: estimate step `step` of `steps` instead of running the denoiser. probe: the
 * probe's score for this step (calibrated mode only). */
int dl_stepcache_decide(const dl_stepcache_config *c, dl_stepcache_state *s, int step, int steps, double probe);
/* after a full step: record out, return its relative L1 change */
double dl_stepcache_full(const dl_stepcache_config *c, dl_stepcache_state *s, const float *out);
/* a cached step: out = prev + delta, which becomes prev */
void dl_stepcache_estimate(dl_stepcache_state *s, float *out);

/* ---- the latent noise generator ----------------------------------------------------
 * Standard normal f32 values from a 64-bit seed: xoshiro256** seeded through
 * splitmix64, Box-Muller on pairs of 24-bit uniforms in (0, 1]. Stable across
 * machines and thread counts; not torch's generator, so a seed gives a different
 * (equally valid) picture than diffusers with that seed: parity tests pass the
 * initial latents explicitly. */
void dl_randn(uint64_t seed, float *out, int64_t n);

/* ---- parallel layouts (parallel.c) --------------------------------------------------
 * `--parallel tp=2,cp=2:ulysses,cfg=2,dp=2,sp`: each replica (dp of them) has
 * cfg x cp x tp ranks; world rank = ((replica * cfg + branch) * cp + cp_rank) * tp + tp_rank
 * (TP ranks adjacent: they talk most). */
typedef struct {
    int dp, cfg, tp, cp, sp;
    dl_cp_mode cp_mode;
} dl_par_config;
/* Keys tp=N, cp=N[:ulysses|ring|gather], cfg=1|2, dp=N, sp (a flag); "" or "1" is one
 * rank. Unknown keys and bad values are refused by name. */
dl_status dl_par_parse(const char *spec, dl_par_config *c);
int dl_par_ranks(const dl_par_config *c);
/* canonical text ("tp2.sp.cp2-ring.cfg2.dp1"; part of program keys) */
void dl_par_format(const dl_par_config *c, char *buf, size_t n);
/* Why this layout cannot run a pipeline that makes `passes` denoiser evaluations
 * per step on `world` ranks, whatever the model (NULL: feasible as far as the
 * layout goes; the model's own check is the registry's, dl_pipeline_layout_check). */
const char *dl_par_check(const dl_par_config *c, int passes, int world, char *buf, size_t n);

typedef struct {
    dl_par_config cfg;
    int rank, replica, branch;  /* world rank, dp index, cfg branch (0: the prompt) */
    dl_dit_split split;         /* tp / cp places and communicators */
    dl_comm *world, *replica_comm, *cfg_comm; /* cfg_comm: the ranks with the same replica, tp and cp place */
    dl_comm *tp_comm, *cp_comm;
} dl_par_place;
/* This rank's place in the layout (collective over world: splits communicators). */
dl_status dl_par_place_new(dl_comm *world, const dl_par_config *c, dl_par_place *out);
void dl_par_place_free(dl_par_place *p);

#ifdef __cplusplus
}
#endif
#endif
