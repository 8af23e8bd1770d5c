/* difflet serve internals: the SQLite job store, the framed socket protocol
 * between the API process and the model process, and the two processes' mains. */
#ifndef DIFFLET_SERVE_IMPL_H
#define DIFFLET_SERVE_IMPL_H

#include <cjson/cJSON.h>
#include <stdint.h>

#include "difflet/base.h"

/* ---- the serving profile ---- */
typedef struct {
    char model[1024], results[1024], db[1024], host[64], api_key[256];
    int port, queue_capacity, max_steps, max_prompt_bytes, nsizes, no_compile;
    int replicas;           /* data parallel: model processes, each on its own cores */
    int sizes[8][2];        /* width, height */
    double timeout_s, grace_s, result_ttl_s;
    char dtype[8], cache[256]; /* default step-caching mode */
    char parallel[128];     /* each replica's layout (tp, sp, cp; "" = one rank): its model
                               process is an mpirun job whose first rank talks to the server */
} serve_profile;

/* Defaults (difflet-tiny, 64x64, 127.0.0.1), then the JSON profile file if given. */
dl_status profile_load(serve_profile *p, const char *path);
cJSON *profile_to_json(const serve_profile *p);
dl_status profile_from_json(serve_profile *p, const cJSON *j);

/* ---- framed messages: u32 little-endian length + JSON ---- */
dl_status msg_send(int fd, const cJSON *msg);
/* Blocks; DL_ERR_IO on EOF or error. *out is the caller's. */
dl_status msg_recv(int fd, cJSON **out);
/* The same with a limit on the wait for each part of the frame (the API side: a model
 * process stopped half-way through a frame must not hang the server). */
dl_status msg_recv_within(int fd, cJSON **out, int timeout_ms);

/* ---- job store (SQLite, WAL) ---- */
typedef struct jobstore jobstore;
dl_status jobs_open(jobstore **js, const char *path);
void jobs_close(jobstore *js);
/* After a restart: jobs left in_progress go back to the queue; expired results go. */
int jobs_recover(jobstore *js, double ttl_s);
dl_status jobs_insert(jobstore *js, const char *id, const char *request_json, double deadline);
int jobs_count(jobstore *js, const char *status);
/* The oldest queued job (id and request), or 0. */
int jobs_next(jobstore *js, char *id, size_t idn, char **request_json, double *deadline);
dl_status jobs_begin(jobstore *js, int durable); /* durable: the commit is fsynced */
dl_status jobs_commit(jobstore *js);
void jobs_rollback(jobstore *js);
dl_status jobs_set(jobstore *js, const char *id, const char *status, const char *error, const char *result);
dl_status jobs_progress(jobstore *js, const char *id, int step, int steps, int cached);
dl_status jobs_model_seconds(jobstore *js, const char *id, double secs);
/* The job as JSON (id, status, progress...), NULL when unknown. */
cJSON *jobs_get(jobstore *js, const char *id);
/* Queue position of a queued job (1 = next), 0 otherwise. */
int jobs_position(jobstore *js, const char *id);

int serve_api_main(const serve_profile *p, const char *self_exe);
/* fd: the connection to the API process; or, fd < 0, the unix socket path the
 * first rank of a parallel model process connects to. */
int serve_worker_main(int fd, const char *sock_path, const serve_profile *p);

#endif
