/* `difflet bench flux-step`: one denoiser step of a FLUX-width transformer (hidden
 * 3072, 24 heads x 128, 1 double + 1 single block, 4,096 image + 512 text tokens,
 * random bf16 weights) timed in difflet and, in the same run, in diffusers'
 * FluxTransformer2DModel on the same weights and inputs (torch CPU, the same dtype
 * and thread count; needs the tools virtualenv, `make tools-venv`). The dtype is
 * the engine's default on this CPU (bf16 with AVX512_BF16, else f32) or --dtype.
 * Reports the step-time ratio, difflet's effective GFLOP/s as a fraction of a
 * same-run matmul (difflet's: OpenBLAS or oneDNN) in that dtype, the difference between the two outputs, and
 * (--json) the machine: CPU model, kernel / matmul / attention paths, threads. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "cli/cli.h"
#include "difflet/check.h"
#include "difflet/models.h"
#include "difflet/flux.h"

#ifndef DIFFLET_SOURCE_DIR
#define DIFFLET_SOURCE_DIR "."
#endif

typedef struct {
    int64_t D, H, Dh, Jd, Pd, Cin, gh, gw, T;
    int nd, ns;
} bench_cfg;

static int write_text(const char *path, const char *text) {
    return dl_file_write_atomic(path, text, strlen(text)) == DL_OK;
}

/* random bf16 tensor [rows, cols] (or [rows] when cols == 0) scaled like a trained init */
static dl_status add_rand(dl_st_writer *w, uint16_t **keep, int *nkeep, const char *name, int64_t rows, int64_t cols,
                          uint64_t seed) {
    int64_t n = rows * (cols ? cols : 1);
    uint16_t *p = malloc((size_t)n * 2);
    if (!p) return dl_fail(DL_ERR_NOMEM, "out of memory");
    float sc = cols ? 1.f / sqrtf((float)cols) : 0.1f;
    dl_fill_uniform(DL_BF16, p, n, -sc, sc, seed);
    if (!cols && strstr(name, "norm")) /* norm weights around 1 */
        for (int64_t i = 0; i < n; i++) p[i] = dl_f32_to_bf16(1.f + dl_bf16_to_f32(p[i]));
    keep[(*nkeep)++] = p;
    int64_t shape[2] = {rows, cols};
    return dl_st_writer_add(w, name, DL_ST_BF16, cols ? 2 : 1, shape, p);
}

