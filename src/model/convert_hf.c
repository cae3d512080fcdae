/* convert_hf.c: `kiln convert hf`, a Hugging Face checkpoint folder (config.json, safetensors, tokenizer) into a
 * GGUF that kiln and llama.cpp run, with the keys, tensor names and tensor transforms of llama.cpp's
 * convert_hf_to_gguf.py (conversion/{base,llama,qwen,gemma,phi,olmo}.py):
 *   - llama, mistral, smollm3: q_proj/k_proj rows permuted from HF's rotate-half RoPE layout to the interleaved
 *     pairs llama.cpp's llama RoPE rotates; Llama 3's rope_scaling becomes the rope_freqs.weight tensor;
 *   - gemma2, gemma3: every *norm.weight + 1 (Gemma's RMSNorm multiplies by 1 + w);
 *   - phi3: qkv_proj and gate_up_proj stay fused (attn_qkv, ffn_up); LongRoPE factors as rope_factors_long/short;
 *   - qwen2, qwen3, olmo2: names only (their RoPE is NEOX in llama.cpp, as in HF).
 * 2-D weights take the asked type (F32, F16, BF16); 1-D tensors stay F32. A quantized type is the caller's second
 * step (kiln_quantize_file over the F32 output; `kiln convert hf --type q4_k_m` does both), as the quantizer sits in
 * the CPU backend's layer above this one. tests/test_hf_oracle.c compares the result with
 * transformers' logits for every architecture; tests/test_hf_convert.c covers the refusals. */
#include "kiln.h"
#include "model.h"
#include "safetensors.h"
#include "status.h"
#include "fp16.h"
#include "tok/import_hf.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- architectures */

typedef struct hf_arch {
    const char *hf;         /* config.json "architectures"[0] */
    const char *arch;       /* general.architecture */
    bool permute_qk;        /* HF rotate-half to llama.cpp's interleaved RoPE */
    bool norm_plus_one;     /* Gemma's (1 + w) RMSNorm */
    bool post_norms;        /* post_attention_layernorm is a post-norm (gemma, olmo2), not the FFN's pre-norm */
    bool skip_lm_head;      /* gemma2: llama.cpp ignores lm_head.weight (tied) */
    bool prefer_spm;        /* tokenizer.model before tokenizer.json */
    bool vocab_and_rope_dim; /* llama's set_gguf_parameters adds vocab_size and rope.dimension_count */
} hf_arch;

static const hf_arch hf_archs[] = {
    {"LlamaForCausalLM", "llama", true, false, false, false, true, true},
    {"MistralForCausalLM", "llama", true, false, false, false, true, true},
    {"SmolLM3ForCausalLM", "smollm3", true, false, false, false, false, true},
    {"Qwen2ForCausalLM", "qwen2", false, false, false, false, false, false},
    {"Qwen3ForCausalLM", "qwen3", false, false, false, false, false, false},
    {"Gemma2ForCausalLM", "gemma2", false, true, true, true, true, false},
    {"Gemma3ForCausalLM", "gemma3", false, true, true, false, true, false},
    {"Phi3ForCausalLM", "phi3", false, false, false, false, true, false},
    {"Olmo2ForCausalLM", "olmo2", false, false, true, false, false, false},
};

/* A layer tensor: HF's name after "model.layers.N." and GGUF's after "blk.N.". */
typedef struct hf_layer_name {
    const char *hf, *gguf;
} hf_layer_name;

