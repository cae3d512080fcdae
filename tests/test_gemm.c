/* test_gemm.c: the repacked weights and their kernels (src/cpu/ops_repack.c, gemm_repack_avx512.c, _avx2.c) through
 * the matmul op, for every packed type (Q8_0, Q4_1, Q4_K, Q5_K, Q6_K, Q4_0, IQ4_NL, Q5_0, Q5_1, IQ4_XS, Q2_K, Q3_K), on
 * normal weights quantized by the
 * reference quantizer and on raw random bytes with sane scales (every quant and scale bit pattern), with row
 * counts that leave a partial last group of 16 and token counts that leave partial groups of 8 (and reach the
 * batch kernels, src/cpu/ops_repack.h's kiln_pack_batch_fn, whose bits must be the per-call kernels'):
 *  - against the level's vec_dot on the same quantized activations: the integer sums are the same, only the
 *    order of the float steps differs, so the error is float rounding (bound 1e-5 of sum |w x|);
 *  - against a double dot of the dequantized weights and float x (the bound of tests/test_ops.c, 3e-3);
 *  - bit for bit across pool sizes 1, 2, 3 (and a scratch too small for the batch, so it runs in passes),
 *    across how tokens are grouped (T = 1 calls vs one batch), and between matmul_n_forward and separate matmuls;
 *  - dropping the source pages of a file mapping leaves the mapping readable with its bytes.
 * Where the CPU has AMX, the batches run once with the tile kernels on (gemm_repack_amx.c, opt-in otherwise):
 * runs of 16 tokens go through them, and the bits must be those of the T = 1 calls, which run the VNNI kernels.
 * At the AVX-512 level and at the AVX2 level (gemm_repack_avx2.c: every type; a type without a kernel at a level must
 * stay unpacked there, as at the scalar level); the
 * other tests run at the best level the CPU has. A '# ' line times the repacked matmuls with AVX-512 (informative only). */
#include "test.h"

#include "cpu/ops_repack.h"
#include "fp16.h"

#include <stdint.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define COUNT(a) (int)(sizeof a / sizeof a[0])

static kiln_pool *pools[3];

static kiln_ops_ctx make_ctx(kiln_pool *pool, int64_t T, int64_t max_width) {
    size_t bytes = kiln_cpu_ops.scratch_size(T, max_width, 8, 1, kiln_pool_size(pool));
    return (kiln_ops_ctx){.pool = pool, .scratch = malloc(bytes), .scratch_bytes = bytes};
}

static kiln_tensor_view make_view(kiln_type t, int64_t I, int64_t O, const void *data) {
    size_t row = kiln_type_row_bytes(t, I);
    return (kiln_tensor_view){.name = "w", .type = t, .n_dims = 2, .ne = {I, O, 1, 1},
                              .nb = {kiln_type_block_bytes(t), row, row * (size_t)O, row * (size_t)O},
                              .nbytes = row * (size_t)O, .data = data};
}

/* O rows of I weights of type t: normal values through the reference quantizer, or (raw) random bytes with the
 * block scales set to sane values. deq gets them back as float. */
static uint8_t *make_weights(kiln_type t, int64_t I, int64_t O, bool raw, float *deq, unsigned long long *rng) {
    const kiln_type_traits *tt = kiln_type_traits_get(t);
    const size_t row = kiln_type_row_bytes(t, I), bs = kiln_type_block_bytes(t);
    uint8_t *w = malloc(row * (size_t)O);
    float *tmp = malloc((size_t)I * sizeof *tmp);
    for (int64_t o = 0; o < O; o++) {
        uint8_t *r = w + (size_t)o * row;
        if (!raw) {
            for (int64_t i = 0; i < I; i++) tmp[i] = test_rng_normal(rng);
            tt->from_float_ref(tmp, r, I);
        } else {
            for (size_t i = 0; i < row; i++) r[i] = (uint8_t)test_rng_next(rng);
            for (size_t b = 0; b < row / bs; b++) { /* scales (and mins) of a sane size and either sign */
                uint8_t *blk = r + b * bs;
                const kiln_fp16 d = kiln_f32_to_fp16(0.01f * test_rng_f32(rng)), m = kiln_f32_to_fp16(0.002f * test_rng_f32(rng));
                switch (t) {
                case KILN_TYPE_Q6_K: memcpy(&((block_q6_K *)blk)->d, &d, 2); break;
                case KILN_TYPE_Q8_0: memcpy(&((block_q8_0 *)blk)->d, &d, 2); break;
                case KILN_TYPE_Q2_K: memcpy(&((block_q2_K *)blk)->d, &d, 2), memcpy(&((block_q2_K *)blk)->dmin, &m, 2); break;
                case KILN_TYPE_Q3_K: memcpy(&((block_q3_K *)blk)->d, &d, 2); break;
                default: memcpy(blk, &d, 2), memcpy(blk + 2, &m, 2); break; /* Q4_1 d, m; Q4_K/Q5_K d, dmin */
                }
            }
        }
        tt->to_float[KILN_SIMD_SCALAR](r, deq + o * I, I);
    }
    free(tmp);
    return w;
}

