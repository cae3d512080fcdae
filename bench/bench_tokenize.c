/* bench_tokenize.c: `kiln bench tokenize`: single-thread encode throughput of a tokenizer on a whole text, and
 * the time byte-level BPE training takes. The peer (HuggingFace `tokenizers`, same vocab and text, same run) and
 * the id-for-id comparison with it live in bench/bench_tokenize.py, which runs this command as a subprocess.
 *
 * Encode: the file is read into memory and encoded as one string (add_special = false, parse_special = false),
 * as a user who tokenizes a document does; each repetition starts from an empty token list, so growing it is
 * part of the cost. MB/s counts input bytes (1 MB = 1e6 bytes). Repetitions continue until --min-time (1 s) has
 * elapsed and at least 3 were taken, or exactly --reps N; best and median are reported.
 * Train: kiln_bpe_train on the given corpora to --vocab N (specials and the 256 byte tokens included),
 * min frequency 2, one counting thread by default so it compares with a single-threaded peer.
 * Output: one JSON object per case on stdout, then a table (--json-only leaves the table out). */
#include "bench/bench.h"
#include "tools/cli.h"

#include "kiln.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_ITEMS 16 /* vocabs, texts or corpora named on one command line */

/* Reads a whole file into a malloc'd buffer (NUL-terminated; *len excludes the NUL). Prints the error. */
static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "kiln bench tokenize: cannot open '%s'\n", path);
        return NULL;
    }
    size_t cap = 1 << 20, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) break;
        n += fread(buf + n, 1, cap - 1 - n, f);
        if (n < cap - 1) break;
        if (cap > SIZE_MAX / 2) {
            free(buf);
            buf = NULL;
            break;
        }
        char *p = realloc(buf, cap *= 2);
        if (!p) free(buf);
        buf = p;
    }
    const bool err = ferror(f);
    fclose(f);
    if (!buf || err) {
        fprintf(stderr, "kiln bench tokenize: %s reading '%s' (%zu bytes read)\n", buf ? "I/O error" : "out of memory", path, n);
        free(buf);
        return NULL;
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

static int write_ids(const char *path, const kiln_tokens *ids) {
    FILE *f = fopen(path, "wb");
    const bool ok = f && fwrite(ids->ids, sizeof *ids->ids, ids->n, f) == ids->n;
    if ((f && fclose(f) != 0) || !ok) {
        fprintf(stderr, "kiln bench tokenize: cannot write %zu ids to '%s'\n", ids->n, path);
        return -1;
    }
    return 0;
}

/* FNV-1a over the ids' bytes: a fingerprint of the output, so two runs (or two builds) can be compared. */
static uint64_t fnv1a_ids(const kiln_tokens *ids) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < ids->n; i++) {
        const uint32_t v = (uint32_t)ids->ids[i];
        for (int b = 0; b < 4; b++) h = (h ^ (v >> (8 * b) & 0xff)) * 0x100000001b3ull;
    }
    return h;
}

/* Repetition policy shared by both modes: exactly `reps` when > 0, else until min_time and >= 3. */
typedef struct {
    int reps;
    double min_time;
} rep_policy;

static bool more_reps(const rep_policy *p, int done, double elapsed) {
    return p->reps > 0 ? done < p->reps : done < 3 || elapsed < p->min_time;
}

/* Appends t to the growable times array; false when out of memory. */
static bool push_time(double **times, int *n, int *cap, double t) {
    if (*n == *cap) {
        const int nc = *cap ? 2 * *cap : 16;
        double *p = realloc(*times, sizeof **times * (size_t)nc);
        if (!p) return false;
        *times = p, *cap = nc;
    }
    (*times)[(*n)++] = t;
    return true;
}

/* ---------------------------------------------------------------- encode */

typedef struct {
    const char *vocab, *text;
    char model[16]; /* copied: the tokenizer's own string goes with it */
    size_t bytes, tokens;
    int reps;
    double best_s, median_s;
} encode_result;

