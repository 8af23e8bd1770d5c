/* Communication over MPI (Open MPI from Debian) or a single rank. A communicator of
 * size 1 never calls MPI, so the single-rank path is the same code with or without
 * an MPI build. Byte counts travel as MPI_BYTE (as int counts: a message over 2 GiB
 * is refused by name rather than truncated). */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "difflet/comm.h"

#ifdef DIFFLET_HAVE_MPI
#include <mpi.h>
#endif

struct dl_comm {
    int rank, size, world;
#ifdef DIFFLET_HAVE_MPI
    MPI_Comm mc;
#endif
    dl_comm_stats st;
};

static dl_comm g_world;
static int g_init, g_mpi;

int dl_comm_have_mpi(void) {
#ifdef DIFFLET_HAVE_MPI
    return 1;
#else
    return 0;
#endif
}

int dl_comm_launched(void) { return getenv("OMPI_COMM_WORLD_SIZE") != NULL || getenv("PMIX_RANK") != NULL; }

#ifdef DIFFLET_HAVE_MPI
static dl_status mpi_err(int rc, const char *call) {
    char msg[MPI_MAX_ERROR_STRING];
    int n = 0;
    MPI_Error_string(rc, msg, &n);
    return dl_fail(DL_ERR_IO, "MPI %s failed: %.*s", call, n, msg);
}
#define MPI_CHECK(call, name)                          \
    do {                                               \
        int rc_ = (call);                              \
        if (rc_ != MPI_SUCCESS) return mpi_err(rc_, name); \
    } while (0)

static dl_status icount(size_t bytes, const char *what, int *out) {
    if (bytes > INT_MAX) return dl_fail(DL_ERR_UNSUPPORTED, "%s: a %zu-byte message is over MPI's 2 GiB count", what, bytes);
    *out = (int)bytes;
    return DL_OK;
}
#endif

dl_status dl_comm_world(dl_comm **world) {
    *world = &g_world;
    if (g_init) return DL_OK;
    g_world = (dl_comm){.rank = 0, .size = 1, .world = 1};
    if (dl_comm_launched()) {
#ifdef DIFFLET_HAVE_MPI
        int provided = 0, rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided);
        if (rc != MPI_SUCCESS) return mpi_err(rc, "MPI_Init_thread");
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
        g_world.mc = MPI_COMM_WORLD;
        MPI_Comm_rank(MPI_COMM_WORLD, &g_world.rank);
        MPI_Comm_size(MPI_COMM_WORLD, &g_world.size);
        g_mpi = 1;
#else
        if (getenv("OMPI_COMM_WORLD_SIZE") && atoi(getenv("OMPI_COMM_WORLD_SIZE")) > 1)
            return dl_fail(DL_ERR_UNSUPPORTED, "launched by mpirun, but this difflet was built without MPI");
#endif
    }
    g_init = 1;
    return DL_OK;
}

void dl_comm_finalize(void) {
#ifdef DIFFLET_HAVE_MPI
    if (g_mpi) MPI_Finalize();
#endif
    g_mpi = 0;
    g_init = 0;
}

void dl_comm_abort(int code) {
#ifdef DIFFLET_HAVE_MPI
    if (g_mpi && g_world.size > 1) MPI_Abort(MPI_COMM_WORLD, code);
#endif
    exit(code);
}

int dl_comm_mpirun_argv(const char **av, int max, int ranks, int threads, char *store, size_t store_n) {
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    if (ncpu < 1) ncpu = 1;
    if (threads < 1) threads = (int)(ncpu / ranks > 0 ? ncpu / ranks : 1);
    char *np = store, *omp = store + 16, *self = store + 64;
    snprintf(np, 16, "%d", ranks);
    snprintf(omp, 48, "OMP_NUM_THREADS=%d", threads);
    ssize_t k = readlink("/proc/self/exe", self, store_n - 65);
    if (k <= 0) snprintf(self, store_n - 64, "/proc/self/exe");
    else self[k] = 0;
    int n = 0;
    const char *a[16];
    a[n++] = "mpirun";
    if (geteuid() == 0) a[n++] = "--allow-run-as-root";
    if ((long)ranks * threads > ncpu) a[n++] = "--oversubscribe";
    if (threads > 1 || (long)ranks * threads > ncpu) a[n++] = "--bind-to", a[n++] = "none";
    a[n++] = "-n", a[n++] = np, a[n++] = "-x", a[n++] = omp, a[n++] = self;
    for (int i = 0; i < n && i < max; i++) av[i] = a[i];
    return n < max ? n : max;
}

int dl_comm_rank(const dl_comm *c) { return c->rank; }
int dl_comm_size(const dl_comm *c) { return c->size; }
dl_comm_stats dl_comm_stats_get(const dl_comm *c) { return c->st; }
void dl_comm_stats_reset(dl_comm *c) { c->st = (dl_comm_stats){0}; }

