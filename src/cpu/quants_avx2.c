/* quants_avx2.c: AVX2 + FMA + F16C versions of the block-format kernels whose scalar oracle is quants_ref.c.
 *
 * to_float and the from_float quantizers are bit-exact with the oracle: they do the same float operations in
 * the same order, and nothing is fused (the Makefile's -std=c11 implies -ffp-contract=off, so a mul followed
 * by an add stays two roundings). vec_dot keeps every integer sum exact and differs from the oracle only in
 * the order floats are accumulated. tests/test_simd.c checks all three on random blocks. */
#if defined(__x86_64__)

#include "cpu/simd.h"

#include <immintrin.h>
#include "cpu/simd_avx2.h"
#include "cpu/ops_repack.h"
#include <math.h>
#include <string.h>

static inline float hmax_ps(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline int hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
    return _mm_cvtsi128_si32(s);
}

static inline __m256 abs_ps(__m256 v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v); }

/* 8 bytes at p, sign- or zero-extended, as floats. */
static inline __m256 i8x8_ps(const void *p) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p))); }

/* The 32 bytes of q as four vectors of 8 floats, treating the bytes as signed or unsigned. */
static inline void bytes_ps(__m256i q, int is_signed, __m256 out[4]) {
    __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    __m128i part[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    UNROLL for (int m = 0; m < 4; m++)
        out[m] = _mm256_cvtepi32_ps(is_signed ? _mm256_cvtepi8_epi32(part[m]) : _mm256_cvtepu8_epi32(part[m]));
}

/* Four vectors of 8 int32 (each in int8 range) -> 32 int8 in order. */
static inline __m256i pack_i32_i8(__m256i a, __m256i b, __m256i c, __m256i d) {
    __m256i ab = _mm256_packs_epi32(a, b);                 /* a0-3 b0-3 | a4-7 b4-7 */
    __m256i cd = _mm256_packs_epi32(c, d);
    __m256i abcd = _mm256_packs_epi16(ab, cd);             /* a0-3 b0-3 c0-3 d0-3 | a4-7 b4-7 c4-7 d4-7 */
    return _mm256_permutevar8x32_epi32(abcd, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* roundf() on 8 lanes: round half away from zero. _mm256_round_ps has no such mode and adding 0.5 before
 * truncating is wrong for 0.49999997f (the sum rounds up to 1), so truncate and fix up from the exact
 * remainder v - trunc(v). */
static inline __m256 round_half_away(__m256 v) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __m256 up = _mm256_cmp_ps(abs_ps(_mm256_sub_ps(v, t)), _mm256_set1_ps(0.5f), _CMP_GE_OQ);
    __m256 one = _mm256_or_ps(_mm256_and_ps(v, sign), _mm256_set1_ps(1.0f)); /* copysign(1, v) */
    return _mm256_add_ps(t, _mm256_and_ps(up, one));
}

/* [sum(a[0]), ..., sum(a[7])] of eight vectors of 8 int32. */
static inline __m256i hsum8x8_epi32(const __m256i a[8]) {
    __m256i h01 = _mm256_hadd_epi32(a[0], a[1]), h23 = _mm256_hadd_epi32(a[2], a[3]);
    __m256i h45 = _mm256_hadd_epi32(a[4], a[5]), h67 = _mm256_hadd_epi32(a[6], a[7]);
    __m256i g0 = _mm256_hadd_epi32(h01, h23); /* lane 0: low-half sums of a0..a3; lane 1: high-half sums */
    __m256i g1 = _mm256_hadd_epi32(h45, h67);
    return _mm256_add_epi32(_mm256_permute2x128_si256(g0, g1, 0x20), _mm256_permute2x128_si256(g0, g1, 0x31));
}

/* Bit i of the little-endian uint32 at qh, as 0x10 in byte i of 32 (GGML's bytes_from_bits_32, then masked):
 * byte i of the broadcast word is picked into byte lanes 8i..8i+7, each lane ORs in all bits but its own,
 * and only lanes whose own bit was set compare equal to all ones. */
static inline __m256i q5_high_bits(const uint8_t *qh) {
    uint32_t w;
    memcpy(&w, qh, 4);
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    __m256i b = _mm256_or_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)w), shuf), _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    return _mm256_and_si256(_mm256_cmpeq_epi8(b, _mm256_set1_epi64x(-1)), _mm256_set1_epi8(0x10));
}

/* The 32 5-bit codes of a Q5_0 block, 0..31, in element order. */
static inline __m256i q5_0_codes(const block_q5_0 *b) { return _mm256_or_si256(unpack_nibbles16(b->qs), q5_high_bits(b->qh)); }

/* ---------------------------------------------------------------- to_float */

void kiln_to_float_f32_avx2(const void *x, float *y, int64_t k) { memcpy(y, x, (size_t)k * sizeof(float)); }

void kiln_to_float_f16_avx2(const void *vx, float *y, int64_t k) {
    const kiln_fp16 *x = vx;
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))));
    for (; i < k; i++) y[i] = f16_to_f32(x[i]);
}

void kiln_to_float_bf16_avx2(const void *vx, float *y, int64_t k) {
    const kiln_bf16 *x = vx;
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) {
        __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(x + i)));
        _mm256_storeu_ps(y + i, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
    }
    for (; i < k; i++) y[i] = kiln_bf16_to_f32(x[i]);
}

void kiln_to_float_q4_0_avx2(const void *vx, float *y, int64_t k) {
    const block_q4_0 *x = vx;
    for (int64_t i = 0; i < k / QK4_0; i++, y += QK4_0) {
        const __m256 d = _mm256_set1_ps(f16_to_f32(x[i].d));
        __m256 f[4];
        bytes_ps(_mm256_sub_epi8(unpack_nibbles16(x[i].qs), _mm256_set1_epi8(8)), 1, f);
        UNROLL for (int m = 0; m < 4; m++) _mm256_storeu_ps(y + 8 * m, _mm256_mul_ps(f[m], d));
    }
}

