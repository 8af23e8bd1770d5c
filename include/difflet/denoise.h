/* The denoising loop every pipeline shares (Difflet §3, §4): a model's step
 * evaluation behind a small interface (dl_denoiser), driven by one host loop that
 * owns what is the same for every DiT family: the step protocol between the ranks
 * of a replica, the worker loop of the non-host ranks, the end-of-request check
 * that every rank ran exactly the decided steps, classifier-free guidance (two
 * branches: sequential or batched on one group, or on separate cfg groups), step caching, the
 * scheduler update, cancellation and progress. A pipeline keeps only what is its
 * own: encoding the prompt into conditioning, the initial latents and their
 * packing, the schedule, and decoding. */
#ifndef DIFFLET_DENOISE_H
#define DIFFLET_DENOISE_H

#include <stdatomic.h>

#include "difflet/pipeline.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One branch's conditioning (branch 0: the prompt; 1: the negative prompt): up to
 * DL_COND_MAX f32 buffers the pipeline owns and the host fills; with parallel
 * execution the host broadcasts them to the replica at every request, so every rank
 * holds them in the same buffers. */
#define DL_COND_MAX 4
/* the most passes a step may make (dl_denoise_request.npass) */
#define DL_PASS_MAX 4
typedef struct {
    float *buf[DL_COND_MAX];
    int64_t numel[DL_COND_MAX];
    int n;
    int64_t valid; /* this branch's valid text rows (models whose branches differ in prompt
                      length, e.g. Qwen-Image); set per request by dl_denoise_set_valid */
} dl_cond;

/* A model's step evaluation. Every function runs on every rank of the model's split
 * (collectives inside are the model's business). */
typedef struct {
    /* out = denoiser(latents, conditioning, t) for one branch */
    dl_status (*eval)(void *model, const float *latents, const dl_cond *cond, float t, float guidance, float *out);
    /* the step-caching probe for CFG slot `slot` (NULL: the model has none) */
    dl_status (*probe)(void *model, int slot, const float *latents, const dl_cond *cond, float t, float guidance,
                       double *score);
    void (*probe_reset)(void *model);
    /* valid text tokens of the conditioning (NULL: the model attends all of them) */
    dl_status (*set_text_valid)(void *model, int64_t valid);
    /* batched CFG (NULL: none): both branches in one call, out0 / out1 */
    dl_status (*eval2)(void *model, const float *latents, const dl_cond *c0, const dl_cond *c1, float t, float guidance,
                       float *out0, float *out1);
} dl_denoiser_ops;

typedef struct {
    const dl_denoiser_ops *ops;
    void *model;
    int64_t latent_numel; /* the latents the loop steps, flattened */
    int batched;          /* the model was built for both CFG branches per call (ops->eval2): a step
                             running both on one group makes one call */
} dl_denoiser;

typedef struct dl_denoise dl_denoise;

/* The loop for one pipeline on this rank: `par` NULL for one rank. cond[0] and
 * cond[1] are the branches' conditioning buffers (cond[1] may have n = 0 when the
 * pipeline never runs true CFG). The loop owns the latents (dl_denoise_latents). */
dl_status dl_denoise_new(dl_denoise **out, const dl_denoiser *d, const dl_par_place *par, const dl_cond *cond0,
                         const dl_cond *cond1);
/* A loop for multi-pass steps (dl_denoise_request.npass): up to `passes` passes per
 * step (at most DL_PASS_MAX; the loop keeps an output and a step-cache state for
 * each), pass k evaluated by eval_pass(model, k, ...) on every rank that serves it
 * (the model's own variant of the evaluation for that pass: LTX-2's perturbed
 * self-attention, isolated modalities). The rest as dl_denoise_new, which is this
 * with 2 passes (the CFG branches) and ops->eval for every pass. */
typedef dl_status (*dl_denoise_eval_pass)(void *model, int pass, const float *latents, const dl_cond *cond, float t,
                                          float guidance, float *out);
dl_status dl_denoise_new_passes(dl_denoise **out, const dl_denoiser *d, int passes, dl_denoise_eval_pass eval_pass,
                                const dl_par_place *par, const dl_cond *cond0, const dl_cond *cond1);
/* Host, before dl_denoise_run: branch b's valid text rows, sent with its conditioning
 * and seen by the model in dl_cond.valid. */
void dl_denoise_set_valid(dl_denoise *d, int branch, int64_t valid);
/* The host's free also releases the replica's workers. */
void dl_denoise_free(dl_denoise *d);
int dl_denoise_is_host(const dl_denoise *d);
/* [latent_numel]: the pipeline writes the initial latents here before
 * dl_denoise_run and reads the result after. */
float *dl_denoise_latents(dl_denoise *d);

