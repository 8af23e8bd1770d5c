/* FluxPipeline's host flow (diffusers):
 *   encode: CLIP pooled embedding (77 tokens) and T5 sequence embedding
 *           (max_sequence_length tokens), both padded as the reference pads them;
 *   latents: initial noise [C, h, w] packed 2x2 into [N, 4C] tokens;
 *   loop:   v = transformer(latents, sigma) (twice with true CFG: v = vn + s(vp - vn));
 *           latents += (sigma_next - sigma) * v;
 *   decode: unpack, z / scaling_factor + shift_factor, VAE decode, (x/2 + 0.5)
 *           clamped to [0, 1], x255 rounded.
 *
 * image-to-image (FluxImg2ImgPipeline) and inpainting (FluxInpaintPipeline):
 *   x0 = (VAE encoder mean(image / 127.5 - 1) - shift) * scaling, packed;
 *   the schedule's first t_start = int(steps - steps * strength) steps are skipped;
 *   latents = s0 * noise + (1 - s0) * x0 at the first remaining sigma s0;
 *   inpainting, after each step: latents = (1 - m) * (s' noise + (1 - s') x0) + m * latents
 *   with s' the next sigma and m the binarised mask, nearest-sampled to the latent grid.
 *   The encoder is a program of its own, built on the first such request.
 *
 * The loop itself (steps, CFG, step caching, the ranks of a parallel replica) is
 * the shared one (denoise.h); FLUX's denoiser is the transformer with conditioning
 * (T5 sequence [T, joint], CLIP pooled [pooled]). With parallel execution the
 * replica's host rank runs this flow and every rank its part of the transformer. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "difflet/denoise.h"
#include "difflet/pipeline.h"
#include "difflet/program.h"
#include "difflet/registry.h"
#include "difflet/text.h"
#include "difflet/flux.h"

struct dl_flux_pipeline {
    dl_flux_shape shape;
    dl_model_dir *dir;
    dl_tokenizer *tok, *tok2;
    dl_clip_text *clip;
    dl_t5_encoder *t5;
    dl_flux *tr;
    dl_vae_decoder *vae;
    dl_vae_encoder *enc; /* built on the first image-to-image request */
    dl_artifact *enc_art;
    char enc_prog_id[17];
    float *x0, *noise, *lmask; /* image-to-image: packed image latents, noise, latent mask */
    const float *run_sigmas;   /* the request's sigmas from its first step */
    int lmask_on;              /* inpainting: blend after each step */
    const dl_flux_request *req;
    int partial_at[4], npartial, next_partial;
    dl_flowmatch fm;
    dl_denoise *loop;
    int64_t lh, lw, C, N, T, Cp; /* latent grid, latent channels, tokens, text length, packed channels */
    int clip_len;
    float *sigmas, *tsteps;
    float *pe, *pooled, *ne, *npooled; /* prompt / negative embeddings */
    float *hidden77, *unpacked, *img;
    int32_t *ids;
    dl_artifact *art[4]; /* the programs' mapped weights, kept while the models live */
    char prog_id[4][17];
    const dl_par_place *par; /* NULL: one rank */
    int host;                /* this rank runs the host flow */
    int64_t Jd, Pd;          /* text widths as the transformer takes them */
};

int dl_flux_pipeline_is_host(const dl_flux_pipeline *p) { return p->host; }

/* ---- FLUX's denoiser: conditioning buf[0] = T5 sequence, buf[1] = CLIP pooled ---- */
static dl_status den_eval(void *m, const float *lat, const dl_cond *c, float t, float g, float *out) {
    return dl_flux_run(m, lat, c->buf[0], c->buf[1], t, g, out, NULL);
}
static dl_status den_probe(void *m, int slot, const float *lat, const dl_cond *c, float t, float g, double *score) {
    return dl_flux_probe(m, slot, lat, c->buf[1], t, g, score);
}
static void den_probe_reset(void *m) { dl_flux_probe_reset(m); }
static dl_status den_text_valid(void *m, int64_t valid) { return dl_flux_set_text_valid(m, valid); }
static const dl_denoiser_ops flux_denoiser = {den_eval, den_probe, den_probe_reset, den_text_valid, NULL};

