/* DDiT on real ranks (ddit.h): rank 0 schedules requests (a trace, or a source such
 * as serve's model process) onto the units' elastic groups; the units run the
 * pipelines. Messages (world communicator, small fixed structs; latents as a float
 * array and a job as text after their header):
 *   0 -> unit   RUN {request, run, level, size, leader, resume step, n latents, job bytes}
 *               [+ LAT] [+ JOB, the leader's request as JSON]
 *   0 -> leader PROMOTE {request}: stop at the next step boundary
 *   0 -> leader CANCEL {request}: stop, the request ends cancelled
 *   leader -> 0 STEP {request, step} after every step (step = steps: the DiT is done)
 *   leader -> 0 PREEMPTED {request, steps done, n} + LAT
 *   leader -> 0 DONE {request, ok, cancelled, seconds, error bytes} [+ ERR text]
 *   0 -> unit   STOP
 * A waiting rank polls with dl_comm_iprobe and sleeps between polls (100 us after an
 * event, up to 0.8 ms while nothing happens), so idle units and the scheduler cost next
 * to no core. Rank 0's policy is the simulator's (sim.c): at
 * each pass, the paper's order (hungry requests promoted first, longest starved,
 * growing in place or moving; then the waiting ones, FCFS, each up to its B) or the
 * queue-aware one (waiting first, promotions only when nobody waits). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "difflet/ddit.h"
#include "difflet/io.h"
#include "difflet/request.h"
#include "difflet/registry.h"

enum { T_RUN = 4101, T_LAT, T_PROMOTE, T_STEP, T_PREEMPTED, T_DONE, T_STOP, T_JOB, T_CANCEL, T_ERR };
enum { MAX_LEVELS = 7 }; /* groups of 1 .. 64 units */

typedef struct {
    int32_t req, run, level, size, leader, resume_step;
    int64_t nlat, job_bytes;
} run_msg;
typedef struct {
    int32_t req, step, steps;
} step_msg;
typedef struct {
    int32_t req, done;
    int64_t nlat;
} pre_msg;
typedef struct {
    int32_t req, ok, cancelled, err_bytes, calls;
    double encode_s, denoise_s, decode_s; /* the last run's */
} done_msg;

/* An idle poll's sleep: 100 us after something happened, doubling while nothing does,
 * up to 0.8 ms (so an idle rank costs next to no core: on a machine where the units
 * have all the cores, a waiting scheduler rank polling every 100 us took CPU from them);
 * *idle counts the empty polls since the last event. */
static void nap(int *idle) {
    const int k = *idle < 3 ? *idle : 3;
    usleep(100u << k);
    (*idle)++;
}

static int log2i(int v) {
    int l = 0;
    while ((1 << l) < v) l++;
    return l;
}

/* The units' nodes, from every rank's host name (collective over the world): units on
 * one host are one node; the nodes must hold consecutive units, as many each, a power
 * of two (mpirun's by-slot mapping of a host file with the scheduler first). A group
 * never spans nodes (the buddy allocator's per-node blocks). */
static dl_status topology(dl_comm *world, int *nodes, int *per_node) {
    const int size = dl_comm_size(world), units = size - 1;
    char me[64] = {0}, *all = malloc((size_t)size * sizeof me);
    if (!all) return dl_fail(DL_ERR_NOMEM, "out of memory");
    gethostname(me, sizeof me - 1);
    dl_status s = dl_comm_allgather(world, me, sizeof me, all);
    int n = 1, run = 1, per = 0;
    for (int u = 1; s == DL_OK && u < units; u++) {
        const char *prev = all + (size_t)u * sizeof me, *cur = all + (size_t)(u + 1) * sizeof me;
        if (!strcmp(prev, cur)) {
            run++;
            continue;
        }
        for (int k = 0; k < u; k++) /* a host seen before: its units are not consecutive */
            if (!strcmp(all + (size_t)(k + 1) * sizeof me, cur))
                s = dl_fail(DL_ERR_INVALID, "ddit: host %s's units are not consecutive", cur);
        if (per && run != per) s = dl_fail(DL_ERR_INVALID, "ddit: the nodes hold %d and %d units (as many each)", per, run);
        per = run, run = 1, n++;
    }
    if (per && run != per) s = dl_fail(DL_ERR_INVALID, "ddit: the nodes hold %d and %d units (as many each)", per, run);
    per = run;
    if (s == DL_OK && (per & (per - 1))) s = dl_fail(DL_ERR_INVALID, "ddit: %d units per node (a power of two)", per);
    free(all);
    *nodes = n, *per_node = per;
    return s;
}

