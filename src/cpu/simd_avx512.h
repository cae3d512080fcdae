/* simd_avx512.h: the AVX-512 helpers that quants_avx512.c (single-row kernels) and gemm_avx512.c (4-token kernels) share.
 * The 4-token kernels are bit-identical to 4 single-row calls only because both use exactly these. */
#ifndef KILN_SIMD_AVX512_H
#define KILN_SIMD_AVX512_H

#include "quants.h"

#include <immintrin.h>
#include <string.h>

/* Bit-exactness needs each product rounded before the add: GCC in ISO C mode does not contract, clang must be
 * told (as in quants_ref.c). */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

/* Small fixed-count loops over arrays of vectors must be unrolled for the arrays to live in registers;
 * GCC at -O2 does not always do it on its own (clang honours the same pragma). */
#define UNROLL _Pragma("GCC unroll 8")

static inline float f16_to_f32(kiln_fp16 h) { return _cvtsh_ss(h); }

static inline float hsum256_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float hsum512_ps(__m512 v) {
    return hsum256_ps(_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)));
}

/* 16 bytes of packed nibbles -> 32 bytes: low nibbles (elements 0..15) then high nibbles (16..31). */
static inline __m256i unpack_nibbles16(const uint8_t *qs) {
    __m128i q = _mm_loadu_si128((const __m128i *)qs);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0F));
}

/* 32 bytes of packed nibbles -> 64 bytes: all low nibbles, then all high nibbles. */
static inline __m512i unpack_nibbles32(const uint8_t *qs) {
    __m256i q = _mm256_loadu_si256((const __m256i *)qs);
    return _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(q), _mm256_srli_epi16(q, 4), 1), _mm512_set1_epi8(0x0F));
}

/* Two 256-bit halves as one 512-bit vector. */
static inline __m512i join256(__m256i lo, __m256i hi) { return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); }

/* vpermw index vectors that spread int16 scales over a 512-bit vector of maddubs pair-sums.
 * halves[j]: words 0..15 <- scale 2j, words 16..31 <- scale 2j+1 (Q4_K/Q5_K: 32 elements per scale).
 * quarters[j]: words 8k..8k+7 <- scale 4j+k (Q6_K: 16 elements per scale). */
static const int16_t scale_idx_halves[4][32] = {
#define H(j) {2*j, 2*j, 2*j, 2*j, 2*j, 2*j, 2*j, 2*j, 2*j, 2*j, 2*j, 2*j, 2*j, 2*j, 2*j, 2*j, \
              2*j+1, 2*j+1, 2*j+1, 2*j+1, 2*j+1, 2*j+1, 2*j+1, 2*j+1, 2*j+1, 2*j+1, 2*j+1, 2*j+1, 2*j+1, 2*j+1, 2*j+1, 2*j+1}
    H(0), H(1), H(2), H(3)
#undef H
};

static const int16_t scale_idx_quarters[4][32] = {
#define Q(j) {4*j, 4*j, 4*j, 4*j, 4*j, 4*j, 4*j, 4*j, 4*j+1, 4*j+1, 4*j+1, 4*j+1, 4*j+1, 4*j+1, 4*j+1, 4*j+1, \
              4*j+2, 4*j+2, 4*j+2, 4*j+2, 4*j+2, 4*j+2, 4*j+2, 4*j+2, 4*j+3, 4*j+3, 4*j+3, 4*j+3, 4*j+3, 4*j+3, 4*j+3, 4*j+3}
    Q(0), Q(1), Q(2), Q(3)
#undef Q
};

/* A 128-element Q6_K chunk as two 64-byte vectors of 6-bit values (0..63), elements 0..63 and 64..127.
 * ql's 64 bytes hold elements 0..63 in low nibbles and 64..127 in high ones; H = [qh | qh >> 2] puts the
 * two high bits of elements 0..63 at bits 0-1 and of 64..127 at bits 4-5 of each byte. 16-bit shifts are
 * safe because every mask keeps only bits that came from the same byte. */
static inline void q6_halves(const uint8_t *ql, const uint8_t *qh, __m512i *lo, __m512i *hi) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m2 = _mm512_set1_epi8(0x30);
    __m512i a = _mm512_loadu_si512((const void *)ql);
    __m256i h = _mm256_loadu_si256((const __m256i *)qh);
    __m512i hz = join256(h, _mm256_srli_epi16(h, 2));
    *lo = _mm512_or_si512(_mm512_and_si512(a, m4), _mm512_and_si512(_mm512_slli_epi16(hz, 4), m2));
    *hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(a, 4), m4), _mm512_and_si512(hz, m2));
}

#endif
