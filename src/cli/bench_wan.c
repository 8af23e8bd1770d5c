/* `difflet bench wan-step`: one denoiser step of a Wan-2.1-1.3B-width transformer
 * (dim 1536, 12 heads x 128, FFN 8960, text_dim 4096, freq_dim 256, 16 -> 16
 * channels, patch (1, 2, 2), ONE block, random weights) for an 81-frame 480x832
 * video (latent 21 x 60 x 104: 32,760 video tokens) and 512 text tokens, timed in
 * difflet and, in the same run, in diffusers' WanTransformer3DModel (num_layers=1)
 * on the same weights and inputs (torch CPU, the same dtype and thread count; needs
 * the tools virtualenv). The dtype is the engine's default on this CPU (bf16 with
 * AVX512_BF16, else f32) or --dtype, as flux-step chooses.
 *
 * Reports the step-time ratio, difflet's effective GFLOP/s (FLOPs counted: every
 * linear 2 M K N, self-attention 4 N^2 D, cross-attention 4 N T D, the patch conv
 * and the embedders) as a fraction of a same-run matmul (difflet's: OpenBLAS or oneDNN) in that dtype, the
 * share of the step spent in the self-attention kernel and sublayer (wan.h's phase
 * timer), the outputs' difference, peak RSS, and (--json) the machine.
 *
 * Then the Wan 2.1 VAE decoder (its real config, random weights) built for the same
 * latent (--no-vae skips it): its planned activation + cache bytes (measured: what
 * the load allocated) against the same plan for all frames in one chunk (computed
 * here by mirroring wan_vae.c's planning, checked by computing the chunked plan the
 * same way and comparing it with the measured number), the RSS after the load, and
 * the time of the first and of a later latent-frame chunk (a 2-latent-frame decoder
 * of the same size: each chunk does the work it does in the long video) when the
 * computed chunk FLOPs at the same-run matmul peak fit in ~2 minutes (or with
 * --vae-time). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "difflet/check.h"
#include "difflet/models.h"
#include "difflet/wan.h"
#include "difflet/wan_vae.h"

typedef struct {
    int64_t D, H, Dh, F, Td, freq, Cin, Cout, P[3], lat[3], T;
} wan_cfg;

/* ---- random-weight folders ------------------------------------------------------- */

/* dir/model_index.json (a WanPipeline with the components written) */
static dl_status make_index(const char *dir, int vae) {
    char path[4200];
    snprintf(path, sizeof path, "%s/model_index.json", dir);
    return bench_write_text(path, vae ? "{\"_class_name\": \"WanPipeline\", \"transformer\": [\"diffusers\", \"WanTransformer3DModel\"], "
                                        "\"vae\": [\"diffusers\", \"AutoencoderKLWan\"]}"
                                      : "{\"_class_name\": \"WanPipeline\", \"transformer\": [\"diffusers\", \"WanTransformer3DModel\"]}");
}

