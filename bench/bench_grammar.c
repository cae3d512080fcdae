/* bench_grammar.c: `kiln bench grammar [--vocab F.gguf]... [--walks N]`: the time of one allowed-token mask
 * (kiln_grammar_matcher_mask) under fixed grammars, on each vocab (the bundled model's without --vocab).
 *
 * Each case runs N walks (default 20) on one matcher over a vocab built once (kiln_grammar_vocab_new, as a server
 * shares it), reset between walks, so its memory of stacks, frames and class tables carries over (cached reports the
 * share of stack masks taken from it): random logits (xorshift64*, seeded per walk), the mask, the greedy pick,
 * accept, until EOS or 200 tokens; every mask call is timed alone on the monotonic clock. The first mask and the
 * first walk (the sum of its masks) are what a fresh grammar costs, as a server pays per request.
 * The grammars:
 *   json    an object of up to 3 members with scalar or array values (strings of up to 8 characters with escapes)
 *   text    a line of free text up to 120 characters, then a newline: nearly every token allowed at every step
 *   expr    arithmetic: numbers, identifiers, + - * / and parentheses
 *   person, order, event   JSON schemas (kiln_json_schema_to_gbnf) with unbounded strings, bounded integers, enums,
 *           arrays, nested objects, uuid, date and pattern strings
 * Output: one JSON object per case on stdout ({"bench":"grammar", vocab, n_vocab, grammar, masks, mean_us, p50_us,
 * p99_us, max_us, first_mask_us, first_walk_ms, later_mean_us, tokens_per_walk, cache_hit_rate}), then a table. */
#include "bench/bench.h"
#include "tools/cli.h"

#include "kiln.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_VOCABS 16

/* GBNF, or a JSON Schema turned into GBNF by kiln_json_schema_to_gbnf (schema set) */
static const struct {
    const char *name, *text;
    bool schema;
} grammars[] = {
    {"json", "root   ::= \"{\" ws ( member ( \",\" ws member ){0,2} )? \"}\"\n"
             "member ::= key ws \":\" ws value ws\n"
             "key    ::= \"\\\"\" [a-z_]{1,6} \"\\\"\"\n"
             "value  ::= number | str | \"true\" | \"false\" | \"null\" | arr\n"
             "arr    ::= \"[\" ws ( number ws ( \",\" ws number ws ){0,2} )? \"]\"\n"
             "str    ::= \"\\\"\" ( [^\"\\\\\\x00-\\x1f] | \"\\\\\" [\"\\\\/nt] ){0,8} \"\\\"\"\n"
             "number ::= \"-\"? ( \"0\" | [1-9] [0-9]{0,3} ) ( \".\" [0-9]{1,3} )?\n"
             "ws     ::= \" \"?\n", false},
    {"text", "root ::= [^\\n]{1,120} \"\\n\"\n", false},
    {"expr", "root ::= expr \"\\n\"\nexpr ::= term ( ws [-+*/] ws term ){0,6}\n"
             "term ::= [0-9]{1,4} | [a-z]{1,5} | \"(\" ws expr ws \")\"\nws ::= \" \"?\n", false},
    {"person", "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
               "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":150},\"email\":{\"type\":\"string\"},"
               "\"role\":{\"enum\":[\"admin\",\"user\",\"guest\"]},"
               "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"maxItems\":5}},"
               "\"required\":[\"name\",\"age\",\"role\"]}", true},
    {"order", "{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"string\",\"format\":\"uuid\"},"
              "\"customer\":{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
              "\"address\":{\"type\":\"object\",\"properties\":{\"street\":{\"type\":\"string\"},\"city\":{\"type\":\"string\"},"
              "\"zip\":{\"type\":\"string\",\"pattern\":\"^[0-9]{5}$\"}},\"required\":[\"street\",\"city\"]}},"
              "\"required\":[\"name\"]},"
              "\"items\":{\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":{\"sku\":{\"type\":\"string\"},"
              "\"qty\":{\"type\":\"integer\",\"minimum\":1},\"price\":{\"type\":\"number\"}},\"required\":[\"sku\",\"qty\"]},"
              "\"minItems\":1,\"maxItems\":10},\"paid\":{\"type\":\"boolean\"}},\"required\":[\"id\",\"customer\",\"items\"]}", true},
    {"event", "{\"type\":\"object\",\"properties\":{\"title\":{\"type\":\"string\"},\"date\":{\"type\":\"string\",\"format\":\"date\"},"
              "\"priority\":{\"type\":\"string\",\"enum\":[\"low\",\"medium\",\"high\"]},"
              "\"attendees\":{\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
              "\"rsvp\":{\"type\":\"boolean\"}},\"required\":[\"name\"]}},\"notes\":{\"type\":[\"string\",\"null\"]}},"
              "\"required\":[\"title\",\"date\"]}", true},
};

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s >> 12, *s ^= *s << 25, *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef struct {
    const char *vocab, *grammar;
    int32_t n_vocab;
    int64_t masks;
    double mean_us, p50_us, p99_us, max_us, tokens_per_walk, hit_rate;
    double first_mask_us, first_walk_ms, later_mean_us; /* a fresh matcher's first mask and first walk; walks 2.. */
} result;

