/* gemm_repack_avx2.c: AVX2 kernels over the 16-row groups of ops_repack.h, for CPUs without AVX-512 VNNI.
 *
 * The layout is the VNNI kernels' (gemm_repack_avx512.c): in each 64-byte vector lane r holds 4 consecutive
 * quants of row r, so a 256-bit half is 8 rows (bytes 0-31 rows 0-7, bytes 32-63 rows 8-15) and one pass runs
 * the whole row for each half. Without vpdpbusd, vpmaddubsw multiplies the unsigned quants by the activation bytes
 * broadcast to every lane and adds pairs into int16; the int16 sums of several vectors are added before one
 * vpmaddwd against ones widens them to the 8 rows' int32 sums. That is exact where no int16 can overflow: a Q4
 * quant (0..15) times an activation (|x| <= 127, as the Q8_0 and Q8_1 quantizers make them) is at most 1,905, so
 * the 16 products of one lane's four vectors x two nibbles stay under 30,480; a Q5 quant (0..31) allows four
 * vectors (31,496), so Q5 widens twice per block. Q4_K and Q5_K (against Q8_K, also within +-127) run the same
 * way per sub-block of 32. Types whose stored quants reach 255 (Q8_0, IQ4_NL) run signed, with the sign moved onto
 * the activations (s8_half), and so does IQ4_XS. Q6_K sums two vectors in int16 (its quants reach 63).
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

/* A call: each 8-row half of the group (those with rows), its tokens four at a time, through fn(c, half, t0, NT, arg)
 * with a compile-time NT. */
#define HALVES(fn, c, arg)                                                          \
    do {                                                                            \
        for (int half = 0; half < 2 && 8 * half < (c)->nrows; half++)              \
            for (int t0 = 0; t0 < (c)->nt; t0 += 4) {                             \
                switch ((c)->nt - t0 < 4 ? (c)->nt - t0 : 4) {                     \
                case 1: fn(c, half, t0, 1, arg); break;                            \
                case 2: fn(c, half, t0, 2, arg); break;                            \
                case 3: fn(c, half, t0, 3, arg); break;                            \
                default: fn(c, half, t0, 4, arg); break;                           \
                }                                                                   \
            }                                                                       \
    } while (0)

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
        if (half == 0 && t0 == 0) kiln_pack_prefetch(c, b, bq + ba); /* the first of the group's passes */
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

void kiln_pack_gemm_q4_0_avx2(const kiln_pack_call *c) { HALVES(b32_half, c, B32_Q4_0); }
void kiln_pack_gemm_q4_1_avx2(const kiln_pack_call *c) { HALVES(b32_half, c, B32_Q4_1); }
void kiln_pack_gemm_q5_0_avx2(const kiln_pack_call *c) { HALVES(b32_half, c, B32_Q5_0); }
void kiln_pack_gemm_q5_1_avx2(const kiln_pack_call *c) { HALVES(b32_half, c, B32_Q5_1); }

/* ---------------------------------------------------------------- Q8_0 and IQ4_NL
 * Their stored quants reach 255 (Q8_0's q + 128, IQ4_NL's level + 128), which vpmaddubsw's int16 pairs cannot
 * take. So the quants go back to signed (q, or the level) and the sign moves onto the activations, as the row
 * kernels do: |w| * (x with w's sign) is w * x, a pair at most 2 * 128 * 127 = 32,512, widened at once. No
 * -128 sum(x) correction is needed. */
enum { S8_Q8_0, S8_IQ4_NL };

