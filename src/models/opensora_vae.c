/* OpenSoraVAE v1.2 decoder (Open-Sora v1.2.0's VideoAutoencoderPipeline.decode; the
 * folder layout in docs/opensora.md), channels-first activations.
 *
 *   z [zc, T, h, w] (the sampler's latent) -> z * scale[c] + shift[c]
 *   temporal VAE on chunks of mz = ceil(M / tf) latent frames (M = micro_frame_size,
 *     tf = 2^(true entries of temporal_downsample): 17 frames -> 5), each decoded alone
 *     (no context across chunks): nf = min(M, F - frames so far) video frames,
 *     x = decoder(post_quant_conv(chunk))[:, pad:], pad = (tf - nf % tf) % tf;
 *     chunks appended in time -> x_z [oc, F, h, w]; T = (F / M) mz + ceil((F % M) / tf)
 *   decoder: conv1 (lc -> c0) -> res_blocks -> for block i = nb - 1 .. 0:
 *     block_res_blocks[i][*] (first: previous channels -> filters mult[i]), then for
 *     i > 0 with temporal_downsample[i - 1]: conv_blocks[i - 1] (C -> 2C) and depth to
 *     time (channel 2c + s -> frame 2t + s of channel c) -> GroupNorm + SiLU -> conv_out
 *   causal conv (k 3): 2 zero frames before the chunk, 1 zero pixel each side; T frames
 *     in, T out. GroupNorm(G, eps 1e-5) over a group's channels x the chunk's frames x h w.
 *   res (cin -> cout): conv2(SiLU(GN2(conv1(SiLU(GN1(x)))))) + (cin != cout ? conv3(x) : x),
 *     these three convolutions without bias (conv3 is 1x1x1)
 *   spatial: each frame through diffusers' AutoencoderKL decode (post_quant_conv
 *     included) of x_z / 0.18215 (VideoAutoencoderKL's constant, not the config's
 *     scaling_factor) -> video [3, F, H, W], H = 8 h (the SDXL VAE), not clamped
 *
 * Memory is one chunk's. The temporal decoder is built once, for the largest chunk
 * (tm[l] frames at level l); a shorter last chunk runs the same convolutions over
 * the same buffers with only its first T frames real: a causal conv's output frame t
 * reads input frames <= t, norms read real frames only and depth to time is per
 * frame, so the extra frames cost time (one chunk at most) but never change a real
 * output, and the packed weights exist once (165 M parameters in VAE_Temporal_SD). The
 * spatial VAE (vae.c, its weights under `spatial_vae.module.`) is built for one frame;
 * the reference's micro-batches of 4 frames only bound its memory (every frame is
 * decoded independently). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "difflet/opensora.h"
#include "models/models_impl.h"

enum { MAX_BLOCKS = 8, MAX_FRAMES = 1 << 16 };

/* VideoAutoencoderKL divides by this before the spatial decode */
static const float k_sd_scale = 0.18215f;
/* what vae_2d.from_pretrained names in the published checkpoint, and its diffusers
 * config (the SDXL VAE), used when the folder has no vae/spatial_config.json */
static const char k_sdxl_ref[] = "PixArt-alpha/pixart_sigma_sdxlvae_T5_diffusers";
static const char k_sdxl_cfg[] =
    "{\"_class_name\": \"AutoencoderKL\", \"act_fn\": \"silu\", \"block_out_channels\": [128, 256, 512, 512], "
    "\"in_channels\": 3, \"out_channels\": 3, \"latent_channels\": 4, \"layers_per_block\": 2, "
    "\"norm_num_groups\": 32, \"scaling_factor\": 0.13025}";

/* the temporal VAE's architecture (vae_temporal) */
typedef struct {
    int64_t io, lc, zc;           /* in_out_channels, latent_embed_dim, embed_dim */
    int64_t filters, nrb, groups; /* filters, num_res_blocks, num_groups */
    int64_t mult[MAX_BLOCKS];     /* channel_multipliers [nb] */
    int64_t tdown[MAX_BLOCKS];    /* temporal_downsample [nb - 1] */
    int nb;
} tcfg;

/* VAE_Temporal_SD: the fixed configuration */
static const tcfg k_temporal_sd = {.io = 4, .lc = 4, .zc = 4, .filters = 128, .nrb = 4, .groups = 32,
                                   .mult = {1, 2, 2, 4}, .tdown = {0, 1, 1}, .nb = 4};

typedef struct {
    int64_t cin, cout;
    int lv;
    float *n1w, *n1b, *n2w, *n2b; /* [cin], [cin], [cout], [cout] */
    dl_conv *c1, *c2;             /* causal 3x3x3, no bias: [cin | cout, 2 + tm, h, w] -> [cout, tm, h, w] */
    dl_conv *sc;                  /* conv3 1x1x1, no bias: [cin, tm, h, w] -> [cout, tm, h, w] (cin != cout) */
} tres;

