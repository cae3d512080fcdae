/* context.c: a model running over n_seq sequences on one backend (src/model/backend.h: the CPU, or the GPU with
 * n_gpu_layers). The context owns the backend's context (the weights bound once, in the backend's own form), one KV
 * cache per sequence (sized from n_ctx, one allocation for all), one batch's activations (proportional to n_batch),
 * the ids, positions, logits and argmaxes of a step in backend memory, and each sequence's history (the ids at its
 * positions). kiln_context_decode runs a batch of (sequence, position, token) entries through the one forward in
 * src/model/llama.c: the entries are grouped into one segment per sequence (the matmuls run over all rows, attention
 * over each segment's cache) and the logits come back in batch order. A session (session.c) is a context of one
 * sequence; its single token's step is recorded once by the backend (a CUDA graph) and replayed.
 *
 * The logits a call returns are checked for a NaN or an infinity (on the host where they come back; on the device,
 * beside the argmax, for a greedy step), so a model whose weights or metadata make one fails naming the position
 * instead of generating garbage; check_finite (or KILN_CHECK_FINITE=1) also checks the embedding and each layer's
 * output and names the first that is not finite. tests/test_runtime.c covers both.
 *
 * A sliding-window layer (#6) keeps a ring of window + n_batch - 1 positions instead of n_ctx: position p lives in
 * row p % rows, the ring's origin is position 0 and the next position to write is the sequence's pos, so nothing
 * else needs tracking; a batch of up to n_batch tokens overwrites only positions its first query no longer sees.
 * tests/test_arch.c checks a prompt longer than the window against the reference; tests/test_context.c checks
 * batches of several sequences against each alone. A sequence's cache beyond its steps (keep, copy, save, restore)
 * is context_seq.c's; the state both files share is context_impl.h. */
#include "infer/context_impl.h"
#include "cuda/cuda.h"
#include "status.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- layout
 * d_io and h_io: ids (n_batch) | argmaxes (n_batch, a step's n_out ending at the flag) | flag (1) | positions
 * (n_batch, one per segment) | sequences (n_batch, one per segment), so a step's outputs are one download (the
 * argmaxes and the flag). */

static int32_t *io_flag(const kiln_context *c, int32_t *io) { return io + 2 * c->n_batch; }
static int32_t *io_pos(const kiln_context *c, int32_t *io) { return io + 2 * c->n_batch + 1; }
static int32_t *io_seq(const kiln_context *c, int32_t *io) { return io + 3 * c->n_batch + 1; }
enum { IO_INTS_PER_ROW = 4 }; /* ids, argmaxes, positions, sequences: (IO_INTS_PER_ROW n_batch + 1) int32 */

/* KILN_CHECK_FINITE=1 turns check_finite on for every context (a debugging switch that needs no rebuild). */
static bool check_finite_env(void) {
    const char *e = getenv("KILN_CHECK_FINITE");
    return e && strcmp(e, "1") == 0;
}

/* Cache rows of layer l: the context, or a sliding layer's ring of window + n_batch - 1 when that is smaller. */
static int64_t cache_rows(const kiln_model *m, int64_t l, int64_t n_ctx, int64_t n_batch) {
    const int64_t w = m->layers[l].window;
    return w && w + n_batch - 1 < n_ctx ? w + n_batch - 1 : n_ctx;
}

/* The model's fingerprint for sequence files: the file's header bytes (every metadata key and value, and every
 * tensor's name, type, shape and offset) and the file's size. The header is where the first tensor's data says the
 * data section starts (kiln_tensor_view: data = image + data offset + offset). */
static uint64_t model_fingerprint(const kiln_model *m) {
    uint64_t h = 0xcbf29ce484222325ull, size = kiln_gguf_file_size(m->gguf), off = kiln_gguf_data_offset(m->gguf);
    h = fnv(h, &size, sizeof size);
    if (kiln_gguf_n_tensors(m->gguf) > 0) {
        const kiln_tensor_view *t = kiln_gguf_tensor_at(m->gguf, 0);
        h = fnv(h, (const uint8_t *)t->data - t->offset - off, (size_t)off);
    }
    return h;
}

/* Carves sequence i's layers out of the kv buffer. */
static void seq_bind(kiln_context *c, int32_t i) {
    const int64_t L = c->m->cfg.n_layer;
    size_t rk, rv;
    kv_rows(c, &rk, &rv);
    uint8_t *next = c->kv + (size_t)i * c->seq_kv_bytes;
    seq_state *s = &c->seq[i];
    for (int64_t l = 0; l < L; l++) {
        s->k[l] = next;
        s->v[l] = next + (size_t)c->rows[l] * rk;
        next += (size_t)c->rows[l] * (rk + rv);
    }
    s->kv = (kiln_llama_kv){s->k, s->v, c->rows, c->n_ctx, c->type_k, c->type_v};
}

/* ---------------------------------------------------------------- make and free */

