/* llama_train.c: the llama model as it trains. Parameters live in one flat fp32 buffer described by a table
 * of GGUF-named tensors; the forward saves what each backward needs (normed inputs and 1/rms, roped q and k,
 * attention output and LSE, gate and up) and the backward walks the layers in reverse, accumulating into one
 * flat gradient buffer of the same layout. Everything runs through the ops table, so the CUDA trainer (#8)
 * reuses this orchestration. tests/test_train.c holds it against tests/ref/train_ref.py (JAX, float64). */
#include "llama_train.h"
#include "quants.h"
#include "status.h"

#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- layout */

static int add_tensor(kiln_llama_train *m, const char *name, int64_t ne0, int64_t ne1, bool decay) {
    kiln_train_tensor *t = &m->tensors[m->n_tensors];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->n_dims = ne1 == 1 ? 1 : 2;
    t->ne[0] = ne0;
    t->ne[1] = ne1;
    t->offset = m->n_params;
    t->n = ne0 * ne1;
    t->decay = decay;
    /* 16-float alignment of every tensor keeps SIMD rows and the 8-bit optimizer blocks tidy */
    m->n_params += (t->n + 15) / 16 * 16;
    return m->n_tensors++;
}

kiln_status kiln_llama_train_new(const kiln_llama_config *cfg_in, bool mixed, kiln_llama_train **out) {
    *out = NULL;
    kiln_llama_config c = *cfg_in;
    if (c.n_vocab <= 0 || c.n_embd <= 0 || c.n_layer <= 0 || c.n_head <= 0 || c.n_head_kv <= 0 || c.n_ff <= 0 ||
        c.n_embd % c.n_head || c.n_head % c.n_head_kv || (c.n_embd / c.n_head) % 2 || c.n_embd > (1 << 16) ||
        c.n_ff > (1 << 18) || c.n_vocab > (1 << 24) || c.n_layer > 1024)
        return kiln_fail(KILN_ERR_INVALID,
                         "model dimensions V=%lld C=%lld L=%lld NH=%lld NKV=%lld F=%lld are invalid (C must divide into NH "
                         "heads of even size, NH into NKV groups)",
                         (long long)c.n_vocab, (long long)c.n_embd, (long long)c.n_layer, (long long)c.n_head,
                         (long long)c.n_head_kv, (long long)c.n_ff);
    /* the training forward is plain llama: refuse, rather than silently drop, what it does not compute */
    const char *feature = c.qkv_bias ? "q/k/v biases" : c.qk_norm ? "QK norm" : c.output_gate ? "the attention output gate"
                        : c.sandwich_norm ? "sandwich norms" : c.geglu ? "GeGLU" : c.embd_scale ? "the embedding scale"
                        : (c.logit_scale != 0 && c.logit_scale != 1) ? "a logit scale" : c.logit_softcap ? "a logit softcap"
                        : c.sliding_window ? "sliding-window attention" : c.attn_scale ? "an attention scale"
                        : (c.head_dim && c.head_dim != c.n_embd / c.n_head) ? "a head size other than C/NH" : NULL;
    if (feature)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "training supports the llama architecture only; this model has %s", feature);
    c.head_dim = c.n_embd / c.n_head;
    c.rope_dim = c.head_dim;
    c.rope_neox = false;
    if (!(c.rope_base > 0)) c.rope_base = 10000.0f;
    if (!(c.rms_eps > 0)) c.rms_eps = 1e-5f;
    if (c.n_ctx_train <= 0) c.n_ctx_train = 2048;

    kiln_llama_train *m = calloc(1, sizeof *m);
    if (!m) return kiln_fail(KILN_ERR_NOMEM, "out of memory for the training model");
    m->cfg = c;
    m->tensors = calloc((size_t)(3 + 9 * c.n_layer), sizeof *m->tensors);
    m->layers = calloc((size_t)c.n_layer, sizeof *m->layers);
    if (!m->tensors || !m->layers) {
        kiln_llama_train_free(m);
        return kiln_fail(KILN_ERR_NOMEM, "out of memory for the training model");
    }
    const int64_t C = c.n_embd, Q = c.n_head * c.head_dim, KV = c.n_head_kv * c.head_dim, F = c.n_ff;
    m->tok_embd = add_tensor(m, "token_embd.weight", C, c.n_vocab, false);
    char name[48];
    for (int64_t l = 0; l < c.n_layer; l++) {
        kiln_train_layer *L = &m->layers[l];
#define T_(field, suffix, ne0, ne1, decay)                                       \
        snprintf(name, sizeof name, "blk.%lld." suffix ".weight", (long long)l); \
        L->field = add_tensor(m, name, ne0, ne1, decay);
        T_(attn_norm, "attn_norm", C, 1, false)
        T_(wq, "attn_q", C, Q, true)
        T_(wk, "attn_k", C, KV, true)
        T_(wv, "attn_v", C, KV, true)
        T_(wo, "attn_output", Q, C, true)
        T_(ffn_norm, "ffn_norm", C, 1, false)
        T_(w_gate, "ffn_gate", C, F, true)
        T_(w_up, "ffn_up", C, F, true)
        T_(w_down, "ffn_down", F, C, true)
#undef T_
    }
    m->output_norm = add_tensor(m, "output_norm.weight", C, 1, false);
    m->output = c.tied ? m->tok_embd : add_tensor(m, "output.weight", C, c.n_vocab, true);

    size_t n = (size_t)m->n_params;
    m->params = calloc(n, sizeof *m->params);
    m->grads = calloc(n, sizeof *m->grads);
    if (mixed) m->mirror = calloc(n, sizeof *m->mirror);
    if (!m->params || !m->grads || (mixed && !m->mirror)) {
        kiln_llama_train_free(m);
        return kiln_fail(KILN_ERR_NOMEM, "out of memory for %lld parameters", (long long)n);
    }
    *out = m;
    return KILN_OK;
}