static inline __attribute__((always_inline)) void s8_half(const kiln_pack_call *c, int half, int t0, const int NT, const int kind) {
    const size_t bq = kind == S8_Q8_0 ? KILN_PACK_Q8_0_QS : KILN_PACK_IQ4_NL_QS;
    const size_t ba = kind == S8_Q8_0 ? KILN_PACK_Q8_0_AUX : KILN_PACK_IQ4_NL_AUX;
    const int64_t nb = c->nb, I = nb * 32;
    const char *wq = c->w + 32 * half, *wa = c->w + nb * bq + 16 * half;
    const char *x0 = c->x + t0 * c->x_row;
    const __m256i m4 = _mm256_set1_epi8(0x0F), flip = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)kiln_iq4nl_values));
    __m256 acc[4];
    UNROLL for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        if (half == 0 && t0 == 0) kiln_pack_prefetch(c, b, bq + ba); /* the first of the group's passes */
        const char *q = wq + b * bq, *aux = wa + b * ba;
        /* w[k]: signed quants of elements 4k.. (k = 0..7) */
        __m256i w[8];
        if (kind == S8_Q8_0) {
            UNROLL for (int k = 0; k < 8; k++) w[k] = _mm256_xor_si256(ld(q + 64 * k), flip);
        } else {
            UNROLL for (int k = 0; k < 4; k++) {
                const __m256i v = ld(q + 64 * k);
                w[k] = _mm256_shuffle_epi8(table, _mm256_and_si256(v, m4));
                w[4 + k] = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
            }
        }
        __m256i a[8];
        UNROLL for (int k = 0; k < 8; k++) a[k] = _mm256_sign_epi8(w[k], w[k]);
        const __m256 dw = f16x8(aux);
        UNROLL for (int t = 0; t < NT; t++) {
            const char *xt = x0 + t * c->x_row + 32 * b, *xs = x0 + t * c->x_row + I;
            __m256i s = _mm256_setzero_si256();
            UNROLL for (int k = 0; k < 8; k++) {
                const __m256i p = _mm256_maddubs_epi16(a[k], _mm256_sign_epi8(bcast4(xt + 4 * k), w[k]));
                s = _mm256_add_epi32(s, _mm256_madd_epi16(p, ones));
            }
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dw, bcastf(xs + 4 * b)), acc[t]);
        }
    }
    UNROLL for (int t = 0; t < NT; t++) store8(c->y + (t0 + t) * c->ldy + 8 * half, acc[t], c->nrows - 8 * half);
}

void kiln_pack_gemm_q8_0_avx2(const kiln_pack_call *c) { HALVES(s8_half, c, S8_Q8_0); }
void kiln_pack_gemm_iq4_nl_avx2(const kiln_pack_call *c) { HALVES(s8_half, c, S8_IQ4_NL); }

/* ---------------------------------------------------------------- Q4_K and Q5_K
 * As k4_block of gemm_repack_avx512.c, on half `half` of the group. The high nibbles are shifted down (q * 16
 * would overflow vpmaddubsw's pairs), so no scale is divided by 16. A sub-block's eight vectors sum in int16
 * (Q4: 16 products of at most 1,905) or in two runs of four (Q5: 8 products of at most 3,937 each), then widen. */
#define Q8K_QS 4
#define Q8K_BSUMS (4 + QK_K)

/* The 16 rows' sub-block scales and mins from their 12 planes, as k4_unpack: sc[j & 3] of sc_lo (j < 4) or sc_hi,
 * plane p at bytes 16p.. of each 64-byte array. */
typedef struct {
    uint8_t sc_lo[64], sc_hi[64], m_lo[64], m_hi[64];
} k4_scales;

static inline void k4_unpack(const char *planes, k4_scales *s) {
    const __m256i m6 = _mm256_set1_epi8(63), m30 = _mm256_set1_epi8(0x30), m4 = _mm256_set1_epi8(0x0F);
    for (int i = 0; i < 64; i += 32) {
        const __m256i p0 = ld(planes + i), p1 = ld(planes + 64 + i), p2 = ld(planes + 128 + i);
        _mm256_storeu_si256((__m256i *)(s->sc_lo + i), _mm256_and_si256(p0, m6));
        _mm256_storeu_si256((__m256i *)(s->m_lo + i), _mm256_and_si256(p1, m6));
        _mm256_storeu_si256((__m256i *)(s->sc_hi + i),
                            _mm256_or_si256(_mm256_and_si256(p2, m4), _mm256_and_si256(_mm256_srli_epi16(p0, 2), m30)));
        _mm256_storeu_si256((__m256i *)(s->m_hi + i), _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(p2, 4), m4),
                                                                      _mm256_and_si256(_mm256_srli_epi16(p1, 2), m30)));
    }
}

