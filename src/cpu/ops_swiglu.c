/* ops_swiglu.c: the SwiGLU gate of the LLaMA FFN, out = silu(gate) * up with silu(g) = g / (1 + exp(-g)),
 * written as llama.cpp's scalar ggml_silu_f32, by the scalar kernel below (the oracle) or, at the AVX-512 level,
 * ops_train_avx512.c's with the polynomial exp (the same formula; libm's expf had been 5% of SmolLM2's prefill).
 * Both are tested against a double reference (tests/test_ops.c).
 * The backward, with sig = 1 / (1 + exp(-g)): dup += dout * g * sig, dgate += dout * up * sig * (1 + g * (1 - sig)),
 * by the scalar kernel below (the oracle) or ops_train_avx512.c's; tests/test_grad.c checks both against finite
 * differences. */
#include "ops_internal.h"

#include <math.h>

typedef struct {
    float *out;        /* (n), may equal gate */
    const float *gate; /* (n) */
    const float *up;   /* (n) */
    int64_t n;
    kiln_swiglu_fwd_fn kernel;
} swiglu_job;

static void swiglu_range(void *arg, int ith, int nth) {
    const swiglu_job *j = arg;
    int64_t lo, hi;
    kiln_ops_split(j->n / 16, ith, nth, &lo, &hi); /* split on 16-element (cache line) bounds */
    lo *= 16;
    hi = ith == nth - 1 ? j->n : hi * 16;
    j->kernel(j->out + lo, j->gate + lo, j->up + lo, hi - lo);
}

void kiln_swiglu_fwd_scalar(float *out, const float *gate, const float *up, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

void kiln_cpu_swiglu_forward(kiln_ops_ctx *ctx, float *out, const float *gate, const float *up, int64_t n) {
    swiglu_job j = {out, gate, up, n, kiln_swiglu_fwd_scalar};
#if defined(__x86_64__)
    if (kiln_cpu_ops_level() >= KILN_SIMD_AVX512) j.kernel = kiln_swiglu_fwd_avx512;
#endif
    /* expf is ~5 ns: threads pay off from ~16k elements (a pool wake-up is 10-90 us). */
    kiln_ops_run(ctx, swiglu_range, &j, n >= (1 << 14));
}

void kiln_swiglu_bwd_scalar(float *dgate, float *dup, const float *dout, const float *gate, const float *up, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const float g = gate[i], sig = 1.0f / (1.0f + expf(-g)), d = dout[i];
        dup[i] += d * (g * sig);
        dgate[i] += d * up[i] * (sig * (1.0f + g * (1.0f - sig)));
    }
}

typedef struct {
    float *dgate, *dup;                 /* (n) */
    const float *dout, *gate, *up;      /* (n) */
    int64_t n;
    kiln_swiglu_bwd_fn kernel;
} swiglu_backward_job;

static void swiglu_backward_range(void *arg, int ith, int nth) {
    const swiglu_backward_job *j = arg;
    int64_t lo, hi;
    kiln_ops_split(j->n / 16, ith, nth, &lo, &hi); /* 16-element (cache line) bounds, as the forward */
    lo *= 16;
    hi = ith == nth - 1 ? j->n : hi * 16;
    j->kernel(j->dgate + lo, j->dup + lo, j->dout + lo, j->gate + lo, j->up + lo, hi - lo);
}

void kiln_cpu_swiglu_backward(kiln_ops_ctx *ctx, float *dgate, float *dup, const float *dout, const float *gate,
                              const float *up, int64_t n) {
    assert(n >= 0);
    swiglu_backward_job j = {dgate, dup, dout, gate, up, n, kiln_swiglu_bwd_scalar};
#if defined(__x86_64__)
    if (kiln_cpu_ops_level() >= KILN_SIMD_AVX512) j.kernel = kiln_swiglu_bwd_avx512;
#endif
    kiln_ops_run(ctx, swiglu_backward_range, &j, n >= (1 << 14));
}
