/* OpenSora 1.2's text-to-video flow (hpcaitech/Open-Sora v1.2.0: scripts/inference.py
 * with configs/opensora-v1-2/inference/sample.py, the RFLOW sampler):
 *   prompt:  " aesthetic score: {aes:.1f}." appended (aes 6.5) unless the prompt has
 *            "aesthetic score:", then T5Embedder's text_preprocessing (clean_caption
 *            twice), tokenized to model_max_length (300) with padding; the T5 v1.1
 *            encoder runs in f32 with that mask (whatever the run dtype);
 *   CFG:     always two branches, the second the null caption (y_embedder.y_embedding)
 *            with the prompt's own mask: v = vu + g (vc - vu), the first in_channels
 *            of the prediction (pred_sigma's other half dropped);
 *   latents: noise [4, T_lat, H / 8, W / 8] (the VAE's get_latent_size);
 *   schedule: t_i = (1 - i / N) 1000, each transformed (f32) by
 *            r = sqrt(H W / 512^2) sqrt(floor(frames / 17) 5) (1 for one frame):
 *            s' = r s / (1 + (r - 1) s), s = t_i / 1000; the model gets 1000 s';
 *            z += v (T_i - T_{i+1}) / 1000 (the last step's T_{i+1} = 0);
 *   conditioning: fps (the request's, else 24) and the requested height and width
 *            (the position embedding's scale, even where the latent floors them);
 *   decode:  OpenSoraVAE v1.2 (opensora.h), then clamp to [-1, 1], (x + 1) / 2,
 *            x 255 + 0.5 truncated to bytes (save_sample); the video is
 *            8 floor(H / 8) x 8 floor(W / 8).
 * The loop (steps, CFG on one group or two, step caching, the ranks of a replica) is
 * the shared one (denoise.h); the step-caching probe is a program of its own. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "difflet/denoise.h"
#include "difflet/opensora.h"
#include "difflet/pipeline.h"
#include "difflet/program.h"
#include "difflet/registry.h"
#include "difflet/text.h"

enum { C_TEXT = 0, C_VAE, C_PROBE, C_TRANSFORMER, NCOMP };
static const char *const k_os_components[NCOMP] = {"text_encoder", "vae", "probe", "transformer"};
static const char *const k_os_folders[NCOMP] = {"text_encoder", "vae", "transformer", "transformer"};

enum { DEFAULT_FPS = 24 };

/* ---- the denoiser: buf[0] = caption [T, Tc], buf[1] = {fps}; valid rows in
 * cond->valid; the prediction's extra (pred_sigma) channels into a scratch ---- */
typedef struct {
    dl_stdit3 *tr;
    dl_stdit3_probe *probe;
    float height, width;
    int64_t n, nout;  /* latent values; the model's output values */
    float *o[2];      /* [nout] each */
} os_den;

static dl_stdit3_cond den_cond(const os_den *d, const dl_cond *c, float t) {
    return (dl_stdit3_cond){.y = c->buf[0], .valid = c->valid, .timestep = t, .fps = c->buf[1][0],
                            .height = d->height, .width = d->width};
}
static dl_status den_eval(void *m, const float *lat, const dl_cond *c, float t, float g, float *out) {
    (void)g;
    os_den *d = m;
    dl_stdit3_cond sc = den_cond(d, c, t);
    dl_status s = dl_stdit3_run(d->tr, lat, &sc, d->o[0]);
    if (s == DL_OK) memcpy(out, d->o[0], (size_t)d->n * 4); /* channel-major: the first in_channels */
    return s;
}
static dl_status den_eval2(void *m, const float *lat, const dl_cond *c0, const dl_cond *c1, float t, float g, float *o0,
                           float *o1) {
    (void)g;
    os_den *d = m;
    dl_stdit3_cond a = den_cond(d, c0, t), b = den_cond(d, c1, t);
    dl_status s = dl_stdit3_run2(d->tr, lat, &a, &b, d->o[0], d->o[1]);
    if (s == DL_OK) memcpy(o0, d->o[0], (size_t)d->n * 4), memcpy(o1, d->o[1], (size_t)d->n * 4);
    return s;
}
static dl_status den_probe(void *m, int slot, const float *lat, const dl_cond *c, float t, float g, double *score) {
    (void)g;
    os_den *d = m;
    dl_stdit3_cond sc = den_cond(d, c, t);
    return dl_stdit3_probe_run(d->probe, slot, lat, &sc, score);
}
static void den_probe_reset(void *m) { dl_stdit3_probe_reset(((os_den *)m)->probe); }
static const dl_denoiser_ops os_denoiser = {den_eval, den_probe, den_probe_reset, NULL, den_eval2};

