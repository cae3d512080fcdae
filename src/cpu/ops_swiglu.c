/* ops_swiglu.c: the SwiGLU gate of the LLaMA FFN, out = silu(gate) * up with silu(g) = g / (1 + exp(-g)),
 * written as llama.cpp's scalar ggml_silu_f32. Tested against a double reference (tests/test_ops.c). */
#include "ops_internal.h"

#include <math.h>

typedef struct {
    float *out;        /* (n), may equal gate */
    const float *gate; /* (n) */
    const float *up;   /* (n) */
    int64_t n;
} swiglu_job;

static void swiglu_range(void *arg, int ith, int nth) {
    const swiglu_job *j = arg;
    int64_t lo, hi;
    kiln_ops_split(j->n / 16, ith, nth, &lo, &hi); /* split on 16-element (cache line) bounds */
    lo *= 16;
    hi = ith == nth - 1 ? j->n : hi * 16;
    for (int64_t i = lo; i < hi; i++) {
        const float g = j->gate[i];
        j->out[i] = g / (1.0f + expf(-g)) * j->up[i];
    }
}

void kiln_cpu_swiglu_forward(kiln_ops_ctx *ctx, float *out, const float *gate, const float *up, int64_t n) {
    swiglu_job j = {out, gate, up, n};
    /* expf is ~5 ns: threads pay off from ~16k elements (a pool wake-up is 10-90 us). */
    kiln_ops_run(ctx, swiglu_range, &j, n >= (1 << 14));
}
