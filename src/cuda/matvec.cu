/* matvec.cu: the decode matmuls (T = 1..8 tokens), y (T, O) = x (T, I) W^T for W in any GGUF type kiln computes,
 * streaming each weight byte once for all T tokens. The block formats follow llama.cpp's mmvq: matvec_prepare
 * quantizes x to int8 blocks of 32 with a scale, and every dot product is __dp4a on 4-byte groups of the weight's
 * quants against those int8s, accumulated in fp32. Float weights (F32, F16, BF16) read x as float.
 * tests/test_cuda_matvec.c checks every type, T in {1, 2, 3, 8}, add, and both GLU activations against the CPU
 * oracle (kiln_cpu_ops.matmul_forward) and a double-precision dot of the dequantized weights.
 *
 * Prepared activations (xp), for x (T, cols) with cols a multiple of 32, nbx = cols / 32 blocks per row:
 *   int8_t xq[T][cols]     q = roundf(x / d), the codes of each block of 32 (as GGML's quantize_row_q8_1)
 *   float2 xds[T][nbx]     at byte T * cols: {d, d * sum(q)} with d = amax / 127, kept in f32 (not f16 as q8_1)
 * xp must be 16-byte aligned (the kernels read xq with 16-byte loads); every block starts 32-byte aligned in it.
 * Since xds sits after T * cols codes, a matvec must be given the T its xp was prepared with.
 *
 * The pieces (each type's decoder) are in matvec_pieces.cuh, which tests/test_cuda_host.sh also compiles for the host.
 *
 * Work split: one CTA of 128 threads holds `groups` groups of gs = 32, 64 or 128 threads (gs grows with the row's
 * width so short rows of a 2048-wide model still fill the warps). A group computes NR weight rows together: each
 * thread takes "pieces" (32 or 64 weights of a row, the unit one thread decodes) p = lane, lane + gs, ... of all
 * NR rows, holds their decoded quants in registers, and then for each token loads x once and does NR dot
 * products, so x is read from L1/L2 once per NR rows (x is ~2.2 bytes per weight per token in prepared form, more
 * than a 4-bit weight, so this reuse keeps the L1 from becoming the limit at T = 8). Partial sums are reduced by
 * warp shuffles, then across the group's warps in shared memory (a one-warp group stores straight from the
 * shuffles). matvec_glu runs the same kernel with its NR rows being R rows of Wg and the same R rows of Wu.
 * Both kernels launch with programmatic dependent launch (launch.h): each waits for its predecessor before it
 * touches memory, so only the scheduling overlaps.
 * A tail (kiln_cuda_matvec_tail, kernels.h) runs the next step's prepare or residual norm inside the matvec, by the
 * CTA that completes the outputs it needs (mv_tail); tests/test_cuda_matvec.c checks it byte for byte against the
 * kernels it replaces. It is measured slower in this kernel of thousands of short CTAs (docs/cuda.md), so the
 * engine leaves it off. The same struct carries L2 prefetch spans (mv_prefetch): the grid's last CTAs start
 * fetching the next matmuls' weights into L2, where they arrive while the small kernels between run. */
#include "cuda/kernels.h"
#include "cuda/launch.h"
#include "cuda/matvec_pieces.cuh"
#include "cuda/norm.cuh"
#include "cuda/q8.cuh"
#include "quants.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <type_traits>

#include "status.h"

#define MV_THREADS 128 /* threads per CTA: 4 warps, 16 CTAs per SM at full occupancy */

/* ---------------------------------------------------------------- the kernel */

static __device__ __forceinline__ float act(float g, bool geglu) {
    if (geglu) return 0.5f * g * (1.0f + tanhf(0.7978845608f * (g + 0.044715f * g * g * g)));
    return g / (1.0f + expf(-g));
}

/* acc[j][t] += the dot of row j's piece p (w[j], loaded) with token t's x. */
template <class P, int T, int NR>
static __device__ __forceinline__ void mv_accumulate(float (&acc)[NR][T], const P (&w)[NR], const mv_args &a, int64_t p) {
#pragma unroll
    for (int t = 0; t < T; t++) {
        typename P::X x;
        P::load_x(x, a, t, p);
#pragma unroll
        for (int j = 0; j < NR; j++) acc[j][t] += w[j].dot(x);
    }
}

/* old = *p, *p += v: an acquire-release atomic at GPU scope (one round trip to L2, no separate fence). */
static __device__ __forceinline__ unsigned atom_add_acq_rel(unsigned *p, unsigned v) {
    unsigned old;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
}

/* The tail (kernels.h's kiln_cuda_mv_tail), after the CTA's stores of rows lo .. lo + n - 1: after a barrier, one
 * thread adds the CTA's rows to the counter of each unit it touched with a release (cumulative: it publishes the
 * stores the barrier ordered before it, as cooperative groups' grid sync does), and the CTA that completes a unit
 * (its acquire, then a barrier) runs the unit's epilogue, reading the other CTAs' outputs from L2 (__ldcg: never a
 * stale L1 line), and zeroes the counter for the next launch (attention.cu merges its splits the same way). */
