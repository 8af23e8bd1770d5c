/* `difflet generate`: prompt in, picture out, through a diffusers-layout pipeline
 * folder of any class the registry serves.
 * Argument errors: one line, exit 2. Runtime failures: the library's message,
 * exit 1. A progress line on a terminal, a per-stage timing summary at the end.
 * `--parallel LAYOUT` runs the ranks through mpirun (started here unless already
 * under it); `--prompt` may repeat: with dp replicas, prompt i goes to replica
 * i mod dp, and each picture is written as OUT-i.png. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "difflet/registry.h"
#include "difflet/request.h"
#include "difflet/comm.h"
#include "difflet/pipeline.h"
#include "difflet/program.h"

#ifndef DIFFLET_SOURCE_DIR
#define DIFFLET_SOURCE_DIR "."
#endif

typedef struct {
    int tty;
} progress;

static void on_decode(void *ctx, int done, int total) {
    (void)ctx;
    if (done == total || done % 4 == 0) fprintf(stderr, "  decode: chunk %d/%d\n", done, total); /* Wan: latent frames; HunyuanVideo: temporal tiles */
}

static void on_step(void *ctx, int step, int steps, double elapsed) {
    progress *p = ctx;
    double per = elapsed / step, eta = per * (steps - step);
    if (p->tty) {
        int w = 30, fill = step * w / steps;
        fprintf(stderr, "\r  denoise [%.*s%*s] %d/%d  %.2f s/step  ETA %.0f s ", fill,
                "##############################", w - fill, "", step, steps, per, eta);
        if (step == steps) fputc('\n', stderr);
    } else if (step == steps || step % 10 == 0) {
        fprintf(stderr, "  step %d/%d  %.2f s/step\n", step, steps, per);
    }
}

static int parse_int(const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || end == s || v < lo || v > hi) return 0;
    *out = v;
    return 1;
}

static int parse_float(const char *s, float *out) {
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || *end || end == s || v != v) return 0;
    *out = v;
    return 1;
}

/* "out.png" -> "out-3.png" */
static void indexed(char *buf, size_t n, const char *path, int i) {
    const char *dot = strrchr(path, '.'), *slash = strrchr(path, '/');
    if (!dot || (slash && dot < slash)) dot = path + strlen(path);
    snprintf(buf, n, "%.*s-%d%s", (int)(dot - path), path, i, dot);
}

/* a rank that fails alone would leave the others waiting: end them all */
static int rank_fail(int parallel, int code) {
    if (parallel) {
        fflush(stderr);
        dl_comm_abort(code);
    }
    return code;
}