static dl_status make_transformer(const char *dir, const wan_cfg *c) {
    char path[4200], cfg[1024];
    snprintf(path, sizeof path, "%s/transformer", dir);
    dl_status s = dl_mkdir_p(path);
    if (s != DL_OK) return s;
    snprintf(cfg, sizeof cfg,
             "{\"_class_name\": \"WanTransformer3DModel\", \"patch_size\": [%lld, %lld, %lld], \"num_attention_heads\": %lld, "
             "\"attention_head_dim\": %lld, \"in_channels\": %lld, \"out_channels\": %lld, \"text_dim\": %lld, "
             "\"freq_dim\": %lld, \"ffn_dim\": %lld, \"num_layers\": 1, \"cross_attn_norm\": true, "
             "\"qk_norm\": \"rms_norm_across_heads\", \"eps\": 1e-06, \"image_dim\": null, \"added_kv_proj_dim\": null, "
             "\"rope_max_seq_len\": 1024}",
             (long long)c->P[0], (long long)c->P[1], (long long)c->P[2], (long long)c->H, (long long)c->Dh,
             (long long)c->Cin, (long long)c->Cout, (long long)c->Td, (long long)c->freq, (long long)c->F);
    snprintf(path, sizeof path, "%s/transformer/config.json", dir);
    if ((s = bench_write_text(path, cfg)) != DL_OK) return s;
    bench_wgen g;
    bench_wgen_init(&g, 100);
    const int64_t D = c->D, PP = c->P[0] * c->P[1] * c->P[2];
    const int64_t sst[3] = {1, 2, D}, bsst[3] = {1, 6, D}, pe[5] = {D, c->Cin, c->P[0], c->P[1], c->P[2]};
    const char *b = "blocks.0.";
    bench_put(&g, "scale_shift_table", 3, sst);
    bench_put_wb(&g, "", "patch_embedding", 5, pe);
    bench_put_lin(&g, "condition_embedder.", "time_embedder.linear_1", D, c->freq);
    bench_put_lin(&g, "condition_embedder.", "time_embedder.linear_2", D, D);
    bench_put_lin(&g, "condition_embedder.", "time_proj", 6 * D, D);
    bench_put_lin(&g, "condition_embedder.", "text_embedder.linear_1", D, c->Td);
    bench_put_lin(&g, "condition_embedder.", "text_embedder.linear_2", D, D);
    bench_put(&g, "blocks.0.scale_shift_table", 3, bsst);
    static const char *sq[] = {"attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0",
                               "attn2.to_q", "attn2.to_k", "attn2.to_v", "attn2.to_out.0"};
    for (size_t i = 0; i < sizeof sq / sizeof sq[0]; i++) bench_put_lin(&g, b, sq[i], D, D);
    static const char *nv[] = {"attn1.norm_q.weight", "attn1.norm_k.weight", "attn2.norm_q.weight",
                               "attn2.norm_k.weight", "norm2.weight"};
    for (size_t i = 0; i < sizeof nv / sizeof nv[0]; i++) bench_put_vec(&g, b, nv[i], D);
    const int64_t vd[1] = {D};
    bench_put_gamma(&g, "blocks.0.norm2.bias", 1, vd); /* 1 + U(+-0.1): the values this bench has always had */
    bench_put_lin(&g, b, "ffn.net.0.proj", c->F, D);
    bench_put_lin(&g, b, "ffn.net.2", D, c->F);
    bench_put_lin(&g, "", "proj_out", c->Cout * PP, D);
    snprintf(path, sizeof path, "%s/transformer/diffusion_pytorch_model.safetensors", dir);
    return bench_wgen_save(&g, path);
}

/* ---- the Wan 2.1 VAE decoder: its real config and its planning, mirrored ------------ */

enum { VAE_LEV = 4 };
static const int64_t vae_zd = 16, vae_nrb = 2;
static const int64_t vae_dims[VAE_LEV + 1] = {384, 384, 384, 192, 96}; /* base 96 x [4, 4, 4, 2, 1] */
static const int vae_tup[VAE_LEV - 1] = {1, 1, 0};                      /* temperal_downsample reversed */