void kiln_to_float_q4_1_avx2(const void *vx, float *y, int64_t k) {
    const block_q4_1 *x = vx;
    for (int64_t i = 0; i < k / QK4_1; i++, y += QK4_1) {
        const __m256 d = _mm256_set1_ps(f16_to_f32(x[i].d)), mn = _mm256_set1_ps(f16_to_f32(x[i].m));
        __m256 f[4];
        bytes_ps(unpack_nibbles16(x[i].qs), 0, f);
        UNROLL for (int m = 0; m < 4; m++) _mm256_storeu_ps(y + 8 * m, _mm256_add_ps(_mm256_mul_ps(f[m], d), mn));
    }
}

void kiln_to_float_q5_0_avx2(const void *vx, float *y, int64_t k) {
    const block_q5_0 *x = vx;
    for (int64_t i = 0; i < k / QK5_0; i++, y += QK5_0) {
        const __m256 d = _mm256_set1_ps(f16_to_f32(x[i].d));
        __m256 f[4];
        bytes_ps(_mm256_sub_epi8(q5_0_codes(&x[i]), _mm256_set1_epi8(16)), 1, f);
        UNROLL for (int m = 0; m < 4; m++) _mm256_storeu_ps(y + 8 * m, _mm256_mul_ps(f[m], d));
    }
}

void kiln_to_float_q8_0_avx2(const void *vx, float *y, int64_t k) {
    const block_q8_0 *x = vx;
    for (int64_t i = 0; i < k / QK8_0; i++, y += QK8_0) {
        const __m256 d = _mm256_set1_ps(f16_to_f32(x[i].d));
        UNROLL for (int m = 0; m < 4; m++) _mm256_storeu_ps(y + 8 * m, _mm256_mul_ps(i8x8_ps(x[i].qs + 8 * m), d));
    }
}

void kiln_to_float_q8_1_avx2(const void *vx, float *y, int64_t k) {
    const block_q8_1 *x = vx;
    for (int64_t i = 0; i < k / QK8_1; i++, y += QK8_1) {
        const __m256 d = _mm256_set1_ps(f16_to_f32(x[i].d));
        UNROLL for (int m = 0; m < 4; m++) _mm256_storeu_ps(y + 8 * m, _mm256_mul_ps(i8x8_ps(x[i].qs + 8 * m), d));
    }
}

/* y = (d*sc)*q - (dmin*m) per 32-element sub-block, as GGML's dequantize_row_q4_K. */
void kiln_to_float_q4_K_avx2(const void *vx, float *y, int64_t k) {
    const block_q4_K *x = vx;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int64_t i = 0; i < k / QK_K; i++) {
        const float d = f16_to_f32(x[i].d), dmin = f16_to_f32(x[i].dmin);
        uint32_t sm[4];
        kiln_unpack_scales_k4(x[i].scales, sm);
        const uint8_t *sc = (const uint8_t *)sm, *mn = sc + 8;
        UNROLL for (int j = 0; j < 4; j++, y += 64) {
            __m256i q = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * j));
            __m256i half[2] = {_mm256_and_si256(q, m4), _mm256_and_si256(_mm256_srli_epi16(q, 4), m4)};
            UNROLL for (int h = 0; h < 2; h++) {
                const __m256 ds = _mm256_set1_ps(d * sc[2 * j + h]), dm = _mm256_set1_ps(dmin * mn[2 * j + h]);
                __m256 f[4];
                bytes_ps(half[h], 0, f);
                UNROLL for (int m = 0; m < 4; m++) _mm256_storeu_ps(y + 32 * h + 8 * m, _mm256_sub_ps(_mm256_mul_ps(ds, f[m]), dm));
            }
        }
    }
}

/* As Q4_K with a fifth bit: bit 2j of qh[l] tops element l of sub-block 2j, bit 2j+1 that of sub-block 2j+1. */
void kiln_to_float_q5_K_avx2(const void *vx, float *y, int64_t k) {
    const block_q5_K *x = vx;
    const __m256i m4 = _mm256_set1_epi8(0x0F), b0 = _mm256_set1_epi8(1), b1 = _mm256_set1_epi8(2);
    for (int64_t i = 0; i < k / QK_K; i++) {
        const float d = f16_to_f32(x[i].d), dmin = f16_to_f32(x[i].dmin);
        uint32_t sm[4];
        kiln_unpack_scales_k4(x[i].scales, sm);
        const uint8_t *sc = (const uint8_t *)sm, *mn = sc + 8;
        __m256i qh = _mm256_loadu_si256((const __m256i *)x[i].qh);
        UNROLL for (int j = 0; j < 4; j++, y += 64) {
            __m256i q = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * j));
            __m256i half[2] = {
                _mm256_or_si256(_mm256_and_si256(q, m4), _mm256_slli_epi16(_mm256_and_si256(qh, b0), 4)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), _mm256_slli_epi16(_mm256_and_si256(qh, b1), 3)),
            };
            qh = _mm256_srli_epi16(qh, 2); /* bits 0,1 of each byte now come from its own bits 2,3 */
            UNROLL for (int h = 0; h < 2; h++) {
                const __m256 ds = _mm256_set1_ps(d * sc[2 * j + h]), dm = _mm256_set1_ps(dmin * mn[2 * j + h]);
                __m256 f[4];
                bytes_ps(half[h], 0, f);
                UNROLL for (int m = 0; m < 4; m++) _mm256_storeu_ps(y + 32 * h + 8 * m, _mm256_sub_ps(_mm256_mul_ps(ds, f[m]), dm));
            }
        }
    }
}

/* The four 32-element quarters of a 128-element Q6_K chunk as unsigned 6-bit values (0..63). ql points at the
 * chunk's 64 ql bytes, qh at its 32 qh bytes. All shifts are 16-bit; the masks keep only bits that came from
 * the same byte. */
