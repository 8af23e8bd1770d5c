/* Kernel self-check and the numeric helpers tests and benchmarks share: a seeded
 * generator, tolerance per dtype, and an element-wise comparison. */
#ifndef DIFFLET_CHECK_H
#define DIFFLET_CHECK_H

#include "difflet/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Tolerance |got - want| <= atol + rtol * |want| used for fast path vs reference. */
void dl_check_tolerance(dl_dtype dt, double *atol, double *rtol);

uint64_t dl_rng_next(uint64_t *state);
float dl_rng_uniform(uint64_t *state, float lo, float hi);
void dl_fill_uniform(dl_dtype dt, void *p, int64_t n, float lo, float hi, uint64_t seed);

/* Largest err/(atol + rtol|want|) over n elements (> 1 means out of tolerance; a
 * NaN on one side only is infinite). *bad_index: the worst index beyond 1, or -1. */
double dl_compare(dl_dtype dt, const void *got, const void *want, int64_t n, double atol,
                  double rtol, int64_t *bad_index);

typedef struct {
    const char *op;
    dl_dtype dt;
    int64_t rows, cols;
    double worst;     /* largest error in units of the tolerance */
    int ok;
    double got, want; /* the worst element when !ok */
} dl_check_result;

typedef void (*dl_check_cb)(const dl_check_result *r, void *ctx);

/* Every element-wise and row op, each dtype, each (rows, cols) pair in `shapes`,
 * active path split over `nth` simulated threads vs the reference. Returns the
 * number of failed comparisons; cb (may be NULL) sees every result. */
int dl_kernels_check(const int64_t *shapes, int nshapes, int nth, dl_check_cb cb, void *ctx);

#ifdef __cplusplus
}
#endif
#endif
