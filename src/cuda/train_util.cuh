/* train_util.cuh: small helpers the training kernels' files share (train_elementwise.cu, train_embed.cu): the
 * launch check, alignment, grid sizes for grid-stride and row kernels, and the f32 -> bf16 stores. */
#ifndef KILN_CUDA_TRAIN_UTIL_CUH
#define KILN_CUDA_TRAIN_UTIL_CUH

#include "cuda/launch.h"
#include "cuda/train_kernels.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

/* A kiln_launch's own error first, then any earlier asynchronous one (launch.h). */
static kiln_status checked(const char *what, cudaError_t e) { return kiln_launch_status(what, e); }

static bool aligned(const void *p, uintptr_t a) { return ((uintptr_t)p & (a - 1)) == 0; }

/* Grid-stride kernels: enough blocks of 256 to fill the H200 several times over (132 SMs x 8 blocks of 256, x4),
 * the rest by the stride. */
#define EW_THREADS 256
static unsigned ew_blocks(int64_t work) {
    const int64_t max_blocks = 132 * 8 * 4;
    int64_t b = (work + EW_THREADS - 1) / EW_THREADS;
    return (unsigned)(b < 1 ? 1 : b > max_blocks ? max_blocks : b);
}

/* Threads for a block that walks one row of `units` accesses: about 4 accesses per thread, whole warps, 32..1024. */
static int row_threads(int64_t units) {
    int64_t t = ((units + 3) / 4 + 31) / 32 * 32;
    return (int)(t < 32 ? 32 : t > 1024 ? 1024 : t);
}

/* f32 -> bf16 bits, round to nearest even (kiln_f32_to_bf16's rounding for every finite value). */
static __device__ __forceinline__ kiln_bf16_t bf16_bits(float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }

/* Four bf16 as one 8-byte store. */
static __device__ __forceinline__ void store_bf16x4(kiln_bf16_t *p, float a, float b, float c, float d) {
    uint2 u;
    u.x = (uint32_t)bf16_bits(a) | ((uint32_t)bf16_bits(b) << 16);
    u.y = (uint32_t)bf16_bits(c) | ((uint32_t)bf16_bits(d) << 16);
    *(uint2 *)p = u;
}

#endif
