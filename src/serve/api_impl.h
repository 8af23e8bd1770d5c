/* The API process's state and the helpers its route files share (server.c: the
 * supervisor, the images and jobs routes, the dispatcher; videos_api.c: OpenAI's
 * videos API). The server serves one or more models, each with its own model
 * processes; a request's `model` picks one (dl_api_route). Internal to src/serve. */
#ifndef DIFFLET_SERVE_API_IMPL_H
#define DIFFLET_SERVE_API_IMPL_H

#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/types.h>

#include <cjson/cJSON.h>

#include "difflet/registry.h"
#include "difflet/text.h"
#include "serve/serve_impl.h"

enum { MAX_BODY = 64 * 1024, NBUCKETS = 10 };
#define MAX_UPLOAD ((size_t)50 << 20) /* POST /v1/images/edits: OpenAI's 50 MB */

enum { MAX_WORKERS = DL_SERVE_MAX_PROCESSES };

enum { MAX_SLOTS = 16 };

/* One job in flight on a model process (its slot; empty: inflight[0] == 0). */
typedef struct {
    char inflight[40];
    char out[1200]; /* where the in-flight job's result goes */
    int cancel_wanted;  /* a client cancelled the in-flight job */
    int cancel_sent;
    int live_step, live_steps; /* the in-flight job's progress as the model process reports it (every step) */
    double deadline, cancel_time;
    double progress_written; /* per-step progress reaches SQLite at most every 0.25 s */
} job_slot;

/* One resident model process (data parallel: several per model; every process on its
 * own cores). It runs jobs of its model only, nslots at a time (1; a process that
 * schedules its own ranks takes more). The supervisor thread (models.c) writes every
 * field but the slots' cancel_wanted; other threads read ready, pid and the slots'
 * inflight, live_step and live_steps, and set cancel_wanted, under dl_api.mu; the
 * other fields are the supervisor's alone. */
typedef struct {
    int model; /* dl_api.m[model] */
    int fd, ready;
    pid_t pid;
    int mpi, listening; /* an mpirun job (its own session); still waiting for its first rank */
    char sock[108];     /* the unix socket that first rank connects to */
    double spawn_time, next_spawn, backoff;
    int nslots;
    job_slot s[MAX_SLOTS];
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
    /* a DDiT world's pool as its scheduler rank last reported it (under dl_api.mu) */
    int pool_busy, pool_waiting, pool_nodes;
    long pool_promotions, by_dop[4]; /* promotions; finished requests by their last DiT DoP 1, 2, 4, 8 */
} served;

typedef struct {
    const dl_deployment *srv;    /* the server's settings (host, port, key, results, ...): m[0].pr's */
    served m[DL_SERVE_MAX_MODELS];
    int nmodels;
    const char *exe;
    dl_jobstore *js;   /* locks for itself: never call it holding mu (server.c's top comment) */
    pthread_mutex_t mu; /* the state lock: held briefly, never across a wait (server.c's top comment) */
    pthread_cond_t cv; /* any job changed state */
    unsigned long changes; /* under mu: one more with every broadcast of cv (dl_api_notify) */
    int wake[2];       /* a byte here wakes the supervisor: a job was queued */
    int stopping, nworkers;
    atomic_int draining;    /* SIGTERM: waiting requests and streams answer now (their jobs stay in the store) */
    worker w[MAX_WORKERS];
    double last_expire; /* the supervisor's last sweep of expired queued jobs */
    double started;     /* wall time the server started ("created" of its model) */
    uint8_t url_key[32];    /* signs the short-lived content URLs (random per server) */
    /* metrics */
    atomic_long requests[600]; /* by status; without the lock (every reply counts, /health's too) */
    long dur_bucket[NBUCKETS + 1], dur_count, wait_count, steps_full, steps_cached, restarts;
    double dur_sum, wait_sum;
} api;


typedef struct {
    char *body;
    size_t len, limit;
    int too_big;
    double t0;
} conn;

/* What an images request asks of the answer beyond the typed request: OpenAI's
 * parameters that shape the response, not the picture. */
typedef struct {
    const served *model; /* the model it asked for */
    int n, b64;
    int stream, edit; /* stream: SSE events (image_generation.* or, edit, image_edit.*) */
    char quality[8];  /* what the step count stands for ("low", "medium", "high"); "" when `steps` was given */
    char safety[260]; /* safety_identifier, else user; "" when neither */
} img_opts;

/* the API process's one state (server.c) */
extern api dl_api;

/* Seconds without news after which an event stream writes a keep-alive: 3, or a third
 * of the connection timeout where that is shorter. libmicrohttpd closes a connection
 * that sent nothing for idle_timeout_s (whole seconds: it is given the truncated
 * value), a stream waiting for its job's first event included. */
