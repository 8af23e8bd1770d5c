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
 *   out = proj_out(LN(x_img)(1 + scale) + shift), (scale, shift) = norm_out.linear(...) */
#include <cjson/cJSON.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

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
    for (size_t i = 0; i < sizeof ls / sizeof ls[0]; i++) lin_free(ls[i]);
    for (int i = 0; m->dbl && i < m->nd; i++) {
        flux_double *b = &m->dbl[i];
        lin *bl[] = {&b->mod_img, &b->mod_txt, &b->qkv_img, &b->qkv_txt, &b->out_img, &b->out_txt,
                     &b->ff1_img, &b->ff2_img, &b->ff1_txt, &b->ff2_txt};
        for (size_t k = 0; k < sizeof bl / sizeof bl[0]; k++) lin_free(bl[k]);
        free(b->nq_img), free(b->nk_img), free(b->nq_txt), free(b->nk_txt);
    }
    for (int i = 0; m->sgl && i < m->ns; i++) {
        flux_single *b = &m->sgl[i];
        lin_free(&b->mod), lin_free(&b->qkv), lin_free(&b->mlp), lin_free(&b->out);
        free(b->nq), free(b->nk);
    }
    free(m->dbl), free(m->sgl), free(m->rope_cos), free(m->rope_sin);
    void *bufs[] = {m->arena, m->probe_prev[0], m->probe_prev[1], m->probe_cur};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) dl_aligned_free(bufs[i]);
    free(m);
}

/* one linear with bias, named `<base>.weight` / `<base>.bias`, output rows ldy apart */
static dl_status lin1_ld(lin *l, dl_wsrc *ck, const char *base, int64_t m, int64_t k, int64_t n, dl_dtype dt,
                         dl_dtype dst, dl_act act, int64_t ldy) {
    char w[256], b[256];
    snprintf(w, sizeof w, "%s.weight", base);
    snprintf(b, sizeof b, "%s.bias", base);
    const char *wn[1] = {w}, *bn[1] = {b};
    return lin_load_ld(l, ck, wn, bn, 1, &n, m, k, dt, dst, act, ldy);
}

static dl_status lin1(lin *l, dl_wsrc *ck, const char *base, int64_t m, int64_t k, int64_t n, dl_dtype dt,
                      dl_dtype dst, dl_act act) {
    return lin1_ld(l, ck, base, m, k, n, dt, dst, act, 0);
}

static dl_status lin3(lin *l, dl_wsrc *ck, const char *p, const char *a, const char *b, const char *c,
                      int64_t m, int64_t D, dl_dtype dt) {
    char w[3][256], bb[3][256];
    const char *names[3] = {a, b, c};
    for (int i = 0; i < 3; i++) {
        snprintf(w[i], sizeof w[i], "%s%s.weight", p, names[i]);
        snprintf(bb[i], sizeof bb[i], "%s%s.bias", p, names[i]);
    }
    const char *wn[3] = {w[0], w[1], w[2]}, *bn[3] = {bb[0], bb[1], bb[2]};
    int64_t parts[3] = {D, D, D};
    return lin_load(l, ck, wn, bn, 3, parts, m, D, dt, dt, DL_ACT_NONE);
}

static dl_status vecp(dl_wsrc *ck, const char *name, int64_t n, float **out) {
    int64_t shape[1] = {n};
    return param_f32(ck, name, 1, shape, out);
}

