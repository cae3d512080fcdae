/* test_speculative.c: greedy speculative decoding's halves (src/infer/speculative.c).
 *   lookup     kiln_spec_lookup on hand-made sequences: the longest n-gram that recurs, its latest occurrence, the
 *              draft cut at max_draft and at the sequence's end, none when nothing recurs
 *   verify     on the bundled model, against plain greedy decoding token by token (kiln_session_eval_argmax, one
 *              token a step): drafts equal to the greedy continuation are all taken and the bonus token is the next
 *              greedy one; a draft wrong at position 2 takes 2, then the greedy token; a wrong first draft takes
 *              none; after each, the session's position and its next argmax are plain decoding's, so a run
 *              continues exactly as one without drafts
 *   sampling   kiln_spec_verify_sample's first token over 3000 draws (each from the same cache, a fresh seed), with
 *              a likely draft and an unlikely one: its frequencies against the target's distribution
 *              (kiln_sampler_probs at temperature 1) by a chi-square test over the 8 likeliest tokens and the rest,
 *              below the 0.001 critical value (26.1 at 8 degrees of freedom); and kiln_sampler_probs against
 *              kiln_sampler_sample's own frequencies the same way
 *   draft      kiln_spec_verify_sample with a drafter's q (two drafts drawn from a flatter distribution than the
 *              target's): the first and the second emitted token over 3000 seeds against the target's p1 and its
 *              second-token marginal (plain forwards over p1's support), chi-square below 26.1. Measured 4.5 and 2.0;
 *              accepting with p(d) in place of min(1, p/q) gives 69.1, drawing a refusal from p without d (ignoring
 *              q) 34.7 */
#include "kiln.h"
#include "test.h"

#include <stdint.h>

static void test_lookup(void) {
    int32_t d[8];
    /* ... 1 2 3 9 ... 1 2 3 | the 3-gram 1 2 3 recurs: what followed it (9 5 6) */
    const int32_t a[] = {7, 1, 2, 3, 9, 5, 6, 4, 1, 2, 3};
    size_t k = kiln_spec_lookup(a, 11, 1, 3, 8, d);
    CHECK(k == 7 && d[0] == 9 && d[1] == 5 && d[2] == 6 && d[3] == 4 && d[4] == 1 && d[6] == 3, "k %zu d0 %d", k, (int)d[0]);
    CHECK(kiln_spec_lookup(a, 11, 1, 3, 2, d) == 2 && d[0] == 9 && d[1] == 5, "cut at max_draft");
    /* the latest occurrence wins: 5 8 ... 5 9 ... 5 -> 9 */
    const int32_t b[] = {5, 8, 0, 5, 9, 0, 5};
    CHECK(kiln_spec_lookup(b, 7, 1, 3, 1, d) == 1 && d[0] == 9, "latest: %d", (int)d[0]);
    /* the longest n-gram first: 1 2 recurs once (-> 7), 2 recurs later (-> 4): with ngram_max 2 the bigram's 7 */
    const int32_t c[] = {1, 2, 7, 2, 4, 1, 2};
    CHECK(kiln_spec_lookup(c, 7, 1, 2, 1, d) == 1 && d[0] == 7, "bigram: %d", (int)d[0]);
    CHECK(kiln_spec_lookup(c, 7, 1, 1, 1, d) == 1 && d[0] == 4, "unigram: %d", (int)d[0]);
    /* nothing recurs; a sequence shorter than the n-gram; ngram_min above what recurs */
    const int32_t e[] = {1, 2, 3, 4};
    CHECK(kiln_spec_lookup(e, 4, 1, 3, 8, d) == 0);
    CHECK(kiln_spec_lookup(e, 1, 1, 3, 8, d) == 0);
    CHECK(kiln_spec_lookup(c, 7, 3, 3, 8, d) == 0);
}

/* kiln_spec_accept_greedy on hand-made rows of 4 logits: the drafts are taken while each is its row's argmax */
static void test_accept_greedy_rows(void) {
    const float rows[4][4] = {{0, 5, 1, 0}, {2, 0, 0, 3}, {9, 0, 0, 0}, {0, 0, 7, 1}}; /* argmaxes 1 3 0 2 */
    const int32_t all[3] = {1, 3, 0}, second_wrong[3] = {1, 2, 0}, first_wrong[3] = {0, 3, 0};
    int32_t out[4];
    CHECK(kiln_spec_accept_greedy(&rows[0][0], 4, all, 3, out) == 4 && out[0] == 1 && out[2] == 0 && out[3] == 2, "all taken");
    CHECK(kiln_spec_accept_greedy(&rows[0][0], 4, second_wrong, 3, out) == 2 && out[0] == 1 && out[1] == 3, "one taken");
    CHECK(kiln_spec_accept_greedy(&rows[0][0], 4, first_wrong, 3, out) == 1 && out[0] == 1, "none taken");
    CHECK(kiln_spec_accept_greedy(&rows[0][0], 4, NULL, 0, out) == 1 && out[0] == 1, "no drafts");
}

