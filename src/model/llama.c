/* llama.c: the llama forward pass, written once against the ops table (src/cpu/ops.h), so every backend
 * runs the same orchestration. A call advances a batch of T tokens at positions pos0..pos0+T-1: it writes
 * their keys and values into the session's f16 KV cache and, when asked, returns the logits of the last row
 * or of every row. tests/test_generate.c checks it against llama2.c's outputs on stories260K and checks
 * that chunked prefill, one batch and token-by-token decode agree. */
#include "model.h"
#include "cpu/ops.h"
#include "quants.h"

#include <string.h>

/* The activations of one batch, carved from one float buffer (sizes in floats, T rows each):
 *   x    (T, C)    the residual stream
 *   xb   (T, C)    normed input of a block, then a block's output before the residual add
 *   q    (T, NH*HS)
 *   k, v (T, NKV*HS)
 *   att  (T, NH*HS) attention output
 *   gate, up (T, F)
 *   pos  (T)       int32 positions, for RoPE */
size_t kiln_llama_act_floats(const kiln_llama_config *c, int64_t T) {
    int64_t Q = c->n_head * c->head_dim, KV = c->n_head_kv * c->head_dim;
    return (size_t)T * (size_t)(2 * c->n_embd + 2 * Q + 2 * KV + 2 * c->n_ff + 1);
}

/* The widest activation row a matmul quantizes: C (q, k, v, gate, up, head), NH*HS (wo) or F (down). */
int64_t kiln_llama_max_width(const kiln_llama_config *c) {
    int64_t w = c->n_embd, Q = c->n_head * c->head_dim;
    if (Q > w) w = Q;
    if (c->n_ff > w) w = c->n_ff;
    return w;
}

static void add_rows(float *x, const float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] += y[i];
}

/* Two or three matmuls of the same x (c may be NULL): one job where the backend has matmul_n_forward, so x is
 * quantized once and small k and v share the threads with q (a pool wake-up costs 10-90 us; decode has ~10 per layer). */
static void matmul3(const kiln_ops *ops, kiln_ops_ctx *ctx, float *a, const kiln_tensor_view *wa, float *b, const kiln_tensor_view *wb,
                    float *c, const kiln_tensor_view *wc, const float *x, int64_t T) {
    float *const y[3] = {a, b, c};
    const kiln_tensor_view *const w[3] = {wa, wb, wc};
    const int n = c ? 3 : 2;
    if (ops->matmul_n_forward) {
        ops->matmul_n_forward(ctx, n, y, x, w, T);
        return;
    }
    for (int i = 0; i < n; i++) ops->matmul_forward(ctx, y[i], x, w[i], T);
}

/* kv_cache is (L, 2, n_ctx, NKV*HS) f16: layer l's keys, then its values. act holds kiln_llama_act_floats(T).
 * Ids are valid and pos0 + T <= n_ctx (the session checks both). logits, when not NULL, receives (T, V) when
 * all_logits, else the last row's (V); the head runs only for those rows. */
void kiln_llama_forward(const kiln_model *m, const kiln_ops *ops, kiln_ops_ctx *ctx, uint16_t *kv_cache, int64_t n_ctx, float *act,
                        const int32_t *ids, int64_t T, int64_t pos0, float *logits, bool all_logits) {
    const kiln_llama_config *c = &m->cfg;
    const int64_t C = c->n_embd, NH = c->n_head, NKV = c->n_head_kv, HS = c->head_dim, F = c->n_ff;
    const int64_t Q = NH * HS, KV = NKV * HS;
    float *x = act;          /* (T, C) */
    float *xb = x + T * C;   /* (T, C) */
    float *q = xb + T * C;   /* (T, Q) */
    float *k = q + T * Q;    /* (T, KV) */
    float *v = k + T * KV;   /* (T, KV) */
    float *att = v + T * KV; /* (T, Q) */
    float *gate = att + T * Q; /* (T, F) */
    float *up = gate + T * F;  /* (T, F) */
    int32_t *pos = (int32_t *)(up + T * F); /* (T) */
    for (int64_t t = 0; t < T; t++) pos[t] = (int32_t)(pos0 + t);
    /* f32 -> f16 for the KV cache, the same bits as kiln_f32_to_fp16 at every SIMD level (F16C rounds to nearest even) */
    const kiln_from_float_fn to_f16 = kiln_get_from_float(KILN_TYPE_F16, kiln_simd_best());

    ops->embed_forward(ctx, x, m->tok_embd, ids, T);
    for (int64_t l = 0; l < c->n_layer; l++) {
        const kiln_llama_layer *w = &m->layers[l];
        uint16_t *k_cache = kv_cache + (size_t)(2 * l) * (size_t)n_ctx * (size_t)KV;  /* (n_ctx, KV) */
        uint16_t *v_cache = k_cache + (size_t)n_ctx * (size_t)KV;                     /* (n_ctx, KV) */

        /* attention block */
        ops->rmsnorm_forward(ctx, xb, x, w->attn_norm->data, T, C, c->rms_eps);
        matmul3(ops, ctx, q, w->wq, k, w->wk, v, w->wv, xb, T);
        ops->rope_forward(ctx, q, pos, T, NH, HS, c->rope_dim, c->rope_base, c->rope_neox);
        ops->rope_forward(ctx, k, pos, T, NKV, HS, c->rope_dim, c->rope_base, c->rope_neox);
        /* the batch's rows of the cache are contiguous: one conversion each for k and v */
        to_f16(k, k_cache + (size_t)pos0 * (size_t)KV, T * KV);
        to_f16(v, v_cache + (size_t)pos0 * (size_t)KV, T * KV);
        ops->attention_forward(ctx, att, q, k_cache, v_cache, pos0, T, NH, NKV, HS);
        ops->matmul_forward(ctx, xb, att, w->wo, T);
        add_rows(x, xb, T * C);

        /* feed-forward block: down(silu(gate(x)) * up(x)) */
        ops->rmsnorm_forward(ctx, xb, x, w->ffn_norm->data, T, C, c->rms_eps);
        matmul3(ops, ctx, gate, w->w_gate, up, w->w_up, NULL, NULL, xb, T);
        ops->swiglu_forward(ctx, gate, gate, up, T * F);
        ops->matmul_forward(ctx, xb, gate, w->w_down, T);
        add_rows(x, xb, T * C);
    }
    if (!logits) return;
    /* the head is V x C per row, the largest matmul for small models: run it only for the rows wanted */
    int64_t first = all_logits ? 0 : T - 1, rows = T - first;
    ops->rmsnorm_forward(ctx, xb, x + first * C, m->output_norm->data, rows, C, c->rms_eps);
    ops->matmul_forward(ctx, logits, xb, m->output, rows);
}
