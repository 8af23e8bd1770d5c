/* The thread runner. OpenMP (libgomp) is the one pool shared with oneDNN, whose
 * Debian build uses it too, so kernels and matmuls never oversubscribe the cores. */
#include "difflet/base.h"

#include <omp.h>

int dl_threads(void) { return omp_get_max_threads(); }

void dl_set_threads(int n) {
    if (n > 0) omp_set_num_threads(n);
}

void dl_parallel(dl_task_fn fn, void *ctx) {
    int n = omp_get_max_threads();
    if (n <= 1 || omp_in_parallel()) {
        fn(ctx, 0, 1);
        return;
    }
#pragma omp parallel num_threads(n)
    fn(ctx, omp_get_thread_num(), omp_get_num_threads());
}
