/* `difflet bench qwen-step`: one denoiser step of a Qwen-Image-width transformer
 * (dim 3072 = 24 heads x 128, joint_attention_dim 3584, 64 -> 16 x 4 channels, patch
 * 2, axes_dims_rope (16, 56, 56), ONE block, random bf16 weights) for a 1024 x 1024
 * image (packed grid 64 x 64: 4,096 image tokens) and a ragged prompt: 200 valid rows
 * in a program built for at most 512 text rows. difflet runs with valid = 200 (the
 * padding rows hold junk it must never attend); diffusers' QwenImageTransformer2DModel
 * (num_layers=1, same weights and inputs, torch CPU, the same dtype and thread count;
 * needs the tools virtualenv) gets the 200-row prompt_embeds with no mask, as
 * QwenImagePipeline passes one prompt. The dtype is the engine's default on this CPU
 * (bf16 with AVX512_BF16, else f32) or --dtype, as flux-step chooses.
 *
 * Reports the step-time ratio, difflet's effective GFLOP/s (the step's useful FLOPs,
 * step_flops below, at the 200 valid text rows) as a fraction of a same-run (OpenBLAS or oneDNN)
 * matmul in that dtype, the attention share (a standalone attention call of the
 * step's shapes, timed after the step: the kernel sits in dit.c's shared block, which
 * has no phase clock), the outputs' difference, peak RSS, and (--json) the machine.
 * --quick: grid 16 x 16, 64 text rows (24 valid). DIFFLET_BENCH_PEER=off skips the
 * peer. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "difflet/check.h"
#include "difflet/models.h"
#include "difflet/qwenimage.h"

typedef struct {
    int64_t D, H, Dh, Jd, Cin, Cout, gh, gw, T, L; /* Cout: per token (4 x out_channels); T program rows, L valid */
} qwen_cfg;

/* ---- the random-weight folder ----------------------------------------------------- */

static dl_status make_model(const char *dir, const qwen_cfg *c) {
    char path[4200], cfg[1024];
    snprintf(path, sizeof path, "%s/transformer", dir);
    dl_status s = dl_mkdir_p(path);
    if (s != DL_OK) return s;
    snprintf(path, sizeof path, "%s/model_index.json", dir);
    if ((s = bench_write_text(path, "{\"_class_name\": \"QwenImagePipeline\", \"transformer\": [\"diffusers\", "
                                    "\"QwenImageTransformer2DModel\"]}")) != DL_OK)
        return s;
    snprintf(cfg, sizeof cfg,
             "{\"_class_name\": \"QwenImageTransformer2DModel\", \"patch_size\": 2, \"in_channels\": %lld, "
             "\"out_channels\": %lld, \"num_layers\": 1, \"attention_head_dim\": %lld, \"num_attention_heads\": %lld, "
             "\"joint_attention_dim\": %lld, \"guidance_embeds\": false, \"axes_dims_rope\": [16, 56, 56]}",
             (long long)c->Cin, (long long)(c->Cout / 4), (long long)c->Dh, (long long)c->H, (long long)c->Jd);
    snprintf(path, sizeof path, "%s/transformer/config.json", dir);
    if ((s = bench_write_text(path, cfg)) != DL_OK) return s;
    bench_wgen g;
    bench_wgen_init(&g, 100);
    const int64_t D = c->D, F = 4 * D;
    const char *b = "transformer_blocks.0.";
    bench_put_lin(&g, "time_text_embed.", "timestep_embedder.linear_1", D, 256);
    bench_put_lin(&g, "time_text_embed.", "timestep_embedder.linear_2", D, D);
    bench_put_vec(&g, "", "txt_norm.weight", c->Jd);
    bench_put_lin(&g, "", "txt_in", D, c->Jd);
    bench_put_lin(&g, "", "img_in", D, c->Cin);
    bench_put_lin(&g, "", "norm_out.linear", 2 * D, D);
    bench_put_lin(&g, "", "proj_out", c->Cout, D);
    static const char *sq[] = {"attn.to_q", "attn.to_k", "attn.to_v", "attn.add_q_proj", "attn.add_k_proj",
                               "attn.add_v_proj", "attn.to_out.0", "attn.to_add_out"};
    for (size_t i = 0; i < sizeof sq / sizeof sq[0]; i++) bench_put_lin(&g, b, sq[i], D, D);
    static const char *nv[] = {"attn.norm_q.weight", "attn.norm_k.weight", "attn.norm_added_q.weight",
                               "attn.norm_added_k.weight"};
    for (size_t i = 0; i < sizeof nv / sizeof nv[0]; i++) bench_put_vec(&g, b, nv[i], c->Dh);
    bench_put_lin(&g, b, "img_mod.1", 6 * D, D);
    bench_put_lin(&g, b, "txt_mod.1", 6 * D, D);
    bench_put_lin(&g, b, "img_mlp.net.0.proj", F, D);
    bench_put_lin(&g, b, "img_mlp.net.2", D, F);
    bench_put_lin(&g, b, "txt_mlp.net.0.proj", F, D);
    bench_put_lin(&g, b, "txt_mlp.net.2", D, F);
    snprintf(path, sizeof path, "%s/transformer/diffusion_pytorch_model.safetensors", dir);
    return bench_wgen_save(&g, path);
}

