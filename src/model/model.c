/* model.c: loading a llama, qwen2 or gemma3 GGUF into a kiln_model: the config from metadata (required keys are
 * errors naming the key when absent; optional keys take llama.cpp's defaults) and weight views bound by name
 * with their shapes and types checked. tests/test_generate.c (test_load_errors) and
 * tests/test_arch.c cover the rejections. */
#include "model.h"
#include "model/quantize.h"
#include "quants.h"
#include "status.h"

#include <math.h>
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

/* The domain an optional float key must lie in: every float kiln reads is finite (a NaN or inf in a norm's epsilon,
 * RoPE's base or the logits' scale would only show up as NaN logits), and some must also be positive. */
typedef enum { F32_POSITIVE, F32_NOT_NEGATIVE } f32_domain;

static kiln_status opt_f32(const kiln_gguf *g, const char *key, f32_domain domain, float *out) {
    if (!kiln_gguf_find(g, key)) return KILN_OK;
    float v;
    kiln_status s = kiln_gguf_get_f32(g, key, &v);
    if (s) return s;
    const bool ok = isfinite(v) && (domain == F32_POSITIVE ? v > 0 : v >= 0);
    if (!ok)
        return kiln_fail(KILN_ERR_FORMAT, "%s: key '%s' is %g; it must be finite and %s", kiln_gguf_path(g), key, (double)v,
                         domain == F32_POSITIVE ? "positive" : "not negative");
    *out = v;
    return KILN_OK;
}

/* The architectures the one forward runs, and what each implies beyond its metadata (llama.cpp's
 * src/llama-model.cpp and convert_hf_to_gguf.py): qwen2 has q, k, v biases and NeoX RoPE (its converter does not
 * permute q and k); gemma3 has GeGLU, sandwich norms, per-head QK norms, sqrt(C) embedding scale, tied output and
 * sliding layers with their own RoPE base of 10000 (every 6th layer global). gemma3's GGUF norms already hold
 * 1 + w (the converter adds 1), so they multiply as stored. */
typedef enum { ARCH_LLAMA, ARCH_QWEN2, ARCH_GEMMA3 } arch_id;
static const char *const arch_names[] = {"llama", "qwen2", "gemma3"};

/* "<arch>.<suffix>" into buf */
static const char *key(char *buf, size_t n, const char *arch, const char *suffix) {
    snprintf(buf, n, "%s.%s", arch, suffix);
    return buf;
}

static kiln_status opt_bool(const kiln_gguf *g, const char *k, bool *out) {
    return kiln_gguf_find(g, k) ? kiln_gguf_get_bool(g, k, out) : KILN_OK;
}

static kiln_status read_config(const kiln_gguf *g, kiln_llama_config *c, arch_id *arch_out) {
    const char *path = kiln_gguf_path(g);
    kiln_str name;
    kiln_status s = kiln_gguf_get_str(g, "general.architecture", &name);
    if (s) return s;
    int a = -1;
    for (int i = 0; i < 3; i++)
        if (name.len == strlen(arch_names[i]) && memcmp(name.ptr, arch_names[i], name.len) == 0) a = i;
    if (a < 0)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: architecture '%.*s' is not supported (kiln runs llama, qwen2, gemma3)", path,
                         (int)(name.len > 32 ? 32 : name.len), name.ptr);
    const char *A = arch_names[a];
    *arch_out = (arch_id)a;
    char k[128];
