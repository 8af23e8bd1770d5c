/* `difflet eval-tiny` and `difflet eval-tiny-video`: do the embedded models draw what
 * the prompt says? For held-out prompts (combinations never used in training, from
 * <model>/eval_prompts.json, or --prompts-file) the C engine generates a picture or a clip, and simple
 * pixel statistics read it back (over every frame of a clip):
 *   background colour: the mean of the border pixels, nearest named colour;
 *   shape colour: the mean of the shape's core, the pixels at least 0.71 (sqrt 1/2) times as far
 *     (in RGB distance) from the background colour as the farthest one, since the
 *     shape's edge blends with the background; nearest named colour other than the
 *     background;
 *   position (pictures): the centroid of the pixels clearly off the background,
 *     nearest of the named positions;
 *   motion (clips): the track of that centroid across the frames. Its least-squares
 *     displacement over the clip under STILL_PX pixels is "still"; else the sign of
 *     the larger axis gives the direction, counted right only when the track is
 *     monotone along that axis (no step back by more than BACK_PX pixels).
 * Prints a table and the fraction right for each; exits 1 when a rate is below the
 * thresholds given (--min-bg, --min-fg, --min-pos / --min-motion), so `make test` can
 * run a small version that a broken model (or engine) cannot pass. */
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

enum { MAXC = 32, MAXP = 16, MAXF = 257 };
static const float STILL_PX = 6.f, BACK_PX = 2.f;
static const char *const k_motions[] = {"left to right", "right to left", "top to bottom", "bottom to top", "still"};
enum { NMOTIONS = 5, ERRATIC = NMOTIONS };

typedef struct {
    int nc, np;
    char cname[MAXC][32], pname[MAXP][32];
    float crgb[MAXC][3], pxy[MAXP][2];
} palette;

/* what one output reads as */
typedef struct {
    int bg, fg;             /* colour indices (-1: no shape found) */
    int nf;                 /* frames */
    float cx[MAXF], cy[MAXF];
    int found[MAXF];        /* the frame has a shape (its centroid is set) */
} reading;

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

/* read nf RGB frames of size x size */
static void read_output(const palette *p, const uint8_t *rgb, int nf, int size, reading *r) {
    const size_t fs = (size_t)size * (size_t)size * 3;
    float acc[3] = {0}, n = 0;
    for (int f = 0; f < nf; f++)
        for (int y = 0; y < size; y++)
            for (int x = 0; x < size; x++)
                if (x < 2 || y < 2 || x >= size - 2 || y >= size - 2) {
                    for (int c = 0; c < 3; c++) acc[c] += rgb[f * fs + (size_t)(y * size + x) * 3 + (size_t)c];
                    n++;
                }
    float bgc[3] = {acc[0] / n, acc[1] / n, acc[2] / n};
    r->bg = nearest_colour(p, bgc, -1);
    r->nf = nf;
    float fc[3] = {0}, dmax = 0, mf = 0, m_all = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int f = 0; f < nf; f++) {
            float cx = 0, cy = 0, m = 0;
            for (int y = 0; y < size; y++)
                for (int x = 0; x < size; x++) {
                    const uint8_t *q = rgb + f * fs + (size_t)(y * size + x) * 3;
                    float d = 0;
                    for (int c = 0; c < 3; c++) d += (q[c] - bgc[c]) * (q[c] - bgc[c]);
                    if (pass == 0) {
                        dmax = fmaxf(dmax, d);
                        if (d > 60.f * 60.f) cx += (float)x, cy += (float)y, m++; /* clearly not background */
                    } else if (d >= 0.5f * dmax) { /* the shape's core: its edge blends with the background */
                        for (int c = 0; c < 3; c++) fc[c] += q[c];
                        mf++;
                    }
                }
            if (pass == 0) {
                r->found[f] = m >= 4;
                r->cx[f] = m >= 4 ? cx / m : 0, r->cy[f] = m >= 4 ? cy / m : 0;
                m_all += m;
            }
        }
    if (m_all < 4) {
        r->fg = -1;
        return;
    }
    for (int c = 0; c < 3; c++) fc[c] /= mf;
    r->fg = nearest_colour(p, fc, r->bg);
}

