/* AutoencoderKLLTX2Video decoder (diffusers 0.42, the LTX-2 video VAE), channels-first
 * activations [C, T, H, W] of the whole clip.
 *
 *   vae.decode(z, temb): use_tiling and use_framewise_decoding are off by default, so
 *     one decoder pass over all F latent frames (the config's tile sizes and the
 *     spatial / temporal_compression_ratio keys only matter for tiling)
 *   decoder (lists "_r" are the config's reversed, as diffusers reverses them; n =
 *     len(decoder_block_out_channels) up blocks):
 *     conv_in zc -> c0 = boc_r[0]; t = temb * timestep_scale_multiplier
 *     mid block: lpb_r[0] resnets at c0 (time embedder 4 c0)
 *     up block i (oc: the previous block's "output_channel", c0 for i = 0; uf =
 *       upsample_factor_r[i]): inp = oc / uf, out = boc_r[i] / uf;
 *       inp != out: conv_in = a resnet inp -> out (takes the raw t; diffusers fails
 *         on that with timestep conditioning, so it is refused then);
 *       spatio_temporal_scaling_r[i]: upsampler (stride s = (2,2,2) | (1,2,2) |
 *         (2,1,1) by upsample_type[i], not reversed) out uf -> out;
 *       lpb_r[i + 1] resnets at out (time embedder 4 inp)
 *     RMS(x) [(1 + scale) + shift: time embedder 2 c_last + scale_shift_table] ->
 *       SiLU -> conv_out c_last -> out_channels p^2 -> unpatchify
 *   causal conv (k 3; decoder_causal): 2 copies of frame 0 before the clip; else one
 *     copy of frame 0 before and of the last frame after; spatial padding 1 pixel in
 *     decoder_spatial_padding_mode (nn.Conv3d's: zeros, reflect, replicate,
 *     circular); T frames in, T out
 *   RMS: PerChannelRMSNorm, per position x / sqrt(mean_c x^2 + 1e-8), no weights
 *   resnet (cin -> cout): h = conv1(SiLU(RMS(x) (1 + sc1) + sh1)); h = conv2(SiLU(
 *     RMS(h) (1 + sc2) + sh2)); out = h + (cin != cout ? conv_shortcut(LayerNorm_c(x))
 *     : x); sh1 | sc1 | sh2 | sc2 = the block's time embedding [4, C] +
 *     scale_shift_table [4, C] (without timestep conditioning: 0)
 *   time embedder: linear_2(SiLU(linear_1(Timesteps(256, flip_sin_to_cos)(t))))
 *   upsampler (C = out uf in, stride s, P = s0 s1 s2): y = conv(x) [out P, T, H, W];
 *     depth to space: y[co P + a s1 s2 + b s2 + d, t, i, j] -> (co, t s0 + a, i s1 + b,
 *     j s2 + d); the first s0 - 1 frames dropped (T -> T s0 - s0 + 1); residual: the
 *     same depth to space of x (C / P channels) tiled over P / uf copies of the
 *     channels, added
 *   unpatchify (p, pt): video[c, t pt + u, i p + v, j p + w] = y[c pt p p + u p p +
 *     w p + v, t, i, j] (diffusers' permute puts the first p index on width)
 *
 * Memory: the math is local in time (no norm has temporal statistics), so a
 * streaming decoder could hold a few frames per layer; this one holds the whole
 * clip at each level, as diffusers does: two f32 streams and three convolution
 * buffers of the largest level. Padding is built on the host (the conv input
 * [cin, T + 2, H + 2, W + 2] is written by a norm, then its borders filled) and
 * oneDNN runs each conv, built once at load, without padding. */
#include <cjson/cJSON.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "difflet/ltx2_vae.h"
#include "models/models_impl.h"

enum {
    MAX_BLOCKS = 8,
    MAX_LIST = 16,
    TPROJ = 256, /* Timesteps(256) */
};

typedef enum { PAD_ZEROS, PAD_REFLECT, PAD_REPLICATE, PAD_CIRCULAR } pad_mode;

typedef struct {
    int64_t t, h, w, hw; /* frames, size */
} level;

/* a 3x3x3 conv at level lv: padded [cin, t + 2, h + 2, w + 2] -> [cout, t, h, w] */
typedef struct {
    dl_conv *c;
    int lv;
    int64_t cin, cout;
} cconv;

/* time embedder: 256 -> d -> d (linear_1, SiLU, linear_2) */
typedef struct {
    int64_t d;
    float *w1, *b1, *w2, *b2; /* [d, 256], [d], [d, d], [d] */
    float *e;                 /* [d] the decode's embedding */
} tembed;

typedef struct {
    int64_t cin, cout;
    int lv;
    cconv c1, c2;        /* cin -> cout, cout -> cout */
    float *lnw, *lnb;    /* norm3 [cin] (cin != cout) */
    dl_conv *sc;         /* conv_shortcut 1x1x1 [cin, t, hw] -> [cout, t, hw] (cin != cout) */
    float *sst;          /* scale_shift_table [4, cin] (timestep conditioning) */
    const tembed *te;    /* its block's embedder (timestep conditioning) */
    float *mod;          /* [4, cin] shift1 | scale1 | shift2 | scale2 of the decode */
} lres;

typedef struct {
    int s[3], uf, residual;
    int64_t cin, cout; /* out uf, out */
    int lv;            /* input level */
    cconv conv;        /* cin -> out P */
} lup;

typedef struct {
    int64_t inp, out;   /* diffusers' in / out channels of the block */
    int conv_in;        /* a resnet inp -> out first */
    int up;             /* an upsampler */
    lup u;
    int64_t nres;       /* resnets after the upsampler */
    int r0;             /* index of its first resnet (conv_in's when present) in res[] */
    tembed te;
} lblock;

struct dl_ltx2_vae {
    dl_dtype dt;
    int64_t zc, F, oc, ps, pt, vc; /* latent channels, latent frames, out_channels, patch sizes, video channels */
    int nb, nlev, ss, ts, causal, tc;
    pad_mode pad;
    float sfac, eps, tmul;     /* scaling_factor, resnet_norm_eps, timestep_scale_multiplier */
    float *lmean, *lstd;       /* [zc] */
    level lev[MAX_BLOCKS + 1]; /* level l: after l upsamplers */
    cconv cin, cout;           /* conv_in zc -> c0; conv_out c_last -> oc p p */
    int64_t c0, c_last;
    int64_t nmid;              /* mid resnets (res[0, nmid)) */
    tembed mid_te, out_te;     /* 4 c0; 2 c_last */
    float *out_sst, *out_mod;  /* [2, c_last] scale_shift_table; shift | scale of the decode */
    lblock blk[MAX_BLOCKS];
    lres *res;
    int nres;
    /* activations (one arena, all live through the decode) */
    float *x, *x2; /* f32 streams [C, t, hw]; the upsampler writes x2, then they swap */
    void *p;       /* dt: padded conv input */
    void *y;       /* dt: conv output; LayerNorm output */
    void *s;       /* dt: shortcut output */
    float *tproj, *th; /* [256], [max d] time embedder scratch */
    void *arena;
    size_t arena_bytes;
};

