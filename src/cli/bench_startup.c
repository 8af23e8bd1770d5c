/* `difflet bench startup`: what a restart costs with and without programs.
 *   FLUX-width transformer (1 double + 1 single block, bf16, ~1 GB of weights):
 *     load from the checkpoint (read, convert, pack) vs compile (the same + write the
 *     artifact) vs load from the artifact (map, build primitives), with each
 *     process's anonymous and file-backed resident memory;
 *   the tiny parity pipeline: time to the first image of a 1-step generate with an
 *     empty cache (compile + run) and with a warm cache.
 * Each measurement runs in a fresh child process (`difflet bench startup-child`), so
 * page cache aside, nothing carries over between them. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "cli/cli.h"
#include "difflet/pipeline.h"
#include "difflet/program.h"
#include "difflet/flux.h"

#ifndef DIFFLET_SOURCE_DIR
#define DIFFLET_SOURCE_DIR "."
#endif

/* RssAnon and RssFile of this process, MiB */
static void rss(double *anon, double *file) {
    *anon = *file = -1;
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    while (f && fgets(line, sizeof line, f)) {
        long kb;
        if (sscanf(line, "RssAnon: %ld", &kb) == 1) *anon = kb / 1024.0;
        if (sscanf(line, "RssFile: %ld", &kb) == 1) *file = kb / 1024.0;
    }
    if (f) fclose(f);
}

static dl_status startup_build(void *c, dl_wsrc *ws) {
    struct {
        dl_model_dir *md;
        dl_flux **m;
        int64_t g, t;
    } *x = c;
    if (!ws) { /* release: the compile is reloaded from its program */
        dl_flux_free(*x->m);
        *x->m = NULL;
        return DL_OK;
    }
    return dl_flux_load(x->m, x->md, "transformer", x->g, x->g, x->t, DL_BF16, ws);
}

/* child: MODE DIR GRID TXT; prints one JSON line */
int cli_bench_startup_child(int argc, char **argv) {
    if (argc < 2) return 2;
    const char *mode = argv[0], *dir = argv[1];
    double t0 = dl_now();
    if (!strcmp(mode, "generate")) { /* tiny pipeline, 1 step */
        dl_flux_shape sh = {.width = 32, .height = 48, .max_sequence_length = 32, .dt = DL_F32};
        dl_flux_pipeline *p;
        uint8_t rgb[48 * 32 * 3];
        dl_flux_request r = {.prompt = "a red circle", .steps = 1, .true_cfg = 1.f, .seed = 1};
        if (dl_flux_pipeline_load(&p, dir, &sh) != DL_OK || dl_flux_generate(p, &r, rgb, NULL, NULL) != DL_OK) {
            fprintf(stderr, "difflet: %s\n", dl_last_error());
            return 1;
        }
        dl_flux_pipeline_free(p);
        printf("{\"seconds\": %.4f}\n", dl_now() - t0);
        return 0;
    }
    int64_t grid = atoll(argv[2]), txt = atoll(argv[3]);
    dl_model_dir *md;
    if (dl_model_dir_open(&md, dir) != DL_OK) {
        fprintf(stderr, "difflet: %s\n", dl_last_error());
        return 1;
    }
    dl_cache_mode cm = !strcmp(mode, "checkpoint") ? DL_CACHE_OFF : DL_CACHE_USE;
    char shp[128], *key = NULL, id[17];
    snprintf(shp, sizeof shp, "{\"grid\":%lld,\"text\":%lld}", (long long)grid, (long long)txt);
    dl_flux *m = NULL;
    dl_artifact *art = NULL;
    struct {
        dl_model_dir *md;
        dl_flux **m;
        int64_t g, t;
    } ctx = {md, &m, grid, txt};
    dl_status s = dl_program_key(md, "transformer", shp, DL_BF16, DL_QUANT_NONE, 0, &key, id);
    double t1 = dl_now(); /* the key (checkpoint content hash) is part of the load */
    if (s == DL_OK) s = dl_program_get(md, "transformer", key, id, cm, DL_QUANT_NONE, startup_build, &ctx, &art);
    double secs = dl_now() - t0, anon, file;
    rss(&anon, &file);
    if (s != DL_OK) {
        fprintf(stderr, "difflet: %s\n", dl_last_error());
        return 1;
    }
    printf("{\"seconds\": %.4f, \"key_seconds\": %.4f, \"rss_anon_mib\": %.1f, \"rss_file_mib\": %.1f}\n", secs, t1 - t0,
           anon, file);
    dl_flux_free(m);
    dl_artifact_close(art);
    dl_model_dir_free(md);
    free(key);
    return 0;
}

static cJSON *child(const char *env, const char *args) {
    char cmd[4096], line[1024] = "";
    snprintf(cmd, sizeof cmd, "%s DIFFLET_LOG=error /proc/%d/exe bench startup-child %s", env, (int)getpid(), args);
    FILE *f = popen(cmd, "r");
    while (f && fgets(line, sizeof line, f))
        if (line[0] == '{') break;
    int rc = f ? pclose(f) : -1;
    return rc == 0 ? cJSON_Parse(line) : NULL;
}

