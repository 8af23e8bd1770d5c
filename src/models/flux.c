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
 * The joint stream, its split (TP / SP / CP) and the shared blocks (adaLN
 * modulation, gated residual, QK norm + RoPE, joint attention) are the DiT library's
 * (dl_dit in models_impl.h, dit.c); this file holds FLUX's projections, embedders
 * and the order of its blocks. */
#include <cjson/cJSON.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "difflet/comm.h"
#include "models/models_impl.h"
#include "difflet/flux.h"


struct dl_flux {
    dl_dit c;                       /* the joint stream: sizes, split, shared activations */
    int64_t Cin, Cout, Jd, Pd;      /* latent channels in/out, text widths (T5, CLIP) */
    int nd, ns, guidance;
    dl_dit_cond cond;               /* time / guidance / pooled-text embedders */
    lin ctx, xemb;                  /* context_embedder, x_embedder */
    dl_dit_dual *dbl;                /* the double blocks (the DiT library's dual-stream block) */
    dl_dit_single *sgl;              /* the single blocks (the DiT library's) */
    lin norm_out, proj_out;
    /* activations of FLUX's own (the joint stream's are in c) */
    void *f;                        /* [S, F] dt */
    void *in_lat, *in_txt;          /* inputs in dt */
    float *temb, *mod_img, *mod_txt; /* [D], [6D], [6D] */
    void *vec_in;                   /* [D] dt: silu(temb), every modulation's input */
    void *arena; /* one block holding every activation, planned by lifetime */
    float *probe_prev[2], *probe_cur; /* [N, D] each, allocated on first probe use */
    int probe_have[2];
};

int64_t dl_flux_in_channels(const dl_flux *m) { return m->Cin; }
int64_t dl_flux_out_channels(const dl_flux *m) { return m->Cout; }
int dl_flux_has_guidance(const dl_flux *m) { return m->guidance; }
int64_t dl_flux_width(const dl_flux *m) { return m->c.D; }
int dl_flux_blocks(const dl_flux *m, int *n_single) {
    if (n_single) *n_single = m->ns;
    return m->nd;
}

void dl_flux_free(dl_flux *m) {
    if (!m) return;
    lin *ls[] = {&m->ctx, &m->xemb, &m->norm_out, &m->proj_out};
    for (size_t i = 0; i < sizeof ls / sizeof ls[0]; i++) dl_lin_free(ls[i]);
    for (int i = 0; m->dbl && i < m->nd; i++) dl_dit_dual_free(&m->dbl[i]);
    for (int i = 0; m->sgl && i < m->ns; i++) dl_dit_single_free(&m->sgl[i]);
    dl_dit_cond_free(&m->cond);
    free(m->dbl), free(m->sgl);
    dl_dit_free(&m->c);
    void *bufs[] = {m->arena, m->probe_prev[0], m->probe_prev[1], m->probe_cur};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) dl_aligned_free(bufs[i]);
    free(m);
}

static dl_status lin1(lin *l, dl_wsrc *ck, const char *base, int64_t m, int64_t k, int64_t n, dl_dtype dt,
                      dl_dtype dst, dl_act act) {
    return dl_lin_named(l, ck, base, m, k, n, dt, dst, act, 0, NULL);
}

int64_t dl_flux_heads(const dl_flux *m) { return m->c.H; }
void dl_flux_text_dims(const dl_flux *m, int64_t *joint, int64_t *pooled) {
    *joint = m->Jd;
    *pooled = m->Pd;
}

dl_status dl_flux_set_text_valid(dl_flux *m, int64_t valid) {
    if (valid < 1 || valid > m->c.T)
        return dl_fail(DL_ERR_INVALID, "FLUX transformer: valid text length %lld is outside 1..%lld", (long long)valid,
                       (long long)m->c.T);
    m->c.L = valid;
    return DL_OK;
}

dl_status dl_flux_load(dl_flux **out, dl_model_dir *dir, const char *component, int64_t grid_h, int64_t grid_w,
                       int64_t txt_len, dl_dtype dt, dl_wsrc *src) {
    return dl_flux_load_split(out, dir, component, grid_h, grid_w, txt_len, dt, src, NULL);
}

