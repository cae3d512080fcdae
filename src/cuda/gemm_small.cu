/* gemm_small.cu: the matmul of a few rows, y (T, O) (+)= x (T, I) W^T for 8 < T <= 32 (a server's decode step of
 * that many sequences), on the tensor cores straight from the GGUF blocks. Such a step is bound by reading the
 * weight: cuBLASLt on the bf16 copies (gemm.cu) reads 2 bytes a weight, this kernel the blocks' ~0.56 (Q4_K), and
 * the matvecs (matvec.cu) re-read their int8 activations for every row and run out of issue slots past 8 tokens.
 *
 * A CTA of 4 warps owns GS_BO = 64 output rows and a run of the columns in steps of GS_BK = 256 (a K-quant
 * super-block, 8 legacy blocks). Each step it dequantizes its 64 x 256 weights with gemm_dq.cuh's decoders (the
 * CPU oracle's floats, rounded to nearest even to bf16: exactly the values of the bf16 copies) into shared memory,
 * copies the NT x 256 bf16 inputs beside them (x is rounded to bf16 once per call, as gemm.cu does), and each warp
 * multiplies its 16 rows by the NT tokens with mma.sync m16n8k16 (bf16 in, f32 accumulators). Rows are padded to
 * 264 elements in shared memory so a fragment's 32 lanes hit 32 banks. So the result is the bf16 GEMM's up to the
 * order of the f32 sums.
 *
 * Few output rows (wq of 4096: 64 CTAs on 132 SMs) split the columns over up to GS_MAX_SPLIT CTAs, each writing
 * its partial sums to ws->part; a second kernel adds the partials in split order (and y, with add), so the result
 * does not depend on scheduling. tests/test_cuda_gemm.c checks every block type against the double reference.
 *
 * Not yet the engine's default (KILN_GEMM_SMALL=1 turns it on): on the H200, 7B Q4_K_M at 16 streams, kiln serve
 * makes 840 tok/s with it against 2085 with cuBLASLt on the bf16 copies (ITL p50 18.1 against 7.0 ms). The
 * dequantization is the limit: each thread decodes its 16 groups of 8 one after another, every one a chain of
 * dependent byte loads of the block's header and quants, with no loads in flight across steps. What it needs, as
 * llama.cpp's MMQ does: the block bytes staged into shared memory with cp.async a step ahead (double buffering),
 * decoded from there, and the int8 mma on the quants with the scales applied to the f32 sums. */
#include "cuda/gemm_dq.cuh"
#include "cuda/kernels.h"
#include "cuda/launch.h"
#include "cuda/train_kernels.h" /* kiln_cuda_to_bf16 */
#include "quants.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "status.h"

#define GS_BO 64            /* output rows per CTA: 4 warps of 16 */
#define GS_BK 256           /* columns per step */
#define GS_LD (GS_BK + 8)   /* a shared row in bf16: 528 bytes, so lane (g, c) of a fragment load hits bank 4g + c */
#define GS_THREADS 128
#define GS_MAX_SPLIT 4

static __device__ __forceinline__ uint32_t bf16x2(float lo, float hi) {
    return (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(lo)) | (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(hi)) << 16;
}

/* Grid (ceil(O / GS_BO), n_split). Split s takes the column steps [s * steps, (s + 1) * steps) of I / GS_BK. With one
 * split the CTA writes y (adding when add), else its partials part (n_split, T, O). */