int cli_generate(int argc, char **argv) {
    const char *model = getenv("DIFFLET_MODEL"), *neg = NULL, *outp = "out.png", *lat_path = NULL;
    const char *save_frames = NULL, *save_audio = NULL, *image_path = NULL, *mask_path = NULL;
    double strength = 0.6; /* the image-to-image pipelines' default (a double: steps * strength is Python's float product) */
    long frames = 0, quality = 100;
    float fps = 0.f;
    const char *prompts[64], *par_spec = NULL;
    int nprompts = 0;
    long width = 0, height = 0, steps = LONG_MIN, maxseq = 0, threads = 0, seed = 0; /* LONG_MIN, NAN: the model's defaults */
    float guidance = NAN, true_cfg = NAN;
    int cache = DL_CACHE_USE, have_sc = 0, keep_a = -1, keep_b = -1, cfg_batch = 0;
    dl_stepcache_config sc;
    dl_stepcache_parse("off", &sc);
    dl_dtype dt = dl_dtype_default();
    dl_quant quant = DL_QUANT_NONE;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEED()                                                                  \
    do {                                                                        \
        if (!v) {                                                               \
            fprintf(stderr, "difflet: generate: %s needs a value\n", a);        \
            return 2;                                                           \
        }                                                                       \
        i++;                                                                    \
    } while (0)
#define BAD(what)                                                               \
    do {                                                                        \
        fprintf(stderr, "difflet: generate: %s %s: %s\n", a, v, what);          \
        return 2;                                                               \
    } while (0)
        if (!strcmp(a, "--model")) { NEED(); model = v; }
        else if (!strcmp(a, "--cfg-batch")) cfg_batch = 1; /* a flag: no value */
        else if (!strcmp(a, "--prompt")) {
            NEED();
            if (nprompts == 64) BAD("at most 64 prompts");
            prompts[nprompts++] = v;
        } else if (!strcmp(a, "--parallel")) { NEED(); par_spec = v; }
        else if (!strcmp(a, "--negative-prompt")) { NEED(); neg = v; }
        else if (!strcmp(a, "-o") || !strcmp(a, "--output")) { NEED(); outp = v; }
        else if (!strcmp(a, "--latents")) { NEED(); lat_path = v; }
        else if (!strcmp(a, "--image")) { NEED(); image_path = v; }
        else if (!strcmp(a, "--mask")) { NEED(); mask_path = v; }
        else if (!strcmp(a, "--strength")) { NEED(); char *e; errno = 0; strength = strtod(v, &e); if (errno || *e || e == v || !(strength > 0 && strength <= 1)) BAD("must be a number in (0, 1]"); }
        else if (!strcmp(a, "--save-frames")) { NEED(); save_frames = v; }
        else if (!strcmp(a, "--save-audio")) { NEED(); save_audio = v; }
        else if (!strcmp(a, "--frames")) { NEED(); if (!parse_int(v, 1, 100000, &frames)) BAD("must be an integer in 1..100000"); }
        else if (!strcmp(a, "--fps")) { NEED(); if (!parse_float(v, &fps) || !(fps > 0.f && fps <= 1000.f)) BAD("must be a number in (0, 1000]"); }
        else if (!strcmp(a, "--output-compression")) { NEED(); if (!parse_int(v, 0, 100, &quality)) BAD("must be an integer in 0..100"); }
        else if (!strcmp(a, "--no-cache")) cache = DL_CACHE_OFF;
        else if (!strcmp(a, "--cache")) {
            NEED();
            if (dl_stepcache_parse(v, &sc) != DL_OK) {
                fprintf(stderr, "difflet: generate: --cache %s: %s\n", v, dl_last_error());
                return 2;
            }
            have_sc = 1;
        } else if (!strcmp(a, "--cache-keep")) {
            NEED();
            if (sscanf(v, "%d,%d", &keep_a, &keep_b) != 2 || keep_a < 0 || keep_b < 0) BAD("expected FIRST,LAST, e.g. 5,5");
        }
        else if (!strcmp(a, "--recompile-on-mismatch")) cache = DL_CACHE_RECOMPILE_ON_MISMATCH;
        else if (!strcmp(a, "--width")) { NEED(); if (!parse_int(v, 1, 8192, &width)) BAD("must be an integer in 1..8192"); }
        else if (!strcmp(a, "--height")) { NEED(); if (!parse_int(v, 1, 8192, &height)) BAD("must be an integer in 1..8192"); }
        else if (!strcmp(a, "--steps")) { NEED(); if (!parse_int(v, -1000000000L, 1000000000L, &steps)) BAD("must be an integer"); }
        else if (!strcmp(a, "--max-sequence-length")) { NEED(); if (!parse_int(v, 1, 4096, &maxseq)) BAD("must be in 1..4096 (each pipeline has its own limit)"); }
        else if (!strcmp(a, "--threads")) { NEED(); if (!parse_int(v, 1, 1024, &threads)) BAD("must be a positive integer"); }
        else if (!strcmp(a, "--seed")) { NEED(); if (!parse_int(v, 0, 0x7fffffffffffffffL, &seed)) BAD("must be a non-negative integer"); }
        else if (!strcmp(a, "--guidance")) { NEED(); if (!parse_float(v, &guidance)) BAD("must be a number"); }
        else if (!strcmp(a, "--true-cfg")) { NEED(); if (!parse_float(v, &true_cfg)) BAD("must be a number"); }
        else if (!strcmp(a, "--dtype")) {
            NEED();
            if (!dl_dtype_parse(v, &dt, &quant)) BAD("must be " DL_DTYPE_NAMES);
        } else {
            fprintf(stderr, "difflet: generate: unknown option '%s' (see difflet --help)\n", a);
            return 2;
        }
#undef NEED
#undef BAD
    }
    if (!model) { /* the embedded default: difflet-tiny, beside the sources */
        model = DIFFLET_SOURCE_DIR "/models/difflet-tiny";
        if (!dl_file_exists(model)) {
            fprintf(stderr, "difflet: generate: no model: pass --model DIR (a diffusers pipeline folder) or set DIFFLET_MODEL\n");
            return 2;
        }
    }
    if (!nprompts) {
        fprintf(stderr, "difflet: generate: --prompt TEXT is required\n");
        return 2;
    }
    dl_media_format ofmt;
    if (dl_media_format_from_path(outp, &ofmt) != DL_OK) {
        fprintf(stderr, "difflet: generate: -o %s\n", dl_last_error());
        return 2;
    }
    char model_buf[4096];
    if (!cli_model("generate", model, model_buf, sizeof model_buf)) return 1;
    model = model_buf;
    const dl_model_entry *entry;
    if (dl_registry_lookup(model, &entry) != DL_OK) {
        fprintf(stderr, "difflet: %s\n", dl_last_error());
        return 1;
    }
    dl_model_defaults md; /* the pipeline's own defaults, or the model folder's */
    dl_registry_defaults(entry, model, &md);
    if (steps == LONG_MIN) steps = md.steps;
    if (isnan(guidance)) guidance = md.guidance;
    if (isnan(true_cfg)) true_cfg = md.true_cfg > 0 ? md.true_cfg : 1.f;
    /* the typed request, validated once (the same checks the HTTP API makes) */
    dl_request rq;
    dl_request_init(&rq);
    rq.steps = steps == (int)steps ? (int)steps : -1;
    rq.guidance = guidance, rq.true_cfg = true_cfg, rq.seed = seed, rq.fps = fps;
    rq.frames = (int)frames, rq.max_sequence_length = (int)maxseq, rq.output_format = ofmt, rq.output_compression = (int)quality;
    for (int i = 0; i < nprompts; i++) {
        char param[64];
        if (dl_request_set_prompt(&rq, prompts[i], neg) != DL_OK ||
            dl_request_validate(&rq, &dl_request_engine_limits, param, sizeof param) != DL_OK) {
            static const char *flag[][2] = {{"steps", "--steps"}, {"guidance_scale", "--guidance"},
                                            {"true_cfg_scale", "--true-cfg"}, {"prompt", "--prompt"},
                                            {"negative_prompt", "--negative-prompt"}, {"seed", "--seed"}};
            const char *f = param;
            for (size_t k = 0; k < sizeof flag / sizeof flag[0]; k++)
                if (!strcmp(param, flag[k][0])) f = flag[k][1];
            fprintf(stderr, "difflet: generate: %s: %s\n", f, dl_last_error());
            dl_request_free(&rq);
            return 2;
        }
    }
    dl_request_free(&rq); /* the prompts again per generation: nothing held across the exits below */
    dl_par_config pc;
    if (dl_par_parse(par_spec, &pc) != DL_OK) {
        fprintf(stderr, "difflet: generate: %s\n", dl_last_error());
        return 2;
    }
    const int ranks = dl_par_ranks(&pc), passes = dl_registry_passes(entry, model, guidance, true_cfg, neg != NULL);
    if (cfg_batch && pc.cfg == 2) {
        fprintf(stderr, "difflet: generate: --cfg-batch and --parallel cfg=2 both place the two CFG branches: choose one\n");
        return 2;
    }
    if (ranks > 1) { /* feasibility before anything is compiled, with the reason */
        if (!cli_layout_ok("generate", model, par_spec, &pc, passes)) return 2;
        if (!dl_comm_launched()) {
            const char *sub[1] = {"generate"};
            return cli_mpirun(sub, 1, argc, argv, ranks, (int)threads, 1);
        }
    }
    dl_comm *world = NULL;
    dl_par_place place = {0};
    if (dl_comm_launched() && ranks == 1) { /* `mpirun -n K difflet generate` without a layout */
        if (dl_comm_world(&world) != DL_OK) {
            fprintf(stderr, "difflet: generate: %s\n", dl_last_error());
            return 1;
        }
        if (dl_comm_size(world) > 1) {
            if (dl_comm_rank(world) == 0)
                fprintf(stderr, "difflet: generate: started as %d MPI ranks without --parallel (e.g. --parallel dp=%d)\n",
                        dl_comm_size(world), dl_comm_size(world));
            dl_comm_finalize();
            return 2;
        }
    }
    int parallel = dl_comm_launched() && ranks > 1;
    if (parallel) {
        if (dl_comm_world(&world) != DL_OK || dl_par_place_new(world, &pc, &place) != DL_OK) {
            fprintf(stderr, "difflet: generate: %s\n", dl_last_error());
            return rank_fail(parallel, 1);
        }
    }
    if (threads) dl_set_threads((int)threads);
    if (entry->output != DL_MEDIA_IMAGE && ofmt != DL_FMT_MP4) {
        fprintf(stderr, "difflet: generate: %s makes videos: write .mp4 (--save-frames DIR keeps every frame as PNG)\n",
                entry->pipeline_class);
        return rank_fail(parallel, 2);
    }
    if (entry->output == DL_MEDIA_IMAGE && (frames > 1 || ofmt == DL_FMT_MP4)) {
        fprintf(stderr, "difflet: generate: %s makes images: %s\n", entry->pipeline_class,
                frames > 1 ? "--frames must be 1" : "write .png, .jpg or .webp");
        return rank_fail(parallel, 2);
    }
    if ((image_path || mask_path) && !entry->image_to_image) {
        fprintf(stderr, "difflet: generate: --image/--mask: %s has no image-to-image or inpainting flow (FLUX models have)\n",
                entry->pipeline_class);
        return rank_fail(parallel, 2);
    }
    if (mask_path && !image_path) {
        fprintf(stderr, "difflet: generate: --mask needs --image (the picture to inpaint)\n");
        return rank_fail(parallel, 2);
    }
    dl_image init_img = {0}, mask_img = {0};
    if ((image_path && dl_image_read(image_path, &init_img) != DL_OK) ||
        (mask_path && dl_image_read(mask_path, &mask_img) != DL_OK)) {
        fprintf(stderr, "difflet: generate: %s\n", dl_last_error());
        dl_image_free(&init_img);
        return rank_fail(parallel, 2);
    }
    if (image_path && !width && !height) { /* the image's size, down to a multiple of 16 (FLUX's 2 x VAE scale) */
        width = init_img.width - init_img.width % 16, height = init_img.height - init_img.height % 16;
        if (!width || !height) {
            fprintf(stderr, "difflet: generate: --image %s is %dx%d: smaller than 16 pixels\n", image_path, init_img.width,
                    init_img.height);
            dl_image_free(&init_img), dl_image_free(&mask_img);
            return rank_fail(parallel, 2);
        }
    }
    int dw, dh, dframes;
    dl_registry_default_shape(entry, model, &dw, &dh, &dframes);
    if (!width) width = height ? height : dw;
    if (!height) height = width;
    dl_gen_shape shape = {.width = (int)width, .height = (int)height, .frames = frames ? (int)frames : dframes,
                          .max_sequence_length = (int)maxseq,
                          .dt = dt, .quant = quant, .cache = cache, .cfg_batch = cfg_batch, .par = parallel ? &place : NULL};
    int host = !parallel || dl_comm_rank(place.replica_comm) == 0;
    char lay[96];
    dl_par_format(&pc, lay, sizeof lay);
    if (!parallel || dl_comm_rank(world) == 0)
        fprintf(stderr, "difflet: loading %s for %ldx%ld (%s, %d threads%s%s%s)\n", model, width, height,
                quant ? dl_quant_scheme_name(quant) : dl_dtype_name(dt), dl_threads(), parallel ? " per rank, " : "", parallel ? lay : "",
                parallel ? " over MPI" : "");
    double t0 = dl_now();
    dl_pipeline *p;
    if (dl_pipeline_load(&p, model, &shape) != DL_OK) {
        fprintf(stderr, "difflet: %s\n", dl_last_error());
        dl_image_free(&init_img), dl_image_free(&mask_img);
        return rank_fail(parallel, 1);
    }
    double load_s = dl_now() - t0;
    uint8_t *image_rgb = NULL, *mask_l = NULL; /* at the generation size, as VaeImageProcessor prepares them */
    if ((image_path && dl_image_prepare(&init_img, DL_IMAGE_RGB, (int)width, (int)height, &image_rgb) != DL_OK) ||
        (mask_path && dl_image_prepare(&mask_img, DL_IMAGE_LUMA, (int)width, (int)height, &mask_l) != DL_OK)) {
        fprintf(stderr, "difflet: generate: %s\n", dl_last_error());
        dl_image_free(&init_img), dl_image_free(&mask_img);
        free(image_rgb);
        dl_pipeline_free(p);
        return rank_fail(parallel, 1);
    }
    dl_image_free(&init_img), dl_image_free(&mask_img);
    if (!host) { /* this rank executes its part of the host's steps */
        dl_image_free(&init_img), dl_image_free(&mask_img);
        if (dl_pipeline_worker(p) != DL_OK) {
            fprintf(stderr, "difflet: rank %d: %s\n", dl_comm_rank(world), dl_last_error());
            return rank_fail(parallel, 1);
        }
        dl_pipeline_free(p);
        dl_par_place_free(&place);
        dl_comm_finalize();
        return 0;
    }
    dl_checkpoint *init = NULL; /* --latents: the pipeline's initial-noise arguments by name */
    if (lat_path && dl_ckpt_open(&init, lat_path, NULL) != DL_OK) {
        fprintf(stderr, "difflet: %s\n", dl_last_error());
        dl_pipeline_free(p);
        return rank_fail(parallel, 1);
    }
    progress pr = {isatty(2) && !parallel};
    if (keep_a >= 0) sc.keep_first = keep_a, sc.keep_last = keep_b;
    (void)have_sc;
    int rc = 0;
    const int replica = parallel ? place.replica : 0;
    for (int i = replica; i < nprompts && rc == 0; i += pc.dp) { /* this replica's prompts */
        char path[4096];
        if (nprompts > 1) indexed(path, sizeof path, outp, i);
        else snprintf(path, sizeof path, "%s", outp);
        dl_gen_request r;
        if (dl_request_set_prompt(&rq, prompts[i], neg) != DL_OK) {
            fprintf(stderr, "difflet: %s\n", dl_last_error());
            rc = 1;
            break;
        }
        dl_gen_request_from(&r, &rq);
        r.init = init, r.cache = &sc, r.on_step = on_step, r.on_decode = on_decode, r.ctx = &pr;
        r.image = image_rgb, r.mask = mask_l, r.strength = strength, r.image_width = (int)width, r.image_height = (int)height;
        dl_gen_timing tm;
        dl_media media;
        if (dl_pipeline_generate(p, &r, &media, &tm) != DL_OK) {
            fprintf(stderr, "difflet: %s\n", dl_last_error());
            rc = 1;
        } else if (save_audio && !media.audio) {
            fprintf(stderr, "difflet: --save-audio: %s makes no sound (%s output)\n", entry->pipeline_class,
                    dl_media_kind_name(media.kind));
            rc = 1;
        } else if ((save_frames && dl_media_save_frames(save_frames, &media) != DL_OK) ||
                   (save_audio && dl_wav_write(save_audio, media.audio, media.audio_samples,
                                               dl_media_audio_channels(&media), media.audio_rate) != DL_OK) ||
                   dl_media_write(path, &media, (int)quality) != DL_OK) {
            fprintf(stderr, "difflet: %s\n", dl_last_error());
            rc = 1;
        } else {
            fprintf(stderr, "difflet: load %.2f s | encode %.2f s | denoise %.2f s (%d transformer calls, %.3f s each; %d cached steps) | decode %.2f s\n",
                    load_s, tm.encode_s, tm.denoise_s, tm.denoiser_calls,
                    tm.denoiser_calls ? tm.denoise_s / tm.denoiser_calls : 0.0, tm.cached_steps, tm.decode_s);
            if (tm.nstages) { /* the pipeline's own stages (LTX-2) */
                fprintf(stderr, "difflet: stages:");
                for (int k = 0; k < tm.nstages; k++)
                    fprintf(stderr, "%s %s %.3f s", k ? ";" : "", tm.stage[k].name, tm.stage[k].s);
                fprintf(stderr, "\n");
            }
            if (parallel)
                fprintf(stderr, "difflet: replica %d: %s; %d ranks ran exactly the decided steps; host %.3f s in communication\n",
                        replica, lay, tm.ranks, tm.comm_s);
            printf("%s\n", path);
        }
        dl_media_free(&media);
    }
    dl_ckpt_free(init);
    free(image_rgb), free(mask_l);
    dl_request_free(&rq);
    dl_pipeline_free(p); /* releases this replica's workers */
    if (parallel) {
        if (rc) return rank_fail(parallel, rc);
        dl_par_place_free(&place);
        dl_comm_finalize();
    }
    return rc;
}
