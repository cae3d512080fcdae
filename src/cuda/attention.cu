/* attention.cu: causal GQA attention over the f16 KV cache (kernels.h's contract), in fp32 from exact f16 k, v.
 *
 * Decode (T <= ATTN_DECODE_MAX_T): flash-decoding. The keys are cut at fixed positions into splits of `chunk`
 * keys (64, more past 16384 positions so there are at most 256), chosen from max_pos alone, so the grid is the
 * same at every position and a captured graph replays anywhere. Block (KV head g, batch of up to 8 of its query
 * heads; split; token) reads each of its K and V rows once (16-byte loads, a group of SG lanes per row) for all
 * the query heads it serves, and writes the split's max m, sum l of exp(s - m) and unnormalized output o into ws.
 * Blocks whose split lies outside the query's keys max(0, p - window + 1) .. p exit at once. attn_decode_combine
 * then merges the live splits of each (token, head) (FlashAttention's rescaling by exp(m_s - M)).
 *
 * Prefill (larger T): a flash-attention kernel on CUDA cores. A block takes QPB consecutive (token, head) rows of
 * one KV group (so K/V tiles are shared by the group's query heads), each row owned by TPQ lanes holding 16 (or 8)
 * dims of q and of the output accumulator; key tiles of BK = 32 rows are staged in shared memory as f16, scores are
 * reduced across the TPQ lanes by shuffles, and the online softmax rescales once per tile. The T x T scores are
 * never formed.
 *
 * Head sizes: every multiple of 8 from 8 to 256 (rows move in 16-byte pieces of 8 f16); others return
 * KILN_ERR_UNSUPPORTED. 8, 16, .., 64, 80, 96, 128, 256 have kernels compiled for that size (the large ones are the
 * real models', the small ones kiln's test models': stories260K and the arch fixtures have HS 8); the rest (72, 88,
 * .., 248) share two kernels that take the head size at run time, laid out for 128 or 256.
 *
 * Positions come only from *d_pos0 (read on the device). A query at p >= max_pos (or p < 0) breaks the contract:
 * its output is NaN rather than a silently wrong number. tests/test_cuda_attention.c checks both paths against
 * the CPU oracle (kiln_cpu_ops.attention_window_forward) and a double reference, and replays one launch at two
 * positions. */
#include "cuda/kernels.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

extern "C" kiln_status kiln_fail(kiln_status s, const char *fmt, ...);

#define ATTN_THREADS 128
#define ATTN_DECODE_MAX_T 8 /* up to this many tokens take the split-K path, one grid slice per token */
#define ATTN_GB 8           /* query heads of one KV head served per decode block (more: several blocks) */
#define ATTN_CHUNK_MIN 64   /* keys per split: 4096 positions x 8 KV heads give 512 blocks for 132 SMs */
#define ATTN_CHUNK_MAX 512  /* bounds the decode block's score buffer (8 heads x 512 x 4 B = 16 KiB) */
#define ATTN_MAX_SPLITS 256 /* chunk grows past 64 keys to keep the splits (and the combine's loop) this few */
#define ATTN_BK 32          /* keys per prefill tile */

/* ---------------------------------------------------------------- helpers */

/* Keys per decode split for a context of max_pos: the power of two >= max_pos / 256, within [64, 512]. */
static int64_t decode_chunk(int64_t max_pos) {
    int64_t c = ATTN_CHUNK_MIN;
    while (c < ATTN_CHUNK_MAX && c * ATTN_MAX_SPLITS < max_pos) c *= 2;
    return c;
}

static int64_t decode_splits(int64_t max_pos) {
    const int64_t c = decode_chunk(max_pos);
    return (max_pos + c - 1) / c;
}

/* The smallest power of two >= n. */
static __host__ __device__ constexpr int pow2_at_least(int n) {
    int p = 1;
    while (p < n) p *= 2;
    return p;
}

