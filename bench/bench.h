/* bench.h: benchmark drivers linked into the kiln CLI (`kiln bench NAME`). Each prints one JSON object
 * per case on stdout, then a table, and returns the process exit status. */
#ifndef KILN_BENCH_H
#define KILN_BENCH_H

int kiln_bench_quant(int argc, char **argv);
int kiln_bench_tokenize(int argc, char **argv);
int kiln_bench_model(int argc, char **argv);

#endif
