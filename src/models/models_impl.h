/* Shared building blocks of the model files: linear layers loaded from a checkpoint
 * (shape-checked, converted, packed by oneDNN), parameter vectors, and running a
 * kernel over the thread pool. */
#ifndef DIFFLET_MODELS_IMPL_H
#define DIFFLET_MODELS_IMPL_H

#include "difflet/models.h"

typedef struct {
    dl_matmul *mm;
    int64_t k, n;
} lin;

/* y[m, n] = act(x[m, k] W^T + b) where W (and b) are the checkpoint tensors
 * `names[0..nparts)` concatenated along N (a fused QKV from q, k, v), each [n_i, k].
 * bnames may be NULL (no bias) or have NULL entries (zero bias for that part). */
dl_status lin_load(lin *l, const dl_checkpoint *ck, const char *const *names, const char *const *bnames, int nparts,
                   const int64_t *n_parts, int64_t m, int64_t k, dl_dtype dt, dl_dtype dst_dt, dl_act act);
/* The same with output rows ldy elements apart (writing into a wider buffer). */
dl_status lin_load_ld(lin *l, const dl_checkpoint *ck, const char *const *names, const char *const *bnames,
                      int nparts, const int64_t *n_parts, int64_t m, int64_t k, dl_dtype dt, dl_dtype dst_dt,
                      dl_act act, int64_t ldy);
void lin_free(lin *l);
static inline dl_status lin_run(lin *l, const void *x, void *y) { return dl_matmul_run(l->mm, x, y); }

/* A float tensor of exactly `numel` elements as malloc'd f32 (shape checked by the
 * caller through ndim/shape). */
dl_status param_f32(const dl_checkpoint *ck, const char *name, int ndim, const int64_t *shape, float **out);

/* Run f(ctx, ith, nth) on the pool: the pattern every layer uses for kernels. */
#define DL_PAR(...)                                                      \
    do {                                                                 \
        _Pragma("omp parallel") {                                        \
            int ith = omp_get_thread_num(), nth = omp_get_num_threads(); \
            __VA_ARGS__;                                                 \
        }                                                                \
    } while (0)

/* f32 -> dt conversion of n elements on the pool */
#define to_dt(dt, dst, src, n) DL_PAR(dl_convert_t((dt), (dst), DL_F32, (src), (n), ith, nth))

/* "<prefix><name>" into buf (names with an optional model prefix). */
const char *pname(char *buf, size_t n, const char *prefix, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

#endif