struct dl_opensora_vae {
    dl_dtype dt;
    int64_t F, H, W;           /* video frames and size */
    int64_t zc, T, h, w, hw;   /* latent channels (embed_dim), frames, size */
    int64_t M, mz, tf;         /* micro_frame_size, its latent frames, temporal factor */
    int nchunks;
    float *scale, *shift;      /* [zc] */
    /* the temporal decoder, for the largest chunk: tm[l] frames at level l */
    int64_t G, lc, oc;         /* groups, latent_embed_dim, in_out_channels (x_z's) */
    int64_t c0, c_last;        /* channels after conv1, before conv_out */
    int nb, nrb, nlev;
    int64_t tm[MAX_BLOCKS];
    dl_conv *pq;               /* post_quant_conv 1x1x1: [zc, tm0, hw] -> [lc, tm0, hw] */
    dl_conv *cin;              /* conv1, causal: lc -> c0 at level 0 */
    tres *res;                 /* res_blocks, then block_res_blocks[nb - 1 .. 0], run order */
    int nres;
    dl_conv *up[MAX_BLOCKS];   /* after block i: conv_blocks[i - 1], causal upc[i] -> 2 upc[i] (NULL: none) */
    int64_t upc[MAX_BLOCKS];
    int uplv[MAX_BLOCKS];      /* its input level */
    float *now, *nob;          /* norm1 [c_last] */
    dl_conv *cout;             /* conv_out, causal: c_last -> oc at the last level */
    dl_vae_decoder *sp;        /* the spatial VAE: one frame [oc, h, w] -> [3, H, W] */
    /* activations (one arena, all live through a chunk) */
    float *x;                  /* f32 stream [C, tm, hw] of the current level */
    void *p;                   /* dt: causal conv input [C, 2 + tm, hw], frames 0 and 1 zero */
    void *y;                   /* dt: conv output [C, tm, hw]; after a chunk [oc, tmL, hw] */
    void *s;                   /* dt: shortcut output; the chunk's scaled latent [zc, tm0, hw] */
    double *gst;               /* [G, 2] group mean, 1 / std */
    float *lat;                /* [oc, hw]: one frame of x_z / 0.18215 */
    float *img;                /* [3, H, W]: one decoded frame */
    void *arena;
    size_t act_bytes;          /* this arena and the spatial VAE's */
};

void dl_opensora_vae_latent_size(const dl_opensora_vae *m, int64_t lat[3]) {
    lat[0] = m->T, lat[1] = m->h, lat[2] = m->w;
}
int64_t dl_opensora_vae_channels(const dl_opensora_vae *m) { return m->zc; }
int dl_opensora_vae_chunks(const dl_opensora_vae *m) { return m->nchunks; }
size_t dl_opensora_vae_activation_bytes(const dl_opensora_vae *m) { return m->act_bytes; }

void dl_opensora_vae_free(dl_opensora_vae *m) {
    if (!m) return;
    for (int i = 0; m->res && i < m->nres; i++) {
        tres *r = &m->res[i];
        free(r->n1w), free(r->n1b), free(r->n2w), free(r->n2b);
        dl_conv_free(r->c1), dl_conv_free(r->c2), dl_conv_free(r->sc);
    }
    for (int i = 0; i < MAX_BLOCKS; i++) dl_conv_free(m->up[i]);
    free(m->res), free(m->scale), free(m->shift), free(m->now), free(m->nob);
    dl_conv_free(m->pq), dl_conv_free(m->cin), dl_conv_free(m->cout);
    dl_vae_decoder_free(m->sp);
    dl_aligned_free(m->arena);
    free(m);
}

/* ---- configuration ---------------------------------------------------------------- */

/* `key` of o: a list of 1..MAX_BLOCKS positive integers, or (bools) of true / false */
static dl_status cfg_list(const cJSON *o, const char *file, const char *key, int bools, int64_t *v, int *n) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) > MAX_BLOCKS)
        return dl_fail(DL_ERR_FORMAT, "`%s`: vae_temporal.%s must be a list of at most %d %s", file, key, MAX_BLOCKS,
                       bools ? "booleans" : "integers");
    *n = cJSON_GetArraySize(a);
    for (int i = 0; i < *n; i++) {
        const cJSON *e = cJSON_GetArrayItem(a, i);
        if (bools ? !cJSON_IsBool(e)
                  : (!cJSON_IsNumber(e) || e->valuedouble != (double)(int64_t)e->valuedouble || e->valuedouble < 1 ||
                     e->valuedouble > 64))
            return dl_fail(DL_ERR_FORMAT, "`%s`: vae_temporal.%s[%d] must be %s", file, key, i,
                           bools ? "true or false" : "an integer in [1, 64]");
        v[i] = bools ? cJSON_IsTrue(e) : (int64_t)e->valuedouble;
    }
    return DL_OK;
}