/* Kernel shapes of a head size. The kernels are templates on (HSM, EXACT): EXACT, HSM is the head size and every
 * index is a constant (the fast path: 8, 16, .., 56, 64, 80, 96, 128, 256); otherwise the head size hs is a run-time
 * multiple of 8 <= HSM (HSM 128 or 256: 72, 88, .., 248) and the lanes are laid out for HSM.
 *   decode: lanes per K/V row, one per 16-byte piece (8 f16), a power of two (1 at HS 8, 32 at HS 256).
 *   prefill: dims per lane, 16 when that divides the head size, else 8; lanes per query row, a power of two. */
static __host__ __device__ constexpr int decode_group(int hsm) { return pow2_at_least(hsm / 8); }
static __host__ __device__ constexpr int prefill_dims(int hsm, bool exact) { return exact && hsm % 16 == 0 ? 16 : 8; }
static __host__ __device__ constexpr int prefill_lanes(int hsm, bool exact) {
    return pow2_at_least(hsm / prefill_dims(hsm, exact));
}

/* 8 f16 (one 16-byte load) to float. */
static __device__ __forceinline__ void h8_to_f32(uint4 u, float *f) {
    const __half2 *h = (const __half2 *)&u;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 x = __half22float2(h[i]);
        f[2 * i] = x.x, f[2 * i + 1] = x.y;
    }
}

/* The first key position a query at p sees. */
static __device__ __forceinline__ int first_key(int p, int window) { return window > 0 ? max(0, p - window + 1) : 0; }

/* ---------------------------------------------------------------- decode: split-K partials
 * Grid (NKV * ceil(G / 8), n_splits, T), ATTN_THREADS threads. Lanes form groups of SG (a power of two >= HSM / 8):
 * lane_g of a group loads bytes [16 lane_g, 16 lane_g + 16) of a K or V row, so a warp reads 32 / SG whole rows
 * per load (HS 80 and 96 leave 6 and 4 of 16 lanes idle; HS 8 has SG 1, a row per lane). R = ATTN_THREADS / SG
 * rows are in flight, 4 each per batch. Pass 1 puts the scaled scores of the split in shared memory, pass 2 takes
 * each head's max and turns the scores into exp(s - m), pass 3 sums p_j v_j per lane and adds the R workers' sums
 * through shared memory.
 *
 * ws: part_o (T, NH, n_splits, HS) unnormalized outputs, part_ml (T, NH, n_splits, 2) (m, l). */