static int nearest_position(const palette *p, float cx, float cy) {
    float bd = INFINITY;
    int best = -1;
    for (int i = 0; i < p->np; i++) {
        float d = (cx - p->pxy[i][0]) * (cx - p->pxy[i][0]) + (cy - p->pxy[i][1]) * (cy - p->pxy[i][1]);
        if (d < bd) bd = d, best = i;
    }
    return best;
}

/* least-squares slope of v over the frames that have a shape, times the clip's span */
static float displacement(const reading *r, const float *v) {
    double n = 0, st = 0, sv = 0, stt = 0, stv = 0;
    for (int f = 0; f < r->nf; f++)
        if (r->found[f]) n++, st += f, sv += v[f], stt += (double)f * f, stv += (double)f * v[f];
    double den = n * stt - st * st;
    return n >= 2 && den > 0 ? (float)((n * stv - st * sv) / den * (r->nf - 1)) : 0.f;
}

/* the motion index (k_motions), ERRATIC for a track that goes back and forth, -1 without a track */
static int read_motion(const reading *r) {
    int seen = 0;
    for (int f = 0; f < r->nf; f++) seen += r->found[f];
    if (seen < 2 || seen * 2 < r->nf) return -1; /* the shape is missing from most frames */
    float dx = displacement(r, r->cx), dy = displacement(r, r->cy);
    if (fmaxf(fabsf(dx), fabsf(dy)) < STILL_PX) return 4;
    int horiz = fabsf(dx) >= fabsf(dy);
    float sign = horiz ? (dx > 0 ? 1.f : -1.f) : (dy > 0 ? 1.f : -1.f);
    const float *v = horiz ? r->cx : r->cy;
    for (int f = 0, prev = -1; f < r->nf; f++) {
        if (!r->found[f]) continue;
        if (prev >= 0 && (v[f] - v[prev]) * sign < -BACK_PX) return ERRATIC;
        prev = f;
    }
    return horiz ? (sign > 0 ? 0 : 1) : (sign > 0 ? 2 : 3);
}

/* colours and (pictures) positions of an eval_prompts.json; returns its "size" (0: none) */
static int load_palette(const cJSON *root, palette *pal) {
    const cJSON *e;
    memset(pal, 0, sizeof *pal);
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(root, "colours")) {
        if (pal->nc == MAXC || cJSON_GetArraySize(e) != 3) break;
        snprintf(pal->cname[pal->nc], 32, "%s", e->string);
        for (int c = 0; c < 3; c++) pal->crgb[pal->nc][c] = (float)cJSON_GetArrayItem(e, c)->valuedouble;
        pal->nc++;
    }
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(root, "positions")) {
        if (pal->np == MAXP || cJSON_GetArraySize(e) != 2) break;
        snprintf(pal->pname[pal->np], 32, "%s", e->string);
        for (int c = 0; c < 2; c++) pal->pxy[pal->np][c] = (float)cJSON_GetArrayItem(e, c)->valuedouble;
        pal->np++;
    }
    const cJSON *sz = cJSON_GetObjectItemCaseSensitive(root, "size");
    return cJSON_IsNumber(sz) && sz->valuedouble >= 16 && sz->valuedouble <= 1024 ? (int)sz->valuedouble : 0;
}

static int index_of(char names[][32], int n, const char *s) {
    for (int i = 0; i < n; i++)
        if (s && !strcmp(names[i], s)) return i;
    return -1;
}

static int motion_index(const char *s) {
    for (int i = 0; i < NMOTIONS; i++)
        if (s && !strcmp(k_motions[i], s)) return i;
    return -1;
}

