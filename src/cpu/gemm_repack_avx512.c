/* gemm_repack_avx512.c: AVX-512 VNNI kernels over weights repacked 16 rows at a time (layouts in ops_repack.h).
 *
 * A call computes y[t][r] = dot(row r of a 16-row group, activation row t) for up to KILN_PACK_NT tokens over
 * the whole row. Each 32-bit lane of a weight vector holds 4 consecutive quants of one of the 16 rows, so one
 * vpdpbusd against 4 activation bytes broadcast to every lane advances 16 rows at once: no horizontal sums,
 * and the broadcast folds into the instruction as a memory operand (one uop). Block and sub-block scales are
 * vectors of 16 rows, applied in float once per sub-block per token. Each weight vector is loaded and unpacked
 * once per call and used for every token of the call, so prefill pays its unpacking once per 8 tokens: with the
 * group in L1, 8 tokens run at 150-190 GMAC/s a core (the vpdpbusd peak of this 2-core VM is ~190), 1 token at
 * 50-120 GMAC/s, far above what memory delivers, so decode runs at memory speed.
 *
 * Integer sums are exact (the same integers as the single-row vec_dot); the float steps differ in order from
 * vec_dot, so results agree with it to float rounding (7e-8 of sum |w x| measured) rather than bit for bit. A
 * token's result does not depend on which other tokens share its call, nor on the thread count: every token runs
 * the same instruction sequence on its own accumulators. tests/test_gemm.c checks both, and every type against a
 * double reference. */
#if defined(__x86_64__)

#include "ops_repack.h"

#include <immintrin.h>
#include "cpu/simd_avx512.h"
#include "cpu/gemm_repack_avx512.h"

/* Each kernel is written once for a compile-time token count NT and instantiated for 1..KILN_PACK_NT. */
#define NT_CASES(fn, c)          \
    switch ((c)->nt) {           \
    case 1: fn(c, 1); break;     \
    case 2: fn(c, 2); break;     \
    case 3: fn(c, 3); break;     \
    case 4: fn(c, 4); break;     \
    case 5: fn(c, 5); break;     \
    case 6: fn(c, 6); break;     \
    case 7: fn(c, 7); break;     \
    default: fn(c, 8); break;    \
    }

/* ---------------------------------------------------------------- Q8_0
 * Weights stored as q ^ 0x80 = q + 128 (unsigned, as vpdpbusd wants); the 128 * sum(x) this adds is taken off by
 * starting each block's sum at the panel's -128 * sum(x). Panel row: qs[I], d[nb] float, -128*sum[nb] int32. */
static inline __attribute__((always_inline)) void q8_0_nt(const kiln_pack_call *c, const int NT) {
    const int64_t nb = c->nb, I = nb * QK8_0;
    const char *wq = c->w, *wd = c->w + nb * KILN_PACK_Q8_0_QS;
    __m512 acc[KILN_PACK_NT];
    UNROLL for (int t = 0; t < NT; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        kiln_pack_prefetch(c, b, KILN_PACK_Q8_0_QS + KILN_PACK_Q8_0_AUX);
        const char *q = wq + b * KILN_PACK_Q8_0_QS;
        const __m512 dw = f16x16(wd + b * KILN_PACK_Q8_0_AUX);
        __m512i s[KILN_PACK_NT];
        UNROLL for (int t = 0; t < NT; t++) s[t] = bcast4(c->x + t * c->x_row + I + 4 * nb + 4 * b);
        UNROLL for (int k = 0; k < 8; k++) {
            const __m512i w = ld(q + 64 * k);
            UNROLL for (int t = 0; t < NT; t++) s[t] = _mm512_dpbusd_epi32(s[t], w, bcast4(c->x + t * c->x_row + 32 * b + 4 * k));
        }
        UNROLL for (int t = 0; t < NT; t++)
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[t]), _mm512_mul_ps(dw, bcastf(c->x + t * c->x_row + I + 4 * b)), acc[t]);
    }
    UNROLL for (int t = 0; t < NT; t++) store_rows(c->y + t * c->ldy, acc[t], c->nrows);
}

void kiln_pack_gemm_q8_0_avx512(const kiln_pack_call *c) { NT_CASES(q8_0_nt, c) }

/* ---------------------------------------------------------------- Q4_0, Q4_1, IQ4_NL, Q5_0, Q5_1
 * The 32-element types of ops_repack.c's pack_b32. Lane r of vector k holds bytes qs[4k..4k+3] of row r: low
 * nibbles are elements 4k.., high nibbles 16+4k.., Q5's fifth bits merged in at bit 4
 * (vector k's low nibbles from bit k of each byte of the qh vector, its high nibbles from bit 4 + k), IQ4_NL's
 * indices looked up as level + 128. The quants are then unsigned, q = x + bias: Q4_0 x = q - 8, Q5_0 x = q - 16,
 * IQ4_NL x = (q - 128) through the table. Against a Q8_0 panel a block's sum starts at the panel's -128 * sum(x)
 * divided by 128 / bias (exact: a multiple of 128), so sum(q x) - bias * sum(x) is what the Q8_0 vec_dot sums.
 * Q4_1 and Q5_1 (x = d q + m) read a Q8_1 panel: dot = d * dy * sum(q qy) + m * s, s = dy * sum(qy). */

