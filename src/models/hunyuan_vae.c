/* AutoencoderKLHunyuanVideo decoder (diffusers 0.42, the HunyuanVideo causal 3-D VAE),
 * channels-first activations [C, T, H, W] (T frames of one tile).
 *
 *   vae.decode(z), z: [zc, F, h, w] (already divided by scaling_factor):
 *     F <= 4 (tile_sample_min_num_frames 16 / ratio 4): one decode of all frames
 *     else (_temporal_tiled_decode): tile k decodes latent frames [3k, 3k + 5) from
 *       scratch; tiles after the first drop their first video frame; tile k's first
 *       e = min(len(prev), len(cur), 4) frames blend with the previous tile's last e:
 *       cur[x] = prev[len(prev) - e + x] (1 - x / e) + cur[x] (x / e), in place, so the
 *       blended tile is the next one's "prev"; the video is tile 0's first 13 frames,
 *       then 12 of each later tile, cut to (F - 1) 4 + 1
 *   one decode (T latent frames): post_quant_conv (1x1x1) -> conv_in -> mid (res,
 *     attn, res) -> up blocks (layers_per_block + 1 res, then an upsampler where the
 *     config asks) -> GroupNorm + SiLU -> conv_out; no clamp
 *   channels: conv_in zc -> boc[-1]; up block i maps boc_r[i - 1] (boc_r[0] for i = 0)
 *     -> boc_r[i], boc_r = reversed(block_out_channels); conv_out boc[0] -> 3
 *   causal conv (k = 3): replicate padding, 2 frames before the first and 1 pixel each
 *     side, then a plain 3x3x3 conv: out[t] = sum_k W_k in[max(t + k - 2, 0)] (edges
 *     clamped too); T frames in, T out
 *   GroupNorm(G, eps 1e-6) over each group's channels x all T frames x H x W
 *   res: h = conv2(SiLU(GN2(conv1(SiLU(GN1(x)))))); out = shortcut(x) + h
 *     (shortcut: 1x1x1 conv when in != out channels, else identity)
 *   attn (one head of width C over the T H W tokens, frame-causal: a token of frame t
 *     sees the tokens of frames <= t): x + to_out(softmax(q k^T / sqrt(C)) v),
 *     q | k | v = to_q | to_k | to_v(GN(x)^T)
 *   upsampler of block i (factors: space 2 if i < log2(spatial ratio), time 2 if
 *     n - 3 <= i < n - 1): frame 0 -> nearest space only; frames 1.. -> nearest in
 *     time and space; T -> 1 + (T - 1) tf frames; then a causal conv C -> C
 *
 * Replicate padding is built on the host: a norm (or copy) writes the interior of
 * the padded buffer [C, T + 2, H + 2, W + 2], then the borders are filled from it,
 * and oneDNN runs the conv without padding. Every conv is built once, at load, for
 * the largest tile (tm frames per level); a shorter tile (the last one) runs it over
 * the same buffers with only its first T frames real: a causal conv's output frame t
 * reads input frames <= t, and norms, attention and upsampling touch only real
 * frames, so the extra frames cost time (one tile at most) but never change a real
 * output. */
#include <cjson/cJSON.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "difflet/hunyuan_vae.h"
#include "models/models_impl.h"

/* diffusers' tiling attributes (not config): tile_sample_min_num_frames 16 and
 * tile_sample_stride_num_frames 12 over the temporal ratio 4 */
enum {
    MAX_BLOCKS = 8,
    T_RATIO = 4,
    TILE_MIN = 16 / T_RATIO,    /* latent frames decoded whole; a tile has TILE_MIN + 1 */
    TILE_STRIDE = 12 / T_RATIO, /* latent frames between tiles */
    TILE_BLEND = 16 - 12,       /* video frames blended */
    TILE_TAKE = 12,             /* video frames kept per tile (one more for the first) */
};

typedef struct {
    int64_t h, w, hw, tm; /* size; frames of the largest tile */
} level;

/* a causal 3x3x3 conv at level lv: padded [cin, tm + 2, h + 2, w + 2] -> [cout, tm, h, w] */
typedef struct {
    dl_conv *c;
    int lv;
    int64_t cin, cout;
} cconv;

typedef struct {
    int64_t cin, cout;
    int lv;
    float *n1w, *n1b, *n2w, *n2b; /* [cin], [cin], [cout], [cout] */
    cconv c1, c2;                 /* cin -> cout, cout -> cout */
    dl_conv *sc;                  /* 1x1x1 [cin, tm, hw] -> [cout, tm, hw] when cin != cout */
} hres;

typedef struct {
    int tf, sf; /* time and space factors (1 or 2) */
    int64_t c;
    cconv conv; /* at the output level */
} hup;

