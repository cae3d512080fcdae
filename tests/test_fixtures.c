/* test_fixtures.c: kiln's block formats against an independent oracle, the numpy code of the PyPI gguf package.
 * tests/ref/dequant_fixtures.gguf (made by tests/ref/gen_dequant_fixtures.py) holds, per type T, random raw
 * blocks T.raw with gguf's dequantization T.expected, and for types gguf can quantize, T.quant_in with gguf's
 * T.quant_out (for Q2_K, Q3_K, IQ4_NL and IQ4_XS, which gguf cannot quantize, llama.cpp's C quantizers' output). Every SIMD level up to kiln_simd_best() must reproduce T.expected bit for bit (NaN matches any
 * NaN), whole tensor and row by row, and the scalar reference quantizer must reproduce T.quant_out byte for
 * byte. tests/ref/type_sizes.txt is gguf's GGML_QUANT_SIZES table, checked against types.c. Run from the
 * repo root. */
#include "kiln.h"
#include "quants.h"
#include "cpu/simd.h"
#include "test.h"

#include <strings.h>

#define FIXTURE_PATH "tests/ref/dequant_fixtures.gguf"
#define TYPE_SIZES_PATH "tests/ref/type_sizes.txt"

/* Types gguf.quants dequantizes (gguf 0.19.0 has no Q8_1 or Q8_K dequantizer) and quantizes. */
#define DEQUANT_TYPES(X) \
    X(f16, KILN_TYPE_F16) X(bf16, KILN_TYPE_BF16) X(q4_0, KILN_TYPE_Q4_0) X(q4_1, KILN_TYPE_Q4_1) \
    X(q8_0, KILN_TYPE_Q8_0) X(q4_K, KILN_TYPE_Q4_K) X(q5_K, KILN_TYPE_Q5_K) X(q6_K, KILN_TYPE_Q6_K) \
    X(q5_1, KILN_TYPE_Q5_1) X(q2_K, KILN_TYPE_Q2_K) X(q3_K, KILN_TYPE_Q3_K) X(iq4_nl, KILN_TYPE_IQ4_NL) \
    X(iq4_xs, KILN_TYPE_IQ4_XS)
/* Q5_1's quant_out is gguf's; Q2_K, Q3_K, IQ4_NL and IQ4_XS's are llama.cpp's ggml-quants.c (gguf-py has no
 * quantizer for them): tests/ref/ggml_quant_oracle.c. */
#define QUANT_TYPES(X) \
    X(f16, KILN_TYPE_F16) X(bf16, KILN_TYPE_BF16) X(q4_0, KILN_TYPE_Q4_0) X(q4_1, KILN_TYPE_Q4_1) \
    X(q8_0, KILN_TYPE_Q8_0) X(q5_1, KILN_TYPE_Q5_1) X(q2_K, KILN_TYPE_Q2_K) X(q3_K, KILN_TYPE_Q3_K) \
    X(iq4_nl, KILN_TYPE_IQ4_NL) X(iq4_xs, KILN_TYPE_IQ4_XS)

#define CANARY 0x7fa5a5a5u /* a signalling NaN no to_float writes: marks floats past k */
#define N_CANARY 16

static kiln_gguf *fixtures;    /* opened once in main */
static char open_error[512];

static int64_t n_elements(const kiln_tensor_view *v) { return v->ne[0] * v->ne[1] * v->ne[2] * v->ne[3]; }

static bool is_nan_bits(uint32_t u) { return (u & 0x7fffffffu) > 0x7f800000u; }

/* Finds NAME.SUFFIX of type t; returns NULL and sets msg when it is missing or of another type. */
static const kiln_tensor_view *fixture_tensor(const char *name, const char *suffix, kiln_type t, char *msg, size_t cap) {
    char full[128];
    snprintf(full, sizeof full, "%s.%s", name, suffix);
    const kiln_tensor_view *v = kiln_gguf_find_tensor(fixtures, full);
    if (!v)
        snprintf(msg, cap, "%s: no tensor '%s'", FIXTURE_PATH, full);
    else if (v->type != t)
        snprintf(msg, cap, "%s: tensor '%s' is %s, want %s", FIXTURE_PATH, full, kiln_type_name(v->type), kiln_type_name(t));
    else
        return v;
    return NULL;
}

