/* train_elementwise.cu: the CUDA training kernels between the matmuls (train_kernels.h's train_elementwise.cu
 * section): the embedding gather from the fp32 master table and its backward (atomic, and a deterministic
 * counting sort), the residual add + RMSNorm with its saved rstd and its backward, RoPE from the packed q|k|v
 * projection to bf16 and its inverse, SwiGLU and its backward, and the f32 -> bf16 rounding. All are memory-bound;
 * each makes one pass over its data (the RMSNorm backward's dw a second, deterministic one). The arithmetic repeats
 * the CPU oracle's float operations in its order with explicit round-to-nearest intrinsics (__fmul_rn, __fadd_rn,
 * ...) so nvcc cannot contract them into FMAs: the embedding and its deterministic backward are bit-exact with the
 * CPU, the norms differ only by the order of a double sum, RoPE and SwiGLU by the ulps between CUDA's
 * sincosf/expf and the host's libm, and a bf16 output then by at most one bf16 rounding. Every kernel is launched
 * with PDL (launch.h: kiln_pdl_wait first, then kiln_pdl_trigger).
 * tests/test_cuda_train_elementwise.c checks every launcher against kiln_cpu_ops (src/cpu/ops*.c). */
#include "cuda/launch.h"
#include "cuda/train_kernels.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>

extern "C" kiln_status kiln_fail(kiln_status s, const char *fmt, ...);

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

/* A block-wide sum in double, as elementwise.cu's: every thread gets the total; one barrier, so sh (32 doubles)
 * serves one call. Deterministic: a fixed tree over a fixed block size. blockDim.x a multiple of 32. */
static __device__ __forceinline__ double block_sum(double v, double *sh) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    double s = 0.0;
    for (int i = 0; i < nw; i++) s += sh[i];
    return s;
}

/* ---------------------------------------------------------------- embedding forward
 * One block per row, consecutive threads on consecutive float4 (or floats): a plain copy, bit-exact. */
template <bool VEC>
static __global__ void embed_forward_kernel(float *x /* (N, C) */, const float *table /* (V, C) */, const int32_t *ids /* (N) */,
                                     int64_t C) {
    kiln_pdl_wait();
    kiln_pdl_trigger();
    const int64_t n = blockIdx.x;
    const float *src = table + (int64_t)ids[n] * C; /* (C) */
    float *dst = x + n * C;                         /* (C) */
    if (VEC)
        for (int64_t i = threadIdx.x; i < C / 4; i += blockDim.x) ((float4 *)dst)[i] = ((const float4 *)src)[i];
    else
        for (int64_t i = threadIdx.x; i < C; i += blockDim.x) dst[i] = src[i];
}

extern "C" kiln_status kiln_cuda_embed_forward(float *x, const float *table, const int32_t *ids, int64_t N, int64_t C,
                                               void *stream) {
    if (N < 0 || C <= 0 || N > INT32_MAX)
        return kiln_fail(KILN_ERR_INVALID, "cuda embed_forward: N %lld, C %lld", (long long)N, (long long)C);
    if (N == 0) return KILN_OK;
    const bool vec = C % 4 == 0 && aligned(x, 16) && aligned(table, 16);
    const dim3 grid((unsigned)N), block(row_threads(vec ? C / 4 : C));
    cudaStream_t s = (cudaStream_t)stream;
    const cudaError_t e = vec ? kiln_launch(embed_forward_kernel<true>, grid, block, 0, s, x, table, ids, C)
                              : kiln_launch(embed_forward_kernel<false>, grid, block, 0, s, x, table, ids, C);
    return checked("embed_forward", e);
}

/* ---------------------------------------------------------------- embedding backward
 * Both versions first decide, per row of dx, whether it is finite (the CPU's embed_backward skips a row with any
 * NaN or inf whole and counts it): one block per row, __syncthreads_and over the row. */

static __device__ __forceinline__ bool row_finite(const float *row /* (C) */, int64_t C) {
    bool fin = true;
    for (int64_t i = threadIdx.x; i < C; i += blockDim.x) fin &= isfinite(row[i]);
    return __syncthreads_and(fin) != 0;
}

/* The atomic version: one block per row; a finite row is added element by element with atomicAdd (RED.ADD.F32 in
 * L2), so the order of rows sharing an id is whatever the hardware makes it. */
static __global__ void embed_backward_atomic_kernel(float *dtable /* (V, C) */, const float *dx /* (N, C) */,
                                             const int32_t *ids /* (N) */, int64_t C, int32_t *d_skipped /* (1) or NULL */) {
    kiln_pdl_wait();
    kiln_pdl_trigger();
    const int64_t n = blockIdx.x;
    const float *row = dx + n * C; /* (C) */
    if (!row_finite(row, C)) {
        if (threadIdx.x == 0 && d_skipped) atomicAdd(d_skipped, 1);
        return;
    }
    float *dst = dtable + (int64_t)ids[n] * C; /* (C) */
    for (int64_t i = threadIdx.x; i < C; i += blockDim.x) atomicAdd(dst + i, row[i]);
}

extern "C" kiln_status kiln_cuda_embed_backward(float *dtable, const float *dx, const int32_t *ids, int64_t N, int64_t C,
                                                int32_t *d_skipped, void *stream) {
    if (N < 0 || C <= 0 || N > INT32_MAX)
        return kiln_fail(KILN_ERR_INVALID, "cuda embed_backward: N %lld, C %lld", (long long)N, (long long)C);
    if (N == 0) return KILN_OK;
    const cudaError_t e = kiln_launch(embed_backward_atomic_kernel, dim3((unsigned)N), dim3(row_threads(C)), 0,
                                      (cudaStream_t)stream, dtable, dx, ids, C, d_skipped);
    return checked("embed_backward", e);
}

