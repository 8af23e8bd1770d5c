/* HunyuanVideoPipeline's host flow (diffusers, HunyuanVideo text-to-video):
 *   prompt: the Llama prompt embeddings (hunyuan_text.c: the prompt template, its
 *           crop_start, right padding to max_sequence_length + crop_start,
 *           hidden_states[-3], the template's rows dropped) and their mask, whose
 *           count of real rows is the transformer's valid text length; CLIP's
 *           pooled output of the prompt (77 tokens, padded);
 *   CFG:    embedded guidance (guidance_scale x 1000 into the transformer); true CFG
 *           when true_cfg_scale > 1 and a negative prompt is given:
 *           v = vn + s (vc - vn);
 *   latents: noise [C, (frames - 1) / 4 + 1, H / 8, W / 8] (the VAE's scales);
 *   schedule: FlowMatch Euler on np.linspace(1, 0, steps + 1)[:-1] with the
 *           scheduler's shift; the model's timestep is sigma x 1000;
 *   decode: latents / scaling_factor, the causal VAE in temporal tiles (diffusers'
 *           framewise decoding), (x / 2 + 0.5) clamped to [0, 1], x255 rounded.
 * The prompt template and its crop_start are DEFAULT_PROMPT_TEMPLATE's unless the
 * folder's difflet.json gives `prompt_template` {template, crop_start} (the call
 * argument of the same name; a tokenizer other than Llama 3's needs its own crop).
 * The loop is the shared one (denoise.h); the step-caching probe is a program of
 * its own. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "difflet/denoise.h"
#include "difflet/hunyuan.h"
#include "difflet/hunyuan_vae.h"
#include "difflet/pipeline.h"
#include "difflet/program.h"
#include "difflet/qwen.h"
#include "difflet/registry.h"
#include "difflet/text.h"

enum { C_TEXT = 0, C_TEXT2, C_VAE, C_PROBE, C_TRANSFORMER, NCOMP };
static const char *const k_hv_components[NCOMP] = {"text_encoder", "text_encoder_2", "vae", "probe", "transformer"};
static const char *const k_hv_folders[NCOMP] = {"text_encoder", "text_encoder_2", "vae", "transformer", "transformer"};

/* diffusers' DEFAULT_PROMPT_TEMPLATE */
static const char k_template[] =
    "<|start_header_id|>system<|end_header_id|>\n\nDescribe the video by detailing the following aspects: "
    "1. The main content and theme of the video.2. The color, shape, size, texture, quantity, text, and spatial "
    "relationships of the objects.3. Actions, events, behaviors temporal relationships, physical movement changes of "
    "the objects.4. background environment, light, style and atmosphere.5. camera angles, movements, and transitions "
    "used in the video:<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n{}<|eot_id|>";
enum { CROP_START = 95, SKIP_LAYERS = 2, CLIP_LEN = 77 };

/* ---- the denoiser: buf[0] = Llama embeddings [T, Td], buf[1] = CLIP pooled [Pd];
 * valid rows in cond->valid; the probe program beside the transformer ---- */
typedef struct {
    dl_hunyuan_video *tr;
    dl_hunyuan_probe *probe;
} hv_den;
static dl_status den_eval(void *m, const float *lat, const dl_cond *c, float t, float g, float *out) {
    return dl_hunyuan_video_run(((hv_den *)m)->tr, lat, c->buf[0], c->valid, c->buf[1], t, g, out);
}
static dl_status den_probe(void *m, int slot, const float *lat, const dl_cond *c, float t, float g, double *score) {
    return dl_hunyuan_probe_run(((hv_den *)m)->probe, slot, lat, c->buf[1], t, g, score);
}
static void den_probe_reset(void *m) { dl_hunyuan_probe_reset(((hv_den *)m)->probe); }
static const dl_denoiser_ops hv_denoiser = {den_eval, den_probe, den_probe_reset, NULL, NULL};

