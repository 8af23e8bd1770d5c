/* DDiT on real ranks (../shared/seeds/001_921b6427be4c2427.txt §4): one MPI world of
 * 1 + U ranks serves a request trace. Rank 0 is the scheduler (the control plane: it
 * speaks MPI to the units, so rank groups, promotions and the decoupled VAE are
 * decided where the ranks are, and it holds no model); ranks 1..U are the units (the
 * paper's devices), U a power of two. At start every unit loads the pipeline of every
 * served size once per aligned rank group it belongs to (1, 2, 4, ... units: the
 * buddy allocator's blocks, so the sub-communicators are made once and kept, as the
 * paper keeps them in a table), context-parallel over the group.
 *
 * A request runs on the group the policy gives it (dl_sim_config's: DDiT's greedy
 * policy with its optimal DoP B from the profile, the queue-aware variant, or a
 * static DoP): the group's first unit is the pipeline's host (the leader), the others
 * serve its steps. After each step the leader tells rank 0; a hungry request is
 * promoted at a step boundary: rank 0 reserves the larger group and tells the leader,
 * whose loop stops at the next boundary (a preempted request, dl_gen_request.preempt)
 * and sends its latents and step to rank 0, which starts the request on the new group
 * from there (dl_gen_request.resume_*): the output is the one a fixed group would
 * make. After the last step the other units of the group go back to the pool at
 * once (decoupling) while the leader decodes. The trace is the simulator's
 * (dl_sim_trace), so the same config simulated on the same profile is the
 * prediction the real run is compared with. */
#ifndef DIFFLET_DDIT_H
#define DIFFLET_DDIT_H

#include "difflet/comm.h"
#include "difflet/sched.h"
#include "difflet/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    const char *model;               /* a model folder whose registry entry is resumable */
    int nsizes;                      /* served sizes: resolution r of the profile is size r */
    int sizes[DL_SCHED_MAX_RES][2];  /* width, height */
    int frames;                      /* video models: frames per request (1: images) */
    int res_frames[DL_SCHED_MAX_RES]; /* > 0: resolution r's own frame count (serve: a pipeline per
                                        size and frame count) */
    int steps;                       /* per request (the profile's DiT times cover its own steps) */
    float guidance;
    dl_dtype dt;
    dl_quant quant; /* int8 linears (dl_gen_shape.quant) */
    const char *prompt;              /* every request's; request i is seeded i */
    dl_sim_config sim;               /* the policy and the trace: nodes 1, per_node = units */
    dl_profile prof;                 /* B per resolution (dl_profile_best_dop) and starvation (Eq. 5) */
    const char *out_dir;             /* NULL, or each request's frames as raw RGB bytes: <i>.rgb */
} dl_ddit_config;

typedef struct {
    int nreq, completed, failed, promotions;
    int nodes, per_node;             /* the units' hosts (a group never spans two), units on each */
    double avg, p50, p99, makespan;  /* latency: arrival to the end of the decode, seconds */
    double handover_avg, handover_max; /* a promotion's latents through rank 0 to the new group, seconds */
    double encode_avg;               /* the prompt's encoding in a request's last run (a promoted request
                                        encodes it again on its new group) */
    double *latency;                 /* [nreq] in trace order (the caller frees) */
    int *res, *first_dop, *last_dop; /* [nreq] resolution, the DoP it started and ended its DiT at */
    double *dit_last, *vae;          /* [nreq] its last run's denoising and decode seconds (the leader's clock) */
} dl_ddit_result;

/* Every rank of a world of 1 + units ranks calls this (units a power of two, at most
 * 64); rank 0 fills *out and returns when every request has ended, the units when rank
 * 0 stops them. A unit that cannot load aborts the world (the error printed). */
dl_status dl_ddit_run(dl_comm *world, const dl_ddit_config *c, dl_ddit_result *out);
void dl_ddit_result_free(dl_ddit_result *r);

/* ---- the same world fed by something else than a trace (serve's model process) ----- */

typedef struct dl_ddit_sched dl_ddit_sched; /* rank 0's state */

/* How a request ended (dl_ddit_source.done). */
typedef struct {
    int ok, cancelled;       /* ok: its output written by the leader; else cancelled or failed */
    const char *error;       /* why not ok ("" when ok) */
    double seconds;          /* its model time: its last run's encode + denoise + decode */
    int calls;               /* its last run's denoiser calls */
    int first_dop, last_dop; /* the DoP its DiT started and ended at (0: it never started) */
    int promotions;
} dl_ddit_end;

/* Rank 0's side of a request source; every call is on rank 0's thread. */
typedef struct {
    void *ctx;
    /* the requests that have come by `now` (seconds since the units were ready): each
     * added with dl_ddit_add; cancels with dl_ddit_cancel */
    void (*poll)(void *ctx, dl_ddit_sched *s, double now);
    /* request `req`'s leader finished step `step` of `steps` */
    void (*step)(void *ctx, int req, int step, int steps);
    /* request `req` ended */
    void (*done)(void *ctx, int req, const dl_ddit_end *e);
    /* the pool changed: units held by requests, requests waiting for units, promotions
     * so far (NULL: not wanted) */
    void (*pool)(void *ctx, int busy, int waiting, long promotions);
    /* the units are ready (loaded), on `nodes` hosts */
    void (*ready)(void *ctx, double load_seconds, int nodes);
    /* 1: stop once nothing runs or waits */
    int (*stop)(void *ctx);
} dl_ddit_source;

/* A request of resolution res (pipeline res of the config) and `steps` steps arrived at
 * `arrive`. job:
 * its request as the API process sends it ({"request": {...}, "out": path}; the
 * leader reads it and writes the output there), copied; NULL: the config's prompt,
 * seeded by the request's index. Returns the request's index (the source's handle). */
int dl_ddit_add(dl_ddit_sched *s, int res, int steps, double arrive, const char *job);
/* A request's client gave up: a waiting one ends cancelled now, a running one at its
 * leader's next step boundary. */
void dl_ddit_cancel(dl_ddit_sched *s, int req);
/* dl_ddit_run with requests from src instead of the config's trace (rank 0; the
 * units as in dl_ddit_run). */
dl_status dl_ddit_serve(dl_comm *world, const dl_ddit_config *c, const dl_ddit_source *src, dl_ddit_result *out);

#ifdef __cplusplus
}
#endif
#endif
