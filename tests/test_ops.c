/* test_ops.c: the CPU ops table (src/cpu/ops*.c) against plain double-precision references written here, on
 * fresh seeded random inputs, at every SIMD level this CPU has (scalar, AVX2, AVX-512) and with pools of 1, 2
 * and 3 threads, whose results must agree bit for bit. Each check states its bound next to the error measured
 * when it was set (bounds are about 2x the measured worst case). A '# ' line at the end times the q4_K matmul
 * (informative only). */
#include "test.h"

#include "cpu/ops_internal.h"

#include <stdint.h>
#include <time.h>

#define COUNT(a) (int)(sizeof a / sizeof a[0])

static kiln_pool *pools[3]; /* 1, 2 and 3 threads (3 does not divide the work evenly) */

/* A context with scratch for T tokens of max_width and n_ctx positions; free scratch with free(). */
static kiln_ops_ctx make_ctx(kiln_pool *pool, int64_t T, int64_t max_width, int64_t n_ctx) {
    size_t bytes = kiln_cpu_ops.scratch_size(T, max_width, 8, n_ctx, kiln_pool_size(pool));
    return (kiln_ops_ctx){.pool = pool, .scratch = malloc(bytes), .scratch_bytes = bytes};
}

static void fill_normal(float *x, int64_t n, unsigned long long *rng) {
    for (int64_t i = 0; i < n; i++) x[i] = test_rng_normal(rng);
}

/* A 2-D weight view of O rows of I in type t over data. */
static kiln_tensor_view make_view(kiln_type t, int64_t I, int64_t O, const void *data) {
    size_t row = kiln_type_row_bytes(t, I);
    return (kiln_tensor_view){.name = "w", .type = t, .n_dims = 2, .ne = {I, O, 1, 1},
                              .nb = {kiln_type_block_bytes(t), row, row * (size_t)O, row * (size_t)O},
                              .nbytes = row * (size_t)O, .data = data};
}

/* O rows of I random normal weights quantized with the reference quantizer; deq gets them back as float. */
static void *make_weights(kiln_type t, int64_t I, int64_t O, float *deq, unsigned long long *rng) {
    const kiln_type_traits *tt = kiln_type_traits_get(t);
    size_t row = kiln_type_row_bytes(t, I);
    char *w = malloc(row * (size_t)O);
    float *tmp = malloc((size_t)I * sizeof *tmp);
    for (int64_t o = 0; o < O; o++) {
        fill_normal(tmp, I, rng);
        tt->from_float_ref(tmp, w + (size_t)o * row, I);
        tt->to_float[KILN_SIMD_SCALAR](w + (size_t)o * row, deq + o * I, I);
    }
    free(tmp);
    return w;
}

/* ---------------------------------------------------------------- embed */

static void check_embed(void) {
    static const kiln_type types[] = {KILN_TYPE_F32, KILN_TYPE_F16, KILN_TYPE_BF16, KILN_TYPE_Q8_0,
                                      KILN_TYPE_Q4_0, KILN_TYPE_Q4_K, KILN_TYPE_Q6_K};
    unsigned long long rng = 11;
    enum { V = 37, C = 512, T = 300 }; /* T * C past the threshold where the rows go to threads */
    float *deq = malloc((size_t)V * C * sizeof *deq), *out = malloc((size_t)T * C * sizeof *out);
    int32_t ids[T];
    for (int t = 0; t < T; t++) ids[t] = t < 2 ? (t ? V - 1 : 0) : (int32_t)(test_rng_next(&rng) % V);
    for (int ti = 0; ti < COUNT(types); ti++) {
        void *w = make_weights(types[ti], C, V, deq, &rng);
        kiln_tensor_view table = make_view(types[ti], C, V, w);
        for (int p = 0; p < COUNT(pools); p++) {
            kiln_ops_ctx ctx = make_ctx(pools[p], 1, C, 16);
            for (int64_t n = 1; n <= T; n += T - 1) { /* one token (inline) and a prefill (threads) */
                memset(out, 0xff, (size_t)T * C * sizeof *out);
                kiln_cpu_ops.embed_forward(&ctx, out, &table, ids, n);
                for (int64_t t = 0; t < n; t++)
                    CHECK(memcmp(out + t * C, deq + (int64_t)ids[t] * C, C * sizeof(float)) == 0,
                          "%s row %d (token %lld) differs from to_float", kiln_type_name(types[ti]), ids[t], (long long)t);
            }
            free(ctx.scratch);
        }
        free(w);
    }
    free(deq);
    free(out);
}