typedef struct {
    dl_gen_shape shape;
    dl_model_dir *dir;
    dl_tokenizer *tok, *tok2;      /* Llama, CLIP */
    dl_qwen2_text *te;
    dl_clip_text *clip;
    dl_hunyuan_video *tr;
    dl_hunyuan_probe *probe;
    dl_hunyuan_vae *vae;
    dl_flowmatch fm;
    dl_denoise *loop;
    hv_den den;
    char *tmpl;                    /* the prompt template */
    int crop;                      /* its crop_start */
    int64_t C, lf, lh, lw, T, Td, Pd, n; /* latent channels and grid, text rows and widths, latent size */
    int ts, ss;                    /* the VAE's temporal and spatial scales */
    float *sigmas, *tsteps;
    float *pe, *ne, *pp, *np;      /* [T, Td] embeddings, [Pd] pooled: prompt / negative prompt */
    float *hidden77, *z, *video;   /* [77, Pd], [C, lf, lh, lw], [3, frames, H, W] */
    int32_t *ids, *mask;
    dl_artifact *art[NCOMP];
    char prog_id[NCOMP][17];
    const dl_par_place *par;
    int host;
    double fps;
} hv_pipe;

static void pipe_free(hv_pipe *p) {
    if (!p) return;
    dl_denoise_free(p->loop);
    dl_tokenizer_free(p->tok), dl_tokenizer_free(p->tok2);
    dl_qwen2_text_free(p->te), dl_clip_text_free(p->clip), dl_hunyuan_video_free(p->tr), dl_hunyuan_probe_free(p->probe);
    dl_hunyuan_vae_free(p->vae);
    for (int i = 0; i < NCOMP; i++) dl_artifact_close(p->art[i]);
    dl_model_dir_free(p->dir);
    free(p->tmpl), free(p->sigmas), free(p->tsteps), free(p->pe), free(p->ne), free(p->pp), free(p->np);
    free(p->hidden77), free(p->z), free(p->video), free(p->ids), free(p->mask);
    free(p);
}

typedef struct {
    hv_pipe *p;
    int which;
} build_ctx;

static dl_status build_component(void *ctx, dl_wsrc *ws) {
    build_ctx *b = ctx;
    hv_pipe *p = b->p;
    dl_dtype dt = p->shape.dt;
    const dl_dit_split *sp = p->par ? &p->par->split : NULL;
    if (!ws) { /* release what was built: dl_program_get reloads it from the program just written */
        switch (b->which) {
        case C_TEXT: dl_qwen2_text_free(p->te), p->te = NULL; break;
        case C_TEXT2: dl_clip_text_free(p->clip), p->clip = NULL; break;
        case C_VAE: dl_hunyuan_vae_free(p->vae), p->vae = NULL; break;
        case C_PROBE: dl_hunyuan_probe_free(p->probe), p->probe = NULL; break;
        default: dl_hunyuan_video_free(p->tr), p->tr = NULL;
        }
        return DL_OK;
    }
    switch (b->which) {
    case C_TEXT: return dl_qwen2_text_load(&p->te, p->dir, "text_encoder", p->crop + p->T, dt, ws);
    case C_TEXT2: return dl_clip_text_load(&p->clip, p->dir, "text_encoder_2", CLIP_LEN, dt, ws);
    case C_VAE: return dl_hunyuan_vae_load(&p->vae, p->dir, "vae", p->lf, p->lh, p->lw, dt, ws);
    case C_PROBE: return dl_hunyuan_probe_load(&p->probe, p->dir, "transformer", p->lf, p->lh, p->lw, dt, ws, sp);
    default: return dl_hunyuan_video_load(&p->tr, p->dir, "transformer", p->lf, p->lh, p->lw, p->T, dt, ws, sp);
    }
}

/* the VAE's scale factors from its config (the pipeline reads these fields) */
static dl_status vae_scales(hv_pipe *p) {
    const cJSON *v;
    dl_status s = dl_model_dir_config(p->dir, "vae", &v);
    if (s != DL_OK) return s;
    int64_t ts, ss;
    if ((s = dl_cfg_int(v, "vae/config.json", "temporal_compression_ratio", 4, &ts)) ||
        (s = dl_cfg_int(v, "vae/config.json", "spatial_compression_ratio", 8, &ss)))
        return s;
    if (ts < 1 || ts > 64 || ss < 1 || ss > 64)
        return dl_fail(DL_ERR_FORMAT, "`vae/config.json`: compression ratios %lld (temporal), %lld (spatial) out of range",
                       (long long)ts, (long long)ss);
    p->ts = (int)ts, p->ss = (int)ss;
    return DL_OK;
}