template <int T>
static __device__ __forceinline__ void mv_tail(const mv_args &a, int64_t lo, int64_t n) {
    __shared__ int fin[2];
    __shared__ double red[MV_THREADS / 32];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    __syncthreads();
    /* the units are the blocks of 32 outputs (counters cnt[1 + b]); a CTA's rows, a power of two <= 32, lie in one or
     * two. For NORM the CTA that completes a block then counts it in cnt[0], so no counter sees more than 32 CTAs
     * or the row's blocks (C / 32) */
    const int64_t hi = lo + n < a.rows ? lo + n : a.rows, b0 = lo / 32;
    if (tid == 0)
        for (int u = 0; u < 2; u++) {
            const int64_t b = b0 + u, s = lo > 32 * b ? lo : 32 * b, e = hi < 32 * b + 32 ? hi : 32 * b + 32;
            fin[u] = 0;
            if (e <= s) continue;
            if (atom_add_acq_rel(&a.cnt[1 + b], (unsigned)(e - s)) + (unsigned)(e - s) == 32u) {
                a.cnt[1 + b] = 0;
                fin[u] = 1;
                if (a.tail == 2) {
                    fin[u] = atom_add_acq_rel(a.cnt, 1u) + 1u == (unsigned)(a.rows / 32);
                    if (fin[u]) *a.cnt = 0;
                }
            }
        }
    __syncthreads();
    if (a.tail == 1) {
        if (warp < 2 && fin[warp]) {
            float v[T];
#pragma unroll
            for (int t = 0; t < T; t++) v[t] = __ldcg(a.y + (int64_t)t * a.rows + 32 * (b0 + warp) + lane);
#pragma unroll
            for (int t = 0; t < T; t++) kiln_q8_store_warp(a.oq, a.ods, (size_t)(t * a.rows + 32 * (b0 + warp) + lane), v[t]);
        }
        return;
    }
    /* NORM, by the CTA that completed the last block: each row in float4s, 4 of them per thread at a time (C 4096:
     * two rounds of loads), the squares summed in double as residual_norm_kernel does; a block of 32 is 8 lanes'
     * float4s. */
    if (!fin[0] && !fin[1]) return;
    const int64_t C = a.rows, n4 = C / 4;
    for (int t = 0; t < T; t++) {
        const float4 *x4 = (const float4 *)(a.y + (int64_t)t * C);
        double ss = 0.0;
        for (int64_t c0 = 0; c0 < n4; c0 += 4 * MV_THREADS) {
            float4 v[4];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int64_t i = c0 + tid + j * MV_THREADS;
                v[j] = i < n4 ? __ldcg(x4 + i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
#pragma unroll
            for (int j = 0; j < 4; j++)
                ss += (double)__fmul_rn(v[j].x, v[j].x) + (double)__fmul_rn(v[j].y, v[j].y) +
                      (double)__fmul_rn(v[j].z, v[j].z) + (double)__fmul_rn(v[j].w, v[j].w);
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
        if (lane == 0) red[warp] = ss;
        __syncthreads();
        double sum = 0.0;
#pragma unroll
        for (int w = 0; w < MV_THREADS / 32; w++) sum += red[w];
        __syncthreads(); /* red is written again for the next row */
        const float sc = kiln_rms_scale(sum, C, a.eps);
        for (int64_t c0 = 0; c0 < n4; c0 += 4 * MV_THREADS) {
            float4 v[4], w4[4];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int64_t i = c0 + tid + j * MV_THREADS;
                v[j] = i < n4 ? __ldcg(x4 + i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                w4[j] = i < n4 ? __ldg((const float4 *)a.nw + i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int64_t i = c0 + tid + j * MV_THREADS;
                const float o[4] = {__fmul_rn(__fmul_rn(v[j].x, sc), w4[j].x), __fmul_rn(__fmul_rn(v[j].y, sc), w4[j].y),
                                    __fmul_rn(__fmul_rn(v[j].z, sc), w4[j].z), __fmul_rn(__fmul_rn(v[j].w, sc), w4[j].w)};
                const bool ok = i < n4; /* C % 32 == 0: the 8 lanes of a block are all in or all out */
                if (ok) *(float4 *)(a.xb + (int64_t)t * C + 4 * i) = make_float4(o[0], o[1], o[2], o[3]);
                kiln_q8_store_group<4>(o, ok, a.oq + t * C + 4 * i, a.ods + (t * C + 4 * i) / 32);
            }
        }
    }
}

/* The L2 prefetch (kiln_cuda_mv_tail's pf): warp 0 of each of the grid's last a.pf_ctas CTAs, which the scheduler
 * starts in the last wave, issues its share of MV_PF_CHUNK-byte bulk prefetches, lane by lane, before it waits for
 * the previous kernel (the spans are weights, which no kernel writes). The data arrive in L2 while the last wave
 * drains and the small kernels after the matvec run, and the next matmuls read them from there. */
#define MV_PF_CHUNK 16384
static_assert(KILN_CUDA_PF_SPANS == 4, "mv_args holds 4 prefetch spans");
static __device__ __forceinline__ void mv_prefetch(const mv_args &a) {
    const int first = (int)gridDim.x - a.pf_ctas;
    if ((int)blockIdx.x < first || threadIdx.x >= 32) return;
    const size_t g = (size_t)((int)blockIdx.x - first) * 32 + threadIdx.x, stride = (size_t)a.pf_ctas * 32;
#pragma unroll
    for (int i = 0; i < 4; i++)
        for (size_t c = g * MV_PF_CHUNK; c < a.pf_bytes[i]; c += stride * MV_PF_CHUNK) {
            const size_t n = a.pf_bytes[i] - c < MV_PF_CHUNK ? a.pf_bytes[i] - c : MV_PF_CHUNK;
            asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(a.pf[i] + c), "r"((unsigned)n) : "memory");
        }
}

/* The prologue (PRE; mv_args' pre_*, kernels.h's kiln_cuda_mv_tail): x's prepared form for one token, made by the
 * CTA into shared memory (sq: cols codes, sds: cols / 32 {d, d * sum}) after its PDL wait, while the weights it
 * loaded before the wait are in flight. Without pre_w the float4 at i goes to the 8 lanes of its block (as the
 * residual norm's accesses), through kiln_q8_store_group: matvec_prepare's bytes (q8.cuh). With pre_w it is
 * residual_norm_kernel's RMSNorm (MAXN 4 float4s a thread, pre_ntv threads) replayed by 128: thread tid plays its
 * threads tid and tid + 128 (pre_ntv <= 256, C <= 4096), sums their squares in their order, and the warps' totals are
 * added in that kernel's warp order, so the scale and every code are its bits. CTA 0 (of the whole grid) then writes
 * xb and copies the prepared bytes out, leaving what the separate kernel would. Ends with a barrier. */
#define MV_PRE_MAXN 4
static __device__ __forceinline__ void mv_pre(const mv_args &a, int8_t *sq, float2 *sds) {
    __shared__ double sh[2 * MV_THREADS / 32];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, n4 = (int)(a.cols / 4);
    const bool first = blockIdx.x == 0;
    const float4 *x4 = (const float4 *)a.pre_x;
    const float4 z = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (!a.pre_w) {
        for (int c0 = 0; c0 < n4; c0 += MV_THREADS) { /* uniform bound: every lane reaches the shuffles */
            const int i = c0 + tid;
            const bool ok = i < n4;
            const float4 v = ok ? __ldcg(x4 + i) : z;
            const float o[4] = {v.x, v.y, v.z, v.w};
            kiln_q8_store_group<4>(o, ok, sq + 4 * i, sds + i / 8);
        }
    } else {
        const int ntv = a.pre_ntv;
        float4 xv[2][MV_PRE_MAXN];
        double ss[2];
#pragma unroll
        for (int m = 0; m < 2; m++) {
            const int v = tid + m * MV_THREADS;
            ss[m] = 0.0;
#pragma unroll
            for (int j = 0; j < MV_PRE_MAXN; j++) {
                const int i = v + j * ntv;
                const bool ok = v < ntv && i < n4;
                xv[m][j] = ok ? __ldcg(x4 + i) : z;
                if (ok) {
                    ss[m] += (double)__fmul_rn(xv[m][j].x, xv[m][j].x);
                    ss[m] += (double)__fmul_rn(xv[m][j].y, xv[m][j].y);
                    ss[m] += (double)__fmul_rn(xv[m][j].z, xv[m][j].z);
                    ss[m] += (double)__fmul_rn(xv[m][j].w, xv[m][j].w);
                }
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) ss[m] += __shfl_xor_sync(0xffffffffu, ss[m], o);
            if (lane == 0 && v < ntv) sh[warp + m * (MV_THREADS / 32)] = ss[m];
        }
        __syncthreads();
        double sum = 0.0;
        for (int w = 0; w < ntv / 32; w++) sum += sh[w];
        const float sc = kiln_rms_scale(sum, a.cols, a.pre_eps);
        const float4 *w4 = (const float4 *)a.pre_w;
#pragma unroll
        for (int m = 0; m < 2; m++) {
            const int v = tid + m * MV_THREADS;
            if (v >= ntv) continue; /* whole warps: ntv is a multiple of 32 */
#pragma unroll
            for (int j = 0; j < MV_PRE_MAXN; j++) {
                if (j * ntv >= n4) break; /* the same for the whole warp */
                const int i = v + j * ntv;
                const bool ok = i < n4;
                const float4 wv = ok ? __ldg(w4 + i) : z;
                const float o[4] = {ok ? __fmul_rn(__fmul_rn(xv[m][j].x, sc), wv.x) : 0.0f, ok ? __fmul_rn(__fmul_rn(xv[m][j].y, sc), wv.y) : 0.0f,
                                    ok ? __fmul_rn(__fmul_rn(xv[m][j].z, sc), wv.z) : 0.0f, ok ? __fmul_rn(__fmul_rn(xv[m][j].w, sc), wv.w) : 0.0f};
                if (first && ok && a.pre_xb) *(float4 *)(a.pre_xb + 4 * i) = make_float4(o[0], o[1], o[2], o[3]);
                kiln_q8_store_group<4>(o, ok, sq + 4 * i, sds + i / 8);
            }
        }
    }
    __syncthreads();
    if (first) {
        const int nq = (int)(a.cols / 16), nb = (int)(a.cols / 32);
        for (int i = tid; i < nq; i += MV_THREADS) ((int4 *)a.pre_oq)[i] = ((const int4 *)sq)[i];
        for (int i = tid; i < nb; i += MV_THREADS) a.pre_ods[i] = sds[i];
    }
}

/* NR weight rows per group: R output rows of W (GLU false), or R rows of Wg then the same R rows of Wu (GLU true,
 * NR = 2R). Output row o = (blockIdx.x * groups + group) * R + j. */
/* The CTA of index bid of a matvec over a (matvec_kernel: blockIdx.x; matvec_pair_kernel: its index in its part). */
template <class P, int T, int NR, bool GLU, bool PRE, bool TWO = false>
static __device__ __forceinline__ void matvec_cta(const mv_args &a, int64_t bid) {
    static_assert(!PRE || T == 1, "the prologue prepares one token");
    const int R = GLU ? NR / 2 : NR;
    __shared__ float red[MV_THREADS / 32][NR * T];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int gs = a.gs, groups = MV_THREADS / gs, group = tid / gs, k0 = tid % gs;
    const int64_t row0 = (bid * groups + group) * R;

    const uint8_t *wrow[NR];
#pragma unroll
    for (int j = 0; j < NR; j++) {
        const int jr = GLU ? j % R : j;
        int64_t o = row0 + jr;
        if (o >= a.rows) o = a.rows - 1; /* past the last row: read a real row, store nothing */
        wrow[j] = a.w[GLU && j >= R ? 1 : 0] + o * a.row_bytes;
    }

    float acc[NR][T];
#pragma unroll
    for (int j = 0; j < NR; j++)
#pragma unroll
        for (int t = 0; t < T; t++) acc[j][t] = 0.0f;
    if (a.pf_ctas) mv_prefetch(a);

    /* The weights are constant, so the thread's first pieces are loaded before the PDL wait, while the previous
     * kernel (the norm, the attention) still runs: only x comes from it. The first piece is peeled off the loop
     * (loading each next piece at the bottom of one loop took 20-60% more registers). */
    if constexpr (PRE) { /* the same, with the prologue between the wait and the first dot; x from shared memory */
        extern __shared__ uint4 mv_dyn[];
        int8_t *sq = (int8_t *)mv_dyn;
        float2 *sds = (float2 *)(sq + a.cols);
        mv_args ax = a;
        ax.xq = sq, ax.xds = sds;
        const bool has0 = k0 < a.ppr;
        P w[NR];
        if (has0)
#pragma unroll
            for (int j = 0; j < NR; j++) w[j].load(wrow[j], k0);
        kiln_pdl_wait();
        kiln_pdl_trigger();
        mv_pre(a, sq, sds);
        if (has0) mv_accumulate<P, T, NR>(acc, w, ax, k0);
        for (int64_t p = k0 + gs; p < a.ppr; p += gs) {
            P wn[NR];
#pragma unroll
            for (int j = 0; j < NR; j++) wn[j].load(wrow[j], p);
            mv_accumulate<P, T, NR>(acc, wn, ax, p);
        }
    } else if constexpr (TWO) { /* a row of at most 2 gs pieces: both of the thread's pieces loaded before the wait */
        const bool has0 = k0 < a.ppr, has1 = k0 + gs < a.ppr;
        P w[NR], w2[NR];
        if (has0)
#pragma unroll
            for (int j = 0; j < NR; j++) w[j].load(wrow[j], k0);
        if (has1)
#pragma unroll
            for (int j = 0; j < NR; j++) w2[j].load(wrow[j], k0 + gs);
        kiln_pdl_wait();
        kiln_pdl_trigger();
        if (has0) mv_accumulate<P, T, NR>(acc, w, a, k0);
        if (has1) mv_accumulate<P, T, NR>(acc, w2, a, k0 + gs);
    } else {
        if (k0 < a.ppr) {
            P w[NR];
#pragma unroll
            for (int j = 0; j < NR; j++) w[j].load(wrow[j], k0);
            kiln_pdl_wait();
            kiln_pdl_trigger();
            mv_accumulate<P, T, NR>(acc, w, a, k0);
        } else {
            kiln_pdl_wait();
            kiln_pdl_trigger();
        }
        for (int64_t p = k0 + gs; p < a.ppr; p += gs) {
            P w[NR];
#pragma unroll
            for (int j = 0; j < NR; j++) w[j].load(wrow[j], p);
            mv_accumulate<P, T, NR>(acc, w, a, p);
        }
    }

#pragma unroll
    for (int j = 0; j < NR; j++)
#pragma unroll
        for (int t = 0; t < T; t++)
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) acc[j][t] += __shfl_xor_sync(0xffffffffu, acc[j][t], off);

    if (gs == 32) { /* a group is one warp: every lane holds every sum, lane (j * T + t) % 32 stores (j, t) */
#pragma unroll
        for (int j = 0; j < R; j++) {
            const int64_t o = row0 + j;
#pragma unroll
            for (int t = 0; t < T; t++) {
                if (lane != (j * T + t) % 32 || o >= a.rows) continue;
                float *out = a.y + (int64_t)t * a.rows + o;
                if (GLU) *out = act(acc[j][t], a.geglu) * acc[j + R][t];
                else *out = a.add ? *out + acc[j][t] : acc[j][t];
            }
        }
        if (a.tail) mv_tail<T>(a, bid * groups * R, (int64_t)groups * R);
        return;
    }

    if (lane == 0)
#pragma unroll
        for (int j = 0; j < NR; j++)
#pragma unroll
            for (int t = 0; t < T; t++) red[warp][j * T + t] = acc[j][t];
    __syncthreads();

    /* One thread per (group, output row, token): sum the group's warps, then store. */
    const int wpg = gs / 32, per_group = R * T;
    for (int k = tid; k < groups * per_group; k += MV_THREADS) {
        const int g = k / per_group, rem = k % per_group, j = rem / T, t = rem % T;
        const int64_t o = (bid * groups + g) * R + j;
        if (o >= a.rows) continue;
        float v = 0.0f, u = 0.0f;
        for (int w = 0; w < wpg; w++) {
            v += red[g * wpg + w][j * T + t];
            if (GLU) u += red[g * wpg + w][(j + R) * T + t];
        }
        float *out = a.y + (int64_t)t * a.rows + o;
        if (GLU) *out = act(v, a.geglu) * u;
        else *out = a.add ? *out + v : v;
    }
    if (a.tail) mv_tail<T>(a, bid * groups * R, (int64_t)groups * R);
}

template <class P, int T, int NR, bool GLU, bool PRE, bool TWO = false>
__global__ void __launch_bounds__(MV_THREADS) matvec_kernel(const mv_args a) {
    matvec_cta<P, T, NR, GLU, PRE, TWO>(a, blockIdx.x);
}

/* Two matvecs of one token over the same prepared x in one launch (kiln_cuda_matvec_pair): CTAs 0 .. grid1 - 1
 * are a1's, the rest a2's, each exactly the CTA its own launch would run. No tail, no prefetch. */
template <class P1, int NR1, class P2, int NR2, bool PRE>
__global__ void __launch_bounds__(MV_THREADS) matvec_pair_kernel(const mv_args a1, const mv_args a2, int grid1) {
    if ((int)blockIdx.x < grid1) matvec_cta<P1, 1, NR1, false, PRE>(a1, blockIdx.x);
    else matvec_cta<P2, 1, NR2, false, PRE>(a2, (int64_t)blockIdx.x - grid1);
}

/* q8 blocks of x, one warp per block of 32: xq[32 i + lane], xds[i] for block i = t * nbx + kb. */
__global__ void matvec_prepare_kernel(const float *x, int8_t *xq, float2 *xds, int64_t n_blocks) {
    kiln_pdl_wait();
    kiln_pdl_trigger();
    const int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (i >= n_blocks) return; /* whole warps leave together: blockDim is a multiple of 32 */
    kiln_q8_store_warp(xq, xds, (size_t)(32 * i + lane), x[32 * i + lane]);
}

/* ---------------------------------------------------------------- launchers */

/* Weight rows per thread: 2 up to T = 4 (x read once per 2 rows, a grid of rows / 2 groups), 4 from T = 5 on for
 * the 32- and 8-weight pieces, where x traffic (T * ~2.2 bytes per weight) would otherwise outrun the L1. The GLU's
 * rows count Wg and Wu. Threads per group: as many as the row has pieces, up to 128, so every thread gets one
 * where it can; except for the 64-weight pieces of the K-quants from T = 4 on when there are >= 2048 groups
 * (15.5 warps per SM): one warp per group then, which skips the shared-memory reduction (measured on the H200,
 * bench gpu-kernels: 7B Q4_K and Q6_K at T = 4 and 8, 5-15% faster; with 1024 groups, the 1.1B down, slower). */
/* One token's matvec (T 1) over a large weight (cols >= 4096 and >= 2^24 elements: every weight of a 7B) takes
 * twice the rows per group, x read once per 4 weight rows (2 for the GLU). Measured on an H100 (bench gpu-kernels,
 * T 1): 5-20% faster on most 7B shapes; kiln bench --gpu tg128, every T 1 matvec so: 7B Q4_K_M 397.8 -> 418.5
 * tok/s, 1.1B 1,112 -> 1,105, 124M 2,978 -> 2,813, hence only the large weights (docs/cuda.md).
 * Tuning switches for bench gpu-kernels' experiments, read once: KILN_MATVEC_WIDE=1 (0) takes (leaves) the wide
 * groups for every T 1 matvec; KILN_MATVEC_GS=32|64|128 fixes the threads per group. Unset, the rules here. */
struct mv_tuning {
    int wide; /* -1: by the weight's size */
    int gs;
};

static mv_tuning mv_tune_read(void) {
    mv_tuning t;
    const char *w = getenv("KILN_MATVEC_WIDE"), *g = getenv("KILN_MATVEC_GS");
    t.wide = !w ? -1 : strcmp(w, "1") == 0 ? 1 : strcmp(w, "0") == 0 ? 0 : -1;
    t.gs = g ? atoi(g) : 0;
    if (t.gs != 32 && t.gs != 64 && t.gs != 128) t.gs = 0;
    return t;
}

static mv_tuning mv_tune(void) {
    static const mv_tuning t = mv_tune_read(); /* initialized once, thread-safe */
    return t;
}

/* a.gs for R rows a group and T tokens; the grid that covers a.rows. */
template <class P, int T>
static int64_t mv_shape(mv_args &a, int R) {
    const mv_tuning tune = mv_tune();
    a.gs = a.ppr >= 96 ? 128 : a.ppr > 32 ? 64 : 32;
    if (P::ELEMS == 64 && T >= 4 && a.rows / R >= 2048) a.gs = 32;
    if (tune.gs) a.gs = tune.gs;
    const int64_t rows_per_cta = (int64_t)(MV_THREADS / a.gs) * R;
    return (a.rows + rows_per_cta - 1) / rows_per_cta;
}

/* KILN_MV_TWO, read at every call: 0 never loads a thread's two pieces of a row before the wait, 1 always does (where
 * a row is two pieces a thread), anything else (the default, -1) where the grid fits in one wave (mv_one_wave). */
static int mv_two(void) {
    const char *v = getenv("KILN_MV_TWO");
    return !v ? -1 : strcmp(v, "0") == 0 ? 0 : strcmp(v, "1") == 0 ? 1 : -1;
}

/* Whether a grid of kern's CTAs is resident at once on the current device. The two pieces a thread take registers,
 * so where CTAs wait for a second wave they cost more than the early loads give (7B's down projection, 1,024 CTAs:
 * -5% tok/s); within one wave the SMs have room, and the loads shorten the step (1.1B's, 512 CTAs: +3%; run42). */
template <class K> static bool mv_one_wave(K kern, int64_t grid) {
    int dev = 0, sms = 0, per = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, kern, MV_THREADS, 0) != cudaSuccess)
        return false;
    return grid <= (int64_t)sms * per;
}

