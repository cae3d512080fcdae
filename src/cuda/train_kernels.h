/* train_kernels.h: launchers of the CUDA training kernels (issue #8), callable from C. Every pointer is device
 * memory; every launcher enqueues on `stream` (a cudaStream_t, NULL for the default stream), never synchronizes,
 * never allocates (workspaces are passed in, sized by the *_ws_bytes functions) and returns KILN_OK or the error.
 * tests/test_cuda_train_*.c check each against the CPU training ops (src/cpu/ops.h, the oracle) on fresh random
 * inputs with a stated bound; they compile only with KILN_CUDA and skip without a GPU.
 *
 * Precision (llm.c's mixed precision): fp32 master weights, gradients and AdamW moments; a bf16 mirror of the
 * weights for the matmuls; the residual stream x and its gradient in fp32; the inputs of every matmul (normed x,
 * attention output, the GLU output, and the gradients a backward matmul reads) in bf16, written in bf16 by the
 * kernel that produces them. Norm weights are read from the fp32 master weights.
 *
 * Gradients: every parameter gradient (dW, dw, dtable) is ADDED into (+=), so micro-batches accumulate until the
 * trainer zeroes them; an activation gradient is overwritten (=) by the kernel that produces it, except the
 * residual stream's f32 dx, which the norm backward and an f32 linear backward with accumulate add into (the
 * skip connection's share is already there). Each launcher below says which. The trainer's own contract is
 * src/train/trainer.h's.
 *
 * Shapes: B sequences of T tokens, N = B*T rows; C width, NH/NKV heads, HS head size, Q = NH*HS, KV = NKV*HS,
 * F FFN width, V vocab. The weights of one layer lie in kiln_llama_train's flat buffer in the order attn_norm, wq,
 * wk, wv, wo, ffn_norm, w_gate, w_up, w_down, so wq|wk|wv is one (Q + 2 KV rows of C) matrix and w_gate|w_up one
 * (2F rows of C): q, k, v come from one matmul into a packed (N, Q + 2 KV) buffer, gate and up into (N, 2F). */
#ifndef KILN_CUDA_TRAIN_KERNELS_H
#define KILN_CUDA_TRAIN_KERNELS_H

#include "kiln.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef uint16_t kiln_bf16_t; /* bf16 bits, round to nearest even from f32 */

/* ---------------------------------------------------------------- train_matmul.cu (cuBLASLt, bf16 in, fp32 accumulate)
 * W is (O rows of I) row-major bf16 (the mirror). */
typedef struct kiln_cuda_blas kiln_cuda_blas; /* handle, workspace, cached plans; one per stream */
kiln_status kiln_cuda_blas_new(kiln_cuda_blas **out);
void kiln_cuda_blas_free(kiln_cuda_blas *b); /* accepts NULL */
/* Device bytes kiln_cuda_blas_new takes (its workspace). */
size_t kiln_cuda_blas_bytes(void);
/* Plans built from now on are chosen for sms SMs (cuBLASLt's SM count target, for a stream that shares the GPU with
 * another); 0 restores the whole GPU. Drops the plans already built. */
void kiln_cuda_blas_sm_target(kiln_cuda_blas *b, int sms);
/* y (N, O) = x (N, I) W^T. y_f32: y is float and, with accumulate, y += x W^T (the residual add); otherwise y is
 * bf16 and overwritten (accumulate must be false). */
kiln_status kiln_cuda_linear_forward_train(kiln_cuda_blas *b, void *y, bool y_f32, bool accumulate, const kiln_bf16_t *x,
                                     const kiln_bf16_t *W, int64_t N, int64_t I, int64_t O, void *stream);
/* From dy (N, O) bf16: dx (N, I) = dy W (dx_f32: float, += when accumulate; else bf16, overwritten), and
 * dW (O, I) float += dy^T x. dx or dW may be NULL to skip it. */
kiln_status kiln_cuda_linear_backward(kiln_cuda_blas *b, void *dx, bool dx_f32, bool accumulate, float *dW,
                                      const kiln_bf16_t *dy, const kiln_bf16_t *x, const kiln_bf16_t *W, int64_t N,
                                      int64_t I, int64_t O, void *stream);

/* ---------------------------------------------------------------- train_elementwise.cu */
/* x (N, C) f32 = rows ids[n] of table (V, C) f32 (the master weights). */
kiln_status kiln_cuda_embed_forward_train(float *x, const float *table, const int32_t *ids, int64_t N, int64_t C, void *stream);
/* dtable (V, C) += dx rows at ids, by atomicAdd (order-dependent in the last bits). As the CPU's embed_backward,
 * a row of dx with a non-finite value is skipped whole and counted into *d_skipped (device, may be NULL). */