void dl_flux_pipeline_free(dl_flux_pipeline *p) {
    if (!p) return;
    dl_denoise_free(p->loop); /* the host's releases the workers */
    dl_tokenizer_free(p->tok), dl_tokenizer_free(p->tok2);
    dl_clip_text_free(p->clip), dl_t5_encoder_free(p->t5), dl_flux_free(p->tr), dl_vae_decoder_free(p->vae);
    dl_vae_encoder_free(p->enc);
    dl_artifact_close(p->enc_art);
    free(p->x0), free(p->noise), free(p->lmask);
    for (int i = 0; i < 4; i++) dl_artifact_close(p->art[i]);
    dl_model_dir_free(p->dir);
    free(p->sigmas), free(p->tsteps), free(p->pe), free(p->pooled), free(p->ne);
    free(p->npooled), free(p->hidden77), free(p->unpacked), free(p->img), free(p->ids);
    free(p);
}

void dl_flux_pipeline_latent_shape(const dl_flux_pipeline *p, int64_t *tokens, int64_t *channels) {
    *tokens = p->N;
    *channels = p->Cp;
}

int dl_flux_pipeline_has_guidance(const dl_flux_pipeline *p) { return dl_flux_has_guidance(p->tr); }

typedef struct {
    dl_flux_pipeline *p;
    int which;
} build_ctx;

static dl_status build_component(void *ctx, dl_wsrc *ws) {
    build_ctx *b = ctx;
    dl_flux_pipeline *p = b->p;
    dl_dtype dt = p->shape.dt;
    if (!ws) { /* release what was built: dl_program_get reloads it from the program just written */
        switch (b->which) {
        case 0: dl_clip_text_free(p->clip), p->clip = NULL; break;
        case 1: dl_t5_encoder_free(p->t5), p->t5 = NULL; break;
        case 2: dl_vae_decoder_free(p->vae), p->vae = NULL; break;
        case 4: dl_vae_encoder_free(p->enc), p->enc = NULL; break;
        default: dl_flux_free(p->tr), p->tr = NULL;
        }
        return DL_OK;
    }
    switch (b->which) {
    case 0: return dl_clip_text_load(&p->clip, p->dir, "text_encoder", p->clip_len, dt, ws);
    case 1: return dl_t5_encoder_load(&p->t5, p->dir, "text_encoder_2", p->T, dt, ws);
    case 2: return dl_vae_decoder_load(&p->vae, p->dir, "vae", p->lh, p->lw, dt, ws);
    case 4: return dl_vae_encoder_load(&p->enc, p->dir, "vae", p->shape.height, p->shape.width, dt, ws);
    default:
        return dl_flux_load_split(&p->tr, p->dir, "transformer", p->lh / 2, p->lw / 2, p->T, dt, ws,
                                  p->par ? &p->par->split : NULL);
    }
}

const char *dl_flux_pipeline_program_id(const dl_flux_pipeline *p, int component) {
    return component >= 0 && component < 4 ? p->prog_id[component] : "";
}

/* FluxPipeline's max_sequence_length default is 512, whatever tokenizer_2's
 * model_max_length says; a model trained at another length says so in its
 * difflet.json (difflet-tiny: 32) */
static int default_t5_len(const char *model_dir) {
    return (int)dl_model_default_int(model_dir, "max_sequence_length", 2, 512, 512);
}

int dl_flux_default_size(const char *model_dir) {
    return (int)dl_json_file_int(model_dir, "vae/config.json", "sample_size", 16, 8192, 1024);
}

int dl_flux_pipeline_max_sequence_length(const dl_flux_pipeline *p) { return (int)p->T; }

