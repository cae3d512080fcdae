/* quants.c: the traits table of computable block formats and run-time choice of SIMD level.
 * Layout facts come from types.c; the functions come from quants_ref.c (scalar oracle) and
 * src/cpu/quants_avx2.c / quants_avx512.c. */
#include "quants.h"

#include <pthread.h>
#include <stdbool.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#define X86(f) f
#else
#define X86(f) NULL
#endif

#define LEVELS(kind, sfx) {kiln_##kind##_##sfx##_ref, X86(kiln_##kind##_##sfx##_avx2), X86(kiln_##kind##_##sfx##_avx512)}

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
    /* Q5_0 is computed, not produced: kiln quantize never chooses it (from_float_ref NULL), but Q4_K_M files
     * such as Gemma 3 270M's store some tensors in it. */
    [KILN_TYPE_Q5_0] = {.vec_dot_type = KILN_TYPE_Q8_0, .to_float = LEVELS(to_float, q5_0),
                        .vec_dot = LEVELS(vec_dot, q5_0_q8_0)},
    [KILN_TYPE_Q8_0] = {.vec_dot_type = KILN_TYPE_Q8_0, .to_float = LEVELS(to_float, q8_0),
                        .from_float_ref = kiln_from_float_q8_0_ref, .from_float = LEVELS(from_float, q8_0),
                        .vec_dot = LEVELS(vec_dot, q8_0_q8_0)},
    [KILN_TYPE_Q8_1] = {.vec_dot_type = KILN_TYPE_Q8_1, .to_float = LEVELS(to_float, q8_1),
                        .from_float_ref = kiln_from_float_q8_1_ref, .from_float = LEVELS(from_float, q8_1)},
    [KILN_TYPE_Q4_K] = {.vec_dot_type = KILN_TYPE_Q8_K, .to_float = LEVELS(to_float, q4_K),
                        .from_float_ref = kiln_quantize_q4_K_ref, .vec_dot = LEVELS(vec_dot, q4_K_q8_K)},
    [KILN_TYPE_Q5_K] = {.vec_dot_type = KILN_TYPE_Q8_K, .to_float = LEVELS(to_float, q5_K),
                        .from_float_ref = kiln_quantize_q5_K_ref, .vec_dot = LEVELS(vec_dot, q5_K_q8_K)},
    [KILN_TYPE_Q6_K] = {.vec_dot_type = KILN_TYPE_Q8_K, .to_float = LEVELS(to_float, q6_K),
                        .from_float_ref = kiln_quantize_q6_K_ref, .vec_dot = LEVELS(vec_dot, q6_K_q8_K)},
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

/* CPUID leaf 1 / leaf 7 bits, and XGETBV to be sure the OS saves the wider registers. */
kiln_simd kiln_simd_detect(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return KILN_SIMD_SCALAR;
    bool fma = c & (1u << 12), osxsave = c & (1u << 27), avx = c & (1u << 28), f16c = c & (1u << 29);
    if (!osxsave || !avx) return KILN_SIMD_SCALAR;
    unsigned xlo, xhi;
    __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
    bool os_avx = (xlo & 0x6) == 0x6, os_avx512 = (xlo & 0xe6) == 0xe6;
    if (!os_avx || __get_cpuid_max(0, NULL) < 7) return KILN_SIMD_SCALAR;
    __cpuid_count(7, 0, a, b, c, d);
    bool avx2 = b & (1u << 5), avx512f = b & (1u << 16), avx512dq = b & (1u << 17), avx512bw = b & (1u << 30),
         avx512vl = b & (1u << 31), vnni = c & (1u << 11);
    unsigned a1, b1, c1, d1;
    __cpuid_count(7, 1, a1, b1, c1, d1);
    bool avx512bf16 = a1 & (1u << 5);
    if (avx2 && fma && f16c && os_avx512 && avx512f && avx512dq && avx512bw && avx512vl && vnni && avx512bf16)
        return KILN_SIMD_AVX512;
    if (avx2 && fma && f16c) return KILN_SIMD_AVX2;
#endif
    return KILN_SIMD_SCALAR;
}

const char *kiln_simd_name(kiln_simd s) {
    static const char *names[KILN_SIMD_COUNT] = {"scalar", "avx2", "avx512"};
    return (unsigned)s < KILN_SIMD_COUNT ? names[s] : "?";
}

/* Detected once per process (CPUID traps in a VM, costing up to 80 us), capped by KILN_SIMD read then too. */
static kiln_simd simd_best;
static pthread_once_t simd_once = PTHREAD_ONCE_INIT;

static void detect_best(void) {
    kiln_simd best = kiln_simd_detect();
    const char *env = getenv("KILN_SIMD");
    if (env && *env)
        for (int s = 0; s < KILN_SIMD_COUNT; s++)
            if (strcmp(env, kiln_simd_name((kiln_simd)s)) == 0 && (kiln_simd)s < best) best = (kiln_simd)s;
    simd_best = best;
}

kiln_simd kiln_simd_best(void) {
    pthread_once(&simd_once, detect_best);
    return simd_best;
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