/* the prompt template: difflet.json's `prompt_template`, else DEFAULT_PROMPT_TEMPLATE */
static dl_status template_load(hv_pipe *p, const char *model_dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/difflet.json", model_dir);
    p->crop = CROP_START;
    cJSON *cfg = NULL;
    FILE *f = fopen(path, "rb");
    if (f) {
        fclose(f);
        dl_status s = dl_json_read_object(path, "difflet.json", &cfg);
        if (s != DL_OK) return s;
    }
    const cJSON *pt = cfg ? cJSON_GetObjectItemCaseSensitive(cfg, "prompt_template") : NULL;
    if (pt) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(pt, "template");
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(pt, "crop_start");
        if (!cJSON_IsObject(pt) || !cJSON_IsString(t) || !cJSON_IsNumber(c) || c->valuedouble < 0 ||
            c->valuedouble > 65536 || c->valuedouble != (int)c->valuedouble) {
            cJSON_Delete(cfg);
            return dl_fail(DL_ERR_FORMAT, "`difflet.json`: prompt_template must be {\"template\": text with `{}`, \"crop_start\": integer >= 0}");
        }
        p->tmpl = strdup(t->valuestring);
        p->crop = (int)c->valuedouble;
    } else {
        p->tmpl = strdup(k_template);
    }
    cJSON_Delete(cfg);
    return p->tmpl ? DL_OK : dl_fail(DL_ERR_NOMEM, "out of memory");
}

