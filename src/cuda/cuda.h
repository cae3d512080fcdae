/* cuda.h: the C seam of kiln's CUDA backend (the .cu files of src/cuda, compiled by nvcc for sm_90 + PTX).
 * Built without nvcc, none.c supplies the same functions answering KILN_ERR_UNSUPPORTED, so callers and
 * tests need no #ifdefs. Kernels are checked against the scalar CPU reference by tests/test_cuda.c,
 * which skips with a reason on a machine without a GPU. */
#ifndef KILN_CUDA_H
#define KILN_CUDA_H

#include "kiln.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Usable CUDA devices: 0 when built without CUDA, without a driver, or without a GPU. */
int kiln_cuda_device_count(void);
/* "NVIDIA H200, sm_90, 139.8 GiB" into buf. */
kiln_status kiln_cuda_device_describe(char *buf, size_t n);
/* Dequantizes k elements of type t (a whole number of blocks) on the GPU. x and y are device pointers;
 * stream is a cudaStream_t or NULL for the default stream. Results equal the CPU scalar reference bit for bit. */
kiln_status kiln_cuda_dequantize(kiln_type t, const void *x, float *y, int64_t k, void *stream);
/* The same from and to host memory, through temporary device buffers (for tests and tools). */
kiln_status kiln_cuda_dequantize_host(kiln_type t, const void *x, float *y, int64_t k);

/* Device memory for tests and tools (runtime.cu): plain cudaMalloc, never managed memory. kiln_cuda_free
 * accepts NULL. upload/download are synchronous; sync waits for the default stream and returns any kernel's
 * error. */
kiln_status kiln_cuda_alloc(void **p, size_t bytes);
void kiln_cuda_free(void *p);
kiln_status kiln_cuda_upload(void *dst, const void *h_src, size_t bytes);
kiln_status kiln_cuda_download(void *h_dst, const void *src, size_t bytes);
kiln_status kiln_cuda_sync(void);

/* ---------------------------------------------------------------- the engine (engine.cu)
 * A model on GPU 0: the weights uploaded once in their block formats, an f16 KV cache of rows[l] positions per
 * layer (position p in row p % rows[l], as the CPU session lays it out), one chunk's activations, and the
 * single-token step captured as a CUDA graph. kiln_session_new makes one when asked for the GPU; the memory it
 * needs is checked against the free VRAM before anything is allocated (KILN_ERR_NOMEM naming both). */
typedef struct kiln_cuda_engine kiln_cuda_engine;

kiln_status kiln_cuda_engine_new(const kiln_model *m, int64_t n_ctx, int64_t n_batch, const int64_t *rows,
                                 kiln_cuda_engine **out);
void kiln_cuda_engine_free(kiln_cuda_engine *e); /* accepts NULL */
/* Runs T <= n_batch validated tokens at positions pos0..pos0+T-1. logits (host), when not NULL, gets the last
 * row's V logits, or all T rows when all_logits; next, when not NULL, gets the last row's argmax (greedy decode
 * reads back these 4 bytes alone). */
kiln_status kiln_cuda_engine_eval(kiln_cuda_engine *e, const int32_t *ids, int64_t T, int64_t pos0, float *logits,
                                  bool all_logits, int32_t *next);
/* Device bytes the engine holds (weights, cache, activations, workspaces). */
size_t kiln_cuda_engine_bytes(const kiln_cuda_engine *e);
/* The engine of a GPU session (session.c), NULL on the CPU: for the benchmark's per-op profile. */
kiln_cuda_engine *kiln_session_gpu_engine(kiln_session *s);

/* One op's share of a decode step (kiln_cuda_engine_profile). */
typedef struct kiln_cuda_op_time {
    const char *name; /* static */
    double ms;        /* per step, mean over the repetitions */
    double bytes;     /* device bytes the op must read per step: its weights, attention's KV positions; 0 if none */
} kiln_cuda_op_time;
#define KILN_CUDA_PROFILE_OPS 16
/* Times one decode step at position pos0 op by op (events between launches, outside the graph, so the sum
 * exceeds the graph's time by the launch gaps), averaged over reps. ops holds KILN_CUDA_PROFILE_OPS. The
 * step writes the cache row of pos0. */
kiln_status kiln_cuda_engine_profile(kiln_cuda_engine *e, int64_t pos0, int reps, kiln_cuda_op_time *ops, int *n_ops);
/* The device-to-device copy bandwidth, bytes read plus written per second / 1e9 (the decode roofline). */
kiln_status kiln_cuda_copy_bandwidth(double *gb_per_s);

#ifdef __cplusplus
}
#endif
#endif