dl_status dl_flux_pipeline_load(dl_flux_pipeline **out, const char *model_dir, const dl_flux_shape *shape) {
    *out = NULL;
    dl_flux_pipeline *p = calloc(1, sizeof *p);
    if (!p) return dl_fail(DL_ERR_NOMEM, "out of memory");
    p->shape = *shape;
    char path[4096];
    dl_status s = dl_model_dir_open(&p->dir, model_dir);
    if (s != DL_OK) goto fail;
    if (!p->shape.max_sequence_length) p->shape.max_sequence_length = default_t5_len(model_dir);
    if (strcmp(dl_model_dir_class(p->dir), "FluxPipeline")) {
        s = dl_fail(DL_ERR_UNSUPPORTED, "`%s`: pipeline %s is not a FluxPipeline", model_dir, dl_model_dir_class(p->dir));
        goto fail;
    }
    if (p->shape.max_sequence_length < 2 || p->shape.max_sequence_length > 512) {
        s = dl_fail(DL_ERR_INVALID, "max_sequence_length must be in 2..512, got %d", p->shape.max_sequence_length);
        goto fail;
    }
    /* the VAE first: its scale decides which sizes are valid */
    const cJSON *vcfg;
    if ((s = dl_model_dir_config(p->dir, "vae", &vcfg))) goto fail;
    const cJSON *boc = cJSON_GetObjectItemCaseSensitive(vcfg, "block_out_channels");
    int levels = cJSON_GetArraySize(boc), scale = levels > 0 ? 1 << (levels - 1) : 1;
    int mult = 2 * scale;
    if (shape->width <= 0 || shape->height <= 0 || shape->width % mult || shape->height % mult ||
        shape->width > 8192 || shape->height > 8192) {
        s = dl_fail(DL_ERR_INVALID, "size %dx%d: width and height must be positive multiples of %d (2 x the VAE's %dx) up to 8192",
                    shape->width, shape->height, mult, scale);
        goto fail;
    }
    p->lh = shape->height / scale;
    p->lw = shape->width / scale;
    p->T = p->shape.max_sequence_length;
    /* FluxPipeline's tokenizer_max_length: the CLIP tokenizer's model_max_length (77) */
    p->clip_len = (int)dl_json_file_int(model_dir, "tokenizer/tokenizer_config.json", "model_max_length", 2, 4096, 77);
    p->par = shape->par;
    p->host = !p->par || dl_comm_rank(p->par->replica_comm) == 0;
    if (p->host) {
        snprintf(path, sizeof path, "%s/tokenizer", model_dir);
        if ((s = dl_tokenizer_load(&p->tok, path))) goto fail;
        snprintf(path, sizeof path, "%s/tokenizer_2", model_dir);
        if ((s = dl_tokenizer_load(&p->tok2, path))) goto fail;
    }
    /* each component is a program: loaded from the cache, or compiled and cached; with
     * parallel execution the host alone runs the text encoders and the VAE, and each
     * rank its own part of the transformer (its slice of the weights, its rows) */
    static const char *comps[4] = {"text_encoder", "text_encoder_2", "vae", "transformer"};
    for (int c = p->host ? 0 : 3; c < 4 && s == DL_OK; c++) {
        char shp[256];
        if (c == 0) snprintf(shp, sizeof shp, "{\"seq\":%d}", p->clip_len);
        else if (c == 1) snprintf(shp, sizeof shp, "{\"seq\":%lld}", (long long)p->T);
        else if (c == 2) snprintf(shp, sizeof shp, "{\"height\":%d,\"width\":%d}", shape->height, shape->width);
        else snprintf(shp, sizeof shp, "{\"height\":%d,\"text\":%lld,\"width\":%d}", shape->height, (long long)p->T, shape->width);
        build_ctx b = {p, c};
        dl_gen_shape gs = {.dt = shape->dt, .quant = shape->quant, .cache = shape->cache, .par = shape->par};
        s = dl_pipeline_program(p->dir, comps[c], shp, &gs, 0, c == 3, build_component, &b, &p->art[c], p->prog_id[c]);
    }
    if (s == DL_OK) s = dl_flowmatch_load(p->dir, &p->fm);
    if (s != DL_OK) goto fail;
    dl_flux_text_dims(p->tr, &p->Jd, &p->Pd);
    p->C = p->vae ? dl_vae_latent_channels(p->vae) : dl_flux_in_channels(p->tr) / 4;
    p->N = (p->lh / 2) * (p->lw / 2);
    p->Cp = 4 * p->C;
    if (dl_flux_in_channels(p->tr) != p->Cp || dl_flux_out_channels(p->tr) != p->Cp) {
        s = dl_fail(DL_ERR_FORMAT, "transformer in/out channels (%lld/%lld) are not 4 x the VAE's %lld latent channels",
                    (long long)dl_flux_in_channels(p->tr), (long long)dl_flux_out_channels(p->tr), (long long)p->C);
        goto fail;
    }
    if (p->host && (dl_t5_encoder_width(p->t5) != p->Jd || dl_clip_text_width(p->clip) != p->Pd)) {
        s = dl_fail(DL_ERR_FORMAT, "text encoder widths (T5 %lld, CLIP %lld) are not the transformer's joint/pooled dims (%lld, %lld)",
                    (long long)dl_t5_encoder_width(p->t5), (long long)dl_clip_text_width(p->clip), (long long)p->Jd,
                    (long long)p->Pd);
        goto fail;
    }
    const int64_t D2 = p->Jd, D1 = p->Pd;
    p->sigmas = malloc((DL_STEPS_MAX + 1) * 4);
    p->tsteps = malloc(DL_STEPS_MAX * 4);
    p->pe = malloc((size_t)(p->T * D2) * 4), p->ne = malloc((size_t)(p->T * D2) * 4);
    p->pooled = malloc((size_t)D1 * 4), p->npooled = malloc((size_t)D1 * 4);
    p->hidden77 = malloc((size_t)(p->clip_len * D1) * 4);
    p->unpacked = malloc((size_t)(p->N * p->Cp) * 4);
    p->img = malloc((size_t)(3 * shape->width * shape->height) * 4);
    p->ids = malloc((size_t)(p->T > p->clip_len ? p->T : p->clip_len) * sizeof *p->ids);
    if (!p->sigmas || !p->tsteps || !p->pe || !p->ne || !p->pooled || !p->npooled || !p->hidden77 || !p->unpacked ||
        !p->img || !p->ids) {
        s = dl_fail(DL_ERR_NOMEM, "out of memory");
        goto fail;
    }
    {
        dl_denoiser dn = {&flux_denoiser, p->tr, p->N * p->Cp, 0};
        dl_cond c0 = {{p->pe, p->pooled}, {p->T * D2, D1}, 2, 0}, c1 = {{p->ne, p->npooled}, {p->T * D2, D1}, 2, 0};
        if ((s = dl_denoise_new(&p->loop, &dn, p->par, &c0, &c1)) != DL_OK) goto fail;
    }
    *out = p;
    return DL_OK;
fail:
    dl_flux_pipeline_free(p);
    return s;
}