struct dl_hunyuan_vae {
    dl_dtype dt;
    int64_t zc, F, G, lpb;     /* latent channels, latent frames, groups, layers_per_block */
    int nb, nlev, ss, attn;    /* up blocks, levels, spatial ratio, mid attention on */
    int ntiles;
    float sfac;                /* scaling_factor */
    level lev[MAX_BLOCKS + 1]; /* level l: after l upsamplers */
    dl_conv *pq;               /* post_quant_conv 1x1x1: [zc, tm0, hw0] -> same */
    cconv cin, cout;           /* conv_in zc -> c0; conv_out c_last -> 3 */
    int64_t c0, c_last;        /* block_out_channels[-1], [0] */
    hres *res;                 /* mid.0, mid.1, then each up block's resnets */
    int nres;
    float *aw, *ab;            /* [c0] attention group norm */
    lin qkv, out;              /* [tm0 hw0, c0] -> [.., 3 c0], [.., c0] -> [.., c0] */
    hup up[MAX_BLOCKS];
    int upb[MAX_BLOCKS];       /* block b's upsampler in up[], -1: none */
    float *gow, *gob;          /* [c_last] conv_norm_out */
    /* activations (one arena, all live through a tile) */
    float *x;                  /* f32 stream [C, tm, hw] of the current level */
    void *p;                   /* dt: padded conv input; normed tokens [tm hw, C] */
    void *y;                   /* dt: conv output [C, tm, hw]; attention output */
    void *s;                   /* dt: shortcut output; the tile's latent */
    void *q;                   /* dt: [tm0 hw0, 3 c0] q | k | v */
    void *ascr;                /* attention scratch */
    float *dec;                /* [3, tmL, hwL] a decoded tile */
    float *tail;               /* [3, TILE_BLEND, hwL] the previous tile's last frames */
    double *gst;               /* [G, 2] group mean, 1 / std */
    void *arena;
    size_t arena_bytes;
};

int64_t dl_hunyuan_vae_latent_channels(const dl_hunyuan_vae *m) { return m->zc; }
int dl_hunyuan_vae_scale_spatial(const dl_hunyuan_vae *m) { return m->ss; }
int dl_hunyuan_vae_scale_temporal(const dl_hunyuan_vae *m) { (void)m; return T_RATIO; }
int64_t dl_hunyuan_vae_frames(const dl_hunyuan_vae *m) { return (m->F - 1) * T_RATIO + 1; }
float dl_hunyuan_vae_scaling_factor(const dl_hunyuan_vae *m) { return m->sfac; }
int dl_hunyuan_vae_tiles(const dl_hunyuan_vae *m) { return m->ntiles; }
size_t dl_hunyuan_vae_activation_bytes(const dl_hunyuan_vae *m) { return m->arena_bytes; }

void dl_hunyuan_vae_free(dl_hunyuan_vae *m) {
    if (!m) return;
    for (int i = 0; m->res && i < m->nres; i++) {
        hres *r = &m->res[i];
        free(r->n1w), free(r->n1b), free(r->n2w), free(r->n2b);
        dl_conv_free(r->c1.c), dl_conv_free(r->c2.c), dl_conv_free(r->sc);
    }
    for (int i = 0; i < MAX_BLOCKS; i++) dl_conv_free(m->up[i].conv.c);
    free(m->res);
    dl_conv_free(m->pq), dl_conv_free(m->cin.c), dl_conv_free(m->cout.c);
    dl_lin_free(&m->qkv), dl_lin_free(&m->out);
    free(m->aw), free(m->ab), free(m->gow), free(m->gob);
    dl_aligned_free(m->arena);
    free(m);
}

/* Frame t's queries (rows [t hw, (t + 1) hw) of q | k | v in q) over the keys of
 * frames <= t (diffusers' prepare_causal_attention_mask), out into p's rows. */
static dl_attn_args attn_args(const dl_hunyuan_vae *m, int64_t t) {
    const int64_t C = m->c0, hw = m->lev[0].hw;
    const size_t es = dl_dtype_size(m->dt);
    const char *q = m->q;
    return (dl_attn_args){.dt = m->dt, .sq = hw, .sk = (t + 1) * hw, .heads = 1, .head_dim = C,
                          .q = q ? q + (size_t)(t * hw * 3 * C) * es : NULL, .k = q ? q + (size_t)C * es : NULL,
                          .v = q ? q + (size_t)(2 * C) * es : NULL, .q_stride = 3 * C, .k_stride = 3 * C,
                          .v_stride = 3 * C, .out = m->p ? (char *)m->p + (size_t)(t * hw * C) * es : NULL,
                          .out_stride = C, .kv_begin = 0, .kv_end = (t + 1) * hw, .scale = 1.f / sqrtf((float)C)};
}

/* ---- loading ---------------------------------------------------------------------- */

/* The largest buffer each activation needs, in elements, grown while loading. */
typedef struct {
    size_t x, p, y, s, q;
} need;
#define GROW(f, v) (nd->f = nd->f > (size_t)(v) ? nd->f : (size_t)(v))

static int64_t padded(const level *L) { return (L->tm + 2) * (L->h + 2) * (L->w + 2); }

static dl_status cconv_load(dl_hunyuan_vae *m, cconv *cc, dl_wsrc *ws, const char *base, int64_t cin, int64_t cout,
                            int lv, need *nd) {
    const level *L = &m->lev[lv];
    dl_conv_desc d = {.ndim = 3, .cin = cin, .cout = cout, .in = {L->tm + 2, L->h + 2, L->w + 2},
                      .kernel = {3, 3, 3}, .stride = {1, 1, 1}, .dt = m->dt};
    cc->cin = cin, cc->cout = cout, cc->lv = lv;
    GROW(p, cin * padded(L));
    GROW(y, cout * L->tm * L->hw);
    return dl_conv_load(&cc->c, ws, base, &d);
}

