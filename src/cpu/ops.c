/* ops.c: the CPU ops table (kiln_cpu_ops), the embedding lookup and its backward, and the scratch contracts. What
 * the op files share (SIMD level, pool dispatch, barrier) is in ops_util.c. Each other op family has its own file:
 * ops_rmsnorm.c, ops_matmul.c, ops_dense.c, ops_rope.c, ops_attention.c, ops_swiglu.c, ops_loss.c. tests/test_ops.c
 * checks every op against a double-precision reference on random inputs, at every SIMD level the CPU has and with
 * 1, 2 and 3 threads; tests/test_grad.c checks every backward against finite differences and the thread counts bit for bit.
 *
 * Scratch: the ops run one after another, so each uses the whole of ctx->scratch from its start; the size
 * asked for is the largest single need (matmul's quantized activations, or attention's per-thread areas and
 * decode partials). */
#include "ops_internal.h"

#include <math.h>
#include <stdlib.h>

const kiln_ops kiln_cpu_ops = {
    .embed_forward = kiln_cpu_embed_forward,
    .rmsnorm_forward = kiln_cpu_rmsnorm_forward,
    .matmul_forward = kiln_cpu_matmul_forward,
    .matmul_n_forward = kiln_cpu_matmul_n_forward,
    .prepare_weights = kiln_cpu_prepare_weights,
    .release_weights = kiln_cpu_release_weights,
    .rope_forward = kiln_cpu_rope_forward,
    .attention_forward = kiln_cpu_attention_forward,
    .swiglu_forward = kiln_cpu_swiglu_forward,
    .attention_window_forward = kiln_cpu_attention_window_forward,
    .attention_kv_forward = kiln_cpu_attention_kv_forward,
    .geglu_forward = kiln_cpu_geglu_forward,
    .add_bias_forward = kiln_cpu_add_bias_forward,
    .sigmoid_mul_forward = kiln_cpu_sigmoid_mul_forward,
    .scale_softcap_forward = kiln_cpu_scale_softcap_forward,
    .scratch_size = kiln_cpu_scratch_size,
    .kv_scratch_size = kiln_cpu_attention_kv_scratch_size,
    /* training (#5) */
    .embed_backward = kiln_cpu_embed_backward,
    .rmsnorm_forward_train = kiln_cpu_rmsnorm_forward_train,
    .rmsnorm_backward = kiln_cpu_rmsnorm_backward,
    .dense_forward = kiln_cpu_dense_forward,
    .dense_backward = kiln_cpu_dense_backward,
    .rope_backward = kiln_cpu_rope_backward,
    .attention_forward_train = kiln_cpu_attention_forward_train,
    .attention_backward = kiln_cpu_attention_backward,
    .swiglu_backward = kiln_cpu_swiglu_backward,
    .cross_entropy = kiln_cpu_cross_entropy,
    .train_scratch_size = kiln_cpu_train_scratch_size,
};

/* Matmul needs T quantized activation rows; attention a few areas per thread and, for decode, the partial
 * results of every key chunk (ops_attention.c). Both start at the scratch base after alignment, so the total is
 * the larger plus the alignment slack. */
size_t kiln_cpu_scratch_size(int64_t T, int64_t max_width, int64_t NH, int64_t n_ctx, int n_threads) {
    size_t mm = kiln_cpu_matmul_scratch_size(T, max_width);
    size_t at = kiln_cpu_attention_scratch_size(T, max_width, NH, n_ctx, n_threads);
    return kiln_ops_add(mm > at ? mm : at, KILN_OPS_ALIGN);
}

/* ---------------------------------------------------------------- embedding */

typedef struct {
    float *out;                   /* (T, C) */
    const kiln_tensor_view *table;/* (V rows of C) */
    const int32_t *ids;           /* (T) */
    int64_t T;
    kiln_to_float_fn to_float;
} embed_job;