template <int HSM, bool EXACT>
__global__ void __launch_bounds__(ATTN_THREADS)
attn_decode_split(float *part_o, float *part_ml, const float *q, const __half *k_cache, const __half *v_cache,
                  const int32_t *d_pos0, int hs, int NH, int NKV, int window, int rows, int max_pos, int chunk,
                  int n_splits, float scale) {
    const int HS = EXACT ? HSM : hs; /* a constant when EXACT */
    const int NP = HS / 8;           /* 16-byte pieces of a row */
    constexpr int SG = decode_group(HSM);
    constexpr int R = ATTN_THREADS / SG;
    constexpr int U = 4; /* rows per worker per batch: four 16-byte loads in flight per lane */
    const int G = NH / NKV, nhb = (G + ATTN_GB - 1) / ATTN_GB;
    const int g = blockIdx.x / nhb, h0 = (blockIdx.x % nhb) * ATTN_GB, gb = min(ATTN_GB, G - h0);
    const int split = blockIdx.y, t = blockIdx.z;
    const int p = d_pos0[0] + t;
    if (p < 0 || p >= max_pos) return; /* the combine writes NaN */
    const int j0 = max(first_key(p, window), split * chunk), j1 = min(p, split * chunk + chunk - 1);
    if (j0 > j1) return; /* a split this query does not see: the combine skips it */
    const int n = j1 - j0 + 1;

    extern __shared__ __align__(16) float smem[]; /* float4 reads of s_q */
    float *s_q = smem;                  /* (gb, HS) queries of this block's heads */
    float *s_s = s_q + ATTN_GB * HS;    /* (gb, chunk) scores, then exp(s - m) */
    float *s_red = s_s + ATTN_GB * chunk; /* (R, HS) the workers' output sums, one head at a time */
    __shared__ float s_m[ATTN_GB], s_l[ATTN_GB];

    const int tid = threadIdx.x, lane_g = tid % SG, w = tid / SG;
    const bool active = lane_g < NP;
    const float *qt = q + ((size_t)t * NH + (size_t)g * G + h0) * HS; /* heads h0 .. h0 + gb - 1 are contiguous */
    for (int i = tid; i < gb * HS; i += ATTN_THREADS) s_q[i] = qt[i];
    __syncthreads();

    const size_t kv_stride = (size_t)NKV * HS; /* elements between cache rows */
    const __half *kb = k_cache + (size_t)g * HS + lane_g * 8, *vb = v_cache + (size_t)g * HS + lane_g * 8;

    /* Pass 1: scores. The loop is uniform over the block (n and R are), so the full-warp shuffles are safe. */
    for (int base = 0; base < n; base += U * R) {
        float kf[U][8];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int jj = base + u * R + w;
            uint4 raw = make_uint4(0, 0, 0, 0);
            if (active && jj < n) raw = *(const uint4 *)(kb + (size_t)((j0 + jj) % rows) * kv_stride);
            h8_to_f32(raw, kf[u]);
        }
#pragma unroll
        for (int hh = 0; hh < ATTN_GB; hh++) {
            if (hh >= gb) break; /* uniform */
            float qf[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            if (active) {
                const float4 a = *(const float4 *)(s_q + hh * HS + lane_g * 8), b = *(const float4 *)(s_q + hh * HS + lane_g * 8 + 4);
                qf[0] = a.x, qf[1] = a.y, qf[2] = a.z, qf[3] = a.w, qf[4] = b.x, qf[5] = b.y, qf[6] = b.z, qf[7] = b.w;
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                float dot = 0.0f;
#pragma unroll
                for (int i = 0; i < 8; i++) dot = fmaf(qf[i], kf[u][i], dot);
#pragma unroll
                for (int off = SG / 2; off > 0; off /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, off);
                const int jj = base + u * R + w;
                if (lane_g == 0 && jj < n) s_s[hh * chunk + jj] = dot * scale;
            }
        }
    }
    __syncthreads();

    /* Pass 2: per head, m = max s and s <- exp(s - m), l = sum; warp wi takes heads wi, wi + 4. */
    const int warp = tid / 32, lane = tid % 32;
    for (int hh = warp; hh < gb; hh += ATTN_THREADS / 32) {
        float *s = s_s + hh * chunk;
        float m = -INFINITY;
        for (int j = lane; j < n; j += 32) m = fmaxf(m, s[j]);
        for (int off = 16; off > 0; off /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
        float l = 0.0f;
        for (int j = lane; j < n; j += 32) l += (s[j] = expf(s[j] - m));
        for (int off = 16; off > 0; off /= 2) l += __shfl_xor_sync(0xffffffffu, l, off);
        if (lane == 0) s_m[hh] = m, s_l[hh] = l;
    }
    __syncthreads();

    /* Pass 3: acc[hh] = sum_j p_j v_j over this worker's rows, 8 dims per lane. */
    float acc[ATTN_GB][8];
#pragma unroll
    for (int hh = 0; hh < ATTN_GB; hh++)
#pragma unroll
        for (int i = 0; i < 8; i++) acc[hh][i] = 0.0f;
    for (int base = 0; base < n; base += U * R) {
        float vf[U][8];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int jj = base + u * R + w;
            uint4 raw = make_uint4(0, 0, 0, 0);
            if (active && jj < n) raw = *(const uint4 *)(vb + (size_t)((j0 + jj) % rows) * kv_stride);
            h8_to_f32(raw, vf[u]);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int jj = base + u * R + w;
            if (jj >= n) break;
#pragma unroll
            for (int hh = 0; hh < ATTN_GB; hh++) {
                if (hh >= gb) break;
                const float pj = s_s[hh * chunk + jj];
#pragma unroll
                for (int i = 0; i < 8; i++) acc[hh][i] = fmaf(pj, vf[u][i], acc[hh][i]);
            }
        }
    }

    /* The R workers' sums, one head at a time through s_red, in worker order (deterministic). */
    const size_t part0 = ((size_t)t * NH + (size_t)g * G + h0) * n_splits + split; /* head hh at + hh * n_splits */
#pragma unroll
    for (int hh = 0; hh < ATTN_GB; hh++) {
        if (hh >= gb) break; /* uniform: the barriers below are reached by all threads */
        if (active)
#pragma unroll
            for (int i = 0; i < 8; i++) s_red[w * HS + lane_g * 8 + i] = acc[hh][i];
        __syncthreads();
        float *o = part_o + (part0 + (size_t)hh * n_splits) * HS;
        for (int d = tid; d < HS; d += ATTN_THREADS) {
            float sum = 0.0f;
#pragma unroll
            for (int r = 0; r < R; r++) sum += s_red[r * HS + d];
            o[d] = sum;
        }
        if (tid == 0) {
            part_ml[2 * (part0 + (size_t)hh * n_splits)] = s_m[hh];
            part_ml[2 * (part0 + (size_t)hh * n_splits) + 1] = s_l[hh];
        }
        __syncthreads();
    }
}

