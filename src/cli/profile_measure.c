/* `difflet profile measure`: the DDiT profile (the paper's RIB) measured on this
 * machine with difflet's own parallel execution, stored under --name for
 * `difflet simulate --profile NAME` and the scheduler. For each size and each DoP d
 * (1, 2, 4, 8 up to --max-dop, default the cores: a DoP is that many ranks of one
 * thread, so DoPs above the cores would share cores and are skipped unless
 * --oversubscribe), one mpirun job of d ranks x 1 thread measures it.
 *
 * Whole pipeline (the default): the model's pipeline at WxH (and --frames for video
 * models) runs --reps requests after a warm-up: the DiT phase with the transformer
 * context-parallel over the d ranks (Ulysses when the heads divide, else ring;
 * OpenSora's STDiT3 always splits by its own dynamic sequence parallelism), the VAE
 * phase on the host rank; the best request's phase times are stored, the VAE's from
 * the DoP-1 job for every DoP (the host decodes alone whatever the DiT's DoP; in a
 * DoP-d job the other ranks wait in MPI, which polls, and slow it on a machine with no
 * spare cores).
 *
 * --real-width opensora: the published STDiT3 width with random weights (a model that
 * is not on this machine and would take hours per request on CPU), one denoiser step
 * timed and scaled. Two random-weight models, depth 1 and depth 2 (bench_opensora.c's
 * folders), each time one step = one CFG batch-2 call (the RFLOW sampler's step) with
 * the d ranks context-parallel, their runs interleaved in each job; --reps rounds of
 * one job per DoP, the best of the rounds kept, so that every DoP sees the same spells
 * of a shared machine's load. A step is fixed + k pair at depth k; the fixed part
 * (embedders, caption projection, final layer) is 0.3-2.4 % of a pair's FLOPs (480p to
 * 144p), below the run-to-run noise here, so the pair is fitted through the origin to
 * the two depths ((t1 + 2 t2) / 5) and a step of the published depth (--depth, 28) is
 * depth x pair (at most 1.3 % high at depth 28, at 144p); the DiT phase is --steps (30)
 * of them. The VAE phase is the OpenSoraVAE v1.2 decoder of its published config
 * (VAE_Temporal_SD + the SDXL VAE), random weights, on one rank of one thread,
 * measured once in the first DoP-1 job as chunks x (one temporal chunk) + frames x
 * (one spatial frame): the reference decodes chunks of 17 frames independently and
 * frames one at a time, so the whole decode is that sum (less the per-chunk copies;
 * --vae-check compares it with a whole one-chunk decode); it is stored for every DoP
 * (the host decodes alone whatever the DiT's DoP). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "difflet/comm.h"
#include "difflet/opensora.h"
#include "difflet/pipeline.h"
#include "difflet/registry.h"
#include "difflet/sched.h"

#ifndef DIFFLET_SOURCE_DIR
#define DIFFLET_SOURCE_DIR "."
#endif

static const char *opt(int argc, char **argv, const char *key, const char *def) {
    for (int i = 0; i + 1 < argc; i++)
        if (!strcmp(argv[i], key)) return argv[i + 1];
    return def;
}

static int flag(int argc, char **argv, const char *key) {
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], key)) return 1;
    return 0;
}

static dl_dtype default_dt(void) { return dl_dtype_default(); }

/* the 1-minute load average (NAN when unknown): a shared machine's other work shows in
 * the times, most in a DoP-d job's, whose ranks advance in lockstep */
static double loadavg(void) {
    double l = NAN;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f && fscanf(f, "%lf", &l) != 1) l = NAN;
    if (f) fclose(f);
    return l;
}

/* ---- one DoP's job, whole pipeline: every rank loads its part; the host times ---- */

