/* train_attention_tc.cu: the tensor-core path of the training attention (src/cuda/train_attention.cu, which
 * dispatches here for head sizes 64 and 128 through train_attention_tc.h): forward, the dk/dv kernel (with dq by
 * atomics, or without for the deterministic backward) and the dq kernel. The formulas, the D kernel and the
 * CUDA-core path are train_attention.cu's; tests/test_cuda_train_attention.c checks both paths against the CPU
 * oracle, and bench gpu-kernels --attention times this one. */
#include "cuda/launch.h"
#include "cuda/mma.cuh"
#include "cuda/train_attention_tc.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

/* A kiln_launch's own error first, then any earlier asynchronous one (launch.h). */
static kiln_status checked(const char *what, cudaError_t e) { return kiln_launch_status(what, e); }

/* ---------------------------------------------------------------- tensor-core path (HS 64 and 128)
 * FlashAttention-2 (Dao 2023) on mma.sync.m16n8k16 (bf16 in, f32 accumulate), 4 warps a block, each warp owning
 * 16 rows of a 64-row tile (query rows in the dq kernel, key rows in the dk/dv kernel; the forward at HS 64 gives
 * each warp 32 query rows of a 128-row tile, its kernel comment says why). Tiles of
 * bf16 rows are staged by cp.async (16-byte pieces, zero-filled past T) into shared memory, double-buffered, with
 * the 16-byte piece c of row r stored at piece c ^ (r & 7): the 8 rows an ldmatrix phase reads then hit 8
 * different 4-bank groups (rows are 128 or 256 bytes, so unswizzled they would all sit on the same banks).
 * Fragments (PTX ISA, "mma.m16n8k16"): lane = 4 gr + tg; an accumulator holds (row gr, cols 2 tg, 2 tg + 1) in
 * c0, c1 and (row gr + 8, same cols) in c2, c3, which is also the A layout, so P and dS go from accumulators to A
 * operands in registers (one bf16 rounding each, the only precision this path loses against the CUDA-core one).
 * Softmax in base 2: s2 = s * scale * log2(e), p = exp2(s2 - lse * log2(e)). */

#define TC_NT 128 /* threads: 4 warps of 16 rows */
#define TC_BM 64  /* rows a block owns */

/* ---------------------------------------------------------------- tensor-core forward
 * Grid (ceil(T / BM), NH, B), 32 NW threads, x reversed (the last query tiles see the most keys: they start
 * first). Block (x, h, b): query rows q0 .. q0 + BM - 1 of head h, BM = 16 MT NW: warp w owns MT m-tiles of 16
 * rows, q0 + 16 MT w .., and each K or V fragment it loads from shared memory serves all MT of them (MT 2 halves
 * the ldmatrix traffic per mma; 5% faster at HS 64, the launcher's comment has the figures); Q's fragments stay
 * in registers. Key tiles of BN = 64 rows of K and V (KV head h / G), 0 .. the diagonal tile, double-buffered and
 * shared by the NW warps: per tile S = Q K^T (16 MT x 64 a warp), the causal mask where a key may pass a row
 * (keys past T lie only there), the online softmax (each row's 4 lanes share its max by 2 xor shuffles; l stays a
 * per-lane partial until the end), O += P V with P rounded to bf16. A warp whose rows all precede the tile skips
 * it (the last tile of a 128-row block: half the warps). Shared: Q BM x HS, K and V 2 x 64 x HS bf16: 48 KiB at
 * HS 64 (BM 128), 80 at HS 128 (BM 64). */
