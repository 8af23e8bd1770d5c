/* int8 activation calibration (`difflet calibrate-int8`; docs/int8.md).
 *
 * While it is on, every linear a model makes registers under "<component>/<its first
 * weight's name>" (a fused QKV under its q), and every run of it quantizes its input
 * rows exactly as W8A8 would (per token, asymmetric over L levels, L = dl_q8_levels():
 * 255 or 127 on this CPU) and adds up, per layer, the squared error and the squared
 * values: act_error = sqrt(sum |x - deq(q(x))|^2 / sum |x|^2), the relative RMS error
 * of its activations over every token it saw; worst_token the largest one token's. A
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
    double err2, x2, worst;   /* sums of squared error and values; the worst token's relative error */
    int64_t tokens, k;
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
    for (int i = 0; i < g.n; i++) free(g.l[i].name);
    free(g.l);
    g.l = NULL, g.n = g.cap = 0, g.on = 0;
    pthread_mutex_unlock(&g.mu);
}

int dl_calib_register(const char *component, const char *packed_name) {
    if (!g.on) return 0;
    char name[600];
    snprintf(name, sizeof name, "%s/%.*s", component ? component : "?", (int)strcspn(packed_name, "#"), packed_name);
    pthread_mutex_lock(&g.mu);
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
    double err2 = 0, x2 = 0, worst = 0;
    for (int64_t r = 0; r < m; r++) {
        const float *xf = dt == DL_F32 ? (const float *)x + r * ldx : NULL;
        const uint16_t *xb = dt == DL_F32 ? NULL : (const uint16_t *)x + r * ldx;
        float lo = 0.f, hi = 0.f;
        for (int64_t j = 0; j < k; j++) {
            const float v = xf ? xf[j] : dl_bf16_to_f32(xb[j]);
            lo = v < lo ? v : lo, hi = v > hi ? v : hi;
        }
        const double a = ((double)hi - lo) / L, z = a > 0 ? nearbyint(-lo / a) : 0;
        double e = 0, s = 0;
        for (int64_t j = 0; j < k; j++) {
            const double v = xf ? xf[j] : dl_bf16_to_f32(xb[j]);
            double q = a > 0 ? nearbyint(v / a) + z : z;
            q = q < 0 ? 0 : q > L ? L : q;
            const double d = v - (q - z) * a;
            e += d * d, s += v * v;
        }
        err2 += e, x2 += s;
        if (s > 0 && sqrt(e / s) > worst) worst = sqrt(e / s);
    }
    pthread_mutex_lock(&g.mu);
    cal_layer *l = &g.l[cal - 1];
    l->err2 += err2, l->x2 += x2, l->tokens += m, l->k = k;
    if (worst > l->worst) l->worst = worst;
    pthread_mutex_unlock(&g.mu);
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
        const double e = l->x2 > 0 ? sqrt(l->err2 / l->x2) : 0;
        cJSON *o = cJSON_AddObjectToObject(c, slash + 1);
        cJSON_AddNumberToObject(o, "act_error", e);
        cJSON_AddNumberToObject(o, "worst_token", l->worst);
        cJSON_AddNumberToObject(o, "tokens", (double)l->tokens);
        cJSON_AddStringToObject(o, "scheme", e > threshold ? "int8-wo" : "int8");
        (*layers)++, *wo += e > threshold;
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
