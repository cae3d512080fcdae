/* train_loss.cu: the loss and the optimizer of CUDA training (train_kernels.h's train_loss.cu section): the fused
 * softmax cross-entropy over a chunk of logit rows (label smoothing, z-loss, ignore_index, bf16 dlogits) and the
 * fused fp32 AdamW step (global-norm clip, non-finite skip, decoupled decay, bf16 mirror refresh). Both repeat the
 * CPU oracle's float operations in its order with explicit round-to-nearest intrinsics (__fmul_rn, __fadd_rn, ...)
 * so nvcc cannot contract them into FMAs: AdamW is bit-exact with src/train/optim.c whenever the clip factor (a
 * double norm summed in another order) rounds to the same float, and the loss differs from src/cpu/ops_loss.c only
 * by the order of its sums and CUDA's expf (2 ulp) against the host's. Every kernel follows launch.h's PDL contract.
 * tests/test_cuda_train_loss.c checks both against kiln_cpu_ops.cross_entropy and kiln_adamw_step. */
#include "cuda/launch.h"
#include "cuda/train_kernels.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "status.h"

/* A kiln_launch's own error first, then any earlier asynchronous one. */
static kiln_status checked(const char *what, cudaError_t e) {
    if (e == cudaSuccess) e = cudaGetLastError();
    return e == cudaSuccess ? KILN_OK : kiln_fail(KILN_ERR_IO, "CUDA %s launch failed: %s", what, cudaGetErrorString(e));
}

static bool aligned(const void *p, uintptr_t a) { return ((uintptr_t)p & (a - 1)) == 0; }

/* bf16 bits of f, round to nearest even, NaN kept a (quiet) NaN: optim.c's bf16_rne, bit for bit. */
static __device__ __forceinline__ uint16_t bf16_rne(float f) {
    const uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

/* ---------------------------------------------------------------- block reductions
 * Fixed trees over a fixed block size (a multiple of 32), so the results are the same bits on every run. Each
 * returns the total to every thread; each shared array must serve one call only (one barrier per call). */

static __device__ __forceinline__ float block_max(float v, float *sh) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    float m = sh[0];
    for (int i = 1; i < nw; i++) m = fmaxf(m, sh[i]);
    return m;
}

static __device__ __forceinline__ double block_sum(double v, double *sh) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    double s = 0.0;
    for (int i = 0; i < nw; i++) s += sh[i];
    return s;
}

/* ---------------------------------------------------------------- cross-entropy
 * One block per row of bf16 logits, the row read from global memory once: with V % 4 == 0 (VEC) and V * 2 bytes
 * within CE_SMEM_MAX (V <= 49152: 62.5 KiB at V = 32000, three blocks an SM) the row is kept in shared memory
 * (SMEM), so the kernel moves 2V bytes in and 2V out per row (it ran at 3.1 TB/s reading f32 logits twice from HBM:
 * 420 us a 4096-row chunk; now ~1/3 of the bytes). The kernel is then bound by its instructions, not its bytes
 * (~51 a logit in SASS, two expf among them, ran at 1.5 TB/s), so that path spends few of them:
 *   1. the copy into shared memory, its loads batched, and the row's max M (one fmaxf a value, NaN never winning,
 *      as the CPU's `x > m ? x : m`), reduced over the block;
 *   2. from shared memory, s = sum exp(x - M) in f32 per thread (no running-max rescales; ce_term's -inf guard
 *      only when M is -inf) and the logits' plain sum (the label-smoothing mean) in a per-thread double: it is a
 *      signed sum whose cancellation f32 would expose, while the exps are positive, so f32 bounds their relative
 *      error by the ~V/threads <= 256 terms a thread adds: <= 1.5e-5 worst case, ~1e-6 typical, and the block
 *      average of those is ~1e-7 of the sum, which is ~1e-7 absolute in z = max + log(sum). The thread partials
 *      are summed in double in a fixed tree. z and the loss are formed in double, in ops_loss.c's order.
 * Without the shared copy the first pass is online instead: each thread keeps its running max m and s = sum
 * exp(x - m), rescaled by exp(m_old - m_new) when the max grows (once per 4 values, and only O(log) times in
 * expectation), and the partials are combined in double (each s scaled by exp(m - M)).
 * Last, dlogits = a exp(x - M) - b (minus c at the target), the CPU's float formula with its float constants
 * a = dscale (1 + 2 z_loss z) / sum, b = dscale eps / V, c = dscale (1 - eps), rounded to bf16 (RNE; four at a
 * time by cvt.rn.bf16x2).
 * dlogits may alias logits: every thread reads its own elements (or the shared copy) before it writes them, and
 * the gradient pass starts after the block-wide reductions. Non-finite logits follow the CPU: a -inf logit contributes
 * exp = 0 (and makes the smoothing mean -inf, so the loss is +inf with eps > 0 and NaN with eps = 0, as 0 * inf
 * on the CPU); +inf or NaN make the row NaN. A row of only -inf gives NaN. A target outside [0, V) that is not
 * ignore_index breaks the contract (the CPU asserts): its loss and dlogits are NaN, never a silently wrong
 * number. */

#define CE_MAX_THREADS 1024
#define CE_PER_THREAD 32             /* accesses (4 bf16 or 1) per thread a row aims for before the block grows */
#define CE_SMEM_MAX (96 * 1024)      /* the row's shared copy, V * 2 bytes, at most this (V <= 49152) */
#define CE_BATCH 8                   /* loads in flight per thread while the row is copied to shared memory */

static __device__ __forceinline__ float bf_lo(uint32_t w) { return __uint_as_float(w << 16); }
static __device__ __forceinline__ float bf_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

/* exp(x - m) in f32, with a -inf logit contributing 0 even when m is -inf (the CPU gets NaN only for a row of
 * nothing but -inf, which this gives too, through z = -inf). */
static __device__ __forceinline__ float ce_term(float x, float m) {
    const float e = expf(__fsub_rn(x, m)); /* computed either way: a select, not a branch around the exp */
    return x == -INFINITY ? 0.0f : e;
}

/* Folds one value into (m, s). NaN never wins the max (as the CPU's `x > m ? x : m`); it poisons s. */
static __device__ __forceinline__ void ce_online1(float x, float &m, float &s, double &sx) {
    if (x > m) {
        s = __fmul_rn(s, expf(__fsub_rn(m, x))); /* m = -inf: exp(-inf) = 0, and s is 0 (or NaN) anyway */
        m = x;
    }
    s = __fadd_rn(s, ce_term(x, m));
    sx += (double)x;
}

static __device__ __forceinline__ void ce_online4(float4 q, float &m, float &s, double &sx) {
    const float mx = fmaxf(fmaxf(q.x, q.y), fmaxf(q.z, q.w));
    if (mx > m) {
        s = __fmul_rn(s, expf(__fsub_rn(m, mx)));
        m = mx;
    }
    s = __fadd_rn(s, __fadd_rn(__fadd_rn(ce_term(q.x, m), ce_term(q.y, m)), __fadd_rn(ce_term(q.z, m), ce_term(q.w, m))));
    sx += ((double)q.x + (double)q.y) + ((double)q.z + (double)q.w);
}

static __device__ __forceinline__ float ce_grad(float x, float M, float a, float b) {
    return __fsub_rn(__fmul_rn(a, expf(__fsub_rn(x, M))), b);
}

