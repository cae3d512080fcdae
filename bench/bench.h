/* bench.h: benchmark drivers linked into the kiln CLI (`kiln bench NAME`). Each prints one JSON object
 * per case on stdout, then a table, and returns the process exit status. */
#ifndef KILN_BENCH_H
#define KILN_BENCH_H

#include <stddef.h>
#include <stdint.h>

int kiln_bench_quant(int argc, char **argv);
int kiln_bench_tokenize(int argc, char **argv);
int kiln_bench_grammar(int argc, char **argv);
int kiln_bench_spec(int argc, char **argv); /* bench_spec.c: kiln bench spec, speculative decoding against plain */
int kiln_bench_model(int argc, char **argv);
int kiln_bench_gpu(int argc, char **argv); /* bench_gpu.c: kiln bench --gpu -m MODEL ... */
int kiln_bench_gpu_kernels(int argc, char **argv); /* bench_gpu_kernels.c: kiln bench gpu-kernels */
int kiln_bench_train(int argc, char **argv); /* bench_train.c: kiln bench train */
int kiln_bench_serve(int argc, char **argv); /* bench_serve.c: kiln bench serve, an HTTP server under streaming load */

/* bench_util.c: what every driver shares */
double kiln_bench_now(void);                    /* seconds, CLOCK_MONOTONIC */
double kiln_bench_median(double *t, int n);     /* sorts t[0..n) and returns its median */
const char *kiln_bench_base_name(const char *path);
void kiln_bench_json_str(const char *s);        /* prints s as a JSON string */
/* v with prec decimals into buf (n bytes), or "null" when v is not finite (a peer not run, a ratio without one):
 * JSON has no NaN. Returns buf. */
const char *kiln_bench_json_num(char *buf, size_t n, double v, int prec);
/* out[0..*n) = the comma-separated integers of s, each in [lo, hi] and read by kiln_cli_parse_int, at most
 * max_items; else prints why in one line naming the command cmd and the option opt and returns -1. */
int kiln_bench_parse_list(const char *cmd, const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *out, int max_items,
                          int *n);

#endif
