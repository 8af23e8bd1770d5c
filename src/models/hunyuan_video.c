/* HunyuanVideoTransformer3DModel (diffusers): HunyuanVideo's denoiser, built for a
 * fixed latent grid and text length. FLUX's block structure on video tokens:
 *
 *   temb = timestep_embedder(proj(t)) [+ guidance_embedder(proj(g))]
 *          + text_embedder(pooled)                                  // [D]; t, g as the pipeline passes them
 *   txt  = token_refiner(text, valid, t)                             // [T, D] (hunyuan_refiner.c)
 *   img  = x_embedder(latents): Conv3d, kernel = stride = (pt, p, p) // [N, D], N = F/pt * H/p * W/p
 *   dual blocks, then single blocks, on the joint stream [txt; img]  // the DiT library's blocks
 *   out  = unpatchify(proj_out(LN(img)(1 + scale) + shift))         // [Cout, F, H, W]
 *
 * Attention: every query row attends to all video keys and the first `valid` text
 * keys (diffusers' mask). diffusers orders the stream [img; txt]; the DiT library
 * keeps text first. Attention is a sum over keys, the text rows get no RoPE (an
 * identity row of the table) and every other op is per row, so the order changes
 * nothing but float summation order. RoPE: 3-D over the token grid (t, h, w),
 * axes rope_axes_dim, theta rope_theta, f32 frequencies as diffusers computes them.
 * unpatchify: proj_out's column ((c pt + a) p + b) p + d of token (f, h, w) is
 * out[c, f pt + a, h p + b, w p + d].
 *
 * The step-caching probe is a program of its own (dl_hunyuan_probe): the
 * conditioning, the patch embedding and the first dual block's image modulation. */
#include <cjson/cJSON.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "difflet/comm.h"
#include "difflet/hunyuan.h"
#include "models/models_impl.h"

/* the config's sizes, shared by the transformer and its probe */
typedef struct {
    int64_t Cin, Cout, H, Dh, nd, ns, Td, Pd, P[3];
    double mlp_ratio, theta;
    int guidance, axes[3];
} hv_config;

/* the patch embedding of this rank's rows (shared with the probe) */
typedef struct {
    dl_conv *conv;                  /* x_embedder.proj: [Cin, F, H, W] -> [D, N] */
    void *lat_in, *pe;              /* [Cin, F, H, W], [D, N] dt */
    int64_t Cin, lat[3], D, N, n0, Nl;
    dl_dtype dt;
} hv_patch;

struct dl_hunyuan_video {
    dl_dit c;                       /* the joint stream: sizes, split, shared activations */
    hv_config k;
    int64_t lat[3], G[3], PP;       /* latent grid (F, H, W), token grid, pt p p */
    dl_dit_cond cond;
    hv_patch pe;
    dl_hunyuan_refiner *ref;        /* context_embedder */
    dl_dit_dual *dbl;
    dl_dit_single *sgl;
    lin norm_out, proj_out;         /* D -> 2D (scale, shift); D -> Cout PP over the local image rows */
    /* activations of the model's own (the joint stream's are in c) */
    void *f;                        /* [Sl, Fl] dt */
    float *txt;                     /* [T, D] f32: the refiner's output */
    float *temb, *mod_img, *mod_txt; /* [D], [6D], [6D] */
    void *vec_in;                   /* [D] dt: silu(temb) */
    float *pout;                    /* [Nl, Cout PP] f32 */
    float *full;                    /* [N, Cout PP] f32: every rank's rows (cp > 1) */
    void *arena;
};