/* ---- measuring ------------------------------------------------------------------- */

/* FLOPs of one step over R text rows (2 per multiply-add): every linear 2 M K N
 * (txt_in, img_in, the timestep MLP, both modulations, QKV, to_out, the two MLPs,
 * norm_out, proj_out) and attention 4 S^2 D over S = N + R joint rows (q k^T and p v).
 * R = L: the useful work (what diffusers does with the 200-row prompt); R = T, S^2 ->
 * (N + T)(N + L): what difflet's fixed program executes. *attn: the attention part. */
static double step_flops(const qwen_cfg *c, int64_t R, double *attn) {
    const double D = (double)c->D, F = 4 * D, N = (double)(c->gh * c->gw), r = (double)R, L = (double)c->L;
    const double rows = N + r;
    double emb = 2 * r * (double)c->Jd * D + 2 * N * (double)c->Cin * D + 2 * (256 * D + D * D) /* timestep MLP */
                 + 2 * 2 * D * 6 * D + 2 * D * 2 * D /* img_mod, txt_mod, norm_out */ + 2 * N * D * (double)c->Cout;
    double lin = 2 * rows * D * (3 * D + D + 2 * F);
    *attn = 4 * rows * (N + L) * D;
    return emb + lin + *attn;
}

int cli_bench_qwen(int argc, char **argv) {
    const char *json_path = NULL;
    int quick = 0;
    dl_dtype dt;
    if (!bench_opts(argc, argv, "qwen-step", &json_path, &quick, &dt)) return 2;
    qwen_cfg c = {.D = 3072, .H = 24, .Dh = 128, .Jd = 3584, .Cin = 64, .Cout = 64, .gh = 64, .gw = 64, .T = 512, .L = 200};
    int reps = 2, warm = 1;
    if (quick) c.gh = c.gw = 16, c.T = 64, c.L = 24, reps = 1, warm = 0; /* tests: seconds, not a measurement */
    const int64_t N = c.gh * c.gw;
    char dir[] = "/tmp/difflet-bench-qwen-XXXXXX", path[4200];
    if (!mkdtemp(dir)) {
        fprintf(stderr, "difflet: bench: cannot create a temporary folder\n");
        return 1;
    }
    int rc = 1;
    float *lat = malloc((size_t)(N * c.Cin) * 4), *txt = malloc((size_t)(c.T * c.Jd) * 4);
    float *out = malloc((size_t)(N * c.Cout) * 4);
    cJSON *root = cJSON_CreateObject(), *pj = NULL;
    dl_model_dir *md = NULL;
    dl_qwenimage *m = NULL;
    printf("difflet bench qwen-step: Qwen-Image width (dim %lld, %lld heads x %lld, joint_attention_dim %lld), 1 block,\n"
           "  packed grid %lld x %lld = %lld image tokens + %lld valid text rows (program built for %lld), %s, %d threads\n"
           "  on %s: kernels %s, matmul %s (oneDNN %s)\n",
           (long long)c.D, (long long)c.H, (long long)c.Dh, (long long)c.Jd, (long long)c.gh, (long long)c.gw, (long long)N,
           (long long)c.L, (long long)c.T, dl_dtype_name(dt), dl_threads(), dl_cpu_model(), dl_isa_name(dl_kernel_isa()),
           dl_onednn_isa(), dl_onednn_version());
    bench_machine_json(root);
    cJSON_AddStringToObject(root, "dtype", dl_dtype_name(dt));
    cJSON_AddNumberToObject(root, "image_tokens", (double)N);
    cJSON_AddNumberToObject(root, "text_rows_valid", (double)c.L);
    cJSON_AddNumberToObject(root, "text_rows_program", (double)c.T);
    cJSON_AddNumberToObject(root, "timed_runs", reps);
    cJSON_AddNumberToObject(root, "warmup_runs", warm);
    {
        dl_attn_args probe = {.dt = dt, .sq = N + c.T, .sk = N + c.T, .heads = c.H, .head_dim = c.Dh};
        cJSON_AddStringToObject(root, "attention_path", dl_attn_path_name(&probe));
    }
    fflush(stdout);
    if (!lat || !txt || !out) goto done;
    if (make_model(dir, &c) != DL_OK) {
        fprintf(stderr, "difflet: bench: %s\n", dl_last_error());
        goto done;
    }
    dl_randn(1, lat, N * c.Cin);
    dl_fill_uniform(DL_F32, txt, c.L * c.Jd, -1.f, 1.f, 2);
    /* the padding rows hold junk: never attended, so the output must not depend on it */
    dl_fill_uniform(DL_F32, txt + c.L * c.Jd, (c.T - c.L) * c.Jd, -100.f, 100.f, 3);
    const float ts = 0.7f; /* sigma: the pipeline's timestep / 1000 */
    {
        dl_st_writer *w = dl_st_writer_new();
        int64_t sl[2] = {N, c.Cin}, st[2] = {c.L, c.Jd}, s1[1] = {1}, s2[1] = {2};
        float grid[2] = {(float)c.gh, (float)c.gw};
        dl_st_writer_add(w, "latents", DL_ST_F32, 2, sl, lat);
        dl_st_writer_add(w, "prompt_embeds", DL_ST_F32, 2, st, txt); /* the valid rows only */
        dl_st_writer_add(w, "timestep", DL_ST_F32, 1, s1, &ts);
        dl_st_writer_add(w, "grid", DL_ST_F32, 1, s2, grid);
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
        dl_qwenimage_load(&m, md, "transformer", c.gh, c.gw, c.T, dt, NULL, NULL) != DL_OK) {
        fprintf(stderr, "difflet: bench: %s\n", dl_last_error());
        goto done;
    }
    double load_s = dl_now() - t0, best = INFINITY;
    for (int i = 0; i < warm + reps; i++) {
        t0 = dl_now();
        if (dl_qwenimage_run(m, lat, txt, c.L, ts, out) != DL_OK) {
            fprintf(stderr, "difflet: bench: %s\n", dl_last_error());
            goto done;
        }
        double t = dl_now() - t0;
        if (i >= warm && t < best) best = t;
    }
    bench_rss_mib(&rss0, &rss_peak);
    dl_qwenimage_free(m);
    m = NULL;
    double attn_f, attn_x, flops = step_flops(&c, c.L, &attn_f), exec = step_flops(&c, c.T, &attn_x);
    const double gf = flops / best * 1e-9;
    const int64_t mm_m = quick ? 512 : 4096;
    const double peak = bench_matmul_peak(dt, mm_m, 3072, 12288);
    const double at = bench_joint_attn_seconds(c.T, c.L, N, c.H, c.Dh, dt); /* L < T: 2 partials + merge */
    printf("  FLOPs per step (counted): %.1f GFLOP useful (%lld text rows), of which attention 4 (N+L)^2 D = %.1f GFLOP;\n"
           "            %.1f GFLOP as difflet's %lld-row program executes it\n",
           flops * 1e-9, (long long)c.L, attn_f * 1e-9, exec * 1e-9, (long long)c.T);
    printf("  difflet:  load %.1f s, step %.3f s (best of %d, %d warm-up), %.0f GFLOP/s effective = %.2f x the same-run\n"
           "            %s matmul (%.0f GFLOP/s at %lldx3072x12288), peak RSS %.0f MiB%s\n",
           load_s, best, reps, warm, gf, gf / peak, bench_matmul_label(), peak, (long long)mm_m, rss_peak,
           reset ? " (since the load)" : " (since the process began)");
    printf("  attention: a standalone call of the step's shapes (%lld queries over %lld + %lld keys, 2 partials + merge)\n"
           "            %.3f s = %.1f%% of the step (estimate: timed apart from the step)\n",
           (long long)(c.T + N), (long long)c.L, (long long)N, at, 100 * at / best);
    cJSON_AddNumberToObject(root, "difflet_load_s", load_s);
    cJSON_AddNumberToObject(root, "difflet_step_s", best);
    cJSON_AddNumberToObject(root, "difflet_gflops", gf);
    cJSON_AddNumberToObject(root, "matmul_gflops", peak);
    cJSON_AddNumberToObject(root, "fraction_of_matmul_peak", gf / peak);
    cJSON_AddNumberToObject(root, "step_gflop", flops * 1e-9);
    cJSON_AddNumberToObject(root, "step_gflop_executed", exec * 1e-9);
    cJSON_AddNumberToObject(root, "attention_gflop", attn_f * 1e-9);
    cJSON_AddNumberToObject(root, "attention_standalone_s", at);
    cJSON_AddNumberToObject(root, "attention_share", at / best);
    cJSON_AddNumberToObject(root, "difflet_peak_rss_mib", rss_peak);
    cJSON_AddBoolToObject(root, "difflet_peak_rss_since_load", reset);
    /* the peer */
    pj = bench_run_peer("qwen_step_peer.py", dir, reps, warm, dt);
    if (!pj) {
        cJSON_AddNullToObject(root, "diffusers_step_s");
    } else {
        const double peer = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(pj, "step_s"));
        const double prss = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(pj, "peak_rss_mib"));
        snprintf(path, sizeof path, "%s/peer_out.safetensors", dir);
        const double rel = bench_rel_diff(path, out, N * c.Cout);
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
    dl_qwenimage_free(m);
    dl_model_dir_free(md);
    cJSON_Delete(pj);
    cJSON_Delete(root);
    free(lat), free(txt), free(out);
    bench_remove_dir(dir);
    return rc;
}