static inline __attribute__((always_inline)) void b32_nt(const kiln_pack_call *c, const int NT, const int kind) {
    const bool q5 = kind == B32_Q5_0 || kind == B32_Q5_1, has_m = kind == B32_Q4_1 || kind == B32_Q5_1;
    const size_t bq = q5 ? KILN_PACK_Q5_0_QS : KILN_PACK_Q4_0_QS, ba = has_m ? KILN_PACK_Q5_1_AUX : KILN_PACK_Q4_0_AUX;
    const int shift = kind == B32_Q4_0 ? 4 : kind == B32_Q5_0 ? 3 : 0; /* -128 sum(x) >> shift = -bias sum(x) */
    const int64_t nb = c->nb, I = nb * 32;
    const char *wq = c->w, *wa = c->w + nb * bq;
    const __m512i table = kind == B32_IQ4_NL ? iq4nl_table() : _mm512_setzero_si512();
    __m512 acc[KILN_PACK_NT];
    UNROLL for (int t = 0; t < NT; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        kiln_pack_prefetch(c, b, bq + ba);
        const char *q = wq + b * bq, *aux = wa + b * ba;
        const __m512 dw = f16x16(aux);
        __m512i s[KILN_PACK_NT];
        UNROLL for (int t = 0; t < NT; t++) {
            if (has_m) s[t] = _mm512_setzero_si512();
            else s[t] = _mm512_srai_epi32(bcast4(c->x + t * c->x_row + I + 4 * nb + 4 * b), shift);
        }
        UNROLL for (int k = 0; k < 4; k++) {
            __m512i lo, hi;
            b32_quants(q, kind, k, table, &lo, &hi);
            UNROLL for (int t = 0; t < NT; t++) {
                const char *xt = c->x + t * c->x_row + 32 * b;
                s[t] = _mm512_dpbusd_epi32(s[t], lo, bcast4(xt + 4 * k));
                s[t] = _mm512_dpbusd_epi32(s[t], hi, bcast4(xt + 16 + 4 * k));
            }
        }
        UNROLL for (int t = 0; t < NT; t++) {
            const char *xs = c->x + t * c->x_row + I;
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[t]), _mm512_mul_ps(dw, bcastf(xs + 4 * b)), acc[t]);
            if (has_m) acc[t] = _mm512_fmadd_ps(f16x16(aux + 32), bcastf(xs + 4 * nb + 4 * b), acc[t]);
        }
    }
    UNROLL for (int t = 0; t < NT; t++) store_rows(c->y + t * c->ldy, acc[t], c->nrows);
}

static inline __attribute__((always_inline)) void q4_0_nt(const kiln_pack_call *c, const int NT) { b32_nt(c, NT, B32_Q4_0); }
static inline __attribute__((always_inline)) void q4_1_nt(const kiln_pack_call *c, const int NT) { b32_nt(c, NT, B32_Q4_1); }
static inline __attribute__((always_inline)) void iq4_nl_nt(const kiln_pack_call *c, const int NT) { b32_nt(c, NT, B32_IQ4_NL); }
static inline __attribute__((always_inline)) void q5_0_nt(const kiln_pack_call *c, const int NT) { b32_nt(c, NT, B32_Q5_0); }
static inline __attribute__((always_inline)) void q5_1_nt(const kiln_pack_call *c, const int NT) { b32_nt(c, NT, B32_Q5_1); }

void kiln_pack_gemm_q4_0_avx512(const kiln_pack_call *c) { NT_CASES(q4_0_nt, c) }
void kiln_pack_gemm_q4_1_avx512(const kiln_pack_call *c) { NT_CASES(q4_1_nt, c) }
void kiln_pack_gemm_iq4_nl_avx512(const kiln_pack_call *c) { NT_CASES(iq4_nl_nt, c) }
void kiln_pack_gemm_q5_0_avx512(const kiln_pack_call *c) { NT_CASES(q5_0_nt, c) }
void kiln_pack_gemm_q5_1_avx512(const kiln_pack_call *c) { NT_CASES(q5_1_nt, c) }

/* ---------------------------------------------------------------- Q4_K and Q5_K
 * x = d * sc_j * q - dmin * m_j over sub-blocks j of 32. Vector (c, k) lane r holds qs[32c+4k..] of row r: low
 * nibbles are elements 4k.. of sub-block 2c, high nibbles of sub-block 2c+1. The high nibbles are used in place
 * (q * 16, masking with 0xF0 instead of shifting) and their scale divided by 16, exactly. The activations are
 * plain Q8_K blocks: per 256, d (float), qs, and bsums (sums of 16), so the mins term sum_j m_j (bsums[2j] +
 * bsums[2j+1]) is one vpdpwssd per sub-block against the pair (m_j, m_j). The 16 rows' scales[12] are stored as
 * 12 planes of 16 bytes (byte p of each row), unpacked for all rows at once as kiln_unpack_scales_k4 does
 * (k4_unpack, in gemm_repack_avx512.h with the quants' unpacking, k_quants). */

/* One 256-element block of Q4_K or Q5_K for NT tokens: F[t] = sum_j s_j A_j[t] with s_j = d * sc_j, then
 * acc[t] += dy * (F[t] - dmin * sum_j m_j S_j). q: the block's quants, aux: its scales, xb: token 0's Q8_K block. */
