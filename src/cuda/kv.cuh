/* kv.cuh: the KV cache's element types on the GPU (kiln_kv_type, -ctk/-ctv): reading 8 elements of a cached row as
 * float (attention.cu) and writing a row (elementwise.cu's qkv_post and kv_quantize). The layouts are the CPU's
 * (src/core/quants.h): f16, f32, bf16 elements, or GGUF blocks of 32 along the row (q8_0: an f16 scale then 32 int8,
 * 34 bytes; q4_0: an f16 scale then 16 bytes, element j in the low nibble of byte j and j + 16 in the high one, 18
 * bytes), and a block never spans two rows (the session asks NKV*HS % 32 == 0). Dequantization is the CPU's
 * (quants_ref.c): code times scale, one float product, so both backends read the same floats from the same bytes.
 * tests/test_cuda_attention.c checks attention over each type against the CPU's, and tests/test_cuda_engine.c a
 * session's logits with each cache type against the CPU session with the same type. */
#ifndef KILN_CUDA_KV_CUH
#define KILN_CUDA_KV_CUH

#include "kiln.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

/* Bytes of a block of 32 of q8_0 and q4_0 (quants.h's block_q8_0, block_q4_0). */
#define KILN_KV_Q8_0_BYTES 34
#define KILN_KV_Q4_0_BYTES 18

/* Elements e .. e + 7 (e a multiple of 8, counted from the cache's start: row r's element i is r * row + i) of a
 * cache of type t, as float. */
static __device__ __forceinline__ void kiln_kv_load8(int t, const void *cache, size_t e, float *f) {
    switch (t) {
    case KILN_KV_F32: {
        const float4 a = *(const float4 *)((const float *)cache + e), b = *(const float4 *)((const float *)cache + e + 4);
        f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
        return;
    }
    case KILN_KV_BF16: {
        const uint4 u = *(const uint4 *)((const uint16_t *)cache + e);
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int i = 0; i < 4; i++) f[2 * i] = __uint_as_float(w[i] << 16), f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
        return;
    }
    case KILN_KV_Q8_0: {
        const uint8_t *blk = (const uint8_t *)cache + e / 32 * KILN_KV_Q8_0_BYTES;
        const float d = __half2float(*(const __half *)blk);
        const int8_t *qs = (const int8_t *)blk + 2 + e % 32;
#pragma unroll
        for (int i = 0; i < 8; i++) f[i] = (float)qs[i] * d;
        return;
    }
    case KILN_KV_Q4_0: {
        const uint8_t *blk = (const uint8_t *)cache + e / 32 * KILN_KV_Q4_0_BYTES;
        const float d = __half2float(*(const __half *)blk);
        const int w = (int)(e % 32), shift = w < 16 ? 0 : 4;
        const uint8_t *qs = blk + 2 + (w & 15);
#pragma unroll
        for (int i = 0; i < 8; i++) f[i] = (float)(((qs[i] >> shift) & 0x0F) - 8) * d;
        return;
    }
    default: { /* KILN_KV_F16 */
        const __half2 *h = (const __half2 *)((const __half *)cache + e);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float2 x = __half22float2(h[i]);
            f[2 * i] = x.x, f[2 * i + 1] = x.y;
        }
        return;
    }
    }
}

/* Element e of an f16, f32 or bf16 cache = x, rounded to nearest even (kiln_f32_to_fp16 / kiln_f32_to_bf16 for
 * finite x). The block types are written a block at a time (kiln_cuda_kv_quantize). */
static __device__ __forceinline__ void kiln_kv_store1(int t, void *cache, size_t e, float x) {
    if (t == KILN_KV_F32)
        ((float *)cache)[e] = x;
    else if (t == KILN_KV_BF16)
        ((uint16_t *)cache)[e] = __bfloat16_as_ushort(__float2bfloat16_rn(x));
    else
        ((uint16_t *)cache)[e] = __half_as_ushort(__float2half_rn(x));
}

static __host__ __device__ __forceinline__ bool kiln_kv_is_block(int t) { return t == KILN_KV_Q8_0 || t == KILN_KV_Q4_0; }

/* One block of 32 of a q8_0 or q4_0 cache from a whole warp, lane l holding element l (x): quantized as
 * quants_ref.c does it, with every product and quotient rounded once (__fmul_rn, __fdiv_rn: no contraction into
 * an fma), so the bytes are the CPU's: q8_0 d = amax / 127, q = roundf(x / d) clamped to +-127; q4_0 d = (the
 * element of largest magnitude, the first such) / -8, q = min(15, trunc(x / d + 8.5)). d = 0 (or 1/d not finite)
 * gives id 0. kv_quantize_kernel (elementwise.cu) and the fused decode epilogue (attention.cu) both write with it. */
static __device__ __forceinline__ void kiln_kv_quantize_warp(uint8_t *blk, float x, bool q8) {
    const int lane = threadIdx.x % 32;
    float a = fabsf(x), d;
    if (q8) {
        for (int off = 16; off > 0; off /= 2) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, off));
        d = __fdiv_rn(a, 127.0f);
    } else {
        int idx = lane; /* the first lane of the largest |x| */
        for (int off = 16; off > 0; off /= 2) {
            const float oa = __shfl_xor_sync(0xffffffffu, a, off);
            const int oi = __shfl_xor_sync(0xffffffffu, idx, off);
            if (oa > a || (oa == a && oi < idx)) a = oa, idx = oi;
        }
        const float mx = __shfl_sync(0xffffffffu, x, idx);
        d = __fdiv_rn(a > 0.0f ? mx : 0.0f, -8.0f);
    }
    float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
    if (!isfinite(id)) id = 0.0f;
    if (lane == 0) *(__half *)blk = __float2half_rn(d);
    if (q8) {
        float v = __fmul_rn(x, id);
        v = v != v ? 0.0f : fminf(fmaxf(v, -127.0f), 127.0f);
        blk[2 + lane] = (uint8_t)(int8_t)roundf(v);
    } else {
        const float v = __fadd_rn(__fmul_rn(x, id), 8.5f);
        const int c = !(v >= 0.0f) ? 0 : v < 15.0f ? (int)v : 15;
        const int hi = __shfl_down_sync(0xffffffffu, c, 16);
        if (lane < 16) blk[2 + lane] = (uint8_t)(c | hi << 4);
    }
}

#endif
