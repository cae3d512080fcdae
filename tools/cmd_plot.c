/* cmd_plot.c: `kiln plot LOG.jsonl -o loss.svg [--title T]`, the loss curves of a training log as an SVG
 * (tools/plot.c draws it; tests/test_data.c tests it). */
#include "kiln.h"
#include "tools/cmd.h"
#include "tools/plot.h"

#include <stdio.h>
#include <string.h>

int kiln_cmd_plot(int argc, char **argv) {
    const char *log = NULL, *out = NULL, *title = NULL;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "-o") == 0 && i + 1 < argc) out = argv[++i];
        else if (strcmp(argv[i], "--title") == 0 && i + 1 < argc) title = argv[++i];
        else if (argv[i][0] != '-' && !log) log = argv[i];
        else {
            fprintf(stderr, "kiln: plot: unexpected argument '%s'\n", argv[i]);
            return 1;
        }
    }
    if (!log || !out) {
        fprintf(stderr, "kiln: usage: kiln plot LOG.jsonl -o loss.svg [--title T]\n");
        return 1;
    }
    kiln_status s = kiln_plot_loss_svg(log, out, title);
    if (s) return kiln_cli_die(s);
    fprintf(stderr, "kiln: wrote %s\n", out);
    return 0;
}