typedef struct {
    int steps;
    const float *t;        /* [steps]: the model's timestep input per step */
    const float *sigmas;   /* [steps + 1]: flow-matching Euler update latents += (s[i+1] - s[i]) * v */
    /* a multistep scheduler's update instead of Euler (NULL: Euler on sigmas):
     * latents <- step(v) for step i, on the host */
    dl_status (*sched_step)(void *sched_ctx, int step, const float *v, float *latents);
    void *sched_ctx;
    float guidance;        /* passed to the model (distilled guidance) */
    int cfg;               /* 1: two branches per step, v = v1 + cfg_scale * (v0 - v1) */
    float cfg_scale;
    int64_t cfg_renorm;    /* > 0: each row of this many values of the combined v rescaled to the
                              norm of the prompt's row (Qwen-Image's norm-preserving CFG) */
    int64_t text_valid;    /* valid text tokens of the conditioning (models with set_text_valid) */
    const dl_stepcache_config *cache; /* NULL or off: every step runs the denoiser */
    atomic_int *cancel;    /* checked before every step: nonzero stops with DL_ERR_CANCELLED (set from any thread) */
    void (*on_step)(void *ctx, int step, int steps, double elapsed);
    void (*on_probe)(void *ctx, int step, int branch, double probe, double change);
    void *ctx;
    /* the pipeline's own per-step work after step `step`'s update (inpainting's
     * blend with the re-noised image, previews), on the host, before on_step, with
     * the step's (guided) velocity v; NULL: none */
    void (*after_step)(void *after_ctx, int step, float *latents, const float *v, int64_t n);
    void *after_ctx;
    /* Multi-pass steps (npass > 0; 0: the CFG branches above). Pass k < npass runs
     * when bit k of pass_mask is set (bit 0 must be), on conditioning
     * cond[pass_cond[k]] (0: the prompt, 1: the negative prompt), by the loop's
     * eval_pass (dl_denoise_new_passes; ops->eval when none). A step runs all of its
     * passes or estimates all of them from the step cache: one decision per step, on
     * pass 0's state, with one probe call per step (slot 0) whose score stands for
     * every pass; on_probe reports passes 0 and 1 as branches 0 and 1. After the
     * passes, instead of the CFG combination and the scheduler update, the host calls
     * combine with every pass's output (out[k] for the passes in pass_mask,
     * latent_numel values each, which it may overwrite) to update the latents in
     * place. With cfg=2 the passes alternate between the two groups: the j-th pass of
     * pass_mask runs on group j % 2 (two passes at least). cfg, cfg_scale, cfg_renorm
     * and sched_step are not used. */
    int npass;
    unsigned pass_mask;
    int pass_cond[DL_PASS_MAX];
    dl_status (*combine)(void *combine_ctx, int step, float *const *out, float *latents);
    void *combine_ctx;
    /* Resumable requests (DDiT's promotion to another rank group): the loop starts at
     * step first_step (0: the start; the latents then hold the state after step
     * first_step - 1), and stops at the first step boundary after it at which
     * *preempt is nonzero (set from any thread), returning DL_ERR_PREEMPTED with the
     * latents as the steps done left them (timing's steps_done; the request ends on
     * every rank as usual). Only for updates that keep no state between steps (Euler,
     * a combine, a stateless sched_step such as OpenSora's: a multistep scheduler's
     * history is not carried; the pipeline's registry entry says `resumable`) and with
     * step caching off (nor is its estimator's memory). */
    int first_step;
    atomic_int *preempt;
} dl_denoise_request;

typedef struct {
    double denoise_s, probe_s, cached_s, comm_s;
    int calls, cached_steps, ranks;
    int steps_done; /* the steps the latents have had (a preempted request's resume point) */
} dl_denoise_timing;

/* Host: run the request's steps on the latents. Ends the request on every rank of
 * the replica exactly once, whatever happens. */
dl_status dl_denoise_run(dl_denoise *d, const dl_denoise_request *r, dl_denoise_timing *tm);
/* Host: dl_denoise_run for a pipeline's request g, resumable (a pipeline whose entry
 * is `resumable` calls this instead, after writing its initial latents): g's resume
 * latents replace the loop's and g's resume step and preempt flag go into r; when the
 * loop is preempted, g->on_preempt gets the steps done and the latents, and
 * DL_ERR_PREEMPTED is returned. */
struct dl_gen_request; /* registry.h */
dl_status dl_denoise_run_resumable(dl_denoise *d, const struct dl_gen_request *g, dl_denoise_request *r,
                                   dl_denoise_timing *tm);
/* Host: end a request that failed before dl_denoise_run (the workers wait for its
 * end); keeps the request's own error message. */
void dl_denoise_abandon(dl_denoise *d);
/* A non-host rank: serve the host's steps for one request (returns at its end, or
 * with *stopped set when the host frees its loop), or until the host stops. */
dl_status dl_denoise_worker_one(dl_denoise *d, int *stopped);
dl_status dl_denoise_worker(dl_denoise *d);

#ifdef __cplusplus
}
#endif
#endif
