/* test_dense.c: the dense matmul of training (src/cpu/ops_dense.c: y = x W^T, dx += dy W, dW += dy^T x) against
 * double-precision references written here, on seeded random inputs of odd shapes (not multiples of any tile), with
 * F32 and BF16 weights, at every SIMD level this CPU has, and with pools of 1, 2 and 3 threads that must agree bit
 * for bit. It also checks the += semantics on pre-filled gradients, that a NULL dx or dW leaves the other's bits
 * unchanged, and that a short scratch (fewer threads, smaller blocks) gives the same bits. '# ' lines report the
 * worst errors and time the AVX-512 products at training shapes (informative only). */
#include "test.h"

#include "cpu/ops_internal.h"
#include "fp16.h"

#include <stdint.h>
#include <time.h>

#define COUNT(a) (int)(sizeof a / sizeof a[0])

static kiln_pool *pools[3]; /* 1, 2 and 3 threads (3 does not divide the work evenly) */

/* Error measure: |got - ref| / (|c0| + sum_k |a_k b_k|), ref in double over the same float inputs (BF16 weights
 * widened). fp32 accumulation over K terms is bounded by about K * 2^-24 in the worst case; random signs give
 * far less. Bound 1e-6 for every level and product (K <= 1000 here), about 3x the worst measured (printed on the
 * '# ' lines): scalar y 2.9e-7, dx 2.6e-7, dW 2.3e-7; AVX2 and AVX-512 (the same bits) y 3.0e-7, dx 2.0e-7,
 * dW 2.5e-7. With BF16 weights the reference uses the widened weights, so the bound is the same: the op adds no
 * error of its own to the weights' rounding. */
#define DENSE_BOUND 1e-6

typedef struct {
    int64_t N, I, O;
} shape;
/* 7x13x5 is under every tile; 37x45x70 crosses tile edges on every side; 130x200x300 goes to threads and
 * splits dx's reduction (K = O = 300) in two blocks; 5x300x1000 has fewer rows than an AVX-512 tile, so its
 * threads split columns, and splits the forward's reduction (K = I = 300). */
static const shape shapes[] = {{7, 13, 5}, {37, 45, 70}, {130, 200, 300}, {5, 300, 1000}};

static void fill(float *x, int64_t n, unsigned long long *rng) {
    for (int64_t i = 0; i < n; i++) x[i] = test_rng_normal(rng);
}

static kiln_ops_ctx make_ctx(kiln_pool *pool, size_t bytes) {
    return (kiln_ops_ctx){.pool = pool, .scratch = bytes ? malloc(bytes) : NULL, .scratch_bytes = bytes};
}

/* worst |got - ref| / (|c0| + sum |terms|) over n elements; ref and mag from the reference. */
static double rel_err(const float *got, const double *ref, const double *mag, int64_t n) {
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        const double e = fabs((double)got[i] - ref[i]) / (mag[i] > 0 ? mag[i] : 1.0);
        if (!(e <= worst)) worst = e; /* NaN sticks */
    }
    return worst;
}

static double worst_fwd[KILN_SIMD_COUNT], worst_dx[KILN_SIMD_COUNT], worst_dw[KILN_SIMD_COUNT];