static __device__ __forceinline__ float4 bf4_to_f4(uint2 u) { return make_float4(bf_lo(u.x), bf_hi(u.x), bf_lo(u.y), bf_hi(u.y)); }

/* A word of two bf16 logits as the pair type __hmax2 takes. */
static __device__ __forceinline__ __nv_bfloat162 bf2_of(uint32_t w) {
    __nv_bfloat162 r;
    memcpy(&r, &w, 4);
    return r;
}

/* The sum of exp(x - M) over four values, for a block max M. Only a row whose max is -inf (all -inf, or -inf and
 * NaN) needs ce_term's guard: with a finite or +inf M, exp(-inf - M) is already 0. */
template <bool GUARD>
static __device__ __forceinline__ float ce_sum4(float4 q, float M) {
    if (GUARD) return __fadd_rn(__fadd_rn(ce_term(q.x, M), ce_term(q.y, M)), __fadd_rn(ce_term(q.z, M), ce_term(q.w, M)));
    return __fadd_rn(__fadd_rn(expf(__fsub_rn(q.x, M)), expf(__fsub_rn(q.y, M))),
                     __fadd_rn(expf(__fsub_rn(q.z, M)), expf(__fsub_rn(q.w, M))));
}

/* Two floats to a bf16 pair (lo in the low half), round to nearest even: bf16_rne's bits for every non-NaN value,
 * in one instruction (a NaN becomes the canonical 0x7fff). */
static __device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

/* grid (n), block (a multiple of 32, <= 1024), dynamic shared memory V * 2 bytes when SMEM (else none).
 * VEC: V % 4 == 0, logits and dlogits 8-byte aligned. */
template <bool VEC, bool SMEM>
__global__ void __launch_bounds__(CE_MAX_THREADS)
    cross_entropy_kernel(float *losses, kiln_bf16_t *dlogits, const kiln_bf16_t *logits, const int32_t *targets, int V,
                         float eps, float z_loss, int32_t ignore_index, float dscale) {
    kiln_pdl_wait();
    kiln_pdl_trigger();
    extern __shared__ uint2 row_sh[]; /* (V / 4) with SMEM and VEC, else (V / 2) words viewed as bf16 */
    __shared__ float sh_max[32];
    __shared__ double sh_e[32], sh_x[32];
    const int64_t r = blockIdx.x;
    const kiln_bf16_t *x = logits + r * V;              /* (V) this row */
    kiln_bf16_t *dx = dlogits ? dlogits + r * V : NULL; /* (V) its gradient, or NULL */
    kiln_bf16_t *xs = (kiln_bf16_t *)row_sh;            /* (V) the shared copy, with SMEM */
    const int tid = threadIdx.x, nt = blockDim.x;
    const int32_t target = targets[r];

    if (target == ignore_index || target < 0 || target >= V) { /* block-uniform */
        const bool bad = target != ignore_index;
        const uint16_t fill = bad ? (uint16_t)0x7fc0 : (uint16_t)0; /* bf16 NaN or +0 */
        if (tid == 0) losses[r] = bad ? __int_as_float(0x7fc00000) : 0.0f;
        if (!dx) return;
        if (VEC) {
            const uint32_t f2 = (uint32_t)fill | ((uint32_t)fill << 16);
            for (int i = tid; i < V / 4; i += nt) ((uint2 *)dx)[i] = make_uint2(f2, f2);
        } else {
            for (int i = tid; i < V; i += nt) dx[i] = fill;
        }
        return;
    }

    float M;
    double sum_e, sum_x;
    if (VEC && SMEM) {
        /* pass 1: the copy into shared memory, CE_BATCH independent loads in flight per thread, and the row's max
         * from the loaded registers (a compare a value: the loads are not held up behind a serial chain) */
        const uint2 *x4 = (const uint2 *)x; /* (V / 4) */
        const int n4 = V / 4;
        __nv_bfloat162 m2 = __float2bfloat162_rn(-INFINITY); /* the max of the values in the low and high halves */
        int i0 = tid;
        for (; i0 + (CE_BATCH - 1) * nt < n4; i0 += CE_BATCH * nt) { /* whole batches: no bounds to check */
            uint2 u[CE_BATCH];
#pragma unroll
            for (int j = 0; j < CE_BATCH; j++) u[j] = x4[i0 + j * nt];
#pragma unroll
            for (int j = 0; j < CE_BATCH; j++) {
                row_sh[i0 + j * nt] = u[j];
                m2 = __hmax2(m2, __hmax2(bf2_of(u[j].x), bf2_of(u[j].y)));
            }
        }
        if (i0 < n4) { /* the last, partial batch: its loads too all in flight before the first is used */
            uint2 u[CE_BATCH];
#pragma unroll
            for (int j = 0; j < CE_BATCH; j++)
                if (i0 + j * nt < n4) u[j] = x4[i0 + j * nt];
#pragma unroll
            for (int j = 0; j < CE_BATCH; j++)
                if (i0 + j * nt < n4) {
                    row_sh[i0 + j * nt] = u[j];
                    m2 = __hmax2(m2, __hmax2(bf2_of(u[j].x), bf2_of(u[j].y)));
                }
        }
        /* bf16 max is exact, and like fmaxf it returns the other operand when one is NaN */
        M = block_max(fmaxf(__low2float(m2), __high2float(m2)), sh_max); /* its barrier also orders the shared
                                                                            row's writes before pass 2 */
        /* pass 2: the sum of exp(x - M) in f32 and the plain sum in double, from shared memory (its own elements) */
        float s = 0.0f;
        double sx = 0.0;
        if (M != -INFINITY) {
            for (int i = tid; i < n4; i += nt) {
                const float4 q = bf4_to_f4(row_sh[i]);
                s = __fadd_rn(s, ce_sum4<false>(q, M));
                sx += ((double)q.x + (double)q.y) + ((double)q.z + (double)q.w);
            }
        } else {
            for (int i = tid; i < n4; i += nt) {
                const float4 q = bf4_to_f4(row_sh[i]);
                s = __fadd_rn(s, ce_sum4<true>(q, M));
                sx += ((double)q.x + (double)q.y) + ((double)q.z + (double)q.w);
            }
        }
        sum_e = block_sum((double)s, sh_e), sum_x = block_sum(sx, sh_x);
    } else {
        /* pass 1: per-thread online max / sum of exps, plain sum in double (with SMEM the row into shared memory) */
        float m = -INFINITY, s = 0.0f;
        double sx = 0.0;
        if (VEC) {
            const uint2 *x4 = (const uint2 *)x; /* (V / 4) */
            for (int i = tid; i < V / 4; i += nt) ce_online4(bf4_to_f4(x4[i]), m, s, sx);
        } else {
            for (int i = tid; i < V; i += nt) {
                const kiln_bf16_t u = x[i];
                if (SMEM) xs[i] = u;
                ce_online1(__uint_as_float((uint32_t)u << 16), m, s, sx);
            }
        }
        M = block_max(m, sh_max); /* its barrier also orders the shared row's writes before the gradient pass */
        /* A thread that saw only -inf (or nothing) has m = -inf and s = 0 (NaN if it saw a NaN): it adds s * 0. */
        const double se_t = m == -INFINITY ? (double)s * 0.0 : (double)s * exp((double)m - (double)M);
        sum_e = block_sum(se_t, sh_e), sum_x = block_sum(sx, sh_x);
    }

    /* ops_loss.c's double formulas, in its order */
    const double z = __dadd_rn((double)M, log(sum_e)), epsd = (double)eps, zl = (double)z_loss, ds = (double)dscale;
    if (tid == 0) {
        const double xt = (double)__uint_as_float((uint32_t)(SMEM ? xs[target] : x[target]) << 16);
        const double t1 = __dmul_rn(__dsub_rn(1.0, epsd), __dsub_rn(z, xt));
        const double t2 = __dmul_rn(epsd, __dsub_rn(z, __ddiv_rn(sum_x, (double)V)));
        const double t3 = __dmul_rn(__dmul_rn(zl, z), z);
        losses[r] = (float)__dadd_rn(__dadd_rn(t1, t2), t3);
    }
    if (!dx) return;
    /* in place without the shared copy: thread 0 has read x[target] above; make every thread wait for it */
    if (!SMEM) __syncthreads();

    /* the gradient pass, from fresh exps */
    const float a = (float)__ddiv_rn(__dmul_rn(ds, __dadd_rn(1.0, __dmul_rn(__dmul_rn(2.0, zl), z))), sum_e);
    const float b = (float)__ddiv_rn(__dmul_rn(ds, epsd), (double)V);
    const float c = (float)__dmul_rn(ds, __dsub_rn(1.0, epsd));
    if (VEC && SMEM) {
        /* every value without the target's c, then the thread that stored the target's four again with it (the row
         * is still in shared memory; the same thread's later store wins) */
        for (int i = tid; i < V / 4; i += nt) {
            const float4 q = bf4_to_f4(row_sh[i]);
            ((uint2 *)dx)[i] = make_uint2(pack_bf16x2(ce_grad(q.x, M, a, b), ce_grad(q.y, M, a, b)),
                                          pack_bf16x2(ce_grad(q.z, M, a, b), ce_grad(q.w, M, a, b)));
        }
        if (tid == (target >> 2) % nt) {
            const int i = target >> 2, k = target & 3;
            const float4 q = bf4_to_f4(row_sh[i]);
            float g[4] = {ce_grad(q.x, M, a, b), ce_grad(q.y, M, a, b), ce_grad(q.z, M, a, b), ce_grad(q.w, M, a, b)};
            g[k] = __fsub_rn(g[k], c);
            ((uint2 *)dx)[i] = make_uint2(pack_bf16x2(g[0], g[1]), pack_bf16x2(g[2], g[3]));
        }
    } else if (VEC) { /* x may be dx: each four are read once, before they are written */
        const uint2 *x4 = (const uint2 *)x;
        for (int i = tid; i < V / 4; i += nt) {
            const float4 q = bf4_to_f4(x4[i]);
            float g0 = ce_grad(q.x, M, a, b), g1 = ce_grad(q.y, M, a, b), g2 = ce_grad(q.z, M, a, b), g3 = ce_grad(q.w, M, a, b);
            if (target >> 2 == i) {
                const int k = target & 3;
                if (k == 0) g0 = __fsub_rn(g0, c);
                if (k == 1) g1 = __fsub_rn(g1, c);
                if (k == 2) g2 = __fsub_rn(g2, c);
                if (k == 3) g3 = __fsub_rn(g3, c);
            }
            ((uint2 *)dx)[i] = make_uint2(pack_bf16x2(g0, g1), pack_bf16x2(g2, g3));
        }
    } else {
        const kiln_bf16_t *xr = SMEM ? xs : x;
        for (int i = tid; i < V; i += nt) {
            float g = ce_grad(__uint_as_float((uint32_t)xr[i] << 16), M, a, b);
            if (i == target) g = __fsub_rn(g, c);
            dx[i] = bf16_rne(g);
        }
    }
}

