/* AutoencoderKLLTX2Audio decoder (diffusers 0.42), channels-first activations
 * [C, H, W] with H the time axis and W the mel axis, and LTX2Pipeline's
 * de-normalisation and unpacking in front of it.
 *
 *   pipeline: z[c, l, m] = packed[l, c M + m] std[c M + m] + mean[c M + m]
 *   decode(z [C, L, M]): conv_in C -> ch[-1] -> mid (res, attn?, res) -> for level
 *     l = n - 1 .. 0: num_res_blocks + 1 res blocks (each followed by an attention
 *     block when resolution / 2^l is in attn_resolutions), then, for l != 0, an
 *     upsampler -> norm_out -> SiLU -> conv_out -> out_channels; ch[l] = base ch_mult[l]
 *   causal conv (k 3): zero padding of 2 before and none after along the causal
 *     axis, 1 each side along the other ("none": 1 everywhere); k 1 unpadded
 *   norm: pixel (x / sqrt(mean_c x^2 + 1e-6), per position) or GroupNorm(32,
 *     eps 1e-6) with affine
 *   res: h = conv2(SiLU(norm2(conv1(SiLU(norm1(x)))))); out = nin_shortcut(x) + h
 *     (a 1x1 conv when channels change, else identity)
 *   attn: x + proj_out(softmax(q^T k / sqrt(C)) over the H W positions, one head),
 *     q | k | v 1x1 convs of norm(x)
 *   upsample: nearest 2x on both axes, causal conv, then the first row (height) or
 *     column (width) dropped: height (H, W) -> (2H - 1, 2W), width (2H, 2W - 1),
 *     none and width-compatibility (2H, 2W)
 *   output: cut or zero-padded to [out_channels, max(4 L - 3, 1), mel_bins]
 *
 * Padding is built on the host: a norm writes the interior of the padded conv
 * input [C, H + 2, W + 2] at the causal offset, the border is zeroed, and oneDNN
 * runs the conv unpadded. Attention goes through the fused kernel on token-major
 * q | k | v (transposed from the 1x1 convs' channels-first outputs). */
#include <math.h>
#include <omp.h>
#include <stdlib.h>

#include "models/ltx2_audio_impl.h"

enum { MAX_LEVELS = 8, MAX_RB = 16, GN_GROUPS = 32 };

typedef enum { AX_NONE, AX_WIDTH, AX_HEIGHT, AX_WIDTH_COMPAT } caxis;

/* a conv at size (h, w): k 3: padded [cin, h + 2, w + 2] -> [cout, h, w]; k 1: [cin, h, w] -> [cout, h, w] */
typedef struct {
    dl_conv *c;
    int64_t cin, cout, h, w;
} conv;

typedef struct {
    int64_t cin, cout, h, w;
    float *n1w, *n1b, *n2w, *n2b; /* GroupNorm [cin], [cin], [cout], [cout]; NULL for pixel norm */
    conv c1, c2, sc;              /* sc.c NULL: identity shortcut */
} res;

typedef struct {
    int64_t c, h, w;
    float *nw, *nb; /* GroupNorm [c] */
    conv q, k, v, o;
} attn;

struct dl_ltx2_audio_vae {
    dl_dtype dt;
    int64_t zc, L, M, oc, T, bins;  /* latent channels, frames, mel bins; out channels, mel frames, mel bins */
    int64_t rate, hop, nstat;       /* sample_rate, mel_hop_length, base_channels (statistics) */
    int nlev, nrb, group;           /* levels (len(ch_mult)), res blocks per level (num_res_blocks + 1), GroupNorm */
    caxis ax;
    int top, left;                  /* interior offset in a padded conv input */
    int64_t hf, wf;                 /* conv_out's size (before the cut / pad) */
    float *mean, *std;              /* [nstat] */
    conv cin, cout;
    res *rs;                        /* mid.block_1, mid.block_2, then the up levels' in run order */
    int nres;
    attn *at;                       /* mid.attn_1 (when on), then the up levels' in run order */
    int nat, mid_attn, lev_attn[MAX_LEVELS];
    conv up[MAX_LEVELS];            /* up[l]: level l's upsampler (l >= 1) */
    float *onw, *onb;               /* norm_out GroupNorm */
    /* activations (one arena) */
    float *x;                       /* f32 stream [C, h, w] */
    void *p;                        /* dt: padded conv input; normed [C, S]; attention output [S, C] */
    void *y;                        /* dt: conv output */
    void *s;                        /* dt: shortcut / proj_out output */
    void *q;                        /* dt: [S, 3C] q | k | v */
    void *ascr;                     /* attention scratch */
    float *zb;                      /* [C, L, M] the de-normalised latent */
    double *gst;                    /* [GN_GROUPS, 2] */
    void *arena;
    size_t arena_bytes;
};