/* One token's rows a group (launch_t's rule at T 1, GLU off): 4 for a large weight, else 2. */
static int mv_rows_t1(const mv_args &a) {
    const int wide = mv_tune().wide;
    return wide == 1 || (wide < 0 && a.cols >= 4096 && a.rows * a.cols >= ((int64_t)1 << 24)) ? 4 : 2;
}

/* The piece types built with the prologue (kiln_cuda_matvec_pre_takes): the types of the common GGUF files. */
template <class P> static constexpr bool mv_pre_piece(void) {
    return std::is_same<P, piece_q4_0>::value || std::is_same<P, piece_q8_0>::value || std::is_same<P, piece_q4_K>::value ||
           std::is_same<P, piece_q5_K>::value || std::is_same<P, piece_q6_K>::value;
}

/* Dynamic shared bytes of the prologue: one token's codes and block scales. */
static size_t mv_pre_smem(int64_t cols) { return (size_t)cols + (size_t)(cols / 32) * sizeof(float2); }

/* TWO: a thread's two pieces loaded before the wait, where a row is two pieces a thread and (unless forced) the grid
 * is one wave; else the plain kernel. */
template <class P, int T, int R, bool GLU, bool PRE, bool TWO = false>
static kiln_status launch_r(mv_args a, cudaStream_t s, bool force = false) {
    const int64_t grid = mv_shape<P, T>(a, R);
    if (grid > INT32_MAX) return kiln_fail(KILN_ERR_INVALID, "cuda matvec: %lld rows is too many", (long long)a.rows);
    if (a.pf_ctas > grid) a.pf_ctas = (int)grid;
    void (*kern)(const mv_args) = matvec_kernel<P, T, GLU ? 2 * R : R, GLU, PRE, TWO>;
    if constexpr (TWO) {
        if (a.ppr <= a.gs || a.ppr > 2 * a.gs || (!force && !mv_one_wave(kern, grid))) return launch_r<P, T, R, GLU, PRE, false>(a, s);
    }
    const cudaError_t e = kiln_launch(kern, dim3((unsigned)grid), dim3(MV_THREADS), PRE ? mv_pre_smem(a.cols) : 0, s, a);
    return e == cudaSuccess ? KILN_OK : kiln_fail(KILN_ERR_IO, "CUDA matvec launch failed: %s", cudaGetErrorString(e));
}