int64_t dl_ltx2_vae_latent_channels(const dl_ltx2_vae *m) { return m->zc; }
int64_t dl_ltx2_vae_video_channels(const dl_ltx2_vae *m) { return m->vc; }
int dl_ltx2_vae_scale_spatial(const dl_ltx2_vae *m) { return m->ss; }
int dl_ltx2_vae_scale_temporal(const dl_ltx2_vae *m) { return m->ts; }
int64_t dl_ltx2_vae_frames(const dl_ltx2_vae *m) { return m->lev[m->nlev - 1].t * m->pt; }
float dl_ltx2_vae_scaling_factor(const dl_ltx2_vae *m) { return m->sfac; }
const float *dl_ltx2_vae_latents_mean(const dl_ltx2_vae *m) { return m->lmean; }
const float *dl_ltx2_vae_latents_std(const dl_ltx2_vae *m) { return m->lstd; }
int dl_ltx2_vae_timestep_conditioning(const dl_ltx2_vae *m) { return m->tc; }
size_t dl_ltx2_vae_activation_bytes(const dl_ltx2_vae *m) { return m->arena_bytes; }

static void tembed_free(tembed *t) { free(t->w1), free(t->b1), free(t->w2), free(t->b2), free(t->e); }

void dl_ltx2_vae_free(dl_ltx2_vae *m) {
    if (!m) return;
    for (int i = 0; m->res && i < m->nres; i++) {
        lres *r = &m->res[i];
        dl_conv_free(r->c1.c), dl_conv_free(r->c2.c), dl_conv_free(r->sc);
        free(r->lnw), free(r->lnb), free(r->sst), free(r->mod);
    }
    free(m->res);
    for (int b = 0; b < MAX_BLOCKS; b++) dl_conv_free(m->blk[b].u.conv.c), tembed_free(&m->blk[b].te);
    dl_conv_free(m->cin.c), dl_conv_free(m->cout.c);
    tembed_free(&m->mid_te), tembed_free(&m->out_te);
    free(m->out_sst), free(m->out_mod), free(m->lmean), free(m->lstd);
    dl_aligned_free(m->arena);
    free(m);
}

/* ---- the config ------------------------------------------------------------------- */

/* config list `key` (absent: the n_def defaults): integers in [lo, hi], or with bools
 * set, true / false values, a bare bool standing for `fill` copies (diffusers' rule) */
static dl_status cfg_list(const cJSON *cfg, const char *file, const char *key, int bools, int64_t lo, int64_t hi,
                          const int64_t *def, int n_def, int fill, int64_t *v, int *n) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (!a || cJSON_IsNull(a)) {
        memcpy(v, def, (size_t)n_def * sizeof *v);
        *n = n_def;
        return DL_OK;
    }
    if (bools && cJSON_IsBool(a)) {
        if (fill < 0 || fill > MAX_LIST)
            return dl_fail(DL_ERR_FORMAT, "`%s`: \"%s\" as one bool needs 1 to %d decoder blocks", file, key, MAX_LIST);
        for (int i = 0; i < fill; i++) v[i] = cJSON_IsTrue(a);
        *n = fill;
        return DL_OK;
    }
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) > MAX_LIST)
        return dl_fail(DL_ERR_FORMAT, "`%s`: \"%s\" must be a list of at most %d %s", file, key, MAX_LIST,
                       bools ? "bools" : "integers");
    *n = cJSON_GetArraySize(a);
    for (int i = 0; i < *n; i++) {
        const cJSON *e = cJSON_GetArrayItem(a, i);
        if (bools) {
            if (!cJSON_IsBool(e)) return dl_fail(DL_ERR_FORMAT, "`%s`: \"%s\"[%d] must be true or false", file, key, i);
            v[i] = cJSON_IsTrue(e);
        } else {
            if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble) || e->valuedouble < (double)lo ||
                e->valuedouble > (double)hi)
                return dl_fail(DL_ERR_FORMAT, "`%s`: \"%s\"[%d] must be an integer in [%lld, %lld]", file, key, i,
                               (long long)lo, (long long)hi);
            v[i] = (int64_t)e->valuedouble;
        }
    }
    return DL_OK;
}

/* reversed(list)[i], as diffusers' decoder reads its lists; -1: out of range */
static int64_t rev(const int64_t *v, int n, int i) { return i < n ? v[n - 1 - i] : -1; }

static dl_status need_len(const char *file, const char *key, int n, int want, const char *why) {
    if (n >= want) return DL_OK;
    return dl_fail(DL_ERR_FORMAT, "`%s`: \"%s\" has %d entries, diffusers' decoder reads %d (%s)", file, key, n, want, why);
}