dl_status dl_flux_load(dl_flux **out, dl_model_dir *dir, const char *component, int64_t grid_h, int64_t grid_w,
                       int64_t txt_len, dl_dtype dt, dl_wsrc *src) {
    *out = NULL;
    char file[512], p[128], nm[256];
    snprintf(file, sizeof file, "%s/config.json", component);
    const cJSON *cfg;
    dl_status s = dl_model_dir_config(dir, component, &cfg);
    if (s != DL_OK) return s;
    dl_flux *m = calloc(1, sizeof *m);
    if (!m) return dl_fail(DL_ERR_NOMEM, "out of memory");
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
    m->T = txt_len;
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
    if ((s = ws_open(&ck, src, dir, component)) != DL_OK) goto fail;
    const int64_t D = m->D, T = m->T, N = m->N, S = m->S, F = m->F;
    /* embedders: one-row matmuls */
    if ((s = lin1(&m->t1, ck, "time_text_embed.timestep_embedder.linear_1", 1, 256, D, dt, dt, DL_ACT_SILU)) ||
        (s = lin1(&m->t2, ck, "time_text_embed.timestep_embedder.linear_2", 1, D, D, dt, DL_F32, DL_ACT_NONE)) ||
        (s = lin1(&m->p1, ck, "time_text_embed.text_embedder.linear_1", 1, m->Pd, D, dt, dt, DL_ACT_SILU)) ||
        (s = lin1(&m->p2, ck, "time_text_embed.text_embedder.linear_2", 1, D, D, dt, DL_F32, DL_ACT_NONE)) ||
        (guid && ((s = lin1(&m->g1, ck, "time_text_embed.guidance_embedder.linear_1", 1, 256, D, dt, dt, DL_ACT_SILU)) ||
                  (s = lin1(&m->g2, ck, "time_text_embed.guidance_embedder.linear_2", 1, D, D, dt, DL_F32, DL_ACT_NONE)))) ||
        (s = lin1(&m->ctx, ck, "context_embedder", T, m->Jd, D, dt, DL_F32, DL_ACT_NONE)) ||
        (s = lin1(&m->xemb, ck, "x_embedder", N, m->Cin, D, dt, DL_F32, DL_ACT_NONE)) ||
        (s = lin1(&m->norm_out, ck, "norm_out.linear", 1, D, 2 * D, dt, DL_F32, DL_ACT_NONE)) ||
        (s = lin1(&m->proj_out, ck, "proj_out", N, D, m->Cout, dt, DL_F32, DL_ACT_NONE)))
        goto fail;
    if (!guid && ws_find(ck, "time_text_embed.guidance_embedder.linear_1.weight")) {
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
            (s = lin3(&b->qkv_img, ck, p, "attn.to_q", "attn.to_k", "attn.to_v", N, D, dt)) ||
            (s = lin3(&b->qkv_txt, ck, p, "attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj", T, D, dt)) ||
            (s = vecp(ck, NM("attn.norm_q.weight"), m->Dh, &b->nq_img)) ||
            (s = vecp(ck, NM("attn.norm_k.weight"), m->Dh, &b->nk_img)) ||
            (s = vecp(ck, NM("attn.norm_added_q.weight"), m->Dh, &b->nq_txt)) ||
            (s = vecp(ck, NM("attn.norm_added_k.weight"), m->Dh, &b->nk_txt)) ||
            (s = lin1(&b->out_img, ck, NM("attn.to_out.0"), N, D, D, dt, DL_F32, DL_ACT_NONE)) ||
            (s = lin1(&b->out_txt, ck, NM("attn.to_add_out"), T, D, D, dt, DL_F32, DL_ACT_NONE)) ||
            (s = lin1(&b->ff1_img, ck, NM("ff.net.0.proj"), N, D, F, dt, dt, DL_ACT_GELU_TANH)) ||
            (s = lin1(&b->ff2_img, ck, NM("ff.net.2"), N, F, D, dt, DL_F32, DL_ACT_NONE)) ||
            (s = lin1(&b->ff1_txt, ck, NM("ff_context.net.0.proj"), T, D, F, dt, dt, DL_ACT_GELU_TANH)) ||
            (s = lin1(&b->ff2_txt, ck, NM("ff_context.net.2"), T, F, D, dt, DL_F32, DL_ACT_NONE)))
            goto fail;
    }
    for (int i = 0; i < m->ns; i++) {
        flux_single *b = &m->sgl[i];
        snprintf(p, sizeof p, "single_transformer_blocks.%d.", i);
        if ((s = lin1(&b->mod, ck, NM("norm.linear"), 1, D, 3 * D, dt, DL_F32, DL_ACT_NONE)) ||
            (s = lin3(&b->qkv, ck, p, "attn.to_q", "attn.to_k", "attn.to_v", S, D, dt)) ||
            (s = vecp(ck, NM("attn.norm_q.weight"), m->Dh, &b->nq)) ||
            (s = vecp(ck, NM("attn.norm_k.weight"), m->Dh, &b->nk)))
            goto fail;
        /* proj_mlp writes columns [D, 5D) of the [S, 5D] concat buffer (ldy 5D) that
         * the attention fills at [0, D); proj_out reads all of it */
        if ((s = lin1_ld(&b->mlp, ck, NM("proj_mlp"), S, D, F, dt, dt, DL_ACT_GELU_TANH, 5 * D)) ||
            (s = lin1(&b->out, ck, NM("proj_out"), S, 5 * D, D, dt, DL_F32, DL_ACT_NONE)))
            goto fail;
#undef NM
    }
    /* RoPE tables: text ids are zeros, image ids (0, row, col) */
    m->rope_cos = malloc((size_t)(S * m->Dh / 2) * sizeof(float));
    m->rope_sin = malloc((size_t)(S * m->Dh / 2) * sizeof(float));
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
    size_t es = dl_dtype_size(dt);
    int64_t vmax = 256 > m->Pd ? 256 : m->Pd;
    if (D > vmax) vmax = D;
    act_plan pl = {0};
    plan_add(&pl, &m->x, (size_t)(S * D) * 4, 0, 2);
    plan_add(&pl, &m->o, (size_t)(S * D) * 4, 0, 2);
    plan_add(&pl, &m->h, (size_t)(S * D) * es, 1, 2);
    plan_add(&pl, &m->qkv, (size_t)(S * 3 * D) * es, 1, 1);
    plan_add(&pl, &m->att, (size_t)(S * 5 * D) * es, 1, 1);
    plan_add(&pl, &m->f, (size_t)(S * F) * es, 1, 1);
    plan_add(&pl, &m->in_lat, (size_t)(N * m->Cin) * es, 0, 0);
    plan_add(&pl, &m->in_txt, (size_t)(T * m->Jd) * es, 0, 0);
    plan_add(&pl, &m->temb, (size_t)D * 4, 0, 2);
    plan_add(&pl, &m->mod_img, (size_t)(6 * D) * 4, 0, 2);
    plan_add(&pl, &m->mod_txt, (size_t)(6 * D) * 4, 1, 1);
    plan_add(&pl, &m->tproj, 256 * 4, 0, 0);
    plan_add(&pl, &m->vec_in, (size_t)vmax * es, 0, 2);
    plan_add(&pl, &m->vec_h, (size_t)vmax * es, 0, 0);
    plan_attn_scratch(&pl, &m->scratch, dt, S, m->H, m->Dh, 0, 1, 1);
    if ((s = plan_commit(&pl, ck, &m->arena)) != DL_OK) goto fail;
    ws_close(ck);
    *out = m;
    return DL_OK;
