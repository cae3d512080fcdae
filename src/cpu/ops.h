/* ops.h: the CPU kernels as a table (kiln_cpu_ops, src/cpu/ops.c), forward and backward. The inference forward
 * reaches them through the CPU backend of the seam (src/model/backend.h, src/cpu/backend.c), which builds each of
 * the forward's fused steps out of them; the CPU trainer (src/train/llama_train.c) calls them directly. The scalar
 * path is the oracle: the SIMD paths are tested against it op by op (tests/test_ops.c), and the CUDA kernels
 * against it (tests/test_cuda_*.c). Each op's backward lives in the same file as its forward; tests/test_grad.c checks
 * every backward against central finite differences of a double-precision forward.
 *
 * Shapes: T tokens in a batch, C width, NH/NKV heads, HS head size, F FFN width, V vocab. Activations are
 * float, row-major, (T, width). Weights are GGUF tensor views: row o of W (ne[0] wide) makes output o. */
#ifndef KILN_OPS_H
#define KILN_OPS_H

#include "kiln.h"
#include "pool.h"

typedef struct kiln_ops_ctx {
    kiln_pool *pool; /* threads for every op */
    void *scratch;   /* ops may use this much scratch: activation rows quantized for vec_dot, attention scores */
    size_t scratch_bytes;
    struct kiln_prepared *prepared; /* weights in the backend's own layout (prepare_weights), or NULL */
} kiln_ops_ctx;