/* Rows 8h..8h+7 of sub-block j's scale or min. */
static inline __m256i k4_lane(const uint8_t *lo, const uint8_t *hi, int j, int half) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)((j < 4 ? lo : hi) + 16 * (j & 3) + 8 * half)));
}

/* Quant vector k of sub-block j for this half: 4-bit values (Q4_K) or 5-bit values (Q5_K). */
static inline __m256i k_quants(const char *q, bool q5, int j, int k, int half) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), w = ld(q + 512 * (j >> 1) + 64 * k + 32 * half);
    const __m256i v = _mm256_and_si256((j & 1) ? _mm256_srli_epi16(w, 4) : w, m4);
    if (!q5) return v;
    const __m256i h = ld(q + QK_K / 2 * KILN_PACK_ROWS + 64 * k + 32 * half), b4 = _mm256_set1_epi8(0x10);
    const __m256i bit = j < 4 ? _mm256_slli_epi16(h, 4 - j) : j == 4 ? h : _mm256_srli_epi16(h, j - 4);
    return _mm256_or_si256(v, _mm256_and_si256(bit, b4));
}

static inline __attribute__((always_inline)) void k4_half(const kiln_pack_call *c, int half, int t0, const int NT, const bool q5) {
    const int64_t nb = c->nb;
    const size_t qs = q5 ? KILN_PACK_Q5_K_QS : KILN_PACK_Q4_K_QS, ax = q5 ? KILN_PACK_Q5_K_AUX : KILN_PACK_Q4_K_AUX;
    const __m256i ones = _mm256_set1_epi16(1);
    const char *x0 = c->x + t0 * c->x_row;
    __m256 acc[4];
    UNROLL for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        if (half == 0 && t0 == 0) kiln_pack_prefetch(c, b, qs + ax); /* the first of the group's passes */
        const char *q = c->w + b * qs, *aux = c->w + nb * qs + b * ax, *xb = x0 + b * (int64_t)sizeof(block_q8_K);
        const __m256 d = f16x8(aux + 16 * half), dmin = f16x8(aux + 32 + 16 * half);
        k4_scales ks;
        k4_unpack(aux + 64, &ks);
        __m256 F[4];
        __m256i M[4];
        UNROLL for (int t = 0; t < NT; t++) F[t] = _mm256_setzero_ps(), M[t] = _mm256_setzero_si256();
        for (int j = 0; j < 8; j++) {
            const __m256 s = _mm256_mul_ps(d, _mm256_cvtepi32_ps(k4_lane(ks.sc_lo, ks.sc_hi, j, half)));
            __m256i A[4], P[4];
            UNROLL for (int t = 0; t < NT; t++) A[t] = _mm256_setzero_si256(), P[t] = _mm256_setzero_si256();
            UNROLL for (int k = 0; k < 8; k++) {
                const __m256i v = k_quants(q, q5, j, k, half);
                UNROLL for (int t = 0; t < NT; t++)
                    P[t] = _mm256_add_epi16(P[t], _mm256_maddubs_epi16(v, bcast4(xb + t * c->x_row + Q8K_QS + 32 * j + 4 * k)));
                if (q5 && k == 3) {
                    UNROLL for (int t = 0; t < NT; t++)
                        A[t] = _mm256_madd_epi16(P[t], ones), P[t] = _mm256_setzero_si256();
                }
            }
            UNROLL for (int t = 0; t < NT; t++) {
                A[t] = _mm256_add_epi32(A[t], _mm256_madd_epi16(P[t], ones));
                F[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(A[t]), s, F[t]);
            }
            const __m256i m = k4_lane(ks.m_lo, ks.m_hi, j, half), mm = _mm256_or_si256(m, _mm256_slli_epi32(m, 16));
            UNROLL for (int t = 0; t < NT; t++)
                M[t] = _mm256_add_epi32(M[t], _mm256_madd_epi16(mm, bcast4(xb + t * c->x_row + Q8K_BSUMS + 4 * j)));
        }
        UNROLL for (int t = 0; t < NT; t++)
            acc[t] = _mm256_fmadd_ps(_mm256_fnmadd_ps(dmin, _mm256_cvtepi32_ps(M[t]), F[t]), bcastf(xb + t * c->x_row), acc[t]);
    }
    UNROLL for (int t = 0; t < NT; t++) store8(c->y + (t0 + t) * c->ldy + 8 * half, acc[t], c->nrows - 8 * half);
}

