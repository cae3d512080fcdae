/* bench_spec.c: `kiln bench spec -m TARGET [-md DRAFT] [--gpu] [-p PROMPT | -f FILE] [-n N] [--draft-max 2,4,8]
 * [--temp T] [--simulate-accept A] [--reps R] [-t THREADS] [--seed S] [--lookup-ngram N]`: the speed of speculative
 * decoding against plain decoding, in one run.
 *
 * Cases, each decoding N tokens (default 128) after the prompt (prefilled untimed; EOS does not stop a case). The
 * prompt: -p's text, -f's first tokens (--prompt-tokens, default 256, or what the context leaves), "Once upon a
 * time", or for a model without a
 * tokenizer (kiln synth) 32 seeded random ids.
 *   plain    one target forward a token (greedy: kiln_session_eval_argmax, so on the GPU only the argmax comes back;
 *            with --temp: the logits and kiln_sampler_sample)
 *   lookup   prompt lookup drafts (kiln_spec_lookup), at each --draft-max
 *   draft    the draft model's drafts (kiln_spec_draft: greedy, or sampled from its q with --temp), at each --draft-max
 * Speculative cases verify through kiln_spec_verify_greedy / kiln_spec_verify_sample, as `kiln generate` does.
 * --simulate-accept A (for synthetic models, whose drafts would all be refused): the draft cases take each draft
 * with probability A by a seeded coin in place of the comparison, and every piece of real work still runs: the
 * draft model's k steps, the target's (k + 1)-row forward with its logits, the acceptance step's scan of the rows
 * and the caches cut back to the tokens taken. So a synthetic 7B target with a 1.1B draft can be timed at a real
 * pair's acceptance rate. Those rows say "simulated".
 * Per case: tok_s, the tokens the timed loop made (N - 1: the first comes from the prefill) over its seconds (the
 * median of --reps runs, default 1, after one untimed plain run); acceptance, drafts taken over drafted; alpha,
 * drafts taken over drafts judged (taken plus one per round that refused one: the drafts after a refused one are
 * never judged), the chance that a draft is taken when the one before was, the rate --simulate-accept takes;
 * tokens_per_forward, the tokens made over the target's forwards (plain: 1); speedup, tok_s over plain's of the
 * same run. Sessions go through the session API only (--gpu: every layer on CUDA device 0, both models), so the
 * GPU runs exactly the CPU's loop.
 * With -md and -f, one more row (agreement): the share of the file's positions where the draft's argmax equals the
 * target's, both teacher-forced on the file's tokens: an independent check of the greedy acceptance rate.
 * Output: one JSON object per case on stdout ({"bench":"spec", ...}), then a table. */
#include "bench/bench.h"
#include "tools/cli.h"

#include "kiln.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DRAFT_MAX 16 /* entries of --draft-max's list */
#define MAX_REPS 100
#define AGREE_CHUNK 256 /* tokens a teacher-forced forward of the agreement check takes */
#define RANDOM_PROMPT 32 /* the prompt's ids for a model without a tokenizer */

typedef struct {
    kiln_session *ts, *ds;     /* the target's session, the draft's (NULL without -md) */
    kiln_sampler_params sp;    /* temp 0: greedy */
    const int32_t *prompt;     /* (n_prompt,) */
    size_t n_prompt;
    int64_t n_new, V;
    int lookup_ngram;
    double accept_sim;         /* < 0: real acceptance */
    uint64_t seed;
    int32_t *seq, *draft, *out; /* (n_prompt + n_new,), (dmax + 1,), (dmax + 1,) */
    float *logits, *rows, *q;   /* (V,), ((dmax + 1) x V), (dmax x V) */
} bench_state;

typedef struct {
    const char *kind;  /* "plain", "lookup", "draft" */
    int64_t draft_max; /* 0 for plain */
    bool simulated;
    int64_t tokens, forwards, drafted, accepted, refused; /* refused: rounds that refused a draft */
    double seconds;
} spec_case;

static uint64_t coin_next(uint64_t *x) {
    *x ^= *x >> 12, *x ^= *x << 25, *x ^= *x >> 27;
    return *x * 2685821657736338717ull;
}

