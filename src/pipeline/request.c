/* The typed generation request (request.h): defaults, JSON in and out, one set of
 * checks. */
#include "difflet/request.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "difflet/pipeline.h"
#include "difflet/text.h"

const dl_request_limits dl_request_engine_limits = {DL_STEPS_MAX, DL_PROMPT_MAX_BYTES, 1};

void dl_request_init(dl_request *r) {
    memset(r, 0, sizeof *r);
    r->steps = 28;
    r->guidance = 3.5;
    r->true_cfg = 1.0;
    r->seed = -1;
    r->output_format = DL_FMT_PNG;
    r->output_compression = 100;
    r->strength = 0.6;
}

void dl_request_free(dl_request *r) {
    free(r->prompt);
    free(r->negative_prompt);
    free(r->image), free(r->mask);
    r->prompt = r->negative_prompt = NULL;
    r->image = r->mask = NULL;
}

void dl_request_set_image(dl_request *r, uint8_t *rgb, uint8_t *mask, int width, int height, double strength) {
    free(r->image), free(r->mask);
    r->image = rgb, r->mask = mask, r->image_width = width, r->image_height = height, r->strength = strength;
}

/* a base64 PNG field as RGB (3) or luma (1) bytes; 1 when absent or valid */
static int image_field(const cJSON *j, const char *name, int channels, uint8_t **px, int *w, int *h, char *param,
                       size_t pn) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, name);
    if (!v || cJSON_IsNull(v)) return 1;
    uint8_t *png = NULL;
    size_t n;
    dl_image im = {0}, c = {0};
    dl_status s = !cJSON_IsString(v) ? dl_fail(DL_ERR_INVALID, "`%s` must be a base64 PNG string", name)
                                     : dl_b64_decode(v->valuestring, strlen(v->valuestring), &png, &n);
    if (s == DL_OK) s = dl_image_decode(png, n, &im);
    if (s == DL_OK) s = dl_image_convert(&im, channels == 3 ? DL_IMAGE_RGB : DL_IMAGE_LUMA, &c);
    free(png), dl_image_free(&im);
    if (s != DL_OK) {
        snprintf(param, pn, "%s", name);
        dl_fail(DL_ERR_INVALID, "`%s`: %s", name, dl_last_error());
        return 0;
    }
    if (*w && (c.width != *w || c.height != *h)) {
        snprintf(param, pn, "%s", name);
        dl_fail(DL_ERR_INVALID, "`%s` is %dx%d, the image %dx%d", name, c.width, c.height, *w, *h);
        dl_image_free(&c);
        return 0;
    }
    *w = c.width, *h = c.height, *px = c.px;
    return 1;
}

dl_status dl_request_set_prompt(dl_request *r, const char *prompt, const char *negative) {
    char *p = prompt ? strdup(prompt) : NULL, *n = negative ? strdup(negative) : NULL;
    if ((prompt && !p) || (negative && !n)) {
        free(p), free(n);
        return dl_fail(DL_ERR_NOMEM, "out of memory");
    }
    free(r->prompt), free(r->negative_prompt);
    r->prompt = p, r->negative_prompt = n;
    return DL_OK;
}

int dl_parse_size(const char *s, int *w, int *h) {
    long v[2];
    for (int k = 0; k < 2; k++) {
        if (*s < '0' || *s > '9') return 0;
        long x = 0;
        int digits = 0;
        while (*s >= '0' && *s <= '9') {
            x = x * 10 + (*s++ - '0');
            if (++digits > 5) return 0;
        }
        if (x < 1 || x > 8192) return 0;
        v[k] = x;
        if (k == 0 && *s++ != 'x') return 0;
    }
    if (*s) return 0;
    *w = (int)v[0], *h = (int)v[1];
    return 1;
}

static const char *fmt_name(dl_media_format f) {
    return f == DL_FMT_JPEG ? "jpeg" : f == DL_FMT_WEBP ? "webp" : f == DL_FMT_MP4 ? "mp4" : "png";
}

