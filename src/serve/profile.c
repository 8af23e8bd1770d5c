/* The deployment: one JSON file (all fields optional), defaults serve difflet-tiny
 * at 64x64 on 127.0.0.1:8080. A video model also serves a list of frame counts
 * (`frames`, default the model's own) at a default `fps`. Several models are a
 * `models` list whose entries take the top level's settings (dl_serve_config); each
 * model process reads its own model's deployment in the one-model form. */
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
    snprintf(p->dtype, sizeof p->dtype, "%s", dl_dtype_name(dl_dtype_default())); /* as generate's */
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
    if (cJSON_GetObjectItemCaseSensitive(j, "models"))
        return dl_fail(DL_ERR_FORMAT, "serving deployment: `models` (a list) is a whole server's; one model's deployment has `model`");
    double reps = p->replicas, units = p->units;
    double port = p->port, qc = p->queue_capacity, ms = p->max_steps, mp = p->max_prompt_bytes, nc = p->no_compile;
    double mc = p->max_connections, mci = p->max_connections_per_ip, hp = p->health_port;
    if (!str_field(j, "model", p->model, sizeof p->model) || !str_field(j, "results_dir", p->results, sizeof p->results) ||
        !str_field(j, "db", p->db, sizeof p->db) || !str_field(j, "host", p->host, sizeof p->host) ||
        !str_field(j, "api_key", p->api_key, sizeof p->api_key) || !str_field(j, "dtype", p->dtype, sizeof p->dtype) ||
        !str_field(j, "allowed_hosts", p->allowed_hosts, sizeof p->allowed_hosts) ||
        !str_field(j, "cache", p->cache, sizeof p->cache) || !str_field(j, "parallel", p->parallel, sizeof p->parallel) ||
        !str_field(j, "scheduler", p->scheduler, sizeof p->scheduler) ||
        !str_field(j, "ddit_profile", p->ddit_profile, sizeof p->ddit_profile) ||
        !str_field(j, "ddit_policy", p->ddit_policy, sizeof p->ddit_policy) || !num_field(j, "units", &units) ||
        !str_field(j, "mpirun_hostfile", p->mpirun_hostfile, sizeof p->mpirun_hostfile) ||
        !str_field(j, "mpirun_args", p->mpirun_args, sizeof p->mpirun_args) ||
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
    p->units = (int)units;
    if (p->scheduler[0]) {
        if (strcmp(p->scheduler, "ddit"))
            return dl_fail(DL_ERR_FORMAT, "serving deployment: scheduler `%s`: the one there is is `ddit`", p->scheduler);
        if (units != floor(units) || p->units < 1 || p->units > 8 || (p->units & (p->units - 1)))
            return dl_fail(DL_ERR_FORMAT, "serving deployment: scheduler ddit needs `units`: a power of two, 1..8");
        if (p->replicas != 1 || (p->parallel[0] && strcmp(p->parallel, "1")))
            return dl_fail(DL_ERR_FORMAT, "serving deployment: scheduler ddit places every request on its own rank groups: "
                                          "leave out replicas and parallel");
        if (!p->ddit_profile[0])
            return dl_fail(DL_ERR_FORMAT, "serving deployment: scheduler ddit needs `ddit_profile` (a profile name: "
                                          "`difflet profile measure` or `import`)");
        if (p->ddit_policy[0] && strcmp(p->ddit_policy, "ddit") && strcmp(p->ddit_policy, "ddit-qa") &&
            strncmp(p->ddit_policy, "sdop:", 5))
            return dl_fail(DL_ERR_FORMAT, "serving deployment: ddit_policy `%s` (ddit, ddit-qa or sdop:N)", p->ddit_policy);
        const dl_model_entry *ent = NULL;
        if (dl_registry_lookup(p->model, &ent) == DL_OK && !ent->resumable)
            return dl_fail(DL_ERR_FORMAT, "serving deployment: scheduler ddit moves requests between rank groups, and %s "
                                          "cannot (its scheduler keeps state between steps); resumable: OpenSoraPipeline",
                           ent->pipeline_class);
    }
    dl_par_config pc;
    if (dl_par_parse(p->parallel, &pc) != DL_OK) return dl_fail(DL_ERR_FORMAT, "serving profile: %s", dl_last_error());
    if (pc.dp > 1 || pc.cfg > 1)
        return dl_fail(DL_ERR_FORMAT, "serving profile: parallel `%s`: data parallelism is `replicas`, and cfg=2 needs every "
                                      "request to use true CFG; use tp, sp and cp", p->parallel);
    if (p->port < 0 || p->port > 65535 || p->queue_capacity < 1 || p->max_steps < 1 || p->timeout_s <= 0 ||
        !dl_dtype_parse(p->dtype, &(dl_dtype){0}, NULL))
        return dl_fail(DL_ERR_FORMAT, "serving profile: port, queue_capacity, max_steps, request_timeout_s or dtype out of range "
                                      "(dtype: " DL_DTYPE_NAMES ")");
    return DL_OK;
}

