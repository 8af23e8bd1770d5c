/* DDiT on real ranks (ddit.h): rank 0 schedules a trace onto the units' elastic
 * groups; the units run the pipelines. Messages (world communicator, small fixed
 * structs; latents as a float array after their header):
 *   0 -> unit  RUN {request, run, level, size, leader, resume step, n latents} [+ LAT]
 *   0 -> leader PROMOTE {request}: stop at the next step boundary
 *   leader -> 0 STEP {request, step} after every step (step = steps: the DiT is done)
 *   leader -> 0 PREEMPTED {request, steps done, n} + LAT
 *   leader -> 0 DONE {request, ok, seconds}
 *   0 -> unit  STOP
 * A waiting rank polls with dl_comm_iprobe and sleeps 100 us between polls, so idle
 * units and the scheduler cost no core. Rank 0's policy is the simulator's (sim.c): at
 * each pass, the paper's order (hungry requests promoted first, longest starved,
 * growing in place or moving; then the waiting ones, FCFS, each up to its B) or the
 * queue-aware one (waiting first, promotions only when nobody waits). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "difflet/ddit.h"
#include "difflet/registry.h"

enum { T_RUN = 4101, T_LAT, T_PROMOTE, T_STEP, T_PREEMPTED, T_DONE, T_STOP };
enum { MAX_LEVELS = 7 }; /* groups of 1 .. 64 units */

typedef struct {
    int32_t req, run, level, size, leader, resume_step;
    int64_t nlat;
} run_msg;
typedef struct {
    int32_t req, step;
} step_msg;
typedef struct {
    int32_t req, done;
    int64_t nlat;
} pre_msg;
typedef struct {
    int32_t req, ok;
    double encode_s, denoise_s, decode_s; /* the last run's */
} done_msg;

static void nap(void) { usleep(100); }

static int log2i(int v) {
    int l = 0;
    while ((1 << l) < v) l++;
    return l;
}

/* ---- a unit ------------------------------------------------------------------------ */

typedef struct {
    dl_comm *world;
    int req;
    atomic_int flag;
    int done;
    float *lat;
    int64_t n;
} lead_ctx;

/* after each step: tell rank 0, and take a promotion if one came (older ones, for
 * requests this unit no longer leads, are dropped) */
static void lead_step(void *ctx, int step, int steps, double elapsed) {
    lead_ctx *c = ctx;
    (void)steps, (void)elapsed;
    step_msg m = {c->req, step};
    if (dl_comm_send(c->world, &m, sizeof m, 0, T_STEP) != DL_OK) dl_comm_abort(1);
    while (dl_comm_iprobe(c->world, 0, T_PROMOTE, NULL, NULL, NULL) == 1) {
        step_msg p;
        if (dl_comm_recv(c->world, &p, sizeof p, 0, T_PROMOTE) != DL_OK) dl_comm_abort(1);
        if (p.req == c->req) atomic_store(&c->flag, 1);
    }
}

static void lead_take(void *ctx, int done, const float *lat, int64_t n) {
    lead_ctx *c = ctx;
    c->lat = malloc((size_t)n * sizeof *lat);
    if (!c->lat) {
        fprintf(stderr, "difflet ddit: unit: out of memory for %lld latents\n", (long long)n);
        dl_comm_abort(1);
    }
    memcpy(c->lat, lat, (size_t)n * sizeof *lat);
    c->n = n, c->done = done;
}

static void unit_fail(int u, const char *what) {
    fprintf(stderr, "difflet ddit: unit %d: %s: %s\n", u, what, dl_last_error());
    dl_comm_abort(1);
}

