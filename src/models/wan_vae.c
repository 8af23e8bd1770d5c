/* AutoencoderKLWan decoder (diffusers 0.42, the Wan 2.1 video VAE; also AutoencoderKLQwenImage,
 * the same decoder Qwen-Image runs on one frame), channels-first
 * activations [C, T, H, W] (T frames of one chunk).
 *
 *   z: [z_dim, F, h, w] -> for each latent frame i (a chunk):
 *     post_quant_conv (1x1x1) -> conv_in -> mid(res, attn, res)
 *     -> up blocks (num_res_blocks + 1 res, then resample but the last)
 *     -> RMS norm + SiLU -> conv_out -> frames appended; clamp to [-1, 1]
 *   dims = base * [dim_mult[-1]] + base * reversed(dim_mult); up block b maps
 *     dims[b] (halved for b > 0: the previous resample halves channels) -> dims[b + 1]
 *   causal conv (k_t = 3): out[t] = sum_k W_k in[t + k - 2] over the whole stream of
 *     input frames, zeros before the first; per chunk its input is
 *     [last two input frames of the stream so far | this chunk's frames]: the cache
 *   RMS norm (channel first): x / max(||x[:, pos]||_2, 1e-12) * sqrt(C) * gamma[c]
 *   res: h = conv2(SiLU(N2(conv1(SiLU(N1(x)))))); out = shortcut(x) + h
 *     (shortcut: causal 1x1x1 conv when in != out channels, else identity)
 *   attn (per frame, one head over H*W tokens of width C):
 *     x + proj(softmax(q k^T / sqrt(C)) v), q | k | v = to_qkv(N(x)) (1x1 convs)
 *   upsample2d: per frame nearest 2x, conv 3x3 C -> C/2
 *   upsample3d: time_conv (3x1x1 causal, C -> 2C), frame t -> frames 2t (channels
 *     [0, C)) and 2t + 1 ([C, 2C)); then as upsample2d. The first chunk skips the
 *     time_conv (diffusers marks its cache "Rep"); its stream starts at chunk 1.
 *
 * Diffusers' feature cache keeps, per causal conv, the last CACHE_T = 2 input frames
 * (prepending the previous cache's last frame when a chunk has one frame); a missing
 * cache (first chunk) or a one-frame cache is zero padded on the past side. That is
 * exactly the stream form above, so each cache here is [cin, 2, H, W], zeroed when a
 * decode starts. A chunk has one frame at every level in the first chunk and
 * 2^(temporal upsamplings so far) after it; each conv is built once, for the later
 * chunks' count (tc). The first chunk runs those convs over tc frames of which the
 * first is real and discards the rest: at most one chunk's worth of extra work per
 * video, instead of a second copy of every packed weight. Attention, resample and
 * norms touch only the real frames. */
#include <cjson/cJSON.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "difflet/wan_vae.h"
#include "models/models_impl.h"

enum { MAX_LEVELS = 8 };

/* A causal convolution and its feature cache. */
typedef struct {
    dl_conv *c;      /* [cin, 2 + tc, h, w] -> [cout, tc, h, w]; kernel (kt, ks, ks), no time padding */
    void *cache;     /* [cin, 2, h * w] dt: the stream's last two input frames */
    size_t cache_off; /* its offset in the cache block */
    int64_t cin, cout, tc, hw;
} cconv;

typedef struct {
    int64_t cin, cout, lv; /* channels; level (size and frame count) */
    float *g1, *g2;        /* [cin], [cout]: RMS norm gammas */
    cconv c1, c2;          /* 3x3x3: cin -> cout, cout -> cout */
    dl_conv *sc;           /* 1x1x1 [cin, tc, hw] -> [cout, tc, hw] when cin != cout */
} wres;

typedef struct {
    int mode3d;
    int64_t c, lv; /* input channels and level (the output is at level lv + 1) */
    cconv tconv;   /* upsample3d: 3x1x1, [c, 2 + tc, hw] -> [2c, tc, hw] */
    dl_conv *conv; /* per frame [c, 2h, 2w] -> [c / 2, 2h, 2w] */
} wup;

typedef struct {
    int64_t h, w, hw, tc; /* size; frames per chunk after the first */
} level;

struct dl_wan_vae {
    dl_dtype dt;
    int64_t zd, F, nrb;       /* z_dim, latent frames, num_res_blocks */
    int nlev, st, ss, clip;   /* levels (len(dim_mult)), temporal and spatial scale, clamp */
    level lev[MAX_LEVELS];    /* level l: latent size * 2^l */
    float *mean, *std;        /* [zd] */
    dl_conv *pq;              /* post_quant_conv 1x1x1: [zd, 1, h0, w0] -> same */
    cconv cin;                /* conv_in: zd -> dims[0] */
    wres *res;                /* mid.0, mid.1, then each up block's resnets */
    int nres;
    int64_t ac;               /* attention width dims[0] */
    float *ag;                /* [ac] attention RMS gamma */
    dl_conv *qkv, *proj;      /* 1x1 2-D: [ac, h0, w0] -> [3 ac, ...], [ac, ...] -> [ac, ...] */
    wup *up;                  /* nlev - 1 */
    float *gout;              /* [c_last] */
    int64_t c_last;
    cconv cout;               /* conv_out: c_last -> 3 */
    cconv **ccs;              /* every causal conv with a cache */
    int ncc, ccap;
    /* activations (one arena, all live through a chunk) */
    float *x;                 /* f32 stream [C, tc, hw] of the current level */
    void *p;                  /* dt: padded conv input [C, 2 + tc, hw]; per-frame temporaries */
    void *y;                  /* dt: conv output [C, tc, hw] */
    void *s;                  /* dt: shortcut output, resample output, transposed qkv */
    float *nrm;               /* [tc * hw] f32: inverse norms */
    void *ascr;               /* attention scratch */
    void *arena, *caches;
    size_t arena_bytes, cache_bytes;
};

