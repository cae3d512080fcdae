/* quants_avx512.c: AVX-512 (F/BW/VL/DQ + VNNI + BF16) versions of the block-format kernels whose scalar oracle
 * is quants_ref.c.
 *
 * Same contract as quants_avx2.c: to_float and from_float are bit-exact with the oracle (same float ops, same
 * order, no contraction under -std=c11), vec_dot keeps integer sums exact. Q8_0-style dots use VNNI's dpbusd
 * (u8 x s8, four products summed into int32 without saturation); K-quant dots use maddubs then dpwssd to apply
 * the per-sub-block scales in int32. The activation quantizers (Q8_0/Q8_1/Q8_K from_float) run once per
 * activation row, not once per weight row, so they reuse the AVX2 versions. Tested by tests/test_simd.c. */
#if defined(__x86_64__)

#include "cpu/simd.h"

#include <immintrin.h>
#include "cpu/simd_avx512.h"
#include <string.h>

/* 16 bytes as 16 floats, signed or unsigned. */
static inline __m512 s8x16_ps(__m128i q) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)); }
static inline __m512 u8x16_ps(__m128i q) { return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(q)); }

/* [a0*b0 in lanes 0..7, a1*b1 in lanes 8..15] from four f16 scales. One vcvtph2ps for all four and one
 * permute: converting each with _cvtsh_ss and broadcasting costs ~3 shuffle-port uops apiece, which made these
 * short-block dots shuffle-bound. The products are the same float products the scalar code forms. */
static inline __m512 pair_scales(kiln_fp16 a0, kiln_fp16 b0, kiln_fp16 a1, kiln_fp16 b1) {
    const uint64_t packed = (uint64_t)a0 | (uint64_t)b0 << 16 | (uint64_t)a1 << 32 | (uint64_t)b1 << 48;
    __m128 f = _mm_cvtph_ps(_mm_cvtsi64_si128((long long)packed)); /* a0 b0 a1 b1 */
    __m128 prod = _mm_mul_ps(f, _mm_movehdup_ps(f));                /* a0*b0 . a1*b1 . */
    const __m512i idx = _mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0);
    return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(prod));
}

/* The 32 5-bit codes of a Q5_0 block, 0..31, in element order: bit i of qh is a byte mask for element i. */
static inline __m256i q5_0_codes(const block_q5_0 *b) {
    uint32_t qh;
    memcpy(&qh, b->qh, 4);
    return _mm256_or_si256(unpack_nibbles16(b->qs), _mm256_maskz_mov_epi8((__mmask32)qh, _mm256_set1_epi8(0x10)));
}

static inline __m512i load_idx(const int16_t *idx) { return _mm512_loadu_si512((const void *)idx); }

/* ---------------------------------------------------------------- to_float */

void kiln_to_float_f32_avx512(const void *x, float *y, int64_t k) { memcpy(y, x, (size_t)k * sizeof(float)); }

void kiln_to_float_f16_avx512(const void *vx, float *y, int64_t k) {
    const kiln_fp16 *x = vx;
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) _mm512_storeu_ps(y + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(x + i))));
    if (i < k) {
        __mmask16 m = (__mmask16)((1u << (k - i)) - 1);
        _mm512_mask_storeu_ps(y + i, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, x + i)));
    }
}

void kiln_to_float_bf16_avx512(const void *vx, float *y, int64_t k) {
    const kiln_bf16 *x = vx;
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) {
        __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(x + i)));
        _mm512_storeu_ps(y + i, _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)));
    }
    if (i < k) {
        __mmask16 m = (__mmask16)((1u << (k - i)) - 1);
        __m512i v = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, x + i));
        _mm512_mask_storeu_ps(y + i, m, _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)));
    }
}

void kiln_to_float_q4_0_avx512(const void *vx, float *y, int64_t k) {
    const block_q4_0 *x = vx;
    for (int64_t i = 0; i < k / QK4_0; i++, y += QK4_0) {
        const __m512 d = _mm512_set1_ps(f16_to_f32(x[i].d));
        __m256i q = _mm256_sub_epi8(unpack_nibbles16(x[i].qs), _mm256_set1_epi8(8));
        _mm512_storeu_ps(y, _mm512_mul_ps(s8x16_ps(_mm256_castsi256_si128(q)), d));
        _mm512_storeu_ps(y + 16, _mm512_mul_ps(s8x16_ps(_mm256_extracti128_si256(q, 1)), d));
    }
}

void kiln_to_float_q4_1_avx512(const void *vx, float *y, int64_t k) {
    const block_q4_1 *x = vx;
    for (int64_t i = 0; i < k / QK4_1; i++, y += QK4_1) {
        const __m512 d = _mm512_set1_ps(f16_to_f32(x[i].d)), mn = _mm512_set1_ps(f16_to_f32(x[i].m));
        __m256i q = unpack_nibbles16(x[i].qs);
        _mm512_storeu_ps(y, _mm512_add_ps(_mm512_mul_ps(u8x16_ps(_mm256_castsi256_si128(q)), d), mn));
        _mm512_storeu_ps(y + 16, _mm512_add_ps(_mm512_mul_ps(u8x16_ps(_mm256_extracti128_si256(q, 1)), d), mn));
    }
}