static const hf_layer_name hf_layer_names[] = {
    {"input_layernorm.weight", "attn_norm.weight"},
    {"self_attn.q_proj.weight", "attn_q.weight"},
    {"self_attn.k_proj.weight", "attn_k.weight"},
    {"self_attn.v_proj.weight", "attn_v.weight"},
    {"self_attn.qkv_proj.weight", "attn_qkv.weight"},
    {"self_attn.o_proj.weight", "attn_output.weight"},
    {"self_attn.q_proj.bias", "attn_q.bias"},
    {"self_attn.k_proj.bias", "attn_k.bias"},
    {"self_attn.v_proj.bias", "attn_v.bias"},
    {"self_attn.q_norm.weight", "attn_q_norm.weight"},
    {"self_attn.k_norm.weight", "attn_k_norm.weight"},
    {"post_attention_layernorm.weight", NULL}, /* ffn_norm, or post_attention_norm where post_norms */
    {"pre_feedforward_layernorm.weight", "ffn_norm.weight"},
    {"mlp.gate_proj.weight", "ffn_gate.weight"},
    {"mlp.up_proj.weight", "ffn_up.weight"},
    {"mlp.gate_up_proj.weight", "ffn_up.weight"},
    {"mlp.down_proj.weight", "ffn_down.weight"},
    {"post_feedforward_layernorm.weight", "post_ffw_norm.weight"},
};

/* ---------------------------------------------------------------- config.json */

typedef struct hf_config {
    const hf_arch *a;
    json_t *root;
    json_t *rope;           /* rope_parameters (transformers 5) or rope_scaling; its "full_attention" part if split; or NULL */
    json_t *rope_swa;       /* rope_parameters.sliding_attention, or NULL */
    int64_t V, C, L, F, NH, NKV, HS, n_ctx;
    bool has_head_dim;
    const char *path;
} hf_config;

static kiln_status load_json(const char *path, json_t **out) {
    json_error_t err;
    *out = json_load_file(path, 0, &err);
    if (!*out) return kiln_fail(KILN_ERR_FORMAT, "%s: not JSON (line %d: %s)", path, err.line, err.text);
    if (!json_is_object(*out)) {
        json_decref(*out);
        *out = NULL;
        return kiln_fail(KILN_ERR_FORMAT, "%s: not a JSON object", path);
    }
    return KILN_OK;
}

/* A positive integer key; absent gives def (or an error when def < 0). */
static kiln_status cfg_int(const hf_config *c, const char *k, int64_t def, int64_t *out) {
    json_t *v = json_object_get(c->root, k);
    if (!v || json_is_null(v)) {
        if (def < 0) return kiln_fail(KILN_ERR_NOT_FOUND, "%s: key '%s' is missing", c->path, k);
        *out = def;
        return KILN_OK;
    }
    if (!json_is_integer(v) || json_integer_value(v) <= 0 || json_integer_value(v) > (1ll << 40))
        return kiln_fail(KILN_ERR_FORMAT, "%s: key '%s' is not a positive integer", c->path, k);
    *out = json_integer_value(v);
    return KILN_OK;
}

/* A finite number of obj[k] into *out; false when absent or null. */
static bool num(json_t *obj, const char *k, double *out) {
    json_t *v = obj ? json_object_get(obj, k) : NULL;
    if (!json_is_number(v)) return false;
    *out = json_number_value(v);
    return isfinite(*out);
}

static const char *str(json_t *obj, const char *k) { return obj ? json_string_value(json_object_get(obj, k)) : NULL; }

