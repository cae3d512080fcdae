/* ops_attention.c: causal multi-head attention with grouped KV heads over the f16 KV cache.
 *
 * For query token t (position pos0 + t) and head h, reading KV head h / (NH / NKV): s_j = q . k_j / sqrt(HS)
 * for j = 0..pos0+t, p = softmax(s) (max subtracted, exps in float, their sum in double), out = sum_j p_j v_j.
 * Scores go to a per-thread row of the scratch (so scratch holds n_ctx floats per thread). q stays float:
 * the dot products convert k and v from f16 exactly and multiply in float (llama.cpp rounds q and p to f16 in
 * its non-flash path; kiln does not). Units (t, h) are handed out from an atomic counter, longest first, so
 * a causal prefill balances. The SIMD level picks the AVX2 kernels of ops_attention_avx2.c or the scalar loops
 * below, which are the oracle; tests/test_ops.c checks both against a double reference (relative 1e-4). */
#include "ops_internal.h"

#include <math.h>

static void scores_scalar(float *s, const float *q, const uint16_t *k, int64_t kstride, int64_t n, int64_t HS, float scale) {
    for (int64_t j = 0; j < n; j++) {
        const uint16_t *kj = k + j * kstride;
        float sum = 0.0f;
        for (int64_t d = 0; d < HS; d++) sum += q[d] * kiln_fp16_to_f32(kj[d]);
        s[j] = sum * scale;
    }
}

static void accum_scalar(float *acc, const float *p, const uint16_t *v, int64_t vstride, int64_t n, int64_t HS) {
    for (int64_t j = 0; j < n; j++) {
        const uint16_t *vj = v + j * vstride;
        for (int64_t d = 0; d < HS; d++) acc[d] += p[j] * kiln_fp16_to_f32(vj[d]);
    }
}

typedef struct {
    float *out;                     /* (T, NH*HS) */
    const float *q;                 /* (T, NH*HS) */
    const uint16_t *k, *v;          /* (n_ctx, NKV*HS) f16 */
    int64_t pos0, T, NH, NKV, HS;
    float scale;
    float *scores;                  /* (nth, score_stride) */
    int64_t score_stride;
    bool simd;
    atomic_llong next_unit;
} attn_job;

static void attention_units(void *arg, int ith, int nth) {
    attn_job *j = arg;
    const int64_t n_units = j->T * j->NH, group = j->NH / j->NKV, kv_stride = j->NKV * j->HS;
    float *s = j->scores + ith * j->score_stride;
    for (;;) {
        const int64_t u = atomic_fetch_add_explicit(&j->next_unit, 1, memory_order_relaxed);
        if (u >= n_units) break;
        const int64_t unit = n_units - 1 - u; /* last tokens first: they attend to the most positions */
        const int64_t t = unit / j->NH, h = unit % j->NH, kvh = h / group, n = j->pos0 + t + 1;
        const float *q = j->q + (t * j->NH + h) * j->HS;
        const uint16_t *k = j->k + kvh * j->HS, *v = j->v + kvh * j->HS;
        float *out = j->out + (t * j->NH + h) * j->HS;

#if defined(__x86_64__)
        if (j->simd)
            kiln_attn_scores_avx2(s, q, k, kv_stride, n, j->HS, j->scale);
        else
#endif
            scores_scalar(s, q, k, kv_stride, n, j->HS, j->scale);
        float max = -INFINITY;
        for (int64_t i = 0; i < n; i++) max = s[i] > max ? s[i] : max;
        double sum = 0.0;
        for (int64_t i = 0; i < n; i++) {
            s[i] = expf(s[i] - max);
            sum += (double)s[i];
        }
        for (int64_t d = 0; d < j->HS; d++) out[d] = 0.0f;
#if defined(__x86_64__)
        if (j->simd)
            kiln_attn_accum_avx2(out, s, v, kv_stride, n, j->HS);
        else
#endif
            accum_scalar(out, s, v, kv_stride, n, j->HS);
        const float inv = (float)(1.0 / sum);
        for (int64_t d = 0; d < j->HS; d++) out[d] *= inv;
    }
}

size_t kiln_cpu_attention_scratch_size(int64_t n_ctx, int n_threads) {
    if (n_ctx <= 0 || n_threads <= 0) return 0;
    return kiln_ops_mul(kiln_ops_round_up(kiln_ops_mul((size_t)n_ctx, sizeof(float)), KILN_OPS_ALIGN), (size_t)n_threads);
}

void kiln_cpu_attention_forward(kiln_ops_ctx *ctx, float *out, const float *q, const uint16_t *k_cache,
                                const uint16_t *v_cache, int64_t pos0, int64_t T, int64_t NH, int64_t NKV, int64_t HS) {
    assert(pos0 >= 0 && T >= 0 && NKV > 0 && NH % NKV == 0 && HS > 0);
    const int64_t work = T * NH * (pos0 + T) * HS; /* multiply-adds, about */
    /* Below ~128k multiply-adds a pool wake-up costs more than it saves. */
    const bool parallel = work >= (1 << 17);
    const int nth = parallel ? kiln_ops_n_threads(ctx) : 1;
    size_t bytes;
    float *scores = kiln_ops_scratch(ctx, &bytes);
    const int64_t stride = (int64_t)(kiln_ops_round_up((size_t)(pos0 + T) * sizeof(float), KILN_OPS_ALIGN) / sizeof(float));
    assert(scores && (size_t)stride * sizeof(float) * (size_t)nth <= bytes &&
           "scratch smaller than a score row per thread: size it with scratch_size");
    attn_job j = {.out = out, .q = q, .k = k_cache, .v = v_cache, .pos0 = pos0, .T = T, .NH = NH, .NKV = NKV, .HS = HS,
                  .scale = 1.0f / sqrtf((float)HS), .scores = scores, .score_stride = stride,
#if defined(__x86_64__)
                  .simd = kiln_cpu_ops_level() >= KILN_SIMD_AVX2,
#endif
    };
    atomic_init(&j.next_unit, 0);
    kiln_ops_run(ctx, attention_units, &j, parallel);
}