static int unit_main(dl_comm *world, const dl_ddit_config *c) {
    const int units = dl_comm_size(world) - 1, levels = log2i(units) + 1;
    dl_comm *ucomm = NULL, *lcomm[MAX_LEVELS] = {0};
    dl_par_place pl[MAX_LEVELS];
    dl_pipeline *pipes[MAX_LEVELS][DL_SCHED_MAX_RES] = {{0}};
    if (dl_comm_split(world, 1, dl_comm_rank(world), &ucomm) != DL_OK) unit_fail(-1, "units communicator");
    const int u = dl_comm_rank(ucomm);
    /* one sub-communicator and one pipeline per size for each aligned group of this unit */
    for (int l = 0; l < levels; l++) {
        dl_par_place *place = NULL;
        if (l > 0) {
            char spec[32], why[512];
            dl_par_config pc;
            snprintf(spec, sizeof spec, "cp=%d:ulysses", 1 << l);
            if (dl_par_parse(spec, &pc) == DL_OK && dl_pipeline_layout_check(c->model, &pc, 2, 1 << l, why, sizeof why))
                snprintf(spec, sizeof spec, "cp=%d:ring", 1 << l); /* the heads do not divide */
            if (dl_comm_split(ucomm, u >> l, u, &lcomm[l]) != DL_OK || dl_par_parse(spec, &pc) != DL_OK ||
                dl_par_place_new(lcomm[l], &pc, &pl[l]) != DL_OK)
                unit_fail(u, "group");
            place = &pl[l];
        }
        for (int s = 0; s < c->nsizes; s++) {
            dl_gen_shape sh = {.width = c->sizes[s][0], .height = c->sizes[s][1], .frames = c->frames, .dt = c->dt,
                               .par = place, .cache = DL_CACHE_RECOMPILE_ON_MISMATCH};
            if (dl_pipeline_load(&pipes[l][s], c->model, &sh) != DL_OK) unit_fail(u, "load");
        }
    }
    dl_comm_barrier(world); /* every unit loaded: rank 0 starts the clock */
    for (;;) {
        int tag;
        int got = dl_comm_iprobe(world, 0, -1, NULL, &tag, NULL);
        if (got < 0) unit_fail(u, "probe");
        if (!got) {
            nap();
            continue;
        }
        if (tag == T_STOP) {
            int32_t z;
            dl_comm_recv(world, &z, sizeof z, 0, T_STOP);
            break;
        }
        if (tag == T_PROMOTE) { /* for a request this unit no longer leads */
            step_msg p;
            dl_comm_recv(world, &p, sizeof p, 0, T_PROMOTE);
            continue;
        }
        run_msg m;
        if (tag != T_RUN || dl_comm_recv(world, &m, sizeof m, 0, T_RUN) != DL_OK) unit_fail(u, "a message from the scheduler");
        dl_pipeline *p = pipes[m.level][m.size];
        if (!m.leader) {
            int stopped = 0;
            if (dl_pipeline_worker_one(p, &stopped) != DL_OK) unit_fail(u, "serving a request's steps");
            continue;
        }
        float *resume = NULL;
        if (m.nlat > 0) {
            if (!(resume = malloc((size_t)m.nlat * sizeof *resume)) ||
                dl_comm_recv(world, resume, (size_t)m.nlat * sizeof *resume, 0, T_LAT) != DL_OK)
                unit_fail(u, "resume latents");
        }
        lead_ctx lc = {.world = world, .req = m.req};
        dl_gen_request r = {.prompt = c->prompt, .steps = c->steps, .guidance = c->guidance, .true_cfg = 1.f,
                            .seed = (uint64_t)m.req, .resume_step = m.resume_step, .resume_latents = resume,
                            .resume_numel = m.nlat, .preempt = &lc.flag, .on_step = lead_step, .on_preempt = lead_take,
                            .ctx = &lc};
        dl_media media;
        dl_gen_timing tm = {0};
        dl_status s = dl_pipeline_generate(p, &r, &media, &tm);
        free(resume);
        if (s == DL_ERR_PREEMPTED) {
            pre_msg pm = {m.req, lc.done, lc.n};
            if (dl_comm_send(world, &pm, sizeof pm, 0, T_PREEMPTED) != DL_OK ||
                dl_comm_send(world, lc.lat, (size_t)lc.n * sizeof *lc.lat, 0, T_LAT) != DL_OK)
                unit_fail(u, "handing over a preempted request");
            free(lc.lat);
            continue;
        }
        if (s != DL_OK) fprintf(stderr, "difflet ddit: request %d: %s\n", m.req, dl_last_error());
        if (s == DL_OK && c->out_dir) {
            char path[4200];
            snprintf(path, sizeof path, "%s/%d.rgb", c->out_dir, m.req);
            s = dl_file_write_atomic(path, media.rgb, (size_t)media.width * media.height * 3 * media.frames);
            if (s != DL_OK) fprintf(stderr, "difflet ddit: request %d: %s\n", m.req, dl_last_error());
        }
        if (s == DL_OK) dl_media_free(&media);
        done_msg dm = {m.req, s == DL_OK, tm.encode_s, tm.denoise_s, tm.decode_s};
        if (dl_comm_send(world, &dm, sizeof dm, 0, T_DONE) != DL_OK) unit_fail(u, "reporting");
    }
    for (int l = levels - 1; l >= 0; l--) {
        for (int s = 0; s < c->nsizes; s++) { /* a group's other units wait for its host's stop, then free */
            if (!dl_pipeline_is_host(pipes[l][s]) && dl_pipeline_worker(pipes[l][s]) != DL_OK) unit_fail(u, "stopping");
            dl_pipeline_free(pipes[l][s]);
        }
        if (l > 0) dl_par_place_free(&pl[l]), dl_comm_free(lcomm[l]);
    }
    dl_comm_free(ucomm);
    return 0;
}

