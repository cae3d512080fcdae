/* test_quants.c: the scalar reference block formats (src/core/quants_ref.c) checked on their own terms:
 * round-trip error of every weight quantizer on normal data (with bounds, and K-quants beating legacy ones),
 * edge inputs (zero, constant, outlier, tiny), the activation quantizers' invariants, and every vec_dot
 * against a double-precision dot of the dequantized operands. Bit-exactness against gguf-py is
 * tests/test_fixtures.c's job, except for Q5_0 (computed, never written, so it has no quantizer case above):
 * its vec_dot is checked on random blocks and its to_float at every SIMD level against the gguf-py fixture
 * q5_0.raw / q5_0.expected in tests/ref/dequant_fixtures.gguf. The low-bit types (Q5_1, Q2_K, Q3_K, IQ4_NL,
 * IQ4_XS) also go through the CPU backend's matmul at every level (test_matmul_low_bit). Set KILN_TEST_VERBOSE=1
 * to print the measured errors to stderr. */
#include "test.h"

#include "quants.h"
#include "cpu/ops_internal.h"
#include "cpu/simd.h"

#include <stdint.h>

/* A weight type with its scalar quantizer, and the activation type its vec_dot pairs it with. */
typedef struct {
    const char *name;
    kiln_type type;
    kiln_from_float_fn quantize;
    kiln_to_float_fn dequantize;
    kiln_type act_type;
    kiln_from_float_fn act_quantize;
    kiln_to_float_fn act_dequantize;
    kiln_vec_dot_fn vec_dot;
    /* Bound on RMS(dequant(quant(x)) - x) / RMS(x) for x ~ N(0,1), 64 rows x 4096. Each is ~20-30% above the
     * value measured when written (in the comment), so a worse quantizer fails and noise does not. */
    double max_rel_rms;
} wcase;

static const wcase cases[] = {
    {"f32", KILN_TYPE_F32, kiln_from_float_f32_ref, kiln_to_float_f32_ref, KILN_TYPE_F32, kiln_from_float_f32_ref,
     kiln_to_float_f32_ref, kiln_vec_dot_f32_ref, 0.0},
    {"f16", KILN_TYPE_F16, kiln_from_float_f16_ref, kiln_to_float_f16_ref, KILN_TYPE_F16, kiln_from_float_f16_ref,
     kiln_to_float_f16_ref, kiln_vec_dot_f16_ref, 2.6e-4}, /* measured 2.08e-4 */
    {"bf16", KILN_TYPE_BF16, kiln_from_float_bf16_ref, kiln_to_float_bf16_ref, KILN_TYPE_BF16,
     kiln_from_float_bf16_ref, kiln_to_float_bf16_ref, kiln_vec_dot_bf16_ref, 2.1e-3}, /* measured 1.66e-3 */
    {"q4_0", KILN_TYPE_Q4_0, kiln_quantize_q4_0_ref, kiln_to_float_q4_0_ref, KILN_TYPE_Q8_0,
     kiln_from_float_q8_0_ref, kiln_to_float_q8_0_ref, kiln_vec_dot_q4_0_q8_0_ref, 0.105}, /* measured 0.0860 */
    {"q4_1", KILN_TYPE_Q4_1, kiln_quantize_q4_1_ref, kiln_to_float_q4_1_ref, KILN_TYPE_Q8_1,
     kiln_from_float_q8_1_ref, kiln_to_float_q8_1_ref, kiln_vec_dot_q4_1_q8_1_ref, 0.095}, /* measured 0.0782 */
    {"q8_0", KILN_TYPE_Q8_0, kiln_from_float_q8_0_ref, kiln_to_float_q8_0_ref, KILN_TYPE_Q8_0,
     kiln_from_float_q8_0_ref, kiln_to_float_q8_0_ref, kiln_vec_dot_q8_0_q8_0_ref, 6.6e-3}, /* measured 5.35e-3 */
    {"q4_K", KILN_TYPE_Q4_K, kiln_quantize_q4_K_ref, kiln_to_float_q4_K_ref, KILN_TYPE_Q8_K,
     kiln_from_float_q8_K_ref, kiln_to_float_q8_K_ref, kiln_vec_dot_q4_K_q8_K_ref, 0.087}, /* measured 0.0708 */
    {"q5_K", KILN_TYPE_Q5_K, kiln_quantize_q5_K_ref, kiln_to_float_q5_K_ref, KILN_TYPE_Q8_K,
     kiln_from_float_q8_K_ref, kiln_to_float_q8_K_ref, kiln_vec_dot_q5_K_q8_K_ref, 0.043}, /* measured 0.0351 */
    {"q6_K", KILN_TYPE_Q6_K, kiln_quantize_q6_K_ref, kiln_to_float_q6_K_ref, KILN_TYPE_Q8_K,
     kiln_from_float_q8_K_ref, kiln_to_float_q8_K_ref, kiln_vec_dot_q6_K_q8_K_ref, 0.022}, /* measured 0.0177 */
    {"q5_1", KILN_TYPE_Q5_1, kiln_quantize_q5_1_ref, kiln_to_float_q5_1_ref, KILN_TYPE_Q8_1,
     kiln_from_float_q8_1_ref, kiln_to_float_q8_1_ref, kiln_vec_dot_q5_1_q8_1_ref, 0.046}, /* measured 0.0378 */
    {"q2_K", KILN_TYPE_Q2_K, kiln_quantize_q2_K_ref, kiln_to_float_q2_K_ref, KILN_TYPE_Q8_K,
     kiln_from_float_q8_K_ref, kiln_to_float_q8_K_ref, kiln_vec_dot_q2_K_q8_K_ref, 0.36}, /* measured 0.296 */
    {"q3_K", KILN_TYPE_Q3_K, kiln_quantize_q3_K_ref, kiln_to_float_q3_K_ref, KILN_TYPE_Q8_K,
     kiln_from_float_q8_K_ref, kiln_to_float_q8_K_ref, kiln_vec_dot_q3_K_q8_K_ref, 0.18}, /* measured 0.151 */
    {"iq4_nl", KILN_TYPE_IQ4_NL, kiln_quantize_iq4_nl_ref, kiln_to_float_iq4_nl_ref, KILN_TYPE_Q8_0,
     kiln_from_float_q8_0_ref, kiln_to_float_q8_0_ref, kiln_vec_dot_iq4_nl_q8_0_ref, 0.092}, /* measured 0.0761 */
    {"iq4_xs", KILN_TYPE_IQ4_XS, kiln_quantize_iq4_xs_ref, kiln_to_float_iq4_xs_ref, KILN_TYPE_Q8_K,
     kiln_from_float_q8_K_ref, kiln_to_float_q8_K_ref, kiln_vec_dot_iq4_xs_q8_K_ref, 0.093}, /* measured 0.0767 */
};
#define N_CASES (int)(sizeof cases / sizeof cases[0])

