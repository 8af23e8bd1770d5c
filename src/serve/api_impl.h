/* The API process's state and the helpers its route files share (server.c: the
 * supervisor, the images and jobs routes, the dispatcher; videos_api.c: OpenAI's
 * videos API). Internal to src/serve. */
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

enum { MAX_WORKERS = 8 };

/* One resident model process (data parallel: several, on disjoint cores). */
typedef struct {
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

typedef struct {
    dl_deployment pr;
    const dl_model_entry *entry; /* the served model's registry entry (NULL: not one difflet knows) */
    dl_model_defaults defaults;  /* its request defaults (entry and difflet.json), when entry is set */
    const char *exe, *profile_path;
    dl_jobstore *js;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* any job changed state */
    int wake[2];       /* a byte here wakes the supervisor: a job was queued */
    int stopping, nworkers;
    worker w[MAX_WORKERS];
    double last_expire; /* the supervisor's last sweep of expired queued jobs */
    double started;     /* wall time the server started ("created" of its model) */
    uint8_t url_key[32];    /* signs the short-lived content URLs (random per server) */
    dl_tokenizer *tok;      /* counts a prompt's tokens for usage (NULL: not loaded) */
    int tok_len;            /* the text length the model reads: a count's cap */
    /* metrics */
    long requests[600];
    long dur_bucket[NBUCKETS + 1], dur_count, wait_count, steps_full, steps_cached, restarts;
    double dur_sum, wait_sum;
    char last_error[512];
} api;


typedef struct {
    char *body;
    size_t len;
    int too_big;
    double t0;
} conn;

/* the API process's one state (server.c) */
extern api dl_api;

/* replies: JSON with a status; a file streamed from its descriptor (*ok 0 when it
 * cannot be opened); OpenAI's error object {"error": {message, type, param, code}} */
enum MHD_Result dl_api_json_reply(struct MHD_Connection *c, int status, cJSON *j);
enum MHD_Result dl_api_file_reply(struct MHD_Connection *c, const char *path, const char *type, int *ok);
enum MHD_Result dl_api_error_reply(struct MHD_Connection *c, int status, const char *type, const char *param,
                                   const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* a JSON object body, NULL when it is not one (strict: no trailing bytes) */
cJSON *dl_api_parse_json_body(const char *body, size_t len);
/* "<class> makes images/videos" for a wrong-kind refusal */
void dl_api_model_kind(char *out, size_t n);
/* enqueue n jobs of a kind; 0 when the queue is full, -1 when the store failed */
int dl_api_enqueue(cJSON *req, int n, char ids[][24], const char *kind);
/* the SSE progress stream of a job (video: video objects) */
enum MHD_Result dl_api_events(struct MHD_Connection *c, const char *id, int video);
/* /v1/videos[...] (videos_api.c) */
enum MHD_Result dl_api_videos(struct MHD_Connection *c, conn *cn, const char *url, int get, int post, int del);

#endif
