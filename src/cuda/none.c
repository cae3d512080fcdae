/* none.c: the CUDA seam when kiln is built without nvcc: every entry point says so. */
#include "cuda/cuda.h"
#include "status.h"

#ifndef KILN_CUDA
int kiln_cuda_device_count(void) { return 0; }

static kiln_status no_cuda(void) { return kiln_fail(KILN_ERR_UNSUPPORTED, "kiln was built without CUDA (nvcc was not on the PATH)"); }

kiln_status kiln_cuda_device_describe(char *buf, size_t n) {
    if (n) buf[0] = 0;
    return no_cuda();
}
kiln_status kiln_cuda_dequantize(kiln_type t, const void *x, float *y, int64_t k, void *stream) { return no_cuda(); }
kiln_status kiln_cuda_dequantize_host(kiln_type t, const void *x, float *y, int64_t k) { return no_cuda(); }
#else
typedef int kiln_cuda_none_unused; /* ISO C wants a declaration in every translation unit */
#endif
