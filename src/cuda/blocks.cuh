/* blocks.cuh: device-side pieces of the block formats issue 18 added (Q5_1, Q2_K, Q3_K, IQ4_NL, IQ4_XS) that more
 * than one kernel file needs: the IQ4_NL level table as four immediate words with a register-only lookup (no
 * table in memory: a warp's 32 different indices would serialize on constant memory), the Q3_K scale unpacking,
 * and one-element decoders for dequant.cu and elementwise.cu's embed. The decoders use GGML's float operations in
 * dequantize_row_*'s order, with explicit round-to-nearest intrinsics so nvcc cannot fuse them into FMAs: they are
 * the CPU reference's values bit for bit (tests/test_cuda.c, test_cuda_elementwise.c check them against an
 * independent host dequantizer, tests/test_blocks_ggml.h). */
#ifndef KILN_CUDA_BLOCKS_CUH
#define KILN_CUDA_BLOCKS_CUH

#include "quants.h"

#include <cuda_fp16.h>
#include <stdint.h>

/* kiln_iq4nl_values (-127 -104 -83 -65 | -49 -35 -22 -10 | 1 13 25 38 | 53 69 89 113) as little-endian int8 words. */
#define IQ4NL_W0 0xBFAD9881u
#define IQ4NL_W1 0xF6EADDCFu
#define IQ4NL_W2 0x26190D01u
#define IQ4NL_W3 0x71594535u

/* The level of 4-bit index n (0..15): __byte_perm takes the low 3 bits of its selector, so the two halves of the
 * table are looked up at once and bit 3 picks between them. */
static __device__ __forceinline__ int iq4nl_level(unsigned n) {
    const uint32_t lo = __byte_perm(IQ4NL_W0, IQ4NL_W1, n), hi = __byte_perm(IQ4NL_W2, IQ4NL_W3, n);
    return (int)(int8_t)(uint8_t)((n & 8) ? hi : lo);
}

/* q holds 8 indices as nibbles (byte b: element b in the low nibble, element b + 16 in the high, IQ4_NL's packing
 * of 4 bytes): *lo = the int8 levels of the 4 low nibbles, *hi = those of the 4 high nibbles, as dp4a words. Each
 * 16-bit half of q is 4 selectors; the second permute takes byte k of the high-table result where nibble k has
 * bit 3 set, and the last two deinterleave. */
static __device__ __forceinline__ void iq4nl_levels8(uint32_t q, uint32_t *lo, uint32_t *hi) {
    uint32_t w[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const uint32_t s = q >> (16 * i);
        const uint32_t a = __byte_perm(IQ4NL_W0, IQ4NL_W1, s), b = __byte_perm(IQ4NL_W2, IQ4NL_W3, s);
        w[i] = __byte_perm(a, b, 0x3210u | ((s & 0x8888u) >> 1)); /* levels of nibbles 0..3 of s, in order */
    }
    *lo = __byte_perm(w[0], w[1], 0x6420u); /* nibbles 0, 2, 4, 6: the low nibbles of bytes 0..3 */
    *hi = __byte_perm(w[0], w[1], 0x7531u);
}

/* Q3_K's 6-bit scale k (0..15), stored + 32, from scales[12]: the low 4 bits are the low (k < 8) or high nibble of
 * byte k % 8, the high 2 bits are bits 2 (k / 4) .. +1 of byte 8 + k % 4 (GGML's kmask unpacking). */
static __device__ __forceinline__ int q3k_scale(const uint8_t *scales, int k) {
    return ((scales[k & 7] >> (4 * (k >> 3))) & 0xF) | (((scales[8 + (k & 3)] >> (2 * (k >> 2))) & 3) << 4);
}

/* IQ4_XS's 6-bit scale of sub-block ib (0..7), stored + 32. */
static __device__ __forceinline__ int iq4xs_scale(const block_iq4_xs *b, int ib) {
    return ((b->scales_l[ib >> 1] >> (4 * (ib & 1))) & 0xF) | (((b->scales_h >> (2 * ib)) & 3) << 4);
}

