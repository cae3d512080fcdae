/* gemm_small_dq.cuh: gemm_small.cu's weight decoders, one per block format it takes: each turns lane c's share of a
 * row's 256 weights into int8 words in the layout of an mma.sync .s8 fragment (gemm_small.cu's header says which
 * weights a lane holds), with a float scale per 32 (SPLIT: per 16) and, for the types with a min, the float offset
 * that multiplies x's block sum: w = s * q + m for the int8 q of the words. Kept apart from the kernel so that
 * tests/test_cuda_host.sh compiles them for the host (tests/cuda_host.cpp) and checks every weight of every type
 * against the reference dequantization on a machine without a GPU. Self-contained: the host test includes it in
 * a namespace of its own. */
#ifndef KILN_CUDA_GEMM_SMALL_DQ_CUH
#define KILN_CUDA_GEMM_SMALL_DQ_CUH

#include <stdint.h>
#ifdef __CUDACC__
#include <cuda_fp16.h>
#endif

/* 4 bytes at a 2-byte-aligned p (the 18-, 22-, 34- and 210-byte blocks). */
static __device__ __forceinline__ float gq_h2f(uint16_t h) { return __half2float(__ushort_as_half(h)); }
static __device__ __forceinline__ uint16_t gq_u16(const uint8_t *p) { return *(const uint16_t *)p; }
static __device__ __forceinline__ uint32_t gq_u32(const uint8_t *p) { return *(const uint32_t *)p; }
static __device__ __forceinline__ uint32_t gq_a2(const uint8_t *p) { return (uint32_t)gq_u16(p) | (uint32_t)gq_u16(p + 2) << 16; }

/* Exact small integers to float without I2F (a quarter-rate instruction on sm_90): the float whose bits are
 * 0x4B400000 + v is 1.5 * 2^23 + v for |v| < 2^22, so one subtraction leaves v. gemm_small.cu starts its int32
 * accumulators at GQ_BIAS, so the mma adds the bias for free. */
#define GQ_BIAS 0x4B400000
static __device__ __forceinline__ float gq_biased(int b) { return __int_as_float(b) - 12582912.0f; }
static __device__ __forceinline__ float gq_i2f(int v) { return gq_biased(GQ_BIAS + v); }

/* ---------------------------------------------------------------- decoders
 * load(b, c): lane c (0..3) of a row's quad reads what it needs of the row's 256 weights at b.
 * chunk(j, c, lo, hi, s0, s1, m): the int8 words of weights 4c..4c+3 (lo) and 16+4c..16+4c+3 (hi) of the 32 at 32 j,
 * their scale s0 (SPLIT: s0 for the first 16, s1 for the second) and offset m (OFFSET types only). */

/* Q4_0, 8 blocks of 18 bytes: w = d * (q - 8); qs[l] holds element l (low nibble) and l + 16 (high). */
struct gq_q4_0 {
    static const bool SPLIT = false, OFFSET = false;
    static const int BLOCK_BYTES = 18 * 8;
    uint32_t q[8];
    float d[8];
    __device__ __forceinline__ void load(const uint8_t *b, int c) {
#pragma unroll
        for (int j = 0; j < 8; j++) d[j] = gq_h2f(gq_u16(b + 18 * j)), q[j] = gq_a2(b + 18 * j + 2 + 4 * c);
    }
    __device__ __forceinline__ void chunk(int j, int c, uint32_t &lo, uint32_t &hi, float &s0, float &s1, float &m) const {
        lo = __vsub4(q[j] & 0x0F0F0F0F, 0x08080808), hi = __vsub4((q[j] >> 4) & 0x0F0F0F0F, 0x08080808);
        s0 = s1 = d[j], m = 0.0f;
    }
};

/* Q4_1, 8 blocks of 20 bytes (4-byte aligned): w = d * q + m. */
struct gq_q4_1 {
    static const bool SPLIT = false, OFFSET = true;
    static const int BLOCK_BYTES = 20 * 8;
    uint32_t q[8], dm[8];
    __device__ __forceinline__ void load(const uint8_t *b, int c) {
#pragma unroll
        for (int j = 0; j < 8; j++) dm[j] = gq_u32(b + 20 * j), q[j] = gq_u32(b + 20 * j + 4 + 4 * c);
    }
    __device__ __forceinline__ void chunk(int j, int c, uint32_t &lo, uint32_t &hi, float &s0, float &s1, float &m) const {
        lo = q[j] & 0x0F0F0F0F, hi = (q[j] >> 4) & 0x0F0F0F0F;
        s0 = s1 = gq_h2f((uint16_t)dm[j]), m = gq_h2f((uint16_t)(dm[j] >> 16));
    }
};