/* The deterministic version, a counting sort of the rows by id in ws, then one block per (id with rows, column
 * chunk) summing that id's rows in row order onto dtable's row:
 *   1 zero      count (V) = 0
 *   2 count     one block per row: flag (N) = the row is finite and its id in [0, V); count[id] += 1 (atomicAdd on
 *               integers: the histogram is order-free); a non-finite row adds 1 to *d_skipped
 *   3 scan      one block: the exclusive scan of count gives each id's bucket start offset (V) and a cursor (V)
 *               copy of it; the same scan of (count > 0) numbers the ids that have rows, uniq (N) lists them in id
 *               order, totals (2) = {ids with rows, rows counted}
 *   4 scatter   a thread per row: unsorted[atomicAdd(&cursor[id], 1)] = n, each bucket filled in arbitrary order
 *   5 order     a thread per bucketed row r: its rank among its bucket's rows is the number of them below r, and
 *               sorted[offset[id] + rank] = r: each bucket now lists its rows in increasing row order, whatever
 *               the order step 4 took (stable by construction; the row indexes are distinct)
 *   6 sum       block (k, chunk): id = uniq[k], acc = dtable[id][cols]; acc += dx[r][cols] for r in its bucket
 *               in order; blocks k >= totals[0] exit (the grid is sized for N ids, all that can have rows)
 * Why step 5 rather than a stable scatter: a stable scatter of N rows needs either a serial walk over the rows
 * (N / 32 dependent steps for one warp, ~0.5 ms at N = 64K) or a multi-pass radix sort; the rank costs c^2
 * compares per bucket of c rows spread over the whole GPU, which is small for a vocabulary's token counts (the
 * worst case, every row one id, is N^2 / 32 warp-compares: ~1M cycles at N = 64K, the serial walk's cost).
 * Step 6 adds in the CPU's order: dtable[id][i] += dx[r][i] for the id's finite rows r in row order (ops.c's
 * embed_backward_cols walks the rows in order the same way), so the result is the CPU's bits. Ids outside [0, V)
 * are ignored here (the CPU asserts on them); ws is never written out of bounds. */

/* ws layout, int32 throughout: count (V), offset (V), cursor (V), flag (N), unsorted (N), sorted (N), uniq (N),
 * totals (2). */
typedef struct {
    int32_t *count, *offset, *cursor, *flag, *unsorted, *sorted, *uniq, *totals;
} embed_det_ws;

static embed_det_ws embed_det_layout(void *ws, int64_t N, int64_t V) {
    int32_t *p = (int32_t *)ws;
    embed_det_ws w;
    w.count = p, p += V;
    w.offset = p, p += V;
    w.cursor = p, p += V;
    w.flag = p, p += N;
    w.unsorted = p, p += N;
    w.sorted = p, p += N;
    w.uniq = p, p += N;
    w.totals = p;
    return w;
}

extern "C" size_t kiln_cuda_embed_backward_det_ws_bytes(int64_t N, int64_t V) {
    if (N < 0 || V <= 0) return 0;
    return (size_t)(3 * V + 4 * N + 2) * sizeof(int32_t);
}

static __global__ void embed_det_zero_kernel(int32_t *count /* (V) */, int64_t V) {
    kiln_pdl_wait();
    kiln_pdl_trigger();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < V; i += (int64_t)gridDim.x * blockDim.x) count[i] = 0;
}

static __global__ void embed_det_count_kernel(int32_t *count /* (V) */, int32_t *flag /* (N) */, const float *dx /* (N, C) */,
                                       const int32_t *ids /* (N) */, int64_t C, int64_t V, int32_t *d_skipped /* (1) or NULL */) {
    kiln_pdl_wait();
    kiln_pdl_trigger();
    const int64_t n = blockIdx.x;
    const bool fin = row_finite(dx + n * C, C);
    if (threadIdx.x != 0) return;
    const int32_t id = ids[n];
    const bool take = fin && id >= 0 && id < V;
    flag[n] = take;
    if (take) atomicAdd(&count[id], 1);
    if (!fin && d_skipped) atomicAdd(d_skipped, 1);
}

/* The block's exclusive scan of v (blockDim.x a multiple of 32, at most 1024); *total gets the block's sum. sh
 * (32) is free again only after the caller's next barrier. */
static __device__ __forceinline__ unsigned long long block_exclusive_scan(unsigned long long v, unsigned long long *sh,
                                                                          unsigned long long *total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    unsigned long long x = v; /* the warp's inclusive scan */
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const unsigned long long y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    if (lane == 31) sh[warp] = x;
    __syncthreads();
    if (warp == 0) { /* the warp totals' inclusive scan, in place: each lane reads and writes only its own slot */
        unsigned long long t = lane < nw ? sh[lane] : 0ull;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const unsigned long long y = __shfl_up_sync(0xffffffffu, t, o);
            if (lane >= o) t += y;
        }
        if (lane < nw) sh[lane] = t;
    }
    __syncthreads();
    *total = sh[nw - 1];
    return (warp > 0 ? sh[warp - 1] : 0ull) + x - v;
}

/* One block of EMBED_SCAN_THREADS walks count in tiles of 4 ids per thread (4096 per tile: 32 tiles for a 128K
 * vocabulary). The two scans run as one on packed 64-bit values, (count << 32) | (count > 0): the low halves sum
 * to at most V < 2^31, so they never carry into the high ones. */