static inline void q6_quarters(const uint8_t *ql, const uint8_t *qh, __m256i q[4]) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(0x30);
    __m256i l0 = _mm256_loadu_si256((const __m256i *)ql), l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
    __m256i h = _mm256_loadu_si256((const __m256i *)qh);
    q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(h, 4), m2));
    q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(h, 2), m2));
    q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(h, m2));
    q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4), _mm256_and_si256(_mm256_srli_epi16(h, 2), m2));
}

/* y = (d*sc)*(q-32) per 16-element group, as GGML's dequantize_row_q6_K. */
void kiln_to_float_q6_K_avx2(const void *vx, float *y, int64_t k) {
    const block_q6_K *x = vx;
    for (int64_t i = 0; i < k / QK_K; i++) {
        const float d = f16_to_f32(x[i].d);
        UNROLL for (int c = 0; c < 2; c++, y += 128) {
            __m256i q[4];
            q6_quarters(x[i].ql + 64 * c, x[i].qh + 32 * c, q);
            UNROLL for (int m = 0; m < 4; m++) {
                const int g = 8 * c + 2 * m; /* groups g and g+1 */
                const __m256 s0 = _mm256_set1_ps(d * x[i].scales[g]), s1 = _mm256_set1_ps(d * x[i].scales[g + 1]);
                __m256 f[4];
                bytes_ps(_mm256_sub_epi8(q[m], _mm256_set1_epi8(32)), 1, f);
                _mm256_storeu_ps(y + 32 * m + 0, _mm256_mul_ps(s0, f[0]));
                _mm256_storeu_ps(y + 32 * m + 8, _mm256_mul_ps(s0, f[1]));
                _mm256_storeu_ps(y + 32 * m + 16, _mm256_mul_ps(s1, f[2]));
                _mm256_storeu_ps(y + 32 * m + 24, _mm256_mul_ps(s1, f[3]));
            }
        }
    }
}

void kiln_to_float_q8_K_avx2(const void *vx, float *y, int64_t k) {
    const block_q8_K *x = vx;
    for (int64_t i = 0; i < k / QK_K; i++, y += QK_K) {
        const __m256 d = _mm256_set1_ps(x[i].d);
        for (int m = 0; m < QK_K / 8; m++) _mm256_storeu_ps(y + 8 * m, _mm256_mul_ps(d, i8x8_ps(x[i].qs + 8 * m)));
    }
}

/* ---------------------------------------------------------------- from_float */

void kiln_from_float_f32_avx2(const float *x, void *y, int64_t k) { memcpy(y, x, (size_t)k * sizeof(float)); }

/* F16C rounds to nearest even, keeps NaN sign and top payload bits and quiets it, like kiln_f32_to_fp16. */
void kiln_from_float_f16_avx2(const float *x, void *vy, int64_t k) {
    kiln_fp16 *y = vy;
    int64_t i = 0;
    for (; i + 8 <= k; i += 8)
        _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (; i < k; i++) y[i] = kiln_f32_to_fp16(x[i]);
}

/* kiln_f32_to_bf16 in integer lanes: add 0x7fff + lsb and keep the top half; NaN becomes (bits >> 16) | 0x40.
 * (AVX512_BF16's vcvtneps2bf16 flushes subnormals to zero, so it is not used for this.) */
void kiln_from_float_bf16_avx2(const float *x, void *vy, int64_t k) {
    kiln_bf16 *y = vy;
    const __m256i one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff), quiet = _mm256_set1_epi32(0x40);
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) {
        __m256i r[2];
        UNROLL for (int h = 0; h < 2; h++) {
            __m256 v = _mm256_loadu_ps(x + i + 8 * h);
            __m256i b = _mm256_castps_si256(v);
            __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), one);
            __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(b, _mm256_add_epi32(bias, lsb)), 16);
            __m256i nan = _mm256_or_si256(_mm256_srli_epi32(b, 16), quiet);
            r[h] = _mm256_blendv_epi8(rounded, nan, _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
        }
        /* values are 0..0xffff, so the unsigned-saturating pack is exact; it works per 128-bit lane */
        __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(r[0], r[1]), 0xD8);
        _mm256_storeu_si256((__m256i *)(y + i), p);
    }
    for (; i < k; i++) y[i] = kiln_f32_to_bf16(x[i]);
}

/* One Q8_0/Q8_1 block: d = amax/127, q = roundf(x * (1/d)). Returns the q as int32 in q[4]; *d_out = d.
 * As the oracle: amax skips NaN (fmaxf; maxps returns its second operand on NaN), and 1/d is 0 where d is 0
 * or so small that 1/d overflows (that block's f16 d is 0 anyway). */
static inline void quantize_block_q8(const float *x, __m256i q[4], float *d_out) {
    __m256 v[4], amax = _mm256_setzero_ps();
    UNROLL for (int m = 0; m < 4; m++) {
        v[m] = _mm256_loadu_ps(x + 8 * m);
        amax = _mm256_max_ps(abs_ps(v[m]), amax);
    }
    const float d = hmax_ps(amax) / 127.0f;
    float inv = d != 0.0f ? 1.0f / d : 0.0f;
    if (!isfinite(inv)) inv = 0.0f;
    const __m256 id = _mm256_set1_ps(inv);
    UNROLL for (int m = 0; m < 4; m++) q[m] = _mm256_cvttps_epi32(round_half_away(_mm256_mul_ps(v[m], id)));
    *d_out = d;
}

void kiln_from_float_q8_0_avx2(const float *x, void *vy, int64_t k) {
    block_q8_0 *y = vy;
    for (int64_t i = 0; i < k / QK8_0; i++, x += QK8_0) {
        __m256i q[4];
        float d;
        quantize_block_q8(x, q, &d);
        y[i].d = kiln_f32_to_fp16(d);
        _mm256_storeu_si256((__m256i *)y[i].qs, pack_i32_i8(q[0], q[1], q[2], q[3]));
    }
}

