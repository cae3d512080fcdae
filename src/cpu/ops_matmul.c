/* ops_matmul.c: y (T, O) = x (T, I) W^T for a weight W of O rows of I in any computable block format, the
 * hot path of both decode and prefill; and n such matmuls of one x in one job (the forward's q, k, v).
 *
 * One pool job per call. Phase 1 quantizes each row of x once into the scratch, split over threads by rows, and
 * a spin barrier ends it; with fewer rows than threads (decode) each thread quantizes the rows into its own area
 * instead, which costs a microsecond and saves the barrier's wait for the slowest thread. Phase 2 hands out units
 * of weight rows x a tile of tokens from an atomic counter, so each weight row is read from memory once per tile
 * and reused from L1/L2 for every token of it: prefill is compute-bound, not memory-bound. A unit never writes the
 * 64-byte line of y another unit writes (16 floats per row and token).
 *
 * Two kernels, per weight:
 *  - Repacked (the weight is in ctx's prepared set, ops_repack.c, packed at this level: AVX-512, or AVX2 for
 *    the types of gemm_repack_avx2.c): x is quantized
 *    into the panel the VNNI kernel reads (Q8_K blocks for K-quants and IQ4_XS; Q8_0/Q8_1 quants with float scales and
 *    sums), and a unit is a run of 16-row groups, run for 8 tokens at a time, or 16 through the AMX tile kernels
 *    (gemm_repack_amx.c) where the CPU has them and KILN_AMX=1 asks. Results agree with vec_dot to float rounding
 *    (the integer sums are the same) and do not depend on how tokens are grouped: the AMX kernels give the VNNI
 *    kernels' bits.
 *  - In place: x is quantized to W's vec_dot_type; a unit is 16 rows and each output is one vec_dot, or, where
 *    the weight type has a multi-row kernel at this level (kiln_cpu_get_gemm4), groups of 4 tokens share each
 *    unpacked weight block with the same bits as 4 vec_dot calls.
 * Either way an output is computed the same way whatever thread computes it, so results do not depend on the
 * thread count (tests/test_ops.c checks 1, 2 and 3 threads bit for bit and every type against a double dot of
 * the dequantized weights; tests/test_gemm.c the repacked kernels the same way). */
#include "ops_repack.h"

#include <stdlib.h>

/* Weight rows per unit in place: 16 outputs fill one 64-byte line of y, so threads never write the same line. */
#define MM_ROWS 16
/* The quantized activations of a token tile are kept under this many bytes, to stay in a 1-2 MiB L2. */
#define MM_TILE_BYTES (256 * 1024)
/* Units of repacked rows per thread in decode (see the comment where it is used). */
#define MM_UNITS_PER_THREAD 2
/* Matmuls one job can carry (q, k, v). */
#define MM_MAX_PARTS 4

typedef struct {
    float *y;                    /* (T, O) */
    int64_t O;
    const kiln_cpu_packed *P;    /* repacked (nb blocks a row), or NULL: */
    int64_t nb;
    kiln_pack_gemm_fn amx;       /*   P's AMX kernel for runs of 16 tokens, or NULL */
    kiln_pack_batch_fn batch;    /*   P's batch kernel (KILN_PACK_BATCH_MIN tokens or more), or NULL */
    const char *w;               /*   O rows, w_row bytes apart */
    size_t w_row;
    kiln_vec_dot_fn dot;
    kiln_gemm4_fn dot4;          /*   NULL, or dot for 4 activation rows at once (same results, bit for bit) */
    int64_t n_chunks;            /* row units per token tile: runs of `groups` 16-row groups, or MM_ROWS rows */
    int64_t groups;              /* repacked: groups per unit */
    int64_t units_end;           /* units of this part and those before it */
} mm_part;

/* How x is quantized for the parts of a job: all parts of one job share it. */
typedef struct {
    kiln_type vt;                /* W's vec_dot_type; F32: x is used as it is */
    kiln_type panel;             /* KILN_TYPE_COUNT, or the panel type (Q8_0, Q8_1) of the repacked weights */
} mm_act;

