/* test_grad.c: the training ops of the CPU table (the "training (#5)" part of kiln_ops, src/cpu/ops*.c) except the
 * dense matmul (tests/test_dense.c). Each backward is checked against central finite differences (step FD_H, in
 * double) of a double-precision forward written here, of the objective J = sum(out * R) for a fixed random R
 * (which is then the dout given to the backward); on small odd shapes, where every element of every input is
 * perturbed (on the one bigger attention shape, 60 sampled elements per tensor). Each check states its bound next
 * to the error measured when it was set (bounds are 2-7x the measured worst case). Errors are max |float backward -
 * numeric| / max |numeric| over a tensor: the numeric gradients are good to ~1e-9 (h^2 truncation and 1e-16 / h
 * rounding of J), so what is measured is the float op. Ops with an AVX-512 kernel run at both levels. Also:
 * forwards that exist for inference agree with their training forms, the backwards accumulate (+=) into what the
 * gradients held, and pools of 1, 2 and 3 threads give the same bits on shapes big enough to thread. A '# ' line at
 * the end times attention and the loss (informative only). */
#include "test.h"

#include "cpu/ops_internal.h"

#include <stdint.h>
#include <time.h>

#define COUNT(a) (int)(sizeof a / sizeof a[0])
#define FD_H 1e-5

static kiln_pool *pools[3]; /* 1, 2 and 3 threads (3 does not divide the work evenly) */

/* A context with the training scratch for B sequences of T tokens; free scratch with free(). */
static kiln_ops_ctx make_ctx(kiln_pool *pool, int64_t B, int64_t T, int64_t max_width, int64_t NH, int64_t V) {
    size_t bytes = kiln_cpu_ops.train_scratch_size(B, T, max_width, NH, V, kiln_pool_size(pool));
    return (kiln_ops_ctx){.pool = pool, .scratch = malloc(bytes), .scratch_bytes = bytes};
}

static float *new_normal(int64_t n, float scale, unsigned long long *rng) {
    float *x = malloc((size_t)n * sizeof *x);
    for (int64_t i = 0; i < n; i++) x[i] = scale * test_rng_normal(rng);
    return x;
}

static float *new_zero(int64_t n) { return calloc((size_t)n, sizeof(float)); }

static float *new_copy(const float *x, int64_t n) {
    float *y = malloc((size_t)n * sizeof *y);
    memcpy(y, x, (size_t)n * sizeof *y);
    return y;
}

static double *new_double(const float *x, int64_t n) {
    double *y = malloc((size_t)n * sizeof *y);
    for (int64_t i = 0; i < n; i++) y[i] = x[i];
    return y;
}

/* ---------------------------------------------------------------- finite differences */

typedef double (*objective_fn)(const void *arg);

/* grad[i] = dJ/dp[i] by central differences, p perturbed in place and restored. */
static void numeric_grad(double *grad, double *p, int64_t n, objective_fn J, const void *arg) {
    for (int64_t i = 0; i < n; i++) {
        const double save = p[i];
        p[i] = save + FD_H;
        const double jp = J(arg);
        p[i] = save - FD_H;
        const double jm = J(arg);
        p[i] = save;
        grad[i] = (jp - jm) / (2 * FD_H);
    }
}

/* max |got - ref| / max |ref|. */
static double grad_err(const float *got, const double *ref, int64_t n) {
    double e = 0, m = 0;
    for (int64_t i = 0; i < n; i++) {
        e = fmax(e, fabs(got[i] - ref[i]));
        m = fmax(m, fabs(ref[i]));
    }
    return m > 0 ? e / m : e;
}

/* The backwards accumulate: run into zeroed g0 and into prefilled g1 (a copy of pre); g1 must be pre + g0
 * (within the one rounding of the final add, and the few of a sum that started from pre instead of 0). */
static double accumulate_err(const float *g1, const float *pre, const float *g0, int64_t n) {
    double e = 0;
    for (int64_t i = 0; i < n; i++) {
        const double want = (double)pre[i] + g0[i];
        e = fmax(e, fabs(g1[i] - want) / (fabs(pre[i]) + fabs(g0[i]) + 1e-30));
    }
    return e;
}

/* ---------------------------------------------------------------- embedding */

typedef struct {
    double *table;      /* (V, C) */
    const double *R;    /* (N, C) */
    const int32_t *ids; /* (N) */
    int64_t N, C;
} embed_ref;

static double embed_objective(const void *arg) {
    const embed_ref *r = arg;
    double J = 0;
    for (int64_t t = 0; t < r->N; t++)
        for (int64_t i = 0; i < r->C; i++) J += r->table[r->ids[t] * r->C + i] * r->R[t * r->C + i];
    return J;
}

static void test_embed_backward(void) {
    unsigned long long rng = 101;
    enum { V = 9, C = 13, N = 7 };
    const int32_t ids[N] = {3, 0, 8, 3, 5, 3, 0}; /* repeats: rows summed over tokens */
    float *table = new_normal(V * C, 1, &rng), *R = new_normal(N * C, 1, &rng);
    float *dtable = new_zero(V * C);
    kiln_ops_ctx ctx = make_ctx(pools[0], 1, N, C, 1, V);
    CHECK(kiln_cpu_ops.embed_backward(&ctx, dtable, R, ids, N, C) == 0);
    double *tab_d = new_double(table, V * C), *R_d = new_double(R, N * C), *num = malloc(V * C * sizeof *num);
    embed_ref ref = {tab_d, R_d, ids, N, C};
    numeric_grad(num, tab_d, V * C, embed_objective, &ref);
    const double err = grad_err(dtable, num, V * C);
    printf("# embed_backward: dtable error %.2e (bound 1e-7)\n", err);
    /* Bound 1e-7 (measured 2.6e-8: up to three float adds to a row). */
    CHECK(err <= 1e-7, "dtable error %.3g", err);

    /* A row with a NaN and a row with an inf are skipped whole and counted; the rest is the plain float scatter. */
    R[2 * C + 5] = NAN, R[4 * C + 0] = INFINITY;
    float *want = new_normal(V * C, 1, &rng), *got = new_copy(want, V * C);
    for (int64_t t = 0; t < N; t++)
        if (t != 2 && t != 4)
            for (int64_t i = 0; i < C; i++) want[ids[t] * C + i] += R[t * C + i];
    CHECK(kiln_cpu_ops.embed_backward(&ctx, got, R, ids, N, C) == 2, "two non-finite rows");
    CHECK(memcmp(got, want, V * C * sizeof *got) == 0, "skipping the non-finite rows changed the others");
    free(ctx.scratch), free(table), free(R), free(dtable), free(tab_d), free(R_d), free(num), free(want), free(got);
}

