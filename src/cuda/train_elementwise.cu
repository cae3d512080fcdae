/* train_elementwise.cu: the CUDA training kernels between the matmuls (train_kernels.h's train_elementwise.cu
 * section; the embedding and its backward are in train_embed.cu): the residual add + RMSNorm with its saved rstd
 * and its backward (dx, its bf16 copy and dw in one pass over the rows, dw finished by a small deterministic
 * reduction), RoPE on the packed bf16 q|k|v projection (in place) and its inverse to bf16, SwiGLU on bf16 and its
 * backward, and the f32 -> bf16 rounding. All are memory-bound and make one pass over their data, so the norm
 * backward's dw and bf16 copy cost no extra pass. The arithmetic repeats the CPU oracle's float operations in its
 * order with explicit round-to-nearest intrinsics (__fmul_rn, __fadd_rn, ...) so nvcc cannot contract them into
 * FMAs: the norms differ from the CPU only by the order of double sums, RoPE and SwiGLU by the ulps between CUDA's
 * sincosf/expf and the host's libm, and a bf16 output then by at most one bf16 rounding. Every kernel is launched
 * with PDL (launch.h: kiln_pdl_wait first, then kiln_pdl_trigger); none uses atomics.
 * tests/test_cuda_train_elementwise.c checks every launcher against kiln_cpu_ops (src/cpu/ops*.c). */
#include "cuda/train_util.cuh"
#include "cuda/kernels.h"
#include "cuda/norm.cuh"
#include "cuda/rope.cuh"

#include <math.h>

#include "status.h"

/* ---------------------------------------------------------------- rows resident in registers (the RMSNorms)
 * A row goes to a group of threads: a warp when it is at most RMS_WARP_UNITS units (C <= 1024 in float4s, 256 in
 * floats), several rows per block so that enough bytes are in flight (a block per row of 768 floats holds only
 * 3 KiB in flight per 192 threads: latency-bound, 42 us for the forward at N 16384 where 45 us moves its bytes),
 * or a whole block for a wider row. Thread t of a group of G owns units t, t + G, ..., t + (NV - 1) G of the
 * row, a unit being W floats (a float4 when W = 4: C % 4 == 0 and 16-byte aligned pointers, else one float):
 * consecutive threads touch consecutive units (coalesced), and the thread's values stay in registers between a
 * row's two passes (its reduction and its output), so each input is read from DRAM once. NV <= RMS_MAX_NV
 * bounds the registers (the backward's NV 8 takes ~200 of them at 256 threads, 118 at 512 in floats); that caps
 * C at 8192 with float4s (a block of 256 x 8) and 4096 with floats (512 x 8). */

#define RMS_MAX_NV 8
#define RMS_WARP_UNITS (32 * RMS_MAX_NV)
#define RMS_WARP_THREADS 256 /* warp tier: 8 rows in flight per block */

typedef struct {
    int W, NV, threads; /* unit width, units per thread, threads per block */
    bool block;         /* a row per block (else a row per warp) */
} rms_plan;

/* The plan for rows of C floats; false when C is too wide. Depends only on C and vec, so the order of
 * every sum (and so the bits) is the same on every run with the same shapes and alignment. */
static bool rms_plan_for(int64_t C, bool vec, rms_plan *p) {
    p->W = vec ? 4 : 1;
    const int64_t U = C / p->W;
    if (U <= RMS_WARP_UNITS) {
        p->block = false, p->threads = RMS_WARP_THREADS, p->NV = (int)((U + 31) / 32);
        return true;
    }
    /* about 4 units per thread (bytes in flight), at most the kernels' __launch_bounds__: 256 threads of float4s,
     * 512 of floats */
    const int64_t max_threads = vec ? 256 : 512;
    int64_t t = ((U + 3) / 4 + 31) / 32 * 32;
    if (t > max_threads) t = max_threads;
    p->block = true, p->threads = (int)t, p->NV = (int)((U + t - 1) / t);
    return p->NV <= RMS_MAX_NV;
}

template <int W>
static __device__ __forceinline__ void load_unit(float *v /* (W) */, const float *p /* (W) */) {
    if (W == 4) {
        const float4 a = *(const float4 *)p;
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
    } else {
        v[0] = *p;
    }
}

template <int W>
static __device__ __forceinline__ void store_unit(float *p /* (W) */, const float *v /* (W) */) {
    if (W == 4) *(float4 *)p = make_float4(v[0], v[1], v[2], v[3]);
    else *p = v[0];
}

template <int W>
static __device__ __forceinline__ void store_unit_bf16(kiln_bf16_t *p /* (W) */, const float *v /* (W) */) {
    if (W == 4) store_bf16x4(p, v[0], v[1], v[2], v[3]);
    else *p = bf16_bits(v[0]);
}

/* The sum of v over the thread's group, the same bits in every thread of it: the warp's xor butterfly (each step
 * adds the same two subtotals in every lane, in one order or the other: addition commutes), then for a block
 * group the warps' sums through sh (blockDim / 32 doubles) in warp order. Two barriers, so sh serves the next
 * row at once; every thread of the block must call it (BLOCK: all work on the same row). */
template <bool BLOCK>
static __device__ __forceinline__ double group_sum(double v, double *sh) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = __dadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (!BLOCK) return v;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    double s = 0.0;
    for (int i = 0; i < nw; i++) s = __dadd_rn(s, sh[i]);
    __syncthreads();
    return s;
}

/* ---------------------------------------------------------------- RMSNorm forward (train)
 * A row per group (above), x and y loaded once into registers, x += y stored, the double sum of squares reduced
 * over the group, then out = (x * rstd) * w in bf16 from the registers. ops_rmsnorm.c's order: float squares
 * summed in double, the mean rounded to float, rstd = 1 / sqrtf(mean + eps) in float. Traffic at N 16384, C 768:
 * 50 + 50 MB read, 50 + 25 MB written (with y), ~45 us at 4 TB/s. kiln_rms_scale: norm.cuh. */


