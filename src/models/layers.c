/* Building blocks shared by the model files, and the weight sources: a model's
 * load asks for parameters and layers by checkpoint name; the source reads the
 * checkpoint (converting and packing; recording into an artifact when compiling)
 * or reads an artifact compiled earlier (packed weights used in place). */
#include <cjson/cJSON.h>
#include <math.h>
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/models_impl.h"

const char *dl_pname(char *buf, size_t n, const char *prefix, const char *fmt, ...) {
    size_t o = (size_t)snprintf(buf, n, "%s", prefix);
    va_list ap;
    va_start(ap, fmt);
    if (o < n) vsnprintf(buf + o, n - o, fmt, ap);
    va_end(ap);
    return buf;
}

dl_status dl_ws_open(dl_wsrc **ws, dl_wsrc *given, dl_model_dir *dir, const char *component) {
    *ws = NULL;
    if (given) {
        *ws = given;
        return DL_OK;
    }
    dl_wsrc *w = calloc(1, sizeof *w);
    if (!w) return dl_fail(DL_ERR_NOMEM, "out of memory");
    dl_status s = dl_model_dir_checkpoint(dir, component, &w->ck);
    if (s != DL_OK) {
        free(w);
        return s;
    }
    w->owned = 1, w->component = component;
    *ws = w;
    return DL_OK;
}

void dl_ws_close(dl_wsrc *ws) {
    if (!ws || !ws->owned) return;
    dl_ckpt_free(ws->ck);
    free(ws);
}

int dl_ws_find(const dl_wsrc *ws, const char *name) {
    size_t b;
    if (ws->ck) return dl_ckpt_find(ws->ck, name) != NULL;
    return dl_artifact_get(ws->art, name, "f32", &b) != NULL;
}

const char *dl_ws_label(const dl_wsrc *ws) { return ws->ck ? dl_ckpt_label(ws->ck) : "program artifact"; }

void *dl_ws_alloc(dl_wsrc *ws, size_t bytes) {
    ws->arena += dl_align_up(bytes, DL_ALIGN);
    return dl_aligned_alloc(bytes);
}

void dl_plan_add(act_plan *p, void *dst_ptr_addr, size_t bytes, int first, int last) {
    DL_ASSERT(p->n < PLAN_MAX && first <= last);
    p->b[p->n].dst = (void **)dst_ptr_addr;
    p->b[p->n].bytes = dl_align_up(bytes ? bytes : 1, DL_ALIGN);
    p->b[p->n].first = first;
    p->b[p->n].last = last;
    p->n++;
}

void dl_plan_attn_scratch(act_plan *p, void *dst_ptr_addr, dl_dtype dt, int64_t S, int64_t heads, int64_t head_dim,
                       int causal, int first, int last) {
    const int64_t st = 3 * heads * head_dim; /* fused QKV rows */
    dl_attn_args a = {.dt = dt, .sq = S, .sk = S, .heads = heads, .head_dim = head_dim, .q_stride = st, .k_stride = st,
                      .v_stride = st, .kv_end = S, .causal = causal};
    dl_plan_add(p, dst_ptr_addr, dl_attn_scratch_bytes(&a, omp_get_max_threads()) + 64, first, last);
}

