/* test_simd.c: the AVX2 and AVX-512 kernels (src/cpu/quants_avx2.c, quants_avx512.c) against the scalar
 * oracle (src/core/quants_ref.c), through the traits table, on fresh random inputs of odd lengths:
 * to_float bit for bit on random block bytes, the from_float quantizers byte for byte (with exact .5 ties and
 * edge blocks), vec_dot within a bound stated at check_dot. A level this CPU lacks is skipped with the reason. */
#include "test.h"

#include "quants.h"
#include "cpu/simd.h"

#include <stdint.h>

static const int64_t float_lens[] = {1, 7, 16, 33, 100, 1001}; /* f32/f16/bf16: vector bodies and tails */
static const int64_t block_counts[] = {1, 3, 7, 13};          /* quantized types: odd counts of blocks */
#define N_FLOAT_LENS (int)(sizeof float_lens / sizeof float_lens[0])
#define N_BLOCK_COUNTS (int)(sizeof block_counts / sizeof block_counts[0])
#define MAX_ELEMS (13 * QK_K)

static const kiln_type all_types[] = {KILN_TYPE_F32,  KILN_TYPE_F16,  KILN_TYPE_BF16, KILN_TYPE_Q4_0,
                                      KILN_TYPE_Q4_1, KILN_TYPE_Q5_0, KILN_TYPE_Q8_0, KILN_TYPE_Q8_1, KILN_TYPE_Q4_K,
                                      KILN_TYPE_Q5_K, KILN_TYPE_Q6_K, KILN_TYPE_Q8_K, KILN_TYPE_Q5_1, KILN_TYPE_Q2_K,
                                      KILN_TYPE_Q3_K, KILN_TYPE_IQ4_NL, KILN_TYPE_IQ4_XS};
static const kiln_type quantizer_types[] = {KILN_TYPE_F32, KILN_TYPE_F16, KILN_TYPE_BF16,
                                            KILN_TYPE_Q8_0, KILN_TYPE_Q8_1, KILN_TYPE_Q8_K};
static const kiln_type dot_types[] = {KILN_TYPE_F32,  KILN_TYPE_F16,  KILN_TYPE_BF16, KILN_TYPE_Q4_0, KILN_TYPE_Q4_1,
                                      KILN_TYPE_Q5_0, KILN_TYPE_Q8_0, KILN_TYPE_Q4_K, KILN_TYPE_Q5_K, KILN_TYPE_Q6_K,
                                      KILN_TYPE_Q5_1, KILN_TYPE_Q2_K, KILN_TYPE_Q3_K, KILN_TYPE_IQ4_NL, KILN_TYPE_IQ4_XS};
#define COUNT(a) (int)(sizeof a / sizeof a[0])

/* Scratch shared by the tests (the largest case is 13 Q8_K blocks or 1001 floats). */
static uint8_t xb[MAX_ELEMS * 4], yb[MAX_ELEMS * 4], xb2[MAX_ELEMS * 4], out_a[MAX_ELEMS * 4], out_b[MAX_ELEMS * 4];
static float xf[MAX_ELEMS], yf[MAX_ELEMS], fa[MAX_ELEMS + 1], fb[MAX_ELEMS + 1]; /* +1: the guard element */

static bool level_missing(kiln_simd level, char *why, size_t n) {
    kiln_simd have = kiln_simd_detect();
    if (have >= level) return false;
    snprintf(why, n, "this CPU lacks %s (best level: %s)", kiln_simd_name(level), kiln_simd_name(have));
    return true;
}

static int64_t elems_of(kiln_type t, int i) {
    const kiln_type_traits *tt = kiln_type_traits_get(t);
    return tt->blck_size == 1 ? float_lens[i] : block_counts[i] * tt->blck_size;
}
static int n_lens(kiln_type t) { return kiln_type_traits_get(t)->blck_size == 1 ? N_FLOAT_LENS : N_BLOCK_COUNTS; }

/* A random finite f16 scale with random sign, magnitude 2^-12 .. 2. */
static kiln_fp16 random_scale(unsigned long long *rng) {
    float m = 1.0f + (float)(test_rng_next(rng) >> 40) / 16777216.0f;
    int e = (int)(test_rng_next(rng) % 14) - 12;
    float v = ldexpf(m, e);
    return kiln_f32_to_fp16(test_rng_next(rng) & 1 ? -v : v);
}

