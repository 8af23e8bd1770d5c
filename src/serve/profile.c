/* The serving profile: one JSON file (all fields optional), defaults serve
 * difflet-tiny at 64x64 on 127.0.0.1:8080. A video model also serves a list of frame
 * counts (`frames`, default the model's own) at a default `fps`. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "difflet/io.h"
#include "difflet/pipeline.h"
#include "difflet/registry.h"
#include "serve/serve_impl.h"

#ifndef DIFFLET_SOURCE_DIR
#define DIFFLET_SOURCE_DIR "."
#endif

static void defaults(dl_deployment *p) {
    memset(p, 0, sizeof *p);
    snprintf(p->model, sizeof p->model, "%s/models/difflet-tiny", DIFFLET_SOURCE_DIR);
    snprintf(p->results, sizeof p->results, "difflet-results");
    snprintf(p->host, sizeof p->host, "127.0.0.1");
    snprintf(p->dtype, sizeof p->dtype, "f32");
    snprintf(p->cache, sizeof p->cache, "off");
    p->port = 8080;
    p->queue_capacity = 16;
    p->replicas = 1;
    p->max_steps = 200;
    p->max_prompt_bytes = 2000;
    p->nsizes = 1;
    p->sizes[0][0] = p->sizes[0][1] = 64;
    p->frame_step = 1;
    p->fps = 16; /* WanPipeline's export rate */
    p->timeout_s = 300;
    p->grace_s = 5;
    p->result_ttl_s = 86400;
    p->idle_timeout_s = 15;
    p->max_connections = 512;
    p->max_connections_per_ip = 64;
    p->health_port = -1;
}

static int str_field(const cJSON *j, const char *k, char *dst, size_t n) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, k);
    if (!v || cJSON_IsNull(v)) return 1;
    if (!cJSON_IsString(v)) return 0;
    snprintf(dst, n, "%s", v->valuestring);
    return 1;
}

static int num_field(const cJSON *j, const char *k, double *dst) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, k);
    if (!v) return 1;
    if (!cJSON_IsNumber(v)) return 0;
    *dst = v->valuedouble;
    return 1;
}

