/* The shared denoising loop (denoise.h).
 *
 * Parallel execution: the replica's host rank runs the loop; before each denoiser
 * evaluation it broadcasts the step (op, branches, timestep, guidance, valid text
 * length) and the latents; every rank runs its part of the model. With cfg=2 the
 * branch-1 group runs the negative prompt and its first rank sends the output (or
 * probe score) to the host. Step-cache decisions are the host's; at the end of a
 * request every rank reports a hash of the steps it ran per branch and the host
 * checks them against its decisions. */
#include "difflet/denoise.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct dl_denoise {
    dl_denoiser d;
    dl_cond cond[2];
    const dl_par_place *par; /* NULL: one rank */
    int host, parallel;      /* this rank runs the host flow; the replica has > 1 rank */
    int64_t n;               /* latent elements */
    float *lat, *v, *v2;
    float *sc_buf[4];        /* step cache: prev and delta for each CFG branch */
    int64_t text_valid;
    uint64_t ran[2];         /* hash chain of the steps this rank ran, per branch */
    int nran[2];
};

enum { OP_STOP = 0, OP_REQUEST, OP_PROBE, OP_RUN, OP_END };
typedef struct {
    int32_t op, mask, L, two, step; /* mask: branches; two: the request has two passes */
    float t, guidance;
} step_msg;

int dl_denoise_is_host(const dl_denoise *d) { return d->host; }
float *dl_denoise_latents(dl_denoise *d) { return d->lat; }

static void note_ran(dl_denoise *d, int b, int step) {
    d->ran[b] = (d->ran[b] ^ (uint64_t)(step + 1)) * 0x100000001b3ull;
    d->nran[b]++;
}

/* does this rank evaluate branch b? (cfg=2: only its group's branch) */
static int serves(const dl_denoise *d, int b) { return !d->par || d->par->cfg.cfg == 1 || d->par->branch == b; }

/* the rank that sends branch 1's results to the host: branch 1's first rank */
static int cfg_partner(const dl_denoise *d) {
    return d->par && d->par->cfg.cfg == 2 && d->par->branch == 1 && d->par->split.tp_rank == 0 &&
           d->par->split.cp_rank == 0;
}

static dl_status send_msg(dl_denoise *d, int op, int mask, int two, int step, float t, float g) {
    if (!d->parallel) return DL_OK;
    step_msg m = {.op = op, .mask = mask, .L = (int32_t)d->text_valid, .two = two, .step = step, .t = t, .guidance = g};
    dl_status s = dl_comm_bcast(d->par->replica_comm, &m, sizeof m, 0);
    if (s == DL_OK && (op == OP_PROBE || op == OP_RUN))
        s = dl_comm_bcast(d->par->replica_comm, d->lat, (size_t)d->n * 4, 0);
    return s;
}

/* seconds this rank spent communicating (every group it belongs to) */
static double comm_seconds(const dl_denoise *d) {
    if (!d->parallel) return 0;
    const dl_comm *c[4] = {d->par->replica_comm, d->par->cfg_comm, d->par->tp_comm, d->par->cp_comm};
    double t = 0;
    for (int i = 0; i < 4; i++) t += dl_comm_stats_get(c[i]).seconds;
    return t;
}

/* the request's conditioning, host to every rank: branch 0, then branch 1 with two passes */
static dl_status send_cond(dl_denoise *d, int two) {
    dl_status s = DL_OK;
    for (int b = 0; b <= two && s == DL_OK; b++) {
        for (int i = 0; i < d->cond[b].n && s == DL_OK; i++)
            s = dl_comm_bcast(d->par->replica_comm, d->cond[b].buf[i], (size_t)d->cond[b].numel[i] * 4, 0);
        if (s == DL_OK) s = dl_comm_bcast(d->par->replica_comm, &d->cond[b].valid, sizeof d->cond[b].valid, 0);
    }
    return s;
}

void dl_denoise_set_valid(dl_denoise *d, int branch, int64_t valid) {
    if (branch == 0 || branch == 1) d->cond[branch].valid = valid;
}

/* End of a request: every rank's per-branch hash of the steps it ran, checked
 * against the host's decisions (*ranks: how many agreed). */