static void test_embed_backward_threads(void) {
    unsigned long long rng = 102;
    enum { V = 50, C = 520, N = 300 }; /* N * C past the threading threshold; C not a multiple of 16 * 3 */
    int32_t ids[N];
    for (int t = 0; t < N; t++) ids[t] = (int32_t)(test_rng_next(&rng) % V);
    float *dout = new_normal(N * C, 1, &rng), *pre = new_normal(V * C, 1, &rng), *first = NULL;
    dout[17 * C + 519] = NAN; /* in the last thread's columns: every thread must still skip the whole row */
    for (int p = 0; p < COUNT(pools); p++) {
        kiln_ops_ctx ctx = make_ctx(pools[p], 1, N, C, 1, V);
        float *g = new_copy(pre, V * C);
        CHECK(kiln_cpu_ops.embed_backward(&ctx, g, dout, ids, N, C) == 1, "%d threads: one skipped row", p + 1);
        free(ctx.scratch);
        if (!first) first = g;
        else {
            CHECK(memcmp(first, g, V * C * sizeof *g) == 0, "%d threads differ from 1", p + 1);
            free(g);
        }
    }
    for (int64_t i = 0; i < C; i++) { /* row 17's id got nothing from it */
        float want = pre[ids[17] * C + i];
        for (int t = 0; t < N; t++)
            if (t != 17 && ids[t] == ids[17]) want += dout[t * C + i];
        CHECK(first[ids[17] * C + i] == want, "column %lld of the skipped row's id", (long long)i);
    }
    free(dout), free(pre), free(first);
}

/* ---------------------------------------------------------------- rmsnorm */

typedef struct {
    double *x, *w;   /* (N, C), (C) */
    const double *R; /* (N, C) */
    int64_t N, C;
    double eps;
} rmsnorm_ref;

static double rmsnorm_objective(const void *arg) {
    const rmsnorm_ref *r = arg;
    double J = 0;
    for (int64_t t = 0; t < r->N; t++) {
        const double *x = r->x + t * r->C;
        double ss = 0;
        for (int64_t i = 0; i < r->C; i++) ss += x[i] * x[i];
        const double rs = 1 / sqrt(ss / (double)r->C + r->eps);
        for (int64_t i = 0; i < r->C; i++) J += x[i] * rs * r->w[i] * r->R[t * r->C + i];
    }
    return J;
}

static void test_rmsnorm_grad(void) {
    unsigned long long rng = 103;
    enum { N = 7, C = 13 };
    const float eps = 1e-5f;
    float *x = new_normal(N * C, 1, &rng), *w = new_normal(C, 0.5f, &rng), *R = new_normal(N * C, 1, &rng);
    for (int i = 0; i < C; i++) w[i] += 1.0f;
    for (int i = 0; i < C; i++) x[3 * C + i] *= 0.01f; /* a small row: eps matters */
    float *out = new_zero(N * C), *out_inf = new_zero(N * C), *rstd = new_zero(N);
    kiln_ops_ctx ctx = make_ctx(pools[0], 1, N, C, 1, 1);
    kiln_cpu_ops.rmsnorm_forward_train(&ctx, out, rstd, x, w, N, C, eps);
    kiln_cpu_ops.rmsnorm_forward(&ctx, out_inf, x, w, N, C, eps);
    CHECK(memcmp(out, out_inf, N * C * sizeof *out) == 0, "forward_train differs from forward");
    for (int64_t t = 0; t < N; t++) {
        double ss = 0;
        for (int64_t i = 0; i < C; i++) ss += (double)x[t * C + i] * x[t * C + i];
        const double want = 1 / sqrt(ss / C + eps);
        /* Bound: relative 3e-7 (the float mean and sqrt, as the inference forward) */
        CHECK(fabs(rstd[t] - want) <= 3e-7 * want, "rstd[%lld] %g vs %g", (long long)t, rstd[t], want);
    }

    float *dx = new_zero(N * C), *dw = new_zero(C);
    kiln_cpu_ops.rmsnorm_backward(&ctx, dx, dw, R, x, w, rstd, N, C);
    double *x_d = new_double(x, N * C), *w_d = new_double(w, C), *R_d = new_double(R, N * C);
    double *nx = malloc(N * C * sizeof *nx), *nw = malloc(C * sizeof *nw);
    rmsnorm_ref ref = {x_d, w_d, R_d, N, C, eps};
    numeric_grad(nx, x_d, N * C, rmsnorm_objective, &ref);
    numeric_grad(nw, w_d, C, rmsnorm_objective, &ref);
    const double ex = grad_err(dx, nx, N * C), ew = grad_err(dw, nw, C);
    printf("# rmsnorm_backward: dx error %.2e, dw error %.2e (bound 3e-7)\n", ex, ew);
    /* Bound 3e-7 (measured dx 4.5e-8, dw 3.2e-8: float products and the float rstd cubed) */
    CHECK(ex <= 3e-7, "dx error %.3g", ex);
    CHECK(ew <= 3e-7, "dw error %.3g", ew);

    float *pre_x = new_normal(N * C, 1, &rng), *pre_w = new_normal(C, 1, &rng);
    float *dx1 = new_copy(pre_x, N * C), *dw1 = new_copy(pre_w, C);
    kiln_cpu_ops.rmsnorm_backward(&ctx, dx1, dw1, R, x, w, rstd, N, C);
    const double ea = fmax(accumulate_err(dx1, pre_x, dx, N * C), accumulate_err(dw1, pre_w, dw, C));
    CHECK(ea <= 1.2e-7, "accumulation error %.3g", ea); /* one float rounding of the add: 6e-8 */
    free(ctx.scratch), free(x), free(w), free(R), free(out), free(out_inf), free(rstd), free(dx), free(dw);
    free(x_d), free(w_d), free(R_d), free(nx), free(nw), free(pre_x), free(pre_w), free(dx1), free(dw1);
}

