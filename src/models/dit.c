/* The DiT block library (models_impl.h, dl_dit): what every diffusion transformer
 * with a joint text + latent stream shares, model-neutral. The split's feasibility
 * and row layout (Difflet §4), its exchange buffers, adaLN modulation, gated
 * residuals, SP gather / reduce-scatter, QK RMSNorm + RoPE, and joint attention over
 * text and latent rows on one rank or context-parallel (Ulysses: all-to-all sequence
 * <-> heads; ring: image K/V shards rotate, partials merged by row max and sum of
 * exponentials; gather: all-gather K/V), with padded text keys never attended. A
 * model (flux.c) is a short composition of these with its own projections. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "difflet/comm.h"

#include "models/models_impl.h"

const char *dl_dit_split_check(const dl_dit_split *sp, int64_t heads, char *buf, size_t n) {
    if (sp->tp < 1 || sp->cp < 1) return "parallel degrees must be at least 1";
    if (sp->tp_rank < 0 || sp->tp_rank >= sp->tp || sp->cp_rank < 0 || sp->cp_rank >= sp->cp)
        return "a rank's place is outside its group";
    if (sp->sp && sp->tp < 2) return "sequence parallelism runs on the TP group: it needs tp >= 2";
    if (heads % sp->tp) {
        snprintf(buf, n, "the model's %lld attention heads are not divisible by tp=%d", (long long)heads, sp->tp);
        return buf;
    }
    if (sp->cp > 1 && sp->cp_mode == DL_CP_ULYSSES && heads % (sp->tp * sp->cp)) {
        snprintf(buf, n, "the model's %lld attention heads are not divisible by tp x cp = %d (Ulysses gives every cp rank whole heads of each tp rank's share)",
                 (long long)heads, sp->tp * sp->cp);
        return buf;
    }
    return NULL;
}


const char *dl_cp_mode_name(dl_cp_mode m) { return m == DL_CP_RING ? "ring" : m == DL_CP_GATHER ? "gather" : "ulysses"; }

/* shard [off, off + cnt) of n items for part i of k */
static void shard(int64_t n, int i, int k, int64_t *off, int64_t *cnt) {
    *off = n * i / k;
    *cnt = n * (i + 1) / k - *off;
}

/* the split's row layout and exchange buffers */
dl_status dl_dit_plan(dl_dit *c) {
    const dl_dit_split *sp = &c->sp;
    const int tp = sp->tp, cp = sp->cp, g = tp > cp ? tp : cp;
    c->Hl = c->H / tp;
    c->Dl = c->Hl * c->Dh;
    c->Fl = c->F / tp;
    if (c->N < cp) return dl_fail(DL_ERR_INVALID, "context parallelism: %lld image tokens for cp=%d ranks", (long long)c->N, cp);
    c->cn0 = calloc((size_t)cp, sizeof *c->cn0), c->cnn = calloc((size_t)cp, sizeof *c->cnn);
    c->ts0 = calloc((size_t)tp, sizeof *c->ts0), c->tsn = calloc((size_t)tp, sizeof *c->tsn);
    c->cnt = calloc((size_t)g, sizeof(size_t)), c->dsp = calloc((size_t)g, sizeof(size_t));
    c->cnt2 = calloc((size_t)g, sizeof(size_t)), c->dsp2 = calloc((size_t)g, sizeof(size_t));
    if (!c->cn0 || !c->cnn || !c->ts0 || !c->tsn || !c->cnt || !c->dsp || !c->cnt2 || !c->dsp2)
        return dl_fail(DL_ERR_NOMEM, "out of memory");
    for (int j = 0; j < cp; j++) shard(c->N, j, cp, &c->cn0[j], &c->cnn[j]);
    c->n0 = c->cn0[sp->cp_rank];
    c->Nl = c->cnn[sp->cp_rank];
    c->Sl = c->T + c->Nl;
    for (int j = 0; j < tp; j++) shard(c->Sl, j, tp, &c->ts0[j], &c->tsn[j]);
    if (sp->sp && tp > 1) {
        c->xa = c->ts0[sp->tp_rank];
        c->xn = c->tsn[sp->tp_rank];
    } else {
        c->xa = 0;
        c->xn = c->Sl;
    }
    return DL_OK;
}

/* buffers the CP exchange and the partial attention outputs need */
dl_status dl_dit_alloc(dl_dit *c) {
    const int cp = c->sp.cp;
    const size_t es = dl_dtype_size(c->dt);
    const int64_t T = c->T, N = c->N, Nl = c->Nl, Dl = c->Dl, Hc = c->Hl / cp, Dc = Hc * c->Dh;
    size_t b1 = 0, b2 = 0, b3 = 0;
    int nparts = 2;
    c->part_rows = c->Sl * c->Hl;
    if (cp > 1 && c->sp.cp_mode == DL_CP_ULYSSES) {
        b1 = (size_t)(Nl * 3 * Dl) * es;                                             /* send: per destination heads */
        b2 = (size_t)((T + N) * 3 * Dc) * es;                                        /* all rows, my heads */
        b3 = (size_t)((T + N) * Dc + Nl * Dl + cp * T * Dc) * es;                    /* outputs, inverse, text gather */
        c->part_rows = (T + N) * Hc;
    } else if (cp > 1 && c->sp.cp_mode == DL_CP_GATHER) {
        b1 = (size_t)(Nl * 2 * Dl) * es;
        b2 = (size_t)((T + N) * 2 * Dl) * es;
    } else if (cp > 1) { /* ring: the shard held and the one arriving */
        int64_t nmax = 0;
        for (int j = 0; j < cp; j++) nmax = c->cnn[j] > nmax ? c->cnn[j] : nmax;
        b1 = b2 = (size_t)(nmax * 2 * Dl) * es;
        nparts = cp + 1;
    }
    void **dst[3] = {&c->cbuf, &c->cbuf2, &c->cbuf3};
    size_t sz[3] = {b1, b2, b3};
    for (int i = 0; i < 3; i++)
        if (sz[i] && !(*dst[i] = dl_aligned_alloc(sz[i]))) return dl_fail(DL_ERR_NOMEM, "out of memory");
    /* parts are needed for split text keys (L < T), gather and ring */
    c->part = dl_aligned_alloc((size_t)nparts * (size_t)(c->part_rows * (c->Dh + 2)) * 4);
    if (!c->part) return dl_fail(DL_ERR_NOMEM, "out of memory");
    if (c->sp.sp && c->sp.tp > 1 && !(c->o_sh = dl_aligned_alloc((size_t)(c->xn * c->D) * 4)))
        return dl_fail(DL_ERR_NOMEM, "out of memory");
    return DL_OK;
}