void kiln_to_float_q5_0_avx512(const void *vx, float *y, int64_t k) {
    const block_q5_0 *x = vx;
    for (int64_t i = 0; i < k / QK5_0; i++, y += QK5_0) {
        const __m512 d = _mm512_set1_ps(f16_to_f32(x[i].d));
        __m256i q = _mm256_sub_epi8(q5_0_codes(&x[i]), _mm256_set1_epi8(16));
        _mm512_storeu_ps(y, _mm512_mul_ps(s8x16_ps(_mm256_castsi256_si128(q)), d));
        _mm512_storeu_ps(y + 16, _mm512_mul_ps(s8x16_ps(_mm256_extracti128_si256(q, 1)), d));
    }
}

void kiln_to_float_q8_0_avx512(const void *vx, float *y, int64_t k) {
    const block_q8_0 *x = vx;
    for (int64_t i = 0; i < k / QK8_0; i++, y += QK8_0) {
        const __m512 d = _mm512_set1_ps(f16_to_f32(x[i].d));
        _mm512_storeu_ps(y, _mm512_mul_ps(s8x16_ps(_mm_loadu_si128((const __m128i *)x[i].qs)), d));
        _mm512_storeu_ps(y + 16, _mm512_mul_ps(s8x16_ps(_mm_loadu_si128((const __m128i *)(x[i].qs + 16))), d));
    }
}

void kiln_to_float_q8_1_avx512(const void *vx, float *y, int64_t k) {
    const block_q8_1 *x = vx;
    for (int64_t i = 0; i < k / QK8_1; i++, y += QK8_1) {
        const __m512 d = _mm512_set1_ps(f16_to_f32(x[i].d));
        _mm512_storeu_ps(y, _mm512_mul_ps(s8x16_ps(_mm_loadu_si128((const __m128i *)x[i].qs)), d));
        _mm512_storeu_ps(y + 16, _mm512_mul_ps(s8x16_ps(_mm_loadu_si128((const __m128i *)(x[i].qs + 16))), d));
    }
}

/* y = (d*sc)*q - (dmin*m): 64 values (two sub-blocks) at a time in z, first sub-block in bytes 0..31. */
static inline void store_k4_chunk(float *y, __m512i z, float ds0, float dm0, float ds1, float dm1) {
    const __m512 s0 = _mm512_set1_ps(ds0), m0 = _mm512_set1_ps(dm0), s1 = _mm512_set1_ps(ds1), m1 = _mm512_set1_ps(dm1);
    _mm512_storeu_ps(y + 0, _mm512_sub_ps(_mm512_mul_ps(s0, u8x16_ps(_mm512_extracti32x4_epi32(z, 0))), m0));
    _mm512_storeu_ps(y + 16, _mm512_sub_ps(_mm512_mul_ps(s0, u8x16_ps(_mm512_extracti32x4_epi32(z, 1))), m0));
    _mm512_storeu_ps(y + 32, _mm512_sub_ps(_mm512_mul_ps(s1, u8x16_ps(_mm512_extracti32x4_epi32(z, 2))), m1));
    _mm512_storeu_ps(y + 48, _mm512_sub_ps(_mm512_mul_ps(s1, u8x16_ps(_mm512_extracti32x4_epi32(z, 3))), m1));
}

void kiln_to_float_q4_K_avx512(const void *vx, float *y, int64_t k) {
    const block_q4_K *x = vx;
    for (int64_t i = 0; i < k / QK_K; i++) {
        const float d = f16_to_f32(x[i].d), dmin = f16_to_f32(x[i].dmin);
        uint32_t sm[4];
        kiln_unpack_scales_k4(x[i].scales, sm);
        const uint8_t *sc = (const uint8_t *)sm, *mn = sc + 8;
        UNROLL for (int j = 0; j < 4; j++, y += 64)
            store_k4_chunk(y, unpack_nibbles32(x[i].qs + 32 * j), d * sc[2 * j], dmin * mn[2 * j], d * sc[2 * j + 1], dmin * mn[2 * j + 1]);
    }
}

/* hz = [qh | qh >> 1]: bit 2j of byte l in the low half tops element l of sub-block 2j, the same bit in the
 * high half tops element l of sub-block 2j+1. Each chunk moves that bit to bit 4, then hz shifts right by 2. */
void kiln_to_float_q5_K_avx512(const void *vx, float *y, int64_t k) {
    const block_q5_K *x = vx;
    const __m512i b4 = _mm512_set1_epi8(0x10);
    for (int64_t i = 0; i < k / QK_K; i++) {
        const float d = f16_to_f32(x[i].d), dmin = f16_to_f32(x[i].dmin);
        uint32_t sm[4];
        kiln_unpack_scales_k4(x[i].scales, sm);
        const uint8_t *sc = (const uint8_t *)sm, *mn = sc + 8;
        __m256i qh = _mm256_loadu_si256((const __m256i *)x[i].qh);
        __m512i hz = join256(qh, _mm256_srli_epi16(qh, 1));
        UNROLL for (int j = 0; j < 4; j++, y += 64) {
            /* z | (hz<<4 & 0x10) */
            __m512i z = _mm512_ternarylogic_epi32(unpack_nibbles32(x[i].qs + 32 * j), _mm512_slli_epi16(hz, 4), b4, 0xF8);
            hz = _mm512_srli_epi16(hz, 2);
            store_k4_chunk(y, z, d * sc[2 * j], dmin * mn[2 * j], d * sc[2 * j + 1], dmin * mn[2 * j + 1]);
        }
    }
}