/* ---- a unit ------------------------------------------------------------------------ */

typedef struct {
    dl_comm *world;
    int req;
    atomic_int flag, cancel;
    int done;
    float *lat;
    int64_t n;
} lead_ctx;

/* promotions and cancels for the request this unit leads (older ones, for requests it
 * no longer leads, are dropped) */
static void lead_messages(lead_ctx *c) {
    int tag;
    while (dl_comm_iprobe(c->world, 0, T_PROMOTE, NULL, &tag, NULL) == 1 ||
           dl_comm_iprobe(c->world, 0, T_CANCEL, NULL, &tag, NULL) == 1) {
        step_msg p;
        if (dl_comm_recv(c->world, &p, sizeof p, 0, tag) != DL_OK) dl_comm_abort(1);
        if (p.req == c->req) atomic_store(tag == T_PROMOTE ? &c->flag : &c->cancel, 1);
    }
}

/* after each step: tell rank 0, and take a promotion or a cancel if one came */
static void lead_step(void *ctx, int step, int steps, double elapsed) {
    lead_ctx *c = ctx;
    (void)elapsed;
    step_msg m = {c->req, step, steps};
    if (dl_comm_send(c->world, &m, sizeof m, 0, T_STEP) != DL_OK) dl_comm_abort(1);
    lead_messages(c);
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

static int unit_main(dl_comm *world, const dl_ddit_config *c, int per_node) {
    const int levels = log2i(per_node) + 1; /* groups never span nodes */
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
            dl_gen_shape sh = {.width = c->sizes[s][0], .height = c->sizes[s][1],
                               .frames = c->res_frames[s] > 0 ? c->res_frames[s] : c->frames, .dt = c->dt, .quant = c->quant,
                               .par = place, .cache = DL_CACHE_RECOMPILE_ON_MISMATCH};
            if (dl_pipeline_load(&pipes[l][s], c->model, &sh) != DL_OK) unit_fail(u, "load");
        }
    }
    dl_comm_barrier(world); /* every unit loaded: rank 0 starts the clock */
    int idle = 0;
    for (;;) {
        int tag;
        int got = dl_comm_iprobe(world, 0, -1, NULL, &tag, NULL);
        if (got < 0) unit_fail(u, "probe");
        if (!got) {
            nap(&idle);
            continue;
        }
        idle = 0;
        if (tag == T_STOP) {
            int32_t z;
            dl_comm_recv(world, &z, sizeof z, 0, T_STOP);
            break;
        }
        if (tag == T_PROMOTE || tag == T_CANCEL) { /* for a request this unit no longer leads */
            step_msg p;
            dl_comm_recv(world, &p, sizeof p, 0, tag);
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
        char *jt = NULL;
        if (m.nlat > 0) {
            if (!(resume = malloc((size_t)m.nlat * sizeof *resume)) ||
                dl_comm_recv(world, resume, (size_t)m.nlat * sizeof *resume, 0, T_LAT) != DL_OK)
                unit_fail(u, "resume latents");
        }
        if (m.job_bytes > 0) {
            if (!(jt = calloc(1, (size_t)m.job_bytes + 1)) || dl_comm_recv(world, jt, (size_t)m.job_bytes, 0, T_JOB) != DL_OK)
                unit_fail(u, "a request");
        }
        lead_ctx lc = {.world = world, .req = m.req};
        dl_gen_request r = {.prompt = c->prompt, .steps = c->steps, .guidance = c->guidance, .true_cfg = 1.f,
                            .seed = (uint64_t)m.req};
        /* a served request: as the API process validated it, its output to its path */
        cJSON *job = jt ? cJSON_Parse(jt) : NULL;
        const char *out = job ? cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(job, "out")) : NULL;
        dl_request rq = {0};
        char param[64];
        dl_status s = DL_OK;
        if (jt && (!job || !out))
            s = dl_fail(DL_ERR_INVALID, "ddit: a request without its output path");
        else if (job && (s = dl_request_from_json(cJSON_GetObjectItemCaseSensitive(job, "request"), &dl_request_engine_limits, &rq,
                                                   param, sizeof param)) == DL_OK)
            dl_gen_request_from(&r, &rq);
        r.resume_step = m.resume_step, r.resume_latents = resume, r.resume_numel = m.nlat;
        r.preempt = &lc.flag, r.cancel = &lc.cancel, r.on_step = lead_step, r.on_preempt = lead_take, r.ctx = &lc;
        lead_messages(&lc); /* a cancel that came before the start */
        dl_media media = {0};
        dl_gen_timing tm = {0};
        char err[1024] = "";
        if (s == DL_OK) {
            s = dl_pipeline_generate(p, &r, &media, &tm);
        } else { /* refused: it still ends on the group's other units */
            snprintf(err, sizeof err, "%s", dl_last_error());
            dl_pipeline_abandon(p);
        }
        free(resume), free(jt);
        if (s == DL_ERR_PREEMPTED) {
            pre_msg pm = {m.req, lc.done, lc.n};
            if (dl_comm_send(world, &pm, sizeof pm, 0, T_PREEMPTED) != DL_OK ||
                dl_comm_send(world, lc.lat, (size_t)lc.n * sizeof *lc.lat, 0, T_LAT) != DL_OK)
                unit_fail(u, "handing over a preempted request");
            free(lc.lat);
            continue;
        }
        if (s == DL_OK && out) s = dl_media_write(out, &media, rq.output_compression);
        if (s == DL_OK && !out && c->out_dir) {
            char path[4200];
            snprintf(path, sizeof path, "%s/%d.rgb", c->out_dir, m.req);
            s = dl_file_write_atomic(path, media.rgb, (size_t)media.width * media.height * 3 * media.frames);
        }
        dl_media_free(&media);
        dl_request_free(&rq);
        cJSON_Delete(job);
        if (s != DL_OK && !err[0]) snprintf(err, sizeof err, "%s", dl_last_error());
        if (s != DL_OK && s != DL_ERR_CANCELLED) fprintf(stderr, "difflet ddit: request %d: %s\n", m.req, err);
        done_msg dm = {m.req, s == DL_OK, s == DL_ERR_CANCELLED, (int32_t)strlen(err), tm.denoiser_calls, tm.encode_s,
                       tm.denoise_s, tm.decode_s};
        if (dl_comm_send(world, &dm, sizeof dm, 0, T_DONE) != DL_OK ||
            (dm.err_bytes > 0 && dl_comm_send(world, err, (size_t)dm.err_bytes, 0, T_ERR) != DL_OK))
            unit_fail(u, "reporting");
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
    int res, state, step, steps, B, gstart, gsize, pend_start, pend_size, pend_moved, last_step, run, first_dop, last_dop;
    int cancel;  /* a client gave up: sent to its leader */
    int promotions;
    char *job;   /* the leader's request (NULL: the config's prompt) */
    double arrive, finish, starv, dit_s, vae_s;
} rreq;