void kiln_llama_train_free(kiln_llama_train *m) {
    if (!m) return;
    free(m->tensors);
    free(m->layers);
    free(m->params);
    free(m->grads);
    free(m->mirror);
    free(m->acts);
    free(m->dacts);
    free(m->pos);
    free(m->ids);
    free(m->scratch);
    free(m);
}

/* bf16 by round to nearest even; NaN stays a quiet NaN */
static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

void kiln_llama_train_refresh_mirror(kiln_llama_train *m) {
    if (!m->mirror) return;
    for (int64_t i = 0; i < m->n_params; i++) m->mirror[i] = to_bf16(m->params[i]);
}

/* splitmix64 then Box-Muller: a normal deviate per call, reproducible from the seed alone */
static double rng_normal(uint64_t *s) {
    uint64_t a, b;
    double u1, u2;
    do {
        uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        a = z ^ (z >> 31);
        z = (*s += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        b = z ^ (z >> 31);
        u1 = (double)(a >> 11) * 0x1.0p-53;
        u2 = (double)(b >> 11) * 0x1.0p-53;
    } while (u1 <= 0);
    return sqrt(-2 * log(u1)) * cos(2 * M_PI * u2);
}

void kiln_llama_train_init_random(kiln_llama_train *m, uint64_t seed) {
    uint64_t s = seed;
    const double std = 0.02, std_res = 0.02 / sqrt(2.0 * (double)m->cfg.n_layer);
    for (int i = 0; i < m->n_tensors; i++) {
        const kiln_train_tensor *t = &m->tensors[i];
        float *p = m->params + t->offset;
        bool residual = strstr(t->name, "attn_output") || strstr(t->name, "ffn_down");
        for (int64_t j = 0; j < t->n; j++) p[j] = t->n_dims == 1 ? 1.0f : (float)(rng_normal(&s) * (residual ? std_res : std));
    }
    kiln_llama_train_refresh_mirror(m);
}

kiln_status kiln_llama_train_from_model(const kiln_model *src, bool mixed, kiln_llama_train **out) {
    kiln_llama_config c = src->cfg;
    for (int64_t l = 0; l < c.n_layer; l++)
        if (src->layers[l].nope)
            return kiln_fail(KILN_ERR_UNSUPPORTED, "training supports the llama architecture only; layer %lld has no RoPE (NoPE)",
                             (long long)l);
    if (c.rope_dim != c.head_dim || c.rope_neox)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "training supports full-width interleaved RoPE only (this model: rope_dim %lld of %lld%s)",
                         (long long)c.rope_dim, (long long)c.head_dim, c.rope_neox ? ", NeoX layout" : "");
    kiln_llama_train *m;
    kiln_status s = kiln_llama_train_new(&c, mixed, &m);
    if (s) return s;
    for (int i = 0; i < m->n_tensors; i++) {
        const kiln_train_tensor *t = &m->tensors[i];
        const kiln_tensor_view *v = kiln_gguf_find_tensor(src->gguf, t->name);
        if (!v || v->ne[0] != t->ne[0] || v->ne[1] != t->ne[1]) {
            kiln_llama_train_free(m);
            return kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s' is missing or not [%lld, %lld]", kiln_gguf_path(src->gguf), t->name,
                             (long long)t->ne[0], (long long)t->ne[1]);
        }
        kiln_to_float_fn to_float = kiln_get_to_float(v->type, KILN_SIMD_SCALAR);
        if (!to_float) {
            kiln_llama_train_free(m);
            return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: tensor '%s' has type %s, which cannot be dequantized",
                             kiln_gguf_path(src->gguf), t->name, kiln_type_name(v->type));
        }
        for (int64_t r = 0; r < t->ne[1]; r++)
            to_float((const char *)v->data + (size_t)r * v->nb[1], m->params + t->offset + r * t->ne[0], t->ne[0]);
    }
    kiln_llama_train_refresh_mirror(m);
    *out = m;
    return KILN_OK;
}

