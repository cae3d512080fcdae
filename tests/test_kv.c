/* test_kv.c: the KV cache's element types (kiln_kv_type, -ctk/-ctv) on the CPU.
 *   - names, llama.cpp's spellings and row sizes, and the errors for a bad name or id;
 *   - the store: the CPU backend's qkv_post writes each type's bytes into the right ring rows, q8_0 and q4_0 blocks
 *     byte for byte the GGUF quantizers' (quants_ref.c, checked against llama-quantize elsewhere), bf16 the
 *     round-to-nearest-even bits computed here, f16 kiln_f32_to_fp16's, f32 the floats; and what comes back is
 *     within each block format's rounding of what went in;
 *   - attention over each type (and mixed pairs), at every SIMD level, against a double reference over the
 *     dequantized cache, with a ring and a window too, and the AVX2 kernel against the scalar one;
 *   - whole sessions: f32-cache logits against f16-cache logits on the bundled model (a small difference, not
 *     zero), each type's distance from f32, and q8_0 and q4_0 perplexity on SmolLM2 against f16's (skips
 *     without the model);
 *   - a row width that is not whole blocks of 32 refused for q8_0 and q4_0, naming the width. */
#include "kiln.h"
#include "test.h"

#include "cpu/ops_internal.h"
#include "model/backend.h"

#include <stdint.h>
#include <unistd.h>

static const char *const kv_names[KILN_KV_TYPE_COUNT] = {"f16", "f32", "bf16", "q8_0", "q4_0"};

/* ---------------------------------------------------------------- names and sizes */

static void test_kv_names(void) {
    for (int t = 0; t < KILN_KV_TYPE_COUNT; t++) {
        CHECK(kiln_kv_type_name((kiln_kv_type)t) && strcmp(kiln_kv_type_name((kiln_kv_type)t), kv_names[t]) == 0, "type %d", t);
        kiln_kv_type got = (kiln_kv_type)99;
        CHECK(kiln_kv_type_from_name(kv_names[t], &got) == KILN_OK && got == (kiln_kv_type)t, "%s", kv_names[t]);
    }
    CHECK(kiln_kv_type_name((kiln_kv_type)KILN_KV_TYPE_COUNT) == NULL, "an unknown id has no name");
    static const char *const bad[] = {"q8", "F16", "q4_1", "", "f16 ", "float"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kiln_kv_type got = KILN_KV_F32;
        CHECK(kiln_kv_type_from_name(bad[i], &got) == KILN_ERR_INVALID && got == KILN_KV_F32, "'%s' accepted", bad[i]);
        const char *e = kiln_last_error();
        CHECK(strstr(e, "f16, f32, bf16, q8_0, q4_0") && !strchr(e, '\n'), "'%s': %s", bad[i], e);
    }
    /* bytes of a row of 64: 2, 4, 2 bytes an element; 34 and 18 bytes a block of 32 */
    static const size_t want64[KILN_KV_TYPE_COUNT] = {128, 256, 128, 68, 36};
    for (int t = 0; t < KILN_KV_TYPE_COUNT; t++)
        CHECK(kiln_kv_row_bytes((kiln_kv_type)t, 64) == want64[t], "%s: %zu", kv_names[t], kiln_kv_row_bytes((kiln_kv_type)t, 64));
    CHECK(kiln_kv_row_bytes(KILN_KV_F16, 24) == 48 && kiln_kv_row_bytes(KILN_KV_Q8_0, 24) == 0 &&
          kiln_kv_row_bytes(KILN_KV_Q4_0, 48) == 0 && kiln_kv_row_bytes((kiln_kv_type)7, 64) == 0, "partial blocks or bad id");
}

/* ---------------------------------------------------------------- the store (the CPU backend's qkv_post) */