template <int HS, int NW, int MT>
__global__ void __launch_bounds__(32 * NW, 2)
attn_tc_forward(kiln_bf16_t *out,        /* (B*T, NH*HS) */
                float *lse,              /* (B, NH, T) */
                const kiln_bf16_t *qkv,  /* (B*T, (NH + 2 NKV) HS) */
                int T, int NH, int NKV, float sl2 /* scale * log2(e) */, int order) {
    kiln_pdl_wait();
    kiln_pdl_trigger();
    constexpr int NT = 32 * NW, BM = 16 * MT * NW, BN = 64, KS = HS / 16, NS = BN / 8, NO = HS / 8;
    extern __shared__ uint4 tc_smem[];
    const uint32_t sq = smem_addr(tc_smem), sk0 = sq + BM * HS * 2, sv0 = sk0 + 2 * BN * HS * 2;
    const attn_tile at = attn_tile_of(order);
    const int b = at.batch, h = at.head, g = h / (NH / NKV);
    const int q0 = ((int)gridDim.x - 1 - at.rank) * BM, w = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int gr = lane / 4, tg = lane % 4, wq0 = q0 + w * 16 * MT; /* the warp's first row */
    const int64_t W = (int64_t)(NH + 2 * NKV) * HS;
    const kiln_bf16_t *seq = qkv + (size_t)b * (size_t)T * (size_t)W;
    const kiln_bf16_t *kp = seq + (size_t)NH * HS + (size_t)g * HS, *vp = kp + (size_t)NKV * HS;
    const int nkt = (min(q0 + BM, T) + BN - 1) / BN;

    tile_async<BM, HS, NT>(sq, seq + (size_t)h * HS, W, q0, T);
    tile_async<BN, HS, NT>(sk0, kp, W, 0, T);
    tile_async<BN, HS, NT>(sv0, vp, W, 0, T);
    cp_async_commit();

    uint32_t qf[MT][KS][4];
    float o[MT][NO][4], m[MT][2], l[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        m[mt][0] = m[mt][1] = -INFINITY, l[mt][0] = l[mt][1] = 0.0f;
#pragma unroll
        for (int d = 0; d < NO; d++) o[mt][d][0] = o[mt][d][1] = o[mt][d][2] = o[mt][d][3] = 0.0f;
    }
    for (int kt = 0; kt < nkt; kt++) {
        const uint32_t sk = sk0 + (kt & 1) * BN * HS * 2, sv = sv0 + (kt & 1) * BN * HS * 2;
        if (kt + 1 < nkt) { /* the other stage was consumed before the last iteration's closing barrier */
            const uint32_t off = ((kt + 1) & 1) * BN * HS * 2;
            tile_async<BN, HS, NT>(sk0 + off, kp, W, (kt + 1) * BN, T);
            tile_async<BN, HS, NT>(sv0 + off, vp, W, (kt + 1) * BN, T);
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
        if (kt * BN <= wq0 + 16 * MT - 1) { /* some key of the tile is seen by some row of the warp */
            float s[MT][NS][4];
            fa_scores<false, HS, MT, NS>(s, qf, sk);
            if (kt * BN + BN - 1 > wq0) { /* a key past a row of the warp: mask key j > query i (so every key >= T) */
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    const int i = wq0 + mt * 16 + gr;
#pragma unroll
                    for (int n = 0; n < NS; n++)
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            const int j = kt * BN + n * 8 + 2 * tg + (e & 1);
                            if (j > i + (e >> 1) * 8) s[mt][n][e] = -INFINITY;
                        }
                }
            }
            fa_softmax<MT, NS, NO>(s, m, l, o, sl2);
            fa_pv<false, HS, MT, NS>(o, s, sv);
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
            const float inv = 1.0f / l[mt][r];
            kiln_bf16_t *orow = out + ((size_t)b * (size_t)T + (size_t)i) * (size_t)NH * HS + (size_t)h * HS + 2 * tg;
#pragma unroll
            for (int d = 0; d < NO; d++)
                *(uint32_t *)(orow + d * 8) = pack_bf16(o[mt][d][2 * r] * inv, o[mt][d][2 * r + 1] * inv);
            if (tg == 0) lse[((size_t)b * NH + h) * (size_t)T + i] = (m[mt][r] + log2f(l[mt][r])) * 0.69314718055994531f;
        }
}

/* The two products both backward kernels start from, for this warp's 16 rows m0.. of the A tiles over NS * 8
 * columns of the B tiles, HS deep (KS steps of 16): s = A1 B1^T and dp = A2 B2^T. The dk/dv kernel passes (K, V,
 * Q, dO) and gets S^T and dP^T; the dq kernel passes (Q, dO, K, V) and gets S and dP, the same products. */
