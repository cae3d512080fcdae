/* train_attention.cu: causal GQA flash attention for training (train_kernels.h's train_attention.cu section):
 * the forward saving each row's log-sum-exp, and the FlashAttention-2 backward that recomputes the probabilities
 * from qkv and lse, never forming the T x T scores. bf16 inputs (the packed qkv the rope writes, dout, out), the
 * same formulas as the CPU oracle (src/cpu/ops_attention.c, "training"): s = (q . k) * scale, scale = 1/sqrt(HS);
 * lse = M + log(L); p = exp(s - lse); ds = p (dp - D) scale with dp = dout . v and D = rowsum(dout * out).
 *
 * Two paths. HS 64 and 128 (the trained models' heads) run on tensor cores (mma.sync m16n8k16 bf16 -> f32,
 * ldmatrix, cp.async double buffering; train_attention_tc.cu): P and dS are rounded to bf16 as mma
 * operands, the rest is f32. Every other head size runs the CUDA-core kernels, all f32 math:
 *
 * Layout of the CUDA-core kernels: a block of ATTN_NT threads owns R = ATTN_NT / SG rows (query rows in the
 * forward and the dq pass, key rows in the dk/dv pass), each row held by a group of SG = HSM / 8 lanes, lane_g
 * owning dims 8 lane_g .. 8 lane_g + 7 (one 16-byte load of 8 bf16). HSM is the head size rounded up to a power of
 * two (8 .. 256: 1 .. 32 lanes a row); lanes past the head size hold zeros. The other side (keys in the forward and
 * dq pass, queries in the dk/dv pass) streams through shared memory in tiles of 32 rows of bf16 (32 KiB for K and
 * V at HSM 256); each row of the tile meets every row of the block as a dot product reduced over the SG lanes by
 * xor shuffles.
 *
 * Backward, deterministic (no atomics: every element of dqkv is written once, by one thread, the sums in a fixed
 * order; two runs give the same bits): D into ws; then per (batch, KV head, key tile) dk, dv summed over the G
 * query heads of the group and the query tiles that see the keys; then a separate dq pass per (batch, head, query
 * tile) over the key tiles, recomputing the same probabilities by the same formulas. dqkv is overwritten. The
 * tensor-core path also has the non-deterministic backward (deterministic = false): the dk/dv kernel adds dq by f32
 * atomics into dq columns the D kernel zeroed, and no dq pass runs; the CUDA-core path ignores the flag.
 *
 * tests/test_cuda_train_attention.c checks out, lse, dq, dk, dv against kiln_cpu_ops.attention_forward_train /
 * attention_backward on random bf16 inputs, head sizes 8 .. 256 (64 and 128: the tensor-core path, with its
 * looser bounds, T with tails of every tile), GQA and not, both backward modes, and the deterministic one's
 * determinism; bench gpu-kernels times the tensor-core path at the trainer's shapes, both modes. */
#include "cuda/launch.h"
#include "cuda/train_attention_tc.h"
#include "cuda/train_kernels.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "status.h"

#define ATTN_NT 256 /* threads per block: 8 warps */
#define ATTN_BK 32  /* rows per shared-memory tile (keys in the forward and dq pass, queries in the dk/dv pass) */

/* A kiln_launch's own error first, then any earlier asynchronous one (launch.h). */
static kiln_status checked(const char *what, cudaError_t e) { return kiln_launch_status(what, e); }

static bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* ---------------------------------------------------------------- helpers */

/* 8 bf16 (one 16-byte load) to float: element 2i is the low half of word i (little-endian). */
static __device__ __forceinline__ void bf8_to_f32(uint4 u, float *f) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        f[2 * i] = __uint_as_float(w[i] << 16);
        f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}

