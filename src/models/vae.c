/* AutoencoderKL (diffusers), channels-first activations [C, H, W].
 * decoder:
 *   z -> post_quant_conv? -> conv_in -> mid(resnet, attention, resnet)
 *     -> up blocks (layers_per_block + 1 resnets, then nearest 2x + conv except last)
 *     -> GroupNorm + SiLU -> conv_out                                   // [3, H, W]
 * encoder:
 *   x [3, H, W] -> conv_in -> down blocks (layers_per_block resnets, then zero pad
 *     right/bottom by 1 + 3x3 conv stride 2, except the last) -> mid(resnet,
 *     attention, resnet) -> GroupNorm + SiLU -> conv_out [2z] -> quant_conv?
 *     -> the posterior's mean (first z channels)                        // [z, h, w]
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

/* what the encoder and decoder share: dtype, groups, the mid-block attention and
 * its buffers */
typedef struct {
    dl_dtype dt;
    int64_t groups;
    attn_blk att;
    int has_attn;
    void *d;         /* max C*H*W (dt) */
    void *t1, *t2;   /* attention: tokens x channels, tokens x 3C (dt) */
    float *tf, *tf2; /* [HW, C] f32 projection output and its transpose */
    void *scratch;
} vae_core;

/* the configuration both halves read */
typedef struct {
    int64_t zc, lpb, groups, outc, inc;
    int64_t ch[8];
    int levels, quant, post_quant, mid_attn;
    double scaling, shift;
} vae_cfg;

struct dl_vae_decoder {
    vae_core k;
    int64_t zc, h0, w0;
    int levels, lpb;
    double scaling, shift;
    dl_conv *pq, *cin, *cout;
    resnet *res; /* mid.0, mid.1, then the up blocks' resnets in order */
    int nres;
    dl_conv **up; /* one per upsampling level */
    float *gow, *gob;
    int64_t c_last; /* channels before conv_out */
    int64_t out_h, out_w;
    void *a, *b, *c; /* activation buffers, each max C*H*W (dt) */
    void *arena;     /* one block holding every buffer above */
    size_t maxel;
};

struct dl_vae_encoder {
    vae_core k;
    int64_t zc, in_h, in_w, lat_h, lat_w, top;
    int levels, lpb;
    double scaling, shift;
    dl_conv *cin, *cout, *qc;
    resnet *res; /* the down blocks' resnets in order, then mid.0, mid.1 */
    int nres;
    dl_conv **down; /* one per downsampling level */
    float *gow, *gob;
    void *a, *b, *c; /* activation buffers, each max C*H*W (dt; the padded input of a downsampler included) */
    void *arena;
};

int64_t dl_vae_latent_channels(const dl_vae_decoder *m) { return m->zc; }
int64_t dl_vae_encoder_latent_channels(const dl_vae_encoder *m) { return m->zc; }
int dl_vae_scale(const dl_vae_decoder *m) { return 1 << (m->levels - 1); }
double dl_vae_scaling_factor(const dl_vae_decoder *m) { return m->scaling; }
double dl_vae_shift_factor(const dl_vae_decoder *m) { return m->shift; }

static void resnet_free(resnet *r) {
    free(r->g1w), free(r->g1b), free(r->g2w), free(r->g2b);
    dl_conv_free(r->c1), dl_conv_free(r->c2), dl_conv_free(r->sc);
}

static void core_free(vae_core *k) {
    free(k->att.gw), free(k->att.gb);
    dl_lin_free(&k->att.qkv), dl_lin_free(&k->att.out);
}

void dl_vae_decoder_free(dl_vae_decoder *m) {
    if (!m) return;
    for (int i = 0; m->res && i < m->nres; i++) resnet_free(&m->res[i]);
    for (int i = 0; m->up && i < m->levels - 1; i++) dl_conv_free(m->up[i]);
    free(m->res), free(m->up);
    dl_conv_free(m->pq), dl_conv_free(m->cin), dl_conv_free(m->cout);
    core_free(&m->k);
    free(m->gow), free(m->gob);
    dl_aligned_free(m->arena);
    free(m);
}

