/* ops_attention_avx2.c: the two inner loops of ops_attention.c with AVX2 + FMA + F16C: scores (q . k_j for
 * every cached position) and the p-weighted sum of v rows. f16 values convert exactly (vcvtph2ps); only the
 * order of the float sums differs from the scalar loops, which tests/test_ops.c runs as the oracle. */
#if defined(__x86_64__)

#include "ops_internal.h"

#include <immintrin.h>

/* The register arrays below only stay in registers if their loops are unrolled; GCC -O2 needs telling. */
#define UNROLL _Pragma("GCC unroll 8")

static inline __m256 load_f16(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

static inline float hsum_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* One key: two accumulators over HS, the tail (HS not a multiple of 8) in scalar. */
static inline float dot_one(const float *q, const uint16_t *k, int64_t HS) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t d = 0;
    for (; d + 16 <= HS; d += 16) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), load_f16(k + d), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d + 8), load_f16(k + d + 8), a1);
    }
    for (; d + 8 <= HS; d += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), load_f16(k + d), a0);
    float sum = hsum_ps(_mm256_add_ps(a0, a1));
    for (; d < HS; d++) sum += q[d] * _cvtsh_ss(k[d]);
    return sum;
}

void kiln_attn_scores_avx2(float *s, const float *q, const uint16_t *k, int64_t kstride, int64_t n, int64_t HS, float scale) {
    int64_t j = 0;
    if (HS % 8 == 0) {
        /* Four keys at a time: four independent FMA chains share each load of q. */
        for (; j + 4 <= n; j += 4) {
            const uint16_t *k0 = k + j * kstride, *k1 = k0 + kstride, *k2 = k1 + kstride, *k3 = k2 + kstride;
            __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
            for (int64_t d = 0; d < HS; d += 8) {
                const __m256 qd = _mm256_loadu_ps(q + d);
                a0 = _mm256_fmadd_ps(qd, load_f16(k0 + d), a0);
                a1 = _mm256_fmadd_ps(qd, load_f16(k1 + d), a1);
                a2 = _mm256_fmadd_ps(qd, load_f16(k2 + d), a2);
                a3 = _mm256_fmadd_ps(qd, load_f16(k3 + d), a3);
            }
            /* Horizontal sums of the four at once: lanes 0..3 of r are the four dots. */
            const __m256 h01 = _mm256_hadd_ps(a0, a1), h23 = _mm256_hadd_ps(a2, a3), h = _mm256_hadd_ps(h01, h23);
            const __m128 r = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
            _mm_storeu_ps(s + j, _mm_mul_ps(r, _mm_set1_ps(scale)));
        }
    }
    for (; j < n; j++) s[j] = dot_one(q, k + j * kstride, HS) * scale;
}

void kiln_attn_accum_avx2(float *acc, const float *p, const uint16_t *v, int64_t vstride, int64_t n, int64_t HS) {
    int64_t d = 0;
    /* 64 columns at a time held in eight registers across all n rows. */
    for (; d + 64 <= HS; d += 64) {
        __m256 r[8];
        UNROLL for (int m = 0; m < 8; m++) r[m] = _mm256_loadu_ps(acc + d + 8 * m);
        for (int64_t j = 0; j < n; j++) {
            const __m256 pj = _mm256_broadcast_ss(p + j);
            const uint16_t *vj = v + j * vstride + d;
            UNROLL for (int m = 0; m < 8; m++) r[m] = _mm256_fmadd_ps(pj, load_f16(vj + 8 * m), r[m]);
        }
        UNROLL for (int m = 0; m < 8; m++) _mm256_storeu_ps(acc + d + 8 * m, r[m]);
    }
    for (; d + 8 <= HS; d += 8) {
        __m256 r = _mm256_loadu_ps(acc + d);
        for (int64_t j = 0; j < n; j++) r = _mm256_fmadd_ps(_mm256_broadcast_ss(p + j), load_f16(v + j * vstride + d), r);
        _mm256_storeu_ps(acc + d, r);
    }
    for (; d < HS; d++) {
        float a = acc[d];
        for (int64_t j = 0; j < n; j++) a += p[j] * _cvtsh_ss(v[j * vstride + d]);
        acc[d] = a;
    }
}

#endif
