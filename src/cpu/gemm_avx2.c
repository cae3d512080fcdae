/* gemm_avx2.c: AVX2 + FMA + F16C multi-row dot kernels for prefill: one weight row against 4 activation rows,
 * s[r * bs] = vec_dot(n, x, y + r * by) for r = 0..3. Each weight block is unpacked (nibbles, scales) once and
 * used for the 4 rows; every row goes through exactly the integer and float operations, in the same order, of
 * the single-row kernel in quants_avx2.c, so the results are bit-for-bit those of 4 vec_dot calls
 * (tests/test_ops.c checks it). ops_matmul.c uses them for groups of 4 tokens. */
#if defined(__x86_64__)

#include "ops_internal.h"

#include <immintrin.h>
#include "cpu/simd_avx2.h"

#define ROWS 4

void kiln_gemm4_q4_K_q8_K_avx2(int64_t n, float *s, size_t bs, const void *vx, const void *vy, size_t by) {
    const block_q4_K *x = vx;
    const block_q8_K *y[ROWS];
    UNROLL for (int r = 0; r < ROWS; r++) y[r] = (const block_q8_K *)((const char *)vy + r * by);
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256 acc[ROWS], acc_m[ROWS];
    UNROLL for (int r = 0; r < ROWS; r++) acc[r] = acc_m[r] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float xd = f16_to_f32(x[i].d), xdmin = f16_to_f32(x[i].dmin);
        uint32_t sm[4];
        kiln_unpack_scales_k4(x[i].scales, sm);
        const __m128i m8 = _mm_loadl_epi64((const __m128i *)(sm + 2));
        const __m256i m16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8)); /* m0 m0 m1 m1 ... m7 m7 */
        const __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)sm)));
        __m256i isum[ROWS];
        UNROLL for (int r = 0; r < ROWS; r++) {
            const float dmin = xdmin * y[r][i].d;
            const __m256i mb = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y[r][i].bsums), m16);
            acc_m[r] = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(mb), acc_m[r]);
            isum[r] = _mm256_setzero_si256();
        }
        UNROLL for (int j = 0; j < 4; j++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * j));
            const __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            const __m256i s0 = _mm256_shuffle_epi8(sc16, word_bcast_mask(2 * j));
            const __m256i s1 = _mm256_shuffle_epi8(sc16, word_bcast_mask(2 * j + 1));
            UNROLL for (int r = 0; r < ROWS; r++) {
                const int8_t *yq = y[r][i].qs + 64 * j;
                __m256i p0 = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)yq));
                __m256i p1 = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(yq + 32)));
                p0 = _mm256_madd_epi16(p0, s0);
                p1 = _mm256_madd_epi16(p1, s1);
                isum[r] = _mm256_add_epi32(isum[r], _mm256_add_epi32(p0, p1));
            }
        }
        UNROLL for (int r = 0; r < ROWS; r++) {
            const float d = xd * y[r][i].d;
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(isum[r]), acc[r]);
        }
    }
    UNROLL for (int r = 0; r < ROWS; r++) s[r * bs] = hsum_ps(acc[r]) - hsum_ps(acc_m[r]);
}

void kiln_gemm4_q8_0_q8_0_avx2(int64_t n, float *s, size_t bs, const void *vx, const void *vy, size_t by) {
    const block_q8_0 *x = vx;
    const block_q8_0 *y[ROWS];
    UNROLL for (int r = 0; r < ROWS; r++) y[r] = (const block_q8_0 *)((const char *)vy + r * by);
    __m256 acc[ROWS];
    UNROLL for (int r = 0; r < ROWS; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK8_0; i++) {
        const __m256i a0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x[i].qs));
        const __m256i a1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(x[i].qs + 16)));
        UNROLL for (int r = 0; r < ROWS; r++) {
            __m256i p = _mm256_setzero_si256();
            p = _mm256_add_epi32(p, _mm256_madd_epi16(a0, _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)y[r][i].qs))));
            p = _mm256_add_epi32(p, _mm256_madd_epi16(a1, _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(y[r][i].qs + 16)))));
            const __m256 d = _mm256_broadcastss_ps(scale_products(x[i].d, y[r][i].d, 0, 0));
            acc[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc[r]);
        }
    }
    UNROLL for (int r = 0; r < ROWS; r++) s[r * bs] = hsum_ps(acc[r]);
}