static dl_status make_model(const char *dir, const bench_cfg *c) {
    char path[4096], nm[320];
    snprintf(path, sizeof path, "%s/transformer", dir);
    dl_status ms = dl_mkdir_p(path);
    if (ms != DL_OK) return ms;
    snprintf(path, sizeof path, "%s/model_index.json", dir);
    if (!write_text(path, "{\"_class_name\": \"FluxPipeline\", \"transformer\": [\"diffusers\", \"FluxTransformer2DModel\"]}"))
        return DL_ERR_IO;
    char cfg[1024];
    snprintf(cfg, sizeof cfg,
             "{\"_class_name\": \"FluxTransformer2DModel\", \"patch_size\": 1, \"in_channels\": %lld, \"num_layers\": %d, "
             "\"num_single_layers\": %d, \"attention_head_dim\": %lld, \"num_attention_heads\": %lld, "
             "\"joint_attention_dim\": %lld, \"pooled_projection_dim\": %lld, \"guidance_embeds\": true, "
             "\"axes_dims_rope\": [16, 56, 56]}",
             (long long)c->Cin, c->nd, c->ns, (long long)c->Dh, (long long)c->H, (long long)c->Jd, (long long)c->Pd);
    snprintf(path, sizeof path, "%s/transformer/config.json", dir);
    if (!write_text(path, cfg)) return DL_ERR_IO;
    dl_st_writer *w = dl_st_writer_new();
    uint16_t *keep[512];
    int nk = 0;
    uint64_t seed = 100;
    const int64_t D = c->D, F = 4 * D;
    dl_status s = DL_OK;
#define LIN(name, out, in)                                                                   \
    do {                                                                                     \
        if (s == DL_OK) {                                                                    \
            snprintf(nm, sizeof nm, "%s.weight", name);                                      \
            s = add_rand(w, keep, &nk, nm, out, in, seed++);                                 \
        }                                                                                    \
        if (s == DL_OK) {                                                                    \
            snprintf(nm, sizeof nm, "%s.bias", name);                                        \
            s = add_rand(w, keep, &nk, nm, out, 0, seed++);                                  \
        }                                                                                    \
    } while (0)
#define VEC(name, n)                                                                         \
    do {                                                                                     \
        if (s == DL_OK) s = add_rand(w, keep, &nk, name, n, 0, seed++);                      \
    } while (0)
    LIN("time_text_embed.timestep_embedder.linear_1", D, 256);
    LIN("time_text_embed.timestep_embedder.linear_2", D, D);
    LIN("time_text_embed.guidance_embedder.linear_1", D, 256);
    LIN("time_text_embed.guidance_embedder.linear_2", D, D);
    LIN("time_text_embed.text_embedder.linear_1", D, c->Pd);
    LIN("time_text_embed.text_embedder.linear_2", D, D);
    LIN("context_embedder", D, c->Jd);
    LIN("x_embedder", D, c->Cin);
    LIN("norm_out.linear", 2 * D, D);
    LIN("proj_out", c->Cin, D);
    char p[256];
    for (int i = 0; i < c->nd; i++) {
        static const char *lins[][2] = {{"attn.to_q", ""}, {"attn.to_k", ""}, {"attn.to_v", ""}, {"attn.add_q_proj", ""},
                                        {"attn.add_k_proj", ""}, {"attn.add_v_proj", ""}, {"attn.to_out.0", ""},
                                        {"attn.to_add_out", ""}};
        for (size_t k = 0; k < sizeof lins / sizeof lins[0]; k++) {
            snprintf(p, sizeof p, "transformer_blocks.%d.%s", i, lins[k][0]);
            LIN(p, D, D);
        }
        snprintf(p, sizeof p, "transformer_blocks.%d.norm1.linear", i); LIN(p, 6 * D, D);
        snprintf(p, sizeof p, "transformer_blocks.%d.norm1_context.linear", i); LIN(p, 6 * D, D);
        snprintf(p, sizeof p, "transformer_blocks.%d.ff.net.0.proj", i); LIN(p, F, D);
        snprintf(p, sizeof p, "transformer_blocks.%d.ff.net.2", i); LIN(p, D, F);
        snprintf(p, sizeof p, "transformer_blocks.%d.ff_context.net.0.proj", i); LIN(p, F, D);
        snprintf(p, sizeof p, "transformer_blocks.%d.ff_context.net.2", i); LIN(p, D, F);
        static const char *norms[] = {"norm_q", "norm_k", "norm_added_q", "norm_added_k"};
        for (int k = 0; k < 4; k++) {
            snprintf(p, sizeof p, "transformer_blocks.%d.attn.%s.weight", i, norms[k]);
            VEC(p, c->Dh);
        }
    }
    for (int i = 0; i < c->ns; i++) {
        snprintf(p, sizeof p, "single_transformer_blocks.%d.attn.to_q", i); LIN(p, D, D);
        snprintf(p, sizeof p, "single_transformer_blocks.%d.attn.to_k", i); LIN(p, D, D);
        snprintf(p, sizeof p, "single_transformer_blocks.%d.attn.to_v", i); LIN(p, D, D);
        snprintf(p, sizeof p, "single_transformer_blocks.%d.norm.linear", i); LIN(p, 3 * D, D);
        snprintf(p, sizeof p, "single_transformer_blocks.%d.proj_mlp", i); LIN(p, F, D);
        snprintf(p, sizeof p, "single_transformer_blocks.%d.proj_out", i); LIN(p, D, D + F);
        snprintf(p, sizeof p, "single_transformer_blocks.%d.attn.norm_q.weight", i); VEC(p, c->Dh);
        snprintf(p, sizeof p, "single_transformer_blocks.%d.attn.norm_k.weight", i); VEC(p, c->Dh);
    }
#undef LIN
#undef VEC
    snprintf(path, sizeof path, "%s/transformer/diffusion_pytorch_model.safetensors", dir);
    if (s == DL_OK) s = dl_st_writer_save(w, path);
    dl_st_writer_free(w);
    for (int i = 0; i < nk; i++) free(keep[i]);
    return s;
}

/* FLOPs of one step: every linear (2 M K N) plus attention (4 S^2 D) */
static double step_flops(const bench_cfg *c) {
    const double D = (double)c->D, N = (double)(c->gh * c->gw), T = (double)c->T, S = N + T, F = 4 * D;
    double dbl = 2 * N * D * (3 * D + D + F + F) + 2 * T * D * (3 * D + D + F + F) + 4 * S * S * D;
    double sgl = 2 * S * D * (3 * D + F) + 2 * S * (D + F) * D + 4 * S * S * D;
    double emb = 2 * T * (double)c->Jd * D + 2 * N * (double)c->Cin * D + 2 * N * D * (double)c->Cin;
    return c->nd * dbl + c->ns * sgl + emb;
}

