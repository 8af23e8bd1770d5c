/* `difflet bench ltx2-step`: one denoiser forward of an LTX-2-width audio-video
 * transformer with ONE block (the LTX-2.0 configuration diffusers' conversion writes:
 * video 32 heads x 128 = 4096, audio 32 x 64 = 2048, cross_attention_dim 4096 / 2048,
 * caption_channels 3840 with the caption projections, 128 video and 128 audio latent
 * channels, patch 1, "split" RoPE, no gated attention or prompt modulation; random bf16
 * weights) on the paper's 2.3k-token workload: 41 frames at 512 x 768 and 24 fps (the
 * pipeline's default size and rate), a latent grid of 6 x 16 x 24 = 2,304 video tokens,
 * plus the audio of the same clip, round(41 / 24 s x 16000 / 160 / 4 per s) = 43 audio
 * tokens (2,347 tokens in all), and 1,024 text rows in each stream (the pipeline's
 * max_sequence_length; every row attended, as the connectors' mask is all ones).
 * diffusers' LTX2VideoTransformer3DModel (num_layers=1, the same weights and inputs,
 * torch CPU, the same dtype and thread count; needs the tools virtualenv) is called as
 * LTX2Pipeline calls it: timestep = sigma = t for both streams, use_cross_timestep on,
 * the connectors' all-ones mask, the RoPE coordinates made once. The dtype is the
 * engine's default on this CPU (bf16 with AVX512_BF16, else f32) or --dtype, as
 * hunyuan-step chooses.
 *
 * difflet keeps what a pass computes from its text alone (the caption projections and
 * the text cross-attention's K / V) for the next passes of that text (the transformer's
 * text cache); diffusers computes them at every pass. Each round times a text's first
 * pass (the cache emptied) and a pass with the text cached; the step is the latter, as
 * every pass of a request but the first of each text; a 40-step request's average pass
 * is reported too. With ONE block the caption projections (once per model, not per
 * block) weigh more than in a 48-block LTX-2: the text K / V alone are ~6 % of a block.
 *
 * Reports the step-time ratio, difflet's effective GFLOP/s (the step's useful FLOPs,
 * step_flops below, less the text's own on a cached pass) as a fraction of a same-run matmul (difflet's: OpenBLAS or oneDNN) in that dtype at the
 * video feed-forward's shape, the attention share (the block's six attentions called
 * standalone after the step in the shapes and layouts the model uses: the transformer
 * has no phase clock), each stream's output difference, peak RSS, and (--json) the
 * machine. --quick: latent 2 x 16 x 16 (9 frames at 512 x 512: 512 video tokens, 9
 * audio tokens), 128 text rows, the same widths. DIFFLET_BENCH_PEER=off skips the
 * peer. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "difflet/check.h"
#include "difflet/io.h"
#include "difflet/ltx2.h"
#include "difflet/registry.h"
#include "difflet/request.h"

#ifndef DIFFLET_SOURCE_DIR
#define DIFFLET_SOURCE_DIR "."
#endif

typedef struct {
    int64_t H, Dh, Ha, Dha; /* video heads x head dim, audio heads x head dim */
    int64_t C, Cin, Ca;     /* caption_channels, video / audio latent channels (in = out) */
    int64_t lat[3];         /* latent grid (F, H, W); patch 1 */
    int64_t frames;         /* pixel frames: (F - 1) x 8 + 1 */
    int64_t Na, T;          /* audio latent frames, text rows */
    double fps;
} lx_cfg;

static int64_t video_tokens(const lx_cfg *c) { return c->lat[0] * c->lat[1] * c->lat[2]; }

/* LTX2Pipeline's audio_num_frames: round(num_frames / frame_rate x sampling_rate /
 * hop_length / the audio VAE's temporal compression), Python's round (half to even) */
static int64_t audio_frames(int64_t frames, double fps) {
    return (int64_t)nearbyint((double)frames / fps * (16000.0 / 160.0 / 4.0));
}

/* ---- a resident request, stage by stage ----------------------------------------------
 * The tiny LTX-2 pipeline of the tests (tests/data/ltx2/pipe, diffusers layout, random
 * weights) loaded once, as a server's model process holds it; requests at its own
 * defaults (size, frames, steps, guidance), each stage's seconds as the pipeline times
 * them plus the MP4 encode (H.264 + AAC); the request with the least total of 1 + reps
 * (the first warms up). Programs are compiled into cache (a folder of the bench's). */
