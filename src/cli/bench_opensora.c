/* `difflet bench stdit-step`: one denoiser step of an OpenSora 1.2 STDiT3 at the
 * published width (hidden 1152 = 16 heads x 72, MLP 4608, caption_channels 4096,
 * model_max_length 300, patch (1, 2, 2), ONE spatial + temporal block pair, random
 * weights with the published key names) for a 240p 9:16 video of 51 frames (240 x 426:
 * latent 15 x 30 x 53, 15 x 15 x 27 = 6,075 tokens) and a caption of 300 rows of which
 * 120 are valid. One step is what OpenSora's RFLOW sampler does per step: ONE batch-2
 * call (the latents twice; the caption and the null caption y_embedding with the
 * caption's mask), here dl_stdit3_run2. The dtype is the engine's default on this CPU
 * (bf16 with AVX512_BF16, else f32) or --dtype, as flux-step chooses.
 *
 * The peer (same run, same weights and inputs, torch CPU, the same dtype and thread
 * count; the tools virtualenv) is tools/bench/stdit_step_peer.py: Open-Sora's own code
 * may not be committed or run from here, so it is our plain-torch transcription of the
 * STDiT3 math (SDPA attention), which its `--check` verifies against Open-Sora's own
 * outputs (the committed vectors of tests/data/opensora/{a,b}).
 *
 * Reports the step-time ratio, difflet's effective GFLOP/s (the reference's work:
 * step_flops below) as a fraction of a same-run matmul (difflet's: OpenBLAS or oneDNN) in that dtype, the
 * step's phases (clock readings at the model's tap points: conditioning, caption
 * projection, patch embedding, the spatial block, the temporal block, the final
 * layer), the three attention kernels of the block pair timed apart on the step's
 * shapes, the outputs' difference (both branches), peak RSS, and (--json) the machine.
 * --quick: latent 5 x 8 x 12 (120 tokens), a warm-up run. --reps N: timed runs (default
 * 2 after one warm-up). DIFFLET_BENCH_PEER=off skips the peer.
 *
 * The folder writers (bench_opensora_folder) also serve `profile measure --real-width`:
 * STDiT3 at any depth, and the OpenSoraVAE v1.2 decoder with its published config
 * (VAE_Temporal_SD + the SDXL spatial VAE) and random weights. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "difflet/check.h"
#include "difflet/models.h"
#include "difflet/opensora.h"

#ifndef DIFFLET_SOURCE_DIR
#define DIFFLET_SOURCE_DIR "."
#endif

/* the published STDiT3 (hpcai-tech/OpenSora-STDiT-v3) sizes */
enum { OS_D = 1152, OS_HEADS = 16, OS_CCAP = 4096, OS_LMAX = 300, OS_CIN = 4, OS_COUT = 8 };
static const int64_t k_patch[3] = {1, 2, 2};

/* ---- random-weight folders ------------------------------------------------------- */

