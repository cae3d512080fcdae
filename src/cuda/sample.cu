/* sample.cu: the sampler on the GPU, so a non-greedy decode step reads back its token alone. It runs the CPU
 * sampler's pipeline (src/infer/sampler.c) on one row of logits in one CTA of 1024 threads: the penalties, then
 * greedy at temp 0, else logits / temp -> top-k -> softmax -> min-p -> top-p, and the draw with the coin the host's
 * RNG gave the step (kiln_sample_args, src/model/sample_args.h), so a seeded run draws the same coins either side.
 *
 * The choices where a GPU differs from the host:
 *   - top-k is a radix select of the k-th largest logit (four passes of 8 bits over an order-preserving key, the
 *     counts of each pass's bins gathered a warp at a time with __match_any_sync), the lowest indices kept among
 *     equal logits at the boundary, as the host's heap does; a k of up to 4096 survivors is then compacted into
 *     shared memory in index order, and the rest of the pipeline reads k values instead of V (the dropped ones
 *     would add exact zeros);
 *   - the sums (softmax, min-p, the cumulative probabilities) run in a fixed tree order, so a step gives the same
 *     token every run; the host sums in index order, so the two agree up to float rounding at a cdf boundary;
 *   - the draw without top-p walks the cdf in index order (sample_mult): per-thread slices of consecutive indices,
 *     their sums scanned, and the first index whose running sum passes the coin;
 *   - top-p sorts the candidates (probability >= (1 - p) / (V - 1), as sample_topp's prefilter) with a bitonic sort
 *     by (probability descending, index ascending), the order of the host's qsort: in shared memory up to 4096 of
 *     them, in the workspace beyond (slower, still exact).
 * tests/test_cuda_sample.c compares the token with kiln_sampler_sample's on the same logits and coins. */
#include "cuda/kernels.h"
#include "cuda/launch.h"

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "status.h"

#define SMP_THREADS 1024
#define SMP_WARPS (SMP_THREADS / 32)
#define SMP_SORT_SHARED 4096 /* candidates sorted in shared memory */

struct smp_shared {
    float f[SMP_WARPS];
    uint32_t u[SMP_WARPS];
    int64_t i[SMP_WARPS];
    uint32_t hist[256];
    uint32_t prefix, target;
    int64_t pick;
    float value;
};

/* ---------------------------------------------------------------- block-wide steps, in a fixed order */

/* The sum of every thread's v (float or uint32_t), through warp_tot (SMP_WARPS, shared): the same bits in every
 * thread and every run. */
template <class T> static __device__ T block_sum(T v, T *warp_tot) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if (lane == 0) warp_tot[warp] = v;
    __syncthreads();
    T t = 0;
    for (int w = 0; w < SMP_WARPS; w++) t += warp_tot[w];
    return t;
}

/* The largest of every thread's v; NaN never wins. */
static __device__ float block_max(float v, smp_shared &sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float u = __shfl_xor_sync(0xffffffffu, v, o);
        v = u > v ? u : v;
    }
    __syncthreads();
    if (lane == 0) sh.f[warp] = v;
    __syncthreads();
    float t = sh.f[0];
    for (int w = 1; w < SMP_WARPS; w++) t = sh.f[w] > t ? sh.f[w] : t;
    return t;
}

/* The smallest of every thread's i. */
static __device__ int64_t block_min_i64(int64_t i, smp_shared &sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const int64_t u = __shfl_xor_sync(0xffffffffu, i, o);
        i = u < i ? u : i;
    }
    __syncthreads();
    if (lane == 0) sh.i[warp] = i;
    __syncthreads();
    int64_t t = sh.i[0];
    for (int w = 1; w < SMP_WARPS; w++) t = sh.i[w] < t ? sh.i[w] : t;
    return t;
}