/* ---------------------------------------------------------------- rmsnorm */

static void check_rmsnorm(void) {
    unsigned long long rng = 12;
    static const int64_t widths[] = {4096, 333};
    enum { T = 40 }; /* 40 x 4096 goes to threads */
    double worst = 0;
    for (int wi = 0; wi < COUNT(widths); wi++) {
        const int64_t C = widths[wi];
        float *x = malloc((size_t)(T * C) * sizeof *x), *w = malloc((size_t)C * sizeof *w);
        float *out = malloc((size_t)(T * C) * sizeof *out), *first = malloc((size_t)(T * C) * sizeof *first);
        for (int64_t i = 0; i < T * C; i++) x[i] = test_rng_normal(&rng) * (i % 7 == 0 ? 30.0f : 1.0f);
        for (int64_t i = 0; i < C; i++) w[i] = 1.0f + 0.5f * test_rng_f32(&rng);
        const float eps = 1e-5f;
        for (int p = 0; p < COUNT(pools); p++) {
            kiln_ops_ctx ctx = {.pool = pools[p]};
            kiln_cpu_ops.rmsnorm_forward(&ctx, out, x, w, T, C, eps);
            for (int64_t t = 0; t < T; t++) {
                double ss = 0;
                for (int64_t i = 0; i < C; i++) ss += (double)x[t * C + i] * x[t * C + i];
                const double r = 1.0 / sqrt(ss / (double)C + eps);
                for (int64_t i = 0; i < C; i++) {
                    const double ref = x[t * C + i] * r * w[i], err = fabs(out[t * C + i] - ref) / fabs(ref);
                    if (ref != 0 && err > worst) worst = err;
                    /* Bound: relative 5e-7 (measured 2.1e-7: three float roundings and the float scale). */
                    CHECK(ref == 0 ? out[t * C + i] == 0 : err <= 5e-7, "C %lld t %lld i %lld: %g vs %g (rel %.3g)",
                          (long long)C, (long long)t, (long long)i, out[t * C + i], ref, err);
                }
            }
            if (p == 0) memcpy(first, out, (size_t)(T * C) * sizeof *out);
            CHECK(memcmp(first, out, (size_t)(T * C) * sizeof *out) == 0, "%d threads differ from 1", kiln_pool_size(pools[p]));
            memcpy(out, x, (size_t)(T * C) * sizeof *out); /* in place */
            kiln_cpu_ops.rmsnorm_forward(&ctx, out, out, w, T, C, eps);
            CHECK(memcmp(first, out, (size_t)(T * C) * sizeof *out) == 0, "in place differs");
        }
        free(x), free(w), free(out), free(first);
    }
    printf("# rmsnorm: max relative error %.2e (bound 5e-7)\n", worst);
}

/* ---------------------------------------------------------------- matmul */

/* Bounds on |y - dot| / sum |w x| (dot and the sum in double over the dequantized weights and float x), about 2x
 * the worst error measured over every level (I = 1024, normal weights and activations): activations quantized to
 * Q8 cost ~1.3e-3 of the norm for every block type; F16/BF16 activations cost their rounding; F32 the float sum. */
typedef struct {
    kiln_type type;
    double bound, measured;
} mm_case;
static const mm_case mm_cases[] = {
    {KILN_TYPE_F32, 5e-8, 2.2e-8},  {KILN_TYPE_F16, 1e-4, 4.6e-5},  {KILN_TYPE_BF16, 6e-4, 3.0e-4},
    {KILN_TYPE_Q8_0, 3e-3, 1.1e-3}, {KILN_TYPE_Q4_0, 3e-3, 1.1e-3}, {KILN_TYPE_Q4_1, 3e-3, 9.4e-4},
    {KILN_TYPE_Q4_K, 3e-3, 1.3e-3}, {KILN_TYPE_Q5_K, 3e-3, 1.3e-3}, {KILN_TYPE_Q6_K, 3e-3, 1.2e-3},
};