/* GroupNorm `<pre><name>.weight` / `.bias`, [c] each */
static dl_status norm_load(dl_wsrc *ws, const char *pre, const char *name, int64_t c, float **w, float **b) {
    char n[300];
    dl_status s;
    snprintf(n, sizeof n, "%s%s.weight", pre, name);
    if ((s = dl_param_vec(ws, n, c, w))) return s;
    snprintf(n, sizeof n, "%s%s.bias", pre, name);
    return dl_param_vec(ws, n, c, b);
}

static dl_status res_load(dl_hunyuan_vae *m, hres *r, dl_wsrc *ws, const char *pre, int64_t cin, int64_t cout, int lv,
                          need *nd) {
    char n[300];
    const level *L = &m->lev[lv];
    dl_status s;
    r->cin = cin, r->cout = cout, r->lv = lv;
#define N(x) dl_pname(n, sizeof n, pre, "%s", x)
    if ((s = norm_load(ws, pre, "norm1", cin, &r->n1w, &r->n1b)) || (s = norm_load(ws, pre, "norm2", cout, &r->n2w, &r->n2b)) ||
        (s = cconv_load(m, &r->c1, ws, N("conv1.conv"), cin, cout, lv, nd)) ||
        (s = cconv_load(m, &r->c2, ws, N("conv2.conv"), cout, cout, lv, nd)))
        return s;
    GROW(x, (cin > cout ? cin : cout) * L->tm * L->hw);
    if (cin != cout) {
        dl_conv_desc d = {.ndim = 3, .cin = cin, .cout = cout, .in = {L->tm, L->h, L->w}, .kernel = {1, 1, 1},
                          .stride = {1, 1, 1}, .dt = m->dt};
        GROW(y, cin * L->tm * L->hw);
        GROW(s, cout * L->tm * L->hw);
        return dl_conv_load(&r->sc, ws, N("conv_shortcut.conv"), &d);
    }
    if (dl_ws_find(ws, N("conv_shortcut.conv.weight")))
        return dl_fail(DL_ERR_FORMAT, "`%s`: unexpected %s (in and out channels are equal)", dl_ws_label(ws), n);
#undef N
    return DL_OK;
}

/* config list `key`: 1..MAX_BLOCKS integers, or (names) strings each equal to `name` */
static dl_status cfg_list(const cJSON *cfg, const char *file, const char *key, const char *name, int64_t *v, int *n) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) < 1 || cJSON_GetArraySize(a) > MAX_BLOCKS)
        return dl_fail(DL_ERR_FORMAT, "`%s`: \"%s\" must be a list of 1 to %d %s", file, key, MAX_BLOCKS,
                       name ? "block names" : "integers");
    *n = cJSON_GetArraySize(a);
    for (int i = 0; i < *n; i++) {
        const cJSON *e = cJSON_GetArrayItem(a, i);
        if (name && !cJSON_IsString(e))
            return dl_fail(DL_ERR_FORMAT, "`%s`: \"%s\"[%d] must be a string", file, key, i);
        if (name && strcmp(e->valuestring, name))
            return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: \"%s\"[%d] \"%s\" is not supported (%s)", file, key, i,
                           e->valuestring, name);
        if (!name && (!cJSON_IsNumber(e) || e->valuedouble != (double)(int64_t)e->valuedouble || e->valuedouble < 1 ||
                      e->valuedouble > 65536))
            return dl_fail(DL_ERR_FORMAT, "`%s`: \"%s\"[%d] must be an integer in [1, 65536]", file, key, i);
        if (!name) v[i] = (int64_t)e->valuedouble;
    }
    return DL_OK;
}

