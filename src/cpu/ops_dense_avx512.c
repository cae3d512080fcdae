/* ops_dense_avx512.c: the dense matmul's AVX-512 micro-kernel (contract in ops_dense.h): a 12 x 32 tile of C in
 * 24 zmm accumulators. Each reduction step loads two vectors of the B panel and broadcasts 12 values of the A
 * panel, 14 loads for 24 FMAs, so the two FMA ports, not the loads, set the pace: with its panels in L1 it runs
 * at the FMA peak (measured 167 GFLOP/s a core, as 14 x 32, 8 x 48 and 6 x 64 tiles did). The packing routines
 * that feed it (contract in ops_dense.h) are here too. tests/test_dense.c checks both against a double reference
 * through ops_dense.c. */
#if defined(__x86_64__)

#include "ops_internal.h"

#include "cpu/ops_dense.h"

#include <immintrin.h>
#include <string.h>

/* The accumulator array only lives in registers if the loops over it are unrolled; GCC -O2 needs telling. */
#define UNROLL _Pragma("GCC unroll 16")

#define MR KILN_DENSE_MR_AVX512
#define NR KILN_DENSE_NR_AVX512

void kiln_dense_kernel_avx512(int64_t kc, const float *a, const float *b, float *c, int64_t ldc, int m, int n, bool add) {
    __m512 acc[MR][2];
    UNROLL for (int r = 0; r < MR; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    /* C's tile is usually out of cache (C is MBs): fetch its 24 lines while the tile is computed, not after
     * (1-4% at two threads, nothing measurable at one). */
    UNROLL for (int r = 0; r < MR; r++) {
        if (r >= m) break;
        _mm_prefetch((const char *)(c + r * ldc), _MM_HINT_T0);
        _mm_prefetch((const char *)(c + r * ldc + 16), _MM_HINT_T0);
    }
    for (int64_t k = 0; k < kc; k++, a += MR, b += NR) {
        const __m512 b0 = _mm512_load_ps(b), b1 = _mm512_load_ps(b + 16);
        UNROLL for (int r = 0; r < MR; r++) {
            const __m512 ar = _mm512_set1_ps(a[r]);
            acc[r][0] = _mm512_fmadd_ps(ar, b0, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(ar, b1, acc[r][1]);
        }
    }
    const __mmask16 m0 = n >= 16 ? 0xffff : (__mmask16)((1u << n) - 1);
    const __mmask16 m1 = n >= 32 ? 0xffff : n > 16 ? (__mmask16)((1u << (n - 16)) - 1) : 0;
    UNROLL for (int r = 0; r < MR; r++) {
        if (r >= m) break;
        float *cr = c + r * ldc;
        if (add) {
            acc[r][0] = _mm512_add_ps(_mm512_maskz_loadu_ps(m0, cr), acc[r][0]);
            acc[r][1] = _mm512_add_ps(_mm512_maskz_loadu_ps(m1, cr + 16), acc[r][1]);
        }
        _mm512_mask_storeu_ps(cr, m0, acc[r][0]);
        _mm512_mask_storeu_ps(cr + 16, m1, acc[r][1]);
    }
}

/* ---------------------------------------------------------------- packing */

static inline __m512 load16(const void *src, bool bf16, int64_t i) {
    if (bf16) /* bf16 is the high half of an f32: widening is a 16-bit shift, exact */
        return _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)src + i))), 16));
    return _mm512_loadu_ps((const float *)src + i);
}

static inline __m512 maskz_load16(__mmask16 m, const void *src, bool bf16, int64_t i) {
    if (bf16)
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, (const uint16_t *)src + i)), 16));
    return _mm512_maskz_loadu_ps(m, (const float *)src + i);
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

static inline __mmask16 first_lanes(int n) { return n >= 16 ? (__mmask16)0xffff : n <= 0 ? 0 : (__mmask16)((1u << n) - 1); }

/* width <= 32. Panel by panel (writing the packed panel front to back: spreading the writes over all panels
 * a step at a time ran 2.5x slower), each step two masked loads of the valid lanes (the rest read as zero) and
 * two masked stores. */
