/* The API process of `difflet serve` (Difflet §6): HTTP (libmicrohttpd), request
 * validation and routing (a request's `model` picks one of the served models,
 * models.c), a bounded queue per model kept in SQLite (an accepted job is never
 * lost), the images and jobs routes, metrics, readiness, and start-up: each served
 * model's set-up and the job store's recovery before the supervisor (models.c) starts
 * the model processes. */
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

api dl_api; /* the API process's one state (api_impl.h) */
static const double k_buckets[NBUCKETS] = {0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 120};

static double wall(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- HTTP ------------------------------------------------------------------------ */



static enum MHD_Result respond(struct MHD_Connection *c, int status, const char *type, const void *body, size_t len,
                               const char *extra_hdr, const char *extra_val) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    MHD_add_response_header(r, "Content-Type", type);
    if (extra_hdr) MHD_add_response_header(r, extra_hdr, extra_val);
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    pthread_mutex_lock(&dl_api.mu);
    if (status >= 0 && status < 600) dl_api.requests[status]++;
    pthread_mutex_unlock(&dl_api.mu);
    return ret;
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
    enum MHD_Result ret = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    pthread_mutex_lock(&dl_api.mu);
    dl_api.requests[200]++;
    pthread_mutex_unlock(&dl_api.mu);
    return ret;
}

enum MHD_Result dl_api_error_reply(struct MHD_Connection *c, int status, const char *type, const char *param,
                                   const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    cJSON *j = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(j, "error");
    cJSON_AddStringToObject(e, "message", msg);
    cJSON_AddStringToObject(e, "type", type);
    if (param) cJSON_AddStringToObject(e, "param", param);
    else cJSON_AddNullToObject(e, "param");
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
    cJSON_AddStringToObject(e, "code", code);
    if (status == 429) {
        char *t = cJSON_PrintUnformatted(j);
        enum MHD_Result r = respond(c, status, "application/json", t, strlen(t), "Retry-After", "2");
        free(t);
        cJSON_Delete(j);
        return r;
    }
    return dl_api_json_reply(c, status, j);
}

/* one JSON value and nothing after it, or NULL */
cJSON *dl_api_parse_json_body(const char *body, size_t len) {
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    while (j && end && end < body + len && strchr(" \t\r\n", *end)) end++;
    if (j && end && end < body + len) {
        cJSON_Delete(j);
        j = NULL;
    }
    return j;
}

/* What an images request asks of the answer beyond the typed request: OpenAI's
 * parameters that shape the response, not the picture. */
typedef struct {
    const served *model; /* the model it asked for */
    int n, b64;
    char quality[8];  /* what the step count stands for ("low", "medium", "high"); "" when `steps` was given */
    char safety[260]; /* safety_identifier, else user; "" when neither */
} img_opts;

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
static int validate(const char *body, size_t len, cJSON **norm, img_opts *o, char *err, size_t en, char *param, size_t pn) {
    cJSON *j = dl_api_parse_json_body(body, len);
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
    if (!j) FAIL("", "the body is not valid JSON");
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
    if (cJSON_IsTrue(v))
        FAIL("stream", "`stream: true` (partial image events) is not supported by this server; leave it out or set it false");
    if ((v = GET("partial_images")) && (!cJSON_IsNumber(v) || v->valuedouble != (int)v->valuedouble || v->valuedouble < 0 || v->valuedouble > 3))
        FAIL("partial_images", "`partial_images` must be an integer from 0 to 3");
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
 * record them (nothing was accepted). */
int dl_api_enqueue(const served *m, cJSON *req, int n, char ids[][24], const char *kind) {
    pthread_mutex_lock(&dl_api.mu);
    int queued = dl_jobs_count(dl_api.js, "queued", m->pr.model_id);
    if (queued + n > m->pr.queue_capacity) {
        pthread_mutex_unlock(&dl_api.mu);
        return 0;
    }
    const cJSON *given = cJSON_GetObjectItemCaseSensitive(req, "seed");
    double seed = cJSON_IsNumber(given) ? given->valuedouble : -1;
    int ok = dl_jobs_begin(dl_api.js, 1) == DL_OK; /* the whole request is accepted with one durable commit */
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
        pthread_mutex_unlock(&dl_api.mu);
        return -1;
    }
    pthread_cond_broadcast(&dl_api.cv);
    if (write(dl_api.wake[1], "j", 1) < 0) {} /* full pipe: the supervisor is awake anyway */
    pthread_mutex_unlock(&dl_api.mu);
    return 1;
}

