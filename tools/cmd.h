/* cmd.h: the CLI's subcommands that live in files of their own (tools/cmd_*.c). Each takes the arguments
 * after its name and returns the process exit status; like kiln.c they are the only code that prints. What they
 * share with kiln.c is in tools/cli.h. */
#ifndef KILN_TOOLS_CMD_H
#define KILN_TOOLS_CMD_H

#include "kiln.h"
#include "tools/cli.h"

int kiln_cmd_data(int argc, char **argv);   /* tools/cmd_data.c:  kiln data CORPUS... -t TOK.gguf -o DIR */
int kiln_cmd_plot(int argc, char **argv);   /* tools/cmd_plot.c:  kiln plot LOG.jsonl -o loss.svg */
int kiln_cmd_train(int argc, char **argv);  /* tools/cmd_train.c: kiln train ... */
int kiln_cmd_chat(int argc, char **argv);   /* tools/cmd_chat.c:  kiln chat -m MODEL [--system TEXT] ... */
int kiln_cmd_inspect(int argc, char **argv);  /* tools/cmd_quantize.c: kiln inspect FILE.gguf [--all] */
int kiln_cmd_quantize(int argc, char **argv); /* tools/cmd_quantize.c: kiln quantize IN OUT --type T [--dry-run] */
int kiln_cmd_convert(int argc, char **argv); /* tools/cmd_convert.c: kiln convert llama2c|hf ... */
int kiln_cmd_serve(int argc, char **argv);   /* tools/cmd_serve.c: kiln serve -m MODEL [--port N] [-np SLOTS] ... */

#endif