template <class P, int T, bool GLU>
static kiln_status launch_t(mv_args a, cudaStream_t s) {
    /* output rows per group; the 64-weight pieces of the K-quants hold 16+ words a row, so 4 rows of them would
     * take ~170 registers (2 CTAs per SM) from T 2 on: they stay at 2 */
    if constexpr (T == 1 && mv_pre_piece<P>()) {
        if (a.pre_x) {
            if (mv_rows_t1(a) == 4) return launch_r<P, T, GLU ? 2 : 4, GLU, true>(a, s);
            return launch_r<P, T, GLU ? 1 : 2, GLU, true>(a, s);
        }
    }
    if (a.pre_x) return kiln_fail(KILN_ERR_UNSUPPORTED, "cuda matvec: no prologue for this type at T %d", T);
    if constexpr (T == 1 && mv_pre_piece<P>()) { /* a thread's two pieces before the wait, where mv_two says */
        const int two = mv_two();
        if (two && mv_rows_t1(a) == 4) return launch_r<P, T, GLU ? 2 : 4, GLU, false, true>(a, s, two == 1);
        if (two) return launch_r<P, T, GLU ? 1 : 2, GLU, false, true>(a, s, two == 1);
    }
    if (T == 1 && mv_rows_t1(a) == 4) return launch_r<P, T, GLU ? 2 : 4, GLU, false>(a, s);
    return launch_r<P, T, (T <= 4 || P::ELEMS == 64) ? (GLU ? 1 : 2) : (GLU ? 2 : 4), GLU, false>(a, s);
}

