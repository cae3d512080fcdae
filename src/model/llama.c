/* llama.c: the llama forward pass, written once against the ops table (src/cpu/ops.h), so every backend
 * runs the same orchestration. A call advances a batch of T tokens at positions pos0..pos0+T-1: it writes
 * their keys and values into the session's f16 KV cache and, when asked, returns the logits of the last row
 * or of every row. tests/test_generate.c checks it against llama2.c's outputs on stories260K and checks
 * that chunked prefill, one batch and token-by-token decode agree. */
#include "model.h"
#include "cpu/ops.h"
#include "fp16.h"

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

    ops->embed_forward(ctx, x, m->tok_embd, ids, T);
    for (int64_t l = 0; l < c->n_layer; l++) {
        const kiln_llama_layer *w = &m->layers[l];
        uint16_t *k_cache = kv_cache + (size_t)(2 * l) * (size_t)n_ctx * (size_t)KV;  /* (n_ctx, KV) */
        uint16_t *v_cache = k_cache + (size_t)n_ctx * (size_t)KV;                     /* (n_ctx, KV) */

        /* attention block */
        ops->rmsnorm_forward(ctx, xb, x, w->attn_norm->data, T, C, c->rms_eps);
        ops->matmul_forward(ctx, q, xb, w->wq, T);
        ops->matmul_forward(ctx, k, xb, w->wk, T);
        ops->matmul_forward(ctx, v, xb, w->wv, T);
        ops->rope_forward(ctx, q, pos, T, NH, HS, c->rope_dim, c->rope_base, c->rope_neox);
        ops->rope_forward(ctx, k, pos, T, NKV, HS, c->rope_dim, c->rope_base, c->rope_neox);
        for (int64_t t = 0; t < T; t++) {
            uint16_t *kr = k_cache + (size_t)(pos0 + t) * (size_t)KV, *vr = v_cache + (size_t)(pos0 + t) * (size_t)KV;
            for (int64_t i = 0; i < KV; i++) {
                kr[i] = kiln_f32_to_fp16(k[t * KV + i]);
                vr[i] = kiln_f32_to_fp16(v[t * KV + i]);
            }
        }
        ops->attention_forward(ctx, att, q, k_cache, v_cache, pos0, T, NH, NKV, HS);
        ops->matmul_forward(ctx, xb, att, w->wo, T);
        add_rows(x, xb, T * C);

        /* feed-forward block: down(silu(gate(x)) * up(x)) */
        ops->rmsnorm_forward(ctx, xb, x, w->ffn_norm->data, T, C, c->rms_eps);
        ops->matmul_forward(ctx, gate, xb, w->w_gate, T);
        ops->matmul_forward(ctx, up, xb, w->w_up, T);
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