static char *b64(const uint8_t *d, size_t n) {
    static const char *t = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char *o = malloc(4 * ((n + 2) / 3) + 1), *p = o;
    if (!o) return NULL;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)d[i] << 16 | (i + 1 < n ? (uint32_t)d[i + 1] << 8 : 0) | (i + 2 < n ? d[i + 2] : 0);
        *p++ = t[v >> 18], *p++ = t[(v >> 12) & 63];
        *p++ = i + 1 < n ? t[(v >> 6) & 63] : '=';
        *p++ = i + 2 < n ? t[v & 63] : '=';
    }
    *p = 0;
    return o;
}

/* The web page: ids are looked up explicitly (window.prompt and window.status are
 * built-ins that named access would not override). With several models, a model
 * picker (`?model=ID` preselects one). A video model (the model object's `output`)
 * gets a length choice, POST /v1/videos, and a <video> player. */
static const char *PAGE =
    "<!doctype html><html><head><meta charset=utf-8><title>difflet</title><style>"
    "body{font-family:sans-serif;max-width:640px;margin:2em auto}input,select{margin:.2em}"
    "#bar{height:10px;background:#4a7;width:0}#wrap{border:1px solid #999;width:100%}img,video{image-rendering:pixelated;width:256px}"
    "</style></head><body><h1>difflet</h1><form id=form>"
    "<input id=q_prompt size=60 value='a large red circle in the centre on a blue background'><br>"
    "<span id=q_mwrap hidden>model <select id=q_model></select></span> size <select id=q_size></select> <span id=q_len hidden>length <select id=q_frames></select></span> "
    "steps <input id=q_steps type=number value=20 min=1 size=4> "
    "seed <input id=q_seed type=number value=1 size=6> cache <select id=q_cache><option>off<option>cadence:2"
    "<option>online-delta</select> <button>Generate</button><br>"
    "API key <input id=q_key type=password size=24 placeholder='(none)'> <small>kept in this browser</small></form>"
    "<div id=wrap><div id=bar></div></div><p id=q_status></p><img id=q_img alt=''>"
    "<video id=q_video controls loop hidden></video>"
    "<script>const $=i=>document.getElementById(i);let V=0;"
    /* a key given as #key=... is stored and taken out of the address bar */
    "const hk=new URLSearchParams(location.hash.slice(1)).get('key');"
    "if(hk){localStorage.setItem('difflet_key',hk);history.replaceState(null,'',location.pathname+location.search)}"
    "$('q_key').value=localStorage.getItem('difflet_key')||'';"
    "$('q_key').onchange=()=>localStorage.setItem('difflet_key',$('q_key').value);"
    "const H=()=>{const k=$('q_key').value;return k?{'Authorization':'Bearer '+k,'Content-Type':'application/json'}"
    ":{'Content-Type':'application/json'}};"
    "const api=(u,o)=>fetch(u,Object.assign({headers:H()},o||{}));"
    "const opt=(sel,v,t)=>{const o=document.createElement('option');o.value=v;o.textContent=t;$(sel).appendChild(o)};"
    /* the chosen model's sizes, and for a video model its lengths */
    "let M=[];const pick=()=>{const d=M[$('q_model').selectedIndex]||M[0];$('q_size').textContent='';$('q_frames').textContent='';"
    "for(const s of d.sizes)opt('q_size',s,s);V=d.output=='video';$('q_len').hidden=!V;"
    "if(V)d.frames.forEach((f,i)=>opt('q_frames',f,d.seconds[i]+' s ('+f+' frames)'))};"
    "api('/v1/models').then(r=>r.json()).then(m=>{if(!m.data){$('q_status').textContent=m.error.message;return}"
    "M=m.data;for(const d of M)opt('q_model',d.id,d.id+' ('+d.output+')');$('q_mwrap').hidden=M.length<2;"
    "const w=new URLSearchParams(location.search).get('model');if(w)$('q_model').value=w;"
    "$('q_model').onchange=pick;pick();"
    "if(location.search.includes('autorun'))$('form').requestSubmit()});"
    /* a finished video plays from its content route (as a blob when a key is needed) */
    "const result=id=>{$('q_img').hidden=V;$('q_video').hidden=!V;"
    "if(!V){api('/v1/jobs/'+id+'/content').then(r=>r.blob()).then(b=>{$('q_img').src=URL.createObjectURL(b)});return}"
    "const u='/v1/videos/'+id+'/content';"
    "if(!$('q_key').value)$('q_video').src=u;else api(u).then(r=>r.blob()).then(b=>{$('q_video').src=URL.createObjectURL(b)})};"
    "const show=(id,s)=>{$('bar').style.width=s.progress+'%';$('q_status').textContent=s.status+' '+s.steps_done+'/'+s.steps;"
    "if(s.status=='completed'){result(id);return 1}"
    "if(s.status=='failed'||s.status=='cancelled'){$('q_status').textContent=s.status+': '+(s.error||'');return 1}return 0};"
    "$('form').onsubmit=async e=>{e.preventDefault();$('q_status').textContent='queued';$('bar').style.width='0';"
    "const b={prompt:$('q_prompt').value,model:$('q_model').value,size:$('q_size').value,steps:+$('q_steps').value,"
    "seed:+$('q_seed').value,cache:$('q_cache').value};if(V)b.frames=+$('q_frames').value;"
    "const r=await api(V?'/v1/videos':'/v1/jobs',{method:'POST',body:JSON.stringify(b)});const j=await r.json();"
    "if(!r.ok){$('q_status').textContent=j.error.message;return}"
    /* without a key: server-sent events; with one (EventSource sends no headers): polling.
       A video's id names its job on /v1/jobs too. */
    "if(!$('q_key').value){const ev=new EventSource('/v1/jobs/'+j.id+'/events');"
    "for(const k of ['progress','completed','failed','cancelled'])ev.addEventListener(k,m=>{if(show(j.id,JSON.parse(m.data)))ev.close()})}"
    "else{const poll=async()=>{const s=await (await api('/v1/jobs/'+j.id)).json();if(!show(j.id,s))setTimeout(poll,250)};poll()}}"
    "</script></body></html>";

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
 * restarts (label `model`: its id) */
