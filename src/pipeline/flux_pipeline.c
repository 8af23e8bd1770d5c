/* FluxPipeline's host flow (diffusers):
 *   encode: CLIP pooled embedding (77 tokens) and T5 sequence embedding
 *           (max_sequence_length tokens), both padded as the reference pads them;
 *   latents: initial noise [C, h, w] packed 2x2 into [N, 4C] tokens;
 *   loop:   v = transformer(latents, sigma) (twice with true CFG: v = vn + s(vp - vn));
 *           latents += (sigma_next - sigma) * v;
 *   decode: unpack, z / scaling_factor + shift_factor, VAE decode, (x/2 + 0.5)
 *           clamped to [0, 1], x255 rounded. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "difflet/pipeline.h"
#include "difflet/program.h"
#include "difflet/text.h"

struct dl_flux_pipeline {
    dl_flux_shape shape;
    dl_model_dir *dir;
    dl_tokenizer *tok, *tok2;
    dl_clip_text *clip;
    dl_t5_encoder *t5;
    dl_flux *tr;
    dl_vae_decoder *vae;
    dl_flowmatch fm;
    int64_t lh, lw, C, N, T, Cp; /* latent grid, latent channels, tokens, text length, packed channels */
    int clip_len;
    float *lat, *v, *v2, *sigmas;
    float *sc_buf[4];            /* step cache: prev and delta for each CFG branch */
    float *pe, *pooled, *ne, *npooled; /* prompt / negative embeddings */
    float *hidden77, *unpacked, *img;
    int32_t *ids;
    dl_artifact *art[4]; /* the programs' mapped weights, kept while the models live */
    char prog_id[4][17];
};

void dl_flux_pipeline_free(dl_flux_pipeline *p) {
    if (!p) return;
    dl_tokenizer_free(p->tok), dl_tokenizer_free(p->tok2);
    dl_clip_text_free(p->clip), dl_t5_encoder_free(p->t5), dl_flux_free(p->tr), dl_vae_decoder_free(p->vae);
    for (int i = 0; i < 4; i++) dl_artifact_close(p->art[i]);
    dl_model_dir_free(p->dir);
    for (int i = 0; i < 4; i++) free(p->sc_buf[i]);
    free(p->lat), free(p->v), free(p->v2), free(p->sigmas), free(p->pe), free(p->pooled), free(p->ne);
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
    switch (b->which) {
    case 0: return dl_clip_text_load(&p->clip, p->dir, "text_encoder", p->clip_len, dt, ws);
    case 1: return dl_t5_encoder_load(&p->t5, p->dir, "text_encoder_2", p->T, dt, ws);
    case 2: return dl_vae_decoder_load(&p->vae, p->dir, "vae", p->lh, p->lw, dt, ws);
    default: return dl_flux_load(&p->tr, p->dir, "transformer", p->lh / 2, p->lw / 2, p->T, dt, ws);
    }
}

const char *dl_flux_pipeline_program_id(const dl_flux_pipeline *p, int component) {
    return component >= 0 && component < 4 ? p->prog_id[component] : "";
}

/* FluxPipeline's max_sequence_length default is 512; a model whose tokenizer_2
 * declares a shorter model_max_length (difflet-tiny: 32) was trained at that length */
static int default_t5_len(const char *model_dir) {
    char path[4096];
    int n = 512;
    snprintf(path, sizeof path, "%s/tokenizer_2/tokenizer_config.json", model_dir);
    cJSON *j;
    if (dl_json_read_object(path, NULL, &j) != DL_OK) return n;
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(j, "model_max_length");
    if (cJSON_IsNumber(m) && m->valuedouble >= 2 && m->valuedouble < 512) n = (int)m->valuedouble;
    cJSON_Delete(j);
    return n;
}