static const wcase *find_case(const char *name) {
    for (int i = 0; i < N_CASES; i++)
        if (strcmp(cases[i].name, name) == 0) return &cases[i];
    return NULL;
}

static bool verbose(void) {
    const char *v = getenv("KILN_TEST_VERBOSE");
    return v && *v && strcmp(v, "0") != 0;
}

/* ---------------------------------------------------------------- round-trip error */

#define RT_ROWS 64
#define RT_COLS 4096

/* RMS(dequant(quant(x)) - x) / RMS(x), quantizing row by row as a tensor is; -1 if out of memory. */
static double round_trip_error(const wcase *c, const float *x) {
    const size_t row_bytes = kiln_type_row_bytes(c->type, RT_COLS);
    uint8_t *q = malloc(row_bytes);
    float *y = malloc(RT_COLS * sizeof(float));
    double err = 0, ref = 0;
    if (!q || !y) {
        free(q), free(y);
        return -1;
    }
    for (int r = 0; r < RT_ROWS; r++) {
        const float *xr = x + (int64_t)r * RT_COLS;
        c->quantize(xr, q, RT_COLS);
        c->dequantize(q, y, RT_COLS);
        for (int i = 0; i < RT_COLS; i++) {
            err += ((double)y[i] - xr[i]) * ((double)y[i] - xr[i]);
            ref += (double)xr[i] * xr[i];
        }
    }
    free(q), free(y);
    return sqrt(err / ref);
}

static void test_round_trip_error(void) {
    float *x = malloc((size_t)RT_ROWS * RT_COLS * sizeof(float));
    CHECK(x != NULL);
    unsigned long long rng = 0x5eed0001;
    for (int64_t i = 0; i < (int64_t)RT_ROWS * RT_COLS; i++) x[i] = test_rng_normal(&rng);
    double err[N_CASES];
    for (int i = 0; i < N_CASES; i++) {
        err[i] = round_trip_error(&cases[i], x);
        if (verbose()) fprintf(stderr, "round trip %-5s rel rms error %.4g (bound %.4g)\n", cases[i].name, err[i], cases[i].max_rel_rms);
    }
    free(x);
    for (int i = 0; i < N_CASES; i++) {
        CHECK(err[i] >= 0, "%s: out of memory", cases[i].name);
        CHECK(err[i] <= cases[i].max_rel_rms, "%s: error %g over its bound %g", cases[i].name, err[i], cases[i].max_rel_rms);
    }
    /* more bits must buy less error, and K-quants must beat the legacy format of the same width */
    const char *order[][2] = {{"q4_K", "q4_0"}, {"q4_K", "q4_1"}, {"q5_K", "q4_K"}, {"q6_K", "q5_K"},
                              {"q8_0", "q6_K"}, {"bf16", "q8_0"}, {"f16", "bf16"}, {"q3_K", "q2_K"},
                              {"q4_K", "q3_K"}, {"q5_1", "q4_1"}, {"iq4_nl", "q4_0"}, {"iq4_xs", "q3_K"}};
    for (size_t i = 0; i < sizeof order / sizeof order[0]; i++) {
        const int a = (int)(find_case(order[i][0]) - cases), b = (int)(find_case(order[i][1]) - cases);
        CHECK(err[a] < err[b], "%s error %g is not below %s error %g", order[i][0], err[a], order[i][1], err[b]);
    }
}