static void check_matmul(void) {
    unsigned long long rng = 13;
    enum { I = 1024, O = 97, TMAX = 17, O_BIG = 1001 };
    static const int64_t Ts[] = {1, 3, 17};
    float *x = malloc((size_t)TMAX * I * sizeof *x), *deq = malloc((size_t)O_BIG * I * sizeof *deq);
    float *y = malloc((size_t)TMAX * O_BIG * sizeof *y), *y1 = malloc((size_t)TMAX * O_BIG * sizeof *y1);
    fill_normal(x, (int64_t)TMAX * I, &rng);
    for (int ci = 0; ci < COUNT(mm_cases); ci++) {
        const kiln_type type = mm_cases[ci].type;
        double worst = 0;
        for (int big = 0; big < 2; big++) {
            const int64_t n_out = big ? O_BIG : O; /* O_BIG: a single-token matvec that goes to threads */
            void *w = make_weights(type, I, n_out, deq, &rng);
            kiln_tensor_view W = make_view(type, I, n_out, w);
            for (int ti = 0; ti < COUNT(Ts); ti++) {
                const int64_t T = Ts[ti];
                if (big && T != 1) continue;
                for (int p = 0; p < COUNT(pools); p++) {
                    /* Pool 3 gets scratch for only 4 rows: the matmul must take T in passes and agree. */
                    kiln_ops_ctx ctx = make_ctx(pools[p], p == 2 ? 4 : T, I, 1);
                    memset(y, 0xff, (size_t)(T * n_out) * sizeof *y);
                    kiln_cpu_ops.matmul_forward(&ctx, y, x, &W, T);
                    free(ctx.scratch);
                    if (p == 0) memcpy(y1, y, (size_t)(T * n_out) * sizeof *y);
                    CHECK(memcmp(y, y1, (size_t)(T * n_out) * sizeof *y) == 0, "%s T %lld: %d threads differ from 1",
                          kiln_type_name(type), (long long)T, kiln_pool_size(pools[p]));
                }
                for (int64_t t = 0; t < T; t++)
                    for (int64_t o = 0; o < n_out; o++) {
                        double dot = 0, norm = 0;
                        for (int64_t i = 0; i < I; i++) {
                            dot += (double)deq[o * I + i] * x[t * I + i];
                            norm += fabs((double)deq[o * I + i] * x[t * I + i]);
                        }
                        const double err = fabs(y1[t * n_out + o] - dot) / norm;
                        if (err > worst) worst = err;
                        CHECK(err <= mm_cases[ci].bound, "%s T %lld t %lld o %lld: %g vs %g (%.3g of sum|wx|, bound %g)",
                              kiln_type_name(type), (long long)T, (long long)t, (long long)o, y1[t * n_out + o], dot, err,
                              mm_cases[ci].bound);
                    }
            }
            free(w);
        }
        printf("# matmul %-5s %s: max error %.2e of sum|wx| (bound %.0e, measured %.1e when set)\n",
               kiln_type_name(type), kiln_simd_name(kiln_cpu_ops_level()), worst, mm_cases[ci].bound, mm_cases[ci].measured);
    }
    free(x), free(deq), free(y), free(y1);
}

/* The multi-row kernels (src/cpu/gemm_*.c) against 4 calls of the level's vec_dot, bit for bit, on random
 * weights (normal values, plus raw random bytes with sane scales for Q4_K and Q5_K) and activations, odd block
 * counts, a strided output. Where the level has no multi-row kernel for a type there is nothing to check. */