#define K(suffix) key(k, sizeof k, A, suffix)
    memset(c, 0, sizeof *c);
    if ((s = get_dim(g, K("embedding_length"), &c->n_embd)) || (s = get_dim(g, K("block_count"), &c->n_layer)) ||
        (s = get_dim(g, K("attention.head_count"), &c->n_head)) || (s = get_dim(g, K("feed_forward_length"), &c->n_ff)))
        return s;
    c->n_head_kv = c->n_head;
    c->n_ctx_train = 2048;
    c->rope_base = 10000.0f;
    c->rms_eps = a == ARCH_GEMMA3 ? 1e-6f : 1e-5f;
    if ((s = opt_dim(g, K("attention.head_count_kv"), &c->n_head_kv)) || (s = opt_dim(g, K("context_length"), &c->n_ctx_train)) ||
        (s = opt_f32(g, K("rope.freq_base"), F32_POSITIVE, &c->rope_base)) ||
        (s = opt_f32(g, K("attention.layer_norm_rms_epsilon"), F32_POSITIVE, &c->rms_eps)))
        return s;
    if (c->n_head % c->n_head_kv)
        return kiln_fail(KILN_ERR_FORMAT, "%s: head_count %lld is not a multiple of head_count_kv %lld", path, (long long)c->n_head,
                         (long long)c->n_head_kv);
    c->head_dim = c->n_embd / c->n_head;
    if ((s = opt_dim(g, K("attention.key_length"), &c->head_dim))) return s;
    if (!kiln_gguf_find(g, K("attention.key_length")) && c->n_embd % c->n_head)
        return kiln_fail(KILN_ERR_FORMAT, "%s: embedding_length %lld is not a multiple of head_count %lld", path,
                         (long long)c->n_embd, (long long)c->n_head);
    int64_t v_len = c->head_dim;
    if ((s = opt_dim(g, K("attention.value_length"), &v_len))) return s;
    if (v_len != c->head_dim)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: value_length %lld differs from key_length %lld", path, (long long)v_len,
                         (long long)c->head_dim);
    c->rope_dim = c->head_dim;
    if ((s = opt_dim(g, K("rope.dimension_count"), &c->rope_dim))) return s;
    if (c->rope_dim > c->head_dim || c->rope_dim % 2)
        return kiln_fail(KILN_ERR_FORMAT, "%s: rope.dimension_count %lld must be even and at most the head size %lld", path,
                         (long long)c->rope_dim, (long long)c->head_dim);

    /* what the architecture implies */
    c->rope_neox = a != ARCH_LLAMA;
    c->qkv_bias = a == ARCH_QWEN2;
    c->qk_norm = c->sandwich_norm = c->geglu = c->embd_scale = a == ARCH_GEMMA3;
    if (a == ARCH_GEMMA3) c->swa_pattern = 6, c->rope_base_local = 10000.0f;
    if (a == ARCH_GEMMA3 && c->n_layer == 62) c->attn_scale = 1.0f / sqrtf((float)(c->n_embd / c->n_head));
    /* and what its metadata adds (Muse's own keys, or gemma's) */
    c->post_norm_eps = c->rms_eps;
    uint32_t pattern = 0;
    if ((s = opt_bool(g, K("attention.output_gate"), &c->output_gate)) ||
        (s = opt_f32(g, K("attention.layer_norm_rms_epsilon_post"), F32_POSITIVE, &c->post_norm_eps)) ||
        (s = opt_f32(g, K("logit_scale"), F32_NOT_NEGATIVE, &c->logit_scale)) ||
        (s = opt_f32(g, K("final_logit_softcapping"), F32_NOT_NEGATIVE, &c->logit_softcap)) ||
        (s = opt_dim(g, K("attention.sliding_window"), &c->sliding_window)) ||
        (s = opt_f32(g, K("rope.local.freq_base"), F32_NOT_NEGATIVE, &c->rope_base_local)) ||
        (s = opt_f32(g, K("attention.scale"), F32_NOT_NEGATIVE, &c->attn_scale)))
        return s;
    const kiln_gguf_value *pv = kiln_gguf_find(g, K("attention.sliding_window_pattern"));
    if (pv && pv->type != KILN_GGUF_ARRAY) { /* an array, one flag per layer, is read by layer_flags */
        if ((s = kiln_gguf_get_u32(g, k, &pattern))) return s;
        c->swa_pattern = pattern;
    }
    if (a == ARCH_GEMMA3 && kiln_gguf_find(g, K("rope.scaling.factor"))) {
        float f;
        if ((s = kiln_gguf_get_f32(g, K("rope.scaling.factor"), &f))) return s;
        if (f != 1.0f)
            return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: %s is %g; kiln does not support RoPE scaling", path, k, (double)f);
    }