typedef struct {
    const char *cmd, *model, *json_path, *save, *prompts_file; /* prompts_file: NULL, <model>/eval_prompts.json */
    const char *negative; /* --negative-prompt; NULL: empty, as the evaluation tables are made */
    int nprompts, steps, video;
    float cfg, min[3]; /* background, shape colour, position or motion */
    dl_dtype dt;
    dl_quant quant;
} eval_opts;

static int parse_opts(eval_opts *o, int argc, char **argv) {
    const char *third = o->video ? "--min-motion" : "--min-pos", *cfg = o->video ? "--guidance" : "--true-cfg";
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "difflet: %s: %s needs a value\n", o->cmd, a);
            return 0;
        }
        i++;
        if (!strcmp(a, "--model")) o->model = v;
        else if (!strcmp(a, "--prompts")) o->nprompts = atoi(v);
        else if (!strcmp(a, "--steps")) o->steps = atoi(v);
        else if (!strcmp(a, cfg)) o->cfg = strtof(v, NULL);
        else if (!strcmp(a, "--min-bg")) o->min[0] = strtof(v, NULL);
        else if (!strcmp(a, "--min-fg")) o->min[1] = strtof(v, NULL);
        else if (!strcmp(a, third)) o->min[2] = strtof(v, NULL);
        else if (!strcmp(a, "--json")) o->json_path = v;
        else if (!strcmp(a, "--prompts-file")) o->prompts_file = v;
        else if (!strcmp(a, "--negative-prompt")) o->negative = v;
        else if (!strcmp(a, "--save-grid")) o->save = v;
        else if (!strcmp(a, "--dtype") && dl_dtype_parse(v, &o->dt, &o->quant)) continue;
        else {
            fprintf(stderr, "difflet: %s: unknown option '%s %s'\n", o->cmd, a, v);
            return 0;
        }
    }
    if (o->nprompts <= 0 || o->steps <= 0 || o->cfg < 0) {
        fprintf(stderr, "difflet: %s: --prompts and --steps must be positive, %s not negative\n", o->cmd, cfg);
        return 0;
    }
    return 1;
}

/* grid: pictures 12 to a row; clips one to a row, their frames side by side */
static void grid_put(uint8_t *grid, const uint8_t *rgb, int i, int nf, int size) {
    const size_t row = (size_t)size * 3, cols = nf > 1 ? (size_t)nf : 12;
    const size_t gy = nf > 1 ? (size_t)i : (size_t)(i / 12), gx = nf > 1 ? 0 : (size_t)(i % 12);
    for (int f = 0; f < nf; f++)
        for (int y = 0; y < size; y++)
            memcpy(grid + ((gy * (size_t)size + (size_t)y) * cols + gx + (size_t)f) * row,
                   rgb + ((size_t)f * (size_t)size + (size_t)y) * row, row);
}

