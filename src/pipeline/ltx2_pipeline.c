/* LTX2Pipeline's host flow (diffusers 0.42, pipelines/ltx2/pipeline_ltx2.py), text to
 * video with audio, the default path (no prompt enhancement, no duration head: the
 * frame count is the request's, no image conditioning, noise_scale 0):
 *   prompt:  ltx2_text.c (Gemma 3, left padded to max_sequence_length T, every hidden
 *            state, the connectors) into video [T, Dv] and audio [T, Da] text; with CFG
 *            the negative prompt ("" when none) the same way;
 *   latents: video [C, lf, lh, lw] (lf = (frames - 1) / ts + 1, lh = height / ss) packed
 *            into [Nv, C pt p p] tokens; audio [Ca, La, M] (La = round(frames / frame_rate
 *            x sample_rate / hop / 4), M = mel_bins / 4) packed into [La, Ca M]. Given
 *            noise (`latents` [1, C, lf, lh, lw], `audio_latents` [1, Ca, La, M]) is
 *            normalised as prepare_latents does: video (x - mean) sf / std BEFORE packing,
 *            audio (x - mean) / std AFTER packing; drawn noise is used as drawn;
 *   schedule: sigmas linspace(1, 1/N, N) shifted with mu = calculate_shift(Nv, the
 *            scheduler's base/max seq len and shifts) (dl_flowmatch_sigmas); the model's
 *            timestep (and sigma, for both streams) is t = sigma x 1000; the audio
 *            scheduler is a copy with the same sigmas;
 *   guidance per step, each pass a whole transformer forward, combined in x0 space
 *            (x0 = latents - sigma v) separately for video and audio with their scales:
 *              cond (prompt), uncond (negative prompt)        when CFG: g > 1 or ag > 1
 *              STG (prompt, perturbed self-attention in spatio_temporal_guidance_blocks)
 *                                                              when stg > 0 or astg > 0
 *              modality isolation (prompt, no a2v / v2a)       when mod > 1 or amod > 1
 *            x = x0c + (g - 1)(x0c - x0u) + stg (x0c - x0s) + (mod - 1)(x0c - x0m), then
 *            guidance rescale (r > 0): x = r x std(x0c) / std(x) + (1 - r) x (unbiased
 *            std over the whole stream); v = (latents - x) / sigma; Euler step;
 *   decode:  video unpacked, mixed with decode noise when the VAE has timestep
 *            conditioning ((1 - dns) z + dns noise, decode_timestep as temb), de-normalised
 *            (z std / sf + mean), the VAE, (x / 2 + 0.5) clamped; audio de-normalised,
 *            unpacked, the audio VAE, the vocoder: the waveform at the vocoder's rate.
 * The output is video with sound: the vocoder's channels as they are (stereo for LTX-2's
 * vocoder; no mixing), its [channels, samples] waveform interleaved into dl_media's
 * [samples, channels].
 * The loop is the shared one (denoise.h) with its multi-pass steps: the latents it
 * steps are both streams, [Nv Cin video | Na Cain audio]; the four guidance passes are
 * passes 0..3 (cond, uncond on the negative prompt, STG, modality-isolated), each a
 * transformer forward of both streams (the loop's eval_pass), and the x0-space combination,
 * rescale and Euler update above are the host's combine callback. So the passes run
 * on every rank of a parallel replica (the transformer split by tp / cp; with cfg=2
 * the passes of a step alternate between the two groups: cond and STG on the host's,
 * uncond and modality on the other), and step caching is the loop's: each pass's raw
 * output (video and audio velocities as one vector) is cached, estimated before the
 * x0-space combination, so the guidance, rescale and Euler step run every step on
 * fresh latents. One decision per step for every pass and both streams (a step is a
 * whole transformer sweep or none); the probe (dl_ltx2_probe, the "probe" program)
 * scores the video latents at t once per step, shared by every pass.
 * The settings __call__ takes that a request has no field for come from the folder's
 * difflet.json `defaults` (keys named as __call__'s arguments), else __call__'s defaults:
 * stg_scale 1, modality_scale 3, guidance_rescale 0.7, audio_guidance_scale 7,
 * audio_stg_scale 1, audio_modality_scale 3, audio_guidance_rescale 0.7 (an audio value
 * of 0 takes the video one, as `audio_x or x` does), spatio_temporal_guidance_blocks
 * [28], decode_timestep 0, decode_noise_scale (decode_timestep), fps (frame_rate) 24,
 * max_sequence_length 1024. guidance_scale is the request's. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "difflet/denoise.h"
#include "difflet/gemma3.h"
#include "difflet/ltx2.h"
#include "difflet/ltx2_audio.h"
#include "difflet/ltx2_vae.h"
#include "difflet/pipeline.h"
#include "difflet/program.h"
#include "difflet/registry.h"
#include "difflet/text.h"

enum { C_TEXT = 0, C_CONN, C_VAE, C_AVAE, C_VOC, C_PROBE, C_TRANSFORMER, NCOMP };
static const char *const k_lt_components[NCOMP] = {"text_encoder", "connectors", "vae", "audio_vae", "vocoder",
                                                   "probe", "transformer"};
static const char *const k_lt_folders[NCOMP] = {"text_encoder", "connectors", "vae", "audio_vae", "vocoder",
                                                "transformer", "transformer"};
enum { MAX_STG = 64 };
enum { P_COND = 0, P_UNCOND, P_STG, P_MOD, NPASS };

typedef struct {
    float stg, mod, rescale; /* per stream; cfg scale: the request's guidance (video) */
    float cfg;
} stream_scales;