static void check_dense(void) {
    const kiln_simd level = kiln_cpu_ops_level();
    unsigned long long rng = 21;
    for (int si = 0; si < COUNT(shapes); si++) {
        const int64_t N = shapes[si].N, I = shapes[si].I, O = shapes[si].O;
        const size_t nx = (size_t)(N * I), ny = (size_t)(N * O), nw = (size_t)(O * I);
        float *x = malloc(nx * sizeof *x), *dy = malloc(ny * sizeof *dy), *w = malloc(nw * sizeof *w);
        float *dx0 = malloc(nx * sizeof *dx0), *dw0 = malloc(nw * sizeof *dw0);
        kiln_bf16 *wh = malloc(nw * sizeof *wh);
        float *y = malloc(ny * sizeof *y), *dx = malloc(nx * sizeof *dx), *dw = malloc(nw * sizeof *dw);
        float *y1 = malloc(ny * sizeof *y1), *dx1 = malloc(nx * sizeof *dx1), *dw1 = malloc(nw * sizeof *dw1);
        double *ry = malloc(ny * sizeof *ry), *my = malloc(ny * sizeof *my);
        double *rdx = malloc(nx * sizeof *rdx), *mdx = malloc(nx * sizeof *mdx);
        double *rdw = malloc(nw * sizeof *rdw), *mdw = malloc(nw * sizeof *mdw);
        fill(x, (int64_t)nx, &rng), fill(dy, (int64_t)ny, &rng), fill(dx0, (int64_t)nx, &rng), fill(dw0, (int64_t)nw, &rng);
        fill(w, (int64_t)nw, &rng);
        for (int bf = 0; bf < 2; bf++) {
            const kiln_type wt = bf ? KILN_TYPE_BF16 : KILN_TYPE_F32;
            const void *W = w;
            if (bf) { /* the reference uses the widened bf16 weights: the op's only error is then fp32 summation */
                for (size_t i = 0; i < nw; i++) wh[i] = kiln_f32_to_bf16(w[i]), w[i] = kiln_bf16_to_f32(wh[i]);
                W = wh;
            }
            /* references: y = x W^T, dx = dx0 + dy W, dW = dW0 + dy^T x */
            for (int64_t n = 0; n < N; n++)
                for (int64_t o = 0; o < O; o++) {
                    double s = 0, m = 0;
                    for (int64_t i = 0; i < I; i++) s += (double)x[n * I + i] * w[o * I + i], m += fabs((double)x[n * I + i] * w[o * I + i]);
                    ry[n * O + o] = s, my[n * O + o] = m;
                }
            for (int64_t n = 0; n < N; n++)
                for (int64_t i = 0; i < I; i++) {
                    double s = dx0[n * I + i], m = fabs(s);
                    for (int64_t o = 0; o < O; o++) s += (double)dy[n * O + o] * w[o * I + i], m += fabs((double)dy[n * O + o] * w[o * I + i]);
                    rdx[n * I + i] = s, mdx[n * I + i] = m;
                }
            for (int64_t o = 0; o < O; o++)
                for (int64_t i = 0; i < I; i++) {
                    double s = dw0[o * I + i], m = fabs(s);
                    for (int64_t n = 0; n < N; n++) s += (double)dy[n * O + o] * x[n * I + i], m += fabs((double)dy[n * O + o] * x[n * I + i]);
                    rdw[o * I + i] = s, mdw[o * I + i] = m;
                }
            for (int p = 0; p < COUNT(pools); p++) {
                const int nth = kiln_pool_size(pools[p]);
                kiln_ops_ctx ctx = make_ctx(pools[p], kiln_cpu_dense_scratch_size(N, I, O, nth));
                memset(y, 0xff, ny * sizeof *y); /* NaN: y must be overwritten */
                kiln_cpu_ops.dense_forward(&ctx, y, x, W, wt, N, I, O);
                memcpy(dx, dx0, nx * sizeof *dx), memcpy(dw, dw0, nw * sizeof *dw);
                kiln_cpu_ops.dense_backward(&ctx, dx, dw, dy, x, W, wt, N, I, O);
                const double ey = rel_err(y, ry, my, (int64_t)ny), edx = rel_err(dx, rdx, mdx, (int64_t)nx),
                             edw = rel_err(dw, rdw, mdw, (int64_t)nw);
                const char *what = bf ? "bf16" : "f32";
                CHECK(ey <= DENSE_BOUND, "%s %lldx%lldx%lld y: %.3g", what, (long long)N, (long long)I, (long long)O, ey);
                CHECK(edx <= DENSE_BOUND, "%s %lldx%lldx%lld dx: %.3g", what, (long long)N, (long long)I, (long long)O, edx);
                CHECK(edw <= DENSE_BOUND, "%s %lldx%lldx%lld dW: %.3g", what, (long long)N, (long long)I, (long long)O, edw);
                if (ey > worst_fwd[level]) worst_fwd[level] = ey;
                if (edx > worst_dx[level]) worst_dx[level] = edx;
                if (edw > worst_dw[level]) worst_dw[level] = edw;
                if (p == 0) {
                    memcpy(y1, y, ny * sizeof *y), memcpy(dx1, dx, nx * sizeof *dx), memcpy(dw1, dw, nw * sizeof *dw);
                } else {
                    CHECK(memcmp(y, y1, ny * sizeof *y) == 0, "%s y: %d threads differ from 1", what, nth);
                    CHECK(memcmp(dx, dx1, nx * sizeof *dx) == 0, "%s dx: %d threads differ from 1", what, nth);
                    CHECK(memcmp(dw, dw1, nw * sizeof *dw) == 0, "%s dW: %d threads differ from 1", what, nth);
                }
                /* NULL dW, then NULL dx: the other gradient gets the same bits as when both are asked for */
                memcpy(dx, dx0, nx * sizeof *dx);
                kiln_cpu_ops.dense_backward(&ctx, dx, NULL, dy, x, W, wt, N, I, O);
                CHECK(memcmp(dx, dx1, nx * sizeof *dx) == 0, "%s dx alone differs", what);
                memcpy(dw, dw0, nw * sizeof *dw);
                kiln_cpu_ops.dense_backward(&ctx, NULL, dw, dy, x, W, wt, N, I, O);
                CHECK(memcmp(dw, dw1, nw * sizeof *dw) == 0, "%s dW alone differs", what);
                kiln_cpu_ops.dense_backward(&ctx, NULL, NULL, dy, x, W, wt, N, I, O); /* nothing to do */
                free(ctx.scratch);
                /* A quarter of the scratch: the blocked levels fall back to one thread and smaller blocks, the
                 * bits stay (still at least one minimal area: 12 + 32 panel widths x 256 steps = 44 KiB). */
                if (level > KILN_SIMD_SCALAR && p == COUNT(pools) - 1) {
                    ctx = make_ctx(pools[p], kiln_cpu_dense_scratch_size(N, I, O, 1) / 4);
                    if (ctx.scratch_bytes >= (size_t)(44 << 10) + 64) {
                        kiln_cpu_ops.dense_forward(&ctx, y, x, W, wt, N, I, O);
                        memcpy(dx, dx0, nx * sizeof *dx), memcpy(dw, dw0, nw * sizeof *dw);
                        kiln_cpu_ops.dense_backward(&ctx, dx, dw, dy, x, W, wt, N, I, O);
                        CHECK(memcmp(y, y1, ny * sizeof *y) == 0, "%s y: short scratch differs", what);
                        CHECK(memcmp(dx, dx1, nx * sizeof *dx) == 0, "%s dx: short scratch differs", what);
                        CHECK(memcmp(dw, dw1, nw * sizeof *dw) == 0, "%s dW: short scratch differs", what);
                    }
                    free(ctx.scratch);
                }
            }
        }
        free(x), free(dy), free(w), free(dx0), free(dw0), free(wh), free(y), free(dx), free(dw);
        free(y1), free(dx1), free(dw1), free(ry), free(my), free(rdx), free(mdx), free(rdw), free(mdw);
    }
    /* A reduction of length 0: y is zeroed, gradients untouched. */
    float y0[6] = {1, 2, 3, 4, 5, 6}, g[6] = {1, 2, 3, 4, 5, 6};
    kiln_ops_ctx ctx = {.pool = pools[0]};
    kiln_cpu_ops.dense_forward(&ctx, y0, g, g, KILN_TYPE_F32, 2, 0, 3);
    for (int i = 0; i < 6; i++) CHECK(y0[i] == 0.0f, "I = 0: y[%d] = %g", i, y0[i]);
    kiln_cpu_ops.dense_backward(&ctx, y0, g, y0, y0, y0, KILN_TYPE_F32, 2, 3, 0);
    for (int i = 0; i < 6; i++) CHECK(y0[i] == 0.0f && g[i] == (float)(i + 1), "O = 0 changed a gradient");
    printf("# dense %s: worst error / sum|terms|: y %.2e, dx %.2e, dW %.2e (bound %.0e)\n", kiln_simd_name(level),
           worst_fwd[level], worst_dx[level], worst_dw[level], DENSE_BOUND);
}

