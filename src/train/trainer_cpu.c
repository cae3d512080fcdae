/* trainer_cpu.c: the CPU implementation of trainer.h: a kiln_llama_train (src/train/llama_train.c) stepped through
 * the CPU ops table on a thread pool, and kiln_adamw (optim.c: fp32 or 8-bit moments). The state lives in host
 * arrays, so get_state and set_state are copies. tests/test_train.c runs it end to end. */
#include "trainer.h"
#include "status.h"

#include <stdlib.h>
#include <string.h>

void kiln_train_segments(const kiln_llama_train *m, kiln_param_segment *segs) {
    for (int i = 0; i < m->n_tensors; i++)
        segs[i] = (kiln_param_segment){.offset = m->tensors[i].offset, .n = m->tensors[i].n, .decay = m->tensors[i].decay};
}

static kiln_cpu_trainer *cpu(kiln_trainer_impl *t) { return (kiln_cpu_trainer *)t; }

static kiln_status cpu_step(kiln_trainer_impl *t, const int32_t *inputs, const int32_t *targets, float grad_scale,
                            double *loss_sum, int64_t *n_counted) {
    kiln_cpu_trainer *c = cpu(t);
    if (c->mirror_stale) kiln_llama_train_refresh_mirror(c->m), c->mirror_stale = false;
    for (int64_t i = 0; i < c->m->B * c->m->T; i++) /* the ops index tables by these: check them here */
        if (inputs[i] < 0 || inputs[i] >= c->m->cfg.n_vocab || targets[i] < -1 || targets[i] >= c->m->cfg.n_vocab)
            return kiln_fail(KILN_ERR_RANGE, "train: token id %d (input) or %d (target) at row %lld is outside the vocab of %lld",
                             inputs[i], targets[i], (long long)i, (long long)c->m->cfg.n_vocab);
    *loss_sum = kiln_llama_train_step(c->m, &kiln_cpu_ops, t->cfg.pool, inputs, targets, grad_scale, n_counted);
    return KILN_OK;
}

static kiln_status cpu_zero_grads(kiln_trainer_impl *t) {
    memset(cpu(t)->m->grads, 0, (size_t)cpu(t)->m->n_params * sizeof(float));
    return KILN_OK;
}

static kiln_status cpu_optimizer_step(kiln_trainer_impl *t, float lr, kiln_adamw_result *out) {
    kiln_cpu_trainer *c = cpu(t);
    if (c->mirror_stale) kiln_llama_train_refresh_mirror(c->m), c->mirror_stale = false;
    *out = kiln_adamw_step(c->opt, t->cfg.pool, c->m->params, c->m->grads, c->m->mirror, lr);
    return KILN_OK;
}

static void cpu_reduce_next(kiln_trainer_impl *t) {}
static kiln_status cpu_agree(kiln_trainer_impl *t, bool *flag) { return KILN_OK; }
static kiln_status cpu_state_begin(kiln_trainer_impl *t, kiln_train_part part) { return KILN_OK; }

/* The host array of part and its element size; NULL when this optimizer has no such part. */
static void *part_array(kiln_cpu_trainer *c, kiln_train_part part, size_t *elem, int64_t *n) {
    const kiln_adamw *o = c->opt;
    const int64_t np = c->m->n_params, nb = (np + KILN_ADAMW8_BLOCK - 1) / KILN_ADAMW8_BLOCK;
    *elem = 4, *n = np;
    switch (part) {
    case KILN_PART_PARAMS: return c->m->params;
    case KILN_PART_M: return o ? o->m : NULL;
    case KILN_PART_V: return o ? o->v : NULL;
    case KILN_PART_M8: *elem = 1; return o ? o->m8 : NULL;
    case KILN_PART_V8: *elem = 1; return o ? o->v8 : NULL;
    case KILN_PART_M_SCALE: *n = nb; return o ? o->m_scale : NULL;
    case KILN_PART_V_SCALE: *n = nb; return o ? o->v_scale : NULL;
    }
    return NULL;
}

static kiln_status cpu_state_copy(kiln_trainer_impl *t, kiln_train_part part, int64_t first, int64_t n, void *dst, const void *src) {
    size_t elem;
    int64_t total;
    char *a = part_array(cpu(t), part, &elem, &total);
    if (!a) return kiln_fail(KILN_ERR_INVALID, "train: this optimizer has no state part %d", (int)part);
    if (first < 0 || n < 0 || first + n > total)
        return kiln_fail(KILN_ERR_RANGE, "train: state range [%lld, %lld) outside %lld elements", (long long)first,
                         (long long)(first + n), (long long)total);
    if (dst) memcpy(dst, a + (size_t)first * elem, (size_t)n * elem);
    else memcpy(a + (size_t)first * elem, src, (size_t)n * elem);
    return KILN_OK;
}