/* ---------------------------------------------------------------- edge inputs */

#define EDGE_N 512 /* two super-blocks: a whole number of blocks of every type */

/* Quantizes and dequantizes x[EDGE_N] with c; false (and a message in why) if anything is not finite. */
static bool edge_round_trip(const wcase *c, const float *x, float *y, char *why, size_t why_size) {
    uint8_t q[EDGE_N * 4];
    for (int i = 0; i < EDGE_N; i++) y[i] = NAN;
    c->quantize(x, q, EDGE_N);
    c->dequantize(q, y, EDGE_N);
    for (int i = 0; i < EDGE_N; i++) {
        if (!isfinite(y[i])) {
            snprintf(why, why_size, "%s: element %d of input %g came back %g", c->name, i, x[i], y[i]);
            return false;
        }
    }
    return true;
}

/* NaN and inf inputs: every quantizer must stay free of undefined behaviour (the legacy ones cast NaN to int and
 * shifted the negative code left: UBSan aborts the SAN=1 build there), and the blocks holding only finite values
 * must come out as they do alone, since blocks are independent. kiln quantize refuses such weights; this is the
 * quantizers' own contract for any input. */
static void test_edge_non_finite(void) {
    const float specials[] = {NAN, INFINITY, -INFINITY, 3e38f};
    const int where[] = {0, 7, 31, 300};
    unsigned long long rng = 0x5eed0005;
    float clean[EDGE_N], x[EDGE_N];
    for (int i = 0; i < EDGE_N; i++) clean[i] = test_rng_normal(&rng);
    for (int c = 0; c < N_CASES; c++) {
        const size_t bytes = kiln_type_row_bytes(cases[c].type, EDGE_N), bb = kiln_type_block_bytes(cases[c].type);
        const int64_t blk = kiln_type_block_size(cases[c].type);
        uint8_t q_clean[EDGE_N * 4], q[EDGE_N * 4];
        cases[c].quantize(clean, q_clean, EDGE_N);
        for (size_t s = 0; s < sizeof specials / sizeof specials[0]; s++)
            for (size_t w = 0; w < sizeof where / sizeof where[0]; w++) {
                memcpy(x, clean, sizeof x);
                x[where[w]] = specials[s];
                x[EDGE_N - 1 - where[w]] = -specials[s];
                cases[c].quantize(x, q, EDGE_N);
                for (size_t b = 0; b < bytes / bb; b++) {
                    const int64_t lo = (int64_t)b * blk, hi = lo + blk;
                    const bool touched = (where[w] >= lo && where[w] < hi) || (EDGE_N - 1 - where[w] >= lo && EDGE_N - 1 - where[w] < hi);
                    CHECK(touched || memcmp(q + b * bb, q_clean + b * bb, bb) == 0, "%s: block %zu changed by a %g at %d",
                          cases[c].name, b, specials[s], where[w]);
                }
            }
    }
}

static void test_edge_all_zero(void) {
    float x[EDGE_N] = {0}, y[EDGE_N];
    char why[160];
    for (int i = 0; i < N_CASES; i++) {
        CHECK(edge_round_trip(&cases[i], x, y, why, sizeof why), "%s", why);
        for (int j = 0; j < EDGE_N; j++) CHECK(y[j] == 0.0f, "%s: zero input came back %g at %d", cases[i].name, y[j], j);
    }
}

static void test_edge_constant(void) {
    /* a constant must come back within one f16 rounding of the scale (2^-11), times a little slack */
    const float consts[] = {0.375f, -2.5f, 0.75f, -7e3f};
    float x[EDGE_N], y[EDGE_N];
    char why[160];
    for (size_t k = 0; k < sizeof consts / sizeof consts[0]; k++) {
        for (int j = 0; j < EDGE_N; j++) x[j] = consts[k];
        for (int i = 0; i < N_CASES; i++) {
            CHECK(edge_round_trip(&cases[i], x, y, why, sizeof why), "%s", why);
            for (int j = 0; j < EDGE_N; j++)
                CHECK(fabsf(y[j] - x[j]) <= 2e-3f * fabsf(x[j]), "%s: constant %g came back %g at %d", cases[i].name, x[j], y[j], j);
        }
    }
}