#define EMBED_SCAN_THREADS 1024
static __global__ void __launch_bounds__(EMBED_SCAN_THREADS)
    embed_det_scan_kernel(const int32_t *count /* (V) */, int32_t *offset /* (V) */, int32_t *cursor /* (V) */,
                          int32_t *uniq /* (N) */, int32_t *totals /* (2) */, int64_t V) {
    kiln_pdl_wait();
    kiln_pdl_trigger();
    __shared__ unsigned long long sh[32];
    unsigned long long carry = 0; /* the same in every thread: the sum of the tiles before */
    for (int64_t base = 0; base < V; base += 4 * (int64_t)blockDim.x) {
        const int64_t i0 = base + 4 * (int64_t)threadIdx.x;
        unsigned long long v[4], s = 0;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int32_t c = i0 + k < V ? count[i0 + k] : 0;
            v[k] = ((unsigned long long)(uint32_t)c << 32) | (c > 0 ? 1ull : 0ull);
            s += v[k];
        }
        unsigned long long tile_total;
        unsigned long long ex = carry + block_exclusive_scan(s, sh, &tile_total);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            if (i0 + k >= V) break;
            offset[i0 + k] = cursor[i0 + k] = (int32_t)(ex >> 32);
            if (v[k] & 1ull) uniq[(uint32_t)ex] = (int32_t)(i0 + k);
            ex += v[k];
        }
        carry += tile_total;
        __syncthreads(); /* sh is read by every thread above before the next tile's scan writes it */
    }
    if (threadIdx.x == 0) {
        totals[0] = (int32_t)(uint32_t)carry;  /* ids with rows */
        totals[1] = (int32_t)(carry >> 32);    /* rows counted */
    }
}

static __global__ void embed_det_scatter_kernel(int32_t *unsorted /* (N) */, int32_t *cursor /* (V) */, const int32_t *flag /* (N) */,
                                         const int32_t *ids /* (N) */, int64_t N) {
    kiln_pdl_wait();
    kiln_pdl_trigger();
    const int64_t n = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N || !flag[n]) return;
    unsorted[atomicAdd(&cursor[ids[n]], 1)] = (int32_t)n;
}

static __global__ void embed_det_order_kernel(int32_t *sorted /* (N) */, const int32_t *unsorted /* (N) */, const int32_t *ids /* (N) */,
                                       const int32_t *offset /* (V) */, const int32_t *count /* (V) */,
                                       const int32_t *totals /* (2) */) {
    kiln_pdl_wait();
    kiln_pdl_trigger();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= totals[1]) return;
    const int32_t r = unsorted[i], id = ids[r], s = offset[id], c = count[id];
    int32_t rank = 0;
#pragma unroll 4
    for (int32_t j = 0; j < c; j++) rank += unsorted[s + j] < r;
    sorted[s + rank] = r;
}

/* Block (k, y) sums the rows of the k-th id with rows over columns [y * 4 * blockDim.x, +4 * blockDim.x): float4
 * per thread when VEC, else four columns blockDim.x apart (consecutive threads on consecutive columns). */
#define EMBED_SUM_THREADS 256
template <bool VEC>
static __global__ void embed_det_sum_kernel(float *dtable /* (V, C) */, const float *dx /* (N, C) */, const int32_t *sorted /* (N) */,
                                     const int32_t *uniq /* (N) */, const int32_t *offset /* (V) */,
                                     const int32_t *count /* (V) */, const int32_t *totals /* (2) */, int64_t C) {
    kiln_pdl_wait();
    kiln_pdl_trigger();
    const int64_t k = blockIdx.x;
    if (k >= totals[0]) return;
    const int32_t id = uniq[k], s = offset[id], c = count[id];
    float *dst = dtable + (int64_t)id * C; /* (C) */
    const int64_t col0 = (int64_t)blockIdx.y * 4 * blockDim.x;
    if (VEC) {
        const int64_t col = col0 + 4 * (int64_t)threadIdx.x;
        if (col >= C) return;
        float4 acc = *(const float4 *)(dst + col);
        for (int32_t j = 0; j < c; j++) {
            const float4 g = *(const float4 *)(dx + (int64_t)sorted[s + j] * C + col);
            acc.x = __fadd_rn(acc.x, g.x), acc.y = __fadd_rn(acc.y, g.y);
            acc.z = __fadd_rn(acc.z, g.z), acc.w = __fadd_rn(acc.w, g.w);
        }
        *(float4 *)(dst + col) = acc;
    } else {
        float acc[4];
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const int64_t col = col0 + threadIdx.x + q * (int64_t)blockDim.x;
            acc[q] = col < C ? dst[col] : 0.0f;
        }
        for (int32_t j = 0; j < c; j++) {
            const float *g = dx + (int64_t)sorted[s + j] * C; /* (C) */
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const int64_t col = col0 + threadIdx.x + q * (int64_t)blockDim.x;
                if (col < C) acc[q] = __fadd_rn(acc[q], g[col]);
            }
        }
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const int64_t col = col0 + threadIdx.x + q * (int64_t)blockDim.x;
            if (col < C) dst[col] = acc[q];
        }
    }
}