/* pooled CLIP embedding and T5 sequence embedding of one prompt */
static dl_status encode(dl_flux_pipeline *p, const char *prompt, float *seq, float *pooled) {
    int n;
    dl_status s = dl_tokenizer_encode(p->tok, prompt, strlen(prompt), p->clip_len, 1, p->ids, &n);
    if (s == DL_OK) s = dl_clip_text_run(p->clip, p->ids, p->hidden77, pooled, NULL);
    if (s == DL_OK) s = dl_tokenizer_encode(p->tok2, prompt, strlen(prompt), (int)p->T, 1, p->ids, &n);
    if (s == DL_OK) s = dl_t5_encoder_run(p->t5, p->ids, seq, NULL);
    return s;
}

dl_status dl_flux_pipeline_worker_one(dl_flux_pipeline *p, int *stopped) {
    return dl_denoise_worker_one(p->loop, stopped);
}

dl_status dl_flux_pipeline_worker(dl_flux_pipeline *p) { return dl_denoise_worker(p->loop); }

static dl_status generate(dl_flux_pipeline *p, const dl_flux_request *r, uint8_t *rgb, float *image,
                          dl_flux_timing *timing, int *ran);

/* [C, h, w] -> packed [(h/2)(w/2), 4C] as _pack_latents packs */
static void pack(const dl_flux_pipeline *p, const float *src, float *dst) {
    const int64_t Cp = p->Cp, gw = p->lw / 2;
    for (int64_t c = 0; c < p->C; c++)
        for (int64_t y = 0; y < p->lh; y++)
            for (int64_t x = 0; x < p->lw; x++)
                dst[((y / 2) * gw + x / 2) * Cp + c * 4 + (y % 2) * 2 + (x % 2)] = src[(c * p->lh + y) * p->lw + x];
}