template <int W, int NV, bool BLOCK>
static __global__ void __launch_bounds__(W == 4 ? 256 : 512)
    rmsnorm_forward_kernel(float *x /* (N, C) */, const float *y /* (N, C) or NULL */, kiln_bf16_t *out /* (N, C) */,
                           float *rstd /* (N) */, const float *w /* (C) */, int64_t N, int64_t C, float eps) {
    kiln_pdl_wait();
    kiln_pdl_trigger();
    __shared__ double sh[32];
    const int G = BLOCK ? (int)blockDim.x : 32, t = BLOCK ? (int)threadIdx.x : (int)(threadIdx.x & 31);
    const int64_t n = BLOCK ? (int64_t)blockIdx.x : (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (n >= N) return; /* warp tier only (a whole warp, which makes no block barrier); the block tier's grid is N */
    const int64_t U = C / W;
    float *xr = x + n * C;                  /* (C) */
    const float *yr = y ? y + n * C : NULL; /* (C) */
    kiln_bf16_t *outr = out + n * C;        /* (C) */
    float a[NV][W], b[NV][W];
    /* every load first (no store between them, which the compiler would have to keep ordered), then the adds */
#pragma unroll
    for (int k = 0; k < NV; k++) {
        const int64_t u = t + (int64_t)k * G;
        if (u < U) {
            load_unit<W>(a[k], xr + u * W);
            if (yr) load_unit<W>(b[k], yr + u * W);
        }
    }
    double ss = 0.0;
#pragma unroll
    for (int k = 0; k < NV; k++) {
        const int64_t u = t + (int64_t)k * G;
        if (u < U) {
            if (yr) {
#pragma unroll
                for (int j = 0; j < W; j++) a[k][j] = __fadd_rn(a[k][j], b[k][j]);
                store_unit<W>(xr + u * W, a[k]);
            }
#pragma unroll
            for (int j = 0; j < W; j++) ss = __dadd_rn(ss, (double)__fmul_rn(a[k][j], a[k][j]));
        }
    }
    const float r = kiln_rms_scale(group_sum<BLOCK>(ss, sh), C, eps);
    if (t == 0) rstd[n] = r;
#pragma unroll
    for (int k = 0; k < NV; k++) {
        const int64_t u = t + (int64_t)k * G;
        if (u < U) {
            float g[W], o[W];
            load_unit<W>(g, w + u * W);
#pragma unroll
            for (int j = 0; j < W; j++) o[j] = __fmul_rn(__fmul_rn(a[k][j], r), g[j]);
            store_unit_bf16<W>(outr + u * W, o);
        }
    }
}

/* The kernel of a plan: one instantiation per (W, NV, tier); NULL past RMS_MAX_NV. */
typedef void (*rms_forward_fn)(float *, const float *, kiln_bf16_t *, float *, const float *, int64_t, int64_t, float);
template <int W, bool BLOCK>
static rms_forward_fn rms_forward_pick(int NV) {
    switch (NV) {
    case 1: return rmsnorm_forward_kernel<W, 1, BLOCK>;
    case 2: return rmsnorm_forward_kernel<W, 2, BLOCK>;
    case 3: return rmsnorm_forward_kernel<W, 3, BLOCK>;
    case 4: return rmsnorm_forward_kernel<W, 4, BLOCK>;
    case 5: return rmsnorm_forward_kernel<W, 5, BLOCK>;
    case 6: return rmsnorm_forward_kernel<W, 6, BLOCK>;
    case 7: return rmsnorm_forward_kernel<W, 7, BLOCK>;
    case 8: return rmsnorm_forward_kernel<W, 8, BLOCK>;
    default: return NULL;
    }
}

extern "C" kiln_status kiln_cuda_rmsnorm_forward_train(float *x, const float *y, kiln_bf16_t *out, float *rstd, const float *w,
                                                 int64_t N, int64_t C, float eps, void *stream) {
    const bool vec = C % 4 == 0 && aligned(x, 16) && aligned(y, 16) && aligned(w, 16) && aligned(out, 8);
    rms_plan p;
    if (N < 0 || C <= 0 || N > INT32_MAX || !x || !out || !rstd || !w || !rms_plan_for(C, vec, &p))
        return kiln_fail(KILN_ERR_INVALID, "cuda rmsnorm_forward: N %lld, C %lld (rows stay in registers: C at most 8192 "
                         "with C %% 4 == 0 and 16-byte aligned pointers, else 4096)", (long long)N, (long long)C);
    if (N == 0) return KILN_OK;
    const rms_forward_fn f = p.W == 4 ? (p.block ? rms_forward_pick<4, true>(p.NV) : rms_forward_pick<4, false>(p.NV))
                                      : (p.block ? rms_forward_pick<1, true>(p.NV) : rms_forward_pick<1, false>(p.NV));
    const int64_t rows_per_block = p.block ? 1 : p.threads / 32;
    const dim3 grid((unsigned)((N + rows_per_block - 1) / rows_per_block)), block(p.threads);
    return checked("rmsnorm_forward", kiln_launch(f, grid, block, 0, (cudaStream_t)stream, x, y, out, rstd, w, N, C, eps));
}

/* ---------------------------------------------------------------- RMSNorm backward
 * ops_rmsnorm.c, with r = rstd and g = dout:
 *   dx += r * (g * w) - c * x,  c = (float)(sum(double(g * w) * x) / C * r * r * r)   (the sum in double)
 *   dw += (float) sum over rows of double(g * (x * r))
 * One pass over the rows and a small second kernel, deterministic for any N (fixed orders, no atomics):
 *   1 rows   block b takes the chunk of rows [b R, (b + 1) R) (R = rms_rows_per_chunk(N): 64 at N 16384, so
 *            256 blocks, one wave of 2 per SM), a row per group (above) with g and x loaded into registers and
 *            dx prefetched into L1: each thread adds double(g * (x * r)) for its own columns into registers in
 *            row order, the group's double sum gives c, and dx is loaded, updated and stored (and dx_bf, its
 *            rounding, when wanted).
 *            Warp tier: warp i of 8 takes rows i, i + 8, ...; the warps' per-column partials are then combined
 *            by a fixed tree in shared memory ((w0 + w4) + (w2 + w6)) + ((w1 + w5) + (w3 + w7)). Block tier:
 *            each thread's columns are its own. Either way partial (chunks, C) doubles gets the chunk's sum.
 *   2 dw     a warp per column: lane l adds chunks l, l + 32, ... in order, then the xor tree; dw += (float).
 * So dout and x are read once (the separate dw pass re-read both: 26 us), and stage 2 has C warps of at most
 * 8 loads per lane in flight at once instead of 3 blocks of threads walking 256 chunks each (33 us: latency).
 * Precision is the old kernels': double row sums and double partials; only the orders of the sums differ from
 * the CPU. Traffic at N 16384, C 768: 150 MB read (dout, x, dx), 50 + 25 MB written (dx, dx_bf): ~55 us. */

#define RMS_MAX_CHUNKS 256

/* Rows per chunk: a multiple of 8 (the warps of a block), at least 16, so that there are at most 256 chunks. */
static int64_t rms_rows_per_chunk(int64_t N) {
    int64_t r = (N + RMS_MAX_CHUNKS - 1) / RMS_MAX_CHUNKS;
    r = (r + 7) / 8 * 8;
    return r < 16 ? 16 : r;
}

extern "C" size_t kiln_cuda_rmsnorm_backward_ws_bytes(int64_t N, int64_t C) {
    if (N <= 0 || C <= 0) return 0;
    const int64_t R = rms_rows_per_chunk(N);
    return (size_t)((N + R - 1) / R) * (size_t)C * sizeof(double);
}

/* Dynamic shared memory: the warp tier's combine tree holds (8 / 2) rows of C doubles (32 KiB at C 1024); the
 * block tier's group_sum 32 doubles, as the forward's static sh[32], though it uses blockDim / 32: ptxas widens
 * the last reads of group_sum's loop to 16 bytes, which ran past an allocation of exactly 9 doubles (C 1030,
 * 288 threads; compute-sanitizer memcheck caught it). Registers (ptxas, sm_90): 128 at C 768 (float4, NV 6: 2 blocks
 * of 256 per SM, no spill; the bound asks for exactly that), ~200 at NV 8 (1 block per SM). */
template <int W, int NV, bool BLOCK>
static __global__ void __launch_bounds__(W == 4 ? 256 : 512, W == 4 && !BLOCK && NV <= 6 ? 2 : 1)
    rmsnorm_backward_kernel(float *dx /* (N, C) */, kiln_bf16_t *dx_bf /* (N, C) or NULL */, double *partial /* (chunks, C) */,
                            const float *dout /* (N, C) */, const float *x /* (N, C) */, const float *w /* (C) */,
                            const float *rstd /* (N) */, int64_t N, int64_t C, int64_t rows_per_chunk) {
    kiln_pdl_wait();
    kiln_pdl_trigger();
    extern __shared__ double sm[];
    const int G = BLOCK ? (int)blockDim.x : 32, t = BLOCK ? (int)threadIdx.x : (int)(threadIdx.x & 31);
    const int groups = BLOCK ? 1 : (int)(blockDim.x >> 5), gi = BLOCK ? 0 : (int)(threadIdx.x >> 5);
    const int64_t U = C / W, chunk = blockIdx.x, r0 = chunk * rows_per_chunk;
    const int64_t r1 = r0 + rows_per_chunk < N ? r0 + rows_per_chunk : N;
    double acc[NV][W];
#pragma unroll
    for (int k = 0; k < NV; k++)
#pragma unroll
        for (int j = 0; j < W; j++) acc[k][j] = 0.0;
    /* BLOCK: every thread walks the same rows, so group_sum's barriers are uniform */
    for (int64_t n = r0 + gi; n < r1; n += groups) {
        const float *gr = dout + n * C, *xr = x + n * C; /* (C) each */
        float *dxr = dx + n * C;                         /* (C) */
        const float r = rstd[n];
        float g[NV][W], a[NV][W]; /* g becomes g * w once dw has its share */
        /* dx is needed only after the row's sum: prefetched into L1 now (no registers held while it flies: g, x
         * and the dw partials are what fit 2 blocks of 8 warps per SM at C 768), loaded after the sum */
#pragma unroll
        for (int k = 0; k < NV; k++) {
            const int64_t u = t + (int64_t)k * G;
            if (u < U) asm volatile("prefetch.global.L1 [%0];" ::"l"(dxr + u * W));
        }
#pragma unroll
        for (int k = 0; k < NV; k++) {
            const int64_t u = t + (int64_t)k * G;
            if (u < U) {
                load_unit<W>(g[k], gr + u * W);
                load_unit<W>(a[k], xr + u * W);
            }
        }
        /* double(g * w) * double(x) is exact in double (24 x 24 bits), so only the sum's order can differ */
        double gwx = 0.0;
#pragma unroll
        for (int k = 0; k < NV; k++) {
            const int64_t u = t + (int64_t)k * G;
            if (u < U) {
                float ww[W];
                load_unit<W>(ww, w + u * W); /* w (C <= 32 KiB) stays in L1 */
#pragma unroll
                for (int j = 0; j < W; j++) {
                    acc[k][j] = __dadd_rn(acc[k][j], (double)__fmul_rn(g[k][j], __fmul_rn(a[k][j], r)));
                    g[k][j] = __fmul_rn(g[k][j], ww[j]);
                    gwx = __dadd_rn(gwx, __dmul_rn((double)g[k][j], (double)a[k][j]));
                }
            }
        }
        const double rd = (double)r;
        const float c = (float)__dmul_rn(__dmul_rn(__dmul_rn(__ddiv_rn(group_sum<BLOCK>(gwx, sm), (double)C), rd), rd), rd);
#pragma unroll
        for (int k = 0; k < NV; k++) {
            const int64_t u = t + (int64_t)k * G;
            if (u < U) {
                float d[W];
                load_unit<W>(d, dxr + u * W);
#pragma unroll
                for (int j = 0; j < W; j++) d[j] = __fadd_rn(d[j], __fsub_rn(__fmul_rn(r, g[k][j]), __fmul_rn(c, a[k][j])));
                store_unit<W>(dxr + u * W, d);
                if (dx_bf) store_unit_bf16<W>(dx_bf + n * C + u * W, d);
            }
        }
    }
    double *out = partial + chunk * C; /* (C) */
    if (!BLOCK) {
        /* the fixed tree over the 8 warps: at step h, warps h..2h-1 park their partials, warps 0..h-1 add them */
        for (int h = groups >> 1; h >= 1; h >>= 1) {
            if (gi >= h && gi < 2 * h) {
#pragma unroll
                for (int k = 0; k < NV; k++) {
                    const int64_t u = t + (int64_t)k * G;
                    if (u < U)
#pragma unroll
                        for (int j = 0; j < W; j++) sm[(gi - h) * C + u * W + j] = acc[k][j];
                }
            }
            __syncthreads();
            if (gi < h) {
#pragma unroll
                for (int k = 0; k < NV; k++) {
                    const int64_t u = t + (int64_t)k * G;
                    if (u < U)
#pragma unroll
                        for (int j = 0; j < W; j++) acc[k][j] = __dadd_rn(acc[k][j], sm[gi * C + u * W + j]);
                }
            }
            __syncthreads();
        }
        if (gi != 0) return;
    }
#pragma unroll
    for (int k = 0; k < NV; k++) {
        const int64_t u = t + (int64_t)k * G;
        if (u < U)
#pragma unroll
            for (int j = 0; j < W; j++) out[u * W + j] = acc[k][j];
    }
}

/* Stage 2: a warp per column (8 per block of 256). The chunks' partials were just written: they come from L2. */
#define RMS_DW_THREADS 256
static __global__ void __launch_bounds__(RMS_DW_THREADS)
    rmsnorm_backward_dw_kernel(float *dw /* (C) */, const double *partial /* (chunks, C) */, int64_t chunks, int64_t C) {
    kiln_pdl_wait();
    kiln_pdl_trigger();
    const int lane = threadIdx.x & 31;
    const int64_t col = (int64_t)blockIdx.x * (RMS_DW_THREADS / 32) + (threadIdx.x >> 5);
    if (col >= C) return; /* a whole warp */
    double acc = 0.0;
#pragma unroll 8
    for (int64_t k = lane; k < chunks; k += 32) acc = __dadd_rn(acc, partial[k * C + col]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc = __dadd_rn(acc, __shfl_xor_sync(0xffffffffu, acc, o));
    if (lane == 0) dw[col] = __fadd_rn(dw[col], (float)acc);
}

typedef void (*rms_backward_fn)(float *, kiln_bf16_t *, double *, const float *, const float *, const float *, const float *,
                                int64_t, int64_t, int64_t);
template <int W, bool BLOCK>
static rms_backward_fn rms_backward_pick(int NV) {
    switch (NV) {
    case 1: return rmsnorm_backward_kernel<W, 1, BLOCK>;
    case 2: return rmsnorm_backward_kernel<W, 2, BLOCK>;
    case 3: return rmsnorm_backward_kernel<W, 3, BLOCK>;
    case 4: return rmsnorm_backward_kernel<W, 4, BLOCK>;
    case 5: return rmsnorm_backward_kernel<W, 5, BLOCK>;
    case 6: return rmsnorm_backward_kernel<W, 6, BLOCK>;
    case 7: return rmsnorm_backward_kernel<W, 7, BLOCK>;
    case 8: return rmsnorm_backward_kernel<W, 8, BLOCK>;
    default: return NULL;
    }
}

extern "C" kiln_status kiln_cuda_rmsnorm_backward(float *dx, kiln_bf16_t *dx_bf, float *dw, const float *dout, const float *x,
                                                  const float *w, const float *rstd, int64_t N, int64_t C, void *ws,
                                                  void *stream) {
    const bool vec = C % 4 == 0 && aligned(dx, 16) && aligned(dout, 16) && aligned(x, 16) && aligned(w, 16) && aligned(dx_bf, 8);
    rms_plan p;
    if (N < 0 || C <= 0 || N > INT32_MAX || (N > 0 && !ws) || !rms_plan_for(C, vec, &p))
        return kiln_fail(KILN_ERR_INVALID, "cuda rmsnorm_backward: N %lld, C %lld (rows stay in registers: C at most 8192 "
                         "with C %% 4 == 0 and 16-byte aligned pointers, else 4096), ws %s", (long long)N, (long long)C,
                         ws ? "given" : "NULL");
    if (N == 0) return KILN_OK;
    if (!aligned(ws, 8)) return kiln_fail(KILN_ERR_INVALID, "cuda rmsnorm_backward: ws is not 8-byte aligned");
    const int64_t R = rms_rows_per_chunk(N), chunks = (N + R - 1) / R;
    const rms_backward_fn f = p.W == 4 ? (p.block ? rms_backward_pick<4, true>(p.NV) : rms_backward_pick<4, false>(p.NV))
                                       : (p.block ? rms_backward_pick<1, true>(p.NV) : rms_backward_pick<1, false>(p.NV));
    const size_t smem = p.block ? (size_t)32 * sizeof(double)
                                : (size_t)(RMS_WARP_THREADS / 32 / 2) * (size_t)C * sizeof(double);
    cudaStream_t s = (cudaStream_t)stream;
    double *partial = (double *)ws;
    cudaError_t e = kiln_launch(f, dim3((unsigned)chunks), dim3(p.threads), smem, s, dx, dx_bf, partial, dout, x, w, rstd, N, C, R);
    if (e == cudaSuccess)
        e = kiln_launch(rmsnorm_backward_dw_kernel, dim3((unsigned)((C + RMS_DW_THREADS / 32 - 1) / (RMS_DW_THREADS / 32))),
                        dim3(RMS_DW_THREADS), 0, s, dw, (const double *)partial, chunks, C);
    return checked("rmsnorm_backward", e);
}

/* ---------------------------------------------------------------- RoPE (forward and backward)
 * One block per row of the packed (N, Q + 2 KV) buffer. First the row's rope_dim / 2 angles: theta_0 = p,
 * theta_{i+1} = theta_i * theta_scale in float (ops_rope.c, as llama.cpp), so thread i repeats the i products of
 * the chain to get the CPU's bits; their cos and sign * sin go to shared memory for every head. The rotation of
 * a pair (x0, x1) is ops_rope.c's, x0 c - x1 s and x0 s + x1 c, in f32 and rounded to bf16 once; the pairs are
 * (2j, 2j + 1) interleaved or (j, j + rope_dim / 2) NeoX; columns past rope_dim pass through. The backward is the
 * same with the sine negated (the transpose of the rotation), as ops_rope.c's sin_sign.
 * Fast path (VEC: HS % 8 == 0, NeoX also rope_dim % 16 == 0, 16-byte aligned): a thread moves units of 8
 * elements, one 16-byte bf16 load (two float4 for the f32 backward) and one 16-byte store: interleaved, 8
 * consecutive columns of a head (4 whole pairs: chunks start at even columns); NeoX, columns j..j+7 and their
 * partners j + rope_dim/2.. (both loaded by the same thread, so in place is safe), or 8 columns past rope_dim.
 * The thread loads its first unit before computing the angles, so the load's latency hides the chained products
 * and sincosf. In place (out == in, the forward's bf16 qkv) v and the columns past rope_dim are not touched:
 * at 124M (NH 12, NKV 4, HS 64) a row moves 2 KiB in and 2 KiB out instead of 2.5 + 2.5 KiB.
 * Otherwise one pair (or pass-through pair) per thread, as before. */

#define ROPE_MAX_HS 256
#define ROPE_THREADS 256

static __device__ __forceinline__ float bf16_f32(uint32_t bits16) { return __uint_as_float(bits16 << 16); }

template <typename TI>
static __device__ __forceinline__ float load_f32(const TI *p);
template <>
__device__ __forceinline__ float load_f32<float>(const float *p) { return *p; }
template <>
__device__ __forceinline__ float load_f32<kiln_bf16_t>(const kiln_bf16_t *p) { return bf16_f32(*p); }

/* 8 consecutive elements as f32 (bf16 widens exactly) */
template <typename TI>
static __device__ __forceinline__ void load8(float *v /* (8) */, const TI *p /* (8), 16-byte aligned */);
template <>
__device__ __forceinline__ void load8<float>(float *v, const float *p) {
    const float4 a = ((const float4 *)p)[0], b = ((const float4 *)p)[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}
template <>
__device__ __forceinline__ void load8<kiln_bf16_t>(float *v, const kiln_bf16_t *p) {
    const uint4 q = *(const uint4 *)p;
    const uint32_t h[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int i = 0; i < 4; i++) v[2 * i] = __uint_as_float(h[i] << 16), v[2 * i + 1] = __uint_as_float(h[i] & 0xffff0000u);
}

static __device__ __forceinline__ void store8_bf16(kiln_bf16_t *p /* (8), 16-byte aligned */, const float *v /* (8) */) {
    uint4 q;
    q.x = (uint32_t)bf16_bits(v[0]) | ((uint32_t)bf16_bits(v[1]) << 16);
    q.y = (uint32_t)bf16_bits(v[2]) | ((uint32_t)bf16_bits(v[3]) << 16);
    q.z = (uint32_t)bf16_bits(v[4]) | ((uint32_t)bf16_bits(v[5]) << 16);
    q.w = (uint32_t)bf16_bits(v[6]) | ((uint32_t)bf16_bits(v[7]) << 16);
    *(uint4 *)p = q;
}

/* A unit of the fast path: where its 8 elements start in the row (o0; NeoX rotated units also o0 + half), and
 * whether it is rotated (interleaved: its pairs below rope_dim; NeoX: all 8 pairs). */
struct rope_unit {
    int o0, j0; /* first element; first pair index (rotated units) */
    bool rot;   /* false: pass-through (columns past rope_dim, or v) */
};

template <bool NEOX>
static __device__ __forceinline__ rope_unit rope_unit_at(int u, int HS, int half, int rope_dim, int uph, int uqk) {
    rope_unit r;
    if (u >= uqk) { /* v */
        r.o0 = uqk / uph * HS + 8 * (u - uqk), r.j0 = 0, r.rot = false;
        return r;
    }
    const int h = u / uph, e = u - h * uph;
    if (NEOX) {
        r.rot = e < half / 8;
        r.o0 = h * HS + (r.rot ? 8 * e : rope_dim + 8 * (e - half / 8));
        r.j0 = 8 * e;
    } else {
        r.o0 = h * HS + 8 * e, r.j0 = 4 * e, r.rot = 8 * e < rope_dim;
    }
    return r;
}

/* Rotate the loaded unit (v, and v2 the NeoX partners) and store it. */
template <bool NEOX>
static __device__ __forceinline__ void rope_unit_store(kiln_bf16_t *dst /* (W) */, const rope_unit &r, float *v /* (8) */,
                                                       float *v2 /* (8), NeoX rotated units */, const float *cos_t /* (half) */,
                                                       const float *sin_t /* (half) */, int half, int rope_dim) {
    if (!r.rot) {
        store8_bf16(dst + r.o0, v);
        return;
    }
    if (NEOX) {
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const float x0 = v[i], x1 = v2[i], c = cos_t[r.j0 + i], sn = sin_t[r.j0 + i];
            v[i] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, sn));
            v2[i] = __fadd_rn(__fmul_rn(x0, sn), __fmul_rn(x1, c));
        }
        store8_bf16(dst + r.o0, v);
        store8_bf16(dst + r.o0 + half, v2);
    } else {
#pragma unroll
        for (int p = 0; p < 4; p++) {
            const int j = r.j0 + p;
            if (2 * j < rope_dim) { /* a unit can straddle rope_dim when rope_dim % 8 != 0 */
                const float x0 = v[2 * p], x1 = v[2 * p + 1], c = cos_t[j], sn = sin_t[j];
                v[2 * p] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, sn));
                v[2 * p + 1] = __fadd_rn(__fmul_rn(x0, sn), __fmul_rn(x1, c));
            }
        }
        store8_bf16(dst + r.o0, v);
    }
}

