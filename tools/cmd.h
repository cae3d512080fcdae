/* cmd.h: the CLI's subcommands that live in files of their own (tools/cmd_*.c). Each takes the arguments
 * after its name and returns the process exit status; like kiln.c they are the only code that prints. */
#ifndef KILN_TOOLS_CMD_H
#define KILN_TOOLS_CMD_H

#include "kiln.h"

int kiln_cmd_data(int argc, char **argv);   /* tools/cmd_data.c:  kiln data CORPUS... -t TOK.gguf -o DIR */
int kiln_cmd_plot(int argc, char **argv);   /* tools/cmd_plot.c:  kiln plot LOG.jsonl -o loss.svg */
int kiln_cmd_train(int argc, char **argv);  /* tools/cmd_train.c: kiln train ... */
int kiln_cmd_chat(int argc, char **argv);   /* tools/cmd_chat.c:  kiln chat -m MODEL [--system TEXT] ... */
int kiln_bench_train(int argc, char **argv);/* bench/bench_train.c: kiln bench train */

/* Shared with kiln.c: prints "kiln: <last error>" to stderr and returns 1. */
int kiln_cli_die(int status);
/* *out = arg as a number in [lo, hi]; otherwise prints "kiln: CMD: FLAG needs a number ..." and returns false. */
bool kiln_cli_parse_num(const char *cmd, const char *flag, const char *arg, double lo, double hi, double *out);
/* The options generate and chat share: the session's -t, -c and -ngl (into sess) and the sampling flags (--temp
 * --top-k --top-p --min-p --repeat-penalty --repeat-last-n --seed). Returns 1 when flag f with value a was one and
 * parsed, 0 when it is not one of them, -1 after printing why its value is bad. The valueless --gpu (all layers on
 * the GPU, as -ngl 99) is kiln_cli_gpu_flag's. */
int kiln_cli_sampling_opt(const char *cmd, const char *f, const char *a, kiln_sampler_params *sp, kiln_session_params *sess);
/* True when f is --gpu, which it applies to sess. */
bool kiln_cli_gpu_flag(const char *f, kiln_session_params *sess);

#endif