void kiln_context_free(kiln_context *c) {
    if (!c) return;
    if (c->ctx) {
        c->be->free(c->ctx, c->kv);
        c->be->free(c->ctx, c->act);
        c->be->free(c->ctx, c->d_logits);
        c->be->free(c->ctx, c->d_io);
        c->be->free_host(c->ctx, c->h_io);
        c->be->free(c->ctx, c->d_sargs);
        c->be->free(c->ctx, c->d_swork);
        c->be->free_host(c->ctx, c->h_sargs);
        free(c->h_swork);
        free(c->k_sargs);
        c->be->close(c->ctx);
    }
    for (int32_t i = 0; c->seq && i < c->n_seq; i++) {
        free(c->seq[i].hist);
        free(c->seq[i].k);
        free(c->seq[i].v);
    }
    free(c->seq);
    free(c->rows);
    free(c->segs);
    free(c->seg_seq);
    free(c->out);
    free(c->perm);
    free(c->dest);
    free(c->inv);
    free(c->done);
    free(c->cnt);
    free(c->start);
    free(c);
}

/* The host-side allocations: each sequence's history and layer pointers, the step's scratch. */
static bool alloc_host_side(kiln_context *c) {
    const size_t L = (size_t)c->m->cfg.n_layer, B = (size_t)c->n_batch, S = (size_t)c->n_seq;
    c->rows = malloc(sizeof *c->rows * L);
    c->seq = calloc(S, sizeof *c->seq);
    c->segs = malloc(sizeof *c->segs * B);
    c->seg_seq = malloc(sizeof *c->seg_seq * B);
    c->out = malloc(sizeof *c->out * B);
    c->perm = malloc(sizeof *c->perm * B);
    c->dest = malloc(sizeof *c->dest * B);
    c->inv = malloc(sizeof *c->inv * B);
    c->done = malloc(sizeof *c->done * B);
    c->cnt = malloc(sizeof *c->cnt * S);
    c->start = malloc(sizeof *c->start * S);
    if (!c->rows || !c->seq || !c->segs || !c->seg_seq || !c->out || !c->perm || !c->dest || !c->inv || !c->done || !c->cnt || !c->start)
        return false;
    for (size_t i = 0; i < S; i++) {
        c->seq[i].hist = malloc(sizeof *c->seq[i].hist * (size_t)c->n_ctx);
        c->seq[i].k = malloc(sizeof *c->seq[i].k * L);
        c->seq[i].v = malloc(sizeof *c->seq[i].v * L);
        if (!c->seq[i].hist || !c->seq[i].k || !c->seq[i].v) return false;
    }
    return true;
}

