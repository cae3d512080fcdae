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
 * Work split: one CTA of 128 threads holds `groups` groups of gs = 32, 64 or 128 threads (gs grows with the row's
 * width so short rows of a 2048-wide model still fill the warps). A group computes NR weight rows together: each
 * thread takes "pieces" (32 or 64 weights of a row, the unit one thread decodes) p = lane, lane + gs, ... of all
 * NR rows, holds their decoded quants in registers, and then for each token loads x once and does NR dot
 * products, so x is read from L1/L2 once per NR rows (x is ~2.2 bytes per weight per token in prepared form, more
 * than a 4-bit weight, so this reuse keeps the L1 from becoming the limit at T = 8). Partial sums are reduced by
 * warp shuffles, then across the group's warps in shared memory (a one-warp group stores straight from the
 * shuffles). matvec_glu runs the same kernel with its NR rows being R rows of Wg and the same R rows of Wu.
 * Both kernels launch with programmatic dependent launch (launch.h): each waits for its predecessor before it
 * touches memory, so only the scheduling overlaps. */
#include "cuda/blocks.cuh"
#include "cuda/kernels.h"
#include "cuda/launch.h"
#include "cuda/q8.cuh"
#include "quants.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "status.h"

#define MV_THREADS 128 /* threads per CTA: 4 warps, 16 CTAs per SM at full occupancy */

/* Everything a matvec kernel needs, passed by value. */
struct mv_args {
    const uint8_t *w[2];   /* weight rows (rows, cols) at w + o * row_bytes; w[1] is Wu for the GLU */
    size_t row_bytes;
    int64_t rows, cols;    /* O, I */
    int64_t ppr;           /* pieces per row */
    const int8_t *xq;      /* (T, cols) int8 codes, prepared */
    const float2 *xds;     /* (T, cols / 32) {d, d * sum(q)} */
    const float *xf;       /* (T, cols) the float activation (float weights read it) */
    float *y;              /* (T, rows) */
    int gs;                /* threads per group: 32, 64 or 128 */
    bool add, geglu;
};

/* ---------------------------------------------------------------- loads */

static __device__ __forceinline__ float h2f(uint16_t h) { return __half2float(__ushort_as_half(h)); }
static __device__ __forceinline__ uint16_t ld_u16(const uint8_t *p) { return *(const uint16_t *)p; }
static __device__ __forceinline__ uint32_t ld_u32(const uint8_t *p) { return *(const uint32_t *)p; }

/* N little-endian 32-bit words from a 2-byte-aligned p (the 18-, 22-, 34- and 210-byte blocks put their quants
 * at 2 mod 4 in every other block): aligned 4-byte loads from p rounded down, shifted together by 16 bits when p
 * is 2 mod 4. The word at p - 2 then holds 2 bytes before p (still inside the buffer: every caller's region has
 * a header or an earlier region before it), and the last 2 bytes come from one 16-bit load at p + 4N - 2, so
 * nothing past p + 4N is read. */
template <int N>
static __device__ __forceinline__ void ld_words_a2(const uint8_t *p, uint32_t *out) {
    const unsigned sh = ((uintptr_t)p & 2) ? 16u : 0u;
    const uint32_t *base = (const uint32_t *)((uintptr_t)p & ~(uintptr_t)3);
    uint32_t a[N + 1];
#pragma unroll
    for (int i = 0; i < N; i++) a[i] = base[i];
    a[N] = sh ? (uint32_t)ld_u16(p + 4 * N - 2) : 0u;
#pragma unroll
    for (int i = 0; i < N; i++) out[i] = __funnelshift_r(a[i], a[i + 1], sh);
}

/* The int8 codes of x block kx of token t: 8 words, two 16-byte loads. */
struct xblock {
    int q[8];
    float2 ds;
    __device__ __forceinline__ void load(const mv_args &a, int t, int64_t kx) {
        const int4 *p = (const int4 *)(a.xq + (int64_t)t * a.cols + 32 * kx);
        const int4 u = p[0], v = p[1];
        q[0] = u.x, q[1] = u.y, q[2] = u.z, q[3] = u.w, q[4] = v.x, q[5] = v.y, q[6] = v.z, q[7] = v.w;
        ds = a.xds[(int64_t)t * (a.cols / 32) + kx];
    }
};

struct xblock2 {
    xblock b[2];
};

/* ---------------------------------------------------------------- pieces
 * A piece type says how many weights one thread decodes (ELEMS), loads them for row `row` (load), loads the x that
 * matches for token t (load_x, shared by the NR rows), and returns their dot product (dot). */