static const kiln_type packed_types[] = {KILN_TYPE_Q8_0, KILN_TYPE_Q4_1, KILN_TYPE_Q4_K, KILN_TYPE_Q5_K, KILN_TYPE_Q6_K,
                                         KILN_TYPE_Q4_0, KILN_TYPE_IQ4_NL, KILN_TYPE_Q5_0, KILN_TYPE_Q5_1, KILN_TYPE_IQ4_XS,
                                         KILN_TYPE_Q2_K, KILN_TYPE_Q3_K};

static bool have_avx512(void) { return kiln_simd_best() >= KILN_SIMD_AVX512; }

/* Every type with a kernel at this level: repacked matmul against vec_dot and the double reference; thread counts;
 * token grouping. A type without one must not be repacked. */
static void repacked_matmul_at(kiln_simd level) {
    kiln_cpu_ops_force_level(level);
    unsigned long long rng = 31;
    enum { IMAX = 2304, TMAX = 37 }; /* 37 tokens: the batch kernels (32 or more) and a partial last 8 */
    static const int64_t Os[] = {37, 64};
    float *x = malloc((size_t)TMAX * IMAX * sizeof *x), *deq = malloc((size_t)64 * IMAX * sizeof *deq);
    float *y = malloc((size_t)TMAX * 64 * sizeof *y), *y1 = malloc((size_t)TMAX * 64 * sizeof *y1), *ys = malloc(64 * sizeof *ys);
    for (int64_t i = 0; i < (int64_t)TMAX * IMAX; i++) x[i] = test_rng_normal(&rng);
    double worst_dot = 0, worst_ref = 0;
    int n_types = 0;
    for (int ti = 0; ti < COUNT(packed_types); ti++)
        for (int oi = 0; oi < COUNT(Os); oi++)
            for (int raw = 0; raw < 2; raw++) {
                const kiln_type type = packed_types[ti], vt = kiln_type_traits_get(type)->vec_dot_type;
                const int64_t O = Os[oi];
                /* 9 blocks of 256 (the Q2_K batch kernel converts 8 at a time), or 25 of 32 (an odd count: the AMX
                 * kernels' last block runs alone) */
                const int64_t I = kiln_type_block_size(type) == QK_K ? 2304 : 800;
                uint8_t *w = make_weights(type, I, O, raw, deq, &rng);
                const kiln_tensor_view W = make_view(type, I, O, w);
                const kiln_tensor_view *Wp = &W;
                if (!kiln_pack_kernel(type, level)) {
                    kiln_ops_ctx ctx = make_ctx(pools[0], TMAX, I);
                    CHECK(kiln_cpu_ops.prepare_weights(&ctx, &Wp, 1, false) == KILN_OK, "%s", kiln_last_error());
                    CHECK(kiln_cpu_packed_find(&ctx, &W) == NULL, "%s was repacked at %s without a kernel", kiln_type_name(type),
                          kiln_simd_name(level));
                    kiln_cpu_ops.release_weights(&ctx);
                    free(ctx.scratch);
                    free(w);
                    continue;
                }
                n_types += oi == 0 && raw == 0;
                for (int p = 0; p < COUNT(pools); p++) {
                    /* Pool 3 gets scratch for only 4 rows: the matmul must take T in passes and agree. */
                    kiln_ops_ctx ctx = make_ctx(pools[p], p == 2 ? 4 : TMAX, I);
                    CHECK(kiln_cpu_ops.prepare_weights(&ctx, &Wp, 1, false) == KILN_OK, "%s", kiln_last_error());
                    const kiln_cpu_packed *P = kiln_cpu_packed_find(&ctx, &W);
                    CHECK(P != NULL, "%s was not repacked", kiln_type_name(type));
                    if (P) /* the tile kernel exactly where the CPU has AMX, it is on, and the type has one */
                        CHECK((P->gemm16 != NULL) == (level >= KILN_SIMD_AVX512 && kiln_cpu_ops_amx() && kiln_pack_amx_kernel(type)),
                              "%s: AMX kernel %s", kiln_type_name(type), P->gemm16 ? "used where it should not be" : "missing");
                    if (P && level >= KILN_SIMD_AVX512 && (type == KILN_TYPE_Q2_K || type == KILN_TYPE_Q3_K))
                        CHECK(P->batch != NULL, "%s: no batch kernel at AVX-512", kiln_type_name(type));
                    memset(y, 0xff, (size_t)TMAX * O * sizeof *y);
                    kiln_cpu_ops.matmul_forward(&ctx, y, x, &W, TMAX);
                    if (p == 0) memcpy(y1, y, (size_t)TMAX * O * sizeof *y);
                    CHECK(memcmp(y, y1, (size_t)TMAX * O * sizeof *y) == 0, "%s: %d threads differ from 1", kiln_type_name(type),
                          kiln_pool_size(pools[p]));
                    /* one token at a time, as decode runs: the same bits as inside the batch */
                    for (int64_t t = 0; t < TMAX; t += 5) {
                        kiln_cpu_ops.matmul_forward(&ctx, ys, x + t * I, &W, 1);
                        CHECK(memcmp(ys, y1 + t * O, (size_t)O * sizeof *ys) == 0, "%s token %lld alone differs from the batch",
                              kiln_type_name(type), (long long)t);
                    }
                    kiln_cpu_ops.release_weights(&ctx);
                    CHECK(ctx.prepared == NULL);
                    free(ctx.scratch);
                }
                /* the same activations through vec_dot, and the double reference */
                const kiln_vec_dot_fn dot = kiln_get_vec_dot(type, level);
                const size_t xq_row = kiln_type_row_bytes(vt, I);
                char *xq = malloc(xq_row);
                for (int64_t t = 0; t < TMAX; t++) {
                    kiln_get_from_float(vt, level)(x + t * I, xq, I);
                    for (int64_t o = 0; o < O; o++) {
                        float s;
                        dot(I, &s, w + (size_t)o * W.nb[1], xq);
                        double ref = 0, norm = 0;
                        for (int64_t i = 0; i < I; i++) {
                            ref += (double)deq[o * I + i] * x[t * I + i];
                            norm += fabs((double)deq[o * I + i] * x[t * I + i]);
                        }
                        const double e_dot = fabs((double)y1[t * O + o] - s) / norm, e_ref = fabs(y1[t * O + o] - ref) / norm;
                        if (e_dot > worst_dot) worst_dot = e_dot;
                        if (e_ref > worst_ref) worst_ref = e_ref;
                        /* Bounds: float rounding only (measured 1.5e-7), and tests/test_ops.c's 3e-3 (measured 1.3e-3) */
                        CHECK(e_dot <= 1e-5, "%s raw %d t %lld o %lld: %.9g vs vec_dot %.9g (%.3g of sum|wx|)", kiln_type_name(type),
                              raw, (long long)t, (long long)o, y1[t * O + o], s, e_dot);
                        CHECK(e_ref <= 3e-3, "%s raw %d t %lld o %lld: %.9g vs %.9g (%.3g of sum|wx|)", kiln_type_name(type), raw,
                              (long long)t, (long long)o, y1[t * O + o], ref, e_ref);
                    }
                }
                free(xq);
                free(w);
            }
    printf("# repacked matmul at %s%s: %d types, max error %.2e of sum|wx| against vec_dot (bound 1e-5), %.2e against double (bound 3e-3)\n",
           kiln_simd_name(level), level >= KILN_SIMD_AVX512 && kiln_cpu_ops_amx() ? " with AMX" : "", n_types, worst_dot, worst_ref);
    CHECK(n_types > 0, "no type has a repacked kernel at %s", kiln_simd_name(level));
    free(x), free(deq), free(y), free(y1), free(ys);
    kiln_cpu_ops_force_level(KILN_SIMD_COUNT);
}