/* vae_temporal: VAE_Temporal_SD (fixed) or VAE_Temporal with every argument given */
static dl_status read_temporal(const cJSON *vt, const char *file, tcfg *t) {
    static const char *const keys[] = {"type", "from_pretrained", "in_out_channels", "latent_embed_dim", "embed_dim",
                                       "filters", "num_res_blocks", "channel_multipliers", "temporal_downsample",
                                       "num_groups"};
    const int nkeys = (int)(sizeof keys / sizeof *keys);
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(vt, "type"), *e;
    if (!cJSON_IsString(ty))
        return dl_fail(DL_ERR_FORMAT, "`%s`: vae_temporal.type must be \"VAE_Temporal_SD\" or \"VAE_Temporal\"", file);
    const int sd = !strcmp(ty->valuestring, "VAE_Temporal_SD");
    if (!sd && strcmp(ty->valuestring, "VAE_Temporal"))
        return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: vae_temporal.type \"%s\" is not supported (VAE_Temporal_SD, VAE_Temporal)",
                       file, ty->valuestring);
    cJSON_ArrayForEach(e, vt) { /* an argument this decoder does not know could change the architecture */
        int k = 0;
        while (k < (sd ? 2 : nkeys) && strcmp(e->string, keys[k])) k++;
        if (k == (sd ? 2 : nkeys))
            return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: vae_temporal.%s is not supported%s", file, e->string,
                           sd ? " with VAE_Temporal_SD (its architecture is fixed)" : "");
    }
    if (sd) {
        *t = k_temporal_sd;
        return DL_OK;
    }
    for (int k = 2; k < nkeys; k++)
        if (!cJSON_GetObjectItemCaseSensitive(vt, keys[k]))
            return dl_fail(DL_ERR_FORMAT, "`%s`: vae_temporal.%s is missing (VAE_Temporal needs every argument)", file,
                           keys[k]);
    struct {
        const char *key;
        int64_t *v;
    } ints[] = {{"in_out_channels", &t->io}, {"latent_embed_dim", &t->lc}, {"embed_dim", &t->zc},
                {"filters", &t->filters}, {"num_res_blocks", &t->nrb}, {"num_groups", &t->groups}};
    for (size_t i = 0; i < sizeof ints / sizeof *ints; i++) {
        e = cJSON_GetObjectItemCaseSensitive(vt, ints[i].key);
        if (!cJSON_IsNumber(e) || e->valuedouble != (double)(int64_t)e->valuedouble || e->valuedouble < 0 ||
            e->valuedouble > 65536 || (e->valuedouble == 0 && strcmp(ints[i].key, "num_res_blocks")))
            return dl_fail(DL_ERR_FORMAT, "`%s`: vae_temporal.%s must be an integer in [%d, 65536]", file, ints[i].key,
                           strcmp(ints[i].key, "num_res_blocks") != 0);
        *ints[i].v = (int64_t)e->valuedouble;
    }
    int nt;
    dl_status s;
    if ((s = cfg_list(vt, file, "channel_multipliers", 0, t->mult, &t->nb)) ||
        (s = cfg_list(vt, file, "temporal_downsample", 1, t->tdown, &nt)))
        return s;
    if (t->nb < 1 || nt != t->nb - 1)
        return dl_fail(DL_ERR_FORMAT,
                       "`%s`: vae_temporal.temporal_downsample has %d entries, channel_multipliers %d (needs one fewer)", file,
                       nt, t->nb);
    if (t->nrb > 16)
        return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: vae_temporal.num_res_blocks %lld is over 16", file, (long long)t->nrb);
    for (int i = 0; i < t->nb; i++)
        if (t->filters * t->mult[i] % t->groups)
            return dl_fail(DL_ERR_FORMAT,
                           "`%s`: vae_temporal.num_groups %lld does not divide filters x channel_multipliers[%d] = %lld", file,
                           (long long)t->groups, i, (long long)(t->filters * t->mult[i]));
    return DL_OK;
}

/* scale / shift: zc numbers (or one for every channel) */
static dl_status read_affine(const cJSON *cfg, const char *file, const char *key, int64_t zc, float **out) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (!(*out = malloc((size_t)zc * sizeof **out))) return dl_fail(DL_ERR_NOMEM, "out of memory");
    if (cJSON_IsNumber(a)) {
        for (int64_t i = 0; i < zc; i++) (*out)[i] = (float)a->valuedouble;
        return DL_OK;
    }
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != zc)
        return dl_fail(DL_ERR_FORMAT, "`%s`: \"%s\" must list embed_dim = %lld numbers", file, key, (long long)zc);
    for (int i = 0; i < zc; i++) {
        const cJSON *e = cJSON_GetArrayItem(a, i);
        if (!cJSON_IsNumber(e)) return dl_fail(DL_ERR_FORMAT, "`%s`: \"%s\"[%d] must be a number", file, key, i);
        (*out)[i] = (float)e->valuedouble;
    }
    return DL_OK;
}

/* The pipeline config: chunking, scale / shift, the temporal architecture into t, and
 * the spatial VAE's diffusers config into *sp (the caller frees it) named *spname. */