int64_t dl_ltx2_audio_vae_latent_channels(const dl_ltx2_audio_vae *m) { return m->zc; }
int64_t dl_ltx2_audio_vae_latent_frames(const dl_ltx2_audio_vae *m) { return m->L; }
int64_t dl_ltx2_audio_vae_latent_mel_bins(const dl_ltx2_audio_vae *m) { return m->M; }
int64_t dl_ltx2_audio_vae_out_channels(const dl_ltx2_audio_vae *m) { return m->oc; }
int64_t dl_ltx2_audio_vae_mel_frames(const dl_ltx2_audio_vae *m) { return m->T; }
int64_t dl_ltx2_audio_vae_mel_bins(const dl_ltx2_audio_vae *m) { return m->bins; }
int64_t dl_ltx2_audio_vae_sample_rate(const dl_ltx2_audio_vae *m) { return m->rate; }
int64_t dl_ltx2_audio_vae_hop_length(const dl_ltx2_audio_vae *m) { return m->hop; }
size_t dl_ltx2_audio_vae_activation_bytes(const dl_ltx2_audio_vae *m) { return m->arena_bytes; }
const float *dl_ltx2_audio_vae_latents_mean(const dl_ltx2_audio_vae *m, int64_t *n) {
    if (n) *n = m->nstat;
    return m->mean;
}
const float *dl_ltx2_audio_vae_latents_std(const dl_ltx2_audio_vae *m, int64_t *n) {
    if (n) *n = m->nstat;
    return m->std;
}

void dl_ltx2_audio_mel_to_vocoder(const float *mel, int64_t channels, int64_t frames, int64_t bins, float *out) {
    for (int64_t c = 0; c < channels; c++)
        for (int64_t b = 0; b < bins; b++)
            for (int64_t t = 0; t < frames; t++) out[(c * bins + b) * frames + t] = mel[(c * frames + t) * bins + b];
}

static void conv_free(conv *c) { dl_conv_free(c->c), c->c = NULL; }

void dl_ltx2_audio_vae_free(dl_ltx2_audio_vae *m) {
    if (!m) return;
    for (int i = 0; m->rs && i < m->nres; i++) {
        res *r = &m->rs[i];
        free(r->n1w), free(r->n1b), free(r->n2w), free(r->n2b);
        conv_free(&r->c1), conv_free(&r->c2), conv_free(&r->sc);
    }
    for (int i = 0; m->at && i < m->nat; i++) {
        attn *a = &m->at[i];
        free(a->nw), free(a->nb);
        conv_free(&a->q), conv_free(&a->k), conv_free(&a->v), conv_free(&a->o);
    }
    for (int l = 0; l < MAX_LEVELS; l++) conv_free(&m->up[l]);
    free(m->rs), free(m->at);
    conv_free(&m->cin), conv_free(&m->cout);
    free(m->mean), free(m->std), free(m->onw), free(m->onb);
    dl_aligned_free(m->arena);
    free(m);
}

/* ---- loading ---------------------------------------------------------------------- */

typedef struct {
    size_t x, p, y, s, q, ascr;
} need;
#define GROW(f, v) (nd->f = nd->f > (size_t)(v) ? nd->f : (size_t)(v))

/* conv `<base>.weight` / `.bias` of kernel k (3 or 1) at size (h, w) */
static dl_status conv_load(dl_ltx2_audio_vae *m, conv *c, dl_wsrc *ws, const char *base, int64_t cin, int64_t cout,
                           int k, int64_t h, int64_t w, need *nd) {
    const int e = k == 3 ? 2 : 0;
    dl_conv_desc d = {.ndim = 2, .cin = cin, .cout = cout, .in = {h + e, w + e}, .kernel = {k, k}, .stride = {1, 1},
                      .dt = m->dt};
    c->cin = cin, c->cout = cout, c->h = h, c->w = w;
    GROW(p, cin * (h + e) * (w + e));
    GROW(y, cout * h * w);
    return dl_conv_load(&c->c, ws, base, &d);
}

/* GroupNorm `<pre><name>.weight` / `.bias` when the model uses them; with pixel
 * norm the checkpoint must not hold them */
static dl_status norm_load(dl_ltx2_audio_vae *m, dl_wsrc *ws, const char *pre, const char *name, int64_t c, float **w,
                           float **b, const char *file) {
    char n[300];
    snprintf(n, sizeof n, "%s%s.weight", pre, name);
    if (!m->group) {
        if (dl_ws_find(ws, n))
            return dl_fail(DL_ERR_FORMAT, "`%s`: unexpected %s (norm_type is pixel)", dl_ws_label(ws), n);
        return DL_OK;
    }
    if (c % GN_GROUPS)
        return dl_fail(DL_ERR_FORMAT, "`%s`: %s has %lld channels, not a multiple of GroupNorm's %d groups", file, n,
                       (long long)c, GN_GROUPS);
    dl_status s = dl_param_vec(ws, n, c, w);
    if (s) return s;
    snprintf(n, sizeof n, "%s%s.bias", pre, name);
    return dl_param_vec(ws, n, c, b);
}

