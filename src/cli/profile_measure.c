/* `difflet profile measure`: the DDiT profile (the paper's RIB) measured on this
 * machine with difflet's own parallel execution. For each size and each DoP d
 * (1, 2, 4, 8 up to --max-dop), one mpirun job of d ranks x 1 thread runs the whole
 * pipeline: the DiT phase with the transformer context-parallel over the d ranks
 * (Ulysses when the heads divide, else ring), the VAE phase on the host rank. The
 * best of --reps requests after a warm-up gives the phase times, which are stored
 * under --name for `difflet simulate --profile NAME`. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "difflet/registry.h"
#include "difflet/comm.h"
#include "difflet/pipeline.h"
#include "difflet/sched.h"

#ifndef DIFFLET_SOURCE_DIR
#define DIFFLET_SOURCE_DIR "."
#endif

static const char *opt(int argc, char **argv, const char *key, const char *def) {
    for (int i = 0; i + 1 < argc; i++)
        if (!strcmp(argv[i], key)) return argv[i + 1];
    return def;
}

/* one DoP's job: every rank loads its part; the host times the requests */
int cli_profile_measure_rank(int argc, char **argv) {
    const char *model = opt(argc, argv, "--model", NULL), *layout = opt(argc, argv, "--layout", "1");
    const char *json = opt(argc, argv, "--json", NULL);
    int w = 0, h = 0, steps = atoi(opt(argc, argv, "--steps", "30")), reps = atoi(opt(argc, argv, "--reps", "2"));
    dl_comm *world;
    dl_par_config pc;
    dl_par_place pl = {0};
    dl_pipeline *p = NULL;
    sscanf(opt(argc, argv, "--size", ""), "%dx%d", &w, &h);
    int par = dl_par_parse(layout, &pc) == DL_OK && dl_par_ranks(&pc) > 1;
    if (!model || !json || dl_comm_world(&world) != DL_OK || (par && dl_par_place_new(world, &pc, &pl) != DL_OK)) {
        fprintf(stderr, "difflet: profile measure-rank: %s\n", dl_last_error());
        dl_comm_abort(1);
    }
    dl_gen_shape shape = {.frames = 1, .width = w, .height = h, .dt = dl_cpu()->avx512_bf16 ? DL_BF16 : DL_F32, .par = par ? &pl : NULL};
    if (dl_pipeline_load(&p, model, &shape) != DL_OK) {
        fprintf(stderr, "difflet: profile measure: %s\n", dl_last_error());
        dl_comm_abort(1);
    }
    if (!dl_pipeline_is_host(p)) {
        if (dl_pipeline_worker(p) != DL_OK) dl_comm_abort(1);
    } else {
        double dit = 1e30, vae = 1e30;
        uint8_t *rgb = malloc((size_t)w * h * 3);
        for (int r = 0; r <= reps; r++) { /* r = 0: warm-up */
            dl_gen_request q = {.prompt = "a large red circle in the centre on a blue background", .steps = steps,
                                 .guidance = 3.5f, .true_cfg = 1.f, .seed = (uint64_t)r};
            dl_gen_timing tm;
            if (!rgb || dl_pipeline_generate_rgb(p, &q, rgb, &tm) != DL_OK) {
                fprintf(stderr, "difflet: profile measure: %s\n", rgb ? dl_last_error() : "out of memory");
                dl_comm_abort(1);
            }
            if (r > 0 && tm.denoise_s < dit) dit = tm.denoise_s;
            if (r > 0 && tm.decode_s < vae) vae = tm.decode_s;
        }
        free(rgb);
        char text[256];
        snprintf(text, sizeof text, "{\"dit\":%.6f,\"vae\":%.6f}", dit, vae);
        if (dl_file_write_atomic(json, text, strlen(text)) != DL_OK) dl_comm_abort(1);
    }
    dl_pipeline_free(p);
    if (par) dl_par_place_free(&pl);
    dl_comm_finalize();
    return 0;
}

