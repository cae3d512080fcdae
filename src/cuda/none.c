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
kiln_status kiln_cuda_alloc(void **p, size_t bytes) {
    *p = NULL;
    return no_cuda();
}
void kiln_cuda_free(void *p) {}
kiln_status kiln_cuda_upload(void *dst, const void *h_src, size_t bytes) { return no_cuda(); }
kiln_status kiln_cuda_download(void *h_dst, const void *src, size_t bytes) { return no_cuda(); }
kiln_status kiln_cuda_sync(void) { return no_cuda(); }
kiln_status kiln_cuda_engine_new(const kiln_model *m, int64_t n_ctx, int64_t n_batch, const int64_t *rows, kiln_cuda_engine **out) {
    *out = NULL;
    return no_cuda();
}
void kiln_cuda_engine_free(kiln_cuda_engine *e) {}
kiln_status kiln_cuda_engine_eval(kiln_cuda_engine *e, const int32_t *ids, int64_t T, int64_t pos0, float *logits, bool all_logits,
                                  int32_t *next) {
    return no_cuda();
}
size_t kiln_cuda_engine_bytes(const kiln_cuda_engine *e) { return 0; }
kiln_status kiln_cuda_engine_profile(kiln_cuda_engine *e, int64_t pos0, int reps, kiln_cuda_op_time *ops, int *n_ops) {
    *n_ops = 0;
    return no_cuda();
}
kiln_status kiln_cuda_copy_bandwidth(double *gb_per_s) {
    *gb_per_s = 0;
    return no_cuda();
}
#else
typedef int kiln_cuda_none_unused; /* ISO C wants a declaration in every translation unit */
#endif