kiln_status kiln_cuda_embed_backward(float *dtable, const float *dx, const int32_t *ids, int64_t N, int64_t C,
                                     int32_t *d_skipped, void *stream);
/* The same, deterministic: rows bucketed by id (a counting sort in ws) and each id's rows summed in row order,
 * so the result is the same bits on every run. */
size_t kiln_cuda_embed_backward_det_ws_bytes(int64_t N, int64_t V);
kiln_status kiln_cuda_embed_backward_det(float *dtable, const float *dx, const int32_t *ids, int64_t N, int64_t C,
                                         int64_t V, int32_t *d_skipped, void *ws, void *stream);
/* The residual step and the norm of the next block: x (N, C) f32 += y (N, C) f32 when y is not NULL, then
 * out (N, C) bf16 = x * rstd * w, rstd (N) f32 = 1/sqrt(mean(x^2) + eps) saved for the backward; w (C) f32. */
kiln_status kiln_cuda_rmsnorm_forward_train(float *x, const float *y, kiln_bf16_t *out, float *rstd, const float *w, int64_t N,
                                      int64_t C, float eps, void *stream);
/* From dout (N, C) f32 (the gradient of the norm's output): dx (N, C) f32 += the norm's input gradient (the
 * residual stream's gradient, so the skip connection's share is already in dx), and dx_bf (N, C) bf16, unless
 * NULL, = the updated dx rounded (the copy the next backward matmul reads: no separate conversion pass);
 * dw (C) f32 += the weight's gradient, reduced deterministically through ws (per-chunk partials summed in a
 * fixed order). x is the norm's input as it was (the forward's x after its add). */
size_t kiln_cuda_rmsnorm_backward_ws_bytes(int64_t N, int64_t C);
kiln_status kiln_cuda_rmsnorm_backward(float *dx, kiln_bf16_t *dx_bf, float *dw, const float *dout, const float *x,
                                       const float *w, const float *rstd, int64_t N, int64_t C, void *ws, void *stream);
/* qkv (N, Q + 2 KV) bf16, the projections' output, to qkv_bf (N, Q + 2 KV) bf16 with q and k rotated (RoPE on
 * the first rope_dim of each head, theta = pos * base^(-2i/rope_dim) by llama.cpp's float recurrence as
 * src/cpu/ops_rope.c, times h_freq[i] and cos, sin times mscale: the scaling table, host memory passed by value,
 * NULL and 1 unscaled; interleaved pairs, or NeoX halves when neox) in f32 and rounded once; v copied (nothing to
 * do when qkv_bf == qkv: in place is allowed); row n is position n % T. */
kiln_status kiln_cuda_rope_forward_train(kiln_bf16_t *qkv_bf, const kiln_bf16_t *qkv, int64_t N, int64_t T, int64_t NH, int64_t NKV,
                                   int64_t HS, int64_t rope_dim, float base, const float *h_freq, float mscale, bool neox,
                                   void *stream);
/* dqkv (N, Q + 2 KV) f32, the gradient of the rotated q, k and of v, to dqkv_bf bf16 with the inverse rotation
 * (overwritten; dv copied). */
kiln_status kiln_cuda_rope_backward(kiln_bf16_t *dqkv_bf, const float *dqkv, int64_t N, int64_t T, int64_t NH, int64_t NKV,
                                    int64_t HS, int64_t rope_dim, float base, const float *h_freq, float mscale, bool neox,
                                    void *stream);
/* gu (N, 2F) bf16, gate then up per row (the matmul's bf16 output): h (N, F) bf16 = silu(gate) * up in f32. */
kiln_status kiln_cuda_swiglu_forward_train(kiln_bf16_t *h, const kiln_bf16_t *gu, int64_t N, int64_t F, void *stream);
/* From dh (N, F) bf16 (the down projection's backward output): dgu (N, 2F) bf16 = (dgate, dup), f32 math. */
kiln_status kiln_cuda_swiglu_backward(kiln_bf16_t *dgu, const kiln_bf16_t *dh, const kiln_bf16_t *gu, int64_t N, int64_t F,
                                      void *stream);
/* out (n) bf16 = x (n) f32 rounded to nearest even. */
kiln_status kiln_cuda_to_bf16(kiln_bf16_t *out, const float *x, int64_t n, void *stream);

/* ---------------------------------------------------------------- train_attention.cu
 * Causal flash attention over B sequences of T, GQA (query head h reads KV head h / (NH/NKV)), scale 1/sqrt(HS),
 * never materializing T x T. qkv (N, Q + 2 KV) bf16 packed as the rope writes it (q at column 0, k at Q, v at
 * Q + KV). out (N, Q) bf16; lse (B, NH, T) f32 the log-sum-exp of each row's scaled scores. HS a multiple of 8
 * up to 256. */
