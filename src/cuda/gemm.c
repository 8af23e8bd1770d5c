/* GEMM through cuBLASLt (docs/cuda.md). Status: compiled, not yet run on a GPU.
 *
 * Row-major y[m, n] = x[m, k] w[n, k]^T is, in cuBLASLt's column-major terms,
 * Y^T (n x m, ld n) = op(A) B with A = the w buffer read as a k x n matrix (ld k),
 * transposed, and B = the x buffer read as k x m (ld k), as it is. The bias (one value
 * per output feature) is then per row of the column-major result, which is where
 * cuBLASLt's BIAS epilogues add it, in the output's type (cublasLt.h: the bias has D's
 * type); GELU (tanh form, as DL_ACT_GELU_TANH) fuses as CUBLASLT_EPILOGUE_GELU(_BIAS).
 * The algorithm is chosen at creation by the library's heuristic for this shape and
 * 16-byte alignment. One cuBLASLt handle and one 32 MiB workspace serve every GEMM of
 * the process (made by the first GEMM, kept until the process ends): GEMMs run on one
 * stream at a time, as a denoiser step's do. A GEMM object is used by one thread at a
 * time (its descriptor holds the bias pointer of the run). */
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdlib.h>

#include "cuda/cuda_impl.h"
#include "difflet/cuda.h"

enum { WS_BYTES = 32 << 20 };

/* the process's handle and workspace */
static struct {
    pthread_mutex_t mu;
    cublasLtHandle_t lt;
    void *ws;
} g_lt = {.mu = PTHREAD_MUTEX_INITIALIZER};

struct dl_cuda_gemm {
    int64_t m, k, n;
    dl_act act;
    cublasLtHandle_t lt;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulHeuristicResult_t algo;
    int have_algo, with_bias; /* the epilogue the algorithm was chosen for */
    void *ws;
};

static dl_status lt_err(cublasStatus_t st, const char *what) {
    if (st == CUBLAS_STATUS_SUCCESS) return DL_OK;
    return dl_fail(DL_ERR_BACKEND, "cuBLASLt: %s: %s", what, cublasLtGetStatusString(st));
}

void dl_cuda_gemm_free(dl_cuda_gemm *g) {
    if (!g) return;
    if (g->pref) cublasLtMatmulPreferenceDestroy(g->pref);
    if (g->a) cublasLtMatrixLayoutDestroy(g->a);
    if (g->b) cublasLtMatrixLayoutDestroy(g->b);
    if (g->c) cublasLtMatrixLayoutDestroy(g->c);
    if (g->op) cublasLtMatmulDescDestroy(g->op);
    free(g);
}

static cudaDataType_t cuda_type(dl_dtype dt) { return dt == DL_BF16 ? CUDA_R_16BF : CUDA_R_32F; }

/* the epilogue for this activation, with or without the bias */
static cublasLtEpilogue_t epilogue(dl_act act, int bias) {
    if (act == DL_ACT_GELU_TANH) return bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
    return bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
}

/* (re)choose the algorithm for the epilogue with or without a bias */
static dl_status choose(dl_cuda_gemm *g, int bias) {
    const cublasLtEpilogue_t ep = epilogue(g->act, bias);
    dl_status s = lt_err(cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep), "epilogue");
    if (s) return s;
    int found = 0;
    s = lt_err(cublasLtMatmulAlgoGetHeuristic(g->lt, g->op, g->a, g->b, g->c, g->c, g->pref, 1, &g->algo, &found), "heuristic");
    if (s) return s;
    if (!found) return dl_fail(DL_ERR_UNSUPPORTED, "cuBLASLt: no algorithm for %lld x %lld x %lld", (long long)g->m,
                               (long long)g->k, (long long)g->n);
    g->have_algo = 1, g->with_bias = bias;
    return DL_OK;
}