/* What the model makes and the frame counts served. A folder that is not a model
 * difflet knows is left to the model process to refuse (with its reason). */
static dl_status resolve_frames(dl_deployment *p) {
    const dl_model_entry *e = NULL;
    p->video = 0, p->frame_step = 1;
    if (dl_registry_lookup(p->model, &e) == DL_OK && e->output != DL_MEDIA_IMAGE) {
        p->video = 1;
        p->frame_step = e->any_frames ? 1 : 4; /* diffusers' video pipelines: the VAE's temporal scale factor */
        dl_model_dir *d;
        const cJSON *vae;
        int64_t ts;
        if (!e->any_frames && dl_model_dir_open(&d, p->model) == DL_OK) {
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
        if (p->video) dl_registry_default_shape(e, p->model, &w, &h, &f);
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

/* what a parsed deployment still needs: the store beside the results, and the model
 * resolved when the file named none */
static dl_status finish(dl_deployment *p) {
    if (!p->db[0]) snprintf(p->db, sizeof p->db, "%.1000s/jobs.sqlite", p->results);
    return p->model_id[0] ? DL_OK : dl_deployment_set_model(p, p->model);
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
    return finish(p);
}

/* ---- several models: dl_serve_config ---------------------------------------------- */

/* What a `models` entry may set: the model's own fields (k_own: never taken from the
 * top level, which may not have them beside a list), and the layout and limits that
 * may differ per model (taken from the top level unless the entry says). The other
 * fields are the server's, given once at the top level. */
static const char *const k_own[] = {"model", "model_id", "sizes", "frames", "fps", "max_sequence_length", NULL};
static const char *const k_per_model[] = {"dtype", "cache", "replicas", "parallel", "no_compile", "queue_capacity", "max_steps",
                                          "max_prompt_bytes", "request_timeout_s", "cancel_grace_s", "scheduler", "units",
                                          "ddit_profile", "ddit_policy", "mpirun_hostfile", "mpirun_args", NULL};
static const char *const k_server[] = {"results_dir", "db", "host", "port", "api_key", "allowed_hosts", "result_ttl_s", "idle_timeout_s",
                                       "max_connections", "max_connections_per_ip", "health_port", NULL};

static int in_list(const char *s, const char *const *list) {
    for (int i = 0; list[i]; i++)
        if (!strcmp(s, list[i])) return 1;
    return 0;
}

/* entry i of `models` (a folder or Hub id, or an object) over the top level's
 * settings: the one-model JSON it stands for, NULL with the reason in err */
static cJSON *model_entry(const cJSON *top, const cJSON *e, int i, char *err, size_t en) {
    if (cJSON_IsObject(e) && !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(e, "model"))) {
        snprintf(err, en, "models[%d] needs `model` (a folder or a Hub id)", i);
        return NULL;
    }
    if (!cJSON_IsString(e) && !cJSON_IsObject(e)) {
        snprintf(err, en, "models[%d] must be a model (a folder or a Hub id) or an object with `model`", i);
        return NULL;
    }
    cJSON *one = cJSON_Duplicate(top, 1);
    if (!one) {
        snprintf(err, en, "out of memory");
        return NULL;
    }
    cJSON_DeleteItemFromObjectCaseSensitive(one, "models");
    if (cJSON_IsString(e)) {
        cJSON_AddStringToObject(one, "model", e->valuestring);
        return one;
    }
    for (const cJSON *f = e->child; f; f = f->next) {
        if (!in_list(f->string, k_own) && !in_list(f->string, k_per_model)) {
            snprintf(err, en, "models[%d]: `%.60s` is %s", i, f->string,
                     in_list(f->string, k_server) ? "the server's: give it once, at the top level" : "not a field of a model's entry");
            cJSON_Delete(one);
            return NULL;
        }
        cJSON_DeleteItemFromObjectCaseSensitive(one, f->string);
        cJSON_AddItemToObject(one, f->string, cJSON_Duplicate(f, 1));
    }
    return one;
}

dl_status dl_serve_config_from_json(dl_serve_config *c, const cJSON *j) {
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(j, "models"), *e;
    memset(c, 0, sizeof *c);
    if (!list) { /* the one-model form */
        c->nmodels = 1;
        defaults(&c->models[0]);
        return dl_deployment_from_json(&c->models[0], j);
    }
    int n = cJSON_GetArraySize(list);
    if (!cJSON_IsArray(list) || n < 1 || n > DL_SERVE_MAX_MODELS)
        return dl_fail(DL_ERR_FORMAT, "serving deployment: `models` must be a list of 1 to %d models", DL_SERVE_MAX_MODELS);
    for (int i = 0; k_own[i]; i++)
        if (cJSON_GetObjectItemCaseSensitive(j, k_own[i]))
            return dl_fail(DL_ERR_FORMAT, "serving deployment: with `models`, `%s` goes in each model's entry, not at the top level",
                           k_own[i]);
    cJSON_ArrayForEach(e, list) {
        char why[1200];
        cJSON *one = model_entry(j, e, c->nmodels, why, sizeof why);
        if (!one) return dl_fail(DL_ERR_FORMAT, "serving deployment: %s", why);
        dl_deployment *p = &c->models[c->nmodels];
        defaults(p);
        dl_status s = dl_deployment_from_json(p, one);
        cJSON_Delete(one);
        if (s != DL_OK) { /* the reason copied first: dl_fail formats into the buffer dl_last_error reads */
            snprintf(why, sizeof why, "%s", dl_last_error());
            return dl_fail(s, "models[%d]: %s", c->nmodels, why);
        }
        c->nmodels++;
    }
    return DL_OK;
}

dl_status dl_serve_config_load(dl_serve_config *c, const char *path) {
    memset(c, 0, sizeof *c);
    if (!path) {
        c->nmodels = 1;
        dl_status s = dl_deployment_load(&c->models[0], NULL);
        return s != DL_OK ? s : dl_serve_config_check(c);
    }
    cJSON *j;
    dl_status s = dl_json_read_object(path, NULL, &j);
    if (s != DL_OK) return s;
    s = dl_serve_config_from_json(c, j);
    cJSON_Delete(j);
    for (int i = 0; s == DL_OK && i < c->nmodels; i++) s = finish(&c->models[i]);
    return s != DL_OK ? s : dl_serve_config_check(c);
}

dl_status dl_serve_config_check(dl_serve_config *c) {
    const dl_deployment *d = &c->models[0];
    int procs = 0;
    if (c->nmodels < 1 || c->nmodels > DL_SERVE_MAX_MODELS)
        return dl_fail(DL_ERR_INVALID, "serving deployment: 1 to %d models, not %d", DL_SERVE_MAX_MODELS, c->nmodels);
    for (int i = 0; i < c->nmodels; i++) {
        dl_deployment *p = &c->models[i];
        if (i) { /* the server's settings: the first model's */
            memcpy(p->results, d->results, sizeof p->results), memcpy(p->db, d->db, sizeof p->db);
            memcpy(p->host, d->host, sizeof p->host), memcpy(p->api_key, d->api_key, sizeof p->api_key);
            memcpy(p->allowed_hosts, d->allowed_hosts, sizeof p->allowed_hosts);
            p->port = d->port, p->result_ttl_s = d->result_ttl_s, p->idle_timeout_s = d->idle_timeout_s;
            p->max_connections = d->max_connections, p->max_connections_per_ip = d->max_connections_per_ip;
            p->health_port = d->health_port;
        }
        for (int k = 0; k < i; k++)
            if (!strcmp(p->model_id, c->models[k].model_id))
                return dl_fail(DL_ERR_INVALID, "serving deployment: two served models are called `%s` (%s and %s); give one a "
                                               "`model_id`", p->model_id, c->models[k].model, p->model);
        procs += p->replicas;
    }
    if (procs > DL_SERVE_MAX_PROCESSES)
        return dl_fail(DL_ERR_INVALID, "serving deployment: %d model processes (the models' replicas together); at most %d", procs,
                       DL_SERVE_MAX_PROCESSES);
    return DL_OK;
}

void dl_serve_config_new_model(const dl_serve_config *c, dl_deployment *out) {
    dl_deployment d;
    defaults(&d);
    *out = c->models[0];
    out->model_id[0] = 0;
    out->nsizes = d.nsizes;
    memcpy(out->sizes, d.sizes, sizeof d.sizes);
    out->nframes = 0, out->frames_given = 0;
    out->fps = d.fps, out->fps_given = 0;
    out->max_sequence_length = d.max_sequence_length;
    out->video = 0, out->frame_step = 1;
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
    cJSON_AddStringToObject(j, "scheduler", p->scheduler);
    cJSON_AddNumberToObject(j, "units", p->units);
    cJSON_AddStringToObject(j, "ddit_profile", p->ddit_profile);
    cJSON_AddStringToObject(j, "ddit_policy", p->ddit_policy);
    cJSON_AddStringToObject(j, "mpirun_hostfile", p->mpirun_hostfile);
    cJSON_AddStringToObject(j, "mpirun_args", p->mpirun_args);
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
