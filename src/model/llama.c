/* llama.c: the llama forward pass, written once against the backend seam (backend.h), so the CPU and the CUDA
 * backends run the same orchestration. A call advances a batch of T tokens, runs of which (segments) belong to
 * different sequences at their own positions (a context's, src/infer/context.c): the matmuls, norms and FFN run
 * over all T rows at once, so the weights are read once per step, and qkv_post and attention run per segment over
 * its sequence's KV cache. When asked it leaves the logits of the rows wanted and their argmax in backend
 * memory. The call only enqueues, so the CUDA backend records a token's step once (a CUDA graph) and replays it;
 * ids and positions are read by the steps from backend memory. tests/test_context.c checks batches of several
 * sequences against each sequence alone.
 * tests/test_generate.c checks it against llama2.c's outputs on stories260K and checks that chunked prefill, one
 * batch and token-by-token decode agree; tests/test_arch.c checks each architecture flag (model.h) against
 * tests/ref/arch_ref.py's float64 reference, and the sliding layers' ring cache; tests/test_cuda_engine.c checks
 * the CUDA backend's run of it against the CPU's on every architecture fixture. */
#include "model.h"
#include "backend.h"
#include "status.h"

#include <math.h>
#include <string.h>

/* The activations of one batch, carved from one buffer of backend memory (sizes in floats, T rows each):
 *   x    (T, C)    the residual stream
 *   xb   (T, C)    the normed input of a block
 *   q    (T, NH*HS), then k, v (T, NKV*HS) right after it (one token's q, k, v are one row of Q + 2 KV)
 *   att  (T, NH*HS) attention output
 *   gate, up (T, F)
 *   yb   (T, C)    a block's output before its post-norm (sandwich norms)
 *   ag   (T, NH*HS) the attention output gate's logits, only with output_gate */
size_t kiln_llama_act_floats(const kiln_llama_config *c, int64_t T) {
    int64_t Q = c->n_head * c->head_dim, KV = c->n_head_kv * c->head_dim;
    return (size_t)T * (size_t)(3 * c->n_embd + 2 * Q + 2 * KV + 2 * c->n_ff + (c->output_gate ? Q : 0));
}

/* The widest activation row a matmul quantizes: C (q, k, v, gate, up, head), NH*HS (wo) or F (down). */
int64_t kiln_llama_max_width(const kiln_llama_config *c) {
    int64_t w = c->n_embd, Q = c->n_head * c->head_dim;
    if (Q > w) w = Q;
    if (c->n_ff > w) w = c->n_ff;
    return w;
}

/* qkv_post then attention over T rows: the backend's fused step where it has one. */
static kiln_status post_attend(const kiln_backend *be, void *ctx, float *att, float *q, float *k, float *v, const kiln_attn_args *a,
                               const int32_t *pos0, int64_t T) {
    if (be->qkv_attention) return be->qkv_attention(ctx, att, q, k, v, a, pos0, T);
    TRY(be->qkv_post(ctx, q, k, v, a, pos0, T));
    return be->attention(ctx, att, q, a, pos0, T);
}

/* qkv_post and attention of layer l for each segment of b on its rows of q, k, v (T, Q / KV) and att (T, Q), over
 * its sequence's cache. On a backend with seq_rows, the single-row segments that end the batch (its decode tokens)
 * run as one call of each over all their sequences' caches (a launch per layer, not per sequence). */
static kiln_status attend(const kiln_backend *be, void *ctx, const kiln_attn_args *layer, const kiln_llama_batch *b, int64_t l,
                          float *q, float *k, float *v, float *att) {
    const int64_t Q = layer->NH * layer->HS, KV = layer->NKV * layer->HS;
    int64_t s1 = b->n_seg; /* segments s1.. are the rows run together */
    if (be->seq_rows && b->seq)
        while (s1 > 0 && b->seg[s1 - 1].T == 1) s1--;
    int64_t r = 0;
    for (int64_t s = 0; s < s1; r += b->seg[s++].T) {
        const kiln_llama_segment *g = &b->seg[s];
        kiln_attn_args a = *layer;
        a.k_cache = g->kv->k[l], a.v_cache = g->kv->v[l], a.rows = g->kv->rows[l];
        a.type_k = g->kv->type_k, a.type_v = g->kv->type_v;
        TRY(post_attend(be, ctx, att + r * Q, q + r * Q, k + r * KV, v + r * KV, &a, g->pos0, g->T));
    }
    if (s1 == b->n_seg) return KILN_OK;
    kiln_attn_args a = *layer;
    a.k_cache = b->kv0->k[l], a.v_cache = b->kv0->v[l], a.rows = b->kv0->rows[l];
    a.type_k = b->kv0->type_k, a.type_v = b->kv0->type_v;
    a.seq = b->seq + s1, a.seq_stride = b->kv_stride;
    const int64_t n = b->n_seg - s1;
    return post_attend(be, ctx, att + r * Q, q + r * Q, k + r * KV, v + r * KV, &a, b->seg[s1].pos0, n);
}