struct dl_ddit_sched {
    dl_comm *world;
    const dl_ddit_config *c;
    const dl_ddit_source *src;
    dl_buddy bd;
    rreq *rq;
    int n, cap, nwait, new_dev, running, per_node;
    double encode_sum;
    int encodes;
    dl_status s;
};

static double dit_step(const dl_profile *p, int res, int dop) {
    int i = dl_dop_index(dop);
    while (i > 0 && !(p->dit[res][i] > 0)) i--;
    return p->dit[res][i] / p->steps;
}

int dl_ddit_add(dl_ddit_sched *S, int res, int steps, double arrive, const char *job) {
    if (S->n == S->cap) {
        int cap = S->cap ? 2 * S->cap : 64;
        rreq *q = realloc(S->rq, (size_t)cap * sizeof *q);
        if (!q) {
            S->s = dl_fail(DL_ERR_NOMEM, "out of memory");
            return -1;
        }
        S->rq = q, S->cap = cap;
    }
    rreq *r = &S->rq[S->n];
    *r = (rreq){.res = res, .steps = steps, .arrive = arrive, .B = dl_profile_best_dop(&S->c->prof, res), .gstart = -1,
                .pend_start = -1};
    if (r->B > S->per_node) r->B = S->per_node; /* a group never spans nodes */
    if (job && !(r->job = strdup(job))) S->s = dl_fail(DL_ERR_NOMEM, "out of memory");
    S->nwait++;
    return S->n++;
}

