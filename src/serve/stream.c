/* `stream: true` answers of the images routes, as OpenAI streams them: Server-Sent
 * Events `image_generation.partial_image` (or `image_edit.partial_image` for edits)
 * for each preview the model process sends (partial_images, 0..3), then
 * `image_generation.completed` with the picture and usage; a job that fails, is
 * cancelled or times out ends the stream with an `error` event carrying OpenAI's
 * error object (the SDK raises it). Each event's SSE `id` is the job's id (it can be
 * cancelled by it: POST /v1/jobs/ID/cancel). A comment line keeps an idle stream
 * alive every 15 s.
 *
 * Previews travel from the model process inside its message (base64 of the picture
 * encoded as the result will be) and wait here, in a small table keyed by job, for
 * the job's stream to take them; the table keeps the previews of the last few jobs
 * and drops the oldest. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve/api_impl.h"

enum { PSLOTS = 8, PMAX = 4 };
static struct {
    char id[24];
    char *b64[PMAX];
    unsigned long age;
} g_part[PSLOTS];
static unsigned long g_age;
static pthread_mutex_t g_pmu = PTHREAD_MUTEX_INITIALIZER;

void dl_api_partial_put(const char *id, int index, char *b64) {
    if (index < 0 || index >= PMAX) {
        free(b64);
        return;
    }
    pthread_mutex_lock(&g_pmu);
    int slot = -1, oldest = 0;
    for (int i = 0; i < PSLOTS && slot < 0; i++)
        if (!strcmp(g_part[i].id, id)) slot = i;
    if (slot < 0) { /* a new job: the least recently used slot */
        for (int i = 1; i < PSLOTS; i++)
            if (g_part[i].age < g_part[oldest].age) oldest = i;
        slot = oldest;
        for (int k = 0; k < PMAX; k++) free(g_part[slot].b64[k]), g_part[slot].b64[k] = NULL;
        snprintf(g_part[slot].id, sizeof g_part[slot].id, "%s", id);
    }
    free(g_part[slot].b64[index]);
    g_part[slot].b64[index] = b64;
    g_part[slot].age = ++g_age;
    pthread_mutex_unlock(&g_pmu);
    dl_api_notify();
}

/* a copy of preview `index` of job id, NULL when there is none (yet) */
static char *partial_copy(const char *id, int index) {
    char *out = NULL;
    pthread_mutex_lock(&g_pmu);
    for (int i = 0; i < PSLOTS; i++)
        if (!strcmp(g_part[i].id, id) && g_part[i].b64[index]) out = strdup(g_part[i].b64[index]);
    pthread_mutex_unlock(&g_pmu);
    return out;
}

static void partial_drop(const char *id) {
    pthread_mutex_lock(&g_pmu);
    for (int i = 0; i < PSLOTS; i++)
        if (!strcmp(g_part[i].id, id)) {
            for (int k = 0; k < PMAX; k++) free(g_part[i].b64[k]), g_part[i].b64[k] = NULL;
            g_part[i].id[0] = 0;
            g_part[i].age = 0;
        }
    pthread_mutex_unlock(&g_pmu);
}

typedef struct {
    char id[24];
    cJSON *req;
    img_opts o;
    int partials, sent, done;
    char *pending; /* an event not yet handed over whole */
    size_t plen, poff;
    double last_write;
} istream;

static void istream_free(void *cls) {
    istream *s = cls;
    partial_drop(s->id);
    cJSON_Delete(s->req);
    free(s->pending);
    free(s);
}

/* "event: <type>\ndata: <json>\n\n" as the pending output (takes ev) */
static void emit(istream *s, const char *type, cJSON *ev) {
    char *t = cJSON_PrintUnformatted(ev);
    cJSON_Delete(ev);
    size_t n = strlen(type) + (t ? strlen(t) : 2) + 64;
    free(s->pending);
    s->pending = malloc(n);
    s->plen = s->pending ? (size_t)snprintf(s->pending, n, "id: %s\nevent: %s\ndata: %s\n\n", s->id, type, t ? t : "{}") : 0;
    s->poff = 0;
    free(t);
}

/* the fields every event of this stream carries */
static cJSON *event(istream *s, const char *kind, const char *b64) {
    char type[64];
    snprintf(type, sizeof type, "%s.%s", s->o.edit ? "image_edit" : "image_generation", kind);
    cJSON *ev = cJSON_CreateObject();
    cJSON_AddStringToObject(ev, "type", type);
    cJSON_AddStringToObject(ev, "b64_json", b64 ? b64 : "");
    cJSON_AddNumberToObject(ev, "created_at", (double)time(NULL));
    dl_api_answer_fields(ev, s->req, &s->o); /* background, output_format, quality, size, usage */
    return ev;
}

