/* ops_attention_avx2.c: attention's chunk kernels (contract in ops_internal.h) with AVX2 + FMA + F16C, for HS a
 * multiple of 8: over f16 rows (the f16 cache) and over float rows (the other cache types, converted a piece at a
 * time, or an f32 cache in place); one code for both, specialized by a constant flag. Up to four heads of a KV
 * group go together, so each k and v row is converted once for all of them; two keys at a time give eight independent FMA chains. exp is a Cephes-style polynomial
 * (within 2 ulp of expf on the softmax range x <= 0). tests/test_ops.c checks it against a double reference
 * and the scalar kernel in ops_attention.c. */
#if defined(__x86_64__)

#include "ops_internal.h"

#include <immintrin.h>
#include "cpu/simd_avx2.h"
#include <math.h>

/* UNROLL, hsum_ps and exp_ps come from simd_avx2.h. */
#define INLINE static inline __attribute__((always_inline))

INLINE __m256 load_f16(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

/* Elements i..i+7 of rows that are f16 (F32 false) or float (F32 true). */
INLINE __m256 load8(const void *p, int64_t i, const bool F32) {
    return F32 ? _mm256_loadu_ps((const float *)p + i) : load_f16((const uint16_t *)p + i);
}
INLINE const void *row_at(const void *p, int64_t i, const bool F32) {
    return F32 ? (const void *)((const float *)p + i) : (const void *)((const uint16_t *)p + i);
}

INLINE float hmax_ps(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* exp_ps: simd_avx2.h */

/* A head's slice of a cache row is HS halves among NKV * HS: the hardware prefetchers do not follow that stride
 * (measured: the loads stalled 40% of the kernel's time), so rows are prefetched by hand. */
#define PREFETCH_AHEAD 8 /* keys */
INLINE void prefetch_row(const void *row, int64_t HS, int hint, const bool F32) {
    for (int64_t b = 0; b < HS * (F32 ? 4 : 2); b += 64) {
        if (hint == 0)
            _mm_prefetch((const char *)row + b, _MM_HINT_T0);
        else
            _mm_prefetch((const char *)row + b, _MM_HINT_T1);
    }
}

/* Scores of NH heads (q rows HS apart) against nk keys, two keys at a time (an odd last key is paired with itself).
 * K rows are prefetched to L1 a few keys ahead; the chunk's V rows to L2, for weighted_sum. */
INLINE void scores(float *s, int64_t nk, const float *q, const int NH, const void *k, const void *v, int64_t ks,
                   int64_t vs, int64_t HS, float scale, const bool F32) {
    for (int64_t j = 0; j < nk; j += 2) {
        const void *k0 = row_at(k, j * ks, F32), *k1 = j + 1 < nk ? row_at(k0, ks, F32) : k0;
        for (int64_t i = j + PREFETCH_AHEAD; i < j + PREFETCH_AHEAD + 2 && i < nk; i++) prefetch_row(row_at(k, i * ks, F32), HS, 0, F32);
        for (int64_t i = j; i < j + 2 && i < nk; i++) prefetch_row(row_at(v, i * vs, F32), HS, 1, F32);
        __m256 a0[4], a1[4];
        UNROLL for (int h = 0; h < NH; h++) a0[h] = a1[h] = _mm256_setzero_ps();
        for (int64_t d = 0; d < HS; d += 8) {
            const __m256 x0 = load8(k0, d, F32), x1 = load8(k1, d, F32);
            UNROLL for (int h = 0; h < NH; h++) {
                const __m256 qv = _mm256_loadu_ps(q + h * HS + d);
                a0[h] = _mm256_fmadd_ps(qv, x0, a0[h]);
                a1[h] = _mm256_fmadd_ps(qv, x1, a1[h]);
            }
        }
        UNROLL for (int h = 0; h < NH; h++) {
            s[h * nk + j] = hsum_ps(a0[h]) * scale;
            if (j + 1 < nk) s[h * nk + j + 1] = hsum_ps(a1[h]) * scale;
        }
    }
}

/* a (NH, HS) = sum_j s[h][j] v_j: 16 columns of every head in registers across all nk rows. */
INLINE void weighted_sum(float *a, const float *s, int64_t nk, const int NH, const void *v, int64_t kv_stride,
                         int64_t HS, const bool F32) {
    int64_t d = 0;
    for (; d + 16 <= HS; d += 16) {
        __m256 r0[4], r1[4];
        UNROLL for (int h = 0; h < NH; h++) r0[h] = r1[h] = _mm256_setzero_ps();
        for (int64_t j = 0; j < nk; j++) {
            const __m256 x0 = load8(v, j * kv_stride + d, F32), x1 = load8(v, j * kv_stride + d + 8, F32);
            UNROLL for (int h = 0; h < NH; h++) {
                const __m256 p = _mm256_broadcast_ss(s + h * nk + j);
                r0[h] = _mm256_fmadd_ps(p, x0, r0[h]);
                r1[h] = _mm256_fmadd_ps(p, x1, r1[h]);
            }
        }
        UNROLL for (int h = 0; h < NH; h++) {
            _mm256_storeu_ps(a + h * HS + d, r0[h]);
            _mm256_storeu_ps(a + h * HS + d + 8, r1[h]);
        }
    }
    if (d < HS) { /* HS % 16 == 8 */
        __m256 r0[4];
        UNROLL for (int h = 0; h < NH; h++) r0[h] = _mm256_setzero_ps();
        for (int64_t j = 0; j < nk; j++) {
            const __m256 x0 = load8(v, j * kv_stride + d, F32);
            UNROLL for (int h = 0; h < NH; h++) r0[h] = _mm256_fmadd_ps(_mm256_broadcast_ss(s + h * nk + j), x0, r0[h]);
        }
        UNROLL for (int h = 0; h < NH; h++) _mm256_storeu_ps(a + h * HS + d, r0[h]);
    }
}

/* Row max, then exp(s - max) in place and its sum; a tail of fewer than 8 goes through a masked vector so every
 * element gets the same exp. */
static void softmax_partial(float *s, int64_t nk, float *m, float *l) {
    __m256 vmax = _mm256_set1_ps(-INFINITY);
    int64_t j = 0;
    for (; j + 8 <= nk; j += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(s + j));
    float max = hmax_ps(vmax);
    for (; j < nk; j++) max = s[j] > max ? s[j] : max;
    const __m256 mv = _mm256_set1_ps(max);
    __m256 sum = _mm256_setzero_ps();
    for (j = 0; j + 8 <= nk; j += 8) {
        const __m256 e = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(s + j), mv));
        _mm256_storeu_ps(s + j, e);
        sum = _mm256_add_ps(sum, e);
    }
    if (j < nk) {
        const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(nk - j)), lane);
        const __m256 e = _mm256_and_ps(exp_ps(_mm256_sub_ps(_mm256_maskload_ps(s + j, mask), mv)), _mm256_castsi256_ps(mask));
        _mm256_maskstore_ps(s + j, mask, e);
        sum = _mm256_add_ps(sum, e);
    }
    *m = max;
    *l = hsum_ps(sum);
}

