/* cli.h: what the CLI's commands (tools/kiln.c, tools/cmd_*.c, bench/bench_train.c) share: the error exit and the
 * flag parsers of tools/cli.c. It depends on kiln.h and on none of the commands. */
#ifndef KILN_TOOLS_CLI_H
#define KILN_TOOLS_CLI_H

#include "kiln.h"

#include <stdio.h>

/* Prints "kiln: <last error>" (or the status name when there is no message) to stderr and returns 1. */
int kiln_cli_die(kiln_status s);
/* The one strict number parser of every flag. The whole of arg must be a decimal number (no hex, no "nan"/"inf",
 * no trailing text), finite and in [lo, hi]; otherwise it prints "kiln: CMD: FLAG needs a finite number in
 * [lo, hi], got 'ARG'" (ARG escaped) and returns false. _int takes integers only ("2.5" and "1e3" are refused);
 * _u64 the full unsigned 64-bit range (seeds). */
bool kiln_cli_parse_num(const char *cmd, const char *flag, const char *arg, double lo, double hi, double *out);
bool kiln_cli_parse_int(const char *cmd, const char *flag, const char *arg, int64_t lo, int64_t hi, int64_t *out);
bool kiln_cli_parse_u64(const char *cmd, const char *flag, const char *arg, uint64_t *out);
/* Writes s with control bytes, quotes and malformed UTF-8 escaped (\n, \t, \xNN): for anything printed that came
 * from a file, the network or the command line. */
void kiln_cli_put_escaped(FILE *f, const char *s);
/* The n bytes of s (NULs too) between double quotes, escaped as above: a string value of a file. */
void kiln_cli_put_quoted(FILE *f, const char *s, size_t n);
/* s escaped, then spaces up to width bytes (as printf's %-*s): a name from a file in a table column. */
void kiln_cli_put_padded(FILE *f, const char *s, int width);
/* Prints "kiln: MESSAGE" to stderr with the message's control bytes and malformed UTF-8 escaped (as kiln_fail does
 * for the library's) and returns 1: for a CLI message that names a file or an argument. */
int kiln_cli_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The bundled default model's path (models/shakespeare.gguf beside the binary, else in the current folder) into buf,
 * or NULL when neither is there. */
const char *kiln_cli_default_model(char *buf, size_t n);
/* The same for a line that reports what was done ("kiln: wrote OUT.gguf"). */
void kiln_cli_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---------------------------------------------------------------- options */

/* One option of a command, for kiln_cli_parse_args: its name ("-n", "--temp"), what it holds, where it goes and its
 * bounds. Another spelling of the same flag (llama.cpp's --n-predict for -n) is one more row with the same out. A FLAG
 * takes no value and sets *(bool *)out. The others take the next argument, whatever it starts with: STR keeps it (const char **),
 * LIST appends it to a kiln_cli_list (a flag given several times: -r), INT (int, int32_t) and I64 (int64_t) parse
 * it with kiln_cli_parse_int in [lo, hi], FLOAT and DOUBLE with kiln_cli_parse_num, U64 (uint64_t, lo and hi
 * unused) with kiln_cli_parse_u64. An error names the flag as it was typed. */
typedef enum {
    KILN_CLI_FLAG, KILN_CLI_STR, KILN_CLI_LIST, KILN_CLI_INT, KILN_CLI_I64, KILN_CLI_FLOAT, KILN_CLI_DOUBLE, KILN_CLI_U64,
    KILN_CLI_KV_TYPE, /* a KV-cache type name (kiln_kv_type_from_name) into a kiln_kv_type */
} kiln_cli_kind;
typedef struct {
    const char *name;
    kiln_cli_kind kind;
    void *out;
    double lo, hi;
} kiln_cli_opt;

/* The values of a LIST option, in the order given; a 17th is refused, naming the flag. */
#define KILN_CLI_LIST_MAX 16
typedef struct {
    const char *v[KILN_CLI_LIST_MAX];
    int n;
} kiln_cli_list;

/* Reads cmd's arguments argv[0..argc): an argument that starts with '-' ("-" alone does not) is one of opts, until
 * "--", after which every argument is positional; the positionals go to pos[0..*n_pos), at most max_pos. A repeated
 * option keeps its last value (a LIST keeps them all). --version, unless opts has it, prints kiln's version to
 * stdout and exits 0. On an unknown option, a missing or bad value or one positional too many it prints one line
 * naming it ("kiln: CMD: unknown option '-x' (did you mean -c?)", "kiln: CMD: -n needs a value") and returns
 * false. */
bool kiln_cli_parse_args(const char *cmd, int argc, char **argv, const kiln_cli_opt *opts, int n_opts, const char **pos,
                         int max_pos, int *n_pos);
/* For commands that walk argv themselves (bench): whether arg is an option ('-' and more), the value of the option
 * argv[*i] (argv[*i + 1], *i moved onto it; NULL after printing "kiln: CMD: FLAG needs a value"), and the error of an
 * argument that is not one of cmd's (an unknown option or an unexpected argument, escaped; returns 1). */
bool kiln_cli_is_option(const char *arg);
const char *kiln_cli_value(const char *cmd, int argc, char **argv, int *i);
int kiln_cli_unknown(const char *cmd, const char *arg);
/* When arg is "--version": prints "kiln VERSION" (KILN_VERSION, include/kiln.h: the one place the build reads it)
 * to stdout and returns true. */
bool kiln_cli_version(const char *arg);