#undef K
    return KILN_OK;
}

/* An array of integers (or bools, when bools is true) or NULL when the key is absent. */
static kiln_status int_array(const kiln_gguf *g, const char *k, bool bools, const kiln_gguf_value **out) {
    const kiln_gguf_value *arr = *out = kiln_gguf_find(g, k);
    if (!arr) return KILN_OK;
    if (arr->type != KILN_GGUF_ARRAY || !kiln_gguf_vtype_size(arr->arr.type) || arr->arr.type == KILN_GGUF_FLOAT32 ||
        arr->arr.type == KILN_GGUF_FLOAT64 || (arr->arr.type == KILN_GGUF_BOOL && !bools))
        return kiln_fail(KILN_ERR_FORMAT, "%s: key '%s' must be an array of integer%s", kiln_gguf_path(g), k, bools ? "s or bools" : "s");
    return KILN_OK;
}

/* Per-layer flags: which layers slide (with their RoPE base) and which have no RoPE. A sliding_window_pattern
 * array (llama.cpp's get_key_or_arr form) has one flag per layer, nonzero for a sliding layer. */
static kiln_status layer_flags(const kiln_gguf *g, const char *arch, kiln_model *m) {
    const kiln_llama_config *c = &m->cfg;
    char k[128];
    const kiln_gguf_value *arr;
    const kiln_gguf_value *pv = kiln_gguf_find(g, key(k, sizeof k, arch, "attention.sliding_window_pattern"));
    kiln_status s = pv && pv->type == KILN_GGUF_ARRAY ? int_array(g, k, true, &arr) : (arr = NULL, KILN_OK);
    if (s) return s;
    if (arr && arr->arr.n != (uint64_t)c->n_layer)
        return kiln_fail(KILN_ERR_FORMAT, "%s: key '%s' has %llu entries for %lld layers", kiln_gguf_path(g), k,
                         (unsigned long long)arr->arr.n, (long long)c->n_layer);
    for (int64_t l = 0; l < c->n_layer; l++) {
        kiln_llama_layer *L = &m->layers[l];
        const bool pattern = arr ? kiln_gguf_arr_u64(arr, (uint64_t)l) != 0
                                 : c->swa_pattern <= 1 || l % c->swa_pattern < c->swa_pattern - 1;
        const bool slides = c->sliding_window > 0 && pattern;
        L->window = slides ? c->sliding_window : 0;
        L->rope_base = slides && c->rope_base_local > 0 ? c->rope_base_local : c->rope_base;
    }
    if ((s = int_array(g, key(k, sizeof k, arch, "attention.nope_layers"), false, &arr)) || !arr) return s;
    for (uint64_t i = 0; i < arr->arr.n; i++) {
        int64_t l = kiln_gguf_arr_i64(arr, i);
        if (l < 0 || l >= c->n_layer)
            return kiln_fail(KILN_ERR_FORMAT, "%s: key '%s' names layer %lld of %lld", kiln_gguf_path(g), k, (long long)l,
                             (long long)c->n_layer);
        m->layers[l].nope = true;
    }
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
    if (ne1 == 1 && t->type != KILN_TYPE_F32)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: tensor '%s' is %s, expected f32", path, name, kiln_type_name(t->type));
    /* a type kiln can dequantize, it can quantize to one it runs */
    const bool readable = kiln_get_to_float(t->type, KILN_SIMD_SCALAR) != NULL;
    if (!kiln_type_runnable(t->type))
        return kiln_fail(KILN_ERR_UNSUPPORTED,
                         "%s: tensor '%s' has type %s, which kiln cannot run (it runs %s); %s `kiln quantize %s OUT.gguf --type q4_k_m`",
                         path, name, kiln_type_name(t->type), kiln_runnable_type_names(),
                         readable ? "convert the file with" : "kiln cannot read it either: convert the model's F16 or BF16 GGUF with",
                         readable ? path : "MODEL-F16.gguf");
    *out = t;
    return KILN_OK;
}