/* Grid (NH, T), ATTN_THREADS threads: out = sum_s o_s e^(m_s - M) / sum_s l_s e^(m_s - M) over the live splits
 * lo / chunk .. p / chunk (each holds at least one key, so l_s >= 1 and m_s is finite). */
__global__ void __launch_bounds__(ATTN_THREADS)
attn_decode_combine(float *out, const float *part_o, const float *part_ml, const int32_t *d_pos0, int NH, int HS,
                    int window, int max_pos, int chunk, int n_splits) {
    const int h = blockIdx.x, t = blockIdx.y;
    const int p = d_pos0[0] + t;
    float *o = out + ((size_t)t * NH + h) * HS;
    if (p < 0 || p >= max_pos) {
        for (int d = threadIdx.x; d < HS; d += blockDim.x) o[d] = __int_as_float(0x7fc00000); /* NaN */
        return;
    }
    const int s_lo = first_key(p, window) / chunk, s_hi = p / chunk;
    const size_t base = ((size_t)t * NH + h) * n_splits;
    float M = -INFINITY;
    for (int s = s_lo; s <= s_hi; s++) M = fmaxf(M, part_ml[2 * (base + s)]);
    float L = 0.0f;
    for (int s = s_lo; s <= s_hi; s++) L += part_ml[2 * (base + s) + 1] * expf(part_ml[2 * (base + s)] - M);
    const float inv = 1.0f / L;
    for (int d = threadIdx.x; d < HS; d += blockDim.x) {
        float a = 0.0f;
        for (int s = s_lo; s <= s_hi; s++) a += part_o[(base + s) * HS + d] * expf(part_ml[2 * (base + s)] - M);
        o[d] = a * inv;
    }
}

/* ---------------------------------------------------------------- prefill: flash attention
 * Grid (ceil(T * G / QPB), NKV), ATTN_THREADS threads. Row f = t * G + hh of KV group g is query head g * G + hh
 * of token t; TPQ lanes (a power of two >= HSM / D) own one row, lane `sub` dims [D sub, D sub + D), D = 16 dims
 * per lane when it divides the head size, else 8 (HS 8, 24, 40, 56 and the run-time head sizes). The block's
 * keys are the union of its rows' ranges, lo(first token) .. p(last token); each row masks the keys outside its
 * own range with -inf. Every row in that range is a real cache row: the ring holds window + T - 1 rows. */
