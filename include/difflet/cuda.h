/* The CUDA backend (src/cuda/; docs/cuda.md). Built as the `difflet_cuda` library
 * when CMake finds the toolkit (DIFFLET_CUDA=AUTO|ON|OFF). Status: compiled, not yet
 * run on a GPU; nothing in the engine dispatches to it yet.
 *
 * Pointers named d_* are device memory; `stream` is a cudaStream_t (NULL: the default
 * stream). Every call checks its arguments first (DL_ERR_INVALID, nothing launched)
 * and turns CUDA, cuBLASLt and NCCL errors into dl_status with the library's words. */
#ifndef DIFFLET_CUDA_H
#define DIFFLET_CUDA_H

#include "difflet/base.h"
#include "difflet/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- step graphs: the host-side bookkeeping (src/cuda/graph.c, in every build) -------
 * One denoiser step is captured once per program (the paper's compiled program) and
 * replayed every later step; what changes per step (timestep, guidance, valid text
 * length) lives in device memory that the kernels read and the host rewrites before
 * each replay. The operations are a table, so a CPU test can drive the bookkeeping
 * with its own; dl_cuda_graph_ops() gives CUDA's. */
typedef struct {
    dl_status (*begin)(void *ctx);                 /* start capturing the stream */
    dl_status (*end)(void *ctx, void **graph);     /* stop; *graph: the instantiated graph */
    void (*abort)(void *ctx);                      /* a capture that failed: end it, keep nothing */
    dl_status (*upload)(void *ctx, void *d_dst, const void *src, size_t bytes); /* host -> device, on the stream */
    dl_status (*launch)(void *ctx, void *graph);   /* replay on the stream */
    void (*destroy)(void *ctx, void *graph);
} dl_graph_ops;
/* the step's kernels enqueued on the stream (called once, inside the capture) */
typedef dl_status (*dl_graph_record_fn)(void *rctx);
typedef struct dl_step_graph dl_step_graph;
/* key: the program's key (a graph belongs to one program); d_scalars: scalar_bytes of
 * device memory the step's kernels read the per-step values from */
dl_status dl_step_graph_new(dl_step_graph **out, const dl_graph_ops *ops, void *ctx, const char *key, void *d_scalars,
                            size_t scalar_bytes);
/* One step: the scalars uploaded, then the graph replayed; the first call (or the
 * first after dl_step_graph_reset) records it. key must be the graph's. */
dl_status dl_step_graph_run(dl_step_graph *g, const char *key, const void *scalars, size_t bytes, dl_graph_record_fn record,
                            void *rctx);
void dl_step_graph_reset(dl_step_graph *g); /* the next run records again (weights or arena moved) */
void dl_step_graph_stats(const dl_step_graph *g, int *captures, int *replays);
void dl_step_graph_free(dl_step_graph *g);

#ifdef DIFFLET_HAVE_CUDA
/* ---- the device (src/cuda/device.c) ---- */
typedef struct {
    int devices, device;          /* count; the one in use */
    int sm_major, sm_minor;       /* compute capability: the program key's "sm_90" */
    char name[256];
    size_t mem_bytes;
    int runtime, driver;          /* CUDA versions (13000 = 13.0; driver 0: none) */
    size_t cublaslt, cudnn;       /* library versions */
    int nccl;
} dl_cuda_info;
/* The device and the versions; DL_ERR_UNSUPPORTED with the runtime's reason when there
 * is no usable device (no driver, no GPU). Library versions are filled either way. */
dl_status dl_cuda_probe(dl_cuda_info *out);
/* "sm_90 cuda-13.0 cublaslt-130001 cudnn-91300": the program key's device field */
void dl_cuda_key(const dl_cuda_info *in, char *buf, size_t n);
/* Device memory: one block per arena (the liveness planner's total; dl_plan_place). */
dl_status dl_cuda_alloc(void **d_ptr, size_t bytes);
void dl_cuda_free(void *d_ptr);
dl_status dl_cuda_copy(void *dst, const void *src, size_t bytes, int to_device);
dl_status dl_cuda_sync(void *stream);
const dl_graph_ops *dl_cuda_graph_ops(void); /* ctx: the stream */

/* ---- kernels (src/cuda/kernels.cu); dt DL_F32 or DL_BF16 ---- */
/* Flash attention with dl_attn_args' contract (src/kernels/attention.c): q, k, v, out
 * and the partial outputs are device pointers; valid key interval, causal, partial
 * outputs (o_part [Sq, H, D], m and l [H, Sq]) for ring attention's merge; no bias_rel.
 * head_dim a multiple of 32, at most 256. */
dl_status dl_cuda_attention(const dl_attn_args *a, void *stream);
/* y = x / rms(x) [* w] over rows (w NULL: none) */
dl_status dl_cuda_rmsnorm(dl_dtype dt, const void *d_x, void *d_y, const float *d_w, int64_t rows, int64_t cols, float eps,
                          void *stream);
/* y (dt) = LN(x)(1 + scale) + shift: x f32 [rows, cols] (the residual), scale and
 * shift f32 [cols] (no affine LN) */
dl_status dl_cuda_ln_modulate(dl_dtype dt, const float *d_x, void *d_y, const float *d_scale, const float *d_shift,
                              int64_t rows, int64_t cols, float eps, void *stream);
/* interleaved RoPE in place on x [rows, heads, head_dim] (row stride `stride`), tables
 * cos / sin f32 [rows, head_dim / 2] */
dl_status dl_cuda_rope(dl_dtype dt, void *d_x, int64_t rows, int64_t heads, int64_t head_dim, int64_t stride,
                       const float *d_cos, const float *d_sin, void *stream);
/* x (f32 [rows, cols]) += gate[col] * u (u f32; gate NULL: 1) */
dl_status dl_cuda_gated_add(float *d_x, const float *d_u, const float *d_gate, int64_t rows, int64_t cols, void *stream);
/* in place over n values: act DL_ACT_GELU_TANH or DL_ACT_SILU */
dl_status dl_cuda_activation(dl_dtype dt, void *d_x, int64_t n, dl_act act, void *stream);
/* n values from one dtype to the other (f32 <-> bf16, round to nearest even) */
dl_status dl_cuda_convert(dl_dtype from, const void *d_x, dl_dtype to, void *d_y, int64_t n, void *stream);

/* ---- GEMM through cuBLASLt (src/cuda/gemm.c) ----
 * y[m, n] = act(x[m, k] w[n, k]^T + b): x and w bf16 (or f32), f32 accumulation, y in
 * dst_dt (bf16 inputs: bf16 or f32; f32 inputs: f32); bias [n] in dst_dt (cuBLASLt's
 * rule) or NULL; act none or GELU-tanh, fused as cuBLASLt's epilogue. One thread at a
 * time per GEMM object. */
typedef struct dl_cuda_gemm dl_cuda_gemm;
dl_status dl_cuda_gemm_new(dl_cuda_gemm **out, int64_t m, int64_t k, int64_t n, dl_dtype dt, dl_dtype dst_dt, dl_act act);
dl_status dl_cuda_gemm_run(dl_cuda_gemm *g, const void *d_x, const void *d_w, const void *d_bias, void *d_y, void *stream);
void dl_cuda_gemm_free(dl_cuda_gemm *g);

/* ---- NCCL: the comm layer on GPUs (src/cuda/nccl.c) ----
 * One rank per GPU; the unique id goes from rank 0 over the MPI communicator given. */
struct dl_comm;
typedef struct dl_nccl dl_nccl;
dl_status dl_nccl_init(dl_nccl **out, struct dl_comm *bootstrap, int device);
dl_status dl_nccl_allreduce_sum(dl_nccl *c, void *d_buf, size_t count, dl_dtype dt, void *stream);
dl_status dl_nccl_allgather(dl_nccl *c, const void *d_send, void *d_recv, size_t bytes, void *stream);
dl_status dl_nccl_bcast(dl_nccl *c, void *d_buf, size_t bytes, int root, void *stream);
int dl_nccl_rank(const dl_nccl *c);
int dl_nccl_size(const dl_nccl *c);
void dl_nccl_free(dl_nccl *c);
#endif

#ifdef __cplusplus
}
#endif
#endif