static void test_edge_outlier(void) {
    /* one element at 1000 sigma in each super-block: it must come back within 2%, and nothing else blow up */
    float x[EDGE_N], y[EDGE_N];
    char why[160];
    unsigned long long rng = 0x5eed0002;
    for (int j = 0; j < EDGE_N; j++) x[j] = test_rng_normal(&rng);
    x[37] = 1000.0f, x[256 + 200] = -1000.0f;
    for (int i = 0; i < N_CASES; i++) {
        CHECK(edge_round_trip(&cases[i], x, y, why, sizeof why), "%s", why);
        for (int j = 0; j < EDGE_N; j++) {
            if (fabsf(x[j]) == 1000.0f)
                CHECK(fabsf(y[j] - x[j]) <= 20.0f, "%s: outlier %g came back %g", cases[i].name, x[j], y[j]);
            else
                CHECK(fabsf(y[j]) <= 1000.0f, "%s: %g next to the outlier came back %g", cases[i].name, x[j], y[j]);
        }
    }
}

static void test_edge_tiny(void) {
    /* below the smallest f16 scale: every block type that scales by f16 flushes to (near) zero, never NaN.
     * 1e-40 is a float subnormal, where 1/d overflows. Exact zeros stay zero. */
    const float scales[] = {1e-30f, 1e-38f, 1e-40f};
    float x[EDGE_N], y[EDGE_N];
    char why[160];
    for (size_t k = 0; k < sizeof scales / sizeof scales[0]; k++) {
        unsigned long long rng = 0x5eed0003;
        for (int j = 0; j < EDGE_N; j++) x[j] = j % 7 == 0 ? 0.0f : test_rng_normal(&rng) * scales[k];
        for (int i = 0; i < N_CASES; i++) {
            CHECK(edge_round_trip(&cases[i], x, y, why, sizeof why), "%s", why);
            for (int j = 0; j < EDGE_N; j++) {
                CHECK(fabsf(y[j] - x[j]) <= 10.0f * scales[k], "%s: tiny %g came back %g", cases[i].name, x[j], y[j]);
                if (x[j] == 0.0f)
                    CHECK(y[j] == 0.0f, "%s: zero next to %g came back %g", cases[i].name, scales[k], y[j]);
            }
        }
    }
}

/* ---------------------------------------------------------------- activation quantizers */

static void test_activation_invariants(void) {
    enum { N = 1024 };
    float x[N];
    unsigned long long rng = 0x5eed0004;
    for (int i = 0; i < N; i++) x[i] = test_rng_normal(&rng) * (i < 512 ? 1.0f : 0.05f);
    x[300] = -9.0f; /* a negative extreme: Q8_K maps it to exactly -127 */

    block_q8_0 b0[N / QK8_0];
    kiln_from_float_q8_0_ref(x, b0, N);
    for (int i = 0; i < N / QK8_0; i++) {
        int amax = 0;
        for (int j = 0; j < QK8_0; j++) amax = abs(b0[i].qs[j]) > amax ? abs(b0[i].qs[j]) : amax;
        CHECK(amax == 127, "q8_0 block %d: largest |q| is %d, not 127", i, amax);
    }

    block_q8_1 b1[N / QK8_1];
    kiln_from_float_q8_1_ref(x, b1, N);
    for (int i = 0; i < N / QK8_1; i++) {
        int sum = 0;
        for (int j = 0; j < QK8_1; j++) sum += b1[i].qs[j];
        CHECK(memcmp(b1[i].qs, b0[i].qs, QK8_1) == 0 && b1[i].d == b0[i].d, "q8_1 block %d: codes differ from q8_0", i);
        const float s = kiln_fp16_to_f32(b1[i].s), ds = kiln_fp16_to_f32(b1[i].d) * (float)sum;
        CHECK(fabsf(s - ds) <= 2e-3f * fabsf(ds) + 1e-7f, "q8_1 block %d: s %g is not d*sum(q) %g", i, s, ds);
    }

    block_q8_K bk[N / QK_K];
    kiln_from_float_q8_K_ref(x, bk, N);
    for (int i = 0; i < N / QK_K; i++) {
        int amax = 0;
        for (int j = 0; j < QK_K; j++) amax = abs(bk[i].qs[j]) > amax ? abs(bk[i].qs[j]) : amax;
        CHECK(amax == 127, "q8_K block %d: largest |q| is %d", i, amax);
        for (int j = 0; j < QK_K / 16; j++) {
            int sum = 0;
            for (int l = 0; l < 16; l++) sum += bk[i].qs[16 * j + l];
            CHECK(bk[i].bsums[j] == sum, "q8_K block %d: bsums[%d] = %d, codes sum to %d", i, j, bk[i].bsums[j], sum);
        }
    }
    CHECK(bk[1].qs[300 - 256] == -127 && bk[1].d > 0, "q8_K: the signed extreme maps to %d", bk[1].qs[300 - 256]);

    /* all-zero block: d = 0, codes and bsums 0 (GGML leaves bsums unwritten) */
    float z[QK_K] = {0};
    block_q8_K bz;
    memset(&bz, 0x55, sizeof bz);
    kiln_from_float_q8_K_ref(z, &bz, QK_K);
    CHECK(bz.d == 0.0f);
    for (int j = 0; j < QK_K; j++) CHECK(bz.qs[j] == 0);
    for (int j = 0; j < QK_K / 16; j++) CHECK(bz.bsums[j] == 0);
}