/* Offsets of the f16 scale fields of each block type, -1 terminated. */
static const int *scale_fields(kiln_type t) {
    static const int none[] = {-1}, d0[] = {0, -1}, d0_2[] = {0, 2, -1}, q6k[] = {offsetof(block_q6_K, d), -1};
    static const int q2k[] = {offsetof(block_q2_K, d), offsetof(block_q2_K, dmin), -1}, q3k[] = {offsetof(block_q3_K, d), -1};
    switch (t) {
    case KILN_TYPE_Q4_0: case KILN_TYPE_Q5_0: case KILN_TYPE_Q8_0: case KILN_TYPE_IQ4_NL: case KILN_TYPE_IQ4_XS: return d0;
    case KILN_TYPE_Q4_1: case KILN_TYPE_Q8_1: case KILN_TYPE_Q4_K: case KILN_TYPE_Q5_K: case KILN_TYPE_Q5_1: return d0_2;
    case KILN_TYPE_Q6_K: return q6k;
    case KILN_TYPE_Q2_K: return q2k;
    case KILN_TYPE_Q3_K: return q3k;
    default: return none;
    }
}

/* n elements of type t as random bytes: every bit pattern for the float types (NaN, inf, subnormals
 * included), random codes and scales with sane finite f16 (or float, for Q8_K) block scales for the rest. */
static size_t random_blocks(kiln_type t, int64_t n, uint8_t *buf, unsigned long long *rng) {
    const kiln_type_traits *tt = kiln_type_traits_get(t);
    const size_t bytes = (size_t)(n / tt->blck_size) * tt->type_size;
    for (size_t i = 0; i < bytes; i++) buf[i] = (uint8_t)(test_rng_next(rng) >> 56);
    if (!tt->is_quantized) return bytes;
    for (size_t b = 0; b < bytes; b += tt->type_size) {
        for (const int *f = scale_fields(t); *f >= 0; f++) {
            kiln_fp16 h = random_scale(rng);
            memcpy(buf + b + *f, &h, 2);
        }
        if (t == KILN_TYPE_Q8_K) {
            float d = test_rng_normal(rng) * 0.01f;
            memcpy(buf + b, &d, 4);
        }
    }
    return bytes;
}

/* ---------------------------------------------------------------- to_float: bit for bit */

static void check_to_float(kiln_simd level) {
    unsigned long long rng = 0x7f0a7 + level;
    for (int ti = 0; ti < COUNT(all_types); ti++) {
        const kiln_type t = all_types[ti];
        const kiln_type_traits *tt = kiln_type_traits_get(t);
        CHECK(tt->to_float[level] != NULL, "%s has no %s to_float", tt->name, kiln_simd_name(level));
        for (int li = 0; li < n_lens(t); li++) {
            const int64_t n = elems_of(t, li);
            for (int rep = 0; rep < 8; rep++) {
                random_blocks(t, n, xb, &rng);
                memset(fa, 0xAB, sizeof fa);
                memset(fb, 0xCD, sizeof fb);
                tt->to_float[KILN_SIMD_SCALAR](xb, fa, n);
                tt->to_float[level](xb, fb, n);
                for (int64_t i = 0; i < n; i++) {
                    uint32_t a = kiln_f32_bits(fa[i]), b = kiln_f32_bits(fb[i]);
                    CHECK(a == b, "%s n=%lld: element %lld: scalar %08x (%g), %s %08x (%g)",
                          tt->name, (long long)n, (long long)i, a, fa[i], kiln_simd_name(level), b, fb[i]);
                }
                CHECK(kiln_f32_bits(fb[n]) == 0xCDCDCDCDu, "%s n=%lld: wrote past the end", tt->name, (long long)n);
            }
        }
    }
}

/* ---------------------------------------------------------------- from_float: byte for byte */

