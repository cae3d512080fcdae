/* ops_rmsnorm.c: RMS normalization, out = x * (1 / sqrt(mean(x^2) + eps)) * w, with llama.cpp's float order
 * (ggml_compute_forward_rms_norm_f32 followed by the weight multiply): each square is a float product, the
 * sum is a double, mean and scale are floats, and out = (x * scale) * w. Keeping that order keeps logits
 * within float rounding of llama.cpp's. Tested against a double reference at relative 1e-6 (tests/test_ops.c).
 *
 * Training: the forward also saves each row's scale rstd (the same float), and the backward is, with r = rstd
 * and g = dout * w,  dx = r * g - x * r^3 * mean(g * x),  dw = sum over rows of dout * x * r. tests/test_grad.c
 * checks both against central differences of a double forward and 1, 2, 3 threads bit for bit. */
#include "ops_internal.h"

#include <math.h>

typedef struct {
    float *out;     /* (T, C), may equal x */
    float *rstd;    /* (T) or NULL */
    const float *x; /* (T, C) */
    const float *w; /* (C) */
    int64_t T, C;
    float eps;
} rmsnorm_job;

static void rmsnorm_rows(void *arg, int ith, int nth) {
    const rmsnorm_job *j = arg;
    const int64_t C = j->C;
    int64_t lo, hi;
    kiln_ops_split(j->T, ith, nth, &lo, &hi);
    for (int64_t t = lo; t < hi; t++) {
        const float *x = j->x + t * C;
        float *out = j->out + t * C;
        double sum = 0.0;
        for (int64_t i = 0; i < C; i++) sum += (double)(x[i] * x[i]);
        const float mean = (float)(sum / (double)C);
        const float scale = 1.0f / sqrtf(mean + j->eps);
        if (j->rstd) j->rstd[t] = scale;
        for (int64_t i = 0; i < C; i++) out[i] = (x[i] * scale) * j->w[i];
    }
}

/* About a nanosecond an element: threads pay off past ~100k elements (a pool wake-up is 10-90 us). */
static bool rows_parallel(int64_t T, int64_t C) { return T > 1 && T * C >= (1 << 17); }

void kiln_cpu_rmsnorm_forward(kiln_ops_ctx *ctx, float *out, const float *x, const float *w, int64_t T, int64_t C, float eps) {
    assert(C > 0 && T >= 0);
    rmsnorm_job j = {out, NULL, x, w, T, C, eps};
    kiln_ops_run(ctx, rmsnorm_rows, &j, rows_parallel(T, C));
}

void kiln_cpu_rmsnorm_forward_train(kiln_ops_ctx *ctx, float *out, float *rstd, const float *x, const float *w,
                                    int64_t N, int64_t C, float eps) {
    assert(C > 0 && N >= 0 && rstd && out != x);
    rmsnorm_job j = {out, rstd, x, w, N, C, eps};
    kiln_ops_run(ctx, rmsnorm_rows, &j, rows_parallel(N, C));
}

typedef struct {
    float *dx, *dw;                 /* (N, C), (C) */
    const float *dout, *x, *w;      /* (N, C), (N, C), (C) */
    const float *rstd;              /* (N) */
    int64_t N, C;
} rmsnorm_backward_job;

/* Columns of dw summed at once: a stack row of partial sums, in double (N products each: 2048 in a float would
 * lose ~sqrt(N) ulps). */
#define DW_COLS 256

/* Two splits in one job, neither with a shared write: dx by rows (each row needs only its own sum), then dw by
 * columns, each thread summing its columns over all N rows in row order. So dw's sums have the same order for any
 * thread count, with no per-thread partials to add up. dw only reads the inputs, so no barrier sits between. */
static void rmsnorm_backward_split(void *arg, int ith, int nth) {
    const rmsnorm_backward_job *j = arg;
    const int64_t C = j->C;
    int64_t lo, hi;
    kiln_ops_split(j->N, ith, nth, &lo, &hi);
    for (int64_t t = lo; t < hi; t++) {
        const float *x = j->x + t * C, *g = j->dout + t * C;
        float *dx = j->dx + t * C;
        const float r = j->rstd[t];
        double gwx = 0.0; /* sum of dout * w * x, the one reduction: double, as the forward's sum of squares */
        for (int64_t i = 0; i < C; i++) gwx += (double)(g[i] * j->w[i]) * x[i];
        const float c = (float)(gwx / (double)C * r * r * r);
        for (int64_t i = 0; i < C; i++) dx[i] += r * (g[i] * j->w[i]) - c * x[i];
    }
    kiln_ops_split((C + 15) / 16, ith, nth, &lo, &hi); /* 16-column lines: no two threads share one of dw */
    lo *= 16;
    hi = hi * 16 < C ? hi * 16 : C;
    double acc[DW_COLS];
    for (int64_t i0 = lo; i0 < hi; i0 += DW_COLS) {
        const int64_t n = hi - i0 < DW_COLS ? hi - i0 : DW_COLS;
        for (int64_t i = 0; i < n; i++) acc[i] = 0.0;
        for (int64_t t = 0; t < j->N; t++) {
            const float *x = j->x + t * C + i0, *g = j->dout + t * C + i0;
            const float r = j->rstd[t];
            for (int64_t i = 0; i < n; i++) acc[i] += g[i] * (x[i] * r);
        }
        for (int64_t i = 0; i < n; i++) j->dw[i0 + i] += (float)acc[i];
    }
}

void kiln_cpu_rmsnorm_backward(kiln_ops_ctx *ctx, float *dx, float *dw, const float *dout, const float *x, const float *w,
                               const float *rstd, int64_t N, int64_t C) {
    assert(C > 0 && N >= 0);
    rmsnorm_backward_job j = {dx, dw, dout, x, w, rstd, N, C};
    kiln_ops_run(ctx, rmsnorm_backward_split, &j, rows_parallel(N, C));
}