typedef struct {
    mm_part part[MM_MAX_PARTS];
    int n_parts;
    const float *x;              /* (T, I) */
    int64_t T, I;
    mm_act act;
    kiln_simd level;
    kiln_from_float_fn quantize; /* for vec_dot_type rows */
    int64_t q_blck;              /* elements per block of the quantized row: work is split on these */
    size_t q_bytes;              /* bytes per block (vec_dot_type rows) */
    char *xq_out;                /* phase 1 writes the quantized rows here (the scratch) */
    const char *xq;              /* (T) rows of xq_row bytes that phase 2 reads: xq_out, or x for F32 */
    size_t xq_row;
    bool own_rows;               /* fewer rows than threads: each thread quantizes all T rows into its own area of
                                  * the scratch (T rows from xq_out + ith * T rows) and starts without a barrier */
    int64_t tile_t, n_tiles;
    atomic_int barrier;
    atomic_llong next_unit;
} matmul_job;

static void quantize_blocks(const matmul_job *j, char *xq, int64_t t, int64_t b0, int64_t b1) {
    const float *x = j->x + t * j->I;
    char *row = xq + (size_t)t * j->xq_row;
    if (j->act.panel != KILN_TYPE_COUNT)
        kiln_pack_panel_quantize(j->act.panel, j->level, x, row, j->I, b0, b1);
    else
        j->quantize(x + b0 * j->q_blck, row + (size_t)b0 * j->q_bytes, (b1 - b0) * j->q_blck);
}

static void quantize_rows(matmul_job *j, int ith, int nth) {
    const int64_t nb = j->I / j->q_blck;
    if (j->T >= nth) {
        int64_t lo, hi;
        kiln_ops_split(j->T, ith, nth, &lo, &hi);
        for (int64_t t = lo; t < hi; t++) quantize_blocks(j, j->xq_out, t, 0, nb);
        return;
    }
    /* Fewer rows than threads (decode): each thread takes a run of blocks of every row. Blocks are quantized
     * independently, so this gives the same bytes as whole rows. */
    int64_t lo, hi;
    kiln_ops_split(nb, ith, nth, &lo, &hi);
    if (hi == lo) return;
    for (int64_t t = 0; t < j->T; t++) quantize_blocks(j, j->xq_out, t, lo, hi);
}

/* How far ahead a matmul of at most KILN_PACK_NT tokens (decode: each group read once) prefetches the repacked
 * weights (kiln_pack_prefetch): 16 KiB, or KILN_PREFETCH bytes (0: off), read once. Measured on the 2-core Zen 4 VM
 * at one thread, tok/s for none / 4 / 8 / 16 / 32 KiB: 124m Q4_K_M 135 / 210 / 265 / 269-328 / 281, Qwen2.5-0.5B
 * 31 / 45 / 48 / 50-52 / 53, SmolLM2 111 / 167 / 182 / 174-193 / 196 (the spread of a busy VM is 10-20%). Issuing
 * the whole next group at the start of each group instead did worse (124m 176, Qwen 31). */
static size_t mm_prefetch_bytes(void) {
    static atomic_llong bytes = -1;
    long long b = atomic_load_explicit(&bytes, memory_order_relaxed);
    if (b < 0) {
        const char *e = getenv("KILN_PREFETCH");
        b = e && *e ? atoll(e) : 16384;
        if (b < 0) b = 0;
        atomic_store_explicit(&bytes, b, memory_order_relaxed);
    }
    return (size_t)b;
}

