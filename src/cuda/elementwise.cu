/* elementwise.cu: the CUDA kernels between the matmuls (kernels.h's elementwise section): the embedding gather,
 * the fused residual add + RMSNorm (optionally also writing its output's int8 form prepared for the matvecs), the
 * per-head q/k/v epilogue (bias, qk-norm, RoPE, q scale, f16 cache store), the GLU activations, the sigmoid gate,
 * scale/softcap and the greedy argmax. Each one is memory-bound and small, so the aim is one pass over its data
 * and no launch more than needed; the arithmetic repeats the CPU oracle's float operations in its order with
 * explicit round-to-nearest intrinsics (__fmul_rn, __fadd_rn, ...) so nvcc cannot contract them into FMAs: the
 * embedding is bit-exact, the norms differ only in the order of a double sum, and the transcendental ops by the
 * ulps between CUDA's expf/tanhf/sincosf and the host's libm. Every kernel used in decode is launched with PDL
 * (launch.h: kiln_pdl_wait, kiln_pdl_trigger first).
 * tests/test_cuda_elementwise.c checks every launcher against kiln_cpu_ops (src/cpu/ops*.c) and host loops, and
 * residual_norm_xp's prepared form byte for byte against kiln_cuda_matvec_prepare. */
#include "cuda/blocks.cuh"
#include "cuda/kernels.h"
#include "cuda/kv.cuh"
#include "cuda/launch.h"
#include "cuda/norm.cuh"
#include "cuda/q8.cuh"
#include "cuda/rope.cuh"
#include "quants.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>

#include "status.h"

/* A kiln_launch's own error first, then any earlier asynchronous one (launch.h). */
static kiln_status checked(const char *what, cudaError_t e) { return kiln_launch_status(what, e); }

static bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* ---------------------------------------------------------------- block reductions */

/* A block-wide sum in double, as the CPU's RMSNorm sums its float squares in double (ops_rmsnorm.c): the order
 * differs from the CPU's sequential sum, but in double that moves the float mean by at most an ulp, rarely.
 * Every thread gets the total. One barrier: sh (32 doubles) must serve one call only, so a kernel reducing twice
 * passes two arrays. Deterministic: a fixed tree over a fixed block size. */
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

/* ---------------------------------------------------------------- embed: dequantize one element of a row
 * The formulas of dequant.cu / quants_ref.c, element e of a row that starts at a block boundary. */

static __device__ __forceinline__ float h2f(kiln_fp16 h) { return __half2float(__ushort_as_half(h)); }

