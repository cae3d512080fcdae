/* ops_attention.c: causal multi-head attention with grouped KV heads over the f16 KV cache.
 *
 * For query token t (position pos0 + t) and head h, reading KV head g = h / G (G = NH / NKV query heads per KV
 * head): s_j = q . k_j / sqrt(HS) for j = 0..n-1 (n = pos0 + t + 1), out = softmax(s) . v. q stays float and k, v
 * convert exactly from f16 (llama.cpp's non-flash path rounds q and the probabilities to f16; kiln does not).
 *
 * The keys are cut into chunks of KC (128, more past 8192 positions so there are at most 64). A chunk gives, for
 * each of the G heads of a group, a partial softmax: its max m, sum l of exp(s - m) and a = sum exp(s - m) v.
 * Partials are merged in chunk order (the running max rescales the other side, as in FlashAttention), and
 * out = A / L. Chunks depend only on n, so a token's output is the same whether it came in a prefill or alone.
 *   - Prefill (enough (t, g) units for the threads): a unit is one (t, g), its chunks done and merged in turn.
 *   - Decode (few tokens): a unit is one (t, chunk) over all KV heads, reading a contiguous block of the cache;
 *     partials go to the scratch, and after a barrier each (t, h) merges its chunks in order.
 * Both run the same chunk kernel and the same merge in the same order, so the result does not depend on the
 * thread count or the path (tests/test_ops.c checks 1, 2 and 3 threads bit for bit). The chunk kernel is the
 * scalar one below (the oracle) or ops_attention_avx2.c's, chosen by SIMD level; both are checked against a
 * double reference at 1e-6 of sum_j p_j |v_j|. */
#include "ops_internal.h"

#include <math.h>

/* Keys per chunk for a query that sees n positions: 128, or more so that there are at most 64 chunks. */
static int64_t chunk_keys(int64_t n) { return 128 * ((n + 128 * 64 - 1) / (128 * 64)); }

/* Scratch areas start on 64-byte lines. */
static size_t round16(size_t n) { return (n + 15) & ~(size_t)15; }

/* The scalar chunk kernel, the oracle for the SIMD one (ops_internal.h states the contract). */
void kiln_attn_chunk_scalar(float *a, float *m, float *l, float *s, const float *q, const uint16_t *k,
                            const uint16_t *v, int64_t kv_stride, int64_t nk, int64_t HS, int64_t G, float scale) {
    for (int64_t h = 0; h < G; h++) {
        const float *qh = q + h * HS;
        float *sh = s + h * nk, *ah = a + h * HS;
        float max = -INFINITY;
        for (int64_t j = 0; j < nk; j++) {
            const uint16_t *kj = k + j * kv_stride;
            float dot = 0.0f;
            for (int64_t d = 0; d < HS; d++) dot += qh[d] * kiln_fp16_to_f32(kj[d]);
            sh[j] = dot * scale;
            max = sh[j] > max ? sh[j] : max;
        }
        float sum = 0.0f;
        for (int64_t j = 0; j < nk; j++) sum += (sh[j] = expf(sh[j] - max));
        for (int64_t d = 0; d < HS; d++) ah[d] = 0.0f;
        for (int64_t j = 0; j < nk; j++) {
            const uint16_t *vj = v + j * kv_stride;
            for (int64_t d = 0; d < HS; d++) ah[d] += sh[j] * kiln_fp16_to_f32(vj[d]);
        }
        m[h] = max;
        l[h] = sum;
    }
}

/* State (M, L, A) += partial (pm, pl, pa): the larger max stays, the other side is scaled by exp(its max - it). */
static void merge(float *M, float *L, float *A, float pm, float pl, const float *pa, int64_t HS) {
    if (pm > *M) {
        const float f = expf(*M - pm); /* 0 on the first merge, where M = -inf and A = 0 */
        *L = *L * f + pl;
        for (int64_t d = 0; d < HS; d++) A[d] = A[d] * f + pa[d];
        *M = pm;
    } else {
        const float f = expf(pm - *M);
        *L = *L + pl * f;
        for (int64_t d = 0; d < HS; d++) A[d] = A[d] + pa[d] * f;
    }
}

typedef struct {
    float *out;                     /* (T, NH*HS) */
    const float *q;                 /* (T, NH*HS) */
    const uint16_t *k, *v;          /* (n_ctx, NKV*HS) f16 */
    int64_t pos0, T, NH, NKV, HS, G;
    float scale;
    kiln_attn_chunk_fn chunk;
    float *thread_scratch;          /* (nth, per_thread) floats */
    size_t per_thread;
    float *partials;                /* decode: (T, max_chunks, NH, HS + 2) */
    int64_t max_chunks;
    atomic_int barrier;
    atomic_llong next_unit;
} attn_job;

