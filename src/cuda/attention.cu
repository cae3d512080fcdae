/* attention.cu: causal GQA attention over the KV cache (kernels.h's contract), in fp32 from exactly widened k, v.
 *
 * Decode (T <= ATTN_DECODE_MAX_T): flash-decoding in one kernel. The grid is fixed by max_pos alone (at most
 * ATTN_MAX_SPLITS splits per query), so a captured graph replays anywhere; each query's keys max(0, p - window + 1)
 * .. p are cut on the device into splits of >= ATTN_KEYS_MIN keys. Block (KV head g, batch of its query heads;
 * split; token) reads each of its K and V rows (16-byte loads, a group of SG lanes per row) once for the query heads
 * it serves, in one pass with an online softmax. A batch is one head (ATTN_GB): a group's heads read the same rows
 * from L2 in blocks of their own, which run side by side, where batches of 4 or 8 made a few long blocks. A query
 * with one live split (any context up to 64 keys) is finished by that block; otherwise each split writes (m, l, o)
 * into ws and the last one to finish, found by an atomic counter in ws, merges them (FlashAttention's rescaling by
 * exp(m_s - M)) and zeroes the counter again.
 * So ws MUST BE ZERO-FILLED ONCE before the first decode launch (cudaMemset); every launch leaves it so.
 * kiln_cuda_attention_xp also writes out's prepared form for the wo matvec from the block that writes out.
 * kiln_cuda_attention_post also does qkv_post's work for its rows (biases, QK-norm, RoPE, the store of the row's k and v)
 * inside the blocks, before they read the cache: post_prologue says how.
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
 * Cache types (-ctk/-ctv): the kernels are templates on ANY. ANY false is the f16 pair, exactly the kernels as they
 * were (rows loaded as raw 16-byte pieces and widened from f16). ANY true takes the two types as run-time arguments
 * and converts each 8-element piece to float as it loads it (kv.cuh: f32, bf16, q8_0 and q4_0 blocks, f16 for a
 * mixed pair), so 25 pairs cost one more set of kernels, compiled for the run-time head sizes only (laid out for
 * 128 or 256); its prefill stages float tiles of ATTN_BK_ANY keys (32 KiB of shared memory at HS 256).
 *
 * Positions come only from *d_pos0 (read on the device). A query at p >= max_pos (or p < 0) breaks the contract:
 * its output is NaN rather than a silently wrong number. Every kernel follows launch.h's PDL contract.
 * tests/test_cuda_attention.c checks both paths against the CPU oracle (kiln_cpu_ops.attention_window_forward) and
 * a double reference, replays one launch at several positions (the counters back at zero after each), and checks
 * attention_xp's xp byte for byte against kiln_cuda_matvec_prepare. */
#include "cuda/attention_tc.h"
#include "cuda/kernels.h"
#include "cuda/launch.h"
#include "cuda/kv.cuh"
#include "cuda/norm.cuh"
#include "cuda/q8.cuh"
#include "cuda/rope.cuh"

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <type_traits>

#include "status.h"

#define ATTN_THREADS 128
#define ATTN_DECODE_MAX_T 8 /* up to this many tokens take the split-K path, one grid slice per token */
#define ATTN_ROWS_MAX 1024  /* decode rows of many sequences per launch at most (kiln_cuda_attention_rows) */
#define ATTN_GB 1           /* query heads of one KV head served per decode block at most (1, 4 or 8): one, because
                             * more blocks beat fewer reads of each row (+13% tok/s at 1.1B, run42) */
#define ATTN_POST_G 8       /* query heads a KV head at most in kiln_cuda_attention_post */
#define ATTN_KEYS_MIN 64    /* keys per decode split at least: 2 batches of K+V loads at HS 128 */
#define ATTN_MAX_SPLITS 32  /* splits per query at most: 4096 positions x 32 query heads give 1,024 blocks of 128
                               keys, and the merging block reads 32 partials per output */
#define ATTN_BK 32          /* keys per prefill tile */
#define ATTN_BK_ANY 16      /* keys per prefill tile of float rows (ANY): the same shared memory as f16 tiles of 32 */

/* ---------------------------------------------------------------- helpers */

/* Decode switches for measuring, read once: KILN_ATTN_KEYS_MIN (keys per split at least, 8 .. 1024, default
 * ATTN_KEYS_MIN; a split's keys are rounded up to 32, so below 32 it only adds blocks that exit at once) and KILN_ATTN_GB (query heads per block at most: 1, the default, or 4 or 8, the batches that read
 * each K and V row once for up to that many of a group's query heads). */
struct attn_tuning {
    int keys_min, gb;
};

static attn_tuning attn_tune_read(void) {
    attn_tuning t = {ATTN_KEYS_MIN, ATTN_GB};
    const char *k = getenv("KILN_ATTN_KEYS_MIN"), *g = getenv("KILN_ATTN_GB");
    const long kv = k ? strtol(k, NULL, 10) : 0, gv = g ? strtol(g, NULL, 10) : 0;
    if (kv >= 8 && kv <= 1024) t.keys_min = (int)kv;
    if (gv == 1 || gv == 4 || gv == 8) t.gb = (int)gv;
    return t;
}

static attn_tuning attn_tune(void) {
    static const attn_tuning t = attn_tune_read(); /* initialized once, thread-safe */
    return t;
}

/* The decode grid's splits for a context of max_pos (the device sizes each query's splits from its own keys). */
static int64_t decode_splits(int64_t max_pos) {
    const int64_t km = attn_tune().keys_min;
    const int64_t n = (max_pos + km - 1) / km;
    return n < ATTN_MAX_SPLITS ? n : ATTN_MAX_SPLITS;
}

/* Bytes of the decode counters at the start of ws: one per (row, block of query heads) <= ATTN_ROWS_MAX * NH,
 * padded to 256 so the partials after them stay aligned. */
static size_t decode_counter_bytes(int64_t NH) { return ((size_t)ATTN_ROWS_MAX * (size_t)NH * 4 + 255) / 256 * 256; }

/* Where a launch's queries sit: one sequence's T tokens at *pos + t (seq NULL), or T rows of many sequences, row t
 * at pos[t] over the caches at k_cache and v_cache + seq[t] * stride bytes (kiln_cuda_attention_rows). */
struct attn_where {
    const int32_t *pos, *seq;
    size_t stride;
};

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

/* 8 elements of a cache row: the f16 pair's raw 16 bytes (ANY false, widened when used, as the kernels always did)
 * or any type's as float (ANY true, converted by kiln_kv_load8 as they load). */
