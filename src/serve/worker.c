/* The resident model process: loads every program of the profile once, proves it
 * works with a test generation, then serves one job at a time from the API process
 * (framed JSON over a Unix socket). A reader thread takes cancel messages while a
 * job runs; the generation stops at the next step boundary. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "difflet/pipeline.h"
#include "difflet/program.h"
#include "serve/serve_impl.h"

typedef struct {
    int fd;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    cJSON *job; /* the next job, or NULL */
    char running[64];
    volatile int cancel, closed;
} mailbox;

static void *reader(void *arg) {
    mailbox *mb = arg;
    for (;;) {
        cJSON *m;
        if (msg_recv(mb->fd, &m) != DL_OK) break;
        const char *type = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, "type"));
        const char *id = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, "id"));
        pthread_mutex_lock(&mb->mu);
        if (type && !strcmp(type, "job") && !mb->job) {
            mb->job = m;
            m = NULL;
            pthread_cond_signal(&mb->cv);
        } else if (type && !strcmp(type, "cancel") && id && !strcmp(id, mb->running)) {
            mb->cancel = 1;
        }
        pthread_mutex_unlock(&mb->mu);
        cJSON_Delete(m);
    }
    pthread_mutex_lock(&mb->mu); /* the API process is gone: stop */
    mb->closed = 1;
    mb->cancel = 1;
    pthread_cond_signal(&mb->cv);
    pthread_mutex_unlock(&mb->mu);
    return NULL;
}

typedef struct {
    int fd;
    const char *id;
    int cached;
} step_ctx;

static void on_step(void *ctx, int step, int steps, double elapsed) {
    step_ctx *c = ctx;
    (void)elapsed;
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "type", "progress");
    cJSON_AddStringToObject(m, "id", c->id);
    cJSON_AddNumberToObject(m, "step", step);
    cJSON_AddNumberToObject(m, "steps", steps);
    msg_send(c->fd, m);
    cJSON_Delete(m);
}

static void send_simple(int fd, const char *type, const char *id, const char *key, const char *val) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "type", type);
    if (id) cJSON_AddStringToObject(m, "id", id);
    if (key) cJSON_AddStringToObject(m, key, val);
    msg_send(fd, m);
    cJSON_Delete(m);
}

/* The start-up check: a finite picture of the right size that is not flat; for
 * difflet-tiny, a blue background for "... on a blue background". */
static dl_status test_generation(dl_flux_pipeline *p, const serve_profile *pr, int w, int h) {
    uint8_t *rgb = malloc((size_t)(w * h * 3));
    float *img = malloc((size_t)(w * h * 3) * sizeof(float));
    dl_flux_request r = {.prompt = "a large red circle in the centre on a blue background", .negative_prompt = "",
                         .steps = 12, .true_cfg = 3.f, .guidance = 3.5f, .seed = 0};
    dl_status s = rgb && img ? dl_flux_generate(p, &r, rgb, img, NULL) : dl_fail(DL_ERR_NOMEM, "out of memory");
    if (s == DL_OK) {
        double mn = 1, mx = 0, b[3] = {0};
        int n = 0;
        for (int64_t i = 0; i < (int64_t)w * h * 3; i++) {
            if (!isfinite(img[i])) s = dl_fail(DL_ERR_INVALID, "test generation: non-finite pixel");
            mn = fmin(mn, img[i]), mx = fmax(mx, img[i]);
        }
        if (s == DL_OK && mx - mn < 0.05) s = dl_fail(DL_ERR_INVALID, "test generation: a flat picture");
        char ev[1100];
        snprintf(ev, sizeof ev, "%s/eval_prompts.json", pr->model);
        if (s == DL_OK && dl_file_exists(ev)) { /* difflet-tiny: the border should be blue */
            for (int y = 0; y < h; y++)
                for (int x = 0; x < w; x++)
                    if (x < 2 || y < 2 || x >= w - 2 || y >= h - 2)
                        for (int c = 0; c < 3; c++) b[c] += rgb[(y * w + x) * 3 + c], n += c == 0;
            for (int c = 0; c < 3; c++) b[c] /= n;
            if (!(b[2] > b[0] + 40 && b[2] > b[1] + 40))
                s = dl_fail(DL_ERR_INVALID, "test generation: expected a blue background, got RGB (%.0f, %.0f, %.0f)", b[0], b[1], b[2]);
        }
    }
    free(rgb), free(img);
    return s;
}

