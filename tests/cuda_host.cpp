/* cuda_host.cpp: the CUDA decoders of every block format, compiled for the host (tests/test_cuda_host.sh), so a
 * machine without a GPU checks them: matvec_pieces.cuh (the decode matvec's pieces), gemm_dq.cuh (the prefill's
 * bf16 dequantization), gemm_small_dq.cuh (the few-row int8 matmul's fragments) and blocks.cuh (the element decoders of dequant.cu and the embed). The CUDA intrinsics they
 * use get the stand-ins below, written from the CUDA documentation (__byte_perm takes bits 2:0 of each selector
 * nibble and ignores the selector's upper 16 bits; __dp4a sums four signed byte products; __funnelshift_r shifts
 * the 64-bit hi:lo by sh & 31). For each type, on random blocks (cuda_host_ref.c):
 *   - the pieces' dot products, accumulated piece by piece as a kernel thread does, against a double-precision dot
 *     of the reference dequantization with x as matvec_prepare rounds it: NMSE < 1e-10 (measured 1e-14: only the
 *     fp32 summation differs), over 33 rows of 2304 (odd rows start 2 mod 4 for the 110- and 210-byte blocks);
 *   - every Dq::run and every element decoder against the reference, bit for bit;
 *   - gemm_small_dq.cuh's fragment decoders, every weight of every lane against the reference (check_gq).
 * Prints "ok NAME" / "FAIL NAME: why" lines for tests/run.sh. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <vector>

extern "C" {
#include "kiln.h"
#include "fp16.h"
#include "quants.h"
void host_ref_blocks(kiln_type t, uint8_t *buf, int64_t n, unsigned long long *seed);
void host_ref_to_float(kiln_type t, const void *x, float *y, int64_t n);
unsigned long long host_ref_rng(unsigned long long *seed);
float host_ref_f32(unsigned long long *seed);
}

/* ---------------------------------------------------------------- stand-ins for CUDA */
#define __device__
#define __forceinline__ inline
struct int4 { int x, y, z, w; };
struct uint4 { uint32_t x, y, z, w; };
struct uint2 { uint32_t x, y; };
struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
static inline float2 make_float2(float a, float b) { return float2{a, b}; }
static inline uint16_t __ushort_as_half(uint16_t h) { return h; }
static inline float __half2float(uint16_t h) { return kiln_fp16_to_f32(h); }
static inline float __uint_as_float(uint32_t u) { return kiln_bits_f32(u); }
static inline float __int_as_float(int32_t u) { return kiln_bits_f32((uint32_t)u); }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; i++) c += (int)(int8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i));
    return c;
}
static inline uint32_t __byte_perm(uint32_t x, uint32_t y, uint32_t s) {
    const uint64_t v = ((uint64_t)y << 32) | x;
    uint32_t r = 0;
    for (int i = 0; i < 4; i++) r |= (uint32_t)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xFF) << (8 * i);
    return r;
}
static inline uint32_t __funnelshift_r(uint32_t lo, uint32_t hi, uint32_t sh) {
    return (uint32_t)((((uint64_t)hi << 32) | lo) >> (sh & 31));
}
static inline uint32_t __vsub4(uint32_t a, uint32_t b) {
    uint32_t r = 0;
    for (int i = 0; i < 4; i++) r |= (uint32_t)(((a >> (8 * i)) - (b >> (8 * i))) & 0xFF) << (8 * i);
    return r;
}

/* The two headers each define a static h2f; namespaces keep them apart. blocks.cuh comes first, outside both. */
#include "cuda/blocks.cuh"
namespace mv {
#include "cuda/matvec_pieces.cuh"
}
namespace dq {
#include "cuda/gemm_dq.cuh"
}
namespace gq {
#include "cuda/gemm_small_dq.cuh"
}

static int failures;

/* ---------------------------------------------------------------- matvec pieces */

