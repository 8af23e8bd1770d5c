/* FluxTransformer2DModel (diffusers): FLUX.1's denoiser, built for a fixed image
 * token grid and text length. The joint sequence keeps text rows first, then
 * image rows, in every buffer, so joint attention runs on one [S, ...] view.
 *
 *   temb = timestep_embedder(proj(t*1000)) [+ guidance_embedder(proj(g*1000))]
 *          + text_embedder(pooled)                                     // [D]
 *   x = [context_embedder(txt); x_embedder(latents)]                   // [S, D] f32
 *   double block (per stream s in {txt, img}: own weights, shared attention):
 *     shift1, scale1, gate1, shift2, scale2, gate2 = norm1(_context).linear(silu(temb))
 *     h = LN(x_s)(1 + scale1) + shift1;  q, k, v = qkv_s(h);  q, k = RMS(q), RMS(k)
 *     a = attention(RoPE(q), RoPE(k), v) over all S rows
 *     x_s += gate1 * out_s(a_s);  x_s += gate2 * ff_s(LN(x_s)(1 + scale2) + shift2)
 *   single block (all S rows, one weight set):
 *     shift, scale, gate = norm.linear(silu(temb));  h = LN(x)(1 + scale) + shift
 *     x += gate * proj_out([attention(h) | gelu(proj_mlp(h))])
 *   out = proj_out(LN(x_img)(1 + scale) + shift), (scale, shift) = norm_out.linear(...)
 *
 * Split (dl_dit_split): a rank holds T text rows and its Nl image rows (the cp
 * shard), "local rows" [0, Sl). With TP it has Hl = H / tp heads (Dl = Hl * Dh
 * columns of q, k, v and attention) and Fl = F / tp MLP columns; with SP its
 * residual stream x holds only its token shard [xa, xa + xn) of the local rows. */
#include <cjson/cJSON.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "difflet/comm.h"
#include "models/models_impl.h"

typedef struct {
    lin mod_img, mod_txt;          /* norm1 / norm1_context: D -> 6D */
    lin qkv_img, qkv_txt;          /* to_q|to_k|to_v, add_q|add_k|add_v: D -> 3D */
    float *nq_img, *nk_img, *nq_txt, *nk_txt; /* [head_dim] */
    lin out_img, out_txt;          /* to_out.0, to_add_out */
    lin ff1_img, ff2_img, ff1_txt, ff2_txt;
} flux_double;

typedef struct {
    lin mod;                        /* D -> 3D */
    lin qkv;                        /* D -> 3D */
    float *nq, *nk;
    lin mlp;                        /* proj_mlp: D -> 4D, GELU fused */
    lin out;                        /* proj_out: 5D -> D */
} flux_single;

struct dl_flux {
    int64_t D, H, Dh, Cin, Cout, Jd, Pd, T, N, S, F; /* F = mlp width */
    int nd, ns, guidance;
    dl_dtype dt;
    dl_dit_split sp;
    int64_t L;                      /* valid text keys [0, L) */
    int64_t Hl, Dl, Fl;             /* this rank's heads, attention and MLP columns */
    int64_t Nl, n0, Sl;             /* image rows [n0, n0 + Nl) of N; local rows T + Nl */
    int64_t xa, xn;                 /* residual rows held (SP shard of the local rows) */
    int64_t *cn0, *cnn;             /* [cp]: every cp rank's image row offset and count */
    int64_t *ts0, *tsn;             /* [tp]: every tp rank's SP shard */
    size_t *cnt, *dsp, *cnt2, *dsp2; /* collective counts scratch ([max(tp, cp)] each) */
    float *o_sh;                    /* [xn, D] f32: reduce-scattered residual update (SP) */
    void *cbuf, *cbuf2, *cbuf3;     /* CP exchange buffers (mode dependent) */
    float *part;                    /* partial attention outputs: o, m, l per part */
    int64_t part_rows;              /* rows x heads of one part */
    lin t1, t2, g1, g2, p1, p2;     /* time / guidance / pooled-text embedders */
    lin ctx, xemb;                  /* context_embedder, x_embedder */
    flux_double *dbl;
    flux_single *sgl;
    lin norm_out, proj_out;
    float *rope_cos, *rope_sin;     /* [S, Dh/2] */
    /* activations */
    float *x, *o;                   /* [S, D] f32 */
    void *h;                        /* [S, D] dt */
    void *qkv;                      /* [S, 3D] dt */
    void *att;                      /* [S, 5D] dt: attention | mlp (single blocks) */
    void *f;                        /* [S, F] dt */
    void *in_lat, *in_txt;          /* inputs in dt */
    float *temb, *mod_img, *mod_txt, *tproj; /* [D], [6D], [6D], [256] */
    void *vec_in, *vec_h;           /* [max(256, Pd, D)] dt: one-row matmul inputs */
    void *scratch;
    void *arena; /* one block holding every buffer above, planned by lifetime */
    float *probe_prev[2], *probe_cur; /* [N, D] each, allocated on first probe use */
    int probe_have[2];
};

int64_t dl_flux_in_channels(const dl_flux *m) { return m->Cin; }
int64_t dl_flux_out_channels(const dl_flux *m) { return m->Cout; }
int dl_flux_has_guidance(const dl_flux *m) { return m->guidance; }
int64_t dl_flux_width(const dl_flux *m) { return m->D; }
int dl_flux_blocks(const dl_flux *m, int *n_single) {
    if (n_single) *n_single = m->ns;
    return m->nd;
}

void dl_flux_free(dl_flux *m) {
    if (!m) return;
    lin *ls[] = {&m->t1, &m->t2, &m->g1, &m->g2, &m->p1, &m->p2, &m->ctx, &m->xemb, &m->norm_out, &m->proj_out};
    for (size_t i = 0; i < sizeof ls / sizeof ls[0]; i++) dl_lin_free(ls[i]);
    for (int i = 0; m->dbl && i < m->nd; i++) {
        flux_double *b = &m->dbl[i];
        lin *bl[] = {&b->mod_img, &b->mod_txt, &b->qkv_img, &b->qkv_txt, &b->out_img, &b->out_txt,
                     &b->ff1_img, &b->ff2_img, &b->ff1_txt, &b->ff2_txt};
        for (size_t k = 0; k < sizeof bl / sizeof bl[0]; k++) dl_lin_free(bl[k]);
        free(b->nq_img), free(b->nk_img), free(b->nq_txt), free(b->nk_txt);
    }
    for (int i = 0; m->sgl && i < m->ns; i++) {
        flux_single *b = &m->sgl[i];
        dl_lin_free(&b->mod), dl_lin_free(&b->qkv), dl_lin_free(&b->mlp), dl_lin_free(&b->out);
        free(b->nq), free(b->nk);
    }
    free(m->dbl), free(m->sgl), free(m->rope_cos), free(m->rope_sin);
    free(m->cn0), free(m->cnn), free(m->ts0), free(m->tsn), free(m->cnt), free(m->dsp), free(m->cnt2), free(m->dsp2);
    void *bufs[] = {m->arena, m->probe_prev[0], m->probe_prev[1], m->probe_cur, m->o_sh, m->cbuf, m->cbuf2, m->cbuf3, m->part};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) dl_aligned_free(bufs[i]);
    free(m);
}