void dl_vae_encoder_free(dl_vae_encoder *m) {
    if (!m) return;
    for (int i = 0; m->res && i < m->nres; i++) resnet_free(&m->res[i]);
    for (int i = 0; m->down && i < m->levels - 1; i++) dl_conv_free(m->down[i]);
    free(m->res), free(m->down);
    dl_conv_free(m->cin), dl_conv_free(m->cout), dl_conv_free(m->qc);
    core_free(&m->k);
    free(m->gow), free(m->gob);
    dl_aligned_free(m->arena);
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

/* the configuration cfg (read from `file`; both halves read the same keys) */
static dl_status cfg_parse(const cJSON *cfg, const char *file, vae_cfg *v) {
    dl_status s;
    const char *act;
    const cJSON *boc = cJSON_GetObjectItemCaseSensitive(cfg, "block_out_channels");
    if ((s = dl_cfg_int(cfg, file, "latent_channels", 4, &v->zc)) || (s = dl_cfg_int(cfg, file, "layers_per_block", 1, &v->lpb)) ||
        (s = dl_cfg_int(cfg, file, "norm_num_groups", 32, &v->groups)) || (s = dl_cfg_int(cfg, file, "out_channels", 3, &v->outc)) ||
        (s = dl_cfg_int(cfg, file, "in_channels", 3, &v->inc)) ||
        (s = dl_cfg_float(cfg, file, "scaling_factor", 0.18215, &v->scaling)) ||
        (s = dl_cfg_float(cfg, file, "shift_factor", 0.0, &v->shift)) ||
        (s = dl_cfg_bool(cfg, file, "use_post_quant_conv", 1, &v->post_quant)) ||
        (s = dl_cfg_bool(cfg, file, "use_quant_conv", 1, &v->quant)) ||
        (s = dl_cfg_bool(cfg, file, "mid_block_add_attention", 1, &v->mid_attn)) ||
        (s = dl_cfg_str(cfg, file, "act_fn", "silu", &act)))
        return s;
    if (strcmp(act, "silu")) return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: act_fn \"%s\" is not supported (silu)", file, act);
    if (!cJSON_IsArray(boc) || cJSON_GetArraySize(boc) < 1 || cJSON_GetArraySize(boc) > 8)
        return dl_fail(DL_ERR_FORMAT, "`%s`: block_out_channels must list 1 to 8 channel counts", file);
    v->levels = cJSON_GetArraySize(boc);
    for (int i = 0; i < v->levels; i++) {
        const cJSON *it = cJSON_GetArrayItem(boc, i);
        v->ch[i] = cJSON_IsNumber(it) ? (int64_t)it->valuedouble : 0;
        if (v->ch[i] <= 0 || v->groups <= 0 || v->ch[i] % v->groups)
            return dl_fail(DL_ERR_FORMAT, "`%s`: block_out_channels[%d] = %lld is not a positive multiple of norm_num_groups %lld",
                           file, i, (long long)v->ch[i], (long long)v->groups);
    }
    if (v->lpb <= 0 || v->lpb > 16 || v->zc <= 0 || v->outc != 3 || v->inc != 3)
        return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: layers_per_block %lld, latent_channels %lld, in/out channels %lld/%lld "
                       "(RGB images: 3) are not supported", file, (long long)v->lpb, (long long)v->zc, (long long)v->inc,
                       (long long)v->outc);
    return DL_OK;
}

/* the configuration of `component` */
static dl_status cfg_read(dl_model_dir *dir, const char *component, vae_cfg *v) {
    char file[512];
    snprintf(file, sizeof file, "%s/config.json", component);
    const cJSON *cfg;
    dl_status s = dl_model_dir_config(dir, component, &cfg);
    return s != DL_OK ? s : cfg_parse(cfg, file, v);
}

/* the mid block's single-head attention `<half>.mid_block.attentions.0.` over h x w
 * tokens of `top` channels */