static int bench_encode(const char *vocab_path, const char *text_path, const rep_policy *pol, const char *ids_out,
                        encode_result *r) {
    int rc = 1;
    kiln_tokenizer *tok = NULL;
    kiln_tokens ids = {0};
    double *times = NULL;
    int n_times = 0, cap_times = 0;
    size_t len = 0;
    char *text = read_file(text_path, &len);
    if (!text) return 1;

    const double t_load = kiln_bench_now();
    kiln_status s = kiln_tokenizer_load_file(vocab_path, &tok);
    const double load_s = kiln_bench_now() - t_load;
    if (s) {
        const char *msg = kiln_last_error();
        if (*msg) fprintf(stderr, "kiln bench tokenize: %s\n", msg); /* the library's message names the file */
        else fprintf(stderr, "kiln bench tokenize: loading %s: %s\n", vocab_path, kiln_status_name(s));
        goto out;
    }

    const double start = kiln_bench_now();
    uint64_t hash = 0;
    while (more_reps(pol, n_times, kiln_bench_now() - start)) {
        kiln_tokens_free(&ids);
        ids = (kiln_tokens){0};
        const double a = kiln_bench_now();
        s = kiln_tokenizer_encode(tok, text, len, false, false, &ids);
        const double t = kiln_bench_now() - a;
        if (s) {
            const char *msg = kiln_last_error();
            fprintf(stderr, "kiln bench tokenize: encoding '%s' with %s: %s\n", text_path, vocab_path,
                    *msg ? msg : kiln_status_name(s));
            goto out;
        }
        /* the encoder must be a pure function of the text: a rep that differs is a bug, not noise */
        const uint64_t h = fnv1a_ids(&ids);
        if (n_times > 0 && (ids.n != r->tokens || h != hash)) {
            fprintf(stderr, "kiln bench tokenize: '%s' with %s: repetition %d gave %zu tokens (hash %016llx), the first "
                            "gave %zu (hash %016llx)\n", text_path, vocab_path, n_times + 1, ids.n, (unsigned long long)h,
                    r->tokens, (unsigned long long)hash);
            goto out;
        }
        r->tokens = ids.n, hash = h;
        if (!push_time(&times, &n_times, &cap_times, t)) {
            fprintf(stderr, "kiln bench tokenize: out of memory recording repetition times\n");
            goto out;
        }
    }
    if (ids_out && write_ids(ids_out, &ids) != 0) goto out;

    r->vocab = vocab_path, r->text = text_path;
    snprintf(r->model, sizeof r->model, "%s", kiln_tokenizer_model(tok));
    r->bytes = len, r->reps = n_times;
    r->median_s = kiln_bench_median(times, n_times);
    r->best_s = times[0];
    printf("{\"bench\":\"tokenize\",\"case\":\"encode\",\"vocab\":");
    kiln_bench_json_str(kiln_bench_base_name(vocab_path));
    printf(",\"model\":");
    kiln_bench_json_str(r->model);
    printf(",\"n_vocab\":%d,\"text\":", kiln_tokenizer_n_vocab(tok));
    kiln_bench_json_str(kiln_bench_base_name(text_path));
    printf(",\"bytes\":%zu,\"threads\":1,\"add_special\":false,\"parse_special\":false,\"reps\":%d,\"load_s\":%.6e,"
           "\"best_s\":%.6e,\"median_s\":%.6e,\"best_mbs\":%.3f,\"median_mbs\":%.3f,\"tokens\":%zu,"
           "\"bytes_per_token\":%.4f,\"ids_fnv1a\":\"%016llx\"",
           len, n_times, load_s, r->best_s, r->median_s, (double)len / r->best_s / 1e6, (double)len / r->median_s / 1e6,
           r->tokens, r->tokens ? (double)len / (double)r->tokens : 0.0, (unsigned long long)hash);
    if (ids_out) {
        printf(",\"ids_out\":");
        kiln_bench_json_str(ids_out);
    }
    printf("}\n");
    fflush(stdout);
    rc = 0;
out:
    kiln_tokens_free(&ids);
    kiln_tokenizer_free(tok);
    free(times);
    free(text);
    return rc;
}

/* ---------------------------------------------------------------- train */