void kiln_from_float_q8_1_avx2(const float *x, void *vy, int64_t k) {
    block_q8_1 *y = vy;
    for (int64_t i = 0; i < k / QK8_1; i++, x += QK8_1) {
        __m256i q[4];
        float d;
        quantize_block_q8(x, q, &d);
        const int sum = hsum_epi32(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
        y[i].d = kiln_f32_to_fp16(d);
        y[i].s = kiln_f32_to_fp16((float)sum * d);
        _mm256_storeu_si256((__m256i *)y[i].qs, pack_i32_i8(q[0], q[1], q[2], q[3]));
    }
}

/* Blocks [b0, b1) of a Q8_0 or Q8_1 panel row (ops_repack.h): the blocks of kiln_from_float_q8_0/q8_1_avx2, with
 * their f16 scales widened back to float and the sums the panels keep; F16C's conversions round to nearest even as
 * kiln_f32_to_fp16 does, so the panel holds the same bits as one built block by block through the quantizer. */
void kiln_pack_panel_q8_avx2(bool q8_1, const float *x, char *row, int64_t I, int64_t b0, int64_t b1) {
    const int64_t nb = I / 32;
    float *d = (float *)(row + I), *s = d + nb;
    int32_t *corr = (int32_t *)(d + nb);
    for (int64_t b = b0; b < b1; b++) {
        __m256i q[4];
        float db;
        quantize_block_q8(x + 32 * b, q, &db);
        const int sum = hsum_epi32(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
        _mm256_storeu_si256((__m256i *)(row + 32 * b), pack_i32_i8(q[0], q[1], q[2], q[3]));
        d[b] = _cvtsh_ss(_cvtss_sh(db, _MM_FROUND_TO_NEAREST_INT));
        if (q8_1)
            s[b] = _cvtsh_ss(_cvtss_sh((float)sum * db, _MM_FROUND_TO_NEAREST_INT));
        else
            corr[b] = -128 * sum;
    }
}

/* GGML's quantize_row_q8_K: max is the first element of largest magnitude (its sign matters), iscale =
 * -127/max, q = nearest_int(iscale*x) clamped to [-127, 127], where nearest_int is round-half-even (cvtps
 * under the default MXCSR; a NaN gives INT_MIN, clamped to -127 as the oracle does), d = 1/iscale,
 * bsums[g] = sum of q[16g..16g+15]. A block whose iscale is 0 or not finite (all zero, an infinity, or a
 * max so tiny that -127/max overflows) is all zeros. */
void kiln_from_float_q8_K_avx2(const float *x, void *vy, int64_t k) {
    block_q8_K *y = vy;
    for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
        __m256 amaxv = _mm256_setzero_ps();
        for (int m = 0; m < QK_K / 8; m++) amaxv = _mm256_max_ps(abs_ps(_mm256_loadu_ps(x + 8 * m)), amaxv);
        const float amax = hmax_ps(amaxv);
        float max = 0.0f;
        for (int m = 0; m < QK_K / 8; m++) {
            int hit = _mm256_movemask_ps(_mm256_cmp_ps(abs_ps(_mm256_loadu_ps(x + 8 * m)), _mm256_set1_ps(amax), _CMP_EQ_OQ));
            if (hit) {
                max = x[8 * m + __builtin_ctz((unsigned)hit)];
                break;
            }
        }
        const float iscale = amax != 0.0f ? -127.0f / max : 0.0f;
        if (iscale == 0.0f || !isfinite(iscale)) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        const __m256 vs = _mm256_set1_ps(iscale);
        const __m256i top = _mm256_set1_epi32(127), bottom = _mm256_set1_epi32(-127);
        __m256i pair[QK_K / 16]; /* per 16-element group: the two 8-lane halves added */
        UNROLL for (int g = 0; g < QK_K / 32; g++) {
            __m256i q[4];
            UNROLL for (int m = 0; m < 4; m++)
                q[m] = _mm256_max_epi32(_mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(vs, _mm256_loadu_ps(x + 32 * g + 8 * m))), top), bottom);
            _mm256_storeu_si256((__m256i *)(y[i].qs + 32 * g), pack_i32_i8(q[0], q[1], q[2], q[3]));
            pair[2 * g] = _mm256_add_epi32(q[0], q[1]);
            pair[2 * g + 1] = _mm256_add_epi32(q[2], q[3]);
        }
        __m256i s0 = hsum8x8_epi32(pair), s1 = hsum8x8_epi32(pair + 8);
        _mm256_storeu_si256((__m256i *)y[i].bsums, _mm256_permute4x64_epi64(_mm256_packs_epi32(s0, s1), 0xD8));
        y[i].d = 1 / iscale;
    }
}

/* ---------------------------------------------------------------- vec_dot, float types */

void kiln_vec_dot_f32_avx2(int64_t n, float *s, const void *vx, const void *vy) {
    const float *x = vx, *y = vy;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
        UNROLL for (int m = 0; m < 4; m++)
            acc[m] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8 * m), _mm256_loadu_ps(y + i + 8 * m), acc[m]);
    for (; i + 8 <= n; i += 8) acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), acc[0]);
    float sum = hsum_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
    for (; i < n; i++) sum += x[i] * y[i];
    *s = sum;
}