static inline __attribute__((always_inline)) void k4_block(const kiln_pack_call *c, const int NT, bool q5, const char *q,
                                                          const char *aux, const char *xb, __m512 *acc) {
    const __m512 d = f16x16(aux), dmin = f16x16(aux + 32), sixteenth = _mm512_set1_ps(1.0f / 16.0f);
    const k4_scales ks = k4_unpack(aux + 64);
    __m512 F[KILN_PACK_NT];
    __m512i M[KILN_PACK_NT];
    UNROLL for (int t = 0; t < NT; t++) F[t] = _mm512_setzero_ps();
    UNROLL for (int j = 0; j < 8; j++) {
        __m512 s = _mm512_mul_ps(d, _mm512_cvtepi32_ps(lane_u8(j < 4 ? ks.sc_lo : ks.sc_hi, j)));
        if ((j & 1) && !q5) s = _mm512_mul_ps(s, sixteenth);
        __m512i A[KILN_PACK_NT];
        UNROLL for (int t = 0; t < NT; t++) A[t] = _mm512_setzero_si512();
        UNROLL for (int k = 0; k < 8; k++) {
            const __m512i v = k_quants(q, q5, j, k);
            UNROLL for (int t = 0; t < NT; t++)
                A[t] = _mm512_dpbusd_epi32(A[t], v, bcast4(xb + t * c->x_row + Q8K_QS + 32 * j + 4 * k));
        }
        UNROLL for (int t = 0; t < NT; t++) F[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(A[t]), s, F[t]);
    }
    UNROLL for (int t = 0; t < NT; t++) M[t] = _mm512_setzero_si512();
    UNROLL for (int j = 0; j < 8; j++) {
        const __m512i m = lane_u8(j < 4 ? ks.m_lo : ks.m_hi, j), mm = _mm512_or_si512(m, _mm512_slli_epi32(m, 16));
        UNROLL for (int t = 0; t < NT; t++) M[t] = _mm512_dpwssd_epi32(M[t], mm, bcast4(xb + t * c->x_row + Q8K_BSUMS + 4 * j));
    }
    UNROLL for (int t = 0; t < NT; t++)
        acc[t] = _mm512_fmadd_ps(_mm512_fnmadd_ps(dmin, _mm512_cvtepi32_ps(M[t]), F[t]), bcastf(xb + t * c->x_row), acc[t]);
}

static inline __attribute__((always_inline)) void k4_nt(const kiln_pack_call *c, const int NT, bool q5) {
    const int64_t nb = c->nb;
    const size_t qs = q5 ? KILN_PACK_Q5_K_QS : KILN_PACK_Q4_K_QS, ax = q5 ? KILN_PACK_Q5_K_AUX : KILN_PACK_Q4_K_AUX;
    __m512 acc[KILN_PACK_NT];
    UNROLL for (int t = 0; t < NT; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        kiln_pack_prefetch(c, b, qs + ax);
        k4_block(c, NT, q5, c->w + b * qs, c->w + nb * qs + b * ax, c->x + b * (int64_t)sizeof(block_q8_K), acc);
    }
    UNROLL for (int t = 0; t < NT; t++) store_rows(c->y + t * c->ldy, acc[t], c->nrows);
}

static inline __attribute__((always_inline)) void q4_K_nt(const kiln_pack_call *c, const int NT) { k4_nt(c, NT, false); }
static inline __attribute__((always_inline)) void q5_K_nt(const kiln_pack_call *c, const int NT) { k4_nt(c, NT, true); }

void kiln_pack_gemm_q4_K_avx512(const kiln_pack_call *c) { NT_CASES(q4_K_nt, c) }
void kiln_pack_gemm_q5_K_avx512(const kiln_pack_call *c) { NT_CASES(q5_K_nt, c) }

/* ---------------------------------------------------------------- Q6_K
 * x = d * sc_g * (q - 32) over groups g of 16. For half h and k = 0..7, three vectors: A_k = ql[64h+4k..],
 * B_k = ql[64h+32+4k..], H_k = qh[32h+4k..] of each row. Quarter e = 0..3 of the half (elements 32e + 4k..) is
 * A low, B low, A high, B high nibbles, with bits 2e, 2e+1 of H on top; its group is 8h + 2e + k/4. The -32 is
 * taken off as 32 * sum_g sc_g bsums[g] (vpdpwssd against pairs (sc_2p, sc_2p+1)). Scales: 16 planes of 16 int8. */
static inline __m512i q6_quarter(const char *q, int e, int k) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    const __m512i l = ld(q + 192 * k + 64 * (e & 1)), h = ld(q + 192 * k + 128);
    const __m512i lo = e < 2 ? l : _mm512_srli_epi16(l, 4);
    __m512i hb;
    switch (e) {
    case 0: hb = _mm512_slli_epi16(h, 4); break;
    case 1: hb = _mm512_slli_epi16(h, 2); break;
    case 2: hb = h; break;
    default: hb = _mm512_srli_epi16(h, 2); break;
    }
    return merge_low(lo, _mm512_and_si512(hb, m30), m4);
}