static dl_status check_ranks(dl_denoise *d, int *ranks) {
    *ranks = 1;
    if (!d->parallel) return DL_OK;
    dl_comm *c = d->par->replica_comm;
    int n = dl_comm_size(c);
    uint64_t mine[5] = {d->ran[0], d->ran[1], (uint64_t)d->nran[0], (uint64_t)d->nran[1],
                        (uint64_t)(serves(d, 0) | serves(d, 1) << 1)};
    uint64_t *all = malloc((size_t)n * sizeof mine);
    if (!all) return dl_fail(DL_ERR_NOMEM, "out of memory");
    dl_status s = dl_comm_allgather(c, mine, sizeof mine, all);
    for (int r = 1; s == DL_OK && d->host && r < n; r++) /* the host judges */
        for (int b = 0; b < 2; b++)
            if ((all[r * 5 + 4] >> b & 1) && (all[r * 5 + b] != d->ran[b] || all[r * 5 + 2 + b] != (uint64_t)d->nran[b]))
                s = dl_fail(DL_ERR_INVALID, "rank %d ran %llu denoiser steps of branch %d, the host decided %d: the ranks disagree",
                            r, (unsigned long long)all[r * 5 + 2 + b], b, d->nran[b]);
    free(all);
    if (s == DL_OK) *ranks = n;
    return s;
}

dl_status dl_denoise_new(dl_denoise **out, const dl_denoiser *dn, const dl_par_place *par, const dl_cond *cond0,
                         const dl_cond *cond1) {
    *out = NULL;
    if (!dn->ops || !dn->ops->eval || dn->latent_numel <= 0 || !cond0 || cond0->n > DL_COND_MAX ||
        (cond1 && cond1->n > DL_COND_MAX))
        return dl_fail(DL_ERR_INVALID, "denoise: a denoiser needs an eval function, latents and at most %d conditioning buffers",
                       DL_COND_MAX);
    dl_denoise *d = calloc(1, sizeof *d);
    if (!d) return dl_fail(DL_ERR_NOMEM, "out of memory");
    d->d = *dn;
    d->cond[0] = *cond0;
    if (cond1) d->cond[1] = *cond1;
    d->par = par;
    d->host = !par || dl_comm_rank(par->replica_comm) == 0;
    d->parallel = par && dl_comm_size(par->replica_comm) > 1;
    d->n = dn->latent_numel;
    size_t bytes = (size_t)d->n * 4;
    int ok = (d->lat = malloc(bytes)) && (d->v = malloc(bytes)) && (d->v2 = malloc(bytes));
    for (int i = 0; i < 4 && ok; i++) ok = (d->sc_buf[i] = malloc(bytes)) != NULL;
    if (!ok) {
        dl_denoise_free(d);
        return dl_fail(DL_ERR_NOMEM, "out of memory for the denoising loop's latents");
    }
    *out = d;
    return DL_OK;
}

void dl_denoise_free(dl_denoise *d) {
    if (!d) return;
    if (d->host && d->parallel) send_msg(d, OP_STOP, 0, 0, 0, 0, 0); /* release the workers */
    for (int i = 0; i < 4; i++) free(d->sc_buf[i]);
    free(d->lat), free(d->v), free(d->v2);
    free(d);
}

/* Branch b's evaluation (probe or denoiser) on this rank and, with cfg=2, the
 * partner's result for branch 1 on the host. */
static dl_status eval_branch(dl_denoise *d, int op, int b, int step, float tin, float g, float *out, double *score) {
    const dl_cond *cond = &d->cond[b];
    dl_status s = DL_OK;
    if (serves(d, b)) {
        if (op == OP_PROBE) s = d->d.ops->probe(d->d.model, b, d->lat, cond, tin, g, score);
        else {
            s = d->d.ops->eval(d->d.model, d->lat, cond, tin, g, out);
            if (s == DL_OK) note_ran(d, b, step);
        }
        if (s == DL_OK && b == 1 && cfg_partner(d)) { /* to the host */
            dl_comm *c = d->par->cfg_comm;
            s = op == OP_PROBE ? dl_comm_send(c, score, sizeof *score, 0, 11) : dl_comm_send(c, out, (size_t)d->n * 4, 0, 12);
        }
    } else if (d->host) { /* cfg=2: branch 1 ran on the other group */
        dl_comm *c = d->par->cfg_comm;
        if (op == OP_PROBE) s = dl_comm_recv(c, score, sizeof *score, 1, 11);
        else {
            s = dl_comm_recv(c, out, (size_t)d->n * 4, 1, 12);
            if (s == DL_OK) note_ran(d, b, step);
        }
    }
    return s;
}