template <bool VEC, bool SMEM> static cudaError_t ce_launch(dim3 grid, dim3 block, size_t smem, cudaStream_t s, float *losses,
                                                            kiln_bf16_t *dlogits, const kiln_bf16_t *logits,
                                                            const int32_t *targets, int V, float eps, float z_loss,
                                                            int32_t ignore_index, float dscale) {
    if (SMEM && smem > 48 * 1024) {
        const cudaError_t e = cudaFuncSetAttribute(cross_entropy_kernel<VEC, SMEM>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return e;
    }
    return kiln_launch(cross_entropy_kernel<VEC, SMEM>, grid, block, smem, s, losses, dlogits, logits, targets, V, eps, z_loss,
                       ignore_index, dscale);
}

extern "C" kiln_status kiln_cuda_cross_entropy(float *losses, kiln_bf16_t *dlogits, const kiln_bf16_t *logits, const int32_t *targets,
                                               int64_t n, int64_t V, float label_smoothing, float z_loss, int32_t ignore_index,
                                               float dscale, void *stream) {
    if (n < 0 || V <= 0 || (n > 0 && (!losses || !logits || !targets)))
        return kiln_fail(KILN_ERR_INVALID, "cuda cross_entropy: n %lld, V %lld, losses %s, logits %s, targets %s", (long long)n,
                         (long long)V, losses ? "given" : "NULL", logits ? "given" : "NULL", targets ? "given" : "NULL");
    if (n > INT32_MAX || V > INT32_MAX)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "cuda cross_entropy: %lld rows of %lld (each at most %d)", (long long)n,
                         (long long)V, INT32_MAX);
    if (n == 0) return KILN_OK;
    const bool vec = V % 4 == 0 && aligned(logits, 8) && aligned(dlogits, 8);
    const size_t smem = (size_t)V * sizeof(kiln_bf16_t);
    const bool use_smem = smem <= CE_SMEM_MAX;
    const int64_t accesses = vec ? V / 4 : V;
    /* 256 for V = 32000 (208 us a 4096-row chunk on an H100, 218 at 512 and 206 at 384: `kiln bench gpu-kernels
     * --train` under KILN_CE_THREADS), 1024 from V = 131072 */
    int64_t threads = ((accesses + CE_PER_THREAD - 1) / CE_PER_THREAD + 31) / 32 * 32;
    threads = threads < 32 ? 32 : threads > CE_MAX_THREADS ? CE_MAX_THREADS : threads;
    const char *tv = getenv("KILN_CE_THREADS"); /* a measurement knob: a block size of 32..1024 in whole warps */
    const int want = tv ? atoi(tv) : 0;
    if (want >= 32 && want <= CE_MAX_THREADS && want % 32 == 0) threads = want;
    cudaStream_t s = (cudaStream_t)stream;
    const dim3 grid((unsigned)n), block((unsigned)threads);
    const int v = (int)V;
    const float eps = label_smoothing;
    cudaError_t e;
    if (vec) e = use_smem ? ce_launch<true, true>(grid, block, smem, s, losses, dlogits, logits, targets, v, eps, z_loss, ignore_index, dscale)
                          : ce_launch<true, false>(grid, block, 0, s, losses, dlogits, logits, targets, v, eps, z_loss, ignore_index, dscale);
    else e = use_smem ? ce_launch<false, true>(grid, block, smem, s, losses, dlogits, logits, targets, v, eps, z_loss, ignore_index, dscale)
                      : ce_launch<false, false>(grid, block, 0, s, losses, dlogits, logits, targets, v, eps, z_loss, ignore_index, dscale);
    return checked("cross_entropy", e);
}

