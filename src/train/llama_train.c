/* llama_train.c: the llama model as it trains on the CPU. Parameters live in one flat fp32 buffer described by a
 * table of GGUF-named tensors (built from model.h's kiln_layer_tensors); the forward saves what each backward needs
 * (normed inputs and 1/rms, roped q and k, attention output and LSE, gate and up) and the backward walks the layers
 * in reverse, accumulating into one flat gradient buffer of the same layout. Everything runs through the ops table.
 * This is the CPU's orchestration: the GPU trainer (src/cuda/trainer.cu) keeps its own, as llm.c keeps
 * train_gpt2.cu beside train_gpt2.c, because it fuses steps (the residual add into the next norm, q|k|v and
 * gate|up into one matmul each, the classifier in chunks) and keeps bf16 activations; tests/test_cuda_train.c holds
 * the two against each other. tests/test_train.c holds this one against tests/ref/train_ref.py (JAX, float64). */
#include "train/llama_train.h"
#include "quants.h"
#include "status.h"

#include <assert.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- layout */

_Static_assert(offsetof(kiln_train_layer, w_down) == offsetof(kiln_train_layer, t[KILN_LT_W_DOWN]) &&
                   offsetof(kiln_train_layer, post_ffn_norm) == offsetof(kiln_train_layer, t[KILN_LT_POST_FFN_NORM]),
               "kiln_train_layer's fields follow kiln_layer_tensor");

static int add_tensor(kiln_llama_train *m, const char *name, int64_t ne0, int64_t ne1, bool decay, bool residual) {
    kiln_train_tensor *t = &m->tensors[m->n_tensors];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->n_dims = ne1 == 1 ? 1 : 2;
    t->ne[0] = ne0;
    t->ne[1] = ne1;
    t->offset = m->n_params;
    t->n = ne0 * ne1;
    t->decay = decay;
    t->residual = residual;
    /* 16-float alignment of every tensor keeps SIMD rows and the 8-bit optimizer blocks tidy */
    m->n_params += (t->n + 15) / 16 * 16;
    return m->n_tensors++;
}

/* Training computes the plain llama layer: the table's tensors every llama layer has (the pre-norms included). */
static bool trained(kiln_layer_tensor i) {
    return kiln_layer_tensors[i].need == KILN_NEED_ALWAYS || kiln_layer_tensors[i].need == KILN_NEED_PRE_NORM;
}

kiln_status kiln_llama_train_layout(const kiln_llama_config *cfg_in, kiln_llama_train **out) {
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
                        : c.attn_softcap ? "an attention softcap" : c.no_pre_norm ? "no pre-norms (post-norms only)"
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
    kiln_status rs = kiln_rope_config_table(&c, &m->rope_freq, &m->rope_mscale);
    if (rs) {
        free(m);
        return rs;
    }
    int per_layer = 0;
    for (int i = 0; i < KILN_LT_COUNT; i++) per_layer += trained((kiln_layer_tensor)i);
    m->tensors = calloc((size_t)(3 + per_layer * c.n_layer), sizeof *m->tensors);
    m->layers = calloc((size_t)c.n_layer, sizeof *m->layers);
    if (!m->tensors || !m->layers) {
        kiln_llama_train_free(m);
        return kiln_fail(KILN_ERR_NOMEM, "out of memory for the training model");
    }
    /* the order (embedding, each layer's tensors in the table's order, output norm, output) fixes the offsets that
     * checkpoints and tests/ref/train_ref.gguf hold */
    const int64_t C = c.n_embd;
    m->tok_embd = add_tensor(m, "token_embd.weight", C, c.n_vocab, false, false);
    char name[64];
    for (int64_t l = 0; l < c.n_layer; l++)
        for (int i = 0; i < KILN_LT_COUNT; i++) {
            const kiln_tensor_spec *ts = &kiln_layer_tensors[i];
            m->layers[l].t[i] = !trained((kiln_layer_tensor)i) ? -1
                              : add_tensor(m, kiln_layer_tensor_name(name, sizeof name, l, (kiln_layer_tensor)i),
                                           kiln_dim_size(&c, ts->ne0), kiln_dim_size(&c, ts->ne1), ts->decay, ts->residual);
        }
    m->output_norm = add_tensor(m, "output_norm.weight", C, 1, false, false);
    m->output = c.tied ? m->tok_embd : add_tensor(m, "output.weight", C, c.n_vocab, true, false);
    *out = m;
    return KILN_OK;
}