/* one linear with bias, named `<base>.weight` / `<base>.bias`, output rows ldy apart,
 * optionally this rank's tensor-parallel slice */
static dl_status lin1s(lin *l, dl_wsrc *ck, const char *base, int64_t m, int64_t k, int64_t n, dl_dtype dt,
                       dl_dtype dst, dl_act act, int64_t ldy, const lin_split *sp) {
    char w[256], b[256];
    snprintf(w, sizeof w, "%s.weight", base);
    snprintf(b, sizeof b, "%s.bias", base);
    const char *wn[1] = {w}, *bn[1] = {b};
    return dl_lin_load_split(l, ck, wn, bn, 1, &n, m, k, dt, dst, act, ldy, sp);
}

static dl_status lin1(lin *l, dl_wsrc *ck, const char *base, int64_t m, int64_t k, int64_t n, dl_dtype dt,
                      dl_dtype dst, dl_act act) {
    return lin1s(l, ck, base, m, k, n, dt, dst, act, 0, NULL);
}

/* fused q|k|v of three checkpoint linears; with a split, this rank's heads of each */
static dl_status lin3(lin *l, dl_wsrc *ck, const char *p, const char *a, const char *b, const char *c,
                      int64_t m, int64_t D, dl_dtype dt, const lin_split *sp) {
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

static dl_status vecp(dl_wsrc *ck, const char *name, int64_t n, float **out) {
    int64_t shape[1] = {n};
    return dl_param_f32(ck, name, 1, shape, out);
}


int64_t dl_flux_heads(const dl_flux *m) { return m->H; }
void dl_flux_text_dims(const dl_flux *m, int64_t *joint, int64_t *pooled) {
    *joint = m->Jd;
    *pooled = m->Pd;
}

dl_status dl_flux_set_text_valid(dl_flux *m, int64_t valid) {
    if (valid < 1 || valid > m->T)
        return dl_fail(DL_ERR_INVALID, "FLUX transformer: valid text length %lld is outside 1..%lld", (long long)valid,
                       (long long)m->T);
    m->L = valid;
    return DL_OK;
}

dl_status dl_flux_load(dl_flux **out, dl_model_dir *dir, const char *component, int64_t grid_h, int64_t grid_w,
                       int64_t txt_len, dl_dtype dt, dl_wsrc *src) {
    return dl_flux_load_split(out, dir, component, grid_h, grid_w, txt_len, dt, src, NULL);
}

/* shard [off, off + cnt) of n items for part i of k */
static void shard(int64_t n, int i, int k, int64_t *off, int64_t *cnt) {
    *off = n * i / k;
    *cnt = n * (i + 1) / k - *off;
}

/* the split's row layout and exchange buffers */
static dl_status plan_split(dl_flux *m) {
    const dl_dit_split *sp = &m->sp;
    const int tp = sp->tp, cp = sp->cp, g = tp > cp ? tp : cp;
    m->Hl = m->H / tp;
    m->Dl = m->Hl * m->Dh;
    m->Fl = m->F / tp;
    if (m->N < cp) return dl_fail(DL_ERR_INVALID, "context parallelism: %lld image tokens for cp=%d ranks", (long long)m->N, cp);
    m->cn0 = calloc((size_t)cp, sizeof *m->cn0), m->cnn = calloc((size_t)cp, sizeof *m->cnn);
    m->ts0 = calloc((size_t)tp, sizeof *m->ts0), m->tsn = calloc((size_t)tp, sizeof *m->tsn);
    m->cnt = calloc((size_t)g, sizeof(size_t)), m->dsp = calloc((size_t)g, sizeof(size_t));
    m->cnt2 = calloc((size_t)g, sizeof(size_t)), m->dsp2 = calloc((size_t)g, sizeof(size_t));
    if (!m->cn0 || !m->cnn || !m->ts0 || !m->tsn || !m->cnt || !m->dsp || !m->cnt2 || !m->dsp2)
        return dl_fail(DL_ERR_NOMEM, "out of memory");
    for (int j = 0; j < cp; j++) shard(m->N, j, cp, &m->cn0[j], &m->cnn[j]);
    m->n0 = m->cn0[sp->cp_rank];
    m->Nl = m->cnn[sp->cp_rank];
    m->Sl = m->T + m->Nl;
    for (int j = 0; j < tp; j++) shard(m->Sl, j, tp, &m->ts0[j], &m->tsn[j]);
    if (sp->sp && tp > 1) {
        m->xa = m->ts0[sp->tp_rank];
        m->xn = m->tsn[sp->tp_rank];
    } else {
        m->xa = 0;
        m->xn = m->Sl;
    }
    return DL_OK;
}

/* buffers the CP exchange and the partial attention outputs need */
static dl_status alloc_split(dl_flux *m) {
    const int cp = m->sp.cp;
    const size_t es = dl_dtype_size(m->dt);
    const int64_t T = m->T, N = m->N, Nl = m->Nl, Dl = m->Dl, Hc = m->Hl / cp, Dc = Hc * m->Dh;
    size_t b1 = 0, b2 = 0, b3 = 0;
    int nparts = 2;
    m->part_rows = m->Sl * m->Hl;
    if (cp > 1 && m->sp.cp_mode == DL_CP_ULYSSES) {
        b1 = (size_t)(Nl * 3 * Dl) * es;                                             /* send: per destination heads */
        b2 = (size_t)((T + N) * 3 * Dc) * es;                                        /* all rows, my heads */
        b3 = (size_t)((T + N) * Dc + Nl * Dl + cp * T * Dc) * es;                    /* outputs, inverse, text gather */
        m->part_rows = (T + N) * Hc;
    } else if (cp > 1 && m->sp.cp_mode == DL_CP_GATHER) {
        b1 = (size_t)(Nl * 2 * Dl) * es;
        b2 = (size_t)((T + N) * 2 * Dl) * es;
    } else if (cp > 1) { /* ring: the shard held and the one arriving */
        int64_t nmax = 0;
        for (int j = 0; j < cp; j++) nmax = m->cnn[j] > nmax ? m->cnn[j] : nmax;
        b1 = b2 = (size_t)(nmax * 2 * Dl) * es;
        nparts = cp + 1;
    }
    void **dst[3] = {&m->cbuf, &m->cbuf2, &m->cbuf3};
    size_t sz[3] = {b1, b2, b3};
    for (int i = 0; i < 3; i++)
        if (sz[i] && !(*dst[i] = dl_aligned_alloc(sz[i]))) return dl_fail(DL_ERR_NOMEM, "out of memory");
    /* parts are needed for split text keys (L < T), gather and ring */
    m->part = dl_aligned_alloc((size_t)nparts * (size_t)(m->part_rows * (m->Dh + 2)) * 4);
    if (!m->part) return dl_fail(DL_ERR_NOMEM, "out of memory");
    if (m->sp.sp && m->sp.tp > 1 && !(m->o_sh = dl_aligned_alloc((size_t)(m->xn * m->D) * 4)))
        return dl_fail(DL_ERR_NOMEM, "out of memory");
    return DL_OK;
}

dl_status dl_flux_load_split(dl_flux **out, dl_model_dir *dir, const char *component, int64_t grid_h, int64_t grid_w,
                             int64_t txt_len, dl_dtype dt, dl_wsrc *src, const dl_dit_split *split) {
    *out = NULL;
    char file[512], p[128], nm[256];
    snprintf(file, sizeof file, "%s/config.json", component);
    const cJSON *cfg;
    dl_status s = dl_model_dir_config(dir, component, &cfg);
    if (s != DL_OK) return s;
    dl_flux *m = calloc(1, sizeof *m);
    if (!m) return dl_fail(DL_ERR_NOMEM, "out of memory");
    m->sp = split ? *split : (dl_dit_split){.tp = 1, .cp = 1};
    dl_wsrc *ck = NULL;
    int64_t patch, nd, ns, out_ch;
    int guid;
    const cJSON *axes = cJSON_GetObjectItemCaseSensitive(cfg, "axes_dims_rope");
    if ((s = dl_cfg_int(cfg, file, "patch_size", 1, &patch)) || (s = dl_cfg_int(cfg, file, "in_channels", 64, &m->Cin)) ||
        (s = dl_cfg_int(cfg, file, "out_channels", 0, &out_ch)) || (s = dl_cfg_int(cfg, file, "num_layers", 19, &nd)) ||
        (s = dl_cfg_int(cfg, file, "num_single_layers", 38, &ns)) ||
        (s = dl_cfg_int(cfg, file, "attention_head_dim", 128, &m->Dh)) ||
        (s = dl_cfg_int(cfg, file, "num_attention_heads", 24, &m->H)) ||
        (s = dl_cfg_int(cfg, file, "joint_attention_dim", 4096, &m->Jd)) ||
        (s = dl_cfg_int(cfg, file, "pooled_projection_dim", 768, &m->Pd)) ||
        (s = dl_cfg_bool(cfg, file, "guidance_embeds", 0, &guid)))
        goto fail;
    int axes_dim[3] = {16, 56, 56}, asum = 0;
    if (axes) {
        if (!cJSON_IsArray(axes) || cJSON_GetArraySize(axes) != 3) {
            s = dl_fail(DL_ERR_FORMAT, "`%s`: axes_dims_rope must be 3 integers", file);
            goto fail;
        }
        for (int i = 0; i < 3; i++) axes_dim[i] = (int)cJSON_GetArrayItem(axes, i)->valuedouble;
    }
    for (int i = 0; i < 3; i++) asum += axes_dim[i];
    m->guidance = guid;
    m->nd = (int)nd;
    m->ns = (int)ns;
    m->Cout = out_ch ? out_ch : m->Cin;
    m->D = m->H * m->Dh;
    m->F = 4 * m->D;
    m->dt = dt;
    m->T = m->L = txt_len;
    m->N = grid_h * grid_w;
    m->S = m->T + m->N;
    if (patch != 1) {
        s = dl_fail(DL_ERR_UNSUPPORTED, "`%s`: patch_size %lld is not supported (FLUX uses 1)", file, (long long)patch);
        goto fail;
    }
    if (asum != m->Dh) {
        s = dl_fail(DL_ERR_FORMAT, "`%s`: axes_dims_rope sums to %d, attention_head_dim is %lld", file, asum, (long long)m->Dh);
        goto fail;
    }
    if (m->D <= 0 || nd < 0 || ns < 0 || nd + ns == 0 || m->Cin <= 0 || m->Jd <= 0 || m->Pd <= 0 || m->Dh % 2) {
        s = dl_fail(DL_ERR_FORMAT, "`%s`: inconsistent sizes", file);
        goto fail;
    }
    if (grid_h <= 0 || grid_w <= 0 || txt_len <= 0) {
        s = dl_fail(DL_ERR_INVALID, "FLUX transformer: empty image grid or text");
        goto fail;
    }
    char why[256];
    const char *bad = dl_dit_split_check(&m->sp, m->H, why, sizeof why);
    if (bad) {
        s = dl_fail(DL_ERR_INVALID, "parallel split refused: %s", bad);
        goto fail;
    }
    if ((s = plan_split(m)) != DL_OK) goto fail;
    if ((s = dl_ws_open(&ck, src, dir, component)) != DL_OK) goto fail;
    const int64_t D = m->D, T = m->T, Nl = m->Nl, Sl = m->Sl, Dl = m->Dl, Fl = m->Fl;
    const int tp = m->sp.tp, tr = m->sp.tp_rank;
    /* Megatron slices: column parallel (this rank's heads / MLP columns), row parallel
     * (the matching input columns; the bias added by tp rank 0 only) */
    const lin_split col_h = {.row0 = tr * Dl, .rows = Dl}, col_f = {.row0 = tr * Fl, .rows = Fl};
    const lin_split row_h = {.nseg = 1, .seg0 = {tr * Dl}, .segn = {Dl}, .no_bias = tr != 0};
    const lin_split row_f = {.nseg = 1, .seg0 = {tr * Fl}, .segn = {Fl}, .no_bias = tr != 0};
    /* single blocks' proj_out reads [attention (D) | mlp (F)]: this rank's columns of both */
    const lin_split row_1 = {.nseg = 2, .seg0 = {tr * Dl, D + tr * Fl}, .segn = {Dl, Fl}, .no_bias = tr != 0};
    const lin_split *ch = tp > 1 ? &col_h : NULL, *cf = tp > 1 ? &col_f : NULL;
    const lin_split *rh = tp > 1 ? &row_h : NULL, *rf = tp > 1 ? &row_f : NULL, *r1 = tp > 1 ? &row_1 : NULL;
    /* embedders: one-row matmuls */
    if ((s = lin1(&m->t1, ck, "time_text_embed.timestep_embedder.linear_1", 1, 256, D, dt, dt, DL_ACT_SILU)) ||
        (s = lin1(&m->t2, ck, "time_text_embed.timestep_embedder.linear_2", 1, D, D, dt, DL_F32, DL_ACT_NONE)) ||
        (s = lin1(&m->p1, ck, "time_text_embed.text_embedder.linear_1", 1, m->Pd, D, dt, dt, DL_ACT_SILU)) ||
        (s = lin1(&m->p2, ck, "time_text_embed.text_embedder.linear_2", 1, D, D, dt, DL_F32, DL_ACT_NONE)) ||
        (guid && ((s = lin1(&m->g1, ck, "time_text_embed.guidance_embedder.linear_1", 1, 256, D, dt, dt, DL_ACT_SILU)) ||
                  (s = lin1(&m->g2, ck, "time_text_embed.guidance_embedder.linear_2", 1, D, D, dt, DL_F32, DL_ACT_NONE)))) ||
        (s = lin1(&m->ctx, ck, "context_embedder", T, m->Jd, D, dt, DL_F32, DL_ACT_NONE)) ||
        (s = lin1(&m->xemb, ck, "x_embedder", Nl, m->Cin, D, dt, DL_F32, DL_ACT_NONE)) ||
        (s = lin1(&m->norm_out, ck, "norm_out.linear", 1, D, 2 * D, dt, DL_F32, DL_ACT_NONE)) ||
        (s = lin1(&m->proj_out, ck, "proj_out", Nl, D, m->Cout, dt, DL_F32, DL_ACT_NONE)))
        goto fail;
    if (!guid && dl_ws_find(ck, "time_text_embed.guidance_embedder.linear_1.weight")) {
        s = dl_fail(DL_ERR_FORMAT, "`%s`: the checkpoint has a guidance embedder but guidance_embeds is false", file);
        goto fail;
    }
    m->dbl = calloc((size_t)(nd ? nd : 1), sizeof *m->dbl);
    m->sgl = calloc((size_t)(ns ? ns : 1), sizeof *m->sgl);
    if (!m->dbl || !m->sgl) {
        s = dl_fail(DL_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (int i = 0; i < m->nd; i++) {
        flux_double *b = &m->dbl[i];
        snprintf(p, sizeof p, "transformer_blocks.%d.", i);
#define NM(x) (snprintf(nm, sizeof nm, "%s%s", p, x), nm)
        if ((s = lin1(&b->mod_img, ck, NM("norm1.linear"), 1, D, 6 * D, dt, DL_F32, DL_ACT_NONE)) ||
            (s = lin1(&b->mod_txt, ck, NM("norm1_context.linear"), 1, D, 6 * D, dt, DL_F32, DL_ACT_NONE)) ||
            (s = lin3(&b->qkv_img, ck, p, "attn.to_q", "attn.to_k", "attn.to_v", Nl, D, dt, ch)) ||
            (s = lin3(&b->qkv_txt, ck, p, "attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj", T, D, dt, ch)) ||
            (s = vecp(ck, NM("attn.norm_q.weight"), m->Dh, &b->nq_img)) ||
            (s = vecp(ck, NM("attn.norm_k.weight"), m->Dh, &b->nk_img)) ||
            (s = vecp(ck, NM("attn.norm_added_q.weight"), m->Dh, &b->nq_txt)) ||
            (s = vecp(ck, NM("attn.norm_added_k.weight"), m->Dh, &b->nk_txt)) ||
            (s = lin1s(&b->out_img, ck, NM("attn.to_out.0"), Nl, D, D, dt, DL_F32, DL_ACT_NONE, 0, rh)) ||
            (s = lin1s(&b->out_txt, ck, NM("attn.to_add_out"), T, D, D, dt, DL_F32, DL_ACT_NONE, 0, rh)) ||
            (s = lin1s(&b->ff1_img, ck, NM("ff.net.0.proj"), Nl, D, m->F, dt, dt, DL_ACT_GELU_TANH, 0, cf)) ||
            (s = lin1s(&b->ff2_img, ck, NM("ff.net.2"), Nl, m->F, D, dt, DL_F32, DL_ACT_NONE, 0, rf)) ||
            (s = lin1s(&b->ff1_txt, ck, NM("ff_context.net.0.proj"), T, D, m->F, dt, dt, DL_ACT_GELU_TANH, 0, cf)) ||
            (s = lin1s(&b->ff2_txt, ck, NM("ff_context.net.2"), T, m->F, D, dt, DL_F32, DL_ACT_NONE, 0, rf)))
            goto fail;
    }
    for (int i = 0; i < m->ns; i++) {
        flux_single *b = &m->sgl[i];
        snprintf(p, sizeof p, "single_transformer_blocks.%d.", i);
        if ((s = lin1(&b->mod, ck, NM("norm.linear"), 1, D, 3 * D, dt, DL_F32, DL_ACT_NONE)) ||
            (s = lin3(&b->qkv, ck, p, "attn.to_q", "attn.to_k", "attn.to_v", Sl, D, dt, ch)) ||
            (s = vecp(ck, NM("attn.norm_q.weight"), m->Dh, &b->nq)) ||
            (s = vecp(ck, NM("attn.norm_k.weight"), m->Dh, &b->nk)))
            goto fail;
        /* proj_mlp writes columns [Dl, Dl + Fl) of the [Sl, Dl + Fl] concat buffer that
         * the attention fills at [0, Dl); proj_out reads all of it */
        if ((s = lin1s(&b->mlp, ck, NM("proj_mlp"), Sl, D, m->F, dt, dt, DL_ACT_GELU_TANH, Dl + Fl, cf)) ||
            (s = lin1s(&b->out, ck, NM("proj_out"), Sl, 5 * D, D, dt, DL_F32, DL_ACT_NONE, 0, r1)))
            goto fail;
#undef NM
    }
    /* RoPE tables of the local rows: text ids are zeros, image ids (0, row, col) */
    const int64_t S = m->S, hd = m->Dh / 2;
    m->rope_cos = malloc((size_t)(S * hd) * sizeof(float));
    m->rope_sin = malloc((size_t)(S * hd) * sizeof(float));
    float *ids = calloc((size_t)(S * 3), sizeof(float));
    if (!m->rope_cos || !m->rope_sin || !ids) {
        free(ids);
        s = dl_fail(DL_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (int64_t r = 0; r < grid_h; r++)
        for (int64_t c = 0; c < grid_w; c++) {
            ids[(T + r * grid_w + c) * 3 + 1] = (float)r;
            ids[(T + r * grid_w + c) * 3 + 2] = (float)c;
        }
    dl_rope_table_axes(ids, S, 3, axes_dim, 10000.0, m->rope_cos, m->rope_sin);
    free(ids);
    if (m->n0) { /* image rows [n0, n0 + Nl) follow the text rows */
        memmove(m->rope_cos + T * hd, m->rope_cos + (T + m->n0) * hd, (size_t)(Nl * hd) * 4);
        memmove(m->rope_sin + T * hd, m->rope_sin + (T + m->n0) * hd, (size_t)(Nl * hd) * 4);
    }
    size_t es = dl_dtype_size(dt);
    int64_t vmax = 256 > m->Pd ? 256 : m->Pd;
    if (D > vmax) vmax = D;
    act_plan pl = {0};
    dl_plan_add(&pl, &m->x, (size_t)(m->xn * D) * 4, 0, 2);
    dl_plan_add(&pl, &m->o, (size_t)(Sl * D) * 4, 0, 2);
    dl_plan_add(&pl, &m->h, (size_t)(Sl * D) * es, 1, 2);
    dl_plan_add(&pl, &m->qkv, (size_t)(Sl * 3 * Dl) * es, 1, 1);
    dl_plan_add(&pl, &m->att, (size_t)(Sl * (Dl + Fl)) * es, 1, 1);
    dl_plan_add(&pl, &m->f, (size_t)(Sl * Fl) * es, 1, 1);
    dl_plan_add(&pl, &m->in_lat, (size_t)(Nl * m->Cin) * es, 0, 0);
    dl_plan_add(&pl, &m->in_txt, (size_t)(T * m->Jd) * es, 0, 0);
    dl_plan_add(&pl, &m->temb, (size_t)D * 4, 0, 2);
    dl_plan_add(&pl, &m->mod_img, (size_t)(6 * D) * 4, 0, 2);
    dl_plan_add(&pl, &m->mod_txt, (size_t)(6 * D) * 4, 1, 1);
    dl_plan_add(&pl, &m->tproj, 256 * 4, 0, 0);
    dl_plan_add(&pl, &m->vec_in, (size_t)vmax * es, 0, 2);
    dl_plan_add(&pl, &m->vec_h, (size_t)vmax * es, 0, 0);
    dl_plan_attn_scratch(&pl, &m->scratch, dt, S, m->H, m->Dh, 0, 1, 1); /* keys: at most all S rows */
    if ((s = dl_plan_commit(&pl, ck, &m->arena)) != DL_OK || (s = alloc_split(m)) != DL_OK) goto fail;
    dl_ws_close(ck);
    *out = m;
    return DL_OK;
fail:
    dl_ws_close(ck);
    dl_flux_free(m);
    return s;
}

/* diffusers' get_timestep_embedding(t, 256, flip_sin_to_cos=True, shift 0), in f32 */
static void timestep_proj(float t, float *out) {
    const int half = 128;
    for (int i = 0; i < half; i++) {
        float e = expf(-logf(10000.f) * (float)i / (float)half);
        float a = t * e;
        out[i] = cosf(a);
        out[half + i] = sinf(a);
    }
}

/* temb += linear_2(silu(linear_1(v))) for a one-row input v (f32) */
static dl_status embed(dl_flux *m, lin *l1, lin *l2, const float *v, int64_t n, float *acc) {
    dl_status s;
    dl_convert_t(m->dt, m->vec_in, DL_F32, v, n, 0, 1); /* one row: cheaper than waking the pool */
    if ((s = lin_run(l1, m->vec_in, m->vec_h)) || (s = lin_run(l2, m->vec_h, m->o))) return s;
    for (int64_t i = 0; i < m->D; i++) acc[i] += m->o[i];
    return DL_OK;
}

/* h[a, b) = LN(x[a, b)) * (1 + scale) + shift, f32 -> dt (local rows held in x) */
static void ln_rows(dl_flux *m, int64_t a, int64_t b, const float *scale, const float *shift) {
    if (b <= a || !scale) return;
    size_t es = dl_dtype_size(m->dt);
    float *x = m->x + (a - m->xa) * m->D;
    void *h = (char *)m->h + (size_t)(a * m->D) * es;
    DL_PAR(dl_layernorm_x_t(m->dt, h, DL_F32, x, b - a, m->D, NULL, NULL, scale, shift, 1e-6f, ith, nth));
}

/* ln_rows over the rows this rank holds: text rows modulated by (st, ht), image
 * rows by (si, hi); a NULL scale skips those rows */
static void ln_mod(dl_flux *m, const float *st, const float *ht, const float *si, const float *hi) {
    const int64_t a = m->xa, b = m->xa + m->xn, T = m->T;
    ln_rows(m, a, b < T ? b : T, st, ht);
    ln_rows(m, a > T ? a : T, b, si, hi);
}

/* x[a, b) += gate * upd[a, b) (upd indexed as x) */
static void gate_rows(dl_flux *m, int64_t a, int64_t b, const float *upd, const float *gate) {
    if (b <= a) return;
    float *x = m->x + (a - m->xa) * m->D;
    const float *o = upd + (a - m->xa) * m->D;
    DL_PAR(dl_gated_residual_t(DL_F32, x, o, b - a, m->D, gate, ith, nth));
}

static int sp_on(const dl_flux *m) { return m->sp.sp && m->sp.tp > 1; }

/* the residual update of the rows held: text rows gated by gt, image rows by gi */
static void gate_add(dl_flux *m, const float *gt, const float *gi) {
    const int64_t a = m->xa, b = m->xa + m->xn, T = m->T;
    const float *upd = sp_on(m) ? m->o_sh : m->o;
    gate_rows(m, a, b < T ? b : T, upd, gt);
    gate_rows(m, a > T ? a : T, b, upd, gi);
}

/* after row-parallel layers: the partial sums in o become the whole update
 * (all-reduce; with SP, reduce-scatter to the rows held) */
static dl_status reduce_out(dl_flux *m) {
    if (m->sp.tp == 1) return DL_OK;
    if (!sp_on(m)) return dl_comm_allreduce_sum(m->sp.tp_comm, m->o, (size_t)(m->Sl * m->D));
    for (int j = 0; j < m->sp.tp; j++) m->cnt[j] = (size_t)(m->tsn[j] * m->D);
    return dl_comm_reduce_scatter_sum(m->sp.tp_comm, m->o, m->o_sh, m->cnt);
}

/* before column-parallel layers (SP): every rank's normalised rows into h */
static dl_status gather_h(dl_flux *m) {
    if (!sp_on(m)) return DL_OK;
    size_t row = (size_t)m->D * dl_dtype_size(m->dt);
    for (int j = 0; j < m->sp.tp; j++) {
        m->cnt[j] = (size_t)m->tsn[j] * row;
        m->dsp[j] = (size_t)m->ts0[j] * row;
    }
    return dl_comm_allgatherv(m->sp.tp_comm, (char *)m->h + m->dsp[m->sp.tp_rank], m->h, m->cnt, m->dsp);
}

/* QK RMSNorm (per stream weights over its rows) and RoPE on q and k of the local rows */
static void qk_norm_rope(dl_flux *m, const float *nq_t, const float *nk_t, const float *nq_i, const float *nk_i) {
    const int64_t Dl = m->Dl, T = m->T, Nl = m->Nl, Sl = m->Sl, Hl = m->Hl;
    size_t es = dl_dtype_size(m->dt);
    char *q = m->qkv, *k = (char *)m->qkv + (size_t)Dl * es;
    char *qi = q + (size_t)(T * 3 * Dl) * es, *ki = k + (size_t)(T * 3 * Dl) * es;
    DL_PAR({
        dl_rmsnorm_heads_t(m->dt, q, T, 3 * Dl, Hl, m->Dh, nq_t, 1e-6f, ith, nth);
        dl_rmsnorm_heads_t(m->dt, k, T, 3 * Dl, Hl, m->Dh, nk_t, 1e-6f, ith, nth);
        dl_rmsnorm_heads_t(m->dt, qi, Nl, 3 * Dl, Hl, m->Dh, nq_i, 1e-6f, ith, nth);
        dl_rmsnorm_heads_t(m->dt, ki, Nl, 3 * Dl, Hl, m->Dh, nk_i, 1e-6f, ith, nth);
    });
    DL_PAR({
        dl_rope_t(DL_ROPE_PAIRS, m->dt, q, Sl, Hl, m->Dh, 3 * Dl, m->rope_cos, m->rope_sin, ith, nth);
        dl_rope_t(DL_ROPE_PAIRS, m->dt, k, Sl, Hl, m->Dh, 3 * Dl, m->rope_cos, m->rope_sin, ith, nth);
    });
}

/* partial result i: o [rows x heads, Dh], m and l [heads, rows] */
static dl_attn_partial part_at(dl_flux *m, int i, float **o, float **mx, float **l) {
    float *base = m->part + (size_t)i * (size_t)(m->part_rows * (m->Dh + 2));
    *o = base;
    *mx = base + m->part_rows * m->Dh;
    *l = *mx + m->part_rows;
    return (dl_attn_partial){*o, *mx, *l};
}

/* One attention call on the pool: normalised into a->out, or as partial i. */
static void attn_call(dl_flux *m, dl_attn_args *a, int part, dl_attn_partial *parts) {
    if (part >= 0) parts[part] = part_at(m, part, &a->o_part, &a->m, &a->l);
    DL_PAR(dl_attn_t(a, m->scratch, ith, nth));
}

/* softmax attention of sq query rows over the keys in (k, v): T text rows (valid
 * [0, L)) then nk image rows. One call when every text key is valid; otherwise
 * the text keys and the image keys are two partials, merged (padding is never
 * attended, whatever it holds). */
static void joint_attn(dl_flux *m, int64_t heads, const void *q, int64_t qs, int64_t sq, const void *k, const void *v,
                       int64_t kvs, int64_t nk, void *out, int64_t os) {
    const size_t es = dl_dtype_size(m->dt);
    dl_attn_args a = {.dt = m->dt, .sq = sq, .sk = m->T + nk, .heads = heads, .head_dim = m->Dh, .q = q, .k = k, .v = v,
                      .q_stride = qs, .k_stride = kvs, .v_stride = kvs, .out = out, .out_stride = os, .kv_begin = 0,
                      .kv_end = m->T + nk, .scale = 1.f / sqrtf((float)m->Dh)};
    if (m->L == m->T) {
        attn_call(m, &a, -1, NULL);
        return;
    }
    dl_attn_partial parts[2];
    a.kv_end = m->L;
    attn_call(m, &a, 0, parts);
    a.k = (const char *)k + (size_t)(m->T * kvs) * es;
    a.v = (const char *)v + (size_t)(m->T * kvs) * es;
    a.sk = a.kv_end = nk;
    attn_call(m, &a, 1, parts);
    DL_PAR(dl_attn_merge_t(parts, 2, sq, heads, m->Dh, m->dt, out, os, NULL, NULL, NULL, ith, nth));
}

/* copy `rows` rows of `cols` elements (dtype size es) between strided buffers */
static void copy_rows(void *dst, int64_t dstride, const void *src, int64_t sstride, int64_t rows, int64_t cols, size_t es) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++)
        memcpy((char *)dst + (size_t)(r * dstride) * es, (const char *)src + (size_t)(r * sstride) * es, (size_t)cols * es);
}

/* gather: all-gather every rank's image K and V; local queries attend all keys */
static dl_status attn_gather(dl_flux *m, int64_t os) {
    const size_t es = dl_dtype_size(m->dt);
    const int64_t T = m->T, Dl = m->Dl, Nl = m->Nl, q3 = 3 * Dl;
    char *qkv = m->qkv, *kv = m->cbuf2;
    copy_rows(m->cbuf, 2 * Dl, qkv + (size_t)(T * q3 + Dl) * es, q3, Nl, 2 * Dl, es); /* my image K|V */
    copy_rows(kv, 2 * Dl, qkv + (size_t)Dl * es, q3, T, 2 * Dl, es);                 /* text K|V */
    const size_t row = (size_t)(2 * Dl) * es;
    for (int j = 0; j < m->sp.cp; j++) {
        m->cnt[j] = (size_t)m->cnn[j] * row;
        m->dsp[j] = (size_t)(T + m->cn0[j]) * row;
    }
    dl_status s = dl_comm_allgatherv(m->sp.cp_comm, m->cbuf, kv, m->cnt, m->dsp);
    if (s) return s;
    joint_attn(m, m->Hl, qkv, q3, m->Sl, kv, kv + (size_t)Dl * es, 2 * Dl, m->N, m->att, os);
    return DL_OK;
}

/* ring: queries stay; the text keys are one partial [0, L); the image K/V shards
 * travel round the ring, one partial each; all merged by row max and sum of exps */
static dl_status attn_ring(dl_flux *m, int64_t os) {
    const size_t es = dl_dtype_size(m->dt);
    const int64_t T = m->T, Dl = m->Dl, q3 = 3 * Dl, Sl = m->Sl;
    const int cp = m->sp.cp, r = m->sp.cp_rank;
    char *qkv = m->qkv, *cur = m->cbuf, *nxt = m->cbuf2;
    dl_attn_partial parts[65];
    if (cp > 64) return dl_fail(DL_ERR_UNSUPPORTED, "ring attention over more than 64 ranks");
    dl_attn_args a = {.dt = m->dt, .sq = Sl, .sk = T, .heads = m->Hl, .head_dim = m->Dh, .q = qkv,
                      .k = qkv + (size_t)Dl * es, .v = qkv + (size_t)(2 * Dl) * es, .q_stride = q3, .k_stride = q3,
                      .v_stride = q3, .kv_begin = 0, .kv_end = m->L, .scale = 1.f / sqrtf((float)m->Dh)};
    attn_call(m, &a, 0, parts);
    copy_rows(cur, 2 * Dl, qkv + (size_t)(T * q3 + Dl) * es, q3, m->Nl, 2 * Dl, es);
    for (int step = 0; step < cp; step++) {
        int src = ((r - step) % cp + cp) % cp; /* whose shard is held now */
        if (step + 1 < cp) { /* pass it on; the next one comes from the left */
            int nsrc = ((src - 1) % cp + cp) % cp;
            dl_status s = dl_comm_sendrecv(m->sp.cp_comm, cur, (size_t)(m->cnn[src] * 2 * Dl) * es, (r + 1) % cp, nxt,
                                           (size_t)(m->cnn[nsrc] * 2 * Dl) * es, (r - 1 + cp) % cp);
            if (s) return s;
        }
        a.k = cur;
        a.v = cur + (size_t)Dl * es;
        a.k_stride = a.v_stride = 2 * Dl;
        a.sk = a.kv_end = m->cnn[src];
        attn_call(m, &a, step + 1, parts);
        char *t = cur;
        cur = nxt, nxt = t;
    }
    DL_PAR(dl_attn_merge_t(parts, cp + 1, Sl, m->Hl, m->Dh, m->dt, m->att, os, NULL, NULL, NULL, ith, nth));
    return DL_OK;
}

/* Ulysses: all-to-all trades sequence shards for head shards (every rank: all image
 * rows of Hc = Hl / cp heads; its text head slice taken locally, so each text key
 * enters the softmax once); the inverse all-to-all and an all-gather of the text
 * rows restore the [local rows, Dl] layout */
static dl_status attn_ulysses(dl_flux *m, int64_t os) {
    const size_t es = dl_dtype_size(m->dt);
    const int cp = m->sp.cp, r = m->sp.cp_rank;
    const int64_t T = m->T, N = m->N, Nl = m->Nl, Dl = m->Dl, q3 = 3 * Dl, Hc = m->Hl / cp, Dc = Hc * m->Dh;
    char *qkv = m->qkv, *snd = m->cbuf, *U = m->cbuf2, *Uo = m->cbuf3;
    char *R = Uo + (size_t)((T + N) * Dc) * es, *TX = R + (size_t)(Nl * Dl) * es;
    const char *img = qkv + (size_t)(T * q3) * es;
    for (int j = 0; j < cp; j++) /* destination j: q, k, v of its heads, [Nl, 3Dc] */
        for (int c = 0; c < 3; c++)
            copy_rows(snd + (size_t)(j * Nl * 3 * Dc + c * Dc) * es, 3 * Dc, img + (size_t)(c * Dl + j * Dc) * es, q3, Nl,
                      Dc, es);
    for (int j = 0; j < cp; j++) {
        m->cnt[j] = (size_t)(Nl * 3 * Dc) * es;
        m->dsp[j] = (size_t)(j * Nl * 3 * Dc) * es;
        m->cnt2[j] = (size_t)(m->cnn[j] * 3 * Dc) * es;
        m->dsp2[j] = (size_t)((T + m->cn0[j]) * 3 * Dc) * es;
    }
    dl_status s = dl_comm_alltoallv(m->sp.cp_comm, snd, m->cnt, m->dsp, U, m->cnt2, m->dsp2);
    if (s) return s;
    for (int c = 0; c < 3; c++) /* my text head slice */
        copy_rows(U + (size_t)(c * Dc) * es, 3 * Dc, qkv + (size_t)(c * Dl + r * Dc) * es, q3, T, Dc, es);
    joint_attn(m, Hc, U, 3 * Dc, T + N, U + (size_t)Dc * es, U + (size_t)(2 * Dc) * es, 3 * Dc, N, Uo, Dc);
    /* inverse: my heads of rank j's rows back to j */
    for (int j = 0; j < cp; j++) {
        m->cnt[j] = (size_t)(m->cnn[j] * Dc) * es;
        m->dsp[j] = (size_t)((T + m->cn0[j]) * Dc) * es;
        m->cnt2[j] = (size_t)(Nl * Dc) * es;
        m->dsp2[j] = (size_t)(j * Nl * Dc) * es;
    }
    if ((s = dl_comm_alltoallv(m->sp.cp_comm, Uo, m->cnt, m->dsp, R, m->cnt2, m->dsp2))) return s;
    if ((s = dl_comm_allgather(m->sp.cp_comm, Uo, (size_t)(T * Dc) * es, TX))) return s;
    for (int j = 0; j < cp; j++) {
        copy_rows((char *)m->att + (size_t)(T * os + j * Dc) * es, os, R + (size_t)(j * Nl * Dc) * es, Dc, Nl, Dc, es);
        copy_rows((char *)m->att + (size_t)(j * Dc) * es, os, TX + (size_t)(j * T * Dc) * es, Dc, T, Dc, es);
    }
    return DL_OK;
}

/* joint attention of the local rows into att (row stride os), by the split's mode */
static dl_status attention(dl_flux *m, int64_t os) {
    if (m->sp.cp > 1 && m->sp.cp_mode == DL_CP_ULYSSES) return attn_ulysses(m, os);
    if (m->sp.cp > 1 && m->sp.cp_mode == DL_CP_RING) return attn_ring(m, os);
    if (m->sp.cp > 1) return attn_gather(m, os);
    const size_t es = dl_dtype_size(m->dt);
    const int64_t Dl = m->Dl;
    char *q = m->qkv;
    joint_attn(m, m->Hl, q, 3 * Dl, m->Sl, q + (size_t)Dl * es, q + (size_t)(2 * Dl) * es, 3 * Dl, m->Nl, m->att, os);
    return DL_OK;
}

static dl_status conditioning(dl_flux *m, const float *pooled, float timestep, float guidance);

#define RUN(l, x, y)                                   \
    do {                                               \
        if ((s = lin_run((l), (x), (y))) != DL_OK) return s; \
    } while (0)
#define TRY(e)                          \
    do {                                \
        if ((s = (e)) != DL_OK) return s; \
    } while (0)

dl_status dl_flux_run(dl_flux *m, const float *latents, const float *txt, const float *pooled, float timestep,
                      float guidance, float *out, float *block_out) {
    const int64_t D = m->D, T = m->T, S = m->S, Dl = m->Dl, Fl = m->Fl;
    const size_t es = dl_dtype_size(m->dt);
    dl_status s;
    if (!isfinite(timestep) || (m->guidance && !isfinite(guidance)))
        return dl_fail(DL_ERR_INVALID, "FLUX transformer: timestep or guidance is not finite");
    if (block_out && (m->sp.tp > 1 || m->sp.cp > 1))
        return dl_fail(DL_ERR_UNSUPPORTED, "FLUX transformer: per-block outputs are only kept by an unsplit model");
    /* conditioning vector; silu(temb) is the input of every modulation linear */
    TRY(conditioning(m, pooled, timestep, guidance));
    /* embed inputs: text rows then this rank's image rows (with SP, into o, then the shard) */
    to_dt(m->dt, m->in_txt, txt, T * m->Jd);
    to_dt(m->dt, m->in_lat, latents + m->n0 * m->Cin, m->Nl * m->Cin);
    float *emb = sp_on(m) ? m->o : m->x;
    RUN(&m->ctx, m->in_txt, emb);
    RUN(&m->xemb, m->in_lat, emb + T * D);
    if (sp_on(m)) memcpy(m->x, m->o + m->xa * D, (size_t)(m->xn * D) * 4);
    char *h_img = (char *)m->h + (size_t)(T * D) * es, *qkv_img = (char *)m->qkv + (size_t)(T * 3 * Dl) * es;
    char *att_img = (char *)m->att + (size_t)(T * Dl) * es, *f_img = (char *)m->f + (size_t)(T * Fl) * es;
    int nb = 0;
    for (int i = 0; i < m->nd; i++) {
        flux_double *b = &m->dbl[i];
        RUN(&b->mod_img, m->vec_in, m->mod_img);
        RUN(&b->mod_txt, m->vec_in, m->mod_txt);
        /* chunks: shift1, scale1, gate1, shift2, scale2, gate2 */
        float *mi = m->mod_img, *mt = m->mod_txt;
        ln_mod(m, mt + D, mt, mi + D, mi);
        TRY(gather_h(m));
        RUN(&b->qkv_txt, m->h, m->qkv);
        RUN(&b->qkv_img, h_img, qkv_img);
        qk_norm_rope(m, b->nq_txt, b->nk_txt, b->nq_img, b->nk_img);
        TRY(attention(m, Dl));
        RUN(&b->out_txt, m->att, m->o);
        RUN(&b->out_img, att_img, m->o + T * D);
        TRY(reduce_out(m));
        gate_add(m, mt + 2 * D, mi + 2 * D);
        ln_mod(m, mt + 4 * D, mt + 3 * D, mi + 4 * D, mi + 3 * D);
        TRY(gather_h(m));
        RUN(&b->ff1_txt, m->h, m->f);
        RUN(&b->ff1_img, h_img, f_img);
        RUN(&b->ff2_txt, m->f, m->o);
        RUN(&b->ff2_img, f_img, m->o + T * D);
        TRY(reduce_out(m));
        gate_add(m, mt + 5 * D, mi + 5 * D);
        if (block_out) memcpy(block_out + (size_t)(nb++) * (size_t)(S * D), m->x, (size_t)(S * D) * 4);
    }
    for (int i = 0; i < m->ns; i++) {
        flux_single *b = &m->sgl[i];
        float *mo = m->mod_img;
        RUN(&b->mod, m->vec_in, mo); /* shift, scale, gate */
        ln_mod(m, mo + D, mo, mo + D, mo);
        TRY(gather_h(m));
        RUN(&b->qkv, m->h, m->qkv);
        RUN(&b->mlp, m->h, (char *)m->att + (size_t)Dl * es); /* columns [Dl, Dl + Fl) */
        qk_norm_rope(m, b->nq, b->nk, b->nq, b->nk);
        TRY(attention(m, Dl + Fl)); /* columns [0, Dl) */
        RUN(&b->out, m->att, m->o);
        TRY(reduce_out(m));
        gate_add(m, mo + 2 * D, mo + 2 * D);
        if (block_out) memcpy(block_out + (size_t)(nb++) * (size_t)(S * D), m->x, (size_t)(S * D) * 4);
    }
    RUN(&m->norm_out, m->vec_in, m->mod_img); /* scale, shift */
    ln_mod(m, NULL, NULL, m->mod_img, m->mod_img + D);
    TRY(gather_h(m));
    float *mine = out + m->n0 * m->Cout;
    RUN(&m->proj_out, h_img, mine);
    if (m->sp.cp > 1) { /* every rank's image rows */
        for (int j = 0; j < m->sp.cp; j++) {
            m->cnt[j] = (size_t)(m->cnn[j] * m->Cout) * 4;
            m->dsp[j] = (size_t)(m->cn0[j] * m->Cout) * 4;
        }
        TRY(dl_comm_allgatherv(m->sp.cp_comm, mine, out, m->cnt, m->dsp));
    }
    return DL_OK;
}

/* the conditioning vector temb and silu(temb) in vec_in, for a timestep */
static dl_status conditioning(dl_flux *m, const float *pooled, float timestep, float guidance) {
    const int64_t D = m->D;
    dl_status s;
    memset(m->temb, 0, (size_t)D * 4);
    timestep_proj(timestep * 1000.f, m->tproj);
    if ((s = embed(m, &m->t1, &m->t2, m->tproj, 256, m->temb))) return s;
    if (m->guidance) {
        timestep_proj(guidance * 1000.f, m->tproj);
        if ((s = embed(m, &m->g1, &m->g2, m->tproj, 256, m->temb))) return s;
    }
    if ((s = embed(m, &m->p1, &m->p2, pooled, m->Pd, m->temb))) return s;
    for (int64_t i = 0; i < D; i++) m->o[i] = m->temb[i] / (1.f + expf(-m->temb[i]));
    dl_convert_t(m->dt, m->vec_in, DL_F32, m->o, D, 0, 1);
    return DL_OK;
}

void dl_flux_probe_reset(dl_flux *m) { m->probe_have[0] = m->probe_have[1] = 0; }

size_t dl_flux_probe_bytes(const dl_flux *m) {
    return m->probe_cur ? 3 * (size_t)(m->Nl * m->D) * sizeof(float) : 0;
}

dl_status dl_flux_probe(dl_flux *m, int slot, const float *latents, const float *pooled, float timestep,
                        float guidance, double *score) {
    const int64_t D = m->D, Nl = m->Nl, T = m->T;
    dl_status s;
    *score = 0;
    if (slot < 0 || slot > 1 || m->nd < 1) return dl_fail(DL_ERR_UNSUPPORTED, "probe: needs a double block and slot 0 or 1");
    if (!m->probe_cur) { /* once per model: the probe's own persistent buffers */
        for (int i = 0; i < 2; i++) m->probe_prev[i] = dl_aligned_alloc((size_t)(Nl * D) * 4);
        m->probe_cur = dl_aligned_alloc((size_t)(Nl * D) * 4);
        if (!m->probe_prev[0] || !m->probe_prev[1] || !m->probe_cur) return dl_fail(DL_ERR_NOMEM, "probe: out of memory");
    }
    if ((s = conditioning(m, pooled, timestep, guidance))) return s;
    to_dt(m->dt, m->in_lat, latents + m->n0 * m->Cin, Nl * m->Cin);
    float *x = m->o + T * D; /* o holds every local row, whatever x holds */
    RUN(&m->xemb, m->in_lat, x);
    RUN(&m->dbl[0].mod_img, m->vec_in, m->mod_img); /* shift1, scale1, ... */
    float *cur = m->probe_cur, *sc = m->mod_img + D, *sh = m->mod_img;
    DL_PAR(dl_layernorm_x_t(DL_F32, cur, DL_F32, x, Nl, D, NULL, NULL, sc, sh, 1e-6f, ith, nth));
    if (m->probe_have[slot]) {
        double sums[2 * 64] = {0}, num = 0, den = 0;
        const float *prev = m->probe_prev[slot];
        const int64_t n = Nl * D;
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
        if (m->sp.cp > 1) { /* every rank's sums, added in rank order: the same score everywhere */
            if (m->sp.cp > 64) return dl_fail(DL_ERR_UNSUPPORTED, "probe over more than 64 cp ranks");
            double mine[2] = {num, den};
            if ((s = dl_comm_allgather(m->sp.cp_comm, mine, sizeof mine, sums))) return s;
            num = den = 0;
            for (int j = 0; j < m->sp.cp; j++) num += sums[2 * j], den += sums[2 * j + 1];
        }
        *score = den > 0 ? num / den : 0;
    }
    memcpy(m->probe_prev[slot], cur, (size_t)(Nl * D) * 4);
    m->probe_have[slot] = 1;
    return DL_OK;
}