/* the encoder program, built (or loaded from the cache) on first use */
static dl_status need_encoder(dl_flux_pipeline *p) {
    if (p->enc) return DL_OK;
    char shp[256];
    snprintf(shp, sizeof shp, "{\"encoder\":true,\"height\":%d,\"width\":%d}", p->shape.height, p->shape.width);
    build_ctx b = {p, 4};
    dl_gen_shape gs = {.dt = p->shape.dt, .cache = p->shape.cache, .par = p->shape.par};
    dl_status s = dl_pipeline_program(p->dir, "vae", shp, &gs, 0, 0, build_component, &b, &p->enc_art, p->enc_prog_id);
    if (s == DL_OK && dl_vae_encoder_latent_channels(p->enc) != p->C)
        s = dl_fail(DL_ERR_FORMAT, "the VAE encoder makes %lld latent channels, the decoder takes %lld",
                    (long long)dl_vae_encoder_latent_channels(p->enc), (long long)p->C);
    if (s != DL_OK) {
        dl_vae_encoder_free(p->enc), p->enc = NULL;
        dl_artifact_close(p->enc_art), p->enc_art = NULL;
    }
    return s;
}

/* x0 (the image's packed latents), the noise (the given latents or the seed's) and
 * for inpainting the packed latent mask */
static dl_status image_latents(dl_flux_pipeline *p, const dl_flux_request *r, const float *noise) {
    const int64_t H = p->shape.height, W = p->shape.width, n = p->N * p->Cp;
    dl_status s = need_encoder(p);
    if (s != DL_OK) return s;
    if (!p->x0 && (!(p->x0 = malloc((size_t)n * 4)) || !(p->noise = malloc((size_t)n * 4)) ||
                   !(p->lmask = malloc((size_t)n * 4))))
        return dl_fail(DL_ERR_NOMEM, "out of memory");
    memcpy(p->noise, noise, (size_t)n * 4);
    float *px = malloc((size_t)(3 * H * W) * 4);
    if (!px) return dl_fail(DL_ERR_NOMEM, "out of memory");
    for (int64_t y = 0; y < H; y++) /* VaeImageProcessor: x / 255 in f32, then 2x - 1 */
        for (int64_t x = 0; x < W; x++)
            for (int c = 0; c < 3; c++) px[(c * H + y) * W + x] = 2.0f * ((float)r->image[(y * W + x) * 3 + c] / 255.0f) - 1.0f;
    s = dl_vae_encode(p->enc, px, p->unpacked);
    free(px);
    if (s != DL_OK) return s;
    const float sf = (float)dl_vae_scaling_factor(p->vae), sh = (float)dl_vae_shift_factor(p->vae);
    for (int64_t k = 0; k < n; k++) p->unpacked[k] = (p->unpacked[k] - sh) * sf;
    pack(p, p->unpacked, p->x0);
    if (r->mask) { /* binarised (x / 255 >= 0.5), nearest to the latent grid, repeated over channels */
        const int64_t scale = H / p->lh;
        for (int64_t c = 0; c < p->C; c++)
            for (int64_t y = 0; y < p->lh; y++)
                for (int64_t x = 0; x < p->lw; x++)
                    p->unpacked[(c * p->lh + y) * p->lw + x] =
                        (float)r->mask[(y * scale) * W + x * scale] / 255.0f >= 0.5f ? 1.0f : 0.0f;
        pack(p, p->unpacked, p->lmask);
    }
    return DL_OK;
}

/* packed latents -> RGB bytes (and optionally [0, 1] floats): unpack, unscale, decode */
static dl_status decode_latents(dl_flux_pipeline *p, const float *lat, uint8_t *rgb, float *image) {
    const int64_t Cp = p->Cp, gw = p->lw / 2;
    float sf = (float)dl_vae_scaling_factor(p->vae), sh = (float)dl_vae_shift_factor(p->vae);
    for (int64_t c = 0; c < p->C; c++)
        for (int64_t y = 0; y < p->lh; y++)
            for (int64_t x = 0; x < p->lw; x++) {
                float v = lat[((y / 2) * gw + x / 2) * Cp + c * 4 + (y % 2) * 2 + (x % 2)];
                p->unpacked[(c * p->lh + y) * p->lw + x] = v / sf + sh;
            }
    dl_status s = dl_vae_decode(p->vae, p->unpacked, p->img);
    if (s != DL_OK) return s;
    const int64_t H = p->shape.height, W = p->shape.width;
    for (int64_t y = 0; y < H; y++)
        for (int64_t x = 0; x < W; x++)
            for (int c = 0; c < 3; c++) {
                float v = p->img[(c * H + y) * W + x] / 2.f + 0.5f;
                v = v < 0.f ? 0.f : v > 1.f ? 1.f : v;
                if (image) image[(y * W + x) * 3 + c] = v;
                if (rgb) rgb[(y * W + x) * 3 + c] = (uint8_t)lrintf(v * 255.f);
            }
    return DL_OK;
}