/* Bits 4c..4c+3 of h to bit 4 of bytes 0..3. */
static __device__ __forceinline__ uint32_t spread4b(uint32_t h) {
    return ((h & 1) << 4) | ((h & 2) << 11) | ((h & 4) << 18) | ((h & 8) << 25);
}

/* Q5_0, 8 blocks of 22 bytes: w = d * (q - 16); bit l of qh is bit 4 of element l. */
struct gq_q5_0 {
    static const bool SPLIT = false, OFFSET = false;
    static const int BLOCK_BYTES = 22 * 8;
    uint32_t q[8], qh[8];
    float d[8];
    __device__ __forceinline__ void load(const uint8_t *b, int c) {
#pragma unroll
        for (int j = 0; j < 8; j++) d[j] = gq_h2f(gq_u16(b + 22 * j)), qh[j] = gq_a2(b + 22 * j + 2), q[j] = gq_a2(b + 22 * j + 6 + 4 * c);
    }
    __device__ __forceinline__ void chunk(int j, int c, uint32_t &lo, uint32_t &hi, float &s0, float &s1, float &m) const {
        lo = __vsub4((q[j] & 0x0F0F0F0F) | spread4b(qh[j] >> (4 * c)), 0x10101010);
        hi = __vsub4(((q[j] >> 4) & 0x0F0F0F0F) | spread4b(qh[j] >> (4 * c + 16)), 0x10101010);
        s0 = s1 = d[j], m = 0.0f;
    }
};

/* Q8_0, 8 blocks of 34 bytes: w = d * q. */
struct gq_q8_0 {
    static const bool SPLIT = false, OFFSET = false;
    static const int BLOCK_BYTES = 34 * 8;
    uint32_t lo_[8], hi_[8];
    float d[8];
    __device__ __forceinline__ void load(const uint8_t *b, int c) {
#pragma unroll
        for (int j = 0; j < 8; j++)
            d[j] = gq_h2f(gq_u16(b + 34 * j)), lo_[j] = gq_a2(b + 34 * j + 2 + 4 * c), hi_[j] = gq_a2(b + 34 * j + 18 + 4 * c);
    }
    __device__ __forceinline__ void chunk(int j, int c, uint32_t &lo, uint32_t &hi, float &s0, float &s1, float &m) const {
        lo = lo_[j], hi = hi_[j], s0 = s1 = d[j], m = 0.0f;
    }
};

/* Q4_K and Q5_K scales[12] (words a, b, cc): the 6-bit scale and min of sub-block j, as get_scale_min_k4. */
static __device__ __forceinline__ void k4_sm(uint32_t a, uint32_t b, uint32_t cc, int j, float &sc, float &mn) {
    const unsigned sh = 8u * (unsigned)(j & 3);
    if (j < 4) {
        sc = gq_i2f((int)((a >> sh) & 63)), mn = gq_i2f((int)((b >> sh) & 63));
    } else {
        sc = gq_i2f((int)(((cc >> sh) & 0x0F) | (((a >> sh) >> 6) & 3) << 4));
        mn = gq_i2f((int)(((cc >> sh) >> 4 & 0x0F) | (((b >> sh) >> 6) & 3) << 4));
    }
}

/* Q4_K, 144 bytes (16-byte aligned): d, dmin, scales[12], qs[128]; element l of sub-block j is nibble j & 1 of
 * qs[32 (j / 2) + l]; w = d * sc_j * q - dmin * m_j. */
struct gq_q4_K {
    static const bool SPLIT = false, OFFSET = true;
    static const int BLOCK_BYTES = 144;
    uint32_t q[8]; /* qs[32 i + 4c] (2i) and qs[32 i + 16 + 4c] (2i + 1) */
    uint4 h;
    __device__ __forceinline__ void load(const uint8_t *b, int c) {
        h = *(const uint4 *)b;
#pragma unroll
        for (int i = 0; i < 4; i++) q[2 * i] = gq_u32(b + 16 + 32 * i + 4 * c), q[2 * i + 1] = gq_u32(b + 32 + 32 * i + 4 * c);
    }
    __device__ __forceinline__ void chunk(int j, int c, uint32_t &lo, uint32_t &hi, float &s0, float &s1, float &m) const {
        const int sh = 4 * (j & 1);
        lo = (q[j & ~1] >> sh) & 0x0F0F0F0F, hi = (q[j | 1] >> sh) & 0x0F0F0F0F;
        float sc, mn;
        k4_sm(h.y, h.z, h.w, j, sc, mn);
        s0 = s1 = gq_h2f((uint16_t)h.x) * sc, m = -gq_h2f((uint16_t)(h.x >> 16)) * mn;
    }
};