static __device__ __forceinline__ void scale_min_k4(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

template <int TYPE> static __device__ __forceinline__ float dequant_elem(const void *row, int64_t e);

template <> __device__ __forceinline__ float dequant_elem<KILN_TYPE_F32>(const void *row, int64_t e) {
    return ((const float *)row)[e];
}
template <> __device__ __forceinline__ float dequant_elem<KILN_TYPE_F16>(const void *row, int64_t e) {
    return h2f(((const kiln_fp16 *)row)[e]);
}
template <> __device__ __forceinline__ float dequant_elem<KILN_TYPE_BF16>(const void *row, int64_t e) {
    return __uint_as_float((uint32_t)((const kiln_bf16 *)row)[e] << 16);
}
/* Q4_0: x = (q - 8) * d, element j < 16 in the low nibble of qs[j], j >= 16 in the high nibble of qs[j - 16]. */
template <> __device__ __forceinline__ float dequant_elem<KILN_TYPE_Q4_0>(const void *row, int64_t e) {
    const block_q4_0 *b = (const block_q4_0 *)row + e / QK4_0;
    const int j = (int)(e % QK4_0);
    const int q = j < 16 ? (b->qs[j] & 0xF) : (b->qs[j - 16] >> 4);
    return __fmul_rn((float)(q - 8), h2f(b->d));
}
/* Q4_1: x = q * d + m. */
template <> __device__ __forceinline__ float dequant_elem<KILN_TYPE_Q4_1>(const void *row, int64_t e) {
    const block_q4_1 *b = (const block_q4_1 *)row + e / QK4_1;
    const int j = (int)(e % QK4_1);
    const int q = j < 16 ? (b->qs[j] & 0xF) : (b->qs[j - 16] >> 4);
    return __fadd_rn(__fmul_rn((float)q, h2f(b->d)), h2f(b->m));
}
/* Q5_0: x = (q - 16) * d, the nibble as Q4_0 and bit 4 of element j at bit j of qh (little-endian uint32). The
 * block is 22 bytes, only 2-byte aligned, so qh is read a byte at a time. */
template <> __device__ __forceinline__ float dequant_elem<KILN_TYPE_Q5_0>(const void *row, int64_t e) {
    const block_q5_0 *b = (const block_q5_0 *)row + e / QK5_0;
    const int j = (int)(e % QK5_0);
    const int lo = j < 16 ? (b->qs[j] & 0xF) : (b->qs[j - 16] >> 4);
    const int q = lo | (((b->qh[j >> 3] >> (j & 7)) & 1) << 4);
    return __fmul_rn((float)(q - 16), h2f(b->d));
}
template <> __device__ __forceinline__ float dequant_elem<KILN_TYPE_Q8_0>(const void *row, int64_t e) {
    const block_q8_0 *b = (const block_q8_0 *)row + e / QK8_0;
    return __fmul_rn((float)b->qs[e % QK8_0], h2f(b->d));
}
/* Q4_K and Q5_K: element e of a super-block lies in 64-chunk e/64, sub-block e/32, nibble (e/32)%2;
 * x = (d * sc) * q - dmin * m. */
template <> __device__ __forceinline__ float dequant_elem<KILN_TYPE_Q4_K>(const void *row, int64_t i) {
    const block_q4_K *b = (const block_q4_K *)row + i / QK_K;
    const int e = (int)(i % QK_K), sub = e / 32, l = e % 32;
    int sc, m;
    scale_min_k4(sub, b->scales, &sc, &m);
    const uint8_t byte = b->qs[32 * (e / 64) + l];
    const int q = (sub & 1) ? byte >> 4 : byte & 0xF;
    const float d1 = __fmul_rn(h2f(b->d), (float)sc), m1 = __fmul_rn(h2f(b->dmin), (float)m);
    return __fsub_rn(__fmul_rn(d1, (float)q), m1);
}
template <> __device__ __forceinline__ float dequant_elem<KILN_TYPE_Q5_K>(const void *row, int64_t i) {
    const block_q5_K *b = (const block_q5_K *)row + i / QK_K;
    const int e = (int)(i % QK_K), sub = e / 32, l = e % 32;
    int sc, m;
    scale_min_k4(sub, b->scales, &sc, &m);
    const uint8_t byte = b->qs[32 * (e / 64) + l];
    const int q = ((sub & 1) ? byte >> 4 : byte & 0xF) | (((b->qh[l] >> sub) & 1) << 4);
    const float d1 = __fmul_rn(h2f(b->d), (float)sc), m1 = __fmul_rn(h2f(b->dmin), (float)m);
    return __fsub_rn(__fmul_rn(d1, (float)q), m1);
}
/* Q6_K: each 128-half h has ql[64], qh[32], 8 scales; element 32*g + l of it takes ql[l + 32*(g&1)] (low nibble
 * for g < 2, high for g >= 2) and bits 2g..2g+1 of qh[l]; x = (d * sc) * (q - 32). */
template <> __device__ __forceinline__ float dequant_elem<KILN_TYPE_Q6_K>(const void *row, int64_t i) {
    const block_q6_K *b = (const block_q6_K *)row + i / QK_K;
    const int e = (int)(i % QK_K), h = e / 128, r = e % 128, g = r / 32, l = r % 32;
    const uint8_t *ql = b->ql + 64 * h, *qh = b->qh + 32 * h;
    const uint8_t lo = ql[l + 32 * (g & 1)];
    const int q = ((g < 2 ? lo & 0xF : lo >> 4) | (((qh[l] >> (2 * g)) & 3) << 4)) - 32;
    const int sc = b->scales[8 * h + l / 16 + 2 * g];
    return __fmul_rn(__fmul_rn(h2f(b->d), (float)sc), (float)q);
}

/* The formats issue 18 added: blocks.cuh's decoders. */
template <> __device__ __forceinline__ float dequant_elem<KILN_TYPE_Q5_1>(const void *row, int64_t e) {
    return dequant_elem_q5_1(row, e);
}
template <> __device__ __forceinline__ float dequant_elem<KILN_TYPE_IQ4_NL>(const void *row, int64_t e) {
    return dequant_elem_iq4_nl(row, e);
}
template <> __device__ __forceinline__ float dequant_elem<KILN_TYPE_Q2_K>(const void *row, int64_t e) {
    return dequant_elem_q2_K(row, e);
}
template <> __device__ __forceinline__ float dequant_elem<KILN_TYPE_Q3_K>(const void *row, int64_t e) {
    return dequant_elem_q3_K(row, e);
}
template <> __device__ __forceinline__ float dequant_elem<KILN_TYPE_IQ4_XS>(const void *row, int64_t e) {
    return dequant_elem_iq4_xs(row, e);
}

/* One block per token: consecutive threads on consecutive elements of the row, so stores coalesce and a block
 * header is read by the warp from L1. out (T, C); the table's rows are row_bytes apart. */
template <int TYPE>
__global__ void embed_kernel(float *out,            /* (T, C) */
                             const uint8_t *table,  /* (V rows of row_bytes) */
                             size_t row_bytes, const int32_t *ids /* (T) */, int64_t C, float scale) {
    kiln_pdl_wait();
    kiln_pdl_trigger();
    const int64_t t = blockIdx.x;
    const void *row = table + (size_t)ids[t] * row_bytes;
    float *o = out + t * C;
    const bool scaled = scale != 1.0f; /* the CPU multiplies only for embd_scale; x * 1 is x anyway */
    for (int64_t e = threadIdx.x; e < C; e += blockDim.x) {
        const float v = dequant_elem<TYPE>(row, e);
        o[e] = scaled ? __fmul_rn(v, scale) : v;
    }
}

extern "C" kiln_status kiln_cuda_embed(float *out, const kiln_cuda_wt *table, const int32_t *d_ids, int64_t T, float scale,
                                       void *stream) {
    const int64_t C = table->cols, blck = kiln_type_block_size(table->type);
    if (T < 0 || C <= 0 || blck <= 0 || C % blck)
        return kiln_fail(KILN_ERR_INVALID, "cuda embed: %lld tokens of %lld columns of %s", (long long)T, (long long)C,
                         kiln_type_name(table->type) ? kiln_type_name(table->type) : "?");
    if (T == 0) return KILN_OK;
    if (T > INT32_MAX) return kiln_fail(KILN_ERR_INVALID, "cuda embed: %lld tokens is too many for one launch", (long long)T);
    const int threads = C >= 1024 ? 256 : 128;
    cudaStream_t s = (cudaStream_t)stream;
    const uint8_t *d = (const uint8_t *)table->data;
    const size_t rb = table->row_bytes;
    cudaError_t e;
    switch (table->type) {
#define EMBED(T_) e = kiln_launch(embed_kernel<T_>, dim3((unsigned)T), dim3(threads), 0, s, out, d, rb, d_ids, C, scale); break
    case KILN_TYPE_F32: EMBED(KILN_TYPE_F32);
    case KILN_TYPE_F16: EMBED(KILN_TYPE_F16);
    case KILN_TYPE_BF16: EMBED(KILN_TYPE_BF16);
    case KILN_TYPE_Q4_0: EMBED(KILN_TYPE_Q4_0);
    case KILN_TYPE_Q4_1: EMBED(KILN_TYPE_Q4_1);
    case KILN_TYPE_Q5_0: EMBED(KILN_TYPE_Q5_0);
    case KILN_TYPE_Q8_0: EMBED(KILN_TYPE_Q8_0);
    case KILN_TYPE_Q4_K: EMBED(KILN_TYPE_Q4_K);
    case KILN_TYPE_Q5_K: EMBED(KILN_TYPE_Q5_K);
    case KILN_TYPE_Q6_K: EMBED(KILN_TYPE_Q6_K);
    case KILN_TYPE_Q5_1: EMBED(KILN_TYPE_Q5_1);
    case KILN_TYPE_IQ4_NL: EMBED(KILN_TYPE_IQ4_NL);
    case KILN_TYPE_Q2_K: EMBED(KILN_TYPE_Q2_K);
    case KILN_TYPE_Q3_K: EMBED(KILN_TYPE_Q3_K);
    case KILN_TYPE_IQ4_XS: EMBED(KILN_TYPE_IQ4_XS);
#undef EMBED
    default:
        return kiln_fail(KILN_ERR_UNSUPPORTED, "cuda embed: table type %s is not supported",
                         kiln_type_name(table->type) ? kiln_type_name(table->type) : "?");
    }
    return checked("embed", e);
}

/* ---------------------------------------------------------------- residual add + RMSNorm (+ prepared out)
 * One block per row, the row held in registers: thread tid owns the accesses i = tid + j * threads (j < MAXN) of
 * V floats each (V = 4, float4, when C % 4 == 0 and every pointer is 16-byte aligned; else 1). Every global
 * value is loaded up front (x, y, post_w, w: one round trip of latency), so the kernel reads x, y, w once and
 * writes x and out once, with one block_sum (one barrier) per norm. In decode (T = 1, C 2048..8192) this is
 * latency bound: the old three-pass kernel with two double reductions of two barriers each took 4.31 us (ncu).
 * Register budget: 4 arrays x MAXN x V floats; MAXN * V = 16 keeps it at 64 under the 128 that 512 threads allow
 * (93 used), so rows up to 512 x 16 = 8192 floats never spill; 16384 (MAXN 8 x float4: ~90 bytes of spills) is the
 * widest row taken, wider ones are KILN_ERR_UNSUPPORTED. The squares are still summed in double (free here: a few
 * DADDs per thread), so the result keeps the old kernel's error bound against the CPU. */

template <int V> struct fvec { float v[V]; };

template <int V> static __device__ __forceinline__ fvec<V> load(const float *p) {
    fvec<V> r;
    if (V == 4) {
        const float4 f = *(const float4 *)p;
        r.v[0] = f.x, r.v[1] = f.y, r.v[2] = f.z, r.v[3] = f.w;
    } else {
        for (int k = 0; k < V; k++) r.v[k] = p[k];
    }
    return r;
}

template <int V> static __device__ __forceinline__ void store(float *p, const fvec<V> &r) {
    if (V == 4)
        *(float4 *)p = make_float4(r.v[0], r.v[1], r.v[2], r.v[3]);
    else
        for (int k = 0; k < V; k++) p[k] = r.v[k];
}

#define RN_MAX_THREADS 512


/* x += y or x += (rmsnorm(y) * post_w), then out = rmsnorm(x) * w and, when XP, out's prepared form into
 * xq (T, C) / xds (T, C / 32). Every load precedes every store of the same thread, and each thread stores only the
 * elements it loaded, so y may be out and out may be x. */
template <int V, int MAXN, bool XP>
__global__ void __launch_bounds__(RN_MAX_THREADS)
    residual_norm_kernel(float *x,            /* (T, C) */
                         const float *y,      /* (T, C) or NULL */
                         const float *post_w, /* (C) or NULL */
                         float post_eps, float *out /* (T, C) or NULL */, const float *w /* (C) */, float eps, int C,
                         int8_t *xq /* (T, C) when XP */, float2 *xds /* (T, C / 32) when XP */) {
    kiln_pdl_wait();
    kiln_pdl_trigger();
    __shared__ double sh_post[32], sh_norm[32]; /* one per reduction: each is written once, behind its own barrier */
    const int n = C / V, nt = blockDim.x, tid = threadIdx.x;
    const int64_t r = blockIdx.x;
    float *xr = x + r * C;                  /* (C) */
    const float *yr = y ? y + r * C : NULL; /* (C) */
    float *outr = out ? out + r * C : NULL; /* (C) */
    fvec<V> xv[MAXN], yv[MAXN], pv[MAXN], wv[MAXN];
#pragma unroll
    for (int j = 0; j < MAXN; j++) {
        const int i = tid + j * nt;
        if (i < n) {
            xv[j] = load<V>(xr + i * V);
            if (yr) yv[j] = load<V>(yr + i * V);
            if (yr && post_w) pv[j] = load<V>(post_w + i * V);
            if (outr) wv[j] = load<V>(w + i * V);
        }
    }
    if (yr) {
        float s1 = 0.0f;
        if (post_w) {
            double sy = 0.0;
#pragma unroll
            for (int j = 0; j < MAXN; j++)
                if (tid + j * nt < n)
#pragma unroll
                    for (int k = 0; k < V; k++) sy += (double)__fmul_rn(yv[j].v[k], yv[j].v[k]);
            s1 = kiln_rms_scale(block_sum(sy, sh_post), C, post_eps);
        }
#pragma unroll
        for (int j = 0; j < MAXN; j++) {
            const int i = tid + j * nt;
            if (i >= n) continue;
#pragma unroll
            for (int k = 0; k < V; k++)
                xv[j].v[k] = post_w ? __fadd_rn(xv[j].v[k], __fmul_rn(__fmul_rn(yv[j].v[k], s1), pv[j].v[k]))
                                    : __fadd_rn(xv[j].v[k], yv[j].v[k]);
            store<V>(xr + i * V, xv[j]);
        }
    }
    if (!outr) return;
    double ss = 0.0;
#pragma unroll
    for (int j = 0; j < MAXN; j++)
        if (tid + j * nt < n)
#pragma unroll
            for (int k = 0; k < V; k++) ss += (double)__fmul_rn(xv[j].v[k], xv[j].v[k]);
    const float s2 = kiln_rms_scale(block_sum(ss, sh_norm), C, eps);
#pragma unroll
    for (int j = 0; j < MAXN; j++) {
        if (j * nt >= n) break; /* the same for the whole block: the shuffles below see every lane */
        const int i = tid + j * nt;
        const bool ok = i < n;
        fvec<V> o;
#pragma unroll
        for (int k = 0; k < V; k++) o.v[k] = ok ? __fmul_rn(__fmul_rn(xv[j].v[k], s2), wv[j].v[k]) : 0.0f;
        if (ok) store<V>(outr + i * V, o);
        if (XP) kiln_q8_store_group<V>(o.v, ok, xq + r * C + i * V, xds + r * (C / 32) + i * V / 32);
    }
}

/* The shared launcher: xp NULL for kiln_cuda_residual_norm. */
static kiln_status residual_norm(const char *what, float *x, const float *y, const float *post_w, float post_eps,
                                 float *out, void *xp, const float *w, float eps, int64_t T, int64_t C, void *stream) {
    if (T < 0 || C <= 0 || (out && !w) || !x)
        return kiln_fail(KILN_ERR_INVALID, "cuda %s: T %lld, C %lld, out %s%s", what, (long long)T, (long long)C,
                         out ? "given" : "absent", out && !w ? " without w" : "");
    if (xp && (!out || T > KILN_CUDA_GEMM_SMALL_MAX_T || C % 32 || !aligned16(xp)))
        return kiln_fail(KILN_ERR_INVALID, "cuda %s: T %lld (at most %d), C %lld (a multiple of 32), out %s, xp %s", what,
                         (long long)T, KILN_CUDA_GEMM_SMALL_MAX_T, (long long)C, out ? "given" : "NULL",
                         aligned16(xp) ? "16-byte aligned" : "not 16-byte aligned");
    if (T == 0 || (!y && !out)) return KILN_OK;
    if (T > INT32_MAX) return kiln_fail(KILN_ERR_INVALID, "cuda %s: %lld rows is too many", what, (long long)T);
    const bool vec = C % 4 == 0 && aligned16(x) && aligned16(y) && aligned16(post_w) && aligned16(out) && aligned16(w);
    const int64_t n = vec ? C / 4 : C;             /* accesses per row */
    const int maxn = vec ? (n <= RN_MAX_THREADS * 4 ? 4 : 8) : 16; /* accesses per thread, at most */
    if (n > (int64_t)RN_MAX_THREADS * maxn)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "cuda %s: rows of %lld floats (at most %d, or %d when unaligned or C %% 4 != 0)",
                         what, (long long)C, RN_MAX_THREADS * 8 * 4, RN_MAX_THREADS * 16);
    const int threads = kiln_cuda_norm_threads(n, maxn); /* 128 for C = 2048, 256 for 4096, 512 for 8192 */
    const dim3 grid((unsigned)T), block((unsigned)threads);
    cudaStream_t s = (cudaStream_t)stream;
    int8_t *xq = (int8_t *)xp;                                     /* (T, C) */
    float2 *xds = xp ? (float2 *)((int8_t *)xp + T * C) : NULL;    /* (T, C / 32) */
    const int c = (int)C;
    cudaError_t e;
#define RN(V_, M_, XP_) kiln_launch(residual_norm_kernel<V_, M_, XP_>, grid, block, 0, s, x, y, post_w, post_eps, out, w, eps, c, xq, xds)
    if (xp)
        e = !vec ? RN(1, 16, true) : maxn == 4 ? RN(4, 4, true) : RN(4, 8, true);
    else
        e = !vec ? RN(1, 16, false) : maxn == 4 ? RN(4, 4, false) : RN(4, 8, false);
#undef RN
    return checked(what, e);
}