static void check_gemm4(void) {
    static const kiln_type types[] = {KILN_TYPE_Q4_K, KILN_TYPE_Q8_0, KILN_TYPE_Q6_K, KILN_TYPE_Q4_1, KILN_TYPE_Q5_K};
    static const int64_t n_blocks[] = {1, 3, 5, 9};
    unsigned long long rng = 21;
    const kiln_simd level = kiln_cpu_ops_level();
    int checked = 0;
    for (int ti = 0; ti < COUNT(types); ti++) {
        const kiln_type type = types[ti], vt = kiln_type_traits_get(type)->vec_dot_type;
        const kiln_gemm4_fn dot4 = kiln_cpu_get_gemm4(type, level);
        if (level >= KILN_SIMD_AVX2) CHECK(dot4 != NULL, "%s %s: no multi-row kernel", kiln_type_name(type), kiln_simd_name(level));
        if (!dot4) continue;
        const kiln_vec_dot_fn dot = kiln_get_vec_dot(type, level);
        const kiln_from_float_fn quantize = kiln_get_from_float(vt, level);
        for (int bi = 0; bi < COUNT(n_blocks); bi++)
            for (int raw = 0; raw < 2; raw++) {
                const int64_t n = n_blocks[bi] * kiln_type_block_size(type);
                float *deq = malloc((size_t)n * sizeof *deq), *x = malloc((size_t)4 * n * sizeof *x);
                uint8_t *w = make_weights(type, n, 1, deq, &rng);
                const size_t w_bytes = kiln_type_row_bytes(type, n), y_row = kiln_type_row_bytes(vt, n) + 64;
                if (raw && (type == KILN_TYPE_Q4_K || type == KILN_TYPE_Q5_K)) {
                    for (size_t i = 0; i < w_bytes; i++) w[i] = (uint8_t)test_rng_next(&rng);
                    for (int64_t b = 0; b < n_blocks[bi]; b++) {
                        kiln_fp16 *d = type == KILN_TYPE_Q4_K ? &((block_q4_K *)w)[b].d : &((block_q5_K *)w)[b].d;
                        kiln_fp16 *dmin = type == KILN_TYPE_Q4_K ? &((block_q4_K *)w)[b].dmin : &((block_q5_K *)w)[b].dmin;
                        *d = kiln_f32_to_fp16(0.01f), *dmin = kiln_f32_to_fp16(0.002f);
                    }
                }
                fill_normal(x, 4 * n, &rng);
                uint8_t *yq = malloc(4 * y_row);
                for (int r = 0; r < 4; r++) quantize(x + r * n, yq + r * y_row, n);
                float s1[4], s4[12];
                for (int r = 0; r < 4; r++) dot(n, &s1[r], w, yq + r * y_row);
                for (int i = 0; i < 12; i++) s4[i] = -1.0f;
                dot4(n, s4, 3, w, yq, y_row);
                for (int r = 0; r < 4; r++)
                    CHECK(memcmp(&s1[r], &s4[3 * r], sizeof(float)) == 0, "%s %s blocks %lld raw %d row %d: %.9g vs vec_dot %.9g",
                          kiln_type_name(type), kiln_simd_name(level), (long long)n_blocks[bi], raw, r, s4[3 * r], s1[r]);
                CHECK(s4[1] == -1.0f && s4[2] == -1.0f && s4[10] == -1.0f, "wrote outside its outputs");
                checked++;
                free(deq), free(x), free(w), free(yq);
            }
    }
    printf("# gemm4 %s: %d cases bit-equal to vec_dot\n", kiln_simd_name(level), checked);
}

/* ---------------------------------------------------------------- rope */

static void check_rope(void) {
    unsigned long long rng = 14;
    enum { T = 6, NHEAD = 3, HS = 64 };
    const int32_t pos[T] = {0, 1, 17, 1000, 4095, 4096};
    static const int64_t dims[] = {64, 32};
    static const float bases[] = {10000.0f, 500000.0f};
    float x[T * NHEAD * HS], out[T * NHEAD * HS], first[T * NHEAD * HS];
    fill_normal(x, T * NHEAD * HS, &rng);
    double worst_rec = 0, worst_exact = 0;
    for (int di = 0; di < COUNT(dims); di++)
        for (int bi = 0; bi < COUNT(bases); bi++)
            for (int neox = 0; neox < 2; neox++)
                for (int p = 0; p < COUNT(pools); p++) {
                    const int64_t d = dims[di];
                    kiln_ops_ctx ctx = {.pool = pools[p]};
                    memcpy(out, x, sizeof x);
                    kiln_cpu_ops.rope_forward(&ctx, out, pos, T, NHEAD, HS, d, bases[bi], NULL, 1.0f, neox);
                    if (p == 0) memcpy(first, out, sizeof out);
                    CHECK(memcmp(first, out, sizeof out) == 0, "threads differ");
                    const float theta_scale = powf(bases[bi], -2.0f / (float)d);
                    for (int t = 0; t < T; t++) {
                        float theta_f = (float)pos[t]; /* llama.cpp's float recurrence */
                        for (int64_t i = 0; i < d / 2; i++, theta_f *= theta_scale) {
                            const double theta = pos[t] * pow(bases[bi], -2.0 * (double)i / (double)d);
                            for (int h = 0; h < NHEAD; h++) {
                                const int64_t a = h * HS + (neox ? i : 2 * i), b = a + (neox ? d / 2 : 1);
                                const float *xr = x + t * NHEAD * HS, *orow = out + t * NHEAD * HS;
                                const double ra = xr[a] * cos(theta_f) - xr[b] * sin(theta_f);
                                const double rb = xr[a] * sin(theta_f) + xr[b] * cos(theta_f);
                                const double ea = xr[a] * cos(theta) - xr[b] * sin(theta);
                                const double eb = xr[a] * sin(theta) + xr[b] * cos(theta);
                                const double e_rec = fmax(fabs(orow[a] - ra), fabs(orow[b] - rb));
                                const double e_exact = fmax(fabs(orow[a] - ea), fabs(orow[b] - eb));
                                worst_rec = fmax(worst_rec, e_rec);
                                worst_exact = fmax(worst_exact, e_exact / (1.0 + pos[t]));
                                /* Bounds (|x| ~ 1): 6e-7 absolute against the float-angle recurrence (measured
                                 * 2.6e-7); against exact angles 2e-7 x (1 + pos), the recurrence's drift (measured
                                 * 1.0e-7 x (1 + pos)). */
                                CHECK(e_rec <= 6e-7, "d %lld neox %d pos %d pair %lld: err %.3g", (long long)d, neox,
                                      pos[t], (long long)i, e_rec);
                                CHECK(e_exact <= 2e-7 * (1.0 + pos[t]), "exact angle: pos %d pair %lld: err %.3g", pos[t],
                                      (long long)i, e_exact);
                            }
                        }
                        for (int h = 0; h < NHEAD; h++) /* the tail past rope_dim is untouched */
                            CHECK(memcmp(out + (t * NHEAD + h) * HS + d, x + (t * NHEAD + h) * HS + d,
                                         (size_t)(HS - d) * sizeof(float)) == 0, "tail changed (d %lld)", (long long)d);
                    }
                }
    printf("# rope: max error %.2e vs the float recurrence (bound 6e-7), %.2e x (1+pos) vs exact angles (bound 2e-7)\n",
           worst_rec, worst_exact);
}