/* Q4_0, 18 bytes per 32: x = d * (q - 8). Piece = one block. sum((q - 8) * xq) * dx = dx * sum(q * xq) - 8 * s. */
struct piece_q4_0 {
    static const int ELEMS = 32;
    typedef xblock X;
    uint32_t v[4];
    float d;
    __device__ __forceinline__ void load(const uint8_t *row, int64_t p) {
        const uint8_t *b = row + p * sizeof(block_q4_0);
        d = h2f(ld_u16(b));
        ld_words_a2<4>(b + 2, v);
    }
    static __device__ __forceinline__ void load_x(X &x, const mv_args &a, int t, int64_t p) { x.load(a, t, p); }
    __device__ __forceinline__ float dot(const X &x) const {
        int s = 0;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            s = __dp4a((int)(v[i] & 0x0F0F0F0F), x.q[i], s);            /* elements 4i..4i+3 */
            s = __dp4a((int)((v[i] >> 4) & 0x0F0F0F0F), x.q[i + 4], s); /* elements 16+4i.. */
        }
        return d * (x.ds.x * (float)s - 8.0f * x.ds.y);
    }
};

/* Q4_1, 20 bytes per 32: x = d * q + m, so the dot is d * dx * sum(q * xq) + m * s. */
struct piece_q4_1 {
    static const int ELEMS = 32;
    typedef xblock X;
    uint32_t v[4];
    float d, m;
    __device__ __forceinline__ void load(const uint8_t *row, int64_t p) {
        const uint8_t *b = row + p * sizeof(block_q4_1);
        const uint32_t dm = ld_u32(b);
        d = h2f((uint16_t)dm), m = h2f((uint16_t)(dm >> 16));
#pragma unroll
        for (int i = 0; i < 4; i++) v[i] = ld_u32(b + 4 + 4 * i);
    }
    static __device__ __forceinline__ void load_x(X &x, const mv_args &a, int t, int64_t p) { x.load(a, t, p); }
    __device__ __forceinline__ float dot(const X &x) const {
        int s = 0;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            s = __dp4a((int)(v[i] & 0x0F0F0F0F), x.q[i], s);
            s = __dp4a((int)((v[i] >> 4) & 0x0F0F0F0F), x.q[i + 4], s);
        }
        return d * x.ds.x * (float)s + m * x.ds.y;
    }
};

/* Bits 0..3 of h to bit 4 of bytes 0..3: the fifth bit of four 5-bit quants. */
static __device__ __forceinline__ uint32_t spread4(uint32_t h) {
    return ((h & 1) << 4) | ((h & 2) << 11) | ((h & 4) << 18) | ((h & 8) << 25);
}

/* Q5_0, 22 bytes per 32: x = d * (q - 16); bit j of qh is bit 4 of element j. */
struct piece_q5_0 {
    static const int ELEMS = 32;
    typedef xblock X;
    uint32_t v[4], qh;
    float d;
    __device__ __forceinline__ void load(const uint8_t *row, int64_t p) {
        const uint8_t *b = row + p * sizeof(block_q5_0);
        d = h2f(ld_u16(b));
        ld_words_a2<1>(b + 2, &qh);
        ld_words_a2<4>(b + 6, v);
    }
    static __device__ __forceinline__ void load_x(X &x, const mv_args &a, int t, int64_t p) { x.load(a, t, p); }
    __device__ __forceinline__ float dot(const X &x) const {
        int s = 0;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint32_t lo = (v[i] & 0x0F0F0F0F) | spread4(qh >> (4 * i));
            const uint32_t hi = ((v[i] >> 4) & 0x0F0F0F0F) | spread4(qh >> (4 * i + 16));
            s = __dp4a((int)lo, x.q[i], s);
            s = __dp4a((int)hi, x.q[i + 4], s);
        }
        return d * (x.ds.x * (float)s - 16.0f * x.ds.y);
    }
};

/* Q8_0, 34 bytes per 32: x = d * q. */
struct piece_q8_0 {
    static const int ELEMS = 32;
    typedef xblock X;
    uint32_t v[8];
    float d;
    __device__ __forceinline__ void load(const uint8_t *row, int64_t p) {
        const uint8_t *b = row + p * sizeof(block_q8_0);
        d = h2f(ld_u16(b));
        ld_words_a2<8>(b + 2, v);
    }
    static __device__ __forceinline__ void load_x(X &x, const mv_args &a, int t, int64_t p) { x.load(a, t, p); }
    __device__ __forceinline__ float dot(const X &x) const {
        int s = 0;
#pragma unroll
        for (int i = 0; i < 8; i++) s = __dp4a((int)v[i], x.q[i], s);
        return d * x.ds.x * (float)s;
    }
};