typedef struct {
    dl_gen_shape shape;
    dl_model_dir *dir;
    dl_tokenizer *tok;
    dl_gemma3_text *te;
    dl_ltx2_connectors *cn;
    dl_ltx2_vae *vae;
    dl_ltx2_audio_vae *avae;
    dl_ltx2_vocoder *voc;
    dl_ltx2_transformer *tr;
    dl_ltx2_probe *probe;
    dl_flowmatch fm;
    int64_t C, lf, lh, lw, p, pt, Nv, Cin;  /* video latent channels, grid, patches, tokens, features */
    int64_t Ca, La, M, Na, Cain;            /* audio latent channels, frames, mel bins, tokens, features */
    int64_t T, Dv, Da, emb_w;               /* text rows, video / audio text widths, stacked Gemma width */
    int64_t Fo, Ho, Wo, mel_n, melv_n, wch, wlen; /* decoded sizes */
    int ts, ss, frames;
    double fps;
    /* difflet.json / __call__ defaults */
    stream_scales audio_s;
    float stg, mod, rescale, decode_t, decode_ns;
    int stg_blocks[MAX_STG], n_stg;
    /* buffers, made at load */
    float *sigmas, *tsteps;
    float *emb, *tv[2], *ta[2];             /* [T, emb_w]; text [T, Dv] / [T, Da]: 0 prompt, 1 negative */
    float *lat, *alat;                      /* the loop's latents: [Nv, Cin] then [Na, Cain] */
    float *gv, *ga;                         /* the guided x0 of each stream */
    float *z, *video, *mel, *melv, *wave;
    dl_artifact *art[NCOMP];
    char prog_id[NCOMP][17];
    const dl_par_place *par;
    int host;
    dl_denoise *loop;                       /* each pass's output: [Nv Cin video | Na Cain audio] */
} lt_pipe;

static void pipe_free(lt_pipe *p) {
    if (!p) return;
    dl_denoise_free(p->loop);
    dl_tokenizer_free(p->tok);
    dl_gemma3_text_free(p->te), dl_ltx2_connectors_free(p->cn), dl_ltx2_vae_free(p->vae);
    dl_ltx2_audio_vae_free(p->avae), dl_ltx2_vocoder_free(p->voc), dl_ltx2_transformer_free(p->tr);
    dl_ltx2_probe_free(p->probe);
    for (int i = 0; i < NCOMP; i++) dl_artifact_close(p->art[i]);
    dl_model_dir_free(p->dir);
    free(p->sigmas), free(p->tsteps), free(p->emb);
    for (int i = 0; i < 2; i++) free(p->tv[i]), free(p->ta[i]);
    free(p->gv), free(p->ga);
    free(p->z), free(p->video), free(p->mel), free(p->melv), free(p->wave);
    free(p);
}

typedef struct {
    lt_pipe *p;
    int which;
} build_ctx;

static dl_status build_component(void *ctx, dl_wsrc *ws) {
    build_ctx *b = ctx;
    lt_pipe *p = b->p;
    const dl_dtype dt = p->shape.dt;
    const dl_dit_split *sp = p->par ? &p->par->split : NULL;
    if (!ws) { /* release what was built: dl_program_get reloads it from the program just written */
        switch (b->which) {
        case C_TEXT: dl_gemma3_text_free(p->te), p->te = NULL; break;
        case C_CONN: dl_ltx2_connectors_free(p->cn), p->cn = NULL; break;
        case C_VAE: dl_ltx2_vae_free(p->vae), p->vae = NULL; break;
        case C_AVAE: dl_ltx2_audio_vae_free(p->avae), p->avae = NULL; break;
        case C_VOC: dl_ltx2_vocoder_free(p->voc), p->voc = NULL; break;
        case C_PROBE: dl_ltx2_probe_free(p->probe), p->probe = NULL; break;
        default: dl_ltx2_transformer_free(p->tr), p->tr = NULL;
        }
        return DL_OK;
    }
    switch (b->which) {
    case C_TEXT: return dl_gemma3_text_load(&p->te, p->dir, "text_encoder", p->T, dt, ws);
    case C_CONN: return dl_ltx2_connectors_load(&p->cn, p->dir, "connectors", p->T, dt, ws);
    case C_VAE: return dl_ltx2_vae_load(&p->vae, p->dir, "vae", p->lf, p->lh, p->lw, dt, ws);
    case C_AVAE: return dl_ltx2_audio_vae_load(&p->avae, p->dir, "audio_vae", p->La, dt, ws);
    case C_VOC: return dl_ltx2_vocoder_load(&p->voc, p->dir, "vocoder", dl_ltx2_audio_vae_mel_frames(p->avae), dt, ws);
    default: {
        dl_ltx2_transformer_shape sh = {p->lf, p->lh, p->lw, p->La, p->T, p->fps};
        if (b->which == C_PROBE) return dl_ltx2_probe_load_split(&p->probe, p->dir, "transformer", &sh, dt, ws, sp);
        return dl_ltx2_transformer_load_split(&p->tr, p->dir, "transformer", &sh, dt, ws, sp);
    }
    }
}

/* AutoencoderKLLTX2Video's spatial / temporal_compression_ratio (the pipeline's scales):
 * the config's, else patch_size(_t) x 2^(encoder spatio_temporal_scaling set) */
static dl_status vae_scales(lt_pipe *p) {
    const cJSON *v;
    dl_status s = dl_model_dir_config(p->dir, "vae", &v);
    if (s != DL_OK) return s;
    int64_t ps, pst, ss, ts, up = 0;
    if ((s = dl_cfg_int(v, "vae/config.json", "patch_size", 4, &ps)) ||
        (s = dl_cfg_int(v, "vae/config.json", "patch_size_t", 1, &pst)))
        return s;
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(v, "spatio_temporal_scaling");
    if (cJSON_IsArray(st)) {
        const cJSON *e;
        cJSON_ArrayForEach(e, st) up += cJSON_IsTrue(e);
    } else
        up = 4; /* the class default (True, True, True, True) */
    if ((s = dl_cfg_int(v, "vae/config.json", "spatial_compression_ratio", ps << up, &ss)) ||
        (s = dl_cfg_int(v, "vae/config.json", "temporal_compression_ratio", pst << up, &ts)))
        return s;
    if (ss < 1 || ss > 256 || ts < 1 || ts > 256)
        return dl_fail(DL_ERR_FORMAT, "`vae/config.json`: compression ratios %lld (spatial), %lld (temporal) out of range",
                       (long long)ss, (long long)ts);
    p->ss = (int)ss, p->ts = (int)ts;
    return DL_OK;
}