/* Quantize then dequantize then quantize again gives the same bytes: the dequantized values sit on the grid. */
static void test_requantize_stable(void) {
    const char *names[] = {"q8_0", "q4_0", "f16", "bf16"};
    enum { N = 4096 };
    static float x[N], y[N];
    static uint8_t q1[N * 4], q2[N * 4];
    unsigned long long rng = 0x5eed0005;
    for (int i = 0; i < N; i++) x[i] = test_rng_normal(&rng);
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        const wcase *c = find_case(names[k]);
        const size_t nb = kiln_type_row_bytes(c->type, N);
        c->quantize(x, q1, N);
        c->dequantize(q1, y, N);
        c->quantize(y, q2, N);
        CHECK(memcmp(q1, q2, nb) == 0, "%s: requantizing its own output changed it", c->name);
    }
}

/* ---------------------------------------------------------------- vec_dot */

/* The double-precision dot vec_dot must reproduce: sum of dequant(w)*dequant(a). For Q4_1 the min term uses
 * Q8_1's s, which is d*sum(q) with the unrounded d, so the oracle adds m*(s - sum of the block's dequantized
 * activations), the part GGML's dot defines differently from the dequantized values (Q5_1 likewise). *mag gets
 * sum|w*a|. */
static double reference_dot(const wcase *c, int64_t n, const float *w, const float *a, const void *wq, const void *aq,
                            double *mag) {
    double dot = 0, m = 0;
    for (int64_t i = 0; i < n; i++) {
        dot += (double)w[i] * a[i];
        m += fabs((double)w[i] * a[i]);
    }
    if (c->type == KILN_TYPE_Q4_1 || c->type == KILN_TYPE_Q5_1) { /* Q5_1 likewise: m at the same offset */
        static_assert(offsetof(block_q4_1, m) == offsetof(block_q5_1, m), "m offsets");
        const size_t bb = kiln_type_block_bytes(c->type);
        const block_q8_1 *ba = aq;
        for (int64_t b = 0; b < n / QK4_1; b++) {
            double sa = 0;
            for (int j = 0; j < QK4_1; j++) sa += a[b * QK4_1 + j];
            kiln_fp16 mh;
            memcpy(&mh, (const uint8_t *)wq + (size_t)b * bb + offsetof(block_q4_1, m), 2);
            const double mw = kiln_fp16_to_f32(mh), s = kiln_fp16_to_f32(ba[b].s);
            dot += mw * (s - sa);
            m += fabs(mw * s);
        }
    }
    *mag = m;
    return dot;
}

/* Checks c's vec_dot on weights wq and activations aq (n elements, already quantized). */
static bool check_vec_dot(const wcase *c, int64_t n, const void *wq, const void *aq, float *w, float *a, char *why,
                          size_t why_size) {
    c->dequantize(wq, w, n);
    c->act_dequantize(aq, a, n);
    double mag;
    const double want = reference_dot(c, n, w, a, wq, aq, &mag);
    float got = NAN;
    c->vec_dot(n, &got, wq, aq);
    /* float accumulation over n/32 blocks at most: well inside 1e-5 of sum|w*a| for n <= 4096 */
    if (!(fabs(got - want) <= 1e-5 * mag + 1e-30)) {
        snprintf(why, why_size, "%s: vec_dot %.9g, dequantized dot %.9g (|diff| %.3g, sum|wa| %.3g, n %lld)", c->name,
                 got, want, fabs(got - want), mag, (long long)n);
        return false;
    }
    return true;
}

static void test_vec_dot_quantized(void) {
    enum { N = 4096, ROWS = 8 };
    static float xw[N], xa[N], w[N], a[N];
    static uint8_t wq[N * 4], aq[N * 4];
    char why[256];
    unsigned long long rng = 0x5eed0006;
    for (int i = 0; i < N_CASES; i++) {
        const wcase *c = &cases[i];
        for (int r = 0; r < ROWS; r++) {
            /* rows at different magnitudes; the row length steps down to a single block */
            const float sw = ldexpf(1.0f, 3 * r - 12), sa = ldexpf(1.0f, 5 - 2 * r);
            const int64_t n = r == ROWS - 1 ? 256 : N;
            for (int64_t j = 0; j < n; j++) xw[j] = test_rng_normal(&rng) * sw, xa[j] = test_rng_normal(&rng) * sa;
            c->quantize(xw, wq, n);
            c->act_quantize(xa, aq, n);
            CHECK(check_vec_dot(c, n, wq, aq, w, a, why, sizeof why), "%s", why);
        }
    }
}

/* Random bytes for n blocks of a quantized type, with every f16 scale a finite half of random sign and magnitude
 * 2^-8..2^2: codes and 6-bit scales cover values the quantizers rarely write (e.g. Q6_K's positive sub-scales). */