typedef struct {
    dl_gen_shape shape;
    dl_model_dir *dir;
    dl_tokenizer *tok;
    dl_t5_encoder *te;
    dl_stdit3 *tr;
    dl_stdit3_probe *probe;
    dl_opensora_vae *vae;
    dl_denoise *loop;
    os_den den;
    int64_t C, lat[3], T, Tc, n;  /* latent channels and grid, caption rows and width, latent size */
    int64_t vh, vw;               /* the decoded video's size: 8 floor(H / 8) x 8 floor(W / 8) */
    double aes;                   /* the aesthetic score appended to prompts (< 0: none) */
    float *tsteps, *sigmas, *dts; /* [steps]: transformed timesteps; [steps + 1] / 1000; [steps] Euler dt */
    float *pe, *ne;               /* [T, Tc] the caption / the null caption */
    float fps[2];                 /* each branch's fps conditioning */
    float *video;                 /* [3, frames, vh, vw] */
    int32_t *ids;
    dl_artifact *art[NCOMP];
    char prog_id[NCOMP][17];
    const dl_par_place *par;
    int host;
    double def_fps;
} os_pipe;

static void pipe_free(os_pipe *p) {
    if (!p) return;
    dl_denoise_free(p->loop);
    dl_tokenizer_free(p->tok);
    dl_t5_encoder_free(p->te), dl_stdit3_free(p->tr), dl_stdit3_probe_free(p->probe), dl_opensora_vae_free(p->vae);
    for (int i = 0; i < NCOMP; i++) dl_artifact_close(p->art[i]);
    dl_model_dir_free(p->dir);
    free(p->tsteps), free(p->sigmas), free(p->dts), free(p->pe), free(p->ne), free(p->video), free(p->ids);
    free(p->den.o[0]), free(p->den.o[1]);
    free(p);
}

typedef struct {
    os_pipe *p;
    int which;
} build_ctx;

static dl_status build_component(void *ctx, dl_wsrc *ws) {
    build_ctx *b = ctx;
    os_pipe *p = b->p;
    dl_dtype dt = p->shape.dt;
    const dl_dit_split *sp = p->par ? &p->par->split : NULL;
    if (!ws) { /* release what was built: dl_program_get reloads it from the program just written */
        switch (b->which) {
        case C_TEXT: dl_t5_encoder_free(p->te), p->te = NULL; break;
        case C_VAE: dl_opensora_vae_free(p->vae), p->vae = NULL; break;
        case C_PROBE: dl_stdit3_probe_free(p->probe), p->probe = NULL; break;
        default: dl_stdit3_free(p->tr), p->tr = NULL;
        }
        return DL_OK;
    }
    switch (b->which) {
    case C_TEXT: return dl_t5_encoder_load(&p->te, p->dir, "text_encoder", p->T, DL_F32, ws); /* T5Embedder's f32 */
    case C_VAE:
        return dl_opensora_vae_load(&p->vae, p->dir, "vae", p->shape.frames, p->vh, p->vw, dt, ws);
    case C_PROBE: return dl_stdit3_probe_load(&p->probe, p->dir, "transformer", p->lat[0], p->lat[1], p->lat[2], dt, ws, sp);
    default:
        return dl_stdit3_load(&p->tr, p->dir, "transformer", p->lat[0], p->lat[1], p->lat[2], p->T, dt, ws, sp,
                              p->shape.cfg_batch ? 2 : 1);
    }
}

/* OpenSoraVAE v1.2's get_latent_size: 5 latent frames per 17 frames, then the
 * temporal VAE's (4x, padded) size of the remainder; 8x spatially (floored) */
static void latent_size(int64_t frames, int64_t h, int64_t w, int64_t lat[3]) {
    lat[0] = frames / 17 * 5 + (frames % 17 + 3) / 4;
    lat[1] = h / 8;
    lat[2] = w / 8;
}

