/* CUDA kernels of the backend (docs/cuda.md). Status: compiled, not yet run on a GPU.
 * Plain-typed launchers (src/cuda/cuda_impl.h) called by src/cuda/device.c, which
 * checks arguments and maps errors; each returns a cudaError_t as int.
 *
 * Element type T: float or __nv_bfloat16 (the `bf` flag); arithmetic in f32.
 *
 * attention: flash style. A block of 4 warps takes 4 query rows of one head; a warp owns
 * a row, each lane D/32 of its head_dim values (q and the accumulator in registers).
 * Keys stream through shared memory in tiles of 32 (K and V as f32); for each key the
 * warp sums q.k across lanes (shuffles), and keeps the running max m, the sum of
 * exponentials l and the unnormalised accumulator (online softmax, exactly the CPU
 * reference's order of operations per row). Keys outside [kv_begin, kv_end), and after
 * the query's own index when causal, are never read. Partial mode writes (acc, m, l)
 * for ring attention's merge; else acc / l (0 when no key was valid). A correct first
 * kernel; tensor-core tiles (mma) are the next step once it has run on a device. */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "cuda/cuda_impl.h"

namespace {

__device__ __forceinline__ float ld(const float *p, int64_t i) { return p[i]; }
__device__ __forceinline__ float ld(const __nv_bfloat16 *p, int64_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void st(float *p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void st(__nv_bfloat16 *p, int64_t i, float v) { p[i] = __float2bfloat16_rn(v); }

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

enum { ATT_WARPS = 4, ATT_TILE = 32 }; /* head_dim: 32 E, E = 1..8 (at most 256) */

/* E = head_dim / 32 values per lane, a compile-time constant so q and the accumulator
 * stay in registers */
template <typename T, int E>
__global__ void attention_kernel(dlk_attn a) {
    extern __shared__ float sh[]; /* K tile [ATT_TILE][D], V tile [ATT_TILE][D] */
    constexpr int D = 32 * E;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float *sk = sh, *sv = sh + ATT_TILE * D;
    const int64_t h = blockIdx.y, q = (int64_t)blockIdx.x * ATT_WARPS + warp;
    const T *Q = (const T *)a.q, *K = (const T *)a.k, *V = (const T *)a.v;
    const bool active = q < a.sq;
    float qr[E], acc[E];
#pragma unroll
    for (int e = 0; e < E; e++) {
        qr[e] = active ? ld(Q, q * a.q_stride + h * D + e * 32 + lane) : 0.f;
        acc[e] = 0.f;
    }
    float m = -INFINITY, l = 0.f;
    /* the block's keys: [kv_begin, kv_end), cut at its last row's index when causal */
    int64_t last = (int64_t)blockIdx.x * ATT_WARPS + ATT_WARPS - 1;
    if (last >= a.sq) last = a.sq - 1;
    const int64_t kend_block = a.causal && last + 1 < a.kv_end ? last + 1 : a.kv_end;
    const int64_t kend = a.causal && q + 1 < a.kv_end ? q + 1 : a.kv_end; /* this row's */
    for (int64_t k0 = a.kv_begin; k0 < kend_block; k0 += ATT_TILE) {
        const int n = (int)(kend_block - k0 < ATT_TILE ? kend_block - k0 : ATT_TILE);
        __syncthreads(); /* the previous tile is no longer read */
        for (int i = threadIdx.x; i < n * D; i += blockDim.x) {
            const int r = i / D, c = i % D;
            sk[r * D + c] = ld(K, (k0 + r) * a.k_stride + h * D + c);
            sv[r * D + c] = ld(V, (k0 + r) * a.v_stride + h * D + c);
        }
        __syncthreads();
        if (!active) continue;
        for (int j = 0; j < n && k0 + j < kend; j++) {
            float part = 0.f;
#pragma unroll
            for (int e = 0; e < E; e++) part += qr[e] * sk[j * D + e * 32 + lane];
            const float s = warp_sum(part) * a.scale;
            if (s > m) { /* a new running max: rescale what was accumulated */
                const float r = expf(m - s);
                l *= r;
#pragma unroll
                for (int e = 0; e < E; e++) acc[e] *= r;
                m = s;
            }
            const float p = expf(s - m);
            l += p;
#pragma unroll
            for (int e = 0; e < E; e++) acc[e] += p * sv[j * D + e * 32 + lane];
        }
    }
    if (!active) return;
    if (a.o_part) {
#pragma unroll
        for (int e = 0; e < E; e++) a.o_part[(q * a.heads + h) * D + e * 32 + lane] = acc[e];
        if (lane == 0) a.m[h * a.sq + q] = m, a.l[h * a.sq + q] = l;
    } else {
        const float inv = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
        for (int e = 0; e < E; e++) st((T *)a.out, q * a.out_stride + h * D + e * 32 + lane, acc[e] * inv);
    }
}

__device__ __forceinline__ float block_sum(float v, float *red) {
    v = warp_sum(v);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float t = 0.f;
    for (int i = 0; i < nw; i++) t += red[i];
    return t;
}

template <typename T>
__global__ void rmsnorm_kernel(const T *x, T *y, const float *w, int64_t cols, float eps) {
    __shared__ float red[32];
    const int64_t r = blockIdx.x;
    float s = 0.f;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
        const float v = ld(x, r * cols + c);
        s += v * v;
    }
    const float inv = rsqrtf(block_sum(s, red) / (float)cols + eps);
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
        st(y, r * cols + c, ld(x, r * cols + c) * inv * (w ? w[c] : 1.f));
}

template <typename T>
__global__ void ln_modulate_kernel(const float *x, T *y, const float *scale, const float *shift, int64_t cols, float eps) {
    __shared__ float red[32];
    const int64_t r = blockIdx.x;
    const float *xr = x + r * cols;
    float s = 0.f;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) s += xr[c];
    const float mean = block_sum(s, red) / (float)cols;
    float v2 = 0.f;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) v2 += (xr[c] - mean) * (xr[c] - mean);
    const float inv = rsqrtf(block_sum(v2, red) / (float)cols + eps);
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
        st(y, r * cols + c, (xr[c] - mean) * inv * (1.f + scale[c]) + shift[c]);
}