/* Q4_K and Q5_K: 6-bit scales and mins of the two sub-blocks 2c, 2c+1 of a 64-chunk c, from scales[12] read as three
 * words (kiln_unpack_scales_k4's unpacking, equal to get_scale_min_k4). */
static __device__ __forceinline__ void k4_scales(const uint8_t *scales12, int c, float *sc, float *m) {
    const uint32_t a = ld_u32(scales12), b = ld_u32(scales12 + 4), cc = ld_u32(scales12 + 8);
    const uint32_t sw = c < 2 ? (a & 0x3f3f3f3f) : ((cc & 0x0f0f0f0f) | (((a >> 6) & 0x03030303) << 4));
    const uint32_t mw = c < 2 ? (b & 0x3f3f3f3f) : (((cc >> 4) & 0x0f0f0f0f) | (((b >> 6) & 0x03030303) << 4));
    const unsigned sh = 16u * (unsigned)(c & 1); /* sub-block 2c is byte (2c) & 3 of its word */
    sc[0] = (float)((sw >> sh) & 0xFF), sc[1] = (float)((sw >> (sh + 8)) & 0xFF);
    m[0] = (float)((mw >> sh) & 0xFF), m[1] = (float)((mw >> (sh + 8)) & 0xFF);
}

/* Q4_K, 144 bytes per 256: piece = 64-chunk c of block p / 4. qs[32c + l] holds element l of sub-block 2c (low
 * nibble) and of sub-block 2c+1 (high); x = d * sc * q - dmin * m. The 32 quant bytes sit at 16 + 32c in a block of
 * 144 = 9 * 16 bytes, so they are two 16-byte loads. */
struct piece_q4_K {
    static const int ELEMS = 64;
    typedef xblock2 X;
    uint32_t v[8];
    float d, dmin, sc[2], m[2];
    __device__ __forceinline__ void load(const uint8_t *row, int64_t p) {
        const int c = (int)(p & 3);
        const uint8_t *b = row + (p >> 2) * sizeof(block_q4_K);
        const uint32_t dm = ld_u32(b);
        d = h2f((uint16_t)dm), dmin = h2f((uint16_t)(dm >> 16));
        k4_scales(b + 4, c, sc, m);
        const uint4 *q = (const uint4 *)(b + 16 + 32 * c);
        const uint4 u = q[0], w = q[1];
        v[0] = u.x, v[1] = u.y, v[2] = u.z, v[3] = u.w, v[4] = w.x, v[5] = w.y, v[6] = w.z, v[7] = w.w;
    }
    static __device__ __forceinline__ void load_x(X &x, const mv_args &a, int t, int64_t p) { /* blocks 2p, 2p+1 */
        x.b[0].load(a, t, 2 * p), x.b[1].load(a, t, 2 * p + 1);
    }
    __device__ __forceinline__ float dot(const X &x) const {
        int s0 = 0, s1 = 0;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            s0 = __dp4a((int)(v[i] & 0x0F0F0F0F), x.b[0].q[i], s0);
            s1 = __dp4a((int)((v[i] >> 4) & 0x0F0F0F0F), x.b[1].q[i], s1);
        }
        return d * (sc[0] * x.b[0].ds.x * (float)s0 + sc[1] * x.b[1].ds.x * (float)s1) -
               dmin * (m[0] * x.b[0].ds.y + m[1] * x.b[1].ds.y);
    }
};

/* Q5_K, 176 bytes per 256: Q4_K plus qh[32] at 16 (bit sb of qh[l] is bit 4 of element l of sub-block sb); qs at 48.
 * 176 = 11 * 16, so qh and qs are 16-byte loads. */