/* bf16 of x rounded to nearest even, written out here (finite x). */
static uint16_t bf16_rne(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* The bytes cache row r of type t must hold for the floats x (n). */
static void expected_row(kiln_kv_type t, const float *x, int64_t n, uint8_t *out) {
    switch (t) {
    case KILN_KV_F32: memcpy(out, x, (size_t)n * 4); break;
    case KILN_KV_F16:
        for (int64_t i = 0; i < n; i++) ((uint16_t *)out)[i] = kiln_f32_to_fp16(x[i]);
        break;
    case KILN_KV_BF16:
        for (int64_t i = 0; i < n; i++) ((uint16_t *)out)[i] = bf16_rne(x[i]);
        break;
    case KILN_KV_Q8_0: kiln_type_traits_get(KILN_TYPE_Q8_0)->from_float_ref(x, out, n); break;
    case KILN_KV_Q4_0: kiln_type_traits_get(KILN_TYPE_Q4_0)->from_float_ref(x, out, n); break;
    }
}

static void test_kv_store(void) {
    kiln_model *m = NULL;
    CHECK(kiln_model_load("models/shakespeare.gguf", &m) == KILN_OK, "%s", kiln_last_error());
    const int64_t NH = m->cfg.n_head, NKV = m->cfg.n_head_kv, HS = m->cfg.head_dim, KV = NKV * HS, T = 4, R = 5;
    int64_t rows[64];
    for (int64_t l = 0; l < m->cfg.n_layer && l < 64; l++) rows[l] = R;
    const kiln_backend *be = &kiln_cpu_backend;
    const kiln_backend_params bp = {.n_ctx = R, .n_batch = T, .rows = rows, .n_threads = 1};
    void *ctx = NULL;
    CHECK(be->open(m, &bp, &ctx) == KILN_OK, "%s", kiln_last_error());
    unsigned long long rng = 3;
    float *q = malloc(sizeof(float) * (size_t)(T * NH * HS)), *k = malloc(sizeof(float) * (size_t)(T * KV));
    float *v = malloc(sizeof(float) * (size_t)(T * KV)), *back = malloc(sizeof(float) * (size_t)KV);
    uint8_t *kc = malloc((size_t)(R * KV) * 4), *vc = malloc((size_t)(R * KV) * 4), *want = malloc((size_t)KV * 4);
    for (int t = 0; t < KILN_KV_TYPE_COUNT; t++) {
        const size_t rb = kiln_kv_row_bytes((kiln_kv_type)t, KV);
        for (int64_t i = 0; i < T * KV; i++) k[i] = test_rng_normal(&rng), v[i] = 3.0f * test_rng_normal(&rng);
        for (int64_t i = 0; i < T * NH * HS; i++) q[i] = test_rng_normal(&rng);
        memset(kc, 0xA5, (size_t)(R * KV) * 4), memset(vc, 0xA5, (size_t)(R * KV) * 4);
        /* positions 3..6 in a ring of 5 rows: rows 3, 4, then 0, 1; row 2 untouched */
        const int32_t pos0 = 3;
        const kiln_attn_args a = {.NH = NH, .NKV = NKV, .HS = HS, .rope_dim = HS, .rope_base = 10000, .rope_mscale = 1,
                                  .nope = true, .k_cache = kc, .v_cache = vc, .type_k = (kiln_kv_type)t,
                                  .type_v = (kiln_kv_type)t, .rows = R};
        CHECK(be->qkv_post(ctx, q, k, v, &a, &pos0, T) == KILN_OK, "%s", kiln_last_error());
        for (int64_t i = 0; i < T; i++) {
            const int64_t r = (pos0 + i) % R;
            expected_row((kiln_kv_type)t, k + i * KV, KV, want);
            CHECK(memcmp(kc + (size_t)r * rb, want, rb) == 0, "%s: k of position %lld (row %lld) differs", kv_names[t],
                  (long long)(pos0 + i), (long long)r);
            expected_row((kiln_kv_type)t, v + i * KV, KV, want);
            CHECK(memcmp(vc + (size_t)r * rb, want, rb) == 0, "%s: v of position %lld differs", kv_names[t], (long long)(pos0 + i));
            /* and back: within the format's rounding of the input */
            const kiln_type tt = kiln_kv_tensor_type((kiln_kv_type)t);
            kiln_type_traits_get(tt)->to_float[0](vc + (size_t)r * rb, back, KV);
            for (int64_t e = 0; e < KV; e++) {
                const float x = v[i * KV + e];
                double bound = 0;
                if (t == KILN_KV_F16) bound = fabs(x) * 0x1p-11;
                if (t == KILN_KV_BF16) bound = fabs(x) * 0x1p-8;
                if (t == KILN_KV_Q8_0 || t == KILN_KV_Q4_0) {
                    /* d/2 (q8_0) or |d| (q4_0: the far side caps at +7), plus the f16 scale's rounding (2^-11 of d)
                     * times the largest code (127, 8) */
                    double amax = 0;
                    for (int64_t j = e / 32 * 32; j < e / 32 * 32 + 32; j++) amax = fmax(amax, fabs(v[i * KV + j]));
                    bound = t == KILN_KV_Q8_0 ? amax / 127 * (0.5 + 127 * 0x1p-11) : amax / 8 * (1 + 8 * 0x1p-11);
                    bound = bound * 1.001 + 1e-7;
                }
                CHECK(fabs((double)back[e] - x) <= bound, "%s: element %lld of v stored as %g for %g (bound %g)", kv_names[t],
                      (long long)e, back[e], x, bound);
            }
        }
        for (size_t b = 0; b < rb; b++) CHECK(kc[2 * rb + b] == 0xA5, "%s: row 2 (no position) was written", kv_names[t]);
    }
    free(q), free(k), free(v), free(back), free(kc), free(vc), free(want);
    be->close(ctx);
    kiln_model_free(m);
}

/* ---------------------------------------------------------------- attention over each type */

typedef struct {
    kiln_kv_type tk, tv;
    int64_t NH, NKV, HS, pos0, T, window, rows;
} kv_attn_case;

/* Row r of a cache of type t (rows of KV) as float. */
static void row_float(kiln_kv_type t, const uint8_t *cache, int64_t r, int64_t KV, float *out) {
    const kiln_type tt = kiln_kv_tensor_type(t);
    kiln_type_traits_get(tt)->to_float[0](cache + (size_t)r * kiln_kv_row_bytes(t, KV), out, KV);
}

static void test_kv_attention(void) {
    static const kv_attn_case cases[] = {
        {KILN_KV_F32, KILN_KV_F32, 8, 2, 64, 37, 5, 0, 48},
        {KILN_KV_BF16, KILN_KV_BF16, 8, 2, 64, 300, 2, 0, 310},    /* decode over key chunks */
        {KILN_KV_Q8_0, KILN_KV_Q8_0, 8, 2, 64, 0, 17, 0, 20},      /* a prefill from position 0 */
        {KILN_KV_Q4_0, KILN_KV_Q4_0, 4, 4, 32, 9, 3, 0, 12},
        {KILN_KV_Q8_0, KILN_KV_F16, 6, 2, 16, 40, 4, 0, 44},       /* HS 16: a head is half a block */
        {KILN_KV_F32, KILN_KV_Q4_0, 8, 4, 8, 25, 3, 0, 28},        /* HS 8: four heads a block (stories260K's shape) */
        {KILN_KV_Q4_0, KILN_KV_BF16, 8, 2, 64, 700, 1, 0, 701},
        {KILN_KV_Q8_0, KILN_KV_Q8_0, 8, 2, 64, 50, 3, 16, 18},     /* a window over a ring of 18 rows */
        {KILN_KV_F16, KILN_KV_F32, 4, 2, 24, 20, 2, 8, 9},         /* HS 24 (scalar tails at AVX2), ring */
    };
    static const kiln_simd levels[] = {KILN_SIMD_SCALAR, KILN_SIMD_AVX2, KILN_SIMD_AVX512};
    unsigned long long rng = 11;
    kiln_pool *pool = NULL;
    CHECK(kiln_pool_create(2, &pool) == KILN_OK, "%s", kiln_last_error());
    double worst = 0, worst_simd = 0;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const kv_attn_case k = cases[c];
        const int64_t KV = k.NKV * k.HS, QW = k.NH * k.HS, n_ctx = k.pos0 + k.T;
        uint8_t *kc = malloc(kiln_kv_row_bytes(k.tk, KV) * (size_t)k.rows), *vc = malloc(kiln_kv_row_bytes(k.tv, KV) * (size_t)k.rows);
        float *x = malloc(sizeof(float) * (size_t)KV), *q = malloc(sizeof(float) * (size_t)(k.T * QW));
        float *kf = malloc(sizeof(float) * (size_t)(k.rows * KV)), *vf = malloc(sizeof(float) * (size_t)(k.rows * KV));
        float *out = malloc(sizeof(float) * (size_t)(k.T * QW)), *scalar = malloc(sizeof(float) * (size_t)(k.T * QW));
        double *s = malloc(sizeof(double) * (size_t)n_ctx);
        for (int64_t r = 0; r < k.rows; r++) {
            for (int64_t i = 0; i < KV; i++) x[i] = test_rng_normal(&rng);
            expected_row(k.tk, x, KV, kc + (size_t)r * kiln_kv_row_bytes(k.tk, KV));
            for (int64_t i = 0; i < KV; i++) x[i] = test_rng_normal(&rng);
            expected_row(k.tv, x, KV, vc + (size_t)r * kiln_kv_row_bytes(k.tv, KV));
            row_float(k.tk, kc, r, KV, kf + r * KV);
            row_float(k.tv, vc, r, KV, vf + r * KV);
        }
        for (int64_t i = 0; i < k.T * QW; i++) q[i] = test_rng_normal(&rng);
        const int64_t nc = k.rows > n_ctx ? k.rows : n_ctx;
        const size_t bytes = kiln_cpu_ops.scratch_size(k.T, QW, k.NH, nc, 2) + kiln_cpu_ops.kv_scratch_size(QW, k.NH, nc, 2);
        kiln_ops_ctx ctx = {.pool = pool, .scratch = malloc(bytes), .scratch_bytes = bytes};
        for (size_t lv = 0; lv < sizeof levels / sizeof levels[0]; lv++) {
            kiln_cpu_ops_force_level(levels[lv]);
            memset(out, 0xff, sizeof(float) * (size_t)(k.T * QW));
            kiln_cpu_ops.attention_kv_forward(&ctx, out, q, kc, vc, k.tk, k.tv, k.pos0, k.T, k.NH, k.NKV, k.HS, k.window, k.rows,
                                              0.0f);
            if (lv == 0) memcpy(scalar, out, sizeof(float) * (size_t)(k.T * QW));
            /* against a double softmax over the dequantized rows (position j in row j % rows) */
            for (int64_t t = 0; t < k.T; t++)
                for (int64_t h = 0; h < k.NH; h++) {
                    const int64_t g = h / (k.NH / k.NKV), p = k.pos0 + t, lo = k.window && p + 1 > k.window ? p + 1 - k.window : 0;
                    const float *qh = q + t * QW + h * k.HS;
                    double mx = -INFINITY, sum = 0;
                    for (int64_t j = lo; j <= p; j++) {
                        double d = 0;
                        for (int64_t i = 0; i < k.HS; i++) d += (double)qh[i] * kf[j % k.rows * KV + g * k.HS + i];
                        s[j] = d / sqrt((double)k.HS);
                        mx = fmax(mx, s[j]);
                    }
                    for (int64_t j = lo; j <= p; j++) sum += (s[j] = exp(s[j] - mx));
                    for (int64_t i = 0; i < k.HS; i++) {
                        double o = 0, mag = 0;
                        for (int64_t j = lo; j <= p; j++) {
                            const double vj = vf[j % k.rows * KV + g * k.HS + i];
                            o += s[j] / sum * vj, mag += s[j] / sum * fabs(vj);
                        }
                        const double err = fabs(out[t * QW + h * k.HS + i] - o) / (mag > 0 ? mag : 1);
                        worst = fmax(worst, err);
                        CHECK(err <= 2e-6, "case %zu (%s, %s) level %d: token %lld head %lld dim %lld: %.9g vs %.9g (%.2e of "
                              "sum p|v|, bound 2e-6)", c, kv_names[k.tk], kv_names[k.tv], (int)levels[lv], (long long)t,
                              (long long)h, (long long)i, out[t * QW + h * k.HS + i], o, err);
                        const double ds = fabs(out[t * QW + h * k.HS + i] - scalar[t * QW + h * k.HS + i]) / (mag > 0 ? mag : 1);
                        worst_simd = fmax(worst_simd, ds);
                        CHECK(ds <= 2e-6, "case %zu level %d vs scalar: %.2e", c, (int)levels[lv], ds);
                    }
                }
        }
        kiln_cpu_ops_force_level(KILN_SIMD_COUNT);
        /* token by token gives the batch's bits (pieces depend only on the position) */
        float *one = malloc(sizeof(float) * (size_t)QW);
        memset(out, 0, sizeof(float) * (size_t)(k.T * QW));
        kiln_cpu_ops.attention_kv_forward(&ctx, out, q, kc, vc, k.tk, k.tv, k.pos0, k.T, k.NH, k.NKV, k.HS, k.window, k.rows, 0.0f);
        for (int64_t t = 0; t < k.T; t++) {
            kiln_cpu_ops.attention_kv_forward(&ctx, one, q + t * QW, kc, vc, k.tk, k.tv, k.pos0 + t, 1, k.NH, k.NKV, k.HS, k.window,
                                              k.rows, 0.0f);
            CHECK(memcmp(one, out + t * QW, sizeof(float) * (size_t)QW) == 0, "case %zu token %lld alone differs", c, (long long)t);
        }
        free(one), free(ctx.scratch), free(kc), free(vc), free(x), free(q), free(kf), free(vf), free(out), free(scalar), free(s);
    }
    kiln_pool_free(pool);
    printf("# attention over each cache type: %.2e of sum p|v| from the double reference at worst, SIMD %.2e from "
           "scalar (bounds 2e-6)\n", worst, worst_simd);
}

