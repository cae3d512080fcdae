/* speculative.c: speculative decoding's halves, which the CLI's generate loop and the server combine.
 *
 *   drafting   prompt lookup: the latest earlier occurrence of the sequence's last g tokens (g from ngram_max down to
 *              ngram_min, the longest that occurs) proposes the tokens that followed it, as llama.cpp's lookup does;
 *              or a draft model's own tokens (kiln_spec_draft: its argmax, or a draw from its distribution q
 *              under the target's sampler settings)
 *   accepting  kiln_spec_accept_greedy / kiln_spec_accept_sample: given the target's k + 1 rows of logits (row i
 *              after t0 and draft[0..i)), which drafts are taken and the target's own token after them
 *   verifying  kiln_spec_verify_greedy / kiln_spec_verify_sample: a session evaluates the token it would feed next
 *              (t0) and the k drafts in one batched forward, accepts, and is cut back to what was taken, so its
 *              cache holds exactly t0 and the accepted drafts, as a run without drafts would have
 *
 * Greedy: the drafts are taken while each equals the target's argmax after the one before, then the target's argmax
 * at the first that differs (or after the last). The tokens are plain greedy decoding's, as long as the batched
 * forward's argmaxes equal the single-token forward's (tests/test_speculative.c checks that they do).
 *
 * Sampling: the standard rule (Leviathan et al. 2023, Chen et al. 2023). Draft d, sampled from the drafter's q, after
 * the target's distribution p (the sampler's whole pipeline, kiln_sampler_probs) is taken with probability
 * min(1, p(d) / q(d)); at the first refused one the token is drawn from max(0, p - q) renormalized; after the last
 * taken draft one more is drawn from p. A draft certain under its drafter (prompt lookup, q NULL) is q = one-hot:
 * taken with probability p(d), else drawn from p without d. Each emitted token is then distributed as p, exactly as
 * sampling without drafts (tested by frequencies on the first and second token). */
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

size_t kiln_spec_accept_greedy(const float *rows, int64_t n_vocab, const int32_t *draft, size_t k, int32_t *out) {
    size_t j = 0;
    /* row j is the target's prediction after t0 and draft[0..j): it must be draft[j] for draft[j] to be taken */
    while (j < k && argmax(rows + j * (size_t)n_vocab, n_vocab) == draft[j]) out[j] = draft[j], j++;
    out[j] = argmax(rows + j * (size_t)n_vocab, n_vocab);
    return j + 1;
}

size_t kiln_spec_accept_sample(kiln_sampler *smp, float *rows, int64_t n_vocab, const float *q, const int32_t *draft, size_t k,
                               int32_t *out) {
    for (size_t j = 0;; j++) {
        float *p = rows + j * (size_t)n_vocab;
        kiln_sampler_probs(smp, p, NULL, 0); /* the target's distribution after t0 and draft[0..j) */
        if (j == k) {
            out[j] = kiln_sampler_draw(smp, p);
            return j + 1;
        }
        const int32_t d = draft[j];
        const float *qj = q ? q + j * (size_t)n_vocab : NULL;
        const float qd = qj ? qj[d] : 1.0f;
        /* taken with probability min(1, p(d) / q(d)), written without the division (q(d) 0: taken where p(d) > 0) */
        if (kiln_sampler_coin(smp) * qd < p[d]) {
            out[j] = d;
            continue;
        }
        /* refused: a draw from the residual max(0, p - q), which kiln_sampler_draw renormalizes; it has mass, since
         * p(d) < q(d) and both summing to 1 mean p exceeds q somewhere */
        double mass = 0;
        for (int64_t i = 0; i < n_vocab; i++) {
            p[i] = qj ? (p[i] > qj[i] ? p[i] - qj[i] : 0.0f) : (i == d ? 0.0f : p[i]);
            mass += p[i];
        }
        out[j] = mass > 0 ? kiln_sampler_draw(smp, p) : d; /* no mass left only by float rounding, p = q */
        return j + 1;
    }
}