extern "C" kiln_status kiln_cuda_residual_norm(float *x, const float *y, const float *post_w, float post_eps, float *out,
                                               const float *w, float eps, int64_t T, int64_t C, void *stream) {
    return residual_norm("residual_norm", x, y, post_w, post_eps, out, NULL, w, eps, T, C, stream);
}

extern "C" kiln_status kiln_cuda_residual_norm_xp(float *x, const float *y, const float *post_w, float post_eps, float *out,
                                                  void *xp, const float *w, float eps, int64_t T, int64_t C, void *stream) {
    if (!xp) return kiln_fail(KILN_ERR_INVALID, "cuda residual_norm_xp: xp is NULL");
    return residual_norm("residual_norm_xp", x, y, post_w, post_eps, out, xp, w, eps, T, C, stream);
}

/* ---------------------------------------------------------------- q/k/v epilogue
 * One block per (token, head), the NH query heads first, then the NKV key heads (each also stores its value
 * head). The head's HS floats sit in shared memory through bias, norm and rotation, in llama.c's order. */

#define QKV_MAX_HS 256

/* Decode (T = 1, 7B: 40 blocks of 64 threads) is pure latency: the head's loads, one or two barriers, the rope
 * chain, the stores. So the in-head indices are 32-bit (HS <= 256), the block's (token, head) comes from one
 * 32-bit division, the squares are summed only when a norm wants them, and each angle takes one sincosf (one
 * range reduction for both, CUDA's sinf/cosf accuracy) instead of cosf and sinf. */
