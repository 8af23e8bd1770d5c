/* OpenAI's videos API over the job store (the API process; server.c dispatches here):
 * POST /v1/videos (JSON or a form), GET /v1/videos[/ID[/content|/events]], DELETE. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "serve/api_impl.h"

/* ---- the videos API (OpenAI's /v1/videos) ------------------------------------------
 * A video is a job of kind "video": id "video_" + the job's id, the MP4 written by the
 * model process into the results folder beside the images, the same store, queue,
 * events and restart recovery. */

/* "video_<16 hex>" at s into hex; the rest of the path in *tail */
static int video_id(const char *s, char hex[17], const char **tail) {
    if (strncmp(s, "video_", 6)) return 0;
    s += 6;
    for (int i = 0; i < 16; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
    memcpy(hex, s, 16);
    hex[16] = 0;
    *tail = s + 16;
    return **tail == 0 || **tail == '/';
}

/* the video object of job hex (NULL: no such video), progress live while it runs;
 * the store read without dl_api.mu (the store locks for itself), the live progress
 * under it briefly (dl_api_live) */
static cJSON *video_get(const char *hex) {
    cJSON *j = dl_jobs_get(dl_api.js, hex);
    const char *kind = j ? cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "kind")) : NULL;
    if (!kind || strcmp(kind, "video")) {
        cJSON_Delete(j);
        return NULL;
    }
    int step = 0, steps = 0;
    dl_api_live(hex, &step, &steps);
    cJSON *v = dl_video_object(j, dl_api_job_model(j), step, steps, dl_api.srv->result_ttl_s);
    cJSON_Delete(j);
    return v;
}

static enum MHD_Result video_create(struct MHD_Connection *c, conn *cn) {
    static const char *const numeric[] = {"frames", "fps", "seed", "steps", "guidance_scale", "true_cfg_scale", NULL};
    const char *ctype = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type");
    char err[1024] = "", param[64] = "", what[400];
    /* JSON, or a form (OpenAI's SDK sends multipart/form-data); `curl -d '{...}'` labels
       JSON as urlencoded, so a urlencoded body is JSON when it reads as JSON */
    int multipart = ctype && !strncasecmp(ctype, "multipart/", 10);
    int urlenc = ctype && !strncasecmp(ctype, "application/x-www-form-urlencoded", 33);
    cJSON *body = multipart ? NULL : dl_api_parse_json_body(cn->body ? cn->body : "", cn->len);
    if (!body && (multipart || urlenc) && !(body = dl_form_parse(ctype, cn->body ? cn->body : "", cn->len, numeric, err, sizeof err)))
        return dl_api_error_reply(c, 400, "invalid_request_error", NULL, "%s", err);
    if (!body) return dl_api_error_reply(c, 400, "invalid_request_error", NULL, "the body is not valid JSON (or a form)");
    /* the model it names (a `model` that is not a string: the default, and
       dl_video_request refuses it) */
    const served *m = dl_api_route(cJSON_GetObjectItemCaseSensitive(body, "model"), 1, err, sizeof err);
    if (!m) {
        cJSON_Delete(body);
        return dl_api_error_reply(c, 404, "invalid_request_error", "model", "%s", err);
    }
    if (!m->pr.video) {
        cJSON_Delete(body);
        dl_api_model_kind(m, what, sizeof what);
        return dl_api_error_reply(c, 400, "invalid_request_error", "model", "%s: use POST /v1/images/generations", what);
    }
    cJSON *req;
    int ok = dl_video_request(body, &m->pr, m->entry ? m->defaults.steps : 50, m->entry ? m->defaults.guidance : 5.0, &req, err,
                              sizeof err, param, sizeof param);
    cJSON_Delete(body);
    if (!ok)
        return dl_api_error_reply(c, strcmp(param, "model") || !strstr(err, "does not exist") ? 400 : 404, "invalid_request_error",
                           param[0] ? param : NULL, "%s", err);
    char ids[1][24];
    int q = dl_api_enqueue(m, req, 1, ids, "video");
    cJSON_Delete(req);
    if (q < 0) return dl_api_error_reply(c, 500, "server_error", NULL, "the job store could not record the video: %s", dl_last_error());
    if (!q)
        return dl_api_error_reply(c, 429, "rate_limit_error", NULL, "the queue of `%s` is full (%d jobs); retry later", m->pr.model_id,
                                  m->pr.queue_capacity);
    cJSON *v = video_get(ids[0]);
    return v ? dl_api_json_reply(c, 200, v) : dl_api_error_reply(c, 500, "server_error", NULL, "video %s vanished from the job store", ids[0]);
}

