/* QwenImagePipeline's host flow (diffusers, text-to-image):
 *   prompt: wrapped in the pipeline's chat template, tokenized (no padding for one
 *           prompt), run through the Qwen2.5-VL language model; its last hidden
 *           state without the template's first 34 rows, cut to max_sequence_length
 *           (512): the prompt's own length is the transformer's valid text count;
 *   CFG:    true CFG when true_cfg_scale > 1 and a negative prompt is given ("" counts):
 *           v = vn + s (vc - vn), each token's v rescaled to the norm of vc;
 *   latents: noise [C, h, w] packed 2x2 into [N, 4C] (as FLUX);
 *   schedule: FlowMatch Euler on np.linspace(1, 1/steps, steps) with mu from N;
 *   decode: unpack, latents / (1 / latents_std) + latents_mean, the causal VAE on one
 *           frame, (x / 2 + 0.5) clamped to [0, 1], x255 rounded.
 * The loop is the shared one (denoise.h), the probe fused into the transformer. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "difflet/denoise.h"
#include "difflet/pipeline.h"
#include "difflet/program.h"
#include "difflet/qwen.h"
#include "difflet/qwenimage.h"
#include "difflet/registry.h"
#include "difflet/text.h"
#include "difflet/wan_vae.h"

enum { C_TEXT = 0, C_VAE, C_TRANSFORMER, NCOMP };
static const char *const k_qi_components[NCOMP] = {"text_encoder", "vae", "transformer"};

/* the pipeline's prompt_template_encode and prompt_template_encode_start_idx */
static const char k_template_pre[] =
    "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, spatial "
    "relationships of the objects and background:<|im_end|>\n<|im_start|>user\n";
static const char k_template_post[] = "<|im_end|>\n<|im_start|>assistant\n";
enum { DROP = 34 };

typedef struct {
    dl_gen_shape shape;
    dl_model_dir *dir;
    dl_tokenizer *tok;
    dl_qwen2_text *te;
    dl_qwenimage *tr;
    dl_wan_vae *vae;
    dl_flowmatch fm;
    dl_denoise *loop;
    int64_t lh, lw, C, N, Cp, T, Jd, S; /* latent grid and channels, tokens, packed channels, text rows, width, encoder length */
    float *sigmas, *tsteps;
    float *pe, *ne, *hidden, *z, *img;
    int32_t *ids;
    dl_artifact *art[NCOMP];
    char prog_id[NCOMP][17];
    const dl_par_place *par;
    int host;
} qi_pipe;

/* ---- the denoiser: buf[0] = prompt_embeds [T, Jd], valid rows in cond->valid ---- */
static dl_status den_eval(void *m, const float *lat, const dl_cond *c, float t, float g, float *out) {
    (void)g;
    return dl_qwenimage_run(m, lat, c->buf[0], c->valid, t, out);
}
static dl_status den_probe(void *m, int slot, const float *lat, const dl_cond *c, float t, float g, double *score) {
    (void)c, (void)g;
    return dl_qwenimage_probe(m, slot, lat, t, score);
}
static void den_probe_reset(void *m) { dl_qwenimage_probe_reset(m); }
static const dl_denoiser_ops qi_denoiser = {den_eval, den_probe, den_probe_reset, NULL, NULL};

static void pipe_free(qi_pipe *p) {
    if (!p) return;
    dl_denoise_free(p->loop);
    dl_tokenizer_free(p->tok);
    dl_qwen2_text_free(p->te), dl_qwenimage_free(p->tr), dl_wan_vae_free(p->vae);
    for (int i = 0; i < NCOMP; i++) dl_artifact_close(p->art[i]);
    dl_model_dir_free(p->dir);
    free(p->sigmas), free(p->tsteps), free(p->pe), free(p->ne), free(p->hidden), free(p->z), free(p->img), free(p->ids);
    free(p);
}

typedef struct {
    qi_pipe *p;
    int which;
} build_ctx;

static dl_status build_component(void *ctx, dl_wsrc *ws) {
    build_ctx *b = ctx;
    qi_pipe *p = b->p;
    if (!ws) { /* release what was built: dl_program_get reloads it from the program just written */
        switch (b->which) {
        case C_TEXT: dl_qwen2_text_free(p->te), p->te = NULL; break;
        case C_VAE: dl_wan_vae_free(p->vae), p->vae = NULL; break;
        default: dl_qwenimage_free(p->tr), p->tr = NULL;
        }
        return DL_OK;
    }
    switch (b->which) {
    case C_TEXT: return dl_qwen2_text_load(&p->te, p->dir, "text_encoder", p->S, p->shape.dt, ws);
    case C_VAE: return dl_wan_vae_load(&p->vae, p->dir, "vae", 1, p->lh, p->lw, p->shape.dt, ws);
    default:
        return dl_qwenimage_load(&p->tr, p->dir, "transformer", p->lh / 2, p->lw / 2, p->T, p->shape.dt, ws,
                                 p->par ? &p->par->split : NULL);
    }
}

