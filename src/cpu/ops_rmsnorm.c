/* ops_rmsnorm.c: RMS normalization, out = x * (1 / sqrt(mean(x^2) + eps)) * w, with llama.cpp's float order
 * (ggml_compute_forward_rms_norm_f32 followed by the weight multiply): each square is a float product, the
 * sum is a double, mean and scale are floats, and out = (x * scale) * w. Keeping that order keeps logits
 * within float rounding of llama.cpp's. Tested against a double reference at relative 1e-6 (tests/test_ops.c). */
#include "ops_internal.h"

#include <math.h>

typedef struct {
    float *out;     /* (T, C), may equal x */
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
        for (int64_t i = 0; i < C; i++) out[i] = (x[i] * scale) * j->w[i];
    }
}

void kiln_cpu_rmsnorm_forward(kiln_ops_ctx *ctx, float *out, const float *x, const float *w, int64_t T, int64_t C, float eps) {
    assert(C > 0 && T >= 0);
    rmsnorm_job j = {out, x, w, T, C, eps};
    /* About a nanosecond an element: threads pay off past ~100k elements (a pool wake-up is 10-90 us). */
    kiln_ops_run(ctx, rmsnorm_rows, &j, T > 1 && T * C >= (1 << 17));
}