/* after step i of the request's loop: inpainting keeps the unmasked part at the
 * image re-noised to the next sigma (the image itself after the last step); a
 * preview decodes x0 = latents - sigma_next * v after its step */
static void after_step(void *ctx, int step, float *lat, const float *v, int64_t n) {
    dl_flux_pipeline *p = ctx;
    const float sn = p->run_sigmas[step + 1];
    if (p->lmask_on)
        for (int64_t k = 0; k < n; k++) {
            float proper = sn * p->noise[k] + (1.0f - sn) * p->x0[k];
            lat[k] = (1.0f - p->lmask[k]) * proper + p->lmask[k] * lat[k];
        }
    const dl_flux_request *r = p->req;
    if (p->next_partial < p->npartial && step == p->partial_at[p->next_partial]) {
        float *x0 = malloc((size_t)n * 4);
        uint8_t *rgb = malloc((size_t)(3 * p->shape.width * p->shape.height));
        if (x0 && rgb) { /* a preview that cannot be made is skipped: the request itself goes on */
            for (int64_t k = 0; k < n; k++) x0[k] = lat[k] - sn * v[k];
            if (decode_latents(p, x0, rgb, NULL) == DL_OK) r->on_partial(r->ctx, p->next_partial, rgb, p->shape.width, p->shape.height);
        }
        free(x0), free(rgb);
        p->next_partial++;
    }
}

/* Every call ends the request on every rank exactly once, also when it fails
 * before the loop ran: a serving replica's ranks wait for that end. */
dl_status dl_flux_generate(dl_flux_pipeline *p, const dl_flux_request *r, uint8_t *rgb, float *image,
                           dl_flux_timing *timing) {
    if (!p->host) return dl_fail(DL_ERR_INVALID, "only the host rank generates; the others run dl_flux_pipeline_worker");
    int ran = 0;
    dl_status s = generate(p, r, rgb, image, timing, &ran);
    if (!ran) dl_denoise_abandon(p->loop);
    return s;
}