static dl_status make_transformer(const char *dir, int64_t depth) {
    char path[4200], cfg[1024];
    snprintf(path, sizeof path, "%s/transformer", dir);
    dl_status s = dl_mkdir_p(path);
    if (s != DL_OK) return s;
    snprintf(cfg, sizeof cfg,
             "{\"architectures\": [\"STDiT3\"], \"model_type\": \"STDiT3\", \"hidden_size\": %d, \"depth\": %lld, "
             "\"num_heads\": %d, \"in_channels\": %d, \"caption_channels\": %d, \"model_max_length\": %d, "
             "\"mlp_ratio\": 4.0, \"input_sq_size\": 512, \"patch_size\": [1, 2, 2], \"pred_sigma\": true, "
             "\"qk_norm\": true, \"skip_y_embedder\": false, \"class_dropout_prob\": 0.1, \"drop_path\": 0.0, "
             "\"enable_flash_attn\": false, \"enable_layernorm_kernel\": false, \"enable_sequence_parallelism\": false, "
             "\"freeze_y_embedder\": false, \"only_train_temporal\": false, \"input_size\": [null, null, null]}",
             OS_D, (long long)depth, OS_HEADS, OS_CIN, OS_CCAP, OS_LMAX);
    snprintf(path, sizeof path, "%s/transformer/config.json", dir);
    if ((s = bench_write_text(path, cfg)) != DL_OK) return s;
    bench_wgen g;
    bench_wgen_init(&g, 300);
    const int64_t D = OS_D, Dh = OS_D / OS_HEADS, F = 4 * OS_D, PP = k_patch[0] * k_patch[1] * k_patch[2];
    const int64_t pe[5] = {D, OS_CIN, k_patch[0], k_patch[1], k_patch[2]}, sst[2] = {6, D}, fsst[2] = {2, D};
    const int64_t yemb[2] = {OS_LMAX, OS_CCAP}, nfreq[1] = {Dh / 2};
    bench_put_wb(&g, "", "x_embedder.proj", 5, pe);
    bench_put_lin(&g, "t_embedder.", "mlp.0", D, 256);
    bench_put_lin(&g, "t_embedder.", "mlp.2", D, D);
    bench_put_lin(&g, "fps_embedder.", "mlp.0", D, 256);
    bench_put_lin(&g, "fps_embedder.", "mlp.2", D, D);
    bench_put_lin(&g, "", "t_block.1", 6 * D, D);
    bench_put_lin(&g, "y_embedder.", "y_proj.fc1", D, OS_CCAP);
    bench_put_lin(&g, "y_embedder.", "y_proj.fc2", D, D);
    bench_put(&g, "y_embedder.y_embedding", 2, yemb);
    char p[64];
    for (int64_t i = 0; i < 2 * depth; i++) {
        snprintf(p, sizeof p, "%s_blocks.%lld.", i % 2 ? "temporal" : "spatial", (long long)(i / 2));
        bench_put_lin(&g, p, "attn.qkv", 3 * D, D);
        bench_put_vec(&g, p, "attn.q_norm.weight", Dh);
        bench_put_vec(&g, p, "attn.k_norm.weight", Dh);
        bench_put_lin(&g, p, "attn.proj", D, D);
        bench_put_lin(&g, p, "cross_attn.q_linear", D, D);
        bench_put_lin(&g, p, "cross_attn.kv_linear", 2 * D, D);
        bench_put_lin(&g, p, "cross_attn.proj", D, D);
        bench_put_lin(&g, p, "mlp.fc1", F, D);
        bench_put_lin(&g, p, "mlp.fc2", D, F);
        char n[96];
        snprintf(n, sizeof n, "%sscale_shift_table", p);
        bench_put(&g, n, 2, sst);
    }
    bench_put(&g, "final_layer.scale_shift_table", 2, fsst);
    bench_put_lin(&g, "final_layer.", "linear", PP * OS_COUT, D);
    float freqs[OS_D / OS_HEADS / 2]; /* not random: RotaryEmbedding's inverse frequencies */
    for (int64_t k = 0; k < Dh / 2; k++) freqs[k] = 1.f / powf(10000.f, (float)(2 * k) / (float)Dh);
    bench_put_f32(&g, "rope.freqs", 1, nfreq, freqs);
    snprintf(path, sizeof path, "%s/transformer/model.safetensors", dir);
    return bench_wgen_save(&g, path);
}

/* VAE_Temporal_SD's decoder (filters 128, 4 res blocks, 32 groups, multipliers
 * (1, 2, 2, 4), temporal_downsample (false, true, true), 4 latent channels) and the
 * SDXL AutoencoderKL decoder (128, 256, 512, 512; 2 layers per block) */