void kiln_pack_gemm_q4_K_avx2(const kiln_pack_call *c) { HALVES(k4_half, c, false); }
void kiln_pack_gemm_q5_K_avx2(const kiln_pack_call *c) { HALVES(k4_half, c, true); }

/* ---------------------------------------------------------------- Q2_K and Q3_K
 * As k23_nt of gemm_repack_avx512.c, on half `half` of the group. A sub-block's four vectors sum in int16
 * (codes 0..7 times |x| <= 128: pairs of at most 1,792, four of them 7,168), and vpmaddwd against the pair
 * (scale, scale) widens and scales them at once. */

/* The 16 sub-blocks' scales of 16 rows (sc[sb][r]) and Q2_K's mins, from the planes. */
typedef struct {
    int8_t sc[16][16];
    uint8_t m[16][16];
} k23_scales;

static inline void k23_unpack(const char *planes, bool q3, k23_scales *s) {
    const __m128i m4 = _mm_set1_epi8(0x0F);
    if (!q3) {
        for (int sb = 0; sb < 16; sb++) {
            const __m128i v = _mm_loadu_si128((const __m128i *)(planes + 16 * sb));
            _mm_storeu_si128((__m128i *)s->sc[sb], _mm_and_si128(v, m4));
            _mm_storeu_si128((__m128i *)s->m[sb], _mm_and_si128(_mm_srli_epi16(v, 4), m4));
        }
        return;
    }
    for (int sb = 0; sb < 16; sb++) {
        const __m128i l = _mm_loadu_si128((const __m128i *)(planes + 16 * (sb & 7)));
        const __m128i h = _mm_loadu_si128((const __m128i *)(planes + 16 * (8 + (sb & 3))));
        const __m128i lo = _mm_and_si128(sb < 8 ? l : _mm_srli_epi16(l, 4), m4);
        const __m128i hi = _mm_and_si128(_mm_srli_epi16(h, 2 * (sb >> 2)), _mm_set1_epi8(3));
        _mm_storeu_si128((__m128i *)s->sc[sb], _mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi16(hi, 4)), _mm_set1_epi8(32)));
    }
}

/* Rows 8h..8h+7 of a per-sub-block byte array as int32 lanes (signed or not) holding the int16 pair (s, s). */
static inline __m256i k23_pair_same(const void *bytes, bool is_signed) {
    const __m128i v = _mm_loadl_epi64((const __m128i *)bytes);
    const __m256i w = is_signed ? _mm256_and_si256(_mm256_cvtepi8_epi32(v), _mm256_set1_epi32(0xFFFF)) : _mm256_cvtepu8_epi32(v);
    return _mm256_or_si256(w, _mm256_slli_epi32(w, 16));
}

/* Rows 8h..8h+7 of sub-blocks 2p and 2p+1 as int32 lanes holding the int16 pair (s_2p, s_2p+1). */
static inline __m256i k23_pair_two(const void *a, const void *b, bool is_signed) {
    const __m128i ab = _mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i *)a), _mm_loadl_epi64((const __m128i *)b));
    return is_signed ? _mm256_cvtepi8_epi16(ab) : _mm256_cvtepu8_epi16(ab);
}

static inline __m256i k23_quants(const char *q, bool q3, int n, int p, int k, int half) {
    const __m256i w = ld(q + 512 * n + 64 * k + 32 * half);
    const __m256i lo = _mm256_and_si256(p ? _mm256_srli_epi16(w, 2 * p) : w, _mm256_set1_epi8(3));
    if (!q3) return lo;
    const __m256i h = ld(q + 1024 + 64 * k + 32 * half);
    const int s = 4 * n + p - 2; /* hbit to bit 2 */
    const __m256i hb = s < 0 ? _mm256_slli_epi16(h, -s) : s ? _mm256_srli_epi16(h, s) : h;
    return _mm256_or_si256(lo, _mm256_and_si256(hb, _mm256_set1_epi8(4)));
}

