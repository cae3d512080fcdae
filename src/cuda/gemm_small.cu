/* gemm_small.cu: the matmul of a few rows, y (T, O) (+)= x (T, I) W^T for 8 < T <= 32 (a server's decode step of
 * that many sequences), on the int8 tensor cores straight from the GGUF blocks, as llama.cpp's MMQ does. Such a
 * step is bound by reading the weight: cuBLASLt on the bf16 copies (gemm.cu) reads 2 bytes a weight, this kernel
 * the blocks' ~0.56 (Q4_K) once for all T tokens, and the matvecs (matvec.cu) run out of issue slots past 8 tokens.
 *
 * The input is matvec.cu's prepared form (kiln_cuda_matvec_prepare: int8 codes in blocks of 32 with {d, d * sum}),
 * so the result is the matvec's: the same int8 products, summed in another order. Each weight block type has a
 * decoder that turns a row's 256 weights (a K-quant super-block, or 8 legacy blocks of 32) into int8 words in the
 * mma fragment layout, with a float scale per 32 (or per 16, SPLIT) and, for the types with a min, a float offset
 * that multiplies the block's d * sum(q) of x:
 *   sum_k w_k x_k = s * dx * sum_k q_k xq_k + m * (dx * sum_k xq_k)      (w_k = s * q_k + m)
 *
 * Work split: a CTA of 8 warps owns 16 MT output rows (MT = 2, or 1 with KILN_GEMM_SMALL_MT=1); its warps take the
 * super-blocks of its column range in turn (warp w: w, w + 8, ...), each multiplying its MT 16-row tiles by the NT
 * tokens with
 * mma.sync m16n8k32 (s8 in, s32 out; the SPLIT types two m16n8k16, one per scale) and folding every 32 columns into
 * f32 accumulators with the scales above. The warps' sums meet in shared memory, summed in warp order. Lane (g, c)
 * of a warp holds, for rows g and g + 8 of a tile, the weights 4c..4c+3 and 16+4c..16+4c+3 of each 32, and of
 * token g of each 8 the same x codes (PTX's fragment layout for .s8); every load is the lane's own 4 bytes from
 * global memory (the quad of a row reads 16 contiguous bytes), cached in L1.
 *
 * Few output rows (a 2048-wide model's wq: 64 CTAs on 132 SMs) split the columns over up to GS_MAX_SPLIT CTAs,
 * each writing its partial sums to ws->part; a second kernel adds the partials in split order (and y, with add), so
 * the result does not depend on scheduling. tests/test_cuda_gemm.c checks every type it takes against the double
 * reference, and tests/cuda_host.cpp every weight its decoders make (gemm_small_dq.cuh). Types without a decoder
 * (Q5_1, Q2_K, Q3_K, the IQ types) take cuBLASLt (kiln_cuda_gemm_small_takes says which).
 *
 * The engine takes it for weights of at most 2^24 elements (engine.cu's GEMM_SMALL_MAX_ELEMS), where it is ahead of
 * cuBLASLt on the bf16 copies. Measured on the H200 (bench gpu-kernels, 7B shapes, T 16): it reads its 0.56 bytes
 * a weight at 19-27% of the copy bandwidth, cuBLASLt the bf16 copies' 2 bytes at 46-89%, so: Q4_K 4096 x 4096 11.7
 * us against 17.5, Q6_K 4096 x 4096 14.3 against 16.0, Q4_K down 23.3 against 30.4, but gate+up 60.8 against 60.1
 * and the Q6_K head 103 against 70. It is bound by latency, not by bytes or issue: a CTA's 8 warps are all an SM
 * holds at 143 to 255 registers a thread, and each warp waits on its own super-block's loads before it multiplies.
 * What it needs: the next super-block's loads in flight while the current one multiplies (cp.async into shared
 * memory, as llama.cpp's MMQ stages its tiles), and fewer registers per thread, so that more warps hide the
 * latency; T 17..32 (NT 32) also spills. */