static int measure_rank_pipeline(int argc, char **argv) {
    const char *model = opt(argc, argv, "--model", NULL), *layout = opt(argc, argv, "--layout", "1");
    const char *json = opt(argc, argv, "--json", NULL);
    int w = 0, h = 0, steps = atoi(opt(argc, argv, "--steps", "30")), reps = atoi(opt(argc, argv, "--reps", "2"));
    int frames = atoi(opt(argc, argv, "--frames", "1"));
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
    dl_gen_shape shape = {.frames = frames, .width = w, .height = h, .dt = default_dt(), .par = par ? &pl : NULL};
    if (dl_pipeline_load(&p, model, &shape) != DL_OK) {
        fprintf(stderr, "difflet: profile measure: %s\n", dl_last_error());
        dl_comm_abort(1);
    }
    if (!dl_pipeline_is_host(p)) {
        if (dl_pipeline_worker(p) != DL_OK) dl_comm_abort(1);
    } else {
        double dit = 1e30, vae = 1e30;
        for (int r = 0; r <= reps; r++) { /* r = 0: warm-up */
            dl_gen_request q = {.prompt = "a large red circle in the centre on a blue background", .steps = steps,
                                 .guidance = 3.5f, .true_cfg = 1.f, .seed = (uint64_t)r};
            dl_gen_timing tm;
            dl_media media;
            if (dl_pipeline_generate(p, &q, &media, &tm) != DL_OK) {
                fprintf(stderr, "difflet: profile measure: %s\n", dl_last_error());
                dl_comm_abort(1);
            }
            dl_media_free(&media);
            if (r > 0 && tm.denoise_s < dit) dit = tm.denoise_s;
            if (r > 0 && tm.decode_s < vae) vae = tm.decode_s;
        }
        char text[256];
        snprintf(text, sizeof text, "{\"dit\":%.6f,\"vae\":%.6f}", dit, vae);
        if (dl_file_write_atomic(json, text, strlen(text)) != DL_OK) dl_comm_abort(1);
    }
    dl_pipeline_free(p);
    if (par) dl_par_place_free(&pl);
    dl_comm_finalize();
    return 0;
}

/* ---- one DoP's job, real width: a depth-1 and a depth-2 step, and the VAE ---------- */

/* OpenSoraVAE v1.2's latent grid for frames x h x w pixels (get_latent_size) */
static void os_latent(int64_t frames, int64_t h, int64_t w, int64_t lat[3]) {
    lat[0] = frames / 17 * 5 + (frames % 17 + 3) / 4;
    lat[1] = h / 8, lat[2] = w / 8;
}

/* the slowest rank's seconds of one step (a CFG batch-2 call) of m */
static double one_step(dl_stdit3 *m, const float *x, const dl_stdit3_cond *c0, const dl_stdit3_cond *c1, float *o, int64_t no,
                       dl_comm *world) {
    dl_comm_barrier(world);
    const double t0 = dl_now();
    if (dl_stdit3_run2(m, x, c0, c1, o, o + no) != DL_OK) {
        fprintf(stderr, "difflet: profile measure-rank: %s\n", dl_last_error());
        dl_comm_abort(1);
    }
    double t = dl_now() - t0, all[64];
    const int nr = dl_comm_size(world);
    dl_comm_allgather(world, &t, sizeof t, all);
    for (int i = 0; i < nr && i < 64; i++) t = all[i] > t ? all[i] : t;
    return t;
}

/* One step of each STDiT3 in dir[0] (depth 1) and dir[1] (depth 2) on every rank of
 * the split, their runs interleaved (depth 1, depth 2, depth 1, ...) so that the two
 * see the same load of a shared machine: best of reps each, after a warm-up round when
 * a round is under 30 s (against a longer one the first call's page faults are noise). */