extern "C" kiln_status kiln_cuda_embed_backward_det(float *dtable, const float *dx, const int32_t *ids, int64_t N, int64_t C,
                                                    int64_t V, int32_t *d_skipped, void *ws, void *stream) {
    if (N < 0 || C <= 0 || V <= 0 || N > INT32_MAX || V > INT32_MAX || (N > 0 && !ws))
        return kiln_fail(KILN_ERR_INVALID, "cuda embed_backward_det: N %lld, C %lld, V %lld, ws %s", (long long)N,
                         (long long)C, (long long)V, ws ? "given" : "NULL");
    if (N == 0) return KILN_OK;
    if ((C + 4 * EMBED_SUM_THREADS - 1) / (4 * EMBED_SUM_THREADS) > 65535)
        return kiln_fail(KILN_ERR_INVALID, "cuda embed_backward_det: C %lld is too wide", (long long)C);
    const embed_det_ws w = embed_det_layout(ws, N, V);
    cudaStream_t s = (cudaStream_t)stream;
    const unsigned row_blocks = (unsigned)((N + EW_THREADS - 1) / EW_THREADS);
    cudaError_t e = kiln_launch(embed_det_zero_kernel, dim3(ew_blocks(V)), dim3(EW_THREADS), 0, s, w.count, V);
    if (e == cudaSuccess)
        e = kiln_launch(embed_det_count_kernel, dim3((unsigned)N), dim3(row_threads(C)), 0, s, w.count, w.flag, dx, ids, C, V,
                        d_skipped);
    if (e == cudaSuccess)
        e = kiln_launch(embed_det_scan_kernel, dim3(1), dim3(EMBED_SCAN_THREADS), 0, s, (const int32_t *)w.count, w.offset,
                        w.cursor, w.uniq, w.totals, V);
    if (e == cudaSuccess)
        e = kiln_launch(embed_det_scatter_kernel, dim3(row_blocks), dim3(EW_THREADS), 0, s, w.unsorted, w.cursor,
                        (const int32_t *)w.flag, ids, N);
    if (e == cudaSuccess)
        e = kiln_launch(embed_det_order_kernel, dim3(row_blocks), dim3(EW_THREADS), 0, s, w.sorted,
                        (const int32_t *)w.unsorted, ids, (const int32_t *)w.offset, (const int32_t *)w.count,
                        (const int32_t *)w.totals);
    if (e == cudaSuccess) {
        const bool vec = C % 4 == 0 && aligned(dtable, 16) && aligned(dx, 16);
        const dim3 grid((unsigned)N, (unsigned)((C + 4 * EMBED_SUM_THREADS - 1) / (4 * EMBED_SUM_THREADS)));
        const int32_t *so = w.sorted, *un = w.uniq, *of = w.offset, *co = w.count, *to = w.totals;
        e = vec ? kiln_launch(embed_det_sum_kernel<true>, grid, dim3(EMBED_SUM_THREADS), 0, s, dtable, dx, so, un, of, co, to, C)
                : kiln_launch(embed_det_sum_kernel<false>, grid, dim3(EMBED_SUM_THREADS), 0, s, dtable, dx, so, un, of, co, to, C);
    }
    return checked("embed_backward_det", e);
}

/* ---------------------------------------------------------------- RMSNorm forward (train)
 * One block per row in two passes over it: x += y and the double sum of squares, then out = (x * rstd) * w in
 * bf16. Each thread rereads only the elements it wrote (visible to it, and in L1/L2: a row is at most 32 KiB).
 * ops_rmsnorm.c's order: float squares summed in double, the mean rounded to float, rstd = 1 / sqrtf(mean + eps)
 * in float. */

static __device__ __forceinline__ float rms_scale(double sumsq, int64_t C, float eps) {
    const float mean = (float)(sumsq / (double)C);
    return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, eps)));
}

template <bool VEC>
static __global__ void rmsnorm_forward_kernel(float *x /* (N, C) */, const float *y /* (N, C) or NULL */,
                                       kiln_bf16_t *out /* (N, C) */, float *rstd /* (N) */, const float *w /* (C) */,
                                       int64_t C, float eps) {
    kiln_pdl_wait();
    kiln_pdl_trigger();
    __shared__ double sh[32];
    const int64_t n = blockIdx.x;
    float *xr = x + n * C;                  /* (C) */
    const float *yr = y ? y + n * C : NULL; /* (C) */
    kiln_bf16_t *outr = out + n * C;        /* (C) */
    double ss = 0.0;
    if (VEC) {
        for (int64_t i = threadIdx.x; i < C / 4; i += blockDim.x) {
            float4 a = ((const float4 *)xr)[i];
            if (yr) {
                const float4 b = ((const float4 *)yr)[i];
                a.x = __fadd_rn(a.x, b.x), a.y = __fadd_rn(a.y, b.y), a.z = __fadd_rn(a.z, b.z), a.w = __fadd_rn(a.w, b.w);
                ((float4 *)xr)[i] = a;
            }
            ss += (double)__fmul_rn(a.x, a.x);
            ss += (double)__fmul_rn(a.y, a.y);
            ss += (double)__fmul_rn(a.z, a.z);
            ss += (double)__fmul_rn(a.w, a.w);
        }
    } else {
        for (int64_t i = threadIdx.x; i < C; i += blockDim.x) {
            float a = xr[i];
            if (yr) xr[i] = a = __fadd_rn(a, yr[i]);
            ss += (double)__fmul_rn(a, a);
        }
    }
    const float r = rms_scale(block_sum(ss, sh), C, eps);
    if (threadIdx.x == 0) rstd[n] = r;
    if (VEC) {
        for (int64_t i = threadIdx.x; i < C / 4; i += blockDim.x) {
            const float4 a = ((const float4 *)xr)[i], g = ((const float4 *)w)[i];
            store_bf16x4(outr + 4 * i, __fmul_rn(__fmul_rn(a.x, r), g.x), __fmul_rn(__fmul_rn(a.y, r), g.y),
                         __fmul_rn(__fmul_rn(a.z, r), g.z), __fmul_rn(__fmul_rn(a.w, r), g.w));
        }
    } else {
        for (int64_t i = threadIdx.x; i < C; i += blockDim.x) outr[i] = bf16_bits(__fmul_rn(__fmul_rn(xr[i], r), w[i]));
    }
}

