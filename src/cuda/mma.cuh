/* mma.cuh: the tensor-core pieces that the flash-attention kernels share (train_attention_tc.cu, the training
 * forward and backward; attention_tc.cu, the inference prefill): cp.async copies into shared memory, the swizzled
 * tile layout and its ldmatrix fragment loads, mma.sync.m16n8k16 in bf16 and f16, and the MUFU exp2.
 * Fragments (PTX ISA, "mma.m16n8k16"): lane = 4 gr + tg; an accumulator holds (row gr, cols 2 tg, 2 tg + 1) in
 * c0, c1 and (row gr + 8, same cols) in c2, c3, which is also the A layout. A tile stores the 16-byte piece c of
 * row r at piece c ^ (r & 7): the 8 rows an ldmatrix phase reads then hit 8 different 4-bank groups. */
#ifndef KILN_CUDA_MMA_CUH
#define KILN_CUDA_MMA_CUH

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#define LOG2E 1.4426950408889634f

static __device__ __forceinline__ uint32_t smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* 16 bytes global -> shared, zero-filled (nothing read) when !valid; src must still be a mapped address. */
static __device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
static __device__ __forceinline__ void cp_async4(uint32_t dst, const void *src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "r"(valid ? 4 : 0) : "memory");
}
static __device__ __forceinline__ void cp_async_commit(void) { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> static __device__ __forceinline__ void cp_async_wait(void) {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

static __device__ __forceinline__ void ldsm_x4(uint32_t r[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
static __device__ __forceinline__ void ldsm_x4_t(uint32_t r[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

/* c (16 x 8) += a (16 x 16) b (16 x 8), bf16 operands, f32 accumulators. */
static __device__ __forceinline__ void mma_bf16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* 2^x by the MUFU alone (ex2.approx.ftz: max relative error 2^-22, results below 2^-126 flushed to 0, -inf to 0);
 * exp2f adds 3 instructions of denormal scaling around it, which the softmax's probabilities (rounded to bf16, or
 * summed against l >= 1) never need. */
static __device__ __forceinline__ float exp2_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* Two floats to a bf16 pair, lo in the low half (the lower column), round to nearest even. */
static __device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

/* Byte offset of 16-byte piece c of row r in a swizzled tile of WD-wide bf16 rows (WD = HS, or BQ for the dS^T
 * tile). Rows of 32 (64 bytes, two a 128-byte bank line) xor the piece with (r / 2) % 4 instead: 8 consecutive
 * rows then still cover the 8 four-bank groups once. */
template <int WD> static __device__ __forceinline__ uint32_t swz(int r, int c) {
    static_assert(WD == 32 || WD % 64 == 0, "rows of 32 or a multiple of 64 bf16");
    if constexpr (WD == 32) return (uint32_t)(r * 64 + ((c ^ ((r >> 1) & 3)) << 4));
    else return (uint32_t)(r * WD * 2 + ((c ^ (r & 7)) << 4));
}

/* c (16 x 8) += a (16 x 16) b (16 x 8), f16 operands, f32 accumulators. */
static __device__ __forceinline__ void mma_f16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Two floats to an f16 pair, lo in the low half (the lower column), round to nearest even. */
static __device__ __forceinline__ uint32_t pack_f16(float lo, float hi) {
    uint32_t r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

/* A fragment (16 x 16 at rows m0, cols k0) of a swizzled row-major tile: matrices (rows +0, k +0), (+8, +0),
 * (+0, +8), (+8, +8), lane l giving the address of row l % 8 of matrix l / 8. */
template <int HS> static __device__ __forceinline__ void lda(uint32_t a[4], uint32_t tile, int m0, int k0) {
    const int l = threadIdx.x % 32;
    ldsm_x4(a, tile + swz<HS>(m0 + l % 8 + (l / 8 % 2) * 8, k0 / 8 + l / 16));
}
/* An A fragment (16 x 16 at rows m0, cols k0) of tile^T, from a tile stored (k, m) row-major, transposed by
 * ldmatrix: the same four matrices as lda, read at (k +0, m +0), (k +0, m +8), (k +8, m +0), (k +8, m +8). */
template <int WD> static __device__ __forceinline__ void lda_t(uint32_t a[4], uint32_t tile, int m0, int k0) {
    const int l = threadIdx.x % 32;
    ldsm_x4_t(a, tile + swz<WD>(k0 + (l / 16) * 8 + l % 8, m0 / 8 + l / 8 % 2));
}
/* B fragments of two n-tiles (n0, n0 + 8) at k0 from a tile stored (n, k) row-major (B = tile^T): matrices
 * (n +0, k +0), (n +0, k +8), (n +8, k +0), (n +8, k +8); b[0], b[1] for n0, b[2], b[3] for n0 + 8. */
template <int HS> static __device__ __forceinline__ void ldb(uint32_t b[4], uint32_t tile, int n0, int k0) {
    const int l = threadIdx.x % 32;
    ldsm_x4(b, tile + swz<HS>(n0 + l % 8 + (l / 16) * 8, k0 / 8 + l / 8 % 2));
}
/* B fragments of two n-tiles (n0, n0 + 8) at k0 from a tile stored (k, n) row-major (B = tile), transposed by
 * ldmatrix: matrices (k +0, n +0), (k +8, n +0), (k +0, n +8), (k +8, n +8). */
template <int HS> static __device__ __forceinline__ void ldb_t(uint32_t b[4], uint32_t tile, int k0, int n0) {
    const int l = threadIdx.x % 32;
    ldsm_x4_t(b, tile + swz<HS>(k0 + l % 8 + (l / 8 % 2) * 8, n0 / 8 + l / 16));
}

/* Byte offset of 16-byte piece c of row r in the wgmma kernels' tile of R rows of HS bf16 (HS a multiple of 64):
 * HS / 64 blocks of R rows of 64 one after another, each a swz<64> tile (128-byte rows: wgmma's 128-byte swizzle,
 * wgmma.cuh). For HS 64 it is swz<64>. */
template <int R, int HS> static __device__ __forceinline__ uint32_t swz_wg(int r, int c) {
    static_assert(HS % 64 == 0, "rows of a multiple of 64 bf16");
    return (uint32_t)(c / 8) * (uint32_t)(R * 128) + swz<64>(r, c % 8);
}
/* Byte offset, in the same layout, of a wgmma operand whose 16 columns of k-step ks run along rows r0 .. (K-major: a
 * descriptor's start address; the 128-byte swizzle is applied by the tensor cores, so only the row and the 32-byte
 * step within the row's 128 bytes are added). */
template <int R> static __device__ __forceinline__ uint32_t swz_wg_kstep(int r0, int ks) {
    return (uint32_t)(ks / 4) * (uint32_t)(R * 128) + (uint32_t)r0 * 128u + (uint32_t)(ks % 4) * 32u;
}

/* Rows r0 .. r0 + R - 1 of a (T, stride) bf16 (or f16) matrix, HS columns from x, into the swizzled tile at shared address
 * tile (R, HS: swz<HS>, or swz_wg<R, HS> when WG); rows >= T zero-filled. The whole block (NT threads) issues it; the
 * caller commits the group. */
template <int R, int HS, int NT, bool WG = false>
static __device__ __forceinline__ void tile_async(uint32_t tile, const uint16_t *x, int64_t stride, int r0, int T) {
    constexpr int P = HS / 8; /* 16-byte pieces a row */
#pragma unroll
    for (int k = 0; k < (R * P + NT - 1) / NT; k++) {
        const int i = k * NT + threadIdx.x, r = i / P, c = i % P, row = r0 + r;
        if (R * P % NT != 0 && i >= R * P) break; /* a last partial pass (NT not a power of 2) */
        uint32_t off;
        if constexpr (WG) off = swz_wg<R, HS>(r, c);
        else off = swz<HS>(r, c);
        cp_async16(tile + off, x + (size_t)min(row, T - 1) * (size_t)stride + c * 8, row < T);
    }
}

/* A causal attention block's tile (grid: tiles, heads, batch), by how much work it holds: rank 0 is the heaviest tile
 * (the forward's and the dq kernel's last query tile, which meets every key tile; the dk/dv kernel's first key tile,
 * which meets every query tile). heavy_first walks the grid in launch order rank by rank across every (head, batch),
 * all the rank-0 tiles first, so the last partial wave holds the lightest tiles; otherwise rank = x, and the ranks
 * of one (head, batch) run together. kiln_attn_order (train_attention_tc.h) picks. */
struct attn_tile {
    int rank, head, batch;
};
static __device__ __forceinline__ attn_tile attn_tile_of(int heavy_first) {
    if (!heavy_first) return attn_tile{(int)blockIdx.x, (int)blockIdx.y, (int)blockIdx.z};
    const int pairs = (int)(gridDim.y * gridDim.z);
    const int lin = (int)(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z)), pair = lin % pairs;
    return attn_tile{lin / pairs, pair % (int)gridDim.y, pair / (int)gridDim.y};
}

/* The dq kernels' pieces (train_attention_tc.cu on mma.sync, train_attention_wg.cu on wgmma): both hold a lane's
 * accumulator rows ir and ir + 8 of one head, in the m16n8 fragment layout (lane = 4 gr + tg).
 * dq_rows: lse (times log2 e) and D of those rows from (B, NH, T) at base = (b NH + h) T; rows past T read row T - 1. */
static __device__ __forceinline__ void dq_rows(float l2[2], float Dr[2], const float *lse, const float *D, size_t base, int ir,
                                               int T) {
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const size_t ix = base + (size_t)min(ir + 8 * r, T - 1);
        l2[r] = lse[ix] * LOG2E, Dr[r] = D[ix];
    }
}
/* dS = P (dP - D) in place of dp, P = exp2(S sl2 - lse log2 e), for keys j0 .. of the tile; diag: some key may pass a
 * row, whose P is then 0. */
template <int NS>
static __device__ __forceinline__ void dq_ds(float dp[NS][4], const float s[NS][4], const float l2[2], const float Dr[2], int j0,
                                             int ir, bool diag, float sl2) {
    const int tg = threadIdx.x % 4;
#pragma unroll
    for (int n = 0; n < NS; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int r = e >> 1, j = j0 + n * 8 + 2 * tg + (e & 1);
            float p = exp2_ftz(fmaf(s[n][e], sl2, -l2[r]));
            if (diag && j > ir + 8 * r) p = 0.0f;
            dp[n][e] = p * (dp[n][e] - Dr[r]);
        }
}
/* dq = scale dQ into the rows ir, ir + 8 (< T) of seq (T, W) f32, columns from col: written once. */
template <int NO>
static __device__ __forceinline__ void dq_store(float *seq, const float dq[NO][4], int ir, int T, int64_t W, int64_t col,
                                                float scale) {
    const int tg = threadIdx.x % 4;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int i = ir + 8 * r;
        if (i >= T) continue;
        float *row = seq + (size_t)i * (size_t)W + (size_t)col + 2 * tg;
#pragma unroll
        for (int d = 0; d < NO; d++) *(float2 *)(row + d * 8) = make_float2(dq[d][2 * r] * scale, dq[d][2 * r + 1] * scale);
    }
}

/* The dk/dv kernel's loads for iteration it: head g G + it / nq, query rows i0 = j0 + (it % nq) BQ .. of q and dout
 * (bf16 tiles) and of lse and D (f32, 4-byte copies: a row of T floats need not be 16-byte aligned), into stage
 * it & 1. The whole block issues it; the caller commits. (The training backward's dk/dv kernels: train_attention_tc.cu
 * on mma.sync, train_attention_wg.cu on wgmma.) */
template <int HS, int BQ, int NT>
static __device__ __forceinline__ void dkdv_issue(int it, uint32_t sq0, uint32_t sdo0, float *slse, float *sD,
                                                  const uint16_t *seq,  /* (T, W) sequence b of qkv (bf16) */
                                                  const uint16_t *dseq, /* (T, NH*HS) sequence b of dout */
                                                  const float *lse, const float *D, /* (B, NH, T) */
                                                  int b, int g, int G, int NH, int j0, int nq, int T) {
    constexpr uint32_t QB = BQ * HS * 2;
    const int64_t W = (int64_t)(NH + 2 * (NH / G)) * HS, Q = (int64_t)NH * HS;
    const int h = g * G + it / nq, i0 = j0 + it % nq * BQ, st = it & 1;
    tile_async<BQ, HS, NT>(sq0 + st * QB, seq + (size_t)h * HS, W, i0, T);
    tile_async<BQ, HS, NT>(sdo0 + st * QB, dseq + (size_t)h * HS, Q, i0, T);
    if (threadIdx.x < 2 * BQ) {
        const int r = threadIdx.x % BQ, i = min(i0 + r, T - 1);
        const float *src = (threadIdx.x < BQ ? lse : D) + ((size_t)b * NH + h) * (size_t)T + i;
        float *dst = (threadIdx.x < BQ ? slse : sD) + st * BQ + r;
        cp_async4(smem_addr(dst), src, i0 + r < T);
    }
}

/* The dk/dv kernels' step from S^T and dP^T (a warp's key rows jr, jr + 8 by the tile's NS * 8 query columns from
 * i0, in the accumulator layout) to P^T = exp2(S^T sl2 - lse log2(e)), 0 unless key <= query < T (checked on an
 * edge tile only), in s, and dS^T = P^T (dP^T - D) in dp; tl and td the tile's lse and D in shared memory: dkdv_p
 * then dkdv_ds (the wgmma kernel's pipelined form runs them apart, the dP product in flight during dkdv_p). */
template <int NS>
static __device__ __forceinline__ void dkdv_p(float s[NS][4], const float *tl, int i0, int jr, int T, bool edge, float sl2) {
    const int tg = threadIdx.x % 4;
#pragma unroll
    for (int n = 0; n < NS; n++)
#pragma unroll
        for (int c = 0; c < 2; c++) {
            const int ii = n * 8 + 2 * tg + c, i = i0 + ii;
            const float l2 = tl[ii] * LOG2E;
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int e = 2 * r + c;
                float p = exp2_ftz(fmaf(s[n][e], sl2, -l2));
                if (edge && (i < jr + 8 * r || i >= T)) p = 0.0f;
                s[n][e] = p;
            }
        }
}
template <int NS> static __device__ __forceinline__ void dkdv_ds(float dp[NS][4], const float s[NS][4], const float *td) {
    const int tg = threadIdx.x % 4;
#pragma unroll
    for (int n = 0; n < NS; n++)
#pragma unroll
        for (int c = 0; c < 2; c++) {
            const float Di = td[n * 8 + 2 * tg + c];
#pragma unroll
            for (int r = 0; r < 2; r++) dp[n][2 * r + c] = s[n][2 * r + c] * (dp[n][2 * r + c] - Di);
        }
}
template <int NS>
static __device__ __forceinline__ void dkdv_probs(float s[NS][4], float dp[NS][4], const float *tl, const float *td, int i0,
                                                  int jr, int T, bool edge, float sl2) {
    dkdv_p<NS>(s, tl, i0, jr, T, edge, sl2);
    dkdv_ds<NS>(dp, s, td);
}

/* A warp's packed dS^T fragment da for query k-step ks (da[e]: key row m0 + gr + 8 (e % 2), query columns
 * 8 (2 ks + e / 2) + 2 tg and + 1) into the swizzled (keys, BQ) tile at sds, for the dQ product. */
template <int BQ>
static __device__ __forceinline__ void dkdv_store_ds(uint32_t sds, int m0, int ks, const uint32_t da[4]) {
    const int lane = threadIdx.x % 32, gr = lane / 4, tg = lane % 4;
#pragma unroll
    for (int e = 0; e < 4; e++)
        asm volatile("st.shared.b32 [%0], %1;" ::"r"(sds + swz<BQ>(m0 + gr + 8 * (e & 1), 2 * ks + e / 2) + 4 * tg), "r"(da[e])
                     : "memory");
}

/* The dk/dv kernels' end: dk = scale dK and dv of the lane's key rows jr, jr + 8 (< T) written once, f32, into
 * sequence seq of dqkv (rows of W floats, k at column kcol, v at vcol). */
template <int NO>
static __device__ __forceinline__ void dkdv_store(float *seq, const float dk[NO][4], const float dv[NO][4], int T, int64_t W,
                                                  int64_t kcol, int64_t vcol, int jr, float scale) {
    const int tg = threadIdx.x % 4;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int j = jr + 8 * r;
        if (j >= T) continue;
        float *row = seq + (size_t)j * (size_t)W + 2 * tg;
#pragma unroll
        for (int d = 0; d < NO; d++) {
            *(float2 *)(row + kcol + d * 8) = make_float2(dk[d][2 * r] * scale, dk[d][2 * r + 1] * scale);
            *(float2 *)(row + vcol + d * 8) = make_float2(dv[d][2 * r], dv[d][2 * r + 1]);
        }
    }
}

/* ---------------------------------------------------------------- one key tile of a FlashAttention-2 forward
 * The three steps both forwards (train_attention_tc.cu in bf16, attention_tc.cu in f16) run per tile of BN keys
 * for a warp's MT m-tiles of 16 query rows: S = Q K^T, the online softmax, O += P V. The kernel masks S between
 * the first and the second (its masks differ: causal, or causal with a sliding window over ring-cache positions). */

/* mma.m16n8k16 and the pair rounding in the kernel's operand type: f16 (F16) or bf16. */
template <bool F16> static __device__ __forceinline__ void mma_t(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    if constexpr (F16) mma_f16(c, a, b0, b1);
    else mma_bf16(c, a, b0, b1);
}
template <bool F16> static __device__ __forceinline__ uint32_t pack_t(float lo, float hi) {
    if constexpr (F16) return pack_f16(lo, hi);
    else return pack_bf16(lo, hi);
}

/* s = Q K^T (16 MT x 8 NS a warp): qf the warp's Q fragments (MT m-tiles, KS = HS / 16 k-steps), sk the swizzled
 * (8 NS, HS) key tile. Each K fragment serves all MT m-tiles. */
template <bool F16, int HS, int MT, int NS>
static __device__ __forceinline__ void fa_scores(float s[MT][NS][4], const uint32_t qf[MT][HS / 16][4], uint32_t sk) {
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int n = 0; n < NS; n++) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < HS / 16; ks++)
#pragma unroll
        for (int n = 0; n < NS; n += 2) {
            uint32_t bf[4];
            ldb<HS>(bf, sk, n * 8, ks * 16);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                mma_t<F16>(s[mt][n], qf[mt][ks], bf[0], bf[1]);
                mma_t<F16>(s[mt][n + 1], qf[mt][ks], bf[2], bf[3]);
            }
        }
}

