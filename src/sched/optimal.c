/* The theoretical optimum of DDiT Algorithm 1: the least cumulative resource
 * occupancy of giving M = nodes x per_node devices to N resolution types, by dynamic
 * programming over (first i devices, first j types). Type j takes the k devices
 * i-k+1..i, split by BandwidthAwarePartition into alpha instances of DoP p (a group
 * of p devices must sit inside one node), and costs k x Occupy(x_j, d, alpha):
 *   burst (no arrivals): the batch model, Eq. 3: ceil(S x_j / alpha) d;
 *   rate lambda:         the queue model, Eq. 6 (alpha = 1) or Eq. 7 (alpha > 1).
 * d is the profiled time of one request at DoP p: DiT at p, VAE at the VAE DoP. */
#include <math.h>
#include <string.h>

#include "difflet/check.h"
#include "difflet/sched.h"

/* instances of DoP p on devices [lo, hi): whole groups inside each node */
int dl_bandwidth_partition(int lo, int hi, int per_node, int p) {
    int alpha = 0;
    for (int s = lo; s < hi;) {
        int node_end = (s / per_node + 1) * per_node, e = node_end < hi ? node_end : hi;
        alpha += (e - s) / p;
        s = e;
    }
    return alpha;
}

static double exec_time(const dl_profile *p, int res, int dop, int vae_dop) {
    int i = dl_dop_index(dop), v = dl_dop_index(vae_dop > 0 ? vae_dop : 1);
    if (i < 0 || !(p->dit[res][i] > 0)) return INFINITY;
    while (v > 0 && !(p->vae[res][v] > 0)) v--;
    return p->dit[res][i] + (p->vae[res][v] > 0 ? p->vae[res][v] : 0);
}

double dl_occupy(const dl_profile *p, const dl_sim_config *c, int res, double share, int dop, int alpha) {
    double d = exec_time(p, res, dop, c->vae_dop);
    if (!isfinite(d) || alpha < 1) return INFINITY;
    if (c->rate <= 0) return ceil(c->nreq * share / alpha) * d;         /* Eq. 3 */
    return alpha == 1 ? dl_md1_time(c->rate * share, d) : dl_mdc_time(c->rate * share, d, alpha); /* Eq. 6, 7 */
}

dl_status dl_optimal(const dl_profile *p, const dl_sim_config *c, dl_optimal_plan *plan) {
    memset(plan, 0, sizeof *plan);
    const int M = c->nodes * c->per_node;
    if (M < 1 || M > 512) return dl_fail(DL_ERR_INVALID, "optimal: 1..512 devices");
    int types[DL_SCHED_MAX_RES], N = 0;
    double mixsum = 0;
    for (int r = 0; r < p->nres; r++)
        if (c->mix[r] > 0) types[N++] = r, mixsum += c->mix[r];
    if (!N) return dl_fail(DL_ERR_INVALID, "optimal: the mix has no positive share");
    static double dp[513][DL_SCHED_MAX_RES + 1];
    static int pick_k[513][DL_SCHED_MAX_RES + 1], pick_p[513][DL_SCHED_MAX_RES + 1];
    for (int i = 0; i <= M; i++)
        for (int j = 0; j <= N; j++) dp[i][j] = j == 0 ? 0 : INFINITY;
    for (int i = 1; i <= M; i++)
        for (int j = 1; j <= N; j++) {
            dp[i][j] = dp[i - 1][j], pick_k[i][j] = 0; /* device i left unused; ties go to more devices */
            for (int k = 1; k <= i; k++)
                for (int pi = 0; pi < DL_SCHED_MAX_DOP; pi++) {
                    int dop = 1 << pi, alpha = dl_bandwidth_partition(i - k, i, c->per_node, dop);
                    if (alpha == 0 || !isfinite(dp[i - k][j - 1])) continue;
                    double v = dp[i - k][j - 1] + k * dl_occupy(p, c, types[j - 1], c->mix[types[j - 1]] / mixsum, dop, alpha);
                    if (v <= dp[i][j]) dp[i][j] = v, pick_k[i][j] = k, pick_p[i][j] = dop;
                }
        }
    plan->cost = dp[M][N];
    if (!isfinite(plan->cost)) return dl_fail(DL_ERR_INVALID, "optimal: no assignment serves this load (too few devices, or a queue with utilisation >= 1)");
    for (int i = M, j = N; j > 0;) {
        if (!pick_k[i][j]) {
            i--;
            continue;
        }
        int r = types[j - 1], k = pick_k[i][j];
        plan->devices[r] = k, plan->dop[r] = pick_p[i][j];
        plan->instances[r] = dl_bandwidth_partition(i - k, i, c->per_node, pick_p[i][j]);
        plan->first[r] = i - k;
        i -= k, j--;
    }
    return DL_OK;
}
