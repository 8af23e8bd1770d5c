/* The API process of `difflet serve` (Difflet §6): HTTP (libmicrohttpd), request
 * validation and routing (a request's `model` picks one of the served models,
 * models.c), a bounded queue per model kept in SQLite (an accepted job is never
 * lost), the images and jobs routes, metrics, readiness, and start-up: each served
 * model's set-up and the job store's recovery before the supervisor (models.c) starts
 * the model processes.
 *
 * Connections are accepted by the listener (listen.c), not by libmicrohttpd: a
 * request's head, and a chunked body, are checked while they are still in the socket,
 * so every error the server sends, a malformed request's included, is the JSON error
 * object; libmicrohttpd then reads and serves only well-formed requests, one per
 * connection (every response here says Connection: close).
 *
 * Locking. One state lock, dl_api.mu, and its condition variable dl_api.cv:
 *  - mu guards the in-memory state threads share: each model process's ready, pid,
 *    inflight, live_step/live_steps and cancel_wanted; each model's restarts and
 *    last_error; the metrics' sums and dl_api.changes and stopping. Replies counted by
 *    status are atomics, outside it.
 *  - mu is held only to read or write that state, never across a wait: no job store
 *    call (a write may wait for an fsync or another writer), no I/O on a model
 *    process's socket, no fork or waitpid, no file I/O, no sleep. A wait on cv (which
 *    releases mu while it waits) is the one wait allowed under it.
 *  - The job store locks for itself (jobs.c: one writer at a time; reads use their own
 *    connection and never wait for a commit) and is called without mu. Nothing takes
 *    mu while it holds the store's writer.
 *  - The supervisor thread (models.c) alone writes the model processes' fields: it
 *    waits unlocked and publishes what changed under mu.
 *  - GET /health takes no lock (its reply is counted in an atomic), nor does the
 *    listener thread: /health answers whatever else the server is waiting for.
 * News reaches waiters through dl_api_notify (changes++, broadcast): a waiter reads
 * `changes` under mu, reads the store unlocked, and waits only while `changes` has not
 * moved, so no news is lost in between. A job's state changes are conditional in the
 * store (dl_jobs_transition: queued -> in_progress or cancelled or failed, in_progress
 * -> completed, failed or cancelled): a cancel, a deadline and the dispatcher racing
 * for one job have one winner, and no job is lost or run twice. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <libavutil/hmac.h>

#include "difflet/comm.h"
#include "difflet/io.h"
#include "difflet/pipeline.h"
#include "difflet/registry.h"
#include "difflet/request.h"
#include "difflet/text.h"
#include "serve/serve_impl.h"
#include "serve/api_impl.h"
#include "text/text_impl.h"

api dl_api; /* the API process's one state (api_impl.h) */
static const double k_buckets[NBUCKETS] = {0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 120};

static double wall(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- HTTP ------------------------------------------------------------------------ */



void dl_api_notify_locked(void) {
    dl_api.changes++;
    pthread_cond_broadcast(&dl_api.cv);
}

void dl_api_notify(void) {
    pthread_mutex_lock(&dl_api.mu);
    dl_api_notify_locked();
    pthread_mutex_unlock(&dl_api.mu);
}

/* the slot running job id (under dl_api.mu), or NULL */
static job_slot *running_slot(const char *id) {
    for (int i = 0; i < dl_api.nworkers; i++)
        for (int k = 0; k < dl_api.w[i].nslots; k++)
            if (dl_api.w[i].s[k].inflight[0] && !strcmp(dl_api.w[i].s[k].inflight, id)) return &dl_api.w[i].s[k];
    return NULL;
}

void dl_api_live(const char *id, int *step, int *steps) {
    *step = *steps = 0;
    pthread_mutex_lock(&dl_api.mu);
    const job_slot *sl = running_slot(id);
    if (sl) *step = sl->live_step, *steps = sl->live_steps;
    pthread_mutex_unlock(&dl_api.mu);
}

void dl_api_cancel_running(const char *id) {
    pthread_mutex_lock(&dl_api.mu);
    job_slot *sl = running_slot(id);
    if (sl) sl->cancel_wanted = 1;
    dl_api_notify_locked();
    pthread_mutex_unlock(&dl_api.mu);
}

void dl_api_count_reply(int status) {
    if (status >= 0 && status < 600) atomic_fetch_add_explicit(&dl_api.requests[status], 1, memory_order_relaxed);
}

/* Every response closes its connection: the next request comes on a new one, through
 * the listener's checks (see the top of the file). */
static enum MHD_Result queue(struct MHD_Connection *c, int status, struct MHD_Response *r) {
    MHD_add_response_header(r, "Connection", "close");
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    dl_api_count_reply(status);
    return ret;
}

static enum MHD_Result respond(struct MHD_Connection *c, int status, const char *type, const void *body, size_t len,
                               const char *extra_hdr, const char *extra_val) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    if (extra_hdr) MHD_add_response_header(r, extra_hdr, extra_val);
    return queue(c, status, r);
}

enum MHD_Result dl_api_json_reply(struct MHD_Connection *c, int status, cJSON *j) {
    char *t = cJSON_PrintUnformatted(j);
    enum MHD_Result r = respond(c, status, "application/json", t, strlen(t), NULL, NULL);
    free(t);
    cJSON_Delete(j);
    return r;
}

/* A result file streamed from its descriptor (a video may be large); *ok 0 when it
 * cannot be opened (nothing was queued) */
enum MHD_Result dl_api_file_reply(struct MHD_Connection *c, const char *path, const char *type, int *ok) {
    struct stat sb;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    *ok = 0;
    if (fd < 0) return MHD_NO;
    struct MHD_Response *r = fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) ? MHD_create_response_from_fd((uint64_t)sb.st_size, fd) : NULL;
    if (!r) {
        close(fd);
        return MHD_NO;
    }
    *ok = 1;
    MHD_add_response_header(r, "Content-Type", type);
    return queue(c, 200, r);
}

/* msg with every byte sequence that is not UTF-8 (a client's bytes echoed, a cut
 * character) replaced by U+FFFD, so the JSON reply is valid UTF-8 */
static void utf8_clean(const char *msg, char *out, size_t n) {
    size_t i = 0, o = 0, len = strlen(msg);
    int32_t cp;
    while (i < len && o + 4 < n) {
        int k = dl_utf8_next(msg + i, len - i, &cp);
        if (k > 0) {
            if (o + (size_t)k >= n) break;
            memcpy(out + o, msg + i, (size_t)k), o += (size_t)k, i += (size_t)k;
        } else {
            memcpy(out + o, "\xEF\xBF\xBD", 3), o += 3, i++;
        }
    }
    out[o] = 0;
}

cJSON *dl_api_error_object(const char *type, const char *param, const char *code, const char *msg) {
    cJSON *j = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(j, "error");
    char clean[2048];
    utf8_clean(msg, clean, sizeof clean);
    cJSON_AddStringToObject(e, "message", clean);
    cJSON_AddStringToObject(e, "type", type);
    if (param) cJSON_AddStringToObject(e, "param", param);
    else cJSON_AddNullToObject(e, "param");
    cJSON_AddStringToObject(e, "code", code);
    return j;
}

enum MHD_Result dl_api_error_reply(struct MHD_Connection *c, int status, const char *type, const char *param,
                                   const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    /* OpenAI's string codes */
    const char *code = status == 400   ? (!strncmp(msg, "unknown field", 13) ? "unknown_parameter"
                                          : strstr(msg, "is required")     ? "missing_required_parameter"
                                                                            : "invalid_value")
                       : status == 401 ? "invalid_api_key"
                       : status == 403 ? "forbidden"
                       : status == 404 ? (param && !strcmp(param, "model") ? "model_not_found" : "not_found")
                       : status == 405 ? "method_not_allowed"
                       : status == 413 ? "request_too_large"
                       : status == 429 ? "rate_limit_exceeded"
                       : status == 503 ? "service_unavailable"
                       : status == 504 ? "timeout"
                                       : "server_error";
    cJSON *j = dl_api_error_object(type, param, code, msg);
    if (status == 429) {
        char *t = cJSON_PrintUnformatted(j);
        enum MHD_Result r = respond(c, status, "application/json", t, strlen(t), "Retry-After", "2");
        free(t);
        cJSON_Delete(j);
        return r;
    }
    return dl_api_json_reply(c, status, j);
}

