/* dist.cu: the NCCL seam of dist.h, one communicator per process and GPU. Compiled only when the Makefile finds
 * NCCL (KILN_NCCL); dist_none.c stands in otherwise. NVLink multicast stays off: NCCL_NVLS_ENABLE=0 is put in the
 * environment before NCCL's first call reads it, and nothing here creates multicast objects. Every failure comes
 * back with NCCL's error string and its last detailed message. tests/test_cuda_dist.c runs each collective on two
 * GPUs against values computed on the host. */
#include "cuda/dist.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <stdlib.h>
#include <string.h>

#include "status.h"

static_assert(sizeof(ncclUniqueId) == KILN_DIST_ID_BYTES, "dist.h's KILN_DIST_ID_BYTES must be sizeof(ncclUniqueId)");

struct kiln_dist {
    ncclComm_t comm;
    int rank, world, device;
};

/* NCCL reads its environment once, at its first call in the process: this must come before any. overwrite 0
 * leaves a value the user set. */
static void nvls_off(void) { setenv("NCCL_NVLS_ENABLE", "0", 0); }

static kiln_status nccl_check(ncclResult_t r, const char *what, ncclComm_t comm) {
    if (r == ncclSuccess) return KILN_OK;
    const char *detail = ncclGetLastError(comm);
    return kiln_fail(KILN_ERR_IO, "NCCL %s failed: %s%s%s", what, ncclGetErrorString(r), detail && *detail ? ": " : "",
                     detail ? detail : "");
}

extern "C" bool kiln_dist_available(void) { return true; }

extern "C" kiln_status kiln_dist_new_id(uint8_t id[KILN_DIST_ID_BYTES]) {
    nvls_off();
    ncclUniqueId u;
    kiln_status st = nccl_check(ncclGetUniqueId(&u), "ncclGetUniqueId", NULL);
    if (st) return st;
    memcpy(id, u.internal, KILN_DIST_ID_BYTES);
    return KILN_OK;
}

extern "C" kiln_status kiln_dist_init(const uint8_t id[KILN_DIST_ID_BYTES], int rank, int world, int device, kiln_dist **out) {
    *out = NULL;
    if (world < 1 || rank < 0 || rank >= world)
        return kiln_fail(KILN_ERR_INVALID, "dist: rank %d of a world of %d ranks", rank, world);
    nvls_off();
    int n_dev = 0;
    cudaError_t ce = cudaGetDeviceCount(&n_dev);
    if (ce != cudaSuccess) return kiln_fail(KILN_ERR_IO, "dist: rank %d: CUDA cudaGetDeviceCount failed: %s", rank, cudaGetErrorString(ce));
    if (device < 0 || device >= n_dev)
        return kiln_fail(KILN_ERR_INVALID, "dist: rank %d: CUDA device %d does not exist (%d devices)", rank, device, n_dev);
    ce = cudaSetDevice(device);
    if (ce != cudaSuccess)
        return kiln_fail(KILN_ERR_IO, "dist: rank %d: CUDA cudaSetDevice(%d) failed: %s", rank, device, cudaGetErrorString(ce));
    kiln_dist *d = (kiln_dist *)calloc(1, sizeof *d);
    if (!d) return kiln_fail(KILN_ERR_NOMEM, "dist: out of memory");
    ncclUniqueId u;
    memcpy(u.internal, id, KILN_DIST_ID_BYTES);
    ncclResult_t r = ncclCommInitRank(&d->comm, world, u, rank);
    if (r != ncclSuccess) {
        kiln_status st = nccl_check(r, "ncclCommInitRank", NULL);
        free(d);
        return st;
    }
    d->rank = rank, d->world = world, d->device = device;
    *out = d;
    return KILN_OK;
}

extern "C" void kiln_dist_free(kiln_dist *d) {
    if (!d) return;
    ncclCommDestroy(d->comm);
    free(d);
}

extern "C" void kiln_dist_abort(kiln_dist *d) {
    if (!d) return;
    ncclCommAbort(d->comm);
    free(d);
}