static inline __m256 load_f16(const kiln_fp16 *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
static inline __m256 load_bf16(const kiln_bf16 *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

void kiln_vec_dot_f16_avx2(int64_t n, float *s, const void *vx, const void *vy) {
    const kiln_fp16 *x = vx, *y = vy;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
        UNROLL for (int m = 0; m < 4; m++) acc[m] = _mm256_fmadd_ps(load_f16(x + i + 8 * m), load_f16(y + i + 8 * m), acc[m]);
    for (; i + 8 <= n; i += 8) acc[0] = _mm256_fmadd_ps(load_f16(x + i), load_f16(y + i), acc[0]);
    float sum = hsum_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
    for (; i < n; i++) sum += f16_to_f32(x[i]) * f16_to_f32(y[i]);
    *s = sum;
}

void kiln_vec_dot_bf16_avx2(int64_t n, float *s, const void *vx, const void *vy) {
    const kiln_bf16 *x = vx, *y = vy;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
        UNROLL for (int m = 0; m < 4; m++) acc[m] = _mm256_fmadd_ps(load_bf16(x + i + 8 * m), load_bf16(y + i + 8 * m), acc[m]);
    for (; i + 8 <= n; i += 8) acc[0] = _mm256_fmadd_ps(load_bf16(x + i), load_bf16(y + i), acc[0]);
    float sum = hsum_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
    for (; i < n; i++) sum += kiln_bf16_to_f32(x[i]) * kiln_bf16_to_f32(y[i]);
    *s = sum;
}

/* ---------------------------------------------------------------- vec_dot, block types
 * Products of unsigned weights and signed activations go through maddubs (u8 x s8 -> pairs summed in int16):
 * with weights <= 63 a pair is at most 2*63*128 = 16128, so the int16 saturation never triggers. */

void kiln_vec_dot_q4_0_q8_0_avx2(int64_t n, float *s, const void *vx, const void *vy) {
    const block_q4_0 *x = vx;
    const block_q8_0 *y = vy;
    const __m256i eight = _mm256_set1_epi8(8), ones = _mm256_set1_epi16(1);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK4_0; i++) {
        __m256i qy = _mm256_loadu_si256((const __m256i *)y[i].qs);
        /* sum (q-8)*y = sum q*y - 8*sum y, each pair in int16 (|.| <= 3840) */
        __m256i p = _mm256_sub_epi16(_mm256_maddubs_epi16(unpack_nibbles16(x[i].qs), qy), _mm256_maddubs_epi16(eight, qy));
        const __m256 d = _mm256_broadcastss_ps(scale_products(x[i].d, y[i].d, 0, 0));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones)), acc);
    }
    *s = hsum_ps(acc);
}

void kiln_vec_dot_q5_0_q8_0_avx2(int64_t n, float *s, const void *vx, const void *vy) {
    const block_q5_0 *x = vx;
    const block_q8_0 *y = vy;
    const __m256i sixteen = _mm256_set1_epi8(16), ones = _mm256_set1_epi16(1);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK5_0; i++) {
        __m256i qy = _mm256_loadu_si256((const __m256i *)y[i].qs);
        /* sum (q-16)*y = sum q*y - 16*sum y; a pair is at most 2*31*128 = 7936 in int16 */
        __m256i p = _mm256_sub_epi16(_mm256_maddubs_epi16(q5_0_codes(&x[i]), qy), _mm256_maddubs_epi16(sixteen, qy));
        const __m256 d = _mm256_broadcastss_ps(scale_products(x[i].d, y[i].d, 0, 0));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones)), acc);
    }
    *s = hsum_ps(acc);
}

void kiln_vec_dot_q4_1_q8_1_avx2(int64_t n, float *s, const void *vx, const void *vy) {
    const block_q4_1 *x = vx;
    const block_q8_1 *y = vy;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc = _mm256_setzero_ps();
    __m128 summs = _mm_setzero_ps(); /* lane 2: sum of m_x * s_y, the min times the activation block's sum */
    for (int64_t i = 0; i < n / QK4_1; i++) {
        __m256i p = _mm256_maddubs_epi16(unpack_nibbles16(x[i].qs), _mm256_loadu_si256((const __m256i *)y[i].qs));
        const __m128 prod = scale_products(x[i].d, y[i].d, x[i].m, y[i].s);
        acc = _mm256_fmadd_ps(_mm256_broadcastss_ps(prod), _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones)), acc);
        summs = _mm_add_ps(summs, prod); /* lane 2 sums m_x * s_y */
    }
    *s = hsum_ps(acc) + _mm_cvtss_f32(_mm_movehl_ps(summs, summs));
}

/* Both sides signed: widen to int16 so every value, -128 included, multiplies exactly. */
void kiln_vec_dot_q8_0_q8_0_avx2(int64_t n, float *s, const void *vx, const void *vy) {
    const block_q8_0 *x = vx;
    const block_q8_0 *y = vy;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK8_0; i++) {
        __m256i p = _mm256_setzero_si256();
        UNROLL for (int h = 0; h < 2; h++) {
            __m256i a = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(x[i].qs + 16 * h)));
            __m256i b = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(y[i].qs + 16 * h)));
            p = _mm256_add_epi32(p, _mm256_madd_epi16(a, b));
        }
        const __m256 d = _mm256_broadcastss_ps(scale_products(x[i].d, y[i].d, 0, 0));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc);
    }
    *s = hsum_ps(acc);
}

/* mins . (bsums[2j] + bsums[2j+1]) as 8 int32 lanes: the Q4_K/Q5_K "- dmin*m" term, from Q8_K's bsums. */
static inline __m256i mins_dot_bsums(const uint32_t sm[4], const int16_t *bsums) {
    __m128i m8 = _mm_loadl_epi64((const __m128i *)(sm + 2));
    __m256i m16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8)); /* m0 m0 m1 m1 ... m7 m7 */
    return _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)bsums), m16);
}

/* Shared by Q4_K and Q5_K: lo/hi are the 32 values of sub-blocks 2j and 2j+1 (0..31), y their activations.
 * Returns sc[2j]*dot(lo) + sc[2j+1]*dot(hi) spread over 8 int32 lanes. */
static inline __m256i kq_chunk(__m256i lo, __m256i hi, const int8_t *yq, __m256i sc16, int j) {
    __m256i p0 = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)yq));
    __m256i p1 = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(yq + 32)));
    p0 = _mm256_madd_epi16(p0, _mm256_shuffle_epi8(sc16, word_bcast_mask(2 * j)));
    p1 = _mm256_madd_epi16(p1, _mm256_shuffle_epi8(sc16, word_bcast_mask(2 * j + 1)));
    return _mm256_add_epi32(p0, p1);
}

