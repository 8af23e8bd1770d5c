/* Starting a command's ranks through mpirun: `difflet generate --parallel ...`
 * relaunches itself as `mpirun -n W difflet generate ...` unless it already runs
 * under MPI. As root mpirun needs --allow-run-as-root; with more ranks x threads
 * than cores it needs --oversubscribe, and core binding is turned off so several
 * threads per rank can spread. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/cli.h"
#include "difflet/registry.h"
#include "difflet/base.h"
#include "difflet/comm.h"
#include "difflet/pipeline.h"

int cli_mpirun(const char *const *sub, int nsub, int argc, char **argv, int ranks, int threads, int replace) {
    if (!dl_comm_have_mpi()) {
        fprintf(stderr, "difflet: %d ranks asked for, but this build has no MPI (install libopenmpi-dev openmpi-bin: make deps)\n",
                ranks);
        return 2;
    }
    static char store[4200];
    const char *av[256];
    int n = dl_comm_mpirun_argv(av, 200, ranks, threads, store, sizeof store);
    for (int i = 0; i < nsub && n < 250; i++) av[n++] = sub[i];
    for (int i = 0; i < argc && n < 254; i++) av[n++] = argv[i];
    av[n] = NULL;
    fflush(stdout), fflush(stderr);
    if (replace) {
        execvp("mpirun", (char *const *)av);
        fprintf(stderr, "difflet: cannot run mpirun: %s (make deps installs Open MPI)\n", strerror(errno));
        return 1;
    }
    pid_t pid = fork();
    if (pid < 0) return 1;
    if (pid == 0) {
        execvp("mpirun", (char *const *)av);
        fprintf(stderr, "difflet: cannot run mpirun: %s (make deps installs Open MPI)\n", strerror(errno));
        _exit(127);
    }
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}

int cli_model(const char *cmd, const char *ref, char *buf, size_t n) {
    if (dl_model_resolve(ref, buf, n) == DL_OK) return 1;
    fprintf(stderr, "difflet: %s: %s\n", cmd, dl_last_error());
    return 0;
}

int cli_layout_ok(const char *cmd, const char *model, const char *spec, const dl_par_config *pc, int passes) {
    char why[512];
    if (!dl_file_exists(model)) {
        fprintf(stderr, "difflet: %s: model folder %s does not exist\n", cmd, model);
        return 0;
    }
    const char *bad = dl_pipeline_layout_check(model, pc, passes, dl_par_ranks(pc), why, sizeof why);
    if (bad) fprintf(stderr, "difflet: %s: --parallel %s: %s\n", cmd, spec, bad);
    return bad == NULL;
}
