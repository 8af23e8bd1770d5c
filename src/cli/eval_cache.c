/* `difflet calibrate` and `difflet eval-cache` (step caching, Difflet §5 / §7.5).
 *
 * calibrate: full-step generations record, per step, the probe score and the
 * relative L1 change of the denoiser output; a least-squares polynomial maps one to
 * the other (R² reported); with --skip-budget N, the accumulated threshold that skips
 * N steps on the calibration prompts is chosen by replaying the decisions.
 * eval-cache: per mode, denoiser calls, speed-up over `off` in wall time of the
 * denoising loop (the fastest of --repeat runs per prompt), PSNR and SSIM
 * against the uncached picture (mean and worst prompt), and the fewer-steps baseline
 * (no caching, as many steps as the mode made calls) on the same metrics. */
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

enum { MAXPROMPTS = 256, MAXSTEPS = 1000 };

static int read_prompts(const char *path, char **out, int max) {
    char *txt;
    size_t len;
    if (dl_file_read(path, 1 << 20, &txt, &len) != DL_OK) {
        fprintf(stderr, "difflet: %s\n", dl_last_error());
        return -1;
    }
    int n = 0;
    for (char *line = strtok(txt, "\n"); line && n < max; line = strtok(NULL, "\n"))
        if (*line && *line != '#') out[n++] = strdup(line);
    free(txt);
    if (!n) fprintf(stderr, "difflet: %s: no prompts (one per line)\n", path);
    return n;
}

static double psnr(const uint8_t *a, const uint8_t *b, int64_t n) {
    double se = 0;
    for (int64_t i = 0; i < n; i++) se += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    return se == 0 ? 99.0 : 10.0 * log10(255.0 * 255.0 / (se / (double)n));
}

/* SSIM of the luminance over 8x8 windows, stride 4 */
static double ssim(const uint8_t *a, const uint8_t *b, int w, int h) {
    const double c1 = 6.5025, c2 = 58.5225;
    double total = 0;
    int count = 0;
    for (int y = 0; y + 8 <= h; y += 4)
        for (int x = 0; x + 8 <= w; x += 4) {
            double ma = 0, mb = 0, va = 0, vb = 0, cov = 0;
            for (int j = 0; j < 8; j++)
                for (int i = 0; i < 8; i++) {
                    const uint8_t *pa = a + ((y + j) * w + x + i) * 3, *pb = b + ((y + j) * w + x + i) * 3;
                    double la = 0.299 * pa[0] + 0.587 * pa[1] + 0.114 * pa[2];
                    double lb = 0.299 * pb[0] + 0.587 * pb[1] + 0.114 * pb[2];
                    ma += la, mb += lb, va += la * la, vb += lb * lb, cov += la * lb;
                }
            ma /= 64, mb /= 64;
            va = va / 64 - ma * ma, vb = vb / 64 - mb * mb, cov = cov / 64 - ma * mb;
            total += ((2 * ma * mb + c1) * (2 * cov + c2)) / ((ma * ma + mb * mb + c1) * (va + vb + c2));
            count++;
        }
    return count ? total / count : 1.0;
}

typedef struct {
    double score[MAXSTEPS][2], change[MAXSTEPS][2];
    int steps;
} trace;

static void on_probe(void *ctx, int step, int branch, double probe, double change) {
    trace *t = ctx;
    if (step < MAXSTEPS) t->score[step][branch] = probe, t->change[step][branch] = change;
}

/* least squares: y ~ poly(x) of degree d, coefficients highest first */
static int polyfit(const double *x, const double *y, int n, int d, double *coef, double *r2) {
    double A[8][9] = {{0}};
    int m = d + 1;
    for (int k = 0; k < n; k++) {
        double p[8];
        p[0] = 1;
        for (int j = 1; j < m; j++) p[j] = p[j - 1] * x[k];
        for (int i = 0; i < m; i++) {
            for (int j = 0; j < m; j++) A[i][j] += p[i] * p[j];
            A[i][m] += p[i] * y[k];
        }
    }
    for (int c = 0; c < m; c++) { /* Gauss-Jordan with partial pivoting */
        int piv = c;
        for (int r = c + 1; r < m; r++)
            if (fabs(A[r][c]) > fabs(A[piv][c])) piv = r;
        if (fabs(A[piv][c]) < 1e-300) return 0;
        for (int j = 0; j <= m; j++) {
            double t = A[c][j];
            A[c][j] = A[piv][j];
            A[piv][j] = t;
        }
        for (int r = 0; r < m; r++) {
            if (r == c) continue;
            double f = A[r][c] / A[c][c];
            for (int j = c; j <= m; j++) A[r][j] -= f * A[c][j];
        }
    }
    for (int i = 0; i < m; i++) coef[d - i] = A[i][m] / A[i][i]; /* lowest-order solution -> highest first */
    double mean = 0, ssr = 0, sst = 0;
    for (int k = 0; k < n; k++) mean += y[k];
    mean /= n;
    for (int k = 0; k < n; k++) {
        double f = 0;
        for (int j = 0; j <= d; j++) f = f * x[k] + coef[j];
        ssr += (y[k] - f) * (y[k] - f);
        sst += (y[k] - mean) * (y[k] - mean);
    }
    *r2 = sst > 0 ? 1 - ssr / sst : 1;
    return 1;
}

