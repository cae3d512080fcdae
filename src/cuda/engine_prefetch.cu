/* engine_prefetch.cu: the L2 prefetch hints of the CUDA engine's decode matvecs (kiln_cuda_mv_tail's pf). The forward
 * names the weights coming next (the seam's prefetch step); the next decode matvec's last CTAs fetch them, each weight
 * from where this step's earlier prefetches of it stopped, up to KILN_PREFETCH_MB. Off by default (engine.cu's
 * PF_DEFAULT_MB says why). */
#include "cuda/engine.h"

/* How far this step has prefetched the weight at p (a new entry at 0; when the table is full, a scratch one). */
static size_t *pf_done(engine *e, const void *p) {
    for (int i = 0; i < e->n_seen; i++)
        if (e->pf_seen[i].p == p) return &e->pf_seen[i].done;
    const int n = sizeof e->pf_seen / sizeof e->pf_seen[0];
    const int i = e->n_seen < n ? e->n_seen++ : n - 1;
    e->pf_seen[i].p = p, e->pf_seen[i].done = 0;
    return &e->pf_seen[i].done;
}

/* The pending hints into a decode matvec's prefetch spans: hint by hint in the order given (a pair splits its
 * share), each weight from where this step's earlier prefetches of it stopped, up to pf_budget bytes in all.
 * The hints are then spent; a matmul that is not a matvec drops them (engine_pf_drop). */
void engine_pf_spans(engine *e, kiln_cuda_mv_tail *t) {
    size_t left = e->pf_budget;
    int n = 0;
    for (int h = 0; h < e->n_hint && n < KILN_CUDA_PF_SPANS; h++) {
        const int k = e->hint[h][1] ? 2 : 1;
        const size_t share = left / (size_t)k;
        for (int j = 0; j < k && n < KILN_CUDA_PF_SPANS; j++) {
            const kiln_cuda_wt *W = e->hint[h][j];
            if (((uintptr_t)W->data & 15) || W->rows < 1) continue;
            size_t *done = pf_done(e, W->data);
            const size_t total = (size_t)W->rows * W->row_bytes, rest = total > *done ? total - *done : 0;
            const size_t take = (rest < share ? rest : share) & ~(size_t)15;
            if (!take) continue;
            t->pf[n] = (const uint8_t *)W->data + *done, t->pf_bytes[n++] = take;
            *done += take, left -= take;
        }
    }
    e->n_hint = 0;
}

kiln_status engine_prefetch(void *p, const kiln_weight *W, const kiln_weight *W2) {
    engine *e = (engine *)p;
    const int n = sizeof e->hint / sizeof e->hint[0];
    if (!e->pf_budget || e->n_hint == n || !W) return KILN_OK;
    const dev_wt *D = (const dev_wt *)W->impl;
    e->hint[e->n_hint][0] = D->n_merged ? &D->qkv : &D->q; /* wq: the q, k (and v) matrix its decode matvec reads */
    e->hint[e->n_hint++][1] = W2 ? &((const dev_wt *)W2->impl)->q : NULL;
    return KILN_OK;
}