/* h[a, b) = LN(x[a, b)) * (1 + scale) + shift, f32 -> dt (local rows held in x) */
static void ln_rows(dl_dit *c, int64_t a, int64_t b, const float *scale, const float *shift) {
    if (b <= a || !scale) return;
    size_t es = dl_dtype_size(c->dt);
    float *x = c->x + (a - c->xa) * c->D;
    void *h = (char *)c->h + (size_t)(a * c->D) * es;
    DL_PAR(dl_layernorm_x_t(c->dt, h, DL_F32, x, b - a, c->D, NULL, NULL, scale, shift, 1e-6f, ith, nth));
}

/* ln_rows over the rows this rank holds: text rows modulated by (st, ht), image
 * rows by (si, hi); a NULL scale skips those rows */
void dl_dit_ln_mod(dl_dit *c, const float *st, const float *ht, const float *si, const float *hi) {
    const int64_t a = c->xa, b = c->xa + c->xn, T = c->T;
    ln_rows(c, a, b < T ? b : T, st, ht);
    ln_rows(c, a > T ? a : T, b, si, hi);
}

/* x[a, b) += gate * upd[a, b) (upd indexed as x) */
static void gate_rows(dl_dit *c, int64_t a, int64_t b, const float *upd, const float *gate) {
    if (b <= a) return;
    float *x = c->x + (a - c->xa) * c->D;
    const float *o = upd + (a - c->xa) * c->D;
    DL_PAR(dl_gated_residual_t(DL_F32, x, o, b - a, c->D, gate, ith, nth));
}

int dl_dit_sp_on(const dl_dit *c) { return c->sp.sp && c->sp.tp > 1; }

/* the residual update of the rows held: text rows gated by gt, image rows by gi */
void dl_dit_gate_add(dl_dit *c, const float *gt, const float *gi) {
    const int64_t a = c->xa, b = c->xa + c->xn, T = c->T;
    const float *upd = dl_dit_sp_on(c) ? c->o_sh : c->o;
    gate_rows(c, a, b < T ? b : T, upd, gt);
    gate_rows(c, a > T ? a : T, b, upd, gi);
}

/* after row-parallel layers: the partial sums in o become the whole update
 * (all-reduce; with SP, reduce-scatter to the rows held) */
dl_status dl_dit_reduce_out(dl_dit *c) {
    if (c->sp.tp == 1) return DL_OK;
    if (!dl_dit_sp_on(c)) return dl_comm_allreduce_sum(c->sp.tp_comm, c->o, (size_t)(c->Sl * c->D));
    for (int j = 0; j < c->sp.tp; j++) c->cnt[j] = (size_t)(c->tsn[j] * c->D);
    return dl_comm_reduce_scatter_sum(c->sp.tp_comm, c->o, c->o_sh, c->cnt);
}

/* before column-parallel layers (SP): every rank's normalised rows into h */
dl_status dl_dit_gather_h(dl_dit *c) {
    if (!dl_dit_sp_on(c)) return DL_OK;
    size_t row = (size_t)c->D * dl_dtype_size(c->dt);
    for (int j = 0; j < c->sp.tp; j++) {
        c->cnt[j] = (size_t)c->tsn[j] * row;
        c->dsp[j] = (size_t)c->ts0[j] * row;
    }
    return dl_comm_allgatherv(c->sp.tp_comm, (char *)c->h + c->dsp[c->sp.tp_rank], c->h, c->cnt, c->dsp);
}

/* QK RMSNorm (per stream weights over its rows) and RoPE on q and k of the local rows */
void dl_dit_qk_norm_rope(dl_dit *c, const float *nq_t, const float *nk_t, const float *nq_i, const float *nk_i) {
    const int64_t Dl = c->Dl, T = c->T, Nl = c->Nl, Sl = c->Sl, Hl = c->Hl;
    size_t es = dl_dtype_size(c->dt);
    char *q = c->qkv, *k = (char *)c->qkv + (size_t)Dl * es;
    char *qi = q + (size_t)(T * 3 * Dl) * es, *ki = k + (size_t)(T * 3 * Dl) * es;
    DL_PAR({
        dl_rmsnorm_heads_t(c->dt, q, T, 3 * Dl, Hl, c->Dh, nq_t, 1e-6f, ith, nth);
        dl_rmsnorm_heads_t(c->dt, k, T, 3 * Dl, Hl, c->Dh, nk_t, 1e-6f, ith, nth);
        dl_rmsnorm_heads_t(c->dt, qi, Nl, 3 * Dl, Hl, c->Dh, nq_i, 1e-6f, ith, nth);
        dl_rmsnorm_heads_t(c->dt, ki, Nl, 3 * Dl, Hl, c->Dh, nk_i, 1e-6f, ith, nth);
    });
    DL_PAR({
        dl_rope_t(DL_ROPE_PAIRS, c->dt, q, Sl, Hl, c->Dh, 3 * Dl, c->rope_cos, c->rope_sin, ith, nth);
        dl_rope_t(DL_ROPE_PAIRS, c->dt, k, Sl, Hl, c->Dh, 3 * Dl, c->rope_cos, c->rope_sin, ith, nth);
    });
}

