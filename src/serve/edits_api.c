/* POST /v1/images/edits: OpenAI's image edits (multipart/form-data, as the `openai`
 * SDK's images.edit sends it) on the FLUX image-to-image and inpainting flows.
 *
 * Parts: `image` (one PNG, JPEG or WebP file; `image[]` with one file is the same),
 * optional `mask`, and the text fields of images.generate (prompt, model, n, size,
 * response_format, quality, output_format, output_compression, background,
 * moderation, user, stream, partial_images) plus edits' own input_fidelity (accepted,
 * ignored: the image is always read at full fidelity) and difflet's
 * (negative_prompt, steps, guidance_scale, true_cfg_scale, seed, cache, strength).
 * Multipart values are text: integer and number fields are parsed strictly.
 *
 * The picture becomes what diffusers' VaeImageProcessor makes of it: RGB, resized
 * (PIL LANCZOS) to the chosen size when it has another; `size` absent or "auto"
 * picks the served size equal to the image's, else the first served size. The mask,
 * as OpenAI defines it, marks with full transparency what is edited; a mask without
 * any transparency is read as diffusers reads one (luma >= 128 is repainted); no
 * mask and a transparent image: the image's own transparency is the mask. Without
 * any mask the whole picture is re-generated from it (image-to-image). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "serve/api_impl.h"

typedef struct {
    char name[64], filename[256];
    const char *data;
    size_t len;
} part;

enum { MAX_PARTS = 48 };

/* the boundary parameter of a multipart/form-data Content-Type (quoted or not) */
static int boundary_of(const char *ct, char *out, size_t n) {
    if (!ct || strncasecmp(ct, "multipart/form-data", 19)) return 0;
    const char *b = strcasestr(ct, "boundary=");
    if (!b) return 0;
    b += 9;
    size_t k = 0;
    if (*b == '"') {
        b++;
        while (b[k] && b[k] != '"') k++;
    } else {
        while (b[k] && b[k] != ';' && b[k] != ' ' && b[k] != '\t') k++;
    }
    if (k == 0 || k > 70 || k + 1 > n) return 0; /* RFC 2046: 1..70 characters */
    memcpy(out, b, k);
    out[k] = 0;
    return 1;
}

/* `key="value"` of a Content-Disposition header line (len bytes) */
static int disp_param(const char *h, size_t len, const char *key, char *out, size_t n) {
    size_t kl = strlen(key);
    for (size_t i = 0; i + kl + 2 <= len; i++) {
        if ((i == 0 || h[i - 1] == ' ' || h[i - 1] == ';') && !strncasecmp(h + i, key, kl) && h[i + kl] == '=' &&
            h[i + kl + 1] == '"') {
            size_t s = i + kl + 2, e = s;
            while (e < len && h[e] != '"') e++;
            if (e >= len || e - s >= n) return -1;
            memcpy(out, h + s, e - s);
            out[e - s] = 0;
            return 1;
        }
    }
    return 0;
}

/* Split a multipart body into parts (pointers into body). 0 with a message when it
 * is not well-formed. */
static int split_parts(const char *body, size_t len, const char *boundary, part *parts, int *np, char *err, size_t en) {
    char delim[80];
    int dl = snprintf(delim, sizeof delim, "--%s", boundary);
    const char *p = memmem(body, len, delim, (size_t)dl), *end = body + len;
    *np = 0;
    if (!p) {
        snprintf(err, en, "the multipart body has no boundary line");
        return 0;
    }
    for (;;) {
        p += dl;
        if (end - p >= 2 && p[0] == '-' && p[1] == '-') return 1; /* the closing delimiter */
        if (end - p < 2 || p[0] != '\r' || p[1] != '\n') break;
        p += 2;
        const char *hend = memmem(p, (size_t)(end - p), "\r\n\r\n", 4);
        if (!hend) break;
        if (*np == MAX_PARTS) {
            snprintf(err, en, "the multipart body has more than %d parts", MAX_PARTS);
            return 0;
        }
        part *q = &parts[*np];
        memset(q, 0, sizeof *q);
        int named = 0;
        for (const char *l = p; l < hend;) { /* header lines */
            const char *le = memmem(l, (size_t)(hend + 2 - l), "\r\n", 2);
            if (!le) le = hend;
            size_t ll = (size_t)(le - l);
            if (ll > 20 && !strncasecmp(l, "content-disposition:", 20)) {
                const char *h = l + 20;
                size_t hl = ll - 20;
                if (disp_param(h, hl, "name", q->name, sizeof q->name) != 1 ||
                    disp_param(h, hl, "filename", q->filename, sizeof q->filename) < 0) {
                    snprintf(err, en, "a multipart part has a bad or too long name or filename");
                    return 0;
                }
                named = 1;
            }
            l = le + 2;
        }
        const char *data = hend + 4;
        char next[84];
        int nl = snprintf(next, sizeof next, "\r\n%s", delim);
        const char *e = memmem(data, (size_t)(end - data), next, (size_t)nl);
        if (!e) break;
        if (!named) {
            snprintf(err, en, "a multipart part has no Content-Disposition name");
            return 0;
        }
        q->data = data, q->len = (size_t)(e - data);
        (*np)++;
        p = e + 2;
    }
    snprintf(err, en, "the multipart body is truncated or malformed");
    return 0;
}