/* walks walks of one grammar over one vocab into r. */
static kiln_status run_case(const kiln_grammar *g, const kiln_tokenizer *tok, const kiln_grammar_vocab *gv, int walks, result *r) {
    const int32_t V = kiln_tokenizer_n_vocab(tok), eos = kiln_tokenizer_eos(tok);
    float *lg = malloc((size_t)V * sizeof *lg);
    double *t = malloc((size_t)walks * 200 * sizeof *t);
    kiln_grammar_matcher *m = NULL;
    kiln_status st = lg && t ? kiln_grammar_matcher_new_vocab(g, gv, &m) : kiln_fail(KILN_ERR_NOMEM, "bench grammar: out of memory");
    int64_t n = 0, tokens = 0, n_first = 0;
    for (int w = 0; !st && w < walks; w++) {
        if (w == 1) n_first = n;
        uint64_t seed = 0x9E3779B97F4A7C15ull + (uint64_t)w * 7919;
        if ((st = kiln_grammar_matcher_reset(m))) break;
        for (int step = 0; !st && step < 200; step++) {
            for (int32_t i = 0; i < V; i++) lg[i] = (float)(rng_next(&seed) >> 40) / 16777216.0f;
            const double t0 = kiln_bench_now();
            st = kiln_grammar_matcher_mask(m, lg);
            t[n++] = (kiln_bench_now() - t0) * 1e6;
            int32_t best = -1;
            for (int32_t i = 0; !st && i < V; i++)
                if (lg[i] != -INFINITY && (best < 0 || lg[i] > lg[best])) best = i;
            if (st || best == eos) break;
            st = kiln_grammar_matcher_accept(m, best);
            tokens++;
        }
    }
    if (walks == 1) n_first = n;
    if (!st && n) {
        double sum = 0, first = 0;
        for (int64_t i = 0; i < n; i++) sum += t[i];
        for (int64_t i = 0; i < n_first; i++) first += t[i];
        r->first_mask_us = t[0], r->first_walk_ms = first / 1000;
        r->later_mean_us = n > n_first ? (sum - first) / (double)(n - n_first) : 0;
        qsort(t, (size_t)n, sizeof *t, cmp_double);
        r->masks = n, r->mean_us = sum / (double)n, r->p50_us = t[(n - 1) / 2];
        r->p99_us = t[(int64_t)ceil(0.99 * (double)n) - 1], r->max_us = t[n - 1];
        r->n_vocab = V, r->tokens_per_walk = (double)tokens / walks;
        int64_t hits, misses;
        kiln_grammar_matcher_cache_stats(m, &hits, &misses);
        r->hit_rate = hits + misses ? (double)hits / (double)(hits + misses) : 0;
    }
    kiln_grammar_matcher_free(m);
    free(lg), free(t);
    return st;
}

