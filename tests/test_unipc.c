/* UniPCMultistepScheduler against diffusers (tests/data/sched/unipc.{json,safetensors},
 * tools/parity/make_unipc_vectors.py): Wan 2.1's scheduler config and variants of it
 * (flow_shift, solver orders 1-3, bh1/bh2, final sigma zero/sigma_min,
 * lower_order_final, disable_corrector, shift_terminal) at 1 to 50 steps.
 *
 * - timesteps and sigmas: bit-identical.
 * - samples after every step, with torch's own logarithms (the values the vectors
 *   recorded, substituted through dl_unipc_state_set_log): bit-identical, every
 *   element of every step. This checks all the rest of the arithmetic to the bit.
 * - the same with difflet's own, correctly rounded logarithm: torch's is MKL's vsLn
 *   (proprietary, chosen by CPU; CUDA and non-MKL builds of torch round differently
 *   again), which rounds 20 of the 304 arguments here the other way. A lambda then
 *   moves by an ulp of log (< 1e-7 absolute), h and rk = (lambda_i - lambda_s0) / h by
 *   about 1e-6 relative, and the samples by what the update makes of that: allowed
 *   1e-6 of the step's largest |sample| for orders 1 and 2 (measured: 7.8e-7 at 50
 *   steps, i.e. a few ulps of it), 2e-5 for order 3, whose rhos solve a Vandermonde
 *   system in the rks that amplifies their error about tenfold (measured 1.4e-5 at 50
 *   steps). These vectors are the worst case: their random model outputs make
 *   D1 = (m_i - m0) / rk of order 1 where a real model's are of order h. A mistake in
 *   the update itself (a wrong sigma, order or coefficient) moves samples by 1e-3 or
 *   more, and the torch-log run above catches any single rounding.
 * - the OpenMP path (n >= 65536) gives the same bits as the serial one; reset; steps
 *   out of order refused.
 * - configs outside the scope refused, with messages naming the options. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "difflet/unipc.h"
#include "test_util.h"

#define REL_TOL 1e-6        /* own logarithm, solver orders 1 and 2 (see above) */
#define REL_TOL_ORDER3 2e-5 /* own logarithm, solver order 3 */

typedef struct {
    const float *x, *y; /* log_x sorted by bits (the script sorts them), log_y */
    int n, missing;
} log_table;

static uint32_t fbits(float f) {
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    return b;
}

/* torch.log's recorded value for x (NaN, and a note, if the vectors lack it) */
static float torch_log(float x, void *ctx) {
    log_table *t = ctx;
    int32_t key = (int32_t)fbits(x);
    int lo = 0, hi = t->n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        int32_t k = (int32_t)fbits(t->x[mid]);
        if (k == key) return t->y[mid];
        if (k < key) lo = mid + 1;
        else hi = mid - 1;
    }
    t->missing++;
    return NAN;
}

static double ulps(float a, float b) {
    if (fbits(a) == fbits(b)) return 0;
    if (isnan(a) || isnan(b)) return INFINITY;
    float m = fmaxf(fabsf(a), fabsf(b));
    return fabs((double)a - (double)b) / (double)(nextafterf(m, INFINITY) - m);
}

static float *read_f32(const dl_checkpoint *ck, const char *name, int64_t numel) {
    const dl_st_tensor *t = dl_ckpt_find(ck, name);
    CHECK(t && t->numel == numel, "tensor %s with %lld elements", name, (long long)numel);
    if (!t || t->numel != numel) return NULL;
    float *p = malloc((size_t)numel * sizeof *p);
    CHECK(dl_ckpt_read(t, DL_F32, p) == DL_OK, "%s: %s", name, dl_last_error());
    return p;
}

/* Runs `steps` steps over `reps` copies of the n-element latent; the samples after
 * every step, [steps, reps * n], in `out`. */
static dl_status run(const dl_unipc *u, int steps, const float *latent0, const float *outs, int64_t n, int reps,
                     log_table *logs, float *out) {
    dl_unipc_state *st;
    dl_status s = dl_unipc_state_new(&st, u, steps, n * reps);
    if (s != DL_OK) return s;
    if (logs) dl_unipc_state_set_log(st, torch_log, logs);
    int64_t m = n * reps;
    float *x = malloc((size_t)m * sizeof *x), *mo = malloc((size_t)m * sizeof *mo);
    for (int64_t r = 0; r < reps; r++) memcpy(x + r * n, latent0, (size_t)n * sizeof *x);
    for (int i = 0; i < steps && s == DL_OK; i++) {
        for (int64_t r = 0; r < reps; r++) memcpy(mo + r * n, outs + (int64_t)i * n, (size_t)n * sizeof *mo);
        s = dl_unipc_step(st, i, mo, x);
        memcpy(out + (int64_t)i * m, x, (size_t)m * sizeof *x);
    }
    free(x);
    free(mo);
    dl_unipc_state_free(st);
    return s;
}

