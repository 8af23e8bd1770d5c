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
 * step_flops below) as a fraction of a same-run matmul (difflet's: OpenBLAS or oneDNN) in that dtype, the
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

/* The folder as diffusers' HunyuanVideoTransformer3DModel.save_pretrained writes it
 * for this config (the names and shapes of its state_dict). */
static dl_status make_model(const char *dir, const hv_cfg *c) {
    char path[4200], cfg[1024], p[256];
    snprintf(path, sizeof path, "%s/transformer", dir);
    dl_status s = dl_mkdir_p(path);
    if (s != DL_OK) return s;
    snprintf(path, sizeof path, "%s/model_index.json", dir);
    if ((s = bench_write_text(path, "{\"_class_name\": \"HunyuanVideoPipeline\", \"transformer\": [\"diffusers\", "
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
    if ((s = bench_write_text(path, cfg)) != DL_OK) return s;
    bench_wgen g;
    bench_wgen_init(&g, 100);
    const int64_t D = c->D, F = 4 * D, Dh = c->Dh, PP = c->P[0] * c->P[1] * c->P[2];
    /* patch embedding: Conv3d [D, Cin, pt, p, p] */
    const int64_t sx[5] = {D, c->Cin, c->P[0], c->P[1], c->P[2]};
    bench_put_wb(&g, "", "x_embedder.proj", 5, sx);
    /* conditioning */
    bench_put_lin(&g, "time_text_embed.", "timestep_embedder.linear_1", D, 256);
    bench_put_lin(&g, "time_text_embed.", "timestep_embedder.linear_2", D, D);
    bench_put_lin(&g, "time_text_embed.", "guidance_embedder.linear_1", D, 256);
    bench_put_lin(&g, "time_text_embed.", "guidance_embedder.linear_2", D, D);
    bench_put_lin(&g, "time_text_embed.", "text_embedder.linear_1", D, c->Pd);
    bench_put_lin(&g, "time_text_embed.", "text_embedder.linear_2", D, D);
    /* the token refiner */
    bench_put_lin(&g, "context_embedder.", "time_text_embed.timestep_embedder.linear_1", D, 256);
    bench_put_lin(&g, "context_embedder.", "time_text_embed.timestep_embedder.linear_2", D, D);
    bench_put_lin(&g, "context_embedder.", "time_text_embed.text_embedder.linear_1", D, c->Td);
    bench_put_lin(&g, "context_embedder.", "time_text_embed.text_embedder.linear_2", D, D);
    bench_put_lin(&g, "context_embedder.", "proj_in", D, c->Td);
    for (int64_t i = 0; i < c->R; i++) {
        snprintf(p, sizeof p, "context_embedder.token_refiner.refiner_blocks.%lld.", (long long)i);
        bench_put_vec(&g, p, "norm1.weight", D);
        bench_put_vec(&g, p, "norm1.bias", D);
        bench_put_lin(&g, p, "attn.to_q", D, D);
        bench_put_lin(&g, p, "attn.to_k", D, D);
        bench_put_lin(&g, p, "attn.to_v", D, D);
        bench_put_lin(&g, p, "attn.to_out.0", D, D);
        bench_put_vec(&g, p, "norm2.weight", D);
        bench_put_vec(&g, p, "norm2.bias", D);
        bench_put_lin(&g, p, "ff.net.0.proj", F, D);
        bench_put_lin(&g, p, "ff.net.2", D, F);
        bench_put_lin(&g, p, "norm_out.linear", 2 * D, D);
    }
    /* the dual-stream block */
    const char *tb = "transformer_blocks.0.";
    bench_put_lin(&g, tb, "norm1.linear", 6 * D, D);
    bench_put_lin(&g, tb, "norm1_context.linear", 6 * D, D);
    static const char *sq[] = {"attn.to_q", "attn.to_k", "attn.to_v", "attn.add_q_proj", "attn.add_k_proj",
                               "attn.add_v_proj", "attn.to_out.0", "attn.to_add_out"};
    for (size_t i = 0; i < sizeof sq / sizeof sq[0]; i++) bench_put_lin(&g, tb, sq[i], D, D);
    static const char *nv[] = {"attn.norm_q.weight", "attn.norm_k.weight", "attn.norm_added_q.weight",
                               "attn.norm_added_k.weight"};
    for (size_t i = 0; i < sizeof nv / sizeof nv[0]; i++) bench_put_vec(&g, tb, nv[i], Dh);
    bench_put_lin(&g, tb, "ff.net.0.proj", F, D);
    bench_put_lin(&g, tb, "ff.net.2", D, F);
    bench_put_lin(&g, tb, "ff_context.net.0.proj", F, D);
    bench_put_lin(&g, tb, "ff_context.net.2", D, F);
    /* the single-stream block */
    const char *sb = "single_transformer_blocks.0.";
    bench_put_vec(&g, sb, "attn.norm_q.weight", Dh);
    bench_put_vec(&g, sb, "attn.norm_k.weight", Dh);
    bench_put_lin(&g, sb, "attn.to_q", D, D);
    bench_put_lin(&g, sb, "attn.to_k", D, D);
    bench_put_lin(&g, sb, "attn.to_v", D, D);
    bench_put_lin(&g, sb, "norm.linear", 3 * D, D);
    bench_put_lin(&g, sb, "proj_mlp", F, D);
    bench_put_lin(&g, sb, "proj_out", D, D + F);
    /* the output */
    bench_put_lin(&g, "", "norm_out.linear", 2 * D, D);
    bench_put_lin(&g, "", "proj_out", c->Cout * PP, D);
    snprintf(path, sizeof path, "%s/transformer/diffusion_pytorch_model.safetensors", dir);
    return bench_wgen_save(&g, path);
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
    char dir[] = "/tmp/difflet-bench-hunyuan-XXXXXX", path[4200];
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
    const double peak = bench_matmul_peak(dt, mm_m, 3072, 12288);
    const double at = 2 * bench_joint_attn_seconds(c.T, c.L, N, c.H, c.Dh, dt); /* counted once per block */
    printf("  FLOPs per step (counted): %.1f GFLOP, of which the two blocks' attention 2 x 4 (N+T)(N+L) D = %.1f GFLOP\n",
           flops * 1e-9, attn_f * 1e-9);
    printf("  difflet:  load %.1f s, step %.3f s (best of %d, %d warm-up), %.0f GFLOP/s effective = %.2f x the same-run\n"
           "            %s matmul (%.0f GFLOP/s at %lldx3072x12288), peak RSS %.0f MiB%s\n",
           load_s, best, reps, warm, gf, gf / peak, bench_matmul_label(), peak, (long long)mm_m, rss_peak,
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
    if (json_path && bench_write_json(root, json_path) != DL_OK) rc = 1;
done:
    dl_hunyuan_video_free(m);
    dl_model_dir_free(md);
    cJSON_Delete(pj);
    cJSON_Delete(root);
    free(lat), free(txt), free(pooled), free(out);
    bench_remove_dir(dir);
    return rc;
}