/* The config: sizes and every block's structure into m. */
static dl_status read_config(dl_ltx2_vae *m, const cJSON *cfg, const char *file) {
    static const int64_t d_boc[] = {256, 512, 1024}, d_lpb[] = {5, 5, 5, 5}, d_sts[] = {1, 1, 1},
                         d_inj[] = {0, 0, 0, 0}, d_res[] = {1, 1, 1}, d_uf[] = {2, 2, 2};
    int64_t boc[MAX_LIST], lpb[MAX_LIST], sts[MAX_LIST], inj[MAX_LIST], res[MAX_LIST], uf[MAX_LIST];
    int nbo, nl, ns, ni, nr, nu, nt = 3;
    const char *cls, *pad, *ut[MAX_LIST] = {"spatiotemporal", "spatiotemporal", "spatiotemporal"};
    double sfac, eps;
    dl_status s;
    if ((s = dl_cfg_str(cfg, file, "_class_name", "AutoencoderKLLTX2Video", &cls))) return s;
    if (strcmp(cls, "AutoencoderKLLTX2Video"))
        return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: _class_name \"%s\" is not AutoencoderKLLTX2Video", file, cls);
    if ((s = dl_cfg_int(cfg, file, "latent_channels", 128, &m->zc)) || (s = dl_cfg_int(cfg, file, "out_channels", 3, &m->oc)) ||
        (s = dl_cfg_int(cfg, file, "patch_size", 4, &m->ps)) || (s = dl_cfg_int(cfg, file, "patch_size_t", 1, &m->pt)) ||
        (s = dl_cfg_float(cfg, file, "scaling_factor", 1.0, &sfac)) ||
        (s = dl_cfg_float(cfg, file, "resnet_norm_eps", 1e-6, &eps)) ||
        (s = dl_cfg_bool(cfg, file, "timestep_conditioning", 0, &m->tc)) ||
        (s = dl_cfg_bool(cfg, file, "decoder_causal", 1, &m->causal)) ||
        (s = dl_cfg_str(cfg, file, "decoder_spatial_padding_mode", "reflect", &pad)) ||
        (s = cfg_list(cfg, file, "decoder_block_out_channels", 0, 1, 65536, d_boc, 3, 0, boc, &nbo)) ||
        (s = cfg_list(cfg, file, "decoder_layers_per_block", 0, 0, 64, d_lpb, 4, 0, lpb, &nl)) ||
        (s = cfg_list(cfg, file, "decoder_spatio_temporal_scaling", 1, 0, 1, d_sts, 3, nl - 1, sts, &ns)) ||
        (s = cfg_list(cfg, file, "decoder_inject_noise", 1, 0, 1, d_inj, 4, nl, inj, &ni)) ||
        (s = cfg_list(cfg, file, "upsample_residual", 1, 0, 1, d_res, 3, nl - 1, res, &nr)) ||
        (s = cfg_list(cfg, file, "upsample_factor", 0, 1, 64, d_uf, 3, 0, uf, &nu)))
        return s;
    const cJSON *uta = cJSON_GetObjectItemCaseSensitive(cfg, "upsample_type");
    if (uta && !cJSON_IsNull(uta)) {
        if (!cJSON_IsArray(uta) || cJSON_GetArraySize(uta) > MAX_LIST)
            return dl_fail(DL_ERR_FORMAT, "`%s`: \"upsample_type\" must be a list of at most %d strings", file, MAX_LIST);
        nt = cJSON_GetArraySize(uta);
        for (int i = 0; i < nt; i++) {
            const cJSON *e = cJSON_GetArrayItem(uta, i);
            if (!cJSON_IsString(e)) return dl_fail(DL_ERR_FORMAT, "`%s`: \"upsample_type\"[%d] must be a string", file, i);
            ut[i] = e->valuestring;
        }
    }
    if (m->zc < 1 || m->zc > 4096 || m->oc < 1 || m->oc > 4096)
        return dl_fail(DL_ERR_FORMAT, "`%s`: needs latent_channels and out_channels in [1, 4096]", file);
    if (m->ps < 1 || m->ps > 64 || m->pt < 1 || m->pt > 64)
        return dl_fail(DL_ERR_FORMAT, "`%s`: needs patch_size and patch_size_t in [1, 64]", file);
    if (m->oc % m->pt)
        return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: patch_size_t %lld does not divide out_channels %lld (diffusers' unpatchify fails)",
                       file, (long long)m->pt, (long long)m->oc);
    m->vc = m->oc / m->pt;
    if (!(sfac > 0) || !isfinite(sfac)) return dl_fail(DL_ERR_FORMAT, "`%s`: scaling_factor must be positive", file);
    if (!(eps > 0) || !isfinite(eps)) return dl_fail(DL_ERR_FORMAT, "`%s`: resnet_norm_eps must be positive", file);
    m->sfac = (float)sfac, m->eps = (float)eps;
    if (!strcmp(pad, "zeros")) m->pad = PAD_ZEROS;
    else if (!strcmp(pad, "reflect")) m->pad = PAD_REFLECT;
    else if (!strcmp(pad, "replicate")) m->pad = PAD_REPLICATE;
    else if (!strcmp(pad, "circular")) m->pad = PAD_CIRCULAR;
    else
        return dl_fail(DL_ERR_UNSUPPORTED,
                       "`%s`: decoder_spatial_padding_mode \"%s\" is not supported (zeros, reflect, replicate, circular)", file, pad);
    if (nbo < 1 || nbo > MAX_BLOCKS)
        return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: decoder_block_out_channels has %d entries (1 to %d supported)", file, nbo,
                       MAX_BLOCKS);
    m->nb = nbo;
    if ((s = need_len(file, "decoder_layers_per_block", nl, nbo + 1, "the mid block, then one per up block")) ||
        (s = need_len(file, "decoder_spatio_temporal_scaling", ns, nbo, "one per up block")) ||
        (s = need_len(file, "decoder_inject_noise", ni, nbo + 1, "the mid block, then one per up block")) ||
        (s = need_len(file, "upsample_residual", nr, nbo, "one per up block")) ||
        (s = need_len(file, "upsample_factor", nu, nbo, "one per up block")) ||
        (s = need_len(file, "upsample_type", nt, nbo, "one per up block")))
        return s;
    for (int i = 0; i <= nbo; i++)
        if (rev(inj, ni, i) == 1)
            return dl_fail(DL_ERR_UNSUPPORTED,
                           "`%s`: decoder_inject_noise is not supported (diffusers draws that noise from torch's global "
                           "generator; %s sets it)",
                           file, i ? "an up block" : "the mid block");
    /* channels: `c` the stream's, `oc` diffusers' output_channel variable */
    int64_t oc = rev(boc, nbo, 0), c = oc;
    m->c0 = oc, m->nmid = rev(lpb, nl, 0), m->ss = (int)m->ps, m->ts = 1;
    int nres = (int)m->nmid;
    for (int i = 0; i < nbo; i++) {
        lblock *b = &m->blk[i];
        const int64_t f = rev(uf, nu, i);
        b->inp = oc / f, b->out = rev(boc, nbo, i) / f, b->nres = rev(lpb, nl, i + 1);
        if (b->inp < 1 || b->out < 1)
            return dl_fail(DL_ERR_FORMAT, "`%s`: up block %d has no channels (upsample_factor %lld over %lld)", file, i,
                           (long long)f, (long long)oc);
        b->conv_in = b->inp != b->out;
        if (b->conv_in && c != b->inp)
            return dl_fail(DL_ERR_FORMAT, "`%s`: up block %d receives %lld channels, its conv_in takes %lld (diffusers fails)",
                           file, i, (long long)c, (long long)b->inp);
        if (b->conv_in && m->tc)
            return dl_fail(DL_ERR_UNSUPPORTED,
                           "`%s`: up block %d has a conv_in (%lld -> %lld channels) with timestep_conditioning, which "
                           "diffusers cannot run",
                           file, i, (long long)b->inp, (long long)b->out);
        if (b->conv_in) c = b->out;
        b->r0 = nres;
        nres += b->conv_in + (int)b->nres;
        b->up = rev(sts, ns, i) == 1;
        if (b->up) {
            lup *u = &b->u;
            const char *t = ut[i];
            if (!strcmp(t, "spatiotemporal")) u->s[0] = u->s[1] = u->s[2] = 2;
            else if (!strcmp(t, "spatial")) u->s[0] = 1, u->s[1] = u->s[2] = 2;
            else if (!strcmp(t, "temporal")) u->s[0] = 2, u->s[1] = u->s[2] = 1;
            else
                return dl_fail(DL_ERR_UNSUPPORTED,
                               "`%s`: upsample_type[%d] \"%s\" is not supported (spatial, temporal, spatiotemporal)", file, i, t);
            const int64_t P = u->s[0] * u->s[1] * u->s[2];
            u->uf = (int)f, u->residual = rev(res, nr, i) == 1, u->cin = b->out * f, u->cout = b->out;
            if (c != u->cin)
                return dl_fail(DL_ERR_FORMAT, "`%s`: up block %d's upsampler takes %lld channels, it receives %lld (diffusers fails)",
                               file, i, (long long)u->cin, (long long)c);
            if (u->residual && (u->cin % P || P % f))
                return dl_fail(DL_ERR_FORMAT,
                               "`%s`: up block %d's residual upsampler needs its stride %lld to divide %lld channels and to be "
                               "a multiple of upsample_factor %lld (diffusers fails)",
                               file, i, (long long)P, (long long)u->cin, (long long)f);
            c = b->out;
            m->ss *= u->s[1], m->ts *= u->s[0];
        }
        if (c != b->out)
            return dl_fail(DL_ERR_FORMAT, "`%s`: up block %d's resnets take %lld channels, they receive %lld (diffusers fails)",
                           file, i, (long long)b->out, (long long)c);
        oc = b->out;
    }
    m->c_last = oc, m->nres = nres;
    return DL_OK;
}

