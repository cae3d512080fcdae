/* mma.cuh: the tensor-core pieces that the flash-attention kernels share (train_attention_tc.cu, the training
 * forward and backward; attention_tc.cu, the inference prefill): cp.async copies into shared memory, the swizzled
 * tile layout and its ldmatrix fragment loads, mma.sync.m16n8k16 in bf16 and f16, and the MUFU exp2.
 * Fragments (PTX ISA, "mma.m16n8k16"): lane = 4 gr + tg; an accumulator holds (row gr, cols 2 tg, 2 tg + 1) in
 * c0, c1 and (row gr + 8, same cols) in c2, c3, which is also the A layout. A tile stores the 16-byte piece c of
 * row r at piece c ^ (r & 7): the 8 rows an ldmatrix phase reads then hit 8 different 4-bank groups. */
#ifndef KILN_CUDA_MMA_CUH
#define KILN_CUDA_MMA_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#define LOG2E 1.4426950408889634f

static __device__ __forceinline__ uint32_t smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* 16 bytes global -> shared, zero-filled (nothing read) when !valid; src must still be a mapped address. */
static __device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
static __device__ __forceinline__ void cp_async4(uint32_t dst, const void *src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "r"(valid ? 4 : 0) : "memory");
}
static __device__ __forceinline__ void cp_async_commit(void) { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> static __device__ __forceinline__ void cp_async_wait(void) {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

static __device__ __forceinline__ void ldsm_x4(uint32_t r[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
static __device__ __forceinline__ void ldsm_x4_t(uint32_t r[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

/* c (16 x 8) += a (16 x 16) b (16 x 8), bf16 operands, f32 accumulators. */
static __device__ __forceinline__ void mma_bf16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* 2^x by the MUFU alone (ex2.approx.ftz: max relative error 2^-22, results below 2^-126 flushed to 0, -inf to 0);
 * exp2f adds 3 instructions of denormal scaling around it, which the softmax's probabilities (rounded to bf16, or
 * summed against l >= 1) never need. */
static __device__ __forceinline__ float exp2_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* Two floats to a bf16 pair, lo in the low half (the lower column), round to nearest even. */
static __device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

/* Byte offset of 16-byte piece c of row r in a swizzled tile of WD-wide bf16 rows (WD = HS, or BQ for the dS^T
 * tile). Rows of 32 (64 bytes, two a 128-byte bank line) xor the piece with (r / 2) % 4 instead: 8 consecutive
 * rows then still cover the 8 four-bank groups once. */
template <int WD> static __device__ __forceinline__ uint32_t swz(int r, int c) {
    static_assert(WD == 32 || WD % 64 == 0, "rows of 32 or a multiple of 64 bf16");
    if constexpr (WD == 32) return (uint32_t)(r * 64 + ((c ^ ((r >> 1) & 3)) << 4));
    else return (uint32_t)(r * WD * 2 + ((c ^ (r & 7)) << 4));
}

/* c (16 x 8) += a (16 x 16) b (16 x 8), f16 operands, f32 accumulators. */
static __device__ __forceinline__ void mma_f16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Two floats to an f16 pair, lo in the low half (the lower column), round to nearest even. */
static __device__ __forceinline__ uint32_t pack_f16(float lo, float hi) {
    uint32_t r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

/* A fragment (16 x 16 at rows m0, cols k0) of a swizzled row-major tile: matrices (rows +0, k +0), (+8, +0),
 * (+0, +8), (+8, +8), lane l giving the address of row l % 8 of matrix l / 8. */
template <int HS> static __device__ __forceinline__ void lda(uint32_t a[4], uint32_t tile, int m0, int k0) {
    const int l = threadIdx.x % 32;
    ldsm_x4(a, tile + swz<HS>(m0 + l % 8 + (l / 8 % 2) * 8, k0 / 8 + l / 16));
}
/* An A fragment (16 x 16 at rows m0, cols k0) of tile^T, from a tile stored (k, m) row-major, transposed by
 * ldmatrix: the same four matrices as lda, read at (k +0, m +0), (k +0, m +8), (k +8, m +0), (k +8, m +8). */
template <int WD> static __device__ __forceinline__ void lda_t(uint32_t a[4], uint32_t tile, int m0, int k0) {
    const int l = threadIdx.x % 32;
    ldsm_x4_t(a, tile + swz<WD>(k0 + (l / 16) * 8 + l % 8, m0 / 8 + l / 8 % 2));
}
/* B fragments of two n-tiles (n0, n0 + 8) at k0 from a tile stored (n, k) row-major (B = tile^T): matrices
 * (n +0, k +0), (n +0, k +8), (n +8, k +0), (n +8, k +8); b[0], b[1] for n0, b[2], b[3] for n0 + 8. */
template <int HS> static __device__ __forceinline__ void ldb(uint32_t b[4], uint32_t tile, int n0, int k0) {
    const int l = threadIdx.x % 32;
    ldsm_x4(b, tile + swz<HS>(n0 + l % 8 + (l / 16) * 8, k0 / 8 + l / 8 % 2));
}
/* B fragments of two n-tiles (n0, n0 + 8) at k0 from a tile stored (k, n) row-major (B = tile), transposed by
 * ldmatrix: matrices (k +0, n +0), (k +8, n +0), (k +0, n +8), (k +8, n +8). */
template <int HS> static __device__ __forceinline__ void ldb_t(uint32_t b[4], uint32_t tile, int k0, int n0) {
    const int l = threadIdx.x % 32;
    ldsm_x4_t(b, tile + swz<HS>(k0 + l % 8 + (l / 8 % 2) * 8, n0 / 8 + l / 16));
}

#endif
