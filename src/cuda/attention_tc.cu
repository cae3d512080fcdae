/* attention_tc.cu: the prefill attention of inference on tensor cores (attention.cu dispatches here for head sizes
 * 64 and 128 over an f16 cache without softcap, when T > ATTN_DECODE_MAX_T; KILN_ATTN_TC=0 keeps the CUDA-core
 * kernel). FlashAttention-2 on mma.sync.m16n8k16 in f16 with f32 accumulators, as the training forward
 * (train_attention_tc.cu) does in bf16, with what inference adds: queries at positions p0 + t read from d_pos0 on
 * the device, keys from the ring cache (key j at row j % rows), a sliding window, and f32 queries and outputs.
 *
 * Precision: q is scaled by scale * log2(e) and rounded to f16 (2^-11 relative) as it is staged; k and v are the
 * cache's f16 bytes; the probabilities are rounded to f16 for P V. The CUDA-core kernel widens k and v exactly and
 * keeps q and P in f32, so this path differs from it by about 1e-3 of the output's scale
 * (tests/test_cuda_attention.c holds each path to its own bound). */
#include "cuda/attention_tc.h"
#include "cuda/launch.h"
#include "cuda/mma.cuh"

#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Keys lo(p) .. p for a query at p: window > 0 keeps the last `window` of them. */
static __device__ __forceinline__ int tc_first_key(int p, int window) { return window > 0 ? max(0, p - window + 1) : 0; }

/* Keys j0 .. j0 + 63 of one KV head's cache rows (stride elements apart, key j at row j % rows) into the swizzled
 * tile; keys past jlast zero-filled (their address is key j0's, which is mapped). The caller commits. */
template <int HS, int NT>
static __device__ __forceinline__ void kv_tile_async(uint32_t tile, const __half *x, size_t stride, int j0, int jlast, int rows) {
    constexpr int P = HS / 8, BN = 64;
    static_assert(BN * P % NT == 0, "whole passes of the block");
#pragma unroll
    for (int k = 0; k < BN * P / NT; k++) {
        const int i = k * NT + threadIdx.x, r = i / P, c = i % P, j = j0 + r;
        const bool valid = j <= jlast;
        cp_async16(tile + swz<HS>(r, c), x + (size_t)((valid ? j : j0) % rows) * stride + c * 8, valid);
    }
}

/* Grid (ceil(T / BM), NH), 32 NW threads, x reversed (the last query tiles see the most keys: they start first).
 * Block (x, h): tokens q0 .. q0 + BM - 1 of query head h, BM = 16 MT NW, warp w owning MT m-tiles of 16 rows. The
 * block's keys run from the first key of its first query to its last query's position, in tiles of BN = 64 keys of
 * KV head h / G, double-buffered; each warp skips a tile that lies wholly after its last query or (with a window)
 * wholly before its first one's window, and masks where a key may fall outside a row's range. Shared: Q BM x HS,
 * K and V 2 x 64 x HS f16: 48 KiB at HS 64 (BM 128), 80 at HS 128 (BM 64). A query at p >= max_pos (or p0 < 0)
 * breaks the contract: the block writes NaN. */