/* ---------------------------------------------------------------- attention */

typedef struct {
    int64_t NH, NKV, HS, pos0, T;
} attn_case;

static void check_attention(void) {
    static const attn_case cases[] = {
        {8, 2, 64, 37, 5},   /* GQA over a prefilled cache */
        {8, 2, 64, 0, 17},   /* a prefill from position 0 */
        {8, 2, 64, 700, 1},  /* one decode step, long enough to go to threads */
        {4, 4, 80, 9, 3},    /* no grouping, HS not a multiple of 64 */
        {6, 3, 20, 5, 4},    /* HS not a multiple of 8: scalar tails */
        {8, 2, 128, 300, 2}, /* two tokens, with 3 threads split over key chunks */
        {4, 1, 64, 9000, 1}, /* past 8192 positions: 256-key chunks */
        /* prefills in rows of 16 lanes (ops_attention_avx512.c) whose units straddle 128-key chunks: 4 tokens x 4
         * heads, 5 x 3, 16 x 1, and HS 256 */
        {8, 2, 64, 120, 20},
        {9, 3, 64, 250, 40},
        {4, 4, 64, 100, 40},
        {4, 1, 256, 100, 40},
    };
    unsigned long long rng = 15;
    double worst = 0;
    for (int c = 0; c < COUNT(cases); c++) {
        const attn_case k = cases[c];
        const int64_t n_ctx = k.pos0 + k.T + 3, kv = k.NKV * k.HS, qw = k.NH * k.HS;
        uint16_t *kc = malloc((size_t)(n_ctx * kv) * 2), *vc = malloc((size_t)(n_ctx * kv) * 2);
        float *q = malloc((size_t)(k.T * qw) * sizeof *q), *out = malloc((size_t)(k.T * qw) * sizeof *out);
        float *first = malloc((size_t)(k.T * qw) * sizeof *first);
        double *s = malloc((size_t)n_ctx * sizeof *s);
        for (int64_t i = 0; i < n_ctx * kv; i++) {
            kc[i] = kiln_f32_to_fp16(test_rng_normal(&rng));
            vc[i] = kiln_f32_to_fp16(test_rng_normal(&rng));
        }
        fill_normal(q, k.T * qw, &rng);
        for (int p = 0; p < COUNT(pools); p++) {
            kiln_ops_ctx ctx = make_ctx(pools[p], k.T, qw, n_ctx);
            memset(out, 0xff, (size_t)(k.T * qw) * sizeof *out);
            kiln_cpu_ops.attention_forward(&ctx, out, q, kc, vc, k.pos0, k.T, k.NH, k.NKV, k.HS);
            free(ctx.scratch);
            if (p == 0) memcpy(first, out, (size_t)(k.T * qw) * sizeof *out);
            CHECK(memcmp(first, out, (size_t)(k.T * qw) * sizeof *out) == 0, "case %d: %d threads differ from 1", c,
                  kiln_pool_size(pools[p]));
        }
        /* Token by token gives the same bits as the batch: key chunks depend only on the position. */
        kiln_ops_ctx ctx = make_ctx(pools[1], k.T, qw, n_ctx);
        for (int64_t t = 0; t < k.T; t++) {
            kiln_cpu_ops.attention_forward(&ctx, out, q + t * qw, kc, vc, k.pos0 + t, 1, k.NH, k.NKV, k.HS);
            CHECK(memcmp(out, first + t * qw, (size_t)qw * sizeof *out) == 0, "case %d token %lld alone differs", c, (long long)t);
        }
        free(ctx.scratch);
        for (int64_t t = 0; t < k.T; t++)
            for (int64_t h = 0; h < k.NH; h++) {
                const int64_t kvh = h / (k.NH / k.NKV), n = k.pos0 + t + 1;
                const float *qh = q + t * qw + h * k.HS;
                double max = -INFINITY, sum = 0;
                for (int64_t j = 0; j < n; j++) {
                    double d = 0;
                    for (int64_t i = 0; i < k.HS; i++) d += (double)qh[i] * kiln_fp16_to_f32(kc[j * kv + kvh * k.HS + i]);
                    s[j] = d / sqrt((double)k.HS);
                    max = fmax(max, s[j]);
                }
                for (int64_t j = 0; j < n; j++) sum += (s[j] = exp(s[j] - max));
                for (int64_t i = 0; i < k.HS; i++) {
                    double ref = 0, mag = 0;
                    for (int64_t j = 0; j < n; j++) {
                        const double v = kiln_fp16_to_f32(vc[j * kv + kvh * k.HS + i]);
                        ref += s[j] / sum * v;
                        mag += s[j] / sum * fabs(v);
                    }
                    const double err = fabs(first[t * qw + h * k.HS + i] - ref) / mag;
                    worst = fmax(worst, err);
                    /* Bound: 1e-6 of sum_j p_j |v_j| (measured 4.6e-7 scalar, 2.4e-7 AVX2: float scores, exps
                     * and sums; q stays float, so no f16 rounding of q or p enters). */
                    CHECK(err <= 1e-6, "case %d t %lld h %lld i %lld: %g vs %g (%.3g)", c, (long long)t, (long long)h,
                          (long long)i, first[t * qw + h * k.HS + i], ref, err);
                }
            }
        free(kc), free(vc), free(q), free(out), free(first), free(s);
    }
    printf("# attention %s: max error %.2e of sum p|v| (bound 1e-6)\n", kiln_simd_name(kiln_cpu_ops_level()), worst);
}

