/* int8 activation calibration (`difflet calibrate-int8`; docs/int8.md).
 *
 * While it is on, every linear a model makes registers under "<component>/<its first
 * weight's name>" (a fused QKV under its q), and every run of it quantizes its input
 * rows exactly as W8A8 would (per token, asymmetric over L levels, L = dl_q8_levels():
 * 255 or 127 on this CPU) and adds up, per input channel, the squared error and the
 * squared values over every token it saw: act_error is the mean over the channels of
 * sqrt(sum_t err^2 / sum_t x^2), each channel's relative RMS error. (Per channel, not
 * per token: one outlier channel sets a token's step, the other channels round to a
 * few levels or to 0, yet the token's error relative to its norm, which the outlier
 * dominates, stays small; the channel mean shows that loss.) worst_token is the
 * largest one token's relative RMS error. A
 * layer whose act_error is above the threshold is written as "int8-wo" (weight-only:
 * its activations stay in their dtype), the rest "int8" (W8A8); a W8A8 compile of the
 * model reads the file (src/program/cache.c) and its hash is in the program key. */
#include <cjson/cJSON.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "difflet/models.h"
#include "models/models_impl.h"

typedef struct {
    char *name;               /* "<component>/<weight name>" */
    double *ce2, *cx2;        /* per input channel: sums of squared error and of squared values */
    double worst;             /* the worst token's relative RMS error */
    int64_t tokens, k, nonfinite; /* tokens seen; of them, rows holding a NaN or an infinity */
} cal_layer;

static struct {
    int on, levels;
    cal_layer *l;
    int n, cap;
    pthread_mutex_t mu;
} g = {.mu = PTHREAD_MUTEX_INITIALIZER};

void dl_int8_calib_begin(void) {
    pthread_mutex_lock(&g.mu);
    g.on = 1, g.levels = dl_q8_levels();
    pthread_mutex_unlock(&g.mu);
}

void dl_int8_calib_end(void) {
    pthread_mutex_lock(&g.mu);
    for (int i = 0; i < g.n; i++) free(g.l[i].name), free(g.l[i].ce2), free(g.l[i].cx2);
    free(g.l);
    g.l = NULL, g.n = g.cap = 0, g.on = 0;
    pthread_mutex_unlock(&g.mu);
}

int dl_calib_register(const char *component, const char *packed_name) {
    char name[600];
    snprintf(name, sizeof name, "%s/%.*s", component ? component : "?", (int)strcspn(packed_name, "#"), packed_name);
    pthread_mutex_lock(&g.mu);
    if (!g.on) {
        pthread_mutex_unlock(&g.mu);
        return 0;
    }
    int id = 0;
    for (int i = 0; i < g.n && !id; i++)
        if (!strcmp(g.l[i].name, name)) id = i + 1; /* the same layer loaded again (from its program) */
    if (!id && g.n == g.cap) {
        int cap = g.cap ? 2 * g.cap : 256;
        cal_layer *l = realloc(g.l, (size_t)cap * sizeof *l);
        if (l) g.l = l, g.cap = cap;
    }
    if (!id && g.n < g.cap && (g.l[g.n].name = strdup(name))) {
        g.l[g.n] = (cal_layer){.name = g.l[g.n].name};
        id = ++g.n;
    }
    pthread_mutex_unlock(&g.mu);
    return id; /* 0 when out of memory: the layer is not observed, and not written */
}

