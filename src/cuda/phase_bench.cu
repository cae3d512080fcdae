/* phase_bench.cu: what a dependency between two phases of GPU work costs, the question a persistent decode kernel
 * answers (issue #23): a decode step is a chain of phases (a matvec, the norm, the attention, ...) in which every
 * phase needs the whole result of the one before. kiln runs each phase as a kernel in a CUDA graph, launched with
 * PDL (launch.h); a persistent kernel would run all of them in one launch with a CTA per SM and a grid-wide barrier
 * between phases. kiln_cuda_phase_bench measures the time per phase of both for the same trivial work: each CTA
 * reads its own bytes_per_cta of a buffer (16-byte loads, the slice moving every phase; the buffer fits in L2, so
 * this is the latency of a phase, not HBM's bandwidth) and adds one float to out.
 *   - kernels: n_phases kernels of one CTA per SM, captured into a graph and replayed; us[0] without PDL, us[1]
 *     with it (each kernel waits on griddepcontrol.wait, as kiln's do);
 *   - barrier: one kernel of one CTA per SM (all resident), the phases separated by a grid barrier: after a
 *     __syncthreads, thread 0 of each CTA adds 1 to a counter (red.release.gpu) and polls it (ld.acquire.gpu) until
 *     it reaches (phase + 1) x the CTAs; the counter only grows, so no reset and no second atomic. us[2].
 * Each figure is the best of 5 replays of n_phases phases, divided by n_phases. bench_gpu_kernels.c's --phases
 * prints them. */
#include "cuda/kernels.h"
#include "cuda/launch.h"

#include <cuda_runtime.h>

/* One phase's work for a CTA: the sum of its slice of n4 float4s (ncta slices, shifted by the phase). */
static __device__ __forceinline__ float phase_work(const float4 *buf, size_t n4, size_t span, int phase) {
    const size_t per = n4 / gridDim.x, base = ((size_t)phase * 7919 + (size_t)blockIdx.x * per) % span;
    float acc = 0.0f;
    for (size_t i = threadIdx.x; i < per; i += blockDim.x) {
        const float4 v = buf[(base + i) % span];
        acc += v.x + v.y + v.z + v.w;
    }
    for (int o = 16; o > 0; o /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    return acc;
}

__global__ void phase_kernel(const float4 *buf, size_t n4, size_t span, float *out, int phase, bool pdl) {
    if (pdl) kiln_pdl_wait(), kiln_pdl_trigger();
    const float a = phase_work(buf, n4, span, phase);
    if (threadIdx.x == 0) out[blockIdx.x] += a;
}

__global__ void phase_persistent(const float4 *buf, size_t n4, size_t span, float *out, int n_phases, unsigned *count,
                                 unsigned base) {
    for (int p = 0; p < n_phases; p++) {
        const float a = phase_work(buf, n4, span, p);
        if (threadIdx.x == 0) out[blockIdx.x] += a;
        __syncthreads();
        if (threadIdx.x == 0) {
            const unsigned target = base + (unsigned)(p + 1) * gridDim.x;
            asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(count) : "memory");
            unsigned v;
            do asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(count) : "memory");
            while (v < target);
        }
        __syncthreads();
    }
}

#define PB_THREADS 256
#define PB_REPS 5

static kiln_status ck(const char *what, cudaError_t e) {
    return e == cudaSuccess ? KILN_OK : kiln_fail(KILN_ERR_IO, "cuda phase bench: %s: %s", what, cudaGetErrorString(e));
}
#define CKP(what, x)                     \
    do {                                 \
        if ((st = ck(what, (x))) != KILN_OK) goto done; \
    } while (0)

extern "C" kiln_status kiln_cuda_phase_bench(int n_phases, size_t bytes_per_cta, int *n_cta, double us[3]) {
    if (n_phases < 1 || n_phases > 100000 || bytes_per_cta > ((size_t)1 << 20))
        return kiln_fail(KILN_ERR_INVALID, "cuda phase bench: %d phases (1..100000), %zu bytes a CTA (at most 1 MiB)", n_phases,
                         bytes_per_cta);
    int nsm = 0;
    kiln_status st = ck("device attribute", cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, 0));
    if (st) return st;
    const size_t n4 = (bytes_per_cta ? bytes_per_cta / 16 : 1) * (size_t)nsm, span = n4 * 4;
    float4 *buf = NULL;
    float *out = NULL;
    unsigned *count = NULL;
    cudaStream_t s = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    cudaGraph_t g = NULL;
    cudaGraphExec_t ge = NULL;
    unsigned base = 0;
    float best = 0, ms = 0;
    *n_cta = nsm;
    CKP("cudaMalloc", cudaMalloc(&buf, span * sizeof(float4)));
    CKP("cudaMalloc", cudaMalloc(&out, sizeof(float) * (size_t)nsm));
    CKP("cudaMalloc", cudaMalloc(&count, sizeof(unsigned)));
    CKP("cudaMemset", cudaMemset(buf, 0, span * sizeof(float4)));
    CKP("cudaMemset", cudaMemset(out, 0, sizeof(float) * (size_t)nsm));
    CKP("cudaMemset", cudaMemset(count, 0, sizeof(unsigned)));
    CKP("cudaStreamCreate", cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CKP("cudaEventCreate", cudaEventCreate(&e0));
    CKP("cudaEventCreate", cudaEventCreate(&e1));
    for (int pdl = 0; pdl < 2; pdl++) {
        CKP("capture", cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        for (int p = 0; p < n_phases; p++) {
            cudaError_t e = pdl ? kiln_launch(phase_kernel, dim3((unsigned)nsm), dim3(PB_THREADS), 0, s, (const float4 *)buf, n4, span, out, p, true)
                                : (phase_kernel<<<nsm, PB_THREADS, 0, s>>>(buf, n4, span, out, p, false), cudaGetLastError());
            if (e != cudaSuccess) {
                cudaStreamEndCapture(s, &g);
                CKP("launch", e);
            }
        }
        CKP("capture", cudaStreamEndCapture(s, &g));
        CKP("instantiate", cudaGraphInstantiate(&ge, g, 0));
        best = 1e30f;
        for (int r = 0; r <= PB_REPS; r++) { /* replay 0 warms up */
            CKP("event", cudaEventRecord(e0, s));
            CKP("replay", cudaGraphLaunch(ge, s));
            CKP("event", cudaEventRecord(e1, s));
            CKP("sync", cudaEventSynchronize(e1));
            CKP("elapsed", cudaEventElapsedTime(&ms, e0, e1));
            if (r && ms < best) best = ms;
        }
        us[pdl] = 1000.0 * best / n_phases;
        cudaGraphExecDestroy(ge), ge = NULL;
        cudaGraphDestroy(g), g = NULL;
    }
    best = 1e30f;
    for (int r = 0; r <= PB_REPS; r++) {
        CKP("event", cudaEventRecord(e0, s));
        phase_persistent<<<nsm, PB_THREADS, 0, s>>>(buf, n4, span, out, n_phases, count, base);
        CKP("launch", cudaGetLastError());
        base += (unsigned)n_phases * (unsigned)nsm;
        CKP("event", cudaEventRecord(e1, s));
        CKP("sync", cudaEventSynchronize(e1));
        CKP("elapsed", cudaEventElapsedTime(&ms, e0, e1));
        if (r && ms < best) best = ms;
    }
    us[2] = 1000.0 * best / n_phases;
done:
    if (ge) cudaGraphExecDestroy(ge);
    if (g) cudaGraphDestroy(g);
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    if (s) cudaStreamDestroy(s);
    cudaFree(buf), cudaFree(out), cudaFree(count);
    return st;
}
