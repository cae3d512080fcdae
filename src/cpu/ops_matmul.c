/* ops_matmul.c: y (T, O) = x (T, I) W^T for a weight W of O rows of I in any computable block format, the
 * hot path of both decode and prefill.
 *
 * One pool job per call. Phase 1 quantizes each row of x once to W's vec_dot_type (Q8_0, Q8_1, Q8_K, F16,
 * BF16; F32 weights use x as it is) into the scratch, split over threads by rows, or by blocks of a row
 * when there are fewer rows than threads. A spin barrier ends it. Phase 2 hands out units of 16 weight rows
 * x a tile of tokens from an atomic counter; a unit computes y[t][o] = vec_dot(W row o, xq row t) for each t
 * of its tile and each o of its rows, so the 16 weight rows (a few tens of KiB) are read from memory once and
 * reused from L1/L2 for every token of the tile, which is what makes prefill compute-bound rather than
 * memory-bound. Where the weight type has a multi-row kernel at this level (kiln_cpu_get_gemm4: Q4_K, Q5_K,
 * Q6_K, Q8_0, Q4_1 on AVX2 and AVX-512), a unit takes its tokens in groups of 4 (tiles are multiples of 4) and the
 * kernel unpacks each weight block once for the 4; it gives the same bits as 4 vec_dot calls, so which tokens are
 * grouped does not change any result. Each output is one vec_dot whatever thread computes it, so the result does
 * not depend on the thread count (tests/test_ops.c checks 1, 2 and 3 threads bit for bit, and every type against a double
 * dot of the dequantized weights). */
#include "ops_internal.h"

/* Weight rows per unit: 16 outputs fill one 64-byte line of y, so threads never write the same line. */
#define MM_ROWS 16
/* The quantized activations of a token tile are kept under this many bytes, to stay in a 1-2 MiB L2. */
#define MM_TILE_BYTES (256 * 1024)

typedef struct {
    float *y;                    /* (T, O) */
    const float *x;              /* (T, I) */
    const char *w;               /* O rows, w_row bytes apart */
    size_t w_row;
    int64_t T, I, O;
    kiln_from_float_fn quantize; /* NULL: xq is x itself (F32 weights) */
    int64_t q_blck;              /* elements per vec_dot_type block */
    size_t q_bytes;              /* bytes per vec_dot_type block */
    kiln_vec_dot_fn dot;
    kiln_gemm4_fn dot4;          /* NULL, or dot for 4 activation rows at once (same results, bit for bit) */
    char *xq_out;                /* phase 1 writes the quantized rows here (the scratch) */
    const char *xq;              /* (T) rows of xq_row bytes that phase 2 reads: xq_out, or x for F32 */
    size_t xq_row;
    int64_t tile_t, n_tiles, n_chunks;
    atomic_int barrier;
    atomic_llong next_unit;
} matmul_job;

static void quantize_rows(matmul_job *j, int ith, int nth) {
    if (j->T >= nth) {
        int64_t lo, hi;
        kiln_ops_split(j->T, ith, nth, &lo, &hi);
        for (int64_t t = lo; t < hi; t++) j->quantize(j->x + t * j->I, j->xq_out + (size_t)t * j->xq_row, j->I);
        return;
    }
    /* Fewer rows than threads (decode): each thread takes a run of blocks of every row. Blocks are quantized
     * independently, so this gives the same bytes as whole rows. */
    int64_t lo, hi;
    kiln_ops_split(j->I / j->q_blck, ith, nth, &lo, &hi);
    if (hi == lo) return;
    for (int64_t t = 0; t < j->T; t++)
        j->quantize(j->x + t * j->I + lo * j->q_blck, j->xq_out + (size_t)t * j->xq_row + (size_t)lo * j->q_bytes,
                    (hi - lo) * j->q_blck);
}