struct piece_q5_K {
    static const int ELEMS = 64;
    typedef xblock2 X;
    uint32_t v0[8], v1[8]; /* the 5-bit quants of sub-blocks 2c and 2c+1 */
    float d, dmin, sc[2], m[2];
    __device__ __forceinline__ void load(const uint8_t *row, int64_t p) {
        const int c = (int)(p & 3);
        const uint8_t *b = row + (p >> 2) * sizeof(block_q5_K);
        const uint32_t dm = ld_u32(b);
        d = h2f((uint16_t)dm), dmin = h2f((uint16_t)(dm >> 16));
        k4_scales(b + 4, c, sc, m);
        const uint4 *hq = (const uint4 *)(b + 16), *q = (const uint4 *)(b + 48 + 32 * c);
        const uint4 h0 = hq[0], h1 = hq[1], u = q[0], w = q[1];
        const uint32_t h[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
        const uint32_t l[8] = {u.x, u.y, u.z, u.w, w.x, w.y, w.z, w.w};
#pragma unroll
        for (int i = 0; i < 8; i++) {
            v0[i] = (l[i] & 0x0F0F0F0F) | (((h[i] >> (2 * c)) & 0x01010101) << 4);
            v1[i] = ((l[i] >> 4) & 0x0F0F0F0F) | (((h[i] >> (2 * c + 1)) & 0x01010101) << 4);
        }
    }
    static __device__ __forceinline__ void load_x(X &x, const mv_args &a, int t, int64_t p) {
        x.b[0].load(a, t, 2 * p), x.b[1].load(a, t, 2 * p + 1);
    }
    __device__ __forceinline__ float dot(const X &x) const {
        int s0 = 0, s1 = 0;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            s0 = __dp4a((int)v0[i], x.b[0].q[i], s0);
            s1 = __dp4a((int)v1[i], x.b[1].q[i], s1);
        }
        return d * (sc[0] * x.b[0].ds.x * (float)s0 + sc[1] * x.b[1].ds.x * (float)s1) -
               dmin * (m[0] * x.b[0].ds.y + m[1] * x.b[1].ds.y);
    }
};

/* Q6_K, 210 bytes per 256: in 128-half h, element 32g + l (g 0..3) is the low (g < 2) or high nibble of
 * ql[64h + 32(g&1) + l], with bits 2g..2g+1 of qh[32h + l], minus 32, times d * scales[8h + 2g + l/16]. Piece
 * p = (h, g2) = (p/2 % 2, p % 2) covers g = g2 and g2 + 2, which share the same 32 ql and 32 qh bytes: x blocks
 * 8 * blk + 4h + g2 and + 2. The block is only 2-byte aligned: 4-byte loads shifted together. */
struct piece_q6_K {
    static const int ELEMS = 64;
    typedef xblock2 X;
    uint32_t v0[8], v1[8]; /* the quants minus 32 (int8) of g = g2 and g2 + 2 */
    float d, sc[4];        /* scales of (g2, l < 16), (g2, l >= 16), (g2+2, l < 16), (g2+2, l >= 16) */
    __device__ __forceinline__ void load(const uint8_t *row, int64_t p) {
        const int h = (int)((p >> 1) & 1), g2 = (int)(p & 1);
        const uint8_t *b = row + (p >> 2) * sizeof(block_q6_K);
        uint32_t ql[8], qh[8];
        ld_words_a2<8>(b + 64 * h + 32 * g2, ql);
        ld_words_a2<8>(b + 128 + 32 * h, qh);
        const uint16_t s01 = ld_u16(b + 192 + 8 * h + 2 * g2), s23 = ld_u16(b + 192 + 8 * h + 2 * g2 + 4);
        sc[0] = (float)(int8_t)(s01 & 0xFF), sc[1] = (float)(int8_t)(s01 >> 8);
        sc[2] = (float)(int8_t)(s23 & 0xFF), sc[3] = (float)(int8_t)(s23 >> 8);
        d = h2f(ld_u16(b + 208));
#pragma unroll
        for (int i = 0; i < 8; i++) {
            v0[i] = __vsub4((ql[i] & 0x0F0F0F0F) | (((qh[i] >> (2 * g2)) & 0x03030303) << 4), 0x20202020);
            v1[i] = __vsub4(((ql[i] >> 4) & 0x0F0F0F0F) | (((qh[i] >> (2 * g2 + 4)) & 0x03030303) << 4), 0x20202020);
        }
    }
    static __device__ __forceinline__ void load_x(X &x, const mv_args &a, int t, int64_t p) {
        const int64_t kx = 8 * (p >> 2) + 4 * ((p >> 1) & 1) + (p & 1);
        x.b[0].load(a, t, kx), x.b[1].load(a, t, kx + 2);
    }
    __device__ __forceinline__ float dot(const X &x) const {
        int a0 = 0, a1 = 0, b0 = 0, b1 = 0;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            a0 = __dp4a((int)v0[i], x.b[0].q[i], a0);
            a1 = __dp4a((int)v0[i + 4], x.b[0].q[i + 4], a1);
            b0 = __dp4a((int)v1[i], x.b[1].q[i], b0);
            b1 = __dp4a((int)v1[i + 4], x.b[1].q[i + 4], b1);
        }
        return d * (x.b[0].ds.x * (sc[0] * (float)a0 + sc[1] * (float)a1) +
                    x.b[1].ds.x * (sc[2] * (float)b0 + sc[3] * (float)b1));
    }
};