/* The text fields as JSON values of the types images.generate's JSON has. */
static int field_value(cJSON *j, const part *q, char *err, size_t en) {
    static const char *const ints[] = {"n", "output_compression", "partial_images", "steps", "seed", NULL};
    static const char *const nums[] = {"guidance_scale", "true_cfg_scale", "strength", NULL};
    char *v = malloc(q->len + 1);
    if (!v) return snprintf(err, en, "out of memory"), 0;
    memcpy(v, q->data, q->len);
    v[q->len] = 0;
    if (strlen(v) != q->len) {
        free(v);
        snprintf(err, en, "field `%s` contains a NUL byte", q->name);
        return 0;
    }
    int ok = 1;
    for (int k = 0; ints[k]; k++)
        if (!strcmp(q->name, ints[k])) {
            char *e;
            long long x = strtoll(v, &e, 10);
            if (!*v || *e || (v[0] != '-' && (v[0] < '0' || v[0] > '9'))) ok = 0;
            else cJSON_AddNumberToObject(j, q->name, (double)x);
            goto done;
        }
    for (int k = 0; nums[k]; k++)
        if (!strcmp(q->name, nums[k])) {
            char *e;
            double x = strtod(v, &e);
            if (!*v || *e || strchr(" \t\n", v[0])) ok = 0;
            else cJSON_AddNumberToObject(j, q->name, x);
            goto done;
        }
    if (!strcmp(q->name, "stream")) {
        if (!strcmp(v, "true") || !strcmp(v, "false")) cJSON_AddBoolToObject(j, q->name, v[0] == 't');
        else ok = 0;
        goto done;
    }
    cJSON_AddStringToObject(j, q->name, v);
done:
    if (!ok) snprintf(err, en, "field `%s`: \"%.40s\" is not a valid %s", q->name, v, !strcmp(q->name, "stream") ? "boolean" : "number");
    free(v);
    return ok;
}

