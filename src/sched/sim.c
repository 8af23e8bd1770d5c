/* Discrete-event simulation of serving a resolution mix on a device pool
 * (DDiT §4.2, §6.1). Requests arrive (Poisson or a burst), run their DiT phase step by
 * step and then the VAE phase; policies decide how many devices each gets:
 *   ddit    FCFS; at arrival a request takes up to its optimal DoP B (at least one
 *           device; fewer than B: hungry); hungry requests are promoted at step
 *           boundaries when devices free up, the longest-starved first (Eq. 5); after
 *           the DiT phase a request shrinks to the VAE DoP (inter-phase decoupling);
 *   sdop:N  every request runs with exactly N devices, both phases (static DoP); with
 *           static_decouple it returns all but the VAE DoP's devices after the DiT
 *           phase (the paper's Fig. 13 ablation), and with place_any a group may be
 *           any free devices of a node, so single returned devices can be regrouped;
 *   spci    static partition, cluster isolation: clusters per resolution sized by
 *           the mix, each of instances at one static DoP (--sdop, default 1): more,
 *           smaller instances than dpci's;
 *   dpci    dynamic partition, cluster isolation: the same number of units of each
 *           class's B devices per class;
 *   dp      dpci, but a request whose cluster is busy may take a smaller unit of
 *           another cluster;
 *   optimal the theoretical optimum's partition (Algorithm 1) as fixed clusters.
 * Time is exact (no ticks): the next event is the earliest arrival or step end. The
 * running requests (at most one per device) are kept in a list in arrival order, so
 * an event costs O(devices) and not O(requests in the system): an overloaded trace of
 * 2,000 requests simulates in milliseconds. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "difflet/check.h"
#include "difflet/sched.h"

enum { WAITING = 0, DIT, VAE, DONE };

typedef struct {
    int res, phase, step, B, gstart, gsize, pend_start, pend_size, pend_moved, held, unit_cls, unit_id, last_step, started_seq;
    uint64_t scatter; /* place_any: the devices held, as bits relative to gstart (a node's first); 0: [gstart, gstart + gsize) */
    double arrive, start, finish, step_end, held_since, starv;
} req;

typedef struct { /* spci / dpci / dp: clusters of fixed-size units */
    int nunits[DL_SCHED_MAX_RES], size[DL_SCHED_MAX_RES];
    int busy[DL_SCHED_MAX_RES][512];
} clusters;

const char *dl_policy_name(dl_policy p) {
    switch (p) {
    case DL_POLICY_DDIT: return "ddit";
    case DL_POLICY_SDOP: return "sdop";
    case DL_POLICY_SPCI: return "spci";
    case DL_POLICY_DPCI: return "dpci";
    case DL_POLICY_DP: return "dp";
    case DL_POLICY_OPTIMAL: return "optimal";
    }
    return "?";
}

static double dit_step(const dl_profile *p, int res, int dop) {
    int i = dl_dop_index(dop);
    while (i > 0 && !(p->dit[res][i] > 0)) i--;
    return p->dit[res][i] / p->steps;
}

static double vae_time(const dl_profile *p, int res, int dop) {
    int i = dl_dop_index(dop);
    while (i > 0 && !(p->vae[res][i] > 0)) i--;
    return p->vae[res][i];
}

/* device-seconds bookkeeping: r->held devices since held_since, then `now_held` */
static void account(req *r, double t, int now_held, double *cost) {
    *cost += (t - r->held_since) * r->held;
    r->held_since = t;
    r->held = now_held;
}

/* free the devices of group [gs, gs + gn) that are not in [ks, ks + kn) */
static void free_outside(dl_buddy *b, int gs, int gn, int ks, int kn) {
    for (int d = gs; d < gs + gn; d++)
        if (d < ks || d >= ks + kn) dl_buddy_free(b, d, 1);
}

