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

#endif