void dl_ddit_cancel(dl_ddit_sched *S, int i) {
    if (i < 0 || i >= S->n) return;
    rreq *r = &S->rq[i];
    if (r->state == WAITING) { /* never started: ends here */
        r->state = OVER, S->nwait--;
        const dl_ddit_end e = {.cancelled = 1, .error = "cancelled before it started"};
        if (S->src->done) S->src->done(S->src->ctx, i, &e);
    } else if (r->state == DIT && !r->cancel) { /* its leader stops at the next step boundary */
        step_msg m = {i, 0, 0};
        r->cancel = 1;
        if (S->s == DL_OK) S->s = dl_comm_send(S->world, &m, sizeof m, 1 + r->gstart, T_CANCEL);
    }
}

/* the request's group (gstart, gsize) runs it from step `from` (latents: the resume) */
static dl_status dispatch(dl_ddit_sched *S, int i, int from, const float *lat, int64_t n) {
    rreq *r = &S->rq[i];
    r->run++;
    if (r->first_dop == 0) r->first_dop = r->gsize;
    r->last_dop = r->gsize;
    const int64_t jb = r->job ? (int64_t)strlen(r->job) : 0;
    dl_status s = DL_OK;
    for (int k = r->gsize - 1; k >= 0 && s == DL_OK; k--) { /* the members first: the leader's steps find them */
        const int lead = k == 0;
        run_msg m = {i, r->run, log2i(r->gsize), r->res, lead, from, lead && from > 0 ? n : 0, lead ? jb : 0};
        const int to = 1 + r->gstart + k;
        s = dl_comm_send(S->world, &m, sizeof m, to, T_RUN);
        if (s == DL_OK && m.nlat > 0) s = dl_comm_send(S->world, lat, (size_t)n * sizeof *lat, to, T_LAT);
        if (s == DL_OK && m.job_bytes > 0) s = dl_comm_send(S->world, r->job, (size_t)jb, to, T_JOB);
    }
    if (s == DL_OK && r->cancel) { /* cancelled while it moved: the new leader hears it too */
        step_msg m = {i, 0, 0};
        s = dl_comm_send(S->world, &m, sizeof m, 1 + r->gstart, T_CANCEL);
    }
    return s;
}

/* a reserved promotion returned: the whole new group when it was a move, else the
 * units it added to the request's own */
static void drop_promotion(dl_ddit_sched *S, rreq *r) {
    if (r->pend_moved) dl_buddy_free(&S->bd, r->pend_start, r->pend_size);
    else
        for (int d = r->pend_start; d < r->pend_start + r->pend_size; d++)
            if (d < r->gstart || d >= r->gstart + r->gsize) dl_buddy_free(&S->bd, d, 1);
    r->pend_size = 0;
}