/* Q5_K, 176 bytes (16-byte aligned): Q4_K's header, qh[32] at 16 (bit j of qh[l]: bit 4 of element l of sub-block
 * j), qs at 48. */
struct gq_q5_K {
    static const bool SPLIT = false, OFFSET = true;
    static const int BLOCK_BYTES = 176;
    uint32_t q[8], qh0, qh1;
    uint4 h;
    __device__ __forceinline__ void load(const uint8_t *b, int c) {
        h = *(const uint4 *)b;
        qh0 = gq_u32(b + 16 + 4 * c), qh1 = gq_u32(b + 32 + 4 * c);
#pragma unroll
        for (int i = 0; i < 4; i++) q[2 * i] = gq_u32(b + 48 + 32 * i + 4 * c), q[2 * i + 1] = gq_u32(b + 64 + 32 * i + 4 * c);
    }
    __device__ __forceinline__ void chunk(int j, int c, uint32_t &lo, uint32_t &hi, float &s0, float &s1, float &m) const {
        const int sh = 4 * (j & 1);
        lo = ((q[j & ~1] >> sh) & 0x0F0F0F0F) | (((qh0 >> j) & 0x01010101) << 4);
        hi = ((q[j | 1] >> sh) & 0x0F0F0F0F) | (((qh1 >> j) & 0x01010101) << 4);
        float sc, mn;
        k4_sm(h.y, h.z, h.w, j, sc, mn);
        s0 = s1 = gq_h2f((uint16_t)h.x) * sc, m = -gq_h2f((uint16_t)(h.x >> 16)) * mn;
    }
};

/* Q6_K, 210 bytes (2-byte aligned): ql[128], qh[64], scales[16], d. Element l of 32 g' (g' = 4 hf + g) is nibble
 * g >= 2 of ql[64 hf + 32 (g & 1) + l] with bits 2g, 2g+1 of qh[32 hf + l], minus 32; its scale is scales[2 g' +
 * l / 16], so the two 16s of every 32 have their own (SPLIT). */
struct gq_q6_K {
    static const bool SPLIT = true, OFFSET = false;
    static const int BLOCK_BYTES = 210;
    uint32_t ql[2][4], qh[2][2]; /* [hf]: ql at 64 hf + {0, 16, 32, 48} + 4c, qh at 128 + 32 hf + {0, 16} + 4c */
    uint32_t sc[4];
    float d;
    __device__ __forceinline__ void load(const uint8_t *b, int c) {
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
#pragma unroll
            for (int i = 0; i < 4; i++) ql[hf][i] = gq_a2(b + 64 * hf + 16 * i + 4 * c);
            qh[hf][0] = gq_a2(b + 128 + 32 * hf + 4 * c), qh[hf][1] = gq_a2(b + 144 + 32 * hf + 4 * c);
        }
#pragma unroll
        for (int i = 0; i < 4; i++) sc[i] = gq_a2(b + 192 + 4 * i);
        d = gq_h2f(gq_u16(b + 208));
    }
    __device__ __forceinline__ void chunk(int j, int c, uint32_t &lo, uint32_t &hi, float &s0, float &s1, float &m) const {
        const int hf = j / 4, g = j % 4, nib = 4 * (g >> 1), hb = 2 * g;
        lo = __vsub4(((ql[hf][2 * (g & 1)] >> nib) & 0x0F0F0F0F) | (((qh[hf][0] >> hb) & 0x03030303) << 4), 0x20202020);
        hi = __vsub4(((ql[hf][2 * (g & 1) + 1] >> nib) & 0x0F0F0F0F) | (((qh[hf][1] >> hb) & 0x03030303) << 4), 0x20202020);
        const uint32_t w = sc[j / 2]; /* scales[2j], scales[2j + 1] are bytes 2 (j & 1), + 1 of word j / 2 */
        const unsigned sh = 16u * (unsigned)(j & 1);
        s0 = d * gq_i2f((int8_t)(w >> sh)), s1 = d * gq_i2f((int8_t)(w >> (sh + 8))), m = 0.0f;
    }
};

#endif
