/* attention_tc.h: the tensor-core prefill attention (attention_tc.cu), internal to src/cuda/attention.cu, which
 * checks the arguments before calling. C++ linkage: both sides are CUDA files. */
#ifndef KILN_CUDA_ATTENTION_TC_H
#define KILN_CUDA_ATTENTION_TC_H

#include "cuda/kernels.h"

#include <cuda_runtime.h>
#include <stdbool.h>
#include <stdint.h>

/* Whether the tensor-core kernel takes a prefill launch: HS 64 or 128, an f16 cache, no softcap, q 16-byte and out
 * 8-byte aligned, and KILN_ATTN_TC not "0" (read at each call). */
bool kiln_attn_prefill_tc_takes(int64_t HS, kiln_kv_type type_k, kiln_kv_type type_v, float softcap, const void *q, const void *out);
kiln_status kiln_attn_prefill_tc(float *out, const float *q, const void *k_cache, const void *v_cache, const int32_t *d_pos0, int T,
                                 int NH, int NKV, int HS, int window, int rows, int max_pos, float scale, cudaStream_t s);

#endif