#include "cuda/kernels.h"
#include "cuda/launch.h"
#include "cuda/gemm_small_dq.cuh"
#include "quants.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "status.h"

#define GS_WARPS 8
#define GS_THREADS (32 * GS_WARPS)
#define GS_SB 256 /* columns per decoder step */
#define GS_MAX_SPLIT 4

/* ---------------------------------------------------------------- the kernel */

static __device__ __forceinline__ void mma_k32(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                               uint32_t b1) {
    c[0] = c[1] = c[2] = c[3] = GQ_BIAS; /* the sums come out biased: gq_biased makes them floats */
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

static __device__ __forceinline__ void mma_k16(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t b0) {
    c[0] = c[1] = c[2] = c[3] = GQ_BIAS;
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};\n"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a0), "r"(a1), "r"(b0));
}

/* ---------------------------------------------------------------- the kernels' shared pieces */

/* Super-block sb of the warp's MT tiles (decoded in dq) times the NT tokens, into acc: per 32 columns the int8
 * products on the tensor cores, folded into f32 with the block scales (and offsets). */
template <class D, int NT, int MT>
static __device__ __forceinline__ void gs_multiply(float (&acc)[MT][NT / 8][4], const D (&dq)[MT][2], const int8_t *const (&xb)[NT / 8],
                                                   const float2 *const (&xs)[NT / 8][2], int64_t sb, int c) {
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const int64_t kb = sb * 8 + j;
        uint32_t alo[MT][2], ahi[MT][2];
        float s0[MT][2], s1[MT][2], mo[MT][2];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int r = 0; r < 2; r++) dq[mt][r].chunk(j, c, alo[mt][r], ahi[mt][r], s0[mt][r], s1[mt][r], mo[mt][r]);
#pragma unroll
        for (int nt = 0; nt < NT / 8; nt++) {
            const uint32_t b0 = *(const uint32_t *)(xb[nt] + 32 * kb), b1 = *(const uint32_t *)(xb[nt] + 32 * kb + 16);
            const float2 x0 = xs[nt][0][kb], x1 = xs[nt][1][kb];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                float *a = acc[mt][nt];
                if (D::SPLIT) {
                    int cl[4], ch[4];
                    mma_k16(cl, alo[mt][0], alo[mt][1], b0);
                    mma_k16(ch, ahi[mt][0], ahi[mt][1], b1);
                    a[0] += x0.x * (s0[mt][0] * gq_biased(cl[0]) + s1[mt][0] * gq_biased(ch[0]));
                    a[1] += x1.x * (s0[mt][0] * gq_biased(cl[1]) + s1[mt][0] * gq_biased(ch[1]));
                    a[2] += x0.x * (s0[mt][1] * gq_biased(cl[2]) + s1[mt][1] * gq_biased(ch[2]));
                    a[3] += x1.x * (s0[mt][1] * gq_biased(cl[3]) + s1[mt][1] * gq_biased(ch[3]));
                } else {
                    int ci[4];
                    mma_k32(ci, alo[mt][0], alo[mt][1], ahi[mt][0], ahi[mt][1], b0, b1);
                    a[0] += s0[mt][0] * (x0.x * gq_biased(ci[0]));
                    a[1] += s0[mt][0] * (x1.x * gq_biased(ci[1]));
                    a[2] += s0[mt][1] * (x0.x * gq_biased(ci[2]));
                    a[3] += s0[mt][1] * (x1.x * gq_biased(ci[3]));
                    if (D::OFFSET) {
                        a[0] += mo[mt][0] * x0.y, a[1] += mo[mt][0] * x1.y;
                        a[2] += mo[mt][1] * x0.y, a[3] += mo[mt][1] * x1.y;
                    }
                }
            }
        }
    }
}

/* The warps' sums (acc) meet in red, summed in warp order, and go to y (one split: adding when add) or to the split's
 * partials. Every thread of the CTA calls it. */