static int bench_train(const char *const *corpus, int n_corpus, int32_t vocab_size, int64_t min_frequency, int n_threads,
                       const rep_policy *pol, const char *out_path, bool json_only) {
    char tmp_path[64];
    const bool keep = out_path != NULL;
    if (!out_path) {
        snprintf(tmp_path, sizeof tmp_path, "/tmp/kiln-bench-bpe-%ld.gguf", (long)getpid());
        out_path = tmp_path;
    }
    uint64_t corpus_bytes = 0;
    for (int i = 0; i < n_corpus; i++) {
        FILE *f = fopen(corpus[i], "rb");
        if (!f || fseek(f, 0, SEEK_END) != 0) {
            fprintf(stderr, "kiln bench tokenize: cannot open corpus '%s'\n", corpus[i]);
            if (f) fclose(f);
            return 1;
        }
        corpus_bytes += (uint64_t)ftell(f);
        fclose(f);
    }

    const kiln_bpe_train_params p = {.vocab_size = vocab_size, .min_frequency = min_frequency, .n_threads = n_threads};
    double *times = NULL;
    int n_times = 0, cap_times = 0, rc = 1;
    const double start = kiln_bench_now();
    while (more_reps(pol, n_times, kiln_bench_now() - start)) {
        const double a = kiln_bench_now();
        const kiln_status s = kiln_bpe_train(corpus, n_corpus, &p, out_path);
        const double t = kiln_bench_now() - a;
        if (s) {
            const char *msg = kiln_last_error();
            fprintf(stderr, "kiln bench tokenize: training %d-token BPE: %s\n", vocab_size, *msg ? msg : kiln_status_name(s));
            goto out;
        }
        if (!push_time(&times, &n_times, &cap_times, t)) {
            fprintf(stderr, "kiln bench tokenize: out of memory recording repetition times\n");
            goto out;
        }
    }

    /* the trained vocab must load and have the size asked for */
    kiln_tokenizer *tok = NULL;
    const kiln_status s = kiln_tokenizer_load_file(out_path, &tok);
    if (s) {
        const char *msg = kiln_last_error();
        fprintf(stderr, "kiln bench tokenize: the trained vocab %s does not load: %s\n", out_path, *msg ? msg : kiln_status_name(s));
        goto out;
    }
    const int32_t n_vocab_out = kiln_tokenizer_n_vocab(tok);
    kiln_tokenizer_free(tok);

    const double median = kiln_bench_median(times, n_times), best = times[0];
    printf("{\"bench\":\"tokenize\",\"case\":\"train\",\"algo\":\"bpe\",\"corpus\":[");
    for (int i = 0; i < n_corpus; i++) {
        if (i) putchar(',');
        kiln_bench_json_str(kiln_bench_base_name(corpus[i]));
    }
    printf("],\"corpus_bytes\":%llu,\"vocab_size\":%d,\"n_vocab_out\":%d,\"min_frequency\":%lld,\"threads\":%d,"
           "\"reps\":%d,\"best_s\":%.6e,\"median_s\":%.6e,\"best_mbs\":%.3f,\"out\":",
           (unsigned long long)corpus_bytes, vocab_size, n_vocab_out, (long long)min_frequency, n_threads, n_times, best,
           median, (double)corpus_bytes / best / 1e6);
    kiln_bench_json_str(keep ? out_path : "");
    printf("}\n");
    fflush(stdout);
    if (!json_only) {
        printf("\nkiln bench tokenize --train: byte-level BPE, min frequency %lld, %d counting thread(s) (0 = all cores)\n"
               "the HuggingFace BpeTrainer peer and the ratio: bench/bench_tokenize.py\n\n", (long long)min_frequency, n_threads);
        printf("%-10s %12s %8s %5s %9s %9s\n", "vocab", "corpus bytes", "files", "reps", "best s", "median s");
        printf("%-10d %12llu %8d %5d %9.3f %9.3f\n", n_vocab_out, (unsigned long long)corpus_bytes, n_corpus, n_times, best, median);
    }
    rc = 0;
out:
    if (!keep) remove(out_path);
    free(times);
    return rc;
}

/* ---------------------------------------------------------------- CLI */

static void usage(FILE *f) {
    fprintf(f, "usage: kiln bench tokenize -m VOCAB.gguf... --text FILE... [--reps N] [--min-time S] [--ids-out PATH] [--json-only]\n"
               "       kiln bench tokenize --train CORPUS... --vocab N [-t THREADS] [--min-frequency N] [--out PATH] [--reps N]\n"
               "  single-thread encode MB/s of each vocab on each whole text (add_special and parse_special off),\n"
               "  or the time of byte-level BPE training; bench/bench_tokenize.py adds the HuggingFace peer and the ratio\n"
               "  --reps N       exactly N repetitions (default: until --min-time, at least 3; train: 1)\n"
               "  --min-time S   seconds of repetitions per encode case (default 1)\n"
               "  --ids-out PATH write the ids of one encode case as raw native-endian int32\n"
               "  -t THREADS     training's counting threads (default 1: the peer is single-threaded; 0 = all cores)\n"
               "  --out PATH     keep the trained vocab there (default: a file in /tmp, removed)\n");
}

