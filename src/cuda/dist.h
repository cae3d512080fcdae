/* dist.h: the NCCL seam of multi-GPU data-parallel training (issue #9), callable from C. One process per GPU;
 * the ranks meet through a 128-byte NCCL unique id that rank 0 makes and hands to the others (src/train/rendezvous.h
 * passes it through a file). Every collective enqueues on `stream` (a cudaStream_t) and returns at once; buffers
 * are device memory. Built with NCCL when the Makefile finds nccl.h beside CUDA (KILN_NCCL); without it every
 * function returns KILN_ERR_UNSUPPORTED with a message (dist_none.c). NVLink multicast (NVLS) is never used:
 * kiln_dist_init sets NCCL_NVLS_ENABLE=0 unless the environment already says otherwise, and creates no
 * multicast objects. tests/test_dist.c covers what runs without GPUs; tests/test_cuda_dist.c the collectives
 * (skips with fewer than 2 GPUs). */
#ifndef KILN_CUDA_DIST_H
#define KILN_CUDA_DIST_H

#include "kiln.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_DIST_ID_BYTES 128 /* sizeof(ncclUniqueId) */

typedef struct kiln_dist kiln_dist;

/* true when kiln was built with NCCL */
bool kiln_dist_available(void);
/* Rank 0's job: a fresh unique id (ncclGetUniqueId; it starts NCCL's bootstrap listener in this process, which must
 * stay alive until every rank has joined). */
kiln_status kiln_dist_new_id(uint8_t id[KILN_DIST_ID_BYTES]);
/* Joins the world of `world` ranks as `rank` on CUDA device `device` (cudaSetDevice, then ncclCommInitRank):
 * blocks until every rank has joined. KILN_ERR_INVALID for a bad rank/world/device, KILN_ERR_IO for an NCCL
 * failure (the message has NCCL's error string). */
kiln_status kiln_dist_init(const uint8_t id[KILN_DIST_ID_BYTES], int rank, int world, int device, kiln_dist **out);
/* Destroys the communicator (ncclCommDestroy). accepts NULL */
void kiln_dist_free(kiln_dist *d);
/* Aborts the communicator (ncclCommAbort): for a rank that fails, so its peers' collectives error out instead of
 * hanging; frees d. accepts NULL */
void kiln_dist_abort(kiln_dist *d);
int kiln_dist_rank(const kiln_dist *d);
int kiln_dist_world(const kiln_dist *d);

/* buf (n) f32 or f64: the sum over the ranks, in place. */
kiln_status kiln_dist_allreduce_f32(kiln_dist *d, float *buf, int64_t n, void *stream);
kiln_status kiln_dist_allreduce_f64(kiln_dist *d, double *buf, int64_t n, void *stream);
/* in (world * n) f32 -> out (n) f32: rank r gets the sum over ranks of in[r*n .. r*n + n). out may be in + r*n. */
kiln_status kiln_dist_reduce_scatter_f32(kiln_dist *d, const float *in, float *out, int64_t n, void *stream);
/* in (bytes) -> out (world * bytes): rank r's in lands at out + r*bytes. in may be out + r*bytes (in place). */
kiln_status kiln_dist_allgather(kiln_dist *d, const void *in, void *out, size_t bytes, void *stream);
/* buf (bytes) from rank `root` to every rank, in place. */
kiln_status kiln_dist_broadcast(kiln_dist *d, void *buf, size_t bytes, int root, void *stream);
/* buf (n) f32: the sum over the ranks, in place on rank `root` (the others' buf is left as it was). */
kiln_status kiln_dist_reduce_f32(kiln_dist *d, float *buf, int64_t n, int root, void *stream);
/* Collectives between group_begin and group_end (ncclGroupStart/End) are launched as one, when group_end is
 * called: the way to make a variable-sized reduce-scatter or all-gather out of reduces or broadcasts. */
kiln_status kiln_dist_group_begin(void);
kiln_status kiln_dist_group_end(void);
/* Any asynchronous NCCL error (ncclCommGetAsyncError) as a status, so a long wait can notice a dead peer. */
kiln_status kiln_dist_check(kiln_dist *d);

#ifdef __cplusplus
}
#endif
#endif
