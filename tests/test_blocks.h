/* test_blocks.h: random GGUF block-format data for the tests of code that reads weights (the CUDA kernels' tests).
 * Every payload byte is random, so every quant and sub-block scale bit pattern appears; every f16 scale field is
 * then set to a finite half, d = 0.01 u + d_offset and m = 0.01 u (u uniform in [-1, 1)), where the block has one;
 * float types get finite values uniform in [-range, range). */
#ifndef KILN_TEST_BLOCKS_H
#define KILN_TEST_BLOCKS_H

#include "quants.h"
#include "test.h"

/* buf holds n elements of type t (a whole number of blocks). */
static inline void test_random_blocks(kiln_type t, uint8_t *buf, int64_t n, float range, float d_offset, unsigned long long *seed) {
    const int64_t nb = n / kiln_type_block_size(t);
    const size_t bs = kiln_type_block_bytes(t);
    for (size_t i = 0; i < bs * (size_t)nb; i++) buf[i] = (uint8_t)test_rng_next(seed);
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *p = buf + (size_t)b * bs;
        const float v = test_rng_f32(seed) * range;
        const kiln_fp16 d = kiln_f32_to_fp16(test_rng_f32(seed) * 0.01f + d_offset), m = kiln_f32_to_fp16(test_rng_f32(seed) * 0.01f);
        switch (t) {
        case KILN_TYPE_F32: memcpy(p, &v, 4); break;
        case KILN_TYPE_F16: memcpy(p, &(kiln_fp16){kiln_f32_to_fp16(v)}, 2); break;
        case KILN_TYPE_BF16: memcpy(p, &(kiln_bf16){kiln_f32_to_bf16(v)}, 2); break;
        case KILN_TYPE_Q4_0:
        case KILN_TYPE_Q5_0:
        case KILN_TYPE_Q8_0: memcpy(p, &d, 2); break;
        case KILN_TYPE_Q4_1:
        case KILN_TYPE_Q4_K:
        case KILN_TYPE_Q5_K: memcpy(p, &d, 2), memcpy(p + 2, &m, 2); break;
        case KILN_TYPE_Q6_K: memcpy(p + bs - 2, &d, 2); break;
        default: break;
        }
    }
}

#endif