static dl_status read_config(dl_opensora_vae *m, dl_model_dir *dir, const char *component, const cJSON *cfg,
                             const char *file, tcfg *t, cJSON **sp, char *spname, size_t nspname) {
    dl_status s;
    const char *mt;
    if ((s = dl_cfg_str(cfg, file, "model_type", "VideoAutoencoderPipeline", &mt))) return s;
    if (strcmp(mt, "VideoAutoencoderPipeline"))
        return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: model_type \"%s\" is not VideoAutoencoderPipeline", file, mt);
    const cJSON *mf = cJSON_GetObjectItemCaseSensitive(cfg, "micro_frame_size");
    if (!cJSON_IsNumber(mf) || mf->valuedouble != (double)(int64_t)mf->valuedouble || mf->valuedouble < 1 ||
        mf->valuedouble > MAX_FRAMES)
        return dl_fail(DL_ERR_UNSUPPORTED,
                       "`%s`: micro_frame_size must be an integer in [1, %d] (null, one decode of the whole clip, is not "
                       "supported)",
                       file, MAX_FRAMES);
    m->M = (int64_t)mf->valuedouble;
    const cJSON *v2 = cJSON_GetObjectItemCaseSensitive(cfg, "vae_2d");
    const cJSON *vt = cJSON_GetObjectItemCaseSensitive(cfg, "vae_temporal");
    if (!cJSON_IsObject(v2) || !cJSON_IsObject(vt))
        return dl_fail(DL_ERR_FORMAT, "`%s`: needs the objects vae_2d and vae_temporal", file);
    if ((s = read_temporal(vt, file, t))) return s;
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(v2, "type");
    const cJSON *fp = cJSON_GetObjectItemCaseSensitive(v2, "from_pretrained");
    if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "VideoAutoencoderKL"))
        return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: vae_2d.type %s%s%s is not supported (VideoAutoencoderKL)", file,
                       cJSON_IsString(ty) ? "\"" : "", cJSON_IsString(ty) ? ty->valuestring : "(missing)",
                       cJSON_IsString(ty) ? "\"" : "");
    if ((s = read_affine(cfg, file, "scale", t->zc, &m->scale)) || (s = read_affine(cfg, file, "shift", t->zc, &m->shift)))
        return s;
    /* the spatial architecture: vae/spatial_config.json, else the built-in SDXL VAE */
    char path[1024];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s/spatial_config.json", dl_model_dir_path(dir), component);
    snprintf(spname, nspname, "%s/spatial_config.json", component);
    if (stat(path, &st) == 0) {
        if ((s = dl_json_read_object(path, spname, sp))) return s;
    } else if (cJSON_IsString(fp) && !strcmp(fp->valuestring, k_sdxl_ref)) {
        snprintf(spname, nspname, "the SDXL VAE config (vae_2d.from_pretrained %s)", k_sdxl_ref);
        if (!(*sp = cJSON_Parse(k_sdxl_cfg))) return dl_fail(DL_ERR_NOMEM, "out of memory");
    } else {
        return dl_fail(DL_ERR_UNSUPPORTED,
                       "`%s`: vae_2d.from_pretrained %s%s%s is not supported: give its diffusers AutoencoderKL config as "
                       "%s/spatial_config.json (built in: %s)",
                       file, cJSON_IsString(fp) ? "\"" : "", cJSON_IsString(fp) ? fp->valuestring : "(null)",
                       cJSON_IsString(fp) ? "\"" : "", component, k_sdxl_ref);
    }
    const char *cls;
    if ((s = dl_cfg_str(*sp, spname, "_class_name", "AutoencoderKL", &cls))) return s;
    if (strcmp(cls, "AutoencoderKL"))
        return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: _class_name \"%s\" is not AutoencoderKL", spname, cls);
    return DL_OK;
}

/* ---- loading ---------------------------------------------------------------------- */

/* The largest buffer each activation needs, in elements, grown while loading. */
typedef struct {
    size_t x, p, y, s;
} need;
#define GROW(f, v) (nd->f = nd->f > (size_t)(v) ? nd->f : (size_t)(v))

/* a causal 3x3x3 conv at level lv: [cin, 2 + tm, h, w] (the 2 zero frames in front;
 * oneDNN pads h and w) -> [cout, tm, h, w]; `<base>.weight` and, when bias, `.bias` */
static dl_status cconv_load(dl_opensora_vae *m, dl_conv **c, dl_wsrc *ws, const char *base, int64_t cin, int64_t cout,
                            int lv, int bias, need *nd) {
    const dl_conv_desc d = {.ndim = 3, .cin = cin, .cout = cout, .in = {2 + m->tm[lv], m->h, m->w},
                            .kernel = {3, 3, 3}, .stride = {1, 1, 1}, .pad = {0, 1, 1}, .dt = m->dt};
    GROW(p, cin * (2 + m->tm[lv]) * m->hw);
    GROW(y, cout * m->tm[lv] * m->hw);
    if (bias) return dl_conv_load(c, ws, base, &d);
    char n[300];
    snprintf(n, sizeof n, "%s.bias", base);
    if (dl_ws_find(ws, n))
        return dl_fail(DL_ERR_FORMAT, "`%s`: unexpected %s (the temporal VAE's residual convolutions have no bias)",
                       dl_ws_label(ws), n);
    /* no bias: the plain weight (recorded unpacked when compiling), packed here */
    const int64_t shape[5] = {cout, cin, 3, 3, 3};
    float *w = NULL;
    snprintf(n, sizeof n, "%s.weight", base);
    dl_status s = dl_param_f32(ws, n, 5, shape, &w);
    if (s == DL_OK) s = dl_conv_new(c, &d, w, DL_F32, NULL);
    free(w);
    return s;
}

/* GroupNorm `<pre><name>.weight` / `.bias`, [c] each */
static dl_status norm_load(dl_wsrc *ws, const char *pre, const char *name, int64_t c, float **w, float **b) {
    char n[300];
    dl_status s;
    if ((s = dl_param_vec(ws, dl_pname(n, sizeof n, pre, "%s.weight", name), c, w))) return s;
    return dl_param_vec(ws, dl_pname(n, sizeof n, pre, "%s.bias", name), c, b);
}

static dl_status unexpected(dl_wsrc *ws, const char *name, const char *why) {
    return dl_ws_find(ws, name) ? dl_fail(DL_ERR_FORMAT, "`%s`: unexpected %s (%s)", dl_ws_label(ws), name, why) : DL_OK;
}

