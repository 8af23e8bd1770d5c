/* AutoencoderKL decoder (diffusers), channels-first activations [C, H, W].
 *   z -> post_quant_conv? -> conv_in -> mid(resnet, attention, resnet)
 *     -> up blocks (layers_per_block + 1 resnets, then nearest 2x + conv except last)
 *     -> GroupNorm + SiLU -> conv_out                                   // [3, H, W]
 * resnet: h = conv2(SiLU(GN2(conv1(SiLU(GN1(x)))))); out = shortcut(x) + h
 * attention (one head of width C over H*W tokens): x + to_out(attn(GN(x)^T))^T */
#include <cjson/cJSON.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "models/models_impl.h"

typedef struct {
    int64_t cin, cout, h, w;
    float *g1w, *g1b, *g2w, *g2b;
    dl_conv *c1, *c2, *sc; /* sc: 1x1 shortcut when cin != cout */
} resnet;

typedef struct {
    int64_t c, h, w;
    float *gw, *gb;
    lin qkv, out;
} attn_blk;

struct dl_vae_decoder {
    int64_t zc, h0, w0, groups;
    int levels, lpb;
    double scaling, shift;
    dl_dtype dt;
    dl_conv *pq, *cin, *cout;
    resnet *res; /* mid.0, mid.1, then the up blocks' resnets in order */
    int nres;
    attn_blk att;
    int has_attn;
    dl_conv **up; /* one per upsampling level */
    float *gow, *gob;
    int64_t c_last; /* channels before conv_out */
    int64_t out_h, out_w;
    void *a, *b, *c, *d; /* activation buffers, each max C*H*W (dt) */
    void *t1, *t2;       /* attention: tokens x channels, tokens x 3C (dt) */
    float *tf, *tf2;     /* [HW, C] f32 projection output and its transpose */
    void *scratch;
    void *arena; /* one block holding every buffer above */
    size_t maxel;
};

int64_t dl_vae_latent_channels(const dl_vae_decoder *m) { return m->zc; }
int dl_vae_scale(const dl_vae_decoder *m) { return 1 << (m->levels - 1); }
double dl_vae_scaling_factor(const dl_vae_decoder *m) { return m->scaling; }
double dl_vae_shift_factor(const dl_vae_decoder *m) { return m->shift; }

static void resnet_free(resnet *r) {
    free(r->g1w), free(r->g1b), free(r->g2w), free(r->g2b);
    dl_conv_free(r->c1), dl_conv_free(r->c2), dl_conv_free(r->sc);
}

void dl_vae_decoder_free(dl_vae_decoder *m) {
    if (!m) return;
    for (int i = 0; m->res && i < m->nres; i++) resnet_free(&m->res[i]);
    for (int i = 0; m->up && i < m->levels - 1; i++) dl_conv_free(m->up[i]);
    free(m->res), free(m->up);
    dl_conv_free(m->pq), dl_conv_free(m->cin), dl_conv_free(m->cout);
    free(m->att.gw), free(m->att.gb);
    dl_lin_free(&m->att.qkv), dl_lin_free(&m->att.out);
    free(m->gow), free(m->gob);
    void *bufs[] = {m->arena};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) dl_aligned_free(bufs[i]);
    free(m);
}

/* conv `<base>.weight/bias`: [cout, cin, k, k], stride 1, pad k/2, at h x w */
static dl_status vconv(dl_conv **c, dl_wsrc *ck, const char *base, int64_t cin, int64_t cout, int64_t k, int64_t h,
                       int64_t w, dl_dtype dt) {
    dl_conv_desc d = {.ndim = 2, .cin = cin, .cout = cout, .in = {h, w}, .kernel = {k, k}, .stride = {1, 1},
                      .pad = {k / 2, k / 2}, .dt = dt};
    return dl_conv_load(c, ck, base, &d);
}