static dl_status make_vae(const char *dir) {
    char path[4200], p[200], q[320];
    snprintf(path, sizeof path, "%s/vae", dir);
    dl_status s = dl_mkdir_p(path);
    if (s != DL_OK) return s;
    snprintf(path, sizeof path, "%s/vae/config.json", dir);
    if ((s = bench_write_text(path, "{\"architectures\": [\"VideoAutoencoderPipeline\"], \"model_type\": \"VideoAutoencoderPipeline\", "
                                    "\"cal_loss\": false, \"freeze_vae_2d\": false, \"from_pretrained\": null, \"micro_frame_size\": 17, "
                                    "\"scale\": [3.85, 2.32, 2.33, 3.06], \"shift\": [-0.10, 0.34, 0.27, 0.98], "
                                    "\"vae_2d\": {\"type\": \"VideoAutoencoderKL\", \"from_pretrained\": "
                                    "\"PixArt-alpha/pixart_sigma_sdxlvae_T5_diffusers\", \"subfolder\": \"vae\", "
                                    "\"micro_batch_size\": 4, \"local_files_only\": false}, "
                                    "\"vae_temporal\": {\"type\": \"VAE_Temporal_SD\", \"from_pretrained\": null}}")) != DL_OK)
        return s;
    bench_wgen g;
    bench_wgen_init(&g, 7000);
#define CONV(base, nd, ...)                                  \
    do {                                                     \
        const int64_t sh_[nd] = {__VA_ARGS__};               \
        bench_put_wb(&g, "", base, nd, sh_);                 \
    } while (0)
#define WEIGHT(base, nd, ...)                                \
    do {                                                     \
        const int64_t sh_[nd] = {__VA_ARGS__};               \
        snprintf(q, sizeof q, "%s.weight", base);            \
        bench_put(&g, q, nd, sh_);                           \
    } while (0)
#define NORM(base, ch)                                       \
    do {                                                     \
        snprintf(q, sizeof q, "%s.weight", base);            \
        bench_put_vec(&g, "", q, ch);                        \
        snprintf(q, sizeof q, "%s.bias", base);              \
        bench_put_vec(&g, "", q, ch);                        \
    } while (0)
    /* temporal: decoder blocks run from the last multiplier to the first */
    static const int64_t mult[4] = {1, 2, 2, 4}, tdown[3] = {0, 1, 1};
    const int64_t fl = 128, c0 = fl * mult[3];
    CONV("temporal_vae.post_quant_conv.conv", 5, 4, 4, 1, 1, 1);
    CONV("temporal_vae.decoder.conv1.conv", 5, c0, 4, 3, 3, 3);
    int64_t prev = c0;
    for (int i = -1; i < 4; i++) { /* -1: res_blocks; then block_res_blocks[3 - i] */
        const int b = 3 - i;
        const int64_t oc = i < 0 ? c0 : fl * mult[b];
        for (int j = 0; j < 4; j++) {
            const int64_t ci = j == 0 ? prev : oc;
            if (i < 0) snprintf(p, sizeof p, "temporal_vae.decoder.res_blocks.%d.", j);
            else snprintf(p, sizeof p, "temporal_vae.decoder.block_res_blocks.%d.%d.", b, j);
            char nb[240];
            snprintf(nb, sizeof nb, "%snorm1", p);
            NORM(nb, ci);
            snprintf(nb, sizeof nb, "%snorm2", p);
            NORM(nb, oc);
            snprintf(nb, sizeof nb, "%sconv1.conv", p);
            WEIGHT(nb, 5, oc, ci, 3, 3, 3);
            snprintf(nb, sizeof nb, "%sconv2.conv", p);
            WEIGHT(nb, 5, oc, oc, 3, 3, 3);
            if (ci != oc) {
                snprintf(nb, sizeof nb, "%sconv3.conv", p);
                WEIGHT(nb, 5, oc, ci, 1, 1, 1);
            }
        }
        prev = oc;
        if (i >= 0 && b > 0 && tdown[b - 1]) {
            snprintf(p, sizeof p, "temporal_vae.decoder.conv_blocks.%d.conv", b - 1);
            CONV(p, 5, 2 * oc, oc, 3, 3, 3);
        }
    }
    NORM("temporal_vae.decoder.norm1", fl);
    CONV("temporal_vae.decoder.conv_out.conv", 5, 4, fl, 3, 3, 3);
    /* spatial: the SDXL VAE's decoder under spatial_vae.module. */
    static const int64_t boc[4] = {128, 256, 512, 512};
    const char *sp = "spatial_vae.module.";
    snprintf(p, sizeof p, "%spost_quant_conv", sp);
    CONV(p, 4, 4, 4, 1, 1);
    snprintf(p, sizeof p, "%sdecoder.conv_in", sp);
    CONV(p, 4, 512, 4, 3, 3);
    for (int i = -1; i < 4; i++) { /* -1: the mid block */
        const int64_t oc = i < 0 ? 512 : boc[3 - i], cin = i <= 0 ? 512 : boc[4 - i];
        for (int j = 0; j < (i < 0 ? 2 : 3); j++) {
            const int64_t ci = j == 0 ? cin : oc;
            char r[180], nb[240];
            if (i < 0) snprintf(r, sizeof r, "%sdecoder.mid_block.resnets.%d.", sp, j);
            else snprintf(r, sizeof r, "%sdecoder.up_blocks.%d.resnets.%d.", sp, i, j);
            snprintf(nb, sizeof nb, "%snorm1", r);
            NORM(nb, ci);
            snprintf(nb, sizeof nb, "%snorm2", r);
            NORM(nb, oc);
            snprintf(nb, sizeof nb, "%sconv1", r);
            CONV(nb, 4, oc, ci, 3, 3);
            snprintf(nb, sizeof nb, "%sconv2", r);
            CONV(nb, 4, oc, oc, 3, 3);
            if (ci != oc) {
                snprintf(nb, sizeof nb, "%sconv_shortcut", r);
                CONV(nb, 4, oc, ci, 1, 1);
            }
        }
        if (i < 0) {
            static const char *lin[] = {"to_q", "to_k", "to_v", "to_out.0"};
            char a[180];
            snprintf(a, sizeof a, "%sdecoder.mid_block.attentions.0.", sp);
            snprintf(p, sizeof p, "%sgroup_norm", a);
            NORM(p, 512);
            for (int k = 0; k < 4; k++) bench_put_lin(&g, a, lin[k], 512, 512);
        } else if (i < 3) {
            snprintf(p, sizeof p, "%sdecoder.up_blocks.%d.upsamplers.0.conv", sp, i);
            CONV(p, 4, oc, oc, 3, 3);
        }
    }
    snprintf(p, sizeof p, "%sdecoder.conv_norm_out", sp);
    NORM(p, 128);
    snprintf(p, sizeof p, "%sdecoder.conv_out", sp);
    CONV(p, 4, 3, 128, 3, 3);
#undef CONV
#undef WEIGHT
#undef NORM
    snprintf(path, sizeof path, "%s/vae/model.safetensors", dir);
    return bench_wgen_save(&g, path);
}