fail:
    ws_close(ck);
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
    to_dt(m->dt, m->vec_in, v, n);
    if ((s = lin_run(l1, m->vec_in, m->vec_h)) || (s = lin_run(l2, m->vec_h, m->o))) return s;
    for (int64_t i = 0; i < m->D; i++) acc[i] += m->o[i];
    return DL_OK;
}

/* h[rows] = LN(x[rows]) * (1 + scale) + shift, f32 -> dt */
static void ln_mod(dl_flux *m, int64_t r0, int64_t rows, const float *scale, const float *shift) {
    size_t es = dl_dtype_size(m->dt);
    float *x = m->x + r0 * m->D;
    void *h = (char *)m->h + (size_t)(r0 * m->D) * es;
    DL_PAR(dl_layernorm_x_t(m->dt, h, DL_F32, x, rows, m->D, NULL, NULL, scale, shift, 1e-6f, ith, nth));
}

/* x[rows] += gate * o[rows] */
static void gate_add(dl_flux *m, int64_t r0, int64_t rows, const float *gate) {
    float *x = m->x + r0 * m->D, *o = m->o + r0 * m->D;
    DL_PAR(dl_gated_residual_t(DL_F32, x, o, rows, m->D, gate, ith, nth));
}

/* QK RMSNorm (per stream weights over its rows) and RoPE on q and k of all rows */
static void qk_norm_rope(dl_flux *m, const float *nq_t, const float *nk_t, const float *nq_i, const float *nk_i) {
    const int64_t D = m->D, T = m->T, N = m->N, S = m->S;
    size_t es = dl_dtype_size(m->dt);
    char *q = m->qkv, *k = (char *)m->qkv + (size_t)D * es;
    char *qi = q + (size_t)(T * 3 * D) * es, *ki = k + (size_t)(T * 3 * D) * es;
    DL_PAR({
        dl_rmsnorm_heads_t(m->dt, q, T, 3 * D, m->H, m->Dh, nq_t, 1e-6f, ith, nth);
        dl_rmsnorm_heads_t(m->dt, k, T, 3 * D, m->H, m->Dh, nk_t, 1e-6f, ith, nth);
        dl_rmsnorm_heads_t(m->dt, qi, N, 3 * D, m->H, m->Dh, nq_i, 1e-6f, ith, nth);
        dl_rmsnorm_heads_t(m->dt, ki, N, 3 * D, m->H, m->Dh, nk_i, 1e-6f, ith, nth);
    });
    DL_PAR({
        dl_rope_t(DL_ROPE_PAIRS, m->dt, q, S, m->H, m->Dh, 3 * D, m->rope_cos, m->rope_sin, ith, nth);
        dl_rope_t(DL_ROPE_PAIRS, m->dt, k, S, m->H, m->Dh, 3 * D, m->rope_cos, m->rope_sin, ith, nth);
    });
}