/* Q5_1, 24 bytes per 32 (4-byte aligned): x = d * q + m, q 5-bit as Q5_0; the dot is d * dx * sum(q * xq) + m * s. */
struct piece_q5_1 {
    static const int ELEMS = 32;
    typedef xblock X;
    uint32_t v[4], qh;
    float d, m;
    __device__ __forceinline__ void load(const uint8_t *row, int64_t p) {
        const uint8_t *b = row + p * sizeof(block_q5_1);
        const uint32_t dm = ld_u32(b);
        d = h2f((uint16_t)dm), m = h2f((uint16_t)(dm >> 16));
        qh = ld_u32(b + 4);
#pragma unroll
        for (int i = 0; i < 4; i++) v[i] = ld_u32(b + 8 + 4 * i);
    }
    static __device__ __forceinline__ void load_x(X &x, const mv_args &a, int t, int64_t p) { x.load(a, t, p); }
    __device__ __forceinline__ float dot(const X &x) const {
        int s = 0;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            s = __dp4a((int)((v[i] & 0x0F0F0F0F) | spread4(qh >> (4 * i))), x.q[i], s);
            s = __dp4a((int)(((v[i] >> 4) & 0x0F0F0F0F) | spread4(qh >> (4 * i + 16))), x.q[i + 4], s);
        }
        return d * x.ds.x * (float)s + m * x.ds.y;
    }
};

/* IQ4_NL, 18 bytes per 32: x = d * level(q), packed as Q4_0; the levels are decoded to int8 in registers at load
 * (blocks.cuh's byte permutes), so the dot is Q8_0's. */
struct piece_iq4_nl {
    static const int ELEMS = 32;
    typedef xblock X;
    uint32_t v[8]; /* int8 levels of elements 4i.. (v[i]) and 16 + 4i.. (v[i + 4]) */
    float d;
    __device__ __forceinline__ void load(const uint8_t *row, int64_t p) {
        const uint8_t *b = row + p * sizeof(block_iq4_nl);
        d = h2f(ld_u16(b));
        uint32_t q[4];
        ld_words_a2<4>(b + 2, q);
#pragma unroll
        for (int i = 0; i < 4; i++) iq4nl_levels8(q[i], &v[i], &v[i + 4]);
    }
    static __device__ __forceinline__ void load_x(X &x, const mv_args &a, int t, int64_t p) { x.load(a, t, p); }
    __device__ __forceinline__ float dot(const X &x) const {
        int s = 0;
#pragma unroll
        for (int i = 0; i < 8; i++) s = __dp4a((int)v[i], x.q[i], s);
        return d * x.ds.x * (float)s;
    }
};

/* IQ4_XS, 136 bytes per 256 (8-byte aligned): piece = sub-blocks 2c, 2c+1 (c = p % 4) of block p / 4, whose 32 qs
 * bytes at 8 + 32c are two IQ4_NL payloads; x = d * (sc - 32) * level(q), so no min term. */