/* mean steps the accumulated-threshold rule skips over the recorded score traces */
static double skipped_at(dl_stepcache_config *c, double thr, const trace *tr, int np, int steps) {
    double skipped = 0;
    c->threshold = (float)thr;
    for (int i = 0; i < np; i++) {
        float pv[1], dv[1];
        dl_stepcache_state st = {.prev = pv, .delta = dv, .n = 1};
        dl_stepcache_reset(&st);
        st.have_prev = st.have_delta = 1;
        for (int s = 0; s < steps; s++) skipped += dl_stepcache_decide(c, &st, s, steps, tr[i].score[s][0]);
    }
    return skipped / np;
}

static dl_pipeline *open_model(const char *model, int w, int h, int frames) {
    dl_gen_shape shape = {.frames = frames, .width = w, .height = h, .dt = DL_F32};
    dl_pipeline *p;
    if (dl_pipeline_load(&p, model, &shape) != DL_OK) {
        fprintf(stderr, "difflet: %s\n", dl_last_error());
        return NULL;
    }
    return p;
}

/* shared options */
typedef struct {
    const char *model, *prompts, *out, *json, *modes;
    int steps, degree, budget, w, h, frames, keep_a, keep_b, repeat;
    float cfg, guidance; /* --true-cfg (FLUX), --guidance (the model's default when not given) */
    int guidance_cfg;    /* the model runs CFG when guidance > 1 (Wan) */
} opts;

/* CFG branches per step, by the model's rule */
static int branches(const opts *o) { return 1 + (o->guidance_cfg ? o->guidance > 1.f : o->cfg > 1.f); }

/* prompt i's request (seed i) with caching c; the empty negative prompt when CFG runs */
static dl_gen_request request(const opts *o, const char *prompt, int i, const dl_stepcache_config *c) {
    return (dl_gen_request){.prompt = prompt, .negative_prompt = branches(o) > 1 ? "" : NULL, .steps = o->steps,
                            .true_cfg = o->cfg, .guidance = o->guidance, .seed = (uint64_t)i, .cache = c};
}

static int parse_opts(int argc, char **argv, opts *o, const char *cmd) {
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "difflet: %s: %s needs a value\n", cmd, a);
            return 0;
        }
        i++;
        if (!strcmp(a, "--model")) o->model = v;
        else if (!strcmp(a, "--prompts")) o->prompts = v;
        else if (!strcmp(a, "-o") || !strcmp(a, "--output")) o->out = v;
        else if (!strcmp(a, "--json")) o->json = v;
        else if (!strcmp(a, "--modes")) o->modes = v;
        else if (!strcmp(a, "--steps")) o->steps = atoi(v);
        else if (!strcmp(a, "--repeat")) o->repeat = atoi(v);
        else if (!strcmp(a, "--degree")) o->degree = atoi(v);
        else if (!strcmp(a, "--skip-budget")) o->budget = atoi(v);
        else if (!strcmp(a, "--true-cfg")) o->cfg = strtof(v, NULL);
        else if (!strcmp(a, "--guidance")) o->guidance = strtof(v, NULL);
        else if (!strcmp(a, "--frames")) o->frames = atoi(v);
        else if (!strcmp(a, "--keep")) sscanf(v, "%d,%d", &o->keep_a, &o->keep_b);
        else if (!strcmp(a, "--size")) {
            char x;
            if (sscanf(v, "%d%c%d", &o->w, &x, &o->h) != 3) {
                fprintf(stderr, "difflet: %s: --size %s: expected WxH\n", cmd, v);
                return 0;
            }
        } else {
            fprintf(stderr, "difflet: %s: unknown option '%s'\n", cmd, a);
            return 0;
        }
    }
    if (!o->model) o->model = DIFFLET_SOURCE_DIR "/models/difflet-tiny";
    static char model_buf[4096];
    if (!cli_model(cmd, o->model, model_buf, sizeof model_buf)) return 0;
    o->model = model_buf;
    const dl_model_entry *e;
    if (dl_registry_lookup(o->model, &e) != DL_OK) {
        fprintf(stderr, "difflet: %s: %s\n", cmd, dl_last_error());
        return 0;
    }
    int dw, dh, df;
    dl_registry_default_shape(e, o->model, &dw, &dh, &df);
    if (!o->w) o->w = dw, o->h = dh;
    if (!o->frames) o->frames = df;
    dl_model_defaults md;
    dl_registry_defaults(e, o->model, &md);
    if (isnan(o->guidance)) o->guidance = md.guidance;
    o->guidance_cfg = e->guidance_cfg;
    if (o->frames < 1 || o->frames > 10000 || (e->output == DL_MEDIA_IMAGE && o->frames != 1)) {
        fprintf(stderr, "difflet: %s: --frames %d (%s)\n", cmd, o->frames,
                e->output == DL_MEDIA_IMAGE ? "the model makes images: 1" : "1..10000");
        return 0;
    }
    if (!o->prompts || o->steps <= 0 || o->steps > MAXSTEPS || o->degree < 1 || o->degree > 7) {
        fprintf(stderr, "difflet: %s: needs --prompts FILE, --steps in 1..%d, --degree in 1..7\n", cmd, MAXSTEPS);
        return 0;
    }
    return 1;
}