/* ---------------------------------------------------------------- swiglu */

static void check_swiglu(void) {
    unsigned long long rng = 16;
    enum { N = 20000 }; /* past the threshold where it goes to threads; not a multiple of 16 * 3 */
    float *g = malloc(N * sizeof *g), *u = malloc(N * sizeof *u), *out = malloc(N * sizeof *out);
    float *first = malloc(N * sizeof *first);
    for (int i = 0; i < N; i++) g[i] = 20.0f * test_rng_f32(&rng), u[i] = test_rng_normal(&rng);
    /* where exp(-g) overflows (g < -88.7: silu is -0, as with expf), nears it, and where it underflows */
    g[1] = -100.0f, g[2] = 100.0f, g[3] = -87.5f, g[4] = -89.0f, g[5] = 0.0f, g[6] = -0.0f, g[7] = 1e-30f;
    double worst = 0;
    for (int p = 0; p < COUNT(pools); p++)
        for (int64_t n = 13; n <= N; n += N - 13) {
            kiln_ops_ctx ctx = {.pool = pools[p]};
            kiln_cpu_ops.swiglu_forward(&ctx, out, g, u, n);
            for (int64_t i = 0; i < n; i++) {
                const double ref = g[i] / (1.0 + exp(-(double)g[i])) * u[i];
                const double err = fabs(out[i] - ref) / fmax(fabs(ref), 1e-30);
                worst = fmax(worst, err);
                /* Bound: relative 4e-7 (measured 1.7e-7: expf, a division and a product). */
                CHECK(err <= 4e-7, "i %lld: g %g u %g: %g vs %g", (long long)i, g[i], u[i], out[i], ref);
            }
            if (p == 0 && n == N) memcpy(first, out, N * sizeof *out);
            if (n == N) CHECK(memcmp(first, out, N * sizeof *out) == 0, "threads differ");
        }
    memcpy(out, g, N * sizeof *out); /* in place */
    kiln_ops_ctx ctx = {.pool = pools[1]};
    kiln_cpu_ops.swiglu_forward(&ctx, out, out, u, N);
    CHECK(memcmp(first, out, N * sizeof *out) == 0, "in place differs");
    printf("# swiglu at %s: max relative error %.2e (bound 4e-7)\n", kiln_simd_name(kiln_cpu_ops_level()), worst);
    free(g), free(u), free(out), free(first);
}

/* ---------------------------------------------------------------- scratch_size */