template <int HSM, bool EXACT>
__global__ void __launch_bounds__(ATTN_THREADS)
attn_prefill(float *out, const float *q, const __half *k_cache, const __half *v_cache, const int32_t *d_pos0, int hs,
             int T, int NH, int NKV, int window, int rows, int max_pos, float scale) {
    const int HS = EXACT ? HSM : hs; /* a constant when EXACT */
    constexpr int D = prefill_dims(HSM, EXACT), TPQ = prefill_lanes(HSM, EXACT), QPB = ATTN_THREADS / TPQ;
    const int NSUB = HS / D, NP = HS / 8; /* lanes with dims, 16-byte pieces of a row */
    __shared__ __align__(16) __half sk[ATTN_BK * HSM], sv[ATTN_BK * HSM]; /* (BK, HS) each: 16 KiB each at HS 256 */

    const int G = NH / NKV, g = blockIdx.y, nrows = T * G;
    const int tid = threadIdx.x, r = tid / TPQ, sub = tid % TPQ;
    const int f0 = blockIdx.x * QPB, f = f0 + r;
    const bool row_ok = f < nrows, sub_ok = sub < NSUB;
    const int fr = row_ok ? f : nrows - 1; /* a tail row computes with the last row's range and writes nothing */
    const int t = fr / G, h = g * G + fr % G;
    const int p0 = d_pos0[0], p = p0 + t, lo = first_key(p, window);
    const int key_lo = first_key(p0 + f0 / G, window), key_hi = p0 + (min(f0 + QPB, nrows) - 1) / G;
    float *o = out + ((size_t)t * NH + h) * HS + sub * D;
    if (p0 < 0) { /* keys at negative positions do not exist: NaN, as for p >= max_pos */
        if (row_ok && sub_ok)
            for (int i = 0; i < D; i++) o[i] = __int_as_float(0x7fc00000);
        return;
    }

    float qr[D], acc[D];
    const float *qt = q + ((size_t)t * NH + h) * HS + sub * D;
#pragma unroll
    for (int i = 0; i < D; i++) qr[i] = sub_ok && row_ok ? qt[i] : 0.0f, acc[i] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    const size_t kv_stride = (size_t)NKV * HS;
    const __half *kg = k_cache + (size_t)g * HS, *vg = v_cache + (size_t)g * HS;

    for (int tile = key_lo; tile <= key_hi; tile += ATTN_BK) {
        const int nk = min(ATTN_BK, key_hi - tile + 1);
        __syncthreads(); /* the previous tile is consumed */
        for (int i = tid; i < ATTN_BK * NP; i += ATTN_THREADS) {
            const int jj = i / NP, piece = i % NP;
            uint4 kr = make_uint4(0, 0, 0, 0), vr = make_uint4(0, 0, 0, 0);
            if (jj < nk) {
                const size_t off = (size_t)((tile + jj) % rows) * kv_stride + piece * 8;
                kr = *(const uint4 *)(kg + off);
                vr = *(const uint4 *)(vg + off);
            }
            *(uint4 *)(sk + jj * HS + piece * 8) = kr;
            *(uint4 *)(sv + jj * HS + piece * 8) = vr;
        }
        __syncthreads();

        float s[ATTN_BK];
        float mt = -INFINITY;
#pragma unroll
        for (int jj = 0; jj < ATTN_BK; jj++) {
            float dot = 0.0f;
            if (sub_ok) {
                float kf[D];
#pragma unroll
                for (int c = 0; c < D / 8; c++) h8_to_f32(*(const uint4 *)(sk + jj * HS + sub * D + 8 * c), kf + 8 * c);
#pragma unroll
                for (int i = 0; i < D; i++) dot = fmaf(qr[i], kf[i], dot);
            }
#pragma unroll
            for (int off = TPQ / 2; off > 0; off /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, off);
            const int j = tile + jj;
            s[jj] = j >= lo && j <= p ? dot * scale : -INFINITY; /* j > key_hi >= p for the zero-filled tail */
            mt = fmaxf(mt, s[jj]);
        }
        const float m_new = fmaxf(m, mt);
        if (m_new == -INFINITY) continue; /* no key of this row in the tile */
        const float fac = expf(m - m_new); /* 0 on the row's first tile (m = -inf) */
        l *= fac;
#pragma unroll
        for (int i = 0; i < D; i++) acc[i] *= fac;
#pragma unroll
        for (int jj = 0; jj < ATTN_BK; jj++) {
            const float pj = expf(s[jj] - m_new);
            l += pj;
            if (sub_ok) {
                float vf[D];
#pragma unroll
                for (int c = 0; c < D / 8; c++) h8_to_f32(*(const uint4 *)(sv + jj * HS + sub * D + 8 * c), vf + 8 * c);
#pragma unroll
                for (int i = 0; i < D; i++) acc[i] = fmaf(pj, vf[i], acc[i]);
            }
        }
        m = m_new;
    }
    if (row_ok && sub_ok) {
        const float inv = p < max_pos ? 1.0f / l : __int_as_float(0x7fc00000);
#pragma unroll
        for (int i = 0; i < D; i++) o[i] = acc[i] * inv;
    }
}