static void embed_rows(void *arg, int ith, int nth) {
    const embed_job *j = arg;
    const int64_t C = j->table->ne[0];
    int64_t lo, hi;
    kiln_ops_split(j->T, ith, nth, &lo, &hi);
    for (int64_t t = lo; t < hi; t++) {
        assert(j->ids[t] >= 0 && j->ids[t] < j->table->ne[1]);
        j->to_float((const char *)j->table->data + (size_t)j->ids[t] * j->table->nb[1], j->out + t * C, C);
    }
}

void kiln_cpu_embed_forward(kiln_ops_ctx *ctx, float *out, const kiln_tensor_view *table, const int32_t *ids, int64_t T) {
    embed_job j = {out, table, ids, T, kiln_get_to_float(table->type, kiln_cpu_ops_level())};
    assert(j.to_float && "embedding type without to_float: kiln_model_load rejects it");
    /* A row is a few KiB of dequantization; threads pay off from a prefill batch of tens of rows. */
    kiln_ops_run(ctx, embed_rows, &j, T * table->ne[0] >= (1 << 17));
}

/* ---------------------------------------------------------------- embedding backward */

typedef struct {
    float *dtable;       /* (V, C) */
    const float *dout;   /* (N, C) */
    const int32_t *ids;  /* (N) */
    int64_t N, C;
    int64_t skipped;     /* written by thread 0 */
} embed_backward_job;

/* Thread ith owns columns [lo, hi) of every table row (cut on 16-column lines, so no two threads share a cache
 * line of dtable) and walks all N tokens in order: a row hit by several tokens sums them in token order, whatever
 * the thread count, without atomics. Every thread checks whole dout rows for non-finite values, so all skip the
 * same rows; the check reads each row once more per thread, which is cheaper than a barrier at these sizes. */
static void embed_backward_cols(void *arg, int ith, int nth) {
    embed_backward_job *j = arg;
    const int64_t C = j->C;
    int64_t lo, hi;
    kiln_ops_split((C + 15) / 16, ith, nth, &lo, &hi);
    lo *= 16;
    hi = hi * 16 < C ? hi * 16 : C;
    int64_t skipped = 0;
    for (int64_t t = 0; t < j->N; t++) {
        const float *g = j->dout + t * C;
        bool finite = true;
        for (int64_t i = 0; i < C && finite; i++) finite = isfinite(g[i]);
        if (!finite) {
            skipped++;
            continue;
        }
        float *row = j->dtable + (int64_t)j->ids[t] * C;
        for (int64_t i = lo; i < hi; i++) row[i] += g[i];
    }
    if (ith == 0) j->skipped = skipped;
}

int64_t kiln_cpu_embed_backward(kiln_ops_ctx *ctx, float *dtable, const float *dout, const int32_t *ids, int64_t N, int64_t C) {
    assert(N >= 0 && C > 0);
    embed_backward_job j = {dtable, dout, ids, N, C, 0};
    /* A few adds per element: threads pay off past ~128k elements, as for the lookup. */
    kiln_ops_run(ctx, embed_backward_cols, &j, C >= 32 && N * C >= (1 << 17));
    return j.skipped;
}

/* ---------------------------------------------------------------- training scratch */

/* As kiln_cpu_scratch_size: the ops run one at a time, each from the scratch base, so the need is the largest
 * single one (the dense matmul's packed panels, attention's per-thread copies of K and V, the loss's per-row
 * sums) plus the alignment slack. The embedding backward, RMSNorm, RoPE and SwiGLU need none. */
size_t kiln_cpu_train_scratch_size(int64_t B, int64_t T, int64_t max_width, int64_t NH, int64_t V, int n_threads) {
    if (B <= 0 || T <= 0 || max_width <= 0 || NH <= 0 || V <= 0 || n_threads <= 0) return 0;
    if (B > INT64_MAX / T) return SIZE_MAX;
    const int64_t N = B * T;
    size_t need = kiln_cpu_dense_scratch_size(N, max_width, max_width > V ? max_width : V, n_threads);
    const size_t at = kiln_cpu_attention_train_scratch_size(T, max_width, NH, n_threads);
    const size_t ce = kiln_cpu_cross_entropy_scratch_size(N);
    need = need > at ? need : at;
    need = need > ce ? need : ce;
    return kiln_ops_add(need, KILN_OPS_ALIGN);
}