static dl_status pipe_load(qi_pipe **out, const char *model_dir, const dl_gen_shape *shape) {
    *out = NULL;
    qi_pipe *p = calloc(1, sizeof *p);
    if (!p) return dl_fail(DL_ERR_NOMEM, "out of memory");
    p->shape = *shape;
    char path[4096];
    dl_status s = dl_model_dir_open(&p->dir, model_dir);
    if (s != DL_OK) goto fail;
    if (strcmp(dl_model_dir_class(p->dir), "QwenImagePipeline")) {
        s = dl_fail(DL_ERR_UNSUPPORTED, "`%s`: pipeline %s is not a QwenImagePipeline", model_dir, dl_model_dir_class(p->dir));
        goto fail;
    }
    if (shape->frames > 1) {
        s = dl_fail(DL_ERR_INVALID, "QwenImagePipeline makes images: %d frames asked for", shape->frames);
        goto fail;
    }
    if (shape->cfg_batch) {
        s = dl_fail(DL_ERR_UNSUPPORTED, "batched CFG is not supported for QwenImagePipeline yet (its branches differ in text length)");
        goto fail;
    }
    if (!p->shape.max_sequence_length) p->shape.max_sequence_length = (int)dl_model_default_int(model_dir, "max_sequence_length", 1, 1024, 512);
    if (p->shape.max_sequence_length < 1 || p->shape.max_sequence_length > 1024) {
        s = dl_fail(DL_ERR_INVALID, "max_sequence_length must be in 1..1024 (QwenImagePipeline's limit), got %d",
                    p->shape.max_sequence_length);
        goto fail;
    }
    /* the VAE's spatial scale: 2^len(temperal_downsample), as the pipeline computes it */
    const cJSON *vcfg;
    if ((s = dl_model_dir_config(p->dir, "vae", &vcfg))) goto fail;
    const cJSON *td = cJSON_GetObjectItemCaseSensitive(vcfg, "temperal_downsample");
    const int scale = 1 << (cJSON_IsArray(td) ? cJSON_GetArraySize(td) : 3), mult = 2 * scale;
    if (shape->width <= 0 || shape->height <= 0 || shape->width % mult || shape->height % mult || shape->width > 8192 ||
        shape->height > 8192) {
        s = dl_fail(DL_ERR_INVALID, "size %dx%d: width and height must be positive multiples of %d (2 x the VAE's %dx) up to 8192",
                    shape->width, shape->height, mult, scale);
        goto fail;
    }
    p->lh = shape->height / scale, p->lw = shape->width / scale;
    p->T = p->shape.max_sequence_length;
    p->S = DROP + p->T; /* causal: rows past the cut never change the kept ones */
    p->par = shape->par;
    p->host = !p->par || dl_comm_rank(p->par->replica_comm) == 0;
    if (p->host) {
        snprintf(path, sizeof path, "%s/tokenizer", model_dir);
        if ((s = dl_tokenizer_load(&p->tok, path))) goto fail;
    }
    for (int c = p->host ? 0 : C_TRANSFORMER; c < NCOMP && s == DL_OK; c++) {
        char shp[256];
        if (c == C_TEXT) snprintf(shp, sizeof shp, "{\"seq\":%lld}", (long long)p->S);
        else if (c == C_VAE) snprintf(shp, sizeof shp, "{\"height\":%d,\"width\":%d}", shape->height, shape->width);
        else snprintf(shp, sizeof shp, "{\"height\":%d,\"text\":%lld,\"width\":%d}", shape->height, (long long)p->T, shape->width);
        build_ctx b = {p, c};
        s = dl_pipeline_program(p->dir, k_qi_components[c], shp, shape, 0, c == C_TRANSFORMER, build_component, &b, &p->art[c],
                                p->prog_id[c]);
    }
    if (s == DL_OK) s = dl_flowmatch_load(p->dir, &p->fm);
    if (s != DL_OK) goto fail;
    p->Cp = dl_qwenimage_in_channels(p->tr);
    p->C = p->Cp / 4;
    p->N = (p->lh / 2) * (p->lw / 2);
    p->Jd = dl_qwenimage_text_dim(p->tr);
    if (p->Cp % 4 || dl_qwenimage_out_channels(p->tr) != p->Cp || (p->host && dl_wan_vae_z_dim(p->vae) != p->C)) {
        s = dl_fail(DL_ERR_FORMAT, "transformer in/out channels (%lld/%lld) are not 4 x the VAE's z_dim %lld", (long long)p->Cp,
                    (long long)dl_qwenimage_out_channels(p->tr), (long long)(p->host ? dl_wan_vae_z_dim(p->vae) : 0));
        goto fail;
    }
    if (p->host && dl_qwen2_text_width(p->te) != p->Jd) {
        s = dl_fail(DL_ERR_FORMAT, "text encoder width %lld is not the transformer's joint_attention_dim %lld",
                    (long long)dl_qwen2_text_width(p->te), (long long)p->Jd);
        goto fail;
    }
    p->sigmas = malloc((DL_STEPS_MAX + 1) * 4);
    p->tsteps = malloc(DL_STEPS_MAX * 4);
    p->pe = calloc((size_t)(p->T * p->Jd), 4), p->ne = calloc((size_t)(p->T * p->Jd), 4);
    p->hidden = malloc((size_t)(p->S * p->Jd) * 4);
    p->ids = malloc((size_t)p->S * sizeof *p->ids);
    p->z = malloc((size_t)(p->C * p->lh * p->lw) * 4);
    p->img = malloc((size_t)(3 * shape->width * shape->height) * 4);
    if (!p->sigmas || !p->tsteps || !p->pe || !p->ne || !p->hidden || !p->ids || !p->z || !p->img) {
        s = dl_fail(DL_ERR_NOMEM, "out of memory");
        goto fail;
    }
    {
        dl_denoiser dn = {&qi_denoiser, p->tr, p->N * p->Cp, 0};
        dl_cond c0 = {{p->pe}, {p->T * p->Jd}, 1, p->T}, c1 = {{p->ne}, {p->T * p->Jd}, 1, p->T};
        if ((s = dl_denoise_new(&p->loop, &dn, p->par, &c0, &c1)) != DL_OK) goto fail;
    }
    *out = p;
    return DL_OK;
fail:
    pipe_free(p);
    return s;
}