void kiln_to_float_q6_K_avx512(const void *vx, float *y, int64_t k) {
    const block_q6_K *x = vx;
    const __m512i off = _mm512_set1_epi8(32);
    for (int64_t i = 0; i < k / QK_K; i++) {
        const float d = f16_to_f32(x[i].d);
        UNROLL for (int c = 0; c < 2; c++) {
            __m512i h[2];
            q6_halves(x[i].ql + 64 * c, x[i].qh + 32 * c, &h[0], &h[1]);
            UNROLL for (int m = 0; m < 2; m++) {
                __m512i q = _mm512_sub_epi8(h[m], off);
                /* one 16-byte lane is one scale group */
                const int8_t *sc = x[i].scales + 8 * c + 4 * m;
                _mm512_storeu_ps(y + 0, _mm512_mul_ps(_mm512_set1_ps(d * sc[0]), s8x16_ps(_mm512_extracti32x4_epi32(q, 0))));
                _mm512_storeu_ps(y + 16, _mm512_mul_ps(_mm512_set1_ps(d * sc[1]), s8x16_ps(_mm512_extracti32x4_epi32(q, 1))));
                _mm512_storeu_ps(y + 32, _mm512_mul_ps(_mm512_set1_ps(d * sc[2]), s8x16_ps(_mm512_extracti32x4_epi32(q, 2))));
                _mm512_storeu_ps(y + 48, _mm512_mul_ps(_mm512_set1_ps(d * sc[3]), s8x16_ps(_mm512_extracti32x4_epi32(q, 3))));
                y += 64;
            }
        }
    }
}

void kiln_to_float_q8_K_avx512(const void *vx, float *y, int64_t k) {
    const block_q8_K *x = vx;
    for (int64_t i = 0; i < k / QK_K; i++, y += QK_K) {
        const __m512 d = _mm512_set1_ps(x[i].d);
        for (int m = 0; m < QK_K / 16; m++)
            _mm512_storeu_ps(y + 16 * m, _mm512_mul_ps(d, s8x16_ps(_mm_loadu_si128((const __m128i *)(x[i].qs + 16 * m)))));
    }
}

/* ---------------------------------------------------------------- from_float */

void kiln_from_float_f32_avx512(const float *x, void *y, int64_t k) { memcpy(y, x, (size_t)k * sizeof(float)); }

void kiln_from_float_f16_avx512(const float *x, void *vy, int64_t k) {
    kiln_fp16 *y = vy;
    int64_t i = 0;
    for (; i + 16 <= k; i += 16)
        _mm256_storeu_si256((__m256i *)(y + i), _mm512_cvtps_ph(_mm512_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    if (i < k) {
        __mmask16 m = (__mmask16)((1u << (k - i)) - 1);
        __m256i h = _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm256_mask_storeu_epi16(y + i, m, h);
    }
}

/* kiln_f32_to_bf16 in integer lanes (vcvtneps2bf16 would flush subnormal inputs to zero). */
static inline __m256i f32_to_bf16_16(__m512 v) {
    __m512i b = _mm512_castps_si512(v);
    __m512i hi = _mm512_srli_epi32(b, 16);
    __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(b, _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                                                                            _mm512_and_si512(hi, _mm512_set1_epi32(1)))), 16);
    __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    __m512i r = _mm512_mask_or_epi32(rounded, nan, hi, _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(r);
}

void kiln_from_float_bf16_avx512(const float *x, void *vy, int64_t k) {
    kiln_bf16 *y = vy;
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) _mm256_storeu_si256((__m256i *)(y + i), f32_to_bf16_16(_mm512_loadu_ps(x + i)));
    if (i < k) {
        __mmask16 m = (__mmask16)((1u << (k - i)) - 1);
        _mm256_mask_storeu_epi16(y + i, m, f32_to_bf16_16(_mm512_maskz_loadu_ps(m, x + i)));
    }
}

void kiln_from_float_q8_0_avx512(const float *x, void *y, int64_t k) { kiln_from_float_q8_0_avx2(x, y, k); }
void kiln_from_float_q8_1_avx512(const float *x, void *y, int64_t k) { kiln_from_float_q8_1_avx2(x, y, k); }
void kiln_from_float_q8_K_avx512(const float *x, void *y, int64_t k) { kiln_from_float_q8_K_avx2(x, y, k); }

/* ---------------------------------------------------------------- vec_dot, float types */

void kiln_vec_dot_f32_avx512(int64_t n, float *s, const void *vx, const void *vy) {
    const float *x = vx, *y = vy;
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    int64_t i = 0;
    for (; i + 64 <= n; i += 64)
        UNROLL for (int m = 0; m < 4; m++)
            acc[m] = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 16 * m), _mm512_loadu_ps(y + i + 16 * m), acc[m]);
    for (; i + 16 <= n; i += 16) acc[0] = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i), acc[0]);
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        acc[1] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i), acc[1]);
    }
    *s = hsum512_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
}

void kiln_vec_dot_f16_avx512(int64_t n, float *s, const void *vx, const void *vy) {
    const kiln_fp16 *x = vx, *y = vy;
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    int64_t i = 0;
    for (; i + 64 <= n; i += 64)
        UNROLL for (int m = 0; m < 4; m++)
            acc[m] = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(x + i + 16 * m))),
                                     _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(y + i + 16 * m))), acc[m]);
    for (; i + 16 <= n; i += 16)
        acc[0] = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(x + i))),
                                 _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(y + i))), acc[0]);
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        acc[1] = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, x + i)),
                                 _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, y + i)), acc[1]);
    }
    *s = hsum512_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
}

