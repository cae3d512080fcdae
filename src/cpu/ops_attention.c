/* ops_attention.c: causal multi-head attention with grouped KV heads over the KV cache; below it, training's
 * forward and backward over float q, k, v (their own comment, at "training").
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
 *   - Prefill at AVX-512 over the f16 pair (no softcap, no window or ring cut): a unit is up to 16 rows (token,
 *     head) of one KV group in the lanes of a vector (ops_attention_avx512.c), which computes for each row what the
 *     AVX2 chunk kernel and the merge below compute for it alone, in the same order. On the 2-core Zen 4 VM it is
 *     1-6% faster at pp512 (both are at the FMA units' rate there); its lanes are 512 bits where the chunk kernel's
 *     are 256.
 * Both run the same chunk kernel and the same merge in the same order, so the result does not depend on the
 * thread count or the path (tests/test_ops.c checks 1, 2 and 3 threads bit for bit). The chunk kernel is the
 * scalar one below (the oracle) or ops_attention_avx2.c's, chosen by SIMD level; both are checked against a
 * double reference at 1e-6 of sum_j p_j |v_j|.
 *
 * Sliding window and ring cache (attention_window_forward, #6): with window W a query at position p sees keys
 * lo = max(0, p - W + 1) .. p, and position j lives in row j % rows of the cache (rows = n_ctx for a full cache,
 * a ring of at least W + T - 1 rows for a sliding layer, so a batch's keys never overwrite what its first query
 * still sees). The chunks then start at lo, and the one chunk that spans the ring's wrap (a position multiple of
 * rows) is cut in two there, so every piece reads contiguous rows. Pieces depend only on (p, W, rows): prefill
 * and decode still agree. W = 0 and rows past the context give exactly the chunks above.
 *
 * Cache types (attention_kv_forward, -ctk/-ctv): an f16 cache is read by the f16 chunk kernels above. Any other
 * pair of types goes through the float chunk kernels (the same arithmetic over float rows): before each piece, its
 * nk rows of the group's HS elements are converted to float in thread scratch with the core's dequantizers (exact:
 * f16 and bf16 widen, a q8_0 or q4_0 element is its code times its block's scale), an f32 cache is read in place.
 * The pieces, their order and the merge are the same, so the results still do not depend on threads or path.
 * tests/test_kv.c checks each type's SIMD kernel against the scalar one and against a double reference. */
#include "ops_internal.h"

#include <math.h>
#include <string.h>

/* Keys per chunk for a query that sees n positions: 128, or more so that there are at most 64 chunks. */
static int64_t chunk_keys(int64_t n) { return 128 * ((n + 128 * 64 - 1) / (128 * 64)); }

/* Scratch areas start on 64-byte lines. */
static size_t round16(size_t n) { return (n + 15) & ~(size_t)15; }

/* Element i of rows that are f16 (f32 false) or float. */
static inline float elem(const void *p, int64_t i, bool f32) {
    return f32 ? ((const float *)p)[i] : kiln_fp16_to_f32(((const uint16_t *)p)[i]);
}

/* The scalar chunk kernel over f16 or float rows (ks, vs elements apart), the oracle for the SIMD ones
 * (ops_internal.h states the contract); inlined into each with f32 a constant. */
static inline void chunk_scalar(float *a, float *m, float *l, float *s, const float *q, const void *k, const void *v,
                                int64_t ks, int64_t vs, int64_t nk, int64_t HS, int64_t G, float scale, float cap, bool f32) {
    for (int64_t h = 0; h < G; h++) {
        const float *qh = q + h * HS;
        float *sh = s + h * nk, *ah = a + h * HS;
        float max = -INFINITY;
        for (int64_t j = 0; j < nk; j++) {
            float dot = 0.0f;
            for (int64_t d = 0; d < HS; d++) dot += qh[d] * elem(k, j * ks + d, f32);
            sh[j] = dot * scale;
        }
        if (cap > 0) kiln_attn_softcap(sh, nk, cap);
        for (int64_t j = 0; j < nk; j++) max = sh[j] > max ? sh[j] : max;
        float sum = 0.0f;
        for (int64_t j = 0; j < nk; j++) sum += (sh[j] = expf(sh[j] - max));
        for (int64_t d = 0; d < HS; d++) ah[d] = 0.0f;
        for (int64_t j = 0; j < nk; j++)
            for (int64_t d = 0; d < HS; d++) ah[d] += sh[j] * elem(v, j * vs + d, f32);
        m[h] = max;
        l[h] = sum;
    }
}

void kiln_attn_chunk_scalar(float *a, float *m, float *l, float *s, const float *q, const uint16_t *k,
                            const uint16_t *v, int64_t kv_stride, int64_t nk, int64_t HS, int64_t G, float scale, float cap) {
    chunk_scalar(a, m, l, s, q, k, v, kv_stride, kv_stride, nk, HS, G, scale, cap, false);
}