/* ---------------------------------------------------------------- activations
 * Saved per layer (floats, N = B*T rows each):
 *   x     (N, C)   the layer's residual input
 *   ln1   (N, C)   attn_norm(x); rstd1 (N)
 *   q     (N, Q)   roped queries; k, v (N, KV), k roped
 *   att   (N, Q)   attention output; lse (B, NH, T)
 *   mid   (N, C)   x + wo(att)
 *   ln2   (N, C)   ffn_norm(mid); rstd2 (N)
 *   gate, up, h (N, F)  h = silu(gate) * up
 * then the final residual xL (N, C), lnf (N, C), rstdf (N) and logits (N, V), which the loss turns into
 * dlogits in place. Gradient buffers: dx (N, C) the running residual gradient, dln (N, C), datt (N, Q),
 * dq (N, Q), dk, dv (N, KV), dh, dgate, dup (N, F). */

typedef struct layer_acts {
    float *x, *ln1, *rstd1, *q, *k, *v, *att, *lse, *mid, *ln2, *rstd2, *gate, *up, *h;
} layer_acts;

static int64_t layer_floats(const kiln_llama_config *c, int64_t N) {
    const int64_t C = c->n_embd, Q = c->n_head * c->head_dim, KV = c->n_head_kv * c->head_dim, F = c->n_ff;
    return N * (4 * C + 2 + 2 * Q + 2 * KV + c->n_head + 3 * F);
}

static layer_acts layer_at(const kiln_llama_train *m, int64_t l) {
    const kiln_llama_config *c = &m->cfg;
    const int64_t N = m->B * m->T, C = c->n_embd, Q = c->n_head * c->head_dim, KV = c->n_head_kv * c->head_dim, F = c->n_ff;
    layer_acts a;
    float *p = m->acts + l * layer_floats(c, N);
    a.x = p, p += N * C;
    a.ln1 = p, p += N * C;
    a.rstd1 = p, p += N;
    a.q = p, p += N * Q;
    a.k = p, p += N * KV;
    a.v = p, p += N * KV;
    a.att = p, p += N * Q;
    a.lse = p, p += N * c->n_head;
    a.mid = p, p += N * C;
    a.ln2 = p, p += N * C;
    a.rstd2 = p, p += N;
    a.gate = p, p += N * F;
    a.up = p, p += N * F;
    a.h = p;
    return a;
}