struct piece_iq4_xs {
    static const int ELEMS = 64;
    typedef xblock2 X;
    uint32_t v0[8], v1[8]; /* int8 levels of sub-blocks 2c and 2c+1, in Q8_0 order */
    float d0, d1;          /* d * (sc - 32) of each */
    __device__ __forceinline__ void load(const uint8_t *row, int64_t p) {
        const int c = (int)(p & 3);
        const uint8_t *b = row + (p >> 2) * sizeof(block_iq4_xs);
        const uint32_t dh = ld_u32(b), sl = ld_u32(b + 4);
        const float d = h2f((uint16_t)dh);
        const uint32_t sh = dh >> (16 + 4 * c), slc = sl >> (8 * c); /* scales_h bits 4c.., scales_l byte c */
        d0 = d * (float)((int)((slc & 0xF) | ((sh & 3) << 4)) - 32);
        d1 = d * (float)((int)(((slc >> 4) & 0xF) | (((sh >> 2) & 3) << 4)) - 32);
        const uint2 *q = (const uint2 *)(b + 8 + 32 * c);
        const uint2 q0 = q[0], q1 = q[1], q2 = q[2], q3 = q[3];
        const uint32_t w[8] = {q0.x, q0.y, q1.x, q1.y, q2.x, q2.y, q3.x, q3.y};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            iq4nl_levels8(w[i], &v0[i], &v0[i + 4]);
            iq4nl_levels8(w[i + 4], &v1[i], &v1[i + 4]);
        }
    }
    static __device__ __forceinline__ void load_x(X &x, const mv_args &a, int t, int64_t p) { /* blocks 2p, 2p+1 */
        x.b[0].load(a, t, 2 * p), x.b[1].load(a, t, 2 * p + 1);
    }
    __device__ __forceinline__ float dot(const X &x) const {
        int s0 = 0, s1 = 0;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            s0 = __dp4a((int)v0[i], x.b[0].q[i], s0);
            s1 = __dp4a((int)v1[i], x.b[1].q[i], s1);
        }
        return d0 * x.b[0].ds.x * (float)s0 + d1 * x.b[1].ds.x * (float)s1;
    }
};

/* Q2_K and Q3_K share a piece shape: half h of a super-block holds elements 128h + 32j + l (j 0..3, l 0..31) as
 * bits 2j..2j+1 of qs[32h + l], 16-element sub-block 8h + 2j + l/16. Piece p = (h, lh) = (p/2 % 2, p % 2) of block
 * p / 4 takes the 16 qs bytes l = 16 lh .. 16 lh + 15 (4 words) and so 64 elements: the 16-element half lh of x
 * blocks 8 blk + 4h + j, one sub-block each. The x side also carries the half's sum of codes, u = sum(xq), which
 * Q2_K's min and Q3_K's -4 offset multiply: computed once per token for all NR rows. */
struct xhalf4 {
    int q[4][4]; /* codes of the 16 elements of x block kx0 + j, half lh */
    float dx[4]; /* their block's d */
    int u[4];    /* sum of the 16 codes */
};

static __device__ __forceinline__ void load_xhalf4(xhalf4 &x, const mv_args &a, int t, int64_t p) {
    const int64_t kx0 = 8 * (p >> 2) + 4 * ((p >> 1) & 1);
    const int lh = (int)(p & 1);
    const int8_t *xr = a.xq + (int64_t)t * a.cols;
    const float2 *ds = a.xds + (int64_t)t * (a.cols / 32);
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const int4 w = *(const int4 *)(xr + 32 * (kx0 + j) + 16 * lh);
        x.q[j][0] = w.x, x.q[j][1] = w.y, x.q[j][2] = w.z, x.q[j][3] = w.w;
        x.dx[j] = ds[kx0 + j].x;
        int u = 0;
#pragma unroll
        for (int i = 0; i < 4; i++) u = __dp4a(x.q[j][i], 0x01010101, u);
        x.u[j] = u;
    }
}

/* Q2_K, 84 bytes per 256 (4-byte aligned): x = d * sc * q - dmin * m with 4-bit sc, m; the sub-block's dot is
 * dx * (d * sc * sum(q * xq) - dmin * m * u). */
struct piece_q2_K {
    static const int ELEMS = 64;
    typedef xhalf4 X;
    uint32_t v[4];  /* qs bytes 32h + 16lh .. + 15 */
    uint32_t sc;    /* scales[8h + 2j + lh] as byte j */
    float d, dmin;
    __device__ __forceinline__ void load(const uint8_t *row, int64_t p) {
        const int h = (int)((p >> 1) & 1), lh = (int)(p & 1);
        const uint8_t *b = row + (p >> 2) * sizeof(block_q2_K);
        const uint32_t s0 = ld_u32(b + 8 * h), s1 = ld_u32(b + 8 * h + 4); /* scales 8h .. 8h + 7 */
        sc = __byte_perm(s0, s1, lh ? 0x7531u : 0x6420u);
#pragma unroll
        for (int i = 0; i < 4; i++) v[i] = ld_u32(b + 16 + 32 * h + 16 * lh + 4 * i);
        const uint32_t dm = ld_u32(b + 80);
        d = h2f((uint16_t)dm), dmin = h2f((uint16_t)(dm >> 16));
    }
    static __device__ __forceinline__ void load_x(X &x, const mv_args &a, int t, int64_t p) { load_xhalf4(x, a, t, p); }
    __device__ __forceinline__ float dot(const X &x) const {
        float sd = 0.0f, sm = 0.0f;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int s = 0;
#pragma unroll
            for (int i = 0; i < 4; i++) s = __dp4a((int)((v[i] >> (2 * j)) & 0x03030303), x.q[j][i], s);
            const int scj = (int)((sc >> (8 * j)) & 0xF), mj = (int)((sc >> (8 * j + 4)) & 0xF);
            sd += x.dx[j] * (float)(scj * s);
            sm += x.dx[j] * (float)(mj * x.u[j]);
        }
        return d * sd - dmin * sm;
    }
};