static void test_repacked_matmul(void) {
    if (kiln_simd_best() < KILN_SIMD_AVX2) SKIP("no AVX2 on this CPU");
    if (have_avx512() && kiln_simd_amx()) { /* the tile kernels, opt-in otherwise (KILN_AMX=1) */
        kiln_cpu_ops_force_amx(true);
        repacked_matmul_at(KILN_SIMD_AVX512);
        kiln_cpu_ops_force_amx(false);
    } else {
        printf("# no AMX on this CPU: the tile kernels are not run\n");
    }
    if (have_avx512()) repacked_matmul_at(KILN_SIMD_AVX512);
    repacked_matmul_at(KILN_SIMD_AVX2);
}

/* matmul_n_forward: q, k, v of different widths and types in one job give the bits of three matmuls; a part that
 * cannot share the quantized x (another activation format) runs on its own and still agrees. */
static void test_matmul_n(void) {
    if (kiln_simd_best() < KILN_SIMD_AVX2) SKIP("no AVX2 on this CPU");
    kiln_cpu_ops_force_level(KILN_SIMD_COUNT);
    unsigned long long rng = 32;
    enum { I = 512, T = 13 };
    static const kiln_type types[][3] = {{KILN_TYPE_Q4_K, KILN_TYPE_Q4_K, KILN_TYPE_Q6_K},
                                         {KILN_TYPE_Q8_0, KILN_TYPE_Q4_K, KILN_TYPE_F32},
                                         {KILN_TYPE_Q4_1, KILN_TYPE_Q4_1, KILN_TYPE_Q4_1}};
    static const int64_t Os[3] = {96, 48, 40};
    float *x = malloc((size_t)T * I * sizeof *x), *deq = malloc((size_t)96 * I * sizeof *deq);
    for (int64_t i = 0; i < (int64_t)T * I; i++) x[i] = test_rng_normal(&rng);
    for (int ci = 0; ci < COUNT(types); ci++)
        for (int prepared = 0; prepared < 2; prepared++) {
            uint8_t *w[3];
            kiln_tensor_view W[3];
            const kiln_tensor_view *Wp[3];
            float *y[3], *ysep[3];
            for (int i = 0; i < 3; i++) {
                w[i] = make_weights(types[ci][i], I, Os[i], false, deq, &rng);
                W[i] = make_view(types[ci][i], I, Os[i], w[i]);
                Wp[i] = &W[i];
                y[i] = malloc((size_t)T * Os[i] * sizeof(float));
                ysep[i] = malloc((size_t)T * Os[i] * sizeof(float));
            }
            kiln_ops_ctx ctx = make_ctx(pools[1], T, I);
            if (prepared) CHECK(kiln_cpu_ops.prepare_weights(&ctx, Wp, 3, false) == KILN_OK, "%s", kiln_last_error());
            for (int64_t n = 1; n <= T; n += T - 1) {
                kiln_cpu_ops.matmul_n_forward(&ctx, 3, y, x, Wp, n);
                for (int i = 0; i < 3; i++) kiln_cpu_ops.matmul_forward(&ctx, ysep[i], x, Wp[i], n);
                for (int i = 0; i < 3; i++)
                    CHECK(memcmp(y[i], ysep[i], (size_t)n * Os[i] * sizeof(float)) == 0, "case %d prepared %d T %lld: part %d differs",
                          ci, prepared, (long long)n, i);
            }
            kiln_cpu_ops.release_weights(&ctx);
            free(ctx.scratch);
            for (int i = 0; i < 3; i++) free(w[i]), free(y[i]), free(ysep[i]);
        }
    free(x), free(deq);
}