static void test_scratch_size(void) {
    size_t (*size)(int64_t, int64_t, int64_t, int) = kiln_cpu_dense_scratch_size;
    CHECK(size(0, 384, 384, 2) == 0 && size(4096, 0, 384, 2) == 0);
    CHECK(size(4096, 384, 1024, 2) >= size(4096, 384, 384, 2));
    CHECK(size(4096, 384, 384, 3) >= size(4096, 384, 384, 2));
    CHECK(size(4096, 384, 384, 2) >= size(7, 13, 5, 2));
    /* The blocks are capped, so the scratch is too: a few MiB a thread whatever the shape. */
    CHECK(size(INT64_MAX / 4, INT64_MAX / 4, INT64_MAX / 4, 2) == size(1 << 20, 1 << 20, 1 << 20, 2));
    CHECK(size(1 << 20, 1 << 20, 1 << 20, 1) < ((size_t)4 << 20), "%zu", size(1 << 20, 1 << 20, 1 << 20, 1));
}

/* ---------------------------------------------------------------- per level */

#define LEVEL_TEST(name, check, level)                                                                         \
    static void name(void) {                                                                                   \
        if (kiln_simd_best() < (level))                                                                        \
            SKIP("this CPU (or KILN_SIMD) lacks %s: best is %s", kiln_simd_name(level), kiln_simd_name(kiln_simd_best())); \
        kiln_cpu_ops_force_level(level);                                                                       \
        check();                                                                                               \
        kiln_cpu_ops_force_level(KILN_SIMD_COUNT);                                                             \
    }
