/* gemm.cu: prefill matmuls (T > 8 tokens) on the tensor cores, y (T, O) = x (T, I) W^T (+ y when add).
 * A batch of tokens is compute-bound, so no fused quantized kernel is needed: the weight is dequantized to bf16
 * into ws->w (one thread per 8 elements, one 16-byte store each; BF16 weights are used in place), x is rounded
 * to bf16 into ws->x, and one cuBLASLt matmul multiplies them with fp32 accumulation and an f32 output, the
 * residual add folded in as beta = 1. The dequantization is bit-exact with the CPU oracle in f32 (the same
 * __fmul_rn/__fsub_rn order as dequant.cu) and then rounded to nearest even to bf16.
 * tests/test_cuda_gemm.c checks kiln_cuda_dequantize_bf16 bit for bit and kiln_cuda_gemm against a double
 * reference on every type (NMSE < 2e-4: both operands carry bf16's 2^-9 relative rounding). */
#include "cuda/gemm_dq.cuh"
#include "cuda/kernels.h"
#include "quants.h"

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "status.h"

/* cuBLASLt's workspace: 32 MiB is what NVIDIA recommends for Hopper (split-K and stream-K reductions). */
#define GEMM_LT_WS_BYTES ((size_t)32 << 20)
/* gemm_small.cu's split partials: 4 splits of 32 rows of 16384 floats (a split is only taken below 2 CTAs per SM). */
#define GEMM_PART_BYTES ((size_t)8 << 20)
/* Cached matmul plans. A prefill touches about 7 weight shapes (q, k, v, o, gate, up, down, the head) at one T,
 * plus the last, shorter chunk; 32 holds them all, replaced round-robin beyond that. */
#define GEMM_PLANS 32

/* ---------------------------------------------------------------- dequantization to bf16
 * Thread g makes elements 8g .. 8g+7 of the flat weight (rows * cols, rows contiguous) and stores them as one
 * uint4, so a warp writes 512 contiguous bytes. The block formats hold a multiple of 32 elements per block, so a
 * thread's 8 never straddle a block (4 threads per 32-block, 32 threads = one warp per 256-element super-block)
 * and never a sub-block's scale. Block headers are read with byte loads (the blocks are 18 to 210 bytes, only
 * 2-byte aligned); neighbouring threads hit the same L1 lines, so DRAM traffic is the weight once plus the
 * bf16 output (2 bytes per element), which dominates. The decoders are gemm_dq.cuh's. */

static __device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    return (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(lo)) |
           (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(hi)) << 16;
}

static __device__ __forceinline__ uint4 pack_bf16x8(const float v[8]) {
    return make_uint4(pack_bf16x2(v[0], v[1]), pack_bf16x2(v[2], v[3]), pack_bf16x2(v[4], v[5]), pack_bf16x2(v[6], v[7]));
}

/* out (n8 * 8) bf16 = the block-format weight w; 16-byte aligned out (ws->w is cudaMalloc'd). */
template <typename Dq>
__global__ void blocks_to_bf16(const void *w, uint4 *out, int64_t n8) {
    int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= n8) return;
    float v[8];
    Dq::run(w, g, v);
    out[g] = pack_bf16x8(v);
}

static __device__ __forceinline__ float src_to_f32(float x) { return x; }
static __device__ __forceinline__ float src_to_f32(kiln_fp16 x) { return h2f(x); }

/* out (n) bf16 = x (n) f32 or f16, rounded to nearest even: x's conversion and the F32/F16 weights. Thread g does
 * elements 8g .. 8g+7; with vec (both pointers 16-byte aligned) as 16-byte loads and one 16-byte store, else (a
 * misaligned pointer, or the last 1..7 elements) one at a time. */