template <class P, bool GLU>
static kiln_status launch_p(mv_args a, int64_t T, cudaStream_t s) {
    a.ppr = a.cols / P::ELEMS;
    switch (T) {
    case 1: return launch_t<P, 1, GLU>(a, s);
    case 2: return launch_t<P, 2, GLU>(a, s);
    case 3: return launch_t<P, 3, GLU>(a, s);
    case 4: return launch_t<P, 4, GLU>(a, s);
    case 5: return launch_t<P, 5, GLU>(a, s);
    case 6: return launch_t<P, 6, GLU>(a, s);
    case 7: return launch_t<P, 7, GLU>(a, s);
    default: return launch_t<P, 8, GLU>(a, s);
    }
}

static bool aligned(const void *p, uintptr_t n) { return ((uintptr_t)p & (n - 1)) == 0; }

extern "C" bool kiln_cuda_matvec_pre_takes(const kiln_cuda_wt *W, int64_t T, bool normed) {
    if (!W || T != 1 || W->cols < 32 || W->cols % 32 || W->cols > (normed ? KILN_CUDA_MV_PRE_NORM_MAX_COLS : KILN_CUDA_MV_PRE_MAX_COLS)) return false;
    switch (W->type) {
    case KILN_TYPE_Q4_0: case KILN_TYPE_Q8_0: case KILN_TYPE_Q4_K: case KILN_TYPE_Q5_K: case KILN_TYPE_Q6_K: return true;
    default: return false;
    }
}