extern "C" kiln_status kiln_cuda_rmsnorm_forward(float *x, const float *y, kiln_bf16_t *out, float *rstd, const float *w,
                                                 int64_t N, int64_t C, float eps, void *stream) {
    if (N < 0 || C <= 0 || N > INT32_MAX || !x || !out || !rstd || !w)
        return kiln_fail(KILN_ERR_INVALID, "cuda rmsnorm_forward: N %lld, C %lld", (long long)N, (long long)C);
    if (N == 0) return KILN_OK;
    const bool vec = C % 4 == 0 && aligned(x, 16) && aligned(y, 16) && aligned(w, 16) && aligned(out, 8);
    const dim3 grid((unsigned)N), block(row_threads(vec ? C / 4 : C));
    cudaStream_t s = (cudaStream_t)stream;
    const cudaError_t e = vec ? kiln_launch(rmsnorm_forward_kernel<true>, grid, block, 0, s, x, y, out, rstd, w, C, eps)
                              : kiln_launch(rmsnorm_forward_kernel<false>, grid, block, 0, s, x, y, out, rstd, w, C, eps);
    return checked("rmsnorm_forward", e);
}

/* ---------------------------------------------------------------- RMSNorm backward
 * ops_rmsnorm.c, with r = rstd and g = dout:
 *   dx += r * (g * w) - c * x,  c = (float)(sum(double(g * w) * x) / C * r * r * r)   (the sum in double)
 *   dw += (float) sum over rows of double(g * (x * r))
 * dx: one block per row (block_sum for c). dw: two stages through ws, so its sums have one fixed order for any
 * N: stage 1, block (column chunk, row chunk) sums its rows in row order per column into partial (chunks, C)
 * doubles; stage 2, a thread per column adds the chunks' partials in chunk order. */

#define RMS_DW_MIN_ROWS 64   /* rows per chunk at least: each thread's partial is a run of 64+ loads */
#define RMS_DW_MAX_CHUNKS 256 /* at most: ws = 256 * C doubles (16 MiB at C = 8192) */

static int64_t rms_dw_chunks(int64_t N) {
    int64_t c = (N + RMS_DW_MIN_ROWS - 1) / RMS_DW_MIN_ROWS;
    return c < 1 ? 1 : c > RMS_DW_MAX_CHUNKS ? RMS_DW_MAX_CHUNKS : c;
}

extern "C" size_t kiln_cuda_rmsnorm_backward_ws_bytes(int64_t N, int64_t C) {
    if (N <= 0 || C <= 0) return 0;
    return (size_t)rms_dw_chunks(N) * (size_t)C * sizeof(double);
}

template <bool VEC>
static __global__ void rmsnorm_backward_dx_kernel(float *dx /* (N, C) */, const float *dout /* (N, C) */, const float *x /* (N, C) */,
                                           const float *w /* (C) */, const float *rstd /* (N) */, int64_t C) {
    kiln_pdl_wait();
    kiln_pdl_trigger();
    __shared__ double sh[32];
    const int64_t n = blockIdx.x;
    const float *xr = x + n * C, *gr = dout + n * C; /* (C) each */
    float *dxr = dx + n * C;                         /* (C) */
    const float r = rstd[n];
    /* double(g * w) * double(x) is exact in double (24 x 24 bits), so only the sum's order can differ */
    double gwx = 0.0;
    if (VEC) {
        for (int64_t i = threadIdx.x; i < C / 4; i += blockDim.x) {
            const float4 g = ((const float4 *)gr)[i], ww = ((const float4 *)w)[i], a = ((const float4 *)xr)[i];
            gwx = __dadd_rn(gwx, __dmul_rn((double)__fmul_rn(g.x, ww.x), (double)a.x));
            gwx = __dadd_rn(gwx, __dmul_rn((double)__fmul_rn(g.y, ww.y), (double)a.y));
            gwx = __dadd_rn(gwx, __dmul_rn((double)__fmul_rn(g.z, ww.z), (double)a.z));
            gwx = __dadd_rn(gwx, __dmul_rn((double)__fmul_rn(g.w, ww.w), (double)a.w));
        }
    } else {
        for (int64_t i = threadIdx.x; i < C; i += blockDim.x)
            gwx = __dadd_rn(gwx, __dmul_rn((double)__fmul_rn(gr[i], w[i]), (double)xr[i]));
    }
    const double rd = (double)r;
    const float c = (float)__dmul_rn(__dmul_rn(__dmul_rn(__ddiv_rn(block_sum(gwx, sh), (double)C), rd), rd), rd);
    if (VEC) {
        for (int64_t i = threadIdx.x; i < C / 4; i += blockDim.x) {
            const float4 g = ((const float4 *)gr)[i], ww = ((const float4 *)w)[i], a = ((const float4 *)xr)[i];
            float4 d = ((float4 *)dxr)[i];
            d.x = __fadd_rn(d.x, __fsub_rn(__fmul_rn(r, __fmul_rn(g.x, ww.x)), __fmul_rn(c, a.x)));
            d.y = __fadd_rn(d.y, __fsub_rn(__fmul_rn(r, __fmul_rn(g.y, ww.y)), __fmul_rn(c, a.y)));
            d.z = __fadd_rn(d.z, __fsub_rn(__fmul_rn(r, __fmul_rn(g.z, ww.z)), __fmul_rn(c, a.z)));
            d.w = __fadd_rn(d.w, __fsub_rn(__fmul_rn(r, __fmul_rn(g.w, ww.w)), __fmul_rn(c, a.w)));
            ((float4 *)dxr)[i] = d;
        }
    } else {
        for (int64_t i = threadIdx.x; i < C; i += blockDim.x)
            dxr[i] = __fadd_rn(dxr[i], __fsub_rn(__fmul_rn(r, __fmul_rn(gr[i], w[i])), __fmul_rn(c, xr[i])));
    }
}