static void test_scratch_size(void) {
    size_t (*size)(int64_t, int64_t, int64_t, int64_t, int) = kiln_cpu_ops.scratch_size;
    /* Matmul's T activation rows of the widest vec_dot_type (F16: 2 bytes an element) fit, plus alignment. */
    CHECK(size(64, 4096, 32, 16, 4) >= 64 * 4096 * 2 + 64);
    CHECK(size(1, 32, 1, 1, 1) >= 292 + 64, "a 32-wide row counts as one 292-byte Q8_K block");
    /* More of anything never needs less. */
    CHECK(size(2, 4096, 32, 4096, 16) >= size(1, 4096, 32, 4096, 16));
    CHECK(size(1, 4096, 32, 8192, 16) >= size(1, 4096, 32, 4096, 16));
    CHECK(size(1, 4096, 32, 4096, 16) >= size(1, 4096, 32, 4096, 8));
    CHECK(size(1, 4096, 32, 40000, 16) >= size(1, 4096, 32, 4096, 16));
    /* Decode at 128k positions stays bounded: 64 key chunks, so ~1 MiB of partials per token. */
    CHECK(size(1, 4096, 32, 131072, 16) < ((size_t)32 << 20), "%zu", size(1, 4096, 32, 131072, 16));
    CHECK(size(INT64_MAX / 2, INT64_MAX / 2, 8, 8, 1) == SIZE_MAX, "overflow saturates");
    CHECK(size(1, 8, 8, INT64_MAX / 4, 64) == SIZE_MAX, "overflow saturates");
    CHECK(size(1, INT64_MAX / 8, 8, 1 << 20, 64) == SIZE_MAX, "overflow saturates");
}

/* GEGLU through the op at the forced level: against a double gelu_tanh, every length up to 2 vectors plus a tail
 * (the masked tail must leave out[n..] alone), gates from -12 to 12 and the large ones where tanh saturates. */
static void check_geglu(void) {
    unsigned long long rng = 71;
    kiln_ops_ctx ctx = {0};
    float gate[1031], up[1031], out[1032];
    for (int i = 0; i < 1031; i++) {
        gate[i] = i % 97 == 0 ? 1e4f * test_rng_f32(&rng) : 12.0f * test_rng_f32(&rng);
        up[i] = test_rng_normal(&rng);
    }
    gate[5] = 0.0f, gate[6] = -0.0f, gate[7] = 1e-30f;
    double worst = 0;
    for (int n = 1; n <= 1031; n += n < 20 ? 1 : 101) {
        out[n] = 12345.0f;
        kiln_cpu_geglu_forward(&ctx, out, gate, up, n);
        CHECK(out[n] == 12345.0f, "n %d: wrote past the end", n);
        for (int i = 0; i < n; i++) {
            const double x = gate[i], ref = 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))) * up[i];
            const double e = fabs(out[i] - ref) / (fabs(x * up[i]) + 1e-30);
            if (e > worst) worst = e;
            CHECK(e <= 1e-6, "n %d i %d: gelu(%.9g) * %.9g = %.9g, want %.9g", n, i, x, up[i], out[i], ref);
        }
    }
    printf("# geglu at %s: max error %.2e of |gate * up| (bound 1e-6)\n", kiln_simd_name(kiln_cpu_ops_level()), worst);
}

/* ---------------------------------------------------------------- per level */

/* Runs the ops with the dispatch forced to level (skipped when the CPU lacks it), then restores the best. */
#define LEVEL_TEST(name, check, level)                                                                         \
    static void name(void) {                                                                                   \
        if (kiln_simd_best() < (level))                                                                        \
            SKIP("this CPU (or KILN_SIMD) lacks %s: best is %s", kiln_simd_name(level), kiln_simd_name(kiln_simd_best())); \
        kiln_cpu_ops_force_level(level);                                                                       \
        check();                                                                                               \
        kiln_cpu_ops_force_level(KILN_SIMD_COUNT);                                                             \
    }