static dl_status res_load(dl_opensora_vae *m, tres *r, dl_wsrc *ws, const char *pre, int64_t cin, int64_t cout, int lv,
                          need *nd) {
    char n[300];
    const int64_t S = m->tm[lv] * m->hw;
    dl_status s;
    r->cin = cin, r->cout = cout, r->lv = lv;
    if ((s = norm_load(ws, pre, "norm1", cin, &r->n1w, &r->n1b)) ||
        (s = norm_load(ws, pre, "norm2", cout, &r->n2w, &r->n2b)) ||
        (s = cconv_load(m, &r->c1, ws, dl_pname(n, sizeof n, pre, "conv1.conv"), cin, cout, lv, 0, nd)) ||
        (s = cconv_load(m, &r->c2, ws, dl_pname(n, sizeof n, pre, "conv2.conv"), cout, cout, lv, 0, nd)))
        return s;
    GROW(x, (cin > cout ? cin : cout) * S);
    if (cin == cout) return unexpected(ws, dl_pname(n, sizeof n, pre, "conv3.conv.weight"), "in and out channels are equal");
    const dl_conv_desc d = {.ndim = 3, .cin = cin, .cout = cout, .in = {m->tm[lv], m->h, m->w}, .kernel = {1, 1, 1},
                            .stride = {1, 1, 1}, .dt = m->dt};
    const int64_t shape[5] = {cout, cin, 1, 1, 1};
    float *w = NULL;
    GROW(y, cin * S); /* the stream converted to dt (bf16) */
    GROW(s, cout * S);
    if ((s = unexpected(ws, dl_pname(n, sizeof n, pre, "conv3.conv.bias"), "the shortcut has no bias")) ||
        (s = dl_param_f32(ws, dl_pname(n, sizeof n, pre, "conv3.conv.weight"), 5, shape, &w)))
        return s;
    s = dl_conv_new(&r->sc, &d, w, DL_F32, NULL);
    free(w);
    return s;
}

/* the temporal decoder (`temporal_vae.*`) for m's levels */
static dl_status load_temporal(dl_opensora_vae *m, const tcfg *t, dl_wsrc *ws, need *nd) {
    char p[300], q[300];
    dl_status s;
    const int64_t hw = m->hw, tm0 = m->tm[0];
    {
        const dl_conv_desc d = {.ndim = 3, .cin = m->zc, .cout = m->lc, .in = {tm0, m->h, m->w}, .kernel = {1, 1, 1},
                                .stride = {1, 1, 1}, .dt = m->dt};
        if ((s = dl_conv_load(&m->pq, ws, "temporal_vae.post_quant_conv.conv", &d))) return s;
        GROW(s, m->zc * tm0 * hw);
        GROW(y, m->lc * tm0 * hw);
        if ((s = cconv_load(m, &m->cin, ws, "temporal_vae.decoder.conv1.conv", m->lc, m->c0, 0, 1, nd))) return s;
        GROW(x, m->c0 * tm0 * hw);
    }
    m->nres = (int)((1 + t->nb) * t->nrb);
    if (m->nres && !(m->res = calloc((size_t)m->nres, sizeof *m->res))) return dl_fail(DL_ERR_NOMEM, "out of memory");
    int ri = 0, lv = 0;
    for (int j = 0; j < t->nrb; j++) {
        snprintf(p, sizeof p, "temporal_vae.decoder.res_blocks.%d.", j);
        if ((s = res_load(m, &m->res[ri++], ws, p, m->c0, m->c0, 0, nd))) return s;
    }
    snprintf(q, sizeof q, "temporal_vae.decoder.res_blocks.%lld.norm1.weight", (long long)t->nrb);
    if ((s = unexpected(ws, q, "num_res_blocks gives fewer"))) return s;
    int64_t prev = m->c0;
    for (int i = t->nb - 1; i >= 0; i--) {
        const int64_t oc = t->filters * t->mult[i];
        for (int j = 0; j < t->nrb; j++) {
            snprintf(p, sizeof p, "temporal_vae.decoder.block_res_blocks.%d.%d.", i, j);
            if ((s = res_load(m, &m->res[ri++], ws, p, j == 0 ? prev : oc, oc, lv, nd))) return s;
        }
        snprintf(q, sizeof q, "temporal_vae.decoder.block_res_blocks.%d.%lld.norm1.weight", i, (long long)t->nrb);
        if ((s = unexpected(ws, q, "num_res_blocks gives fewer"))) return s;
        if (t->nrb) prev = oc;
        if (i == 0) break;
        snprintf(p, sizeof p, "temporal_vae.decoder.conv_blocks.%d.conv", i - 1);
        if (!t->tdown[i - 1]) {
            snprintf(q, sizeof q, "temporal_vae.decoder.conv_blocks.%d.conv.weight", i - 1);
            if ((s = unexpected(ws, q, "temporal_downsample says this block does not upsample time"))) return s;
            continue;
        }
        m->upc[i] = prev, m->uplv[i] = lv;
        if ((s = cconv_load(m, &m->up[i], ws, p, prev, 2 * prev, lv, 1, nd))) return s;
        lv++;
        GROW(x, prev * m->tm[lv] * hw);
    }
    DL_ASSERT(ri == m->nres && lv == m->nlev - 1);
    m->c_last = prev;
    if ((s = norm_load(ws, "temporal_vae.decoder.", "norm1", prev, &m->now, &m->nob)) ||
        (s = cconv_load(m, &m->cout, ws, "temporal_vae.decoder.conv_out.conv", prev, m->oc, lv, 1, nd)))
        return s;
    return DL_OK;
}

