/* quants.c: the traits table of computable block formats. Layout facts come from types.c and the scalar
 * functions from quants_ref.c (the oracle). The SIMD levels' entries are not named here: the CPU backend
 * (src/cpu/simd.c) sets them through kiln_type_traits_set the first time anyone asks it for a SIMD level,
 * which every caller of a level above scalar must do to have one. */
#include "quants.h"

#include <pthread.h>
#include <stdbool.h>

/* The scalar reference at level 0; the faster levels are the CPU backend's to fill (kiln_type_traits_set). */
#define LEVELS(kind, sfx) {kiln_##kind##_##sfx##_ref}

static kiln_type_traits table[KILN_TYPE_COUNT] = {
    [KILN_TYPE_F32] = {.vec_dot_type = KILN_TYPE_F32, .to_float = LEVELS(to_float, f32),
                       .from_float_ref = kiln_from_float_f32_ref, .from_float = LEVELS(from_float, f32),
                       .vec_dot = LEVELS(vec_dot, f32)},
    [KILN_TYPE_F16] = {.vec_dot_type = KILN_TYPE_F16, .to_float = LEVELS(to_float, f16),
                       .from_float_ref = kiln_from_float_f16_ref, .from_float = LEVELS(from_float, f16),
                       .vec_dot = LEVELS(vec_dot, f16)},
    [KILN_TYPE_BF16] = {.vec_dot_type = KILN_TYPE_BF16, .to_float = LEVELS(to_float, bf16),
                        .from_float_ref = kiln_from_float_bf16_ref, .from_float = LEVELS(from_float, bf16),
                        .vec_dot = LEVELS(vec_dot, bf16)},
    [KILN_TYPE_Q4_0] = {.vec_dot_type = KILN_TYPE_Q8_0, .to_float = LEVELS(to_float, q4_0),
                        .from_float_ref = kiln_quantize_q4_0_ref, .vec_dot = LEVELS(vec_dot, q4_0_q8_0)},
    [KILN_TYPE_Q4_1] = {.vec_dot_type = KILN_TYPE_Q8_1, .to_float = LEVELS(to_float, q4_1),
                        .from_float_ref = kiln_quantize_q4_1_ref, .vec_dot = LEVELS(vec_dot, q4_1_q8_1)},
    [KILN_TYPE_Q5_0] = {.vec_dot_type = KILN_TYPE_Q8_0, .to_float = LEVELS(to_float, q5_0),
                        .from_float_ref = kiln_quantize_q5_0_ref, .vec_dot = LEVELS(vec_dot, q5_0_q8_0)},
    [KILN_TYPE_Q5_1] = {.vec_dot_type = KILN_TYPE_Q8_1, .to_float = LEVELS(to_float, q5_1),
                        .from_float_ref = kiln_quantize_q5_1_ref, .vec_dot = LEVELS(vec_dot, q5_1_q8_1)},
    [KILN_TYPE_IQ4_NL] = {.vec_dot_type = KILN_TYPE_Q8_0, .to_float = LEVELS(to_float, iq4_nl),
                          .from_float_ref = kiln_quantize_iq4_nl_ref, .vec_dot = LEVELS(vec_dot, iq4_nl_q8_0)},
    [KILN_TYPE_Q8_0] = {.vec_dot_type = KILN_TYPE_Q8_0, .to_float = LEVELS(to_float, q8_0),
                        .from_float_ref = kiln_from_float_q8_0_ref, .from_float = LEVELS(from_float, q8_0),
                        .vec_dot = LEVELS(vec_dot, q8_0_q8_0)},
    [KILN_TYPE_Q8_1] = {.vec_dot_type = KILN_TYPE_Q8_1, .to_float = LEVELS(to_float, q8_1),
                        .from_float_ref = kiln_from_float_q8_1_ref, .from_float = LEVELS(from_float, q8_1)},
    [KILN_TYPE_Q2_K] = {.vec_dot_type = KILN_TYPE_Q8_K, .to_float = LEVELS(to_float, q2_K),
                        .from_float_ref = kiln_quantize_q2_K_ref, .vec_dot = LEVELS(vec_dot, q2_K_q8_K)},
    [KILN_TYPE_Q3_K] = {.vec_dot_type = KILN_TYPE_Q8_K, .to_float = LEVELS(to_float, q3_K),
                        .from_float_ref = kiln_quantize_q3_K_ref, .vec_dot = LEVELS(vec_dot, q3_K_q8_K)},
    [KILN_TYPE_Q4_K] = {.vec_dot_type = KILN_TYPE_Q8_K, .to_float = LEVELS(to_float, q4_K),
                        .from_float_ref = kiln_quantize_q4_K_ref, .vec_dot = LEVELS(vec_dot, q4_K_q8_K)},
    [KILN_TYPE_Q5_K] = {.vec_dot_type = KILN_TYPE_Q8_K, .to_float = LEVELS(to_float, q5_K),
                        .from_float_ref = kiln_quantize_q5_K_ref, .vec_dot = LEVELS(vec_dot, q5_K_q8_K)},
    [KILN_TYPE_Q6_K] = {.vec_dot_type = KILN_TYPE_Q8_K, .to_float = LEVELS(to_float, q6_K),
                        .from_float_ref = kiln_quantize_q6_K_ref, .vec_dot = LEVELS(vec_dot, q6_K_q8_K)},
    [KILN_TYPE_IQ4_XS] = {.vec_dot_type = KILN_TYPE_Q8_K, .to_float = LEVELS(to_float, iq4_xs),
                          .from_float_ref = kiln_quantize_iq4_xs_ref, .vec_dot = LEVELS(vec_dot, iq4_xs_q8_K)},
    [KILN_TYPE_Q8_K] = {.vec_dot_type = KILN_TYPE_Q8_K, .to_float = LEVELS(to_float, q8_K),
                        .from_float_ref = kiln_from_float_q8_K_ref, .from_float = LEVELS(from_float, q8_K)},
};