/* vdpbf16ps: 32 bf16 pairs per instruction. Products of two bf16 are exact in float; the instruction treats
 * subnormal inputs as zero, which moves the sum by less than 2^-126 per term. */
void kiln_vec_dot_bf16_avx512(int64_t n, float *s, const void *vx, const void *vy) {
    const kiln_bf16 *x = vx, *y = vy;
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    int64_t i = 0;
    for (; i + 128 <= n; i += 128)
        UNROLL for (int m = 0; m < 4; m++)
            acc[m] = _mm512_dpbf16_ps(acc[m], (__m512bh)_mm512_loadu_si512((const void *)(x + i + 32 * m)),
                                      (__m512bh)_mm512_loadu_si512((const void *)(y + i + 32 * m)));
    for (; i + 32 <= n; i += 32)
        acc[0] = _mm512_dpbf16_ps(acc[0], (__m512bh)_mm512_loadu_si512((const void *)(x + i)),
                                  (__m512bh)_mm512_loadu_si512((const void *)(y + i)));
    if (i < n) {
        __mmask32 m = (__mmask32)((1ull << (n - i)) - 1);
        acc[1] = _mm512_dpbf16_ps(acc[1], (__m512bh)_mm512_maskz_loadu_epi16(m, x + i), (__m512bh)_mm512_maskz_loadu_epi16(m, y + i));
    }
    *s = hsum512_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
}

/* ---------------------------------------------------------------- vec_dot, 32-element blocks
 * Two blocks per 512-bit step (block b's 32 values in bytes 32b..32b+31), an odd last block at 256 bits.
 * dpbusd multiplies unsigned by signed bytes, so signed weights are offset to unsigned and the offset
 * removed with a second dpbusd against the same activations: sum (w+o)*y - sum o*y, exact for every byte. */

void kiln_vec_dot_q4_0_q8_0_avx512(int64_t n, float *s, const void *vx, const void *vy) {
    const block_q4_0 *x = vx;
    const block_q8_0 *y = vy;
    const int64_t nb = n / QK4_0;
    __m512 acc = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        __m512i qx = join256(unpack_nibbles16(x[i].qs), unpack_nibbles16(x[i + 1].qs));
        __m512i qy = join256(_mm256_loadu_si256((const __m256i *)y[i].qs), _mm256_loadu_si256((const __m256i *)y[i + 1].qs));
        __m512i p = _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), qx, qy),
                                     _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(8), qy));
        __m512 d = pair_scales(x[i].d, y[i].d, x[i + 1].d, y[i + 1].d);
        acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(p), acc);
    }
    float sum = hsum512_ps(acc);
    if (i < nb) {
        __m256i qy = _mm256_loadu_si256((const __m256i *)y[i].qs);
        __m256i p = _mm256_sub_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), unpack_nibbles16(x[i].qs), qy),
                                     _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(8), qy));
        sum += f16_to_f32(x[i].d) * f16_to_f32(y[i].d) * hsum256_ps(_mm256_cvtepi32_ps(p));
    }
    *s = sum;
}

void kiln_vec_dot_q5_0_q8_0_avx512(int64_t n, float *s, const void *vx, const void *vy) {
    const block_q5_0 *x = vx;
    const block_q8_0 *y = vy;
    const int64_t nb = n / QK5_0;
    __m512 acc = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        __m512i qx = join256(q5_0_codes(&x[i]), q5_0_codes(&x[i + 1]));
        __m512i qy = join256(_mm256_loadu_si256((const __m256i *)y[i].qs), _mm256_loadu_si256((const __m256i *)y[i + 1].qs));
        __m512i p = _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), qx, qy),
                                     _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(16), qy));
        __m512 d = pair_scales(x[i].d, y[i].d, x[i + 1].d, y[i + 1].d);
        acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(p), acc);
    }
    float sum = hsum512_ps(acc);
    if (i < nb) {
        __m256i qy = _mm256_loadu_si256((const __m256i *)y[i].qs);
        __m256i p = _mm256_sub_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), q5_0_codes(&x[i]), qy),
                                     _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(16), qy));
        sum += f16_to_f32(x[i].d) * f16_to_f32(y[i].d) * hsum256_ps(_mm256_cvtepi32_ps(p));
    }
    *s = sum;
}