static dl_status make_vae(const char *dir) {
    char path[4200], p[256], q[300];
    snprintf(path, sizeof path, "%s/vae", dir);
    dl_status s = dl_mkdir_p(path);
    if (s != DL_OK) return s;
    snprintf(path, sizeof path, "%s/vae/config.json", dir);
    if ((s = bench_write_text(path, "{\"_class_name\": \"AutoencoderKLWan\", \"base_dim\": 96, \"z_dim\": 16, \"dim_mult\": [1, 2, 4, 4], "
                                    "\"num_res_blocks\": 2, \"attn_scales\": [], \"temperal_downsample\": [false, true, true], "
                                    "\"dropout\": 0.0}")) != DL_OK) /* latents_mean / std: the defaults */
        return s;
    bench_wgen g;
    bench_wgen_init(&g, 5000);
    const int64_t zd = vae_zd, d0 = vae_dims[0];
#define CONV3(base, co, ci, kt, ks)                          \
    do {                                                     \
        int64_t sh_[5] = {co, ci, kt, ks, ks};               \
        bench_put_wb(&g, "", base, 5, sh_);                  \
    } while (0)
#define GAMMA(base, ch, nd)                                  \
    do {                                                     \
        int64_t sh_[4] = {ch, 1, 1, 1};                      \
        snprintf(q, sizeof q, "%s.gamma", base);             \
        bench_put_gamma(&g, q, nd, sh_);                     \
    } while (0)
    CONV3("post_quant_conv", zd, zd, 1, 1);
    CONV3("decoder.conv_in", d0, zd, 3, 3);
    for (int b = -1; b < VAE_LEV; b++) { /* -1: the mid block */
        const int64_t cin = b < 0 ? d0 : b > 0 ? vae_dims[b] / 2 : vae_dims[b], oc = b < 0 ? d0 : vae_dims[b + 1];
        for (int j = 0; j <= (b < 0 ? 1 : vae_nrb); j++) {
            const int64_t ci = j == 0 ? cin : oc;
            char r[160];
            if (b < 0) snprintf(r, sizeof r, "decoder.mid_block.resnets.%d", j);
            else snprintf(r, sizeof r, "decoder.up_blocks.%d.resnets.%d", b, j);
            snprintf(p, sizeof p, "%s.norm1", r);
            GAMMA(p, ci, 4);
            snprintf(p, sizeof p, "%s.norm2", r);
            GAMMA(p, oc, 4);
            snprintf(p, sizeof p, "%s.conv1", r);
            CONV3(p, oc, ci, 3, 3);
            snprintf(p, sizeof p, "%s.conv2", r);
            CONV3(p, oc, oc, 3, 3);
            if (ci != oc) {
                snprintf(p, sizeof p, "%s.conv_shortcut", r);
                CONV3(p, oc, ci, 1, 1);
            }
        }
        if (b < 0) {
            int64_t qkv[4] = {3 * d0, d0, 1, 1}, pr[4] = {d0, d0, 1, 1};
            GAMMA("decoder.mid_block.attentions.0.norm", d0, 3);
            bench_put_wb(&g, "decoder.mid_block.attentions.0.", "to_qkv", 4, qkv);
            bench_put_wb(&g, "decoder.mid_block.attentions.0.", "proj", 4, pr);
        } else if (b < VAE_LEV - 1) {
            int64_t rs[4] = {oc / 2, oc, 3, 3};
            snprintf(p, sizeof p, "decoder.up_blocks.%d.upsamplers.0.resample.1", b);
            bench_put_wb(&g, "", p, 4, rs);
            if (vae_tup[b]) {
                snprintf(p, sizeof p, "decoder.up_blocks.%d.upsamplers.0.time_conv", b);
                CONV3(p, 2 * oc, oc, 3, 1);
            }
        }
    }
    GAMMA("decoder.norm_out", vae_dims[VAE_LEV], 4);
    CONV3("decoder.conv_out", 3, vae_dims[VAE_LEV], 3, 3);
#undef CONV3
#undef GAMMA
    snprintf(path, sizeof path, "%s/vae/diffusion_pytorch_model.safetensors", dir);
    return bench_wgen_save(&g, path);
}

/* The decoder's activation plan as wan_vae.c makes it, for tc[l] frames per pass at
 * level l (a chunk: 1, 2, 4, 4; the whole latent at once: F, 2F - 1, 4F - 3, 4F - 3):
 * the largest x / p / y / s / nrm buffers, the attention scratch, and (with caches)
 * each causal conv's two cached input frames. Bytes into *arena, *cache. */