static dl_status gn_load(dl_wsrc *ck, const char *base, int64_t c, float **w, float **b) {
    char n[300];
    int64_t sh[1] = {c};
    dl_status s;
    snprintf(n, sizeof n, "%s.weight", base);
    if ((s = dl_param_f32(ck, n, 1, sh, w))) return s;
    snprintf(n, sizeof n, "%s.bias", base);
    return dl_param_f32(ck, n, 1, sh, b);
}

static dl_status resnet_load(resnet *r, dl_wsrc *ck, const char *p, int64_t cin, int64_t cout, int64_t h,
                             int64_t w, dl_dtype dt) {
    char n[256];
    dl_status s;
    r->cin = cin, r->cout = cout, r->h = h, r->w = w;
#define N(x) (snprintf(n, sizeof n, "%s%s", p, x), n)
    if ((s = gn_load(ck, N("norm1"), cin, &r->g1w, &r->g1b)) || (s = gn_load(ck, N("norm2"), cout, &r->g2w, &r->g2b)) ||
        (s = vconv(&r->c1, ck, N("conv1"), cin, cout, 3, h, w, dt)) ||
        (s = vconv(&r->c2, ck, N("conv2"), cout, cout, 3, h, w, dt)))
        return s;
    if (cin != cout) return vconv(&r->sc, ck, N("conv_shortcut"), cin, cout, 1, h, w, dt);
    if (dl_ws_find(ck, N("conv_shortcut.weight")))
        return dl_fail(DL_ERR_FORMAT, "`%s`: unexpected conv_shortcut (in and out channels are equal)", dl_ws_label(ck));
#undef N
    return DL_OK;
}