void kiln_vec_dot_q4_1_q8_1_avx512(int64_t n, float *s, const void *vx, const void *vy) {
    const block_q4_1 *x = vx;
    const block_q8_1 *y = vy;
    const int64_t nb = n / QK4_1;
    __m512 acc = _mm512_setzero_ps();
    __m256 acc_m = _mm256_setzero_ps(); /* lanes 4 and 6: sums of m_x * s_y */
    float summs = 0.0f;
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        __m512i qx = join256(unpack_nibbles16(x[i].qs), unpack_nibbles16(x[i + 1].qs));
        __m512i qy = join256(_mm256_loadu_si256((const __m256i *)y[i].qs), _mm256_loadu_si256((const __m256i *)y[i + 1].qs));
        __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), qx, qy);
        /* all eight f16 in one conversion: products d_x*d_y in lanes 0, 2 and m_x*s_y in lanes 4, 6 */
        const uint64_t dd = (uint64_t)x[i].d | (uint64_t)y[i].d << 16 | (uint64_t)x[i + 1].d << 32 | (uint64_t)y[i + 1].d << 48;
        const uint64_t ms = (uint64_t)x[i].m | (uint64_t)y[i].s << 16 | (uint64_t)x[i + 1].m << 32 | (uint64_t)y[i + 1].s << 48;
        const __m128i h = _mm_set_epi64x((long long)ms, (long long)dd);
        const __m256 f = _mm256_cvtph_ps(h), prod = _mm256_mul_ps(f, _mm256_movehdup_ps(f));
        const __m512i idx = _mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0);
        acc = _mm512_fmadd_ps(_mm512_permutexvar_ps(idx, _mm512_castps256_ps512(prod)), _mm512_cvtepi32_ps(p), acc);
        acc_m = _mm256_add_ps(acc_m, prod);
    }
    float sum = hsum512_ps(acc);
    if (i < nb) {
        __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), unpack_nibbles16(x[i].qs), _mm256_loadu_si256((const __m256i *)y[i].qs));
        sum += f16_to_f32(x[i].d) * f16_to_f32(y[i].d) * hsum256_ps(_mm256_cvtepi32_ps(p));
        summs += f16_to_f32(x[i].m) * f16_to_f32(y[i].s);
    }
    __m128 m = _mm256_extractf128_ps(acc_m, 1);
    *s = sum + summs + _mm_cvtss_f32(_mm_add_ss(m, _mm_movehl_ps(m, m)));
}

void kiln_vec_dot_q8_0_q8_0_avx512(int64_t n, float *s, const void *vx, const void *vy) {
    const block_q8_0 *x = vx;
    const block_q8_0 *y = vy;
    const int64_t nb = n / QK8_0;
    const __m512i off = _mm512_set1_epi8((char)0x80); /* x ^ 0x80 = x + 128 as an unsigned byte */
    __m512 acc = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        __m512i qx = join256(_mm256_loadu_si256((const __m256i *)x[i].qs), _mm256_loadu_si256((const __m256i *)x[i + 1].qs));
        __m512i qy = join256(_mm256_loadu_si256((const __m256i *)y[i].qs), _mm256_loadu_si256((const __m256i *)y[i + 1].qs));
        __m512i p = _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_xor_si512(qx, off), qy),
                                     _mm512_dpbusd_epi32(_mm512_setzero_si512(), off, qy));
        __m512 d = pair_scales(x[i].d, y[i].d, x[i + 1].d, y[i + 1].d);
        acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(p), acc);
    }
    float sum = hsum512_ps(acc);
    if (i < nb) {
        const __m256i off8 = _mm512_castsi512_si256(off);
        __m256i qx = _mm256_loadu_si256((const __m256i *)x[i].qs), qy = _mm256_loadu_si256((const __m256i *)y[i].qs);
        __m256i p = _mm256_sub_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_xor_si256(qx, off8), qy),
                                     _mm256_dpbusd_epi32(_mm256_setzero_si256(), off8, qy));
        sum += f16_to_f32(x[i].d) * f16_to_f32(y[i].d) * hsum256_ps(_mm256_cvtepi32_ps(p));
    }
    *s = sum;
}

/* ---------------------------------------------------------------- vec_dot, K-quants
 * maddubs (weights 0..63 times activations: pairs <= 2*63*128, no saturation) then dpwssd with the int16
 * scale of each pair's sub-block, accumulating int32 per 256-element block; one float fma per block. */

/* mins . (bsums[2j] + bsums[2j+1]) as 8 int32 lanes: the Q4_K/Q5_K "- dmin*m" term. */
static inline __m256i mins_dot_bsums(const uint32_t sm[4], const int16_t *bsums) {
    __m128i m8 = _mm_loadl_epi64((const __m128i *)(sm + 2));
    __m256i m16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8)); /* m0 m0 m1 m1 ... m7 m7 */
    return _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)bsums), m16);
}

void kiln_vec_dot_q4_K_q8_K_avx512(int64_t n, float *s, const void *vx, const void *vy) {
    const block_q4_K *x = vx;
    const block_q8_K *y = vy;
    __m512i idx[4];
    UNROLL for (int j = 0; j < 4; j++) idx[j] = load_idx(scale_idx_halves[j]);
    __m512 acc = _mm512_setzero_ps();
    __m256 acc_m = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = f16_to_f32(x[i].d) * y[i].d, dmin = f16_to_f32(x[i].dmin) * y[i].d;
        uint32_t sm[4];
        kiln_unpack_scales_k4(x[i].scales, sm);
        acc_m = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(mins_dot_bsums(sm, y[i].bsums)), acc_m);
        const __m512i sc16 = _mm512_zextsi128_si512(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)sm)));
        __m512i isum = _mm512_setzero_si512();
        UNROLL for (int j = 0; j < 4; j++) {
            __m512i p = _mm512_maddubs_epi16(unpack_nibbles32(x[i].qs + 32 * j), _mm512_loadu_si512((const void *)(y[i].qs + 64 * j)));
            isum = _mm512_dpwssd_epi32(isum, p, _mm512_permutexvar_epi16(idx[j], sc16));
        }
        acc = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(isum), acc);
    }
    *s = hsum512_ps(acc) - hsum256_ps(acc_m);
}