template <bool ANY> struct kv_piece;
template <> struct kv_piece<false> {
    uint4 u;
    __device__ __forceinline__ void zero() { u = make_uint4(0, 0, 0, 0); }
    __device__ __forceinline__ void load(int t, const void *cache, size_t e) { u = *(const uint4 *)((const __half *)cache + e); }
    __device__ __forceinline__ void to_f32(float *f) const { h8_to_f32(u, f); }
};
template <> struct kv_piece<true> {
    float x[8];
    __device__ __forceinline__ void zero() {
#pragma unroll
        for (int i = 0; i < 8; i++) x[i] = 0.0f;
    }
    __device__ __forceinline__ void load(int t, const void *cache, size_t e) { kiln_kv_load8(t, cache, e, x); }
    __device__ __forceinline__ void to_f32(float *f) const {
#pragma unroll
        for (int i = 0; i < 8; i++) f[i] = x[i];
    }
};

/* 8 elements of a prefill tile in shared memory (f16 for the f16 pair, float for ANY) as float. */
static __device__ __forceinline__ void tile8_to_f32(const __half *p, float *f) { h8_to_f32(*(const uint4 *)p, f); }
static __device__ __forceinline__ void tile8_to_f32(const float *p, float *f) {
    const float4 a = *(const float4 *)p, b = *(const float4 *)(p + 4);
    f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
}
/* A loaded piece into a tile. */
static __device__ __forceinline__ void tile8_store(__half *p, const kv_piece<false> &k) { *(uint4 *)p = k.u; }
static __device__ __forceinline__ void tile8_store(float *p, const kv_piece<true> &k) {
    *(float4 *)p = make_float4(k.x[0], k.x[1], k.x[2], k.x[3]);
    *(float4 *)(p + 4) = make_float4(k.x[4], k.x[5], k.x[6], k.x[7]);
}

/* A score after the scale: cap tanh(s / cap) with the softcap (gemma2; inv = 1 / cap), else s as it is. CAP is a
 * template flag of both kernels so the plain path compiles exactly as without it. */
template <bool CAP> static __device__ __forceinline__ float capped(float s, float cap, float inv) {
    return CAP ? cap * tanhf(s * inv) : s;
}

/* The first key position a query at p sees. */
static __device__ __forceinline__ int first_key(int p, int window) { return window > 0 ? max(0, p - window + 1) : 0; }

/* The qkv epilogue fused into the decode kernel (kiln_cuda_attention_post): qkv_post_kernel's biases, per-head
 * QK-norm and RoPE, by value. rope false: a NoPE layer. */
struct attn_post {
    const float *k, *v;        /* (T, NKV*HS) the rows' keys and values as the qkv matmul left them */
    const float *bq, *bk, *bv; /* (NH*HS), (NKV*HS), (NKV*HS) or NULL */
    const float *qn, *kn;      /* (HS) each, or NULL: QK-norm's weights, one norm per head */
    float eps;
    float theta_scale;
    int rope_dim;
    bool neox, rope;
    kiln_cuda_rope_freq rf;
};

/* The fused epilogue of a decode block (POST): s_q holds its gb query heads from hq0 on as the matmul left them;
 * they get their biases, QK-norm and RoPE in place. The blocks whose split holds key p (store: the last live split;
 * no other block of the launch reads that row) also make KV head g's key (bias, norm, RoPE) and value (bias) of
 * row t and store them into cache row p % rows in the caches' types (kt, vt). With a batch of fewer than G heads,
 * each of g's batches stores the row, the same bytes, and reads its own store: f16, bf16 or f32 element by
 * element, q8_0 and q4_0 a block of 32 a warp (kiln_kv_quantize_warp, kv_quantize_kernel's arithmetic). The same
 * operations as qkv_post_kernel's (then kv_quantize's) in the same order (norm.cuh's sums of squares, rope.cuh),
 * so the cache bytes and the attention's output are the unfused pair's bit for bit. A warp norms a head at a time.
 * HS is the head size, at most HSM. The caller synchronizes after it: the stored row is then visible to the
 * block's own loads. */
template <int HSM>
static __device__ __forceinline__ void post_prologue(float *s_q, int gb, int hq0, int g, int t, int p, bool store, int NKV, int rows,
                                                     void *k_cache, void *v_cache, int kt, int vt, int HS, const attn_post &pp) {
    __shared__ float s_k[HSM], s_v[HSM], s_cos[HSM / 2], s_sin[HSM / 2];
    const int tid = threadIdx.x, half = pp.rope ? pp.rope_dim / 2 : 0;
    const size_t kv0 = ((size_t)t * NKV + g) * HS, b0 = (size_t)g * HS;
    if (half) kiln_rope_angles(s_cos, s_sin, half, (float)p, pp.theta_scale, pp.rf, 1.0f);
    if (store)
        for (int i = tid; i < HS; i += ATTN_THREADS) s_k[i] = pp.bk ? __fadd_rn(pp.k[kv0 + i], pp.bk[b0 + i]) : pp.k[kv0 + i];
    __syncthreads(); /* s_q as the caller staged it (other threads' float4s), the angles */
    if (pp.bq)
        for (int i = tid; i < gb * HS; i += ATTN_THREADS) s_q[i] = __fadd_rn(s_q[i], pp.bq[(size_t)hq0 * HS + i]);
    if (pp.qn || (store && pp.kn)) {
        __syncthreads(); /* the biases */
        for (int hh = tid / 32; hh <= gb; hh += ATTN_THREADS / 32) { /* hh == gb: the key */
            const float *nw = hh < gb ? pp.qn : store ? pp.kn : NULL;
            if (!nw) continue; /* warp-uniform */
            float *x = hh < gb ? s_q + hh * HS : s_k;
            const float sc = kiln_rms_scale(kiln_head_sumsq_warp(x, HS), HS, pp.eps);
            for (int i = tid % 32; i < HS; i += 32) x[i] = __fmul_rn(__fmul_rn(x[i], sc), nw[i]);
        }
        __syncthreads();
    }
    if (half) {
        __syncthreads();
        const int nh = gb + (store ? 1 : 0);
        for (int j = tid; j < nh * half; j += ATTN_THREADS) {
            const int hh = j / half, i = j - hh * half;
            kiln_rope_rotate(hh < gb ? s_q + hh * HS : s_k, i, half, pp.neox, s_cos[i], s_sin[i]);
        }
        __syncthreads();
    }
    if (!store) return;
    const size_t e0 = ((size_t)(p % rows) * NKV + g) * HS;
    if (kt == KILN_KV_F16 && vt == KILN_KV_F16) {
        for (int i = tid; i < HS; i += ATTN_THREADS) {
            ((__half *)k_cache)[e0 + i] = __float2half_rn(s_k[i]);
            ((__half *)v_cache)[e0 + i] = __float2half_rn(pp.bv ? __fadd_rn(pp.v[kv0 + i], pp.bv[b0 + i]) : pp.v[kv0 + i]);
        }
        return;
    }
    for (int i = tid; i < HS; i += ATTN_THREADS) {
        s_v[i] = pp.bv ? __fadd_rn(pp.v[kv0 + i], pp.bv[b0 + i]) : pp.v[kv0 + i];
        if (!kiln_kv_is_block(kt)) kiln_kv_store1(kt, k_cache, e0 + i, s_k[i]);
        if (!kiln_kv_is_block(vt)) kiln_kv_store1(vt, v_cache, e0 + i, s_v[i]);
    }
    if (kiln_kv_is_block(kt) || kiln_kv_is_block(vt)) {
        __syncthreads(); /* s_v whole */
        const int nb = HS / 32;                         /* blocks of the head's row; it starts at block g nb of row p % rows */
        for (int j = tid / 32; j < 2 * nb; j += ATTN_THREADS / 32) { /* a warp a block: k's, then v's */
            const int type = j < nb ? kt : vt;
            if (!kiln_kv_is_block(type)) continue; /* warp-uniform */
            const bool q8 = type == KILN_KV_Q8_0;
            const size_t bi = (size_t)(p % rows) * NKV * nb + (size_t)g * nb + (j % nb);
            kiln_kv_quantize_warp((uint8_t *)(j < nb ? k_cache : v_cache) + bi * (q8 ? KILN_KV_Q8_0_BYTES : KILN_KV_Q4_0_BYTES),
                                  (j < nb ? s_k : s_v)[(j % nb) * 32 + tid % 32], q8);
        }
    }
}