static inline __attribute__((always_inline)) void k23_half(const kiln_pack_call *c, int half, int t0, const int NT, const bool q3) {
    const int64_t nb = c->nb;
    const size_t bq = q3 ? KILN_PACK_Q3_K_QS : KILN_PACK_Q2_K_QS, ba = q3 ? KILN_PACK_Q3_K_AUX : KILN_PACK_Q2_K_AUX;
    const char *x0 = c->x + t0 * c->x_row;
    __m256 acc[4];
    UNROLL for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        if (half == 0 && t0 == 0) kiln_pack_prefetch(c, b, bq + ba); /* the first of the group's passes */
        const char *q = c->w + b * bq, *aux = c->w + nb * bq + b * ba, *xb = x0 + b * (int64_t)sizeof(block_q8_K);
        k23_scales ks;
        k23_unpack(aux + (q3 ? 32 : 64), q3, &ks);
        __m256i S[4], C[4];
        UNROLL for (int t = 0; t < NT; t++) S[t] = _mm256_setzero_si256(), C[t] = _mm256_setzero_si256();
        for (int n = 0; n < 2; n++)
            for (int p = 0; p < 4; p++)
                UNROLL for (int hk = 0; hk < 2; hk++) {
                    const int sb = 8 * n + 2 * p + hk;
                    __m256i P[4];
                    UNROLL for (int t = 0; t < NT; t++) P[t] = _mm256_setzero_si256();
                    UNROLL for (int k = 4 * hk; k < 4 * hk + 4; k++) {
                        const __m256i v = k23_quants(q, q3, n, p, k, half);
                        UNROLL for (int t = 0; t < NT; t++)
                            P[t] = _mm256_add_epi16(P[t], _mm256_maddubs_epi16(v, bcast4(xb + t * c->x_row + Q8K_QS + 128 * n + 32 * p + 4 * k)));
                    }
                    const __m256i s = k23_pair_same(ks.sc[sb] + 8 * half, q3);
                    UNROLL for (int t = 0; t < NT; t++) S[t] = _mm256_add_epi32(S[t], _mm256_madd_epi16(P[t], s));
                }
        for (int p = 0; p < 8; p++) {
            const __m256i pair = q3 ? k23_pair_two(ks.sc[2 * p] + 8 * half, ks.sc[2 * p + 1] + 8 * half, true)
                                    : k23_pair_two(ks.m[2 * p] + 8 * half, ks.m[2 * p + 1] + 8 * half, false);
            UNROLL for (int t = 0; t < NT; t++)
                C[t] = _mm256_add_epi32(C[t], _mm256_madd_epi16(pair, bcast4(xb + t * c->x_row + Q8K_BSUMS + 4 * p)));
        }
        const __m256 d = f16x8(aux + 16 * half);
        if (q3) {
            UNROLL for (int t = 0; t < NT; t++) {
                const __m256i isum = _mm256_sub_epi32(S[t], _mm256_slli_epi32(C[t], 2));
                acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_cvtepi32_ps(isum)), bcastf(xb + t * c->x_row), acc[t]);
            }
        } else {
            const __m256 dmin = f16x8(aux + 32 + 16 * half);
            UNROLL for (int t = 0; t < NT; t++) {
                const __m256 f = _mm256_fnmadd_ps(dmin, _mm256_cvtepi32_ps(C[t]), _mm256_mul_ps(d, _mm256_cvtepi32_ps(S[t])));
                acc[t] = _mm256_fmadd_ps(f, bcastf(xb + t * c->x_row), acc[t]);
            }
        }
    }
    UNROLL for (int t = 0; t < NT; t++) store8(c->y + (t0 + t) * c->ldy + 8 * half, acc[t], c->nrows - 8 * half);
}

void kiln_pack_gemm_q2_K_avx2(const kiln_pack_call *c) { HALVES(k23_half, c, false); }
void kiln_pack_gemm_q3_K_avx2(const kiln_pack_call *c) { HALVES(k23_half, c, true); }

/* ---------------------------------------------------------------- Q6_K
 * As q6_K_nt of gemm_repack_avx512.c, on half `half` of the group. A quant (0..63) times |x| <= 127 makes pairs of at
 * most 16,002, so two vectors sum in int16 before vpmaddwd widens them; a group of 16 is then scaled in float. */