/* ---- loading ---------------------------------------------------------------------- */

/* The largest buffer each activation needs, in elements, grown while loading. */
typedef struct {
    size_t x, p, y, s, d;
} need;
#define GROW(f, v) (nd->f = nd->f > (size_t)(v) ? nd->f : (size_t)(v))

static int64_t padded(const level *L) { return (L->t + 2) * (L->h + 2) * (L->w + 2); }

static dl_status cconv_load(dl_ltx2_vae *m, cconv *cc, dl_wsrc *ws, const char *base, int64_t cin, int64_t cout, int lv,
                            need *nd) {
    const level *L = &m->lev[lv];
    dl_conv_desc d = {.ndim = 3, .cin = cin, .cout = cout, .in = {L->t + 2, L->h + 2, L->w + 2}, .kernel = {3, 3, 3},
                      .stride = {1, 1, 1}, .dt = m->dt};
    cc->cin = cin, cc->cout = cout, cc->lv = lv;
    GROW(p, cin * padded(L));
    GROW(y, cout * L->t * L->hw);
    return dl_conv_load(&cc->c, ws, base, &d);
}

static dl_status unexpected(dl_wsrc *ws, const char *name, const char *why) {
    if (!dl_ws_find(ws, name)) return DL_OK;
    return dl_fail(DL_ERR_FORMAT, "`%s`: unexpected %s (%s)", dl_ws_label(ws), name, why);
}

/* `<pre>time_embedder.timestep_embedder.linear_{1,2}`, 256 -> d -> d */
static dl_status tembed_load(tembed *t, dl_wsrc *ws, const char *pre, int64_t d, need *nd) {
    char n[300];
    const int64_t s1[2] = {d, TPROJ}, s2[2] = {d, d};
    dl_status s;
    t->d = d;
    GROW(d, d);
    if (!(t->e = malloc((size_t)d * sizeof *t->e))) return dl_fail(DL_ERR_NOMEM, "out of memory");
#define N(x) dl_pname(n, sizeof n, pre, "time_embedder.timestep_embedder.%s", x)
    if ((s = dl_param_f32(ws, N("linear_1.weight"), 2, s1, &t->w1)) || (s = dl_param_vec(ws, N("linear_1.bias"), d, &t->b1)) ||
        (s = dl_param_f32(ws, N("linear_2.weight"), 2, s2, &t->w2)) || (s = dl_param_vec(ws, N("linear_2.bias"), d, &t->b2)))
        return s;
#undef N
    return DL_OK;
}

static dl_status res_load(dl_ltx2_vae *m, lres *r, dl_wsrc *ws, const char *pre, int64_t cin, int64_t cout, int lv,
                          const tembed *te, need *nd) {
    char n[300];
    const level *L = &m->lev[lv];
    dl_status s;
    r->cin = cin, r->cout = cout, r->lv = lv, r->te = te;
#define N(x) dl_pname(n, sizeof n, pre, "%s", x)
    if ((s = cconv_load(m, &r->c1, ws, N("conv1.conv"), cin, cout, lv, nd)) ||
        (s = cconv_load(m, &r->c2, ws, N("conv2.conv"), cout, cout, lv, nd)) ||
        (s = unexpected(ws, N("per_channel_scale1"), "decoder_inject_noise is off")))
        return s;
    GROW(x, (cin > cout ? cin : cout) * L->t * L->hw);
    if (m->tc) {
        const int64_t sh[2] = {4, cin};
        if ((s = dl_param_f32(ws, N("scale_shift_table"), 2, sh, &r->sst))) return s;
        if (!(r->mod = malloc((size_t)(4 * cin) * sizeof *r->mod))) return dl_fail(DL_ERR_NOMEM, "out of memory");
    } else if ((s = unexpected(ws, N("scale_shift_table"), "timestep_conditioning is off"))) {
        return s;
    }
    if (cin != cout) {
        dl_conv_desc d = {.ndim = 3, .cin = cin, .cout = cout, .in = {L->t, L->h, L->w}, .kernel = {1, 1, 1},
                          .stride = {1, 1, 1}, .dt = m->dt};
        GROW(y, cin * L->t * L->hw);
        GROW(s, cout * L->t * L->hw);
        if ((s = dl_param_vec(ws, N("norm3.weight"), cin, &r->lnw)) || (s = dl_param_vec(ws, N("norm3.bias"), cin, &r->lnb)))
            return s;
        return dl_conv_load(&r->sc, ws, N("conv_shortcut"), &d);
    }
    s = unexpected(ws, N("conv_shortcut.weight"), "in and out channels are equal");
#undef N
    return s;
}