static inline double dl_api_keepalive_s(void) {
    const double t = (double)(unsigned)dl_api.srv->idle_timeout_s / 3.0;
    return t < 3.0 ? t : 3.0;
}

/* The deadline of an event stream's wait on dl_api.cv: 1 s from now, or half the
 * keep-alive interval where that is shorter, so that no two writes are more than
 * half the connection timeout apart. */
static inline void dl_api_wait_until(struct timespec *ts) {
    const double k = dl_api_keepalive_s() / 2 < 1.0 ? dl_api_keepalive_s() / 2 : 1.0;
    clock_gettime(CLOCK_REALTIME, ts);
    ts->tv_nsec += (long)(k * 1e9);
    while (ts->tv_nsec >= 1000000000) ts->tv_sec++, ts->tv_nsec -= 1000000000;
}

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

/* News for the event streams and waiting requests (a job changed state, a step was
 * done): changes++ and a broadcast of cv; _locked when the caller holds dl_api.mu. A
 * waiter reads `changes` under mu, releases it, reads the store, and waits on cv only
 * while `changes` is still what it read: no news is lost between its read and its wait. */
void dl_api_notify(void);
void dl_api_notify_locked(void);
/* The running job's progress as its model process reports it (*steps 0 when the job is
 * not running); takes dl_api.mu briefly. */
void dl_api_live(const char *id, int *step, int *steps);
/* A running job's cancel goes to its model process (the supervisor sends it); takes
 * dl_api.mu briefly. */
void dl_api_cancel_running(const char *id);

/* OpenAI's error object {"error": {message, type, param (null when NULL), code}} */
cJSON *dl_api_error_object(const char *type, const char *param, const char *code, const char *msg);
/* one more reply with this status (metrics; an atomic, no lock) */
void dl_api_count_reply(int status);

/* ---- listen.c: connections are accepted, and each request checked, before
 * libmicrohttpd sees them (every error the server sends is the JSON error object) ---- */
/* libmicrohttpd's memory per connection (MHD_OPTION_CONNECTION_MEMORY_LIMIT): any
 * request head a listener passes fits in it */
enum { DL_LISTEN_MHD_POOL = 128 * 1024 };
typedef struct dl_listener dl_listener;
/* A listener with its limits (connections in all and per client address; the time a
 * request has to arrive); NULL without memory. Its counts work before it starts: its
 * daemon reports to them through dl_listener_notify. */
dl_listener *dl_listener_new(int max_conns, int per_ip, double timeout_s);
/* MHD_OPTION_NOTIFY_CONNECTION's callback, the listener as its cls */
void dl_listener_notify(void *cls, struct MHD_Connection *c, void **socket_context, enum MHD_ConnectionNotificationCode toe);
/* Listen on addr (port 0: any free one, then dl_listener_port says which) and hand
 * each well-formed request to d (started with MHD_USE_NO_LISTEN_SOCKET and
 * MHD_USE_ITC); 0 when the address cannot be had. */
int dl_listener_start(dl_listener *l, struct MHD_Daemon *d, const struct sockaddr_in *addr);
int dl_listener_port(const dl_listener *l);
/* No more connections: its thread ends, and connections not yet handed over close.
 * Before MHD_stop_daemon; dl_listener_free (NULL: nothing) after it. */
void dl_listener_stop(dl_listener *l);
void dl_listener_free(dl_listener *l);

/* the images routes (server.c): a parsed request body validated as images.generate
 * takes it (consumes j; *norm the typed request as JSON), and the answer for a
 * validated request (consumes req): enqueued, waited for, OpenAI's ImagesResponse or
 * a stream; the answer's fields beside the pictures */
int dl_api_validate_images(cJSON *j, cJSON **norm, img_opts *o, char *err, size_t en, char *param, size_t pn);
enum MHD_Result dl_api_images_answer(struct MHD_Connection *c, cJSON *req, const img_opts *o);
void dl_api_answer_fields(cJSON *out, const cJSON *req, const img_opts *o);
/* ---- edits_api.c: POST /v1/images/edits (multipart) ---- */
enum MHD_Result dl_api_edits(struct MHD_Connection *c, const char *body, size_t len);
/* ---- stream.c: stream: true answers and the previews they carry ---- */
enum MHD_Result dl_api_images_stream(struct MHD_Connection *c, const char *id, cJSON *req, const img_opts *o);
/* a model process's preview of job id (b64 of the encoded picture; taken over) */
void dl_api_partial_put(const char *id, int index, char *b64);

/* ---- page.c ---- */
/* the web page served at GET / (a NUL-terminated HTML document) */
extern const char dl_serve_page[];

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
