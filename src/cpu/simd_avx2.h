/* simd_avx2.h: the AVX2 helpers that quants_avx2.c (single-row kernels) and gemm_avx2.c (4-token kernels) share,
 * and the exp polynomial of ops_attention_avx2.c and ops_arch_avx2.c.
 * The 4-token kernels are bit-identical to 4 single-row calls only because both use exactly these. */
#ifndef KILN_SIMD_AVX2_H
#define KILN_SIMD_AVX2_H

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

/* F16C; equals kiln_fp16_to_f32 bit for bit (both quiet a signaling NaN) */
static inline float f16_to_f32(kiln_fp16 h) { return _cvtsh_ss(h); }

static inline float hsum_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 16 bytes of packed nibbles -> 32 bytes: the low nibbles (elements 0..15) then the high ones (16..31). */
static inline __m256i unpack_nibbles16(const uint8_t *qs) {
    __m128i q = _mm_loadu_si128((const __m128i *)qs);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0F));
}

/* pshufb masks that broadcast int16 element k of a 128-bit lane to the whole lane. */
static inline __m256i word_bcast_mask(int k) { return _mm256_set1_epi16((short)((2 * k + 1) << 8 | 2 * k)); }

/* Lane 0: a0*b0, lane 2: a1*b1, from four f16 with one vcvtph2ps (each _cvtsh_ss would cost two
 * shuffle-port uops, the bottleneck of these short-block dots). Same float products as the scalar code. */
static inline __m128 scale_products(kiln_fp16 a0, kiln_fp16 b0, kiln_fp16 a1, kiln_fp16 b1) {
    const uint64_t packed = (uint64_t)a0 | (uint64_t)b0 << 16 | (uint64_t)a1 << 32 | (uint64_t)b1 << 48;
    __m128 f = _mm_cvtph_ps(_mm_cvtsi64_si128((long long)packed));
    return _mm_mul_ps(f, _mm_movehdup_ps(f));
}

/* exp(x) for x <= 0: x = n ln2 + r with |r| <= ln2/2 (ln2 split in two for an exact product), exp(r) by the
 * Cephes expf polynomial, 2^n added to the exponent. x is clamped at -86 so 2^n stays normal: exp(-86) = 4e-38,
 * nothing next to the softmax's largest term, which is 1. Shared by attention's softmax and GELU's tanh. */
static inline __attribute__((always_inline)) __m256 exp_ps(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-86.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23);
    return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), e));
}

#endif