/* difflet.json's guidance settings (see the top of the file) */
static dl_status settings_load(lt_pipe *p, const char *model_dir) {
    const char *d = model_dir;
    p->stg = (float)dl_model_default_num(d, "stg_scale", 0, 1000, 1.0);
    p->mod = (float)dl_model_default_num(d, "modality_scale", 0, 1000, 3.0);
    p->rescale = (float)dl_model_default_num(d, "guidance_rescale", 0, 1, 0.7);
    /* `audio_x or x`: 0 takes the video value */
    p->audio_s.cfg = (float)dl_model_default_num(d, "audio_guidance_scale", 0, 1000, 7.0);
    p->audio_s.stg = (float)dl_model_default_num(d, "audio_stg_scale", 0, 1000, 1.0);
    p->audio_s.mod = (float)dl_model_default_num(d, "audio_modality_scale", 0, 1000, 3.0);
    p->audio_s.rescale = (float)dl_model_default_num(d, "audio_guidance_rescale", 0, 1, 0.7);
    if (p->audio_s.stg == 0) p->audio_s.stg = p->stg;
    if (p->audio_s.mod == 0) p->audio_s.mod = p->mod;
    if (p->audio_s.rescale == 0) p->audio_s.rescale = p->rescale;
    p->decode_t = (float)dl_model_default_num(d, "decode_timestep", 0, 1000, 0.0);
    p->decode_ns = (float)dl_model_default_num(d, "decode_noise_scale", 0, 1, p->decode_t);
    p->stg_blocks[0] = 28, p->n_stg = 1; /* __call__'s default */
    char path[4096];
    snprintf(path, sizeof path, "%s/difflet.json", model_dir);
    FILE *f = fopen(path, "rb");
    if (!f) return DL_OK;
    fclose(f);
    cJSON *cfg = NULL;
    dl_status s = dl_json_read_object(path, "difflet.json", &cfg);
    if (s != DL_OK) return s;
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(cfg, "defaults"),
                                                       "spatio_temporal_guidance_blocks");
    if (b && !cJSON_IsNull(b)) {
        int n = cJSON_IsArray(b) ? cJSON_GetArraySize(b) : -1, ok = n >= 0 && n <= MAX_STG;
        for (int i = 0; ok && i < n; i++) {
            const cJSON *e = cJSON_GetArrayItem(b, i);
            ok = cJSON_IsNumber(e) && e->valuedouble >= 0 && e->valuedouble <= 4096 && e->valuedouble == (int)e->valuedouble;
            if (ok) p->stg_blocks[i] = (int)e->valuedouble;
        }
        if (!ok) s = dl_fail(DL_ERR_FORMAT, "`difflet.json`: defaults.spatio_temporal_guidance_blocks must be a list of up to %d block indices", MAX_STG);
        p->n_stg = ok ? n : 0;
    } else if (b)
        p->n_stg = 0;
    cJSON_Delete(cfg);
    if (s == DL_OK && (p->stg > 0 || p->audio_s.stg > 0) && p->n_stg == 0)
        s = dl_fail(DL_ERR_FORMAT, "`difflet.json`: STG is on (stg_scale %g, audio_stg_scale %g) but defaults.spatio_temporal_guidance_blocks is empty",
                    p->stg, p->audio_s.stg);
    return s;
}

/* ---- the denoiser: one guidance pass of both streams on this rank's part of the split;
 * cond buf[0] = the video text [T, Dv], buf[1] = the audio text [T, Da]; the latents and
 * each output are [Nv Cin video | Na Cain audio] ---- */
static dl_status den_pass(void *m, int k, const float *lat, const dl_cond *c, float t, float g, float *out) {
    lt_pipe *p = m;
    (void)g;
    const int64_t nv = p->Nv * p->Cin;
    const int stg = k == P_STG;
    dl_ltx2_transformer_input x = {.video = lat, .audio = lat + nv, .text = c->buf[0], .audio_text = c->buf[1],
                                   .video_tokens = p->Nv, .audio_tokens = p->Na, .text_rows = p->T, .timestep = t,
                                   .audio_timestep = t, .sigma = t, .audio_sigma = t, .use_cross_timestep = 1,
                                   .isolate_modalities = k == P_MOD, .stg_blocks = stg ? p->stg_blocks : NULL,
                                   .stg_nblocks = stg ? p->n_stg : 0};
    return dl_ltx2_transformer_run(p->tr, &x, out, out + nv);
}
static dl_status den_eval(void *m, const float *lat, const dl_cond *c, float t, float g, float *out) {
    return den_pass(m, P_COND, lat, c, t, g, out);
}
/* one score per step (slot 0): the probe sees the video latents and t, the same for every pass */
static dl_status den_probe(void *m, int slot, const float *lat, const dl_cond *c, float t, float g, double *score) {
    (void)c, (void)g;
    return dl_ltx2_probe_run(((lt_pipe *)m)->probe, slot, lat, t, score);
}
static void den_probe_reset(void *m) { dl_ltx2_probe_reset(((lt_pipe *)m)->probe); }
static const dl_denoiser_ops lt_denoiser = {den_eval, den_probe, den_probe_reset, NULL, NULL};

/* the host's components must chain: the transformer's sizes against the VAEs', the
 * connectors' and the vocoder's; the decoded sizes */