static void fail_event(istream *s, const char *status, const char *why) {
    int timeout = why && strstr(why, "timed out");
    cJSON *ev = cJSON_CreateObject();
    cJSON_AddStringToObject(ev, "type", "error");
    char msg[700];
    snprintf(msg, sizeof msg, "job %s %s: %s", s->id, status, why ? why : "no result");
    /* OpenAI's error event: {"type": "error", "error": {message, type, param, code}}, one level */
    cJSON *wrapped = dl_api_error_object(timeout ? "timeout_error" : "server_error", NULL, timeout ? "timeout" : "server_error", msg);
    cJSON_AddItemToObject(ev, "error", cJSON_DetachItemFromObjectCaseSensitive(wrapped, "error"));
    cJSON_Delete(wrapped);
    emit(s, "error", ev);
    s->done = 1;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    istream *s = cls;
    (void)pos;
    for (;;) {
        if (s->pending && s->poff < s->plen) { /* the rest of the current event */
            size_t k = s->plen - s->poff < max ? s->plen - s->poff : max;
            memcpy(buf, s->pending + s->poff, k);
            s->poff += k;
            s->last_write = dl_now();
            return (ssize_t)k;
        }
        if (s->done) return MHD_CONTENT_READER_END_OF_STREAM;
        if (dl_api.draining) { /* shutting down: an error event names the job, which runs after a restart */
            fail_event(s, "is kept", "the server is shutting down; it runs after a restart");
            continue;
        }
        pthread_mutex_lock(&dl_api.mu);
        const unsigned long seen = dl_api.changes;
        pthread_mutex_unlock(&dl_api.mu);
        /* previews in order; one that never comes (skipped by the model process) is
           passed over when the job has ended */
        char *p = s->sent < s->partials ? partial_copy(s->id, s->sent) : NULL;
        if (p) {
            cJSON *ev = event(s, "partial_image", p);
            free(p);
            cJSON_DeleteItemFromObjectCaseSensitive(ev, "usage"); /* usage comes with the completed event */
            cJSON_AddNumberToObject(ev, "partial_image_index", s->sent++);
            char type[64]; /* the SSE event name is the type itself */
            snprintf(type, sizeof type, "%s", cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(ev, "type")));
            emit(s, type, ev);
            continue;
        }
        cJSON *j = dl_jobs_get(dl_api.js, s->id);
        const char *st = j ? cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "status")) : "deleted";
        if (j && !strcmp(st, "completed")) {
            for (; s->sent < s->partials; s->sent++) { /* late previews first */
                char *q = partial_copy(s->id, s->sent);
                if (q) {
                    free(q);
                    break;
                }
            }
            if (s->sent < s->partials) { /* one arrived after all: send it before the picture */
                cJSON_Delete(j);
                continue;
            }
            char *data = NULL, *enc = NULL;
            size_t len;
            const char *path = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "result"));
            if (path && dl_file_read(path, 64u << 20, &data, &len) == DL_OK) enc = dl_b64_encode((const uint8_t *)data, len);
            free(data);
            if (enc) {
                cJSON *ev = event(s, "completed", enc);
                char type[64];
                snprintf(type, sizeof type, "%s", cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(ev, "type")));
                emit(s, type, ev);
                s->done = 1;
            } else {
                fail_event(s, "completed", "its picture could not be read");
            }
            free(enc);
            cJSON_Delete(j);
            continue;
        }
        if (!j || (strcmp(st, "queued") && strcmp(st, "in_progress"))) {
            fail_event(s, st, j ? cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "error")) : "the job was deleted");
            cJSON_Delete(j);
            continue;
        }
        cJSON_Delete(j);
        if (dl_now() - s->last_write > dl_api_keepalive_s()) { /* an SSE comment keeps the connection, proxies and
                                                                   clients patient */
            static const char ka[] = ": keep-alive\n\n";
            s->last_write = dl_now();
            memcpy(buf, ka, sizeof ka - 1 < max ? sizeof ka - 1 : max);
            return (ssize_t)(sizeof ka - 1 < max ? sizeof ka - 1 : max);
        }
        struct timespec ts; /* news wakes us (a preview, a state change); else the keep-alive's time */
        dl_api_wait_until(&ts);
        pthread_mutex_lock(&dl_api.mu);
        if (dl_api.changes == seen) pthread_cond_timedwait(&dl_api.cv, &dl_api.mu, &ts);
        pthread_mutex_unlock(&dl_api.mu);
    }
}

enum MHD_Result dl_api_images_stream(struct MHD_Connection *c, const char *id, cJSON *req, const img_opts *o) {
    istream *s = calloc(1, sizeof *s);
    if (!s) {
        cJSON_Delete(req);
        return MHD_NO;
    }
    snprintf(s->id, sizeof s->id, "%s", id);
    s->req = req, s->o = *o, s->last_write = dl_now();
    s->partials = (int)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(req, "partial_images"));
    if (s->partials < 0 || s->partials > 3) s->partials = 0;
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 64 * 1024, stream_read, s, istream_free);
    if (!r) {
        istream_free(s);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    MHD_add_response_header(r, "Connection", "close"); /* as every reply of this server */
    enum MHD_Result ret = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    dl_api_count_reply(200);
    return ret;
}