template <int NT, int MT>
static __device__ __forceinline__ void gs_reduce(float (*red)[16 * MT][NT + 1], const float (&acc)[MT][NT / 8][4], float *y, int64_t o0,
                                                 int64_t O, int T, bool add, int warp, int g, int c) {
    constexpr int GS_ROWS = 16 * MT;
    /* lane (g, c) holds rows g, g + 8 of each tile, tokens 2c, 2c + 1 of each 8 */
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NT / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) red[warp][16 * mt + g + (e >= 2 ? 8 : 0)][8 * nt + 2 * c + (e & 1)] = acc[mt][nt][e];
    __syncthreads();
    const bool direct = gridDim.y == 1;
    for (int i = threadIdx.x; i < GS_ROWS * NT; i += GS_THREADS) {
        const int t = i / GS_ROWS, r = i % GS_ROWS;
        const int64_t o = o0 + r;
        if (t >= T || o >= O) continue;
        float v = 0.0f;
#pragma unroll
        for (int k = 0; k < GS_WARPS; k++) v += red[k][r][t];
        if (direct) {
            float *p = y + (int64_t)t * O + o;
            *p = add ? *p + v : v;
        } else {
            y[((int64_t)blockIdx.y * T + t) * O + o] = v;
        }
    }
}

/* Grid (ceil(O / GS_ROWS), n_split). Split s takes the super-blocks [s * steps, (s + 1) * steps) of I / 256. With
 * one split the CTA writes y (adding when add), else its partials part (n_split, T, O). */
template <class D, int NT, int MT>
__global__ void __launch_bounds__(GS_THREADS, MT == 1 ? 2 : 1)
gemm_small_kernel(float *y, const int8_t *xq, const float2 *xds, const uint8_t *w, size_t row_bytes, int64_t O, int64_t I, int T,
                  int64_t steps, bool add) {
    kiln_pdl_wait();
    kiln_pdl_trigger();
    constexpr int GS_ROWS = 16 * MT;
    __shared__ float red[GS_WARPS][GS_ROWS][NT + 1];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
    const int64_t o0 = (int64_t)blockIdx.x * GS_ROWS, n_sb = I / GS_SB, nbx = I / 32;
    const int64_t s_lo = (int64_t)blockIdx.y * steps, s_hi = min(n_sb, s_lo + steps);

    const uint8_t *wr[MT][2]; /* [tile][row g, g + 8] */
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            int64_t o = o0 + 16 * mt + g + 8 * r;
            if (o >= O) o = O - 1; /* past the last row: a real row, never stored */
            wr[mt][r] = w + o * row_bytes;
        }
    /* token g of each tile of 8 (the B operand), tokens 2c, 2c + 1 (the accumulators): clamped to T - 1, never stored */
    const int8_t *xb[NT / 8];
    const float2 *xs[NT / 8][2];
#pragma unroll
    for (int nt = 0; nt < NT / 8; nt++) {
        xb[nt] = xq + (int64_t)min(8 * nt + g, T - 1) * I + 4 * c;
        xs[nt][0] = xds + (int64_t)min(8 * nt + 2 * c, T - 1) * nbx;
        xs[nt][1] = xds + (int64_t)min(8 * nt + 2 * c + 1, T - 1) * nbx;
    }

    float acc[MT][NT / 8][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NT / 8; nt++) acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.0f;

    for (int64_t sb = s_lo + warp; sb < s_hi; sb += GS_WARPS) {
        D dq[MT][2];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int r = 0; r < 2; r++) dq[mt][r].load(wr[mt][r] + sb * D::BLOCK_BYTES, c);
        gs_multiply<D, NT, MT>(acc, dq, xb, xs, sb, c);
    }

    gs_reduce<NT, MT>(red, acc, y, o0, O, T, add, warp, g, c);
}