/* partial result i: o [rows x heads, Dh], m and l [heads, rows] */
static dl_attn_partial part_at(dl_dit *c, int i, float **o, float **mx, float **l) {
    float *base = c->part + (size_t)i * (size_t)(c->part_rows * (c->Dh + 2));
    *o = base;
    *mx = base + c->part_rows * c->Dh;
    *l = *mx + c->part_rows;
    return (dl_attn_partial){*o, *mx, *l};
}

/* One attention call on the pool: normalised into a->out, or as partial i. */
static void attn_call(dl_dit *c, dl_attn_args *a, int part, dl_attn_partial *parts) {
    if (part >= 0) parts[part] = part_at(c, part, &a->o_part, &a->m, &a->l);
    DL_PAR(dl_attn_t(a, c->scratch, ith, nth));
}

/* softmax attention of sq query rows over the keys in (k, v): T text rows (valid
 * [0, L)) then nk image rows. One call when every text key is valid; otherwise
 * the text keys and the image keys are two partials, merged (padding is never
 * attended, whatever it holds). */
static void joint_attn(dl_dit *c, int64_t heads, const void *q, int64_t qs, int64_t sq, const void *k, const void *v,
                       int64_t kvs, int64_t nk, void *out, int64_t os) {
    const size_t es = dl_dtype_size(c->dt);
    dl_attn_args a = {.dt = c->dt, .sq = sq, .sk = c->T + nk, .heads = heads, .head_dim = c->Dh, .q = q, .k = k, .v = v,
                      .q_stride = qs, .k_stride = kvs, .v_stride = kvs, .out = out, .out_stride = os, .kv_begin = 0,
                      .kv_end = c->T + nk, .scale = 1.f / sqrtf((float)c->Dh)};
    if (c->L == c->T) {
        attn_call(c, &a, -1, NULL);
        return;
    }
    dl_attn_partial parts[2];
    a.kv_end = c->L;
    attn_call(c, &a, 0, parts);
    a.k = (const char *)k + (size_t)(c->T * kvs) * es;
    a.v = (const char *)v + (size_t)(c->T * kvs) * es;
    a.sk = a.kv_end = nk;
    attn_call(c, &a, 1, parts);
    DL_PAR(dl_attn_merge_t(parts, 2, sq, heads, c->Dh, c->dt, out, os, NULL, NULL, NULL, ith, nth));
}

/* copy `rows` rows of `cols` elements (dtype size es) between strided buffers */
static void copy_rows(void *dst, int64_t dstride, const void *src, int64_t sstride, int64_t rows, int64_t cols, size_t es) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++)
        memcpy((char *)dst + (size_t)(r * dstride) * es, (const char *)src + (size_t)(r * sstride) * es, (size_t)cols * es);
}

/* gather: all-gather every rank's image K and V; local queries attend all keys */
static dl_status attn_gather(dl_dit *c, int64_t os) {
    const size_t es = dl_dtype_size(c->dt);
    const int64_t T = c->T, Dl = c->Dl, Nl = c->Nl, q3 = 3 * Dl;
    char *qkv = c->qkv, *kv = c->cbuf2;
    copy_rows(c->cbuf, 2 * Dl, qkv + (size_t)(T * q3 + Dl) * es, q3, Nl, 2 * Dl, es); /* my image K|V */
    copy_rows(kv, 2 * Dl, qkv + (size_t)Dl * es, q3, T, 2 * Dl, es);                 /* text K|V */
    const size_t row = (size_t)(2 * Dl) * es;
    for (int j = 0; j < c->sp.cp; j++) {
        c->cnt[j] = (size_t)c->cnn[j] * row;
        c->dsp[j] = (size_t)(T + c->cn0[j]) * row;
    }
    dl_status s = dl_comm_allgatherv(c->sp.cp_comm, c->cbuf, kv, c->cnt, c->dsp);
    if (s) return s;
    joint_attn(c, c->Hl, qkv, q3, c->Sl, kv, kv + (size_t)Dl * es, 2 * Dl, c->N, c->att, os);
    return DL_OK;
}

/* ring: queries stay; the text keys are one partial [0, L); the image K/V shards
 * travel round the ring, one partial each; all merged by row max and sum of exps */