/* Thread scratch: s (G, KC) scores, a (G, HS) a partial, A (G, HS) the merged state, m, l, M, L (G each). */
typedef struct {
    float *s, *a, *A, *m, *l, *M, *L;
} attn_thread;

static attn_thread thread_areas(const attn_job *j, int ith) {
    const size_t G = (size_t)j->G, HS = (size_t)j->HS;
    float *p = j->thread_scratch + (size_t)ith * j->per_thread;
    attn_thread w;
    w.s = p, p += round16(G * (size_t)chunk_keys(j->pos0 + j->T));
    w.a = p, p += round16(G * HS);
    w.A = p, p += round16(G * HS);
    w.m = p, w.l = p + G, w.M = p + 2 * G, w.L = p + 3 * G;
    return w;
}

static size_t thread_floats(int64_t G, int64_t HS, int64_t n_max) {
    return round16((size_t)G * (size_t)chunk_keys(n_max)) + 2 * round16((size_t)(G * HS)) + round16(4 * (size_t)G);
}

/* Prefill: unit (t, g), every chunk in order, merged on the fly. */
static void attention_by_group(void *arg, int ith, int nth) {
    attn_job *j = arg;
    const attn_thread w = thread_areas(j, ith);
    const int64_t n_units = j->T * j->NKV, kv_stride = j->NKV * j->HS, G = j->G, HS = j->HS;
    for (;;) {
        const int64_t u = atomic_fetch_add_explicit(&j->next_unit, 1, memory_order_relaxed);
        if (u >= n_units) break;
        const int64_t unit = n_units - 1 - u; /* last tokens first: they see the most positions */
        const int64_t t = unit / j->NKV, g = unit % j->NKV, n = j->pos0 + t + 1, kc = chunk_keys(n);
        const float *q = j->q + (t * j->NH + g * G) * HS;
        for (int64_t h = 0; h < G; h++) {
            w.M[h] = -INFINITY, w.L[h] = 0.0f;
            for (int64_t d = 0; d < HS; d++) w.A[h * HS + d] = 0.0f;
        }
        for (int64_t j0 = 0; j0 < n; j0 += kc) {
            const int64_t nk = n - j0 < kc ? n - j0 : kc;
            const size_t off = (size_t)(j0 * kv_stride + g * HS);
            j->chunk(w.a, w.m, w.l, w.s, q, j->k + off, j->v + off, kv_stride, nk, HS, G, j->scale);
            for (int64_t h = 0; h < G; h++) merge(&w.M[h], &w.L[h], w.A + h * HS, w.m[h], w.l[h], w.a + h * HS, HS);
        }
        float *out = j->out + (t * j->NH + g * G) * HS;
        for (int64_t h = 0; h < G; h++)
            for (int64_t d = 0; d < HS; d++) out[h * HS + d] = w.A[h * HS + d] / w.L[h];
    }
}

/* Decode: unit (t, chunk) over all groups into the partials; then (t, h) merges its chunks in order. */
static void attention_by_chunk(void *arg, int ith, int nth) {
    attn_job *j = arg;
    const attn_thread w = thread_areas(j, ith);
    const int64_t kv_stride = j->NKV * j->HS, G = j->G, HS = j->HS, NH = j->NH, P = HS + 2;
    for (;;) {
        int64_t u = atomic_fetch_add_explicit(&j->next_unit, 1, memory_order_relaxed), t = 0;
        for (; t < j->T; t++) { /* unit u -> (t, c): token t has ceil(n / KC) chunks */
            const int64_t n = j->pos0 + t + 1, nc = (n + chunk_keys(n) - 1) / chunk_keys(n);
            if (u < nc) break;
            u -= nc;
        }
        if (t == j->T) break;
        const int64_t n = j->pos0 + t + 1, kc = chunk_keys(n), j0 = u * kc, nk = n - j0 < kc ? n - j0 : kc;
        float *part = j->partials + ((size_t)t * (size_t)j->max_chunks + (size_t)u) * (size_t)(NH * P);
        for (int64_t g = 0; g < j->NKV; g++) {
            const size_t off = (size_t)(j0 * kv_stride + g * HS);
            j->chunk(w.a, w.m, w.l, w.s, j->q + (t * NH + g * G) * HS, j->k + off, j->v + off, kv_stride, nk, HS, G, j->scale);
            for (int64_t h = 0; h < G; h++) {
                float *ph = part + (g * G + h) * P;
                for (int64_t d = 0; d < HS; d++) ph[d] = w.a[h * HS + d];
                ph[HS] = w.m[h], ph[HS + 1] = w.l[h];
            }
        }
    }
    kiln_ops_barrier(&j->barrier, nth);
    int64_t lo, hi;
    kiln_ops_split(j->T * NH, ith, nth, &lo, &hi);
    for (int64_t th = lo; th < hi; th++) {
        const int64_t t = th / NH, h = th % NH, n = j->pos0 + t + 1, nc = (n + chunk_keys(n) - 1) / chunk_keys(n);
        float M = -INFINITY, L = 0.0f, *A = w.A;
        for (int64_t d = 0; d < HS; d++) A[d] = 0.0f;
        for (int64_t c = 0; c < nc; c++) {
            const float *ph = j->partials + ((size_t)t * (size_t)j->max_chunks + (size_t)c) * (size_t)(NH * P) + h * P;
            merge(&M, &L, A, ph[HS], ph[HS + 1], ph, HS);
        }
        float *out = j->out + th * HS;
        for (int64_t d = 0; d < HS; d++) out[d] = A[d] / L;
    }
}