static void vae_plan(dl_dtype dt, int64_t h0, int64_t w0, const int64_t tc[VAE_LEV], int caches, size_t *arena,
                     size_t *cache) {
    const size_t es = dl_dtype_size(dt);
    size_t x = 0, p = 0, y = 0, s = 0, nrm = 0, cb = 0;
    int64_t hw[VAE_LEV];
    for (int l = 0; l < VAE_LEV; l++) hw[l] = (h0 << l) * (w0 << l);
#define GROW(v, n) (v = v > (size_t)(n) ? v : (size_t)(n))
#define CCONV(ci, co, l)                                                                \
    do {                                                                                \
        if (caches) cb += dl_align_up((size_t)((ci) * 2 * hw[l]) * es, DL_ALIGN);       \
        GROW(p, (ci) * (2 + tc[l]) * hw[l]);                                            \
        GROW(y, (co) * tc[l] * hw[l]);                                                  \
    } while (0)
#define RES(ci, co, l)                                                                  \
    do {                                                                                \
        CCONV(ci, co, l);                                                               \
        CCONV(co, co, l);                                                               \
        GROW(x, ((ci) > (co) ? (ci) : (co)) * tc[l] * hw[l]);                           \
        GROW(nrm, tc[l] * hw[l]);                                                       \
        if ((ci) != (co)) GROW(p, (ci) * tc[l] * hw[l]), GROW(s, (co) * tc[l] * hw[l]);   \
    } while (0)
    const int64_t d0 = vae_dims[0];
    GROW(s, vae_zd * tc[0] * hw[0]); /* post_quant_conv input */
    CCONV(vae_zd, d0, 0);
    GROW(x, d0 * tc[0] * hw[0]);
    RES(d0, d0, 0);
    RES(d0, d0, 0);
    GROW(p, d0 * hw[0]), GROW(y, 3 * d0 * hw[0]), GROW(s, 3 * d0 * hw[0]); /* attention, a frame at a time */
    for (int b = 0; b < VAE_LEV; b++) {
        const int64_t cin = b > 0 ? vae_dims[b] / 2 : vae_dims[b], oc = vae_dims[b + 1];
        for (int j = 0; j <= vae_nrb; j++) RES(j == 0 ? cin : oc, oc, b);
        if (b == VAE_LEV - 1) break;
        if (vae_tup[b]) CCONV(oc, 2 * oc, b);
        GROW(y, oc * tc[b] * hw[b]), GROW(p, oc * hw[b + 1]), GROW(s, oc / 2 * hw[b + 1]);
        GROW(x, oc / 2 * tc[b + 1] * hw[b + 1]);
    }
    CCONV(vae_dims[VAE_LEV], 3, VAE_LEV - 1);
#undef RES
#undef CCONV
#undef GROW
    const int64_t st = 3 * d0;
    dl_attn_args a = {.dt = dt, .sq = hw[0], .sk = hw[0], .heads = 1, .head_dim = d0, .q_stride = st, .k_stride = st,
                      .v_stride = st, .kv_end = hw[0]};
    *arena = dl_align_up(x * 4, DL_ALIGN) + dl_align_up(p * es, DL_ALIGN) + dl_align_up(y * es, DL_ALIGN) +
             dl_align_up(s * es, DL_ALIGN) + dl_align_up(nrm * 4, DL_ALIGN) +
             dl_align_up(dl_attn_scratch_bytes(&a, dl_threads()) + 64, DL_ALIGN);
    *cache = cb;
}

/* FLOPs of one latent-frame chunk (first: the first chunk, whose convolutions run over
 * the later chunks' frame count but whose attention, time_conv and resample touch its
 * one real frame), 2 per multiply-add, convolutions and attention only. */
static double vae_chunk_flops(int64_t h0, int64_t w0, int first) {
    const int64_t tc[VAE_LEV] = {1, 2, 4, 4};
    double f = 0, hw[VAE_LEV];
    for (int l = 0; l < VAE_LEV; l++) hw[l] = (double)((h0 << l) * (w0 << l));
    const double d0 = (double)vae_dims[0], zd = (double)vae_zd;
#define CONV(ci, co, kvol, frames, l) (f += 2.0 * (double)(ci) * (double)(co) * (kvol) * (double)(frames) * hw[l])
#define RES(ci, co, l)                                                 \
    do {                                                               \
        CONV(ci, co, 27, tc[l], l);                                    \
        CONV(co, co, 27, tc[l], l);                                    \
        if ((ci) != (co)) CONV(ci, co, 1, tc[l], l);                   \
    } while (0)
    CONV(zd, zd, 1, 1, 0);
    CONV(zd, d0, 27, 1, 0);
    RES(d0, d0, 0);
    f += 2.0 * d0 * 3 * d0 * hw[0] + 4.0 * hw[0] * hw[0] * d0 + 2.0 * d0 * d0 * hw[0]; /* mid attention, one frame */
    RES(d0, d0, 0);
    int64_t T = 1; /* real frames at the current level */
    for (int b = 0; b < VAE_LEV; b++) {
        const int64_t cin = b > 0 ? vae_dims[b] / 2 : vae_dims[b], oc = vae_dims[b + 1];
        for (int j = 0; j <= vae_nrb; j++) RES(j == 0 ? cin : oc, oc, b);
        if (b == VAE_LEV - 1) break;
        if (vae_tup[b] && !first) {
            CONV(oc, 2 * oc, 3, T, b);
            T *= 2;
        }
        CONV(oc, oc / 2, 9, T, b + 1);
    }
    CONV(vae_dims[VAE_LEV], 3, 27, tc[VAE_LEV - 1], VAE_LEV - 1);
#undef RES
#undef CONV
    return f;
}

/* ---- measuring ------------------------------------------------------------------- */

/* FLOPs of one step: every linear 2 M K N, self-attention 4 N^2 D (q k^T and p v),
 * cross-attention 4 N T D, the patch conv (2 N (Cin prod(P)) D) and the embedders */