/* ---------------------------------------------------------------- AdamW
 * Three launches, none of which the host waits for:
 *   1. sumsq: a grid fixed by n alone (norm_blocks) strides over grads, each thread adding exact double squares
 *      (a float's square fits a double's 53 bits) into one double, each block reducing its threads in a fixed tree
 *      into ws's partial[block];
 *   2. sum_partials: one block sums the partials in a fixed order into a double (kiln_cuda_grad_sumsq ends here:
 *      data-parallel training adds the ranks' sums before the next stage); norm_finish: norm = sqrt(sum) in
 *      double, and writes d_norm (f32), d_skipped (norm not finite) and, into ws, the skip flag and the clip
 *      factor min(1, clip / norm) computed in double from the double norm as optim.c does, then rounded to float;
 *   3. update: elementwise, optim.c's adam_run float for float, unless the flag says skip (then it returns
 *      before touching anything: params, m, v and the mirror stay byte for byte as they were).
 * The norm matches kiln_grad_norm up to the order of a double sum (~1e-16 relative), so the clip factor is
 * the CPU's float, or one ulp from it when the double lands next to a rounding boundary. */

#define NORM_THREADS 256
#define NORM_MAX_BLOCKS 1024      /* partials in ws: 8 KiB */
#define NORM_ELEMS_PER_BLOCK 8192 /* below 1024 blocks: 3M parameters -> 367 blocks, enough for 132 SMs */
#define UPDATE_THREADS 256
#define UPDATE_MAX_BLOCKS (1 << 20)

typedef struct {
    float clip;   /* min(1, grad_clip / norm) */
    int32_t skip; /* the norm was not finite */
} adamw_flags;

typedef struct {
    float b1, b2, one_minus_b1, one_minus_b2;
    float step_size;    /* lr / (1 - b1^t) */
    float inv_sqrt_bc2; /* 1 / sqrt(1 - b2^t) */
    float eps;
    float decay_mul; /* 1 - lr wd */
} adam_consts;

static int64_t norm_blocks(int64_t n) {
    const int64_t g = (n + NORM_ELEMS_PER_BLOCK - 1) / NORM_ELEMS_PER_BLOCK;
    return g < 1 ? 1 : g > NORM_MAX_BLOCKS ? NORM_MAX_BLOCKS : g;
}

/* ws: partial (norm_blocks(n)) doubles, then the adamw_flags, then the sum of squares (a double). */
extern "C" size_t kiln_cuda_adamw_ws_bytes(int64_t n) {
    return (size_t)norm_blocks(n < 0 ? 0 : n) * sizeof(double) + sizeof(adamw_flags) + sizeof(double);
}

/* grid (norm_blocks(n)), block (NORM_THREADS). VEC: g 16-byte aligned. */
template <bool VEC>
__global__ void __launch_bounds__(NORM_THREADS) adamw_sumsq_kernel(double *partial, const float *g, int64_t n) {
    kiln_pdl_wait();
    kiln_pdl_trigger();
    __shared__ double sh[32];
    const int64_t stride = (int64_t)gridDim.x * blockDim.x, t0 = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    double acc = 0.0;
    if (VEC) {
        const int64_t n4 = n >> 2;
        const float4 *g4 = (const float4 *)g; /* (n4) */
        for (int64_t i = t0; i < n4; i += stride) {
            const float4 q = g4[i];
            acc = fma((double)q.x, (double)q.x, acc); /* the product is exact, so fma = mul + add */
            acc = fma((double)q.y, (double)q.y, acc);
            acc = fma((double)q.z, (double)q.z, acc);
            acc = fma((double)q.w, (double)q.w, acc);
        }
        if (t0 < (n & 3)) acc = fma((double)g[n4 * 4 + t0], (double)g[n4 * 4 + t0], acc); /* the 0-3 tail */
    } else {
        for (int64_t i = t0; i < n; i += stride) acc = fma((double)g[i], (double)g[i], acc);
    }
    const double sum = block_sum(acc, sh);
    if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}

/* grid (1), block (NORM_THREADS): the partials in a fixed order into *d_sumsq. */
__global__ void __launch_bounds__(NORM_THREADS) adamw_sum_partials_kernel(double *d_sumsq, const double *partial, int n_partial) {
    kiln_pdl_wait();
    kiln_pdl_trigger();
    __shared__ double sh[32];
    double acc = 0.0;
    for (int i = threadIdx.x; i < n_partial; i += blockDim.x) acc += partial[i];
    const double sum = block_sum(acc, sh);
    if (threadIdx.x == 0) *d_sumsq = sum;
}

/* grid (1), block (1): the norm, the clip factor and the skip flag from the sum of squares; with d_wsumsq (n_seg) the
 * sums of squares of the weights the update would give (kiln_cuda_adamw_check), a non-finite one skips it too. */
__global__ void adamw_norm_finish_kernel(float *d_norm, int32_t *d_skipped, adamw_flags *flags, const double *d_sumsq, float grad_clip,
                                         const double *d_wsumsq, int n_seg, kiln_cuda_adamw_max *d_max) {
    kiln_pdl_wait();
    kiln_pdl_trigger();
    const double norm = __dsqrt_rn(*d_sumsq);
    bool finite = isfinite(norm);
    for (int i = 0; i < n_seg && finite; i++) finite = isfinite(d_wsumsq[i]);
    double clip = 1.0;
    if (grad_clip > 0.0f && norm > (double)grad_clip) clip = __ddiv_rn((double)grad_clip, norm);
    *d_norm = (float)norm;
    *d_skipped = finite ? 0 : 1;
    flags->clip = (float)clip;
    flags->skip = finite ? 0 : 1;
    if (d_max && finite) *d_max = kiln_cuda_adamw_max{0, 0}; /* the update fills it */
}

/* optim.c's adam_elem, the same float operations in the same order. SQRT_V: v holds sqrt(v) on input and output
 * (the 8-bit moments' layout), else v itself. */
template <bool SQRT_V = false>
static __device__ __forceinline__ void adam_elem(const adam_consts &k, float clip, float &p, float g, float &m, float &v,
                                                 bool decay) {
    const float dmul = decay ? k.decay_mul : 1.0f;
    const float gi = __fmul_rn(g, clip);
    const float mi = __fadd_rn(__fmul_rn(k.b1, m), __fmul_rn(k.one_minus_b1, gi));
    const float vprev = SQRT_V ? __fmul_rn(v, v) : v;
    const float vi = __fadd_rn(__fmul_rn(k.b2, vprev), __fmul_rn(k.one_minus_b2, __fmul_rn(gi, gi)));
    const float s = __fsqrt_rn(vi);
    const float upd = __fmul_rn(k.step_size, __fdiv_rn(mi, __fadd_rn(__fmul_rn(s, k.inv_sqrt_bc2), k.eps)));
    p = __fsub_rn(__fmul_rn(p, dmul), upd);
    m = mi;
    v = SQRT_V ? s : vi;
}

/* ---------------------------------------------------------------- 8-bit moments
 * optim.c's codes, decoded by building the float's bits (its tables hold the same values) and encoded by the same
 * integer operations on the bits: m8 sign and E4M3 of |m| / m_scale, v8 E4M4 of sqrt(v) / v_scale, one scale pair
 * per KILN_CUDA_ADAMW8_BLOCK elements. */
#define ADAM8_M_MAX 1.875f   /* optim.c's M_MAX */
#define ADAM8_S_MAX 1.9375f  /* S_MAX */
#define ADAM8_TINY 1e-30f    /* TINY_BLOCK */