/* the units' messages that are waiting; 1 when there were any */
static int take_messages(dl_ddit_sched *S, double t0, float **buf, int64_t *bufn, double *hand_sum, double *hand_max,
                         dl_ddit_result *out) {
    const int ddit = S->c->sim.policy == DL_POLICY_DDIT;
    const int decouple = (ddit && S->c->sim.decouple) || (S->c->sim.policy == DL_POLICY_SDOP && S->c->sim.static_decouple);
    int src, tag, any = 0;
    size_t nb;
    while (S->s == DL_OK && dl_comm_iprobe(S->world, -1, -1, &src, &tag, &nb) == 1) {
        any = 1;
        if (tag == T_STEP) {
            step_msg m;
            if ((S->s = dl_comm_recv(S->world, &m, sizeof m, src, T_STEP))) break;
            rreq *r = &S->rq[m.req];
            r->step = m.step, r->steps = m.steps;
            if (S->src->step) S->src->step(S->src->ctx, m.req, m.step, m.steps);
            if (m.step < m.steps) continue;
            if (r->pend_size) drop_promotion(S, r), S->new_dev = 1; /* it never took effect */
            if (decouple && r->gsize > 1) { /* the others go back now; the leader decodes */
                for (int sz = 1; sz < r->gsize; sz *= 2) dl_buddy_free(&S->bd, r->gstart + sz, sz);
                r->gsize = 1, S->new_dev = 1;
            }
            r->state = VAE;
        } else if (tag == T_PREEMPTED) {
            pre_msg m;
            if ((S->s = dl_comm_recv(S->world, &m, sizeof m, src, T_PREEMPTED))) break;
            const double th = dl_now();
            if (m.nlat > *bufn) {
                free(*buf);
                if (!(*buf = malloc((size_t)m.nlat * sizeof **buf))) {
                    S->s = dl_fail(DL_ERR_NOMEM, "out of memory");
                    break;
                }
                *bufn = m.nlat;
            }
            if ((S->s = dl_comm_recv(S->world, *buf, (size_t)m.nlat * sizeof **buf, src, T_LAT))) break;
            rreq *r = &S->rq[m.req];
            if (r->pend_moved) dl_buddy_free(&S->bd, r->gstart, r->gsize);
            r->gstart = r->pend_start, r->gsize = r->pend_size, r->pend_size = 0;
            r->step = m.done;
            r->promotions++, out->promotions++;
            S->s = dispatch(S, m.req, m.done, *buf, m.nlat);
            const double h = dl_now() - th;
            *hand_sum += h, *hand_max = fmax(*hand_max, h);
        } else if (tag == T_DONE) {
            done_msg m;
            char err[1100] = "";
            if ((S->s = dl_comm_recv(S->world, &m, sizeof m, src, T_DONE))) break;
            if (m.err_bytes > 0 && (S->s = dl_comm_recv(S->world, err, (size_t)m.err_bytes < sizeof err ? (size_t)m.err_bytes
                                                                                                          : sizeof err - 1,
                                                         src, T_ERR)))
                break;
            rreq *r = &S->rq[m.req];
            dl_buddy_free(&S->bd, r->gstart, r->gsize);
            if (r->pend_size) drop_promotion(S, r); /* cancelled with a promotion reserved */
            r->state = OVER, r->finish = dl_now() - t0;
            r->dit_s = m.denoise_s, r->vae_s = m.decode_s;
            S->running--, S->new_dev = 1;
            out->completed += m.ok, out->failed += !m.ok && !m.cancelled;
            S->encode_sum += m.encode_s, S->encodes++;
            const dl_ddit_end e = {m.ok, m.cancelled, err, m.encode_s + m.denoise_s + m.decode_s, m.calls, r->first_dop,
                                   r->last_dop, r->promotions};
            if (S->src->done) S->src->done(S->src->ctx, m.req, &e);
        } else {
            S->s = dl_fail(DL_ERR_INVALID, "ddit scheduler: unexpected message tag %d from rank %d", tag, src);
        }
    }
    return any;
}

/* one scheduling pass: the simulator's order (sim.c) */
static void schedule(dl_ddit_sched *S) {
    const dl_sim_config *sc = &S->c->sim;
    const dl_profile *p = &S->c->prof;
    const int ddit = sc->policy == DL_POLICY_DDIT;
    for (int pass = 0; pass < 2 && S->s == DL_OK; pass++) {
        if ((pass == 0) != (sc->queue_aware != 0)) { /* promotions */
            if (sc->queue_aware && S->nwait > 0) continue;
            if (!(ddit && sc->promote && S->new_dev)) continue;
            int hungry[64], nh = 0;
            for (int i = 0; i < S->n; i++) {
                rreq *r = &S->rq[i];
                if (r->state != DIT || r->cancel || r->pend_size || r->gsize >= r->B || r->step >= r->steps || nh == 64) continue;
                r->starv += (r->step - r->last_step) * (dit_step(p, r->res, r->gsize) - dit_step(p, r->res, r->B));
                r->last_step = r->step;
                hungry[nh++] = i;
            }
            for (int a = 1; a < nh; a++)
                for (int b = a; b > 0 && S->rq[hungry[b]].starv > S->rq[hungry[b - 1]].starv; b--) {
                    int t = hungry[b];
                    hungry[b] = hungry[b - 1], hungry[b - 1] = t;
                }
            for (int k = 0; k < nh && S->s == DL_OK; k++) {
                rreq *r = &S->rq[hungry[k]];
                for (int target = r->B; target > r->gsize; target /= 2) {
                    int moved = 0, g = dl_buddy_grow(&S->bd, r->gstart, r->gsize, target);
                    if (g < 0) g = dl_buddy_alloc(&S->bd, target), moved = 1;
                    if (g < 0) continue;
                    r->pend_start = g, r->pend_size = target, r->pend_moved = moved;
                    step_msg pm = {hungry[k], 0, 0};
                    S->s = dl_comm_send(S->world, &pm, sizeof pm, 1 + r->gstart, T_PROMOTE);
                    break;
                }
            }
            S->new_dev = 0;
            continue;
        }
        /* waiting requests, FCFS */
        for (int i = 0; i < S->n && S->nwait > 0 && S->s == DL_OK; i++) {
            rreq *r = &S->rq[i];
            if (r->state != WAITING) continue;
            int got = -1, size = 0;
            if (ddit) {
                int cap = r->B;
                if (sc->queue_aware)
                    while (cap > 1 && cap * S->nwait > dl_buddy_free_count(&S->bd)) cap /= 2;
                for (size = cap; size >= 1; size /= 2)
                    if ((got = dl_buddy_alloc(&S->bd, size)) >= 0) break;
            } else {
                size = sc->static_dop;
                got = dl_buddy_alloc(&S->bd, size);
            }
            if (got < 0) break; /* FCFS: the later ones wait too */
            r->gstart = got, r->gsize = size, r->state = DIT;
            S->nwait--, S->running++;
            S->s = dispatch(S, i, 0, NULL, 0);
        }
    }
}