kiln_status kiln_llama_train_reserve(kiln_llama_train *m, int64_t B, int64_t T, int n_threads) {
    const kiln_llama_config *c = &m->cfg;
    if (B <= 0 || T <= 0 || T > c->n_ctx_train || B > (1 << 20))
        return kiln_fail(KILN_ERR_INVALID, "batch B=%lld T=%lld is invalid (T must be 1..%lld, the context length)", (long long)B,
                         (long long)T, (long long)c->n_ctx_train);
    const int64_t N = B * T, C = c->n_embd, Q = c->n_head * c->head_dim, KV = c->n_head_kv * c->head_dim, F = c->n_ff;
    const int64_t V = c->n_vocab;
    double acts = (double)c->n_layer * (double)layer_floats(c, N) + (double)N * (double)(2 * C + 1 + V);
    double dacts = (double)N * (double)(2 * C + 2 * Q + 2 * KV + 3 * F);
    if (acts * 4 > 1e12 || dacts * 4 > 1e12)
        return kiln_fail(KILN_ERR_NOMEM, "activations for B=%lld T=%lld need %.1f GB", (long long)B, (long long)T, (acts + dacts) * 4e-9);
    free(m->acts), free(m->dacts), free(m->pos), free(m->ids), free(m->scratch);
    m->B = B, m->T = T;
    int64_t max_width = kiln_llama_max_width(c);
    m->scratch_bytes = kiln_cpu_ops.train_scratch_size(B, T, max_width, c->n_head, V, n_threads < 1 ? 1 : n_threads);
    m->acts = malloc((size_t)acts * sizeof(float));
    m->dacts = malloc((size_t)dacts * sizeof(float));
    m->pos = malloc((size_t)N * sizeof *m->pos);
    m->ids = malloc((size_t)N * sizeof *m->ids);
    m->scratch = malloc(m->scratch_bytes ? m->scratch_bytes : 1);
    if (!m->acts || !m->dacts || !m->pos || !m->ids || !m->scratch) {
        free(m->acts), free(m->dacts), free(m->pos), free(m->ids), free(m->scratch);
        m->acts = m->dacts = NULL, m->pos = m->ids = NULL, m->scratch = NULL, m->B = m->T = 0;
        return kiln_fail(KILN_ERR_NOMEM, "out of memory for activations of B=%lld T=%lld", (long long)B, (long long)T);
    }
    m->act_bytes = (size_t)(acts + dacts) * sizeof(float) + m->scratch_bytes;
    for (int64_t i = 0; i < N; i++) m->pos[i] = (int32_t)(i % T);
    return KILN_OK;
}

/* ---------------------------------------------------------------- forward, loss, backward */

/* The weights a matmul reads: the bf16 mirror when mixed precision is on, else the master; wtype says which. */
static const void *weight(const kiln_llama_train *m, int idx) {
    const kiln_train_tensor *t = &m->tensors[idx];
    return m->mirror ? (const void *)(m->mirror + t->offset) : (const void *)(m->params + t->offset);
}

static kiln_type wtype(const kiln_llama_train *m) { return m->mirror ? KILN_TYPE_BF16 : KILN_TYPE_F32; }

static void add_into(float *x, const float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] += y[i];
}

static float *final_x(const kiln_llama_train *m) {
    return m->acts + m->cfg.n_layer * layer_floats(&m->cfg, m->B * m->T);
}