template <typename Src>
__global__ void float_to_bf16(const Src *x, uint16_t *out, int64_t n, bool vec) {
    int64_t base = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (base >= n) return;
    if (vec && base + 8 <= n) {
        float v[8];
        if (sizeof(Src) == 4) {
            float4 a = ((const float4 *)(x + base))[0], b = ((const float4 *)(x + base))[1];
            v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
        } else {
            uint4 a = *(const uint4 *)(x + base);
            uint32_t u[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
            for (int i = 0; i < 4; i++) {
                v[2 * i] = h2f((kiln_fp16)(u[i] & 0xFFFF));
                v[2 * i + 1] = h2f((kiln_fp16)(u[i] >> 16));
            }
        }
        *(uint4 *)(out + base) = pack_bf16x8(v);
    } else {
        int64_t end = base + 8 < n ? base + 8 : n;
        for (int64_t i = base; i < end; i++) out[i] = __bfloat16_as_ushort(__float2bfloat16_rn(src_to_f32(x[i])));
    }
}

static kiln_status cuda_error(cudaError_t e, const char *what) {
    return kiln_fail(KILN_ERR_IO, "CUDA %s failed: %s", what, cudaGetErrorString(e));
}

static bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

static kiln_status launch_check(const char *what) {
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? KILN_OK : cuda_error(e, what);
}

/* n elements of f32/f16 to bf16. */
template <typename Src>
static kiln_status launch_float_to_bf16(const Src *x, void *out, int64_t n, cudaStream_t s) {
    const int threads = 256;
    int64_t grid = ((n + 7) / 8 + threads - 1) / threads;
    if (grid > INT32_MAX) return kiln_fail(KILN_ERR_INVALID, "cuda gemm: %lld elements is too many for one launch", (long long)n);
    float_to_bf16<Src><<<(unsigned)grid, threads, 0, s>>>(x, (uint16_t *)out, n, aligned16(x) && aligned16(out));
    return launch_check("float_to_bf16 launch");
}

static bool gemm_type_supported(kiln_type t) {
    switch (t) {
    case KILN_TYPE_F32: case KILN_TYPE_F16: case KILN_TYPE_BF16: case KILN_TYPE_Q4_0: case KILN_TYPE_Q4_1:
    case KILN_TYPE_Q5_0: case KILN_TYPE_Q8_0: case KILN_TYPE_Q4_K: case KILN_TYPE_Q5_K: case KILN_TYPE_Q6_K:
    case KILN_TYPE_Q5_1: case KILN_TYPE_Q2_K: case KILN_TYPE_Q3_K: case KILN_TYPE_IQ4_NL: case KILN_TYPE_IQ4_XS: return true;
    default: return false;
    }
}

/* The weight is used as one flat array of rows * cols elements, so its rows must be contiguous blocks. */
static kiln_status check_weight(const kiln_cuda_wt *W, const char *who) {
    const char *name = kiln_type_name(W->type) ? kiln_type_name(W->type) : "?";
    if (!gemm_type_supported(W->type))
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: weight type %s is not supported", who, name);
    int64_t blck = kiln_type_block_size(W->type);
    if (W->rows <= 0 || W->cols <= 0 || W->cols % blck)
        return kiln_fail(KILN_ERR_INVALID, "%s: %s weight of %lld x %lld: cols is not a whole number of %lld-blocks", who, name,
                         (long long)W->rows, (long long)W->cols, (long long)blck);
    if (W->row_bytes != kiln_type_row_bytes(W->type, W->cols))
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: %s weight with %zu-byte rows of %lld elements: padded rows are not supported",
                         who, name, W->row_bytes, (long long)W->cols);
    return KILN_OK;
}

