/* The CUDA device, memory and the kernels' checked entry points (docs/cuda.md).
 * Status: compiled, not yet run on a GPU. */
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <nccl.h>
#include <stdio.h>
#include <string.h>

#include "cuda/cuda_impl.h"
#include "difflet/cuda.h"
#include "models/models_impl.h"

dl_status dl_cuda_err(int err, const char *what) {
    if (err == cudaSuccess) return DL_OK;
    return dl_fail(err == cudaErrorMemoryAllocation ? DL_ERR_NOMEM : DL_ERR_BACKEND, "CUDA: %s: %s (%s)", what,
                   cudaGetErrorString((cudaError_t)err), cudaGetErrorName((cudaError_t)err));
}

dl_status dl_cuda_probe(dl_cuda_info *o) {
    memset(o, 0, sizeof *o);
    o->device = -1;
    cudaRuntimeGetVersion(&o->runtime);
    cudaDriverGetVersion(&o->driver);
    o->cublaslt = cublasLtGetVersion();
    o->cudnn = cudnnGetVersion();
    ncclGetVersion(&o->nccl);
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n < 1)
        return dl_fail(DL_ERR_UNSUPPORTED, "no CUDA device: %s", e != cudaSuccess ? cudaGetErrorString(e) : "none found");
    o->devices = n;
    struct cudaDeviceProp p;
    if ((e = cudaGetDevice(&o->device)) != cudaSuccess || (e = cudaGetDeviceProperties(&p, o->device)) != cudaSuccess)
        return dl_cuda_err(e, "device properties");
    o->sm_major = p.major, o->sm_minor = p.minor, o->mem_bytes = p.totalGlobalMem;
    snprintf(o->name, sizeof o->name, "%s", p.name);
    return DL_OK;
}

void dl_cuda_key(const dl_cuda_info *in, char *buf, size_t n) {
    snprintf(buf, n, "sm_%d%d cuda-%d.%d cublaslt-%zu cudnn-%zu", in->sm_major, in->sm_minor, in->runtime / 1000,
             in->runtime % 1000 / 10, in->cublaslt, in->cudnn);
}

dl_status dl_cuda_alloc(void **d_ptr, size_t bytes) {
    *d_ptr = NULL;
    if (!bytes) return dl_fail(DL_ERR_INVALID, "CUDA: a 0-byte allocation");
    return dl_cuda_err(cudaMalloc(d_ptr, bytes), "cudaMalloc");
}

void dl_cuda_free(void *d_ptr) {
    if (d_ptr) cudaFree(d_ptr);
}

dl_status dl_cuda_plan_commit(act_plan *p, void **d_arena) {
    dl_plan_place(p);
    dl_status s = dl_cuda_alloc(d_arena, p->total);
    if (s) return s;
    for (int i = 0; i < p->n; i++) *p->b[i].dst = (char *)*d_arena + p->b[i].off;
    return DL_OK;
}

dl_status dl_cuda_copy(void *dst, const void *src, size_t bytes, int to_device) {
    if (!dst || !src) return dl_fail(DL_ERR_INVALID, "CUDA: a copy with a NULL pointer");
    return dl_cuda_err(cudaMemcpy(dst, src, bytes, to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost), "cudaMemcpy");
}

dl_status dl_cuda_sync(void *stream) { return dl_cuda_err(cudaStreamSynchronize((cudaStream_t)stream), "synchronising"); }

/* ---- the kernels' checked entry points ---- */

static dl_status dt_ok(dl_dtype dt, const char *who) {
    return dt == DL_F32 || dt == DL_BF16 ? DL_OK : dl_fail(DL_ERR_UNSUPPORTED, "CUDA %s: %s (f32 or bf16)", who, dl_dtype_name(dt));
}

dl_status dl_cuda_attention(const dl_attn_args *a, void *stream) {
    dl_status s = dt_ok(a->dt, "attention");
    if (s) return s;
    const int64_t D = a->head_dim, W = a->heads * D;
    if (a->sq < 1 || a->sk < 1 || a->heads < 1 || D < 32 || D > 256 || D % 32 || a->heads > 65535)
        return dl_fail(DL_ERR_INVALID, "CUDA attention: %lld queries, %lld keys, %lld heads of %lld (head_dim a multiple of 32 "
                                       "up to 256)", (long long)a->sq, (long long)a->sk, (long long)a->heads, (long long)D);
    if (a->kv_begin < 0 || a->kv_end > a->sk || a->kv_begin > a->kv_end)
        return dl_fail(DL_ERR_INVALID, "CUDA attention: key interval [%lld, %lld) outside %lld keys", (long long)a->kv_begin,
                       (long long)a->kv_end, (long long)a->sk);
    if (!a->q || !a->k || !a->v || (!a->out && !a->o_part) || (a->o_part && (!a->m || !a->l)) || a->bias_rel)
        return dl_fail(DL_ERR_INVALID, "CUDA attention: a missing buffer, partial outputs without m and l, or a bias_rel "
                                       "(not supported here)");
    dlk_attn k = {.sq = a->sq, .sk = a->sk, .heads = a->heads, .head_dim = D, .q = a->q, .k = a->k, .v = a->v,
                  .q_stride = a->q_stride ? a->q_stride : W, .k_stride = a->k_stride ? a->k_stride : W,
                  .v_stride = a->v_stride ? a->v_stride : W, .out = a->out, .out_stride = a->out_stride ? a->out_stride : W,
                  .kv_begin = a->kv_begin, .kv_end = a->kv_end, .scale = a->scale, .o_part = a->o_part, .m = a->m,
                  .l = a->l, .causal = a->causal};
    return dl_cuda_err(dlk_attention(&k, a->dt == DL_BF16, stream), "attention launch");
}