static double num(const cJSON *j, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, k);
    return cJSON_IsNumber(v) ? v->valuedouble : -1;
}

int cli_bench_startup(int argc, char **argv) {
    const char *json_path = NULL;
    int quick = 0;
    if (!bench_opts(argc, argv, "startup", &json_path, &quick, NULL)) return 2;
    char dir[] = "/tmp/difflet-bench-start-XXXXXX", cache[256], env[512], args[1024];
    if (!mkdtemp(dir)) return 1;
    snprintf(cache, sizeof cache, "%s/cache", dir);
    snprintf(env, sizeof env, "DIFFLET_CACHE=%s", cache);
    int64_t grid, txt;
    char model[300];
    snprintf(model, sizeof model, "%s/model", dir);
    printf("difflet bench startup%s\n", quick ? " (quick)" : "");
    fflush(stdout);
    int rc = 1;
    cJSON *root = cJSON_CreateObject(), *a = NULL, *b = NULL, *c = NULL, *g1 = NULL, *g2 = NULL;
    if (!bench_flux_model(model, quick, &grid, &txt)) {
        fprintf(stderr, "difflet: bench: %s\n", dl_last_error());
        goto done;
    }
    snprintf(args, sizeof args, "%%s %s %lld %lld", model, (long long)grid, (long long)txt);
    char full[1200];
    /* warm the page cache once so the first measurement is not the only one reading the disk */
    snprintf(full, sizeof full, "checkpoint %s %lld %lld", model, (long long)grid, (long long)txt);
    cJSON_Delete(child(env, full));
    a = child(env, full);
    snprintf(full, sizeof full, "compile %s %lld %lld", model, (long long)grid, (long long)txt);
    b = child(env, full);
    snprintf(full, sizeof full, "artifact %s %lld %lld", model, (long long)grid, (long long)txt);
    c = child(env, full);
    if (!a || !b || !c) {
        fprintf(stderr, "difflet: bench startup: a child failed\n");
        goto done;
    }
    printf("FLUX-width transformer (bf16), load phase:\n");
    printf("  from the checkpoint (convert + pack): %7.2f s  anon %7.0f MiB  file %7.0f MiB\n", num(a, "seconds"),
           num(a, "rss_anon_mib"), num(a, "rss_file_mib"));
    printf("  compile (the same + write artifact):  %7.2f s\n", num(b, "seconds"));
    printf("  from the artifact (map + primitives): %7.2f s  anon %7.0f MiB  file %7.0f MiB  (key %.2f s)\n",
           num(c, "seconds"), num(c, "rss_anon_mib"), num(c, "rss_file_mib"), num(c, "key_seconds"));
    printf("  checkpoint / artifact load time: %.1f x\n", num(a, "seconds") / num(c, "seconds"));
    cJSON_AddNumberToObject(root, "checkpoint_load_s", num(a, "seconds"));
    cJSON_AddNumberToObject(root, "compile_s", num(b, "seconds"));
    cJSON_AddNumberToObject(root, "artifact_load_s", num(c, "seconds"));
    cJSON_AddNumberToObject(root, "load_speedup", num(a, "seconds") / num(c, "seconds"));
    cJSON_AddNumberToObject(root, "checkpoint_rss_anon_mib", num(a, "rss_anon_mib"));
    cJSON_AddNumberToObject(root, "artifact_rss_anon_mib", num(c, "rss_anon_mib"));
    cJSON_AddNumberToObject(root, "artifact_rss_file_mib", num(c, "rss_file_mib"));
    /* the tiny pipeline: first image with an empty and with a warm cache */
    snprintf(cache, sizeof cache, "%s/cache2", dir);
    snprintf(env, sizeof env, "DIFFLET_CACHE=%s", cache);
    snprintf(full, sizeof full, "generate %s/tests/data/flux/dev", DIFFLET_SOURCE_DIR);
    g1 = child(env, full);
    g2 = child(env, full);
    if (g1 && g2) {
        printf("tiny parity pipeline, 1-step generate 32x48: empty cache %.3f s, warm cache %.3f s (%.1f x)\n",
               num(g1, "seconds"), num(g2, "seconds"), num(g1, "seconds") / num(g2, "seconds"));
        cJSON_AddNumberToObject(root, "tiny_first_image_cold_s", num(g1, "seconds"));
        cJSON_AddNumberToObject(root, "tiny_first_image_warm_s", num(g2, "seconds"));
    }
    rc = 0;
    if (json_path) {
        char *t = cJSON_Print(root);
        if (!t || dl_file_write_atomic(json_path, t, strlen(t)) != DL_OK) rc = 1;
        free(t);
    }
done:
    cJSON_Delete(a), cJSON_Delete(b), cJSON_Delete(c), cJSON_Delete(g1), cJSON_Delete(g2), cJSON_Delete(root);
    snprintf(full, sizeof full, "rm -rf %s", dir);
    if (system(full) != 0) fprintf(stderr, "difflet: could not remove %s\n", dir);
    (void)args;
    return rc;
}