/* Compares got[0..k) with want[0..k) (floats as bits, NaN matching any NaN) and checks the canary after got[k).
 * Returns the number of mismatches and describes the first in msg. */
static int64_t compare_floats(const float *got, const float *want, int64_t k, int64_t blck, char *msg, size_t cap) {
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < k; i++) {
        uint32_t g = kiln_f32_bits(got[i]), w = kiln_f32_bits(want[i]);
        if (g == w || (is_nan_bits(g) && is_nan_bits(w))) continue;
        if (first < 0) first = i;
        bad++;
    }
    if (first >= 0)
        snprintf(msg, cap, "%lld of %lld floats differ; first at element %lld (block %lld, index %lld in block): "
                 "got %.9g (0x%08x), want %.9g (0x%08x)", (long long)bad, (long long)k, (long long)first,
                 (long long)(first / blck), (long long)(first % blck), got[first], kiln_f32_bits(got[first]),
                 want[first], kiln_f32_bits(want[first]));
    for (int i = 0; i < N_CANARY; i++)
        if (kiln_f32_bits(got[k + i]) != CANARY) {
            snprintf(msg, cap, "wrote past k = %lld: float %lld after the end is 0x%08x", (long long)k, (long long)i,
                     kiln_f32_bits(got[k + i]));
            return bad + 1;
        }
    return bad;
}

static void fill_canary(float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = kiln_bits_f32(CANARY);
}

/* ---------------------------------------------------------------- dequantization */

static void check_dequant(const char *name, kiln_type t) {
    char msg[512] = "";
    CHECK(fixtures != NULL, "%s", open_error);
    const kiln_tensor_view *raw = fixture_tensor(name, "raw", t, msg, sizeof msg);
    CHECK(raw != NULL, "%s", msg);
    const kiln_tensor_view *exp = fixture_tensor(name, "expected", KILN_TYPE_F32, msg, sizeof msg);
    CHECK(exp != NULL, "%s", msg);
    const int64_t n = n_elements(raw), row = raw->ne[0], blck = kiln_type_block_size(t);
    CHECK(n == n_elements(exp) && row == exp->ne[0], "%s.raw and %s.expected differ in shape", name, name);
    CHECK(exp->nbytes == (size_t)n * sizeof(float), "%s.expected is %zu bytes for %lld floats", name, exp->nbytes, (long long)n);
    CHECK(row % blck == 0 && n % row == 0, "%s.raw rows of %lld are not whole blocks of %lld", name, (long long)row, (long long)blck);

    float *want = malloc((size_t)n * sizeof(float));
    float *got = malloc((size_t)(n + N_CANARY) * sizeof(float));
    CHECK(want && got, "out of memory");
    memcpy(want, exp->data, (size_t)n * sizeof(float));
    const size_t row_bytes = kiln_type_row_bytes(t, row);

    int64_t bad = 0;
    kiln_to_float_fn prev = NULL;
    char levels[64] = "";
    for (int level = KILN_SIMD_SCALAR; level <= (int)kiln_simd_best() && !bad; level++) {
        kiln_to_float_fn fn = kiln_get_to_float(t, (kiln_simd)level);
        if (!fn) {
            snprintf(msg, sizeof msg, "no to_float for %s at level %s", name, kiln_simd_name((kiln_simd)level));
            bad = 1;
            break;
        }
        if (fn == prev) continue; /* this level falls back to the one below, already checked */
        prev = fn;
        strncat(levels, " ", sizeof levels - strlen(levels) - 1);
        strncat(levels, kiln_simd_name((kiln_simd)level), sizeof levels - strlen(levels) - 1);
        char what[256];
        /* the whole tensor in one call */
        fill_canary(got, n + N_CANARY);
        fn(raw->data, got, n);
        bad = compare_floats(got, want, n, blck, what, sizeof what);
        if (bad) {
            snprintf(msg, sizeof msg, "%s %s, whole tensor: %s", name, kiln_simd_name((kiln_simd)level), what);
            break;
        }
        /* row by row: 3 blocks a row, an odd count that exercises the tails of unrolled loops */
        for (int64_t r = 0; r < n / row && !bad; r++) {
            fill_canary(got, row + N_CANARY);
            fn((const uint8_t *)raw->data + r * row_bytes, got, row);
            bad = compare_floats(got, want + r * row, row, blck, what, sizeof what);
            if (bad) snprintf(msg, sizeof msg, "%s %s, row %lld: %s", name, kiln_simd_name((kiln_simd)level), (long long)r, what);
        }
        /* block size 1: an odd k, shorter than a vector */
        if (!bad && blck == 1) {
            const int64_t k = row - 3;
            fill_canary(got, k + N_CANARY);
            fn(raw->data, got, k);
            bad = compare_floats(got, want, k, blck, what, sizeof what);
            if (bad) snprintf(msg, sizeof msg, "%s %s, k = %lld: %s", name, kiln_simd_name((kiln_simd)level), (long long)k, what);
        }
    }
    free(want);
    free(got);
    fprintf(stderr, "# %s: to_float checked at%s\n", name, levels);
    CHECK(bad == 0, "%s", msg);
}