/* ---------------------------------------------------------------- decode: split-K in one kernel
 * Grid (NKV * ceil(G / GBM), n_splits, T), ATTN_THREADS threads, GBM 1 (ATTN_GB; with KILN_ATTN_GB 4 or 8, 4 for
 * G <= 4). Block (x, split, t) serves query heads h0 .. h0 + gb - 1 (gb <= GBM) of KV head g at token t. Lanes form
 * groups of SG (a power of two >= HSM / 8): lane_g of a group
 * loads bytes [16 lane_g, 16 lane_g + 16) of a K or V row, so a warp reads 32 / SG whole rows per load (HS 80 and
 * 96 leave 6 and 4 of 16 lanes idle; HS 8 has SG 1, a row per lane). The R = ATTN_THREADS / SG groups ("workers")
 * take rows w, w + R, .., U = 4 each per batch, loading the batch's K and V rows together (one memory round trip
 * per batch, 8 16-byte loads in flight per lane), and each keeps its own online softmax (m, l, acc) per head,
 * rescaled once per batch. One pass over the keys, no score buffer, so a split may be any length.
 *
 * Splits are sized on the device from the query's own key count n = p - lo + 1: chunk = max(keys_min (ATTN_KEYS_MIN
 * unless KILN_ATTN_KEYS_MIN), ceil(n / n_splits)) rounded up to 32, so short contexts take one split (no combine at all: that block writes out
 * itself) and long ones spread over all n_splits. Blocks whose split lies past the query's keys exit at once.
 *
 * With several live splits, each block writes its (m, l, o) into ws, fences, and counts itself on the (t, x)
 * counter; the block that counts last merges the live splits (FlashAttention's rescaling by exp(m_s - M), in split
 * order, exactly the math of the former separate combine kernel) and resets the counter to 0 for the next launch.
 * When xq is set (kiln_cuda_attention_xp; HS % 32 == 0 so a block of 32 never crosses a head) the writer of out
 * also writes its prepared form with matvec_prepare_kernel's arithmetic, bit for bit.
 *
 * ws: counters (ATTN_DECODE_MAX_T * NH uint32 at (t, x), padded to 256 bytes; they must be zero before the first
 * launch and every launch leaves them zero), part_o (T, NH, n_splits, HS) unnormalized outputs, part_ml (T, NH, n_splits, 2). */

