/* gemm_avx512.c: AVX-512 (BW/VL/DQ + VNNI) multi-row dot kernels for prefill: one weight row against 4
 * activation rows, s[r * bs] = vec_dot(n, x, y + r * by) for r = 0..3. Each weight block is unpacked (nibbles,
 * scale vectors) once and used for the 4 rows; every row goes through exactly the operations, in the same
 * order, of the single-row kernel in quants_avx512.c, so the results are bit-for-bit those of 4 vec_dot calls
 * (tests/test_ops.c checks it). ops_matmul.c uses them for groups of 4 tokens. */
#if defined(__x86_64__)

#include "ops_internal.h"

#include <immintrin.h>
#include "cpu/simd_avx512.h"

static inline __m512 pair_scales(kiln_fp16 a0, kiln_fp16 b0, kiln_fp16 a1, kiln_fp16 b1) {
    const uint64_t packed = (uint64_t)a0 | (uint64_t)b0 << 16 | (uint64_t)a1 << 32 | (uint64_t)b1 << 48;
    __m128 f = _mm_cvtph_ps(_mm_cvtsi64_si128((long long)packed));
    __m128 prod = _mm_mul_ps(f, _mm_movehdup_ps(f));
    const __m512i idx = _mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0);
    return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(prod));
}

#define ROWS 4

void kiln_gemm4_q4_K_q8_K_avx512(int64_t n, float *s, size_t bs, const void *vx, const void *vy, size_t by) {
    const block_q4_K *x = vx;
    const block_q8_K *y[ROWS];
    UNROLL for (int r = 0; r < ROWS; r++) y[r] = (const block_q8_K *)((const char *)vy + r * by);
    __m512i idx[4];
    UNROLL for (int j = 0; j < 4; j++) idx[j] = _mm512_loadu_si512((const void *)scale_idx_halves[j]);
    __m512 acc[ROWS];
    __m256 acc_m[ROWS];
    UNROLL for (int r = 0; r < ROWS; r++) acc[r] = _mm512_setzero_ps(), acc_m[r] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float xd = f16_to_f32(x[i].d), xdmin = f16_to_f32(x[i].dmin);
        uint32_t sm[4];
        kiln_unpack_scales_k4(x[i].scales, sm);
        const __m128i m8 = _mm_loadl_epi64((const __m128i *)(sm + 2));
        const __m256i m16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));
        const __m512i sc16 = _mm512_zextsi128_si512(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)sm)));
        __m512i isum[ROWS];
        UNROLL for (int r = 0; r < ROWS; r++) {
            const float dmin = xdmin * y[r][i].d;
            const __m256i mb = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y[r][i].bsums), m16);
            acc_m[r] = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(mb), acc_m[r]);
            isum[r] = _mm512_setzero_si512();
        }
        UNROLL for (int j = 0; j < 4; j++) {
            const __m512i q = unpack_nibbles32(x[i].qs + 32 * j);
            const __m512i sc = _mm512_permutexvar_epi16(idx[j], sc16);
            UNROLL for (int r = 0; r < ROWS; r++) {
                __m512i p = _mm512_maddubs_epi16(q, _mm512_loadu_si512((const void *)(y[r][i].qs + 64 * j)));
                isum[r] = _mm512_dpwssd_epi32(isum[r], p, sc);
            }
        }
        UNROLL for (int r = 0; r < ROWS; r++) {
            const float d = xd * y[r][i].d;
            acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(isum[r]), acc[r]);
        }
    }
    UNROLL for (int r = 0; r < ROWS; r++) s[r * bs] = hsum512_ps(acc[r]) - hsum256_ps(acc_m[r]);
}

