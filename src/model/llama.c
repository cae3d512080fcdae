/* llama.c: the llama forward pass, written once against the ops table (src/cpu/ops.h), so every backend
 * runs the same orchestration. A call advances a batch of T tokens at positions pos0..pos0+T-1: it writes
 * their keys and values into the session's f16 KV cache and, when asked, returns the logits of the last row
 * or of every row. tests/test_generate.c checks it against llama2.c's outputs on stories260K and checks
 * that chunked prefill, one batch and token-by-token decode agree; tests/test_arch.c checks each architecture
 * flag (model.h) against tests/ref/arch_ref.py's float64 reference, and the sliding layers' ring cache. */
#include "model.h"
#include "cpu/ops.h"
#include "quants.h"
#include "cpu/simd.h"

#include <math.h>
#include <string.h>

/* The activations of one batch, carved from one float buffer (sizes in floats, T rows each):
 *   x    (T, C)    the residual stream
 *   xb   (T, C)    normed input of a block, then a block's output before the residual add
 *   q    (T, NH*HS)
 *   k, v (T, NKV*HS)
 *   att  (T, NH*HS) attention output
 *   gate, up (T, F)
 *   pos  (T)       int32 positions, for RoPE
 *   ag   (T, NH*HS) the attention output gate's logits, only with output_gate */
size_t kiln_llama_act_floats(const kiln_llama_config *c, int64_t T) {
    int64_t Q = c->n_head * c->head_dim, KV = c->n_head_kv * c->head_dim;
    return (size_t)T * (size_t)(2 * c->n_embd + 2 * Q + 2 * KV + 2 * c->n_ff + 1 + (c->output_gate ? Q : 0));
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

/* Writes n rows of src (n, KV) for positions p.. into cache rows p % rows.. (f16): one conversion, or two where
 * the ring wraps. */
static void store_rows(kiln_from_float_fn to_f16, uint16_t *cache, int64_t rows, const float *src, int64_t p, int64_t n, int64_t KV) {
    const int64_t r = p % rows, first = n < rows - r ? n : rows - r;
    to_f16(src, cache + (size_t)r * (size_t)KV, first * KV);
    if (first < n) to_f16(src + first * KV, cache, (n - first) * KV);
}

/* act holds kiln_llama_act_floats(T). Ids are valid, pos0 + T fits every full layer's rows and a sliding layer's
 * ring holds window + T - 1 rows (the session checks all three). logits, when not NULL, receives (T, V) when
 * all_logits, else the last row's (V); the head runs only for those rows. Each architecture flag (model.h) adds
 * its step where llama.cpp's graph for that architecture has it. */
void kiln_llama_forward(const kiln_model *m, const kiln_ops *ops, kiln_ops_ctx *ctx, const kiln_llama_kv *kv, float *act,
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
    float *ag = up + T * F + T; /* (T, Q), with output_gate */
    for (int64_t t = 0; t < T; t++) pos[t] = (int32_t)(pos0 + t);
    /* f32 -> f16 for the KV cache, the same bits as kiln_f32_to_fp16 at every SIMD level (F16C rounds to nearest even) */
    const kiln_from_float_fn to_f16 = kiln_get_from_float(KILN_TYPE_F16, kiln_simd_best());

    ops->embed_forward(ctx, x, m->tok_embd, ids, T);
    if (c->embd_scale) ops->scale_softcap_forward(ctx, x, T * C, sqrtf((float)C), 0.0f);
    for (int64_t l = 0; l < c->n_layer; l++) {
        const kiln_llama_layer *w = &m->layers[l];
        uint16_t *k_cache = kv->k[l], *v_cache = kv->v[l]; /* (rows, KV) each */
        const int64_t rows = kv->rows[l];

        /* attention block */
        ops->rmsnorm_forward(ctx, xb, x, w->attn_norm->data, T, C, c->rms_eps);
        matmul3(ops, ctx, q, w->wq, k, w->wk, v, w->wv, xb, T);
        if (c->output_gate) ops->matmul_forward(ctx, ag, xb, w->w_attn_gate, T);
        if (c->qkv_bias) {
            ops->add_bias_forward(ctx, q, w->bq->data, T, Q);
            ops->add_bias_forward(ctx, k, w->bk->data, T, KV);
            ops->add_bias_forward(ctx, v, w->bv->data, T, KV);
        }
        if (c->qk_norm) { /* each head's row of HS is one RMSNorm row */
            ops->rmsnorm_forward(ctx, q, q, w->q_norm->data, T * NH, HS, c->rms_eps);
            ops->rmsnorm_forward(ctx, k, k, w->k_norm->data, T * NKV, HS, c->rms_eps);
        }
        if (!w->nope) {
            const float base = w->rope_base > 0 ? w->rope_base : c->rope_base;
            ops->rope_forward(ctx, q, pos, T, NH, HS, c->rope_dim, base, c->rope_neox);
            ops->rope_forward(ctx, k, pos, T, NKV, HS, c->rope_dim, base, c->rope_neox);
        }
        /* the attention op scales by 1/sqrt(HS): another scale goes into q */
        if (c->attn_scale > 0) ops->scale_softcap_forward(ctx, q, T * Q, c->attn_scale * sqrtf((float)HS), 0.0f);
        store_rows(to_f16, k_cache, rows, k, pos0, T, KV);
        store_rows(to_f16, v_cache, rows, v, pos0, T, KV);
        if (w->window || rows < pos0 + T)
            ops->attention_window_forward(ctx, att, q, k_cache, v_cache, pos0, T, NH, NKV, HS, w->window, rows);
        else
            ops->attention_forward(ctx, att, q, k_cache, v_cache, pos0, T, NH, NKV, HS);
        if (c->output_gate) ops->sigmoid_mul_forward(ctx, att, ag, T * Q);
        ops->matmul_forward(ctx, xb, att, w->wo, T);
        if (c->sandwich_norm) ops->rmsnorm_forward(ctx, xb, xb, w->post_attn_norm->data, T, C, c->post_norm_eps);
        add_rows(x, xb, T * C);

        /* feed-forward block: down(act(gate(x)) * up(x)), act silu (SwiGLU) or tanh-GELU (GeGLU) */
        ops->rmsnorm_forward(ctx, xb, x, w->ffn_norm->data, T, C, c->rms_eps);
        matmul3(ops, ctx, gate, w->w_gate, up, w->w_up, NULL, NULL, xb, T);
        if (c->geglu)
            ops->geglu_forward(ctx, gate, gate, up, T * F);
        else
            ops->swiglu_forward(ctx, gate, gate, up, T * F);
        ops->matmul_forward(ctx, xb, gate, w->w_down, T);
        if (c->sandwich_norm) ops->rmsnorm_forward(ctx, xb, xb, w->post_ffn_norm->data, T, C, c->post_norm_eps);
        add_rows(x, xb, T * C);
    }
    if (!logits) return;
    /* the head is V x C per row, the largest matmul for small models: run it only for the rows wanted */
    int64_t first = all_logits ? 0 : T - 1, rows = T - first;
    ops->rmsnorm_forward(ctx, xb, x + first * C, m->output_norm->data, rows, C, c->rms_eps);
    ops->matmul_forward(ctx, logits, xb, m->output, rows);
    const float scale = c->logit_scale > 0 ? c->logit_scale : 1.0f;
    if (scale != 1.0f || c->logit_softcap > 0)
        ops->scale_softcap_forward(ctx, logits, rows * c->n_vocab, scale, c->logit_softcap);
}
