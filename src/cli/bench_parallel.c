/* `difflet bench parallel`: one denoiser step of the FLUX-width block model (hidden
 * 3072, 24 heads, 1 double + 1 single block, 4,096 image + 512 text tokens, bf16)
 * on 1 rank x 2 threads, and on 2 ranks x 1 thread in every two-rank layout: TP,
 * TP + SP, and CP by Ulysses, ring and gather. Each layout runs as its own mpirun
 * job (`bench parallel-rank`), all in this run, so every ratio is against the
 * 1-rank step measured minutes apart on the same machine. Per layout: the step time
 * (slowest rank, best of the repetitions), its ratio to the 1-rank step, and per
 * step the bytes each rank sent and the seconds it spent in communication. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "difflet/comm.h"
#include "difflet/pipeline.h"
#include "difflet/flux.h"

/* the child: this rank's part of one layout, timed; rank 0 writes the result */
int cli_bench_parallel_rank(int argc, char **argv) {
    const char *dir = NULL, *spec = "1", *json = NULL;
    int reps = 3, quick = 0;
    for (int i = 0; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--model")) dir = argv[i + 1];
        else if (!strcmp(argv[i], "--layout")) spec = argv[i + 1];
        else if (!strcmp(argv[i], "--json")) json = argv[i + 1];
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--quick")) quick = atoi(argv[i + 1]);
    }
    dl_comm *world;
    dl_par_config pc;
    dl_par_place pl = {0};
    dl_model_dir *md = NULL;
    dl_flux *m = NULL;
    if (!dir || !json || reps < 1 || dl_par_parse(spec, &pc) != DL_OK || dl_comm_world(&world) != DL_OK ||
        dl_par_place_new(world, &pc, &pl) != DL_OK || dl_model_dir_open(&md, dir) != DL_OK) {
        fprintf(stderr, "difflet: bench parallel-rank: %s\n", dl_last_error());
        dl_comm_abort(1);
    }
    int64_t gh, T, Jd, Pd;
    bench_flux_model(NULL, quick, &gh, &T);
    if (dl_flux_load_split(&m, md, "transformer", gh, gh, T, DL_BF16, NULL, &pl.split) != DL_OK) {
        fprintf(stderr, "difflet: bench parallel-rank: %s\n", dl_last_error());
        dl_comm_abort(1);
    }
    dl_flux_text_dims(m, &Jd, &Pd);
    const int64_t N = gh * gh, C = dl_flux_in_channels(m);
    float *lat = malloc((size_t)(N * C) * 4), *txt = malloc((size_t)(T * Jd) * 4), *pooled = malloc((size_t)Pd * 4);
    float *out = malloc((size_t)(N * C) * 4);
    dl_randn(1, lat, N * C), dl_randn(2, txt, T * Jd), dl_randn(3, pooled, Pd);
    dl_comm *cs[2] = {pl.tp_comm, pl.cp_comm};
    double best = 1e30, bytes = 0, comm = 0;
    for (int r = 0; r <= reps; r++) { /* r = 0: warm-up */
        for (int i = 0; i < 2; i++) dl_comm_stats_reset(cs[i]);
        dl_comm_barrier(world);
        double t0 = dl_now();
        if (dl_flux_run(m, lat, txt, pooled, 0.7f, 3.5f, out, NULL) != DL_OK) {
            fprintf(stderr, "difflet: bench parallel-rank: %s\n", dl_last_error());
            dl_comm_abort(1);
        }
        float t[3] = {(float)(dl_now() - t0), 0, 0};
        for (int i = 0; i < 2; i++) {
            dl_comm_stats st = dl_comm_stats_get(cs[i]);
            t[1] += (float)st.bytes, t[2] += (float)st.seconds;
        }
        /* the step ends when the slowest rank is done; bytes and comm time: the mean rank */
        float all[3 * 64];
        dl_comm_allgather(world, t, sizeof t, all);
        float mx = 0, b = 0, c = 0;
        int n = dl_comm_size(world);
        for (int i = 0; i < n; i++) mx = all[3 * i] > mx ? all[3 * i] : mx, b += all[3 * i + 1] / n, c += all[3 * i + 2] / n;
        if (r > 0 && mx < best) best = mx, bytes = b, comm = c;
    }
    if (dl_comm_rank(world) == 0) {
        char text[512];
        snprintf(text, sizeof text, "{\"layout\":\"%s\",\"ranks\":%d,\"threads\":%d,\"step_s\":%.6f,\"bytes_per_rank\":%.0f,\"comm_s_per_rank\":%.6f}",
                 spec, dl_comm_size(world), dl_threads(), best, bytes, comm);
        dl_file_write_atomic(json, text, strlen(text));
    }
    dl_flux_free(m);
    dl_model_dir_free(md);
    free(lat), free(txt), free(pooled), free(out);
    dl_par_place_free(&pl);
    dl_comm_finalize();
    return 0;
}