static inline __attribute__((always_inline)) void q6_K_nt(const kiln_pack_call *c, const int NT) {
    const int64_t nb = c->nb;
    __m512 acc[KILN_PACK_NT];
    UNROLL for (int t = 0; t < NT; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        kiln_pack_prefetch(c, b, KILN_PACK_Q6_K_QS + KILN_PACK_Q6_K_AUX);
        const char *q = c->w + b * KILN_PACK_Q6_K_QS, *aux = c->w + nb * KILN_PACK_Q6_K_QS + b * KILN_PACK_Q6_K_AUX;
        const char *xb = c->x + b * (int64_t)sizeof(block_q8_K);
        const __m512 d = f16x16(aux);
        const char *planes = aux + 32;
        __m512 F[KILN_PACK_NT];
        __m512i C[KILN_PACK_NT];
        UNROLL for (int t = 0; t < NT; t++) F[t] = _mm512_setzero_ps();
        UNROLL for (int h = 0; h < 2; h++)
            UNROLL for (int e = 0; e < 4; e++)
                UNROLL for (int half = 0; half < 2; half++) {
                    const int g = 8 * h + 2 * e + half;
                    const __m128i sc = _mm_loadu_si128((const __m128i *)(planes + 16 * g));
                    const __m512 s = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sc)));
                    __m512i A[KILN_PACK_NT];
                    UNROLL for (int t = 0; t < NT; t++) A[t] = _mm512_setzero_si512();
                    UNROLL for (int k = 4 * half; k < 4 * half + 4; k++) {
                        const __m512i v = q6_quarter(q + 1536 * h, e, k);
                        UNROLL for (int t = 0; t < NT; t++)
                            A[t] = _mm512_dpbusd_epi32(A[t], v, bcast4(xb + t * c->x_row + Q8K_QS + 128 * h + 32 * e + 4 * k));
                    }
                    UNROLL for (int t = 0; t < NT; t++) F[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(A[t]), s, F[t]);
                }
        UNROLL for (int t = 0; t < NT; t++) C[t] = _mm512_setzero_si512();
        UNROLL for (int p = 0; p < 8; p++) {
            const __m128i a = _mm_loadu_si128((const __m128i *)(planes + 32 * p));
            const __m128i bb = _mm_loadu_si128((const __m128i *)(planes + 32 * p + 16));
            const __m512i pair = _mm512_cvtepi8_epi16(_mm256_set_m128i(_mm_unpackhi_epi8(a, bb), _mm_unpacklo_epi8(a, bb)));
            UNROLL for (int t = 0; t < NT; t++) C[t] = _mm512_dpwssd_epi32(C[t], pair, bcast4(xb + t * c->x_row + Q8K_BSUMS + 4 * p));
        }
        const __m512 d32 = _mm512_mul_ps(d, _mm512_set1_ps(32.0f));
        UNROLL for (int t = 0; t < NT; t++)
            acc[t] = _mm512_fmadd_ps(_mm512_fnmadd_ps(d32, _mm512_cvtepi32_ps(C[t]), F[t]), bcastf(xb + t * c->x_row), acc[t]);
    }
    UNROLL for (int t = 0; t < NT; t++) store_rows(c->y + t * c->ldy, acc[t], c->nrows);
}

void kiln_pack_gemm_q6_K_avx512(const kiln_pack_call *c) { NT_CASES(q6_K_nt, c) }

/* ---------------------------------------------------------------- IQ4_XS
 * x = d * (ls_j - 32) * level over sub-blocks j of 32, ls_j = scales_l nibble j | (2 bits j of scales_h) << 4.
 * The levels are looked up as level + 128 (unsigned); the 128 * sum(x) this adds to a sub-block is taken off in
 * the integer sum by one vpdpwssd of the pair (-128, -128) against the sub-block's two Q8_K bsums. */