/* A file mapping whose pages prepare_weights dropped still reads as the file; the matmuls agree before and after.
 * The type is one the best level repacks: q4_K with AVX-512, q4_1 with AVX2 only. */
static void test_drop_source(void) {
    if (kiln_simd_best() < KILN_SIMD_AVX2) SKIP("no AVX2 on this CPU");
    kiln_cpu_ops_force_level(KILN_SIMD_COUNT);
    const kiln_type type = have_avx512() ? KILN_TYPE_Q4_K : KILN_TYPE_Q4_1;
    CHECK(kiln_pack_kernel(type, kiln_simd_best()) != NULL);
    unsigned long long rng = 33;
    enum { I = 1024, O = 256, T = 3 };
    float *deq = malloc((size_t)O * I * sizeof *deq), *x = malloc((size_t)T * I * sizeof *x);
    float *y0 = malloc((size_t)T * O * sizeof *y0), *y1 = malloc((size_t)T * O * sizeof *y1);
    for (int64_t i = 0; i < (int64_t)T * I; i++) x[i] = test_rng_normal(&rng);
    uint8_t *w = make_weights(type, I, O, false, deq, &rng);
    const size_t bytes = kiln_type_row_bytes(type, I) * O;
    char path[] = "/tmp/kiln_test_gemm_XXXXXX";
    const int fd = mkstemp(path);
    CHECK(fd >= 0);
    const bool written = write(fd, w, bytes) == (ssize_t)bytes;
    void *map = written ? mmap(NULL, bytes, PROT_READ, MAP_PRIVATE, fd, 0) : MAP_FAILED;
    close(fd);
    unlink(path);
    CHECK(map != MAP_FAILED);
    const kiln_tensor_view W = make_view(type, I, O, map);
    const kiln_tensor_view *Wp = &W;
    kiln_ops_ctx ctx = make_ctx(pools[1], T, I);
    kiln_cpu_ops.matmul_forward(&ctx, y0, x, &W, T); /* in place */
    CHECK(kiln_cpu_ops.prepare_weights(&ctx, &Wp, 1, true) == KILN_OK, "%s", kiln_last_error());
    CHECK(ctx.prepared != NULL && kiln_cpu_packed_find(&ctx, &W), "not repacked");
    kiln_cpu_ops.release_weights(&ctx);
    kiln_cpu_ops.matmul_forward(&ctx, y1, x, &W, T); /* in place again, from pages read back from the file */
    const bool same_bytes = memcmp(map, w, bytes) == 0, same_y = memcmp(y0, y1, (size_t)T * O * sizeof *y0) == 0;
    munmap(map, bytes);
    free(ctx.scratch), free(deq), free(x), free(y0), free(y1), free(w);
    CHECK(same_bytes, "the mapping changed after its pages were dropped");
    CHECK(same_y);
}

