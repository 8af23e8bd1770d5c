/* What the model benchmarks (bench_wan.c, bench_qwen.c) share: the process's memory,
 * a same-run oneDNN matmul peak, the diffusers peer in the tools virtualenv, and the
 * agreement of two outputs. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "difflet/check.h"
#include "difflet/kernels.h"

#ifndef DIFFLET_SOURCE_DIR
#define DIFFLET_SOURCE_DIR "."
#endif

void bench_rss_mib(double *cur, double *peak) {
    *cur = *peak = NAN;
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    while (f && fgets(line, sizeof line, f)) {
        if (!strncmp(line, "VmRSS:", 6)) *cur = atof(line + 6) / 1024.0;
        if (!strncmp(line, "VmHWM:", 6)) *peak = atof(line + 6) / 1024.0;
    }
    if (f) fclose(f);
}

int bench_rss_reset(void) {
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f) return 0;
    int ok = fputs("5", f) >= 0;
    return fclose(f) == 0 && ok;
}

double bench_matmul_peak(dl_dtype dt, int64_t M, int64_t K, int64_t Nn) {
    const size_t es = dl_dtype_size(dt);
    void *w = malloc((size_t)(K * Nn) * es), *x = malloc((size_t)(M * K) * es), *y = malloc((size_t)(M * Nn) * es);
    double tb = INFINITY;
    dl_matmul *mm;
    dl_matmul_desc d = {.m = M, .k = K, .n = Nn, .dt = dt, .dst_dt = dt};
    if (w && x && y) {
        dl_fill_uniform(dt, w, K * Nn, -0.05f, 0.05f, 9);
        dl_fill_uniform(dt, x, M * K, -1.f, 1.f, 10);
        if (dl_matmul_new(&mm, &d, w, dt, NULL) == DL_OK) {
            for (int i = 0; i < 3; i++) {
                double t = dl_now();
                dl_matmul_run(mm, x, y);
                if (i && dl_now() - t < tb) tb = dl_now() - t;
            }
            dl_matmul_free(mm);
        }
    }
    free(w), free(x), free(y);
    return 2.0 * (double)M * (double)K * (double)Nn / tb * 1e-9;
}

cJSON *bench_run_peer(const char *script, const char *dir, int reps, int warm, dl_dtype dt) {
    const char *py = DIFFLET_SOURCE_DIR "/tools/venv/bin/python";
    char cmd[8192], line[4096] = "";
    const char *env = getenv("DIFFLET_BENCH_PEER");
    if (env && !strcmp(env, "off")) {
        printf("  diffusers: not measured (DIFFLET_BENCH_PEER=off)\n");
        return NULL;
    }
    if (access(py, X_OK) != 0) {
        printf("  diffusers: not measured (no %s: run `make tools-venv`)\n", py);
        return NULL;
    }
    snprintf(cmd, sizeof cmd, "%s %s/tools/bench/%s %s %s/inputs.safetensors %s/peer_out.safetensors %d %d %s %d", py,
             DIFFLET_SOURCE_DIR, script, dir, dir, dir, dl_threads(), reps, dl_dtype_name(dt), warm);
    fflush(stdout);
    FILE *f = popen(cmd, "r");
    while (f && fgets(line, sizeof line, f))
        if (line[0] == '{') break;
    int prc = f ? pclose(f) : -1;
    cJSON *pj = prc == 0 ? cJSON_Parse(line) : NULL;
    if (!cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(pj, "step_s"))) {
        printf("  diffusers: not measured: the peer script failed (exit %d)\n", prc);
        cJSON_Delete(pj);
        return NULL;
    }
    return pj;
}

double bench_rel_diff(const char *path, const float *a, int64_t n) {
    dl_checkpoint *ck;
    double rel = NAN;
    if (dl_ckpt_open(&ck, path, NULL) != DL_OK) return rel;
    const dl_st_tensor *t = dl_ckpt_find(ck, "out");
    float *b = t && t->numel == n ? malloc((size_t)n * 4) : NULL;
    if (b && dl_ckpt_read(t, DL_F32, b) == DL_OK) {
        double e = 0, mx = 0;
        for (int64_t i = 0; i < n; i++) {
            e = fmax(e, fabs((double)a[i] - b[i]));
            mx = fmax(mx, fabs((double)b[i]));
        }
        rel = e / mx;
    }
    free(b);
    dl_ckpt_free(ck);
    return rel;
}
