/* fp16.h: exact scalar conversions between float and IEEE half / bfloat16.
 * Round-to-nearest-even, NaN and infinity preserved, subnormals exact. The SIMD paths (F16C, AVX-512 BF16)
 * are tested against these. */
#ifndef KILN_FP16_H
#define KILN_FP16_H

#include <stdint.h>
#include <string.h>

typedef uint16_t kiln_fp16;
typedef uint16_t kiln_bf16;

static inline uint32_t kiln_f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float kiln_bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static inline float kiln_fp16_to_f32(kiln_fp16 h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    if (exp == 0x1f) /* inf, or nan made quiet as F16C's vcvtph2ps does */
        return kiln_bits_f32(sign | 0x7f800000u | (man << 13) | (man ? 0x00400000u : 0));
    if (exp == 0) {
        if (man == 0) return kiln_bits_f32(sign);
        /* subnormal: man * 2^-24, exact in float */
        float f = (float)man * (1.0f / 16777216.0f);
        return sign ? -f : f;
    }
    return kiln_bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}

static inline kiln_fp16 kiln_f32_to_fp16(float f) {
    uint32_t x = kiln_f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) /* inf or nan (keep nan quiet) */
        return (kiln_fp16)(sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 | ((ax >> 13) & 0x3ff) : 0));
    if (ax >= 0x477ff000u) return (kiln_fp16)(sign | 0x7c00); /* rounds to >= 65520: inf */
    if (ax < 0x38800000u) {                                   /* below 2^-14: subnormal half or zero */
        if (ax < 0x33000000u) return (kiln_fp16)sign;         /* < 2^-25 rounds to zero */
        uint32_t e = ax >> 23;
        uint32_t m = (ax & 0x7fffff) | 0x800000;
        uint32_t shift = 126 - e; /* 14..24 */
        uint32_t h = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1))) h++;
        return (kiln_fp16)(sign | h);
    }
    uint32_t h = ((ax >> 13) - (112u << 10));
    uint32_t rem = ax & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
    return (kiln_fp16)(sign | h);
}

static inline float kiln_bf16_to_f32(kiln_bf16 h) { return kiln_bits_f32((uint32_t)h << 16); }

static inline kiln_bf16 kiln_f32_to_bf16(float f) {
    uint32_t x = kiln_f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (kiln_bf16)((x >> 16) | 0x40); /* quiet nan */
    x += 0x7fff + ((x >> 16) & 1); /* round to nearest even */
    return (kiln_bf16)(x >> 16);
}

#endif