int64_t dl_wan_vae_z_dim(const dl_wan_vae *m) { return m->zd; }
int dl_wan_vae_scale_spatial(const dl_wan_vae *m) { return m->ss; }
int dl_wan_vae_scale_temporal(const dl_wan_vae *m) { return m->st; }
int64_t dl_wan_vae_frames(const dl_wan_vae *m) { return 1 + (m->F - 1) * m->st; }
const float *dl_wan_vae_latents_mean(const dl_wan_vae *m) { return m->mean; }
const float *dl_wan_vae_latents_std(const dl_wan_vae *m) { return m->std; }
size_t dl_wan_vae_activation_bytes(const dl_wan_vae *m) { return m->arena_bytes + m->cache_bytes; }

void dl_wan_vae_free(dl_wan_vae *m) {
    if (!m) return;
    for (int i = 0; m->res && i < m->nres; i++) {
        wres *r = &m->res[i];
        free(r->g1), free(r->g2);
        dl_conv_free(r->c1.c), dl_conv_free(r->c2.c), dl_conv_free(r->sc);
    }
    for (int i = 0; m->up && i < m->nlev - 1; i++) dl_conv_free(m->up[i].tconv.c), dl_conv_free(m->up[i].conv);
    free(m->res), free(m->up), free(m->ccs);
    dl_conv_free(m->pq), dl_conv_free(m->cin.c), dl_conv_free(m->cout.c);
    dl_conv_free(m->qkv), dl_conv_free(m->proj);
    free(m->ag), free(m->gout), free(m->mean), free(m->std);
    dl_aligned_free(m->arena), dl_aligned_free(m->caches);
    free(m);
}

/* ---- loading ---------------------------------------------------------------------- */

/* The largest buffer each activation needs, in elements, grown while loading. */
typedef struct {
    size_t x, p, y, s, nrm;
} need;
#define GROW(f, v) (nd->f = nd->f > (size_t)(v) ? nd->f : (size_t)(v))

/* causal conv `base`: kernel (kt, ks, ks), at level lv */
static dl_status cconv_load(dl_wan_vae *m, cconv *cc, dl_wsrc *ws, const char *base, int64_t cin, int64_t cout,
                            int64_t kt, int64_t ks, const level *lv, need *nd) {
    dl_conv_desc d = {.ndim = 3, .cin = cin, .cout = cout, .in = {2 + lv->tc, lv->h, lv->w}, .kernel = {kt, ks, ks},
                      .stride = {1, 1, 1}, .pad = {0, ks / 2, ks / 2}, .dt = m->dt};
    cc->cin = cin, cc->cout = cout, cc->tc = lv->tc, cc->hw = lv->hw;
    DL_ASSERT(m->ncc < m->ccap);
    m->ccs[m->ncc++] = cc;
    cc->cache_off = m->cache_bytes;
    m->cache_bytes += dl_align_up((size_t)(cin * 2 * lv->hw) * dl_dtype_size(m->dt), DL_ALIGN);
    GROW(p, cin * (2 + lv->tc) * lv->hw);
    GROW(y, cout * lv->tc * lv->hw);
    return dl_conv_load(&cc->c, ws, base, &d);
}

/* RMS gamma `<base>.gamma`: [c, 1, 1, 1] (3-D) or [c, 1, 1] (per-frame 2-D) */
static dl_status gamma_load(dl_wsrc *ws, const char *base, int64_t c, int ndim, float **g) {
    char n[300];
    int64_t sh[4] = {c, 1, 1, 1};
    snprintf(n, sizeof n, "%s.gamma", base);
    return dl_param_f32(ws, n, ndim, sh, g);
}