static void test_rmsnorm_threads(void) {
    unsigned long long rng = 104;
    enum { N = 67, C = 2000 }; /* past the threading threshold; C / 16 not a multiple of 3 */
    float *x = new_normal(N * C, 1, &rng), *w = new_normal(C, 1, &rng), *R = new_normal(N * C, 1, &rng);
    float *out = new_zero(N * C), *rstd = new_zero(N), *dx = new_zero(N * C), *dw = new_zero(C);
    float *out1 = new_zero(N * C), *rstd1 = new_zero(N), *dx1 = new_zero(N * C), *dw1 = new_zero(C);
    for (int p = 0; p < COUNT(pools); p++) {
        kiln_ops_ctx ctx = make_ctx(pools[p], 1, N, C, 1, 1);
        memset(dx, 0, N * C * sizeof *dx), memset(dw, 0, C * sizeof *dw);
        kiln_cpu_ops.rmsnorm_forward_train(&ctx, out, rstd, x, w, N, C, 1e-6f);
        kiln_cpu_ops.rmsnorm_backward(&ctx, dx, dw, R, x, w, rstd, N, C);
        free(ctx.scratch);
        if (p == 0) {
            memcpy(out1, out, N * C * sizeof *out), memcpy(rstd1, rstd, N * sizeof *rstd);
            memcpy(dx1, dx, N * C * sizeof *dx), memcpy(dw1, dw, C * sizeof *dw);
        }
        CHECK(memcmp(out, out1, N * C * sizeof *out) == 0 && memcmp(rstd, rstd1, N * sizeof *rstd) == 0,
              "%d threads: forward differs from 1", p + 1);
        CHECK(memcmp(dx, dx1, N * C * sizeof *dx) == 0, "%d threads: dx differs from 1", p + 1);
        CHECK(memcmp(dw, dw1, C * sizeof *dw) == 0, "%d threads: dw differs from 1", p + 1);
    }
    free(x), free(w), free(R), free(out), free(rstd), free(dx), free(dw), free(out1), free(rstd1), free(dx1), free(dw1);
}

/* ---------------------------------------------------------------- rope */

typedef struct {
    double *x;          /* (T, NH * HS) */
    const double *R;    /* (T, NH * HS) */
    const int32_t *pos; /* (T) */
    int64_t T, NH, HS, rope_dim;
    float base;
    bool neox;
} rope_ref;

/* The forward in double, on the op's own angles: the float recurrence theta_{i+1} = theta_i * theta_scale (the
 * op's documented angle, ops_rope.c), with cos and sin in double. */
static void rope_ref_forward(double *y, const rope_ref *r) {
    const int64_t W = r->NH * r->HS, half = r->rope_dim / 2;
    const float theta_scale = powf(r->base, -2.0f / (float)r->rope_dim);
    memcpy(y, r->x, (size_t)(r->T * W) * sizeof *y);
    for (int64_t t = 0; t < r->T; t++) {
        float theta = (float)r->pos[t];
        for (int64_t i = 0; i < half; i++, theta *= theta_scale) {
            const double c = cos((double)theta), s = sin((double)theta);
            for (int64_t h = 0; h < r->NH; h++) {
                const int64_t a = t * W + h * r->HS + (r->neox ? i : 2 * i), b = a + (r->neox ? half : 1);
                y[a] = r->x[a] * c - r->x[b] * s;
                y[b] = r->x[a] * s + r->x[b] * c;
            }
        }
    }
}

static double rope_objective(const void *arg) {
    const rope_ref *r = arg;
    const int64_t n = r->T * r->NH * r->HS;
    double *y = malloc((size_t)n * sizeof *y), J = 0;
    rope_ref_forward(y, r);
    for (int64_t i = 0; i < n; i++) J += y[i] * r->R[i];
    free(y);
    return J;
}

static void test_rope_grad(void) {
    unsigned long long rng = 105;
    enum { T = 5, NH = 3, HS = 10, ROPE_DIM = 6, W = NH * HS };
    const int32_t pos[T] = {37, 38, 39, 12, 4000}; /* an offset, a second sequence, a far position */
    for (int neox = 0; neox < 2; neox++) {
        float *x = new_normal(T * W, 1, &rng), *R = new_normal(T * W, 1, &rng), *dx = new_copy(R, T * W);
        kiln_ops_ctx ctx = {.pool = pools[0]};
        kiln_cpu_ops.rope_backward(&ctx, dx, pos, T, NH, HS, ROPE_DIM, 10000.0f, NULL, 1.0f, neox);
        double *x_d = new_double(x, T * W), *R_d = new_double(R, T * W), *num = malloc(T * W * sizeof *num);
        rope_ref ref = {x_d, R_d, pos, T, NH, HS, ROPE_DIM, 10000.0f, neox};
        numeric_grad(num, x_d, T * W, rope_objective, &ref);
        const double err = grad_err(dx, num, T * W);
        printf("# rope_backward %s: dx error %.2e (bound 4e-7)\n", neox ? "neox" : "interleaved", err);
        /* Bound 4e-7 (measured 7.0e-8 interleaved, 1.1e-7 neox: cosf, sinf and a float rotation) */
        CHECK(err <= 4e-7, "%s: dx error %.3g", neox ? "neox" : "interleaved", err);
        for (int64_t t = 0; t < T; t++) /* dims past rope_dim pass through */
            for (int64_t h = 0; h < NH; h++)
                CHECK(memcmp(dx + t * W + h * HS + ROPE_DIM, R + t * W + h * HS + ROPE_DIM, (HS - ROPE_DIM) * sizeof *dx) == 0,
                      "tail changed");
        /* backward undoes forward: the same angles, rotated back */
        float *y = new_copy(x, T * W);
        kiln_cpu_ops.rope_forward(&ctx, y, pos, T, NH, HS, ROPE_DIM, 10000.0f, NULL, 1.0f, neox);
        kiln_cpu_ops.rope_backward(&ctx, y, pos, T, NH, HS, ROPE_DIM, 10000.0f, NULL, 1.0f, neox);
        double e = 0;
        for (int64_t i = 0; i < T * W; i++) e = fmax(e, fabs(y[i] - x[i]));
        CHECK(e <= 1e-6, "backward(forward(x)) differs from x by %.3g", e); /* two float rotations: ~2e-7 */
        free(x), free(R), free(dx), free(x_d), free(R_d), free(num), free(y);
    }
}

