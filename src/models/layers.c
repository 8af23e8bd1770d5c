/* Building blocks shared by the model files. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/models_impl.h"

const char *pname(char *buf, size_t n, const char *prefix, const char *fmt, ...) {
    size_t o = (size_t)snprintf(buf, n, "%s", prefix);
    va_list ap;
    va_start(ap, fmt);
    if (o < n) vsnprintf(buf + o, n - o, fmt, ap);
    va_end(ap);
    return buf;
}

dl_status param_f32(const dl_checkpoint *ck, const char *name, int ndim, const int64_t *shape, float **out) {
    const dl_st_tensor *t;
    *out = NULL;
    dl_status s = dl_ckpt_expect(ck, name, ndim, shape, &t);
    if (s != DL_OK) return s;
    float *p = malloc((size_t)(t->numel ? t->numel : 1) * sizeof *p);
    if (!p) return dl_fail(DL_ERR_NOMEM, "out of memory loading `%s`", name);
    if ((s = dl_ckpt_read(t, DL_F32, p)) != DL_OK) {
        free(p);
        return s;
    }
    *out = p;
    return DL_OK;
}

dl_status lin_load(lin *l, const dl_checkpoint *ck, const char *const *names, const char *const *bnames, int nparts,
                   const int64_t *n_parts, int64_t m, int64_t k, dl_dtype dt, dl_dtype dst_dt, dl_act act) {
    return lin_load_ld(l, ck, names, bnames, nparts, n_parts, m, k, dt, dst_dt, act, 0);
}

dl_status lin_load_ld(lin *l, const dl_checkpoint *ck, const char *const *names, const char *const *bnames,
                      int nparts, const int64_t *n_parts, int64_t m, int64_t k, dl_dtype dt, dl_dtype dst_dt,
                      dl_act act, int64_t ldy) {
    memset(l, 0, sizeof *l);
    int64_t n = 0;
    for (int i = 0; i < nparts; i++) n += n_parts[i];
    float *w = malloc((size_t)(n * k) * sizeof *w), *b = NULL;
    int any_bias = 0;
    for (int i = 0; bnames && i < nparts; i++) any_bias |= bnames[i] != NULL;
    if (any_bias) b = calloc((size_t)n, sizeof *b);
    if (!w || (any_bias && !b)) {
        free(w), free(b);
        return dl_fail(DL_ERR_NOMEM, "out of memory loading `%s`", names[0]);
    }
    dl_status s = DL_OK;
    int64_t row = 0;
    for (int i = 0; i < nparts && s == DL_OK; i++) {
        const dl_st_tensor *t;
        int64_t shape[2] = {n_parts[i], k};
        s = dl_ckpt_expect(ck, names[i], 2, shape, &t);
        if (s == DL_OK) s = dl_ckpt_read(t, DL_F32, w + row * k);
        if (s == DL_OK && any_bias && bnames[i]) {
            int64_t bs[1] = {n_parts[i]};
            s = dl_ckpt_expect(ck, bnames[i], 1, bs, &t);
            if (s == DL_OK) s = dl_ckpt_read(t, DL_F32, b + row);
        }
        row += n_parts[i];
    }
    if (s == DL_OK) {
        dl_matmul_desc d = {.m = m, .k = k, .n = n, .dt = dt, .dst_dt = dst_dt, .act = act, .ldy = ldy};
        s = dl_matmul_new(&l->mm, &d, w, DL_F32, b);
    }
    free(w), free(b);
    l->k = k;
    l->n = n;
    return s;
}

void lin_free(lin *l) {
    dl_matmul_free(l->mm);
    l->mm = NULL;
}