/* units: the row's units of 8 (pass-through ones left out when in place, !copy). */
template <typename TI, bool NEOX>
static __global__ void __launch_bounds__(ROPE_THREADS)
    rope_vec_kernel(kiln_bf16_t *out /* (N, W) */, const TI *in /* (N, W), or out itself */, int64_t T, int NH, int NKV, int HS,
                    int rope_dim, float theta_scale, kiln_cuda_rope_freq rf, float sin_sign, bool copy) {
    kiln_pdl_wait();
    kiln_pdl_trigger();
    __shared__ float cos_t[ROPE_MAX_HS / 2], sin_t[ROPE_MAX_HS / 2];
    const int64_t n = blockIdx.x, W = (int64_t)(NH + 2 * NKV) * HS;
    const int half = rope_dim / 2, uph = NEOX ? (HS - half) / 8 : HS / 8, uqk = (NH + NKV) * uph;
    const int units = uqk + (copy ? NKV * HS / 8 : 0);
    const TI *src = in + n * W; /* (W) */
    kiln_bf16_t *dst = out + n * W; /* (W) */
    /* the first unit's load goes out before the angles are computed */
    int u = threadIdx.x;
    rope_unit r0 = {0, 0, false};
    float v[8], v2[8];
    bool have = false;
    for (; u < units; u += blockDim.x) {
        r0 = rope_unit_at<NEOX>(u, HS, half, rope_dim, uph, uqk);
        if (r0.rot || copy) break; /* in place, pass-through units need nothing */
    }
    if (u < units) {
        have = true;
        load8<TI>(v, src + r0.o0);
        if (NEOX && r0.rot) load8<TI>(v2, src + r0.o0 + half);
    }
    kiln_rope_angles(cos_t, sin_t, half, (float)(n % T), theta_scale, rf, sin_sign);
    __syncthreads();
    if (have) rope_unit_store<NEOX>(dst, r0, v, v2, cos_t, sin_t, half, rope_dim);
    for (u += blockDim.x; u < units; u += blockDim.x) {
        const rope_unit r = rope_unit_at<NEOX>(u, HS, half, rope_dim, uph, uqk);
        if (!r.rot && !copy) continue;
        load8<TI>(v, src + r.o0);
        if (NEOX && r.rot) load8<TI>(v2, src + r.o0 + half);
        rope_unit_store<NEOX>(dst, r, v, v2, cos_t, sin_t, half, rope_dim);
    }
}