static void fill_layouts(void) {
    for (int t = 0; t < KILN_TYPE_COUNT; t++) {
        kiln_type_traits *tt = &table[t];
        tt->name = kiln_type_name((kiln_type)t);
        tt->blck_size = kiln_type_block_size((kiln_type)t);
        tt->type_size = kiln_type_block_bytes((kiln_type)t);
        tt->is_quantized = tt->blck_size > 1;
        tt->computable = tt->to_float[KILN_SIMD_SCALAR] != NULL;
    }
}

const kiln_type_traits *kiln_type_traits_get(kiln_type t) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, fill_layouts);
    if (!kiln_type_known((uint32_t)t)) return NULL;
    return &table[t];
}

void kiln_type_traits_set(kiln_type t, kiln_simd level, kiln_to_float_fn to_float, kiln_from_float_fn from_float,
                          kiln_vec_dot_fn vec_dot) {
    assert(kiln_type_known((uint32_t)t) && level > KILN_SIMD_SCALAR && level < KILN_SIMD_COUNT);
    table[t].to_float[level] = to_float;
    table[t].from_float[level] = from_float;
    table[t].vec_dot[level] = vec_dot;
}

/* Each getter returns the entry at level, or at the nearest level below that has one. */
static int top_level(kiln_simd level) { return level >= KILN_SIMD_COUNT ? KILN_SIMD_COUNT - 1 : (int)level; }

kiln_to_float_fn kiln_get_to_float(kiln_type t, kiln_simd level) {
    const kiln_type_traits *tt = kiln_type_traits_get(t);
    for (int l = top_level(level); tt && l >= 0; l--)
        if (tt->to_float[l]) return tt->to_float[l];
    return NULL;
}

kiln_from_float_fn kiln_get_from_float(kiln_type t, kiln_simd level) {
    const kiln_type_traits *tt = kiln_type_traits_get(t);
    for (int l = top_level(level); tt && l >= 0; l--)
        if (tt->from_float[l]) return tt->from_float[l];
    return NULL;
}

kiln_vec_dot_fn kiln_get_vec_dot(kiln_type t, kiln_simd level) {
    const kiln_type_traits *tt = kiln_type_traits_get(t);
    for (int l = top_level(level); tt && l >= 0; l--)
        if (tt->vec_dot[l]) return tt->vec_dot[l];
    return NULL;
}
