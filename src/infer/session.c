/* session.c: a model running over a growing sequence, on a backend (src/model/backend.h: the CPU, or the GPU with
 * params.n_gpu_layers). The session owns the KV cache (sized from n_ctx; f16, or type_k/type_v), one chunk's activations
 * (proportional to n_batch), the token ids, positions, logits and argmax of a step in the backend's memory, and
 * the backend's context, which holds the weights in the backend's own form (the CPU's repacked layout, which
 * replaces the model's mmap pages it was copied from; the GPU's uploaded copy). Prefill runs in chunks of n_batch
 * tokens through the one forward in src/model/llama.c; a single token's step is recorded once by the backend (a
 * CUDA graph) and replayed. tests/test_generate.c covers the errors and that chunking does not change the logits;
 * tests/test_cuda_engine.c compares the GPU session with the CPU one.
 *
 * The logits a call returns are checked for a NaN or an infinity (on the host where they come back; on the device,
 * beside the argmax, for a greedy step), so a model whose weights or metadata make one fails naming the position
 * instead of generating garbage; check_finite (or KILN_CHECK_FINITE=1) also checks the embedding and each layer's
 * output and names the first that is not finite. The session keeps the ids at its positions (its history), so a
 * caller can keep the cache up to the first token that changes (kiln_session_keep) and evaluate only the rest.
 * tests/test_runtime.c covers both.
 *
 * A sliding-window layer (#6) keeps a ring of window + n_batch - 1 positions instead of n_ctx: position p lives in
 * row p % rows, the ring's origin is position 0 and the next position to write is the session's pos, so nothing
 * else needs tracking; a batch of up to n_batch tokens overwrites only positions its first query no longer sees.
 * tests/test_arch.c checks a prompt longer than the window, chunked and token by token, against the reference. */
#include "model/backend.h"
#include "cuda/cuda.h"
#include "status.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct kiln_session {
    const kiln_model *m;
    const kiln_backend *be;
    void *ctx;         /* the backend's context */
    kiln_weights w;    /* bound by the backend, owned by ctx */
    int64_t n_ctx;     /* positions the cache holds */
    int64_t n_batch;   /* tokens per forward call */
    int64_t pos;       /* next position */
    int32_t *hist;     /* (n_ctx) the ids at positions 0..pos-1 */
    int64_t n_evaluated; /* tokens run through the forward since the session began */
    bool check_layers; /* check_finite: the embedding and every layer's output are checked too */
    /* backend memory */
    char *kv;          /* every layer's k then v, (rows[l], NKV*HS) of type_k and type_v, one after another */
    float *act;        /* kiln_llama_act_floats(n_batch) */
    int32_t *d_ids;    /* (n_batch) ids, then the position (1), the non-finite flag (1) and the argmax (1) */
    float *d_logits;   /* (n_batch, V) on a device; (V) where backend memory is host memory */
    /* host memory the backend copies from and to */
    int32_t *h_ids;    /* (n_batch) ids, the position, the flag, the argmax, then h_logits (V) */
    float *h_logits;
    void **k, **v;     /* (L) layer l's k and v rows in kv */
    kiln_kv_type type_k, type_v;
    int64_t *rows;     /* (L) n_ctx for a full layer, min(n_ctx, window + n_batch - 1) for a sliding one */
    /* the step being enqueued (step_enqueue's arguments) */
    int64_t T, first;
    float *out;        /* where the logits go: d_logits, or the caller's buffer on host memory */
    bool want_logits, want_next, staged_out;
};

/* KILN_CHECK_FINITE=1 turns check_finite on for every session (a debugging switch that needs no rebuild). */
static bool check_finite_env(void) {
    const char *e = getenv("KILN_CHECK_FINITE");
    return e && strcmp(e, "1") == 0;
}

/* Cache rows of layer l: the context, or a sliding layer's ring of window + n_batch - 1 when that is smaller. */
static int64_t cache_rows(const kiln_model *m, int64_t l, int64_t n_ctx, int64_t n_batch) {
    const int64_t w = m->layers[l].window;
    return w && w + n_batch - 1 < n_ctx ? w + n_batch - 1 : n_ctx;
}

/* Bytes of one cached k row and one v row (NKV*HS elements) in the types p asks for; the block types need the
 * row to be whole blocks of 32. */
static kiln_status kv_row_bytes(const kiln_model *m, const kiln_session_params *p, size_t *k_bytes, size_t *v_bytes) {
    const int64_t KV = m->cfg.n_head_kv * m->cfg.head_dim;
    const kiln_kv_type t[2] = {p->type_k, p->type_v};
    size_t *out[2] = {k_bytes, v_bytes};
    for (int i = 0; i < 2; i++) {
        const char *name = kiln_kv_type_name(t[i]);
        if (!name) return kiln_fail(KILN_ERR_INVALID, "session: KV cache type id %d is unknown", (int)t[i]);
        if (!(*out[i] = kiln_kv_row_bytes(t[i], KV)))
            return kiln_fail(KILN_ERR_UNSUPPORTED, "session: a %s KV cache needs rows of whole blocks of 32, and this model's "
                             "rows are %lld wide (NKV*HS)", name, (long long)KV);
    }
    return KILN_OK;
}