static void resident_stages(const char *cache, int reps, dl_dtype dt, cJSON *root) {
    char model[4200], out[4300];
    snprintf(model, sizeof model, "%s/tests/data/ltx2/pipe", DIFFLET_SOURCE_DIR);
    snprintf(out, sizeof out, "%s/resident.mp4", cache);
    const dl_model_entry *e;
    dl_pipeline *p = NULL;
    dl_request rq;
    dl_request_init(&rq);
    if (dl_registry_lookup(model, &e) != DL_OK) {
        printf("  resident request: not measured (%s)\n", dl_last_error());
        return;
    }
    dl_model_defaults md;
    int w, h, f;
    dl_registry_defaults(e, model, &md);
    dl_registry_default_shape(e, model, &w, &h, &f);
    const dl_gen_shape shape = {.width = w, .height = h, .frames = f, .dt = dt};
    const char *had = getenv("DIFFLET_CACHE");
    char *keep = had ? strdup(had) : NULL;
    setenv("DIFFLET_CACHE", cache, 1);
    rq.steps = md.steps, rq.guidance = md.guidance, rq.seed = 1;
    dl_gen_timing best = {0}, tm;
    double best_total = INFINITY, best_mp4 = 0;
    if (dl_mkdir_p(cache) != DL_OK || dl_pipeline_load(&p, model, &shape) != DL_OK ||
        dl_request_set_prompt(&rq, "a red ball bounces on a wooden floor, with a thud", "blurry, silent") != DL_OK) {
        printf("  resident request: not measured (%s)\n", dl_last_error());
        goto done;
    }
    for (int i = 0; i < 1 + reps; i++) {
        dl_gen_request r;
        dl_media media;
        dl_gen_request_from(&r, &rq);
        const double t0 = dl_now();
        if (dl_pipeline_generate(p, &r, &media, &tm) != DL_OK) {
            printf("  resident request: failed (%s)\n", dl_last_error());
            goto done;
        }
        const double t1 = dl_now();
        dl_status s = dl_mp4_write(out, &media);
        const double t2 = dl_now();
        dl_media_free(&media);
        if (s != DL_OK) {
            printf("  resident request: the MP4 failed (%s)\n", dl_last_error());
            goto done;
        }
        if (i > 0 && t2 - t0 < best_total) best = tm, best_total = t2 - t0, best_mp4 = t2 - t1;
    }
    if (!best.nstages) {
        printf("  resident request: the pipeline reports no stages\n");
        goto done;
    }
    dl_gen_timing_stage(&best, "MP4 encode (H.264 + AAC)", best_mp4);
    double den = 0;
    cJSON *j = cJSON_AddObjectToObject(root, "resident_request"), *st = cJSON_AddObjectToObject(j, "stages_s");
    printf("  resident request of the tiny LTX-2 (tests/data/ltx2/pipe: %dx%d, %d frames, %d steps, guidance %g;\n"
           "            %d transformer passes), best of %d: %.3f s, stage by stage:\n",
           w, h, f, rq.steps, rq.guidance, best.denoiser_calls, reps, best_total);
    for (int k = 0; k < best.nstages; k++) {
        printf("            %-28s %8.4f s %5.1f%%\n", best.stage[k].name, best.stage[k].s, 100 * best.stage[k].s / best_total);
        cJSON_AddNumberToObject(st, best.stage[k].name, best.stage[k].s);
        if (!strcmp(best.stage[k].name, "denoiser")) den = best.stage[k].s;
    }
    printf("            outside the denoiser: %.1f%% of the request\n", 100 * (1 - den / best_total));
    cJSON_AddNumberToObject(j, "total_s", best_total);
    cJSON_AddNumberToObject(j, "outside_denoiser_share", 1 - den / best_total);
    cJSON_AddNumberToObject(j, "steps", rq.steps);
    cJSON_AddNumberToObject(j, "transformer_passes", best.denoiser_calls);
done:
    dl_request_free(&rq);
    dl_pipeline_free(p);
    if (keep) setenv("DIFFLET_CACHE", keep, 1);
    else unsetenv("DIFFLET_CACHE");
    free(keep);
}

/* ---- the random-weight folder ----------------------------------------------------- */

/* LTX2Attention `<p>`: inner width W from dq-wide queries and dk-wide keys / values,
 * out to dout */
