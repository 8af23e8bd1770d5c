/* What the LTX-2 audio VAE (ltx2_audio.c) and vocoder (ltx2_vocoder.c) share:
 * element access in the model dtype and small config readers. */
#ifndef DIFFLET_LTX2_AUDIO_IMPL_H
#define DIFFLET_LTX2_AUDIO_IMPL_H

#include <cjson/cJSON.h>
#include <string.h>

#include "difflet/ltx2_audio.h"
#include "models/models_impl.h"

/* element i of an f32 or bf16 buffer, as f32 */
static inline float la_ld(dl_dtype dt, const void *p, int64_t i) {
    if (dt == DL_F32) return ((const float *)p)[i];
    uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* element i := v, rounded to nearest even in bf16 (NaN stays NaN) */
static inline void la_st(dl_dtype dt, void *p, int64_t i, float v) {
    if (dt == DL_F32) {
        ((float *)p)[i] = v;
        return;
    }
    ((uint16_t *)p)[i] = dl_f32_to_bf16(v);
}

/* config list `key` of 1..max integers into v (n of them); absent: the default list
 * def[0..ndef) */
static inline dl_status la_cfg_ints(const cJSON *cfg, const char *file, const char *key, const int64_t *def, int ndef,
                                    int max, int64_t *v, int *n) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (!a) {
        for (int i = 0; i < ndef; i++) v[i] = def[i];
        *n = ndef;
        return DL_OK;
    }
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) < 1 || cJSON_GetArraySize(a) > max)
        return dl_fail(DL_ERR_FORMAT, "`%s`: \"%s\" must be a list of 1 to %d integers", file, key, max);
    *n = cJSON_GetArraySize(a);
    for (int i = 0; i < *n; i++) {
        const cJSON *e = cJSON_GetArrayItem(a, i);
        if (!cJSON_IsNumber(e) || e->valuedouble != (double)(int64_t)e->valuedouble)
            return dl_fail(DL_ERR_FORMAT, "`%s`: \"%s\"[%d] must be an integer", file, key, i);
        v[i] = (int64_t)e->valuedouble;
    }
    return DL_OK;
}

#endif
