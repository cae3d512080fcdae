/* cmd.h: the CLI's subcommands that live in files of their own (tools/cmd_*.c). Each takes the arguments
 * after its name and returns the process exit status; like kiln.c they are the only code that prints. */
#ifndef KILN_TOOLS_CMD_H
#define KILN_TOOLS_CMD_H

int kiln_cmd_data(int argc, char **argv);   /* tools/cmd_data.c:  kiln data CORPUS... -t TOK.gguf -o DIR */
int kiln_cmd_plot(int argc, char **argv);   /* tools/cmd_plot.c:  kiln plot LOG.jsonl -o loss.svg */
int kiln_cmd_train(int argc, char **argv);  /* tools/cmd_train.c: kiln train ... */
int kiln_cmd_chat(int argc, char **argv);   /* tools/cmd_chat.c:  kiln chat -m MODEL [--system TEXT] ... */
int kiln_bench_train(int argc, char **argv);/* bench/bench_train.c: kiln bench train */

/* Shared with kiln.c: prints "kiln: <last error>" to stderr and returns 1. */
int kiln_cli_die(int status);

#endif