int cli_bench_parallel(int argc, char **argv) {
    const char *json_path = NULL;
    int quick = 0;
    if (!bench_opts(argc, argv, "parallel", &json_path, &quick, NULL)) return 2;
    if (!dl_comm_have_mpi()) {
        fprintf(stderr, "difflet: bench parallel: this build has no MPI (make deps installs Open MPI)\n");
        return 1;
    }
    char dir[] = "/tmp/difflet-bench-par-XXXXXX", res[4200];
    if (!mkdtemp(dir)) {
        fprintf(stderr, "difflet: bench: cannot create a temporary folder\n");
        return 1;
    }
    int64_t gh, T;
    if (!bench_flux_model(dir, quick, &gh, &T)) {
        fprintf(stderr, "difflet: bench: %s\n", dl_last_error());
        return 1;
    }
    static const struct {
        const char *layout, *label;
        int ranks, threads;
    } runs[] = {{"1", "1 rank x 2 threads", 1, 2},     {"tp=2", "TP2", 2, 1},
                {"tp=2,sp", "TP2 + SP", 2, 1},         {"cp=2:ulysses", "CP2 ulysses", 2, 1},
                {"cp=2:ring", "CP2 ring", 2, 1},       {"cp=2:gather", "CP2 gather", 2, 1}};
    printf("difflet bench parallel: hidden 3072, 24 heads x 128, 1 double + 1 single block, %lld image + %lld text tokens, "
           "bf16; each layout its own mpirun job\n\n  %-20s %6s %10s %8s %12s %10s\n",
           (long long)(gh * gh), (long long)T, "layout", "ranks", "step s", "ratio", "MiB sent", "comm s");
    fflush(stdout);
    cJSON *root = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(root, "layouts");
    double base = 0, best2 = 1e30;
    const char *best_label = "";
    int rc = 0;
    char reps[8];
    snprintf(reps, sizeof reps, "%d", quick ? 1 : 3);
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        snprintf(res, sizeof res, "%s/result-%zu.json", dir, i);
        char *args[] = {"--model", dir, "--layout", (char *)runs[i].layout, "--json", res, "--reps", reps, "--quick",
                        quick ? "1" : "0"};
        const char *sub[2] = {"bench", "parallel-rank"};
        int code = cli_mpirun(sub, 2, 10, args, runs[i].ranks, runs[i].threads, 0);
        cJSON *j = NULL;
        if (code != 0 || dl_json_read_object(res, NULL, &j) != DL_OK) {
            fprintf(stderr, "difflet: bench parallel: layout %s failed (exit %d)\n", runs[i].layout, code);
            rc = 1;
            continue;
        }
        double st = cJSON_GetObjectItem(j, "step_s")->valuedouble, by = cJSON_GetObjectItem(j, "bytes_per_rank")->valuedouble;
        double cs = cJSON_GetObjectItem(j, "comm_s_per_rank")->valuedouble;
        if (i == 0) base = st;
        double ratio = base > 0 ? st / base : 0;
        if (i > 0 && st < best2) best2 = st, best_label = runs[i].label;
        printf("  %-20s %6d %10.3f %8.2f %12.1f %10.3f\n", runs[i].label, runs[i].ranks, st, ratio, by / (1 << 20), cs);
        fflush(stdout);
        cJSON_AddStringToObject(j, "label", runs[i].label);
        cJSON_AddNumberToObject(j, "ratio_to_1rank", ratio);
        cJSON_AddItemToArray(arr, j);
    }
    if (base > 0 && best2 < 1e30) {
        printf("\nbest 2-rank layout: %s, %.2fx the 1-rank x 2-thread step (goal: within 1.10x)\n", best_label, best2 / base);
        cJSON_AddStringToObject(root, "best_two_rank", best_label);
        cJSON_AddNumberToObject(root, "best_two_rank_ratio", best2 / base);
    }
    if (json_path) {
        char *text = cJSON_Print(root);
        if (!text || dl_file_write_atomic(json_path, text, strlen(text)) != DL_OK) rc = 1;
        free(text);
    }
    cJSON_Delete(root);
    char cmd[4300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "difflet: bench: could not remove %s\n", dir);
    return rc;
}