kiln_status kiln_context_open(const kiln_model *m, const kiln_context_params *cp, const char *who, kiln_context **out) {
    *out = NULL;
    const kiln_llama_config *c = &m->cfg;
    kiln_session_params d = {0};
    const kiln_session_params *p = cp ? &cp->s : &d;
    const int32_t n_seq = cp && cp->n_seq ? cp->n_seq : 1;
    const int device = p->device.kind == KILN_DEVICE_CUDA ? p->device.index : 0;
    if (p->device.kind == KILN_DEVICE_CUDA) d = *p, d.n_gpu_layers = INT32_MAX, p = &d; /* the whole model, as -ngl 99 */
    if (device < 0) return kiln_fail(KILN_ERR_INVALID, "%s: CUDA device index %d is negative", who, device);
    if (p->n_gpu_layers > 0 && p->n_gpu_layers < c->n_layer)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: offloading %d of %lld layers is not supported: kiln runs the whole model on the GPU "
                         "(n_gpu_layers >= %lld, -ngl 99) or none of it", who, p->n_gpu_layers, (long long)c->n_layer, (long long)c->n_layer);
    if (p->n_ctx < 0 || p->n_batch < 0 || p->n_threads < 0)
        return kiln_fail(KILN_ERR_INVALID, "%s: n_ctx %lld, n_batch %lld and n_threads %d must not be negative", who, (long long)p->n_ctx,
                         (long long)p->n_batch, p->n_threads);
    if (n_seq < 0) return kiln_fail(KILN_ERR_INVALID, "%s: n_seq %d must not be negative", who, n_seq);
    if ((unsigned)p->type_k >= KILN_KV_TYPE_COUNT || (unsigned)p->type_v >= KILN_KV_TYPE_COUNT)
        return kiln_fail(KILN_ERR_INVALID, "%s: KV cache types %d and %d: the known ones are 0..%d", who, (int)p->type_k, (int)p->type_v,
                         KILN_KV_TYPE_COUNT - 1);
    const int64_t KV = c->n_head_kv * c->head_dim;
    for (int i = 0; i < 2; i++) { /* the block types need rows of whole blocks of 32 */
        const kiln_kv_type t = i ? p->type_v : p->type_k;
        if (!kv_row_bytes(t, KV))
            return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: a %s KV cache needs rows of whole blocks of 32, and this model's rows are "
                             "%lld wide (NKV*HS)", who, kv_name(t), (long long)KV);
    }
    int64_t n_ctx = p->n_ctx ? p->n_ctx : c->n_ctx_train;
    if (n_ctx > INT32_MAX) return kiln_fail(KILN_ERR_RANGE, "%s: a context of %lld tokens is more than kiln's 2^31 - 1", who, (long long)n_ctx);
    int64_t n_batch = p->n_batch ? p->n_batch : 512;
    if (n_batch > n_ctx) n_batch = n_ctx; /* a chunk never holds more tokens than the context */
    const kiln_backend *be = p->n_gpu_layers > 0 ? &kiln_cuda_backend : &kiln_cpu_backend;

    /* caches: n_seq * 2 * sum of rows[l] rows of NKV*HS; activations: a batch's rows; both checked for overflow */
    uint64_t seq_bytes, kv_bytes, act_bytes, total_rows = 0;
    for (int64_t l = 0; l < c->n_layer; l++) total_rows += (uint64_t)cache_rows(m, l, n_ctx, n_batch);
    if (!kiln_mul_ok(total_rows, (uint64_t)(kv_row_bytes(p->type_k, KV) + kv_row_bytes(p->type_v, KV)), &seq_bytes) ||
        !kiln_mul_ok(seq_bytes, (uint64_t)n_seq, &kv_bytes) ||
        !kiln_mul_ok(kiln_llama_act_floats(c, 1), (uint64_t)n_batch * sizeof(float), &act_bytes) || kv_bytes > SIZE_MAX)
        return kiln_fail(KILN_ERR_NOMEM, "%s: KV caches of %d x %lld positions overflow the address space", who, n_seq, (long long)n_ctx);
    const size_t V = (size_t)c->n_vocab, logit_bytes = (be->host_memory ? 1 : (size_t)n_batch) * V * sizeof(float);
    const size_t io_bytes = (size_t)(IO_INTS_PER_ROW * n_batch + 1) * sizeof(int32_t);

    kiln_context *x = calloc(1, sizeof *x);
    if (!x) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    x->m = m;
    x->be = be;
    x->who = who;
    x->n_seq = n_seq;
    x->n_ctx = n_ctx;
    x->n_batch = n_batch;
    x->type_k = p->type_k, x->type_v = p->type_v;
    x->seq_kv_bytes = (size_t)seq_bytes;
    x->check_layers = p->check_finite || check_finite_env();
    x->fingerprint = model_fingerprint(m);
    if (!alloc_host_side(x)) {
        kiln_context_free(x);
        return kiln_fail(KILN_ERR_NOMEM, "%s: out of memory", who);
    }
    for (int64_t l = 0; l < c->n_layer; l++) x->rows[l] = cache_rows(m, l, n_ctx, n_batch);
    const kiln_backend_params bp = {.n_ctx = n_ctx, .n_batch = n_batch, .rows = x->rows, .kv_bytes = (size_t)kv_bytes,
                                    .act_bytes = (size_t)act_bytes + logit_bytes + io_bytes, .type_k = p->type_k,
                                    .type_v = p->type_v, .n_seq = n_seq, .n_threads = p->n_threads, .device = device};
    kiln_status st = be->open(m, &bp, &x->ctx);
    if (!st) st = be->alloc(x->ctx, (size_t)kv_bytes, (void **)&x->kv);
    if (!st) st = be->alloc(x->ctx, (size_t)act_bytes, (void **)&x->act);
    if (!st) st = be->alloc(x->ctx, logit_bytes, (void **)&x->d_logits);
    if (!st) st = be->alloc(x->ctx, io_bytes, (void **)&x->d_io);
    if (!st) st = be->alloc_host(x->ctx, io_bytes + V * sizeof(float), (void **)&x->h_io);
    if (!st) st = be->load_weights(x->ctx, m, &x->w);
    if (st) {
        kiln_context_free(x);
        return st;
    }
    x->h_logits = (float *)(x->h_io + IO_INTS_PER_ROW * n_batch + 1);
    for (int32_t i = 0; i < n_seq; i++) seq_bind(x, i);
    *out = x;
    return KILN_OK;
}

kiln_status kiln_context_new(const kiln_model *m, const kiln_context_params *p, kiln_context **out) {
    return kiln_context_open(m, p, "context", out);
}

int32_t kiln_context_n_seq(const kiln_context *c) { return c->n_seq; }
int64_t kiln_context_n_ctx(const kiln_context *c) { return c->n_ctx; }
int64_t kiln_context_n_batch(const kiln_context *c) { return c->n_batch; }
bool kiln_context_on_gpu(const kiln_context *c) { return c->be == &kiln_cuda_backend; }
size_t kiln_context_device_bytes(const kiln_context *c) { return c->be->device_bytes(c->ctx); }
size_t kiln_context_kv_bytes(const kiln_context *c) { return c->seq_kv_bytes * (size_t)c->n_seq; }
int64_t kiln_context_n_evaluated(const kiln_context *c) { return c->n_evaluated; }
int64_t kiln_context_n_vocab(const kiln_context *c) { return c->m->cfg.n_vocab; }
int64_t kiln_context_seq_pos(const kiln_context *c, int32_t seq) { return seq_ok(c, seq) ? c->seq[seq].pos : -1; }
const int32_t *kiln_context_seq_tokens(const kiln_context *c, int32_t seq) { return seq_ok(c, seq) ? c->seq[seq].hist : NULL; }

/* "" for a context of one sequence, else "sequence N's " (a message's qualifier of a position). */
static const char *seq_name(const kiln_context *c, int32_t seq, char *buf, size_t n) {
    if (c->n_seq == 1) return "";
    snprintf(buf, n, "sequence %d's ", seq);
    return buf;
}

/* ---------------------------------------------------------------- one step */

/* The step as enqueued work: the staged ids, the flag and the positions in, the forward, the argmaxes and the flag
 * (and one row of logits, when it goes through the staging buffer) out. A single token's step of a context of one
 * sequence enqueues the same work at every position, so the backend records it once. */