static dl_status sched_main(dl_comm *world, const dl_ddit_config *c, const dl_ddit_source *src, dl_ddit_result *out, int nodes,
                            int per_node) {
    const int units = dl_comm_size(world) - 1;
    dl_ddit_sched S = {.world = world, .c = c, .src = src, .per_node = per_node};
    dl_comm *ucomm = NULL;
    memset(out, 0, sizeof *out);
    S.s = dl_comm_split(world, 0, 0, &ucomm); /* the units' split: rank 0 takes part, alone */
    if (S.s == DL_OK) S.s = dl_buddy_init(&S.bd, nodes, per_node);
    out->nodes = nodes, out->per_node = per_node;
    if (S.s != DL_OK) {
        fprintf(stderr, "difflet ddit: scheduler: %s\n", dl_last_error());
        dl_comm_abort(1);
    }
    const double tl = dl_now();
    dl_comm_barrier(world); /* the units have loaded */
    const double t0 = dl_now();
    if (src->ready) src->ready(src->ctx, t0 - tl, nodes);
    float *buf = NULL;
    int64_t bufn = 0;
    double hand_sum = 0, hand_max = 0;
    int last_busy = -1, last_wait = -1;
    long last_promo = -1;
    int idle = 0;
    while (S.s == DL_OK) {
        const int before = S.n;
        src->poll(src->ctx, &S, dl_now() - t0);
        const int any = take_messages(&S, t0, &buf, &bufn, &hand_sum, &hand_max, out);
        if (S.s != DL_OK) break;
        schedule(&S);
        const int busy = units - dl_buddy_free_count(&S.bd);
        if (src->pool && (busy != last_busy || S.nwait != last_wait || out->promotions != last_promo)) {
            last_busy = busy, last_wait = S.nwait, last_promo = out->promotions;
            src->pool(src->ctx, busy, S.nwait, out->promotions);
        }
        if (!S.running && !S.nwait && src->stop(src->ctx)) break;
        if (!any && S.n == before) nap(&idle);
        else idle = 0;
    }
    for (int u = 0; u < units; u++) { /* even after a failure: the units end */
        int32_t z = 0;
        if (dl_comm_send(world, &z, sizeof z, 1 + u, T_STOP) != DL_OK) dl_comm_abort(1);
    }
    free(buf);
    const int N = S.n;
    out->nreq = N;
    out->latency = calloc((size_t)N + 1, sizeof(double)), out->res = calloc((size_t)N + 1, sizeof(int));
    out->first_dop = calloc((size_t)N + 1, sizeof(int)), out->last_dop = calloc((size_t)N + 1, sizeof(int));
    out->dit_last = calloc((size_t)N + 1, sizeof(double)), out->vae = calloc((size_t)N + 1, sizeof(double));
    double *lat = calloc((size_t)N + 1, sizeof *lat);
    if (S.s == DL_OK && (!out->latency || !out->res || !out->first_dop || !out->last_dop || !out->dit_last || !out->vae || !lat))
        S.s = dl_fail(DL_ERR_NOMEM, "out of memory");
    if (S.s == DL_OK) {
        double sum = 0;
        for (int i = 0; i < N; i++) {
            const rreq *r = &S.rq[i];
            out->latency[i] = lat[i] = r->finish - r->arrive, sum += lat[i];
            out->res[i] = r->res, out->first_dop[i] = r->first_dop, out->last_dop[i] = r->last_dop;
            out->dit_last[i] = r->dit_s, out->vae[i] = r->vae_s;
        }
        for (int a = 1; a < N; a++) /* insertion sort: N is a trace's length */
            for (int b = a; b > 0 && lat[b] < lat[b - 1]; b--) {
                double t = lat[b];
                lat[b] = lat[b - 1], lat[b - 1] = t;
            }
        out->avg = N ? sum / N : 0;
        out->p50 = dl_sched_percentile(lat, N, 0.5), out->p99 = dl_sched_percentile(lat, N, 0.99);
        out->makespan = dl_now() - t0;
        out->handover_avg = out->promotions ? hand_sum / out->promotions : 0, out->handover_max = hand_max;
        out->encode_avg = S.encodes ? S.encode_sum / S.encodes : 0;
    }
    free(lat);
    for (int i = 0; i < N; i++) free(S.rq[i].job);
    free(S.rq);
    dl_comm_free(ucomm);
    return S.s;
}