static dl_status rows_ok(const char *who, const void *x, const void *y, int64_t rows, int64_t cols) {
    if (!x || !y || rows < 1 || cols < 1 || rows > 2147483647)
        return dl_fail(DL_ERR_INVALID, "CUDA %s: %lld x %lld, or a NULL buffer", who, (long long)rows, (long long)cols);
    return DL_OK;
}

dl_status dl_cuda_rmsnorm(dl_dtype dt, const void *d_x, void *d_y, const float *d_w, int64_t rows, int64_t cols, float eps,
                          void *stream) {
    dl_status s = dt_ok(dt, "rmsnorm");
    if (!s) s = rows_ok("rmsnorm", d_x, d_y, rows, cols);
    return s ? s : dl_cuda_err(dlk_rmsnorm(dt == DL_BF16, d_x, d_y, d_w, rows, cols, eps, stream), "rmsnorm launch");
}

dl_status dl_cuda_ln_modulate(dl_dtype dt, const float *d_x, void *d_y, const float *d_scale, const float *d_shift,
                              int64_t rows, int64_t cols, float eps, void *stream) {
    dl_status s = dt_ok(dt, "layernorm + modulate");
    if (!s) s = rows_ok("layernorm + modulate", d_x, d_y, rows, cols);
    if (!s && (!d_scale || !d_shift)) s = dl_fail(DL_ERR_INVALID, "CUDA layernorm + modulate: scale and shift are needed");
    return s ? s
             : dl_cuda_err(dlk_ln_modulate(dt == DL_BF16, d_x, d_y, d_scale, d_shift, rows, cols, eps, stream),
                           "layernorm + modulate launch");
}

dl_status dl_cuda_rope(dl_dtype dt, void *d_x, int64_t rows, int64_t heads, int64_t head_dim, int64_t stride,
                       const float *d_cos, const float *d_sin, void *stream) {
    dl_status s = dt_ok(dt, "rope");
    if (!s) s = rows_ok("rope", d_x, d_cos, rows, heads * head_dim);
    if (!s && (!d_sin || head_dim % 2 || heads < 1 || stride < heads * head_dim))
        s = dl_fail(DL_ERR_INVALID, "CUDA rope: head_dim %lld (even), row stride %lld (>= heads x head_dim)",
                    (long long)head_dim, (long long)stride);
    return s ? s : dl_cuda_err(dlk_rope(dt == DL_BF16, d_x, rows, heads, head_dim, stride, d_cos, d_sin, stream), "rope launch");
}

dl_status dl_cuda_gated_add(float *d_x, const float *d_u, const float *d_gate, int64_t rows, int64_t cols, void *stream) {
    dl_status s = rows_ok("gated add", d_x, d_u, rows, cols);
    return s ? s : dl_cuda_err(dlk_gated_add(d_x, d_u, d_gate, rows, cols, stream), "gated add launch");
}

dl_status dl_cuda_activation(dl_dtype dt, void *d_x, int64_t n, dl_act act, void *stream) {
    dl_status s = dt_ok(dt, "activation");
    if (!s && (!d_x || n < 1 || (act != DL_ACT_GELU_TANH && act != DL_ACT_SILU)))
        s = dl_fail(DL_ERR_INVALID, "CUDA activation: GELU-tanh or SiLU over n >= 1 values");
    return s ? s : dl_cuda_err(dlk_activation(dt == DL_BF16, d_x, n, act == DL_ACT_SILU, stream), "activation launch");
}

dl_status dl_cuda_convert(dl_dtype from, const void *d_x, dl_dtype to, void *d_y, int64_t n, void *stream) {
    dl_status s = dt_ok(from, "convert");
    if (!s) s = dt_ok(to, "convert");
    if (!s && (!d_x || !d_y || n < 1)) s = dl_fail(DL_ERR_INVALID, "CUDA convert: n >= 1 values, no NULL buffer");
    return s ? s : dl_cuda_err(dlk_convert(from == DL_BF16, d_x, to == DL_BF16, d_y, n, stream), "convert launch");
}