static inline __attribute__((always_inline)) void iq4_xs_nt(const kiln_pack_call *c, const int NT) {
    const int64_t nb = c->nb;
    const __m512i m4 = _mm512_set1_epi8(0x0F), neg128 = _mm512_set1_epi16(-128);
    uint8_t tb[16];
    for (int i = 0; i < 16; i++) tb[i] = (uint8_t)(kiln_iq4nl_values[i] + 128);
    const __m512i table = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)tb));
    __m512 acc[KILN_PACK_NT];
    UNROLL for (int t = 0; t < NT; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        kiln_pack_prefetch(c, b, KILN_PACK_IQ4_XS_QS + KILN_PACK_IQ4_XS_AUX);
        const char *q = c->w + b * KILN_PACK_IQ4_XS_QS, *aux = c->w + nb * KILN_PACK_IQ4_XS_QS + b * KILN_PACK_IQ4_XS_AUX;
        const char *xb = c->x + b * (int64_t)sizeof(block_q8_K);
        const __m512 d = f16x16(aux);
        const __m128i sh_lo = _mm_loadu_si128((const __m128i *)(aux + 32)), sh_hi = _mm_loadu_si128((const __m128i *)(aux + 48));
        __m512 F[KILN_PACK_NT];
        UNROLL for (int t = 0; t < NT; t++) F[t] = _mm512_setzero_ps();
        UNROLL for (int j = 0; j < 8; j++) {
            const __m128i l = _mm_loadu_si128((const __m128i *)(aux + 64 + 16 * (j >> 1)));
            const __m128i lo4 = _mm_and_si128(j & 1 ? _mm_srli_epi16(l, 4) : l, _mm_set1_epi8(0x0F));
            const __m128i hsrc = j < 4 ? sh_lo : sh_hi;
            const __m128i hi2 = _mm_and_si128(_mm_srli_epi16(hsrc, 2 * (j & 3)), _mm_set1_epi8(3));
            const __m128i ls = _mm_or_si128(lo4, _mm_slli_epi16(hi2, 4));
            const __m512 s = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_cvtepu8_epi32(ls), _mm512_set1_epi32(32))));
            __m512i A[KILN_PACK_NT];
            UNROLL for (int t = 0; t < NT; t++) A[t] = _mm512_dpwssd_epi32(_mm512_setzero_si512(), neg128, bcast4(xb + t * c->x_row + Q8K_BSUMS + 4 * j));
            UNROLL for (int k = 0; k < 4; k++) {
                const __m512i w = ld(q + 256 * j + 64 * k);
                const __m512i lo = _mm512_shuffle_epi8(table, _mm512_and_si512(w, m4));
                const __m512i hi = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(w, 4), m4));
                UNROLL for (int t = 0; t < NT; t++) {
                    const char *xt = xb + t * c->x_row + Q8K_QS + 32 * j;
                    A[t] = _mm512_dpbusd_epi32(A[t], lo, bcast4(xt + 4 * k));
                    A[t] = _mm512_dpbusd_epi32(A[t], hi, bcast4(xt + 16 + 4 * k));
                }
            }
            UNROLL for (int t = 0; t < NT; t++) F[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(A[t]), s, F[t]);
        }
        UNROLL for (int t = 0; t < NT; t++) acc[t] = _mm512_fmadd_ps(F[t], bcastf(xb + t * c->x_row), acc[t]);
    }
    UNROLL for (int t = 0; t < NT; t++) store_rows(c->y + t * c->ldy, acc[t], c->nrows);
}

void kiln_pack_gemm_iq4_xs_avx512(const kiln_pack_call *c) { NT_CASES(iq4_xs_nt, c) }

/* ---------------------------------------------------------------- Q2_K and Q3_K
 * Sub-blocks of 16. Vector (n, k) (n = 0, 1; k = 0..7) lane r holds qs[32n+4k..32n+4k+3] of row r; its bit pair p
 * (a shift by 2p and a mask) is elements 128n + 32p + 4k.. of the block, in sub-block 8n + 2p + k/4. Q3_K adds
 * 8 vectors of hmask (lane r: hmask[4k..4k+3]), where bit 4n + p of each byte is that element's third bit.
 * A sub-block's integer sum A (|A| <= 16 * 7 * 128, an int16) is scaled in the integers by one vpdpwssd against
 * its scale in the low half of each lane (the high half zero), so a block is one int32 sum per row and token, as
 * the vec_dot's sumi. The 16 rows' scales are planes of 16 bytes, four planes to a 512-bit load.
 * Q2_K: x = d * sc * q - dmin * m, (sc, m) the low and high nibbles of scales[sb]; the mins term is vpdpwssd
 * against the Q8_K bsums by pairs (m_2p, m_2p+1).
 * Q3_K: x = d * (sc - 32) * (u - 4), u = q | 4 * hbit in 0..7 (unsigned, as vpdpbusd wants); the 4 * sum(x) that u
 * adds is taken off as 4 * sum_sb (sc - 32) bsums[sb], by pairs as Q2_K's mins. */

/* Sub-block sb's scale of 16 rows (plane sb & 3 of group z = sb >> 2), sign- or zero-extended to 32 bits and cut
 * to the low 16 (the pair (s, 0) of vpdpwssd). */
static inline __m512i sb_scale(__m512i z, int sb, bool is_signed) {
    __m128i v;
    switch (sb & 3) {
    case 0: v = _mm512_castsi512_si128(z); break;
    case 1: v = _mm512_extracti32x4_epi32(z, 1); break;
    case 2: v = _mm512_extracti32x4_epi32(z, 2); break;
    default: v = _mm512_extracti32x4_epi32(z, 3); break;
    }
    if (!is_signed) return _mm512_cvtepu8_epi32(v);
    return _mm512_and_si512(_mm512_cvtepi8_epi32(v), _mm512_set1_epi32(0xFFFF));
}

/* The pairs (s_2p, s_2p+1) of 16 rows as int16 lanes, from planes 2p and 2p+1 (bytes 32p.. of z[p >> 1]). */
static inline __m512i sb_pair(const __m512i z[4], int p, bool is_signed) {
    const __m512i zz = z[p >> 1];
    const __m128i a = (p & 1) ? _mm512_extracti32x4_epi32(zz, 2) : _mm512_castsi512_si128(zz);
    const __m128i b = (p & 1) ? _mm512_extracti32x4_epi32(zz, 3) : _mm512_extracti32x4_epi32(zz, 1);
    const __m256i ab = _mm256_set_m128i(_mm_unpackhi_epi8(a, b), _mm_unpacklo_epi8(a, b));
    return is_signed ? _mm512_cvtepi8_epi16(ab) : _mm512_cvtepu8_epi16(ab);
}

