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

#ifdef __cplusplus
}
#endif
#endif
