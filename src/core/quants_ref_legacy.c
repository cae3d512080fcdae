/* quants_ref_legacy.c: the scalar reference (the oracle) for the 32-element block formats: the weight formats
 * Q4_0, Q4_1, Q5_0, Q5_1 and the activation formats Q8_0, Q8_1 (Q8_0 is a weight format too).
 *
 * Dequantization repeats GGML's float32 arithmetic operation for operation, so it matches llama.cpp and the gguf
 * Python package's numpy dequantize bit for bit (tests/test_fixtures.c); the quantizers are GGML's reference ones
 * byte for byte, and the vec_dots have GGML's reference semantics. tests/test_quants.c checks round-trip error, edge
 * inputs and every vec_dot against a double-precision dot; the SIMD levels are tested against this file.
 *
 * Scales are stored as f16, so inputs whose block scale exceeds 65504 (|x| beyond ~5e5 for Q4_0) overflow to
 * inf, exactly as in GGML; callers that can meet such weights must check first. */
#include "quants_ref.h"

/* ---------------------------------------------------------------- the legacy formats' shared steps */

/* trunc(v) for the legacy quantizers' codes, capped at hi. Finite inputs put v in [0, hi + 1.5], where this is
 * GGML's (int)v then min(., hi); an inf or NaN weight makes v NaN, and the plain cast (undefined behaviour) then
 * gave a negative code that the nibble packing shifted left (undefined too). Here such a v gives code 0. */
static inline int trunc_code(float v, int hi) {
    if (!(v >= 0.0f)) return 0;
    return v < (float)hi ? (int)v : hi;
}

/* roundf(v) as an int8 code in [-127, 127] (Q8_0, Q8_1): finite inputs give |v| <= 127 already; NaN is 0 and
 * inf the nearest end, where the plain cast was undefined. */
static inline int8_t round_code_q8(float v) {
    if (v != v) return 0;
    return (int8_t)roundf(v < -127.0f ? -127.0f : v > 127.0f ? 127.0f : v);
}

/* 1/d, or 0 where d is 0 or so small (below ~2.9e-39) that 1/d overflows. GGML writes `d ? 1/d : 0`; the
 * overflow case makes x*id inf or NaN there and the int8 cast undefined. Here every such block stores a
 * zero f16 scale anyway, so the codes do not matter and are made zero (or the zero level). */
static inline float safe_inverse(float d) {
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    return isfinite(id) ? id : 0.0f;
}

/* Q4_0, Q4_1, Q5_0 and Q5_1's codes for one block: trunc((x[j] - off) * id + bias) capped at hi. Q4_0 and Q5_0 pass
 * off = 0, where x - 0 is x exactly, so theirs are GGML's trunc(x * id + bias). */
static void legacy_codes(const float *x, float off, float id, float bias, int hi, uint8_t q[32]) {
    for (int j = 0; j < 32; j++) q[j] = (uint8_t)trunc_code((x[j] - off) * id + bias, hi);
}

/* Bit 4 of element i (0..31) is bit i of qh read as a little-endian uint32 (GGML's dequantize_row_q5_0; Q5_1's
 * qh is the same). */
