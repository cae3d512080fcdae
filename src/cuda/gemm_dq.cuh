/* gemm_dq.cuh: gemm.cu's block decoders for the prefill's dequantization to bf16: Dq::run(w, g, v) fills v[0..7]
 * with elements 8g .. 8g+7 of the flat weight in f32, with the scalar reference's float operations in its order
 * (__fmul_rn / __fadd_rn / __fsub_rn: no FMA contraction), so the result is the CPU's bit for bit before the bf16
 * rounding. Kept apart from the kernels so that tests/test_cuda_host.sh can compile them for the host
 * (tests/cuda_host.cpp); tests/test_cuda_gemm.c checks them on the GPU. */
#ifndef KILN_CUDA_GEMM_DQ_CUH
#define KILN_CUDA_GEMM_DQ_CUH

#include "cuda/blocks.cuh"
#include "quants.h"

#include <stdint.h>

static __device__ __forceinline__ float h2f(kiln_fp16 h) { return __half2float(__ushort_as_half(h)); }

static __device__ __forceinline__ void scale_min_k4(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* d * sc and dmin * m of sub-block sub of a Q4_K or Q5_K super-block (their d, dmin and scales lie alike). */
template <class B>
static __device__ __forceinline__ void k4_factors(const B *b, int sub, float *dl, float *ml) {
    int sc, m;
    scale_min_k4(sub, b->scales, &sc, &m);
    *dl = __fmul_rn(h2f(b->d), (float)sc), *ml = __fmul_rn(h2f(b->dmin), (float)m);
}

/* Each decoder fills v[0..7] with elements 8g .. 8g+7 in f32, exactly as the scalar reference (quants_ref_*.c) does. */
struct dq_q4_0 { /* 32 per block: element j < 16 is the low nibble of qs[j], j >= 16 the high nibble of qs[j-16] */
    static __device__ __forceinline__ void run(const void *w, int64_t g, float v[8]) {
        const block_q4_0 *b = (const block_q4_0 *)w + g / 4;
        int j0 = (int)(g % 4) * 8, shift = j0 >= 16 ? 4 : 0;
        const uint8_t *qs = b->qs + (j0 & 15);
        float d = h2f(b->d);
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = __fmul_rn((float)(((qs[i] >> shift) & 0xF) - 8), d);
    }
};

struct dq_q4_1 { /* x = q * d + m */
    static __device__ __forceinline__ void run(const void *w, int64_t g, float v[8]) {
        const block_q4_1 *b = (const block_q4_1 *)w + g / 4;
        int j0 = (int)(g % 4) * 8, shift = j0 >= 16 ? 4 : 0;
        const uint8_t *qs = b->qs + (j0 & 15);
        float d = h2f(b->d), m = h2f(b->m);
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = __fadd_rn(__fmul_rn((float)((qs[i] >> shift) & 0xF), d), m);
    }
};

struct dq_q5_0 { /* Q4_0's nibbles plus bit j of qh (little-endian uint32) as bit 4 of element j; x = d * (q - 16) */
    static __device__ __forceinline__ void run(const void *w, int64_t g, float v[8]) {
        const block_q5_0 *b = (const block_q5_0 *)w + g / 4;
        int j0 = (int)(g % 4) * 8, shift = j0 >= 16 ? 4 : 0;
        const uint8_t *qs = b->qs + (j0 & 15);
        uint32_t qh = (uint32_t)b->qh[0] | (uint32_t)b->qh[1] << 8 | (uint32_t)b->qh[2] << 16 | (uint32_t)b->qh[3] << 24;
        float d = h2f(b->d);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            int q = ((qs[i] >> shift) & 0xF) | (int)((qh >> (j0 + i)) & 1) << 4;
            v[i] = __fmul_rn((float)(q - 16), d);
        }
    }
};

struct dq_q8_0 { /* x = d * q */
    static __device__ __forceinline__ void run(const void *w, int64_t g, float v[8]) {
        const block_q8_0 *b = (const block_q8_0 *)w + g / 4;
        const int8_t *qs = b->qs + (int)(g % 4) * 8;
        float d = h2f(b->d);
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = __fmul_rn((float)qs[i], d);
    }
};

/* Q4_K and Q5_K: element e of a super-block is in sub-block e/32 (its scale and min) and takes byte
 * qs[32 * (e/64) + e%32], the low nibble for even sub-blocks, the high for odd; Q5_K adds bit `sub` of qh[e%32]. */
struct dq_q4_K {
    static __device__ __forceinline__ void run(const void *w, int64_t g, float v[8]) {
        const block_q4_K *b = (const block_q4_K *)w + g / 32;
        int e0 = (int)(g % 32) * 8, sub = e0 / 32, shift = (sub & 1) * 4;
        float d1, m1;
        k4_factors(b, sub, &d1, &m1);
        const uint8_t *qs = b->qs + 32 * (e0 / 64) + e0 % 32;
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = __fsub_rn(__fmul_rn(d1, (float)((qs[i] >> shift) & 0xF)), m1);
    }
};

struct dq_q5_K {
    static __device__ __forceinline__ void run(const void *w, int64_t g, float v[8]) {
        const block_q5_K *b = (const block_q5_K *)w + g / 32;
        int e0 = (int)(g % 32) * 8, sub = e0 / 32, shift = (sub & 1) * 4;
        float d1, m1;
        k4_factors(b, sub, &d1, &m1);
        const uint8_t *qs = b->qs + 32 * (e0 / 64) + e0 % 32, *qh = b->qh + e0 % 32;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            int q = ((qs[i] >> shift) & 0xF) | ((qh[i] >> sub) & 1) << 4;
            v[i] = __fsub_rn(__fmul_rn(d1, (float)q), m1);
        }
    }
};