/* ---- the trace source -------------------------------------------------------------- */

typedef struct {
    const dl_ddit_config *c;
    dl_sim_trace tr;
    double next_t;
    int next_res, added, ended;
} trace_src;

static void trace_poll(void *ctx, dl_ddit_sched *S, double now) {
    trace_src *t = ctx;
    while (t->added < t->c->sim.nreq && t->next_t <= now) {
        dl_ddit_add(S, t->next_res, t->c->steps, t->next_t, NULL);
        if (++t->added < t->c->sim.nreq) dl_sim_trace_next(&t->tr, &t->c->prof, &t->c->sim, &t->next_t, &t->next_res);
    }
}

static void trace_done(void *ctx, int req, const dl_ddit_end *e) {
    (void)req, (void)e;
    ((trace_src *)ctx)->ended++;
}

static int trace_stop(void *ctx) {
    const trace_src *t = ctx;
    return t->added == t->c->sim.nreq;
}

static dl_status check(dl_comm *world, const dl_ddit_config *c) {
    const int units = dl_comm_size(world) - 1;
    if (units < 1 || units > 64 || (units & (units - 1)))
        return dl_fail(DL_ERR_INVALID, "ddit: %d units (a power of two up to 64, plus the scheduler rank)", units);
    if (c->nsizes < 1 || c->nsizes > DL_SCHED_MAX_RES || c->nsizes != c->prof.nres)
        return dl_fail(DL_ERR_INVALID, "ddit: %d sizes for a profile of %d resolutions (resolution r is size r)", c->nsizes,
                       c->prof.nres);
    return DL_OK;
}

dl_status dl_ddit_serve(dl_comm *world, const dl_ddit_config *c, const dl_ddit_source *src, dl_ddit_result *out) {
    dl_status s = check(world, c);
    int nodes = 1, per_node = dl_comm_size(world) - 1;
    if (s == DL_OK) s = topology(world, &nodes, &per_node);
    if (s != DL_OK) return s;
    if (dl_comm_rank(world) == 0) return sched_main(world, c, src, out, nodes, per_node);
    unit_main(world, c, per_node);
    return DL_OK;
}

dl_status dl_ddit_run(dl_comm *world, const dl_ddit_config *c, dl_ddit_result *out) {
    trace_src t = {.c = c};
    dl_sim_trace_init(&t.tr, &c->sim);
    if (c->sim.nreq > 0) dl_sim_trace_next(&t.tr, &c->prof, &c->sim, &t.next_t, &t.next_res);
    const dl_ddit_source src = {.ctx = &t, .poll = trace_poll, .done = trace_done, .stop = trace_stop};
    return dl_ddit_serve(world, c, &src, out);
}

void dl_ddit_result_free(dl_ddit_result *r) {
    free(r->latency), free(r->res), free(r->first_dop), free(r->last_dop), free(r->dit_last), free(r->vae);
    memset(r, 0, sizeof *r);
}