__global__ void qkv_post_kernel(float *q,                         /* (T, NH*HS) */
                                float *k, float *v,               /* (T, NKV*HS) each; written back for a block type */
                                const float *bq,                  /* (NH*HS) or NULL */
                                const float *bk, const float *bv, /* (NKV*HS) each, or NULL */
                                const float *q_norm, const float *k_norm, /* (HS) each, or NULL */
                                float eps, const int32_t *d_pos0 /* (1), or (T) with d_seq */,
                                const int32_t *d_seq /* (T) or NULL */, size_t seq_stride, int64_t NH, int64_t NKV, int64_t HS,
                                int64_t rope_dim, float theta_scale, kiln_cuda_rope_freq rf, bool neox, bool rope,
                                float q_scale, void *k_cache, void *v_cache, /* (rows, NKV*HS) of kt, vt */
                                int kt, int vt, int64_t rows) {
    kiln_pdl_wait();
    kiln_pdl_trigger();
    __shared__ float hx[QKV_MAX_HS]; /* (HS) the head being processed */
    __shared__ double sh[32];
    const unsigned nh = (unsigned)(NH + NKV), t = blockIdx.x / nh, h = blockIdx.x % nh;
    const int hs = (int)HS, tid = threadIdx.x, nt = blockDim.x;
    const bool is_q = h < NH;
    const int64_t kh = (int64_t)h - NH; /* the key/value head when !is_q */
    const int64_t p = d_seq ? (int64_t)d_pos0[t] : (int64_t)*d_pos0 + t;
    if (d_seq) { /* row t's own sequence's cache */
        k_cache = (char *)k_cache + (size_t)d_seq[t] * seq_stride;
        v_cache = (char *)v_cache + (size_t)d_seq[t] * seq_stride;
    }
    float *qh = q + ((int64_t)t * NH + h) * HS;                           /* (HS) when is_q */
    const float *src = is_q ? qh : k + ((int64_t)t * NKV + kh) * HS;     /* (HS) */
    const float *b = is_q ? (bq ? bq + h * HS : NULL) : (bk ? bk + kh * HS : NULL);
    const float *nw = is_q ? q_norm : k_norm; /* (HS) */

    double ss = 0.0;
    for (int i = tid; i < hs; i += nt) {
        float val = src[i];
        if (b) val = __fadd_rn(val, b[i]);
        hx[i] = val;
        if (nw) ss += (double)__fmul_rn(val, val);
    }
    if (nw) { /* each thread rescales the elements it wrote: block_sum's barrier is the only one needed */
        const float sc = kiln_rms_scale(block_sum(ss, sh), HS, eps);
        for (int i = tid; i < hs; i += nt) hx[i] = __fmul_rn(__fmul_rn(hx[i], sc), nw[i]);
    }
    __syncthreads();
    if (rope) { /* rope.cuh: the CPU's angles and rotation, bit for bit */
        const int half = (int)(rope_dim / 2);
        for (int i = tid; i < half; i += nt) {
            float c, sn;
            kiln_rope_cs(i, (float)p, theta_scale, rf, &c, &sn);
            kiln_rope_rotate(hx, i, half, neox, c, sn);
        }
        __syncthreads();
    }
    if (is_q) {
        const bool scaled = q_scale != 1.0f;
        for (int i = tid; i < hs; i += nt) qh[i] = scaled ? __fmul_rn(hx[i], q_scale) : hx[i];
        return;
    }
    /* position p lives in ring row p % rows */
    const int64_t row = p % rows;
    float *kh_src = k + ((int64_t)t * NKV + kh) * HS, *vh = v + ((int64_t)t * NKV + kh) * HS; /* (HS) each */
    const float *vb = bv ? bv + kh * HS : NULL;                                                 /* (HS) */
    if (kt == KILN_KV_F16 && vt == KILN_KV_F16) { /* f16 round-to-nearest-even, kiln_f32_to_fp16's rounding */
        uint16_t *kc = (uint16_t *)k_cache + (row * NKV + kh) * HS, *vc = (uint16_t *)v_cache + (row * NKV + kh) * HS;
        for (int i = tid; i < hs; i += nt) {
            kc[i] = __half_as_ushort(__float2half_rn(hx[i]));
            const float val = vb ? __fadd_rn(vh[i], vb[i]) : vh[i];
            vc[i] = __half_as_ushort(__float2half_rn(val));
        }
        return;
    }
    /* other types: element by element, or the final values back over k and v for kiln_cuda_kv_quantize */
    const size_t e0 = (size_t)(row * NKV + kh) * HS;
    for (int i = tid; i < hs; i += nt) {
        const float val = vb ? __fadd_rn(vh[i], vb[i]) : vh[i];
        if (kiln_kv_is_block(kt)) kh_src[i] = hx[i];
        else kiln_kv_store1(kt, k_cache, e0 + i, hx[i]);
        if (kiln_kv_is_block(vt)) vh[i] = val;
        else kiln_kv_store1(vt, v_cache, e0 + i, val);
    }
}