static dl_status chain_check(lt_pipe *p, const dl_ltx2_transformer_info *in) {
    int64_t cc, cl;
    dl_ltx2_connectors_text_dims(p->cn, &cc, &cl);
    p->C = dl_ltx2_vae_latent_channels(p->vae);
    p->Ca = dl_ltx2_audio_vae_latent_channels(p->avae), p->M = dl_ltx2_audio_vae_latent_mel_bins(p->avae);
    p->emb_w = cc * cl;
    if (in->video_out != p->Cin || p->Cin != p->C * p->pt * p->p * p->p)
        return dl_fail(DL_ERR_FORMAT, "transformer in/out channels %lld/%lld are not the VAE's %lld latent channels x %lld patch values",
                       (long long)p->Cin, (long long)in->video_out, (long long)p->C, (long long)(p->pt * p->p * p->p));
    if (in->audio_out != p->Cain || p->Cain != p->Ca * p->M || p->Na != p->La)
        return dl_fail(DL_ERR_FORMAT, "transformer audio in/out channels %lld/%lld are not the audio VAE's %lld x %lld latent mel values",
                       (long long)p->Cain, (long long)in->audio_out, (long long)p->Ca, (long long)p->M);
    if (dl_ltx2_connectors_video_width(p->cn) != p->Dv || dl_ltx2_connectors_audio_width(p->cn) != p->Da)
        return dl_fail(DL_ERR_FORMAT, "the connectors give %lld / %lld wide text, the transformer takes %lld / %lld",
                       (long long)dl_ltx2_connectors_video_width(p->cn), (long long)dl_ltx2_connectors_audio_width(p->cn),
                       (long long)p->Dv, (long long)p->Da);
    if (dl_ltx2_vocoder_in_channels(p->voc) != dl_ltx2_audio_vae_out_channels(p->avae) * dl_ltx2_audio_vae_mel_bins(p->avae))
        return dl_fail(DL_ERR_FORMAT, "the vocoder takes %lld channels, the audio VAE gives %lld x %lld mel bins",
                       (long long)dl_ltx2_vocoder_in_channels(p->voc), (long long)dl_ltx2_audio_vae_out_channels(p->avae),
                       (long long)dl_ltx2_audio_vae_mel_bins(p->avae));
    if (dl_ltx2_vocoder_out_channels(p->voc) < 1 || dl_ltx2_vocoder_out_channels(p->voc) > 2)
        return dl_fail(DL_ERR_UNSUPPORTED, "the vocoder makes %lld audio channels: difflet's outputs (MP4, WAV) are mono or stereo",
                       (long long)dl_ltx2_vocoder_out_channels(p->voc));
    if (dl_ltx2_vae_video_channels(p->vae) != 3)
        return dl_fail(DL_ERR_FORMAT, "`vae/config.json`: the VAE makes %lld video channels, not RGB",
                       (long long)dl_ltx2_vae_video_channels(p->vae));
    p->Fo = dl_ltx2_vae_frames(p->vae), p->Ho = p->lh * dl_ltx2_vae_scale_spatial(p->vae);
    p->Wo = p->lw * dl_ltx2_vae_scale_spatial(p->vae);
    if (p->Fo != p->frames)
        DL_WARN("LTX-2: %d frames requested, the VAE decodes %lld latent frames into %lld", p->frames, (long long)p->lf,
                (long long)p->Fo);
    p->mel_n = dl_ltx2_audio_vae_out_channels(p->avae) * dl_ltx2_audio_vae_mel_frames(p->avae) * dl_ltx2_audio_vae_mel_bins(p->avae);
    p->melv_n = p->mel_n;
    p->wch = dl_ltx2_vocoder_out_channels(p->voc), p->wlen = dl_ltx2_vocoder_samples(p->voc);
    return DL_OK;
}