static void put_attn(bench_wgen *g, const char *p, int64_t W, int64_t dq, int64_t dk, int64_t dout) {
    bench_put_lin(g, p, "to_q", W, dq);
    bench_put_lin(g, p, "to_k", W, dk);
    bench_put_lin(g, p, "to_v", W, dk);
    bench_put_lin(g, p, "to_out.0", dout, W);
    bench_put_vec(g, p, "norm_q.weight", W);
    bench_put_vec(g, p, "norm_k.weight", W);
}

/* LTX2AdaLayerNormSingle `<p>` of width d and n modulation vectors */
static void put_adaln(bench_wgen *g, const char *p, int64_t d, int64_t n) {
    bench_put_lin(g, p, "emb.timestep_embedder.linear_1", d, 256);
    bench_put_lin(g, p, "emb.timestep_embedder.linear_2", d, d);
    bench_put_lin(g, p, "linear", n * d, d);
}

/* The folder as diffusers' LTX2VideoTransformer3DModel.save_pretrained writes it for
 * this config (the names and shapes of its state_dict). */
static dl_status make_model(const char *dir, const lx_cfg *c) {
    char path[4200], cfg[1024];
    snprintf(path, sizeof path, "%s/transformer", dir);
    dl_status s = dl_mkdir_p(path);
    if (s != DL_OK) return s;
    snprintf(path, sizeof path, "%s/model_index.json", dir);
    if ((s = bench_write_text(path, "{\"_class_name\": \"LTX2Pipeline\", \"transformer\": [\"diffusers\", "
                                    "\"LTX2VideoTransformer3DModel\"]}")) != DL_OK)
        return s;
    const int64_t D = c->H * c->Dh, Da = c->Ha * c->Dha;
    snprintf(cfg, sizeof cfg,
             "{\"_class_name\": \"LTX2VideoTransformer3DModel\", \"in_channels\": %lld, \"out_channels\": %lld, "
             "\"patch_size\": 1, \"patch_size_t\": 1, \"num_attention_heads\": %lld, \"attention_head_dim\": %lld, "
             "\"cross_attention_dim\": %lld, \"audio_in_channels\": %lld, \"audio_out_channels\": %lld, "
             "\"audio_num_attention_heads\": %lld, \"audio_attention_head_dim\": %lld, \"audio_cross_attention_dim\": %lld, "
             "\"num_layers\": 1, \"caption_channels\": %lld, \"rope_type\": \"split\", \"rope_double_precision\": true, "
             "\"use_prompt_embeddings\": true, \"gated_attn\": false, \"cross_attn_mod\": false, "
             "\"audio_gated_attn\": false, \"audio_cross_attn_mod\": false, \"perturbed_attn\": false}",
             (long long)c->Cin, (long long)c->Cin, (long long)c->H, (long long)c->Dh, (long long)D, (long long)c->Ca,
             (long long)c->Ca, (long long)c->Ha, (long long)c->Dha, (long long)Da, (long long)c->C);
    snprintf(path, sizeof path, "%s/transformer/config.json", dir);
    if ((s = bench_write_text(path, cfg)) != DL_OK) return s;
    bench_wgen g;
    bench_wgen_init(&g, 200);
    /* inputs, outputs, caption projections */
    bench_put_lin(&g, "", "proj_in", D, c->Cin);
    bench_put_lin(&g, "", "audio_proj_in", Da, c->Ca);
    bench_put_lin(&g, "", "caption_projection.linear_1", D, c->C);
    bench_put_lin(&g, "", "caption_projection.linear_2", D, D);
    bench_put_lin(&g, "", "audio_caption_projection.linear_1", Da, c->C);
    bench_put_lin(&g, "", "audio_caption_projection.linear_2", Da, Da);
    bench_put_lin(&g, "", "proj_out", c->Cin, D);
    bench_put_lin(&g, "", "audio_proj_out", c->Ca, Da);
    const int64_t so[2] = {2, D}, sao[2] = {2, Da};
    bench_put(&g, "scale_shift_table", 2, so);
    bench_put(&g, "audio_scale_shift_table", 2, sao);
    /* the timestep embeddings */
    put_adaln(&g, "time_embed.", D, 6);
    put_adaln(&g, "audio_time_embed.", Da, 6);
    put_adaln(&g, "av_cross_attn_video_scale_shift.", D, 4);
    put_adaln(&g, "av_cross_attn_audio_scale_shift.", Da, 4);
    put_adaln(&g, "av_cross_attn_video_a2v_gate.", D, 1);
    put_adaln(&g, "av_cross_attn_audio_v2a_gate.", Da, 1);
    /* the block */
    const char *b = "transformer_blocks.0.";
    char p[128];
#define AT(name, W, dq, dk, dout) (snprintf(p, sizeof p, "%s%s.", b, name), put_attn(&g, p, W, dq, dk, dout))
    AT("attn1", D, D, D, D);
    AT("audio_attn1", Da, Da, Da, Da);
    AT("attn2", D, D, D, D);
    AT("audio_attn2", Da, Da, Da, Da);
    AT("audio_to_video_attn", Da, D, Da, D);
    AT("video_to_audio_attn", Da, Da, D, Da);
#undef AT
    bench_put_lin(&g, b, "ff.net.0.proj", 4 * D, D);
    bench_put_lin(&g, b, "ff.net.2", D, 4 * D);
    bench_put_lin(&g, b, "audio_ff.net.0.proj", 4 * Da, Da);
    bench_put_lin(&g, b, "audio_ff.net.2", Da, 4 * Da);
    const int64_t t6[2] = {6, D}, ta6[2] = {6, Da}, t5[2] = {5, D}, ta5[2] = {5, Da};
    snprintf(p, sizeof p, "%sscale_shift_table", b);
    bench_put(&g, p, 2, t6);
    snprintf(p, sizeof p, "%saudio_scale_shift_table", b);
    bench_put(&g, p, 2, ta6);
    snprintf(p, sizeof p, "%svideo_a2v_cross_attn_scale_shift_table", b);
    bench_put(&g, p, 2, t5);
    snprintf(p, sizeof p, "%saudio_a2v_cross_attn_scale_shift_table", b);
    bench_put(&g, p, 2, ta5);
    snprintf(path, sizeof path, "%s/transformer/diffusion_pytorch_model.safetensors", dir);
    return bench_wgen_save(&g, path);
}