static enum MHD_Result metrics(struct MHD_Connection *c) {
    textbuf tb = {malloc(16384), 0, 16384};
    pthread_mutex_lock(&dl_api.mu);
    int depth = dl_jobs_count(dl_api.js, "queued", NULL), inflight = 0;
    for (int k = 0; k < dl_api.nmodels; k++) inflight += dl_api_inflight(&dl_api.m[k]);
#define P(...) tb_printf(&tb, __VA_ARGS__)
    P("# TYPE difflet_requests_total counter\n");
    for (int s = 100; s < 600; s++)
        if (dl_api.requests[s]) P("difflet_requests_total{status=\"%d\"} %ld\n", s, dl_api.requests[s]);
    P("# TYPE difflet_request_duration_seconds histogram\n");
    long cum = 0;
    for (int b = 0; b < NBUCKETS; b++) {
        cum += dl_api.dur_bucket[b];
        P("difflet_request_duration_seconds_bucket{le=\"%g\"} %ld\n", k_buckets[b], cum);
    }
    P("difflet_request_duration_seconds_bucket{le=\"+Inf\"} %ld\n", dl_api.dur_count);
    P("difflet_request_duration_seconds_sum %.6f\ndifflet_request_duration_seconds_count %ld\n", dl_api.dur_sum, dl_api.dur_count);
    P("# TYPE difflet_queue_wait_seconds summary\ndifflet_queue_wait_seconds_sum %.6f\ndifflet_queue_wait_seconds_count %ld\n",
      dl_api.wait_sum, dl_api.wait_count);
    P("# TYPE difflet_queue_depth gauge\ndifflet_queue_depth %d\n", depth);
    P("# TYPE difflet_inflight gauge\ndifflet_inflight %d\n", inflight);
    P("# TYPE difflet_denoise_steps_total counter\ndifflet_denoise_steps_total{cached=\"false\"} %ld\n"
      "difflet_denoise_steps_total{cached=\"true\"} %ld\n", dl_api.steps_full, dl_api.steps_cached);
    P("# TYPE difflet_model_restarts_total counter\ndifflet_model_restarts_total %ld\n", dl_api.restarts);
    P("# TYPE difflet_ready gauge\ndifflet_ready %d\n", dl_api_all_ready());
    static const char *const per_model[] = {"difflet_model_queue_depth gauge", "difflet_model_inflight gauge",
                                            "difflet_model_process_restarts_total counter", "difflet_model_ready gauge"};
    for (int f = 0; f < 4; f++) {
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)strcspn(per_model[f], " "), per_model[f]);
        P("# TYPE %s\n", per_model[f]);
        for (int k = 0; k < dl_api.nmodels; k++) {
            const served *m = &dl_api.m[k];
            long v = f == 0 ? dl_jobs_count(dl_api.js, "queued", m->pr.model_id) : f == 1 ? dl_api_inflight(m)
                     : f == 2 ? m->restarts : dl_api_model_ready(m);
            P("%s{model=\"%s\"} %ld\n", name, m->pr.model_id, v);
        }
    }