dl_status dl_deployment_from_json(dl_deployment *p, const cJSON *j) {
    double reps = p->replicas;
    double port = p->port, qc = p->queue_capacity, ms = p->max_steps, mp = p->max_prompt_bytes, nc = p->no_compile;
    double mc = p->max_connections, mci = p->max_connections_per_ip, hp = p->health_port;
    if (!str_field(j, "model", p->model, sizeof p->model) || !str_field(j, "results_dir", p->results, sizeof p->results) ||
        !str_field(j, "db", p->db, sizeof p->db) || !str_field(j, "host", p->host, sizeof p->host) ||
        !str_field(j, "api_key", p->api_key, sizeof p->api_key) || !str_field(j, "dtype", p->dtype, sizeof p->dtype) ||
        !str_field(j, "cache", p->cache, sizeof p->cache) || !str_field(j, "parallel", p->parallel, sizeof p->parallel) ||
        !num_field(j, "port", &port) ||
        !num_field(j, "queue_capacity", &qc) || !num_field(j, "max_steps", &ms) || !num_field(j, "max_prompt_bytes", &mp) ||
        !num_field(j, "request_timeout_s", &p->timeout_s) || !num_field(j, "cancel_grace_s", &p->grace_s) ||
        !num_field(j, "result_ttl_s", &p->result_ttl_s) || !num_field(j, "no_compile", &nc) ||
        !num_field(j, "replicas", &reps) || !num_field(j, "idle_timeout_s", &p->idle_timeout_s) ||
        !num_field(j, "max_connections", &mc) || !num_field(j, "max_connections_per_ip", &mci) ||
        !num_field(j, "health_port", &hp))
        return dl_fail(DL_ERR_FORMAT, "serving profile: a field has the wrong type");
    if (!str_field(j, "model_id", p->model_id, sizeof p->model_id)) return dl_fail(DL_ERR_FORMAT, "serving deployment: model_id must be a string");
    const cJSON *sizes = cJSON_GetObjectItemCaseSensitive(j, "sizes"), *e;
    if (sizes) {
        p->nsizes = 0;
        cJSON_ArrayForEach(e, sizes) {
            int w, h;
            char x;
            if (!cJSON_IsString(e) || sscanf(e->valuestring, "%d%c%d", &w, &x, &h) != 3 || w <= 0 || h <= 0 || p->nsizes == 8)
                return dl_fail(DL_ERR_FORMAT, "serving profile: sizes must be up to 8 strings \"WxH\"");
            p->sizes[p->nsizes][0] = w, p->sizes[p->nsizes][1] = h, p->nsizes++;
        }
        if (!p->nsizes) return dl_fail(DL_ERR_FORMAT, "serving profile: no sizes");
    }
    const cJSON *frames = cJSON_GetObjectItemCaseSensitive(j, "frames");
    if (frames) {
        p->nframes = 0;
        cJSON_ArrayForEach(e, frames) {
            if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble) || e->valuedouble < 1 ||
                e->valuedouble > 100000 || p->nframes == 8)
                return dl_fail(DL_ERR_FORMAT, "serving deployment: frames must be up to 8 integers in 1..100000");
            p->frames[p->nframes++] = (int)e->valuedouble;
        }
        if (!cJSON_IsArray(frames) || !p->nframes) return dl_fail(DL_ERR_FORMAT, "serving deployment: frames must be a non-empty list");
        p->frames_given = 1;
    }
    double msl = p->max_sequence_length;
    if (cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(j, "fps"))) p->fps_given = 1;
    if (!num_field(j, "fps", &p->fps) || !num_field(j, "max_sequence_length", &msl))
        return dl_fail(DL_ERR_FORMAT, "serving deployment: fps and max_sequence_length must be numbers");
    if (!(p->fps > 0 && p->fps <= 1000) || msl != floor(msl) || msl < 0 || msl > 4096)
        return dl_fail(DL_ERR_FORMAT, "serving deployment: fps must be in (0, 1000] and max_sequence_length in 0..4096 "
                                      "(0: the pipeline's default)");
    p->max_sequence_length = (int)msl;
    dl_status rs = dl_deployment_set_model(p, p->model);
    if (rs != DL_OK) return rs;
    p->port = (int)port, p->queue_capacity = (int)qc, p->max_steps = (int)ms, p->max_prompt_bytes = (int)mp;
    p->no_compile = (int)nc;
    p->max_connections = (int)mc, p->max_connections_per_ip = (int)mci, p->health_port = (int)hp;
    if (!(p->idle_timeout_s >= 1 && p->idle_timeout_s <= 3600) || p->max_connections < 4 || p->max_connections > 65536 ||
        p->max_connections_per_ip < 1 || p->max_connections_per_ip > p->max_connections || p->health_port < -1 ||
        p->health_port > 65535)
        return dl_fail(DL_ERR_FORMAT, "serving deployment: idle_timeout_s (1..3600), max_connections (4..65536), "
                                      "max_connections_per_ip (1..max_connections) or health_port (-1..65535) out of range");
    p->replicas = (int)reps;
    if (p->replicas < 1 || p->replicas > 8) return dl_fail(DL_ERR_FORMAT, "serving profile: replicas must be 1..8");
    dl_par_config pc;
    if (dl_par_parse(p->parallel, &pc) != DL_OK) return dl_fail(DL_ERR_FORMAT, "serving profile: %s", dl_last_error());
    if (pc.dp > 1 || pc.cfg > 1)
        return dl_fail(DL_ERR_FORMAT, "serving profile: parallel `%s`: data parallelism is `replicas`, and cfg=2 needs every "
                                      "request to use true CFG; use tp, sp and cp", p->parallel);
    if (p->port < 0 || p->port > 65535 || p->queue_capacity < 1 || p->max_steps < 1 || p->timeout_s <= 0 ||
        (strcmp(p->dtype, "f32") && strcmp(p->dtype, "bf16")))
        return dl_fail(DL_ERR_FORMAT, "serving profile: port, queue_capacity, max_steps, request_timeout_s or dtype out of range");
    return DL_OK;
}

/* What the model makes and the frame counts served. A folder that is not a model
 * difflet knows is left to the model process to refuse (with its reason). */
static dl_status resolve_frames(dl_deployment *p) {
    const dl_model_entry *e = NULL;
    p->video = 0, p->frame_step = 1;
    if (dl_registry_lookup(p->model, &e) == DL_OK && e->output != DL_MEDIA_IMAGE) {
        p->video = 1;
        p->frame_step = 4; /* diffusers' video pipelines: the VAE's temporal scale factor */
        dl_model_dir *d;
        const cJSON *vae;
        int64_t ts;
        if (dl_model_dir_open(&d, p->model) == DL_OK) {
            if (dl_model_dir_config(d, "vae", &vae) == DL_OK &&
                dl_cfg_int(vae, "vae/config.json", "scale_factor_temporal", 4, &ts) == DL_OK && ts >= 1 && ts <= 64)
                p->frame_step = (int)ts;
            dl_model_dir_free(d);
        }
    }
    if (p->video && !p->fps_given) { /* the model's own rate (difflet.json, else the pipeline's) */
        dl_model_defaults md;
        dl_registry_defaults(e, p->model, &md);
        if (md.fps > 0) p->fps = md.fps;
    }
    if (!p->frames_given) { /* the model's own: 81 frames for Wan, one for an image */
        int w, h, f = 1;
        if (p->video) e->default_shape(p->model, &w, &h, &f);
        p->nframes = 1, p->frames[0] = f > 0 ? f : 1;
    }
    int n = 0;
    for (int i = 0; i < p->nframes; i++) {
        if (!p->video && p->frames[i] != 1)
            return dl_fail(DL_ERR_INVALID, "serving deployment: `%s` makes images: frames must be [1] (or left out)", p->model);
        int f = dl_deployment_round_frames(p, p->frames[i]), seen = 0;
        if (f != p->frames[i])
            DL_WARN("serving deployment: %d frames rounded to %d (valid counts are %d k + 1, as the pipeline rounds them)",
                    p->frames[i], f, p->frame_step);
        for (int k = 0; k < n; k++) seen |= p->frames[k] == f;
        if (!seen) p->frames[n++] = f;
    }
    p->nframes = n;
    if (p->nsizes * p->nframes > 16)
        return dl_fail(DL_ERR_INVALID, "serving deployment: %d sizes x %d frame counts is %d pipelines; at most 16", p->nsizes,
                       p->nframes, p->nsizes * p->nframes);
    return DL_OK;
}