static void test_rope_threads(void) {
    unsigned long long rng = 106;
    enum { T = 200, NH = 8, HS = 64, ROPE_DIM = 32, W = NH * HS }; /* past the threading threshold */
    int32_t pos[T];
    for (int t = 0; t < T; t++) pos[t] = t % 150; /* two sequences */
    float *dx0 = new_normal(T * W, 1, &rng);
    for (int neox = 0; neox < 2; neox++) {
        float *first = NULL;
        for (int p = 0; p < COUNT(pools); p++) {
            kiln_ops_ctx ctx = {.pool = pools[p]};
            float *dx = new_copy(dx0, T * W);
            kiln_cpu_ops.rope_backward(&ctx, dx, pos, T, NH, HS, ROPE_DIM, 500000.0f, NULL, 1.0f, neox);
            if (!first) first = dx;
            else {
                CHECK(memcmp(first, dx, T * W * sizeof *dx) == 0, "%d threads differ from 1", p + 1);
                free(dx);
            }
        }
        free(first);
    }
    free(dx0);
}

/* ---------------------------------------------------------------- swiglu */

typedef struct {
    double *gate, *up; /* (n) */
    const double *R;   /* (n) */
    int64_t n;
} swiglu_ref;

static double swiglu_objective(const void *arg) {
    const swiglu_ref *r = arg;
    double J = 0;
    for (int64_t i = 0; i < r->n; i++) J += r->gate[i] / (1 + exp(-r->gate[i])) * r->up[i] * r->R[i];
    return J;
}

static void check_swiglu_grad(void) {
    unsigned long long rng = 107;
    enum { N = 37 };
    float *g = new_normal(N, 3, &rng), *u = new_normal(N, 1, &rng), *R = new_normal(N, 1, &rng);
    g[0] = 20.0f, g[1] = -20.0f, g[2] = 0.0f; /* saturated both ways, and the middle */
    float *dg = new_zero(N), *du = new_zero(N);
    kiln_ops_ctx ctx = {.pool = pools[0]};
    kiln_cpu_ops.swiglu_backward(&ctx, dg, du, R, g, u, N);
    double *g_d = new_double(g, N), *u_d = new_double(u, N), *R_d = new_double(R, N);
    double *ng = malloc(N * sizeof *ng), *nu = malloc(N * sizeof *nu);
    swiglu_ref ref = {g_d, u_d, R_d, N};
    numeric_grad(ng, g_d, N, swiglu_objective, &ref);
    numeric_grad(nu, u_d, N, swiglu_objective, &ref);
    const double eg = grad_err(dg, ng, N), eu = grad_err(du, nu, N);
    printf("# swiglu_backward %s: dgate error %.2e, dup error %.2e (bound 5e-7)\n", kiln_simd_name(kiln_cpu_ops_level()),
           eg, eu);
    /* Bound 5e-7 (measured dgate 1.6e-7 scalar, 9.2e-8 AVX-512; dup 8.8e-8: an exp, a division and a few products) */
    CHECK(eg <= 5e-7, "dgate error %.3g", eg);
    CHECK(eu <= 5e-7, "dup error %.3g", eu);
    float *pre_g = new_normal(N, 1, &rng), *pre_u = new_normal(N, 1, &rng);
    float *dg1 = new_copy(pre_g, N), *du1 = new_copy(pre_u, N);
    kiln_cpu_ops.swiglu_backward(&ctx, dg1, du1, R, g, u, N);
    const double ea = fmax(accumulate_err(dg1, pre_g, dg, N), accumulate_err(du1, pre_u, du, N));
    CHECK(ea <= 1.2e-7, "accumulation error %.3g", ea);
    free(g), free(u), free(R), free(dg), free(du), free(g_d), free(u_d), free(R_d), free(ng), free(nu);
    free(pre_g), free(pre_u), free(dg1), free(du1);
}

static void check_swiglu_threads(void) {
    unsigned long long rng = 108;
    enum { N = 20000 }; /* past the threading threshold; not a multiple of 16 * 3 */
    float *g = new_normal(N, 4, &rng), *u = new_normal(N, 1, &rng), *R = new_normal(N, 1, &rng);
    float *dg = new_zero(N), *du = new_zero(N), *dg1 = new_zero(N), *du1 = new_zero(N);
    for (int p = 0; p < COUNT(pools); p++) {
        kiln_ops_ctx ctx = {.pool = pools[p]};
        memset(dg, 0, N * sizeof *dg), memset(du, 0, N * sizeof *du);
        kiln_cpu_ops.swiglu_backward(&ctx, dg, du, R, g, u, N);
        if (p == 0) memcpy(dg1, dg, N * sizeof *dg), memcpy(du1, du, N * sizeof *du);
        CHECK(memcmp(dg, dg1, N * sizeof *dg) == 0 && memcmp(du, du1, N * sizeof *du) == 0, "%d threads differ from 1",
              p + 1);
    }
    free(g), free(u), free(R), free(dg), free(du), free(dg1), free(du1);
}

/* ---------------------------------------------------------------- attention */

typedef struct {
    int64_t B, T, NH, NKV, HS;
} attn_shape;

typedef struct {
    double *q, *k, *v; /* (B*T, NH*HS), (B*T, NKV*HS) x 2 */
    const double *R;   /* (B*T, NH*HS) */
    attn_shape s;
} attn_ref;

/* The forward in double: out (B*T, NH*HS) and lse (B, NH, T); either may be NULL. Returns sum(out * R) when R is set. */
static double attn_ref_forward(const attn_ref *r, double *out, double *lse) {
    const attn_shape s = r->s;
    const int64_t qw = s.NH * s.HS, kw = s.NKV * s.HS, G = s.NH / s.NKV;
    double *p = malloc((size_t)s.T * sizeof *p), J = 0;
    for (int64_t b = 0; b < s.B; b++)
        for (int64_t h = 0; h < s.NH; h++)
            for (int64_t t = 0; t < s.T; t++) {
                const double *q = r->q + (b * s.T + t) * qw + h * s.HS;
                double max = -INFINITY, sum = 0;
                for (int64_t j = 0; j <= t; j++) {
                    const double *k = r->k + (b * s.T + j) * kw + (h / G) * s.HS;
                    double d = 0;
                    for (int64_t i = 0; i < s.HS; i++) d += q[i] * k[i];
                    p[j] = d / sqrt((double)s.HS);
                    max = fmax(max, p[j]);
                }
                for (int64_t j = 0; j <= t; j++) sum += (p[j] = exp(p[j] - max));
                if (lse) lse[(b * s.NH + h) * s.T + t] = max + log(sum);
                for (int64_t i = 0; i < s.HS; i++) {
                    double o = 0;
                    for (int64_t j = 0; j <= t; j++) o += p[j] / sum * r->v[(b * s.T + j) * kw + (h / G) * s.HS + i];
                    if (out) out[(b * s.T + t) * qw + h * s.HS + i] = o;
                    if (r->R) J += o * r->R[(b * s.T + t) * qw + h * s.HS + i];
                }
            }
    free(p);
    return J;
}

