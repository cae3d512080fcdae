/* engine_measure.cu: what the CUDA engine measures of itself: one decode step's time and bytes by step kind (the
 * seam's profile step, behind `kiln bench --gpu --profile`), and the device's copy bandwidth, the roof every decode
 * figure is reported against. */
#include "cuda/engine.h"
#include "cuda/cuda.h"

#include <stdlib.h>

static const char *const prof_names[P_COUNT] = {"embed", "norm+residual", "matvec qkv", "bias/qknorm/rope/kv store",
                                                "attention", "matvec wo (+add)", "matvec gate/up + glu",
                                                "matvec down (+add)", "head + argmax", "other"};

kiln_status engine_profile(void *p, int64_t pos0, int reps, kiln_status (*step)(void *arg), void *arg, kiln_op_time *ops,
                           int *n_ops) {
    engine *e = (engine *)p;
    const kiln_llama_config *c = &e->m->cfg;
    prof_marks *pm = (prof_marks *)calloc(1, sizeof *pm);
    if (!pm) return kiln_fail(KILN_ERR_NOMEM, "gpu profile: out of memory");
    kiln_status st = KILN_OK;
    int made = 0;
    for (; made <= PROF_MAX && st == KILN_OK; made++)
        if (cudaEventCreate(&pm->ev[made]) != cudaSuccess) st = kiln_fail(KILN_ERR_IO, "gpu profile: cudaEventCreate failed");
    double ms[P_COUNT] = {0};
    for (int r = 0; r < reps && !st; r++) {
        pm->n = 0;
        e->prof = pm;
        cudaEventRecord(pm->ev[0], e->stream);
        st = step(arg);
        e->prof = NULL;
        for (int i = 0; i < pm->n && !st; i++) {
            float t = 0;
            cudaEventElapsedTime(&t, pm->ev[i], pm->ev[i + 1]);
            ms[pm->cat[i]] += t / reps;
        }
    }
    for (int i = 0; i < made; i++) cudaEventDestroy(pm->ev[i]);
    free(pm);
    if (st) return st;
    /* bytes each step must read in one decode: its weights (and the KV positions attention sees) */
    double bytes[P_COUNT] = {0};
    const double KVb = (double)e->kv_pos_bytes; /* a position's k and v rows */
    for (int64_t l = 0; l < c->n_layer; l++) {
        const kiln_llama_layer *L = &e->m->layers[l];
        bytes[P_QKV] += (double)(L->wq->nbytes + L->wk->nbytes + L->wv->nbytes + (L->w_attn_gate ? L->w_attn_gate->nbytes : 0));
        bytes[P_WO] += (double)L->wo->nbytes;
        bytes[P_FFN_UP] += (double)(L->w_gate->nbytes + L->w_up->nbytes);
        bytes[P_DOWN] += (double)L->w_down->nbytes;
        int64_t seen = pos0 + 1;
        if (L->window && L->window < seen) seen = L->window;
        bytes[P_ATTN] += KVb * (double)seen;
    }
    bytes[P_HEAD] = (double)e->m->output->nbytes;
    int n = 0;
    for (int i = 0; i < P_COUNT; i++) {
        if (ms[i] <= 0) continue;
        ops[n].name = prof_names[i];
        ops[n].ms = ms[i];
        ops[n].bytes = bytes[i];
        n++;
    }
    *n_ops = n;
    return KILN_OK;
}

extern "C" kiln_status kiln_cuda_copy_bandwidth(double *gb_per_s) {
    const size_t n = (size_t)1 << 30; /* 1 GiB each way: far past the 60 MB L2 */
    void *a = NULL, *b = NULL;
    cudaEvent_t t0 = NULL, t1 = NULL;
    kiln_status st = KILN_OK;
    float best = 1e30f;
    if (cudaMalloc(&a, n) != cudaSuccess || cudaMalloc(&b, n) != cudaSuccess || cudaEventCreate(&t0) != cudaSuccess ||
        cudaEventCreate(&t1) != cudaSuccess)
        st = kiln_fail(KILN_ERR_NOMEM, "gpu: no memory for the copy-bandwidth measurement");
    else {
        cudaMemset(a, 1, n);
        for (int r = 0; r < 6; r++) {
            cudaEventRecord(t0);
            cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice);
            cudaEventRecord(t1);
            cudaEventSynchronize(t1);
            float ms = 0;
            cudaEventElapsedTime(&ms, t0, t1);
            if (r > 0 && ms < best) best = ms;
        }
        *gb_per_s = 2.0 * (double)n / (best * 1e-3) / 1e9; /* bytes read plus bytes written */
    }
    if (t0) cudaEventDestroy(t0);
    if (t1) cudaEventDestroy(t1);
    cudaFree(a);
    cudaFree(b);
    return st;
}
