/* `difflet bench hunyuan-step`: one denoiser step of a HunyuanVideo-width transformer
 * (dim 3072 = 24 heads x 128, text_embed_dim 4096, pooled 768, 16 -> 16 channels,
 * patch (1, 2, 2), rope_axes_dim (16, 56, 56), guidance embedded, the 2-block token
 * refiner, ONE dual-stream and ONE single-stream block, random bf16 weights) on a
 * latent grid of 10 frames x 64 x 64 (37 frames at 512 x 512: 10 x 32 x 32 = 10,240
 * video tokens) and 256 text rows, all of them valid. diffusers'
 * HunyuanVideoTransformer3DModel (num_layers=1, num_single_layers=1, the same weights
 * and inputs, torch CPU, the same dtype and thread count; needs the tools virtualenv)
 * is called as HunyuanVideoPipeline calls it: the 256 rows with their attention mask,
 * the pooled CLIP vector, timestep t and guidance g x 1000. The dtype is the engine's
 * default on this CPU (bf16 with AVX512_BF16, else f32) or --dtype, as qwen-step
 * chooses.
 *
 * Reports the step-time ratio, difflet's effective GFLOP/s (the step's useful FLOPs,
 * step_flops below) as a fraction of a same-run oneDNN matmul in that dtype, the
 * attention share (a standalone attention call of the blocks' shapes, timed after the
 * step and counted once per block: the kernel sits in dit.c's shared blocks, which
 * have no phase clock), the outputs' difference, peak RSS, and (--json) the machine.
 * Not measured here: the encoders' share of a resident request (another measurement
 * adds its own lines and JSON keys). --quick: latent 2 x 32 x 32 (512 video tokens),
 * 64 text rows (40 valid, so the masked paths run too). DIFFLET_BENCH_PEER=off skips
 * the peer. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "difflet/check.h"
#include "difflet/hunyuan.h"

typedef struct {
    int64_t D, H, Dh, Td, Pd, Cin, Cout, R; /* R: token refiner blocks */
    int64_t lat[3], P[3];                    /* latent grid (F, H, W), patch (pt, p, p) */
    int64_t T, L;                            /* text rows in the program, valid of them */
} hv_cfg;

static int64_t video_tokens(const hv_cfg *c) {
    return c->lat[0] / c->P[0] * (c->lat[1] / c->P[1]) * (c->lat[2] / c->P[2]);
}

/* ---- the random-weight folder ----------------------------------------------------- */

/* A safetensors writer and the bf16 buffers it points into until saved. */
typedef struct {
    dl_st_writer *w;
    void **keep;
    int n, cap;
    uint64_t seed;
    dl_status s;
} wgen;

/* random bf16 tensor of `nd` dims scaled like a trained init: weights (nd >= 2)
 * U(+-1/sqrt(fan_in)), fan_in the product of every dim but the first; biases U(+-0.1);
 * 1-D `.weight`s (norm gammas) 1 + U(+-0.1) */
static void put_nd(wgen *g, const char *name, int nd, const int64_t *shape) {
    if (g->s != DL_OK) return;
    int64_t n = 1, fan = 1;
    for (int i = 0; i < nd; i++) n *= shape[i], fan *= i ? shape[i] : 1;
    if (g->n == g->cap) {
        void **k = realloc(g->keep, (size_t)(g->cap = g->cap ? 2 * g->cap : 64) * sizeof *k);
        if (!k) {
            g->s = dl_fail(DL_ERR_NOMEM, "out of memory");
            return;
        }
        g->keep = k;
    }
    uint16_t *p = malloc((size_t)n * 2);
    if (!p) {
        g->s = dl_fail(DL_ERR_NOMEM, "out of memory");
        return;
    }
    g->keep[g->n++] = p;
    const size_t nl = strlen(name);
    const int gamma = nd == 1 && nl > 7 && !strcmp(name + nl - 7, ".weight");
    const float sc = nd > 1 ? 1.f / sqrtf((float)fan) : 0.1f;
    dl_fill_uniform(DL_BF16, p, n, -sc, sc, g->seed++);
    if (gamma)
        for (int64_t i = 0; i < n; i++) p[i] = dl_f32_to_bf16(1.f + dl_bf16_to_f32(p[i]));
    g->s = dl_st_writer_add(g->w, name, DL_ST_BF16, nd, shape, p);
}