/* One unit: row chunk `chunk` of part p for tokens [t0, t1), reading the quantized rows at xq. */
static void run_unit(const matmul_job *j, const char *xq_base, const mm_part *p, int64_t chunk, int64_t t0, int64_t t1) {
    if (p->P) {
        const size_t pf = j->T <= KILN_PACK_NT ? mm_prefetch_bytes() : 0;
        const int64_t g1 = (chunk + 1) * p->groups < p->P->n_groups ? (chunk + 1) * p->groups : p->P->n_groups;
        for (int64_t g = chunk * p->groups; g < g1; g++) {
            const int64_t o0 = g * KILN_PACK_ROWS;
            kiln_pack_call c = {.w = p->P->data + (size_t)g * p->P->group_bytes, .nb = p->nb,
                                .x_row = j->xq_row, .ldy = (size_t)p->O,
                                .nrows = (int)(p->O - o0 < KILN_PACK_ROWS ? p->O - o0 : KILN_PACK_ROWS),
                                .pf = pf};
            if (p->batch && t1 - t0 >= KILN_PACK_BATCH_MIN) {
                c.x = xq_base + (size_t)t0 * j->xq_row;
                c.y = p->y + t0 * p->O + o0;
                p->batch(&c, t1 - t0);
                continue;
            }
            for (int64_t t = t0; t < t1; t += c.nt) {
                c.x = xq_base + (size_t)t * j->xq_row;
                c.y = p->y + t * p->O + o0;
                if (p->amx && t1 - t >= KILN_PACK_AMX_NT) {
                    c.nt = KILN_PACK_AMX_NT;
                    p->amx(&c);
                } else {
                    c.nt = (int)(t1 - t < KILN_PACK_NT ? t1 - t : KILN_PACK_NT);
                    p->P->gemm(&c);
                }
            }
        }
        return;
    }
    const int64_t o0 = chunk * MM_ROWS, o1 = o0 + MM_ROWS < p->O ? o0 + MM_ROWS : p->O;
    int64_t t = t0;
    /* Groups of 4 tokens: each weight block is unpacked once for the 4 (tile_t is a multiple of 4). */
    if (p->dot4)
        for (; t + 4 <= t1; t += 4) {
            const char *xq = xq_base + (size_t)t * j->xq_row;
            float *y = p->y + t * p->O;
            for (int64_t o = o0; o < o1; o++) p->dot4(j->I, &y[o], (size_t)p->O, p->w + (size_t)o * p->w_row, xq, j->xq_row);
        }
    for (; t < t1; t++) {
        const char *xq = xq_base + (size_t)t * j->xq_row;
        float *y = p->y + t * p->O;
        for (int64_t o = o0; o < o1; o++) p->dot(j->I, &y[o], p->w + (size_t)o * p->w_row, xq);
    }
}