static __device__ __forceinline__ float m8_value(int8_t code) {
    if (code == -128) return -ADAM8_M_MAX; /* never written; optim.c's table holds this */
    const int c = code < 0 ? -code : code, e = c >> 3, f = c & 7;
    const float v = e == 0 ? __fmul_rn((float)f, 0x1p-17f) : __uint_as_float(((uint32_t)(e + 112) << 23) | ((uint32_t)f << 20));
    return code < 0 ? -v : v;
}

static __device__ __forceinline__ float v8_value(uint8_t code) {
    const int e = code >> 4, f = code & 15;
    return e == 0 ? __fmul_rn((float)f, 0x1p-18f) : __uint_as_float(((uint32_t)(e + 112) << 23) | ((uint32_t)f << 19));
}

/* y in [0, M_MAX] to the E4M3 code 0..127 (optim.c's encode_e4m3: round to nearest even) */
static __device__ __forceinline__ int encode_e4m3(float y) {
    if (y < 0x1p-14f) return __float2int_rn(__fmul_rn(y, 0x1p17f));
    uint32_t u = __float_as_uint(y);
    u += 0x7ffffu + ((u >> 20) & 1);
    const int c = (int)(u >> 20) - (112 << 3);
    return c > 127 ? 127 : c;
}

/* y in [0, S_MAX] to the E4M4 code 0..255 */
static __device__ __forceinline__ int encode_e4m4(float y) {
    if (y < 0x1p-14f) return __float2int_rn(__fmul_rn(y, 0x1p18f));
    uint32_t u = __float_as_uint(y);
    u += 0x3ffffu + ((u >> 19) & 1);
    const int c = (int)(u >> 19) - (112 << 4);
    return c > 255 ? 255 : c;
}

/* The moments the check reads, element i: fp32 as stored, or the 8-bit codes decoded (v as sqrt(v)). */
struct f32_moments {
    const float *m, *v;
    static constexpr bool sqrt_v = false;
    __device__ __forceinline__ void get(int64_t i, float &mi, float &vi) const { mi = m[i], vi = v[i]; }
};

struct q8_moments {
    const int8_t *m8;
    const uint8_t *v8;
    const float *m_scale, *v_scale;
    static constexpr bool sqrt_v = true;
    __device__ __forceinline__ void get(int64_t i, float &mi, float &vi) const {
        const int64_t b = i / KILN_CUDA_ADAMW8_BLOCK;
        mi = __fmul_rn(m_scale[b], m8_value(m8[i]));
        vi = __fmul_rn(v_scale[b], v8_value(v8[i]));
    }
};

/* The clip factor of adamw_norm_finish_kernel, from the sum of squares (1 when the norm is not finite: the step is
 * skipped by the gradient then, whatever the weights would be). */
static __device__ __forceinline__ float clip_factor(const double *d_sumsq, float grad_clip) {
    const double norm = __dsqrt_rn(*d_sumsq);
    if (!isfinite(norm) || !(grad_clip > 0.0f && norm > (double)grad_clip)) return 1.0f;
    return (float)__ddiv_rn((double)grad_clip, norm);
}

/* kiln_cuda_adamw_check's bound (train_kernels.h): true when no weight the update writes can be non-finite, given
 * that the last applied update wrote at most d_max. Each bound takes a factor 1 + 1e-5 for the float roundings
 * along the way (a few of 2^-24 each; the double norm's own rounding ~n 2^-53). A NaN anywhere compares false. */
static __device__ __forceinline__ bool update_bounded(const adam_consts &k, const kiln_cuda_adamw_max *d_max, const double *d_sumsq,
                                                      float grad_clip) {
    if (!d_max) return false;
    const double norm = __dsqrt_rn(*d_sumsq), slack = 1.0 + 1e-5;
    if (!isfinite(norm)) return false; /* the step is skipped by its gradient */
    const double g = norm * (double)clip_factor(d_sumsq, grad_clip) * slack;                 /* >= every |g clip| */
    const double m = ((double)k.b1 * __uint_as_float(d_max->m) + (double)k.one_minus_b1 * g) * slack; /* >= every |m'| */
    const double r = m / (double)k.eps * slack;                          /* >= |m' / (sqrt(v') / sqrt(bc2) + eps)| */
    const double dm = fabs((double)k.decay_mul) > 1.0 ? fabs((double)k.decay_mul) : 1.0;
    const double p = ((double)__uint_as_float(d_max->p) * dm + fabs((double)k.step_size) * r) * slack; /* >= every |p'| */
    return r < 0x1p126 && p < 0x1p126;
}

static __device__ __forceinline__ int64_t check_chunks(int64_t len) {
    return (len + KILN_CUDA_ADAMW_CHECK_CHUNK - 1) / KILN_CUDA_ADAMW_CHECK_CHUNK;
}

/* grid (n_chunks), block (NORM_THREADS): block b is chunk b of the segments taken in order, each segment [seg[2y],
 * +seg[2y+1]) cut into KILN_CUDA_ADAMW_CHECK_CHUNK elements, so every SM shares the large tensors (the embedding is
 * a third of a 124M model: one grid row per segment left it to a few SMs and made the check 2 ms of a 29 ms step).
 * The weights adam_elem would write, squared and summed into partial[b]; nothing else is written. */
template <typename Moments>
__global__ void __launch_bounds__(NORM_THREADS)
    adamw_check_kernel(double *partial /* (n_chunks) */, const int64_t *seg, int n_seg, const float *params, const float *grads,
                       Moments mo, const uint8_t *decay, adam_consts k, const double *d_sumsq, float grad_clip,
                       const kiln_cuda_adamw_max *d_max) {
    kiln_pdl_wait();
    kiln_pdl_trigger();
    if (update_bounded(k, d_max, d_sumsq, grad_clip)) return; /* every block alike; check_finish writes 0 */
    __shared__ double sh[32];
    __shared__ int64_t s_at, s_end;
    if (threadIdx.x == 0) {
        int64_t c = blockIdx.x;
        int y = 0;
        for (; y < n_seg; y++) {
            const int64_t nc = check_chunks(seg[2 * y + 1]);
            if (c < nc) break;
            c -= nc;
        }
        const int64_t len = y < n_seg ? seg[2 * y + 1] : 0, lo = c * KILN_CUDA_ADAMW_CHECK_CHUNK;
        s_at = y < n_seg ? seg[2 * y] + lo : 0;
        s_end = y < n_seg ? seg[2 * y] + (len < lo + KILN_CUDA_ADAMW_CHECK_CHUNK ? len : lo + KILN_CUDA_ADAMW_CHECK_CHUNK) : 0;
    }
    __syncthreads();
    const float clip = clip_factor(d_sumsq, grad_clip);
    const int64_t at = s_at, end = s_end;
    double acc = 0.0;
    for (int64_t i = at + threadIdx.x; i < end; i += blockDim.x) {
        float p = params[i], mi, vi;
        mo.get(i, mi, vi);
        adam_elem<Moments::sqrt_v>(k, clip, p, grads[i], mi, vi, decay[i] != 0);
        acc = fma((double)p, (double)p, acc);
    }
    const double sum = block_sum(acc, sh);
    if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}

/* grid (n_seg), block (NORM_THREADS): segment y's partials, in a fixed order, into d_wsumsq[y]; 0 when the bound
 * spared the check. */