/* Stage 1: block (column chunk of blockDim.x, row chunk); consecutive threads on consecutive columns. */
static __global__ void rmsnorm_backward_dw_partial_kernel(double *partial /* (chunks, C) */, const float *dout /* (N, C) */,
                                                   const float *x /* (N, C) */, const float *rstd /* (N) */, int64_t N,
                                                   int64_t C, int64_t rows_per) {
    kiln_pdl_wait();
    kiln_pdl_trigger();
    const int64_t col = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, chunk = blockIdx.y;
    if (col >= C) return;
    const int64_t r0 = chunk * rows_per, r1 = r0 + rows_per < N ? r0 + rows_per : N;
    double acc = 0.0;
    for (int64_t t = r0; t < r1; t++)
        acc = __dadd_rn(acc, (double)__fmul_rn(dout[t * C + col], __fmul_rn(x[t * C + col], rstd[t])));
    partial[chunk * C + col] = acc;
}

/* Stage 2: a thread per column, the chunks in order. */
static __global__ void rmsnorm_backward_dw_final_kernel(float *dw /* (C) */, const double *partial /* (chunks, C) */, int64_t chunks,
                                                 int64_t C) {
    kiln_pdl_wait();
    kiln_pdl_trigger();
    const int64_t col = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= C) return;
    double acc = 0.0;
    for (int64_t k = 0; k < chunks; k++) acc = __dadd_rn(acc, partial[k * C + col]);
    dw[col] = __fadd_rn(dw[col], (float)acc);
}

extern "C" kiln_status kiln_cuda_rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const float *w,
                                                  const float *rstd, int64_t N, int64_t C, void *ws, void *stream) {
    if (N < 0 || C <= 0 || N > INT32_MAX || (N > 0 && !ws))
        return kiln_fail(KILN_ERR_INVALID, "cuda rmsnorm_backward: N %lld, C %lld, ws %s", (long long)N, (long long)C,
                         ws ? "given" : "NULL");
    if (N == 0) return KILN_OK;
    const int64_t chunks = rms_dw_chunks(N), rows_per = (N + chunks - 1) / chunks;
    const int64_t col_blocks = (C + EW_THREADS - 1) / EW_THREADS;
    if (col_blocks > INT32_MAX) return kiln_fail(KILN_ERR_INVALID, "cuda rmsnorm_backward: C %lld is too wide", (long long)C);
    const bool vec = C % 4 == 0 && aligned(dx, 16) && aligned(dout, 16) && aligned(x, 16) && aligned(w, 16);
    cudaStream_t s = (cudaStream_t)stream;
    const dim3 grid((unsigned)N), block(row_threads(vec ? C / 4 : C));
    double *partial = (double *)ws;
    cudaError_t e = vec ? kiln_launch(rmsnorm_backward_dx_kernel<true>, grid, block, 0, s, dx, dout, x, w, rstd, C)
                        : kiln_launch(rmsnorm_backward_dx_kernel<false>, grid, block, 0, s, dx, dout, x, w, rstd, C);
    if (e == cudaSuccess)
        e = kiln_launch(rmsnorm_backward_dw_partial_kernel, dim3((unsigned)col_blocks, (unsigned)chunks), dim3(EW_THREADS), 0,
                        s, partial, dout, x, rstd, N, C, rows_per);
    if (e == cudaSuccess)
        e = kiln_launch(rmsnorm_backward_dw_final_kernel, dim3((unsigned)col_blocks), dim3(EW_THREADS), 0, s, dw,
                        (const double *)partial, chunks, C);
    return checked("rmsnorm_backward", e);
}

/* ---------------------------------------------------------------- RoPE (forward and backward)
 * One block per row of the packed (N, Q + 2 KV) buffer. First the row's rope_dim / 2 angles: theta_0 = p,
 * theta_{i+1} = theta_i * theta_scale in float (ops_rope.c, as llama.cpp), so thread i repeats the i products of
 * the chain to get the CPU's bits; their cos and sign * sin go to shared memory for every head. Then a thread per
 * pair unit of the NH + NKV rotated heads: unit j < rope_dim / 2 of a head rotates (x[a], x[b]) (a = 2j, b = 2j+1
 * interleaved; a = j, b = j + rope_dim/2 NeoX) as ops_rope.c, x0 c - x1 s and x0 s + x1 c; units past it copy the
 * unrotated pair (rope_dim + 2 (j - rope_dim/2), +1). v is copied. The backward is the same with the sine negated
 * (the transpose of the rotation), as ops_rope.c's sin_sign. */

#define ROPE_MAX_HS 256
#define ROPE_THREADS 256

