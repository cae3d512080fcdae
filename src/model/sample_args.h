/* sample_args.h: one sampling step as a backend takes it (src/cuda/sample.cu on the GPU), so that a non-greedy decode
 * step reads back the token alone: the sampler's settings, the coin its RNG drew for the step, and the penalties'
 * distinct tokens with their counts in the window. The session fills it from a kiln_sampler (sampler.c) in host
 * memory the backend copies from, so a recorded step (a CUDA graph) takes the new coin and window at every replay. */
#ifndef KILN_MODEL_SAMPLE_ARGS_H
#define KILN_MODEL_SAMPLE_ARGS_H

#include "kiln.h"

#include <stdbool.h>
#include <stdint.h>

/* Distinct tokens of the penalty window a step carries; a window with more falls back to the host sampler. */
#define KILN_SAMPLE_MAX_PEN 256
/* Ids a step may ban (ignore_eos: the end of sequence and of turn). */
#define KILN_SAMPLE_MAX_BAN 4

typedef struct kiln_sample_args {
    float temp, top_p, min_p;
    float repeat_penalty, presence_penalty, frequency_penalty;
    float coin;      /* [0, 1): the sampler's draw for this step (unused at temp 0) */
    int32_t top_k;
    int32_t n_pen;   /* entries of pen_id / pen_count in use */
    int32_t pen_id[KILN_SAMPLE_MAX_PEN];    /* distinct ids in the window, each in the vocab */
    int32_t pen_count[KILN_SAMPLE_MAX_PEN]; /* their occurrences there, >= 1 */
    int32_t n_ban;   /* entries of ban in use (kiln_sampler_step_args: the sampler's kiln_sampler_ban ids) */
    int32_t ban[KILN_SAMPLE_MAX_BAN];       /* ids never drawn: -inf after the penalties, as a host caller masks them
                                             * before kiln_sampler_sample (ids outside the vocab are passed over) */
} kiln_sample_args;

/* The step kiln_sampler_sample(s, logits, history, n_history) would take, as args: the settings, the penalties'
 * window, and (temp > 0) the next coin of s's RNG, drawn here exactly when kiln_sampler_sample would draw it, so a
 * seeded run draws the same coins on either side. false, with s untouched, when the window holds more than
 * KILN_SAMPLE_MAX_PEN distinct tokens (the caller then samples on the host). */
bool kiln_sampler_step_args(kiln_sampler *s, const int32_t *history, size_t n_history, kiln_sample_args *args);

/* Whether kiln_sampler_step_args takes this window (at most KILN_SAMPLE_MAX_PEN distinct tokens); s is untouched. */
bool kiln_sampler_step_fits(kiln_sampler *s, const int32_t *history, size_t n_history);

/* The sampler's pipeline under args on the host (a sampled step on the CPU, context.c): the token kiln_sampler_sample draws
 * from the same logits, history and coin, bit for bit. logits are left as they are; work holds
 * kiln_sample_args_work_bytes(V) bytes (a copy of the logits and the candidates). */
size_t kiln_sample_args_work_bytes(int64_t V);
int32_t kiln_sample_args_draw(const kiln_sample_args *args, const float *logits, int64_t V, void *work);

/* How many of the last of n_history tokens s's penalties read (0 when they are off). */
size_t kiln_sampler_window(const kiln_sampler *s, size_t n_history);

#endif