/* Decode partials are sized for this many tokens; a larger batch has units enough for the prefill path. */
#define ATTN_SPLIT_T 4

/* Per thread: scores for all heads of one chunk plus two (heads, HS) areas; decode partials for up to
 * ATTN_SPLIT_T tokens. NH * HS <= max_width (the caller's widest activation includes the q row). */
size_t kiln_cpu_attention_scratch_size(int64_t T, int64_t max_width, int64_t NH, int64_t n_ctx, int n_threads) {
    if (T <= 0 || max_width <= 0 || NH <= 0 || n_ctx <= 0 || n_threads <= 0) return 0;
    if (n_ctx > INT64_MAX / 2 || max_width > INT64_MAX / 4 || NH > INT64_MAX / (128 * 64)) return SIZE_MAX;
    const size_t per_thread = kiln_ops_add(kiln_ops_mul(round16((size_t)NH), (size_t)chunk_keys(n_ctx)),
                                           kiln_ops_add(2 * round16((size_t)max_width), round16(4 * (size_t)NH)));
    const int64_t chunks = (n_ctx + chunk_keys(n_ctx) - 1) / chunk_keys(n_ctx);
    const size_t partials = kiln_ops_mul((size_t)(T < ATTN_SPLIT_T ? T : ATTN_SPLIT_T) * (size_t)chunks,
                                         (size_t)max_width + 2 * (size_t)NH);
    return kiln_ops_mul(kiln_ops_add(kiln_ops_mul(per_thread, (size_t)n_threads), partials), sizeof(float));
}

void kiln_cpu_attention_forward(kiln_ops_ctx *ctx, float *out, const float *q, const uint16_t *k_cache,
                                const uint16_t *v_cache, int64_t pos0, int64_t T, int64_t NH, int64_t NKV, int64_t HS) {
    assert(pos0 >= 0 && T >= 0 && NKV > 0 && NH % NKV == 0 && HS > 0);
    if (T == 0) return;
    const int64_t n_max = pos0 + T, G = NH / NKV;
    /* Below ~128k multiply-adds a pool wake-up costs more than it saves. */
    const bool parallel = T * NH * n_max * HS >= (1 << 17);
    const int nth = parallel ? kiln_ops_n_threads(ctx) : 1;
    size_t bytes;
    float *scratch = kiln_ops_scratch(ctx, &bytes);
    attn_job j = {.out = out, .q = q, .k = k_cache, .v = v_cache, .pos0 = pos0, .T = T, .NH = NH, .NKV = NKV, .HS = HS,
                  .G = G, .scale = 1.0f / sqrtf((float)HS), .chunk = kiln_attn_chunk_scalar, .thread_scratch = scratch,
                  .per_thread = thread_floats(G, HS, n_max)};
#if defined(__x86_64__)
    if (kiln_cpu_ops_level() >= KILN_SIMD_AVX2 && HS % 8 == 0) j.chunk = kiln_attn_chunk_avx2;
#endif
    const size_t threads_bytes = j.per_thread * (size_t)nth * sizeof(float);
    assert(scratch && threads_bytes <= bytes && "attention scratch too small: size it with scratch_size");
    /* Few (t, g) units for the threads: split the keys instead, if the partials fit. */
    j.max_chunks = (n_max + chunk_keys(n_max) - 1) / chunk_keys(n_max);
    const size_t partial_bytes = (size_t)(T * j.max_chunks * NH * (HS + 2)) * sizeof(float);
    const bool by_chunk = nth > 1 && T * NKV < 2 * nth && partial_bytes <= bytes - threads_bytes;
    j.partials = scratch + j.per_thread * (size_t)nth;
    atomic_init(&j.barrier, 0);
    atomic_init(&j.next_unit, 0);
    kiln_ops_run(ctx, by_chunk ? attention_by_chunk : attention_by_group, &j, parallel);
}
