/* rope.cuh: RoPE's angles and rotation as every CUDA kernel computes them (elementwise.cu's qkv_post, attention.cu's
 * decode with the qkv epilogue fused in, train_elementwise.cu's rope), in ops_rope.c's order so that the results are
 * the CPU's bits: pair i at angle theta_i, theta_0 = pos, theta_{i+1} = theta_i * theta_scale in float (as
 * llama.cpp), so the thread of pair i repeats the i products of the chain; the scaling's freq[i] and mscale
 * (kiln_cuda_rope_freq) after it. Angles reach 1e5 rad at long context: sincosf, never the fast __sinf/__cosf,
 * whose error grows with the argument. */
#ifndef KILN_CUDA_ROPE_CUH
#define KILN_CUDA_ROPE_CUH

#include "cuda/kernels.h"

/* cos and sin of pair i's angle at position pos. */
static __device__ __forceinline__ void kiln_rope_cs(int i, float pos, float theta_scale, const kiln_cuda_rope_freq &rf, float *c,
                                                    float *s) {
    float theta = pos;
#pragma unroll 4
    for (int j = 0; j < i; j++) theta = __fmul_rn(theta, theta_scale);
    if (rf.scaled) theta = __fmul_rn(theta, rf.f[i]); /* scaling: ops_rope.c's theta * freq[i] */
    sincosf(theta, s, c);
    if (rf.scaled) *c = __fmul_rn(*c, rf.mscale), *s = __fmul_rn(*s, rf.mscale);
}

/* The block's angle table for position pos: cos_t, sin_t (half), sin times sin_sign (-1: the backward's inverse
 * rotation). The caller synchronizes before reading it. */
static __device__ __forceinline__ void kiln_rope_angles(float *cos_t, float *sin_t, int half, float pos, float theta_scale,
                                                        const kiln_cuda_rope_freq &rf, float sin_sign) {
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float c, sn;
        kiln_rope_cs(i, pos, theta_scale, rf, &c, &sn);
        cos_t[i] = c;
        sin_t[i] = __fmul_rn(sin_sign, sn);
    }
}

/* Rotates pair i of the head x by (c, s): elements (2i, 2i + 1), or (i, i + half) for NeoX. */
static __device__ __forceinline__ void kiln_rope_rotate(float *x, int i, int half, bool neox, float c, float s) {
    const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
    const float x0 = x[a], x1 = x[b];
    x[a] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
    x[b] = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
}

#endif