static dl_status pipe_load(hv_pipe **out, const char *model_dir, const dl_gen_shape *shape) {
    *out = NULL;
    hv_pipe *p = calloc(1, sizeof *p);
    if (!p) return dl_fail(DL_ERR_NOMEM, "out of memory");
    p->shape = *shape;
    char path[4096];
    dl_status s = dl_model_dir_open(&p->dir, model_dir);
    if (s != DL_OK) goto fail;
    if (strcmp(dl_model_dir_class(p->dir), "HunyuanVideoPipeline")) {
        s = dl_fail(DL_ERR_UNSUPPORTED, "`%s`: pipeline %s is not a HunyuanVideoPipeline", model_dir, dl_model_dir_class(p->dir));
        goto fail;
    }
    if (!p->shape.max_sequence_length)
        p->shape.max_sequence_length = (int)dl_model_default_int(model_dir, "max_sequence_length", 1, 4096, 256);
    if (p->shape.max_sequence_length < 1 || p->shape.max_sequence_length > 4096) {
        s = dl_fail(DL_ERR_INVALID, "max_sequence_length must be in 1..4096, got %d", p->shape.max_sequence_length);
        goto fail;
    }
    if ((s = vae_scales(p)) || (s = template_load(p, model_dir))) goto fail;
    /* HunyuanVideoPipeline.check_inputs: multiples of 16 */
    if (shape->width <= 0 || shape->height <= 0 || shape->width % 16 || shape->height % 16 || shape->width > 8192 ||
        shape->height > 8192 || shape->width % p->ss || shape->height % p->ss) {
        s = dl_fail(DL_ERR_INVALID, "size %dx%d: width and height must be positive multiples of 16 (and of the VAE's %dx) up to 8192",
                    shape->width, shape->height, p->ss);
        goto fail;
    }
    int frames = shape->frames;
    if (frames < 1 || frames > 100000) {
        s = dl_fail(DL_ERR_INVALID, "frames must be in 1..100000, got %d", frames);
        goto fail;
    }
    p->lf = (frames - 1) / p->ts + 1; /* prepare_latents' count; the VAE gives (lf - 1) ts + 1 frames */
    if ((p->lf - 1) * p->ts + 1 != frames) {
        int r = (int)((p->lf - 1) * p->ts + 1);
        DL_WARN("HunyuanVideo makes 4k + 1 frames: %d frames requested, %d made (as HunyuanVideoPipeline decodes %lld latent frames)",
                frames, r, (long long)p->lf);
        frames = r;
    }
    p->shape.frames = frames;
    if (shape->cfg_batch) {
        s = dl_fail(DL_ERR_UNSUPPORTED, "batched CFG is not built for HunyuanVideo: true CFG runs its two passes one after the other (or on cfg=2 ranks)");
        goto fail;
    }
    p->lh = shape->height / p->ss;
    p->lw = shape->width / p->ss;
    p->T = p->shape.max_sequence_length;
    p->fps = dl_model_default_num(model_dir, "fps", 1e-3, 1000, 15.0);
    p->par = shape->par;
    p->host = !p->par || dl_comm_rank(p->par->replica_comm) == 0;
    if (p->host) {
        snprintf(path, sizeof path, "%s/tokenizer", model_dir);
        if ((s = dl_tokenizer_load(&p->tok, path))) goto fail;
        snprintf(path, sizeof path, "%s/tokenizer_2", model_dir);
        if ((s = dl_tokenizer_load(&p->tok2, path))) goto fail;
    }
    for (int c = p->host ? 0 : C_PROBE; c < NCOMP && s == DL_OK; c++) {
        char shp[256];
        if (c == C_TEXT) snprintf(shp, sizeof shp, "{\"seq\":%lld}", (long long)(p->crop + p->T));
        else if (c == C_TEXT2) snprintf(shp, sizeof shp, "{\"seq\":%d}", CLIP_LEN);
        else if (c == C_VAE)
            snprintf(shp, sizeof shp, "{\"frames\":%lld,\"height\":%d,\"width\":%d}", (long long)p->lf, shape->height, shape->width);
        else if (c == C_PROBE)
            snprintf(shp, sizeof shp, "{\"frames\":%d,\"height\":%d,\"width\":%d}", frames, shape->height, shape->width);
        else
            snprintf(shp, sizeof shp, "{\"frames\":%d,\"height\":%d,\"text\":%lld,\"width\":%d}", frames, shape->height,
                     (long long)p->T, shape->width);
        build_ctx b = {p, c};
        s = dl_pipeline_program(p->dir, k_hv_folders[c], shp, shape, c == C_PROBE, c >= C_PROBE, build_component, &b,
                                &p->art[c], p->prog_id[c]);
    }
    if (s == DL_OK) s = dl_flowmatch_load(p->dir, &p->fm);
    if (s == DL_OK && p->fm.use_dynamic_shifting)
        s = dl_fail(DL_ERR_UNSUPPORTED, "`scheduler/scheduler_config.json`: HunyuanVideoPipeline does not pass mu; dynamic shifting is not supported");
    if (s != DL_OK) goto fail;
    p->C = dl_hunyuan_video_in_channels(p->tr);
    dl_hunyuan_video_text_dims(p->tr, &p->Td, &p->Pd);
    if (dl_hunyuan_video_out_channels(p->tr) != p->C || (p->host && dl_hunyuan_vae_latent_channels(p->vae) != p->C)) {
        s = dl_fail(DL_ERR_FORMAT, "transformer in/out channels (%lld/%lld) are not the VAE's latent_channels %lld",
                    (long long)p->C, (long long)dl_hunyuan_video_out_channels(p->tr),
                    p->vae ? (long long)dl_hunyuan_vae_latent_channels(p->vae) : -1LL);
        goto fail;
    }
    if (p->host && (dl_qwen2_text_width(p->te) != p->Td || dl_clip_text_width(p->clip) != p->Pd)) {
        s = dl_fail(DL_ERR_FORMAT, "text encoder widths (Llama %lld, CLIP %lld) are not the transformer's text_embed_dim / pooled_projection_dim (%lld, %lld)",
                    (long long)dl_qwen2_text_width(p->te), (long long)dl_clip_text_width(p->clip), (long long)p->Td,
                    (long long)p->Pd);
        goto fail;
    }
    p->n = p->C * p->lf * p->lh * p->lw;
    p->sigmas = malloc((DL_STEPS_MAX + 1) * 4);
    p->tsteps = malloc(DL_STEPS_MAX * 4);
    p->pe = malloc((size_t)(p->T * p->Td) * 4), p->ne = malloc((size_t)(p->T * p->Td) * 4);
    p->pp = malloc((size_t)p->Pd * 4), p->np = malloc((size_t)p->Pd * 4);
    p->ids = malloc(CLIP_LEN * sizeof *p->ids), p->mask = malloc((size_t)p->T * sizeof *p->mask);
    if (p->host) {
        p->hidden77 = malloc((size_t)(CLIP_LEN * p->Pd) * 4);
        p->z = malloc((size_t)p->n * 4);
        p->video = malloc((size_t)(3 * (int64_t)frames * shape->height * shape->width) * 4);
    }
    if (!p->sigmas || !p->tsteps || !p->pe || !p->ne || !p->pp || !p->np || !p->ids || !p->mask ||
        (p->host && (!p->hidden77 || !p->z || !p->video))) {
        s = dl_fail(DL_ERR_NOMEM, "out of memory");
        goto fail;
    }
    {
        p->den = (hv_den){p->tr, p->probe};
        dl_denoiser dn = {&hv_denoiser, &p->den, p->n, 0};
        dl_cond c0 = {{p->pe, p->pp}, {p->T * p->Td, p->Pd}, 2, 0}, c1 = {{p->ne, p->np}, {p->T * p->Td, p->Pd}, 2, 0};
        if ((s = dl_denoise_new(&p->loop, &dn, p->par, &c0, &c1)) != DL_OK) goto fail;
    }
    *out = p;
    return DL_OK;
fail:
    pipe_free(p);
    return s;
}