template <typename T>
__global__ void rope_kernel(T *x, int64_t rows, int64_t heads, int64_t hd, int64_t stride, const float *cs, const float *sn) {
    const int64_t half = hd / 2, n = rows * heads * half;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t p = i % half, h = (i / half) % heads, r = i / (half * heads);
        const int64_t o = r * stride + h * hd + 2 * p;
        const float c = cs[r * half + p], s = sn[r * half + p], a = ld(x, o), b = ld(x, o + 1);
        st(x, o, a * c - b * s);
        st(x, o + 1, a * s + b * c);
    }
}

__global__ void gated_add_kernel(float *x, const float *u, const float *g, int64_t rows, int64_t cols) {
    const int64_t n = rows * cols;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        x[i] += (g ? g[i % cols] : 1.f) * u[i];
}

template <typename T>
__global__ void activation_kernel(T *x, int64_t n, int silu) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float v = ld(x, i);
        const float y = silu ? v / (1.f + expf(-v)) : 0.5f * v * (1.f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
        st(x, i, y);
    }
}

template <typename A, typename B>
__global__ void convert_kernel(const A *x, B *y, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        st(y, i, ld(x, i));
}

unsigned grid_for(int64_t n, int threads) {
    const int64_t g = (n + threads - 1) / threads;
    return (unsigned)(g < 1 ? 1 : g > 65535 ? 65535 : g);
}

int last_error() { return (int)cudaGetLastError(); }

/* an earlier runtime call's error (handled by its caller) must not be taken for this launch's */
void clear_error() { (void)cudaGetLastError(); }

} // namespace

/* launch the instance for T and E; the shared-memory limit is raised once per instance
 * (64 KiB at head_dim 256 is above the default 48 KiB) */
template <typename T, int E>
int launch_attention(const dlk_attn *a, cudaStream_t s) {
    static int raised = 0; /* benign race: setting the same attribute twice is harmless */
    const size_t shm = (size_t)2 * ATT_TILE * 32 * E * sizeof(float);
    if (!raised) {
        const cudaError_t e = cudaFuncSetAttribute(attention_kernel<T, E>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shm);
        if (e != cudaSuccess) return (int)e;
        raised = 1;
    }
    const dim3 grid((unsigned)((a->sq + ATT_WARPS - 1) / ATT_WARPS), (unsigned)a->heads), block(32 * ATT_WARPS);
    attention_kernel<T, E><<<grid, block, shm, s>>>(*a);
    return last_error();
}