/* The general path: a thread per pair unit of the NH + NKV heads: unit j < rope_dim / 2 of a head rotates
 * (x[a], x[b]), units past it pass the pair (rope_dim + 2 (j - rope_dim/2), +1) through; then v element-wise.
 * Each element is read and written by one thread, so in place is safe. */
template <typename TI, bool NEOX>
static __global__ void __launch_bounds__(ROPE_THREADS)
    rope_kernel(kiln_bf16_t *out /* (N, W) */, const TI *in /* (N, W), or out itself */, int64_t T, int NH, int NKV, int HS,
                int rope_dim, float theta_scale, kiln_cuda_rope_freq rf, float sin_sign, bool copy) {
    kiln_pdl_wait();
    kiln_pdl_trigger();
    __shared__ float cos_t[ROPE_MAX_HS / 2], sin_t[ROPE_MAX_HS / 2];
    const int64_t n = blockIdx.x, W = (int64_t)(NH + 2 * NKV) * HS;
    const int half = rope_dim / 2, hp = HS / 2;
    const TI *src = in + n * W;     /* (W) */
    kiln_bf16_t *dst = out + n * W; /* (W) */
    kiln_rope_angles(cos_t, sin_t, half, (float)(n % T), theta_scale, rf, sin_sign);
    __syncthreads();
    const int units = (NH + NKV) * hp;
    for (int u = threadIdx.x; u < units; u += blockDim.x) {
        const int h = u / hp, j = u - h * hp;
        const TI *x = src + h * HS; /* (HS) */
        kiln_bf16_t *y = dst + h * HS; /* (HS) */
        if (j < half) {
            const int a = NEOX ? j : 2 * j, b = NEOX ? j + half : 2 * j + 1;
            const float x0 = load_f32<TI>(x + a), x1 = load_f32<TI>(x + b), c = cos_t[j], sn = sin_t[j];
            y[a] = bf16_bits(__fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, sn)));
            y[b] = bf16_bits(__fadd_rn(__fmul_rn(x0, sn), __fmul_rn(x1, c)));
        } else if (copy) {
            const int a = rope_dim + 2 * (j - half);
            y[a] = bf16_bits(load_f32<TI>(x + a));
            y[a + 1] = bf16_bits(load_f32<TI>(x + a + 1));
        }
    }
    if (!copy) return;
    const int v0 = (NH + NKV) * HS, nv = NKV * HS;
    for (int i = threadIdx.x; i < nv; i += blockDim.x) dst[v0 + i] = bf16_bits(load_f32<TI>(src + v0 + i));
}