int cli_calibrate(int argc, char **argv) {
    opts o = {.steps = 50, .degree = 4, .cfg = 1.f, .guidance = NAN, .keep_a = 5, .keep_b = 5, .out = "calibration.json"};
    if (!parse_opts(argc, argv, &o, "calibrate")) return 2;
    char *prompts[MAXPROMPTS];
    int np = read_prompts(o.prompts, prompts, MAXPROMPTS);
    if (np <= 0) return 1;
    dl_pipeline *p = open_model(o.model, o.w, o.h, o.frames);
    if (!p) return 1;
    trace *tr = calloc((size_t)np, sizeof *tr);
    double *xs = malloc((size_t)(np * o.steps * 2) * sizeof *xs), *ys = malloc((size_t)(np * o.steps * 2) * sizeof *ys);
    int n = 0, rc = 1;
    dl_stepcache_config off;
    dl_stepcache_parse("off", &off);
    uint8_t *rgb = malloc((size_t)o.w * (size_t)o.h * 3 * (size_t)o.frames);
    for (int i = 0; i < np; i++) {
        dl_gen_request r = request(&o, prompts[i], i, &off);
        r.on_probe = on_probe, r.ctx = &tr[i];
        if (dl_pipeline_generate_rgb(p, &r, rgb, NULL) != DL_OK) {
            fprintf(stderr, "difflet: %s\n", dl_last_error());
            goto done;
        }
        for (int s = 1; s < o.steps; s++)
            for (int b = 0; b < branches(&o); b++) xs[n] = tr[i].score[s][b], ys[n] = tr[i].change[s][b], n++;
        fprintf(stderr, "  calibration prompt %d/%d\n", i + 1, np);
    }
    dl_stepcache_config c = {.mode = DL_STEPCACHE_CALIBRATED, .keep_first = o.keep_a, .keep_last = o.keep_b,
                             .ncoef = o.degree + 1, .accumulate = 1};
    double r2;
    if (!polyfit(xs, ys, n, o.degree, c.coef, &r2)) {
        fprintf(stderr, "difflet: calibrate: the fit is singular (too few distinct samples)\n");
        goto done;
    }
    /* threshold: the smallest that skips `budget` steps on average, replayed on the
     * recorded scores (doubling to bracket it, then bisection) */
    double thr = 0;
    if (o.budget > 0) {
        double lo = 0, hi = 1e-3;
        int found = 0;
        for (int it = 0; it < 60 && !found; it++, hi *= 2) found = skipped_at(&c, hi, tr, np, o.steps) >= o.budget;
        hi /= 2;
        if (!found) {
            fprintf(stderr, "difflet: calibrate: no threshold skips %d of %d steps (keep %d+%d)\n", o.budget, o.steps,
                    o.keep_a, o.keep_b);
            goto done;
        }
        for (int it = 0; it < 50; it++) {
            double mid = (lo + hi) / 2;
            if (skipped_at(&c, mid, tr, np, o.steps) >= o.budget) hi = mid;
            else lo = mid;
        }
        thr = hi;
    }
    printf("calibration: %d samples from %d prompts x %d steps, degree %d, R^2 = %.4f", n, np, o.steps, o.degree, r2);
    if (o.budget > 0) printf(", threshold %.4g skips %d steps", thr, o.budget);
    printf("\n");
    cJSON *j = cJSON_CreateObject(), *co = cJSON_AddArrayToObject(j, "coefficients");
    for (int i = 0; i <= o.degree; i++) cJSON_AddItemToArray(co, cJSON_CreateNumber(c.coef[i]));
    cJSON_AddNumberToObject(j, "degree", o.degree);
    cJSON_AddNumberToObject(j, "r2", r2);
    cJSON_AddBoolToObject(j, "accumulate", 1);
    if (thr > 0) cJSON_AddNumberToObject(j, "threshold", thr);
    cJSON_AddNumberToObject(j, "samples", n);
    cJSON_AddNumberToObject(j, "steps", o.steps);
    cJSON_AddStringToObject(j, "model", o.model);
    char *t = cJSON_Print(j);
    if (t && dl_file_write_atomic(o.out, t, strlen(t)) == DL_OK) {
        printf("wrote %s\n", o.out);
        rc = 0;
    } else {
        fprintf(stderr, "difflet: %s\n", dl_last_error());
    }
    free(t);
    cJSON_Delete(j);
done:
    for (int i = 0; i < np; i++) free(prompts[i]);
    free(tr), free(xs), free(ys), free(rgb);
    dl_pipeline_free(p);
    return rc;
}