#undef P
    pthread_mutex_unlock(&dl_api.mu);
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
    cJSON *req;
    img_opts o;
    char err[1024], param[64];
    if (!validate(cn->body ? cn->body : "", cn->len, &req, &o, err, sizeof err, param, sizeof param))
        return dl_api_error_reply(c, strcmp(param, "model") || !strstr(err, "does not exist") ? 400 : 404, "invalid_request_error", param[0] ? param : NULL, "%s", err);
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
    cJSON *out = cJSON_CreateObject(), *data = cJSON_AddArrayToObject(out, "data");
    cJSON_AddNumberToObject(out, "created", (double)(int64_t)wall());
    for (int i = 0; i < n; i++) {
        pthread_mutex_lock(&dl_api.mu);
        cJSON *j = NULL;
        const char *st = NULL;
        for (;;) { /* wait for this job to finish */
            cJSON_Delete(j);
            j = dl_jobs_get(dl_api.js, ids[i]);
            st = j ? cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "status")) : "failed";
            if (strcmp(st, "queued") && strcmp(st, "in_progress")) break;
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 200000000;
            if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
            pthread_cond_timedwait(&dl_api.cv, &dl_api.mu, &ts);
        }
        pthread_mutex_unlock(&dl_api.mu);
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
                char *enc = b64((const uint8_t *)data_bytes, len);
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
    /* what was made: never transparent (no alpha channel), the format written, the
       quality the step count stood for (absent when `steps` was given), the size */
    char size[32];
    snprintf(size, sizeof size, "%dx%d", (int)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(req, "width")),
             (int)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(req, "height")));
    cJSON_AddStringToObject(out, "background", "opaque");
    cJSON_AddStringToObject(out, "output_format", cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(req, "output_format")));
    if (o.quality[0]) cJSON_AddStringToObject(out, "quality", o.quality);
    cJSON_AddStringToObject(out, "size", size);
    if (o.safety[0]) cJSON_AddStringToObject(out, "safety_identifier", o.safety);
    /* usage: the prompt's text tokens (counted once per request, as OpenAI counts
       them); no input images; the output is pixels, not tokens */
    int tokens = prompt_tokens(o.model, cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(req, "prompt")));
    cJSON *u = cJSON_AddObjectToObject(out, "usage");
    cJSON_AddNumberToObject(u, "input_tokens", tokens);
    cJSON *ud = cJSON_AddObjectToObject(u, "input_tokens_details");
    cJSON_AddNumberToObject(ud, "text_tokens", tokens);
    cJSON_AddNumberToObject(ud, "image_tokens", 0);
    cJSON_AddNumberToObject(u, "output_tokens", 0);
    cJSON_AddNumberToObject(u, "total_tokens", tokens);
    cJSON_Delete(req);
    return dl_api_json_reply(c, 200, out);
}