template <int HS, int NS, int KS>
static __device__ __forceinline__ void two_products(float s[NS][4], float dp[NS][4], uint32_t a1, uint32_t a2, uint32_t b1,
                                                    uint32_t b2, int m0) {
#pragma unroll
    for (int n = 0; n < NS; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) s[n][e] = dp[n][e] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < KS; ks++) {
        uint32_t fa1[4], fa2[4];
        lda<HS>(fa1, a1, m0, ks * 16);
        lda<HS>(fa2, a2, m0, ks * 16);
#pragma unroll
        for (int n = 0; n < NS; n += 2) {
            uint32_t bf[4];
            ldb<HS>(bf, b1, n * 8, ks * 16);
            mma_bf16(s[n], fa1, bf[0], bf[1]);
            mma_bf16(s[n + 1], fa1, bf[2], bf[3]);
            ldb<HS>(bf, b2, n * 8, ks * 16);
            mma_bf16(dp[n], fa2, bf[0], bf[1]);
            mma_bf16(dp[n + 1], fa2, bf[2], bf[3]);
        }
    }
}

/* ---------------------------------------------------------------- tensor-core backward: dk, dv
 * Grid (ceil(T / KBM), NKV, B), 32 NW threads, KBM = 16 NW (NW 4: tc_dkdv says why). Block (x, g, b): key rows
 * j0 .. j0 + KBM - 1 of KV head g, warp w rows j0 + 16 w .. (K and V stay in shared memory for the whole block). It
 * walks the G query heads of the group (in
 * order) and, per head, the query tiles of BQ rows from j0 to T - 1 (in order), double-buffering q, dout (BQ x HS
 * bf16) and lse, D (BQ f32). Per tile, transposed so keys are the mma rows: S^T = K Q^T, dP^T = V dO^T (16 x BQ a
 * warp), P^T = exp2(S^T sl2 - lse log2e) (0 unless j <= i < T), dS^T = P^T (dP^T - D); dV += P^T dO,
 * dK += dS^T Q with P^T and dS^T rounded to bf16 as A operands. dk = scale dK and dv written once, f32.
 * BQ 64 at HS 64, 32 at HS 128 (dK and dV are 2 x 64 f32 a lane there; 64 more for S^T, dP^T would spill).
 * Shared: K, V KBM x HS and 2 x (q, dout) BQ x HS bf16: 48 KiB + 1 KiB at HS 64, 64 KiB + 0.5 KiB at HS 128 (NW 4).
 *
 * ATOMIC_DQ (the non-deterministic backward, FlashAttention-2's): the block also adds its share of dq, so no dq
 * kernel recomputes S and dP (5 matmuls instead of 7). dS^T (KBM x BQ bf16, 8 or 4 KiB more shared, swizzled) is
 * stored as it is packed for dK; after a barrier warp w computes dQ = dS K for 16 query rows and DW = HS (BQ / 16)
 * / NW dims of the tile (rows 16 (w % (BQ / 16)), dims DW (w / (BQ / 16))) and adds scale dQ into dq by float2
 * atomics (red.global), which the rowdot kernel zeroed. The sum's order over the key blocks is the atomics'
 * arrival order: the last bits of dq vary from run to run. Measured (ncu, 124M shape): this kernel 401 us against
 * 258 for the plain dk/dv kernel, so its dQ share (2 of 10 mma per tile, the store of dS^T, one more barrier and
 * 16 float2 reductions a warp per tile) costs 143 us, nearly the 166 us of the dq kernel it replaces. */