enum MHD_Result dl_api_edits(struct MHD_Connection *c, const char *body, size_t len) {
    char boundary[80], err[1024] = "", param[64] = "";
    part parts[MAX_PARTS];
    int np = 0;
    const char *ct = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type");
    if (!boundary_of(ct, boundary, sizeof boundary))
        return dl_api_error_reply(c, 415, "invalid_request_error", NULL,
                                  "POST /v1/images/edits takes multipart/form-data (with a boundary), as OpenAI's does");
    if (!split_parts(body, len, boundary, parts, &np, err, sizeof err))
        return dl_api_error_reply(c, 400, "invalid_request_error", NULL, "%s", err);
    const part *image = NULL, *mask = NULL;
    cJSON *j = cJSON_CreateObject();
    if (!j) return dl_api_error_reply(c, 500, "server_error", NULL, "out of memory");
    for (int i = 0; i < np; i++) {
        const part *q = &parts[i];
        int is_image = !strcmp(q->name, "image") || !strcmp(q->name, "image[]");
        if (is_image || !strcmp(q->name, "mask")) {
            const part **slot = is_image ? &image : &mask;
            if (*slot) {
                cJSON_Delete(j);
                return dl_api_error_reply(c, 400, "invalid_request_error", is_image ? "image" : "mask",
                                          is_image ? "one `image` is supported (several reference images are not)"
                                                   : "one `mask` is allowed");
            }
            *slot = q;
            continue;
        }
        if (!strcmp(q->name, "input_fidelity")) continue; /* accepted, ignored (documented) */
        if (cJSON_GetObjectItemCaseSensitive(j, q->name)) {
            cJSON_Delete(j);
            return dl_api_error_reply(c, 400, "invalid_request_error", q->name, "field `%s` is given twice", q->name);
        }
        if (!strcmp(q->name, "strength")) { /* difflet's: not a generations field, checked by the typed request */
            if (!field_value(j, q, err, sizeof err)) {
                cJSON_Delete(j);
                return dl_api_error_reply(c, 400, "invalid_request_error", q->name, "%s", err);
            }
            continue;
        }
        if (!field_value(j, q, err, sizeof err)) {
            cJSON_Delete(j);
            return dl_api_error_reply(c, 400, "invalid_request_error", q->name, "%s", err);
        }
    }
    if (!image) {
        cJSON_Delete(j);
        return dl_api_error_reply(c, 400, "invalid_request_error", "image", "`image` (a PNG, JPEG or WebP file) is required");
    }
    /* strength is not an images.generate field: validated separately, put back after */
    double strength = 0.6;
    cJSON *st = cJSON_DetachItemFromObjectCaseSensitive(j, "strength");
    if (st) strength = st->valuedouble;
    cJSON_Delete(st);
    if (!(strength > 0 && strength <= 1)) {
        cJSON_Delete(j);
        return dl_api_error_reply(c, 400, "invalid_request_error", "strength", "`strength` must be a number in (0, 1]");
    }
    dl_image im = {0}, mk = {0};
    if (dl_image_decode((const uint8_t *)image->data, image->len, &im) != DL_OK) {
        cJSON_Delete(j);
        return dl_api_error_reply(c, 400, "invalid_request_error", "image", "%s", dl_last_error());
    }
    if (mask && dl_image_decode((const uint8_t *)mask->data, mask->len, &mk) != DL_OK) {
        cJSON_Delete(j);
        dl_image_free(&im);
        return dl_api_error_reply(c, 400, "invalid_request_error", "mask", "%s", dl_last_error());
    }
    /* the size: asked for, else the served size the picture has, else the first served */
    const cJSON *sz = cJSON_GetObjectItemCaseSensitive(j, "size");
    int size_auto = !sz || (cJSON_IsString(sz) && !strcmp(sz->valuestring, "auto"));
    cJSON *req = NULL;
    img_opts o;
    if (size_auto) {
        char unknown[800];
        const served *m = dl_api_route(cJSON_GetObjectItemCaseSensitive(j, "model"), 0, unknown, sizeof unknown);
        if (m) {
            int w = m->pr.sizes[0][0], h = m->pr.sizes[0][1];
            for (int i = 0; i < m->pr.nsizes; i++)
                if (m->pr.sizes[i][0] == im.width && m->pr.sizes[i][1] == im.height) w = im.width, h = im.height;
            char s[32];
            snprintf(s, sizeof s, "%dx%d", w, h);
            cJSON_DeleteItemFromObjectCaseSensitive(j, "size");
            cJSON_AddStringToObject(j, "size", s);
        } /* else the validation below answers the unknown model */
    }
    int ok = dl_api_validate_images(j, &req, &o, err, sizeof err, param, sizeof param); /* consumes j */
    if (ok && (!o.model->entry || !o.model->entry->image_to_image)) {
        snprintf(param, sizeof param, "model");
        snprintf(err, sizeof err, "model `%s` (%s) has no image-to-image or inpainting flow (FLUX models have)",
                 o.model->pr.model_id, o.model->entry ? o.model->entry->pipeline_class : "unknown pipeline");
        ok = 0;
    }
    if (!ok) {
        dl_image_free(&im), dl_image_free(&mk);
        cJSON_Delete(req);
        return dl_api_error_reply(c, strcmp(param, "model") || !strstr(err, "does not exist") ? 400 : 404,
                                  "invalid_request_error", param[0] ? param : NULL, "%s", err);
    }
    const int W = (int)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(req, "width"));
    const int H = (int)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(req, "height"));
    uint8_t *rgb = NULL, *ml = NULL;
    dl_status s = dl_image_prepare(&im, DL_IMAGE_RGB, W, H, &rgb);
    if (s == DL_OK && mask)
        s = dl_image_prepare(&mk, dl_image_has_transparency(&mk) ? DL_IMAGE_TRANSPARENT : DL_IMAGE_LUMA, W, H, &ml);
    else if (s == DL_OK && dl_image_has_transparency(&im))
        s = dl_image_prepare(&im, DL_IMAGE_TRANSPARENT, W, H, &ml);
    dl_image_free(&im), dl_image_free(&mk);
    /* into the typed request: it carries them to the model process as base64 PNG */
    dl_request r;
    char p2[64];
    if (s == DL_OK && dl_request_from_json(req, &dl_request_engine_limits, &r, p2, sizeof p2) == DL_OK) {
        dl_request_set_image(&r, rgb, ml, W, H, strength);
        rgb = ml = NULL;
        cJSON *full = dl_request_to_json(&r);
        dl_request_free(&r);
        if (full) {
            cJSON_Delete(req);
            req = full;
        } else {
            s = dl_fail(DL_ERR_NOMEM, "out of memory");
        }
    } else if (s == DL_OK) {
        s = DL_ERR_INVALID;
    }
    free(rgb), free(ml);
    if (s != DL_OK) {
        cJSON_Delete(req);
        return dl_api_error_reply(c, s == DL_ERR_NOMEM ? 500 : 400, s == DL_ERR_NOMEM ? "server_error" : "invalid_request_error",
                                  NULL, "%s", dl_last_error());
    }
    o.edit = 1; /* a stream's events are image_edit.* */
    return dl_api_images_answer(c, req, &o); /* consumes req */
}
