/* serve's DDiT model process (a deployment with "scheduler": "ddit"): one mpirun world
 * of a scheduler rank and `units` units (ddit.h). Rank 0 talks to the API process
 * like any model process's first rank (framed JSON over the Unix socket: jobs and
 * cancels in; ready, progress, done and error out), but takes several jobs at once
 * (the API gives it 2 x units slots) and places each on an elastic rank group; the
 * group's leader writes the result where the job says. Requests are the API's typed
 * requests; step caching is off (a promoted request cannot carry its estimator).
 * Before it says ready, the world proves it works: a 2-step request of the first
 * pipeline must complete (the start-up check every model process makes). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "difflet/ddit.h"
#include "difflet/registry.h"
#include "serve/serve_impl.h"

enum { MAX_PENDING = 256 };

typedef struct {
    int fd;
    pthread_mutex_t mu;
    cJSON *in[MAX_PENDING]; /* jobs and cancels from the API, in order */
    int nin, closed;
    const dl_deployment *pr;
    char (*ids)[40]; /* request index -> job id */
    int nids, cap;
    /* the start-up check: -1 none yet; the units' load and hosts for "ready" */
    int check_req, units_ready, failed, nodes;
    double load_seconds;
    char check_out[1200];
} api_src;

static void *reader(void *arg) {
    api_src *a = arg;
    for (;;) {
        cJSON *m;
        if (dl_msg_recv(a->fd, &m) != DL_OK) break;
        pthread_mutex_lock(&a->mu);
        if (a->nin < MAX_PENDING) a->in[a->nin++] = m, m = NULL;
        pthread_mutex_unlock(&a->mu);
        if (m) { /* more than the API's slots: it never sends that many */
            DL_WARN("serve ddit: a message over %d pending dropped", MAX_PENDING);
            cJSON_Delete(m);
        }
    }
    pthread_mutex_lock(&a->mu);
    a->closed = 1;
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

static void send_obj(api_src *a, cJSON *m) {
    dl_msg_send(a->fd, m);
    cJSON_Delete(m);
}

static void send_error(api_src *a, const char *id, const char *msg, int cancelled) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "type", "error");
    cJSON_AddStringToObject(m, "id", id);
    cJSON_AddStringToObject(m, "message", msg);
    cJSON_AddBoolToObject(m, "cancelled", cancelled);
    send_obj(a, m);
}

/* the pipeline (resolution) a request runs on: size i, frame count k -> i * nframes + k */
static int res_of(const dl_deployment *pr, const cJSON *rq, int *steps) {
    const int w = (int)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(rq, "width"));
    const int h = (int)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(rq, "height"));
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(rq, "frames");
    const int frames = cJSON_IsNumber(f) && f->valuedouble >= 1 ? (int)f->valuedouble : 1;
    *steps = (int)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(rq, "steps"));
    for (int i = 0; i < pr->nsizes; i++)
        for (int k = 0; k < pr->nframes; k++)
            if (pr->sizes[i][0] == w && pr->sizes[i][1] == h && (pr->frames[k] == frames || !pr->video)) return i * pr->nframes + k;
    return -1;
}

/* the start-up check's request: the first pipeline, 2 steps, into the results folder */
static void start_check(api_src *a, dl_ddit_sched *s, double now) {
    const dl_deployment *pr = a->pr;
    dl_request rq;
    dl_request_init(&rq);
    dl_request_set_prompt(&rq, "a large red circle in the centre on a blue background", NULL);
    rq.width = pr->sizes[0][0], rq.height = pr->sizes[0][1], rq.frames = pr->video ? pr->frames[0] : 0;
    rq.steps = 2, rq.seed = 0, rq.output_format = pr->video ? DL_FMT_MP4 : DL_FMT_PNG;
    snprintf(a->check_out, sizeof a->check_out, "%.1000s/.startup-check-%d.%s", pr->results, (int)getpid(),
             pr->video ? "mp4" : "png");
    cJSON *job = cJSON_CreateObject();
    cJSON_AddStringToObject(job, "type", "job");
    cJSON_AddStringToObject(job, "id", "startup-check");
    cJSON_AddStringToObject(job, "out", a->check_out);
    cJSON_AddItemToObject(job, "request", dl_request_to_json(&rq));
    char *text = cJSON_PrintUnformatted(job);
    a->check_req = text ? dl_ddit_add(s, 0, rq.steps, now, text) : -1;
    if (a->check_req < 0) a->failed = 1;
    free(text);
    cJSON_Delete(job);
    dl_request_free(&rq);
}