LEVEL_TEST(test_embed, check_embed, KILN_SIMD_SCALAR)
LEVEL_TEST(test_rmsnorm, check_rmsnorm, KILN_SIMD_SCALAR)
LEVEL_TEST(test_rope, check_rope, KILN_SIMD_SCALAR)
LEVEL_TEST(test_swiglu, check_swiglu, KILN_SIMD_SCALAR)
LEVEL_TEST(test_swiglu_avx512, check_swiglu, KILN_SIMD_AVX512)
LEVEL_TEST(test_geglu, check_geglu, KILN_SIMD_SCALAR)
LEVEL_TEST(test_geglu_avx2, check_geglu, KILN_SIMD_AVX2)
LEVEL_TEST(test_embed_avx2, check_embed, KILN_SIMD_AVX2)
LEVEL_TEST(test_matmul_scalar, check_matmul, KILN_SIMD_SCALAR)
LEVEL_TEST(test_matmul_avx2, check_matmul, KILN_SIMD_AVX2)
LEVEL_TEST(test_matmul_avx512, check_matmul, KILN_SIMD_AVX512)
LEVEL_TEST(test_gemm4_avx2, check_gemm4, KILN_SIMD_AVX2)
LEVEL_TEST(test_gemm4_avx512, check_gemm4, KILN_SIMD_AVX512)
LEVEL_TEST(test_attention_scalar, check_attention, KILN_SIMD_SCALAR)
LEVEL_TEST(test_attention_avx2, check_attention, KILN_SIMD_AVX2)
/* AVX-512: prefills go through the rows of 16 (ops_attention_avx512.c), decode through the AVX2 kernel; the
 * "alone" check holds them to the same bits */
LEVEL_TEST(test_attention_avx512, check_attention, KILN_SIMD_AVX512)

/* ---------------------------------------------------------------- timing (informative) */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* GFLOP/s of a 2048 x 2048 q4_K matmul (weights of random bytes with sane scales) at T = 1 and T = 64. */
static void time_matmul(void) {
    enum { I = 2048, O = 2048, T = 64 };
    kiln_pool *pool;
    if (kiln_pool_create(0, &pool) != KILN_OK) return;
    kiln_cpu_ops_force_level(KILN_SIMD_COUNT);
    unsigned long long rng = 17;
    size_t row = kiln_type_row_bytes(KILN_TYPE_Q4_K, I);
    uint8_t *w = malloc(row * O);
    for (size_t i = 0; i < row * O; i++) w[i] = (uint8_t)test_rng_next(&rng);
    for (size_t b = 0; b < row * O / sizeof(block_q4_K); b++) {
        block_q4_K *blk = (block_q4_K *)w + b;
        blk->d = kiln_f32_to_fp16(0.01f);
        blk->dmin = kiln_f32_to_fp16(0.002f);
    }
    float *x = malloc((size_t)T * I * sizeof *x), *y = malloc((size_t)T * O * sizeof *y);
    fill_normal(x, (int64_t)T * I, &rng);
    kiln_tensor_view W = make_view(KILN_TYPE_Q4_K, I, O, w);
    kiln_ops_ctx ctx = make_ctx(pool, T, I, 1);
    double gflops[2], gbs = 0;
    for (int k = 0; k < 2; k++) {
        const int64_t n = k ? T : 1;
        kiln_cpu_ops.matmul_forward(&ctx, y, x, &W, n); /* warm */
        int reps = 0;
        double t0 = now_s(), el;
        do {
            kiln_cpu_ops.matmul_forward(&ctx, y, x, &W, n);
            reps++;
        } while ((el = now_s() - t0) < 0.3);
        gflops[k] = 2.0 * I * O * n * reps / el * 1e-9;
        if (!k) gbs = (double)row * O * reps / el * 1e-9;
    }
    printf("# matmul q4_K 2048x2048 (%s, %d threads): T=1 %.1f GFLOP/s (%.1f GB/s of weights), T=64 %.1f GFLOP/s\n",
           kiln_simd_name(kiln_cpu_ops_level()), kiln_pool_size(pool), gflops[0], gbs, gflops[1]);
    free(ctx.scratch), free(w), free(x), free(y);
    kiln_pool_free(pool);
}

int main(void) {
    for (int i = 0; i < COUNT(pools); i++)
        if (kiln_pool_create(i + 1, &pools[i]) != KILN_OK) return 1;
    RUN(test_scratch_size);
    RUN(test_embed);
    RUN(test_embed_avx2);
    RUN(test_rmsnorm);
    RUN(test_rope);
    RUN(test_swiglu);
    RUN(test_swiglu_avx512);
    RUN(test_geglu);
    RUN(test_geglu_avx2);
    RUN(test_matmul_scalar);
    RUN(test_matmul_avx2);
    RUN(test_matmul_avx512);
    RUN(test_gemm4_avx2);
    RUN(test_gemm4_avx512);
    RUN(test_attention_scalar);
    RUN(test_attention_avx2);
    RUN(test_attention_avx512);
    time_matmul();
    for (int i = 0; i < COUNT(pools); i++) kiln_pool_free(pools[i]);
    TEST_EXIT();
}