/* a step's two branches as one batched call (both run, one group, a batched model) */
static int batched(const dl_denoise *d, int op, int mask) {
    return op == OP_RUN && mask == 3 && d->d.batched && d->d.ops->eval2 && (!d->par || d->par->cfg.cfg == 1);
}

static dl_status eval_pair(dl_denoise *d, int step, float tin, float g) {
    dl_status s = d->d.ops->eval2(d->d.model, d->lat, &d->cond[0], &d->cond[1], tin, g, d->v, d->v2);
    if (s == DL_OK) note_ran(d, 0, step), note_ran(d, 1, step);
    return s;
}

static void probe_reset(dl_denoise *d) {
    if (d->d.ops->probe_reset) d->d.ops->probe_reset(d->d.model);
}

dl_status dl_denoise_worker_one(dl_denoise *d, int *stopped) {
    *stopped = 0;
    if (d->host) return dl_fail(DL_ERR_INVALID, "the host rank runs the pipeline, not the worker loop");
    for (;;) {
        step_msg m;
        dl_status s = dl_comm_bcast(d->par->replica_comm, &m, sizeof m, 0);
        if (s != DL_OK) return s;
        switch (m.op) {
        case OP_STOP: *stopped = 1; return DL_OK;
        case OP_REQUEST:
            if ((s = send_cond(d, m.two))) return s;
            probe_reset(d);
            d->ran[0] = d->ran[1] = 0;
            d->nran[0] = d->nran[1] = 0;
            break;
        case OP_PROBE:
        case OP_RUN:
            if ((s = dl_comm_bcast(d->par->replica_comm, d->lat, (size_t)d->n * 4, 0))) return s;
            if (d->d.ops->set_text_valid && (s = d->d.ops->set_text_valid(d->d.model, m.L))) return s;
            if (batched(d, m.op, m.mask)) {
                if ((s = eval_pair(d, m.step, m.t, m.guidance))) return s;
                break;
            }
            for (int b = 0; b < 2; b++) {
                double score = 0;
                if ((m.mask >> b & 1) && serves(d, b) && (s = eval_branch(d, m.op, b, m.step, m.t, m.guidance, d->v, &score)))
                    return s;
            }
            break;
        case OP_END: {
            int ranks;
            return check_ranks(d, &ranks); /* the request is over */
        }
        default: return dl_fail(DL_ERR_INVALID, "worker: unknown step message %d", m.op);
        }
    }
}

dl_status dl_denoise_worker(dl_denoise *d) {
    int stopped = 0;
    dl_status s = DL_OK;
    while (s == DL_OK && !stopped) s = dl_denoise_worker_one(d, &stopped);
    return s;
}

void dl_denoise_abandon(dl_denoise *d) {
    if (!d->parallel) return;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", dl_last_error()); /* keep the request's own error */
    int ranks;
    if (send_msg(d, OP_END, 0, 0, 0, 0, 0) == DL_OK) check_ranks(d, &ranks);
    dl_fail(DL_ERR_INVALID, "%s", msg);
}