static dl_status pipe_load(os_pipe **out, const char *model_dir, const dl_gen_shape *shape) {
    *out = NULL;
    os_pipe *p = calloc(1, sizeof *p);
    if (!p) return dl_fail(DL_ERR_NOMEM, "out of memory");
    p->shape = *shape;
    char path[4096];
    dl_status s = dl_model_dir_open(&p->dir, model_dir);
    if (s != DL_OK) goto fail;
    if (strcmp(dl_model_dir_class(p->dir), "OpenSoraPipeline")) {
        s = dl_fail(DL_ERR_UNSUPPORTED, "`%s`: pipeline %s is not an OpenSoraPipeline", model_dir, dl_model_dir_class(p->dir));
        goto fail;
    }
    const cJSON *tcfg;
    int64_t maxlen;
    if ((s = dl_model_dir_config(p->dir, "transformer", &tcfg)) ||
        (s = dl_cfg_int(tcfg, "transformer/config.json", "model_max_length", 300, &maxlen)))
        goto fail;
    if (maxlen < 1 || maxlen > 4096) {
        s = dl_fail(DL_ERR_FORMAT, "`transformer/config.json`: model_max_length %lld is outside 1..4096", (long long)maxlen);
        goto fail;
    }
    /* T5Embedder pads to model_max_length; a shorter max_sequence_length truncates
     * prompts (the null caption then uses as many rows) */
    if (!p->shape.max_sequence_length) p->shape.max_sequence_length = (int)maxlen;
    if (p->shape.max_sequence_length < 1 || p->shape.max_sequence_length > maxlen) {
        s = dl_fail(DL_ERR_INVALID, "max_sequence_length must be in 1..%lld (the transformer's model_max_length), got %d",
                    (long long)maxlen, p->shape.max_sequence_length);
        goto fail;
    }
    const int frames = shape->frames;
    if (shape->width < 16 || shape->height < 16 || shape->width > 8192 || shape->height > 8192) {
        s = dl_fail(DL_ERR_INVALID, "size %dx%d: width and height must be in 16..8192 (the video is 8 floor(x / 8) pixels)",
                    shape->width, shape->height);
        goto fail;
    }
    if (frames < 1 || frames > 100000) {
        s = dl_fail(DL_ERR_INVALID, "frames must be in 1..100000, got %d", frames);
        goto fail;
    }
    if (shape->cfg_batch && p->shape.par && p->shape.par->cfg.cfg == 2) {
        s = dl_fail(DL_ERR_INVALID, "batched CFG and cfg=2 both place the two CFG branches: choose one");
        goto fail;
    }
    latent_size(frames, shape->height, shape->width, p->lat);
    p->vh = shape->height / 8 * 8, p->vw = shape->width / 8 * 8;
    p->T = p->shape.max_sequence_length;
    p->def_fps = dl_model_default_num(model_dir, "fps", 1e-3, 1000, DEFAULT_FPS);
    p->aes = dl_model_default_num(model_dir, "aes", -1, 100, 6.5);
    p->par = shape->par;
    p->host = !p->par || dl_comm_rank(p->par->replica_comm) == 0;
    if (p->host) {
        snprintf(path, sizeof path, "%s/tokenizer", model_dir);
        if ((s = dl_tokenizer_load(&p->tok, path))) goto fail;
    }
    for (int c = p->host ? 0 : C_PROBE; c < NCOMP && s == DL_OK; c++) {
        char shp[256];
        dl_gen_shape g = p->shape;
        if (c == C_TEXT) {
            snprintf(shp, sizeof shp, "{\"seq\":%lld}", (long long)p->T);
            g.dt = DL_F32;
        } else if (c == C_VAE)
            snprintf(shp, sizeof shp, "{\"frames\":%d,\"height\":%lld,\"width\":%lld}", frames, (long long)p->vh,
                     (long long)p->vw);
        else if (c == C_PROBE)
            snprintf(shp, sizeof shp, "{\"frames\":%d,\"height\":%d,\"width\":%d}", frames, shape->height, shape->width);
        else
            snprintf(shp, sizeof shp, "{%s\"frames\":%d,\"height\":%d,\"text\":%lld,\"width\":%d}",
                     shape->cfg_batch ? "\"cfg_batch\":2," : "", frames, shape->height, (long long)p->T, shape->width);
        build_ctx b = {p, c};
        s = dl_pipeline_program(p->dir, k_os_folders[c], shp, &g, c == C_PROBE, c >= C_PROBE, build_component, &b,
                                &p->art[c], p->prog_id[c]);
    }
    if (s != DL_OK) goto fail;
    p->C = dl_stdit3_in_channels(p->tr);
    p->Tc = dl_stdit3_caption_channels(p->tr);
    if (p->host) {
        int64_t vl[3];
        dl_opensora_vae_latent_size(p->vae, vl);
        if (dl_opensora_vae_channels(p->vae) != p->C || vl[0] != p->lat[0] || vl[1] != p->lat[1] || vl[2] != p->lat[2]) {
            s = dl_fail(DL_ERR_FORMAT, "the transformer's %lld latent channels and grid %lldx%lldx%lld are not the VAE's "
                                       "(%lld channels, %lldx%lldx%lld)",
                        (long long)p->C, (long long)p->lat[0], (long long)p->lat[1], (long long)p->lat[2],
                        (long long)dl_opensora_vae_channels(p->vae), (long long)vl[0], (long long)vl[1], (long long)vl[2]);
            goto fail;
        }
        if (dl_t5_encoder_width(p->te) != p->Tc) {
            s = dl_fail(DL_ERR_FORMAT, "text encoder width %lld is not the transformer's caption_channels %lld",
                        (long long)dl_t5_encoder_width(p->te), (long long)p->Tc);
            goto fail;
        }
    }
    const int64_t per = p->lat[0] * p->lat[1] * p->lat[2];
    p->n = p->C * per;
    p->den = (os_den){.tr = p->tr, .probe = p->probe, .height = (float)shape->height, .width = (float)shape->width,
                      .n = p->n, .nout = dl_stdit3_out_channels(p->tr) * per};
    p->den.o[0] = malloc((size_t)p->den.nout * 4);
    p->den.o[1] = malloc((size_t)p->den.nout * 4);
    p->tsteps = malloc(DL_STEPS_MAX * 4), p->dts = malloc(DL_STEPS_MAX * 4), p->sigmas = malloc((DL_STEPS_MAX + 1) * 4);
    p->pe = malloc((size_t)(p->T * p->Tc) * 4), p->ne = malloc((size_t)(p->T * p->Tc) * 4);
    p->ids = malloc((size_t)p->T * sizeof *p->ids);
    if (p->host) p->video = malloc((size_t)(3 * (int64_t)frames * p->vh * p->vw) * 4);
    if (!p->den.o[0] || !p->den.o[1] || !p->tsteps || !p->dts || !p->sigmas || !p->pe || !p->ne || !p->ids ||
        (p->host && !p->video)) {
        s = dl_fail(DL_ERR_NOMEM, "out of memory");
        goto fail;
    }
    {
        dl_denoiser dn = {&os_denoiser, &p->den, p->n, p->shape.cfg_batch};
        dl_cond c0 = {{p->pe, p->fps}, {p->T * p->Tc, 1}, 2, 0}, c1 = {{p->ne, p->fps + 1}, {p->T * p->Tc, 1}, 2, 0};
        if ((s = dl_denoise_new(&p->loop, &dn, p->par, &c0, &c1)) != DL_OK) goto fail;
    }
    *out = p;
    return DL_OK;
fail:
    pipe_free(p);
    return s;
}