/* The kernel for NH (1..4) heads, specialized by constant NH after inlining. */
INLINE void chunk_heads(float *a, float *m, float *l, float *s, const float *q, const void *k, const void *v,
                        int64_t ks, int64_t vs, int64_t nk, int64_t HS, const int NH, float scale, float cap, const bool F32) {
    scores(s, nk, q, NH, k, v, ks, vs, HS, scale, F32);
    if (cap > 0) kiln_attn_softcap(s, NH * nk, cap); /* a pass of its own: the plain path's loops stay as they were */
    for (int h = 0; h < NH; h++) softmax_partial(s + h * nk, nk, &m[h], &l[h]);
    weighted_sum(a, s, nk, NH, v, vs, HS, F32);
}

/* Groups of up to four heads. */
INLINE void chunk_groups(float *a, float *m, float *l, float *s, const float *q, const void *k, const void *v, int64_t ks,
                         int64_t vs, int64_t nk, int64_t HS, int64_t G, float scale, float cap, const bool F32) {
    for (int64_t h0 = 0; h0 < G; h0 += 4) {
        float *ah = a + h0 * HS, *mh = m + h0, *lh = l + h0, *sh = s + h0 * nk;
        const float *qh = q + h0 * HS;
        switch (G - h0 < 4 ? G - h0 : 4) {
        case 1: chunk_heads(ah, mh, lh, sh, qh, k, v, ks, vs, nk, HS, 1, scale, cap, F32); break;
        case 2: chunk_heads(ah, mh, lh, sh, qh, k, v, ks, vs, nk, HS, 2, scale, cap, F32); break;
        case 3: chunk_heads(ah, mh, lh, sh, qh, k, v, ks, vs, nk, HS, 3, scale, cap, F32); break;
        default: chunk_heads(ah, mh, lh, sh, qh, k, v, ks, vs, nk, HS, 4, scale, cap, F32); break;
        }
    }
}

void kiln_attn_chunk_avx2(float *a, float *m, float *l, float *s, const float *q, const uint16_t *k, const uint16_t *v,
                          int64_t kv_stride, int64_t nk, int64_t HS, int64_t G, float scale, float cap) {
    chunk_groups(a, m, l, s, q, k, v, kv_stride, kv_stride, nk, HS, G, scale, cap, false);
}

void kiln_attn_chunk_f32_avx2(float *a, float *m, float *l, float *s, const float *q, const float *k, const float *v,
                              int64_t k_stride, int64_t v_stride, int64_t nk, int64_t HS, int64_t G, float scale, float cap) {
    chunk_groups(a, m, l, s, q, k, v, k_stride, v_stride, nk, HS, G, scale, cap, true);
}

#endif
