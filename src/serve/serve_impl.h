/* difflet serve internals: the SQLite job store, the framed socket protocol
 * between the API process and the model process, and the two processes' mains. */
#ifndef DIFFLET_SERVE_IMPL_H
#define DIFFLET_SERVE_IMPL_H

#include <cjson/cJSON.h>
#include <stdint.h>

#include "difflet/base.h"
#include "difflet/serve.h"

/* ---- framed messages: u32 little-endian length + JSON ---- */
dl_status dl_msg_send(int fd, const cJSON *msg);
/* Blocks; DL_ERR_IO on EOF or error. *out is the caller's. */
dl_status dl_msg_recv(int fd, cJSON **out);
/* The same with a limit on the wait for each part of the frame (the API side: a model
 * process stopped half-way through a frame must not hang the server). */
dl_status dl_msg_recv_within(int fd, cJSON **out, int timeout_ms);

/* ---- job store (SQLite, WAL) ---- */
typedef struct dl_jobstore dl_jobstore;
dl_status dl_jobs_open(dl_jobstore **js, const char *path);
void dl_jobs_close(dl_jobstore *js);
/* After a restart: jobs left in_progress go back to the queue; expired results go. */
int dl_jobs_recover(dl_jobstore *js, double ttl_s);
dl_status dl_jobs_insert(dl_jobstore *js, const char *id, const char *request_json, double deadline);
int dl_jobs_count(dl_jobstore *js, const char *status);
/* The oldest queued job (id and request), or 0. */
int dl_jobs_next(dl_jobstore *js, char *id, size_t idn, char **request_json, double *deadline);
dl_status dl_jobs_begin(dl_jobstore *js, int durable); /* durable: the commit is fsynced */
dl_status dl_jobs_commit(dl_jobstore *js);
void dl_jobs_rollback(dl_jobstore *js);
dl_status dl_jobs_set(dl_jobstore *js, const char *id, const char *status, const char *error, const char *result);
dl_status dl_jobs_progress(dl_jobstore *js, const char *id, int step, int steps, int cached);
dl_status dl_jobs_model_seconds(dl_jobstore *js, const char *id, double secs);
/* The job as JSON (id, status, progress...), NULL when unknown. */
cJSON *dl_jobs_get(dl_jobstore *js, const char *id);
/* A running job's cancel, kept across a crash of the API process (recover ends it). */
dl_status dl_jobs_request_cancel(dl_jobstore *js, const char *id);
/* Queued jobs past their deadline fail (no model process took them); how many. */
int dl_jobs_expire(dl_jobstore *js, double now);
/* Queue position of a queued job (1 = next), 0 otherwise. */
int dl_jobs_position(dl_jobstore *js, const char *id);

#endif
