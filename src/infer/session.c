/* session.c: a model running over a growing sequence. The session owns the f16 KV cache (sized from n_ctx),
 * one chunk's activations (proportional to n_batch), a persistent thread pool and the matmul weights in the
 * backend's layout, which replace the model's mmap pages they were copied from; that is all the memory it
 * takes. Prefill runs in chunks of n_batch tokens through the forward in src/model/llama.c. tests/test_generate.c
 * covers the errors and that chunking does not change the logits.
 *
 * A sliding-window layer (#6) keeps a ring of window + n_batch - 1 positions instead of n_ctx: position p lives in
 * row p % rows, the ring's origin is position 0 and the next position to write is the session's pos, so nothing
 * else needs tracking; a batch of up to n_batch tokens overwrites only positions its first query no longer sees.
 * tests/test_arch.c checks a prompt longer than the window, chunked and token by token, against the reference.
 *
 * With params.n_gpu_layers the session holds a CUDA engine (src/cuda/engine.cu) instead of the cache, scratch and threads:
 * the same validation and chunking, the same cache rows, the forward on the GPU (tests/test_cuda_engine.c). */
#include "model/model.h"
#include "cpu/ops.h"
#include "cuda/cuda.h"
#include "status.h"

#include <stdlib.h>
#include <string.h>

struct kiln_session {
    const kiln_model *m;
    const kiln_ops *ops;
    kiln_pool *pool;
    kiln_ops_ctx ctx;  /* pool and the ops' scratch */
    int64_t n_ctx;     /* positions the cache holds */
    int64_t n_batch;   /* tokens per forward call */
    int64_t pos;       /* next position */
    uint16_t *kv;      /* every layer's k then v, (rows[l], NKV*HS) f16 each, one after another */
    uint16_t **k, **v; /* (L) layer l's k and v rows in kv */
    int64_t *rows;     /* (L) n_ctx for a full layer, min(n_ctx, window + n_batch - 1) for a sliding one */
    float *act;        /* kiln_llama_act_floats(n_batch) */
    kiln_cuda_engine *gpu; /* with params.gpu: the model, cache and activations on the GPU; the fields above unused */
};

/* The matmul weights in the backend's own layout (the CPU's: 16 rows interleaved for its VNNI kernels), owned by
 * the session. They come from kiln_model_load's read-only mmap, so each weight's pages are dropped once copied:
 * resident memory holds the weights once (a second session of the same model holds a second copy). */
static kiln_status prepare_weights(kiln_session *s) {
    if (!s->ops->prepare_weights) return KILN_OK;
    const kiln_llama_config *c = &s->m->cfg;
    const int64_t per = c->output_gate ? 8 : 7, n = per * c->n_layer + 1;
    const kiln_tensor_view **w = malloc(sizeof *w * (size_t)n);
    if (!w) return kiln_fail(KILN_ERR_NOMEM, "session: out of memory");
    for (int64_t l = 0; l < c->n_layer; l++) {
        const kiln_llama_layer *L = &s->m->layers[l];
        const kiln_tensor_view *mats[8] = {L->wq, L->wk, L->wv, L->wo, L->w_gate, L->w_up, L->w_down, L->w_attn_gate};
        memcpy(w + per * l, mats, sizeof *mats * (size_t)per);
    }
    w[n - 1] = s->m->output;
    kiln_status st = s->ops->prepare_weights(&s->ctx, w, n, true);
    free(w);
    return st;
}

/* Cache rows of layer l: the context, or a sliding layer's ring of window + n_batch - 1 when that is smaller. */
static int64_t cache_rows(const kiln_model *m, int64_t l, int64_t n_ctx, int64_t n_batch) {
    const int64_t w = m->layers[l].window;
    return w && w + n_batch - 1 < n_ctx ? w + n_batch - 1 : n_ctx;
}