static void time_steps(const char *const dir[2], const int64_t lat[3], int h, int w, int64_t valid, const dl_dit_split *sp,
                       dl_comm *world, int reps, double t[2]) {
    dl_model_dir *md[2] = {NULL, NULL};
    dl_stdit3 *m[2] = {NULL, NULL};
    for (int k = 0; k < 2; k++) {
        const int64_t Tmax = dl_json_file_int(dir[k], "transformer/config.json", "model_max_length", 1, 4096, 300);
        if (dl_model_dir_open(&md[k], dir[k]) != DL_OK ||
            dl_stdit3_load(&m[k], md[k], "transformer", lat[0], lat[1], lat[2], Tmax, default_dt(), NULL, sp, 2) != DL_OK) {
            fprintf(stderr, "difflet: profile measure-rank: %s\n", dl_last_error());
            dl_comm_abort(1);
        }
    }
    const int64_t T = dl_stdit3_max_length(m[0]), Cc = dl_stdit3_caption_channels(m[0]), C = dl_stdit3_in_channels(m[0]);
    const int64_t n = C * lat[0] * lat[1] * lat[2], no = dl_stdit3_out_channels(m[0]) * lat[0] * lat[1] * lat[2];
    float *x = malloc((size_t)n * 4), *y = malloc((size_t)(T * Cc) * 4), *o = malloc((size_t)(2 * no) * 4);
    if (!x || !y || !o) {
        fprintf(stderr, "difflet: profile measure-rank: out of memory\n");
        dl_comm_abort(1);
    }
    dl_randn(1, x, n);
    dl_randn(2, y, T * Cc);
    const dl_stdit3_cond c0 = {.y = y, .valid = valid < T ? valid : T, .timestep = 700.f, .fps = 24.f, .height = (float)h,
                               .width = (float)w};
    dl_stdit3_cond c1[2] = {c0, c0};
    for (int k = 0; k < 2; k++) c1[k].y = dl_stdit3_null_caption(m[k]);
    t[0] = t[1] = 1e30;
    for (int r = 0, timed = 0; timed < reps; r++) {
        double tr[2];
        for (int k = 0; k < 2; k++) tr[k] = one_step(m[k], x, &c0, &c1[k], o, no, world);
        if (r == 0 && tr[0] + tr[1] < 30.0) continue; /* a warm-up round */
        timed++;
        for (int k = 0; k < 2; k++) t[k] = tr[k] < t[k] ? tr[k] : t[k];
    }
    free(x), free(y), free(o);
    for (int k = 0; k < 2; k++) dl_stdit3_free(m[k]), dl_model_dir_free(md[k]);
}

/* the OpenSora VAE of dir/vae at frames x h x w: one temporal chunk's seconds (the
 * decoder built for min(frames, 17) frames: every chunk of a longer clip does that
 * work), one spatial frame's (its SDXL decoder on one frame), the chunk count; best
 * of reps each; with full, also one whole decode of that one-chunk clip (*full_s, a
 * check of the composition) */
static void time_vae(const char *dir, int64_t frames, int64_t h, int64_t w, int reps, int full, double *chunk_s,
                     double *frame_s, int *chunks, double *full_s) {
    dl_model_dir *md = NULL;
    dl_opensora_vae *v = NULL;
    const int64_t vw = w / 8 * 8, vh = h / 8 * 8, f1 = frames < 17 ? frames : 17;
    int64_t lat[3];
    if (dl_model_dir_open(&md, dir) != DL_OK || dl_opensora_vae_load(&v, md, "vae", frames, vh, vw, default_dt(), NULL) != DL_OK) {
        fprintf(stderr, "difflet: profile measure-rank: VAE: %s\n", dl_last_error());
        dl_comm_abort(1);
    }
    *chunks = dl_opensora_vae_chunks(v);
    dl_opensora_vae_free(v);
    if (dl_opensora_vae_load(&v, md, "vae", f1, vh, vw, default_dt(), NULL) != DL_OK) {
        fprintf(stderr, "difflet: profile measure-rank: VAE: %s\n", dl_last_error());
        dl_comm_abort(1);
    }
    dl_opensora_vae_latent_size(v, lat);
    const int64_t zc = dl_opensora_vae_channels(v), nz = zc * lat[0] * lat[1] * lat[2];
    float *z = malloc((size_t)nz * 4), *xz = malloc((size_t)(4 * f1 * lat[1] * lat[2]) * 4);
    float *img = malloc((size_t)(3 * vh * vw) * 4), *z1 = malloc((size_t)(4 * lat[1] * lat[2]) * 4);
    if (!z || !xz || !img || !z1) {
        fprintf(stderr, "difflet: profile measure-rank: out of memory\n");
        dl_comm_abort(1);
    }
    dl_randn(3, z, nz);
    dl_randn(4, z1, 4 * lat[1] * lat[2]);
    *chunk_s = *frame_s = 1e30;
    for (int r = 0; r < reps; r++) {
        const double t0 = dl_now();
        if (dl_opensora_vae_decode_temporal(v, z, xz) != DL_OK) {
            fprintf(stderr, "difflet: profile measure-rank: VAE: %s\n", dl_last_error());
            dl_comm_abort(1);
        }
        if (dl_now() - t0 < *chunk_s) *chunk_s = dl_now() - t0;
    }
    *full_s = 0;
    float *video = full ? malloc((size_t)(3 * f1 * vh * vw) * 4) : NULL;
    if (full) {
        const double t0 = dl_now();
        if (!video || dl_opensora_vae_decode(v, z, video, NULL, NULL) != DL_OK) {
            fprintf(stderr, "difflet: profile measure-rank: VAE: %s\n", video ? dl_last_error() : "out of memory");
            dl_comm_abort(1);
        }
        *full_s = dl_now() - t0;
    }
    free(video);
    dl_opensora_vae_free(v);
    /* the spatial VAE alone: the published config names the SDXL VAE (opensora_vae.c's built-in) */
    cJSON *cfg = cJSON_Parse("{\"_class_name\": \"AutoencoderKL\", \"act_fn\": \"silu\", \"block_out_channels\": [128, 256, 512, 512], "
                             "\"in_channels\": 3, \"out_channels\": 3, \"latent_channels\": 4, \"layers_per_block\": 2, "
                             "\"norm_num_groups\": 32, \"scaling_factor\": 0.13025}");
    dl_vae_decoder *sp = NULL;
    if (!cfg || dl_vae_decoder_load_from(&sp, md, "vae", cfg, "the SDXL VAE config", "spatial_vae.module.", vh / 8, vw / 8,
                                         default_dt(), NULL) != DL_OK) {
        fprintf(stderr, "difflet: profile measure-rank: spatial VAE: %s\n", cfg ? dl_last_error() : "out of memory");
        dl_comm_abort(1);
    }
    for (int r = 0; r < reps; r++) {
        const double t0 = dl_now();
        if (dl_vae_decode(sp, z1, img) != DL_OK) {
            fprintf(stderr, "difflet: profile measure-rank: spatial VAE: %s\n", dl_last_error());
            dl_comm_abort(1);
        }
        if (dl_now() - t0 < *frame_s) *frame_s = dl_now() - t0;
    }
    dl_vae_decoder_free(sp);
    cJSON_Delete(cfg);
    free(z), free(xz), free(img), free(z1);
    dl_model_dir_free(md);
}