#define BAD(p, ...)                                 \
    do {                                            \
        snprintf(param, pn, "%s", p);               \
        return dl_fail(DL_ERR_INVALID, __VA_ARGS__); \
    } while (0)

dl_status dl_request_validate(const dl_request *r, const dl_request_limits *lim, char *param, size_t pn) {
    if (pn) param[0] = 0;
    if (!r->prompt) BAD("prompt", "`prompt` is required and must be a string");
    size_t pl = strlen(r->prompt), nl = r->negative_prompt ? strlen(r->negative_prompt) : 0;
    if ((int64_t)pl > lim->max_prompt_bytes)
        BAD("prompt", "`prompt` is %zu bytes; at most %d are allowed", pl, lim->max_prompt_bytes);
    if (!dl_utf8_valid(r->prompt, pl)) BAD("prompt", "`prompt` is not valid UTF-8");
    if ((int64_t)nl > lim->max_prompt_bytes)
        BAD("negative_prompt", "`negative_prompt` must be a string of at most %d bytes", lim->max_prompt_bytes);
    if (r->negative_prompt && !dl_utf8_valid(r->negative_prompt, nl))
        BAD("negative_prompt", "`negative_prompt` is not valid UTF-8");
    if (r->steps < 1 || r->steps > lim->max_steps) BAD("steps", "`steps` must be an integer from 1 to %d", lim->max_steps);
    if (!(r->guidance >= 0 && r->guidance <= 100)) BAD("guidance_scale", "`guidance_scale` must be a number in 0..100");
    if (!(r->true_cfg >= 0 && r->true_cfg <= 100)) BAD("true_cfg_scale", "`true_cfg_scale` must be a number in 0..100");
    if (r->seed < -1 || r->seed >= DL_SEED_MAX)
        BAD("seed", "`seed` must be a non-negative integer below 2^53");
    if (r->width < 0 || r->width > 8192 || r->height < 0 || r->height > 8192 || (!r->width != !r->height))
        BAD("size", "the size must be WxH with both sides in 1..8192");
    if (r->frames < 0 || r->frames > 100000) BAD("frames", "`frames` must be an integer from 1 to 100000");
    if (!(r->fps >= 0 && r->fps <= 1000)) BAD("fps", "`fps` must be a number in (0, 1000]");
    if (!(r->strength > 0 && r->strength <= 1)) BAD("strength", "`strength` must be a number in (0, 1]");
    if (r->mask && !r->image) BAD("mask", "`mask` needs `image` (the picture to inpaint)");
    if (r->image && r->steps > 0) { /* the pipelines' get_timesteps: at least one step must remain to run */
        const double init = fmin(r->steps * r->strength, (double)r->steps);
        if (r->steps - (int)fmax(r->steps - init, 0.0) < 1)
            BAD("strength", "`strength` is too small for this number of steps: no step would run");
    }
    /* the engine's bound; each pipeline refuses what it cannot take (FLUX: 2..512, Qwen-Image: 1..1024) */
    if (r->max_sequence_length && (r->max_sequence_length < 1 || r->max_sequence_length > 4096))
        BAD("max_sequence_length", "`max_sequence_length` must be an integer from 1 to 4096");
    if (r->cache[0]) {
        dl_stepcache_config sc;
        int named_file = strchr(r->cache, '/') || !strncmp(r->cache, "calibrated", 10);
        if ((named_file && !lim->allow_calibrated) || dl_stepcache_parse(r->cache, &sc) != DL_OK)
            BAD("cache", lim->allow_calibrated ? "`cache` must be off, cadence:N, online-delta[:ALPHA] or calibrated:FILE[:T]"
                                               : "`cache` must be off, cadence:N or online-delta[:ALPHA]");
    }
    if (r->output_compression < 0 || r->output_compression > 100)
        BAD("output_compression", "`output_compression` must be an integer from 0 to 100");
    return DL_OK;
}

/* an optional integer field in [lo, hi]: 1 when absent or valid (stored), else 0
 * with the message and *param set */