__global__ void __launch_bounds__(NORM_THREADS) adamw_check_finish_kernel(double *d_wsumsq, const double *partial, const int64_t *seg,
                                                                          adam_consts k, const double *d_sumsq, float grad_clip,
                                                                          const kiln_cuda_adamw_max *d_max) {
    kiln_pdl_wait();
    kiln_pdl_trigger();
    __shared__ double sh[32];
    const int y = blockIdx.x;
    if (update_bounded(k, d_max, d_sumsq, grad_clip)) {
        if (threadIdx.x == 0) d_wsumsq[y] = 0.0;
        return;
    }
    int64_t c0 = 0;
    for (int j = 0; j < y; j++) c0 += check_chunks(seg[2 * j + 1]);
    const int64_t nc = check_chunks(seg[2 * y + 1]);
    double acc = 0.0;
    for (int64_t x = threadIdx.x; x < nc; x += blockDim.x) acc += partial[c0 + x];
    const double sum = block_sum(acc, sh);
    if (threadIdx.x == 0) d_wsumsq[y] = sum;
}

/* The warp's largest |p| and |m| into d_max (non-negative floats order as their bits): an atomic only where the
 * warp's value passes what d_max already holds, so few of the grid's warps write. */
static __device__ __forceinline__ void note_max(kiln_cuda_adamw_max *d_max, float pm, float mm) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        pm = fmaxf(pm, __shfl_xor_sync(0xffffffffu, pm, o));
        mm = fmaxf(mm, __shfl_xor_sync(0xffffffffu, mm, o));
    }
    if ((threadIdx.x & 31) == 0) {
        if (__float_as_uint(pm) > __ldcg(&d_max->p)) atomicMax(&d_max->p, __float_as_uint(pm));
        if (__float_as_uint(mm) > __ldcg(&d_max->m)) atomicMax(&d_max->m, __float_as_uint(mm));
    }
}

/* grid-stride over n (VEC: n / 4 float4s, then the 0-3 tail). VEC: params, grads, m, v 16-byte aligned, decay
 * 4-byte, mirror 8-byte. */
template <bool VEC>
__global__ void __launch_bounds__(UPDATE_THREADS)
    adamw_update_kernel(float *params, const float *grads, float *m, float *v, kiln_bf16_t *mirror, const uint8_t *decay,
                        int64_t n, adam_consts k, const adamw_flags *flags, kiln_cuda_adamw_max *d_max) {
    kiln_pdl_wait();
    kiln_pdl_trigger();
    if (flags->skip) return; /* the same for every thread: nothing is written */
    const float clip = flags->clip;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x, t0 = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    int64_t scalar_from = 0;
    float pm = 0.0f, mm = 0.0f; /* the largest |p| and |m| written */
    if (VEC) {
        const int64_t n4 = n >> 2;
        for (int64_t i = t0; i < n4; i += stride) {
            float4 p = ((float4 *)params)[i], m4 = ((float4 *)m)[i], v4 = ((float4 *)v)[i];
            const float4 g = ((const float4 *)grads)[i];
            const uchar4 d = ((const uchar4 *)decay)[i];
            adam_elem(k, clip, p.x, g.x, m4.x, v4.x, d.x != 0);
            adam_elem(k, clip, p.y, g.y, m4.y, v4.y, d.y != 0);
            adam_elem(k, clip, p.z, g.z, m4.z, v4.z, d.z != 0);
            adam_elem(k, clip, p.w, g.w, m4.w, v4.w, d.w != 0);
            ((float4 *)params)[i] = p;
            ((float4 *)m)[i] = m4;
            ((float4 *)v)[i] = v4;
            pm = fmaxf(pm, fmaxf(fmaxf(fabsf(p.x), fabsf(p.y)), fmaxf(fabsf(p.z), fabsf(p.w))));
            mm = fmaxf(mm, fmaxf(fmaxf(fabsf(m4.x), fabsf(m4.y)), fmaxf(fabsf(m4.z), fabsf(m4.w))));
            if (mirror)
                ((uint2 *)mirror)[i] = make_uint2((uint32_t)bf16_rne(p.x) | ((uint32_t)bf16_rne(p.y) << 16),
                                                  (uint32_t)bf16_rne(p.z) | ((uint32_t)bf16_rne(p.w) << 16));
        }
        scalar_from = n4 * 4;
    }
    for (int64_t i = scalar_from + t0; i < n; i += stride) {
        float p = params[i], mi = m[i], vi = v[i];
        adam_elem(k, clip, p, grads[i], mi, vi, decay[i] != 0);
        params[i] = p;
        m[i] = mi;
        v[i] = vi;
        if (mirror) mirror[i] = bf16_rne(p);
        pm = fmaxf(pm, fabsf(p));
        mm = fmaxf(mm, fabsf(mi));
    }
    if (d_max) note_max(d_max, pm, mm); /* whole warps reach here: the loops above only stride */
}

/* grid (ceil(blocks / 8)), block (UPDATE_THREADS): warp w of block x updates 8-bit block b = 8x + w, optim.c's
 * step_8bit float for float: decode, the update with the fp32 moments, the block's absmax of m and of sqrt(v) (a
 * max: the same in any order), the new scales, the codes. Lane l holds elements b*256 + 32j + l (j < 8): every
 * load and store is coalesced at any alignment. */
__global__ void __launch_bounds__(UPDATE_THREADS)
    adamw8_update_kernel(float *params, const float *grads, int8_t *m8, uint8_t *v8, float *m_scale, float *v_scale,
                         kiln_bf16_t *mirror, const uint8_t *decay, int64_t n, adam_consts k, const adamw_flags *flags,
                         kiln_cuda_adamw_max *d_max) {
    kiln_pdl_wait();
    kiln_pdl_trigger();
    if (flags->skip) return;
    const float clip = flags->clip;
    const int lane = threadIdx.x & 31;
    const int64_t b = (int64_t)blockIdx.x * (UPDATE_THREADS / 32) + (threadIdx.x >> 5), lo = b * KILN_CUDA_ADAMW8_BLOCK;
    if (lo >= n) return; /* a whole warp */
    const float ms = m_scale[b], vs = v_scale[b];
    float m[8], sv[8];
    float m_max = 0.0f, s_max = 0.0f, p_max = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const int64_t i = lo + 32 * j + lane;
        m[j] = sv[j] = 0.0f;
        if (i < n) {
            float p = params[i];
            m[j] = __fmul_rn(ms, m8_value(m8[i]));
            sv[j] = __fmul_rn(vs, v8_value(v8[i]));
            adam_elem<true>(k, clip, p, grads[i], m[j], sv[j], decay[i] != 0);
            params[i] = p;
            if (mirror) mirror[i] = bf16_rne(p);
            p_max = fmaxf(p_max, fabsf(p));
            m_max = fabsf(m[j]) > m_max ? fabsf(m[j]) : m_max;
            s_max = sv[j] > s_max ? sv[j] : s_max;
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        m_max = fmaxf(m_max, __shfl_xor_sync(0xffffffffu, m_max, o));
        s_max = fmaxf(s_max, __shfl_xor_sync(0xffffffffu, s_max, o));
    }
    if (d_max) note_max(d_max, p_max, m_max); /* the decoded m of the codes below is at most m_max (+ roundings) */
    const float m_inv = m_max >= ADAM8_TINY ? __fdiv_rn(ADAM8_M_MAX, m_max) : 0.0f;
    const float s_inv = s_max >= ADAM8_TINY ? __fdiv_rn(ADAM8_S_MAX, s_max) : 0.0f;
    if (lane == 0) {
        m_scale[b] = m_max >= ADAM8_TINY ? __fdiv_rn(m_max, ADAM8_M_MAX) : 0.0f;
        v_scale[b] = s_max >= ADAM8_TINY ? __fdiv_rn(s_max, ADAM8_S_MAX) : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const int64_t i = lo + 32 * j + lane;
        if (i < n) {
            const int c = encode_e4m3(__fmul_rn(fabsf(m[j]), m_inv));
            m8[i] = (int8_t)(m[j] < 0.0f ? -c : c);
            const int d = encode_e4m4(__fmul_rn(sv[j], s_inv));
            v8[i] = (uint8_t)(d == 0 && sv[j] > 0.0f && s_inv > 0.0f ? 1 : d);
        }
    }
}