template <bool NEOX>
static __global__ void __launch_bounds__(ROPE_THREADS)
    rope_kernel(kiln_bf16_t *out /* (N, Q + 2 KV) */, const float *in /* (N, Q + 2 KV) */, int64_t T, int64_t NH,
                int64_t NKV, int64_t HS, int64_t rope_dim, float theta_scale, float sin_sign) {
    kiln_pdl_wait();
    kiln_pdl_trigger();
    __shared__ float cos_t[ROPE_MAX_HS / 2], sin_t[ROPE_MAX_HS / 2];
    const int64_t n = blockIdx.x, W = (NH + 2 * NKV) * HS;
    const int half = (int)(rope_dim / 2), hp = (int)(HS / 2);
    const float *src = in + n * W; /* (W) */
    kiln_bf16_t *dst = out + n * W; /* (W) */
    /* Angles reach T rad: sincosf, never the fast __sinf/__cosf, whose error grows with the argument. */
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float theta = (float)(n % T);
        for (int j = 0; j < i; j++) theta = __fmul_rn(theta, theta_scale);
        float sn, c;
        sincosf(theta, &sn, &c);
        cos_t[i] = c;
        sin_t[i] = __fmul_rn(sin_sign, sn);
    }
    __syncthreads();
    const int64_t units = (NH + NKV) * hp;
    for (int64_t u = threadIdx.x; u < units; u += blockDim.x) {
        const int64_t h = u / hp;
        const int j = (int)(u % hp);
        const float *x = src + h * HS; /* (HS) */
        kiln_bf16_t *y = dst + h * HS; /* (HS) */
        if (j < half) {
            const int a = NEOX ? j : 2 * j, b = NEOX ? j + half : 2 * j + 1;
            const float x0 = x[a], x1 = x[b], c = cos_t[j], sn = sin_t[j];
            y[a] = bf16_bits(__fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, sn)));
            y[b] = bf16_bits(__fadd_rn(__fmul_rn(x0, sn), __fmul_rn(x1, c)));
        } else {
            const int a = (int)rope_dim + 2 * (j - half);
            y[a] = bf16_bits(x[a]);
            y[a + 1] = bf16_bits(x[a + 1]);
        }
    }
    const int64_t v0 = (NH + NKV) * HS, nv = NKV * HS;
    for (int64_t i = threadIdx.x; i < nv; i += blockDim.x) dst[v0 + i] = bf16_bits(src[v0 + i]);
}

static kiln_status rope(const char *what, kiln_bf16_t *out, const float *in, int64_t N, int64_t T, int64_t NH, int64_t NKV,
                        int64_t HS, int64_t rope_dim, float base, bool neox, float sin_sign, void *stream) {
    if (N < 0 || N > INT32_MAX || T <= 0 || NH <= 0 || NKV <= 0 || HS <= 0 || HS % 2 || HS > ROPE_MAX_HS || rope_dim <= 0 ||
        rope_dim % 2 || rope_dim > HS || !(base > 0.0f))
        return kiln_fail(KILN_ERR_INVALID, "cuda %s: N %lld, T %lld, NH %lld, NKV %lld, HS %lld (even, at most %d), rope_dim %lld, base %g",
                         what, (long long)N, (long long)T, (long long)NH, (long long)NKV, (long long)HS, ROPE_MAX_HS,
                         (long long)rope_dim, (double)base);
    if (N == 0) return KILN_OK;
    /* The host's powf, the very call ops_rope.c makes, so theta_scale has the CPU's bits. */
    const float theta_scale = powf(base, -2.0f / (float)rope_dim);
    const dim3 grid((unsigned)N), block(ROPE_THREADS);
    cudaStream_t s = (cudaStream_t)stream;
    const cudaError_t e =
        neox ? kiln_launch(rope_kernel<true>, grid, block, 0, s, out, in, T, NH, NKV, HS, rope_dim, theta_scale, sin_sign)
             : kiln_launch(rope_kernel<false>, grid, block, 0, s, out, in, T, NH, NKV, HS, rope_dim, theta_scale, sin_sign);
    return checked(what, e);
}

extern "C" kiln_status kiln_cuda_rope_forward(kiln_bf16_t *qkv_bf, const float *qkv, int64_t N, int64_t T, int64_t NH,
                                              int64_t NKV, int64_t HS, int64_t rope_dim, float base, bool neox, void *stream) {
    return rope("rope_forward", qkv_bf, qkv, N, T, NH, NKV, HS, rope_dim, base, neox, 1.0f, stream);
}

extern "C" kiln_status kiln_cuda_rope_backward(kiln_bf16_t *dqkv_bf, const float *dqkv, int64_t N, int64_t T, int64_t NH,
                                               int64_t NKV, int64_t HS, int64_t rope_dim, float base, bool neox, void *stream) {
    return rope("rope_backward", dqkv_bf, dqkv, N, T, NH, NKV, HS, rope_dim, base, neox, -1.0f, stream);
}

/* ---------------------------------------------------------------- SwiGLU (forward and backward), to_bf16
 * Grid-stride over the N x F outputs, float4 (four bf16 stored as 8 bytes) when F % 4 == 0 and the pointers
 * allow, else one at a time. Unit i is row i / F4, column group i % F4. ops_swiglu.c's formulas:
 *   h = g / (1 + exp(-g)) * up
 *   sig = 1 / (1 + exp(-g)), dup = d * (g * sig), dgate = (d * up) * (sig * (1 + g * (1 - sig))) */

static __device__ __forceinline__ float swiglu_fwd(float g, float u) {
    return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
}

static __device__ __forceinline__ void swiglu_bwd(float g, float u, float d, float *dg, float *du) {
    const float sig = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-g)));
    *du = __fmul_rn(d, __fmul_rn(g, sig));
    *dg = __fmul_rn(__fmul_rn(d, u), __fmul_rn(sig, __fadd_rn(1.0f, __fmul_rn(g, __fsub_rn(1.0f, sig)))));
}

template <bool VEC>
static __global__ void swiglu_forward_kernel(kiln_bf16_t *h /* (N, F) */, const float *gu /* (N, 2F) */, int64_t N, int64_t F) {
    kiln_pdl_wait();
    kiln_pdl_trigger();
    const int64_t stride = (int64_t)gridDim.x * blockDim.x, V = VEC ? 4 : 1, FV = F / V, total = N * FV;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        const int64_t n = i / FV, f = (i % FV) * V;
        const float *g = gu + n * 2 * F + f, *u = g + F; /* (V) each */
        if (VEC) {
            const float4 a = *(const float4 *)g, b = *(const float4 *)u;
            store_bf16x4(h + n * F + f, swiglu_fwd(a.x, b.x), swiglu_fwd(a.y, b.y), swiglu_fwd(a.z, b.z), swiglu_fwd(a.w, b.w));
        } else {
            h[n * F + f] = bf16_bits(swiglu_fwd(g[0], u[0]));
        }
    }
}

