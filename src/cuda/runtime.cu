/* runtime.cu: device memory for tests and tools, behind the C seam of cuda.h (plain cudaMalloc, never managed
 * memory: a program that over-asks for managed memory can hang the GPU). Every error comes back as a status with
 * CUDA's own message; tests/test_cuda*.c use these to move random inputs to the kernels and results back. */
#include "cuda/cuda.h"

#include <cuda_runtime.h>

#include "status.h"

static kiln_status check(cudaError_t e, const char *what) {
    return e == cudaSuccess ? KILN_OK : kiln_fail(KILN_ERR_IO, "CUDA %s failed: %s", what, cudaGetErrorString(e));
}

extern "C" kiln_status kiln_cuda_alloc(void **p, size_t bytes) {
    *p = NULL;
    cudaError_t e = cudaMalloc(p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        *p = NULL;
        return kiln_fail(KILN_ERR_NOMEM, "CUDA cudaMalloc of %zu bytes failed: %s", bytes, cudaGetErrorString(e));
    }
    return KILN_OK;
}

extern "C" void kiln_cuda_free(void *p) {
    if (p) cudaFree(p);
}

extern "C" kiln_status kiln_cuda_upload(void *dst, const void *h_src, size_t bytes) {
    return check(cudaMemcpy(dst, h_src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to device");
}

extern "C" kiln_status kiln_cuda_download(void *h_dst, const void *src, size_t bytes) {
    return check(cudaMemcpy(h_dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to host");
}

extern "C" kiln_status kiln_cuda_sync(void) {
    kiln_status st = check(cudaGetLastError(), "kernel launch");
    if (st) return st;
    return check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}
