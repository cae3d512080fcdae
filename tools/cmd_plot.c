/* cmd_plot.c: placeholder until the command lands. */
#include "tools/cmd.h"
#include <stdio.h>
int kiln_cmd_plot(int argc, char **argv) {
    (void)argc, (void)argv;
    fprintf(stderr, "kiln: not implemented yet\n");
    return 1;
}