/* 8 floats to 8 bf16, round to nearest even. */
static __device__ __forceinline__ uint4 f32_to_bf8(const float *f) {
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const uint32_t lo = __bfloat16_as_ushort(__float2bfloat16_rn(f[2 * i]));
        const uint32_t hi = __bfloat16_as_ushort(__float2bfloat16_rn(f[2 * i + 1]));
        w[i] = lo | hi << 16;
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

/* The sum over the SG lanes of a row group (SG a power of two, groups aligned to SG lanes). Every lane of the
 * warp must call it: the callers' loops are uniform over the block. */
template <int SG> static __device__ __forceinline__ float group_sum(float v) {
#pragma unroll
    for (int o = SG / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* The partial dot product of one lane's 8 dims: fmaf in dim order (the dk/dv and dq passes compute the same
 * products in the same order, so they see bit-identical scores). */
static __device__ __forceinline__ float dot8(const float *a, const float *b) {
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; i++) s = fmaf(a[i], b[i], s);
    return s;
}

/* Rows j0 .. j0 + ATTN_BK - 1 of a (rows, stride) bf16 matrix, columns col .. col + hs - 1, into a shared tile
 * (ATTN_BK, SG) of 16-byte pieces; rows >= n and pieces past hs are zero. Called by the whole block. */
template <int SG>
static __device__ __forceinline__ void load_tile(uint4 (*tile)[SG], const kiln_bf16_t *x, int64_t stride, int64_t col,
                                                 int j0, int n, int hs) {
    for (int i = threadIdx.x; i < ATTN_BK * SG; i += ATTN_NT) {
        const int r = i / SG, p = i % SG, j = j0 + r;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (j < n && p * 8 < hs) v = *(const uint4 *)(x + (size_t)j * (size_t)stride + (size_t)col + (size_t)p * 8);
        tile[r][p] = v;
    }
}

/* ---------------------------------------------------------------- forward
 * Grid (ceil(T / R), NH, B), ATTN_NT threads. Block (x, h, b) owns query rows t0 .. t0 + R - 1 of head h in
 * sequence b, the last tiles first (x reversed: they see the most keys, so they start early). Key tiles of ATTN_BK
 * rows of K and V (KV head h / G) are staged as bf16; per tile each row takes its ATTN_BK scores (masked past its
 * own position), rescales its running (m, l, acc) once by exp(m_old - m_new), and adds p_j v_j. Rows past T
 * compute as row T - 1 (keeping the shuffles uniform) and write nothing. */
template <int HSM>
__global__ void __launch_bounds__(ATTN_NT)
attn_train_forward(kiln_bf16_t *out,        /* (B*T, NH*hs) */
                   float *lse,              /* (B, NH, T) */
                   const kiln_bf16_t *qkv,  /* (B*T, (NH + 2 NKV) hs) */
                   int T, int NH, int NKV, int hs, float scale) {
    kiln_pdl_wait();
    kiln_pdl_trigger();
    constexpr int SG = HSM / 8, R = ATTN_NT / SG;
    __shared__ uint4 sk[ATTN_BK][SG], sv[ATTN_BK][SG]; /* (ATTN_BK, HSM) bf16 each */
    const int b = blockIdx.z, h = blockIdx.y, g = h / (NH / NKV);
    const int t0 = (gridDim.x - 1 - blockIdx.x) * R;
    const int lane_g = threadIdx.x % SG, t = t0 + threadIdx.x / SG, tq = min(t, T - 1);
    const int64_t W = (int64_t)(NH + 2 * NKV) * hs; /* qkv's row stride */
    const int64_t kcol = (int64_t)NH * hs + (int64_t)g * hs, vcol = kcol + (int64_t)NKV * hs;
    const kiln_bf16_t *seq = qkv + (size_t)b * (size_t)T * (size_t)W; /* row 0 of sequence b */
    const bool act = lane_g * 8 < hs;

    float qf[8] = {0, 0, 0, 0, 0, 0, 0, 0}, acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (act) bf8_to_f32(*(const uint4 *)(seq + (size_t)tq * (size_t)W + (size_t)h * hs + lane_g * 8), qf);
    float m = -INFINITY, l = 0.0f;
    const int kend = min(t0 + R, T); /* keys 0 .. kend - 1 are seen by some row of the block */
    for (int j0 = 0; j0 < kend; j0 += ATTN_BK) {
        __syncthreads(); /* the previous tile is consumed */
        load_tile<SG>(sk, seq, W, kcol, j0, T, hs);
        load_tile<SG>(sv, seq, W, vcol, j0, T, hs);
        __syncthreads();
        float s[ATTN_BK], mx = m;
#pragma unroll
        for (int jj = 0; jj < ATTN_BK; jj++) {
            float kf[8];
            bf8_to_f32(sk[jj][lane_g], kf);
            const float dot = group_sum<SG>(dot8(qf, kf));
            s[jj] = j0 + jj <= tq ? dot * scale : -INFINITY;
            mx = fmaxf(mx, s[jj]);
        }
        /* mx is finite: the first tile holds key 0, which every row sees */
        const float fac = expf(m - mx); /* 0 on the first tile (m = -inf) */
        l *= fac;
#pragma unroll
        for (int d = 0; d < 8; d++) acc[d] *= fac;
#pragma unroll
        for (int jj = 0; jj < ATTN_BK; jj++) {
            const float p = expf(s[jj] - mx); /* 0 for masked keys */
            float vf[8];
            bf8_to_f32(sv[jj][lane_g], vf);
            l += p;
#pragma unroll
            for (int d = 0; d < 8; d++) acc[d] = fmaf(p, vf[d], acc[d]);
        }
        m = mx;
    }
    if (t >= T) return;
    const size_t n = (size_t)b * (size_t)T + (size_t)t;
    if (act) {
        float o[8];
#pragma unroll
        for (int d = 0; d < 8; d++) o[d] = acc[d] / l;
        *(uint4 *)(out + n * (size_t)NH * hs + (size_t)h * hs + lane_g * 8) = f32_to_bf8(o);
    }
    if (lane_g == 0) lse[((size_t)b * NH + h) * (size_t)T + t] = m + logf(l);
}

/* ---------------------------------------------------------------- backward: D = rowsum(dout * out)
 * Grid ceil(B*T*NH / 32), ATTN_NT threads: 8 lanes per (token, head) row, lane i summing pieces i, i + 8, .. of
 * the row, then a 3-step xor reduction. D (B, NH, T), lse's layout. With dqkv (the non-deterministic backward,
 * which adds dq by atomics) it also zeroes the row's dq columns, so that needs no pass of its own. */
__global__ void __launch_bounds__(ATTN_NT)
attn_train_rowdot(float *D,                 /* (B, NH, T) */
                  float *dqkv,              /* (B*T, W) or NULL: dq zeroed */
                  const kiln_bf16_t *dout,  /* (B*T, NH*hs) */
                  const kiln_bf16_t *out,   /* (B*T, NH*hs) */
                  int64_t rows, int T, int NH, int hs, int64_t W) {
    kiln_pdl_wait();
    kiln_pdl_trigger();
    const int64_t row = (int64_t)blockIdx.x * (ATTN_NT / 8) + threadIdx.x / 8; /* (n, h) = (row / NH, row % NH) */
    const int lane8 = threadIdx.x % 8;
    float s = 0.0f;
    if (row < rows)
        for (int p = lane8; p * 8 < hs; p += 8) {
            float a[8], o[8];
            bf8_to_f32(*(const uint4 *)(dout + (size_t)row * hs + (size_t)p * 8), a);
            bf8_to_f32(*(const uint4 *)(out + (size_t)row * hs + (size_t)p * 8), o);
            s += dot8(a, o);
        }
    if (dqkv && row < rows) {
        float *dq = dqkv + (size_t)(row / NH) * (size_t)W + (size_t)(row % NH) * hs;
        for (int p = lane8; p * 4 < hs; p += 8) *(float4 *)(dq + p * 4) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    s = group_sum<8>(s);
    if (row < rows && lane8 == 0) {
        const int64_t n = row / NH, h = row % NH, b = n / T, t = n % T;
        D[(b * NH + h) * T + t] = s;
    }
}

/* ---------------------------------------------------------------- backward: dk, dv
 * Grid (ceil(T / R), NKV, B), ATTN_NT threads. Block (x, g, b) owns key rows j0 .. j0 + R - 1 of KV head g; each
 * row's group holds k_j, v_j and accumulates dk_j, dv_j over the G query heads of the group (in head order) and,
 * per head, the query tiles from the one holding j0 to T - 1 (in order). A query tile stages q and dout (bf16) and
 * its lse and D; per query i: p = exp(s - lse_i) (0 unless j <= i < T), dp = dout_i . v_j, ds = p (dp - D_i) scale,
 * dv_j += p dout_i, dk_j += ds q_i. Rows past T compute as row T - 1 and write nothing. */
template <int HSM>
__global__ void __launch_bounds__(ATTN_NT)
attn_train_backward_dkdv(float *dqkv,               /* (B*T, (NH + 2 NKV) hs): dk, dv written */
                         const kiln_bf16_t *dout,   /* (B*T, NH*hs) */
                         const kiln_bf16_t *qkv,    /* (B*T, (NH + 2 NKV) hs) */
                         const float *lse,          /* (B, NH, T) */
                         const float *D,            /* (B, NH, T) */
                         int T, int NH, int NKV, int hs, float scale) {
    kiln_pdl_wait();
    kiln_pdl_trigger();
    constexpr int SG = HSM / 8, R = ATTN_NT / SG;
    __shared__ uint4 sq[ATTN_BK][SG], sdo[ATTN_BK][SG]; /* (ATTN_BK, HSM) bf16 each */
    __shared__ float slse[ATTN_BK], sD[ATTN_BK];
    const int b = blockIdx.z, g = blockIdx.y, G = NH / NKV;
    const int j0 = blockIdx.x * R;
    const int lane_g = threadIdx.x % SG, j = j0 + threadIdx.x / SG, jq = min(j, T - 1);
    const int64_t W = (int64_t)(NH + 2 * NKV) * hs, Q = (int64_t)NH * hs;
    const int64_t kcol = Q + (int64_t)g * hs, vcol = kcol + (int64_t)NKV * hs;
    const kiln_bf16_t *seq = qkv + (size_t)b * (size_t)T * (size_t)W;
    const kiln_bf16_t *dseq = dout + (size_t)b * (size_t)T * (size_t)Q;
    const bool act = lane_g * 8 < hs;

    float kf[8] = {0, 0, 0, 0, 0, 0, 0, 0}, vf[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    float dk[8] = {0, 0, 0, 0, 0, 0, 0, 0}, dv[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (act) {
        bf8_to_f32(*(const uint4 *)(seq + (size_t)jq * (size_t)W + (size_t)kcol + lane_g * 8), kf);
        bf8_to_f32(*(const uint4 *)(seq + (size_t)jq * (size_t)W + (size_t)vcol + lane_g * 8), vf);
    }
    for (int h = g * G; h < (g + 1) * G; h++) {
        const float *lse_h = lse + ((size_t)b * NH + h) * (size_t)T, *D_h = D + ((size_t)b * NH + h) * (size_t)T;
        for (int i0 = j0 / ATTN_BK * ATTN_BK; i0 < T; i0 += ATTN_BK) {
            __syncthreads(); /* the previous tile is consumed */
            load_tile<SG>(sq, seq, W, (int64_t)h * hs, i0, T, hs);
            load_tile<SG>(sdo, dseq, Q, (int64_t)h * hs, i0, T, hs);
            if (threadIdx.x < ATTN_BK) {
                const int i = i0 + threadIdx.x;
                slse[threadIdx.x] = i < T ? lse_h[i] : 0.0f;
                sD[threadIdx.x] = i < T ? D_h[i] : 0.0f;
            }
            __syncthreads();
#pragma unroll 4
            for (int ii = 0; ii < ATTN_BK; ii++) {
                const int i = i0 + ii;
                float qf[8], df[8];
                bf8_to_f32(sq[ii][lane_g], qf);
                bf8_to_f32(sdo[ii][lane_g], df);
                const float s = group_sum<SG>(dot8(qf, kf)), dp = group_sum<SG>(dot8(df, vf));
                const bool seen = jq <= i && i < T;
                const float p = seen ? expf(s * scale - slse[ii]) : 0.0f;
                const float ds = seen ? p * (dp - sD[ii]) * scale : 0.0f;
#pragma unroll
                for (int d = 0; d < 8; d++) {
                    dv[d] = fmaf(p, df[d], dv[d]);
                    dk[d] = fmaf(ds, qf[d], dk[d]);
                }
            }
        }
    }
    if (j >= T || !act) return;
    float *row = dqkv + ((size_t)b * (size_t)T + (size_t)j) * (size_t)W;
    *(float4 *)(row + kcol + lane_g * 8) = make_float4(dk[0], dk[1], dk[2], dk[3]);
    *(float4 *)(row + kcol + lane_g * 8 + 4) = make_float4(dk[4], dk[5], dk[6], dk[7]);
    *(float4 *)(row + vcol + lane_g * 8) = make_float4(dv[0], dv[1], dv[2], dv[3]);
    *(float4 *)(row + vcol + lane_g * 8 + 4) = make_float4(dv[4], dv[5], dv[6], dv[7]);
}

/* ---------------------------------------------------------------- backward: dq
 * Grid (ceil(T / R), NH, B), ATTN_NT threads, x reversed as the forward's. Block (x, h, b) owns query rows
 * t0 .. t0 + R - 1 of head h; each row's group holds q_i, dout_i, lse_i, D_i and accumulates dq_i over the key
 * tiles 0 .. (the block's last row) in order: dq_i += ds_ij k_j with ds as the dk/dv pass computes it. */
template <int HSM>
__global__ void __launch_bounds__(ATTN_NT)
attn_train_backward_dq(float *dqkv,               /* (B*T, (NH + 2 NKV) hs): dq written */
                       const kiln_bf16_t *dout,   /* (B*T, NH*hs) */
                       const kiln_bf16_t *qkv,    /* (B*T, (NH + 2 NKV) hs) */
                       const float *lse,          /* (B, NH, T) */
                       const float *D,            /* (B, NH, T) */
                       int T, int NH, int NKV, int hs, float scale) {
    kiln_pdl_wait();
    kiln_pdl_trigger();
    constexpr int SG = HSM / 8, R = ATTN_NT / SG;
    __shared__ uint4 sk[ATTN_BK][SG], sv[ATTN_BK][SG]; /* (ATTN_BK, HSM) bf16 each */
    const int b = blockIdx.z, h = blockIdx.y, g = h / (NH / NKV);
    const int t0 = (gridDim.x - 1 - blockIdx.x) * R;
    const int lane_g = threadIdx.x % SG, t = t0 + threadIdx.x / SG, tq = min(t, T - 1);
    const int64_t W = (int64_t)(NH + 2 * NKV) * hs, Q = (int64_t)NH * hs;
    const int64_t kcol = Q + (int64_t)g * hs, vcol = kcol + (int64_t)NKV * hs;
    const kiln_bf16_t *seq = qkv + (size_t)b * (size_t)T * (size_t)W;
    const size_t n = (size_t)b * (size_t)T + (size_t)tq;
    const bool act = lane_g * 8 < hs;

    float qf[8] = {0, 0, 0, 0, 0, 0, 0, 0}, df[8] = {0, 0, 0, 0, 0, 0, 0, 0}, dq[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (act) {
        bf8_to_f32(*(const uint4 *)(seq + (size_t)tq * (size_t)W + (size_t)h * hs + lane_g * 8), qf);
        bf8_to_f32(*(const uint4 *)(dout + n * (size_t)Q + (size_t)h * hs + lane_g * 8), df);
    }
    const float lse_t = lse[((size_t)b * NH + h) * (size_t)T + tq], D_t = D[((size_t)b * NH + h) * (size_t)T + tq];
    const int kend = min(t0 + R, T);
    for (int j0 = 0; j0 < kend; j0 += ATTN_BK) {
        __syncthreads();
        load_tile<SG>(sk, seq, W, kcol, j0, T, hs);
        load_tile<SG>(sv, seq, W, vcol, j0, T, hs);
        __syncthreads();
#pragma unroll 4
        for (int jj = 0; jj < ATTN_BK; jj++) {
            float kf[8], vf[8];
            bf8_to_f32(sk[jj][lane_g], kf);
            bf8_to_f32(sv[jj][lane_g], vf);
            const float s = group_sum<SG>(dot8(qf, kf)), dp = group_sum<SG>(dot8(df, vf));
            const bool seen = j0 + jj <= tq; /* and so < T */
            const float p = seen ? expf(s * scale - lse_t) : 0.0f;
            const float ds = seen ? p * (dp - D_t) * scale : 0.0f;
#pragma unroll
            for (int d = 0; d < 8; d++) dq[d] = fmaf(ds, kf[d], dq[d]);
        }
    }
    if (t >= T || !act) return;
    float *row = dqkv + n * (size_t)W + (size_t)h * hs + lane_g * 8;
    *(float4 *)row = make_float4(dq[0], dq[1], dq[2], dq[3]);
    *(float4 *)(row + 4) = make_float4(dq[4], dq[5], dq[6], dq[7]);
}

/* ---------------------------------------------------------------- launchers */

/* The shape checks both launchers share; T * (NH + 2 NKV) * HS and the grid's sizes within int. */
static kiln_status check_shape(const char *who, int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS) {
    if (B < 0 || T < 0 || NKV <= 0 || NH <= 0 || NH % NKV || B > 65535 || NH > 65535 || T > INT32_MAX / 2 ||
        (NH + 2 * NKV) > INT32_MAX / 256)
        return kiln_fail(KILN_ERR_INVALID, "%s: bad shape B %lld T %lld NH %lld NKV %lld", who, (long long)B, (long long)T,
                         (long long)NH, (long long)NKV);
    if (HS < 8 || HS > 256 || HS % 8) /* rows move in 16-byte pieces of 8 bf16, one piece per lane */
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: head size %lld is not a multiple of 8 in 8 .. 256", who, (long long)HS);
    return KILN_OK;
}

/* HSM, the power of two >= HS the kernels are laid out for (SG = HSM / 8 lanes per row). */
static int hsm_of(int64_t HS) { return HS <= 8 ? 8 : HS <= 16 ? 16 : HS <= 32 ? 32 : HS <= 64 ? 64 : HS <= 128 ? 128 : 256; }

template <int HSM>
static kiln_status forward_hs(kiln_bf16_t *out, float *lse, const kiln_bf16_t *qkv, int B, int T, int NH, int NKV, int hs,
                              cudaStream_t s) {
    constexpr int R = ATTN_NT / (HSM / 8);
    const dim3 grid((unsigned)((T + R - 1) / R), (unsigned)NH, (unsigned)B);
    const float scale = 1.0f / sqrtf((float)hs); /* the CPU's float scale */
    return checked("attention_forward (train)",
                   kiln_launch(attn_train_forward<HSM>, grid, dim3(ATTN_NT), 0, s, out, lse, qkv, T, NH, NKV, hs, scale));
}

template <int HSM>
static kiln_status backward_hs(float *dqkv, const kiln_bf16_t *dout, const kiln_bf16_t *qkv, const float *lse, const float *D,
                               int B, int T, int NH, int NKV, int hs, cudaStream_t s) {
    constexpr int R = ATTN_NT / (HSM / 8);
    const unsigned tiles = (unsigned)((T + R - 1) / R);
    const float scale = 1.0f / sqrtf((float)hs);
    kiln_status st = checked("attention_backward dk/dv", kiln_launch(attn_train_backward_dkdv<HSM>, dim3(tiles, (unsigned)NKV, (unsigned)B),
                                                                     dim3(ATTN_NT), 0, s, dqkv, dout, qkv, lse, D, T, NH, NKV, hs, scale));
    if (st != KILN_OK) return st;
    return checked("attention_backward dq", kiln_launch(attn_train_backward_dq<HSM>, dim3(tiles, (unsigned)NH, (unsigned)B),
                                                        dim3(ATTN_NT), 0, s, dqkv, dout, qkv, lse, D, T, NH, NKV, hs, scale));
}

extern "C" kiln_status kiln_cuda_attention_forward_train(kiln_bf16_t *out, float *lse, const kiln_bf16_t *qkv, int64_t B, int64_t T,
                                                   int64_t NH, int64_t NKV, int64_t HS, void *stream) {
    const char *who = "cuda attention_forward (train)";
    kiln_status st = check_shape(who, B, T, NH, NKV, HS);
    if (st != KILN_OK) return st;
    if (B == 0 || T == 0) return KILN_OK;
    if (!out || !lse || !qkv || !aligned16(out) || !aligned16(qkv))
        return kiln_fail(KILN_ERR_INVALID, "%s: out, lse or qkv NULL, or out / qkv not 16-byte aligned", who);
    const int Bi = (int)B, Ti = (int)T, NHi = (int)NH, NKVi = (int)NKV, H = (int)HS;
    cudaStream_t s = (cudaStream_t)stream;
    if (KILN_ATTN_TC_HS(HS)) return kiln_attn_tc_forward(out, lse, qkv, Bi, Ti, NHi, NKVi, H, s); /* train_attention_tc.cu */
    switch (hsm_of(HS)) {
    case 8: return forward_hs<8>(out, lse, qkv, Bi, Ti, NHi, NKVi, H, s);
    case 16: return forward_hs<16>(out, lse, qkv, Bi, Ti, NHi, NKVi, H, s);
    case 32: return forward_hs<32>(out, lse, qkv, Bi, Ti, NHi, NKVi, H, s);
    case 64: return forward_hs<64>(out, lse, qkv, Bi, Ti, NHi, NKVi, H, s);
    case 128: return forward_hs<128>(out, lse, qkv, Bi, Ti, NHi, NKVi, H, s);
    default: return forward_hs<256>(out, lse, qkv, Bi, Ti, NHi, NKVi, H, s);
    }
}

/* ws holds D (B, NH, T) f32. */
extern "C" size_t kiln_cuda_attention_backward_ws_bytes(int64_t B, int64_t T, int64_t NH) {
    if (B <= 0 || T <= 0 || NH <= 0) return 0;
    return ((size_t)B * (size_t)NH * (size_t)T * sizeof(float) + 255) / 256 * 256;
}

extern "C" kiln_status kiln_cuda_attention_backward(float *dqkv, const kiln_bf16_t *dout, const kiln_bf16_t *qkv,
                                                    const kiln_bf16_t *out, const float *lse, int64_t B, int64_t T,
                                                    int64_t NH, int64_t NKV, int64_t HS, bool deterministic, void *ws,
                                                    void *stream) {
    const char *who = "cuda attention_backward";
    kiln_status st = check_shape(who, B, T, NH, NKV, HS);
    if (st != KILN_OK) return st;
    if (B == 0 || T == 0) return KILN_OK;
    if (!dqkv || !dout || !qkv || !out || !lse || !ws)
        return kiln_fail(KILN_ERR_INVALID, "%s: a NULL pointer (ws: kiln_cuda_attention_backward_ws_bytes)", who);
    if (!aligned16(dqkv) || !aligned16(dout) || !aligned16(qkv) || !aligned16(out))
        return kiln_fail(KILN_ERR_INVALID, "%s: dqkv, dout, qkv and out must be 16-byte aligned", who);
    const int Bi = (int)B, Ti = (int)T, NHi = (int)NH, NKVi = (int)NKV, H = (int)HS;
    cudaStream_t s = (cudaStream_t)stream;
    float *D = (float *)ws;
    const int64_t rows = B * T * NH, rows_per_block = ATTN_NT / 8;
    const int64_t blocks = (rows + rows_per_block - 1) / rows_per_block;
    if (blocks > INT32_MAX) return kiln_fail(KILN_ERR_INVALID, "%s: %lld rows is too many for one launch", who, (long long)rows);
    const bool atomic_dq = KILN_ATTN_TC_HS(HS) && !deterministic; /* the CUDA-core path is always deterministic */
    st = checked("attention_backward D", kiln_launch(attn_train_rowdot, dim3((unsigned)blocks), dim3(ATTN_NT), 0, s, D,
                                                     atomic_dq ? dqkv : (float *)NULL, dout, out, rows, Ti, NHi, H,
                                                     (NH + 2 * NKV) * HS));
    if (st != KILN_OK) return st;
    if (KILN_ATTN_TC_HS(HS)) return kiln_attn_tc_backward(dqkv, dout, qkv, lse, D, Bi, Ti, NHi, NKVi, H, deterministic, s);
    switch (hsm_of(HS)) {
    case 8: return backward_hs<8>(dqkv, dout, qkv, lse, D, Bi, Ti, NHi, NKVi, H, s);
    case 16: return backward_hs<16>(dqkv, dout, qkv, lse, D, Bi, Ti, NHi, NKVi, H, s);
    case 32: return backward_hs<32>(dqkv, dout, qkv, lse, D, Bi, Ti, NHi, NKVi, H, s);
    case 64: return backward_hs<64>(dqkv, dout, qkv, lse, D, Bi, Ti, NHi, NKVi, H, s);
    case 128: return backward_hs<128>(dqkv, dout, qkv, lse, D, Bi, Ti, NHi, NKVi, H, s);
    default: return backward_hs<256>(dqkv, dout, qkv, lse, D, Bi, Ti, NHi, NKVi, H, s);
    }
}
