/* WanPipeline's host flow (diffusers, Wan 2.1 text-to-video):
 *   prompt: cleaned as the pipeline cleans it (HTML entities unescaped twice,
 *           whitespace collapsed, stripped), tokenized to max_sequence_length
 *           (512) with padding; UMT5 runs with that attention mask and the rows
 *           past the prompt are zeroed (the transformer still attends to them);
 *   CFG:    when guidance_scale > 1, the negative prompt ("" by default) too;
 *   latents: noise [C, (frames - 1) / 4 + 1, H / 8, W / 8] (the VAE's scales);
 *   loop:   v = transformer(latents, t) (v = vu + g (vc - vu) with CFG), then the
 *           scheduler's step (UniPC as Wan configures it, or flow-matching Euler);
 *   decode: z = latents / (1 / latents_std) + latents_mean, the causal VAE one
 *           latent frame at a time, (x / 2 + 0.5) clamped to [0, 1], x255 rounded.
 * The loop (steps, CFG on one group or two, step caching, the ranks of a CP replica)
 * is the shared one (denoise.h); the step-caching probe is a program of its own. */
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
#include "difflet/unipc.h"
#include "difflet/wan.h"
#include "difflet/wan_vae.h"

/* programs: the probe is a separate one of the transformer's weights (Difflet §5) */
enum { C_TEXT = 0, C_VAE, C_PROBE, C_TRANSFORMER, NCOMP };
static const char *const k_wan_components[NCOMP] = {"text_encoder", "vae", "probe", "transformer"};
static const char *const k_wan_folders[NCOMP] = {"text_encoder", "vae", "transformer", "transformer"};

/* ---- Wan's denoiser: conditioning buf[0] = prompt_embeds [T, Td]; the probe program
 * beside the transformer ---- */
typedef struct {
    dl_wan *tr;
    dl_wan_probe *probe;
} wan_den;
static dl_status den_eval(void *m, const float *lat, const dl_cond *c, float t, float g, float *out) {
    (void)g;
    return dl_wan_run(((wan_den *)m)->tr, lat, c->buf[0], t, out);
}
static dl_status den_probe(void *m, int slot, const float *lat, const dl_cond *c, float t, float g, double *score) {
    (void)c, (void)g;
    return dl_wan_probe_run(((wan_den *)m)->probe, slot, lat, t, score);
}
static void den_probe_reset(void *m) { dl_wan_probe_reset(((wan_den *)m)->probe); }
static dl_status den_eval2(void *m, const float *lat, const dl_cond *c0, const dl_cond *c1, float t, float g, float *o0,
                           float *o1) {
    (void)g;
    return dl_wan_run2(((wan_den *)m)->tr, lat, c0->buf[0], c1->buf[0], t, o0, o1);
}
static const dl_denoiser_ops wan_denoiser = {den_eval, den_probe, den_probe_reset, NULL, den_eval2};

typedef struct {
    dl_gen_shape shape;
    dl_model_dir *dir;
    dl_tokenizer *tok;
    dl_t5_encoder *te;
    dl_wan *tr;
    dl_wan_probe *probe;
    dl_wan_vae *vae;
    int unipc;           /* the scheduler: UniPC, else flow-matching Euler */
    dl_unipc uni;
    dl_flowmatch fm;
    dl_unipc_state *ust; /* the multistep history, for ust_steps steps */
    int ust_steps;
    dl_denoise *loop;
    wan_den den;
    int64_t C, lf, lh, lw, T, Td, n; /* latent channels and grid, text rows and width, latent size */
    int ts, ss;                      /* the VAE's temporal and spatial scales */
    float *sigmas, *tsteps;
    float *pe, *ne;                  /* [T, Td] prompt / negative prompt embeddings */
    float *z, *video;                /* [C, lf, lh, lw], [3, frames, H, W] */
    int32_t *ids;
    dl_artifact *art[NCOMP];
    char prog_id[NCOMP][17];
    const dl_par_place *par;
    int host;
    double fps; /* the export rate when a request gives none (difflet.json, else WanPipeline's 16) */
} wan_pipe;


static void pipe_free(wan_pipe *p) {
    if (!p) return;
    dl_denoise_free(p->loop);
    dl_tokenizer_free(p->tok);
    dl_t5_encoder_free(p->te), dl_wan_free(p->tr), dl_wan_probe_free(p->probe), dl_wan_vae_free(p->vae);
    dl_unipc_state_free(p->ust);
    for (int i = 0; i < NCOMP; i++) dl_artifact_close(p->art[i]);
    dl_model_dir_free(p->dir);
    free(p->sigmas), free(p->tsteps), free(p->pe), free(p->ne), free(p->z), free(p->video), free(p->ids);
    free(p);
}