static double coin(uint64_t *x) { return (double)(coin_next(x) >> 11) / 9007199254740992.0; }

static int32_t argmax_row(const float *row, int64_t V) {
    int32_t best = 0;
    for (int64_t i = 1; i < V; i++)
        if (row[i] > row[best]) best = (int32_t)i;
    return best;
}

/* A verify with simulated acceptance: the same forward as kiln_spec_verify_* (t0 and the k drafts, every row's
 * logits), the row scan of the real rule, then j drafts taken by coins of probability a and the target's own token
 * from row j; the session cut back to t0 and the j drafts. */
static kiln_status verify_simulated(bench_state *b, kiln_sampler *smp, uint64_t *rng, int32_t t0, size_t k, size_t *got) {
    const int64_t pos = kiln_session_pos(b->ts);
    b->out[0] = t0;
    memcpy(b->out + 1, b->draft, k * sizeof *b->draft);
    kiln_status st = kiln_session_eval(b->ts, b->out, k + 1, NULL, b->rows);
    if (st) return st;
    size_t j = 0;
    while (j < k && coin(rng) < b->accept_sim) j++;
    /* the real rule's work on the rows (its verdict unused), so the time includes it */
    if (smp) kiln_spec_accept_sample(smp, b->rows, b->V, b->q, b->draft, k, b->out);
    else kiln_spec_accept_greedy(b->rows, b->V, b->draft, k, b->out);
    memcpy(b->out, b->draft, j * sizeof *b->draft);
    b->out[j] = argmax_row(b->rows + j * (size_t)b->V, b->V); /* sampled rows hold probabilities: still a likely token */
    *got = j + 1;
    if (kiln_session_keep(b->ts, pos + 1 + (int64_t)j) != pos + 1 + (int64_t)j)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "bench spec: the target's cache cannot be cut back");
    return KILN_OK;
}

/* One run of case c from an empty cache; times the decode loop into c->seconds. */
static kiln_status run_case(bench_state *b, spec_case *c) {
    kiln_session_reset(b->ts);
    if (b->ds) kiln_session_reset(b->ds);
    const bool sampling = b->sp.temp != 0;
    kiln_sampler *smp = NULL;
    kiln_status st = kiln_sampler_new(&b->sp, b->V, &smp);
    if (!st) st = kiln_session_eval(b->ts, b->prompt, b->n_prompt, b->logits, NULL);
    if (st) {
        kiln_sampler_free(smp);
        return st;
    }
    memcpy(b->seq, b->prompt, b->n_prompt * sizeof *b->seq);
    size_t n = b->n_prompt;
    b->seq[n++] = sampling ? kiln_sampler_sample(smp, b->logits, NULL, 0) : argmax_row(b->logits, b->V);
    int64_t gen = 1, dpos = 0;
    uint64_t rng = b->seed ^ 0x9E3779B97F4A7C15ull;
    const bool use_draft = strcmp(c->kind, "draft") == 0;
    c->forwards = c->drafted = c->accepted = c->refused = 0;
    const double t0 = kiln_bench_now();
    while (!st && gen < b->n_new) {
        int32_t t = b->seq[n - 1];
        if (c->draft_max == 0) { /* plain */
            if (sampling) {
                if (!(st = kiln_session_eval(b->ts, &t, 1, b->logits, NULL))) b->seq[n++] = kiln_sampler_sample(smp, b->logits, NULL, 0);
            } else if (!(st = kiln_session_eval_argmax(b->ts, &t, 1, &b->seq[n]))) {
                n++;
            }
            gen++, c->forwards++;
            continue;
        }
        size_t k = (size_t)c->draft_max, left = (size_t)(b->n_new - gen - 1);
        if (k > left) k = left;
        if (use_draft) {
            if (k && !(st = kiln_spec_draft(b->ds, sampling ? smp : NULL, b->V, b->seq + dpos, n - (size_t)dpos, k, b->draft, b->q)))
                dpos = (int64_t)(n + k - 1);
        } else {
            k = kiln_spec_lookup(b->seq, n, 1, b->lookup_ngram, k, b->draft);
        }
        size_t got = 0;
        if (!st) {
            if (c->simulated) st = verify_simulated(b, sampling ? smp : NULL, &rng, t, k, &got);
            else if (sampling) st = kiln_spec_verify_sample(b->ts, smp, b->V, t, use_draft ? b->q : NULL, b->draft, k, b->out, &got);
            else st = kiln_spec_verify_greedy(b->ts, b->V, t, b->draft, k, b->out, &got);
        }
        if (st) break;
        if (use_draft && k) { /* the draft's cache: the sequence so far and the drafts taken */
            const int64_t keep = (int64_t)n + (int64_t)(got - 1 < k ? got - 1 : k - 1);
            if (kiln_session_keep(b->ds, keep) != keep) st = kiln_fail(KILN_ERR_UNSUPPORTED, "bench spec: the draft's cache cannot be cut back");
            dpos = keep;
        }
        memcpy(b->seq + n, b->out, got * sizeof *b->out);
        n += got, gen += (int64_t)got;
        c->forwards++, c->drafted += (int64_t)k, c->accepted += (int64_t)got - 1, c->refused += got - 1 < k;
    }
    c->seconds = kiln_bench_now() - t0;
    c->tokens = gen - 1;
    kiln_sampler_free(smp);
    return st;
}