/* encode_prompt of one prompt: the Llama embeddings and their valid row count, and
 * CLIP's pooled output */
static dl_status encode(hv_pipe *p, const char *prompt, float *emb, float *pooled, int64_t *valid) {
    dl_status s = dl_hunyuan_llama_embeds(p->tok, p->te, prompt, p->tmpl, p->crop, (int)p->T, SKIP_LAYERS, emb, p->mask);
    if (s != DL_OK) return s;
    int64_t v = 0;
    while (v < p->T && p->mask[v]) v++;
    if (v == 0)
        return dl_fail(DL_ERR_INVALID, "HunyuanVideo text: no prompt token is left after the template's %d tokens "
                                       "(max_sequence_length %lld): the prompt template fills the whole text window",
                       p->crop, (long long)p->T);
    *valid = v;
    int n;
    if ((s = dl_tokenizer_encode(p->tok2, prompt, strlen(prompt), CLIP_LEN, 1, p->ids, &n))) return s;
    return dl_clip_text_run(p->clip, p->ids, p->hidden77, pooled, NULL);
}

/* np.linspace(1, 0, steps + 1)[:-1], as the pipeline builds its sigmas, through
 * set_timesteps(sigmas=...): the same float32 values as FluxPipeline's
 * np.linspace(1, 1 / steps, steps) (checked for every count up to 200), so the
 * shared schedule (static shift; HunyuanVideo's scheduler has no dynamic shifting) */
static dl_status schedule(hv_pipe *p, int steps) {
    dl_status s = dl_flowmatch_sigmas(&p->fm, steps, 0.0, p->sigmas);
    if (s != DL_OK) return s;
    for (int i = 0; i < steps; i++) p->tsteps[i] = p->sigmas[i] * (float)p->fm.num_train_timesteps;
    return DL_OK;
}

