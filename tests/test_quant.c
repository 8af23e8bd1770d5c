/* int8 programs end to end: every parity model (FLUX dev and schnell, Qwen-Image,
 * Wan 2.1, OpenSora) and difflet-tiny generate the same prompts with bf16 programs and with
 * int8 programs (W8A8 and weight-only); the table of PSNR per prompt against bf16 is
 * printed with the number of int8 linears each pipeline built, every model must
 * have some, and each scheme's mean per parity model must reach 30 dB (the issue's
 * goal is the mean over them). An int8 program loaded from the cache gives the bytes the compiling
 * process gave, and its key names the scheme. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "difflet/program.h"
#include "difflet/registry.h"
#include "test_util.h"

typedef struct {
    const char *dir;
    int w, h, frames, maxseq, steps, parity;
} qcase;

static const qcase k_cases[] = {
    {DATA_DIR "/flux/dev", 32, 32, 1, 32, 4, 1},
    {DATA_DIR "/flux/schnell", 32, 32, 1, 32, 2, 1},
    {DATA_DIR "/qwenimage/a", 32, 32, 1, 0, 4, 1},
    {DATA_DIR "/wan/a", 48, 32, 9, 16, 4, 1},
    {DATA_DIR "/opensora/b", 48, 48, 17, 0, 3, 1},
    {SOURCE_DIR "/models/difflet-tiny", 64, 64, 1, 0, 8, 0},
};
static const char *const k_prompts[] = {"a red circle on a blue background", "a photo of a cat sitting on a mat",
                                        "green square, small, on white"};
enum { NP = sizeof k_prompts / sizeof k_prompts[0] };

/* pixels of every prompt (frames x h x w x 3 floats each) under one dtype */
static float *run(const qcase *c, const char *dtype, int *ok) {
    dl_gen_shape shape = {.width = c->w, .height = c->h, .frames = c->frames, .max_sequence_length = c->maxseq};
    *ok = dl_dtype_parse(dtype, &shape.dt, &shape.quant);
    dl_pipeline *p = NULL;
    if (!*ok || dl_pipeline_load(&p, c->dir, &shape) != DL_OK) {
        CHECK(0, "%s %s: load: %s", c->dir, dtype, dl_last_error());
        *ok = 0;
        return NULL;
    }
    const int64_t n = (int64_t)c->frames * c->w * c->h * 3;
    float *out = calloc((size_t)(n * NP), sizeof *out);
    for (int i = 0; i < NP && out; i++) {
        dl_gen_request r = {.prompt = k_prompts[i], .negative_prompt = "", .steps = c->steps, .guidance = 3.5f,
                            .seed = 100 + (uint64_t)i, .want_pixels = 1};
        dl_media m;
        dl_gen_timing tm;
        if (dl_pipeline_generate(p, &r, &m, &tm) != DL_OK || !m.pixels) {
            CHECK(0, "%s %s prompt %d: %s", c->dir, dtype, i, dl_last_error());
            *ok = 0;
            break;
        }
        memcpy(out + i * n, m.pixels, (size_t)n * sizeof *out);
        dl_media_free(&m);
    }
    dl_pipeline_free(p);
    return out;
}

int main(int argc, char **argv) {
    (void)argc, (void)argv;
    char cache[] = "/tmp/difflet_quant_XXXXXX";
    if (!mkdtemp(cache)) return 1;
    setenv("DIFFLET_CACHE", cache, 1);
    static const char *const schemes[] = {"int8", "int8-wo"};
    double sum[2] = {0}, cnt = 0;
    printf("%-26s %-8s %5s %s\n", "model", "scheme", "int8", "PSNR against bf16 per prompt (dB)");
    for (size_t ci = 0; ci < sizeof k_cases / sizeof k_cases[0]; ci++) {
        const qcase *c = &k_cases[ci];
        const int64_t n = (int64_t)c->frames * c->w * c->h * 3;
        int ok;
        float *ref = run(c, "bf16", &ok);
        if (!ok) {
            free(ref);
            continue;
        }
        for (int s = 0; s < 2; s++) {
            int before = dl_q8_count();
            float *q = run(c, schemes[s], &ok); /* compiles the int8 programs */
            int nq = dl_q8_count() - before;
            if (!ok) {
                free(q);
                continue;
            }
            const char *name = strstr(c->dir, "/data/") ? strstr(c->dir, "/data/") + 6 : strstr(c->dir, "models/");
            printf("%-26s %-8s %5d", name ? name : c->dir, schemes[s], nq);
            double msum = 0;
            for (int i = 0; i < NP; i++) {
                double db = test_psnr(ref + i * n, q + i * n, n, 1.0);
                printf(" %6.1f", db);
                msum += db > 99 ? 99 : db;
                if (c->parity) sum[s] += db > 99 ? 99 : db;
            }
            printf("\n");
            CHECK(nq > 0, "%s %s: no linear was quantized", c->dir, schemes[s]);
            CHECK(!c->parity || msum / NP >= 30, "%s %s: mean PSNR %.1f dB under 30", c->dir, schemes[s], msum / NP);
            if (s == 0 && ci == 0) { /* the cached program: the bytes the compiling process gave */
                float *again = run(c, schemes[s], &ok);
                CHECK(ok && again && !memcmp(again, q, (size_t)(n * NP) * sizeof *q),
                      "int8 programs loaded from the cache give other pixels than when compiled");
                free(again);
            }
            free(q);
        }
        if (c->parity) cnt += NP;
        free(ref);
    }
    for (int s = 0; s < 2; s++) {
        double mean = cnt ? sum[s] / cnt : 0;
        printf("%s: mean PSNR over the parity models %.1f dB (goal >= 30)\n", schemes[s], mean);
        CHECK(mean >= 30, "%s: mean PSNR %.1f dB against bf16 is under 30 dB", schemes[s], mean);
    }
    /* the keys name the scheme: int8 and int8-wo programs of the transformer exist */
    dl_cache_entry *e = NULL;
    int ne = 0, w8a8 = 0, w8 = 0;
    if (dl_cache_list(&e, &ne) == DL_OK)
        for (int i = 0; i < ne; i++) {
            w8a8 += strstr(e[i].key, "\"quant\":\"int8\"") != NULL;
            w8 += strstr(e[i].key, "\"quant\":\"int8-wo\"") != NULL;
        }
    free(e);
    CHECK(w8a8 > 0 && w8 > 0, "program keys with the scheme: int8 %d, int8-wo %d", w8a8, w8);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", cache);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", cache);
    return test_done("quant");
}
