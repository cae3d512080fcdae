/* speculative.c: greedy speculative decoding's two halves, which the CLI's generate loop (and a server's) combine.
 *
 *   drafting   prompt lookup: the latest earlier occurrence of the sequence's last g tokens (g from ngram_max down to
 *              ngram_min, the longest that occurs) proposes the tokens that followed it, as llama.cpp's lookup does;
 *              or a draft model's own greedy tokens (the caller runs the draft session with kiln_session_eval_argmax)
 *   verifying  kiln_spec_verify_greedy: the target evaluates the token it would feed next (t0) and the k drafted ones
 *              in one batched forward; the drafted tokens are taken while each equals the target's argmax after
 *              the one before, and the target's own argmax at the first that differs (or after the last) comes
 *              with them. The session is then cut back to what was taken, so its cache holds exactly t0 and the
 *              accepted drafts, as a run without drafts would have.
 * The tokens are the ones plain greedy decoding gives, as long as the batched forward's argmaxes equal the
 * single-token forward's (tests/test_speculative.c checks that they do on the bundled model).
 *
 * Sampling (kiln_spec_verify_sample, for drafts that are certain under their drafter, as prompt lookup's): the
 * standard rule with a one-hot draft distribution. Draft d after the target's distribution p (the sampler's whole
 * pipeline, kiln_sampler_probs) is taken with probability p(d); at the first refused one the token is drawn from p
 * without d, renormalized; after the last taken draft one more is drawn from p. Each emitted token is then
 * distributed as p, exactly as sampling without drafts (tested by frequencies). */
#include "kiln.h"
#include "status.h"

#include <stdlib.h>
#include <string.h>

size_t kiln_spec_lookup(const int32_t *seq, size_t n, int ngram_min, int ngram_max, size_t max_draft, int32_t *draft) {
    if (ngram_min < 1) ngram_min = 1;
    for (int g = ngram_max; g >= ngram_min; g--) {
        if ((size_t)g >= n) continue;
        const int32_t *tail = seq + n - g;
        /* the latest start i < n - g whose g tokens equal the tail's, with at least one token after them */
        for (size_t i = n - (size_t)g; i-- > 0;) {
            if (memcmp(seq + i, tail, (size_t)g * sizeof *seq) != 0) continue;
            size_t k = 0;
            for (size_t j = i + (size_t)g; j < n && k < max_draft; j++) draft[k++] = seq[j];
            if (k) return k;
        }
    }
    return 0;
}

static int32_t argmax(const float *row, int64_t V) {
    int32_t best = 0;
    for (int64_t i = 1; i < V; i++)
        if (row[i] > row[best]) best = (int32_t)i;
    return best;
}

kiln_status kiln_spec_verify_greedy(kiln_session *s, int64_t n_vocab, int32_t t0, const int32_t *draft, size_t k, int32_t *out,
                                    size_t *n_out) {
    *n_out = 0;
    const int64_t pos = kiln_session_pos(s);
    if (k + 1 > (size_t)(kiln_session_n_ctx(s) - pos))
        return kiln_fail(KILN_ERR_RANGE, "speculative: %zu drafted tokens do not fit the context's %lld free positions", k,
                         (long long)(kiln_session_n_ctx(s) - pos - 1));
    int32_t *ids = malloc((k + 1) * sizeof *ids);
    float *rows = malloc((k + 1) * (size_t)n_vocab * sizeof *rows);
    if (!ids || !rows) {
        free(ids), free(rows);
        return kiln_fail(KILN_ERR_NOMEM, "speculative: out of memory for %zu rows of logits", k + 1);
    }
    ids[0] = t0;
    if (k) memcpy(ids + 1, draft, k * sizeof *ids);
    kiln_status st = kiln_session_eval(s, ids, k + 1, NULL, rows);
    size_t j = 0;
    if (!st) {
        /* row i is the target's prediction after ids[0..i]: it must be draft[i] for draft[i] to be taken */
        while (j < k && argmax(rows + j * (size_t)n_vocab, n_vocab) == draft[j]) out[j] = draft[j], j++;
        out[j] = argmax(rows + j * (size_t)n_vocab, n_vocab);
        *n_out = j + 1;
        /* keep t0 and the j accepted drafts; the next token (out[j]) is fed by the caller, as in plain decoding */
        if (kiln_session_keep(s, pos + 1 + (int64_t)j) != pos + 1 + (int64_t)j)
            st = kiln_fail(KILN_ERR_UNSUPPORTED, "speculative: the model's sliding-window cache cannot be cut back to position %lld",
                           (long long)(pos + 1 + (int64_t)j));
    }
    free(ids), free(rows);
    return st;
}

/* The first index whose running sum of p exceeds coin * (the sum of p). */
static int32_t draw(const float *p, int64_t V, float coin) {
    double total = 0;
    for (int64_t i = 0; i < V; i++) total += p[i];
    const double r = coin * total;
    double cdf = 0;
    int32_t last = 0;
    for (int64_t i = 0; i < V; i++) {
        if (p[i] <= 0) continue;
        cdf += p[i], last = (int32_t)i;
        if (r < cdf) return (int32_t)i;
    }
    return last; /* rounding */
}

kiln_status kiln_spec_verify_sample(kiln_session *s, kiln_sampler *smp, int64_t n_vocab, int32_t t0, const int32_t *draft, size_t k,
                                    int32_t *out, size_t *n_out) {
    *n_out = 0;
    const int64_t pos = kiln_session_pos(s);
    if (k + 1 > (size_t)(kiln_session_n_ctx(s) - pos))
        return kiln_fail(KILN_ERR_RANGE, "speculative: %zu drafted tokens do not fit the context's %lld free positions", k,
                         (long long)(kiln_session_n_ctx(s) - pos - 1));
    int32_t *ids = malloc((k + 1) * sizeof *ids);
    float *rows = malloc((k + 1) * (size_t)n_vocab * sizeof *rows);
    if (!ids || !rows) {
        free(ids), free(rows);
        return kiln_fail(KILN_ERR_NOMEM, "speculative: out of memory for %zu rows of logits", k + 1);
    }
    ids[0] = t0;
    if (k) memcpy(ids + 1, draft, k * sizeof *ids);
    kiln_status st = kiln_session_eval(s, ids, k + 1, NULL, rows);
    size_t j = 0;
    if (!st) {
        for (;; j++) {
            float *p = rows + j * (size_t)n_vocab;
            kiln_sampler_probs(smp, p, NULL, 0); /* the target's distribution after ids[0..j] */
            if (j == k) {
                out[j] = draw(p, n_vocab, kiln_sampler_coin(smp));
                break;
            }
            /* a draft of probability 1 under its drafter: taken with the target's probability of it; otherwise the
             * token is drawn from the target's distribution without it, renormalized */
            if (kiln_sampler_coin(smp) < p[draft[j]]) {
                out[j] = draft[j];
                continue;
            }
            p[draft[j]] = 0.0f;
            out[j] = draw(p, n_vocab, kiln_sampler_coin(smp));
            break;
        }
        *n_out = j + 1;
        if (kiln_session_keep(s, pos + 1 + (int64_t)j) != pos + 1 + (int64_t)j)
            st = kiln_fail(KILN_ERR_UNSUPPORTED, "speculative: the model's sliding-window cache cannot be cut back to position %lld",
                           (long long)(pos + 1 + (int64_t)j));
    }
    free(ids), free(rows);
    return st;
}