#define DEFINE_DEQUANT_TEST(name, t) \
    static void test_dequant_##name(void) { check_dequant(#name, t); }
DEQUANT_TYPES(DEFINE_DEQUANT_TEST)

/* ---------------------------------------------------------------- quantization */

static void check_quantize(const char *name, kiln_type t) {
    char msg[512] = "";
    CHECK(fixtures != NULL, "%s", open_error);
    const kiln_tensor_view *in = fixture_tensor(name, "quant_in", KILN_TYPE_F32, msg, sizeof msg);
    CHECK(in != NULL, "%s", msg);
    const kiln_tensor_view *out = fixture_tensor(name, "quant_out", t, msg, sizeof msg);
    CHECK(out != NULL, "%s", msg);
    const int64_t n = n_elements(in);
    CHECK(n == n_elements(out), "%s.quant_in and %s.quant_out differ in shape", name, name);
    const size_t nbytes = kiln_type_row_bytes(t, n);
    CHECK(nbytes == out->nbytes, "%s.quant_out is %zu bytes, kiln sizes it %zu", name, out->nbytes, nbytes);
    const kiln_type_traits *tt = kiln_type_traits_get(t);
    CHECK(tt && tt->from_float_ref, "kiln has no reference quantizer for %s", name);

    float *x = malloc((size_t)n * sizeof(float));
    uint8_t *y = malloc(nbytes + N_CANARY);
    CHECK(x && y, "out of memory");
    memcpy(x, in->data, (size_t)n * sizeof(float));
    memset(y, 0xa5, nbytes + N_CANARY);
    tt->from_float_ref(x, y, n);

    const uint8_t *want = out->data;
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < nbytes; i++)
        if (y[i] != want[i] && bad++ == 0) first = i;
    if (bad) {
        const size_t bb = kiln_type_block_bytes(t);
        snprintf(msg, sizeof msg, "%zu of %zu bytes differ; first at byte %zu (block %zu, byte %zu of %zu): "
                 "got 0x%02x, want 0x%02x", bad, nbytes, first, first / bb, first % bb, bb, y[first], want[first]);
    }
    bool overrun = false;
    for (size_t i = nbytes; i < nbytes + N_CANARY; i++) overrun |= y[i] != 0xa5;
    free(x);
    free(y);
    CHECK(bad == 0, "%s from_float_ref: %s", name, msg);
    CHECK(!overrun, "%s from_float_ref wrote past %zu bytes", name, nbytes);
}

#define DEFINE_QUANT_TEST(name, t) \
    static void test_quantize_##name(void) { check_quantize(#name, t); }
QUANT_TYPES(DEFINE_QUANT_TEST)

/* ---------------------------------------------------------------- type layouts */

/* gguf-py's GGML_QUANT_SIZES says Q8_1 is 40 bytes (float d and s), a leftover from before ggml stored them as
 * halves: ggml-common.h has static_assert(sizeof(block_q8_1) == 2*sizeof(ggml_half) + QK8_1), 36 bytes, and
 * ggml's layout is the file format. If gguf-py is fixed, this exception reports it and should go. */