dl_status dl_comm_split(dl_comm *c, int color, int key, dl_comm **out) {
    *out = NULL;
    dl_comm *n = calloc(1, sizeof *n);
    if (!n) return dl_fail(DL_ERR_NOMEM, "out of memory");
    n->rank = 0;
    n->size = 1;
#ifdef DIFFLET_HAVE_MPI
    if (c->size > 1) {
        int rc = MPI_Comm_split(c->mc, color, key, &n->mc);
        if (rc != MPI_SUCCESS) {
            free(n);
            return mpi_err(rc, "MPI_Comm_split");
        }
        MPI_Comm_set_errhandler(n->mc, MPI_ERRORS_RETURN);
        MPI_Comm_rank(n->mc, &n->rank);
        MPI_Comm_size(n->mc, &n->size);
    }
#else
    (void)color, (void)key;
#endif
    *out = n;
    return DL_OK;
}

void dl_comm_free(dl_comm *c) {
    if (!c || c->world) return;
#ifdef DIFFLET_HAVE_MPI
    if (c->size > 1 || c->mc) {
        if (c->mc && c->mc != MPI_COMM_WORLD) MPI_Comm_free(&c->mc);
    }
#endif
    free(c);
}

/* statistics around one call */
#define TIMED(c, nbytes, body)       \
    do {                             \
        double t0_ = dl_now();       \
        body;                        \
        (c)->st.seconds += dl_now() - t0_; \
        (c)->st.bytes += (double)(nbytes); \
        (c)->st.calls++;             \
    } while (0)

dl_status dl_comm_barrier(dl_comm *c) {
    if (c->size == 1) return DL_OK;
#ifdef DIFFLET_HAVE_MPI
    TIMED(c, 0, MPI_CHECK(MPI_Barrier(c->mc), "MPI_Barrier"));
#endif
    return DL_OK;
}

dl_status dl_comm_bcast(dl_comm *c, void *buf, size_t bytes, int root) {
    if (c->size == 1) return DL_OK;
#ifdef DIFFLET_HAVE_MPI
    int n = 0;
    dl_status s = icount(bytes, "broadcast", &n);
    if (s) return s;
    TIMED(c, c->rank == root ? bytes : 0, MPI_CHECK(MPI_Bcast(buf, n, MPI_BYTE, root, c->mc), "MPI_Bcast"));
#endif
    return DL_OK;
}

dl_status dl_comm_allreduce_sum(dl_comm *c, float *buf, size_t n) {
    if (c->size == 1) return DL_OK;
#ifdef DIFFLET_HAVE_MPI
    int k = 0;
    dl_status s = icount(n * 4, "all-reduce", &k);
    if (s) return s;
    /* a ring all-reduce sends 2 (p - 1) / p of the vector from each rank */
    double sent = 2.0 * (double)(c->size - 1) / c->size * (double)(n * 4);
    TIMED(c, sent, MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, c->mc), "MPI_Allreduce"));
#endif
    return DL_OK;
}

dl_status dl_comm_allgather(dl_comm *c, const void *send, size_t bytes, void *recv) {
    char *dst = (char *)recv + (size_t)c->rank * bytes;
    if (c->size == 1) {
        if (send != dst) memmove(dst, send, bytes);
        return DL_OK;
    }
#ifdef DIFFLET_HAVE_MPI
    int n = 0;
    dl_status s = icount(bytes, "all-gather", &n);
    if (s) return s;
    const void *src = send == dst ? MPI_IN_PLACE : send;
    TIMED(c, (double)bytes * (c->size - 1),
          MPI_CHECK(MPI_Allgather(src, n, MPI_BYTE, recv, n, MPI_BYTE, c->mc), "MPI_Allgather"));
#endif
    return DL_OK;
}

/* size_t counts and displacements as MPI's ints */
#ifdef DIFFLET_HAVE_MPI
static dl_status ints(const dl_comm *c, const size_t *a, int *out, const char *what) {
    for (int i = 0; i < c->size; i++) {
        dl_status s = icount(a[i], what, &out[i]);
        if (s) return s;
    }
    return DL_OK;
}
#endif

dl_status dl_comm_allgatherv(dl_comm *c, const void *send, void *recv, const size_t *counts, const size_t *displs) {
    char *dst = (char *)recv + displs[c->rank];
    if (c->size == 1) {
        if (send != dst) memmove(dst, send, counts[0]);
        return DL_OK;
    }
#ifdef DIFFLET_HAVE_MPI
    int cn[64], dp[64];
    if (c->size > 64) return dl_fail(DL_ERR_UNSUPPORTED, "all-gather over more than 64 ranks");
    dl_status s;
    if ((s = ints(c, counts, cn, "all-gather")) || (s = ints(c, displs, dp, "all-gather"))) return s;
    const void *src = send == dst ? MPI_IN_PLACE : send;
    TIMED(c, (double)counts[c->rank] * (c->size - 1),
          MPI_CHECK(MPI_Allgatherv(src, cn[c->rank], MPI_BYTE, recv, cn, dp, MPI_BYTE, c->mc), "MPI_Allgatherv"));
#endif
    return DL_OK;
}