/* out (rows * cols) bf16 = W dequantized; out 16-byte aligned. BF16 is a plain copy. */
static kiln_status weight_to_bf16(const kiln_cuda_wt *W, void *out, cudaStream_t s) {
    int64_t n = W->rows * W->cols;
    switch (W->type) {
    case KILN_TYPE_F32: return launch_float_to_bf16((const float *)W->data, out, n, s);
    case KILN_TYPE_F16: return launch_float_to_bf16((const kiln_fp16 *)W->data, out, n, s);
    case KILN_TYPE_BF16: {
        cudaError_t e = cudaMemcpyAsync(out, W->data, (size_t)n * 2, cudaMemcpyDeviceToDevice, s);
        return e == cudaSuccess ? KILN_OK : cuda_error(e, "cudaMemcpyAsync");
    }
    default: break;
    }
    if (!aligned16(out)) return kiln_fail(KILN_ERR_INVALID, "cuda dequantize bf16: output is not 16-byte aligned");
    const int threads = 256;
    int64_t n8 = n / 8; /* exact: the block formats hold 32 or 256 elements per block */
    int64_t grid = (n8 + threads - 1) / threads;
    if (grid > INT32_MAX) return kiln_fail(KILN_ERR_INVALID, "cuda dequantize bf16: %lld elements is too many for one launch", (long long)n);
    uint4 *o = (uint4 *)out;
    switch (W->type) {
    case KILN_TYPE_Q4_0: blocks_to_bf16<dq_q4_0><<<(unsigned)grid, threads, 0, s>>>(W->data, o, n8); break;
    case KILN_TYPE_Q4_1: blocks_to_bf16<dq_q4_1><<<(unsigned)grid, threads, 0, s>>>(W->data, o, n8); break;
    case KILN_TYPE_Q5_0: blocks_to_bf16<dq_q5_0><<<(unsigned)grid, threads, 0, s>>>(W->data, o, n8); break;
    case KILN_TYPE_Q8_0: blocks_to_bf16<dq_q8_0><<<(unsigned)grid, threads, 0, s>>>(W->data, o, n8); break;
    case KILN_TYPE_Q4_K: blocks_to_bf16<dq_q4_K><<<(unsigned)grid, threads, 0, s>>>(W->data, o, n8); break;
    case KILN_TYPE_Q5_K: blocks_to_bf16<dq_q5_K><<<(unsigned)grid, threads, 0, s>>>(W->data, o, n8); break;
    case KILN_TYPE_Q6_K: blocks_to_bf16<dq_q6_K><<<(unsigned)grid, threads, 0, s>>>(W->data, o, n8); break;
    case KILN_TYPE_Q5_1: blocks_to_bf16<dq_q5_1><<<(unsigned)grid, threads, 0, s>>>(W->data, o, n8); break;
    case KILN_TYPE_IQ4_NL: blocks_to_bf16<dq_iq4_nl><<<(unsigned)grid, threads, 0, s>>>(W->data, o, n8); break;
    case KILN_TYPE_Q2_K: blocks_to_bf16<dq_q2_K><<<(unsigned)grid, threads, 0, s>>>(W->data, o, n8); break;
    case KILN_TYPE_Q3_K: blocks_to_bf16<dq_q3_K><<<(unsigned)grid, threads, 0, s>>>(W->data, o, n8); break;
    case KILN_TYPE_IQ4_XS: blocks_to_bf16<dq_iq4_xs><<<(unsigned)grid, threads, 0, s>>>(W->data, o, n8); break;
    default: return kiln_fail(KILN_ERR_UNSUPPORTED, "cuda dequantize bf16: type %s is not supported", kiln_type_name(W->type));
    }
    return launch_check("dequantize bf16 launch");
}

extern "C" kiln_status kiln_cuda_dequantize_bf16(const kiln_cuda_wt *W, void *out, void *stream) {
    kiln_status st = check_weight(W, "cuda dequantize bf16");
    return st != KILN_OK ? st : weight_to_bf16(W, out, (cudaStream_t)stream);
}

/* ---------------------------------------------------------------- the cuBLASLt matmul
 * cuBLAS is column-major; kiln is row-major. A row-major (R, C) matrix with row stride C is, byte for byte, the
 * column-major (C, R) matrix with leading dimension C: its transpose. So
 *   y (T, O) row-major    = column-major D (O, T), ld O     — what we compute: D = A^T B
 *   W (O, I) row-major    = column-major A (I, O), ld I     — used with op T, so A^T is (O, I)
 *   x (T, I) row-major    = column-major B (I, T), ld I     — used with op N
 * D (O, T) = A^T (O, I) B (I, T): D[o, t] = sum_i W[o, i] x[t, i], i.e. y = x W^T. m = O, n = T, k = I, the
 * "TN" form, which is the one every Hopper bf16 kernel supports. C = D = y with beta = add ? 1 : 0: with beta 0
 * cuBLASLt does not read C, so y may hold anything (NaN) beforehand.
 *
 * Descriptors and layouts are host-only objects and cheap to make, but the heuristic query costs tens of
 * microseconds of host time, more than a small matmul takes on the GPU, so each (O, I, T, add, pointer
 * alignments) gets a plan built once and kept in the table hanging off ws->blas. The alignments are part of the
 * key because the heuristic is told the real ones (an in-place BF16 weight or a y that is a row offset into a
 * larger buffer may be aligned to less than cuBLASLt's assumed 256 bytes; telling it so excludes kernels that
 * would fault). The table is not thread-safe: one ws per stream. */