static int measure_rank_real(int argc, char **argv) {
    const char *dir = opt(argc, argv, "--real-width-dir", NULL), *layout = opt(argc, argv, "--layout", "1");
    const char *json = opt(argc, argv, "--json", NULL);
    int w = 0, h = 0, reps = atoi(opt(argc, argv, "--reps", "1")), vae = atoi(opt(argc, argv, "--vae", "0"));
    const int vae_full = atoi(opt(argc, argv, "--vae-full", "0"));
    const int64_t frames = atoll(opt(argc, argv, "--frames", "51")), valid = atoll(opt(argc, argv, "--valid", "120"));
    dl_comm *world;
    dl_par_config pc;
    dl_par_place pl = {0};
    sscanf(opt(argc, argv, "--size", ""), "%dx%d", &w, &h);
    int par = dl_par_parse(layout, &pc) == DL_OK && dl_par_ranks(&pc) > 1;
    if (!dir || !json || reps < 1 || dl_comm_world(&world) != DL_OK || (par && dl_par_place_new(world, &pc, &pl) != DL_OK)) {
        fprintf(stderr, "difflet: profile measure-rank: %s\n", dl_last_error());
        dl_comm_abort(1);
    }
    int64_t lat[3];
    os_latent(frames, h, w, lat);
    char d1[4200], d2[4200];
    snprintf(d1, sizeof d1, "%s/depth1", dir);
    snprintf(d2, sizeof d2, "%s/depth2", dir);
    const char *const dirs[2] = {d1, d2};
    double ts[2];
    time_steps(dirs, lat, h, w, valid, par ? &pl.split : NULL, world, reps, ts);
    const double t1 = ts[0], t2 = ts[1];
    double chunk = 0, frame = 0, full = 0;
    int chunks = 0;
    if (vae && dl_comm_rank(world) == 0) time_vae(d1, frames, h, w, 1, vae_full, &chunk, &frame, &chunks, &full);
    if (dl_comm_rank(world) == 0) {
        char text[512];
        snprintf(text, sizeof text,
                 "{\"t1\":%.6f,\"t2\":%.6f,\"vae_chunk\":%.6f,\"vae_frame\":%.6f,\"vae_chunks\":%d,\"vae_full\":%.6f}", t1,
                 t2, chunk, frame, chunks, full);
        if (dl_file_write_atomic(json, text, strlen(text)) != DL_OK) dl_comm_abort(1);
    }
    if (par) dl_par_place_free(&pl);
    dl_comm_finalize();
    return 0;
}