static dl_status res_load(dl_ltx2_audio_vae *m, res *r, dl_wsrc *ws, const char *pre, int64_t cin, int64_t cout,
                          int64_t h, int64_t w, need *nd, const char *file) {
    char n[300];
    dl_status s;
    r->cin = cin, r->cout = cout, r->h = h, r->w = w;
#define N(x) dl_pname(n, sizeof n, pre, "%s", x)
    if ((s = norm_load(m, ws, pre, "norm1", cin, &r->n1w, &r->n1b, file)) ||
        (s = norm_load(m, ws, pre, "norm2", cout, &r->n2w, &r->n2b, file)) ||
        (s = conv_load(m, &r->c1, ws, N("conv1.conv"), cin, cout, 3, h, w, nd)) ||
        (s = conv_load(m, &r->c2, ws, N("conv2.conv"), cout, cout, 3, h, w, nd)))
        return s;
    GROW(x, (cin > cout ? cin : cout) * h * w);
    if (cin != cout) {
        GROW(y, cin * h * w); /* x in the model dtype */
        GROW(s, cout * h * w);
        return conv_load(m, &r->sc, ws, N("nin_shortcut.conv"), cin, cout, 1, h, w, nd);
    }
    if (dl_ws_find(ws, N("nin_shortcut.conv.weight")) || dl_ws_find(ws, N("conv_shortcut.conv.weight")))
        return dl_fail(DL_ERR_FORMAT, "`%s`: unexpected %s (in and out channels are equal)", dl_ws_label(ws), n);
#undef N
    return DL_OK;
}

static dl_attn_args attn_args(const dl_ltx2_audio_vae *m, int64_t C, int64_t S) {
    const size_t es = dl_dtype_size(m->dt);
    const char *q = m->q;
    return (dl_attn_args){.dt = m->dt, .sq = S, .sk = S, .heads = 1, .head_dim = C, .q = q,
                          .k = q ? q + (size_t)C * es : NULL, .v = q ? q + (size_t)(2 * C) * es : NULL,
                          .q_stride = 3 * C, .k_stride = 3 * C, .v_stride = 3 * C, .out = m->p, .out_stride = C,
                          .kv_begin = 0, .kv_end = S, .scale = 1.f / sqrtf((float)C)};
}

static dl_status attn_load(dl_ltx2_audio_vae *m, attn *a, dl_wsrc *ws, const char *pre, int64_t c, int64_t h, int64_t w,
                           need *nd, const char *file) {
    char n[300];
    dl_status s;
    const int64_t S = h * w;
    a->c = c, a->h = h, a->w = w;
    if (c > 1024)
        return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: attention width %lld is over 1024 (%s)", file, (long long)c, pre);
#define N(x) dl_pname(n, sizeof n, pre, "%s", x)
    if ((s = norm_load(m, ws, pre, "norm", c, &a->nw, &a->nb, file)) || (s = conv_load(m, &a->q, ws, N("q"), c, c, 1, h, w, nd)) ||
        (s = conv_load(m, &a->k, ws, N("k"), c, c, 1, h, w, nd)) || (s = conv_load(m, &a->v, ws, N("v"), c, c, 1, h, w, nd)) ||
        (s = conv_load(m, &a->o, ws, N("proj_out"), c, c, 1, h, w, nd)))
        return s;
#undef N
    GROW(q, 3 * S * c);
    GROW(s, S * c);
    const dl_attn_args aa = attn_args(m, c, S);
    GROW(ascr, dl_attn_scratch_bytes(&aa, omp_get_max_threads()) + 64);
    return DL_OK;
}