/* A finite half of random sign and magnitude 2^-8..2^2. */
static kiln_fp16 random_half(unsigned long long *rng) {
    const float sign = test_rng_f32(rng) < 0 ? -1.0f : 1.0f;
    const int e = (int)(test_rng_next(rng) % 11) - 8;
    return kiln_f32_to_fp16(ldexpf(sign, e) * (1.0f + 0.5f * test_rng_f32(rng)));
}

/* Random bytes for n blocks of a quantized type, every f16 scale then made a random_half: codes and 6-bit
 * scales cover values the quantizers rarely write (Q6_K's positive sub-scales, every 6-bit min). */
static void random_blocks(kiln_type t, void *buf, int64_t n, unsigned long long *rng) {
    const size_t bytes = kiln_type_row_bytes(t, n * kiln_type_block_size(t));
    uint8_t *p = buf;
    for (size_t i = 0; i < bytes; i++) p[i] = (uint8_t)(test_rng_next(rng) >> 56);
    for (int64_t b = 0; b < n; b++) {
        switch (t) {
        case KILN_TYPE_Q4_0: ((block_q4_0 *)buf)[b].d = random_half(rng); break;
        case KILN_TYPE_Q5_0: ((block_q5_0 *)buf)[b].d = random_half(rng); break;
        case KILN_TYPE_Q4_1: ((block_q4_1 *)buf)[b].d = random_half(rng), ((block_q4_1 *)buf)[b].m = random_half(rng); break;
        case KILN_TYPE_Q8_0: ((block_q8_0 *)buf)[b].d = random_half(rng); break;
        case KILN_TYPE_Q4_K: ((block_q4_K *)buf)[b].d = random_half(rng), ((block_q4_K *)buf)[b].dmin = random_half(rng); break;
        case KILN_TYPE_Q5_K: ((block_q5_K *)buf)[b].d = random_half(rng), ((block_q5_K *)buf)[b].dmin = random_half(rng); break;
        case KILN_TYPE_Q6_K: ((block_q6_K *)buf)[b].d = random_half(rng); break;
        case KILN_TYPE_Q5_1: ((block_q5_1 *)buf)[b].d = random_half(rng), ((block_q5_1 *)buf)[b].m = random_half(rng); break;
        case KILN_TYPE_Q2_K: ((block_q2_K *)buf)[b].d = random_half(rng), ((block_q2_K *)buf)[b].dmin = random_half(rng); break;
        case KILN_TYPE_Q3_K: ((block_q3_K *)buf)[b].d = random_half(rng); break;
        case KILN_TYPE_IQ4_NL: ((block_iq4_nl *)buf)[b].d = random_half(rng); break;
        case KILN_TYPE_IQ4_XS: ((block_iq4_xs *)buf)[b].d = random_half(rng); break;
        default: break;
        }
    }
}

/* Every 2-bit code, hmask bit, 4/6-bit scale and IQ4 index appears in 2048 random elements of each type. */
static void test_vec_dot_random_blocks(void) {
    const char *names[] = {"q4_0", "q4_1", "q8_0", "q4_K", "q5_K", "q6_K", "q5_1", "q2_K", "q3_K", "iq4_nl", "iq4_xs"};
    enum { N = 2048 };
    static float xa[N], w[N], a[N];
    static uint8_t wq[N * 4], aq[N * 4];
    char why[256];
    unsigned long long rng = 0x5eed0007;
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        const wcase *c = find_case(names[k]);
        for (int r = 0; r < 4; r++) {
            random_blocks(c->type, wq, N / kiln_type_block_size(c->type), &rng);
            for (int j = 0; j < N; j++) xa[j] = test_rng_normal(&rng);
            c->act_quantize(xa, aq, N);
            CHECK(check_vec_dot(c, N, wq, aq, w, a, why, sizeof why), "%s", why);
        }
    }
}

/* Q5_0 has no weight quantizer, so it is not in cases[]; its vec_dot is checked on random blocks only, every
 * code 0..31 and every qh bit pattern appearing (2048 / 32 = 64 blocks of random bytes, 4 rows). */
static void test_vec_dot_q5_0(void) {
    static const wcase q5_0 = {"q5_0", KILN_TYPE_Q5_0, NULL, kiln_to_float_q5_0_ref, KILN_TYPE_Q8_0,
                               kiln_from_float_q8_0_ref, kiln_to_float_q8_0_ref, kiln_vec_dot_q5_0_q8_0_ref, 0.0};
    enum { N = 2048 };
    static float xa[N], w[N], a[N];
    static uint8_t wq[N * 4], aq[N * 4];
    char why[256];
    unsigned long long rng = 0x5eed0008;
    for (int r = 0; r < 4; r++) {
        random_blocks(KILN_TYPE_Q5_0, wq, N / QK5_0, &rng);
        for (int j = 0; j < N; j++) xa[j] = test_rng_normal(&rng);
        q5_0.act_quantize(xa, aq, N);
        CHECK(check_vec_dot(&q5_0, N, wq, aq, w, a, why, sizeof why), "%s", why);
    }
}