int kiln_bench_grammar(int argc, char **argv) {
    kiln_cli_list vocabs = {0};
    int64_t walks = 20;
    kiln_cli_opt opts[] = {
        {"--vocab", KILN_CLI_LIST, &vocabs, 0, 0},
        {"--walks", KILN_CLI_I64, &walks, 1, 10000},
    };
    int n_pos;
    if (!kiln_cli_parse_args("bench grammar", argc, argv, opts, 2, NULL, 0, &n_pos)) return 1;
    char def[4096];
    const char *paths[MAX_VOCABS];
    int n_v = 0;
    for (int i = 0; i < vocabs.n && n_v < MAX_VOCABS; i++) paths[n_v++] = vocabs.v[i];
    if (vocabs.n > MAX_VOCABS) return kiln_cli_error("bench grammar: at most %d --vocab files", MAX_VOCABS);
    if (!n_v) {
        if (!kiln_cli_default_model(def, sizeof def)) return kiln_cli_error("bench grammar: no --vocab and no bundled model (models/shakespeare.gguf)");
        paths[n_v++] = def;
    }
    const int n_g = (int)(sizeof grammars / sizeof *grammars);
    result *res = calloc((size_t)(n_v * n_g), sizeof *res);
    int n_res = 0, rc = res ? 0 : kiln_cli_error("bench grammar: out of memory");
    for (int v = 0; !rc && v < n_v; v++) {
        kiln_tokenizer *tok = NULL;
        if (kiln_tokenizer_load_file(paths[v], &tok)) {
            rc = kiln_cli_error("bench grammar: %s: %s", paths[v], kiln_last_error());
            break;
        }
        kiln_grammar_vocab *gv = NULL;
        if (kiln_grammar_vocab_new(tok, &gv)) {
            rc = kiln_cli_error("bench grammar: %s: %s", paths[v], kiln_last_error());
            kiln_tokenizer_free(tok);
            break;
        }
        for (int gi = 0; !rc && gi < n_g; gi++) {
            kiln_grammar *g = NULL;
            char *gbnf = NULL;
            size_t n_gbnf = 0;
            kiln_status st = grammars[gi].schema ? kiln_json_schema_to_gbnf(grammars[gi].text, strlen(grammars[gi].text), &gbnf, &n_gbnf) : KILN_OK;
            if (!st) st = grammars[gi].schema ? kiln_grammar_parse(gbnf, n_gbnf, NULL, &g) : kiln_grammar_parse(grammars[gi].text, strlen(grammars[gi].text), NULL, &g);
            free(gbnf);
            result *r = &res[n_res];
            *r = (result){.vocab = kiln_bench_base_name(paths[v]), .grammar = grammars[gi].name};
            if (!st) st = run_case(g, tok, gv, (int)walks, r);
            kiln_grammar_free(g);
            if (st) {
                rc = kiln_cli_error("bench grammar: %s, %s: %s", paths[v], grammars[gi].name, kiln_last_error());
                break;
            }
            n_res++;
            printf("{\"bench\": \"grammar\", \"vocab\": ");
            kiln_bench_json_str(r->vocab);
            printf(", \"n_vocab\": %d, \"grammar\": \"%s\", \"masks\": %lld, \"mean_us\": %.2f, \"p50_us\": %.2f, \"p99_us\": %.2f, "
                   "\"max_us\": %.2f, \"first_mask_us\": %.2f, \"first_walk_ms\": %.3f, \"later_mean_us\": %.2f, "
                   "\"tokens_per_walk\": %.1f, \"cache_hit_rate\": %.3f}\n",
                   (int)r->n_vocab, r->grammar, (long long)r->masks, r->mean_us, r->p50_us, r->p99_us, r->max_us, r->first_mask_us,
                   r->first_walk_ms, r->later_mean_us, r->tokens_per_walk, r->hit_rate);
            fflush(stdout);
        }
        kiln_grammar_vocab_free(gv);
        kiln_tokenizer_free(tok);
    }
    if (!rc) {
        printf("\n%-28s %8s %-6s %6s %9s %9s %9s %9s %11s %11s %10s %6s\n", "vocab", "n_vocab", "gram", "masks", "mean us", "p50 us",
               "p99 us", "max us", "1st mask us", "1st walk ms", "later us", "cached");
        for (int i = 0; i < n_res; i++) {
            kiln_cli_put_padded(stdout, res[i].vocab, 28);
            printf(" %8d %-6s %6lld %9.1f %9.1f %9.1f %9.1f %11.1f %11.2f %10.1f %5.0f%%\n", (int)res[i].n_vocab, res[i].grammar,
                   (long long)res[i].masks, res[i].mean_us, res[i].p50_us, res[i].p99_us, res[i].max_us, res[i].first_mask_us,
                   res[i].first_walk_ms, res[i].later_mean_us, 100 * res[i].hit_rate);
        }
    }
    free(res);
    return rc;
}
