/* gemm_repack_avx2.c: AVX2 kernels over the 16-row groups of ops_repack.h, for CPUs without AVX-512 VNNI.
 *
 * The layout is the VNNI kernels' (gemm_repack_avx512.c): in each 64-byte vector lane r holds 4 consecutive
 * quants of row r, so a 256-bit half is 8 rows (bytes 0-31 rows 0-7, bytes 32-63 rows 8-15) and one pass runs
 * the whole row for each half. Without vpdpbusd, vpmaddubsw multiplies the unsigned quants by the activation bytes
 * broadcast to every lane and adds pairs into int16; the int16 sums of several vectors are added before one
 * vpmaddwd against ones widens them to the 8 rows' int32 sums. That is exact where no int16 can overflow: a Q4
 * quant (0..15) times an activation (|x| <= 127, as the Q8_0 and Q8_1 quantizers make them) is at most 1,905, so
 * the 16 products of one lane's four vectors x two nibbles stay under 30,480; a Q5 quant (0..31) allows four
 * vectors (31,496), so Q5 widens twice per block. Types whose stored quants reach 255 (Q8_0, IQ4_NL) would
 * saturate and have no kernel here: they keep the row kernels of quants_avx2.c and gemm_avx2.c.
 *
 * Sixteen ymm registers hold four tokens' accumulators next to a block's eight unpacked vectors, so a call runs
 * its tokens four at a time. Integer sums are the vec_dot's integers; float steps follow the VNNI kernels' order
 * (tests/test_gemm.c compares both against vec_dot and a double reference). A token's result depends neither on
 * the other tokens of its call nor on the thread count. */
#if defined(__x86_64__)

#include "ops_repack.h"

#include <immintrin.h>
#include "cpu/simd_avx2.h"

static inline __m256i bcast4(const char *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}
static inline __m256 bcastf(const char *p) {
    float v;
    memcpy(&v, p, 4);
    return _mm256_set1_ps(v);
}
static inline __m256 f16x8(const char *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
static inline __m256i ld(const char *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* Rows 8h.. of a group: all 8, or the first n (n < 8). */
static inline void store8(float *y, __m256 v, int n) {
    if (n >= 8) {
        _mm256_storeu_ps(y, v);
        return;
    }
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    _mm256_maskstore_ps(y, mask, v);
}

/* ---------------------------------------------------------------- Q4_0, Q4_1, Q5_0, Q5_1
 * As b32_nt of gemm_repack_avx512.c, on half `half` of the group and tokens t0..t0+NT-1. */
enum { B32_Q4_0, B32_Q4_1, B32_Q5_0, B32_Q5_1 };

static inline __attribute__((always_inline)) void b32_half(const kiln_pack_call *c, int half, int t0, const int NT, const int kind) {
    const bool q5 = kind == B32_Q5_0 || kind == B32_Q5_1, has_m = kind == B32_Q4_1 || kind == B32_Q5_1;
    const size_t bq = q5 ? KILN_PACK_Q5_0_QS : KILN_PACK_Q4_0_QS, ba = has_m ? KILN_PACK_Q5_1_AUX : KILN_PACK_Q4_0_AUX;
    const int shift = kind == B32_Q4_0 ? 4 : kind == B32_Q5_0 ? 3 : 0; /* -128 sum(x) >> shift = -bias sum(x) */
    const int64_t nb = c->nb, I = nb * 32;
    const char *wq = c->w + 32 * half, *wa = c->w + nb * bq + 16 * half;
    const char *x0 = c->x + t0 * c->x_row;
    const __m256i m4 = _mm256_set1_epi8(0x0F), b4 = _mm256_set1_epi8(0x10), ones = _mm256_set1_epi16(1);
    __m256 acc[4];
    UNROLL for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const char *q = wq + b * bq, *aux = wa + b * ba;
        __m256i lo[4], hi[4];
        const __m256i h = q5 ? ld(q + 256) : _mm256_setzero_si256();
        UNROLL for (int k = 0; k < 4; k++) {
            const __m256i w = ld(q + 64 * k);
            lo[k] = _mm256_and_si256(w, m4), hi[k] = _mm256_and_si256(_mm256_srli_epi16(w, 4), m4);
            if (q5) {
                lo[k] = _mm256_or_si256(lo[k], _mm256_and_si256(_mm256_slli_epi16(h, 4 - k), b4));
                hi[k] = _mm256_or_si256(hi[k], _mm256_and_si256(_mm256_srli_epi16(h, k), b4));
            }
        }
        const __m256 dw = f16x8(aux);
        UNROLL for (int t = 0; t < NT; t++) {
            const char *xt = x0 + t * c->x_row + 32 * b, *xs = x0 + t * c->x_row + I;
            __m256i s = has_m ? _mm256_setzero_si256() : _mm256_srai_epi32(bcast4(xs + 4 * nb + 4 * b), shift);
            __m256i p0 = _mm256_maddubs_epi16(lo[0], bcast4(xt));
            p0 = _mm256_add_epi16(p0, _mm256_maddubs_epi16(hi[0], bcast4(xt + 16)));
            p0 = _mm256_add_epi16(p0, _mm256_maddubs_epi16(lo[1], bcast4(xt + 4)));
            p0 = _mm256_add_epi16(p0, _mm256_maddubs_epi16(hi[1], bcast4(xt + 20)));
            __m256i p1 = _mm256_maddubs_epi16(lo[2], bcast4(xt + 8));
            p1 = _mm256_add_epi16(p1, _mm256_maddubs_epi16(hi[2], bcast4(xt + 24)));
            p1 = _mm256_add_epi16(p1, _mm256_maddubs_epi16(lo[3], bcast4(xt + 12)));
            p1 = _mm256_add_epi16(p1, _mm256_maddubs_epi16(hi[3], bcast4(xt + 28)));
            if (q5) {
                s = _mm256_add_epi32(s, _mm256_add_epi32(_mm256_madd_epi16(p0, ones), _mm256_madd_epi16(p1, ones)));
            } else {
                s = _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_add_epi16(p0, p1), ones));
            }
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dw, bcastf(xs + 4 * b)), acc[t]);
            if (has_m) acc[t] = _mm256_fmadd_ps(f16x8(aux + 32), bcastf(xs + 4 * nb + 4 * b), acc[t]);
        }
    }
    UNROLL for (int t = 0; t < NT; t++) store8(c->y + (t0 + t) * c->ldy + 8 * half, acc[t], c->nrows - 8 * half);
}

static inline __attribute__((always_inline)) void b32_call(const kiln_pack_call *c, const int kind) {
    for (int half = 0; half < 2 && 8 * half < c->nrows; half++)
        for (int t0 = 0; t0 < c->nt; t0 += 4) {
            switch (c->nt - t0 < 4 ? c->nt - t0 : 4) {
            case 1: b32_half(c, half, t0, 1, kind); break;
            case 2: b32_half(c, half, t0, 2, kind); break;
            case 3: b32_half(c, half, t0, 3, kind); break;
            default: b32_half(c, half, t0, 4, kind); break;
            }
        }
}

void kiln_pack_gemm_q4_0_avx2(const kiln_pack_call *c) { b32_call(c, B32_Q4_0); }
void kiln_pack_gemm_q4_1_avx2(const kiln_pack_call *c) { b32_call(c, B32_Q4_1); }
void kiln_pack_gemm_q5_0_avx2(const kiln_pack_call *c) { b32_call(c, B32_Q5_0); }
void kiln_pack_gemm_q5_1_avx2(const kiln_pack_call *c) { b32_call(c, B32_Q5_1); }

#endif