/* One warp per block of 32: row (p0 + t) % rows, block b of src's row t, by kiln_kv_quantize_warp (kv.cuh). */
__global__ void kv_quantize_kernel(uint8_t *cache, const float *src /* (T, KV) */, int type, const int32_t *d_pos0,
                                   const int32_t *d_seq, size_t seq_stride, int64_t T, int64_t KV, int64_t rows) {
    kiln_pdl_wait();
    kiln_pdl_trigger();
    const int64_t nb = KV / 32, w = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (w >= T * nb) return; /* whole warps: the shuffles see all their lanes */
    const int64_t t = w / nb, b = w % nb, row = (d_seq ? (int64_t)d_pos0[t] : (int64_t)*d_pos0 + t) % rows;
    if (d_seq) cache += (size_t)d_seq[t] * seq_stride;
    const bool q8 = type == KILN_KV_Q8_0;
    kiln_kv_quantize_warp(cache + (size_t)(row * nb + b) * (q8 ? KILN_KV_Q8_0_BYTES : KILN_KV_Q4_0_BYTES), src[t * KV + b * 32 + threadIdx.x % 32], q8);
}

static kiln_status kv_quantize(void *cache, const float *src, kiln_kv_type type, const int32_t *d_pos0, const int32_t *d_seq,
                               size_t seq_stride, int64_t T, int64_t KV, int64_t rows, void *stream) {
    if (!kiln_kv_is_block(type) || T < 0 || KV <= 0 || KV % 32 || rows <= 0)
        return kiln_fail(KILN_ERR_INVALID, "cuda kv_quantize: type %d, T %lld, KV %lld (a multiple of 32), rows %lld", (int)type,
                         (long long)T, (long long)KV, (long long)rows);
    if (T == 0) return KILN_OK;
    const int64_t warps = T * (KV / 32), blocks = (warps + 3) / 4;
    if (blocks > INT32_MAX) return kiln_fail(KILN_ERR_INVALID, "cuda kv_quantize: %lld blocks is too many", (long long)blocks);
    return checked("kv_quantize", kiln_launch(kv_quantize_kernel, dim3((unsigned)blocks), dim3(128), 0, (cudaStream_t)stream,
                                              (uint8_t *)cache, src, (int)type, d_pos0, d_seq, seq_stride, T, KV, rows));
}

