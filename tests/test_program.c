/* Programs: compile on a miss, load on a hit; runtime settings compile nothing; a
 * size change recompiles only the size-dependent components and a dtype change all
 * of them; artifacts give the same bits as building from the checkpoint; a flipped
 * byte or truncated manifest is refused (or rebuilt on request); a compile killed
 * mid-way leaves nothing a load accepts; concurrent compiles of one key agree. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "difflet/pipeline.h"
#include "difflet/program.h"
#include "models/models_impl.h"
#include "test_util.h"
#include "difflet/flux.h"

#define MODEL DATA_DIR "/flux/dev"

static const char *g_bin;
static char g_cache[64];

static dl_flux_pipeline *load(int w, int h, dl_dtype dt, int mode) {
    dl_flux_shape s = {.width = w, .height = h, .max_sequence_length = 32, .dt = dt, .cache = mode};
    dl_flux_pipeline *p = NULL;
    if (dl_flux_pipeline_load(&p, MODEL, &s) != DL_OK) return NULL;
    return p;
}

static int gen(dl_flux_pipeline *p, const char *prompt, int steps, float guidance, uint64_t seed, uint8_t *rgb) {
    dl_flux_request r = {.prompt = prompt, .steps = steps, .guidance = guidance, .true_cfg = 1.f, .seed = seed};
    return dl_flux_generate(p, &r, rgb, NULL, NULL) == DL_OK;
}

static int delta_compiles(dl_program_stats a) { return dl_program_stats_get().compiles - a.compiles; }
static int delta_loads(dl_program_stats a) { return dl_program_stats_get().loads - a.loads; }

static void prog_dir(dl_flux_pipeline *p, int comp, char *out, size_t n) {
    snprintf(out, n, "%s/programs/%s", g_cache, dl_flux_pipeline_program_id(p, comp));
}

/* program folders: 16 hex digits, a directory */
static int count_programs(void) {
    char root[128];
    snprintf(root, sizeof root, "%s/programs", g_cache);
    DIR *d = opendir(root);
    int n = 0;
    struct dirent *de;
    while (d && (de = readdir(d)))
        if (strlen(de->d_name) == 16 && strspn(de->d_name, "0123456789abcdef") == 16) n++;
    if (d) closedir(d);
    return n;
}

static int count_dirs(const char *prefix) {
    char root[128];
    snprintf(root, sizeof root, "%s/programs", g_cache);
    DIR *d = opendir(root);
    int n = 0;
    struct dirent *de;
    while (d && (de = readdir(d))) n += !strncmp(de->d_name, prefix, strlen(prefix));
    if (d) closedir(d);
    return n;
}

/* The arena planner: buffers whose lifetimes do not intersect share bytes. */
static void test_plan(void) {
    void *a, *b, *c, *arena;
    act_plan pl = {0};
    dl_wsrc ws = {0};
    dl_plan_add(&pl, &a, 100, 0, 0); /* phase 0 only */
    dl_plan_add(&pl, &b, 100, 1, 1); /* phase 1 only: may reuse a's bytes */
    dl_plan_add(&pl, &c, 50, 0, 1);  /* live throughout: apart from both */
    CHECK(dl_plan_commit(&pl, &ws, &arena) == DL_OK, "%s", dl_last_error());
    CHECK(pl.total == 192 && ws.arena == 192, "192 bytes instead of 320 (%zu)", pl.total);
    CHECK(a == b && (char *)c >= (char *)a + 128, "a and b share, c is apart");
    CHECK(((uintptr_t)a % 64) == 0 && ((uintptr_t)c % 64) == 0, "64-byte aligned");
    dl_aligned_free(arena);
}