static void forward(kiln_llama_train *m, const kiln_ops *ops, kiln_ops_ctx *ctx, const int32_t *inputs) {
    const kiln_llama_config *c = &m->cfg;
    const int64_t B = m->B, T = m->T, N = B * T, C = c->n_embd, NH = c->n_head, NKV = c->n_head_kv, HS = c->head_dim;
    const int64_t Q = NH * HS, KV = NKV * HS, F = c->n_ff, V = c->n_vocab;
    const kiln_type wt = wtype(m);
    memcpy(m->ids, inputs, (size_t)N * sizeof *inputs);

    /* the embedding, through the same gather inference uses (a row per token, from the mirror when mixed) */
    const kiln_train_tensor *te = &m->tensors[m->tok_embd];
    const void *emb = weight(m, m->tok_embd);
    size_t row = kiln_type_row_bytes(wt, C);
    kiln_tensor_view table = {.name = te->name, .type = wt, .n_dims = 2, .ne = {C, V, 1, 1},
                              .nb = {kiln_type_block_bytes(wt), row, row * (size_t)V, row * (size_t)V},
                              .nbytes = row * (size_t)V, .data = emb};
    layer_acts a0 = layer_at(m, 0);
    ops->embed_forward(ctx, a0.x, &table, inputs, N);

    for (int64_t l = 0; l < c->n_layer; l++) {
        const kiln_train_layer *w = &m->layers[l];
        layer_acts a = layer_at(m, l);
        float *x_next = l + 1 < c->n_layer ? layer_at(m, l + 1).x : final_x(m);

        ops->rmsnorm_forward_train(ctx, a.ln1, a.rstd1, a.x, m->params + m->tensors[w->attn_norm].offset, N, C, c->rms_eps);
        ops->dense_forward(ctx, a.q, a.ln1, weight(m, w->wq), wt, N, C, Q);
        ops->dense_forward(ctx, a.k, a.ln1, weight(m, w->wk), wt, N, C, KV);
        ops->dense_forward(ctx, a.v, a.ln1, weight(m, w->wv), wt, N, C, KV);
        ops->rope_forward(ctx, a.q, m->pos, N, NH, HS, c->rope_dim, c->rope_base, c->rope_neox);
        ops->rope_forward(ctx, a.k, m->pos, N, NKV, HS, c->rope_dim, c->rope_base, c->rope_neox);
        ops->attention_forward_train(ctx, a.att, a.lse, a.q, a.k, a.v, B, T, NH, NKV, HS);
        ops->dense_forward(ctx, a.mid, a.att, weight(m, w->wo), wt, N, Q, C);
        add_into(a.mid, a.x, N * C);

        ops->rmsnorm_forward_train(ctx, a.ln2, a.rstd2, a.mid, m->params + m->tensors[w->ffn_norm].offset, N, C, c->rms_eps);
        ops->dense_forward(ctx, a.gate, a.ln2, weight(m, w->w_gate), wt, N, C, F);
        ops->dense_forward(ctx, a.up, a.ln2, weight(m, w->w_up), wt, N, C, F);
        ops->swiglu_forward(ctx, a.h, a.gate, a.up, N * F);
        ops->dense_forward(ctx, x_next, a.h, weight(m, w->w_down), wt, N, F, C);
        add_into(x_next, a.mid, N * C);
    }
    float *xL = final_x(m), *lnf = xL + N * C, *rstdf = lnf + N * C, *logits = rstdf + N;
    ops->rmsnorm_forward_train(ctx, lnf, rstdf, xL, m->params + m->tensors[m->output_norm].offset, N, C, c->rms_eps);
    ops->dense_forward(ctx, logits, lnf, weight(m, m->output), wt, N, C, V);
}