static int int_field(const cJSON *j, const char *name, int64_t lo, int64_t hi, void *dst, int is64, char *param,
                     size_t pn, const char *msg) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, name);
    if (!v) return 1;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble != floor(v->valuedouble) ||
        v->valuedouble < (double)lo || v->valuedouble > (double)hi) {
        snprintf(param, pn, "%s", name);
        if (msg) dl_fail(DL_ERR_INVALID, "%s", msg);
        else dl_fail(DL_ERR_INVALID, "`%s` must be an integer from %lld to %lld", name, (long long)lo, (long long)hi);
        return 0;
    }
    if (is64) *(int64_t *)dst = (int64_t)v->valuedouble;
    else *(int *)dst = (int)v->valuedouble;
    return 1;
}

dl_status dl_request_from_json(const cJSON *j, const dl_request_limits *lim, dl_request *r, char *param, size_t pn) {
    dl_request_init(r);
    if (pn) param[0] = 0;
    if (!cJSON_IsObject(j)) BAD("", "the request must be a JSON object");
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "prompt"), *n = cJSON_GetObjectItemCaseSensitive(j, "negative_prompt");
    if (!v) BAD("prompt", "`prompt` is required");
    if (!cJSON_IsString(v)) BAD("prompt", "`prompt` must be a string");
    if (n && !cJSON_IsString(n) && !cJSON_IsNull(n)) BAD("negative_prompt", "`negative_prompt` must be a string");
    if (dl_request_set_prompt(r, v->valuestring, cJSON_IsString(n) ? n->valuestring : NULL) != DL_OK)
        BAD("prompt", "out of memory");
    int ok = int_field(j, "steps", 1, lim->max_steps, &r->steps, 0, param, pn, NULL) &&
             int_field(j, "width", 1, 8192, &r->width, 0, param, pn, NULL) &&
             int_field(j, "height", 1, 8192, &r->height, 0, param, pn, NULL) &&
             int_field(j, "frames", 1, 100000, &r->frames, 0, param, pn, NULL) &&
             int_field(j, "seed", 0, DL_SEED_MAX - 1, &r->seed, 1, param, pn,
                       "`seed` must be a non-negative integer below 2^53") &&
             int_field(j, "max_sequence_length", 1, 4096, &r->max_sequence_length, 0, param, pn, NULL) &&
             int_field(j, "output_compression", 0, 100, &r->output_compression, 0, param, pn, NULL) &&
             int_field(j, "partial_images", 0, 3, &r->partial_images, 0, param, pn, NULL);
    static const struct {
        const char *name;
        size_t off;
    } num[] = {{"guidance_scale", offsetof(dl_request, guidance)},
               {"true_cfg_scale", offsetof(dl_request, true_cfg)},
               {"fps", offsetof(dl_request, fps)},
               {"strength", offsetof(dl_request, strength)}};
    for (size_t i = 0; ok && i < sizeof num / sizeof num[0]; i++)
        if ((v = cJSON_GetObjectItemCaseSensitive(j, num[i].name))) {
            if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) {
                snprintf(param, pn, "%s", num[i].name);
                dl_fail(DL_ERR_INVALID, "`%s` must be a number", num[i].name);
                ok = 0;
            } else {
                *(double *)((char *)r + num[i].off) = v->valuedouble;
            }
        }
    if (ok && (v = cJSON_GetObjectItemCaseSensitive(j, "size")) &&
        (!cJSON_IsString(v) || !dl_parse_size(v->valuestring, &r->width, &r->height))) {
        snprintf(param, pn, "size");
        dl_fail(DL_ERR_INVALID, "`size` must be \"WxH\" with both sides in 1..8192");
        ok = 0;
    }
    if (ok && (v = cJSON_GetObjectItemCaseSensitive(j, "cache"))) {
        if (!cJSON_IsString(v) || strlen(v->valuestring) >= sizeof r->cache) {
            snprintf(param, pn, "cache");
            dl_fail(DL_ERR_INVALID, "`cache` must be a string");
            ok = 0;
        } else {
            snprintf(r->cache, sizeof r->cache, "%s", v->valuestring);
        }
    }
    if (ok && (v = cJSON_GetObjectItemCaseSensitive(j, "output_format"))) {
        const char *f = cJSON_GetStringValue(v);
        if (f && !strcmp(f, "png")) r->output_format = DL_FMT_PNG;
        else if (f && !strcmp(f, "jpeg")) r->output_format = DL_FMT_JPEG;
        else if (f && !strcmp(f, "webp")) r->output_format = DL_FMT_WEBP;
        else if (f && !strcmp(f, "mp4")) r->output_format = DL_FMT_MP4;
        else {
            snprintf(param, pn, "output_format");
            dl_fail(DL_ERR_INVALID, "`output_format` must be \"png\", \"jpeg\" or \"webp\" (\"mp4\" for video)");
            ok = 0;
        }
    }
    if (ok) ok = image_field(j, "image", 3, &r->image, &r->image_width, &r->image_height, param, pn);
    if (ok && r->image) ok = image_field(j, "mask", 1, &r->mask, &r->image_width, &r->image_height, param, pn);
    if (ok && !r->image && cJSON_GetObjectItemCaseSensitive(j, "mask")) {
        snprintf(param, pn, "mask");
        dl_fail(DL_ERR_INVALID, "`mask` needs `image` (the picture to inpaint)");
        ok = 0;
    }
    dl_status s = ok ? dl_request_validate(r, lim, param, pn) : DL_ERR_INVALID;
    if (s != DL_OK) dl_request_free(r);
    return s;
}