static double attn_objective(const void *arg) { return attn_ref_forward(arg, NULL, NULL); }

static const attn_shape attn_shapes[] = {
    {2, 5, 4, 2, 6},  /* GQA, HS and T not multiples of 16 */
    {1, 7, 3, 3, 5},  /* no grouping */
    {2, 70, 4, 1, 8}, /* all heads on one KV head; past one 64-key chunk; big enough to thread */
    {1, 4, 2, 1, 128}, /* the widest head the AVX-512 rows take: 8 vectors */
};

/* Numeric gradients of every element on the small shapes; on the big one a sample of 60 per tensor. */
static double attn_check_grad(const float *got, double *p, int64_t n, const attn_ref *ref, unsigned long long *rng) {
    const bool all = n <= 1000;
    double e = 0, m = 0;
    for (int64_t c = 0; c < (all ? n : 60); c++) {
        const int64_t i = all ? c : (int64_t)(test_rng_next(rng) % (unsigned long long)n);
        double g;
        numeric_grad(&g, p + i, 1, attn_objective, ref);
        e = fmax(e, fabs(got[i] - g));
        m = fmax(m, fabs(g));
    }
    return e / m;
}

static void check_attention_grad(void) {
    unsigned long long rng = 109;
    double worst_out = 0, worst_lse = 0, worst[3] = {0};
    for (int c = 0; c < COUNT(attn_shapes); c++) {
        const attn_shape s = attn_shapes[c];
        const int64_t N = s.B * s.T, nq = N * s.NH * s.HS, nk = N * s.NKV * s.HS, nl = s.B * s.NH * s.T;
        float *q = new_normal(nq, 1, &rng), *k = new_normal(nk, 1, &rng), *v = new_normal(nk, 1, &rng);
        float *R = new_normal(nq, 1, &rng), *out = new_zero(nq), *lse = new_zero(nl);
        kiln_ops_ctx ctx = make_ctx(pools[0], s.B, s.T, s.NH * s.HS, s.NH, 1);
        kiln_cpu_ops.attention_forward_train(&ctx, out, lse, q, k, v, s.B, s.T, s.NH, s.NKV, s.HS);
        double *q_d = new_double(q, nq), *k_d = new_double(k, nk), *v_d = new_double(v, nk), *R_d = new_double(R, nq);
        double *out_d = malloc((size_t)nq * sizeof *out_d), *lse_d = malloc((size_t)nl * sizeof *lse_d);
        attn_ref ref = {q_d, k_d, v_d, NULL, s};
        attn_ref_forward(&ref, out_d, lse_d);
        worst_out = fmax(worst_out, grad_err(out, out_d, nq));
        for (int64_t i = 0; i < nl; i++) worst_lse = fmax(worst_lse, fabs(lse[i] - lse_d[i]));

        float *dq = new_zero(nq), *dk = new_zero(nk), *dv = new_zero(nk);
        kiln_cpu_ops.attention_backward(&ctx, dq, dk, dv, R, q, k, v, out, lse, s.B, s.T, s.NH, s.NKV, s.HS);
        ref.R = R_d;
        const double e[3] = {attn_check_grad(dq, q_d, nq, &ref, &rng), attn_check_grad(dk, k_d, nk, &ref, &rng),
                             attn_check_grad(dv, v_d, nk, &ref, &rng)};
        for (int i = 0; i < 3; i++) worst[i] = fmax(worst[i], e[i]);

        float *pre = new_normal(nq + 2 * nk, 1, &rng), *g1 = new_copy(pre, nq + 2 * nk);
        kiln_cpu_ops.attention_backward(&ctx, g1, g1 + nq, g1 + nq + nk, R, q, k, v, out, lse, s.B, s.T, s.NH, s.NKV, s.HS);
        const double ea = fmax(accumulate_err(g1, pre, dq, nq), fmax(accumulate_err(g1 + nq, pre + nq, dk, nk),
                                                                    accumulate_err(g1 + nq + nk, pre + nq + nk, dv, nk)));
        CHECK(ea <= 1.2e-7, "shape %d: accumulation error %.3g", c, ea);
        free(ctx.scratch), free(q), free(k), free(v), free(R), free(out), free(lse), free(q_d), free(k_d), free(v_d);
        free(R_d), free(out_d), free(lse_d), free(dq), free(dk), free(dv), free(pre), free(g1);
    }
    const char *level = kiln_simd_name(kiln_cpu_ops_level());
    printf("# attention_forward_train %s: out error %.2e of max|out| (bound 1e-6), lse error %.2e (bound 1.5e-6)\n",
           level, worst_out, worst_lse);
    printf("# attention_backward %s: dq %.2e, dk %.2e, dv %.2e (bound 2e-6)\n", level, worst[0], worst[1], worst[2]);
    /* Bounds: out 1e-6 of max|out| (measured 2.7e-7 scalar, 1.8e-7 AVX-512), lse 1.5e-6 absolute (measured 5.3e-7
     * and 4.2e-7: an ulp of lse ~ 4 is 4.8e-7): float scores, exps and sums over at most 70 keys. Gradients 2e-6
     * (measured scalar and AVX-512: dq 5.6e-7 and 7.6e-7, dk 5.4e-7 and 7.0e-7, dv 4.9e-7 and 4.7e-7): the same, plus
     * p (dp - D), a difference of similar numbers. */
    CHECK(worst_out <= 1e-6 && worst_lse <= 1.5e-6, "forward: out %.3g, lse %.3g", worst_out, worst_lse);
    CHECK(worst[0] <= 2e-6 && worst[1] <= 2e-6 && worst[2] <= 2e-6, "dq %.3g dk %.3g dv %.3g", worst[0], worst[1], worst[2]);
}

/* forward_train against the inference forward over an f16 cache holding the same keys and values, one sequence
 * at a time. With k and v rounded to f16 first, both compute the same function: only float rounding differs. With
 * the unrounded k, v the f16 rounding (relative 2^-11) enters the inference side. */