/* Inputs for quantizer t, kind by kind: normal data, rounding ties, then edge blocks. */
static void fill_quantizer_input(kiln_type t, int64_t n, int kind, float *x, unsigned long long *rng) {
    const int64_t bs = kiln_type_traits_get(t)->blck_size;
    for (int64_t i = 0; i < n; i++) x[i] = test_rng_normal(rng) * 3.0f;
    if (kind == 0) return;
    if (t == KILN_TYPE_F32 || t == KILN_TYPE_F16 || t == KILN_TYPE_BF16) {
        for (int64_t i = 0; i < n; i++) {
            uint32_t r = (uint32_t)(test_rng_next(rng) >> 32);
            switch (i % 4) {
            case 0: x[i] = kiln_bits_f32(r); break;                           /* any bits: NaN, inf, subnormal */
            case 1: x[i] = kiln_bits_f32((r & 0xffff0000u) | 0x8000u); break; /* bf16 tie */
            case 2: {                                                         /* f16 tie, normal or subnormal */
                kiln_fp16 h = (kiln_fp16)(r & 0x7bfe);
                x[i] = 0.5f * (kiln_fp16_to_f32(h) + kiln_fp16_to_f32((kiln_fp16)(h + 1)));
                if (r & 0x80000000u) x[i] = -x[i];
                break;
            }
            default: x[i] = kiln_bits_f32(r & 0x807fffffu); break; /* float subnormal */
            }
        }
        return;
    }
    for (int64_t b = 0; b < n / bs; b++) {
        float *blk = x + b * bs;
        const int edge = (int)(b % 6);
        /* The extreme is +-127 * 2^e, so d = 2^e (Q8_0) or iscale = -+2^-e (Q8_K) exactly, and values
         * k/2 * 2^e scale to exact halves: every tie rule is exercised. */
        const float p = ldexpf(1.0f, (int)(test_rng_next(rng) % 9) - 4);
        for (int64_t j = 0; j < bs; j++) {
            int k = (int)(test_rng_next(rng) % 255) - 127;
            blk[j] = (float)k * 0.5f * p;
        }
        blk[test_rng_next(rng) % bs] = (test_rng_next(rng) & 1 ? 127.0f : -127.0f) * p;
        switch (edge) {
        case 1: blk[1] = 0.49999997f * p; blk[2] = -0.49999997f * p; blk[3] = 0.5f * p; blk[4] = -2.5f * p; break;
        case 2: /* both signs of the extreme: the first one sets Q8_K's sign */
            blk[bs - 2] = 200.0f * p;
            blk[bs - 1] = -200.0f * p;
            break;
        case 3: memset(blk, 0, (size_t)bs * sizeof(float)); break;  /* all zero */
        case 4: for (int64_t j = 0; j < bs; j++) blk[j] = test_rng_f32(rng) * 1e-40f; break; /* 1/d overflows */
        case 5:
            if (t == KILN_TYPE_Q8_K) { /* NaN codes are -127 in the oracle; an inf makes the block zero */
                blk[5] = NAN;
                if (b % 12 == 5) blk[7] = -INFINITY;
            }
            break;
        default: break;
        }
    }
}

static void check_from_float(kiln_simd level) {
    unsigned long long rng = 0xf0f0 + level;
    for (int ti = 0; ti < COUNT(quantizer_types); ti++) {
        const kiln_type t = quantizer_types[ti];
        const kiln_type_traits *tt = kiln_type_traits_get(t);
        CHECK(tt->from_float[level] != NULL, "%s has no %s from_float", tt->name, kiln_simd_name(level));
        for (int li = 0; li < n_lens(t); li++) {
            const int64_t n = elems_of(t, li);
            const size_t bytes = (size_t)(n / tt->blck_size) * tt->type_size;
            for (int kind = 0; kind < 2; kind++) {
                for (int rep = 0; rep < 6; rep++) {
                    fill_quantizer_input(t, n, kind, xf, &rng);
                    memset(out_a, 0x5A, bytes + 1);
                    memset(out_b, 0x5A, bytes + 1);
                    tt->from_float[KILN_SIMD_SCALAR](xf, out_a, n);
                    tt->from_float[level](xf, out_b, n);
                    size_t at = 0;
                    while (at < bytes && out_a[at] == out_b[at]) at++;
                    CHECK(at == bytes, "%s n=%lld kind=%d: byte %zu (block %zu, offset %zu): scalar %02x, %s %02x",
                          tt->name, (long long)n, kind, at, at / tt->type_size, at % tt->type_size, out_a[at],
                          kiln_simd_name(level), out_b[at]);
                    CHECK(out_b[bytes] == 0x5A, "%s n=%lld: wrote past the end", tt->name, (long long)n);
                }
            }
        }
    }
}

/* ---------------------------------------------------------------- vec_dot: within a bound */

/* A copy of block bytes whose dequantization is term by term at least as large as the terms the dots add:
 * Q4_1/Q5_1's x = d*q + m becomes |d|*q + |m|, Q4_K/Q5_K/Q2_K's d*sc*q - dmin*m becomes |d|*sc*q + |dmin|*m. The
 * other types are a single product per element, so |x| already is. */
static void magnitude_blocks(kiln_type t, const uint8_t *src, uint8_t *dst, size_t bytes) {
    memcpy(dst, src, bytes);
    const size_t ts = kiln_type_traits_get(t)->type_size;
    const size_t off = t == KILN_TYPE_Q2_K ? offsetof(block_q2_K, d) : 0; /* d, then dmin or m */
    for (size_t b = 0; b < bytes; b += ts) {
        kiln_fp16 d, m;
        memcpy(&d, dst + b + off, 2);
        memcpy(&m, dst + b + off + 2, 2);
        if (t == KILN_TYPE_Q4_1 || t == KILN_TYPE_Q5_1) d &= 0x7fff, m &= 0x7fff;
        else if (t == KILN_TYPE_Q4_K || t == KILN_TYPE_Q5_K || t == KILN_TYPE_Q2_K) d &= 0x7fff, m |= 0x8000;
        else return;
        memcpy(dst + b + off, &d, 2);
        memcpy(dst + b + off + 2, &m, 2);
    }
}

