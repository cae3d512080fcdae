/* ops_dense_avx2.c: the dense matmul's AVX2 + FMA micro-kernel (contract in ops_dense.h): a 6 x 16 tile of C in
 * 12 ymm accumulators, with the two B vectors and a broadcast that makes 15 of the 16 registers. Each reduction
 * step is 8 loads for 12 FMAs; measured 71-83 GFLOP/s a core in the whole matmul, against an AVX2 FMA peak of
 * ~84. The packing routines that feed it (contract in ops_dense.h) are here too. tests/test_dense.c checks both
 * against a double reference through ops_dense.c, and that they give the AVX-512 level's bits. */
#if defined(__x86_64__)

#include "ops_internal.h"

#include "cpu/ops_dense.h"

#include <immintrin.h>
#include <string.h>

/* The accumulator array only lives in registers if the loops over it are unrolled; GCC -O2 needs telling. */
#define UNROLL _Pragma("GCC unroll 16")

#define MR KILN_DENSE_MR_AVX2
#define NR KILN_DENSE_NR_AVX2

void kiln_dense_kernel_avx2(int64_t kc, const float *a, const float *b, float *c, int64_t ldc, int m, int n, bool add) {
    __m256 acc[MR][2];
    UNROLL for (int r = 0; r < MR; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int64_t k = 0; k < kc; k++, a += MR, b += NR) {
        const __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8);
        UNROLL for (int r = 0; r < MR; r++) {
            const __m256 ar = _mm256_broadcast_ss(a + r);
            acc[r][0] = _mm256_fmadd_ps(ar, b0, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(ar, b1, acc[r][1]);
        }
    }
    /* Lane j of the two halves is stored when j < n. */
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i k0 = _mm256_cmpgt_epi32(_mm256_set1_epi32(n), lane);
    const __m256i k1 = _mm256_cmpgt_epi32(_mm256_set1_epi32(n - 8), lane);
    UNROLL for (int r = 0; r < MR; r++) {
        if (r >= m) break;
        float *cr = c + r * ldc;
        if (add) {
            acc[r][0] = _mm256_add_ps(_mm256_maskload_ps(cr, k0), acc[r][0]);
            acc[r][1] = _mm256_add_ps(_mm256_maskload_ps(cr + 8, k1), acc[r][1]);
        }
        _mm256_maskstore_ps(cr, k0, acc[r][0]);
        _mm256_maskstore_ps(cr + 8, k1, acc[r][1]);
    }
}

/* ---------------------------------------------------------------- packing */

static inline __m256 load8(const void *src, bool bf16, int64_t i) {
    if (bf16) /* bf16 is the high half of an f32: widening is a 16-bit shift, exact */
        return _mm256_castsi256_ps(
            _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)src + i))), 16));
    return _mm256_loadu_ps((const float *)src + i);
}

static inline float load1(const void *src, bool bf16, int64_t i) {
    if (bf16) {
        const uint32_t u = (uint32_t)((const uint16_t *)src)[i] << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    return ((const float *)src)[i];
}

/* width <= 16. Panel by panel (writing the packed panel front to back); full 8-lane halves move as vectors, a
 * ragged edge element by element. */
void kiln_dense_copy_avx2(float *dst, int width, const void *src, bool bf16, int64_t stride, int64_t n, int64_t kc) {
    for (int64_t l0 = 0; l0 < n; l0 += width) { /* a panel: lines l0 .. l0 + width */
        const int valid = (int)(n - l0 < width ? n - l0 : width);
        for (int64_t k = 0; k < kc; k++, dst += width) {
            const int64_t s = k * stride + l0;
            int i = 0;
            for (; i + 8 <= valid; i += 8) _mm256_storeu_ps(dst + i, load8(src, bf16, s + i));
            for (; i < valid; i++) dst[i] = load1(src, bf16, s + i);
            for (; i < width; i++) dst[i] = 0.0f;
        }
    }
}

/* Four lines at a time, 8 steps of each in one ymm: a 4 x 4 transpose inside each 128-bit lane leaves (step
 * 4l + j, lines 0..3) in lane l of vector j. A last group of 2 lines (width 6) stores 8 bytes a step. */
void kiln_dense_transpose_avx2(float *dst, int width, const void *src, bool bf16, int64_t stride, int64_t n, int64_t kc) {
    const int64_t esize = bf16 ? 2 : 4;
    for (int64_t l0 = 0; l0 < n; l0 += width, dst += width * kc) /* a panel: lines l0 .. l0 + width */
        for (int g = 0; g < width; g += 4) {
            const int64_t l = l0 + g;                     /* this group's first line */
            const int wg = width - g < 4 ? width - g : 4; /* 4, or 2 for the last group of width 6 */
            int64_t k = 0;
            for (; k + 8 <= kc; k += 8) {
                /* A line is only kc long, too short for the hardware prefetcher to lock on: fetch the next group's
                 * lines in step with these. Prefetches never fault. */
                UNROLL for (int i = 0; i < 4; i++) _mm_prefetch((const char *)src + ((l + wg + i) * stride + k) * esize, _MM_HINT_T0);
                __m256 v[4];
                UNROLL for (int i = 0; i < 4; i++) v[i] = i < wg && l + i < n ? load8(src, bf16, (l + i) * stride + k) : _mm256_setzero_ps();
                const __m256d t0 = _mm256_castps_pd(_mm256_unpacklo_ps(v[0], v[1])); /* a0 b0 a1 b1 */
                const __m256d t1 = _mm256_castps_pd(_mm256_unpackhi_ps(v[0], v[1])); /* a2 b2 a3 b3 */
                const __m256d t2 = _mm256_castps_pd(_mm256_unpacklo_ps(v[2], v[3])); /* c0 d0 c1 d1 */
                const __m256d t3 = _mm256_castps_pd(_mm256_unpackhi_ps(v[2], v[3])); /* c2 d2 c3 d3 */
                const __m256 o[4] = {_mm256_castpd_ps(_mm256_unpacklo_pd(t0, t2)), _mm256_castpd_ps(_mm256_unpackhi_pd(t0, t2)),
                                     _mm256_castpd_ps(_mm256_unpacklo_pd(t1, t3)), _mm256_castpd_ps(_mm256_unpackhi_pd(t1, t3))};
                float *d = dst + k * width + g;
                UNROLL for (int j = 0; j < 4; j++) {
                    const __m128 lo = _mm256_castps256_ps128(o[j]), hi = _mm256_extractf128_ps(o[j], 1);
                    if (wg == 4) {
                        _mm_storeu_ps(d + j * width, lo);
                        _mm_storeu_ps(d + (4 + j) * width, hi);
                    } else {
                        _mm_storel_pi((__m64 *)(d + j * width), lo);
                        _mm_storel_pi((__m64 *)(d + (4 + j) * width), hi);
                    }
                }
            }
            for (; k < kc; k++)
                for (int i = 0; i < wg; i++) dst[k * width + g + i] = l + i < n ? load1(src, bf16, (l + i) * stride + k) : 0.0f;
        }
}

#endif