static dl_status attn_ring(dl_dit *c, int64_t os) {
    const size_t es = dl_dtype_size(c->dt);
    const int64_t T = c->T, Dl = c->Dl, q3 = 3 * Dl, Sl = c->Sl;
    const int cp = c->sp.cp, r = c->sp.cp_rank;
    char *qkv = c->qkv, *cur = c->cbuf, *nxt = c->cbuf2;
    dl_attn_partial parts[65];
    if (cp > 64) return dl_fail(DL_ERR_UNSUPPORTED, "ring attention over more than 64 ranks");
    dl_attn_args a = {.dt = c->dt, .sq = Sl, .sk = T, .heads = c->Hl, .head_dim = c->Dh, .q = qkv,
                      .k = qkv + (size_t)Dl * es, .v = qkv + (size_t)(2 * Dl) * es, .q_stride = q3, .k_stride = q3,
                      .v_stride = q3, .kv_begin = 0, .kv_end = c->L, .scale = 1.f / sqrtf((float)c->Dh)};
    attn_call(c, &a, 0, parts);
    copy_rows(cur, 2 * Dl, qkv + (size_t)(T * q3 + Dl) * es, q3, c->Nl, 2 * Dl, es);
    for (int step = 0; step < cp; step++) {
        int src = ((r - step) % cp + cp) % cp; /* whose shard is held now */
        if (step + 1 < cp) { /* pass it on; the next one comes from the left */
            int nsrc = ((src - 1) % cp + cp) % cp;
            dl_status s = dl_comm_sendrecv(c->sp.cp_comm, cur, (size_t)(c->cnn[src] * 2 * Dl) * es, (r + 1) % cp, nxt,
                                           (size_t)(c->cnn[nsrc] * 2 * Dl) * es, (r - 1 + cp) % cp);
            if (s) return s;
        }
        a.k = cur;
        a.v = cur + (size_t)Dl * es;
        a.k_stride = a.v_stride = 2 * Dl;
        a.sk = a.kv_end = c->cnn[src];
        attn_call(c, &a, step + 1, parts);
        char *t = cur;
        cur = nxt, nxt = t;
    }
    DL_PAR(dl_attn_merge_t(parts, cp + 1, Sl, c->Hl, c->Dh, c->dt, c->att, os, NULL, NULL, NULL, ith, nth));
    return DL_OK;
}

/* Ulysses: all-to-all trades sequence shards for head shards (every rank: all image
 * rows of Hc = Hl / cp heads; its text head slice taken locally, so each text key
 * enters the softmax once); the inverse all-to-all and an all-gather of the text
 * rows restore the [local rows, Dl] layout */
static dl_status attn_ulysses(dl_dit *c, int64_t os) {
    const size_t es = dl_dtype_size(c->dt);
    const int cp = c->sp.cp, r = c->sp.cp_rank;
    const int64_t T = c->T, N = c->N, Nl = c->Nl, Dl = c->Dl, q3 = 3 * Dl, Hc = c->Hl / cp, Dc = Hc * c->Dh;
    char *qkv = c->qkv, *snd = c->cbuf, *U = c->cbuf2, *Uo = c->cbuf3;
    char *R = Uo + (size_t)((T + N) * Dc) * es, *TX = R + (size_t)(Nl * Dl) * es;
    const char *img = qkv + (size_t)(T * q3) * es;
    for (int j = 0; j < cp; j++) /* destination j: q, k, v of its heads, [Nl, 3Dc] */
        for (int t = 0; t < 3; t++)
            copy_rows(snd + (size_t)(j * Nl * 3 * Dc + t * Dc) * es, 3 * Dc, img + (size_t)(t * Dl + j * Dc) * es, q3, Nl,
                      Dc, es);
    for (int j = 0; j < cp; j++) {
        c->cnt[j] = (size_t)(Nl * 3 * Dc) * es;
        c->dsp[j] = (size_t)(j * Nl * 3 * Dc) * es;
        c->cnt2[j] = (size_t)(c->cnn[j] * 3 * Dc) * es;
        c->dsp2[j] = (size_t)((T + c->cn0[j]) * 3 * Dc) * es;
    }
    dl_status s = dl_comm_alltoallv(c->sp.cp_comm, snd, c->cnt, c->dsp, U, c->cnt2, c->dsp2);
    if (s) return s;
    for (int t = 0; t < 3; t++) /* my text head slice */
        copy_rows(U + (size_t)(t * Dc) * es, 3 * Dc, qkv + (size_t)(t * Dl + r * Dc) * es, q3, T, Dc, es);
    joint_attn(c, Hc, U, 3 * Dc, T + N, U + (size_t)Dc * es, U + (size_t)(2 * Dc) * es, 3 * Dc, N, Uo, Dc);
    /* inverse: my heads of rank j's rows back to j */
    for (int j = 0; j < cp; j++) {
        c->cnt[j] = (size_t)(c->cnn[j] * Dc) * es;
        c->dsp[j] = (size_t)((T + c->cn0[j]) * Dc) * es;
        c->cnt2[j] = (size_t)(Nl * Dc) * es;
        c->dsp2[j] = (size_t)(j * Nl * Dc) * es;
    }
    if ((s = dl_comm_alltoallv(c->sp.cp_comm, Uo, c->cnt, c->dsp, R, c->cnt2, c->dsp2))) return s;
    if ((s = dl_comm_allgather(c->sp.cp_comm, Uo, (size_t)(T * Dc) * es, TX))) return s;
    for (int j = 0; j < cp; j++) {
        copy_rows((char *)c->att + (size_t)(T * os + j * Dc) * es, os, R + (size_t)(j * Nl * Dc) * es, Dc, Nl, Dc, es);
        copy_rows((char *)c->att + (size_t)(j * Dc) * es, os, TX + (size_t)(j * T * Dc) * es, Dc, T, Dc, es);
    }
    return DL_OK;
}

/* joint attention of the local rows into att (row stride os), by the split's mode */
dl_status dl_dit_attention(dl_dit *c, int64_t os) {
    if (c->sp.cp > 1 && c->sp.cp_mode == DL_CP_ULYSSES) return attn_ulysses(c, os);
    if (c->sp.cp > 1 && c->sp.cp_mode == DL_CP_RING) return attn_ring(c, os);
    if (c->sp.cp > 1) return attn_gather(c, os);
    const size_t es = dl_dtype_size(c->dt);
    const int64_t Dl = c->Dl;
    char *q = c->qkv;
    joint_attn(c, c->Hl, q, 3 * Dl, c->Sl, q + (size_t)Dl * es, q + (size_t)(2 * Dl) * es, 3 * Dl, c->Nl, c->att, os);
    return DL_OK;
}