void kiln_vec_dot_q4_K_q8_K_avx2(int64_t n, float *s, const void *vx, const void *vy) {
    const block_q4_K *x = vx;
    const block_q8_K *y = vy;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256 acc = _mm256_setzero_ps(), acc_m = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = f16_to_f32(x[i].d) * y[i].d, dmin = f16_to_f32(x[i].dmin) * y[i].d;
        uint32_t sm[4];
        kiln_unpack_scales_k4(x[i].scales, sm);
        acc_m = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(mins_dot_bsums(sm, y[i].bsums)), acc_m);
        const __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)sm)));
        __m256i isum = _mm256_setzero_si256();
        UNROLL for (int j = 0; j < 4; j++) {
            __m256i q = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * j));
            __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            isum = _mm256_add_epi32(isum, kq_chunk(lo, hi, y[i].qs + 64 * j, sc16, j));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(isum), acc);
    }
    *s = hsum_ps(acc) - hsum_ps(acc_m);
}

void kiln_vec_dot_q5_K_q8_K_avx2(int64_t n, float *s, const void *vx, const void *vy) {
    const block_q5_K *x = vx;
    const block_q8_K *y = vy;
    const __m256i m4 = _mm256_set1_epi8(0x0F), b0 = _mm256_set1_epi8(1), b1 = _mm256_set1_epi8(2);
    __m256 acc = _mm256_setzero_ps(), acc_m = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = f16_to_f32(x[i].d) * y[i].d, dmin = f16_to_f32(x[i].dmin) * y[i].d;
        uint32_t sm[4];
        kiln_unpack_scales_k4(x[i].scales, sm);
        acc_m = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(mins_dot_bsums(sm, y[i].bsums)), acc_m);
        const __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)sm)));
        __m256i qh = _mm256_loadu_si256((const __m256i *)x[i].qh);
        __m256i isum = _mm256_setzero_si256();
        UNROLL for (int j = 0; j < 4; j++) {
            __m256i q = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * j));
            __m256i lo = _mm256_or_si256(_mm256_and_si256(q, m4), _mm256_slli_epi16(_mm256_and_si256(qh, b0), 4));
            __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), _mm256_slli_epi16(_mm256_and_si256(qh, b1), 3));
            qh = _mm256_srli_epi16(qh, 2);
            isum = _mm256_add_epi32(isum, kq_chunk(lo, hi, y[i].qs + 64 * j, sc16, j));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(isum), acc);
    }
    *s = hsum_ps(acc) - hsum_ps(acc_m);
}

/* sum_g sc[g] * sum (q-32)*y over the 16 groups of 16 = sum_g sc[g]*dot(q, y) - 32 * sum_g sc[g]*bsums[g].
 * q is 0..63 (maddubs-safe); each 128-bit lane of a quarter is one group, so madd with a per-lane scale. */
void kiln_vec_dot_q6_K_q8_K_avx2(int64_t n, float *s, const void *vx, const void *vy) {
    const block_q6_K *x = vx;
    const block_q8_K *y = vy;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = f16_to_f32(x[i].d) * y[i].d;
        const __m256i sc_all = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x[i].scales)); /* 16 int16 */
        __m256i corr = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y[i].bsums), sc_all);
        __m256i isum = _mm256_setzero_si256();
        UNROLL for (int c = 0; c < 2; c++) {
            /* scales 8c..8c+7 as int16, in both lanes */
            const __m256i sc8 = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)(x[i].scales + 8 * c))));
            __m256i q[4];
            q6_quarters(x[i].ql + 64 * c, x[i].qh + 32 * c, q);
            UNROLL for (int m = 0; m < 4; m++) {
                /* lane 0 gets scale 2m, lane 1 scale 2m+1 */
                const __m256i mask = _mm256_set_m128i(_mm256_castsi256_si128(word_bcast_mask(2 * m + 1)),
                                                      _mm256_castsi256_si128(word_bcast_mask(2 * m)));
                __m256i p = _mm256_maddubs_epi16(q[m], _mm256_loadu_si256((const __m256i *)(y[i].qs + 128 * c + 32 * m)));
                isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, _mm256_shuffle_epi8(sc8, mask)));
            }
        }
        isum = _mm256_sub_epi32(isum, _mm256_slli_epi32(corr, 5));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(isum), acc);
    }
    *s = hsum_ps(acc);
}

/* ---------------------------------------------------------------- the low-bit types (Q5_1, Q2_K, Q3_K, IQ4_NL, IQ4_XS)
 * to_float as the oracle, product for product; vec_dot with exact integer sums. */

/* The 32 5-bit codes of a Q5_1 block, 0..31, in element order (its qh is Q5_0's). */
static inline __m256i q5_1_codes(const block_q5_1 *b) { return _mm256_or_si256(unpack_nibbles16(b->qs), q5_high_bits(b->qh)); }

/* The IQ4 levels of 16 packed bytes (32 indices) in element order, as int8 (-127..113). */
static inline __m256i iq4_levels(const uint8_t *qs) {
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)kiln_iq4nl_values));
    return _mm256_shuffle_epi8(table, unpack_nibbles16(qs));
}

/* Pairwise int16 sums of x*y for signed x and y (|x|, |y| <= 127, so a pair is at most 32258): maddubs needs an
 * unsigned first operand, so |x| times y with x's sign. */
static inline __m256i dot_pairs_i8(__m256i x, __m256i y) {
    return _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
}

/* Per-lane int16 scale for a 32-byte product vector whose 128-bit lanes are sub-blocks k and k+1 of the eight
 * int16 scales in sc8 (broadcast to both lanes). */
static inline __m256i lane_scales(__m256i sc8, int k) {
    const __m256i mask = _mm256_set_m128i(_mm256_castsi256_si128(word_bcast_mask(k + 1)), _mm256_castsi256_si128(word_bcast_mask(k)));
    return _mm256_shuffle_epi8(sc8, mask);
}