static dl_status attn_load(vae_core *k, dl_wsrc *ck, const char *half, int64_t top, int64_t h, int64_t w) {
    char pa[192], q[3][256], qb[3][256], o[256], ob[256], g[256];
    snprintf(pa, sizeof pa, "%s.mid_block.attentions.0.", half);
    snprintf(q[0], 256, "%sto_q.weight", pa), snprintf(q[1], 256, "%sto_k.weight", pa), snprintf(q[2], 256, "%sto_v.weight", pa);
    snprintf(qb[0], 256, "%sto_q.bias", pa), snprintf(qb[1], 256, "%sto_k.bias", pa), snprintf(qb[2], 256, "%sto_v.bias", pa);
    snprintf(o, 256, "%sto_out.0.weight", pa), snprintf(ob, 256, "%sto_out.0.bias", pa);
    snprintf(g, 256, "%sgroup_norm", pa);
    const char *wn[3] = {q[0], q[1], q[2]}, *bn[3] = {qb[0], qb[1], qb[2]}, *on[1] = {o}, *obn[1] = {ob};
    int64_t parts[3] = {top, top, top};
    k->att.c = top, k->att.h = h, k->att.w = w;
    dl_status s;
    if ((s = gn_load(ck, g, top, &k->att.gw, &k->att.gb)) ||
        (s = dl_lin_load(&k->att.qkv, ck, wn, bn, 3, parts, h * w, top, k->dt, k->dt, DL_ACT_NONE)) ||
        (s = dl_lin_load(&k->att.out, ck, on, obn, 1, &top, h * w, top, k->dt, DL_F32, DL_ACT_NONE)))
        return s;
    return DL_OK;
}

/* the shared buffers: d (maxel elements) and the attention's over HW tokens of C channels */
static void core_plan(act_plan *pl, vae_core *k, size_t maxel, int64_t HW, int64_t C) {
    size_t es = dl_dtype_size(k->dt);
    dl_plan_add(pl, &k->d, maxel * es, 1, 1);
    dl_plan_add(pl, &k->t1, (size_t)(HW * C) * es, 1, 1);
    dl_plan_add(pl, &k->t2, (size_t)(HW * 3 * C) * es, 1, 1);
    dl_plan_add(pl, &k->tf, (size_t)(HW * C) * 4, 1, 1);
    dl_plan_add(pl, &k->tf2, (size_t)(HW * C) * 4, 1, 1);
    dl_plan_attn_scratch(pl, &k->scratch, k->dt, HW, 1, C, 0, 1, 1);
}

dl_status dl_vae_decoder_load(dl_vae_decoder **out, dl_model_dir *dir, const char *component, int64_t lat_h,
                              int64_t lat_w, dl_dtype dt, dl_wsrc *src) {
    char file[512];
    snprintf(file, sizeof file, "%s/config.json", component);
    const cJSON *cfg;
    *out = NULL;
    dl_status s = dl_model_dir_config(dir, component, &cfg);
    if (s != DL_OK) return s;
    return dl_vae_decoder_load_from(out, dir, component, cfg, file, "", lat_h, lat_w, dt, src);
}