void kiln_attn_chunk_f32_scalar(float *a, float *m, float *l, float *s, const float *q, const float *k, const float *v,
                                int64_t k_stride, int64_t v_stride, int64_t nk, int64_t HS, int64_t G, float scale, float cap) {
    chunk_scalar(a, m, l, s, q, k, v, k_stride, v_stride, nk, HS, G, scale, cap, true);
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

/* How a piece's rows of one cache are read: f16 rows in place (the f16 pair), float rows in place (f32), or
 * converted to float in thread scratch. */
typedef struct {
    kiln_kv_type type;
    size_t row_bytes;               /* kiln_kv_row_bytes(type, NKV*HS) */
    kiln_to_float_fn to_float;      /* the core's dequantizer of the type's blocks */
    int64_t blck;                   /* elements per block: 1, or 32 */
    size_t blck_bytes;
} kv_reader;

typedef struct {
    float *out;                     /* (T, NH*HS) */
    const float *q;                 /* (T, NH*HS) */
    const void *k, *v;              /* (rows, NKV*HS) of rk.type, rv.type */
    kv_reader rk, rv;
    bool f16;                       /* both caches f16: the f16 chunk kernel, in place */
    kiln_attn_chunk_f32_fn chunk_f32;
    int64_t pos0, T, NH, NKV, HS, G;
    int64_t window, rows;           /* 0 or the sliding window; cache rows (position j in row j % rows) */
    float scale, softcap;           /* softcap 0: none */
    kiln_attn_chunk_fn chunk;
    float *thread_scratch;          /* (nth, per_thread) floats */
    size_t per_thread;
    float *partials;                /* decode: (T, max_chunks, NH, HS + 2) */
    int64_t max_chunks;
    atomic_int barrier;
    atomic_llong next_unit;
    /* prefill in rows of 16 lanes (kiln_attn_rows16): units of tb tokens x gs heads of one KV group */
    bool rows16;
    int64_t r_tb, r_gs, r_hb, r_units, r_kc;
} attn_job;

/* The keys query t sees, [lo, n), cut into pieces: chunks of kc from lo, the one holding wrap (the position in
 * (lo, n) at a multiple of rows, else n) cut in two there. */
typedef struct {
    int64_t lo, n, kc, wrap, n_pieces;
} key_range;

static key_range keys_of(const attn_job *j, int64_t t) {
    key_range r;
    r.n = j->pos0 + t + 1;
    r.lo = j->window && r.n > j->window ? r.n - j->window : 0;
    r.kc = chunk_keys(r.n - r.lo);
    const int64_t w = (r.lo / j->rows + 1) * j->rows;
    r.wrap = w < r.n ? w : r.n;
    r.n_pieces = (r.n - r.lo + r.kc - 1) / r.kc + (r.wrap < r.n && (r.wrap - r.lo) % r.kc != 0);
    return r;
}

/* Piece c of r: keys [*start, *start + *len). */
static void piece_of(const key_range *r, int64_t c, int64_t *start, int64_t *len) {
    const int64_t iw = (r->wrap - r->lo) / r->kc; /* the chunk holding the wrap */
    const bool cut = r->wrap < r->n && (r->wrap - r->lo) % r->kc != 0;
    int64_t s, e;
    if (!cut || c < iw) {
        s = r->lo + c * r->kc;
        e = s + r->kc;
    } else if (c == iw) {
        s = r->lo + c * r->kc;
        e = r->wrap;
    } else {
        s = c - 1 == iw ? r->wrap : r->lo + (c - 1) * r->kc;
        e = r->lo + c * r->kc;
    }
    *start = s;
    *len = (e < r->n ? e : r->n) - s;
}

/* Thread scratch: s (G, KC) scores, a (G, HS) a partial, A (G, HS) the merged state, m, l, M, L (G each), and
 * for caches other than f16, kf and vf (KC, HS) a piece's k and v rows as float. */
typedef struct {
    float *s, *a, *A, *m, *l, *M, *L, *kf, *vf;
} attn_thread;

static attn_thread thread_areas(const attn_job *j, int ith) {
    const size_t G = (size_t)j->G, HS = (size_t)j->HS;
    float *p = j->thread_scratch + (size_t)ith * j->per_thread;
    attn_thread w;
    w.s = p, p += round16(G * (size_t)chunk_keys(j->pos0 + j->T));
    w.a = p, p += round16(G * HS);
    w.A = p, p += round16(G * HS);
    w.m = p, w.l = p + G, w.M = p + 2 * G, w.L = p + 3 * G, p += round16(4 * G);
    w.kf = p, p += round16((size_t)chunk_keys(j->pos0 + j->T) * HS);
    w.vf = p;
    return w;
}

/* convert: room for kf and vf too. */
static size_t thread_floats(int64_t G, int64_t HS, int64_t n_max, bool convert) {
    return round16((size_t)G * (size_t)chunk_keys(n_max)) + 2 * round16((size_t)(G * HS)) + round16(4 * (size_t)G) +
           (convert ? 2 * round16((size_t)chunk_keys(n_max) * (size_t)HS) : 0);
}

/* Rows r0 .. r0 + nk - 1 of a cache, elements e0 .. e0 + HS - 1 of each, as float into out (nk, HS). A block type's
 * head may start or end inside a block (HS < 32): whole blocks go straight into out, a cut one through tmp. */
static void rows_to_float(const kv_reader *r, const void *cache, int64_t r0, int64_t nk, int64_t e0, int64_t HS,
                          float *out) {
    for (int64_t i = 0; i < nk; i++, out += HS) {
        const char *row = (const char *)cache + (size_t)(r0 + i) * r->row_bytes;
        for (int64_t e = e0; e < e0 + HS;) {
            const int64_t b = e / r->blck, in = e - b * r->blck, n = r->blck - in < e0 + HS - e ? r->blck - in : e0 + HS - e;
            if (in == 0 && n % r->blck == 0) { /* whole blocks: as many as fit */
                const int64_t nb = (e0 + HS - e) / r->blck;
                r->to_float(row + (size_t)b * r->blck_bytes, out + (e - e0), nb * r->blck);
                e += nb * r->blck;
            } else {
                float tmp[QK8_0];
                r->to_float(row + (size_t)b * r->blck_bytes, tmp, r->blck);
                memcpy(out + (e - e0), tmp + in, sizeof(float) * (size_t)n);
                e += n;
            }
        }
    }
}

/* The chunk kernel over keys j0 .. j0 + nk - 1 (contiguous rows from j0 % rows) of KV group g, for the G heads of q. */
static void run_chunk(const attn_job *j, const attn_thread *w, const float *q, int64_t j0, int64_t nk, int64_t g) {
    const int64_t kv_stride = j->NKV * j->HS, HS = j->HS, r0 = j0 % j->rows;
    if (j->f16) {
        const size_t off = (size_t)(r0 * kv_stride + g * HS);
        j->chunk(w->a, w->m, w->l, w->s, q, (const uint16_t *)j->k + off, (const uint16_t *)j->v + off, kv_stride, nk, HS,
                 j->G, j->scale, j->softcap);
        return;
    }
    const float *kr = w->kf, *vr = w->vf;
    int64_t ks = HS, vs = HS;
    if (j->rk.type == KILN_KV_F32)
        kr = (const float *)j->k + r0 * kv_stride + g * HS, ks = kv_stride;
    else
        rows_to_float(&j->rk, j->k, r0, nk, g * HS, HS, w->kf);
    if (j->rv.type == KILN_KV_F32)
        vr = (const float *)j->v + r0 * kv_stride + g * HS, vs = kv_stride;
    else
        rows_to_float(&j->rv, j->v, r0, nk, g * HS, HS, w->vf);
    j->chunk_f32(w->a, w->m, w->l, w->s, q, kr, vr, ks, vs, nk, HS, j->G, j->scale, j->softcap);
}

/* Prefill in rows of 16: unit (token block, KV group, head block), last tokens first. */
static void attention_rows16(attn_job *j, int ith) {
    const int64_t HS = j->HS, per_tb = j->NKV * j->r_hb;
    kiln_attn_rows16 u = {.kv_stride = j->NKV * HS, .HS = HS, .kc = j->r_kc, .scale = j->scale,
                          .scratch = j->thread_scratch + (size_t)ith * j->per_thread};
    for (;;) {
        const int64_t i = atomic_fetch_add_explicit(&j->next_unit, 1, memory_order_relaxed);
        if (i >= j->r_units) break;
        const int64_t unit = j->r_units - 1 - i, tb = unit / per_tb, g = unit % per_tb / j->r_hb, hb = unit % j->r_hb;
        const int64_t t0 = tb * j->r_tb, t1 = t0 + j->r_tb < j->T ? t0 + j->r_tb : j->T;
        const int64_t h0 = g * j->G + hb * j->r_gs, h1 = h0 + j->r_gs < (g + 1) * j->G ? h0 + j->r_gs : (g + 1) * j->G;
        u.nr = 0;
        for (int64_t t = t0; t < t1; t++)
            for (int64_t h = h0; h < h1; h++, u.nr++) {
                u.q[u.nr] = j->q + (t * j->NH + h) * HS;
                u.out[u.nr] = j->out + (t * j->NH + h) * HS;
                u.n[u.nr] = j->pos0 + t + 1;
            }
        u.k = (const uint16_t *)j->k + g * HS;
        u.v = (const uint16_t *)j->v + g * HS;
        kiln_attn_rows16_avx512(&u);
    }
}

/* Prefill: unit (t, g), every chunk in order, merged on the fly. */
static void attention_by_group(void *arg, int ith, int nth) {
    attn_job *j = arg;
#if defined(__x86_64__)
    if (j->rows16) {
        attention_rows16(j, ith);
        return;
    }
#endif
    const attn_thread w = thread_areas(j, ith);
    const int64_t n_units = j->T * j->NKV, G = j->G, HS = j->HS;
    for (;;) {
        const int64_t u = atomic_fetch_add_explicit(&j->next_unit, 1, memory_order_relaxed);
        if (u >= n_units) break;
        const int64_t unit = n_units - 1 - u; /* last tokens first: they see the most positions */
        const int64_t t = unit / j->NKV, g = unit % j->NKV;
        const key_range r = keys_of(j, t);
        const float *q = j->q + (t * j->NH + g * G) * HS;
        for (int64_t h = 0; h < G; h++) {
            w.M[h] = -INFINITY, w.L[h] = 0.0f;
            for (int64_t d = 0; d < HS; d++) w.A[h * HS + d] = 0.0f;
        }
        for (int64_t c = 0; c < r.n_pieces; c++) {
            int64_t j0, nk;
            piece_of(&r, c, &j0, &nk);
            run_chunk(j, &w, q, j0, nk, g);
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
    const int64_t G = j->G, HS = j->HS, NH = j->NH, P = HS + 2;
    for (;;) {
        int64_t u = atomic_fetch_add_explicit(&j->next_unit, 1, memory_order_relaxed), t = 0;
        for (; t < j->T; t++) { /* unit u -> (t, c): token t has n_pieces pieces */
            const int64_t nc = keys_of(j, t).n_pieces;
            if (u < nc) break;
            u -= nc;
        }
        if (t == j->T) break;
        const key_range r = keys_of(j, t);
        int64_t j0, nk;
        piece_of(&r, u, &j0, &nk);
        float *part = j->partials + ((size_t)t * (size_t)j->max_chunks + (size_t)u) * (size_t)(NH * P);
        for (int64_t g = 0; g < j->NKV; g++) {
            run_chunk(j, &w, j->q + (t * NH + g * G) * HS, j0, nk, g);
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
        const int64_t t = th / NH, h = th % NH, nc = keys_of(j, t).n_pieces;
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
    size_t per_thread = kiln_ops_add(kiln_ops_mul(round16((size_t)NH), (size_t)chunk_keys(n_ctx)),
                                     kiln_ops_add(2 * round16((size_t)max_width), round16(4 * (size_t)NH)));
    /* or the rows of 16 of a prefill: kiln_attn_rows16_floats(HS, kc) with kc * HS <= 32768 (so 2 kc HS <= 65536) */
    const size_t rows16 = round16((size_t)(32 * (max_width / NH) + 16 * chunk_keys(n_ctx) + 65536 + 48));
    if (rows16 > per_thread) per_thread = rows16;
    const int64_t chunks = (n_ctx + chunk_keys(n_ctx) - 1) / chunk_keys(n_ctx) + 1; /* + 1: a ring's wrap cut */
    const size_t partials = kiln_ops_mul((size_t)(T < ATTN_SPLIT_T ? T : ATTN_SPLIT_T) * (size_t)chunks,
                                         (size_t)max_width + 2 * (size_t)NH);
    return kiln_ops_mul(kiln_ops_add(kiln_ops_mul(per_thread, (size_t)n_threads), partials), sizeof(float));
}

/* What caches other than f16 add per thread: a chunk's k and v rows as float (HS <= max_width / NH). */
size_t kiln_cpu_attention_kv_scratch_size(int64_t max_width, int64_t NH, int64_t n_ctx, int n_threads) {
    if (max_width <= 0 || NH <= 0 || n_ctx <= 0 || n_threads <= 0) return 0;
    if (n_ctx > INT64_MAX / 2 || max_width > INT64_MAX / 4) return SIZE_MAX;
    const size_t rows_f32 = 2 * round16(kiln_ops_mul((size_t)chunk_keys(n_ctx), (size_t)(max_width / NH)));
    return kiln_ops_mul(kiln_ops_mul(rows_f32, (size_t)n_threads), sizeof(float));
}

void kiln_cpu_attention_forward(kiln_ops_ctx *ctx, float *out, const float *q, const uint16_t *k_cache,
                                const uint16_t *v_cache, int64_t pos0, int64_t T, int64_t NH, int64_t NKV, int64_t HS) {
    kiln_cpu_attention_window_forward(ctx, out, q, k_cache, v_cache, pos0, T, NH, NKV, HS, 0, INT64_MAX / 2, 0.0f);
}

void kiln_cpu_attention_window_forward(kiln_ops_ctx *ctx, float *out, const float *q, const uint16_t *k_cache,
                                       const uint16_t *v_cache, int64_t pos0, int64_t T, int64_t NH, int64_t NKV, int64_t HS,
                                       int64_t window, int64_t rows, float softcap) {
    kiln_cpu_attention_kv_forward(ctx, out, q, k_cache, v_cache, KILN_KV_F16, KILN_KV_F16, pos0, T, NH, NKV, HS, window, rows,
                                  softcap);
}

/* The reader of a cache of type t with rows of KV elements. */
static kv_reader reader_of(kiln_kv_type t, int64_t KV) {
    const kiln_type tt = kiln_kv_tensor_type(t);
    const kiln_type_traits *tr = kiln_type_traits_get(tt);
    return (kv_reader){.type = t, .row_bytes = kiln_kv_row_bytes(t, KV), .to_float = kiln_get_to_float(tt, kiln_cpu_ops_level()),
                       .blck = tr->blck_size, .blck_bytes = tr->type_size};
}

void kiln_cpu_attention_kv_forward(kiln_ops_ctx *ctx, float *out, const float *q, const void *k_cache,
                                   const void *v_cache, kiln_kv_type type_k, kiln_kv_type type_v, int64_t pos0, int64_t T,
                                   int64_t NH, int64_t NKV, int64_t HS, int64_t window, int64_t rows, float softcap) {
    assert(softcap >= 0);
    assert(kiln_kv_type_name(type_k) && kiln_kv_type_name(type_v) && "a KV cache type kiln knows");
    assert(pos0 >= 0 && T >= 0 && NKV > 0 && NH % NKV == 0 && HS > 0 && window >= 0 && rows > 0);
    assert((rows >= pos0 + T || (window > 0 && rows >= window + T - 1)) && "a ring must hold the window and the batch");
    if (T == 0) return;
    const int64_t n_max = pos0 + T, G = NH / NKV;
    /* Below ~128k multiply-adds a pool wake-up costs more than it saves. */
    const bool parallel = T * NH * n_max * HS >= (1 << 17);
    const int nth = parallel ? kiln_ops_n_threads(ctx) : 1;
    size_t bytes;
    float *scratch = kiln_ops_scratch(ctx, &bytes);
    const bool f16 = type_k == KILN_KV_F16 && type_v == KILN_KV_F16;
    attn_job j = {.out = out, .q = q, .k = k_cache, .v = v_cache, .rk = reader_of(type_k, NKV * HS),
                  .rv = reader_of(type_v, NKV * HS), .f16 = f16, .chunk_f32 = kiln_attn_chunk_f32_scalar, .pos0 = pos0,
                  .T = T, .NH = NH, .NKV = NKV, .HS = HS, .G = G, .window = window, .rows = rows,
                  .scale = 1.0f / sqrtf((float)HS), .softcap = softcap, .chunk = kiln_attn_chunk_scalar,
                  .thread_scratch = scratch, .per_thread = thread_floats(G, HS, n_max, !f16)};
    assert((f16 || (j.rk.row_bytes && j.rv.row_bytes)) && "the block types need rows of whole blocks");
#if defined(__x86_64__)
    if (kiln_cpu_ops_level() >= KILN_SIMD_AVX2 && HS % 8 == 0) j.chunk = kiln_attn_chunk_avx2, j.chunk_f32 = kiln_attn_chunk_f32_avx2;
#endif
    const size_t threads_bytes = j.per_thread * (size_t)nth * sizeof(float);
    assert(scratch && threads_bytes <= bytes && "attention scratch too small: size it with scratch_size");
    /* Few (t, g) units for the threads: split the keys instead, if the partials fit. */
    j.max_chunks = 0;
    for (int64_t t = 0; t < T; t++) {
        const int64_t nc = keys_of(&j, t).n_pieces;
        j.max_chunks = nc > j.max_chunks ? nc : j.max_chunks;
    }
    const size_t partial_bytes = (size_t)(T * j.max_chunks * NH * (HS + 2)) * sizeof(float);
    const bool by_chunk = nth > 1 && T * NKV < 2 * nth && partial_bytes <= bytes - threads_bytes;
#if defined(__x86_64__)
    /* Prefill in rows of 16 lanes where it gives the AVX2 chunk kernel's bits: the f16 pair, no softcap, every
     * token's keys from 0 (no window cuts in, no ring wraps) in chunks of one size, and at least 8 rows a unit. */
    const int64_t kc = chunk_keys(pos0 + T), gs = G < 16 ? G : 16, tb = 16 / gs;
    if (!by_chunk && f16 && j.chunk == kiln_attn_chunk_avx2 && kiln_cpu_ops_level() >= KILN_SIMD_AVX512 && HS % 16 == 0 &&
        softcap == 0 && (window == 0 || pos0 + T <= window) && rows >= pos0 + T && chunk_keys(pos0 + 1) == kc &&
        kc * HS <= 32768 && (T < tb ? T : tb) * gs >= 8) {
        const size_t per = round16(kiln_attn_rows16_floats(HS, kc));
        if (per * (size_t)nth * sizeof(float) <= bytes) {
            j.rows16 = true, j.per_thread = per;
            j.r_kc = kc, j.r_gs = gs, j.r_tb = tb, j.r_hb = (G + gs - 1) / gs;
            j.r_units = (T + tb - 1) / tb * NKV * j.r_hb;
        }
    }
#endif
    j.partials = scratch + j.per_thread * (size_t)nth;
    atomic_init(&j.barrier, 0);
    atomic_init(&j.next_unit, 0);
    kiln_ops_run(ctx, by_chunk ? attention_by_chunk : attention_by_group, &j, parallel);
}

/* ---------------------------------------------------------------- training (#5)
 *
 * Float q, k, v of B sequences of T tokens (no cache), each token attending to its sequence's tokens 0..t. A work
 * unit is one (b, g): a sequence and a KV head with its G query heads. The unit owns dk and dv of its (b, g) and dq
 * of its heads, so no two threads write one element, and each unit sums in a fixed order: the result does not
 * depend on the thread count.
 *
 * The unit first copies its keys and values into the thread's scratch in the layouts the kernels want
 * (kiln_attn_train_unit, ops_internal.h): transposed (HS, TP), so that the scores of a query against 16 keys are 16
 * independent sums s_j += q_d k_jd over d (no horizontal reduction), and as rows padded to HSP, for sums of rows.
 * TP rounds T up to 32 and HSP rounds HS up to 16, with zeros. The forward is an online softmax over chunks of 64
 * keys (FlashAttention's running max and sum, as the inference path); the backward recomputes p = exp(s - lse) from
 * the saved lse, then with D = dout . out:  dp_j = dout . v_j,  ds_j = p_j (dp_j - D),  dq = scale sum_j ds_j k_j,
 * dk_j += scale ds_j q,  dv_j += p_j dout. dk and dv are summed transposed in scratch over the unit's rows, then
 * added to the gradients once. The kernels are the scalar ones below (the oracle: every inner loop is axpy16, which
 * GCC -O2 vectorizes at any width with the same bits) or ops_train_avx512.c's. tests/test_grad.c checks both
 * against a double reference and finite differences. */

#define TRAIN_KC 64 /* keys per online-softmax chunk */

/* y[i] += a * x[i] for i < n, n a multiple of 16: the fixed inner loop is what GCC -O2 vectorizes (its very-cheap
 * cost model skips loops that would need a scalar tail). */
static inline void axpy16(float *restrict y, const float *restrict x, float a, int64_t n) {
    for (int64_t i = 0; i < n; i += 16)
        for (int u = 0; u < 16; u++) y[i + u] += a * x[i + u];
}

static inline void zero16(float *y, int64_t n) {
    for (int64_t i = 0; i < n; i += 16)
        for (int u = 0; u < 16; u++) y[i + u] = 0.0f;
}

/* s[0, n) = q . k_j over xT's columns j0 .. j0 + n - 1 (n a multiple of 16), unscaled. */
static inline void scores16(float *s, const float *q, const float *xT, int64_t j0, int64_t n, int64_t HS, int64_t TP) {
    zero16(s, n);
    for (int64_t d = 0; d < HS; d++) axpy16(s, xT + d * TP + j0, q[d], n);
}

void kiln_attn_train_fwd_scalar(const kiln_attn_train_unit *u, float *out, float *lse, const float *q, int64_t n) {
    const int64_t HS = u->HS, HSP = u->HSP;
    float M = -INFINITY, L = 0.0f;
    zero16(u->acc, HSP);
    for (int64_t j0 = 0; j0 < n; j0 += TRAIN_KC) {
        const int64_t nk = n - j0 < TRAIN_KC ? n - j0 : TRAIN_KC;
        scores16(u->s, q, u->kT, j0, (int64_t)round16((size_t)nk), HS, u->TP);
        float m = M;
        for (int64_t i = 0; i < nk; i++) m = (u->s[i] *= u->scale) > m ? u->s[i] : m;
        if (m > M) { /* a new running max rescales what came before (by 0 on the first chunk: M = -inf) */
            const float f = expf(M - m);
            L *= f;
            for (int64_t d = 0; d < HSP; d++) u->acc[d] *= f;
            M = m;
        }
        for (int64_t i = 0; i < nk; i++) {
            const float p = expf(u->s[i] - M);
            L += p;
            axpy16(u->acc, u->vp + (j0 + i) * HSP, p, HSP);
        }
    }
    for (int64_t d = 0; d < HS; d++) out[d] = u->acc[d] / L;
    *lse = M + logf(L);
}

/* One row at a time, straight into dkT and dvT. */
void kiln_attn_train_bwd_scalar(const kiln_attn_train_unit *u, float *dq, const float *q, const float *dout,
                                const float *D, const float *lse, int64_t t0, int64_t nt, int64_t stride) {
    const int64_t HS = u->HS, HSP = u->HSP, TP = u->TP;
    float *p = u->s, *ds = u->dp;
    for (int64_t r = 0; r < nt; r++, q += stride, dout += stride, dq += stride) {
        const int64_t n = t0 + r + 1, np = (int64_t)round16((size_t)n);
        scores16(p, q, u->kT, 0, np, HS, TP);
        scores16(ds, dout, u->vT, 0, np, HS, TP);
        /* ds is scale * ds_j; both 0 past the causal edge, so the axpys over np add nothing there */
        for (int64_t i = 0; i < np; i++) {
            p[i] = i < n ? expf(p[i] * u->scale - lse[r]) : 0.0f;
            ds[i] = i < n ? p[i] * (ds[i] - D[r]) * u->scale : 0.0f;
        }
        zero16(u->acc, HSP);
        for (int64_t i = 0; i < n; i++) axpy16(u->acc, u->kp + i * HSP, ds[i], HSP);
        for (int64_t d = 0; d < HS; d++) dq[d] += u->acc[d];
        for (int64_t d = 0; d < HS; d++) {
            axpy16(u->dkT + d * TP, ds, q[d], np);
            axpy16(u->dvT + d * TP, p, dout[d], np);
        }
    }
}

typedef struct {
    float *out, *lse;                /* forward: (B*T, NH*HS), (B, NH, T) */
    float *dq, *dk, *dv;             /* backward: (B*T, NH*HS), (B*T, NKV*HS) x 2 */
    const float *dout, *o, *lse_in;  /* backward: (B*T, NH*HS) x 2, (B, NH, T) */
    const float *q, *k, *v;          /* (B*T, NH*HS), (B*T, NKV*HS) x 2 */
    int64_t B, T, NH, NKV, HS, G, TP, HSP;
    float scale;
    kiln_attn_train_fwd_fn fwd;
    kiln_attn_train_bwd_fn bwd;
    float *scratch;                  /* (nth, per_thread) floats */
    size_t per_thread;
} attn_train_job;

static size_t round32(size_t n) { return (n + 31) & ~(size_t)31; }

/* Scratch of one thread (kiln_attn_train_unit): kT, vT (HS, TP); dkT, dvT (HSP, TP); kp (TP, HSP) (the forward's
 * vp); P, dS (QB, TP); qb, ob (QB, HSP); s, dp (TP); acc (HSP). Every area a multiple of 16 floats. */
static size_t train_thread_floats(int64_t T, int64_t HS) {
    const size_t TP = round32((size_t)T), HSP = round16((size_t)HS), QB = KILN_ATTN_TRAIN_QB;
    const size_t per_key = kiln_ops_add(2 * (size_t)HS, kiln_ops_add(3 * HSP, 2 * QB + 2)); /* floats per TP column */
    return kiln_ops_add(kiln_ops_mul(per_key, TP), kiln_ops_add(2 * QB * HSP, HSP));
}

static kiln_attn_train_unit train_unit(const attn_train_job *j, int ith) {
    const size_t TP = (size_t)j->TP, HS = (size_t)j->HS, HSP = (size_t)j->HSP, QB = KILN_ATTN_TRAIN_QB;
    float *p = j->scratch + (size_t)ith * j->per_thread;
    kiln_attn_train_unit u = {.HS = j->HS, .HSP = j->HSP, .TP = j->TP, .scale = j->scale};
    u.kT = p, p += HS * TP;
    u.vT = p, p += HS * TP;
    u.dkT = p, p += HSP * TP;
    u.dvT = p, p += HSP * TP;
    u.kp = u.vp = p, p += TP * HSP; /* the forward sums rows of v, the backward rows of k */
    u.P = p, p += QB * TP;
    u.dS = p, p += QB * TP;
    u.qb = p, p += QB * HSP;
    u.ob = p, p += QB * HSP;
    u.s = p, p += TP;
    u.dp = p, p += TP;
    u.acc = p;
    return u;
}

/* Rows (b*T + t, g) of x (B*T, NKV*HS) into xT (HS, TP) transposed and/or xp (TP, HSP) padded; pads zeroed. The
 * transpose goes in blocks of 16 rows, whose slices stay in L1 while each is read HS times. */
static void copy_kv(float *xT, float *xp, const attn_train_job *j, const float *x, int64_t b, int64_t g) {
    const int64_t T = j->T, TP = j->TP, HS = j->HS, HSP = j->HSP, kvw = j->NKV * HS;
    const float *rows = x + b * T * kvw + g * HS;
    if (xT) {
        for (int64_t t0 = 0; t0 < TP; t0 += 16) {
            const int64_t nt = T - t0 < 16 ? (T > t0 ? T - t0 : 0) : 16;
            for (int64_t d = 0; d < HS; d++) {
                float *col = xT + d * TP + t0;
                for (int64_t t = 0; t < nt; t++) col[t] = rows[(t0 + t) * kvw + d];
                for (int64_t t = nt; t < 16; t++) col[t] = 0.0f;
            }
        }
    }
    if (xp) {
        for (int64_t t = 0; t < T; t++) {
            memcpy(xp + t * HSP, rows + t * kvw, (size_t)HS * sizeof *xp);
            for (int64_t d = HS; d < HSP; d++) xp[t * HSP + d] = 0.0f;
        }
        for (int64_t i = T * HSP; i < TP * HSP; i++) xp[i] = 0.0f;
    }
}

static void attention_train_forward_units(void *arg, int ith, int nth) {
    const attn_train_job *j = arg;
    const kiln_attn_train_unit u = train_unit(j, ith);
    const int64_t T = j->T, HS = j->HS, NH = j->NH;
    int64_t lo, hi;
    kiln_ops_split(j->B * j->NKV, ith, nth, &lo, &hi);
    for (int64_t unit = lo; unit < hi; unit++) {
        const int64_t b = unit / j->NKV, g = unit % j->NKV;
        copy_kv(u.kT, NULL, j, j->k, b, g);
        copy_kv(NULL, u.vp, j, j->v, b, g);
        for (int64_t h = g * j->G; h < (g + 1) * j->G; h++)
            for (int64_t t = 0; t < T; t++) {
                const int64_t row = ((b * T + t) * NH + h) * HS;
                j->fwd(&u, j->out + row, j->lse + (b * NH + h) * T + t, j->q + row, t + 1);
            }
    }
}

static void attention_train_backward_units(void *arg, int ith, int nth) {
    const attn_train_job *j = arg;
    const kiln_attn_train_unit u = train_unit(j, ith);
    const int64_t T = j->T, TP = j->TP, HS = j->HS, NH = j->NH, kvw = j->NKV * HS;
    int64_t lo, hi;
    kiln_ops_split(j->B * j->NKV, ith, nth, &lo, &hi);
    for (int64_t unit = lo; unit < hi; unit++) {
        const int64_t b = unit / j->NKV, g = unit % j->NKV;
        copy_kv(u.kT, u.kp, j, j->k, b, g);
        copy_kv(u.vT, NULL, j, j->v, b, g);
        zero16(u.dkT, j->HSP * TP);
        zero16(u.dvT, j->HSP * TP);
        for (int64_t h = g * j->G; h < (g + 1) * j->G; h++)
            for (int64_t t0 = 0; t0 < T; t0 += KILN_ATTN_TRAIN_QB) {
                const int64_t nt = T - t0 < KILN_ATTN_TRAIN_QB ? T - t0 : KILN_ATTN_TRAIN_QB;
                const int64_t row = ((b * T + t0) * NH + h) * HS;
                float D[KILN_ATTN_TRAIN_QB];
                for (int64_t r = 0; r < nt; r++) {
                    const float *dout = j->dout + row + r * NH * HS, *o = j->o + row + r * NH * HS;
                    D[r] = 0.0f;
                    for (int64_t d = 0; d < HS; d++) D[r] += dout[d] * o[d];
                }
                j->bwd(&u, j->dq + row, j->q + row, j->dout + row, D, j->lse_in + (b * NH + h) * T + t0, t0, nt, NH * HS);
            }
        for (int64_t t0 = 0; t0 < T; t0 += 16) /* back from transposed, 16 rows at a time as copy_kv */
            for (int64_t d = 0; d < HS; d++)
                for (int64_t t = t0; t < T && t < t0 + 16; t++) {
                    j->dk[(b * T + t) * kvw + g * HS + d] += u.dkT[d * TP + t];
                    j->dv[(b * T + t) * kvw + g * HS + d] += u.dvT[d * TP + t];
                }
    }
}

size_t kiln_cpu_attention_train_scratch_size(int64_t T, int64_t max_width, int64_t NH, int n_threads) {
    if (T <= 0 || max_width <= 0 || NH <= 0 || n_threads <= 0) return 0;
    if (T > INT64_MAX / 2 || max_width > INT64_MAX / 2) return SIZE_MAX;
    /* NH * HS <= max_width (the q row is among the widest activations), so HS <= max_width / NH. */
    return kiln_ops_mul(kiln_ops_mul(train_thread_floats(T, max_width / NH), (size_t)n_threads), sizeof(float));
}

/* The job for B*T rows, without its tensors; a unit's work is ~T^2/2 * HS * G multiply-adds (x 5 backward). */
static attn_train_job train_job(kiln_ops_ctx *ctx, int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS,
                                bool *parallel) {
    assert(B >= 0 && T >= 0 && NKV > 0 && NH % NKV == 0 && HS > 0);
    *parallel = B * NKV > 1 && B * NH * T * T * HS >= (1 << 18);
    const int nth = *parallel ? kiln_ops_n_threads(ctx) : 1;
    size_t bytes;
    attn_train_job j = {.B = B, .T = T, .NH = NH, .NKV = NKV, .HS = HS, .G = NH / NKV,
                        .TP = (int64_t)round32((size_t)T), .HSP = (int64_t)round16((size_t)HS),
                        .scale = 1.0f / sqrtf((float)HS), .fwd = kiln_attn_train_fwd_scalar,
                        .bwd = kiln_attn_train_bwd_scalar, .scratch = kiln_ops_scratch(ctx, &bytes),
                        .per_thread = train_thread_floats(T, HS)};
#if defined(__x86_64__)
    if (kiln_cpu_ops_level() >= KILN_SIMD_AVX512 && HS <= KILN_ATTN_TRAIN_AVX512_MAX_HS) {
        j.fwd = kiln_attn_train_fwd_avx512;
        j.bwd = kiln_attn_train_bwd_avx512;
    }
#endif
    assert(j.scratch && j.per_thread * (size_t)nth * sizeof(float) <= bytes &&
           "attention scratch too small: size it with train_scratch_size");
    (void)nth;
    return j;
}

void kiln_cpu_attention_forward_train(kiln_ops_ctx *ctx, float *out, float *lse, const float *q, const float *k,
                                      const float *v, int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS) {
    if (B == 0 || T == 0) return;
    bool parallel;
    attn_train_job j = train_job(ctx, B, T, NH, NKV, HS, &parallel);
    j.out = out, j.lse = lse, j.q = q, j.k = k, j.v = v;
    kiln_ops_run(ctx, attention_train_forward_units, &j, parallel);
}

void kiln_cpu_attention_backward(kiln_ops_ctx *ctx, float *dq, float *dk, float *dv, const float *dout, const float *q,
                                 const float *k, const float *v, const float *out, const float *lse,
                                 int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS) {
    if (B == 0 || T == 0) return;
    bool parallel;
    attn_train_job j = train_job(ctx, B, T, NH, NKV, HS, &parallel);
    j.dq = dq, j.dk = dk, j.dv = dv, j.dout = dout, j.o = out, j.lse_in = lse, j.q = q, j.k = k, j.v = v;
    kiln_ops_run(ctx, attention_train_backward_units, &j, parallel);
}