static kiln_status read_config(const char *dir, char *path, size_t n, hf_config *c) {
    memset(c, 0, sizeof *c);
    snprintf(path, n, "%s/config.json", dir);
    c->path = path;
    kiln_status s = load_json(path, &c->root);
    if (s) return s;
    json_t *archs = json_object_get(c->root, "architectures");
    const char *name = json_string_value(json_array_get(archs, 0));
    if (!name) return kiln_fail(KILN_ERR_FORMAT, "%s: no \"architectures\" list", path);
    for (size_t i = 0; i < sizeof hf_archs / sizeof hf_archs[0]; i++)
        if (strcmp(name, hf_archs[i].hf) == 0) c->a = &hf_archs[i];
    if (!c->a)
        return kiln_fail(KILN_ERR_UNSUPPORTED,
                         "%s: architecture %s is not supported (kiln converts Llama, Mistral, Qwen2, Qwen3, Gemma2, Gemma3, Phi3, "
                         "SmolLM3 and Olmo2 ForCausalLM)",
                         path, name);
    if ((s = cfg_int(c, "vocab_size", -1, &c->V)) || (s = cfg_int(c, "hidden_size", -1, &c->C)) ||
        (s = cfg_int(c, "num_hidden_layers", -1, &c->L)) || (s = cfg_int(c, "intermediate_size", -1, &c->F)) ||
        (s = cfg_int(c, "num_attention_heads", -1, &c->NH)) || (s = cfg_int(c, "num_key_value_heads", c->NH, &c->NKV)) ||
        (s = cfg_int(c, "max_position_embeddings", 0, &c->n_ctx)))
        return s;
    c->has_head_dim = json_is_integer(json_object_get(c->root, "head_dim"));
    if ((s = cfg_int(c, "head_dim", c->C / c->NH, &c->HS))) return s;
    if (c->NH % c->NKV || c->HS % 2 || (!c->has_head_dim && c->C % c->NH))
        return kiln_fail(KILN_ERR_FORMAT, "%s: %lld heads, %lld KV heads and hidden_size %lld do not give whole, even heads", path,
                         (long long)c->NH, (long long)c->NKV, (long long)c->C);
    c->rope = json_object_get(c->root, "rope_parameters");
    if (!json_is_object(c->rope)) c->rope = json_object_get(c->root, "rope_scaling");
    if (!json_is_object(c->rope)) c->rope = NULL;
    if (c->rope && json_is_object(json_object_get(c->rope, "full_attention"))) {
        c->rope_swa = json_object_get(c->rope, "sliding_attention");
        c->rope = json_object_get(c->rope, "full_attention");
    }
    return KILN_OK;
}

static const char *rope_type(const hf_config *c) {
    const char *t = str(c->rope, "rope_type");
    return t ? t : str(c->rope, "type");
}

/* rope_theta from the rope parameters (transformers 5) or the top level. */
static bool rope_theta(const hf_config *c, double *out) { return num(c->rope, "rope_theta", out) || num(c->root, "rope_theta", out); }

/* original_max_position_embeddings from the rope parameters or the top level (Phi-3 keeps it there). */
static bool orig_ctx(const hf_config *c, double *out) {
    return num(c->rope, "original_max_position_embeddings", out) || num(c->root, "original_max_position_embeddings", out);
}

/* ---------------------------------------------------------------- metadata */

typedef struct kv_writer {
    kiln_gguf_writer *w;
    const char *arch;
    kiln_status s;
} kv_writer;

static const char *akey(const kv_writer *k, const char *suffix, char *buf, size_t n) {
    return kiln_arch_key(buf, n, k->arch, suffix);
}
static void kv_u32(kv_writer *k, const char *suffix, int64_t v) {
    char b[128];
    if (!k->s && (v < 0 || v > UINT32_MAX)) k->s = kiln_fail(KILN_ERR_RANGE, "%s.%s: %lld does not fit a u32", k->arch, suffix, (long long)v);
    if (!k->s) k->s = kiln_gguf_writer_set_u32(k->w, akey(k, suffix, b, sizeof b), (uint32_t)v);
}
static void kv_f32(kv_writer *k, const char *suffix, double v) {
    char b[128];
    if (!k->s) k->s = kiln_gguf_writer_set_f32(k->w, akey(k, suffix, b, sizeof b), (float)v);
}
static void kv_str(kv_writer *k, const char *suffix, const char *v) {
    char b[128];
    if (!k->s) k->s = kiln_gguf_writer_set_str(k->w, akey(k, suffix, b, sizeof b), v);
}