static void matmul_job_run(void *arg, int ith, int nth) {
    matmul_job *j = arg;
    if (j->quantize) {
        quantize_rows(j, ith, nth);
        kiln_ops_barrier(&j->barrier, nth);
    }
    const int64_t n_units = j->n_tiles * j->n_chunks;
    for (;;) {
        const int64_t u = atomic_fetch_add_explicit(&j->next_unit, 1, memory_order_relaxed);
        if (u >= n_units) break;
        const int64_t t0 = u / j->n_chunks * j->tile_t, o0 = u % j->n_chunks * MM_ROWS;
        const int64_t t1 = t0 + j->tile_t < j->T ? t0 + j->tile_t : j->T;
        const int64_t o1 = o0 + MM_ROWS < j->O ? o0 + MM_ROWS : j->O;
        int64_t t = t0;
        /* Groups of 4 tokens: each weight block is unpacked once for the 4 (tile_t is a multiple of 4). */
        if (j->dot4)
            for (; t + 4 <= t1; t += 4) {
                const char *xq = j->xq + (size_t)t * j->xq_row;
                float *y = j->y + t * j->O;
                for (int64_t o = o0; o < o1; o++) j->dot4(j->I, &y[o], (size_t)j->O, j->w + (size_t)o * j->w_row, xq, j->xq_row);
            }
        for (; t < t1; t++) {
            const char *xq = j->xq + (size_t)t * j->xq_row;
            float *y = j->y + t * j->O;
            for (int64_t o = o0; o < o1; o++) j->dot(j->I, &y[o], j->w + (size_t)o * j->w_row, xq);
        }
    }
}

kiln_gemm4_fn kiln_cpu_get_gemm4(kiln_type t, kiln_simd level) {
#if defined(__x86_64__)
    /* Each multi-row kernel with the single-row kernel it matches bit for bit: used only when that is the one
     * vec_dot dispatch picks at this level. */
    static const struct { kiln_type type; kiln_vec_dot_fn dot; kiln_gemm4_fn dot4; } table[] = {
        {KILN_TYPE_Q4_K, kiln_vec_dot_q4_K_q8_K_avx512, kiln_gemm4_q4_K_q8_K_avx512},
        {KILN_TYPE_Q8_0, kiln_vec_dot_q8_0_q8_0_avx512, kiln_gemm4_q8_0_q8_0_avx512},
        {KILN_TYPE_Q6_K, kiln_vec_dot_q6_K_q8_K_avx512, kiln_gemm4_q6_K_q8_K_avx512},
        {KILN_TYPE_Q4_1, kiln_vec_dot_q4_1_q8_1_avx512, kiln_gemm4_q4_1_q8_1_avx512},
        {KILN_TYPE_Q5_K, kiln_vec_dot_q5_K_q8_K_avx512, kiln_gemm4_q5_K_q8_K_avx512},
        {KILN_TYPE_Q4_K, kiln_vec_dot_q4_K_q8_K_avx2, kiln_gemm4_q4_K_q8_K_avx2},
        {KILN_TYPE_Q8_0, kiln_vec_dot_q8_0_q8_0_avx2, kiln_gemm4_q8_0_q8_0_avx2},
        {KILN_TYPE_Q6_K, kiln_vec_dot_q6_K_q8_K_avx2, kiln_gemm4_q6_K_q8_K_avx2},
        {KILN_TYPE_Q4_1, kiln_vec_dot_q4_1_q8_1_avx2, kiln_gemm4_q4_1_q8_1_avx2},
        {KILN_TYPE_Q5_K, kiln_vec_dot_q5_K_q8_K_avx2, kiln_gemm4_q5_K_q8_K_avx2},
    };
    const kiln_vec_dot_fn dot = kiln_get_vec_dot(t, level);
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (table[i].type == t && table[i].dot == dot) return table[i].dot4;
#endif
    (void)t, (void)level;
    return NULL;
}

