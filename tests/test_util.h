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

static inline int test_done(const char *name) {
    printf("%s: %d passed, %d failed\n", name, g_pass, g_fail);
    return g_fail ? 1 : 0;
}

#endif