void kiln_gemm4_q8_0_q8_0_avx512(int64_t n, float *s, size_t bs, const void *vx, const void *vy, size_t by) {
    const block_q8_0 *x = vx;
    const block_q8_0 *y[ROWS];
    UNROLL for (int r = 0; r < ROWS; r++) y[r] = (const block_q8_0 *)((const char *)vy + r * by);
    const int64_t nb = n / QK8_0;
    const __m512i off = _mm512_set1_epi8((char)0x80);
    __m512 acc[ROWS];
    UNROLL for (int r = 0; r < ROWS; r++) acc[r] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        const __m512i qx = join256(_mm256_loadu_si256((const __m256i *)x[i].qs), _mm256_loadu_si256((const __m256i *)x[i + 1].qs));
        const __m512i qxo = _mm512_xor_si512(qx, off);
        UNROLL for (int r = 0; r < ROWS; r++) {
            const __m512i qy = join256(_mm256_loadu_si256((const __m256i *)y[r][i].qs),
                                       _mm256_loadu_si256((const __m256i *)y[r][i + 1].qs));
            const __m512i p = _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), qxo, qy),
                                               _mm512_dpbusd_epi32(_mm512_setzero_si512(), off, qy));
            const __m512 d = pair_scales(x[i].d, y[r][i].d, x[i + 1].d, y[r][i + 1].d);
            acc[r] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(p), acc[r]);
        }
    }
    UNROLL for (int r = 0; r < ROWS; r++) {
        float sum = hsum512_ps(acc[r]);
        if (i < nb) {
            const __m256i off8 = _mm512_castsi512_si256(off);
            __m256i qx = _mm256_loadu_si256((const __m256i *)x[i].qs), qy = _mm256_loadu_si256((const __m256i *)y[r][i].qs);
            __m256i p = _mm256_sub_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_xor_si256(qx, off8), qy),
                                         _mm256_dpbusd_epi32(_mm256_setzero_si256(), off8, qy));
            sum += f16_to_f32(x[i].d) * f16_to_f32(y[r][i].d) * hsum256_ps(_mm256_cvtepi32_ps(p));
        }
        s[r * bs] = sum;
    }
}

void kiln_gemm4_q6_K_q8_K_avx512(int64_t n, float *s, size_t bs, const void *vx, const void *vy, size_t by) {
    const block_q6_K *x = vx;
    const block_q8_K *y[ROWS];
    UNROLL for (int r = 0; r < ROWS; r++) y[r] = (const block_q8_K *)((const char *)vy + r * by);
    __m512i idx[4];
    UNROLL for (int j = 0; j < 4; j++) idx[j] = _mm512_loadu_si512((const void *)scale_idx_quarters[j]);
    __m512 acc[ROWS];
    UNROLL for (int r = 0; r < ROWS; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float xd = f16_to_f32(x[i].d);
        const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x[i].scales));
        const __m512i sc = _mm512_zextsi256_si512(sc16);
        __m512i isum[ROWS];
        UNROLL for (int r = 0; r < ROWS; r++) isum[r] = _mm512_setzero_si512();
        UNROLL for (int c = 0; c < 2; c++) {
            __m512i h[2];
            q6_halves(x[i].ql + 64 * c, x[i].qh + 32 * c, &h[0], &h[1]);
            UNROLL for (int m = 0; m < 2; m++) {
                const __m512i scm = _mm512_permutexvar_epi16(idx[2 * c + m], sc);
                UNROLL for (int r = 0; r < ROWS; r++) {
                    __m512i p = _mm512_maddubs_epi16(h[m], _mm512_loadu_si512((const void *)(y[r][i].qs + 128 * c + 64 * m)));
                    isum[r] = _mm512_dpwssd_epi32(isum[r], p, scm);
                }
            }
        }
        UNROLL for (int r = 0; r < ROWS; r++) {
            const float d = xd * y[r][i].d;
            const __m256i corr = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y[r][i].bsums), sc16);
            const __m512i t = _mm512_sub_epi32(isum[r], _mm512_zextsi256_si512(_mm256_slli_epi32(corr, 5)));
            acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(t), acc[r]);
        }
    }
    UNROLL for (int r = 0; r < ROWS; r++) s[r * bs] = hsum512_ps(acc[r]);
}

/* Q4_1: per row, the single-row kernel's steps (two blocks per step, an odd last block at 256 bits); the
 * unpacked nibbles are shared. */
