/* matvec_pieces.cuh: matvec.cu's weight decoders ("pieces", one per block format) and the loads they share: each
 * says how many weights one thread decodes, turns them into int8 words for __dp4a against the prepared activations
 * (matvec.cu's header says their layout), and returns the dot product of one piece. Kept apart from the kernels so
 * that tests/test_cuda_host.sh can compile them for the host with stand-ins for the CUDA intrinsics
 * (tests/cuda_host.cpp) and check every type's decoding on a machine without a GPU; tests/test_cuda_matvec.c
 * checks them on the GPU. */
#ifndef KILN_CUDA_MATVEC_PIECES_CUH
#define KILN_CUDA_MATVEC_PIECES_CUH

#include "cuda/blocks.cuh"
#include "quants.h"

#include <stdint.h>

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
    /* the tail (kernels.h's kiln_cuda_mv_tail): 0 none, 1 prepare y, 2 norm y */
    int tail;
    unsigned *cnt;
    int8_t *oq;            /* (T, rows) the output's codes */
    float2 *ods;           /* (T, rows / 32) */
    float *xb;             /* (T, rows) NORM */
    const float *nw;       /* (rows) NORM */
    float eps;
    /* the prologue (kiln_cuda_mv_tail's pre_x; T 1): each CTA prepares x in shared memory from pre_x, normed by pre_w
     * (RMSNorm, pre_eps) when it is given, in the order of a residual norm kernel of pre_ntv threads; CTA 0 also
     * writes pre_xb (the normed x, when given) and the prepared bytes to pre_oq, pre_ods */
    const float *pre_x, *pre_w;
    float pre_eps;
    int pre_ntv;
    float *pre_xb;
    int8_t *pre_oq;
    float2 *pre_ods;
    /* L2 prefetch spans (kiln_cuda_mv_tail's pf), issued by the grid's last pf_ctas CTAs in chunks of MV_PF_CHUNK */
    const uint8_t *pf[4];
    size_t pf_bytes[4];
    int pf_ctas;
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

/* The x side of the pieces that are one 32-block (x block p) or two (Q4_K, Q5_K, IQ4_XS: x blocks 2p, 2p+1). */
struct piece_x1 {
    static const int ELEMS = 32;
    typedef xblock X;
    static __device__ __forceinline__ void load_x(X &x, const mv_args &a, int t, int64_t p) { x.load(a, t, p); }
};

struct piece_x2 {
    static const int ELEMS = 64;
    typedef xblock2 X;
    static __device__ __forceinline__ void load_x(X &x, const mv_args &a, int t, int64_t p) {
        x.b[0].load(a, t, 2 * p), x.b[1].load(a, t, 2 * p + 1);
    }
};

/* The integer dot of 8 words of int8 weights with an x block's codes. */
static __device__ __forceinline__ int dot_words8(const uint32_t *v, const int *q) {
    int s = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) s = __dp4a((int)v[i], q[i], s);
    return s;
}

/* The integer dot of a 32-block's 16 nibble bytes (Q4_0, Q4_1: word i holds elements 4i.. in its low nibbles and
 * 16 + 4i.. in its high ones) with its x block's codes. */
static __device__ __forceinline__ int dot_nibbles(const uint32_t *v, const int *q) {
    int s = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        s = __dp4a((int)(v[i] & 0x0F0F0F0F), q[i], s);            /* elements 4i..4i+3 */
        s = __dp4a((int)((v[i] >> 4) & 0x0F0F0F0F), q[i + 4], s); /* elements 16+4i.. */
    }
    return s;
}

/* Q4_0, 18 bytes per 32: x = d * (q - 8). Piece = one block. sum((q - 8) * xq) * dx = dx * sum(q * xq) - 8 * s. */
struct piece_q4_0 : piece_x1 {
    uint32_t v[4];
    float d;
    __device__ __forceinline__ void load(const uint8_t *row, int64_t p) {
        const uint8_t *b = row + p * sizeof(block_q4_0);
        d = h2f(ld_u16(b));
        ld_words_a2<4>(b + 2, v);
    }
    __device__ __forceinline__ float dot(const X &x) const {
        const int s = dot_nibbles(v, x.q);
        return d * (x.ds.x * (float)s - 8.0f * x.ds.y);
    }
};

/* Q4_1, 20 bytes per 32: x = d * q + m, so the dot is d * dx * sum(q * xq) + m * s. */
struct piece_q4_1 : piece_x1 {
    uint32_t v[4];
    float d, m;
    __device__ __forceinline__ void load(const uint8_t *row, int64_t p) {
        const uint8_t *b = row + p * sizeof(block_q4_1);
        const uint32_t dm = ld_u32(b);
        d = h2f((uint16_t)dm), m = h2f((uint16_t)(dm >> 16));
#pragma unroll
        for (int i = 0; i < 4; i++) v[i] = ld_u32(b + 4 + 4 * i);
    }
    __device__ __forceinline__ float dot(const X &x) const {
        const int s = dot_nibbles(v, x.q);
        return d * x.ds.x * (float)s + m * x.ds.y;
    }
};

/* Bits 0..3 of h to bit 4 of bytes 0..3: the fifth bit of four 5-bit quants. */
static __device__ __forceinline__ uint32_t spread4(uint32_t h) {
    return ((h & 1) << 4) | ((h & 2) << 11) | ((h & 4) << 18) | ((h & 8) << 25);
}

/* Q5_0, 22 bytes per 32: x = d * (q - 16); bit j of qh is bit 4 of element j. */
struct piece_q5_0 : piece_x1 {
    uint32_t v[4], qh;
    float d;
    __device__ __forceinline__ void load(const uint8_t *row, int64_t p) {
        const uint8_t *b = row + p * sizeof(block_q5_0);
        d = h2f(ld_u16(b));
        ld_words_a2<1>(b + 2, &qh);
        ld_words_a2<4>(b + 6, v);
    }
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
struct piece_q8_0 : piece_x1 {
    uint32_t v[8];
    float d;
    __device__ __forceinline__ void load(const uint8_t *row, int64_t p) {
        const uint8_t *b = row + p * sizeof(block_q8_0);
        d = h2f(ld_u16(b));
        ld_words_a2<8>(b + 2, v);
    }
    __device__ __forceinline__ float dot(const X &x) const { return d * x.ds.x * (float)dot_words8(v, x.q); }
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
struct piece_q4_K : piece_x2 {
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
struct piece_q5_K : piece_x2 {
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
struct piece_q5_1 : piece_x1 {
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
struct piece_iq4_nl : piece_x1 {
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
    __device__ __forceinline__ float dot(const X &x) const { return d * x.ds.x * (float)dot_words8(v, x.q); }
};

/* IQ4_XS, 136 bytes per 256 (8-byte aligned): piece = sub-blocks 2c, 2c+1 (c = p % 4) of block p / 4, whose 32 qs
 * bytes at 8 + 32c are two IQ4_NL payloads; x = d * (sc - 32) * level(q), so no min term. */
struct piece_iq4_xs : piece_x2 {
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

#endif