static double step_flops(const wan_cfg *c, double *self_attn) {
    const double D = (double)c->D, F = (double)c->F, T = (double)c->T, PP = (double)(c->P[0] * c->P[1] * c->P[2]);
    const double N = (double)(c->lat[0] / c->P[0] * (c->lat[1] / c->P[1]) * (c->lat[2] / c->P[2]));
    double emb = 2 * N * (double)c->Cin * PP * D + 2 * ((double)c->freq * D + D * D + D * 6 * D) +
                 2 * T * ((double)c->Td * D + D * D);
    double blk = 2 * N * D * (3 * D + D) + 4 * N * N * D       /* self-attention */
                 + 2 * N * D * D + 2 * T * D * 2 * D + 2 * N * D * D + 4 * N * T * D /* cross-attention */
                 + 2 * N * D * F * 2;                           /* feed-forward */
    *self_attn = 4 * N * N * D;
    return emb + blk + 2 * N * D * (double)c->Cout * PP;
}

typedef struct {
    double t0, t[2];
} chunk_clock;

static void on_chunk(void *ctx, int done, int total) {
    (void)total;
    chunk_clock *c = ctx;
    double now = dl_now();
    if (done <= 2) c->t[done - 1] = now - c->t0;
    c->t0 = now;
}

/* The VAE part: measured allocation and RSS of the decoder built for the latent,
 * the computed single-chunk plan, and (when affordable) two chunks' times. */