static kiln_status cpu_get_state(kiln_trainer_impl *t, kiln_train_part part, int64_t first, int64_t n, void *dst) {
    return cpu_state_copy(t, part, first, n, dst, NULL);
}

static kiln_status cpu_set_state(kiln_trainer_impl *t, kiln_train_part part, int64_t first, int64_t n, const void *src) {
    if (part == KILN_PART_PARAMS) cpu(t)->mirror_stale = true;
    return cpu_state_copy(t, part, first, n, NULL, src);
}

static kiln_status cpu_get_counters(kiln_trainer_impl *t, kiln_train_counters *c) {
    c->opt_step = cpu(t)->opt ? cpu(t)->opt->step : 0;
    c->n_embed_skipped = cpu(t)->m->n_embed_skipped;
    return KILN_OK;
}

static kiln_status cpu_set_counters(kiln_trainer_impl *t, const kiln_train_counters *c) {
    if (cpu(t)->opt) cpu(t)->opt->step = c->opt_step;
    cpu(t)->m->n_embed_skipped = c->n_embed_skipped;
    return KILN_OK;
}

static size_t cpu_act_bytes(const kiln_trainer_impl *t) { return ((const kiln_cpu_trainer *)t)->m->act_bytes; }

static void cpu_free(kiln_trainer_impl *t) {
    kiln_cpu_trainer *c = cpu(t);
    if (!c->owned) return;
    kiln_adamw_free(&c->own_opt);
    kiln_llama_train_free(c->m);
    free(c);
}

static const kiln_trainer_ops cpu_ops = {
    .name = "cpu",
    .step = cpu_step,
    .zero_grads = cpu_zero_grads,
    .optimizer_step = cpu_optimizer_step,
    .reduce_next = cpu_reduce_next,
    .agree = cpu_agree,
    .state_begin = cpu_state_begin,
    .get_state = cpu_get_state,
    .set_state = cpu_set_state,
    .get_counters = cpu_get_counters,
    .set_counters = cpu_set_counters,
    .act_bytes = cpu_act_bytes,
    .free = cpu_free,
};

kiln_trainer_impl *kiln_trainer_cpu_borrow(kiln_cpu_trainer *c, kiln_llama_train *m, kiln_adamw *opt) {
    memset(c, 0, sizeof *c);
    c->base.ops = &cpu_ops;
    c->base.m = m;
    c->base.cfg.mixed = m->mirror != NULL;
    if (opt) c->base.cfg.adam = opt->cfg;
    c->m = m, c->opt = opt;
    return &c->base;
}

kiln_llama_train *kiln_trainer_cpu_model(kiln_trainer_impl *t) { return t && t->ops == &cpu_ops ? cpu(t)->m : NULL; }

kiln_status kiln_trainer_cpu_new(const kiln_llama_config *cfg, const kiln_trainer_cfg *tc, kiln_trainer_impl **out) {
    *out = NULL;
    kiln_cpu_trainer *c = calloc(1, sizeof *c);
    kiln_llama_train *m = NULL;
    kiln_param_segment *segs = NULL;
    if (!c) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    kiln_status s = kiln_llama_train_new(cfg, tc->mixed, &m);
    if (!s) s = kiln_llama_train_reserve(m, tc->B, tc->T, kiln_pool_size(tc->pool));
    if (!s && !(segs = malloc((size_t)m->n_tensors * sizeof *segs))) s = kiln_fail(KILN_ERR_NOMEM, "out of memory");
    if (!s) {
        kiln_trainer_cpu_borrow(c, m, &c->own_opt); /* before the optimizer: it zeroes c */
        kiln_train_segments(m, segs);
        s = kiln_adamw_init(&c->own_opt, &tc->adam, m->n_params, segs, m->n_tensors);
    }
    free(segs);
    if (s) {
        kiln_llama_train_free(m);
        free(c);
        return s;
    }
    c->base.cfg = *tc;
    c->owned = true;
    m->label_smoothing = tc->label_smoothing;
    m->z_loss = tc->z_loss;
    *out = &c->base;
    return KILN_OK;
}

void kiln_trainer_impl_free(kiln_trainer_impl *t) {
    if (t) t->ops->free(t);
}