/* The layers the tensor names hold (one more than the largest N of a "blk.N." name) must be block_count: fewer
 * would fail as a missing tensor, more would be skipped without a word. */
static kiln_status check_block_count(const kiln_gguf *g, int64_t n_layer) {
    int64_t present = 0;
    for (int64_t i = 0; i < kiln_gguf_n_tensors(g); i++) {
        const char *name = kiln_gguf_tensor_at(g, i)->name, *p = name + 4;
        if (strncmp(name, "blk.", 4) != 0 || *p < '0' || *p > '9') continue;
        int64_t l = 0;
        for (; *p >= '0' && *p <= '9' && l <= (1LL << 31); p++) l = l * 10 + (*p - '0');
        if (*p == '.' && l + 1 > present) present = l + 1;
    }
    if (present == 0)
        return kiln_fail(KILN_ERR_FORMAT, "%s: block_count is %lld but no tensor is of a layer (blk.N.*)", kiln_gguf_path(g),
                         (long long)n_layer);
    if (present != n_layer)
        return kiln_fail(KILN_ERR_FORMAT, "%s: block_count is %lld but the tensors are of %lld layers (blk.0 to blk.%lld)",
                         kiln_gguf_path(g), (long long)n_layer, (long long)present, (long long)present - 1);
    return KILN_OK;
}

/* Every bound weight holds finite values only (kiln_tensor_check_finite: float tensors element by element, block
 * formats by their scales), so a NaN in a file is a load error naming the tensor, not NaN logits later. Measured
 * with a warm page cache on 2 busy cores: the bundled q8_0 model 0.3-0.5 ms of a 2-2.5 ms load; a 124M q4_k_m
 * 9 ms (its scales only); a 124M f16 (250 MB) 47 ms, 5 GB/s, about the time of touching every page once. */
static kiln_status check_weights_finite(const kiln_model *m) {
    const char *path = kiln_gguf_path(m->gguf);
    TRY(kiln_tensor_check_finite(path, m->tok_embd));
    TRY(kiln_tensor_check_finite(path, m->output_norm));
    if (!m->cfg.tied) TRY(kiln_tensor_check_finite(path, m->output));
    for (int64_t l = 0; l < m->cfg.n_layer; l++)
        for (int i = 0; i < KILN_LT_COUNT; i++)
            if (m->layers[l].t[i]) TRY(kiln_tensor_check_finite(path, m->layers[l].t[i]));
    return KILN_OK;
}

/* Every layer's tensors, as the table (tensors.c) lists them, those the config needs. */
static kiln_status bind_layers(kiln_model *m) {
    const kiln_llama_config *c = &m->cfg;
    char name[96];
    kiln_status s = KILN_OK;
    for (int64_t l = 0; l < c->n_layer && !s; l++)
        for (int i = 0; i < KILN_LT_COUNT && !s; i++) {
            if (!kiln_layer_has(c, (kiln_layer_tensor)i)) continue;
            const kiln_tensor_spec *ts = &kiln_layer_tensors[i];
            s = bind(m->gguf, kiln_layer_tensor_name(name, sizeof name, l, (kiln_layer_tensor)i), kiln_dim_size(c, ts->ne0),
                     kiln_dim_size(c, ts->ne1), &m->layers[l].t[i]);
        }
    return s;
}