/* GBM: query heads per block at most (1, 4 or 8): the accumulators are GBM x 8 registers per lane. */
template <int HSM, bool EXACT, int GBM, bool CAP, bool ANY, bool POST = false>
__global__ void __launch_bounds__(ATTN_THREADS)
attn_decode(float *out, int8_t *xq, float2 *xds, unsigned *counters, float *part_o, float *part_ml, const float *q,
            const void *k_cache, const void *v_cache, int kt, int vt, const attn_where at, int hs, int NH, int NKV,
            int window, int rows, int max_pos, int keys_min, float scale, float cap, const attn_post pp) {
    kiln_pdl_wait();
    kiln_pdl_trigger();
    const int HS = EXACT ? HSM : hs; /* a constant when EXACT */
    const float inv_cap = CAP ? 1.0f / cap : 0.0f;
    const int NP = HS / 8;           /* 16-byte pieces of a row */
    constexpr int SG = decode_group(HSM);
    constexpr int R = ATTN_THREADS / SG;
    constexpr int U = 4;                                /* rows per worker per batch */
    constexpr int QV = (GBM * HSM / 4 + ATTN_THREADS - 1) / ATTN_THREADS; /* float4s of q per thread */
    const int G = NH / NKV, nhb = (G + GBM - 1) / GBM, gbmax = min(GBM, G);
    const int g = blockIdx.x / nhb, h0 = (blockIdx.x % nhb) * GBM, gb = min(GBM, G - h0);
    const int split = blockIdx.y, n_splits = gridDim.y, t = blockIdx.z;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const size_t row0 = (size_t)t * NH + (size_t)g * G + h0; /* (token, head) row of head h0; h0 + hh at row0 + hh */

    /* q's loads go out together with d_pos0's: they do not depend on the position */
    float4 qv[QV];
    const float4 *q4 = (const float4 *)(q + row0 * HS);
#pragma unroll
    for (int k = 0; k < QV; k++) {
        const int i = tid + k * ATTN_THREADS;
        if (i < gb * HS / 4) qv[k] = q4[i];
    }
    const int p = at.seq ? at.pos[t] : at.pos[0] + t;
    if (at.seq) { /* row t's own sequence's cache */
        const size_t off = (size_t)at.seq[t] * at.stride;
        k_cache = (const char *)k_cache + off, v_cache = (const char *)v_cache + off;
    }
    float *o_blk = out + row0 * HS; /* (gb, HS): the block's heads are contiguous in out's row t */
    if (p < 0 || p >= max_pos) {    /* outside the contract: NaN, from split 0 alone */
        if (split == 0)
            for (int i = tid; i < gb * HS; i += ATTN_THREADS) {
                const float v = __int_as_float(0x7fc00000);
                o_blk[i] = v;
                if (xq) kiln_q8_store_warp(xq, xds, row0 * HS + i, v);
            }
        return;
    }
    const int lo = first_key(p, window), n_keys = p - lo + 1;
    int chunk = max(keys_min, (int)(((int64_t)n_keys + n_splits - 1) / n_splits));
    chunk = (int)(((int64_t)chunk + 31) / 32 * 32);
    const int n_live = (int)(((int64_t)n_keys + chunk - 1) / chunk); /* <= n_splits */
    if (split >= n_live) return; /* not counted: the last block waits only for the live ones */
    const int j0 = lo + split * chunk, n = min(chunk, n_keys - split * chunk);

    extern __shared__ __align__(16) float smem[]; /* float4 access to s_q */
    float *s_q = smem;                        /* (gbmax, HS) this block's queries */
    float *s_red = s_q + gbmax * HS;          /* (gbmax, R, HS) the workers' acc; later the merge's (m, l, factor) */
    float *s_wm = s_red + gbmax * R * HS;     /* (gbmax, R) the workers' m */
    float *s_wl = s_wm + gbmax * R;           /* (gbmax, R) the workers' l */
    float *s_wf = s_wl + gbmax * R;           /* (gbmax, R) exp(m_w - M) */
    __shared__ float s_M[GBM], s_L[GBM], s_inv[GBM];
    __shared__ int s_last;
#pragma unroll
    for (int k = 0; k < QV; k++) {
        const int i = tid + k * ATTN_THREADS;
        if (i < gb * HS / 4) ((float4 *)s_q)[i] = qv[k];
    }
    if constexpr (POST)
        post_prologue<HSM>(s_q, gb, g * G + h0, g, t, p, split == n_live - 1, NKV, rows, (void *)k_cache, (void *)v_cache, kt, vt,
                           HS, pp);
    __syncthreads();

    const int lane_g = tid % SG, w = tid / SG;
    const bool active = lane_g < NP;
    const size_t kv_stride = (size_t)NKV * HS; /* elements between cache rows */
    const size_t e_lane = (size_t)g * HS + lane_g * 8; /* the lane's first element in a row */
    float m[GBM], l[GBM], acc[GBM][8];
#pragma unroll
    for (int hh = 0; hh < GBM; hh++) {
        m[hh] = -INFINITY, l[hh] = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; i++) acc[hh][i] = 0.0f;
    }

    /* The loop is uniform over the block (n and R are), so the full-warp shuffles are safe. */
    for (int base = 0; base < n; base += U * R) {
        kv_piece<ANY> kr[U], vr[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int jj = base + u * R + w;
            kr[u].zero(), vr[u].zero();
            if (active && jj < n) {
                const size_t off = (size_t)((j0 + jj) % rows) * kv_stride;
                kr[u].load(kt, k_cache, e_lane + off);
                vr[u].load(vt, v_cache, e_lane + off);
            }
        }
        float kf[U][8];
#pragma unroll
        for (int u = 0; u < U; u++) kr[u].to_f32(kf[u]);
#pragma unroll
        for (int hh = 0; hh < GBM; hh++) {
            if (hh >= gb) break; /* uniform */
            float qf[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            if (active) {
                const float4 a = *(const float4 *)(s_q + hh * HS + lane_g * 8), b = *(const float4 *)(s_q + hh * HS + lane_g * 8 + 4);
                qf[0] = a.x, qf[1] = a.y, qf[2] = a.z, qf[3] = a.w, qf[4] = b.x, qf[5] = b.y, qf[6] = b.z, qf[7] = b.w;
            }
            float s[U], mx = m[hh];
#pragma unroll
            for (int u = 0; u < U; u++) {
                float dot = 0.0f;
#pragma unroll
                for (int i = 0; i < 8; i++) dot = fmaf(qf[i], kf[u][i], dot);
#pragma unroll
                for (int off = SG / 2; off > 0; off /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, off);
                s[u] = base + u * R + w < n ? capped<CAP>(dot * scale, cap, inv_cap) : -INFINITY; /* same on every lane of the group */
                mx = fmaxf(mx, s[u]);
            }
            if (mx == -INFINITY) continue; /* no row of this worker in the batch (the split's tail) */
            const float fac = expf(m[hh] - mx); /* 0 on the worker's first batch (m = -inf) */
            l[hh] *= fac;
#pragma unroll
            for (int i = 0; i < 8; i++) acc[hh][i] *= fac;
#pragma unroll
            for (int u = 0; u < U; u++) {
                const float pj = expf(s[u] - mx); /* 0 past the split's end */
                float vf[8];
                vr[u].to_f32(vf);
                l[hh] += pj;
#pragma unroll
                for (int i = 0; i < 8; i++) acc[hh][i] = fmaf(pj, vf[i], acc[hh][i]);
            }
            m[hh] = mx;
        }
    }

    /* Merge the R workers: M = max m_w, L = sum l_w e^(m_w - M), o = sum acc_w e^(m_w - M), worker order. */
#pragma unroll
    for (int hh = 0; hh < GBM; hh++) {
        if (hh >= gb) break;
        if (active)
#pragma unroll
            for (int i = 0; i < 8; i++) s_red[(hh * R + w) * HS + lane_g * 8 + i] = acc[hh][i];
        if (lane_g == 0) s_wm[hh * R + w] = m[hh], s_wl[hh * R + w] = l[hh];
    }
    __syncthreads();
    for (int hh = warp; hh < gb; hh += ATTN_THREADS / 32) { /* warp-uniform: the shuffles see all lanes */
        float M = -INFINITY;
        for (int i = lane; i < R; i += 32) M = fmaxf(M, s_wm[hh * R + i]); /* finite: worker 0 has row 0 */
#pragma unroll
        for (int off = 16; off > 0; off /= 2) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, off));
        float L = 0.0f;
        for (int i = lane; i < R; i += 32) {
            const float f = expf(s_wm[hh * R + i] - M); /* 0 for a worker without rows (m = -inf, l = acc = 0) */
            s_wf[hh * R + i] = f;
            L += s_wl[hh * R + i] * f;
        }
