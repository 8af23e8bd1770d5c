/* The videos API's pure parts (OpenAI's /v1/videos shape): request bodies as JSON
 * or as forms (OpenAI's SDK sends multipart/form-data), the request checks that turn
 * a body into the typed job request, and the video object clients see. The routes
 * are in server.c; the job store keeps video jobs beside image jobs (kind "video").
 *
 * Duration: `seconds` at `fps` is seconds * fps + 1 frames (Wan's convention: 81
 * frames are 5 s at 16 fps), rounded down to the pipeline's valid count
 * (frame_step * k + 1) as WanPipeline rounds num_frames; the count must be one the
 * deployment serves. A video reports `seconds` back as (frames - 1) / fps. */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "difflet/request.h"
#include "serve/serve_impl.h"

/* ---- forms ------------------------------------------------------------------------ */

static int add_field(cJSON *o, const char *name, size_t nl, cJSON *v, char *err, size_t en) {
    char key[64];
    if (!nl || nl >= sizeof key) {
        snprintf(err, en, "a form field name is empty or longer than %zu bytes", sizeof key - 1);
        cJSON_Delete(v);
        return 0;
    }
    memcpy(key, name, nl);
    key[nl] = 0;
    if (cJSON_GetObjectItemCaseSensitive(o, key)) {
        snprintf(err, en, "form field `%s` is given twice", key);
        cJSON_Delete(v);
        return 0;
    }
    cJSON_AddItemToObject(o, key, v);
    return 1;
}

/* a string value of n bytes (no NUL: it would cut the value short) */
static cJSON *text_value(const char *p, size_t n) {
    if (memchr(p, 0, n)) return NULL;
    char *t = malloc(n + 1);
    if (!t) return NULL;
    memcpy(t, p, n);
    t[n] = 0;
    cJSON *v = cJSON_CreateString(t);
    free(t);
    return v;
}

static int hexval(int c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1; }

/* application/x-www-form-urlencoded: a=1&b=x+y%21 */
static cJSON *parse_urlencoded(const char *body, size_t len, char *err, size_t en) {
    cJSON *o = cJSON_CreateObject();
    char *dec = malloc(len + 1);
    if (!o || !dec) {
        free(dec);
        cJSON_Delete(o);
        snprintf(err, en, "out of memory");
        return NULL;
    }
    size_t i = 0;
    while (i < len) {
        size_t end = i;
        while (end < len && body[end] != '&') end++;
        const char *eq = memchr(body + i, '=', end - i);
        size_t kn = eq ? (size_t)(eq - (body + i)) : end - i, n = 0;
        for (size_t k = eq ? (size_t)(eq - body) + 1 : end; k < end; k++) {
            if (body[k] == '+') dec[n++] = ' ';
            else if (body[k] == '%' && k + 2 < end && hexval(body[k + 1]) >= 0 && hexval(body[k + 2]) >= 0)
                dec[n++] = (char)(hexval(body[k + 1]) * 16 + hexval(body[k + 2])), k += 2;
            else dec[n++] = body[k];
        }
        cJSON *v = text_value(dec, n);
        if (kn && (!v || !add_field(o, body + i, kn, v, err, en))) {
            if (!v) snprintf(err, en, "a form value holds a NUL byte");
            free(dec);
            cJSON_Delete(o);
            return NULL;
        }
        if (!kn) cJSON_Delete(v);
        i = end + 1;
    }
    free(dec);
    return o;
}

static const char *find_bytes(const char *h, size_t hn, const char *n, size_t nn) {
    for (size_t i = 0; nn <= hn && i <= hn - nn; i++)
        if (h[i] == n[0] && !memcmp(h + i, n, nn)) return h + i;
    return NULL;
}

/* `key="value"` (or key=value) in a header's parameters; the value's length in *n */
static const char *header_param(const char *h, size_t hn, const char *key, size_t *n) {
    size_t kl = strlen(key);
    for (size_t i = 0; i + kl + 1 < hn; i++) {
        if ((i == 0 || h[i - 1] == ';' || h[i - 1] == ' ') && !strncasecmp(h + i, key, kl) && h[i + kl] == '=') {
            const char *v = h + i + kl + 1, *end = h + hn;
            if (v < end && *v == '"') {
                const char *q = memchr(v + 1, '"', (size_t)(end - v - 1));
                if (!q) return NULL;
                *n = (size_t)(q - v - 1);
                return v + 1;
            }
            const char *e = v;
            while (e < end && *e != ';' && *e != ' ' && *e != '\r') e++;
            *n = (size_t)(e - v);
            return v;
        }
    }
    return NULL;
}