static __device__ __forceinline__ float blk_h2f(kiln_fp16 h) { return __half2float(__ushort_as_half(h)); }

/* ---------------------------------------------------------------- one element e of a row of blocks */

/* Q5_1: x = q * d + m, q's low 4 bits as Q4_1, bit 4 of element j at bit j of qh. */
static __device__ __forceinline__ float dequant_elem_q5_1(const void *row, int64_t e) {
    const block_q5_1 *b = (const block_q5_1 *)row + e / QK5_1;
    const int j = (int)(e % QK5_1);
    const int q = (j < 16 ? (b->qs[j] & 0xF) : (b->qs[j - 16] >> 4)) | (((b->qh[j >> 3] >> (j & 7)) & 1) << 4);
    return __fadd_rn(__fmul_rn((float)q, blk_h2f(b->d)), blk_h2f(b->m));
}

/* IQ4_NL: x = d * level(q), q packed as Q4_0. */
static __device__ __forceinline__ float dequant_elem_iq4_nl(const void *row, int64_t e) {
    const block_iq4_nl *b = (const block_iq4_nl *)row + e / QK4_NL;
    const int j = (int)(e % QK4_NL);
    const unsigned q = j < 16 ? (b->qs[j] & 0xF) : (b->qs[j - 16] >> 4);
    return __fmul_rn(blk_h2f(b->d), (float)iq4nl_level(q));
}

/* Q2_K: element 128 h + 32 j + l (l 0..31) is bits 2j..2j+1 of qs[32 h + l], in sub-block 8 h + 2 j + l / 16;
 * x = (d * sc) * q - dmin * m. */
static __device__ __forceinline__ float dequant_elem_q2_K(const void *row, int64_t i) {
    const block_q2_K *b = (const block_q2_K *)row + i / QK_K;
    const int e = (int)(i % QK_K), h = e / 128, j = (e % 128) / 32, l = e % 32;
    const int sc = b->scales[8 * h + 2 * j + l / 16], q = (b->qs[32 * h + l] >> (2 * j)) & 3;
    const float dl = __fmul_rn(blk_h2f(b->d), (float)(sc & 0xF)), ml = __fmul_rn(blk_h2f(b->dmin), (float)(sc >> 4));
    return __fsub_rn(__fmul_rn(dl, (float)q), ml);
}

/* Q3_K: as Q2_K's 2 bits, minus 4 when bit 4 h + j of hmask[l] is clear; x = (d * (sc - 32)) * q. */
static __device__ __forceinline__ float dequant_elem_q3_K(const void *row, int64_t i) {
    const block_q3_K *b = (const block_q3_K *)row + i / QK_K;
    const int e = (int)(i % QK_K), h = e / 128, j = (e % 128) / 32, l = e % 32;
    const int q = ((b->qs[32 * h + l] >> (2 * j)) & 3) - (((b->hmask[l] >> (4 * h + j)) & 1) ? 0 : 4);
    const float dl = __fmul_rn(blk_h2f(b->d), (float)(q3k_scale(b->scales, 8 * h + 2 * j + l / 16) - 32));
    return __fmul_rn(dl, (float)q);
}

/* IQ4_XS: sub-block ib = e / 32 packs its 32 indices in qs[16 ib ..] as IQ4_NL; x = (d * (sc - 32)) * level(q). */
static __device__ __forceinline__ float dequant_elem_iq4_xs(const void *row, int64_t i) {
    const block_iq4_xs *b = (const block_iq4_xs *)row + i / QK_K;
    const int e = (int)(i % QK_K), ib = e / 32, j = e % 32;
    const uint8_t byte = b->qs[16 * ib + (j & 15)];
    const unsigned q = j < 16 ? (byte & 0xF) : (byte >> 4);
    const float dl = __fmul_rn(blk_h2f(b->d), (float)(iq4xs_scale(b, ib) - 32));
    return __fmul_rn(dl, (float)iq4nl_level(q));
}

#endif