#pragma unroll
        for (int off = 16; off > 0; off /= 2) L += __shfl_xor_sync(0xffffffffu, L, off);
        if (lane == 0) s_M[hh] = M, s_L[hh] = L;
    }
    __syncthreads();

    if (n_live == 1) { /* the whole query in this block: out = o / l (the combine of one split, exactly) */
        for (int i = tid; i < gb * HS; i += ATTN_THREADS) {
            const int hh = i / HS, d = i - hh * HS;
            float o = 0.0f;
            for (int r = 0; r < R; r++) o += s_red[(hh * R + r) * HS + d] * s_wf[hh * R + r];
            const float v = o * (1.0f / s_L[hh]);
            o_blk[i] = v;
            if (xq) kiln_q8_store_warp(xq, xds, row0 * HS + i, v);
        }
        return;
    }

    /* This split's partial into ws; head hh's split s at (row0 + hh) * n_splits + s. */
    for (int i = tid; i < gb * HS; i += ATTN_THREADS) {
        const int hh = i / HS, d = i - hh * HS;
        float o = 0.0f;
        for (int r = 0; r < R; r++) o += s_red[(hh * R + r) * HS + d] * s_wf[hh * R + r];
        part_o[((row0 + hh) * n_splits + split) * HS + d] = o;
    }
    if (tid < gb) {
        part_ml[2 * ((row0 + tid) * n_splits + split)] = s_M[tid];
        part_ml[2 * ((row0 + tid) * n_splits + split) + 1] = s_L[tid];
    }
    /* Count this split done; the last of the n_live merges (CUDA's threadFenceReduction pattern). */
    __threadfence(); /* this thread's partials are visible device-wide before the count */
    __syncthreads();
    if (tid == 0) {
        unsigned *ctr = counters + (size_t)t * gridDim.x + blockIdx.x;
        const unsigned done = atomicAdd(ctr, 1u);
        s_last = done == (unsigned)n_live - 1;
        if (s_last) atomicExch(ctr, 0u); /* every live block has counted: ready for the next launch */
    }
    __syncthreads();
    if (!s_last) return;
    __threadfence();

    /* out = sum_s o_s e^(m_s - M) / sum_s l_s e^(m_s - M) over the live splits (each has >= 1 key, so l_s >= 1 and
     * m_s is finite). The partials are read through L2 (__ldcg): other SMs wrote them. */
    float *s_cm = s_red;                             /* (gbmax, ATTN_MAX_SPLITS) m_s: 96 gbmax floats in all, */
    float *s_cl = s_cm + gbmax * ATTN_MAX_SPLITS;    /* l_s                 within s_red's >= 512 gbmax */
    float *s_cf = s_cl + gbmax * ATTN_MAX_SPLITS;    /* e^(m_s - M) */
    for (int i = tid; i < gb * n_live; i += ATTN_THREADS) {
        const int hh = i / n_live, sp = i - hh * n_live;
        s_cm[hh * ATTN_MAX_SPLITS + sp] = __ldcg(part_ml + 2 * ((row0 + hh) * n_splits + sp));
        s_cl[hh * ATTN_MAX_SPLITS + sp] = __ldcg(part_ml + 2 * ((row0 + hh) * n_splits + sp) + 1);
    }
    __syncthreads();
    if (tid < gb) {
        const float *cm = s_cm + tid * ATTN_MAX_SPLITS, *cl = s_cl + tid * ATTN_MAX_SPLITS;
        float M = -INFINITY;
        for (int sp = 0; sp < n_live; sp++) M = fmaxf(M, cm[sp]);
        float L = 0.0f;
        for (int sp = 0; sp < n_live; sp++) {
            const float f = expf(cm[sp] - M);
            s_cf[tid * ATTN_MAX_SPLITS + sp] = f;
            L += cl[sp] * f;
        }
        s_inv[tid] = 1.0f / L;
    }
    __syncthreads();
    for (int i = tid; i < gb * HS; i += ATTN_THREADS) {
        const int hh = i / HS, d = i - hh * HS;
        const float *po = part_o + (row0 + hh) * n_splits * HS + d, *cf = s_cf + hh * ATTN_MAX_SPLITS;
        float a = 0.0f;
        for (int sp = 0; sp < n_live; sp++) a += __ldcg(po + (size_t)sp * HS) * cf[sp];
        const float v = a * s_inv[hh];
        o_blk[i] = v;
        if (xq) kiln_q8_store_warp(xq, xds, row0 * HS + i, v);
    }
}

/* ---------------------------------------------------------------- prefill: flash attention
 * Grid (ceil(T * G / QPB), NKV), ATTN_THREADS threads. Row f = t * G + hh of KV group g is query head g * G + hh
 * of token t; TPQ lanes (a power of two >= HSM / D) own one row, lane `sub` dims [D sub, D sub + D), D = 16 dims
 * per lane when it divides the head size, else 8 (HS 8, 24, 40, 56 and the run-time head sizes). The block's
 * keys are the union of its rows' ranges, lo(first token) .. p(last token); each row masks the keys outside its
 * own range with -inf. Every row in that range is a real cache row: the ring holds window + T - 1 rows. */
