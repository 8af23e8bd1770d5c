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
/* a stream socket connected to the Unix socket path (a model process's first rank to
 * the API process), -1 when it cannot be */
int dl_unix_connect(const char *path);
/* Blocks; DL_ERR_IO on EOF or error. *out is the caller's. */
dl_status dl_msg_recv(int fd, cJSON **out);
/* The same with a limit on the wait for each part of the frame (the API side: a model
 * process stopped half-way through a frame must not hang the server). */
dl_status dl_msg_recv_within(int fd, cJSON **out, int timeout_ms);

/* ---- job store (SQLite, WAL) ----
 * Safe to call from any thread without a lock of the caller's: writes are serialised
 * (a transaction holds the writer from dl_jobs_begin to commit or rollback), reads use
 * a second connection and never wait for a write's commit or fsync (jobs.c). */
typedef struct dl_jobstore dl_jobstore;
dl_status dl_jobs_open(dl_jobstore **js, const char *path);
void dl_jobs_close(dl_jobstore *js);
/* After a restart: jobs left in_progress go back to the queue; expired results go. */
int dl_jobs_recover(dl_jobstore *js, double ttl_s);
/* Every job records the id of the model it is for (`model`); a store from before that
 * has none. Queued jobs of a kind with no model become model's; how many. */
int dl_jobs_adopt(dl_jobstore *js, const char *kind, const char *model);
/* Queued jobs for a model not among the n served fail, saying so; how many. */
int dl_jobs_fail_unserved(dl_jobstore *js, const char *const *models, int n);
/* kind: "image" or "video" (which API lists and shows the job); model: its model's id */
dl_status dl_jobs_insert(dl_jobstore *js, const char *id, const char *kind, const char *model, const char *request_json,
                         double deadline);
/* Jobs in a status, of one model (NULL: of every model). */
int dl_jobs_count(dl_jobstore *js, const char *status, const char *model);
/* The oldest queued job of a model (id and request), or 0. */
int dl_jobs_next(dl_jobstore *js, const char *model, char *id, size_t idn, char **request_json, double *deadline);
/* durable: the commit is fsynced. The writer is the calling thread's until commit (a
 * failed commit that left the transaction open: until rollback); rollback is a no-op
 * when this thread holds no transaction (after a failed begin). Other threads' reads
 * meanwhile see the store as last committed. */
dl_status dl_jobs_begin(dl_jobstore *js, int durable);
dl_status dl_jobs_commit(dl_jobstore *js);
void dl_jobs_rollback(dl_jobstore *js);
dl_status dl_jobs_set(dl_jobstore *js, const char *id, const char *status, const char *error, const char *result);
/* The job goes from status `from` to `to` (with error and result; started or finished
 * set to now) only if it is in `from`: 1 when it was, 0 when not (or no such job), -1
 * on a store error. Two threads racing for one job (a cancel and the dispatcher, say)
 * cannot both win. */
int dl_jobs_transition(dl_jobstore *js, const char *id, const char *from, const char *to, const char *error, const char *result);
dl_status dl_jobs_progress(dl_jobstore *js, const char *id, int step, int steps, int cached);
/* A running job back in the queue (its model process died; it runs again from the
 * start, its seed making the same output): 1 when it was in_progress, 0 if not, -1 on
 * an error. FCFS keeps its place: the queue is ordered by creation. */
int dl_jobs_requeue(dl_jobstore *js, const char *id);
dl_status dl_jobs_model_seconds(dl_jobstore *js, const char *id, double secs);
/* The job as JSON (id, status, progress, kind, model, finished...), NULL when unknown. */
cJSON *dl_jobs_get(dl_jobstore *js, const char *id);
/* Up to `limit` jobs of one kind (each as dl_jobs_get has it), newest first (oldest
 * with ascending), after the job `after` (NULL: from the start); *has_more when more
 * follow. NULL on a store error. */
cJSON *dl_jobs_list(dl_jobstore *js, const char *kind, const char *after, int limit, int ascending, int *has_more);
/* The job's row goes (its result file is the caller's). */
dl_status dl_jobs_delete(dl_jobstore *js, const char *id);
/* A running job's cancel, kept across a crash of the API process (recover ends it). */
dl_status dl_jobs_request_cancel(dl_jobstore *js, const char *id);
/* Queued jobs past their deadline fail (no model process took them); how many. */
int dl_jobs_expire(dl_jobstore *js, double now);
/* Queue position of a queued job in its model's queue (1 = next), 0 otherwise. */
int dl_jobs_position(dl_jobstore *js, const char *id);


/* ---- the videos API (videos.c) ---- */
/* A form body (multipart/form-data or x-www-form-urlencoded, by the Content-Type) as
 * a JSON object of strings; a file part becomes {"filename": ...}; the fields named in
 * `numeric` (NULL-terminated) become numbers where they read as one. NULL with err. */
cJSON *dl_form_parse(const char *content_type, const char *body, size_t len, const char *const *numeric, char *err, size_t en);
/* POST /v1/videos: a body's fields into the job request (request.h's JSON with
 * width, height, frames and fps set and output mp4), with the model's step and
 * guidance defaults. 0 with err and param on bad input (a `model` that is not the
 * served one says "does not exist": a 404). */
int dl_video_request(const cJSON *body, const dl_deployment *p, int default_steps, double default_guidance, cJSON **norm,
                     char *err, size_t en, char *param, size_t pn);
/* The video object of a job (dl_jobs_get's JSON): OpenAI's fields plus frames and
 * fps; live_steps > 0: the running job's progress as the model process reports it. */
cJSON *dl_video_object(const cJSON *job, const char *model_id, int live_step, int live_steps, double ttl_s);
/* `seconds` as a video reports it: (frames - 1) / fps, "%g" */
void dl_video_seconds(int frames, double fps, char *out, size_t n);

#endif