/* The Q8_0 and Q8_1 panels built at AVX2 (kiln_pack_panel_q8_avx2, F16C's conversions) hold the bits of the panel
 * built block by block from the level's quantizer and kiln_fp16_to_f32: blocks from 1e-9 to 1e5 in size, all-zero
 * blocks, and scales past the f16 range (inf) and into its subnormals. */
static void test_panel_bits(void) {
    if (kiln_simd_best() < KILN_SIMD_AVX2) SKIP("this CPU (or KILN_SIMD) lacks avx2");
    enum { NB = 48, I = 32 * NB };
    unsigned long long rng = 77;
    float *x = malloc(I * sizeof *x);
    static const float sizes[] = {0.0f, 1e-9f, 3e-7f, 1e-5f, 0.01f, 1.0f, 300.0f, 1e4f, 1e5f, 9e6f};
    for (int b = 0; b < NB; b++)
        for (int i = 0; i < 32; i++) x[32 * b + i] = sizes[b % COUNT(sizes)] * test_rng_normal(&rng);
    for (int v = 0; v < 2; v++) {
        const kiln_type panel = v ? KILN_TYPE_Q8_1 : KILN_TYPE_Q8_0;
        const size_t bytes = kiln_pack_panel_row_bytes(panel, I);
        char *got = calloc(1, bytes), *want = calloc(1, bytes);
        kiln_pack_panel_quantize(panel, KILN_SIMD_AVX2, x, got, I, 0, NB);
        float *d = (float *)(want + I), *sm = d + NB;
        int32_t *corr = (int32_t *)(d + NB);
        for (int b = 0; b < NB; b++) {
            if (v) {
                block_q8_1 blk;
                kiln_get_from_float(KILN_TYPE_Q8_1, KILN_SIMD_AVX2)(x + 32 * b, &blk, 32);
                memcpy(want + 32 * b, blk.qs, 32);
                d[b] = kiln_fp16_to_f32(blk.d), sm[b] = kiln_fp16_to_f32(blk.s);
            } else {
                block_q8_0 blk;
                kiln_get_from_float(KILN_TYPE_Q8_0, KILN_SIMD_AVX2)(x + 32 * b, &blk, 32);
                memcpy(want + 32 * b, blk.qs, 32);
                int32_t sum = 0;
                for (int i = 0; i < 32; i++) sum += blk.qs[i];
                d[b] = kiln_fp16_to_f32(blk.d), corr[b] = -128 * sum;
            }
        }
        CHECK(memcmp(got, want, (size_t)I + 2 * NB * sizeof(float)) == 0, "%s panel differs from the quantizer's blocks",
              kiln_type_name(panel));
        free(got), free(want);
    }
    free(x);
}