/* The config: sizes into m, block_out_channels into boc, each up block's factors into tf / sf. */
static dl_status read_config(dl_hunyuan_vae *m, const cJSON *cfg, const char *file, int64_t *boc, int *tf, int *sf) {
    dl_status s;
    int64_t outc, tr, ssr, dummy[MAX_BLOCKS];
    double sfac;
    int nbo, nup;
    const char *cls, *act;
    if ((s = dl_cfg_str(cfg, file, "_class_name", "AutoencoderKLHunyuanVideo", &cls))) return s;
    if (strcmp(cls, "AutoencoderKLHunyuanVideo"))
        return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: _class_name \"%s\" is not AutoencoderKLHunyuanVideo", file, cls);
    if ((s = dl_cfg_int(cfg, file, "latent_channels", 16, &m->zc)) || (s = dl_cfg_int(cfg, file, "out_channels", 3, &outc)) ||
        (s = dl_cfg_int(cfg, file, "layers_per_block", 2, &m->lpb)) || (s = dl_cfg_int(cfg, file, "norm_num_groups", 32, &m->G)) ||
        (s = dl_cfg_int(cfg, file, "temporal_compression_ratio", 4, &tr)) ||
        (s = dl_cfg_int(cfg, file, "spatial_compression_ratio", 8, &ssr)) ||
        (s = dl_cfg_float(cfg, file, "scaling_factor", 0.476986, &sfac)) ||
        (s = dl_cfg_bool(cfg, file, "mid_block_add_attention", 1, &m->attn)) ||
        (s = dl_cfg_str(cfg, file, "act_fn", "silu", &act)) || (s = cfg_list(cfg, file, "block_out_channels", NULL, boc, &nbo)))
        return s;
    if (cJSON_GetObjectItemCaseSensitive(cfg, "up_block_types")) {
        if ((s = cfg_list(cfg, file, "up_block_types", "HunyuanVideoUpBlock3D", dummy, &nup))) return s;
    } else {
        nup = 4; /* diffusers' default: four HunyuanVideoUpBlock3D */
    }
    if (strcmp(act, "silu") && strcmp(act, "swish"))
        return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: act_fn \"%s\" is not supported (silu)", file, act);
    if (outc != 3) return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: out_channels %lld is not supported (3)", file, (long long)outc);
    if (tr != T_RATIO)
        return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: temporal_compression_ratio %lld is not supported (4, as in diffusers' decoder)",
                       file, (long long)tr);
    if (nup != nbo)
        return dl_fail(DL_ERR_FORMAT, "`%s`: up_block_types has %d entries, block_out_channels %d", file, nup, nbo);
    if (m->zc < 1 || m->zc > 4096 || m->lpb < 0 || m->lpb > 16 || m->G < 1)
        return dl_fail(DL_ERR_FORMAT, "`%s`: needs latent_channels in [1, 4096], layers_per_block in [0, 16], positive norm_num_groups", file);
    for (int i = 0; i < nbo; i++)
        if (boc[i] % m->G)
            return dl_fail(DL_ERR_FORMAT, "`%s`: norm_num_groups %lld does not divide block_out_channels[%d] = %lld", file,
                           (long long)m->G, i, (long long)boc[i]);
    if (sfac <= 0 || !isfinite(sfac)) return dl_fail(DL_ERR_FORMAT, "`%s`: scaling_factor must be positive", file);
    m->sfac = (float)sfac;
    /* diffusers' HunyuanVideoDecoder3D: block i upsamples space if i < log2(spatial
     * ratio) and time if n - 1 - log2(4) <= i and i is not the last block */
    int nsp = 0;
    while (nsp < 16 && (1LL << nsp) < ssr) nsp++;
    if (ssr < 1 || (1LL << nsp) != ssr || nsp > nbo)
        return dl_fail(DL_ERR_UNSUPPORTED,
                       "`%s`: spatial_compression_ratio %lld is not supported (a power of two, at most 2^%d with %d blocks)",
                       file, (long long)ssr, nbo, nbo);
    int nt = 0;
    for (int i = 0; i < nbo; i++) {
        sf[i] = i < nsp ? 2 : 1;
        tf[i] = i >= nbo - 3 && i != nbo - 1 ? 2 : 1;
        nt += tf[i] == 2;
    }
    if (nt != 2)
        return dl_fail(DL_ERR_UNSUPPORTED,
                       "`%s`: %d blocks upsample time %dx, not temporal_compression_ratio 4 (needs at least 3 blocks)", file,
                       nbo, 1 << nt);
    m->nb = nbo, m->ss = (int)ssr;
    return DL_OK;
}