template <typename TI>
static kiln_status rope(const char *what, kiln_bf16_t *out, const TI *in, int64_t N, int64_t T, int64_t NH, int64_t NKV,
                        int64_t HS, int64_t rope_dim, float base, const float *h_freq, float mscale, bool neox, float sin_sign,
                        void *stream) {
    if (N < 0 || N > INT32_MAX || T <= 0 || NH <= 0 || NKV <= 0 || NH > 65536 || NKV > 65536 || HS <= 0 || HS % 2 ||
        HS > ROPE_MAX_HS || rope_dim <= 0 || rope_dim % 2 || rope_dim > HS || !(base > 0.0f) || !out || !in)
        return kiln_fail(KILN_ERR_INVALID, "cuda %s: N %lld, T %lld, NH %lld, NKV %lld, HS %lld (even, at most %d), rope_dim %lld, base %g",
                         what, (long long)N, (long long)T, (long long)NH, (long long)NKV, (long long)HS, ROPE_MAX_HS,
                         (long long)rope_dim, (double)base);
    if (N == 0) return KILN_OK;
    /* The host's powf, the very call ops_rope.c makes, so theta_scale has the CPU's bits. */
    const float theta_scale = powf(base, -2.0f / (float)rope_dim);
    const kiln_cuda_rope_freq rf = kiln_cuda_rope_freq_make(h_freq, rope_dim / 2, mscale);
    const bool copy = (const void *)out != (const void *)in; /* in place: v and the pass-through columns stay */
    const bool vec = HS % 8 == 0 && (!neox || rope_dim % 16 == 0) && aligned(out, 16) && aligned(in, 16);
    const int nh = (int)NH, nkv = (int)NKV, hs = (int)HS, rd = (int)rope_dim;
    int64_t units;
    if (vec) units = (NH + NKV) * (neox ? (HS - rope_dim / 2) / 8 : HS / 8) + (copy ? NKV * HS / 8 : 0);
    else units = (NH + NKV) * (HS / 2);
    int64_t threads = (units + 31) / 32 * 32;
    threads = threads < 32 ? 32 : threads > ROPE_THREADS ? ROPE_THREADS : threads;
    if (threads < rope_dim / 2) threads = (rope_dim / 2 + 31) / 32 * 32; /* the angle table wants no second round */
    const dim3 grid((unsigned)N), block((unsigned)threads);
    cudaStream_t s = (cudaStream_t)stream;
    cudaError_t e;
    if (vec)
        e = neox ? kiln_launch(rope_vec_kernel<TI, true>, grid, block, 0, s, out, in, T, nh, nkv, hs, rd, theta_scale, rf, sin_sign, copy)
                 : kiln_launch(rope_vec_kernel<TI, false>, grid, block, 0, s, out, in, T, nh, nkv, hs, rd, theta_scale, rf, sin_sign, copy);
    else
        e = neox ? kiln_launch(rope_kernel<TI, true>, grid, block, 0, s, out, in, T, nh, nkv, hs, rd, theta_scale, rf, sin_sign, copy)
                 : kiln_launch(rope_kernel<TI, false>, grid, block, 0, s, out, in, T, nh, nkv, hs, rd, theta_scale, rf, sin_sign, copy);
    return checked(what, e);
}