static void check_attention_vs_inference(void) {
    unsigned long long rng = 110;
    const attn_shape s = {2, 37, 4, 2, 16};
    const int64_t N = s.B * s.T, qw = s.NH * s.HS, kw = s.NKV * s.HS, nq = N * qw, nk = N * kw;
    float *q = new_normal(nq, 1, &rng), *k = new_normal(nk, 1, &rng), *v = new_normal(nk, 1, &rng);
    float *k16 = malloc((size_t)nk * sizeof *k16), *v16 = malloc((size_t)nk * sizeof *v16);
    uint16_t *kc = malloc((size_t)nk * 2), *vc = malloc((size_t)nk * 2);
    for (int64_t i = 0; i < nk; i++) {
        kc[i] = kiln_f32_to_fp16(k[i]), vc[i] = kiln_f32_to_fp16(v[i]);
        k16[i] = kiln_fp16_to_f32(kc[i]), v16[i] = kiln_fp16_to_f32(vc[i]);
    }
    float *out = new_zero(nq), *out16 = new_zero(nq), *inf = new_zero(nq), *lse = new_zero(s.B * s.NH * s.T);
    kiln_ops_ctx tctx = make_ctx(pools[1], s.B, s.T, qw, s.NH, 1);
    kiln_cpu_ops.attention_forward_train(&tctx, out, lse, q, k, v, s.B, s.T, s.NH, s.NKV, s.HS);
    kiln_cpu_ops.attention_forward_train(&tctx, out16, lse, q, k16, v16, s.B, s.T, s.NH, s.NKV, s.HS);
    size_t bytes = kiln_cpu_ops.scratch_size(s.T, qw, s.NH, s.T, kiln_pool_size(pools[1]));
    kiln_ops_ctx ictx = {.pool = pools[1], .scratch = malloc(bytes), .scratch_bytes = bytes};
    for (int64_t b = 0; b < s.B; b++)
        kiln_cpu_ops.attention_forward(&ictx, inf + b * s.T * qw, q + b * s.T * qw, kc + b * s.T * kw, vc + b * s.T * kw,
                                       0, s.T, s.NH, s.NKV, s.HS);
    double e16 = 0, e = 0;
    for (int64_t i = 0; i < nq; i++) {
        e16 = fmax(e16, fabs(out16[i] - inf[i]));
        e = fmax(e, fabs(out[i] - inf[i]));
    }
    printf("# attention_forward_train vs attention_forward %s: %.2e on f16-rounded k, v (bound 1.2e-6), %.2e on float "
           "k, v (bound 2e-3)\n", kiln_simd_name(kiln_cpu_ops_level()), e16, e);
    /* Bounds (|v| ~ N(0, 1)): 1.2e-6 (measured 0 scalar: the same sums in the same order; 3.6e-7 AVX-512: other
     * orders and FMA); 2e-3 (measured 6.6e-4: f16 rounding of k moves scores by ~|q| |k| 2^-11 and of v moves out
     * by ~2^-11 |v|) */
    CHECK(e16 <= 1.2e-6, "f16-rounded inputs: %.3g", e16);
    CHECK(e <= 2e-3, "float inputs: %.3g", e);
    free(tctx.scratch), free(ictx.scratch), free(q), free(k), free(v), free(k16), free(v16), free(kc), free(vc);
    free(out), free(out16), free(inf), free(lse);
}

static void check_attention_threads(void) {
    unsigned long long rng = 111;
    static const attn_shape shapes[] = {{2, 70, 4, 1, 8}, {3, 40, 4, 2, 16}}; /* past the threading threshold */
    for (int c = 0; c < COUNT(shapes); c++) {
        const attn_shape s = shapes[c];
        const int64_t N = s.B * s.T, nq = N * s.NH * s.HS, nk = N * s.NKV * s.HS, nl = s.B * s.NH * s.T;
        float *q = new_normal(nq, 1, &rng), *k = new_normal(nk, 1, &rng), *v = new_normal(nk, 1, &rng);
        float *R = new_normal(nq, 1, &rng);
        float *first = NULL; /* out, lse, dq, dk, dv of one thread */
        const int64_t n_all = 2 * nq + nl + 2 * nk;
        for (int p = 0; p < COUNT(pools); p++) {
            kiln_ops_ctx ctx = make_ctx(pools[p], s.B, s.T, s.NH * s.HS, s.NH, 1);
            float *all = new_zero(n_all), *out = all, *lse = out + nq, *dq = lse + nl, *dk = dq + nq, *dv = dk + nk;
            kiln_cpu_ops.attention_forward_train(&ctx, out, lse, q, k, v, s.B, s.T, s.NH, s.NKV, s.HS);
            kiln_cpu_ops.attention_backward(&ctx, dq, dk, dv, R, q, k, v, out, lse, s.B, s.T, s.NH, s.NKV, s.HS);
            free(ctx.scratch);
            if (!first) first = all;
            else {
                CHECK(memcmp(first, all, (size_t)n_all * sizeof *all) == 0, "shape %d: %d threads differ from 1", c, p + 1);
                free(all);
            }
        }
        free(q), free(k), free(v), free(R), free(first);
    }
}

/* ---------------------------------------------------------------- cross entropy */

typedef struct {
    double *logits;         /* (N, V) */
    const int32_t *targets; /* (N) */
    int64_t N, V;
    double eps, z_loss, dscale;
    int32_t ignore_index;
} ce_ref;

static double ce_ref_row(const ce_ref *r, int64_t t) {
    const double *x = r->logits + t * r->V;
    double max = -INFINITY, se = 0, sx = 0;
    for (int64_t i = 0; i < r->V; i++) max = fmax(max, x[i]);
    for (int64_t i = 0; i < r->V; i++) se += exp(x[i] - max), sx += x[i];
    const double z = max + log(se);
    return (1 - r->eps) * (z - x[r->targets[t]]) + r->eps * (z - sx / (double)r->V) + r->z_loss * z * z;
}

/* dscale * the sum of the counted rows' losses: its gradient is what the op writes over the logits. */
static double ce_objective(const void *arg) {
    const ce_ref *r = arg;
    double J = 0;
    for (int64_t t = 0; t < r->N; t++)
        if (r->targets[t] != r->ignore_index) J += ce_ref_row(r, t);
    return r->dscale * J;
}