dl_status dl_denoise_run(dl_denoise *d, const dl_denoise_request *r, dl_denoise_timing *timing) {
    dl_denoise_timing tm = {0};
    if (!d->host) return dl_fail(DL_ERR_INVALID, "only the host rank runs the denoising loop");
    const int cfg = r->cfg != 0;
    if (r->steps <= 0 || !r->t || !r->sigmas) {
        dl_status s = dl_fail(DL_ERR_INVALID, "denoise: a request needs steps, timesteps and sigmas");
        dl_denoise_abandon(d);
        return s;
    }
    if ((r->cache && r->cache->mode == DL_STEPCACHE_CALIBRATED) || r->on_probe) {
        if (!d->d.ops->probe) {
            dl_status s = dl_fail(DL_ERR_UNSUPPORTED, "this model has no step-caching probe (calibrated caching)");
            dl_denoise_abandon(d);
            return s;
        }
    }
    d->text_valid = r->text_valid;
    /* from here on every exit ends the request on every rank (OP_END) */
    double c0 = comm_seconds(d);
    dl_status s = DL_OK;
    if (d->parallel && ((s = send_msg(d, OP_REQUEST, 0, cfg, 0, 0, 0)) == DL_OK)) s = send_cond(d, cfg);
    d->ran[0] = d->ran[1] = 0;
    d->nran[0] = d->nran[1] = 0;
    const int64_t n = d->n;
    /* step cache: fresh state for this request, one per CFG branch */
    static const dl_stepcache_config off = {0};
    const dl_stepcache_config *sc = r->cache ? r->cache : &off;
    int probing = sc->mode == DL_STEPCACHE_CALIBRATED || r->on_probe;
    dl_stepcache_state st[2];
    for (int b = 0; b < 2; b++) {
        st[b] = (dl_stepcache_state){.prev = d->sc_buf[2 * b], .delta = d->sc_buf[2 * b + 1], .n = n};
        dl_stepcache_reset(&st[b]);
    }
    if (probing) probe_reset(d);
    const int nb = 1 + cfg, all = cfg ? 3 : 1;
    double t0 = dl_now();
    for (int i = 0; i < r->steps && s == DL_OK; i++) {
        if (r->cancel && atomic_load_explicit(r->cancel, memory_order_relaxed)) {
            s = dl_fail(DL_ERR_CANCELLED, "cancelled at step %d of %d", i, r->steps);
            break;
        }
        float tin = r->t[i];
        double score[2] = {0, 0};
        if (probing) { /* branch 0: the prompt; 1: the negative prompt */
            double tp = dl_now();
            s = send_msg(d, OP_PROBE, all, cfg, i, tin, r->guidance);
            for (int b = 0; b < nb && s == DL_OK; b++) s = eval_branch(d, OP_PROBE, b, i, tin, r->guidance, NULL, &score[b]);
            if (s != DL_OK) break;
            tm.probe_s += dl_now() - tp;
        }
        int run = 0;
        for (int b = 0; b < nb; b++)
            if (!dl_stepcache_decide(sc, &st[b], i, r->steps, score[b])) run |= 1 << b;
        if (run && (s = send_msg(d, OP_RUN, run, cfg, i, tin, r->guidance))) break;
        const int pair = batched(d, OP_RUN, run);
        if (pair && (s = eval_pair(d, i, tin, r->guidance))) break;
        for (int b = 0; b < nb; b++) {
            float *out = b ? d->v2 : d->v;
            double change = -1;
            if (run >> b & 1) {
                if (!pair && (s = eval_branch(d, OP_RUN, b, i, tin, r->guidance, out, NULL))) break;
                tm.calls++;
                change = dl_stepcache_full(sc, &st[b], out);
            } else {
                double tc = dl_now();
                dl_stepcache_estimate(&st[b], out);
                tm.cached_s += dl_now() - tc;
                tm.cached_steps++;
            }
            if (r->on_probe) r->on_probe(r->ctx, i, b, score[b], change);
        }
        if (s != DL_OK) break;
        if (cfg && r->cfg_renorm > 0) /* comb = vn + s (vc - vn); comb *= |vc| / |comb| per row */
            for (int64_t row = 0; row + r->cfg_renorm <= n; row += r->cfg_renorm) {
                float *vc = d->v + row, *vn = d->v2 + row;
                double nc = 0, nm = 0;
                for (int64_t k = 0; k < r->cfg_renorm; k++) {
                    float comb = vn[k] + r->cfg_scale * (vc[k] - vn[k]);
                    nc += (double)vc[k] * vc[k];
                    nm += (double)comb * comb;
                    vn[k] = comb;
                }
                float ratio = (float)sqrt(nc) / (float)sqrt(nm);
                for (int64_t k = 0; k < r->cfg_renorm; k++) vc[k] = vn[k] * ratio;
            }
        else if (cfg)
            for (int64_t k = 0; k < n; k++) d->v[k] = d->v2[k] + r->cfg_scale * (d->v[k] - d->v2[k]);
        if (r->sched_step) {
            if ((s = r->sched_step(r->sched_ctx, i, d->v, d->lat))) break;
        } else {
            float dt = r->sigmas[i + 1] - r->sigmas[i];
            for (int64_t k = 0; k < n; k++) d->lat[k] = d->lat[k] + dt * d->v[k];
        }
        if (r->after_step) r->after_step(r->after_ctx, i, d->lat, d->v, n);
        if (r->on_step) r->on_step(r->ctx, i + 1, r->steps, dl_now() - t0);
    }
    /* every rank reports what it ran, even after a cancel (it keeps them in step) */
    dl_status e = send_msg(d, OP_END, 0, cfg, 0, 0, 0);
    if (e == DL_OK) e = check_ranks(d, &tm.ranks);
    if (s == DL_OK) s = e;
    if (s != DL_OK) return s;
    if (d->parallel) tm.comm_s = comm_seconds(d) - c0;
    tm.denoise_s = dl_now() - t0;
    if (timing) *timing = tm;
    return DL_OK;
}