/* the config into m; ch_mult into mult[nlev], attn_resolutions into ares[nares] */
static dl_status read_config(dl_ltx2_audio_vae *m, const cJSON *cfg, const char *file, int64_t *base, int64_t *mult,
                             int64_t *ares, int *nares, int64_t *reso) {
    dl_status s;
    const char *cls, *norm, *ax;
    int64_t nrb;
    static const int64_t mult_def[] = {1, 2, 4};
    if ((s = dl_cfg_str(cfg, file, "_class_name", "AutoencoderKLLTX2Audio", &cls))) return s;
    if (strcmp(cls, "AutoencoderKLLTX2Audio"))
        return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: _class_name \"%s\" is not AutoencoderKLLTX2Audio", file, cls);
    if ((s = dl_cfg_int(cfg, file, "base_channels", 128, base)) || (s = dl_cfg_int(cfg, file, "output_channels", 2, &m->oc)) ||
        (s = dl_cfg_int(cfg, file, "num_res_blocks", 2, &nrb)) || (s = dl_cfg_int(cfg, file, "resolution", 256, reso)) ||
        (s = dl_cfg_int(cfg, file, "latent_channels", 8, &m->zc)) || (s = dl_cfg_str(cfg, file, "norm_type", "pixel", &norm)) ||
        (s = dl_cfg_bool(cfg, file, "mid_block_add_attention", 0, &m->mid_attn)) ||
        (s = dl_cfg_int(cfg, file, "sample_rate", 16000, &m->rate)) ||
        (s = dl_cfg_int(cfg, file, "mel_hop_length", 160, &m->hop)))
        return s;
    int nl;
    if ((s = la_cfg_ints(cfg, file, "ch_mult", mult_def, 3, MAX_LEVELS, mult, &nl))) return s;
    m->nlev = nl;
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(cfg, "attn_resolutions");
    *nares = 0;
    if (a && !cJSON_IsNull(a) && !(cJSON_IsArray(a) && cJSON_GetArraySize(a) == 0) && /* null, []: no attention */
        (s = la_cfg_ints(cfg, file, "attn_resolutions", NULL, 0, 64, ares, nares)))
        return s;
    const cJSON *ca = cJSON_GetObjectItemCaseSensitive(cfg, "causality_axis");
    if (ca && !cJSON_IsString(ca))
        return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: causality_axis must be one of \"none\", \"width\", \"height\", "
                                           "\"width-compatibility\" (diffusers refuses null)", file);
    ax = ca ? ca->valuestring : "height";
    if (!strcmp(ax, "none")) m->ax = AX_NONE;
    else if (!strcmp(ax, "width")) m->ax = AX_WIDTH;
    else if (!strcmp(ax, "height")) m->ax = AX_HEIGHT;
    else if (!strcmp(ax, "width-compatibility")) m->ax = AX_WIDTH_COMPAT;
    else return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: causality_axis \"%s\" is not supported (none, width, height, width-compatibility)", file, ax);
    if (!strcmp(norm, "group")) m->group = 1;
    else if (strcmp(norm, "pixel")) return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: norm_type \"%s\" is not supported (pixel, group)", file, norm);
    const cJSON *mb = cJSON_GetObjectItemCaseSensitive(cfg, "mel_bins");
    if (mb && cJSON_IsNull(mb))
        return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: mel_bins null is not supported (the pipeline needs mel_bins)", file);
    if ((s = dl_cfg_int(cfg, file, "mel_bins", 64, &m->bins))) return s;
    if (*base < 1 || *base > 8192 || m->oc < 1 || m->oc > 64 || nrb < 0 || nrb >= MAX_RB || m->zc < 1 || m->zc > 4096 ||
        m->bins < 4 || m->bins > 4096)
        return dl_fail(DL_ERR_FORMAT, "`%s`: needs base_channels in [1, 8192], output_channels in [1, 64], num_res_blocks "
                       "in [0, %d), latent_channels in [1, 4096], mel_bins in [4, 4096]", file, MAX_RB);
    for (int i = 0; i < nl; i++)
        if (mult[i] < 1 || mult[i] > 64) return dl_fail(DL_ERR_FORMAT, "`%s`: ch_mult[%d] must be in [1, 64]", file, i);
    m->nrb = (int)nrb + 1;
    return DL_OK;
}

