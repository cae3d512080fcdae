/* cmd_data.c: `kiln data CORPUS... -t TOKENIZER.gguf -o DIR [--val-fraction F] [--shard-tokens N]`, tokenizing
 * corpora into the token shards that `kiln train` reads (kiln_data_write), with a summary on stderr.
 * tests/test_data.c runs it through $KILN_BIN (set by `make test`) and reads the shards back. */
#include "kiln.h"
#include "tools/cmd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char usage_line[] = "kiln: usage: kiln data CORPUS... -t TOKENIZER.gguf -o DIR [--val-fraction F (0.05)] [--shard-tokens N (100000000)]\n";

static bool parse_f64(const char *s, double *out) {
    char *e;
    *out = strtod(s, &e);
    return *s && !*e;
}

static bool parse_i64(const char *s, int64_t *out) {
    char *e;
    long long v = strtoll(s, &e, 10);
    *out = v;
    return *s && !*e;
}

int kiln_cmd_data(int argc, char **argv) {
    const char *tok_path = NULL, *out = NULL;
    kiln_data_params dp = kiln_data_default();
    dp.progress = kiln_cli_progress;
    const char **corpora = calloc((size_t)argc + 1, sizeof *corpora);
    int n_corpora = 0, rc = 1;
    kiln_tokenizer *tok = NULL;
    if (!corpora) {
        fprintf(stderr, "kiln: data: out of memory\n");
        return 1;
    }
    for (int i = 0; i < argc; i++) {
        if ((strcmp(argv[i], "-t") == 0 || strcmp(argv[i], "--tokenizer") == 0) && i + 1 < argc) tok_path = argv[++i];
        else if (strcmp(argv[i], "-o") == 0 && i + 1 < argc) out = argv[++i];
        else if (strcmp(argv[i], "--val-fraction") == 0 && i + 1 < argc) {
            if (!parse_f64(argv[++i], &dp.val_fraction) || !(dp.val_fraction >= 0 && dp.val_fraction < 1)) {
                fprintf(stderr, "kiln: data: --val-fraction '%s' is not a number in [0, 1)\n", argv[i]);
                goto done;
            }
        } else if (strcmp(argv[i], "--shard-tokens") == 0 && i + 1 < argc) {
            if (!parse_i64(argv[++i], &dp.shard_tokens) || dp.shard_tokens <= 0) {
                fprintf(stderr, "kiln: data: --shard-tokens '%s' is not a positive integer\n", argv[i]);
                goto done;
            }
        } else if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(stderr, "kiln: data: unexpected argument '%s'\n", argv[i]);
            goto done;
        } else corpora[n_corpora++] = argv[i];
    }
    if (!tok_path || !out || n_corpora == 0) {
        fputs(usage_line, stderr);
        goto done;
    }
    kiln_status s = kiln_tokenizer_load_file(tok_path, &tok);
    if (s) {
        kiln_cli_die(s);
        goto done;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    kiln_data_stats st;
    s = kiln_data_write(corpora, n_corpora, tok, out, &dp, &st);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (s) {
        kiln_cli_die(s);
        goto done;
    }
    double sec = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    int64_t n = st.n_train_tokens + st.n_val_tokens;
    fprintf(stderr,
            "kiln: %s: %lld train tokens in %d shard%s, %lld val tokens in %d shard%s, from %d file%s (%.1f MiB, %.2f bytes/token, "
            "fingerprint %016llx) in %.2f s, %.0f tokens/s\n",
            out, (long long)st.n_train_tokens, st.n_train_shards, st.n_train_shards == 1 ? "" : "s", (long long)st.n_val_tokens, st.n_val_shards,
            st.n_val_shards == 1 ? "" : "s", n_corpora, n_corpora == 1 ? "" : "s", (double)st.n_bytes_in / (1 << 20),
            n ? (double)st.n_bytes_in / (double)n : 0.0, (unsigned long long)kiln_tokenizer_fingerprint(tok), sec, sec > 0 ? (double)n / sec : 0.0);
    rc = 0;
done:
    kiln_tokenizer_free(tok);
    free(corpora);
    return rc;
}