dl_status dl_deployment_set_model(dl_deployment *p, const char *ref) {
    char resolved[sizeof p->model], given[sizeof p->model];
    snprintf(given, sizeof given, "%s", ref);
    dl_status s = dl_model_resolve(given, resolved, sizeof resolved);
    if (s != DL_OK) return s;
    int same = !strcmp(resolved, given); /* a folder, not a Hub id */
    if (!p->model_id[0]) {
        if (!same) snprintf(p->model_id, sizeof p->model_id, "%.*s", (int)strcspn(given, "@"), given);
        else {
            size_t n = strlen(given);
            while (n > 1 && given[n - 1] == '/') given[--n] = 0;
            const char *b = strrchr(given, '/');
            snprintf(p->model_id, sizeof p->model_id, "%.255s", b ? b + 1 : given); /* a longer name is cut */
        }
    }
    snprintf(p->model, sizeof p->model, "%s", resolved);
    return resolve_frames(p);
}

int dl_deployment_round_frames(const dl_deployment *p, int frames) {
    int t = p->frame_step > 1 ? p->frame_step : 1;
    if (!p->video) return 1;
    return frames % t == 1 % t ? frames : frames / t * t + 1;
}

dl_status dl_deployment_load(dl_deployment *p, const char *path) {
    defaults(p);
    if (path) {
        cJSON *j;
        dl_status s = dl_json_read_object(path, NULL, &j);
        if (s != DL_OK) return s;
        s = dl_deployment_from_json(p, j);
        cJSON_Delete(j);
        if (s != DL_OK) return s;
    }
    if (!p->db[0]) snprintf(p->db, sizeof p->db, "%.1000s/jobs.sqlite", p->results);
    if (!p->model_id[0]) { /* the defaults' model */
        dl_status s = dl_deployment_set_model(p, p->model);
        if (s != DL_OK) return s;
    }
    return DL_OK;
}

cJSON *dl_deployment_to_json(const dl_deployment *p) {
    cJSON *j = cJSON_CreateObject(), *sz = cJSON_AddArrayToObject(j, "sizes");
    cJSON_AddStringToObject(j, "model", p->model);
    cJSON_AddStringToObject(j, "model_id", p->model_id);
    cJSON_AddStringToObject(j, "results_dir", p->results);
    cJSON_AddStringToObject(j, "db", p->db);
    cJSON_AddStringToObject(j, "host", p->host);
    cJSON_AddStringToObject(j, "dtype", p->dtype);
    cJSON_AddStringToObject(j, "cache", p->cache);
    cJSON_AddStringToObject(j, "parallel", p->parallel);
    cJSON_AddNumberToObject(j, "port", p->port);
    cJSON_AddNumberToObject(j, "queue_capacity", p->queue_capacity);
    cJSON_AddNumberToObject(j, "max_steps", p->max_steps);
    cJSON_AddNumberToObject(j, "max_prompt_bytes", p->max_prompt_bytes);
    cJSON_AddNumberToObject(j, "request_timeout_s", p->timeout_s);
    cJSON_AddNumberToObject(j, "cancel_grace_s", p->grace_s);
    cJSON_AddNumberToObject(j, "result_ttl_s", p->result_ttl_s);
    cJSON_AddNumberToObject(j, "no_compile", p->no_compile);
    cJSON_AddNumberToObject(j, "replicas", p->replicas);
    cJSON_AddNumberToObject(j, "idle_timeout_s", p->idle_timeout_s);
    cJSON_AddNumberToObject(j, "max_connections", p->max_connections);
    cJSON_AddNumberToObject(j, "max_connections_per_ip", p->max_connections_per_ip);
    cJSON_AddNumberToObject(j, "health_port", p->health_port);
    cJSON_AddNumberToObject(j, "fps", p->fps);
    cJSON_AddNumberToObject(j, "max_sequence_length", p->max_sequence_length);
    cJSON *fr = cJSON_AddArrayToObject(j, "frames");
    for (int i = 0; i < p->nframes; i++) cJSON_AddItemToArray(fr, cJSON_CreateNumber(p->frames[i]));
    for (int i = 0; i < p->nsizes; i++) {
        char s[32];
        snprintf(s, sizeof s, "%dx%d", p->sizes[i][0], p->sizes[i][1]);
        cJSON_AddItemToArray(sz, cJSON_CreateString(s));
    }
    return j;
}