/* ---- measuring ------------------------------------------------------------------- */

/* FLOPs of one forward (2 per multiply-add): every linear 2 M K N (proj_in / out, the
 * caption projections, the six timestep embeddings, each attention's q, k, v and out,
 * the feed-forwards) and attention 4 Sq Sk W (W the attention's inner width): video
 * self Nv x Nv (4096), audio self Na x Na (2048), text cross Nv x T / Na x T, a2v
 * Nv x Na and v2a Na x Nv (2048 both). *attn: the six attentions. */
static double step_flops(const lx_cfg *c, double *attn, double *per_text) {
    const double D = (double)(c->H * c->Dh), Da = (double)(c->Ha * c->Dha), Nv = (double)video_tokens(c);
    const double Na = (double)c->Na, T = (double)c->T, C = (double)c->C, Cin = (double)c->Cin, Ca = (double)c->Ca;
    const double io = 2 * Nv * Cin * D * 2 + 2 * Na * Ca * Da * 2;                      /* proj_in, proj_out */
    const double cap = 2 * T * (C * D + D * D) + 2 * T * (C * Da + Da * Da);             /* caption projections */
    const double emb = 2 * (256 * D + D * D) * 3 + 2 * (256 * Da + Da * Da) * 3          /* timestep MLPs */
                       + 2 * D * D * (6 + 4 + 1) + 2 * Da * Da * (6 + 4 + 1);            /* their linears */
    const double self = 2 * Nv * D * 4 * D + 2 * Na * Da * 4 * Da;                      /* qkv, out */
    const double text = 2 * Nv * D * 2 * D + 2 * T * D * 2 * D + 2 * Na * Da * 2 * Da + 2 * T * Da * 2 * Da;
    const double a2v = 2 * Nv * D * Da * 2 + 2 * Na * Da * 2 * Da;                       /* q, out; k, v */
    const double v2a = 2 * Na * Da * Da * 2 + 2 * Nv * D * 2 * Da;
    const double ff = 2 * Nv * D * 4 * D * 2 + 2 * Na * Da * 4 * Da * 2;
    *attn = 4 * (Nv * Nv * D + Na * Na * Da + Nv * T * D + Na * T * Da + 2 * Nv * Na * Da);
    *per_text = cap + 2 * T * D * 2 * D + 2 * T * Da * 2 * Da; /* what the text cache skips: captions, text K / V */
    return io + cap + emb + self + text + a2v + v2a + ff + *attn;
}