/* multipart/form-data (RFC 7578): parts between "--BOUNDARY" lines, each with a
 * Content-Disposition naming it; a part with a filename is a file upload. */
static cJSON *parse_multipart(const char *ctype, const char *body, size_t len, char *err, size_t en) {
    size_t bl;
    const char *b = header_param(ctype, strlen(ctype), "boundary", &bl);
    if (!b || !bl || bl > 70) {
        snprintf(err, en, "multipart/form-data without a valid boundary");
        return NULL;
    }
    char delim[80];
    snprintf(delim, sizeof delim, "--%.*s", (int)bl, b);
    size_t dl = strlen(delim);
    cJSON *o = cJSON_CreateObject();
    const char *p = find_bytes(body, len, delim, dl), *end = body + len;
    int parts = 0;
    while (o && p) {
        p += dl;
        if (end - p >= 2 && p[0] == '-' && p[1] == '-') return o; /* the closing delimiter */
        if (end - p < 2 || p[0] != '\r' || p[1] != '\n' || ++parts > 32) break;
        p += 2;
        const char *hend = find_bytes(p, (size_t)(end - p), "\r\n\r\n", 4);
        if (!hend) break;
        const char *name = NULL, *file = NULL;
        size_t nl = 0, fl = 0;
        for (const char *line = p; line < hend;) { /* headers: only Content-Disposition matters */
            const char *le = find_bytes(line, (size_t)(hend - line), "\r\n", 2);
            if (!le) le = hend;
            if (!strncasecmp(line, "Content-Disposition:", 20)) {
                name = header_param(line, (size_t)(le - line), "name", &nl);
                file = header_param(line, (size_t)(le - line), "filename", &fl);
            }
            line = le + 2;
        }
        const char *data = hend + 4;
        char close[84];
        snprintf(close, sizeof close, "\r\n%s", delim);
        const char *next = find_bytes(data, (size_t)(end - data), close, dl + 2);
        if (!next || !name) break;
        cJSON *v;
        if (file) { /* a file: kept as its name only (no route takes uploads) */
            v = cJSON_CreateObject();
            cJSON *fn = text_value(file, fl);
            if (fn) cJSON_AddItemToObject(v, "filename", fn);
        } else if (!(v = text_value(data, (size_t)(next - data)))) {
            snprintf(err, en, "form field `%.*s` holds a NUL byte", (int)(nl < 60 ? nl : 60), name);
            cJSON_Delete(o);
            return NULL;
        }
        if (!add_field(o, name, nl, v, err, en)) {
            cJSON_Delete(o);
            return NULL;
        }
        p = next + 2;
    }
    if (o) snprintf(err, en, "the multipart/form-data body is malformed");
    else snprintf(err, en, "out of memory");
    cJSON_Delete(o);
    return NULL;
}

cJSON *dl_form_parse(const char *ctype, const char *body, size_t len, const char *const *numeric, char *err, size_t en) {
    cJSON *o = NULL;
    if (!strncasecmp(ctype, "multipart/form-data", 19)) o = parse_multipart(ctype, body, len, err, en);
    else if (!strncasecmp(ctype, "application/x-www-form-urlencoded", 33)) o = parse_urlencoded(body, len, err, en);
    else snprintf(err, en, "unsupported Content-Type `%.100s` (JSON or a form)", ctype);
    for (int i = 0; o && numeric && numeric[i]; i++) { /* a form's numbers arrive as text */
        cJSON *v = cJSON_GetObjectItemCaseSensitive(o, numeric[i]);
        char *e;
        if (!cJSON_IsString(v) || !v->valuestring[0] || isspace((unsigned char)v->valuestring[0])) continue;
        double d = strtod(v->valuestring, &e);
        if (!*e && isfinite(d)) cJSON_ReplaceItemInObjectCaseSensitive(o, numeric[i], cJSON_CreateNumber(d));
    }
    return o;
}

/* ---- POST /v1/videos -------------------------------------------------------------- */

/* "4", "0.5", 4, 0.5: a positive duration of at most an hour */
static int parse_seconds(const cJSON *v, double *out) {
    if (cJSON_IsNumber(v)) *out = v->valuedouble;
    else if (cJSON_IsString(v)) {
        const char *s = v->valuestring;
        char *e;
        if (!isdigit((unsigned char)s[0]) && !(s[0] == '.' && isdigit((unsigned char)s[1]))) return 0;
        for (const char *c = s; *c; c++)
            if (!isdigit((unsigned char)*c) && *c != '.') return 0;
        *out = strtod(s, &e);
        if (*e) return 0;
    } else return 0;
    return isfinite(*out) && *out > 0 && *out <= 3600;
}

