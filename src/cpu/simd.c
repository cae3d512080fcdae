/* simd.c: the CPU backend's SIMD levels: what this CPU supports (CPUID), the level kiln uses (capped by KILN_SIMD),
 * and the registration of the AVX2 and AVX-512 kernels (quants_avx2.c, quants_avx512.c) into the core's traits
 * table. The registration runs once, inside kiln_simd_detect and kiln_simd_best, because a caller needs a level
 * from one of them before it can index the table above scalar: so every user of a SIMD entry (the ops, quantize,
 * sessions, tests, bench quant) finds it filled, and src/core names no CPU function. tests/test_simd.c checks
 * each registered kernel against the scalar reference. */
#include "cpu/simd.h"

#include <pthread.h>
#include <stdbool.h>
#if defined(__x86_64__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- the kernels of each level */

typedef struct level_kernels {
    kiln_type type;
    kiln_to_float_fn to_float[2];     /* AVX2, AVX-512 */
    kiln_from_float_fn from_float[2]; /* the fast activation quantizers; NULL for weight-only types */
    kiln_vec_dot_fn vec_dot[2];       /* NULL for the activation types Q8_1 and Q8_K */
} level_kernels;

#if defined(__x86_64__)
#define BOTH(kind, sfx) {kiln_##kind##_##sfx##_avx2, kiln_##kind##_##sfx##_avx512}
#define NONE {NULL, NULL}
static const level_kernels kernels[] = {
    {KILN_TYPE_F32, BOTH(to_float, f32), BOTH(from_float, f32), BOTH(vec_dot, f32)},
    {KILN_TYPE_F16, BOTH(to_float, f16), BOTH(from_float, f16), BOTH(vec_dot, f16)},
    {KILN_TYPE_BF16, BOTH(to_float, bf16), BOTH(from_float, bf16), BOTH(vec_dot, bf16)},
    {KILN_TYPE_Q4_0, BOTH(to_float, q4_0), NONE, BOTH(vec_dot, q4_0_q8_0)},
    {KILN_TYPE_Q4_1, BOTH(to_float, q4_1), NONE, BOTH(vec_dot, q4_1_q8_1)},
    {KILN_TYPE_Q5_0, BOTH(to_float, q5_0), NONE, BOTH(vec_dot, q5_0_q8_0)},
    {KILN_TYPE_Q8_0, BOTH(to_float, q8_0), BOTH(from_float, q8_0), BOTH(vec_dot, q8_0_q8_0)},
    {KILN_TYPE_Q8_1, BOTH(to_float, q8_1), BOTH(from_float, q8_1), NONE},
    {KILN_TYPE_Q4_K, BOTH(to_float, q4_K), NONE, BOTH(vec_dot, q4_K_q8_K)},
    {KILN_TYPE_Q5_K, BOTH(to_float, q5_K), NONE, BOTH(vec_dot, q5_K_q8_K)},
    {KILN_TYPE_Q6_K, BOTH(to_float, q6_K), NONE, BOTH(vec_dot, q6_K_q8_K)},
    {KILN_TYPE_Q8_K, BOTH(to_float, q8_K), BOTH(from_float, q8_K), NONE},
    {KILN_TYPE_Q5_1, BOTH(to_float, q5_1), NONE, BOTH(vec_dot, q5_1_q8_1)},
    {KILN_TYPE_Q2_K, BOTH(to_float, q2_K), NONE, BOTH(vec_dot, q2_K_q8_K)},
    {KILN_TYPE_Q3_K, BOTH(to_float, q3_K), NONE, BOTH(vec_dot, q3_K_q8_K)},
    {KILN_TYPE_IQ4_NL, BOTH(to_float, iq4_nl), NONE, BOTH(vec_dot, iq4_nl_q8_0)},
    {KILN_TYPE_IQ4_XS, BOTH(to_float, iq4_xs), NONE, BOTH(vec_dot, iq4_xs_q8_K)},
};
#endif

static pthread_once_t kernels_once = PTHREAD_ONCE_INIT;

/* Every level's kernels, whatever this CPU supports: a level is only used once detection allows it. */
static void register_kernels(void) {
#if defined(__x86_64__)
    for (size_t i = 0; i < sizeof kernels / sizeof kernels[0]; i++)
        for (int l = 0; l < 2; l++)
            kiln_type_traits_set(kernels[i].type, (kiln_simd)(KILN_SIMD_AVX2 + l), kernels[i].to_float[l],
                                 kernels[i].from_float[l], kernels[i].vec_dot[l]);
#endif
}

/* ---------------------------------------------------------------- detection */

/* CPUID leaf 1 / leaf 7 bits, and XGETBV to be sure the OS saves the wider registers. */
kiln_simd kiln_simd_detect(void) {
    pthread_once(&kernels_once, register_kernels);
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
    pthread_once(&kernels_once, register_kernels);
    pthread_once(&simd_once, detect_best);
    return simd_best;
}

/* ---------------------------------------------------------------- AMX
 * The int8 tile unit (AMX-TILE and AMX-INT8, CPUID leaf 7 EDX bits 24 and 25), where the OS saves the tile state
 * (XCR0 bits 17 and 18) and Linux grants this process the tile data (arch_prctl ARCH_REQ_XCOMP_PERM: without it
 * the first tile instruction faults). Not where KILN_SIMD caps the level below avx512 (the tile kernels'
 * epilogues are AVX-512). Whether the kernels are used is the ops' choice (kiln_cpu_ops_amx). */
static bool amx_ok;
static pthread_once_t amx_once = PTHREAD_ONCE_INIT;

static void detect_amx(void) {
#if defined(__x86_64__) && defined(__GNUC__) && defined(SYS_arch_prctl)
    if (kiln_simd_best() < KILN_SIMD_AVX512) return;
    unsigned a, b, c, d;
    __cpuid_count(7, 0, a, b, c, d);
    if (!(d & (1u << 24)) || !(d & (1u << 25))) return;
    unsigned xlo, xhi;
    __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
    if ((xlo & 0x60000) != 0x60000) return;
    enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
    amx_ok = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
#endif
}

bool kiln_simd_amx(void) {
    pthread_once(&amx_once, detect_amx);
    return amx_ok;
}