/* a's prologue fields from pre (kernels.h's kiln_cuda_mv_tail), the threads of the norm kernel it replays among
 * them: a row of C = 4 n floats (C <= KILN_CUDA_MV_PRE_NORM_MAX_COLS) takes at most 4 float4s a thread there. */
static kiln_status mv_pre_args(const char *op, mv_args &a, const kiln_cuda_wt *W, int64_t T, const void *xp,
                               const kiln_cuda_mv_tail *pre) {
    const bool normed = pre->pre_w != NULL;
    if (!kiln_cuda_matvec_pre_takes(W, T, normed))
        return kiln_fail(KILN_ERR_UNSUPPORTED, "cuda %s: no%s prologue for %s over %lld columns at T %lld (one token of q4_0, "
                         "q8_0, q4_K, q5_K or q6_K, a multiple of 32 columns, at most %d)", op, normed ? " normed" : "",
                         kiln_type_name(W->type) ? kiln_type_name(W->type) : "?", (long long)W->cols, (long long)T,
                         normed ? KILN_CUDA_MV_PRE_NORM_MAX_COLS : KILN_CUDA_MV_PRE_MAX_COLS);
    if (!xp || !aligned(xp, 16) || !aligned(pre->pre_x, 16) || !aligned(pre->pre_w, 16) || !aligned(pre->pre_xb, 16))
        return kiln_fail(KILN_ERR_INVALID, "cuda %s: a prologue needs xp to write and x, w, xb 16-byte aligned", op);
    const int n = (int)(W->cols / 4);
    a.pre_x = pre->pre_x, a.pre_w = pre->pre_w, a.pre_eps = pre->pre_eps, a.pre_xb = normed ? pre->pre_xb : NULL;
    a.pre_ntv = kiln_cuda_norm_threads(n, 4);
    a.pre_oq = (int8_t *)xp;
    a.pre_ods = (float2 *)((int8_t *)xp + W->cols);
    return KILN_OK;
}

