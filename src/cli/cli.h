/* Subcommands of the `difflet` binary. Each returns the process exit code. */
#ifndef DIFFLET_CLI_H
#define DIFFLET_CLI_H

#include <stdint.h>

#include "difflet/pipeline.h"

int cli_bench_kernels(int argc, char **argv);
/* --json FILE and --quick, the options every benchmark takes, and --dtype f32|bf16
 * where `dt` is given (default: the engine's default on this CPU); 0 (message
 * printed) on a bad one */
int bench_opts(int argc, char **argv, const char *name, const char **json_path, int *quick, dl_dtype *dt);
/* The machine a benchmark ran on, into its JSON: CPU model, kernel and matmul ISA
 * paths, oneDNN version, threads. */
struct cJSON;
void bench_machine_json(struct cJSON *root);
int cli_inspect(int argc, char **argv);
int cli_tokenize(int argc, char **argv);
int cli_generate(int argc, char **argv);
int cli_bench_flux(int argc, char **argv);
int cli_bench_wan(int argc, char **argv);
int cli_bench_qwen(int argc, char **argv);
int cli_bench_hunyuan(int argc, char **argv);
int cli_compile(int argc, char **argv);
int cli_eval_tiny(int argc, char **argv);
int cli_eval_tiny_video(int argc, char **argv);
int cli_calibrate(int argc, char **argv);
int cli_eval_cache(int argc, char **argv);
int cli_serve(int argc, char **argv);
int cli_serve_worker(int argc, char **argv);
int cli_loadgen(int argc, char **argv);
int cli_bench_startup(int argc, char **argv);
int cli_bench_parallel(int argc, char **argv);
int cli_bench_parallel_rank(int argc, char **argv);
int cli_bench_startup_child(int argc, char **argv);
int bench_flux_model(const char *dir, int quick, int64_t *grid, int64_t *txt);
int cli_cache(int argc, char **argv);
int cli_profile(int argc, char **argv);
int cli_simulate(int argc, char **argv);
int cli_sched_eval(int argc, char **argv);
int cli_profile_measure(int argc, char **argv, const char *db, const char *name);
int cli_profile_measure_rank(int argc, char **argv);
/* Run `difflet <sub...> <argv...>` as `ranks` MPI processes of `threads` threads
 * each (0: the cores shared out): replace this process (exec), or wait for it and
 * return its exit code. */
int cli_mpirun(const char *const *sub, int nsub, int argc, char **argv, int ranks, int threads, int replace);
/* Is the layout feasible for the model (heads from its transformer config) and a
 * pipeline making `passes` evaluations per step? Prints the reason when not. */
/* --model REF (a folder or a Hub id in the local cache) to a folder in buf; 0 (message
 * printed, prefixed with cmd) when it cannot be resolved. */
int cli_model(const char *cmd, const char *ref, char *buf, size_t n);
int cli_layout_ok(const char *cmd, const char *model, const char *spec, const dl_par_config *pc, int passes);


/* the model benchmarks' shared parts (bench_common.c) */
struct cJSON;
/* this process's resident and peak resident memory (MiB) from /proc/self/status */
void bench_rss_mib(double *cur, double *peak);
/* restart the peak-RSS count at the current RSS (Linux clear_refs 5); 0 when refused */
int bench_rss_reset(void);
/* the same-run oneDNN matmul rate in dt (GFLOP/s) at M x K x N */
double bench_matmul_peak(dl_dtype dt, int64_t M, int64_t K, int64_t N);
/* tools/bench/<script> in the tools virtualenv on the folder's inputs.safetensors; its JSON
 * line (NULL: not measured, the reason printed; DIFFLET_BENCH_PEER=off skips it) */
struct cJSON *bench_run_peer(const char *script, const char *dir, int reps, int warm, dl_dtype dt);
/* max |a - b| / max |b| over n, b the `out` tensor of path; NAN when unreadable */
double bench_rel_diff(const char *path, const float *a, int64_t n);

#endif
