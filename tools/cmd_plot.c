/* cmd_plot.c: `kiln plot LOG.jsonl -o loss.svg [--title T]`, the loss curves of a training log as an SVG
 * (tools/plot.c draws it; tests/test_data.c tests it). */
#include "kiln.h"
#include "tools/cmd.h"
#include "tools/plot.h"

#include <stdio.h>
#include <string.h>

int kiln_cmd_plot(int argc, char **argv) {
    const char *log = NULL, *out = NULL, *title = NULL;
    const kiln_cli_opt opts[] = {{"-o", KILN_CLI_STR, &out, 0, 0}, {"--title", KILN_CLI_STR, &title, 0, 0}};
    int n_pos;
    if (!kiln_cli_parse_args("plot", argc, argv, opts, 2, &log, 1, &n_pos)) return 1;
    if (!log || !out) {
        fprintf(stderr, "kiln: usage: kiln plot LOG.jsonl -o loss.svg [--title T]\n");
        return 1;
    }
    kiln_status s = kiln_plot_loss_svg(log, out, title);
    if (s) return kiln_cli_die(s);
    kiln_cli_note("wrote %s", out);
    return 0;
}