void kiln_to_float_q5_1_avx2(const void *vx, float *y, int64_t k) {
    const block_q5_1 *x = vx;
    for (int64_t i = 0; i < k / QK5_1; i++, y += QK5_1) {
        const __m256 d = _mm256_set1_ps(f16_to_f32(x[i].d)), mn = _mm256_set1_ps(f16_to_f32(x[i].m));
        __m256 f[4];
        bytes_ps(q5_1_codes(&x[i]), 0, f);
        UNROLL for (int m = 0; m < 4; m++) _mm256_storeu_ps(y + 8 * m, _mm256_add_ps(_mm256_mul_ps(f[m], d), mn));
    }
}

void kiln_to_float_iq4_nl_avx2(const void *vx, float *y, int64_t k) {
    const block_iq4_nl *x = vx;
    for (int64_t i = 0; i < k / QK4_NL; i++, y += QK4_NL) {
        const __m256 d = _mm256_set1_ps(f16_to_f32(x[i].d));
        __m256 f[4];
        bytes_ps(iq4_levels(x[i].qs), 1, f);
        UNROLL for (int m = 0; m < 4; m++) _mm256_storeu_ps(y + 8 * m, _mm256_mul_ps(d, f[m]));
    }
}

/* y = (d*(ls-32)) * level per 32-element sub-block, as GGML's dequantize_row_iq4_xs. */
void kiln_to_float_iq4_xs_avx2(const void *vx, float *y, int64_t k) {
    const block_iq4_xs *x = vx;
    for (int64_t i = 0; i < k / QK_K; i++) {
        const float d = f16_to_f32(x[i].d);
        for (int s = 0; s < QK_K / 32; s++, y += 32) {
            const int ls = (((x[i].scales_l[s / 2] >> (4 * (s % 2))) & 0xF) | ((x[i].scales_h >> (2 * s)) & 3) << 4) - 32;
            const __m256 dl = _mm256_set1_ps(d * (float)ls);
            __m256 f[4];
            bytes_ps(iq4_levels(x[i].qs + 16 * s), 1, f);
            UNROLL for (int m = 0; m < 4; m++) _mm256_storeu_ps(y + 8 * m, _mm256_mul_ps(dl, f[m]));
        }
    }
}

/* y = (d*sc)*q - (dmin*m) per 16-element sub-block, as GGML's dequantize_row_q2_K. Bit pair r of the 32 bytes
 * of a 128-element half is its elements 32r..32r+31: sub-blocks 2r (first 16 bytes) and 2r+1. */
void kiln_to_float_q2_K_avx2(const void *vx, float *y, int64_t k) {
    const block_q2_K *x = vx;
    const __m256i m2 = _mm256_set1_epi8(3);
    for (int64_t i = 0; i < k / QK_K; i++) {
        const float d = f16_to_f32(x[i].d), dmin = f16_to_f32(x[i].dmin);
        for (int h = 0; h < 2; h++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * h));
            UNROLL for (int r = 0; r < 4; r++, y += 32) {
                __m256 f[4];
                bytes_ps(_mm256_and_si256(_mm256_srli_epi16(q, 2 * r), m2), 0, f);
                UNROLL for (int g = 0; g < 2; g++) {
                    const uint8_t sc = x[i].scales[8 * h + 2 * r + g];
                    const __m256 dl = _mm256_set1_ps(d * (float)(sc & 0xF)), ml = _mm256_set1_ps(dmin * (float)(sc >> 4));
                    _mm256_storeu_ps(y + 16 * g, _mm256_sub_ps(_mm256_mul_ps(dl, f[2 * g]), ml));
                    _mm256_storeu_ps(y + 16 * g + 8, _mm256_sub_ps(_mm256_mul_ps(dl, f[2 * g + 1]), ml));
                }
            }
        }
    }
}

/* The 16 signed 6-bit scales (sc - 32) of a Q3_K block. */
static inline void q3_scales(const uint8_t *scales, int8_t out[16]) {
    for (int s = 0; s < 16; s++) {
        const int lo = s < 8 ? scales[s] & 0xF : scales[s - 8] >> 4;
        out[s] = (int8_t)((lo | ((scales[8 + s % 4] >> (2 * (s / 4))) & 3) << 4) - 32);
    }
}

/* Bit pair r of half h as codes 0..3 (lo), and 4 where element's high bit is clear (sub): code = lo - sub. */
static inline void q3_codes(const block_q3_K *b, __m256i hm, int h, int r, __m256i *lo, __m256i *sub) {
    const __m256i q = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * h));
    *lo = _mm256_and_si256(_mm256_srli_epi16(q, 2 * r), _mm256_set1_epi8(3));
    const __m256i bit = _mm256_and_si256(_mm256_srli_epi16(hm, 4 * h + r), _mm256_set1_epi8(1));
    *sub = _mm256_slli_epi16(_mm256_xor_si256(bit, _mm256_set1_epi8(1)), 2);
}

void kiln_to_float_q3_K_avx2(const void *vx, float *y, int64_t k) {
    const block_q3_K *x = vx;
    for (int64_t i = 0; i < k / QK_K; i++) {
        const float d = f16_to_f32(x[i].d);
        int8_t sc[16];
        q3_scales(x[i].scales, sc);
        const __m256i hm = _mm256_loadu_si256((const __m256i *)x[i].hmask);
        for (int h = 0; h < 2; h++) {
            UNROLL for (int r = 0; r < 4; r++, y += 32) {
                __m256i lo, sub;
                q3_codes(&x[i], hm, h, r, &lo, &sub);
                __m256 f[4];
                bytes_ps(_mm256_sub_epi8(lo, sub), 1, f);
                UNROLL for (int g = 0; g < 2; g++) {
                    const __m256 dl = _mm256_set1_ps(d * (float)sc[8 * h + 2 * r + g]);
                    _mm256_storeu_ps(y + 16 * g, _mm256_mul_ps(dl, f[2 * g]));
                    _mm256_storeu_ps(y + 16 * g + 8, _mm256_mul_ps(dl, f[2 * g + 1]));
                }
            }
        }
    }
}