static int cmp_name(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* a key that some object of j has twice (NULL: none). RFC 8259 leaves the meaning of
 * duplicates open (cJSON reads the first, most other parsers the last): refused, a
 * request means one thing. Sorted names, so a huge object costs n log n. */
static const char *duplicate_key(const cJSON *j) {
    size_t n = 0;
    for (const cJSON *c = j ? j->child : NULL; c; c = c->next) {
        const char *d = duplicate_key(c);
        if (d) return d;
        n++;
    }
    if (!cJSON_IsObject(j) || n < 2) return NULL;
    const char **names = malloc(n * sizeof *names);
    if (!names) return NULL;
    size_t k = 0;
    for (const cJSON *c = j->child; c; c = c->next) names[k++] = c->string ? c->string : "";
    qsort(names, n, sizeof *names, cmp_name);
    const char *d = NULL;
    for (size_t i = 1; i < n && !d; i++)
        if (!strcmp(names[i - 1], names[i])) d = names[i];
    free(names);
    return d;
}

/* one JSON value in RFC 8259's strict grammar, no object with a key twice and nothing
 * after it, or NULL (the reason in dl_last_error) */
cJSON *dl_api_parse_json_body(const char *body, size_t len) {
    size_t at;
    const char *why = dl_json_strict_check(body, len, &at);
    if (why) {
        dl_fail(DL_ERR_INVALID, "%s at byte %zu", why, at);
        return NULL;
    }
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    while (j && end && end < body + len && strchr(" \t\r\n", *end)) end++;
    if (j && end && end < body + len) {
        cJSON_Delete(j);
        j = NULL;
    }
    if (!j) { /* a safety net: the strict check refuses all cJSON is known to refuse, should the two ever disagree */
        const char *e = cJSON_GetErrorPtr();
        dl_fail(DL_ERR_INVALID, "it cannot be read at byte %zu", e && e >= body && e <= body + len ? (size_t)(e - body) : (size_t)0);
        return NULL;
    }
    const char *dup = duplicate_key(j);
    if (dup) {
        if (strlen(dup) <= 64) dl_fail(DL_ERR_INVALID, "the key \"%s\" appears twice in one object", dup);
        else dl_fail(DL_ERR_INVALID, "a key (%zu bytes) appears twice in one object", strlen(dup));
        cJSON_Delete(j);
        j = NULL;
    }
    return j;
}


/* the index of s in `list` (NULL-terminated), -1 when absent */
static int str_index(const char *s, const char *const *list) {
    for (int i = 0; s && list[i]; i++)
        if (!strcmp(s, list[i])) return i;
    return -1;
}

/* the index of string value v in `allowed`, -1 when v is not one of them (or not a string) */
static int one_of(const cJSON *v, const char *const *allowed) { return cJSON_IsString(v) ? str_index(v->valuestring, allowed) : -1; }

/* Validate a generation request; on success *norm is the normalised job request
 * (the typed request as JSON: what the job store keeps and the model process gets)
 * and *o what the answer needs. Every value OpenAI's images.generate can send is
 * taken: honoured where difflet can (quality chooses the step count when `steps` is
 * absent), otherwise ignored (docs/serve.md, "OpenAI compatibility"); a null is the
 * same as the parameter left out, as OpenAI has it. */
int dl_api_validate_images(cJSON *j, cJSON **norm, img_opts *o, char *err, size_t en, char *param, size_t pn) {
    *norm = NULL;
    param[0] = 0;
    memset(o, 0, sizeof *o);
#define FAIL(p, ...)                               \
    do {                                           \
        snprintf(param, pn, "%s", p);              \
        snprintf(err, en, __VA_ARGS__);            \
        cJSON_Delete(j);                           \
        return 0;                                  \
    } while (0)
    if (!cJSON_IsObject(j)) FAIL("", "the body must be a JSON object");
    /* OpenAI's parameters (as images.generate sends them), then difflet's (request.h) */
    static const char *const openai[] = {"prompt", "model", "n", "size", "response_format", "output_format",
                                         "output_compression", "quality", "style", "background", "moderation",
                                         "stream", "partial_images", "user", "safety_identifier", "complexity",
                                         "frame_count", "frame_duration_ms", "svg", NULL};
    static const char *const own[] = {"negative_prompt", "steps", "guidance_scale", "true_cfg_scale", "seed", "cache", NULL};
    for (cJSON *e = j->child, *next; e; e = next) {
        next = e->next;
        int std = str_index(e->string, openai) >= 0;
        if (!std && str_index(e->string, own) < 0) FAIL(e->string, "unknown field `%s`", e->string);
        if (std && cJSON_IsNull(e)) cJSON_Delete(cJSON_DetachItemViaPointer(j, e));
    }
    const cJSON *v;
#define GET(name) cJSON_GetObjectItemCaseSensitive(j, name)
    o->n = 1;
    if ((v = GET("n"))) {
        if (!cJSON_IsNumber(v) || v->valuedouble != (int)v->valuedouble || v->valuedouble < 1 || v->valuedouble > 4)
            FAIL("n", "`n` must be an integer from 1 to 4");
        o->n = (int)v->valuedouble;
    }
    o->b64 = 1;
    if ((v = GET("response_format"))) {
        if (!cJSON_IsString(v) || (strcmp(v->valuestring, "b64_json") && strcmp(v->valuestring, "url")))
            FAIL("response_format", "`response_format` must be \"b64_json\" or \"url\"");
        o->b64 = !strcmp(v->valuestring, "b64_json");
    }
    if ((v = GET("model")) && !cJSON_IsString(v)) FAIL("model", "`model` must be a string");
    char unknown[800];
    const served *m = o->model = dl_api_route(v, 0, unknown, sizeof unknown);
    if (!m) FAIL("model", "%s", unknown); /* the callers answer 404 */
    for (int k = 0; k < 2; k++) { /* echoed as the answer's safety_identifier (safety_identifier wins) */
        const char *name = k ? "user" : "safety_identifier";
        if (!(v = GET(name))) continue;
        if (!cJSON_IsString(v) || strlen(v->valuestring) > 256 || !dl_utf8_valid(v->valuestring, strlen(v->valuestring)))
            FAIL(name, "`%s` must be a string of at most 256 bytes", name);
        if (!o->safety[0]) snprintf(o->safety, sizeof o->safety, "%s", v->valuestring);
    }
    static const char *const qualities[] = {"auto", "standard", "hd", "high", "xhigh", "max", "medium", "low", NULL};
    static const char *const styles[] = {"vivid", "natural", NULL}, *const backgrounds[] = {"auto", "opaque", "transparent", NULL},
                             *const moderations[] = {"auto", "low", NULL}, *const complexities[] = {"low", "medium", "high", NULL};
    static const struct {
        const char *name;
        const char *const *values;
        const char *message;
    } enums[] = {
        {"quality", qualities, "\"auto\", \"low\", \"medium\", \"high\", \"xhigh\", \"max\", \"standard\" or \"hd\""},
        {"style", styles, "\"vivid\" or \"natural\""},
        {"background", backgrounds, "\"auto\", \"opaque\" or \"transparent\""},
        {"moderation", moderations, "\"auto\" or \"low\""},
        {"complexity", complexities, "\"low\", \"medium\" or \"high\""},
    };
    for (size_t k = 0; k < sizeof enums / sizeof enums[0]; k++)
        if ((v = GET(enums[k].name)) && one_of(v, enums[k].values) < 0)
            FAIL(enums[k].name, "`%s` must be %s", enums[k].name, enums[k].message);
    if ((v = GET("stream")) && !cJSON_IsBool(v)) FAIL("stream", "`stream` must be a boolean");
    o->stream = cJSON_IsTrue(v);
    if (o->stream && o->n != 1) FAIL("n", "`stream: true` answers one image: `n` must be 1");
    if ((v = GET("partial_images")) && (!cJSON_IsNumber(v) || v->valuedouble != (int)v->valuedouble || v->valuedouble < 0 || v->valuedouble > 3))
        FAIL("partial_images", "`partial_images` must be an integer from 0 to 3");
    if (!o->stream) cJSON_DeleteItemFromObjectCaseSensitive(j, "partial_images"); /* previews only for a stream */
    if ((v = GET("output_format")) && (one_of(v, (const char *const[]){"gif", "svg", NULL}) >= 0))
        FAIL("output_format", "`output_format` \"%s\" is not supported: this server writes \"png\", \"jpeg\" or \"webp\"", v->valuestring);
    static const char *const gif_svg[] = {"frame_count", "frame_duration_ms", "svg"};
    for (size_t k = 0; k < sizeof gif_svg / sizeof gif_svg[0]; k++)
        if (GET(gif_svg[k]))
            FAIL(gif_svg[k], "`%s` is for output_format \"gif\" or \"svg\", which this server does not make", gif_svg[k]);
    if (one_of(GET("size"), (const char *const[]){"auto", NULL}) == 0) cJSON_DeleteItemFromObjectCaseSensitive(j, "size"); /* the first size served */
    int quality = one_of(GET("quality"), qualities), steps_given = GET("steps") != NULL;
    const int guid_given = GET("guidance_scale") != NULL, tcfg_given = GET("true_cfg_scale") != NULL;
#undef GET
    if (m->pr.video) {
        char what[400];
        dl_api_model_kind(m, what, sizeof what);
        FAIL("model", "%s: use POST /v1/videos", what);
    }
    dl_request_limits lim = {m->pr.max_steps, m->pr.max_prompt_bytes, 0};
    dl_request r;
    if (dl_request_from_json(j, &lim, &r, param, pn) != DL_OK) {
        snprintf(err, en, "%s", dl_last_error());
        cJSON_Delete(j);
        return 0;
    }
    if (r.output_format == DL_FMT_MP4) {
        dl_request_free(&r);
        FAIL("output_format", "`output_format` must be \"png\", \"jpeg\" or \"webp\" for this model's images");
    }
    if (m->entry) { /* the served pipeline's own __call__ defaults (FLUX: 28 steps, guidance 3.5; Qwen-Image: 50, true CFG 4), or its folder's */
        const dl_model_defaults *md = &m->defaults;
        if (!steps_given) r.steps = md->steps < m->pr.max_steps ? md->steps : m->pr.max_steps;
        if (!guid_given) r.guidance = md->guidance;
        if (!tcfg_given && md->true_cfg > 0) r.true_cfg = md->true_cfg;
    }
    if (!steps_given) { /* quality is the step count: low a quarter of the default, medium half, the rest all of it */
        const char *level = quality == 7 ? "low" : quality == 6 ? "medium" : "high";
        r.steps = quality == 7 ? (r.steps + 3) / 4 : quality == 6 ? (r.steps + 1) / 2 : r.steps;
        snprintf(o->quality, sizeof o->quality, "%s", level);
    }
    if (!r.width) r.width = m->pr.sizes[0][0], r.height = m->pr.sizes[0][1];
    int size_ok = 0;
    for (int i = 0; i < m->pr.nsizes; i++) size_ok |= m->pr.sizes[i][0] == r.width && m->pr.sizes[i][1] == r.height;
    if (!size_ok) {
        char list[256] = "";
        for (int i = 0; i < m->pr.nsizes; i++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%dx%d", i ? ", " : "", m->pr.sizes[i][0], m->pr.sizes[i][1]);
        int w = r.width, h = r.height;
        dl_request_free(&r);
        FAIL("size", "size `%dx%d` is not served; supported: %s", w, h, list);
    }
    *norm = dl_request_to_json(&r);
    dl_request_free(&r);
    cJSON_Delete(j);
    return 1;
#undef FAIL
}

static void new_id(char *id) {
    uint8_t b[8];
    if (getrandom(b, sizeof b, 0) != sizeof b)
        for (int i = 0; i < 8; i++) b[i] = (uint8_t)(rand() & 0xff);
    for (int i = 0; i < 8; i++) sprintf(id + 2 * i, "%02x", b[i]);
}

/* Enqueue n jobs of a kind ("image", "video"; seed s, s+1, ... when given; random
 * otherwise) for model m. 0 when its queue is full, -1 when the job store could not
 * record them (nothing was accepted). The count and the inserts are one durable
 * transaction (the store's writer, not dl_api.mu: its fsync holds up no other reply),
 * so concurrent requests cannot overfill the queue. */
int dl_api_enqueue(const served *m, cJSON *req, int n, char ids[][24], const char *kind) {
    if (dl_jobs_begin(dl_api.js, 1) != DL_OK) { /* the whole request is accepted with one durable commit */
        DL_ERROR("serve: job store: %s", dl_last_error());
        return -1;
    }
    if (dl_jobs_count(dl_api.js, "queued", m->pr.model_id) + n > m->pr.queue_capacity) {
        dl_jobs_rollback(dl_api.js);
        return 0;
    }
    const cJSON *given = cJSON_GetObjectItemCaseSensitive(req, "seed");
    double seed = cJSON_IsNumber(given) ? given->valuedouble : -1;
    int ok = 1;
    for (int i = 0; i < n && ok; i++) {
        new_id(ids[i]);
        uint64_t sd;
        if (seed >= 0) sd = (uint64_t)seed + (uint64_t)i;
        else if (getrandom(&sd, sizeof sd, 0) != sizeof sd) sd = (uint64_t)rand();
        cJSON_DeleteItemFromObject(req, "seed"); /* each job its own: seed, seed + 1, ... or drawn here */
        cJSON_AddNumberToObject(req, "seed", (double)(sd & (uint64_t)(DL_SEED_MAX - 1)));
        char *t = cJSON_PrintUnformatted(req);
        ok = t && dl_jobs_insert(dl_api.js, ids[i], kind, m->pr.model_id, t, wall() + m->pr.timeout_s) == DL_OK;
        free(t);
    }
    if (!ok || dl_jobs_commit(dl_api.js) != DL_OK) {
        DL_ERROR("serve: job store: %s", dl_last_error());
        dl_jobs_rollback(dl_api.js);
        return -1;
    }
    dl_api_notify();
    if (write(dl_api.wake[1], "j", 1) < 0) {} /* full pipe: the supervisor is awake anyway */
    return 1;
}

/* Signed content URLs, as OpenAI's `url` responses are: absolute, fetchable without
 * the API key, valid for an hour. sig = hex HMAC-SHA256(server key, "ID:EXPIRES"). */
enum { URL_TTL_S = 3600 };
static void url_sig(const char *id, long long expires, char hex[65]) {
    char msg[80];
    int n = snprintf(msg, sizeof msg, "%s:%lld", id, expires);
    uint8_t mac[32] = {0};
    AVHMAC *h = av_hmac_alloc(AV_HMAC_SHA256);
    if (h) av_hmac_calc(h, (const uint8_t *)msg, (unsigned)n, dl_api.url_key, sizeof dl_api.url_key, mac, sizeof mac);
    av_hmac_free(h);
    for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", mac[i]);
}

/* the content URL of job id for this request's Host */
static void content_url(struct MHD_Connection *c, const char *id, char *out, size_t n) {
    const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host");
    long long expires = (long long)wall() + URL_TTL_S;
    char sig[65];
    url_sig(id, expires, sig);
    snprintf(out, n, "http://%s/v1/jobs/%s/content?expires=%lld&sig=%s", host ? host : "127.0.0.1", id, expires, sig);
}

/* a /v1/jobs/ID/content request carrying a valid, unexpired signature */
static int signed_content(struct MHD_Connection *c, const char *url) {
    char id[64], tail[64] = "";
    if (sscanf(url, "/v1/jobs/%63[0-9a-f]%63s", id, tail) != 2 || strcmp(tail, "/content")) return 0;
    const char *e = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "expires");
    const char *g = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "sig");
    if (!e || !g || strlen(g) != 64) return 0;
    char *end;
    long long expires = strtoll(e, &end, 10);
    if (*end || expires < (long long)wall()) return 0;
    char want[65];
    url_sig(id, expires, want);
    unsigned diff = 0;
    for (int i = 0; i < 64; i++) diff |= (unsigned)(want[i] ^ g[i]);
    return diff == 0;
}