/* Bytes of one activation row of width n in type t, rounding n up to whole blocks. */
static size_t act_row_bytes(kiln_type t, int64_t n) {
    const int64_t b = kiln_type_block_size(t);
    return kiln_ops_mul((size_t)((n + b - 1) / b), kiln_type_block_bytes(t));
}

/* The widest activation row of any vec_dot_type (F16/BF16: 2 bytes an element, Q8_0 34/32, Q8_1 36/32,
 * Q8_K 292/256), for T rows. F32 weights need none: x is used in place. */
size_t kiln_cpu_matmul_scratch_size(int64_t T, int64_t max_width) {
    static const kiln_type act_types[] = {KILN_TYPE_F16, KILN_TYPE_BF16, KILN_TYPE_Q8_0, KILN_TYPE_Q8_1, KILN_TYPE_Q8_K};
    if (T <= 0 || max_width <= 0) return 0;
    size_t row = 0;
    for (size_t i = 0; i < sizeof act_types / sizeof act_types[0]; i++) {
        size_t b = act_row_bytes(act_types[i], max_width);
        if (b > row) row = b;
    }
    return kiln_ops_mul(row, (size_t)T);
}

void kiln_cpu_matmul_forward(kiln_ops_ctx *ctx, float *y, const float *x, const kiln_tensor_view *W, int64_t T) {
    const kiln_simd level = kiln_cpu_ops_level();
    const kiln_type_traits *tt = kiln_type_traits_get(W->type);
    assert(tt && tt->computable && "weight type without vec_dot: kiln_model_load rejects it");
    const kiln_type vt = tt->vec_dot_type;
    const int64_t I = W->ne[0], O = W->ne[1];
    assert(I % tt->blck_size == 0 && I % kiln_type_block_size(vt) == 0);

    matmul_job j = {.y = y, .x = x, .w = W->data, .w_row = W->nb[1], .T = T, .I = I, .O = O,
                    .q_blck = kiln_type_block_size(vt), .q_bytes = kiln_type_block_bytes(vt),
                    .dot = kiln_get_vec_dot(W->type, level)};
    assert(j.dot);
    int64_t rows_fit = T; /* activation rows the scratch holds */
    if (vt == KILN_TYPE_F32) {
        j.xq_row = (size_t)I * sizeof(float);
    } else {
        j.quantize = kiln_get_from_float(vt, level);
        assert(j.quantize);
        size_t bytes;
        j.xq = j.xq_out = kiln_ops_scratch(ctx, &bytes);
        j.xq_row = kiln_type_row_bytes(vt, I);
        rows_fit = (int64_t)(bytes / j.xq_row);
        assert(rows_fit >= 1 && "scratch smaller than one activation row: size it with scratch_size");
    }
    if (T >= 4) j.dot4 = kiln_cpu_get_gemm4(W->type, level);
    int64_t tile = (int64_t)(MM_TILE_BYTES / j.xq_row) / 4 * 4;
    j.tile_t = tile < 4 ? 4 : tile;
    j.n_chunks = (O + MM_ROWS - 1) / MM_ROWS;

    /* Rows beyond what the scratch holds (a caller that sized it for a smaller batch) go in further passes. */
    for (int64_t t0 = 0; t0 < T; t0 += rows_fit) {
        const int64_t n = T - t0 < rows_fit ? T - t0 : rows_fit;
        j.x = x + t0 * I;
        j.y = y + t0 * O;
        j.T = n;
        if (vt == KILN_TYPE_F32) j.xq = (const char *)j.x;
        j.n_tiles = (n + j.tile_t - 1) / j.tile_t;
        atomic_init(&j.barrier, 0);
        atomic_init(&j.next_unit, 0);
        /* Below ~256k multiply-adds (tens of us on one core) a pool wake-up costs more than it saves. */
        kiln_ops_run(ctx, matmul_job_run, &j, n * O * I >= (1 << 18));
    }
}
