/* difflet communication: the collectives parallel execution needs, over MPI when
 * the process runs under mpirun, else a single-rank implementation in which every
 * collective is a copy or a no-op (so a build or a run without MPI works).
 *
 * Every call is made from the main thread (MPI_THREAD_FUNNELED) and is collective
 * over the communicator unless it says otherwise. Sizes are in bytes or floats as
 * named; every MPI error becomes a dl_status naming the call. Each communicator
 * counts the bytes it sent and the seconds spent inside communication calls. */
#ifndef DIFFLET_COMM_H
#define DIFFLET_COMM_H

#include "difflet/base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dl_comm dl_comm;

/* Starts MPI when launched by mpirun (OMPI_COMM_WORLD_SIZE / PMIX_RANK set) and
 * returns the world; otherwise a single-rank world. Safe to call more than once
 * (the same world is returned). */
dl_status dl_comm_world(dl_comm **world);
/* Finalizes MPI (after freeing every communicator split from the world). */
void dl_comm_finalize(void);
/* Ends every rank of the job (a rank that failed alone would leave the others
 * waiting in a collective): MPI_Abort under MPI, exit otherwise. */
void dl_comm_abort(int code) __attribute__((noreturn));
/* 1 when this build has MPI; 1 when this process was launched by mpirun. */
int dl_comm_have_mpi(void);
int dl_comm_launched(void);

/* The command line that starts `ranks` copies of this executable (followed by the
 * caller's arguments, appended at av[*n..]): mpirun, --allow-run-as-root as root,
 * --oversubscribe and --bind-to none when ranks x threads exceed the cores (or
 * threads > 1), -x OMP_NUM_THREADS. threads 0: the cores shared out. The strings
 * live in `store` (at least 4096 bytes). Returns the count of entries in av. */
int dl_comm_mpirun_argv(const char **av, int max, int ranks, int threads, char *store, size_t store_n);
int dl_comm_rank(const dl_comm *c);
int dl_comm_size(const dl_comm *c);
/* Ranks with the same color form one communicator, ordered by key. */
dl_status dl_comm_split(dl_comm *c, int color, int key, dl_comm **out);
void dl_comm_free(dl_comm *c); /* the world is freed by dl_comm_finalize */

dl_status dl_comm_barrier(dl_comm *c);
dl_status dl_comm_bcast(dl_comm *c, void *buf, size_t bytes, int root);
/* In-place element-wise sum of n floats. */
dl_status dl_comm_allreduce_sum(dl_comm *c, float *buf, size_t n);
/* recv[r * bytes ...] = rank r's send (bytes each); send may be inside recv at its slot. */
dl_status dl_comm_allgather(dl_comm *c, const void *send, size_t bytes, void *recv);
/* rank r contributes counts[r] bytes at recv + displs[r]. */
dl_status dl_comm_allgatherv(dl_comm *c, const void *send, void *recv, const size_t *counts, const size_t *displs);
/* Sums the float vectors `send` (sum of counts floats each) and leaves rank r
 * the counts[r] floats starting at the sum of counts before r, in recv. */
dl_status dl_comm_reduce_scatter_sum(dl_comm *c, const float *send, float *recv, const size_t *counts);
/* Rank r sends scounts[j] bytes from send + sdispls[j] to rank j, and receives
 * rcounts[j] bytes from j at recv + rdispls[j]. */
dl_status dl_comm_alltoallv(dl_comm *c, const void *send, const size_t *scounts, const size_t *sdispls, void *recv,
                            const size_t *rcounts, const size_t *rdispls);
/* Point to point (not collective): one send and one receive at once (a ring step). */
dl_status dl_comm_sendrecv(dl_comm *c, const void *send, size_t sbytes, int dst, void *recv, size_t rbytes, int src);
dl_status dl_comm_send(dl_comm *c, const void *buf, size_t bytes, int dst, int tag);
dl_status dl_comm_recv(dl_comm *c, void *buf, size_t bytes, int src, int tag);
/* Is a message from src (-1: any source) with tag (-1: any tag) waiting? 1 with its
 * source, tag and size (any of them may be NULL), 0 when none is, -1 on an error (the
 * message in dl_last_error). Never blocks: a loop that also does other work polls
 * with it (DDiT's scheduler and units). */
int dl_comm_iprobe(dl_comm *c, int src, int tag, int *src_out, int *tag_out, size_t *bytes);

/* Bytes this rank sent and seconds it spent in communication through c since the
 * last reset. */
typedef struct {
    double bytes, seconds;
    long calls;
} dl_comm_stats;
dl_comm_stats dl_comm_stats_get(const dl_comm *c);
void dl_comm_stats_reset(dl_comm *c);

#ifdef __cplusplus
}
#endif
#endif