/* The agreement row: teacher-forced argmaxes of target and draft over ids[0..n), in chunks from an empty cache. */
static kiln_status agreement(bench_state *b, const int32_t *ids, size_t n, int64_t *same, int64_t *total) {
    float *rt = malloc((size_t)AGREE_CHUNK * (size_t)b->V * sizeof *rt), *rd = malloc((size_t)AGREE_CHUNK * (size_t)b->V * sizeof *rd);
    kiln_status st = rt && rd ? KILN_OK : kiln_fail(KILN_ERR_NOMEM, "bench spec: out of memory for the agreement check");
    *same = *total = 0;
    const size_t chunk = (size_t)kiln_session_n_ctx(b->ts) < AGREE_CHUNK ? (size_t)kiln_session_n_ctx(b->ts) : AGREE_CHUNK;
    for (size_t at = 0; !st && at + 1 < n; at += chunk) {
        size_t m = n - at < chunk ? n - at : chunk;
        kiln_session_reset(b->ts), kiln_session_reset(b->ds);
        if ((st = kiln_session_eval(b->ts, ids + at, m, NULL, rt)) || (st = kiln_session_eval(b->ds, ids + at, m, NULL, rd))) break;
        for (size_t i = 0; i < m; i++) *same += argmax_row(rt + i * (size_t)b->V, b->V) == argmax_row(rd + i * (size_t)b->V, b->V);
        *total += (int64_t)m;
    }
    free(rt), free(rd);
    return st;
}

static kiln_status collect_ids(void *ud, const int32_t *ids, size_t n) {
    kiln_tokens *t = ud;
    if (t->n + n > t->cap) {
        size_t cap = (t->n + n) * 2;
        int32_t *p = realloc(t->ids, cap * sizeof *p);
        if (!p) return kiln_fail(KILN_ERR_NOMEM, "bench spec: out of memory for the file's tokens");
        t->ids = p, t->cap = cap;
    }
    memcpy(t->ids + t->n, ids, n * sizeof *ids);
    t->n += n;
    return KILN_OK;
}