#define N_REF 12

static void test_verify_matches_greedy(void) {
    kiln_model *m = NULL;
    if (kiln_model_load("models/shakespeare.gguf", &m) != KILN_OK) SKIP("models/shakespeare.gguf: %s", kiln_last_error());
    const int64_t V = kiln_model_n_vocab(m);
    kiln_tokens p = {0};
    CHECK(kiln_tokenizer_encode(kiln_model_tokenizer(m), "ROMEO:", 6, true, false, &p) == KILN_OK);
    const kiln_session_params sp = {.n_ctx = 128, .n_threads = 1};
    kiln_session *ref = NULL, *s = NULL;
    CHECK(kiln_session_new(m, &sp, &ref) == KILN_OK && kiln_session_new(m, &sp, &s) == KILN_OK, "%s", kiln_last_error());
    /* the reference: plain greedy, one token a step; g[0] follows the prompt */
    int32_t g[N_REF + 1];
    CHECK(kiln_session_eval_argmax(ref, p.ids, p.n, &g[0]) == KILN_OK);
    for (int i = 0; i < N_REF; i++) CHECK(kiln_session_eval_argmax(ref, &g[i], 1, &g[i + 1]) == KILN_OK);

    int32_t first;
    CHECK(kiln_session_eval_argmax(s, p.ids, p.n, &first) == KILN_OK && first == g[0]);
    const int64_t pos0 = kiln_session_pos(s);
    int32_t out[8];
    size_t n_out = 0;
    /* all 4 drafts right (g[1..4]): 4 taken, then g[5] */
    CHECK(kiln_spec_verify_greedy(s, V, g[0], g + 1, 4, out, &n_out) == KILN_OK, "%s", kiln_last_error());
    CHECK(n_out == 5 && out[0] == g[1] && out[3] == g[4] && out[4] == g[5], "n_out %zu, out[4] %d, want %d", n_out, (int)out[4],
          (int)g[5]);
    CHECK(kiln_session_pos(s) == pos0 + 5, "pos %lld, want %lld", (long long)kiln_session_pos(s), (long long)(pos0 + 5));
    /* from g[5]: drafts g[6], g[7], then a wrong one: 2 taken, then g[8] */
    int32_t bad[3] = {g[6], g[7], g[8] == 0 ? 1 : 0};
    CHECK(kiln_spec_verify_greedy(s, V, g[5], bad, 3, out, &n_out) == KILN_OK, "%s", kiln_last_error());
    CHECK(n_out == 3 && out[0] == g[6] && out[1] == g[7] && out[2] == g[8], "n_out %zu, out[2] %d, want %d", n_out, (int)out[2], (int)g[8]);
    CHECK(kiln_session_pos(s) == pos0 + 8, "pos %lld", (long long)kiln_session_pos(s));
    /* from g[8]: a wrong first draft: none taken, g[9] */
    int32_t wrong[2] = {g[9] == 0 ? 1 : 0, g[10]};
    CHECK(kiln_spec_verify_greedy(s, V, g[8], wrong, 2, out, &n_out) == KILN_OK);
    CHECK(n_out == 1 && out[0] == g[9], "n_out %zu, out[0] %d, want %d", n_out, (int)out[0], (int)g[9]);
    /* no drafts at all: the plain step */
    CHECK(kiln_spec_verify_greedy(s, V, g[9], NULL, 0, out, &n_out) == KILN_OK && n_out == 1 && out[0] == g[10]);
    /* the session continues as the reference's: the cache holds exactly the taken tokens */
    int32_t next;
    CHECK(kiln_session_eval_argmax(s, &g[10], 1, &next) == KILN_OK && next == g[11], "next %d, want %d", (int)next, (int)g[11]);
    CHECK(kiln_session_pos(s) == kiln_session_pos(ref) - 1, "pos %lld, reference %lld", (long long)kiln_session_pos(s),
          (long long)kiln_session_pos(ref));
    /* more drafts than the context's free positions: refused, nothing evaluated */
    const int64_t before = kiln_session_pos(s);
    int32_t many[128] = {0};
    CHECK(kiln_spec_verify_greedy(s, V, g[11], many, 127, out, &n_out) == KILN_ERR_RANGE && kiln_session_pos(s) == before);
    kiln_session_free(ref), kiln_session_free(s);
    kiln_tokens_free(&p);
    kiln_model_free(m);
}