static void api_poll(void *ctx, dl_ddit_sched *s, double now) {
    api_src *a = ctx;
    if (a->units_ready && a->check_req < 0 && !a->failed) start_check(a, s, now);
    cJSON *batch[MAX_PENDING];
    pthread_mutex_lock(&a->mu);
    const int n = a->nin;
    memcpy(batch, a->in, (size_t)n * sizeof *batch);
    a->nin = 0;
    pthread_mutex_unlock(&a->mu);
    for (int i = 0; i < n; i++) {
        cJSON *m = batch[i];
        const char *type = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, "type"));
        const char *id = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, "id"));
        if (type && id && !strcmp(type, "cancel")) {
            for (int k = 0; k < a->nids; k++)
                if (!strcmp(a->ids[k], id)) dl_ddit_cancel(s, k);
        } else if (type && id && !strcmp(type, "job")) {
            int steps = 0;
            const int res = res_of(a->pr, cJSON_GetObjectItemCaseSensitive(m, "request"), &steps);
            char *text = res >= 0 ? cJSON_PrintUnformatted(m) : NULL;
            if (res < 0 || steps < 1) {
                send_error(a, id, "the request's size and frame count are not served by this model process", 0);
            } else if (!text) {
                send_error(a, id, "out of memory", 0);
            } else {
                const int k = dl_ddit_add(s, res, steps, now, text);
                if (k >= a->cap) {
                    int cap = a->cap ? 2 * a->cap : 64;
                    char(*ids)[40] = realloc(a->ids, (size_t)cap * sizeof *ids);
                    if (ids) a->ids = ids, a->cap = cap;
                }
                if (k >= 0 && k < a->cap) snprintf(a->ids[k], sizeof a->ids[k], "%s", id), a->nids = k + 1;
            }
            free(text);
        }
        cJSON_Delete(m);
    }
}

static void api_step(void *ctx, int req, int step, int steps) {
    api_src *a = ctx;
    if (req == a->check_req || req >= a->nids) return;
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "type", "progress");
    cJSON_AddStringToObject(m, "id", a->ids[req]);
    cJSON_AddNumberToObject(m, "step", step);
    cJSON_AddNumberToObject(m, "steps", steps);
    send_obj(a, m);
}

static void api_done(void *ctx, int req, const dl_ddit_end *e) {
    api_src *a = ctx;
    if (req == a->check_req) { /* the start-up check: ready, or a fatal error and the world ends */
        unlink(a->check_out);
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "type", e->ok ? "ready" : "fatal");
        if (e->ok) {
            cJSON_AddNumberToObject(m, "load_seconds", a->load_seconds);
            cJSON_AddNumberToObject(m, "nodes", a->nodes);
            cJSON_AddNumberToObject(m, "pid", (double)getpid());
        } else {
            char msg[1200];
            snprintf(msg, sizeof msg, "start-up check: %s", e->error && *e->error ? e->error : "failed");
            cJSON_AddStringToObject(m, "message", msg);
            a->failed = 1;
        }
        send_obj(a, m);
        return;
    }
    if (req >= a->nids) return;
    if (!e->ok) {
        send_error(a, a->ids[req], e->error && *e->error ? e->error : "failed", e->cancelled);
        return;
    }
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "type", "done");
    cJSON_AddStringToObject(m, "id", a->ids[req]);
    cJSON_AddNumberToObject(m, "calls", e->calls);
    cJSON_AddNumberToObject(m, "cached", 0);
    cJSON_AddNumberToObject(m, "seconds", e->seconds);
    cJSON_AddNumberToObject(m, "dop", e->last_dop);
    cJSON_AddNumberToObject(m, "first_dop", e->first_dop);
    cJSON_AddNumberToObject(m, "promotions", e->promotions);
    send_obj(a, m);
}

static void api_pool(void *ctx, int busy, int waiting, long promotions) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "type", "pool");
    cJSON_AddNumberToObject(m, "busy", busy);
    cJSON_AddNumberToObject(m, "waiting", waiting);
    cJSON_AddNumberToObject(m, "promotions", (double)promotions);
    send_obj(ctx, m);
}

/* the units are loaded: the start-up check runs next (api_poll); "ready" after it */
static void api_ready(void *ctx, double load_seconds, int nodes) {
    api_src *a = ctx;
    a->load_seconds = load_seconds, a->nodes = nodes, a->units_ready = 1;
}

