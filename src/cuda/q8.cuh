/* q8.cuh: the one definition of how a decode activation becomes the matvecs' int8 input (matvec.cu's "prepared"
 * form: a code per value and {d, d * sum(q)} per block of 32, d = amax / 127, q = roundf(v / d) with ties away
 * from zero as GGML's quantize_row_q8_1). matvec_prepare_kernel and the attention kernel that writes it beside its
 * output both call this, so the two are bit-identical by construction (tests/test_cuda_attention.c checks it). */
#ifndef KILN_CUDA_Q8_CUH
#define KILN_CUDA_Q8_CUH

#include <stdint.h>

/* The warp's 32 lanes hold one aligned block of 32 values, lane l holding element 32 k + l = i: writes the code of
 * v to xq[i] and, from lane 0 of the block, the block's {d, d * sum(q)} to xds[i / 32]. */
static __device__ __forceinline__ void kiln_q8_store_warp(int8_t *xq, float2 *xds, size_t i, float v) {
    float amax = fabsf(v);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    const int q = (int)roundf(v * id);
    int sum = q;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    xq[i] = (int8_t)q;
    if ((i & 31) == 0) xds[i / 32] = make_float2(d, d * (float)sum);
}

/* The same for a block held as float4s by 8 consecutive lanes (lane l holding elements 4 (l % 8) .. 4 (l % 8) + 3
 * of the block, whose first element is i - 4 (l % 8)): the 4 codes of v to xq[i..i+3]. Every lane of the warp calls
 * it (the shuffles want all 32); ok false for a group of 8 lanes that holds no block (none of it is stored). */
static __device__ __forceinline__ void kiln_q8_store_4(int8_t *xq, float2 *xds, size_t i, float4 v, bool ok) {
    float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
    for (int off = 4; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    const int c0 = (int)roundf(v.x * id), c1 = (int)roundf(v.y * id), c2 = (int)roundf(v.z * id), c3 = (int)roundf(v.w * id);
    int sum = c0 + c1 + c2 + c3;
#pragma unroll
    for (int off = 4; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if (!ok) return;
    *(char4 *)(xq + i) = make_char4((signed char)c0, (signed char)c1, (signed char)c2, (signed char)c3);
    if ((i & 31) == 0) xds[i / 32] = make_float2(d, d * (float)sum);
}

#endif