/* Chi-square of counts against probabilities p over the 8 likeliest tokens of p and the rest (df 8). */
static double chi_square(const float *p, int64_t V, const int *count, int n) {
    int32_t top[8];
    for (int t = 0; t < 8; t++) {
        top[t] = -1;
        for (int32_t i = 0; i < V; i++) {
            bool taken = false;
            for (int u = 0; u < t; u++) taken = taken || top[u] == i;
            if (!taken && (top[t] < 0 || p[i] > p[top[t]])) top[t] = i;
        }
    }
    double chi = 0, rest_p = 1, rest_c = n;
    for (int t = 0; t < 8; t++) {
        const double e = (double)n * p[top[t]];
        chi += (count[top[t]] - e) * (count[top[t]] - e) / e;
        rest_p -= p[top[t]], rest_c -= count[top[t]];
    }
    const double e = (double)n * rest_p;
    if (e > 1e-9) chi += (rest_c - e) * (rest_c - e) / e;
    return chi;
}

static void test_verify_sample_keeps_distribution(void) {
    kiln_model *m = NULL;
    if (kiln_model_load("models/shakespeare.gguf", &m) != KILN_OK) SKIP("models/shakespeare.gguf: %s", kiln_last_error());
    const int64_t V = kiln_model_n_vocab(m);
    kiln_tokens p = {0};
    CHECK(kiln_tokenizer_encode(kiln_model_tokenizer(m), "ROMEO: I", 8, true, false, &p) == KILN_OK && p.n >= 2);
    const kiln_session_params sp = {.n_ctx = 64, .n_threads = 1};
    kiln_session *s = NULL;
    CHECK(kiln_session_new(m, &sp, &s) == KILN_OK, "%s", kiln_last_error());
    float *probs = malloc((size_t)V * sizeof *probs), *row = malloc((size_t)V * sizeof *row);
    int *count = calloc((size_t)V, sizeof *count);
    CHECK(probs && row && count);
    /* the target's distribution of the token after the prompt, at temperature 1 with no filter */
    kiln_sampler_params q = kiln_sampler_default();
    q.temp = 1.0f, q.top_k = 0, q.top_p = 1.0f, q.min_p = 0.0f;
    kiln_sampler *smp = NULL;
    CHECK(kiln_sampler_new(&q, V, &smp) == KILN_OK);
    CHECK(kiln_session_eval(s, p.ids, p.n, probs, NULL) == KILN_OK);
    kiln_sampler_probs(smp, probs, NULL, 0);
    int32_t best = 0, mid = -1;
    for (int32_t i = 1; i < V; i++)
        if (probs[i] > probs[best]) best = i;
    for (int32_t i = 0; i < V; i++) /* an unlikely but possible draft */
        if (probs[i] > 0.005f && probs[i] < 0.05f && (mid < 0 || probs[i] > probs[mid])) mid = i;
    CHECK(mid >= 0, "no token between 0.5%% and 5%% after the prompt");
    const int N = 3000;
    const int32_t drafts[2] = {best, mid};
    for (int d = 0; d < 2; d++) {
        memset(count, 0, (size_t)V * sizeof *count);
        for (int t = 0; t < N; t++) {
            CHECK(kiln_session_keep(s, (int64_t)p.n - 1) == (int64_t)p.n - 1);
            kiln_sampler *r = NULL;
            q.seed = 1000003ull * (uint64_t)(t + 1) + (uint64_t)d;
            CHECK(kiln_sampler_new(&q, V, &r) == KILN_OK);
            int32_t out[2];
            size_t n_out = 0;
            kiln_status st = kiln_spec_verify_sample(s, r, V, p.ids[p.n - 1], NULL, &drafts[d], 1, out, &n_out);
            kiln_sampler_free(r);
            CHECK(st == KILN_OK && n_out >= 1 && n_out <= 2, "%s", kiln_last_error());
            CHECK(out[0] >= 0 && out[0] < V && probs[out[0]] > 0, "token %d of probability 0", (int)out[0]);
            CHECK(n_out == 1 || out[0] == drafts[d], "two tokens, the first not the draft");
            count[out[0]]++;
        }
        const double chi = chi_square(probs, V, count, N);
        CHECK(chi < 26.1, "draft %d (p %.4f): chi-square %.1f over 8 df (0.001: 26.1); the draft came %d times, expected %.0f", (int)drafts[d],
              (double)probs[drafts[d]], chi, count[drafts[d]], N * (double)probs[drafts[d]]);
    }
    /* kiln_sampler_probs is the distribution kiln_sampler_sample draws from, also with the filters on */
    kiln_sampler_params f = kiln_sampler_default(); /* temp 0.8, top_k 40, top_p 0.95, min_p 0.05 */
    kiln_sampler *fs = NULL;
    CHECK(kiln_sampler_new(&f, V, &fs) == KILN_OK);
    CHECK(kiln_session_keep(s, (int64_t)p.n - 1) == (int64_t)p.n - 1 && kiln_session_eval(s, &p.ids[p.n - 1], 1, row, NULL) == KILN_OK);
    memcpy(probs, row, (size_t)V * sizeof *row);
    kiln_sampler_probs(fs, probs, NULL, 0);
    memset(count, 0, (size_t)V * sizeof *count);
    float *work = malloc((size_t)V * sizeof *work);
    CHECK(work);
    for (int t = 0; t < N; t++) {
        memcpy(work, row, (size_t)V * sizeof *row);
        count[kiln_sampler_sample(fs, work, NULL, 0)]++;
    }
    const double chi = chi_square(probs, V, count, N);
    free(work);
    kiln_sampler_free(fs);
    CHECK(chi < 26.1, "kiln_sampler_probs against kiln_sampler_sample: chi-square %.1f", chi);
    kiln_sampler_free(smp);
    free(probs), free(row), free(count);
    kiln_session_free(s);
    kiln_tokens_free(&p);
    kiln_model_free(m);
}