dl_status dl_ltx2_audio_vae_load(dl_ltx2_audio_vae **out, dl_model_dir *dir, const char *component, int64_t lat_frames,
                                 dl_dtype dt, dl_wsrc *src) {
    *out = NULL;
    char file[512], p[300];
    snprintf(file, sizeof file, "%s/config.json", component);
    if (lat_frames < 1 || lat_frames > (1 << 16))
        return dl_fail(DL_ERR_INVALID, "LTX-2 audio VAE: %lld latent frames is out of range [1, 65536]", (long long)lat_frames);
    if (dt != DL_F32 && dt != DL_BF16)
        return dl_fail(DL_ERR_UNSUPPORTED, "LTX-2 audio VAE: dtype %s is not supported (f32, bf16)", dl_dtype_name(dt));
    const cJSON *cfg;
    dl_status s = dl_model_dir_config(dir, component, &cfg);
    if (s != DL_OK) return s;
    dl_ltx2_audio_vae *m = calloc(1, sizeof *m);
    if (!m) return dl_fail(DL_ERR_NOMEM, "out of memory");
    dl_wsrc *ws = NULL;
    int64_t base, mult[MAX_LEVELS], ares[64], reso;
    int nares;
    need nds = {0}, *nd = &nds;
    m->dt = dt, m->L = lat_frames;
    if ((s = read_config(m, cfg, file, &base, mult, ares, &nares, &reso))) goto fail;
    m->M = m->bins / 4; /* the pipeline's latent_mel_bins: mel_bins // mel_compression_ratio */
    m->T = 4 * m->L - 3 > 1 ? 4 * m->L - 3 : 1;
    m->top = m->ax == AX_HEIGHT ? 2 : 1;
    m->left = m->ax == AX_WIDTH || m->ax == AX_WIDTH_COMPAT ? 2 : 1;
    m->nstat = base;
    const int nl = m->nlev;
    /* sizes: level l runs at h[l] x w[l]; the lowest level (nl - 1) at L x M */
    int64_t hh[MAX_LEVELS], ww[MAX_LEVELS], uh[MAX_LEVELS], uw[MAX_LEVELS];
    hh[nl - 1] = m->L, ww[nl - 1] = m->M;
    for (int l = nl - 1; l > 0; l--) {
        uh[l] = 2 * hh[l], uw[l] = 2 * ww[l]; /* the upsampler's conv size, before its cut */
        hh[l - 1] = uh[l] - (m->ax == AX_HEIGHT), ww[l - 1] = uw[l] - (m->ax == AX_WIDTH);
        if (hh[l - 1] * ww[l - 1] > ((int64_t)1 << 26)) {
            s = dl_fail(DL_ERR_INVALID, "LTX-2 audio VAE: %lld latent frames give a %lld x %lld spectrogram, too large",
                        (long long)m->L, (long long)hh[l - 1], (long long)ww[l - 1]);
            goto fail;
        }
    }
    m->hf = hh[0], m->wf = ww[0];
    for (int l = 0; l < nl; l++) {
        const int64_t cr = reso >> l; /* diffusers' curr_res at level l */
        for (int i = 0; i < nares; i++) m->lev_attn[l] |= ares[i] == cr;
    }
    m->nres = 2 + nl * m->nrb;
    m->nat = m->mid_attn;
    for (int l = 0; l < nl; l++) m->nat += m->lev_attn[l] ? m->nrb : 0;
    if (!(m->rs = calloc((size_t)m->nres, sizeof *m->rs)) || !(m->at = calloc((size_t)(m->nat + 1), sizeof *m->at))) {
        s = dl_fail(DL_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if ((s = dl_ws_open(&ws, src, dir, component)) != DL_OK) goto fail;
    {
        const int64_t sh[1] = {base};
        if ((s = dl_param_f32(ws, "latents_mean", 1, sh, &m->mean)) || (s = dl_param_f32(ws, "latents_std", 1, sh, &m->std)))
            goto fail;
    }
    const int64_t c0 = base * mult[nl - 1], L = m->L, M = m->M;
    if ((s = conv_load(m, &m->cin, ws, "decoder.conv_in.conv", m->zc, c0, 3, L, M, nd))) goto fail;
    GROW(x, c0 * L * M);
    if ((s = res_load(m, &m->rs[0], ws, "decoder.mid.block_1.", c0, c0, L, M, nd, file)) ||
        (s = res_load(m, &m->rs[1], ws, "decoder.mid.block_2.", c0, c0, L, M, nd, file)))
        goto fail;
    int ai = 0, ri = 2;
    if (m->mid_attn) {
        if ((s = attn_load(m, &m->at[ai++], ws, "decoder.mid.attn_1.", c0, L, M, nd, file))) goto fail;
    } else if (dl_ws_find(ws, "decoder.mid.attn_1.q.weight")) {
        s = dl_fail(DL_ERR_FORMAT, "`%s`: unexpected decoder.mid.attn_1.q.weight (mid_block_add_attention is false)",
                    dl_ws_label(ws));
        goto fail;
    }
    int64_t cin = c0;
    for (int l = nl - 1; l >= 0; l--) {
        const int64_t co = base * mult[l];
        for (int j = 0; j < m->nrb; j++) {
            snprintf(p, sizeof p, "decoder.up.%d.block.%d.", l, j);
            if ((s = res_load(m, &m->rs[ri++], ws, p, cin, co, hh[l], ww[l], nd, file))) goto fail;
            cin = co;
            if (m->lev_attn[l]) {
                snprintf(p, sizeof p, "decoder.up.%d.attn.%d.", l, j);
                if ((s = attn_load(m, &m->at[ai++], ws, p, co, hh[l], ww[l], nd, file))) goto fail;
            }
        }
        snprintf(p, sizeof p, "decoder.up.%d.block.%d.conv1.conv.weight", l, m->nrb);
        if (dl_ws_find(ws, p)) {
            s = dl_fail(DL_ERR_FORMAT, "`%s`: unexpected %s (num_res_blocks %d gives %d blocks per level)", dl_ws_label(ws), p,
                        m->nrb - 1, m->nrb);
            goto fail;
        }
        snprintf(p, sizeof p, "decoder.up.%d.attn.0.q.weight", l);
        if (!m->lev_attn[l] && dl_ws_find(ws, p)) {
            s = dl_fail(DL_ERR_FORMAT, "`%s`: unexpected %s (attn_resolutions has no %lld)", dl_ws_label(ws), p,
                        (long long)(reso >> l));
            goto fail;
        }
        if (l > 0) {
            snprintf(p, sizeof p, "decoder.up.%d.upsample.conv.conv", l);
            if ((s = conv_load(m, &m->up[l], ws, p, co, co, 3, uh[l], uw[l], nd))) goto fail;
            GROW(x, co * hh[l - 1] * ww[l - 1]);
        }
    }
    snprintf(p, sizeof p, "decoder.up.%d.block.0.conv1.conv.weight", nl);
    if (dl_ws_find(ws, p)) {
        s = dl_fail(DL_ERR_FORMAT, "`%s`: unexpected %s (ch_mult gives %d levels)", dl_ws_label(ws), p, nl);
        goto fail;
    }
    DL_ASSERT(ri == m->nres && ai == m->nat);
    if ((s = norm_load(m, ws, "decoder.", "norm_out", cin, &m->onw, &m->onb, file)) ||
        (s = conv_load(m, &m->cout, ws, "decoder.conv_out.conv", cin, m->oc, 3, m->hf, m->wf, nd)))
        goto fail;
    const size_t es = dl_dtype_size(dt);
    act_plan pl = {0};
    dl_plan_add(&pl, &m->x, nd->x * 4, 0, 0);
    dl_plan_add(&pl, &m->p, nd->p * es, 0, 0);
    dl_plan_add(&pl, &m->y, nd->y * es, 0, 0);
    dl_plan_add(&pl, &m->s, nd->s * es + 64, 0, 0);
    dl_plan_add(&pl, &m->q, nd->q * es + 64, 0, 0);
    dl_plan_add(&pl, &m->ascr, nd->ascr + 64, 0, 0);
    dl_plan_add(&pl, &m->zb, (size_t)(m->zc * L * M) * 4, 0, 0);
    dl_plan_add(&pl, &m->gst, GN_GROUPS * 2 * sizeof(double), 0, 0);
    if ((s = dl_plan_commit(&pl, ws, &m->arena)) != DL_OK) goto fail;
    m->arena_bytes = pl.total;
    dl_ws_close(ws);
    *out = m;
    return DL_OK;
fail:
    dl_ws_close(ws);
    dl_ltx2_audio_vae_free(m);
    return s;
}
#undef GROW

/* ---- running ---------------------------------------------------------------------- */

/* where element (c, i, j) of a [C, h, w] tensor goes: off + c sc + i si + j */
typedef struct {
    int64_t off, sc, si;
} layout;

static layout flat(int64_t h, int64_t w) { return (layout){0, h * w, w}; }
/* the interior of a padded conv input [C, h + 2, w + 2] */
static layout padded(const dl_ltx2_audio_vae *m, int64_t h, int64_t w) {
    return (layout){m->top * (w + 2) + m->left, (h + 2) * (w + 2), w + 2};
}

/* the border of p (padded layout of h x w, C channels) := 0 */
static void zero_border(dl_ltx2_audio_vae *m, int64_t C, int64_t h, int64_t w) {
    const size_t es = dl_dtype_size(m->dt);
    const int64_t W2 = w + 2, P = (h + 2) * W2, top = m->top, left = m->left;
    char *p = m->p;
    DL_PAR({
        int64_t c0, c1;
        dl_split(C, ith, nth, &c0, &c1);
        for (int64_t c = c0; c < c1; c++) {
            char *pc = p + (size_t)(c * P) * es;
            for (int64_t i = 0; i < h + 2; i++) {
                char *row = pc + (size_t)(i * W2) * es;
                if (i < top || i >= top + h) {
                    memset(row, 0, (size_t)W2 * es);
                } else {
                    memset(row, 0, (size_t)left * es);
                    memset(row + (size_t)(left + w) * es, 0, (size_t)(2 - left) * es);
                }
            }
        }
    });
}

/* dst (model dtype, layout o) = act(norm(x)) over x [C, h, w] (xdt, contiguous):
 * pixel norm per position, or GroupNorm(32) with w/b (stats in double) */
static void norm_to(dl_ltx2_audio_vae *m, void *dst, layout o, dl_dtype xdt, const void *x, int64_t C, int64_t h,
                    int64_t w, const float *gw, const float *gb, int silu) {
    const int64_t S = h * w;
    const dl_dtype dt = m->dt;
    if (!m->group) {
        DL_PAR({
            int64_t s0, s1;
            dl_split(S, ith, nth, &s0, &s1);
            for (int64_t k = s0; k < s1; k++) {
                const int64_t i = k / w, j = k % w;
                double ms = 0;
                for (int64_t c = 0; c < C; c++) {
                    const double v = la_ld(xdt, x, c * S + k);
                    ms += v * v;
                }
                const float rms = sqrtf((float)(ms / (double)C) + 1e-6f);
                for (int64_t c = 0; c < C; c++) {
                    const float v = la_ld(xdt, x, c * S + k) / rms;
                    la_st(dt, dst, o.off + c * o.sc + i * o.si + j, silu ? v / (1.f + expf(-v)) : v);
                }
            }
        });
        return;
    }
    const int64_t G = GN_GROUPS, cg = C / G;
    double *st = m->gst;
    DL_PAR({
        int64_t g0, g1;
        dl_split(G, ith, nth, &g0, &g1);
        for (int64_t g = g0; g < g1; g++) {
            double sum = 0, sq = 0;
            for (int64_t i = g * cg * S; i < (g + 1) * cg * S; i++) sum += la_ld(xdt, x, i);
            const double mean = sum / (double)(cg * S);
            for (int64_t i = g * cg * S; i < (g + 1) * cg * S; i++) {
                const double d = la_ld(xdt, x, i) - mean;
                sq += d * d;
            }
            st[2 * g] = mean, st[2 * g + 1] = 1.0 / sqrt(sq / (double)(cg * S) + 1e-6);
        }
    });
    DL_PAR({
        int64_t c0, c1;
        dl_split(C, ith, nth, &c0, &c1);
        for (int64_t c = c0; c < c1; c++) {
            const int64_t g = c / cg;
            const float a = (float)(st[2 * g + 1] * gw[c]), sh = (float)(gb[c] - st[2 * g] * st[2 * g + 1] * gw[c]);
            for (int64_t i = 0; i < h; i++)
                for (int64_t j = 0; j < w; j++) {
                    const float v = la_ld(xdt, x, c * S + i * w + j) * a + sh;
                    la_st(dt, dst, o.off + c * o.sc + i * o.si + j, silu ? v / (1.f + expf(-v)) : v);
                }
        }
    });
}

/* dst (ddt, layout o) = src [C, h, w] (sdt) */
static void copy_to(dl_dtype ddt, void *dst, layout o, dl_dtype sdt, const void *src, int64_t C, int64_t h, int64_t w) {
    DL_PAR({
        int64_t c0, c1;
        dl_split(C, ith, nth, &c0, &c1);
        for (int64_t c = c0; c < c1; c++)
            for (int64_t i = 0; i < h; i++)
                for (int64_t j = 0; j < w; j++)
                    la_st(ddt, dst, o.off + c * o.sc + i * o.si + j, la_ld(sdt, src, (c * h + i) * w + j));
    });
}

/* a 3x3 conv over p (interior written) -> y */
static dl_status conv3_run(dl_ltx2_audio_vae *m, conv *c) {
    zero_border(m, c->cin, c->h, c->w);
    return dl_conv_run(c->c, m->p, m->y);
}

/* residual block on the stream x [cin, h, w] -> [cout, h, w] in place */
static dl_status res_run(dl_ltx2_audio_vae *m, res *r) {
    const int64_t h = r->h, w = r->w, n = r->cout * h * w;
    const layout pi = padded(m, h, w);
    dl_status s;
    if (r->sc.c) { /* nin_shortcut(x) into s */
        const void *in = m->x;
        if (m->dt != DL_F32) copy_to(m->dt, m->y, flat(h, w), DL_F32, m->x, r->cin, h, w), in = m->y;
        if ((s = dl_conv_run(r->sc.c, in, m->s))) return s;
    }
    norm_to(m, m->p, pi, DL_F32, m->x, r->cin, h, w, r->n1w, r->n1b, 1);
    if ((s = conv3_run(m, &r->c1))) return s;
    norm_to(m, m->p, pi, m->dt, m->y, r->cout, h, w, r->n2w, r->n2b, 1);
    if ((s = conv3_run(m, &r->c2))) return s;
    const dl_dtype dt = m->dt;
    float *x = m->x;
    const void *y = m->y, *sc = r->sc.c ? m->s : NULL;
    DL_PAR({
        int64_t i0, i1;
        dl_split(n, ith, nth, &i0, &i1);
        for (int64_t i = i0; i < i1; i++) x[i] = (sc ? la_ld(dt, sc, i) : x[i]) + la_ld(dt, y, i);
    });
    return DL_OK;
}

/* out [S, 3C] columns [col, col + C) := in [C, S] transposed */
static void to_tokens(dl_dtype dt, void *out, int64_t col, const void *in, int64_t C, int64_t S) {
    const size_t es = dl_dtype_size(dt);
    DL_PAR({
        int64_t k0, k1;
        dl_split(S, ith, nth, &k0, &k1);
        for (int64_t k = k0; k < k1; k++)
            for (int64_t c = 0; c < C; c++)
                memcpy((char *)out + (size_t)(k * 3 * C + col + c) * es, (const char *)in + (size_t)(c * S + k) * es, es);
    });
}

/* attention block on x [C, h, w] */
static dl_status attn_run(dl_ltx2_audio_vae *m, attn *a) {
    const int64_t C = a->c, S = a->h * a->w;
    const dl_dtype dt = m->dt;
    dl_status s;
    norm_to(m, m->s, flat(a->h, a->w), DL_F32, m->x, C, a->h, a->w, a->nw, a->nb, 0); /* s: [C, S] */
    conv *qkv[3] = {&a->q, &a->k, &a->v};
    for (int i = 0; i < 3; i++) {
        if ((s = dl_conv_run(qkv[i]->c, m->s, m->y))) return s; /* y: [C, S] */
        to_tokens(dt, m->q, i * C, m->y, C, S);               /* q: [S, 3C] */
    }
    dl_attn_args aa = attn_args(m, C, S); /* p: [S, C] */
    DL_PAR(dl_attn_t(&aa, m->ascr, ith, nth));
    const size_t es = dl_dtype_size(dt);
    const char *p = m->p;
    char *y = m->y;
    DL_PAR({ /* y: [C, S] */
        int64_t c0, c1;
        dl_split(C, ith, nth, &c0, &c1);
        for (int64_t c = c0; c < c1; c++)
            for (int64_t k = 0; k < S; k++) memcpy(y + (size_t)(c * S + k) * es, p + (size_t)(k * C + c) * es, es);
    });
    if ((s = dl_conv_run(a->o.c, m->y, m->s))) return s; /* s: [C, S] */
    float *x = m->x;
    const void *o = m->s;
    DL_PAR({
        int64_t i0, i1;
        dl_split(C * S, ith, nth, &i0, &i1);
        for (int64_t i = i0; i < i1; i++) x[i] += la_ld(dt, o, i);
    });
    return DL_OK;
}

/* upsampler: x [C, h, w] -> nearest 2x -> causal conv [C, 2h, 2w] -> the first row or column dropped, into x */
static dl_status up_run(dl_ltx2_audio_vae *m, conv *u) {
    const int64_t C = u->cin, h2 = u->h, w2 = u->w, h = h2 / 2, w = w2 / 2;
    const layout o = padded(m, h2, w2);
    const dl_dtype dt = m->dt;
    float *x = m->x;
    void *p = m->p;
    DL_PAR({
        int64_t c0, c1;
        dl_split(C, ith, nth, &c0, &c1);
        for (int64_t c = c0; c < c1; c++)
            for (int64_t i = 0; i < h2; i++)
                for (int64_t j = 0; j < w2; j++) la_st(dt, p, o.off + c * o.sc + i * o.si + j, x[(c * h + i / 2) * w + j / 2]);
    });
    dl_status s = conv3_run(m, u);
    if (s) return s;
    const int64_t di = m->ax == AX_HEIGHT, dj = m->ax == AX_WIDTH, ho = h2 - di, wo = w2 - dj;
    const void *y = m->y;
    DL_PAR({
        int64_t c0, c1;
        dl_split(C, ith, nth, &c0, &c1);
        for (int64_t c = c0; c < c1; c++)
            for (int64_t i = 0; i < ho; i++)
                for (int64_t j = 0; j < wo; j++) x[(c * ho + i) * wo + j] = la_ld(dt, y, (c * h2 + i + di) * w2 + j + dj);
    });
    return DL_OK;
}

dl_status dl_ltx2_audio_vae_decode_z(dl_ltx2_audio_vae *m, const float *z, float *mel) {
    const int64_t L = m->L, M = m->M, n = m->zc * L * M;
    dl_status s;
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(z[i])) return dl_fail(DL_ERR_INVALID, "LTX-2 audio VAE: latent is not finite at %lld", (long long)i);
    copy_to(m->dt, m->p, padded(m, L, M), DL_F32, z, m->zc, L, M);
    if ((s = conv3_run(m, &m->cin))) return s;
    copy_to(DL_F32, m->x, flat(L, M), m->dt, m->y, m->cin.cout, L, M);
    int ri = 2, ai = 0;
    if ((s = res_run(m, &m->rs[0])) || (m->mid_attn && (s = attn_run(m, &m->at[ai++]))) || (s = res_run(m, &m->rs[1])))
        return s;
    for (int l = m->nlev - 1; l >= 0; l--) {
        for (int j = 0; j < m->nrb; j++) {
            if ((s = res_run(m, &m->rs[ri++]))) return s;
            if (m->lev_attn[l] && (s = attn_run(m, &m->at[ai++]))) return s;
        }
        if (l > 0 && (s = up_run(m, &m->up[l]))) return s;
    }
    DL_ASSERT(ri == m->nres && ai == m->nat);
    const int64_t hf = m->hf, wf = m->wf, T = m->T, B = m->bins;
    norm_to(m, m->p, padded(m, hf, wf), DL_F32, m->x, m->cout.cin, hf, wf, m->onw, m->onb, 1);
    if ((s = conv3_run(m, &m->cout))) return s; /* y: [oc, hf, wf] */
    for (int64_t c = 0; c < m->oc; c++) /* cut or zero-pad to [oc, T, B] */
        for (int64_t t = 0; t < T; t++)
            for (int64_t b = 0; b < B; b++)
                mel[(c * T + t) * B + b] = t < hf && b < wf ? la_ld(m->dt, m->y, (c * hf + t) * wf + b) : 0.f;
    return DL_OK;
}

dl_status dl_ltx2_audio_vae_decode(dl_ltx2_audio_vae *m, const float *packed, float *mel) {
    const int64_t C = m->zc, L = m->L, M = m->M;
    if (m->nstat != C * M)
        return dl_fail(DL_ERR_INVALID,
                       "LTX-2 audio VAE: latents_mean has %lld values, the packed latent %lld features (latent_channels "
                       "%lld x %lld mel bins); the pipeline cannot de-normalise it",
                       (long long)m->nstat, (long long)(C * M), (long long)C, (long long)M);
    for (int64_t l = 0; l < L; l++)
        for (int64_t f = 0; f < C * M; f++) { /* feature f = c M + mb */
            const float v = packed[l * C * M + f];
            if (!isfinite(v)) return dl_fail(DL_ERR_INVALID, "LTX-2 audio VAE: latent is not finite at %lld", (long long)(l * C * M + f));
            m->zb[((f / M) * L + l) * M + f % M] = v * m->std[f] + m->mean[f];
        }
    return dl_ltx2_audio_vae_decode_z(m, m->zb, mel);
}