extern "C" kiln_status kiln_cuda_rope_forward_train(kiln_bf16_t *qkv_bf, const kiln_bf16_t *qkv, int64_t N, int64_t T, int64_t NH,
                                              int64_t NKV, int64_t HS, int64_t rope_dim, float base, const float *h_freq,
                                              float mscale, bool neox, void *stream) {
    return rope<kiln_bf16_t>("rope_forward", qkv_bf, qkv, N, T, NH, NKV, HS, rope_dim, base, h_freq, mscale, neox, 1.0f, stream);
}

extern "C" kiln_status kiln_cuda_rope_backward(kiln_bf16_t *dqkv_bf, const float *dqkv, int64_t N, int64_t T, int64_t NH,
                                               int64_t NKV, int64_t HS, int64_t rope_dim, float base, const float *h_freq,
                                               float mscale, bool neox, void *stream) {
    return rope<float>("rope_backward", dqkv_bf, dqkv, N, T, NH, NKV, HS, rope_dim, base, h_freq, mscale, neox, -1.0f, stream);
}

/* ---------------------------------------------------------------- SwiGLU (forward and backward)
 * gu, dh and the outputs are bf16, the math f32. Grid (column blocks, rows): thread x of block (bx, by) takes
 * column unit bx * blockDim + x of rows by, by + gridDim.y, ...: no division per element. A unit is 8 columns
 * (one 16-byte load or store per tensor) when F % 8 == 0 and the pointers are 16-byte aligned, else one column.
 * ops_swiglu.c's formulas:
 *   h = g / (1 + exp(-g)) * up
 *   sig = 1 / (1 + exp(-g)), dup = d * (g * sig), dgate = (d * up) * (sig * (1 + g * (1 - sig)))
 * Traffic at N 16384, F 2048: forward 134 MB read, 67 MB written (~47 us at 4.3 TB/s); backward 201 MB read,
 * 134 MB written (~78 us). */

