/* model.c: loading a llama-architecture GGUF into a kiln_model: the config from metadata (required keys are
 * errors naming the key when absent; optional keys take llama.cpp's defaults) and weight views bound by name
 * with their shapes and types checked. tests/test_model.c covers each rejection. */
#include "model.h"
#include "quants.h"
#include "status.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static kiln_status get_dim(const kiln_gguf *g, const char *key, int64_t *out) {
    int64_t v;
    kiln_status s = kiln_gguf_get_i64(g, key, &v);
    if (s) return s;
    if (v <= 0 || v > (1LL << 31))
        return kiln_fail(KILN_ERR_FORMAT, "%s: key '%s' is %lld, outside 1..2^31", kiln_gguf_path(g), key, (long long)v);
    *out = v;
    return KILN_OK;
}

static kiln_status opt_dim(const kiln_gguf *g, const char *key, int64_t *out) {
    return kiln_gguf_find(g, key) ? get_dim(g, key, out) : KILN_OK;
}

static kiln_status opt_f32(const kiln_gguf *g, const char *key, float *out) {
    return kiln_gguf_find(g, key) ? kiln_gguf_get_f32(g, key, out) : KILN_OK;
}

static kiln_status read_config(const kiln_gguf *g, kiln_llama_config *c) {
    const char *path = kiln_gguf_path(g);
    kiln_str arch;
    kiln_status s = kiln_gguf_get_str(g, "general.architecture", &arch);
    if (s) return s;
    if (arch.len != 5 || memcmp(arch.ptr, "llama", 5) != 0)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: architecture '%.*s' is not supported (kiln runs llama)", path,
                         (int)(arch.len > 32 ? 32 : arch.len), arch.ptr);
    memset(c, 0, sizeof *c);
    if ((s = get_dim(g, "llama.embedding_length", &c->n_embd)) || (s = get_dim(g, "llama.block_count", &c->n_layer)) ||
        (s = get_dim(g, "llama.attention.head_count", &c->n_head)) || (s = get_dim(g, "llama.feed_forward_length", &c->n_ff)))
        return s;
    c->n_head_kv = c->n_head;
    c->n_ctx_train = 2048;
    c->rope_base = 10000.0f;
    c->rms_eps = 1e-5f;
    if ((s = opt_dim(g, "llama.attention.head_count_kv", &c->n_head_kv)) || (s = opt_dim(g, "llama.context_length", &c->n_ctx_train)) ||
        (s = opt_f32(g, "llama.rope.freq_base", &c->rope_base)) ||
        (s = opt_f32(g, "llama.attention.layer_norm_rms_epsilon", &c->rms_eps)))
        return s;
    if (c->n_embd % c->n_head || c->n_head % c->n_head_kv)
        return kiln_fail(KILN_ERR_FORMAT, "%s: embedding_length %lld, head_count %lld and head_count_kv %lld do not divide", path,
                         (long long)c->n_embd, (long long)c->n_head, (long long)c->n_head_kv);
    c->head_dim = c->n_embd / c->n_head;
    c->rope_dim = c->head_dim;
    if ((s = opt_dim(g, "llama.rope.dimension_count", &c->rope_dim))) return s;
    if (c->rope_dim > c->head_dim || c->rope_dim % 2)
        return kiln_fail(KILN_ERR_FORMAT, "%s: rope.dimension_count %lld must be even and at most the head size %lld", path,
                         (long long)c->rope_dim, (long long)c->head_dim);
    if (!(c->rms_eps > 0) || !(c->rope_base > 0))
        return kiln_fail(KILN_ERR_FORMAT, "%s: layer_norm_rms_epsilon and rope.freq_base must be positive", path);
    return KILN_OK;
}

/* Binds a weight: present, the expected shape, and a type kiln can compute with (1-D norms must be F32). */
static kiln_status bind(const kiln_gguf *g, const char *name, int64_t ne0, int64_t ne1, const kiln_tensor_view **out) {
    const kiln_tensor_view *t = kiln_gguf_find_tensor(g, name);
    const char *path = kiln_gguf_path(g);
    if (!t) return kiln_fail(KILN_ERR_NOT_FOUND, "%s: missing tensor '%s'", path, name);
    if (t->ne[0] != ne0 || t->ne[1] != ne1 || t->ne[2] != 1 || t->ne[3] != 1 || t->n_dims != (ne1 == 1 ? 1 : 2))
        return kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s' has shape [%lld, %lld, %lld, %lld], expected [%lld, %lld]", path, name,
                         (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3], (long long)ne0,
                         (long long)ne1);
    const kiln_type_traits *tt = kiln_type_traits_get(t->type);
    if (ne1 == 1 && t->type != KILN_TYPE_F32)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: tensor '%s' is %s, expected f32", path, name, kiln_type_name(t->type));
    if (!tt || !tt->computable || !tt->vec_dot[KILN_SIMD_SCALAR])
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: tensor '%s' has type %s, which kiln cannot compute with", path, name,
                         kiln_type_name(t->type));
    *out = t;
    return KILN_OK;
}