dl_status dl_opensora_vae_load(dl_opensora_vae **out, dl_model_dir *dir, const char *component, int64_t frames,
                               int64_t height, int64_t width, dl_dtype dt, dl_wsrc *src) {
    *out = NULL;
    char file[512], spname[512];
    snprintf(file, sizeof file, "%s/config.json", component);
    if (dt != DL_F32 && dt != DL_BF16)
        return dl_fail(DL_ERR_UNSUPPORTED, "OpenSora VAE: dtype %s is not supported (f32, bf16)", dl_dtype_name(dt));
    if (frames < 1 || frames > MAX_FRAMES)
        return dl_fail(DL_ERR_INVALID, "OpenSora VAE: %lld frames is out of range [1, %d]", (long long)frames, MAX_FRAMES);
    if (height < 1 || width < 1 || height > 16384 || width > 16384)
        return dl_fail(DL_ERR_INVALID, "OpenSora VAE: size %lldx%lld is out of range", (long long)width, (long long)height);
    const cJSON *cfg;
    dl_status s = dl_model_dir_config(dir, component, &cfg);
    if (s != DL_OK) return s;
    dl_opensora_vae *m = calloc(1, sizeof *m);
    if (!m) return dl_fail(DL_ERR_NOMEM, "out of memory");
    dl_wsrc *ws = NULL;
    cJSON *sp = NULL;
    tcfg t;
    need nds = {0}, *nd = &nds;
    if ((s = read_config(m, dir, component, cfg, file, &t, &sp, spname, sizeof spname))) goto fail;
    /* sizes: the spatial VAE's scale (2^(levels - 1)), chunks, levels */
    const cJSON *boc = cJSON_GetObjectItemCaseSensitive(sp, "block_out_channels");
    if (!cJSON_IsArray(boc) || cJSON_GetArraySize(boc) < 1 || cJSON_GetArraySize(boc) > 8) {
        s = dl_fail(DL_ERR_FORMAT, "`%s`: block_out_channels must list 1 to 8 channel counts", spname);
        goto fail;
    }
    const int64_t ss = (int64_t)1 << (cJSON_GetArraySize(boc) - 1);
    if (height % ss || width % ss) {
        s = dl_fail(DL_ERR_INVALID,
                    "OpenSora VAE: size %lldx%lld is not a multiple of the spatial VAE's scale %lld (%s); the reference "
                    "decodes %lld floor(width / %lld) x %lld floor(height / %lld)",
                    (long long)width, (long long)height, (long long)ss, spname, (long long)ss, (long long)ss,
                    (long long)ss, (long long)ss);
        goto fail;
    }
    m->dt = dt, m->F = frames, m->H = height, m->W = width;
    m->h = height / ss, m->w = width / ss, m->hw = m->h * m->w;
    if (m->hw > (1 << 22)) {
        s = dl_fail(DL_ERR_INVALID, "OpenSora VAE: latent %lldx%lld is over 2^22 pixels", (long long)m->w, (long long)m->h);
        goto fail;
    }
    m->zc = t.zc, m->lc = t.lc, m->oc = t.io, m->G = t.groups, m->nb = t.nb, m->nrb = (int)t.nrb;
    m->c0 = t.filters * t.mult[t.nb - 1];
    m->tf = 1, m->nlev = 1;
    for (int i = 0; i < t.nb - 1; i++) m->tf <<= t.tdown[i], m->nlev += (int)t.tdown[i];
    m->mz = (m->M + m->tf - 1) / m->tf;
    m->T = frames / m->M * m->mz + (frames % m->M + m->tf - 1) / m->tf;
    m->nchunks = (int)((frames + m->M - 1) / m->M);
    m->tm[0] = m->mz < m->T ? m->mz : m->T;
    for (int l = 1; l < m->nlev; l++) m->tm[l] = 2 * m->tm[l - 1];
    if ((s = dl_ws_open(&ws, src, dir, component)) != DL_OK) goto fail;
    const size_t a0 = ws->arena;
    if ((s = load_temporal(m, &t, ws, nd))) goto fail;
    {
        const int64_t shape[5] = {1, m->zc, 1, 1, 1};
        float *v = NULL;
        /* the checkpoint's buffers (what load_state_dict gives the reference), else the config's */
        for (int k = 0; k < 2; k++) {
            const char *nm = k ? "shift" : "scale";
            if (!dl_ws_find(ws, nm)) continue;
            if ((s = dl_param_f32(ws, nm, 5, shape, &v))) goto fail;
            float **dst = k ? &m->shift : &m->scale;
            free(*dst);
            *dst = v;
        }
    }
    { /* the spatial VAE reads the same source, through an alias its load does not close */
        dl_wsrc alias = *ws;
        alias.owned = 0;
        s = dl_vae_decoder_load_from(&m->sp, dir, component, sp, spname, "spatial_vae.module.", m->h, m->w, dt, &alias);
        ws->arena = alias.arena;
        if (s) goto fail;
    }
    DL_ASSERT(dl_vae_scale(m->sp) == ss);
    if (dl_vae_latent_channels(m->sp) != m->oc) {
        s = dl_fail(DL_ERR_FORMAT, "`%s`: latent_channels %lld, but the temporal VAE gives in_out_channels = %lld", spname,
                    (long long)dl_vae_latent_channels(m->sp), (long long)m->oc);
        goto fail;
    }
    const size_t es = dl_dtype_size(dt);
    act_plan pl = {0};
    dl_plan_add(&pl, &m->x, nd->x * 4, 0, 0);
    dl_plan_add(&pl, &m->p, nd->p * es, 0, 0);
    dl_plan_add(&pl, &m->y, nd->y * es, 0, 0);
    dl_plan_add(&pl, &m->s, nd->s * es, 0, 0);
    dl_plan_add(&pl, &m->gst, (size_t)m->G * 2 * sizeof(double), 0, 0);
    dl_plan_add(&pl, &m->lat, (size_t)(m->oc * m->hw) * 4, 0, 0);
    dl_plan_add(&pl, &m->img, (size_t)(3 * height * width) * 4, 0, 0);
    if ((s = dl_plan_commit(&pl, ws, &m->arena)) != DL_OK) goto fail;
    memset(m->arena, 0, pl.total); /* frames past a short chunk's are read (never used): keep them defined */
    m->act_bytes = ws->arena - a0;
    cJSON_Delete(sp);
    dl_ws_close(ws);
    *out = m;
    return DL_OK;
fail:
    cJSON_Delete(sp);
    dl_ws_close(ws);
    dl_opensora_vae_free(m);
    return s;
}
#undef GROW