static void attention(dl_flux *m, int64_t out_stride) {
    const int64_t D = m->D, S = m->S;
    size_t es = dl_dtype_size(m->dt);
    dl_attn_args a = {.dt = m->dt, .sq = S, .sk = S, .heads = m->H, .head_dim = m->Dh, .q = m->qkv,
                      .k = (char *)m->qkv + (size_t)D * es, .v = (char *)m->qkv + (size_t)(2 * D) * es,
                      .q_stride = 3 * D, .k_stride = 3 * D, .v_stride = 3 * D, .out = m->att, .out_stride = out_stride,
                      .kv_begin = 0, .kv_end = S, .scale = 1.f / sqrtf((float)m->Dh)};
    DL_PAR(dl_attn_t(&a, m->scratch, ith, nth));
}

static dl_status conditioning(dl_flux *m, const float *pooled, float timestep, float guidance);

#define RUN(l, x, y)                                   \
    do {                                               \
        if ((s = lin_run((l), (x), (y))) != DL_OK) return s; \
    } while (0)

dl_status dl_flux_run(dl_flux *m, const float *latents, const float *txt, const float *pooled, float timestep,
                      float guidance, float *out, float *block_out) {
    const int64_t D = m->D, T = m->T, N = m->N, S = m->S;
    const size_t es = dl_dtype_size(m->dt);
    dl_status s;
    if (!isfinite(timestep) || (m->guidance && !isfinite(guidance)))
        return dl_fail(DL_ERR_INVALID, "FLUX transformer: timestep or guidance is not finite");
    /* conditioning vector; silu(temb) is the input of every modulation linear */
    if ((s = conditioning(m, pooled, timestep, guidance))) return s;
    /* embed inputs: text rows then image rows of x */
    to_dt(m->dt, m->in_txt, txt, T * m->Jd);
    to_dt(m->dt, m->in_lat, latents, N * m->Cin);
    RUN(&m->ctx, m->in_txt, m->x);
    RUN(&m->xemb, m->in_lat, m->x + T * D);
    char *h_img = (char *)m->h + (size_t)(T * D) * es, *qkv_img = (char *)m->qkv + (size_t)(T * 3 * D) * es;
    char *att_img = (char *)m->att + (size_t)(T * D) * es, *f_img = (char *)m->f + (size_t)(T * m->F) * es;
    int nb = 0;
    for (int i = 0; i < m->nd; i++) {
        flux_double *b = &m->dbl[i];
        RUN(&b->mod_img, m->vec_in, m->mod_img);
        RUN(&b->mod_txt, m->vec_in, m->mod_txt);
        /* chunks: shift1, scale1, gate1, shift2, scale2, gate2 */
        float *mi = m->mod_img, *mt = m->mod_txt;
        ln_mod(m, 0, T, mt + D, mt);
        ln_mod(m, T, N, mi + D, mi);
        RUN(&b->qkv_txt, m->h, m->qkv);
        RUN(&b->qkv_img, h_img, qkv_img);
        qk_norm_rope(m, b->nq_txt, b->nk_txt, b->nq_img, b->nk_img);
        attention(m, D);
        RUN(&b->out_txt, m->att, m->o);
        RUN(&b->out_img, att_img, m->o + T * D);
        gate_add(m, 0, T, mt + 2 * D);
        gate_add(m, T, N, mi + 2 * D);
        ln_mod(m, 0, T, mt + 4 * D, mt + 3 * D);
        ln_mod(m, T, N, mi + 4 * D, mi + 3 * D);
        RUN(&b->ff1_txt, m->h, m->f);
        RUN(&b->ff1_img, h_img, f_img);
        RUN(&b->ff2_txt, m->f, m->o);
        RUN(&b->ff2_img, f_img, m->o + T * D);
        gate_add(m, 0, T, mt + 5 * D);
        gate_add(m, T, N, mi + 5 * D);
        if (block_out) memcpy(block_out + (size_t)(nb++) * (size_t)(S * D), m->x, (size_t)(S * D) * 4);
    }
    for (int i = 0; i < m->ns; i++) {
        flux_single *b = &m->sgl[i];
        RUN(&b->mod, m->vec_in, m->mod_img); /* shift, scale, gate */
        ln_mod(m, 0, S, m->mod_img + D, m->mod_img);
        RUN(&b->qkv, m->h, m->qkv);
        RUN(&b->mlp, m->h, (char *)m->att + (size_t)D * es); /* columns [D, 5D) */
        qk_norm_rope(m, b->nq, b->nk, b->nq, b->nk);
        attention(m, 5 * D); /* columns [0, D) */
        RUN(&b->out, m->att, m->o);
        gate_add(m, 0, S, m->mod_img + 2 * D);
        if (block_out) memcpy(block_out + (size_t)(nb++) * (size_t)(S * D), m->x, (size_t)(S * D) * 4);
    }
    RUN(&m->norm_out, m->vec_in, m->mod_img); /* scale, shift */
    ln_mod(m, T, N, m->mod_img, m->mod_img + D);
    RUN(&m->proj_out, h_img, out);
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
    to_dt(m->dt, m->vec_in, m->o, D);
    return DL_OK;
}

