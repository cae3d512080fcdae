/* cmd_data.c: `kiln data CORPUS... -t TOKENIZER.gguf -o DIR [--val-fraction F] [--shard-tokens N]`, tokenizing
 * corpora into the token shards and manifest that `kiln train` reads (kiln_data_write), with a summary on stderr.
 * The tokenizer is loaded through kiln_data_tokenizer_load, the check kiln train applies; `--` ends the options.
 * tests/test_data.c runs it through $KILN_BIN (set by `make test`) and reads the shards back. */
#include "kiln.h"
#include "tools/cmd.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char usage_line[] = "kiln: usage: kiln data CORPUS... -t TOKENIZER.gguf -o DIR [--val-fraction F (0.05)] [--shard-tokens N (100000000)] [--]\n";

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
    bool options = true; /* until "--": after it every argument is a corpus */
    for (int i = 0; i < argc; i++) {
        const char *f = argv[i], *a = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t n;
        if (!options || f[0] != '-' || !f[1]) corpora[n_corpora++] = f;
        else if (strcmp(f, "--") == 0) options = false;
        else if ((strcmp(f, "-t") == 0 || strcmp(f, "--tokenizer") == 0) && a) tok_path = a, i++;
        else if (strcmp(f, "-o") == 0 && a) out = a, i++;
        else if (strcmp(f, "--val-fraction") == 0 && a) {
            if (!kiln_cli_parse_num("data", f, a, 0, 1, &dp.val_fraction)) goto done;
            if (dp.val_fraction == 1) { /* [0, 1): a fraction of 1 would leave no training tokens */
                fprintf(stderr, "kiln: data: --val-fraction needs a number in [0, 1), got '1': it would leave no training tokens\n");
                goto done;
            }
            i++;
        } else if (strcmp(f, "--shard-tokens") == 0 && a) {
            if (!kiln_cli_parse_int("data", f, a, 1, INT64_MAX, &n)) goto done;
            dp.shard_tokens = n, i++;
        } else {
            fputs("kiln: data: unexpected argument '", stderr);
            kiln_cli_put_escaped(stderr, f);
            fputs("'\n", stderr);
            goto done;
        }
    }
    if (!tok_path || !out || n_corpora == 0) {
        fputs(usage_line, stderr);
        goto done;
    }
    kiln_status s = kiln_data_tokenizer_load(tok_path, &tok); /* what kiln train accepts, no more */
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
    fputs("kiln: ", stderr);
    kiln_cli_put_escaped(stderr, out);
    fprintf(stderr,
            ": %lld train tokens in %d shard%s, %lld val tokens in %d shard%s, from %d file%s (%.1f MiB, %.2f bytes/token, "
            "fingerprint %016llx) in %.2f s, %.0f tokens/s\n",
            (long long)st.n_train_tokens, st.n_train_shards, st.n_train_shards == 1 ? "" : "s", (long long)st.n_val_tokens, st.n_val_shards,
            st.n_val_shards == 1 ? "" : "s", n_corpora, n_corpora == 1 ? "" : "s", (double)st.n_bytes_in / (1 << 20),
            n ? (double)st.n_bytes_in / (double)n : 0.0, (unsigned long long)kiln_tokenizer_fingerprint(tok), sec, sec > 0 ? (double)n / sec : 0.0);
    rc = 0;
done:
    kiln_tokenizer_free(tok);
    free(corpora);
    return rc;
}