void kiln_vec_dot_q5_K_q8_K_avx512(int64_t n, float *s, const void *vx, const void *vy) {
    const block_q5_K *x = vx;
    const block_q8_K *y = vy;
    const __m512i b4 = _mm512_set1_epi8(0x10);
    __m512i idx[4];
    UNROLL for (int j = 0; j < 4; j++) idx[j] = load_idx(scale_idx_halves[j]);
    __m512 acc = _mm512_setzero_ps();
    __m256 acc_m = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = f16_to_f32(x[i].d) * y[i].d, dmin = f16_to_f32(x[i].dmin) * y[i].d;
        uint32_t sm[4];
        kiln_unpack_scales_k4(x[i].scales, sm);
        acc_m = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(mins_dot_bsums(sm, y[i].bsums)), acc_m);
        const __m512i sc16 = _mm512_zextsi128_si512(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)sm)));
        __m256i qh = _mm256_loadu_si256((const __m256i *)x[i].qh);
        __m512i hz = join256(qh, _mm256_srli_epi16(qh, 1)); /* see kiln_to_float_q5_K_avx512 */
        __m512i isum = _mm512_setzero_si512();
        UNROLL for (int j = 0; j < 4; j++) {
            __m512i z = _mm512_ternarylogic_epi32(unpack_nibbles32(x[i].qs + 32 * j), _mm512_slli_epi16(hz, 4), b4, 0xF8);
            hz = _mm512_srli_epi16(hz, 2);
            __m512i p = _mm512_maddubs_epi16(z, _mm512_loadu_si512((const void *)(y[i].qs + 64 * j)));
            isum = _mm512_dpwssd_epi32(isum, p, _mm512_permutexvar_epi16(idx[j], sc16));
        }
        acc = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(isum), acc);
    }
    *s = hsum512_ps(acc) - hsum256_ps(acc_m);
}

/* sum_g sc[g]*dot(q-32, y) = sum_g sc[g]*dot(q, y) - 32*sum_g sc[g]*bsums[g]; each 128-bit lane of a 64-byte
 * half is one 16-element scale group. */
void kiln_vec_dot_q6_K_q8_K_avx512(int64_t n, float *s, const void *vx, const void *vy) {
    const block_q6_K *x = vx;
    const block_q8_K *y = vy;
    __m512i idx[4];
    UNROLL for (int j = 0; j < 4; j++) idx[j] = load_idx(scale_idx_quarters[j]);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = f16_to_f32(x[i].d) * y[i].d;
        const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x[i].scales));
        const __m256i corr = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y[i].bsums), sc16);
        const __m512i sc = _mm512_zextsi256_si512(sc16);
        __m512i isum = _mm512_setzero_si512();
        UNROLL for (int c = 0; c < 2; c++) {
            __m512i h[2];
            q6_halves(x[i].ql + 64 * c, x[i].qh + 32 * c, &h[0], &h[1]);
            UNROLL for (int m = 0; m < 2; m++) {
                __m512i p = _mm512_maddubs_epi16(h[m], _mm512_loadu_si512((const void *)(y[i].qs + 128 * c + 64 * m)));
                isum = _mm512_dpwssd_epi32(isum, p, _mm512_permutexvar_epi16(idx[2 * c + m], sc));
            }
        }
        isum = _mm512_sub_epi32(isum, _mm512_zextsi256_si512(_mm256_slli_epi32(corr, 5)));
        acc = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(isum), acc);
    }
    *s = hsum512_ps(acc);
}

/* ---------------------------------------------------------------- the low-bit types (Q5_1, Q2_K, Q3_K, IQ4_NL, IQ4_XS)
 * to_float runs the AVX2 kernels (quants_avx2.c): it serves embedding rows and kiln quantize, never a matmul, so
 * it is not worth a second copy; the results are the oracle's bits at both levels. The dots use the contract
 * above: dpbusd for the 32-element blocks (IQ4's signed levels offset by 128, the offset removed with a second
 * dpbusd), maddubs then dpwssd with per-sub-block int16 scales for the 16-element K-quant sub-blocks. */

void kiln_to_float_q5_1_avx512(const void *x, float *y, int64_t k) { kiln_to_float_q5_1_avx2(x, y, k); }
void kiln_to_float_q2_K_avx512(const void *x, float *y, int64_t k) { kiln_to_float_q2_K_avx2(x, y, k); }
void kiln_to_float_q3_K_avx512(const void *x, float *y, int64_t k) { kiln_to_float_q3_K_avx2(x, y, k); }
void kiln_to_float_iq4_nl_avx512(const void *x, float *y, int64_t k) { kiln_to_float_iq4_nl_avx2(x, y, k); }
void kiln_to_float_iq4_xs_avx512(const void *x, float *y, int64_t k) { kiln_to_float_iq4_xs_avx2(x, y, k); }

/* The 32 5-bit codes of a Q5_1 block, 0..31, in element order (qh as Q5_0's). */
static inline __m256i q5_1_codes(const block_q5_1 *b) {
    uint32_t qh;
    memcpy(&qh, b->qh, 4);
    return _mm256_or_si256(unpack_nibbles16(b->qs), _mm256_maskz_mov_epi8((__mmask32)qh, _mm256_set1_epi8(0x10)));
}