dl_status dl_vae_decoder_load_from(dl_vae_decoder **out, dl_model_dir *dir, const char *component,
                                   const struct cJSON *cfg, const char *file, const char *prefix, int64_t lat_h,
                                   int64_t lat_w, dl_dtype dt, dl_wsrc *src) {
    *out = NULL;
    char p[256], n[256];
    vae_cfg v;
    dl_status s = cfg_parse(cfg, file, &v);
    if (s != DL_OK) return s;
    if (lat_h <= 0 || lat_w <= 0) return dl_fail(DL_ERR_INVALID, "VAE decoder: bad latent size %lldx%lld", (long long)lat_h, (long long)lat_w);
    dl_vae_decoder *m = calloc(1, sizeof *m);
    if (!m) return dl_fail(DL_ERR_NOMEM, "out of memory");
    dl_wsrc *ck = NULL;
    m->zc = v.zc, m->levels = v.levels, m->lpb = (int)v.lpb, m->scaling = v.scaling, m->shift = v.shift;
    m->k.groups = v.groups, m->k.dt = dt, m->k.has_attn = v.mid_attn;
    m->h0 = lat_h, m->w0 = lat_w;
    if ((s = dl_ws_open(&ck, src, dir, component)) != DL_OK) goto fail;
    const int64_t top = v.ch[m->levels - 1];
    if (v.post_quant &&
        (s = vconv(&m->pq, ck, dl_pname(n, sizeof n, prefix, "post_quant_conv"), m->zc, m->zc, 1, lat_h, lat_w, dt)))
        goto fail;
    if ((s = vconv(&m->cin, ck, dl_pname(n, sizeof n, prefix, "decoder.conv_in"), m->zc, top, 3, lat_h, lat_w, dt)))
        goto fail;
    m->nres = 2 + m->levels * (m->lpb + 1);
    m->res = calloc((size_t)m->nres, sizeof *m->res);
    m->up = calloc((size_t)m->levels, sizeof *m->up);
    if (!m->res || !m->up) {
        s = dl_fail(DL_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (int i = 0; i < 2; i++) {
        dl_pname(n, sizeof n, prefix, "decoder.mid_block.resnets.%d.", i);
        if ((s = resnet_load(&m->res[i], ck, n, top, top, lat_h, lat_w, dt))) goto fail;
    }
    if (v.mid_attn && (s = attn_load(&m->k, ck, dl_pname(n, sizeof n, prefix, "decoder"), top, lat_h, lat_w))) goto fail;
    /* up blocks: channels reversed; each but the last doubles the size */
    int64_t h = lat_h, w = lat_w, prev = top;
    size_t maxel = (size_t)(top * h * w);
    int ri = 2;
    for (int i = 0; i < m->levels; i++) {
        int64_t oc = v.ch[m->levels - 1 - i];
        for (int j = 0; j <= m->lpb; j++) {
            dl_pname(p, sizeof p, prefix, "decoder.up_blocks.%d.resnets.%d.", i, j);
            if ((s = resnet_load(&m->res[ri++], ck, p, j == 0 ? prev : oc, oc, h, w, dt))) goto fail;
        }
        prev = oc;
        if ((size_t)(oc * h * w) > maxel) maxel = (size_t)(oc * h * w);
        if (i < m->levels - 1) {
            h *= 2, w *= 2;
            dl_pname(p, sizeof p, prefix, "decoder.up_blocks.%d.upsamplers.0.conv", i);
            if ((s = vconv(&m->up[i], ck, p, oc, oc, 3, h, w, dt))) goto fail;
            if ((size_t)(oc * h * w) > maxel) maxel = (size_t)(oc * h * w);
        }
    }
    m->nres = ri;
    m->c_last = prev;
    m->out_h = h, m->out_w = w;
    if ((s = gn_load(ck, dl_pname(n, sizeof n, prefix, "decoder.conv_norm_out"), prev, &m->gow, &m->gob)) ||
        (s = vconv(&m->cout, ck, dl_pname(p, sizeof p, prefix, "decoder.conv_out"), prev, 3, 3, h, w, dt)))
        goto fail;
    size_t es = dl_dtype_size(dt);
    if ((size_t)(3 * h * w) > maxel) maxel = (size_t)(3 * h * w);
    m->maxel = maxel;
    act_plan pl = {0};
    dl_plan_add(&pl, &m->a, maxel * es, 0, 2);
    dl_plan_add(&pl, &m->b, maxel * es, 0, 2);
    dl_plan_add(&pl, &m->c, maxel * es, 0, 2);
    core_plan(&pl, &m->k, maxel, lat_h * lat_w, top);
    if ((s = dl_plan_commit(&pl, ck, &m->arena)) != DL_OK) goto fail;
    dl_ws_close(ck);
    *out = m;
    return DL_OK;
fail:
    dl_ws_close(ck);
    dl_vae_decoder_free(m);
    return s;
}

dl_status dl_vae_encoder_load(dl_vae_encoder **out, dl_model_dir *dir, const char *component, int64_t height,
                              int64_t width, dl_dtype dt, dl_wsrc *src) {
    *out = NULL;
    char p[128];
    vae_cfg v;
    dl_status s = cfg_read(dir, component, &v);
    if (s != DL_OK) return s;
    const int64_t scale = (int64_t)1 << (v.levels - 1);
    if (height <= 0 || width <= 0 || height % scale || width % scale)
        return dl_fail(DL_ERR_INVALID, "VAE encoder: image size %lldx%lld is not a positive multiple of the VAE's %lld",
                       (long long)width, (long long)height, (long long)scale);
    dl_vae_encoder *m = calloc(1, sizeof *m);
    if (!m) return dl_fail(DL_ERR_NOMEM, "out of memory");
    dl_wsrc *ck = NULL;
    m->zc = v.zc, m->levels = v.levels, m->lpb = (int)v.lpb, m->scaling = v.scaling, m->shift = v.shift;
    m->k.groups = v.groups, m->k.dt = dt, m->k.has_attn = v.mid_attn;
    m->in_h = height, m->in_w = width, m->lat_h = height / scale, m->lat_w = width / scale;
    m->top = v.ch[m->levels - 1];
    if ((s = dl_ws_open(&ck, src, dir, component)) != DL_OK) goto fail;
    m->nres = m->levels * m->lpb + 2;
    m->res = calloc((size_t)m->nres, sizeof *m->res);
    m->down = calloc((size_t)m->levels, sizeof *m->down);
    if (!m->res || !m->down) {
        s = dl_fail(DL_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if ((s = vconv(&m->cin, ck, "encoder.conv_in", 3, v.ch[0], 3, height, width, dt))) goto fail;
    int64_t h = height, w = width, prev = v.ch[0];
    size_t maxel = (size_t)(3 * h * w);
    if ((size_t)(prev * h * w) > maxel) maxel = (size_t)(prev * h * w);
    int ri = 0;
    for (int i = 0; i < m->levels; i++) {
        int64_t oc = v.ch[i];
        for (int j = 0; j < m->lpb; j++) {
            snprintf(p, sizeof p, "encoder.down_blocks.%d.resnets.%d.", i, j);
            if ((s = resnet_load(&m->res[ri++], ck, p, j == 0 ? prev : oc, oc, h, w, dt))) goto fail;
        }
        prev = oc;
        if ((size_t)(oc * h * w) > maxel) maxel = (size_t)(oc * h * w);
        if (i < m->levels - 1) { /* Downsample2D(padding=0): F.pad(x, (0, 1, 0, 1)), then the stride-2 conv */
            dl_conv_desc d = {.ndim = 2, .cin = oc, .cout = oc, .in = {h + 1, w + 1}, .kernel = {3, 3}, .stride = {2, 2},
                              .pad = {0, 0}, .dt = dt};
            snprintf(p, sizeof p, "encoder.down_blocks.%d.downsamplers.0.conv", i);
            if ((s = dl_conv_load(&m->down[i], ck, p, &d))) goto fail;
            if ((size_t)(oc * (h + 1) * (w + 1)) > maxel) maxel = (size_t)(oc * (h + 1) * (w + 1));
            h /= 2, w /= 2;
        }
    }
    const int64_t top = m->top;
    if ((s = resnet_load(&m->res[ri++], ck, "encoder.mid_block.resnets.0.", top, top, h, w, dt)) ||
        (s = resnet_load(&m->res[ri++], ck, "encoder.mid_block.resnets.1.", top, top, h, w, dt)))
        goto fail;
    if (v.mid_attn && (s = attn_load(&m->k, ck, "encoder", top, h, w))) goto fail;
    if ((s = gn_load(ck, "encoder.conv_norm_out", top, &m->gow, &m->gob)) ||
        (s = vconv(&m->cout, ck, "encoder.conv_out", top, 2 * m->zc, 3, h, w, dt)) ||
        (v.quant && (s = vconv(&m->qc, ck, "quant_conv", 2 * m->zc, 2 * m->zc, 1, h, w, dt))))
        goto fail;
    if ((size_t)(2 * m->zc * h * w) > maxel) maxel = (size_t)(2 * m->zc * h * w);
    size_t es = dl_dtype_size(dt);
    act_plan pl = {0};
    dl_plan_add(&pl, &m->a, maxel * es, 0, 2);
    dl_plan_add(&pl, &m->b, maxel * es, 0, 2);
    dl_plan_add(&pl, &m->c, maxel * es, 0, 2);
    core_plan(&pl, &m->k, maxel, h * w, top);
    if ((s = dl_plan_commit(&pl, ck, &m->arena)) != DL_OK) goto fail;
    dl_ws_close(ck);
    *out = m;
    return DL_OK;
fail:
    dl_ws_close(ck);
    dl_vae_encoder_free(m);
    return s;
}

/* resnet on x (in place): uses t and u as scratch */
static dl_status resnet_run(vae_core *k, resnet *r, void *x, void *t, void *u) {
    const int64_t S = r->h * r->w;
    dl_status s;
    DL_PAR(dl_groupnorm_t(k->dt, t, x, r->cin, S, k->groups, r->g1w, r->g1b, 1e-6f, 1, ith, nth));
    if ((s = dl_conv_run(r->c1, t, u))) return s;
    DL_PAR(dl_groupnorm_t(k->dt, u, u, r->cout, S, k->groups, r->g2w, r->g2b, 1e-6f, 1, ith, nth));
    if ((s = dl_conv_run(r->c2, u, t))) return s; /* t = h */
    if (r->sc) {
        if ((s = dl_conv_run(r->sc, x, u))) return s;
        DL_PAR(dl_gated_residual_t(k->dt, u, t, 1, r->cout * S, NULL, ith, nth));
        memcpy(x, u, (size_t)(r->cout * S) * dl_dtype_size(k->dt));
    } else {
        DL_PAR(dl_gated_residual_t(k->dt, x, t, 1, r->cout * S, NULL, ith, nth));
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

static dl_status attn_run(vae_core *k, void *x, void *t) {
    attn_blk *a = &k->att;
    const int64_t C = a->c, HW = a->h * a->w;
    const size_t es = dl_dtype_size(k->dt);
    dl_status s;
    DL_PAR(dl_groupnorm_t(k->dt, t, x, C, HW, k->groups, a->gw, a->gb, 1e-6f, 0, ith, nth));
    transpose(k->t1, t, C, HW, es); /* tokens x channels */
    if ((s = lin_run(&a->qkv, k->t1, k->t2))) return s;
    dl_attn_args at = {.dt = k->dt, .sq = HW, .sk = HW, .heads = 1, .head_dim = C, .q = k->t2,
                       .k = (char *)k->t2 + (size_t)C * es, .v = (char *)k->t2 + (size_t)(2 * C) * es,
                       .q_stride = 3 * C, .k_stride = 3 * C, .v_stride = 3 * C, .out = k->t1, .out_stride = C,
                       .kv_begin = 0, .kv_end = HW, .scale = 1.f / sqrtf((float)C)};
    DL_PAR(dl_attn_t(&at, k->scratch, ith, nth));
    if ((s = lin_run(&a->out, k->t1, k->tf))) return s;
    /* x += tf^T, in x's dtype */
    transpose(k->tf2, k->tf, HW, C, 4);
    DL_PAR(dl_convert_t(k->dt, k->d, DL_F32, k->tf2, C * HW, ith, nth));
    DL_PAR(dl_gated_residual_t(k->dt, x, k->d, 1, C * HW, NULL, ith, nth));
    return DL_OK;
}

dl_status dl_vae_decode(dl_vae_decoder *m, const float *latent, float *image) {
    const int64_t h0 = m->h0, w0 = m->w0, zc = m->zc;
    const dl_dtype dt = m->k.dt;
    dl_status s;
    for (int64_t i = 0; i < zc * h0 * w0; i++)
        if (!isfinite(latent[i])) return dl_fail(DL_ERR_INVALID, "VAE decoder: latent is not finite at %lld", (long long)i);
    DL_PAR(dl_convert_t(dt, m->b, DL_F32, latent, zc * h0 * w0, ith, nth));
    if (m->pq) {
        if ((s = dl_conv_run(m->pq, m->b, m->c))) return s;
        memcpy(m->b, m->c, (size_t)(zc * h0 * w0) * dl_dtype_size(dt));
    }
    if ((s = dl_conv_run(m->cin, m->b, m->a))) return s;
    if ((s = resnet_run(&m->k, &m->res[0], m->a, m->b, m->c))) return s;
    if (m->k.has_attn && (s = attn_run(&m->k, m->a, m->b))) return s;
    if ((s = resnet_run(&m->k, &m->res[1], m->a, m->b, m->c))) return s;
    int ri = 2;
    int64_t h = h0, w = w0;
    for (int i = 0; i < m->levels; i++) {
        for (int j = 0; j <= m->lpb; j++)
            if ((s = resnet_run(&m->k, &m->res[ri++], m->a, m->b, m->c))) return s;
        if (i < m->levels - 1) {
            int64_t c = m->res[ri - 1].cout;
            DL_PAR(dl_upsample2x_t(dt, m->b, m->a, c, h, w, ith, nth));
            h *= 2, w *= 2;
            if ((s = dl_conv_run(m->up[i], m->b, m->a))) return s;
        }
    }
    DL_PAR(dl_groupnorm_t(dt, m->b, m->a, m->c_last, h * w, m->k.groups, m->gow, m->gob, 1e-6f, 1, ith, nth));
    if ((s = dl_conv_run(m->cout, m->b, m->c))) return s;
    DL_PAR(dl_convert_t(DL_F32, image, dt, m->c, 3 * h * w, ith, nth));
    return DL_OK;
}

/* [C, h, w] -> [C, h + 1, w + 1], the extra row and column zero */
static void pad_br(dl_dtype dt, void *dst, const void *src, int64_t C, int64_t h, int64_t w) {
    const size_t es = dl_dtype_size(dt);
    DL_PAR({
        int64_t c0, c1;
        dl_split(C, ith, nth, &c0, &c1);
        for (int64_t c = c0; c < c1; c++) {
            char *d = (char *)dst + (size_t)(c * (h + 1) * (w + 1)) * es;
            const char *sp = (const char *)src + (size_t)(c * h * w) * es;
            for (int64_t y = 0; y < h; y++) {
                memcpy(d + (size_t)(y * (w + 1)) * es, sp + (size_t)(y * w) * es, (size_t)w * es);
                memset(d + (size_t)(y * (w + 1) + w) * es, 0, es);
            }
            memset(d + (size_t)(h * (w + 1)) * es, 0, (size_t)(w + 1) * es);
        }
    });
}

dl_status dl_vae_encode(dl_vae_encoder *m, const float *image, float *latent) {
    const int64_t H = m->in_h, W = m->in_w;
    const dl_dtype dt = m->k.dt;
    dl_status s;
    for (int64_t i = 0; i < 3 * H * W; i++)
        if (!isfinite(image[i])) return dl_fail(DL_ERR_INVALID, "VAE encoder: image is not finite at %lld", (long long)i);
    DL_PAR(dl_convert_t(dt, m->b, DL_F32, image, 3 * H * W, ith, nth));
    if ((s = dl_conv_run(m->cin, m->b, m->a))) return s;
    int ri = 0;
    int64_t h = H, w = W;
    for (int i = 0; i < m->levels; i++) {
        for (int j = 0; j < m->lpb; j++)
            if ((s = resnet_run(&m->k, &m->res[ri++], m->a, m->b, m->c))) return s;
        if (i < m->levels - 1) {
            pad_br(dt, m->b, m->a, m->res[ri - 1].cout, h, w);
            if ((s = dl_conv_run(m->down[i], m->b, m->a))) return s;
            h /= 2, w /= 2;
        }
    }
    if ((s = resnet_run(&m->k, &m->res[ri], m->a, m->b, m->c))) return s;
    if (m->k.has_attn && (s = attn_run(&m->k, m->a, m->b))) return s;
    if ((s = resnet_run(&m->k, &m->res[ri + 1], m->a, m->b, m->c))) return s;
    DL_PAR(dl_groupnorm_t(dt, m->b, m->a, m->top, h * w, m->k.groups, m->gow, m->gob, 1e-6f, 1, ith, nth));
    if ((s = dl_conv_run(m->cout, m->b, m->c))) return s;
    void *moments = m->c;
    if (m->qc) {
        if ((s = dl_conv_run(m->qc, m->c, m->b))) return s;
        moments = m->b;
    }
    /* the mean: the first z of the 2z moment channels */
    DL_PAR(dl_convert_t(DL_F32, latent, dt, moments, m->zc * h * w, ith, nth));
    return DL_OK;
}