/* ---- rank 0: the scheduler ----------------------------------------------------------- */

enum { WAITING, DIT, VAE, OVER };

typedef struct {
    int res, state, step, B, gstart, gsize, pend_start, pend_size, pend_moved, last_step, run, first_dop, last_dop;
    double arrive, finish, starv;
} rreq;

typedef struct {
    dl_comm *world;
    const dl_ddit_config *c;
    dl_buddy bd;
    rreq *rq;
    double encode_sum;
    int encodes;
} sched;

static double dit_step(const dl_profile *p, int res, int dop) {
    int i = dl_dop_index(dop);
    while (i > 0 && !(p->dit[res][i] > 0)) i--;
    return p->dit[res][i] / p->steps;
}

/* the request's group (gstart, gsize) runs it from step `from` (latents: the resume) */
static dl_status dispatch(sched *S, int i, int from, const float *lat, int64_t n) {
    rreq *r = &S->rq[i];
    r->run++;
    if (r->first_dop == 0) r->first_dop = r->gsize;
    r->last_dop = r->gsize;
    dl_status s = DL_OK;
    for (int k = r->gsize - 1; k >= 0 && s == DL_OK; k--) { /* the members first: the leader's steps find them */
        run_msg m = {i, r->run, log2i(r->gsize), r->res, k == 0, from, k == 0 && from > 0 ? n : 0};
        s = dl_comm_send(S->world, &m, sizeof m, 1 + r->gstart + k, T_RUN);
        if (s == DL_OK && m.nlat > 0) s = dl_comm_send(S->world, lat, (size_t)n * sizeof *lat, 1 + r->gstart, T_LAT);
    }
    return s;
}