int cli_profile_measure_rank(int argc, char **argv) {
    return opt(argc, argv, "--real-width-dir", NULL) ? measure_rank_real(argc, argv) : measure_rank_pipeline(argc, argv);
}

/* ---- the driver ------------------------------------------------------------------- */

static void usage(FILE *f) {
    fprintf(f,
            "usage: difflet profile measure [--name N] [--db FILE] [--csv FILE] [--sizes WxH,...] [--frames F] [--steps N]\n"
            "         [--reps N] [--max-dop D] [--oversubscribe] [--model DIR | --real-width opensora [--depth N]\n"
            "         [--caption-valid V] [--vae-check]]\n"
            "  --model DIR       the whole pipeline of this model (default models/difflet-tiny) per size and DoP\n"
            "  --frames F        frames per request (video models; default 1)\n"
            "  --real-width opensora  OpenSora 1.2 at the published width with random weights: one STDiT3 step\n"
            "                    (a CFG batch-2 call) at depth 1 and 2, scaled to --depth (28) block pairs and\n"
            "                    --steps (30) steps (--reps: rounds of one job per DoP, the best kept); the\n"
            "                    OpenSoraVAE v1.2 decoder (published config) as one temporal\n"
            "                    chunk + one spatial frame scaled to the clip (defaults: --frames 51, --reps 1, --sizes\n"
            "                    256x144,426x240,640x360,854x480: the DDiT paper's 144p-480p, OpenSora's 9:16 sizes)\n"
            "  --caption-valid V valid caption tokens of the 300 rows (real width; default 120)\n"
            "  --vae-check       real width: also one whole decode of a 17-frame clip at the first size, against the\n"
            "                    chunk + frames composition\n"
            "  --csv FILE        also write the profile as CSV (`difflet profile import` reads it), the raw timings as comments\n"
            "  --max-dop D       DoPs 1, 2, 4, 8 up to D (default: the cores); a DoP is D ranks x 1 thread, so DoPs\n"
            "                    above the cores are skipped unless --oversubscribe (then marked: ranks share cores)\n");
}