typedef struct gemm_plan {
    bool used;
    int64_t rows, cols, T;
    bool add;
    uint32_t align_a, align_b, align_c; /* bytes, powers of two up to 256 */
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c; /* c describes both C and D */
    cublasLtMatmulAlgo_t algo;
} gemm_plan;

typedef struct gemm_blas {
    cublasLtHandle_t lt;
    gemm_plan plan[GEMM_PLANS];
    int next; /* the slot the next new plan replaces once all are used */
} gemm_blas;

static kiln_status lt_error(cublasStatus_t s, const char *what) {
    return kiln_fail(KILN_ERR_IO, "cuBLASLt %s failed: %s", what, cublasLtGetStatusString(s));
}

/* The largest power of two (up to 256) dividing the address. */
static uint32_t ptr_align(const void *p) {
    uintptr_t a = (uintptr_t)p;
    a &= ~a + 1; /* lowest set bit */
    return a == 0 || a > 256 ? 256u : (uint32_t)a;
}

static void plan_destroy(gemm_plan *p) {
    if (p->op) cublasLtMatmulDescDestroy(p->op);
    if (p->a) cublasLtMatrixLayoutDestroy(p->a);
    if (p->b) cublasLtMatrixLayoutDestroy(p->b);
    if (p->c) cublasLtMatrixLayoutDestroy(p->c);
    memset(p, 0, sizeof *p);
}

/* Fills p (zeroed, key set) with descriptors and the heuristic's first algorithm for workspace ws_bytes. */
static kiln_status plan_build(gemm_plan *p, cublasLtHandle_t lt, size_t ws_bytes) {
    cublasStatus_t s;
    const cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
    if ((s = cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F)) != CUBLAS_STATUS_SUCCESS ||
        (s = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &op_t, sizeof op_t)) != CUBLAS_STATUS_SUCCESS ||
        (s = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof op_n)) != CUBLAS_STATUS_SUCCESS)
        return lt_error(s, "matmul descriptor");
    if ((s = cublasLtMatrixLayoutCreate(&p->a, CUDA_R_16BF, (uint64_t)p->cols, (uint64_t)p->rows, p->cols)) != CUBLAS_STATUS_SUCCESS ||
        (s = cublasLtMatrixLayoutCreate(&p->b, CUDA_R_16BF, (uint64_t)p->cols, (uint64_t)p->T, p->cols)) != CUBLAS_STATUS_SUCCESS ||
        (s = cublasLtMatrixLayoutCreate(&p->c, CUDA_R_32F, (uint64_t)p->rows, (uint64_t)p->T, p->rows)) != CUBLAS_STATUS_SUCCESS)
        return lt_error(s, "matrix layout");
    cublasLtMatmulPreference_t pref = NULL;
    uint64_t max_ws = ws_bytes;
    if ((s = cublasLtMatmulPreferenceCreate(&pref)) != CUBLAS_STATUS_SUCCESS) return lt_error(s, "matmul preference");
    cublasLtMatmulHeuristicResult_t res;
    int n = 0;
    if ((s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_ws, sizeof max_ws)) == CUBLAS_STATUS_SUCCESS &&
        (s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &p->align_a, 4)) == CUBLAS_STATUS_SUCCESS &&
        (s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &p->align_b, 4)) == CUBLAS_STATUS_SUCCESS &&
        (s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &p->align_c, 4)) == CUBLAS_STATUS_SUCCESS &&
        (s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &p->align_c, 4)) == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulAlgoGetHeuristic(lt, p->op, p->a, p->b, p->c, p->c, pref, 1, &res, &n);
    cublasLtMatmulPreferenceDestroy(pref);
    if (s != CUBLAS_STATUS_SUCCESS && s != CUBLAS_STATUS_NOT_SUPPORTED) return lt_error(s, "heuristic query");
    if (s != CUBLAS_STATUS_SUCCESS || n < 1 || res.state != CUBLAS_STATUS_SUCCESS)
        return kiln_fail(KILN_ERR_UNSUPPORTED,
                         "cuda gemm: cuBLASLt has no bf16 algorithm for y (%lld, %lld) = x (%lld, %lld) W^T (alignments A %u, B %u, "
                         "C/D %u bytes, %zu-byte workspace)",
                         (long long)p->T, (long long)p->rows, (long long)p->T, (long long)p->cols, p->align_a, p->align_b,
                         p->align_c, ws_bytes);
    p->algo = res.algo;
    return KILN_OK;
}