/* printf into a growing buffer (NULL buffer after an allocation failure) */
typedef struct {
    char *p;
    size_t n, cap;
} textbuf;

static void tb_printf(textbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void tb_printf(textbuf *b, const char *fmt, ...) {
    for (int pass = 0; b->p && pass < 2; pass++) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->p + b->n, b->cap - b->n, fmt, ap);
        va_end(ap);
        if (k < 0) return;
        if ((size_t)k < b->cap - b->n) {
            b->n += (size_t)k;
            return;
        }
        size_t cap = (b->cap + (size_t)k + 1) * 2;
        char *q = realloc(b->p, cap);
        if (!q) {
            free(b->p);
            b->p = NULL;
            return;
        }
        b->p = q, b->cap = cap;
    }
}

/* Prometheus text: the server's totals, then each model's own queue, processes and
 * restarts (label `model`: its id). The store's counts are read first (no lock), then
 * the memory's under dl_api.mu, then the text is written (no lock). */
static enum MHD_Result metrics(struct MHD_Connection *c) {
    const int nm = dl_api.nmodels;
    long queued[DL_SERVE_MAX_MODELS], inflight[DL_SERVE_MAX_MODELS], restarts_m[DL_SERVE_MAX_MODELS], ready_m[DL_SERVE_MAX_MODELS];
    const int depth = dl_jobs_count(dl_api.js, "queued", NULL);
    for (int k = 0; k < nm; k++) queued[k] = dl_jobs_count(dl_api.js, "queued", dl_api.m[k].pr.model_id);
    long dur_bucket[NBUCKETS], dur_count, wait_count, steps_full, steps_cached, restarts, inflight_all = 0;
    double dur_sum, wait_sum;
    int ready;
    pthread_mutex_lock(&dl_api.mu);
    for (int k = 0; k < nm; k++) {
        inflight[k] = dl_api_inflight(&dl_api.m[k]), inflight_all += inflight[k];
        restarts_m[k] = dl_api.m[k].restarts, ready_m[k] = dl_api_model_ready(&dl_api.m[k]);
    }
    memcpy(dur_bucket, dl_api.dur_bucket, sizeof dur_bucket);
    dur_count = dl_api.dur_count, wait_count = dl_api.wait_count, steps_full = dl_api.steps_full;
    steps_cached = dl_api.steps_cached, restarts = dl_api.restarts, dur_sum = dl_api.dur_sum, wait_sum = dl_api.wait_sum;
    ready = dl_api_all_ready();
    pthread_mutex_unlock(&dl_api.mu);
    textbuf tb = {malloc(16384), 0, 16384};
#define P(...) tb_printf(&tb, __VA_ARGS__)
    P("# TYPE difflet_requests_total counter\n");
    for (int s = 100; s < 600; s++) {
        long n = atomic_load_explicit(&dl_api.requests[s], memory_order_relaxed);
        if (n) P("difflet_requests_total{status=\"%d\"} %ld\n", s, n);
    }
    P("# TYPE difflet_request_duration_seconds histogram\n");
    long cum = 0;
    for (int b = 0; b < NBUCKETS; b++) {
        cum += dur_bucket[b];
        P("difflet_request_duration_seconds_bucket{le=\"%g\"} %ld\n", k_buckets[b], cum);
    }
    P("difflet_request_duration_seconds_bucket{le=\"+Inf\"} %ld\n", dur_count);
    P("difflet_request_duration_seconds_sum %.6f\ndifflet_request_duration_seconds_count %ld\n", dur_sum, dur_count);
    P("# TYPE difflet_queue_wait_seconds summary\ndifflet_queue_wait_seconds_sum %.6f\ndifflet_queue_wait_seconds_count %ld\n",
      wait_sum, wait_count);
    P("# TYPE difflet_queue_depth gauge\ndifflet_queue_depth %d\n", depth);
    P("# TYPE difflet_inflight gauge\ndifflet_inflight %ld\n", inflight_all);
    P("# TYPE difflet_denoise_steps_total counter\ndifflet_denoise_steps_total{cached=\"false\"} %ld\n"
      "difflet_denoise_steps_total{cached=\"true\"} %ld\n", steps_full, steps_cached);
    P("# TYPE difflet_model_restarts_total counter\ndifflet_model_restarts_total %ld\n", restarts);
    P("# TYPE difflet_ready gauge\ndifflet_ready %d\n", ready);
    static const char *const per_model[] = {"difflet_model_queue_depth gauge", "difflet_model_inflight gauge",
                                            "difflet_model_process_restarts_total counter", "difflet_model_ready gauge"};
    const long *const values[] = {queued, inflight, restarts_m, ready_m};
    for (int f = 0; f < 4; f++) {
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)strcspn(per_model[f], " "), per_model[f]);
        P("# TYPE %s\n", per_model[f]);
        for (int k = 0; k < nm; k++) P("%s{model=\"%s\"} %ld\n", name, dl_api.m[k].pr.model_id, values[f][k]);
    }
    /* DDiT worlds: the pool as their scheduler rank reports it */
    int any_ddit = 0;
    for (int k = 0; k < nm; k++) any_ddit |= dl_api.m[k].pr.scheduler[0] != 0;
    if (any_ddit) {
        P("# TYPE difflet_ddit_units gauge\n# TYPE difflet_ddit_units_busy gauge\n# TYPE difflet_ddit_utilization gauge\n"
          "# TYPE difflet_ddit_nodes gauge\n"
          "# TYPE difflet_ddit_waiting gauge\n# TYPE difflet_ddit_promotions_total counter\n"
          "# TYPE difflet_ddit_requests_total counter\n");
        pthread_mutex_lock(&dl_api.mu);
        for (int k = 0; k < nm; k++) {
            const served *sm = &dl_api.m[k];
            if (!sm->pr.scheduler[0]) continue;
            const char *id = sm->pr.model_id;
            P("difflet_ddit_units{model=\"%s\"} %d\ndifflet_ddit_units_busy{model=\"%s\"} %d\n", id, sm->pr.units, id,
              sm->pool_busy);
            P("difflet_ddit_nodes{model=\"%s\"} %d\n", id, sm->pool_nodes);
            P("difflet_ddit_utilization{model=\"%s\"} %.4f\n", id, (double)sm->pool_busy / sm->pr.units);
            P("difflet_ddit_waiting{model=\"%s\"} %d\ndifflet_ddit_promotions_total{model=\"%s\"} %ld\n", id,
              sm->pool_waiting, id, sm->pool_promotions);
            for (int d = 0; d < 4; d++)
                P("difflet_ddit_requests_total{model=\"%s\",dop=\"%d\"} %ld\n", id, 1 << d, sm->by_dop[d]);
        }
        pthread_mutex_unlock(&dl_api.mu);
    }