static void check_cross_entropy_grad(void) {
    unsigned long long rng = 112;
    enum { N = 6, V = 11 };
    const int32_t targets[N] = {3, 0, -100, 10, 7, 3};
    typedef struct {
        const char *name;
        float eps, z_loss, dscale;
        int32_t ignore;
    } ce_case;
    static const ce_case cases[] = {{"smoothed", 0.1f, 1e-3f, 0.37f, -100}, {"plain", 0.0f, 0.0f, 1.0f, -1}};
    for (int c = 0; c < COUNT(cases); c++) {
        const ce_case cc = cases[c];
        int32_t tg[N];
        for (int t = 0; t < N; t++) tg[t] = targets[t] == -100 && cc.ignore != -100 ? 1 : targets[t];
        float *x = new_normal(N * V, 3, &rng), *g = new_copy(x, N * V), *losses = new_zero(N), *losses0 = new_zero(N);
        kiln_ops_ctx ctx = make_ctx(pools[0], 1, N, 1, 1, V);
        int64_t counted = -1, counted0 = -1;
        const double sum = kiln_cpu_ops.cross_entropy(&ctx, g, losses, tg, N, V, cc.eps, cc.z_loss, cc.ignore, cc.dscale,
                                                      &counted);
        /* dscale 0: the logits are left alone, the losses are the same bits */
        float *x0 = new_copy(x, N * V);
        const double sum0 = kiln_cpu_ops.cross_entropy(&ctx, x0, losses0, tg, N, V, cc.eps, cc.z_loss, cc.ignore, 0.0f,
                                                       &counted0);
        CHECK(memcmp(x0, x, N * V * sizeof *x) == 0, "%s: dscale 0 changed the logits", cc.name);
        CHECK(sum0 == sum && counted0 == counted && memcmp(losses0, losses, N * sizeof *losses) == 0,
              "%s: dscale 0 changed the losses", cc.name);

        double *x_d = new_double(x, N * V), *num = malloc(N * V * sizeof *num);
        ce_ref ref = {x_d, tg, N, V, cc.eps, cc.z_loss, cc.dscale, cc.ignore};
        double want_sum = 0, worst_loss = 0;
        int64_t want_counted = 0;
        for (int64_t t = 0; t < N; t++) {
            const bool ignored = tg[t] == cc.ignore;
            const double want = ignored ? 0 : ce_ref_row(&ref, t);
            want_sum += want, want_counted += !ignored;
            /* Bound: relative 2e-7 (measured 5.0e-8 at both levels: the loss rounded to float) */
            worst_loss = fmax(worst_loss, fabs(losses[t] - want) / fmax(fabs(want), 1e-30));
            CHECK(fabs(losses[t] - want) <= 2e-7 * fabs(want), "%s: loss[%lld] %g vs %g", cc.name, (long long)t, losses[t],
                  want);
            if (ignored)
                for (int64_t i = 0; i < V; i++) CHECK(g[t * V + i] == 0.0f, "%s: ignored row has a gradient", cc.name);
        }
        CHECK(counted == want_counted, "%s: counted %lld of %lld", cc.name, (long long)counted, (long long)want_counted);
        CHECK(fabs(sum - want_sum) <= 1e-7 * want_sum, "%s: sum %.9g vs %.9g", cc.name, sum, want_sum);
        numeric_grad(num, x_d, N * V, ce_objective, &ref);
        const double err = grad_err(g, num, N * V);
        printf("# cross_entropy %s %s: loss error %.2e (bound 2e-7), dlogits error %.2e (bound 1e-7)\n",
               kiln_simd_name(kiln_cpu_ops_level()), cc.name, worst_loss, err);
        /* Bound 1e-7 (measured 2.9e-8 at both levels: an exp and the float a * e - b) */
        CHECK(err <= 1e-7, "%s: dlogits error %.3g", cc.name, err);
        free(x), free(g), free(losses), free(losses0), free(x0), free(x_d), free(num), free(ctx.scratch);
    }
}

static void check_cross_entropy_threads(void) {
    unsigned long long rng = 113;
    enum { N = 64, V = 1000 }; /* past the threading threshold; 64 rows do not split evenly in 3 */
    int32_t tg[N];
    for (int t = 0; t < N; t++) tg[t] = t % 9 == 4 ? -100 : (int32_t)(test_rng_next(&rng) % V);
    float *x = new_normal(N * V, 4, &rng), *first = NULL, *first_losses = new_zero(N);
    double first_sum = 0;
    for (int p = 0; p < COUNT(pools); p++) {
        kiln_ops_ctx ctx = make_ctx(pools[p], 2, N / 2, 64, 1, V);
        float *g = new_copy(x, N * V), *losses = new_zero(N);
        int64_t counted;
        const double sum = kiln_cpu_ops.cross_entropy(&ctx, g, losses, tg, N, V, 0.1f, 1e-4f, -100, 1.0f / N, &counted);
        free(ctx.scratch);
        if (!first) first = g, first_sum = sum, memcpy(first_losses, losses, N * sizeof *losses);
        else {
            CHECK(memcmp(first, g, N * V * sizeof *g) == 0, "%d threads: gradients differ from 1", p + 1);
            free(g);
        }
        CHECK(sum == first_sum && memcmp(first_losses, losses, N * sizeof *losses) == 0, "%d threads: losses differ", p + 1);
        free(losses);
    }
    free(x), free(first), free(first_losses);
}

/* ---------------------------------------------------------------- scratch */

static void test_train_scratch_size(void) {
    size_t (*size)(int64_t, int64_t, int64_t, int64_t, int64_t, int) = kiln_cpu_ops.train_scratch_size;
    CHECK(size(0, 256, 384, 8, 4096, 2) == 0 && size(8, 256, 384, 8, 4096, 0) == 0, "empty shapes need nothing");
    /* The loss's per-row sums and every thread's attention copies fit, with the alignment slack. */
    const size_t s = size(8, 256, 384, 8, 4096, 2);
    CHECK(s >= kiln_cpu_cross_entropy_scratch_size(8 * 256) + KILN_OPS_ALIGN);
    CHECK(s >= kiln_cpu_attention_train_scratch_size(256, 384, 8, 2) + KILN_OPS_ALIGN);
    CHECK(size(8, 256, 384, 8, 4096, 3) >= s, "more threads need no less");
    CHECK(size(INT64_MAX / 2, 256, 384, 8, 4096, 2) == SIZE_MAX, "overflow reads as SIZE_MAX");
}