/* ---------------------------------------------------------------- sessions */

/* Logits (n, V) of a prompt of n ids through a session with cache types (tk, tv). */
static kiln_status prompt_logits(const kiln_model *m, kiln_kv_type tk, kiln_kv_type tv, const int32_t *ids, int64_t n, float *logits) {
    kiln_session *s = NULL;
    const kiln_session_params p = {.n_ctx = 256, .n_batch = 16, .n_threads = 2, .type_k = tk, .type_v = tv};
    kiln_status st = kiln_session_new(m, &p, &s);
    const int64_t V = kiln_model_n_vocab(m);
    for (int64_t i = 0; !st && i < n; i++) st = kiln_session_eval(s, ids + i, 1, logits + i * V, NULL);
    kiln_session_free(s);
    return st;
}

/* Measured (x86-64, AVX2, 64 positions of the bundled model): the largest |logit difference| relative to the row's
 * largest |logit| from the f32 cache: f16 9.4e-3, bf16 1.1e-2, q8_0 8.8e-3, q4_0 6.0e-2. Bounds about 2.5x. */
static void test_kv_session_logits(void) {
    kiln_model *m = NULL;
    CHECK(kiln_model_load("models/shakespeare.gguf", &m) == KILN_OK, "%s", kiln_last_error());
    const int64_t V = kiln_model_n_vocab(m), n = 64;
    int32_t ids[64];
    for (int64_t i = 0; i < n; i++) ids[i] = (int32_t)((i * 37 + 11) % V);
    float *ref = malloc(sizeof(float) * (size_t)(n * V)), *got = malloc(sizeof(float) * (size_t)(n * V));
    CHECK(prompt_logits(m, KILN_KV_F32, KILN_KV_F32, ids, n, ref) == KILN_OK, "%s", kiln_last_error());
    static const double bound[KILN_KV_TYPE_COUNT] = {2.5e-2, 0, 3e-2, 2.5e-2, 1.5e-1};
    for (int t = 0; t < KILN_KV_TYPE_COUNT; t++) {
        if (t == KILN_KV_F32) continue;
        CHECK(prompt_logits(m, (kiln_kv_type)t, (kiln_kv_type)t, ids, n, got) == KILN_OK, "%s", kiln_last_error());
        double worst = 0;
        for (int64_t r = 0; r < n; r++) {
            double mag = 0, err = 0;
            for (int64_t i = 0; i < V; i++) {
                mag = fmax(mag, fabs(ref[r * V + i]));
                err = fmax(err, fabs((double)got[r * V + i] - ref[r * V + i]));
            }
            worst = fmax(worst, err / mag);
        }
        printf("# bundled model, %s cache vs f32: %.2e of the largest logit at worst over %lld positions (bound %.1e)\n",
               kv_names[t], worst, (long long)n, bound[t]);
        CHECK(worst > 0, "%s: the same logits as an f32 cache: the type is not used", kv_names[t]);
        CHECK(worst <= bound[t], "%s: %.2e > %.1e", kv_names[t], worst, bound[t]);
    }
    free(ref), free(got);
    kiln_model_free(m);
}

