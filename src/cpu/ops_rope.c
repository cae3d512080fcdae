/* ops_rope.c: rotary position embedding, in place, as llama.cpp's ggml_rope_ext. For the pair i of a head at
 * position p the unscaled angle is p * base^(-2i/d), computed like llama.cpp in float: theta_scale =
 * powf(base, -2/d), theta_0 = p, theta_{i+1} = theta_i * theta_scale. Scaling (kiln_rope in model.h, rope.c) then
 * multiplies pair i's angle by freq[i] and cos and sin by mscale; freq NULL skips the product, so the unscaled
 * rotation keeps its bits. The recurrence drifts from the exact angle by ~i ulps (about 1e-3 rad at p = 4096), and llama.cpp
 * has the same drift, so matching its order keeps logits close to its. Interleaved layout rotates (x[2i],
 * x[2i+1]), NeoX (x[i], x[i + d/2]); dims past d = rope_dim are left alone. tests/test_ops.c checks both
 * layouts against this recurrence in double (1e-5) and against exact angles (a bound growing with p).
 *
 * The backward is the transpose (the inverse rotation times mscale), the same code with the sine negated, so it
 * uses the very angles of the forward; tests/test_grad.c checks it against finite differences. */
#include "ops_internal.h"

#include <math.h>

/* Pairs whose angles are computed at once; the table lives on the stack and is reused by every head. */
#define ROPE_CHUNK 128

typedef struct {
    float *x;           /* (T, n_heads * HS) */
    const int32_t *pos; /* (T) */
    int64_t T, n_heads, HS, rope_dim;
    float theta_scale;
    const float *freq; /* (rope_dim / 2) or NULL: 1 */
    float mscale;
    float sin_sign; /* 1 rotates by +theta (forward), -1 by -theta (backward) */
    bool neox;
} rope_job;

static void rope_rows(void *arg, int ith, int nth) {
    const rope_job *j = arg;
    const int64_t half = j->rope_dim / 2;
    float cos_t[ROPE_CHUNK], sin_t[ROPE_CHUNK];
    int64_t lo, hi;
    kiln_ops_split(j->T, ith, nth, &lo, &hi);
    for (int64_t t = lo; t < hi; t++) {
        float *row = j->x + t * j->n_heads * j->HS;
        float theta = (float)j->pos[t];
        for (int64_t i0 = 0; i0 < half; i0 += ROPE_CHUNK) {
            const int64_t n = half - i0 < ROPE_CHUNK ? half - i0 : ROPE_CHUNK;
            for (int64_t i = 0; i < n; i++) {
                const float th = j->freq ? theta * j->freq[i0 + i] : theta;
                cos_t[i] = cosf(th);
                sin_t[i] = j->sin_sign * sinf(th);
                if (j->mscale != 1.0f) cos_t[i] *= j->mscale, sin_t[i] *= j->mscale;
                theta *= j->theta_scale;
            }
            for (int64_t h = 0; h < j->n_heads; h++) {
                float *x = row + h * j->HS;
                /* Element a of pair i0+i is x[a], its partner x[b]. */
                const int64_t a0 = j->neox ? i0 : 2 * i0, step = j->neox ? 1 : 2, b_off = j->neox ? half : 1;
                for (int64_t i = 0; i < n; i++) {
                    float *xa = x + a0 + i * step, *xb = xa + b_off;
                    const float x0 = *xa, x1 = *xb;
                    *xa = x0 * cos_t[i] - x1 * sin_t[i];
                    *xb = x0 * sin_t[i] + x1 * cos_t[i];
                }
            }
        }
    }
}

static void rope_run(kiln_ops_ctx *ctx, float *x, const int32_t *pos, int64_t T, int64_t n_heads, int64_t HS,
                     int64_t rope_dim, float base, const float *freq, float mscale, bool neox, float sin_sign) {
    assert(rope_dim > 0 && rope_dim % 2 == 0 && rope_dim <= HS);
    rope_job j = {x, pos, T, n_heads, HS, rope_dim, powf(base, -2.0f / (float)rope_dim), freq, mscale, sin_sign, neox};
    /* Two sincos per pair per token, a few ns per rotated pair: threads from a prefill of several tokens. */
    kiln_ops_run(ctx, rope_rows, &j, T > 1 && T * n_heads * rope_dim >= (1 << 15));
}

void kiln_cpu_rope_forward(kiln_ops_ctx *ctx, float *x, const int32_t *pos, int64_t T, int64_t n_heads, int64_t HS,
                           int64_t rope_dim, float base, const float *freq, float mscale, bool neox) {
    rope_run(ctx, x, pos, T, n_heads, HS, rope_dim, base, freq, mscale, neox, 1.0f);
}

void kiln_cpu_rope_backward(kiln_ops_ctx *ctx, float *dx, const int32_t *pos, int64_t T, int64_t n_heads, int64_t HS,
                            int64_t rope_dim, float base, const float *freq, float mscale, bool neox) {
    rope_run(ctx, dx, pos, T, n_heads, HS, rope_dim, base, freq, mscale, neox, -1.0f);
}