static dl_status res_load(dl_wan_vae *m, wres *r, dl_wsrc *ws, const char *pre, int64_t cin, int64_t cout, int lv,
                          need *nd) {
    char n[300];
    const level *L = &m->lev[lv];
    dl_status s;
    r->cin = cin, r->cout = cout, r->lv = lv;
#define N(x) dl_pname(n, sizeof n, pre, "%s", x)
    if ((s = gamma_load(ws, N("norm1"), cin, 4, &r->g1)) || (s = gamma_load(ws, N("norm2"), cout, 4, &r->g2)) ||
        (s = cconv_load(m, &r->c1, ws, N("conv1"), cin, cout, 3, 3, L, nd)) ||
        (s = cconv_load(m, &r->c2, ws, N("conv2"), cout, cout, 3, 3, L, nd)))
        return s;
    GROW(x, (cin > cout ? cin : cout) * L->tc * L->hw);
    GROW(nrm, L->tc * L->hw);
    if (cin != cout) {
        dl_conv_desc d = {.ndim = 3, .cin = cin, .cout = cout, .in = {L->tc, L->h, L->w}, .kernel = {1, 1, 1},
                          .stride = {1, 1, 1}, .dt = m->dt};
        GROW(p, cin * L->tc * L->hw);
        GROW(s, cout * L->tc * L->hw);
        return dl_conv_load(&r->sc, ws, N("conv_shortcut"), &d);
    }
    if (dl_ws_find(ws, N("conv_shortcut.weight")))
        return dl_fail(DL_ERR_FORMAT, "`%s`: unexpected %s (in and out channels are equal)", dl_ws_label(ws), n);
#undef N
    return DL_OK;
}

/* config array `key` of 1..MAX_LEVELS numbers (or bools) into v; *n its length */
static dl_status cfg_list(const cJSON *cfg, const char *file, const char *key, int bools, int64_t *v, int *n) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) > MAX_LEVELS)
        return dl_fail(DL_ERR_FORMAT, "`%s`: \"%s\" must be a list of at most %d %s", file, key, MAX_LEVELS,
                       bools ? "booleans" : "integers");
    *n = cJSON_GetArraySize(a);
    for (int i = 0; i < *n; i++) {
        const cJSON *e = cJSON_GetArrayItem(a, i);
        if (bools ? !cJSON_IsBool(e) : (!cJSON_IsNumber(e) || e->valuedouble != (double)(int64_t)e->valuedouble))
            return dl_fail(DL_ERR_FORMAT, "`%s`: \"%s\"[%d] must be %s", file, key, i, bools ? "true or false" : "an integer");
        v[i] = bools ? cJSON_IsTrue(e) : (int64_t)e->valuedouble;
    }
    return DL_OK;
}

/* latents_mean / latents_std: z_dim numbers (absent: diffusers' defaults, 16 of them) */
static dl_status cfg_floats(const cJSON *cfg, const char *file, const char *key, const float *def, int64_t n,
                            float **out) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (!(*out = malloc((size_t)n * sizeof **out))) return dl_fail(DL_ERR_NOMEM, "out of memory");
    if (!a || cJSON_IsNull(a)) {
        if (n != 16) return dl_fail(DL_ERR_FORMAT, "`%s`: \"%s\" is missing (the default has 16 entries, z_dim is %lld)", file, key, (long long)n);
        memcpy(*out, def, 16 * sizeof **out);
        return DL_OK;
    }
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != n)
        return dl_fail(DL_ERR_FORMAT, "`%s`: \"%s\" must list z_dim = %lld numbers", file, key, (long long)n);
    for (int i = 0; i < n; i++) {
        const cJSON *e = cJSON_GetArrayItem(a, i);
        if (!cJSON_IsNumber(e)) return dl_fail(DL_ERR_FORMAT, "`%s`: \"%s\"[%d] must be a number", file, key, i);
        (*out)[i] = (float)e->valuedouble;
    }
    return DL_OK;
}

static const float k_mean[16] = {-0.7571f, -0.7089f, -0.9113f, 0.1075f,  -0.1745f, 0.9653f, -0.1517f, 1.5508f,
                                 0.4134f,  -0.0715f, 0.5517f,  -0.3632f, -0.1922f, -0.9497f, 0.2503f, -0.2921f};
static const float k_std[16] = {2.8184f, 1.4541f, 2.3275f, 2.6558f, 1.2196f, 1.7708f, 2.6052f, 2.0743f,
                                3.2687f, 2.1526f, 2.8652f, 1.5579f, 1.6382f, 1.1253f, 2.8251f, 1.9160f};