dl_status dl_flux_load_split(dl_flux **out, dl_model_dir *dir, const char *component, int64_t grid_h, int64_t grid_w,
                             int64_t txt_len, dl_dtype dt, dl_wsrc *src, const dl_dit_split *split) {
    *out = NULL;
    char file[512], p[128];
    snprintf(file, sizeof file, "%s/config.json", component);
    const cJSON *cfg;
    dl_status s = dl_model_dir_config(dir, component, &cfg);
    if (s != DL_OK) return s;
    dl_flux *m = calloc(1, sizeof *m);
    if (!m) return dl_fail(DL_ERR_NOMEM, "out of memory");
    m->c.sp = split ? *split : (dl_dit_split){.tp = 1, .cp = 1};
    dl_wsrc *ck = NULL;
    int64_t patch, nd, ns, out_ch;
    int guid;
    const cJSON *axes = cJSON_GetObjectItemCaseSensitive(cfg, "axes_dims_rope");
    if ((s = dl_cfg_int(cfg, file, "patch_size", 1, &patch)) || (s = dl_cfg_int(cfg, file, "in_channels", 64, &m->Cin)) ||
        (s = dl_cfg_int(cfg, file, "out_channels", 0, &out_ch)) || (s = dl_cfg_int(cfg, file, "num_layers", 19, &nd)) ||
        (s = dl_cfg_int(cfg, file, "num_single_layers", 38, &ns)) ||
        (s = dl_cfg_int(cfg, file, "attention_head_dim", 128, &m->c.Dh)) ||
        (s = dl_cfg_int(cfg, file, "num_attention_heads", 24, &m->c.H)) ||
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
    m->c.D = m->c.H * m->c.Dh;
    m->c.F = 4 * m->c.D;
    m->c.dt = dt;
    m->c.T = m->c.L = txt_len;
    m->c.N = grid_h * grid_w;
    m->c.S = m->c.T + m->c.N;
    if (patch != 1) {
        s = dl_fail(DL_ERR_UNSUPPORTED, "`%s`: patch_size %lld is not supported (FLUX uses 1)", file, (long long)patch);
        goto fail;
    }
    if (asum != m->c.Dh) {
        s = dl_fail(DL_ERR_FORMAT, "`%s`: axes_dims_rope sums to %d, attention_head_dim is %lld", file, asum, (long long)m->c.Dh);
        goto fail;
    }
    if (m->c.D <= 0 || nd < 0 || ns < 0 || nd + ns == 0 || m->Cin <= 0 || m->Jd <= 0 || m->Pd <= 0 || m->c.Dh % 2) {
        s = dl_fail(DL_ERR_FORMAT, "`%s`: inconsistent sizes", file);
        goto fail;
    }
    if (grid_h <= 0 || grid_w <= 0 || txt_len <= 0) {
        s = dl_fail(DL_ERR_INVALID, "FLUX transformer: empty image grid or text");
        goto fail;
    }
    char why[256];
    const char *bad = dl_dit_split_check(&m->c.sp, m->c.H, why, sizeof why);
    if (bad) {
        s = dl_fail(DL_ERR_INVALID, "parallel split refused: %s", bad);
        goto fail;
    }
    if ((s = dl_dit_plan(&m->c)) != DL_OK) goto fail;
    if ((s = dl_ws_open(&ck, src, dir, component)) != DL_OK) goto fail;
    const int64_t D = m->c.D, T = m->c.T, Nl = m->c.Nl, Sl = m->c.Sl, Dl = m->c.Dl, Fl = m->c.Fl;
    /* embedders: one-row matmuls */
    if ((s = dl_dit_cond_load(&m->cond, &m->c, ck, "time_text_embed.", m->Pd, guid, file)) ||
        (s = lin1(&m->ctx, ck, "context_embedder", T, m->Jd, D, dt, DL_F32, DL_ACT_NONE)) ||
        (s = lin1(&m->xemb, ck, "x_embedder", Nl, m->Cin, D, dt, DL_F32, DL_ACT_NONE)) ||
        (s = lin1(&m->norm_out, ck, "norm_out.linear", 1, D, 2 * D, dt, DL_F32, DL_ACT_NONE)) ||
        (s = lin1(&m->proj_out, ck, "proj_out", Nl, D, m->Cout, dt, DL_F32, DL_ACT_NONE)))
        goto fail;
    m->dbl = calloc((size_t)(nd ? nd : 1), sizeof *m->dbl);
    m->sgl = calloc((size_t)(ns ? ns : 1), sizeof *m->sgl);
    if (!m->dbl || !m->sgl) {
        s = dl_fail(DL_ERR_NOMEM, "out of memory");
        goto fail;
    }
    static const dl_dit_dual_names dual = {"norm1.linear", "norm1_context.linear", "ff.net.0.proj", "ff.net.2",
                                           "ff_context.net.0.proj", "ff_context.net.2"};
    for (int i = 0; i < m->nd; i++) {
        snprintf(p, sizeof p, "transformer_blocks.%d.", i);
        if ((s = dl_dit_dual_load(&m->dbl[i], &m->c, ck, p, &dual))) goto fail;
    }
for (int i = 0; i < m->ns; i++) {
        snprintf(p, sizeof p, "single_transformer_blocks.%d.", i);
        if ((s = dl_dit_single_load(&m->sgl[i], &m->c, ck, p))) goto fail;
    }
    /* RoPE tables of the local rows: text ids are zeros, image ids (0, row, col) */
    const int64_t S = m->c.S, hd = m->c.Dh / 2;
    m->c.rope_cos = malloc((size_t)(S * hd) * sizeof(float));
    m->c.rope_sin = malloc((size_t)(S * hd) * sizeof(float));
    float *ids = calloc((size_t)(S * 3), sizeof(float));
    if (!m->c.rope_cos || !m->c.rope_sin || !ids) {
        free(ids);
        s = dl_fail(DL_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (int64_t r = 0; r < grid_h; r++)
        for (int64_t c = 0; c < grid_w; c++) {
            ids[(T + r * grid_w + c) * 3 + 1] = (float)r;
            ids[(T + r * grid_w + c) * 3 + 2] = (float)c;
        }
    dl_rope_table_axes(ids, S, 3, axes_dim, 10000.0, m->c.rope_cos, m->c.rope_sin);
    free(ids);
    if (m->c.n0) { /* image rows [n0, n0 + Nl) follow the text rows */
        memmove(m->c.rope_cos + T * hd, m->c.rope_cos + (T + m->c.n0) * hd, (size_t)(Nl * hd) * 4);
        memmove(m->c.rope_sin + T * hd, m->c.rope_sin + (T + m->c.n0) * hd, (size_t)(Nl * hd) * 4);
    }
    size_t es = dl_dtype_size(dt);
    act_plan pl = {0};
    dl_plan_add(&pl, &m->c.x, (size_t)(m->c.xn * D) * 4, 0, 2);
    dl_plan_add(&pl, &m->c.o, (size_t)(Sl * D) * 4, 0, 2);
    dl_plan_add(&pl, &m->c.h, (size_t)(Sl * D) * es, 1, 2);
    dl_plan_add(&pl, &m->c.qkv, (size_t)(Sl * 3 * Dl) * es, 1, 1);
    dl_plan_add(&pl, &m->c.att, (size_t)(Sl * (Dl + Fl)) * es, 1, 1);
    dl_plan_add(&pl, &m->f, (size_t)(Sl * Fl) * es, 1, 1);
    dl_plan_add(&pl, &m->in_lat, (size_t)(Nl * m->Cin) * es, 0, 0);
    dl_plan_add(&pl, &m->in_txt, (size_t)(T * m->Jd) * es, 0, 0);
    dl_plan_add(&pl, &m->temb, (size_t)D * 4, 0, 2);
    dl_plan_add(&pl, &m->mod_img, (size_t)(6 * D) * 4, 0, 2);
    dl_plan_add(&pl, &m->mod_txt, (size_t)(6 * D) * 4, 1, 1);
    dl_plan_add(&pl, &m->vec_in, (size_t)D * es, 0, 2);
    dl_plan_attn_scratch(&pl, &m->c.scratch, dt, S, m->c.H, m->c.Dh, 0, 1, 1); /* keys: at most all S rows */
    if ((s = dl_plan_commit(&pl, ck, &m->arena)) != DL_OK || (s = dl_dit_alloc(&m->c)) != DL_OK) goto fail;
    dl_ws_close(ck);
    *out = m;
    return DL_OK;
fail:
    dl_ws_close(ck);
    dl_flux_free(m);
    return s;
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
    const int64_t D = m->c.D, T = m->c.T, S = m->c.S;
    const size_t es = dl_dtype_size(m->c.dt);
    dl_status s;
    if (!isfinite(timestep) || (m->guidance && !isfinite(guidance)))
        return dl_fail(DL_ERR_INVALID, "FLUX transformer: timestep or guidance is not finite");
    if (block_out && (m->c.sp.tp > 1 || m->c.sp.cp > 1))
        return dl_fail(DL_ERR_UNSUPPORTED, "FLUX transformer: per-block outputs are only kept by an unsplit model");
    /* conditioning vector; silu(temb) is the input of every modulation linear */
    TRY(conditioning(m, pooled, timestep, guidance));
    /* embed inputs: text rows then this rank's image rows (with SP, into o, then the shard) */
    to_dt(m->c.dt, m->in_txt, txt, T * m->Jd);
    to_dt(m->c.dt, m->in_lat, latents + m->c.n0 * m->Cin, m->c.Nl * m->Cin);
    float *emb = dl_dit_sp_on(&m->c) ? m->c.o : m->c.x;
    RUN(&m->ctx, m->in_txt, emb);
    RUN(&m->xemb, m->in_lat, emb + T * D);
    if (dl_dit_sp_on(&m->c)) memcpy(m->c.x, m->c.o + m->c.xa * D, (size_t)(m->c.xn * D) * 4);
    char *h_img = (char *)m->c.h + (size_t)(T * D) * es;
    int nb = 0;
    for (int i = 0; i < m->nd; i++) {
        TRY(dl_dit_dual_run(&m->c, &m->dbl[i], m->vec_in, m->mod_img, m->mod_txt, m->f));
        if (block_out) memcpy(block_out + (size_t)(nb++) * (size_t)(S * D), m->c.x, (size_t)(S * D) * 4);
    }
    for (int i = 0; i < m->ns; i++) {
        TRY(dl_dit_single_run(&m->c, &m->sgl[i], m->vec_in, m->mod_img));
        if (block_out) memcpy(block_out + (size_t)(nb++) * (size_t)(S * D), m->c.x, (size_t)(S * D) * 4);
    }
    RUN(&m->norm_out, m->vec_in, m->mod_img); /* scale, shift */
    dl_dit_ln_mod(&m->c, NULL, NULL, m->mod_img, m->mod_img + D);
    TRY(dl_dit_gather_h(&m->c));
    RUN(&m->proj_out, h_img, out + m->c.n0 * m->Cout);
    return dl_dit_gather_image_rows(&m->c, out, m->Cout); /* every rank's image rows */
}

/* the conditioning vector temb and silu(temb) in vec_in, for a timestep */
static dl_status conditioning(dl_flux *m, const float *pooled, float timestep, float guidance) {
    return dl_dit_cond_run(&m->cond, pooled, timestep * 1000.f, guidance * 1000.f, m->temb, m->vec_in);
}

void dl_flux_probe_reset(dl_flux *m) { m->probe_have[0] = m->probe_have[1] = 0; }

size_t dl_flux_probe_bytes(const dl_flux *m) {
    return m->probe_cur ? 3 * (size_t)(m->c.Nl * m->c.D) * sizeof(float) : 0;
}

dl_status dl_flux_probe(dl_flux *m, int slot, const float *latents, const float *pooled, float timestep,
                        float guidance, double *score) {
    const int64_t D = m->c.D, Nl = m->c.Nl, T = m->c.T;
    dl_status s;
    *score = 0;
    if (slot < 0 || slot > 1 || m->nd < 1) return dl_fail(DL_ERR_UNSUPPORTED, "probe: needs a double block and slot 0 or 1");
    if (!m->probe_cur) { /* once per model: the probe's own persistent buffers */
        for (int i = 0; i < 2; i++) m->probe_prev[i] = dl_aligned_alloc((size_t)(Nl * D) * 4);
        m->probe_cur = dl_aligned_alloc((size_t)(Nl * D) * 4);
        if (!m->probe_prev[0] || !m->probe_prev[1] || !m->probe_cur) return dl_fail(DL_ERR_NOMEM, "probe: out of memory");
    }
    if ((s = conditioning(m, pooled, timestep, guidance))) return s;
    to_dt(m->c.dt, m->in_lat, latents + m->c.n0 * m->Cin, Nl * m->Cin);
    float *x = m->c.o + T * D; /* o holds every local row, whatever x holds */
    RUN(&m->xemb, m->in_lat, x);
    RUN(&m->dbl[0].mod_img, m->vec_in, m->mod_img); /* shift1, scale1, ... */
    return dl_dit_probe_feature(&m->c, m->probe_cur, m->probe_prev[slot], &m->probe_have[slot], x, Nl, m->mod_img + D,
                                m->mod_img, score);
}