#undef P
    if (!tb.p) return dl_api_error_reply(c, 500, "server_error", NULL, "out of memory");
    enum MHD_Result r = respond(c, 200, "text/plain; version=0.0.4", tb.p, tb.n, NULL, NULL);
    free(tb.p);
    return r;
}

static void observe(double secs) {
    pthread_mutex_lock(&dl_api.mu);
    int b = 0;
    while (b < NBUCKETS && secs > k_buckets[b]) b++;
    if (b < NBUCKETS) dl_api.dur_bucket[b]++;
    dl_api.dur_count++, dl_api.dur_sum += secs;
    pthread_mutex_unlock(&dl_api.mu);
}

/* The prompt's text tokens as the model's main text encoder reads them: counted by
 * its tokenizer (tokenizer_2 where there is one, FLUX's T5; else tokenizer) with the
 * special tokens and without padding or a pipeline's prompt template, at most the
 * text length the model reads. 0 when the tokenizer could not be loaded. */
static int prompt_tokens(const served *m, const char *prompt) {
    size_t len = strlen(prompt);
    int n = 0, cap = (int)(len * 4 + 16); /* no truncation here: a few ids per byte at most, plus the specials */
    if (!m->tok || m->tok_len < 1) return 0;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    if (!ids || dl_tokenizer_encode(m->tok, prompt, len, cap, 0, ids, &n) != DL_OK) n = 0;
    free(ids);
    return n < m->tok_len ? n : m->tok_len;
}

/* The tokenizer usage counts with, from an image model's folder. */
static void load_tokenizer(served *m) {
    char dir[1100];
    snprintf(dir, sizeof dir, "%s/tokenizer_2", m->pr.model);
    if (!dl_file_exists(dir)) snprintf(dir, sizeof dir, "%s/tokenizer", m->pr.model);
    if (dl_tokenizer_load(&m->tok, dir) != DL_OK) {
        DL_WARN("serve: %s; %s's usage.input_tokens will be 0", dl_last_error(), m->pr.model_id);
        m->tok = NULL;
    }
    m->tok_len = m->pr.max_sequence_length > 0 ? m->pr.max_sequence_length
                                               : (int)dl_model_default_int(m->pr.model, "max_sequence_length", 1, 4096, 512);
}

/* POST /v1/images/generations: n jobs, answered when all are done, in OpenAI's
 * ImagesResponse shape (created, data[] with revised_prompt, background,
 * output_format, quality, size, usage, safety_identifier) plus difflet's timing. */
static enum MHD_Result generations(struct MHD_Connection *c, conn *cn) {
    cJSON *req = NULL, *j = dl_api_parse_json_body(cn->body ? cn->body : "", cn->len);
    img_opts o;
    char err[1024], param[64] = "";
    if (!j) snprintf(err, sizeof err, "the body is not valid JSON: %s", dl_last_error());
    if (!j || !dl_api_validate_images(j, &req, &o, err, sizeof err, param, sizeof param))
        return dl_api_error_reply(c, strcmp(param, "model") || !strstr(err, "does not exist") ? 400 : 404, "invalid_request_error", param[0] ? param : NULL, "%s", err);
    return dl_api_images_answer(c, req, &o);
}

/* what an images answer (and a stream's completed event) says beside the pictures:
 * never transparent (no alpha channel), the format written, the quality the step
 * count stood for (absent when `steps` was given), the size, the safety identifier,
 * and usage: the prompt's text tokens (counted once per request, as OpenAI counts
 * them); no input image tokens; the output is pixels, not tokens */
void dl_api_answer_fields(cJSON *out, const cJSON *req, const img_opts *o) {
    char size[32];
    snprintf(size, sizeof size, "%dx%d", (int)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(req, "width")),
             (int)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(req, "height")));
    cJSON_AddStringToObject(out, "background", "opaque");
    cJSON_AddStringToObject(out, "output_format", cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(req, "output_format")));
    if (o->quality[0]) cJSON_AddStringToObject(out, "quality", o->quality);
    cJSON_AddStringToObject(out, "size", size);
    if (o->safety[0]) cJSON_AddStringToObject(out, "safety_identifier", o->safety);
    int tokens = prompt_tokens(o->model, cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(req, "prompt")));
    cJSON *u = cJSON_AddObjectToObject(out, "usage");
    cJSON_AddNumberToObject(u, "input_tokens", tokens);
    cJSON *ud = cJSON_AddObjectToObject(u, "input_tokens_details");
    cJSON_AddNumberToObject(ud, "text_tokens", tokens);
    cJSON_AddNumberToObject(ud, "image_tokens", 0);
    cJSON_AddNumberToObject(u, "output_tokens", 0);
    cJSON_AddNumberToObject(u, "total_tokens", tokens);
}

