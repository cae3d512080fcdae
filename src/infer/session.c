/* session.c: a model running over one growing sequence: a context (context.c) of one sequence, which owns the KV
 * cache, the chunked prefill, the recorded single-token step (a CUDA graph on the GPU, with its argmax on the
 * device) and the checks of the logits; the session names itself in the messages ("session: ..."). The context
 * is the session's own (kiln_session_context), so a caller may save, restore or keep its sequence 0 directly.
 * tests/test_generate.c covers the errors and that chunking does not change the logits; tests/test_runtime.c the
 * non-finite checks and keep; tests/test_cuda_engine.c compares the GPU session with the CPU one. */
#include "infer/context.h"
#include "status.h"

#include <stdlib.h>
#include <string.h>

struct kiln_session {
    kiln_context *c;  /* one sequence: 0 */
    /* kiln_session_eval_sample's scratch, made at its first call */
    int32_t *window;  /* (n_ctx) the tail of the tokens its penalties read */
    float *logits;    /* (V) the row the host samples where the backend does not */
};

kiln_status kiln_session_new(const kiln_model *m, const kiln_session_params *p, kiln_session **out) {
    *out = NULL;
    kiln_context_params cp = {.n_seq = 1};
    if (p) cp.s = *p;
    kiln_session *s = calloc(1, sizeof *s);
    if (!s) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    kiln_status st = kiln_context_open(m, &cp, "session", &s->c);
    if (st) {
        free(s);
        return st;
    }
    *out = s;
    return KILN_OK;
}

void kiln_session_free(kiln_session *s) {
    if (!s) return;
    kiln_context_free(s->c);
    free(s->window);
    free(s->logits);
    free(s);
}

kiln_context *kiln_session_context(kiln_session *s) { return s->c; }
int64_t kiln_session_pos(const kiln_session *s) { return kiln_context_seq_pos(s->c, 0); }
int64_t kiln_session_n_ctx(const kiln_session *s) { return kiln_context_n_ctx(s->c); }
const int32_t *kiln_session_tokens(const kiln_session *s) { return kiln_context_seq_tokens(s->c, 0); }
int64_t kiln_session_n_evaluated(const kiln_session *s) { return kiln_context_n_evaluated(s->c); }
bool kiln_session_on_gpu(const kiln_session *s) { return kiln_context_on_gpu(s->c); }
size_t kiln_session_device_bytes(const kiln_session *s) { return kiln_context_device_bytes(s->c); }
void kiln_session_reset(kiln_session *s) { kiln_context_seq_keep(s->c, 0, 0); }
int64_t kiln_session_keep(kiln_session *s, int64_t n) { return kiln_context_seq_keep(s->c, 0, n); }

kiln_status kiln_session_eval(kiln_session *s, const int32_t *ids, size_t n, float *logits, float *all_logits) {
    if (n == 0) {
        if (logits || all_logits) return kiln_fail(KILN_ERR_INVALID, "session: no tokens to evaluate, so no logits");
        return KILN_OK;
    }
    return kiln_context_eval_seq(s->c, 0, ids, n, logits, all_logits, NULL);
}

kiln_status kiln_session_eval_argmax(kiln_session *s, const int32_t *ids, size_t n, int32_t *next) {
    if (n == 0) return kiln_fail(KILN_ERR_INVALID, "session: no tokens to evaluate, so no argmax");
    return kiln_context_eval_seq(s->c, 0, ids, n, NULL, NULL, next);
}

kiln_status kiln_session_eval_sample(kiln_session *s, const int32_t *ids, size_t n, kiln_sampler *smp, int32_t *next) {
    if (n == 0) return kiln_fail(KILN_ERR_INVALID, "session: no tokens to evaluate, so nothing to sample");
    if (!ids || !smp || !next) return kiln_fail(KILN_ERR_INVALID, "session: eval_sample needs ids, a sampler and next");
    const int64_t pos = kiln_session_pos(s), n_ctx = kiln_context_n_ctx(s->c), V = kiln_context_n_vocab(s->c);
    bool bad = (int64_t)n > n_ctx - pos;
    for (size_t i = 0; i < n && !bad; i++) bad = ids[i] < 0 || ids[i] >= V;
    if (bad) /* the context's own message, before the sampler draws anything */
        return kiln_context_eval_seq(s->c, 0, ids, n, NULL, NULL, NULL);
    /* the penalties' window of the tokens after this step: the tail of the session's, then ids */
    const size_t n_hist = (size_t)pos + n, w = kiln_sampler_window(smp, n_hist);
    if (!s->window && !(s->window = malloc(sizeof *s->window * (size_t)n_ctx))) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    const size_t from_ids = w < n ? w : n, from_seq = w - from_ids;
    memcpy(s->window, kiln_session_tokens(s) + (pos - (int64_t)from_seq), from_seq * sizeof *s->window);
    memcpy(s->window + from_seq, ids + (n - from_ids), from_ids * sizeof *s->window);
    kiln_sample_args a;
    if (kiln_session_on_gpu(s) && kiln_sampler_step_args(smp, s->window, w, &a))
        return kiln_context_eval_seq_sampled(s->c, 0, ids, n, &a, next);
    if (!s->logits && !(s->logits = malloc(sizeof *s->logits * (size_t)V))) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    TRY(kiln_context_eval_seq(s->c, 0, ids, n, s->logits, NULL, NULL));
    *next = kiln_sampler_sample(smp, s->logits, s->window, w);
    return KILN_OK;
}

kiln_status kiln_session_profile(kiln_session *s, int64_t pos0, int reps, kiln_op_time *ops, int *n_ops) {
    return kiln_context_profile(s->c, pos0, reps, ops, n_ops);
}
