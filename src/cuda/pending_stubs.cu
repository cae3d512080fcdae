/* TEMPORARY (lead): weak stand-ins for launchers being written, so every build links meanwhile. */
#include "cuda/kernels.h"
extern "C" __attribute__((weak)) kiln_status kiln_cuda_attention_xp(float *out, void *xp, const float *q, const uint16_t *k_cache,
                                                                    const uint16_t *v_cache, const int32_t *d_pos0, int64_t T, int64_t NH,
                                                                    int64_t NKV, int64_t HS, int64_t window, int64_t rows,
                                                                    int64_t max_pos, float scale, void *ws, void *stream) {
    return KILN_ERR_UNSUPPORTED;
}
extern "C" __attribute__((weak)) kiln_status kiln_cuda_residual_norm_xp(float *x, const float *y, const float *post_w, float post_eps,
                                                                        float *out, void *xp, const float *w, float eps, int64_t T,
                                                                        int64_t C, void *stream) {
    return KILN_ERR_UNSUPPORTED;
}
