/* none.c: the CUDA seam when kiln is built without nvcc: every entry point says so. */
#include "cuda/cuda.h"
#include "model/backend.h"
#include "status.h"

#ifndef KILN_CUDA
int kiln_cuda_device_count(void) { return 0; }

static kiln_status no_cuda(void) { return kiln_fail(KILN_ERR_UNSUPPORTED, "kiln was built without CUDA (nvcc was not on the PATH)"); }

kiln_status kiln_cuda_check_device(void) { return no_cuda(); }
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
/* The CUDA backend: sessions on the GPU fail at open. */
static kiln_status no_cuda_open(const kiln_model *m, const kiln_backend_params *p, void **ctx) {
    *ctx = NULL;
    return no_cuda();
}
static void no_cuda_close(void *ctx) {}
const kiln_backend kiln_cuda_backend = {.name = "cuda", .open = no_cuda_open, .close = no_cuda_close};
kiln_status kiln_cuda_copy_bandwidth(double *gb_per_s) {
    *gb_per_s = 0;
    return no_cuda();
}
kiln_status kiln_cuda_trainer_new(const struct kiln_llama_train *m, int64_t B, int64_t T, unsigned flags, struct kiln_dist *dist,
                                  kiln_cuda_trainer **out) {
    *out = NULL;
    return no_cuda();
}
void kiln_cuda_trainer_free(kiln_cuda_trainer *t) {}
size_t kiln_cuda_trainer_bytes(const kiln_cuda_trainer *t) { return 0; }
kiln_status kiln_cuda_trainer_step(kiln_cuda_trainer *t, const int32_t *inputs, const int32_t *targets, float grad_scale,
                                   double *loss_sum, int64_t *n_counted) {
    return no_cuda();
}
kiln_status kiln_cuda_trainer_zero_grads(kiln_cuda_trainer *t) { return no_cuda(); }
void kiln_cuda_trainer_reduce_next(kiln_cuda_trainer *t) {}
kiln_status kiln_cuda_trainer_agree(kiln_cuda_trainer *t, bool *flag) { return no_cuda(); }
kiln_status kiln_cuda_trainer_adamw(kiln_cuda_trainer *t, const struct kiln_adamw_cfg *cfg, float lr, double *grad_norm, bool *skipped) {
    return no_cuda();
}
kiln_status kiln_cuda_trainer_download(kiln_cuda_trainer *t, float *params, float *grads) { return no_cuda(); }
kiln_status kiln_cuda_set_device(int index) { return no_cuda(); }
kiln_status kiln_cuda_trainer_gather(kiln_cuda_trainer *t, kiln_cuda_train_part part) { return no_cuda(); }
kiln_status kiln_cuda_trainer_read(kiln_cuda_trainer *t, kiln_cuda_train_part part, int64_t first, int64_t n, void *dst) {
    return no_cuda();
}
kiln_status kiln_cuda_trainer_write(kiln_cuda_trainer *t, kiln_cuda_train_part part, int64_t first, int64_t n, const void *src) {
    return no_cuda();
}
kiln_status kiln_cuda_trainer_get_counters(kiln_cuda_trainer *t, int64_t *opt_step, int64_t *n_embed_skipped) { return no_cuda(); }
kiln_status kiln_cuda_trainer_set_counters(kiln_cuda_trainer *t, int64_t opt_step, int64_t n_embed_skipped) { return no_cuda(); }
#else
typedef int kiln_cuda_none_unused; /* ISO C wants a declaration in every translation unit */
#endif