dl_status dl_vae_decoder_load(dl_vae_decoder **out, dl_model_dir *dir, const char *component, int64_t lat_h,
                              int64_t lat_w, dl_dtype dt, dl_wsrc *src) {
    *out = NULL;
    char file[512], p[128];
    snprintf(file, sizeof file, "%s/config.json", component);
    const cJSON *cfg;
    dl_status s = dl_model_dir_config(dir, component, &cfg);
    if (s != DL_OK) return s;
    dl_vae_decoder *m = calloc(1, sizeof *m);
    if (!m) return dl_fail(DL_ERR_NOMEM, "out of memory");
    dl_wsrc *ck = NULL;
    int64_t lpb, outc, ch[8];
    int pq = 0, mid_attn = 1;
    const char *act;
    const cJSON *boc = cJSON_GetObjectItemCaseSensitive(cfg, "block_out_channels");
    if ((s = dl_cfg_int(cfg, file, "latent_channels", 4, &m->zc)) || (s = dl_cfg_int(cfg, file, "layers_per_block", 1, &lpb)) ||
        (s = dl_cfg_int(cfg, file, "norm_num_groups", 32, &m->groups)) || (s = dl_cfg_int(cfg, file, "out_channels", 3, &outc)) ||
        (s = dl_cfg_float(cfg, file, "scaling_factor", 0.18215, &m->scaling)) ||
        (s = dl_cfg_float(cfg, file, "shift_factor", 0.0, &m->shift)) ||
        (s = dl_cfg_bool(cfg, file, "use_post_quant_conv", 1, &pq)) ||
        (s = dl_cfg_bool(cfg, file, "mid_block_add_attention", 1, &mid_attn)) ||
        (s = dl_cfg_str(cfg, file, "act_fn", "silu", &act)))
        goto fail;
    if (strcmp(act, "silu")) {
        s = dl_fail(DL_ERR_UNSUPPORTED, "`%s`: act_fn \"%s\" is not supported (silu)", file, act);
        goto fail;
    }
    if (!cJSON_IsArray(boc) || cJSON_GetArraySize(boc) < 1 || cJSON_GetArraySize(boc) > 8) {
        s = dl_fail(DL_ERR_FORMAT, "`%s`: block_out_channels must list 1 to 8 channel counts", file);
        goto fail;
    }
    m->levels = cJSON_GetArraySize(boc);
    for (int i = 0; i < m->levels; i++) {
        ch[i] = (int64_t)cJSON_GetArrayItem(boc, i)->valuedouble;
        if (ch[i] <= 0 || ch[i] % m->groups) {
            s = dl_fail(DL_ERR_FORMAT, "`%s`: block_out_channels[%d] = %lld is not a positive multiple of norm_num_groups %lld",
                        file, i, (long long)ch[i], (long long)m->groups);
            goto fail;
        }
    }
    if (lat_h <= 0 || lat_w <= 0 || lpb <= 0 || outc != 3) {
        s = dl_fail(DL_ERR_INVALID, "VAE decoder: bad latent size or configuration");
        goto fail;
    }
    m->lpb = (int)lpb;
    m->dt = dt;
    m->h0 = lat_h, m->w0 = lat_w;
    if ((s = dl_ws_open(&ck, src, dir, component)) != DL_OK) goto fail;
    const int64_t top = ch[m->levels - 1];
    if (pq && (s = vconv(&m->pq, ck, "post_quant_conv", m->zc, m->zc, 1, lat_h, lat_w, dt))) goto fail;
    if ((s = vconv(&m->cin, ck, "decoder.conv_in", m->zc, top, 3, lat_h, lat_w, dt))) goto fail;
    m->nres = 2 + m->levels * (m->lpb + 1);
    m->res = calloc((size_t)m->nres, sizeof *m->res);
    m->up = calloc((size_t)m->levels, sizeof *m->up);
    if (!m->res || !m->up) {
        s = dl_fail(DL_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if ((s = resnet_load(&m->res[0], ck, "decoder.mid_block.resnets.0.", top, top, lat_h, lat_w, dt)) ||
        (s = resnet_load(&m->res[1], ck, "decoder.mid_block.resnets.1.", top, top, lat_h, lat_w, dt)))
        goto fail;
    m->has_attn = mid_attn;
    int64_t HW = lat_h * lat_w;
    if (mid_attn) {
        m->att.c = top, m->att.h = lat_h, m->att.w = lat_w;
        const char *pa = "decoder.mid_block.attentions.0.";
        char q[3][256], qb[3][256], o[256], ob[256];
        snprintf(q[0], 256, "%sto_q.weight", pa), snprintf(q[1], 256, "%sto_k.weight", pa), snprintf(q[2], 256, "%sto_v.weight", pa);
        snprintf(qb[0], 256, "%sto_q.bias", pa), snprintf(qb[1], 256, "%sto_k.bias", pa), snprintf(qb[2], 256, "%sto_v.bias", pa);
        snprintf(o, 256, "%sto_out.0.weight", pa), snprintf(ob, 256, "%sto_out.0.bias", pa);
        const char *wn[3] = {q[0], q[1], q[2]}, *bn[3] = {qb[0], qb[1], qb[2]}, *on[1] = {o}, *obn[1] = {ob};
        int64_t parts[3] = {top, top, top};
        snprintf(p, sizeof p, "%sgroup_norm", pa);
        if ((s = gn_load(ck, p, top, &m->att.gw, &m->att.gb)) ||
            (s = dl_lin_load(&m->att.qkv, ck, wn, bn, 3, parts, HW, top, dt, dt, DL_ACT_NONE)) ||
            (s = dl_lin_load(&m->att.out, ck, on, obn, 1, &top, HW, top, dt, DL_F32, DL_ACT_NONE)))
            goto fail;
    }
    /* up blocks: channels reversed; each but the last doubles the size */
    int64_t h = lat_h, w = lat_w, prev = top;
    size_t maxel = (size_t)(top * h * w);
    int ri = 2;
    for (int i = 0; i < m->levels; i++) {
        int64_t oc = ch[m->levels - 1 - i];
        for (int j = 0; j <= m->lpb; j++) {
            snprintf(p, sizeof p, "decoder.up_blocks.%d.resnets.%d.", i, j);
            if ((s = resnet_load(&m->res[ri++], ck, p, j == 0 ? prev : oc, oc, h, w, dt))) goto fail;
        }
        prev = oc;
        if ((size_t)(oc * h * w) > maxel) maxel = (size_t)(oc * h * w);
        if (i < m->levels - 1) {
            h *= 2, w *= 2;
            snprintf(p, sizeof p, "decoder.up_blocks.%d.upsamplers.0.conv", i);
            if ((s = vconv(&m->up[i], ck, p, oc, oc, 3, h, w, dt))) goto fail;
            if ((size_t)(oc * h * w) > maxel) maxel = (size_t)(oc * h * w);
        }
    }
    m->nres = ri;
    m->c_last = prev;
    m->out_h = h, m->out_w = w;
    if ((s = gn_load(ck, "decoder.conv_norm_out", prev, &m->gow, &m->gob)) ||
        (s = vconv(&m->cout, ck, "decoder.conv_out", prev, 3, 3, h, w, dt)))
        goto fail;
    size_t es = dl_dtype_size(dt);
    if ((size_t)(3 * h * w) > maxel) maxel = (size_t)(3 * h * w);
    m->maxel = maxel;
    act_plan pl = {0};
    dl_plan_add(&pl, &m->a, maxel * es, 0, 2);
    dl_plan_add(&pl, &m->b, maxel * es, 0, 2);
    dl_plan_add(&pl, &m->c, maxel * es, 0, 2);
    dl_plan_add(&pl, &m->d, maxel * es, 1, 1);
    dl_plan_add(&pl, &m->t1, (size_t)(HW * top) * es, 1, 1);
    dl_plan_add(&pl, &m->t2, (size_t)(HW * 3 * top) * es, 1, 1);
    dl_plan_add(&pl, &m->tf, (size_t)(HW * top) * 4, 1, 1);
    dl_plan_add(&pl, &m->tf2, (size_t)(HW * top) * 4, 1, 1);
    dl_plan_attn_scratch(&pl, &m->scratch, dt, HW, 1, top, 0, 1, 1);
    if ((s = dl_plan_commit(&pl, ck, &m->arena)) != DL_OK) goto fail;
    dl_ws_close(ck);
    *out = m;
    return DL_OK;
fail:
    dl_ws_close(ck);
    dl_vae_decoder_free(m);
    return s;
}

/* resnet on x (in place): uses t and u as scratch */
static dl_status resnet_run(dl_vae_decoder *m, resnet *r, void *x, void *t, void *u) {
    const int64_t S = r->h * r->w;
    dl_status s;
    DL_PAR(dl_groupnorm_t(m->dt, t, x, r->cin, S, m->groups, r->g1w, r->g1b, 1e-6f, 1, ith, nth));
    if ((s = dl_conv_run(r->c1, t, u))) return s;
    DL_PAR(dl_groupnorm_t(m->dt, u, u, r->cout, S, m->groups, r->g2w, r->g2b, 1e-6f, 1, ith, nth));
    if ((s = dl_conv_run(r->c2, u, t))) return s; /* t = h */
    if (r->sc) {
        if ((s = dl_conv_run(r->sc, x, u))) return s;
        DL_PAR(dl_gated_residual_t(m->dt, u, t, 1, r->cout * S, NULL, ith, nth));
        memcpy(x, u, (size_t)(r->cout * S) * dl_dtype_size(m->dt));
    } else {
        DL_PAR(dl_gated_residual_t(m->dt, x, t, 1, r->cout * S, NULL, ith, nth));
    }
    return DL_OK;
}

/* [rows, cols] -> [cols, rows], element size es */
static void transpose(void *dst, const void *src, int64_t rows, int64_t cols, size_t es) {
    DL_PAR({
        int64_t r0, r1;
        dl_split(rows, ith, nth, &r0, &r1);
        for (int64_t r = r0; r < r1; r++)
            for (int64_t c = 0; c < cols; c++)
                memcpy((char *)dst + (size_t)(c * rows + r) * es, (const char *)src + (size_t)(r * cols + c) * es, es);
    });
}

static dl_status attn_run(dl_vae_decoder *m, void *x, void *t) {
    attn_blk *a = &m->att;
    const int64_t C = a->c, HW = a->h * a->w;
    const size_t es = dl_dtype_size(m->dt);
    dl_status s;
    DL_PAR(dl_groupnorm_t(m->dt, t, x, C, HW, m->groups, a->gw, a->gb, 1e-6f, 0, ith, nth));
    transpose(m->t1, t, C, HW, es); /* tokens x channels */
    if ((s = lin_run(&a->qkv, m->t1, m->t2))) return s;
    dl_attn_args at = {.dt = m->dt, .sq = HW, .sk = HW, .heads = 1, .head_dim = C, .q = m->t2,
                       .k = (char *)m->t2 + (size_t)C * es, .v = (char *)m->t2 + (size_t)(2 * C) * es,
                       .q_stride = 3 * C, .k_stride = 3 * C, .v_stride = 3 * C, .out = m->t1, .out_stride = C,
                       .kv_begin = 0, .kv_end = HW, .scale = 1.f / sqrtf((float)C)};
    DL_PAR(dl_attn_t(&at, m->scratch, ith, nth));
    if ((s = lin_run(&a->out, m->t1, m->tf))) return s;
    /* x += tf^T, in x's dtype */
    transpose(m->tf2, m->tf, HW, C, 4);
    DL_PAR(dl_convert_t(m->dt, m->d, DL_F32, m->tf2, C * HW, ith, nth));
    DL_PAR(dl_gated_residual_t(m->dt, x, m->d, 1, C * HW, NULL, ith, nth));
    return DL_OK;
}

dl_status dl_vae_decode(dl_vae_decoder *m, const float *latent, float *image) {
    const int64_t h0 = m->h0, w0 = m->w0, zc = m->zc;
    dl_status s;
    for (int64_t i = 0; i < zc * h0 * w0; i++)
        if (!isfinite(latent[i])) return dl_fail(DL_ERR_INVALID, "VAE decoder: latent is not finite at %lld", (long long)i);
    DL_PAR(dl_convert_t(m->dt, m->b, DL_F32, latent, zc * h0 * w0, ith, nth));
    if (m->pq) {
        if ((s = dl_conv_run(m->pq, m->b, m->c))) return s;
        memcpy(m->b, m->c, (size_t)(zc * h0 * w0) * dl_dtype_size(m->dt));
    }
    if ((s = dl_conv_run(m->cin, m->b, m->a))) return s;
    if ((s = resnet_run(m, &m->res[0], m->a, m->b, m->c))) return s;
    if (m->has_attn && (s = attn_run(m, m->a, m->b))) return s;
    if ((s = resnet_run(m, &m->res[1], m->a, m->b, m->c))) return s;
    int ri = 2;
    int64_t h = h0, w = w0;
    for (int i = 0; i < m->levels; i++) {
        for (int j = 0; j <= m->lpb; j++)
            if ((s = resnet_run(m, &m->res[ri++], m->a, m->b, m->c))) return s;
        if (i < m->levels - 1) {
            int64_t c = m->res[ri - 1].cout;
            DL_PAR(dl_upsample2x_t(m->dt, m->b, m->a, c, h, w, ith, nth));
            h *= 2, w *= 2;
            if ((s = dl_conv_run(m->up[i], m->b, m->a))) return s;
        }
    }
    DL_PAR(dl_groupnorm_t(m->dt, m->b, m->a, m->c_last, h * w, m->groups, m->gow, m->gob, 1e-6f, 1, ith, nth));
    if ((s = dl_conv_run(m->cout, m->b, m->c))) return s;
    DL_PAR(dl_convert_t(DL_F32, image, m->dt, m->c, 3 * h * w, ith, nth));
    return DL_OK;
}
