/* TEMPORARY: replaced by src/infer/context.c at integration */
/* shim_context.c: the multi-sequence kiln_context API of include/kiln.h over n_seq kiln_session objects, so that the
 * server's scheduler (src/serve/sched.c) runs before the real context lands. A decode is one kiln_session_eval per
 * sequence of its entries (no shared forward); seq_copy re-evaluates the source's ids in the destination; save and
 * restore are KILN_ERR_UNSUPPORTED. Nothing outside this file may depend on it. */
#include "kiln.h"

#include <stdlib.h>
#include <string.h>

struct kiln_context {
    const kiln_model *m;
    int32_t n_seq;
    int64_t n_ctx, n_batch, V;
    kiln_session **seq; /* (n_seq) */
    float *row;         /* (V): one sequence's last logits */
};

kiln_status kiln_context_new(const kiln_model *m, const kiln_context_params *p, kiln_context **out) {
    *out = NULL;
    int32_t n_seq = p->n_seq ? p->n_seq : 1;
    if (n_seq < 1 || n_seq > 4096) return kiln_fail(KILN_ERR_INVALID, "context: n_seq %d is outside [1, 4096]", (int)n_seq);
    kiln_context *c = calloc(1, sizeof *c);
    if (!c) return KILN_ERR_NOMEM;
    c->m = m, c->n_seq = n_seq, c->V = kiln_model_n_vocab(m);
    c->n_batch = p->s.n_batch ? p->s.n_batch : 512;
    c->seq = calloc((size_t)n_seq, sizeof *c->seq);
    c->row = malloc((size_t)c->V * sizeof *c->row);
    if (!c->seq || !c->row) {
        kiln_context_free(c);
        return KILN_ERR_NOMEM;
    }
    for (int32_t i = 0; i < n_seq; i++) {
        kiln_status s = kiln_session_new(m, &p->s, &c->seq[i]);
        if (s) {
            kiln_context_free(c);
            return s;
        }
    }
    c->n_ctx = kiln_session_n_ctx(c->seq[0]);
    *out = c;
    return KILN_OK;
}

void kiln_context_free(kiln_context *c) {
    if (!c) return;
    for (int32_t i = 0; c->seq && i < c->n_seq; i++) kiln_session_free(c->seq[i]);
    free(c->seq);
    free(c->row);
    free(c);
}

int32_t kiln_context_n_seq(const kiln_context *c) { return c->n_seq; }
int64_t kiln_context_n_ctx(const kiln_context *c) { return c->n_ctx; }
int64_t kiln_context_n_batch(const kiln_context *c) { return c->n_batch; }
bool kiln_context_on_gpu(const kiln_context *c) { return kiln_session_on_gpu(c->seq[0]); }
size_t kiln_context_device_bytes(const kiln_context *c) {
    size_t t = 0;
    for (int32_t i = 0; i < c->n_seq; i++) t += kiln_session_device_bytes(c->seq[i]);
    return t;
}
size_t kiln_context_kv_bytes(const kiln_context *c) {
    kiln_model_info mi;
    kiln_model_get_info(c->m, &mi);
    return (size_t)c->n_seq * (size_t)c->n_ctx * (size_t)mi.n_layer * 2 * (size_t)(mi.n_head_kv * mi.head_dim) * 2;
}

/* Checks every entry first (sequence, position, id), so that a bad batch moves nothing. */
static kiln_status check_batch(const kiln_context *c, const kiln_batch_entry *b, size_t n, int64_t *next_pos) {
    if (n < 1 || (int64_t)n > c->n_batch)
        return kiln_fail(KILN_ERR_INVALID, "context: a batch of %zu entries is outside [1, %lld]", n, (long long)c->n_batch);
    for (int32_t i = 0; i < c->n_seq; i++) next_pos[i] = kiln_session_pos(c->seq[i]);
    for (size_t i = 0; i < n; i++) {
        if (b[i].seq < 0 || b[i].seq >= c->n_seq)
            return kiln_fail(KILN_ERR_RANGE, "context: entry %zu: sequence %d is outside [0, %d)", i, (int)b[i].seq, (int)c->n_seq);
        if (b[i].id < 0 || b[i].id >= c->V)
            return kiln_fail(KILN_ERR_RANGE, "context: entry %zu: token id %d is outside the vocab of %lld", i, (int)b[i].id, (long long)c->V);
        if (b[i].pos != next_pos[b[i].seq])
            return kiln_fail(KILN_ERR_INVALID, "context: entry %zu: position %lld of sequence %d, expected %lld", i, (long long)b[i].pos,
                             (int)b[i].seq, (long long)next_pos[b[i].seq]);
        if (b[i].pos >= c->n_ctx)
            return kiln_fail(KILN_ERR_RANGE, "context: entry %zu: position %lld is past the context of %lld", i, (long long)b[i].pos,
                             (long long)c->n_ctx);
        next_pos[b[i].seq]++;
    }
    return KILN_OK;
}

/* Each sequence's entries are one kiln_session_eval; a row is wanted only for an entry with .logits, which this
 * shim supports only on the last entry of its sequence in the batch (all a server asks for). On an error every
 * sequence goes back to where it was. */