kiln_status kiln_session_new(const kiln_model *m, const kiln_session_params *p, kiln_session **out) {
    *out = NULL;
    const kiln_llama_config *c = &m->cfg;
    kiln_session_params d = {0};
    if (!p) p = &d;
    const int device = p->device.kind == KILN_DEVICE_CUDA ? p->device.index : 0;
    if (p->device.kind == KILN_DEVICE_CUDA) d = *p, d.n_gpu_layers = INT32_MAX, p = &d; /* the whole model, as -ngl 99 */
    if (device < 0) return kiln_fail(KILN_ERR_INVALID, "session: CUDA device index %d is negative", device);
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
    const kiln_backend *be = p->n_gpu_layers > 0 ? &kiln_cuda_backend : &kiln_cpu_backend;

    /* cache: sum of rows[l] * (a k row + a v row); activations: a chunk's rows; both checked for overflow */
    size_t k_row = 0, v_row = 0;
    TRY(kv_row_bytes(m, p, &k_row, &v_row));
    uint64_t kv_bytes, act_bytes, total_rows = 0;
    for (int64_t l = 0; l < c->n_layer; l++) total_rows += (uint64_t)cache_rows(m, l, n_ctx, n_batch);
    if (!kiln_mul_ok(total_rows, (uint64_t)k_row + v_row, &kv_bytes) ||
        !kiln_mul_ok(kiln_llama_act_floats(c, 1), (uint64_t)n_batch * sizeof(float), &act_bytes) || kv_bytes > SIZE_MAX)
        return kiln_fail(KILN_ERR_NOMEM, "session: a KV cache of %lld positions overflows the address space", (long long)n_ctx);
    const size_t V = (size_t)c->n_vocab, logit_bytes = (be->host_memory ? 1 : (size_t)n_batch) * V * sizeof(float);
    const size_t io_bytes = (size_t)(n_batch + 3) * sizeof(int32_t);

    kiln_session *s = calloc(1, sizeof *s);
    if (!s) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    s->m = m;
    s->be = be;
    s->n_ctx = n_ctx;
    s->n_batch = n_batch;
    s->type_k = p->type_k, s->type_v = p->type_v;
    s->check_layers = p->check_finite || check_finite_env();
    s->hist = malloc(sizeof *s->hist * (size_t)n_ctx);
    s->k = malloc(sizeof *s->k * (size_t)c->n_layer);
    s->v = malloc(sizeof *s->v * (size_t)c->n_layer);
    s->rows = malloc(sizeof *s->rows * (size_t)c->n_layer);
    if (!s->hist || !s->k || !s->v || !s->rows) {
        kiln_session_free(s);
        return kiln_fail(KILN_ERR_NOMEM, "session: out of memory");
    }
    for (int64_t l = 0; l < c->n_layer; l++) s->rows[l] = cache_rows(m, l, n_ctx, n_batch);
    const kiln_backend_params bp = {.n_ctx = n_ctx, .n_batch = n_batch, .rows = s->rows, .kv_bytes = (size_t)kv_bytes,
                                    .act_bytes = (size_t)act_bytes + logit_bytes + io_bytes, .type_k = p->type_k,
                                    .type_v = p->type_v, .n_threads = p->n_threads,
                                    .device = device};
    kiln_status st = be->open(m, &bp, &s->ctx);
    if (!st) st = be->alloc(s->ctx, (size_t)kv_bytes, (void **)&s->kv);
    if (!st) st = be->alloc(s->ctx, (size_t)act_bytes, (void **)&s->act);
    if (!st) st = be->alloc(s->ctx, logit_bytes, (void **)&s->d_logits);
    if (!st) st = be->alloc(s->ctx, io_bytes, (void **)&s->d_ids);
    if (!st) st = be->alloc_host(s->ctx, io_bytes + V * sizeof(float), (void **)&s->h_ids);
    if (!st) st = be->load_weights(s->ctx, m, &s->w);
    if (st) {
        kiln_session_free(s);
        return st;
    }
    s->h_logits = (float *)(s->h_ids + n_batch + 3);
    char *next = s->kv;
    for (int64_t l = 0; l < c->n_layer; l++) {
        s->k[l] = next;
        s->v[l] = next + (size_t)s->rows[l] * k_row;
        next += (size_t)s->rows[l] * (k_row + v_row);
    }
    *out = s;
    return KILN_OK;
}

