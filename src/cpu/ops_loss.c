/* ops_loss.c: the fused softmax cross-entropy of the LM head, with label smoothing and z-loss (the contract and
 * formulas are in ops.h). One row is three passes over its V logits: max and sum, exp (written in place when a
 * gradient is wanted, so each logit costs one exp), then the gradient from the stored exps. The first two are the
 * row kernel: the scalar one below (the oracle) or ops_train_avx512.c's. Each row's loss is computed in double and
 * the total is summed in row order after the threads are done, so it is the same for any thread count.
 * tests/test_grad.c checks losses and gradients against a double reference and finite differences.
 *
 * z-loss (PaLM, Chowdhery et al. 2022, section 5) is z_loss * logsumexp^2: it keeps the normalizer near 0 so the
 * logits do not drift; its gradient 2 * z_loss * z * p folds into the softmax term. */
#include "ops_internal.h"

#include <math.h>

void kiln_ce_row_scalar(float *x, int64_t V, bool write, float *max, double *sum_x, double *sum_e) {
    float m = -INFINITY;
    double sx = 0.0, se = 0.0;
    for (int64_t i = 0; i < V; i++) {
        m = x[i] > m ? x[i] : m;
        sx += x[i];
    }
    if (write)
        for (int64_t i = 0; i < V; i++) se += (x[i] = expf(x[i] - m));
    else
        for (int64_t i = 0; i < V; i++) se += expf(x[i] - m);
    *max = m, *sum_x = sx, *sum_e = se;
}

typedef struct {
    float *logits;          /* (N, V), gradients written over them when dscale != 0 */
    float *losses;          /* (N) or NULL */
    double *row_loss;       /* (N) scratch */
    const int32_t *targets; /* (N) */
    int64_t N, V;
    float eps, z_loss, dscale;
    int32_t ignore_index;
    kiln_ce_row_fn row;
} ce_job;

static void ce_rows(void *arg, int ith, int nth) {
    const ce_job *j = arg;
    const int64_t V = j->V, V16 = V & ~(int64_t)15;
    const bool grad = j->dscale != 0.0f;
    int64_t lo, hi;
    kiln_ops_split(j->N, ith, nth, &lo, &hi);
    for (int64_t t = lo; t < hi; t++) {
        float *x = j->logits + t * V;
        const int32_t target = j->targets[t];
        if (target == j->ignore_index) {
            j->row_loss[t] = 0.0;
            if (j->losses) j->losses[t] = 0.0f;
            if (grad)
                for (int64_t i = 0; i < V; i++) x[i] = 0.0f;
            continue;
        }
        assert(target >= 0 && target < V);
        const float x_target = x[target];
        float max;
        double sum_x, sum_e;
        j->row(x, V, grad, &max, &sum_x, &sum_e);
        const double z = (double)max + log(sum_e), eps = j->eps;
        const double loss = (1.0 - eps) * (z - x_target) + eps * (z - sum_x / (double)V) + j->z_loss * z * z;
        j->row_loss[t] = loss;
        if (j->losses) j->losses[t] = (float)loss;
        if (grad) {
            /* dscale * (p (1 + 2 z_loss z) - eps / V), p = exp / sum, and the target's one-hot on top. The 16-wide
             * body is what GCC -O2 vectorizes; each element is one product and one difference either way. */
            const float a = (float)(j->dscale * (1.0 + 2.0 * j->z_loss * z) / sum_e);
            const float b = (float)(j->dscale * eps / (double)V);
            for (int64_t i = 0; i < V16; i += 16)
                for (int u = 0; u < 16; u++) x[i + u] = a * x[i + u] - b;
            for (int64_t i = V16; i < V; i++) x[i] = a * x[i] - b;
            x[target] -= (float)(j->dscale * (1.0 - eps));
        }
    }
}

size_t kiln_cpu_cross_entropy_scratch_size(int64_t N) { return N > 0 ? kiln_ops_mul((size_t)N, sizeof(double)) : 0; }

double kiln_cpu_cross_entropy(kiln_ops_ctx *ctx, float *logits, float *losses, const int32_t *targets, int64_t N,
                              int64_t V, float label_smoothing, float z_loss, int32_t ignore_index, float dscale,
                              int64_t *n_counted) {
    assert(N >= 0 && V > 0 && n_counted);
    size_t bytes;
    double *row_loss = kiln_ops_scratch(ctx, &bytes);
    assert((N == 0 || (row_loss && bytes >= kiln_cpu_cross_entropy_scratch_size(N))) &&
           "cross_entropy scratch too small: size it with train_scratch_size");
    ce_job j = {logits, losses, row_loss, targets, N, V, label_smoothing, z_loss, dscale, ignore_index, kiln_ce_row_scalar};
#if defined(__x86_64__)
    if (kiln_cpu_ops_level() >= KILN_SIMD_AVX512) j.row = kiln_ce_row_avx512;
#endif
    /* An exp is 1-5 ns: threads pay off from a few rows of a real vocabulary. */
    kiln_ops_run(ctx, ce_rows, &j, N > 1 && N * V >= (1 << 15));
    double sum = 0.0;
    int64_t counted = 0;
    for (int64_t t = 0; t < N; t++) {
        sum += row_loss[t];
        counted += targets[t] != ignore_index;
    }
    *n_counted = counted;
    return sum;
}