/* The FLUX-width random-weight transformer folder the benchmarks share (dir NULL:
 * only its grid side and text length). */
int bench_flux_model(const char *dir, int quick, int64_t *grid, int64_t *txt) {
    bench_cfg c = {.D = 3072, .H = 24, .Dh = 128, .Jd = 4096, .Pd = 768, .Cin = 64, .gh = 64, .gw = 64, .T = 512, .nd = 1, .ns = 1};
    if (quick) c.gh = c.gw = 16, c.T = 128;
    *grid = c.gh;
    *txt = c.T;
    return !dir || make_model(dir, &c) == DL_OK;
}

int cli_bench_flux(int argc, char **argv) {
    const char *json_path = NULL;
    int quick = 0, reps = 2;
    dl_dtype dt;
    if (!bench_opts(argc, argv, "flux-step", &json_path, &quick, &dt)) return 2;
    bench_cfg c = {.D = 3072, .H = 24, .Dh = 128, .Jd = 4096, .Pd = 768, .Cin = 64, .gh = 64, .gw = 64, .T = 512, .nd = 1, .ns = 1};
    if (quick) c.gh = c.gw = 16, c.T = 128, reps = 1;
    char dir[] = "/tmp/difflet-bench-flux-XXXXXX", path[4200], cmd[8192];
    if (!mkdtemp(dir)) {
        fprintf(stderr, "difflet: bench: cannot create a temporary folder\n");
        return 1;
    }
    int rc = 1;
    const int64_t N = c.gh * c.gw;
    float *lat = malloc((size_t)(N * c.Cin) * 4), *txt = malloc((size_t)(c.T * c.Jd) * 4), *pooled = malloc((size_t)c.Pd * 4);
    float *out = malloc((size_t)(N * c.Cin) * 4);
    cJSON *root = cJSON_CreateObject();
    dl_model_dir *md = NULL;
    dl_flux *m = NULL;
    printf("difflet bench flux-step: hidden %lld, %lld heads x %lld, %d double + %d single, %lld image + %lld text tokens, %s, %d threads\n"
           "  on %s: kernels %s, matmul %s (oneDNN %s)\n",
           (long long)c.D, (long long)c.H, (long long)c.Dh, c.nd, c.ns, (long long)N, (long long)c.T, dl_dtype_name(dt),
           dl_threads(), dl_cpu_model(), dl_isa_name(dl_kernel_isa()), dl_onednn_isa(), dl_onednn_version());
    bench_machine_json(root);
    cJSON_AddStringToObject(root, "dtype", dl_dtype_name(dt));
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
    dl_fill_uniform(DL_F32, lat, N * c.Cin, -1.f, 1.f, 1);
    dl_fill_uniform(DL_F32, txt, c.T * c.Jd, -1.f, 1.f, 2);
    dl_fill_uniform(DL_F32, pooled, c.Pd, -1.f, 1.f, 3);
    float ts = 0.7f, gd = 3.5f, grid[2] = {(float)c.gh, (float)c.gw};
    {
        dl_st_writer *w = dl_st_writer_new();
        int64_t sl[2] = {N, c.Cin}, st[2] = {c.T, c.Jd}, sp[1] = {c.Pd}, s1[1] = {1}, s2[1] = {2};
        dl_st_writer_add(w, "latents", DL_ST_F32, 2, sl, lat);
        dl_st_writer_add(w, "prompt_embeds", DL_ST_F32, 2, st, txt);
        dl_st_writer_add(w, "pooled", DL_ST_F32, 1, sp, pooled);
        dl_st_writer_add(w, "timestep", DL_ST_F32, 1, s1, &ts);
        dl_st_writer_add(w, "guidance", DL_ST_F32, 1, s1, &gd);
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
    double t0 = dl_now();
    if (dl_model_dir_open(&md, dir) != DL_OK || dl_flux_load(&m, md, "transformer", c.gh, c.gw, c.T, dt, NULL) != DL_OK) {
        fprintf(stderr, "difflet: bench: %s\n", dl_last_error());
        goto done;
    }
    double load_s = dl_now() - t0, best = INFINITY;
    struct rusage ru;
    for (int i = 0; i <= reps; i++) {
        t0 = dl_now();
        if (dl_flux_run(m, lat, txt, pooled, ts, gd, out, NULL) != DL_OK) {
            fprintf(stderr, "difflet: bench: %s\n", dl_last_error());
            goto done;
        }
        if (i > 0 && dl_now() - t0 < best) best = dl_now() - t0;
    }
    getrusage(RUSAGE_SELF, &ru);
    double flops = step_flops(&c), gf = flops / best * 1e-9;
    /* same-run peak: difflet's matmul in the step's dtype at a FLUX projection shape */
    const double peak = bench_matmul_rate(dt, DL_QUANT_NONE, quick ? 1024 : 4608, 3072, 12288);
    printf("  difflet:  load %.1f s, step %.3f s, %.0f GFLOP/s effective = %.2f x the same-run %s matmul (%.0f GFLOP/s), peak RSS %.0f MiB\n",
           load_s, best, gf, gf / peak, bench_matmul_label(), peak, (double)ru.ru_maxrss / 1024.0);
    cJSON_AddNumberToObject(root, "difflet_step_s", best);
    cJSON_AddNumberToObject(root, "difflet_gflops", gf);
    cJSON_AddNumberToObject(root, "matmul_gflops", peak);
    cJSON_AddNumberToObject(root, "fraction_of_matmul_peak", gf / peak);
    cJSON_AddNumberToObject(root, "step_gflop", flops * 1e-9);
    cJSON_AddNumberToObject(root, "difflet_peak_rss_mib", (double)ru.ru_maxrss / 1024.0);
    dl_flux_free(m);
    m = NULL;
    /* the peer, when the tools virtualenv exists */
    const char *py = DIFFLET_SOURCE_DIR "/tools/venv/bin/python";
    if (access(py, X_OK) != 0) {
        printf("  diffusers: not measured (no %s: run `make tools-venv`)\n", py);
        cJSON_AddNullToObject(root, "diffusers_step_s");
    } else {
        snprintf(cmd, sizeof cmd, "%s %s/tools/bench/flux_step_peer.py %s %s/inputs.safetensors %s/peer_out.safetensors %d %d %s",
                 py, DIFFLET_SOURCE_DIR, dir, dir, dir, dl_threads(), reps, dl_dtype_name(dt));
        FILE *f = popen(cmd, "r");
        char line[4096] = "";
        while (f && fgets(line, sizeof line, f)) {
            if (line[0] == '{') break;
        }
        int prc = f ? pclose(f) : -1;
        cJSON *pj = prc == 0 ? cJSON_Parse(line) : NULL;
        const cJSON *ps = cJSON_GetObjectItemCaseSensitive(pj, "step_s");
        if (!cJSON_IsNumber(ps)) {
            printf("  diffusers: the peer script failed (exit %d)\n", prc);
            cJSON_AddNullToObject(root, "diffusers_step_s");
        } else {
            double peer = ps->valuedouble;
            /* the two outputs should agree to bf16 accuracy */
            snprintf(path, sizeof path, "%s/peer_out.safetensors", dir);
            dl_checkpoint *ck;
            double rel = NAN;
            if (dl_ckpt_open(&ck, path, NULL) == DL_OK) {
                const dl_st_tensor *t = dl_ckpt_find(ck, "out");
                float *po = t && t->numel == N * c.Cin ? malloc((size_t)t->numel * 4) : NULL;
                if (po && dl_ckpt_read(t, DL_F32, po) == DL_OK) {
                    double e = 0, mx = 0;
                    for (int64_t i = 0; i < N * c.Cin; i++) {
                        e = fmax(e, fabs((double)out[i] - po[i]));
                        mx = fmax(mx, fabs((double)po[i]));
                    }
                    rel = e / mx;
                }
                free(po);
                dl_ckpt_free(ck);
            }
            printf("  diffusers: step %.3f s (torch %s, %d threads)\n", peer,
                   cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(pj, "torch")), dl_threads());
            printf("  difflet / diffusers step time: %.3f (difflet %.2f x faster); outputs differ by %.3g of max|diffusers|\n",
                   best / peer, peer / best, rel);
            cJSON_AddNumberToObject(root, "diffusers_step_s", peer);
            cJSON_AddNumberToObject(root, "speedup_vs_diffusers", peer / best);
            cJSON_AddNumberToObject(root, "output_rel_diff", rel);
        }
        cJSON_Delete(pj);
    }
    rc = 0;
    if (json_path && bench_write_json(root, json_path) != DL_OK) rc = 1;
done:
    dl_flux_free(m);
    dl_model_dir_free(md);
    cJSON_Delete(root);
    free(lat), free(txt), free(pooled), free(out);
    bench_remove_dir(dir);
    return rc;
}
