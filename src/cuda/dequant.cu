/* dequant.cu: GPU dequantization of the GGUF block formats to float.
 * One thread per output element, consecutive threads on consecutive elements so stores coalesce; the
 * block header a warp shares is read once per thread from L1. The arithmetic uses explicit
 * round-to-nearest intrinsics (__fmul_rn, __fadd_rn) in the scalar reference's order, so nvcc cannot fuse
 * into FMAs and results equal the CPU oracle bit for bit (tests/test_cuda.c). */
#include "cuda/blocks.cuh"
#include "cuda/cuda.h"
#include "quants.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdio.h>

#include "status.h"

static __device__ __forceinline__ float h2f(kiln_fp16 h) { return __half2float(__ushort_as_half(h)); }

static __device__ __forceinline__ void scale_min_k4(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

__global__ void dequant_f16(const kiln_fp16 *x, float *y, int64_t k) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < k) y[i] = h2f(x[i]);
}

__global__ void dequant_bf16(const kiln_bf16 *x, float *y, int64_t k) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < k) y[i] = __uint_as_float((uint32_t)x[i] << 16);
}

__global__ void dequant_q4_0(const block_q4_0 *x, float *y, int64_t k) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= k) return;
    const block_q4_0 *b = &x[i / QK4_0];
    int j = (int)(i % QK4_0);
    int q = j < 16 ? (b->qs[j] & 0xF) : (b->qs[j - 16] >> 4);
    y[i] = __fmul_rn((float)(q - 8), h2f(b->d));
}

__global__ void dequant_q4_1(const block_q4_1 *x, float *y, int64_t k) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= k) return;
    const block_q4_1 *b = &x[i / QK4_1];
    int j = (int)(i % QK4_1);
    int q = j < 16 ? (b->qs[j] & 0xF) : (b->qs[j - 16] >> 4);
    y[i] = __fadd_rn(__fmul_rn((float)q, h2f(b->d)), h2f(b->m));
}

__global__ void dequant_q8_0(const block_q8_0 *x, float *y, int64_t k) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= k) return;
    const block_q8_0 *b = &x[i / QK8_0];
    y[i] = __fmul_rn((float)b->qs[i % QK8_0], h2f(b->d));
}

/* Q4_K and Q5_K: element e of a super-block lies in 64-chunk e/64, sub-block e/32, nibble (e/32)%2. */
__global__ void dequant_q4_K(const block_q4_K *x, float *y, int64_t k) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= k) return;
    const block_q4_K *b = &x[i / QK_K];
    int e = (int)(i % QK_K), sub = e / 32, l = e % 32;
    int sc, m;
    scale_min_k4(sub, b->scales, &sc, &m);
    uint8_t byte = b->qs[32 * (e / 64) + l];
    int q = (sub & 1) ? byte >> 4 : byte & 0xF;
    float d1 = __fmul_rn(h2f(b->d), (float)sc), m1 = __fmul_rn(h2f(b->dmin), (float)m);
    y[i] = __fsub_rn(__fmul_rn(d1, (float)q), m1);
}

__global__ void dequant_q5_K(const block_q5_K *x, float *y, int64_t k) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= k) return;
    const block_q5_K *b = &x[i / QK_K];
    int e = (int)(i % QK_K), sub = e / 32, l = e % 32;
    int sc, m;
    scale_min_k4(sub, b->scales, &sc, &m);
    uint8_t byte = b->qs[32 * (e / 64) + l];
    int q = ((sub & 1) ? byte >> 4 : byte & 0xF) | (((b->qh[l] >> sub) & 1) << 4);
    float d1 = __fmul_rn(h2f(b->d), (float)sc), m1 = __fmul_rn(h2f(b->dmin), (float)m);
    y[i] = __fsub_rn(__fmul_rn(d1, (float)q), m1);
}

/* Q6_K: each 128-half h has ql[64], qh[32], 8 scales; within it element e = 32*g + l takes
 * ql[l + 32*(g&1)] (low nibble for g < 2, high for g >= 2) and qh[l] bits 2g..2g+1. */
__global__ void dequant_q6_K(const block_q6_K *x, float *y, int64_t k) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= k) return;
    const block_q6_K *b = &x[i / QK_K];
    int e = (int)(i % QK_K), h = e / 128, r = e % 128, g = r / 32, l = r % 32;
    const uint8_t *ql = b->ql + 64 * h, *qh = b->qh + 32 * h;
    uint8_t lo = ql[l + 32 * (g & 1)];
    int q = ((g < 2 ? lo & 0xF : lo >> 4) | (((qh[l] >> (2 * g)) & 3) << 4)) - 32;
    int sc = b->scales[8 * h + l / 16 + 2 * g];
    y[i] = __fmul_rn(__fmul_rn(h2f(b->d), (float)sc), (float)q);
}

/* Q5_0: x = d * (q - 16), the low 4 bits as Q4_0 and bit 4 of element j at bit j of qh. */
__global__ void dequant_q5_0(const block_q5_0 *x, float *y, int64_t k) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= k) return;
    const block_q5_0 *b = &x[i / QK5_0];
    int j = (int)(i % QK5_0);
    int q = (j < 16 ? (b->qs[j] & 0xF) : (b->qs[j - 16] >> 4)) | (((b->qh[j >> 3] >> (j & 7)) & 1) << 4);
    y[i] = __fmul_rn((float)(q - 16), h2f(b->d));
}

/* The formats of blocks.cuh, one element per thread through its decoder. */
template <float (*ELEM)(const void *, int64_t)>
__global__ void dequant_blocks(const void *x, float *y, int64_t k) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < k) y[i] = ELEM(x, i);
}