/* The exclusive prefix of v in thread order (thread 0 gets 0), fixed order. */
template <class T> static __device__ T block_exscan(T v, T *warp_tot) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    T inc = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const T u = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += u;
    }
    __syncthreads();
    if (lane == 31) warp_tot[warp] = inc;
    __syncthreads();
    T base = 0;
    for (int w = 0; w < warp; w++) base += warp_tot[w];
    return base + inc - v;
}

/* The index of the largest x[i], the lowest among equal ones, NaNs passed over (0 when all are NaN). */
static __device__ int32_t block_argmax(const float *x, int64_t V, smp_shared &sh) {
    float best = -INFINITY;
    int64_t bi = V;
    for (int64_t i = threadIdx.x; i < V; i += SMP_THREADS) {
        const float v = x[i];
        if (v > best || (v == best && i < bi)) best = v, bi = i;
    }
    const float m = block_max(best, sh);
    const int64_t first = block_min_i64(best == m ? bi : V, sh);
    return first < V ? (int32_t)first : 0;
}

/* An order-preserving key of a float: a > b as floats iff key(a) > key(b) as unsigned (NaN above +inf). */
static __device__ __forceinline__ uint32_t fkey(float x) {
    const uint32_t u = __float_as_uint(x);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* Thread t's slice of consecutive indices [lo, hi) of n: the order-dependent steps walk these. */
static __device__ __forceinline__ void slice(int64_t n, int64_t *lo, int64_t *hi) {
    const int64_t c = (n + SMP_THREADS - 1) / SMP_THREADS;
    *lo = (int64_t)threadIdx.x * c;
    *hi = *lo + c < n ? *lo + c : n;
    if (*lo > n) *lo = n;
}

/* ---------------------------------------------------------------- the pipeline's steps */

/* top-k: the boundary of the k largest of x (the lowest indices kept among equal values at the boundary): x[i] is
 * kept when fkey(x[i]) > *key, or == *key and i <= *last. */
static __device__ void top_k(const float *x, int64_t V, int64_t k, uint32_t *key, int64_t *last_kept, smp_shared &sh) {
    const int lane = threadIdx.x & 31;
    uint32_t prefix = 0, mask = 0, target = (uint32_t)(k - 1); /* the rank (from the top) still to find */
    const int64_t n_it = (V + SMP_THREADS - 1) / SMP_THREADS;
    for (int shift = 24; shift >= 0; shift -= 8) {
        if (threadIdx.x < 256) sh.hist[threadIdx.x] = 0;
        __syncthreads();
        for (int64_t j = 0; j < n_it; j++) { /* the same trip count in every lane, for __match_any_sync */
            const int64_t i = j * SMP_THREADS + threadIdx.x;
            const uint32_t kk = i < V ? fkey(x[i]) : 0u;
            const bool in = i < V && (kk & mask) == prefix;
            const int bin = in ? (int)((kk >> shift) & 255u) : 256;
            const unsigned peers = __match_any_sync(0xffffffffu, bin);
            if (in && (__ffs(peers) - 1) == lane) atomicAdd(&sh.hist[bin], (uint32_t)__popc(peers));
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            uint32_t above = 0;
            int b = 255;
            for (; b > 0 && above + sh.hist[b] <= target; b--) above += sh.hist[b];
            sh.target = target - above;
            sh.prefix = prefix | ((uint32_t)b << shift);
        }
        __syncthreads();
        prefix = sh.prefix, target = sh.target, mask |= 255u << shift;
    }
    /* the key of the k-th is prefix; the boundary is the target-th (0-based, index order) of the values with it */
    int64_t lo, hi;
    slice(V, &lo, &hi);
    uint32_t eq = 0;
    for (int64_t i = lo; i < hi; i++) eq += fkey(x[i]) == prefix;
    const uint32_t before = block_exscan<uint32_t>(eq, sh.u);
    if (threadIdx.x == 0) sh.pick = V;
    __syncthreads();
    if (target >= before && target < before + eq) {
        uint32_t r = before;
        for (int64_t i = lo; i < hi; i++)
            if (fkey(x[i]) == prefix && r++ == target) {
                sh.pick = i;
                break;
            }
    }
    __syncthreads();
    *key = prefix, *last_kept = sh.pick;
    __syncthreads();
}

/* The first index of slice order (0..n-1) whose running sum of w passes r, or n when none does; total gets the
 * running sum up to and including it (the whole sum when none). Fixed order: slices summed, then scanned. */
static __device__ int64_t first_past(const float *w, int64_t n, float r, float *total, smp_shared &sh) {
    int64_t lo, hi;
    slice(n, &lo, &hi);
    float s = 0.0f;
    for (int64_t i = lo; i < hi; i++) s += w[i];
    const float base = block_exscan<float>(s, sh.f);
    int64_t found = n;
    float at = 0.0f;
    float cdf = base;
    for (int64_t i = lo; i < hi; i++) {
        cdf += w[i];
        if (r < cdf) {
            found = i, at = cdf;
            break;
        }
    }
    const int64_t first = block_min_i64(found, sh);
    if (found == first && found < n) sh.value = at;
    const float all = block_sum<float>(s, sh.f); /* its barriers also publish sh.value */
    *total = first < n ? sh.value : all;
    __syncthreads();
    return first;
}

/* Bitonic sort of (p, id) over n (a power of two) by p descending, then id ascending. */
static __device__ void sort_desc(float *p, int32_t *id, int64_t n) {
    for (int64_t k = 2; k <= n; k <<= 1)
        for (int64_t j = k >> 1; j > 0; j >>= 1) {
            for (int64_t i = threadIdx.x; i < n; i += SMP_THREADS) {
                const int64_t l = i ^ j;
                if (l <= i) continue;
                const float a = p[i], b = p[l];
                const int32_t ia = id[i], ib = id[l];
                const bool b_first = b > a || (b == a && ib < ia); /* b belongs before a in the final order */
                const bool up = (i & k) == 0;                      /* this run is sorted descending */
                if (up ? b_first : !b_first) p[i] = b, p[l] = a, id[i] = ib, id[l] = ia;
            }
            __syncthreads();
        }
}

/* The pipeline after top-k over p (n values, softmax's input), position j standing for token id[j] (id NULL: j),
 * in index order; V the vocab (top-p's cutoff is sampler.c's, over the whole vocab). softmax, min-p, then the draw:
 * sample_mult in index order, the argmax (top_p 0), or top-p's sorted candidates: when id is NULL copied into
 * (sp, si) (shared, SMP_SORT_SHARED) when the next power of two >= their count fits, else into (wp, wi); with id,
 * sorted in place in p and id (n <= SMP_SORT_SHARED). */
static __device__ int32_t draw(float *p, int32_t *id, int64_t n, int64_t V, float top_p, float min_p, float coin, float *sp,
                               int32_t *si, float *wp, int32_t *wi, smp_shared &sh) {
    const int tid = threadIdx.x;
    /* softmax */
    float m = -INFINITY;
    for (int64_t i = tid; i < n; i += SMP_THREADS) m = p[i] > m ? p[i] : m;
    const float mx = block_max(m, sh);
    float s = 0.0f;
    for (int64_t i = tid; i < n; i += SMP_THREADS) {
        const float e = expf(p[i] - mx);
        p[i] = e, s += e;
    }
    const float sum = block_sum<float>(s, sh.f);
    float pm = -INFINITY;
    for (int64_t i = tid; i < n; i += SMP_THREADS) {
        p[i] = __fdiv_rn(p[i], sum);
        pm = p[i] > pm ? p[i] : pm;
    }
    /* min-p: below min_p times the most likely one dropped, the rest renormalized */
    if (min_p > 0.0f) {
        const float cut = __fmul_rn(min_p, block_max(pm, sh));
        float s2 = 0.0f;
        for (int64_t i = tid; i < n; i += SMP_THREADS) {
            if (p[i] < cut) p[i] = 0.0f;
            s2 += p[i];
        }
        const float sum2 = block_sum<float>(s2, sh.f);
        for (int64_t i = tid; i < n; i += SMP_THREADS) p[i] = __fdiv_rn(p[i], sum2);
    }
    __syncthreads();
#define TOKEN(j) (id ? id[j] : (int32_t)(j))
    if (top_p >= 1.0f || V == 1) { /* sample_mult: the cdf in index order */
        float at;
        const int64_t j = first_past(p, n, coin, &at, sh);
        return TOKEN(j < n ? j : n - 1);
    }
    if (top_p <= 0.0f) { /* the nucleus of the top token alone */
        const int32_t j = block_argmax(p, n, sh);
        return TOKEN(j);
    }
    /* top-p: the candidates, sorted, cut where the cumulative probability first passes top_p, then the draw */
    const float cutoff = __fdiv_rn(1.0f - top_p, (float)(V - 1));
    uint32_t n_mine = 0;
    for (int64_t i = tid; i < n; i += SMP_THREADS) n_mine += p[i] >= cutoff;
    const uint32_t at0 = block_exscan<uint32_t>(n_mine, sh.u);
    const uint32_t n0 = block_sum<uint32_t>(n_mine, sh.u);
    if (n0 == 0) {
        const int32_t j = block_argmax(p, n, sh);
        return TOKEN(j);
    }
    int64_t P = 1;
    while (P < (id ? n : (int64_t)n0)) P <<= 1;
    float *cp;
    int32_t *ci;
    if (id) { /* in place: the others below every candidate, then the whole padded range sorted */
        for (int64_t i = tid; i < P; i += SMP_THREADS)
            if (i >= n) p[i] = -1.0f, id[i] = INT32_MAX;
            else if (!(p[i] >= cutoff)) p[i] = -1.0f;
        cp = p, ci = id;
    } else {
        cp = P <= SMP_SORT_SHARED ? sp : wp, ci = P <= SMP_SORT_SHARED ? si : wi;
        uint32_t slot = at0;
        for (int64_t i = tid; i < n; i += SMP_THREADS)
            if (p[i] >= cutoff) cp[slot] = p[i], ci[slot] = (int32_t)i, slot++;
        for (int64_t i = (int64_t)n0 + tid; i < P; i += SMP_THREADS) cp[i] = -1.0f, ci[i] = INT32_MAX; /* sort last */
    }
#undef TOKEN
    __syncthreads();
    sort_desc(cp, ci, P);
    float cum;
    int64_t last = first_past(cp, n0, top_p, &cum, sh);
    if (last >= (int64_t)n0) last = n0 - 1; /* never passed: every candidate kept */
    float unused;
    const int64_t j = first_past(cp, last + 1, __fmul_rn(coin, cum), &unused, sh);
    return ci[j <= last ? j : last];
}

/* ---------------------------------------------------------------- the kernel */

__global__ void __launch_bounds__(SMP_THREADS) sample_kernel(int32_t *out, const float *logits, int64_t V,
                                                             const kiln_sample_args *args, float *x /* (V) */,
                                                             float *wp /* (P) */, int32_t *wi /* (P) */) {
    kiln_pdl_wait();
    kiln_pdl_trigger();
    __shared__ smp_shared sh;
    __shared__ float sp[SMP_SORT_SHARED];
    __shared__ int32_t si[SMP_SORT_SHARED];
    const int tid = threadIdx.x;
    const float temp = args->temp, top_p = args->top_p, min_p = args->min_p, coin = args->coin;
    const int64_t top_k_n = args->top_k;

    for (int64_t i = tid; i < V; i += SMP_THREADS) x[i] = logits[i];
    __syncthreads();
    /* the penalties (sampler.c's apply_penalties, its float order: no fused multiply-adds) */
    if (tid < args->n_pen && tid < KILN_SAMPLE_MAX_PEN) {
        const int32_t id = args->pen_id[tid];
        const float c = (float)args->pen_count[tid], rp = args->repeat_penalty;
        if (id >= 0 && id < V) {
            float v = x[id];
            v = v <= 0 ? __fmul_rn(v, rp) : __fdiv_rn(v, rp);
            x[id] = __fsub_rn(v, __fadd_rn(__fmul_rn(c, args->frequency_penalty), c > 0 ? args->presence_penalty : 0.0f));
        }
    }
    __syncthreads();
    /* the banned ids (ignore_eos), after the penalties: a penalty leaves -inf at -inf, so the order is the host's */
    if (tid < args->n_ban && tid < KILN_SAMPLE_MAX_BAN) {
        const int32_t id = args->ban[tid];
        if (id >= 0 && id < V) x[id] = -INFINITY;
    }
    __syncthreads();
    if (temp == 0.0f) {
        const int32_t t = block_argmax(x, V, sh);
        if (tid == 0) *out = t;
        return;
    }
    for (int64_t i = tid; i < V; i += SMP_THREADS) x[i] = __fdiv_rn(x[i], temp);
    __syncthreads();
    if (top_k_n > 0 && top_k_n < V) {
        uint32_t key;
        int64_t last;
        top_k(x, V, top_k_n, &key, &last, sh);
        if (top_k_n <= SMP_SORT_SHARED) {
            /* the k kept, in index order, into shared memory: the rest of the pipeline reads k values, not V (those
             * it drops would be -inf, probability 0, adding exact zeros to every sum) */
            int64_t lo, hi;
            slice(V, &lo, &hi);
            uint32_t mine = 0;
            for (int64_t i = lo; i < hi; i++) {
                const uint32_t kk = fkey(x[i]);
                mine += kk > key || (kk == key && i <= last);
            }
            uint32_t at = block_exscan<uint32_t>(mine, sh.u);
            for (int64_t i = lo; i < hi; i++) {
                const uint32_t kk = fkey(x[i]);
                if (kk > key || (kk == key && i <= last)) sp[at] = x[i], si[at] = (int32_t)i, at++;
            }
            __syncthreads();
            const int32_t t = draw(sp, si, top_k_n, V, top_p, min_p, coin, NULL, NULL, NULL, NULL, sh);
            if (tid == 0) *out = t;
            return;
        }
        for (int64_t i = tid; i < V; i += SMP_THREADS) {
            const uint32_t kk = fkey(x[i]);
            if (!(kk > key || (kk == key && i <= last))) x[i] = -INFINITY;
        }
        __syncthreads();
    }
    const int32_t t = draw(x, NULL, V, V, top_p, min_p, coin, sp, si, wp, wi, sh);
    if (tid == 0) *out = t;
}

/* ---------------------------------------------------------------- launcher */

static int64_t pow2_at_least(int64_t n) {
    int64_t p = 1;
    while (p < n) p <<= 1;
    return p;
}

extern "C" size_t kiln_cuda_sample_work_bytes(int64_t V) {
    if (V < 1) return 0;
    const int64_t P = pow2_at_least(V);
    return (size_t)V * sizeof(float) + (size_t)P * (sizeof(float) + sizeof(int32_t)) + 16;
}

extern "C" kiln_status kiln_cuda_sample(int32_t *d_out, const float *logits, int64_t V, const kiln_sample_args *d_args, void *work,
                                        void *stream) {
    if (!d_out || !logits || !d_args || !work || V < 1 || V > INT32_MAX)
        return kiln_fail(KILN_ERR_INVALID, "cuda sample: NULL buffer or a vocab of %lld", (long long)V);
    const int64_t P = pow2_at_least(V);
    float *x = (float *)work;
    float *wp = x + V;
    int32_t *wi = (int32_t *)(wp + P);
    const cudaError_t e = kiln_launch(sample_kernel, dim3(1), dim3(SMP_THREADS), 0, (cudaStream_t)stream, d_out, logits, V, d_args,
                                      x, wp, wi);
    return kiln_launch_status("sample", e);
}