template <class P>
static void check_pieces(const char *name, kiln_type t, unsigned long long *rng) {
    const int64_t rows = 33, cols = 2304, T = 3;
    const size_t rb = kiln_type_row_bytes(t, cols);
    std::vector<uint8_t> w(rb * rows + 16);
    host_ref_blocks(t, w.data(), rows * cols, rng);
    std::vector<float> deq(rows * cols), x(T * cols), xr(T * cols);
    host_ref_to_float(t, w.data(), deq.data(), rows * cols);
    for (float &v : x) v = host_ref_f32(rng);
    const int64_t nbx = cols / 32;
    std::vector<int8_t> xq(T * cols);
    std::vector<float2> xds(T * nbx);
    for (int64_t b = 0; b < T * nbx; b++) { /* matvec_prepare's rounding (q8.cuh) */
        const float *xb = &x[32 * b];
        float amax = 0.0f;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(xb[i]));
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        int sum = 0;
        for (int i = 0; i < 32; i++) {
            const int q = (int)roundf(xb[i] * id);
            xq[32 * b + i] = (int8_t)q, sum += q, xr[32 * b + i] = d * (float)q;
        }
        xds[b] = make_float2(d, d * (float)sum);
    }
    mv::mv_args a = {};
    a.row_bytes = rb, a.rows = rows, a.cols = cols, a.xq = xq.data(), a.xds = xds.data(), a.ppr = cols / P::ELEMS;
    double num = 0, den = 0;
    for (int t8 = 0; t8 < T; t8++)
        for (int64_t o = 0; o < rows; o++) {
            float acc = 0.0f;
            for (int64_t p = 0; p < a.ppr; p++) {
                P wp;
                wp.load(w.data() + o * rb, p);
                typename P::X xx;
                P::load_x(xx, a, t8, p);
                acc += wp.dot(xx);
            }
            double ref = 0;
            for (int64_t i = 0; i < cols; i++) ref += (double)deq[o * cols + i] * xr[t8 * cols + i];
            num += ((double)acc - ref) * ((double)acc - ref), den += ref * ref;
        }
    const double nmse = num / den;
    if (nmse < 1e-10) printf("ok host_matvec_piece_%s\n", name);
    else printf("FAIL host_matvec_piece_%s: NMSE %.3g against the double reference (bound 1e-10)\n", name, nmse), failures++;
}

/* ---------------------------------------------------------------- gemm_small's fragment decoders */

/* Every weight of 9 rows of 2304 (odd rows start 2 mod 4 for the 18-, 22-, 34- and 210-byte blocks), as each lane c
 * of a row's quad decodes it for each 32 j of each 256: s * q + m (s0 for the first 16 of a SPLIT type's 32, s1
 * for the second) against the reference dequantization, within 1e-6 of the largest |weight| (the reference
 * multiplies in another order: d * sc * q - dmin * m against (d * sc) * q + (-dmin * m)). */
template <class D>
static void check_gq(const char *name, kiln_type t, unsigned long long *rng) {
    const int64_t rows = 9, cols = 2304;
    const size_t rb = kiln_type_row_bytes(t, cols);
    std::vector<uint8_t> w(rb * rows + 16);
    host_ref_blocks(t, w.data(), rows * cols, rng);
    std::vector<float> ref(rows * cols);
    host_ref_to_float(t, w.data(), ref.data(), rows * cols);
    float amax = 0.0f;
    for (float v : ref) amax = fmaxf(amax, fabsf(v));
    for (int64_t o = 0; o < rows; o++)
        for (int64_t sb = 0; sb < cols / 256; sb++)
            for (int c = 0; c < 4; c++) {
                D d;
                d.load(w.data() + o * rb + sb * D::BLOCK_BYTES, c);
                for (int j = 0; j < 8; j++) {
                    uint32_t lo, hi;
                    float s0, s1, m;
                    d.chunk(j, c, lo, hi, s0, s1, m);
                    for (int i = 0; i < 8; i++) {
                        const int k = 32 * j + (i < 4 ? 4 * c + i : 16 + 4 * c + i - 4);
                        const int q = (int8_t)((i < 4 ? lo : hi) >> (8 * (i % 4)));
                        const float got = (D::SPLIT && i >= 4 ? s1 : s0) * (float)q + m, want = ref[o * cols + 256 * sb + k];
                        if (!(fabsf(got - want) <= 1e-6f * amax)) {
                            printf("FAIL host_gemm_small_%s: row %lld, weight %lld (lane %d, 32 %d): decoded %.9g, reference %.9g\n", name,
                                   (long long)o, (long long)(256 * sb + k), c, j, got, want);
                            failures++;
                            return;
                        }
                    }
                }
            }
    printf("ok host_gemm_small_%s\n", name);
}

/* ---------------------------------------------------------------- bf16 prefill decoders, element decoders */