LEVEL_TEST(test_dense_scalar, check_dense, KILN_SIMD_SCALAR)
LEVEL_TEST(test_dense_avx2, check_dense, KILN_SIMD_AVX2)
LEVEL_TEST(test_dense_avx512, check_dense, KILN_SIMD_AVX512)

/* AVX2 and AVX-512 compute every element as the same chain (one fused multiply-add a step, k in order, the
 * same KC blocks, then one add into C), so they agree bit for bit: a machine without AVX-512 trains the same. */
static void test_dense_levels_agree(void) {
    if (kiln_simd_best() < KILN_SIMD_AVX512) SKIP("this CPU (or KILN_SIMD) lacks avx512");
    unsigned long long rng = 23;
    for (int si = 1; si < COUNT(shapes); si++) {
        const int64_t N = shapes[si].N, I = shapes[si].I, O = shapes[si].O;
        const size_t nx = (size_t)(N * I), ny = (size_t)(N * O), nw = (size_t)(O * I);
        float *x = malloc(nx * sizeof *x), *dy = malloc(ny * sizeof *dy), *w = malloc(nw * sizeof *w);
        kiln_bf16 *wh = malloc(nw * sizeof *wh);
        float *out[2];
        for (int l = 0; l < 2; l++) out[l] = calloc(ny + nx + nw, sizeof(float));
        fill(x, (int64_t)nx, &rng), fill(dy, (int64_t)ny, &rng), fill(w, (int64_t)nw, &rng);
        for (size_t i = 0; i < nw; i++) wh[i] = kiln_f32_to_bf16(w[i]);
        for (int bf = 0; bf < 2; bf++) {
            for (int l = 0; l < 2; l++) {
                kiln_cpu_ops_force_level(l ? KILN_SIMD_AVX512 : KILN_SIMD_AVX2);
                kiln_ops_ctx ctx = make_ctx(pools[2], kiln_cpu_dense_scratch_size(N, I, O, kiln_pool_size(pools[2])));
                const void *W = bf ? (const void *)wh : (const void *)w;
                const kiln_type wt = bf ? KILN_TYPE_BF16 : KILN_TYPE_F32;
                memset(out[l], 0, (ny + nx + nw) * sizeof(float));
                kiln_cpu_ops.dense_forward(&ctx, out[l], x, W, wt, N, I, O);
                kiln_cpu_ops.dense_backward(&ctx, out[l] + ny, out[l] + ny + nx, dy, x, W, wt, N, I, O);
                free(ctx.scratch);
            }
            kiln_cpu_ops_force_level(KILN_SIMD_COUNT);
            CHECK(memcmp(out[0], out[1], (ny + nx + nw) * sizeof(float)) == 0, "%s %lldx%lldx%lld: avx2 and avx512 differ",
                  bf ? "bf16" : "f32", (long long)N, (long long)I, (long long)O);
        }
        free(x), free(dy), free(w), free(wh), free(out[0]), free(out[1]);
    }
}

