/* `difflet bench int8-step`: the int8 schemes against f32 and bf16 in one run.
 *
 * One FLUX-width denoiser step (hidden 3072, 1 double + 1 single block, 4,096 image +
 * 512 text tokens, random weights: bench_flux_model's folder) is built four times,
 * f32, bf16, int8 (W8A8 linears, bf16 activations) and int8-wo (weight-only int8),
 * and timed (best of --reps); each output is compared with the f32 one. Beside it, one
 * FLUX projection (M = tokens, K 3072, N 12288) in each scheme gives the linears'
 * own rates. Reports the step-time ratios int8 / bf16 and int8 / f32 and (--json)
 * the machine. No peer here: diffusers has no int8 CPU path to
 * compare with; `bench flux-step` measures bf16 and f32 against diffusers. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "difflet/artifact.h"
#include "difflet/check.h"
#include "difflet/flux.h"
#include "difflet/models.h"

typedef struct {
    const char *name;
    dl_dtype dt;
    dl_quant q;
} scheme;

static const scheme k_schemes[] = {
    {"f32", DL_F32, DL_QUANT_NONE}, {"bf16", DL_BF16, DL_QUANT_NONE}, {"int8", DL_BF16, DL_QUANT_W8A8}, {"int8-wo", DL_BF16, DL_QUANT_W8}};
enum { NS = sizeof k_schemes / sizeof k_schemes[0] };

int cli_bench_int8(int argc, char **argv) {
    const char *json_path = NULL;
    int quick = 0, reps = 2;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--json") && i + 1 < argc) json_path = argv[++i];
        else if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc && atoi(argv[i + 1]) > 0) reps = atoi(argv[++i]);
        else {
            fprintf(stderr, "difflet: bench int8-step: unknown option '%s' (options: --json FILE, --quick, --reps N)\n", argv[i]);
            return 2;
        }
    }
    if (quick) reps = 1;
    char dir[] = "/tmp/difflet-bench-int8-XXXXXX";
    if (!mkdtemp(dir)) {
        fprintf(stderr, "difflet: bench: cannot create a temporary folder\n");
        return 1;
    }
    int64_t grid, T;
    const int64_t Cin = 64, Jd = 4096, Pd = 768;
    int rc = 1;
    cJSON *root = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(root, "schemes");
    bench_machine_json(root);
    dl_model_dir *md = NULL;
    float *lat = NULL, *txt = NULL, *pooled = NULL, *out[NS] = {0};
    printf("difflet bench int8-step: FLUX width, 1 double + 1 single block, %d threads, on %s (kernels %s, matmul %s, "
           "oneDNN %s); int8 activations: %d levels\n",
           dl_threads(), dl_cpu_model(), dl_isa_name(dl_kernel_isa()), dl_onednn_isa(), dl_onednn_version(), dl_q8_levels());
    fflush(stdout);
    if (!bench_flux_model(dir, quick, &grid, &T) || dl_model_dir_open(&md, dir) != DL_OK) {
        fprintf(stderr, "difflet: bench: %s\n", dl_last_error());
        goto done;
    }
    const int64_t N = grid * grid;
    lat = malloc((size_t)(N * Cin) * 4), txt = malloc((size_t)(T * Jd) * 4), pooled = malloc((size_t)Pd * 4);
    if (!lat || !txt || !pooled) goto done;
    dl_fill_uniform(DL_F32, lat, N * Cin, -1.f, 1.f, 1);
    dl_fill_uniform(DL_F32, txt, T * Jd, -1.f, 1.f, 2);
    dl_fill_uniform(DL_F32, pooled, Pd, -1.f, 1.f, 3);
    double step[NS], rate[NS];
    printf("  %-8s %10s %14s %16s\n", "scheme", "step s", "vs f32 output", "projection GF/s");
    for (int si = 0; si < NS; si++) {
        const scheme *s = &k_schemes[si];
        dl_wsrc ws = {.quant = s->q};
        dl_flux *m = NULL;
        step[si] = INFINITY;
        if (!(out[si] = malloc((size_t)(N * Cin) * 4)) || dl_model_dir_checkpoint(md, "transformer", &ws.ck) != DL_OK ||
            dl_flux_load(&m, md, "transformer", grid, grid, T, s->dt, &ws) != DL_OK) {
            fprintf(stderr, "difflet: bench: %s: %s\n", s->name, dl_last_error());
            dl_ckpt_free(ws.ck);
            goto done;
        }
        dl_ckpt_free(ws.ck);
        for (int i = 0; i <= reps; i++) {
            double t0 = dl_now();
            if (dl_flux_run(m, lat, txt, pooled, 0.7f, 3.5f, out[si], NULL) != DL_OK) {
                fprintf(stderr, "difflet: bench: %s\n", dl_last_error());
                dl_flux_free(m);
                goto done;
            }
            if (i > 0 && dl_now() - t0 < step[si]) step[si] = dl_now() - t0;
        }
        dl_flux_free(m);
        double e = 0, mx = 0;
        for (int64_t i = 0; i < N * Cin; i++) {
            e = fmax(e, fabs((double)out[si][i] - out[0][i]));
            mx = fmax(mx, fabs((double)out[0][i]));
        }
        rate[si] = bench_matmul_rate(s->dt, s->q, quick ? 1024 : N + T, 3072, 12288);
        printf("  %-8s %10.3f %14.3g %16.0f\n", s->name, step[si], e / mx, rate[si]);
        fflush(stdout);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "scheme", s->name);
        cJSON_AddNumberToObject(o, "step_s", step[si]);
        cJSON_AddNumberToObject(o, "output_rel_diff_vs_f32", e / mx);
        cJSON_AddNumberToObject(o, "projection_gflops", rate[si]);
        cJSON_AddItemToArray(arr, o);
    }
    printf("  int8 step vs bf16: %.2f x faster, vs f32: %.2f x; int8-wo vs bf16: %.2f x; projection int8 / f32 rate: %.2f\n",
           step[1] / step[2], step[0] / step[2], step[1] / step[3], rate[2] / rate[0]);
    cJSON_AddNumberToObject(root, "int8_speedup_vs_bf16", step[1] / step[2]);
    cJSON_AddNumberToObject(root, "int8_speedup_vs_f32", step[0] / step[2]);
    cJSON_AddNumberToObject(root, "int8_levels", dl_q8_levels());
    rc = 0;
    if (json_path && bench_write_json(root, json_path) != DL_OK) rc = 1;
done:
    dl_model_dir_free(md);
    cJSON_Delete(root);
    free(lat), free(txt), free(pooled);
    for (int i = 0; i < NS; i++) free(out[i]);
    bench_remove_dir(dir);
    return rc;
}