enum MHD_Result dl_api_images_answer(struct MHD_Connection *c, cJSON *req, const img_opts *po) {
    const img_opts o = *po;
    const int n = o.n;
    char ids[4][24];
    int q = dl_api_enqueue(o.model, req, n, ids, "image");
    if (q < 0) {
        cJSON_Delete(req);
        return dl_api_error_reply(c, 500, "server_error", NULL, "the job store could not record the request: %s", dl_last_error());
    }
    if (!q) {
        cJSON_Delete(req);
        return dl_api_error_reply(c, 429, "rate_limit_error", NULL, "the queue of `%s` is full (%d jobs); retry later",
                                  o.model->pr.model_id, o.model->pr.queue_capacity);
    }
    if (o.stream) return dl_api_images_stream(c, ids[0], req, &o); /* n is 1 */
    cJSON *out = cJSON_CreateObject(), *data = cJSON_AddArrayToObject(out, "data");
    cJSON_AddNumberToObject(out, "created", (double)(int64_t)wall());
    for (int i = 0; i < n; i++) {
        cJSON *j = NULL;
        const char *st = NULL;
        for (;;) { /* wait for this job to finish: the store read without the lock, the wait on news (or 0.2 s) */
            pthread_mutex_lock(&dl_api.mu);
            const unsigned long seen = dl_api.changes;
            pthread_mutex_unlock(&dl_api.mu);
            cJSON_Delete(j);
            j = dl_jobs_get(dl_api.js, ids[i]);
            st = j ? cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "status")) : "failed";
            if (strcmp(st, "queued") && strcmp(st, "in_progress")) break;
            if (dl_api.draining) { /* shutting down: an answer now; the job stays queued in the store */
                cJSON_Delete(out), cJSON_Delete(req), cJSON_Delete(j);
                return dl_api_error_reply(c, 503, "server_error", NULL,
                                          "the server is shutting down: job %s is kept and runs after a restart "
                                          "(GET /v1/jobs/%s)", ids[i], ids[i]);
            }
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 200000000;
            if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
            pthread_mutex_lock(&dl_api.mu);
            if (dl_api.changes == seen) pthread_cond_timedwait(&dl_api.cv, &dl_api.mu, &ts);
            pthread_mutex_unlock(&dl_api.mu);
        }
        if (strcmp(st, "completed")) {
            const char *e = j ? cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "error")) : NULL;
            int timeout = e && strstr(e, "timed out");
            cJSON_Delete(out);
            cJSON_Delete(req);
            enum MHD_Result r = dl_api_error_reply(c, timeout ? 504 : 500, timeout ? "timeout_error" : "server_error", NULL,
                                            "job %s %s: %s", ids[i], st, e ? e : "no result");
            cJSON_Delete(j);
            return r;
        }
        cJSON *item = cJSON_CreateObject();
        if (o.b64) {
            char *data_bytes;
            size_t len;
            const char *path = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "result"));
            if (path && dl_file_read(path, 64u << 20, &data_bytes, &len) == DL_OK) {
                char *enc = dl_b64_encode((const uint8_t *)data_bytes, len);
                cJSON_AddStringToObject(item, "b64_json", enc ? enc : "");
                free(enc), free(data_bytes);
            }
        } else {
            char url[512];
            content_url(c, ids[i], url, sizeof url);
            cJSON_AddStringToObject(item, "url", url);
        }
        /* difflet does not rewrite prompts: the model read the prompt as given */
        cJSON_AddStringToObject(item, "revised_prompt", cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(req, "prompt")));
        cJSON_AddItemToArray(data, item);
        if (i == 0) { /* extension: where the time went (benchmarks measure server overhead with it) */
            cJSON *t = cJSON_AddObjectToObject(out, "difflet");
            cJSON_AddStringToObject(t, "job", ids[0]);
            cJSON_AddNumberToObject(t, "model_seconds", cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(j, "model_seconds")));
            cJSON_AddNumberToObject(t, "queue_seconds", cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(j, "queue_seconds")));
            cJSON_AddNumberToObject(t, "steps", cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(req, "steps")));
        }
        cJSON_Delete(j);
    }
    dl_api_answer_fields(out, req, &o);
    cJSON_Delete(req);
    return dl_api_json_reply(c, 200, out);
}

/* Server-Sent Events: one `progress` event per denoising step (pushed from what the
 * model process reports: the stream sleeps on the server's condition variable, it
 * does not poll the store), one per status change, and the final status as the
 * last event. A keep-alive repeats the state after dl_api_keepalive_s() without news. The callback
 * runs on this connection's own thread. */
typedef struct {
    char id[24];
    int last_step;
    char last_status[24];
    int done;
    int video; /* /v1/videos/ID/events: each event's data is the video object */
} sse;

static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max) {
    sse *e = cls;
    (void)pos;
    if (e->done) return MHD_CONTENT_READER_END_OF_STREAM;
    const double since = wall();
    for (;;) {
        if (dl_api.draining) return MHD_CONTENT_READER_END_OF_STREAM; /* shutting down: the stream ends whole (EventSource reconnects) */
        const int quiet = wall() - since >= dl_api_keepalive_s(); /* time for a keep-alive */
        /* the running job's progress from memory (under the lock, briefly) */
        int running = 0, live_step = 0, live_steps = 0;
        pthread_mutex_lock(&dl_api.mu);
        const unsigned long seen = dl_api.changes;
        const job_slot *sl = running_slot(e->id);
        if (sl) running = 1, live_step = sl->live_step, live_steps = sl->live_steps;
        pthread_mutex_unlock(&dl_api.mu);
        if (running && live_step > e->last_step && !strcmp(e->last_status, "in_progress")) {
            /* running: an event for every step done since the last one sent */
            size_t n = 0;
            while (e->last_step < live_step && n + 256 < max) {
                int st = ++e->last_step, pc = live_steps ? 100 * st / live_steps : 0;
                if (e->video) /* the video object's fields that change while it runs */
                    n += (size_t)snprintf(buf + n, max - n,
                                          "event: progress\ndata: {\"id\":\"video_%s\",\"object\":\"video\",\"status\":\"in_progress\","
                                          "\"progress\":%d,\"steps_done\":%d,\"steps\":%d}\n\n",
                                          e->id, pc < 99 ? pc : 99, st, live_steps);
                else
                    n += (size_t)snprintf(buf + n, max - n,
                                          "event: progress\ndata: {\"id\":\"%s\",\"status\":\"in_progress\",\"steps_done\":%d,"
                                          "\"steps\":%d,\"progress\":%d}\n\n",
                                          e->id, st, live_steps, pc);
            }
            return (ssize_t)n;
        }
        /* the store (no lock): only on a status change, else for a keep-alive */
        cJSON *j = NULL;
        int idle_run = running && !strcmp(e->last_status, "in_progress") && live_step == e->last_step && !quiet;
        if (!idle_run && !(j = dl_jobs_get(dl_api.js, e->id))) return MHD_CONTENT_READER_END_OF_STREAM; /* deleted */
        const char *st = j ? cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "status")) : "in_progress";
        int step = running ? live_step : (int)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(j, "steps_done"));
        if (j && (strcmp(st, e->last_status) || step > e->last_step || quiet)) { /* a change, or a keep-alive */
            /* the video object, progress as the model process reports it */
            cJSON *v = e->video ? dl_video_object(j, dl_api_job_model(j), running ? live_step : 0, running ? live_steps : 0,
                                                  dl_api.srv->result_ttl_s) : NULL;
            e->last_step = step > e->last_step ? step : e->last_step;
            snprintf(e->last_status, sizeof e->last_status, "%s", st);
            e->done = strcmp(st, "queued") && strcmp(st, "in_progress");
            if (v) {
                cJSON_Delete(j);
                j = v;
            }
            cJSON_DeleteItemFromObject(j, "result");
            cJSON_DeleteItemFromObject(j, "request");
            char *t = cJSON_PrintUnformatted(j);
            int n = snprintf(buf, max, "event: %s\ndata: %s\n\n", e->done ? e->last_status : "progress", t ? t : "{}");
            free(t);
            cJSON_Delete(j);
            return n < (int)max ? n : (ssize_t)max;
        }
        cJSON_Delete(j);
        struct timespec ts; /* news wakes us (progress, dispatch, completion, cancel); else the keep-alive's time */
        dl_api_wait_until(&ts);
        pthread_mutex_lock(&dl_api.mu);
        if (dl_api.changes == seen) pthread_cond_timedwait(&dl_api.cv, &dl_api.mu, &ts);
        pthread_mutex_unlock(&dl_api.mu);
    }
}

enum MHD_Result dl_api_events(struct MHD_Connection *c, const char *id, int video) {
    sse *e = calloc(1, sizeof *e);
    if (!e) return MHD_NO;
    snprintf(e->id, sizeof e->id, "%s", id);
    e->video = video;
    e->last_step = -1;
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, sse_read, e, free);
    if (!r) {
        free(e);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    return queue(c, 200, r);
}

/* A served model as OpenAI's model object (plus the sizes it serves). */
static cJSON *model_object(const served *sm) {
    const dl_deployment *p = &sm->pr;
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", p->model_id);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)(int64_t)dl_api.started);
    cJSON_AddStringToObject(m, "owned_by", "difflet");
    cJSON *s = cJSON_AddArrayToObject(m, "sizes");
    for (int i = 0; i < p->nsizes; i++) {
        char t[32];
        snprintf(t, sizeof t, "%dx%d", p->sizes[i][0], p->sizes[i][1]);
        cJSON_AddItemToArray(s, cJSON_CreateString(t));
    }
    cJSON_AddStringToObject(m, "output", p->video ? "video" : "image"); /* which API it answers */
    if (p->scheduler[0]) { /* a DDiT world's pool (the web page shows it) */
        cJSON *d = cJSON_AddObjectToObject(m, "ddit");
        pthread_mutex_lock(&dl_api.mu);
        cJSON_AddNumberToObject(d, "units", p->units);
        cJSON_AddNumberToObject(d, "busy", sm->pool_busy);
        cJSON_AddNumberToObject(d, "waiting", sm->pool_waiting);
        cJSON_AddNumberToObject(d, "promotions", (double)sm->pool_promotions);
        pthread_mutex_unlock(&dl_api.mu);
    }
    if (p->video) { /* the lengths served: frame counts, and as `seconds` at the default fps */
        cJSON *f = cJSON_AddArrayToObject(m, "frames"), *sec = cJSON_AddArrayToObject(m, "seconds");
        for (int i = 0; i < p->nframes; i++) {
            char t[32];
            dl_video_seconds(p->frames[i], p->fps, t, sizeof t);
            cJSON_AddItemToArray(f, cJSON_CreateNumber(p->frames[i]));
            cJSON_AddItemToArray(sec, cJSON_CreateString(t));
        }
        cJSON_AddNumberToObject(m, "fps", p->fps);
    }
    return m;
}