static void backward(kiln_llama_train *m, const kiln_ops *ops, kiln_ops_ctx *ctx) {
    const kiln_llama_config *c = &m->cfg;
    const int64_t B = m->B, T = m->T, N = B * T, C = c->n_embd, NH = c->n_head, NKV = c->n_head_kv, HS = c->head_dim;
    const int64_t Q = NH * HS, KV = NKV * HS, F = c->n_ff, V = c->n_vocab;
    const kiln_type wt = wtype(m);
    float *dx = m->dacts, *dln = dx + N * C, *datt = dln + N * C, *dq = datt + N * Q, *dk = dq + N * Q, *dv = dk + N * KV;
    float *dh = dv + N * KV, *dgate = dh + N * F, *dup = dgate + N * F;
    float *xL = final_x(m), *lnf = xL + N * C, *rstdf = lnf + N * C, *dlogits = rstdf + N;
#define G(idx) (m->grads + m->tensors[idx].offset)
#define P(idx) (m->params + m->tensors[idx].offset)

    memset(dln, 0, (size_t)(N * C) * sizeof *dln);
    ops->dense_backward(ctx, dln, G(m->output), dlogits, lnf, weight(m, m->output), wt, N, C, V);
    memset(dx, 0, (size_t)(N * C) * sizeof *dx);
    ops->rmsnorm_backward(ctx, dx, G(m->output_norm), dln, xL, P(m->output_norm), rstdf, N, C);

    for (int64_t l = c->n_layer - 1; l >= 0; l--) {
        const kiln_train_layer *w = &m->layers[l];
        layer_acts a = layer_at(m, l);
        /* feed-forward block: x_next = mid + down(h); dx holds d x_next, which is also d mid's direct part */
        memset(dh, 0, (size_t)(N * F) * sizeof *dh);
        ops->dense_backward(ctx, dh, G(w->w_down), dx, a.h, weight(m, w->w_down), wt, N, F, C);
        memset(dgate, 0, (size_t)(2 * N * F) * sizeof *dgate); /* dgate and dup */
        ops->swiglu_backward(ctx, dgate, dup, dh, a.gate, a.up, N * F);
        memset(dln, 0, (size_t)(N * C) * sizeof *dln);
        ops->dense_backward(ctx, dln, G(w->w_gate), dgate, a.ln2, weight(m, w->w_gate), wt, N, C, F);
        ops->dense_backward(ctx, dln, G(w->w_up), dup, a.ln2, weight(m, w->w_up), wt, N, C, F);
        ops->rmsnorm_backward(ctx, dx, G(w->ffn_norm), dln, a.mid, P(w->ffn_norm), a.rstd2, N, C);

        /* attention block: mid = x + wo(att); dx now holds d mid */
        memset(datt, 0, (size_t)(N * Q) * sizeof *datt);
        ops->dense_backward(ctx, datt, G(w->wo), dx, a.att, weight(m, w->wo), wt, N, Q, C);
        memset(dq, 0, (size_t)(N * (Q + 2 * KV)) * sizeof *dq); /* dq, dk, dv */
        ops->attention_backward(ctx, dq, dk, dv, datt, a.q, a.k, a.v, a.att, a.lse, B, T, NH, NKV, HS);
        ops->rope_backward(ctx, dq, m->pos, N, NH, HS, c->rope_dim, c->rope_base, c->rope_neox);
        ops->rope_backward(ctx, dk, m->pos, N, NKV, HS, c->rope_dim, c->rope_base, c->rope_neox);
        memset(dln, 0, (size_t)(N * C) * sizeof *dln);
        ops->dense_backward(ctx, dln, G(w->wq), dq, a.ln1, weight(m, w->wq), wt, N, C, Q);
        ops->dense_backward(ctx, dln, G(w->wk), dk, a.ln1, weight(m, w->wk), wt, N, C, KV);
        ops->dense_backward(ctx, dln, G(w->wv), dv, a.ln1, weight(m, w->wv), wt, N, C, KV);
        ops->rmsnorm_backward(ctx, dx, G(w->attn_norm), dln, a.x, P(w->attn_norm), a.rstd1, N, C);
    }
    m->n_embed_skipped += ops->embed_backward(ctx, G(m->tok_embd), dx, m->ids, N, C);
#undef G
#undef P
}

int64_t kiln_count_targets(const int32_t *targets, int64_t n) {
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++) k += targets[i] != -1;
    return k;
}

double kiln_llama_train_step(kiln_llama_train *m, const kiln_ops *ops, kiln_pool *pool, const int32_t *inputs,
                             const int32_t *targets, float grad_scale, int64_t *n_counted) {
    assert(m->acts && "kiln_llama_train_reserve first");
    kiln_ops_ctx ctx = {.pool = pool, .scratch = m->scratch, .scratch_bytes = m->scratch_bytes};
    const int64_t N = m->B * m->T, V = m->cfg.n_vocab;
    forward(m, ops, &ctx, inputs);
    float *xL = final_x(m), *logits = xL + 2 * N * m->cfg.n_embd + N;
    double loss = ops->cross_entropy(&ctx, logits, NULL, targets, N, V, m->label_smoothing, m->z_loss, -1, grad_scale, n_counted);
    if (grad_scale != 0) backward(m, ops, &ctx);
    return loss;
}

const float *kiln_llama_train_logits(kiln_llama_train *m, const kiln_ops *ops, kiln_pool *pool, const int32_t *inputs) {
    assert(m->acts && "kiln_llama_train_reserve first");
    kiln_ops_ctx ctx = {.pool = pool, .scratch = m->scratch, .scratch_bytes = m->scratch_bytes};
    forward(m, ops, &ctx, inputs);
    const int64_t N = m->B * m->T;
    return final_x(m) + 2 * N * m->cfg.n_embd + N;
}