kiln_status kiln_cuda_attention_forward_train(kiln_bf16_t *out, float *lse, const kiln_bf16_t *qkv, int64_t B, int64_t T,
                                        int64_t NH, int64_t NKV, int64_t HS, void *stream);
/* Whether the forward at head size HS runs on wgmma (train_attention_wg.cu), and at HS 64 the backward's dk/dv
 * kernel too: HS 64 or 128, a build with the sm_90a kernels (CUDA_ARCH sm_90), a device of compute capability 9.0,
 * and KILN_ATTN_WG unset (the build's default, on), 1 or a block shape (2x64, 2x128, 3x64, 3x128; 2x64p, 3x64p the
 * pipelined kernels); 0: off. Otherwise they run on mma.sync. */
bool kiln_cuda_attention_wgmma(int64_t HS);
/* From dout (N, Q) bf16: dqkv (N, Q + 2 KV) f32 = (dq, dk, dv), overwritten (dk, dv summed over the query heads
 * of each KV head), recomputing the probabilities from qkv and lse; out is needed for D = rowsum(dout * out),
 * kept in ws. deterministic: every element is written once, its sum in a fixed order (a dk/dv kernel, then a
 * dq kernel recomputing S and dP): the same bits on every run. false: dq is added by f32 atomics from the dk/dv
 * kernel (FlashAttention-2's backward, 5 matmuls instead of 7; only ~2% faster as measured at the 124M shape,
 * 0.430 ms against 0.440), so its last bits differ between runs; head sizes other than 64 and 128 (the CUDA-core
 * path) are deterministic either way. */
size_t kiln_cuda_attention_backward_ws_bytes(int64_t B, int64_t T, int64_t NH);
kiln_status kiln_cuda_attention_backward(float *dqkv, const kiln_bf16_t *dout, const kiln_bf16_t *qkv, const kiln_bf16_t *out,
                                         const float *lse, int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS,
                                         bool deterministic, void *ws, void *stream);

/* ---------------------------------------------------------------- train_loss.cu */
/* Fused softmax cross-entropy over a chunk of n rows of logits (n, V) bf16 (the classifier's matmul output; the
 * classifier runs chunk by chunk, so no (N, V) probability tensor exists), with f32 math exactly the CPU's
 * cross_entropy (src/cpu/ops.h) on those values: per counted row
 *   loss = (1-eps) (z - logit[target]) + eps mean_j (z - logit[j]) + z_loss z^2, z = logsumexp(logits);
 * a target equal to ignore_index counts for nothing. losses (n) f32 gets each row's loss (0 when ignored);
 * dlogits (n, V) bf16, unless NULL, = dscale * dloss/dlogits (0 for ignored rows); dlogits may be logits itself
 * (each row is read whole before it is overwritten). */
kiln_status kiln_cuda_cross_entropy(float *losses, kiln_bf16_t *dlogits, const kiln_bf16_t *logits, const int32_t *targets,
                                    int64_t n, int64_t V, float label_smoothing, float z_loss, int32_t ignore_index,
                                    float dscale, void *stream);
/* One AdamW step over the flat buffers (n parameters), as src/train/optim.c's fp32 AdamW: the global L2 norm of
 * grads (deterministic: fixed-order partials in ws), the clip factor min(1, grad_clip / norm) (grad_clip <= 0: 1),
 * a non-finite norm skipping the step (nothing changes; *d_skipped = 1), else the bias-corrected update with
 * decoupled weight decay where decay (n) is nonzero (a byte per parameter), and the bf16 mirror (n, or NULL)
 * refreshed from the new params. step is the 1-based update count (bias correction). d_norm (1) f32 and
 * d_skipped (1) int32 are device outputs; the caller reads them when it needs them. */
size_t kiln_cuda_adamw_ws_bytes(int64_t n);
/* kiln_cuda_adamw in two stages, for data-parallel training: the sum of squares of n grads into *d_sumsq (a device
 * double; fixed order), then, once the caller has made it the sum over every rank's shard, the update of n params
 * with the global norm's clip. ws as kiln_cuda_adamw's (kiln_cuda_adamw_ws_bytes of the larger n). */
kiln_status kiln_cuda_grad_sumsq(double *d_sumsq, const float *grads, int64_t n, void *ws, void *stream);
kiln_status kiln_cuda_adamw_apply(float *params, const float *grads, float *m, float *v, kiln_bf16_t *mirror, const uint8_t *decay,
                                  int64_t n, float lr, float beta1, float beta2, float eps, float weight_decay, float grad_clip,
                                  int64_t step, const double *d_sumsq, float *d_norm, int32_t *d_skipped, void *ws, void *stream);