/* GET /v1/videos?limit=&after=&order=: newest first by default */
static enum MHD_Result video_list(struct MHD_Connection *c) {
    const char *ls = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "limit");
    const char *after = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "after");
    const char *order = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "order");
    char *e = NULL, hex[17];
    const char *tail;
    long limit = ls ? strtol(ls, &e, 10) : 20;
    if (ls && (!*ls || *e || limit < 1 || limit > 100))
        return dl_api_error_reply(c, 400, "invalid_request_error", "limit", "`limit` must be an integer from 1 to 100");
    if (order && strcmp(order, "asc") && strcmp(order, "desc"))
        return dl_api_error_reply(c, 400, "invalid_request_error", "order", "`order` must be \"asc\" or \"desc\"");
    if (after && (!video_id(after, hex, &tail) || *tail))
        return dl_api_error_reply(c, 400, "invalid_request_error", "after", "`after` must be a video id (video_...)");
    int more = 0;
    cJSON *known = after ? video_get(hex) : NULL;
    if (after && !known) {
        return dl_api_error_reply(c, 400, "invalid_request_error", "after", "`after`: no video %.60s", after);
    }
    cJSON_Delete(known);
    cJSON *jobs = dl_jobs_list(dl_api.js, "video", after ? hex : NULL, (int)limit, order && !strcmp(order, "asc"), &more);
    cJSON *out = cJSON_CreateObject(), *data = cJSON_AddArrayToObject(out, "data"), *j;
    cJSON_ArrayForEach(j, jobs) {
        const char *id = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "id"));
        int step = 0, steps = 0;
        if (id) dl_api_live(id, &step, &steps);
        cJSON_AddItemToArray(data, dl_video_object(j, dl_api_job_model(j), step, steps, dl_api.srv->result_ttl_s));
    }
    if (!jobs) {
        cJSON_Delete(out);
        return dl_api_error_reply(c, 500, "server_error", NULL, "%s", dl_last_error());
    }
    cJSON_Delete(jobs);
    cJSON_AddStringToObject(out, "object", "list");
    int n = cJSON_GetArraySize(data);
    const char *first = n ? cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(data, 0), "id")) : NULL;
    const char *last = n ? cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(data, n - 1), "id")) : NULL;
    if (first) cJSON_AddStringToObject(out, "first_id", first);
    else cJSON_AddNullToObject(out, "first_id");
    if (last) cJSON_AddStringToObject(out, "last_id", last);
    else cJSON_AddNullToObject(out, "last_id");
    cJSON_AddBoolToObject(out, "has_more", more);
    return dl_api_json_reply(c, 200, out);
}

/* DELETE /v1/videos/ID: a queued video is dropped, a running one cancelled (its
 * result, should it still arrive, is removed), a finished one's MP4 removed; the
 * row goes with one durable commit. */
static enum MHD_Result video_delete(struct MHD_Connection *c, const char *hex) {
    cJSON *j = dl_jobs_get(dl_api.js, hex); /* the store without dl_api.mu: it locks for itself */
    const char *kind = j ? cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "kind")) : NULL;
    if (!kind || strcmp(kind, "video")) {
        cJSON_Delete(j);
        return dl_api_error_reply(c, 404, "not_found_error", NULL, "no video video_%s", hex);
    }
    const char *st = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "status"));
    const char *path = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "result"));
    if (st && !strcmp(st, "in_progress")) dl_api_cancel_running(hex); /* its result, should it arrive, is unlinked below or by the sweep */
    dl_status s = dl_jobs_begin(dl_api.js, 1);
    if (s == DL_OK && (s = dl_jobs_delete(dl_api.js, hex)) == DL_OK) s = dl_jobs_commit(dl_api.js);
    if (s != DL_OK) dl_jobs_rollback(dl_api.js);
    else if (path) unlink(path);
    dl_api_notify();
    cJSON_Delete(j);
    if (s != DL_OK) return dl_api_error_reply(c, 500, "server_error", NULL, "the job store could not delete it: %s", dl_last_error());
    cJSON *out = cJSON_CreateObject();
    char id[32];
    snprintf(id, sizeof id, "video_%s", hex);
    cJSON_AddStringToObject(out, "id", id);
    cJSON_AddStringToObject(out, "object", "video.deleted"); /* OpenAI's VideoDeleteResponse */
    cJSON_AddBoolToObject(out, "deleted", 1);
    return dl_api_json_reply(c, 200, out);
}

enum MHD_Result dl_api_videos(struct MHD_Connection *c, conn *cn, const char *url, int get, int post, int del) {
    if (!strcmp(url, "/v1/videos")) {
        if (post) return video_create(c, cn);
        if (get) return video_list(c);
        return dl_api_error_reply(c, 405, "invalid_request_error", NULL, "/v1/videos takes GET or POST");
    }
    char hex[17];
    const char *tail;
    if (!video_id(url + 11, hex, &tail)) return dl_api_error_reply(c, 404, "not_found_error", NULL, "no video %.100s", url + 11);
    if (del && !*tail) return video_delete(c, hex);
    if (!get) return dl_api_error_reply(c, 405, "invalid_request_error", NULL, "method not allowed on %.100s", url);
    cJSON *v = video_get(hex);
    cJSON *job = v && !strcmp(tail, "/content") ? dl_jobs_get(dl_api.js, hex) : NULL;
    if (!v) return dl_api_error_reply(c, 404, "not_found_error", NULL, "no video video_%s", hex);
    if (!*tail) return dl_api_json_reply(c, 200, v);
    if (!strcmp(tail, "/events")) {
        cJSON_Delete(v);
        return dl_api_events(c, hex, 1);
    }
    if (!strcmp(tail, "/content")) {
        const char *variant = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "variant");
        const char *st = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(job, "status"));
        const char *path = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(job, "result"));
        char status[32];
        snprintf(status, sizeof status, "%s", cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(v, "status")));
        cJSON_Delete(v);
        enum MHD_Result r = MHD_NO;
        int ok = 0;
        if (variant && strcmp(variant, "video")) {
            cJSON_Delete(job);
            return dl_api_error_reply(c, 400, "invalid_request_error", "variant",
                               "`variant` must be \"video\": this server keeps the MP4 only (no thumbnail or spritesheet)");
        }
        if (st && !strcmp(st, "completed") && path) r = dl_api_file_reply(c, path, "video/mp4", &ok);
        cJSON_Delete(job);
        return ok ? r : dl_api_error_reply(c, 404, "not_found_error", NULL, "video video_%s has no content (status %s)", hex, status);
    }
    cJSON_Delete(v);
    cJSON_Delete(job);
    return dl_api_error_reply(c, 404, "not_found_error", NULL, "no route GET %.200s", url);
}