dl_status dl_ltx2_vae_load(dl_ltx2_vae **out, dl_model_dir *dir, const char *component, int64_t lat_frames,
                           int64_t lat_h, int64_t lat_w, dl_dtype dt, dl_wsrc *src) {
    *out = NULL;
    char file[512], p[200];
    snprintf(file, sizeof file, "%s/config.json", component);
    if (lat_frames < 1 || lat_frames > 4096 || lat_h < 1 || lat_w < 1 || lat_h > 4096 || lat_w > 4096 ||
        lat_h * lat_w > (1 << 22))
        return dl_fail(DL_ERR_INVALID, "LTX-2 VAE: latent %lld x %lld x %lld is out of range", (long long)lat_frames,
                       (long long)lat_h, (long long)lat_w);
    if (dt != DL_F32 && dt != DL_BF16)
        return dl_fail(DL_ERR_UNSUPPORTED, "LTX-2 VAE: dtype %s is not supported (f32, bf16)", dl_dtype_name(dt));
    const cJSON *cfg;
    dl_status s = dl_model_dir_config(dir, component, &cfg);
    if (s != DL_OK) return s;
    dl_ltx2_vae *m = calloc(1, sizeof *m);
    if (!m) return dl_fail(DL_ERR_NOMEM, "out of memory");
    dl_wsrc *ws = NULL;
    need nds = {0}, *nd = &nds;
    m->dt = dt, m->F = lat_frames;
    if ((s = read_config(m, cfg, file))) goto fail;
    if (m->pad == PAD_REFLECT && (lat_h < 2 || lat_w < 2)) {
        s = dl_fail(DL_ERR_INVALID, "LTX-2 VAE: latent %lld x %lld is too small for reflect padding (2 x 2 at least)",
                    (long long)lat_h, (long long)lat_w);
        goto fail;
    }
    /* levels: one per upsampler */
    m->lev[0] = (level){.t = lat_frames, .h = lat_h, .w = lat_w, .hw = lat_h * lat_w};
    m->nlev = 1;
    for (int b = 0; b < m->nb; b++) {
        lblock *B = &m->blk[b];
        B->u.lv = m->nlev - 1;
        if (!B->up) continue;
        const level *L = &m->lev[m->nlev - 1];
        const int *st = B->u.s;
        level *L2 = &m->lev[m->nlev++];
        L2->t = L->t * st[0] - (st[0] - 1), L2->h = L->h * st[1], L2->w = L->w * st[2], L2->hw = L2->h * L2->w;
    }
    if (dl_ltx2_vae_frames(m) * m->lev[m->nlev - 1].hw > ((int64_t)1 << 40)) {
        s = dl_fail(DL_ERR_INVALID, "LTX-2 VAE: a %lld-frame %lld x %lld video is too large", (long long)dl_ltx2_vae_frames(m),
                    (long long)m->lev[m->nlev - 1].h * m->ps, (long long)m->lev[m->nlev - 1].w * m->ps);
        goto fail;
    }
    if (!(m->res = calloc((size_t)(m->nres ? m->nres : 1), sizeof *m->res))) {
        s = dl_fail(DL_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if ((s = dl_ws_open(&ws, src, dir, component)) != DL_OK) goto fail;
    const level *L0 = &m->lev[0];
    if ((s = dl_param_vec(ws, "latents_mean", m->zc, &m->lmean)) || (s = dl_param_vec(ws, "latents_std", m->zc, &m->lstd)) ||
        (s = cconv_load(m, &m->cin, ws, "decoder.conv_in.conv", m->zc, m->c0, 0, nd)))
        goto fail;
    GROW(x, m->c0 * L0->t * L0->hw);
    if (m->tc) {
        float *mul = NULL;
        if ((s = dl_param_f32(ws, "decoder.timestep_scale_multiplier", 0, NULL, &mul))) goto fail;
        m->tmul = *mul;
        free(mul);
        if ((s = tembed_load(&m->mid_te, ws, "decoder.mid_block.", 4 * m->c0, nd))) goto fail;
    } else {
        if ((s = unexpected(ws, "decoder.timestep_scale_multiplier", "timestep_conditioning is off"))) goto fail;
    }
    int ri = 0, lv = 0;
    for (int j = 0; j < m->nmid; j++) {
        snprintf(p, sizeof p, "decoder.mid_block.resnets.%d.", j);
        if ((s = res_load(m, &m->res[ri++], ws, p, m->c0, m->c0, 0, &m->mid_te, nd))) goto fail;
    }
    snprintf(p, sizeof p, "decoder.mid_block.resnets.%lld.conv1.conv.weight", (long long)m->nmid);
    if ((s = unexpected(ws, p, "decoder_layers_per_block gives the mid block fewer resnets"))) goto fail;
    for (int b = 0; b < m->nb; b++) {
        lblock *B = &m->blk[b];
        DL_ASSERT(ri == B->r0);
        if (m->tc) {
            snprintf(p, sizeof p, "decoder.up_blocks.%d.", b);
            if ((s = tembed_load(&B->te, ws, p, 4 * B->inp, nd))) goto fail;
        }
        snprintf(p, sizeof p, "decoder.up_blocks.%d.conv_in.", b);
        if (B->conv_in) {
            if ((s = res_load(m, &m->res[ri++], ws, p, B->inp, B->out, lv, NULL, nd))) goto fail;
        } else {
            snprintf(p, sizeof p, "decoder.up_blocks.%d.conv_in.conv1.conv.weight", b);
            if ((s = unexpected(ws, p, "the config gives that block equal in and out channels"))) goto fail;
        }
        snprintf(p, sizeof p, "decoder.up_blocks.%d.upsamplers.0.conv.conv", b);
        if (B->up) {
            lup *u = &B->u;
            const int64_t P = u->s[0] * u->s[1] * u->s[2];
            const level *L2 = &m->lev[lv + 1];
            if ((s = cconv_load(m, &u->conv, ws, p, u->cin, u->cout * P, lv, nd))) goto fail;
            lv++;
            GROW(x, u->cout * L2->t * L2->hw);
        } else {
            snprintf(p, sizeof p, "decoder.up_blocks.%d.upsamplers.0.conv.conv.weight", b);
            if ((s = unexpected(ws, p, "the config gives that block no upsampler"))) goto fail;
        }
        for (int j = 0; j < B->nres; j++) {
            snprintf(p, sizeof p, "decoder.up_blocks.%d.resnets.%d.", b, j);
            if ((s = res_load(m, &m->res[ri++], ws, p, B->out, B->out, lv, &B->te, nd))) goto fail;
        }
        snprintf(p, sizeof p, "decoder.up_blocks.%d.resnets.%lld.conv1.conv.weight", b, (long long)B->nres);
        if ((s = unexpected(ws, p, "decoder_layers_per_block gives that block fewer resnets"))) goto fail;
    }
    snprintf(p, sizeof p, "decoder.up_blocks.%d.resnets.0.conv1.conv.weight", m->nb);
    if ((s = unexpected(ws, p, "decoder_block_out_channels gives fewer up blocks"))) goto fail;
    DL_ASSERT(lv == m->nlev - 1 && ri == m->nres);
    const level *LL = &m->lev[lv];
    if (m->tc) {
        const int64_t sh[2] = {2, m->c_last};
        if ((s = tembed_load(&m->out_te, ws, "decoder.", 2 * m->c_last, nd)) ||
            (s = dl_param_f32(ws, "decoder.scale_shift_table", 2, sh, &m->out_sst)))
            goto fail;
        if (!(m->out_mod = malloc((size_t)(2 * m->c_last) * sizeof *m->out_mod))) {
            s = dl_fail(DL_ERR_NOMEM, "out of memory");
            goto fail;
        }
    } else if ((s = unexpected(ws, "decoder.scale_shift_table", "timestep_conditioning is off"))) {
        goto fail;
    }
    if ((s = cconv_load(m, &m->cout, ws, "decoder.conv_out.conv", m->c_last, m->oc * m->ps * m->ps, lv, nd))) goto fail;
    GROW(x, m->c_last * LL->t * LL->hw);
    /* the buffers: every one is live through the whole decode */
    const size_t es = dl_dtype_size(dt);
    act_plan pl = {0};
    dl_plan_add(&pl, &m->x, nd->x * 4, 0, 0);
    dl_plan_add(&pl, &m->x2, nd->x * 4, 0, 0);
    dl_plan_add(&pl, &m->p, nd->p * es, 0, 0);
    dl_plan_add(&pl, &m->y, nd->y * es, 0, 0);
    dl_plan_add(&pl, &m->s, (nd->s ? nd->s : 1) * es, 0, 0);
    dl_plan_add(&pl, &m->tproj, TPROJ * 4, 0, 0);
    dl_plan_add(&pl, &m->th, (nd->d ? nd->d : 1) * 4, 0, 0);
    if ((s = dl_plan_commit(&pl, ws, &m->arena)) != DL_OK) goto fail;
    m->arena_bytes = pl.total;
    memset(m->arena, 0, pl.total);
    dl_ws_close(ws);
    *out = m;
    return DL_OK;
fail:
    dl_ws_close(ws);
    dl_ltx2_vae_free(m);
    return s;
}
#undef GROW

/* ---- running ---------------------------------------------------------------------- */


static inline float silu(float v) { return v / (1.f + expf(-v)); }

/* Where element (c, t, i, j) of a [C, T, h, w] tensor goes: off + c sc + t st + i si + j sj. */
typedef struct {
    int64_t off, sc, st, si, sj;
} layout;

/* the interior of the padded conv input [C, t + 2, h + 2, w + 2]: frame t at t + 2
 * (causal) or t + 1 */
static layout pad_in(const dl_ltx2_vae *m, const level *L) {
    const int64_t P = (L->h + 2) * (L->w + 2), t0 = m->causal ? 2 : 1;
    return (layout){t0 * P + L->w + 3, (L->t + 2) * P, P, L->w + 2, 1};
}

static inline int64_t at(const layout *o, int64_t c, int64_t t, int64_t i, int64_t j) {
    return o->off + c * o->sc + t * o->st + i * o->si + j * o->sj;
}

/* dst (dt, layout o) = x [C, t, h, w] (xdt, contiguous) */
static void copy_to(dl_dtype dt, void *dst, layout o, dl_dtype xdt, const void *x, int64_t C, const level *L) {
    const int64_t T = L->t, h = L->h, w = L->w, hw = L->hw;
    DL_PAR({
        int64_t r0, r1;
        dl_split(C * T, ith, nth, &r0, &r1);
        for (int64_t r = r0; r < r1; r++) {
            const int64_t c = r / T, t = r % T, so = r * hw;
            for (int64_t i = 0; i < h; i++)
                for (int64_t j = 0; j < w; j++) dl_st(dt, dst, at(&o, c, t, i, j), dl_ld(xdt, x, so + i * w + j));
        }
    });
}

enum { NB = 64 }; /* positions per norm block */

/* dst (model dtype, layout o) = SiLU(RMS(x) (1 + scale) + shift) of x [C, t, h, w]
 * (xdt, contiguous): per position, x / sqrt(mean_c x^2 + 1e-8) (sums in double);
 * scale and shift [C] or NULL (0) */
static void rms_silu(const dl_ltx2_vae *m, void *dst, layout o, dl_dtype xdt, const void *x, int64_t C, const level *L,
                     const float *shift, const float *scale) {
    const int64_t n = L->t * L->hw, hw = L->hw, w = L->w;
    const dl_dtype dt = m->dt;
    DL_PAR({
        int64_t b0, b1;
        double ss[NB];
        float r[NB];
        dl_split((n + NB - 1) / NB, ith, nth, &b0, &b1);
        for (int64_t b = b0; b < b1; b++) {
            const int64_t q0 = b * NB, nq = n - q0 < NB ? n - q0 : NB;
            for (int64_t j = 0; j < nq; j++) ss[j] = 0;
            for (int64_t c = 0; c < C; c++)
                for (int64_t j = 0; j < nq; j++) {
                    const double v = dl_ld(xdt, x, c * n + q0 + j);
                    ss[j] += v * v;
                }
            for (int64_t j = 0; j < nq; j++) r[j] = (float)(1.0 / sqrt(ss[j] / (double)C + 1e-8));
            for (int64_t c = 0; c < C; c++) {
                const float a = scale ? 1.f + scale[c] : 1.f, sh = shift ? shift[c] : 0.f;
                for (int64_t j = 0; j < nq; j++) {
                    const int64_t q = q0 + j, t = q / hw, ij = q % hw;
                    dl_st(dt, dst, at(&o, c, t, ij / w, ij % w), silu(dl_ld(xdt, x, c * n + q) * r[j] * a + sh));
                }
            }
        }
    });
}

/* y (model dtype, [C, t, hw]) = LayerNorm over the channels of x [C, t, hw] f32,
 * per position (biased variance, eps), weight w and bias b [C] */
static void layer_norm(const dl_ltx2_vae *m, void *y, const float *x, int64_t C, const level *L, const float *w, const float *b) {
    const int64_t n = L->t * L->hw;
    const dl_dtype dt = m->dt;
    const double eps = m->eps;
    DL_PAR({
        int64_t b0, b1;
        double mu[NB], var[NB];
        dl_split((n + NB - 1) / NB, ith, nth, &b0, &b1);
        for (int64_t k = b0; k < b1; k++) {
            const int64_t q0 = k * NB, nq = n - q0 < NB ? n - q0 : NB;
            for (int64_t j = 0; j < nq; j++) mu[j] = var[j] = 0;
            for (int64_t c = 0; c < C; c++)
                for (int64_t j = 0; j < nq; j++) mu[j] += x[c * n + q0 + j];
            for (int64_t j = 0; j < nq; j++) mu[j] /= (double)C;
            for (int64_t c = 0; c < C; c++)
                for (int64_t j = 0; j < nq; j++) {
                    const double d = x[c * n + q0 + j] - mu[j];
                    var[j] += d * d;
                }
            for (int64_t j = 0; j < nq; j++) var[j] = 1.0 / sqrt(var[j] / (double)C + eps);
            for (int64_t c = 0; c < C; c++)
                for (int64_t j = 0; j < nq; j++)
                    dl_st(dt, y, c * n + q0 + j, (float)((x[c * n + q0 + j] - mu[j]) * var[j]) * w[c] + b[c]);
        }
    });
}

/* Fills the padding of p (padded layout of L, interior of C channels set): each
 * frame's border in the spatial mode, then the time padding by copying frames. */
static void pad_fill(const dl_ltx2_vae *m, const level *L, int64_t C) {
    const size_t es = dl_dtype_size(m->dt);
    const int64_t W2 = L->w + 2, H2 = L->h + 2, P = H2 * W2, T = L->t, ldc = (T + 2) * P, t0 = m->causal ? 2 : 1;
    const pad_mode pm = m->pad;
    /* padded index of the source of the left / right column and top / bottom row */
    int64_t cl = 0, cr = 0, rt = 0, rb = 0;
    if (pm == PAD_REFLECT) cl = 2, cr = L->w - 1, rt = 2, rb = L->h - 1;
    if (pm == PAD_REPLICATE) cl = 1, cr = L->w, rt = 1, rb = L->h;
    if (pm == PAD_CIRCULAR) cl = L->w, cr = 1, rt = L->h, rb = 1;
    char *p = m->p;
    DL_PAR({
        int64_t c0, c1;
        dl_split(C, ith, nth, &c0, &c1);
        for (int64_t c = c0; c < c1; c++) {
            char *pc = p + (size_t)(c * ldc) * es;
            for (int64_t t = t0; t < t0 + T; t++) {
                char *f = pc + (size_t)(t * P) * es;
                if (pm == PAD_ZEROS) {
                    memset(f, 0, (size_t)W2 * es);
                    memset(f + (size_t)((H2 - 1) * W2) * es, 0, (size_t)W2 * es);
                    for (int64_t i = 1; i <= L->h; i++) {
                        char *row = f + (size_t)(i * W2) * es;
                        memset(row, 0, es);
                        memset(row + (size_t)(W2 - 1) * es, 0, es);
                    }
                    continue;
                }
                for (int64_t i = 1; i <= L->h; i++) {
                    char *row = f + (size_t)(i * W2) * es;
                    memcpy(row, row + (size_t)cl * es, es);
                    memcpy(row + (size_t)(W2 - 1) * es, row + (size_t)cr * es, es);
                }
                memcpy(f, f + (size_t)(rt * W2) * es, (size_t)W2 * es);
                memcpy(f + (size_t)((H2 - 1) * W2) * es, f + (size_t)(rb * W2) * es, (size_t)W2 * es);
            }
            for (int64_t t = 0; t < t0; t++) memcpy(pc + (size_t)(t * P) * es, pc + (size_t)(t0 * P) * es, (size_t)P * es);
            if (!m->causal) memcpy(pc + (size_t)((T + 1) * P) * es, pc + (size_t)(T * P) * es, (size_t)P * es);
        }
    });
}

/* the conv over p (interior set) -> y [cout, t, hw] */
static dl_status cconv_run(dl_ltx2_vae *m, cconv *cc) {
    pad_fill(m, &m->lev[cc->lv], cc->cin);
    return dl_conv_run(cc->c, m->p, m->y);
}

/* resnet on the stream x [cin, t, hw] -> [cout, t, hw] in place */
static dl_status res_run(dl_ltx2_vae *m, lres *r) {
    const level *L = &m->lev[r->lv];
    const layout o = pad_in(m, L);
    const int64_t n = L->t * L->hw, C = r->cout;
    const float *md = r->mod;
    dl_status s;
    if (r->sc) { /* conv_shortcut(norm3(x)) into s */
        layer_norm(m, m->y, m->x, r->cin, L, r->lnw, r->lnb);
        if ((s = dl_conv_run(r->sc, m->y, m->s))) return s;
    }
    rms_silu(m, m->p, o, DL_F32, m->x, r->cin, L, md ? md : NULL, md ? md + r->cin : NULL);
    if ((s = cconv_run(m, &r->c1))) return s;
    rms_silu(m, m->p, o, m->dt, m->y, C, L, md ? md + 2 * r->cin : NULL, md ? md + 3 * r->cin : NULL);
    if ((s = cconv_run(m, &r->c2))) return s;
    const dl_dtype dt = m->dt;
    float *x = m->x;
    const void *y = m->y, *sc = r->sc ? m->s : NULL;
    DL_PAR({
        int64_t i0, i1;
        dl_split(C * n, ith, nth, &i0, &i1);
        for (int64_t i = i0; i < i1; i++) x[i] = dl_ld(dt, y, i) + (sc ? dl_ld(dt, sc, i) : x[i]);
    });
    return DL_OK;
}

/* upsampler: x [cin, t, hw] (level u->lv) -> x [cout, t', hw'] (level u->lv + 1) */
static dl_status up_run(dl_ltx2_vae *m, lup *u) {
    const level *L = &m->lev[u->lv], *L2 = &m->lev[u->lv + 1];
    dl_status s;
    copy_to(m->dt, m->p, pad_in(m, L), DL_F32, m->x, u->cin, L);
    if ((s = cconv_run(m, &u->conv))) return s; /* y: [cout P, t, hw] */
    const int s0 = u->s[0], s1 = u->s[1], s2 = u->s[2], P = s0 * s1 * s2;
    const int64_t T2 = L2->t, H2 = L2->h, W2 = L2->w, n = L->t * L->hw, w = L->w, C = u->cout;
    const int64_t cr = u->residual ? u->cin / P : 1; /* residual channels before tiling */
    const dl_dtype dt = m->dt;
    const float *x = m->x;
    const void *y = m->y;
    float *x2 = m->x2;
    const int res = u->residual;
    DL_PAR({
        int64_t r0, r1;
        dl_split(C * T2, ith, nth, &r0, &r1);
        for (int64_t r = r0; r < r1; r++) {
            const int64_t co = r / T2, t2 = r % T2, tt = t2 + s0 - 1, t = tt / s0, a = tt % s0;
            float *dst = x2 + r * H2 * W2;
            for (int64_t i2 = 0; i2 < H2; i2++) {
                const int64_t i = i2 / s1, b = i2 % s1;
                for (int64_t j2 = 0; j2 < W2; j2++) {
                    const int64_t j = j2 / s2, d = j2 % s2, sub = (a * s1 + b) * s2 + d, pos = t * L->hw + i * w + j;
                    float v = dl_ld(dt, y, (co * P + sub) * n + pos);
                    if (res) v += x[((co % cr) * P + sub) * n + pos];
                    dst[i2 * W2 + j2] = v;
                }
            }
        }
    });
    m->x2 = m->x, m->x = x2;
    return DL_OK;
}

/* e = linear_2(SiLU(linear_1(proj(t)))) of embedder te (sums in double) */
static void tembed_run(dl_ltx2_vae *m, tembed *te, float t) {
    const int64_t d = te->d;
    dl_dit_timestep_proj(t, TPROJ, m->tproj);
    for (int64_t i = 0; i < d; i++) {
        double a = te->b1[i];
        for (int64_t k = 0; k < TPROJ; k++) a += (double)te->w1[i * TPROJ + k] * m->tproj[k];
        m->th[i] = silu((float)a);
    }
    for (int64_t i = 0; i < d; i++) {
        double a = te->b2[i];
        for (int64_t k = 0; k < d; k++) a += (double)te->w2[i * d + k] * m->th[k];
        te->e[i] = (float)a;
    }
}

/* video [vc, t pt, h p, w p] = unpatchify(y [oc p p, t, h, w]) */
static void unpatchify(const dl_ltx2_vae *m, float *video) {
    const level *L = &m->lev[m->nlev - 1];
    const int64_t p = m->ps, pt = m->pt, T = L->t, h = L->h, w = L->w, n = T * L->hw, VT = T * pt, VH = h * p, VW = w * p;
    const dl_dtype dt = m->dt;
    const void *y = m->y;
    DL_PAR({
        int64_t r0, r1;
        dl_split(m->vc * VT, ith, nth, &r0, &r1);
        for (int64_t r = r0; r < r1; r++) {
            const int64_t c = r / VT, vt = r % VT, t = vt / pt, u = vt % pt;
            float *dst = video + r * VH * VW;
            for (int64_t vi = 0; vi < VH; vi++)
                for (int64_t vj = 0; vj < VW; vj++) {
                    const int64_t ch = ((c * pt + u) * p + vj % p) * p + vi % p;
                    dst[vi * VW + vj] = dl_ld(dt, y, ch * n + t * L->hw + (vi / p) * w + vj / p);
                }
        }
    });
}

dl_status dl_ltx2_vae_decode(dl_ltx2_vae *m, const float *z, float temb, float *video,
                             void (*on_chunk)(void *ctx, int done, int total), void *ctx) {
    const level *L0 = &m->lev[0];
    const int64_t nz = m->zc * L0->t * L0->hw;
    const int total = m->nb + 2;
    int done = 0;
    dl_status s;
    for (int64_t i = 0; i < nz; i++)
        if (!isfinite(z[i])) return dl_fail(DL_ERR_INVALID, "LTX-2 VAE: latent is not finite at %lld", (long long)i);
    if (m->tc) { /* the decode's modulations: each block's embedding + the resnet's table */
        if (!isfinite(temb)) return dl_fail(DL_ERR_INVALID, "LTX-2 VAE: decode timestep is not finite");
        const float t = temb * m->tmul;
        tembed_run(m, &m->mid_te, t);
        for (int b = 0; b < m->nb; b++) tembed_run(m, &m->blk[b].te, t);
        tembed_run(m, &m->out_te, t);
        for (int i = 0; i < m->nres; i++) {
            lres *r = &m->res[i];
            DL_ASSERT(r->te && r->te->d == 4 * r->cin);
            for (int64_t k = 0; k < 4 * r->cin; k++) r->mod[k] = r->te->e[k] + r->sst[k];
        }
        for (int64_t k = 0; k < 2 * m->c_last; k++) m->out_mod[k] = m->out_te.e[k] + m->out_sst[k];
    }
    copy_to(m->dt, m->p, pad_in(m, L0), DL_F32, z, m->zc, L0);
    if ((s = cconv_run(m, &m->cin))) return s; /* y: [c0, F, hw0] */
    const size_t n0 = (size_t)(m->c0 * L0->t * L0->hw);
    if (m->dt == DL_F32) memcpy(m->x, m->y, n0 * 4);
    else DL_PAR(dl_convert_t(DL_F32, m->x, m->dt, m->y, (int64_t)n0, ith, nth));
    for (int j = 0; j < m->nmid; j++)
        if ((s = res_run(m, &m->res[j]))) return s;
    if (on_chunk) on_chunk(ctx, ++done, total);
    for (int b = 0; b < m->nb; b++) {
        lblock *B = &m->blk[b];
        int ri = B->r0;
        if (B->conv_in && (s = res_run(m, &m->res[ri++]))) return s;
        if (B->up && (s = up_run(m, &B->u))) return s;
        for (int j = 0; j < B->nres; j++)
            if ((s = res_run(m, &m->res[ri++]))) return s;
        if (on_chunk) on_chunk(ctx, ++done, total);
    }
    const level *L = &m->lev[m->nlev - 1];
    const float *om = m->out_mod;
    rms_silu(m, m->p, pad_in(m, L), DL_F32, m->x, m->c_last, L, om, om ? om + m->c_last : NULL);
    if ((s = cconv_run(m, &m->cout))) return s; /* y: [oc p p, t, hw] */
    unpatchify(m, video);
    if (on_chunk) on_chunk(ctx, ++done, total);
    return DL_OK;
}