template <bool GLU>
static kiln_status matvec_dispatch(const char *op, float *y, const float *x, const void *xp, const kiln_cuda_wt *W,
                                   const kiln_cuda_wt *Wu, int64_t T, bool add, bool geglu, const kiln_cuda_mv_tail *tail,
                                   cudaStream_t s) {
    if (!y || !W || !W->data || (GLU && (!Wu || !Wu->data)))
        return kiln_fail(KILN_ERR_INVALID, "cuda %s: NULL output or weight", op);
    if (T < 1 || T > KILN_CUDA_MATVEC_MAX_T)
        return kiln_fail(KILN_ERR_INVALID, "cuda %s: T = %lld is outside 1..%d", op, (long long)T, KILN_CUDA_MATVEC_MAX_T);
    if (GLU && (Wu->type != W->type || Wu->rows != W->rows || Wu->cols != W->cols || Wu->row_bytes != W->row_bytes))
        return kiln_fail(KILN_ERR_INVALID, "cuda %s: gate and up weights differ in type or shape", op);
    const char *tn = kiln_type_name(W->type) ? kiln_type_name(W->type) : "?";
    const size_t rb = kiln_type_row_bytes(W->type, W->cols);
    if (W->rows < 1 || W->cols < 1 || rb == 0 || W->row_bytes < rb)
        return kiln_fail(KILN_ERR_INVALID, "cuda %s: bad %s weight of %lld x %lld (row_bytes %zu)", op, tn,
                         (long long)W->rows, (long long)W->cols, W->row_bytes);
    mv_args a = {};
    a.w[0] = (const uint8_t *)W->data;
    a.w[1] = (const uint8_t *)(GLU ? Wu->data : W->data);
    a.row_bytes = W->row_bytes, a.rows = W->rows, a.cols = W->cols, a.y = y, a.add = add, a.geglu = geglu;
    if (tail && tail->kind != KILN_CUDA_TAIL_NONE) {
        const bool norm = tail->kind == KILN_CUDA_TAIL_NORM;
        if ((tail->kind != KILN_CUDA_TAIL_PREPARE && !norm) || !tail->cnt || !tail->xp || !aligned(tail->xp, 16) ||
            tail->xp == xp || W->rows % 32 || !aligned(y, 16) || (norm && (!tail->xb || !tail->w || !aligned(tail->xb, 16) ||
                                                                           !aligned(tail->w, 16))))
            return kiln_fail(KILN_ERR_INVALID, "cuda %s: a tail needs %lld rows a multiple of 32, its own 16-byte aligned xp, "
                             "counters, and for the norm xb and w", op, (long long)W->rows);
        a.tail = norm ? 2 : 1;
        a.cnt = tail->cnt;
        a.oq = (int8_t *)tail->xp;
        a.ods = (float2 *)((int8_t *)tail->xp + T * W->rows);
        a.xb = tail->xb, a.nw = tail->w, a.eps = tail->eps;
    }
    if (tail) {
        int n = 0;
        for (int i = 0; i < KILN_CUDA_PF_SPANS; i++) {
            if (!tail->pf[i] || !tail->pf_bytes[i]) continue;
            if (!aligned(tail->pf[i], 16) || tail->pf_bytes[i] % 16)
                return kiln_fail(KILN_ERR_INVALID, "cuda %s: a prefetch span must be 16-byte aligned and a multiple of 16 "
                                 "bytes (%zu)", op, tail->pf_bytes[i]);
            a.pf[n] = (const uint8_t *)tail->pf[i], a.pf_bytes[n++] = tail->pf_bytes[i];
        }
        a.pf_ctas = n ? 128 : 0; /* capped by the grid in launch_r */
        if (tail->pre_x) TRY(mv_pre_args(op, a, W, T, xp, tail));
    }
    const bool is_float = W->type == KILN_TYPE_F32 || W->type == KILN_TYPE_F16 || W->type == KILN_TYPE_BF16;
    if (is_float) {
        if (!x) return kiln_fail(KILN_ERR_INVALID, "cuda %s: %s weights need the float x", op, tn);
        a.xf = x;
        const bool vec = W->cols % 8 == 0 && aligned(x, 16) && aligned(a.w[0], 16) && aligned(a.w[1], 16) &&
                         W->row_bytes % 16 == 0;
        switch (W->type) {
        case KILN_TYPE_F32: return vec ? launch_p<piece_float<KILN_TYPE_F32, true>, GLU>(a, T, s)
                                       : launch_p<piece_float<KILN_TYPE_F32, false>, GLU>(a, T, s);
        case KILN_TYPE_F16: return vec ? launch_p<piece_float<KILN_TYPE_F16, true>, GLU>(a, T, s)
                                       : launch_p<piece_float<KILN_TYPE_F16, false>, GLU>(a, T, s);
        default: return vec ? launch_p<piece_float<KILN_TYPE_BF16, true>, GLU>(a, T, s)
                            : launch_p<piece_float<KILN_TYPE_BF16, false>, GLU>(a, T, s);
        }
    }
    /* Block formats: 16-byte loads of xq, 4-, 8- and 16-byte loads of the blocks (Q4_K/Q5_K rows are 144/176 bytes
     * a block, multiples of 16; IQ4_XS 136, of 8; Q4_1, Q5_1, Q2_K 20, 24, 84, of 4). */
    if (!xp || !aligned(xp, 16))
        return kiln_fail(KILN_ERR_INVALID, "cuda %s: %s weights need prepared activations, 16-byte aligned", op, tn);
    size_t row_align = 2;
    switch (W->type) {
    case KILN_TYPE_Q4_K: case KILN_TYPE_Q5_K: row_align = 16; break;
    case KILN_TYPE_IQ4_XS: row_align = 8; break;
    case KILN_TYPE_Q4_1: case KILN_TYPE_Q5_1: case KILN_TYPE_Q2_K: row_align = 4; break;
    default: break; /* the 18-, 22-, 34-, 110- and 210-byte blocks: 2 */
    }
    if (!aligned(a.w[0], 16) || !aligned(a.w[1], 16) || W->row_bytes % row_align)
        return kiln_fail(KILN_ERR_INVALID, "cuda %s: %s weight data must be 16-byte aligned, rows %zu-byte aligned", op, tn,
                         row_align);
    a.xq = (const int8_t *)xp;
    a.xds = (const float2 *)((const int8_t *)xp + T * W->cols);
    switch (W->type) {
    case KILN_TYPE_Q4_0: return launch_p<piece_q4_0, GLU>(a, T, s);
    case KILN_TYPE_Q4_1: return launch_p<piece_q4_1, GLU>(a, T, s);
    case KILN_TYPE_Q5_0: return launch_p<piece_q5_0, GLU>(a, T, s);
    case KILN_TYPE_Q8_0: return launch_p<piece_q8_0, GLU>(a, T, s);
    case KILN_TYPE_Q4_K: return launch_p<piece_q4_K, GLU>(a, T, s);
    case KILN_TYPE_Q5_K: return launch_p<piece_q5_K, GLU>(a, T, s);
    case KILN_TYPE_Q6_K: return launch_p<piece_q6_K, GLU>(a, T, s);
    case KILN_TYPE_Q5_1: return launch_p<piece_q5_1, GLU>(a, T, s);
    case KILN_TYPE_IQ4_NL: return launch_p<piece_iq4_nl, GLU>(a, T, s);
    case KILN_TYPE_Q2_K: return launch_p<piece_q2_K, GLU>(a, T, s);
    case KILN_TYPE_Q3_K: return launch_p<piece_q3_K, GLU>(a, T, s);
    case KILN_TYPE_IQ4_XS: return launch_p<piece_iq4_xs, GLU>(a, T, s);
    default: return kiln_fail(KILN_ERR_UNSUPPORTED, "cuda %s: type %s is not supported", op, tn);
    }
}

extern "C" size_t kiln_cuda_matvec_prep_bytes(int64_t T, int64_t cols) {
    if (T < 1 || cols < 1) return 0;
    const int64_t nbx = (cols + 31) / 32; /* cols not a multiple of 32: covered anyway, though never filled */
    return (size_t)T * (size_t)(32 * nbx) + (size_t)T * (size_t)nbx * sizeof(float2);
}

extern "C" kiln_status kiln_cuda_matvec_prepare(void *xp, const float *x, int64_t T, int64_t cols, void *stream) {
    if (T < 1 || cols < 1) return kiln_fail(KILN_ERR_INVALID, "cuda matvec_prepare: T = %lld, cols = %lld", (long long)T, (long long)cols);
    if (cols % 32) return KILN_OK; /* only float weights take such widths, and they read x itself */
    if (!xp || !x || !aligned(xp, 16)) return kiln_fail(KILN_ERR_INVALID, "cuda matvec_prepare: NULL or unaligned buffer");
    const int64_t n_blocks = T * (cols / 32);
    const int threads = 256; /* 8 blocks of 32 per CTA */
    const int64_t grid = (n_blocks + threads / 32 - 1) / (threads / 32);
    if (grid > INT32_MAX) return kiln_fail(KILN_ERR_INVALID, "cuda matvec_prepare: %lld blocks is too many", (long long)n_blocks);
    const cudaError_t e = kiln_launch(matvec_prepare_kernel, dim3((unsigned)grid), dim3(threads), 0, (cudaStream_t)stream, x,
                                      (int8_t *)xp, (float2 *)((int8_t *)xp + T * cols), n_blocks);
    return e == cudaSuccess ? KILN_OK : kiln_fail(KILN_ERR_IO, "CUDA matvec_prepare launch failed: %s", cudaGetErrorString(e));
}

extern "C" kiln_status kiln_cuda_matvec(float *y, const float *x, const void *xp, const kiln_cuda_wt *W, int64_t T, bool add,
                                        void *stream) {
    return matvec_dispatch<false>("matvec", y, x, xp, W, NULL, T, add, false, NULL, (cudaStream_t)stream);
}

extern "C" kiln_status kiln_cuda_matvec_glu(float *out, const float *x, const void *xp, const kiln_cuda_wt *Wg,
                                            const kiln_cuda_wt *Wu, int64_t T, bool geglu, void *stream) {
    return matvec_dispatch<true>("matvec_glu", out, x, xp, Wg, Wu, T, false, geglu, NULL, (cudaStream_t)stream);
}