static dl_status generate(dl_flux_pipeline *p, const dl_flux_request *r, uint8_t *rgb, float *image,
                          dl_flux_timing *timing, int *ran) {
    dl_flux_timing tm = {0};
    if (!r->prompt) return dl_fail(DL_ERR_INVALID, "a prompt is required");
    if (r->steps <= 0 || r->steps > DL_STEPS_MAX)
        return dl_fail(DL_ERR_INVALID, "steps must be in 1..%d, got %d", DL_STEPS_MAX, r->steps);
    if (!isfinite(r->guidance) || !isfinite(r->true_cfg))
        return dl_fail(DL_ERR_INVALID, "guidance and true_cfg must be finite numbers");
    if (r->mask && !r->image) return dl_fail(DL_ERR_INVALID, "a mask needs an image to inpaint");
    if (r->image && !(r->strength > 0.0 && r->strength <= 1.0))
        return dl_fail(DL_ERR_INVALID, "strength must be in (0, 1], got %g", r->strength);
    int cfg = r->true_cfg > 1.f && r->negative_prompt != NULL;
    if (p->par && p->par->cfg.cfg == 2 && !cfg)
        return dl_fail(DL_ERR_INVALID, "cfg=2 runs the two CFG passes on separate ranks, but this request has one pass "
                                       "(true CFG needs true_cfg > 1 and a negative prompt)");
    double t0 = dl_now();
    dl_status s = encode(p, r->prompt, p->pe, p->pooled);
    if (s == DL_OK && cfg) s = encode(p, r->negative_prompt, p->ne, p->npooled);
    if (s != DL_OK) return s;
    tm.encode_s = dl_now() - t0;
    double mu = dl_flowmatch_mu(&p->fm, p->N);
    if ((s = dl_flowmatch_sigmas(&p->fm, r->steps, mu, p->sigmas))) return s;
    /* the pipeline hands the transformer t / 1000 with t = sigma * num_train_timesteps, in f32 */
    for (int i = 0; i < r->steps; i++) p->tsteps[i] = p->sigmas[i] * (float)p->fm.num_train_timesteps / 1000.f;
    int t_start = 0;
    if (r->image) { /* get_timesteps: init_timestep = min(steps * strength, steps), in Python floats */
        double init = fmin(r->steps * r->strength, (double)r->steps);
        t_start = (int)fmax(r->steps - init, 0.0);
        if (r->steps - t_start < 1)
            return dl_fail(DL_ERR_INVALID, "strength %g leaves no step of %d to run (the pipeline needs at least one)",
                           r->strength, r->steps);
    }

    /* initial latents: given (packed), or noise [C, h, w] packed as diffusers packs */
    const int64_t N = p->N, Cp = p->Cp;
    float *lat = dl_denoise_latents(p->loop);
    if (r->init_latents) {
        memcpy(lat, r->init_latents, (size_t)(N * Cp) * 4);
    } else {
        dl_randn(r->seed, p->unpacked, N * Cp);
        pack(p, p->unpacked, lat);
    }
    dl_denoise_request dr = {.steps = r->steps - t_start, .t = p->tsteps + t_start, .sigmas = p->sigmas + t_start,
                             .guidance = r->guidance, .cfg = cfg, .cfg_scale = r->true_cfg, .text_valid = p->T,
                             .cache = r->cache, .cancel = r->cancel, .on_step = r->on_step, .on_probe = r->on_probe,
                             .ctx = r->ctx};
    if (r->image) {
        double te = dl_now();
        if ((s = image_latents(p, r, lat))) return s;
        tm.encode_s += dl_now() - te;
        const float s0 = p->sigmas[t_start]; /* scale_noise: sigma * noise + (1 - sigma) * sample */
        for (int64_t k = 0; k < N * Cp; k++) lat[k] = s0 * p->noise[k] + (1.0f - s0) * p->x0[k];
    }
    p->lmask_on = r->image && r->mask;
    p->req = r, p->run_sigmas = dr.sigmas, p->next_partial = 0;
    /* previews after evenly spaced steps, never the last (fewer when there are few steps) */
    const int want = r->on_partial ? (r->partial_images < 0 ? 0 : r->partial_images > 3 ? 3 : r->partial_images) : 0;
    p->npartial = 0;
    for (int k = 0; k < want; k++) {
        int at = (k + 1) * dr.steps / (want + 1) - 1;
        if (at >= 0 && (p->npartial == 0 || at > p->partial_at[p->npartial - 1])) p->partial_at[p->npartial++] = at;
    }
    if (p->lmask_on || p->npartial) dr.after_step = after_step, dr.after_ctx = p;
    dl_denoise_timing dt;
    *ran = 1;
    if ((s = dl_denoise_run(p->loop, &dr, &dt)) != DL_OK) return s;
    tm.denoise_s = dt.denoise_s, tm.probe_s = dt.probe_s, tm.cached_s = dt.cached_s, tm.comm_s = dt.comm_s;
    tm.transformer_calls = dt.calls, tm.cached_steps = dt.cached_steps, tm.ranks = dt.ranks;

    t0 = dl_now();
    if ((s = decode_latents(p, lat, rgb, image))) return s;
    tm.decode_s = dl_now() - t0;
    if (timing) *timing = tm;
    return DL_OK;
}

/* ---- the registry entry ------------------------------------------------------------ */

static void entry_default_shape(const char *dir, int *w, int *h, int *frames) {
    *w = *h = dl_flux_default_size(dir);
    *frames = 1;
}

static dl_status entry_load(void **impl, const char *dir, const dl_gen_shape *g) {
    if (g->frames > 1)
        return dl_fail(DL_ERR_INVALID, "FluxPipeline makes images: %d frames asked for", g->frames);
    if (g->cfg_batch) /* true CFG's branches differ in modulation (pooled text): sequential only */
        return dl_fail(DL_ERR_UNSUPPORTED, "batched CFG is not supported for FluxPipeline (true CFG's branches differ in their modulation)");
    dl_flux_shape shape = {.width = g->width, .height = g->height, .max_sequence_length = g->max_sequence_length,
                           .dt = g->dt, .quant = g->quant, .cache = g->cache, .par = g->par};
    return dl_flux_pipeline_load((dl_flux_pipeline **)impl, dir, &shape);
}