dl_status dl_hunyuan_vae_load(dl_hunyuan_vae **out, dl_model_dir *dir, const char *component, int64_t lat_frames,
                              int64_t lat_h, int64_t lat_w, dl_dtype dt, dl_wsrc *src) {
    *out = NULL;
    char file[512], p[200];
    snprintf(file, sizeof file, "%s/config.json", component);
    if (lat_frames < 1 || lat_frames > 4096 || lat_h < 1 || lat_w < 1 || lat_h > 4096 || lat_w > 4096 ||
        lat_h * lat_w > (1 << 22))
        return dl_fail(DL_ERR_INVALID, "HunyuanVideo VAE: latent %lld x %lld x %lld is out of range", (long long)lat_frames,
                       (long long)lat_h, (long long)lat_w);
    if (dt != DL_F32 && dt != DL_BF16)
        return dl_fail(DL_ERR_UNSUPPORTED, "HunyuanVideo VAE: dtype %s is not supported (f32, bf16)", dl_dtype_name(dt));
    const cJSON *cfg;
    dl_status s = dl_model_dir_config(dir, component, &cfg);
    if (s != DL_OK) return s;
    dl_hunyuan_vae *m = calloc(1, sizeof *m);
    if (!m) return dl_fail(DL_ERR_NOMEM, "out of memory");
    for (int b = 0; b < MAX_BLOCKS; b++) m->upb[b] = -1;
    dl_wsrc *ws = NULL;
    int64_t boc[MAX_BLOCKS];
    int tf[MAX_BLOCKS], sf[MAX_BLOCKS];
    need nds = {0}, *nd = &nds;
    m->dt = dt, m->F = lat_frames;
    if ((s = read_config(m, cfg, file, boc, tf, sf))) goto fail;
    /* levels: tiles of TILE_MIN + 1 latent frames when F > TILE_MIN, else the whole clip */
    m->lev[0] = (level){.h = lat_h, .w = lat_w, .hw = lat_h * lat_w, .tm = lat_frames > TILE_MIN ? TILE_MIN + 1 : lat_frames};
    m->nlev = 1;
    for (int b = 0; b < m->nb; b++) {
        if (tf[b] == 1 && sf[b] == 1) continue;
        const level *L = &m->lev[m->nlev - 1];
        level *L2 = &m->lev[m->nlev];
        L2->h = L->h * sf[b], L2->w = L->w * sf[b], L2->hw = L2->h * L2->w, L2->tm = 1 + (L->tm - 1) * tf[b];
        m->up[m->nlev - 1] = (hup){.tf = tf[b], .sf = sf[b], .c = boc[m->nb - 1 - b]};
        m->upb[b] = m->nlev - 1;
        m->nlev++;
    }
    m->ntiles = 1;
    if (lat_frames > TILE_MIN) {
        m->ntiles = 0;
        for (int64_t i = 0; i < lat_frames; i += TILE_STRIDE) m->ntiles += !(i > 0 && lat_frames - i == 1);
    }
    m->c0 = boc[m->nb - 1], m->c_last = boc[0];
    m->nres = 2 + m->nb * (int)(m->lpb + 1);
    if (!(m->res = calloc((size_t)m->nres, sizeof *m->res))) {
        s = dl_fail(DL_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if ((s = dl_ws_open(&ws, src, dir, component)) != DL_OK) goto fail;
    const level *L0 = &m->lev[0];
    const int64_t zc = m->zc, c0 = m->c0, S0 = L0->tm * L0->hw;
    {
        dl_conv_desc d = {.ndim = 3, .cin = zc, .cout = zc, .in = {L0->tm, lat_h, lat_w}, .kernel = {1, 1, 1},
                          .stride = {1, 1, 1}, .dt = dt};
        if ((s = dl_conv_load(&m->pq, ws, "post_quant_conv", &d))) goto fail;
        GROW(s, zc * S0);
        GROW(y, zc * S0);
        if ((s = cconv_load(m, &m->cin, ws, "decoder.conv_in.conv", zc, c0, 0, nd))) goto fail;
        GROW(x, c0 * S0);
    }
    if ((s = res_load(m, &m->res[0], ws, "decoder.mid_block.resnets.0.", c0, c0, 0, nd)) ||
        (s = res_load(m, &m->res[1], ws, "decoder.mid_block.resnets.1.", c0, c0, 0, nd)))
        goto fail;
    if (m->attn) { /* one head of width c0 over tm0 * hw0 tokens */
        const char *pa = "decoder.mid_block.attentions.0.";
        if (c0 > 1024) {
            s = dl_fail(DL_ERR_UNSUPPORTED, "`%s`: mid-block attention width %lld is over 1024", file, (long long)c0);
            goto fail;
        }
        if ((s = norm_load(ws, pa, "group_norm", c0, &m->aw, &m->ab)) ||
            (s = dl_lin_qkv(&m->qkv, ws, pa, "to_q", "to_k", "to_v", S0, c0, dt, NULL)) ||
            (s = dl_lin_named(&m->out, ws, "decoder.mid_block.attentions.0.to_out.0", S0, c0, c0, dt, dt, DL_ACT_NONE, 0, NULL)))
            goto fail;
        GROW(p, S0 * c0);
        GROW(y, S0 * c0);
        GROW(q, 3 * S0 * c0);
    } else if (dl_ws_find(ws, "decoder.mid_block.attentions.0.to_q.weight")) {
        s = dl_fail(DL_ERR_FORMAT, "`%s`: unexpected decoder.mid_block.attentions.0.to_q.weight (mid_block_add_attention is false)",
                    dl_ws_label(ws));
        goto fail;
    }
    int ri = 2, lv = 0;
    for (int b = 0; b < m->nb; b++) {
        const int64_t cin = b > 0 ? boc[m->nb - b] : boc[m->nb - 1], oc = boc[m->nb - 1 - b];
        for (int j = 0; j <= m->lpb; j++) {
            snprintf(p, sizeof p, "decoder.up_blocks.%d.resnets.%d.", b, j);
            if ((s = res_load(m, &m->res[ri++], ws, p, j == 0 ? cin : oc, oc, lv, nd))) goto fail;
        }
        snprintf(p, sizeof p, "decoder.up_blocks.%d.resnets.%lld.conv1.conv.weight", b, (long long)m->lpb + 1);
        if (dl_ws_find(ws, p)) {
            s = dl_fail(DL_ERR_FORMAT, "`%s`: unexpected %s (layers_per_block %lld gives %lld resnets per up block)",
                        dl_ws_label(ws), p, (long long)m->lpb, (long long)m->lpb + 1);
            goto fail;
        }
        snprintf(p, sizeof p, "decoder.up_blocks.%d.upsamplers.0.conv.conv", b);
        if (m->upb[b] < 0) {
            snprintf(p, sizeof p, "decoder.up_blocks.%d.upsamplers.0.conv.conv.weight", b);
            if (dl_ws_find(ws, p)) {
                s = dl_fail(DL_ERR_FORMAT, "`%s`: unexpected %s (the config gives block %d no upsampler)", dl_ws_label(ws), p, b);
                goto fail;
            }
            continue;
        }
        hup *u = &m->up[m->upb[b]];
        if ((s = cconv_load(m, &u->conv, ws, p, oc, oc, lv + 1, nd))) goto fail;
        lv++;
        GROW(x, oc * m->lev[lv].tm * m->lev[lv].hw);
    }
    snprintf(p, sizeof p, "decoder.up_blocks.%d.resnets.0.conv1.conv.weight", m->nb);
    if (dl_ws_find(ws, p)) {
        s = dl_fail(DL_ERR_FORMAT, "`%s`: unexpected %s (block_out_channels gives %d up blocks)", dl_ws_label(ws), p, m->nb);
        goto fail;
    }
    DL_ASSERT(lv == m->nlev - 1 && ri == m->nres);
    const level *LL = &m->lev[lv];
    if ((s = norm_load(ws, "decoder.", "conv_norm_out", m->c_last, &m->gow, &m->gob)) ||
        (s = cconv_load(m, &m->cout, ws, "decoder.conv_out.conv", m->c_last, 3, lv, nd)))
        goto fail;
    /* the buffers: every one is live through a whole tile */
    const size_t es = dl_dtype_size(dt);
    act_plan pl = {0};
    dl_plan_add(&pl, &m->x, nd->x * 4, 0, 0);
    dl_plan_add(&pl, &m->p, nd->p * es, 0, 0);
    dl_plan_add(&pl, &m->y, nd->y * es, 0, 0);
    dl_plan_add(&pl, &m->s, nd->s * es, 0, 0);
    dl_plan_add(&pl, &m->q, nd->q * es, 0, 0);
    dl_plan_add(&pl, &m->dec, (size_t)(3 * LL->tm * LL->hw) * 4, 0, 0);
    dl_plan_add(&pl, &m->tail, (size_t)(3 * TILE_BLEND * LL->hw) * 4, 0, 0);
    dl_plan_add(&pl, &m->gst, (size_t)m->G * 2 * sizeof(double), 0, 0);
    if (m->attn) { /* the largest scratch of the per-frame calls */
        size_t ab = 0;
        for (int64_t t = 0; t < L0->tm; t++) {
            const dl_attn_args a = attn_args(m, t);
            const size_t b = dl_attn_scratch_bytes(&a, omp_get_max_threads());
            ab = ab > b ? ab : b;
        }
        dl_plan_add(&pl, &m->ascr, ab + 64, 0, 0);
    }
    if ((s = dl_plan_commit(&pl, ws, &m->arena)) != DL_OK) goto fail;
    m->arena_bytes = pl.total;
    memset(m->arena, 0, pl.total); /* frames past a short tile's are read (never used): keep them defined */
    dl_ws_close(ws);
    *out = m;
    return DL_OK;
fail:
    dl_ws_close(ws);
    dl_hunyuan_vae_free(m);
    return s;
}
#undef GROW

/* ---- running ---------------------------------------------------------------------- */


/* strided activations: layers.c's dl_vlayout */
typedef dl_vlayout layout;

/* [C, tm, h, w] */
static layout flat(const level *L) { return (layout){0, L->tm * L->hw, L->hw, L->w, 1}; }
/* the interior of the padded conv input [C, tm + 2, h + 2, w + 2] (frame t at t + 2) */
static layout pad_in(const level *L) {
    const int64_t P = (L->h + 2) * (L->w + 2);
    return (layout){2 * P + L->w + 3, (L->tm + 2) * P, P, L->w + 2, 1};
}
/* token-major [tm hw, C] */
static layout tokens(const level *L, int64_t C) { return (layout){0, 1, L->hw * C, L->w * C, C}; }

/* dst (ddt, layout o) = src [C, T frames, h, w] at level L (sdt, channel stride lds) */
static void copy_to(dl_dtype ddt, void *dst, layout o, dl_dtype sdt, const void *src, int64_t lds, int64_t C, int64_t T,
                    const level *L) {
    dl_vcopy(ddt, dst, o, sdt, src, lds, C, T, L->h, L->w);
}

/* dst (model dtype, layout o) = act(GroupNorm(x)) over T frames of x [C, T, h, w] at
 * level L (xdt, channel stride ldx), eps 1e-6 */
static void group_norm(dl_hunyuan_vae *m, void *dst, layout o, dl_dtype xdt, const void *x, int64_t ldx, int64_t C,
                       int64_t T, const level *L, const float *w, const float *b, int silu) {
    dl_vgroup_norm(m->dt, dst, o, xdt, x, ldx, C, T, L->h, L->w, m->G, w, b, 1e-6, silu, m->gst);
}

/* Replicate padding of p (padded layout of L, interior of T frames set): borders of
 * each frame from its edge pixels, then frames 0 and 1 copies of frame 2. */
static void pad_fill(dl_hunyuan_vae *m, const level *L, int64_t C, int64_t T) {
    const size_t es = dl_dtype_size(m->dt);
    const int64_t W2 = L->w + 2, H2 = L->h + 2, P = H2 * W2, ldc = (L->tm + 2) * P;
    char *p = m->p;
    DL_PAR({
        int64_t c0, c1;
        dl_split(C, ith, nth, &c0, &c1);
        for (int64_t c = c0; c < c1; c++) {
            char *pc = p + (size_t)(c * ldc) * es;
            for (int64_t t = 2; t < T + 2; t++) {
                char *f = pc + (size_t)(t * P) * es;
                for (int64_t i = 1; i <= L->h; i++) {
                    char *row = f + (size_t)(i * W2) * es;
                    memcpy(row, row + es, es);
                    memcpy(row + (size_t)(W2 - 1) * es, row + (size_t)(W2 - 2) * es, es);
                }
                memcpy(f, f + (size_t)W2 * es, (size_t)W2 * es);
                memcpy(f + (size_t)((H2 - 1) * W2) * es, f + (size_t)((H2 - 2) * W2) * es, (size_t)W2 * es);
            }
            memcpy(pc, pc + (size_t)(2 * P) * es, (size_t)P * es);
            memcpy(pc + (size_t)P * es, pc + (size_t)(2 * P) * es, (size_t)P * es);
        }
    });
}

/* the causal conv over p (interior of T frames set) -> y [cout, tm, hw] */
static dl_status cconv_run(dl_hunyuan_vae *m, cconv *cc, int64_t T) {
    pad_fill(m, &m->lev[cc->lv], cc->cin, T);
    return dl_conv_run(cc->c, m->p, m->y);
}

/* residual block on the stream x [cin, tm, hw] (T real frames) -> [cout, tm, hw] in place */
static dl_status res_run(dl_hunyuan_vae *m, hres *r, int64_t T) {
    const level *L = &m->lev[r->lv];
    const int64_t ld = L->tm * L->hw;
    dl_status s;
    if (r->sc) { /* shortcut(x) into s */
        const void *in = m->x;
        if (m->dt != DL_F32) copy_to(m->dt, m->y, flat(L), DL_F32, m->x, ld, r->cin, T, L), in = m->y;
        if ((s = dl_conv_run(r->sc, in, m->s))) return s;
    }
    group_norm(m, m->p, pad_in(L), DL_F32, m->x, ld, r->cin, T, L, r->n1w, r->n1b, 1);
    if ((s = cconv_run(m, &r->c1, T))) return s;
    group_norm(m, m->p, pad_in(L), m->dt, m->y, ld, r->cout, T, L, r->n2w, r->n2b, 1);
    if ((s = cconv_run(m, &r->c2, T))) return s;
    dl_vresidual(m->x, m->dt, m->y, r->sc ? m->s : NULL, ld, r->cout, T * L->hw);
    return DL_OK;
}

/* mid attention on x [c0, tm0, hw0], T real frames: frame t's queries see frames <= t */
static dl_status attn_run(dl_hunyuan_vae *m, int64_t T) {
    const level *L = &m->lev[0];
    const int64_t C = m->c0, hw = L->hw, ld = L->tm * hw, S = T * hw;
    dl_status s;
    group_norm(m, m->p, tokens(L, C), DL_F32, m->x, ld, C, T, L, m->aw, m->ab, 0); /* p: [S, C] */
    if ((s = lin_run(&m->qkv, m->p, m->q))) return s;                            /* q: [S, 3C] */
    for (int64_t t = 0; t < T; t++) {
        dl_attn_args a = attn_args(m, t);
        DL_PAR(dl_attn_t(&a, m->ascr, ith, nth)); /* p rows of frame t: [hw, C] */
    }
    if ((s = lin_run(&m->out, m->p, m->y))) return s; /* y: [S, C] */
    const dl_dtype dt = m->dt;
    float *x = m->x;
    const void *y = m->y;
    DL_PAR({
        int64_t c0, c1;
        dl_split(C, ith, nth, &c0, &c1);
        for (int64_t c = c0; c < c1; c++)
            for (int64_t k = 0; k < S; k++) x[c * ld + k] += dl_ld(dt, y, k * C + c);
    });
    return DL_OK;
}

/* upsampler u (level lv -> lv + 1): x [C, tm, hw] (T frames) -> x [C, tm', hw'] (1 + (T - 1) tf frames) */
static dl_status up_run(dl_hunyuan_vae *m, hup *u, int lv, int64_t *T) {
    const level *L = &m->lev[lv], *L2 = &m->lev[lv + 1];
    const int64_t C = u->c, ld = L->tm * L->hw, T2 = 1 + (*T - 1) * u->tf, w = L->w, hw = L->hw;
    const int tf = u->tf, sf = u->sf;
    const layout o = pad_in(L2);
    const dl_dtype dt = m->dt;
    const float *x = m->x;
    void *p = m->p;
    DL_PAR({ /* nearest: frame 0 from frame 0, frame t2 > 0 from 1 + (t2 - 1) / tf; pixel (i, j) from (i / sf, j / sf) */
        int64_t r0, r1;
        dl_split(C * T2, ith, nth, &r0, &r1);
        for (int64_t r = r0; r < r1; r++) {
            const int64_t c = r / T2, t2 = r % T2, ts = t2 == 0 ? 0 : 1 + (t2 - 1) / tf, so = c * ld + ts * hw;
            for (int64_t i = 0; i < L2->h; i++)
                for (int64_t j = 0; j < L2->w; j++) dl_st(dt, p, dl_vat(&o, c, t2, i, j), x[so + i / sf * w + j / sf]);
        }
    });
    dl_status s = cconv_run(m, &u->conv, T2); /* y: [C, tm', hw'] */
    if (s) return s;
    copy_to(DL_F32, m->x, flat(L2), dt, m->y, L2->tm * L2->hw, C, T2, L2);
    *T = T2;
    return DL_OK;
}

/* post_quant_conv + decoder of latent frames [f0, f0 + T) -> dec [3, tmL, hwL] (frames [0, 1 + 4 (T - 1))) */
static dl_status tile_run(dl_hunyuan_vae *m, const float *z, int64_t f0, int64_t T) {
    const level *L0 = &m->lev[0];
    const int64_t hw0 = L0->hw, ld0 = L0->tm * hw0;
    dl_status s;
    copy_to(m->dt, m->s, flat(L0), DL_F32, z + f0 * hw0, m->F * hw0, m->zc, T, L0); /* s: [zc, tm0, hw0] */
    if ((s = dl_conv_run(m->pq, m->s, m->y))) return s;
    copy_to(m->dt, m->p, pad_in(L0), m->dt, m->y, ld0, m->zc, T, L0);
    if ((s = cconv_run(m, &m->cin, T))) return s;
    copy_to(DL_F32, m->x, flat(L0), m->dt, m->y, ld0, m->c0, T, L0); /* x: [c0, tm0, hw0] */
    if ((s = res_run(m, &m->res[0], T)) || (m->attn && (s = attn_run(m, T))) || (s = res_run(m, &m->res[1], T))) return s;
    int ri = 2, lv = 0;
    for (int b = 0; b < m->nb; b++) {
        for (int j = 0; j <= m->lpb; j++)
            if ((s = res_run(m, &m->res[ri++], T))) return s;
        if (m->upb[b] >= 0) {
            if ((s = up_run(m, &m->up[m->upb[b]], lv, &T))) return s;
            lv++;
        }
    }
    const level *L = &m->lev[lv];
    const int64_t ld = L->tm * L->hw;
    group_norm(m, m->p, pad_in(L), DL_F32, m->x, ld, m->c_last, T, L, m->gow, m->gob, 1);
    if ((s = cconv_run(m, &m->cout, T))) return s; /* y: [3, tmL, hwL] */
    copy_to(DL_F32, m->dec, flat(L), m->dt, m->y, ld, 3, T, L);
    return DL_OK;
}

/* video[:, v0 : v0 + n) = dec[:, d0 : d0 + n) */
static void put_frames(const dl_hunyuan_vae *m, float *video, int64_t v0, int64_t d0, int64_t n) {
    const level *L = &m->lev[m->nlev - 1];
    const int64_t nf = dl_hunyuan_vae_frames(m);
    for (int64_t c = 0; c < 3; c++)
        memcpy(video + (c * nf + v0) * L->hw, m->dec + (c * L->tm + d0) * L->hw, (size_t)(n * L->hw) * 4);
}

dl_status dl_hunyuan_vae_decode(dl_hunyuan_vae *m, const float *z, float *video,
                                void (*on_chunk)(void *ctx, int done, int total), void *ctx) {
    const level *L = &m->lev[m->nlev - 1];
    const int64_t n = m->zc * m->F * m->lev[0].hw, nf = dl_hunyuan_vae_frames(m), hw = L->hw, ldd = L->tm * hw;
    dl_status s;
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(z[i])) return dl_fail(DL_ERR_INVALID, "HunyuanVideo VAE: latent is not finite at %lld", (long long)i);
    if (m->F <= TILE_MIN) { /* one decode */
        if ((s = tile_run(m, z, 0, m->F))) return s;
        put_frames(m, video, 0, 0, nf);
        if (on_chunk) on_chunk(ctx, 1, 1);
        return DL_OK;
    }
    int64_t v0 = 0, prev = 0; /* video frames written; length of the previous (dropped, blended) tile */
    int done = 0;
    for (int64_t i = 0, k = 0; i < m->F; i += TILE_STRIDE, k++) {
        const int64_t T = m->F - i < TILE_MIN + 1 ? m->F - i : TILE_MIN + 1;
        if (k > 0 && T == 1) break; /* one video frame, dropped: adds nothing (and is the last tile) */
        if ((s = tile_run(m, z, i, T))) return s;
        const int64_t d0 = k > 0, len = (T - 1) * T_RATIO + 1 - d0; /* tiles after the first drop frame 0 */
        if (k > 0) { /* blend_t(prev, cur, 4): cur[x] = prev[-e + x] (1 - x / e) + cur[x] (x / e) */
            const int64_t e = prev < len ? (prev < TILE_BLEND ? prev : TILE_BLEND) : (len < TILE_BLEND ? len : TILE_BLEND);
            const int64_t tn = prev < TILE_BLEND ? prev : TILE_BLEND;
            for (int64_t x = 0; x < e; x++) {
                const float wa = (float)(1.0 - (double)x / (double)e), wb = (float)((double)x / (double)e);
                for (int64_t c = 0; c < 3; c++) {
                    float *cur = m->dec + c * ldd + (d0 + x) * hw;
                    const float *pv = m->tail + (c * TILE_BLEND + tn - e + x) * hw;
                    for (int64_t j = 0; j < hw; j++) cur[j] = pv[j] * wa + cur[j] * wb;
                }
            }
        }
        int64_t take = k > 0 ? TILE_TAKE : TILE_TAKE + 1;
        take = take < len ? take : len;
        take = take < nf - v0 ? take : nf - v0;
        put_frames(m, video, v0, d0, take);
        v0 += take;
        const int64_t tn = len < TILE_BLEND ? len : TILE_BLEND; /* keep the blended tile's last frames */
        for (int64_t c = 0; c < 3; c++)
            memcpy(m->tail + c * TILE_BLEND * hw, m->dec + c * ldd + (d0 + len - tn) * hw, (size_t)(tn * hw) * 4);
        prev = len;
        done++;
        if (on_chunk) on_chunk(ctx, done, m->ntiles);
    }
    DL_ASSERT(v0 == nf && done == m->ntiles);
    return DL_OK;
}
