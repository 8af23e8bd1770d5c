/* WanTransformer3DModel (diffusers): Wan 2.1's denoiser, built for a fixed latent
 * grid and text length. Video tokens only in the self-attention stream (the DiT
 * library's joint stream with no text rows); the text enters by cross-attention.
 *
 *   x = patch_embedding(latents) as rows                   // Conv3d, kernel = stride = patch: [N, D]
 *   temb = time_embedder(Timesteps(freq_dim)(t))           // linear, SiLU, linear: [D]
 *   tproj = time_proj(silu(temb))                           // [6D]
 *   ctx = text_embedder(txt)                                // linear, GELU-tanh, linear: [T, D]
 *   block (per layer, sst its scale_shift_table [6, D]):
 *     shift1, scale1, gate1, shift2, scale2, gate2 = sst + tproj
 *     h = LN(x)(1 + scale1) + shift1;  q, k, v = to_q|k|v(h)
 *     q, k = RMS_D(q), RMS_D(k) (across heads);  x += gate1 * to_out(attn(RoPE3(q), RoPE3(k), v))
 *     h = norm2(x) (affine LayerNorm when cross_attn_norm, else x)
 *     x += to_out2(attn(RMS_D(to_q2(h)), RMS_D(to_k2(ctx)), to_v2(ctx)))   // every text row attended
 *     x += gate2 * ffn(LN(x)(1 + scale2) + shift2)          // linear, GELU-tanh, linear
 *   shift, scale = sst_out [2, D] + temb
 *   out = unpatchify(proj_out(LN(x)(1 + scale) + shift))  // [C_out, F, H, W]
 * RoPE3: head_dim split [d - 4(d/6), 2(d/6), 2(d/6)] over (frame, row, column) of
 * the patch grid, adjacent pairs rotated. The Q/K norms are applied whatever the
 * config's qk_norm says (as diffusers does). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "difflet/wan.h"
#include "models/models_impl.h"

typedef struct {
    lin qkv;                 /* attn1 to_q | to_k | to_v: D -> 3D, over the local rows */
    float *nq, *nk;          /* attn1 norm_q / norm_k: [D] */
    lin out;                 /* attn1.to_out.0 -> o (f32) */
    float *n2w, *n2b;        /* norm2 affine [D] (cross_attn_norm) or NULL */
    lin q2;                  /* attn2.to_q over the local rows */
    lin kv2;                 /* attn2.to_k | to_v over the text rows: D -> 2D */
    float *nq2, *nk2;        /* attn2 norm_q / norm_k: [D] */
    lin out2;                /* attn2.to_out.0 -> o (f32) */
    lin ff1, ff2;            /* ffn.net.0.proj (GELU-tanh fused), ffn.net.2 */
    float *sst;              /* scale_shift_table [6, D] */
} wan_block;

/* What the transformer and its step-caching probe share: the patch embedding of
 * the latents (this rank's rows) and the time conditioning. Buffers are planned into
 * the owner's arena (phase 0, temb and tproj up to phase 2). */
typedef struct {
    dl_dtype dt;
    int64_t D, freq, Cin, lat[3], N, n0, Nl;
    dl_conv *patch;                   /* patch_embedding: [Cin, F, H, W] -> [D, N] */
    lin t1, t2, tp;                   /* time_embedder linear_1 / linear_2, time_proj */
    void *lat_in, *pe;                /* [Cin, F, H, W], [D, N] dt */
    void *vec_in, *vec_h;             /* [max(freq, D)] dt: one-row matmul inputs */
    float *temb, *tproj, *tfreq, *tmp; /* [D], [6D], [freq], [D] */
} wan_embed;

struct dl_wan {
    dl_dit c;                         /* the video stream (T = 0): sizes, split, shared activations */
    int B;                            /* CFG branches per call (1, or 2: batched CFG) */
    wan_embed e;
    int64_t Cin, Cout, P[3];          /* latent channels, patch (t, h, w) */
    int64_t Fl, Hl_, Wl;              /* latent grid (frames, height, width) */
    int64_t G[3];                     /* token grid: Fl / P[0], Hl_ / P[1], Wl / P[2] */
    int64_t Tt, Td, freq;             /* text rows, text width, Timesteps channels */
    int nl, cross_norm;
    float eps;
    lin x1, x2;                       /* text_embedder */
    wan_block *blk;
    float *sst_out;                   /* [2, D] */
    lin proj_out;                     /* D -> Cout * prod(P), over the local rows */
    /* activations (the stream's are in c) */
    void *txt_in, *txt_h, *ctx;       /* [T, Td], [T, D], [T, D] dt */
    void *q2, *kv2, *f;               /* [Nl, D], [T, 2D], [Nl, F] dt */
    float *mod, *ones;                /* [6D], [D] */
    float *ss;                        /* [max(B Nl, B T)]: the Q/K norms' sums of squares (TP) */
    float *pout;                      /* [Nl, Cout * prod(P)] f32 */
    float *full;                      /* [N, Cout * prod(P)] f32: every rank's rows (cp > 1) */
    float *spare;                     /* a batch-2 program's discarded second output (one-branch calls) */
    void *arena;
    dl_wan_phase_times *pt;           /* the caller's phase timer, or NULL */
};