extern "C" kiln_status kiln_cuda_kv_quantize(void *cache, const float *src, kiln_kv_type type, const int32_t *d_pos0,
                                             int64_t T, int64_t KV, int64_t rows, void *stream) {
    return kv_quantize(cache, src, type, d_pos0, NULL, 0, T, KV, rows, stream);
}

static kiln_status qkv_post(float *q, float *k, float *v, const float *bq, const float *bk, const float *bv,
                            const float *q_norm, const float *k_norm, float eps, const int32_t *d_pos0, const int32_t *d_seq,
                            size_t seq_stride, int64_t T, int64_t NH, int64_t NKV, int64_t HS, int64_t rope_dim, float base,
                            const float *h_rope_freq, float rope_mscale, bool neox, bool nope, float q_scale, void *k_cache,
                            void *v_cache, kiln_kv_type type_k, kiln_kv_type type_v, int64_t rows, void *stream) {
    if (T < 0 || NH <= 0 || NKV <= 0 || HS <= 0 || HS > QKV_MAX_HS || rows <= 0 ||
        (!nope && (rope_dim <= 0 || rope_dim % 2 || rope_dim > HS)))
        return kiln_fail(KILN_ERR_INVALID, "cuda qkv_post: T %lld, NH %lld, NKV %lld, HS %lld (at most %d), rope_dim %lld, rows %lld",
                         (long long)T, (long long)NH, (long long)NKV, (long long)HS, QKV_MAX_HS, (long long)rope_dim,
                         (long long)rows);
    if (!kiln_kv_type_name(type_k) || !kiln_kv_type_name(type_v) ||
        ((kiln_kv_is_block(type_k) || kiln_kv_is_block(type_v)) && (NKV * HS) % 32))
        return kiln_fail(KILN_ERR_UNSUPPORTED, "cuda qkv_post: KV cache types %d, %d over rows of %lld (the block types need a "
                         "multiple of 32)", (int)type_k, (int)type_v, (long long)(NKV * HS));
    if (T == 0) return KILN_OK;
    const int64_t blocks = T * (NH + NKV);
    if (blocks > INT32_MAX) return kiln_fail(KILN_ERR_INVALID, "cuda qkv_post: %lld heads is too many", (long long)blocks);
    /* The host's powf, the very call ops_rope.c makes, so theta_scale has the CPU's bits. */
    const float theta_scale = nope ? 1.0f : powf(base, -2.0f / (float)rope_dim);
    const kiln_cuda_rope_freq rf = kiln_cuda_rope_freq_make(nope ? NULL : h_rope_freq, rope_dim / 2, nope ? 1.0f : rope_mscale);
    /* A thread per rotated pair: HS/2 threads, at least a warp, at most 128 (HS 256); norm.cuh's per-head sums
     * of squares follow this count. */
    const int threads = kiln_qkv_post_threads(HS);
    const cudaError_t e = kiln_launch(qkv_post_kernel, dim3((unsigned)blocks), dim3(threads), 0, (cudaStream_t)stream, q, k,
                                      v, bq, bk, bv, q_norm, k_norm, eps, d_pos0, d_seq, seq_stride, NH, NKV, HS, rope_dim, theta_scale, rf, neox,
                                      !nope, q_scale, k_cache, v_cache, (int)type_k, (int)type_v, rows);
    TRY(checked("qkv_post", e));
    if (kiln_kv_is_block(type_k)) TRY(kv_quantize(k_cache, k, type_k, d_pos0, d_seq, seq_stride, T, NKV * HS, rows, stream));
    if (kiln_kv_is_block(type_v)) TRY(kv_quantize(v_cache, v, type_v, d_pos0, d_seq, seq_stride, T, NKV * HS, rows, stream));
    return KILN_OK;
}