template <int HSM, bool EXACT, bool CAP, bool ANY>
__global__ void __launch_bounds__(ATTN_THREADS)
attn_prefill(float *out, const float *q, const void *k_cache, const void *v_cache, int kt, int vt, const int32_t *d_pos0,
             int hs, int T, int NH, int NKV, int window, int rows, int max_pos, float scale, float cap) {
    kiln_pdl_wait();
    kiln_pdl_trigger();
    const int HS = EXACT ? HSM : hs; /* a constant when EXACT */
    const float inv_cap = CAP ? 1.0f / cap : 0.0f;
    constexpr int D = prefill_dims(HSM, EXACT), TPQ = prefill_lanes(HSM, EXACT), QPB = ATTN_THREADS / TPQ;
    const int NSUB = HS / D, NP = HS / 8; /* lanes with dims, 16-byte pieces of a row */
    constexpr int BK = ANY ? ATTN_BK_ANY : ATTN_BK;
    typedef typename std::conditional<ANY, float, __half>::type tile_t;
    __shared__ __align__(16) tile_t sk[BK * HSM], sv[BK * HSM]; /* (BK, HS) each: 16 KiB each at HS 256 */

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
    const size_t e_head = (size_t)g * HS; /* the group's first element in a row */

    for (int tile = key_lo; tile <= key_hi; tile += BK) {
        const int nk = min(BK, key_hi - tile + 1);
        __syncthreads(); /* the previous tile is consumed */
        for (int i = tid; i < BK * NP; i += ATTN_THREADS) {
            const int jj = i / NP, piece = i % NP;
            kv_piece<ANY> kr, vr;
            kr.zero(), vr.zero();
            if (jj < nk) {
                const size_t off = (size_t)((tile + jj) % rows) * kv_stride + piece * 8;
                kr.load(kt, k_cache, e_head + off);
                vr.load(vt, v_cache, e_head + off);
            }
            tile8_store(sk + jj * HS + piece * 8, kr);
            tile8_store(sv + jj * HS + piece * 8, vr);
        }
        __syncthreads();

        float s[BK];
        float mt = -INFINITY;
#pragma unroll
        for (int jj = 0; jj < BK; jj++) {
            float dot = 0.0f;
            if (sub_ok) {
                float kf[D];
#pragma unroll
                for (int c = 0; c < D / 8; c++) tile8_to_f32(sk + jj * HS + sub * D + 8 * c, kf + 8 * c);
#pragma unroll
                for (int i = 0; i < D; i++) dot = fmaf(qr[i], kf[i], dot);
            }
#pragma unroll
            for (int off = TPQ / 2; off > 0; off /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, off);
            const int j = tile + jj;
            s[jj] = j >= lo && j <= p ? capped<CAP>(dot * scale, cap, inv_cap) : -INFINITY; /* j > key_hi >= p: the tail */
            mt = fmaxf(mt, s[jj]);
        }
        const float m_new = fmaxf(m, mt);
        if (m_new == -INFINITY) continue; /* no key of this row in the tile */
        const float fac = expf(m - m_new); /* 0 on the row's first tile (m = -inf) */
        l *= fac;
#pragma unroll
        for (int i = 0; i < D; i++) acc[i] *= fac;
#pragma unroll
        for (int jj = 0; jj < BK; jj++) {
            const float pj = expf(s[jj] - m_new);
            l += pj;
            if (sub_ok) {
                float vf[D];
#pragma unroll
                for (int c = 0; c < D / 8; c++) tile8_to_f32(sv + jj * HS + sub * D + 8 * c, vf + 8 * c);
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

static kiln_status launch_error(const char *what, cudaError_t e) {
    if (e == cudaSuccess) e = cudaGetLastError();
    return e == cudaSuccess ? KILN_OK : kiln_fail(KILN_ERR_IO, "cuda attention: %s launch failed: %s", what, cudaGetErrorString(e));
}

/* Workspace for the decode path, enough for any launch of at most T decode rows (one sequence's T <= 8 tokens, or
 * T rows of sequences: kiln_cuda_attention_rows; a larger single-sequence T runs the prefill kernel, which needs
 * none): the counters, then the partials. It must be
 * zero-filled once before the first launch (cudaMemset); every decode launch leaves the counters at zero again. */
extern "C" size_t kiln_cuda_attention_ws_bytes(int64_t T, int64_t NH, int64_t HS, int64_t max_pos) {
    if (T <= 0 || NH <= 0 || HS <= 0 || max_pos <= 0 || max_pos > INT32_MAX || NH > INT32_MAX || HS > 256) return 0;
    const int64_t Td = T < ATTN_ROWS_MAX ? T : ATTN_ROWS_MAX;
    return decode_counter_bytes(NH) +
           (size_t)Td * (size_t)NH * (size_t)decode_splits(max_pos) * (size_t)(HS + 2) * sizeof(float);
}

template <int HSM, bool EXACT, bool CAP, bool ANY>
static kiln_status attention_cap(float *out, void *xp, const float *q, const void *k, const void *v, int kt, int vt,
                                 const attn_where at, int HS, int T, int NH, int NKV, int window, int rows, int max_pos,
                                 float scale, float cap, void *ws, const attn_post *post, cudaStream_t s) {
    const int G = NH / NKV;
    if (T <= ATTN_DECODE_MAX_T || at.seq) {
        const int n_splits = (int)decode_splits(max_pos);
        unsigned *counters = (unsigned *)ws;
        float *part_o = (float *)((char *)ws + decode_counter_bytes(NH));
        float *part_ml = part_o + (size_t)T * NH * n_splits * HS;
        int8_t *xq = (int8_t *)xp;
        float2 *xds = xp ? (float2 *)(xq + (size_t)T * NH * HS) : NULL;
        /* query heads per block: 1 (ATTN_GB), or with KILN_ATTN_GB batches of up to 4 or 8 */
        const int tgb = attn_tune().gb, gbm = G == 1 || tgb == 1 ? 1 : G <= 4 || tgb == 4 ? 4 : 8;
        const int nhb = (G + gbm - 1) / gbm, gbmax = G < gbm ? G : gbm;
        const dim3 grid((unsigned)(NKV * nhb), (unsigned)n_splits, (unsigned)T);
        /* s_q (gbmax, HS), s_red (gbmax, R, HS), s_wm, s_wl, s_wf (gbmax, R): with R HS <= 1024, 44 KiB at most
         * (HS 8, R = 128, 8 heads), 4.6 KiB at HS 128 with one query head per KV head */
        const size_t R = ATTN_THREADS / decode_group(HSM);
        const size_t shm = sizeof(float) * (size_t)gbmax * ((size_t)HS + R * HS + 3 * R);
        void (*kern)(float *, int8_t *, float2 *, unsigned *, float *, float *, const float *, const void *,
                     const void *, int, int, const attn_where, int, int, int, int, int, int, int, float, float, const attn_post) =
            gbm == 1   ? attn_decode<HSM, EXACT, 1, CAP, ANY>
            : gbm == 4 ? attn_decode<HSM, EXACT, 4, CAP, ANY>
                       : attn_decode<HSM, EXACT, 8, CAP, ANY>;
        if (post) { /* the fused epilogue, without softcap: the f16 pair at head sizes 64, 128 and 256; other cache types
                     * (ANY) through their run-time-typed kernels of 128 and 256 (head sizes 64, 128 and 256) */
            if constexpr (!CAP && ((EXACT && !ANY && (HSM == 64 || HSM == 128 || HSM == 256)) || (!EXACT && ANY && (HSM == 128 || HSM == 256))))
                kern = gbm == 1   ? attn_decode<HSM, EXACT, 1, CAP, ANY, true>
                       : gbm == 4 ? attn_decode<HSM, EXACT, 4, CAP, ANY, true>
                                  : attn_decode<HSM, EXACT, 8, CAP, ANY, true>;
            else
                return kiln_fail(KILN_ERR_UNSUPPORTED, "cuda attention_post: no fused kernel for head size %d", HS);
        }
        return launch_error("decode", kiln_launch(kern, grid, dim3(ATTN_THREADS), shm, s, out, xq, xds, counters, part_o,
                                                  part_ml, q, k, v, kt, vt, at, HS, NH, NKV, window, rows, max_pos,
                                                  attn_tune().keys_min, scale, cap, post ? *post : attn_post{}));
    }
    constexpr int QPB = ATTN_THREADS / prefill_lanes(HSM, EXACT);
    const int64_t blocks = ((int64_t)T * G + QPB - 1) / QPB;
    return launch_error("prefill", kiln_launch(attn_prefill<HSM, EXACT, CAP, ANY>, dim3((unsigned)blocks, (unsigned)NKV),
                                               dim3(ATTN_THREADS), 0, s, out, q, k, v, kt, vt, at.pos, HS, T, NH, NKV,
                                               window, rows, max_pos, scale, cap));
}

/* One head size's kernels, with the score softcap compiled in only where there is one. */
template <int HSM, bool EXACT, bool ANY>
static kiln_status attention_hs(float *out, void *xp, const float *q, const void *k, const void *v, int kt, int vt,
                                const attn_where at, int HS, int T, int NH, int NKV, int window, int rows, int max_pos,
                                float scale, float cap, void *ws, const attn_post *post, cudaStream_t s) {
    return cap > 0 ? attention_cap<HSM, EXACT, true, ANY>(out, xp, q, k, v, kt, vt, at, HS, T, NH, NKV, window, rows,
                                                          max_pos, scale, cap, ws, post, s)
                   : attention_cap<HSM, EXACT, false, ANY>(out, xp, q, k, v, kt, vt, at, HS, T, NH, NKV, window, rows,
                                                           max_pos, scale, 0.0f, ws, post, s);
}

/* Both launchers: xp NULL for kiln_cuda_attention. */
static kiln_status attention(float *out, void *xp, const float *q, const void *k_cache, const void *v_cache,
                             kiln_kv_type type_k, kiln_kv_type type_v, const attn_where at, int64_t T, int64_t NH,
                             int64_t NKV, int64_t HS, int64_t window, int64_t rows, int64_t max_pos, float scale,
                             float softcap, void *ws, void *stream, const attn_post *post = NULL) {
    if (!out || !q || !k_cache || !v_cache || !at.pos)
        return kiln_fail(KILN_ERR_INVALID, "cuda attention: a NULL pointer");
    if (!kiln_kv_type_name(type_k) || !kiln_kv_type_name(type_v))
        return kiln_fail(KILN_ERR_INVALID, "cuda attention: KV cache type ids %d, %d", (int)type_k, (int)type_v);
    if ((kiln_kv_is_block(type_k) || kiln_kv_is_block(type_v)) && (NKV * HS) % 32)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "cuda attention: a %s cache needs rows of whole blocks of 32, not %lld",
                         kiln_kv_type_name(kiln_kv_is_block(type_k) ? type_k : type_v), (long long)(NKV * HS));
    if (!(softcap >= 0) || !isfinite(softcap))
        return kiln_fail(KILN_ERR_INVALID, "cuda attention: softcap %g (0: none, or positive)", (double)softcap);
    const int64_t Ts = at.seq ? 1 : T; /* tokens of one sequence */
    if (T <= 0 || NH <= 0 || NKV <= 0 || NH % NKV || window < 0 || rows <= 0 || max_pos < Ts || max_pos > INT32_MAX ||
        rows > INT32_MAX || window > INT32_MAX || T * NH > INT32_MAX)
        return kiln_fail(KILN_ERR_INVALID, "cuda attention: bad shape T %lld NH %lld NKV %lld window %lld rows %lld max_pos %lld",
                         (long long)T, (long long)NH, (long long)NKV, (long long)window, (long long)rows, (long long)max_pos);
    if (rows < max_pos && (window == 0 || rows < window + Ts - 1))
        return kiln_fail(KILN_ERR_INVALID, "cuda attention: %lld cache rows hold neither the context (%lld) nor window %lld + %lld tokens",
                         (long long)rows, (long long)max_pos, (long long)window, (long long)Ts);
    if ((T <= ATTN_DECODE_MAX_T || at.seq) && !ws)
        return kiln_fail(KILN_ERR_INVALID, "cuda attention: decode needs a workspace of kiln_cuda_attention_ws_bytes");
    const void *k = k_cache, *v = v_cache;
    const int kt = (int)type_k, vt = (int)type_v;
    const int Ti = (int)T, NHi = (int)NH, NKVi = (int)NKV, Wi = (int)window, Ri = (int)rows, Mi = (int)max_pos;
    cudaStream_t s = (cudaStream_t)stream;
    if (HS < 8 || HS > 256 || HS % 8) /* the kernels load rows in 16-byte pieces */
        return kiln_fail(KILN_ERR_UNSUPPORTED, "cuda attention: head size %lld is not a multiple of 8 in 8 .. 256", (long long)HS);
    const int H = (int)HS;
    if (!at.seq && T > ATTN_DECODE_MAX_T && kiln_attn_prefill_tc_takes(HS, type_k, type_v, softcap, q, out))
        return kiln_attn_prefill_tc(out, q, k, v, at.pos, Ti, NHi, NKVi, H, Wi, Ri, Mi, scale, s);
#define ATTN_ARGS out, xp, q, k, v, kt, vt, at, H, Ti, NHi, NKVi, Wi, Ri, Mi, scale, softcap, ws, post, s
    if (type_k != KILN_KV_F16 || type_v != KILN_KV_F16) /* any other pair: the run-time-typed kernels */
        return H <= 128 ? attention_hs<128, false, true>(ATTN_ARGS) : attention_hs<256, false, true>(ATTN_ARGS);
    switch (H) {
    case 8: return attention_hs<8, true, false>(ATTN_ARGS);
    case 16: return attention_hs<16, true, false>(ATTN_ARGS);
    case 24: return attention_hs<24, true, false>(ATTN_ARGS);
    case 32: return attention_hs<32, true, false>(ATTN_ARGS);
    case 40: return attention_hs<40, true, false>(ATTN_ARGS);
    case 48: return attention_hs<48, true, false>(ATTN_ARGS);
    case 56: return attention_hs<56, true, false>(ATTN_ARGS);
    case 64: return attention_hs<64, true, false>(ATTN_ARGS);
    case 80: return attention_hs<80, true, false>(ATTN_ARGS);
    case 96: return attention_hs<96, true, false>(ATTN_ARGS);
    case 128: return attention_hs<128, true, false>(ATTN_ARGS);
    case 256: return attention_hs<256, true, false>(ATTN_ARGS);
    default: return H < 128 ? attention_hs<128, false, false>(ATTN_ARGS) : attention_hs<256, false, false>(ATTN_ARGS);
    }
#undef ATTN_ARGS
}

extern "C" kiln_status kiln_cuda_attention(float *out, const float *q, const void *k_cache, const void *v_cache,
                                           kiln_kv_type type_k, kiln_kv_type type_v, const int32_t *d_pos0, int64_t T,
                                           int64_t NH, int64_t NKV, int64_t HS, int64_t window, int64_t rows,
                                           int64_t max_pos, float scale, float softcap, void *ws, void *stream) {
    return attention(out, NULL, q, k_cache, v_cache, type_k, type_v, attn_where{d_pos0, NULL, 0}, T, NH, NKV, HS, window, rows, max_pos, scale,
                     softcap, ws, stream);
}

/* The decode kernel's writer of each output block also writes its prepared form (a block of 32 within one head). */
extern "C" kiln_status kiln_cuda_attention_xp(float *out, void *xp, const float *q, const void *k_cache,
                                              const void *v_cache, kiln_kv_type type_k, kiln_kv_type type_v,
                                              const int32_t *d_pos0, int64_t T, int64_t NH, int64_t NKV, int64_t HS,
                                              int64_t window, int64_t rows, int64_t max_pos, float scale, float softcap,
                                              void *ws, void *stream) {
    if (T > KILN_CUDA_MATVEC_MAX_T || T > ATTN_DECODE_MAX_T || HS % 32)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "cuda attention_xp: T %lld, HS %lld: only T <= %d and HS a multiple of 32",
                         (long long)T, (long long)HS, ATTN_DECODE_MAX_T);
    if (!xp || (uintptr_t)xp % 16)
        return kiln_fail(KILN_ERR_INVALID, "cuda attention_xp: xp NULL or not 16-byte aligned");
    return attention(out, xp, q, k_cache, v_cache, type_k, type_v, attn_where{d_pos0, NULL, 0}, T, NH, NKV, HS, window, rows, max_pos, scale,
                     softcap, ws, stream);
}

/* The decode rows of T sequences in one launch: row t at position d_pos[t] over the caches at k_cache and v_cache
 * + d_seq[t] * seq_stride bytes, with out's prepared form into xp when xp is set. */
extern "C" kiln_status kiln_cuda_attention_rows(float *out, void *xp, const float *q, const void *k_cache, const void *v_cache,
                                                kiln_kv_type type_k, kiln_kv_type type_v, const int32_t *d_pos,
                                                const int32_t *d_seq, size_t seq_stride, int64_t T, int64_t NH, int64_t NKV,
                                                int64_t HS, int64_t window, int64_t rows, int64_t max_pos, float scale,
                                                float softcap, void *ws, void *stream) {
    if (!d_seq) return kiln_fail(KILN_ERR_INVALID, "cuda attention_rows: no sequence indices");
    if (T > ATTN_ROWS_MAX)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "cuda attention_rows: %lld rows is more than %d", (long long)T, ATTN_ROWS_MAX);
    if (xp && (T > KILN_CUDA_GEMM_SMALL_MAX_T || HS % 32))
        return kiln_fail(KILN_ERR_UNSUPPORTED, "cuda attention_rows: xp with T %lld, HS %lld: only T <= %d and HS a multiple of 32",
                         (long long)T, (long long)HS, KILN_CUDA_GEMM_SMALL_MAX_T);
    if (xp && (uintptr_t)xp % 16) return kiln_fail(KILN_ERR_INVALID, "cuda attention_rows: xp not 16-byte aligned");
    return attention(out, xp, q, k_cache, v_cache, type_k, type_v, attn_where{d_pos, d_seq, seq_stride}, T, NH, NKV, HS, window,
                     rows, max_pos, scale, softcap, ws, stream);
}

/* Whether kiln_cuda_attention runs T tokens of one sequence (q and out aligned as cudaMalloc gives them) on the
 * tensor cores: tests/test_cuda_attention.c picks its bound by it. */
extern "C" bool kiln_cuda_attention_on_tc(int64_t T, int64_t HS, kiln_kv_type type_k, kiln_kv_type type_v, float softcap) {
    return T > ATTN_DECODE_MAX_T && kiln_attn_prefill_tc_takes(HS, type_k, type_v, softcap, (const void *)256, (const void *)256);
}

/* The fused qkv epilogue's conditions (kernels.h). */
extern "C" bool kiln_cuda_attention_post_takes(int64_t T, bool rows, int64_t NH, int64_t NKV, int64_t HS, kiln_kv_type type_k,
                                               kiln_kv_type type_v, float softcap) {
    return (rows || T == 1) && T >= 1 && NKV > 0 && NH % NKV == 0 && NH / NKV <= ATTN_POST_G && (HS == 64 || HS == 128 || HS == 256) &&
           kiln_kv_type_name(type_k) && kiln_kv_type_name(type_v) && softcap == 0;
}

extern "C" kiln_status kiln_cuda_attention_post(float *out, void *xp, const float *q, const kiln_cuda_attn_post *post,
                                                void *k_cache, void *v_cache, kiln_kv_type type_k, kiln_kv_type type_v,
                                                const int32_t *d_pos, const int32_t *d_seq, size_t seq_stride, int64_t T,
                                                int64_t NH, int64_t NKV, int64_t HS, int64_t window, int64_t rows,
                                                int64_t max_pos, float scale, float softcap, void *ws, void *stream) {
    if (!post || !post->k || !post->v) return kiln_fail(KILN_ERR_INVALID, "cuda attention_post: no keys or values");
    if (!kiln_cuda_attention_post_takes(T, d_seq != NULL, NH, NKV, HS, type_k, type_v, softcap))
        return kiln_fail(KILN_ERR_UNSUPPORTED, "cuda attention_post: T %lld (%s), NH %lld, NKV %lld, HS %lld, cache types %d, %d, "
                         "softcap %g: only one token or one row a sequence, at most %d query heads a KV head, HS 64, 128 or 256, "
                         "no softcap", (long long)T, d_seq ? "rows" : "one sequence", (long long)NH, (long long)NKV,
                         (long long)HS, (int)type_k, (int)type_v, (double)softcap, ATTN_POST_G);
    if (!post->nope && (post->rope_dim <= 0 || post->rope_dim % 2 || post->rope_dim > HS))
        return kiln_fail(KILN_ERR_INVALID, "cuda attention_post: rope_dim %lld for HS %lld", (long long)post->rope_dim, (long long)HS);
    if (xp && ((uintptr_t)xp % 16 || T > (d_seq ? KILN_CUDA_GEMM_SMALL_MAX_T : KILN_CUDA_MATVEC_MAX_T)))
        return kiln_fail(KILN_ERR_INVALID, "cuda attention_post: xp not 16-byte aligned, or T %lld too many rows for it", (long long)T);
    if (d_seq && T > ATTN_ROWS_MAX)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "cuda attention_post: %lld rows is more than %d", (long long)T, ATTN_ROWS_MAX);
    attn_post pp = {};
    pp.k = post->k, pp.v = post->v, pp.bq = post->bq, pp.bk = post->bk, pp.bv = post->bv;
    pp.qn = post->q_norm, pp.kn = post->k_norm, pp.eps = post->eps;
    pp.rope = !post->nope, pp.neox = post->neox, pp.rope_dim = (int)post->rope_dim;
    /* the host's powf, the very call ops_rope.c (and qkv_post) makes, so theta_scale has the CPU's bits */
    pp.theta_scale = post->nope ? 1.0f : powf(post->base, -2.0f / (float)post->rope_dim);
    pp.rf = kiln_cuda_rope_freq_make(post->nope ? NULL : post->h_rope_freq, post->rope_dim / 2, post->nope ? 1.0f : post->rope_mscale);
    return attention(out, xp, q, k_cache, v_cache, type_k, type_v, attn_where{d_pos, d_seq, seq_stride}, T, NH, NKV, HS, window,
                     rows, max_pos, scale, softcap, ws, stream, &pp);
}