int64_t dl_wan_in_channels(const dl_wan *m) { return m->Cin; }
int64_t dl_wan_out_channels(const dl_wan *m) { return m->Cout; }
int64_t dl_wan_heads(const dl_wan *m) { return m->c.H; }
int64_t dl_wan_text_dim(const dl_wan *m) { return m->Td; }
void dl_wan_patch(const dl_wan *m, int64_t patch[3]) { memcpy(patch, m->P, sizeof m->P); }
void dl_wan_set_phase_times(dl_wan *m, dl_wan_phase_times *t) { m->pt = t; }

/* seconds since *t0 added to *acc, and *t0 restarted (only with a timer attached) */
static void phase(double *acc, double *t0) {
    double t = dl_now();
    *acc += t - *t0;
    *t0 = t;
}

static void embed_free(wan_embed *e) {
    dl_lin_free(&e->t1), dl_lin_free(&e->t2), dl_lin_free(&e->tp);
    dl_conv_free(e->patch);
    e->patch = NULL;
}

static dl_status lin_one(lin *l, dl_wsrc *ck, const char *p, const char *name, int64_t m, int64_t k, int64_t n,
                         dl_dtype dt, dl_dtype dst, dl_act act);

/* the shared weights, for rows [n0, n0 + Nl) of the N tokens (sizes set by the caller) */
static dl_status embed_load(wan_embed *e, dl_wsrc *ck, const int64_t P[3]) {
    const int64_t D = e->D;
    const dl_dtype dt = e->dt;
    dl_conv_desc pd = {.ndim = 3, .cin = e->Cin, .cout = D, .in = {e->lat[0], e->lat[1], e->lat[2]},
                       .kernel = {P[0], P[1], P[2]}, .stride = {P[0], P[1], P[2]}, .dt = dt};
    dl_status s;
    if ((s = dl_conv_load(&e->patch, ck, "patch_embedding", &pd)) ||
        (s = lin_one(&e->t1, ck, "condition_embedder.time_embedder.", "linear_1", 1, e->freq, D, dt, dt, DL_ACT_SILU)) ||
        (s = lin_one(&e->t2, ck, "condition_embedder.time_embedder.", "linear_2", 1, D, D, dt, DL_F32, DL_ACT_NONE)) ||
        (s = lin_one(&e->tp, ck, "condition_embedder.", "time_proj", 1, D, 6 * D, dt, DL_F32, DL_ACT_NONE)))
        return s;
    return DL_OK;
}

static void embed_plan(wan_embed *e, act_plan *pl) {
    const size_t es = dl_dtype_size(e->dt);
    const int64_t D = e->D, vmax = e->freq > D ? e->freq : D;
    dl_plan_add(pl, &e->lat_in, (size_t)(e->Cin * e->lat[0] * e->lat[1] * e->lat[2]) * es, 0, 0);
    dl_plan_add(pl, &e->pe, (size_t)(D * e->N) * es, 0, 0);
    dl_plan_add(pl, &e->vec_in, (size_t)vmax * es, 0, 0);
    dl_plan_add(pl, &e->vec_h, (size_t)vmax * es, 0, 0);
    dl_plan_add(pl, &e->temb, (size_t)D * 4, 0, 2);
    dl_plan_add(pl, &e->tproj, (size_t)(6 * D) * 4, 0, 1);
    dl_plan_add(pl, &e->tfreq, (size_t)e->freq * 4, 0, 0);
    dl_plan_add(pl, &e->tmp, (size_t)D * 4, 0, 0);
}

#define RUN(l, x, y)                                         \
    do {                                                     \
        if ((s = lin_run((l), (x), (y))) != DL_OK) return s; \
    } while (0)
#define TRY(e)                            \
    do {                                  \
        if ((s = (e)) != DL_OK) return s; \
    } while (0)

/* temb, and tproj = time_proj(silu(temb)), for a timestep */
static dl_status embed_time(wan_embed *e, float timestep) {
    const int64_t D = e->D;
    const dl_dtype dt = e->dt;
    dl_status s;
    dl_dit_timestep_proj(timestep, e->freq, e->tfreq);
    dl_convert_t(dt, e->vec_in, DL_F32, e->tfreq, e->freq, 0, 1);
    RUN(&e->t1, e->vec_in, e->vec_h);
    RUN(&e->t2, e->vec_h, e->temb);
    for (int64_t i = 0; i < D; i++) e->tmp[i] = e->temb[i] / (1.f + expf(-e->temb[i]));
    dl_convert_t(dt, e->vec_in, DL_F32, e->tmp, D, 0, 1);
    RUN(&e->tp, e->vec_in, e->tproj);
    return DL_OK;
}

/* the patch convolution, this rank's rows transposed into x [Nl, D] f32 */
static dl_status embed_patch(wan_embed *e, const float *latents, float *x) {
    const int64_t D = e->D, N = e->N, n0 = e->n0, Nl = e->Nl;
    const dl_dtype dt = e->dt;
    const size_t es = dl_dtype_size(dt);
    dl_status s;
    to_dt(dt, e->lat_in, latents, e->Cin * e->lat[0] * e->lat[1] * e->lat[2]);
    TRY(dl_conv_run(e->patch, e->lat_in, e->pe));
    const char *pe = e->pe;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < Nl; r++)
        for (int64_t d = 0; d < D; d++) {
            const char *v = pe + (size_t)(d * N + n0 + r) * es;
            x[r * D + d] = dt == DL_F32 ? *(const float *)v : dl_bf16_to_f32(*(const uint16_t *)v);
        }
    return DL_OK;
}