static kiln_status step_enqueue(void *arg) {
    kiln_context *c = arg;
    const kiln_backend *be = c->be;
    const int64_t V = c->m->cfg.n_vocab, T = c->b.T, n_out = c->b.n_out;
    int32_t *d_flag = io_flag(c, c->d_io), *d_next = d_flag - n_out; /* the argmaxes end where the flag is */
    TRY(be->upload(c->ctx, c->d_io, c->h_io, (size_t)T * sizeof(int32_t)));
    TRY(be->upload(c->ctx, d_flag, io_flag(c, c->h_io), (size_t)(1 + c->b.n_seg) * sizeof(int32_t))); /* zero flag, positions */
    TRY(be->upload(c->ctx, io_seq(c, c->d_io), io_seq(c, c->h_io), (size_t)c->b.n_seg * sizeof(int32_t)));
    const bool draw_here = c->want_sample && be->sample, draw_host = c->want_sample && !be->sample;
    if (draw_here) TRY(be->upload(c->ctx, c->d_sargs, c->h_sargs, (size_t)n_out * sizeof *c->h_sargs));
    c->b.sample = draw_here ? c->d_sargs : NULL;
    c->b.sample_work = c->d_swork;
    /* logits that come back to the host are checked there; the argmaxes' rows on the backend, beside them */
    const kiln_llama_checks checks = {.flag = d_flag, .logits = c->want_next, .layers = c->check_layers};
    TRY(kiln_llama_forward(c->m, be, c->ctx, &c->w, c->act, &c->b, c->want_logits || c->want_next ? c->fwd_logits : NULL,
                           c->want_next ? d_next : NULL, &checks));
    if (draw_host) /* host memory: the forward's rows, in order, and its argmaxes replaced by the draws */
        for (int64_t o = 0; o < n_out; o++) d_next[o] = kiln_sample_args_draw(&c->h_sargs[o], c->fwd_logits + o * V, V, c->h_swork);
    if (c->want_next) TRY(be->download(c->ctx, io_flag(c, c->h_io) - n_out, d_next, (size_t)(n_out + 1) * sizeof(int32_t)));
    else if (c->check_layers) TRY(be->download(c->ctx, io_flag(c, c->h_io), d_flag, sizeof(int32_t)));
    if (c->want_logits && c->staged) TRY(be->download(c->ctx, c->h_logits, c->d_logits, (size_t)V * sizeof(float)));
    return KILN_OK;
}

/* The stage the forward's checks flagged (backend.h's codes), as an error naming it and the positions. */
static kiln_status stage_error(const kiln_context *c, int32_t code) {
    const int64_t L = c->m->cfg.n_layer;
    char stage[64], where[96], sq[32];
    if (c->b.n_seg == 1) {
        const int32_t s = c->seg_seq[0];
        const int64_t p0 = c->seq[s].pos, p1 = p0 + c->b.T - 1;
        if (c->b.T > 1 && c->check_layers) snprintf(where, sizeof where, "%spositions %lld..%lld", seq_name(c, s, sq, sizeof sq), (long long)p0, (long long)p1);
        else snprintf(where, sizeof where, "%sposition %lld", seq_name(c, s, sq, sizeof sq), (long long)(c->check_layers ? p0 : p1));
    } else {
        snprintf(where, sizeof where, "a batch of %lld tokens over %lld sequences", (long long)c->b.T, (long long)c->b.n_seg);
    }
    if (!c->check_layers) /* only the rows the argmaxes read were checked */
        return kiln_fail(KILN_ERR_RANGE, "%s: the logits at %s are not finite (NaN or infinity): the model's weights or metadata make one "
                         "(KILN_CHECK_FINITE=1 names the first layer that does)", c->who, where);
    if (code == KILN_LLAMA_STAGE_EMBED) snprintf(stage, sizeof stage, "the token embedding");
    else if (code - KILN_LLAMA_STAGE_LAYER < L) snprintf(stage, sizeof stage, "layer %d's output", code - KILN_LLAMA_STAGE_LAYER);
    else snprintf(stage, sizeof stage, "the logits (the output norm and head)");
    return kiln_fail(KILN_ERR_RANGE, "%s: %s at %s is not finite (NaN or infinity), the first stage of the forward that is: its "
                     "weights or the model's metadata make one", c->who, stage, where);
}

/* The sequence and position of row r of the step. */
static void row_where(const kiln_context *c, int64_t r, int32_t *seq, int64_t *pos) {
    int64_t s = 0;
    for (; s + 1 < c->b.n_seg && r >= c->segs[s].T; s++) r -= c->segs[s].T;
    *seq = c->seg_seq[s];
    *pos = c->seq[*seq].pos + r;
}

/* The first of the logits rows (n_out, V), out row o in row dest[o] (NULL: o), that holds a NaN or an infinity, as
 * an error naming its position and the token id. */
