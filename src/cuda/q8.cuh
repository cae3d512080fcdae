/* q8.cuh: the one definition of how a decode activation becomes the matvecs' int8 input (matvec.cu's "prepared"
 * form: a code per value and {d, d * sum(q)} per block of 32, d = amax / 127, q = roundf(v / d) with ties away
 * from zero as GGML's quantize_row_q8_1). matvec_prepare_kernel and the attention kernel that writes it beside its
 * output both call kiln_q8_store_warp, the residual norm and the matvec's norm tail kiln_q8_store_group, so they are
 * bit-identical by construction (tests/test_cuda_attention.c and test_cuda_matvec.c check it). */
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

/* The same for V consecutive values a lane (4 or 1), with matvec_prepare_kernel's exact operations: the block of
 * 32 is held by G = 32 / V consecutive lanes, its first at a lane that is a multiple of G (residual_norm_kernel's
 * accesses tid + j * threads with threads a multiple of 32, and the matvec norm tail's), amax and the code sum taken
 * over those G lanes by xor shuffles. Every lane of the warp calls this (the shuffles want all 32); ok says whether
 * the access exists (C % 32 == 0 makes whole groups valid or not). The lane at the start of a group writes
 * {d, d * sum(q)} to *ds. */
template <int V>
static __device__ __forceinline__ void kiln_q8_store_group(const float (&v)[V], bool ok, int8_t *q /* (V) */, float2 *ds /* (1) */) {
    const int G = 32 / V;
    float amax = 0.0f; /* fmaxf(0, |v|) = |v|, and max is exact in any order: matvec_prepare's amax */
#pragma unroll
    for (int k = 0; k < V; k++) amax = fmaxf(amax, fabsf(v[k]));
#pragma unroll
    for (int off = G / 2; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    const float d = __fdiv_rn(amax, 127.0f), id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
    int c[V], sum = 0;
#pragma unroll
    for (int k = 0; k < V; k++) {
        c[k] = (int)roundf(__fmul_rn(v[k], id)); /* ties away from zero, as GGML */
        sum += c[k];
    }
#pragma unroll
    for (int off = G / 2; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if (!ok) return;
    if constexpr (V == 4)
        *(char4 *)q = make_char4((signed char)c[0], (signed char)c[1], (signed char)c[2], (signed char)c[3]);
    else
        q[0] = (int8_t)c[0];
    if ((threadIdx.x & (G - 1)) == 0) *ds = make_float2(d, __fmul_rn(d, (float)sum));
}

#endif