void dl_calib_observe(int cal, const void *x, int64_t m, int64_t k, int64_t ldx, dl_dtype dt) {
    const double L = g.levels;
    pthread_mutex_lock(&g.mu); /* calibration runs one model at a time: the sums are taken under the lock */
    cal_layer *l = g.on && cal >= 1 && cal <= g.n ? &g.l[cal - 1] : NULL; /* not a layer of an earlier calibration */
    if (l && !l->ce2) {
        l->k = k;
        l->ce2 = calloc((size_t)k, sizeof *l->ce2), l->cx2 = calloc((size_t)k, sizeof *l->cx2);
    }
    if (!l || !l->ce2 || !l->cx2 || l->k != k) {
        pthread_mutex_unlock(&g.mu);
        return;
    }
    for (int64_t r = 0; r < m; r++) {
        const float *xf = dt == DL_F32 ? (const float *)x + r * ldx : NULL;
        const uint16_t *xb = dt == DL_F32 ? NULL : (const uint16_t *)x + r * ldx;
        float lo = 0.f, hi = 0.f;
        for (int64_t j = 0; j < k; j++) {
            const float v = xf ? xf[j] : dl_bf16_to_f32(xb[j]);
            lo = v < lo ? v : lo, hi = v > hi ? v : hi;
        }
        l->tokens++;
        if (!isfinite(lo) || !isfinite(hi) || !isfinite((double)hi - lo)) { /* W8A8 cannot hold this row at all */
            l->nonfinite++;
            continue;
        }
        const double a = ((double)hi - lo) / L, z = a > 0 ? nearbyint(-lo / a) : 0;
        double e = 0, s = 0;
        for (int64_t j = 0; j < k; j++) {
            const double v = xf ? xf[j] : dl_bf16_to_f32(xb[j]);
            double q = a > 0 ? nearbyint(v / a) + z : z;
            q = q < 0 ? 0 : q > L ? L : q;
            const double d = v - (q - z) * a;
            e += d * d, s += v * v;
            l->ce2[j] += d * d, l->cx2[j] += v * v;
        }
        if (s > 0 && sqrt(e / s) > l->worst) l->worst = sqrt(e / s);
    }
    pthread_mutex_unlock(&g.mu);
}

/* the layer's measure: the mean over its input channels of each channel's relative RMS
 * error (a channel that was 0 in every token does not count) */
static double layer_error(const cal_layer *l) {
    double sum = 0;
    int64_t n = 0;
    for (int64_t j = 0; l->ce2 && j < l->k; j++)
        if (l->cx2[j] > 0) sum += sqrt(l->ce2[j] / l->cx2[j]), n++;
    return n ? sum / (double)n : 0;
}

dl_status dl_int8_calib_write(const char *path, double threshold, const char *about_json, int *layers, int *wo) {
    cJSON *root = cJSON_Parse(about_json ? about_json : "{}"), *comps = NULL;
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return dl_fail(DL_ERR_INVALID, "int8 calibration: bad description JSON");
    }
    *layers = *wo = 0;
    pthread_mutex_lock(&g.mu);
    cJSON_AddNumberToObject(root, "threshold", threshold);
    cJSON_AddNumberToObject(root, "levels", g.levels);
    comps = cJSON_AddObjectToObject(root, "components");
    for (int i = 0; i < g.n; i++) {
        const cal_layer *l = &g.l[i];
        if (!l->tokens) continue; /* made but never run: no verdict (it keeps the compile's scheme) */
        const char *slash = strchr(l->name, '/');
        char comp[300];
        snprintf(comp, sizeof comp, "%.*s", (int)(slash - l->name), l->name);
        cJSON *c = cJSON_GetObjectItemCaseSensitive(comps, comp);
        if (!c) c = cJSON_AddObjectToObject(comps, comp);
        /* a row W8A8 cannot quantize (non-finite) makes the layer weight-only */
        const double e = l->nonfinite ? 1.0 : layer_error(l);
        const int keep = l->nonfinite || e > threshold;
        cJSON *o = cJSON_AddObjectToObject(c, slash + 1);
        cJSON_AddNumberToObject(o, "act_error", e);
        cJSON_AddNumberToObject(o, "worst_token", l->nonfinite ? 1.0 : l->worst);
        cJSON_AddNumberToObject(o, "tokens", (double)l->tokens);
        if (l->nonfinite) cJSON_AddNumberToObject(o, "nonfinite_tokens", (double)l->nonfinite);
        cJSON_AddStringToObject(o, "scheme", keep ? "int8-wo" : "int8");
        (*layers)++, *wo += keep;
    }
    pthread_mutex_unlock(&g.mu);
    char *txt = cJSON_Print(root);
    cJSON_Delete(root);
    if (!txt) return dl_fail(DL_ERR_NOMEM, "out of memory");
    dl_status s = *layers ? dl_file_write_atomic(path, txt, strlen(txt))
                          : dl_fail(DL_ERR_INVALID, "int8 calibration: no linear ran (nothing to write)");
    free(txt);
    return s;
}