/* `<prefix><base>.weight` [out, in] and `.bias` [out] */
static void put_lin(wgen *g, const char *prefix, const char *base, int64_t out, int64_t in) {
    char nm[320];
    int64_t sw[2] = {out, in}, sb[1] = {out};
    snprintf(nm, sizeof nm, "%s%s.weight", prefix, base);
    put_nd(g, nm, 2, sw);
    snprintf(nm, sizeof nm, "%s%s.bias", prefix, base);
    put_nd(g, nm, 1, sb);
}

/* `<prefix><base>` of one dim (a norm's weight or bias) */
static void put_vec(wgen *g, const char *prefix, const char *base, int64_t n) {
    char nm[320];
    snprintf(nm, sizeof nm, "%s%s", prefix, base);
    put_nd(g, nm, 1, &n);
}

static dl_status write_text(const char *path, const char *text) {
    return dl_file_write_atomic(path, text, strlen(text));
}

/* The folder as diffusers' HunyuanVideoTransformer3DModel.save_pretrained writes it
 * for this config (the names and shapes of its state_dict). */
static dl_status make_model(const char *dir, const hv_cfg *c) {
    char path[4200], cfg[1024], p[256];
    snprintf(path, sizeof path, "%s/transformer", dir);
    dl_status s = dl_mkdir_p(path);
    if (s != DL_OK) return s;
    snprintf(path, sizeof path, "%s/model_index.json", dir);
    if ((s = write_text(path, "{\"_class_name\": \"HunyuanVideoPipeline\", \"transformer\": [\"diffusers\", "
                              "\"HunyuanVideoTransformer3DModel\"]}")) != DL_OK)
        return s;
    snprintf(cfg, sizeof cfg,
             "{\"_class_name\": \"HunyuanVideoTransformer3DModel\", \"in_channels\": %lld, \"out_channels\": %lld, "
             "\"num_attention_heads\": %lld, \"attention_head_dim\": %lld, \"num_layers\": 1, \"num_single_layers\": 1, "
             "\"num_refiner_layers\": %lld, \"mlp_ratio\": 4.0, \"patch_size\": %lld, \"patch_size_t\": %lld, "
             "\"qk_norm\": \"rms_norm\", \"guidance_embeds\": true, \"text_embed_dim\": %lld, "
             "\"pooled_projection_dim\": %lld, \"rope_theta\": 256.0, \"rope_axes_dim\": [16, 56, 56], "
             "\"image_condition_type\": null}",
             (long long)c->Cin, (long long)c->Cout, (long long)c->H, (long long)c->Dh, (long long)c->R,
             (long long)c->P[1], (long long)c->P[0], (long long)c->Td, (long long)c->Pd);
    snprintf(path, sizeof path, "%s/transformer/config.json", dir);
    if ((s = write_text(path, cfg)) != DL_OK) return s;
    wgen g = {.w = dl_st_writer_new(), .seed = 100};
    const int64_t D = c->D, F = 4 * D, Dh = c->Dh, PP = c->P[0] * c->P[1] * c->P[2];
    /* patch embedding: Conv3d [D, Cin, pt, p, p] */
    const int64_t sx[5] = {D, c->Cin, c->P[0], c->P[1], c->P[2]};
    put_nd(&g, "x_embedder.proj.weight", 5, sx);
    put_vec(&g, "", "x_embedder.proj.bias", D);
    /* conditioning */
    put_lin(&g, "time_text_embed.", "timestep_embedder.linear_1", D, 256);
    put_lin(&g, "time_text_embed.", "timestep_embedder.linear_2", D, D);
    put_lin(&g, "time_text_embed.", "guidance_embedder.linear_1", D, 256);
    put_lin(&g, "time_text_embed.", "guidance_embedder.linear_2", D, D);
    put_lin(&g, "time_text_embed.", "text_embedder.linear_1", D, c->Pd);
    put_lin(&g, "time_text_embed.", "text_embedder.linear_2", D, D);
    /* the token refiner */
    put_lin(&g, "context_embedder.", "time_text_embed.timestep_embedder.linear_1", D, 256);
    put_lin(&g, "context_embedder.", "time_text_embed.timestep_embedder.linear_2", D, D);
    put_lin(&g, "context_embedder.", "time_text_embed.text_embedder.linear_1", D, c->Td);
    put_lin(&g, "context_embedder.", "time_text_embed.text_embedder.linear_2", D, D);
    put_lin(&g, "context_embedder.", "proj_in", D, c->Td);
    for (int64_t i = 0; i < c->R; i++) {
        snprintf(p, sizeof p, "context_embedder.token_refiner.refiner_blocks.%lld.", (long long)i);
        put_vec(&g, p, "norm1.weight", D);
        put_vec(&g, p, "norm1.bias", D);
        put_lin(&g, p, "attn.to_q", D, D);
        put_lin(&g, p, "attn.to_k", D, D);
        put_lin(&g, p, "attn.to_v", D, D);
        put_lin(&g, p, "attn.to_out.0", D, D);
        put_vec(&g, p, "norm2.weight", D);
        put_vec(&g, p, "norm2.bias", D);
        put_lin(&g, p, "ff.net.0.proj", F, D);
        put_lin(&g, p, "ff.net.2", D, F);
        put_lin(&g, p, "norm_out.linear", 2 * D, D);
    }
    /* the dual-stream block */
    const char *tb = "transformer_blocks.0.";
    put_lin(&g, tb, "norm1.linear", 6 * D, D);
    put_lin(&g, tb, "norm1_context.linear", 6 * D, D);
    static const char *sq[] = {"attn.to_q", "attn.to_k", "attn.to_v", "attn.add_q_proj", "attn.add_k_proj",
                               "attn.add_v_proj", "attn.to_out.0", "attn.to_add_out"};
    for (size_t i = 0; i < sizeof sq / sizeof sq[0]; i++) put_lin(&g, tb, sq[i], D, D);
    static const char *nv[] = {"attn.norm_q.weight", "attn.norm_k.weight", "attn.norm_added_q.weight",
                               "attn.norm_added_k.weight"};
    for (size_t i = 0; i < sizeof nv / sizeof nv[0]; i++) put_vec(&g, tb, nv[i], Dh);
    put_lin(&g, tb, "ff.net.0.proj", F, D);
    put_lin(&g, tb, "ff.net.2", D, F);
    put_lin(&g, tb, "ff_context.net.0.proj", F, D);
    put_lin(&g, tb, "ff_context.net.2", D, F);
    /* the single-stream block */
    const char *sb = "single_transformer_blocks.0.";
    put_vec(&g, sb, "attn.norm_q.weight", Dh);
    put_vec(&g, sb, "attn.norm_k.weight", Dh);
    put_lin(&g, sb, "attn.to_q", D, D);
    put_lin(&g, sb, "attn.to_k", D, D);
    put_lin(&g, sb, "attn.to_v", D, D);
    put_lin(&g, sb, "norm.linear", 3 * D, D);
    put_lin(&g, sb, "proj_mlp", F, D);
    put_lin(&g, sb, "proj_out", D, D + F);
    /* the output */
    put_lin(&g, "", "norm_out.linear", 2 * D, D);
    put_lin(&g, "", "proj_out", c->Cout * PP, D);
    snprintf(path, sizeof path, "%s/transformer/diffusion_pytorch_model.safetensors", dir);
    if (g.s == DL_OK) g.s = dl_st_writer_save(g.w, path);
    dl_st_writer_free(g.w);
    for (int i = 0; i < g.n; i++) free(g.keep[i]);
    free(g.keep);
    return g.s;
}

