/* quants_ref.c: the scalar reference (the oracle) for the float formats F32, F16 and BF16; the block formats' are
 * beside it by family: quants_ref_legacy.c (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1), quants_ref_k.c (Q2_K..Q6_K, Q8_K)
 * and quants_ref_iq.c (IQ4_NL, IQ4_XS), with their shared helpers in quants_ref.h. Each dot is GGML's scalar one:
 * products rounded to float, summed in double in index order. tests/test_quants.c checks them; the SIMD levels
 * are tested against them (tests/test_simd.c). */
#include "quants_ref.h"

/* ---------------------------------------------------------------- F32: 4 bytes, copied */

void kiln_to_float_f32_ref(const void *x, float *y, int64_t k) { memcpy(y, x, (size_t)k * sizeof(float)); }

void kiln_from_float_f32_ref(const float *x, void *y, int64_t k) { memcpy(y, x, (size_t)k * sizeof(float)); }

/* GGML's scalar dot: each product rounded to float, summed in double, in index order. */
void kiln_vec_dot_f32_ref(int64_t n, float *s, const void *vx, const void *vy) {
    const float *x = vx, *y = vy;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) sum += (double)(x[i] * y[i]);
    *s = (float)sum;
}

/* ---------------------------------------------------------------- F16: 2 bytes, IEEE half */

void kiln_to_float_f16_ref(const void *vx, float *y, int64_t k) {
    const kiln_fp16 *x = vx;
    for (int64_t i = 0; i < k; i++) y[i] = kiln_fp16_to_f32(x[i]);
}

void kiln_from_float_f16_ref(const float *x, void *vy, int64_t k) {
    kiln_fp16 *y = vy;
    for (int64_t i = 0; i < k; i++) y[i] = kiln_f32_to_fp16(x[i]);
}

/* The product of two halves is exact in float (11+11 significant bits); the double sum is GGML's. */
void kiln_vec_dot_f16_ref(int64_t n, float *s, const void *vx, const void *vy) {
    const kiln_fp16 *x = vx, *y = vy;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) sum += (double)(kiln_fp16_to_f32(x[i]) * kiln_fp16_to_f32(y[i]));
    *s = (float)sum;
}

/* ---------------------------------------------------------------- BF16: 2 bytes, the top half of a float */

void kiln_to_float_bf16_ref(const void *vx, float *y, int64_t k) {
    const kiln_bf16 *x = vx;
    for (int64_t i = 0; i < k; i++) y[i] = kiln_bf16_to_f32(x[i]);
}

void kiln_from_float_bf16_ref(const float *x, void *vy, int64_t k) {
    kiln_bf16 *y = vy;
    for (int64_t i = 0; i < k; i++) y[i] = kiln_f32_to_bf16(x[i]);
}

/* Products of two bf16 are exact in float (8+8 bits); summed in double as GGML does. */
void kiln_vec_dot_bf16_ref(int64_t n, float *s, const void *vx, const void *vy) {
    const kiln_bf16 *x = vx, *y = vy;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) sum += (double)(kiln_bf16_to_f32(x[i]) * kiln_bf16_to_f32(y[i]));
    *s = (float)sum;
}