void dl_wan_free(dl_wan *m) {
    if (!m) return;
    embed_free(&m->e);
    lin *ls[] = {&m->x1, &m->x2, &m->proj_out};
    for (size_t i = 0; i < sizeof ls / sizeof ls[0]; i++) dl_lin_free(ls[i]);
    for (int i = 0; m->blk && i < m->nl; i++) {
        wan_block *b = &m->blk[i];
        lin *bl[] = {&b->qkv, &b->out, &b->q2, &b->kv2, &b->out2, &b->ff1, &b->ff2};
        for (size_t k = 0; k < sizeof bl / sizeof bl[0]; k++) dl_lin_free(bl[k]);
        free(b->nq), free(b->nk), free(b->nq2), free(b->nk2), free(b->n2w), free(b->n2b), free(b->sst);
    }
    free(m->blk), free(m->sst_out), free(m->spare);
    dl_dit_free(&m->c);
    dl_aligned_free(m->arena);
    dl_aligned_free(m->full);
    free(m);
}

/* `<base>.weight` / `<base>.bias` linears: one, or the fused concatenation of nparts */
static dl_status linp(lin *l, dl_wsrc *ck, const char *p, const char *const *names, int nparts, int64_t m, int64_t k,
                      int64_t n, dl_dtype dt, dl_dtype dst, dl_act act) {
    char w[3][256], b[3][256];
    const char *wn[3], *bn[3];
    int64_t parts[3];
    for (int i = 0; i < nparts; i++) {
        snprintf(w[i], sizeof w[i], "%s%s.weight", p, names[i]);
        snprintf(b[i], sizeof b[i], "%s%s.bias", p, names[i]);
        wn[i] = w[i], bn[i] = b[i], parts[i] = n;
    }
    return dl_lin_load(l, ck, wn, bn, nparts, parts, m, k, dt, dst, act);
}

static dl_status lin_one(lin *l, dl_wsrc *ck, const char *p, const char *name, int64_t m, int64_t k, int64_t n,
                         dl_dtype dt, dl_dtype dst, dl_act act) {
    const char *names[1] = {name};
    return linp(l, ck, p, names, 1, m, k, n, dt, dst, act);
}

static dl_status vec(dl_wsrc *ck, const char *p, const char *name, int64_t n, float **out) {
    char nm[256];
    snprintf(nm, sizeof nm, "%s%s", p, name);
    int64_t shape[1] = {n};
    return dl_param_f32(ck, nm, 1, shape, out);
}

static dl_status read_config(dl_wan *m, const cJSON *cfg, const char *file) {
    int64_t nl, heads, hd, ffn;
    double eps;
    dl_status s;
    const cJSON *ps = cJSON_GetObjectItemCaseSensitive(cfg, "patch_size");
    if ((s = dl_cfg_int(cfg, file, "num_attention_heads", 40, &heads)) ||
        (s = dl_cfg_int(cfg, file, "attention_head_dim", 128, &hd)) ||
        (s = dl_cfg_int(cfg, file, "in_channels", 16, &m->Cin)) ||
        (s = dl_cfg_int(cfg, file, "out_channels", 16, &m->Cout)) ||
        (s = dl_cfg_int(cfg, file, "text_dim", 4096, &m->Td)) || (s = dl_cfg_int(cfg, file, "freq_dim", 256, &m->freq)) ||
        (s = dl_cfg_int(cfg, file, "ffn_dim", 13824, &ffn)) || (s = dl_cfg_int(cfg, file, "num_layers", 40, &nl)) ||
        (s = dl_cfg_bool(cfg, file, "cross_attn_norm", 1, &m->cross_norm)) ||
        (s = dl_cfg_float(cfg, file, "eps", 1e-6, &eps)))
        return s;
    const char *refused[] = {"image_dim", "added_kv_proj_dim", "pos_embed_seq_len"};
    for (int i = 0; i < 3; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, refused[i]);
        if (v && !cJSON_IsNull(v))
            return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: %s is set: the image-conditioned (I2V) Wan transformer is not supported yet",
                           file, refused[i]);
    }
    m->P[0] = 1, m->P[1] = 2, m->P[2] = 2;
    if (ps) {
        if (!cJSON_IsArray(ps) || cJSON_GetArraySize(ps) != 3)
            return dl_fail(DL_ERR_FORMAT, "`%s`: patch_size must be 3 integers", file);
        for (int i = 0; i < 3; i++) {
            const cJSON *v = cJSON_GetArrayItem(ps, i);
            if (!cJSON_IsNumber(v) || v->valuedouble < 1 || v->valuedouble > 64 || v->valuedouble != (double)(int64_t)v->valuedouble)
                return dl_fail(DL_ERR_FORMAT, "`%s`: patch_size must be 3 integers from 1 to 64", file);
            m->P[i] = (int64_t)v->valuedouble;
        }
    }
    if (eps != 1e-6) /* the DiT library's adaLN uses 1e-6, as every Wan 2.1 config */
        return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: eps %g is not supported (1e-6)", file, eps);
    if (heads <= 0 || hd <= 0 || hd % 2 || ffn <= 0 || nl <= 0 || m->Cin <= 0 || m->Cout <= 0 || m->Td <= 0 ||
        m->freq <= 0 || m->freq % 2)
        return dl_fail(DL_ERR_FORMAT, "`%s`: inconsistent sizes", file);
    m->eps = (float)eps;
    m->nl = (int)nl;
    m->c.H = heads, m->c.Dh = hd, m->c.D = heads * hd, m->c.F = ffn;
    return DL_OK;
}