dl_status bench_opensora_folder(const char *dir, int64_t depth, int vae) {
    char path[4200];
    snprintf(path, sizeof path, "%s/model_index.json", dir);
    dl_status s = bench_write_text(path, vae ? "{\"_class_name\": \"OpenSoraPipeline\", \"transformer\": [\"opensora\", \"STDiT3\"], "
                                               "\"vae\": [\"opensora\", \"VideoAutoencoderPipeline\"]}"
                                             : "{\"_class_name\": \"OpenSoraPipeline\", \"transformer\": [\"opensora\", \"STDiT3\"]}");
    if (s == DL_OK) s = make_transformer(dir, depth);
    if (s == DL_OK && vae) s = make_vae(dir);
    return s;
}

/* ---- measuring ------------------------------------------------------------------- */

typedef struct {
    int64_t lat[3], G[3], S, N, T, valid, B; /* latent and token grids; caption rows, valid; branches */
    float height, width;
} os_shape;

/* FLOPs of one step, the reference's work (both branches): every linear 2 M K N (the
 * caption projection over all T rows, cross-attention K/V over the valid rows),
 * self-attention 4 L^2 D per sequence, cross-attention 4 N V D, patch conv, embedders */
static double step_flops(const os_shape *c, double *attn) {
    const double D = OS_D, F = 4.0 * OS_D, B = (double)c->B, N = (double)c->N, V = (double)c->valid, T = (double)c->T;
    const double PP = (double)(k_patch[0] * k_patch[1] * k_patch[2]), S = (double)c->S, G0 = (double)c->G[0];
    double emb = B * (2 * N * OS_CIN * PP * D + 2 * 2 * (256 * D + D * D) + 2 * D * 6 * D + 2 * T * (OS_CCAP * D + D * D));
    double lin = B * N * (2 * D * 3 * D + 3 * 2 * D * D + 2 * 2 * D * F) + B * 2 * V * D * 2 * D; /* one block */
    attn[0] = B * G0 * 4 * S * S * D;  /* spatial */
    attn[1] = B * S * 4 * G0 * G0 * D; /* temporal */
    attn[2] = 2 * B * 4 * N * V * D;   /* cross, both blocks */
    return emb + 2 * lin + attn[0] + attn[1] + attn[2] + B * 2 * N * D * PP * OS_COUT;
}

/* clock readings at the model's tap points */
static const char *const k_marks[] = {"t_mlp", "y_tokens", "x_embed", "spatial_0", "temporal_0", "final"};
enum { NMARK = sizeof k_marks / sizeof k_marks[0] };
typedef struct {
    double t[NMARK];
} marks;

static void on_tap(void *ctx, const char *name, const void *data, dl_dtype dt, int64_t rows, int64_t cols) {
    (void)data, (void)dt, (void)rows, (void)cols;
    marks *m = ctx;
    for (int i = 0; i < NMARK; i++)
        if (!strcmp(name, k_marks[i])) m->t[i] = dl_now();
}

/* one block pair's three attention kernels on the step's shapes, as stdit3.c calls
 * them (one rank): spatial (every branch-frame's S rows, the threads sharing each
 * sequence), temporal (every branch-position's T' rows, S rows apart, whole sequences
 * per thread), cross (each branch's N rows to its valid caption keys, per block) */
typedef struct {
    dl_attn_args a;
    int64_t nseq, S, N, temporal;
    char *qkv, *att, *scr;
    size_t slice;
} attn_job;