/* TextModel.set_gguf_parameters' RoPE scaling keys: linear and yarn (and longrope's type; llama3 is a tensor). */
static void write_rope_scaling(kv_writer *k, const hf_config *c) {
    const char *t = rope_type(c);
    double f, v;
    if (!t || !num(c->rope, "factor", &f)) return;
    if (strcmp(t, "linear") == 0) {
        kv_str(k, "rope.scaling.type", "linear");
        kv_f32(k, "rope.scaling.factor", f);
    } else if (strcmp(t, "yarn") == 0) {
        kv_str(k, "rope.scaling.type", "yarn");
        kv_f32(k, "rope.scaling.factor", f);
        if (orig_ctx(c, &v)) kv_u32(k, "rope.scaling.original_context_length", (int64_t)v);
        if (num(c->rope, "extrapolation_factor", &v)) kv_f32(k, "rope.scaling.yarn_ext_factor", v);
        if (num(c->rope, "attention_factor", &v) || num(c->rope, "attn_factor", &v)) kv_f32(k, "rope.scaling.yarn_attn_factor", v);
        if (num(c->rope, "beta_fast", &v)) kv_f32(k, "rope.scaling.yarn_beta_fast", v);
        if (num(c->rope, "beta_slow", &v)) kv_f32(k, "rope.scaling.yarn_beta_slow", v);
    }
}

static kiln_status write_metadata(kiln_gguf_writer *w, const hf_config *c, const char *name, kiln_ftype ftype) {
    const hf_arch *a = c->a;
    kv_writer k = {w, a->arch, KILN_OK};
    double v;
    k.s = kiln_gguf_writer_set_str(w, "general.architecture", a->arch);
    if (!k.s) k.s = kiln_gguf_writer_set_str(w, "general.name", name);
    if (!k.s) k.s = kiln_gguf_writer_set_u32(w, "general.file_type", (uint32_t)ftype);
    kv_u32(&k, "block_count", c->L);
    if (c->n_ctx) kv_u32(&k, "context_length", c->n_ctx);
    kv_u32(&k, "embedding_length", c->C);
    kv_u32(&k, "feed_forward_length", c->F);
    kv_u32(&k, "attention.head_count", c->NH);
    kv_u32(&k, "attention.head_count_kv", c->NKV);
    bool phi3 = strcmp(a->arch, "phi3") == 0, gemma2 = strcmp(a->arch, "gemma2") == 0, gemma3 = strcmp(a->arch, "gemma3") == 0;
    if (!phi3 && !gemma2) write_rope_scaling(&k, c);
    if (rope_theta(c, &v) && !gemma2) kv_f32(&k, "rope.freq_base", v);
    else if (gemma3) kv_f32(&k, "rope.freq_base", 1e6);
    if (gemma3 && (num(c->rope_swa, "rope_theta", &v) || num(c->root, "rope_local_base_freq", &v))) kv_f32(&k, "rope.freq_base_swa", v);
    if (num(c->root, "rms_norm_eps", &v)) kv_f32(&k, "attention.layer_norm_rms_epsilon", v);
    else if (gemma3) kv_f32(&k, "attention.layer_norm_rms_epsilon", 1e-6);
    if (c->has_head_dim || gemma2 || gemma3) {
        kv_u32(&k, "attention.key_length", c->HS);
        kv_u32(&k, "attention.value_length", c->HS);
    }
    if (a->vocab_and_rope_dim) {
        kv_u32(&k, "vocab_size", c->V);
        kv_u32(&k, "rope.dimension_count", c->HS);
    }
    if (gemma2) {
        if (num(c->root, "attn_logit_softcapping", &v)) kv_f32(&k, "attn_logit_softcapping", v);
        if (num(c->root, "final_logit_softcapping", &v)) kv_f32(&k, "final_logit_softcapping", v);
        if (num(c->root, "sliding_window", &v)) kv_u32(&k, "attention.sliding_window", (int64_t)v);
    }
    if (gemma3) {
        double p;
        if (num(c->root, "final_logit_softcapping", &v) && v != 0) kv_f32(&k, "final_logit_softcapping", v);
        if ((!num(c->root, "sliding_window_pattern", &p) || p != 1) && num(c->root, "sliding_window", &v))
            kv_u32(&k, "attention.sliding_window", (int64_t)v);
    }
    if (phi3) {
        double rot = 1.0, oc;
        if (!num(c->rope, "partial_rotary_factor", &rot)) num(c->root, "partial_rotary_factor", &rot);
        if (!orig_ctx(c, &oc))
            return kiln_fail(KILN_ERR_NOT_FOUND, "%s: key 'original_max_position_embeddings' is missing (Phi-3 needs it)", c->path);
        kv_u32(&k, "rope.scaling.original_context_length", (int64_t)oc);
        kv_u32(&k, "rope.dimension_count", (int64_t)(rot * (double)c->C) / c->NH);
        kv_u32(&k, "attention.sliding_window", num(c->root, "sliding_window", &v) ? (int64_t)v : 0);
        double scale = (double)c->n_ctx / oc;
        const char *t = rope_type(c);
        if (json_is_array(json_object_get(c->rope, "long_factor")) && t) {
            if (strcmp(t, "su") == 0 || strcmp(t, "longrope") == 0)
                kv_f32(&k, "rope.scaling.attn_factor", scale > 1.0 ? sqrt(1 + log(scale) / log(oc)) : 1.0);
            else if (strcmp(t, "yarn") == 0)
                kv_f32(&k, "rope.scaling.attn_factor", scale > 1.0 ? 0.1 * log(scale) + 1.0 : 1.0);
            else if (!k.s)
                k.s = kiln_fail(KILN_ERR_UNSUPPORTED, "%s: Phi-3 rope_scaling type %s is not supported", c->path, t);
        }
    }
    if (strcmp(a->arch, "olmo2") == 0 && num(c->root, "sliding_window", &v))
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: an Olmo2 config with sliding_window (Olmo 3) is not supported", c->path);
    return k.s;
}