void dl_plan_place(act_plan *p) {
    int order[PLAN_MAX], placed[PLAN_MAX], np = 0;
    for (int i = 0; i < p->n; i++) order[i] = i;
    for (int i = 1; i < p->n; i++) /* largest first */
        for (int j = i; j > 0 && p->b[order[j]].bytes > p->b[order[j - 1]].bytes; j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    p->total = 0;
    for (int k = 0; k < p->n; k++) {
        int i = order[k];
        size_t off = 0;
        for (int moved = 1; moved;) { /* the lowest offset clear of every live-overlapping buffer */
            moved = 0;
            for (int q = 0; q < np; q++) {
                int j = placed[q];
                int live = p->b[i].first <= p->b[j].last && p->b[j].first <= p->b[i].last;
                int hit = off < p->b[j].off + p->b[j].bytes && p->b[j].off < off + p->b[i].bytes;
                if (live && hit) {
                    off = p->b[j].off + p->b[j].bytes;
                    moved = 1;
                }
            }
        }
        p->b[i].off = off;
        placed[np++] = i;
        if (off + p->b[i].bytes > p->total) p->total = off + p->b[i].bytes;
    }
}

dl_status dl_plan_commit(act_plan *p, dl_wsrc *ws, void **arena) {
    dl_plan_place(p);
    char *base = dl_aligned_alloc(p->total);
    *arena = base;
    if (!base) return dl_fail(DL_ERR_NOMEM, "cannot allocate a %zu-byte activation arena", p->total);
    for (int i = 0; i < p->n; i++) *p->b[i].dst = base + p->b[i].off;
    ws->arena += p->total;
    return DL_OK;
}

static dl_status art_missing(const char *name) {
    return dl_fail(DL_ERR_FORMAT, "program artifact has no tensor `%s` (compiled for another model?)", name);
}

dl_status dl_param_f32(dl_wsrc *ws, const char *name, int ndim, const int64_t *shape, float **out) {
    *out = NULL;
    int64_t numel = 1;
    for (int i = 0; i < ndim; i++) numel *= shape[i];
    float *p = malloc((size_t)(numel ? numel : 1) * sizeof *p);
    if (!p) return dl_fail(DL_ERR_NOMEM, "out of memory loading `%s`", name);
    dl_status s = DL_OK;
    if (ws->ck) {
        const dl_st_tensor *t;
        s = dl_ckpt_expect(ws->ck, name, ndim, shape, &t);
        if (s == DL_OK) s = dl_ckpt_read(t, DL_F32, p);
        if (s == DL_OK && ws->rec) s = dl_artifact_writer_add(ws->rec, name, "f32", p, (size_t)numel * 4);
    } else {
        size_t bytes;
        const void *d = dl_artifact_get(ws->art, name, "f32", &bytes);
        if (!d) s = art_missing(name);
        else if (bytes != (size_t)numel * 4) s = dl_fail(DL_ERR_FORMAT, "program artifact: `%s` has %zu bytes, expected %lld", name, bytes, (long long)numel * 4);
        else memcpy(p, d, bytes);
    }
    if (s != DL_OK) {
        free(p);
        return s;
    }
    *out = p;
    return DL_OK;
}

dl_status dl_lin_load(lin *l, dl_wsrc *ws, const char *const *names, const char *const *bnames, int nparts,
                   const int64_t *n_parts, int64_t m, int64_t k, dl_dtype dt, dl_dtype dst_dt, dl_act act) {
    return dl_lin_load_ld(l, ws, names, bnames, nparts, n_parts, m, k, dt, dst_dt, act, 0);
}

dl_status dl_lin_load_ld(lin *l, dl_wsrc *ws, const char *const *names, const char *const *bnames, int nparts,
                      const int64_t *n_parts, int64_t m, int64_t k, dl_dtype dt, dl_dtype dst_dt, dl_act act,
                      int64_t ldy) {
    return dl_lin_load_split(l, ws, names, bnames, nparts, n_parts, m, k, dt, dst_dt, act, ldy, NULL);
}

/* Packed weights in an artifact: `name` (layout "onednn", the bytes) and
 * `name` + "#layout" (layout "onednn-md", the record of their oneDNN layout). */
static dl_status art_packed(const dl_artifact *a, const char *name, dl_packed *out) {
    char ln[320];
    snprintf(ln, sizeof ln, "%s#layout", name);
    out->data = dl_artifact_get(a, name, "onednn", &out->bytes);
    out->layout = dl_artifact_get(a, ln, "onednn-md", &out->layout_bytes);
    if (!out->data) return art_missing(name);
    if (!out->layout) return art_missing(ln);
    return DL_OK;
}

static dl_status rec_packed(dl_artifact_writer *w, const char *name, const dl_packed *p) {
    char ln[320];
    snprintf(ln, sizeof ln, "%s#layout", name);
    dl_status s = dl_artifact_writer_add(w, name, "onednn", p->data, p->bytes);
    return s == DL_OK ? dl_artifact_writer_add(w, ln, "onednn-md", p->layout, p->layout_bytes) : s;
}

/* int8 weights: the packed s8 bytes and their record as above, and `name` + "#q8"
 * (layout "q8-w8a8" or "q8-w8": the layer's scheme) with the channel scales and
 * column sums. A layer without the entry was kept in the activation dtype. */
static const char *const k_q8_layout[] = {[DL_QUANT_W8A8] = "q8-w8a8", [DL_QUANT_W8] = "q8-w8"};

static dl_quant art_quant(const dl_artifact *a, const char *name, dl_packed *pk) {
    char qn[320];
    snprintf(qn, sizeof qn, "%s#q8", name);
    for (int q = DL_QUANT_W8A8; q <= DL_QUANT_W8; q++)
        if ((pk->aux = dl_artifact_get(a, qn, k_q8_layout[q], &pk->aux_bytes))) return (dl_quant)q;
    return DL_QUANT_NONE;
}

/* The scheme of one linear under a component's scheme. A layer with K under 32 (a
 * token's activations quantized over so few values lose too much; such layers are
 * patch embeddings of small models, and cheap) or over DL_Q8_MAX_K keeps the
 * activation dtype, as does one whose weights int8 cannot hold:
 * relative error of the per-channel quantization (measured here) above 2 %, i.e.
 * weights with outlier columns. The rest take the scheme. */
static dl_quant lin_quant(const dl_wsrc *ws, const char *pk, int64_t k, int64_t n, const float *w) {
    const dl_quant scheme = ws->quant;
    if (scheme == DL_QUANT_NONE || k < 32 || k > DL_Q8_MAX_K) return DL_QUANT_NONE;
    double e = dl_q8_weight_error(w, n, k);
    if (e > 0.02) {
        DL_DEBUG("linear %lldx%lld stays unquantized: int8 weight error %.3f", (long long)n, (long long)k, e);
        return DL_QUANT_NONE;
    }
    if (scheme == DL_QUANT_W8A8 && ws->calib) { /* the calibration's verdict on its activations */
        char name[300];
        snprintf(name, sizeof name, "%.*s", (int)(strcspn(pk, "#")), pk);
        const cJSON *sc = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(ws->calib, name), "scheme");
        if (cJSON_IsString(sc) && !strcmp(sc->valuestring, "int8-wo")) {
            DL_DEBUG("linear %s is weight-only: its calibrated activation error is above the threshold", name);
            return DL_QUANT_W8;
        }
    }
    return scheme;
}