static kiln_status bind_layers(kiln_model *m) {
    const kiln_gguf *g = m->gguf;
    const kiln_llama_config *c = &m->cfg;
    int64_t C = c->n_embd, F = c->n_ff, Q = c->n_head * c->head_dim, KV = c->n_head_kv * c->head_dim;
    char name[96];
    kiln_status s = KILN_OK;
#define BIND(field, suffix, ne0, ne1)                                               \
    if (!s) {                                                                       \
        snprintf(name, sizeof name, "blk.%lld." suffix, (long long)l);              \
        s = bind(g, name, ne0, ne1, &layer->field);                                 \
    }
    for (int64_t l = 0; l < c->n_layer && !s; l++) {
        kiln_llama_layer *layer = &m->layers[l];
        BIND(attn_norm, "attn_norm.weight", C, 1)
        BIND(wq, "attn_q.weight", C, Q)
        BIND(wk, "attn_k.weight", C, KV)
        BIND(wv, "attn_v.weight", C, KV)
        BIND(wo, "attn_output.weight", Q, C)
        BIND(ffn_norm, "ffn_norm.weight", C, 1)
        BIND(w_gate, "ffn_gate.weight", C, F)
        BIND(w_up, "ffn_up.weight", C, F)
        BIND(w_down, "ffn_down.weight", F, C)
    }
#undef BIND
    return s;
}

kiln_status kiln_model_load(const char *path, kiln_model **out) {
    *out = NULL;
    kiln_model *m = calloc(1, sizeof *m);
    if (!m) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    kiln_status s = kiln_gguf_open(path, &m->gguf);
    if (!s) s = read_config(m->gguf, &m->cfg);
    kiln_llama_config *c = &m->cfg;
    if (!s) {
        const kiln_tensor_view *emb = kiln_gguf_find_tensor(m->gguf, "token_embd.weight");
        if (!emb) s = kiln_fail(KILN_ERR_NOT_FOUND, "%s: missing tensor 'token_embd.weight'", path);
        else c->n_vocab = emb->ne[1];
    }
    if (!s && kiln_gguf_find(m->gguf, "llama.vocab_size")) {
        int64_t v;
        if (!(s = get_dim(m->gguf, "llama.vocab_size", &v)) && v != c->n_vocab)
            s = kiln_fail(KILN_ERR_FORMAT, "%s: llama.vocab_size %lld but token_embd.weight has %lld rows", path, (long long)v,
                          (long long)c->n_vocab);
    }
    if (!s) s = bind(m->gguf, "token_embd.weight", c->n_embd, c->n_vocab, &m->tok_embd);
    if (!s) s = bind(m->gguf, "output_norm.weight", c->n_embd, 1, &m->output_norm);
    if (!s) {
        c->tied = kiln_gguf_find_tensor(m->gguf, "output.weight") == NULL;
        m->output = m->tok_embd;
        if (!c->tied) s = bind(m->gguf, "output.weight", c->n_embd, c->n_vocab, &m->output);
    }
    if (!s && !(m->layers = calloc((size_t)c->n_layer, sizeof *m->layers))) s = kiln_fail(KILN_ERR_NOMEM, "out of memory");
    if (!s) s = bind_layers(m);
    if (!s && kiln_gguf_find(m->gguf, "tokenizer.ggml.model")) {
        s = kiln_tokenizer_load_gguf(m->gguf, &m->tokenizer);
        if (!s && kiln_tokenizer_n_vocab(m->tokenizer) > c->n_vocab)
            s = kiln_fail(KILN_ERR_FORMAT, "%s: the tokenizer has %d tokens but the model only %lld rows of embeddings", path,
                          kiln_tokenizer_n_vocab(m->tokenizer), (long long)c->n_vocab);
    }
    if (s) {
        kiln_model_free(m);
        return s;
    }
    *out = m;
    return KILN_OK;
}

void kiln_model_free(kiln_model *m) {
    if (!m) return;
    kiln_tokenizer_free(m->tokenizer);
    free(m->layers);
    kiln_gguf_close(m->gguf);
    free(m);
}

const kiln_tokenizer *kiln_model_tokenizer(const kiln_model *m) { return m->tokenizer; }
int64_t kiln_model_n_vocab(const kiln_model *m) { return m->cfg.n_vocab; }
int64_t kiln_model_n_ctx_train(const kiln_model *m) { return m->cfg.n_ctx_train; }
