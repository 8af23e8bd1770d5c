/* Step caching (Difflet §5): decide on the host, per sampling step, whether the
 * denoiser runs or its output is estimated from the last ones.
 *
 * Estimator: the host keeps the previously used output and its most recent change.
 * A full step measures its change against the previously used output (relative L1)
 * and saves the new output and change; a cached step adds the saved change to the
 * previous output and stores that estimate. The scheduler update runs every step.
 *
 * Modes (all keep K initial and K final steps full):
 *   cadence:N         every N-th step of the middle part is cached;
 *   online-delta:a    after a full step whose change is below a x the first change
 *                     measured in this generation, the next step is cached, then a
 *                     full step is forced;
 *   calibrated:F[:t]  a probe score per step is mapped by the calibration polynomial
 *                     to an estimated output change; accumulated (TeaCache) or per
 *                     step, below the threshold t the step is cached. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "difflet/pipeline.h"

dl_status dl_stepcache_load_calibration(const char *path, dl_stepcache_config *c) {
    cJSON *j;
    dl_status s = dl_json_read_object(path, NULL, &j);
    if (s != DL_OK) return s;
    const cJSON *co = cJSON_GetObjectItemCaseSensitive(j, "coefficients");
    const cJSON *th = cJSON_GetObjectItemCaseSensitive(j, "threshold");
    const cJSON *acc = cJSON_GetObjectItemCaseSensitive(j, "accumulate");
    int n = cJSON_GetArraySize(co);
    if (!cJSON_IsArray(co) || n < 1 || n > DL_STEPCACHE_MAX_COEF) {
        cJSON_Delete(j);
        return dl_fail(DL_ERR_FORMAT, "`%s`: needs \"coefficients\": 1 to %d numbers (highest degree first)", path,
                       DL_STEPCACHE_MAX_COEF);
    }
    for (int i = 0; i < n; i++) {
        const cJSON *v = cJSON_GetArrayItem(co, i);
        if (!cJSON_IsNumber(v)) {
            cJSON_Delete(j);
            return dl_fail(DL_ERR_FORMAT, "`%s`: coefficient %d is not a number", path, i);
        }
        c->coef[i] = v->valuedouble;
    }
    c->ncoef = n;
    if (cJSON_IsNumber(th) && c->threshold <= 0) c->threshold = (float)th->valuedouble;
    c->accumulate = acc ? cJSON_IsTrue(acc) : 1;
    cJSON_Delete(j);
    if (!(c->threshold > 0)) return dl_fail(DL_ERR_INVALID, "`%s`: no threshold (give one as calibrated:FILE:THRESHOLD)", path);
    return DL_OK;
}

dl_status dl_stepcache_parse(const char *spec, dl_stepcache_config *c) {
    memset(c, 0, sizeof *c);
    c->keep_first = c->keep_last = 5;
    c->alpha = 0.6f;
    if (!spec || !*spec || !strcmp(spec, "off")) return DL_OK;
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", spec);
    char *arg = strchr(buf, ':');
    if (arg) *arg++ = 0;
    char *end;
    if (!strcmp(buf, "cadence")) {
        long n = arg ? strtol(arg, &end, 10) : 0;
        if (!arg || *end || n < 2 || n > 1000) return dl_fail(DL_ERR_INVALID, "cache cadence:N needs N in 2..1000");
        c->mode = DL_STEPCACHE_CADENCE;
        c->cadence = (int)n;
    } else if (!strcmp(buf, "online-delta")) {
        c->mode = DL_STEPCACHE_ONLINE_DELTA;
        if (arg) {
            c->alpha = strtof(arg, &end);
            if (*end || !(c->alpha > 0 && c->alpha < 10)) return dl_fail(DL_ERR_INVALID, "cache online-delta:ALPHA needs 0 < ALPHA < 10");
        }
    } else if (!strcmp(buf, "calibrated")) {
        if (!arg || !*arg) return dl_fail(DL_ERR_INVALID, "cache calibrated:FILE[:THRESHOLD] needs a calibration file");
        char *thr = strrchr(arg, ':');
        if (thr) {
            *thr++ = 0;
            c->threshold = strtof(thr, &end);
            if (*end || !(c->threshold > 0)) return dl_fail(DL_ERR_INVALID, "cache calibrated: threshold must be a positive number");
        }
        c->mode = DL_STEPCACHE_CALIBRATED;
        return dl_stepcache_load_calibration(arg, c);
    } else {
        return dl_fail(DL_ERR_INVALID, "cache mode `%s` is not one of off, cadence:N, online-delta[:ALPHA], calibrated:FILE[:T]", buf);
    }
    return DL_OK;
}

void dl_stepcache_reset(dl_stepcache_state *s) {
    float *a = s->prev, *b = s->delta;
    int64_t n = s->n;
    memset(s, 0, sizeof *s);
    s->prev = a, s->delta = b, s->n = n;
}

double dl_stepcache_poly(const dl_stepcache_config *c, double x) {
    double y = 0;
    for (int i = 0; i < c->ncoef; i++) y = y * x + c->coef[i];
    return y;
}

int dl_stepcache_decide(const dl_stepcache_config *c, dl_stepcache_state *s, int step, int steps, double probe) {
    int cache = 0;
    /* a cached step needs a previous output and a change to extrapolate with */
    int can = s->have_prev && s->have_delta && step >= c->keep_first && step < steps - c->keep_last;
    switch (c->mode) {
    case DL_STEPCACHE_OFF: break;
    case DL_STEPCACHE_CADENCE: cache = can && (step - c->keep_first) % c->cadence == c->cadence - 1; break;
    case DL_STEPCACHE_ONLINE_DELTA:
        cache = can && s->arm && !s->cached_last;
        break;
    case DL_STEPCACHE_CALIBRATED: {
        double est = dl_stepcache_poly(c, probe);
        if (c->accumulate) {
            s->acc += est;
            cache = can && !s->cached_last && s->acc < c->threshold;
            if (!cache) s->acc = 0;
        } else {
            cache = can && est < c->threshold;
        }
        break;
    }
    }
    s->cached_last = cache;
    if (cache) s->arm = 0;
    return cache;
}

/* relative L1 change of out against prev */
static double rel_l1(const float *out, const float *prev, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num += fabs((double)out[i] - prev[i]);
        den += fabs((double)prev[i]);
    }
    return den > 0 ? num / den : 0.0;
}

double dl_stepcache_full(const dl_stepcache_config *c, dl_stepcache_state *s, const float *out) {
    double change = 0;
    if (s->have_prev) {
        change = rel_l1(out, s->prev, s->n);
        for (int64_t i = 0; i < s->n; i++) s->delta[i] = out[i] - s->prev[i];
        s->have_delta = 1;
        if (!s->have_first) {
            s->first_change = change;
            s->have_first = 1;
        }
        /* online-delta: arm a cached step after a slow full step */
        s->arm = c->mode == DL_STEPCACHE_ONLINE_DELTA && change < c->alpha * s->first_change;
    }
    memcpy(s->prev, out, (size_t)s->n * sizeof *out);
    s->have_prev = 1;
    s->last_change = change;
    return change;
}

void dl_stepcache_estimate(dl_stepcache_state *s, float *out) {
    for (int64_t i = 0; i < s->n; i++) out[i] = s->prev[i] + s->delta[i];
    memcpy(s->prev, out, (size_t)s->n * sizeof *out);
}