dl_status dl_lin_make(lin *l, dl_wsrc *ws, const char *pk, const char *bk, const dl_matmul_desc *d0, const float *w,
                      const float *b) {
    dl_matmul_desc d = *d0;
    l->k = d.k;
    l->n = d.n;
    l->m = d.m, l->ldx = d.ldx ? d.ldx : d.k, l->dt = d.dt;
    l->cal = dl_calib_register(ws->component, pk);
    if (!ws->ck) { /* artifact: packed weights in place, bias copied by oneDNN's wrapper */
        size_t bb;
        dl_packed pw;
        dl_status s = art_packed(ws->art, pk, &pw);
        const void *ab = bk ? dl_artifact_get(ws->art, bk, "f32", &bb) : NULL;
        if (s != DL_OK) return s;
        if (bk && (!ab || bb != (size_t)d.n * 4)) return art_missing(bk);
        d.quant = art_quant(ws->art, pk, &pw);
        return dl_matmul_new_packed(&l->mm, &d, &pw, ab);
    }
    d.quant = lin_quant(ws, pk, d.k, d.n, w);
    dl_status s = dl_matmul_new(&l->mm, &d, w, DL_F32, b);
    if (s == DL_OK && ws->rec) {
        dl_packed packed;
        dl_matmul_packed(l->mm, &packed);
        s = rec_packed(ws->rec, pk, &packed);
        if (s == DL_OK && d.quant != DL_QUANT_NONE) {
            char qn[320];
            snprintf(qn, sizeof qn, "%s#q8", pk);
            s = dl_artifact_writer_add(ws->rec, qn, k_q8_layout[d.quant], packed.aux, packed.aux_bytes);
        }
        if (s == DL_OK && bk) s = dl_artifact_writer_add(ws->rec, bk, "f32", b, (size_t)d.n * 4);
    }
    return s;
}

