/* `difflet eval-tiny`: does difflet-tiny draw what the prompt says? For held-out
 * prompts (combinations never used in training, from <model>/eval_prompts.json) the
 * C engine generates a picture, and simple pixel statistics read it back:
 *   background colour: the mean of the border pixels, nearest named colour;
 *   shape colour: the mean of the shape's core, the pixels at least 0.71 (sqrt 1/2) times as far
 *     (in RGB distance) from the background colour as the farthest one, since the
 *     shape's edge blends with the background; nearest named colour other than the
 *     background;
 *   position: the centroid of those pixels, nearest of the five named positions.
 * Prints a table and the fraction right for each; exits 1 when a rate is below the
 * thresholds given (--min-bg, --min-fg, --min-pos), so `make test` can run a small
 * version that a broken model cannot pass. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "difflet/registry.h"
#include "difflet/pipeline.h"

#ifndef DIFFLET_SOURCE_DIR
#define DIFFLET_SOURCE_DIR "."
#endif

enum { MAXC = 32, MAXP = 16 };

typedef struct {
    int nc, np;
    char cname[MAXC][32], pname[MAXP][32];
    float crgb[MAXC][3], pxy[MAXP][2];
} palette;

static int nearest_colour(const palette *p, const float *rgb, int exclude) {
    int best = -1;
    float bd = INFINITY;
    for (int i = 0; i < p->nc; i++) {
        if (i == exclude) continue;
        float d = 0;
        for (int c = 0; c < 3; c++) d += (rgb[c] - p->crgb[i][c]) * (rgb[c] - p->crgb[i][c]);
        if (d < bd) bd = d, best = i;
    }
    return best;
}

/* classify one RGB image (size x size); out: bg, fg colour index, position index */
static void classify(const palette *p, const uint8_t *img, int size, int *bg, int *fg, int *pos) {
    float acc[3] = {0}, n = 0;
    for (int y = 0; y < size; y++)
        for (int x = 0; x < size; x++)
            if (x < 2 || y < 2 || x >= size - 2 || y >= size - 2) {
                for (int c = 0; c < 3; c++) acc[c] += img[(y * size + x) * 3 + c];
                n++;
            }
    float bgc[3] = {acc[0] / n, acc[1] / n, acc[2] / n};
    *bg = nearest_colour(p, bgc, -1);
    float f[3] = {0}, cx = 0, cy = 0, m = 0, dmax = 0, mf = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int y = 0; y < size; y++)
            for (int x = 0; x < size; x++) {
                const uint8_t *q = img + (y * size + x) * 3;
                float d = 0;
                for (int c = 0; c < 3; c++) d += (q[c] - bgc[c]) * (q[c] - bgc[c]);
                if (pass == 0) {
                    dmax = fmaxf(dmax, d);
                    if (d > 60.f * 60.f) cx += (float)x, cy += (float)y, m++; /* clearly not background */
                } else if (d >= 0.5f * dmax) { /* the shape's core: its edge blends with the background */
                    for (int c = 0; c < 3; c++) f[c] += q[c];
                    mf++;
                }
            }
    if (m < 4) {
        *fg = *pos = -1;
        return;
    }
    for (int c = 0; c < 3; c++) f[c] /= mf;
    *fg = nearest_colour(p, f, *bg);
    cx /= m, cy /= m;
    float bd = INFINITY;
    *pos = -1;
    for (int i = 0; i < p->np; i++) {
        float d = (cx - p->pxy[i][0]) * (cx - p->pxy[i][0]) + (cy - p->pxy[i][1]) * (cy - p->pxy[i][1]);
        if (d < bd) bd = d, *pos = i;
    }
}

static int index_of(char names[][32], int n, const char *s) {
    for (int i = 0; i < n; i++)
        if (!strcmp(names[i], s)) return i;
    return -1;
}