int kiln_bench_tokenize(int argc, char **argv) {
    const char *vocabs[MAX_ITEMS], *texts[MAX_ITEMS], *corpus[MAX_ITEMS], *cmd = "bench tokenize";
    int n_vocabs = 0, n_texts = 0, n_corpus = 0;
    const char **list = NULL; /* where a bare argument goes: after -m, --text or --train */
    int *list_n = NULL;
    const char *ids_out = NULL, *out_path = NULL;
    bool json_only = false, train = false, options = true;
    rep_policy pol = {.reps = 0, .min_time = 1.0};
    int64_t vocab_size = 0, threads = 1, min_frequency = 2, reps;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        /* the options that take a value */
        const bool valued = strcmp(a, "--reps") == 0 || strcmp(a, "--min-time") == 0 || strcmp(a, "--vocab") == 0 ||
                            strcmp(a, "-t") == 0 || strcmp(a, "--min-frequency") == 0 || strcmp(a, "--ids-out") == 0 ||
                            strcmp(a, "--out") == 0;
        if (!options || !kiln_cli_is_option(a)) { /* a file of the list the last -m, --text or --train began */
            if (!list) return kiln_cli_error("%s: unexpected argument '%s'", cmd, a);
            if (*list_n == MAX_ITEMS) return kiln_cli_error("%s: more than %d files after one option", cmd, MAX_ITEMS);
            list[(*list_n)++] = a;
        } else if (strcmp(a, "--") == 0) options = false;
        else if (strcmp(a, "-m") == 0) list = vocabs, list_n = &n_vocabs;
        else if (strcmp(a, "--text") == 0) list = texts, list_n = &n_texts;
        else if (strcmp(a, "--train") == 0) list = corpus, list_n = &n_corpus, train = true;
        else if (strcmp(a, "--json-only") == 0) json_only = true;
        else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (!valued) return kiln_cli_unknown(cmd, a);
        else if (!(v = kiln_cli_value(cmd, argc, argv, &i))) return 1;
        else if (strcmp(a, "--reps") == 0) {
            if (!kiln_cli_parse_int(cmd, a, v, 1, 1000000, &reps)) return 1;
            pol.reps = (int)reps;
        } else if (strcmp(a, "--min-time") == 0) {
            if (!kiln_cli_parse_num(cmd, a, v, 0, 3600, &pol.min_time)) return 1;
        } else if (strcmp(a, "--vocab") == 0) {
            if (!kiln_cli_parse_int(cmd, a, v, 257, INT32_MAX, &vocab_size)) return 1;
        } else if (strcmp(a, "-t") == 0) {
            if (!kiln_cli_parse_int(cmd, a, v, 0, 4096, &threads)) return 1;
        } else if (strcmp(a, "--min-frequency") == 0) {
            if (!kiln_cli_parse_int(cmd, a, v, 0, INT32_MAX, &min_frequency)) return 1;
        } else if (strcmp(a, "--ids-out") == 0) ids_out = v;
        else out_path = v; /* --out */
    }

    if (train) {
        if (n_corpus == 0 || vocab_size == 0 || n_vocabs || n_texts || ids_out) {
            fprintf(stderr, "kiln: bench tokenize: --train needs CORPUS files and --vocab N, and no -m, --text or --ids-out\n");
            return 1;
        }
        if (pol.reps == 0) pol.reps = 1; /* seconds per run: one is the measurement */
        return bench_train(corpus, n_corpus, (int32_t)vocab_size, min_frequency, (int)threads, &pol, out_path, json_only);
    }

    if (n_vocabs == 0 || n_texts == 0) {
        fprintf(stderr, "kiln: bench tokenize: need -m VOCAB.gguf and --text FILE (kiln bench tokenize --help)\n");
        return 1;
    }
    if (ids_out && n_vocabs * n_texts != 1) {
        fprintf(stderr, "kiln: bench tokenize: --ids-out takes one vocab and one text (got %d x %d)\n", n_vocabs, n_texts);
        return 1;
    }
    encode_result res[MAX_ITEMS * MAX_ITEMS];
    int n_res = 0;
    for (int vi = 0; vi < n_vocabs; vi++)
        for (int ti = 0; ti < n_texts; ti++) {
            encode_result *r = &res[n_res];
            *r = (encode_result){0};
            if (bench_encode(vocabs[vi], texts[ti], &pol, ids_out, r) != 0) return 1;
            n_res++;
        }
    if (json_only) return 0;

    printf("\nkiln bench tokenize: single thread, whole text encoded as one string, add_special = parse_special = false\n");
    printf("MB/s = input bytes (1e6) per second; the HuggingFace peer and the ratio: bench/bench_tokenize.py\n\n");
    printf("%-28s %-6s %-26s %10s %5s %9s %9s %10s %8s\n", "vocab", "model", "text", "bytes", "reps", "best MB/s",
           "med MB/s", "tokens", "B/token");
    for (int i = 0; i < n_res; i++) {
        const encode_result *r = &res[i];
        printf("%-28s %-6s %-26s %10zu %5d %9.2f %9.2f %10zu %8.3f\n", kiln_bench_base_name(r->vocab), r->model, kiln_bench_base_name(r->text),
               r->bytes, r->reps, (double)r->bytes / r->best_s / 1e6, (double)r->bytes / r->median_s / 1e6, r->tokens,
               r->tokens ? (double)r->bytes / (double)r->tokens : 0.0);
    }
    return 0;
}