kiln_status kiln_session_new(const kiln_model *m, const kiln_session_params *p, kiln_session **out) {
    *out = NULL;
    const kiln_llama_config *c = &m->cfg;
    kiln_session_params d = {0};
    if (!p) p = &d;
    if (p->device.kind == KILN_DEVICE_CUDA && p->device.index != 0)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "gpu: device index %d: only device 0 is supported", p->device.index);
    if (p->device.kind == KILN_DEVICE_CUDA) d = *p, d.n_gpu_layers = INT32_MAX, p = &d; /* the whole model, as -ngl 99 */
    if (p->n_gpu_layers > 0 && p->n_gpu_layers < c->n_layer)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "session: offloading %d of %lld layers is not supported: kiln runs the whole model on the GPU "
                         "(n_gpu_layers >= %lld, -ngl 99) or none of it", p->n_gpu_layers, (long long)c->n_layer, (long long)c->n_layer);
    if (p->n_ctx < 0 || p->n_batch < 0 || p->n_threads < 0)
        return kiln_fail(KILN_ERR_INVALID, "session: n_ctx %lld, n_batch %lld and n_threads %d must not be negative", (long long)p->n_ctx,
                         (long long)p->n_batch, p->n_threads);
    int64_t n_ctx = p->n_ctx ? p->n_ctx : c->n_ctx_train;
    if (n_ctx > INT32_MAX) return kiln_fail(KILN_ERR_RANGE, "session: a context of %lld tokens is more than kiln's 2^31 - 1", (long long)n_ctx);
    int64_t n_batch = p->n_batch ? p->n_batch : 512;
    if (n_batch > n_ctx) n_batch = n_ctx; /* a chunk never holds more tokens than the context */

    /* cache: 2 * sum of rows[l] * NKV*HS halves; activations: a chunk's rows; both checked for overflow */
    uint64_t kv_elems, kv_bytes, act_bytes, total_rows = 0;
    for (int64_t l = 0; l < c->n_layer; l++) total_rows += (uint64_t)cache_rows(m, l, n_ctx, n_batch);
    if (!kiln_mul_ok(total_rows, 2, &kv_elems) ||
        !kiln_mul_ok(kv_elems, (uint64_t)(c->n_head_kv * c->head_dim), &kv_elems) || !kiln_mul_ok(kv_elems, 2, &kv_bytes) ||
        !kiln_mul_ok(kiln_llama_act_floats(c, 1), (uint64_t)n_batch * sizeof(float), &act_bytes) || kv_bytes > SIZE_MAX)
        return kiln_fail(KILN_ERR_NOMEM, "session: a KV cache of %lld positions overflows the address space", (long long)n_ctx);

    kiln_session *s = calloc(1, sizeof *s);
    if (!s) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    s->m = m;
    s->ops = &kiln_cpu_ops;
    s->n_ctx = n_ctx;
    s->n_batch = n_batch;
    if (p->n_gpu_layers > 0) {
        int64_t *rows = malloc(sizeof *rows * (size_t)c->n_layer);
        if (!rows) {
            free(s);
            return kiln_fail(KILN_ERR_NOMEM, "session: out of memory");
        }
        for (int64_t l = 0; l < c->n_layer; l++) rows[l] = cache_rows(m, l, n_ctx, n_batch);
        kiln_status st = kiln_cuda_engine_new(m, n_ctx, n_batch, rows, &s->gpu);
        free(rows);
        if (st) {
            free(s);
            return st;
        }
        *out = s;
        return KILN_OK;
    }
    kiln_status st = kiln_pool_create(p->n_threads, &s->pool);
    if (st) {
        kiln_session_free(s);
        return st;
    }
    s->ctx.pool = s->pool;
    s->ctx.scratch_bytes = s->ops->scratch_size(n_batch, kiln_llama_max_width(c), c->n_head, n_ctx, kiln_pool_size(s->pool));
    /* calloc: the pages of a long context are only touched as positions fill */
    s->kv = calloc((size_t)kv_elems, sizeof *s->kv);
    s->act = malloc((size_t)act_bytes);
    s->ctx.scratch = s->ctx.scratch_bytes ? malloc(s->ctx.scratch_bytes) : NULL;
    s->k = malloc(sizeof *s->k * (size_t)c->n_layer);
    s->v = malloc(sizeof *s->v * (size_t)c->n_layer);
    s->rows = malloc(sizeof *s->rows * (size_t)c->n_layer);
    if (!s->kv || !s->act || (s->ctx.scratch_bytes && !s->ctx.scratch) || !s->k || !s->v || !s->rows) {
        kiln_session_free(s);
        return kiln_fail(KILN_ERR_NOMEM, "session: out of memory for a KV cache of %llu bytes and %llu bytes of scratch",
                         (unsigned long long)kv_bytes, (unsigned long long)act_bytes);
    }
    uint16_t *next = s->kv;
    const size_t KV = (size_t)(c->n_head_kv * c->head_dim);
    for (int64_t l = 0; l < c->n_layer; l++) {
        s->rows[l] = cache_rows(m, l, n_ctx, n_batch);
        s->k[l] = next;
        s->v[l] = next + (size_t)s->rows[l] * KV;
        next += 2 * (size_t)s->rows[l] * KV;
    }
    if ((st = prepare_weights(s)) != KILN_OK) {
        kiln_session_free(s);
        return st;
    }
    *out = s;
    return KILN_OK;
}