/* ---------------------------------------------------------------- launchers */

static kiln_status launch_error(const char *what) {
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? KILN_OK : kiln_fail(KILN_ERR_IO, "cuda attention: %s launch failed: %s", what, cudaGetErrorString(e));
}

/* Workspace for the decode path's partials, enough for any launch of at most T tokens (a larger T runs the prefill
 * kernel, which needs none, but a later decode step of the same engine does). */
extern "C" size_t kiln_cuda_attention_ws_bytes(int64_t T, int64_t NH, int64_t HS, int64_t max_pos) {
    if (T <= 0 || NH <= 0 || HS <= 0 || max_pos <= 0 || max_pos > INT32_MAX || NH > INT32_MAX || HS > 256) return 0;
    const int64_t Td = T < ATTN_DECODE_MAX_T ? T : ATTN_DECODE_MAX_T;
    return (size_t)Td * (size_t)NH * (size_t)decode_splits(max_pos) * (size_t)(HS + 2) * sizeof(float);
}

template <int HSM, bool EXACT>
static kiln_status attention_hs(float *out, const float *q, const __half *k, const __half *v, const int32_t *d_pos0,
                                int HS, int T, int NH, int NKV, int window, int rows, int max_pos, float scale, void *ws,
                                cudaStream_t s) {
    const int G = NH / NKV;
    if (T <= ATTN_DECODE_MAX_T) {
        const int chunk = (int)decode_chunk(max_pos), n_splits = (int)decode_splits(max_pos);
        float *part_o = (float *)ws, *part_ml = part_o + (size_t)T * NH * n_splits * HS;
        const int nhb = (G + ATTN_GB - 1) / ATTN_GB;
        const dim3 grid((unsigned)(NKV * nhb), (unsigned)n_splits, (unsigned)T);
        /* s_q (8, HS), s_s (8, chunk), s_red (R, HS): 28 KiB at HS 256 and chunk 512, 20 KiB at HS 8 (R = 128) */
        const size_t shm = sizeof(float) * ((size_t)ATTN_GB * HS + (size_t)ATTN_GB * chunk +
                                            (size_t)(ATTN_THREADS / decode_group(HSM)) * HS);
        attn_decode_split<HSM, EXACT><<<grid, ATTN_THREADS, shm, s>>>(part_o, part_ml, q, k, v, d_pos0, HS, NH, NKV,
                                                                      window, rows, max_pos, chunk, n_splits, scale);
        kiln_status st = launch_error("decode split");
        if (st != KILN_OK) return st;
        attn_decode_combine<<<dim3((unsigned)NH, (unsigned)T), ATTN_THREADS, 0, s>>>(out, part_o, part_ml, d_pos0, NH, HS,
                                                                                    window, max_pos, chunk, n_splits);
        return launch_error("decode combine");
    }
    constexpr int QPB = ATTN_THREADS / prefill_lanes(HSM, EXACT);
    const int64_t blocks = ((int64_t)T * G + QPB - 1) / QPB;
    attn_prefill<HSM, EXACT><<<dim3((unsigned)blocks, (unsigned)NKV), ATTN_THREADS, 0, s>>>(out, q, k, v, d_pos0, HS, T, NH,
                                                                                           NKV, window, rows, max_pos, scale);
    return launch_error("prefill");
}