/* Server-Sent Events: one `progress` event per denoising step (pushed from what the
 * model process reports: the stream sleeps on the server's condition variable, it
 * does not poll the store), one per status change, and the final status as the
 * last event. A keep-alive repeats the state after 3 s without news. The callback
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
    pthread_mutex_lock(&dl_api.mu);
    const double since = wall();
    for (;;) {
        const int quiet = wall() - since >= 3.0; /* time for a keep-alive */
        const worker *w = NULL;
        for (int i = 0; i < dl_api.nworkers && !w; i++)
            if (!strcmp(dl_api.w[i].inflight, e->id)) w = &dl_api.w[i];
        if (w && w->live_step > e->last_step && !strcmp(e->last_status, "in_progress")) {
            /* running: an event for every step done since the last one sent */
            size_t n = 0;
            while (e->last_step < w->live_step && n + 256 < max) {
                int st = ++e->last_step, pc = w->live_steps ? 100 * st / w->live_steps : 0;
                if (e->video) /* the video object's fields that change while it runs */
                    n += (size_t)snprintf(buf + n, max - n,
                                          "event: progress\ndata: {\"id\":\"video_%s\",\"object\":\"video\",\"status\":\"in_progress\","
                                          "\"progress\":%d,\"steps_done\":%d,\"steps\":%d}\n\n",
                                          e->id, pc < 99 ? pc : 99, st, w->live_steps);
                else
                    n += (size_t)snprintf(buf + n, max - n,
                                          "event: progress\ndata: {\"id\":\"%s\",\"status\":\"in_progress\",\"steps_done\":%d,"
                                          "\"steps\":%d,\"progress\":%d}\n\n",
                                          e->id, st, w->live_steps, pc);
            }
            pthread_mutex_unlock(&dl_api.mu);
            return (ssize_t)n;
        }
        cJSON *j = NULL;
        int idle_run = w && !strcmp(e->last_status, "in_progress") && w->live_step == e->last_step && !quiet;
        if (!idle_run && !(j = dl_jobs_get(dl_api.js, e->id))) { /* running with no news: no store read */
            pthread_mutex_unlock(&dl_api.mu);
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        const char *st = j ? cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "status")) : "in_progress";
        int step = w ? w->live_step : (int)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(j, "steps_done"));
        if (j && (strcmp(st, e->last_status) || step > e->last_step || quiet)) { /* a change, or a keep-alive */
            /* the video object, progress as the model process reports it */
            cJSON *v = e->video ? dl_video_object(j, dl_api_job_model(j), w ? w->live_step : 0, w ? w->live_steps : 0,
                                                  dl_api.srv->result_ttl_s) : NULL;
            pthread_mutex_unlock(&dl_api.mu);
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
        struct timespec ts; /* news wakes us (progress, dispatch, completion, cancel); else 1 s */
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 1;
        pthread_cond_timedwait(&dl_api.cv, &dl_api.mu, &ts);
    }
}