void kiln_session_free(kiln_session *s) {
    if (!s) return;
    kiln_cuda_engine_free(s->gpu);
    if (s->ops->release_weights) s->ops->release_weights(&s->ctx);
    kiln_pool_free(s->pool);
    free(s->kv);
    free(s->k);
    free(s->v);
    free(s->rows);
    free(s->act);
    free(s->ctx.scratch);
    free(s);
}

int64_t kiln_session_pos(const kiln_session *s) { return s->pos; }
bool kiln_session_on_gpu(const kiln_session *s) { return s->gpu != NULL; }
size_t kiln_session_device_bytes(const kiln_session *s) { return s->gpu ? kiln_cuda_engine_bytes(s->gpu) : 0; }
kiln_cuda_engine *kiln_session_gpu_engine(kiln_session *s) { return s->gpu; }
void kiln_session_reset(kiln_session *s) { s->pos = 0; }

/* The checks every eval makes before the first chunk runs, so a failed call leaves the session as it was. */
static kiln_status check_ids(const kiln_session *s, const int32_t *ids, size_t n) {
    const int64_t V = s->m->cfg.n_vocab;
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= V) return kiln_fail(KILN_ERR_RANGE, "token id %d is outside the vocab of %lld tokens", ids[i], (long long)V);
    if (n > (size_t)(s->n_ctx - s->pos))
        return kiln_fail(KILN_ERR_RANGE, "position %lld exceeds the context of %lld tokens", (long long)(s->pos + (int64_t)n - 1),
                         (long long)s->n_ctx);
    return KILN_OK;
}

/* n tokens in chunks of n_batch; the last chunk returns the last row's logits, or every chunk its rows into
 * all_logits, and/or the last row's argmax into next. */
static kiln_status eval_chunks(kiln_session *s, const int32_t *ids, size_t n, float *logits, float *all_logits, int32_t *next) {
    const int64_t V = s->m->cfg.n_vocab;
    kiln_status st = check_ids(s, ids, n);
    if (st) return st;
    for (size_t done = 0; done < n;) {
        int64_t T = (int64_t)(n - done) < s->n_batch ? (int64_t)(n - done) : s->n_batch;
        bool last = done + (size_t)T == n;
        float *out = all_logits ? all_logits + done * (size_t)V : last ? logits : NULL;
        if (s->gpu) {
            if ((st = kiln_cuda_engine_eval(s->gpu, ids + done, T, s->pos, out, all_logits != NULL, last ? next : NULL))) return st;
        } else {
            const kiln_llama_kv kv = {s->k, s->v, s->rows};
            kiln_llama_forward(s->m, s->ops, &s->ctx, &kv, s->act, ids + done, T, s->pos, out, all_logits != NULL);
        }
        s->pos += T;
        done += (size_t)T;
    }
    if (logits && all_logits) memcpy(logits, all_logits + (n - 1) * (size_t)V, (size_t)V * sizeof *logits);
    return KILN_OK;
}

kiln_status kiln_session_eval(kiln_session *s, const int32_t *ids, size_t n, float *logits, float *all_logits) {
    if (n == 0) {
        if (logits || all_logits) return kiln_fail(KILN_ERR_INVALID, "session: no tokens to evaluate, so no logits");
        return KILN_OK;
    }
    return eval_chunks(s, ids, n, logits, all_logits, NULL);
}

kiln_status kiln_session_eval_argmax(kiln_session *s, const int32_t *ids, size_t n, int32_t *next) {
    if (n == 0) return kiln_fail(KILN_ERR_INVALID, "session: no tokens to evaluate, so no argmax");
    if (s->gpu) return eval_chunks(s, ids, n, NULL, NULL, next);
    /* the CPU computes the logits anyway: the lowest index of the largest, as the GPU's argmax and the sampler */
    const int64_t V = s->m->cfg.n_vocab;
    float *logits = malloc((size_t)V * sizeof *logits);
    if (!logits) return kiln_fail(KILN_ERR_NOMEM, "session: out of memory");
    kiln_status st = eval_chunks(s, ids, n, logits, NULL, NULL);
    if (!st) {
        int32_t best = 0;
        for (int64_t i = 1; i < V; i++)
            if (logits[i] > logits[best]) best = (int32_t)i;
        *next = best;
    }
    free(logits);
    return st;
}