static kiln_status cuda_error(cudaError_t e, const char *what) {
    return kiln_fail(KILN_ERR_IO, "CUDA %s failed: %s", what, cudaGetErrorString(e));
}

extern "C" int kiln_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); /* clear the sticky "no driver" error */
        return 0;
    }
    return n;
}

extern "C" kiln_status kiln_cuda_device_describe(char *buf, size_t n) {
    cudaDeviceProp p;
    cudaError_t e = cudaGetDeviceProperties(&p, 0);
    if (e != cudaSuccess) return cuda_error(e, "cudaGetDeviceProperties");
    snprintf(buf, n, "%s, sm_%d%d, %.1f GiB", p.name, p.major, p.minor, (double)p.totalGlobalMem / (1 << 30));
    return KILN_OK;
}

extern "C" kiln_status kiln_cuda_dequantize(kiln_type t, const void *x, float *y, int64_t k, void *stream) {
    int64_t blck = kiln_type_block_size(t);
    if (blck == 0 || k <= 0 || k % blck)
        return kiln_fail(KILN_ERR_INVALID, "cuda dequantize: %lld elements is not a whole number of %s blocks", (long long)k,
                         kiln_type_name(t) ? kiln_type_name(t) : "?");
    const int threads = 256;
    int64_t grid = (k + threads - 1) / threads;
    if (grid > INT32_MAX) return kiln_fail(KILN_ERR_INVALID, "cuda dequantize: %lld elements is too many for one launch", (long long)k);
    cudaStream_t s = (cudaStream_t)stream;
    switch (t) {
    case KILN_TYPE_F32: {
        cudaError_t e = cudaMemcpyAsync(y, x, (size_t)k * 4, cudaMemcpyDeviceToDevice, s);
        return e == cudaSuccess ? KILN_OK : cuda_error(e, "cudaMemcpyAsync");
    }
    case KILN_TYPE_F16: dequant_f16<<<(unsigned)grid, threads, 0, s>>>((const kiln_fp16 *)x, y, k); break;
    case KILN_TYPE_BF16: dequant_bf16<<<(unsigned)grid, threads, 0, s>>>((const kiln_bf16 *)x, y, k); break;
    case KILN_TYPE_Q4_0: dequant_q4_0<<<(unsigned)grid, threads, 0, s>>>((const block_q4_0 *)x, y, k); break;
    case KILN_TYPE_Q4_1: dequant_q4_1<<<(unsigned)grid, threads, 0, s>>>((const block_q4_1 *)x, y, k); break;
    case KILN_TYPE_Q5_0: dequant_q5_0<<<(unsigned)grid, threads, 0, s>>>((const block_q5_0 *)x, y, k); break;
    case KILN_TYPE_Q5_1: dequant_blocks<dequant_elem_q5_1><<<(unsigned)grid, threads, 0, s>>>(x, y, k); break;
    case KILN_TYPE_IQ4_NL: dequant_blocks<dequant_elem_iq4_nl><<<(unsigned)grid, threads, 0, s>>>(x, y, k); break;
    case KILN_TYPE_Q2_K: dequant_blocks<dequant_elem_q2_K><<<(unsigned)grid, threads, 0, s>>>(x, y, k); break;
    case KILN_TYPE_Q3_K: dequant_blocks<dequant_elem_q3_K><<<(unsigned)grid, threads, 0, s>>>(x, y, k); break;
    case KILN_TYPE_IQ4_XS: dequant_blocks<dequant_elem_iq4_xs><<<(unsigned)grid, threads, 0, s>>>(x, y, k); break;
    case KILN_TYPE_Q8_0: dequant_q8_0<<<(unsigned)grid, threads, 0, s>>>((const block_q8_0 *)x, y, k); break;
    case KILN_TYPE_Q4_K: dequant_q4_K<<<(unsigned)grid, threads, 0, s>>>((const block_q4_K *)x, y, k); break;
    case KILN_TYPE_Q5_K: dequant_q5_K<<<(unsigned)grid, threads, 0, s>>>((const block_q5_K *)x, y, k); break;
    case KILN_TYPE_Q6_K: dequant_q6_K<<<(unsigned)grid, threads, 0, s>>>((const block_q6_K *)x, y, k); break;
    default: return kiln_fail(KILN_ERR_UNSUPPORTED, "cuda dequantize: type %s is not supported", kiln_type_name(t) ? kiln_type_name(t) : "?");
    }
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? KILN_OK : cuda_error(e, "kernel launch");
}

extern "C" kiln_status kiln_cuda_dequantize_host(kiln_type t, const void *x, float *y, int64_t k) {
    size_t in_bytes = kiln_type_row_bytes(t, k);
    if (!in_bytes) return KILN_ERR_INVALID;
    void *dx = NULL;
    float *dy = NULL;
    kiln_status st = KILN_OK;
    cudaError_t e;
    if ((e = cudaMalloc(&dx, in_bytes)) != cudaSuccess || (e = cudaMalloc((void **)&dy, (size_t)k * sizeof(float))) != cudaSuccess)
        st = cuda_error(e, "cudaMalloc");
    else if ((e = cudaMemcpy(dx, x, in_bytes, cudaMemcpyHostToDevice)) != cudaSuccess)
        st = cuda_error(e, "cudaMemcpy to device");
    else if ((st = kiln_cuda_dequantize(t, dx, dy, k, NULL)) == KILN_OK &&
             (e = cudaMemcpy(y, dy, (size_t)k * sizeof(float), cudaMemcpyDeviceToHost)) != cudaSuccess)
        st = cuda_error(e, "cudaMemcpy to host");
    cudaFree(dx);
    cudaFree(dy);
    return st;
}
