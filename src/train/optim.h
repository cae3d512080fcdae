/* optim.h: AdamW over one flat fp32 parameter buffer, fused with global-norm gradient clipping, decoupled
 * weight decay, a non-finite guard and the refresh of the bf16 compute mirror; its 8-bit variant (int8
 * moments, one scale per 256 elements); and the learning-rate schedule.
 *
 * The parameters are segments of the buffer (one per tensor) so that decay can be switched off per
 * tensor (norms and embeddings by default). Every reduction is deterministic: the result does not depend
 * on the number of threads. */
#ifndef KILN_TRAIN_OPTIM_H
#define KILN_TRAIN_OPTIM_H

#include "kiln.h"
#include "pool.h"

/* kiln_adamw_cfg, kiln_adamw_defaults, kiln_lr_schedule and kiln_lr_at are public (kiln.h's training section). */

#define KILN_ADAMW8_BLOCK 256

typedef struct kiln_param_segment {
    int64_t offset, n; /* elements of the flat buffer */
    bool decay;
} kiln_param_segment;

/* The optimizer state. Its arrays are public so checkpoints can save and restore them as they are. */
typedef struct kiln_adamw {
    kiln_adamw_cfg cfg;
    int64_t n;             /* parameters */
    int64_t step;          /* updates applied so far (skipped steps do not count) */
    int64_t n_skipped;     /* steps skipped for a non-finite gradient */
    kiln_param_segment *segs; /* (n_segs) a copy, sorted by offset; elements outside every segment do not decay */
    int n_segs;
    /* fp32 moments (cfg.eight_bit false): m, v (n each); NULL otherwise */
    float *m, *v;
    /* 8-bit moments (cfg.eight_bit true): m8, v8 (n each) and their scales (ceil(n / 256) each); NULL otherwise.
     * m8 is an E4M3 code of m / m_scale, v8 an E4M4 code of sqrt(v) / v_scale: optim.c's header has the format. */
    int8_t *m8;
    uint8_t *v8;
    float *m_scale, *v_scale;
} kiln_adamw;

typedef struct kiln_adamw_result {
    double grad_norm; /* global L2 norm of the gradient before clipping (NaN/Inf when non-finite) */
    bool skipped;     /* the gradient, or the weights it would give, were non-finite: nothing changed but n_skipped */
    int64_t bad_at;   /* -1, or the first element of the chunk whose updated weights would have been non-finite */
} kiln_adamw_result;

/* Zeroed moments for n parameters. Segments may come in any order and leave gaps, but must lie inside the
 * buffer (KILN_ERR_RANGE) and must not overlap (KILN_ERR_INVALID); empty ones are ignored. */
kiln_status kiln_adamw_init(kiln_adamw *opt, const kiln_adamw_cfg *cfg, int64_t n, const kiln_param_segment *segs, int n_segs);
void kiln_adamw_free(kiln_adamw *opt); /* accepts NULL and freed or zeroed state */

/* One step at learning rate lr: the norm of grads (n), then, if it is finite, the weights the update would give
 * are checked (a sum of squares per chunk of them, nothing written); if they are all finite, clip, update the
 * moments, apply decoupled decay and the Adam update to params (n, fp32 master), and when mirror is not NULL
 * write the updated parameters to it as bf16 (round to nearest even). A non-finite gradient or updated weight
 * skips the step (n_skipped counts it; params and moments stay as they were). grads is not modified. pool may
 * be NULL (one thread). */
kiln_adamw_result kiln_adamw_step(kiln_adamw *opt, kiln_pool *pool, float *params, const float *grads, uint16_t *mirror, float lr);

/* The global L2 norm of x (n), deterministic (double partials in a fixed order): the same bits for any pool. */
double kiln_grad_norm(kiln_pool *pool, const float *x, int64_t n);

/* bf16 conversion used by the mirror (round to nearest even, NaN kept NaN). */
void kiln_f32_to_bf16_row(const float *x, uint16_t *y, int64_t n);

#endif