void dl_dit_free(dl_dit *c) {
    free(c->rope_cos), free(c->rope_sin);
    free(c->cn0), free(c->cnn), free(c->ts0), free(c->tsn), free(c->cnt), free(c->dsp), free(c->cnt2), free(c->dsp2);
    void *bufs[] = {c->o_sh, c->cbuf, c->cbuf2, c->cbuf3, c->part};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) dl_aligned_free(bufs[i]);
}

dl_status dl_dit_gather_image_rows(dl_dit *c, float *out, int64_t cols) {
    if (c->sp.cp == 1) return DL_OK;
    for (int j = 0; j < c->sp.cp; j++) {
        c->cnt[j] = (size_t)(c->cnn[j] * cols) * 4;
        c->dsp[j] = (size_t)(c->cn0[j] * cols) * 4;
    }
    return dl_comm_allgatherv(c->sp.cp_comm, out + c->n0 * cols, out, c->cnt, c->dsp);
}

void dl_dit_cross_attention(dl_dit *c, const void *q, int64_t qs, const void *k, const void *v, int64_t kvs, int64_t nk,
                            int64_t valid, void *out, int64_t os) {
    dl_attn_args a = {.dt = c->dt, .sq = c->Nl, .sk = nk, .heads = c->Hl, .head_dim = c->Dh, .q = q, .k = k, .v = v,
                      .q_stride = qs, .k_stride = kvs, .v_stride = kvs, .out = out, .out_stride = os, .kv_begin = 0,
                      .kv_end = valid, .scale = 1.f / sqrtf((float)c->Dh)};
    attn_call(c, &a, -1, NULL);
}

dl_status dl_dit_rmsnorm_full(dl_dit *c, void *x, int64_t rows, int64_t stride, const float *w, float eps, float *ss) {
    const int64_t Dl = c->Dl, D = c->D;
    if (c->sp.tp == 1) { /* every column here: the plain row norm */
        DL_PAR(dl_rmsnorm_heads_t(c->dt, x, rows, stride, 1, Dl, w, eps, ith, nth));
        return DL_OK;
    }
    const dl_dtype dt = c->dt;
    const size_t es = dl_dtype_size(dt);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const char *row = (const char *)x + (size_t)(r * stride) * es;
        double acc = 0;
        for (int64_t j = 0; j < Dl; j++) {
            float v = dt == DL_F32 ? ((const float *)row)[j] : dl_bf16_to_f32(((const uint16_t *)row)[j]);
            acc += (double)v * v;
        }
        ss[r] = (float)acc;
    }
    dl_status s = dl_comm_allreduce_sum(c->sp.tp_comm, ss, (size_t)rows);
    if (s != DL_OK) return s;
    const float *wl = w + c->sp.tp_rank * Dl;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        char *row = (char *)x + (size_t)(r * stride) * es;
        float inv = 1.f / sqrtf(ss[r] / (float)D + eps);
        for (int64_t j = 0; j < Dl; j++) {
            if (dt == DL_F32) ((float *)row)[j] = ((float *)row)[j] * inv * wl[j];
            else ((uint16_t *)row)[j] = dl_f32_to_bf16(dl_bf16_to_f32(((uint16_t *)row)[j]) * inv * wl[j]);
        }
    }
    return DL_OK;
}

dl_status dl_dit_qk_norm_full_rope(dl_dit *c, const float *nq, const float *nk, float eps, float *ss) {
    const int64_t Dl = c->Dl, Sl = c->Sl;
    char *q = c->qkv, *k = (char *)c->qkv + (size_t)Dl * dl_dtype_size(c->dt);
    dl_status s;
    if ((s = dl_dit_rmsnorm_full(c, q, Sl, 3 * Dl, nq, eps, ss)) || (s = dl_dit_rmsnorm_full(c, k, Sl, 3 * Dl, nk, eps, ss)))
        return s;
    DL_PAR({
        dl_rope_t(DL_ROPE_PAIRS, c->dt, q, Sl, c->Hl, c->Dh, 3 * Dl, c->rope_cos, c->rope_sin, ith, nth);
        dl_rope_t(DL_ROPE_PAIRS, c->dt, k, Sl, c->Hl, c->Dh, 3 * Dl, c->rope_cos, c->rope_sin, ith, nth);
    });
    return DL_OK;
}

void dl_dit_timestep_proj(float t, int64_t dim, float *out) {
    const int64_t half = dim / 2;
    for (int64_t i = 0; i < half; i++) {
        float e = expf(-logf(10000.f) * (float)i / (float)half);
        float a = t * e;
        out[i] = cosf(a);
        out[half + i] = sinf(a);
    }
}

void dl_dit_swiglu(dl_dit *c, void *y, int64_t ldy, const void *ab, int64_t rows, int64_t f) {
    const size_t es = dl_dtype_size(c->dt);
    const dl_dtype dt = c->dt;
    DL_PAR({
        int64_t r0, r1;
        dl_split(rows, ith, nth, &r0, &r1);
        for (int64_t r = r0; r < r1; r++) {
            const char *a = (const char *)ab + (size_t)(r * 2 * f) * es;
            char *yr = (char *)y + (size_t)(r * ldy) * es;
            dl_activation_t(DL_ACT_SILU, dt, yr, a, f, 0, 1);
            dl_mul_t(dt, yr, yr, a + (size_t)f * es, f, 0, 1);
        }
    });
}

