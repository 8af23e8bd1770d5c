/* FlowMatchEulerDiscreteScheduler's options against diffusers' own schedules
 * (tests/data/sched/flowmatch_options.json, tools/parity/make_flowmatch_vectors.py):
 * dynamic (exponential, linear) and static shifting, shift_terminal, Karras /
 * exponential / beta sigmas, inverted sigmas, at 1 to 50 steps. Plain schedules must
 * match to the bit; the float64 conversions (Karras, exponential, beta) to the bit or
 * one float32 ulp (libm and NumPy may round a pow/exp/log differently). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "difflet/pipeline.h"
#include "test_util.h"

static double ulps(float a, float b) {
    if (a == b) return 0;
    return fabs((double)a - (double)b) / (double)(nextafterf(fmaxf(fabsf(a), fabsf(b)), INFINITY) - fmaxf(fabsf(a), fabsf(b)));
}

int main(void) {
    cJSON *root;
    CHECK(dl_json_read_object(DATA_DIR "/sched/flowmatch_options.json", NULL, &root) == DL_OK, "vectors: %s", dl_last_error());
    if (!root) return test_done("test_flowmatch");
    const cJSON *c;
    int ncase = 0, exact = 0, refused = 0, ndefault = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(root, "cases")) {
        dl_flowmatch fm;
        const cJSON *cfg = cJSON_GetObjectItemCaseSensitive(c, "config");
        int steps = (int)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(c, "steps"));
        double mu = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(c, "mu"));
        const cJSON *want = cJSON_GetObjectItemCaseSensitive(c, "sigmas"), *wt = cJSON_GetObjectItemCaseSensitive(c, "timesteps");
        char *desc = cJSON_PrintUnformatted(cfg);
        CHECK(dl_flowmatch_from_json(cfg, "case", &fm) == DL_OK, "%s: %s", desc, dl_last_error());
        int dflt = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "default_sigmas"));
        float got[64];
        dl_status s;
        if (dflt) { /* set_timesteps(steps) with no custom sigmas (WanPipeline) */
            s = dl_flowmatch_sigmas_default(&fm, steps, got);
            ndefault++;
        } else { /* mu as the pipeline computes it */
            int64_t n = (int64_t)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(c, "image_seq_len"));
            CHECK(fabs(dl_flowmatch_mu(&fm, n) - mu) <= 1e-12 * fabs(mu) + 1e-15, "%s: mu %.17g, diffusers %.17g", desc,
                  dl_flowmatch_mu(&fm, n), mu);
            s = dl_flowmatch_sigmas(&fm, steps, mu, got);
        }
        int nan_ref = isnan(cJSON_GetArrayItem(want, 0)->valuedouble) || !cJSON_IsNumber(cJSON_GetArrayItem(want, 0));
        if (nan_ref) { /* diffusers divides by zero: refused here with the reason */
            CHECK(s == DL_ERR_INVALID && strstr(dl_last_error(), "shift_terminal"), "%s, %d steps: NaN schedule refused", desc, steps);
            refused++;
            free(desc);
            continue;
        }
        CHECK(s == DL_OK, "%s: %s", desc, dl_last_error());
        double worst = 0, worst_t = 0;
        for (int i = 0; i <= steps; i++) {
            float w = (float)cJSON_GetArrayItem(want, i)->valuedouble;
            worst = fmax(worst, ulps(got[i], w));
            if (i < steps) worst_t = fmax(worst_t, ulps(got[i] * (float)fm.num_train_timesteps,
                                                        (float)cJSON_GetArrayItem(wt, i)->valuedouble));
        }
        double allowed = fm.kind == DL_SIGMAS_PLAIN ? 0 : 1;
        CHECK(worst <= allowed && worst_t <= allowed + 0.5 * (fm.kind != DL_SIGMAS_PLAIN),
              "%s, %d steps: sigmas differ by %g ulp, timesteps by %g (allowed %g)", desc, steps, worst, worst_t, allowed);
        exact += worst == 0;
        ncase++;
        free(desc);
    }
    printf("flowmatch: %d schedules compared (%d bit-identical; %d without custom sigmas), %d NaN schedules refused\n",
           ncase, exact, ndefault, refused);
    CHECK(ndefault >= 40, "the vectors hold set_timesteps(steps) cases (%d)", ndefault);
    CHECK(ncase >= 50, "the vectors hold the cases (%d)", ncase);
    cJSON_Delete(root);
    return test_done("test_flowmatch");
}