#define SWIGLU_THREADS 256

static __device__ __forceinline__ float swiglu_fwd(float g, float u) {
    return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
}

static __device__ __forceinline__ void swiglu_bwd(float g, float u, float d, float *dg, float *du) {
    const float sig = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-g)));
    *du = __fmul_rn(d, __fmul_rn(g, sig));
    *dg = __fmul_rn(__fmul_rn(d, u), __fmul_rn(sig, __fadd_rn(1.0f, __fmul_rn(g, __fsub_rn(1.0f, sig)))));
}

template <bool VEC>
static __global__ void __launch_bounds__(SWIGLU_THREADS)
    swiglu_forward_kernel(kiln_bf16_t *h /* (N, F) */, const kiln_bf16_t *gu /* (N, 2F) */, int64_t N, int64_t F) {
    kiln_pdl_wait();
    kiln_pdl_trigger();
    const int64_t V = VEC ? 8 : 1, f = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * V;
    if (f >= F) return;
    for (int64_t n = blockIdx.y; n < N; n += gridDim.y) {
        const kiln_bf16_t *g = gu + n * 2 * F + f, *u = g + F; /* (V) each */
        if (VEC) {
            float a[8], b[8];
            load8<kiln_bf16_t>(a, g);
            load8<kiln_bf16_t>(b, u);
#pragma unroll
            for (int i = 0; i < 8; i++) a[i] = swiglu_fwd(a[i], b[i]);
            store8_bf16(h + n * F + f, a);
        } else {
            h[n * F + f] = bf16_bits(swiglu_fwd(bf16_f32(g[0]), bf16_f32(u[0])));
        }
    }
}