static dl_status pipe_load(lt_pipe **out, const char *model_dir, const dl_gen_shape *shape) {
    *out = NULL;
    if (shape->cfg_batch)
        return dl_fail(DL_ERR_UNSUPPORTED, "batched CFG is not built for LTX-2: its guidance passes run one after the "
                                           "other (or alternate between two rank groups with cfg=2)");
    if (shape->par && shape->par->cfg.sp && shape->par->cfg.tp > 1)
        return dl_fail(DL_ERR_UNSUPPORTED, "LTX-2: parallel split refused: sequence parallelism on the TP group (sp) is not "
                                           "supported; split the video tokens with cp");
    lt_pipe *p = calloc(1, sizeof *p);
    if (!p) return dl_fail(DL_ERR_NOMEM, "out of memory");
    p->shape = *shape;
    p->par = shape->par;
    p->host = !p->par || dl_comm_rank(p->par->replica_comm) == 0;
    char path[4096];
    dl_status s = dl_model_dir_open(&p->dir, model_dir);
    if (s != DL_OK) goto fail;
    if (strcmp(dl_model_dir_class(p->dir), "LTX2Pipeline")) {
        s = dl_fail(DL_ERR_UNSUPPORTED, "`%s`: pipeline %s is not an LTX2Pipeline", model_dir, dl_model_dir_class(p->dir));
        goto fail;
    }
    if (!p->shape.max_sequence_length)
        p->shape.max_sequence_length = (int)dl_model_default_int(model_dir, "max_sequence_length", 1, 8192, 1024);
    if (p->shape.max_sequence_length < 1 || p->shape.max_sequence_length > 8192) {
        s = dl_fail(DL_ERR_INVALID, "max_sequence_length must be in 1..8192, got %d", p->shape.max_sequence_length);
        goto fail;
    }
    p->T = p->shape.max_sequence_length;
    p->fps = dl_model_default_num(model_dir, "fps", 1e-3, 1000, 24.0);
    if ((s = vae_scales(p)) || (s = settings_load(p, model_dir))) goto fail;
    /* check_inputs: multiples of 32; and of the VAE's scale, so the video is the size asked */
    if (shape->width <= 0 || shape->height <= 0 || shape->width % 32 || shape->height % 32 || shape->width > 8192 ||
        shape->height > 8192 || shape->width % p->ss || shape->height % p->ss) {
        s = dl_fail(DL_ERR_INVALID, "size %dx%d: width and height must be positive multiples of 32 (and of the VAE's %dx) up to 8192",
                    shape->width, shape->height, p->ss);
        goto fail;
    }
    p->frames = shape->frames;
    if (p->frames < 1 || p->frames > 100000) {
        s = dl_fail(DL_ERR_INVALID, "frames must be in 1..100000, got %d", p->frames);
        goto fail;
    }
    p->lf = (p->frames - 1) / p->ts + 1, p->lh = shape->height / p->ss, p->lw = shape->width / p->ss;
    {   /* the transformer's patches */
        const cJSON *c;
        if ((s = dl_model_dir_config(p->dir, "transformer", &c)) ||
            (s = dl_cfg_int(c, "transformer/config.json", "patch_size", 1, &p->p)) ||
            (s = dl_cfg_int(c, "transformer/config.json", "patch_size_t", 1, &p->pt)))
            goto fail;
        if (p->p < 1 || p->pt < 1 || p->lf % p->pt || p->lh % p->p || p->lw % p->p) {
            s = dl_fail(DL_ERR_INVALID, "latent grid %lldx%lldx%lld is not a multiple of the transformer's patches %lldx%lldx%lld",
                        (long long)p->lf, (long long)p->lh, (long long)p->lw, (long long)p->pt, (long long)p->p, (long long)p->p);
            goto fail;
        }
        int64_t sr, hop; /* audio_num_frames = round(frames / frame_rate x sample_rate / hop / 4) */
        if ((s = dl_model_dir_config(p->dir, "audio_vae", &c)) ||
            (s = dl_cfg_int(c, "audio_vae/config.json", "sample_rate", 16000, &sr)) ||
            (s = dl_cfg_int(c, "audio_vae/config.json", "mel_hop_length", 160, &hop)))
            goto fail;
        if (sr < 1 || hop < 1) {
            s = dl_fail(DL_ERR_FORMAT, "`audio_vae/config.json`: sample_rate and mel_hop_length must be positive");
            goto fail;
        }
        p->La = (int64_t)rint((double)p->frames / p->fps * ((double)sr / (double)hop / 4.0)); /* Python's round: half to even */
        if (p->La < 1) {
            s = dl_fail(DL_ERR_INVALID, "%d frames at %g fps make no audio latent frame", p->frames, p->fps);
            goto fail;
        }
    }
    if (p->host) { /* the host alone encodes and decodes; every rank runs the transformer and the probe */
        snprintf(path, sizeof path, "%s/tokenizer", model_dir);
        if ((s = dl_tokenizer_load(&p->tok, path))) goto fail;
    }
    for (int c = p->host ? 0 : C_PROBE; c < NCOMP && s == DL_OK; c++) {
        char shp[256];
        if (c == C_TEXT || c == C_CONN) snprintf(shp, sizeof shp, "{\"seq\":%lld}", (long long)p->T);
        else if (c == C_VAE)
            snprintf(shp, sizeof shp, "{\"frames\":%lld,\"height\":%lld,\"width\":%lld}", (long long)p->lf, (long long)p->lh,
                     (long long)p->lw);
        else if (c == C_AVAE || c == C_VOC) snprintf(shp, sizeof shp, "{\"audio_frames\":%lld}", (long long)p->La);
        else if (c == C_PROBE)
            snprintf(shp, sizeof shp, "{\"frames\":%lld,\"height\":%lld,\"width\":%lld}", (long long)p->lf, (long long)p->lh,
                     (long long)p->lw);
        else
            snprintf(shp, sizeof shp, "{\"audio\":%lld,\"fps\":%.17g,\"frames\":%lld,\"height\":%lld,\"text\":%lld,\"width\":%lld}",
                     (long long)p->La, p->fps, (long long)p->lf, (long long)p->lh, (long long)p->T, (long long)p->lw);
        build_ctx b = {p, c};
        s = dl_pipeline_program(p->dir, k_lt_folders[c], shp, shape, c == C_PROBE, c >= C_PROBE, build_component, &b,
                                &p->art[c], p->prog_id[c]);
    }
    if (s == DL_OK) s = dl_flowmatch_load(p->dir, &p->fm);
    if (s != DL_OK) goto fail;
    const dl_ltx2_transformer_info *in = dl_ltx2_transformer_get_info(p->tr);
    p->Nv = in->video_tokens, p->Cin = in->video_in, p->Na = in->audio_tokens, p->Cain = in->audio_in;
    p->Dv = in->text_width, p->Da = in->audio_text_width;
    if (p->host && (s = chain_check(p, in))) goto fail;
    p->sigmas = malloc((DL_STEPS_MAX + 1) * sizeof(float)), p->tsteps = malloc(DL_STEPS_MAX * sizeof(float));
    int ok = p->sigmas && p->tsteps;
    for (int i = 0; i < 2; i++) {
        p->tv[i] = malloc((size_t)(p->T * p->Dv) * sizeof(float)), p->ta[i] = malloc((size_t)(p->T * p->Da) * sizeof(float));
        ok = ok && p->tv[i] && p->ta[i];
    }
    if (p->host) {
        p->emb = malloc((size_t)(p->T * p->emb_w) * sizeof(float));
        p->z = malloc((size_t)(p->Nv * p->Cin) * sizeof(float));
        p->gv = malloc((size_t)(p->Nv * p->Cin) * sizeof(float)), p->ga = malloc((size_t)(p->Na * p->Cain) * sizeof(float));
        p->video = malloc((size_t)(dl_ltx2_vae_video_channels(p->vae) * p->Fo * p->Ho * p->Wo) * sizeof(float));
        p->mel = malloc((size_t)p->mel_n * sizeof(float)), p->melv = malloc((size_t)p->melv_n * sizeof(float));
        p->wave = malloc((size_t)(p->wch * p->wlen) * sizeof(float));
        ok = ok && p->emb && p->z && p->gv && p->ga && p->video && p->mel && p->melv && p->wave;
    }
    if (!ok) {
        s = dl_fail(DL_ERR_NOMEM, "out of memory");
        goto fail;
    }
    {   /* the loop: both streams' latents, four passes; the prompt and the negative prompt */
        dl_denoiser dn = {&lt_denoiser, p, p->Nv * p->Cin + p->Na * p->Cain, 0};
        dl_cond c0 = {{p->tv[0], p->ta[0]}, {p->T * p->Dv, p->T * p->Da}, 2, p->T};
        dl_cond c1 = {{p->tv[1], p->ta[1]}, {p->T * p->Dv, p->T * p->Da}, 2, p->T};
        if ((s = dl_denoise_new_passes(&p->loop, &dn, NPASS, den_pass, p->par, &c0, &c1))) goto fail;
        p->lat = dl_denoise_latents(p->loop), p->alat = p->lat + p->Nv * p->Cin;
    }
    *out = p;
    return DL_OK;
fail:
    pipe_free(p);
    return s;
}

/* [C, lf, lh, lw] <-> [Nv, C pt p p] (_pack_latents / _unpack_latents) */
static void pack_video(const lt_pipe *p, const float *z, float *tok, int unpack) {
    const int64_t P = p->p, Pt = p->pt, H = p->lh / P, W = p->lw / P, K = p->Cin;
    for (int64_t c = 0; c < p->C; c++)
        for (int64_t f = 0; f < p->lf; f++)
            for (int64_t h = 0; h < p->lh; h++)
                for (int64_t w = 0; w < p->lw; w++) {
                    const int64_t t = ((f / Pt) * H + h / P) * W + w / P;
                    const int64_t j = ((c * Pt + f % Pt) * P + h % P) * P + w % P;
                    const int64_t zi = ((c * p->lf + f) * p->lh + h) * p->lw + w;
                    if (unpack) ((float *)z)[zi] = tok[t * K + j];
                    else tok[t * K + j] = z[zi];
                }
}

/* the initial noise: the request's `latents` / `audio_latents` (normalised as
 * prepare_latents / prepare_audio_latents do), else drawn from the seed */
