/* ops_dense.h: the register-tiled micro-kernels of the dense matmul (ops_dense.c), one per SIMD level, in
 * ops_dense_avx2.c and ops_dense_avx512.c. Not part of the library's API. tests/test_dense.c checks every level
 * against a double reference through kiln_cpu_dense_forward / kiln_cpu_dense_backward.
 *
 * A kernel computes one MR x NR tile of C from packed panels over kc steps of the reduction:
 *   acc[r][j] = sum_k a[k * MR + r] * b[k * NR + j], k = 0..kc-1 in order, one fused multiply-add a step,
 * then stores c[r * ldc + j] = acc (add false) or c[r * ldc + j] + acc (add true) for r < m, j < n only. The
 * panels are full MR and NR wide (ops_dense.c pads them with zeros), so which tile an element falls in never
 * changes its value: that is what makes the result independent of the thread count and of the cache blocking. */
#ifndef KILN_CPU_OPS_DENSE_H
#define KILN_CPU_OPS_DENSE_H

#include <stdbool.h>
#include <stdint.h>

typedef void (*kiln_dense_kernel_fn)(int64_t kc, const float *a, const float *b, float *c, int64_t ldc, int m, int n,
                                     bool add);

/* Packing n lines of a source (F32, or BF16 widened exactly) over kc steps into ceil(n / width) panels of width
 * lines (MR or NR), panel q at dst + q * width * kc, zero past line n:
 *   copy:      panel q (k, i) at k * width + i = src[k * stride + q * width + i]  (lines run along source rows)
 *   transpose: panel q (k, i) at k * width + i = src[(q * width + i) * stride + k]  (a line is a source row) */
typedef void (*kiln_dense_pack_fn)(float *dst, int width, const void *src, bool bf16, int64_t stride, int64_t n,
                                   int64_t kc);

/* AVX2 + FMA: 6 x 16, 12 ymm accumulators. b is 32-byte aligned. */
#define KILN_DENSE_MR_AVX2 6
#define KILN_DENSE_NR_AVX2 16
void kiln_dense_kernel_avx2(int64_t kc, const float *a, const float *b, float *c, int64_t ldc, int m, int n, bool add);
void kiln_dense_copy_avx2(float *dst, int width, const void *src, bool bf16, int64_t stride, int64_t n, int64_t kc);
void kiln_dense_transpose_avx2(float *dst, int width, const void *src, bool bf16, int64_t stride, int64_t n, int64_t kc);

/* AVX-512: 12 x 32, 24 zmm accumulators. b is 64-byte aligned. */
#define KILN_DENSE_MR_AVX512 12
#define KILN_DENSE_NR_AVX512 32
void kiln_dense_kernel_avx512(int64_t kc, const float *a, const float *b, float *c, int64_t ldc, int m, int n, bool add);
void kiln_dense_copy_avx512(float *dst, int width, const void *src, bool bf16, int64_t stride, int64_t n, int64_t kc);
void kiln_dense_transpose_avx512(float *dst, int width, const void *src, bool bf16, int64_t stride, int64_t n, int64_t kc);

#endif
