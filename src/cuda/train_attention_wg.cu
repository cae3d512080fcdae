/* train_attention_wg.cu: the training attention on Hopper's wgmma (sm_90a): the forward at head sizes 64 and 128, the
 * backward's dk/dv and dq kernels at 64. The forward is the FlashAttention-2 forward of train_attention_tc.cu with its matrix
 * products moved from mma.sync (a warp, 16 x 8 x 16 an instruction, both operands through ldmatrix into registers) to
 * wgmma (a warpgroup, 64 x 64 x 16, Q, K and V read by the tensor cores straight from shared memory). The tiles, the
 * masks, the online softmax and the epilogue are the mma.sync kernel's, so the two agree to the order of the f32 sums
 * (tests/test_cuda_train_attention.c test_wgmma runs both against the CPU oracle and each other). The Makefile builds
 * this file for sm_90a; kiln_cuda_attention_wgmma tells the host whether this process can use it. */
#include "cuda/launch.h"
#include "cuda/mma.cuh"
#include "cuda/train_attention_tc.h"
#include "cuda/wgmma.cuh"

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* One key tile's scores s (this warp's 16 rows from wq0 by BN keys from j0) to P: keys past a row masked (so every
 * key >= T), fa_softmax (o rescaled), P rounded to bf16 as the A fragments of P V (16 keys a k-step). */
template <int HS, int BN>
static __device__ __forceinline__ void wg_softmax_p(float s[1][BN / 8][4], float m[1][2], float l[1][2], float o[1][HS / 8][4],
                                                    uint32_t pa[BN / 16][4], int j0, int wq0, float sl2) {
    const int gr = threadIdx.x % 32 / 4, tg = threadIdx.x % 4;
    if (j0 + BN - 1 > wq0) { /* a key past a row of the warp: mask key j > query i */
        const int i = wq0 + gr;
#pragma unroll
        for (int n = 0; n < BN / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int j = j0 + n * 8 + 2 * tg + (e & 1);
                if (j > i + (e >> 1) * 8) s[0][n][e] = -INFINITY;
            }
    }
    fa_softmax<1, BN / 8, HS / 8>(s, m, l, o, sl2);
#pragma unroll
    for (int ks = 0; ks < BN / 16; ks++) {
        pa[ks][0] = pack_bf16(s[0][2 * ks][0], s[0][2 * ks][1]);
        pa[ks][1] = pack_bf16(s[0][2 * ks][2], s[0][2 * ks][3]);
        pa[ks][2] = pack_bf16(s[0][2 * ks + 1][0], s[0][2 * ks + 1][1]);
        pa[ks][3] = pack_bf16(s[0][2 * ks + 1][2], s[0][2 * ks + 1][3]);
    }
}

/* The forward's end: each row's l summed over its 4 lanes, then out = o / l in bf16 and lse = m + log l (natural log)
 * for this warp's rows from wq0 (16 rows of the warpgroup's accumulators). */
template <int HS>
static __device__ __forceinline__ void wg_forward_store(kiln_bf16_t *out, float *lse, float o[1][HS / 8][4], const float m[1][2],
                                                        float l[1][2], int b, int h, int wq0, int T, int NH) {
    const int gr = threadIdx.x % 32 / 4, tg = threadIdx.x % 4;
    fa_row_sums<1>(l);
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int i = wq0 + gr + r * 8;
        if (i >= T) continue;
        const float inv = 1.0f / l[0][r];
        kiln_bf16_t *orow = out + ((size_t)b * (size_t)T + (size_t)i) * (size_t)NH * HS + (size_t)h * HS + 2 * tg;
#pragma unroll
        for (int d = 0; d < HS / 8; d++) *(uint32_t *)(orow + d * 8) = pack_bf16(o[0][d][2 * r] * inv, o[0][d][2 * r + 1] * inv);
        if (tg == 0) lse[((size_t)b * NH + h) * (size_t)T + i] = (m[0][r] + log2f(l[0][r])) * 0.69314718055994531f;
    }
}

/* Grid (ceil(T / BM), NH, B), NWG warpgroups a block, x reversed (the last query tiles see the most keys: they start
 * first). Block (x, h, b): query rows q0 .. q0 + BM - 1 of head h, BM = 64 NWG: warpgroup g owns rows q0 + 64 g ..,
 * its warp w the accumulator rows from q0 + 64 g + 16 w. Q stays in shared memory (the wgmma reads it by descriptor
 * each tile: wgmma.cuh says why not from registers). Key tiles of BN rows of K and V (KV head h / G), 0 .. the
 * diagonal, double-buffered by cp.async and shared by the warpgroups. Per tile a warpgroup whose rows reach it
 * computes S = Q K^T (BN / 64 wgmma columns of 64 keys, HS / 16 k-steps), masks keys past each row (so every key >=
 * T), runs fa_softmax, and adds P V (HS / 64 wgmma columns of 64 dims) with P rounded to bf16 as the A operand in
 * registers and V read transposed. Shared: Q BM x HS and K, V 2 x BN x HS bf16 in swz_wg's layout (blocks of 64
 * columns), from a 1024-byte-aligned base (wgmma.cuh). */