/* 200 when every served model has a ready model process, else 503 naming those that
 * have none and why. `models` says it per model; `model_pids` lists every model
 * process (-1: not ready), `model_pid` the first's. */
static enum MHD_Result ready_reply(struct MHD_Connection *c) {
    cJSON *j = cJSON_CreateObject(), *pids = cJSON_CreateArray(), *models = cJSON_CreateArray();
    char reason[1024] = "";
    pthread_mutex_lock(&dl_api.mu);
    int ready = dl_api_all_ready(), pid = (int)dl_api.w[0].pid;
    for (int i = 0; i < dl_api.nworkers; i++) cJSON_AddItemToArray(pids, cJSON_CreateNumber(dl_api.w[i].ready ? (double)dl_api.w[i].pid : -1));
    for (int k = 0; k < dl_api.nmodels; k++) {
        const served *m = &dl_api.m[k];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "id", m->pr.model_id);
        cJSON_AddBoolToObject(o, "ready", dl_api_model_ready(m));
        cJSON *mp = cJSON_AddArrayToObject(o, "model_pids");
        for (int i = m->first; i < m->first + m->n; i++)
            cJSON_AddItemToArray(mp, cJSON_CreateNumber(dl_api.w[i].ready ? (double)dl_api.w[i].pid : -1));
        if (!dl_api_model_ready(m)) {
            const char *why = m->last_error[0] ? m->last_error : "its model process is starting or recovering";
            cJSON_AddStringToObject(o, "reason", why);
            if (dl_api.nmodels == 1) snprintf(reason, sizeof reason, "%s", why);
            else snprintf(reason + strlen(reason), sizeof reason - strlen(reason), "%s`%.60s`: %.300s", reason[0] ? "; " : "",
                          m->pr.model_id, why);
        }
        cJSON_AddItemToArray(models, o);
    }
    pthread_mutex_unlock(&dl_api.mu);
    cJSON_AddBoolToObject(j, "ready", ready);
    cJSON_AddNumberToObject(j, "model_pid", pid);
    cJSON_AddItemToObject(j, "model_pids", pids);
    cJSON_AddItemToObject(j, "models", models);
    if (!ready) cJSON_AddStringToObject(j, "reason", reason);
    return dl_api_json_reply(c, ready ? 200 : 503, j);
}

/* The health listener: /health and /ready only, on its own port and connections. */
static enum MHD_Result health_handler(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                      const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    (void)cls, (void)version, (void)upload, (void)upload_size, (void)con_cls;
    if (strcmp(method, "GET")) return dl_api_error_reply(c, 405, "invalid_request_error", NULL, "only GET /health and GET /ready here");
    if (!strcmp(url, "/health")) return dl_api_json_reply(c, 200, cJSON_Parse("{\"status\":\"ok\"}"));
    if (!strcmp(url, "/ready")) return ready_reply(c);
    return dl_api_error_reply(c, 404, "not_found_error", NULL, "this listener serves /health and /ready only");
}

/* A client's cancel, durable (a cancelled job never runs after a restart; a running
 * job's cancel survives a crash of this process). A queued job is cancelled in the
 * store if it is still queued (the dispatcher may be taking it: one of the two wins);
 * a running one is flagged in the store and its model process is told (the supervisor
 * sends the cancel; the job ends cancelled when the process stops). A job running in
 * the store is always in its model process's slot already (models.c, dispatch_one).
 * 0, or -1 when the store failed. No lock is held across the store's fsyncs. */
static int cancel_job(const char *id) {
    int r = -1;
    if (dl_jobs_begin(dl_api.js, 1) == DL_OK) {
        r = dl_jobs_transition(dl_api.js, id, "queued", "cancelled", "cancelled by the client", NULL);
        if (r < 0 || dl_jobs_commit(dl_api.js) != DL_OK) r = -1, dl_jobs_rollback(dl_api.js);
    }
    if (r == 0) { /* not queued: running, or already over */
        cJSON *j = dl_jobs_get(dl_api.js, id);
        const char *st = j ? cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "status")) : NULL;
        if (st && !strcmp(st, "in_progress")) {
            if (dl_jobs_begin(dl_api.js, 1) == DL_OK) {
                if (dl_jobs_request_cancel(dl_api.js, id) != DL_OK || dl_jobs_commit(dl_api.js) != DL_OK) r = -1, dl_jobs_rollback(dl_api.js);
            } else {
                r = -1;
            }
            dl_api_cancel_running(id); /* even when the store failed: the job stops now */
        }
        cJSON_Delete(j);
    }
    dl_api_notify();
    return r < 0 ? -1 : 0;
}

/* The DNS-rebinding guard: without an API key, a request's Host must be an IP literal,
 * localhost, or a name in allowed_hosts ("*": any). A page on another site whose name
 * an attacker points at this machine would otherwise be same-origin to it and could
 * drive the API from a browser. With a key the key protects the API. HTTP/1.0 without
 * a Host is let through (no browser sends it). */
static int host_allowed(const char *host) {
    const dl_deployment *d = dl_api.srv;
    if (d->api_key[0] || !host) return 1;
    char name[256];
    if (host[0] == '[') { /* an IPv6 literal, [addr] or [addr]:port */
        struct in6_addr a6;
        snprintf(name, sizeof name, "%.*s", (int)strcspn(host + 1, "]"), host + 1);
        return inet_pton(AF_INET6, name, &a6) == 1;
    }
    snprintf(name, sizeof name, "%.*s", (int)strcspn(host, ":"), host);
    struct in_addr a4;
    if (inet_pton(AF_INET, name, &a4) == 1 || !strcasecmp(name, "localhost")) return 1;
    const char *l = d->allowed_hosts;
    while (*l) {
        const size_t n = strcspn(l, ",");
        size_t a = 0, b = n;
        while (a < b && l[a] == ' ') a++;
        while (b > a && l[b - 1] == ' ') b--;
        if (b > a && ((b - a == 1 && l[a] == '*') || (b - a == strlen(name) && !strncasecmp(l + a, name, b - a)))) return 1;
        l += n + (l[n] == ',');
    }
    return 0;
}