int cli_profile_measure(int argc, char **argv, const char *db, const char *name) {
    if (flag(argc, argv, "--help") || flag(argc, argv, "-h")) {
        usage(stdout);
        return 2;
    }
    const char *real = opt(argc, argv, "--real-width", NULL);
    if (real && strcmp(real, "opensora")) {
        fprintf(stderr, "difflet profile measure: --real-width %s: the real-width mode knows `opensora`\n", real);
        return 2;
    }
    const char *model = opt(argc, argv, "--model", DIFFLET_SOURCE_DIR "/models/difflet-tiny");
    const char *sizes = opt(argc, argv, "--sizes", real ? "256x144,426x240,640x360,854x480" : "64x64,128x128,256x256");
    const char *steps = opt(argc, argv, "--steps", "30"), *reps = opt(argc, argv, "--reps", real ? "1" : "2");
    const char *frames = opt(argc, argv, "--frames", real ? "51" : "1");
    const int depth = atoi(opt(argc, argv, "--depth", "28")), valid = atoi(opt(argc, argv, "--caption-valid", "120"));
    const int over = flag(argc, argv, "--oversubscribe"), vae_check = flag(argc, argv, "--vae-check");
    const char *csv = opt(argc, argv, "--csv", NULL);
    char notes[16384] = ""; /* the raw measurements, as CSV comments */
    size_t nn = 0;
#define NOTE(...)                                                                               \
    do {                                                                                        \
        if (nn < sizeof notes) nn += (size_t)snprintf(notes + nn, sizeof notes - nn, __VA_ARGS__); \
    } while (0)
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int max_dop = atoi(opt(argc, argv, "--max-dop", "0"));
    if (max_dop <= 0) max_dop = ncpu > 0 ? (int)ncpu : 1;
    if (atoi(steps) < 1 || atoi(reps) < 1 || atoi(frames) < 1 || atoi(frames) > 100000 || depth < 1 || depth > 4096 ||
        valid < 1 || valid > 300) {
        fprintf(stderr, "difflet profile measure: --steps, --reps, --frames (<= 100000), --depth (<= 4096) and "
                        "--caption-valid (<= 300) must be positive\n");
        return 2;
    }
    char model_buf[4096];
    if (!real) {
        if (!cli_model("profile measure", model, model_buf, sizeof model_buf)) return 1;
        model = model_buf;
    }
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
    int rc = 0;
    if (real) {
        printf("difflet profile measure: OpenSora 1.2 at the published width, random weights: STDiT3 (hidden 1152, 16 heads,\n"
               "  caption 4096, patch (1, 2, 2)) one step = one CFG batch-2 call at depth 1 and 2, scaled to %d block pairs x\n"
               "  %s steps; OpenSoraVAE v1.2 (VAE_Temporal_SD + SDXL VAE) per chunk and frame; %s frames, %d of 300 caption\n"
               "  tokens valid, %s, DoP up to %d (ranks x 1 thread, the DiT context-parallel)\n",
               depth, steps, frames, valid, dl_dtype_name(default_dt()), max_dop);
        char d[4300];
        snprintf(d, sizeof d, "%s/depth1", tmp);
        dl_status s = dl_mkdir_p(d);
        if (s == DL_OK) s = bench_opensora_folder(d, 1, 1);
        snprintf(d, sizeof d, "%s/depth2", tmp);
        if (s == DL_OK) s = dl_mkdir_p(d);
        if (s == DL_OK) s = bench_opensora_folder(d, 2, 0);
        if (s != DL_OK) {
            fprintf(stderr, "difflet profile measure: %s\n", dl_last_error());
            rc = 1;
        }
    } else {
        printf("difflet profile measure: %s, %s steps, %s frame(s), DoP up to %d (ranks x 1 thread; the DiT phase "
               "context-parallel)\n",
               model, steps, frames, max_dop);
    }
    for (int d = 4; d <= 8; d *= 2)
        if (d > ncpu && d <= max_dop)
            printf("  DoP %d: %s (this machine has %ld cores)\n", d,
                   over ? "oversubscribed (its ranks share the cores: marked, not a real measurement of that DoP)" : "skipped",
                   ncpu);
    fflush(stdout);
    double vae_chunk = 0, vae_frame = 0;
    int vae_chunks = 0;
    for (char *save = NULL, *sz = strtok_r(list, ",", &save); sz && rc == 0; sz = strtok_r(NULL, ",", &save)) {
        int w, h;
        char x;
        if (sscanf(sz, "%d%c%d", &w, &x, &h) != 3 || x != 'x' || w < 16 || h < 16 || prof.nres == DL_SCHED_MAX_RES) {
            fprintf(stderr, "difflet profile measure: --sizes: `%s` is not WxH (16 or more; at most %d sizes)\n", sz,
                    DL_SCHED_MAX_RES);
            rc = 2;
            break;
        }
        int r = prof.nres++;
        if (real || atoi(frames) > 1) snprintf(prof.name[r], sizeof prof.name[r], "%dp", h); /* video: OpenSora's names */
        else snprintf(prof.name[r], sizeof prof.name[r], "%.15s", sz);
        /* real width: --reps rounds of one job per DoP, so every DoP's best sees the same spells of a
         * shared machine's load; the pipeline: one job per DoP of --reps requests */
        double t1b[DL_SCHED_MAX_DOP], t2b[DL_SCHED_MAX_DOP];
        for (int k = 0; k < DL_SCHED_MAX_DOP; k++) t1b[k] = t2b[k] = 1e30;
        for (int round = 0; round < (real ? atoi(reps) : 1) && rc == 0; round++)
            for (int d = 1; d <= max_dop && d <= 8 && rc == 0; d *= 2) {
                if (d > ncpu && !over) continue;
                dl_par_config pc;
                snprintf(layout, sizeof layout, d == 1 ? "1" : "cp=%d:ulysses", d);
                dl_par_parse(layout, &pc);
                if (!real && d > 1 && !cli_layout_ok("profile measure", model, layout, &pc, 1)) /* heads do not divide: ring */
                    snprintf(layout, sizeof layout, "cp=%d:ring", d);
                snprintf(res, sizeof res, "%s/%s-%d.json", tmp, sz, d);
                const char *sub[2] = {"profile", "measure-rank"};
                const double load0 = loadavg();
                const int vae_job = real && d == 1 && round == 0;
                int code;
                if (real) {
                    char vd[16];
                    snprintf(vd, sizeof vd, "%d", valid);
                    char *args[] = {"--real-width-dir", tmp, "--size", sz, "--frames", (char *)frames, "--reps", "1",
                                    "--layout", layout, "--json", res, "--valid", vd, "--vae", vae_job ? "1" : "0",
                                    "--vae-full", vae_job && r == 0 && vae_check ? "1" : "0"};
                    code = cli_mpirun(sub, 2, 18, args, d, 1, 0);
                } else {
                    char *args[] = {"--model", (char *)model, "--size", sz, "--steps", (char *)steps, "--reps", (char *)reps,
                                    "--layout", layout, "--json", res, "--frames", (char *)frames};
                    code = cli_mpirun(sub, 2, 14, args, d, 1, 0);
                }
                cJSON *j = NULL;
                if (code != 0 || dl_json_read_object(res, NULL, &j) != DL_OK) {
                    fprintf(stderr, "difflet profile measure: %s at DoP %d failed (exit %d)\n", sz, d, code);
                    rc = 1;
                    break;
                }
                const int di = dl_dop_index(d);
                const char *mark = d > ncpu ? " (oversubscribed)" : "";
                char load[64];
                snprintf(load, sizeof load, "load average %.1f -> %.1f", load0, loadavg());
                if (real) {
                    const double t1 = cJSON_GetObjectItem(j, "t1")->valuedouble, t2 = cJSON_GetObjectItem(j, "t2")->valuedouble;
                    t1b[di] = t1 < t1b[di] ? t1 : t1b[di], t2b[di] = t2 < t2b[di] ? t2 : t2b[di];
                    printf("  %-9s DoP %d%s, round %d: one step at depth 1 %.3f s, depth 2 %.3f s (%s)\n", sz, d, mark, round + 1,
                           t1, t2, load);
                    NOTE("# %s (%s) DoP %d%s, round %d: one step at depth 1 %.3f s, depth 2 %.3f s (%s)\n", prof.name[r], sz, d,
                         mark, round + 1, t1, t2, load);
                    if (vae_job) {
                        vae_chunk = cJSON_GetObjectItem(j, "vae_chunk")->valuedouble;
                        vae_frame = cJSON_GetObjectItem(j, "vae_frame")->valuedouble;
                        vae_chunks = (int)cJSON_GetObjectItem(j, "vae_chunks")->valuedouble;
                        const double v = vae_chunks * vae_chunk + atoi(frames) * vae_frame;
                        printf("  %-9s VAE (1 rank x 1 thread): temporal chunk %.3f s x %d + spatial frame %.3f s x %s = %.1f s\n",
                               sz, vae_chunk, vae_chunks, vae_frame, frames, v);
                        NOTE("# %s (%s) VAE: temporal chunk %.3f s x %d + spatial frame %.3f s x %s = %.2f s\n", prof.name[r], sz,
                             vae_chunk, vae_chunks, vae_frame, frames, v);
                        for (int k = 0; k < DL_SCHED_MAX_DOP; k++) prof.vae[r][k] = (1 << k) <= max_dop && ((1 << k) <= ncpu || over) ? v : 0;
                        const double full = cJSON_GetObjectItem(j, "vae_full")->valuedouble;
                        if (full > 0) {
                            const int f1 = atoi(frames) < 17 ? atoi(frames) : 17;
                            const double comp = vae_chunk + f1 * vae_frame;
                            printf("  %-9s VAE check: one whole decode of %d frames (one chunk) %.2f s, composed %.2f s (%+.1f%%)\n",
                                   sz, f1, full, comp, 100 * (comp - full) / full);
                            NOTE("# %s VAE check: one whole decode of %d frames %.2f s, composed %.2f s\n", prof.name[r], f1, full,
                                 comp);
                        }
                    }
                } else {
                    /* the VAE: the DoP-1 job's decode for every DoP (the host decodes alone; in a DoP-d job the other
                     * ranks wait in MPI, which polls, and on a machine without spare cores that slows the decode) */
                    const double vae = cJSON_GetObjectItem(j, "vae")->valuedouble;
                    prof.dit[r][di] = cJSON_GetObjectItem(j, "dit")->valuedouble;
                    prof.vae[r][di] = d == 1 || !(prof.vae[r][0] > 0) ? vae : prof.vae[r][0];
                    printf("  %-10s DoP %d%s (%s): DiT %.3f s, VAE %.3f s%s (%s)\n", sz, d, mark, layout, prof.dit[r][di], vae,
                           d > 1 ? " (its ranks polling; the DoP-1 decode is stored)" : "", load);
                    NOTE("# %s (%s) DoP %d%s: DiT %.4f s, VAE in this job %.4f s (%s)\n", prof.name[r], sz, d, mark,
                         prof.dit[r][di], vae, load);
                }
                fflush(stdout);
                cJSON_Delete(j);
            }
        /* real width: a step of `depth` pairs from the best depth-1 and depth-2 steps, t(k) = fixed + k pair.
         * The fixed part (embedders, the caption projection, the final layer) is 0.3-2.4 % of a pair's
         * FLOPs, below this machine's run-to-run noise, so the pair is fitted through the origin to both
         * runs (least squares: (t1 + 2 t2) / 5 = pair + 0.6 fixed) and a step is depth x that, which
         * overstates it by (0.6 depth - 1) x the fixed part, at most 1.3 % at depth 28; the difference
         * t1 - (t2 - t1) is shown for the record */
        for (int d = 1; real && rc == 0 && d <= max_dop && d <= 8; d *= 2) {
            const int di = dl_dop_index(d);
            if (!(t1b[di] < 1e30)) continue;
            const double t1 = t1b[di], t2 = t2b[di], pair = (t1 + 2 * t2) / 5, step = depth * pair;
            prof.dit[r][di] = step * prof.steps;
            printf("  %-9s DoP %d: best step depth 1 %.3f s, depth 2 %.3f s -> block pair %.3f s (difference t2 - t1 %.3f s,\n"
                   "            fixed part by difference %.3f s); step at depth %d %.1f s; DiT %d steps %.0f s\n",
                   sz, d, t1, t2, pair, t2 - t1, 2 * t1 - t2, depth, step, prof.steps, prof.dit[r][di]);
            NOTE("# %s (%s) DoP %d: best depth 1 %.3f s, depth 2 %.3f s, block pair %.3f s (t2 - t1 %.3f s, 2 t1 - t2 %.3f s), "
                 "step at depth %d %.3f s\n",
                 prof.name[r], sz, d, t1, t2, pair, t2 - t1, 2 * t1 - t2, depth, step);
            fflush(stdout);
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
    if (csv) { /* `difflet profile import` reads it back */
        FILE *f = fopen(csv, "w");
        if (!f) {
            fprintf(stderr, "difflet profile measure: cannot write %s\n", csv);
            return 1;
        }
        fprintf(f, "# difflet profile measure %s: %s, %s frames, %d steps, %s, on %s (%ld cores; DoP d = d ranks x 1 thread)\n",
                name, real ? "OpenSora 1.2 real width (random weights), one step at depth 1 and 2 scaled" : model, frames,
                prof.steps, dl_dtype_name(default_dt()), dl_cpu_model(), ncpu);
        fputs(notes, f);
        fprintf(f, "resolution,phase,dop,seconds\n");
        for (int r = 0; r < prof.nres; r++)
            for (int ph = 0; ph < 2; ph++)
                for (int d = 0; d < DL_SCHED_MAX_DOP; d++) {
                    const double v = ph ? prof.vae[r][d] : prof.dit[r][d];
                    if (v > 0) fprintf(f, "%s,%s,%d,%.4f\n", prof.name[r], ph ? "vae" : "dit", 1 << d, v);
                }
        if (fclose(f) != 0) return 1;
        printf("wrote %s\n", csv);
    }
    return 0;
}
#undef NOTE
