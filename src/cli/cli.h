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
int cli_bench_int8(int argc, char **argv);
int cli_bench_wan(int argc, char **argv);
int cli_bench_qwen(int argc, char **argv);
int cli_bench_hunyuan(int argc, char **argv);
int cli_bench_ltx2(int argc, char **argv);
int cli_bench_opensora(int argc, char **argv);
int cli_ddit(int argc, char **argv);
int cli_compile(int argc, char **argv);
int cli_eval_tiny(int argc, char **argv);
int cli_eval_tiny_video(int argc, char **argv);
int cli_calibrate(int argc, char **argv);
int cli_calibrate_int8(int argc, char **argv);
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
/* the same with int8 weights (quant: dl_matmul_desc.quant) */
double bench_matmul_rate(dl_dtype dt, dl_quant quant, int64_t M, int64_t K, int64_t N);
/* "OpenBLAS f32", "oneDNN bf16", ...: the library and dtype of the last bench_matmul_rate */
const char *bench_matmul_label(void);
/* tools/bench/<script> in the tools virtualenv on the folder's inputs.safetensors; its JSON
 * line (NULL: not measured, the reason printed; DIFFLET_BENCH_PEER=off skips it) */
struct cJSON *bench_run_peer(const char *script, const char *dir, int reps, int warm, dl_dtype dt);
/* max |a - b| / max |b| over n, b the `out` tensor of path; NAN when unreadable */
double bench_rel_diff(const char *path, const float *a, int64_t n);

/* A random-weight safetensors folder's file: the writer, the bf16 buffers it points
 * into until saved, the next tensor's seed (one per tensor, in call order, so a file
 * is the same bytes for the same seed start and calls), and the first failure (the
 * calls after one do nothing). */
typedef struct {
    dl_st_writer *w;
    void **keep;
    int n, cap;
    uint64_t seed;
    dl_status s;
} bench_wgen;
/* an empty generator whose first tensor gets `seed` (g->s: DL_ERR_NOMEM when the
 * writer cannot be made) */
void bench_wgen_init(bench_wgen *g, uint64_t seed);
/* save the tensors to path (when every call succeeded) and free the generator;
 * the first failure's status */
dl_status bench_wgen_save(bench_wgen *g, const char *path);
/* tensor `name` [shape] of nd dims, random bf16 scaled like a trained init: weights
 * (nd >= 2) U(+-1/sqrt(fan_in)), fan_in the product of every dim but the first;
 * biases U(+-0.1); 1-D `.weight`s (norm gammas) 1 + U(+-0.1) */
void bench_put(bench_wgen *g, const char *name, int nd, const int64_t *shape);
/* tensor `name` [shape] as a gain around 1, whatever its name and shape: 1 + U(+-0.1)
 * (Wan's [C, 1, 1, 1] `.gamma`s, a LayerNorm's bias Wan's bench keeps near 1) */
void bench_put_gamma(bench_wgen *g, const char *name, int nd, const int64_t *shape);
/* `<prefix><base>.weight` [shape] and `<prefix><base>.bias` [shape[0]] (a conv) */
void bench_put_wb(bench_wgen *g, const char *prefix, const char *base, int nd, const int64_t *shape);
/* `<prefix><base>.weight` [out, in] and `<prefix><base>.bias` [out] (a linear) */
void bench_put_lin(bench_wgen *g, const char *prefix, const char *base, int64_t out, int64_t in);
/* `<prefix><base>` [n] (a norm's weight or bias) */
void bench_put_vec(bench_wgen *g, const char *prefix, const char *base, int64_t n);
/* tensor `name` [shape] holding the values v (copied), stored as f32: a checkpoint's
 * fixed, non-random buffers (STDiT3's rope.freqs) */
void bench_put_f32(bench_wgen *g, const char *name, int nd, const int64_t *shape, const float *v);
/* a bench's JSON report to path, written atomically */
dl_status bench_write_json(const struct cJSON *root, const char *path);
/* a bench's scratch folder and everything in it, gone (a warning when it cannot be) */
void bench_remove_dir(const char *dir);
/* text to path, written atomically (a config.json, a model_index.json) */
dl_status bench_write_text(const char *path, const char *text);

/* An OpenSora 1.2 folder with random weights at the published sizes (bench_opensora.c):
 * dir/transformer, an STDiT3 of hpcai-tech/OpenSora-STDiT-v3's config (hidden 1152, 16
 * heads x 72, caption_channels 4096, model_max_length 300, patch (1, 2, 2)) but `depth`
 * block pairs, the published key names (rope.freqs its real values); with vae also
 * dir/vae, the OpenSoraVAE v1.2 decoder's published config (VAE_Temporal_SD + the SDXL
 * spatial VAE); dir/model_index.json names them. Fixed seeds: the same bytes each time. */
dl_status bench_opensora_folder(const char *dir, int64_t depth, int vae);

/* Seconds of one block's joint attention done standalone as dit.c's joint_attn does
 * it on one rank: S = T + N query rows of a fused [S, 3 heads head_dim] QKV buffer
 * (the T text rows first, L of them valid, then N image or video rows) in dt; with
 * every text row valid (L == T) one call over the S keys, else two partials (the L
 * valid text keys, the N image keys) then their merge. Best of 2; NAN when out of
 * memory or the kernel fails. */
double bench_joint_attn_seconds(int64_t T, int64_t L, int64_t N, int64_t heads, int64_t head_dim, dl_dtype dt);

#endif
