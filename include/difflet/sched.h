/* difflet sched: DDiT (../shared/seeds/001_921b6427be4c2427.txt) — serving a mix of
 * resolutions on a pool of devices with a degree of parallelism (DoP) per request,
 * changed at step boundaries, and with the DiT and VAE phases decoupled. This
 * module is the scheduler's model and a discrete-event simulator to evaluate it
 * against the paper's baselines; a later issue drives real ranks with it. */
#ifndef DIFFLET_SCHED_H
#define DIFFLET_SCHED_H

#include "difflet/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- profile table (the paper's RIB): resolution x phase x DoP -> seconds ---------- */
enum { DL_SCHED_MAX_RES = 8, DL_SCHED_MAX_DOP = 4 /* DoP 1, 2, 4, 8 */ };

typedef struct {
    int nres;
    char name[DL_SCHED_MAX_RES][16];
    double dit[DL_SCHED_MAX_RES][DL_SCHED_MAX_DOP]; /* whole DiT phase, seconds (<= 0: not possible) */
    double vae[DL_SCHED_MAX_RES][DL_SCHED_MAX_DOP];
    int steps; /* denoising steps the DiT figures cover */
} dl_profile;

/* The paper's Figure 17 (OpenSora, batch size 1, DoP 1/2/4/8): 144p, 240p, 360p, 480p. */
void dl_profile_reference(dl_profile *p);
/* CSV rows "resolution,phase,dop,seconds" (phase dit|vae), header optional. */
dl_status dl_profile_parse_csv(dl_profile *p, const char *text, size_t len);
/* The optimal DiT DoP B of resolution r by the change-rate metric (Eq. 4):
 * z(i) = 1 - T(i) / T(i/2) for i = 2, 4, 8; B is the i with the largest z, or 1
 * when no doubling helps. */
int dl_profile_best_dop(const dl_profile *p, int r);
int dl_dop_index(int dop); /* 1,2,4,8 -> 0..3, else -1 */

/* SQLite store of named profiles (`difflet profile import | show`). */
dl_status dl_profile_store_put(const char *db, const char *name, const dl_profile *p);
dl_status dl_profile_store_get(const char *db, const char *name, dl_profile *p);

/* ---- buddy allocator over power-of-two device groups inside nodes ------------------ */
typedef struct {
    int nodes, per_node;   /* per_node: a power of two */
    uint64_t free_mask[8]; /* a bit per device, up to 512 devices */
} dl_buddy;

dl_status dl_buddy_init(dl_buddy *b, int nodes, int per_node);
/* A free aligned group of `size` devices (a power of two <= per_node) inside one
 * node: its first device, or -1. Prefers the node with the fewest free devices
 * (best fit) so large groups stay available. */
int dl_buddy_alloc(dl_buddy *b, int size);
/* Grow a group in place: the aligned group of `size` containing [start, start+cur)
 * if its other devices are free (a promotion), else -1. */
int dl_buddy_grow(dl_buddy *b, int start, int cur, int size);
void dl_buddy_free(dl_buddy *b, int start, int size);
int dl_buddy_free_count(const dl_buddy *b);
/* Any `size` free devices of one node, not necessarily an aligned block (inside a
 * node every pair of devices is linked, so a parallel group may be scattered): the
 * first device of the node, with the chosen devices as bits of *mask relative to it,
 * or -1. Best fit as dl_buddy_alloc, lowest devices first; needs per_node <= 64.
 * Such devices are returned one by one with dl_buddy_free(b, d, 1). */
int dl_buddy_alloc_any(dl_buddy *b, int size, uint64_t *mask);
/* The largest group size allocatable now. */
int dl_buddy_largest(const dl_buddy *b);
int dl_buddy_is_free(const dl_buddy *b, int device);

/* ---- simulation ---------------------------------------------------------------------- */
typedef enum { DL_POLICY_DDIT, DL_POLICY_SDOP, DL_POLICY_SPCI, DL_POLICY_DPCI, DL_POLICY_DP,
               DL_POLICY_OPTIMAL /* the Algorithm 1 partition served as static clusters */ } dl_policy;