static int api_stop(void *ctx) {
    api_src *a = ctx;
    pthread_mutex_lock(&a->mu);
    const int c = (a->closed && a->nin == 0) || a->failed;
    pthread_mutex_unlock(&a->mu);
    return c;
}

int dl_serve_ddit_main(const char *sock_path, const dl_deployment *pr) {
    dl_comm *world;
    if (!dl_comm_launched() || dl_comm_world(&world) != DL_OK) {
        fprintf(stderr, "difflet: serve-worker: a DDiT model process runs under mpirun\n");
        return 1;
    }
    const int rank = dl_comm_rank(world);
    api_src a = {.fd = -1, .mu = PTHREAD_MUTEX_INITIALIZER, .pr = pr, .check_req = -1};
    if (rank == 0 && (a.fd = dl_unix_connect(sock_path)) < 0) {
        fprintf(stderr, "difflet: serve-worker: cannot connect to %s\n", sock_path);
        dl_comm_abort(1);
    }
    dl_ddit_config c = {.model = pr->model, .frames = 1, .steps = 1, .guidance = 1.f};
    dl_dtype_parse(pr->dtype, &c.dt, &c.quant); /* checked with the profile */
    char db[1024];
    const char *e = getenv("DIFFLET_PROFILES");
    snprintf(db, sizeof db, "%s", e && *e ? e : "");
    if (!db[0]) snprintf(db, sizeof db, "%s/profiles.db", dl_cache_dir());
    dl_status s = dl_profile_store_get(db, pr->ddit_profile, &c.prof);
    c.nsizes = pr->nsizes * pr->nframes;
    if (s == DL_OK && c.nsizes != c.prof.nres)
        s = dl_fail(DL_ERR_INVALID, "profile '%s' has %d resolutions, the deployment %d pipelines (size i, frame count k is "
                                    "resolution i x frame counts + k)", pr->ddit_profile, c.prof.nres, c.nsizes);
    for (int i = 0; s == DL_OK && i < pr->nsizes; i++)
        for (int k = 0; k < pr->nframes; k++) {
            const int r = i * pr->nframes + k;
            c.sizes[r][0] = pr->sizes[i][0], c.sizes[r][1] = pr->sizes[i][1], c.res_frames[r] = pr->frames[k];
        }
    c.sim = (dl_sim_config){.policy = DL_POLICY_DDIT, .decouple = 1, .promote = 1, .vae_dop = 1, .nodes = 1,
                            .per_node = dl_comm_size(world) - 1};
    if (!strcmp(pr->ddit_policy, "ddit-qa")) c.sim.queue_aware = 1;
    if (!strncmp(pr->ddit_policy, "sdop:", 5)) {
        c.sim.policy = DL_POLICY_SDOP, c.sim.static_dop = atoi(pr->ddit_policy + 5);
        if (dl_dop_index(c.sim.static_dop) < 0 || c.sim.static_dop > c.sim.per_node)
            s = dl_fail(DL_ERR_INVALID, "ddit_policy %s: a DoP of 1, 2, 4 or 8, at most the units", pr->ddit_policy);
    }
    if (s != DL_OK) {
        if (rank == 0) {
            cJSON *m = cJSON_CreateObject();
            cJSON_AddStringToObject(m, "type", "fatal");
            cJSON_AddStringToObject(m, "message", dl_last_error());
            send_obj(&a, m);
        }
        fprintf(stderr, "difflet: serve-worker: %s\n", dl_last_error());
        dl_comm_abort(1);
    }
    pthread_t th;
    if (rank == 0) pthread_create(&th, NULL, reader, &a);
    const dl_ddit_source src = {.ctx = &a, .poll = api_poll, .step = api_step, .done = api_done, .pool = api_pool,
                                .ready = api_ready, .stop = api_stop};
    dl_ddit_result r;
    s = dl_ddit_serve(world, &c, &src, &r);
    if (rank == 0) {
        if (s != DL_OK) fprintf(stderr, "difflet: serve-worker: %s\n", dl_last_error());
        else dl_ddit_result_free(&r);
        shutdown(a.fd, SHUT_RDWR);
        pthread_join(th, NULL);
        close(a.fd);
        for (int i = 0; i < a.nin; i++) cJSON_Delete(a.in[i]);
        free(a.ids);
    }
    dl_comm_finalize();
    return s == DL_OK && !a.failed ? 0 : 1;
}