template <int HS, int NW, int MT>
__global__ void __launch_bounds__(32 * NW, 2)
attn_prefill_tc(float *out,            /* (T, NH*HS) */
                const float *q,        /* (T, NH*HS) */
                const __half *k_cache, /* (rows, NKV*HS) */
                const __half *v_cache, const int32_t *d_pos0, int T, int NH, int NKV, int window, int rows, int max_pos,
                float sl2 /* scale * log2(e) */) {
    kiln_pdl_wait();
    kiln_pdl_trigger();
    constexpr int NT = 32 * NW, BM = 16 * MT * NW, BN = 64, KS = HS / 16, NS = BN / 8, NO = HS / 8, P = HS / 8;
    extern __shared__ uint4 tc_smem[];
    const uint32_t sq = smem_addr(tc_smem), sk0 = sq + BM * HS * 2, sv0 = sk0 + 2 * BN * HS * 2;
    const int h = blockIdx.y, g = h / (NH / NKV);
    const int q0 = (gridDim.x - 1 - blockIdx.x) * BM, w = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int gr = lane / 4, tg = lane % 4, wq0 = q0 + w * 16 * MT; /* the warp's first row */
    const size_t QW = (size_t)NH * HS, KW = (size_t)NKV * HS;
    const int p0 = *d_pos0, nq = min(BM, T - q0);
    if (p0 < 0 || p0 > max_pos - T) { /* outside the contract */
        for (int i = threadIdx.x; i < nq * HS; i += NT)
            out[(size_t)(q0 + i / HS) * QW + (size_t)h * HS + i % HS] = __int_as_float(0x7fc00000);
        return;
    }
    const __half *kp = k_cache + (size_t)g * HS, *vp = v_cache + (size_t)g * HS;
    const int kbeg = tc_first_key(p0 + q0, window), klast = p0 + q0 + nq - 1;
    const int nkt = (klast - kbeg + BN) / BN;

    kv_tile_async<HS, NT>(sk0, kp, KW, kbeg, klast, rows);
    kv_tile_async<HS, NT>(sv0, vp, KW, kbeg, klast, rows);
    cp_async_commit();
    /* q, scaled into base-2 logits, to f16 while the first tiles load; rows past T are zeros */
    for (int i = threadIdx.x; i < BM * P; i += NT) {
        const int r = i / P, c = i % P;
        uint4 u = make_uint4(0, 0, 0, 0);
        if (r < nq) {
            const float4 *src = (const float4 *)(q + (size_t)(q0 + r) * QW + (size_t)h * HS + c * 8);
            const float4 a = src[0], b = src[1];
            u = make_uint4(pack_f16(a.x * sl2, a.y * sl2), pack_f16(a.z * sl2, a.w * sl2), pack_f16(b.x * sl2, b.y * sl2),
                           pack_f16(b.z * sl2, b.w * sl2));
        }
        *(uint4 *)((char *)tc_smem + swz<HS>(r, c)) = u;
    }

    uint32_t qf[MT][KS][4];
    float o[MT][NO][4], m[MT][2], l[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        m[mt][0] = m[mt][1] = -INFINITY, l[mt][0] = l[mt][1] = 0.0f;
#pragma unroll
        for (int d = 0; d < NO; d++) o[mt][d][0] = o[mt][d][1] = o[mt][d][2] = o[mt][d][3] = 0.0f;
    }
    const int wp_first = p0 + wq0, wp_last = p0 + wq0 + 16 * MT - 1; /* the warp's query positions */
    for (int kt = 0; kt < nkt; kt++) {
        const uint32_t sk = sk0 + (kt & 1) * BN * HS * 2, sv = sv0 + (kt & 1) * BN * HS * 2;
        const int j0 = kbeg + kt * BN;
        if (kt + 1 < nkt) { /* the other stage was consumed before the last iteration's closing barrier */
            const uint32_t off = ((kt + 1) & 1) * BN * HS * 2;
            kv_tile_async<HS, NT>(sk0 + off, kp, KW, j0 + BN, klast, rows);
            kv_tile_async<HS, NT>(sv0 + off, vp, KW, j0 + BN, klast, rows);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        if (kt == 0) {
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int ks = 0; ks < KS; ks++) lda<HS>(qf[mt][ks], sq, (w * MT + mt) * 16, ks * 16);
        }
        const bool before = window > 0 && j0 + BN - 1 < tc_first_key(wp_first, window); /* wholly before every window */
        if (j0 <= wp_last && !before) {
            float s[MT][NS][4];
            fa_scores<true, HS, MT, NS>(s, qf, sk);
            /* mask key j outside lo(p) .. p of query p: a key past the warp's first query, or one before its last
             * query's window */
            if (j0 + BN - 1 > wp_first || (window > 0 && j0 < tc_first_key(wp_last, window))) {
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    const int pi = wp_first + mt * 16 + gr;
#pragma unroll
                    for (int n = 0; n < NS; n++)
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            const int j = j0 + n * 8 + 2 * tg + (e & 1), p = pi + (e >> 1) * 8;
                            if (j > p || (window > 0 && j <= p - window)) s[mt][n][e] = -INFINITY;
                        }
                }
            }
            fa_softmax<MT, NS, NO>(s, m, l, o, 1.0f);
            fa_pv<true, HS, MT, NS>(o, s, sv);
        }
        __syncthreads(); /* this stage is consumed: the next iteration may refill it */
    }
    fa_row_sums<MT>(l);
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int i = wq0 + mt * 16 + gr + r * 8;
            if (i >= T) continue;
            const float inv = 1.0f / l[mt][r]; /* l >= 1: every query sees its own key */
            float *orow = out + (size_t)i * QW + (size_t)h * HS + 2 * tg;