/* "Bearer KEY" (the scheme in any case, RFC 7235), the key compared in constant time */
static int authorized(struct MHD_Connection *c) {
    const char *key = dl_api.srv->api_key;
    if (!key[0]) return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncasecmp(h, "Bearer ", 7)) return 0;
    const char *got = h + 7;
    while (*got == ' ') got++;
    size_t n = strlen(key), m = strlen(got);
    unsigned diff = (unsigned)(n ^ m);
    for (size_t i = 0; i < n; i++) diff |= (unsigned char)key[i] ^ (unsigned char)(i < m ? got[i] : 0);
    return diff == 0;
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url, const char *method, const char *version,
                               const char *upload, size_t *upload_size, void **con_cls) {
    (void)cls;
    conn *cn = *con_cls;
    if (!cn) { /* first call: headers only */
        cn = calloc(1, sizeof *cn);
        if (!cn) return MHD_NO;
        cn->t0 = dl_now();
        *con_cls = cn;
        /* a body announced too large is refused before it is read (the listener checked the
           number); image uploads (edits) may be larger than JSON bodies */
        cn->limit = !strcmp(url, "/v1/images/edits") ? MAX_UPLOAD : MAX_BODY;
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > cn->limit)
            return dl_api_error_reply(c, 413, "invalid_request_error", NULL, "the body exceeds %zu bytes", cn->limit);
        /* a body is only read for a client with the key: without it, 401 before the first
           byte of an upload (up to MAX_UPLOAD) is taken into memory */
        if (strcmp(method, "GET") && strcmp(url, "/health") && !authorized(c))
            return dl_api_error_reply(c, 401, "authentication_error", NULL, "a valid `Authorization: Bearer` key is required");
        return MHD_YES;
    }
    if (*upload_size) { /* body pieces */
        if (cn->len + *upload_size > cn->limit) cn->too_big = 1;
        else {
            char *b = realloc(cn->body, cn->len + *upload_size + 1);
            if (!b) return MHD_NO;
            memcpy(b + cn->len, upload, *upload_size);
            cn->body = b;
            cn->len += *upload_size;
            b[cn->len] = 0;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    int get = !strcmp(method, "GET"), post = !strcmp(method, "POST"), del = !strcmp(method, "DELETE");
    enum MHD_Result r;
    if (!strcmp(version, MHD_HTTP_VERSION_1_1) && !MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host"))
        return dl_api_error_reply(c, 400, "invalid_request_error", NULL, "HTTP/1.1 requests need a Host header");
    if (!get && !post && !del)
        return dl_api_error_reply(c, 405, "invalid_request_error", NULL, "method %s is not allowed (GET, POST or DELETE)", method);
    if (!strcmp(url, "/health")) return dl_api_json_reply(c, 200, cJSON_Parse("{\"status\":\"ok\"}"));
    if (dl_api.draining) return dl_api_error_reply(c, 503, "server_error", NULL, "the server is shutting down; retry after its restart");
    if (!host_allowed(MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host")))
        return dl_api_error_reply(c, 403, "invalid_request_error", NULL,
                                  "Host `%.100s` is not one this server answers without an API key (a guard against DNS "
                                  "rebinding): use its IP address or localhost, or list the name in the deployment's "
                                  "allowed_hosts", MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host"));
    if (get && !strcmp(url, "/")) /* the page holds no data: it asks for the key itself */
        return respond(c, 200, "text/html; charset=utf-8", dl_serve_page, strlen(dl_serve_page), NULL, NULL);
    if (post || del) { /* another site's page may not make this server generate, cancel or delete (browsers send Origin) */
        const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
        const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host");
        char self[300];
        snprintf(self, sizeof self, "http://%s", host ? host : "");
        if (origin && strcmp(origin, self))
            return dl_api_error_reply(c, 403, "invalid_request_error", NULL, "cross-origin request from %.200s refused", origin);
    }
    if (!authorized(c) && !(get && signed_content(c, url)))
        return dl_api_error_reply(c, 401, "authentication_error", NULL, "a valid `Authorization: Bearer` key is required");
    if (cn->too_big) return dl_api_error_reply(c, 413, "invalid_request_error", NULL, "the body exceeds %zu bytes", cn->limit);
    if (get && !strcmp(url, "/ready")) return ready_reply(c);
    if (get && !strcmp(url, "/metrics")) return metrics(c);
    if (get && !strcmp(url, "/v1/models")) { /* in the deployment's order: the first is the default */
        cJSON *j = cJSON_CreateObject(), *d = cJSON_AddArrayToObject(j, "data");
        cJSON_AddStringToObject(j, "object", "list");
        for (int k = 0; k < dl_api.nmodels; k++) cJSON_AddItemToArray(d, model_object(&dl_api.m[k]));
        return dl_api_json_reply(c, 200, j);
    }
    if (get && !strncmp(url, "/v1/models/", 11)) {
        const served *m = dl_api_find_model(url + 11);
        if (!m) return dl_api_error_reply(c, 404, "invalid_request_error", "model", "The model `%.200s` does not exist", url + 11);
        return dl_api_json_reply(c, 200, model_object(m));
    }
    if (!strcmp(url, "/v1/videos") || !strncmp(url, "/v1/videos/", 11)) {
        r = dl_api_videos(c, cn, url, get, post, del);
        if (post) observe(dl_now() - cn->t0);
        return r;
    }
    if (del) return dl_api_error_reply(c, 405, "invalid_request_error", NULL, "DELETE is for /v1/videos/ID");
    if (post && !strcmp(url, "/v1/images/generations")) {
        r = generations(c, cn);
        observe(dl_now() - cn->t0);
        return r;
    }
    if (post && !strcmp(url, "/v1/images/edits")) {
        r = dl_api_edits(c, cn->body ? cn->body : "", cn->len);
        observe(dl_now() - cn->t0);
        return r;
    }
    if (post && !strcmp(url, "/v1/jobs")) {
        cJSON *req;
        img_opts o;
        char err[1024], param[64];
        param[0] = 0;
        cJSON *body = dl_api_parse_json_body(cn->body ? cn->body : "", cn->len);
        if (!body) snprintf(err, sizeof err, "the body is not valid JSON: %s", dl_last_error());
        if (!body || !dl_api_validate_images(body, &req, &o, err, sizeof err, param, sizeof param))
            return dl_api_error_reply(c, strcmp(param, "model") || !strstr(err, "does not exist") ? 400 : 404, "invalid_request_error", param[0] ? param : NULL, "%s", err);
        if (o.stream) {
            cJSON_Delete(req);
            return dl_api_error_reply(c, 400, "invalid_request_error", "stream",
                                      "a job streams its progress from GET /v1/jobs/ID/events: leave `stream` out");
        }
        if (o.n != 1) {
            cJSON_Delete(req);
            return dl_api_error_reply(c, 400, "invalid_request_error", "n", "a job makes one image: `n` must be 1");
        }
        char ids[1][24];
        int ok = dl_api_enqueue(o.model, req, 1, ids, "image");
        cJSON_Delete(req);
        if (ok < 0) return dl_api_error_reply(c, 500, "server_error", NULL, "the job store could not record the job: %s", dl_last_error());
        if (!ok)
            return dl_api_error_reply(c, 429, "rate_limit_error", NULL, "the queue of `%s` is full (%d jobs); retry later",
                                      o.model->pr.model_id, o.model->pr.queue_capacity);
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "id", ids[0]);
        /* the place, then the state: an idle model process may have taken it already
         * (read in this order, a job that says `queued` has a place) */
        int pos = dl_jobs_position(dl_api.js, ids[0]);
        cJSON *cur = dl_jobs_get(dl_api.js, ids[0]);
        const char *st = cur ? cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(cur, "status")) : NULL;
        cJSON_AddStringToObject(j, "status", st ? st : "queued");
        if (pos) cJSON_AddNumberToObject(j, "queue_position", pos); /* 0: not queued; omitted, as GET does */
        cJSON_Delete(cur);
        return dl_api_json_reply(c, 202, j);
    }
    if (!strncmp(url, "/v1/jobs/", 9)) {
        char id[64], tail[64] = "";
        const char *at = url + 9 + (strncmp(url + 9, "video_", 6) ? 0 : 6); /* a video's id names its job too */
        if (sscanf(at, "%63[0-9a-f]%63s", id, tail) < 1 || strlen(id) != 16)
            return dl_api_error_reply(c, 404, "not_found_error", NULL, "no such job");
        cJSON *j = dl_jobs_get(dl_api.js, id);
        int pos = j ? dl_jobs_position(dl_api.js, id) : 0;
        if (!j) return dl_api_error_reply(c, 404, "not_found_error", NULL, "no job %s", id);
        /* the status outlives j: replies below are formatted after j is freed */
        char st[32];
        snprintf(st, sizeof st, "%s", cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "status")) ?: "unknown");
        if (get && !tail[0]) {
            cJSON_DeleteItemFromObject(j, "result"); /* a server path: not for clients */
            cJSON *rq = cJSON_GetObjectItemCaseSensitive(j, "request");
            for (int k = 0; k < 2; k++) { /* an edit's input pictures (megabytes of base64): their sizes only */
                const char *name = k ? "mask" : "image";
                cJSON *pic = cJSON_GetObjectItemCaseSensitive(rq, name);
                if (!cJSON_IsString(pic)) continue;
                char note[64];
                snprintf(note, sizeof note, "(a PNG, %zu bytes of base64)", strlen(pic->valuestring));
                cJSON_ReplaceItemInObjectCaseSensitive(rq, name, cJSON_CreateString(note));
            }
            if (pos) cJSON_AddNumberToObject(j, "queue_position", pos);
            return dl_api_json_reply(c, 200, j);
        }
        if (get && !strcmp(tail, "/events")) {
            cJSON_Delete(j);
            return dl_api_events(c, id, 0);
        }
        if (get && !strcmp(tail, "/content")) {
            const char *path = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "result"));
            const char *ext = path ? strrchr(path, '.') : NULL; /* path lives in j */
            const char *type = ext && !strcmp(ext, ".jpg") ? "image/jpeg" : ext && !strcmp(ext, ".webp") ? "image/webp"
                               : ext && !strcmp(ext, ".mp4") ? "video/mp4" : "image/png";
            int ok = 0;
            r = !strcmp(st, "completed") && path ? dl_api_file_reply(c, path, type, &ok) : MHD_NO;
            cJSON_Delete(j);
            return ok ? r : dl_api_error_reply(c, 404, "not_found_error", NULL, "job %s has no content (status %s)", id, st);
        }
        if (post && !strcmp(tail, "/cancel")) {
            cJSON_Delete(j);
            j = NULL;
            if (cancel_job(id) < 0 || !(j = dl_jobs_get(dl_api.js, id)))
                return dl_api_error_reply(c, 500, "server_error", NULL, "the job store could not record the cancel: %s", dl_last_error());
            cJSON_DeleteItemFromObject(j, "result");
            return dl_api_json_reply(c, 200, j);
        }
        cJSON_Delete(j);
        static const char *const job_tails[][2] = {{"", "GET"}, {"/events", "GET"}, {"/content", "GET"}, {"/cancel", "POST"}};
        for (size_t k = 0; k < sizeof job_tails / sizeof job_tails[0]; k++)
            if (!strcmp(tail, job_tails[k][0]))
                return dl_api_error_reply(c, 405, "invalid_request_error", NULL, "%s is not allowed on %.100s (%s)", method, url,
                                          job_tails[k][1]);
    }
    /* a route that exists with another method: 405, naming the one it takes */
    static const char *const routes[][2] = {{"/v1/images/generations", "POST"}, {"/v1/images/edits", "POST"}, {"/v1/jobs", "POST"},
                                            {"/v1/models", "GET"}, {"/ready", "GET"}, {"/metrics", "GET"}, {"/", "GET"}};
    for (size_t k = 0; k < sizeof routes / sizeof routes[0]; k++)
        if (!strcmp(url, routes[k][0]))
            return dl_api_error_reply(c, 405, "invalid_request_error", NULL, "%s is not allowed on %s (%s)", method, url, routes[k][1]);
    return dl_api_error_reply(c, 404, "not_found_error", NULL, "no route %s %s", method, url);
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)cls, (void)c, (void)toe;
    conn *cn = *con_cls;
    if (cn) free(cn->body), free(cn);
    *con_cls = NULL;
}

