/* llama_train.h: a llama model being trained on the CPU: its parameters as one flat fp32 buffer (the master weights)
 * with a gradient buffer of the same layout and, for mixed precision, a bf16 compute mirror; the activations a
 * forward saves for the backward; and the forward, loss and backward, written once against the ops table
 * (src/cpu/ops.h). The layout is a table of tensors named as in a llama GGUF, built from model.h's per-layer table
 * (kiln_layer_tensors), so a model converts to and from GGUF by name (src/train/checkpoint.c). The GPU trainer
 * (src/cuda/trainer.cu) reads the same layout (kiln_llama_train_layout: the table without the buffers) and has its
 * own orchestration, for its precision and fusions.
 *
 * tests/test_train.c checks the loss, every parameter gradient and ten AdamW steps against a reference dump
 * from tests/ref/train_ref.py (JAX, float64), and the training forward against the inference forward. */
#ifndef KILN_MODEL_LLAMA_TRAIN_H
#define KILN_MODEL_LLAMA_TRAIN_H

#include "model/model.h"
#include "cpu/ops.h"

/* One parameter tensor: a GGUF name, its GGUF shape (ne[0] is the row length) and where it lies in the
 * flat buffers. decay: AdamW weight decay applies (matrices, not norms; the embedding by default not). */
typedef struct kiln_train_tensor {
    char name[64];
    int n_dims;
    int64_t ne[2];
    int64_t offset, n; /* elements */
    bool decay;
    bool residual;     /* a projection into the residual stream: initialized with std / sqrt(2L) */
} kiln_train_tensor;

/* Tensor indexes of one layer in kiln_llama_train.tensors, by kiln_layer_tensor; -1 where the layer has no such
 * tensor. Training computes the plain llama layer only (kiln_llama_train_new refuses the rest), so the indexes
 * past w_down are -1 today. */
typedef struct kiln_train_layer {
    union {
        int t[KILN_LT_COUNT];
        struct { /* the same, by name, in the table's order */
            int attn_norm, wq, wk, wv, wo, ffn_norm, w_gate, w_up, w_down;
            int bq, bk, bv, q_norm, k_norm, w_attn_gate, post_attn_norm, post_ffn_norm;
        };
    };
} kiln_train_layer;

typedef struct kiln_llama_train {
    kiln_llama_config cfg;
    kiln_train_tensor *tensors; /* (n_tensors) */
    int n_tensors;
    int tok_embd, output_norm, output; /* tensor indexes; output == tok_embd when cfg.tied */
    kiln_train_layer *layers;          /* (L) */
    int64_t n_params;
    float *params;    /* (n_params) fp32 master weights; NULL in a layout */
    float *grads;     /* (n_params) fp32, accumulated by the backward; NULL in a layout */
    uint16_t *mirror; /* (n_params) bf16 copy the matmuls read, or NULL: they read params */

    /* the batch the activations are sized for (kiln_llama_train_reserve) */
    int64_t B, T;
    float *acts;      /* saved activations, see llama_train.c */
    float *dacts;     /* gradient work buffers */
    int32_t *pos;     /* (B*T) positions t of each row, for RoPE */
    float *rope_freq; /* (rope_dim / 2) RoPE's scaled angle multipliers from cfg.rope_scaling (rope.c), NULL unscaled */
    float rope_mscale;
    int32_t *ids;     /* (B*T) copy of the last inputs, for the embedding backward */
    void *scratch;    /* ops scratch */
    size_t scratch_bytes;
    size_t act_bytes; /* acts + dacts + scratch, for reports */

    float label_smoothing, z_loss; /* of the loss, 0 and 0 by default */
    int64_t n_embed_skipped;       /* rows of non-finite embedding gradient skipped so far */
} kiln_llama_train;

/* A model of this config with zeroed parameters; mixed: keep a bf16 mirror for the matmuls. The config needs
 * n_vocab, n_embd, n_layer, n_head, n_head_kv, n_ff, rope_base, rms_eps and tied; head_dim and rope_dim are
 * derived (rope_dim = head_dim). */
kiln_status kiln_llama_train_new(const kiln_llama_config *cfg, bool mixed, kiln_llama_train **out);
/* The same config and tensor table without any buffer (params, grads and mirror NULL): the layout a trainer that
 * keeps its parameters elsewhere (the GPU) reads. */
kiln_status kiln_llama_train_layout(const kiln_llama_config *cfg, kiln_llama_train **out);
void kiln_llama_train_free(kiln_llama_train *m); /* accepts NULL */

/* Where streamed parameters go: n floats x for the flat buffer's elements [offset, offset + n), in increasing
 * offsets; x is valid during the call only. */
typedef kiln_status (*kiln_param_sink)(void *ctx, int64_t offset, const float *x, int64_t n);

/* GPT-2 style init from seed: matrices and the embedding N(0, 0.02), the residual projections (the table's residual
 * mark: wo, w_down) N(0, 0.02/sqrt(2L)), norms 1. Refreshes the mirror. */
void kiln_llama_train_init_random(kiln_llama_train *m, uint64_t seed);
/* The same values for m's layout into sink, tensor by tensor in chunks of at most KILN_TRAIN_CHUNK floats. */
kiln_status kiln_llama_train_stream_random(const kiln_llama_train *m, uint64_t seed, kiln_param_sink sink, void *ctx);
#define KILN_TRAIN_CHUNK (1 << 20)
/* The config of a loaded model if training computes it (KILN_ERR_UNSUPPORTED naming what it lacks otherwise). */
kiln_status kiln_llama_train_check_model(const kiln_model *src, kiln_llama_config *cfg);
/* The weights of src (any block type, dequantized to fp32) for m's layout into sink: F32 tensors straight from the
 * mmap, others in chunks of rows of at most KILN_TRAIN_CHUNK floats. KILN_ERR_FORMAT for a missing or misshapen
 * tensor. */
kiln_status kiln_llama_train_stream_model(const kiln_llama_train *m, const kiln_model *src, kiln_param_sink sink, void *ctx);
/* kiln_llama_train_new for src's config with its weights. Refreshes the mirror. */
kiln_status kiln_llama_train_from_model(const kiln_model *src, bool mixed, kiln_llama_train **out);
/* The mirror from the master weights (after loading or changing params outside the optimizer). */
void kiln_llama_train_refresh_mirror(kiln_llama_train *m);

/* Sizes the activations and scratch for batches of B sequences of T tokens (T <= cfg.n_ctx_train). */
kiln_status kiln_llama_train_reserve(kiln_llama_train *m, int64_t B, int64_t T, int n_threads);

/* Forward of inputs (B*T ids < V) and the loss against targets (B*T; ignore_index -1 is skipped). When
 * grad_scale != 0, the backward follows and grads += grad_scale * d(sum of counted losses)/d(params): with
 * grad_scale = 1/n_counted that is the gradient of the mean loss; the activation gradients are work buffers that
 * each step overwrites (src/train/trainer.h states the convention). Returns the sum of the counted rows'
 * losses; *n_counted gets their number. pool threads run the ops. */
double kiln_llama_train_step(kiln_llama_train *m, const kiln_ops *ops, kiln_pool *pool, const int32_t *inputs,
                             const int32_t *targets, float grad_scale, int64_t *n_counted);
/* The forward alone: logits (B*T, V) of inputs, valid until the next call. */
const float *kiln_llama_train_logits(kiln_llama_train *m, const kiln_ops *ops, kiln_pool *pool, const int32_t *inputs);

/* The number of counted targets (not -1) in n targets. */
int64_t kiln_count_targets(const int32_t *targets, int64_t n);

#endif
