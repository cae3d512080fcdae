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

#endif