kiln_status kiln_context_decode(kiln_context *c, const kiln_batch_entry *b, size_t n, float *logits, int32_t *next) {
    int64_t *pos = malloc((size_t)c->n_seq * sizeof *pos), *pos0 = malloc((size_t)c->n_seq * sizeof *pos0);
    int32_t *ids = malloc(n * sizeof *ids);
    float *rows = malloc((size_t)c->n_seq * (size_t)c->V * sizeof *rows); /* (n_seq, V): each sequence's last row */
    kiln_status s = pos && pos0 && ids && rows ? check_batch(c, b, n, pos) : KILN_ERR_NOMEM;
    for (size_t i = 0; !s && i < n; i++)
        for (size_t j = i + 1; b[i].logits && j < n; j++)
            if (b[j].seq == b[i].seq) s = kiln_fail(KILN_ERR_UNSUPPORTED, "context (shim): entry %zu: logits only on a sequence's last entry", i);
    for (int32_t q = 0; !s && q < c->n_seq; q++) pos0[q] = kiln_session_pos(c->seq[q]);
    for (int32_t q = 0; !s && q < c->n_seq; q++) {
        size_t k = 0;
        bool want = false;
        for (size_t i = 0; i < n; i++)
            if (b[i].seq == q) ids[k++] = b[i].id, want = b[i].logits;
        if (k) s = kiln_session_eval(c->seq[q], ids, k, want ? rows + (size_t)q * (size_t)c->V : NULL, NULL);
        if (s)
            for (int32_t r = 0; r <= q; r++) kiln_session_keep(c->seq[r], pos0[r]);
    }
    size_t row = 0;
    for (size_t i = 0; !s && i < n; i++) {
        if (!b[i].logits) continue;
        const float *src = rows + (size_t)b[i].seq * (size_t)c->V;
        if (logits) memcpy(logits + row * (size_t)c->V, src, (size_t)c->V * sizeof *src);
        if (next) {
            int32_t best = 0;
            for (int64_t v = 1; v < c->V; v++)
                if (src[v] > src[best]) best = (int32_t)v;
            next[row] = best;
        }
        row++;
    }
    free(pos), free(pos0), free(ids), free(rows);
    return s;
}

int64_t kiln_context_seq_pos(const kiln_context *c, int32_t seq) { return seq >= 0 && seq < c->n_seq ? kiln_session_pos(c->seq[seq]) : -1; }
const int32_t *kiln_context_seq_tokens(const kiln_context *c, int32_t seq) {
    return seq >= 0 && seq < c->n_seq ? kiln_session_tokens(c->seq[seq]) : NULL;
}
int64_t kiln_context_seq_keep(kiln_context *c, int32_t seq, int64_t n) {
    return seq >= 0 && seq < c->n_seq ? kiln_session_keep(c->seq[seq], n) : 0;
}

/* dst keeps what it shares with src's first n ids and evaluates the rest of them. */
kiln_status kiln_context_seq_copy(kiln_context *c, int32_t src, int32_t dst, int64_t n) {
    if (src < 0 || src >= c->n_seq || dst < 0 || dst >= c->n_seq)
        return kiln_fail(KILN_ERR_RANGE, "context: seq_copy %d -> %d: a sequence outside [0, %d)", (int)src, (int)dst, (int)c->n_seq);
    int64_t sp = kiln_session_pos(c->seq[src]);
    if (n < 0 || n > sp) return kiln_fail(KILN_ERR_RANGE, "context: seq_copy of %lld positions, the source has %lld", (long long)n, (long long)sp);
    if (src == dst) {
        kiln_session_keep(c->seq[dst], n);
        return KILN_OK;
    }
    const int32_t *a = kiln_session_tokens(c->seq[src]), *d = kiln_session_tokens(c->seq[dst]);
    int64_t dp = kiln_session_pos(c->seq[dst]), k = 0;
    while (k < n && k < dp && a[k] == d[k]) k++;
    k = kiln_session_keep(c->seq[dst], k);
    if (k == n) return KILN_OK;
    int32_t *ids = malloc((size_t)(n - k) * sizeof *ids);
    if (!ids) return KILN_ERR_NOMEM;
    memcpy(ids, a + k, (size_t)(n - k) * sizeof *ids);
    kiln_status s = kiln_session_eval(c->seq[dst], ids, (size_t)(n - k), NULL, NULL);
    free(ids);
    if (s) kiln_session_keep(c->seq[dst], 0);
    return s;
}

kiln_status kiln_context_seq_save(const kiln_context *c, int32_t seq, const char *path) {
    return kiln_fail(KILN_ERR_UNSUPPORTED, "context: slot files need src/infer/context.c (this build has the server's shim)");
}
kiln_status kiln_context_seq_restore(kiln_context *c, int32_t seq, const char *path, int64_t *n_tokens) {
    return kiln_fail(KILN_ERR_UNSUPPORTED, "context: slot files need src/infer/context.c (this build has the server's shim)");
}
