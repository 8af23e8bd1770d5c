/* Subcommands of the `difflet` binary. Each returns the process exit code. */
#ifndef DIFFLET_CLI_H
#define DIFFLET_CLI_H

int cli_bench_kernels(int argc, char **argv);
int cli_inspect(int argc, char **argv);
int cli_generate(int argc, char **argv);
int cli_bench_flux(int argc, char **argv);
int cli_compile(int argc, char **argv);
int cli_cache(int argc, char **argv);

#endif