extern "C" kiln_status kiln_cuda_qkv_post(float *q, float *k, float *v, const float *bq, const float *bk,
                                          const float *bv, const float *q_norm, const float *k_norm, float eps,
                                          const int32_t *d_pos0, int64_t T, int64_t NH, int64_t NKV, int64_t HS,
                                          int64_t rope_dim, float base, const float *h_rope_freq, float rope_mscale,
                                          bool neox, bool nope, float q_scale, void *k_cache, void *v_cache,
                                          kiln_kv_type type_k, kiln_kv_type type_v, int64_t rows, void *stream) {
    return qkv_post(q, k, v, bq, bk, bv, q_norm, k_norm, eps, d_pos0, NULL, 0, T, NH, NKV, HS, rope_dim, base, h_rope_freq,
                    rope_mscale, neox, nope, q_scale, k_cache, v_cache, type_k, type_v, rows, stream);
}

extern "C" kiln_status kiln_cuda_qkv_post_rows(float *q, float *k, float *v, const float *bq, const float *bk,
                                               const float *bv, const float *q_norm, const float *k_norm, float eps,
                                               const int32_t *d_pos, const int32_t *d_seq, size_t seq_stride, int64_t T,
                                               int64_t NH, int64_t NKV, int64_t HS, int64_t rope_dim, float base,
                                               const float *h_rope_freq, float rope_mscale, bool neox, bool nope,
                                               float q_scale, void *k_cache, void *v_cache, kiln_kv_type type_k,
                                               kiln_kv_type type_v, int64_t rows, void *stream) {
    if (!d_pos || !d_seq) return kiln_fail(KILN_ERR_INVALID, "cuda qkv_post_rows: no positions or sequence indices");
    return qkv_post(q, k, v, bq, bk, bv, q_norm, k_norm, eps, d_pos, d_seq, seq_stride, T, NH, NKV, HS, rope_dim, base,
                    h_rope_freq, rope_mscale, neox, nope, q_scale, k_cache, v_cache, type_k, type_v, rows, stream);
}

/* ---------------------------------------------------------------- GLU, sigmoid gate, scale/softcap
 * Grid-stride over n, float4 when every pointer is 16-byte aligned (the tail done one at a time). out may
 * equal a: each element is read before the same thread writes it. */

enum { OP_SWIGLU, OP_GEGLU, OP_SIGMOID_MUL, OP_SCALE, OP_SOFTCAP };

template <int OP> static __device__ __forceinline__ float apply(float a, float b, float scale, float cap) {
    if (OP == OP_SWIGLU) /* g / (1 + exp(-g)) * up, ops_swiglu.c */
        return __fmul_rn(__fdiv_rn(a, __fadd_rn(1.0f, expf(-a))), b);
    if (OP == OP_GEGLU) { /* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) * up, ops_arch.c, left to right */
        const float inner = __fadd_rn(a, __fmul_rn(__fmul_rn(__fmul_rn(0.044715f, a), a), a));
        const float th = tanhf(__fmul_rn(0.7978845608028654f, inner));
        return __fmul_rn(__fmul_rn(__fmul_rn(0.5f, a), __fadd_rn(1.0f, th)), b);
    }
    if (OP == OP_SIGMOID_MUL) /* x * (1 / (1 + exp(-g))) */
        return __fmul_rn(a, __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-b))));
    if (OP == OP_SCALE) return __fmul_rn(a, scale);
    /* OP_SOFTCAP: cap * tanh(x * scale / cap) */
    return __fmul_rn(cap, tanhf(__fdiv_rn(__fmul_rn(a, scale), cap)));
}

/* out (n) = apply(a (n), b (n)); b unused by OP_SCALE and OP_SOFTCAP. */
template <int OP, bool VEC>
__global__ void elementwise_kernel(float *out, const float *a, const float *b, int64_t n, float scale, float cap) {
    kiln_pdl_wait();
    kiln_pdl_trigger();
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const bool binary = OP == OP_SWIGLU || OP == OP_GEGLU || OP == OP_SIGMOID_MUL;
    if (VEC) {
        const int64_t n4 = n / 4;
        for (int64_t j = i; j < n4; j += stride) {
            const float4 av = ((const float4 *)a)[j];
            const float4 bv = binary ? ((const float4 *)b)[j] : av;
            float4 o;
            o.x = apply<OP>(av.x, bv.x, scale, cap);
            o.y = apply<OP>(av.y, bv.y, scale, cap);
            o.z = apply<OP>(av.z, bv.z, scale, cap);
            o.w = apply<OP>(av.w, bv.w, scale, cap);
            ((float4 *)out)[j] = o;
        }
        i += n4 * 4;
    }
    for (; i < n; i += stride) out[i] = apply<OP>(a[i], binary ? b[i] : 0.0f, scale, cap);
}

template <int OP>
static kiln_status elementwise(const char *what, float *out, const float *a, const float *b, int64_t n, float scale,
                               float cap, void *stream) {
    if (n < 0) return kiln_fail(KILN_ERR_INVALID, "cuda %s: %lld elements", what, (long long)n);
    if (n == 0) return KILN_OK;
    const int threads = 256;
    const bool vec = aligned16(out) && aligned16(a) && aligned16(b);
    const int64_t work = vec ? n / 4 + 1 : n;
    /* Enough blocks to fill the GPU several times over (132 SMs x 8 blocks of 256), the rest by grid stride. */
    const int64_t max_blocks = 132 * 8 * 4;
    int64_t blocks = (work + threads - 1) / threads;
    if (blocks > max_blocks) blocks = max_blocks;
    cudaStream_t s = (cudaStream_t)stream;
    const dim3 grid((unsigned)blocks), block(threads);
    const cudaError_t e = vec ? kiln_launch(elementwise_kernel<OP, true>, grid, block, 0, s, out, a, b, n, scale, cap)
                              : kiln_launch(elementwise_kernel<OP, false>, grid, block, 0, s, out, a, b, n, scale, cap);
    return checked(what, e);
}