extern "C" kiln_status kiln_cuda_grad_sumsq(double *d_sumsq, const float *grads, int64_t n, void *ws, void *stream) {
    if (n < 0 || (n > 0 && !grads) || !d_sumsq || !ws || !aligned(ws, 8))
        return kiln_fail(KILN_ERR_INVALID, "cuda grad_sumsq: n %lld, grads %s, d_sumsq %s, ws %s", (long long)n, grads ? "given" : "NULL",
                         d_sumsq ? "given" : "NULL", ws ? (aligned(ws, 8) ? "aligned" : "misaligned") : "NULL");
    const int64_t nb = norm_blocks(n);
    double *partial = (double *)ws; /* (nb) */
    cudaStream_t s = (cudaStream_t)stream;
    const bool vec_norm = aligned(grads, 16);
    cudaError_t e = vec_norm ? kiln_launch(adamw_sumsq_kernel<true>, dim3((unsigned)nb), dim3(NORM_THREADS), 0, s, partial, grads, n)
                             : kiln_launch(adamw_sumsq_kernel<false>, dim3((unsigned)nb), dim3(NORM_THREADS), 0, s, partial, grads, n);
    kiln_status st = checked("adamw sumsq", e);
    if (st != KILN_OK) return st;
    return checked("adamw sumsq total", kiln_launch(adamw_sum_partials_kernel, dim3(1), dim3(NORM_THREADS), 0, s, d_sumsq,
                                                     (const double *)partial, (int)nb));
}

/* optim.c's constants, computed the same way on the host */
static adam_consts make_consts(float lr, float beta1, float beta2, float eps, float weight_decay, int64_t step) {
    const double t = (double)step;
    const double bc1 = 1.0 - pow((double)beta1, t), bc2 = 1.0 - pow((double)beta2, t);
    adam_consts k;
    k.b1 = beta1;
    k.b2 = beta2;
    k.one_minus_b1 = 1.0f - beta1;
    k.one_minus_b2 = 1.0f - beta2;
    k.step_size = (float)((double)lr / bc1);
    k.inv_sqrt_bc2 = (float)(1.0 / sqrt(bc2));
    k.eps = eps;
    k.decay_mul = (float)(1.0 - (double)lr * (double)weight_decay);
    return k;
}

extern "C" int64_t kiln_cuda_adamw_check_chunks(const int64_t *h_seg, int n_seg) {
    int64_t n = 0;
    for (int i = 0; i < n_seg; i++) n += (h_seg[2 * i + 1] + KILN_CUDA_ADAMW_CHECK_CHUNK - 1) / KILN_CUDA_ADAMW_CHECK_CHUNK;
    return n;
}

template <typename Moments>
static kiln_status check_launch(double *d_wsumsq, double *partial, const int64_t *d_seg, int n_seg, int64_t n_chunks,
                                const float *params, const float *grads, Moments mo, const uint8_t *decay, float lr, float beta1,
                                float beta2, float eps, float weight_decay, float grad_clip, int64_t step, const double *d_sumsq,
                                const kiln_cuda_adamw_max *d_max, void *stream) {
    if (n_seg < 1 || n_seg > 65535 || n_chunks < 0 || n_chunks > INT32_MAX || !d_wsumsq || !partial || !d_seg || !params || !grads ||
        !decay || !d_sumsq)
        return kiln_fail(KILN_ERR_INVALID, "cuda adamw check: %d segments (1..65535), %lld chunks and every buffer are required", n_seg,
                         (long long)n_chunks);
    if (step < 1) return kiln_fail(KILN_ERR_INVALID, "cuda adamw check: step %lld (from 1)", (long long)step);
    const adam_consts k = make_consts(lr, beta1, beta2, eps, weight_decay, step);
    cudaStream_t s = (cudaStream_t)stream;
    if (n_chunks > 0) {
        kiln_status st = checked("adamw check", kiln_launch(adamw_check_kernel<Moments>, dim3((unsigned)n_chunks), dim3(NORM_THREADS), 0,
                                                            s, partial, d_seg, n_seg, params, grads, mo, decay, k, d_sumsq, grad_clip,
                                                            d_max));
        if (st != KILN_OK) return st;
    }
    return checked("adamw check sums", kiln_launch(adamw_check_finish_kernel, dim3((unsigned)n_seg), dim3(NORM_THREADS), 0, s, d_wsumsq,
                                                    (const double *)partial, d_seg, k, d_sumsq, grad_clip, d_max));
}

extern "C" kiln_status kiln_cuda_adamw_check(double *d_wsumsq, double *partial, const int64_t *d_seg, int n_seg, int64_t n_chunks,
                                             const float *params, const float *grads, const float *m, const float *v,
                                             const uint8_t *decay, float lr, float beta1, float beta2, float eps, float weight_decay,
                                             float grad_clip, int64_t step, const double *d_sumsq, const kiln_cuda_adamw_max *d_max,
                                             void *stream) {
    if (!m || !v) return kiln_fail(KILN_ERR_INVALID, "cuda adamw check: the moments are required");
    return check_launch(d_wsumsq, partial, d_seg, n_seg, n_chunks, params, grads, f32_moments{m, v}, decay, lr, beta1, beta2, eps,
                        weight_decay, grad_clip, step, d_sumsq, d_max, stream);
}

extern "C" kiln_status kiln_cuda_adamw8_check(double *d_wsumsq, double *partial, const int64_t *d_seg, int n_seg, int64_t n_chunks,
                                              const float *params, const float *grads, kiln_cuda_adam8 q, const uint8_t *decay,
                                              float lr, float beta1, float beta2, float eps, float weight_decay, float grad_clip,
                                              int64_t step, const double *d_sumsq, const kiln_cuda_adamw_max *d_max, void *stream) {
    if (!q.m8 || !q.v8 || !q.m_scale || !q.v_scale) return kiln_fail(KILN_ERR_INVALID, "cuda adamw8 check: the 8-bit moments are required");
    return check_launch(d_wsumsq, partial, d_seg, n_seg, n_chunks, params, grads,
                        q8_moments{q.m8, q.v8, q.m_scale, q.v_scale}, decay, lr, beta1, beta2, eps, weight_decay, grad_clip, step,
                        d_sumsq, d_max, stream);
}

extern "C" kiln_status kiln_cuda_adamw_apply(float *params, const float *grads, float *m, float *v, kiln_bf16_t *mirror,
                                             const uint8_t *decay, int64_t n, float lr, float beta1, float beta2, float eps,
                                             float weight_decay, float grad_clip, int64_t step, const double *d_sumsq,
                                             float *d_norm, int32_t *d_skipped, void *ws, void *stream) {
    return kiln_cuda_adamw_apply_checked(params, grads, m, v, mirror, decay, n, lr, beta1, beta2, eps, weight_decay, grad_clip, step,
                                         d_sumsq, NULL, 0, NULL, d_norm, d_skipped, ws, stream);
}