static void entry_free(void *impl) { dl_flux_pipeline_free(impl); }
static int entry_is_host(const void *impl) { return dl_flux_pipeline_is_host(impl); }
static dl_status entry_worker_one(void *impl, int *stopped) { return dl_flux_pipeline_worker_one(impl, stopped); }
static const char *entry_program_id(const void *impl, int c) { return dl_flux_pipeline_program_id(impl, c); }

/* FluxPipeline's `latents` argument: packed [N, 4C] (or [1, N, 4C]) */
static dl_status read_latents(dl_flux_pipeline *p, const dl_checkpoint *ck, float **out) {
    const dl_st_tensor *t = dl_ckpt_find(ck, "latents");
    if (!t || t->numel != p->N * p->Cp || (t->dtype != DL_ST_F32 && t->dtype != DL_ST_BF16 && t->dtype != DL_ST_F16))
        return dl_fail(DL_ERR_INVALID, "%s: needs a float tensor \"latents\" of %lld x %lld (packed) values",
                       dl_ckpt_label(ck), (long long)p->N, (long long)p->Cp);
    if (!(*out = malloc((size_t)t->numel * 4))) return dl_fail(DL_ERR_NOMEM, "out of memory");
    return dl_ckpt_read(t, DL_F32, *out);
}

static dl_status entry_generate(void *impl, const dl_gen_request *g, dl_media *out, dl_gen_timing *tm) {
    dl_flux_pipeline *p = impl;
    float *init = NULL;
    const int W = p->shape.width, H = p->shape.height;
    dl_status s = g->image && (g->image_width != W || g->image_height != H)
                      ? dl_fail(DL_ERR_INVALID, "the init image is %dx%d; this pipeline makes %dx%d", g->image_width,
                                g->image_height, W, H)
                      : DL_OK;
    if (s == DL_OK && g->init) s = read_latents(p, g->init, &init);
    *out = (dl_media){.kind = DL_MEDIA_IMAGE, .width = W, .height = H, .frames = 1};
    if (s == DL_OK && (!(out->rgb = malloc((size_t)W * (size_t)H * 3)) ||
                       (g->want_pixels && !(out->pixels = malloc((size_t)W * (size_t)H * 3 * sizeof(float))))))
        s = dl_fail(DL_ERR_NOMEM, "out of memory");
    if (s != DL_OK) {
        free(init);
        dl_denoise_abandon(p->loop); /* the replica's workers wait for this request's end */
        return s;
    }
    dl_flux_request r = {.prompt = g->prompt, .negative_prompt = g->negative_prompt, .steps = g->steps,
                         .guidance = g->guidance, .true_cfg = g->true_cfg, .seed = g->seed, .init_latents = init,
                         .image = g->image, .mask = g->mask, .strength = g->strength,
                         .partial_images = g->partial_images, .on_partial = g->on_partial,
                         .cache = g->cache, .cancel = g->cancel, .on_step = g->on_step, .on_probe = g->on_probe,
                         .ctx = g->ctx};
    dl_flux_timing t;
    s = dl_flux_generate(p, &r, out->rgb, out->pixels, &t);
    free(init);
    if (s == DL_OK && tm)
        *tm = (dl_gen_timing){.encode_s = t.encode_s, .denoise_s = t.denoise_s, .decode_s = t.decode_s,
                              .probe_s = t.probe_s, .cached_s = t.cached_s, .comm_s = t.comm_s,
                              .denoiser_calls = t.transformer_calls, .cached_steps = t.cached_steps, .ranks = t.ranks};
    return s;
}

static const char *const k_flux_components[] = {"text_encoder", "text_encoder_2", "vae", "transformer"};

const dl_model_entry dl_flux_entry = {
    .pipeline_class = "FluxPipeline",
    .output = DL_MEDIA_IMAGE,
    .default_steps = 28,
    .default_guidance = 3.5f,
    .image_to_image = 1,
    .components = k_flux_components,
    .ncomponents = 4,
    .default_shape = entry_default_shape,
    .default_heads = 24, /* diffusers' default when the config does not say */
    .load = entry_load,
    .free = entry_free,
    .is_host = entry_is_host,
    .worker_one = entry_worker_one,
    .generate = entry_generate,
    .program_id = entry_program_id,
};