/* the prompt's caption (T5 of the cleaned prompt with its mask) and valid token count */
static dl_status encode(os_pipe *p, const char *prompt, float *emb, int *valid) {
    char *full = NULL, *clean = NULL;
    size_t n = strlen(prompt);
    if (p->aes >= 0 && !strstr(prompt, "aesthetic score:")) { /* append_score_to_prompts */
        if (!(full = malloc(n + 64))) return dl_fail(DL_ERR_NOMEM, "out of memory");
        snprintf(full, n + 64, "%s aesthetic score: %.1f.", prompt, p->aes);
    }
    dl_status s = dl_text_clean_caption(full ? full : prompt, &clean);
    free(full);
    int k = 0;
    if (s == DL_OK) s = dl_tokenizer_encode(p->tok, clean, strlen(clean), (int)p->T, 1, p->ids, &k);
    free(clean);
    if (s != DL_OK) return s;
    if (k < 1) k = 1; /* T5 always appends </s> */
    *valid = k;
    return dl_t5_encoder_run_masked(p->te, p->ids, k, emb, NULL);
}

/* RFLOW's timesteps with timestep_transform, in f32 as torch computes them */
static void schedule(os_pipe *p, int steps) {
    const float hw = (float)p->shape.height * (float)p->shape.width;
    const float nf = p->shape.frames == 1 ? 1.f : floorf((float)p->shape.frames / 17.f) * 5.f;
    const float ratio = sqrtf(hw / 262144.f) * sqrtf(nf / 1.f);
    for (int i = 0; i < steps; i++) {
        float t = (float)((1.0 - (double)i / steps) * 1000.0) / 1000.f;
        float tt = ratio * t / (1.f + (ratio - 1.f) * t);
        p->tsteps[i] = tt * 1000.f;
    }
    for (int i = 0; i < steps; i++) {
        p->dts[i] = (i < steps - 1 ? p->tsteps[i] - p->tsteps[i + 1] : p->tsteps[i]) / 1000.f;
        p->sigmas[i] = p->tsteps[i] / 1000.f;
    }
    p->sigmas[steps] = 0.f;
}