/* A model whose cached rows are 24 wide (NKV 2 x HS 12): q8_0 and q4_0 refused naming the width, the others run. */
static void test_kv_width_refused(void) {
    char path[] = "/tmp/kiln_test_kv_XXXXXX";
    const int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    close(fd);
    kiln_synth_params sp = kiln_synth_default();
    sp.n_vocab = 64, sp.n_embd = 48, sp.n_layer = 1, sp.n_head = 4, sp.n_head_kv = 2, sp.n_ff = 64, sp.n_ctx = 32;
    kiln_status st = kiln_synth_llama(path, &sp);
    kiln_model *m = NULL;
    if (!st) st = kiln_model_load(path, &m);
    unlink(path);
    CHECK(st == KILN_OK, "%s", kiln_last_error());
    for (int t = 0; t < KILN_KV_TYPE_COUNT; t++) {
        kiln_session *s = NULL;
        const kiln_session_params p = {.n_ctx = 16, .type_k = (kiln_kv_type)t};
        st = kiln_session_new(m, &p, &s);
        const bool block = t == KILN_KV_Q8_0 || t == KILN_KV_Q4_0;
        if (block) {
            CHECK(st == KILN_ERR_UNSUPPORTED && strstr(kiln_last_error(), "24") && strstr(kiln_last_error(), kv_names[t]),
                  "%s over rows of 24: %d %s", kv_names[t], st, kiln_last_error());
        } else {
            CHECK(st == KILN_OK, "%s: %s", kv_names[t], kiln_last_error());
            const int32_t id = 5;
            float logits[64];
            CHECK(kiln_session_eval(s, &id, 1, logits, NULL) == KILN_OK, "%s", kiln_last_error());
        }
        kiln_session_free(s);
    }
    kiln_session *s = NULL;
    CHECK(kiln_session_new(m, &(kiln_session_params){.n_ctx = 16, .type_v = (kiln_kv_type)9}, &s) == KILN_ERR_INVALID,
          "a bad type id");
    CHECK(kiln_session_new(m, &(kiln_session_params){.n_ctx = 16, .type_v = KILN_KV_Q4_0}, &s) == KILN_ERR_UNSUPPORTED,
          "q4_0 values over rows of 24");
    kiln_model_free(m);
}