/* ---------------------------------------------------------------- tensors */

/* One tensor of the output: a checkpoint tensor (with its transform) or computed floats (RoPE factors). */
typedef struct out_tensor {
    char name[96];
    const kiln_st_tensor *src; /* or NULL for data */
    float *data;               /* n floats, owned; when src is NULL */
    int64_t n;
    int64_t permute_heads;     /* > 0: rows regrouped as LlamaModel.permute with this many heads */
    float shift;               /* added to every element (Gemma's norms: 1) */
    kiln_type type;
} out_tensor;

typedef struct out_list {
    out_tensor *t;
    size_t n, cap;
} out_list;

static out_tensor *out_add(out_list *o, const char *name) {
    if (o->n == o->cap) {
        size_t cap = o->cap ? 2 * o->cap : 128;
        out_tensor *nt = realloc(o->t, cap * sizeof *nt);
        if (!nt) return NULL;
        o->t = nt, o->cap = cap;
    }
    out_tensor *t = &o->t[o->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    return t;
}

static void out_free(out_list *o) {
    for (size_t i = 0; i < o->n; i++) free(o->t[i].data);
    free(o->t);
}

/* Adds checkpoint tensor hf_name as gguf_name, if the checkpoint has it. */
static kiln_status add_src(out_list *o, const kiln_st_set *st, const hf_config *c, const char *hf_name, const char *gguf_name,
                           kiln_type wtype) {
    kiln_st_tensor *t = kiln_st_find(st, hf_name);
    if (!t) return KILN_OK;
    out_tensor *x = out_add(o, gguf_name);
    if (!x) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    x->src = t;
    t->used = true;
    x->type = t->n_dims >= 2 ? wtype : KILN_TYPE_F32;
    if (c->a->norm_plus_one && strstr(hf_name, "norm.weight")) x->shift = 1.0f;
    if (c->a->permute_qk && (strstr(hf_name, "self_attn.q_proj.") || strstr(hf_name, "self_attn.k_proj."))) {
        x->permute_heads = strstr(hf_name, "q_proj") ? c->NH : c->NKV;
        if (t->shape[0] % (2 * x->permute_heads))
            return kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s' has %lld rows, not a multiple of 2 x %lld heads", t->file, hf_name,
                             (long long)t->shape[0], (long long)x->permute_heads);
    }
    return KILN_OK;
}