static dl_status read_config(hv_config *k, dl_model_dir *dir, const char *component) {
    char file[512];
    snprintf(file, sizeof file, "%s/config.json", component);
    const cJSON *cfg;
    dl_status s = dl_model_dir_config(dir, component, &cfg);
    if (s != DL_OK) return s;
    int64_t p, pt;
    const cJSON *ict = cJSON_GetObjectItemCaseSensitive(cfg, "image_condition_type");
    const cJSON *qk = cJSON_GetObjectItemCaseSensitive(cfg, "qk_norm");
    const cJSON *axes = cJSON_GetObjectItemCaseSensitive(cfg, "rope_axes_dim");
    if ((s = dl_cfg_int(cfg, file, "in_channels", 16, &k->Cin)) || (s = dl_cfg_int(cfg, file, "out_channels", 16, &k->Cout)) ||
        (s = dl_cfg_int(cfg, file, "num_attention_heads", 24, &k->H)) ||
        (s = dl_cfg_int(cfg, file, "attention_head_dim", 128, &k->Dh)) ||
        (s = dl_cfg_int(cfg, file, "num_layers", 20, &k->nd)) || (s = dl_cfg_int(cfg, file, "num_single_layers", 40, &k->ns)) ||
        (s = dl_cfg_float(cfg, file, "mlp_ratio", 4.0, &k->mlp_ratio)) || (s = dl_cfg_int(cfg, file, "patch_size", 2, &p)) ||
        (s = dl_cfg_int(cfg, file, "patch_size_t", 1, &pt)) || (s = dl_cfg_bool(cfg, file, "guidance_embeds", 1, &k->guidance)) ||
        (s = dl_cfg_int(cfg, file, "text_embed_dim", 4096, &k->Td)) ||
        (s = dl_cfg_int(cfg, file, "pooled_projection_dim", 768, &k->Pd)) ||
        (s = dl_cfg_float(cfg, file, "rope_theta", 256.0, &k->theta)))
        return s;
    if (ict && !cJSON_IsNull(ict))
        return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: image_condition_type \"%s\" (HunyuanVideo image-to-video) is not supported; text-to-video models have null",
                       file, cJSON_IsString(ict) ? ict->valuestring : "?");
    if (qk && !cJSON_IsNull(qk) && (!cJSON_IsString(qk) || strcmp(qk->valuestring, "rms_norm")))
        return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: qk_norm must be \"rms_norm\"", file);
    if (!k->Cout) k->Cout = k->Cin;
    k->P[0] = pt, k->P[1] = k->P[2] = p;
    k->axes[0] = 16, k->axes[1] = k->axes[2] = 56;
    if (axes) {
        if (!cJSON_IsArray(axes) || cJSON_GetArraySize(axes) != 3)
            return dl_fail(DL_ERR_FORMAT, "`%s`: rope_axes_dim must be 3 integers", file);
        for (int i = 0; i < 3; i++) {
            const cJSON *a = cJSON_GetArrayItem(axes, i);
            if (!cJSON_IsNumber(a) || a->valuedouble < 0 || a->valuedouble > 4096 || (int)a->valuedouble % 2)
                return dl_fail(DL_ERR_FORMAT, "`%s`: rope_axes_dim must be 3 even integers", file);
            k->axes[i] = (int)a->valuedouble;
        }
    }
    if (k->Cin <= 0 || k->Cout <= 0 || k->H <= 0 || k->Dh <= 0 || k->Dh % 2 || k->nd < 0 || k->ns < 0 ||
        k->nd + k->ns == 0 || k->Td <= 0 || k->Pd <= 0 || p < 1 || pt < 1 || k->mlp_ratio <= 0 || !(k->theta > 0))
        return dl_fail(DL_ERR_FORMAT, "`%s`: inconsistent sizes", file);
    if (k->axes[0] + k->axes[1] + k->axes[2] != k->Dh)
        return dl_fail(DL_ERR_FORMAT, "`%s`: rope_axes_dim sums to %d, attention_head_dim is %lld", file,
                       k->axes[0] + k->axes[1] + k->axes[2], (long long)k->Dh);
    return DL_OK;
}

/* the latent grid's token grid, or a message */
static dl_status token_grid(const hv_config *k, const int64_t lat[3], int64_t G[3], int64_t *N) {
    *N = 1;
    for (int i = 0; i < 3; i++) {
        if (lat[i] <= 0 || lat[i] % k->P[i])
            return dl_fail(DL_ERR_INVALID, "HunyuanVideo transformer: latent grid %lldx%lldx%lld is not divisible by the patch (%lld, %lld, %lld)",
                           (long long)lat[0], (long long)lat[1], (long long)lat[2], (long long)k->P[0], (long long)k->P[1],
                           (long long)k->P[2]);
        G[i] = lat[i] / k->P[i];
        *N *= G[i];
    }
    return DL_OK;
}

