/* train_attention_tc.h: the tensor-core path of the training attention (train_attention_tc.cu), for head sizes
 * 64 and 128 only; internal to src/cuda/train_attention.cu, which checks the arguments and, for the backward,
 * writes D = rowsum(dout * out) (and zeroes the dq columns when !deterministic) before calling. C++ linkage: both
 * sides are CUDA files. */
#ifndef KILN_CUDA_TRAIN_ATTENTION_TC_H
#define KILN_CUDA_TRAIN_ATTENTION_TC_H

#include "cuda/train_kernels.h"

#include <cuda_runtime.h>

#define KILN_ATTN_TC_HS(HS) ((HS) == 64 || (HS) == 128)

kiln_status kiln_attn_tc_forward(kiln_bf16_t *out, float *lse, const kiln_bf16_t *qkv, int B, int T, int NH, int NKV, int HS,
                                 cudaStream_t s);
kiln_status kiln_attn_tc_backward(float *dqkv, const kiln_bf16_t *dout, const kiln_bf16_t *qkv, const float *lse, const float *D,
                                  int B, int T, int NH, int NKV, int HS, bool deterministic, cudaStream_t s);
/* The forward on wgmma (train_attention_wg.cu), head size 64 or 128, where kiln_cuda_attention_wgmma(HS) holds (both
 * entry points here dispatch to these themselves). */
kiln_status kiln_attn_wg_forward(kiln_bf16_t *out, float *lse, const kiln_bf16_t *qkv, int B, int T, int NH, int NKV, int HS,
                                 cudaStream_t s);
/* The launch order of the causal kernels' blocks (attn_tile_of, mma.cuh): 1, the default, the heaviest tiles first
 * across every (head, batch); KILN_ATTN_ORDER=0 the grid's own order, for bench comparisons. Read once. */
int kiln_attn_order(void);
/* The backward's dk/dv kernel on wgmma, head size 64 (atomic_dq: it adds dq too, as the mma.sync kernel's
 * ATOMIC_DQ; otherwise a dq kernel follows it: kiln_attn_wg_backward_dq or the mma.sync one). */
kiln_status kiln_attn_wg_backward_dkdv(float *dqkv, const kiln_bf16_t *dout, const kiln_bf16_t *qkv, const float *lse,
                                       const float *D, int B, int T, int NH, int NKV, bool atomic_dq, cudaStream_t s);

/* The deterministic backward's dq kernel on wgmma, head size 64, where kiln_attn_wg_dq_takes() (KILN_ATTN_WG_DQ not 0)
 * and the dk/dv kernel runs on wgmma; otherwise the mma.sync dq kernel follows it. */
bool kiln_attn_wg_dq_takes(void);
kiln_status kiln_attn_wg_backward_dq(float *dqkv, const kiln_bf16_t *dout, const kiln_bf16_t *qkv, const float *lse,
                                     const float *D, int B, int T, int NH, int NKV, cudaStream_t s);

#endif