/* The cached plan for this key, building it (and evicting round-robin when full) on a miss. */
static kiln_status plan_get(gemm_blas *bl, size_t ws_bytes, int64_t rows, int64_t cols, int64_t T, bool add, uint32_t align_a,
                            uint32_t align_b, uint32_t align_c, gemm_plan **out) {
    int free_slot = -1;
    for (int i = 0; i < GEMM_PLANS; i++) {
        gemm_plan *p = &bl->plan[i];
        if (!p->used) {
            if (free_slot < 0) free_slot = i;
            continue;
        }
        if (p->rows == rows && p->cols == cols && p->T == T && p->add == add && p->align_a == align_a && p->align_b == align_b &&
            p->align_c == align_c) {
            *out = p;
            return KILN_OK;
        }
    }
    int slot = free_slot;
    if (slot < 0) {
        slot = bl->next;
        bl->next = (bl->next + 1) % GEMM_PLANS;
        plan_destroy(&bl->plan[slot]);
    }
    gemm_plan *p = &bl->plan[slot];
    p->rows = rows, p->cols = cols, p->T = T, p->add = add;
    p->align_a = align_a, p->align_b = align_b, p->align_c = align_c;
    kiln_status st = plan_build(p, bl->lt, ws_bytes);
    if (st != KILN_OK) {
        plan_destroy(p);
        return st;
    }
    p->used = true;
    *out = p;
    return KILN_OK;
}

extern "C" size_t kiln_cuda_gemm_ws_bytes(size_t max_w_elems, size_t max_x_elems) {
    const size_t fixed = GEMM_LT_WS_BYTES + GEMM_PART_BYTES;
    if (max_w_elems > (SIZE_MAX - fixed) / 4 || max_x_elems > (SIZE_MAX - fixed) / 4) return SIZE_MAX;
    return max_w_elems * 2 + max_x_elems * 2 + fixed;
}

extern "C" void kiln_cuda_gemm_ws_free(kiln_cuda_gemm_ws *ws) {
    if (!ws) return;
    gemm_blas *bl = (gemm_blas *)ws->blas;
    if (bl) {
        for (int i = 0; i < GEMM_PLANS; i++)
            if (bl->plan[i].used) plan_destroy(&bl->plan[i]);
        if (bl->lt) cublasLtDestroy(bl->lt);
        free(bl);
    }
    if (ws->w) cudaFree(ws->w);
    if (ws->x) cudaFree(ws->x);
    if (ws->lt_ws) cudaFree(ws->lt_ws);
    if (ws->part) cudaFree(ws->part);
    memset(ws, 0, sizeof *ws);
}

/* Device memory: exactly kiln_cuda_gemm_ws_bytes (w 2 * max_w_elems, x 2 * max_x_elems, 32 MiB for cuBLASLt, 8 MiB
 * for gemm_small's partials); the
 * cuBLASLt handle itself takes only host memory. max_w_elems may be 0 when every weight is BF16 (used in place). */