/* prompt_embeds of one prompt (zero rows past it) and its valid length */
static dl_status encode(qi_pipe *p, const char *prompt, float *emb, int64_t *valid) {
    size_t n = strlen(prompt), len = sizeof k_template_pre - 1 + n + sizeof k_template_post - 1;
    if (n > DL_TOK_MAX_TEXT) return dl_fail(DL_ERR_INVALID, "prompt longer than %u bytes", DL_TOK_MAX_TEXT);
    char *txt = malloc(len + 1);
    if (!txt) return dl_fail(DL_ERR_NOMEM, "out of memory");
    snprintf(txt, len + 1, "%s%s%s", k_template_pre, prompt, k_template_post);
    int nt = 0;
    dl_status s = dl_tokenizer_encode(p->tok, txt, len, (int)p->S, 0, p->ids, &nt);
    free(txt);
    if (s != DL_OK) return s;
    if (nt <= DROP)
        return dl_fail(DL_ERR_INVALID, "the templated prompt has %d tokens, not more than the %d the pipeline drops", nt, DROP);
    if ((s = dl_qwen2_text_run(p->te, p->ids, nt, p->hidden))) return s;
    *valid = nt - DROP;
    memset(emb, 0, (size_t)(p->T * p->Jd) * 4);
    memcpy(emb, p->hidden + (int64_t)DROP * p->Jd, (size_t)(*valid * p->Jd) * 4);
    return DL_OK;
}