int main(int argc, char **argv) {
    g_bin = argc > 1 ? argv[1] : "build/difflet";
    snprintf(g_cache, sizeof g_cache, "/tmp/difflet_prog_XXXXXX");
    if (!mkdtemp(g_cache)) return 1;
    setenv("DIFFLET_CACHE", g_cache, 1);
    static uint8_t a[48 * 32 * 3], b[48 * 32 * 3];
    test_plan();

    /* miss: 4 compiles; hit: 4 loads, same bits */
    dl_program_stats st = dl_program_stats_get();
    dl_flux_pipeline *p = load(32, 48, DL_F32, DL_CACHE_USE);
    CHECK(p && delta_compiles(st) == 4 && delta_loads(st) == 0, "first start compiles 4 programs: %s", p ? "" : dl_last_error());
    if (!p) return test_done("test_program");
    CHECK(gen(p, "a red circle", 3, 3.5f, 11, a), "%s", dl_last_error());
    dl_flux_pipeline_free(p);
    st = dl_program_stats_get();
    p = load(32, 48, DL_F32, DL_CACHE_USE);
    CHECK(p && delta_compiles(st) == 0 && delta_loads(st) == 4, "restart loads 4 programs, compiles none");
    CHECK(gen(p, "a red circle", 3, 3.5f, 11, b) && !memcmp(a, b, sizeof a), "loaded programs give the same bits");
    /* runtime settings: steps, guidance, seed, prompt -> zero compiles */
    st = dl_program_stats_get();
    CHECK(gen(p, "a blue square", 5, 2.0f, 99, b), "other settings run");
    CHECK(delta_compiles(st) == 0 && delta_loads(st) == 0, "changing steps, guidance, seed, prompt compiles nothing");
    char tdir[256], vdir[256];
    prog_dir(p, 3, tdir, sizeof tdir);
    prog_dir(p, 2, vdir, sizeof vdir);
    dl_flux_pipeline_free(p);
    /* the same from the checkpoint, nothing cached */
    st = dl_program_stats_get();
    p = load(32, 48, DL_F32, DL_CACHE_OFF);
    CHECK(p && gen(p, "a red circle", 3, 3.5f, 11, b) && !memcmp(a, b, sizeof a), "artifact and checkpoint paths agree bit for bit");
    CHECK(delta_compiles(st) == 0 && delta_loads(st) == 0, "--no-cache touches no program");
    dl_flux_pipeline_free(p);
    /* size: only the VAE and the transformer; dtype: everything */
    st = dl_program_stats_get();
    p = load(64, 48, DL_F32, DL_CACHE_USE);
    CHECK(p && delta_compiles(st) == 2 && delta_loads(st) == 2, "a new size compiles exactly VAE + transformer (%d compiles)", delta_compiles(st));
    dl_flux_pipeline_free(p);
    st = dl_program_stats_get();
    p = load(32, 48, DL_BF16, DL_CACHE_USE);
    CHECK(p && delta_compiles(st) == 4, "a new dtype compiles all 4 (%d)", delta_compiles(st));
    dl_flux_pipeline_free(p);

    /* a flipped byte in the transformer's weights */
    char path[512];
    snprintf(path, sizeof path, "%s/weights.bin", tdir);
    FILE *f = fopen(path, "r+b");
    if (f) {
        fseek(f, 1000, SEEK_SET);
        int c = fgetc(f);
        fseek(f, 1000, SEEK_SET);
        fputc(c ^ 0x10, f);
        fclose(f);
    }
    p = load(32, 48, DL_F32, DL_CACHE_USE);
    CHECK(!p && strstr(dl_last_error(), "checksum") && strstr(dl_last_error(), "difflet cache rm"),
          "corrupt weights refused: %s", dl_last_error());
    st = dl_program_stats_get();
    p = load(32, 48, DL_F32, DL_CACHE_RECOMPILE_ON_MISMATCH);
    CHECK(p && delta_compiles(st) == 1, "--recompile-on-mismatch rebuilds the corrupt program only");
    CHECK(p && gen(p, "a red circle", 3, 3.5f, 11, b) && !memcmp(a, b, sizeof a), "and the picture is right again");
    dl_flux_pipeline_free(p);
    /* a truncated manifest */
    snprintf(path, sizeof path, "%s/manifest.json", vdir);
    if (truncate(path, 40) != 0) CHECK(0, "truncate");
    p = load(32, 48, DL_F32, DL_CACHE_USE);
    CHECK(!p && strstr(dl_last_error(), "manifest.json"), "truncated manifest refused: %s", dl_last_error());
    p = load(32, 48, DL_F32, DL_CACHE_RECOMPILE_ON_MISMATCH);
    CHECK(p != NULL, "and rebuilt on request");
    dl_flux_pipeline_free(p);

    /* a compile killed (SIGKILL) after 3 tensors leaves only a temporary folder */
    char cmd[1024];
    int before = count_programs(), tmp_before = count_dirs(".tmp-");
    snprintf(cmd, sizeof cmd,
             "DIFFLET_LOG=error DIFFLET_FAULT_KILL_COMPILE=3 %s compile --model %s --size 48x48 --max-sequence-length 32 --dtype f32 >/dev/null 2>&1",
             g_bin, MODEL);
    int rc = system(cmd);
    CHECK(rc != 0, "the faulted compile died (status %d)", rc);
    CHECK(count_dirs(".tmp-") == tmp_before + 1, "it left one temporary folder");
    CHECK(count_programs() == before, "and no new program folder (%d, was %d)", count_programs(), before);
    st = dl_program_stats_get();
    p = load(48, 48, DL_F32, DL_CACHE_USE);
    CHECK(p && delta_compiles(st) >= 1, "a later start compiles what the killed one did not finish");
    dl_flux_pipeline_free(p);

    /* two concurrent compiles of the same new key */
    snprintf(cmd, sizeof cmd,
             "(DIFFLET_LOG=error %s compile --model %s --size 32x64 --max-sequence-length 32 --dtype f32 >/dev/null 2>&1 & "
             "DIFFLET_LOG=error %s compile --model %s --size 32x64 --max-sequence-length 32 --dtype f32 >/dev/null 2>&1 & wait) ",
             g_bin, MODEL, g_bin, MODEL);
    rc = system(cmd);
    CHECK(rc == 0, "both concurrent compiles succeed");
    st = dl_program_stats_get();
    p = load(32, 64, DL_F32, DL_CACHE_USE);
    CHECK(p && delta_compiles(st) == 0 && delta_loads(st) == 4, "their programs load, all checksums good");
    dl_flux_pipeline_free(p);
    /* with compiling off, a missing program is named with its nearest cached relative */
    p = load(96, 48, DL_F32, DL_CACHE_NO_COMPILE);
    CHECK(!p && strstr(dl_last_error(), "not compiled") && strstr(dl_last_error(), "shape: compiled for"),
          "--no-compile names what differs: %s", dl_last_error());
    snprintf(cmd, sizeof cmd, "%s cache verify >/dev/null 2>&1", g_bin);
    CHECK(system(cmd) == 0, "difflet cache verify passes on everything");
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_cache);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_cache);
    return test_done("test_program");
}