dl_status dl_wan_load(dl_wan **out, dl_model_dir *dir, const char *component, int64_t lat_frames, int64_t lat_h,
                      int64_t lat_w, int64_t txt_len, dl_dtype dt, dl_wsrc *src, const dl_dit_split *split) {
    return dl_wan_load_batch(out, dir, component, lat_frames, lat_h, lat_w, txt_len, dt, src, split, 1);
}

dl_status dl_wan_load_batch(dl_wan **out, dl_model_dir *dir, const char *component, int64_t lat_frames, int64_t lat_h,
                            int64_t lat_w, int64_t txt_len, dl_dtype dt, dl_wsrc *src, const dl_dit_split *split, int batch) {
    *out = NULL;
    if (batch != 1 && batch != 2) return dl_fail(DL_ERR_INVALID, "Wan transformer: a batch of %d branches (1 or 2)", batch);
    char file[512], p[128];
    snprintf(file, sizeof file, "%s/config.json", component);
    const cJSON *cfg;
    dl_status s = dl_model_dir_config(dir, component, &cfg);
    if (s != DL_OK) return s;
    dl_wan *m = calloc(1, sizeof *m);
    if (!m) return dl_fail(DL_ERR_NOMEM, "out of memory");
    dl_wsrc *ck = NULL;
    m->c.sp = split ? *split : (dl_dit_split){.tp = 1, .cp = 1};
    m->B = batch;
    if ((s = read_config(m, cfg, file))) goto fail;
    int64_t rope_max;
    if ((s = dl_cfg_int(cfg, file, "rope_max_seq_len", 1024, &rope_max))) goto fail;
    m->Fl = lat_frames, m->Hl_ = lat_h, m->Wl = lat_w, m->Tt = txt_len;
    const int64_t lat[3] = {lat_frames, lat_h, lat_w};
    for (int i = 0; i < 3; i++) {
        if (lat[i] <= 0 || lat[i] % m->P[i]) {
            s = dl_fail(DL_ERR_INVALID, "Wan transformer: the latent grid %lldx%lldx%lld (frames x height x width) is not divisible by patch_size (%lld, %lld, %lld)",
                        (long long)lat_frames, (long long)lat_h, (long long)lat_w, (long long)m->P[0], (long long)m->P[1],
                        (long long)m->P[2]);
            goto fail;
        }
        m->G[i] = lat[i] / m->P[i];
        if (m->G[i] > rope_max) {
            s = dl_fail(DL_ERR_INVALID, "Wan transformer: %lld patches along an axis, rope_max_seq_len is %lld",
                        (long long)m->G[i], (long long)rope_max);
            goto fail;
        }
    }
    if (txt_len <= 0) {
        s = dl_fail(DL_ERR_INVALID, "Wan transformer: empty text");
        goto fail;
    }
    char why[256];
    const char *bad = dl_dit_split_check(&m->c.sp, m->c.H, why, sizeof why);
    if (bad) {
        s = dl_fail(DL_ERR_INVALID, "parallel split refused: %s", bad);
        goto fail;
    }
    m->c.dt = dt;
    m->c.T = m->c.L = 0; /* no text rows in the self-attention stream */
    m->c.N = m->G[0] * m->G[1] * m->G[2];
    m->c.S = m->c.N;
    if ((s = dl_dit_plan(&m->c)) != DL_OK) goto fail;
    if ((s = dl_ws_open(&ck, src, dir, component)) != DL_OK) goto fail;
    const int64_t D = m->c.D, F = m->c.F, Nl = m->c.Nl, N = m->c.N, T = txt_len, PP = m->P[0] * m->P[1] * m->P[2];
    const int64_t BN = batch * Nl, BT = batch * T; /* rows of every branch in one matmul */
    const int64_t Dl = m->c.Dl, Fl = m->c.Fl;
    const int tp = m->c.sp.tp, tr = m->c.sp.tp_rank;
    /* Megatron slices: column parallel (this rank's heads / FFN columns), row parallel
     * (the matching input columns; the bias added by tp rank 0 only) */
    const lin_split col_h = {.row0 = tr * Dl, .rows = Dl}, col_f = {.row0 = tr * Fl, .rows = Fl};
    const lin_split row_h = {.nseg = 1, .seg0 = {tr * Dl}, .segn = {Dl}, .no_bias = tr != 0};
    const lin_split row_f = {.nseg = 1, .seg0 = {tr * Fl}, .segn = {Fl}, .no_bias = tr != 0};
    const lin_split *ch = tp > 1 ? &col_h : NULL, *cf = tp > 1 ? &col_f : NULL;
    const lin_split *rh = tp > 1 ? &row_h : NULL, *rf = tp > 1 ? &row_f : NULL;
    m->e = (wan_embed){.dt = dt, .D = D, .freq = m->freq, .Cin = m->Cin, .lat = {lat_frames, lat_h, lat_w}, .N = N,
                       .n0 = m->c.n0, .Nl = Nl};
    static const char *qkv_n[3] = {"attn1.to_q", "attn1.to_k", "attn1.to_v"}, *kv_n[2] = {"attn2.to_k", "attn2.to_v"};
    if ((s = embed_load(&m->e, ck, m->P)) ||
        (s = lin_one(&m->x1, ck, "condition_embedder.text_embedder.", "linear_1", BT, m->Td, D, dt, dt, DL_ACT_GELU_TANH)) ||
        (s = lin_one(&m->x2, ck, "condition_embedder.text_embedder.", "linear_2", BT, D, D, dt, dt, DL_ACT_NONE)) ||
        (s = lin_one(&m->proj_out, ck, "", "proj_out", BN, D, m->Cout * PP, dt, DL_F32, DL_ACT_NONE)))
        goto fail;
    int64_t sst_shape[3] = {1, 2, D}, bsst[3] = {1, 6, D};
    if ((s = dl_param_f32(ck, "scale_shift_table", 3, sst_shape, &m->sst_out))) goto fail;
    if (!(m->blk = calloc((size_t)m->nl, sizeof *m->blk))) {
        s = dl_fail(DL_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (int i = 0; i < m->nl; i++) {
        wan_block *b = &m->blk[i];
        char nm[256];
        snprintf(p, sizeof p, "blocks.%d.", i);
        snprintf(nm, sizeof nm, "%sscale_shift_table", p);
        char nm2[256];
#define PN(x) (snprintf(nm2, sizeof nm2, "%s%s", p, x), nm2)
        const char *kvw[2], *kvb[2];
        char kw[2][256], kb[2][256];
        for (int j = 0; j < 2; j++) {
            snprintf(kw[j], sizeof kw[j], "%s%s.weight", p, kv_n[j]);
            snprintf(kb[j], sizeof kb[j], "%s%s.bias", p, kv_n[j]);
            kvw[j] = kw[j], kvb[j] = kb[j];
        }
        const int64_t kvn[2] = {D, D};
        if ((s = dl_lin_qkv(&b->qkv, ck, p, qkv_n[0], qkv_n[1], qkv_n[2], BN, D, dt, ch)) ||
            (s = vec(ck, p, "attn1.norm_q.weight", D, &b->nq)) || (s = vec(ck, p, "attn1.norm_k.weight", D, &b->nk)) ||
            (s = dl_lin_named(&b->out, ck, PN("attn1.to_out.0"), BN, D, D, dt, DL_F32, DL_ACT_NONE, 0, rh)) ||
            (m->cross_norm && ((s = vec(ck, p, "norm2.weight", D, &b->n2w)) || (s = vec(ck, p, "norm2.bias", D, &b->n2b)))) ||
            (s = dl_lin_named(&b->q2, ck, PN("attn2.to_q"), BN, D, D, dt, dt, DL_ACT_NONE, 0, ch)) ||
            (s = dl_lin_load_split(&b->kv2, ck, kvw, kvb, 2, kvn, BT, D, dt, dt, DL_ACT_NONE, 0, ch)) ||
            (s = vec(ck, p, "attn2.norm_q.weight", D, &b->nq2)) || (s = vec(ck, p, "attn2.norm_k.weight", D, &b->nk2)) ||
            (s = dl_lin_named(&b->out2, ck, PN("attn2.to_out.0"), BN, D, D, dt, DL_F32, DL_ACT_NONE, 0, rh)) ||
            (s = dl_lin_named(&b->ff1, ck, PN("ffn.net.0.proj"), BN, D, F, dt, dt, DL_ACT_GELU_TANH, 0, cf)) ||
            (s = dl_lin_named(&b->ff2, ck, PN("ffn.net.2"), BN, F, D, dt, DL_F32, DL_ACT_NONE, 0, rf)) ||
            (s = dl_param_f32(ck, nm, 3, bsst, &b->sst)))
#undef PN
            goto fail;
    }
    /* RoPE tables of the local rows (token order: frame, row, column) */
    const int64_t hd = m->c.Dh / 2;
    m->c.rope_cos = malloc((size_t)(N * hd) * sizeof(float));
    m->c.rope_sin = malloc((size_t)(N * hd) * sizeof(float));
    if (!m->c.rope_cos || !m->c.rope_sin) {
        s = dl_fail(DL_ERR_NOMEM, "out of memory");
        goto fail;
    }
    dl_rope_table_wan(m->G[0], m->G[1], m->G[2], m->c.Dh, 10000.0, m->c.rope_cos, m->c.rope_sin);
    if (m->c.n0) {
        memmove(m->c.rope_cos, m->c.rope_cos + m->c.n0 * hd, (size_t)(Nl * hd) * 4);
        memmove(m->c.rope_sin, m->c.rope_sin + m->c.n0 * hd, (size_t)(Nl * hd) * 4);
    }
    const size_t es = dl_dtype_size(dt);
    const int64_t keys = N > T ? N : T;
    act_plan pl = {0};
    dl_plan_add(&pl, &m->c.x, (size_t)(batch * m->c.xn * D) * 4, 0, 2);
    dl_plan_add(&pl, &m->c.o, (size_t)(BN * D) * 4, 0, 1); /* SP: the embedding's rows first */
    dl_plan_add(&pl, &m->c.h, (size_t)(BN * D) * es, 1, 2);
    dl_plan_add(&pl, &m->c.qkv, (size_t)(BN * 3 * Dl) * es, 1, 1);
    dl_plan_add(&pl, &m->c.att, (size_t)(BN * Dl) * es, 1, 1);
    dl_plan_add(&pl, &m->txt_in, (size_t)(BT * m->Td) * es, 0, 0);
    dl_plan_add(&pl, &m->txt_h, (size_t)(BT * D) * es, 0, 0);
    dl_plan_add(&pl, &m->ctx, (size_t)(BT * D) * es, 0, 1);
    dl_plan_add(&pl, &m->q2, (size_t)(BN * Dl) * es, 1, 1);
    dl_plan_add(&pl, &m->kv2, (size_t)(BT * 2 * Dl) * es, 1, 1);
    dl_plan_add(&pl, &m->ss, (size_t)(BN > BT ? BN : BT) * 4, 1, 1);
    dl_plan_add(&pl, &m->f, (size_t)(BN * Fl) * es, 1, 1);
    dl_plan_add(&pl, &m->mod, (size_t)(6 * D) * 4, 1, 2);
    embed_plan(&m->e, &pl);
    dl_plan_add(&pl, &m->ones, (size_t)D * 4, 0, 2);
    dl_plan_add(&pl, &m->pout, (size_t)(BN * m->Cout * PP) * 4, 2, 2);
    dl_plan_attn_scratch(&pl, &m->c.scratch, dt, keys, m->c.H, m->c.Dh, 0, 1, 1);
    if ((s = dl_plan_commit(&pl, ck, &m->arena)) != DL_OK || (s = dl_dit_alloc(&m->c)) != DL_OK) goto fail;
    if (m->c.sp.cp > 1 && !(m->full = dl_aligned_alloc((size_t)(N * m->Cout * PP) * 4))) {
        s = dl_fail(DL_ERR_NOMEM, "out of memory");
        goto fail;
    }
    dl_ws_close(ck);
    *out = m;
    return DL_OK;
fail:
    dl_ws_close(ck);
    dl_wan_free(m);
    return s;
}

/* mod = sst + v (f32, as torch adds the table to the projection) */
static void add_table(float *mod, const float *sst, const float *v, int64_t n) {
    for (int64_t i = 0; i < n; i++) mod[i] = sst[i] + v[i];
}

/* batch 1's view of the stream: the same split and scratch, its own rows of every
 * activation (branch b's rows follow branch 0's in each buffer) */
static dl_dit view(const dl_dit *c, int b) {
    dl_dit v = *c;
    const size_t es = dl_dtype_size(c->dt);
    v.x = c->x + (int64_t)b * c->xn * c->D;
    v.o = c->o + (int64_t)b * c->Nl * c->D;
    v.h = (char *)c->h + (size_t)((int64_t)b * c->Nl * c->D) * es;
    v.qkv = (char *)c->qkv + (size_t)((int64_t)b * c->Nl * 3 * c->Dl) * es;
    v.att = (char *)c->att + (size_t)((int64_t)b * c->Nl * c->Dl) * es;
    return v;
}

/* the B branches' outputs (same latents and timestep, text txt[b]) into out[b] */
static dl_status run_batch(dl_wan *m, const float *latents, const float *const *txt, float timestep, float *const *out) {
    const int B = m->B;
    const int64_t D = m->c.D, Dl = m->c.Dl, N = m->c.N, Nl = m->c.Nl, n0 = m->c.n0, T = m->Tt, PP = m->P[0] * m->P[1] * m->P[2];
    const dl_dtype dt = m->c.dt;
    const size_t es = dl_dtype_size(dt);
    dl_status s;
    if (!isfinite(timestep)) return dl_fail(DL_ERR_INVALID, "Wan transformer: the timestep is not finite");
    dl_wan_phase_times *pt = m->pt;
    const double t_run = pt ? dl_now() : 0;
    double t0 = t_run, ta = 0;
    dl_dit v[2] = {m->c, B > 1 ? view(&m->c, 1) : m->c};
    TRY(embed_time(&m->e, timestep));
    /* text: ctx = text_embedder(txt), every branch's rows in one matmul */
    for (int b = 0; b < B; b++) to_dt(dt, (char *)m->txt_in + (size_t)(b * T * m->Td) * es, txt[b], T * m->Td);
    RUN(&m->x1, m->txt_in, m->txt_h);
    RUN(&m->x2, m->txt_h, m->ctx);
    /* this rank's video tokens, the same for every branch (SP: into o, then each branch's shard) */
    const int sp = dl_dit_sp_on(&m->c);
    TRY(embed_patch(&m->e, latents, sp ? m->c.o : m->c.x));
    for (int b = sp ? 0 : 1; b < B; b++)
        memcpy(v[b].x, (sp ? m->c.o + m->c.xa * D : m->c.x), (size_t)(m->c.xn * D) * 4);
    for (int64_t i = 0; i < D; i++) m->ones[i] = 1.f;
    for (int i = 0; i < m->nl; i++) {
        wan_block *bl = &m->blk[i];
        float *md = m->mod; /* shift1, scale1, gate1, shift2, scale2, gate2 */
        add_table(md, bl->sst, m->e.tproj, 6 * D);
        if (pt) t0 = dl_now(); /* the sublayers' clocks start here */
        /* self-attention, per branch over its own tokens */
        for (int b = 0; b < B; b++) {
            dl_dit_ln_mod(&v[b], NULL, NULL, md + D, md);
            TRY(dl_dit_gather_h(&v[b])); /* SP: every rank's rows */
        }
        RUN(&bl->qkv, m->c.h, m->c.qkv);
        for (int b = 0; b < B; b++) TRY(dl_dit_qk_norm_full_rope(&v[b], bl->nq, bl->nk, m->eps, m->ss));
        if (pt) ta = dl_now();
        for (int b = 0; b < B; b++) TRY(dl_dit_attention(&v[b], Dl));
        if (pt) pt->self_attn_s += dl_now() - ta;
        RUN(&bl->out, m->c.att, m->c.o);
        for (int b = 0; b < B; b++) { /* TP: the row-parallel partial sums (SP: reduce-scattered to the shard) */
            TRY(dl_dit_reduce_out(&v[b]));
            dl_dit_gate_add(&v[b], NULL, md + 2 * D);
        }
        if (pt) phase(&pt->self_s, &t0);
        /* cross-attention to every text row of the branch's own text */
        for (int b = 0; b < B; b++) { /* norm2 over the rows held, then every rank's (SP) */
            char *hb = (char *)v[b].h + (size_t)(v[b].xa * D) * es;
            const float *xb = v[b].x;
            const int64_t xn = v[b].xn;
            if (m->cross_norm)
                DL_PAR(dl_layernorm_x_t(dt, hb, DL_F32, xb, xn, D, bl->n2w, bl->n2b, NULL, NULL, m->eps, ith, nth));
            else
                to_dt(dt, hb, xb, xn * D);
            TRY(dl_dit_gather_h(&v[b]));
        }
        RUN(&bl->q2, m->c.h, m->q2);
        RUN(&bl->kv2, m->ctx, m->kv2);
        TRY(dl_dit_rmsnorm_full(&m->c, m->q2, B * Nl, Dl, bl->nq2, m->eps, m->ss));
        TRY(dl_dit_rmsnorm_full(&m->c, m->kv2, B * T, 2 * Dl, bl->nk2, m->eps, m->ss));
        for (int b = 0; b < B; b++) {
            const char *q = (const char *)m->q2 + (size_t)(b * Nl * Dl) * es, *kv = (const char *)m->kv2 + (size_t)(b * T * 2 * Dl) * es;
            dl_dit_cross_attention(&v[b], q, Dl, kv, kv + (size_t)Dl * es, 2 * Dl, T, T, v[b].att, Dl);
        }
        RUN(&bl->out2, m->c.att, m->c.o);
        for (int b = 0; b < B; b++) {
            TRY(dl_dit_reduce_out(&v[b]));
            dl_dit_gate_add(&v[b], NULL, m->ones);
        }
        if (pt) phase(&pt->cross_s, &t0);
        /* feed-forward */
        for (int b = 0; b < B; b++) {
            dl_dit_ln_mod(&v[b], NULL, NULL, md + 4 * D, md + 3 * D);
            TRY(dl_dit_gather_h(&v[b]));
        }
        RUN(&bl->ff1, m->c.h, m->f);
        RUN(&bl->ff2, m->f, m->c.o);
        for (int b = 0; b < B; b++) {
            TRY(dl_dit_reduce_out(&v[b]));
            dl_dit_gate_add(&v[b], NULL, md + 5 * D);
        }
        if (pt) phase(&pt->ffn_s, &t0);
    }
    add_table(m->mod, m->sst_out, m->e.temb, D); /* shift */
    add_table(m->mod + D, m->sst_out + D, m->e.temb, D); /* scale */
    for (int b = 0; b < B; b++) {
        dl_dit_ln_mod(&v[b], NULL, NULL, m->mod + D, m->mod);
        TRY(dl_dit_gather_h(&v[b]));
    }
    RUN(&m->proj_out, m->c.h, m->pout);
    /* unpatchify: row (f, h, w), column ((pt, ph, pw), c) -> out[c, f pt + pt', ...] */
    for (int b = 0; b < B; b++) {
        const float *rows = m->pout + b * Nl * m->Cout * PP;
        if (m->c.sp.cp > 1) {
            memcpy(m->full + n0 * m->Cout * PP, rows, (size_t)(Nl * m->Cout * PP) * 4);
            TRY(dl_dit_gather_image_rows(&m->c, m->full, m->Cout * PP));
            rows = m->full;
        }
        const int64_t G1 = m->G[1], G2 = m->G[2], H = m->Hl_, W = m->Wl, FHW = m->Fl * H * W;
        float *o = out[b];
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < N; r++) {
            int64_t f = r / (G1 * G2), h = r / G2 % G1, w = r % G2;
            const float *row = rows + r * m->Cout * PP;
            for (int64_t a = 0; a < m->P[0]; a++)
                for (int64_t bb = 0; bb < m->P[1]; bb++)
                    for (int64_t cc = 0; cc < m->P[2]; cc++) {
                        const float *vv = row + ((a * m->P[1] + bb) * m->P[2] + cc) * m->Cout;
                        int64_t at = ((f * m->P[0] + a) * H + h * m->P[1] + bb) * W + w * m->P[2] + cc;
                        for (int64_t c = 0; c < m->Cout; c++) o[c * FHW + at] = vv[c];
                    }
        }
    }
    if (pt) {
        pt->total_s += dl_now() - t_run;
        pt->runs++;
    }
    return DL_OK;
}

int dl_wan_batch(const dl_wan *m) { return m->B; }

dl_status dl_wan_run(dl_wan *m, const float *latents, const float *txt, float timestep, float *out) {
    if (m->B == 1) {
        const float *t1[1] = {txt};
        float *o1[1] = {out};
        return run_batch(m, latents, t1, timestep, o1);
    }
    /* a program built for two branches runs one as two identical ones (no saving) */
    if (!m->spare && !(m->spare = malloc((size_t)(m->Cout * m->Fl * m->Hl_ * m->Wl) * 4)))
        return dl_fail(DL_ERR_NOMEM, "out of memory");
    const float *t2[2] = {txt, txt};
    float *o2[2] = {out, m->spare};
    return run_batch(m, latents, t2, timestep, o2);
}

dl_status dl_wan_run2(dl_wan *m, const float *latents, const float *txt0, const float *txt1, float timestep, float *out0,
                      float *out1) {
    if (m->B != 2) return dl_fail(DL_ERR_INVALID, "Wan transformer: built for %d branch(es), not a CFG batch of 2", m->B);
    const float *t2[2] = {txt0, txt1};
    float *o2[2] = {out0, out1};
    return run_batch(m, latents, t2, timestep, o2);
}

/* ---- the probe program ------------------------------------------------------------ */

struct dl_wan_probe {
    dl_dit c;                         /* sizes and the split (no attention buffers) */
    wan_embed e;
    float *sst0;                      /* blocks.0.scale_shift_table [6, D] */
    float *x, *cur, *mod;             /* [Nl, D], [Nl, D], [6D] f32 */
    float *prev[2];                   /* [Nl, D] per CFG slot */
    int have[2];
    void *arena;
};

void dl_wan_probe_free(dl_wan_probe *p) {
    if (!p) return;
    embed_free(&p->e);
    free(p->sst0);
    dl_dit_free(&p->c);
    dl_aligned_free(p->prev[0]), dl_aligned_free(p->prev[1]), dl_aligned_free(p->arena);
    free(p);
}

void dl_wan_probe_reset(dl_wan_probe *p) { p->have[0] = p->have[1] = 0; }

dl_status dl_wan_probe_load(dl_wan_probe **out, dl_model_dir *dir, const char *component, int64_t lat_frames,
                            int64_t lat_h, int64_t lat_w, dl_dtype dt, dl_wsrc *src, const dl_dit_split *split) {
    *out = NULL;
    char file[512];
    snprintf(file, sizeof file, "%s/config.json", component);
    const cJSON *cfg;
    dl_status s = dl_model_dir_config(dir, component, &cfg);
    if (s != DL_OK) return s;
    dl_wan_probe *p = calloc(1, sizeof *p);
    dl_wan *m = calloc(1, sizeof *m); /* the config reader's sizes */
    dl_wsrc *ck = NULL;
    if (!p || !m) {
        free(m);
        free(p);
        return dl_fail(DL_ERR_NOMEM, "out of memory");
    }
    if ((s = read_config(m, cfg, file))) goto fail;
    const int64_t lat[3] = {lat_frames, lat_h, lat_w};
    int64_t N = 1;
    for (int i = 0; i < 3; i++) {
        if (lat[i] <= 0 || lat[i] % m->P[i]) {
            s = dl_fail(DL_ERR_INVALID, "Wan probe: the latent grid is not divisible by patch_size");
            goto fail;
        }
        N *= lat[i] / m->P[i];
    }
    p->c = (dl_dit){.sp = split ? *split : (dl_dit_split){.tp = 1, .cp = 1}, .dt = dt, .D = m->c.D, .H = m->c.H,
                    .Dh = m->c.Dh, .F = m->c.F, .N = N, .S = N};
    /* tp ranks compute the probe alike (replicated, SP or not); cp ranks their own rows */
    if ((s = dl_dit_plan(&p->c)) != DL_OK) goto fail;
    const int64_t D = m->c.D, Nl = p->c.Nl;
    p->e = (wan_embed){.dt = dt, .D = D, .freq = m->freq, .Cin = m->Cin, .lat = {lat_frames, lat_h, lat_w}, .N = N,
                       .n0 = p->c.n0, .Nl = Nl};
    int64_t bsst[3] = {1, 6, D};
    if ((s = dl_ws_open(&ck, src, dir, component)) != DL_OK || (s = embed_load(&p->e, ck, m->P)) != DL_OK ||
        (s = dl_param_f32(ck, "blocks.0.scale_shift_table", 3, bsst, &p->sst0)) != DL_OK)
        goto fail;
    act_plan pl = {0};
    dl_plan_add(&pl, &p->x, (size_t)(Nl * D) * 4, 0, 1);
    dl_plan_add(&pl, &p->cur, (size_t)(Nl * D) * 4, 1, 1);
    dl_plan_add(&pl, &p->mod, (size_t)(6 * D) * 4, 1, 1);
    embed_plan(&p->e, &pl);
    if ((s = dl_plan_commit(&pl, ck, &p->arena)) != DL_OK) goto fail;
    for (int i = 0; i < 2; i++)
        if (!(p->prev[i] = dl_aligned_alloc((size_t)(Nl * D) * 4))) {
            s = dl_fail(DL_ERR_NOMEM, "out of memory");
            goto fail;
        }
    dl_ws_close(ck);
    free(m);
    *out = p;
    return DL_OK;
fail:
    dl_ws_close(ck);
    free(m);
    dl_wan_probe_free(p);
    return s;
}

dl_status dl_wan_probe_run(dl_wan_probe *p, int slot, const float *latents, float timestep, double *score) {
    const int64_t D = p->c.D, Nl = p->c.Nl;
    dl_status s;
    *score = 0;
    if (slot < 0 || slot > 1) return dl_fail(DL_ERR_INVALID, "probe: slot %d (0 or 1)", slot);
    if (!isfinite(timestep)) return dl_fail(DL_ERR_INVALID, "Wan probe: the timestep is not finite");
    TRY(embed_time(&p->e, timestep));
    TRY(embed_patch(&p->e, latents, p->x));
    add_table(p->mod, p->sst0, p->e.tproj, 2 * D); /* shift1, scale1 */
    return dl_dit_probe_feature(&p->c, p->cur, p->prev[slot], &p->have[slot], p->x, Nl, p->mod + D, p->mod, score);
}
