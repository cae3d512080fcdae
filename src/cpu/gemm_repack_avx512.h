/* gemm_repack_avx512.h: the AVX-512 pieces that the VNNI kernels (gemm_repack_avx512.c) and the AMX kernels
 * (gemm_repack_amx.c) share: broadcasts and loads, the partial store of a group, and the unpacking of Q4_K's and
 * Q5_K's scales and quants from the layouts of ops_repack.h. Included only by files compiled with AVX-512. */
#ifndef KILN_CPU_GEMM_REPACK_AVX512_H
#define KILN_CPU_GEMM_REPACK_AVX512_H

#include "ops_repack.h"

#include <immintrin.h>
#include <string.h>

/* The activation bytes x[0..3] (or a float) in every lane. */
static inline __m512i bcast4(const char *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}
static inline __m512 bcastf(const char *p) {
    float v;
    memcpy(&v, p, 4);
    return _mm512_set1_ps(v);
}
static inline __m512 f16x16(const char *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
static inline __m512i ld(const char *p) { return _mm512_loadu_si512((const void *)p); }

/* (a & 0x0F) | b: b holds only bits outside the low nibble (vpternlogd truth table 0xEC over a, b, c = 0x0F). */
static inline __m512i merge_low(__m512i a, __m512i b, __m512i m4) { return _mm512_ternarylogic_epi32(a, b, m4, 0xEC); }

static inline void store_rows(float *y, __m512 v, int nrows) {
    if (nrows == KILN_PACK_ROWS)
        _mm512_storeu_ps(y, v);
    else
        _mm512_mask_storeu_ps(y, (__mmask16)((1u << nrows) - 1), v);
}

/* The 32-element types of ops_repack.c's pack_b32 (gemm_repack_avx512.c's b32_nt says how they are summed). */
enum { B32_Q4_0, B32_Q4_1, B32_IQ4_NL, B32_Q5_0, B32_Q5_1 };

/* IQ4_NL's levels + 128, for vpshufb in each 128-bit lane. */
static inline __m512i iq4nl_table(void) {
    uint8_t t[16];
    for (int i = 0; i < 16; i++) t[i] = (uint8_t)(kiln_iq4nl_values[i] + 128);
    return _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)t));
}

/* Vector k (0..3) of a b32 block q as unsigned quants: lo = elements 4k.., hi = 16 + 4k.., Q5's fifth bits merged
 * in at bit 4 (vector k's low nibbles from bit k of each byte of the qh vector, its high nibbles from bit 4 + k),
 * IQ4_NL's indices looked up (table: iq4nl_table). */
static inline __attribute__((always_inline)) void b32_quants(const char *q, const int kind, int k, __m512i table, __m512i *lo,
                                                            __m512i *hi) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), b4 = _mm512_set1_epi8(0x10), w = ld(q + 64 * k);
    *lo = _mm512_and_si512(w, m4), *hi = _mm512_and_si512(_mm512_srli_epi16(w, 4), m4);
    if (kind == B32_Q5_0 || kind == B32_Q5_1) {
        const __m512i h = ld(q + 256);
        *lo = _mm512_or_si512(*lo, _mm512_and_si512(_mm512_slli_epi16(h, 4 - k), b4));
        *hi = _mm512_or_si512(*hi, _mm512_and_si512(_mm512_srli_epi16(h, k), b4));
    }
    if (kind == B32_IQ4_NL) *lo = _mm512_shuffle_epi8(table, *lo), *hi = _mm512_shuffle_epi8(table, *hi);
}

/* Sub-block scales (sc) and mins (mn) of 16 rows: lane group j & 3 of sc_lo (j < 4) or sc_hi (j >= 4). */
typedef struct {
    __m512i sc_lo, sc_hi, m_lo, m_hi;
} k4_scales;

static inline k4_scales k4_unpack(const char *planes) {
    const __m512i m6 = _mm512_set1_epi8(63), m30 = _mm512_set1_epi8(0x30), m4 = _mm512_set1_epi8(0x0F);
    const __m512i p0 = ld(planes), p1 = ld(planes + 64), p2 = ld(planes + 128); /* bytes 0-3, 4-7, 8-11 */
    k4_scales s;
    s.sc_lo = _mm512_and_si512(p0, m6);
    s.m_lo = _mm512_and_si512(p1, m6);
    s.sc_hi = merge_low(p2, _mm512_and_si512(_mm512_srli_epi16(p0, 2), m30), m4);
    s.m_hi = merge_low(_mm512_srli_epi16(p2, 4), _mm512_and_si512(_mm512_srli_epi16(p1, 2), m30), m4);
    return s;
}

static inline __m512i lane_u8(__m512i v, int j) {
    switch (j & 3) {
    case 0: return _mm512_cvtepu8_epi32(_mm512_castsi512_si128(v));
    case 1: return _mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(v, 1));
    case 2: return _mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(v, 2));
    default: return _mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(v, 3));
    }
}

/* Q8_K block fields, by byte offset (block_q8_K: float d, int8 qs[256], int16 bsums[16]). */
#define Q8K_QS 4
#define Q8K_BSUMS (4 + QK_K)

/* Q5_K: as Q4_K, plus the fifth bit of each quant from qh: vector k of the qh area holds qh[4k..4k+3] of each
 * row, where bit j of qh[l] tops element l of sub-block j. Sub-block j moves that bit to bit 4; there the high
 * nibbles are shifted down (q * 16 would leave no room for it), so no scale is divided by 16. */
static inline __m512i q5_bit4(__m512i h, int j) {
    const __m512i b4 = _mm512_set1_epi8(0x10);
    if (j < 4) return _mm512_and_si512(_mm512_slli_epi16(h, 4 - j), b4);
    if (j == 4) return _mm512_and_si512(h, b4);
    return _mm512_and_si512(_mm512_srli_epi16(h, j - 4), b4);
}

/* Quant vector k of sub-block j: Q4_K's nibbles (the high ones as q * 16), or Q5_K's 5-bit values. */
static inline __m512i k_quants(const char *q, bool q5, int j, int k) {
    const __m512i w = ld(q + 512 * (j >> 1) + 64 * k);
    if (!q5) return _mm512_and_si512(w, _mm512_set1_epi8((j & 1) ? (char)0xF0 : 0x0F));
    const __m512i h = ld(q + QK_K / 2 * KILN_PACK_ROWS + 64 * k);
    return merge_low((j & 1) ? _mm512_srli_epi16(w, 4) : w, q5_bit4(h, j), _mm512_set1_epi8(0x0F));
}

#endif