static inline __m256i q6_quarter(const char *q, int e, int k, int half) {
    const __m256i l = ld(q + 192 * k + 64 * (e & 1) + 32 * half), h = ld(q + 192 * k + 128 + 32 * half);
    const __m256i lo = e < 2 ? l : _mm256_srli_epi16(l, 4);
    __m256i hb;
    switch (e) {
    case 0: hb = _mm256_slli_epi16(h, 4); break;
    case 1: hb = _mm256_slli_epi16(h, 2); break;
    case 2: hb = h; break;
    default: hb = _mm256_srli_epi16(h, 2); break;
    }
    return _mm256_or_si256(_mm256_and_si256(lo, _mm256_set1_epi8(0x0F)), _mm256_and_si256(hb, _mm256_set1_epi8(0x30)));
}

static inline __attribute__((always_inline)) void q6_half(const kiln_pack_call *c, int half, int t0, const int NT, int unused) {
    (void)unused;
    const int64_t nb = c->nb;
    const __m256i ones = _mm256_set1_epi16(1);
    const char *x0 = c->x + t0 * c->x_row;
    __m256 acc[4];
    UNROLL for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        if (half == 0 && t0 == 0) kiln_pack_prefetch(c, b, KILN_PACK_Q6_K_QS + KILN_PACK_Q6_K_AUX); /* the first pass */
        const char *q = c->w + b * KILN_PACK_Q6_K_QS, *aux = c->w + nb * KILN_PACK_Q6_K_QS + b * KILN_PACK_Q6_K_AUX;
        const char *xb = x0 + b * (int64_t)sizeof(block_q8_K), *planes = aux + 32;
        const __m256 d = f16x8(aux + 16 * half);
        __m256 F[4];
        __m256i C[4];
        UNROLL for (int t = 0; t < NT; t++) F[t] = _mm256_setzero_ps(), C[t] = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++)
            for (int e = 0; e < 4; e++)
                UNROLL for (int hk = 0; hk < 2; hk++) {
                    const int g = 8 * h + 2 * e + hk;
                    const __m128i sc = _mm_loadl_epi64((const __m128i *)(planes + 16 * g + 8 * half));
                    const __m256 s = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc)));
                    __m256i v[4];
                    UNROLL for (int i = 0; i < 4; i++) v[i] = q6_quarter(q + 1536 * h, e, 4 * hk + i, half);
                    UNROLL for (int t = 0; t < NT; t++) {
                        const char *xk = xb + t * c->x_row + Q8K_QS + 128 * h + 32 * e + 16 * hk;
                        const __m256i p0 = _mm256_add_epi16(_mm256_maddubs_epi16(v[0], bcast4(xk)), _mm256_maddubs_epi16(v[1], bcast4(xk + 4)));
                        const __m256i p1 = _mm256_add_epi16(_mm256_maddubs_epi16(v[2], bcast4(xk + 8)), _mm256_maddubs_epi16(v[3], bcast4(xk + 12)));
                        const __m256i a = _mm256_add_epi32(_mm256_madd_epi16(p0, ones), _mm256_madd_epi16(p1, ones));
                        F[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a), s, F[t]);
                    }
                }
        for (int p = 0; p < 8; p++) { /* the -32: 32 sum_g sc_g bsums[g], by pairs of groups */
            const __m256i pair = k23_pair_two(planes + 32 * p + 8 * half, planes + 32 * p + 16 + 8 * half, true);
            UNROLL for (int t = 0; t < NT; t++)
                C[t] = _mm256_add_epi32(C[t], _mm256_madd_epi16(pair, bcast4(xb + t * c->x_row + Q8K_BSUMS + 4 * p)));
        }
        const __m256 d32 = _mm256_mul_ps(d, _mm256_set1_ps(32.0f));
        UNROLL for (int t = 0; t < NT; t++)
            acc[t] = _mm256_fmadd_ps(_mm256_fnmadd_ps(d32, _mm256_cvtepi32_ps(C[t]), F[t]), bcastf(xb + t * c->x_row), acc[t]);
    }
    UNROLL for (int t = 0; t < NT; t++) store8(c->y + (t0 + t) * c->ldy + 8 * half, acc[t], c->nrows - 8 * half);
}