static dl_status initial_latents(lt_pipe *p, const dl_gen_request *r) {
    const int64_t nv = p->Nv * p->Cin, na = p->Na * p->Cain;
    if (!r->init) {
        dl_randn(r->seed, p->lat, nv);
        dl_randn(r->seed ^ 0x9e3779b97f4a7c15ull, p->alat, na);
        return DL_OK;
    }
    char what[160];
    snprintf(what, sizeof what, "1 x %lld x %lld x %lld x %lld (batch, channels, latent frames, height, width)",
             (long long)p->C, (long long)p->lf, (long long)p->lh, (long long)p->lw);
    dl_status s = dl_pipeline_read_latents(r->init, nv, what, p->z);
    if (s != DL_OK) return s;
    const float *mean = dl_ltx2_vae_latents_mean(p->vae), *std = dl_ltx2_vae_latents_std(p->vae);
    const float sf = dl_ltx2_vae_scaling_factor(p->vae);
    const int64_t per = nv / p->C;
    for (int64_t c = 0; c < p->C; c++)
        for (int64_t i = 0; i < per; i++) p->z[c * per + i] = (p->z[c * per + i] - mean[c]) * sf / std[c];
    pack_video(p, p->z, p->lat, 0);
    const dl_st_tensor *t = dl_ckpt_find(r->init, "audio_latents");
    if (!t || t->numel != na || (t->dtype != DL_ST_F32 && t->dtype != DL_ST_BF16 && t->dtype != DL_ST_F16))
        return dl_fail(DL_ERR_INVALID, "%s: needs a float tensor \"audio_latents\" of 1 x %lld x %lld x %lld values (batch, channels, latent frames, mel bins)",
                       dl_ckpt_label(r->init), (long long)p->Ca, (long long)p->La, (long long)p->M);
    if ((s = dl_ckpt_read(t, DL_F32, p->z))) return s; /* [Ca, La, M] */
    int64_t n;
    const float *am = dl_ltx2_audio_vae_latents_mean(p->avae, &n), *as = dl_ltx2_audio_vae_latents_std(p->avae, &n);
    if (n != p->Cain) return dl_fail(DL_ERR_FORMAT, "the audio VAE's latents_mean has %lld values, not %lld", (long long)n, (long long)p->Cain);
    for (int64_t l = 0; l < p->La; l++) /* pack to [La, Ca M], then normalise */
        for (int64_t c = 0; c < p->Ca; c++)
            for (int64_t m = 0; m < p->M; m++) {
                const int64_t j = c * p->M + m;
                p->alat[l * p->Cain + j] = (p->z[(c * p->La + l) * p->M + m] - am[j]) / as[j];
            }
    return DL_OK;
}

/* torch.std (unbiased) over n values */
static double stdev(const float *x, int64_t n) {
    double m = 0, v = 0;
    for (int64_t i = 0; i < n; i++) m += x[i];
    m /= (double)n;
    for (int64_t i = 0; i < n; i++) v += ((double)x[i] - m) * ((double)x[i] - m);
    return n > 1 ? sqrt(v / (double)(n - 1)) : 0.0;
}

/* One stream's guided step: o[P_*] hold the passes' velocities (those run); lat steps
 * in place. on: which passes ran; sc: the stream's scales. */
static void guide_step(float *lat, float **o, const int *on, const stream_scales *sc, int64_t n, float sigma,
                       float sigma_next, float *g) {
    for (int k = 0; k < NPASS; k++) /* x0 = latents - sigma v */
        if (on[k])
            for (int64_t i = 0; i < n; i++) o[k][i] = lat[i] - o[k][i] * sigma;
    const float *c = o[P_COND];
    const float ws = sc->cfg - 1.f, ss = sc->stg, ms = sc->mod - 1.f;
    for (int64_t i = 0; i < n; i++) {
        const float d = on[P_UNCOND] ? ws * (c[i] - o[P_UNCOND][i]) : 0.f;
        const float e = on[P_STG] ? ss * (c[i] - o[P_STG][i]) : 0.f;
        const float f = on[P_MOD] ? ms * (c[i] - o[P_MOD][i]) : 0.f;
        g[i] = c[i] + d + e + f;
    }
    if (sc->rescale > 0) {
        const float r = (float)(stdev(c, n) / stdev(g, n));
        for (int64_t i = 0; i < n; i++) g[i] = sc->rescale * (g[i] * r) + (1.f - sc->rescale) * g[i];
    }
    const float dt = sigma_next - sigma;
    for (int64_t i = 0; i < n; i++) lat[i] = lat[i] + dt * ((lat[i] - g[i]) / sigma);
}

/* the host's combination of a step's passes (denoise.h's combine): per stream, the
 * x0-space guidance, the rescale and the Euler step of its latents */
typedef struct {
    lt_pipe *p;
    int on[NPASS];            /* the passes that ran (their outputs are in out[k]) */
    stream_scales vs, as;
} lt_combine;

static dl_status combine(void *ctx, int i, float *const *out, float *lat) {
    lt_combine *c = ctx;
    lt_pipe *p = c->p;
    const int64_t nv = p->Nv * p->Cin, na = p->Na * p->Cain;
    float *vo[NPASS], *ao[NPASS];
    for (int k = 0; k < NPASS; k++) vo[k] = out[k], ao[k] = out[k] ? out[k] + nv : NULL;
    guide_step(lat, vo, c->on, &c->vs, nv, p->sigmas[i], p->sigmas[i + 1], p->gv);
    guide_step(lat + nv, ao, c->on, &c->as, na, p->sigmas[i], p->sigmas[i + 1], p->ga);
    return DL_OK;
}

/* The passes a step makes (on[P_*], the transformer forwards) and each stream's scales
 * for a request's guidance, from p's difflet.json settings and the transformer's
 * layer count and perturbed_attn flag. STG changes nothing unless a listed block
 * exists and perturbs: otherwise its pass is the cond pass, and its term (cond - cond)
 * is exactly 0: the pass is left out. */