template <class Dq, int NT>
__global__ void __launch_bounds__(GS_THREADS)
gemm_small_kernel(float *y, float *part, const uint16_t *xb /* (T, I) bf16 */, const void *w, int64_t O, int64_t I, int T,
                  int64_t steps, bool add) {
    kiln_pdl_wait();
    kiln_pdl_trigger();
    extern __shared__ __align__(16) uint16_t sm[];
    uint16_t *sw = sm;                 /* (GS_BO, GS_LD) the weight step */
    uint16_t *sx = sm + GS_BO * GS_LD; /* (NT, GS_LD) the input step */
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, c = lane % 4;
    const int64_t o0 = (int64_t)blockIdx.x * GS_BO, n_steps = I / GS_BK;
    const int64_t k_lo = (int64_t)blockIdx.y * steps, k_hi = min(n_steps, k_lo + steps);
    float acc[NT / 8][4];
#pragma unroll
    for (int n = 0; n < NT / 8; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;

    for (int64_t ks = k_lo; ks < k_hi; ks++) {
        const int64_t k0 = ks * GS_BK;
        /* 64 rows of 32 groups of 8: a warp decodes one row's 256 (a K-quant super-block) per pass */
#pragma unroll 4
        for (int i = tid; i < GS_BO * (GS_BK / 8); i += GS_THREADS) {
            const int r = i / (GS_BK / 8), j = i % (GS_BK / 8);
            const int64_t o = o0 + r < O ? o0 + r : O - 1; /* past the last row: a real row, never stored */
            float v[8];
            Dq::run(w, (o * I + k0) / 8 + j, v);
            *(uint4 *)(sw + r * GS_LD + j * 8) =
                make_uint4(bf16x2(v[0], v[1]), bf16x2(v[2], v[3]), bf16x2(v[4], v[5]), bf16x2(v[6], v[7]));
        }
        for (int i = tid; i < NT * (GS_BK / 8); i += GS_THREADS) {
            const int t = i / (GS_BK / 8), j = i % (GS_BK / 8);
            const uint4 u = t < T ? *(const uint4 *)(xb + (int64_t)t * I + k0 + j * 8) : make_uint4(0, 0, 0, 0);
            *(uint4 *)(sx + t * GS_LD + j * 8) = u;
        }
        __syncthreads();
        /* A: the warp's 16 weight rows (row-major); B: NT / 8 tiles of 8 tokens, each token's columns contiguous
         * (the "col" operand); lane (g, c) holds elements (g | g + 8, 2c, 2c + 1 | + 8) as PTX's m16n8k16 lays them */
        const uint16_t *aw = sw + warp * 16 * GS_LD;
#pragma unroll 4
        for (int kk = 0; kk < GS_BK; kk += 16) {
            const uint32_t a0 = *(const uint32_t *)(aw + g * GS_LD + kk + 2 * c);
            const uint32_t a1 = *(const uint32_t *)(aw + (g + 8) * GS_LD + kk + 2 * c);
            const uint32_t a2 = *(const uint32_t *)(aw + g * GS_LD + kk + 8 + 2 * c);
            const uint32_t a3 = *(const uint32_t *)(aw + (g + 8) * GS_LD + kk + 8 + 2 * c);
#pragma unroll
            for (int n = 0; n < NT / 8; n++) {
                const uint16_t *bx = sx + (n * 8 + g) * GS_LD + kk + 2 * c;
                const uint32_t b0 = *(const uint32_t *)bx, b1 = *(const uint32_t *)(bx + 8);
                asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                             "{%8, %9}, {%0, %1, %2, %3};\n"
                             : "+f"(acc[n][0]), "+f"(acc[n][1]), "+f"(acc[n][2]), "+f"(acc[n][3])
                             : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
            }
        }
        __syncthreads(); /* the next step overwrites sw and sx */
    }
    /* C: lane (g, c) holds rows g and g + 8 of the warp's 16, tokens 2c and 2c + 1 of each tile */
    const bool direct = gridDim.y == 1;
#pragma unroll
    for (int n = 0; n < NT / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int64_t o = o0 + warp * 16 + g + (e >= 2 ? 8 : 0);
            const int t = n * 8 + 2 * c + (e & 1);
            if (o >= O || t >= T) continue;
            if (direct) {
                float *p = y + (int64_t)t * O + o;
                *p = add ? *p + acc[n][e] : acc[n][e];
            } else {
                part[((int64_t)blockIdx.y * T + t) * O + o] = acc[n][e];
            }
        }
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

template <int NT> static size_t smem_bytes(void) { return (size_t)(GS_BO + NT) * GS_LD * 2; }

/* The decoders gemm.cu's dequantization uses, by type; calls f.template operator()<Dq>() for W's type. */
template <class F> static kiln_status by_type(kiln_type t, F f) {
    switch (t) {
    case KILN_TYPE_Q4_0: return f.template run<dq_q4_0>();
    case KILN_TYPE_Q4_1: return f.template run<dq_q4_1>();
    case KILN_TYPE_Q5_0: return f.template run<dq_q5_0>();
    case KILN_TYPE_Q5_1: return f.template run<dq_q5_1>();
    case KILN_TYPE_Q8_0: return f.template run<dq_q8_0>();
    case KILN_TYPE_Q2_K: return f.template run<dq_q2_K>();
    case KILN_TYPE_Q3_K: return f.template run<dq_q3_K>();
    case KILN_TYPE_Q4_K: return f.template run<dq_q4_K>();
    case KILN_TYPE_Q5_K: return f.template run<dq_q5_K>();
    case KILN_TYPE_Q6_K: return f.template run<dq_q6_K>();
    case KILN_TYPE_IQ4_NL: return f.template run<dq_iq4_nl>();
    case KILN_TYPE_IQ4_XS: return f.template run<dq_iq4_xs>();
    default: return KILN_ERR_UNSUPPORTED;
    }
}

static kiln_type const small_types[] = {KILN_TYPE_Q4_0, KILN_TYPE_Q4_1, KILN_TYPE_Q5_0, KILN_TYPE_Q5_1, KILN_TYPE_Q8_0, KILN_TYPE_Q2_K,
                                        KILN_TYPE_Q3_K, KILN_TYPE_Q4_K, KILN_TYPE_Q5_K, KILN_TYPE_Q6_K, KILN_TYPE_IQ4_NL, KILN_TYPE_IQ4_XS};

/* Raises each instance's dynamic shared memory limit past the default 48 KiB (NT 32 takes 49.5 KiB). */
struct setup_fn {
    template <class Dq> kiln_status run() const {
        if (cudaFuncSetAttribute(gemm_small_kernel<Dq, 16>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_bytes<16>()) !=
                cudaSuccess ||
            cudaFuncSetAttribute(gemm_small_kernel<Dq, 32>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_bytes<32>()) !=
                cudaSuccess)
            return kiln_fail(KILN_ERR_IO, "cuda gemm_small: setting the shared memory limit failed: %s", cudaGetErrorString(cudaGetLastError()));
        return KILN_OK;
    }
};

extern "C" kiln_status kiln_cuda_gemm_small_setup(void) {
    for (size_t i = 0; i < sizeof small_types / sizeof *small_types; i++) TRY(by_type(small_types[i], setup_fn{}));
    return KILN_OK;
}

extern "C" bool kiln_cuda_gemm_small_takes(const kiln_cuda_wt *W, int64_t T) {
    bool block = false;
    for (size_t i = 0; i < sizeof small_types / sizeof *small_types; i++) block = block || W->type == small_types[i];
    return block && T > 0 && T <= KILN_CUDA_GEMM_SMALL_MAX_T && W->cols % GS_BK == 0 && W->rows > 0 &&
           W->row_bytes == kiln_type_row_bytes(W->type, W->cols);
}

struct launch_fn {
    float *y, *part;
    const uint16_t *xb;
    const kiln_cuda_wt *W;
    int T, n_split;
    int64_t steps;
    bool add;
    cudaStream_t s;
    template <class Dq> kiln_status run() const {
        const dim3 grid((unsigned)((W->rows + GS_BO - 1) / GS_BO), (unsigned)n_split);
        float *out = n_split > 1 ? part : y;
        cudaError_t e = T <= 16 ? kiln_launch(gemm_small_kernel<Dq, 16>, grid, dim3(GS_THREADS), smem_bytes<16>(), s, out, part, xb,
                                              W->data, W->rows, W->cols, T, steps, add)
                                : kiln_launch(gemm_small_kernel<Dq, 32>, grid, dim3(GS_THREADS), smem_bytes<32>(), s, out, part, xb,
                                              W->data, W->rows, W->cols, T, steps, add);
        return kiln_launch_status("gemm_small", e);
    }
};

extern "C" kiln_status kiln_cuda_gemm_small(float *y, const float *x, const kiln_cuda_wt *W, int64_t T, bool add,
                                            kiln_cuda_gemm_ws *ws, void *stream) {
    if (!kiln_cuda_gemm_small_takes(W, T))
        return kiln_fail(KILN_ERR_UNSUPPORTED, "cuda gemm_small: %s weight of %lld x %lld at T %lld (block types, columns a multiple "
                         "of %d, 1..%d rows)", kiln_type_name(W->type) ? kiln_type_name(W->type) : "?", (long long)W->rows,
                         (long long)W->cols, (long long)T, GS_BK, KILN_CUDA_GEMM_SMALL_MAX_T);
    if ((uint64_t)T * (uint64_t)W->cols > ws->x_bytes / 2)
        return kiln_fail(KILN_ERR_INVALID, "cuda gemm_small: input of %lld x %lld exceeds the workspace's %zu elements", (long long)T,
                         (long long)W->cols, ws->x_bytes / 2);
    cudaStream_t s = (cudaStream_t)stream;
    TRY(kiln_cuda_to_bf16((kiln_bf16_t *)ws->x, x, T * W->cols, s));
    /* splits: enough CTAs for two per SM, at most GS_MAX_SPLIT, each with a step, their partials within ws->part */
    const int64_t ctas = (W->rows + GS_BO - 1) / GS_BO, n_steps = W->cols / GS_BK;
    int64_t n_split = (2 * (int64_t)ws->n_sm + ctas - 1) / ctas;
    if (n_split > GS_MAX_SPLIT) n_split = GS_MAX_SPLIT;
    if (n_split > n_steps) n_split = n_steps;
    while (n_split > 1 && (uint64_t)n_split * (uint64_t)T * (uint64_t)W->rows * 4 > ws->part_bytes) n_split--;
    const int64_t steps = (n_steps + n_split - 1) / n_split;
    n_split = (n_steps + steps - 1) / steps; /* no split without a step */
    const launch_fn f = {y, (float *)ws->part, (const uint16_t *)ws->x, W, (int)T, (int)n_split, steps, add, s};
    TRY(by_type(W->type, f));
    if (n_split == 1) return KILN_OK;
    const int64_t n = T * W->rows, blocks = (n + 255) / 256 < 4 * ws->n_sm ? (n + 255) / 256 : 4 * ws->n_sm;
    return kiln_launch_status("gemm_small sum", kiln_launch(gemm_small_sum, dim3((unsigned)blocks), dim3(256), 0, s, y,
                                                            (const float *)ws->part, n, (int)n_split, add));
}