static void print_case(const bench_state *b, const char *target, const char *draft, bool gpu, const spec_case *c, double plain_tps) {
    char a[32], al[32], tpf[32], tps[32], sp[32], sim[32];
    const double tok_s = c->seconds > 0 ? (double)c->tokens / c->seconds : 0;
    printf("{\"bench\": \"spec\", \"target\": ");
    kiln_bench_json_str(kiln_bench_base_name(target));
    printf(", \"draft\": ");
    if (draft && strcmp(c->kind, "draft") == 0) kiln_bench_json_str(kiln_bench_base_name(draft));
    else printf("null");
    printf(", \"gpu\": %s, \"temp\": %g, \"case\": \"%s\", \"draft_max\": %lld, \"simulated_accept\": %s, \"tokens\": %lld, "
           "\"target_forwards\": %lld, \"drafted\": %lld, \"accepted\": %lld, \"acceptance\": %s, \"alpha\": %s, "
           "\"tokens_per_forward\": %s, "
           "\"tok_s\": %s, \"speedup\": %s}\n",
           gpu ? "true" : "false", (double)b->sp.temp, c->kind, (long long)c->draft_max,
           c->simulated ? kiln_bench_json_num(sim, sizeof sim, b->accept_sim, 3) : "null", (long long)c->tokens, (long long)c->forwards,
           (long long)c->drafted, (long long)c->accepted,
           kiln_bench_json_num(a, sizeof a, c->drafted ? (double)c->accepted / (double)c->drafted : (double)NAN, 4),
           kiln_bench_json_num(al, sizeof al, c->accepted + c->refused ? (double)c->accepted / (double)(c->accepted + c->refused) : (double)NAN, 4),
           kiln_bench_json_num(tpf, sizeof tpf, c->forwards ? (double)c->tokens / (double)c->forwards : (double)NAN, 3),
           kiln_bench_json_num(tps, sizeof tps, tok_s, 1), kiln_bench_json_num(sp, sizeof sp, plain_tps > 0 ? tok_s / plain_tps : (double)NAN, 3));
    fflush(stdout);
}