/* A computed F32 vector (the caller fills data). */
static out_tensor *add_vec(out_list *o, const char *name, int64_t n) {
    out_tensor *x = out_add(o, name);
    if (!x) return NULL;
    x->type = KILN_TYPE_F32;
    x->n = n;
    if (!(x->data = calloc((size_t)n, sizeof *x->data))) return NULL;
    return x;
}

/* Llama 3's frequency factors, as LlamaModel.generate_extra_tensors computes them. */
static kiln_status add_llama3_freqs(out_list *o, const hf_config *c) {
    double base = 10000, factor = 8, lo = 1, hi = 4, old = 8192;
    rope_theta(c, &base), num(c->rope, "factor", &factor), num(c->rope, "low_freq_factor", &lo),
        num(c->rope, "high_freq_factor", &hi), num(c->rope, "original_max_position_embeddings", &old);
    out_tensor *x = add_vec(o, "rope_freqs.weight", c->HS / 2);
    if (!x) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    /* in float32 throughout, as torch computes it there, so that the factors are llama.cpp's to the bit */
    const float lo_wavelen = (float)old / (float)lo, hi_wavelen = (float)old / (float)hi;
    for (int64_t i = 0; i < c->HS / 2; i++) {
        float freq = 1.0f / powf((float)base, (float)(2 * i) / (float)c->HS);
        float wavelen = (float)(2 * M_PI) / freq;
        if (wavelen < hi_wavelen) x->data[i] = 1;
        else if (wavelen > lo_wavelen) x->data[i] = (float)factor;
        else {
            float smooth = ((float)old / wavelen - (float)lo) / (float)(hi - lo);
            x->data[i] = 1.0f / ((1.0f - smooth) / (float)factor + smooth);
        }
    }
    return KILN_OK;
}

/* Phi-3's LongRoPE factors from rope_scaling.long_factor/short_factor. */
static kiln_status add_phi3_factors(out_list *o, const hf_config *c) {
    json_t *lf = json_object_get(c->rope, "long_factor"), *sf = json_object_get(c->rope, "short_factor");
    if (!json_is_array(lf)) return KILN_OK;
    double rot = 1.0;
    if (!num(c->rope, "partial_rotary_factor", &rot)) num(c->root, "partial_rotary_factor", &rot);
    int64_t half = (int64_t)(rot * (double)c->C) / c->NH / 2;
    if (!json_is_array(sf) || (int64_t)json_array_size(lf) != half || (int64_t)json_array_size(sf) != half)
        return kiln_fail(KILN_ERR_FORMAT, "%s: rope_scaling long_factor and short_factor must have %lld entries each", c->path, (long long)half);
    json_t *arrs[2] = {lf, sf};
    const char *names[2] = {"rope_factors_long.weight", "rope_factors_short.weight"};
    for (int k = 0; k < 2; k++) {
        out_tensor *x = add_vec(o, names[k], half);
        if (!x) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
        for (int64_t i = 0; i < half; i++) {
            json_t *e = json_array_get(arrs[k], (size_t)i);
            if (!json_is_number(e) || !isfinite(json_number_value(e)) || json_number_value(e) <= 0)
                return kiln_fail(KILN_ERR_FORMAT, "%s: %s entry %lld is not a positive number", c->path, names[k], (long long)i);
            x->data[i] = (float)json_number_value(e);
        }
    }
    return KILN_OK;
}

/* The output list in llama.cpp's order: embedding, RoPE factors, the layers, the final norm and head. Every
 * checkpoint tensor must be used (one left over is a layer kind this converter does not know). */