/* Bound: |simd - scalar| <= 1e-5 * M, M = sum |x_i*y_i| over the (magnitude-)dequantized operands. Integer
 * block sums are exact on both sides, so they differ only in float roundings, each at most 2^-24 of a partial
 * sum <= M. The longest chain here is AVX2 f32 at n = 1001: 31 fma steps per lane, 7 scalar tail adds, 2 to
 * merge 4 accumulators, 3 for the 8-lane tree: ~45 roundings, 2.7e-6 * M. Block types have <= 13 blocks, so
 * <= 13 steps plus 2 products per block and the lane tree; the oracle adds its own <= 3 per block in float
 * (f32/f16/bf16 sum in double). 1e-5 covers the sum with margin and still catches a dropped or doubled
 * block, which moves the result by ~M/13. */
static void check_dot(kiln_simd level) {
    unsigned long long rng = 0xd07 + level;
    for (int ti = 0; ti < COUNT(dot_types); ti++) {
        const kiln_type t = dot_types[ti];
        const kiln_type_traits *tt = kiln_type_traits_get(t);
        const kiln_type_traits *ty = kiln_type_traits_get(tt->vec_dot_type);
        CHECK(tt->vec_dot[level] != NULL, "%s has no %s vec_dot", tt->name, kiln_simd_name(level));
        for (int li = 0; li < n_lens(t); li++) {
            const int64_t n = elems_of(t, li);
            for (int rep = 0; rep < 10; rep++) {
                /* weights: random blocks (float types: normal data); activations: the pair type's quantizer */
                for (int64_t i = 0; i < n; i++) xf[i] = test_rng_normal(&rng), yf[i] = test_rng_normal(&rng);
                size_t xbytes;
                if (tt->is_quantized) xbytes = random_blocks(t, n, xb, &rng);
                else tt->from_float_ref(xf, xb, n), xbytes = (size_t)n * tt->type_size;
                ty->from_float_ref(yf, yb, n);
                float s_ref = NAN, s_simd = NAN;
                tt->vec_dot[KILN_SIMD_SCALAR](n, &s_ref, xb, yb);
                tt->vec_dot[level](n, &s_simd, xb, yb);
                magnitude_blocks(t, xb, xb2, xbytes);
                tt->to_float[KILN_SIMD_SCALAR](xb2, fa, n);
                ty->to_float[KILN_SIMD_SCALAR](yb, fb, n);
                double mag = 0.0;
                for (int64_t i = 0; i < n; i++) mag += fabs((double)fa[i] * fb[i]);
                const double err = fabs((double)s_simd - s_ref), bound = 1e-5 * mag + 1e-30;
                CHECK(err <= bound, "%s n=%lld rep=%d: scalar %.9g, %s %.9g, |diff| %.3g > bound %.3g (sum|xy| %.6g)",
                      tt->name, (long long)n, rep, s_ref, kiln_simd_name(level), s_simd, err, bound, mag);
            }
        }
    }
}

/* ---------------------------------------------------------------- per level */

#define LEVEL_TESTS(lvl, LEVEL)                                                            \
    static void test_##lvl##_to_float(void) {                                              \
        char why[128];                                                                     \
        if (level_missing(LEVEL, why, sizeof why)) SKIP("%s", why);                        \
        check_to_float(LEVEL);                                                             \
    }                                                                                      \
    static void test_##lvl##_from_float(void) {                                            \
        char why[128];                                                                     \
        if (level_missing(LEVEL, why, sizeof why)) SKIP("%s", why);                        \
        check_from_float(LEVEL);                                                           \
    }                                                                                      \
    static void test_##lvl##_vec_dot(void) {                                               \
        char why[128];                                                                     \
        if (level_missing(LEVEL, why, sizeof why)) SKIP("%s", why);                        \
        check_dot(LEVEL);                                                                  \
    }

LEVEL_TESTS(avx2, KILN_SIMD_AVX2)
LEVEL_TESTS(avx512, KILN_SIMD_AVX512)

int main(void) {
    RUN(test_avx2_to_float);
    RUN(test_avx2_from_float);
    RUN(test_avx2_vec_dot);
    RUN(test_avx512_to_float);
    RUN(test_avx512_from_float);
    RUN(test_avx512_vec_dot);
    TEST_EXIT();
}