void kiln_dense_copy_avx512(float *dst, int width, const void *src, bool bf16, int64_t stride, int64_t n, int64_t kc) {
    const __mmask16 s0 = first_lanes(width), s1 = first_lanes(width - 16);
    for (int64_t l0 = 0; l0 < n; l0 += width) { /* a panel: lines l0 .. l0 + width */
        const int valid = (int)(n - l0 < width ? n - l0 : width);
        const __mmask16 v0 = first_lanes(valid), v1 = first_lanes(valid - 16);
        for (int64_t k = 0; k < kc; k++, dst += width) {
            _mm512_mask_storeu_ps(dst, s0, maskz_load16(v0, src, bf16, k * stride + l0));
            if (s1) _mm512_mask_storeu_ps(dst + 16, s1, maskz_load16(v1, src, bf16, k * stride + l0 + 16));
        }
    }
}

/* width a multiple of 4. Four lines at a time, 16 steps of each in one zmm: a 4 x 4 transpose inside every
 * 128-bit lane (8 shuffles) leaves (step 4l + j, lines 0..3) in lane l of vector j, stored as 16 bytes. */
void kiln_dense_transpose_avx512(float *dst, int width, const void *src, bool bf16, int64_t stride, int64_t n, int64_t kc) {
    const int64_t esize = bf16 ? 2 : 4;
    for (int64_t l0 = 0; l0 < n; l0 += width, dst += width * kc) /* a panel: lines l0 .. l0 + width */
        for (int g = 0; g < width; g += 4) {
            const int64_t l = l0 + g; /* this group's first line */
            int64_t k = 0;
            for (; k + 16 <= kc; k += 16) {
                /* A line is only kc long, too short for the hardware prefetcher to lock on: fetch the next four
                 * lines (the next group's) in step with these. Prefetches never fault. */
                UNROLL for (int i = 0; i < 4; i++) _mm_prefetch((const char *)src + ((l + 4 + i) * stride + k) * esize, _MM_HINT_T0);
                __m512 v[4];
                UNROLL for (int i = 0; i < 4; i++) v[i] = l + i < n ? load16(src, bf16, (l + i) * stride + k) : _mm512_setzero_ps();
                const __m512d t0 = _mm512_castps_pd(_mm512_unpacklo_ps(v[0], v[1])); /* a0 b0 a1 b1 */
                const __m512d t1 = _mm512_castps_pd(_mm512_unpackhi_ps(v[0], v[1])); /* a2 b2 a3 b3 */
                const __m512d t2 = _mm512_castps_pd(_mm512_unpacklo_ps(v[2], v[3])); /* c0 d0 c1 d1 */
                const __m512d t3 = _mm512_castps_pd(_mm512_unpackhi_ps(v[2], v[3])); /* c2 d2 c3 d3 */
                const __m512 o[4] = {_mm512_castpd_ps(_mm512_unpacklo_pd(t0, t2)), _mm512_castpd_ps(_mm512_unpackhi_pd(t0, t2)),
                                     _mm512_castpd_ps(_mm512_unpacklo_pd(t1, t3)), _mm512_castpd_ps(_mm512_unpackhi_pd(t1, t3))};
                float *d = dst + k * width + g;
                UNROLL for (int j = 0; j < 4; j++) {
                    _mm_storeu_ps(d + (0 + j) * width, _mm512_castps512_ps128(o[j]));
                    _mm_storeu_ps(d + (4 + j) * width, _mm512_extractf32x4_ps(o[j], 1));
                    _mm_storeu_ps(d + (8 + j) * width, _mm512_extractf32x4_ps(o[j], 2));
                    _mm_storeu_ps(d + (12 + j) * width, _mm512_extractf32x4_ps(o[j], 3));
                }
            }
            for (; k < kc; k++)
                for (int i = 0; i < 4; i++) dst[k * width + g + i] = l + i < n ? load1(src, bf16, (l + i) * stride + k) : 0.0f;
        }
}

#endif