template <class D>
static void check_dq(const char *name, kiln_type t, float (*elem)(const void *, int64_t), unsigned long long *rng) {
    const int64_t n = 2304 * 9;
    std::vector<uint8_t> w(kiln_type_row_bytes(t, n));
    host_ref_blocks(t, w.data(), n, rng);
    std::vector<float> ref(n);
    host_ref_to_float(t, w.data(), ref.data(), n);
    for (int64_t g = 0; g < n / 8; g++) {
        float v[8];
        D::run(w.data(), g, v);
        for (int i = 0; i < 8; i++)
            if (memcmp(&v[i], &ref[8 * g + i], 4)) {
                printf("FAIL host_dq_%s: element %lld: gemm_dq %.9g, reference %.9g\n", name, (long long)(8 * g + i), v[i],
                       ref[8 * g + i]);
                failures++;
                return;
            }
    }
    for (int64_t e = 0; elem && e < n; e++) {
        const float v = elem(w.data(), e);
        if (memcmp(&v, &ref[e], 4)) {
            printf("FAIL host_dq_%s: element %lld: blocks.cuh %.9g, reference %.9g\n", name, (long long)e, v, ref[e]);
            failures++;
            return;
        }
    }
    printf("ok host_dq_%s\n", name);
}

int main(void) {
    unsigned long long rng = 0x686f7374ULL;
    check_pieces<mv::piece_q4_0>("q4_0", KILN_TYPE_Q4_0, &rng);
    check_pieces<mv::piece_q4_1>("q4_1", KILN_TYPE_Q4_1, &rng);
    check_pieces<mv::piece_q5_0>("q5_0", KILN_TYPE_Q5_0, &rng);
    check_pieces<mv::piece_q5_1>("q5_1", KILN_TYPE_Q5_1, &rng);
    check_pieces<mv::piece_q8_0>("q8_0", KILN_TYPE_Q8_0, &rng);
    check_pieces<mv::piece_iq4_nl>("iq4_nl", KILN_TYPE_IQ4_NL, &rng);
    check_pieces<mv::piece_q2_K>("q2_K", KILN_TYPE_Q2_K, &rng);
    check_pieces<mv::piece_q3_K>("q3_K", KILN_TYPE_Q3_K, &rng);
    check_pieces<mv::piece_q4_K>("q4_K", KILN_TYPE_Q4_K, &rng);
    check_pieces<mv::piece_q5_K>("q5_K", KILN_TYPE_Q5_K, &rng);
    check_pieces<mv::piece_q6_K>("q6_K", KILN_TYPE_Q6_K, &rng);
    check_pieces<mv::piece_iq4_xs>("iq4_xs", KILN_TYPE_IQ4_XS, &rng);
    check_gq<gq::gq_q4_0>("q4_0", KILN_TYPE_Q4_0, &rng);
    check_gq<gq::gq_q4_1>("q4_1", KILN_TYPE_Q4_1, &rng);
    check_gq<gq::gq_q5_0>("q5_0", KILN_TYPE_Q5_0, &rng);
    check_gq<gq::gq_q8_0>("q8_0", KILN_TYPE_Q8_0, &rng);
    check_gq<gq::gq_q4_K>("q4_K", KILN_TYPE_Q4_K, &rng);
    check_gq<gq::gq_q5_K>("q5_K", KILN_TYPE_Q5_K, &rng);
    check_gq<gq::gq_q6_K>("q6_K", KILN_TYPE_Q6_K, &rng);
    check_dq<dq::dq_q4_0>("q4_0", KILN_TYPE_Q4_0, NULL, &rng);
    check_dq<dq::dq_q4_1>("q4_1", KILN_TYPE_Q4_1, NULL, &rng);
    check_dq<dq::dq_q5_0>("q5_0", KILN_TYPE_Q5_0, NULL, &rng);
    check_dq<dq::dq_q5_1>("q5_1", KILN_TYPE_Q5_1, dequant_elem_q5_1, &rng);
    check_dq<dq::dq_q8_0>("q8_0", KILN_TYPE_Q8_0, NULL, &rng);
    check_dq<dq::dq_iq4_nl>("iq4_nl", KILN_TYPE_IQ4_NL, dequant_elem_iq4_nl, &rng);
    check_dq<dq::dq_q2_K>("q2_K", KILN_TYPE_Q2_K, dequant_elem_q2_K, &rng);
    check_dq<dq::dq_q3_K>("q3_K", KILN_TYPE_Q3_K, dequant_elem_q3_K, &rng);
    check_dq<dq::dq_q4_K>("q4_K", KILN_TYPE_Q4_K, NULL, &rng);
    check_dq<dq::dq_q5_K>("q5_K", KILN_TYPE_Q5_K, NULL, &rng);
    check_dq<dq::dq_q6_K>("q6_K", KILN_TYPE_Q6_K, NULL, &rng);
    check_dq<dq::dq_iq4_xs>("iq4_xs", KILN_TYPE_IQ4_XS, dequant_elem_iq4_xs, &rng);
    return failures ? 1 : 0;
}