/* Seconds of one attention of sq queries over sk keys (heads x dh, inner W) in dt as
 * the transformer lays it out: self, one fused [sq, 3W] qkv buffer; cross, q [sq, W]
 * and kv [sk, 2W]. Best of 2; NAN when out of memory or the kernel fails. */
static double attn_seconds(int self, int64_t sq, int64_t sk, int64_t heads, int64_t dh, dl_dtype dt) {
    const int64_t W = heads * dh, qs = self ? 3 * W : W, ks = self ? 3 * W : 2 * W;
    const size_t es = dl_dtype_size(dt);
    char *q = malloc((size_t)(sq * qs) * es), *kv = self ? q : malloc((size_t)(sk * ks) * es);
    void *out = malloc((size_t)(sq * W) * es);
    double best = NAN;
    if (q && kv && out) {
        dl_fill_uniform(dt, q, sq * qs, -1.f, 1.f, 11);
        if (!self) dl_fill_uniform(dt, kv, sk * ks, -1.f, 1.f, 12);
        const char *k = self ? q + (size_t)W * es : kv, *v = k + (size_t)W * es;
        dl_attn_args a = {.dt = dt, .sq = sq, .sk = sk, .heads = heads, .head_dim = dh, .q = q, .k = k, .v = v,
                          .q_stride = qs, .k_stride = ks, .v_stride = ks, .out = out, .out_stride = W, .kv_begin = 0,
                          .kv_end = sk, .scale = 1.f / sqrtf((float)dh)};
        best = INFINITY;
        for (int i = 0; i < 2; i++) {
            double t0 = dl_now();
            if (dl_attn(&a, NULL) != DL_OK) {
                best = NAN;
                break;
            }
            if (dl_now() - t0 < best) best = dl_now() - t0;
        }
    }
    if (kv != q) free(kv);
    free(q), free(out);
    return best;
}

/* max |a - b| / max |b| of each stream, b the peer's `out` [nv + na, w] at path (video
 * rows first) and a difflet's in the same layout; NAN when unreadable */
static void stream_rel_diff(const char *path, const float *a, int64_t nv, int64_t na, int64_t w, double rel[2]) {
    dl_checkpoint *ck;
    rel[0] = rel[1] = NAN;
    if (dl_ckpt_open(&ck, path, NULL) != DL_OK) return;
    const int64_t n = (nv + na) * w;
    const dl_st_tensor *t = dl_ckpt_find(ck, "out");
    float *b = t && t->numel == n ? malloc((size_t)n * 4) : NULL;
    if (b && dl_ckpt_read(t, DL_F32, b) == DL_OK) {
        for (int s = 0; s < 2; s++) {
            const int64_t i0 = s ? nv * w : 0, i1 = s ? n : nv * w;
            double e = 0, mx = 0;
            for (int64_t i = i0; i < i1; i++) {
                e = fmax(e, fabs((double)a[i] - b[i]));
                mx = fmax(mx, fabs((double)b[i]));
            }
            rel[s] = e / mx;
        }
    }
    free(b);
    dl_ckpt_free(ck);
}

