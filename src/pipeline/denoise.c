/* The shared denoising loop (denoise.h).
 *
 * A step is a set of passes over the same latents: the CFG branches (pass 0 the
 * prompt, pass 1 the negative prompt, combined here in velocity space), or a
 * pipeline's own passes (up to DL_PASS_MAX, each on the prompt or the negative
 * prompt, combined by the pipeline's callback on the host).
 *
 * Parallel execution: the replica's host rank runs the loop; before each step's
 * evaluations it broadcasts the step (op, the passes to run, timestep, guidance,
 * valid text length, the request's passes and which of them read the negative
 * prompt) and the latents; every rank runs its part of the model for every pass its
 * group serves. With cfg=2 the passes alternate between the two groups (the CFG
 * branches: the prompt on group 0, the negative prompt on group 1) and the first
 * rank of group 1 sends each of its passes' outputs (or probe scores) to the host, in
 * pass order. Step-cache decisions are the host's; at the end of a request every
 * rank reports a hash of the steps it ran per pass and the host checks them against
 * its decisions. */
#include "difflet/denoise.h"
#include "difflet/registry.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct dl_denoise {
    dl_denoiser d;
    dl_denoise_eval_pass eval_pass; /* multi-pass steps: pass k's evaluation (NULL: d.ops->eval) */
    dl_cond cond[2];
    const dl_par_place *par; /* NULL: one rank */
    int host, parallel;      /* this rank runs the host flow; the replica has > 1 rank */
    int np;                  /* passes a step may make (outputs and step-cache states kept) */
    int64_t n;               /* latent elements */
    float *lat;
    float *v[DL_PASS_MAX];   /* each pass's output */
    float *sc_buf[2 * DL_PASS_MAX]; /* step cache: prev and delta for each pass */
    int64_t text_valid;
    unsigned act, pcond;     /* the request's passes, and those that read the negative prompt (bits) */
    uint64_t ran[DL_PASS_MAX]; /* hash chain of the steps this rank ran, per pass */
    int nran[DL_PASS_MAX];
};

enum { OP_STOP = 0, OP_REQUEST, OP_PROBE, OP_RUN, OP_END };
typedef struct {
    int32_t op, mask, L, two, step; /* mask: the passes to run; two: the negative prompt is read */
    int32_t act, pcond;             /* the request's passes; those on the negative prompt */
    float t, guidance;
} step_msg;

int dl_denoise_is_host(const dl_denoise *d) { return d->host; }
float *dl_denoise_latents(dl_denoise *d) { return d->lat; }

static void note_ran(dl_denoise *d, int k, int step) {
    d->ran[k] = (d->ran[k] ^ (uint64_t)(step + 1)) * 0x100000001b3ull;
    d->nran[k]++;
}

static void ran_reset(dl_denoise *d) {
    for (int k = 0; k < DL_PASS_MAX; k++) d->ran[k] = 0, d->nran[k] = 0;
}

/* the cfg group of pass k: the passes of the request alternate between groups 0 and 1 */
static int group_of(const dl_denoise *d, int k) { return __builtin_popcount(d->act & ((1u << k) - 1)) & 1; }

/* does this rank evaluate pass k? (cfg=2: only its group's passes) */
static int serves(const dl_denoise *d, int k) {
    return !d->par || d->par->cfg.cfg == 1 || d->par->branch == group_of(d, k);
}

/* the rank that sends group 1's results to the host: its first rank */
static int cfg_partner(const dl_denoise *d) {
    return d->par && d->par->cfg.cfg == 2 && d->par->branch == 1 && d->par->split.tp_rank == 0 &&
           d->par->split.cp_rank == 0;
}