void kiln_gemm4_q6_K_q8_K_avx2(int64_t n, float *s, size_t bs, const void *vx, const void *vy, size_t by) {
    const block_q6_K *x = vx;
    const block_q8_K *y[ROWS];
    UNROLL for (int r = 0; r < ROWS; r++) y[r] = (const block_q8_K *)((const char *)vy + r * by);
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(0x30);
    __m256 acc[ROWS];
    UNROLL for (int r = 0; r < ROWS; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float xd = f16_to_f32(x[i].d);
        const __m256i sc_all = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x[i].scales));
        __m256i isum[ROWS];
        UNROLL for (int r = 0; r < ROWS; r++) isum[r] = _mm256_setzero_si256();
        UNROLL for (int c = 0; c < 2; c++) {
            const __m256i sc8 = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)(x[i].scales + 8 * c))));
            const uint8_t *ql = x[i].ql + 64 * c, *qh = x[i].qh + 32 * c;
            __m256i l0 = _mm256_loadu_si256((const __m256i *)ql), l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
            __m256i h = _mm256_loadu_si256((const __m256i *)qh);
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(h, 4), m2));
            q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(h, 2), m2));
            q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(h, m2));
            q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4), _mm256_and_si256(_mm256_srli_epi16(h, 2), m2));
            UNROLL for (int m = 0; m < 4; m++) {
                const __m256i mask = _mm256_set_m128i(_mm256_castsi256_si128(word_bcast_mask(2 * m + 1)),
                                                      _mm256_castsi256_si128(word_bcast_mask(2 * m)));
                const __m256i scm = _mm256_shuffle_epi8(sc8, mask);
                UNROLL for (int r = 0; r < ROWS; r++) {
                    __m256i p = _mm256_maddubs_epi16(q[m], _mm256_loadu_si256((const __m256i *)(y[r][i].qs + 128 * c + 32 * m)));
                    isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(p, scm));
                }
            }
        }
        UNROLL for (int r = 0; r < ROWS; r++) {
            const float d = xd * y[r][i].d;
            const __m256i corr = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y[r][i].bsums), sc_all);
            const __m256i t = _mm256_sub_epi32(isum[r], _mm256_slli_epi32(corr, 5));
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(t), acc[r]);
        }
    }
    UNROLL for (int r = 0; r < ROWS; r++) s[r * bs] = hsum_ps(acc[r]);
}

void kiln_gemm4_q4_1_q8_1_avx2(int64_t n, float *s, size_t bs, const void *vx, const void *vy, size_t by) {
    const block_q4_1 *x = vx;
    const block_q8_1 *y[ROWS];
    UNROLL for (int r = 0; r < ROWS; r++) y[r] = (const block_q8_1 *)((const char *)vy + r * by);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[ROWS];
    __m128 summs[ROWS];
    UNROLL for (int r = 0; r < ROWS; r++) acc[r] = _mm256_setzero_ps(), summs[r] = _mm_setzero_ps();
    for (int64_t i = 0; i < n / QK4_1; i++) {
        const __m256i qx = unpack_nibbles16(x[i].qs);
        UNROLL for (int r = 0; r < ROWS; r++) {
            __m256i p = _mm256_maddubs_epi16(qx, _mm256_loadu_si256((const __m256i *)y[r][i].qs));
            const __m128 prod = scale_products(x[i].d, y[r][i].d, x[i].m, y[r][i].s);
            acc[r] = _mm256_fmadd_ps(_mm256_broadcastss_ps(prod), _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones)), acc[r]);
            summs[r] = _mm_add_ps(summs[r], prod);
        }
    }
    UNROLL for (int r = 0; r < ROWS; r++) s[r * bs] = hsum_ps(acc[r]) + _mm_cvtss_f32(_mm_movehl_ps(summs[r], summs[r]));
}

void kiln_gemm4_q5_K_q8_K_avx2(int64_t n, float *s, size_t bs, const void *vx, const void *vy, size_t by) {
    const block_q5_K *x = vx;
    const block_q8_K *y[ROWS];
    UNROLL for (int r = 0; r < ROWS; r++) y[r] = (const block_q8_K *)((const char *)vy + r * by);
    const __m256i m4 = _mm256_set1_epi8(0x0F), b0 = _mm256_set1_epi8(1), b1 = _mm256_set1_epi8(2);
    __m256 acc[ROWS], acc_m[ROWS];
    UNROLL for (int r = 0; r < ROWS; r++) acc[r] = acc_m[r] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float xd = f16_to_f32(x[i].d), xdmin = f16_to_f32(x[i].dmin);
        uint32_t sm[4];
        kiln_unpack_scales_k4(x[i].scales, sm);
        const __m128i m8 = _mm_loadl_epi64((const __m128i *)(sm + 2));
        const __m256i m16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));
        const __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)sm)));
        __m256i qh = _mm256_loadu_si256((const __m256i *)x[i].qh);
        __m256i isum[ROWS];
        UNROLL for (int r = 0; r < ROWS; r++) {
            const float dmin = xdmin * y[r][i].d;
            const __m256i mb = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y[r][i].bsums), m16);
            acc_m[r] = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(mb), acc_m[r]);
            isum[r] = _mm256_setzero_si256();
        }
        UNROLL for (int j = 0; j < 4; j++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * j));
            const __m256i lo = _mm256_or_si256(_mm256_and_si256(q, m4), _mm256_slli_epi16(_mm256_and_si256(qh, b0), 4));
            const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), _mm256_slli_epi16(_mm256_and_si256(qh, b1), 3));
            qh = _mm256_srli_epi16(qh, 2);
            const __m256i s0 = _mm256_shuffle_epi8(sc16, word_bcast_mask(2 * j));
            const __m256i s1 = _mm256_shuffle_epi8(sc16, word_bcast_mask(2 * j + 1));
            UNROLL for (int r = 0; r < ROWS; r++) {
                const int8_t *yq = y[r][i].qs + 64 * j;
                __m256i p0 = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)yq));
                __m256i p1 = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(yq + 32)));
                p0 = _mm256_madd_epi16(p0, s0);
                p1 = _mm256_madd_epi16(p1, s1);
                isum[r] = _mm256_add_epi32(isum[r], _mm256_add_epi32(p0, p1));
            }
        }
        UNROLL for (int r = 0; r < ROWS; r++) {
            const float d = xd * y[r][i].d;
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(isum[r]), acc[r]);
        }
    }
    UNROLL for (int r = 0; r < ROWS; r++) s[r * bs] = hsum_ps(acc[r]) - hsum_ps(acc_m[r]);
}

#endif /* __x86_64__ */