/* return a request's devices: all of them (keep 0), or all but its first `keep` */
static void release(dl_buddy *b, req *r, int keep) {
    if (r->scatter) {
        for (int d = 0, seen = 0; d < 64; d++)
            if (((r->scatter >> d) & 1) && seen++ >= keep) dl_buddy_free(b, r->gstart + d, 1), r->scatter &= ~(1ull << d);
    } else if (keep == 0) {
        dl_buddy_free(b, r->gstart, r->gsize);
    } else {
        for (int sz = keep; sz < r->gsize; sz *= 2) dl_buddy_free(b, r->gstart + sz, sz);
    }
}

void dl_sim_trace_init(dl_sim_trace *tr, const dl_sim_config *c) {
    tr->rng = c->seed * 0x9e3779b97f4a7c15ull + 1;
    tr->t = 0;
}

void dl_sim_trace_next(dl_sim_trace *tr, const dl_profile *p, const dl_sim_config *c, double *arrive, int *res) {
    double mixsum = 0;
    for (int i = 0; i < p->nres; i++) mixsum += c->mix[i] > 0 ? c->mix[i] : 0;
    if (c->rate > 0) tr->t += -log((double)((dl_rng_next(&tr->rng) >> 11) + 1) * 0x1p-53) / c->rate;
    double u = (double)(dl_rng_next(&tr->rng) >> 11) * 0x1p-53 * mixsum, acc = 0;
    *res = 0;
    for (int k = 0; k < p->nres; k++) {
        acc += c->mix[k] > 0 ? c->mix[k] : 0;
        *res = k;
        if (u < acc) break;
    }
    *arrive = tr->t;
}