dl_status dl_lin_load_split(lin *l, dl_wsrc *ws, const char *const *names, const char *const *bnames, int nparts,
                         const int64_t *n_parts, int64_t m, int64_t k, dl_dtype dt, dl_dtype dst_dt, dl_act act,
                         int64_t ldy, const lin_split *sp) {
    memset(l, 0, sizeof *l);
    static const lin_split whole = {0};
    if (!sp) sp = &whole;
    int64_t n = 0, kk = 0;
    for (int i = 0; i < nparts; i++) {
        if (sp->rows && sp->row0 + sp->rows > n_parts[i])
            return dl_fail(DL_ERR_INVALID, "`%s`: row slice [%lld, %lld) is outside its %lld rows", names[i],
                           (long long)sp->row0, (long long)(sp->row0 + sp->rows), (long long)n_parts[i]);
        n += sp->rows ? sp->rows : n_parts[i];
    }
    for (int j = 0; j < sp->nseg; j++) {
        if (sp->seg0[j] < 0 || sp->seg0[j] + sp->segn[j] > k)
            return dl_fail(DL_ERR_INVALID, "`%s`: column slice is outside its %lld columns", names[0], (long long)k);
        kk += sp->segn[j];
    }
    if (!sp->nseg) kk = k;
    int any_bias = 0;
    for (int i = 0; bnames && i < nparts; i++) any_bias |= bnames[i] != NULL;
    if (sp->no_bias) any_bias = 0;
    dl_matmul_desc d = {.m = m, .k = kk, .n = n, .dt = dt, .dst_dt = dst_dt, .act = act, .ldy = ldy};
    char pk[300], bk[300];
    snprintf(pk, sizeof pk, "%s#packed", names[0]);
    snprintf(bk, sizeof bk, "%s#bias", names[0]);
    if (!ws->ck) return dl_lin_make(l, ws, pk, any_bias ? bk : NULL, &d, NULL, NULL);
    int64_t pmax = 0;
    for (int i = 0; i < nparts; i++) pmax = n_parts[i] > pmax ? n_parts[i] : pmax;
    int sliced = sp->rows || sp->nseg;
    float *w = malloc((size_t)(n * kk) * sizeof *w), *b = NULL;
    float *full = sliced ? malloc((size_t)(pmax * k) * sizeof *full) : NULL, *fb = malloc((size_t)pmax * sizeof *fb);
    if (any_bias) b = calloc((size_t)n, sizeof *b);
    if (!w || !fb || (sliced && !full) || (any_bias && !b)) {
        free(w), free(b), free(full), free(fb);
        return dl_fail(DL_ERR_NOMEM, "out of memory loading `%s`", names[0]);
    }
    dl_status s = DL_OK;
    int64_t row = 0;
    for (int i = 0; i < nparts && s == DL_OK; i++) {
        const dl_st_tensor *t;
        int64_t shape[2] = {n_parts[i], k}, r0 = sp->rows ? sp->row0 : 0, rn = sp->rows ? sp->rows : n_parts[i];
        s = dl_ckpt_expect(ws->ck, names[i], 2, shape, &t);
        if (s == DL_OK) s = dl_ckpt_read(t, DL_F32, sliced ? full : w + row * kk);
        if (s == DL_OK && sliced) /* keep rows [r0, r0 + rn) and the column segments */
            for (int64_t r = 0; r < rn; r++) {
                const float *src = full + (r0 + r) * k;
                float *dst = w + (row + r) * kk;
                if (!sp->nseg) memcpy(dst, src, (size_t)k * 4);
                for (int j = 0, o = 0; j < sp->nseg; o += (int)sp->segn[j], j++)
                    memcpy(dst + o, src + sp->seg0[j], (size_t)sp->segn[j] * 4);
            }
        if (s == DL_OK && any_bias && bnames[i]) {
            int64_t bs[1] = {n_parts[i]};
            s = dl_ckpt_expect(ws->ck, bnames[i], 1, bs, &t);
            if (s == DL_OK) s = dl_ckpt_read(t, DL_F32, fb);
            if (s == DL_OK) memcpy(b + row, fb + r0, (size_t)rn * 4);
        }
        row += rn;
    }
    if (s == DL_OK) s = dl_lin_make(l, ws, pk, any_bias ? bk : NULL, &d, w, b);
    free(w), free(b), free(full), free(fb);
    return s;
}

void dl_lin_free(lin *l) {
    dl_matmul_free(l->mm);
    l->mm = NULL;
}