dl_status dl_dit_probe_score(const dl_dit *c, const float *cur, const float *prev, int64_t n, double *score) {
    double sums[2 * 64] = {0}, num = 0, den = 0;
    int64_t i = 0;
    while (i < n) { /* 16 float lanes per block of <= 4096 (vectorisable), blocks summed in double */
        float a[16] = {0}, b[16] = {0};
        int64_t e = i + 4096 < n ? i + 4096 : n;
        for (; i + 16 <= e; i += 16)
            for (int k = 0; k < 16; k++) {
                a[k] += fabsf(cur[i + k] - prev[i + k]);
                b[k] += fabsf(prev[i + k]);
            }
        for (; i < e; i++) a[0] += fabsf(cur[i] - prev[i]), b[0] += fabsf(prev[i]);
        for (int k = 0; k < 16; k++) num += a[k], den += b[k];
    }
    if (c->sp.cp > 1) { /* every rank's sums, added in rank order: the same score everywhere */
        if (c->sp.cp > 64) return dl_fail(DL_ERR_UNSUPPORTED, "probe over more than 64 cp ranks");
        double mine[2] = {num, den};
        dl_status s = dl_comm_allgather(c->sp.cp_comm, mine, sizeof mine, sums);
        if (s) return s;
        num = den = 0;
        for (int j = 0; j < c->sp.cp; j++) num += sums[2 * j], den += sums[2 * j + 1];
    }
    *score = den > 0 ? num / den : 0;
    return DL_OK;
}

/* ---- the dual-stream block ------------------------------------------------------------ */

void dl_dit_dual_free(dl_dit_dual *b) {
    lin *bl[] = {&b->mod_img, &b->mod_txt, &b->qkv_img, &b->qkv_txt, &b->out_img, &b->out_txt,
                 &b->ff1_img, &b->ff2_img, &b->ff1_txt, &b->ff2_txt};
    for (size_t k = 0; k < sizeof bl / sizeof bl[0]; k++) dl_lin_free(bl[k]);
    free(b->nq_img), free(b->nk_img), free(b->nq_txt), free(b->nk_txt);
}

dl_status dl_dit_dual_load(dl_dit_dual *b, dl_dit *c, dl_wsrc *ck, const char *p, const dl_dit_dual_names *nm) {
    const int64_t D = c->D, T = c->T, Nl = c->Nl, Dl = c->Dl, Fl = c->Fl, F = c->F;
    const dl_dtype dt = c->dt;
    const int tp = c->sp.tp, tr = c->sp.tp_rank;
    /* Megatron slices: column parallel (this rank's heads / MLP columns), row parallel
     * (the matching input columns; the bias added by tp rank 0 only) */
    const lin_split col_h = {.row0 = tr * Dl, .rows = Dl}, col_f = {.row0 = tr * Fl, .rows = Fl};
    const lin_split row_h = {.nseg = 1, .seg0 = {tr * Dl}, .segn = {Dl}, .no_bias = tr != 0};
    const lin_split row_f = {.nseg = 1, .seg0 = {tr * Fl}, .segn = {Fl}, .no_bias = tr != 0};
    const lin_split *ch = tp > 1 ? &col_h : NULL, *cf = tp > 1 ? &col_f : NULL;
    const lin_split *rh = tp > 1 ? &row_h : NULL, *rf = tp > 1 ? &row_f : NULL;
    char n[12][256];
    const char *names[12] = {nm->mod_img, nm->mod_txt, "attn.norm_q.weight", "attn.norm_k.weight",
                             "attn.norm_added_q.weight", "attn.norm_added_k.weight", "attn.to_out.0", "attn.to_add_out",
                             nm->ff1_img, nm->ff2_img, nm->ff1_txt, nm->ff2_txt};
    for (int i = 0; i < 12; i++) snprintf(n[i], sizeof n[i], "%s%s", p, names[i]);
    dl_status s;
    if ((s = dl_lin_named(&b->mod_img, ck, n[0], 1, D, 6 * D, dt, DL_F32, DL_ACT_NONE, 0, NULL)) ||
        (s = dl_lin_named(&b->mod_txt, ck, n[1], 1, D, 6 * D, dt, DL_F32, DL_ACT_NONE, 0, NULL)) ||
        (s = dl_lin_qkv(&b->qkv_img, ck, p, "attn.to_q", "attn.to_k", "attn.to_v", Nl, D, dt, ch)) ||
        (s = dl_lin_qkv(&b->qkv_txt, ck, p, "attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj", T, D, dt, ch)) ||
        (s = dl_param_vec(ck, n[2], c->Dh, &b->nq_img)) || (s = dl_param_vec(ck, n[3], c->Dh, &b->nk_img)) ||
        (s = dl_param_vec(ck, n[4], c->Dh, &b->nq_txt)) || (s = dl_param_vec(ck, n[5], c->Dh, &b->nk_txt)) ||
        (s = dl_lin_named(&b->out_img, ck, n[6], Nl, D, D, dt, DL_F32, DL_ACT_NONE, 0, rh)) ||
        (s = dl_lin_named(&b->out_txt, ck, n[7], T, D, D, dt, DL_F32, DL_ACT_NONE, 0, rh)) ||
        (s = dl_lin_named(&b->ff1_img, ck, n[8], Nl, D, F, dt, dt, DL_ACT_GELU_TANH, 0, cf)) ||
        (s = dl_lin_named(&b->ff2_img, ck, n[9], Nl, F, D, dt, DL_F32, DL_ACT_NONE, 0, rf)) ||
        (s = dl_lin_named(&b->ff1_txt, ck, n[10], T, D, F, dt, dt, DL_ACT_GELU_TANH, 0, cf)) ||
        (s = dl_lin_named(&b->ff2_txt, ck, n[11], T, F, D, dt, DL_F32, DL_ACT_NONE, 0, rf)))
        return s;
    return DL_OK;
}