void kiln_vec_dot_q5_1_q8_1_avx2(int64_t n, float *s, const void *vx, const void *vy) {
    const block_q5_1 *x = vx;
    const block_q8_1 *y = vy;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc = _mm256_setzero_ps();
    __m128 summs = _mm_setzero_ps(); /* lane 2: sum of m_x * s_y */
    for (int64_t i = 0; i < n / QK5_1; i++) {
        /* a pair is at most 2*31*127 = 7874 in int16 */
        __m256i p = _mm256_maddubs_epi16(q5_1_codes(&x[i]), _mm256_loadu_si256((const __m256i *)y[i].qs));
        const __m128 prod = scale_products(x[i].d, y[i].d, x[i].m, y[i].s);
        acc = _mm256_fmadd_ps(_mm256_broadcastss_ps(prod), _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones)), acc);
        summs = _mm_add_ps(summs, prod);
    }
    *s = hsum_ps(acc) + _mm_cvtss_f32(_mm_movehl_ps(summs, summs));
}

void kiln_vec_dot_iq4_nl_q8_0_avx2(int64_t n, float *s, const void *vx, const void *vy) {
    const block_iq4_nl *x = vx;
    const block_q8_0 *y = vy;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK4_NL; i++) {
        __m256i p = dot_pairs_i8(iq4_levels(x[i].qs), _mm256_loadu_si256((const __m256i *)y[i].qs));
        const __m256 d = _mm256_broadcastss_ps(scale_products(x[i].d, y[i].d, 0, 0));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones)), acc);
    }
    *s = hsum_ps(acc);
}

/* Per sub-block of 32: (ls-32) * dot(levels, y), the scale applied by madd to the int16 pair sums. */
void kiln_vec_dot_iq4_xs_q8_K_avx2(int64_t n, float *s, const void *vx, const void *vy) {
    const block_iq4_xs *x = vx;
    const block_q8_K *y = vy;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        __m256i isum = _mm256_setzero_si256();
        UNROLL for (int sb = 0; sb < QK_K / 32; sb++) {
            const int ls = (((x[i].scales_l[sb / 2] >> (4 * (sb % 2))) & 0xF) | ((x[i].scales_h >> (2 * sb)) & 3) << 4) - 32;
            __m256i p = dot_pairs_i8(iq4_levels(x[i].qs + 16 * sb), _mm256_loadu_si256((const __m256i *)(y[i].qs + 32 * sb)));
            isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, _mm256_set1_epi16((short)ls)));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_to_f32(x[i].d) * y[i].d), _mm256_cvtepi32_ps(isum), acc);
    }
    *s = hsum_ps(acc);
}

/* sum_s sc[s]*dot(q, y) - dmin * sum_s m[s]*bsums[s]; codes 0..3 (maddubs-safe), each 128-bit lane of a bit
 * pair's 32 bytes one sub-block, so madd with a per-lane scale. */
void kiln_vec_dot_q2_K_q8_K_avx2(int64_t n, float *s, const void *vx, const void *vy) {
    const block_q2_K *x = vx;
    const block_q8_K *y = vy;
    const __m128i m4 = _mm_set1_epi8(0x0F);
    const __m256i m2 = _mm256_set1_epi8(3);
    __m256 acc = _mm256_setzero_ps(), acc_m = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = f16_to_f32(x[i].d) * y[i].d, dmin = f16_to_f32(x[i].dmin) * y[i].d;
        const __m128i sc = _mm_loadu_si128((const __m128i *)x[i].scales);
        const __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc, 4), m4));
        acc_m = _mm256_fmadd_ps(_mm256_set1_ps(dmin),
                                _mm256_cvtepi32_ps(_mm256_madd_epi16(mins, _mm256_loadu_si256((const __m256i *)y[i].bsums))), acc_m);
        const __m128i sc4 = _mm_and_si128(sc, m4);
        __m256i isum = _mm256_setzero_si256();
        UNROLL for (int h = 0; h < 2; h++) {
            const __m256i sc8 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(h ? _mm_srli_si128(sc4, 8) : sc4));
            const __m256i q = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * h));
            UNROLL for (int r = 0; r < 4; r++) {
                __m256i p = _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(q, 2 * r), m2),
                                                 _mm256_loadu_si256((const __m256i *)(y[i].qs + 128 * h + 32 * r)));
                isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, lane_scales(sc8, 2 * r)));
            }
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(isum), acc);
    }
    *s = hsum_ps(acc) - hsum_ps(acc_m);
}

/* dot((lo - sub), y) = dot(lo, y) - dot(sub, y), both maddubs-safe (0..3 and 0 or 4), times the per-lane signed
 * scale. */
void kiln_vec_dot_q3_K_q8_K_avx2(int64_t n, float *s, const void *vx, const void *vy) {
    const block_q3_K *x = vx;
    const block_q8_K *y = vy;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        int8_t sc[16];
        q3_scales(x[i].scales, sc);
        const __m256i hm = _mm256_loadu_si256((const __m256i *)x[i].hmask);
        __m256i isum = _mm256_setzero_si256();
        UNROLL for (int h = 0; h < 2; h++) {
            const __m256i sc8 = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)(sc + 8 * h))));
            UNROLL for (int r = 0; r < 4; r++) {
                __m256i lo, sub;
                q3_codes(&x[i], hm, h, r, &lo, &sub);
                const __m256i qy = _mm256_loadu_si256((const __m256i *)(y[i].qs + 128 * h + 32 * r));
                __m256i p = _mm256_sub_epi16(_mm256_maddubs_epi16(lo, qy), _mm256_maddubs_epi16(sub, qy));
                isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, lane_scales(sc8, 2 * r)));
            }
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_to_f32(x[i].d) * y[i].d), _mm256_cvtepi32_ps(isum), acc);
    }
    *s = hsum_ps(acc);
}

#endif /* __x86_64__ */