int kiln_bench_spec(int argc, char **argv) {
    const char *cmd = "bench spec", *target = NULL, *draft = NULL, *prompt = NULL, *file = NULL, *dmax_arg = "2,4,8";
    int64_t n_new = 128, reps = 1, ngram = 3, prompt_max = 256;
    double accept_sim = -1;
    bool gpu = false;
    kiln_session_params sess = {0};
    kiln_sampler_params sp = kiln_sampler_default();
    sp.temp = 0;
    const kiln_cli_opt opts[] = {
        {"-m", KILN_CLI_STR, &target, 0, 0},
        {"-md", KILN_CLI_STR, &draft, 0, 0},
        {"-p", KILN_CLI_STR, &prompt, 0, 0},
        {"-f", KILN_CLI_STR, &file, 0, 0},
        {"-n", KILN_CLI_I64, &n_new, 2, 1 << 20},
        {"--draft-max", KILN_CLI_STR, &dmax_arg, 0, 0},
        {"--temp", KILN_CLI_FLOAT, &sp.temp, 0, 100},
        {"--top-k", KILN_CLI_INT, &sp.top_k, 0, INT32_MAX},
        {"--top-p", KILN_CLI_FLOAT, &sp.top_p, 0, 1},
        {"--min-p", KILN_CLI_FLOAT, &sp.min_p, 0, 1},
        {"--seed", KILN_CLI_U64, &sp.seed, 0, 0},
        {"--simulate-accept", KILN_CLI_DOUBLE, &accept_sim, 0, 1},
        {"--reps", KILN_CLI_I64, &reps, 1, MAX_REPS},
        {"--lookup-ngram", KILN_CLI_I64, &ngram, 1, 16},
        {"--prompt-tokens", KILN_CLI_I64, &prompt_max, 1, INT32_MAX},
        {"-t", KILN_CLI_INT, &sess.n_threads, 0, 4096},
        {"--gpu", KILN_CLI_FLAG, &gpu, 0, 0},
    };
    int n_pos;
    if (!kiln_cli_parse_args(cmd, argc, argv, opts, (int)(sizeof opts / sizeof *opts), NULL, 0, &n_pos)) return 1;
    if (!target || (prompt && file))
        return kiln_cli_error("%s: usage: kiln bench spec -m TARGET [-md DRAFT] [--gpu] [-p PROMPT | -f FILE] [-n N] "
                              "[--draft-max 2,4,8] [--temp T] [--simulate-accept A] [--reps R] [-t N]", cmd);
    if (accept_sim >= 0 && !draft) return kiln_cli_error("%s: --simulate-accept needs a draft model (-md)", cmd);
    int64_t dmaxes[MAX_DRAFT_MAX];
    int n_dmax = 0;
    if (kiln_bench_parse_list(cmd, "--draft-max", dmax_arg, 1, 256, dmaxes, MAX_DRAFT_MAX, &n_dmax)) return 1;
    int64_t dmax = 0;
    for (int i = 0; i < n_dmax; i++) dmax = dmaxes[i] > dmax ? dmaxes[i] : dmax;
    if (gpu) sess.n_gpu_layers = INT32_MAX;

    kiln_model *tm = NULL, *dm = NULL;
    kiln_tokens ids = {0};
    bench_state b = {.sp = sp, .n_new = n_new, .lookup_ngram = (int)ngram, .accept_sim = accept_sim, .seed = sp.seed};
    spec_case *cases = calloc((size_t)(1 + 2 * n_dmax), sizeof *cases);
    int n_cases = 0, rc = 1;
    kiln_status st = cases ? kiln_model_load(target, &tm) : kiln_fail(KILN_ERR_NOMEM, "out of memory");
    const kiln_tokenizer *tok = st ? NULL : kiln_model_tokenizer(tm);
    if (!st && !tok && (prompt || file)) st = kiln_fail(KILN_ERR_INVALID, "%s: the model has no tokenizer for -p or -f", target);
    if (!st && draft && !(st = kiln_model_load(draft, &dm)) && kiln_model_n_vocab(dm) != kiln_model_n_vocab(tm))
        st = kiln_fail(KILN_ERR_INVALID, "%s: the draft's vocab has %lld tokens, the target's %lld", draft, (long long)kiln_model_n_vocab(dm),
                       (long long)kiln_model_n_vocab(tm));
    if (!st && file) st = kiln_tokenizer_encode_file(tok, file, true, false, collect_ids, &ids);
    else if (!st && !tok) { /* a synthetic model (kiln synth without --vocab): seeded random ids */
        uint64_t x = sp.seed | 1;
        int32_t r[RANDOM_PROMPT];
        for (int i = 0; i < RANDOM_PROMPT; i++) r[i] = (int32_t)(coin_next(&x) % (uint64_t)kiln_model_n_vocab(tm));
        st = collect_ids(&ids, r, RANDOM_PROMPT);
    } else if (!st) {
        const char *text = prompt ? prompt : "Once upon a time";
        st = kiln_tokenizer_encode(tok, text, strlen(text), true, false, &ids);
    }
    if (!st && ids.n == 0) st = kiln_fail(KILN_ERR_INVALID, "%s: the prompt has no tokens", cmd);
    /* the prompt: the file's first tokens up to half the context, or -p's */
    int64_t n_ctx_train = tm ? kiln_model_n_ctx_train(tm) : 0;
    if (dm && kiln_model_n_ctx_train(dm) < n_ctx_train) n_ctx_train = kiln_model_n_ctx_train(dm);
    size_t n_prompt = ids.n < (size_t)prompt_max ? ids.n : (size_t)prompt_max;
    if (!st && (int64_t)n_prompt + n_new + dmax + 1 > n_ctx_train) {
        if (n_new + dmax + 2 > n_ctx_train)
            st = kiln_fail(KILN_ERR_RANGE, "%s: -n %lld and --draft-max %lld do not fit the context of %lld", cmd, (long long)n_new, (long long)dmax,
                           (long long)n_ctx_train);
        else n_prompt = (size_t)(n_ctx_train - n_new - dmax - 1);
    }
    if (!st) {
        b.V = kiln_model_n_vocab(tm), b.prompt = ids.ids, b.n_prompt = n_prompt;
        sess.n_ctx = (int64_t)n_prompt + n_new + dmax + 1;
        if (file && dm && sess.n_ctx < AGREE_CHUNK) sess.n_ctx = AGREE_CHUNK < n_ctx_train ? AGREE_CHUNK : n_ctx_train;
        b.seq = malloc((n_prompt + (size_t)n_new + (size_t)dmax + 1) * sizeof *b.seq);
        b.draft = malloc(((size_t)dmax + 1) * sizeof *b.draft), b.out = malloc(((size_t)dmax + 1) * sizeof *b.out);
        b.logits = malloc((size_t)b.V * sizeof *b.logits), b.rows = malloc(((size_t)dmax + 1) * (size_t)b.V * sizeof *b.rows);
        b.q = malloc((size_t)dmax * (size_t)b.V * sizeof *b.q);
        if (!b.seq || !b.draft || !b.out || !b.logits || !b.rows || !b.q) st = kiln_fail(KILN_ERR_NOMEM, "%s: out of memory", cmd);
    }
    if (!st) st = kiln_session_new(tm, &sess, &b.ts);
    if (!st && dm) st = kiln_session_new(dm, &sess, &b.ds);
    if (st) goto done;
    if (gpu && !kiln_session_on_gpu(b.ts)) {
        kiln_cli_error("%s: --gpu: the target's session is not on the GPU", cmd);
        goto done;
    }
    cases[n_cases++] = (spec_case){.kind = "plain"};
    for (int i = 0; i < n_dmax; i++) cases[n_cases++] = (spec_case){.kind = "lookup", .draft_max = dmaxes[i]};
    for (int i = 0; dm && i < n_dmax; i++) cases[n_cases++] = (spec_case){.kind = "draft", .draft_max = dmaxes[i], .simulated = accept_sim >= 0};
    spec_case warm = cases[0];
    if ((st = run_case(&b, &warm))) goto done;
    double plain_tps = 0;
    for (int ci = 0; ci < n_cases; ci++) {
        double t[MAX_REPS];
        for (int r = 0; !st && r < reps; r++)
            if (!(st = run_case(&b, &cases[ci]))) t[r] = cases[ci].seconds;
        if (st) goto done;
        cases[ci].seconds = kiln_bench_median(t, (int)reps);
        if (ci == 0) plain_tps = (double)cases[0].tokens / cases[0].seconds;
        print_case(&b, target, draft, gpu, &cases[ci], plain_tps);
    }
    int64_t same = 0, total = 0;
    if (file && dm) {
        if ((st = agreement(&b, ids.ids, ids.n, &same, &total))) goto done;
        printf("{\"bench\": \"spec_agreement\", \"target\": ");
        kiln_bench_json_str(kiln_bench_base_name(target));
        printf(", \"draft\": ");
        kiln_bench_json_str(kiln_bench_base_name(draft));
        printf(", \"positions\": %lld, \"top1_agreement\": %.4f}\n", (long long)total, total ? (double)same / (double)total : 0.0);
    }
    printf("\n%s%s, temp %g, %lld tokens, prompt %zu tokens\n", kiln_bench_base_name(target), gpu ? " (GPU)" : "", (double)sp.temp,
           (long long)n_new, n_prompt);
    printf("| case | draft-max | acceptance | alpha | tokens/forward | tok/s | speedup |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for (int ci = 0; ci < n_cases; ci++) {
        const spec_case *c = &cases[ci];
        const double tps = (double)c->tokens / c->seconds;
        char label[96], acc[32], alpha[32];
        if (c->simulated) snprintf(label, sizeof label, "draft %s (simulated accept %.2f)", kiln_bench_base_name(draft), accept_sim);
        else if (strcmp(c->kind, "draft") == 0) snprintf(label, sizeof label, "draft %s", kiln_bench_base_name(draft));
        else snprintf(label, sizeof label, "%s", c->kind);
        if (c->drafted) snprintf(acc, sizeof acc, "%.1f%%", 100.0 * (double)c->accepted / (double)c->drafted);
        else snprintf(acc, sizeof acc, "-");
        if (c->accepted + c->refused) snprintf(alpha, sizeof alpha, "%.3f", (double)c->accepted / (double)(c->accepted + c->refused));
        else snprintf(alpha, sizeof alpha, "-");
        char dm_s[24];
        snprintf(dm_s, sizeof dm_s, c->draft_max ? "%lld" : "-", (long long)c->draft_max);
        printf("| %s | %s | %s | %s | %.2f | %.1f | %.2fx |\n", label, dm_s, acc, alpha,
               (double)c->tokens / (double)c->forwards, tps, tps / plain_tps);
    }
    if (total) printf("top-1 agreement of the draft with the target, teacher-forced on the file: %.1f%% of %lld positions\n", 100.0 * (double)same / (double)total,
                      (long long)total);
    rc = 0;
done:
    if (st) rc = kiln_cli_die(st);
    kiln_session_free(b.ts), kiln_session_free(b.ds);
    free(b.seq), free(b.draft), free(b.out), free(b.logits), free(b.rows), free(b.q);
    kiln_tokens_free(&ids);
    kiln_model_free(tm), kiln_model_free(dm);
    free(cases);
    return rc;
}
