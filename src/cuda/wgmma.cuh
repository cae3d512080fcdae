/* wgmma.cuh: Hopper's warpgroup matrix multiply (wgmma.mma_async, sm_90a only) for the *_wg.cu kernels, over the
 * swizzled bf16 tiles of mma.cuh. A warpgroup is 4 consecutive warps (128 threads, the first a multiple of 4); one
 * wgmma m64n64k16 multiplies a 64 x 16 A by a 16 x 64 B into 64 x 64 f32 accumulators, 32 a thread. Warp w of the
 * group owns rows 16 w .. 16 w + 15, in the mma.sync m16n8 layout repeated over the 8 column tiles: d[j][e] is
 * (row 16 w + gr + 8 (e / 2), col 8 j + 2 tg + e % 2), lane = 4 gr + tg, so fa_softmax and the bf16 packing of
 * mma.cuh serve unchanged; an A fragment from registers is mma.sync's A fragment of the warp's 16 rows.
 *
 * B (and A from shared memory) is named by a descriptor (PTX ISA, "Matrix Descriptor Format"): the start address,
 * the leading and stride byte offsets and the swizzle. Every tile here has rows of 64 bf16 (128 bytes) stored by
 * mma.cuh's swz<64>: the 16-byte piece c of row r at piece c ^ (r % 8). From a 1024-byte-aligned base that is
 * exactly the 128-byte swizzle (address bits 4-6 xor bits 7-9), with 8-row groups 1024 bytes apart (the stride
 * byte offset; the leading one is unused at this width). Such a tile serves two ways:
 *   - K-major (a row holds 64 k values: K as B of S = Q K^T): k-step ks starts 32 ks bytes into the rows;
 *   - MN-major, transposed (a row holds 64 n values for one k: V as B of O = P V): k-step ks starts at row 16 ks.
 * Only tiles written by cp.async or ordinary stores reach the tensor cores here, so the writers fence the async
 * proxy (wg_fence_smem) before the barrier that publishes them. Accumulators written by ordinary instructions
 * (zeroed, rescaled) need wg_arrive before the next wgmma, and their reads after wg_wait are pinned behind it by
 * wg_pin (an empty asm that claims to write them), as CUTLASS's warpgroup_fence_operand does. */
#ifndef KILN_CUDA_WGMMA_CUH
#define KILN_CUDA_WGMMA_CUH

#include <stdint.h>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define KILN_WG_DEVICE 1 /* this compilation pass has wgmma */
#endif

/* The descriptor of a swz<64> tile (rows of 128 bytes, 1024-byte-aligned 8-row groups) read from addr. */
static __device__ __forceinline__ uint64_t wg_desc(uint32_t addr) {
    return (uint64_t)((addr & 0x3FFFFu) >> 4) | (uint64_t)1 << 16 | (uint64_t)(1024 >> 4) << 32 | (uint64_t)1 << 62;
}

#ifdef KILN_WG_DEVICE
static __device__ __forceinline__ void wg_arrive(void) { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
static __device__ __forceinline__ void wg_commit(void) { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N> static __device__ __forceinline__ void wg_wait(void) {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
static __device__ __forceinline__ void wg_fence_smem(void) { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

/* The 32 accumulators of an m64n64 f32 wgmma as asm operands %0 .. %31, and their register list. */
#define WG_D32(d)                                                                                                         \
    "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), \
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]),          \
        "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]),          \
        "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]),          \
        "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
#define WG_D32_REGS                                                                                                       \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, " \
    "%25, %26, %27, %28, %29, %30, %31}"

/* d (64 x 64) (+)= a (64 x 16, this warp's mma.sync A fragment) b (16 x 64 from the descriptor): TB 0 for a
 * K-major B, 1 for an MN-major one; acc 0 overwrites d. Only for fragments made in the same iteration (P, dS):
 * ptxas (CUDA 13.0) takes an A register as dead after the wgmma that reads it, and hands it to other values even
 * where a loop reads it again (seen on an H100, 2026-12-07: Q fragments loaded once were overwritten by P after
 * the first key tile). Operands that stay across iterations (Q, K, V) are read from shared memory by wg_ss. */
template <int TB>
static __device__ __forceinline__ void wg_rs(float d[8][4], const uint32_t a[4], uint64_t b, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %38, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                 WG_D32_REGS ", {%32, %33, %34, %35}, %36, p, 1, 1, %37;\n}\n"
                 : WG_D32(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TB), "r"(acc));
}

/* d (64 x 64) (+)= a (64 x 16) b (16 x 64), both from descriptors: TA 1 for an MN-major A (stored k-row by k-row),
 * TB as wg_rs. */
template <int TA, int TB>
static __device__ __forceinline__ void wg_ss(float d[8][4], uint64_t a, uint64_t b, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %36, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                 WG_D32_REGS ", %32, %33, p, 1, 1, %34, %35;\n}\n"
                 : WG_D32(d)
                 : "l"(a), "l"(b), "n"(TA), "n"(TB), "r"(acc));
}

/* Reads of d after wg_wait stay after it. */
static __device__ __forceinline__ void wg_pin(float d[8][4]) {
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) asm volatile("" : "+f"(d[j][e])::"memory");
}
#endif

#endif