/* ---- measuring ------------------------------------------------------------------- */

/* FLOPs of one step (2 per multiply-add): every linear 2 M K N (the conditioning
 * MLPs, the refiner's proj_in, QKV, out and MLP, the modulations, the patch
 * convolution, the blocks' QKV, out and MLPs, norm_out, proj_out) and attention
 * 4 Sq Sk D: the refiner's T rows over its L valid keys, each block's S = T + N rows
 * over N + L keys. Text rows past L are computed (diffusers does too) but no key of
 * theirs is attended. *attn: the two blocks' attention. */
static double step_flops(const hv_cfg *c, double *attn) {
    const double D = (double)c->D, F = 4 * D, N = (double)video_tokens(c), T = (double)c->T, L = (double)c->L;
    const double S = N + T, PP = (double)(c->P[0] * c->P[1] * c->P[2]);
    const double cond = 2 * (2 * (256 * D + D * D) + (double)c->Pd * D + D * D);       /* timestep, guidance, text */
    const double rcond = 2 * (256 * D + D * D + (double)c->Td * D + D * D);            /* the refiner's own */
    const double ref = 2 * T * (double)c->Td * D                                         /* proj_in */
                       + (double)c->R * (2 * D * 2 * D + 2 * T * D * (4 * D + 2 * F) + 4 * T * L * D);
    const double mods = 2 * D * (6 * D + 6 * D + 3 * D + 2 * D);                         /* both blocks, norm_out */
    const double io = 2 * N * (double)c->Cin * PP * D + 2 * N * D * (double)c->Cout * PP; /* x_embedder, proj_out */
    const double dual = 2 * S * D * (3 * D + D + 2 * F);                                 /* QKV, out, MLP */
    const double single = 2 * S * D * (3 * D + F) + 2 * S * (D + F) * D;                 /* QKV | mlp, proj_out */
    *attn = 2 * 4 * S * (N + L) * D;
    return cond + rcond + ref + mods + io + dual + single + *attn;
}