static kiln_status check_logits(const kiln_context *c, const float *logits, const int64_t *dest) {
    const int64_t V = c->m->cfg.n_vocab;
    for (int64_t o = 0; o < c->b.n_out; o++) {
        const float *row = logits + (dest ? dest[o] : o) * V;
        for (int64_t i = 0; i < V; i++)
            if (!isfinite(row[i])) {
                int32_t s;
                int64_t pos;
                char sq[32];
                row_where(c, c->b.out[o], &s, &pos);
                return kiln_fail(KILN_ERR_RANGE, "%s: the logits at %sposition %lld are not finite (token %lld's is %s): the model's "
                                 "weights or metadata make a NaN or an infinity (KILN_CHECK_FINITE=1 names the first layer that does)",
                                 c->who, seq_name(c, s, sq, sizeof sq), (long long)pos, (long long)i, isnan(row[i]) ? "nan" : "inf");
            }
    }
    return KILN_OK;
}

/* Moves the rows (n, w) of x from row o to row dest[o] in place (inv is dest's inverse; tmp holds a row): each
 * cycle of the permutation is walked once. */
static void permute_rows(void *x, size_t w, int64_t n, const int64_t *dest, const int64_t *inv, bool *done, void *tmp) {
    uint8_t *b = x;
    for (int64_t i = 0; i < n; i++) done[i] = false;
    for (int64_t s = 0; s < n; s++) {
        if (done[s] || dest[s] == s) continue;
        /* the row that belongs at s is inv[s]; walk j <- inv[j] until the cycle returns to s */
        memcpy(tmp, b + (size_t)s * w, w);
        int64_t j = s;
        while (inv[j] != s) {
            memcpy(b + (size_t)j * w, b + (size_t)inv[j] * w, w);
            done[j] = true;
            j = inv[j];
        }
        memcpy(b + (size_t)j * w, tmp, w);
        done[j] = true;
    }
}

/* Runs the planned step (c->b: ids staged in h_io, segments, out rows; positions staged). logits (host), when not
 * NULL, gets the out rows' logits and next the argmaxes, out row o at row dest[o] (dest NULL: o). Logits that are not
 * finite are an error, and so is a stage the checks flag; no sequence moves here (the caller advances them). */
static kiln_status run_step(kiln_context *c, float *logits, int32_t *next, const int64_t *dest) {
    const kiln_backend *be = c->be;
    const int64_t V = c->m->cfg.n_vocab, n_out = c->b.n_out, T = c->b.T;
    io_flag(c, c->h_io)[0] = 0; /* the flag the checks set */
    c->want_logits = logits && n_out;
    c->want_next = next && n_out;
    c->want_sample = c->want_next && c->sample_pending;
    const int flags = (c->want_logits ? 1 : 0) | (c->want_next ? 2 : 0) | (c->want_sample ? 4 : 0);
    /* Recorded steps, one recording each: a session's token (slots 0..7, by the outputs wanted), and on a backend
     * with seq_rows one token of each of T sequences, every row's outputs or none (slots 8 T .. 8 T + 7): such a step
     * enqueues the same work whichever sequences, positions and sampler settings it holds. A session's row of logits goes through the
     * staging buffer; otherwise the rows are copied straight into the caller's buffer after the step, or written there
     * by a backend whose memory is host memory (then put in batch order). */
    const bool single = c->n_seq == 1 && T == 1;
    const bool rows = c->n_seq > 1 && be->seq_rows && c->b.n_seg == T && T <= c->n_seq && (n_out == 0 || n_out == T);
    const bool record = single || rows;
    c->staged = single;
    float *tmp = NULL;
    c->fwd_logits = c->d_logits;
    if (be->host_memory && !c->staged) {
        if (logits) c->fwd_logits = logits;
        else if (n_out > 1 && !(c->fwd_logits = tmp = malloc(sizeof *tmp * (size_t)(n_out * V))))
            return kiln_fail(KILN_ERR_NOMEM, "%s: out of memory for %lld rows of logits", c->who, (long long)n_out);
    }
    kiln_status st;
    if (record)
        st = be->record(c->ctx, (single ? 0 : 8 * (int)T) + flags, step_enqueue, c);
    else
        st = step_enqueue(c);
    /* off the host, each run of out rows that land on consecutive caller rows is one download */
    for (int64_t o = 0, n; !st && c->want_logits && !c->staged && !be->host_memory && o < n_out; o += n) {
        const int64_t d = dest ? dest[o] : o;
        for (n = 1; o + n < n_out && (dest ? dest[o + n] : o + n) == d + n;) n++;
        st = be->download(c->ctx, logits + d * V, c->d_logits + o * V, (size_t)(n * V) * sizeof(float));
    }
    if (!st) st = be->synchronize(c->ctx);
    free(tmp);
    if (st) return st;
    c->n_evaluated += T;
    const int32_t flag = io_flag(c, c->h_io)[0];
    if (flag) return stage_error(c, flag);
    const int32_t *h_next = io_flag(c, c->h_io) - n_out;
    if (c->want_logits && c->staged) memcpy(logits, c->h_logits, (size_t)V * sizeof(float));
    if (dest && be->host_memory && c->want_logits) /* written in row order: into batch order */
        permute_rows(logits, (size_t)V * sizeof(float), n_out, dest, c->inv, c->done, c->h_logits);
    if (c->want_logits && (st = check_logits(c, logits, dest))) return st;
    if (c->want_next)
        for (int64_t o = 0; o < n_out; o++) next[dest ? dest[o] : o] = h_next[o];
    return KILN_OK;
}