static dl_status generate(qi_pipe *p, const dl_gen_request *r, dl_media *out, dl_gen_timing *timing, int *ran) {
    dl_gen_timing tm = {0};
    if (!r->prompt) return dl_fail(DL_ERR_INVALID, "a prompt is required");
    if (r->steps <= 0 || r->steps > DL_STEPS_MAX)
        return dl_fail(DL_ERR_INVALID, "steps must be in 1..%d, got %d", DL_STEPS_MAX, r->steps);
    if (!isfinite(r->true_cfg)) return dl_fail(DL_ERR_INVALID, "true_cfg must be a finite number");
    const int cfg = r->true_cfg > 1.f && r->negative_prompt != NULL;
    if (p->par && p->par->cfg.cfg == 2 && !cfg)
        return dl_fail(DL_ERR_INVALID, "cfg=2 runs the two CFG passes on separate ranks, but this request has one pass "
                                       "(true CFG needs true_cfg > 1 and a negative prompt)");
    double t0 = dl_now();
    int64_t v0 = 0, v1 = 0;
    dl_status s = encode(p, r->prompt, p->pe, &v0);
    if (s == DL_OK && cfg) s = encode(p, r->negative_prompt, p->ne, &v1);
    if (s != DL_OK) return s;
    dl_denoise_set_valid(p->loop, 0, v0);
    dl_denoise_set_valid(p->loop, 1, cfg ? v1 : v0);
    tm.encode_s = dl_now() - t0;
    if ((s = dl_flowmatch_sigmas(&p->fm, r->steps, dl_flowmatch_mu(&p->fm, p->N), p->sigmas))) return s;
    for (int i = 0; i < r->steps; i++) p->tsteps[i] = p->sigmas[i] * (float)p->fm.num_train_timesteps / 1000.f;
    const int64_t N = p->N, Cp = p->Cp, C = p->C, gw = p->lw / 2;
    float *lat = dl_denoise_latents(p->loop);
    if (r->init) {
        char what[96];
        snprintf(what, sizeof what, "%lld x %lld (packed)", (long long)N, (long long)Cp);
        if ((s = dl_pipeline_read_latents(r->init, N * Cp, what, lat))) return s;
    } else {
        dl_randn(r->seed, p->z, N * Cp);
        for (int64_t c = 0; c < C; c++)
            for (int64_t y = 0; y < p->lh; y++)
                for (int64_t x = 0; x < p->lw; x++)
                    lat[((y / 2) * gw + x / 2) * Cp + c * 4 + (y % 2) * 2 + (x % 2)] = p->z[(c * p->lh + y) * p->lw + x];
    }
    dl_denoise_request dr = {.steps = r->steps, .t = p->tsteps, .sigmas = p->sigmas, .cfg = cfg, .cfg_scale = r->true_cfg,
                             .cfg_renorm = Cp, .text_valid = p->T, .cache = r->cache, .cancel = r->cancel,
                             .on_step = r->on_step, .on_probe = r->on_probe, .ctx = r->ctx};
    dl_denoise_timing dt;
    *ran = 1;
    if ((s = dl_denoise_run(p->loop, &dr, &dt)) != DL_OK) return s;
    tm.denoise_s = dt.denoise_s, tm.probe_s = dt.probe_s, tm.cached_s = dt.cached_s, tm.comm_s = dt.comm_s;
    tm.denoiser_calls = dt.calls, tm.cached_steps = dt.cached_steps, tm.ranks = dt.ranks;
    /* unpack, un-normalise as the pipeline does (latents / (1 / std) + mean), decode one frame */
    t0 = dl_now();
    const float *mean = dl_wan_vae_latents_mean(p->vae), *std = dl_wan_vae_latents_std(p->vae);
    for (int64_t c = 0; c < C; c++) {
        float inv = 1.f / std[c];
        for (int64_t y = 0; y < p->lh; y++)
            for (int64_t x = 0; x < p->lw; x++) {
                float v = lat[((y / 2) * gw + x / 2) * Cp + c * 4 + (y % 2) * 2 + (x % 2)];
                p->z[(c * p->lh + y) * p->lw + x] = v / inv + mean[c];
            }
    }
    if ((s = dl_wan_vae_decode(p->vae, p->z, p->img, NULL, NULL))) return s;
    if ((s = dl_pipeline_media(out, DL_MEDIA_IMAGE, p->img, 1, p->shape.height, p->shape.width, 0, r->want_pixels))) return s;
    tm.decode_s = dl_now() - t0;
    if (timing) *timing = tm;
    return DL_OK;
}

/* ---- the registry entry ------------------------------------------------------------ */

static dl_status entry_load(void **impl, const char *dir, const dl_gen_shape *g) { return pipe_load((qi_pipe **)impl, dir, g); }
static void entry_free(void *impl) { pipe_free(impl); }
static int entry_is_host(const void *impl) { return ((const qi_pipe *)impl)->host; }
static dl_status entry_worker_one(void *impl, int *stopped) { return dl_denoise_worker_one(((qi_pipe *)impl)->loop, stopped); }
static const char *entry_program_id(const void *impl, int c) {
    return c >= 0 && c < NCOMP ? ((const qi_pipe *)impl)->prog_id[c] : "";
}

static dl_status gen_fn(void *impl, const dl_gen_request *r, dl_media *out, dl_gen_timing *tm, int *ran) {
    return generate(impl, r, out, tm, ran);
}
static dl_status entry_generate(void *impl, const dl_gen_request *g, dl_media *out, dl_gen_timing *tm) {
    qi_pipe *p = impl;
    return dl_pipeline_host_generate(p, p->host, p->loop, gen_fn, g, out, tm);
}

const dl_model_entry dl_qwenimage_entry = {
    .pipeline_class = "QwenImagePipeline",
    .output = DL_MEDIA_IMAGE,
    .default_steps = 50,
    .default_guidance = 1.0f,
    .default_true_cfg = 4.0f,
    .components = k_qi_components,
    .ncomponents = NCOMP,
    .default_width = 1024, /* default_sample_size 128 x the VAE's 8 */
    .default_height = 1024,
    .default_heads = 24,
    .load = entry_load,
    .free = entry_free,
    .is_host = entry_is_host,
    .worker_one = entry_worker_one,
    .generate = entry_generate,
    .program_id = entry_program_id,
};