kiln_status kiln_llama_train_new(const kiln_llama_config *cfg, bool mixed, kiln_llama_train **out) {
    kiln_llama_train *m;
    kiln_status s = kiln_llama_train_layout(cfg, &m);
    if (s) return s;
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
    free(m->rope_freq);
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

/* Elements [j0, j0 + n) of tensor t's init into dst, drawing from the one generator *s that runs through every
 * tensor in order (so chunks do not change the values). */
static void fill_random(const kiln_llama_train *m, const kiln_train_tensor *t, uint64_t *s, int64_t n, float *dst) {
    const double std = 0.02, std_res = 0.02 / sqrt(2.0 * (double)m->cfg.n_layer);
    for (int64_t j = 0; j < n; j++) dst[j] = t->n_dims == 1 ? 1.0f : (float)(rng_normal(s) * (t->residual ? std_res : std));
}

kiln_status kiln_llama_train_stream_random(const kiln_llama_train *m, uint64_t seed, kiln_param_sink sink, void *ctx) {
    float *buf = malloc(KILN_TRAIN_CHUNK * sizeof *buf);
    if (!buf) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    uint64_t s = seed;
    kiln_status st = KILN_OK;
    for (int i = 0; i < m->n_tensors && !st; i++) {
        const kiln_train_tensor *t = &m->tensors[i];
        for (int64_t j0 = 0; j0 < t->n && !st; j0 += KILN_TRAIN_CHUNK) {
            const int64_t n = t->n - j0 < KILN_TRAIN_CHUNK ? t->n - j0 : KILN_TRAIN_CHUNK;
            fill_random(m, t, &s, n, buf);
            st = sink(ctx, t->offset + j0, buf, n);
        }
    }
    free(buf);
    return st;
}

static kiln_status to_params(void *ctx, int64_t offset, const float *x, int64_t n) {
    memcpy((float *)ctx + offset, x, (size_t)n * sizeof *x);
    return KILN_OK;
}

void kiln_llama_train_init_random(kiln_llama_train *m, uint64_t seed) {
    uint64_t s = seed;
    for (int i = 0; i < m->n_tensors; i++) fill_random(m, &m->tensors[i], &s, m->tensors[i].n, m->params + m->tensors[i].offset);
    kiln_llama_train_refresh_mirror(m);
}

kiln_status kiln_llama_train_check_model(const kiln_model *src, kiln_llama_config *cfg) {
    const kiln_llama_config c = src->cfg;
    for (int64_t l = 0; l < c.n_layer; l++)
        if (src->layers[l].nope)
            return kiln_fail(KILN_ERR_UNSUPPORTED, "training supports the llama architecture only; layer %lld has no RoPE (NoPE)",
                             (long long)l);
    if (c.rope_dim != c.head_dim || c.rope_neox)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "training supports full-width interleaved RoPE only (this model: rope_dim %lld of %lld%s)",
                         (long long)c.rope_dim, (long long)c.head_dim, c.rope_neox ? ", NeoX layout" : "");
    /* the trainer's table comes from the config alone: frequency-factor tensors would be lost in training and export */
    static const char *const factors[] = {"rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"};
    for (size_t i = 0; i < sizeof factors / sizeof factors[0]; i++)
        if (kiln_gguf_find_tensor(src->gguf, factors[i]))
            return kiln_fail(KILN_ERR_UNSUPPORTED, "training does not support RoPE frequency-factor tensors (%s)", factors[i]);
    *cfg = c;
    return KILN_OK;
}