/* ---------------------------------------------------------------- levels */

/* Runs the checks with the dispatch forced to level (skipped when the CPU lacks it), then restores the best. The
 * SwiGLU backward, attention and the loss have an AVX-512 kernel; the scalar one is the oracle. */
#define LEVEL_TEST(name, check, level)                                                                         \
    static void name(void) {                                                                                   \
        if (kiln_simd_best() < (level))                                                                        \
            SKIP("this CPU (or KILN_SIMD) lacks %s: best is %s", kiln_simd_name(level), kiln_simd_name(kiln_simd_best())); \
        kiln_cpu_ops_force_level(level);                                                                       \
        check();                                                                                               \
        kiln_cpu_ops_force_level(KILN_SIMD_COUNT);                                                             \
    }
LEVEL_TEST(test_swiglu_grad_scalar, check_swiglu_grad, KILN_SIMD_SCALAR)
LEVEL_TEST(test_swiglu_grad_avx512, check_swiglu_grad, KILN_SIMD_AVX512)
LEVEL_TEST(test_swiglu_threads_scalar, check_swiglu_threads, KILN_SIMD_SCALAR)
LEVEL_TEST(test_swiglu_threads_avx512, check_swiglu_threads, KILN_SIMD_AVX512)
LEVEL_TEST(test_attention_grad_scalar, check_attention_grad, KILN_SIMD_SCALAR)
LEVEL_TEST(test_attention_grad_avx512, check_attention_grad, KILN_SIMD_AVX512)
LEVEL_TEST(test_attention_vs_inference_scalar, check_attention_vs_inference, KILN_SIMD_SCALAR)
LEVEL_TEST(test_attention_vs_inference_avx512, check_attention_vs_inference, KILN_SIMD_AVX512)
LEVEL_TEST(test_attention_threads_scalar, check_attention_threads, KILN_SIMD_SCALAR)
LEVEL_TEST(test_attention_threads_avx512, check_attention_threads, KILN_SIMD_AVX512)
LEVEL_TEST(test_cross_entropy_grad_scalar, check_cross_entropy_grad, KILN_SIMD_SCALAR)
LEVEL_TEST(test_cross_entropy_grad_avx512, check_cross_entropy_grad, KILN_SIMD_AVX512)
LEVEL_TEST(test_cross_entropy_threads_scalar, check_cross_entropy_threads, KILN_SIMD_SCALAR)
LEVEL_TEST(test_cross_entropy_threads_avx512, check_cross_entropy_threads, KILN_SIMD_AVX512)

/* ---------------------------------------------------------------- timing (informative) */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Milliseconds a call of the attention and loss ops takes at the best level, with a thread per core, at the shapes
 * of a small model: B 4, T 256, NH 8, HS 48, V 4096. */
static void time_train_ops(void) {
    enum { B = 4, T = 256, NH = 8, HS = 48, V = 4096, N = B * T, W = NH * HS };
    kiln_pool *pool;
    if (kiln_pool_create(0, &pool) != KILN_OK) return;
    unsigned long long rng = 120;
    kiln_ops_ctx ctx = make_ctx(pool, B, T, W, NH, V);
    float *q = new_normal(N * W, 1, &rng), *k = new_normal(N * W, 1, &rng), *v = new_normal(N * W, 1, &rng);
    float *out = new_zero(N * W), *lse = new_zero(B * NH * T), *dq = new_zero(N * W), *dk = new_zero(N * W);
    float *dv = new_zero(N * W), *logits = new_normal((int64_t)N * V, 2, &rng);
    int32_t *targets = malloc(N * sizeof *targets);
    for (int t = 0; t < N; t++) targets[t] = (int32_t)(test_rng_next(&rng) % V);
    double ms[3];
    for (int op = 0; op < 3; op++) {
        int reps = 0;
        double t0 = now_s(), el;
        do {
            int64_t counted;
            if (op == 0) kiln_cpu_ops.attention_forward_train(&ctx, out, lse, q, k, v, B, T, NH, NH, HS);
            if (op == 1) kiln_cpu_ops.attention_backward(&ctx, dq, dk, dv, q, q, k, v, out, lse, B, T, NH, NH, HS);
            if (op == 2) kiln_cpu_ops.cross_entropy(&ctx, logits, NULL, targets, N, V, 0.0f, 0.0f, -1, 1.0f, &counted);
            reps++;
        } while ((el = now_s() - t0) < 0.2);
        ms[op] = el / reps * 1e3;
    }
    printf("# %s, %d threads, B %d T %d NH %d HS %d: attention forward %.1f ms, backward %.1f ms; cross-entropy "
           "%d x %d %.1f ms\n", kiln_simd_name(kiln_cpu_ops_level()), kiln_pool_size(pool), B, T, NH, HS, ms[0], ms[1],
           N, V, ms[2]);
    free(ctx.scratch), free(q), free(k), free(v), free(out), free(lse), free(dq), free(dk), free(dv), free(logits);
    free(targets);
    kiln_pool_free(pool);
}

int main(void) {
    for (int i = 0; i < COUNT(pools); i++)
        if (kiln_pool_create(i + 1, &pools[i]) != KILN_OK) return 1;
    RUN(test_train_scratch_size);
    RUN(test_embed_backward);
    RUN(test_embed_backward_threads);
    RUN(test_rmsnorm_grad);
    RUN(test_rmsnorm_threads);
    RUN(test_rope_grad);
    RUN(test_rope_threads);
    RUN(test_swiglu_grad_scalar);
    RUN(test_swiglu_grad_avx512);
    RUN(test_swiglu_threads_scalar);
    RUN(test_swiglu_threads_avx512);
    RUN(test_attention_grad_scalar);
    RUN(test_attention_grad_avx512);
    RUN(test_attention_vs_inference_scalar);
    RUN(test_attention_vs_inference_avx512);
    RUN(test_attention_threads_scalar);
    RUN(test_attention_threads_avx512);
    RUN(test_cross_entropy_grad_scalar);
    RUN(test_cross_entropy_grad_avx512);
    RUN(test_cross_entropy_threads_scalar);
    RUN(test_cross_entropy_threads_avx512);
    time_train_ops();
    for (int i = 0; i < COUNT(pools); i++) kiln_pool_free(pools[i]);
    TEST_EXIT();
}