/* ---------------------------------------------------------------- the pipelined kernel
 * gemm_small_kernel's work split and arithmetic, with the weights staged: each warp owns a ring of S stages in
 * shared memory, a stage the 16 MT rows' bytes of one super-block, and keeps the next S - 1 super-blocks' copies
 * in flight (cp.async, 16 bytes a copy) while it multiplies the current one from shared memory. A row's bytes are
 * copied from the 16-byte boundary at or before them (Q6_K's 210-byte super-blocks are only 2-byte aligned), so a
 * row's slot is the block rounded up to 16, plus 16 where the block is not a multiple of 16. */
static __device__ __forceinline__ void cp_async16(void *smem, const void *gmem) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(a), "l"(gmem));
}
static __device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> static __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

template <class D> struct gs_stage {
    static const int PAD = D::BLOCK_BYTES % 16 == 0 ? D::BLOCK_BYTES : (D::BLOCK_BYTES + 15) / 16 * 16 + 16;
};

/* The stages' bytes a CTA needs: its 8 warps' S stages of 16 MT rows, or the reduction's, whichever is more. */
template <class D, int NT, int MT, int S> static size_t gs_pipe_smem() {
    const size_t ring = (size_t)GS_WARPS * S * 16 * MT * gs_stage<D>::PAD, red = sizeof(float) * GS_WARPS * 16 * MT * (NT + 1);
    return ring > red ? ring : red;
}

/* Copies super-block sb of the warp's 16 MT rows (row pointers base[r]) into stage st: lane l takes copies l, l + 32, ... */
template <class D, int MT>
static __device__ __forceinline__ void gs_fill(uint8_t *st, const uint8_t *w, int64_t o0, int64_t O, size_t row_bytes, int64_t sb,
                                               int lane) {
    constexpr int PAD = gs_stage<D>::PAD, NCH = PAD / 16, ROWS = 16 * MT;
    for (int i = lane; i < ROWS * NCH; i += 32) {
        const int r = i / NCH, ch = i % NCH;
        const int64_t o = o0 + r < O ? o0 + r : O - 1;
        const uintptr_t src = (uintptr_t)(w + o * row_bytes + sb * D::BLOCK_BYTES), lo = src & ~(uintptr_t)15;
        const uintptr_t hi = (src + D::BLOCK_BYTES + 15) & ~(uintptr_t)15;
        if (lo + 16 * (uintptr_t)ch < hi) cp_async16(st + r * PAD + 16 * ch, (const void *)(lo + 16 * (uintptr_t)ch));
    }
}