/* a picture as a base64 PNG string (NULL when out of memory) */
static char *png_b64(const uint8_t *px, int w, int h, int channels) {
    uint8_t *rgb = (uint8_t *)px, *png = NULL;
    size_t n = 0;
    if (channels == 1) { /* as grey RGB: the PNG writer takes RGB */
        if (!(rgb = malloc((size_t)w * (size_t)h * 3))) return NULL;
        for (size_t i = 0; i < (size_t)w * (size_t)h; i++) rgb[3 * i] = rgb[3 * i + 1] = rgb[3 * i + 2] = px[i];
    }
    char *out = dl_png_encode(rgb, w, h, &png, &n) == DL_OK ? dl_b64_encode(png, n) : NULL;
    if (rgb != px) free(rgb);
    free(png);
    return out;
}

cJSON *dl_request_to_json(const dl_request *r) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "prompt", r->prompt ? r->prompt : "");
    if (r->negative_prompt) cJSON_AddStringToObject(j, "negative_prompt", r->negative_prompt);
    if (r->width) cJSON_AddNumberToObject(j, "width", r->width), cJSON_AddNumberToObject(j, "height", r->height);
    if (r->frames) cJSON_AddNumberToObject(j, "frames", r->frames);
    if (r->fps > 0) cJSON_AddNumberToObject(j, "fps", r->fps);
    cJSON_AddNumberToObject(j, "steps", r->steps);
    cJSON_AddNumberToObject(j, "guidance_scale", r->guidance);
    cJSON_AddNumberToObject(j, "true_cfg_scale", r->true_cfg);
    if (r->seed >= 0) cJSON_AddNumberToObject(j, "seed", (double)r->seed);
    if (r->max_sequence_length) cJSON_AddNumberToObject(j, "max_sequence_length", r->max_sequence_length);
    if (r->cache[0]) cJSON_AddStringToObject(j, "cache", r->cache);
    cJSON_AddStringToObject(j, "output_format", fmt_name(r->output_format));
    cJSON_AddNumberToObject(j, "output_compression", r->output_compression);
    if (r->partial_images > 0) cJSON_AddNumberToObject(j, "partial_images", r->partial_images);
    if (r->image) {
        char *im = png_b64(r->image, r->image_width, r->image_height, 3);
        char *mk = r->mask ? png_b64(r->mask, r->image_width, r->image_height, 1) : NULL;
        if (!im || (r->mask && !mk)) {
            free(im), free(mk);
            cJSON_Delete(j);
            return NULL;
        }
        cJSON_AddStringToObject(j, "image", im);
        if (mk) cJSON_AddStringToObject(j, "mask", mk);
        cJSON_AddNumberToObject(j, "strength", r->strength);
        free(im), free(mk);
    }
    return j;
}
