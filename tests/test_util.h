/* Minimal test harness: CHECK counts, a failure prints file:line and a message,
 * and test_done() prints the closing "N passed, M failed" line and the exit code. */
#ifndef DIFFLET_TEST_UTIL_H
#define DIFFLET_TEST_UTIL_H

#include <stdio.h>

/* where the test data and the sources are (CMake passes both) */
#ifndef DATA_DIR
#define DATA_DIR "tests/data"
#endif
#ifndef SOURCE_DIR
#define SOURCE_DIR "."
#endif

static int g_pass, g_fail;

#define CHECK(cond, ...)                                                  \
    do {                                                                  \
        if (cond) {                                                       \
            g_pass++;                                                     \
        } else {                                                          \
            g_fail++;                                                     \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                 \
            fprintf(stderr, "\n");                                        \
        }                                                                 \
    } while (0)

/* The worst row's max |got - want| over that row's max |want| (rows x D, row-major;
 * INFINITY when got holds a non-finite value): the parity tests' per-row bound. */
static inline double test_row_err(const float *got, const float *want, long long rows, long long D) {
    double worst = 0;
    for (long long r = 0; r < rows; r++) {
        double mx = 0, e = 0;
        for (long long j = 0; j < D; j++) {
            double g = got[r * D + j], w = want[r * D + j];
            if (!(g - g == 0)) return 1.0 / 0.0;
            mx = w > mx ? w : -w > mx ? -w : mx;
            e = g - w > e ? g - w : w - g > e ? w - g : e;
        }
        e /= mx > 0 ? mx : 1;
        worst = e > worst ? e : worst;
    }
    return worst;
}

static inline int test_done(const char *name) {
    printf("%s: %d passed, %d failed\n", name, g_pass, g_fail);
    return g_fail ? 1 : 0;
}

#endif
