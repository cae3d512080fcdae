/* norm.cuh: RMSNorm's arithmetic as every CUDA kernel computes it. The sums of squares are doubles, as the CPU's
 * RMSNorm sums its float squares in double (ops_rmsnorm.c), and the scale follows ops_rmsnorm.c's types. QK-norm's
 * per-head sums have one fixed order, qkv_post_kernel's (elementwise.cu), which the decode attention's fused epilogue
 * (attention.cu) repeats in a single warp, so both give the same bits. */
#ifndef KILN_CUDA_NORM_CUH
#define KILN_CUDA_NORM_CUH

#include <stdint.h>

/* rstd = 1 / sqrt(mean(x^2) + eps) in ops_rmsnorm.c's types: the mean rounded to float, then float ops. */
static __device__ __forceinline__ float kiln_rms_scale(double sumsq, int64_t C, float eps) {
    const float mean = (float)(sumsq / (double)C);
    return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, eps)));
}

/* qkv_post_kernel's threads for a head of HS: one per rotated pair, at least a warp, at most 128. */
static __host__ __device__ constexpr int kiln_qkv_post_threads(int64_t HS) {
    return HS / 2 <= 32 ? 32 : HS / 2 <= 64 ? 64 : 128;
}

/* A warp's sum of x's squares (HS floats) in qkv_post_kernel's order: each of its kiln_qkv_post_threads(HS)
 * threads sums x[i], x[i + nt], .. in double, each warp of them reduces by the butterfly, then the warps' totals
 * are added in order (elementwise.cu's block_sum). Every lane of the calling warp gets the total. */
static __device__ __forceinline__ double kiln_head_sumsq_warp(const float *x, int HS) {
    const int nt = kiln_qkv_post_threads(HS), lane = threadIdx.x & 31;
    double total = 0.0;
    for (int w = 0; w < nt / 32; w++) {
        double v = 0.0;
        for (int i = w * 32 + lane; i < HS; i += nt) v += (double)__fmul_rn(x[i], x[i]);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        total += v;
    }
    return total;
}

#endif