extern "C" kiln_status kiln_cuda_matvec_tail(float *y, const float *x, const void *xp, const kiln_cuda_wt *W, int64_t T, bool add,
                                             const kiln_cuda_mv_tail *tail, void *stream) {
    return matvec_dispatch<false>("matvec", y, x, xp, W, NULL, T, add, false, tail, (cudaStream_t)stream);
}

extern "C" kiln_status kiln_cuda_matvec_glu_tail(float *out, const float *x, const void *xp, const kiln_cuda_wt *Wg,
                                                 const kiln_cuda_wt *Wu, int64_t T, bool geglu, const kiln_cuda_mv_tail *tail,
                                                 void *stream) {
    return matvec_dispatch<true>("matvec_glu", out, x, xp, Wg, Wu, T, false, geglu, tail, (cudaStream_t)stream);
}

/* ---------------------------------------------------------------- two weights of one token in one launch */

template <class P1, class P2, bool PRE>
static kiln_status launch_pair(mv_args a1, mv_args a2, cudaStream_t s) {
    a1.ppr = a1.cols / P1::ELEMS, a2.ppr = a2.cols / P2::ELEMS;
    const int64_t g1 = mv_shape<P1, 1>(a1, 2), g2 = mv_shape<P2, 1>(a2, 2);
    if (g1 + g2 > INT32_MAX) return kiln_fail(KILN_ERR_INVALID, "cuda matvec_pair: %lld + %lld rows is too many", (long long)a1.rows,
                                              (long long)a2.rows);
    const cudaError_t e = kiln_launch(matvec_pair_kernel<P1, 2, P2, 2, PRE>, dim3((unsigned)(g1 + g2)), dim3(MV_THREADS),
                                      PRE ? mv_pre_smem(a1.cols) : 0, s, a1, a2, (int)g1);
    return e == cudaSuccess ? KILN_OK : kiln_fail(KILN_ERR_IO, "CUDA matvec_pair launch failed: %s", cudaGetErrorString(e));
}

/* Only weights that take 2 rows a group alone: a large one (4 rows a group) fills the GPU by itself, and beside a
 * second kernel body its registers cost more than the launch saved (7B-shaped q|k + v on an H100: tg128 -1%; 124M
 * +3%). */
extern "C" bool kiln_cuda_matvec_pair_takes(const kiln_cuda_wt *W1, const kiln_cuda_wt *W2) {
    if (!W1 || !W2 || !(W1->type == KILN_TYPE_Q4_K || W1->type == KILN_TYPE_Q5_K) || W2->type != KILN_TYPE_Q6_K || W1->cols != W2->cols)
        return false;
    mv_args a1 = {}, a2 = {};
    a1.rows = W1->rows, a1.cols = W1->cols, a2.rows = W2->rows, a2.cols = W2->cols;
    return mv_rows_t1(a1) == 2 && mv_rows_t1(a2) == 2;
}

extern "C" kiln_status kiln_cuda_matvec_pair(float *y1, const kiln_cuda_wt *W1, float *y2, const kiln_cuda_wt *W2, const void *xp,
                                             void *stream) {
    return kiln_cuda_matvec_pair_pre(y1, W1, y2, W2, xp, NULL, stream);
}

extern "C" kiln_status kiln_cuda_matvec_pair_pre(float *y1, const kiln_cuda_wt *W1, float *y2, const kiln_cuda_wt *W2, const void *xp,
                                                 const kiln_cuda_mv_tail *pre, void *stream) {
    if (!y1 || !y2 || !W1 || !W2 || !W1->data || !W2->data) return kiln_fail(KILN_ERR_INVALID, "cuda matvec_pair: NULL output or weight");
    if (!kiln_cuda_matvec_pair_takes(W1, W2))
        return kiln_fail(KILN_ERR_UNSUPPORTED, "cuda matvec_pair: %s beside %s over %lld and %lld columns: only q4_K or q5_K beside "
                         "q6_K, of the same width, each small enough for 2 rows a group", kiln_type_name(W1->type) ? kiln_type_name(W1->type) : "?",
                         kiln_type_name(W2->type) ? kiln_type_name(W2->type) : "?", (long long)W1->cols, (long long)W2->cols);
    const kiln_cuda_wt *W[2] = {W1, W2};
    for (int i = 0; i < 2; i++) {
        const size_t rb = kiln_type_row_bytes(W[i]->type, W[i]->cols);
        const size_t row_align = W[i]->type == KILN_TYPE_Q6_K ? 2 : 16;
        if (W[i]->rows < 1 || W[i]->cols < 1 || rb == 0 || W[i]->row_bytes < rb || W[i]->row_bytes % row_align ||
            !aligned(W[i]->data, 16))
            return kiln_fail(KILN_ERR_INVALID, "cuda matvec_pair: bad %s weight of %lld x %lld (row_bytes %zu; data 16-byte "
                             "aligned, rows %zu-byte aligned)", kiln_type_name(W[i]->type), (long long)W[i]->rows,
                             (long long)W[i]->cols, W[i]->row_bytes, row_align);
    }
    if (!xp || !aligned(xp, 16)) return kiln_fail(KILN_ERR_INVALID, "cuda matvec_pair: prepared activations needed, 16-byte aligned");
    mv_args a[2] = {};
    float *y[2] = {y1, y2};
    for (int i = 0; i < 2; i++) {
        a[i].w[0] = a[i].w[1] = (const uint8_t *)W[i]->data;
        a[i].row_bytes = W[i]->row_bytes, a[i].rows = W[i]->rows, a[i].cols = W[i]->cols, a[i].y = y[i];
        a[i].xq = (const int8_t *)xp;
        a[i].xds = (const float2 *)((const int8_t *)xp + W[i]->cols);
        if (pre && pre->pre_x) TRY(mv_pre_args("matvec_pair", a[i], W[i], 1, xp, pre));
    }
    cudaStream_t s = (cudaStream_t)stream;
    if (pre && pre->pre_x)
        return W1->type == KILN_TYPE_Q4_K ? launch_pair<piece_q4_K, piece_q6_K, true>(a[0], a[1], s)
                                          : launch_pair<piece_q5_K, piece_q6_K, true>(a[0], a[1], s);
    return W1->type == KILN_TYPE_Q4_K ? launch_pair<piece_q4_K, piece_q6_K, false>(a[0], a[1], s)
                                      : launch_pair<piece_q5_K, piece_q6_K, false>(a[0], a[1], s);
}