static void attn_task(void *ctx, int ith, int nth) {
    const attn_job *j = ctx;
    const size_t es = dl_dtype_size(j->a.dt);
    const int64_t q3 = 3 * OS_D;
    dl_attn_args ai = j->a;
    int64_t i0 = 0, i1 = j->nseq;
    if (j->temporal) dl_split(j->nseq, ith, nth, &i0, &i1);
    for (int64_t i = i0; i < i1; i++) {
        const int64_t r = j->temporal ? i / j->S * j->N + i % j->S : i * j->S; /* the sequence's first row */
        ai.q = j->qkv + (size_t)(r * q3) * es;
        ai.k = (const char *)ai.q + (size_t)OS_D * es;
        ai.v = (const char *)ai.q + (size_t)(2 * OS_D) * es;
        ai.out = j->att + (size_t)(r * OS_D) * es;
        if (j->temporal) dl_attn_t(&ai, j->scr + (size_t)ith * j->slice, 0, 1);
        else dl_attn_t(&ai, j->scr, ith, nth);
    }
}

static int attn_seconds(const os_shape *c, dl_dtype dt, double sec[3]) {
    const int64_t Dh = OS_D / OS_HEADS, q3 = 3 * OS_D, rows = c->B * c->N, G0 = c->G[0];
    const size_t es = dl_dtype_size(dt);
    const int nth = dl_threads();
    dl_attn_args sp = {.dt = dt, .sq = c->S, .sk = c->S, .heads = OS_HEADS, .head_dim = Dh, .q_stride = q3,
                       .k_stride = q3, .v_stride = q3, .out_stride = OS_D, .kv_end = c->S, .scale = 1.f / sqrtf((float)Dh)};
    dl_attn_args tp = sp;
    tp.sq = tp.sk = tp.kv_end = G0, tp.q_stride = tp.k_stride = tp.v_stride = c->S * q3, tp.out_stride = c->S * OS_D;
    const size_t slice = dl_align_up(dl_attn_scratch_bytes(&tp, 1), DL_ALIGN), ssp = dl_attn_scratch_bytes(&sp, nth);
    const size_t scr_bytes = (ssp > slice * (size_t)nth ? ssp : slice * (size_t)nth) + 64;
    char *qkv = malloc((size_t)(rows * q3) * es), *att = malloc((size_t)(rows * OS_D) * es);
    char *kv = malloc((size_t)(c->B * c->T * 2 * OS_D) * es), *scr = dl_aligned_alloc(scr_bytes);
    int ok = qkv && att && kv && scr;
    if (ok) {
        dl_fill_uniform(dt, qkv, rows * q3, -1.f, 1.f, 11);
        dl_fill_uniform(dt, kv, c->B * c->T * 2 * OS_D, -1.f, 1.f, 12);
        attn_job js = {.a = sp, .nseq = c->B * G0, .S = c->S, .N = c->N, .temporal = 0, .qkv = qkv, .att = att, .scr = scr};
        attn_job jt = {.a = tp, .nseq = c->B * c->S, .S = c->S, .N = c->N, .temporal = 1, .qkv = qkv, .att = att, .scr = scr,
                       .slice = slice};
        for (int k = 0; k < 3; k++) {
            sec[k] = INFINITY;
            for (int rep = 0; rep < 2 && ok; rep++) {
                const double t0 = dl_now();
                if (k < 2) {
                    dl_parallel(attn_task, k ? &jt : &js);
                } else {
                    for (int blk = 0; blk < 2 && ok; blk++) /* the spatial and the temporal block's */
                        for (int64_t b = 0; b < c->B && ok; b++) {
                            const char *kb = kv + (size_t)(b * c->T * 2 * OS_D) * es;
                            dl_attn_args a = {.dt = dt, .sq = c->N, .sk = c->T, .heads = OS_HEADS, .head_dim = Dh,
                                              .q = qkv + (size_t)(b * c->N * OS_D) * es, .k = kb, .v = kb + (size_t)OS_D * es,
                                              .q_stride = OS_D, .k_stride = 2 * OS_D, .v_stride = 2 * OS_D,
                                              .out = att + (size_t)(b * c->N * OS_D) * es, .out_stride = OS_D,
                                              .kv_end = c->valid, .scale = 1.f / sqrtf((float)Dh)};
                            ok = dl_attn(&a, NULL) == DL_OK;
                        }
                }
                if (dl_now() - t0 < sec[k]) sec[k] = dl_now() - t0;
            }
        }
    }
    free(qkv), free(att), free(kv), dl_aligned_free(scr);
    return ok;
}

/* the peer can run: the virtualenv is there and DIFFLET_BENCH_PEER is not off (else why, printed) */
static int peer_ready(void) {
    const char *env = getenv("DIFFLET_BENCH_PEER");
    if (env && !strcmp(env, "off")) {
        printf("  torch peer: not measured (DIFFLET_BENCH_PEER=off)\n");
        return 0;
    }
    if (access(DIFFLET_SOURCE_DIR "/tools/venv/bin/python", X_OK) != 0) {
        printf("  torch peer: not measured (no %s: run `make tools-venv`)\n", DIFFLET_SOURCE_DIR "/tools/venv/bin/python");
        return 0;
    }
    return 1;
}