/* The config: sizes into m, channel plan into dims[nlev + 1], temporal upsampling per up block into tup. */
static dl_status read_config(dl_wan_vae *m, const cJSON *cfg, const char *file, int64_t *dims, int64_t *tup) {
    dl_status s;
    int64_t base, dbase, outc, patch, sft, sfs, mult[MAX_LEVELS], tdown[MAX_LEVELS];
    int nm, nt, resid, clip;
    const char *cls;
    if ((s = dl_cfg_str(cfg, file, "_class_name", "AutoencoderKLWan", &cls))) return s;
    /* AutoencoderKLQwenImage is this decoder (non-residual), with `input_channels` for
     * the output and no scale_factor_* fields (the pipeline derives them) */
    const int qwen = !strcmp(cls, "AutoencoderKLQwenImage");
    if (strcmp(cls, "AutoencoderKLWan") && !qwen)
        return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: _class_name \"%s\" is not AutoencoderKLWan or AutoencoderKLQwenImage", file, cls);
    if ((s = dl_cfg_int(cfg, file, "base_dim", 96, &base)) || (s = dl_cfg_int(cfg, file, "decoder_base_dim", base, &dbase)) ||
        (s = dl_cfg_int(cfg, file, "z_dim", 16, &m->zd)) || (s = dl_cfg_int(cfg, file, "num_res_blocks", 2, &m->nrb)) ||
        (s = dl_cfg_int(cfg, file, qwen ? "input_channels" : "out_channels", 3, &outc)) ||
        (s = dl_cfg_int(cfg, file, "patch_size", 0, &patch)) ||
        (s = dl_cfg_int(cfg, file, "scale_factor_temporal", 4, &sft)) ||
        (s = dl_cfg_int(cfg, file, "scale_factor_spatial", 8, &sfs)) || (s = dl_cfg_bool(cfg, file, "is_residual", 0, &resid)) ||
        (s = dl_cfg_bool(cfg, file, "clip_output", 1, &clip)) || (s = cfg_list(cfg, file, "dim_mult", 0, mult, &nm)) ||
        (s = cfg_list(cfg, file, "temperal_downsample", 1, tdown, &nt)))
        return s;
    if (resid)
        return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: is_residual true (the Wan 2.2 VAE: residual up blocks) is not supported", file);
    if (patch > 1)
        return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: patch_size %lld is not supported (null)", file, (long long)patch);
    if (outc != 3) return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: out_channels %lld is not supported (3)", file, (long long)outc);
    if (dbase <= 0 || m->zd <= 0 || m->nrb < 0 || m->nrb > 16 || nm < 1)
        return dl_fail(DL_ERR_FORMAT, "`%s`: needs positive base_dim and z_dim, num_res_blocks in [0, 16], a non-empty dim_mult", file);
    if (nt < nm - 1)
        return dl_fail(DL_ERR_FORMAT, "`%s`: temperal_downsample has %d entries, dim_mult needs %d", file, nt, nm - 1);
    m->nlev = nm;
    m->clip = clip;
    dims[0] = dbase * mult[nm - 1];
    for (int i = 0; i < nm; i++) {
        dims[i + 1] = dbase * mult[nm - 1 - i];
        if (mult[i] <= 0 || (i < nm - 1 && dbase * mult[i] % 2))
            return dl_fail(DL_ERR_FORMAT, "`%s`: dim_mult[%d] = %lld gives no even, positive channel count", file, i, (long long)mult[i]);
    }
    m->st = 1;
    for (int i = 0; i < nm - 1; i++) { /* temperal_upsample = temperal_downsample[::-1] */
        tup[i] = tdown[nt - 1 - i];
        if (tup[i]) m->st *= 2;
    }
    m->ss = 1 << (nm - 1);
    if (qwen) /* no such fields: the decoder's own */
        sft = m->st, sfs = m->ss;
    if (sft != m->st || sfs != m->ss)
        return dl_fail(DL_ERR_FORMAT, "`%s`: scale_factor_temporal %lld / scale_factor_spatial %lld, but the decoder upsamples %dx / %dx",
                       file, (long long)sft, (long long)sfs, m->st, m->ss);
    if ((s = cfg_floats(cfg, file, "latents_mean", k_mean, m->zd, &m->mean)) ||
        (s = cfg_floats(cfg, file, "latents_std", k_std, m->zd, &m->std)))
        return s;
    return DL_OK;
}