typedef struct {
    wan_pipe *p;
    int which;
} build_ctx;

static dl_status build_component(void *ctx, dl_wsrc *ws) {
    build_ctx *b = ctx;
    wan_pipe *p = b->p;
    dl_dtype dt = p->shape.dt;
    if (!ws) { /* release what was built: dl_program_get reloads it from the program just written */
        switch (b->which) {
        case C_TEXT: dl_t5_encoder_free(p->te), p->te = NULL; break;
        case C_VAE: dl_wan_vae_free(p->vae), p->vae = NULL; break;
        case C_PROBE: dl_wan_probe_free(p->probe), p->probe = NULL; break;
        default: dl_wan_free(p->tr), p->tr = NULL;
        }
        return DL_OK;
    }
    switch (b->which) {
    case C_TEXT: return dl_t5_encoder_load(&p->te, p->dir, "text_encoder", p->T, dt, ws);
    case C_VAE: return dl_wan_vae_load(&p->vae, p->dir, "vae", p->lf, p->lh, p->lw, dt, ws);
    case C_PROBE:
        return dl_wan_probe_load(&p->probe, p->dir, "transformer", p->lf, p->lh, p->lw, dt, ws,
                                 p->par ? &p->par->split : NULL);
    default:
        return dl_wan_load_batch(&p->tr, p->dir, "transformer", p->lf, p->lh, p->lw, p->T, dt, ws,
                                 p->par ? &p->par->split : NULL, p->shape.cfg_batch ? 2 : 1);
    }
}

/* the VAE's scale factors from its config (the pipeline reads these fields) */
static dl_status vae_scales(wan_pipe *p) {
    const cJSON *v;
    dl_status s = dl_model_dir_config(p->dir, "vae", &v);
    if (s != DL_OK) return s;
    int64_t ts, ss;
    if ((s = dl_cfg_int(v, "vae/config.json", "scale_factor_temporal", 4, &ts)) ||
        (s = dl_cfg_int(v, "vae/config.json", "scale_factor_spatial", 8, &ss)))
        return s;
    if (ts < 1 || ts > 64 || ss < 1 || ss > 64)
        return dl_fail(DL_ERR_FORMAT, "`vae/config.json`: scale factors %lld (temporal), %lld (spatial) out of range",
                       (long long)ts, (long long)ss);
    p->ts = (int)ts, p->ss = (int)ss;
    return DL_OK;
}

static dl_status scheduler_load(wan_pipe *p) {
    char path[4096];
    snprintf(path, sizeof path, "%s/scheduler/scheduler_config.json", dl_model_dir_path(p->dir));
    cJSON *cfg;
    dl_status s = dl_json_read_object(path, "scheduler/scheduler_config.json", &cfg);
    if (s != DL_OK) return s;
    const cJSON *cls = cJSON_GetObjectItemCaseSensitive(cfg, "_class_name");
    p->unipc = cJSON_IsString(cls) && !strcmp(cls->valuestring, "UniPCMultistepScheduler");
    if (p->unipc)
        s = dl_unipc_from_json(cfg, "scheduler/scheduler_config.json", &p->uni);
    else
        s = dl_flowmatch_from_json(cfg, "scheduler/scheduler_config.json", &p->fm);
    if (s == DL_OK && !p->unipc && p->fm.use_dynamic_shifting)
        s = dl_fail(DL_ERR_UNSUPPORTED, "`scheduler/scheduler_config.json`: WanPipeline does not pass mu; dynamic shifting is not supported");
    cJSON_Delete(cfg);
    return s;
}