kiln_status kiln_model_load(const char *path, kiln_model **out) {
    *out = NULL;
    kiln_model *m = calloc(1, sizeof *m);
    if (!m) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    arch_id arch = ARCH_LLAMA;
    kiln_status s = kiln_gguf_open(path, &m->gguf);
    if (!s) s = read_config(m->gguf, &m->cfg, &arch);
    kiln_llama_config *c = &m->cfg;
    if (!s) {
        const kiln_tensor_view *emb = kiln_gguf_find_tensor(m->gguf, "token_embd.weight");
        if (!emb) s = kiln_fail(KILN_ERR_NOT_FOUND, "%s: missing tensor 'token_embd.weight'", path);
        else c->n_vocab = emb->ne[1];
    }
    char vkey[64];
    key(vkey, sizeof vkey, arch_names[arch], "vocab_size");
    if (!s && kiln_gguf_find(m->gguf, vkey)) {
        int64_t v;
        if (!(s = get_dim(m->gguf, vkey, &v)) && v != c->n_vocab)
            s = kiln_fail(KILN_ERR_FORMAT, "%s: vocab_size %lld but token_embd.weight has %lld rows", path, (long long)v,
                          (long long)c->n_vocab);
    }
    if (!s) s = bind(m->gguf, "token_embd.weight", c->n_embd, c->n_vocab, &m->tok_embd);
    if (!s) s = bind(m->gguf, "output_norm.weight", c->n_embd, 1, &m->output_norm);
    if (!s) {
        c->tied = kiln_gguf_find_tensor(m->gguf, "output.weight") == NULL;
        m->output = m->tok_embd;
        if (!c->tied) s = bind(m->gguf, "output.weight", c->n_embd, c->n_vocab, &m->output);
    }
    if (!s) { /* a llama file may carry these tensors too (Muse): layer 0's decide, every layer must then have them */
        c->qkv_bias |= kiln_gguf_find_tensor(m->gguf, "blk.0.attn_q.bias") != NULL;
        c->qk_norm |= kiln_gguf_find_tensor(m->gguf, "blk.0.attn_q_norm.weight") != NULL;
        c->sandwich_norm |= kiln_gguf_find_tensor(m->gguf, "blk.0.post_attention_norm.weight") != NULL;
    }
    if (!s) s = check_block_count(m->gguf, c->n_layer);
    if (!s && !(m->layers = calloc((size_t)c->n_layer, sizeof *m->layers))) s = kiln_fail(KILN_ERR_NOMEM, "out of memory");
    if (!s) s = bind_layers(m);
    if (!s) s = layer_flags(m->gguf, arch_names[arch], m);
    if (!s) s = check_weights_finite(m);
    /* One embedding row per token, as llama.cpp requires (its token_embd shape is {C, the tokenizer's count}; its
     * converters pad a short tokenizer with [PAD] tokens instead). Rows past the tokenizer would be sampled and
     * then fail to decode in the middle of a generation. */
    if (!s && kiln_gguf_find(m->gguf, "tokenizer.ggml.model")) {
        s = kiln_tokenizer_load_gguf(m->gguf, &m->tokenizer);
        if (!s && kiln_tokenizer_n_vocab(m->tokenizer) != c->n_vocab)
            s = kiln_fail(KILN_ERR_FORMAT, "%s: the tokenizer has %d tokens but token_embd.weight has %lld rows; they must be equal",
                          path, kiln_tokenizer_n_vocab(m->tokenizer), (long long)c->n_vocab);
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
const kiln_gguf *kiln_model_gguf(const kiln_model *m) { return m->gguf; }

void kiln_model_get_info(const kiln_model *m, kiln_model_info *out) {
    const kiln_llama_config *c = &m->cfg;
    kiln_str name = {0};
    kiln_gguf_get_str(m->gguf, "general.architecture", &name); /* present and one of arch_names: the load checked */
    const char *arch = arch_names[ARCH_LLAMA];
    for (size_t i = 0; i < sizeof arch_names / sizeof arch_names[0]; i++)
        if (name.len == strlen(arch_names[i]) && memcmp(name.ptr, arch_names[i], name.len) == 0) arch = arch_names[i];
    int64_t n_params = 0;
    for (int64_t i = 0; i < kiln_gguf_n_tensors(m->gguf); i++) {
        const kiln_tensor_view *t = kiln_gguf_tensor_at(m->gguf, i);
        n_params += t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]; /* the reader checked each product fits */
    }
    *out = (kiln_model_info){.arch = arch, .n_vocab = c->n_vocab, .n_embd = c->n_embd, .n_layer = c->n_layer,
                             .n_head = c->n_head, .n_head_kv = c->n_head_kv, .head_dim = c->head_dim, .n_ff = c->n_ff,
                             .n_ctx_train = c->n_ctx_train, .n_params = n_params, .tied = c->tied};
}