static kiln_status plan(out_list *o, kiln_st_set *st, const hf_config *c, kiln_type wtype) {
    kiln_status s = add_src(o, st, c, "model.embed_tokens.weight", "token_embd.weight", wtype);
    const char *rt = rope_type(c);
    if (!s && rt && strcmp(rt, "llama3") == 0) s = add_llama3_freqs(o, c);
    if (!s && strcmp(c->a->arch, "phi3") == 0) s = add_phi3_factors(o, c);
    for (int64_t l = 0; !s && l < c->L; l++)
        for (size_t i = 0; !s && i < sizeof hf_layer_names / sizeof hf_layer_names[0]; i++) {
            const char *g = hf_layer_names[i].gguf;
            if (!g) g = c->a->post_norms ? "post_attention_norm.weight" : "ffn_norm.weight";
            char hn[160], gn[96];
            snprintf(hn, sizeof hn, "model.layers.%lld.%s", (long long)l, hf_layer_names[i].hf);
            snprintf(gn, sizeof gn, "blk.%lld.%s", (long long)l, g);
            s = add_src(o, st, c, hn, gn, wtype);
        }
    if (!s) s = add_src(o, st, c, "model.norm.weight", "output_norm.weight", wtype);
    if (!s && !c->a->skip_lm_head) s = add_src(o, st, c, "lm_head.weight", "output.weight", wtype);
    for (size_t i = 0; !s && i < st->n; i++) {
        const kiln_st_tensor *t = &st->t[i];
        bool ignorable = strstr(t->name, "rotary_emb.inv_freq") || (c->a->skip_lm_head && strcmp(t->name, "lm_head.weight") == 0);
        if (!t->used && !ignorable)
            s = kiln_fail(KILN_ERR_UNSUPPORTED, "%s: tensor '%s' has no GGUF name for %s (kiln convert maps llama.cpp's)", t->file,
                          t->name, c->a->hf);
    }
    if (!s && !kiln_st_find(st, "model.embed_tokens.weight"))
        s = kiln_fail(KILN_ERR_NOT_FOUND, "the checkpoint has no model.embed_tokens.weight");
    return s;
}

/* GGUF's ne of a tensor: PyTorch's shape reversed. */
static int gguf_shape(const out_tensor *x, int64_t *ne) {
    if (!x->src) {
        ne[0] = x->n;
        return 1;
    }
    for (int d = 0; d < x->src->n_dims; d++) ne[d] = x->src->shape[x->src->n_dims - 1 - d];
    return x->src->n_dims;
}

/* Source row of output row r: LlamaModel.permute's (heads, 2, HS/2) -> (heads, HS/2, 2) regrouping. */
static int64_t src_row(const out_tensor *x, int64_t r) {
    if (x->permute_heads <= 0) return r;
    int64_t per = x->src->shape[0] / x->permute_heads, half = per / 2;
    int64_t h = r / per, j = r % per;
    return h * per + (j % 2) * half + j / 2;
}

static size_t type_bytes(kiln_type t) { return t == KILN_TYPE_F32 ? 4 : 2; }

static void store(kiln_type t, float f, uint8_t *dst) {
    if (t == KILN_TYPE_F32) memcpy(dst, &f, 4);
    else {
        uint16_t h = t == KILN_TYPE_F16 ? kiln_f32_to_fp16(f) : kiln_f32_to_bf16(f);
        memcpy(dst, &h, 2);
    }
}

/* Streams tensor i, a row at a time through a chunk buffer. A non-finite value is refused: it would poison every
 * logit downstream with no hint of where it came from. */