static dl_status pipe_load(wan_pipe **out, const char *model_dir, const dl_gen_shape *shape) {
    *out = NULL;
    wan_pipe *p = calloc(1, sizeof *p);
    if (!p) return dl_fail(DL_ERR_NOMEM, "out of memory");
    p->shape = *shape;
    char path[4096];
    dl_status s = dl_model_dir_open(&p->dir, model_dir);
    if (s != DL_OK) goto fail;
    if (strcmp(dl_model_dir_class(p->dir), "WanPipeline")) {
        s = dl_fail(DL_ERR_UNSUPPORTED, "`%s`: pipeline %s is not a WanPipeline", model_dir, dl_model_dir_class(p->dir));
        goto fail;
    }
    {
        cJSON *idx;
        snprintf(path, sizeof path, "%s/model_index.json", model_dir);
        if ((s = dl_json_read_object(path, "model_index.json", &idx))) goto fail;
        const cJSON *br = cJSON_GetObjectItemCaseSensitive(idx, "boundary_ratio");
        int wan22 = dl_model_dir_component_class(p->dir, "transformer_2") || (br && !cJSON_IsNull(br)) ||
                    cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(idx, "expand_timesteps"));
        cJSON_Delete(idx);
        if (wan22) {
            s = dl_fail(DL_ERR_UNSUPPORTED, "`%s`: a Wan 2.2 pipeline (transformer_2 / boundary_ratio / expand_timesteps) is not supported yet",
                        model_dir);
            goto fail;
        }
    }
    if (!p->shape.max_sequence_length) p->shape.max_sequence_length = (int)dl_model_default_int(model_dir, "max_sequence_length", 1, 4096, 512);
    if (p->shape.max_sequence_length < 1 || p->shape.max_sequence_length > 4096) {
        s = dl_fail(DL_ERR_INVALID, "max_sequence_length must be in 1..4096, got %d", p->shape.max_sequence_length);
        goto fail;
    }
    if ((s = vae_scales(p))) goto fail;
    /* WanPipeline.check_inputs: multiples of 16 */
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
    if (frames % p->ts != 1 % p->ts) { /* as the pipeline does: rounded down to k * ts + 1, with a warning */
        int r = frames / p->ts * p->ts + 1;
        DL_WARN("`num_frames - 1` has to be divisible by %d: %d frames rounded to %d, as WanPipeline rounds them", p->ts,
                frames, r);
        frames = r;
    }
    p->shape.frames = frames;
    if (shape->cfg_batch && p->shape.par && p->shape.par->cfg.cfg == 2) {
        s = dl_fail(DL_ERR_INVALID, "batched CFG and cfg=2 both place the two CFG branches: choose one");
        goto fail;
    }
    p->lf = (frames - 1) / p->ts + 1;
    p->lh = shape->height / p->ss;
    p->lw = shape->width / p->ss;
    p->T = p->shape.max_sequence_length;
    p->fps = dl_model_default_num(model_dir, "fps", 1e-3, 1000, 16.0);
    p->par = shape->par;
    p->host = !p->par || dl_comm_rank(p->par->replica_comm) == 0;
    if (p->host) {
        snprintf(path, sizeof path, "%s/tokenizer", model_dir);
        if ((s = dl_tokenizer_load(&p->tok, path))) goto fail;
    }
    for (int c = p->host ? 0 : C_PROBE; c < NCOMP && s == DL_OK; c++) {
        char shp[256];
        if (c == C_TEXT) snprintf(shp, sizeof shp, "{\"seq\":%lld}", (long long)p->T);
        else if (c == C_VAE)
            snprintf(shp, sizeof shp, "{\"frames\":%lld,\"height\":%d,\"width\":%d}", (long long)p->lf, shape->height, shape->width);
        else if (c == C_PROBE)
            snprintf(shp, sizeof shp, "{\"frames\":%d,\"height\":%d,\"width\":%d}", frames, shape->height, shape->width);
        else
            snprintf(shp, sizeof shp, "{%s\"frames\":%d,\"height\":%d,\"text\":%lld,\"width\":%d}",
                     shape->cfg_batch ? "\"cfg_batch\":2," : "", frames, shape->height, (long long)p->T, shape->width);
        build_ctx b = {p, c};
        s = dl_pipeline_program(p->dir, k_wan_folders[c], shp, shape, c == C_PROBE, c >= C_PROBE, build_component, &b,
                                &p->art[c], p->prog_id[c]);
    }
    if (s == DL_OK) s = scheduler_load(p);
    if (s != DL_OK) goto fail;
    p->C = dl_wan_in_channels(p->tr);
    p->Td = dl_wan_text_dim(p->tr);
    if (p->host && (dl_wan_vae_z_dim(p->vae) != p->C || dl_wan_out_channels(p->tr) != p->C)) {
        s = dl_fail(DL_ERR_FORMAT, "transformer in/out channels (%lld/%lld) are not the VAE's z_dim %lld", (long long)p->C,
                    (long long)dl_wan_out_channels(p->tr), (long long)dl_wan_vae_z_dim(p->vae));
        goto fail;
    }
    if (p->host && dl_t5_encoder_width(p->te) != p->Td) {
        s = dl_fail(DL_ERR_FORMAT, "text encoder width %lld is not the transformer's text_dim %lld",
                    (long long)dl_t5_encoder_width(p->te), (long long)p->Td);
        goto fail;
    }
    p->n = p->C * p->lf * p->lh * p->lw;
    p->sigmas = malloc((DL_STEPS_MAX + 1) * 4);
    p->tsteps = malloc(DL_STEPS_MAX * 4);
    p->pe = malloc((size_t)(p->T * p->Td) * 4), p->ne = malloc((size_t)(p->T * p->Td) * 4);
    p->ids = malloc((size_t)p->T * sizeof *p->ids);
    if (p->host) {
        p->z = malloc((size_t)p->n * 4);
        p->video = malloc((size_t)(3 * (int64_t)frames * shape->height * shape->width) * 4);
    }
    if (!p->sigmas || !p->tsteps || !p->pe || !p->ne || !p->ids || (p->host && (!p->z || !p->video))) {
        s = dl_fail(DL_ERR_NOMEM, "out of memory");
        goto fail;
    }
    {
        p->den = (wan_den){p->tr, p->probe};
        dl_denoiser dn = {&wan_denoiser, &p->den, p->n, p->shape.cfg_batch};
        dl_cond c0 = {{p->pe}, {p->T * p->Td}, 1, 0}, c1 = {{p->ne}, {p->T * p->Td}, 1, 0};
        if ((s = dl_denoise_new(&p->loop, &dn, p->par, &c0, &c1)) != DL_OK) goto fail;
    }
    *out = p;
    return DL_OK;