template <int HS, bool ATOMIC_DQ, int NW>
__global__ void __launch_bounds__(32 * NW, 1)
attn_tc_backward_dkdv(float *dqkv,               /* (B*T, (NH + 2 NKV) HS): dk, dv written (dq added) */
                      const kiln_bf16_t *dout,   /* (B*T, NH*HS) */
                      const kiln_bf16_t *qkv,    /* (B*T, (NH + 2 NKV) HS) */
                      const float *lse,          /* (B, NH, T) */
                      const float *D,            /* (B, NH, T) */
                      int T, int NH, int NKV, float sl2, float scale, int order) {
    kiln_pdl_wait();
    kiln_pdl_trigger();
    constexpr int BQ = HS == 64 ? 64 : 32, KS = HS / 16, NS = BQ / 8, NO = HS / 8, NT = 32 * NW, KBM = 16 * NW;
    constexpr uint32_t QB = BQ * HS * 2; /* bytes of one q or dout tile */
    extern __shared__ uint4 tc_smem[];
    const uint32_t sk = smem_addr(tc_smem), sv = sk + KBM * HS * 2, sq0 = sv + KBM * HS * 2, sdo0 = sq0 + 2 * QB;
    float *slse = (float *)((char *)tc_smem + (sdo0 - sk) + 2 * QB), *sD = slse + 2 * BQ; /* (2, BQ) each */
    const uint32_t sds = smem_addr(sD + 2 * BQ); /* (KBM, BQ) bf16 dS^T, ATOMIC_DQ only */
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

    float dk[NO][4], dv[NO][4];
#pragma unroll
    for (int d = 0; d < NO; d++)
#pragma unroll
        for (int e = 0; e < 4; e++) dk[d][e] = dv[d][e] = 0.0f;
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
        __syncthreads();
        const uint32_t sq = sq0 + st * QB, sdo = sdo0 + st * QB;
        float s[NS][4], dp[NS][4];
        two_products<HS, NS, KS>(s, dp, sk, sv, sq, sdo, w * 16); /* S^T = K Q^T, dP^T = V dO^T */
        const bool edge = i0 < j0 + KBM || i0 + BQ > T; /* a tile crossing the diagonal or T */
        dkdv_probs<NS>(s, dp, slse + st * BQ, sD + st * BQ, i0, jr, T, edge, sl2);
#pragma unroll
        for (int ks = 0; ks < BQ / 16; ks++) {
            const uint32_t pa[4] = {pack_bf16(s[2 * ks][0], s[2 * ks][1]), pack_bf16(s[2 * ks][2], s[2 * ks][3]),
                                    pack_bf16(s[2 * ks + 1][0], s[2 * ks + 1][1]),
                                    pack_bf16(s[2 * ks + 1][2], s[2 * ks + 1][3])};
            const uint32_t da[4] = {pack_bf16(dp[2 * ks][0], dp[2 * ks][1]), pack_bf16(dp[2 * ks][2], dp[2 * ks][3]),
                                    pack_bf16(dp[2 * ks + 1][0], dp[2 * ks + 1][1]),
                                    pack_bf16(dp[2 * ks + 1][2], dp[2 * ks + 1][3])};
            if (ATOMIC_DQ) dkdv_store_ds<BQ>(sds, w * 16, ks, da);
#pragma unroll
            for (int d = 0; d < NO; d += 2) {
                uint32_t bf[4];
                ldb_t<HS>(bf, sdo, ks * 16, d * 8);
                mma_bf16(dv[d], pa, bf[0], bf[1]);
                mma_bf16(dv[d + 1], pa, bf[2], bf[3]);
                ldb_t<HS>(bf, sq, ks * 16, d * 8);
                mma_bf16(dk[d], da, bf[0], bf[1]);
                mma_bf16(dk[d + 1], da, bf[2], bf[3]);
            }
        }
        if (ATOMIC_DQ) {
            constexpr int MG = BQ / 16, DW = HS * MG / NW, ND = DW / 8; /* MG groups of 16 query rows, of DW dims */
            static_assert(DW * NW == HS * MG && ND % 2 == 0, "one 16 x DW piece of dQ a warp");
            const int m0 = w % MG * 16, c0 = w / MG * DW;
            __syncthreads(); /* dS^T is whole */
            float dq[ND][4];
#pragma unroll
            for (int d = 0; d < ND; d++) dq[d][0] = dq[d][1] = dq[d][2] = dq[d][3] = 0.0f;
#pragma unroll
            for (int ks = 0; ks < KBM / 16; ks++) {
                uint32_t a[4];
                lda_t<BQ>(a, sds, m0, ks * 16);
#pragma unroll
                for (int d = 0; d < ND; d += 2) {
                    uint32_t bf[4];
                    ldb_t<HS>(bf, sk, ks * 16, c0 + d * 8);
                    mma_bf16(dq[d], a, bf[0], bf[1]);
                    mma_bf16(dq[d + 1], a, bf[2], bf[3]);
                }
            }
            const int h = g * G + it / nq;
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int i = i0 + m0 + gr + 8 * r;
                if (i >= T) continue;
                float *row = dqkv + ((size_t)b * (size_t)T + (size_t)i) * (size_t)W + (size_t)h * HS + c0 + 2 * tg;
#pragma unroll
                for (int d = 0; d < ND; d++) atomicAdd((float2 *)(row + d * 8), make_float2(dq[d][2 * r] * scale, dq[d][2 * r + 1] * scale));
            }
        }
        __syncthreads(); /* this stage (and dS^T) is consumed */
    }
    dkdv_store<NO>(dqkv + (size_t)b * (size_t)T * (size_t)W, dk, dv, T, W, kcol, vcol, jr, scale);
}