/* Q5_0 to_float at every level this CPU has, bit for bit against gguf-py's dequantize (the fixture is 2 rows
 * of 3 random blocks, one with d = 0 and one with a subnormal d; gen_dequant_fixtures.py writes it). */
static void test_q5_0_gguf_fixture(void) {
    const char *path = "tests/ref/dequant_fixtures.gguf";
    kiln_gguf *g = NULL;
    kiln_status st = kiln_gguf_open(path, &g);
    CHECK(st == KILN_OK, "%s: %s (run from the repo root)", path, kiln_last_error());
    const kiln_tensor_view *raw = kiln_gguf_find_tensor(g, "q5_0.raw"), *exp = kiln_gguf_find_tensor(g, "q5_0.expected");
    CHECK(raw && exp && raw->type == KILN_TYPE_Q5_0 && exp->type == KILN_TYPE_F32, "%s: no q5_0.raw (Q5_0) / "
          "q5_0.expected (F32); regenerate with tests/ref/gen_dequant_fixtures.py", path);
    const int64_t n = raw->ne[0] * raw->ne[1];
    CHECK(n % QK5_0 == 0 && exp->nbytes == (size_t)n * sizeof(float), "q5_0 fixture shapes disagree");
    static float got[1024 + 1];
    CHECK(n <= 1024, "q5_0 fixture has %lld elements, more than this test's buffer", (long long)n);
    const float *want = exp->data;
    for (int level = KILN_SIMD_SCALAR; level <= (int)kiln_simd_best(); level++) {
        got[n] = 12345.0f;
        kiln_get_to_float(KILN_TYPE_Q5_0, (kiln_simd)level)(raw->data, got, n);
        for (int64_t i = 0; i < n; i++)
            CHECK(kiln_f32_bits(got[i]) == kiln_f32_bits(want[i]), "q5_0 %s element %lld (block %lld): got %.9g, gguf-py %.9g",
                  kiln_simd_name((kiln_simd)level), (long long)i, (long long)(i / QK5_0), got[i], want[i]);
        CHECK(got[n] == 12345.0f, "q5_0 %s wrote past the end", kiln_simd_name((kiln_simd)level));
        if (verbose()) fprintf(stderr, "q5_0 %s: %lld floats bit-exact with gguf-py\n", kiln_simd_name((kiln_simd)level), (long long)n);
    }
    kiln_gguf_close(g);
}

/* ---------------------------------------------------------------- the CPU backend's matmul */

/* The low-bit types through kiln_cpu_ops.matmul_forward, the path of every weight in prefill (T > 1, token tiles)
 * and decode (T = 1, rows split across threads), at every SIMD level this CPU has, on 2 threads: each output
 * against a double dot over the dequantized weights and the float activations. The activations are quantized to
 * Q8 first, which costs ~1e-3 of sum|w x| for every block type (tests/test_ops.c's bound for the others is 3e-3,
 * the same here); measured worst over the five types at scalar and AVX2: 1.33e-3. */
static void test_matmul_low_bit(void) {
    static const kiln_type types[] = {KILN_TYPE_Q5_1, KILN_TYPE_Q2_K, KILN_TYPE_Q3_K, KILN_TYPE_IQ4_NL, KILN_TYPE_IQ4_XS};
    static const int64_t Ts[] = {1, 5, 17};
    enum { I = 1024, O = 70, TMAX = 17 };
    const double bound = 3e-3;
    kiln_pool *pool = NULL;
    CHECK(kiln_pool_create(2, &pool) == KILN_OK, "pool: %s", kiln_last_error());
    float *x = malloc((size_t)TMAX * I * sizeof *x), *deq = malloc((size_t)O * I * sizeof *deq);
    float *y = malloc((size_t)TMAX * O * sizeof *y), *row = malloc((size_t)I * sizeof *row);
    CHECK(x && deq && y && row, "out of memory");
    unsigned long long rng = 0x5eed0009;
    for (int64_t i = 0; i < (int64_t)TMAX * I; i++) x[i] = test_rng_normal(&rng);
    double worst = 0;
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const kiln_type t = types[ti];
        const kiln_type_traits *tt = kiln_type_traits_get(t);
        const size_t rb = kiln_type_row_bytes(t, I);
        uint8_t *w = malloc(rb * O);
        CHECK(w != NULL, "out of memory");
        for (int64_t o = 0; o < O; o++) {
            for (int64_t i = 0; i < I; i++) row[i] = test_rng_normal(&rng) * 0.02f;
            tt->from_float_ref(row, w + (size_t)o * rb, I);
            tt->to_float[KILN_SIMD_SCALAR](w + (size_t)o * rb, deq + o * I, I);
        }
        const kiln_tensor_view W = {.name = "w", .type = t, .n_dims = 2, .ne = {I, O, 1, 1},
                                    .nb = {tt->type_size, rb, rb * O, rb * O}, .nbytes = rb * O, .data = w};
        for (int level = KILN_SIMD_SCALAR; level <= (int)kiln_simd_best(); level++) {
            kiln_cpu_ops_force_level((kiln_simd)level);
            for (size_t k = 0; k < sizeof Ts / sizeof Ts[0]; k++) {
                const int64_t T = Ts[k];
                const size_t bytes = kiln_cpu_ops.scratch_size(T, I, 8, 1, kiln_pool_size(pool));
                kiln_ops_ctx ctx = {.pool = pool, .scratch = malloc(bytes), .scratch_bytes = bytes};
                CHECK(ctx.scratch != NULL, "out of memory");
                for (int64_t i = 0; i < T * O; i++) y[i] = NAN;
                kiln_cpu_ops.matmul_forward(&ctx, y, x, &W, T);
                free(ctx.scratch);
                for (int64_t tk = 0; tk < T; tk++)
                    for (int64_t o = 0; o < O; o++) {
                        double dot = 0, norm = 0;
                        for (int64_t i = 0; i < I; i++) {
                            dot += (double)deq[o * I + i] * x[tk * I + i];
                            norm += fabs((double)deq[o * I + i] * x[tk * I + i]);
                        }
                        const double err = fabs(y[tk * O + o] - dot) / norm;
                        if (err > worst) worst = err;
                        CHECK(err <= bound, "%s %s T %lld: y[%lld][%lld] %g, dequantized dot %g (%.3g of sum|wx|)",
                              tt->name, kiln_simd_name((kiln_simd)level), (long long)T, (long long)tk, (long long)o,
                              y[tk * O + o], dot, err);
                    }
            }
        }
        free(w);
    }
    kiln_cpu_ops_force_level(kiln_simd_best());
    if (verbose()) fprintf(stderr, "matmul low-bit types: worst %.3g of sum|wx| (bound %g)\n", worst, bound);
    free(x), free(deq), free(y), free(row);
    kiln_pool_free(pool);
}