static inline uint32_t load_qh(const uint8_t qh[4]) {
    return (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
}

/* 32 codes in 0..31 as Q5_0 and Q5_1 store them: the low 4 bits by pack_nibbles, bit 4 of element j at bit j of qh. */
static void pack_q5(const uint8_t q[32], uint8_t qs[16], uint8_t qh[4]) {
    pack_nibbles(q, qs);
    uint32_t h = 0;
    for (int j = 0; j < 32; j++) h |= (uint32_t)(q[j] >> 4) << j;
    for (int b = 0; b < 4; b++) qh[b] = (uint8_t)(h >> (8 * b));
}

/* The 5-bit codes of elements j and j + 16 (j in 0..15) of a Q5_0 or Q5_1 block: the nibbles of qs[j] with bits
 * j and j + 16 of qh. */
static inline int q5_code_lo(const uint8_t *qs, uint32_t qh, int j) {
    return (qs[j] & 0x0F) | (int)((qh >> j) & 1) << 4;
}
static inline int q5_code_hi(const uint8_t *qs, uint32_t qh, int j) {
    return (qs[j] >> 4) | (int)((qh >> (j + 12)) & 0x10);
}

/* The integer dot of a Q4_0 or Q4_1 block's 32 codes, less off (8, 0), with 32 int8 codes. */
static inline int nibble_dot(const uint8_t *qs, int off, const int8_t *q8) {
    int sum = 0;
    for (int j = 0; j < 16; j++) sum += ((qs[j] & 0x0F) - off) * q8[j] + ((qs[j] >> 4) - off) * q8[j + 16];
    return sum;
}

/* The same for a Q5_0 or Q5_1 block's 5-bit codes, less off (16, 0). */
static inline int q5_dot(const uint8_t *qs, uint32_t qh, int off, const int8_t *q8) {
    int sum = 0;
    for (int j = 0; j < 16; j++)
        sum += (q5_code_lo(qs, qh, j) - off) * q8[j] + (q5_code_hi(qs, qh, j) - off) * q8[j + 16];
    return sum;
}

/* Q8_0's codes for one block, GGML's quantize_row_q8_0_ref: d = amax/127, q = roundf(x/d) (ties away from zero),
 * |q| <= 127. Returns d. */
static float q8_codes(const float *x, int8_t qs[32]) {
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
    const float d = amax / 127.0f;
    const float id = safe_inverse(d);
    for (int j = 0; j < 32; j++) qs[j] = round_code_q8(x[j] * id);
    return d;
}

/* ---------------------------------------------------------------- Q4_0: 18 bytes per 32, x = d * (q - 8) */

void kiln_to_float_q4_0_ref(const void *vx, float *y, int64_t k) {
    assert(k % QK4_0 == 0);
    const block_q4_0 *x = vx;
    for (int64_t i = 0; i < k / QK4_0; i++, y += QK4_0) {
        const float d = kiln_fp16_to_f32(x[i].d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            y[j] = (float)((x[i].qs[j] & 0x0F) - 8) * d;
            y[j + QK4_0 / 2] = (float)((x[i].qs[j] >> 4) - 8) * d;
        }
    }
}

/* GGML's quantizer, byte for byte (gguf-py's numpy port is its fixture): the element of largest magnitude,
 * with its sign, maps to level 0 (q - 8 = -8), so d = max / -8 and the other side reaches only +7. Codes are
 * trunc(x/d + 8.5), i.e. rounding half up, capped at 15. */
void kiln_quantize_q4_0_ref(const float *x, void *vy, int64_t k) {
    assert(k % QK4_0 == 0);
    block_q4_0 *y = vy;
    uint8_t q[QK4_0];
    for (int64_t i = 0; i < k / QK4_0; i++, x += QK4_0) {
        const float d = signed_absmax(x, QK4_0) / -8.0f;
        y[i].d = kiln_f32_to_fp16(d);
        /* x*id is in [-8, 8], so x*id + 8.5 is in [0.5, 16.5]: truncation is floor, never negative */
        legacy_codes(x, 0.0f, safe_inverse(d), 8.5f, 15, q);
        pack_nibbles(q, y[i].qs);
    }
}

void kiln_vec_dot_q4_0_q8_0_ref(int64_t n, float *s, const void *vx, const void *vy) {
    assert(n % QK8_0 == 0);
    const block_q4_0 *x = vx;
    const block_q8_0 *y = vy;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK8_0; i++) {
        const int sumi = nibble_dot(x[i].qs, 8, y[i].qs);
        sum += (float)sumi * kiln_fp16_to_f32(x[i].d) * kiln_fp16_to_f32(y[i].d);
    }
    *s = sum;
}

/* ---------------------------------------------------------------- Q5_0: 22 bytes per 32, x = d * (q - 16) */

void kiln_to_float_q5_0_ref(const void *vx, float *y, int64_t k) {
    assert(k % QK5_0 == 0);
    const block_q5_0 *x = vx;
    for (int64_t i = 0; i < k / QK5_0; i++, y += QK5_0) {
        const float d = kiln_fp16_to_f32(x[i].d);
        const uint32_t qh = load_qh(x[i].qh);
        for (int j = 0; j < QK5_0 / 2; j++) {
            y[j] = (float)(q5_code_lo(x[i].qs, qh, j) - 16) * d;
            y[j + QK5_0 / 2] = (float)(q5_code_hi(x[i].qs, qh, j) - 16) * d;
        }
    }
}

/* GGML's quantize_row_q5_0_ref, byte for byte: as Q4_0 with 32 levels, the element of largest magnitude (with its
 * sign) maps to level 0, so d = max / -16; codes are trunc(x/d + 16.5) capped at 31, their bit 4 packed into qh. */