/* Generated text on its way to stdout, with the stop strings (-r) of generate and chat: the bytes that could begin
 * one are held back until the next piece shows whether they do, so a stop string split across tokens is found and
 * never printed. p[0..n) is the text so far, p[0..printed) what stdout has; zero it to start (stops may be NULL or an
 * empty list), free p after. */
typedef struct {
    char *p;
    size_t n, cap, printed;
    const kiln_cli_list *stops;
} kiln_cli_stream;
/* Appends n bytes and prints what can no longer be part of a stop string. Returns true when the text now holds one:
 * the text before it is printed (printed is where it begins) and the rest never is. False with *err set when out of
 * memory. */
bool kiln_cli_stream_add(kiln_cli_stream *g, const char *s, size_t n, kiln_status *err);
/* Prints what was held back for a stop string that never came. */
void kiln_cli_stream_flush(kiln_cli_stream *g);

/* The options generate and chat share, with llama.cpp's spellings: the session's -t/--threads, -c/--ctx-size,
 * -b/--batch-size and -ngl/--gpu-layers/--n-gpu-layers, and the sampling flags --temp/--temperature, --top-k,
 * --top-p, --min-p, --repeat-penalty, --repeat-last-n, --presence-penalty, --frequency-penalty and --seed/-s,
 * written into sp and sess. Fills opts[0..KILN_CLI_N_SAMPLING) and returns KILN_CLI_N_SAMPLING. */
#define KILN_CLI_N_SAMPLING 20
int kiln_cli_sampling_opts(kiln_cli_opt *opts, kiln_sampler_params *sp, kiln_session_params *sess);
/* True when f is --gpu, which it applies to sess. */
bool kiln_cli_gpu_flag(const char *f, kiln_session_params *sess);
/* llama.cpp's RoPE overrides, for generate, chat, perplexity and bench: --rope-scaling {none,linear,yarn},
 * --rope-scale N (freq_scale 1/N), --rope-freq-base, --rope-freq-scale, --yarn-orig-ctx, --yarn-ext-factor,
 * --yarn-attn-factor, --yarn-beta-slow, --yarn-beta-fast, into r (kiln_cli_rope_init first). Fills
 * opts[0..KILN_CLI_N_ROPE) and returns KILN_CLI_N_ROPE; kiln_cli_rope_opt takes them one at a time
 * (bench's own loops). kiln_cli_rope_apply checks --rope-scaling's name and applies r to a loaded model
 * (kiln_model_set_rope), printing the error and returning false when it fails. */
#define KILN_CLI_N_ROPE 9
typedef struct kiln_cli_rope {
    kiln_rope_overrides ov;
    const char *scaling; /* --rope-scaling, checked by kiln_cli_rope_apply */
    float rope_scale;    /* --rope-scale; 0: unset */
} kiln_cli_rope;
void kiln_cli_rope_init(kiln_cli_rope *r);
int kiln_cli_rope_opts(kiln_cli_opt *opts, kiln_cli_rope *r);
int kiln_cli_rope_opt(const char *cmd, const char *f, const char *a, kiln_cli_rope *r);
bool kiln_cli_rope_apply(const char *cmd, kiln_cli_rope *r, kiln_model *m);
/* llama.cpp's KV-cache types, for generate, chat, perplexity, bench and serve: -ctk/--cache-type-k and
 * -ctv/--cache-type-v (f16, f32, bf16, q8_0, q4_0) into sess->type_k and type_v. Fills opts[0..KILN_CLI_N_KV) and
 * returns KILN_CLI_N_KV; kiln_cli_kv_opt takes them one at a time (bench's own loops: 1 when f was one and a parsed,
 * 0 when f is another flag, -1 after printing the error). */
#define KILN_CLI_N_KV 4
int kiln_cli_kv_opts(kiln_cli_opt *opts, kiln_session_params *sess);
int kiln_cli_kv_opt(const char *cmd, const char *f, const char *a, kiln_session_params *sess);
/* The bytes of file path, NUL-terminated, in a malloc'd buffer (*len: without the NUL); NULL after printing why. */
char *kiln_cli_read_file(const char *cmd, const char *path, size_t *len);
/* The constrained-output flags of generate and chat: --grammar GBNF, --grammar-file F, --json-schema SCHEMA and
 * --json-schema-file F, at most one of them. Fills opts[0..KILN_CLI_N_GRAMMAR) and returns KILN_CLI_N_GRAMMAR.
 * kiln_cli_grammar_load parses the one given into *out (NULL when none; kiln_grammar_free after), a schema through
 * kiln_json_schema_to_gbnf; false after printing why: two of them, a file that cannot be read, a malformed grammar
 * or schema (with its position, and the file's name). */
#define KILN_CLI_N_GRAMMAR 4
typedef struct kiln_cli_grammar {
    const char *grammar, *grammar_file, *schema, *schema_file;
} kiln_cli_grammar;
int kiln_cli_grammar_opts(kiln_cli_opt *opts, kiln_cli_grammar *g);
bool kiln_cli_grammar_given(const kiln_cli_grammar *g);
bool kiln_cli_grammar_load(const char *cmd, const kiln_cli_grammar *g, kiln_grammar **out);
/* A kiln_progress_fn (user unused) that reports on stderr in the stage's unit ("[ 100/ 440 merges]",
 * "[3/12] ppl 5.1234", "[1.0/4.0 MiB]"): on a terminal it rewrites one line per call (\r), ending it when done
 * reaches total; otherwise (a log, a pipe) it writes whole lines, at most one per percent of the total. */
void kiln_cli_progress(void *user, const kiln_progress *p);
/* Whether progress may use \r: stderr is a terminal. */
bool kiln_cli_progress_tty(void);

#endif