/* The IQ4 levels of 16 packed bytes (32 indices), element order, plus 128: unsigned bytes 1..241 for dpbusd. */
static inline __m256i iq4_levels_u8(const uint8_t *qs) {
    const __m256i table = _mm256_xor_si256(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)kiln_iq4nl_values)),
                                           _mm256_set1_epi8((char)0x80));
    return _mm256_shuffle_epi8(table, unpack_nibbles16(qs));
}

/* Q4_1's kernel with 5-bit codes: two blocks per step, the min term from Q8_1's s. */
void kiln_vec_dot_q5_1_q8_1_avx512(int64_t n, float *s, const void *vx, const void *vy) {
    const block_q5_1 *x = vx;
    const block_q8_1 *y = vy;
    const int64_t nb = n / QK5_1;
    __m512 acc = _mm512_setzero_ps();
    __m256 acc_m = _mm256_setzero_ps(); /* lanes 4 and 6: sums of m_x * s_y */
    float summs = 0.0f;
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        __m512i qx = join256(q5_1_codes(&x[i]), q5_1_codes(&x[i + 1]));
        __m512i qy = join256(_mm256_loadu_si256((const __m256i *)y[i].qs), _mm256_loadu_si256((const __m256i *)y[i + 1].qs));
        __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), qx, qy);
        const uint64_t dd = (uint64_t)x[i].d | (uint64_t)y[i].d << 16 | (uint64_t)x[i + 1].d << 32 | (uint64_t)y[i + 1].d << 48;
        const uint64_t ms = (uint64_t)x[i].m | (uint64_t)y[i].s << 16 | (uint64_t)x[i + 1].m << 32 | (uint64_t)y[i + 1].s << 48;
        const __m256 f = _mm256_cvtph_ps(_mm_set_epi64x((long long)ms, (long long)dd)), prod = _mm256_mul_ps(f, _mm256_movehdup_ps(f));
        const __m512i idx = _mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0);
        acc = _mm512_fmadd_ps(_mm512_permutexvar_ps(idx, _mm512_castps256_ps512(prod)), _mm512_cvtepi32_ps(p), acc);
        acc_m = _mm256_add_ps(acc_m, prod);
    }
    float sum = hsum512_ps(acc);
    if (i < nb) {
        __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), q5_1_codes(&x[i]), _mm256_loadu_si256((const __m256i *)y[i].qs));
        sum += f16_to_f32(x[i].d) * f16_to_f32(y[i].d) * hsum256_ps(_mm256_cvtepi32_ps(p));
        summs += f16_to_f32(x[i].m) * f16_to_f32(y[i].s);
    }
    __m128 m = _mm256_extractf128_ps(acc_m, 1);
    *s = sum + summs + _mm_cvtss_f32(_mm_add_ss(m, _mm_movehl_ps(m, m)));
}

/* sum (v+128)*y - sum 128*y = sum v*y, two blocks per step. */
void kiln_vec_dot_iq4_nl_q8_0_avx512(int64_t n, float *s, const void *vx, const void *vy) {
    const block_iq4_nl *x = vx;
    const block_q8_0 *y = vy;
    const int64_t nb = n / QK4_NL;
    __m512 acc = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        __m512i qx = join256(iq4_levels_u8(x[i].qs), iq4_levels_u8(x[i + 1].qs));
        __m512i qy = join256(_mm256_loadu_si256((const __m256i *)y[i].qs), _mm256_loadu_si256((const __m256i *)y[i + 1].qs));
        __m512i p = _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), qx, qy),
                                     _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8((char)0x80), qy));
        acc = _mm512_fmadd_ps(pair_scales(x[i].d, y[i].d, x[i + 1].d, y[i + 1].d), _mm512_cvtepi32_ps(p), acc);
    }
    float sum = hsum512_ps(acc);
    if (i < nb) {
        __m256i qy = _mm256_loadu_si256((const __m256i *)y[i].qs);
        __m256i p = _mm256_sub_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), iq4_levels_u8(x[i].qs), qy),
                                     _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8((char)0x80), qy));
        sum += f16_to_f32(x[i].d) * f16_to_f32(y[i].d) * hsum256_ps(_mm256_cvtepi32_ps(p));
    }
    *s = sum;
}

/* Two 32-element sub-blocks per step (one per 256-bit half), each dot times its (ls - 32) in int32. */
void kiln_vec_dot_iq4_xs_q8_K_avx512(int64_t n, float *s, const void *vx, const void *vy) {
    const block_iq4_xs *x = vx;
    const block_q8_K *y = vy;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        __m512i isum = _mm512_setzero_si512();
        UNROLL for (int j = 0; j < QK_K / 64; j++) {
            int ls[2];
            UNROLL for (int h = 0; h < 2; h++) {
                const int sb = 2 * j + h;
                ls[h] = (((x[i].scales_l[sb / 2] >> (4 * (sb % 2))) & 0xF) | ((x[i].scales_h >> (2 * sb)) & 3) << 4) - 32;
            }
            __m512i qx = join256(iq4_levels_u8(x[i].qs + 32 * j), iq4_levels_u8(x[i].qs + 32 * j + 16));
            __m512i qy = _mm512_loadu_si512((const void *)(y[i].qs + 64 * j));
            __m512i p = _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), qx, qy),
                                         _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8((char)0x80), qy));
            isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(p, join256(_mm256_set1_epi32(ls[0]), _mm256_set1_epi32(ls[1]))));
        }
        acc = _mm512_fmadd_ps(_mm512_set1_ps(f16_to_f32(x[i].d) * y[i].d), _mm512_cvtepi32_ps(isum), acc);
    }
    *s = hsum512_ps(acc);
}