/* Quant vector (n, p, k) of Q2_K (codes 0..3) or Q3_K (u, 0..7). */
static inline __m512i k23_quants(const char *q, bool q3, int n, int p, int k) {
    const __m512i w = ld(q + 512 * n + 64 * k), lo = p ? _mm512_srli_epi16(w, 2 * p) : w;
    if (!q3) return _mm512_and_si512(lo, _mm512_set1_epi8(3));
    const __m512i h = ld(q + 1024 + 64 * k);
    const int s = 4 * n + p - 2; /* hbit to bit 2 */
    const __m512i hb = s < 0 ? _mm512_slli_epi16(h, -s) : s ? _mm512_srli_epi16(h, s) : h;
    /* (lo & 3) | (hb & 4): vpternlogd over (lo, hb, 3), truth table 0xE4 = c ? a : b, then the mask of both */
    return _mm512_and_si512(_mm512_ternarylogic_epi32(lo, hb, _mm512_set1_epi8(3), 0xE4), _mm512_set1_epi8(7));
}

static inline __attribute__((always_inline)) void k23_nt(const kiln_pack_call *c, const int NT, const bool q3) {
    const int64_t nb = c->nb;
    const size_t bq = q3 ? KILN_PACK_Q3_K_QS : KILN_PACK_Q2_K_QS, ba = q3 ? KILN_PACK_Q3_K_AUX : KILN_PACK_Q2_K_AUX;
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m512 acc[KILN_PACK_NT];
    UNROLL for (int t = 0; t < NT; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        kiln_pack_prefetch(c, b, bq + ba);
        const char *q = c->w + b * bq, *aux = c->w + nb * bq + b * ba;
        const char *xb = c->x + b * (int64_t)sizeof(block_q8_K);
        const __m512 d = f16x16(aux);
        /* z[g]: the scales of sub-blocks 4g..4g+3 (Q2_K: low nibbles; mn[g] the high ones), or Q3_K's sc - 32 */
        __m512i z[4], mn[4];
        if (!q3) {
            UNROLL for (int g = 0; g < 4; g++) {
                const __m512i v = ld(aux + 64 + 64 * g);
                z[g] = _mm512_and_si512(v, m4), mn[g] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
            }
        } else {
            const __m512i p0 = ld(aux + 32), p1 = ld(aux + 96), p2 = ld(aux + 160), m3 = _mm512_set1_epi8(3);
            UNROLL for (int g = 0; g < 4; g++) {
                const __m512i lo = _mm512_and_si512(g & 2 ? _mm512_srli_epi16(g & 1 ? p1 : p0, 4) : (g & 1 ? p1 : p0), m4);
                const __m512i hi = _mm512_and_si512(g ? _mm512_srli_epi16(p2, 2 * g) : p2, m3);
                z[g] = _mm512_sub_epi8(_mm512_or_si512(lo, _mm512_slli_epi16(hi, 4)), _mm512_set1_epi8(32));
            }
        }
        __m512i S[KILN_PACK_NT], C[KILN_PACK_NT];
        UNROLL for (int t = 0; t < NT; t++) S[t] = _mm512_setzero_si512(), C[t] = _mm512_setzero_si512();
        UNROLL for (int n = 0; n < 2; n++)
            UNROLL for (int p = 0; p < 4; p++)
                UNROLL for (int half = 0; half < 2; half++) {
                    const int sb = 8 * n + 2 * p + half;
                    const __m512i s = sb_scale(z[sb >> 2], sb, q3);
                    __m512i A[KILN_PACK_NT];
                    UNROLL for (int t = 0; t < NT; t++) A[t] = _mm512_setzero_si512();
                    UNROLL for (int k = 4 * half; k < 4 * half + 4; k++) {
                        const __m512i v = k23_quants(q, q3, n, p, k);
                        UNROLL for (int t = 0; t < NT; t++)
                            A[t] = _mm512_dpbusd_epi32(A[t], v, bcast4(xb + t * c->x_row + Q8K_QS + 128 * n + 32 * p + 4 * k));
                    }
                    UNROLL for (int t = 0; t < NT; t++) S[t] = _mm512_dpwssd_epi32(S[t], A[t], s);
                }
        UNROLL for (int p = 0; p < 8; p++) {
            const __m512i pair = sb_pair(q3 ? z : mn, p, q3);
            UNROLL for (int t = 0; t < NT; t++) C[t] = _mm512_dpwssd_epi32(C[t], pair, bcast4(xb + t * c->x_row + Q8K_BSUMS + 4 * p));
        }
        if (q3) {
            UNROLL for (int t = 0; t < NT; t++) {
                const __m512i isum = _mm512_sub_epi32(S[t], _mm512_slli_epi32(C[t], 2));
                acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_cvtepi32_ps(isum)), bcastf(xb + t * c->x_row), acc[t]);
            }
        } else {
            const __m512 dmin = f16x16(aux + 32);
            UNROLL for (int t = 0; t < NT; t++) {
                const __m512 f = _mm512_fnmadd_ps(dmin, _mm512_cvtepi32_ps(C[t]), _mm512_mul_ps(d, _mm512_cvtepi32_ps(S[t])));
                acc[t] = _mm512_fmadd_ps(f, bcastf(xb + t * c->x_row), acc[t]);
            }
        }
    }
    UNROLL for (int t = 0; t < NT; t++) store_rows(c->y + t * c->ldy, acc[t], c->nrows);
}