static dl_status sched_main(dl_comm *world, const dl_ddit_config *c, dl_ddit_result *out) {
    const dl_sim_config *sc = &c->sim;
    const dl_profile *p = &c->prof;
    const int N = sc->nreq, units = dl_comm_size(world) - 1, steps = c->steps;
    sched S = {.world = world, .c = c};
    dl_comm *ucomm = NULL;
    double *arrive = malloc((size_t)N * sizeof *arrive), *lat = malloc((size_t)N * sizeof *lat);
    S.rq = calloc((size_t)N, sizeof *S.rq);
    memset(out, 0, sizeof *out);
    out->latency = calloc((size_t)N, sizeof(double));
    out->res = calloc((size_t)N, sizeof(int)), out->first_dop = calloc((size_t)N, sizeof(int));
    out->last_dop = calloc((size_t)N, sizeof(int));
    out->dit_last = calloc((size_t)N, sizeof(double)), out->vae = calloc((size_t)N, sizeof(double));
    dl_status s = dl_comm_split(world, 0, 0, &ucomm); /* the units' split: rank 0 takes part, alone */
    if (s == DL_OK && (!arrive || !lat || !S.rq || !out->latency || !out->res || !out->first_dop || !out->last_dop || !out->dit_last || !out->vae))
        s = dl_fail(DL_ERR_NOMEM, "out of memory");
    if (s == DL_OK) s = dl_buddy_init(&S.bd, 1, units);
    dl_sim_trace tr;
    dl_sim_trace_init(&tr, sc);
    for (int i = 0; s == DL_OK && i < N; i++) {
        dl_sim_trace_next(&tr, p, sc, &arrive[i], &S.rq[i].res);
        S.rq[i].arrive = arrive[i];
        S.rq[i].B = dl_profile_best_dop(p, S.rq[i].res);
        if (S.rq[i].B > units) S.rq[i].B = units;
        S.rq[i].gstart = S.rq[i].pend_start = -1;
    }
    if (s != DL_OK) dl_comm_abort(1);
    dl_comm_barrier(world); /* the units have loaded */
    const double t0 = dl_now();
    const int ddit = sc->policy == DL_POLICY_DDIT;
    const int decouple = (ddit && sc->decouple) || (sc->policy == DL_POLICY_SDOP && sc->static_decouple);
    int next = 0, done = 0, nwait = 0, wfirst = 0, new_dev = 0;
    float *buf = NULL;
    int64_t bufn = 0;
    double hand_sum = 0, hand_max = 0;
    while (done < N && s == DL_OK) {
        int events = 0;
        const double now = dl_now() - t0;
        while (next < N && arrive[next] <= now) next++, nwait++, events++;
        int src, tag;
        size_t nb;
        while (s == DL_OK && dl_comm_iprobe(world, -1, -1, &src, &tag, &nb) == 1) {
            events++;
            if (tag == T_STEP) {
                step_msg m;
                if ((s = dl_comm_recv(world, &m, sizeof m, src, T_STEP))) break;
                rreq *r = &S.rq[m.req];
                r->step = m.step;
                if (m.step < steps) continue;
                if (r->pend_size) { /* a promotion that never took effect */
                    if (r->pend_moved) dl_buddy_free(&S.bd, r->pend_start, r->pend_size);
                    else
                        for (int d = r->pend_start; d < r->pend_start + r->pend_size; d++)
                            if (d < r->gstart || d >= r->gstart + r->gsize) dl_buddy_free(&S.bd, d, 1);
                    r->pend_size = 0, new_dev = 1;
                }
                if (decouple && r->gsize > 1) { /* the others go back now; the leader decodes */
                    for (int sz = 1; sz < r->gsize; sz *= 2) dl_buddy_free(&S.bd, r->gstart + sz, sz);
                    r->gsize = 1, new_dev = 1;
                }
                r->state = VAE;
            } else if (tag == T_PREEMPTED) {
                pre_msg m;
                if ((s = dl_comm_recv(world, &m, sizeof m, src, T_PREEMPTED))) break;
                const double th = dl_now();
                if (m.nlat > bufn) {
                    free(buf);
                    if (!(buf = malloc((size_t)m.nlat * sizeof *buf))) {
                        s = dl_fail(DL_ERR_NOMEM, "out of memory");
                        break;
                    }
                    bufn = m.nlat;
                }
                if ((s = dl_comm_recv(world, buf, (size_t)m.nlat * sizeof *buf, src, T_LAT))) break;
                rreq *r = &S.rq[m.req];
                if (r->pend_moved) dl_buddy_free(&S.bd, r->gstart, r->gsize);
                r->gstart = r->pend_start, r->gsize = r->pend_size, r->pend_size = 0;
                r->step = m.done;
                out->promotions++;
                s = dispatch(&S, m.req, m.done, buf, m.nlat);
                const double h = dl_now() - th;
                hand_sum += h, hand_max = fmax(hand_max, h);
            } else if (tag == T_DONE) {
                done_msg m;
                if ((s = dl_comm_recv(world, &m, sizeof m, src, T_DONE))) break;
                rreq *r = &S.rq[m.req];
                dl_buddy_free(&S.bd, r->gstart, r->gsize);
                r->state = OVER, r->finish = dl_now() - t0;
                lat[done++] = r->finish - r->arrive;
                out->completed += m.ok, out->failed += !m.ok;
                S.encode_sum += m.encode_s, S.encodes++;
                out->dit_last[m.req] = m.denoise_s, out->vae[m.req] = m.decode_s;
                new_dev = 1;
            } else {
                s = dl_fail(DL_ERR_INVALID, "ddit scheduler: unexpected message tag %d from rank %d", tag, src);
            }
        }
        if (s != DL_OK) break;
        /* scheduling: the simulator's order (sim.c) */
        for (int pass = 0; pass < 2 && s == DL_OK; pass++) {
            if ((pass == 0) != (sc->queue_aware != 0)) { /* promotions */
                if (sc->queue_aware && nwait > 0) continue;
                if (!(ddit && sc->promote && new_dev)) continue;
                int hungry[64], nh = 0;
                for (int i = 0; i < next; i++) {
                    rreq *r = &S.rq[i];
                    if (r->state != DIT || r->pend_size || r->gsize >= r->B || r->step >= steps || nh == 64) continue;
                    r->starv += (r->step - r->last_step) * (dit_step(p, r->res, r->gsize) - dit_step(p, r->res, r->B));
                    r->last_step = r->step;
                    hungry[nh++] = i;
                }
                for (int a = 1; a < nh; a++)
                    for (int b = a; b > 0 && S.rq[hungry[b]].starv > S.rq[hungry[b - 1]].starv; b--) {
                        int t = hungry[b];
                        hungry[b] = hungry[b - 1], hungry[b - 1] = t;
                    }
                for (int k = 0; k < nh && s == DL_OK; k++) {
                    rreq *r = &S.rq[hungry[k]];
                    for (int target = r->B; target > r->gsize; target /= 2) {
                        int moved = 0, g = dl_buddy_grow(&S.bd, r->gstart, r->gsize, target);
                        if (g < 0) g = dl_buddy_alloc(&S.bd, target), moved = 1;
                        if (g < 0) continue;
                        r->pend_start = g, r->pend_size = target, r->pend_moved = moved;
                        step_msg pm = {hungry[k], 0};
                        s = dl_comm_send(world, &pm, sizeof pm, 1 + r->gstart, T_PROMOTE);
                        break;
                    }
                }
                new_dev = 0;
                continue;
            }
            /* waiting requests, FCFS */
            while (wfirst < next && S.rq[wfirst].state != WAITING) wfirst++;
            for (int i = wfirst; i < next && nwait > 0 && s == DL_OK; i++) {
                rreq *r = &S.rq[i];
                if (r->state != WAITING) continue;
                int got = -1, size = 0;
                if (ddit) {
                    int cap = r->B;
                    if (sc->queue_aware)
                        while (cap > 1 && cap * nwait > dl_buddy_free_count(&S.bd)) cap /= 2;
                    for (size = cap; size >= 1; size /= 2)
                        if ((got = dl_buddy_alloc(&S.bd, size)) >= 0) break;
                } else {
                    size = sc->static_dop;
                    got = dl_buddy_alloc(&S.bd, size);
                }
                if (got < 0) break; /* FCFS: the later ones wait too */
                r->gstart = got, r->gsize = size, r->state = DIT;
                nwait--;
                s = dispatch(&S, i, 0, NULL, 0);
            }
        }
        if (!events) nap();
    }
    for (int u = 0; u < units; u++) {
        int32_t z = 0;
        if (dl_comm_send(world, &z, sizeof z, 1 + u, T_STOP) != DL_OK) dl_comm_abort(1);
    }
    free(buf);
    if (s == DL_OK) {
        for (int i = 0; i < N; i++) {
            out->latency[i] = S.rq[i].finish - S.rq[i].arrive;
            out->res[i] = S.rq[i].res, out->first_dop[i] = S.rq[i].first_dop, out->last_dop[i] = S.rq[i].last_dop;
        }
        double sum = 0;
        for (int i = 0; i < N; i++) sum += lat[i];
        for (int a = 1; a < N; a++) /* insertion sort: N is a trace's length */
            for (int b = a; b > 0 && lat[b] < lat[b - 1]; b--) {
                double t = lat[b];
                lat[b] = lat[b - 1], lat[b - 1] = t;
            }
        out->nreq = N;
        out->avg = sum / N;
        out->p50 = dl_sched_percentile(lat, N, 0.5), out->p99 = dl_sched_percentile(lat, N, 0.99);
        out->makespan = dl_now() - t0;
        out->handover_avg = out->promotions ? hand_sum / out->promotions : 0, out->handover_max = hand_max;
        out->encode_avg = S.encodes ? S.encode_sum / S.encodes : 0;
    }
    free(arrive), free(lat), free(S.rq);
    dl_comm_free(ucomm);
    return s;
}

dl_status dl_ddit_run(dl_comm *world, const dl_ddit_config *c, dl_ddit_result *out) {
    const int units = dl_comm_size(world) - 1;
    if (units < 1 || units > 64 || (units & (units - 1)))
        return dl_fail(DL_ERR_INVALID, "ddit: %d units (a power of two up to 64, plus the scheduler rank)", units);
    if (c->nsizes < 1 || c->nsizes > DL_SCHED_MAX_RES || c->nsizes != c->prof.nres)
        return dl_fail(DL_ERR_INVALID, "ddit: %d sizes for a profile of %d resolutions (resolution r is size r)", c->nsizes,
                       c->prof.nres);
    if (dl_comm_rank(world) == 0) return sched_main(world, c, out);
    unit_main(world, c);
    return DL_OK;
}

void dl_ddit_result_free(dl_ddit_result *r) {
    free(r->latency), free(r->res), free(r->first_dop), free(r->last_dop), free(r->dit_last), free(r->vae);
    memset(r, 0, sizeof *r);
}