/* The online softmax over one tile: s (masked entries -inf) times sl2 gives base-2 logits (sl2 = scale log2(e),
 * or 1 where q came scaled); m the rows' running max of those, l the lane's partial row sums, o the output
 * accumulators (NO n-tiles of 8). The tile's max reaches each row's 4 lanes by 2 xor shuffles; m, l and o are
 * rescaled by exp2(m - m_new) and s becomes p = exp2(s sl2 - m_new) (0 where masked). A row that has seen no key
 * yet (a window's start, a padding row) keeps m = -inf and uses 0 in its place: fac 0 and p 0 instead of
 * exp2(-inf + inf). */
template <int MT, int NS, int NO>
static __device__ __forceinline__ void fa_softmax(float s[MT][NS][4], float m[MT][2], float l[MT][2], float o[MT][NO][4], float sl2) {
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float mx = -INFINITY;
#pragma unroll
            for (int n = 0; n < NS; n++) mx = fmaxf(mx, fmaxf(s[mt][n][2 * r], s[mt][n][2 * r + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float mn = fmaxf(m[mt][r], mx * sl2), mu = mn == -INFINITY ? 0.0f : mn;
            const float fac = exp2_ftz(m[mt][r] - mu);
            m[mt][r] = mn;
            l[mt][r] *= fac;
#pragma unroll
            for (int d = 0; d < NO; d++) o[mt][d][2 * r] *= fac, o[mt][d][2 * r + 1] *= fac;
#pragma unroll
            for (int n = 0; n < NS; n++)
#pragma unroll
                for (int e = 2 * r; e < 2 * r + 2; e++) {
                    s[mt][n][e] = exp2_ftz(fmaf(s[mt][n][e], sl2, -mu));
                    l[mt][r] += s[mt][n][e];
                }
        }
}

/* o += P V: p (16 MT x 8 NS a warp, the accumulators of fa_scores after fa_softmax) rounded to the operand type
 * as A fragments in registers, sv the swizzled (8 NS, HS) value tile read transposed. */
template <bool F16, int HS, int MT, int NS>
static __device__ __forceinline__ void fa_pv(float o[MT][HS / 8][4], const float s[MT][NS][4], uint32_t sv) {
#pragma unroll
    for (int ks = 0; ks < NS / 2; ks++) {
        uint32_t pa[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            pa[mt][0] = pack_t<F16>(s[mt][2 * ks][0], s[mt][2 * ks][1]);
            pa[mt][1] = pack_t<F16>(s[mt][2 * ks][2], s[mt][2 * ks][3]);
            pa[mt][2] = pack_t<F16>(s[mt][2 * ks + 1][0], s[mt][2 * ks + 1][1]);
            pa[mt][3] = pack_t<F16>(s[mt][2 * ks + 1][2], s[mt][2 * ks + 1][3]);
        }
#pragma unroll
        for (int d = 0; d < HS / 8; d += 2) {
            uint32_t bf[4];
            ldb_t<HS>(bf, sv, ks * 16, d * 8);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                mma_t<F16>(o[mt][d], pa[mt], bf[0], bf[1]);
                mma_t<F16>(o[mt][d + 1], pa[mt], bf[2], bf[3]);
            }
        }
    }
}

/* The end of the key loop: each row's sum l over its 4 lanes. */
template <int MT> static __device__ __forceinline__ void fa_row_sums(float l[MT][2]) {
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            l[mt][r] += __shfl_xor_sync(0xffffffffu, l[mt][r], 1);
            l[mt][r] += __shfl_xor_sync(0xffffffffu, l[mt][r], 2);
        }
}

#endif