static int bench_vae(dl_model_dir *md, const wan_cfg *c, dl_dtype dt, double peak, int force_time, cJSON *root) {
    const int64_t F = c->lat[0], h = c->lat[1], w = c->lat[2];
    const double mib = 1024.0 * 1024.0;
    cJSON *vj = cJSON_AddObjectToObject(root, "vae");
    printf("  VAE: Wan 2.1 decoder (base_dim 96, z_dim 16, dim_mult [1, 2, 4, 4], 2 res blocks, random weights), %s,\n"
           "       latent %lld x %lld x %lld -> %lld frames of %lld x %lld\n",
           dl_dtype_name(dt), (long long)F, (long long)h, (long long)w, (long long)(1 + (F - 1) * 4), (long long)(h * 8),
           (long long)(w * 8));
    double r0, p0, r1, p1;
    int reset = bench_rss_reset();
    bench_rss_mib(&r0, &p0);
    dl_wan_vae *v = NULL;
    double t0 = dl_now();
    if (dl_wan_vae_load(&v, md, "vae", F, h, w, dt, NULL) != DL_OK) {
        fprintf(stderr, "difflet: bench: VAE: %s\n", dl_last_error());
        return 0;
    }
    const double load_s = dl_now() - t0;
    bench_rss_mib(&r1, &p1);
    const size_t act = dl_wan_vae_activation_bytes(v);
    dl_wan_vae_free(v);
    const int64_t tcc[VAE_LEV] = {1, 2, 4, 4}, tca[VAE_LEV] = {F, 2 * F - 1, 4 * F - 3, 4 * F - 3};
    size_t ca, cc, ua, uc;
    vae_plan(dt, h, w, tcc, 1, &ca, &cc);
    vae_plan(dt, h, w, tca, 0, &ua, &uc);
    printf("    measured: dl_wan_vae_activation_bytes %.1f MiB (one chunk's activations + feature caches, allocated at load in %.1f s)\n"
           "    measured: RSS %.0f MiB before the load, %.0f MiB after it, peak %.0f MiB%s\n"
           "    computed: wan_vae.c's plan mirrored here, one chunk: %.1f MiB activations + %.1f MiB caches = %.1f MiB (%s the measured)\n"
           "    computed: the same plan for all %lld latent frames in one pass (frames per level %lld/%lld/%lld/%lld, no caches): %.1f MiB = %.1f x chunked\n",
           act / mib, load_s, r0, r1, p1, reset ? " since the load began" : " since the process began (clear_refs refused)",
           ca / mib, cc / mib, (ca + cc) / mib, ca + cc == act ? "equals" : "DIFFERS FROM", (long long)F, (long long)tca[0],
           (long long)tca[1], (long long)tca[2], (long long)tca[3], (ua + uc) / mib, (double)(ua + uc) / (double)act);
    cJSON_AddNumberToObject(vj, "activation_bytes_measured", (double)act);
    cJSON_AddNumberToObject(vj, "activation_bytes_chunked_computed", (double)(ca + cc));
    cJSON_AddNumberToObject(vj, "activation_bytes_unchunked_computed", (double)(ua + uc));
    cJSON_AddNumberToObject(vj, "rss_before_load_mib", r0);
    cJSON_AddNumberToObject(vj, "rss_after_load_mib", r1);
    cJSON_AddNumberToObject(vj, "peak_rss_mib", p1);
    cJSON_AddBoolToObject(vj, "peak_rss_since_load", reset);
    const double f0 = vae_chunk_flops(h, w, 1), f1 = vae_chunk_flops(h, w, 0);
    cJSON_AddNumberToObject(vj, "first_chunk_gflop_computed", f0 * 1e-9);
    cJSON_AddNumberToObject(vj, "later_chunk_gflop_computed", f1 * 1e-9);
    const double est = (f0 + f1) / (peak * 1e9);
    if (!force_time && !(est / 2 <= 120.0)) {
        printf("    chunk time: not measured: computed %.2f + %.2f TFLOP for the first and a later chunk, at least %.0f s each at the\n"
               "      same-run matmul peak (over ~2 minutes; --vae-time measures it anyway)\n",
               f0 * 1e-12, f1 * 1e-12, est / 2);
        cJSON_AddNullToObject(vj, "first_chunk_s");
        cJSON_AddNullToObject(vj, "later_chunk_s");
        return 1;
    }
    /* a 2-latent-frame decoder of the same size: its chunks are the long video's first and second */
    const int64_t hw = h * w;
    float *z = malloc((size_t)(vae_zd * 2 * hw) * 4), *video = malloc((size_t)(3 * 5 * hw * 64) * 4);
    chunk_clock ck = {0};
    int ok = 0;
    if (z && video && dl_wan_vae_load(&v, md, "vae", 2, h, w, dt, NULL) == DL_OK) {
        dl_randn(77, z, vae_zd * 2 * hw);
        ck.t0 = dl_now();
        ok = dl_wan_vae_decode(v, z, video, on_chunk, &ck) == DL_OK;
        dl_wan_vae_free(v);
    }
    free(z), free(video);
    if (!ok) {
        fprintf(stderr, "difflet: bench: VAE decode: %s\n", dl_last_error());
        return 0;
    }
    printf("    measured: first chunk %.2f s (1 frame out; computed %.2f TFLOP = %.0f GFLOP/s), later chunk %.2f s (4 frames out;\n"
           "      computed %.2f TFLOP = %.0f GFLOP/s), by a 2-latent-frame decoder of this size\n",
           ck.t[0], f0 * 1e-12, f0 / ck.t[0] * 1e-9, ck.t[1], f1 * 1e-12, f1 / ck.t[1] * 1e-9);
    cJSON_AddNumberToObject(vj, "first_chunk_s", ck.t[0]);
    cJSON_AddNumberToObject(vj, "later_chunk_s", ck.t[1]);
    return 1;
}