/* 64 codes of a 128-element half: bit pairs r and r+1 of its 32 bytes q, elements 32r..32r+63 of the half. */
static inline __m512i two_bit_pairs(__m256i q, int r) {
    const __m256i m2 = _mm256_set1_epi8(3);
    return join256(_mm256_and_si256(_mm256_srli_epi16(q, 2 * r), m2), _mm256_and_si256(_mm256_srli_epi16(q, 2 * r + 2), m2));
}

/* Each 64-byte step is four 16-element sub-blocks: words 8k..8k+7 of the maddubs pair-sums get scale 4j+k
 * (scale_idx_quarters, as Q6_K). The min term from the bsums, as the AVX2 kernel. */
void kiln_vec_dot_q2_K_q8_K_avx512(int64_t n, float *s, const void *vx, const void *vy) {
    const block_q2_K *x = vx;
    const block_q8_K *y = vy;
    __m512i idx[4];
    UNROLL for (int j = 0; j < 4; j++) idx[j] = load_idx(scale_idx_quarters[j]);
    const __m128i m4 = _mm_set1_epi8(0x0F);
    __m512 acc = _mm512_setzero_ps();
    __m256 acc_m = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = f16_to_f32(x[i].d) * y[i].d, dmin = f16_to_f32(x[i].dmin) * y[i].d;
        const __m128i sc = _mm_loadu_si128((const __m128i *)x[i].scales);
        const __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc, 4), m4));
        acc_m = _mm256_fmadd_ps(_mm256_set1_ps(dmin),
                                _mm256_cvtepi32_ps(_mm256_madd_epi16(mins, _mm256_loadu_si256((const __m256i *)y[i].bsums))), acc_m);
        const __m512i sc16 = _mm512_zextsi256_si512(_mm256_cvtepu8_epi16(_mm_and_si128(sc, m4)));
        __m512i isum = _mm512_setzero_si512();
        UNROLL for (int h = 0; h < 2; h++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * h));
            UNROLL for (int m = 0; m < 2; m++) {
                /* codes 0..3: a maddubs pair is at most 2*3*128 */
                __m512i p = _mm512_maddubs_epi16(two_bit_pairs(q, 2 * m), _mm512_loadu_si512((const void *)(y[i].qs + 128 * h + 64 * m)));
                isum = _mm512_dpwssd_epi32(isum, p, _mm512_permutexvar_epi16(idx[2 * h + m], sc16));
            }
        }
        acc = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(isum), acc);
    }
    *s = hsum512_ps(acc) - hsum256_ps(acc_m);
}

/* As Q2_K with codes lo - sub (lo 0..3; sub 4 where the high bit is clear), both maddubs-safe, and signed
 * scales (sc - 32). */
void kiln_vec_dot_q3_K_q8_K_avx512(int64_t n, float *s, const void *vx, const void *vy) {
    const block_q3_K *x = vx;
    const block_q8_K *y = vy;
    __m512i idx[4];
    UNROLL for (int j = 0; j < 4; j++) idx[j] = load_idx(scale_idx_quarters[j]);
    const __m256i one = _mm256_set1_epi8(1);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        int8_t scb[16];
        for (int sb = 0; sb < 16; sb++) {
            const int lo = sb < 8 ? x[i].scales[sb] & 0xF : x[i].scales[sb - 8] >> 4;
            scb[sb] = (int8_t)((lo | ((x[i].scales[8 + sb % 4] >> (2 * (sb / 4))) & 3) << 4) - 32);
        }
        const __m512i sc16 = _mm512_zextsi256_si512(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)scb)));
        const __m256i hm = _mm256_loadu_si256((const __m256i *)x[i].hmask);
        __m512i isum = _mm512_setzero_si512();
        UNROLL for (int h = 0; h < 2; h++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * h));
            UNROLL for (int m = 0; m < 2; m++) {
                const int r = 2 * m; /* bit pairs r, r+1; high bits 4h+r, 4h+r+1 of hmask */
                const __m256i c0 = _mm256_andnot_si256(_mm256_srli_epi16(hm, 4 * h + r), one);
                const __m256i c1 = _mm256_andnot_si256(_mm256_srli_epi16(hm, 4 * h + r + 1), one);
                const __m512i sub = _mm512_slli_epi16(join256(c0, c1), 2);
                const __m512i qy = _mm512_loadu_si512((const void *)(y[i].qs + 128 * h + 64 * m));
                __m512i p = _mm512_sub_epi16(_mm512_maddubs_epi16(two_bit_pairs(q, r), qy), _mm512_maddubs_epi16(sub, qy));
                isum = _mm512_dpwssd_epi32(isum, p, _mm512_permutexvar_epi16(idx[2 * h + m], sc16));
            }
        }
        acc = _mm512_fmadd_ps(_mm512_set1_ps(f16_to_f32(x[i].d) * y[i].d), _mm512_cvtepi32_ps(isum), acc);
    }
    *s = hsum512_ps(acc);
}

#endif /* __x86_64__ */