int cli_eval_cache(int argc, char **argv) {
    opts o = {.repeat = 3, .steps = 50, .degree = 4, .cfg = 1.f, .guidance = NAN, .keep_a = 5, .keep_b = 5,
              .modes = "cadence:2,online-delta:0.6"};
    if (!parse_opts(argc, argv, &o, "eval-cache")) return 2;
    if (o.repeat < 1 || o.repeat > 100) {
        fprintf(stderr, "difflet: eval-cache: --repeat must be 1..100\n");
        return 2;
    }
    char *prompts[MAXPROMPTS], *modes[16], mbuf[2048];
    int np = read_prompts(o.prompts, prompts, MAXPROMPTS), nm = 0;
    if (np <= 0) return 1;
    snprintf(mbuf, sizeof mbuf, "%s", o.modes);
    for (char *m = strtok(mbuf, ","); m && nm < 16; m = strtok(NULL, ",")) modes[nm++] = m;
    dl_stepcache_config cfgs[16];
    for (int k = 0; k < nm; k++)
        if (dl_stepcache_parse(modes[k], &cfgs[k]) != DL_OK) {
            fprintf(stderr, "difflet: eval-cache: mode %s: %s\n", modes[k], dl_last_error());
            return 2;
        } else {
            cfgs[k].keep_first = o.keep_a, cfgs[k].keep_last = o.keep_b;
        }
    dl_pipeline *p = open_model(o.model, o.w, o.h, o.frames);
    if (!p) return 1;
    size_t isz = (size_t)o.w * (size_t)o.h * 3 * (size_t)o.frames; /* frames stacked: one image o.h * frames tall */
    uint8_t *ref = malloc(isz * (size_t)np), *img = malloc(isz), *few = malloc(isz);
    double t_off = 0, full_call = 0, calls_off = 0;
    int rc = 0;
    dl_stepcache_config off;
    dl_stepcache_parse("off", &off);
    for (int i = 0; i < np && !rc; i++) { /* uncached references */
        dl_gen_request r = request(&o, prompts[i], i, &off);
        dl_gen_timing tm;
        if (dl_pipeline_generate_rgb(p, &r, ref + isz * (size_t)i, &tm) != DL_OK) rc = 1;
        double best = tm.denoise_s;
        for (int k = 1; k < o.repeat && !rc; k++) /* the fastest of --repeat runs: less noise */
            if (dl_pipeline_generate_rgb(p, &r, img, &tm) != DL_OK) rc = 1;
            else best = fmin(best, tm.denoise_s);
        t_off += best;
        full_call += best;
        calls_off += tm.denoiser_calls;
    }
    full_call /= calls_off;
    printf("%d prompts, %d steps, keep %d+%d, %dx%d: a full denoiser call takes %.4f s\n\n", np, o.steps, o.keep_a,
           o.keep_b, o.w, o.h, full_call);
    printf("%-32s %6s %8s %16s %16s %16s %16s %8s\n", "mode", "calls", "speedup", "PSNR mean/worst", "SSIM mean/worst",
           "fewer-steps PSNR", "fewer-steps SSIM", "gain dB");
    cJSON *jr = cJSON_CreateArray();
    for (int k = 0; k < nm && !rc; k++) {
        double t_mode = 0, calls = 0, ps = 0, pw = 99, ss = 0, sw = 1, fps = 0, fpw = 99, fss = 0, fsw = 1;
        double cached_s = 0, probe_s = 0, ncached = 0, nprobe = 0;
        for (int i = 0; i < np && !rc; i++) {
            dl_gen_request r = request(&o, prompts[i], i, &cfgs[k]);
            dl_gen_timing tm, tk;
            if (dl_pipeline_generate_rgb(p, &r, img, &tm) != DL_OK) {
                rc = 1;
                break;
            }
            double best = tm.denoise_s, best_probe = tm.probe_s, best_cached = tm.cached_s;
            for (int k2 = 1; k2 < o.repeat; k2++) /* times from the fastest run, as the uncached reference's */
                if (dl_pipeline_generate_rgb(p, &r, few, &tk) == DL_OK && tk.denoise_s < best)
                    best = tk.denoise_s, best_probe = tk.probe_s, best_cached = tk.cached_s;
            t_mode += best;
            int c = tm.denoiser_calls / branches(&o);
            calls += c;
            cached_s += best_cached, ncached += tm.cached_steps, probe_s += best_probe;
            nprobe += tm.probe_s > 0 ? o.steps * branches(&o) : 0;
            double a = psnr(img, ref + isz * (size_t)i, (int64_t)isz), b = ssim(img, ref + isz * (size_t)i, o.w, o.h * o.frames);
            ps += a, pw = fmin(pw, a), ss += b, sw = fmin(sw, b);
            r.steps = c, r.cache = &off; /* the fewer-steps baseline: as many steps as calls */
            if (dl_pipeline_generate_rgb(p, &r, few, NULL) != DL_OK) {
                rc = 1;
                break;
            }
            a = psnr(few, ref + isz * (size_t)i, (int64_t)isz), b = ssim(few, ref + isz * (size_t)i, o.w, o.h * o.frames);
            fps += a, fpw = fmin(fpw, a), fss += b, fsw = fmin(fsw, b);
        }
        if (rc) break;
        calls /= np, ps /= np, ss /= np, fps /= np, fss /= np;
        printf("%-32.32s %6.1f %7.2fx %7.1f / %6.1f %7.3f / %6.3f %7.1f / %6.1f %7.3f / %6.3f %+7.1f\n", modes[k], calls,
               t_off / t_mode, ps, pw, ss, sw, fps, fpw, fss, fsw, ps - fps);
        double cached_frac = ncached ? cached_s / ncached / full_call : 0, probe_frac = nprobe ? probe_s / nprobe / full_call : 0;
        if (ncached) printf("%-32s a cached step costs %.3f%% of a full step\n", "", 100 * cached_frac);
        if (nprobe) printf("%-32s the probe costs %.2f%% of a full step\n", "", 100 * probe_frac);
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "mode", modes[k]);
        cJSON_AddNumberToObject(e, "calls", calls);
        cJSON_AddNumberToObject(e, "speedup", t_off / t_mode);
        cJSON_AddNumberToObject(e, "psnr_mean", ps);
        cJSON_AddNumberToObject(e, "psnr_worst", pw);
        cJSON_AddNumberToObject(e, "ssim_mean", ss);
        cJSON_AddNumberToObject(e, "ssim_worst", sw);
        cJSON_AddNumberToObject(e, "fewer_steps_psnr_mean", fps);
        cJSON_AddNumberToObject(e, "fewer_steps_psnr_worst", fpw);
        cJSON_AddNumberToObject(e, "fewer_steps_ssim_mean", fss);
        cJSON_AddNumberToObject(e, "cached_step_fraction", cached_frac);
        cJSON_AddNumberToObject(e, "probe_fraction", probe_frac);
        cJSON_AddItemToArray(jr, e);
    }
    if (!rc && o.json) {
        char *t = cJSON_Print(jr);
        if (t) dl_file_write_atomic(o.json, t, strlen(t));
        free(t);
    }
    cJSON_Delete(jr);
    for (int i = 0; i < np; i++) free(prompts[i]);
    free(ref), free(img), free(few);
    dl_pipeline_free(p);
    return rc;
}