static void matmul_job_run(void *arg, int ith, int nth) {
    matmul_job *j = arg;
    const char *xq = j->xq;
    if (j->own_rows && nth > 1) {
        /* a few microseconds of quantizing twice cost less than a barrier, which waits for the slowest thread to arrive */
        char *mine = j->xq_out + (size_t)ith * (size_t)j->T * j->xq_row;
        for (int64_t t = 0; t < j->T; t++) quantize_blocks(j, mine, t, 0, j->I / j->q_blck);
        xq = mine;
    } else if (j->act.vt != KILN_TYPE_F32) {
        quantize_rows(j, ith, nth);
        kiln_ops_barrier(&j->barrier, nth);
    }
    /* Units run part by part, and within a part tile by tile, so consecutive units share their tokens. */
    const int64_t n_units = j->part[j->n_parts - 1].units_end;
    int p = 0;
    for (;;) {
        const int64_t u = atomic_fetch_add_explicit(&j->next_unit, 1, memory_order_relaxed);
        if (u >= n_units) break;
        while (u >= j->part[p].units_end) p++;
        const mm_part *part = &j->part[p];
        const int64_t local = u - (p ? j->part[p - 1].units_end : 0);
        const int64_t t0 = local / part->n_chunks * j->tile_t, t1 = t0 + j->tile_t < j->T ? t0 + j->tile_t : j->T;
        run_unit(j, xq, part, local % part->n_chunks, t0, t1);
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
 * Q8_K 292/256) or panel (Q8_0/Q8_1 panels: 40/32 rounded up to 64 bytes), for T rows. F32 weights need
 * none: x is used in place. */
size_t kiln_cpu_matmul_scratch_size(int64_t T, int64_t max_width) {
    static const kiln_type act_types[] = {KILN_TYPE_F16, KILN_TYPE_BF16, KILN_TYPE_Q8_0, KILN_TYPE_Q8_1, KILN_TYPE_Q8_K};
    if (T <= 0 || max_width <= 0) return 0;
    size_t row = kiln_pack_panel_row_bytes(KILN_TYPE_Q8_0, (max_width + 31) / 32 * 32);
    for (size_t i = 0; i < sizeof act_types / sizeof act_types[0]; i++) {
        size_t b = act_row_bytes(act_types[i], max_width);
        if (b > row) row = b;
    }
    return kiln_ops_mul(row, (size_t)T);
}

/* The part computing y from W, and how it wants x quantized. */
static mm_part make_part(const kiln_ops_ctx *ctx, kiln_simd level, float *y, const kiln_tensor_view *W, mm_act *act) {
    const kiln_type_traits *tt = kiln_type_traits_get(W->type);
    assert(tt && tt->computable && "weight type without vec_dot: kiln_model_load rejects it");
    const int64_t I = W->ne[0];
    assert(I % tt->blck_size == 0 && I % kiln_type_block_size(tt->vec_dot_type) == 0);
    mm_part p = {.y = y, .O = W->ne[1]};
    /* packed at another level (KILN_SIMD lowered since): the row kernels of this level */
    const kiln_cpu_packed *P = kiln_cpu_packed_find(ctx, W);
    if (P && P->gemm == kiln_pack_kernel(W->type, level)) {
        p.P = P;
        p.nb = I / tt->blck_size;
        p.amx = P->gemm16 && kiln_cpu_ops_amx() ? P->gemm16 : NULL;
        p.batch = p.amx ? NULL : P->batch;
        p.groups = 1;
        p.n_chunks = P->n_groups;
        /* Q8_K-dotted types read plain Q8_K rows, as their vec_dot does; the others a Q8_0 or Q8_1 panel */
        const bool q8_K = tt->vec_dot_type == KILN_TYPE_Q8_K;
        *act = (mm_act){.vt = tt->vec_dot_type, .panel = q8_K ? KILN_TYPE_COUNT : kiln_pack_panel_type(W->type)};
        return p;
    }
    p.w = W->data;
    p.w_row = W->nb[1];
    p.dot = kiln_get_vec_dot(W->type, level);
    assert(p.dot);
    p.dot4 = kiln_cpu_get_gemm4(W->type, level);
    p.n_chunks = (p.O + MM_ROWS - 1) / MM_ROWS;
    *act = (mm_act){.vt = tt->vec_dot_type, .panel = KILN_TYPE_COUNT};
    return p;
}

void kiln_cpu_matmul_n_forward(kiln_ops_ctx *ctx, int n, float *const *y, const float *x, const kiln_tensor_view *const *W,
                               int64_t T) {
    assert(n >= 1);
    const kiln_simd level = kiln_cpu_ops_level();
    const int64_t I = W[0]->ne[0];
    matmul_job j = {.x = x, .T = T, .I = I, .level = level};
    /* Parts go together when they read the same quantized x; otherwise each runs as a job of its own. */
    bool together = n <= MM_MAX_PARTS;
    for (int i = 0; i < n && together; i++) {
        mm_act a;
        j.part[i] = make_part(ctx, level, y[i], W[i], &a);
        together = W[i]->ne[0] == I && (i == 0 || (a.vt == j.act.vt && a.panel == j.act.panel));
        if (i == 0) j.act = a;
    }
    if (!together) {
        for (int i = 0; i < n; i++) kiln_cpu_matmul_n_forward(ctx, 1, &y[i], x, &W[i], T);
        return;
    }
    j.n_parts = n;

    int64_t rows_fit = T; /* activation rows the scratch holds */
    if (j.act.vt == KILN_TYPE_F32) {
        j.xq_row = (size_t)I * sizeof(float);
        j.q_blck = I;
    } else {
        size_t bytes;
        j.xq = j.xq_out = kiln_ops_scratch(ctx, &bytes);
        if (j.act.panel != KILN_TYPE_COUNT) {
            j.xq_row = kiln_pack_panel_row_bytes(j.act.panel, I);
            j.q_blck = 32;
        } else {
            j.quantize = kiln_get_from_float(j.act.vt, level);
            assert(j.quantize);
            j.xq_row = kiln_type_row_bytes(j.act.vt, I);
            j.q_blck = kiln_type_block_size(j.act.vt);
            j.q_bytes = kiln_type_block_bytes(j.act.vt);
        }
        rows_fit = (int64_t)(bytes / j.xq_row);
        assert(rows_fit >= 1 && "scratch smaller than one activation row: size it with scratch_size");
    }
    /* Token tiles: a multiple of the AMX kernels' 16 tokens (and so of the VNNI kernels' 8 and gemm4's 4) */
    int64_t tile = (int64_t)(MM_TILE_BYTES / j.xq_row) / KILN_PACK_AMX_NT * KILN_PACK_AMX_NT;
    j.tile_t = tile < KILN_PACK_AMX_NT ? KILN_PACK_AMX_NT : tile;

    /* Rows beyond what the scratch holds (a caller that sized it for a smaller batch) go in further passes. */
    const int nth = kiln_ops_n_threads(ctx);
    for (int64_t t0 = 0; t0 < T; t0 += rows_fit) {
        const int64_t nt = T - t0 < rows_fit ? T - t0 : rows_fit;
        j.x = x + t0 * I;
        j.T = nt;
        if (j.act.vt == KILN_TYPE_F32) j.xq = (const char *)j.x;
        j.n_tiles = (nt + j.tile_t - 1) / j.tile_t;
        int64_t units = 0, work = 0;
        for (int i = 0; i < n; i++) {
            /* Decode is memory-bound: a unit is a run of groups, so each thread streams long stretches of memory
             * (the hardware prefetcher restarts at every 4 KiB page and loses a stream whose units interleave with
             * another thread's: 1-group units decoded SmolLM2 at 282 tok/s, runs of 1/8 of a thread's share at 315,
             * of half at 335). Prefill reads each group once per 8 tokens from L1: 1-group units balance best. */
            if (j.part[i].P) {
                const int64_t ng = j.part[i].P->n_groups, per = nt <= KILN_PACK_NT ? ng / (MM_UNITS_PER_THREAD * nth) : 1;
                j.part[i].groups = per > 1 ? per : 1;
                j.part[i].n_chunks = (ng + j.part[i].groups - 1) / j.part[i].groups;
            }
            j.part[i].y = y[i] + t0 * j.part[i].O;
            units += j.n_tiles * j.part[i].n_chunks;
            j.part[i].units_end = units;
            work += nt * j.part[i].O * I;
        }
        atomic_init(&j.barrier, 0);
        atomic_init(&j.next_unit, 0);
        j.own_rows = j.act.vt != KILN_TYPE_F32 && nt < nth && nt * nth <= rows_fit;
        /* Below ~256k multiply-adds (tens of us on one core) a pool wake-up costs more than it saves. */
        kiln_ops_run(ctx, matmul_job_run, &j, work >= (1 << 18));
    }
}

void kiln_cpu_matmul_forward(kiln_ops_ctx *ctx, float *y, const float *x, const kiln_tensor_view *W, int64_t T) {
    kiln_cpu_matmul_n_forward(ctx, 1, &y, x, &W, T);
}
