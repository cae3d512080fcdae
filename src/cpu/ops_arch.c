/* ops_arch.c: the elementwise ops that the architecture features of the one forward need (#6): gemma's GeGLU
 * with the tanh GELU, qwen2's projection biases, the sigmoid attention output gate, and scaling with an optional
 * tanh softcap (gemma's sqrt(C) embedding scale, Muse's logit scale and final softcap). Plain scalar C, the
 * oracle; each is cheap next to the matmuls around it, so threads help only for large prefill batches.
 * tests/test_arch.c checks the forward built on them against tests/ref/arch_ref.py's float64 numpy reference. */
#include "ops_internal.h"

#include <math.h>

/* A few ns an element (tanhf, expf): threads pay off past ~64k elements. */
static bool elems_parallel(int64_t n) { return n >= (1 << 16); }

typedef struct {
    float *out;
    const float *a, *b;
    int64_t n;
    float scale, cap;
} elem_job;

/* gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), GELU's tanh approximation (Hendrycks and
 * Gimpel 2016), what gemma's gelu_pytorch_tanh and llama.cpp's ggml_gelu compute. */
static void geglu_part(void *arg, int ith, int nth) {
    const elem_job *j = arg;
    int64_t lo, hi;
    kiln_ops_split(j->n, ith, nth, &lo, &hi);
#if defined(__x86_64__)
    if (kiln_cpu_ops_level() >= KILN_SIMD_AVX2) {
        kiln_geglu_avx2(j->out, j->a, j->b, lo, hi);
        return;
    }
#endif
    kiln_geglu_scalar(j->out, j->a, j->b, lo, hi);
}

void kiln_geglu_scalar(float *out, const float *gate, const float *up, int64_t lo, int64_t hi) {
    const float k = 0.7978845608028654f; /* sqrt(2/pi) */
    for (int64_t i = lo; i < hi; i++) {
        const float x = gate[i];
        out[i] = 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x))) * up[i];
    }
}

void kiln_cpu_geglu_forward(kiln_ops_ctx *ctx, float *out, const float *gate, const float *up, int64_t n) {
    elem_job j = {out, gate, up, n, 0, 0};
    kiln_ops_run(ctx, geglu_part, &j, elems_parallel(n));
}

void kiln_cpu_add_bias_forward(kiln_ops_ctx *ctx, float *x, const float *b, int64_t T, int64_t n) {
    (void)ctx;
    for (int64_t t = 0; t < T; t++)
        for (int64_t i = 0; i < n; i++) x[t * n + i] += b[i];
}

static void sigmoid_mul_part(void *arg, int ith, int nth) {
    const elem_job *j = arg;
    int64_t lo, hi;
    kiln_ops_split(j->n, ith, nth, &lo, &hi);
    for (int64_t i = lo; i < hi; i++) j->out[i] *= 1.0f / (1.0f + expf(-j->a[i]));
}

void kiln_cpu_sigmoid_mul_forward(kiln_ops_ctx *ctx, float *x, const float *g, int64_t n) {
    elem_job j = {x, g, NULL, n, 0, 0};
    kiln_ops_run(ctx, sigmoid_mul_part, &j, elems_parallel(n));
}

static void softcap_part(void *arg, int ith, int nth) {
    const elem_job *j = arg;
    int64_t lo, hi;
    kiln_ops_split(j->n, ith, nth, &lo, &hi);
    if (j->cap > 0)
        for (int64_t i = lo; i < hi; i++) j->out[i] = j->cap * tanhf(j->out[i] * j->scale / j->cap);
    else
        for (int64_t i = lo; i < hi; i++) j->out[i] *= j->scale;
}

void kiln_cpu_scale_softcap_forward(kiln_ops_ctx *ctx, float *x, int64_t n, float scale, float cap) {
    assert(cap >= 0);
    elem_job j = {x, NULL, NULL, n, scale, cap};
    kiln_ops_run(ctx, softcap_part, &j, elems_parallel(n));
}