static size_t gguf_py_known_wrong_bytes(uint32_t id, size_t bytes) {
    return id == KILN_TYPE_Q8_1 && bytes == 40 ? 36 : bytes;
}

static void test_type_sizes(void) {
    FILE *f = fopen(TYPE_SIZES_PATH, "r");
    CHECK(f != NULL, "cannot open %s (run from the repo root)", TYPE_SIZES_PATH);
    bool listed[256] = {false};
    char problems[768] = "";
    size_t used = 0;
    int n_lines = 0, n_problems = 0;
#define PROBLEM(...)                                                                          \
    do {                                                                                      \
        n_problems++;                                                                         \
        if (used < sizeof problems) {                                                         \
            int w_ = snprintf(problems + used, sizeof problems - used, __VA_ARGS__);          \
            if (w_ > 0) used += (size_t)w_;                                                   \
        }                                                                                     \
    } while (0)
    char name[64];
    unsigned id;
    long long blck;
    size_t bytes;
    int got;
    while ((got = fscanf(f, "%63s %u %lld %zu", name, &id, &blck, &bytes)) == 4) {
        n_lines++;
        if (id < 256) listed[id] = true;
        if (!kiln_type_known(id)) {
            PROBLEM("[%s id %u (%lld elements, %zu bytes) unknown to kiln] ", name, id, blck, bytes);
            continue;
        }
        const kiln_type t = (kiln_type)id;
        kiln_type parsed;
        if (strcasecmp(kiln_type_name(t), name) != 0)
            PROBLEM("[id %u: kiln names it %s, gguf %s] ", id, kiln_type_name(t), name);
        else if (kiln_type_from_name(name, &parsed) != KILN_OK || parsed != t)
            PROBLEM("[kiln_type_from_name(%s) is not %u] ", name, id);
        if (kiln_type_block_size(t) != blck)
            PROBLEM("[%s: kiln block of %lld elements, gguf %lld] ", name, (long long)kiln_type_block_size(t), blck);
        if (kiln_type_block_bytes(t) != gguf_py_known_wrong_bytes(id, bytes))
            PROBLEM("[%s: kiln block of %zu bytes, gguf %zu] ", name, kiln_type_block_bytes(t), bytes);
    }
    const bool at_eof = feof(f);
    fclose(f);
    CHECK(got == EOF && at_eof, "%s: malformed line %d", TYPE_SIZES_PATH, n_lines + 1);
    CHECK(n_lines > 0, "%s is empty", TYPE_SIZES_PATH);
    for (uint32_t t = 0; t < KILN_TYPE_COUNT; t++)
        if (kiln_type_known(t) && !listed[t]) PROBLEM("[kiln's %s (id %u) not in gguf] ", kiln_type_name((kiln_type)t), t);
#undef PROBLEM
    CHECK(n_problems == 0, "%d disagreements with gguf's GGML_QUANT_SIZES: %s", n_problems, problems);
}

int main(void) {
    kiln_status s = kiln_gguf_open(FIXTURE_PATH, &fixtures);
    if (s != KILN_OK) {
        snprintf(open_error, sizeof open_error, "%s: %s: %s", FIXTURE_PATH, kiln_status_name(s), kiln_last_error());
        fixtures = NULL;
    } else {
        kiln_str v;
        if (kiln_gguf_get_str(fixtures, "kiln.fixture.gguf_version", &v) == KILN_OK)
            fprintf(stderr, "# fixtures from gguf %.*s, best SIMD level %s\n", (int)v.len, v.ptr,
                    kiln_simd_name(kiln_simd_best()));
    }
#define RUN_DEQUANT(name, t) RUN(test_dequant_##name);
    DEQUANT_TYPES(RUN_DEQUANT)
#define RUN_QUANT(name, t) RUN(test_quantize_##name);
    QUANT_TYPES(RUN_QUANT)
    RUN(test_type_sizes);
    kiln_gguf_close(fixtures);
    TEST_EXIT();
}