void kiln_session_free(kiln_session *s) {
    if (!s) return;
    if (s->ctx) {
        s->be->free(s->ctx, s->kv);
        s->be->free(s->ctx, s->act);
        s->be->free(s->ctx, s->d_logits);
        s->be->free(s->ctx, s->d_ids);
        s->be->free_host(s->ctx, s->h_ids);
        s->be->close(s->ctx);
    }
    free(s->hist);
    free(s->k);
    free(s->v);
    free(s->rows);
    free(s);
}

int64_t kiln_session_pos(const kiln_session *s) { return s->pos; }
int64_t kiln_session_n_ctx(const kiln_session *s) { return s->n_ctx; }
const int32_t *kiln_session_tokens(const kiln_session *s) { return s->hist; }
int64_t kiln_session_n_evaluated(const kiln_session *s) { return s->n_evaluated; }
bool kiln_session_on_gpu(const kiln_session *s) { return s->be == &kiln_cuda_backend; }
size_t kiln_session_device_bytes(const kiln_session *s) { return s->be->device_bytes(s->ctx); }
void kiln_session_reset(kiln_session *s) { s->pos = 0; }

/* The cache rows of positions n.. are only ever read after they are written again, so keeping a prefix is setting
 * pos, except on a sliding layer's ring: a query at n reads positions n - window + 1 .. n - 1, which positions past
 * n may have overwritten (row p % rows). Those are lost once pos > n + rows - window + 1; then nothing is kept. */
int64_t kiln_session_keep(kiln_session *s, int64_t n) {
    if (n < 0) n = 0;
    if (n >= s->pos) return s->pos;
    for (int64_t l = 0; l < s->m->cfg.n_layer && n > 0; l++) {
        const int64_t w = s->m->layers[l].window, rows = s->rows[l], oldest = n - w + 1 > 0 ? n - w + 1 : 0;
        if (w && rows < s->n_ctx && oldest + rows < s->pos) n = 0;
    }
    s->pos = n;
    return n;
}

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

/* The step as enqueued work: the staged ids and position in, the forward, the argmax (and the logits, when they go
 * through the staging buffer) out. A single token's step enqueues the same work at every position, so the backend
 * records it once. */
static kiln_status step_enqueue(void *arg) {
    kiln_session *s = arg;
    const kiln_backend *be = s->be;
    const int64_t V = s->m->cfg.n_vocab, T = s->T;
    int32_t *d_pos = s->d_ids + s->n_batch, *d_flag = d_pos + 1, *d_next = d_pos + 2;
    int32_t *h_flag = s->h_ids + s->n_batch + 1;
    TRY(be->upload(s->ctx, s->d_ids, s->h_ids, (size_t)T * sizeof(int32_t)));
    TRY(be->upload(s->ctx, d_pos, s->h_ids + s->n_batch, 2 * sizeof(int32_t))); /* the position and a zero flag */
    const kiln_llama_kv kv = {s->k, s->v, s->rows, s->n_ctx, s->type_k, s->type_v};
    /* logits that come back to the host are checked there; the argmax's row on the backend, beside it */
    const kiln_llama_checks checks = {.flag = d_flag, .logits = s->want_next, .layers = s->check_layers};
    TRY(kiln_llama_forward(s->m, be, s->ctx, &s->w, &kv, s->act, s->d_ids, d_pos, T, s->first,
                           s->want_logits || s->want_next ? s->out : NULL, s->want_next ? d_next : NULL, &checks));
    if (s->want_next) TRY(be->download(s->ctx, h_flag, d_flag, 2 * sizeof(int32_t))); /* the flag and the argmax */
    else if (s->check_layers) TRY(be->download(s->ctx, h_flag, d_flag, sizeof(int32_t)));
    if (s->want_logits && s->staged_out) TRY(be->download(s->ctx, s->h_logits, s->d_logits, (size_t)V * sizeof(float)));
    return KILN_OK;
}

/* The stage the forward's checks flagged (backend.h's codes), as an error naming it and the positions. */
static kiln_status stage_error(const kiln_session *s, int32_t code, int64_t T) {
    const int64_t L = s->m->cfg.n_layer, p0 = s->pos, p1 = s->pos + T - 1;
    if (!s->check_layers) /* only the row the argmax read was checked */
        return kiln_fail(KILN_ERR_RANGE, "session: the logits at position %lld are not finite (NaN or infinity): the model's weights or "
                         "metadata make one (KILN_CHECK_FINITE=1 names the first layer that does)", (long long)p1);
    char stage[64], where[64];
    if (code == KILN_LLAMA_STAGE_EMBED) snprintf(stage, sizeof stage, "the token embedding");
    else if (code - KILN_LLAMA_STAGE_LAYER < L) snprintf(stage, sizeof stage, "layer %d's output", code - KILN_LLAMA_STAGE_LAYER);
    else snprintf(stage, sizeof stage, "the logits (the output norm and head)");
    if (T > 1) snprintf(where, sizeof where, "positions %lld..%lld", (long long)p0, (long long)p1);
    else snprintf(where, sizeof where, "position %lld", (long long)p0);
    return kiln_fail(KILN_ERR_RANGE, "session: %s at %s is not finite (NaN or infinity), the first stage of the forward that is: its "
                     "weights or the model's metadata make one", stage, where);
}