/* ---------------------------------------------------------------- tensor-core backward: dq
 * Grid (ceil(T / 64), NH, B), TC_NT threads, x reversed as the forward's. Block (x, h, b): query rows q0 .. q0 + 63
 * of head h (q and dout staged once), warp w rows q0 + 16 w ..; key tiles of BN rows of K and V, 0 .. the diagonal
 * tile, double-buffered: S = Q K^T, dP = dO V^T, P = exp2(S sl2 - lse log2e) (0 for keys past the row, on the
 * diagonal tile only), dS = P (dP - D), dQ += dS K with dS rounded to bf16; dq = scale dQ written once, f32.
 * BN 64 at HS 64, 32 at HS 128. Shared: q, dout 64 x HS and 2 x (K, V) BN x HS bf16: 48 KiB at HS 64, 64 at 128. */
template <int HS>
__global__ void __launch_bounds__(TC_NT)
attn_tc_backward_dq(float *dqkv,               /* (B*T, (NH + 2 NKV) HS): dq written */
                    const kiln_bf16_t *dout,   /* (B*T, NH*HS) */
                    const kiln_bf16_t *qkv,    /* (B*T, (NH + 2 NKV) HS) */
                    const float *lse,          /* (B, NH, T) */
                    const float *D,            /* (B, NH, T) */
                    int T, int NH, int NKV, float sl2, float scale, int order) {
    kiln_pdl_wait();
    kiln_pdl_trigger();
    constexpr int BN = HS == 64 ? 64 : 32, KS = HS / 16, NS = BN / 8, NO = HS / 8;
    constexpr uint32_t KB = BN * HS * 2;
    extern __shared__ uint4 tc_smem[];
    const uint32_t sq = smem_addr(tc_smem), sdo = sq + TC_BM * HS * 2, sk0 = sdo + TC_BM * HS * 2, sv0 = sk0 + 2 * KB;
    const attn_tile at = attn_tile_of(order);
    const int b = at.batch, h = at.head, g = h / (NH / NKV);
    const int q0 = ((int)gridDim.x - 1 - at.rank) * TC_BM, w = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int gr = lane / 4;
    const int64_t W = (int64_t)(NH + 2 * NKV) * HS, Q = (int64_t)NH * HS;
    const kiln_bf16_t *seq = qkv + (size_t)b * (size_t)T * (size_t)W;
    const kiln_bf16_t *kp = seq + (size_t)Q + (size_t)g * HS, *vp = kp + (size_t)NKV * HS;
    const int nkt = (min(q0 + TC_BM, T) + BN - 1) / BN;

    tile_async<TC_BM, HS, TC_NT>(sq, seq + (size_t)h * HS, W, q0, T);
    tile_async<TC_BM, HS, TC_NT>(sdo, dout + (size_t)b * (size_t)T * (size_t)Q + (size_t)h * HS, Q, q0, T);
    tile_async<BN, HS, TC_NT>(sk0, kp, W, 0, T);
    tile_async<BN, HS, TC_NT>(sv0, vp, W, 0, T);
    cp_async_commit();

    const int ir = q0 + w * 16 + gr; /* this lane's query rows: ir, ir + 8 (rows past T read row T - 1) */
    float l2[2], Dr[2];
    dq_rows(l2, Dr, lse, D, ((size_t)b * NH + h) * (size_t)T, ir, T);
    float dq[NO][4];
#pragma unroll
    for (int d = 0; d < NO; d++) dq[d][0] = dq[d][1] = dq[d][2] = dq[d][3] = 0.0f;
    for (int kt = 0; kt < nkt; kt++) {
        const uint32_t sk = sk0 + (kt & 1) * KB, sv = sv0 + (kt & 1) * KB;
        if (kt + 1 < nkt) {
            tile_async<BN, HS, TC_NT>(sk0 + ((kt + 1) & 1) * KB, kp, W, (kt + 1) * BN, T);
            tile_async<BN, HS, TC_NT>(sv0 + ((kt + 1) & 1) * KB, vp, W, (kt + 1) * BN, T);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        float s[NS][4], dp[NS][4];
        two_products<HS, NS, KS>(s, dp, sq, sdo, sk, sv, w * 16); /* S = Q K^T, dP = dO V^T */
        dq_ds<NS>(dp, s, l2, Dr, kt * BN, ir, (kt + 1) * BN > q0, sl2);
#pragma unroll
        for (int ks = 0; ks < BN / 16; ks++) {
            const uint32_t da[4] = {pack_bf16(dp[2 * ks][0], dp[2 * ks][1]), pack_bf16(dp[2 * ks][2], dp[2 * ks][3]),
                                    pack_bf16(dp[2 * ks + 1][0], dp[2 * ks + 1][1]),
                                    pack_bf16(dp[2 * ks + 1][2], dp[2 * ks + 1][3])};
#pragma unroll
            for (int d = 0; d < NO; d += 2) {
                uint32_t bf[4];
                ldb_t<HS>(bf, sk, ks * 16, d * 8);
                mma_bf16(dq[d], da, bf[0], bf[1]);
                mma_bf16(dq[d + 1], da, bf[2], bf[3]);
            }
        }
        __syncthreads(); /* this stage is consumed */
    }
    dq_store<NO>(dqkv + (size_t)b * (size_t)T * (size_t)W, dq, ir, T, W, (int64_t)h * HS, scale);
}

/* Dynamic shared bytes of the tensor-core kernels (kernel comments give the layouts). */
static size_t tc_fwd_smem(int HS, int BM) { return (size_t)(BM + 4 * 64) * HS * 2; }
static size_t tc_dkdv_smem(int HS, bool atomic_dq, int KBM) {
    const int BQ = HS == 64 ? 64 : 32;
    return (size_t)(2 * KBM + 4 * BQ) * HS * 2 + 4 * BQ * 4 + (atomic_dq ? (size_t)KBM * BQ * 2 : 0);
}
static size_t tc_dq_smem(int HS) { const int BN = HS == 64 ? 64 : 32; return (size_t)(2 * 64 + 4 * BN) * HS * 2; }

/* Kernels over 48 KiB of dynamic shared memory must opt in. A host-side attribute of the current device (no
 * synchronization, no allocation, legal during graph capture), set at every launch so that every device gets it. */
template <typename K> static cudaError_t tc_opt_in(K kernel, size_t bytes) {
    return bytes > 48 * 1024 ? cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes)
                             : cudaSuccess;
}