/* Q3_K, 110 bytes per 256 (2-byte aligned: shifted word loads): q = the 2 bits | bit 4h + j of hmask[l] << 2, minus
 * 4, so the sub-block's dot is dx * d * (sc - 32) * (sum(q' * xq) - 4u) with q' = 0..7. hmask's 16 bytes l = 16lh.. sit
 * at 16lh, qs's at 32 + 32h + 16lh, the 12 scale bytes at 96, d at 108. */
struct piece_q3_K {
    static const int ELEMS = 64;
    typedef xhalf4 X;
    uint32_t v[4], hm[4];
    int sc[4]; /* scale - 32 of sub-block 8h + 2j + lh */
    float d;
    __device__ __forceinline__ void load(const uint8_t *row, int64_t p) {
        const int h = (int)((p >> 1) & 1), lh = (int)(p & 1);
        const uint8_t *b = row + (p >> 2) * sizeof(block_q3_K);
        ld_words_a2<4>(b + 16 * lh, hm);
#pragma unroll
        for (int i = 0; i < 4; i++) hm[i] = (hm[i] >> (4 * h)) & 0x0F0F0F0F; /* bit j: the high bit of shift pair j */
        ld_words_a2<4>(b + 32 + 32 * h + 16 * lh, v);
        uint32_t s[3];
        ld_words_a2<3>(b + 96, s);
        /* scale k = 8h + 2j + lh (blocks.cuh's q3k_scale): the low (h = 0) or high (h = 1) nibble of byte k % 8, and
         * bits 2 (k / 4) .. +1 of byte 8 + k % 4 */
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int k = 8 * h + 2 * j + lh;
            const uint32_t lo = (s[(k & 7) >> 2] >> (8 * (k & 3) + 4 * h)) & 0xF;
            const uint32_t hi = (s[2] >> (8 * (k & 3) + 2 * (k >> 2))) & 3;
            sc[j] = (int)(lo | (hi << 4)) - 32;
        }
        d = h2f(ld_u16(b + 108));
    }
    static __device__ __forceinline__ void load_x(X &x, const mv_args &a, int t, int64_t p) { load_xhalf4(x, a, t, p); }
    __device__ __forceinline__ float dot(const X &x) const {
        float sd = 0.0f;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int s = 0;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const uint32_t q = ((v[i] >> (2 * j)) & 0x03030303) | (((hm[i] >> j) & 0x01010101) << 2);
                s = __dp4a((int)q, x.q[j][i], s);
            }
            sd += x.dx[j] * (float)(sc[j] * (s - 4 * x.u[j]));
        }
        return d * sd;
    }
};

/* Float weights against float x. VEC: 8 weights per piece with 16-byte loads (cols % 8 == 0 and every pointer
 * 16-byte aligned); otherwise one weight per piece. */
template <int N>
struct xfloat {
    float f[N];
};

static __device__ __forceinline__ void ld_f8(const float *p, float *f) {
    const float4 a = ((const float4 *)p)[0], b = ((const float4 *)p)[1];
    f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
}

template <kiln_type TY, bool VEC>
struct piece_float {
    static const int ELEMS = VEC ? 8 : 1;
    typedef xfloat<ELEMS> X;
    float w[ELEMS];
    __device__ __forceinline__ void load(const uint8_t *row, int64_t p) {
        if (VEC) {
            if (TY == KILN_TYPE_F32) {
                ld_f8((const float *)row + 8 * p, w);
            } else {
                const uint4 u = ((const uint4 *)row)[p];
                const uint32_t h[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    if (TY == KILN_TYPE_F16) {
                        w[2 * i] = h2f((uint16_t)h[i]), w[2 * i + 1] = h2f((uint16_t)(h[i] >> 16));
                    } else {
                        w[2 * i] = __uint_as_float(h[i] << 16), w[2 * i + 1] = __uint_as_float(h[i] & 0xFFFF0000u);
                    }
                }
            }
        } else {
            if (TY == KILN_TYPE_F32) w[0] = ((const float *)row)[p];
            else if (TY == KILN_TYPE_F16) w[0] = h2f(((const uint16_t *)row)[p]);
            else w[0] = __uint_as_float((uint32_t)((const uint16_t *)row)[p] << 16);
        }
    }
    static __device__ __forceinline__ void load_x(X &x, const mv_args &a, int t, int64_t p) {
        const float *xr = a.xf + (int64_t)t * a.cols;
        if (VEC) ld_f8(xr + 8 * p, x.f);
        else x.f[0] = xr[p];
    }
    __device__ __forceinline__ float dot(const X &x) const {
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < ELEMS; i++) s = fmaf(w[i], x.f[i], s);
        return s;
    }
};