template <class D, int NT, int MT, int S>
__global__ void __launch_bounds__(GS_THREADS, 1)
gemm_small_pipe_kernel(float *y, const int8_t *xq, const float2 *xds, const uint8_t *w, size_t row_bytes, int64_t O, int64_t I, int T,
                       int64_t steps, bool add) {
    kiln_pdl_wait();
    kiln_pdl_trigger();
    constexpr int GS_ROWS = 16 * MT, PAD = gs_stage<D>::PAD;
    extern __shared__ __align__(16) uint8_t gs_smem[];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
    const int64_t o0 = (int64_t)blockIdx.x * GS_ROWS, n_sb = I / GS_SB, nbx = I / 32;
    const int64_t s_lo = (int64_t)blockIdx.y * steps, s_hi = min(n_sb, s_lo + steps);
    uint8_t *ring = gs_smem + (size_t)warp * S * GS_ROWS * PAD;

    /* this lane's rows within a stage, and where their bytes start past the 16-byte boundary (per super-block when
     * the block is not a multiple of 16) */
    const uint8_t *wr[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            int64_t o = o0 + 16 * mt + g + 8 * r;
            if (o >= O) o = O - 1;
            wr[mt][r] = w + o * row_bytes;
        }
    const int8_t *xb[NT / 8];
    const float2 *xs[NT / 8][2];
#pragma unroll
    for (int nt = 0; nt < NT / 8; nt++) {
        xb[nt] = xq + (int64_t)min(8 * nt + g, T - 1) * I + 4 * c;
        xs[nt][0] = xds + (int64_t)min(8 * nt + 2 * c, T - 1) * nbx;
        xs[nt][1] = xds + (int64_t)min(8 * nt + 2 * c + 1, T - 1) * nbx;
    }
    float acc[MT][NT / 8][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NT / 8; nt++) acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.0f;

    /* the warp's super-blocks: s_lo + warp + 8 i; the first S - 1 in flight before the loop (a group each, empty
     * past the end, so that wait_group counts stay exact) */
#pragma unroll
    for (int i = 0; i < S - 1; i++) {
        const int64_t sb = s_lo + warp + (int64_t)GS_WARPS * i;
        if (sb < s_hi) gs_fill<D, MT>(ring + (size_t)i * GS_ROWS * PAD, w, o0, O, row_bytes, sb, lane);
        cp_async_commit();
    }
    int64_t it = 0;
    for (int64_t sb = s_lo + warp; sb < s_hi; sb += GS_WARPS, it++) {
        {
            const int64_t nsb = sb + (int64_t)GS_WARPS * (S - 1);
            if (nsb < s_hi) gs_fill<D, MT>(ring + (size_t)((it + S - 1) % S) * GS_ROWS * PAD, w, o0, O, row_bytes, nsb, lane);
            cp_async_commit();
        }
        cp_async_wait<S - 1>(); /* this lane's copies of stage it are done; the warp's after the sync */
        __syncwarp();
        const uint8_t *st = ring + (size_t)(it % S) * GS_ROWS * PAD;
        D dq[MT][2];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const uintptr_t src = (uintptr_t)(wr[mt][r] + sb * D::BLOCK_BYTES);
                dq[mt][r].load(st + (16 * mt + g + 8 * r) * PAD + (src & 15), c);
            }
        __syncwarp(); /* every lane has its words before the stage is refilled */
        gs_multiply<D, NT, MT>(acc, dq, xb, xs, sb, c);
    }
    cp_async_wait<0>();
    __syncthreads(); /* the ring becomes the reduction's */
    gs_reduce<NT, MT>((float(*)[GS_ROWS][NT + 1])gs_smem, acc, y, o0, O, T, add, warp, g, c);
}

/* y (n = T * O) = (add ? y : 0) + the n_split partials, in split order. */
__global__ void gemm_small_sum(float *y, const float *part, int64_t n, int n_split, bool add) {
    kiln_pdl_wait();
    kiln_pdl_trigger();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float s = add ? y[i] : 0.0f;
        for (int k = 0; k < n_split; k++) s += part[(int64_t)k * n + i];
        y[i] = s;
    }
}

/* ---------------------------------------------------------------- launchers */

template <class F> static kiln_status by_type(kiln_type t, F f) {
    switch (t) {
    case KILN_TYPE_Q4_0: return f.template run<gq_q4_0>();
    case KILN_TYPE_Q4_1: return f.template run<gq_q4_1>();
    case KILN_TYPE_Q5_0: return f.template run<gq_q5_0>();
    case KILN_TYPE_Q8_0: return f.template run<gq_q8_0>();
    case KILN_TYPE_Q4_K: return f.template run<gq_q4_K>();
    case KILN_TYPE_Q5_K: return f.template run<gq_q5_K>();
    case KILN_TYPE_Q6_K: return f.template run<gq_q6_K>();
    default: return KILN_ERR_UNSUPPORTED;
    }
}

static bool small_type(kiln_type t) {
    return t == KILN_TYPE_Q4_0 || t == KILN_TYPE_Q4_1 || t == KILN_TYPE_Q5_0 || t == KILN_TYPE_Q8_0 || t == KILN_TYPE_Q4_K ||
           t == KILN_TYPE_Q5_K || t == KILN_TYPE_Q6_K;
}