/* The check before an update: the weights kiln_cuda_adamw_apply would write (same constants, the clip from
 * *d_sumsq), squared and summed per segment into d_wsumsq (n_seg doubles; fixed order), writing nothing else.
 * d_seg (n_seg, 2) int64 on the device: each segment's first element and length, in the indices of params (a
 * tensor, or the part of it in a ZeRO-1 shard; length 0 allowed), cut into chunks of KILN_CUDA_ADAMW_CHECK_CHUNK
 * elements that the grid shares; n_chunks = kiln_cuda_adamw_check_chunks of the same table on the host, and partial
 * n_chunks doubles of work space. kiln_cuda_adamw_apply_checked then skips the update (nothing written,
 * *d_skipped = 1) when a sum is not finite, as for a non-finite gradient norm. */
#define KILN_CUDA_ADAMW_CHECK_CHUNK 8192
int64_t kiln_cuda_adamw_check_chunks(const int64_t *h_seg, int n_seg);
/* The bound that spares the check its pass over the weights. d_max (device) holds the largest |param| and |m| that
 * the last applied update wrote (the bits of non-negative floats, which order as their bits); the update of
 * kiln_cuda_adamw_apply_checked sets it when given. With it the check first bounds every weight the update would
 * write, from the gradient's norm: |m'| <= b1 max|m| + (1 - b1) norm clip and, the denominator being at least eps,
 * |p'| <= max|p| max(1, |1 - lr wd|) + lr / (1 - b1^t) |m'| / eps (with a margin for the float roundings). When
 * that and |m'| / eps lie below 2^126, no weight can overflow: the check reads nothing and its sums are 0. Else it
 * checks as without d_max (NULL: before the first update, or after the weights or moments were written from
 * outside). */
typedef struct kiln_cuda_adamw_max {
    uint32_t p, m;
} kiln_cuda_adamw_max;
kiln_status kiln_cuda_adamw_check(double *d_wsumsq, double *partial, const int64_t *d_seg, int n_seg, int64_t n_chunks,
                                  const float *params, const float *grads, const float *m, const float *v, const uint8_t *decay,
                                  float lr, float beta1, float beta2, float eps, float weight_decay, float grad_clip, int64_t step,
                                  const double *d_sumsq, const kiln_cuda_adamw_max *d_max, void *stream);
/* d_max (NULL: not kept): when the update is applied, the maxima of what it wrote (above). */
kiln_status kiln_cuda_adamw_apply_checked(float *params, const float *grads, float *m, float *v, kiln_bf16_t *mirror,
                                          const uint8_t *decay, int64_t n, float lr, float beta1, float beta2, float eps,
                                          float weight_decay, float grad_clip, int64_t step, const double *d_sumsq,
                                          const double *d_wsumsq, int n_seg, kiln_cuda_adamw_max *d_max, float *d_norm,
                                          int32_t *d_skipped, void *ws, void *stream);
/* 8-bit AdamW (src/train/optim.c's codes and blocks, bit for bit with kiln_adamw_step): m8 int8 and v8 uint8 (n),
 * m_scale and v_scale (ceil(n / KILN_CUDA_ADAMW8_BLOCK)) f32, all on the device; element i's block is i / 256 of these
 * arrays, so a ZeRO-1 shard starts on a block boundary. The check and the update as the fp32 ones above. */
#define KILN_CUDA_ADAMW8_BLOCK 256 /* optim.h's KILN_ADAMW8_BLOCK (trainer.cu asserts they agree) */
typedef struct kiln_cuda_adam8 {
    int8_t *m8;
    uint8_t *v8;
    float *m_scale, *v_scale;
} kiln_cuda_adam8;
kiln_status kiln_cuda_adamw8_check(double *d_wsumsq, double *partial, const int64_t *d_seg, int n_seg, int64_t n_chunks,
                                   const float *params, const float *grads, kiln_cuda_adam8 q, const uint8_t *decay, float lr,
                                   float beta1, float beta2, float eps, float weight_decay, float grad_clip, int64_t step,
                                   const double *d_sumsq, const kiln_cuda_adamw_max *d_max, void *stream);
kiln_status kiln_cuda_adamw8_apply_checked(float *params, const float *grads, kiln_cuda_adam8 q, kiln_bf16_t *mirror,
                                           const uint8_t *decay, int64_t n, float lr, float beta1, float beta2, float eps,
                                           float weight_decay, float grad_clip, int64_t step, const double *d_sumsq,
                                           const double *d_wsumsq, int n_seg, kiln_cuda_adamw_max *d_max, float *d_norm,
                                           int32_t *d_skipped, void *ws, void *stream);
kiln_status kiln_cuda_adamw(float *params, const float *grads, float *m, float *v, kiln_bf16_t *mirror, const uint8_t *decay,
                            int64_t n, float lr, float beta1, float beta2, float eps, float weight_decay, float grad_clip,
                            int64_t step, float *d_norm, int32_t *d_skipped, void *ws, void *stream);

#ifdef __cplusplus
}
#endif
#endif