template <bool VEC>
static __global__ void swiglu_backward_kernel(kiln_bf16_t *dgu /* (N, 2F) */, const float *dh /* (N, F) */,
                                       const float *gu /* (N, 2F) */, int64_t N, int64_t F) {
    kiln_pdl_wait();
    kiln_pdl_trigger();
    const int64_t stride = (int64_t)gridDim.x * blockDim.x, V = VEC ? 4 : 1, FV = F / V, total = N * FV;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        const int64_t n = i / FV, f = (i % FV) * V;
        const float *g = gu + n * 2 * F + f, *u = g + F, *d = dh + n * F + f; /* (V) each */
        kiln_bf16_t *dg = dgu + n * 2 * F + f, *du = dg + F;                  /* (V) each */
        if (VEC) {
            const float4 a = *(const float4 *)g, b = *(const float4 *)u, c = *(const float4 *)d;
            float g0, g1, g2, g3, u0, u1, u2, u3;
            swiglu_bwd(a.x, b.x, c.x, &g0, &u0);
            swiglu_bwd(a.y, b.y, c.y, &g1, &u1);
            swiglu_bwd(a.z, b.z, c.z, &g2, &u2);
            swiglu_bwd(a.w, b.w, c.w, &g3, &u3);
            store_bf16x4(dg, g0, g1, g2, g3);
            store_bf16x4(du, u0, u1, u2, u3);
        } else {
            float g0, u0;
            swiglu_bwd(g[0], u[0], d[0], &g0, &u0);
            dg[0] = bf16_bits(g0);
            du[0] = bf16_bits(u0);
        }
    }
}

extern "C" kiln_status kiln_cuda_swiglu_forward(kiln_bf16_t *h, const float *gu, int64_t N, int64_t F, void *stream) {
    if (N < 0 || F <= 0 || (N > 0 && F > INT64_MAX / 2 / N))
        return kiln_fail(KILN_ERR_INVALID, "cuda swiglu_forward: N %lld, F %lld", (long long)N, (long long)F);
    if (N == 0) return KILN_OK;
    const bool vec = F % 4 == 0 && aligned(gu, 16) && aligned(h, 8);
    const dim3 grid(ew_blocks(vec ? N * F / 4 : N * F)), block(EW_THREADS);
    cudaStream_t s = (cudaStream_t)stream;
    const cudaError_t e = vec ? kiln_launch(swiglu_forward_kernel<true>, grid, block, 0, s, h, gu, N, F)
                              : kiln_launch(swiglu_forward_kernel<false>, grid, block, 0, s, h, gu, N, F);
    return checked("swiglu_forward", e);
}

extern "C" kiln_status kiln_cuda_swiglu_backward(kiln_bf16_t *dgu, const float *dh, const float *gu, int64_t N, int64_t F,
                                                 void *stream) {
    if (N < 0 || F <= 0 || (N > 0 && F > INT64_MAX / 2 / N))
        return kiln_fail(KILN_ERR_INVALID, "cuda swiglu_backward: N %lld, F %lld", (long long)N, (long long)F);
    if (N == 0) return KILN_OK;
    const bool vec = F % 4 == 0 && aligned(gu, 16) && aligned(dh, 16) && aligned(dgu, 8);
    const dim3 grid(ew_blocks(vec ? N * F / 4 : N * F)), block(EW_THREADS);
    cudaStream_t s = (cudaStream_t)stream;
    const cudaError_t e = vec ? kiln_launch(swiglu_backward_kernel<true>, grid, block, 0, s, dgu, dh, gu, N, F)
                              : kiln_launch(swiglu_backward_kernel<false>, grid, block, 0, s, dgu, dh, gu, N, F);
    return checked("swiglu_backward", e);
}

/* out (n) = x (n) in bf16: float4 groups while the pointers allow (the tail one at a time). */
template <bool VEC>
static __global__ void to_bf16_kernel(kiln_bf16_t *out /* (n) */, const float *x /* (n) */, int64_t n) {
    kiln_pdl_wait();
    kiln_pdl_trigger();
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (VEC) {
        const int64_t n4 = n / 4;
        for (int64_t j = i; j < n4; j += stride) {
            const float4 a = ((const float4 *)x)[j];
            store_bf16x4(out + 4 * j, a.x, a.y, a.z, a.w);
        }
        i += 4 * n4;
    }
    for (; i < n; i += stride) out[i] = bf16_bits(x[i]);
}

extern "C" kiln_status kiln_cuda_to_bf16(kiln_bf16_t *out, const float *x, int64_t n, void *stream) {
    if (n < 0) return kiln_fail(KILN_ERR_INVALID, "cuda to_bf16: %lld elements", (long long)n);
    if (n == 0) return KILN_OK;
    const bool vec = aligned(x, 16) && aligned(out, 8);
    const dim3 grid(ew_blocks(vec ? n / 4 + 1 : n)), block(EW_THREADS);
    cudaStream_t s = (cudaStream_t)stream;
    const cudaError_t e = vec ? kiln_launch(to_bf16_kernel<true>, grid, block, 0, s, out, x, n)
                              : kiln_launch(to_bf16_kernel<false>, grid, block, 0, s, out, x, n);
    return checked("to_bf16", e);
}