double dl_sched_percentile(const double *sorted, int n, double q) {
    if (n < 1) return 0;
    int k = (int)ceil(q * n) - 1;
    return sorted[k < 0 ? 0 : k >= n ? n - 1 : k];
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

dl_status dl_simulate(const dl_profile *p, const dl_sim_config *c, dl_sim_result *out) {
    memset(out, 0, sizeof *out);
    if (c->nreq < 1 || c->nreq > 1000000) return dl_fail(DL_ERR_INVALID, "simulate: requests must be 1..1000000");
    dl_buddy bd;
    dl_status s = dl_buddy_init(&bd, c->nodes, c->per_node);
    if (s != DL_OK) return s;
    const int M = c->nodes * c->per_node, vae_dop = c->vae_dop > 0 ? c->vae_dop : 1;
    if (c->policy == DL_POLICY_SDOP && (dl_dop_index(c->static_dop) < 0 || c->static_dop > c->per_node))
        return dl_fail(DL_ERR_INVALID, "simulate: sdop:N needs N in 1, 2, 4, 8 and at most the devices per node");
    if ((c->static_decouple || c->place_any) && c->policy != DL_POLICY_SDOP)
        return dl_fail(DL_ERR_INVALID, "simulate: static decoupling and any-device placement are options of sdop:N");
    if (c->place_any && c->per_node > 64)
        return dl_fail(DL_ERR_INVALID, "simulate: any-device placement needs at most 64 devices per node");
    double mixsum = 0;
    for (int i = 0; i < p->nres; i++) mixsum += c->mix[i] > 0 ? c->mix[i] : 0;
    if (!(mixsum > 0)) return dl_fail(DL_ERR_INVALID, "simulate: the mix has no positive share");
    req *rq = calloc((size_t)c->nreq, sizeof *rq);
    double *lat = malloc((size_t)c->nreq * sizeof *lat);
    int *run = malloc((size_t)(M + 1) * sizeof *run); /* running requests, ascending index: each holds >= 1 device */
    clusters *cl = calloc(1, sizeof *cl);
    if (!rq || !lat || !run || !cl) {
        free(rq), free(lat), free(run), free(cl);
        return dl_fail(DL_ERR_NOMEM, "out of memory");
    }
    double t = 0;
    dl_sim_trace tr;
    dl_sim_trace_init(&tr, c);
    for (int i = 0; i < c->nreq; i++) { /* arrivals and classes, fixed by the seed */
        int res;
        dl_sim_trace_next(&tr, p, c, &t, &res);
        rq[i] = (req){.res = res, .arrive = t, .B = dl_profile_best_dop(p, res), .gstart = -1, .pend_start = -1, .unit_cls = -1};
        if (rq[i].B > c->per_node) rq[i].B = c->per_node;
    }
    if (c->policy == DL_POLICY_OPTIMAL) { /* Algorithm 1's partition, as fixed clusters */
        dl_optimal_plan plan;
        if ((s = dl_optimal(p, c, &plan)) != DL_OK) {
            free(rq), free(lat), free(run), free(cl);
            return s;
        }
        for (int k = 0; k < p->nres; k++) cl->size[k] = plan.dop[k], cl->nunits[k] = plan.instances[k];
        out->optimal_cost = plan.cost;
    } else if (c->policy >= DL_POLICY_SPCI) { /* cluster policies: units of each class's B devices */
        int used = 0, sumB = 0;
        for (int k = 0; k < p->nres; k++) {
            /* SPCI: every cluster's instances at one static DoP (sdop, default 1): more,
             * smaller instances than DPCI's B-sized ones (§6.1: "fewer model instances per
             * cluster" in the dynamic partition) */
            int b = c->policy == DL_POLICY_SPCI ? (c->static_dop > 0 ? c->static_dop : 1) : dl_profile_best_dop(p, k);
            cl->size[k] = b > c->per_node ? c->per_node : b;
            if (c->mix[k] > 0) sumB += cl->size[k];
        }
        for (int k = 0; k < p->nres; k++) {
            if (!(c->mix[k] > 0)) continue;
            int units = c->policy == DL_POLICY_SPCI ? (int)floor(M * c->mix[k] / mixsum / cl->size[k]) : M / sumB;
            if (units < 1) units = 1;
            cl->nunits[k] = units;
            used += units * cl->size[k];
        }
        while (used > M) /* trim the largest cluster until the units fit the devices */
            for (int k = 0, big = -1; k <= p->nres; k++) {
                if (k < p->nres) {
                    if (cl->nunits[k] > 1 && (big < 0 || cl->nunits[k] * cl->size[k] > cl->nunits[big] * cl->size[big])) big = k;
                    continue;
                }
                if (big < 0) {
                    free(rq), free(lat), free(run), free(cl);
                    return dl_fail(DL_ERR_INVALID, "simulate: too few devices for one unit per resolution");
                }
                cl->nunits[big]--, used -= cl->size[big];
            }
    }
    const int decouple = (c->policy == DL_POLICY_DDIT && c->decouple) || (c->policy == DL_POLICY_SDOP && c->static_decouple);
    int next_arrival = 0, done = 0, started = 0, nrun = 0, nwait = 0;
    int wfirst = 0; /* the oldest request that may still be waiting */
    int new_devices = 0;
    t = 0;
    while (done < c->nreq) {
        /* the next event */
        double tn = next_arrival < c->nreq ? rq[next_arrival].arrive : INFINITY;
        for (int k = 0; k < nrun; k++)
            if (rq[run[k]].step_end < tn) tn = rq[run[k]].step_end;
        if (!isfinite(tn)) { /* nothing can ever run: a configuration that cannot serve */
            free(rq), free(lat), free(run), free(cl);
            return dl_fail(DL_ERR_INVALID, "simulate: a request can never be scheduled with this pool");
        }
        t = tn;
        while (next_arrival < c->nreq && rq[next_arrival].arrive <= t) next_arrival++, nwait++;
        int kept = 0;
        for (int k = 0; k < nrun; k++) {
            req *r = &rq[run[k]];
            if (r->step_end > t) {
                run[kept++] = run[k];
                continue;
            }
            if (r->phase == DIT) {
                r->step++;
                run[kept++] = run[k];
                if (r->step < p->steps) {
                    if (r->pend_size) { /* a promotion takes effect at this step boundary */
                        if (r->pend_moved) dl_buddy_free(&bd, r->gstart, r->gsize); /* moved to a new group */
                        account(r, t, r->pend_size, &out->cost);
                        r->gstart = r->pend_start;
                        r->gsize = r->pend_size;
                        r->pend_size = 0;
                        r->step_end = t + dit_step(p, r->res, r->gsize) + c->promote_overhead;
                    } else {
                        r->step_end = t + dit_step(p, r->res, r->gsize);
                    }
                    continue;
                }
                /* DiT done: a promotion that never took effect is returned */
                if (r->pend_size) {
                    if (r->pend_moved) dl_buddy_free(&bd, r->pend_start, r->pend_size);
                    else free_outside(&bd, r->pend_start, r->pend_size, r->gstart, r->gsize);
                    r->pend_size = 0;
                    new_devices = 1;
                }
                account(r, t, r->gsize, &out->cost);
                int keep = r->gsize; /* decoupled: the request keeps only its VAE devices */
                if (decouple && r->gsize > vae_dop) {
                    keep = vae_dop;
                    release(&bd, r, keep);
                    new_devices = 1;
                    r->gsize = keep;
                    account(r, t, keep, &out->cost);
                }
                r->phase = VAE;
                r->step_end = t + vae_time(p, r->res, keep);
            } else { /* VAE done */
                account(r, t, 0, &out->cost);
                if (r->unit_cls >= 0) cl->busy[r->unit_cls][r->unit_id] = 0;
                else release(&bd, r, 0);
                r->phase = DONE;
                r->finish = t;
                lat[done++] = t - r->arrive;
                new_devices = 1;
            }
        }
        nrun = kept;
        /* ---- scheduling at time t ---- */
        /* the paper's order: hungry requests first, then waiting ones; queue-aware:
         * waiting ones first, and promotions only when nobody waits */
        for (int pass = 0; pass < 2; pass++) {
            if ((pass == 0) != (c->queue_aware != 0)) {
                if (c->queue_aware && nwait > 0) continue;
                if (c->policy == DL_POLICY_DDIT && c->promote && new_devices) {
                    /* hungry requests by starvation time (Eq. 5), longest first */
                    int hungry[512], nh = 0;
                    for (int k = 0; k < nrun; k++) {
                        req *r = &rq[run[k]];
                        if (r->phase != DIT || r->pend_size || r->gsize >= r->B) continue; /* one promotion at a time */
                        r->starv += (r->step - r->last_step) * (dit_step(p, r->res, r->gsize) - dit_step(p, r->res, r->B));
                        r->last_step = r->step;
                        hungry[nh++] = run[k];
                    }
                    for (int a = 1; a < nh; a++)
                        for (int b = a; b > 0 && rq[hungry[b]].starv > rq[hungry[b - 1]].starv; b--) {
                            int tmp = hungry[b];
                            hungry[b] = hungry[b - 1];
                            hungry[b - 1] = tmp;
                        }
                    for (int k = 0; k < nh; k++) {
                        req *r = &rq[hungry[k]];
                        for (int target = r->B; target > r->gsize; target /= 2) {
                            int moved = 0, g = dl_buddy_grow(&bd, r->gstart, r->gsize, target);
                            if (g < 0) g = dl_buddy_alloc(&bd, target), moved = 1;
                            if (g >= 0) { /* reserved now, used from the next step boundary */
                                account(r, t, moved ? r->gsize + target : target, &out->cost);
                                r->pend_start = g;
                                r->pend_size = target;
                                r->pend_moved = moved;
                                out->promotions++;
                                break;
                            }
                        }
                    }
                }
                new_devices = 0;
                continue;
            }
            /* waiting requests, FCFS. Resources only shrink during this pass, so a
             * cluster that refused one request refuses every later one of its class */
            int blocked[DL_SCHED_MAX_RES] = {0}, nblocked = 0, nclasses = 0;
            for (int k = 0; k < p->nres; k++) nclasses += c->mix[k] > 0;
            while (wfirst < next_arrival && rq[wfirst].phase != WAITING) wfirst++;
            for (int i = wfirst; i < next_arrival && nwait > 0; i++) {
                req *r = &rq[i];
                if (r->phase != WAITING || blocked[r->res]) continue;
                int got = -1, size = 0;
                if (c->policy == DL_POLICY_DDIT) {
                    int cap = r->B; /* queue-aware: an even share of the free devices among the waiting */
                    if (c->queue_aware)
                        while (cap > 1 && cap * nwait > dl_buddy_free_count(&bd)) cap /= 2;
                    for (size = cap; size >= 1; size /= 2)
                        if ((got = dl_buddy_alloc(&bd, size)) >= 0) break;
                } else if (c->policy == DL_POLICY_SDOP) {
                    size = c->static_dop;
                    got = c->place_any ? dl_buddy_alloc_any(&bd, size, &r->scatter) : dl_buddy_alloc(&bd, size);
                } else { /* a free unit of its own cluster; dp: or a smaller one elsewhere */
                    int k = r->res;
                    for (int u = 0; u < cl->nunits[k] && got < 0; u++)
                        if (!cl->busy[k][u]) got = u, r->unit_cls = k;
                    for (int k2 = 0; c->policy == DL_POLICY_DP && got < 0 && k2 < p->nres; k2++)
                        if (k2 != k && cl->size[k2] < cl->size[k])
                            for (int u = 0; u < cl->nunits[k2] && got < 0; u++)
                                if (!cl->busy[k2][u]) got = u, r->unit_cls = k2;
                    if (got >= 0) {
                        cl->busy[r->unit_cls][got] = 1;
                        r->unit_id = got;
                        size = cl->size[r->unit_cls];
                    }
                }
                if (got < 0) {
                    if (c->policy <= DL_POLICY_SDOP) break; /* FCFS over one pool: later ones wait too */
                    blocked[r->res] = 1;                    /* cluster isolation: only this class is full */
                    if (++nblocked == nclasses) break;
                    continue;
                }
                if (size > r->B && c->policy == DL_POLICY_DDIT) out->errors_dop++;
                r->gstart = r->unit_cls >= 0 ? -1 : got;
                r->gsize = size;
                r->phase = DIT;
                r->start = t;
                r->held_since = t;
                r->held = size;
                r->started_seq = started++;
                r->step_end = t + dit_step(p, r->res, size);
                nwait--;
                DL_ASSERT(nrun < M);
                int k = nrun++; /* into the running list, kept in arrival order */
                while (k > 0 && run[k - 1] > i) run[k] = run[k - 1], k--;
                run[k] = i;
            }
        }
        /* nothing idle while someone waits: DDiT takes any free device */
        if (c->policy == DL_POLICY_DDIT && nwait > 0 && dl_buddy_free_count(&bd) > 0) out->errors_idle++;
    }
    /* FCFS over one pool: starts in arrival order */
    double last_start = -1;
    for (int i = 0; i < c->nreq && c->policy <= DL_POLICY_SDOP; i++) {
        if (rq[i].start < last_start - 1e-12) out->errors_fcfs++;
        last_start = rq[i].start;
    }
    if (dl_buddy_free_count(&bd) != M) out->errors_double++;
    qsort(lat, (size_t)c->nreq, sizeof *lat, cmp_double);
    double sum = 0;
    for (int i = 0; i < c->nreq; i++) sum += lat[i];
    out->completed = done;
    out->avg_latency = sum / c->nreq;
    out->p99_latency = dl_sched_percentile(lat, c->nreq, 0.99);
    out->p50_latency = dl_sched_percentile(lat, c->nreq, 0.50);
    out->makespan = t;
    out->reserved_cost = M * t;
    out->utilization = t > 0 ? out->cost / out->reserved_cost : 0;
    free(rq), free(lat), free(run), free(cl);
    return DL_OK;
}
