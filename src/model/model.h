/* model.h: a llama-architecture model described once: its configuration, read from GGUF metadata, and
 * views of its weights, bound by tensor name with shape checks. The weights stay in the mmap (zero copy).
 * Inference (src/infer), training (src/train) and the CUDA backend (src/cuda) all start from this.
 *
 * One forward serves llama and its relatives (qwen2, qwen3, mistral3, phi3, gemma2, gemma3, smollm3, olmo2, Muse's
 * own features): each difference is a flag of the config or of a layer, read from metadata under the architecture's
 * prefix (<arch>. below: llama., qwen2., gemma3., ...). A zeroed flag is plain llama, so a config built by hand (training) stays llama.
 *
 * Shapes follow GGUF: a weight's ne[0] is its input width (row length), ne[1] its output width, so a matmul
 * computes y[o] = dot(row o of W, x). Vocabulary: V vocab, C width, L layers, NH query heads, NKV KV heads,
 * HS head size, F FFN width. */
#ifndef KILN_MODEL_H
#define KILN_MODEL_H

#include "kiln.h"

#ifdef __cplusplus
extern "C" { /* the CUDA backend (src/cuda/engine.cu, trainer.cu) reads the config and the tensor table */
#endif

/* ---- RoPE scaling (rope.c), read from <arch>.rope.scaling.* as llama.cpp reads them (llama-model.cpp,
 * llama-context.cpp) and overridable with kiln_model_set_rope. Every kind reduces to a per-pair multiplier of the
 * unscaled angle and a factor on cos and sin (kiln_rope). */
typedef enum kiln_rope_kind {
    KILN_ROPE_KIND_NONE,     /* no scaling (also rope.scaling.type "none") */
    KILN_ROPE_KIND_LINEAR,   /* positions times freq_scale = 1 / rope.scaling.factor */
    KILN_ROPE_KIND_YARN,     /* YaRN: ggml's rope_yarn ramp between interpolated and extrapolated angles, mscale */
    KILN_ROPE_KIND_LONGROPE, /* Phi-3: rope_factors_{long,short}.weight divide the frequencies, attn_factor on cos/sin */
} kiln_rope_kind;

typedef struct kiln_rope_scaling_cfg {
    kiln_rope_kind kind;
    float factor;          /* rope.scaling.factor (linear, yarn, llama3); 0 absent: freq_scale 1 */
    float freq_scale;      /* the angles' scale: 1 / factor (llama.cpp's rope_freq_scale), 1 for none/longrope/llama3 */
    int64_t orig_ctx;      /* rope.scaling.original_context_length, default context_length (n_ctx_orig_yarn) */
    float attn_factor;     /* rope.scaling.attn_factor (hparams.rope_attn_factor), default 1; LongRoPE without the
                            * key: sqrt(1 + ln(s) / ln(orig_ctx)), s = context_length / orig_ctx, as Phi-3's converter */
    float ext_factor;      /* rope.scaling.yarn_ext_factor; negative: unset (1 for yarn, else 0) */
    float yarn_attn_factor;/* rope.scaling.yarn_attn_factor, default 1 (llama.cpp replaces it when ext_factor != 0) */
    float beta_fast, beta_slow; /* rope.scaling.yarn_beta_fast / _slow, default 32 and 1 */
    bool llama3;           /* rope.scaling.type "llama3" (kiln's keys; llama.cpp reads rope_freqs.weight instead): the
                            * frequency factors of HF's llama3 rope_type, when the file has no rope_freqs.weight; the
                            * kind is then none, as llama.cpp applies the factors under any type */
    float low_freq_factor, high_freq_factor; /* llama3: rope.scaling.low_freq_factor / high_freq_factor (1, 4) */
    bool swa_unscaled;     /* sliding layers keep freq_scale 1 (llama.cpp's rope_freq_scale_train_swa: gemma3) */
} kiln_rope_scaling_cfg;

/* A layer's RoPE after scaling: pair i of position p turns by theta_i(p) * freq[i], theta_i(p) the unscaled angle
 * p * base^(-2i/rope_dim) in llama.cpp's float recurrence (ops_rope.c), and cos, sin are multiplied by mscale.
 * freq folds freq_scale, YaRN's ramp and the frequency factors: freq[i] = (s (1 - mix_i) + mix_i) / ff_i, which
 * is ggml's rope_yarn on theta / ff rearranged; freq NULL and mscale 1 is the unscaled rotation, bit for bit. */
typedef struct kiln_rope {
    const float *freq; /* (rope_dim / 2), owned by the model; NULL: every multiplier is 1 */
    float mscale;
} kiln_rope;

typedef struct kiln_llama_config {
    int64_t n_vocab;     /* V */
    int64_t n_embd;      /* C */
    int64_t n_layer;     /* L */
    int64_t n_head;      /* NH */
    int64_t n_head_kv;   /* NKV */
    int64_t head_dim;    /* HS: <arch>.attention.key_length, default C / NH (gemma3 1B: 256 with C/NH = 288) */
    int64_t n_ff;        /* F */
    int64_t n_ctx_train; /* <arch>.context_length */
    int64_t rope_dim;    /* <arch>.rope.dimension_count, default HS */
    float rope_base;     /* <arch>.rope.freq_base, default 10000; the global layers' base */
    bool rope_neox;      /* false: interleaved pairs (llama); true: half-split (NeoX: qwen2, gemma3) */
    float rms_eps;       /* <arch>.attention.layer_norm_rms_epsilon, default 1e-5 (gemma3 1e-6) */
    bool tied;           /* no output.weight: the head is token_embd */

    /* ---- architecture features (#6); every one off when zero. qkv_bias, qk_norm and sandwich_norm are implied by
     * the architecture or, in any file, by layer 0 having the tensors (then every layer must) */
    bool qkv_bias;        /* blk.N.attn_{q,k,v}.bias (NH*HS, NKV*HS, NKV*HS) f32 added after the projections (qwen2) */
    bool qk_norm;         /* blk.N.attn_{q,k}_norm.weight (HS) f32: RMSNorm over each head of q and k, eps rms_eps,
                           * before RoPE (gemma3) */
    bool output_gate;     /* <arch>.attention.output_gate (bool, Muse): att *= sigmoid(xn Wg) elementwise before wo,
                           * xn the normed block input, Wg = blk.N.attn_gate.weight (NH*HS rows of C) */
    bool sandwich_norm;   /* blk.N.post_attention_norm.weight, blk.N.post_ffw_norm.weight (C) f32: RMSNorm of each
                           * block's output before the residual add, eps post_norm_eps (gemma3) */
    float post_norm_eps;  /* <arch>.attention.layer_norm_rms_epsilon_post (Muse), default rms_eps */
    bool geglu;           /* ffn = down(gelu_tanh(gate) * up) instead of silu (gemma) */
    bool embd_scale;      /* x = embedding * sqrtf(C) (gemma; llama.cpp's ggml_scale by sqrtf(n_embd)) */
    float logit_scale;    /* <arch>.logit_scale (Muse): logits *= it before the softcap; 0 means 1 */
    float logit_softcap;  /* <arch>.final_logit_softcapping (gemma2, Muse): logits = cap tanh(logits / cap); 0 off */
    int64_t sliding_window; /* <arch>.attention.sliding_window: a sliding layer's query at p sees p - W + 1 .. p; 0 off */
    int64_t swa_pattern;  /* <arch>.attention.sliding_window_pattern (u32): layer l slides iff l % P < P - 1, so
                           * every P-th layer is global (gemma3: 6, llama.cpp's set_swa_pattern(6)); 0 or absent:
                           * every layer slides when sliding_window is set (gemma3's default is 6). The key may
                           * instead be an array of L flags (nonzero: sliding), read into the layers' window */
    float attn_scale;     /* <arch>.attention.scale (llama.cpp's key, granite): the attention's score scale, 0 meaning
                           * 1/sqrt(HS); gemma3 27B (62 layers) uses 1/sqrt(C/NH) as llama.cpp's f_attention_scale
                           * (gemma_pytorch's query_pre_attn_scalar). Applied by scaling q before attention */
    float rope_base_local;/* sliding layers' RoPE base: <arch>.rope.local.freq_base (Muse) or .rope.freq_base_swa
                           * (llama.cpp's key), gemma3 10000 without either (llama.cpp's rope_freq_base_train_swa
                           * default); 0 means rope_base */
    float attn_softcap;   /* <arch>.attn_logit_softcapping (gemma2, default 50 as llama.cpp): each attention score
                           * s = cap tanh(s / cap) after the scale, before the mask and softmax; 0 off */
    bool qk_norm_full;    /* with qk_norm: one RMSNorm over each token's whole q (NH*HS) and k (NKV*HS), the norms'
                           * weights that wide (olmo2), instead of one per head */
    bool no_pre_norm;     /* no attn_norm / ffn_norm: a block's input is the residual stream itself (olmo2, which
                           * norms each block's output instead: sandwich_norm's post-norms) */
    bool fused_qkv;       /* blk.N.attn_qkv.weight (Q + 2 KV rows of C: q, then k, then v) instead of attn_{q,k,v}
                           * (phi3; any file whose layer 0 has it); wq, wk, wv are row views into it */
    bool fused_gate_up;   /* blk.N.ffn_up.weight holds 2F rows, gate then up, and there is no ffn_gate (phi3; llama.cpp's
                           * LLM_FFN_SWIGLU split: the first half goes through silu); w_gate, w_up are row views */
    kiln_rope_scaling_cfg rope_scaling; /* <arch>.rope.scaling.* (rope.c); all zero: unscaled */
} kiln_llama_config;

/* ---- each layer's tensors, listed once (tensors.c). The table drives binding (model.c), synth, convert, the
 * training layout, the GPU upload and the memory sizing: a new per-layer tensor is one row here and one field
 * below, in the same place. */
typedef enum kiln_layer_tensor {
    KILN_LT_ATTN_NORM, KILN_LT_WQ, KILN_LT_WK, KILN_LT_WV, KILN_LT_WO, KILN_LT_FFN_NORM, KILN_LT_W_GATE, KILN_LT_W_UP,
    KILN_LT_W_DOWN, KILN_LT_BQ, KILN_LT_BK, KILN_LT_BV, KILN_LT_Q_NORM, KILN_LT_K_NORM, KILN_LT_ATTN_GATE,
    KILN_LT_POST_ATTN_NORM, KILN_LT_POST_FFN_NORM,
    KILN_LT_COUNT
} kiln_layer_tensor;

/* A shape rule: one of the config's widths (ONE for the second dimension of a vector);
 * QNORM and KNORM: the QK-norm weights' width, HS, or Q and KV with qk_norm_full. */
typedef enum kiln_dim { KILN_DIM_ONE, KILN_DIM_C, KILN_DIM_Q, KILN_DIM_KV, KILN_DIM_F, KILN_DIM_HS, KILN_DIM_QNORM, KILN_DIM_KNORM } kiln_dim;
/* Which config flag needs a tensor (ALWAYS: every llama layer has it; PRE_NORM: unless no_pre_norm). */
typedef enum kiln_need {
    KILN_NEED_ALWAYS, KILN_NEED_QKV_BIAS, KILN_NEED_QK_NORM, KILN_NEED_OUTPUT_GATE, KILN_NEED_SANDWICH_NORM, KILN_NEED_PRE_NORM
} kiln_need;

typedef struct kiln_tensor_spec {
    const char *suffix; /* GGUF name after "blk.N." */
    kiln_dim ne0, ne1;  /* ne[0] (the row length) and ne[1] (rows; ONE: a vector, which must be F32) */
    kiln_need need;
    bool decay;         /* training: AdamW weight decay applies (the matrices) */
    bool residual;      /* training: a projection into the residual stream, initialized with std / sqrt(2L) */
} kiln_tensor_spec;

extern const kiln_tensor_spec kiln_layer_tensors[KILN_LT_COUNT];
/* The size a shape rule gives under config c. */
int64_t kiln_dim_size(const kiln_llama_config *c, kiln_dim d);
/* Whether a layer of config c has tensor i. */
bool kiln_layer_has(const kiln_llama_config *c, kiln_layer_tensor i);
/* "blk.<l>.<suffix>" into buf (n >= 64). */
const char *kiln_layer_tensor_name(char *buf, size_t n, int64_t l, kiln_layer_tensor i);
/* "<arch>.<suffix>" into buf (n bytes, truncated to fit): a metadata key under the architecture's prefix, as read
 * (model.c, rope.c) and written (synth.c, convert_hf.c). Returns buf. */
const char *kiln_arch_key(char *buf, size_t n, const char *arch, const char *suffix);
/* Elements of tensor i under c (ne0 * ne1). */
int64_t kiln_layer_tensor_elems(const kiln_llama_config *c, kiln_layer_tensor i);

typedef struct kiln_llama_layer {
    union {
        const kiln_tensor_view *t[KILN_LT_COUNT]; /* by kiln_layer_tensor; NULL where the config has no such tensor */
        struct {                                   /* the same, by name, in the table's order */
            const kiln_tensor_view *attn_norm; /* (C) f32; NULL with no_pre_norm */
            const kiln_tensor_view *wq;        /* (NH*HS rows of C) */
            const kiln_tensor_view *wk;        /* (NKV*HS rows of C) */
            const kiln_tensor_view *wv;        /* (NKV*HS rows of C) */
            const kiln_tensor_view *wo;        /* (C rows of NH*HS) */
            const kiln_tensor_view *ffn_norm;  /* (C) f32; NULL with no_pre_norm */
            const kiln_tensor_view *w_gate;    /* (F rows of C) */
            const kiln_tensor_view *w_up;      /* (F rows of C) */
            const kiln_tensor_view *w_down;    /* (C rows of F) */
            const kiln_tensor_view *bq, *bk, *bv;    /* (NH*HS), (NKV*HS), (NKV*HS) f32: qkv_bias */
            const kiln_tensor_view *q_norm, *k_norm; /* (HS) f32: qk_norm; (NH*HS), (NKV*HS) with qk_norm_full */
            const kiln_tensor_view *w_attn_gate;     /* (NH*HS rows of C): output_gate */
            const kiln_tensor_view *post_attn_norm;  /* (C) f32: sandwich_norm */
            const kiln_tensor_view *post_ffn_norm;   /* (C) f32: sandwich_norm */
        };
    };
    bool nope;        /* no RoPE on this layer: <arch>.attention.nope_layers (array of layer indexes, Muse) */
    int64_t window;   /* sliding window of this layer (cfg.sliding_window and swa_pattern), 0: full attention */
    float rope_base;  /* cfg.rope_base, or rope_base_local on a sliding layer */
    kiln_rope rope;      /* the scaled RoPE of this layer (rope.c) */
    kiln_rope rope_long; /* LongRoPE's long factors, used when the session's context exceeds
                          * cfg.rope_scaling.orig_ctx (llama.cpp's get_rope_factors); freq NULL without them */
} kiln_llama_layer;

struct kiln_model {
    kiln_gguf *gguf;                    /* owns the mmap every view points into */
    kiln_llama_config cfg;
    const kiln_tensor_view *tok_embd;   /* (V rows of C) */
    const kiln_tensor_view *output_norm;/* (C) f32 */
    const kiln_tensor_view *output;     /* (V rows of C); == tok_embd when tied */
    kiln_llama_layer *layers;           /* (L) */
    kiln_tensor_view *views;            /* (L, 5) row views into fused tensors (fused_qkv: q, k, v; fused_gate_up:
                                         * gate, up), which layers point at; NULL when nothing is fused */
    kiln_tokenizer *tokenizer;          /* NULL if the file has no tokenizer.ggml.* keys */
    float *rope_freq;                   /* (2, L, rope_dim / 2): the layers' kiln_rope tables, NULL unscaled */
};

/* ---- the forward (llama.c), written once against the backend seam (backend.h) ---- */

/* The KV cache as the forward sees it: layer l keeps the key and value of position p in row p % rows[l] of
 * k[l] and v[l] ((rows[l], NKV*HS) of type_k and type_v, kiln_kv_row_bytes(type, NKV*HS) bytes a row). rows[l] is
 * the context for a full layer and a ring of at least window + T - 1 rows for a sliding one (T the largest batch), so a batch never overwrites keys its first query
 * still sees. */
typedef struct kiln_llama_kv {
    void **k, **v;       /* (L) */
    const int64_t *rows; /* (L) */
    int64_t n_ctx;       /* the session's context: picks LongRoPE's long or short factors */
    kiln_kv_type type_k, type_v;
} kiln_llama_kv;

/* ---- RoPE scaling (rope.c) */

/* Reads <arch>.rope.scaling.* into c->rope_scaling (c's rope fields and n_ctx_train already read); an unknown type
 * or a key out of its domain is an error naming it. */
kiln_status kiln_rope_read_config(const kiln_gguf *g, const char *arch, kiln_llama_config *c);
/* Builds every layer's kiln_rope from m's config, its layers' bases and the frequency-factor tensors
 * (rope_freqs.weight, rope_factors_long/short.weight), replacing the tables built before. */
kiln_status kiln_rope_build_model(kiln_model *m);
/* One table: freq (rope_dim / 2) and *mscale for a layer of RoPE base `base` and freq_scale fs, with frequency
 * factors ff (rope_dim / 2, NULL: all 1). What the model load and the trainers use. */
void kiln_rope_table(const kiln_rope_scaling_cfg *sc, int64_t rope_dim, float base, float fs, const float *ff, float *freq,
                     float *mscale);
/* The global layers' table from c alone (no tensors; llama3's factors from its keys), as the trainers use it: *freq
 * (rope_dim / 2, malloc'd) or NULL when unscaled, and *mscale. */
kiln_status kiln_rope_config_table(const kiln_llama_config *c, float **freq, float *mscale);
/* Writes c's scaling as <arch>.rope.scaling.* keys (nothing when unscaled); LongRoPE, which needs its tensors, is
 * KILN_ERR_UNSUPPORTED. */
kiln_status kiln_rope_write_config(kiln_gguf_writer *w, const char *arch, const kiln_rope_scaling_cfg *sc);
/* The layer's kiln_rope for a context of n_ctx positions. */
kiln_rope kiln_llama_layer_rope(const kiln_model *m, int64_t l, int64_t n_ctx);

/* The widest activation row (max of C, NH*HS, F). */
int64_t kiln_llama_max_width(const kiln_llama_config *c);

#ifdef __cplusplus
}
#endif

#endif