void kiln_gemm4_q4_1_q8_1_avx512(int64_t n, float *s, size_t bs, const void *vx, const void *vy, size_t by) {
    const block_q4_1 *x = vx;
    const block_q8_1 *y[ROWS];
    UNROLL for (int r = 0; r < ROWS; r++) y[r] = (const block_q8_1 *)((const char *)vy + r * by);
    const int64_t nb = n / QK4_1;
    const __m512i idx = _mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0);
    __m512 acc[ROWS];
    __m256 acc_m[ROWS];
    UNROLL for (int r = 0; r < ROWS; r++) acc[r] = _mm512_setzero_ps(), acc_m[r] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        const __m512i qx = join256(unpack_nibbles16(x[i].qs), unpack_nibbles16(x[i + 1].qs));
        const uint64_t xdd = (uint64_t)x[i].d | (uint64_t)x[i + 1].d << 32;
        const uint64_t xms = (uint64_t)x[i].m | (uint64_t)x[i + 1].m << 32;
        UNROLL for (int r = 0; r < ROWS; r++) {
            const __m512i qy = join256(_mm256_loadu_si256((const __m256i *)y[r][i].qs),
                                       _mm256_loadu_si256((const __m256i *)y[r][i + 1].qs));
            const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), qx, qy);
            const uint64_t dd = xdd | (uint64_t)y[r][i].d << 16 | (uint64_t)y[r][i + 1].d << 48;
            const uint64_t ms = xms | (uint64_t)y[r][i].s << 16 | (uint64_t)y[r][i + 1].s << 48;
            const __m256 f = _mm256_cvtph_ps(_mm_set_epi64x((long long)ms, (long long)dd));
            const __m256 prod = _mm256_mul_ps(f, _mm256_movehdup_ps(f));
            acc[r] = _mm512_fmadd_ps(_mm512_permutexvar_ps(idx, _mm512_castps256_ps512(prod)), _mm512_cvtepi32_ps(p), acc[r]);
            acc_m[r] = _mm256_add_ps(acc_m[r], prod);
        }
    }
    UNROLL for (int r = 0; r < ROWS; r++) {
        float sum = hsum512_ps(acc[r]), summs = 0.0f;
        if (i < nb) {
            __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), unpack_nibbles16(x[i].qs),
                                            _mm256_loadu_si256((const __m256i *)y[r][i].qs));
            sum += f16_to_f32(x[i].d) * f16_to_f32(y[r][i].d) * hsum256_ps(_mm256_cvtepi32_ps(p));
            summs += f16_to_f32(x[i].m) * f16_to_f32(y[r][i].s);
        }
        __m128 m = _mm256_extractf128_ps(acc_m[r], 1);
        s[r * bs] = sum + summs + _mm_cvtss_f32(_mm_add_ss(m, _mm_movehl_ps(m, m)));
    }
}

/* Q5_K: as Q4_K with the fifth bit from qh (the single-row kernel's ternarylogic merge), shared by the 4 rows. */
void kiln_gemm4_q5_K_q8_K_avx512(int64_t n, float *s, size_t bs, const void *vx, const void *vy, size_t by) {
    const block_q5_K *x = vx;
    const block_q8_K *y[ROWS];
    UNROLL for (int r = 0; r < ROWS; r++) y[r] = (const block_q8_K *)((const char *)vy + r * by);
    const __m512i b4 = _mm512_set1_epi8(0x10);
    __m512i idx[4];
    UNROLL for (int j = 0; j < 4; j++) idx[j] = _mm512_loadu_si512((const void *)scale_idx_halves[j]);
    __m512 acc[ROWS];
    __m256 acc_m[ROWS];
    UNROLL for (int r = 0; r < ROWS; r++) acc[r] = _mm512_setzero_ps(), acc_m[r] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float xd = f16_to_f32(x[i].d), xdmin = f16_to_f32(x[i].dmin);
        uint32_t sm[4];
        kiln_unpack_scales_k4(x[i].scales, sm);
        const __m128i m8 = _mm_loadl_epi64((const __m128i *)(sm + 2));
        const __m256i m16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));
        const __m512i sc16 = _mm512_zextsi128_si512(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)sm)));
        const __m256i qh = _mm256_loadu_si256((const __m256i *)x[i].qh);
        __m512i hz = join256(qh, _mm256_srli_epi16(qh, 1));
        __m512i isum[ROWS];
        UNROLL for (int r = 0; r < ROWS; r++) {
            const float dmin = xdmin * y[r][i].d;
            const __m256i mb = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y[r][i].bsums), m16);
            acc_m[r] = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(mb), acc_m[r]);
            isum[r] = _mm512_setzero_si512();
        }
        UNROLL for (int j = 0; j < 4; j++) {
            const __m512i z = _mm512_ternarylogic_epi32(unpack_nibbles32(x[i].qs + 32 * j), _mm512_slli_epi16(hz, 4), b4, 0xF8);
            hz = _mm512_srli_epi16(hz, 2);
            const __m512i sc = _mm512_permutexvar_epi16(idx[j], sc16);
            UNROLL for (int r = 0; r < ROWS; r++) {
                __m512i p = _mm512_maddubs_epi16(z, _mm512_loadu_si512((const void *)(y[r][i].qs + 64 * j)));
                isum[r] = _mm512_dpwssd_epi32(isum[r], p, sc);
            }
        }
        UNROLL for (int r = 0; r < ROWS; r++) {
            const float d = xd * y[r][i].d;
            acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(isum[r]), acc[r]);
        }
    }
    UNROLL for (int r = 0; r < ROWS; r++) s[r * bs] = hsum512_ps(acc[r]) - hsum256_ps(acc_m[r]);
}

#endif /* __x86_64__ */