void dl_video_seconds(int frames, double fps, char *out, size_t n) { snprintf(out, n, "%g", (frames - 1) / fps); }

/* the served durations at fps, for messages: "0.25" (5 frames), ... */
static void served_list(const dl_deployment *p, double fps, char *out, size_t n) {
    out[0] = 0;
    for (int i = 0; i < p->nframes; i++) {
        char s[32];
        dl_video_seconds(p->frames[i], fps, s, sizeof s);
        snprintf(out + strlen(out), n - strlen(out), "%s\"%s\" (%d frames)", i ? ", " : "", s, p->frames[i]);
    }
}

int dl_video_request(const cJSON *body, const dl_deployment *p, int default_steps, double default_guidance, cJSON **norm,
                     char *err, size_t en, char *param, size_t pn) {
    cJSON *j = NULL;
    dl_request r;
    int have_r = 0;
    *norm = NULL;
    param[0] = 0;
#define FAIL(pp, ...)                       \
    do {                                    \
        snprintf(param, pn, "%s", pp);      \
        snprintf(err, en, __VA_ARGS__);     \
        goto fail;                          \
    } while (0)
    if (!cJSON_IsObject(body)) FAIL("", "the body must be a JSON object (or a form)");
    static const char *known[] = {"prompt", "negative_prompt", "model", "size", "seconds", "frames", "fps", "seed", "steps",
                                  "guidance_scale", "true_cfg_scale", "cache", "user", "input_reference"};
    const cJSON *e, *v;
    cJSON_ArrayForEach(e, body) {
        int ok = 0;
        for (size_t k = 0; k < sizeof known / sizeof known[0]; k++) ok |= !strcmp(e->string, known[k]);
        if (!ok) FAIL(e->string, "unknown field `%.60s`", e->string);
    }
    if (cJSON_GetObjectItemCaseSensitive(body, "input_reference"))
        FAIL("input_reference", "`input_reference` (a reference image) is not supported: this server makes videos from text");
    if ((v = cJSON_GetObjectItemCaseSensitive(body, "model")) && !cJSON_IsString(v)) FAIL("model", "`model` must be a string");
    if (v && v->valuestring[0] && strcmp(v->valuestring, p->model_id)) /* the caller answers 404 */
        FAIL("model", "The model `%.200s` does not exist (this server serves `%s`)", v->valuestring, p->model_id);
    if ((v = cJSON_GetObjectItemCaseSensitive(body, "user")) && !cJSON_IsString(v)) FAIL("user", "`user` must be a string");
    double fps = p->fps, secs = 0;
    if ((v = cJSON_GetObjectItemCaseSensitive(body, "fps"))) {
        if (!cJSON_IsNumber(v) || !(v->valuedouble > 0 && v->valuedouble <= 1000)) FAIL("fps", "`fps` must be a number in (0, 1000]");
        fps = v->valuedouble;
    }
    const cJSON *sv = cJSON_GetObjectItemCaseSensitive(body, "seconds"), *fv = cJSON_GetObjectItemCaseSensitive(body, "frames");
    if (sv && fv) FAIL("frames", "give `seconds` or `frames`, not both");
    if (sv && !parse_seconds(sv, &secs))
        FAIL("seconds", "`seconds` must be a positive number of seconds (a string such as \"4\", or a number) up to 3600");
    /* the typed request: the body less the API's own fields, with this model's defaults */
    if (!(j = cJSON_Duplicate(body, 1))) FAIL("", "out of memory");
    cJSON_DeleteItemFromObject(j, "model");
    cJSON_DeleteItemFromObject(j, "user");
    cJSON_DeleteItemFromObject(j, "seconds");
    if (!cJSON_GetObjectItemCaseSensitive(j, "steps"))
        cJSON_AddNumberToObject(j, "steps", default_steps < p->max_steps ? default_steps : p->max_steps);
    if (!cJSON_GetObjectItemCaseSensitive(j, "guidance_scale")) cJSON_AddNumberToObject(j, "guidance_scale", default_guidance);
    dl_request_limits lim = {p->max_steps, p->max_prompt_bytes, 0};
    if (dl_request_from_json(j, &lim, &r, param, pn) != DL_OK) {
        snprintf(err, en, "%s", dl_last_error());
        goto fail;
    }
    have_r = 1;
    if (!r.width) r.width = p->sizes[0][0], r.height = p->sizes[0][1];
    int served = 0;
    for (int i = 0; i < p->nsizes; i++) served |= p->sizes[i][0] == r.width && p->sizes[i][1] == r.height;
    if (!served) {
        char list[256] = "";
        for (int i = 0; i < p->nsizes; i++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%dx%d", i ? ", " : "", p->sizes[i][0], p->sizes[i][1]);
        FAIL("size", "size `%dx%d` is not served; supported: %s", r.width, r.height, list);
    }
    int asked = sv ? (int)llround(secs * fps) + 1 : fv ? r.frames : p->frames[0];
    int frames = dl_deployment_round_frames(p, asked);
    served = 0;
    for (int i = 0; i < p->nframes; i++) served |= p->frames[i] == frames;
    if (!served) {
        char list[512];
        served_list(p, fps, list, sizeof list);
        if (sv) FAIL("seconds", "`seconds` %g at %g fps is %d frames, which this server does not serve; supported at %g fps: %s",
                     secs, fps, frames, fps, list);
        if (frames != asked) FAIL("frames", "`frames` %d (%d as the pipeline rounds it) is not served; supported: %s", asked, frames, list);
        FAIL("frames", "`frames` %d is not served; supported: %s", frames, list);
    }
    r.frames = frames, r.fps = fps, r.output_format = DL_FMT_MP4;
    *norm = dl_request_to_json(&r);
    dl_request_free(&r);
    cJSON_Delete(j);
    return 1;
fail:
    if (have_r) dl_request_free(&r);
    cJSON_Delete(j);
    return 0;
#undef FAIL
}

/* ---- the video object --------------------------------------------------------------- */

static double num(const cJSON *o, const char *k) { return cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(o, k)); }