/* Weights without a packed form, or at a level without the kernels, are left alone and read in place. */
static void test_not_packed(void) {
    unsigned long long rng = 34;
    enum { I = 256, O = 32 };
    float *deq = malloc((size_t)O * I * sizeof *deq);
    uint8_t *w_f32 = make_weights(KILN_TYPE_F32, I, O, false, deq, &rng), *w_f16 = make_weights(KILN_TYPE_F16, I, O, false, deq, &rng);
    const kiln_tensor_view W[2] = {make_view(KILN_TYPE_F32, I, O, w_f32), make_view(KILN_TYPE_F16, I, O, w_f16)};
    const kiln_tensor_view *Wp[2] = {&W[0], &W[1]};
    kiln_ops_ctx ctx = {.pool = pools[0]};
    CHECK(kiln_cpu_ops.prepare_weights(&ctx, Wp, 2, false) == KILN_OK);
    CHECK(ctx.prepared == NULL && !kiln_cpu_packed_find(&ctx, &W[0]));
    uint8_t *w_q8 = make_weights(KILN_TYPE_Q6_K, I, O, false, deq, &rng); /* no kernel at the scalar level */
    const kiln_tensor_view Q8 = make_view(KILN_TYPE_Q6_K, I, O, w_q8);
    const kiln_tensor_view *Q8p = &Q8;
    kiln_cpu_ops_force_level(KILN_SIMD_SCALAR);
    CHECK(kiln_cpu_ops.prepare_weights(&ctx, &Q8p, 1, false) == KILN_OK);
    CHECK(ctx.prepared == NULL, "repacked at a level without the kernels");
    kiln_cpu_ops_force_level(KILN_SIMD_COUNT);
    free(deq), free(w_f32), free(w_f16), free(w_q8);
}

/* ---------------------------------------------------------------- timing (informative) */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* GFLOP/s of a 2048 x 2048 repacked matmul per packed type at T = 1 and T = 64, all cores. */
static void time_repacked(void) {
    if (!have_avx512()) return;
    enum { I = 2048, O = 2048, T = 64 };
    kiln_pool *pool;
    if (kiln_pool_create(0, &pool) != KILN_OK) return;
    kiln_cpu_ops_force_level(KILN_SIMD_COUNT);
    unsigned long long rng = 17;
    float *x = malloc((size_t)T * I * sizeof *x), *y = malloc((size_t)T * O * sizeof *y), *deq = malloc((size_t)O * I * sizeof *deq);
    for (int64_t i = 0; i < (int64_t)T * I; i++) x[i] = test_rng_normal(&rng);
    for (int ti = 0; ti < COUNT(packed_types); ti++) {
        uint8_t *w = make_weights(packed_types[ti], I, O, true, deq, &rng);
        const kiln_tensor_view W = make_view(packed_types[ti], I, O, w);
        const kiln_tensor_view *Wp = &W;
        kiln_ops_ctx ctx = make_ctx(pool, T, I);
        if (kiln_cpu_ops.prepare_weights(&ctx, &Wp, 1, false) != KILN_OK) break;
        double gflops[2];
        for (int k = 0; k < 2; k++) {
            const int64_t n = k ? T : 1;
            kiln_cpu_ops.matmul_forward(&ctx, y, x, &W, n); /* warm */
            int reps = 0;
            double t0 = now_s(), el;
            do {
                kiln_cpu_ops.matmul_forward(&ctx, y, x, &W, n);
                reps++;
            } while ((el = now_s() - t0) < 0.2);
            gflops[k] = 2.0 * I * O * n * reps / el * 1e-9;
        }
        printf("# repacked %-4s 2048x2048 (%d threads): T=1 %.1f GFLOP/s (%.1f GB/s of weights), T=64 %.1f GFLOP/s\n",
               kiln_type_name(packed_types[ti]), kiln_pool_size(pool), gflops[0], gflops[0] / 2 / I / O * W.nbytes,
               gflops[1]);
        kiln_cpu_ops.release_weights(&ctx);
        free(ctx.scratch), free(w);
    }
    free(x), free(y), free(deq);
    kiln_pool_free(pool);
}

int main(void) {
    for (int i = 0; i < COUNT(pools); i++)
        if (kiln_pool_create(i + 1, &pools[i]) != KILN_OK) return 1;
    RUN(test_repacked_matmul);
    RUN(test_matmul_n);
    RUN(test_drop_source);
    RUN(test_not_packed);
    RUN(test_panel_bits);
    time_repacked();
    for (int i = 0; i < COUNT(pools); i++) kiln_pool_free(pools[i]);
    TEST_EXIT();
}