/* a listener and its daemon, in that order (either may be NULL) */
static void stop_http(dl_listener *l, struct MHD_Daemon *d) {
    if (l) dl_listener_stop(l);
    if (d) MHD_stop_daemon(d);
    dl_listener_free(l);
}

static volatile sig_atomic_t g_stop;
static void on_signal(int s) {
    (void)s;
    g_stop = 1;
}

/* Each served model: its registry entry and request defaults, its tokenizer (image
 * models), its model processes, and the deployment file they read beside the store
 * (`profile.json` for the first model, `profile-K.json` for model K). 0 when a file
 * could not be written. */
static int setup_models(void) {
    for (int k = 0; k < dl_api.nmodels; k++) {
        served *m = &dl_api.m[k];
        if (dl_registry_lookup(m->pr.model, &m->entry) != DL_OK) m->entry = NULL; /* its model process says why */
        else dl_registry_defaults(m->entry, m->pr.model, &m->defaults);
        if (!m->pr.video) load_tokenizer(m);
        m->first = dl_api.nworkers;
        m->n = m->pr.replicas < 1 ? 1 : m->pr.replicas;
        DL_ASSERT(m->first + m->n <= MAX_WORKERS); /* dl_serve_config_check */
        const int slots = m->pr.scheduler[0] ? (2 * m->pr.units < MAX_SLOTS ? 2 * m->pr.units : MAX_SLOTS) : 1;
        for (int i = m->first; i < m->first + m->n; i++)
            dl_api.w[i] = (worker){.model = k, .fd = -1, .pid = -1, .backoff = 0.5, .nslots = slots};
        dl_api.nworkers += m->n;
        if (k) snprintf(m->profile_path, sizeof m->profile_path, "%.1000s/profile-%d.json", m->pr.results, k);
        else snprintf(m->profile_path, sizeof m->profile_path, "%.1000s/profile.json", m->pr.results);
        cJSON *pj = dl_deployment_to_json(&m->pr);
        cJSON_DeleteItemFromObjectCaseSensitive(pj, "api_key"); /* the model processes never need it: not on disk */
        char *pt = cJSON_Print(pj);
        dl_status s = pt ? dl_file_write_atomic(m->profile_path, pt, strlen(pt)) : dl_fail(DL_ERR_NOMEM, "out of memory");
        free(pt), cJSON_Delete(pj);
        if (s != DL_OK) {
            fprintf(stderr, "difflet: serve: %s\n", dl_last_error());
            return 0;
        }
    }
    return 1;
}

/* The job store after a restart: interrupted jobs back in the queue; jobs from a
 * store that kept no model go to the first served model of their kind; queued jobs
 * for a model no longer served fail, saying so. */
static void recover_jobs(void) {
    int requeued = dl_jobs_recover(dl_api.js, dl_api.srv->result_ttl_s);
    if (requeued) DL_INFO("serve: %d interrupted jobs back in the queue", requeued);
    for (int video = 0; video < 2; video++) {
        const served *m = dl_api_route(NULL, video, NULL, 0);
        if (m->pr.video == video) dl_jobs_adopt(dl_api.js, video ? "video" : "image", m->pr.model_id);
    }
    const char *ids[DL_SERVE_MAX_MODELS];
    for (int k = 0; k < dl_api.nmodels; k++) ids[k] = dl_api.m[k].pr.model_id;
    int gone = dl_jobs_fail_unserved(dl_api.js, ids, dl_api.nmodels);
    if (gone) DL_WARN("serve: %d queued jobs were for models this server does not serve: they failed", gone);
}

int dl_serve_api_main(const dl_serve_config *cfg, const char *self_exe) {
    memset(&dl_api, 0, sizeof dl_api);
    dl_api.nmodels = cfg->nmodels;
    for (int k = 0; k < cfg->nmodels; k++) dl_api.m[k].pr = cfg->models[k];
    dl_api.srv = &dl_api.m[0].pr;
    dl_api.exe = self_exe;
    pthread_mutex_init(&dl_api.mu, NULL);
    pthread_cond_init(&dl_api.cv, NULL);
    if (pipe(dl_api.wake) != 0 || fcntl(dl_api.wake[0], F_SETFL, O_NONBLOCK) != 0 || fcntl(dl_api.wake[1], F_SETFL, O_NONBLOCK) != 0) {
        fprintf(stderr, "difflet: serve: pipe: %s\n", strerror(errno));
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);
    if (getrandom(dl_api.url_key, sizeof dl_api.url_key, 0) != sizeof dl_api.url_key) {
        fprintf(stderr, "difflet: serve: no random bytes for signing URLs\n");
        return 1;
    }
    dl_api.started = wall();
    const dl_deployment *pr = dl_api.srv;
    if (dl_mkdir_p(pr->results) != DL_OK || dl_jobs_open(&dl_api.js, pr->db) != DL_OK) {
        fprintf(stderr, "difflet: serve: %s\n", dl_last_error());
        return 1;
    }
    if (!setup_models()) {
        dl_jobs_close(dl_api.js);
        return 1;
    }
    recover_jobs();
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)pr->port)};
    if (inet_pton(AF_INET, pr->host, &addr.sin_addr) != 1) {
        fprintf(stderr, "difflet: serve: host %s is not an IPv4 address\n", pr->host);
        return 1;
    }
    /* The listeners (listen.c) accept and check each request; libmicrohttpd serves the
       well-formed ones they hand over, one request per connection. A connection whose
       request has not all come within idle_timeout_s closes (408 when it sent part of
       one); one client address holds at most max_connections_per_ip of max_connections
       (the listener's limits: libmicrohttpd's are only a backstop). */
    const unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_NO_LISTEN_SOCKET | MHD_USE_ITC | MHD_USE_ERROR_LOG;
    dl_listener *api_l = dl_listener_new(pr->max_connections, pr->max_connections_per_ip, pr->idle_timeout_s), *health_l = NULL;
    struct MHD_Daemon *d = !api_l ? NULL
                           : MHD_start_daemon(flags | MHD_USE_THREAD_PER_CONNECTION, 0, NULL, NULL, handler, NULL, MHD_OPTION_NOTIFY_COMPLETED,
                                              completed, NULL, MHD_OPTION_NOTIFY_CONNECTION, dl_listener_notify, api_l,
                                              MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)pr->idle_timeout_s, MHD_OPTION_CONNECTION_LIMIT,
                                              (unsigned)(2 * pr->max_connections + 16), MHD_OPTION_CONNECTION_MEMORY_LIMIT,
                                              (size_t)DL_LISTEN_MHD_POOL, MHD_OPTION_END);
    struct MHD_Daemon *hd = NULL;
    int ok = d && dl_listener_start(api_l, d, &addr);
    if (!ok) fprintf(stderr, "difflet: serve: cannot listen on %s:%d\n", pr->host, pr->port);
    if (ok && pr->health_port >= 0) { /* /health and /ready on their own connections */
        struct sockaddr_in ha = addr;
        ha.sin_port = htons((uint16_t)pr->health_port);
        health_l = dl_listener_new(64, 64, 5);
        hd = !health_l ? NULL
                       : MHD_start_daemon(flags, 0, NULL, NULL, health_handler, NULL, MHD_OPTION_NOTIFY_CONNECTION, dl_listener_notify,
                                          health_l, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)5, MHD_OPTION_CONNECTION_LIMIT, (unsigned)144,
                                          MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)DL_LISTEN_MHD_POOL, MHD_OPTION_END);
        ok = hd && dl_listener_start(health_l, hd, &ha);
        if (!ok) fprintf(stderr, "difflet: serve: cannot listen for health checks on %s:%d\n", pr->host, pr->health_port);
    }
    if (!ok) {
        stop_http(health_l, hd);
        stop_http(api_l, d);
        dl_jobs_close(dl_api.js);
        return 1;
    }
    char names[2400] = "";
    for (int k = 0; k < dl_api.nmodels; k++)
        snprintf(names + strlen(names), sizeof names - strlen(names), "%s%.1000s", k ? ", " : "", dl_api.m[k].pr.model);
    printf("difflet serve: listening on http://%s:%d (model%s %s)\n", pr->host, dl_listener_port(api_l), dl_api.nmodels > 1 ? "s" : "",
           names);
    if (hd) printf("difflet serve: health checks on http://%s:%d/health\n", pr->host, dl_listener_port(health_l));
    fflush(stdout);
    pthread_t sup;
    pthread_create(&sup, NULL, dl_api_supervisor, NULL);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    while (!g_stop) usleep(100000);
    DL_INFO("serve: stopping");
    /* waiting requests and open streams answer first (their jobs stay in the store and
       run after a restart), then the listeners stop */
    pthread_mutex_lock(&dl_api.mu);
    dl_api.draining = 1;
    dl_api_notify_locked();
    pthread_mutex_unlock(&dl_api.mu);
    usleep(500000);
    stop_http(health_l, hd);
    stop_http(api_l, d);
    pthread_mutex_lock(&dl_api.mu);
    dl_api.stopping = 1;
    pthread_mutex_unlock(&dl_api.mu);
    pthread_join(sup, NULL);
    dl_jobs_close(dl_api.js);
    for (int k = 0; k < dl_api.nmodels; k++) dl_tokenizer_free(dl_api.m[k].tok);
    return 0;
}
