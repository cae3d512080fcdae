/* cuda_host_ref.c: the C half of tests/test_cuda_host.sh: random blocks of a type (test_blocks.h, with the scales of
 * the issue-18 types fixed by test_blocks_ggml.h) and their reference dequantization (the scalar CPU reference, or
 * test_blocks_ggml.h's GGML dequantizer for the types the CPU lacks), for cuda_host.cpp, which is C++. */
#include "test.h"
#include "test_blocks.h"
#include "test_blocks_ggml.h"

void host_ref_blocks(kiln_type t, uint8_t *buf, int64_t n, unsigned long long *seed) {
    test_random_blocks(t, buf, n, 1.0f, 0.0f, seed);
    test_ggml_fix_scales(t, buf, n, 0.01f, 0.0f, seed);
}

void host_ref_to_float(kiln_type t, const void *x, float *y, int64_t n) { test_ggml_to_float(t, x, y, n); }

unsigned long long host_ref_rng(unsigned long long *seed) { return test_rng_next(seed); }
float host_ref_f32(unsigned long long *seed) { return test_rng_f32(seed); }
