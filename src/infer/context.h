/* context.h: what a session (session.c) uses of a context (context.c) beyond the public kiln_context API: a context
 * opened under the session's name (its messages start "session:"), the chunked evaluation of one sequence with
 * the session's checks and outputs, and the backend's per-step profile. */
#ifndef KILN_INFER_CONTEXT_H
#define KILN_INFER_CONTEXT_H

#include "model/backend.h"

/* kiln_context_new, with who ("session", "context") starting every message of the context. */
kiln_status kiln_context_open(const kiln_model *m, const kiln_context_params *p, const char *who, kiln_context **out);
/* n tokens of sequence seq at its position, in chunks of n_batch: the last row's logits into logits, every row's into
 * all_logits ((n, V)), the last row's argmax into next (each NULL when not wanted). The ids and the context are
 * checked first; on an error the sequence keeps the chunks that ran before it. */
kiln_status kiln_context_eval_seq(kiln_context *c, int32_t seq, const int32_t *ids, size_t n, float *logits, float *all_logits,
                                  int32_t *next);
/* kiln_context_eval_seq with the last row's next drawn on the backend under args (sample_args.h) instead of its
 * argmax, the logits left there; KILN_ERR_UNSUPPORTED where the backend has no sampler. */
kiln_status kiln_context_eval_seq_sampled(kiln_context *c, int32_t seq, const int32_t *ids, size_t n, const kiln_sample_args *args,
                                          int32_t *next);

/* The model's vocabulary size. */
int64_t kiln_context_n_vocab(const kiln_context *c);
/* Tokens run through the forward since the context was made. */
int64_t kiln_context_n_evaluated(const kiln_context *c);
/* The backend's per-step profile of one decode of sequence 0 at position pos0 (the step writes its cache row). */
kiln_status kiln_context_profile(kiln_context *c, int64_t pos0, int reps, kiln_op_time *ops, int *n_ops);

#endif