dl_status dl_conv_load(dl_conv **c, dl_wsrc *ws, const char *base, const dl_conv_desc *d) {
    char wn[300], bn[300], pk[300];
    snprintf(wn, sizeof wn, "%s.weight", base);
    snprintf(bn, sizeof bn, "%s.bias", base);
    snprintf(pk, sizeof pk, "%s#packed", base);
    *c = NULL;
    int64_t ws_[5] = {d->cout, d->cin, d->kernel[0], d->kernel[1], d->kernel[2]}, bsh[1] = {d->cout};
    float *bs = NULL;
    dl_status s = dl_param_f32(ws, bn, 1, bsh, &bs); /* bias: a plain parameter (recorded as such) */
    if (s != DL_OK) return s;
    if (!ws->ck) {
        dl_packed w;
        if ((s = art_packed(ws->art, pk, &w)) == DL_OK) s = dl_conv_new_packed(c, d, &w, bs);
        free(bs);
        return s;
    }
    float *wt = NULL;
    if ((s = dl_param_f32_nr(ws, wn, 2 + d->ndim, ws_, &wt)) == DL_OK) s = dl_conv_new(c, d, wt, DL_F32, bs);
    if (s == DL_OK && ws->rec) {
        dl_packed packed;
        dl_conv_packed(*c, &packed);
        s = rec_packed(ws->rec, pk, &packed);
    }
    free(wt), free(bs);
    return s;
}

dl_status dl_param_f32_map(dl_wsrc *ws, const char *name, int ndim, const int64_t *shape, const float **out, float **owned) {
    *out = NULL;
    *owned = NULL;
    size_t bytes;
    const void *d = ws->ck ? NULL : dl_artifact_get(ws->art, name, "f32", &bytes);
    if (!d || (uintptr_t)d % sizeof(float)) { /* checkpoint (converted, recorded), or an unaligned entry: a copy */
        dl_status s = dl_param_f32(ws, name, ndim, shape, owned);
        *out = *owned;
        return s;
    }
    int64_t numel = 1;
    for (int i = 0; i < ndim; i++) numel *= shape[i];
    if (bytes != (size_t)numel * 4)
        return dl_fail(DL_ERR_FORMAT, "program artifact: `%s` has %zu bytes, expected %lld", name, bytes, (long long)numel * 4);
    *out = d; /* in place: the read-only mapping outlives the model */
    return DL_OK;
}

/* dl_param_f32 from the checkpoint without recording (weights recorded packed instead) */
dl_status dl_param_f32_nr(dl_wsrc *ws, const char *name, int ndim, const int64_t *shape, float **out) {
    dl_artifact_writer *rec = ws->rec;
    ws->rec = NULL;
    dl_status s = dl_param_f32(ws, name, ndim, shape, out);
    ws->rec = rec;
    return s;
}

dl_status dl_lin_named(lin *l, dl_wsrc *ck, const char *base, int64_t m, int64_t k, int64_t n, dl_dtype dt,
                       dl_dtype dst, dl_act act, int64_t ldy, const lin_split *sp) {
    char w[256], b[256];
    snprintf(w, sizeof w, "%s.weight", base);
    snprintf(b, sizeof b, "%s.bias", base);
    const char *wn[1] = {w}, *bn[1] = {b};
    return dl_lin_load_split(l, ck, wn, bn, 1, &n, m, k, dt, dst, act, ldy, sp);
}

dl_status dl_lin_qkv(lin *l, dl_wsrc *ck, const char *p, const char *a, const char *b, const char *c, int64_t m,
                     int64_t D, dl_dtype dt, const lin_split *sp) {
    char w[3][256], bb[3][256];
    const char *names[3] = {a, b, c};
    for (int i = 0; i < 3; i++) {
        snprintf(w[i], sizeof w[i], "%s%s.weight", p, names[i]);
        snprintf(bb[i], sizeof bb[i], "%s%s.bias", p, names[i]);
    }
    const char *wn[3] = {w[0], w[1], w[2]}, *bn[3] = {bb[0], bb[1], bb[2]};
    int64_t parts[3] = {D, D, D};
    return dl_lin_load_split(l, ck, wn, bn, 3, parts, m, D, dt, dt, DL_ACT_NONE, 0, sp);
}

dl_status dl_param_vec(dl_wsrc *ck, const char *name, int64_t n, float **out) {
    int64_t shape[1] = {n};
    return dl_param_f32(ck, name, 1, shape, out);
}

dl_status dl_lin_chunks(lin *l, const void *x, size_t xes, void *y, size_t yes, int64_t C, int64_t nch) {
    for (int64_t c = 0; c < nch; c++) {
        dl_status s = lin_run(l, (const char *)x + (size_t)(c * C * l->k) * xes, (char *)y + (size_t)(c * C * l->n) * yes);
        if (s != DL_OK) return s;
    }
    return DL_OK;
}

