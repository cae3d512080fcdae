/* quants_ref.h: what the scalar reference files share (quants_ref.c: F32, F16, BF16; quants_ref_legacy.c: the
 * 32-element blocks Q4_0..Q8_1; quants_ref_k.c: the K-quants Q2_K..Q6_K and Q8_K; quants_ref_iq.c: IQ4_NL, IQ4_XS):
 * the rounding helpers and the rule that no product is fused into an add. Private to those files; quants.h declares
 * their functions.
 *
 * Every float-to-int step of the reference goes through a helper that clamps first, so a NaN or inf input gives
 * meaningless codes but no undefined behaviour; kiln quantize refuses such weights before they get here. */
#ifndef KILN_QUANTS_REF_H
#define KILN_QUANTS_REF_H

#include "quants.h"

#include <math.h>
#include <string.h>

/* Bit-exactness needs each product rounded before the add. GCC in ISO C mode (-std=c11) does not contract
 * a*b+c into an FMA; clang does unless told. The pragma holds for the rest of each file that includes this. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

/* ---------------------------------------------------------------- rounding helpers */

/* Round half to even, as GGML's nearest_int (the 1.5*2^23 magic-number trick) does for |v| < 2^22. */
static inline int nearest_int(float v) {
    float r = v + 12582912.0f;
    int32_t i;
    memcpy(&i, &r, sizeof i);
    return (i & 0x007fffff) - 0x00400000;
}

/* nearest_int clamped to [lo, hi]; clamps first so no input (huge, inf, NaN -> lo) is out of the trick's range. */
static inline int round_clamp(float v, int lo, int hi) {
    if (!(v > (float)lo)) return lo;
    if (v > (float)hi) return hi;
    return nearest_int(v);
}

/* ---------------------------------------------------------------- block statistics and packing */

/* The element of largest magnitude, with its sign: the first of equals, 0 when all are 0, never a NaN (GGML's
 * `if (fabsf(x) > amax) amax = fabsf(x), max = x` loop; amax is fabsf of the result). */
static inline float signed_absmax(const float *x, int n) {
    float amax = 0.0f, max = 0.0f;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > amax) amax = fabsf(x[i]), max = x[i];
    return max;
}

/* The smallest and largest of x[0..n-1], n >= 1, from x[0] on: a NaN after x[0] replaces neither. */
static inline void min_max(const float *x, int n, float *min, float *max) {
    float lo = x[0], hi = x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < lo) lo = x[i];
        if (x[i] > hi) hi = x[i];
    }
    *min = lo, *max = hi;
}

/* 32 codes as Q4_0, Q4_1, Q5_0, Q5_1 and IQ4_NL store their low 4 bits: element j in the low nibble of qs[j],
 * element j + 16 in the high one. */
static inline void pack_nibbles(const uint8_t q[32], uint8_t qs[16]) {
    for (int j = 0; j < 16; j++) qs[j] = (uint8_t)((q[j] & 0x0F) | (q[j + 16] & 0x0F) << 4);
}

#endif