static void passes_on(const lt_pipe *p, float guidance, int64_t layers, int perturbed, int on[NPASS], stream_scales *vs,
                      stream_scales *as) {
    *vs = (stream_scales){p->stg, p->mod, p->rescale, guidance}, *as = p->audio_s;
    if (as->cfg == 0) as->cfg = guidance; /* `audio_guidance_scale or guidance_scale` */
    int stg_live = 0;
    for (int j = 0; perturbed && j < p->n_stg; j++) stg_live |= p->stg_blocks[j] < layers;
    on[P_COND] = 1;
    on[P_UNCOND] = vs->cfg > 1.f || as->cfg > 1.f;
    on[P_STG] = (vs->stg > 0 || as->stg > 0) && stg_live;
    on[P_MOD] = vs->mod > 1.f || as->mod > 1.f;
}

static dl_status generate(lt_pipe *p, const dl_gen_request *r, dl_media *out, dl_gen_timing *timing, int *ran) {
    dl_gen_timing tm = {.ranks = 1};
    *out = (dl_media){0};
    if (!r->prompt) return dl_fail(DL_ERR_INVALID, "a prompt is required");
    if (r->steps <= 0 || r->steps > DL_STEPS_MAX) return dl_fail(DL_ERR_INVALID, "steps must be in 1..%d, got %d", DL_STEPS_MAX, r->steps);
    if (!isfinite(r->guidance)) return dl_fail(DL_ERR_INVALID, "guidance_scale must be a finite number");
    if (r->fps > 0 && fabs(r->fps - p->fps) > 1e-9 * p->fps)
        return dl_fail(DL_ERR_INVALID, "LTX-2 is loaded for frame_rate %g (RoPE positions and the audio length depend on it); "
                                       "%g fps asked: set `fps` in the model's difflet.json", p->fps, r->fps);
    stream_scales vs, as;
    const dl_ltx2_transformer_info *in = dl_ltx2_transformer_get_info(p->tr);
    lt_combine cc = {.p = p};
    passes_on(p, r->guidance, in->layers, in->perturbed_attn, cc.on, &vs, &as);
    cc.vs = vs, cc.as = as;
    const int cfg = cc.on[P_UNCOND];
    unsigned mask = 0;
    for (int k = 0; k < NPASS; k++) mask |= (unsigned)cc.on[k] << k;
    if (p->par && p->par->cfg.cfg == 2 && __builtin_popcount(mask) < 2)
        return dl_fail(DL_ERR_INVALID, "cfg=2 runs a step's guidance passes on two rank groups, but this request makes one "
                                       "pass per step (guidance_scale 1 and no STG or modality guidance)");
    const double t0_host = dl_now();
    double t0 = t0_host, ts[2] = {0, 0};
    int64_t valid;
    dl_status s = dl_ltx2_text_embeds(p->tok, p->te, p->cn, r->prompt, (int)p->T, p->emb, p->tv[0], p->ta[0], &valid, ts);
    if (s == DL_OK && cfg)
        s = dl_ltx2_text_embeds(p->tok, p->te, p->cn, r->negative_prompt ? r->negative_prompt : "", (int)p->T, p->emb, p->tv[1],
                                p->ta[1], &valid, ts);
    if (s != DL_OK) return s;
    tm.encode_s = dl_now() - t0;
    dl_gen_timing_stage(&tm, "text encoder (Gemma 3)", ts[0]);
    dl_gen_timing_stage(&tm, "text connectors", ts[1]);
    if ((s = dl_flowmatch_sigmas(&p->fm, r->steps, dl_flowmatch_mu(&p->fm, p->Nv), p->sigmas))) return s;
    for (int i = 0; i <= r->steps; i++)
        if (!isfinite(p->sigmas[i])) /* diffusers gives NaN there too: shift_terminal over an all-1 schedule */
            return dl_fail(DL_ERR_INVALID, "LTX-2: the schedule for %lld video tokens (mu %g) is not finite: fewer tokens "
                                           "(a smaller size or fewer frames) are needed", (long long)p->Nv,
                           dl_flowmatch_mu(&p->fm, p->Nv));
    for (int i = 0; i < r->steps; i++) p->tsteps[i] = p->sigmas[i] * (float)p->fm.num_train_timesteps;
    if ((s = initial_latents(p, r))) return s;
    const int64_t nv = p->Nv * p->Cin;
    /* the shared loop: every pass of a step on every rank of the replica; step caching
     * of each pass's [video | audio] velocities, one decision per step */
    dl_denoise_request dr = {.steps = r->steps, .t = p->tsteps, .sigmas = p->sigmas, .text_valid = p->T, .cache = r->cache,
                             .cancel = r->cancel, .on_step = r->on_step, .on_probe = r->on_probe, .ctx = r->ctx,
                             .npass = NPASS, .pass_mask = mask, .pass_cond = {0, 1, 0, 0}, .combine = combine,
                             .combine_ctx = &cc};
    dl_denoise_timing dt;
    *ran = 1;
    if ((s = dl_denoise_run(p->loop, &dr, &dt)) != DL_OK) return s;
    tm.denoise_s = dt.denoise_s, tm.probe_s = dt.probe_s, tm.cached_s = dt.cached_s, tm.comm_s = dt.comm_s;
    tm.denoiser_calls = dt.calls, tm.cached_steps = dt.cached_steps, tm.ranks = dt.ranks;
    t0 = dl_now();
    dl_gen_timing_stage(&tm, "schedule, noise, packing", t0 - t0_host - tm.encode_s - tm.denoise_s);
    dl_gen_timing_stage(&tm, "denoiser", tm.denoise_s);
    /* video: unpack, decode noise, de-normalise, decode */
    pack_video(p, p->z, p->lat, 1);
    float temb = 0.f;
    if (dl_ltx2_vae_timestep_conditioning(p->vae)) {
        temb = p->decode_t;
        if (p->decode_ns != 0) {
            dl_randn(r->seed + 1, p->gv, nv); /* gv: scratch after the loop */
            for (int64_t i = 0; i < nv; i++) p->z[i] = (1.f - p->decode_ns) * p->z[i] + p->decode_ns * p->gv[i];
        }
    }
    const float *mean = dl_ltx2_vae_latents_mean(p->vae), *std = dl_ltx2_vae_latents_std(p->vae);
    const float sf = dl_ltx2_vae_scaling_factor(p->vae);
    const int64_t per = nv / p->C;
    for (int64_t c = 0; c < p->C; c++)
        for (int64_t i = 0; i < per; i++) p->z[c * per + i] = p->z[c * per + i] * std[c] / sf + mean[c];
    if ((s = dl_ltx2_vae_decode(p->vae, p->z, temb, p->video, r->on_decode, r->ctx))) return s;
    double t1 = dl_now();
    dl_gen_timing_stage(&tm, "video VAE decode", t1 - t0);
    /* audio: de-normalise, unpack, decode, vocoder */
    if ((s = dl_ltx2_audio_vae_decode(p->avae, p->alat, p->mel))) return s;
    double t2 = dl_now();
    dl_gen_timing_stage(&tm, "audio VAE decode", t2 - t1);
    dl_ltx2_audio_mel_to_vocoder(p->mel, dl_ltx2_audio_vae_out_channels(p->avae), dl_ltx2_audio_vae_mel_frames(p->avae),
                                 dl_ltx2_audio_vae_mel_bins(p->avae), p->melv);
    if ((s = dl_ltx2_vocoder_run(p->voc, p->melv, p->wave))) return s;
    t1 = dl_now();
    dl_gen_timing_stage(&tm, "vocoder", t1 - t2);
    if ((s = dl_pipeline_media(out, DL_MEDIA_VIDEO_AUDIO, p->video, p->Fo, p->Ho, p->Wo, p->fps, r->want_pixels))) return s;
    if (!(out->audio = malloc((size_t)(p->wch * p->wlen) * sizeof(float)))) {
        dl_media_free(out);
        return dl_fail(DL_ERR_NOMEM, "out of memory");
    }
    for (int64_t c = 0; c < p->wch; c++) /* wave [wch, wlen] -> audio [wlen, wch] */
        for (int64_t i = 0; i < p->wlen; i++) out->audio[i * p->wch + c] = p->wave[c * p->wlen + i];
    out->audio_samples = p->wlen, out->audio_channels = (int)p->wch;
    out->audio_rate = (int)dl_ltx2_vocoder_sample_rate(p->voc);
    tm.decode_s = dl_now() - t0;
    dl_gen_timing_stage(&tm, "output frames and samples", dl_now() - t1);
    if (timing) *timing = tm;
    return DL_OK;
}