enum MHD_Result dl_api_events(struct MHD_Connection *c, const char *id, int video) {
    sse *e = calloc(1, sizeof *e);
    if (!e) return MHD_NO;
    snprintf(e->id, sizeof e->id, "%s", id);
    e->video = video;
    e->last_step = -1;
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, sse_read, e, free);
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    enum MHD_Result ret = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return ret;
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
        return MHD_YES;
    }
    if (*upload_size) { /* body pieces */
        if (cn->len + *upload_size > MAX_BODY) cn->too_big = 1;
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
    if (get && !strcmp(url, "/")) /* the page holds no data: it asks for the key itself */
        return respond(c, 200, "text/html; charset=utf-8", PAGE, strlen(PAGE), NULL, NULL);
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
    if (cn->too_big) return dl_api_error_reply(c, 413, "invalid_request_error", NULL, "the body exceeds %d bytes", MAX_BODY);
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
    if (post && !strcmp(url, "/v1/jobs")) {
        cJSON *req;
        img_opts o;
        char err[1024], param[64];
        if (!validate(cn->body ? cn->body : "", cn->len, &req, &o, err, sizeof err, param, sizeof param))
            return dl_api_error_reply(c, strcmp(param, "model") || !strstr(err, "does not exist") ? 400 : 404, "invalid_request_error", param[0] ? param : NULL, "%s", err);
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
        pthread_mutex_lock(&dl_api.mu); /* the state now: an idle model process may have taken it already */
        cJSON *cur = dl_jobs_get(dl_api.js, ids[0]);
        const char *st = cur ? cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(cur, "status")) : NULL;
        cJSON_AddStringToObject(j, "status", st ? st : "queued");
        cJSON_AddNumberToObject(j, "queue_position", dl_jobs_position(dl_api.js, ids[0]));
        pthread_mutex_unlock(&dl_api.mu);
        cJSON_Delete(cur);
        return dl_api_json_reply(c, 202, j);
    }
    if (!strncmp(url, "/v1/jobs/", 9)) {
        char id[64], tail[64] = "";
        const char *at = url + 9 + (strncmp(url + 9, "video_", 6) ? 0 : 6); /* a video's id names its job too */
        if (sscanf(at, "%63[0-9a-f]%63s", id, tail) < 1 || strlen(id) != 16)
            return dl_api_error_reply(c, 404, "not_found_error", NULL, "no such job");
        pthread_mutex_lock(&dl_api.mu);
        cJSON *j = dl_jobs_get(dl_api.js, id);
        int pos = j ? dl_jobs_position(dl_api.js, id) : 0;
        pthread_mutex_unlock(&dl_api.mu);
        if (!j) return dl_api_error_reply(c, 404, "not_found_error", NULL, "no job %s", id);
        /* the status outlives j: replies below are formatted after j is freed */
        char st[32];
        snprintf(st, sizeof st, "%s", cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "status")) ?: "unknown");
        if (get && !tail[0]) {
            cJSON_DeleteItemFromObject(j, "result"); /* a server path: not for clients */
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
            pthread_mutex_lock(&dl_api.mu);
            if (!strcmp(st, "queued")) { /* durable: a cancelled job never runs after a restart */
                if (dl_jobs_begin(dl_api.js, 1) == DL_OK) {
                    dl_jobs_set(dl_api.js, id, "cancelled", "cancelled by the client", NULL);
                    if (dl_jobs_commit(dl_api.js) != DL_OK) dl_jobs_rollback(dl_api.js);
                }
            } else if (!strcmp(st, "in_progress")) { /* every model process has its own slot; durable across a crash */
                for (int i = 0; i < dl_api.nworkers; i++)
                    if (!strcmp(dl_api.w[i].inflight, id)) dl_api.w[i].cancel_wanted = 1;
                if (dl_jobs_begin(dl_api.js, 1) == DL_OK) {
                    dl_jobs_request_cancel(dl_api.js, id);
                    if (dl_jobs_commit(dl_api.js) != DL_OK) dl_jobs_rollback(dl_api.js);
                }
            }
            pthread_cond_broadcast(&dl_api.cv);
            pthread_mutex_unlock(&dl_api.mu);
            cJSON_Delete(j);
            pthread_mutex_lock(&dl_api.mu);
            j = dl_jobs_get(dl_api.js, id);
            pthread_mutex_unlock(&dl_api.mu);
            cJSON_DeleteItemFromObject(j, "result");
            return dl_api_json_reply(c, 200, j);
        }
        cJSON_Delete(j);
    }
    return dl_api_error_reply(c, 404, "not_found_error", NULL, "no route %s %s", method, url);
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)cls, (void)c, (void)toe;
    conn *cn = *con_cls;
    if (cn) free(cn->body), free(cn);
    *con_cls = NULL;
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
        for (int i = m->first; i < m->first + m->n; i++) dl_api.w[i] = (worker){.model = k, .fd = -1, .pid = -1, .backoff = 0.5};
        dl_api.nworkers += m->n;
        if (k) snprintf(m->profile_path, sizeof m->profile_path, "%.1000s/profile-%d.json", m->pr.results, k);
        else snprintf(m->profile_path, sizeof m->profile_path, "%.1000s/profile.json", m->pr.results);
        cJSON *pj = dl_deployment_to_json(&m->pr);
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
    /* idle connections (no request yet, or between requests) close after idle_timeout_s;
       one client address holds at most max_connections_per_ip of max_connections */
    struct MHD_Daemon *d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_ERROR_LOG,
                                            (uint16_t)pr->port, NULL, NULL, handler, NULL, MHD_OPTION_SOCK_ADDR, &addr,
                                            MHD_OPTION_NOTIFY_COMPLETED, completed, NULL, MHD_OPTION_CONNECTION_TIMEOUT,
                                            (unsigned)pr->idle_timeout_s, MHD_OPTION_CONNECTION_LIMIT,
                                            (unsigned)pr->max_connections, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
                                            (unsigned)pr->max_connections_per_ip, MHD_OPTION_END);
    if (!d) {
        fprintf(stderr, "difflet: serve: cannot listen on %s:%d\n", pr->host, pr->port);
        dl_jobs_close(dl_api.js);
        return 1;
    }
    struct MHD_Daemon *hd = NULL;
    if (pr->health_port >= 0) {
        struct sockaddr_in ha = addr;
        ha.sin_port = htons((uint16_t)pr->health_port);
        hd = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG, (uint16_t)pr->health_port, NULL, NULL,
                              health_handler, NULL, MHD_OPTION_SOCK_ADDR, &ha, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)5,
                              MHD_OPTION_CONNECTION_LIMIT, (unsigned)64, MHD_OPTION_END);
        if (!hd) {
            fprintf(stderr, "difflet: serve: cannot listen for health checks on %s:%d\n", pr->host, pr->health_port);
            MHD_stop_daemon(d);
            dl_jobs_close(dl_api.js);
            return 1;
        }
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    char names[2400] = "";
    for (int k = 0; k < dl_api.nmodels; k++)
        snprintf(names + strlen(names), sizeof names - strlen(names), "%s%.1000s", k ? ", " : "", dl_api.m[k].pr.model);
    printf("difflet serve: listening on http://%s:%u (model%s %s)\n", pr->host, info ? info->port : (unsigned)pr->port,
           dl_api.nmodels > 1 ? "s" : "", names);
    if (hd) {
        const union MHD_DaemonInfo *hi = MHD_get_daemon_info(hd, MHD_DAEMON_INFO_BIND_PORT);
        printf("difflet serve: health checks on http://%s:%u/health\n", pr->host, hi ? hi->port : (unsigned)pr->health_port);
    }
    fflush(stdout);
    pthread_t sup;
    pthread_create(&sup, NULL, dl_api_supervisor, NULL);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    while (!g_stop) usleep(100000);
    DL_INFO("serve: stopping");
    if (hd) MHD_stop_daemon(hd);
    MHD_stop_daemon(d);
    pthread_mutex_lock(&dl_api.mu);
    dl_api.stopping = 1;
    pthread_mutex_unlock(&dl_api.mu);
    pthread_join(sup, NULL);
    dl_jobs_close(dl_api.js);
    for (int k = 0; k < dl_api.nmodels; k++) dl_tokenizer_free(dl_api.m[k].tok);
    return 0;
}