#define RUN(l, x, y)                                         \
    do {                                                     \
        if ((s = lin_run((l), (x), (y))) != DL_OK) return s; \
    } while (0)
#define TRY(e)                            \
    do {                                  \
        if ((s = (e)) != DL_OK) return s; \
    } while (0)

dl_status dl_dit_dual_run(dl_dit *c, dl_dit_dual *b, const void *vec, float *mi, float *mt, void *f) {
    const int64_t D = c->D, T = c->T, Dl = c->Dl, Fl = c->Fl;
    const size_t es = dl_dtype_size(c->dt);
    char *h_img = (char *)c->h + (size_t)(T * D) * es, *qkv_img = (char *)c->qkv + (size_t)(T * 3 * Dl) * es;
    char *att_img = (char *)c->att + (size_t)(T * Dl) * es, *f_img = (char *)f + (size_t)(T * Fl) * es;
    dl_status s;
    RUN(&b->mod_img, vec, mi);
    RUN(&b->mod_txt, vec, mt);
    /* chunks: shift1, scale1, gate1, shift2, scale2, gate2 */
    dl_dit_ln_mod(c, mt + D, mt, mi + D, mi);
    TRY(dl_dit_gather_h(c));
    RUN(&b->qkv_txt, c->h, c->qkv);
    RUN(&b->qkv_img, h_img, qkv_img);
    dl_dit_qk_norm_rope(c, b->nq_txt, b->nk_txt, b->nq_img, b->nk_img);
    TRY(dl_dit_attention(c, Dl));
    RUN(&b->out_txt, c->att, c->o);
    RUN(&b->out_img, att_img, c->o + T * D);
    TRY(dl_dit_reduce_out(c));
    dl_dit_gate_add(c, mt + 2 * D, mi + 2 * D);
    dl_dit_ln_mod(c, mt + 4 * D, mt + 3 * D, mi + 4 * D, mi + 3 * D);
    TRY(dl_dit_gather_h(c));
    RUN(&b->ff1_txt, c->h, f);
    RUN(&b->ff1_img, h_img, f_img);
    RUN(&b->ff2_txt, f, c->o);
    RUN(&b->ff2_img, f_img, c->o + T * D);
    TRY(dl_dit_reduce_out(c));
    dl_dit_gate_add(c, mt + 5 * D, mi + 5 * D);
    return DL_OK;
}

/* ---- the single-stream block ---------------------------------------------------- */

void dl_dit_single_free(dl_dit_single *b) {
    dl_lin_free(&b->mod), dl_lin_free(&b->qkv), dl_lin_free(&b->mlp), dl_lin_free(&b->out);
    free(b->nq), free(b->nk);
    b->nq = b->nk = NULL;
}

dl_status dl_dit_single_load(dl_dit_single *b, dl_dit *c, dl_wsrc *ck, const char *p) {
    const int64_t D = c->D, F = c->F, Sl = c->Sl, Dl = c->Dl, Fl = c->Fl;
    const dl_dtype dt = c->dt;
    const int tp = c->sp.tp, tr = c->sp.tp_rank;
    const lin_split col_h = {.row0 = tr * Dl, .rows = Dl}, col_f = {.row0 = tr * Fl, .rows = Fl};
    /* proj_out reads [attention (D) | mlp (F)]: this rank's columns of both */
    const lin_split row_1 = {.nseg = 2, .seg0 = {tr * Dl, D + tr * Fl}, .segn = {Dl, Fl}, .no_bias = tr != 0};
    const lin_split *ch = tp > 1 ? &col_h : NULL, *cf = tp > 1 ? &col_f : NULL, *r1 = tp > 1 ? &row_1 : NULL;
    char n[5][256];
    const char *names[5] = {"norm.linear", "attn.norm_q.weight", "attn.norm_k.weight", "proj_mlp", "proj_out"};
    for (int i = 0; i < 5; i++) snprintf(n[i], sizeof n[i], "%s%s", p, names[i]);
    dl_status s;
    if ((s = dl_lin_named(&b->mod, ck, n[0], 1, D, 3 * D, dt, DL_F32, DL_ACT_NONE, 0, NULL)) ||
        (s = dl_lin_qkv(&b->qkv, ck, p, "attn.to_q", "attn.to_k", "attn.to_v", Sl, D, dt, ch)) ||
        (s = dl_param_vec(ck, n[1], c->Dh, &b->nq)) || (s = dl_param_vec(ck, n[2], c->Dh, &b->nk)) ||
        /* proj_mlp writes columns [Dl, Dl + Fl) of the [Sl, Dl + Fl] concat buffer that
         * the attention fills at [0, Dl); proj_out reads all of it */
        (s = dl_lin_named(&b->mlp, ck, n[3], Sl, D, F, dt, dt, DL_ACT_GELU_TANH, Dl + Fl, cf)) ||
        (s = dl_lin_named(&b->out, ck, n[4], Sl, D + F, D, dt, DL_F32, DL_ACT_NONE, 0, r1)))
        return s;
    return DL_OK;
}

dl_status dl_dit_single_run(dl_dit *c, dl_dit_single *b, const void *vec, float *mo) {
    const int64_t D = c->D, Dl = c->Dl, Fl = c->Fl;
    const size_t es = dl_dtype_size(c->dt);
    dl_status s;
    RUN(&b->mod, vec, mo); /* shift, scale, gate */
    dl_dit_ln_mod(c, mo + D, mo, mo + D, mo);
    TRY(dl_dit_gather_h(c));
    RUN(&b->qkv, c->h, c->qkv);
    RUN(&b->mlp, c->h, (char *)c->att + (size_t)Dl * es); /* columns [Dl, Dl + Fl) */
    dl_dit_qk_norm_rope(c, b->nq, b->nk, b->nq, b->nk);
    TRY(dl_dit_attention(c, Dl + Fl)); /* columns [0, Dl) */
    RUN(&b->out, c->att, c->o);
    TRY(dl_dit_reduce_out(c));
    dl_dit_gate_add(c, mo + 2 * D, mo + 2 * D);
    return DL_OK;
}