static inline __attribute__((always_inline)) void q2_K_nt(const kiln_pack_call *c, const int NT) { k23_nt(c, NT, false); }
static inline __attribute__((always_inline)) void q3_K_nt(const kiln_pack_call *c, const int NT) { k23_nt(c, NT, true); }

void kiln_pack_gemm_q2_K_avx512(const kiln_pack_call *c) { NT_CASES(q2_K_nt, c) }
void kiln_pack_gemm_q3_K_avx512(const kiln_pack_call *c) { NT_CASES(q3_K_nt, c) }

/* ---------------------------------------------------------------- Q2_K and Q3_K for a batch
 * With many tokens the unpacking and the per-sub-block scaling of k23_nt are worth doing once: K23B_BLOCKS blocks
 * of the group at a time are turned into 8-bit weights with the sub-block scales folded in, vector i (0..63) of a
 * block holding elements 4i..4i+3 of each row, and every token then sums a block as one chain of 64 vpdpbusd.
 *  - Q2_K: w = sc * q (0..45). The mins term is k23_nt's.
 *  - Q3_K: w = (sc - 32) * (u - 4) is -124..128, so the block stores 128 - w (4..252, unsigned, as vpdpbusd wants);
 *    the token's sum is then 128 sum(x) - sum(w x), and 128 sum(x) comes from the Q8_K bsums by pairs.
 * The integers are k23_nt's, and so are the float steps, in its order (a run of blocks ends by storing its
 * accumulators to y and the next starts from them, an exact round trip): the results are its bits. */
#define K23B_BLOCKS 8
#define K23B_BYTES 4096 /* one block of 16 rows as 8-bit weights */

/* Q3_K's sc - 32 (z) or Q2_K's sc of 16 rows, as k23_nt reads them. */
static inline void k23_scales(const char *aux, bool q3, __m512i z[4]) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    if (!q3) {
        UNROLL for (int g = 0; g < 4; g++) z[g] = _mm512_and_si512(ld(aux + 64 + 64 * g), m4);
        return;
    }
    const __m512i p0 = ld(aux + 32), p1 = ld(aux + 96), p2 = ld(aux + 160), m3 = _mm512_set1_epi8(3);
    UNROLL for (int g = 0; g < 4; g++) {
        const __m512i lo = _mm512_and_si512(g & 2 ? _mm512_srli_epi16(g & 1 ? p1 : p0, 4) : (g & 1 ? p1 : p0), m4);
        const __m512i hi = _mm512_and_si512(g ? _mm512_srli_epi16(p2, 2 * g) : p2, m3);
        z[g] = _mm512_sub_epi8(_mm512_or_si512(lo, _mm512_slli_epi16(hi, 4)), _mm512_set1_epi8(32));
    }
}

static void k23b_convert(char *out, const char *q, const char *aux, const bool q3) {
    const __m512i lo8 = _mm512_set1_epi16(0x00FF);
    __m512i z[4];
    k23_scales(aux, q3, z);
    for (int n = 0; n < 2; n++)
        for (int p = 0; p < 4; p++)
            for (int k = 0; k < 8; k++) {
                const int sb = 8 * n + 2 * p + k / 4;
                const __m512i v = k23_quants(q, q3, n, p, k);
                /* each row's factor in both 16-bit halves of its lane: Q2_K sc, Q3_K 32 - sc */
                __m512i f = sb_scale(z[sb >> 2], sb, q3);
                if (q3) f = _mm512_and_si512(_mm512_sub_epi32(_mm512_setzero_si512(), f), _mm512_set1_epi32(0xFFFF));
                f = _mm512_or_si512(f, _mm512_slli_epi32(f, 16));
                __m512i even = _mm512_and_si512(v, lo8), odd = _mm512_srli_epi16(v, 8);
                if (q3) { /* (u - 4) (32 - sc) + 128 */
                    const __m512i four = _mm512_set1_epi16(4), c128 = _mm512_set1_epi16(128);
                    even = _mm512_add_epi16(_mm512_mullo_epi16(_mm512_sub_epi16(even, four), f), c128);
                    odd = _mm512_add_epi16(_mm512_mullo_epi16(_mm512_sub_epi16(odd, four), f), c128);
                } else {
                    even = _mm512_mullo_epi16(even, f), odd = _mm512_mullo_epi16(odd, f);
                }
                const __m512i w = _mm512_or_si512(_mm512_and_si512(even, lo8), _mm512_slli_epi16(odd, 8));
                _mm512_storeu_si512((void *)(out + 64 * (32 * n + 8 * p + k)), w);
            }
}