fail:
    pipe_free(p);
    return s;
}

/* prompt_embeds of one prompt: cleaned, tokenized with padding, encoded with the
 * mask, rows past the prompt zeroed */
static dl_status encode(wan_pipe *p, const char *prompt, float *emb) {
    char *clean = NULL;
    int n = 0;
    dl_status s = dl_text_clean_wan(prompt, &clean);
    if (s == DL_OK) s = dl_tokenizer_encode(p->tok, clean, strlen(clean), (int)p->T, 1, p->ids, &n);
    free(clean);
    if (s == DL_OK) s = dl_t5_encoder_run_masked(p->te, p->ids, n > 0 ? n : 1, emb, NULL);
    if (s == DL_OK) memset(emb + (int64_t)n * p->Td, 0, (size_t)((p->T - n) * p->Td) * 4);
    return s;
}

static dl_status unipc_step(void *ctx, int i, const float *v, float *lat) {
    wan_pipe *p = ctx;
    return dl_unipc_step(p->ust, i, v, lat);
}

static dl_status generate(wan_pipe *p, const dl_gen_request *r, dl_media *out, dl_gen_timing *timing, int *ran) {
    dl_gen_timing tm = {0};
    if (!r->prompt) return dl_fail(DL_ERR_INVALID, "a prompt is required");
    if (r->steps <= 0 || r->steps > DL_STEPS_MAX)
        return dl_fail(DL_ERR_INVALID, "steps must be in 1..%d, got %d", DL_STEPS_MAX, r->steps);
    if (!isfinite(r->guidance)) return dl_fail(DL_ERR_INVALID, "guidance must be a finite number");
    const int cfg = r->guidance > 1.f; /* do_classifier_free_guidance */
    if (p->par && p->par->cfg.cfg == 2 && !cfg)
        return dl_fail(DL_ERR_INVALID, "cfg=2 runs the two CFG passes on separate ranks, but this request has one pass "
                                       "(guidance_scale must be above 1)");
    double t0 = dl_now();
    dl_status s = encode(p, r->prompt, p->pe);
    if (s == DL_OK && cfg) s = encode(p, r->negative_prompt ? r->negative_prompt : "", p->ne);
    if (s != DL_OK) return s;
    tm.encode_s = dl_now() - t0;
    if (p->unipc)
        s = dl_unipc_schedule(&p->uni, r->steps, p->tsteps, p->sigmas);
    else {
        s = dl_flowmatch_sigmas_default(&p->fm, r->steps, p->sigmas); /* set_timesteps(steps), no custom sigmas */
        for (int i = 0; s == DL_OK && i < r->steps; i++) p->tsteps[i] = p->sigmas[i] * (float)p->fm.num_train_timesteps;
    }
    if (s != DL_OK) return s;
    float *lat = dl_denoise_latents(p->loop);
    if (r->init) {
        char what[128];
        snprintf(what, sizeof what, "%lld x %lld x %lld x %lld (channels, latent frames, height, width)", (long long)p->C,
                 (long long)p->lf, (long long)p->lh, (long long)p->lw);
        if ((s = dl_pipeline_read_latents(r->init, p->n, what, lat))) return s;
    } else
        dl_randn(r->seed, lat, p->n);
    if (p->unipc && p->ust && p->ust_steps == r->steps)
        dl_unipc_state_reset(p->ust);
    else if (p->unipc) { /* the history is planned for a step count */
        dl_unipc_state_free(p->ust);
        p->ust = NULL;
        if ((s = dl_unipc_state_new(&p->ust, &p->uni, r->steps, p->n))) return s;
        p->ust_steps = r->steps;
    }
    dl_denoise_request dr = {.steps = r->steps, .t = p->tsteps, .sigmas = p->sigmas, .guidance = r->guidance,
                             .sched_step = p->unipc ? unipc_step : NULL, .sched_ctx = p,
                             .cfg = cfg, .cfg_scale = r->guidance, .text_valid = p->T, .cache = r->cache,
                             .cancel = r->cancel, .on_step = r->on_step, .on_probe = r->on_probe, .ctx = r->ctx};
    dl_denoise_timing dt;
    *ran = 1;
    if ((s = dl_denoise_run(p->loop, &dr, &dt)) != DL_OK) return s;
    tm.denoise_s = dt.denoise_s, tm.probe_s = dt.probe_s, tm.cached_s = dt.cached_s, tm.comm_s = dt.comm_s;
    tm.denoiser_calls = dt.calls, tm.cached_steps = dt.cached_steps, tm.ranks = dt.ranks;
    /* un-normalise as the pipeline does (latents / (1 / std) + mean, in f32), decode */
    t0 = dl_now();
    const float *mean = dl_wan_vae_latents_mean(p->vae), *std = dl_wan_vae_latents_std(p->vae);
    const int64_t per = p->lf * p->lh * p->lw;
    for (int64_t c = 0; c < p->C; c++) {
        float inv = 1.f / std[c];
        for (int64_t i = 0; i < per; i++) p->z[c * per + i] = lat[c * per + i] / inv + mean[c];
    }
    if ((s = dl_wan_vae_decode(p->vae, p->z, p->video, r->on_decode, r->ctx))) return s; /* one latent frame at a time */
    const int64_t F = p->shape.frames, H = p->shape.height, W = p->shape.width;
    if ((s = dl_pipeline_media(out, DL_MEDIA_VIDEO, p->video, F, H, W, r->fps > 0 ? r->fps : p->fps, r->want_pixels)))
        return s;
    tm.decode_s = dl_now() - t0;
    if (timing) *timing = tm;
    return DL_OK;
}