/* ---- running ---------------------------------------------------------------------- */

/* [C, tm, h, w] at level lv */
static dl_vlayout flat(const dl_opensora_vae *m, int lv) { return (dl_vlayout){0, m->tm[lv] * m->hw, m->hw, m->w, 1}; }
/* the frames of a causal conv's input [C, 2 + tm, h, w] at level lv (frame t at t + 2) */
static dl_vlayout conv_in(const dl_opensora_vae *m, int lv) {
    return (dl_vlayout){2 * m->hw, (2 + m->tm[lv]) * m->hw, m->hw, m->w, 1};
}

/* causal conv c at level lv over p (cin channels, the caller set the frames): the two
 * frames in front zeroed, then y [cout, tm, hw] */
static dl_status cconv_run(dl_opensora_vae *m, dl_conv *c, int lv, int64_t cin) {
    const size_t es = dl_dtype_size(m->dt), fb = (size_t)(2 * m->hw) * es;
    const int64_t ld = (2 + m->tm[lv]) * m->hw;
    char *p = m->p;
    DL_PAR({
        int64_t c0, c1;
        dl_split(cin, ith, nth, &c0, &c1);
        for (int64_t k = c0; k < c1; k++) memset(p + (size_t)(k * ld) * es, 0, fb);
    });
    return dl_conv_run(c, m->p, m->y);
}

/* residual block on the stream x [cin, tm, hw] (T real frames) -> [cout, tm, hw] in place */
static dl_status res_run(dl_opensora_vae *m, tres *r, int64_t T) {
    const int lv = r->lv;
    const int64_t ld = m->tm[lv] * m->hw;
    const dl_dtype dt = m->dt;
    dl_status s;
    if (r->sc) { /* conv3(x) into s */
        const void *in = m->x;
        if (dt != DL_F32) dl_vcopy(dt, m->y, flat(m, lv), DL_F32, m->x, ld, r->cin, T, m->h, m->w), in = m->y;
        if ((s = dl_conv_run(r->sc, in, m->s))) return s;
    }
    dl_vgroup_norm(dt, m->p, conv_in(m, lv), DL_F32, m->x, ld, r->cin, T, m->h, m->w, m->G, r->n1w, r->n1b, 1e-5, 1, m->gst);
    if ((s = cconv_run(m, r->c1, lv, r->cin))) return s;
    dl_vgroup_norm(dt, m->p, conv_in(m, lv), dt, m->y, ld, r->cout, T, m->h, m->w, m->G, r->n2w, r->n2b, 1e-5, 1, m->gst);
    if ((s = cconv_run(m, r->c2, lv, r->cout))) return s;
    dl_vresidual(m->x, dt, m->y, r->sc ? m->s : NULL, ld, r->cout, T * m->hw);
    return DL_OK;
}

/* conv_blocks after block i, then depth to time: x [C, tm, hw] (T frames) at level lv
 * -> x [C, 2 tm, hw] (2T frames) at lv + 1 */
static dl_status up_run(dl_opensora_vae *m, int i, int64_t *T) {
    const int lv = m->uplv[i];
    const int64_t C = m->upc[i], hw = m->hw, ld = m->tm[lv] * hw, ld2 = m->tm[lv + 1] * hw, T2 = 2 * *T;
    const dl_dtype dt = m->dt;
    dl_vcopy(dt, m->p, conv_in(m, lv), DL_F32, m->x, ld, C, *T, m->h, m->w);
    dl_status s = cconv_run(m, m->up[i], lv, C); /* y: [2C, tm, hw] */
    if (s) return s;
    float *x = m->x;
    const void *y = m->y;
    DL_PAR({ /* frame 2t + s of channel c = frame t of channel 2c + s */
        int64_t r0, r1;
        dl_split(C * T2, ith, nth, &r0, &r1);
        for (int64_t r = r0; r < r1; r++) {
            const int64_t c = r / T2, t2 = r % T2, so = (2 * c + (t2 & 1)) * ld + (t2 >> 1) * hw;
            for (int64_t k = 0; k < hw; k++) x[c * ld2 + t2 * hw + k] = dl_ld(dt, y, so + k);
        }
    });
    *T = T2;
    return DL_OK;
}

