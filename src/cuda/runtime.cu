/* runtime.cu: device memory for tests and tools, behind the C seam of cuda.h (plain cudaMalloc, never managed
 * memory: a program that over-asks for managed memory can hang the GPU). Every error comes back as a status with
 * CUDA's own message; tests/test_cuda*.c use these to move random inputs to the kernels and results back. */
#include "cuda/cuda.h"

#include <cuda_runtime.h>

#include "status.h"

static kiln_status check(cudaError_t e, const char *what) {
    return e == cudaSuccess ? KILN_OK : kiln_fail(KILN_ERR_IO, "CUDA %s failed: %s", what, cudaGetErrorString(e));
}

#ifndef KILN_CUDA_ARCH
#error "KILN_CUDA_ARCH (the XX of the CUDA_ARCH=sm_XX the kernels are built for) comes from the Makefile"
#endif

/* Compute capability X.Y as the number XY, the form of KILN_CUDA_ARCH. The kernels are sm_XX SASS plus compute_XX
 * PTX, which the driver compiles for any later device, so every device of capability KILN_CUDA_ARCH or above runs
 * them; an older one would fail at the first launch with "no kernel image is available for execution". */
extern "C" kiln_status kiln_cuda_check_device(void) {
    if (kiln_cuda_device_count() == 0) return kiln_fail(KILN_ERR_UNSUPPORTED, "gpu: no CUDA device (or kiln was built without CUDA)");
    int dev = 0;
    cudaDeviceProp p;
    kiln_status st = check(cudaGetDevice(&dev), "cudaGetDevice");
    if (!st) st = check(cudaGetDeviceProperties(&p, dev), "cudaGetDeviceProperties");
    if (st) return st;
    const int cc = p.major * 10 + p.minor;
    if (cc < KILN_CUDA_ARCH)
        return kiln_fail(KILN_ERR_UNSUPPORTED,
                         "gpu: device %d is %s with compute capability %d.%d, but this kiln was built for sm_%d "
                         "(rebuild with make CUDA_ARCH=sm_%d)",
                         dev, p.name, p.major, p.minor, KILN_CUDA_ARCH, cc);
    return KILN_OK;
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
