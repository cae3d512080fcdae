/* bench_train.c: placeholder until the training benchmark lands. */
#include "tools/cmd.h"
#include <stdio.h>
int kiln_bench_train(int argc, char **argv) {
    (void)argc, (void)argv;
    fprintf(stderr, "kiln: not implemented yet\n");
    return 1;
}
