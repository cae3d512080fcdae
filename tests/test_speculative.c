/* test_speculative.c: greedy speculative decoding's halves (src/infer/speculative.c).
 *   lookup     kiln_spec_lookup on hand-made sequences: the longest n-gram that recurs, its latest occurrence, the
 *              draft cut at max_draft and at the sequence's end, none when nothing recurs
 *   verify     on the bundled model, against plain greedy decoding token by token (kiln_session_eval_argmax, one
 *              token a step): drafts equal to the greedy continuation are all taken and the bonus token is the next
 *              greedy one; a draft wrong at position 2 takes 2, then the greedy token; a wrong first draft takes
 *              none; after each, the session's position and its next argmax are plain decoding's, so a run
 *              continues exactly as one without drafts */
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

int main(void) {
    RUN(test_lookup);
    RUN(test_verify_matches_greedy);
    TEST_EXIT();
}