static dl_status rf_step(void *ctx, int i, const float *v, float *lat) {
    os_pipe *p = ctx;
    const float dt = p->dts[i];
    const int64_t n = p->n;
#pragma omp parallel for schedule(static)
    for (int64_t k = 0; k < n; k++) lat[k] = lat[k] + v[k] * dt;
    return DL_OK;
}

static dl_status generate(os_pipe *p, const dl_gen_request *r, dl_media *out, dl_gen_timing *timing, int *ran) {
    dl_gen_timing tm = {0};
    if (!r->prompt) return dl_fail(DL_ERR_INVALID, "a prompt is required");
    if (r->steps <= 0 || r->steps > DL_STEPS_MAX)
        return dl_fail(DL_ERR_INVALID, "steps must be in 1..%d, got %d", DL_STEPS_MAX, r->steps);
    if (!isfinite(r->guidance)) return dl_fail(DL_ERR_INVALID, "guidance must be a finite number");
    if (r->negative_prompt && *r->negative_prompt)
        return dl_fail(DL_ERR_INVALID, "OpenSora's unconditional branch is its learned null caption: a negative prompt is not supported");
    const double fps = r->fps > 0 ? r->fps : p->def_fps;
    if (!(fps > 0 && fps <= 1000)) return dl_fail(DL_ERR_INVALID, "fps must be in (0, 1000], got %g", fps);
    const int cfg = r->guidance != 1.f; /* RFLOW always runs both; at 1 the null branch has no weight */
    if (p->par && p->par->cfg.cfg == 2 && !cfg)
        return dl_fail(DL_ERR_INVALID, "cfg=2 runs the two CFG passes on separate ranks, but guidance_scale 1 has one pass");
    double t0 = dl_now();
    int valid = 0;
    dl_status s = encode(p, r->prompt, p->pe, &valid);
    if (s != DL_OK) return s;
    memcpy(p->ne, dl_stdit3_null_caption(p->tr), (size_t)(p->T * p->Tc) * 4);
    /* the model's fps input: 24 for videos, the reference's IMG_FPS 120 for one frame */
    p->fps[0] = p->fps[1] = p->shape.frames == 1 ? 120.f : (float)fps;
    dl_denoise_set_valid(p->loop, 0, valid);
    dl_denoise_set_valid(p->loop, 1, valid);
    tm.encode_s = dl_now() - t0;
    schedule(p, r->steps);
    float *lat = dl_denoise_latents(p->loop);
    if (r->init) {
        char what[128];
        snprintf(what, sizeof what, "%lld x %lld x %lld x %lld (channels, latent frames, height, width)", (long long)p->C,
                 (long long)p->lat[0], (long long)p->lat[1], (long long)p->lat[2]);
        if ((s = dl_pipeline_read_latents(r->init, p->n, what, lat))) return s;
    } else
        dl_randn(r->seed, lat, p->n);
    dl_denoise_request dr = {.steps = r->steps, .t = p->tsteps, .sigmas = p->sigmas, .sched_step = rf_step, .sched_ctx = p,
                             .cfg = cfg, .cfg_scale = r->guidance, .text_valid = valid, .cache = r->cache,
                             .cancel = r->cancel, .on_step = r->on_step, .on_probe = r->on_probe, .ctx = r->ctx};
    dl_denoise_timing dt;
    *ran = 1;
    if ((s = dl_denoise_run_resumable(p->loop, r, &dr, &dt)) != DL_OK) return s;
    tm.denoise_s = dt.denoise_s, tm.probe_s = dt.probe_s, tm.cached_s = dt.cached_s, tm.comm_s = dt.comm_s;
    tm.denoiser_calls = dt.calls, tm.cached_steps = dt.cached_steps, tm.ranks = dt.ranks;
    t0 = dl_now();
    if ((s = dl_opensora_vae_decode(p->vae, lat, p->video, r->on_decode, r->ctx))) return s;
    if ((s = dl_pipeline_media_opts(out, DL_MEDIA_VIDEO, p->video, p->shape.frames, p->vh, p->vw, fps, r->want_pixels,
                                    DL_TO_BYTES_TRUNC)))
        return s;
    tm.decode_s = dl_now() - t0;
    if (timing) *timing = tm;
    return DL_OK;
}

