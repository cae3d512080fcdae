/* cli.h: what the CLI's commands (tools/kiln.c, tools/cmd_*.c, bench/bench_train.c) share: the error exit and the
 * flag parsers of tools/cli.c. It depends on kiln.h and on none of the commands. */
#ifndef KILN_TOOLS_CLI_H
#define KILN_TOOLS_CLI_H

#include "kiln.h"

#include <stdio.h>

/* Prints "kiln: <last error>" (or the status name when there is no message) to stderr and returns 1. */
int kiln_cli_die(kiln_status s);
/* The one strict number parser of every flag. The whole of arg must be a decimal number (no hex, no "nan"/"inf",
 * no trailing text), finite and in [lo, hi]; otherwise it prints "kiln: CMD: FLAG needs a finite number in
 * [lo, hi], got 'ARG'" (ARG escaped) and returns false. _int takes integers only ("2.5" and "1e3" are refused);
 * _u64 the full unsigned 64-bit range (seeds). */
bool kiln_cli_parse_num(const char *cmd, const char *flag, const char *arg, double lo, double hi, double *out);
bool kiln_cli_parse_int(const char *cmd, const char *flag, const char *arg, int64_t lo, int64_t hi, int64_t *out);
bool kiln_cli_parse_u64(const char *cmd, const char *flag, const char *arg, uint64_t *out);
/* Writes s with control bytes, quotes and malformed UTF-8 escaped (\n, \t, \xNN): for anything printed that came
 * from a file, the network or the command line. */
void kiln_cli_put_escaped(FILE *f, const char *s);
/* The options generate and chat share: the session's -t, -c and -ngl (into sess) and the sampling flags (--temp
 * --top-k --top-p --min-p --repeat-penalty --repeat-last-n --seed). Returns 1 when flag f with value a was one and
 * parsed, 0 when it is not one of them, -1 after printing why its value is bad. The valueless --gpu (all layers on
 * the GPU, as -ngl 99) is kiln_cli_gpu_flag's. */
int kiln_cli_sampling_opt(const char *cmd, const char *f, const char *a, kiln_sampler_params *sp, kiln_session_params *sess);
/* True when f is --gpu, which it applies to sess. */
bool kiln_cli_gpu_flag(const char *f, kiln_session_params *sess);
/* A kiln_progress_fn (user unused) that rewrites one stderr line per call, in the stage's unit ("[ 100/ 440 merges]",
 * "[3/12] ppl 5.1234", "[1.0/4.0 MiB]"), ending it when done reaches total. */
void kiln_cli_progress(void *user, const kiln_progress *p);

#endif