#pragma unroll
            for (int d = 0; d < NO; d++) *(float2 *)(orow + d * 8) = make_float2(o[mt][d][2 * r] * inv, o[mt][d][2 * r + 1] * inv);
        }
}

static size_t prefill_smem(int HS, int BM) { return (size_t)(BM + 4 * 64) * HS * 2; }

template <int HS, int NW, int MT>
static kiln_status prefill_tc(float *out, const float *q, const void *k_cache, const void *v_cache, const int32_t *d_pos0, int T,
                              int NH, int NKV, int window, int rows, int max_pos, float scale, cudaStream_t s) {
    constexpr int BM = 16 * MT * NW;
    const size_t smem = prefill_smem(HS, BM);
    /* over 48 KiB of dynamic shared memory must opt in: a host-side attribute, legal during graph capture */
    cudaError_t e = smem > 48 * 1024
                        ? cudaFuncSetAttribute(attn_prefill_tc<HS, NW, MT>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem)
                        : cudaSuccess;
    if (e != cudaSuccess) return kiln_launch_status("attention prefill (tensor cores) shared-memory opt-in", e);
    const dim3 grid((unsigned)((T + BM - 1) / BM), (unsigned)NH);
    e = kiln_launch(attn_prefill_tc<HS, NW, MT>, grid, dim3(32 * NW), smem, s, out, q, (const __half *)k_cache,
                    (const __half *)v_cache, d_pos0, T, NH, NKV, window, rows, max_pos, scale * LOG2E);
    return kiln_launch_status("attention prefill (tensor cores)", e);
}

bool kiln_attn_prefill_tc_takes(int64_t HS, kiln_kv_type type_k, kiln_kv_type type_v, float softcap, const void *q, const void *out) {
    const char *env = getenv("KILN_ATTN_TC");
    if (env && strcmp(env, "0") == 0) return false;
    return (HS == 64 || HS == 128) && type_k == KILN_KV_F16 && type_v == KILN_KV_F16 && softcap == 0 &&
           ((uintptr_t)q & 15) == 0 && ((uintptr_t)out & 7) == 0;
}

kiln_status kiln_attn_prefill_tc(float *out, const float *q, const void *k_cache, const void *v_cache, const int32_t *d_pos0, int T,
                                 int NH, int NKV, int HS, int window, int rows, int max_pos, float scale, cudaStream_t s) {
    /* HS 64: 4 warps of 2 m-tiles (128 rows a block); HS 128: 4 warps of one (o alone is 64 f32 a lane per m-tile),
     * as the training forward measured */
    return HS == 64 ? prefill_tc<64, 4, 2>(out, q, k_cache, v_cache, d_pos0, T, NH, NKV, window, rows, max_pos, scale, s)
                    : prefill_tc<128, 4, 1>(out, q, k_cache, v_cache, d_pos0, T, NH, NKV, window, rows, max_pos, scale, s);
}