extern "C" kiln_status kiln_cuda_gemm_ws_new(kiln_cuda_gemm_ws *ws, size_t max_w_elems, size_t max_x_elems) {
    memset(ws, 0, sizeof *ws);
    if (kiln_cuda_gemm_ws_bytes(max_w_elems, max_x_elems) == SIZE_MAX)
        return kiln_fail(KILN_ERR_NOMEM, "cuda gemm workspace: %zu weight and %zu input elements overflow", max_w_elems, max_x_elems);
    gemm_blas *bl = (gemm_blas *)calloc(1, sizeof *bl);
    if (!bl) return kiln_fail(KILN_ERR_NOMEM, "cuda gemm workspace: out of host memory");
    ws->blas = bl;
    cublasStatus_t s = cublasLtCreate(&bl->lt);
    if (s != CUBLAS_STATUS_SUCCESS) {
        kiln_cuda_gemm_ws_free(ws);
        return lt_error(s, "cublasLtCreate");
    }
    struct { void **p; size_t bytes; const char *what; } bufs[] = {
        {&ws->w, max_w_elems * 2, "bf16 weight"},
        {&ws->x, max_x_elems * 2, "bf16 input"},
        {&ws->lt_ws, GEMM_LT_WS_BYTES, "cuBLASLt workspace"},
        {&ws->part, GEMM_PART_BYTES, "split partials"},
    };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        if (bufs[i].bytes == 0) continue;
        cudaError_t e = cudaMalloc(bufs[i].p, bufs[i].bytes);
        if (e != cudaSuccess) {
            *bufs[i].p = NULL;
            kiln_cuda_gemm_ws_free(ws);
            return kiln_fail(KILN_ERR_NOMEM, "cuda gemm workspace: cudaMalloc of %zu bytes for the %s failed: %s", bufs[i].bytes,
                             bufs[i].what, cudaGetErrorString(e));
        }
    }
    ws->w_bytes = max_w_elems * 2, ws->x_bytes = max_x_elems * 2, ws->lt_ws_bytes = GEMM_LT_WS_BYTES, ws->part_bytes = GEMM_PART_BYTES;
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&ws->n_sm, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
        ws->n_sm = 132;
    return KILN_OK;
}

/* Three launches on `stream`: the weight to bf16 (skipped for BF16), x to bf16, the cuBLASLt matmul. */
extern "C" kiln_status kiln_cuda_gemm(float *y, const float *x, const kiln_cuda_wt *W, int64_t T, bool add, kiln_cuda_gemm_ws *ws,
                                      void *stream) {
    kiln_status st = check_weight(W, "cuda gemm");
    if (st != KILN_OK) return st;
    gemm_blas *bl = (gemm_blas *)ws->blas;
    if (!bl) return kiln_fail(KILN_ERR_INVALID, "cuda gemm: the workspace was not made by kiln_cuda_gemm_ws_new");
    if (T < 1) return kiln_fail(KILN_ERR_INVALID, "cuda gemm: T = %lld tokens", (long long)T);
    const int64_t rows = W->rows, cols = W->cols;
    if ((uint64_t)T > (uint64_t)(ws->x_bytes / 2) / (uint64_t)cols)
        return kiln_fail(KILN_ERR_INVALID, "cuda gemm: input of %lld x %lld exceeds the workspace's %zu elements", (long long)T,
                         (long long)cols, ws->x_bytes / 2);
    const bool in_place = W->type == KILN_TYPE_BF16;
    if (!in_place && (uint64_t)rows > (uint64_t)(ws->w_bytes / 2) / (uint64_t)cols)
        return kiln_fail(KILN_ERR_INVALID, "cuda gemm: %s weight of %lld x %lld exceeds the workspace's %zu elements",
                         kiln_type_name(W->type), (long long)rows, (long long)cols, ws->w_bytes / 2);
    cudaStream_t s = (cudaStream_t)stream;

    const void *a = in_place ? W->data : ws->w; /* (O, I) bf16 */
    if (!in_place && (st = weight_to_bf16(W, ws->w, s)) != KILN_OK) return st;
    if ((st = launch_float_to_bf16(x, ws->x, T * cols, s)) != KILN_OK) return st; /* (T, I) bf16 */

    gemm_plan *p;
    if ((st = plan_get(bl, ws->lt_ws_bytes, rows, cols, T, add, ptr_align(a), ptr_align(ws->x), ptr_align(y), &p)) != KILN_OK)
        return st;
    const float alpha = 1.0f, beta = add ? 1.0f : 0.0f;
    cublasStatus_t cs = cublasLtMatmul(bl->lt, p->op, &alpha, a, p->a, ws->x, p->b, &beta, y, p->c, y, p->c, &p->algo, ws->lt_ws,
                                       ws->lt_ws_bytes, s);
    if (cs != CUBLAS_STATUS_SUCCESS)
        return kiln_fail(KILN_ERR_IO, "cuda gemm: cuBLASLt matmul y (%lld, %lld) = x W^T of %s failed: %s", (long long)T,
                         (long long)rows, kiln_type_name(W->type), cublasLtGetStatusString(cs));
    return KILN_OK;
}