kiln_status kiln_llama_train_stream_model(const kiln_llama_train *m, const kiln_model *src, kiln_param_sink sink, void *ctx) {
    float *buf = NULL;
    kiln_status s = KILN_OK;
    for (int i = 0; i < m->n_tensors && !s; i++) {
        const kiln_train_tensor *t = &m->tensors[i];
        const kiln_tensor_view *v = kiln_gguf_find_tensor(src->gguf, t->name);
        if (!v || v->ne[0] != t->ne[0] || v->ne[1] != t->ne[1]) {
            s = kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s' is missing or not [%lld, %lld]", kiln_gguf_path(src->gguf), t->name,
                          (long long)t->ne[0], (long long)t->ne[1]);
            break;
        }
        if (v->type == KILN_TYPE_F32 && v->nb[1] == (size_t)t->ne[0] * sizeof(float)) { /* rows back to back: as it is */
            s = sink(ctx, t->offset, v->data, t->n);
            continue;
        }
        kiln_to_float_fn to_float = kiln_get_to_float(v->type, KILN_SIMD_SCALAR);
        if (!to_float) {
            s = kiln_fail(KILN_ERR_UNSUPPORTED, "%s: tensor '%s' has type %s, which cannot be dequantized", kiln_gguf_path(src->gguf),
                          t->name, kiln_type_name(v->type));
            break;
        }
        if (!buf && !(buf = malloc(KILN_TRAIN_CHUNK * sizeof *buf))) {
            s = kiln_fail(KILN_ERR_NOMEM, "out of memory");
            break;
        }
        const int64_t rows = KILN_TRAIN_CHUNK / t->ne[0]; /* >= 1: rows are at most C or F wide, under 2^20 */
        for (int64_t r0 = 0; r0 < t->ne[1] && !s; r0 += rows) {
            const int64_t n = t->ne[1] - r0 < rows ? t->ne[1] - r0 : rows;
            for (int64_t r = 0; r < n; r++) to_float((const char *)v->data + (size_t)(r0 + r) * v->nb[1], buf + r * t->ne[0], t->ne[0]);
            s = sink(ctx, t->offset + r0 * t->ne[0], buf, n * t->ne[0]);
        }
    }
    free(buf);
    return s;
}

kiln_status kiln_llama_train_from_model(const kiln_model *src, bool mixed, kiln_llama_train **out) {
    *out = NULL;
    kiln_llama_config c;
    kiln_llama_train *m;
    kiln_status s = kiln_llama_train_check_model(src, &c);
    if (s || (s = kiln_llama_train_new(&c, mixed, &m))) return s;
    if ((s = kiln_llama_train_stream_model(m, src, to_params, m->params))) {
        kiln_llama_train_free(m);
        return s;
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

/* Tensor idx's fp32 master weights and its gradient. */
static const float *param(const kiln_llama_train *m, int idx) { return m->params + m->tensors[idx].offset; }
static float *grad(const kiln_llama_train *m, int idx) { return m->grads + m->tensors[idx].offset; }

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

        ops->rmsnorm_forward_train(ctx, a.ln1, a.rstd1, a.x, param(m, w->attn_norm), N, C, c->rms_eps);
        ops->dense_forward(ctx, a.q, a.ln1, weight(m, w->wq), wt, N, C, Q);
        ops->dense_forward(ctx, a.k, a.ln1, weight(m, w->wk), wt, N, C, KV);
        ops->dense_forward(ctx, a.v, a.ln1, weight(m, w->wv), wt, N, C, KV);
        ops->rope_forward(ctx, a.q, m->pos, N, NH, HS, c->rope_dim, c->rope_base, m->rope_freq, m->rope_mscale, c->rope_neox);
        ops->rope_forward(ctx, a.k, m->pos, N, NKV, HS, c->rope_dim, c->rope_base, m->rope_freq, m->rope_mscale, c->rope_neox);
        ops->attention_forward_train(ctx, a.att, a.lse, a.q, a.k, a.v, B, T, NH, NKV, HS);
        ops->dense_forward(ctx, a.mid, a.att, weight(m, w->wo), wt, N, Q, C);
        add_into(a.mid, a.x, N * C);

        ops->rmsnorm_forward_train(ctx, a.ln2, a.rstd2, a.mid, param(m, w->ffn_norm), N, C, c->rms_eps);
        ops->dense_forward(ctx, a.gate, a.ln2, weight(m, w->w_gate), wt, N, C, F);
        ops->dense_forward(ctx, a.up, a.ln2, weight(m, w->w_up), wt, N, C, F);
        ops->swiglu_forward(ctx, a.h, a.gate, a.up, N * F);
        ops->dense_forward(ctx, x_next, a.h, weight(m, w->w_down), wt, N, F, C);
        add_into(x_next, a.mid, N * C);
    }
    float *xL = final_x(m), *lnf = xL + N * C, *rstdf = lnf + N * C, *logits = rstdf + N;
    ops->rmsnorm_forward_train(ctx, lnf, rstdf, xL, param(m, m->output_norm), N, C, c->rms_eps);
    ops->dense_forward(ctx, logits, lnf, weight(m, m->output), wt, N, C, V);
}

/* The ops' backwards accumulate into every gradient they write (src/cpu/ops.h), so each activation gradient is
 * zeroed right before the ops that build it: the step overwrites them, and adds into the parameter gradients only
 * (src/train/trainer.h's convention). */