extern "C" bool kiln_cuda_gemm_small_takes(const kiln_cuda_wt *W, int64_t T) {
    return small_type(W->type) && T > 0 && T <= KILN_CUDA_GEMM_SMALL_MAX_T && W->cols % GS_SB == 0 && W->rows > 0 &&
           W->row_bytes == kiln_type_row_bytes(W->type, W->cols);
}

struct launch_fn {
    float *out;
    int mt;
    const int8_t *xq;
    const float2 *xds;
    const kiln_cuda_wt *W;
    int T, n_split;
    int64_t steps;
    bool add, pipe;
    cudaStream_t s;
    /* the pipelined kernel with S stages, as many as ~200 KB of shared memory holds (2..4) */
    template <class D, int NT> kiln_status run_pipe(const dim3 &grid) const {
        constexpr int PAD = gs_stage<D>::PAD, S4 = 200 * 1024 / (GS_WARPS * 32 * PAD), S = S4 > 4 ? 4 : S4 < 2 ? 2 : S4;
        void (*k)(float *, const int8_t *, const float2 *, const uint8_t *, size_t, int64_t, int64_t, int, int64_t, bool) =
            gemm_small_pipe_kernel<D, NT, 2, S>;
        const size_t smem = gs_pipe_smem<D, NT, 2, S>();
        static bool attr[64]; /* once per instantiation and device */
        int dev = 0;
        if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) dev = 0;
        if (!attr[dev]) {
            cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
            if (e != cudaSuccess) return kiln_launch_status("gemm_small (shared memory)", e);
            attr[dev] = true;
        }
        cudaError_t e = kiln_launch(k, grid, dim3(GS_THREADS), smem, s, out, xq, xds, (const uint8_t *)W->data, W->row_bytes, W->rows,
                                    W->cols, T, steps, add);
        return kiln_launch_status("gemm_small", e);
    }
    template <class D> kiln_status run() const {
        const int rows = 16 * mt;
        const dim3 grid((unsigned)((W->rows + rows - 1) / rows), (unsigned)n_split);
        if (pipe && mt == 2) return T <= 16 ? run_pipe<D, 16>(grid) : run_pipe<D, 32>(grid);
        const uint8_t *w = (const uint8_t *)W->data;
        void (*k)(float *, const int8_t *, const float2 *, const uint8_t *, size_t, int64_t, int64_t, int, int64_t, bool) =
            T <= 16 ? (mt == 1 ? gemm_small_kernel<D, 16, 1> : gemm_small_kernel<D, 16, 2>)
                    : (mt == 1 ? gemm_small_kernel<D, 32, 1> : gemm_small_kernel<D, 32, 2>);
        cudaError_t e = kiln_launch(k, grid, dim3(GS_THREADS), 0, s, out, xq, xds, w, W->row_bytes, W->rows, W->cols, T, steps, add);
        return kiln_launch_status("gemm_small", e);
    }
};

/* Row tiles of 16 per warp (KILN_GEMM_SMALL_MT, 1 or 2, for measuring; default 2): 32 rows sharing each load of x,
 * or 16 rows per CTA with twice the CTAs, held to 128 registers for two CTAs per SM (which spills: on the H200,
 * bench gpu-kernels, 7B Q4_K gate+up at T 16 takes 80 us against 63 with 2). */
static int m_tiles(void) {
    const char *v = getenv("KILN_GEMM_SMALL_MT");
    return v && strcmp(v, "1") == 0 ? 1 : 2;
}

/* The pipelined kernel, or the one that loads each super-block before it multiplies it. Measured on the H200 (bench
 * gpu-kernels --few, 7B shapes, T 16): pipelined Q6_K 12.7 us against 14.4 (4096 x 4096), 29.0 against 33.1 (down),
 * 85.8 against 103.2 (the head), Q8_0 13.7 against 18.8; Q4_K even or behind (down 25.6 against 23.4). So the
 * default pipelines Q6_K and Q8_0, the types whose rows are widest; KILN_GEMM_SMALL_PIPE=1 / =0 forces either for
 * every type (test_cuda_gemm passes both ways). The staging did not make Q4_K bandwidth-bound: at 19-23% of the copy
 * bandwidth, with all of its loads in flight, it is held up by something else (the per-chunk loads of x from L2,
 * the decode's issue), not by the weights' latency alone. */
