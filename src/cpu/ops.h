/* ops.h: the ops table, the seam between the model code (written once) and a backend. The CPU table in
 * src/cpu/ops.c is the oracle; a faster backend (SIMD CPU, CUDA) fills the same table and is tested against it
 * op by op (tests/test_ops.c). Forward only for now; each op's backward joins it in the same file (#5).
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
} kiln_ops_ctx;

typedef struct kiln_ops {
    /* out (T, C) = rows ids[t] of table (V rows of C), dequantizing only those rows. Ids must be < V
     * (sessions validate them). */
    void (*embed_forward)(kiln_ops_ctx *ctx, float *out, const kiln_tensor_view *table, const int32_t *ids, int64_t T);
    /* out (T, C) = x / rms(x) * w, rms over C with eps inside the sqrt. out may equal x. */
    void (*rmsnorm_forward)(kiln_ops_ctx *ctx, float *out, const float *x, const float *w, int64_t T, int64_t C, float eps);
    /* y (T, O) = x (T, I) W^T for W of O rows of I; x rows are quantized once to W's vec_dot_type. */
    void (*matmul_forward)(kiln_ops_ctx *ctx, float *y, const float *x, const kiln_tensor_view *W, int64_t T);
    /* Rotates the first rope_dim of each head of x (T, n_heads*HS) in place, token t at position pos[t]:
     * theta_i = pos * base^(-2i/rope_dim). Interleaved pairs (2i, 2i+1) when !neox, halves (i, i+rope_dim/2) when neox. */
    void (*rope_forward)(kiln_ops_ctx *ctx, float *x, const int32_t *pos, int64_t T, int64_t n_heads, int64_t HS,
                         int64_t rope_dim, float base, bool neox);
    /* Causal attention with GQA. q (T, NH*HS) at positions pos0..pos0+T-1; the cache holds k and v (f16,
     * (n_ctx, NKV*HS) each) for positions 0..pos0+T-1, this batch's included. out (T, NH*HS). Scale 1/sqrt(HS). */
    void (*attention_forward)(kiln_ops_ctx *ctx, float *out, const float *q, const uint16_t *k_cache, const uint16_t *v_cache,
                              int64_t pos0, int64_t T, int64_t NH, int64_t NKV, int64_t HS);
    /* out (n) = silu(gate) * up; out may equal gate. */
    void (*swiglu_forward)(kiln_ops_ctx *ctx, float *out, const float *gate, const float *up, int64_t n);
    /* Scratch bytes the ops need for a batch of T tokens of a model of these widths and context n_ctx. */
    size_t (*scratch_size)(int64_t T, int64_t max_width, int64_t NH, int64_t n_ctx, int n_threads);
} kiln_ops;

extern const kiln_ops kiln_cpu_ops;

#endif