/* ---- the registry entry ------------------------------------------------------------ */

/* STDiT3's heads are config `num_heads`; sequence parallelism on the TP group is not
 * supported (CP is OpenSora's own dynamic sequence parallelism, whatever the mode) */
static const char *split_check(const char *dir, const dl_par_config *c, char *buf, size_t n) {
    int64_t heads = dl_json_file_int(dir, "transformer/config.json", "num_heads", 1, 1 << 20, 16);
    if (c->sp && c->tp > 1) {
        snprintf(buf, n, "STDiT3 does not support sequence parallelism on the TP group (sp); use cp");
        return buf;
    }
    if (c->tp > 1 && heads % c->tp) {
        snprintf(buf, n, "tp=%d does not divide STDiT3's %lld heads", c->tp, (long long)heads);
        return buf;
    }
    return NULL;
}

static dl_status entry_load(void **impl, const char *dir, const dl_gen_shape *g) { return pipe_load((os_pipe **)impl, dir, g); }
static void entry_free(void *impl) { pipe_free(impl); }
static int entry_is_host(const void *impl) { return ((const os_pipe *)impl)->host; }
static dl_status entry_worker_one(void *impl, int *stopped) { return dl_denoise_worker_one(((os_pipe *)impl)->loop, stopped); }
static const char *entry_program_id(const void *impl, int c) {
    return c >= 0 && c < NCOMP ? ((const os_pipe *)impl)->prog_id[c] : "";
}
static dl_status gen_fn(void *impl, const dl_gen_request *r, dl_media *out, dl_gen_timing *tm, int *ran) {
    return generate(impl, r, out, tm, ran);
}
static dl_status entry_generate(void *impl, const dl_gen_request *g, dl_media *out, dl_gen_timing *tm) {
    os_pipe *p = impl;
    return dl_pipeline_host_generate(p, p->host, p->loop, gen_fn, g, out, tm);
}

const dl_model_entry dl_opensora_entry = {
    .pipeline_class = "OpenSoraPipeline",
    .output = DL_MEDIA_VIDEO,
    .default_steps = 30, /* configs/opensora-v1-2/inference/sample.py: 30 steps, cfg 7, 240p 9:16, 51 frames, 24 fps */
    .default_guidance = 7.0f,
    .default_fps = DEFAULT_FPS,
    .guidance_cfg = 1,
    .any_frames = 1, /* 17 frames make 5 latent frames, the remainder its own */
    .resumable = 1, /* RFLOW's Euler update keeps no state between steps */
    .components = k_os_components,
    .ncomponents = NCOMP,
    .default_width = 426,
    .default_height = 240,
    .default_frames = 51,
    .split_check = split_check,
    .load = entry_load,
    .free = entry_free,
    .is_host = entry_is_host,
    .worker_one = entry_worker_one,
    .generate = entry_generate,
    .program_id = entry_program_id,
};