/* q8_0 and q4_0 caches against f16 on SmolLM2-135M (q4_1 weights): perplexity of the first 6 KB of tinyshakespeare,
 * windows of 256. Measured (AVX2): f16 49.572, q8_0 49.792 (+0.44%), q4_0 56.071 (+13.1%). llama-perplexity (the
 * vendored llama.cpp, -fa on) on the same text: 49.617, q8_0 49.494 (-0.25%), q4_0 51.666 (+4.1%): for a quantized
 * cache with HS % 64 == 0 llama.cpp rotates q, k and v by a Walsh-Hadamard matrix before storing (llama-kv-cache.cpp,
 * attn_rot_k/v), which spreads outliers over a block; kiln stores the plain values, as -ctk/-ctv asked of it here.
 * Bounds: q8_0 within +1% of f16's, q4_0 within +20%. */
static void test_kv_perplexity_smollm(void) {
    char model[512], text_path[512];
    const char *cache = getenv("KILN_CACHE"), *home = getenv("HOME");
    if (cache && *cache)
        snprintf(model, sizeof model, "%s/smollm2-135m-instruct-q4_1.gguf", cache);
    else
        snprintf(model, sizeof model, "%s/.cache/kiln/smollm2-135m-instruct-q4_1.gguf", home ? home : ".");
    snprintf(text_path, sizeof text_path, "%s/corpora/english/tinyshakespeare.txt", test_data_dir());
    if (access(model, R_OK) != 0) SKIP("%s not found (tests/ref/fetch_models.sh)", model);
    FILE *f = fopen(text_path, "rb");
    if (!f) SKIP("%s not found (set KILN_DATA)", text_path);
    static char text[6144];
    const size_t len = fread(text, 1, sizeof text, f);
    fclose(f);
    kiln_model *m = NULL;
    CHECK(kiln_model_load(model, &m) == KILN_OK, "%s", kiln_last_error());
    double ppl[KILN_KV_TYPE_COUNT] = {0};
    static const kiln_kv_type types[] = {KILN_KV_F16, KILN_KV_Q8_0, KILN_KV_Q4_0};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        const kiln_session_params run = {.n_threads = 2, .type_k = types[i], .type_v = types[i]};
        kiln_perplexity_result r;
        CHECK(kiln_perplexity(m, text, len, 256, &run, NULL, NULL, &r) == KILN_OK, "%s", kiln_last_error());
        ppl[types[i]] = r.ppl;
    }
    kiln_model_free(m);
    const double d8 = ppl[KILN_KV_Q8_0] / ppl[KILN_KV_F16] - 1, d4 = ppl[KILN_KV_Q4_0] / ppl[KILN_KV_F16] - 1;
    printf("# SmolLM2-135M perplexity, 6 KB of tinyshakespeare in windows of 256: f16 %.4f, q8_0 %.4f (%+.3f%%), q4_0 %.4f "
           "(%+.2f%%); bounds +1%%, +20%%\n", ppl[KILN_KV_F16], ppl[KILN_KV_Q8_0], 100 * d8, ppl[KILN_KV_Q4_0], 100 * d4);
    CHECK(ppl[KILN_KV_Q8_0] != ppl[KILN_KV_F16] && ppl[KILN_KV_Q4_0] != ppl[KILN_KV_F16], "a cache type not used");
    CHECK(d8 <= 0.01, "q8_0 cache: %+.3f%% over f16's perplexity (bound +1%%)", 100 * d8);
    CHECK(d4 <= 0.20, "q4_0 cache: %+.2f%% over f16's perplexity (bound +20%%)", 100 * d4);
}

int main(void) {
    RUN(test_kv_names);
    RUN(test_kv_store);
    RUN(test_kv_attention);
    RUN(test_kv_session_logits);
    RUN(test_kv_width_refused);
    RUN(test_kv_perplexity_smollm);
    TEST_EXIT();
}