template <int HS, int NWG, int BN>
__global__ void __launch_bounds__(128 * NWG, HS == 64 && NWG == 2 && BN == 64 ? 2 : 1)
attn_wg_forward(kiln_bf16_t *out,        /* (B*T, NH*HS) */
                float *lse,              /* (B, NH, T) */
                const kiln_bf16_t *qkv,  /* (B*T, (NH + 2 NKV) HS) */
                int T, int NH, int NKV, float sl2 /* scale * log2(e) */, int order) {
#ifdef KILN_WG_DEVICE
    kiln_pdl_wait();
    kiln_pdl_trigger();
    constexpr int NT = 128 * NWG, BM = 64 * NWG, NS = BN / 8, NO = HS / 8, KS = HS / 16, TB = BN * HS * 2;
    extern __shared__ uint4 wg_smem[];
    const uint32_t sq = (smem_addr(wg_smem) + 1023u) & ~1023u, sk0 = sq + BM * HS * 2, sv0 = sk0 + 2 * TB;
    const attn_tile at = attn_tile_of(order);
    const int b = at.batch, h = at.head, g = h / (NH / NKV);
    const int q0 = ((int)gridDim.x - 1 - at.rank) * BM, wg = threadIdx.x / 128, w = threadIdx.x / 32 % 4;
    const int g0 = q0 + 64 * wg, wq0 = g0 + 16 * w; /* the group's, the warp's first row */
    const int64_t W = (int64_t)(NH + 2 * NKV) * HS;
    const kiln_bf16_t *seq = qkv + (size_t)b * (size_t)T * (size_t)W;
    const kiln_bf16_t *kp = seq + (size_t)NH * HS + (size_t)g * HS, *vp = kp + (size_t)NKV * HS;
    const int nkt = (min(q0 + BM, T) + BN - 1) / BN;

    tile_async<BM, HS, NT, true>(sq, seq + (size_t)h * HS, W, q0, T);
    tile_async<BN, HS, NT, true>(sk0, kp, W, 0, T);
    tile_async<BN, HS, NT, true>(sv0, vp, W, 0, T);
    cp_async_commit();

    float s[1][NS][4], o[1][NO][4], m[1][2] = {{-INFINITY, -INFINITY}}, l[1][2] = {{0.0f, 0.0f}};
#pragma unroll
    for (int d = 0; d < NO; d++) o[0][d][0] = o[0][d][1] = o[0][d][2] = o[0][d][3] = 0.0f;
#pragma unroll
    for (int n = 0; n < NS; n++) s[0][n][0] = s[0][n][1] = s[0][n][2] = s[0][n][3] = 0.0f;
    for (int kt = 0; kt < nkt; kt++) {
        const uint32_t sk = sk0 + (kt & 1) * TB, sv = sv0 + (kt & 1) * TB;
        if (kt + 1 < nkt) { /* the other stage was consumed before the last iteration's closing barrier */
            tile_async<BN, HS, NT, true>(sk0 + ((kt + 1) & 1) * TB, kp, W, (kt + 1) * BN, T);
            tile_async<BN, HS, NT, true>(sv0 + ((kt + 1) & 1) * TB, vp, W, (kt + 1) * BN, T);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        wg_fence_smem(); /* this thread's cp.async writes, visible to the tensor cores after the barrier */
        __syncthreads();
        if (kt * BN <= g0 + 63) { /* some key of the tile is seen by some row of the group (uniform in the group) */
            wg_arrive();
#pragma unroll
            for (int c = 0; c < BN / 64; c++)
#pragma unroll
                for (int ks = 0; ks < KS; ks++) /* the group's 64 query rows by keys 64 c .. of the tile, dims 16 ks .. */
                    wg_ss<0, 0>(s[0] + 8 * c, wg_desc(sq + swz_wg_kstep<BM>(64 * wg, ks)),
                                wg_desc(sk + swz_wg_kstep<BN>(64 * c, ks)), ks);
            wg_commit();
            wg_wait<0>();
#pragma unroll
            for (int c = 0; c < BN / 64; c++) wg_pin(s[0] + 8 * c);
            uint32_t pa[BN / 16][4];
            wg_softmax_p<HS, BN>(s, m, l, o, pa, kt * BN, wq0, sl2);
            wg_arrive(); /* o was rescaled by ordinary instructions */
#pragma unroll
            for (int c = 0; c < HS / 64; c++) /* dims 64 c .. (block c of V), keys 16 ks .. */
#pragma unroll
                for (int ks = 0; ks < BN / 16; ks++) wg_rs<1>(o[0] + 8 * c, pa[ks], wg_desc(sv + c * BN * 128 + ks * 16 * 128), 1);
            wg_commit();
            wg_wait<0>();
#pragma unroll
            for (int c = 0; c < HS / 64; c++) wg_pin(o[0] + 8 * c);
        }
        __syncthreads(); /* this stage is consumed: the next iteration may refill it */
    }
    wg_forward_store<HS>(out, lse, o, m, l, b, h, wq0, T, NH);
#else
    __trap(); /* a pass without wgmma: kiln_cuda_attention_wgmma never lets the host launch it */
#endif
}

/* attn_wg_forward with the next key tile's S = Q K^T in flight while this tile's softmax runs (FlashAttention-3's
 * overlap of the softmax with a matrix product inside a warpgroup), key tiles of 64. Iteration kt: S_kt is in s;
 * it issues S_kt+1 into sn, masks and softmaxes s, adds P V_kt, waits for both and moves sn into s. The tiles are
 * attn_wg_forward's, the arithmetic the same in the same order, so the two give the same bits. K runs a tile ahead
 * of V: stage kt & 1 holds K_kt and V_kt; after iteration kt's barrier (everything of kt - 1 consumed) it loads
 * K_kt+2 over K_kt and V_kt+1 over V_kt-1, and it needs K_kt+1 and V_kt, loaded an iteration before. */
template <int HS, int NWG>
__global__ void __launch_bounds__(128 * NWG, 1)
attn_wg_forward_pipe(kiln_bf16_t *out, float *lse, const kiln_bf16_t *qkv, int T, int NH, int NKV, float sl2, int order) {
#ifdef KILN_WG_DEVICE
    kiln_pdl_wait();
    kiln_pdl_trigger();
    constexpr int BN = 64, NT = 128 * NWG, BM = 64 * NWG, NS = BN / 8, NO = HS / 8, KS = HS / 16, TB = BN * HS * 2;
    extern __shared__ uint4 wg_smem[];
    const uint32_t sq = (smem_addr(wg_smem) + 1023u) & ~1023u, sk0 = sq + BM * HS * 2, sv0 = sk0 + 2 * TB;
    const attn_tile at = attn_tile_of(order);
    const int b = at.batch, h = at.head, g = h / (NH / NKV);
    const int q0 = ((int)gridDim.x - 1 - at.rank) * BM, wg = threadIdx.x / 128, w = threadIdx.x / 32 % 4;
    const int g0 = q0 + 64 * wg, wq0 = g0 + 16 * w; /* the group's, the warp's first row */
    const int64_t W = (int64_t)(NH + 2 * NKV) * HS;
    const kiln_bf16_t *seq = qkv + (size_t)b * (size_t)T * (size_t)W;
    const kiln_bf16_t *kp = seq + (size_t)NH * HS + (size_t)g * HS, *vp = kp + (size_t)NKV * HS;
    const int nkt = (min(q0 + BM, T) + BN - 1) / BN;

    tile_async<BM, HS, NT, true>(sq, seq + (size_t)h * HS, W, q0, T);
    tile_async<BN, HS, NT, true>(sk0, kp, W, 0, T);
    cp_async_commit();
    if (nkt > 1) tile_async<BN, HS, NT, true>(sk0 + TB, kp, W, BN, T);
    tile_async<BN, HS, NT, true>(sv0, vp, W, 0, T);
    cp_async_commit();
    cp_async_wait<1>(); /* Q and K_0 */
    wg_fence_smem();
    __syncthreads();

    float s[1][NS][4], sn[NS][4], o[1][NO][4], m[1][2] = {{-INFINITY, -INFINITY}}, l[1][2] = {{0.0f, 0.0f}};
#pragma unroll
    for (int d = 0; d < NO; d++) o[0][d][0] = o[0][d][1] = o[0][d][2] = o[0][d][3] = 0.0f;
#pragma unroll
    for (int n = 0; n < NS; n++) s[0][n][0] = s[0][n][1] = s[0][n][2] = s[0][n][3] = 0.0f;
    wg_arrive(); /* S_0: key tile 0 is seen by every row */
#pragma unroll
    for (int ks = 0; ks < KS; ks++)
        wg_ss<0, 0>(s[0], wg_desc(sq + swz_wg_kstep<BM>(64 * wg, ks)), wg_desc(sk0 + swz_wg_kstep<BN>(0, ks)), ks);
    wg_commit();
    wg_wait<0>();
    wg_pin(s[0]);
    for (int kt = 0; kt < nkt; kt++) {
        cp_async_wait<0>(); /* K_kt+1 and V_kt */
        wg_fence_smem();
        __syncthreads(); /* and every warpgroup is done with iteration kt - 1 (S_kt, P V_kt-1) */
        if (kt + 2 < nkt) tile_async<BN, HS, NT, true>(sk0 + (kt & 1) * TB, kp, W, (kt + 2) * BN, T);
        if (kt + 1 < nkt) tile_async<BN, HS, NT, true>(sv0 + ((kt + 1) & 1) * TB, vp, W, (kt + 1) * BN, T);
        cp_async_commit();
        const bool act = kt * BN <= g0 + 63, next = kt + 1 < nkt && (kt + 1) * BN <= g0 + 63; /* uniform in the group */
        if (next) {
            const uint32_t sk = sk0 + ((kt + 1) & 1) * TB;
            wg_arrive();
#pragma unroll
            for (int ks = 0; ks < KS; ks++)
                wg_ss<0, 0>(sn, wg_desc(sq + swz_wg_kstep<BM>(64 * wg, ks)), wg_desc(sk + swz_wg_kstep<BN>(0, ks)), ks);
            wg_commit();
        }
        if (act) {
            uint32_t pa[BN / 16][4];
            wg_softmax_p<HS, BN>(s, m, l, o, pa, kt * BN, wq0, sl2);
            const uint32_t sv = sv0 + (kt & 1) * TB;
            wg_arrive(); /* o was rescaled by ordinary instructions */
#pragma unroll
            for (int c = 0; c < HS / 64; c++)
#pragma unroll
                for (int ks = 0; ks < BN / 16; ks++) wg_rs<1>(o[0] + 8 * c, pa[ks], wg_desc(sv + c * BN * 128 + ks * 16 * 128), 1);
            wg_commit();
        }
        wg_wait<0>();
        if (act)
#pragma unroll
            for (int c = 0; c < HS / 64; c++) wg_pin(o[0] + 8 * c);
        if (next) {
            wg_pin(sn);
#pragma unroll
            for (int n = 0; n < NS; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) s[0][n][e] = sn[n][e];
        }
    }
    wg_forward_store<HS>(out, lse, o, m, l, b, h, wq0, T, NH);
#else
    __trap(); /* a pass without wgmma: kiln_cuda_attention_wgmma never lets the host launch it */
#endif
}

/* The dk/dv kernel's f32 accumulators x (a warp's 16 key rows by BQ query columns) as bf16 A fragments, 16 queries a
 * k-step. */
template <int BQ> static __device__ __forceinline__ void dkdv_pack(uint32_t a[BQ / 16][4], const float x[BQ / 8][4]) {
#pragma unroll
    for (int ks = 0; ks < BQ / 16; ks++) {
        a[ks][0] = pack_bf16(x[2 * ks][0], x[2 * ks][1]), a[ks][1] = pack_bf16(x[2 * ks][2], x[2 * ks][3]);
        a[ks][2] = pack_bf16(x[2 * ks + 1][0], x[2 * ks + 1][1]), a[ks][3] = pack_bf16(x[2 * ks + 1][2], x[2 * ks + 1][3]);
    }
}

/* The dk/dv kernel (and, ATOMIC_DQ, dq by atomics) of train_attention_tc.cu on wgmma, head size 64: grid
 * (ceil(T / 64), NKV, B), one warpgroup a block owning key rows j0 .. j0 + 63 of KV head g (warp w rows j0 + 16 w ..;
 * K and V stay in shared memory). It walks the same query tiles in the same order (BQ 64 rows, the G heads of the
 * group), double-buffering q, dout, lse and D by cp.async. Per tile, keys as the rows: S^T = K Q^T and
 * dP^T = V dO^T (both operands from shared memory, all K-major), P^T and dS^T as the mma.sync kernel forms them, then
 * dV += P^T dO and dK += dS^T Q (A the bf16-rounded P^T, dS^T in registers; dO and Q read transposed).
 * ATOMIC_DQ: dS^T is also stored to shared memory (rows of 64 queries, swizzled) and dQ = dS K (A = dS^T read
 * transposed, B = K read transposed) is added into dq by float2 atomics, as the mma.sync kernel does. Shared: K, V
 * 64 x 64, 2 x (q, dout) 64 x 64 bf16, dS^T 64 x 64 bf16 (ATOMIC_DQ), 2 x (lse, D) 64 f32, from a 1024-byte base. */
template <bool ATOMIC_DQ, bool PIPE>
__global__ void __launch_bounds__(128, 2)
attn_wg_backward_dkdv(float *dqkv,               /* (B*T, (NH + 2 NKV) 64): dk, dv written (dq added) */
                      const kiln_bf16_t *dout,   /* (B*T, NH*64) */
                      const kiln_bf16_t *qkv,    /* (B*T, (NH + 2 NKV) 64) */
                      const float *lse,          /* (B, NH, T) */
                      const float *D,            /* (B, NH, T) */
                      int T, int NH, int NKV, float sl2, float scale, int order) {
#ifdef KILN_WG_DEVICE
    kiln_pdl_wait();
    kiln_pdl_trigger();
    constexpr int HS = 64, BQ = 64, KBM = 64, NT = 128, NS = BQ / 8, NO = HS / 8, KS = HS / 16;
    constexpr uint32_t QB = BQ * HS * 2; /* bytes of one q, dout, K, V or dS^T tile */
    extern __shared__ uint4 wg_smem[];
    const uint32_t base = smem_addr(wg_smem), sk = (base + 1023u) & ~1023u, sv = sk + QB, sq0 = sv + QB, sdo0 = sq0 + 2 * QB,
                   sds = sdo0 + 2 * QB;
    float *slse = (float *)((char *)wg_smem + (sds + QB - base)), *sD = slse + 2 * BQ; /* (2, BQ) each */
    const attn_tile at = attn_tile_of(!ATOMIC_DQ && order); /* atomic dq: heavy first measured slower (dq's adds spread) */
    const int b = at.batch, g = at.head, G = NH / NKV, j0 = at.rank * KBM;
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32, gr = lane / 4, tg = lane % 4;
    const int64_t W = (int64_t)(NH + 2 * NKV) * HS, Q = (int64_t)NH * HS;
    const int64_t kcol = Q + (int64_t)g * HS, vcol = kcol + (int64_t)NKV * HS;
    const kiln_bf16_t *seq = qkv + (size_t)b * (size_t)T * (size_t)W, *dseq = dout + (size_t)b * (size_t)T * (size_t)Q;
    const int nq = (T - j0 + BQ - 1) / BQ, nit = G * nq; /* query tiles j0, j0 + BQ, .. < T per head */

    tile_async<KBM, HS, NT>(sk, seq + kcol, W, j0, T);
    tile_async<KBM, HS, NT>(sv, seq + vcol, W, j0, T);
    dkdv_issue<HS, BQ, NT>(0, sq0, sdo0, slse, sD, seq, dseq, lse, D, b, g, G, NH, j0, nq, T);
    cp_async_commit();

    float dk[NO][4], dv[NO][4], s[NS][4], dp[NS][4];
#pragma unroll
    for (int d = 0; d < NO; d++)
#pragma unroll
        for (int e = 0; e < 4; e++) dk[d][e] = dv[d][e] = s[d][e] = dp[d][e] = 0.0f;
    const int jr = j0 + w * 16 + gr; /* this lane's key rows: jr, jr + 8 */
    for (int it = 0; it < nit; it++) {
        const int st = it & 1, i0 = j0 + it % nq * BQ;
        if (it + 1 < nit) {
            dkdv_issue<HS, BQ, NT>(it + 1, sq0, sdo0, slse, sD, seq, dseq, lse, D, b, g, G, NH, j0, nq, T);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        wg_fence_smem();
        __syncthreads();
        const uint32_t sq = sq0 + st * QB, sdo = sdo0 + st * QB;
        wg_arrive();
#pragma unroll
        for (int ks = 0; ks < KS; ks++) wg_ss<0, 0>(s, wg_desc(sk + ks * 32), wg_desc(sq + ks * 32), ks);   /* S^T = K Q^T */
        if (PIPE) wg_commit(); /* S^T its own group */
#pragma unroll
        for (int ks = 0; ks < KS; ks++) wg_ss<0, 0>(dp, wg_desc(sv + ks * 32), wg_desc(sdo + ks * 32), ks); /* dP^T = V dO^T */
        const bool edge = i0 < j0 + KBM || i0 + BQ > T; /* a tile crossing the diagonal or T */
        uint32_t pa[BQ / 16][4], da[BQ / 16][4];
        if (PIPE) { /* P^T and dV += P^T dO while dP^T is in flight, then dS^T */
            wg_commit();
            wg_wait<1>();
            wg_pin(s);
            dkdv_p<NS>(s, slse + st * BQ, i0, jr, T, edge, sl2);
            dkdv_pack<BQ>(pa, s);
            wg_arrive();
#pragma unroll
            for (int ks = 0; ks < BQ / 16; ks++) wg_rs<1>(dv, pa[ks], wg_desc(sdo + ks * 16 * HS * 2), 1); /* dV += P^T dO */
            wg_commit();
            wg_wait<1>(); /* dP^T (dV may still run) */
            wg_pin(dp);
            dkdv_ds<NS>(dp, s, sD + st * BQ);
        } else {
            wg_commit();
            wg_wait<0>();
            wg_pin(s);
            wg_pin(dp);
            dkdv_probs<NS>(s, dp, slse + st * BQ, sD + st * BQ, i0, jr, T, edge, sl2);
            dkdv_pack<BQ>(pa, s);
        }
        dkdv_pack<BQ>(da, dp);
        if (ATOMIC_DQ)
#pragma unroll
            for (int ks = 0; ks < BQ / 16; ks++) dkdv_store_ds<BQ>(sds, w * 16, ks, da[ks]);
        wg_arrive();
        if (!PIPE)
#pragma unroll
            for (int ks = 0; ks < BQ / 16; ks++) wg_rs<1>(dv, pa[ks], wg_desc(sdo + ks * 16 * HS * 2), 1); /* dV += P^T dO */
#pragma unroll
        for (int ks = 0; ks < BQ / 16; ks++) wg_rs<1>(dk, da[ks], wg_desc(sq + ks * 16 * HS * 2), 1);  /* dK += dS^T Q */
        wg_commit();
        if (ATOMIC_DQ) {
            float dq[NO][4];
#pragma unroll
            for (int d = 0; d < NO; d++) dq[d][0] = dq[d][1] = dq[d][2] = dq[d][3] = 0.0f;
            wg_fence_smem(); /* this thread's dS^T stores, for the tensor cores */
            __syncthreads(); /* dS^T is whole */
            wg_arrive();
#pragma unroll
            for (int ks = 0; ks < KBM / 16; ks++) /* dQ = dS K: dS^T and K both stored k (key) row by k row */
                wg_ss<1, 1>(dq, wg_desc(sds + ks * 16 * BQ * 2), wg_desc(sk + ks * 16 * HS * 2), ks);
            wg_commit();
            wg_wait<0>();
            wg_pin(dv);
            wg_pin(dk);
            wg_pin(dq);
            const int h = g * G + it / nq;
#pragma unroll
            for (int r = 0; r < 2; r++) { /* dq[d][e]: query row i0 + 16 w + gr + 8 (e / 2), dim 8 d + 2 tg + e % 2 */
                const int i = i0 + 16 * w + gr + 8 * r;
                if (i >= T) continue;
                float *row = dqkv + ((size_t)b * (size_t)T + (size_t)i) * (size_t)W + (size_t)h * HS + 2 * tg;
#pragma unroll
                for (int d = 0; d < NO; d++) atomicAdd((float2 *)(row + d * 8), make_float2(dq[d][2 * r] * scale, dq[d][2 * r + 1] * scale));
            }
        } else {
            wg_wait<0>();
            wg_pin(dv);
            wg_pin(dk);
        }
        __syncthreads(); /* this stage (and dS^T) is consumed */
    }
    dkdv_store<NO>(dqkv + (size_t)b * (size_t)T * (size_t)W, dk, dv, T, W, kcol, vcol, jr, scale);
#else
    __trap(); /* a pass without wgmma: never launched */
#endif
}

/* The deterministic backward's dq kernel (train_attention_tc.cu's attn_tc_backward_dq) on wgmma, head size 64: grid
 * (ceil(T / BM), NH, B), NWG warpgroups a block, BM = 64 NWG query rows of head h (warpgroup g rows q0 + 64 g ..,
 * its warp w the accumulator rows from q0 + 64 g + 16 w), q and dout staged once; key tiles of 64 rows of K and V,
 * 0 .. the diagonal, double-buffered by cp.async and shared by the warpgroups, as the forward's. Per tile a
 * warpgroup whose rows reach it computes S = Q K^T and dP = dO V^T (both operands from shared memory, K-major),
 * P = exp2(S sl2 - lse log2e) (0 for keys past the row), dS = P (dP - D) rounded to bf16 as the A operand in
 * registers, and dQ += dS K (K read transposed, as the forward reads V); dq = scale dQ is written once, f32: the
 * same formulas as the mma.sync kernel, so the same bounds against the CPU oracle. Shared: q, dout BM x 64 and
 * 2 x (K, V) 64 x 64 bf16 in swz_wg's layout, from a 1024-byte-aligned base. */
template <int NWG>
__global__ void __launch_bounds__(128 * NWG, NWG == 1 ? 3 : 2)
attn_wg_backward_dq(float *dqkv,               /* (B*T, (NH + 2 NKV) 64): dq written */
                    const kiln_bf16_t *dout,   /* (B*T, NH*64) */
                    const kiln_bf16_t *qkv,    /* (B*T, (NH + 2 NKV) 64) */
                    const float *lse,          /* (B, NH, T) */
                    const float *D,            /* (B, NH, T) */
                    int T, int NH, int NKV, float sl2, float scale, int order) {
#ifdef KILN_WG_DEVICE
    kiln_pdl_wait();
    kiln_pdl_trigger();
    constexpr int HS = 64, BN = 64, NT = 128 * NWG, BM = 64 * NWG, NS = BN / 8, NO = HS / 8, KS = HS / 16, TB = BN * HS * 2;
    extern __shared__ uint4 wg_smem[];
    const uint32_t sq = (smem_addr(wg_smem) + 1023u) & ~1023u, sdo = sq + BM * HS * 2, sk0 = sdo + BM * HS * 2,
                   sv0 = sk0 + 2 * TB;
    const attn_tile at = attn_tile_of(order);
    const int b = at.batch, h = at.head, g = h / (NH / NKV);
    const int q0 = ((int)gridDim.x - 1 - at.rank) * BM, wg = threadIdx.x / 128, w = threadIdx.x / 32 % 4;
    const int g0 = q0 + 64 * wg, wq0 = g0 + 16 * w, gr = threadIdx.x % 32 / 4;
    const int64_t W = (int64_t)(NH + 2 * NKV) * HS, Q = (int64_t)NH * HS;
    const kiln_bf16_t *seq = qkv + (size_t)b * (size_t)T * (size_t)W;
    const kiln_bf16_t *kp = seq + (size_t)Q + (size_t)g * HS, *vp = kp + (size_t)NKV * HS;
    const int nkt = (min(q0 + BM, T) + BN - 1) / BN;

    tile_async<BM, HS, NT, true>(sq, seq + (size_t)h * HS, W, q0, T);
    tile_async<BM, HS, NT, true>(sdo, dout + (size_t)b * (size_t)T * (size_t)Q + (size_t)h * HS, Q, q0, T);
    tile_async<BN, HS, NT, true>(sk0, kp, W, 0, T);
    tile_async<BN, HS, NT, true>(sv0, vp, W, 0, T);
    cp_async_commit();

    const int ir = wq0 + gr; /* this lane's query rows: ir, ir + 8 (rows past T read row T - 1, and store nothing) */
    float l2[2], Dr[2];
    dq_rows(l2, Dr, lse, D, ((size_t)b * NH + h) * (size_t)T, ir, T);
    float dq[NO][4];
#pragma unroll
    for (int d = 0; d < NO; d++) dq[d][0] = dq[d][1] = dq[d][2] = dq[d][3] = 0.0f;
    for (int kt = 0; kt < nkt; kt++) {
        const uint32_t sk = sk0 + (kt & 1) * TB, sv = sv0 + (kt & 1) * TB;
        if (kt + 1 < nkt) { /* the other stage was consumed before the last iteration's closing barrier */
            tile_async<BN, HS, NT, true>(sk0 + ((kt + 1) & 1) * TB, kp, W, (kt + 1) * BN, T);
            tile_async<BN, HS, NT, true>(sv0 + ((kt + 1) & 1) * TB, vp, W, (kt + 1) * BN, T);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        wg_fence_smem(); /* this thread's cp.async writes, visible to the tensor cores after the barrier */
        __syncthreads();
        if (kt * BN <= g0 + 63) { /* some key of the tile is seen by some row of the group (uniform in the group) */
            float s[NS][4], dp[NS][4];
            wg_arrive();
#pragma unroll
            for (int ks = 0; ks < KS; ks++)
                wg_ss<0, 0>(s, wg_desc(sq + swz_wg_kstep<BM>(64 * wg, ks)), wg_desc(sk + swz_wg_kstep<BN>(0, ks)), ks);
#pragma unroll
            for (int ks = 0; ks < KS; ks++)
                wg_ss<0, 0>(dp, wg_desc(sdo + swz_wg_kstep<BM>(64 * wg, ks)), wg_desc(sv + swz_wg_kstep<BN>(0, ks)), ks);
            wg_commit();
            wg_wait<0>();
            wg_pin(s);
            wg_pin(dp);
            dq_ds<NS>(dp, s, l2, Dr, kt * BN, ir, kt * BN + BN - 1 > wq0, sl2); /* diag: a key past a row of the warp */
            uint32_t da[BN / 16][4];
            dkdv_pack<BN>(da, dp);
            wg_arrive();
#pragma unroll
            for (int ks = 0; ks < BN / 16; ks++) wg_rs<1>(dq, da[ks], wg_desc(sk + ks * 16 * 128), 1); /* dQ += dS K */
            wg_commit();
            wg_wait<0>();
            wg_pin(dq);
        }
        __syncthreads(); /* this stage is consumed: the next iteration may refill it */
    }
    dq_store<NO>(dqkv + (size_t)b * (size_t)T * (size_t)W, dq, ir, T, W, (int64_t)h * HS, scale);
#else
    __trap(); /* a pass without wgmma: never launched */
#endif
}

/* kiln_attn_order (train_attention_tc.h) lives here, beside the wgmma entry points train_attention_tc.cu calls, so
 * the calls between the two files go one way. */
static int attn_order_read(void) {
    const char *v = getenv("KILN_ATTN_ORDER");
    return v && strcmp(v, "0") == 0 ? 0 : 1;
}

/* Measured on an H100 (kiln bench gpu-kernels --attention, B 16 T 1024, KILN_ATTN_ORDER 0 against 1): the deterministic
 * backward on wgmma 0.314 -> 0.275 ms (124m) and 0.409 -> 0.356 (350m), on mma.sync 0.438 -> 0.385 (124m), the wgmma
 * forward 0.111 -> 0.108 and 0.143 -> 0.134; the dk/dv kernel with atomic dq 0.349 -> 0.355 and 0.455 -> 0.512, so
 * the atomic variants keep the grid's own order (docs/cuda.md). */
int kiln_attn_order(void) {
    static const int order = attn_order_read(); /* initialized once, thread-safe */
    return order;
}

/* Whether the wgmma path is taken when KILN_ATTN_WG is unset: on since an H100 run (2026-12-07, docs/cuda.md) passed
 * the tests against the CPU oracle and timed it beside the mma.sync kernels. */
#define WG_DEFAULT_ON 1

/* The block shape: KILN_ATTN_WG = 0 turns the path off; NWGxBN (2x64, 2x128, 3x64, 3x128) turns it on in that
 * shape, plain kernels; 2x64p or 3x64p, the pipelined ones (the forward's next S and the dk/dv kernel's dP^T in flight
 * during the softmax); 1 (or anything else) or unset with WG_DEFAULT_ON, the fastest as measured on the H100: the
 * forward 2x64 plain at head size 64 (the pipelined one needs 158 registers, so one block an SM: 0.88x) and
 * pipelined at 128 (1.05x over plain), the dk/dv kernel pipelined (1.01x). */
typedef struct {
    int nwg, bn;
    bool pipe_fwd64, pipe_fwd128, pipe_bwd;
} wg_shape;

static wg_shape wg_config(void) {
    const char *e = getenv("KILN_ATTN_WG");
    wg_shape c = {2, 64, false, true, true};
    if (!e) c.nwg = WG_DEFAULT_ON ? 2 : 0;
    else if (strcmp(e, "0") == 0) c.nwg = 0;
    else if (strlen(e) >= 4 && (e[0] == '2' || e[0] == '3') && e[1] == 'x') {
        if (strcmp(e + 2, "64") == 0) c = {e[0] - '0', 64, false, false, false};
        else if (strcmp(e + 2, "64p") == 0) c = {e[0] - '0', 64, true, true, true};
        else if (strcmp(e + 2, "128") == 0) c = {e[0] - '0', 128, false, false, false};
    }
    return c;
}

extern "C" bool kiln_cuda_attention_wgmma(int64_t HS) {
#ifdef KILN_WGMMA
    int dev = 0, major = 0, minor = 0;
    if ((HS != 64 && HS != 128) || wg_config().nwg == 0 || cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess)
        return false;
    return major == 9 && minor == 0; /* sm_90a code runs on compute capability 9.0 alone */
#else
    (void)HS;
    return false;
#endif
}

template <int HS, int NWG, int BN, bool PIPE = false>
static kiln_status wg_forward(kiln_bf16_t *out, float *lse, const kiln_bf16_t *qkv, int B, int T, int NH, int NKV, cudaStream_t s) {
    static_assert(!PIPE || BN == 64, "the pipelined forward takes key tiles of 64");
    constexpr int BM = 64 * NWG;
    void (*kernel)(kiln_bf16_t *, float *, const kiln_bf16_t *, int, int, int, float, int) = attn_wg_forward<HS, NWG, BN>;
    if constexpr (PIPE) kernel = attn_wg_forward_pipe<HS, NWG>;
    const size_t smem = (size_t)(BM + 4 * BN) * HS * 2 + 1024; /* + the alignment of the base */
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return kiln_launch_status("attention_forward (train, wgmma) shared-memory opt-in", e);
    const dim3 grid((unsigned)((T + BM - 1) / BM), (unsigned)NH, (unsigned)B);
    const float sl2 = 1.0f / sqrtf((float)HS) * LOG2E;
    return kiln_launch_status("attention_forward (train, wgmma)",
                              kiln_launch(kernel, grid, dim3(128 * NWG), smem, s, out, lse, qkv, T, NH, NKV, sl2, kiln_attn_order()));
}

/* HS 128 takes key tiles of 64 rows in either shape: with 128 (s and o 64 f32 a thread each) 2 warpgroups use all
 * 255 registers and 3 spill. */
kiln_status kiln_attn_wg_forward(kiln_bf16_t *out, float *lse, const kiln_bf16_t *qkv, int B, int T, int NH, int NKV, int HS,
                                 cudaStream_t s) {
    const wg_shape c = wg_config();
    if (HS == 128 ? c.pipe_fwd128 : c.pipe_fwd64) { /* one block an SM (2 of 2 x 64 spill); HS 128 in 2 warpgroups (3 spill) */
        if (HS == 128) return wg_forward<128, 2, 64, true>(out, lse, qkv, B, T, NH, NKV, s);
        return c.nwg == 3 ? wg_forward<64, 3, 64, true>(out, lse, qkv, B, T, NH, NKV, s)
                          : wg_forward<64, 2, 64, true>(out, lse, qkv, B, T, NH, NKV, s);
    }
    if (HS == 128)
        return c.nwg == 3 ? wg_forward<128, 3, 64>(out, lse, qkv, B, T, NH, NKV, s) : wg_forward<128, 2, 64>(out, lse, qkv, B, T, NH, NKV, s);
    if (c.nwg == 3)
        return c.bn == 64 ? wg_forward<64, 3, 64>(out, lse, qkv, B, T, NH, NKV, s) : wg_forward<64, 3, 128>(out, lse, qkv, B, T, NH, NKV, s);
    return c.bn == 64 ? wg_forward<64, 2, 64>(out, lse, qkv, B, T, NH, NKV, s) : wg_forward<64, 2, 128>(out, lse, qkv, B, T, NH, NKV, s);
}

kiln_status kiln_attn_wg_backward_dkdv(float *dqkv, const kiln_bf16_t *dout, const kiln_bf16_t *qkv, const float *lse,
                                       const float *D, int B, int T, int NH, int NKV, bool atomic_dq, cudaStream_t s) {
    const size_t smem = (size_t)7 * 64 * 64 * 2 + 4 * 64 * 4 + 1024; /* the layout above (dS^T's room either way) */
    const unsigned tiles = (unsigned)((T + 63) / 64);
    const float scale = 0.125f, sl2 = scale * LOG2E;
    const bool pipe = wg_config().pipe_bwd;
    void (*kernel)(float *, const kiln_bf16_t *, const kiln_bf16_t *, const float *, const float *, int, int, int, float, float, int) =
        atomic_dq ? (pipe ? attn_wg_backward_dkdv<true, true> : attn_wg_backward_dkdv<true, false>)
                  : (pipe ? attn_wg_backward_dkdv<false, true> : attn_wg_backward_dkdv<false, false>);
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return kiln_launch_status("attention_backward dk/dv (wgmma) shared-memory opt-in", e);
    return kiln_launch_status(atomic_dq ? "attention_backward dk/dv/dq (wgmma, atomic dq)" : "attention_backward dk/dv (wgmma)",
                              kiln_launch(kernel, dim3(tiles, (unsigned)NKV, (unsigned)B), dim3(128), smem, s, dqkv, dout, qkv,
                                          lse, D, T, NH, NKV, sl2, scale, kiln_attn_order()));
}

/* KILN_ATTN_WG_DQ: 1 or 2 warpgroups a block for the dq kernel (unset: WG_DQ_DEFAULT); 0 leaves dq to the mma.sync
 * kernel, for comparison (read at each launch, as KILN_ATTN_WG, so a test can take each). */
#define WG_DQ_DEFAULT 2
static int wg_dq(void) {
    const char *e = getenv("KILN_ATTN_WG_DQ");
    return !e ? WG_DQ_DEFAULT : strcmp(e, "0") == 0 ? 0 : strcmp(e, "1") == 0 ? 1 : WG_DQ_DEFAULT;
}

bool kiln_attn_wg_dq_takes(void) { return wg_dq() != 0; }

template <int NWG>
static kiln_status wg_dq_launch(float *dqkv, const kiln_bf16_t *dout, const kiln_bf16_t *qkv, const float *lse, const float *D,
                                int B, int T, int NH, int NKV, cudaStream_t s) {
    constexpr int BM = 64 * NWG;
    const size_t smem = (size_t)(2 * BM + 4 * 64) * 64 * 2 + 1024; /* + the alignment of the base */
    const cudaError_t e = cudaFuncSetAttribute(attn_wg_backward_dq<NWG>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return kiln_launch_status("attention_backward dq (wgmma) shared-memory opt-in", e);
    const float scale = 0.125f, sl2 = scale * LOG2E;
    return kiln_launch_status("attention_backward dq (wgmma)",
                              kiln_launch(attn_wg_backward_dq<NWG>, dim3((unsigned)((T + BM - 1) / BM), (unsigned)NH, (unsigned)B),
                                          dim3(128 * NWG), smem, s, dqkv, dout, qkv, lse, D, T, NH, NKV, sl2, scale,
                                          kiln_attn_order()));
}

kiln_status kiln_attn_wg_backward_dq(float *dqkv, const kiln_bf16_t *dout, const kiln_bf16_t *qkv, const float *lse,
                                     const float *D, int B, int T, int NH, int NKV, cudaStream_t s) {
    return wg_dq() == 1 ? wg_dq_launch<1>(dqkv, dout, qkv, lse, D, B, T, NH, NKV, s)
                        : wg_dq_launch<2>(dqkv, dout, qkv, lse, D, B, T, NH, NKV, s);
}
