/* dist_none.c: the NCCL seam (dist.h) when kiln is built without NCCL (no CUDA, or no nccl.h / libnccl.so beside
 * it): every entry point says so, and kiln_dist_available() is false so tests and the trainer can skip. */
#include "cuda/dist.h"
#include "status.h"

#ifndef KILN_NCCL
static kiln_status no_nccl(void) { return kiln_fail(KILN_ERR_UNSUPPORTED, "kiln was built without NCCL"); }

bool kiln_dist_available(void) { return false; }
kiln_status kiln_dist_new_id(uint8_t id[KILN_DIST_ID_BYTES]) { return no_nccl(); }
kiln_status kiln_dist_init(const uint8_t id[KILN_DIST_ID_BYTES], int rank, int world, int device, kiln_dist **out) {
    *out = NULL;
    return no_nccl();
}
void kiln_dist_free(kiln_dist *d) {}
void kiln_dist_abort(kiln_dist *d) {}
int kiln_dist_rank(const kiln_dist *d) { return 0; }
int kiln_dist_world(const kiln_dist *d) { return 1; }
kiln_status kiln_dist_allreduce_f32(kiln_dist *d, float *buf, int64_t n, void *stream) { return no_nccl(); }
kiln_status kiln_dist_allreduce_f64(kiln_dist *d, double *buf, int64_t n, void *stream) { return no_nccl(); }
kiln_status kiln_dist_reduce_scatter_f32(kiln_dist *d, const float *in, float *out, int64_t n, void *stream) { return no_nccl(); }
kiln_status kiln_dist_allgather(kiln_dist *d, const void *in, void *out, size_t bytes, void *stream) { return no_nccl(); }
kiln_status kiln_dist_broadcast(kiln_dist *d, void *buf, size_t bytes, int root, void *stream) { return no_nccl(); }
kiln_status kiln_dist_reduce_f32(kiln_dist *d, float *buf, int64_t n, int root, void *stream) { return no_nccl(); }
kiln_status kiln_dist_group_begin(void) { return no_nccl(); }
kiln_status kiln_dist_group_end(void) { return no_nccl(); }
kiln_status kiln_dist_check(kiln_dist *d) { return no_nccl(); }
#else
typedef int kiln_dist_none_unused; /* ISO C wants a declaration in every translation unit */
#endif
