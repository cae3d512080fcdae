/* model.c: loading a GGUF of one of the architectures below (archs) into a kiln_model: the config from metadata
 * (required keys are errors naming the key when absent; optional keys take llama.cpp's defaults) and weight views bound by name
 * with their shapes and types checked; RoPE scaling is rope.c's. tests/test_generate.c (test_load_errors) and
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

/* As opt_dim, also taking 0 (phi3's converter writes sliding_window 0 for "none"). */
static kiln_status opt_count(const kiln_gguf *g, const char *key, int64_t *out) {
    int64_t v;
    if (!kiln_gguf_find(g, key)) return KILN_OK;
    kiln_status s = kiln_gguf_get_i64(g, key, &v);
    if (s) return s;
    if (v < 0 || v > (1LL << 31))
        return kiln_fail(KILN_ERR_FORMAT, "%s: key '%s' is %lld, outside 0..2^31", kiln_gguf_path(g), key, (long long)v);
    *out = v;
    return KILN_OK;
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
 * src/models/<arch>.cpp, src/llama-model.cpp's llama_model_rope_type and convert_hf_to_gguf.py). A row's flags are
 * the config's (model.h); rope_neox follows llama.cpp's rope type (NORM: interleaved pairs, the converter permutes
 * q and k; NEOX: halves, no permutation). Gemma's GGUF norms already hold 1 + w (the converter adds 1), so they
 * multiply as stored. */
typedef enum {
    ARCH_LLAMA, ARCH_QWEN2, ARCH_GEMMA3, ARCH_QWEN3, ARCH_MISTRAL3, ARCH_PHI3, ARCH_GEMMA2, ARCH_SMOLLM3, ARCH_OLMO2,
    ARCH_COUNT
} arch_id;

typedef struct arch_spec {
    const char *name;
    bool neox, qkv_bias, qk_norm, qk_norm_full, gemma, no_pre_norm, sandwich_norm;
    bool fused;            /* ffn_up holds gate then up (fused_gate_up); a fused attn_qkv is found by name in any file */
    float eps;             /* layer_norm_rms_epsilon's default */
    int64_t swa_pattern;   /* llama.cpp's set_swa_pattern default (0: every layer slides when sliding_window is set) */
    int64_t window;        /* sliding_window's default (0: none) */
    int64_t nope_step;     /* layer l has no RoPE when (l + 1) % nope_step == 0 (smollm3's n_no_rope_layer_step 4) */
} arch_spec;

/* llama: Llama 1-3 and Mistral 7B (with llama.attention.sliding_window, as v0.1's 4096, every layer slides).
 * qwen2: q, k, v biases. qwen3: per-head QK norm, head size from key_length. mistral3 (Ministral 3 / Mistral Small
 * 3.x text): llama's graph, refused when it asks for its attention temperature scale. phi3: fused qkv and gate|up,
 * partial rotary, a sliding window on every layer when phi3.attention.sliding_window is set (as transformers'
 * Phi3; llama.cpp c392e50 turns Phi's SWA off with a warning). gemma2: attention and final softcaps (50, 30 by
 * default), sliding window 4096 on even layers (pattern 2), sandwich norms, GeGLU, sqrt(C) embedding scale, tied
 * head. gemma3: gemma2's less the softcaps, plus per-head QK norm, every 6th layer global with a local RoPE base of
 * 10000. smollm3: NoPE on layers 3, 7, 11, ... olmo2: no pre-norms, post-norms on each block's output, QK norm over
 * the whole q and k; a sliding window (olmo3's) slides 3 layers of 4. */
static const arch_spec archs[ARCH_COUNT] = {
    [ARCH_LLAMA] = {"llama", .eps = 1e-5f},
    [ARCH_QWEN2] = {"qwen2", .neox = true, .qkv_bias = true, .eps = 1e-5f},
    [ARCH_GEMMA3] = {"gemma3", .neox = true, .qk_norm = true, .gemma = true, .sandwich_norm = true, .eps = 1e-6f, .swa_pattern = 6},
    [ARCH_QWEN3] = {"qwen3", .neox = true, .qk_norm = true, .eps = 1e-6f},
    [ARCH_MISTRAL3] = {"mistral3", .eps = 1e-5f},
    [ARCH_PHI3] = {"phi3", .neox = true, .fused = true, .eps = 1e-5f},
    [ARCH_GEMMA2] = {"gemma2", .neox = true, .gemma = true, .sandwich_norm = true, .eps = 1e-6f, .swa_pattern = 2, .window = 4096},
    [ARCH_SMOLLM3] = {"smollm3", .eps = 1e-6f, .nope_step = 4},
    [ARCH_OLMO2] = {"olmo2", .neox = true, .qk_norm = true, .qk_norm_full = true, .no_pre_norm = true, .sandwich_norm = true,
                    .eps = 1e-6f, .swa_pattern = 4},
};

/* "<arch>.<suffix>" into buf */
const char *kiln_arch_key(char *buf, size_t n, const char *arch, const char *suffix) {
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
    for (int i = 0; i < ARCH_COUNT; i++)
        if (name.len == strlen(archs[i].name) && memcmp(name.ptr, archs[i].name, name.len) == 0) a = i;
    if (a < 0)
        return kiln_fail(KILN_ERR_UNSUPPORTED,
                         "%s: architecture '%.*s' is not supported (kiln runs llama, mistral3, qwen2, qwen3, phi3, gemma2, gemma3, "
                         "smollm3, olmo2)", path, (int)(name.len > 32 ? 32 : name.len), name.ptr);
    const arch_spec *as = &archs[a];
    const char *A = as->name;
    *arch_out = (arch_id)a;
    char k[128];
#define K(suffix) kiln_arch_key(k, sizeof k, A, suffix)
    memset(c, 0, sizeof *c);
    if ((s = get_dim(g, K("embedding_length"), &c->n_embd)) || (s = get_dim(g, K("block_count"), &c->n_layer)) ||
        (s = get_dim(g, K("attention.head_count"), &c->n_head)) || (s = get_dim(g, K("feed_forward_length"), &c->n_ff)))
        return s;
    c->n_head_kv = c->n_head;
    c->n_ctx_train = 2048;
    c->rope_base = 10000.0f;
    c->rms_eps = as->eps;
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
    c->rope_neox = as->neox;
    c->qkv_bias = as->qkv_bias;
    c->qk_norm = as->qk_norm;
    c->qk_norm_full = as->qk_norm_full;
    c->no_pre_norm = as->no_pre_norm;
    c->sandwich_norm = as->sandwich_norm;
    c->geglu = c->embd_scale = as->gemma;
    c->swa_pattern = as->swa_pattern;
    c->sliding_window = as->window;
    if (a == ARCH_GEMMA3) c->rope_base_local = 10000.0f;
    if (a == ARCH_GEMMA3 && c->n_layer == 62) c->attn_scale = 1.0f / sqrtf((float)(c->n_embd / c->n_head));
    if (a == ARCH_GEMMA2) c->attn_softcap = 50.0f, c->logit_softcap = 30.0f; /* llama.cpp's hparams defaults */
    if (a == ARCH_GEMMA2 && c->n_layer == 46) c->attn_scale = 1.0f / sqrtf((float)(c->n_embd / c->n_head)); /* 27B */
    /* and what its metadata adds (Muse's own keys, or gemma's) */
    c->post_norm_eps = c->rms_eps;
    uint32_t pattern = 0;
    if ((s = opt_bool(g, K("attention.output_gate"), &c->output_gate)) ||
        (s = opt_f32(g, K("attention.layer_norm_rms_epsilon_post"), F32_POSITIVE, &c->post_norm_eps)) ||
        (s = opt_f32(g, K("logit_scale"), F32_NOT_NEGATIVE, &c->logit_scale)) ||
        (s = opt_f32(g, K("final_logit_softcapping"), F32_NOT_NEGATIVE, &c->logit_softcap)) ||
        (s = opt_f32(g, K("attn_logit_softcapping"), F32_NOT_NEGATIVE, &c->attn_softcap)) ||
        (s = opt_count(g, K("attention.sliding_window"), &c->sliding_window)) ||
        (s = opt_f32(g, K("rope.local.freq_base"), F32_NOT_NEGATIVE, &c->rope_base_local)) ||
        (s = opt_f32(g, K("rope.freq_base_swa"), F32_POSITIVE, &c->rope_base_local)) || /* llama.cpp's name (gemma3) */
        (s = opt_f32(g, K("attention.scale"), F32_NOT_NEGATIVE, &c->attn_scale)))
        return s;
    if (a == ARCH_MISTRAL3 && kiln_gguf_find(g, K("attention.temperature_scale"))) {
        float ts;
        if ((s = kiln_gguf_get_f32(g, k, &ts))) return s;
        if (ts != 0.0f)
            return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: %s is %g; kiln does not support mistral3's attention temperature scaling",
                             path, k, (double)ts);
    }
    const kiln_gguf_value *pv = kiln_gguf_find(g, K("attention.sliding_window_pattern"));
    if (pv && pv->type != KILN_GGUF_ARRAY) { /* an array, one flag per layer, is read by layer_flags */
        if ((s = kiln_gguf_get_u32(g, k, &pattern))) return s;
        c->swa_pattern = pattern;
    }
    if ((s = kiln_rope_read_config(g, A, c))) return s;
    c->rope_scaling.swa_unscaled = a == ARCH_GEMMA3; /* gemma3's sliding layers: rope_freq_scale_train_swa = 1 */
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
static kiln_status layer_flags(const kiln_gguf *g, const arch_spec *as, kiln_model *m) {
    const kiln_llama_config *c = &m->cfg;
    const char *arch = as->name;
    char k[128];
    const kiln_gguf_value *arr;
    const kiln_gguf_value *pv = kiln_gguf_find(g, kiln_arch_key(k, sizeof k, arch, "attention.sliding_window_pattern"));
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
        L->nope = as->nope_step > 0 && (l + 1) % as->nope_step == 0;
    }
    if ((s = int_array(g, kiln_arch_key(k, sizeof k, arch, "attention.nope_layers"), false, &arr)) || !arr) return s;
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

/* Views of rows [r0, r0 + n) of each of the fused tensor's parts into out: a row of a block format is whole blocks,
 * so a row slice is itself a valid tensor of that type. The views keep the fused tensor's name for messages. */
static void row_views(const kiln_tensor_view *t, const int64_t *rows, int n_parts, kiln_tensor_view *out) {
    int64_t r0 = 0;
    for (int i = 0; i < n_parts; i++) {
        kiln_tensor_view *v = &out[i];
        *v = *t;
        v->ne[1] = rows[i];
        v->nbytes = (size_t)rows[i] * t->nb[1];
        v->offset = t->offset + (uint64_t)r0 * t->nb[1];
        v->data = (const char *)t->data + (size_t)r0 * t->nb[1];
        for (int d = 2; d < 4; d++) v->nb[d] = v->nbytes;
        r0 += rows[i];
    }
}

/* The fused tensors of layer l (fused_qkv: attn_qkv.weight of Q + 2 KV rows; fused_gate_up: ffn_up.weight of 2F
 * rows, gate then up), bound with their shapes checked and cut into the layer's views (model.h: m->views). */
static kiln_status bind_fused(kiln_model *m, int64_t l) {
    const kiln_llama_config *c = &m->cfg;
    kiln_llama_layer *L = &m->layers[l];
    kiln_tensor_view *v = m->views ? m->views + l * 5 : NULL; /* NULL without fused tensors: no offset on NULL */
    const kiln_tensor_view *t;
    char name[96];
    if (c->fused_qkv) {
        const int64_t rows[3] = {kiln_dim_size(c, KILN_DIM_Q), kiln_dim_size(c, KILN_DIM_KV), kiln_dim_size(c, KILN_DIM_KV)};
        snprintf(name, sizeof name, "blk.%lld.attn_qkv.weight", (long long)l);
        TRY(bind(m->gguf, name, c->n_embd, rows[0] + rows[1] + rows[2], &t));
        row_views(t, rows, 3, v);
        L->wq = &v[0], L->wk = &v[1], L->wv = &v[2];
    }
    if (c->fused_gate_up) {
        const int64_t rows[2] = {c->n_ff, c->n_ff};
        snprintf(name, sizeof name, "blk.%lld.ffn_up.weight", (long long)l);
        TRY(bind(m->gguf, name, c->n_embd, 2 * c->n_ff, &t));
        row_views(t, rows, 2, v + 3);
        L->w_gate = &v[3], L->w_up = &v[4];
    }
    return KILN_OK;
}

/* Whether tensor i of a layer comes from a fused tensor instead of its own name. */
static bool is_fused(const kiln_llama_config *c, int i) {
    return (c->fused_qkv && (i == KILN_LT_WQ || i == KILN_LT_WK || i == KILN_LT_WV)) ||
           (c->fused_gate_up && (i == KILN_LT_W_GATE || i == KILN_LT_W_UP));
}

/* Every layer's tensors, as the table (tensors.c) lists them, those the config needs. */
static kiln_status bind_layers(kiln_model *m) {
    const kiln_llama_config *c = &m->cfg;
    char name[96];
    kiln_status s = KILN_OK;
    if ((c->fused_qkv || c->fused_gate_up) && !(m->views = calloc((size_t)c->n_layer * 5, sizeof *m->views)))
        return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    for (int64_t l = 0; l < c->n_layer && !s; l++) {
        s = bind_fused(m, l);
        for (int i = 0; i < KILN_LT_COUNT && !s; i++) {
            if (!kiln_layer_has(c, (kiln_layer_tensor)i) || is_fused(c, i)) continue;
            const kiln_tensor_spec *ts = &kiln_layer_tensors[i];
            s = bind(m->gguf, kiln_layer_tensor_name(name, sizeof name, l, (kiln_layer_tensor)i), kiln_dim_size(c, ts->ne0),
                     kiln_dim_size(c, ts->ne1), &m->layers[l].t[i]);
        }
    }
    return s;
}

/* What a file may have that the one forward does not compute: refused by name rather than run wrong. */
static kiln_status check_unsupported(const kiln_gguf *g, const kiln_llama_config *c) {
    static const char *const refused[][2] = {
        {"blk.0.ffn_gate_inp.weight", "mixture-of-experts layers"},
        {"blk.0.attn_qkv.bias", "a fused q/k/v bias"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++)
        if (kiln_gguf_find_tensor(g, refused[i][0]))
            return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: tensor '%s': kiln does not support %s", kiln_gguf_path(g), refused[i][0],
                             refused[i][1]);
    if (c->qkv_bias && c->qk_norm_full) /* the GPU norms the whole q and k before its per-head bias step */
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: q/k/v biases with a full-width QK norm are not supported", kiln_gguf_path(g));
    return KILN_OK;
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
    kiln_arch_key(vkey, sizeof vkey, archs[arch].name, "vocab_size");
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
        c->fused_qkv = kiln_gguf_find_tensor(m->gguf, "blk.0.attn_qkv.weight") != NULL;
        c->fused_gate_up = archs[arch].fused;
        s = check_unsupported(m->gguf, c);
    }
    if (!s) s = check_block_count(m->gguf, c->n_layer);
    if (!s && !(m->layers = calloc((size_t)c->n_layer, sizeof *m->layers))) s = kiln_fail(KILN_ERR_NOMEM, "out of memory");
    if (!s) s = bind_layers(m);
    if (!s) s = layer_flags(m->gguf, &archs[arch], m);
    if (!s) s = kiln_rope_build_model(m);
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
    free(m->rope_freq);
    free(m->layers);
    free(m->views);
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
    kiln_gguf_get_str(m->gguf, "general.architecture", &name); /* present and one of archs: the load checked */
    const char *arch = archs[ARCH_LLAMA].name;
    for (size_t i = 0; i < ARCH_COUNT; i++)
        if (name.len == strlen(archs[i].name) && memcmp(name.ptr, archs[i].name, name.len) == 0) arch = archs[i].name;
    int64_t n_params = 0;
    for (int64_t i = 0; i < kiln_gguf_n_tensors(m->gguf); i++) {
        const kiln_tensor_view *t = kiln_gguf_tensor_at(m->gguf, i);
        n_params += t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]; /* the reader checked each product fits */
    }
    *out = (kiln_model_info){.arch = arch, .n_vocab = c->n_vocab, .n_embd = c->n_embd, .n_layer = c->n_layer,
                             .n_head = c->n_head, .n_head_kv = c->n_head_kv, .head_dim = c->head_dim, .n_ff = c->n_ff,
                             .n_ctx_train = c->n_ctx_train, .n_params = n_params, .tied = c->tied};
}
