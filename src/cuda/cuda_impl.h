/* The CUDA backend's internals: the kernels' plain-typed launchers (src/cuda/kernels.cu,
 * compiled as C++ by nvcc; no difflet header is included there) and the error mapping
 * (src/cuda/device.c). */
#ifndef DIFFLET_CUDA_IMPL_H
#define DIFFLET_CUDA_IMPL_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* dl_attn_args without bias_rel, strides resolved (never 0) */
typedef struct {
    int64_t sq, sk, heads, head_dim;
    const void *q, *k, *v;
    int64_t q_stride, k_stride, v_stride;
    void *out;
    int64_t out_stride;
    int64_t kv_begin, kv_end;
    float scale;
    float *o_part, *m, *l;
    int causal;
} dlk_attn;

/* each returns a cudaError_t (0: launched) */
int dlk_attention(const dlk_attn *a, int bf16, void *stream);
int dlk_rmsnorm(int bf16, const void *x, void *y, const float *w, int64_t rows, int64_t cols, float eps, void *stream);
int dlk_ln_modulate(int bf16, const float *x, void *y, const float *scale, const float *shift, int64_t rows, int64_t cols,
                    float eps, void *stream);
int dlk_rope(int bf16, void *x, int64_t rows, int64_t heads, int64_t hd, int64_t stride, const float *cs, const float *sn,
             void *stream);
int dlk_gated_add(float *x, const float *u, const float *g, int64_t rows, int64_t cols, void *stream);
int dlk_activation(int bf16, void *x, int64_t n, int silu, void *stream);
int dlk_convert(int from_bf16, const void *x, int to_bf16, void *y, int64_t n, void *stream);

#ifdef __cplusplus
}
#endif

#ifndef __CUDACC__
#include "difflet/base.h"
/* a CUDA runtime error as a dl_status: "<what>: <the runtime's words>" (DL_OK for 0) */
dl_status dl_cuda_err(int err, const char *what);
#include "models/models_impl.h"
/* a device arena laid out by the liveness planner (the same offsets as the host arena
 * of that plan); free with dl_cuda_free */
dl_status dl_cuda_plan_commit(act_plan *p, void **d_arena);
#endif
#endif