/* ---- the registry entry ------------------------------------------------------------ */

static dl_status entry_load(void **impl, const char *dir, const dl_gen_shape *g) { return pipe_load((wan_pipe **)impl, dir, g); }
static void entry_free(void *impl) { pipe_free(impl); }
static int entry_is_host(const void *impl) { return ((const wan_pipe *)impl)->host; }
static dl_status entry_worker_one(void *impl, int *stopped) { return dl_denoise_worker_one(((wan_pipe *)impl)->loop, stopped); }
static const char *entry_program_id(const void *impl, int c) {
    return c >= 0 && c < NCOMP ? ((const wan_pipe *)impl)->prog_id[c] : "";
}

static dl_status gen_fn(void *impl, const dl_gen_request *r, dl_media *out, dl_gen_timing *tm, int *ran) {
    return generate(impl, r, out, tm, ran);
}
static dl_status entry_generate(void *impl, const dl_gen_request *g, dl_media *out, dl_gen_timing *tm) {
    wan_pipe *p = impl;
    return dl_pipeline_host_generate(p, p->host, p->loop, gen_fn, g, out, tm);
}

const dl_model_entry dl_wan_entry = {
    .pipeline_class = "WanPipeline",
    .output = DL_MEDIA_VIDEO,
    .default_steps = 50,
    .default_guidance = 5.0f,
    .default_fps = 16.0,
    .guidance_cfg = 1,
    .components = k_wan_components,
    .ncomponents = NCOMP,
    .default_width = 832, /* WanPipeline's __call__: 832 x 480, 81 frames */
    .default_height = 480,
    .default_frames = 81,
    .default_heads = 40,
    .load = entry_load,
    .free = entry_free,
    .is_host = entry_is_host,
    .worker_one = entry_worker_one,
    .generate = entry_generate,
    .program_id = entry_program_id,
};
