/* The comm layer on GPUs: NCCL, one rank per GPU, bootstrapped over MPI (rank 0 makes
 * the unique id, dl_comm_bcast sends it). Every call checks its arguments before any
 * NCCL call (tests/test_cuda_host.c drives those checks without a GPU).
 * Status: compiled, not yet run on a GPU. */
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_impl.h"
#include "difflet/comm.h"
#include "difflet/cuda.h"

struct dl_nccl {
    ncclComm_t comm;
    int rank, size;
};

static dl_status nccl_err(ncclResult_t r, const char *what) {
    if (r == ncclSuccess) return DL_OK;
    return dl_fail(DL_ERR_BACKEND, "NCCL: %s: %s", what, ncclGetErrorString(r));
}

dl_status dl_nccl_init(dl_nccl **out, dl_comm *bootstrap, int device) {
    if (!out) return dl_fail(DL_ERR_INVALID, "NCCL init: no output");
    *out = NULL;
    if (!bootstrap) return dl_fail(DL_ERR_INVALID, "NCCL init: an MPI communicator is needed to bootstrap");
    /* this rank's own checks first; then every rank, failed or not, joins the broadcast
     * of the id and an all-reduce of the failures, so no rank is left waiting */
    const int rank = dl_comm_rank(bootstrap), size = dl_comm_size(bootstrap);
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    dl_status s = DL_OK;
    if (e != cudaSuccess || n < 1)
        s = dl_fail(DL_ERR_UNSUPPORTED, "NCCL init: no CUDA device (%s)", e != cudaSuccess ? cudaGetErrorString(e) : "none found");
    else if (device < 0 || device >= n)
        s = dl_fail(DL_ERR_INVALID, "NCCL init: device %d of %d", device, n);
    else
        s = dl_cuda_err(cudaSetDevice(device), "select the device");
    dl_nccl *c = s ? NULL : calloc(1, sizeof *c);
    if (!s && !c) s = dl_fail(DL_ERR_NOMEM, "out of memory");
    ncclUniqueId id;
    uint8_t buf[sizeof id + 1] = {0};
    if (rank == 0 && !s && !(s = nccl_err(ncclGetUniqueId(&id), "unique id"))) memcpy(buf, &id, sizeof id), buf[sizeof id] = 1;
    dl_status b = dl_comm_bcast(bootstrap, buf, sizeof buf, 0);
    float failed = s || b || !buf[sizeof id] ? 1.f : 0.f;
    dl_status r = dl_comm_allreduce_sum(bootstrap, &failed, 1);
    if (!s && (b || r)) s = b ? b : r;
    if (!s && failed > 0.f) s = dl_fail(DL_ERR_BACKEND, "NCCL init: %.0f of %d ranks could not take part", failed, size);
    if (!s) {
        memcpy(&id, buf, sizeof id);
        c->rank = rank, c->size = size;
        s = nccl_err(ncclCommInitRank(&c->comm, size, id, rank), "communicator");
    }
    if (s) {
        free(c);
        return s;
    }
    *out = c;
    return DL_OK;
}

/* the checks every collective makes first */
static dl_status args(const char *who, const dl_nccl *c, const void *a, const void *b, size_t n) {
    if (!c) return dl_fail(DL_ERR_INVALID, "NCCL %s: the communicator is not initialised", who);
    if (n && (!a || !b)) return dl_fail(DL_ERR_INVALID, "NCCL %s: a NULL buffer", who);
    if (n > (SIZE_MAX >> 4)) return dl_fail(DL_ERR_INVALID, "NCCL %s: %zu elements", who, n);
    return DL_OK;
}

dl_status dl_nccl_allreduce_sum(dl_nccl *c, void *d_buf, size_t count, dl_dtype dt, void *stream) {
    if (dt != DL_F32 && dt != DL_BF16)
        return dl_fail(DL_ERR_UNSUPPORTED, "NCCL all-reduce: %s (f32 or bf16)", dl_dtype_name(dt));
    dl_status s = args("all-reduce", c, d_buf, d_buf, count);
    if (s || !count) return s;
    return nccl_err(ncclAllReduce(d_buf, d_buf, count, dt == DL_BF16 ? ncclBfloat16 : ncclFloat32, ncclSum, c->comm,
                                  (cudaStream_t)stream),
                    "all-reduce");
}

dl_status dl_nccl_allgather(dl_nccl *c, const void *d_send, void *d_recv, size_t bytes, void *stream) {
    dl_status s = args("all-gather", c, d_send, d_recv, bytes);
    if (s || !bytes) return s;
    return nccl_err(ncclAllGather(d_send, d_recv, bytes, ncclUint8, c->comm, (cudaStream_t)stream), "all-gather");
}

dl_status dl_nccl_bcast(dl_nccl *c, void *d_buf, size_t bytes, int root, void *stream) {
    dl_status s = args("broadcast", c, d_buf, d_buf, bytes);
    if (s) return s;
    if (root < 0 || root >= c->size) return dl_fail(DL_ERR_INVALID, "NCCL broadcast: root %d of %d ranks", root, c->size);
    if (!bytes) return DL_OK;
    return nccl_err(ncclBroadcast(d_buf, d_buf, bytes, ncclUint8, root, c->comm, (cudaStream_t)stream), "broadcast");
}

int dl_nccl_rank(const dl_nccl *c) { return c ? c->rank : -1; }
int dl_nccl_size(const dl_nccl *c) { return c ? c->size : 0; }

void dl_nccl_free(dl_nccl *c) {
    if (!c) return;
    if (c->comm) ncclCommDestroy(c->comm);
    free(c);
}