typedef struct {
    dl_policy policy;
    int static_dop;         /* sdop:N */
    int static_decouple;    /* sdop:N: after the DiT phase keep only the VAE DoP's devices and
                               return the rest (Fig. 13's "DiT-VAE-Decouple & Static DoP") */
    int place_any;          /* sdop:N: a group may be any free devices of one node instead of an
                               aligned buddy block, so devices that decoupled requests return one
                               at a time can form a new group (per_node <= 64) */
    int decouple;           /* DDiT: shrink to the VAE DoP after the DiT phase (default on) */
    int promote;            /* DDiT: grow hungry requests at step boundaries (default on) */
    double promote_overhead; /* seconds per promotion (transfer / scale-up) */
    int queue_aware;        /* DDiT variant: while requests wait, launch them on an even share
                               of the free devices and promote nobody (not in the paper) */
    int vae_dop;            /* DoP of the VAE phase (1) */
    int nodes, per_node;
    double rate;            /* requests per second (Poisson); 0: a burst at time 0 */
    double mix[DL_SCHED_MAX_RES];
    int nreq;
    uint64_t seed;
} dl_sim_config;

typedef struct {
    double avg_latency, p50_latency, p99_latency, makespan;
    double cost;            /* device-seconds held by requests (the paper's monetary cost) */
    double reserved_cost;   /* devices x makespan: the pool rented for the whole trace, idle
                               devices included (the makespan-based cost) */
    double utilization;     /* cost / reserved_cost */
    double optimal_cost;    /* policy optimal: Algorithm 1's own estimate of the cost */
    int completed, promotions;
    /* invariant checks made during the run (tests): all 0 */
    int errors_fcfs, errors_dop, errors_double, errors_idle;
} dl_sim_result;

dl_status dl_simulate(const dl_profile *p, const dl_sim_config *c, dl_sim_result *r);

/* The simulator's request trace (c's seed, rate: Poisson arrivals or 0 a burst at
 * time 0, mix over p's resolutions), one request at a time: the real-ranks run
 * (ddit_real.h) replays exactly the trace a simulation of the same config sees. */
typedef struct {
    uint64_t rng;
    double t;
} dl_sim_trace;
void dl_sim_trace_init(dl_sim_trace *tr, const dl_sim_config *c);
void dl_sim_trace_next(dl_sim_trace *tr, const dl_profile *p, const dl_sim_config *c, double *arrive, int *res);
/* the q-quantile (0.5, 0.99) of n sorted values: the ceil(q n)-th */
double dl_sched_percentile(const double *sorted, int n, double q);
const char *dl_policy_name(dl_policy p);

/* ---- the theoretical optimum (Algorithm 1) ------------------------------------------ */
typedef struct {
    double cost;                       /* least cumulative resource occupancy, device-seconds */
    int devices[DL_SCHED_MAX_RES];     /* devices given to each resolution (0: not in the mix) */
    int first[DL_SCHED_MAX_RES];       /* the first of them */
    int dop[DL_SCHED_MAX_RES];         /* the DoP of its instances */
    int instances[DL_SCHED_MAX_RES];   /* alpha: instances BandwidthAwarePartition makes */
} dl_optimal_plan;

/* Uses nodes, per_node, mix, vae_dop and rate (0: the batch model over nreq requests;
 * > 0: the queue model). */
dl_status dl_optimal(const dl_profile *p, const dl_sim_config *c, dl_optimal_plan *plan);
/* Instances of DoP p that devices [lo, hi) hold with no group crossing a node. */
int dl_bandwidth_partition(int lo, int hi, int per_node, int p);
/* k x this is the occupancy of k devices serving resolution res (Eq. 3 / 6 / 7). */
double dl_occupy(const dl_profile *p, const dl_sim_config *c, int res, double share, int dop, int alpha);

/* Queue models of Algorithm 1 (Appendix A): mean time in an M/D/1 system (Eq. 6), and
 * for c > 1 servers the textbook M/D/c approximation W = d + Wq(M/M/c) / 2 (the
 * deterministic service's queueing delay is about half the exponential one), which
 * Algorithm 1 uses. dl_mdc_time_printed is Eq. 7 as the paper prints it, half the
 * whole M/M/c time with Stirling's factorials: kept for the record, it falls below the
 * service time itself at light load (lambda 0.05, d 20.04, c 2: 13.38 s), so it cannot
 * be a time in system. Both are INFINITY when lambda d / c >= 1. */
double dl_md1_time(double lambda, double d);
double dl_mdc_time(double lambda, double d, int c);
double dl_mdc_time_printed(double lambda, double d, int c);

#ifdef __cplusplus
}
#endif
#endif