static void backward(kiln_llama_train *m, const kiln_ops *ops, kiln_ops_ctx *ctx) {
    const kiln_llama_config *c = &m->cfg;
    const int64_t B = m->B, T = m->T, N = B * T, C = c->n_embd, NH = c->n_head, NKV = c->n_head_kv, HS = c->head_dim;
    const int64_t Q = NH * HS, KV = NKV * HS, F = c->n_ff, V = c->n_vocab;
    const kiln_type wt = wtype(m);
    float *dx = m->dacts, *dln = dx + N * C, *datt = dln + N * C, *dq = datt + N * Q, *dk = dq + N * Q, *dv = dk + N * KV;
    float *dh = dv + N * KV, *dgate = dh + N * F, *dup = dgate + N * F;
    float *xL = final_x(m), *lnf = xL + N * C, *rstdf = lnf + N * C, *dlogits = rstdf + N;

    memset(dln, 0, (size_t)(N * C) * sizeof *dln);
    ops->dense_backward(ctx, dln, grad(m, m->output), dlogits, lnf, weight(m, m->output), wt, N, C, V);
    memset(dx, 0, (size_t)(N * C) * sizeof *dx);
    ops->rmsnorm_backward(ctx, dx, grad(m, m->output_norm), dln, xL, param(m, m->output_norm), rstdf, N, C);

    for (int64_t l = c->n_layer - 1; l >= 0; l--) {
        const kiln_train_layer *w = &m->layers[l];
        layer_acts a = layer_at(m, l);
        /* feed-forward block: x_next = mid + down(h); dx holds d x_next, which is also d mid's direct part */
        memset(dh, 0, (size_t)(N * F) * sizeof *dh);
        ops->dense_backward(ctx, dh, grad(m, w->w_down), dx, a.h, weight(m, w->w_down), wt, N, F, C);
        memset(dgate, 0, (size_t)(2 * N * F) * sizeof *dgate); /* dgate and dup */
        ops->swiglu_backward(ctx, dgate, dup, dh, a.gate, a.up, N * F);
        memset(dln, 0, (size_t)(N * C) * sizeof *dln);
        ops->dense_backward(ctx, dln, grad(m, w->w_gate), dgate, a.ln2, weight(m, w->w_gate), wt, N, C, F);
        ops->dense_backward(ctx, dln, grad(m, w->w_up), dup, a.ln2, weight(m, w->w_up), wt, N, C, F);
        ops->rmsnorm_backward(ctx, dx, grad(m, w->ffn_norm), dln, a.mid, param(m, w->ffn_norm), a.rstd2, N, C);

        /* attention block: mid = x + wo(att); dx now holds d mid */
        memset(datt, 0, (size_t)(N * Q) * sizeof *datt);
        ops->dense_backward(ctx, datt, grad(m, w->wo), dx, a.att, weight(m, w->wo), wt, N, Q, C);
        memset(dq, 0, (size_t)(N * (Q + 2 * KV)) * sizeof *dq); /* dq, dk, dv */
        ops->attention_backward(ctx, dq, dk, dv, datt, a.q, a.k, a.v, a.att, a.lse, B, T, NH, NKV, HS);
        ops->rope_backward(ctx, dq, m->pos, N, NH, HS, c->rope_dim, c->rope_base, m->rope_freq, m->rope_mscale, c->rope_neox);
        ops->rope_backward(ctx, dk, m->pos, N, NKV, HS, c->rope_dim, c->rope_base, m->rope_freq, m->rope_mscale, c->rope_neox);
        memset(dln, 0, (size_t)(N * C) * sizeof *dln);
        ops->dense_backward(ctx, dln, grad(m, w->wq), dq, a.ln1, weight(m, w->wq), wt, N, C, Q);
        ops->dense_backward(ctx, dln, grad(m, w->wk), dk, a.ln1, weight(m, w->wk), wt, N, C, KV);
        ops->dense_backward(ctx, dln, grad(m, w->wv), dv, a.ln1, weight(m, w->wv), wt, N, C, KV);
        ops->rmsnorm_backward(ctx, dx, grad(m, w->attn_norm), dln, a.x, param(m, w->attn_norm), a.rstd1, N, C);
    }
    m->n_embed_skipped += ops->embed_backward(ctx, grad(m, m->tok_embd), dx, m->ids, N, C);
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