int cli_bench_opensora(int argc, char **argv) {
    const char *json_path = NULL;
    int quick = 0, n = 0, reps = -1;
    dl_dtype dt;
    char **rest = calloc((size_t)argc + 1, sizeof *rest);
    if (!rest) return 1;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else rest[n++] = argv[i];
    }
    int ok = bench_opts(n, rest, "stdit-step", &json_path, &quick, &dt);
    free(rest);
    if (!ok) return 2;
    if (reps == 0 || reps < -1 || reps > 100) {
        fprintf(stderr, "difflet: bench stdit-step: --reps must be in 1..100\n");
        return 2;
    }
    os_shape c = {.lat = {15, 30, 53}, .T = OS_LMAX, .valid = 120, .B = 2, .height = 240, .width = 426};
    if (quick) c.lat[0] = 5, c.lat[1] = 8, c.lat[2] = 12, c.height = 64, c.width = 96;
    const int warm = 1;
    if (reps < 0) reps = quick ? 1 : 2;
    for (int i = 0; i < 3; i++) c.G[i] = (c.lat[i] + k_patch[i] - 1) / k_patch[i];
    c.S = c.G[1] * c.G[2], c.N = c.G[0] * c.S;
    const int64_t nlat = OS_CIN * c.lat[0] * c.lat[1] * c.lat[2], nout = OS_COUT * c.lat[0] * c.lat[1] * c.lat[2];
    char dir[] = "/tmp/difflet-bench-stdit-XXXXXX", path[4200];
    if (!mkdtemp(dir)) {
        fprintf(stderr, "difflet: bench: cannot create a temporary folder\n");
        return 1;
    }
    int rc = 1;
    float *lat = malloc((size_t)nlat * 4), *cap = malloc((size_t)(c.T * OS_CCAP) * 4), *out = malloc((size_t)(2 * nout) * 4);
    cJSON *root = cJSON_CreateObject(), *pj = NULL;
    dl_model_dir *md = NULL;
    dl_stdit3 *m = NULL;
    dl_attn_args probe = {.dt = dt, .sq = c.S, .sk = c.S, .heads = OS_HEADS, .head_dim = OS_D / OS_HEADS};
    printf("difflet bench stdit-step: OpenSora 1.2 STDiT3 width (hidden %d, %d heads x %d, MLP %d, caption %d), 1 spatial +\n"
           "  1 temporal block, %gx%g x %s frames: latent %lld x %lld x %lld -> %lld x %lld x %lld = %lld tokens per branch,\n"
           "  caption %lld rows (%lld valid); one sampler step = one CFG batch-2 call; %s, %d threads\n"
           "  on %s: kernels %s, matmul %s (oneDNN %s), attention path for head_dim %d: %s\n",
           OS_D, OS_HEADS, OS_D / OS_HEADS, 4 * OS_D, OS_CCAP, c.width, c.height, quick ? "17" : "51", (long long)c.lat[0],
           (long long)c.lat[1], (long long)c.lat[2], (long long)c.G[0], (long long)c.G[1], (long long)c.G[2], (long long)c.N,
           (long long)c.T, (long long)c.valid, dl_dtype_name(dt), dl_threads(), dl_cpu_model(), dl_isa_name(dl_kernel_isa()),
           dl_onednn_isa(), dl_onednn_version(), OS_D / OS_HEADS, dl_attn_path_name(&probe));
    if (dt == DL_F32 && !dl_cpu()->avx512_bf16)
        printf("  (f32: the engine's default here, as this CPU has no AVX512_BF16; bf16 would be emulated in f32)\n");
    bench_machine_json(root);
    cJSON_AddStringToObject(root, "dtype", dl_dtype_name(dt));
    cJSON_AddNumberToObject(root, "tokens_per_branch", (double)c.N);
    cJSON_AddNumberToObject(root, "batch", (double)c.B);
    cJSON_AddNumberToObject(root, "caption_rows", (double)c.T);
    cJSON_AddNumberToObject(root, "caption_valid", (double)c.valid);
    cJSON_AddNumberToObject(root, "timed_runs", reps);
    cJSON_AddNumberToObject(root, "warmup_runs", warm);
    cJSON_AddStringToObject(root, "attention_path", dl_attn_path_name(&probe));
    fflush(stdout);
    if (!lat || !cap || !out) goto done;
    if (bench_opensora_folder(dir, 1, 0) != DL_OK) {
        fprintf(stderr, "difflet: bench: %s\n", dl_last_error());
        goto done;
    }
    dl_randn(1, lat, nlat);
    dl_fill_uniform(DL_F32, cap, c.T * OS_CCAP, -1.f, 1.f, 2);
    float ts = 700.f, fps = 24.f, valid = (float)c.valid;
    {
        dl_st_writer *w = dl_st_writer_new();
        const int64_t sl[4] = {OS_CIN, c.lat[0], c.lat[1], c.lat[2]}, sc[2] = {c.T, OS_CCAP}, s1[1] = {1};
        dl_st_writer_add(w, "latents", DL_ST_F32, 4, sl, lat);
        dl_st_writer_add(w, "caption", DL_ST_F32, 2, sc, cap);
        dl_st_writer_add(w, "valid", DL_ST_F32, 1, s1, &valid);
        dl_st_writer_add(w, "timestep", DL_ST_F32, 1, s1, &ts);
        dl_st_writer_add(w, "fps", DL_ST_F32, 1, s1, &fps);
        dl_st_writer_add(w, "height", DL_ST_F32, 1, s1, &c.height);
        dl_st_writer_add(w, "width", DL_ST_F32, 1, s1, &c.width);
        snprintf(path, sizeof path, "%s/inputs.safetensors", dir);
        dl_status s = dl_st_writer_save(w, path);
        dl_st_writer_free(w);
        if (s != DL_OK) {
            fprintf(stderr, "difflet: bench: %s\n", dl_last_error());
            goto done;
        }
    }
    /* difflet: the conditional branch and the null caption with the same mask */
    double rss0, rss_peak;
    const int reset = bench_rss_reset();
    double t0 = dl_now();
    if (dl_model_dir_open(&md, dir) != DL_OK ||
        dl_stdit3_load(&m, md, "transformer", c.lat[0], c.lat[1], c.lat[2], c.T, dt, NULL, NULL, 2) != DL_OK) {
        fprintf(stderr, "difflet: bench: %s\n", dl_last_error());
        goto done;
    }
    const double load_s = dl_now() - t0;
    const dl_stdit3_cond c0 = {.y = cap, .valid = c.valid, .timestep = ts, .fps = fps, .height = c.height, .width = c.width};
    dl_stdit3_cond c1 = c0;
    c1.y = dl_stdit3_null_caption(m);
    marks mk, best_mk = {{0}};
    double best = INFINITY, best_t0 = 0;
    dl_stdit3_set_tap(m, on_tap, &mk);
    for (int i = 0; i < warm + reps; i++) {
        memset(&mk, 0, sizeof mk);
        t0 = dl_now();
        if (dl_stdit3_run2(m, lat, &c0, &c1, out, out + nout) != DL_OK) {
            fprintf(stderr, "difflet: bench: %s\n", dl_last_error());
            goto done;
        }
        const double t = dl_now() - t0;
        if (i >= warm && t < best) best = t, best_mk = mk, best_t0 = t0;
    }
    dl_stdit3_set_tap(m, NULL, NULL);
    bench_rss_mib(&rss0, &rss_peak);
    dl_stdit3_free(m);
    m = NULL;
    double af[3], as[3];
    const double flops = step_flops(&c, af), gf = flops / best * 1e-9;
    const double peak = bench_matmul_peak(dt, quick ? 1024 : 4096, OS_D, 4 * OS_D);
    if (!attn_seconds(&c, dt, as)) {
        fprintf(stderr, "difflet: bench: attention: %s\n", dl_last_error());
        goto done;
    }
    double ph[NMARK + 1];
    {
        double prev = best_t0;
        for (int i = 0; i < NMARK; i++) ph[i] = best_mk.t[i] - prev, prev = best_mk.t[i];
        ph[NMARK] = best_t0 + best - prev; /* after the final linear: unpatchify */
        ph[NMARK - 1] += ph[NMARK];      /* reported with the final layer */
    }
    printf("  FLOPs per step (counted, both branches): %.1f GFLOP, of which self-attention spatial %.1f, temporal %.1f,\n"
           "            cross %.1f GFLOP\n",
           flops * 1e-9, af[0] * 1e-9, af[1] * 1e-9, af[2] * 1e-9);
    printf("  difflet:  load %.1f s, step %.3f s (best of %d, %d warm-up), %.0f GFLOP/s effective = %.2f x the same-run\n"
           "            %s matmul (%.0f GFLOP/s at %dx%dx%d), peak RSS %.0f MiB%s\n",
           load_s, best, reps, warm, gf, gf / peak, bench_matmul_label(), peak, quick ? 1024 : 4096, OS_D, 4 * OS_D, rss_peak,
           reset ? " (since the load)" : " (since the process began)");
    static const char *const labels[NMARK] = {"conditioning (t, fps, t_block)", "caption projection (y_proj, 2 x 300 rows)",
                                              "patch + position embedding", "spatial block", "temporal block",
                                              "final layer + unpatchify"};
    printf("  difflet step by phase (clock at the model's tap points):\n");
    for (int i = 0; i < NMARK; i++) printf("            %-44s %8.3f s  %5.1f%%\n", labels[i], ph[i], 100 * ph[i] / best);
    printf("  attention kernels of the block pair, timed apart on the step's shapes (%s):\n"
           "            spatial self-attention  (%lld sequences of %lld)  %8.3f s  %5.1f%% of the step, %.1f GFLOP/s\n"
           "            temporal self-attention (%lld sequences of %lld)  %8.3f s  %5.1f%%, %.1f GFLOP/s\n"
           "            cross-attention (2 blocks x 2 branches, %lld keys) %8.3f s  %5.1f%%, %.1f GFLOP/s\n",
           dl_attn_path_name(&probe), (long long)(c.B * c.G[0]), (long long)c.S, as[0], 100 * as[0] / best,
           af[0] / as[0] * 1e-9, (long long)(c.B * c.S), (long long)c.G[0], as[1], 100 * as[1] / best, af[1] / as[1] * 1e-9,
           (long long)c.valid, as[2], 100 * as[2] / best, af[2] / as[2] * 1e-9);
    cJSON_AddNumberToObject(root, "difflet_step_s", best);
    cJSON_AddNumberToObject(root, "difflet_load_s", load_s);
    cJSON_AddNumberToObject(root, "difflet_gflops", gf);
    cJSON_AddNumberToObject(root, "matmul_gflops", peak);
    cJSON_AddNumberToObject(root, "fraction_of_matmul_peak", gf / peak);
    cJSON_AddNumberToObject(root, "step_gflop", flops * 1e-9);
    cJSON_AddNumberToObject(root, "difflet_peak_rss_mib", rss_peak);
    cJSON *pjs = cJSON_AddObjectToObject(root, "phases_s");
    static const char *const keys[NMARK] = {"conditioning", "caption_projection", "patch_embedding", "spatial_block",
                                            "temporal_block", "final_layer"};
    for (int i = 0; i < NMARK; i++) cJSON_AddNumberToObject(pjs, keys[i], ph[i]);
    cJSON *ajs = cJSON_AddObjectToObject(root, "attention_kernels_s");
    cJSON_AddNumberToObject(ajs, "spatial", as[0]);
    cJSON_AddNumberToObject(ajs, "temporal", as[1]);
    cJSON_AddNumberToObject(ajs, "cross", as[2]);
    cJSON_AddNumberToObject(root, "attention_share", (as[0] + as[1] + as[2]) / best);
    /* the peer */
    pj = peer_ready() ? bench_run_peer("stdit_step_peer.py", dir, reps, warm, dt) : NULL;
    if (!pj) {
        cJSON_AddNullToObject(root, "peer_step_s");
    } else {
        const double peer = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(pj, "step_s"));
        const double prss = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(pj, "peak_rss_mib"));
        snprintf(path, sizeof path, "%s/peer_out.safetensors", dir);
        const double rel = bench_rel_diff(path, out, 2 * nout);
        printf("  torch peer (tools/bench/stdit_step_peer.py: our plain-torch transcription of STDiT3, SDPA attention,\n"
               "            checked against Open-Sora's own outputs by its --check): step %.3f s (best of %d, %d warm-up;\n"
               "            torch %s, %d threads), peak RSS %.0f MiB (its process)\n",
               peer, reps, warm, cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(pj, "torch")), dl_threads(), prss);
        printf("  difflet / torch step time: %.3f (difflet %.2f x faster; goal >= 1.5); outputs (both branches) differ by\n"
               "            %.3g of max|torch|\n",
               best / peer, peer / best, rel);
        cJSON_AddStringToObject(root, "peer", "tools/bench/stdit_step_peer.py (torch transcription, checked against Open-Sora's outputs)");
        cJSON_AddNumberToObject(root, "peer_step_s", peer);
        cJSON_AddNumberToObject(root, "speedup_vs_peer", peer / best);
        cJSON_AddNumberToObject(root, "output_rel_diff", rel);
        cJSON_AddNumberToObject(root, "peer_peak_rss_mib", prss);
    }
    rc = 0;
    if (json_path && bench_write_json(root, json_path) != DL_OK) rc = 1;
done:
    dl_stdit3_free(m);
    dl_model_dir_free(md);
    cJSON_Delete(pj);
    cJSON_Delete(root);
    free(lat), free(cap), free(out);
    bench_remove_dir(dir);
    return rc;
}