/* The first row of logits (rows, V) that holds a NaN or an infinity, as an error naming its position (first_pos +
 * its row) and the token id. */
static kiln_status check_logits(const kiln_session *s, const float *logits, int64_t rows, int64_t first_pos) {
    const int64_t V = s->m->cfg.n_vocab;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < V; i++)
            if (!isfinite(logits[r * V + i]))
                return kiln_fail(KILN_ERR_RANGE, "session: the logits at position %lld are not finite (token %lld's is %s): the model's "
                                 "weights or metadata make a NaN or an infinity (KILN_CHECK_FINITE=1 names the first layer that does)",
                                 (long long)(first_pos + r), (long long)i, isnan(logits[r * V + i]) ? "nan" : "inf");
    return KILN_OK;
}

/* T tokens at the session's position: logits (host), when not NULL, gets the last row's V logits or all T rows when
 * all_logits; next, when not NULL, the last row's argmax. Logits that are not finite are an error, and so is a stage
 * the checks flag; the session's position does not move then. */
static kiln_status eval_chunk(kiln_session *s, const int32_t *ids, int64_t T, float *logits, bool all_logits, int32_t *next) {
    const kiln_backend *be = s->be;
    const int64_t V = s->m->cfg.n_vocab;
    memcpy(s->h_ids, ids, (size_t)T * sizeof *ids);
    s->h_ids[s->n_batch] = (int32_t)s->pos;
    s->h_ids[s->n_batch + 1] = 0; /* the flag the checks set */
    s->T = T;
    s->first = all_logits ? 0 : T - 1;
    s->want_logits = logits != NULL;
    s->want_next = next != NULL;
    /* one row of logits goes through the staging buffer; more rows are copied straight into the caller's buffer,
     * or written there by a backend whose memory is host memory */
    s->staged_out = !all_logits;
    s->out = all_logits && be->host_memory ? logits : s->d_logits;
    kiln_status st;
    if (T == 1 && !all_logits) /* one recording for each pair of outputs wanted */
        st = be->record(s->ctx, (logits ? 1 : 0) | (next ? 2 : 0), step_enqueue, s);
    else
        st = step_enqueue(s);
    if (!st && logits && all_logits) st = be->download(s->ctx, logits, s->out, (size_t)(T * V) * sizeof(float));
    if (!st) st = be->synchronize(s->ctx);
    if (st) return st;
    s->n_evaluated += T;
    const int32_t flag = s->h_ids[s->n_batch + 1];
    if (flag) return stage_error(s, flag, T);
    if (logits && !all_logits) memcpy(logits, s->h_logits, (size_t)V * sizeof(float));
    if (logits && (st = check_logits(s, logits, all_logits ? T : 1, all_logits ? s->pos : s->pos + T - 1))) return st;
    if (next) *next = s->h_ids[s->n_batch + 2];
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
        if ((st = eval_chunk(s, ids + done, T, out, all_logits != NULL, last ? next : NULL))) return st;
        memcpy(s->hist + s->pos, ids + done, (size_t)T * sizeof *ids);
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
    return eval_chunks(s, ids, n, NULL, NULL, next);
}

/* One decode step at position pos0, enqueued step by step (not replayed), for a backend's per-step profile. */
static kiln_status profile_step(void *arg) {
    kiln_session *s = arg;
    s->h_ids[0] = 1 % (int32_t)s->m->cfg.n_vocab;
    s->T = 1;
    s->first = 0;
    s->want_logits = false;
    s->want_next = true;
    s->out = s->d_logits;
    TRY(step_enqueue(s));
    return s->be->synchronize(s->ctx);
}

kiln_status kiln_session_profile(kiln_session *s, int64_t pos0, int reps, kiln_op_time *ops, int *n_ops) {
    if (!s->be->profile) return kiln_fail(KILN_ERR_UNSUPPORTED, "session: the %s backend has no per-step profile", s->be->name);
    if (pos0 < 0 || pos0 >= s->n_ctx)
        return kiln_fail(KILN_ERR_RANGE, "session: profile position %lld is outside the context of %lld", (long long)pos0, (long long)s->n_ctx);
    s->h_ids[s->n_batch] = (int32_t)pos0;
    s->h_ids[s->n_batch + 1] = 0;
    return s->be->profile(s->ctx, pos0, reps, profile_step, s, ops, n_ops);
}