static dl_status send_msg(dl_denoise *d, int op, int mask, int step, float t, float g) {
    if (!d->parallel) return DL_OK;
    step_msg m = {.op = op, .mask = mask, .L = (int32_t)d->text_valid, .two = (d->act & d->pcond) != 0, .step = step,
                  .act = (int32_t)d->act, .pcond = (int32_t)d->pcond, .t = t, .guidance = g};
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

/* the request's conditioning, host to every rank: branch 0, then branch 1 when a pass reads it */
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

/* End of a request: every rank's per-pass hash of the steps it ran, checked
 * against the host's decisions (*ranks: how many agreed). */
static dl_status check_ranks(dl_denoise *d, int *ranks) {
    *ranks = 1;
    if (!d->parallel) return DL_OK;
    dl_comm *c = d->par->replica_comm;
    enum { P = DL_PASS_MAX, W = 2 * DL_PASS_MAX + 1 };
    const int n = dl_comm_size(c);
    uint64_t mine[W] = {0};
    for (int k = 0; k < P; k++) {
        mine[k] = d->ran[k], mine[P + k] = (uint64_t)d->nran[k];
        mine[2 * P] |= (uint64_t)serves(d, k) << k;
    }
    uint64_t *all = malloc((size_t)n * sizeof mine);
    if (!all) return dl_fail(DL_ERR_NOMEM, "out of memory");
    dl_status s = dl_comm_allgather(c, mine, sizeof mine, all);
    for (int r = 1; s == DL_OK && d->host && r < n; r++) /* the host judges */
        for (int k = 0; k < P && s == DL_OK; k++)
            if ((all[r * W + 2 * P] >> k & 1) && (all[r * W + k] != d->ran[k] || all[r * W + P + k] != (uint64_t)d->nran[k]))
                s = dl_fail(DL_ERR_INVALID, "rank %d ran %llu denoiser steps of pass %d, the host decided %d: the ranks disagree",
                            r, (unsigned long long)all[r * W + P + k], k, d->nran[k]);
    free(all);
    if (s == DL_OK) *ranks = n;
    return s;
}

dl_status dl_denoise_new(dl_denoise **out, const dl_denoiser *dn, const dl_par_place *par, const dl_cond *cond0,
                         const dl_cond *cond1) {
    return dl_denoise_new_passes(out, dn, 2, NULL, par, cond0, cond1);
}

dl_status dl_denoise_new_passes(dl_denoise **out, const dl_denoiser *dn, int np, dl_denoise_eval_pass eval_pass,
                                const dl_par_place *par, const dl_cond *cond0, const dl_cond *cond1) {
    *out = NULL;
    if (!dn->ops || !dn->ops->eval || dn->latent_numel <= 0 || !cond0 || cond0->n > DL_COND_MAX ||
        (cond1 && cond1->n > DL_COND_MAX) || np < 1 || np > DL_PASS_MAX || (dn->batched && np < 2))
        return dl_fail(DL_ERR_INVALID, "denoise: a denoiser needs an eval function, latents, at most %d conditioning buffers "
                                       "and 1..%d passes per step (2 when batched)",
                       DL_COND_MAX, DL_PASS_MAX);
    dl_denoise *d = calloc(1, sizeof *d);
    if (!d) return dl_fail(DL_ERR_NOMEM, "out of memory");
    d->d = *dn;
    d->eval_pass = eval_pass;
    d->cond[0] = *cond0;
    if (cond1) d->cond[1] = *cond1;
    d->par = par;
    d->host = !par || dl_comm_rank(par->replica_comm) == 0;
    d->parallel = par && dl_comm_size(par->replica_comm) > 1;
    d->np = np;
    d->n = dn->latent_numel;
    size_t bytes = (size_t)d->n * 4;
    int ok = (d->lat = malloc(bytes)) != NULL;
    for (int k = 0; k < np && ok; k++) ok = (d->v[k] = malloc(bytes)) != NULL;
    for (int i = 0; i < 2 * np && ok; i++) ok = (d->sc_buf[i] = malloc(bytes)) != NULL;
    if (!ok) {
        dl_denoise_free(d);
        return dl_fail(DL_ERR_NOMEM, "out of memory for the denoising loop's latents");
    }
    *out = d;
    return DL_OK;
}

void dl_denoise_free(dl_denoise *d) {
    if (!d) return;
    if (d->host && d->parallel) send_msg(d, OP_STOP, 0, 0, 0, 0); /* release the workers */
    for (int i = 0; i < 2 * DL_PASS_MAX; i++) free(d->sc_buf[i]);
    for (int k = 0; k < DL_PASS_MAX; k++) free(d->v[k]);
    free(d->lat);
    free(d);
}

/* Pass k's evaluation (probe or denoiser) on this rank and, with cfg=2, the
 * partner's result for a group-1 pass on the host. */
static dl_status eval_branch(dl_denoise *d, int op, int k, int step, float tin, float g, float *out, double *score) {
    const dl_cond *cond = &d->cond[d->pcond >> k & 1];
    dl_status s = DL_OK;
    if (serves(d, k)) {
        if (op == OP_PROBE) s = d->d.ops->probe(d->d.model, k, d->lat, cond, tin, g, score);
        else {
            s = d->eval_pass ? d->eval_pass(d->d.model, k, d->lat, cond, tin, g, out)
                             : d->d.ops->eval(d->d.model, d->lat, cond, tin, g, out);
            if (s == DL_OK) note_ran(d, k, step);
        }
        if (s == DL_OK && group_of(d, k) == 1 && cfg_partner(d)) { /* to the host */
            dl_comm *c = d->par->cfg_comm;
            s = op == OP_PROBE ? dl_comm_send(c, score, sizeof *score, 0, 11) : dl_comm_send(c, out, (size_t)d->n * 4, 0, 12);
        }
    } else if (d->host) { /* cfg=2: pass k ran on the other group */
        dl_comm *c = d->par->cfg_comm;
        if (op == OP_PROBE) s = dl_comm_recv(c, score, sizeof *score, 1, 11);
        else {
            s = dl_comm_recv(c, out, (size_t)d->n * 4, 1, 12);
            if (s == DL_OK) note_ran(d, k, step);
        }
    }
    return s;
}

/* a step's two CFG branches as one batched call (both run, one group, a batched model) */
static int batched(const dl_denoise *d, int op, int mask) {
    return op == OP_RUN && mask == 3 && d->d.batched && d->d.ops->eval2 && (!d->par || d->par->cfg.cfg == 1);
}

static dl_status eval_pair(dl_denoise *d, int step, float tin, float g) {
    dl_status s = d->d.ops->eval2(d->d.model, d->lat, &d->cond[0], &d->cond[1], tin, g, d->v[0], d->v[1]);
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
            if (((unsigned)m.act >> d->np) || ((unsigned)m.mask >> d->np))
                return dl_fail(DL_ERR_INVALID, "worker: a request with passes %#x, this loop keeps %d", (unsigned)m.act, d->np);
            d->act = (unsigned)m.act, d->pcond = (unsigned)m.pcond;
            if ((s = send_cond(d, m.two))) return s;
            probe_reset(d);
            ran_reset(d);
            break;
        case OP_PROBE:
        case OP_RUN:
            if ((s = dl_comm_bcast(d->par->replica_comm, d->lat, (size_t)d->n * 4, 0))) return s;
            if (d->d.ops->set_text_valid && (s = d->d.ops->set_text_valid(d->d.model, m.L))) return s;
            if (batched(d, m.op, m.mask)) {
                if ((s = eval_pair(d, m.step, m.t, m.guidance))) return s;
                break;
            }
            for (int k = 0; k < d->np; k++) {
                double score = 0;
                if ((m.mask >> k & 1) && serves(d, k) && (s = eval_branch(d, m.op, k, m.step, m.t, m.guidance, d->v[k], &score)))
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
    if (send_msg(d, OP_END, 0, 0, 0, 0) == DL_OK) check_ranks(d, &ranks);
    dl_fail(DL_ERR_INVALID, "%s", msg);
}

/* Why a request's passes cannot run (NULL: they can); *act and *pcond: its passes and
 * those on the negative prompt */
static const char *passes_check(const dl_denoise *d, const dl_denoise_request *r, unsigned *act, unsigned *pcond) {
    if (!r->npass) { /* the CFG branches */
        *act = r->cfg ? 3u : 1u, *pcond = 2u;
        return d->np < (r->cfg ? 2 : 1) ? "denoise: this loop was made for one pass per step, the request has two" : NULL;
    }
    *act = r->pass_mask, *pcond = 0;
    if (r->npass < 1 || r->npass > d->np || !(r->pass_mask & 1) || (r->pass_mask >> r->npass) || !r->combine)
        return "denoise: a multi-pass request needs 1..(the denoiser's passes) passes, pass 0 among them, and a combine function";
    for (int k = 0; k < r->npass; k++) {
        if (r->pass_cond[k] != 0 && r->pass_cond[k] != 1) return "denoise: a pass reads the prompt (0) or the negative prompt (1)";
        if ((r->pass_mask >> k & 1) && r->pass_cond[k]) *pcond |= 1u << k;
    }
    if (*pcond && !d->cond[1].n) return "denoise: a pass reads the negative prompt, but the loop has no buffers for it";
    if (d->par && d->par->cfg.cfg == 2 && __builtin_popcount(*act) < 2)
        return "cfg=2 runs the passes of a step on two rank groups, but this request makes one pass per step";
    return NULL;
}

dl_status dl_denoise_run(dl_denoise *d, const dl_denoise_request *r, dl_denoise_timing *timing) {
    dl_denoise_timing tm = {0};
    if (!d->host) return dl_fail(DL_ERR_INVALID, "only the host rank runs the denoising loop");
    const int cfg = r->cfg != 0, multi = r->npass > 0;
    if (r->steps <= 0 || !r->t || !r->sigmas) {
        dl_status s = dl_fail(DL_ERR_INVALID, "denoise: a request needs steps, timesteps and sigmas");
        dl_denoise_abandon(d);
        return s;
    }
    unsigned act, pcond;
    const char *bad = passes_check(d, r, &act, &pcond);
    if (bad) {
        dl_status s = dl_fail(DL_ERR_INVALID, "%s", bad);
        dl_denoise_abandon(d);
        return s;
    }
    const int resumable = r->first_step > 0 || r->preempt;
    if (r->first_step < 0 || r->first_step >= r->steps ||
        (resumable && ((r->cache && r->cache->mode != DL_STEPCACHE_OFF) || r->on_probe))) {
        dl_status s = dl_fail(DL_ERR_INVALID, r->first_step < 0 || r->first_step >= r->steps
                                                  ? "denoise: resume at step %d of %d"
                                                  : "denoise: a resumable request (resume at step %d of %d, or preemptible) "
                                                    "needs step caching off",
                              r->first_step, r->steps);
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
    d->act = act, d->pcond = pcond;
    /* from here on every exit ends the request on every rank (OP_END) */
    double c0 = comm_seconds(d);
    dl_status s = DL_OK;
    if (d->parallel && ((s = send_msg(d, OP_REQUEST, 0, 0, 0, 0)) == DL_OK)) s = send_cond(d, (act & pcond) != 0);
    ran_reset(d);
    const int64_t n = d->n;
    /* step cache: fresh state for this request, one per pass */
    static const dl_stepcache_config off = {0};
    const dl_stepcache_config *sc = r->cache ? r->cache : &off;
    int probing = sc->mode == DL_STEPCACHE_CALIBRATED || r->on_probe;
    const int track = sc->mode != DL_STEPCACHE_OFF || r->on_probe; /* the estimator's memory is read */
    dl_stepcache_state st[DL_PASS_MAX];
    for (int k = 0; k < d->np; k++) {
        st[k] = (dl_stepcache_state){.prev = d->sc_buf[2 * k], .delta = d->sc_buf[2 * k + 1], .n = n};
        dl_stepcache_reset(&st[k]);
    }
    if (probing) probe_reset(d);
    /* the probe: every CFG branch its own slot; a multi-pass step one call (slot 0) for all */
    const unsigned probed = multi ? 1u : act;
    double t0 = dl_now();
    int done = r->first_step, preempted = 0;
    for (int i = r->first_step; i < r->steps && s == DL_OK; i++) {
        if (r->cancel && atomic_load_explicit(r->cancel, memory_order_relaxed)) {
            s = dl_fail(DL_ERR_CANCELLED, "cancelled at step %d of %d", i, r->steps);
            break;
        }
        if (i > r->first_step && r->preempt && atomic_load_explicit(r->preempt, memory_order_relaxed)) {
            preempted = 1;
            break;
        }
        float tin = r->t[i];
        double score[DL_PASS_MAX] = {0};
        if (probing) {
            double tp = dl_now();
            s = send_msg(d, OP_PROBE, (int)probed, i, tin, r->guidance);
            for (int k = 0; k < d->np && s == DL_OK; k++)
                if (probed >> k & 1) s = eval_branch(d, OP_PROBE, k, i, tin, r->guidance, NULL, &score[k]);
            if (s != DL_OK) break;
            for (int k = 1; multi && k < DL_PASS_MAX; k++) score[k] = score[0];
            tm.probe_s += dl_now() - tp;
        }
        unsigned run = 0;
        if (multi) /* one decision for every pass */
            run = dl_stepcache_decide(sc, &st[0], i, r->steps, score[0]) ? 0u : act;
        else
            for (int k = 0; k < d->np; k++)
                if ((act >> k & 1) && !dl_stepcache_decide(sc, &st[k], i, r->steps, score[k])) run |= 1u << k;
        if (run && (s = send_msg(d, OP_RUN, (int)run, i, tin, r->guidance))) break;
        const int pair = batched(d, OP_RUN, (int)run);
        if (pair && (s = eval_pair(d, i, tin, r->guidance))) break;
        for (int k = 0; k < d->np; k++) {
            if (!(act >> k & 1)) continue;
            float *out = d->v[k];
            double change = -1;
            if (run >> k & 1) {
                if (!pair && (s = eval_branch(d, OP_RUN, k, i, tin, r->guidance, out, NULL))) break;
                tm.calls++;
                if (track) change = dl_stepcache_full(sc, &st[k], out);
            } else {
                double tc = dl_now();
                dl_stepcache_estimate(&st[k], out);
                tm.cached_s += dl_now() - tc;
                tm.cached_steps++;
            }
            if (r->on_probe && k < 2) r->on_probe(r->ctx, i, k, score[k], change);
        }
        if (s != DL_OK) break;
        if (multi) {
            if ((s = r->combine(r->combine_ctx, i, d->v, d->lat))) break;
        } else {
            float *v0 = d->v[0], *v1 = d->v[1];
            if (cfg && r->cfg_renorm > 0) /* comb = vn + s (vc - vn); comb *= |vc| / |comb| per row */
                for (int64_t row = 0; row + r->cfg_renorm <= n; row += r->cfg_renorm) {
                    float *vc = v0 + row, *vn = v1 + row;
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
                for (int64_t k = 0; k < n; k++) v0[k] = v1[k] + r->cfg_scale * (v0[k] - v1[k]);
            if (r->sched_step) {
                if ((s = r->sched_step(r->sched_ctx, i, v0, d->lat))) break;
            } else {
                float dt = r->sigmas[i + 1] - r->sigmas[i];
                for (int64_t k = 0; k < n; k++) d->lat[k] = d->lat[k] + dt * v0[k];
            }
        }
        if (r->after_step) r->after_step(r->after_ctx, i, d->lat, d->v[0], n);
        done = i + 1;
        if (r->on_step) r->on_step(r->ctx, i + 1, r->steps, dl_now() - t0);
    }
    /* every rank reports what it ran, even after a cancel (it keeps them in step) */
    dl_status e = send_msg(d, OP_END, 0, 0, 0, 0);
    if (e == DL_OK) e = check_ranks(d, &tm.ranks);
    if (s == DL_OK) s = e;
    if (s != DL_OK) return s;
    if (d->parallel) tm.comm_s = comm_seconds(d) - c0;
    tm.denoise_s = dl_now() - t0;
    tm.steps_done = done;
    if (timing) *timing = tm;
    return preempted ? dl_fail(DL_ERR_PREEMPTED, "preempted after step %d of %d", done, r->steps) : DL_OK;
}

dl_status dl_denoise_run_resumable(dl_denoise *d, const struct dl_gen_request *g, dl_denoise_request *r,
                                   dl_denoise_timing *tm) {
    if (g->resume_latents) {
        if (g->resume_numel != d->n || g->resume_step < 1) {
            dl_status s = dl_fail(DL_ERR_INVALID, "resume: %lld latents at step %d, the loop steps %lld from step 1 on",
                                  (long long)g->resume_numel, g->resume_step, (long long)d->n);
            dl_denoise_abandon(d);
            return s;
        }
        memcpy(d->lat, g->resume_latents, (size_t)d->n * sizeof(float));
        r->first_step = g->resume_step;
    }
    r->preempt = g->preempt;
    dl_denoise_timing t = {0};
    dl_status s = dl_denoise_run(d, r, &t);
    if (tm) *tm = t;
    if (s == DL_ERR_PREEMPTED && g->on_preempt) g->on_preempt(g->ctx, t.steps_done, d->lat, d->n);
    return s;
}
