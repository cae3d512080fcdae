/* test_blocks_ggml.h: an independent host dequantizer of the block formats issue 18 added (Q5_1, Q2_K, Q3_K,
 * IQ4_NL, IQ4_XS), written from GGML's dequantize_row_* layouts with its float operations in its order, so its
 * values are the CPU reference's bit for bit. It is the CUDA tests' oracle for these types (the GPU kernels were
 * written against the layouts separately, src/cuda/blocks.cuh); tests/ref/check_blocks_ggml.py checked it
 * against the gguf package's dequantize on random blocks (equal bit for bit on 4096 blocks of each type).
 * test_ggml_random_blocks fills such blocks: random bytes with every f16 scale set finite. */
#ifndef KILN_TEST_BLOCKS_GGML_H
#define KILN_TEST_BLOCKS_GGML_H

#include "fp16.h"
#include "quants.h"
#include "test.h"

#include <stdbool.h>
#include <string.h>

static inline bool test_ggml_is_new(kiln_type t) {
    return t == KILN_TYPE_Q5_1 || t == KILN_TYPE_Q2_K || t == KILN_TYPE_Q3_K || t == KILN_TYPE_IQ4_NL || t == KILN_TYPE_IQ4_XS;
}

static inline float test_ggml_h(kiln_fp16 h) { return kiln_fp16_to_f32(h); }

static inline void test_ggml_q5_1(const block_q5_1 *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += 32) {
        uint32_t qh;
        memcpy(&qh, x[i].qh, 4);
        const float d = test_ggml_h(x[i].d), m = test_ggml_h(x[i].m);
        for (int j = 0; j < 16; j++) {
            const int x0 = (x[i].qs[j] & 0x0F) | (int)(((qh >> j) << 4) & 0x10);
            const int x1 = (x[i].qs[j] >> 4) | (int)((qh >> (j + 12)) & 0x10);
            y[j] = (float)x0 * d + m;
            y[j + 16] = (float)x1 * d + m;
        }
    }
}

static inline void test_ggml_iq4_nl(const block_iq4_nl *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += 32) {
        const float d = test_ggml_h(x[i].d);
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)kiln_iq4nl_values[x[i].qs[j] & 0xF];
            y[j + 16] = d * (float)kiln_iq4nl_values[x[i].qs[j] >> 4];
        }
    }
}

static inline void test_ggml_q2_K(const block_q2_K *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const float d = test_ggml_h(x[i].d), dmin = test_ggml_h(x[i].dmin);
        const uint8_t *q = x[i].qs;
        int is = 0;
        for (int n = 0; n < QK_K; n += 128, q += 32)
            for (int shift = 0; shift < 8; shift += 2)
                for (int half = 0; half < 2; half++) {
                    const uint8_t sc = x[i].scales[is++];
                    const float dl = d * (float)(sc & 0xF), ml = dmin * (float)(sc >> 4);
                    for (int l = 0; l < 16; l++) *y++ = dl * (float)((q[l + 16 * half] >> shift) & 3) - ml;
                }
    }
}

static inline void test_ggml_q3_K(const block_q3_K *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const float d = test_ggml_h(x[i].d);
        int8_t sc[16]; /* the 6-bit scales minus 32: low 4 bits in bytes 0..7 (low nibbles first), high 2 in 8..11 */
        for (int k = 0; k < 16; k++) {
            const int lo = (x[i].scales[k % 8] >> (4 * (k / 8))) & 0xF, hi = (x[i].scales[8 + k % 4] >> (2 * (k / 4))) & 3;
            sc[k] = (int8_t)((lo | (hi << 4)) - 32);
        }
        const uint8_t *q = x[i].qs, *hm = x[i].hmask;
        int is = 0;
        uint8_t m = 1;
        for (int n = 0; n < QK_K; n += 128, q += 32)
            for (int shift = 0; shift < 8; shift += 2, m <<= 1)
                for (int half = 0; half < 2; half++) {
                    const float dl = d * (float)sc[is++];
                    for (int l = 16 * half; l < 16 * half + 16; l++)
                        *y++ = dl * (float)(((q[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4));
                }
    }
}

static inline void test_ggml_iq4_xs(const block_iq4_xs *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const float d = test_ggml_h(x[i].d);
        const uint8_t *qs = x[i].qs;
        for (int ib = 0; ib < 8; ib++, qs += 16, y += 32) {
            const int ls = ((x[i].scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF) | (((x[i].scales_h >> (2 * ib)) & 3) << 4);
            const float dl = d * (float)(ls - 32);
            for (int j = 0; j < 16; j++) {
                y[j] = dl * (float)kiln_iq4nl_values[qs[j] & 0xF];
                y[j + 16] = dl * (float)kiln_iq4nl_values[qs[j] >> 4];
            }
        }
    }
}

/* y (k) = x (k elements of type t) dequantized: the functions above for the new types, the scalar CPU reference
 * (quants.h to_float) for the others. */
static inline void test_ggml_to_float(kiln_type t, const void *x, float *y, int64_t k) {
    const int64_t nb = k / kiln_type_block_size(t);
    switch (t) {
    case KILN_TYPE_Q5_1: test_ggml_q5_1(x, y, nb); break;
    case KILN_TYPE_IQ4_NL: test_ggml_iq4_nl(x, y, nb); break;
    case KILN_TYPE_Q2_K: test_ggml_q2_K(x, y, nb); break;
    case KILN_TYPE_Q3_K: test_ggml_q3_K(x, y, nb); break;
    case KILN_TYPE_IQ4_XS: test_ggml_iq4_xs(x, y, nb); break;
    default: kiln_get_to_float(t, KILN_SIMD_SCALAR)(x, y, k); break;
    }
}

/* After random payload bytes (test_random_blocks or the caller's own): every f16 scale field of a new-type block
 * set to a finite half, d = scale * u + d_offset and m = scale * u' (u, u' uniform in [-1, 1)); nothing for other
 * types. */
static inline void test_ggml_fix_scales(kiln_type t, uint8_t *buf, int64_t n, float scale, float d_offset,
                                        unsigned long long *seed) {
    if (!test_ggml_is_new(t)) return;
    const int64_t nb = n / kiln_type_block_size(t);
    const size_t bs = kiln_type_block_bytes(t);
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *p = buf + (size_t)b * bs;
        const kiln_fp16 d = kiln_f32_to_fp16(test_rng_f32(seed) * scale + d_offset), m = kiln_f32_to_fp16(test_rng_f32(seed) * scale);
        switch (t) {
        case KILN_TYPE_Q5_1: memcpy(p, &d, 2), memcpy(p + 2, &m, 2); break;
        case KILN_TYPE_IQ4_NL:
        case KILN_TYPE_IQ4_XS: memcpy(p, &d, 2); break;
        case KILN_TYPE_Q2_K: memcpy(p + offsetof(block_q2_K, d), &d, 2), memcpy(p + offsetof(block_q2_K, dmin), &m, 2); break;
        case KILN_TYPE_Q3_K: memcpy(p + offsetof(block_q3_K, d), &d, 2); break;
        default: break;
        }
    }
}

#endif