dl_status dl_cuda_gemm_new(dl_cuda_gemm **out, int64_t m, int64_t k, int64_t n, dl_dtype dt, dl_dtype dst_dt, dl_act act) {
    *out = NULL;
    if (m < 1 || k < 1 || n < 1 || m > 2147483647 || k > 2147483647 || n > 2147483647)
        return dl_fail(DL_ERR_INVALID, "CUDA GEMM: %lld x %lld x %lld", (long long)m, (long long)k, (long long)n);
    if ((dt != DL_BF16 && dt != DL_F32) || (dst_dt != DL_BF16 && dst_dt != DL_F32))
        return dl_fail(DL_ERR_UNSUPPORTED, "CUDA GEMM: %s inputs -> %s (bf16 or f32)", dl_dtype_name(dt), dl_dtype_name(dst_dt));
    if (dt == DL_F32 && dst_dt == DL_BF16)
        return dl_fail(DL_ERR_UNSUPPORTED, "CUDA GEMM: f32 inputs give f32 (convert after, dl_cuda_convert)");
    if (act != DL_ACT_NONE && act != DL_ACT_GELU_TANH)
        return dl_fail(DL_ERR_UNSUPPORTED, "CUDA GEMM: only GELU-tanh fuses as an epilogue (SiLU runs as its own kernel)");
    dl_cuda_gemm *g = calloc(1, sizeof *g);
    if (!g) return dl_fail(DL_ERR_NOMEM, "out of memory");
    g->m = m, g->k = k, g->n = n, g->act = act;
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    const uint64_t wsb = WS_BYTES;
    const uint32_t al = 16; /* buffers inside an arena are only guaranteed 16-byte aligned here */
    dl_status s = DL_OK;
    pthread_mutex_lock(&g_lt.mu);
    if (!g_lt.lt && !(s = lt_err(cublasLtCreate(&g_lt.lt), "create")) &&
        (s = dl_cuda_err(cudaMalloc(&g_lt.ws, WS_BYTES), "the GEMM workspace")))
        cublasLtDestroy(g_lt.lt), g_lt.lt = NULL;
    g->lt = g_lt.lt, g->ws = g_lt.ws;
    pthread_mutex_unlock(&g_lt.mu);
    if (s ||
        (s = lt_err(cublasLtMatmulDescCreate(&g->op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "matmul descriptor")) ||
        (s = lt_err(cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "transa")) ||
        (s = lt_err(cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "transb")) ||
        (s = lt_err(cublasLtMatrixLayoutCreate(&g->a, cuda_type(dt), (uint64_t)k, (uint64_t)n, k), "layout of w")) ||
        (s = lt_err(cublasLtMatrixLayoutCreate(&g->b, cuda_type(dt), (uint64_t)k, (uint64_t)m, k), "layout of x")) ||
        (s = lt_err(cublasLtMatrixLayoutCreate(&g->c, cuda_type(dst_dt), (uint64_t)n, (uint64_t)m, n), "layout of y")) ||
        (s = lt_err(cublasLtMatmulPreferenceCreate(&g->pref), "preference")) ||
        (s = lt_err(cublasLtMatmulPreferenceSetAttribute(g->pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb),
                    "workspace")) ||
        (s = lt_err(cublasLtMatmulPreferenceSetAttribute(g->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al, sizeof al),
                    "alignment")) ||
        (s = lt_err(cublasLtMatmulPreferenceSetAttribute(g->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al, sizeof al),
                    "alignment")) ||
        (s = lt_err(cublasLtMatmulPreferenceSetAttribute(g->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al, sizeof al),
                    "alignment")) ||
        (s = lt_err(cublasLtMatmulPreferenceSetAttribute(g->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al, sizeof al),
                    "alignment")) ||
        (s = choose(g, 1))) {
        dl_cuda_gemm_free(g);
        return s;
    }
    *out = g;
    return DL_OK;
}

dl_status dl_cuda_gemm_run(dl_cuda_gemm *g, const void *d_x, const void *d_w, const void *d_bias, void *d_y, void *stream) {
    if (!g || !d_x || !d_w || !d_y) return dl_fail(DL_ERR_INVALID, "CUDA GEMM: a NULL argument");
    dl_status s;
    const int bias = d_bias != NULL;
    if (bias != g->with_bias && (s = choose(g, bias))) return s;
    if (bias && (s = lt_err(cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &d_bias, sizeof d_bias),
                            "bias pointer")))
        return s;
    const float one = 1.f, zero = 0.f;
    return lt_err(cublasLtMatmul(g->lt, g->op, &one, d_w, g->a, d_x, g->b, &zero, d_y, g->c, d_y, g->c, &g->algo.algo, g->ws,
                                 WS_BYTES, (cudaStream_t)stream),
                  "matmul");
}