int cli_bench_wan(int argc, char **argv) {
    const char *json_path = NULL;
    int quick = 0, vae = 1, vae_time = 0, n = 0;
    dl_dtype dt;
    char **rest = calloc((size_t)argc + 1, sizeof *rest);
    if (!rest) return 1;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--no-vae")) vae = 0;
        else if (!strcmp(argv[i], "--vae-time")) vae_time = 1;
        else rest[n++] = argv[i];
    }
    int ok = bench_opts(n, rest, "wan-step", &json_path, &quick, &dt);
    free(rest);
    if (!ok) return 2;
    wan_cfg c = {.D = 1536, .H = 12, .Dh = 128, .F = 8960, .Td = 4096, .freq = 256, .Cin = 16, .Cout = 16,
                 .P = {1, 2, 2}, .lat = {21, 60, 104}, .T = 512};
    /* one timed run; --quick after a warm-up run (a full step takes minutes on a few
     * cores, against which a first run's page faults and allocations are noise) */
    int reps = 1, warm = 0;
    if (quick) c.lat[0] = 3, c.lat[1] = c.lat[2] = 16, c.T = 128, warm = 1;
    const int64_t N = c.lat[0] / c.P[0] * (c.lat[1] / c.P[1]) * (c.lat[2] / c.P[2]), nlat = c.Cin * c.lat[0] * c.lat[1] * c.lat[2];
    char dir[] = "/tmp/difflet-bench-wan-XXXXXX", path[4200];
    if (!mkdtemp(dir)) {
        fprintf(stderr, "difflet: bench: cannot create a temporary folder\n");
        return 1;
    }
    int rc = 1;
    float *lat = malloc((size_t)nlat * 4), *txt = malloc((size_t)(c.T * c.Td) * 4), *out = malloc((size_t)nlat * 4);
    cJSON *root = cJSON_CreateObject(), *pj = NULL;
    dl_model_dir *md = NULL;
    dl_wan *m = NULL;
    printf("difflet bench wan-step: Wan 2.1 1.3B width (dim %lld, %lld heads x %lld, FFN %lld, text_dim %lld), 1 block,\n"
           "  latent %lld x %lld x %lld = %lld video tokens + %lld text tokens, %s, %d threads\n"
           "  on %s: kernels %s, matmul %s (oneDNN %s)\n",
           (long long)c.D, (long long)c.H, (long long)c.Dh, (long long)c.F, (long long)c.Td, (long long)c.lat[0],
           (long long)c.lat[1], (long long)c.lat[2], (long long)N, (long long)c.T, dl_dtype_name(dt), dl_threads(),
           dl_cpu_model(), dl_isa_name(dl_kernel_isa()), dl_onednn_isa(), dl_onednn_version());
    bench_machine_json(root);
    cJSON_AddStringToObject(root, "dtype", dl_dtype_name(dt));
    cJSON_AddNumberToObject(root, "video_tokens", (double)N);
    cJSON_AddNumberToObject(root, "text_tokens", (double)c.T);
    cJSON_AddNumberToObject(root, "timed_runs", reps);
    cJSON_AddNumberToObject(root, "warmup_runs", warm);
    {
        dl_attn_args probe = {.dt = dt, .sq = N, .sk = N, .heads = c.H, .head_dim = c.Dh};
        cJSON_AddStringToObject(root, "attention_path", dl_attn_path_name(&probe));
    }
    fflush(stdout);
    if (!lat || !txt || !out) goto done;
    if (make_index(dir, vae) != DL_OK || make_transformer(dir, &c) != DL_OK || (vae && make_vae(dir) != DL_OK)) {
        fprintf(stderr, "difflet: bench: %s\n", dl_last_error());
        goto done;
    }
    dl_randn(1, lat, nlat);
    dl_fill_uniform(DL_F32, txt, c.T * c.Td, -1.f, 1.f, 2);
    float ts = 700.f;
    {
        dl_st_writer *w = dl_st_writer_new();
        int64_t sl[4] = {c.Cin, c.lat[0], c.lat[1], c.lat[2]}, st[2] = {c.T, c.Td}, s1[1] = {1};
        dl_st_writer_add(w, "latents", DL_ST_F32, 4, sl, lat);
        dl_st_writer_add(w, "prompt_embeds", DL_ST_F32, 2, st, txt);
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
    if (dl_model_dir_open(&md, dir) != DL_OK ||
        dl_wan_load(&m, md, "transformer", c.lat[0], c.lat[1], c.lat[2], c.T, dt, NULL, NULL) != DL_OK) {
        fprintf(stderr, "difflet: bench: %s\n", dl_last_error());
        goto done;
    }
    double load_s = dl_now() - t0, best = INFINITY;
    dl_wan_phase_times ph = {0}, best_ph = {0};
    dl_wan_set_phase_times(m, &ph);
    for (int i = 0; i < warm + reps; i++) {
        memset(&ph, 0, sizeof ph);
        t0 = dl_now();
        if (dl_wan_run(m, lat, txt, ts, out) != DL_OK) {
            fprintf(stderr, "difflet: bench: %s\n", dl_last_error());
            goto done;
        }
        double t = dl_now() - t0;
        if (i >= warm && t < best) best = t, best_ph = ph;
    }
    bench_rss_mib(&rss0, &rss_peak);
    double sa_flops, flops = step_flops(&c, &sa_flops), gf = flops / best * 1e-9;
    const double peak = bench_matmul_peak(dt, quick ? 1024 : 4096, 1536, 8960);
    printf("  FLOPs per step (counted): %.1f GFLOP, of which self-attention 4 N^2 D = %.1f GFLOP\n", flops * 1e-9,
           sa_flops * 1e-9);
    printf("  difflet:  load %.1f s, step %.3f s (best of %d, %d warm-up), %.0f GFLOP/s effective = %.2f x the same-run\n"
           "            %s matmul (%.0f GFLOP/s at %dx1536x8960), peak RSS %.0f MiB%s\n",
           load_s, best, reps, warm, gf, gf / peak, bench_matmul_label(), peak, quick ? 1024 : 4096, rss_peak,
           reset ? " (since the load)" : " (since the process began)");
    printf("  difflet step by phase: self-attention kernel %.3f s = %.1f%% of the step (%.0f GFLOP/s on its 4 N^2 D);\n"
           "            self-attention sublayer %.3f s (%.1f%%), cross-attention %.3f s (%.1f%%), FFN %.3f s (%.1f%%),\n"
           "            embedders + output %.3f s (%.1f%%)\n",
           best_ph.self_attn_s, 100 * best_ph.self_attn_s / best_ph.total_s, sa_flops / best_ph.self_attn_s * 1e-9,
           best_ph.self_s, 100 * best_ph.self_s / best_ph.total_s, best_ph.cross_s, 100 * best_ph.cross_s / best_ph.total_s,
           best_ph.ffn_s, 100 * best_ph.ffn_s / best_ph.total_s,
           best_ph.total_s - best_ph.self_s - best_ph.cross_s - best_ph.ffn_s,
           100 * (best_ph.total_s - best_ph.self_s - best_ph.cross_s - best_ph.ffn_s) / best_ph.total_s);
    cJSON_AddNumberToObject(root, "difflet_step_s", best);
    cJSON_AddNumberToObject(root, "difflet_gflops", gf);
    cJSON_AddNumberToObject(root, "matmul_gflops", peak);
    cJSON_AddNumberToObject(root, "fraction_of_matmul_peak", gf / peak);
    cJSON_AddNumberToObject(root, "step_gflop", flops * 1e-9);
    cJSON_AddNumberToObject(root, "self_attention_gflop", sa_flops * 1e-9);
    cJSON_AddNumberToObject(root, "attention_share", best_ph.self_attn_s / best_ph.total_s);
    cJSON_AddNumberToObject(root, "self_attention_kernel_s", best_ph.self_attn_s);
    cJSON_AddNumberToObject(root, "self_attention_sublayer_s", best_ph.self_s);
    cJSON_AddNumberToObject(root, "cross_attention_sublayer_s", best_ph.cross_s);
    cJSON_AddNumberToObject(root, "ffn_sublayer_s", best_ph.ffn_s);
    cJSON_AddNumberToObject(root, "difflet_peak_rss_mib", rss_peak);
    dl_wan_free(m);
    m = NULL;
    /* the peer */
    pj = bench_run_peer("wan_step_peer.py", dir, reps, warm, dt);
    if (!pj) {
        cJSON_AddNullToObject(root, "diffusers_step_s");
    } else {
        const double peer = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(pj, "step_s"));
        const double prss = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(pj, "peak_rss_mib"));
        snprintf(path, sizeof path, "%s/peer_out.safetensors", dir);
        const double rel = bench_rel_diff(path, out, nlat);
        printf("  diffusers: step %.3f s (best of %d, %d warm-up; torch %s, %d threads), peak RSS %.0f MiB (its process)\n",
               peer, reps, warm, cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(pj, "torch")), dl_threads(), prss);
        printf("  difflet / diffusers step time: %.3f (difflet %.2f x faster; goal >= 1.5); outputs differ by %.3g of max|diffusers|\n",
               best / peer, peer / best, rel);
        cJSON_AddNumberToObject(root, "diffusers_step_s", peer);
        cJSON_AddNumberToObject(root, "speedup_vs_diffusers", peer / best);
        cJSON_AddNumberToObject(root, "output_rel_diff", rel);
        cJSON_AddNumberToObject(root, "diffusers_peak_rss_mib", prss);
    }
    if (vae && !bench_vae(md, &c, dt, peak, vae_time, root)) goto done;
    rc = 0;
    if (json_path && bench_write_json(root, json_path) != DL_OK) rc = 1;
done:
    dl_wan_free(m);
    dl_model_dir_free(md);
    cJSON_Delete(pj);
    cJSON_Delete(root);
    free(lat), free(txt), free(out);
    bench_remove_dir(dir);
    return rc;
}
