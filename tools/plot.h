/* plot.h: `kiln plot` (tools/plot.c, tested by tests/test_data.c). */
#ifndef KILN_TOOLS_PLOT_H
#define KILN_TOOLS_PLOT_H

#include "kiln.h"

/* `kiln plot`: reads a training log (JSONL; lines with "step" and "loss" are training points, lines with
 * "step" and "val_loss" validation points; other lines and keys are ignored) and writes an SVG of both loss
 * curves against the step, with axes, ticks, labels, a title and a legend. Malformed lines are an error
 * naming the line. */
kiln_status kiln_plot_loss_svg(const char *log_path, const char *svg_path, const char *title);

#endif