extern "C" kiln_status kiln_cuda_glu(float *out, const float *gate, const float *up, int64_t n, bool geglu, void *stream) {
    return geglu ? elementwise<OP_GEGLU>("glu (geglu)", out, gate, up, n, 0.0f, 0.0f, stream)
                 : elementwise<OP_SWIGLU>("glu (swiglu)", out, gate, up, n, 0.0f, 0.0f, stream);
}

extern "C" kiln_status kiln_cuda_sigmoid_mul(float *x, const float *g, int64_t n, void *stream) {
    return elementwise<OP_SIGMOID_MUL>("sigmoid_mul", x, x, g, n, 0.0f, 0.0f, stream);
}

extern "C" kiln_status kiln_cuda_scale_softcap(float *x, int64_t n, float scale, float cap, void *stream) {
    if (!(cap >= 0.0f)) return kiln_fail(KILN_ERR_INVALID, "cuda scale_softcap: cap %g (must be >= 0)", (double)cap);
    return cap > 0.0f ? elementwise<OP_SOFTCAP>("scale_softcap", x, x, NULL, n, scale, cap, stream)
                      : elementwise<OP_SCALE>("scale_softcap", x, x, NULL, n, scale, cap, stream);
}

/* ---------------------------------------------------------------- argmax
 * One block of 1024 threads per row (V up to 256K: 1 MiB, a few microseconds for one SM). (v, i) beats (best, bi)
 * when v > best, or v == best at a lower index, so the lowest index of equal maxima wins whatever the order of
 * the tree. NaN compares false both ways and never wins: NaNs are ignored, and a row of NaNs only gives 0. (The
 * CPU sampler's argmax differs only when x[0] is NaN: it then keeps 0.) Rows of -inf give their first index. */

static __device__ __forceinline__ void arg_take(float v, int64_t i, float *best, int64_t *bi) {
    if (v > *best || (v == *best && i < *bi)) *best = v, *bi = i;
}

#define ARGMAX_THREADS 1024

template <bool VEC> __global__ void argmax_kernel(int32_t *d_out /* (T) */, const float *x /* (T, n) */, int64_t n) {
    kiln_pdl_wait();
    kiln_pdl_trigger();
    __shared__ float sv[32];
    __shared__ int64_t si[32];
    const float *row = x + (int64_t)blockIdx.x * n; /* (n) */
    float best = -INFINITY;
    int64_t bi = n; /* past the end: taken over by any non-NaN value, -inf included */
    const int64_t tid = threadIdx.x, bd = blockDim.x;
    if (VEC) {
        const float4 *r4 = (const float4 *)row;
        const int64_t n4 = n / 4;
        int64_t j = tid;
        for (; j + 3 * bd < n4; j += 4 * bd) { /* four loads in flight per thread */
            const float4 a = r4[j], b = r4[j + bd], c = r4[j + 2 * bd], d = r4[j + 3 * bd];
            arg_take(a.x, 4 * j, &best, &bi), arg_take(a.y, 4 * j + 1, &best, &bi);
            arg_take(a.z, 4 * j + 2, &best, &bi), arg_take(a.w, 4 * j + 3, &best, &bi);
            const int64_t jb = 4 * (j + bd), jc = 4 * (j + 2 * bd), jd = 4 * (j + 3 * bd);
            arg_take(b.x, jb, &best, &bi), arg_take(b.y, jb + 1, &best, &bi);
            arg_take(b.z, jb + 2, &best, &bi), arg_take(b.w, jb + 3, &best, &bi);
            arg_take(c.x, jc, &best, &bi), arg_take(c.y, jc + 1, &best, &bi);
            arg_take(c.z, jc + 2, &best, &bi), arg_take(c.w, jc + 3, &best, &bi);
            arg_take(d.x, jd, &best, &bi), arg_take(d.y, jd + 1, &best, &bi);
            arg_take(d.z, jd + 2, &best, &bi), arg_take(d.w, jd + 3, &best, &bi);
        }
        for (; j < n4; j += bd) {
            const float4 a = r4[j];
            arg_take(a.x, 4 * j, &best, &bi), arg_take(a.y, 4 * j + 1, &best, &bi);
            arg_take(a.z, 4 * j + 2, &best, &bi), arg_take(a.w, 4 * j + 3, &best, &bi);
        }
        for (int64_t i = 4 * n4 + tid; i < n; i += bd) arg_take(row[i], i, &best, &bi);
    } else {
        for (int64_t i = tid; i < n; i += bd) arg_take(row[i], i, &best, &bi);
    }
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, best, o);
        const int64_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
        arg_take(ov, oi, &best, &bi);
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    if (lane == 0) sv[warp] = best, si[warp] = bi;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < nw; w++) arg_take(sv[w], si[w], &best, &bi);
        d_out[blockIdx.x] = bi < n ? (int32_t)bi : 0;
    }
}

extern "C" kiln_status kiln_cuda_argmax(int32_t *d_out, const float *x, int64_t T, int64_t n, void *stream) {
    if (T < 0 || n <= 0 || n > INT32_MAX || T > INT32_MAX)
        return kiln_fail(KILN_ERR_INVALID, "cuda argmax: %lld rows of %lld", (long long)T, (long long)n);
    if (T == 0) return KILN_OK;
    /* every row 16-byte aligned: the base, and a whole number of float4 per row */
    const bool vec = aligned16(x) && n % 4 == 0;
    int64_t threads = ARGMAX_THREADS;
    const int64_t per = vec ? n / 4 : n;
    if (per < threads) threads = (per + 31) / 32 * 32; /* small rows (tests): no idle warps */
    cudaStream_t s = (cudaStream_t)stream;
    const dim3 grid((unsigned)T), block((unsigned)threads);
    const cudaError_t e = vec ? kiln_launch(argmax_kernel<true>, grid, block, 0, s, d_out, x, n)
                              : kiln_launch(argmax_kernel<false>, grid, block, 0, s, d_out, x, n);
    return checked("argmax", e);
}