static bool pipelined(kiln_type t) {
    const char *v = getenv("KILN_GEMM_SMALL_PIPE");
    if (v && strcmp(v, "1") == 0) return true;
    if (v && strcmp(v, "0") == 0) return false;
    return t == KILN_TYPE_Q6_K || t == KILN_TYPE_Q8_0;
}

/* The most splits of the columns (KILN_GEMM_SMALL_SPLIT, 1..4, for measuring; default 4). */
static int max_split(void) {
    const char *v = getenv("KILN_GEMM_SMALL_SPLIT");
    const int n = v ? atoi(v) : GS_MAX_SPLIT;
    return n >= 1 && n <= GS_MAX_SPLIT ? n : GS_MAX_SPLIT;
}

extern "C" kiln_status kiln_cuda_gemm_small(float *y, const void *xp, const kiln_cuda_wt *W, int64_t T, bool add,
                                            kiln_cuda_gemm_ws *ws, void *stream) {
    if (!kiln_cuda_gemm_small_takes(W, T))
        return kiln_fail(KILN_ERR_UNSUPPORTED, "cuda gemm_small: %s weight of %lld x %lld at T %lld (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, "
                         "Q5_K or Q6_K, columns a multiple of %d, 1..%d rows)", kiln_type_name(W->type) ? kiln_type_name(W->type) : "?",
                         (long long)W->rows, (long long)W->cols, (long long)T, GS_SB, KILN_CUDA_GEMM_SMALL_MAX_T);
    if (!xp || ((uintptr_t)xp & 15) || !W->data || ((uintptr_t)W->data & 15) || (W->row_bytes & 1))
        return kiln_fail(KILN_ERR_INVALID, "cuda gemm_small: NULL or unaligned input or weight");
    cudaStream_t s = (cudaStream_t)stream;
    const int8_t *xq = (const int8_t *)xp;
    const float2 *xds = (const float2 *)(xq + T * W->cols);
    /* splits: when the rows make fewer CTAs than half the SMs, enough for two per SM, at most max_split(), each
     * with a super-block per warp, their partials within ws->part (on the H200 a 7B wq's 128 CTAs take 12.0 us
     * alone against 15.1 in two splits: the partials' pass costs more than the idle SMs) */
    const int mt = m_tiles();
    const int64_t ctas = (W->rows + 16 * mt - 1) / (16 * mt), n_sb = W->cols / GS_SB;
    int64_t n_split = 2 * ctas < ws->n_sm ? (2 * (int64_t)ws->n_sm + ctas - 1) / ctas : 1;
    if (n_split > max_split()) n_split = max_split();
    if (n_split > n_sb / GS_WARPS) n_split = n_sb / GS_WARPS;
    if (n_split < 1) n_split = 1;
    while (n_split > 1 && (uint64_t)n_split * (uint64_t)T * (uint64_t)W->rows * 4 > ws->part_bytes) n_split--;
    const int64_t steps = (n_sb + n_split - 1) / n_split;
    n_split = (n_sb + steps - 1) / steps; /* no split without a step */
    const launch_fn f = {n_split > 1 ? (float *)ws->part : y, mt, xq, xds, W, (int)T, (int)n_split, steps, add, pipelined(W->type), s};
    TRY(by_type(W->type, f));
    if (n_split == 1) return KILN_OK;
    const int64_t n = T * W->rows, blocks = (n + 255) / 256 < 4 * ws->n_sm ? (n + 255) / 256 : 4 * ws->n_sm;
    return kiln_launch_status("gemm_small sum", kiln_launch(gemm_small_sum, dim3((unsigned)blocks), dim3(256), 0, s, y,
                                                            (const float *)ws->part, n, (int)n_split, add));
}