int main(void) {
    cJSON *root = NULL;
    dl_checkpoint *ck = NULL;
    CHECK(dl_json_read_object(DATA_DIR "/sched/unipc.json", NULL, &root) == DL_OK, "vectors: %s", dl_last_error());
    CHECK(dl_ckpt_open(&ck, DATA_DIR "/sched/unipc.safetensors", NULL) == DL_OK, "vectors: %s", dl_last_error());
    if (!root || !ck) return test_done("test_unipc");
    const int64_t n = (int64_t)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(root, "n"));
    const cJSON *base = cJSON_GetObjectItemCaseSensitive(root, "base");
    const dl_st_tensor *lx = dl_ckpt_find(ck, "log_x");
    CHECK(lx != NULL, "log table");
    if (!lx) return test_done("test_unipc");
    log_table logs = {.n = (int)lx->numel};
    float *latent0 = read_f32(ck, "latent0", n), *outs = read_f32(ck, "model_outputs", 50 * n);
    float *lxv = read_f32(ck, "log_x", logs.n), *lyv = read_f32(ck, "log_y", logs.n);
    logs.x = lxv, logs.y = lyv;
    float *got = malloc((size_t)50 * (size_t)n * sizeof *got), *want = malloc((size_t)50 * (size_t)n * sizeof *want);

    int ncase = 0, nref = 0, exact_torchlog = 0, exact_own = 0, nsamples = 0, big = 0;
    double worst_ulp = 0, worst_rel = 0, worst_rel3 = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(root, "cases")) {
        cJSON *cfg = cJSON_Duplicate(base, 1);
        const cJSON *kv;
        cJSON_ArrayForEach(kv, cJSON_GetObjectItemCaseSensitive(c, "change")) {
            cJSON_DeleteItemFromObjectCaseSensitive(cfg, kv->string);
            cJSON_AddItemToObject(cfg, kv->string, cJSON_Duplicate(kv, 1));
        }
        int steps = (int)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(c, "steps"));
        char *desc = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(c, "change"));
        dl_unipc u;
        dl_status s = dl_unipc_from_json(cfg, "scheduler_config.json", &u);
        const cJSON *refused = cJSON_GetObjectItemCaseSensitive(c, "refused");
        if (refused) {
            float ts[64], sg[65];
            if (s == DL_OK) s = dl_unipc_schedule(&u, steps, ts, sg);
            if (s == DL_OK) {
                dl_unipc_state *st;
                if ((s = dl_unipc_state_new(&st, &u, steps, n)) == DL_OK) dl_unipc_state_free(st);
            }
            CHECK(s == DL_ERR_UNSUPPORTED || s == DL_ERR_FORMAT, "%s, %d steps: refused (status %d)", desc, steps, (int)s);
            const cJSON *name;
            cJSON_ArrayForEach(name, refused)
                CHECK(strstr(dl_last_error(), name->valuestring), "%s: the message names %s: %s", desc, name->valuestring,
                      dl_last_error());
            CHECK(strstr(dl_last_error(), "UniPCMultistepScheduler") || strstr(dl_last_error(), "scheduler "),
                  "%s: the message names the scheduler: %s", desc, dl_last_error());
            nref++;
            free(desc);
            cJSON_Delete(cfg);
            continue;
        }
        CHECK(s == DL_OK, "%s: %s", desc, dl_last_error());
        if (s != DL_OK) {
            free(desc);
            cJSON_Delete(cfg);
            continue;
        }
        /* the schedule */
        float ts[64], sg[65];
        CHECK(steps <= 50 && dl_unipc_schedule(&u, steps, ts, sg) == DL_OK, "%s: %s", desc, dl_last_error());
        const cJSON *wt = cJSON_GetObjectItemCaseSensitive(c, "timesteps"), *ws = cJSON_GetObjectItemCaseSensitive(c, "sigmas");
        CHECK(cJSON_GetArraySize(wt) == steps && cJSON_GetArraySize(ws) == steps + 1, "%s: schedule sizes", desc);
        for (int i = 0; i <= steps; i++) {
            if (i < steps)
                CHECK(ts[i] == (float)cJSON_GetArrayItem(wt, i)->valuedouble, "%s, %d steps: timestep %d: %.9g, diffusers %.9g",
                      desc, steps, i, ts[i], cJSON_GetArrayItem(wt, i)->valuedouble);
            float w = (float)cJSON_GetArrayItem(ws, i)->valuedouble;
            CHECK(fbits(sg[i]) == fbits(w), "%s, %d steps: sigma %d: %.9g, diffusers %.9g", desc, steps, i, sg[i], w);
        }
        /* the samples: with torch's logarithms to the bit, with our own within REL_TOL */
        const char *tname = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(c, "samples"));
        float *ref = read_f32(ck, tname, (int64_t)steps * n);
        if (!ref) {
            free(desc);
            cJSON_Delete(cfg);
            continue;
        }
        logs.missing = 0;
        CHECK(run(&u, steps, latent0, outs, n, 1, &logs, got) == DL_OK, "%s: %s", desc, dl_last_error());
        CHECK(logs.missing == 0, "%s: %d logarithms not in the vectors", desc, logs.missing);
        int64_t diff = 0, first = -1;
        for (int64_t k = 0; k < (int64_t)steps * n; k++)
            if (fbits(got[k]) != fbits(ref[k]) && diff++ == 0) first = k;
        CHECK(diff == 0, "%s, %d steps, torch's log: %lld of %lld samples differ, first at step %lld element %lld: %.9g, "
              "diffusers %.9g", desc, steps, (long long)diff, (long long)steps * n, (long long)(first / n),
              (long long)(first % n), first >= 0 ? got[first] : 0.0, first >= 0 ? ref[first] : 0.0);
        exact_torchlog += diff == 0;

        CHECK(run(&u, steps, latent0, outs, n, 1, NULL, want) == DL_OK, "%s: %s", desc, dl_last_error());
        int case_exact = 1;
        const double tol = u.solver_order <= 2 ? REL_TOL : REL_TOL_ORDER3;
        for (int i = 0; i < steps; i++) {
            float scale = 0;
            for (int64_t e = 0; e < n; e++) scale = fmaxf(scale, fabsf(ref[i * n + e]));
            for (int64_t e = 0; e < n; e++) {
                float a = want[i * n + e], b = ref[i * n + e];
                double rel = fabs((double)a - (double)b) / scale;
                if (u.solver_order <= 2) worst_rel = fmax(worst_rel, rel);
                else worst_rel3 = fmax(worst_rel3, rel);
                worst_ulp = fmax(worst_ulp, ulps(a, b));
                case_exact &= fbits(a) == fbits(b);
                CHECK(rel <= tol, "%s, %d steps, own log: step %d element %lld: %.9g, diffusers %.9g (%.3g of max |x|)",
                      desc, steps, i, (long long)e, a, b, rel);
            }
        }
        exact_own += case_exact;
        nsamples += steps;

        /* the parallel path (600 copies: 72,000 elements) gives the serial bits */
        if (steps == 50 || (steps == 10 && u.solver_order == 3)) {
            const int reps = 600;
            float *wide = malloc((size_t)steps * (size_t)(n * reps) * sizeof *wide);
            CHECK(run(&u, steps, latent0, outs, n, reps, &logs, wide) == DL_OK, "%s: %s", desc, dl_last_error());
            int64_t bad = 0;
            for (int i = 0; i < steps; i++)
                for (int64_t k = 0; k < n * reps; k++) bad += fbits(wide[(int64_t)i * n * reps + k]) != fbits(got[i * n + k % n]);
            CHECK(bad == 0, "%s, %d steps: %lld samples differ on the parallel path", desc, steps, (long long)bad);
            free(wide);
            big++;
        }
        free(ref);
        free(desc);
        cJSON_Delete(cfg);
        ncase++;
    }

    /* reset, and steps out of order */
    {
        dl_unipc u;
        CHECK(dl_unipc_from_json(base, "base", &u) == DL_OK, "%s", dl_last_error());
        dl_unipc_state *st;
        CHECK(dl_unipc_state_new(&st, &u, 4, n) == DL_OK, "%s", dl_last_error());
        float *x = malloc((size_t)n * sizeof *x);
        memcpy(x, latent0, (size_t)n * sizeof *x);
        CHECK(dl_unipc_step(st, 1, outs, x) == DL_ERR_INVALID && strstr(dl_last_error(), "step 0"), "out of order: %s",
              dl_last_error());
        for (int r = 0; r < 2; r++) {
            memcpy(x, latent0, (size_t)n * sizeof *x);
            for (int i = 0; i < 4; i++) CHECK(dl_unipc_step(st, i, outs + i * n, x) == DL_OK, "%s", dl_last_error());
            if (r == 0) memcpy(got, x, (size_t)n * sizeof *x);
            CHECK(dl_unipc_step(st, 4, outs, x) == DL_ERR_INVALID, "a fifth step of four is refused");
            dl_unipc_state_reset(st);
        }
        CHECK(!memcmp(got, x, (size_t)n * sizeof *x), "a reset run repeats the first");
        float sg[5];
        CHECK(dl_unipc_schedule(&u, 4, NULL, sg) == DL_OK && !memcmp(sg, dl_unipc_state_sigmas(st), sizeof sg), "sigmas");
        CHECK(dl_unipc_schedule(&u, 0, NULL, sg) == DL_ERR_INVALID, "0 steps refused");
        free(x);
        dl_unipc_state_free(st);
    }

    printf("unipc: %d runs (%d steps of %lld elements), bit-identical with torch's log: %d/%d runs; with the "
           "correctly rounded log: %d/%d runs bit-identical, worst %.3g of max |x| (orders 1-2), %.3g (order 3), "
           "%.3g ulp; %d runs on the parallel path; %d configs refused\n",
           ncase, nsamples, (long long)n, exact_torchlog, ncase, exact_own, ncase, worst_rel, worst_rel3, worst_ulp, big,
           nref);
    CHECK(ncase >= 60 && nref >= 20, "the vectors hold the cases (%d, %d refused)", ncase, nref);
    free(got);
    free(want);
    free(latent0);
    free(outs);
    free(lxv);
    free(lyv);
    dl_ckpt_free(ck);
    cJSON_Delete(root);
    return test_done("test_unipc");
}