kiln_status kiln_spec_draft(kiln_session *ds, kiln_sampler *smp, int64_t n_vocab, const int32_t *ids, size_t n, size_t k,
                            int32_t *draft, float *q) {
    if (!k) return KILN_OK;
    if (!smp) { /* greedy: on the GPU only the argmax comes back */
        kiln_status st = kiln_session_eval_argmax(ds, ids, n, &draft[0]);
        for (size_t j = 1; !st && j < k; j++) st = kiln_session_eval_argmax(ds, &draft[j - 1], 1, &draft[j]);
        return st;
    }
    for (size_t j = 0; j < k; j++) {
        float *qj = q + j * (size_t)n_vocab;
        kiln_status st = j ? kiln_session_eval(ds, &draft[j - 1], 1, qj, NULL) : kiln_session_eval(ds, ids, n, qj, NULL);
        if (st) return st;
        kiln_sampler_probs(smp, qj, NULL, 0); /* the drafter's q, under the target's sampler settings */
        draft[j] = kiln_sampler_draw(smp, qj);
    }
    return KILN_OK;
}

/* The prologue both verifiers share: t0 and draft[0..k) through the session in one forward, their k + 1 rows of
 * logits into *rows (malloc'd; the caller frees it). */
static kiln_status verify_eval(kiln_session *s, int64_t n_vocab, int32_t t0, const int32_t *draft, size_t k, float **rows) {
    *rows = NULL;
    const int64_t pos = kiln_session_pos(s);
    if (k + 1 > (size_t)(kiln_session_n_ctx(s) - pos))
        return kiln_fail(KILN_ERR_RANGE, "speculative: %zu drafted tokens do not fit the context's %lld free positions", k,
                         (long long)(kiln_session_n_ctx(s) - pos - 1));
    int32_t *ids = malloc((k + 1) * sizeof *ids);
    float *r = malloc((k + 1) * (size_t)n_vocab * sizeof *r);
    if (!ids || !r) {
        free(ids), free(r);
        return kiln_fail(KILN_ERR_NOMEM, "speculative: out of memory for %zu rows of logits", k + 1);
    }
    ids[0] = t0;
    if (k) memcpy(ids + 1, draft, k * sizeof *ids);
    kiln_status st = kiln_session_eval(s, ids, k + 1, NULL, r);
    free(ids);
    if (st) free(r);
    else *rows = r;
    return st;
}

/* The epilogue: keep t0 and the taken drafts (n_out - 1 of them) at pos; the next token (out's last) is fed by the
 * caller, as in plain decoding. */
static kiln_status verify_keep(kiln_session *s, int64_t pos, size_t n_out) {
    const int64_t keep = pos + (int64_t)n_out;
    if (kiln_session_keep(s, keep) != keep)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "speculative: the model's sliding-window cache cannot be cut back to position %lld",
                         (long long)keep);
    return KILN_OK;
}

/* Both verifiers: one forward over t0 and the drafts, the acceptance (greedy without smp), the cache cut back. */
static kiln_status verify(kiln_session *s, kiln_sampler *smp, int64_t n_vocab, int32_t t0, const float *q, const int32_t *draft, size_t k,
                          int32_t *out, size_t *n_out) {
    *n_out = 0;
    const int64_t pos = kiln_session_pos(s);
    float *rows;
    kiln_status st = verify_eval(s, n_vocab, t0, draft, k, &rows);
    if (st) return st;
    *n_out = smp ? kiln_spec_accept_sample(smp, rows, n_vocab, q, draft, k, out) : kiln_spec_accept_greedy(rows, n_vocab, draft, k, out);
    free(rows);
    return verify_keep(s, pos, *n_out);
}

kiln_status kiln_spec_verify_greedy(kiln_session *s, int64_t n_vocab, int32_t t0, const int32_t *draft, size_t k, int32_t *out,
                                    size_t *n_out) {
    return verify(s, NULL, n_vocab, t0, NULL, draft, k, out, n_out);
}

kiln_status kiln_spec_verify_sample(kiln_session *s, kiln_sampler *smp, int64_t n_vocab, int32_t t0, const float *q, const int32_t *draft,
                                    size_t k, int32_t *out, size_t *n_out) {
    if (!smp) {
        *n_out = 0;
        return kiln_fail(KILN_ERR_INVALID, "speculative: verify_sample needs a sampler");
    }
    return verify(s, smp, n_vocab, t0, q, draft, k, out, n_out);
}
