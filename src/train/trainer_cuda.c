/* trainer_cuda.c: the CUDA implementation of trainer.h, over src/cuda/trainer.cu's kiln_cuda_trainer (its own
 * fused bf16 orchestration and AdamW, fp32 or 8-bit; data parallel through a kiln_dist). The host keeps the layout only: the
 * parameters, gradients and moments live on the device and the state streams through kiln_cuda_trainer_read and
 * _write. Built without CUDA, cuda/none.c makes every call answer KILN_ERR_UNSUPPORTED. tests/test_cuda_train.c
 * and tests/test_train.c's GPU cases cover it (they skip without a GPU). */
#include "trainer.h"
#include "cuda/cuda.h"
#include "status.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct cuda_trainer {
    kiln_trainer_impl base;
    kiln_llama_train *layout;
    kiln_cuda_trainer *g;
} cuda_trainer;

static cuda_trainer *gpu(kiln_trainer_impl *t) { return (cuda_trainer *)t; }

static kiln_status cuda_step(kiln_trainer_impl *t, const int32_t *inputs, const int32_t *targets, float grad_scale,
                             double *loss_sum, int64_t *n_counted) {
    return kiln_cuda_trainer_step(gpu(t)->g, inputs, targets, grad_scale, loss_sum, n_counted);
}

static kiln_status cuda_zero_grads(kiln_trainer_impl *t) { return kiln_cuda_trainer_zero_grads(gpu(t)->g); }

static kiln_status cuda_optimizer_step(kiln_trainer_impl *t, float lr, kiln_adamw_result *out) {
    *out = (kiln_adamw_result){.grad_norm = NAN, .skipped = true, .bad_at = -1};
    return kiln_cuda_trainer_adamw(gpu(t)->g, &t->cfg.adam, lr, &out->grad_norm, &out->skipped);
}

static void cuda_reduce_next(kiln_trainer_impl *t) { kiln_cuda_trainer_reduce_next(gpu(t)->g); }
static kiln_status cuda_agree(kiln_trainer_impl *t, bool *flag) { return kiln_cuda_trainer_agree(gpu(t)->g, flag); }

/* The device's parts, the same as the host's. */
static kiln_status cuda_part(kiln_train_part part, kiln_cuda_train_part *out) {
    switch (part) {
    case KILN_PART_PARAMS: *out = KILN_CUDA_TRAIN_PARAMS; return KILN_OK;
    case KILN_PART_M: *out = KILN_CUDA_TRAIN_M; return KILN_OK;
    case KILN_PART_V: *out = KILN_CUDA_TRAIN_V; return KILN_OK;
    case KILN_PART_M8: *out = KILN_CUDA_TRAIN_M8; return KILN_OK;
    case KILN_PART_V8: *out = KILN_CUDA_TRAIN_V8; return KILN_OK;
    case KILN_PART_M_SCALE: *out = KILN_CUDA_TRAIN_M_SCALE; return KILN_OK;
    case KILN_PART_V_SCALE: *out = KILN_CUDA_TRAIN_V_SCALE; return KILN_OK;
    }
    return kiln_fail(KILN_ERR_INVALID, "gpu train: no state part %d", (int)part);
}

static kiln_status cuda_state_begin(kiln_trainer_impl *t, kiln_train_part part) {
    kiln_cuda_train_part p = KILN_CUDA_TRAIN_PARAMS;
    TRY(cuda_part(part, &p));
    return kiln_cuda_trainer_gather(gpu(t)->g, p);
}

static kiln_status cuda_get_state(kiln_trainer_impl *t, kiln_train_part part, int64_t first, int64_t n, void *dst) {
    kiln_cuda_train_part p = KILN_CUDA_TRAIN_PARAMS;
    TRY(cuda_part(part, &p));
    return kiln_cuda_trainer_read(gpu(t)->g, p, first, n, dst);
}

static kiln_status cuda_set_state(kiln_trainer_impl *t, kiln_train_part part, int64_t first, int64_t n, const void *src) {
    kiln_cuda_train_part p = KILN_CUDA_TRAIN_PARAMS;
    TRY(cuda_part(part, &p));
    return kiln_cuda_trainer_write(gpu(t)->g, p, first, n, src);
}

static kiln_status cuda_get_counters(kiln_trainer_impl *t, kiln_train_counters *c) {
    return kiln_cuda_trainer_get_counters(gpu(t)->g, &c->opt_step, &c->n_embed_skipped);
}

static kiln_status cuda_set_counters(kiln_trainer_impl *t, const kiln_train_counters *c) {
    return kiln_cuda_trainer_set_counters(gpu(t)->g, c->opt_step, c->n_embed_skipped);
}

static size_t cuda_act_bytes(const kiln_trainer_impl *t) { return kiln_cuda_trainer_bytes(((const cuda_trainer *)t)->g); }

static void cuda_free(kiln_trainer_impl *t) {
    kiln_cuda_trainer_free(gpu(t)->g); /* before the layout it reads */
    kiln_llama_train_free(gpu(t)->layout);
    free(t);
}

static const kiln_trainer_ops cuda_ops = {
    .name = "cuda",
    .step = cuda_step,
    .zero_grads = cuda_zero_grads,
    .optimizer_step = cuda_optimizer_step,
    .reduce_next = cuda_reduce_next,
    .agree = cuda_agree,
    .state_begin = cuda_state_begin,
    .get_state = cuda_get_state,
    .set_state = cuda_set_state,
    .get_counters = cuda_get_counters,
    .set_counters = cuda_set_counters,
    .act_bytes = cuda_act_bytes,
    .free = cuda_free,
};

kiln_status kiln_trainer_cuda_new(const kiln_llama_config *c, const kiln_trainer_cfg *tc, kiln_trainer_impl **out) {
    *out = NULL;
    /* data parallel, kiln_dist_init has chosen the rank's device */
    if (!tc->dist && tc->device != 0) TRY(kiln_cuda_set_device(tc->device));
    cuda_trainer *t = calloc(1, sizeof *t);
    if (!t) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    kiln_status s = kiln_llama_train_layout(c, &t->layout);
    if (!s) {
        t->layout->label_smoothing = tc->label_smoothing;
        t->layout->z_loss = tc->z_loss;
        s = kiln_cuda_trainer_new(t->layout, tc->B, tc->T, tc->cuda_flags | (tc->adam.eight_bit ? KILN_CUDA_TRAIN_ADAM8 : 0u), tc->dist,
                                  &t->g);
    }
    if (s) {
        kiln_llama_train_free(t->layout);
        free(t);
        return s;
    }
    t->base.ops = &cuda_ops;
    t->base.m = t->layout;
    t->base.cfg = *tc;
    *out = &t->base;
    return KILN_OK;
}