static dl_status generate(hv_pipe *p, const dl_gen_request *r, dl_media *out, dl_gen_timing *timing, int *ran) {
    dl_gen_timing tm = {0};
    if (!r->prompt) return dl_fail(DL_ERR_INVALID, "a prompt is required");
    if (r->steps <= 0 || r->steps > DL_STEPS_MAX)
        return dl_fail(DL_ERR_INVALID, "steps must be in 1..%d, got %d", DL_STEPS_MAX, r->steps);
    if (!isfinite(r->guidance) || !isfinite(r->true_cfg))
        return dl_fail(DL_ERR_INVALID, "guidance and true_cfg_scale must be finite numbers");
    const int cfg = r->true_cfg > 1.f && r->negative_prompt; /* do_true_cfg */
    if (p->par && p->par->cfg.cfg == 2 && !cfg)
        return dl_fail(DL_ERR_INVALID, "cfg=2 runs the two CFG passes on separate ranks, but this request has one pass "
                                       "(true_cfg_scale must be above 1 and a negative prompt given)");
    double t0 = dl_now();
    int64_t v0 = 0, v1 = 0;
    dl_status s = encode(p, r->prompt, p->pe, p->pp, &v0);
    if (s == DL_OK && cfg) s = encode(p, r->negative_prompt, p->ne, p->np, &v1);
    if (s != DL_OK) return s;
    dl_denoise_set_valid(p->loop, 0, v0);
    dl_denoise_set_valid(p->loop, 1, cfg ? v1 : v0);
    tm.encode_s = dl_now() - t0;
    if ((s = schedule(p, r->steps))) return s;
    float *lat = dl_denoise_latents(p->loop);
    if (r->init) {
        char what[128];
        snprintf(what, sizeof what, "%lld x %lld x %lld x %lld (channels, latent frames, height, width)", (long long)p->C,
                 (long long)p->lf, (long long)p->lh, (long long)p->lw);
        if ((s = dl_pipeline_read_latents(r->init, p->n, what, lat))) return s;
    } else
        dl_randn(r->seed, lat, p->n);
    dl_denoise_request dr = {.steps = r->steps, .t = p->tsteps, .sigmas = p->sigmas, .guidance = r->guidance,
                             .cfg = cfg, .cfg_scale = r->true_cfg, .text_valid = p->T, .cache = r->cache,
                             .cancel = r->cancel, .on_step = r->on_step, .on_probe = r->on_probe, .ctx = r->ctx};
    dl_denoise_timing dt;
    *ran = 1;
    if ((s = dl_denoise_run(p->loop, &dr, &dt)) != DL_OK) return s;
    tm.denoise_s = dt.denoise_s, tm.probe_s = dt.probe_s, tm.cached_s = dt.cached_s, tm.comm_s = dt.comm_s;
    tm.denoiser_calls = dt.calls, tm.cached_steps = dt.cached_steps, tm.ranks = dt.ranks;
    t0 = dl_now();
    const float sf = dl_hunyuan_vae_scaling_factor(p->vae);
    for (int64_t i = 0; i < p->n; i++) p->z[i] = lat[i] / sf;
    if ((s = dl_hunyuan_vae_decode(p->vae, p->z, p->video, r->on_decode, r->ctx))) return s; /* temporal tiles */
    const int64_t F = p->shape.frames, H = p->shape.height, W = p->shape.width;
    if ((s = dl_pipeline_media(out, DL_MEDIA_VIDEO, p->video, F, H, W, r->fps > 0 ? r->fps : p->fps, r->want_pixels)))
        return s;
    tm.decode_s = dl_now() - t0;
    if (timing) *timing = tm;
    return DL_OK;
}

/* ---- the registry entry ------------------------------------------------------------ */

static dl_status entry_load(void **impl, const char *dir, const dl_gen_shape *g) { return pipe_load((hv_pipe **)impl, dir, g); }
static void entry_free(void *impl) { pipe_free(impl); }
static int entry_is_host(const void *impl) { return ((const hv_pipe *)impl)->host; }
static dl_status entry_worker_one(void *impl, int *stopped) { return dl_denoise_worker_one(((hv_pipe *)impl)->loop, stopped); }
static const char *entry_program_id(const void *impl, int c) {
    return c >= 0 && c < NCOMP ? ((const hv_pipe *)impl)->prog_id[c] : "";
}

static dl_status gen_fn(void *impl, const dl_gen_request *r, dl_media *out, dl_gen_timing *tm, int *ran) {
    return generate(impl, r, out, tm, ran);
}
static dl_status entry_generate(void *impl, const dl_gen_request *g, dl_media *out, dl_gen_timing *tm) {
    hv_pipe *p = impl;
    return dl_pipeline_host_generate(p, p->host, p->loop, gen_fn, g, out, tm);
}

const dl_model_entry dl_hunyuan_entry = {
    .pipeline_class = "HunyuanVideoPipeline",
    .output = DL_MEDIA_VIDEO,
    .default_steps = 50,
    .default_guidance = 6.0f,
    .default_true_cfg = 1.0f,
    .default_fps = 15.0,
    .guidance_cfg = 0,
    .components = k_hv_components,
    .ncomponents = NCOMP,
    .default_width = 1280, /* HunyuanVideoPipeline's __call__: 1280 x 720, 129 frames */
    .default_height = 720,
    .default_frames = 129,
    .default_heads = 24,
    .load = entry_load,
    .free = entry_free,
    .is_host = entry_is_host,
    .worker_one = entry_worker_one,
    .generate = entry_generate,
    .program_id = entry_program_id,
};