/* ---------------------------------------------------------------- a sequence's tokens (sessions) */

/* T tokens of sequence seq at its position as one segment; out rows first..T-1 (none when first == T). */
static kiln_status eval_chunk(kiln_context *c, int32_t seq, const int32_t *ids, int64_t T, int64_t first, float *logits,
                              int32_t *next) {
    memcpy(c->h_io, ids, (size_t)T * sizeof *ids);
    io_pos(c, c->h_io)[0] = (int32_t)c->seq[seq].pos;
    io_seq(c, c->h_io)[0] = seq;
    c->segs[0] = (kiln_llama_segment){&c->seq[seq].kv, io_pos(c, c->d_io), T};
    c->seg_seq[0] = seq;
    for (int64_t r = first; r < T; r++) c->out[r - first] = r;
    c->b = (kiln_llama_batch){.ids = c->d_io, .T = T, .seg = c->segs, .n_seg = 1, .seq = io_seq(c, c->d_io), .kv0 = &c->seq[0].kv,
                              .kv_stride = c->seq_kv_bytes, .out = c->out, .n_out = T - first};
    /* the history first: next may be ids (a decode loop's one token), which the step overwrites; positions past pos
     * mean nothing until pos moves */
    memcpy(c->seq[seq].hist + c->seq[seq].pos, ids, (size_t)T * sizeof *ids);
    TRY(run_step(c, logits, next, NULL));
    c->seq[seq].pos += T;
    return KILN_OK;
}

kiln_status kiln_context_eval_seq(kiln_context *c, int32_t seq, const int32_t *ids, size_t n, float *logits, float *all_logits,
                                  int32_t *next) {
    const int64_t V = c->m->cfg.n_vocab;
    if (!seq_ok(c, seq)) return kiln_fail(KILN_ERR_RANGE, "%s: sequence %d is outside 0..%d", c->who, seq, c->n_seq - 1);
    if (n == 0) return KILN_OK; /* nothing to run (a session refuses an empty eval that wants outputs) */
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= V) return kiln_fail(KILN_ERR_RANGE, "token id %d is outside the vocab of %lld tokens", ids[i], (long long)V);
    seq_state *s = &c->seq[seq];
    if (n > (size_t)(c->n_ctx - s->pos))
        return kiln_fail(KILN_ERR_RANGE, "position %lld exceeds the context of %lld tokens", (long long)(s->pos + (int64_t)n - 1),
                         (long long)c->n_ctx);
    for (size_t done = 0; done < n;) {
        const int64_t T = (int64_t)(n - done) < c->n_batch ? (int64_t)(n - done) : c->n_batch;
        const bool last = done + (size_t)T == n;
        float *out = all_logits ? all_logits + done * (size_t)V : last ? logits : NULL;
        const int64_t first = all_logits ? 0 : last && (logits || next) ? T - 1 : T;
        TRY(eval_chunk(c, seq, ids + done, T, first, out, last ? next : NULL));
        done += (size_t)T;
    }
    if (logits && all_logits) memcpy(logits, all_logits + (n - 1) * (size_t)V, (size_t)V * sizeof *logits);
    return KILN_OK;
}

/* Whether a step can draw its rows under args: in the backend's own sample step, or after the forward on the host
 * where the rows are in host memory. */
static bool samples(const kiln_context *c) { return (c->be->sample && c->be->sample_work_bytes) || c->be->host_memory; }

/* The sampled steps' buffers, made at the first: n_batch args each side and the backend's work, or the host's. */
static kiln_status sample_bufs(kiln_context *c) {
    const kiln_backend *be = c->be;
    if (!samples(c)) return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: the backend samples on the host", c->who);
    if (c->h_sargs) return KILN_OK;
    const size_t bytes = (size_t)c->n_batch * sizeof *c->h_sargs;
    const bool here = be->sample != NULL;
    kiln_status st = here ? be->alloc(c->ctx, bytes, (void **)&c->d_sargs) : KILN_OK;
    if (!st && here) st = be->alloc(c->ctx, be->sample_work_bytes(c->m->cfg.n_vocab), &c->d_swork);
    if (!st && !here && !(c->h_swork = malloc(kiln_sample_args_work_bytes(c->m->cfg.n_vocab))))
        st = kiln_fail(KILN_ERR_NOMEM, "%s: out of memory for the sampler", c->who);
    if (!st && !(c->k_sargs = malloc(bytes))) st = kiln_fail(KILN_ERR_NOMEM, "%s: out of memory for the sampler", c->who);
    if (!st) st = be->alloc_host(c->ctx, bytes, (void **)&c->h_sargs);
    if (st) { /* all or none, so the next call tries again */
        be->free(c->ctx, c->d_sargs), be->free(c->ctx, c->d_swork), be->free_host(c->ctx, c->h_sargs);
        free(c->h_swork), free(c->k_sargs);
        c->d_sargs = NULL, c->d_swork = NULL, c->h_sargs = NULL, c->h_swork = NULL, c->k_sargs = NULL;
    }
    return st;
}

kiln_status kiln_context_eval_seq_sampled(kiln_context *c, int32_t seq, const int32_t *ids, size_t n, const kiln_sample_args *args,
                                          int32_t *next) {
    TRY(sample_bufs(c));
    *c->h_sargs = *args;
    c->sample_pending = true;
    const kiln_status st = kiln_context_eval_seq(c, seq, ids, n, NULL, NULL, next);
    c->sample_pending = false;
    return st;
}