void kiln_pack_gemm_q6_K_avx2(const kiln_pack_call *c) { HALVES(q6_half, c, 0); }

/* ---------------------------------------------------------------- IQ4_XS
 * As iq4_xs_nt of gemm_repack_avx512.c, on half `half` of the group, with the levels signed and their sign moved
 * onto the activations as s8_half does for IQ4_NL; each sub-block of 32 is scaled in float. */
static inline __attribute__((always_inline)) void iq4_xs_half(const kiln_pack_call *c, int half, int t0, const int NT, int unused) {
    (void)unused;
    const int64_t nb = c->nb;
    const __m256i m4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)kiln_iq4nl_values));
    const char *x0 = c->x + t0 * c->x_row;
    __m256 acc[4];
    UNROLL for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        if (half == 0 && t0 == 0) kiln_pack_prefetch(c, b, KILN_PACK_IQ4_XS_QS + KILN_PACK_IQ4_XS_AUX); /* the first pass */
        const char *q = c->w + b * KILN_PACK_IQ4_XS_QS, *aux = c->w + nb * KILN_PACK_IQ4_XS_QS + b * KILN_PACK_IQ4_XS_AUX;
        const char *xb = x0 + b * (int64_t)sizeof(block_q8_K);
        const __m256 d = f16x8(aux + 16 * half);
        const __m128i sh_lo = _mm_loadl_epi64((const __m128i *)(aux + 32 + 8 * half));
        const __m128i sh_hi = _mm_loadl_epi64((const __m128i *)(aux + 48 + 8 * half));
        __m256 F[4];
        UNROLL for (int t = 0; t < NT; t++) F[t] = _mm256_setzero_ps();
        for (int j = 0; j < 8; j++) {
            const __m128i l = _mm_loadl_epi64((const __m128i *)(aux + 64 + 16 * (j >> 1) + 8 * half));
            const __m128i lo4 = _mm_and_si128(j & 1 ? _mm_srli_epi16(l, 4) : l, _mm_set1_epi8(0x0F));
            const __m128i hi2 = _mm_and_si128(_mm_srli_epi16(j < 4 ? sh_lo : sh_hi, 2 * (j & 3)), _mm_set1_epi8(3));
            const __m128i ls = _mm_or_si128(lo4, _mm_slli_epi16(hi2, 4));
            const __m256 s = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_cvtepu8_epi32(ls), _mm256_set1_epi32(32))));
            /* w[k]: the signed levels of elements 4k.. of the sub-block (k < 4: low nibbles, else 16 + 4(k - 4)..) */
            __m256i w[8], a[8];
            UNROLL for (int k = 0; k < 4; k++) {
                const __m256i v = ld(q + 256 * j + 64 * k + 32 * half);
                w[k] = _mm256_shuffle_epi8(table, _mm256_and_si256(v, m4));
                w[4 + k] = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
            }
            UNROLL for (int k = 0; k < 8; k++) a[k] = _mm256_sign_epi8(w[k], w[k]);
            UNROLL for (int t = 0; t < NT; t++) {
                const char *xt = xb + t * c->x_row + Q8K_QS + 32 * j;
                __m256i sum = _mm256_setzero_si256();
                UNROLL for (int k = 0; k < 8; k++) {
                    const __m256i p = _mm256_maddubs_epi16(a[k], _mm256_sign_epi8(bcast4(xt + (k < 4 ? 4 * k : 16 + 4 * (k - 4))), w[k]));
                    sum = _mm256_add_epi32(sum, _mm256_madd_epi16(p, ones));
                }
                F[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), s, F[t]);
            }
        }
        UNROLL for (int t = 0; t < NT; t++) acc[t] = _mm256_fmadd_ps(F[t], bcastf(xb + t * c->x_row), acc[t]);
    }
    UNROLL for (int t = 0; t < NT; t++) store8(c->y + (t0 + t) * c->ldy + 8 * half, acc[t], c->nrows - 8 * half);
}

void kiln_pack_gemm_iq4_xs_avx2(const kiln_pack_call *c) { HALVES(iq4_xs_half, c, 0); }

#endif