int cli_profile_measure(int argc, char **argv, const char *db, const char *name) {
    const char *model = opt(argc, argv, "--model", DIFFLET_SOURCE_DIR "/models/difflet-tiny");
    const char *sizes = opt(argc, argv, "--sizes", "64x64,128x128,256x256");
    const char *steps = opt(argc, argv, "--steps", "30"), *reps = opt(argc, argv, "--reps", "2");
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int max_dop = atoi(opt(argc, argv, "--max-dop", "0"));
    if (max_dop <= 0) max_dop = ncpu > 0 ? (int)ncpu : 1;
    if (atoi(steps) < 1 || atoi(reps) < 1) {
        fprintf(stderr, "difflet profile measure: --steps and --reps must be positive\n");
        return 2;
    }
    char model_buf[4096];
    if (!cli_model("profile measure", model, model_buf, sizeof model_buf)) return 1;
    model = model_buf;
    if (max_dop > 1 && !dl_comm_have_mpi()) {
        fprintf(stderr, "difflet profile measure: DoP above 1 needs MPI, and this build has none (make deps)\n");
        return 2;
    }
    char tmp[] = "/tmp/difflet-profile-XXXXXX", res[4200], layout[64], list[512];
    if (!mkdtemp(tmp)) return 1;
    dl_profile prof;
    memset(&prof, 0, sizeof prof);
    prof.steps = atoi(steps);
    snprintf(list, sizeof list, "%s", sizes);
    printf("difflet profile measure: %s, %s steps, DoP up to %d (ranks x 1 thread; the DiT phase context-parallel)\n",
           model, steps, max_dop);
    int rc = 0;
    for (char *save = NULL, *sz = strtok_r(list, ",", &save); sz && rc == 0; sz = strtok_r(NULL, ",", &save)) {
        int w, h;
        char x;
        if (sscanf(sz, "%d%c%d", &w, &x, &h) != 3 || x != 'x' || prof.nres == DL_SCHED_MAX_RES) {
            fprintf(stderr, "difflet profile measure: --sizes: `%s` is not WxH (at most %d sizes)\n", sz, DL_SCHED_MAX_RES);
            rc = 2;
            break;
        }
        int r = prof.nres++;
        snprintf(prof.name[r], sizeof prof.name[r], "%.15s", sz);
        for (int d = 1; d <= max_dop && d <= 8 && rc == 0; d *= 2) {
            dl_par_config pc;
            snprintf(layout, sizeof layout, d == 1 ? "1" : "cp=%d:ulysses", d);
            dl_par_parse(layout, &pc);
            if (d > 1 && !cli_layout_ok("profile measure", model, layout, &pc, 1)) /* heads do not divide: ring */
                snprintf(layout, sizeof layout, "cp=%d:ring", d);
            snprintf(res, sizeof res, "%s/%s-%d.json", tmp, sz, d);
            char *args[] = {"--model", (char *)model, "--size", sz, "--steps", (char *)steps, "--reps", (char *)reps,
                            "--layout", layout, "--json", res};
            const char *sub[2] = {"profile", "measure-rank"};
            int code = cli_mpirun(sub, 2, 12, args, d, 1, 0);
            cJSON *j = NULL;
            if (code != 0 || dl_json_read_object(res, NULL, &j) != DL_OK) {
                fprintf(stderr, "difflet profile measure: %s at DoP %d failed (exit %d)\n", sz, d, code);
                rc = 1;
                break;
            }
            int di = dl_dop_index(d);
            prof.dit[r][di] = cJSON_GetObjectItem(j, "dit")->valuedouble;
            prof.vae[r][di] = cJSON_GetObjectItem(j, "vae")->valuedouble; /* the host decodes: DoP 1 */
            printf("  %-10s DoP %d (%s): DiT %.3f s, VAE %.3f s\n", sz, d, layout, prof.dit[r][di], prof.vae[r][di]);
            fflush(stdout);
            cJSON_Delete(j);
        }
    }
    char cmd[4300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (system(cmd) != 0) fprintf(stderr, "difflet: could not remove %s\n", tmp);
    if (rc) return rc;
    if (dl_profile_store_put(db, name, &prof) != DL_OK) {
        fprintf(stderr, "difflet: %s\n", dl_last_error());
        return 1;
    }
    printf("stored as '%s' in %s (use: difflet simulate --profile %s)\n", name, db, name);
    return 0;
}