/* Ids are valid, each segment's *pos0 + T fits every full layer's rows and a sliding layer's ring holds window + T - 1
 * rows for the segment's T (the context checks all three). Each architecture flag (model.h) adds its step where
 * llama.cpp's graph for that architecture has it; the residual adds are folded into the output and down
 * projections, or into the next residual_norm where a sandwich norm comes between. */
kiln_status kiln_llama_forward(const kiln_model *m, const kiln_backend *be, void *ctx, const kiln_weights *w, float *act,
                               const kiln_llama_batch *b, float *logits, int32_t *next, const kiln_llama_checks *checks) {
    const kiln_llama_config *c = &m->cfg;
    int32_t *flag = checks ? checks->flag : NULL; /* backend memory */
    const bool each_layer = flag && checks->layers, check_logits = flag && (checks->logits || checks->layers);
    const int64_t C = c->n_embd, NH = c->n_head, NKV = c->n_head_kv, HS = c->head_dim, F = c->n_ff, V = c->n_vocab;
    const int64_t Q = NH * HS, KV = NKV * HS, T = b->T;
    const int32_t *ids = b->ids; /* (T) backend memory */
    float *x = act;            /* (T, C) */
    float *xb = x + T * C;     /* (T, C) */
    float *q = xb + T * C;     /* (T, Q) */
    float *k = q + T * Q;      /* (T, KV) */
    float *v = k + T * KV;     /* (T, KV) */
    float *att = v + T * KV;   /* (T, Q) */
    float *gate = att + T * Q; /* (T, F) */
    float *up = gate + T * F;  /* (T, F) */
    float *yb = up + T * F;    /* (T, C) */
    float *ag = yb + T * C;    /* (T, Q), with output_gate */

    TRY(be->embed(ctx, x, &w->tok_embd, ids, T, C, c->embd_scale ? sqrtf((float)C) : 1.0f));
    if (each_layer) TRY(be->nonfinite(ctx, flag, x, T * C, KILN_LLAMA_STAGE_EMBED));
    TRY(be->residual_norm(ctx, x, NULL, NULL, 0, xb, c->no_pre_norm ? NULL : &w->layers[0][KILN_LT_ATTN_NORM], c->rms_eps, T, C));
    for (int64_t l = 0; l < c->n_layer; l++) {
        const kiln_llama_layer *L = &m->layers[l];
        const kiln_weight *lw = w->layers[l];
        const kiln_rope rope = kiln_llama_layer_rope(m, l, b->seg[0].kv->n_ctx);
        const kiln_attn_args a = {
            .NH = NH, .NKV = NKV, .HS = HS,
            .bq = c->qkv_bias ? &lw[KILN_LT_BQ] : NULL, .bk = c->qkv_bias ? &lw[KILN_LT_BK] : NULL,
            .bv = c->qkv_bias ? &lw[KILN_LT_BV] : NULL,
            .q_norm = c->qk_norm ? &lw[KILN_LT_Q_NORM] : NULL, .k_norm = c->qk_norm ? &lw[KILN_LT_K_NORM] : NULL,
            .qk_norm_full = c->qk_norm_full,
            .eps = c->rms_eps, .rope_dim = c->rope_dim, .rope_base = L->rope_base > 0 ? L->rope_base : c->rope_base,
            .rope_freq = rope.freq, .rope_mscale = rope.mscale,
            .neox = c->rope_neox, .nope = L->nope,
            .window = L->window, .scale = c->attn_scale, .softcap = c->attn_softcap,
        };
        /* the blocks' pre-norms; NULL without them (olmo2): residual_norm then copies x into xb */
        const kiln_weight *ffn_norm = c->no_pre_norm ? NULL : &lw[KILN_LT_FFN_NORM];

        /* attention block: xb is its normed input. The prefetch hints name the weights of the matmul after the
         * next, so that they are on their way while the small steps between run */
        if (be->prefetch) {
            TRY(be->prefetch(ctx, &lw[KILN_LT_WO], NULL));
            TRY(be->prefetch(ctx, &lw[KILN_LT_W_GATE], &lw[KILN_LT_W_UP]));
        }
        TRY(be->qkv(ctx, q, k, v, xb, &lw[KILN_LT_WQ], &lw[KILN_LT_WK], &lw[KILN_LT_WV], T));
        if (c->output_gate) TRY(be->matmul(ctx, ag, xb, &lw[KILN_LT_ATTN_GATE], T, false));
        TRY(attend(be, ctx, &a, b, l, q, k, v, att));
        if (c->output_gate) TRY(be->sigmoid_mul(ctx, att, ag, T * Q));
        if (be->prefetch) TRY(be->prefetch(ctx, &lw[KILN_LT_W_GATE], &lw[KILN_LT_W_UP]));
        if (c->sandwich_norm) { /* x += rmsnorm(att Wo^T) * post; xb = rmsnorm(x) * ffn_norm */
            TRY(be->matmul(ctx, yb, att, &lw[KILN_LT_WO], T, false));
            TRY(be->residual_norm(ctx, x, yb, &lw[KILN_LT_POST_ATTN_NORM], c->post_norm_eps, xb, ffn_norm, c->rms_eps, T, C));
        } else if (be->matmul_norm && ffn_norm) {
            TRY(be->matmul_norm(ctx, x, att, &lw[KILN_LT_WO], xb, ffn_norm, c->rms_eps, T, C));
        } else {
            TRY(be->matmul(ctx, x, att, &lw[KILN_LT_WO], T, true));
            TRY(be->residual_norm(ctx, x, NULL, NULL, 0, xb, ffn_norm, c->rms_eps, T, C));
        }

        /* feed-forward block: down(act(gate(x)) * up(x)), act silu (SwiGLU) or tanh-GELU (GeGLU); the residual
         * step also norms x for the next layer, or for the head after the last */
        if (be->prefetch) TRY(be->prefetch(ctx, &lw[KILN_LT_W_DOWN], NULL));
        TRY(be->ffn_up(ctx, gate, up, xb, &lw[KILN_LT_W_GATE], &lw[KILN_LT_W_UP], T, c->geglu));
        const kiln_weight *next_norm = l + 1 == c->n_layer ? &w->output_norm
                                     : c->no_pre_norm    ? NULL
                                                         : &w->layers[l + 1][KILN_LT_ATTN_NORM];
        if (be->prefetch) TRY(be->prefetch(ctx, l + 1 < c->n_layer ? &w->layers[l + 1][KILN_LT_WQ] : &w->output, NULL));
        if (c->sandwich_norm) {
            TRY(be->matmul(ctx, yb, gate, &lw[KILN_LT_W_DOWN], T, false));
            TRY(be->residual_norm(ctx, x, yb, &lw[KILN_LT_POST_FFN_NORM], c->post_norm_eps, xb, next_norm, c->rms_eps, T, C));
        } else if (be->matmul_norm && next_norm) {
            TRY(be->matmul_norm(ctx, x, gate, &lw[KILN_LT_W_DOWN], xb, next_norm, c->rms_eps, T, C));
        } else {
            TRY(be->matmul(ctx, x, gate, &lw[KILN_LT_W_DOWN], T, true));
            TRY(be->residual_norm(ctx, x, NULL, NULL, 0, xb, next_norm, c->rms_eps, T, C));
        }
        /* x is the layer's output; a NaN in the next norm's weight shows in the next layer, whose weight it is */
        if (each_layer) TRY(be->nonfinite(ctx, flag, x, T * C, KILN_LLAMA_STAGE_LAYER + (int32_t)l));
    }
    if (!logits || b->n_out == 0) return KILN_OK;
    /* xb holds rmsnorm(x) * output_norm for every row; the head, V x C per row and the largest matmul of a small
     * model, runs only for the rows wanted, one call per run of consecutive rows (one for a session's rows
     * first..T-1, one for a batch of decode tokens) */
    const float scale = c->logit_scale > 0 ? c->logit_scale : 1.0f;
    for (int64_t o = 0, n; o < b->n_out; o += n) {
        for (n = 1; o + n < b->n_out && b->out[o + n] == b->out[o] + n;) n++;
        TRY(be->head(ctx, logits + o * V, xb + b->out[o] * C, &w->output, n, scale, c->logit_softcap));
    }
    if (next)
        for (int64_t o = 0; o < b->n_out; o++)
            TRY(b->sample ? be->sample(ctx, next + o, logits + o * V, V, b->sample + o, b->sample_work)
                          : be->argmax(ctx, next + o, logits + o * V, V));
    /* argmax ignores NaNs and takes an infinity as any other maximum: the rows it read are checked beside it, so a
     * greedy decode on the device fails instead of printing garbage (one pass over V floats a row) */
    if (check_logits) TRY(be->nonfinite(ctx, flag, logits, b->n_out * V, KILN_LLAMA_STAGE_LAYER + (int32_t)c->n_layer));
    return KILN_OK;
}
