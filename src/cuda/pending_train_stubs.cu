/* TEMPORARY (lead): weak stand-ins for the training kernels being written, so every build links meanwhile. */
#include "cuda/train_kernels.h"
extern "C" __attribute__((weak)) kiln_status kiln_cuda_blas_new(kiln_cuda_blas **out) { *out = NULL; return KILN_ERR_UNSUPPORTED; }
extern "C" __attribute__((weak)) void kiln_cuda_blas_free(kiln_cuda_blas *b) {}
extern "C" __attribute__((weak)) size_t kiln_cuda_blas_bytes(void) { return 0; }
extern "C" __attribute__((weak)) kiln_status kiln_cuda_linear_forward(kiln_cuda_blas *b, void *y, bool y_f32, bool accumulate, const kiln_bf16_t *x, const kiln_bf16_t *W, int64_t N, int64_t I, int64_t O, void *stream) { return KILN_ERR_UNSUPPORTED; }
extern "C" __attribute__((weak)) kiln_status kiln_cuda_linear_backward(kiln_cuda_blas *b, void *dx, bool dx_f32, bool accumulate, float *dW, const kiln_bf16_t *dy, const kiln_bf16_t *x, const kiln_bf16_t *W, int64_t N, int64_t I, int64_t O, void *stream) { return KILN_ERR_UNSUPPORTED; }
extern "C" __attribute__((weak)) kiln_status kiln_cuda_embed_forward(float *x, const float *table, const int32_t *ids, int64_t N, int64_t C, void *stream) { return KILN_ERR_UNSUPPORTED; }
extern "C" __attribute__((weak)) kiln_status kiln_cuda_embed_backward(float *dtable, const float *dx, const int32_t *ids, int64_t N, int64_t C, int32_t *d_skipped, void *stream) { return KILN_ERR_UNSUPPORTED; }
extern "C" __attribute__((weak)) size_t kiln_cuda_embed_backward_det_ws_bytes(int64_t N, int64_t V) { return 0; }
extern "C" __attribute__((weak)) kiln_status kiln_cuda_embed_backward_det(float *dtable, const float *dx, const int32_t *ids, int64_t N, int64_t C, int64_t V, int32_t *d_skipped, void *ws, void *stream) { return KILN_ERR_UNSUPPORTED; }
extern "C" __attribute__((weak)) kiln_status kiln_cuda_rmsnorm_forward(float *x, const float *y, kiln_bf16_t *out, float *rstd, const float *w, int64_t N, int64_t C, float eps, void *stream) { return KILN_ERR_UNSUPPORTED; }
extern "C" __attribute__((weak)) size_t kiln_cuda_rmsnorm_backward_ws_bytes(int64_t N, int64_t C) { return 0; }
extern "C" __attribute__((weak)) kiln_status kiln_cuda_rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const float *w, const float *rstd, int64_t N, int64_t C, void *ws, void *stream) { return KILN_ERR_UNSUPPORTED; }
extern "C" __attribute__((weak)) kiln_status kiln_cuda_rope_forward(kiln_bf16_t *qkv_bf, const float *qkv, int64_t N, int64_t T, int64_t NH, int64_t NKV, int64_t HS, int64_t rope_dim, float base, bool neox, void *stream) { return KILN_ERR_UNSUPPORTED; }
extern "C" __attribute__((weak)) kiln_status kiln_cuda_rope_backward(kiln_bf16_t *dqkv_bf, const float *dqkv, int64_t N, int64_t T, int64_t NH, int64_t NKV, int64_t HS, int64_t rope_dim, float base, bool neox, void *stream) { return KILN_ERR_UNSUPPORTED; }
extern "C" __attribute__((weak)) kiln_status kiln_cuda_swiglu_forward(kiln_bf16_t *h, const float *gu, int64_t N, int64_t F, void *stream) { return KILN_ERR_UNSUPPORTED; }
extern "C" __attribute__((weak)) kiln_status kiln_cuda_swiglu_backward(kiln_bf16_t *dgu, const float *dh, const float *gu, int64_t N, int64_t F, void *stream) { return KILN_ERR_UNSUPPORTED; }
extern "C" __attribute__((weak)) kiln_status kiln_cuda_to_bf16(kiln_bf16_t *out, const float *x, int64_t n, void *stream) { return KILN_ERR_UNSUPPORTED; }
extern "C" __attribute__((weak)) kiln_status kiln_cuda_attention_forward(kiln_bf16_t *out, float *lse, const kiln_bf16_t *qkv, int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS, void *stream) { return KILN_ERR_UNSUPPORTED; }
extern "C" __attribute__((weak)) size_t kiln_cuda_attention_backward_ws_bytes(int64_t B, int64_t T, int64_t NH) { return 0; }
extern "C" __attribute__((weak)) kiln_status kiln_cuda_attention_backward(float *dqkv, const kiln_bf16_t *dout, const kiln_bf16_t *qkv, const kiln_bf16_t *out, const float *lse, int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS, void *ws, void *stream) { return KILN_ERR_UNSUPPORTED; }
extern "C" __attribute__((weak)) kiln_status kiln_cuda_cross_entropy(float *losses, kiln_bf16_t *dlogits, const float *logits, const int32_t *targets, int64_t n, int64_t V, float label_smoothing, float z_loss, int32_t ignore_index, float dscale, void *stream) { return KILN_ERR_UNSUPPORTED; }
extern "C" __attribute__((weak)) size_t kiln_cuda_adamw_ws_bytes(int64_t n) { return 0; }
extern "C" __attribute__((weak)) kiln_status kiln_cuda_adamw(float *params, const float *grads, float *m, float *v, kiln_bf16_t *mirror, const uint8_t *decay, int64_t n, float lr, float beta1, float beta2, float eps, float weight_decay, float grad_clip, int64_t step, float *d_norm, int32_t *d_skipped, void *ws, void *stream) { return KILN_ERR_UNSUPPORTED; }