/* Chunk k through the temporal decoder: y [oc, tmL, hw] holds x_z's frames [f, f + *nf)
 * of the video as its frames [*pad, *pad + *nf). */
static dl_status chunk_run(dl_opensora_vae *m, const float *z, int k, int64_t *nf, int64_t *pad) {
    const int64_t hw = m->hw, tm0 = m->tm[0], f0 = k * m->mz, zc = m->zc, TL = m->T;
    const dl_dtype dt = m->dt;
    int64_t T = TL - f0 < m->mz ? TL - f0 : m->mz;
    *nf = m->F - k * m->M < m->M ? m->F - k * m->M : m->M;
    *pad = (m->tf - *nf % m->tf) % m->tf;
    DL_ASSERT(T >= 1 && T <= tm0 && T * m->tf == *nf + *pad);
    void *sb = m->s;
    const float *sc = m->scale, *sh = m->shift;
    DL_PAR({ /* s: [zc, tm0, hw] = z * scale + shift */
        int64_t r0, r1;
        dl_split(zc * T, ith, nth, &r0, &r1);
        for (int64_t r = r0; r < r1; r++) {
            const int64_t c = r / T, t = r % T;
            const float *zr = z + (c * TL + f0 + t) * hw;
            for (int64_t i = 0; i < hw; i++) dl_st(dt, sb, (c * tm0 + t) * hw + i, zr[i] * sc[c] + sh[c]);
        }
    });
    dl_status s;
    if ((s = dl_conv_run(m->pq, m->s, m->y))) return s; /* y: [lc, tm0, hw] */
    dl_vcopy(dt, m->p, conv_in(m, 0), dt, m->y, tm0 * hw, m->lc, T, m->h, m->w);
    if ((s = cconv_run(m, m->cin, 0, m->lc))) return s;
    dl_vcopy(DL_F32, m->x, flat(m, 0), dt, m->y, tm0 * hw, m->c0, T, m->h, m->w); /* x: [c0, tm0, hw] */
    int ri = 0;
    for (int j = 0; j < m->nrb; j++)
        if ((s = res_run(m, &m->res[ri++], T))) return s;
    for (int i = m->nb - 1; i >= 0; i--) {
        for (int j = 0; j < m->nrb; j++)
            if ((s = res_run(m, &m->res[ri++], T))) return s;
        if (m->up[i] && (s = up_run(m, i, &T))) return s;
    }
    const int lv = m->nlev - 1;
    const int64_t ld = m->tm[lv] * hw;
    dl_vgroup_norm(dt, m->p, conv_in(m, lv), DL_F32, m->x, ld, m->c_last, T, m->h, m->w, m->G, m->now, m->nob, 1e-5, 1,
                   m->gst);
    return cconv_run(m, m->cout, lv, m->c_last); /* y: [oc, tmL, hw] */
}

static dl_status check_z(const dl_opensora_vae *m, const float *z) {
    const int64_t n = m->zc * m->T * m->hw;
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(z[i])) return dl_fail(DL_ERR_INVALID, "OpenSora VAE: latent is not finite at %lld", (long long)i);
    return DL_OK;
}

dl_status dl_opensora_vae_decode_temporal(dl_opensora_vae *m, const float *z, float *xz) {
    dl_status s = check_z(m, z);
    const int64_t hw = m->hw, ld = m->tm[m->nlev - 1] * hw;
    for (int k = 0; s == DL_OK && k < m->nchunks; k++) {
        int64_t nf, pad;
        if ((s = chunk_run(m, z, k, &nf, &pad))) break;
        const char *y = m->y;
        const size_t es = dl_dtype_size(m->dt);
        for (int64_t c = 0; c < m->oc; c++) /* xz[c, kM : kM + nf) = y[c, pad : pad + nf) */
            dl_convert_t(DL_F32, xz + (c * m->F + k * m->M) * hw, m->dt, y + (size_t)(c * ld + pad * hw) * es, nf * hw, 0, 1);
    }
    return s;
}

dl_status dl_opensora_vae_decode(dl_opensora_vae *m, const float *z, float *video,
                                 void (*on_chunk)(void *ctx, int done, int total), void *ctx) {
    dl_status s = check_z(m, z);
    const int64_t hw = m->hw, ld = m->tm[m->nlev - 1] * hw, HW = m->H * m->W;
    const dl_dtype dt = m->dt;
    for (int k = 0; s == DL_OK && k < m->nchunks; k++) {
        int64_t nf, pad;
        if ((s = chunk_run(m, z, k, &nf, &pad))) break;
        for (int64_t t = 0; t < nf; t++) {
            const int64_t f = k * m->M + t;
            const void *y = m->y;
            float *lat = m->lat;
            DL_PAR({ /* lat: [oc, hw] = x_z frame f / 0.18215 */
                int64_t r0, r1;
                dl_split(m->oc * hw, ith, nth, &r0, &r1);
                for (int64_t r = r0; r < r1; r++) lat[r] = dl_ld(dt, y, r / hw * ld + (pad + t) * hw + r % hw) / k_sd_scale;
            });
            if ((s = dl_vae_decode(m->sp, m->lat, m->img))) return s;
            for (int64_t c = 0; c < 3; c++) memcpy(video + (c * m->F + f) * HW, m->img + c * HW, (size_t)HW * 4);
        }
        if (on_chunk) on_chunk(ctx, k + 1, m->nchunks);
    }
    return s;
}