int cli_eval_tiny(int argc, char **argv) {
    const char *model = DIFFLET_SOURCE_DIR "/models/difflet-tiny", *json_path = NULL, *save = NULL;
    int nprompts = 96, steps = 20;
    float cfg = 3.f, min_bg = 0, min_fg = 0, min_pos = 0;
    dl_dtype dt = DL_F32;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "difflet: eval-tiny: %s needs a value\n", a);
            return 2;
        }
        i++;
        if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--prompts")) nprompts = atoi(v);
        else if (!strcmp(a, "--steps")) steps = atoi(v);
        else if (!strcmp(a, "--true-cfg")) cfg = strtof(v, NULL);
        else if (!strcmp(a, "--min-bg")) min_bg = strtof(v, NULL);
        else if (!strcmp(a, "--min-fg")) min_fg = strtof(v, NULL);
        else if (!strcmp(a, "--min-pos")) min_pos = strtof(v, NULL);
        else if (!strcmp(a, "--json")) json_path = v;
        else if (!strcmp(a, "--save-grid")) save = v;
        else if (!strcmp(a, "--dtype")) dt = !strcmp(v, "bf16") ? DL_BF16 : DL_F32;
        else {
            fprintf(stderr, "difflet: eval-tiny: unknown option '%s'\n", a);
            return 2;
        }
    }
    if (nprompts <= 0 || steps <= 0) {
        fprintf(stderr, "difflet: eval-tiny: --prompts and --steps must be positive\n");
        return 2;
    }
    char model_buf[3072];
    if (!cli_model("eval-tiny", model, model_buf, sizeof model_buf)) return 1;
    model = model_buf;
    char path[4096];
    snprintf(path, sizeof path, "%s/eval_prompts.json", model);
    cJSON *root;
    if (dl_json_read_object(path, NULL, &root) != DL_OK) {
        fprintf(stderr, "difflet: %s\n", dl_last_error());
        return 1;
    }
    palette pal = {0};
    const cJSON *e, *prompts = cJSON_GetObjectItemCaseSensitive(root, "prompts");
    int size = (int)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(root, "size"));
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(root, "colours")) {
        if (pal.nc == MAXC) break;
        snprintf(pal.cname[pal.nc], 32, "%s", e->string);
        for (int c = 0; c < 3; c++) pal.crgb[pal.nc][c] = (float)cJSON_GetArrayItem(e, c)->valuedouble;
        pal.nc++;
    }
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(root, "positions")) {
        if (pal.np == MAXP) break;
        snprintf(pal.pname[pal.np], 32, "%s", e->string);
        for (int c = 0; c < 2; c++) pal.pxy[pal.np][c] = (float)cJSON_GetArrayItem(e, c)->valuedouble;
        pal.np++;
    }
    if (!cJSON_IsArray(prompts) || size <= 0 || pal.nc < 2 || pal.np < 1) {
        fprintf(stderr, "difflet: %s: not an evaluation prompt file\n", path);
        cJSON_Delete(root);
        return 1;
    }
    if (nprompts > cJSON_GetArraySize(prompts)) nprompts = cJSON_GetArraySize(prompts);
    dl_gen_shape shape = {.frames = 1, .width = size, .height = size, .dt = dt};
    dl_pipeline *p;
    if (dl_pipeline_load(&p, model, &shape) != DL_OK) {
        fprintf(stderr, "difflet: %s\n", dl_last_error());
        cJSON_Delete(root);
        return 1;
    }
    uint8_t *rgb = malloc((size_t)(size * size * 3));
    const int grid_rows = (nprompts + 11) / 12; /* a grid of 12 pictures per row */
    uint8_t *grid = save ? calloc((size_t)(size * size * 3) * 12 * (size_t)grid_rows, 1) : NULL;
    int ok_bg = 0, ok_fg = 0, ok_pos = 0, rc = 0;
    cJSON *rows = cJSON_CreateArray();
    printf("%-64s %-14s %-14s %-14s\n", "prompt", "background", "shape colour", "position");
    double t0 = dl_now();
    for (int i = 0; i < nprompts; i++) {
        const cJSON *pr = cJSON_GetArrayItem(prompts, i);
        const char *cap = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(pr, "caption"));
        int wbg = index_of(pal.cname, pal.nc, cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(pr, "background")));
        int wfg = index_of(pal.cname, pal.nc, cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(pr, "colour")));
        int wpos = index_of(pal.pname, pal.np, cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(pr, "position")));
        dl_gen_request r = {.prompt = cap ? cap : "", .negative_prompt = "", .steps = steps, .true_cfg = cfg,
                             .seed = (uint64_t)(1000 + i)};
        if (dl_pipeline_generate_rgb(p, &r, rgb, NULL) != DL_OK) {
            fprintf(stderr, "difflet: %s\n", dl_last_error());
            rc = 1;
            break;
        }
        int bg, fg, pos;
        classify(&pal, rgb, size, &bg, &fg, &pos);
        ok_bg += bg == wbg, ok_fg += fg == wfg, ok_pos += pos == wpos;
        char b1[40], b2[40], b3[40];
        snprintf(b1, sizeof b1, "%s%s", bg == wbg ? "" : "x ", bg >= 0 ? pal.cname[bg] : "-");
        snprintf(b2, sizeof b2, "%s%s", fg == wfg ? "" : "x ", fg >= 0 ? pal.cname[fg] : "-");
        snprintf(b3, sizeof b3, "%s%s", pos == wpos ? "" : "x ", pos >= 0 ? pal.pname[pos] : "-");
        printf("%-64.64s %-14s %-14s %-14s\n", cap, b1, b2, b3);
        cJSON *row = cJSON_CreateObject();
        cJSON_AddStringToObject(row, "prompt", cap);
        cJSON_AddBoolToObject(row, "background", bg == wbg);
        cJSON_AddBoolToObject(row, "shape_colour", fg == wfg);
        cJSON_AddBoolToObject(row, "position", pos == wpos);
        cJSON_AddItemToArray(rows, row);
        if (grid) /* prompts side by side, 12 per row */
            for (int y = 0; y < size; y++)
                memcpy(grid + (((size_t)(i / 12) * (size_t)size + (size_t)y) * 12 + (size_t)(i % 12)) * (size_t)size * 3,
                       rgb + (size_t)y * (size_t)size * 3, (size_t)size * 3);
    }
    if (rc == 0) {
        float fb = (float)ok_bg / nprompts, ff = (float)ok_fg / nprompts, fp = (float)ok_pos / nprompts;
        printf("\n%d held-out prompts, %d steps, true CFG %.1f, %.1f s: background %.0f%%, shape colour %.0f%%, position %.0f%%\n",
               nprompts, steps, cfg, dl_now() - t0, 100 * fb, 100 * ff, 100 * fp);
        if (fb < min_bg || ff < min_fg || fp < min_pos) {
            printf("below the thresholds (background %.0f%%, shape colour %.0f%%, position %.0f%%)\n", 100 * min_bg,
                   100 * min_fg, 100 * min_pos);
            rc = 1;
        }
        if (json_path) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddNumberToObject(o, "prompts", nprompts);
            cJSON_AddNumberToObject(o, "steps", steps);
            cJSON_AddNumberToObject(o, "background", fb);
            cJSON_AddNumberToObject(o, "shape_colour", ff);
            cJSON_AddNumberToObject(o, "position", fp);
            cJSON_AddItemToObject(o, "rows", rows);
            rows = NULL;
            char *t = cJSON_Print(o);
            if (t) dl_file_write_atomic(json_path, t, strlen(t));
            free(t);
            cJSON_Delete(o);
        }
        if (grid) {
            if (dl_png_write(save, grid, 12 * size, grid_rows * size) != DL_OK) fprintf(stderr, "difflet: %s\n", dl_last_error());
        }
    }
    cJSON_Delete(rows);
    free(rgb), free(grid);
    dl_pipeline_free(p);
    cJSON_Delete(root);
    return rc;
}