dl_status dl_wan_vae_load(dl_wan_vae **out, dl_model_dir *dir, const char *component, int64_t lat_frames,
                          int64_t lat_h, int64_t lat_w, dl_dtype dt, dl_wsrc *src) {
    *out = NULL;
    char file[512], p[160];
    snprintf(file, sizeof file, "%s/config.json", component);
    if (lat_frames < 1 || lat_frames > 4096 || lat_h < 1 || lat_w < 1 || lat_h * lat_w > (1 << 22))
        return dl_fail(DL_ERR_INVALID, "Wan VAE: latent %lld x %lld x %lld is out of range", (long long)lat_frames,
                       (long long)lat_h, (long long)lat_w);
    if (dt != DL_F32 && dt != DL_BF16)
        return dl_fail(DL_ERR_UNSUPPORTED, "Wan VAE: dtype %s is not supported (f32, bf16)", dl_dtype_name(dt));
    const cJSON *cfg;
    dl_status s = dl_model_dir_config(dir, component, &cfg);
    if (s != DL_OK) return s;
    dl_wan_vae *m = calloc(1, sizeof *m);
    if (!m) return dl_fail(DL_ERR_NOMEM, "out of memory");
    dl_wsrc *ws = NULL;
    int64_t dims[MAX_LEVELS + 1], tup[MAX_LEVELS];
    need nds = {0}, *nd = &nds;
    m->dt = dt, m->F = lat_frames;
    if ((s = read_config(m, cfg, file, dims, tup))) goto fail;
    /* levels: sizes double per up block; frames per later chunk double after each temporal upsampling */
    for (int l = 0; l < m->nlev; l++) {
        level *L = &m->lev[l];
        L->h = lat_h << l, L->w = lat_w << l, L->hw = L->h * L->w;
        L->tc = l == 0 ? 1 : m->lev[l - 1].tc * (tup[l - 1] && lat_frames > 1 ? 2 : 1);
    }
    m->nres = 2 + m->nlev * (int)(m->nrb + 1);
    m->ccap = 2 + 2 * m->nres + m->nlev;
    m->res = calloc((size_t)m->nres, sizeof *m->res);
    m->up = calloc((size_t)m->nlev, sizeof *m->up);
    m->ccs = calloc((size_t)m->ccap, sizeof *m->ccs);
    if (!m->res || !m->up || !m->ccs) {
        s = dl_fail(DL_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if ((s = dl_ws_open(&ws, src, dir, component)) != DL_OK) goto fail;
    const level *L0 = &m->lev[0];
    const int64_t zd = m->zd, d0 = dims[0];
    {
        dl_conv_desc d = {.ndim = 3, .cin = zd, .cout = zd, .in = {1, lat_h, lat_w}, .kernel = {1, 1, 1},
                          .stride = {1, 1, 1}, .dt = dt};
        if ((s = dl_conv_load(&m->pq, ws, "post_quant_conv", &d))) goto fail;
        GROW(s, zd * L0->hw);
        if ((s = cconv_load(m, &m->cin, ws, "decoder.conv_in", zd, d0, 3, 3, L0, nd))) goto fail;
        GROW(x, d0 * L0->hw);
    }
    if ((s = res_load(m, &m->res[0], ws, "decoder.mid_block.resnets.0.", d0, d0, 0, nd)) ||
        (s = res_load(m, &m->res[1], ws, "decoder.mid_block.resnets.1.", d0, d0, 0, nd)))
        goto fail;
    { /* mid attention: one frame of [d0, h0, w0] at a time */
        const int64_t C = d0, HW = L0->hw;
        dl_conv_desc q = {.ndim = 2, .cin = C, .cout = 3 * C, .in = {lat_h, lat_w}, .kernel = {1, 1}, .stride = {1, 1}, .dt = dt};
        dl_conv_desc o = q;
        o.cout = C;
        m->ac = C;
        if ((s = gamma_load(ws, "decoder.mid_block.attentions.0.norm", C, 3, &m->ag)) ||
            (s = dl_conv_load(&m->qkv, ws, "decoder.mid_block.attentions.0.to_qkv", &q)) ||
            (s = dl_conv_load(&m->proj, ws, "decoder.mid_block.attentions.0.proj", &o)))
            goto fail;
        GROW(p, C * HW);
        GROW(y, 3 * C * HW);
        GROW(s, 3 * C * HW);
    }
    int ri = 2;
    for (int b = 0; b < m->nlev; b++) {
        const level *L = &m->lev[b];
        const int64_t cin = b > 0 ? dims[b] / 2 : dims[b], oc = dims[b + 1];
        for (int j = 0; j <= m->nrb; j++) {
            snprintf(p, sizeof p, "decoder.up_blocks.%d.resnets.%d.", b, j);
            if ((s = res_load(m, &m->res[ri++], ws, p, j == 0 ? cin : oc, oc, b, nd))) goto fail;
        }
        if (b == m->nlev - 1) break;
        wup *u = &m->up[b];
        const level *L2 = &m->lev[b + 1];
        u->mode3d = (int)tup[b], u->c = oc, u->lv = b;
        if (u->mode3d) {
            snprintf(p, sizeof p, "decoder.up_blocks.%d.upsamplers.0.time_conv", b);
            if ((s = cconv_load(m, &u->tconv, ws, p, oc, 2 * oc, 3, 1, L, nd))) goto fail;
        } else {
            snprintf(p, sizeof p, "decoder.up_blocks.%d.upsamplers.0.time_conv.weight", b);
            if (dl_ws_find(ws, p)) {
                s = dl_fail(DL_ERR_FORMAT, "`%s`: unexpected %s (temperal_downsample says this level is 2-D)", dl_ws_label(ws), p);
                goto fail;
            }
        }
        dl_conv_desc d = {.ndim = 2, .cin = oc, .cout = oc / 2, .in = {L2->h, L2->w}, .kernel = {3, 3},
                          .stride = {1, 1}, .pad = {1, 1}, .dt = dt};
        snprintf(p, sizeof p, "decoder.up_blocks.%d.upsamplers.0.resample.1", b);
        if ((s = dl_conv_load(&u->conv, ws, p, &d))) goto fail;
        GROW(y, oc * L->tc * L->hw);
        GROW(p, oc * L2->hw);
        GROW(s, oc / 2 * L2->hw);
        GROW(x, oc / 2 * L2->tc * L2->hw);
    }
    m->nres = ri;
    m->c_last = dims[m->nlev];
    const level *LL = &m->lev[m->nlev - 1];
    if ((s = gamma_load(ws, "decoder.norm_out", m->c_last, 4, &m->gout)) ||
        (s = cconv_load(m, &m->cout, ws, "decoder.conv_out", m->c_last, 3, 3, 3, LL, nd)))
        goto fail;
    /* the buffers: every one is live through a whole chunk */
    const size_t es = dl_dtype_size(dt);
    act_plan pl = {0};
    dl_plan_add(&pl, &m->x, nd->x * 4, 0, 0);
    dl_plan_add(&pl, &m->p, nd->p * es, 0, 0);
    dl_plan_add(&pl, &m->y, nd->y * es, 0, 0);
    dl_plan_add(&pl, &m->s, nd->s * es, 0, 0);
    dl_plan_add(&pl, &m->nrm, nd->nrm * 4, 0, 0);
    dl_plan_attn_scratch(&pl, &m->ascr, dt, L0->hw, 1, m->ac, 0, 0, 0);
    if ((s = dl_plan_commit(&pl, ws, &m->arena)) != DL_OK) goto fail;
    m->arena_bytes = pl.total;
    memset(m->arena, 0, pl.total); /* frames past a first chunk's one are read (never used): keep them defined */
    if (!(m->caches = dl_ws_alloc(ws, m->cache_bytes))) {
        s = dl_fail(DL_ERR_NOMEM, "cannot allocate %zu bytes of feature caches", m->cache_bytes);
        goto fail;
    }
    for (int i = 0; i < m->ncc; i++) m->ccs[i]->cache = (char *)m->caches + m->ccs[i]->cache_off;
    dl_ws_close(ws);
    *out = m;
    return DL_OK;
fail:
    dl_ws_close(ws);
    dl_wan_vae_free(m);
    return s;
}
#undef GROW

/* ---- running ---------------------------------------------------------------------- */


/* dst[c, 0:n) = src[c, 0:n) converted, C channels; channel strides ldd, lds (elements) */
static void copy_ch(dl_dtype ddt, void *dst, int64_t ldd, dl_dtype sdt, const void *src, int64_t lds, int64_t C,
                    int64_t n) {
    const size_t de = dl_dtype_size(ddt), se = dl_dtype_size(sdt);
    DL_PAR({
        int64_t c0, c1;
        dl_split(C, ith, nth, &c0, &c1);
        for (int64_t c = c0; c < c1; c++)
            dl_convert_t(ddt, (char *)dst + (size_t)(c * ldd) * de, sdt, (const char *)src + (size_t)(c * lds) * se, n, 0, 1);
    });
}

/* x[c, 0:n) = (add ? x : 0) + a[c, 0:n) (+ b[c, 0:n)); x f32 (stride ldx), a and b dt (stride lda) */
static void accum(float *x, int64_t ldx, dl_dtype dt, const void *a, const void *b, int64_t lda, int64_t C, int64_t n,
                  int add) {
    DL_PAR({
        int64_t c0, c1;
        dl_split(C, ith, nth, &c0, &c1);
        for (int64_t c = c0; c < c1; c++) {
            float *xr = x + c * ldx;
            for (int64_t i = 0; i < n; i++) {
                float v = dl_ld(dt, a, c * lda + i) + (b ? dl_ld(dt, b, c * lda + i) : 0.f);
                xr[i] = add ? xr[i] + v : v;
            }
        }
    });
}

/* y[c, s] = act(x[c, s] / max(||x[:, s]||, 1e-12) * sqrt(C) * g[c]) for s in [0, S): the
 * channel-first RMS norm; x (xdt) and y (the model's dtype) with channel strides ldx, ldy */
static void rms_norm(dl_wan_vae *m, void *y, int64_t ldy, dl_dtype xdt, const void *x, int64_t ldx, int64_t C,
                     int64_t S, const float *g, int silu) {
    const dl_dtype dt = m->dt;
    const float sc = sqrtf((float)C);
    float *inv = m->nrm;
    DL_PAR({
        int64_t s0, s1;
        dl_split(S, ith, nth, &s0, &s1);
        for (int64_t i = s0; i < s1; i++) inv[i] = 0.f;
        for (int64_t c = 0; c < C; c++)
            for (int64_t i = s0; i < s1; i++) {
                float v = dl_ld(xdt, x, c * ldx + i);
                inv[i] += v * v;
            }
        for (int64_t i = s0; i < s1; i++) inv[i] = 1.f / fmaxf(sqrtf(inv[i]), 1e-12f);
        for (int64_t c = 0; c < C; c++) {
            const float gc = sc * g[c];
            for (int64_t i = s0; i < s1; i++) {
                float v = dl_ld(xdt, x, c * ldx + i) * inv[i] * gc;
                dl_st(dt, y, c * ldy + i, silu ? v / (1.f + expf(-v)) : v);
            }
        }
    });
}

/* The causal conv over [cache | T frames in p]: p's frames [2, 2 + T) are set by the
 * caller; output y [cout, tc, hw] (frames [0, T) real). The cache becomes the last two
 * frames of [cache | chunk]. */
static dl_status cconv_run(dl_wan_vae *m, cconv *cc, int64_t T) {
    const size_t es = dl_dtype_size(m->dt), fb = (size_t)(2 * cc->hw) * es;
    const int64_t ld = (2 + cc->tc) * cc->hw, C = cc->cin, hw = cc->hw;
    char *p = m->p, *cache = cc->cache;
    DL_PAR({
        int64_t c0, c1;
        dl_split(C, ith, nth, &c0, &c1);
        for (int64_t c = c0; c < c1; c++) memcpy(p + (size_t)(c * ld) * es, cache + (size_t)c * fb, fb);
    });
    dl_status s = dl_conv_run(cc->c, m->p, m->y);
    DL_PAR({
        int64_t c0, c1;
        dl_split(C, ith, nth, &c0, &c1);
        for (int64_t c = c0; c < c1; c++) memcpy(cache + (size_t)c * fb, p + (size_t)(c * ld + T * hw) * es, fb);
    });
    return s;
}

/* where a norm writes a cached conv's input: frame 2 of p, channel stride (2 + tc) hw */
static void *p_in(dl_wan_vae *m, const cconv *cc) { return (char *)m->p + (size_t)(2 * cc->hw) * dl_dtype_size(m->dt); }

/* residual block on the stream x [cin, tc, hw] (T real frames) -> [cout, tc, hw] in place */
static dl_status res_run(dl_wan_vae *m, wres *r, float *x, int64_t T) {
    const level *L = &m->lev[r->lv];
    const int64_t ld = L->tc * L->hw, n = T * L->hw, ldp = (2 + L->tc) * L->hw;
    dl_status s;
    if (r->sc) { /* h = shortcut(x) into s */
        const void *in = x;
        if (m->dt != DL_F32) copy_ch(m->dt, m->p, ld, DL_F32, x, ld, r->cin, ld), in = m->p;
        if ((s = dl_conv_run(r->sc, in, m->s))) return s;
    }
    rms_norm(m, p_in(m, &r->c1), ldp, DL_F32, x, ld, r->cin, n, r->g1, 1);
    if ((s = cconv_run(m, &r->c1, T))) return s;
    rms_norm(m, p_in(m, &r->c2), ldp, m->dt, m->y, ld, r->cout, n, r->g2, 1);
    if ((s = cconv_run(m, &r->c2, T))) return s;
    accum(x, ld, m->dt, m->y, r->sc ? m->s : NULL, ld, r->cout, n, !r->sc);
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

/* mid attention on the stream x [C, tc, hw] at level 0, frame by frame */
static dl_status attn_run(dl_wan_vae *m, float *x, int64_t T) {
    const level *L = &m->lev[0];
    const int64_t C = m->ac, HW = L->hw, ld = L->tc * HW;
    const size_t es = dl_dtype_size(m->dt);
    dl_status s;
    for (int64_t t = 0; t < T; t++) {
        float *xt = x + t * HW;
        rms_norm(m, m->p, HW, DL_F32, xt, ld, C, HW, m->ag, 0); /* p: [C, HW] */
        if ((s = dl_conv_run(m->qkv, m->p, m->y))) return s;  /* y: [3C, HW] */
        transpose(m->s, m->y, 3 * C, HW, es);                 /* s: [HW, 3C], q | k | v */
        dl_attn_args at = {.dt = m->dt, .sq = HW, .sk = HW, .heads = 1, .head_dim = C, .q = m->s,
                           .k = (char *)m->s + (size_t)C * es, .v = (char *)m->s + (size_t)(2 * C) * es,
                           .q_stride = 3 * C, .k_stride = 3 * C, .v_stride = 3 * C, .out = m->p, .out_stride = C,
                           .kv_begin = 0, .kv_end = HW, .scale = 1.f / sqrtf((float)C)};
        DL_PAR(dl_attn_t(&at, m->ascr, ith, nth));              /* p: [HW, C] */
        transpose(m->y, m->p, HW, C, es);                       /* y: [C, HW] */
        if ((s = dl_conv_run(m->proj, m->y, m->p))) return s;   /* p: [C, HW] */
        accum(xt, ld, m->dt, m->p, NULL, HW, C, HW, 1);
    }
    return DL_OK;
}

/* dst [C, 2h, 2w] (dt) = nearest 2x of src [C, h, w] (sdt, channel stride lds) */
static void up2x(dl_dtype dt, void *dst, dl_dtype sdt, const void *src, int64_t lds, int64_t C, int64_t h, int64_t w) {
    DL_PAR({
        int64_t r0, r1;
        dl_split(C * h, ith, nth, &r0, &r1);
        for (int64_t r = r0; r < r1; r++) {
            const int64_t c = r / h, i = r % h, so = c * lds + i * w, d0 = (c * 2 * h + 2 * i) * 2 * w;
            for (int64_t j = 0; j < w; j++) {
                float v = dl_ld(sdt, src, so + j);
                dl_st(dt, dst, d0 + 2 * j, v), dl_st(dt, dst, d0 + 2 * j + 1, v);
                dl_st(dt, dst, d0 + 2 * w + 2 * j, v), dl_st(dt, dst, d0 + 2 * w + 2 * j + 1, v);
            }
        }
    });
}

/* resample: the stream x [C, tc, hw] (T real frames) at level lv -> x [C/2, tc', 4 hw] at
 * lv + 1. Its frames go to y first (the time_conv's output, or a copy), so x is free
 * for the larger output. */
static dl_status up_run(dl_wan_vae *m, wup *u, float *x, int64_t *T, int first) {
    const level *L = &m->lev[u->lv], *L2 = &m->lev[u->lv + 1];
    const int64_t C = u->c, ld = L->tc * L->hw, ld2 = L2->tc * L2->hw;
    const size_t es = dl_dtype_size(m->dt);
    int64_t nt = *T, half = 0;
    dl_status s;
    if (u->mode3d && !first) { /* time_conv: frame t -> frames 2t (channels [0, C)), 2t + 1 ([C, 2C)) */
        copy_ch(m->dt, p_in(m, &u->tconv), (2 + L->tc) * L->hw, DL_F32, x, ld, C, *T * L->hw);
        if ((s = cconv_run(m, &u->tconv, *T))) return s; /* y: [2C, tc, hw] */
        nt = 2 * *T, half = C * ld;
    } else {
        copy_ch(m->dt, m->y, ld, DL_F32, x, ld, C, *T * L->hw); /* y: [C, tc, hw] */
    }
    for (int64_t t = 0; t < nt; t++) {
        const int64_t off = half ? (t & 1) * half + (t >> 1) * L->hw : t * L->hw;
        up2x(m->dt, m->p, m->dt, (const char *)m->y + (size_t)off * es, ld, C, L->h, L->w); /* p: [C, 2h, 2w] */
        if ((s = dl_conv_run(u->conv, m->p, m->s))) return s;                                  /* s: [C/2, 4 hw] */
        accum(x + t * L2->hw, ld2, m->dt, m->s, NULL, L2->hw, C / 2, L2->hw, 0);
    }
    *T = nt;
    return DL_OK;
}

/* latent frame i -> its video frames */
static dl_status chunk_run(dl_wan_vae *m, const float *z, int64_t i, float *video) {
    const level *L0 = &m->lev[0];
    const int64_t zd = m->zd, hw0 = L0->hw;
    float *x = m->x;
    int64_t T = 1;
    dl_status s;
    copy_ch(m->dt, m->s, hw0, DL_F32, z + i * hw0, m->F * hw0, zd, hw0); /* s: [zd, hw0] */
    if ((s = dl_conv_run(m->pq, m->s, m->y))) return s;
    copy_ch(m->dt, p_in(m, &m->cin), 3 * hw0, m->dt, m->y, hw0, zd, hw0);
    if ((s = cconv_run(m, &m->cin, 1))) return s;
    accum(x, hw0, m->dt, m->y, NULL, hw0, m->cin.cout, hw0, 0); /* x: [d0, 1, hw0] */
    if ((s = res_run(m, &m->res[0], x, T)) || (s = attn_run(m, x, T)) || (s = res_run(m, &m->res[1], x, T))) return s;
    int ri = 2;
    for (int b = 0; b < m->nlev; b++) {
        for (int j = 0; j <= m->nrb; j++)
            if ((s = res_run(m, &m->res[ri++], x, T))) return s;
        if (b < m->nlev - 1 && (s = up_run(m, &m->up[b], x, &T, i == 0))) return s;
    }
    const level *L = &m->lev[m->nlev - 1];
    const int64_t ld = L->tc * L->hw, n = T * L->hw;
    rms_norm(m, p_in(m, &m->cout), (2 + L->tc) * L->hw, DL_F32, x, ld, m->c_last, n, m->gout, 1);
    if ((s = cconv_run(m, &m->cout, T))) return s; /* y: [3, tc, hw] */
    const int64_t nf = dl_wan_vae_frames(m), f0 = i == 0 ? 0 : 1 + (i - 1) * m->st;
    DL_ASSERT(f0 + T <= nf && T == (i == 0 ? 1 : m->st));
    const dl_dtype dt = m->dt;
    const void *y = m->y;
    const int clip = m->clip;
    DL_PAR({
        int64_t c0, c1;
        dl_split(3 * T, ith, nth, &c0, &c1);
        for (int64_t r = c0; r < c1; r++) {
            const int64_t c = r / T, t = r % T;
            float *o = video + (c * nf + f0 + t) * L->hw;
            for (int64_t k = 0; k < L->hw; k++) {
                float v = dl_ld(dt, y, c * ld + t * L->hw + k);
                o[k] = clip ? fminf(fmaxf(v, -1.f), 1.f) : v;
            }
        }
    });
    return DL_OK;
}

dl_status dl_wan_vae_decode(dl_wan_vae *m, const float *z, float *video,
                            void (*on_chunk)(void *ctx, int done, int total), void *ctx) {
    const int64_t n = m->zd * m->F * m->lev[0].hw;
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(z[i])) return dl_fail(DL_ERR_INVALID, "Wan VAE: latent is not finite at %lld", (long long)i);
    memset(m->caches, 0, m->cache_bytes); /* diffusers' clear_cache */
    for (int64_t i = 0; i < m->F; i++) {
        dl_status s = chunk_run(m, z, i, video);
        if (s != DL_OK) return s;
        if (on_chunk) on_chunk(ctx, (int)i + 1, (int)m->F);
    }
    return DL_OK;
}