template <typename T>
int attention_for(const dlk_attn *a, cudaStream_t s) {
    switch (a->head_dim / 32) {
    case 1: return launch_attention<T, 1>(a, s);
    case 2: return launch_attention<T, 2>(a, s);
    case 3: return launch_attention<T, 3>(a, s);
    case 4: return launch_attention<T, 4>(a, s);
    case 5: return launch_attention<T, 5>(a, s);
    case 6: return launch_attention<T, 6>(a, s);
    case 7: return launch_attention<T, 7>(a, s);
    case 8: return launch_attention<T, 8>(a, s);
    default: return (int)cudaErrorInvalidValue;
    }
}

extern "C" int dlk_attention(const dlk_attn *a, int bf16, void *stream) {
    clear_error();
    return bf16 ? attention_for<__nv_bfloat16>(a, (cudaStream_t)stream) : attention_for<float>(a, (cudaStream_t)stream);
}

extern "C" int dlk_rmsnorm(int bf16, const void *x, void *y, const float *w, int64_t rows, int64_t cols, float eps,
                           void *stream) {
    clear_error();
    cudaStream_t s = (cudaStream_t)stream;
    if (bf16) rmsnorm_kernel<<<(unsigned)rows, 256, 0, s>>>((const __nv_bfloat16 *)x, (__nv_bfloat16 *)y, w, cols, eps);
    else rmsnorm_kernel<<<(unsigned)rows, 256, 0, s>>>((const float *)x, (float *)y, w, cols, eps);
    return last_error();
}

extern "C" int dlk_ln_modulate(int bf16, const float *x, void *y, const float *scale, const float *shift, int64_t rows,
                               int64_t cols, float eps, void *stream) {
    clear_error();
    cudaStream_t s = (cudaStream_t)stream;
    if (bf16) ln_modulate_kernel<<<(unsigned)rows, 256, 0, s>>>(x, (__nv_bfloat16 *)y, scale, shift, cols, eps);
    else ln_modulate_kernel<<<(unsigned)rows, 256, 0, s>>>(x, (float *)y, scale, shift, cols, eps);
    return last_error();
}

extern "C" int dlk_rope(int bf16, void *x, int64_t rows, int64_t heads, int64_t hd, int64_t stride, const float *cs,
                        const float *sn, void *stream) {
    clear_error();
    cudaStream_t s = (cudaStream_t)stream;
    const unsigned g = grid_for(rows * heads * (hd / 2), 256);
    if (bf16) rope_kernel<<<g, 256, 0, s>>>((__nv_bfloat16 *)x, rows, heads, hd, stride, cs, sn);
    else rope_kernel<<<g, 256, 0, s>>>((float *)x, rows, heads, hd, stride, cs, sn);
    return last_error();
}

extern "C" int dlk_gated_add(float *x, const float *u, const float *g, int64_t rows, int64_t cols, void *stream) {
    clear_error();
    gated_add_kernel<<<grid_for(rows * cols, 256), 256, 0, (cudaStream_t)stream>>>(x, u, g, rows, cols);
    return last_error();
}

extern "C" int dlk_activation(int bf16, void *x, int64_t n, int silu, void *stream) {
    clear_error();
    cudaStream_t s = (cudaStream_t)stream;
    if (bf16) activation_kernel<<<grid_for(n, 256), 256, 0, s>>>((__nv_bfloat16 *)x, n, silu);
    else activation_kernel<<<grid_for(n, 256), 256, 0, s>>>((float *)x, n, silu);
    return last_error();
}

extern "C" int dlk_convert(int from_bf16, const void *x, int to_bf16, void *y, int64_t n, void *stream) {
    clear_error();
    cudaStream_t s = (cudaStream_t)stream;
    const unsigned g = grid_for(n, 256);
    if (from_bf16 && !to_bf16) convert_kernel<<<g, 256, 0, s>>>((const __nv_bfloat16 *)x, (float *)y, n);
    else if (!from_bf16 && to_bf16) convert_kernel<<<g, 256, 0, s>>>((const float *)x, (__nv_bfloat16 *)y, n);
    else if (from_bf16) convert_kernel<<<g, 256, 0, s>>>((const __nv_bfloat16 *)x, (__nv_bfloat16 *)y, n);
    else convert_kernel<<<g, 256, 0, s>>>((const float *)x, (float *)y, n);
    return last_error();
}