template <bool VEC>
static __global__ void __launch_bounds__(SWIGLU_THREADS)
    swiglu_backward_kernel(kiln_bf16_t *dgu /* (N, 2F) */, const kiln_bf16_t *dh /* (N, F) */, const kiln_bf16_t *gu /* (N, 2F) */,
                           int64_t N, int64_t F) {
    kiln_pdl_wait();
    kiln_pdl_trigger();
    const int64_t V = VEC ? 8 : 1, f = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * V;
    if (f >= F) return;
    for (int64_t n = blockIdx.y; n < N; n += gridDim.y) {
        const kiln_bf16_t *g = gu + n * 2 * F + f, *u = g + F, *d = dh + n * F + f; /* (V) each */
        kiln_bf16_t *dg = dgu + n * 2 * F + f, *du = dg + F;                        /* (V) each */
        if (VEC) {
            float a[8], b[8], c[8], og[8], ou[8];
            load8<kiln_bf16_t>(a, g);
            load8<kiln_bf16_t>(b, u);
            load8<kiln_bf16_t>(c, d);
#pragma unroll
            for (int i = 0; i < 8; i++) swiglu_bwd(a[i], b[i], c[i], &og[i], &ou[i]);
            store8_bf16(dg, og);
            store8_bf16(du, ou);
        } else {
            float g0, u0;
            swiglu_bwd(bf16_f32(g[0]), bf16_f32(u[0]), bf16_f32(d[0]), &g0, &u0);
            dg[0] = bf16_bits(g0);
            du[0] = bf16_bits(u0);
        }
    }
}

/* Block and grid for F columns in units of V over N rows (N > 0). */
static void swiglu_grid(int64_t N, int64_t F, int64_t V, dim3 *grid, dim3 *block) {
    const int64_t units = (F + V - 1) / V;
    int64_t t = (units + 31) / 32 * 32;
    t = t > SWIGLU_THREADS ? SWIGLU_THREADS : t;
    *block = dim3((unsigned)t);
    *grid = dim3((unsigned)((units + t - 1) / t), (unsigned)(N < 65535 ? N : 65535));
}

extern "C" kiln_status kiln_cuda_swiglu_forward_train(kiln_bf16_t *h, const kiln_bf16_t *gu, int64_t N, int64_t F, void *stream) {
    if (N < 0 || F <= 0 || F > INT32_MAX || (N > 0 && F > INT64_MAX / 2 / N))
        return kiln_fail(KILN_ERR_INVALID, "cuda swiglu_forward: N %lld, F %lld", (long long)N, (long long)F);
    if (N == 0) return KILN_OK;
    const bool vec = F % 8 == 0 && aligned(gu, 16) && aligned(h, 16);
    dim3 grid, block;
    swiglu_grid(N, F, vec ? 8 : 1, &grid, &block);
    cudaStream_t s = (cudaStream_t)stream;
    const cudaError_t e = vec ? kiln_launch(swiglu_forward_kernel<true>, grid, block, 0, s, h, gu, N, F)
                              : kiln_launch(swiglu_forward_kernel<false>, grid, block, 0, s, h, gu, N, F);
    return checked("swiglu_forward", e);
}

extern "C" kiln_status kiln_cuda_swiglu_backward(kiln_bf16_t *dgu, const kiln_bf16_t *dh, const kiln_bf16_t *gu, int64_t N,
                                                 int64_t F, void *stream) {
    if (N < 0 || F <= 0 || F > INT32_MAX || (N > 0 && F > INT64_MAX / 2 / N))
        return kiln_fail(KILN_ERR_INVALID, "cuda swiglu_backward: N %lld, F %lld", (long long)N, (long long)F);
    if (N == 0) return KILN_OK;
    const bool vec = F % 8 == 0 && aligned(gu, 16) && aligned(dh, 16) && aligned(dgu, 16);
    dim3 grid, block;
    swiglu_grid(N, F, vec ? 8 : 1, &grid, &block);
    cudaStream_t s = (cudaStream_t)stream;
    const cudaError_t e = vec ? kiln_launch(swiglu_backward_kernel<true>, grid, block, 0, s, dgu, dh, gu, N, F)
                              : kiln_launch(swiglu_backward_kernel<false>, grid, block, 0, s, dgu, dh, gu, N, F);
    return checked("swiglu_backward", e);
}

/* ---------------------------------------------------------------- to_bf16
 * out (n) = x (n) in bf16: float4 groups while the pointers allow (the tail one at a time). */
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