int serve_worker_main(int fd, const serve_profile *pr) {
    dl_flux_pipeline *pipes[8] = {0};
    dl_dtype dt = strcmp(pr->dtype, "bf16") ? DL_F32 : DL_BF16;
    double t0 = dl_now();
    for (int i = 0; i < pr->nsizes; i++) {
        dl_flux_shape shape = {.width = pr->sizes[i][0], .height = pr->sizes[i][1], .dt = dt,
                               .cache = pr->no_compile ? DL_CACHE_NO_COMPILE : DL_CACHE_USE};
        dl_status s = dl_flux_pipeline_load(&pipes[i], pr->model, &shape);
        if (s == DL_OK && i == 0) s = test_generation(pipes[i], pr, pr->sizes[i][0], pr->sizes[i][1]);
        if (s != DL_OK) {
            send_simple(fd, "fatal", NULL, "message", dl_last_error());
            return 1;
        }
    }
    cJSON *ready = cJSON_CreateObject();
    cJSON_AddStringToObject(ready, "type", "ready");
    cJSON_AddNumberToObject(ready, "load_seconds", dl_now() - t0);
    cJSON_AddNumberToObject(ready, "pid", (double)getpid());
    msg_send(fd, ready);
    cJSON_Delete(ready);

    mailbox mb = {.fd = fd, .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    pthread_t th;
    pthread_create(&th, NULL, reader, &mb);
    for (;;) {
        pthread_mutex_lock(&mb.mu);
        while (!mb.job && !mb.closed) pthread_cond_wait(&mb.cv, &mb.mu);
        cJSON *job = mb.job;
        mb.job = NULL;
        if (job) {
            snprintf(mb.running, sizeof mb.running, "%s", cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(job, "id")));
            mb.cancel = 0;
        }
        pthread_mutex_unlock(&mb.mu);
        if (!job) break; /* closed */
        const cJSON *rq = cJSON_GetObjectItemCaseSensitive(job, "request");
        const char *id = mb.running, *out = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(job, "out"));
        int w = (int)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(rq, "width"));
        int h = (int)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(rq, "height"));
        dl_flux_pipeline *p = NULL;
        for (int i = 0; i < pr->nsizes; i++)
            if (pr->sizes[i][0] == w && pr->sizes[i][1] == h) p = pipes[i];
        dl_stepcache_config sc;
        const char *cache = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(rq, "cache"));
        dl_status s = p ? dl_stepcache_parse(cache ? cache : pr->cache, &sc) : dl_fail(DL_ERR_INVALID, "size %dx%d is not served", w, h);
        uint8_t *rgb = malloc((size_t)(w * h * 3));
        step_ctx sctx = {fd, id, 0};
        dl_flux_timing tm = {0};
        if (s == DL_OK) {
            const cJSON *neg = cJSON_GetObjectItemCaseSensitive(rq, "negative_prompt");
            dl_flux_request r = {.prompt = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(rq, "prompt")),
                                 .negative_prompt = cJSON_IsString(neg) ? neg->valuestring : NULL,
                                 .steps = (int)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(rq, "steps")),
                                 .guidance = (float)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(rq, "guidance_scale")),
                                 .true_cfg = (float)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(rq, "true_cfg_scale")),
                                 .seed = (uint64_t)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(rq, "seed")),
                                 .cache = &sc, .cancel = &mb.cancel, .on_step = on_step, .ctx = &sctx};
            s = rgb ? dl_flux_generate(p, &r, rgb, NULL, &tm) : dl_fail(DL_ERR_NOMEM, "out of memory");
        }
        if (s == DL_OK) s = dl_png_write(out, rgb, w, h);
        free(rgb);
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "id", id);
        if (s == DL_OK) {
            cJSON_AddStringToObject(m, "type", "done");
            cJSON_AddNumberToObject(m, "calls", tm.transformer_calls);
            cJSON_AddNumberToObject(m, "cached", tm.cached_steps);
            cJSON_AddNumberToObject(m, "seconds", tm.encode_s + tm.denoise_s + tm.decode_s);
        } else {
            cJSON_AddStringToObject(m, "type", "error");
            cJSON_AddStringToObject(m, "message", dl_last_error());
            cJSON_AddBoolToObject(m, "cancelled", s == DL_ERR_CANCELLED);
        }
        msg_send(fd, m);
        cJSON_Delete(m);
        cJSON_Delete(job);
        pthread_mutex_lock(&mb.mu);
        mb.running[0] = 0;
        pthread_mutex_unlock(&mb.mu);
    }
    pthread_join(th, NULL);
    for (int i = 0; i < pr->nsizes; i++) dl_flux_pipeline_free(pipes[i]);
    return 0;
}