static int run_eval(eval_opts *o) {
    char model_buf[3072];
    if (!cli_model(o->cmd, o->model, model_buf, sizeof model_buf)) return 1;
    if (isnan(o->cfg)) { /* clips: the model's own default guidance (its difflet.json) */
        const dl_model_entry *e;
        dl_model_defaults md;
        if (dl_registry_lookup(model_buf, &e) != DL_OK) {
            fprintf(stderr, "difflet: %s: %s\n", o->cmd, dl_last_error());
            return 1;
        }
        dl_registry_defaults(e, model_buf, &md);
        o->cfg = md.guidance;
    }
    char path[4096];
    if (o->prompts_file) snprintf(path, sizeof path, "%s", o->prompts_file);
    else snprintf(path, sizeof path, "%s/eval_prompts.json", model_buf);
    cJSON *root;
    if (dl_json_read_object(path, NULL, &root) != DL_OK) {
        fprintf(stderr, "difflet: %s\n", dl_last_error());
        return 1;
    }
    palette pal;
    const cJSON *prompts = cJSON_GetObjectItemCaseSensitive(root, "prompts"), *fj = cJSON_GetObjectItemCaseSensitive(root, "frames");
    int size = load_palette(root, &pal);
    int nf = o->video ? (cJSON_IsNumber(fj) && fj->valuedouble >= 2 && fj->valuedouble < MAXF ? (int)fj->valuedouble : 0) : 1;
    if (!cJSON_IsArray(prompts) || !size || !nf || pal.nc < 2 || (!o->video && pal.np < 1)) {
        fprintf(stderr, "difflet: %s: not an evaluation prompt file for %s\n", path, o->video ? "clips" : "pictures");
        cJSON_Delete(root);
        return 1;
    }
    int np = o->nprompts < cJSON_GetArraySize(prompts) ? o->nprompts : cJSON_GetArraySize(prompts);
    dl_gen_shape shape = {.frames = nf, .width = size, .height = size, .dt = o->dt, .quant = o->quant};
    dl_pipeline *p;
    if (dl_pipeline_load(&p, model_buf, &shape) != DL_OK) {
        fprintf(stderr, "difflet: %s\n", dl_last_error());
        cJSON_Delete(root);
        return 1;
    }
    const size_t clip = (size_t)nf * (size_t)size * (size_t)size * 3;
    uint8_t *rgb = malloc(clip);
    const size_t grid_n = nf > 1 ? (size_t)np * clip : (size_t)(size * size * 3) * 12 * (size_t)((np + 11) / 12);
    uint8_t *grid = o->save ? calloc(grid_n, 1) : NULL;
    int ok[3] = {0}, rc = 0;
    const char *third = o->video ? "motion" : "position";
    cJSON *rows = cJSON_CreateArray();
    printf("%-64s %-14s %-14s %-16s\n", "prompt", "background", "shape colour", third);
    double t0 = dl_now();
    for (int i = 0; i < np && rgb && (grid || !o->save); i++) {
        const cJSON *pr = cJSON_GetArrayItem(prompts, i);
        const char *cap = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(pr, "caption"));
        int want[3] = {index_of(pal.cname, pal.nc, cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(pr, "background"))),
                       index_of(pal.cname, pal.nc, cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(pr, "colour"))),
                       o->video ? motion_index(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(pr, "motion")))
                                : index_of(pal.pname, pal.np, cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(pr, "position")))};
        dl_gen_request r = {.prompt = cap ? cap : "", .negative_prompt = o->negative ? o->negative : "", .steps = o->steps, .seed = (uint64_t)(1000 + i)};
        if (o->video) r.guidance = o->cfg;
        else r.true_cfg = o->cfg;
        if (dl_pipeline_generate_rgb(p, &r, rgb, NULL) != DL_OK) {
            fprintf(stderr, "difflet: %s\n", dl_last_error());
            rc = 1;
            break;
        }
        reading rd;
        read_output(&pal, rgb, nf, size, &rd);
        int third_got = -1;
        if (o->video) third_got = rd.fg < 0 ? -1 : read_motion(&rd);
        else if (rd.fg >= 0) third_got = nearest_position(&pal, rd.cx[0], rd.cy[0]);
        int got[3] = {rd.bg, rd.fg, third_got};
        const char *names[3] = {got[0] >= 0 ? pal.cname[got[0]] : "-", got[1] >= 0 ? pal.cname[got[1]] : "-",
                                got[2] < 0 ? "-" : o->video ? (got[2] == ERRATIC ? "back and forth" : k_motions[got[2]]) : pal.pname[got[2]]};
        char cell[3][40];
        for (int k = 0; k < 3; k++) {
            ok[k] += got[k] == want[k] && want[k] >= 0;
            snprintf(cell[k], sizeof cell[k], "%s%s", got[k] == want[k] && want[k] >= 0 ? "" : "x ", names[k]);
        }
        printf("%-64.64s %-14s %-14s %-16s\n", cap ? cap : "", cell[0], cell[1], cell[2]);
        cJSON *row = cJSON_CreateObject();
        cJSON_AddStringToObject(row, "prompt", cap ? cap : "");
        cJSON_AddBoolToObject(row, "background", got[0] == want[0]);
        cJSON_AddBoolToObject(row, "shape_colour", got[1] == want[1]);
        cJSON_AddBoolToObject(row, third, got[2] == want[2]);
        cJSON_AddStringToObject(row, "background_read", names[0]);
        cJSON_AddStringToObject(row, "shape_colour_read", names[1]);
        cJSON_AddStringToObject(row, o->video ? "motion_read" : "position_read", names[2]);
        cJSON_AddItemToArray(rows, row);
        if (grid) grid_put(grid, rgb, i, nf, size);
    }
    if (!rgb || (o->save && !grid)) {
        fprintf(stderr, "difflet: %s: out of memory\n", o->cmd);
        rc = 1;
    }
    if (rc == 0) {
        float fr[3] = {(float)ok[0] / np, (float)ok[1] / np, (float)ok[2] / np};
        printf("\n%d %s, %d steps, %s %.1f, %.1f s: background %.0f%%, shape colour %.0f%%, %s %.0f%%\n", np,
               o->prompts_file ? "prompts" : "held-out prompts", o->steps, o->video ? "guidance" : "true CFG", o->cfg, dl_now() - t0, 100 * fr[0], 100 * fr[1], third, 100 * fr[2]);
        if (fr[0] < o->min[0] || fr[1] < o->min[1] || fr[2] < o->min[2]) {
            printf("below the thresholds (background %.0f%%, shape colour %.0f%%, %s %.0f%%)\n", 100 * o->min[0],
                   100 * o->min[1], third, 100 * o->min[2]);
            rc = 1;
        }
        if (o->json_path) {
            cJSON *j = cJSON_CreateObject();
            cJSON_AddNumberToObject(j, "prompts", np);
            cJSON_AddNumberToObject(j, "steps", o->steps);
            cJSON_AddNumberToObject(j, o->video ? "guidance_scale" : "true_cfg_scale", o->cfg);
            cJSON_AddNumberToObject(j, "background", fr[0]);
            cJSON_AddNumberToObject(j, "shape_colour", fr[1]);
            cJSON_AddNumberToObject(j, third, fr[2]);
            cJSON_AddItemToObject(j, "rows", rows);
            rows = NULL;
            char *t = cJSON_Print(j);
            if (t) dl_file_write_atomic(o->json_path, t, strlen(t));
            free(t);
            cJSON_Delete(j);
        }
        if (grid) {
            int gw = nf > 1 ? nf * size : 12 * size, gh = nf > 1 ? np * size : (np + 11) / 12 * size;
            if (dl_png_write(o->save, grid, gw, gh) != DL_OK) fprintf(stderr, "difflet: %s\n", dl_last_error());
        }
    }
    cJSON_Delete(rows);
    free(rgb), free(grid);
    dl_pipeline_free(p);
    cJSON_Delete(root);
    return rc;
}

int cli_eval_tiny(int argc, char **argv) {
    eval_opts o = {.cmd = "eval-tiny", .model = DIFFLET_SOURCE_DIR "/models/difflet-tiny", .nprompts = 96, .steps = 20,
                   .cfg = 3.f, .dt = DL_F32};
    return parse_opts(&o, argc, argv) ? run_eval(&o) : 2;
}

int cli_eval_tiny_video(int argc, char **argv) {
    eval_opts o = {.cmd = "eval-tiny-video", .model = DIFFLET_SOURCE_DIR "/models/difflet-tiny-video", .nprompts = 96,
                   .steps = 20, .cfg = NAN, .video = 1, .dt = DL_F32};
    return parse_opts(&o, argc, argv) ? run_eval(&o) : 2;
}
