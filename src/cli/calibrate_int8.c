/* `difflet calibrate-int8`: measures, layer by layer, what W8A8's per-token activation
 * quantization loses on real prompts, and writes the verdicts a W8A8 compile of the
 * model uses (docs/int8.md).
 *
 *   difflet calibrate-int8 --model DIR --prompts FILE [--steps N] [--size WxH]
 *                          [--frames N] [--threshold T] [-o FILE]
 *
 * The model runs in f32 (no quantization) with every linear observed
 * (src/models/int8_calib.c): each prompt of FILE (one a line, # comments) is generated
 * at the model's defaults (size, frames, steps, guidance with its negative prompt) or
 * the options, seed = its line index. Layers whose activation error is above T (default
 * 0.05: 5 % relative RMS) are written weight-only. The file goes to
 * DIR/int8_calibration.json unless -o says otherwise: there, every later `--dtype int8`
 * compile of DIR reads it (the program key carries its hash, so a new calibration
 * compiles new programs). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "difflet/models.h"
#include "difflet/pipeline.h"
#include "difflet/registry.h"

enum { MAXPROMPTS = 256 };

static int usage(const char *why) {
    fprintf(stderr, "difflet: calibrate-int8: %s\n"
                    "usage: difflet calibrate-int8 --model DIR --prompts FILE [--steps N] [--size WxH] [--frames N]\n"
                    "                              [--threshold T] [-o FILE]\n", why);
    return 2;
}

int cli_calibrate_int8(int argc, char **argv) {
    const char *model = NULL, *prompts_path = NULL, *out = NULL;
    long steps = 0, w = 0, h = 0, frames = 0;
    double thr = 0.05;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *end = NULL;
        if (!v) return usage(strcmp(a, "--help") ? "an option without its value" : "");
        errno = 0;
        if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--prompts")) prompts_path = v;
        else if (!strcmp(a, "-o")) out = v;
        else if (!strcmp(a, "--steps")) {
            steps = strtol(v, &end, 10);
            if (*end || errno || steps < 1 || steps > DL_STEPS_MAX) return usage("--steps must be a positive integer");
        } else if (!strcmp(a, "--frames")) {
            frames = strtol(v, &end, 10);
            if (*end || errno || frames < 1 || frames > 4096) return usage("--frames must be 1..4096");
        } else if (!strcmp(a, "--size")) {
            if (sscanf(v, "%ldx%ld", &w, &h) != 2 || w < 1 || h < 1 || w > 8192 || h > 8192) return usage("--size must be WxH");
        } else if (!strcmp(a, "--threshold")) {
            thr = strtod(v, &end);
            if (*end || errno || !(thr >= 0) || thr > 1) return usage("--threshold must be a number in 0..1");
        } else
            return usage("unknown option");
        i++;
    }
    if (!model || !prompts_path) return usage("--model and --prompts are required");
    char model_buf[4096], out_buf[4200];
    if (!cli_model("calibrate-int8", model, model_buf, sizeof model_buf)) return 1;
    model = model_buf;
    if (!out) snprintf(out_buf, sizeof out_buf, "%s/int8_calibration.json", model), out = out_buf;
    const dl_model_entry *e;
    if (dl_registry_lookup(model, &e) != DL_OK) {
        fprintf(stderr, "difflet: %s\n", dl_last_error());
        return 1;
    }
    char *txt, *prompts[MAXPROMPTS];
    size_t len;
    int np = 0;
    if (dl_file_read(prompts_path, 1 << 20, &txt, &len) != DL_OK) {
        fprintf(stderr, "difflet: %s\n", dl_last_error());
        return 1;
    }
    for (char *line = strtok(txt, "\n"); line; line = strtok(NULL, "\n")) {
        line[strcspn(line, "\r")] = 0; /* CRLF files */
        if (!*line || *line == '#') continue;
        if (np == MAXPROMPTS) {
            fprintf(stderr, "difflet: calibrate-int8: %s has more than %d prompts; the first %d are used\n", prompts_path,
                    MAXPROMPTS, MAXPROMPTS);
            break;
        }
        prompts[np++] = line;
    }
    if (!np) {
        fprintf(stderr, "difflet: calibrate-int8: %s has no prompts (one a line)\n", prompts_path);
        free(txt);
        return 1;
    }
    dl_model_defaults md;
    int dw, dh, df;
    dl_registry_defaults(e, model, &md);
    dl_registry_default_shape(e, model, &dw, &dh, &df);
    if (!w) w = dw, h = dh;
    if (!frames) frames = df;
    if (!steps) steps = md.steps;
    const dl_gen_shape shape = {.width = (int)w, .height = (int)h, .frames = (int)frames, .dt = DL_F32};
    dl_int8_calib_begin();
    dl_pipeline *p = NULL;
    int rc = 1;
    fprintf(stderr, "difflet: calibrating int8 activations of %s: %d prompts, %ldx%ld, %ld steps (f32)\n", model, np, w, h,
            steps);
    if (dl_pipeline_load(&p, model, &shape) != DL_OK) {
        fprintf(stderr, "difflet: %s\n", dl_last_error());
        goto done;
    }
    for (int i = 0; i < np; i++) {
        const int cfg = e->guidance_cfg ? md.guidance > 1.f : 0;
        dl_gen_request r = {.prompt = prompts[i], .negative_prompt = cfg ? "" : NULL, .steps = (int)steps,
                            .guidance = md.guidance, .true_cfg = md.true_cfg > 0 ? md.true_cfg : 1.f, .seed = (uint64_t)i};
        dl_media m;
        if (dl_pipeline_generate(p, &r, &m, NULL) != DL_OK) {
            fprintf(stderr, "difflet: %s\n", dl_last_error());
            goto done;
        }
        dl_media_free(&m);
        fprintf(stderr, "  prompt %d/%d\n", i + 1, np);
    }
    dl_pipeline_free(p), p = NULL;
    cJSON *about = cJSON_CreateObject();
    cJSON_AddStringToObject(about, "model", model);
    cJSON_AddNumberToObject(about, "prompts", np);
    cJSON_AddNumberToObject(about, "steps", (double)steps);
    char size[64];
    snprintf(size, sizeof size, "%ldx%ld", w, h);
    cJSON_AddStringToObject(about, "size", size);
    cJSON_AddNumberToObject(about, "frames", (double)frames);
    cJSON_AddStringToObject(about, "metric", "act_error: relative RMS error of the layer's per-token W8A8 activations");
    char *about_txt = cJSON_PrintUnformatted(about);
    cJSON_Delete(about);
    int layers, wo;
    if (about_txt && dl_int8_calib_write(out, thr, about_txt, &layers, &wo) == DL_OK) {
        printf("int8 calibration: %d linears observed, %d above %.3g activation error (weight-only); wrote %s\n", layers, wo,
               thr, out);
        rc = 0;
    } else {
        fprintf(stderr, "difflet: %s\n", about_txt ? dl_last_error() : "out of memory");
    }
    free(about_txt);
done:
    dl_pipeline_free(p);
    dl_int8_calib_end();
    free(txt);
    return rc;
}