void dl_flux_probe_reset(dl_flux *m) { m->probe_have[0] = m->probe_have[1] = 0; }

size_t dl_flux_probe_bytes(const dl_flux *m) {
    return m->probe_cur ? 3 * (size_t)(m->N * m->D) * sizeof(float) : 0;
}

dl_status dl_flux_probe(dl_flux *m, int slot, const float *latents, const float *pooled, float timestep,
                        float guidance, double *score) {
    const int64_t D = m->D, N = m->N, T = m->T;
    dl_status s;
    *score = 0;
    if (slot < 0 || slot > 1 || m->nd < 1) return dl_fail(DL_ERR_UNSUPPORTED, "probe: needs a double block and slot 0 or 1");
    if (!m->probe_cur) { /* once per model: the probe's own persistent buffers */
        for (int i = 0; i < 2; i++) m->probe_prev[i] = dl_aligned_alloc((size_t)(N * D) * 4);
        m->probe_cur = dl_aligned_alloc((size_t)(N * D) * 4);
        if (!m->probe_prev[0] || !m->probe_prev[1] || !m->probe_cur) return dl_fail(DL_ERR_NOMEM, "probe: out of memory");
    }
    if ((s = conditioning(m, pooled, timestep, guidance))) return s;
    to_dt(m->dt, m->in_lat, latents, N * m->Cin);
    RUN(&m->xemb, m->in_lat, m->x + T * D);
    RUN(&m->dbl[0].mod_img, m->vec_in, m->mod_img); /* shift1, scale1, ... */
    float *cur = m->probe_cur, *x = m->x + T * D, *sc = m->mod_img + D, *sh = m->mod_img;
    DL_PAR(dl_layernorm_x_t(DL_F32, cur, DL_F32, x, N, D, NULL, NULL, sc, sh, 1e-6f, ith, nth));
    if (m->probe_have[slot]) {
        double num = 0, den = 0;
        const float *prev = m->probe_prev[slot];
        for (int64_t i = 0; i < N * D; i++) {
            num += fabs((double)cur[i] - prev[i]);
            den += fabs((double)prev[i]);
        }
        *score = den > 0 ? num / den : 0;
    }
    memcpy(m->probe_prev[slot], cur, (size_t)(N * D) * 4);
    m->probe_have[slot] = 1;
    return DL_OK;
}