extern "C" kiln_status kiln_cuda_attention(float *out, const float *q, const uint16_t *k_cache, const uint16_t *v_cache,
                                           const int32_t *d_pos0, int64_t T, int64_t NH, int64_t NKV, int64_t HS,
                                           int64_t window, int64_t rows, int64_t max_pos, float scale, void *ws,
                                           void *stream) {
    if (!out || !q || !k_cache || !v_cache || !d_pos0)
        return kiln_fail(KILN_ERR_INVALID, "cuda attention: a NULL pointer");
    if (T <= 0 || NH <= 0 || NKV <= 0 || NH % NKV || window < 0 || rows <= 0 || max_pos < T || max_pos > INT32_MAX ||
        rows > INT32_MAX || window > INT32_MAX || T * NH > INT32_MAX)
        return kiln_fail(KILN_ERR_INVALID, "cuda attention: bad shape T %lld NH %lld NKV %lld window %lld rows %lld max_pos %lld",
                         (long long)T, (long long)NH, (long long)NKV, (long long)window, (long long)rows, (long long)max_pos);
    if (rows < max_pos && (window == 0 || rows < window + T - 1))
        return kiln_fail(KILN_ERR_INVALID, "cuda attention: %lld cache rows hold neither the context (%lld) nor window %lld + %lld tokens",
                         (long long)rows, (long long)max_pos, (long long)window, (long long)T);
    if (T <= ATTN_DECODE_MAX_T && !ws)
        return kiln_fail(KILN_ERR_INVALID, "cuda attention: decode needs a workspace of kiln_cuda_attention_ws_bytes");
    if (decode_splits(max_pos) > 65535)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "cuda attention: a context of %lld positions is too long", (long long)max_pos);
    const __half *k = (const __half *)k_cache, *v = (const __half *)v_cache;
    const int Ti = (int)T, NHi = (int)NH, NKVi = (int)NKV, Wi = (int)window, Ri = (int)rows, Mi = (int)max_pos;
    cudaStream_t s = (cudaStream_t)stream;
    if (HS < 8 || HS > 256 || HS % 8) /* the kernels load rows in 16-byte pieces */
        return kiln_fail(KILN_ERR_UNSUPPORTED, "cuda attention: head size %lld is not a multiple of 8 in 8 .. 256", (long long)HS);
    const int H = (int)HS;
#define ATTN_ARGS out, q, k, v, d_pos0, H, Ti, NHi, NKVi, Wi, Ri, Mi, scale, ws, s
    switch (H) {
    case 8: return attention_hs<8, true>(ATTN_ARGS);
    case 16: return attention_hs<16, true>(ATTN_ARGS);
    case 24: return attention_hs<24, true>(ATTN_ARGS);
    case 32: return attention_hs<32, true>(ATTN_ARGS);
    case 40: return attention_hs<40, true>(ATTN_ARGS);
    case 48: return attention_hs<48, true>(ATTN_ARGS);
    case 56: return attention_hs<56, true>(ATTN_ARGS);
    case 64: return attention_hs<64, true>(ATTN_ARGS);
    case 80: return attention_hs<80, true>(ATTN_ARGS);
    case 96: return attention_hs<96, true>(ATTN_ARGS);
    case 128: return attention_hs<128, true>(ATTN_ARGS);
    case 256: return attention_hs<256, true>(ATTN_ARGS);
    default: return H < 128 ? attention_hs<128, false>(ATTN_ARGS) : attention_hs<256, false>(ATTN_ARGS);
    }
#undef ATTN_ARGS
}
