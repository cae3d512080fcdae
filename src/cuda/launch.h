/* launch.h: how kiln's CUDA kernels are launched: with programmatic dependent launch (PDL, sm_90), so that in the
 * captured decode graph a kernel is scheduled while its predecessor drains instead of after it, hiding most of
 * the ~2 us launch latency that each of the ~350 kernels of a 7B decode step would otherwise pay.
 *
 * The contract, for every kernel launched through kiln_launch:
 *   - its first statement is kiln_pdl_wait(): nothing it reads or writes in global memory is touched before the
 *     previous kernel in the stream has completed and flushed (griddepcontrol.wait);
 *   - right after, kiln_pdl_trigger() lets the next kernel in the stream be scheduled (griddepcontrol
 *     .launch_dependents); it will itself wait for this one to complete before touching memory.
 * So the order of memory effects is exactly the plain stream order; only the scheduling overlaps. The one exception
 * is memory that no kernel ever writes: the matvecs (matvec.cu) load their first weight blocks before the wait, as
 * the model's weights are written only by copies from the host, which a PDL kernel never overlaps. Kernels launched
 * with <<<>>> (outside this contract) are still correct next to PDL ones: the attribute only relaxes the edge
 * into a PDL kernel, which waits. Built for sm_90 only (the Makefile's -gencode). */
#ifndef KILN_CUDA_LAUNCH_H
#define KILN_CUDA_LAUNCH_H

#include "kiln.h"

#include <cuda_runtime.h>

#include "status.h"

static __device__ __forceinline__ void kiln_pdl_wait(void) { asm volatile("griddepcontrol.wait;" ::: "memory"); }
static __device__ __forceinline__ void kiln_pdl_trigger(void) { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

/* kernel<<<grid, block, smem, stream>>>(args...) with the PDL attribute; returns the launch's error. */
template <typename... KArgs, typename... Args>
static inline cudaError_t kiln_launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                                      Args... args) {
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, kernel, ((KArgs)args)...);
}

/* A launch's status: its own error e first, then any earlier asynchronous one (cudaGetLastError). */
static inline kiln_status kiln_launch_status(const char *what, cudaError_t e) {
    if (e == cudaSuccess) e = cudaGetLastError();
    return e == cudaSuccess ? KILN_OK : kiln_fail(KILN_ERR_IO, "CUDA %s launch failed: %s", what, cudaGetErrorString(e));
}

#endif
