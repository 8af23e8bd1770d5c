/* CUDA's step-graph operations (include/difflet/cuda.h): capture on the stream in
 * ctx (thread-local mode: only this thread's capture-unsafe calls are refused while it
 * captures), instantiate, upload with cudaMemcpyAsync before the launch, replay with
 * cudaGraphLaunch. The scalars' host buffer is pageable memory (the copy has read it
 * when the call returns); from pinned memory the caller must keep it until the stream
 * has run the copy.
 * Status: compiled, not yet run on a GPU. */
#include <cuda_runtime.h>

#include "cuda/cuda_impl.h"
#include "difflet/cuda.h"

static dl_status g_begin(void *ctx) {
    return dl_cuda_err(cudaStreamBeginCapture((cudaStream_t)ctx, cudaStreamCaptureModeThreadLocal), "begin capture");
}

static dl_status g_end(void *ctx, void **graph) {
    cudaGraph_t gr = NULL;
    cudaGraphExec_t ex = NULL;
    dl_status s = dl_cuda_err(cudaStreamEndCapture((cudaStream_t)ctx, &gr), "end capture");
    if (!s) s = dl_cuda_err(cudaGraphInstantiate(&ex, gr, 0), "instantiate the step graph");
    if (gr) cudaGraphDestroy(gr);
    *graph = s ? NULL : (void *)ex;
    return s;
}

static void g_abort(void *ctx) {
    cudaGraph_t gr = NULL;
    if (cudaStreamEndCapture((cudaStream_t)ctx, &gr) == cudaSuccess && gr) cudaGraphDestroy(gr);
    cudaGetLastError(); /* the failed capture's error is the caller's to report */
}

static dl_status g_upload(void *ctx, void *d_dst, const void *src, size_t bytes) {
    return dl_cuda_err(cudaMemcpyAsync(d_dst, src, bytes, cudaMemcpyHostToDevice, (cudaStream_t)ctx), "upload the step's scalars");
}

static dl_status g_launch(void *ctx, void *graph) {
    return dl_cuda_err(cudaGraphLaunch((cudaGraphExec_t)graph, (cudaStream_t)ctx), "launch the step graph");
}

static void g_destroy(void *ctx, void *graph) {
    (void)ctx;
    cudaGraphExecDestroy((cudaGraphExec_t)graph);
}

static const dl_graph_ops k_ops = {g_begin, g_end, g_abort, g_upload, g_launch, g_destroy};

const dl_graph_ops *dl_cuda_graph_ops(void) { return &k_ops; }
