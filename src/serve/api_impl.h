/* The API process's state and the helpers its route files share (server.c: the
 * supervisor, the images and jobs routes, the dispatcher; videos_api.c: OpenAI's
 * videos API). The server serves one or more models, each with its own model
 * processes; a request's `model` picks one (dl_api_route). Internal to src/serve. */
#ifndef DIFFLET_SERVE_API_IMPL_H
#define DIFFLET_SERVE_API_IMPL_H

#include <microhttpd.h>
#include <pthread.h>
#include <sys/types.h>

#include <cjson/cJSON.h>

#include "difflet/registry.h"
#include "difflet/text.h"
#include "serve/serve_impl.h"

enum { MAX_BODY = 64 * 1024, NBUCKETS = 10 };

enum { MAX_WORKERS = DL_SERVE_MAX_PROCESSES };

/* One resident model process (data parallel: several per model; every process on its
 * own cores). It runs jobs of its model only. */
typedef struct {
    int model; /* dl_api.m[model] */
    int fd, ready, cancel_sent;
    pid_t pid;
    int mpi, listening; /* an mpirun job (its own session); still waiting for its first rank */
    char sock[108];     /* the unix socket that first rank connects to */
    double spawn_time;
    char inflight[40];
    char out[1200]; /* where the in-flight job's result goes */
    int cancel_wanted;  /* a client cancelled the in-flight job */
    int live_step, live_steps; /* the in-flight job's progress as the model process reports it (every step) */
    double deadline, cancel_time, next_spawn, backoff;
    double progress_written; /* per-step progress reaches SQLite at most every 0.25 s */
} worker;

/* One served model: its deployment (its id is what requests and jobs name it by). */
typedef struct {
    dl_deployment pr;
    const dl_model_entry *entry; /* its registry entry (NULL: not one difflet knows; its model process says why) */
    dl_model_defaults defaults;  /* its request defaults (entry and difflet.json), when entry is set */
    dl_tokenizer *tok;           /* counts a prompt's tokens for usage (NULL: not loaded, or a video model) */
    int tok_len;                 /* the text length the model reads: a count's cap */
    char profile_path[1200];     /* its deployment, as its model processes read it */
    int first, n;                /* its model processes: dl_api.w[first .. first + n) */
    long restarts;
    char last_error[512];        /* why its model process last failed to start */
} served;

typedef struct {
    const dl_deployment *srv;    /* the server's settings (host, port, key, results, ...): m[0].pr's */
    served m[DL_SERVE_MAX_MODELS];
    int nmodels;
    const char *exe;
    dl_jobstore *js;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* any job changed state */
    int wake[2];       /* a byte here wakes the supervisor: a job was queued */
    int stopping, nworkers;
    worker w[MAX_WORKERS];
    double last_expire; /* the supervisor's last sweep of expired queued jobs */
    double started;     /* wall time the server started ("created" of its model) */
    uint8_t url_key[32];    /* signs the short-lived content URLs (random per server) */
    /* metrics */
    long requests[600];
    long dur_bucket[NBUCKETS + 1], dur_count, wait_count, steps_full, steps_cached, restarts;
    double dur_sum, wait_sum;
} api;


typedef struct {
    char *body;
    size_t len;
    int too_big;
    double t0;
} conn;

/* the API process's one state (server.c) */
extern api dl_api;

/* ---- server.c ---- */
/* replies: JSON with a status; a file streamed from its descriptor (*ok 0 when it
 * cannot be opened); OpenAI's error object {"error": {message, type, param, code}} */
enum MHD_Result dl_api_json_reply(struct MHD_Connection *c, int status, cJSON *j);
enum MHD_Result dl_api_file_reply(struct MHD_Connection *c, const char *path, const char *type, int *ok);
enum MHD_Result dl_api_error_reply(struct MHD_Connection *c, int status, const char *type, const char *param,
                                   const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* a JSON object body, NULL when it is not one (strict: no trailing bytes) */
cJSON *dl_api_parse_json_body(const char *body, size_t len);
/* enqueue n jobs of a kind for model m; 0 when its queue is full, -1 when the store failed */
int dl_api_enqueue(const served *m, cJSON *req, int n, char ids[][24], const char *kind);
/* the SSE progress stream of a job (video: video objects) */
enum MHD_Result dl_api_events(struct MHD_Connection *c, const char *id, int video);
/* /v1/videos[...] (videos_api.c) */
enum MHD_Result dl_api_videos(struct MHD_Connection *c, conn *cn, const char *url, int get, int post, int del);

/* ---- the served models and their model processes (models.c) ---- */
/* the served model called id, or NULL */
const served *dl_api_find_model(const char *id);
/* The served model a request's `model` (v; NULL when absent) names, for a route
 * that makes videos (video 1) or images: absent or "" is the first served model that
 * makes them (else the first, which the route then refuses). NULL when v names no
 * served model, with the 404's message ("... does not exist ...") in err. */
const served *dl_api_route(const cJSON *v, int video, char *err, size_t en);
/* "`id` makes images/videos (<class>)" for a wrong-kind refusal */
void dl_api_model_kind(const served *m, char *out, size_t n);
/* the id of the model a job (dl_jobs_get's JSON) is for; a job from before the store
 * kept models: the first served model of its kind */
const char *dl_api_job_model(const cJSON *job);
/* a model process of m is ready; every served model has one; m's jobs in flight
 * (under dl_api.mu) */
int dl_api_model_ready(const served *m);
int dl_api_all_ready(void);
int dl_api_inflight(const served *m);
/* the supervisor thread: starts, feeds, times out and replaces the model processes
 * until dl_api.stopping, then ends them */
void *dl_api_supervisor(void *arg);

#endif