/* The load-time finite check (src/core/finite.c) reads each new type's f16 scales: an inf or NaN in any of them
 * is refused naming the block and the field, and the clean tensor passes. */
static void test_check_finite_low_bit(void) {
    static const struct { kiln_type type; size_t offset; const char *field; } fields[] = {
        {KILN_TYPE_Q5_1, offsetof(block_q5_1, d), "scale"},   {KILN_TYPE_Q5_1, offsetof(block_q5_1, m), "min"},
        {KILN_TYPE_Q2_K, offsetof(block_q2_K, d), "scale"},   {KILN_TYPE_Q2_K, offsetof(block_q2_K, dmin), "dmin"},
        {KILN_TYPE_Q3_K, offsetof(block_q3_K, d), "scale"},   {KILN_TYPE_IQ4_NL, offsetof(block_iq4_nl, d), "scale"},
        {KILN_TYPE_IQ4_XS, offsetof(block_iq4_xs, d), "scale"},
    };
    enum { N = 1024 };
    static float x[N];
    static uint8_t q[N * 2];
    unsigned long long rng = 0x5eed000a;
    for (int i = 0; i < N; i++) x[i] = test_rng_normal(&rng);
    for (size_t k = 0; k < sizeof fields / sizeof fields[0]; k++) {
        const kiln_type_traits *tt = kiln_type_traits_get(fields[k].type);
        tt->from_float_ref(x, q, N);
        const size_t nbytes = kiln_type_row_bytes(fields[k].type, N);
        const kiln_tensor_view v = {.name = "w", .type = fields[k].type, .n_dims = 1, .ne = {N, 1, 1, 1},
                                    .nb = {tt->type_size, nbytes, nbytes, nbytes}, .nbytes = nbytes, .data = q};
        CHECK(kiln_tensor_check_finite("f.gguf", &v) == KILN_OK, "%s: clean tensor refused: %s", tt->name, kiln_last_error());
        const int64_t blk = N / tt->blck_size - 1; /* the last block */
        const kiln_fp16 inf = 0x7c00;
        memcpy(q + (size_t)blk * tt->type_size + fields[k].offset, &inf, 2);
        CHECK(kiln_tensor_check_finite("f.gguf", &v) == KILN_ERR_FORMAT, "%s: inf %s not refused", tt->name, fields[k].field);
        char want[96];
        snprintf(want, sizeof want, "block %lld has %s inf", (long long)blk, fields[k].field);
        CHECK(strstr(kiln_last_error(), want) != NULL, "%s: message '%s' lacks '%s'", tt->name, kiln_last_error(), want);
    }
}

int main(void) {
    RUN(test_round_trip_error);
    RUN(test_edge_non_finite);
    RUN(test_edge_all_zero);
    RUN(test_edge_constant);
    RUN(test_edge_outlier);
    RUN(test_edge_tiny);
    RUN(test_activation_invariants);
    RUN(test_requantize_stable);
    RUN(test_vec_dot_quantized);
    RUN(test_vec_dot_random_blocks);
    RUN(test_vec_dot_q5_0);
    RUN(test_q5_0_gguf_fixture);
    RUN(test_matmul_low_bit);
    RUN(test_check_finite_low_bit);
    TEST_EXIT();
}
