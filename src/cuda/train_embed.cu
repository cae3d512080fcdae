/* train_embed.cu: the embedding of CUDA training (train_kernels.h's train_elementwise.cu section, embedding
 * part): the gather from the fp32 master table, and its backward, by atomics or deterministic (a counting sort of
 * the rows by id, then each id's rows summed in row order). Bit-exact with the CPU oracle (the deterministic
 * backward too); a row of dx with a non-finite value is skipped whole and counted, as on the CPU. Every kernel is
 * launched with PDL (launch.h). tests/test_cuda_train_elementwise.c checks both against kiln_cpu_ops. */
#include "cuda/train_util.cuh"

#include "status.h"

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

extern "C" kiln_status kiln_cuda_embed_forward_train(float *x, const float *table, const int32_t *ids, int64_t N, int64_t C,
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