void kiln_quantize_q5_0_ref(const float *x, void *vy, int64_t k) {
    assert(k % QK5_0 == 0);
    block_q5_0 *y = vy;
    uint8_t q[QK5_0];
    for (int64_t i = 0; i < k / QK5_0; i++, x += QK5_0) {
        const float d = signed_absmax(x, QK5_0) / -16.0f;
        y[i].d = kiln_f32_to_fp16(d);
        /* x*id is in [-16, 16], so x*id + 16.5 is in [0.5, 32.5]: truncation is floor, never negative */
        legacy_codes(x, 0.0f, safe_inverse(d), 16.5f, 31, q);
        pack_q5(q, y[i].qs, y[i].qh);
    }
}

void kiln_vec_dot_q5_0_q8_0_ref(int64_t n, float *s, const void *vx, const void *vy) {
    assert(n % QK8_0 == 0);
    const block_q5_0 *x = vx;
    const block_q8_0 *y = vy;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK8_0; i++) {
        const int sumi = q5_dot(x[i].qs, load_qh(x[i].qh), 16, y[i].qs);
        sum += (float)sumi * kiln_fp16_to_f32(x[i].d) * kiln_fp16_to_f32(y[i].d);
    }
    *s = sum;
}

/* ---------------------------------------------------------------- Q4_1: 20 bytes per 32, x = d * q + m */

void kiln_to_float_q4_1_ref(const void *vx, float *y, int64_t k) {
    assert(k % QK4_1 == 0);
    const block_q4_1 *x = vx;
    for (int64_t i = 0; i < k / QK4_1; i++, y += QK4_1) {
        const float d = kiln_fp16_to_f32(x[i].d), m = kiln_fp16_to_f32(x[i].m);
        for (int j = 0; j < QK4_1 / 2; j++) {
            y[j] = (float)(x[i].qs[j] & 0x0F) * d + m;
            y[j + QK4_1 / 2] = (float)(x[i].qs[j] >> 4) * d + m;
        }
    }
}

/* GGML's quantizer, byte for byte: the block's [min, max] split into 15 steps, codes trunc((x - min)/d + 0.5). */
void kiln_quantize_q4_1_ref(const float *x, void *vy, int64_t k) {
    assert(k % QK4_1 == 0);
    block_q4_1 *y = vy;
    uint8_t q[QK4_1];
    for (int64_t i = 0; i < k / QK4_1; i++, x += QK4_1) {
        float min, max;
        min_max(x, QK4_1, &min, &max);
        const float d = (max - min) / 15.0f;
        y[i].d = kiln_f32_to_fp16(d);
        y[i].m = kiln_f32_to_fp16(min);
        /* (x - min)*id is in [0, 15]: truncation is floor */
        legacy_codes(x, min, safe_inverse(d), 0.5f, 15, q);
        pack_nibbles(q, y[i].qs);
    }
}

/* The min term uses the activation block's s = d*sum(q), so it costs one multiply per block, not 32. */
void kiln_vec_dot_q4_1_q8_1_ref(int64_t n, float *s, const void *vx, const void *vy) {
    assert(n % QK8_1 == 0);
    const block_q4_1 *x = vx;
    const block_q8_1 *y = vy;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK8_1; i++) {
        const int sumi = nibble_dot(x[i].qs, 0, y[i].qs);
        sum += kiln_fp16_to_f32(x[i].d) * kiln_fp16_to_f32(y[i].d) * (float)sumi +
               kiln_fp16_to_f32(x[i].m) * kiln_fp16_to_f32(y[i].s);
    }
    *s = sum;
}

/* ---------------------------------------------------------------- Q5_1: 24 bytes per 32, x = d * q + m
 * q in 0..31: the low 4 bits packed as Q4_1, bit 4 of element i at bit i of qh (as Q5_0). */

void kiln_to_float_q5_1_ref(const void *vx, float *y, int64_t k) {
    assert(k % QK5_1 == 0);
    const block_q5_1 *x = vx;
    for (int64_t i = 0; i < k / QK5_1; i++, y += QK5_1) {
        const float d = kiln_fp16_to_f32(x[i].d), m = kiln_fp16_to_f32(x[i].m);
        const uint32_t qh = load_qh(x[i].qh);
        for (int j = 0; j < QK5_1 / 2; j++) {
            y[j] = (float)q5_code_lo(x[i].qs, qh, j) * d + m;
            y[j + QK5_1 / 2] = (float)q5_code_hi(x[i].qs, qh, j) * d + m;
        }
    }
}