static dl_status patch_load(hv_patch *e, dl_wsrc *ck, const hv_config *k) {
    dl_conv_desc d = {.ndim = 3, .cin = e->Cin, .cout = e->D, .in = {e->lat[0], e->lat[1], e->lat[2]},
                      .kernel = {k->P[0], k->P[1], k->P[2]}, .stride = {k->P[0], k->P[1], k->P[2]}, .dt = e->dt};
    return dl_conv_load(&e->conv, ck, "x_embedder.proj", &d);
}

static void patch_plan(hv_patch *e, act_plan *pl) {
    const size_t es = dl_dtype_size(e->dt);
    dl_plan_add(pl, &e->lat_in, (size_t)(e->Cin * e->lat[0] * e->lat[1] * e->lat[2]) * es, 0, 0);
    dl_plan_add(pl, &e->pe, (size_t)(e->D * e->N) * es, 0, 0);
}

/* the patch convolution, this rank's rows transposed into x [Nl, D] f32 */
static dl_status patch_run(hv_patch *e, const float *latents, float *x) {
    const int64_t D = e->D, N = e->N, n0 = e->n0, Nl = e->Nl;
    const dl_dtype dt = e->dt;
    const size_t es = dl_dtype_size(dt);
    dl_status s;
    to_dt(dt, e->lat_in, latents, e->Cin * e->lat[0] * e->lat[1] * e->lat[2]);
    if ((s = dl_conv_run(e->conv, e->lat_in, e->pe)) != DL_OK) return s;
    const char *pe = e->pe;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < Nl; r++)
        for (int64_t d = 0; d < D; d++) {
            const char *v = pe + (size_t)(d * N + n0 + r) * es;
            x[r * D + d] = dt == DL_F32 ? *(const float *)v : dl_bf16_to_f32(*(const uint16_t *)v);
        }
    return DL_OK;
}

int64_t dl_hunyuan_video_in_channels(const dl_hunyuan_video *m) { return m->k.Cin; }
int64_t dl_hunyuan_video_out_channels(const dl_hunyuan_video *m) { return m->k.Cout; }
int64_t dl_hunyuan_video_heads(const dl_hunyuan_video *m) { return m->c.H; }
int64_t dl_hunyuan_video_width(const dl_hunyuan_video *m) { return m->c.D; }
int dl_hunyuan_video_has_guidance(const dl_hunyuan_video *m) { return m->k.guidance; }
void dl_hunyuan_video_text_dims(const dl_hunyuan_video *m, int64_t *text, int64_t *pooled) {
    *text = m->k.Td;
    *pooled = m->k.Pd;
}
void dl_hunyuan_video_patch(const dl_hunyuan_video *m, int64_t patch[3]) { memcpy(patch, m->k.P, sizeof m->k.P); }

void dl_hunyuan_video_free(dl_hunyuan_video *m) {
    if (!m) return;
    dl_dit_cond_free(&m->cond);
    dl_conv_free(m->pe.conv);
    dl_hunyuan_refiner_free(m->ref);
    for (int i = 0; m->dbl && i < m->k.nd; i++) dl_dit_dual_free(&m->dbl[i]);
    for (int i = 0; m->sgl && i < m->k.ns; i++) dl_dit_single_free(&m->sgl[i]);
    free(m->dbl), free(m->sgl);
    dl_lin_free(&m->norm_out), dl_lin_free(&m->proj_out);
    dl_dit_free(&m->c);
    dl_aligned_free(m->arena), dl_aligned_free(m->full);
    free(m);
}