template <int HS, int NW, int MT>
static kiln_status tc_forward(kiln_bf16_t *out, float *lse, const kiln_bf16_t *qkv, int B, int T, int NH, int NKV,
                              cudaStream_t s) {
    constexpr int BM = 16 * MT * NW;
    const size_t smem = tc_fwd_smem(HS, BM);
    const cudaError_t e = tc_opt_in(attn_tc_forward<HS, NW, MT>, smem);
    if (e != cudaSuccess) return checked("attention_forward (train, tensor cores) shared-memory opt-in", e);
    const dim3 grid((unsigned)((T + BM - 1) / BM), (unsigned)NH, (unsigned)B);
    const float sl2 = 1.0f / sqrtf((float)HS) * LOG2E;
    return checked("attention_forward (train, tensor cores)",
                   kiln_launch(attn_tc_forward<HS, NW, MT>, grid, dim3(32 * NW), smem, s, out, lse, qkv, T, NH, NKV, sl2, kiln_attn_order()));
}

/* One dk/dv kernel launch: NW warps of 16 key rows a block. NW 4: at the 124M shape 8 warps (128 keys a block, half
 * the q / dout loads and half the dq atomics) measured 0.475 ms against 0.440 deterministic, and 0.442 against
 * 0.430 with atomic dq; 3 blocks of 4 warps a SM (168 registers, atomic dq) 0.445. */
template <int HS, bool ATOMIC_DQ, int NW>
static kiln_status tc_dkdv(float *dqkv, const kiln_bf16_t *dout, const kiln_bf16_t *qkv, const float *lse, const float *D,
                           int B, int T, int NH, int NKV, cudaStream_t s) {
    const size_t smem = tc_dkdv_smem(HS, ATOMIC_DQ, 16 * NW);
    const cudaError_t e = tc_opt_in(attn_tc_backward_dkdv<HS, ATOMIC_DQ, NW>, smem);
    if (e != cudaSuccess) return checked("attention_backward dk/dv (tensor cores) shared-memory opt-in", e);
    const unsigned tiles = (unsigned)((T + 16 * NW - 1) / (16 * NW));
    const float scale = 1.0f / sqrtf((float)HS), sl2 = scale * LOG2E;
    return checked(ATOMIC_DQ ? "attention_backward dk/dv/dq (tensor cores, atomic dq)" : "attention_backward dk/dv (tensor cores)",
                   kiln_launch(attn_tc_backward_dkdv<HS, ATOMIC_DQ, NW>, dim3(tiles, (unsigned)NKV, (unsigned)B),
                               dim3(32 * NW), smem, s, dqkv, dout, qkv, lse, D, T, NH, NKV, sl2, scale,
                               kiln_attn_order()));
}