/* GGML's quantize_row_q5_1_ref byte for byte (gguf-py's numpy port is its fixture): [min, max] in 31 steps,
 * codes trunc((x - min)/d + 0.5) capped at 31. */
void kiln_quantize_q5_1_ref(const float *x, void *vy, int64_t k) {
    assert(k % QK5_1 == 0);
    block_q5_1 *y = vy;
    uint8_t q[QK5_1];
    for (int64_t i = 0; i < k / QK5_1; i++, x += QK5_1) {
        float min, max;
        min_max(x, QK5_1, &min, &max);
        const float d = (max - min) / 31.0f;
        y[i].d = kiln_f32_to_fp16(d);
        y[i].m = kiln_f32_to_fp16(min);
        legacy_codes(x, min, safe_inverse(d), 0.5f, 31, q);
        pack_q5(q, y[i].qs, y[i].qh);
    }
}

void kiln_vec_dot_q5_1_q8_1_ref(int64_t n, float *s, const void *vx, const void *vy) {
    assert(n % QK8_1 == 0);
    const block_q5_1 *x = vx;
    const block_q8_1 *y = vy;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK8_1; i++) {
        const int sumi = q5_dot(x[i].qs, load_qh(x[i].qh), 0, y[i].qs);
        sum += kiln_fp16_to_f32(x[i].d) * kiln_fp16_to_f32(y[i].d) * (float)sumi +
               kiln_fp16_to_f32(x[i].m) * kiln_fp16_to_f32(y[i].s);
    }
    *s = sum;
}

/* ---------------------------------------------------------------- Q8_0: 34 bytes per 32, x = d * q */

void kiln_to_float_q8_0_ref(const void *vx, float *y, int64_t k) {
    assert(k % QK8_0 == 0);
    const block_q8_0 *x = vx;
    for (int64_t i = 0; i < k / QK8_0; i++, y += QK8_0) {
        const float d = kiln_fp16_to_f32(x[i].d);
        for (int j = 0; j < QK8_0; j++) y[j] = (float)x[i].qs[j] * d;
    }
}

/* q8_codes per block, d stored as f16. */
void kiln_from_float_q8_0_ref(const float *x, void *vy, int64_t k) {
    assert(k % QK8_0 == 0);
    block_q8_0 *y = vy;
    for (int64_t i = 0; i < k / QK8_0; i++, x += QK8_0) y[i].d = kiln_f32_to_fp16(q8_codes(x, y[i].qs));
}

void kiln_vec_dot_q8_0_q8_0_ref(int64_t n, float *s, const void *vx, const void *vy) {
    assert(n % QK8_0 == 0);
    const block_q8_0 *x = vx, *y = vy;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK8_0; i++) {
        int sumi = 0;
        for (int j = 0; j < QK8_0; j++) sumi += x[i].qs[j] * y[i].qs[j];
        sum += (float)sumi * (kiln_fp16_to_f32(x[i].d) * kiln_fp16_to_f32(y[i].d));
    }
    *s = sum;
}

/* ---------------------------------------------------------------- Q8_1: 36 bytes per 32, x = d * q, s = d * sum(q) */

void kiln_to_float_q8_1_ref(const void *vx, float *y, int64_t k) {
    assert(k % QK8_1 == 0);
    const block_q8_1 *x = vx;
    for (int64_t i = 0; i < k / QK8_1; i++, y += QK8_1) {
        const float d = kiln_fp16_to_f32(x[i].d);
        for (int j = 0; j < QK8_1; j++) y[j] = (float)x[i].qs[j] * d;
    }
}

/* Q8_0's codes plus s. As in GGML, s is sum(q) times the unrounded d, so s differs from the stored
 * f16(d)*sum(q) by up to an f16 rounding: vec_dot's min term carries that, not the dequantized values. */
void kiln_from_float_q8_1_ref(const float *x, void *vy, int64_t k) {
    assert(k % QK8_1 == 0);
    block_q8_1 *y = vy;
    for (int64_t i = 0; i < k / QK8_1; i++, x += QK8_1) {
        const float d = q8_codes(x, y[i].qs);
        int sum = 0;
        for (int j = 0; j < QK8_1; j++) sum += y[i].qs[j];
        y[i].d = kiln_f32_to_fp16(d);
        y[i].s = kiln_f32_to_fp16((float)sum * d);
    }
}