dl_status dl_comm_reduce_scatter_sum(dl_comm *c, const float *send, float *recv, const size_t *counts) {
    if (c->size == 1) {
        if (send != recv) memmove(recv, send, counts[0] * 4);
        return DL_OK;
    }
#ifdef DIFFLET_HAVE_MPI
    int cn[64];
    if (c->size > 64) return dl_fail(DL_ERR_UNSUPPORTED, "reduce-scatter over more than 64 ranks");
    size_t total = 0;
    for (int i = 0; i < c->size; i++) {
        dl_status s = icount(counts[i] * 4, "reduce-scatter", &cn[i]);
        if (s) return s;
        cn[i] = (int)counts[i];
        total += counts[i];
    }
    TIMED(c, (double)(total - counts[c->rank]) * 4,
          MPI_CHECK(MPI_Reduce_scatter(send, recv, cn, MPI_FLOAT, MPI_SUM, c->mc), "MPI_Reduce_scatter"));
#endif
    return DL_OK;
}

dl_status dl_comm_alltoallv(dl_comm *c, const void *send, const size_t *scounts, const size_t *sdispls, void *recv,
                            const size_t *rcounts, const size_t *rdispls) {
    if (c->size == 1) {
        memmove((char *)recv + rdispls[0], (const char *)send + sdispls[0], scounts[0]);
        return DL_OK;
    }
#ifdef DIFFLET_HAVE_MPI
    int sc[64], sd[64], rc[64], rd[64];
    if (c->size > 64) return dl_fail(DL_ERR_UNSUPPORTED, "all-to-all over more than 64 ranks");
    dl_status s;
    if ((s = ints(c, scounts, sc, "all-to-all")) || (s = ints(c, sdispls, sd, "all-to-all")) ||
        (s = ints(c, rcounts, rc, "all-to-all")) || (s = ints(c, rdispls, rd, "all-to-all")))
        return s;
    double sent = 0;
    for (int i = 0; i < c->size; i++)
        if (i != c->rank) sent += (double)scounts[i];
    TIMED(c, sent, MPI_CHECK(MPI_Alltoallv(send, sc, sd, MPI_BYTE, recv, rc, rd, MPI_BYTE, c->mc), "MPI_Alltoallv"));
#endif
    return DL_OK;
}

dl_status dl_comm_sendrecv(dl_comm *c, const void *send, size_t sbytes, int dst, void *recv, size_t rbytes, int src) {
    if (c->size == 1) {
        if (sbytes != rbytes) return dl_fail(DL_ERR_INVALID, "sendrecv to self: %zu bytes sent, %zu expected", sbytes, rbytes);
        memmove(recv, send, sbytes);
        return DL_OK;
    }
#ifdef DIFFLET_HAVE_MPI
    int sn = 0, rn = 0;
    dl_status s;
    if ((s = icount(sbytes, "sendrecv", &sn)) || (s = icount(rbytes, "sendrecv", &rn))) return s;
    TIMED(c, sbytes,
          MPI_CHECK(MPI_Sendrecv(send, sn, MPI_BYTE, dst, 7, recv, rn, MPI_BYTE, src, 7, c->mc, MPI_STATUS_IGNORE),
                    "MPI_Sendrecv"));
#endif
    return DL_OK;
}

dl_status dl_comm_send(dl_comm *c, const void *buf, size_t bytes, int dst, int tag) {
    if (c->size == 1) return dl_fail(DL_ERR_INVALID, "send on a single-rank communicator");
#ifdef DIFFLET_HAVE_MPI
    int n = 0;
    dl_status s = icount(bytes, "send", &n);
    if (s) return s;
    TIMED(c, bytes, MPI_CHECK(MPI_Send(buf, n, MPI_BYTE, dst, tag, c->mc), "MPI_Send"));
#endif
    return DL_OK;
}

int dl_comm_iprobe(dl_comm *c, int src, int tag, int *src_out, int *tag_out, size_t *bytes) {
    if (c->size == 1) return 0;
#ifdef DIFFLET_HAVE_MPI
    int flag = 0, n = 0;
    MPI_Status st;
    int rc = MPI_Iprobe(src < 0 ? MPI_ANY_SOURCE : src, tag < 0 ? MPI_ANY_TAG : tag, c->mc, &flag, &st);
    if (rc != MPI_SUCCESS) return mpi_err(rc, "MPI_Iprobe"), -1;
    if (!flag) return 0;
    MPI_Get_count(&st, MPI_BYTE, &n);
    if (src_out) *src_out = st.MPI_SOURCE;
    if (tag_out) *tag_out = st.MPI_TAG;
    if (bytes) *bytes = (size_t)n;
    return 1;
#else
    (void)src, (void)tag, (void)src_out, (void)tag_out, (void)bytes;
    return 0;
#endif
}

dl_status dl_comm_recv(dl_comm *c, void *buf, size_t bytes, int src, int tag) {
    if (c->size == 1) return dl_fail(DL_ERR_INVALID, "receive on a single-rank communicator");
#ifdef DIFFLET_HAVE_MPI
    int n = 0;
    dl_status s = icount(bytes, "receive", &n);
    if (s) return s;
    TIMED(c, 0, MPI_CHECK(MPI_Recv(buf, n, MPI_BYTE, src, tag, c->mc, MPI_STATUS_IGNORE), "MPI_Recv"));
#endif
    return DL_OK;
}