void dl_expand_kv(dl_dtype dt, const void *qkv, void *kv, int64_t H, int64_t KV, int64_t Dh, int64_t n, int ith, int nth) {
    const int64_t QD = H * Dh, KD = KV * Dh, W = QD + 2 * KD, grp = H / KV;
    const size_t es = dl_dtype_size(dt), hb = (size_t)Dh * es;
    int64_t b, e;
    dl_split(n, ith, nth, &b, &e);
    for (int64_t t = b; t < e; t++) {
        const char *k = (const char *)qkv + (size_t)(t * W + QD) * es, *v = k + (size_t)KD * es;
        char *dk = (char *)kv + (size_t)(t * 2 * QD) * es, *dv = dk + (size_t)QD * es;
        for (int64_t h = 0; h < H; h++) {
            memcpy(dk + (size_t)h * hb, k + (size_t)(h / grp) * hb, hb);
            memcpy(dv + (size_t)h * hb, v + (size_t)(h / grp) * hb, hb);
        }
    }
}

void dl_vcopy(dl_dtype ddt, void *dst, dl_vlayout o, dl_dtype sdt, const void *src, int64_t lds, int64_t C, int64_t T,
              int64_t h, int64_t w) {
    const int64_t hw = h * w;
    DL_PAR({
        int64_t r0, r1;
        dl_split(C * T, ith, nth, &r0, &r1);
        for (int64_t r = r0; r < r1; r++) {
            const int64_t c = r / T, t = r % T, so = c * lds + t * hw;
            for (int64_t i = 0; i < h; i++)
                for (int64_t j = 0; j < w; j++) dl_st(ddt, dst, dl_vat(&o, c, t, i, j), dl_ld(sdt, src, so + i * w + j));
        }
    });
}

void dl_vgroup_norm(dl_dtype dt, void *dst, dl_vlayout o, dl_dtype xdt, const void *x, int64_t ldx, int64_t C,
                    int64_t T, int64_t h, int64_t w, int64_t G, const float *gw, const float *gb, double eps, int silu,
                    double *st) {
    const int64_t cg = C / G, hw = h * w, n = T * hw;
    DL_PAR({
        int64_t g0, g1;
        dl_split(G, ith, nth, &g0, &g1);
        for (int64_t g = g0; g < g1; g++) {
            double sum = 0, sq = 0;
            for (int64_t c = g * cg; c < (g + 1) * cg; c++)
                for (int64_t i = 0; i < n; i++) sum += dl_ld(xdt, x, c * ldx + i);
            const double mean = sum / (double)(cg * n);
            for (int64_t c = g * cg; c < (g + 1) * cg; c++)
                for (int64_t i = 0; i < n; i++) {
                    const double d = dl_ld(xdt, x, c * ldx + i) - mean;
                    sq += d * d;
                }
            st[2 * g] = mean, st[2 * g + 1] = 1.0 / sqrt(sq / (double)(cg * n) + eps);
        }
    });
    DL_PAR({
        int64_t r0, r1;
        dl_split(C * T, ith, nth, &r0, &r1);
        for (int64_t r = r0; r < r1; r++) {
            const int64_t c = r / T, t = r % T, g = c / cg, so = c * ldx + t * hw;
            const float a = (float)(st[2 * g + 1] * gw[c]), sh = (float)(gb[c] - st[2 * g] * st[2 * g + 1] * gw[c]);
            for (int64_t i = 0; i < h; i++)
                for (int64_t j = 0; j < w; j++) {
                    float v = dl_ld(xdt, x, so + i * w + j) * a + sh;
                    dl_st(dt, dst, dl_vat(&o, c, t, i, j), silu ? v / (1.f + expf(-v)) : v);
                }
        }
    });
}

void dl_vresidual(float *x, dl_dtype dt, const void *a, const void *b, int64_t ld, int64_t C, int64_t n) {
    DL_PAR({
        int64_t c0, c1;
        dl_split(C, ith, nth, &c0, &c1);
        for (int64_t c = c0; c < c1; c++)
            for (int64_t i = 0; i < n; i++)
                x[c * ld + i] = dl_ld(dt, a, c * ld + i) + (b ? dl_ld(dt, b, c * ld + i) : x[c * ld + i]);
    });
}