/* ---------------------------------------------------------------- timing (informative) */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* GFLOP/s (2 N I O a product) of forward, dx alone and dW alone at N = 4096 with F32 weights, on all cores: the
 * best of 10 calls, since other processes on a shared machine only ever slow a call down. */
static void time_dense(void) {
    kiln_pool *pool;
    if (kiln_pool_create(0, &pool) != KILN_OK) return;
    kiln_cpu_ops_force_level(KILN_SIMD_COUNT);
    static const shape ts[] = {{4096, 384, 384}, {4096, 384, 1024}};
    unsigned long long rng = 22;
    for (int si = 0; si < COUNT(ts); si++) {
        const int64_t N = ts[si].N, I = ts[si].I, O = ts[si].O;
        float *x = malloc((size_t)(N * I) * sizeof *x), *dx = calloc((size_t)(N * I), sizeof *dx);
        float *y = malloc((size_t)(N * O) * sizeof *y), *w = malloc((size_t)(O * I) * sizeof *w);
        float *dw = calloc((size_t)(O * I), sizeof *dw);
        fill(x, N * I, &rng), fill(y, N * O, &rng), fill(w, O * I, &rng);
        kiln_ops_ctx ctx = make_ctx(pool, kiln_cpu_dense_scratch_size(N, I, O, kiln_pool_size(pool)));
        double gf[3] = {0, 0, 0};
        for (int k = 0; k < 3; k++)
            for (int trial = 0; trial < 11; trial++) { /* the first warms the caches and the pool */
                const double t0 = now_s();
                if (k == 0) kiln_cpu_ops.dense_forward(&ctx, y, x, w, KILN_TYPE_F32, N, I, O);
                if (k == 1) kiln_cpu_ops.dense_backward(&ctx, dx, NULL, y, x, w, KILN_TYPE_F32, N, I, O);
                if (k == 2) kiln_cpu_ops.dense_backward(&ctx, NULL, dw, y, x, w, KILN_TYPE_F32, N, I, O);
                const double g = 2.0 * (double)N * I * O / (now_s() - t0) * 1e-9;
                if (trial && g > gf[k]) gf[k] = g;
            }
        printf("# dense %s N=%lld I=%lld O=%lld (%d threads): forward %.1f, dx %.1f, dW %.1f GFLOP/s\n",
               kiln_simd_name(kiln_cpu_ops_level()), (long long)N, (long long)I, (long long)O, kiln_pool_size(pool),
               gf[0], gf[1], gf[2]);
        free(ctx.scratch), free(x), free(dx), free(y), free(w), free(dw);
    }
    kiln_pool_free(pool);
}

int main(void) {
    for (int i = 0; i < COUNT(pools); i++)
        if (kiln_pool_create(i + 1, &pools[i]) != KILN_OK) return 1;
    RUN(test_scratch_size);
    RUN(test_dense_scalar);
    RUN(test_dense_avx2);
    RUN(test_dense_avx512);
    RUN(test_dense_levels_agree);
    time_dense();
    for (int i = 0; i < COUNT(pools); i++) kiln_pool_free(pools[i]);
    TEST_EXIT();
}