typedef struct {
    const dl_attn_partial *parts;
    int64_t sq, heads, dh;
    dl_dtype dt;
    void *out;
    int64_t os;
} merge_ctx;

static void merge_task(void *ctx, int ith, int nth) {
    const merge_ctx *m = ctx;
    dl_attn_merge_t(m->parts, 2, m->sq, m->heads, m->dh, m->dt, m->out, m->os, NULL, NULL, NULL, ith, nth);
}

/* Seconds of one block's joint attention done standalone as dit.c's joint_attn does
 * it on one rank: S = T + N query rows of a fused [S, 3D] QKV buffer (text rows
 * first); with every text row valid one call over the S keys, else two partials (the
 * L valid text keys, the N video keys) then their merge (best of 2; NAN when out of
 * memory). */
static double attn_seconds(const hv_cfg *c, dl_dtype dt) {
    const int64_t D = c->D, N = video_tokens(c), S = c->T + N;
    const size_t es = dl_dtype_size(dt);
    void *qkv = malloc((size_t)(S * 3 * D) * es), *out = malloc((size_t)(S * D) * es);
    float *o[2] = {malloc((size_t)(S * D) * 4), malloc((size_t)(S * D) * 4)};
    float *ml = malloc((size_t)(4 * c->H * S) * 4);
    double best = NAN;
    if (qkv && out && o[0] && o[1] && ml) {
        dl_fill_uniform(dt, qkv, S * 3 * D, -1.f, 1.f, 11);
        const char *q = qkv, *k = q + (size_t)D * es, *v = q + (size_t)(2 * D) * es;
        const float scale = 1.f / sqrtf((float)c->Dh);
        dl_attn_partial parts[2];
        dl_attn_args a[2];
        if (c->L == c->T) {
            a[0] = (dl_attn_args){.dt = dt, .sq = S, .sk = S, .heads = c->H, .head_dim = c->Dh, .q = q, .k = k, .v = v,
                                  .q_stride = 3 * D, .k_stride = 3 * D, .v_stride = 3 * D, .out = out, .out_stride = D,
                                  .kv_begin = 0, .kv_end = S, .scale = scale};
        } else {
            for (int p = 0; p < 2; p++) {
                float *m = ml + (size_t)(2 * p) * (size_t)(c->H * S), *l = m + c->H * S;
                const size_t off = p ? (size_t)(c->T * 3 * D) * es : 0;
                a[p] = (dl_attn_args){.dt = dt, .sq = S, .sk = p ? N : c->T + N, .heads = c->H, .head_dim = c->Dh,
                                      .q = q, .k = k + off, .v = v + off, .q_stride = 3 * D, .k_stride = 3 * D,
                                      .v_stride = 3 * D, .kv_begin = 0, .kv_end = p ? N : c->L, .scale = scale,
                                      .o_part = o[p], .m = m, .l = l};
                parts[p] = (dl_attn_partial){o[p], m, l};
            }
        }
        merge_ctx mc = {parts, S, c->H, c->Dh, dt, out, D};
        best = INFINITY;
        for (int i = 0; i < 2; i++) {
            double t0 = dl_now();
            if (dl_attn(&a[0], NULL) != DL_OK || (c->L != c->T && dl_attn(&a[1], NULL) != DL_OK)) {
                best = NAN;
                break;
            }
            if (c->L != c->T) dl_parallel(merge_task, &mc);
            if (dl_now() - t0 < best) best = dl_now() - t0;
        }
    }
    free(qkv), free(out), free(o[0]), free(o[1]), free(ml);
    return best;
}