/* deterministic: the dk/dv kernel, then the dq kernel; otherwise the dk/dv kernel adding dq by atomics into the
 * dq columns the rowdot kernel zeroed. */
template <int HS>
static kiln_status tc_backward(float *dqkv, const kiln_bf16_t *dout, const kiln_bf16_t *qkv, const float *lse, const float *D,
                               int B, int T, int NH, int NKV, bool deterministic, cudaStream_t s) {
    const bool wg = HS == 64 && kiln_cuda_attention_wgmma(64); /* the dk/dv kernel on wgmma (train_attention_wg.cu) */
    if (!deterministic)
        return wg ? kiln_attn_wg_backward_dkdv(dqkv, dout, qkv, lse, D, B, T, NH, NKV, true, s)
                  : tc_dkdv<HS, true, 4>(dqkv, dout, qkv, lse, D, B, T, NH, NKV, s);
    const kiln_status st = wg ? kiln_attn_wg_backward_dkdv(dqkv, dout, qkv, lse, D, B, T, NH, NKV, false, s)
                              : tc_dkdv<HS, false, 4>(dqkv, dout, qkv, lse, D, B, T, NH, NKV, s);
    if (st != KILN_OK) return st;
    if (wg && kiln_attn_wg_dq_takes()) return kiln_attn_wg_backward_dq(dqkv, dout, qkv, lse, D, B, T, NH, NKV, s);
    const size_t smem_q = tc_dq_smem(HS);
    const cudaError_t e = tc_opt_in(attn_tc_backward_dq<HS>, smem_q);
    if (e != cudaSuccess) return checked("attention_backward dq (tensor cores) shared-memory opt-in", e);
    const unsigned tiles = (unsigned)((T + TC_BM - 1) / TC_BM);
    const float scale = 1.0f / sqrtf((float)HS), sl2 = scale * LOG2E;
    return checked("attention_backward dq (tensor cores)",
                   kiln_launch(attn_tc_backward_dq<HS>, dim3(tiles, (unsigned)NH, (unsigned)B), dim3(TC_NT), smem_q, s,
                               dqkv, dout, qkv, lse, D, T, NH, NKV, sl2, scale, kiln_attn_order()));
}

/* ---------------------------------------------------------------- entry points (train_attention_tc.h) */

kiln_status kiln_attn_tc_forward(kiln_bf16_t *out, float *lse, const kiln_bf16_t *qkv, int B, int T, int NH, int NKV, int HS,
                                 cudaStream_t s) {
    /* HS 64: 4 warps of 2 m-tiles (128 rows): 0.129 ms at the 124M shape, against 0.136 for 4 warps of one
     * (64 rows), 0.143 for 8 of one (128 rows, 128 registers), 0.149 for 8 of two (256 rows); HS 128 keeps 4 warps of
     * one (o alone is 64 f32 a lane per m-tile there: no room for a second) */
    if (kiln_cuda_attention_wgmma(HS)) return kiln_attn_wg_forward(out, lse, qkv, B, T, NH, NKV, HS, s);
    return HS == 64 ? tc_forward<64, 4, 2>(out, lse, qkv, B, T, NH, NKV, s) : tc_forward<128, 4, 1>(out, lse, qkv, B, T, NH, NKV, s);
}

kiln_status kiln_attn_tc_backward(float *dqkv, const kiln_bf16_t *dout, const kiln_bf16_t *qkv, const float *lse, const float *D,
                                  int B, int T, int NH, int NKV, int HS, bool deterministic, cudaStream_t s) {
    return HS == 64 ? tc_backward<64>(dqkv, dout, qkv, lse, D, B, T, NH, NKV, deterministic, s)
                    : tc_backward<128>(dqkv, dout, qkv, lse, D, B, T, NH, NKV, deterministic, s);
}