/* The arguments' checks shared by both updates, then the norm's stage 2 (the flags in ws). */
static kiln_status apply_begin(const char *who, int64_t n, bool have_buffers, float beta1, float beta2, float eps, float grad_clip,
                               int64_t step, const double *d_sumsq, const double *d_wsumsq, int n_seg, kiln_cuda_adamw_max *d_max,
                               float *d_norm, int32_t *d_skipped, void *ws, cudaStream_t s, adamw_flags **flags) {
    if (n_seg < 0 || (n_seg > 0 && !d_wsumsq)) return kiln_fail(KILN_ERR_INVALID, "%s: %d weight sums without their buffer", who, n_seg);
    if (n < 0 || (n > 0 && !have_buffers) || !d_sumsq || !d_norm || !d_skipped || !ws || !aligned(ws, 8))
        return kiln_fail(KILN_ERR_INVALID,
                         "%s: n %lld; params, grads, the moments, decay, d_sumsq, d_norm, d_skipped and an 8-byte aligned ws "
                         "are required (ws %s)",
                         who, (long long)n, ws ? (aligned(ws, 8) ? "aligned" : "misaligned") : "NULL");
    if (step < 1 || !(beta1 >= 0.0f && beta1 < 1.0f && beta2 >= 0.0f && beta2 < 1.0f) || !(eps > 0.0f) || isnan(grad_clip))
        return kiln_fail(KILN_ERR_INVALID, "%s: step %lld (from 1), betas (%g, %g) in [0, 1), eps %g > 0, clip %g", who,
                         (long long)step, (double)beta1, (double)beta2, (double)eps, (double)grad_clip);
    *flags = (adamw_flags *)((double *)ws + norm_blocks(n)); /* (1), after the partials */
    return checked("adamw norm", kiln_launch(adamw_norm_finish_kernel, dim3(1), dim3(1), 0, s, d_norm, d_skipped, *flags, d_sumsq,
                                             grad_clip, d_wsumsq, n_seg, d_max));
}

extern "C" kiln_status kiln_cuda_adamw_apply_checked(float *params, const float *grads, float *m, float *v, kiln_bf16_t *mirror,
                                                     const uint8_t *decay, int64_t n, float lr, float beta1, float beta2, float eps,
                                                     float weight_decay, float grad_clip, int64_t step, const double *d_sumsq,
                                                     const double *d_wsumsq, int n_seg, kiln_cuda_adamw_max *d_max, float *d_norm,
                                                     int32_t *d_skipped, void *ws, void *stream) {
    cudaStream_t s = (cudaStream_t)stream;
    adamw_flags *flags = NULL;
    TRY(apply_begin("cuda adamw", n, params && grads && m && v && decay, beta1, beta2, eps, grad_clip, step, d_sumsq, d_wsumsq, n_seg,
                    d_max, d_norm, d_skipped, ws, s, &flags));
    if (n == 0) return KILN_OK;
    const adam_consts k = make_consts(lr, beta1, beta2, eps, weight_decay, step);
    const bool vec = aligned(params, 16) && aligned(grads, 16) && aligned(m, 16) && aligned(v, 16) && aligned(decay, 4) &&
                     aligned(mirror, 8);
    const int64_t work = vec ? n / 4 + 1 : n; /* + 1: a block for the tail when n / 4 is 0 */
    int64_t blocks = (work + UPDATE_THREADS - 1) / UPDATE_THREADS;
    blocks = blocks > UPDATE_MAX_BLOCKS ? UPDATE_MAX_BLOCKS : blocks;
    const dim3 grid((unsigned)blocks), block(UPDATE_THREADS);
    const cudaError_t e = vec ? kiln_launch(adamw_update_kernel<true>, grid, block, 0, s, params, grads, m, v, mirror, decay, n, k,
                                            (const adamw_flags *)flags, d_max)
                              : kiln_launch(adamw_update_kernel<false>, grid, block, 0, s, params, grads, m, v, mirror, decay, n, k,
                                            (const adamw_flags *)flags, d_max);
    return checked("adamw update", e);
}

extern "C" kiln_status kiln_cuda_adamw8_apply_checked(float *params, const float *grads, kiln_cuda_adam8 q, kiln_bf16_t *mirror,
                                                      const uint8_t *decay, int64_t n, float lr, float beta1, float beta2, float eps,
                                                      float weight_decay, float grad_clip, int64_t step, const double *d_sumsq,
                                                      const double *d_wsumsq, int n_seg, kiln_cuda_adamw_max *d_max, float *d_norm,
                                                      int32_t *d_skipped, void *ws, void *stream) {
    cudaStream_t s = (cudaStream_t)stream;
    adamw_flags *flags = NULL;
    TRY(apply_begin("cuda adamw8", n, params && grads && q.m8 && q.v8 && q.m_scale && q.v_scale && decay, beta1, beta2, eps, grad_clip,
                    step, d_sumsq, d_wsumsq, n_seg, d_max, d_norm, d_skipped, ws, s, &flags));
    if (n == 0) return KILN_OK;
    const adam_consts k = make_consts(lr, beta1, beta2, eps, weight_decay, step);
    const int64_t n_blocks = (n + KILN_CUDA_ADAMW8_BLOCK - 1) / KILN_CUDA_ADAMW8_BLOCK, per = UPDATE_THREADS / 32;
    const int64_t grid = (n_blocks + per - 1) / per;
    if (grid > INT32_MAX) return kiln_fail(KILN_ERR_INVALID, "cuda adamw8: %lld parameters is too many for one launch", (long long)n);
    return checked("adamw8 update", kiln_launch(adamw8_update_kernel, dim3((unsigned)grid), dim3(UPDATE_THREADS), 0, s, params, grads,
                                                 q.m8, q.v8, q.m_scale, q.v_scale, mirror, decay, n, k, (const adamw_flags *)flags,
                                                 d_max));
}

extern "C" kiln_status kiln_cuda_adamw(float *params, const float *grads, float *m, float *v, kiln_bf16_t *mirror,
                                       const uint8_t *decay, int64_t n, float lr, float beta1, float beta2, float eps,
                                       float weight_decay, float grad_clip, int64_t step, float *d_norm, int32_t *d_skipped,
                                       void *ws, void *stream) {
    if (n < 0 || !ws || !aligned(ws, 8))
        return kiln_fail(KILN_ERR_INVALID, "cuda adamw: n %lld, ws %s", (long long)n, ws ? (aligned(ws, 8) ? "aligned" : "misaligned") : "NULL");
    /* the sum of squares lives after the partials and the flags */
    double *d_sumsq = (double *)((char *)ws + (size_t)norm_blocks(n) * sizeof(double) + sizeof(adamw_flags));
    kiln_status st = kiln_cuda_grad_sumsq(d_sumsq, grads, n, ws, stream);
    if (st != KILN_OK) return st;
    return kiln_cuda_adamw_apply(params, grads, m, v, mirror, decay, n, lr, beta1, beta2, eps, weight_decay, grad_clip, step, d_sumsq,
                                 d_norm, d_skipped, ws, stream);
}