/* ---- the conditioning vector ----------------------------------------------------- */

void dl_dit_cond_free(dl_dit_cond *e) {
    lin *ls[] = {&e->t1, &e->t2, &e->g1, &e->g2, &e->p1, &e->p2};
    for (size_t i = 0; i < sizeof ls / sizeof ls[0]; i++) dl_lin_free(ls[i]);
    dl_aligned_free(e->vin), dl_aligned_free(e->vh), dl_aligned_free(e->tproj), dl_aligned_free(e->tmp);
    e->vin = e->vh = NULL, e->tproj = e->tmp = NULL;
}

dl_status dl_dit_cond_load(dl_dit_cond *e, dl_dit *c, dl_wsrc *ck, const char *p, int64_t Pd, int guidance,
                           const char *file) {
    const int64_t D = c->D;
    const dl_dtype dt = c->dt;
    e->D = D, e->Pd = Pd, e->guidance = guidance, e->dt = dt;
    char n[6][256];
    const char *names[6] = {"timestep_embedder.linear_1", "timestep_embedder.linear_2", "guidance_embedder.linear_1",
                            "guidance_embedder.linear_2", "text_embedder.linear_1", "text_embedder.linear_2"};
    for (int i = 0; i < 6; i++) snprintf(n[i], sizeof n[i], "%s%s", p, names[i]);
    dl_status s;
    if ((s = dl_lin_named(&e->t1, ck, n[0], 1, 256, D, dt, dt, DL_ACT_SILU, 0, NULL)) ||
        (s = dl_lin_named(&e->t2, ck, n[1], 1, D, D, dt, DL_F32, DL_ACT_NONE, 0, NULL)) ||
        (s = dl_lin_named(&e->p1, ck, n[4], 1, Pd, D, dt, dt, DL_ACT_SILU, 0, NULL)) ||
        (s = dl_lin_named(&e->p2, ck, n[5], 1, D, D, dt, DL_F32, DL_ACT_NONE, 0, NULL)) ||
        (guidance && ((s = dl_lin_named(&e->g1, ck, n[2], 1, 256, D, dt, dt, DL_ACT_SILU, 0, NULL)) ||
                      (s = dl_lin_named(&e->g2, ck, n[3], 1, D, D, dt, DL_F32, DL_ACT_NONE, 0, NULL)))))
        return s;
    char w[280];
    snprintf(w, sizeof w, "%s.weight", n[2]);
    if (!guidance && dl_ws_find(ck, w))
        return dl_fail(DL_ERR_FORMAT, "`%s`: the checkpoint has a guidance embedder but guidance_embeds is false", file);
    int64_t vmax = 256 > Pd ? 256 : Pd;
    if (D > vmax) vmax = D;
    size_t es = dl_dtype_size(dt);
    e->vin = dl_aligned_alloc((size_t)vmax * es), e->vh = dl_aligned_alloc((size_t)vmax * es);
    e->tproj = dl_aligned_alloc(256 * 4), e->tmp = dl_aligned_alloc((size_t)D * 4);
    if (!e->vin || !e->vh || !e->tproj || !e->tmp) return dl_fail(DL_ERR_NOMEM, "out of memory");
    return DL_OK;
}

/* acc += linear_2(silu(linear_1(v))) for a one-row input v (f32) */
static dl_status cond_add(dl_dit_cond *e, lin *l1, lin *l2, const float *v, int64_t n, float *acc) {
    dl_status s;
    dl_convert_t(e->dt, e->vin, DL_F32, v, n, 0, 1); /* one row: cheaper than waking the pool */
    RUN(l1, e->vin, e->vh);
    RUN(l2, e->vh, e->tmp);
    for (int64_t i = 0; i < e->D; i++) acc[i] += e->tmp[i];
    return DL_OK;
}

dl_status dl_dit_cond_run(dl_dit_cond *e, const float *pooled, float t, float g, float *temb, void *vec) {
    const int64_t D = e->D;
    dl_status s;
    memset(temb, 0, (size_t)D * 4);
    dl_dit_timestep_proj(t, 256, e->tproj);
    TRY(cond_add(e, &e->t1, &e->t2, e->tproj, 256, temb));
    if (e->guidance) {
        dl_dit_timestep_proj(g, 256, e->tproj);
        TRY(cond_add(e, &e->g1, &e->g2, e->tproj, 256, temb));
    }
    TRY(cond_add(e, &e->p1, &e->p2, pooled, e->Pd, temb));
    for (int64_t i = 0; i < D; i++) e->tmp[i] = temb[i] / (1.f + expf(-temb[i]));
    dl_convert_t(e->dt, vec, DL_F32, e->tmp, D, 0, 1);
    return DL_OK;
}

dl_status dl_dit_probe_feature(const dl_dit *c, float *cur, float *prev, int *have, const float *x, int64_t rows,
                               const float *scale, const float *shift, double *score) {
    const int64_t D = c->D, n = rows * D;
    *score = 0;
    DL_PAR(dl_layernorm_x_t(DL_F32, cur, DL_F32, x, rows, D, NULL, NULL, scale, shift, 1e-6f, ith, nth));
    dl_status s;
    if (*have && (s = dl_dit_probe_score(c, cur, prev, n, score))) return s;
    memcpy(prev, cur, (size_t)n * 4);
    *have = 1;
    return DL_OK;
}