/* The test's own draws (not the sampler's RNG): xorshift64*, and the inverse CDF of V probabilities. */
static double test_coin(uint64_t *x) {
    *x ^= *x >> 12, *x ^= *x << 25, *x ^= *x >> 27;
    return (double)((*x * 2685821657736338717ull) >> 11) / 9007199254740992.0;
}

static int32_t test_draw(const float *q, int64_t V, uint64_t *x) {
    const double r = test_coin(x);
    double cdf = 0;
    int32_t last = 0;
    for (int32_t i = 0; i < V; i++) {
        if (q[i] <= 0) continue;
        cdf += q[i], last = i;
        if (r < cdf) return i;
    }
    return last;
}

/* The target's distribution (sampler params tp) after the prompt's ids and then the n extra tokens, by a plain
 * forward from the cache cut back to the prompt's first p.n - 1 ids. */
static void target_probs(kiln_session *s, kiln_sampler *tp, const kiln_tokens *p, const int32_t *extra, size_t n, float *out) {
    int32_t ids[4] = {p->ids[p->n - 1]};
    for (size_t i = 0; i < n; i++) ids[1 + i] = extra[i];
    CHECK(kiln_session_keep(s, (int64_t)p->n - 1) == (int64_t)p->n - 1);
    CHECK(kiln_session_eval(s, ids, n + 1, out, NULL) == KILN_OK, "%s", kiln_last_error());
    kiln_sampler_probs(tp, out, NULL, 0);
}

/* Sampling with a draft model: two drafts, each drawn (by the test's own RNG) from a drafter's distribution q that
 * differs from the target's (the target's own logits at temperature 1.6 with no top-k: flatter, with mass where the
 * target's top-k has none). The first emitted token must be distributed as the target's p1 and the second (out[1],
 * or the next plain round's token when the first draft was refused) as the marginal sum over t1 of p1(t1) p(. | t1),
 * computed by plain forwards over the 20 tokens of p1's support. */
