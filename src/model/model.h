/* model.h: a llama-architecture model described once: its configuration, read from GGUF metadata, and
 * views of its weights, bound by tensor name with shape checks. The weights stay in the mmap (zero copy).
 * Inference (src/infer), training (src/train) and the CUDA backend (src/cuda) all start from this.
 *
 * Shapes follow GGUF: a weight's ne[0] is its input width (row length), ne[1] its output width, so a matmul
 * computes y[o] = dot(row o of W, x). Vocabulary: V vocab, C width, L layers, NH query heads, NKV KV heads,
 * HS head size, F FFN width. */
#ifndef KILN_MODEL_H
#define KILN_MODEL_H

#include "kiln.h"

typedef struct kiln_llama_config {
    int64_t n_vocab;     /* V */
    int64_t n_embd;      /* C */
    int64_t n_layer;     /* L */
    int64_t n_head;      /* NH */
    int64_t n_head_kv;   /* NKV */
    int64_t head_dim;    /* HS = C / NH */
    int64_t n_ff;        /* F */
    int64_t n_ctx_train; /* llama.context_length */
    int64_t rope_dim;    /* llama.rope.dimension_count, default HS */
    float rope_base;     /* llama.rope.freq_base, default 10000 */
    bool rope_neox;      /* false: interleaved pairs (llama); true: half-split (NeoX) */
    float rms_eps;       /* llama.attention.layer_norm_rms_epsilon, default 1e-5 */
    bool tied;           /* no output.weight: the head is token_embd */
} kiln_llama_config;

typedef struct kiln_llama_layer {
    const kiln_tensor_view *attn_norm; /* (C) f32 */
    const kiln_tensor_view *wq;        /* (NH*HS rows of C) */
    const kiln_tensor_view *wk;        /* (NKV*HS rows of C) */
    const kiln_tensor_view *wv;        /* (NKV*HS rows of C) */
    const kiln_tensor_view *wo;        /* (C rows of NH*HS) */
    const kiln_tensor_view *ffn_norm;  /* (C) f32 */
    const kiln_tensor_view *w_gate;    /* (F rows of C) */
    const kiln_tensor_view *w_up;      /* (F rows of C) */
    const kiln_tensor_view *w_down;    /* (C rows of F) */
} kiln_llama_layer;

struct kiln_model {
    kiln_gguf *gguf;                    /* owns the mmap every view points into */
    kiln_llama_config cfg;
    const kiln_tensor_view *tok_embd;   /* (V rows of C) */
    const kiln_tensor_view *output_norm;/* (C) f32 */
    const kiln_tensor_view *output;     /* (V rows of C); == tok_embd when tied */
    kiln_llama_layer *layers;           /* (L) */
    kiln_tokenizer *tokenizer;          /* NULL if the file has no tokenizer.ggml.* keys */
};

/* ---- the forward (llama.c), written once against an ops table (src/cpu/ops.h) ---- */
struct kiln_ops;
struct kiln_ops_ctx;

/* Floats of activations a batch of T tokens needs. */
size_t kiln_llama_act_floats(const kiln_llama_config *c, int64_t T);
/* The widest activation row (max of C, NH*HS, F). */
int64_t kiln_llama_max_width(const kiln_llama_config *c);
/* Runs T tokens at positions pos0.. through the model, writing their k and v into kv_cache
 * ((L, 2, n_ctx, NKV*HS) f16). logits gets the last token's V logits, or all T rows when all_logits. */
void kiln_llama_forward(const kiln_model *m, const struct kiln_ops *ops, struct kiln_ops_ctx *ctx, uint16_t *kv_cache, int64_t n_ctx,
                        float *act, const int32_t *ids, int64_t T, int64_t pos0, float *logits, bool all_logits);

#endif