/* ---- the registry entry ------------------------------------------------------------ */

/* the transformer's split feasibility (dl_ltx2_split_check) from its config.json,
 * before anything is launched; a size-dependent refusal (more cp ranks than video
 * tokens) comes at load */
static const char *entry_split_check(const char *dir, const dl_par_config *c, char *buf, size_t n) {
    dl_model_dir *md = NULL;
    const cJSON *cfg = NULL;
    if (dl_model_dir_open(&md, dir) != DL_OK || dl_model_dir_config(md, "transformer", &cfg) != DL_OK) {
        snprintf(buf, n, "%s", dl_last_error());
        dl_model_dir_free(md);
        return buf;
    }
    const dl_dit_split sp = {.tp = c->tp, .cp = c->cp, .sp = c->sp, .cp_mode = c->cp_mode};
    const char *why = dl_ltx2_split_check(cfg, &sp, buf, n);
    dl_model_dir_free(md);
    return why;
}

static dl_status entry_load(void **impl, const char *dir, const dl_gen_shape *g) { return pipe_load((lt_pipe **)impl, dir, g); }
static void entry_free(void *impl) { pipe_free(impl); }
static int entry_is_host(const void *impl) { return ((const lt_pipe *)impl)->host; }
static dl_status entry_worker_one(void *impl, int *stopped) { return dl_denoise_worker_one(((lt_pipe *)impl)->loop, stopped); }
static const char *entry_program_id(const void *impl, int c) {
    return c >= 0 && c < NCOMP ? ((const lt_pipe *)impl)->prog_id[c] : "";
}
static dl_status gen_fn(void *impl, const dl_gen_request *r, dl_media *out, dl_gen_timing *tm, int *ran) {
    return generate(impl, r, out, tm, ran);
}
static dl_status entry_generate(void *impl, const dl_gen_request *g, dl_media *out, dl_gen_timing *tm) {
    lt_pipe *p = impl;
    if (p->host && (g->image || g->mask)) { /* refused by name, the request still ends on every rank */
        dl_status s = dl_fail(DL_ERR_UNSUPPORTED, "LTX2Pipeline is text to video: no init image or mask");
        dl_denoise_abandon(p->loop);
        return s;
    }
    return dl_pipeline_host_generate(p, p->host, p->loop, gen_fn, g, out, tm);
}

/* the registry's passes: a step's transformer forwards for this guidance, read from the
 * folder as a load reads it (difflet.json's settings, the transformer's config); 1 when
 * they cannot be read (the load reports why) */
static int entry_passes(const char *model_dir, float guidance, float true_cfg, int negative) {
    (void)true_cfg, (void)negative;
    lt_pipe *p = calloc(1, sizeof *p);
    int n = 1, pert = 0;
    int64_t layers = 0;
    char path[4200];
    cJSON *cfg = NULL;
    snprintf(path, sizeof path, "%s/transformer/config.json", model_dir);
    if (p && settings_load(p, model_dir) == DL_OK && dl_json_read_object(path, "transformer/config.json", &cfg) == DL_OK &&
        dl_cfg_int(cfg, "transformer/config.json", "num_layers", 48, &layers) == DL_OK &&
        dl_cfg_bool(cfg, "transformer/config.json", "perturbed_attn", 0, &pert) == DL_OK) {
        int on[NPASS];
        stream_scales vs, as;
        passes_on(p, guidance, layers, pert, on, &vs, &as);
        n = on[P_COND] + on[P_UNCOND] + on[P_STG] + on[P_MOD];
    }
    cJSON_Delete(cfg);
    free(p);
    return n;
}

const dl_model_entry dl_ltx2_entry = {
    .pipeline_class = "LTX2Pipeline",
    .output = DL_MEDIA_VIDEO_AUDIO,
    .default_steps = 30,
    .default_guidance = 3.0f,
    .default_true_cfg = 0.0f,
    .default_fps = 24.0,
    .guidance_cfg = 1,
    .components = k_lt_components,
    .ncomponents = NCOMP,
    .default_width = 768, /* LTX2Pipeline's __call__: 768 x 512, 121 frames (no duration head) */
    .default_height = 512,
    .default_frames = 121,
    .split_check = entry_split_check,
    .passes = entry_passes,
    .load = entry_load,
    .free = entry_free,
    .is_host = entry_is_host,
    .worker_one = entry_worker_one,
    .generate = entry_generate,
    .program_id = entry_program_id,
};