static void test_verify_sample_draft_model(void) {
    kiln_model *m = NULL;
    if (kiln_model_load("models/shakespeare.gguf", &m) != KILN_OK) SKIP("models/shakespeare.gguf: %s", kiln_last_error());
    const int64_t V = kiln_model_n_vocab(m);
    kiln_tokens p = {0};
    CHECK(kiln_tokenizer_encode(kiln_model_tokenizer(m), "ROMEO: I", 8, true, false, &p) == KILN_OK && p.n >= 2);
    const kiln_session_params sp = {.n_ctx = 64, .n_threads = 1};
    kiln_session *s = NULL;
    CHECK(kiln_session_new(m, &sp, &s) == KILN_OK, "%s", kiln_last_error());
    kiln_sampler_params tpp = kiln_sampler_default(), qpp = kiln_sampler_default();
    tpp.temp = 1.0f, tpp.top_k = 20, tpp.top_p = 1.0f, tpp.min_p = 0.0f;
    qpp.temp = 1.6f, qpp.top_k = 0, qpp.top_p = 1.0f, qpp.min_p = 0.0f;
    kiln_sampler *tp = NULL, *qp = NULL;
    CHECK(kiln_sampler_new(&tpp, V, &tp) == KILN_OK && kiln_sampler_new(&qpp, V, &qp) == KILN_OK);
    float *p1 = malloc((size_t)V * sizeof *p1), *p2 = calloc((size_t)V, sizeof *p2), *row = malloc((size_t)V * sizeof *row);
    float *q = malloc(2 * (size_t)V * sizeof *q);
    int *c1 = calloc((size_t)V, sizeof *c1), *c2 = calloc((size_t)V, sizeof *c2);
    CHECK(p1 && p2 && row && q && c1 && c2);
    CHECK(kiln_session_eval(s, p.ids, p.n - 1, NULL, NULL) == KILN_OK, "%s", kiln_last_error());
    /* the oracle: p1, and the second token's marginal */
    target_probs(s, tp, &p, NULL, 0, p1);
    int32_t best = 0;
    for (int32_t t = 0; t < V; t++) {
        if (p1[t] > p1[best]) best = t;
        if (p1[t] <= 0) continue;
        target_probs(s, tp, &p, &t, 1, row);
        for (int64_t i = 0; i < V; i++) p2[i] += p1[t] * row[i];
    }
    /* the drafter: q0 the target's logits after the prompt, q1 after the prompt and p1's likeliest token, both at
     * temperature 1.6 over the whole vocab */
    CHECK(kiln_session_keep(s, (int64_t)p.n - 1) == (int64_t)p.n - 1);
    const int32_t ctx[2] = {p.ids[p.n - 1], best};
    CHECK(kiln_session_eval(s, ctx, 1, q, NULL) == KILN_OK && kiln_session_eval(s, ctx + 1, 1, q + V, NULL) == KILN_OK);
    kiln_sampler_probs(qp, q, NULL, 0), kiln_sampler_probs(qp, q + V, NULL, 0);
    const int N = 3000;
    int taken = 0;
    uint64_t x = 0x2545F4914F6CDD1Dull;
    for (int t = 0; t < N; t++) {
        const int32_t draft[2] = {test_draw(q, V, &x), test_draw(q + V, V, &x)};
        CHECK(kiln_session_keep(s, (int64_t)p.n - 1) == (int64_t)p.n - 1);
        kiln_sampler *r = NULL;
        kiln_sampler_params rp = tpp;
        rp.seed = 7919ull * (uint64_t)(t + 1);
        CHECK(kiln_sampler_new(&rp, V, &r) == KILN_OK);
        int32_t out[3], next[1];
        size_t n_out = 0, n_next = 0;
        CHECK(kiln_spec_verify_sample(s, r, V, p.ids[p.n - 1], q, draft, 2, out, &n_out) == KILN_OK, "%s", kiln_last_error());
        CHECK(n_out >= 1 && n_out <= 3 && (n_out == 1 || out[0] == draft[0]) && (n_out < 3 || out[1] == draft[1]));
        taken += (int)n_out - 1;
        if (n_out == 1) /* the second token comes from the next round, here one without drafts */
            CHECK(kiln_spec_verify_sample(s, r, V, out[0], NULL, NULL, 0, next, &n_next) == KILN_OK && n_next == 1);
        kiln_sampler_free(r);
        CHECK(p1[out[0]] > 0, "token %d of probability 0 under the target", (int)out[0]);
        c1[out[0]]++, c2[n_out == 1 ? next[0] : out[1]]++;
    }
    const double chi1 = chi_square(p1, V, c1, N), chi2 = chi_square(p2, V, c2, N);
    CHECK(chi1 < 26.1, "first token: chi-square %.1f over 8 df (0.001: 26.1)", chi1);
    CHECK(chi2 < 26.1, "second token: chi-square %.1f over 8 df (0.001: 26.1)", chi2);
    /* both of the rule's branches ran: drafts taken and refused */
    CHECK(taken > N / 10 && taken < 2 * N - N / 10, "%d of %d drafts taken", taken, 2 * N);
    free(p1), free(p2), free(row), free(q), free(c1), free(c2);
    kiln_sampler_free(tp), kiln_sampler_free(qp);
    kiln_session_free(s);
    kiln_tokens_free(&p);
    kiln_model_free(m);
}

int main(void) {
    RUN(test_lookup);
    RUN(test_accept_greedy_rows);
    RUN(test_verify_matches_greedy);
    RUN(test_verify_sample_keeps_distribution);
    RUN(test_verify_sample_draft_model);
    TEST_EXIT();
}
