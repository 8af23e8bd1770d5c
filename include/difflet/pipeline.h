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
typedef struct {
    int64_t num_train_timesteps;
    double shift;
    int use_dynamic_shifting, exponential; /* time_shift_type exponential (1) or linear (0) */
    int64_t base_image_seq_len, max_image_seq_len;
    double base_shift, max_shift;
} dl_flowmatch;

/* scheduler/scheduler_config.json; options difflet does not implement (Karras,
 * exponential or beta sigmas, shift_terminal, stochastic sampling, inverted sigmas)
 * are refused by name. */
dl_status dl_flowmatch_load(dl_model_dir *dir, dl_flowmatch *fm);
/* FluxPipeline's calculate_shift: mu from the packed image token count. */
double dl_flowmatch_mu(const dl_flowmatch *fm, int64_t image_seq_len);
/* FluxPipeline's schedule: sigmas = linspace(1, 1/steps, steps), shifted (dynamic
 * with mu, else static `shift`), in f32 as diffusers computes them; sigmas[steps] =
 * 0. sigmas: steps + 1 entries. */
dl_status dl_flowmatch_sigmas(const dl_flowmatch *fm, int steps, double mu, float *sigmas);

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

/* ---- FluxPipeline ------------------------------------------------------------------ */
typedef struct dl_flux_pipeline dl_flux_pipeline;

typedef struct {
    int width, height;    /* pixels; multiples of 2 * the VAE's scale (16 for FLUX) */
    int max_sequence_length; /* T5 tokens; 0: tokenizer_2's model_max_length if below 512, else 512 */
    dl_dtype dt;
    int cache;               /* dl_cache_mode (program.h): 0 = load or compile and cache */
    /* Parallel execution (NULL: one rank). Every rank of a replica loads the pipeline
     * with its place: the replica's first rank (the host) loads the tokenizers, text
     * encoders and VAE and runs the host flow; every rank loads its part of the
     * transformer (its own program: the split is in the key) and, if not the host,
     * serves the host's steps in dl_flux_pipeline_worker. */
    const dl_par_place *par;
} dl_flux_shape;

/* Load every component of a diffusers FluxPipeline folder for this shape. */
dl_status dl_flux_pipeline_load(dl_flux_pipeline **out, const char *model_dir, const dl_flux_shape *shape);
/* The host's free also releases the replica's workers. */
void dl_flux_pipeline_free(dl_flux_pipeline *p);
/* 1 on the rank that runs the host flow (always, without parallel execution). */
int dl_flux_pipeline_is_host(const dl_flux_pipeline *p);
/* A non-host rank: execute the host's denoiser steps until it stops (its free). */
dl_status dl_flux_pipeline_worker(dl_flux_pipeline *p);
/* The same for one request: returns when the host ends it (or, *stopped set, when
 * the host frees the pipeline). */
dl_status dl_flux_pipeline_worker_one(dl_flux_pipeline *p, int *stopped);
/* Packed latent token count and channels (the shape of an initial latent). */
void dl_flux_pipeline_latent_shape(const dl_flux_pipeline *p, int64_t *tokens, int64_t *channels);
int dl_flux_pipeline_has_guidance(const dl_flux_pipeline *p);
int dl_flux_pipeline_max_sequence_length(const dl_flux_pipeline *p);
/* The program id of component 0..3 (CLIP, T5, VAE, transformer). */
const char *dl_flux_pipeline_program_id(const dl_flux_pipeline *p, int component);
/* The size a model was made for: its VAE's sample_size (1024 for FLUX.1). */
int dl_flux_default_size(const char *model_dir);

typedef struct {
    const char *prompt;          /* used for both text encoders, as FluxPipeline's prompt_2 = prompt */
    const char *negative_prompt; /* with true_cfg > 1: true classifier-free guidance */
    int steps;
    float guidance;              /* distilled guidance (models with guidance_embeds) */
    float true_cfg;              /* > 1 with a negative prompt: two passes per step */
    uint64_t seed;
    const float *init_latents;   /* packed [tokens, channels] or NULL (then dl_randn(seed)) */
    const dl_stepcache_config *cache; /* NULL or mode off: every step runs the denoiser */
    volatile int *cancel;        /* checked before every step: nonzero stops with DL_ERR_CANCELLED */
    /* called after each step (may be NULL) */
    void (*on_step)(void *ctx, int step, int steps, double elapsed);
    void *ctx;
    /* calibration (may be NULL): per step and branch, the probe score and the
     * relative L1 change of the denoiser output (full steps only) */
    void (*on_probe)(void *ctx, int step, int branch, double probe, double change);
} dl_flux_request;

typedef struct {
    double encode_s, denoise_s, decode_s, probe_s, cached_s; /* cached_s: time in estimated steps */
    int transformer_calls, cached_steps;
    int ranks;          /* ranks of the replica that checked they ran exactly the decided steps */
    double comm_s;      /* host: seconds in communication (parallel execution) */
} dl_flux_timing;

/* Generate one image: rgb is height*width*3 bytes (row-major, RGB); image (may be
 * NULL) the same as floats in [0, 1] before rounding. */
dl_status dl_flux_generate(dl_flux_pipeline *p, const dl_flux_request *r, uint8_t *rgb, float *image,
                           dl_flux_timing *timing);

#ifdef __cplusplus
}
#endif
#endif