/* ---------------------------------------------------------------- a batch of entries */

/* Every entry checked against the sequences' positions before anything runs; cnt gets each sequence's entries. */
static kiln_status check_batch(kiln_context *c, const kiln_batch_entry *b, size_t n) {
    const int64_t V = c->m->cfg.n_vocab;
    if (n && !b) return kiln_fail(KILN_ERR_INVALID, "%s: a batch of %zu entries at NULL", c->who, n);
    if (n == 0) return kiln_fail(KILN_ERR_INVALID, "%s: an empty batch", c->who);
    if (n > (size_t)c->n_batch)
        return kiln_fail(KILN_ERR_RANGE, "%s: a batch of %zu entries is more than n_batch %lld", c->who, n, (long long)c->n_batch);
    for (int32_t s = 0; s < c->n_seq; s++) c->cnt[s] = 0;
    for (size_t i = 0; i < n; i++) {
        const kiln_batch_entry *e = &b[i];
        if (!seq_ok(c, e->seq))
            return kiln_fail(KILN_ERR_RANGE, "%s: entry %zu: sequence %d is outside 0..%d", c->who, i, e->seq, c->n_seq - 1);
        if (e->id < 0 || e->id >= V)
            return kiln_fail(KILN_ERR_RANGE, "%s: entry %zu: token id %d is outside the vocab of %lld tokens", c->who, i, e->id, (long long)V);
        const int64_t want = c->seq[e->seq].pos + c->cnt[e->seq];
        if (e->pos != want)
            return kiln_fail(KILN_ERR_INVALID, "%s: entry %zu: position %lld of sequence %d is not its next position %lld", c->who, i,
                             (long long)e->pos, e->seq, (long long)want);
        if (want >= c->n_ctx)
            return kiln_fail(KILN_ERR_RANGE, "%s: entry %zu: position %lld exceeds sequence %d's context of %lld tokens", c->who, i,
                             (long long)e->pos, e->seq, (long long)c->n_ctx);
        c->cnt[e->seq]++;
    }
    return KILN_OK;
}

/* Groups the entries into one segment per sequence: the sequences of several entries first, then those of one, each
 * in the order of its first entry, so a step's decode tokens are consecutive rows (one head call for all of them).
 * perm[r] is the entry row r runs; out and dest the rows wanted and where their logits go (batch order). */
static void plan_batch(kiln_context *c, const kiln_batch_entry *b, size_t n, bool want) {
    int64_t n_seg = 0, row = 0;
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 0; i < n; i++) {
            const int32_t s = b[i].seq;
            if (c->cnt[s] <= 0 || (pass == 0) != (c->cnt[s] > 1)) continue; /* seen, or not this pass's kind */
            c->start[s] = row;
            io_pos(c, c->h_io)[n_seg] = (int32_t)c->seq[s].pos;
            io_seq(c, c->h_io)[n_seg] = s;
            c->segs[n_seg] = (kiln_llama_segment){&c->seq[s].kv, io_pos(c, c->d_io) + n_seg, c->cnt[s]};
            c->seg_seq[n_seg++] = s;
            row += c->cnt[s];
            c->cnt[s] = -c->cnt[s]; /* done */
        }
    int64_t wanted = 0;
    for (size_t i = 0; i < n; i++) { /* each sequence's entries in batch order are its rows in order */
        const int64_t r = c->start[b[i].seq]++;
        c->perm[r] = (int64_t)i;
        c->h_io[r] = b[i].id;
    }
    int64_t *rank = c->inv; /* scratch: each wanted entry's row of the caller's logits */
    for (size_t i = 0; i < n; i++) rank[i] = want && b[i].logits ? wanted++ : -1;
    int64_t n_out = 0;
    for (int64_t r = 0; r < (int64_t)n; r++)
        if (rank[c->perm[r]] >= 0) c->dest[n_out] = rank[c->perm[r]], c->out[n_out++] = r;
    for (int64_t o = 0; o < n_out; o++) c->inv[c->dest[o]] = o;
    c->b = (kiln_llama_batch){.ids = c->d_io, .T = (int64_t)n, .seg = c->segs, .n_seg = n_seg, .seq = io_seq(c, c->d_io),
                              .kv0 = &c->seq[0].kv, .kv_stride = c->seq_kv_bytes, .out = c->out, .n_out = n_out};
}

kiln_status kiln_context_decode(kiln_context *c, const kiln_batch_entry *b, size_t n, float *logits, int32_t *next) {
    TRY(check_batch(c, b, n));
    plan_batch(c, b, n, logits || next);
    TRY(run_step(c, logits, next, c->dest));
    for (size_t i = 0; i < n; i++) c->seq[b[i].seq].hist[b[i].pos] = b[i].id;
    for (int64_t g = 0; g < c->b.n_seg; g++) c->seq[c->seg_seq[g]].pos += c->segs[g].T;
    return KILN_OK;
}