int cli_bench_hunyuan(int argc, char **argv) {
    const char *json_path = NULL;
    int quick = 0;
    dl_dtype dt;
    if (!bench_opts(argc, argv, "hunyuan-step", &json_path, &quick, &dt)) return 2;
    hv_cfg c = {.D = 3072, .H = 24, .Dh = 128, .Td = 4096, .Pd = 768, .Cin = 16, .Cout = 16, .R = 2,
                .lat = {10, 64, 64}, .P = {1, 2, 2}, .T = 256, .L = 256};
    int reps = 2, warm = 1;
    if (quick) c.lat[0] = 2, c.lat[1] = c.lat[2] = 32, c.T = 64, c.L = 40, reps = 1, warm = 0; /* tests: seconds */
    const int64_t N = video_tokens(&c), nlat = c.lat[0] * c.lat[1] * c.lat[2];
    char dir[] = "/tmp/difflet-bench-hunyuan-XXXXXX", path[4200], cmd[4300];
    if (!mkdtemp(dir)) {
        fprintf(stderr, "difflet: bench: cannot create a temporary folder\n");
        return 1;
    }
    int rc = 1;
    float *lat = malloc((size_t)(c.Cin * nlat) * 4), *txt = malloc((size_t)(c.T * c.Td) * 4);
    float *pooled = malloc((size_t)c.Pd * 4), *out = malloc((size_t)(c.Cout * nlat) * 4);
    cJSON *root = cJSON_CreateObject(), *pj = NULL;
    dl_model_dir *md = NULL;
    dl_hunyuan_video *m = NULL;
    printf("difflet bench hunyuan-step: HunyuanVideo width (dim %lld, %lld heads x %lld, text_embed_dim %lld),\n"
           "  %lld-block token refiner + 1 dual + 1 single block, latent %lld x %lld x %lld, patch (%lld, %lld, %lld):\n"
           "  %lld video tokens + %lld text rows (%lld valid), %s, %d threads\n"
           "  on %s: kernels %s, matmul %s (oneDNN %s)\n",
           (long long)c.D, (long long)c.H, (long long)c.Dh, (long long)c.Td, (long long)c.R, (long long)c.lat[0],
           (long long)c.lat[1], (long long)c.lat[2], (long long)c.P[0], (long long)c.P[1], (long long)c.P[2],
           (long long)N, (long long)c.T, (long long)c.L, dl_dtype_name(dt), dl_threads(), dl_cpu_model(),
           dl_isa_name(dl_kernel_isa()), dl_onednn_isa(), dl_onednn_version());
    bench_machine_json(root);
    cJSON_AddStringToObject(root, "dtype", dl_dtype_name(dt));
    cJSON_AddNumberToObject(root, "video_tokens", (double)N);
    cJSON_AddNumberToObject(root, "text_rows_valid", (double)c.L);
    cJSON_AddNumberToObject(root, "text_rows_program", (double)c.T);
    cJSON_AddNumberToObject(root, "refiner_blocks", (double)c.R);
    cJSON_AddNumberToObject(root, "timed_runs", reps);
    cJSON_AddNumberToObject(root, "warmup_runs", warm);
    {
        dl_attn_args probe = {.dt = dt, .sq = N + c.T, .sk = N + c.T, .heads = c.H, .head_dim = c.Dh};
        cJSON_AddStringToObject(root, "attention_path", dl_attn_path_name(&probe));
    }
    fflush(stdout);
    if (!lat || !txt || !pooled || !out) goto done;
    if (make_model(dir, &c) != DL_OK) {
        fprintf(stderr, "difflet: bench: %s\n", dl_last_error());
        goto done;
    }
    dl_randn(1, lat, c.Cin * nlat);
    dl_fill_uniform(DL_F32, txt, c.L * c.Td, -1.f, 1.f, 2);
    /* padding rows (quick) as the pipeline leaves them: computed, never attended */
    dl_fill_uniform(DL_F32, txt + c.L * c.Td, (c.T - c.L) * c.Td, -1.f, 1.f, 3);
    dl_fill_uniform(DL_F32, pooled, c.Pd, -1.f, 1.f, 4);
    const float ts = 700.f, gs = 6.f; /* timestep as the pipeline passes it (sigma x 1000); guidance scale */
    {
        dl_st_writer *w = dl_st_writer_new();
        int64_t sl[4] = {c.Cin, c.lat[0], c.lat[1], c.lat[2]}, st[2] = {c.T, c.Td}, sp[1] = {c.Pd}, s1[1] = {1};
        const float valid = (float)c.L;
        dl_st_writer_add(w, "latents", DL_ST_F32, 4, sl, lat);
        dl_st_writer_add(w, "prompt_embeds", DL_ST_F32, 2, st, txt);
        dl_st_writer_add(w, "valid", DL_ST_F32, 1, s1, &valid);
        dl_st_writer_add(w, "pooled", DL_ST_F32, 1, sp, pooled);
        dl_st_writer_add(w, "timestep", DL_ST_F32, 1, s1, &ts);
        dl_st_writer_add(w, "guidance", DL_ST_F32, 1, s1, &gs);
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
        dl_hunyuan_video_load(&m, md, "transformer", c.lat[0], c.lat[1], c.lat[2], c.T, dt, NULL, NULL) != DL_OK) {
        fprintf(stderr, "difflet: bench: %s\n", dl_last_error());
        goto done;
    }
    double load_s = dl_now() - t0, best = INFINITY;
    for (int i = 0; i < warm + reps; i++) {
        t0 = dl_now();
        if (dl_hunyuan_video_run(m, lat, txt, c.L, pooled, ts, gs, out) != DL_OK) {
            fprintf(stderr, "difflet: bench: %s\n", dl_last_error());
            goto done;
        }
        double t = dl_now() - t0;
        if (i >= warm && t < best) best = t;
    }
    bench_rss_mib(&rss0, &rss_peak);
    dl_hunyuan_video_free(m);
    m = NULL;
    double attn_f, flops = step_flops(&c, &attn_f);
    const double gf = flops / best * 1e-9;
    const int64_t mm_m = quick ? 512 : 4096;
    const double peak = bench_matmul_peak(dt, mm_m, 3072, 12288), at = 2 * attn_seconds(&c, dt);
    printf("  FLOPs per step (counted): %.1f GFLOP, of which the two blocks' attention 2 x 4 (N+T)(N+L) D = %.1f GFLOP\n",
           flops * 1e-9, attn_f * 1e-9);
    printf("  difflet:  load %.1f s, step %.3f s (best of %d, %d warm-up), %.0f GFLOP/s effective = %.2f x the same-run\n"
           "            oneDNN %s matmul (%.0f GFLOP/s at %lldx3072x12288), peak RSS %.0f MiB%s\n",
           load_s, best, reps, warm, gf, gf / peak, dl_dtype_name(dt), peak, (long long)mm_m, rss_peak,
           reset ? " (since the load)" : " (since the process began)");
    printf("  attention: 2 x a standalone call of the blocks' shapes (%lld queries over %lld + %lld keys%s)\n"
           "            %.3f s = %.1f%% of the step (estimate: timed apart from the step)\n",
           (long long)(c.T + N), (long long)c.L, (long long)N, c.L == c.T ? ", one call" : ", 2 partials + merge", at,
           100 * at / best);
    cJSON_AddNumberToObject(root, "difflet_load_s", load_s);
    cJSON_AddNumberToObject(root, "difflet_step_s", best);
    cJSON_AddNumberToObject(root, "difflet_gflops", gf);
    cJSON_AddNumberToObject(root, "matmul_gflops", peak);
    cJSON_AddNumberToObject(root, "fraction_of_matmul_peak", gf / peak);
    cJSON_AddNumberToObject(root, "step_gflop", flops * 1e-9);
    cJSON_AddNumberToObject(root, "attention_gflop", attn_f * 1e-9);
    cJSON_AddNumberToObject(root, "attention_standalone_s", at);
    cJSON_AddNumberToObject(root, "attention_share", at / best);
    cJSON_AddNumberToObject(root, "difflet_peak_rss_mib", rss_peak);
    cJSON_AddBoolToObject(root, "difflet_peak_rss_since_load", reset);
    /* the peer */
    pj = bench_run_peer("hunyuan_step_peer.py", dir, reps, warm, dt);
    if (!pj) {
        cJSON_AddNullToObject(root, "diffusers_step_s");
    } else {
        const double peer = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(pj, "step_s"));
        const double prss = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(pj, "peak_rss_mib"));
        snprintf(path, sizeof path, "%s/peer_out.safetensors", dir);
        const double rel = bench_rel_diff(path, out, c.Cout * nlat);
        printf("  diffusers: step %.3f s (best of %d, %d warm-up; torch %s, %d threads), peak RSS %.0f MiB (its process)\n",
               peer, reps, warm, cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(pj, "torch")), dl_threads(), prss);
        printf("  difflet / diffusers step time: %.3f (difflet %.2f x faster; goal >= 1.5); outputs differ by %.3g of max|diffusers|\n",
               best / peer, peer / best, rel);
        cJSON_AddNumberToObject(root, "diffusers_step_s", peer);
        cJSON_AddNumberToObject(root, "speedup_vs_diffusers", peer / best);
        cJSON_AddNumberToObject(root, "output_rel_diff", rel);
        cJSON_AddNumberToObject(root, "diffusers_peak_rss_mib", prss);
    }
    rc = 0;
    if (json_path) {
        char *txtj = cJSON_Print(root);
        if (!txtj || dl_file_write_atomic(json_path, txtj, strlen(txtj)) != DL_OK) rc = 1;
        free(txtj);
    }
done:
    dl_hunyuan_video_free(m);
    dl_model_dir_free(md);
    cJSON_Delete(pj);
    cJSON_Delete(root);
    free(lat), free(txt), free(pooled), free(out);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "difflet: bench: could not remove %s\n", dir);
    return rc;
}