/* Q6_K: each 128-half h has ql[64], qh[32] and 8 scales; its element r = 32*k + l (k 0..3) takes ql[l + 32*(k&1)]
 * (low nibble for k < 2, high for k >= 2), bits 2k..2k+1 of qh[l], and scale 8h + l/16 + 2k; x = (d * sc) * (q - 32). */
struct dq_q6_K {
    static __device__ __forceinline__ void run(const void *w, int64_t g, float v[8]) {
        const block_q6_K *b = (const block_q6_K *)w + g / 32;
        int e0 = (int)(g % 32) * 8, h = e0 / 128, k = (e0 % 128) / 32, l0 = e0 % 32;
        const uint8_t *ql = b->ql + 64 * h + l0 + 32 * (k & 1), *qh = b->qh + 32 * h + l0;
        int shift = k < 2 ? 0 : 4;
        float dsc = __fmul_rn(h2f(b->d), (float)b->scales[8 * h + l0 / 16 + 2 * k]);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            int q = (((ql[i] >> shift) & 0xF) | ((qh[i] >> (2 * k)) & 3) << 4) - 32;
            v[i] = __fmul_rn(dsc, (float)q);
        }
    }
};

struct dq_q5_1 { /* Q5_0's 5-bit quants; x = q * d + m */
    static __device__ __forceinline__ void run(const void *w, int64_t g, float v[8]) {
        const block_q5_1 *b = (const block_q5_1 *)w + g / 4;
        int j0 = (int)(g % 4) * 8, shift = j0 >= 16 ? 4 : 0;
        const uint8_t *qs = b->qs + (j0 & 15);
        uint32_t qh = (uint32_t)b->qh[0] | (uint32_t)b->qh[1] << 8 | (uint32_t)b->qh[2] << 16 | (uint32_t)b->qh[3] << 24;
        float d = h2f(b->d), m = h2f(b->m);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            int q = ((qs[i] >> shift) & 0xF) | (int)((qh >> (j0 + i)) & 1) << 4;
            v[i] = __fadd_rn(__fmul_rn((float)q, d), m);
        }
    }
};

struct dq_iq4_nl { /* Q4_0's packing; x = d * level(q) */
    static __device__ __forceinline__ void run(const void *w, int64_t g, float v[8]) {
        const block_iq4_nl *b = (const block_iq4_nl *)w + g / 4;
        int j0 = (int)(g % 4) * 8, shift = j0 >= 16 ? 4 : 0;
        const uint8_t *qs = b->qs + (j0 & 15);
        float d = h2f(b->d);
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = __fmul_rn(d, (float)iq4nl_level((qs[i] >> shift) & 0xF));
    }
};

/* Q2_K and Q3_K: element e = 128 h + 32 j + l of a super-block is bits 2j..2j+1 of qs[32 h + l], in sub-block
 * 8 h + 2 j + l / 16 (8 elements never straddle one). Q2_K: x = (d * sc) * q - dmin * m; Q3_K: q - 4 where bit
 * 4 h + j of hmask[l] is clear, x = (d * (sc - 32)) * q. */
struct dq_q2_K {
    static __device__ __forceinline__ void run(const void *w, int64_t g, float v[8]) {
        const block_q2_K *b = (const block_q2_K *)w + g / 32;
        int e0 = (int)(g % 32) * 8, h = e0 / 128, j = (e0 % 128) / 32, l0 = e0 % 32;
        int sc = b->scales[8 * h + 2 * j + l0 / 16];
        float dl = __fmul_rn(h2f(b->d), (float)(sc & 0xF)), ml = __fmul_rn(h2f(b->dmin), (float)(sc >> 4));
        const uint8_t *qs = b->qs + 32 * h + l0;
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = __fsub_rn(__fmul_rn(dl, (float)((qs[i] >> (2 * j)) & 3)), ml);
    }
};

struct dq_q3_K {
    static __device__ __forceinline__ void run(const void *w, int64_t g, float v[8]) {
        const block_q3_K *b = (const block_q3_K *)w + g / 32;
        int e0 = (int)(g % 32) * 8, h = e0 / 128, j = (e0 % 128) / 32, l0 = e0 % 32;
        float dl = __fmul_rn(h2f(b->d), (float)(q3k_scale(b->scales, 8 * h + 2 * j + l0 / 16) - 32));
        const uint8_t *qs = b->qs + 32 * h + l0, *hm = b->hmask + l0;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            int q = ((qs[i] >> (2 * j)) & 3) - (((hm[i] >> (4 * h + j)) & 1) ? 0 : 4);
            v[i] = __fmul_rn(dl, (float)q);
        }
    }
};

struct dq_iq4_xs { /* sub-block ib = e / 32 packed as IQ4_NL in qs[16 ib ..]; x = (d * (sc - 32)) * level(q) */
    static __device__ __forceinline__ void run(const void *w, int64_t g, float v[8]) {
        const block_iq4_xs *b = (const block_iq4_xs *)w + g / 32;
        int e0 = (int)(g % 32) * 8, ib = e0 / 32, j0 = e0 % 32, shift = j0 >= 16 ? 4 : 0;
        float dl = __fmul_rn(h2f(b->d), (float)(iq4xs_scale(b, ib) - 32));
        const uint8_t *qs = b->qs + 16 * ib + (j0 & 15);
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = __fmul_rn(dl, (float)iq4nl_level((qs[i] >> shift) & 0xF));
    }
};

#endif