typedef struct kiln_ops {
    /* out (T, C) = rows ids[t] of table (V rows of C), dequantizing only those rows. Ids must be < V
     * (sessions validate them). */
    void (*embed_forward)(kiln_ops_ctx *ctx, float *out, const kiln_tensor_view *table, const int32_t *ids, int64_t T);
    /* out (T, C) = x / rms(x) * w, rms over C with eps inside the sqrt. out may equal x. */
    void (*rmsnorm_forward)(kiln_ops_ctx *ctx, float *out, const float *x, const float *w, int64_t T, int64_t C, float eps);
    /* y (T, O) = x (T, I) W^T for W of O rows of I; x rows are quantized once to W's vec_dot_type. */
    void (*matmul_forward)(kiln_ops_ctx *ctx, float *y, const float *x, const kiln_tensor_view *W, int64_t T);
    /* n matmuls of one input, y[i] (T, O_i) = x W[i]^T, as one job: x is quantized once and the rows of all n
     * weights are shared over the threads together (the forward's q, k, v, and gate, up). */
    void (*matmul_n_forward)(kiln_ops_ctx *ctx, int n, float *const *y, const float *x, const kiln_tensor_view *const *W,
                             int64_t T);
    /* Copies weights that matmuls will be given into the backend's own layout, owned by ctx until
     * release_weights; matmuls of the others read them in place. The CPU repacks the block formats it has VNNI
     * kernels for, 16 rows interleaved (ops_repack.c). drop_source: the views point into a read-only file
     * mapping (kiln_model_load's) whose pages the copies replace; each is dropped from the process once copied,
     * so resident memory holds the weights once. */
    kiln_status (*prepare_weights)(kiln_ops_ctx *ctx, const kiln_tensor_view *const *W, int64_t n, bool drop_source);
    void (*release_weights)(kiln_ops_ctx *ctx); /* accepts a ctx with nothing prepared */
    /* Rotates the first rope_dim of each head of x (T, n_heads*HS) in place, token t at position pos[t]:
     * theta_i = pos * base^(-2i/rope_dim) (llama.cpp's float recurrence) times freq[i] (rope_dim/2; NULL: 1), cos and sin
     * times mscale (kiln_rope, model.h). Interleaved pairs (2i, 2i+1) when !neox, halves (i, i+rope_dim/2) when neox. */
    void (*rope_forward)(kiln_ops_ctx *ctx, float *x, const int32_t *pos, int64_t T, int64_t n_heads, int64_t HS,
                         int64_t rope_dim, float base, const float *freq, float mscale, bool neox);
    /* Causal attention with GQA. q (T, NH*HS) at positions pos0..pos0+T-1; the cache holds k and v (f16,
     * (n_ctx, NKV*HS) each) for positions 0..pos0+T-1, this batch's included. out (T, NH*HS). Scale 1/sqrt(HS). */
    void (*attention_forward)(kiln_ops_ctx *ctx, float *out, const float *q, const uint16_t *k_cache, const uint16_t *v_cache,
                              int64_t pos0, int64_t T, int64_t NH, int64_t NKV, int64_t HS);
    /* out (n) = silu(gate) * up; out may equal gate. */
    void (*swiglu_forward)(kiln_ops_ctx *ctx, float *out, const float *gate, const float *up, int64_t n);
    /* As attention_forward with a sliding window and a ring cache (#6): the query at position p sees positions
     * max(0, p - window + 1) .. p (window 0: all), and position j is row j % rows of each cache. rows is n_ctx
     * for a full cache, or a ring of at least window + T - 1 rows. softcap > 0: each score s (after the scale)
     * becomes softcap tanh(s / softcap) (gemma2's attn_logit_softcapping); 0: none. */
    void (*attention_window_forward)(kiln_ops_ctx *ctx, float *out, const float *q, const uint16_t *k_cache,
                                     const uint16_t *v_cache, int64_t pos0, int64_t T, int64_t NH, int64_t NKV, int64_t HS,
                                     int64_t window, int64_t rows, float softcap);
    /* As attention_window_forward over a cache of any kiln_kv_type: k_cache and v_cache (rows, NKV*HS) of type_k and
     * type_v, kiln_kv_row_bytes(type, NKV*HS) bytes a row (the block types in blocks of 32 along the row). f16 and
     * f16 is attention_window_forward itself; other types convert the rows each piece of keys needs to float. */
    void (*attention_kv_forward)(kiln_ops_ctx *ctx, float *out, const float *q, const void *k_cache, const void *v_cache,
                                 kiln_kv_type type_k, kiln_kv_type type_v, int64_t pos0, int64_t T, int64_t NH, int64_t NKV,
                                 int64_t HS, int64_t window, int64_t rows, float softcap);
    /* ---- the architecture features' elementwise ops (#6), ops_arch.c */
    /* out (n) = gelu_tanh(gate) * up (gemma's GeGLU); out may equal gate. */
    void (*geglu_forward)(kiln_ops_ctx *ctx, float *out, const float *gate, const float *up, int64_t n);
    /* x (T, n) += b (n) on every row. */
    void (*add_bias_forward)(kiln_ops_ctx *ctx, float *x, const float *b, int64_t T, int64_t n);
    /* x (n) *= sigmoid(g (n)): the attention output gate. */
    void (*sigmoid_mul_forward)(kiln_ops_ctx *ctx, float *x, const float *g, int64_t n);
    /* x (n) = cap * tanh(scale * x / cap), or scale * x when cap is 0 (embedding scale, logit scale and softcap). */
    void (*scale_softcap_forward)(kiln_ops_ctx *ctx, float *x, int64_t n, float scale, float cap);
    /* Bytes attention_kv_forward needs beyond scratch_size's for caches other than f16 (the CPU backend adds them
     * when the session's types ask for it). */
    size_t (*kv_scratch_size)(int64_t max_width, int64_t NH, int64_t n_ctx, int n_threads);
    /* Scratch bytes the ops need for a batch of T tokens of a model of these widths and context n_ctx. */
    size_t (*scratch_size)(int64_t T, int64_t max_width, int64_t NH, int64_t n_ctx, int n_threads);

    /* ---- training (#5). N = B*T rows; activations and gradients are float. Every backward ACCUMULATES
     * (+=) into each gradient it writes, activation and parameter alike, so a gradient with two sources (the
     * residual stream, dln from q, k and v) needs no add: the caller zeroes an activation gradient before the
     * ops that build it (src/train/llama_train.c), which keeps the trainer's convention of src/train/trainer.h
     * (+= into parameter gradients, activation gradients overwritten each step). The exceptions say so. Results never depend on the thread count (deterministic
     * reductions: per-thread partials summed in a fixed order, or work split so no two threads write one
     * element). */

    /* dtable (V, C) += scatter of dout (N, C) rows at ids. A row of dout with a non-finite value is
     * skipped whole; returns how many were skipped. */
    int64_t (*embed_backward)(kiln_ops_ctx *ctx, float *dtable, const float *dout, const int32_t *ids, int64_t N, int64_t C);
    /* As rmsnorm_forward, also saving rstd (N) = 1/sqrt(mean(x^2) + eps). out must not alias x. */
    void (*rmsnorm_forward_train)(kiln_ops_ctx *ctx, float *out, float *rstd, const float *x, const float *w,
                                  int64_t N, int64_t C, float eps);
    /* dx (N, C) +=, dw (C) += from dout (N, C). */
    void (*rmsnorm_backward)(kiln_ops_ctx *ctx, float *dx, float *dw, const float *dout, const float *x, const float *w,
                             const float *rstd, int64_t N, int64_t C);
    /* Dense matmul for training: y (N, O) = x (N, I) W^T, W (O rows of I) stored as wtype (KILN_TYPE_F32, or
     * KILN_TYPE_BF16 for the mixed-precision mirror), accumulated in fp32. y is overwritten. */
    void (*dense_forward)(kiln_ops_ctx *ctx, float *y, const float *x, const void *W, kiln_type wtype,
                          int64_t N, int64_t I, int64_t O);
    /* dx (N, I) += dy W; dW (O, I) += dy^T x (fp32). Either of dx, dW may be NULL to skip it. */
    void (*dense_backward)(kiln_ops_ctx *ctx, float *dx, float *dW, const float *dy, const float *x, const void *W,
                           kiln_type wtype, int64_t N, int64_t I, int64_t O);
    /* The inverse rotation of rope_forward, in place on the gradient dx (T, n_heads*HS). */
    void (*rope_backward)(kiln_ops_ctx *ctx, float *dx, const int32_t *pos, int64_t T, int64_t n_heads, int64_t HS,
                          int64_t rope_dim, float base, const float *freq, float mscale, bool neox);
    /* Causal GQA attention over B independent sequences of T tokens, online softmax. q (B*T, NH*HS),
     * k and v (B*T, NKV*HS); out (B*T, NH*HS) is overwritten and lse (B, NH, T) gets each row's
     * log-sum-exp of the scaled scores. Scale 1/sqrt(HS). */
    void (*attention_forward_train)(kiln_ops_ctx *ctx, float *out, float *lse, const float *q, const float *k,
                                    const float *v, int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS);
    /* dq, dk, dv += from dout, recomputing the probabilities from q, k and lse (out is needed for
     * D = rowsum(dout * out)). */
    void (*attention_backward)(kiln_ops_ctx *ctx, float *dq, float *dk, float *dv, const float *dout, const float *q,
                               const float *k, const float *v, const float *out, const float *lse,
                               int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS);
    /* dgate, dup (n) += from dout (n) for out = silu(gate) * up. */
    void (*swiglu_backward)(kiln_ops_ctx *ctx, float *dgate, float *dup, const float *dout, const float *gate,
                            const float *up, int64_t n);
    /* Fused softmax cross-entropy over logits (N, V) against targets (N). A row whose target equals
     * ignore_index counts for nothing. Per counted row, with p = softmax(logits), z = logsumexp(logits),
     * eps = label_smoothing:
     *   loss = (1-eps) * (z - logit[target]) + eps * mean_j(z - logit[j]) + z_loss * z^2
     * losses (N) gets each row's loss (0 for ignored rows) unless NULL. When dscale != 0 the logits are
     * overwritten IN PLACE by dscale * dloss/dlogits:
     *   dscale * (p - (1-eps) * onehot(target) - eps/V + 2 * z_loss * z * p), and 0 for ignored rows;
     * when dscale == 0 they are left as they were. Returns the sum of the counted rows' losses (double)
     * and stores their number in *n_counted. */
    double (*cross_entropy)(kiln_ops_ctx *ctx, float *logits, float *losses, const int32_t *targets, int64_t N,
                            int64_t V, float label_smoothing, float z_loss, int32_t ignore_index, float dscale,
                            int64_t *n_counted);
    /* Scratch bytes the training ops need for N = B*T rows of these widths (max_width as in scratch_size;
     * V the vocab, for the loss). */
    size_t (*train_scratch_size)(int64_t B, int64_t T, int64_t max_width, int64_t NH, int64_t V, int n_threads);
} kiln_ops;

extern const kiln_ops kiln_cpu_ops;

#endif