/* Blocks [b0, b1) of the group (converted at wq) for NT tokens; first: the accumulators start at 0, else at y. */
static inline __attribute__((always_inline)) void k23b_nt(const kiln_pack_call *c, const char *wq, int64_t b0, int64_t b1,
                                                          bool first, const int NT, const bool q3) {
    const size_t bq = q3 ? KILN_PACK_Q3_K_QS : KILN_PACK_Q2_K_QS, ba = q3 ? KILN_PACK_Q3_K_AUX : KILN_PACK_Q2_K_AUX;
    const __mmask16 rows = c->nrows == KILN_PACK_ROWS ? (__mmask16)0xFFFF : (__mmask16)((1u << c->nrows) - 1);
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m512 acc[KILN_PACK_NT];
    UNROLL for (int t = 0; t < NT; t++) acc[t] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(rows, c->y + t * c->ldy);
    for (int64_t b = b0; b < b1; b++) {
        const char *w = wq + (b - b0) * K23B_BYTES, *aux = c->w + c->nb * (int64_t)bq + b * (int64_t)ba;
        const char *xb = c->x + b * (int64_t)sizeof(block_q8_K);
        __m512i S[KILN_PACK_NT], C[KILN_PACK_NT];
        UNROLL for (int t = 0; t < NT; t++) S[t] = _mm512_setzero_si512(), C[t] = _mm512_setzero_si512();
        for (int i = 0; i < 64; i += 2) {
            const __m512i v0 = ld(w + 64 * i), v1 = ld(w + 64 * i + 64);
            UNROLL for (int t = 0; t < NT; t++) {
                S[t] = _mm512_dpbusd_epi32(S[t], v0, bcast4(xb + t * c->x_row + Q8K_QS + 4 * i));
                S[t] = _mm512_dpbusd_epi32(S[t], v1, bcast4(xb + t * c->x_row + Q8K_QS + 4 * i + 4));
            }
        }
        if (q3) { /* C = 128 sum(x) */
            const __m512i c128 = _mm512_set1_epi16(128);
            UNROLL for (int p = 0; p < 8; p++)
                UNROLL for (int t = 0; t < NT; t++) C[t] = _mm512_dpwssd_epi32(C[t], c128, bcast4(xb + t * c->x_row + Q8K_BSUMS + 4 * p));
            const __m512 d = f16x16(aux);
            UNROLL for (int t = 0; t < NT; t++) {
                const __m512i isum = _mm512_sub_epi32(C[t], S[t]);
                acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_cvtepi32_ps(isum)), bcastf(xb + t * c->x_row), acc[t]);
            }
        } else {
            __m512i mn[4];
            UNROLL for (int g = 0; g < 4; g++) mn[g] = _mm512_and_si512(_mm512_srli_epi16(ld(aux + 64 + 64 * g), 4), m4);
            UNROLL for (int p = 0; p < 8; p++) {
                const __m512i pair = sb_pair(mn, p, false);
                UNROLL for (int t = 0; t < NT; t++) C[t] = _mm512_dpwssd_epi32(C[t], pair, bcast4(xb + t * c->x_row + Q8K_BSUMS + 4 * p));
            }
            const __m512 d = f16x16(aux), dmin = f16x16(aux + 32);
            UNROLL for (int t = 0; t < NT; t++) {
                const __m512 f = _mm512_fnmadd_ps(dmin, _mm512_cvtepi32_ps(C[t]), _mm512_mul_ps(d, _mm512_cvtepi32_ps(S[t])));
                acc[t] = _mm512_fmadd_ps(f, bcastf(xb + t * c->x_row), acc[t]);
            }
        }
    }
    UNROLL for (int t = 0; t < NT; t++) store_rows(c->y + t * c->ldy, acc[t], c->nrows);
}

static inline __attribute__((always_inline)) void k23_batch(const kiln_pack_call *c0, int64_t T, const bool q3) {
    const size_t bq = q3 ? KILN_PACK_Q3_K_QS : KILN_PACK_Q2_K_QS, ba = q3 ? KILN_PACK_Q3_K_AUX : KILN_PACK_Q2_K_AUX;
    _Alignas(64) char wq[K23B_BLOCKS * K23B_BYTES];
    for (int64_t b0 = 0; b0 < c0->nb; b0 += K23B_BLOCKS) {
        const int64_t b1 = b0 + K23B_BLOCKS < c0->nb ? b0 + K23B_BLOCKS : c0->nb;
        for (int64_t b = b0; b < b1; b++)
            k23b_convert(wq + (b - b0) * K23B_BYTES, c0->w + b * (int64_t)bq, c0->w + c0->nb * (int64_t)bq + b * (int64_t)ba, q3);
        for (int64_t t = 0; t < T; t += KILN_PACK_NT) {
            kiln_pack_call c = *c0;
            c.x = c0->x + t * (int64_t)c0->x_row;
            c.y = c0->y + t * (int64_t)c0->ldy;
            const bool first = b0 == 0;
            switch (T - t < KILN_PACK_NT ? T - t : KILN_PACK_NT) {
            case 1: k23b_nt(&c, wq, b0, b1, first, 1, q3); break;
            case 2: k23b_nt(&c, wq, b0, b1, first, 2, q3); break;
            case 3: k23b_nt(&c, wq, b0, b1, first, 3, q3); break;
            case 4: k23b_nt(&c, wq, b0, b1, first, 4, q3); break;
            case 5: k23b_nt(&c, wq, b0, b1, first, 5, q3); break;
            case 6: k23b_nt(&c, wq, b0, b1, first, 6, q3); break;
            case 7: k23b_nt(&c, wq, b0, b1, first, 7, q3); break;
            default: k23b_nt(&c, wq, b0, b1, first, 8, q3); break;
            }
        }
    }
}

void kiln_pack_batch_q2_K_avx512(const kiln_pack_call *c, int64_t T) { k23_batch(c, T, false); }
void kiln_pack_batch_q3_K_avx512(const kiln_pack_call *c, int64_t T) { k23_batch(c, T, true); }

#endif /* __x86_64__ */