int cli_bench_ltx2(int argc, char **argv) {
    const char *json_path = NULL;
    int quick = 0;
    dl_dtype dt;
    if (!bench_opts(argc, argv, "ltx2-step", &json_path, &quick, &dt)) return 2;
    lx_cfg c = {.H = 32, .Dh = 128, .Ha = 32, .Dha = 64, .C = 3840, .Cin = 128, .Ca = 128, .lat = {6, 16, 24}, .T = 1024,
                .fps = 24.0};
    int reps = 2, warm = 1;
    if (quick) c.lat[0] = 2, c.lat[2] = 16, c.T = 128, reps = 1, warm = 0; /* tests: seconds */
    c.frames = (c.lat[0] - 1) * 8 + 1;
    c.Na = audio_frames(c.frames, c.fps);
    const int64_t Nv = video_tokens(&c), D = c.H * c.Dh, Da = c.Ha * c.Dha, nout = (Nv + c.Na) * c.Cin;
    char dir[] = "/tmp/difflet-bench-ltx2-XXXXXX", path[4200];
    if (!mkdtemp(dir)) {
        fprintf(stderr, "difflet: bench: cannot create a temporary folder\n");
        return 1;
    }
    int rc = 1;
    float *vid = malloc((size_t)(Nv * c.Cin) * 4), *aud = malloc((size_t)(c.Na * c.Ca) * 4);
    float *txt = malloc((size_t)(c.T * c.C) * 4), *atxt = malloc((size_t)(c.T * c.C) * 4);
    float *out = malloc((size_t)nout * 4); /* [Nv + Na, 128]: video rows, then audio rows */
    cJSON *root = cJSON_CreateObject(), *pj = NULL;
    dl_model_dir *md = NULL;
    dl_ltx2_transformer *m = NULL;
    printf("difflet bench ltx2-step: LTX-2 width (video %lld heads x %lld = %lld, audio %lld x %lld = %lld,\n"
           "  caption_channels %lld), 1 block, %lld frames at %lld x %lld, %g fps: latent %lld x %lld x %lld =\n"
           "  %lld video tokens + %lld audio tokens (%lld in all) + %lld text rows per stream, %s, %d threads\n"
           "  on %s: kernels %s, matmul %s (oneDNN %s)\n",
           (long long)c.H, (long long)c.Dh, (long long)D, (long long)c.Ha, (long long)c.Dha, (long long)Da,
           (long long)c.C, (long long)c.frames, (long long)(c.lat[1] * 32), (long long)(c.lat[2] * 32), c.fps,
           (long long)c.lat[0], (long long)c.lat[1], (long long)c.lat[2], (long long)Nv, (long long)c.Na,
           (long long)(Nv + c.Na), (long long)c.T, dl_dtype_name(dt), dl_threads(), dl_cpu_model(),
           dl_isa_name(dl_kernel_isa()), dl_onednn_isa(), dl_onednn_version());
    bench_machine_json(root);
    cJSON_AddStringToObject(root, "dtype", dl_dtype_name(dt));
    cJSON_AddNumberToObject(root, "video_tokens", (double)Nv);
    cJSON_AddNumberToObject(root, "audio_tokens", (double)c.Na);
    cJSON_AddNumberToObject(root, "text_rows", (double)c.T);
    cJSON_AddNumberToObject(root, "frames", (double)c.frames);
    cJSON_AddNumberToObject(root, "fps", c.fps);
    cJSON_AddNumberToObject(root, "blocks", 1);
    cJSON_AddNumberToObject(root, "timed_runs", reps);
    cJSON_AddNumberToObject(root, "warmup_runs", warm);
    {
        dl_attn_args pv = {.dt = dt, .sq = Nv, .sk = Nv, .heads = c.H, .head_dim = c.Dh};
        dl_attn_args pa = {.dt = dt, .sq = c.Na, .sk = c.Na, .heads = c.Ha, .head_dim = c.Dha};
        cJSON_AddStringToObject(root, "attention_path", dl_attn_path_name(&pv));
        cJSON_AddStringToObject(root, "audio_attention_path", dl_attn_path_name(&pa));
    }
    fflush(stdout);
    if (!vid || !aud || !txt || !atxt || !out) goto done;
    if (make_model(dir, &c) != DL_OK) {
        fprintf(stderr, "difflet: bench: %s\n", dl_last_error());
        goto done;
    }
    dl_randn(1, vid, Nv * c.Cin);
    dl_randn(2, aud, c.Na * c.Ca);
    dl_fill_uniform(DL_F32, txt, c.T * c.C, -1.f, 1.f, 3);
    dl_fill_uniform(DL_F32, atxt, c.T * c.C, -1.f, 1.f, 4);
    const float ts = 700.f; /* the scheduler's timestep (sigma x 1000), as the pipeline passes it */
    {
        dl_st_writer *w = dl_st_writer_new();
        const int64_t sv[2] = {Nv, c.Cin}, sa[2] = {c.Na, c.Ca}, st[2] = {c.T, c.C}, s5[1] = {5}, s1[1] = {1};
        const float grid[5] = {(float)c.lat[0], (float)c.lat[1], (float)c.lat[2], (float)c.Na, (float)c.fps};
        dl_st_writer_add(w, "video", DL_ST_F32, 2, sv, vid);
        dl_st_writer_add(w, "audio", DL_ST_F32, 2, sa, aud);
        dl_st_writer_add(w, "text", DL_ST_F32, 2, st, txt);
        dl_st_writer_add(w, "audio_text", DL_ST_F32, 2, st, atxt);
        dl_st_writer_add(w, "grid", DL_ST_F32, 1, s5, grid);
        dl_st_writer_add(w, "timestep", DL_ST_F32, 1, s1, &ts);
        snprintf(path, sizeof path, "%s/inputs.safetensors", dir);
        dl_status s = dl_st_writer_save(w, path);
        dl_st_writer_free(w);
        if (s != DL_OK) {
            fprintf(stderr, "difflet: bench: %s\n", dl_last_error());
            goto done;
        }
    }
    /* difflet */
    double rss0, rss_peak;
    const int reset = bench_rss_reset();
    double t0 = dl_now();
    const dl_ltx2_transformer_shape shape = {.frames = c.lat[0], .height = c.lat[1], .width = c.lat[2],
                                             .audio_frames = c.Na, .text_rows = c.T, .fps = c.fps};
    if (dl_model_dir_open(&md, dir) != DL_OK || dl_ltx2_transformer_load(&m, md, "transformer", &shape, dt, NULL) != DL_OK) {
        fprintf(stderr, "difflet: bench: %s\n", dl_last_error());
        goto done;
    }
    const dl_ltx2_transformer_input in = {.video = vid, .audio = aud, .text = txt, .audio_text = atxt,
                                          .video_tokens = Nv, .audio_tokens = c.Na, .text_rows = c.T,
                                          .timestep = ts, .audio_timestep = ts, .sigma = ts, .audio_sigma = ts,
                                          .use_cross_timestep = 1};
    /* each round: a text's first pass (the text cache emptied), then a pass with its
     * K / V cached (every later pass of that text in a request) */
    double load_s = dl_now() - t0, best = INFINITY, first = INFINITY;
    for (int i = 0; i < warm + reps; i++)
        for (int cached = 0; cached < 2; cached++) {
            if (!cached) dl_ltx2_transformer_forget_text(m);
            t0 = dl_now();
            if (dl_ltx2_transformer_run(m, &in, out, out + Nv * c.Cin) != DL_OK) {
                fprintf(stderr, "difflet: bench: %s\n", dl_last_error());
                goto done;
            }
            double t = dl_now() - t0, *b = cached ? &best : &first;
            if (i >= warm && t < *b) *b = t;
        }
    bench_rss_mib(&rss0, &rss_peak);
    dl_ltx2_transformer_free(m);
    m = NULL;
    double attn_f, text_f, flops = step_flops(&c, &attn_f, &text_f);
    const double gf = (flops - text_f) / best * 1e-9, gf1 = flops / first * 1e-9;
    /* a request of LTX2Pipeline's default 40 steps with its default guidance (CFG, STG,
     * modality: 4 passes a step) over 2 texts: 2 first passes of 160 */
    const double req = (2 * first + 158 * best) / 160;
    const int64_t mm_m = quick ? 512 : Nv;
    const double peak = bench_matmul_peak(dt, mm_m, D, 4 * D);
    /* the block's six attentions, each in the model's layout */
    const double at_v = attn_seconds(1, Nv, Nv, c.H, c.Dh, dt), at_a = attn_seconds(1, c.Na, c.Na, c.Ha, c.Dha, dt);
    const double at_tv = attn_seconds(0, Nv, c.T, c.H, c.Dh, dt), at_ta = attn_seconds(0, c.Na, c.T, c.Ha, c.Dha, dt);
    const double at_av = attn_seconds(0, Nv, c.Na, c.Ha, c.Dha, dt) + attn_seconds(0, c.Na, Nv, c.Ha, c.Dha, dt);
    const double at = at_v + at_a + at_tv + at_ta + at_av;
    printf("  FLOPs per step (counted): %.1f GFLOP, of which the six attentions' 4 Sq Sk W = %.1f GFLOP and the\n"
           "            text's own (caption projections, text K / V: computed once per text and request) %.1f GFLOP\n",
           flops * 1e-9, attn_f * 1e-9, text_f * 1e-9);
    printf("  difflet:  load %.1f s, step %.3f s with the text's K / V cached (every pass after a text's first), a text's\n"
           "            first pass %.3f s (best of %d, %d warm-up); a 40-step request (4 passes a step, 2 texts) %.3f s a\n"
           "            pass; %.0f GFLOP/s effective (first pass %.0f) = %.2f x the same-run %s matmul (%.0f GFLOP/s\n"
           "            at %lldx%lldx%lld), peak RSS %.0f MiB%s\n",
           load_s, best, first, reps, warm, req, gf, gf1, gf / peak, bench_matmul_label(), peak, (long long)mm_m,
           (long long)D, (long long)(4 * D), rss_peak, reset ? " (since the load)" : " (since the process began)");
    printf("  attention: the block's six called standalone in the model's shapes: video self %.3f s, audio self %.3f s,\n"
           "            text cross video %.3f s / audio %.3f s, a2v + v2a %.3f s\n"
           "            = %.3f s = %.1f%% of the step (estimate: timed apart from the step)\n",
           at_v, at_a, at_tv, at_ta, at_av, at, 100 * at / best);
    cJSON_AddNumberToObject(root, "difflet_load_s", load_s);
    cJSON_AddNumberToObject(root, "difflet_step_s", best);
    cJSON_AddNumberToObject(root, "difflet_first_pass_s", first);
    cJSON_AddNumberToObject(root, "difflet_request_pass_s", req);
    cJSON_AddNumberToObject(root, "text_gflop", text_f * 1e-9);
    cJSON_AddNumberToObject(root, "difflet_gflops", gf);
    cJSON_AddNumberToObject(root, "matmul_gflops", peak);
    cJSON_AddNumberToObject(root, "fraction_of_matmul_peak", gf / peak);
    cJSON_AddNumberToObject(root, "step_gflop", flops * 1e-9);
    cJSON_AddNumberToObject(root, "attention_gflop", attn_f * 1e-9);
    cJSON_AddNumberToObject(root, "attention_standalone_s", at);
    cJSON_AddNumberToObject(root, "attention_video_self_s", at_v);
    cJSON_AddNumberToObject(root, "attention_audio_self_s", at_a);
    cJSON_AddNumberToObject(root, "attention_text_cross_s", at_tv + at_ta);
    cJSON_AddNumberToObject(root, "attention_audio_video_s", at_av);
    cJSON_AddNumberToObject(root, "attention_share", at / best);
    cJSON_AddNumberToObject(root, "difflet_peak_rss_mib", rss_peak);
    cJSON_AddBoolToObject(root, "difflet_peak_rss_since_load", reset);
    snprintf(path, sizeof path, "%s/cache", dir);
    resident_stages(path, quick ? 1 : 3, dt, root);
    fflush(stdout);
    /* the peer */
    pj = bench_run_peer("ltx2_step_peer.py", dir, reps, warm, dt);
    if (!pj) {
        cJSON_AddNullToObject(root, "diffusers_step_s");
    } else {
        const double peer = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(pj, "step_s"));
        const double prss = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(pj, "peak_rss_mib"));
        double rel[2];
        snprintf(path, sizeof path, "%s/peer_out.safetensors", dir);
        stream_rel_diff(path, out, Nv, c.Na, c.Cin, rel);
        printf("  diffusers: step %.3f s (best of %d, %d warm-up; torch %s, %d threads), peak RSS %.0f MiB (its process)\n",
               peer, reps, warm, cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(pj, "torch")), dl_threads(), prss);
        printf("  difflet / diffusers step time: %.3f (difflet %.2f x faster; goal >= 1.5); a text's first pass %.2f x,\n"
               "            a 40-step request %.2f x (diffusers computes the text's part at every pass); outputs differ\n"
               "            by %.3g (video), %.3g (audio) of max|diffusers|\n",
               best / peer, peer / best, peer / first, peer / req, rel[0], rel[1]);
        cJSON_AddNumberToObject(root, "diffusers_step_s", peer);
        cJSON_AddNumberToObject(root, "speedup_vs_diffusers", peer / best);
        cJSON_AddNumberToObject(root, "speedup_first_pass", peer / first);
        cJSON_AddNumberToObject(root, "speedup_request", peer / req);
        cJSON_AddNumberToObject(root, "output_rel_diff", fmax(rel[0], rel[1]));
        cJSON_AddNumberToObject(root, "output_rel_diff_video", rel[0]);
        cJSON_AddNumberToObject(root, "output_rel_diff_audio", rel[1]);
        cJSON_AddNumberToObject(root, "diffusers_peak_rss_mib", prss);
    }
    rc = 0;
    if (json_path && bench_write_json(root, json_path) != DL_OK) rc = 1;
done:
    dl_ltx2_transformer_free(m);
    dl_model_dir_free(md);
    cJSON_Delete(pj);
    cJSON_Delete(root);
    free(vid), free(aud), free(txt), free(atxt), free(out);
    bench_remove_dir(dir);
    return rc;
}