extern "C" int kiln_dist_rank(const kiln_dist *d) { return d->rank; }
extern "C" int kiln_dist_world(const kiln_dist *d) { return d->world; }

/* counts reach NCCL as size_t: a negative one is the caller's bug, named here rather than turned into 2^64. */
static kiln_status count_ok(const char *what, int64_t n) {
    return n >= 0 ? KILN_OK : kiln_fail(KILN_ERR_INVALID, "dist: %s of %lld elements", what, (long long)n);
}

extern "C" kiln_status kiln_dist_allreduce_f32(kiln_dist *d, float *buf, int64_t n, void *stream) {
    kiln_status st = count_ok("allreduce", n);
    if (st) return st;
    return nccl_check(ncclAllReduce(buf, buf, (size_t)n, ncclFloat32, ncclSum, d->comm, (cudaStream_t)stream), "ncclAllReduce (f32)",
                      d->comm);
}

extern "C" kiln_status kiln_dist_allreduce_f64(kiln_dist *d, double *buf, int64_t n, void *stream) {
    kiln_status st = count_ok("allreduce", n);
    if (st) return st;
    return nccl_check(ncclAllReduce(buf, buf, (size_t)n, ncclFloat64, ncclSum, d->comm, (cudaStream_t)stream), "ncclAllReduce (f64)",
                      d->comm);
}

extern "C" kiln_status kiln_dist_reduce_scatter_f32(kiln_dist *d, const float *in, float *out, int64_t n, void *stream) {
    kiln_status st = count_ok("reduce_scatter", n);
    if (st) return st;
    return nccl_check(ncclReduceScatter(in, out, (size_t)n, ncclFloat32, ncclSum, d->comm, (cudaStream_t)stream), "ncclReduceScatter",
                      d->comm);
}

extern "C" kiln_status kiln_dist_allgather(kiln_dist *d, const void *in, void *out, size_t bytes, void *stream) {
    return nccl_check(ncclAllGather(in, out, bytes, ncclUint8, d->comm, (cudaStream_t)stream), "ncclAllGather", d->comm);
}

extern "C" kiln_status kiln_dist_broadcast(kiln_dist *d, void *buf, size_t bytes, int root, void *stream) {
    if (root < 0 || root >= d->world) return kiln_fail(KILN_ERR_INVALID, "dist: broadcast from rank %d of %d", root, d->world);
    return nccl_check(ncclBroadcast(buf, buf, bytes, ncclUint8, root, d->comm, (cudaStream_t)stream), "ncclBroadcast", d->comm);
}

extern "C" kiln_status kiln_dist_reduce_f32(kiln_dist *d, float *buf, int64_t n, int root, void *stream) {
    kiln_status st = count_ok("reduce", n);
    if (st) return st;
    if (root < 0 || root >= d->world) return kiln_fail(KILN_ERR_INVALID, "dist: reduce to rank %d of %d", root, d->world);
    return nccl_check(ncclReduce(buf, buf, (size_t)n, ncclFloat32, ncclSum, root, d->comm, (cudaStream_t)stream), "ncclReduce", d->comm);
}

extern "C" kiln_status kiln_dist_group_begin(void) { return nccl_check(ncclGroupStart(), "ncclGroupStart", NULL); }
extern "C" kiln_status kiln_dist_group_end(void) { return nccl_check(ncclGroupEnd(), "ncclGroupEnd", NULL); }

extern "C" kiln_status kiln_dist_check(kiln_dist *d) {
    ncclResult_t async = ncclSuccess;
    kiln_status st = nccl_check(ncclCommGetAsyncError(d->comm, &async), "ncclCommGetAsyncError", d->comm);
    if (st) return st;
    /* ncclInProgress only means a non-blocking operation is still running: not an error */
    if (async == ncclSuccess || async == ncclInProgress) return KILN_OK;
    return kiln_fail(KILN_ERR_IO, "NCCL asynchronous error on rank %d of %d: %s", d->rank, d->world, ncclGetErrorString(async));
}