static kiln_status write_tensor(kiln_gguf_writer *w, int64_t i, const out_tensor *x, uint8_t *buf, size_t cap) {
    int64_t rows = 1, cols = x->src ? x->src->shape[x->src->n_dims - 1] : x->n;
    if (x->src)
        for (int d = 0; d < x->src->n_dims - 1; d++) rows *= x->src->shape[d];
    size_t eb = type_bytes(x->type), row_bytes = (size_t)cols * eb, used = 0;
    if (row_bytes > cap) return kiln_fail(KILN_ERR_UNSUPPORTED, "tensor '%s': a row of %lld elements is too long", x->name, (long long)cols);
    for (int64_t r = 0; r < rows; r++) {
        int64_t base = src_row(x, r) * cols;
        for (int64_t j = 0; j < cols; j++) {
            float f = (x->src ? kiln_st_get(x->src, base + j) : x->data[j]) + x->shift;
            if (!isfinite(f))
                return kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s' holds a non-finite value at element %lld", x->src ? x->src->file : "config",
                                 x->src ? x->src->name : x->name, (long long)(base + j));
            if (x->type == KILN_TYPE_F16 && !(fabsf(f) <= 65504.0f)) /* would round to an infinity */
                return kiln_fail(KILN_ERR_RANGE, "%s: tensor '%s' element %lld is %g, outside F16's range: convert with --type bf16 or f32",
                                 x->src ? x->src->file : "config", x->src ? x->src->name : x->name, (long long)(base + j), (double)f);
            store(x->type, f, buf + used + (size_t)j * eb);
        }
        used += row_bytes;
        if (used + row_bytes > cap || r == rows - 1) {
            kiln_status s = kiln_gguf_writer_write_part(w, i, buf, used);
            if (s) return s;
            used = 0;
        }
    }
    return KILN_OK;
}

/* ---------------------------------------------------------------- entry point */

static kiln_status convert(const char *dir, const char *out_path, kiln_type wtype, kiln_ftype ftype) {
    char cfg_path[4096];
    hf_config c;
    kiln_st_set st = {0};
    out_list o = {0};
    kiln_gguf_writer *w = NULL;
    uint8_t *buf = NULL;
    const size_t cap = 4u << 20;
    kiln_status s = read_config(dir, cfg_path, sizeof cfg_path, &c);
    if (!s) s = kiln_st_open_dir(dir, &st);
    if (!s) s = plan(&o, &st, &c, wtype);
    if (!s) s = kiln_gguf_writer_new(&w);
    const char *base = strrchr(dir, '/');
    char name[256];
    snprintf(name, sizeof name, "%s", base && base[1] ? base + 1 : dir);
    if (!s) s = write_metadata(w, &c, name, ftype);
    const kiln_st_tensor *emb = kiln_st_find(&st, "model.embed_tokens.weight");
    kiln_hf_tok_params tp = {c.a ? c.a->prefer_spm : false, emb ? emb->shape[0] : 0};
    if (!s) s = kiln_hf_tokenizer_write(w, dir, &tp);
    for (size_t i = 0; !s && i < o.n; i++) {
        int64_t ne[KILN_ST_MAX_DIMS];
        int nd = gguf_shape(&o.t[i], ne);
        s = kiln_gguf_writer_add_tensor(w, o.t[i].name, o.t[i].type, nd, ne, NULL);
    }
    if (!s && !(buf = malloc(cap))) s = kiln_fail(KILN_ERR_NOMEM, "out of memory");
    if (!s) s = kiln_gguf_writer_begin(w, out_path);
    for (size_t i = 0; !s && i < o.n; i++) s = write_tensor(w, (int64_t)i, &o.t[i], buf, cap);
    if (!s) s = kiln_gguf_writer_finish(w);
    free(buf);
    kiln_gguf_writer_free(w);
    out_free(&o);
    kiln_st_close(&st);
    json_decref(c.root);
    return s;
}

kiln_status kiln_convert_hf(const char *dir, const char *out_path, const kiln_convert_hf_params *p) {
    kiln_ftype ftype = p ? p->ftype : KILN_FTYPE_MOSTLY_F16;
    if (ftype == KILN_FTYPE_ALL_F32) return convert(dir, out_path, KILN_TYPE_F32, ftype);
    if (ftype == KILN_FTYPE_MOSTLY_F16) return convert(dir, out_path, KILN_TYPE_F16, ftype);
    if (ftype == KILN_FTYPE_MOSTLY_BF16) return convert(dir, out_path, KILN_TYPE_BF16, ftype);
    return kiln_fail(KILN_ERR_UNSUPPORTED, "kiln_convert_hf writes f32, f16 or bf16, not %s: quantize its F32 output with kiln_quantize_file",
                     kiln_ftype_name(ftype));
}