int dl_flux_default_size(const char *model_dir) {
    char path[4096];
    int n = 1024;
    snprintf(path, sizeof path, "%s/vae/config.json", model_dir);
    cJSON *j;
    if (dl_json_read_object(path, NULL, &j) != DL_OK) return n;
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(j, "sample_size");
    if (cJSON_IsNumber(m) && m->valuedouble >= 16 && m->valuedouble <= 8192) n = (int)m->valuedouble;
    cJSON_Delete(j);
    return n;
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
    p->clip_len = 77;
    snprintf(path, sizeof path, "%s/tokenizer", model_dir);
    if ((s = dl_tokenizer_load(&p->tok, path))) goto fail;
    snprintf(path, sizeof path, "%s/tokenizer_2", model_dir);
    if ((s = dl_tokenizer_load(&p->tok2, path))) goto fail;
    /* each component is a program: loaded from the cache, or compiled and cached */
    static const char *comps[4] = {"text_encoder", "text_encoder_2", "vae", "transformer"};
    for (int c = 0; c < 4 && s == DL_OK; c++) {
        char shp[256], *key = NULL;
        if (c == 0) snprintf(shp, sizeof shp, "{\"seq\":%d}", p->clip_len);
        else if (c == 1) snprintf(shp, sizeof shp, "{\"seq\":%lld}", (long long)p->T);
        else if (c == 2) snprintf(shp, sizeof shp, "{\"height\":%d,\"width\":%d}", shape->height, shape->width);
        else snprintf(shp, sizeof shp, "{\"height\":%d,\"text\":%lld,\"width\":%d}", shape->height, (long long)p->T, shape->width);
        s = dl_program_key(p->dir, comps[c], shp, shape->dt, 0, &key, p->prog_id[c]);
        build_ctx b = {p, c};
        if (s == DL_OK) s = dl_program_get(p->dir, comps[c], key, p->prog_id[c], shape->cache, build_component, &b, &p->art[c]);
        free(key);
    }
    if (s == DL_OK) s = dl_flowmatch_load(p->dir, &p->fm);
    if (s != DL_OK) goto fail;
    p->C = dl_vae_latent_channels(p->vae);
    p->N = (p->lh / 2) * (p->lw / 2);
    p->Cp = 4 * p->C;
    if (dl_flux_in_channels(p->tr) != p->Cp || dl_flux_out_channels(p->tr) != p->Cp) {
        s = dl_fail(DL_ERR_FORMAT, "transformer in/out channels (%lld/%lld) are not 4 x the VAE's %lld latent channels",
                    (long long)dl_flux_in_channels(p->tr), (long long)dl_flux_out_channels(p->tr), (long long)p->C);
        goto fail;
    }
    int64_t D2 = dl_t5_encoder_width(p->t5), D1 = dl_clip_text_width(p->clip);
    p->lat = malloc((size_t)(p->N * p->Cp) * 4);
    p->v = malloc((size_t)(p->N * p->Cp) * 4);
    p->v2 = malloc((size_t)(p->N * p->Cp) * 4);
    p->sigmas = malloc(10001 * 4);
    for (int i = 0; i < 4; i++)
        if (!(p->sc_buf[i] = malloc((size_t)(p->N * p->Cp) * 4))) {
            s = dl_fail(DL_ERR_NOMEM, "out of memory");
            goto fail;
        }
    p->pe = malloc((size_t)(p->T * D2) * 4), p->ne = malloc((size_t)(p->T * D2) * 4);
    p->pooled = malloc((size_t)D1 * 4), p->npooled = malloc((size_t)D1 * 4);
    p->hidden77 = malloc((size_t)(p->clip_len * D1) * 4);
    p->unpacked = malloc((size_t)(p->N * p->Cp) * 4);
    p->img = malloc((size_t)(3 * shape->width * shape->height) * 4);
    p->ids = malloc((size_t)(p->T > p->clip_len ? p->T : p->clip_len) * sizeof *p->ids);
    if (!p->lat || !p->v || !p->v2 || !p->sigmas || !p->pe || !p->ne || !p->pooled || !p->npooled || !p->hidden77 ||
        !p->unpacked || !p->img || !p->ids) {
        s = dl_fail(DL_ERR_NOMEM, "out of memory");
        goto fail;
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

dl_status dl_flux_generate(dl_flux_pipeline *p, const dl_flux_request *r, uint8_t *rgb, float *image,
                           dl_flux_timing *timing) {
    dl_flux_timing tm = {0};
    if (!r->prompt) return dl_fail(DL_ERR_INVALID, "a prompt is required");
    if (r->steps <= 0 || r->steps > 10000) return dl_fail(DL_ERR_INVALID, "steps must be in 1..10000, got %d", r->steps);
    if (!isfinite(r->guidance) || !isfinite(r->true_cfg))
        return dl_fail(DL_ERR_INVALID, "guidance and true_cfg must be finite numbers");
    int cfg = r->true_cfg > 1.f && r->negative_prompt != NULL;
    double t0 = dl_now();
    dl_status s = encode(p, r->prompt, p->pe, p->pooled);
    if (s == DL_OK && cfg) s = encode(p, r->negative_prompt, p->ne, p->npooled);
    if (s != DL_OK) return s;
    tm.encode_s = dl_now() - t0;

    /* initial latents: given (packed), or noise [C, h, w] packed as diffusers packs */
    const int64_t N = p->N, Cp = p->Cp, C = p->C, gh = p->lh / 2, gw = p->lw / 2;
    if (r->init_latents) {
        memcpy(p->lat, r->init_latents, (size_t)(N * Cp) * 4);
    } else {
        dl_randn(r->seed, p->unpacked, N * Cp);
        for (int64_t c = 0; c < C; c++)
            for (int64_t y = 0; y < p->lh; y++)
                for (int64_t x = 0; x < p->lw; x++)
                    p->lat[((y / 2) * gw + x / 2) * Cp + c * 4 + (y % 2) * 2 + (x % 2)] =
                        p->unpacked[(c * p->lh + y) * p->lw + x];
    }
    double mu = dl_flowmatch_mu(&p->fm, N);
    if ((s = dl_flowmatch_sigmas(&p->fm, r->steps, mu, p->sigmas))) return s;
    /* step cache: fresh state for this request, one per CFG branch */
    static const dl_stepcache_config off = {0};
    const dl_stepcache_config *sc = r->cache ? r->cache : &off;
    int probing = sc->mode == DL_STEPCACHE_CALIBRATED || r->on_probe;
    dl_stepcache_state st[2];
    for (int b = 0; b < 2; b++) {
        st[b] = (dl_stepcache_state){.prev = p->sc_buf[2 * b], .delta = p->sc_buf[2 * b + 1], .n = N * Cp};
        dl_stepcache_reset(&st[b]);
    }
    if (probing) dl_flux_probe_reset(p->tr);
    t0 = dl_now();
    for (int i = 0; i < r->steps; i++) {
        if (r->cancel && *r->cancel) return dl_fail(DL_ERR_CANCELLED, "cancelled at step %d of %d", i, r->steps);
        /* the pipeline hands the transformer t / 1000 with t = sigma * num_train_timesteps, in f32 */
        float t = p->sigmas[i] * (float)p->fm.num_train_timesteps;
        float tin = t / 1000.f;
        for (int b = 0; b < 1 + cfg; b++) { /* branch 0: the prompt; 1: the negative prompt */
            float *out = b ? p->v2 : p->v;
            const float *emb = b ? p->ne : p->pe, *pool = b ? p->npooled : p->pooled;
            double score = 0, change = -1;
            if (probing) {
                double tp = dl_now();
                if ((s = dl_flux_probe(p->tr, b, p->lat, pool, tin, r->guidance, &score))) return s;
                tm.probe_s += dl_now() - tp;
            }
            if (dl_stepcache_decide(sc, &st[b], i, r->steps, score)) {
                double tc = dl_now();
                dl_stepcache_estimate(&st[b], out);
                tm.cached_s += dl_now() - tc;
                tm.cached_steps++;
            } else {
                if ((s = dl_flux_run(p->tr, p->lat, emb, pool, tin, r->guidance, out, NULL))) return s;
                tm.transformer_calls++;
                change = dl_stepcache_full(sc, &st[b], out);
            }
            if (r->on_probe) r->on_probe(r->ctx, i, b, score, change);
        }
        if (cfg)
            for (int64_t k = 0; k < N * Cp; k++) p->v[k] = p->v2[k] + r->true_cfg * (p->v[k] - p->v2[k]);
        float dt = p->sigmas[i + 1] - p->sigmas[i];
        for (int64_t k = 0; k < N * Cp; k++) p->lat[k] = p->lat[k] + dt * p->v[k];
        if (r->on_step) r->on_step(r->ctx, i + 1, r->steps, dl_now() - t0);
    }
    tm.denoise_s = dl_now() - t0;

    /* unpack, unscale, decode */
    t0 = dl_now();
    float sf = (float)dl_vae_scaling_factor(p->vae), sh = (float)dl_vae_shift_factor(p->vae);
    for (int64_t c = 0; c < C; c++)
        for (int64_t y = 0; y < p->lh; y++)
            for (int64_t x = 0; x < p->lw; x++) {
                float v = p->lat[((y / 2) * gw + x / 2) * Cp + c * 4 + (y % 2) * 2 + (x % 2)];
                p->unpacked[(c * p->lh + y) * p->lw + x] = v / sf + sh;
            }
    (void)gh;
    if ((s = dl_vae_decode(p->vae, p->unpacked, p->img))) return s;
    const int64_t H = p->shape.height, W = p->shape.width;
    for (int64_t y = 0; y < H; y++)
        for (int64_t x = 0; x < W; x++)
            for (int c = 0; c < 3; c++) {
                float v = p->img[(c * H + y) * W + x] / 2.f + 0.5f;
                v = v < 0.f ? 0.f : v > 1.f ? 1.f : v;
                if (image) image[(y * W + x) * 3 + c] = v;
                if (rgb) rgb[(y * W + x) * 3 + c] = (uint8_t)lrintf(v * 255.f);
            }
    tm.decode_s = dl_now() - t0;
    if (timing) *timing = tm;
    return DL_OK;
}