cJSON *dl_video_object(const cJSON *job, const char *model_id, int live_step, int live_steps, double ttl_s) {
    const cJSON *rq = cJSON_GetObjectItemCaseSensitive(job, "request");
    const char *st = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(job, "status"));
    const char *err = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(job, "error"));
    const char *prompt = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(rq, "prompt"));
    st = st ? st : "failed";
    char id[64], size[32], secs[32];
    snprintf(id, sizeof id, "video_%s", cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(job, "id")));
    int frames = (int)num(rq, "frames"), w = (int)num(rq, "width"), h = (int)num(rq, "height");
    double fps = num(rq, "fps");
    fps = fps > 0 ? fps : 16;
    snprintf(size, sizeof size, "%dx%d", w, h);
    dl_video_seconds(frames > 0 ? frames : 1, fps, secs, sizeof secs);
    int done = (int)num(job, "steps_done"), steps = (int)num(job, "steps");
    if (live_steps > 0) done = live_step, steps = live_steps;
    int completed = !strcmp(st, "completed"), failed = !completed && strcmp(st, "queued") && strcmp(st, "in_progress");
    /* denoising is the progress; decoding and the MP4 follow the last step: 99 until done */
    int progress = completed ? 100 : steps > 0 ? (int)(100.0 * done / steps) : 0;
    if (!completed && progress > 99) progress = 99;
    cJSON *v = cJSON_CreateObject();
    cJSON_AddStringToObject(v, "id", id);
    cJSON_AddStringToObject(v, "object", "video");
    cJSON_AddNumberToObject(v, "created_at", num(job, "created"));
    cJSON_AddStringToObject(v, "status", failed ? "failed" : st); /* OpenAI has no cancelled: failed, code "cancelled" */
    cJSON_AddStringToObject(v, "model", model_id);
    cJSON_AddNumberToObject(v, "progress", progress);
    cJSON_AddStringToObject(v, "seconds", secs);
    cJSON_AddStringToObject(v, "size", size);
    if (prompt) cJSON_AddStringToObject(v, "prompt", prompt);
    double fin = num(job, "finished");
    if ((completed || failed) && fin > 0) cJSON_AddNumberToObject(v, "completed_at", fin);
    else cJSON_AddNullToObject(v, "completed_at");
    if (completed && fin > 0) cJSON_AddNumberToObject(v, "expires_at", (double)(int64_t)(fin + ttl_s));
    else cJSON_AddNullToObject(v, "expires_at");
    if (failed) {
        cJSON *e = cJSON_AddObjectToObject(v, "error");
        cJSON_AddStringToObject(e, "code", !strcmp(st, "cancelled") ? "cancelled"
                                           : err && strstr(err, "timed out") ? "timeout"
                                                                              : "generation_failed");
        cJSON_AddStringToObject(e, "message", err ? err : st);
    } else {
        cJSON_AddNullToObject(v, "error");
    }
    cJSON_AddNullToObject(v, "remixed_from_video_id");
    cJSON_AddNumberToObject(v, "frames", frames); /* difflet's: what `seconds` became */
    cJSON_AddNumberToObject(v, "fps", fps);
    return v;
}