/* A checked batch whose wanted rows draw under args (the caller's order of wanted rows). */
static kiln_status decode_args(kiln_context *c, const kiln_batch_entry *b, size_t n, const kiln_sample_args *args, float *logits,
                               int32_t *next) {
    plan_batch(c, b, n, true);
    for (int64_t o = 0; o < c->b.n_out; o++) c->h_sargs[o] = args[c->dest[o]]; /* in the rows' order */
    c->sample_pending = true;
    const kiln_status st = run_step(c, logits, next, c->dest);
    c->sample_pending = false;
    TRY(st);
    for (size_t i = 0; i < n; i++) c->seq[b[i].seq].hist[b[i].pos] = b[i].id;
    for (int64_t g = 0; g < c->b.n_seg; g++) c->seq[c->seg_seq[g]].pos += c->segs[g].T;
    return KILN_OK;
}

kiln_status kiln_context_decode_sample(kiln_context *c, const kiln_batch_entry *b, size_t n, kiln_sampler *const *smp, float *logits,
                                       int32_t *next) {
    TRY(check_batch(c, b, n));
    if (!smp || !next) return kiln_fail(KILN_ERR_INVALID, "%s: a sampled decode needs its samplers and next", c->who);
    size_t n_want = 0;
    for (size_t i = 0; i < n; i++)
        if (b[i].logits && !smp[n_want++])
            return kiln_fail(KILN_ERR_INVALID, "%s: entry %zu wants its token drawn, but its sampler is NULL", c->who, i);
    const int64_t V = c->m->cfg.n_vocab;
    /* each entry's id into its sequence's history first (positions past pos mean nothing until pos moves), so a
     * wanted row's penalty window reads the ids up to and with its entry */
    for (size_t i = 0; i < n; i++) c->seq[b[i].seq].hist[b[i].pos] = b[i].id;
    bool fits = samples(c);
    for (size_t i = 0, k = 0; fits && i < n; i++) {
        if (!b[i].logits) continue;
        const size_t nh = (size_t)b[i].pos + 1, w = kiln_sampler_window(smp[k], nh);
        fits = kiln_sampler_step_fits(smp[k++], c->seq[b[i].seq].hist + (nh - w), w);
    }
    if (fits && sample_bufs(c) == KILN_OK) {
        for (size_t i = 0, k = 0; i < n; i++) {
            if (!b[i].logits) continue;
            const size_t nh = (size_t)b[i].pos + 1, w = kiln_sampler_window(smp[k], nh);
            kiln_sampler_step_args(smp[k], c->seq[b[i].seq].hist + (nh - w), w, &c->k_sargs[k]); /* fits: it draws */
            k++;
        }
        return decode_args(c, b, n, c->k_sargs, logits, next);
    }
    /* on the host: the rows come back, and each sampler draws from its own (a copy when the caller keeps them) */
    float *rows = logits ? logits : malloc(sizeof *rows * (n_want ? n_want : 1) * (size_t)V);
    float *row = logits ? malloc(sizeof *row * (size_t)V) : NULL;
    kiln_status st = !rows || (logits && !row) ? kiln_fail(KILN_ERR_NOMEM, "%s: out of memory for %zu rows", c->who, n_want)
                                               : kiln_context_decode(c, b, n, rows, NULL);
    for (size_t i = 0, k = 0; !st && i < n; i++) {
        if (!b[i].logits) continue;
        float *r = rows + k * (size_t)V;
        if (row) r = memcpy(row, r, sizeof *row * (size_t)V);
        next[k] = kiln_sampler_sample(smp[k], r, c->seq[b[i].seq].hist, (size_t)b[i].pos + 1);
        k++;
    }
    if (!logits) free(rows);
    free(row);
    return st;
}

/* ---------------------------------------------------------------- profile */

/* One decode step of sequence 0 at the staged position, enqueued step by step (not replayed). */
static kiln_status profile_step(void *arg) {
    kiln_context *c = arg;
    c->h_io[0] = 1 % (int32_t)c->m->cfg.n_vocab;
    c->segs[0] = (kiln_llama_segment){&c->seq[0].kv, io_pos(c, c->d_io), 1};
    c->seg_seq[0] = 0;
    io_seq(c, c->h_io)[0] = 0;
    c->out[0] = 0;
    c->b = (kiln_llama_batch){.ids = c->d_io, .T = 1, .seg = c->segs, .n_seg = 1, .seq = io_seq(c, c->d_io), .kv0 = &c->seq[0].kv,
                              .kv_stride = c->seq_kv_bytes, .out = c->out, .n_out = 1}; /* as a decode step runs it */
    c->want_logits = false;
    c->want_next = true;
    c->staged = false;
    c->fwd_logits = c->d_logits;
    TRY(step_enqueue(c));
    return c->be->synchronize(c->ctx);
}

kiln_status kiln_context_profile(kiln_context *c, int64_t pos0, int reps, kiln_op_time *ops, int *n_ops) {
    if (!c->be->profile) return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: the %s backend has no per-step profile", c->who, c->be->name);
    if (pos0 < 0 || pos0 >= c->n_ctx)
        return kiln_fail(KILN_ERR_RANGE, "%s: profile position %lld is outside the context of %lld", c->who, (long long)pos0, (long long)c->n_ctx);
    io_pos(c, c->h_io)[0] = (int32_t)pos0;
    io_flag(c, c->h_io)[0] = 0;
    return c->be->profile(c->ctx, pos0, reps, profile_step, c, ops, n_ops);
}
