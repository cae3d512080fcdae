/* bench_gpu_kernels.c: placeholder (helper mv2 writes it). */
#include "bench/bench.h"
#include <stdio.h>
int kiln_bench_gpu_kernels(int argc, char **argv) {
    fprintf(stderr, "kiln: bench gpu-kernels: not written yet\n");
    return 1;
}