/* ---------------------------------------------------------------- the kernel */

static __device__ __forceinline__ float act(float g, bool geglu) {
    if (geglu) return 0.5f * g * (1.0f + tanhf(0.7978845608f * (g + 0.044715f * g * g * g)));
    return g / (1.0f + expf(-g));
}

/* NR weight rows per group: R output rows of W (GLU false), or R rows of Wg then the same R rows of Wu (GLU true,
 * NR = 2R). Output row o = (blockIdx.x * groups + group) * R + j. */
template <class P, int T, int NR, bool GLU>
__global__ void __launch_bounds__(MV_THREADS) matvec_kernel(const mv_args a) {
    kiln_pdl_wait();
    kiln_pdl_trigger();
    const int R = GLU ? NR / 2 : NR;
    __shared__ float red[MV_THREADS / 32][NR * T];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int gs = a.gs, groups = MV_THREADS / gs, group = tid / gs, k0 = tid % gs;
    const int64_t row0 = ((int64_t)blockIdx.x * groups + group) * R;

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

    for (int64_t p = k0; p < a.ppr; p += gs) {
        P w[NR];
#pragma unroll
        for (int j = 0; j < NR; j++) w[j].load(wrow[j], p);
#pragma unroll
        for (int t = 0; t < T; t++) {
            typename P::X x;
            P::load_x(x, a, t, p);
#pragma unroll
            for (int j = 0; j < NR; j++) acc[j][t] += w[j].dot(x);
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
        const int64_t o = ((int64_t)blockIdx.x * groups + g) * R + j;
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
template <class P, int T, bool GLU>
static kiln_status launch_t(mv_args a, cudaStream_t s) {
    /* output rows per group; the 64-weight pieces of the K-quants hold 16+ words a row, so 4 rows of them would
     * take ~170 registers (2 CTAs per SM): they stay at 2 */
    const int R = (T <= 4 || P::ELEMS == 64) ? (GLU ? 1 : 2) : (GLU ? 2 : 4);
    a.gs = a.ppr >= 96 ? 128 : a.ppr > 32 ? 64 : 32;
    if (P::ELEMS == 64 && T >= 4 && a.rows / R >= 2048) a.gs = 32;
    const int64_t rows_per_cta = (int64_t)(MV_THREADS / a.gs) * R;
    const int64_t grid = (a.rows + rows_per_cta - 1) / rows_per_cta;
    if (grid > INT32_MAX) return kiln_fail(KILN_ERR_INVALID, "cuda matvec: %lld rows is too many", (long long)a.rows);
    const cudaError_t e = kiln_launch(matvec_kernel<P, T, GLU ? 2 * R : R, GLU>, dim3((unsigned)grid), dim3(MV_THREADS), 0,
                                      s, a);
    return e == cudaSuccess ? KILN_OK : kiln_fail(KILN_ERR_IO, "CUDA matvec launch failed: %s", cudaGetErrorString(e));
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

template <bool GLU>
static kiln_status matvec_dispatch(const char *op, float *y, const float *x, const void *xp, const kiln_cuda_wt *W,
                                   const kiln_cuda_wt *Wu, int64_t T, bool add, bool geglu, cudaStream_t s) {
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
    return matvec_dispatch<false>("matvec", y, x, xp, W, NULL, T, add, false, (cudaStream_t)stream);
}

extern "C" kiln_status kiln_cuda_matvec_glu(float *out, const float *x, const void *xp, const kiln_cuda_wt *Wg,
                                            const kiln_cuda_wt *Wu, int64_t T, bool geglu, void *stream) {
    return matvec_dispatch<true>("matvec_glu", out, x, xp, Wg, Wu, T, false, geglu, (cudaStream_t)stream);
}