dl_status dl_hunyuan_video_load(dl_hunyuan_video **out, dl_model_dir *dir, const char *component, int64_t lat_frames,
                                int64_t lat_h, int64_t lat_w, int64_t txt_len, dl_dtype dt, dl_wsrc *src,
                                const dl_dit_split *split) {
    *out = NULL;
    char file[512], p[128];
    snprintf(file, sizeof file, "%s/config.json", component);
    dl_hunyuan_video *m = calloc(1, sizeof *m);
    if (!m) return dl_fail(DL_ERR_NOMEM, "out of memory");
    dl_wsrc *ck = NULL;
    dl_status s;
    int64_t N;
    m->lat[0] = lat_frames, m->lat[1] = lat_h, m->lat[2] = lat_w;
    if ((s = read_config(&m->k, dir, component)) || (s = token_grid(&m->k, m->lat, m->G, &N))) goto fail;
    if (txt_len < 1 || txt_len > 65536) {
        s = dl_fail(DL_ERR_INVALID, "HunyuanVideo transformer: %lld text rows (1..65536)", (long long)txt_len);
        goto fail;
    }
    const hv_config *k = &m->k;
    m->PP = k->P[0] * k->P[1] * k->P[2];
    m->c = (dl_dit){.sp = split ? *split : (dl_dit_split){.tp = 1, .cp = 1}, .dt = dt, .H = k->H, .Dh = k->Dh,
                    .T = txt_len, .L = txt_len, .N = N, .S = txt_len + N};
    m->c.D = k->H * k->Dh;
    m->c.F = (int64_t)((double)m->c.D * k->mlp_ratio);
    char why[256];
    const char *bad = dl_dit_split_check(&m->c.sp, m->c.H, why, sizeof why);
    if (bad) {
        s = dl_fail(DL_ERR_INVALID, "parallel split refused: %s", bad);
        goto fail;
    }
    if (m->c.F % m->c.sp.tp) {
        s = dl_fail(DL_ERR_INVALID, "parallel split refused: the MLP width %lld is not divisible by tp=%d",
                    (long long)m->c.F, m->c.sp.tp);
        goto fail;
    }
    if ((s = dl_dit_plan(&m->c)) != DL_OK || (s = dl_ws_open(&ck, src, dir, component)) != DL_OK) goto fail;
    const int64_t D = m->c.D, T = m->c.T, Nl = m->c.Nl, Sl = m->c.Sl, Dl = m->c.Dl, Fl = m->c.Fl;
    m->pe = (hv_patch){.Cin = k->Cin, .lat = {lat_frames, lat_h, lat_w}, .D = D, .N = N, .n0 = m->c.n0, .Nl = Nl, .dt = dt};
    if ((s = dl_dit_cond_load(&m->cond, &m->c, ck, "time_text_embed.", k->Pd, k->guidance, file)) ||
        (s = patch_load(&m->pe, ck, k)) || (s = dl_hunyuan_refiner_load(&m->ref, dir, component, T, dt, src)) ||
        (s = dl_lin_named(&m->norm_out, ck, "norm_out.linear", 1, D, 2 * D, dt, DL_F32, DL_ACT_NONE, 0, NULL)) ||
        (s = dl_lin_named(&m->proj_out, ck, "proj_out", Nl, D, k->Cout * m->PP, dt, DL_F32, DL_ACT_NONE, 0, NULL)))
        goto fail;
    if (dl_hunyuan_refiner_width(m->ref) != D) {
        s = dl_fail(DL_ERR_FORMAT, "`%s`: the token refiner is %lld wide, the transformer %lld", file,
                    (long long)dl_hunyuan_refiner_width(m->ref), (long long)D);
        goto fail;
    }
    m->dbl = calloc((size_t)(k->nd ? k->nd : 1), sizeof *m->dbl);
    m->sgl = calloc((size_t)(k->ns ? k->ns : 1), sizeof *m->sgl);
    if (!m->dbl || !m->sgl) {
        s = dl_fail(DL_ERR_NOMEM, "out of memory");
        goto fail;
    }
    static const dl_dit_dual_names dual = {"norm1.linear", "norm1_context.linear", "ff.net.0.proj", "ff.net.2",
                                           "ff_context.net.0.proj", "ff_context.net.2"};
    for (int i = 0; i < k->nd; i++) {
        snprintf(p, sizeof p, "transformer_blocks.%d.", i);
        if ((s = dl_dit_dual_load(&m->dbl[i], &m->c, ck, p, &dual))) goto fail;
    }
    for (int i = 0; i < k->ns; i++) {
        snprintf(p, sizeof p, "single_transformer_blocks.%d.", i);
        if ((s = dl_dit_single_load(&m->sgl[i], &m->c, ck, p))) goto fail;
    }
    /* RoPE tables of the local rows: text rows identity (position 0 on every axis),
     * video rows (f, h, w) of the token grid, this rank's shard after the text */
    const int64_t hd = m->c.Dh / 2;
    m->c.rope_cos = malloc((size_t)(Sl * hd) * sizeof(float));
    m->c.rope_sin = malloc((size_t)(Sl * hd) * sizeof(float));
    float *ids = calloc((size_t)(Sl * 3), sizeof(float));
    if (!m->c.rope_cos || !m->c.rope_sin || !ids) {
        free(ids);
        s = dl_fail(DL_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (int64_t r = 0; r < Nl; r++) {
        int64_t n = m->c.n0 + r;
        ids[(T + r) * 3 + 0] = (float)(n / (m->G[1] * m->G[2]));
        ids[(T + r) * 3 + 1] = (float)(n / m->G[2] % m->G[1]);
        ids[(T + r) * 3 + 2] = (float)(n % m->G[2]);
    }
    dl_rope_table_axes_f32(ids, Sl, 3, k->axes, k->theta, m->c.rope_cos, m->c.rope_sin);
    free(ids);
    const size_t es = dl_dtype_size(dt);
    act_plan pl = {0};
    dl_plan_add(&pl, &m->c.x, (size_t)(m->c.xn * D) * 4, 0, 2);
    dl_plan_add(&pl, &m->c.o, (size_t)(Sl * D) * 4, 0, 2);
    dl_plan_add(&pl, &m->c.h, (size_t)(Sl * D) * es, 1, 2);
    dl_plan_add(&pl, &m->c.qkv, (size_t)(Sl * 3 * Dl) * es, 1, 1);
    dl_plan_add(&pl, &m->c.att, (size_t)(Sl * (Dl + Fl)) * es, 1, 1);
    dl_plan_add(&pl, &m->f, (size_t)(Sl * Fl) * es, 1, 1);
    dl_plan_add(&pl, &m->txt, (size_t)(T * D) * 4, 0, 0);
    dl_plan_add(&pl, &m->temb, (size_t)D * 4, 0, 2);
    dl_plan_add(&pl, &m->mod_img, (size_t)(6 * D) * 4, 0, 2);
    dl_plan_add(&pl, &m->mod_txt, (size_t)(6 * D) * 4, 1, 1);
    dl_plan_add(&pl, &m->vec_in, (size_t)D * es, 0, 2);
    dl_plan_add(&pl, &m->pout, (size_t)(Nl * k->Cout * m->PP) * 4, 2, 2);
    patch_plan(&m->pe, &pl);
    dl_plan_attn_scratch(&pl, &m->c.scratch, dt, m->c.S, m->c.H, m->c.Dh, 0, 1, 1);
    if ((s = dl_plan_commit(&pl, ck, &m->arena)) != DL_OK || (s = dl_dit_alloc(&m->c)) != DL_OK) goto fail;
    if (m->c.sp.cp > 1 && !(m->full = dl_aligned_alloc((size_t)(N * k->Cout * m->PP) * 4))) {
        s = dl_fail(DL_ERR_NOMEM, "out of memory");
        goto fail;
    }
    dl_ws_close(ck);
    *out = m;
    return DL_OK;
fail:
    dl_ws_close(ck);
    dl_hunyuan_video_free(m);
    return s;
}

#define RUN(l, x, y)                                         \
    do {                                                     \
        if ((s = lin_run((l), (x), (y))) != DL_OK) return s; \
    } while (0)
#define TRY(e)                            \
    do {                                  \
        if ((s = (e)) != DL_OK) return s; \
    } while (0)

dl_status dl_hunyuan_video_run(dl_hunyuan_video *m, const float *latents, const float *text, int64_t valid,
                               const float *pooled, float timestep, float guidance, float *out) {
    const int64_t D = m->c.D, T = m->c.T, Nl = m->c.Nl, N = m->c.N, Cout = m->k.Cout, PP = m->PP;
    const size_t es = dl_dtype_size(m->c.dt);
    dl_status s;
    if (!isfinite(timestep) || (m->k.guidance && !isfinite(guidance)))
        return dl_fail(DL_ERR_INVALID, "HunyuanVideo transformer: timestep or guidance is not finite");
    if (valid < 1 || valid > T)
        return dl_fail(DL_ERR_INVALID, "HunyuanVideo transformer: valid text length %lld is outside 1..%lld",
                       (long long)valid, (long long)T);
    m->c.L = valid;
    TRY(dl_dit_cond_run(&m->cond, pooled, timestep, guidance * 1000.f, m->temb, m->vec_in));
    /* embed inputs: text rows then this rank's video rows (with SP, into o, then the shard) */
    float *emb = dl_dit_sp_on(&m->c) ? m->c.o : m->c.x;
    TRY(dl_hunyuan_refiner_run(m->ref, text, valid, timestep, emb));
    TRY(patch_run(&m->pe, latents, emb + T * D));
    if (dl_dit_sp_on(&m->c)) memcpy(m->c.x, m->c.o + m->c.xa * D, (size_t)(m->c.xn * D) * 4);
    for (int i = 0; i < m->k.nd; i++) TRY(dl_dit_dual_run(&m->c, &m->dbl[i], m->vec_in, m->mod_img, m->mod_txt, m->f));
    for (int i = 0; i < m->k.ns; i++) TRY(dl_dit_single_run(&m->c, &m->sgl[i], m->vec_in, m->mod_img));
    RUN(&m->norm_out, m->vec_in, m->mod_img); /* scale, shift */
    dl_dit_ln_mod(&m->c, NULL, NULL, m->mod_img, m->mod_img + D);
    TRY(dl_dit_gather_h(&m->c));
    RUN(&m->proj_out, (char *)m->c.h + (size_t)(T * D) * es, m->pout);
    const float *rows = m->pout;
    if (m->c.sp.cp > 1) { /* every rank's rows */
        memcpy(m->full + m->c.n0 * Cout * PP, m->pout, (size_t)(Nl * Cout * PP) * 4);
        TRY(dl_dit_gather_image_rows(&m->c, m->full, Cout * PP));
        rows = m->full;
    }
    /* unpatchify: token (f, h, w), column ((c pt + a) p + b) p + d -> out[c, f pt + a, h p + b, w p + d] */
    const int64_t pt = m->k.P[0], ph = m->k.P[1], pw = m->k.P[2], *G = m->G, *L = m->lat;
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const int64_t f = n / (G[1] * G[2]), h = n / G[2] % G[1], w = n % G[2];
        const float *r = rows + n * Cout * PP;
        for (int64_t c = 0; c < Cout; c++)
            for (int64_t a = 0; a < pt; a++)
                for (int64_t b = 0; b < ph; b++)
                    for (int64_t d = 0; d < pw; d++)
                        out[((c * L[0] + f * pt + a) * L[1] + h * ph + b) * L[2] + w * pw + d] =
                            r[((c * pt + a) * ph + b) * pw + d];
    }
    return DL_OK;
}

/* ---- the probe program ------------------------------------------------------------ */

struct dl_hunyuan_probe {
    dl_dit c;                       /* sizes and the split (no attention buffers) */
    hv_config k;
    dl_dit_cond cond;
    hv_patch pe;
    lin mod0;                       /* transformer_blocks.0.norm1.linear: D -> 6D */
    float *x, *cur, *mod, *temb;    /* [Nl, D], [Nl, D], [6D], [D] f32 */
    void *vec;                      /* [D] dt */
    float *prev[2];                 /* [Nl, D] per CFG slot */
    int have[2];
    void *arena;
};

void dl_hunyuan_probe_free(dl_hunyuan_probe *p) {
    if (!p) return;
    dl_dit_cond_free(&p->cond);
    dl_conv_free(p->pe.conv);
    dl_lin_free(&p->mod0);
    dl_dit_free(&p->c);
    dl_aligned_free(p->prev[0]), dl_aligned_free(p->prev[1]), dl_aligned_free(p->arena);
    free(p);
}

void dl_hunyuan_probe_reset(dl_hunyuan_probe *p) { p->have[0] = p->have[1] = 0; }

dl_status dl_hunyuan_probe_load(dl_hunyuan_probe **out, dl_model_dir *dir, const char *component, int64_t lat_frames,
                                int64_t lat_h, int64_t lat_w, dl_dtype dt, dl_wsrc *src, const dl_dit_split *split) {
    *out = NULL;
    char file[512];
    snprintf(file, sizeof file, "%s/config.json", component);
    dl_hunyuan_probe *p = calloc(1, sizeof *p);
    if (!p) return dl_fail(DL_ERR_NOMEM, "out of memory");
    dl_wsrc *ck = NULL;
    dl_status s;
    const int64_t lat[3] = {lat_frames, lat_h, lat_w};
    int64_t G[3], N;
    if ((s = read_config(&p->k, dir, component)) || (s = token_grid(&p->k, lat, G, &N))) goto fail;
    if (p->k.nd < 1) {
        s = dl_fail(DL_ERR_UNSUPPORTED, "HunyuanVideo probe: the model has no dual-stream block");
        goto fail;
    }
    p->c = (dl_dit){.sp = split ? *split : (dl_dit_split){.tp = 1, .cp = 1}, .dt = dt, .H = p->k.H, .Dh = p->k.Dh,
                    .N = N, .S = N};
    p->c.D = p->k.H * p->k.Dh;
    p->c.F = p->c.D;
    /* tp ranks compute the probe alike; cp ranks their own rows */
    if ((s = dl_dit_plan(&p->c)) != DL_OK || (s = dl_ws_open(&ck, src, dir, component)) != DL_OK) goto fail;
    const int64_t D = p->c.D, Nl = p->c.Nl;
    p->pe = (hv_patch){.Cin = p->k.Cin, .lat = {lat_frames, lat_h, lat_w}, .D = D, .N = N, .n0 = p->c.n0, .Nl = Nl, .dt = dt};
    if ((s = dl_dit_cond_load(&p->cond, &p->c, ck, "time_text_embed.", p->k.Pd, p->k.guidance, file)) ||
        (s = patch_load(&p->pe, ck, &p->k)) ||
        (s = dl_lin_named(&p->mod0, ck, "transformer_blocks.0.norm1.linear", 1, D, 6 * D, dt, DL_F32, DL_ACT_NONE, 0, NULL)))
        goto fail;
    act_plan pl = {0};
    dl_plan_add(&pl, &p->x, (size_t)(Nl * D) * 4, 0, 1);
    dl_plan_add(&pl, &p->cur, (size_t)(Nl * D) * 4, 1, 1);
    dl_plan_add(&pl, &p->mod, (size_t)(6 * D) * 4, 0, 1);
    dl_plan_add(&pl, &p->temb, (size_t)D * 4, 0, 0);
    dl_plan_add(&pl, &p->vec, (size_t)D * dl_dtype_size(dt), 0, 0);
    patch_plan(&p->pe, &pl);
    if ((s = dl_plan_commit(&pl, ck, &p->arena)) != DL_OK) goto fail;
    for (int i = 0; i < 2; i++)
        if (!(p->prev[i] = dl_aligned_alloc((size_t)(Nl * D) * 4))) {
            s = dl_fail(DL_ERR_NOMEM, "out of memory");
            goto fail;
        }
    dl_ws_close(ck);
    *out = p;
    return DL_OK;
fail:
    dl_ws_close(ck);
    dl_hunyuan_probe_free(p);
    return s;
}

dl_status dl_hunyuan_probe_run(dl_hunyuan_probe *p, int slot, const float *latents, const float *pooled, float timestep,
                               float guidance, double *score) {
    const int64_t D = p->c.D, Nl = p->c.Nl;
    dl_status s;
    *score = 0;
    if (slot < 0 || slot > 1) return dl_fail(DL_ERR_INVALID, "probe: slot %d (0 or 1)", slot);
    if (!isfinite(timestep) || (p->k.guidance && !isfinite(guidance)))
        return dl_fail(DL_ERR_INVALID, "HunyuanVideo probe: timestep or guidance is not finite");
    TRY(dl_dit_cond_run(&p->cond, pooled, timestep, guidance * 1000.f, p->temb, p->vec));
    TRY(patch_run(&p->pe, latents, p->x));
    RUN(&p->mod0, p->vec, p->mod); /* shift1, scale1, ... */
    return dl_dit_probe_feature(&p->c, p->cur, p->prev[slot], &p->have[slot], p->x, Nl, p->mod + D, p->mod, score);
}
