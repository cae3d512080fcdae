/* ops_repack.c: weights repacked 16 rows at a time for the VNNI kernels of gemm_repack_avx512.c (layout in
 * ops_repack.h), the activation panels those kernels read, and the prepared set a session keeps.
 *
 * Why repack: a row-major block format makes a dot product end in a horizontal sum per row, and its scales come
 * one row at a time. With 16 rows interleaved 4 quants at a time, one vpdpbusd advances all 16 rows against 4
 * activation bytes broadcast from memory, and every scale step is a vector of 16 rows. That is what lets decode
 * run at memory speed and prefill near the int8 peak (the approach of ik_llama.cpp's run-time repacking).
 *
 * Memory: the copy is the size of the weights it replaces (QS + AUX = 16 GGUF blocks), plus < 64 bytes of
 * padding per 16 rows and zero rows up to a multiple of 16. When the caller says the views point into a
 * read-only file mapping, each weight's pages are dropped from the process (madvise DONTNEED) once its copy is
 * made, so resident memory holds one copy of the weights, not two, at any time beyond the weight being packed.
 * A page dropped by mistake would only be read again from the file. tests/test_gemm.c covers packing through
 * the kernels' results on random and raw-byte weights of every packed type. */
#include "ops_repack.h"

#include "fp16.h"
#include "status.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* ---------------------------------------------------------------- formats */

typedef struct {
    kiln_type type;
    size_t qs, aux; /* bytes per block of a group */
    void (*pack)(const uint8_t *const rows[KILN_PACK_ROWS], int64_t nb, uint8_t *qs, uint8_t *aux);
    kiln_pack_gemm_fn avx512, avx2; /* avx2 NULL where the type has no AVX2 kernel */
    kiln_pack_gemm_fn amx;          /* NULL where the type has no AMX kernel */
} pack_format;

/* Lane r of a 64-byte vector: 4 bytes of row r, each XORed with flip. */
static inline void put4(uint8_t *vec, int r, const uint8_t *src, uint8_t flip) {
    uint32_t v;
    memcpy(&v, src, 4);
    v ^= flip * 0x01010101u;
    memcpy(vec + 4 * r, &v, 4);
}

static const uint8_t zero_block[sizeof(block_q6_K) > sizeof(block_q5_K) ? sizeof(block_q6_K) : sizeof(block_q5_K)];
static_assert(sizeof(block_q6_K) >= sizeof(block_iq4_xs), "zero_block covers every packed block");

static void pack_q8_0(const uint8_t *const rows[KILN_PACK_ROWS], int64_t nb, uint8_t *qs, uint8_t *aux) {
    for (int64_t b = 0; b < nb; b++)
        for (int r = 0; r < KILN_PACK_ROWS; r++) {
            const block_q8_0 *x = rows[r] ? (const block_q8_0 *)rows[r] + b : (const block_q8_0 *)zero_block;
            for (int k = 0; k < 8; k++) put4(qs + b * KILN_PACK_Q8_0_QS + 64 * k, r, (const uint8_t *)x->qs + 4 * k, 0x80);
            memcpy(aux + b * KILN_PACK_Q8_0_AUX + 2 * r, &x->d, 2);
        }
}

/* The 32-element types Q4_0, Q4_1, IQ4_NL, Q5_0 and Q5_1: 4 vectors of nibbles (lane r of vector k: qs[4k..4k+3] of row r), then (Q5) one vector of fifth
 * bits, then d (and m) as 16 f16 each. Lane r of the qh vector is row r's qh rearranged so that bit m of byte i
 * is the fifth bit of element 4m + i: vector k's low nibbles (elements 4k + i) find theirs at bit k of byte i,
 * its high nibbles (16 + 4k + i) at bit 4 + k, each moved to bit 4 by one shift and a mask for all 16 rows. */
typedef struct {
    size_t bytes;         /* block size */
    int qs, qh, d, m;     /* byte offsets in the block; qh and m -1 where the type has none */
    size_t bq, ba;        /* bytes of qs and aux per block of a group */
} b32_layout;

/* spread[v]: byte v of qh (elements 8b + t, t < 8) rearranged for b = 0, before its shift by 2b: element t goes
 * to bit (t >> 2) of byte (t & 3). */
static void q5_spread_table(uint32_t spread[256]) {
    for (int v = 0; v < 256; v++) {
        uint32_t w = 0;
        for (int t = 0; t < 8; t++)
            if (v >> t & 1) w |= 1u << (8 * (t & 3) + (t >> 2));
        spread[v] = w;
    }
}
static uint32_t q5_spread(const uint32_t spread[256], const uint8_t qh[4]) {
    return spread[qh[0]] | spread[qh[1]] << 2 | spread[qh[2]] << 4 | spread[qh[3]] << 6;
}

static void pack_b32(const uint8_t *const rows[KILN_PACK_ROWS], int64_t nb, uint8_t *qs, uint8_t *aux, const b32_layout *L) {
    uint32_t spread[256];
    if (L->qh >= 0) q5_spread_table(spread);
    for (int64_t b = 0; b < nb; b++)
        for (int r = 0; r < KILN_PACK_ROWS; r++) {
            const uint8_t *x = rows[r] ? rows[r] + (size_t)b * L->bytes : zero_block;
            uint8_t *q = qs + b * L->bq, *a = aux + b * L->ba;
            for (int k = 0; k < 4; k++) put4(q + 64 * k, r, x + L->qs + 4 * k, 0);
            if (L->qh >= 0) {
                const uint32_t h = q5_spread(spread, x + L->qh);
                memcpy(q + 256 + 4 * r, &h, 4);
            }
            memcpy(a + 2 * r, x + L->d, 2);
            if (L->m >= 0) memcpy(a + 32 + 2 * r, x + L->m, 2);
        }
}

static const b32_layout layout_q4_0 = {sizeof(block_q4_0), 2, -1, 0, -1, KILN_PACK_Q4_0_QS, KILN_PACK_Q4_0_AUX};
static const b32_layout layout_q4_1 = {sizeof(block_q4_1), 4, -1, 0, 2, KILN_PACK_Q4_1_QS, KILN_PACK_Q4_1_AUX};
static const b32_layout layout_iq4_nl = {sizeof(block_iq4_nl), 2, -1, 0, -1, KILN_PACK_IQ4_NL_QS, KILN_PACK_IQ4_NL_AUX};
static const b32_layout layout_q5_0 = {sizeof(block_q5_0), 6, 2, 0, -1, KILN_PACK_Q5_0_QS, KILN_PACK_Q5_0_AUX};
static const b32_layout layout_q5_1 = {sizeof(block_q5_1), 8, 4, 0, 2, KILN_PACK_Q5_1_QS, KILN_PACK_Q5_1_AUX};
static void pack_q4_0(const uint8_t *const rows[KILN_PACK_ROWS], int64_t nb, uint8_t *qs, uint8_t *aux) {
    pack_b32(rows, nb, qs, aux, &layout_q4_0);
}
static void pack_q4_1(const uint8_t *const rows[KILN_PACK_ROWS], int64_t nb, uint8_t *qs, uint8_t *aux) {
    pack_b32(rows, nb, qs, aux, &layout_q4_1);
}
static void pack_iq4_nl(const uint8_t *const rows[KILN_PACK_ROWS], int64_t nb, uint8_t *qs, uint8_t *aux) {
    pack_b32(rows, nb, qs, aux, &layout_iq4_nl);
}
static void pack_q5_0(const uint8_t *const rows[KILN_PACK_ROWS], int64_t nb, uint8_t *qs, uint8_t *aux) {
    pack_b32(rows, nb, qs, aux, &layout_q5_0);
}
static void pack_q5_1(const uint8_t *const rows[KILN_PACK_ROWS], int64_t nb, uint8_t *qs, uint8_t *aux) {
    pack_b32(rows, nb, qs, aux, &layout_q5_1);
}

/* IQ4_XS: per sub-block j of 32, Q4_0's 4 vectors of nibbles (qs[16j..]); then d, the 16 rows' scales_h as two
 * planes of 16 bytes (low byte, high byte), and scales_l[4] as 4 planes. */
static void pack_iq4_xs(const uint8_t *const rows[KILN_PACK_ROWS], int64_t nb, uint8_t *qs, uint8_t *aux) {
    for (int64_t b = 0; b < nb; b++)
        for (int r = 0; r < KILN_PACK_ROWS; r++) {
            const block_iq4_xs *x = rows[r] ? (const block_iq4_xs *)rows[r] + b : (const block_iq4_xs *)zero_block;
            uint8_t *q = qs + b * KILN_PACK_IQ4_XS_QS, *a = aux + b * KILN_PACK_IQ4_XS_AUX;
            for (int j = 0; j < QK_K / 32; j++)
                for (int k = 0; k < 4; k++) put4(q + 256 * j + 64 * k, r, x->qs + 16 * j + 4 * k, 0);
            memcpy(a + 2 * r, &x->d, 2);
            a[32 + r] = (uint8_t)(x->scales_h & 0xFF);
            a[48 + r] = (uint8_t)(x->scales_h >> 8);
            for (int p = 0; p < QK_K / 64; p++) a[64 + 16 * p + r] = x->scales_l[p];
        }
}

/* Q4_K and Q5_K share the nibble and scale layout; Q5_K adds its qh after the nibbles. */
static void pack_k4(const uint8_t *const rows[KILN_PACK_ROWS], int64_t nb, uint8_t *qs, uint8_t *aux, bool q5) {
    const size_t bq = q5 ? KILN_PACK_Q5_K_QS : KILN_PACK_Q4_K_QS, ba = q5 ? KILN_PACK_Q5_K_AUX : KILN_PACK_Q4_K_AUX;
    for (int64_t b = 0; b < nb; b++)
        for (int r = 0; r < KILN_PACK_ROWS; r++) {
            const uint8_t *d, *scales, *nib, *qh = NULL;
            if (q5) {
                const block_q5_K *x = rows[r] ? (const block_q5_K *)rows[r] + b : (const block_q5_K *)zero_block;
                d = (const uint8_t *)&x->d, scales = x->scales, nib = x->qs, qh = x->qh;
            } else {
                const block_q4_K *x = rows[r] ? (const block_q4_K *)rows[r] + b : (const block_q4_K *)zero_block;
                d = (const uint8_t *)&x->d, scales = x->scales, nib = x->qs;
            }
            uint8_t *q = qs + b * bq, *a = aux + b * ba;
            for (int c = 0; c < 4; c++)
                for (int k = 0; k < 8; k++) put4(q + 512 * c + 64 * k, r, nib + 32 * c + 4 * k, 0);
            if (q5)
                for (int k = 0; k < 8; k++) put4(q + QK_K / 2 * KILN_PACK_ROWS + 64 * k, r, qh + 4 * k, 0);
            memcpy(a + 2 * r, d, 2);          /* d */
            memcpy(a + 32 + 2 * r, d + 2, 2); /* dmin */
            for (int p = 0; p < K_SCALE_SIZE; p++) a[64 + 16 * p + r] = scales[p];
        }
}
static void pack_q4_K(const uint8_t *const rows[KILN_PACK_ROWS], int64_t nb, uint8_t *qs, uint8_t *aux) {
    pack_k4(rows, nb, qs, aux, false);
}
static void pack_q5_K(const uint8_t *const rows[KILN_PACK_ROWS], int64_t nb, uint8_t *qs, uint8_t *aux) {
    pack_k4(rows, nb, qs, aux, true);
}

static void pack_q6_K(const uint8_t *const rows[KILN_PACK_ROWS], int64_t nb, uint8_t *qs, uint8_t *aux) {
    for (int64_t b = 0; b < nb; b++)
        for (int r = 0; r < KILN_PACK_ROWS; r++) {
            const block_q6_K *x = rows[r] ? (const block_q6_K *)rows[r] + b : (const block_q6_K *)zero_block;
            uint8_t *q = qs + b * KILN_PACK_Q6_K_QS, *a = aux + b * KILN_PACK_Q6_K_AUX;
            for (int h = 0; h < 2; h++)
                for (int k = 0; k < 8; k++) {
                    uint8_t *v = q + 1536 * h + 192 * k;
                    put4(v, r, x->ql + 64 * h + 4 * k, 0);
                    put4(v + 64, r, x->ql + 64 * h + 32 + 4 * k, 0);
                    put4(v + 128, r, x->qh + 32 * h + 4 * k, 0);
                }
            memcpy(a + 2 * r, &x->d, 2);
            for (int g = 0; g < QK_K / 16; g++) a[32 + 16 * g + r] = (uint8_t)x->scales[g];
        }
}

/* Q2_K and Q3_K: vector (n, k) of qs, lane r = qs[32n+4k..] of row r; Q3_K then 8 vectors of hmask (lane r =
 * hmask[4k..]); then d (and Q2_K's dmin) as 16 f16 each, and the scale bytes as planes of 16 (plane p: byte p of each
 * row's scales, 16 of them for Q2_K, 12 for Q3_K). */
static void pack_k23(const uint8_t *const rows[KILN_PACK_ROWS], int64_t nb, uint8_t *qs, uint8_t *aux, bool q3) {
    const size_t bq = q3 ? KILN_PACK_Q3_K_QS : KILN_PACK_Q2_K_QS, ba = q3 ? KILN_PACK_Q3_K_AUX : KILN_PACK_Q2_K_AUX;
    for (int64_t b = 0; b < nb; b++)
        for (int r = 0; r < KILN_PACK_ROWS; r++) {
            uint8_t *q = qs + b * bq, *a = aux + b * ba;
            const uint8_t *quants, *scales;
            int n_planes;
            if (q3) {
                const block_q3_K *x = rows[r] ? (const block_q3_K *)rows[r] + b : (const block_q3_K *)zero_block;
                for (int k = 0; k < 8; k++) put4(q + 1024 + 64 * k, r, x->hmask + 4 * k, 0);
                memcpy(a + 2 * r, &x->d, 2);
                quants = x->qs, scales = x->scales, n_planes = K_SCALE_SIZE;
                a += 32;
            } else {
                const block_q2_K *x = rows[r] ? (const block_q2_K *)rows[r] + b : (const block_q2_K *)zero_block;
                memcpy(a + 2 * r, &x->d, 2);
                memcpy(a + 32 + 2 * r, &x->dmin, 2);
                quants = x->qs, scales = x->scales, n_planes = QK_K / 16;
                a += 64;
            }
            for (int n = 0; n < 2; n++)
                for (int k = 0; k < 8; k++) put4(q + 512 * n + 64 * k, r, quants + 32 * n + 4 * k, 0);
            for (int p = 0; p < n_planes; p++) a[16 * p + r] = scales[p];
        }
}
static void pack_q2_K(const uint8_t *const rows[KILN_PACK_ROWS], int64_t nb, uint8_t *qs, uint8_t *aux) {
    pack_k23(rows, nb, qs, aux, false);
}
static void pack_q3_K(const uint8_t *const rows[KILN_PACK_ROWS], int64_t nb, uint8_t *qs, uint8_t *aux) {
    pack_k23(rows, nb, qs, aux, true);
}

#if defined(__x86_64__)
#define KERNEL(f) f
#else
#define KERNEL(f) NULL
#endif

static const pack_format formats[] = {
    {KILN_TYPE_Q8_0, KILN_PACK_Q8_0_QS, KILN_PACK_Q8_0_AUX, pack_q8_0, KERNEL(kiln_pack_gemm_q8_0_avx512),
     KERNEL(kiln_pack_gemm_q8_0_avx2), KERNEL(kiln_pack_gemm_q8_0_amx)},
    {KILN_TYPE_Q4_1, KILN_PACK_Q4_1_QS, KILN_PACK_Q4_1_AUX, pack_q4_1, KERNEL(kiln_pack_gemm_q4_1_avx512),
     KERNEL(kiln_pack_gemm_q4_1_avx2), KERNEL(kiln_pack_gemm_q4_1_amx)},
    {KILN_TYPE_Q4_K, KILN_PACK_Q4_K_QS, KILN_PACK_Q4_K_AUX, pack_q4_K, KERNEL(kiln_pack_gemm_q4_K_avx512),
     KERNEL(kiln_pack_gemm_q4_K_avx2), KERNEL(kiln_pack_gemm_q4_K_amx)},
    {KILN_TYPE_Q5_K, KILN_PACK_Q5_K_QS, KILN_PACK_Q5_K_AUX, pack_q5_K, KERNEL(kiln_pack_gemm_q5_K_avx512),
     KERNEL(kiln_pack_gemm_q5_K_avx2), KERNEL(kiln_pack_gemm_q5_K_amx)},
    {KILN_TYPE_Q6_K, KILN_PACK_Q6_K_QS, KILN_PACK_Q6_K_AUX, pack_q6_K, KERNEL(kiln_pack_gemm_q6_K_avx512), KERNEL(kiln_pack_gemm_q6_K_avx2), NULL},
    {KILN_TYPE_Q4_0, KILN_PACK_Q4_0_QS, KILN_PACK_Q4_0_AUX, pack_q4_0, KERNEL(kiln_pack_gemm_q4_0_avx512),
     KERNEL(kiln_pack_gemm_q4_0_avx2), KERNEL(kiln_pack_gemm_q4_0_amx)},
    {KILN_TYPE_IQ4_NL, KILN_PACK_IQ4_NL_QS, KILN_PACK_IQ4_NL_AUX, pack_iq4_nl, KERNEL(kiln_pack_gemm_iq4_nl_avx512),
     KERNEL(kiln_pack_gemm_iq4_nl_avx2), KERNEL(kiln_pack_gemm_iq4_nl_amx)},
    {KILN_TYPE_Q5_0, KILN_PACK_Q5_0_QS, KILN_PACK_Q5_0_AUX, pack_q5_0, KERNEL(kiln_pack_gemm_q5_0_avx512),
     KERNEL(kiln_pack_gemm_q5_0_avx2), KERNEL(kiln_pack_gemm_q5_0_amx)},
    {KILN_TYPE_Q5_1, KILN_PACK_Q5_1_QS, KILN_PACK_Q5_1_AUX, pack_q5_1, KERNEL(kiln_pack_gemm_q5_1_avx512),
     KERNEL(kiln_pack_gemm_q5_1_avx2), KERNEL(kiln_pack_gemm_q5_1_amx)},
    {KILN_TYPE_IQ4_XS, KILN_PACK_IQ4_XS_QS, KILN_PACK_IQ4_XS_AUX, pack_iq4_xs, KERNEL(kiln_pack_gemm_iq4_xs_avx512),
     KERNEL(kiln_pack_gemm_iq4_xs_avx2), NULL},
    {KILN_TYPE_Q2_K, KILN_PACK_Q2_K_QS, KILN_PACK_Q2_K_AUX, pack_q2_K, KERNEL(kiln_pack_gemm_q2_K_avx512),
     KERNEL(kiln_pack_gemm_q2_K_avx2), NULL},
    {KILN_TYPE_Q3_K, KILN_PACK_Q3_K_QS, KILN_PACK_Q3_K_AUX, pack_q3_K, KERNEL(kiln_pack_gemm_q3_K_avx512),
     KERNEL(kiln_pack_gemm_q3_K_avx2), NULL},
};

/* Every layout is 16 GGUF blocks, which the kernels' offsets assume. */
static_assert(KILN_PACK_Q8_0_QS + KILN_PACK_Q8_0_AUX == KILN_PACK_ROWS * sizeof(block_q8_0), "Q8_0 group size");
static_assert(KILN_PACK_Q4_1_QS + KILN_PACK_Q4_1_AUX == KILN_PACK_ROWS * sizeof(block_q4_1), "Q4_1 group size");
static_assert(KILN_PACK_Q4_K_QS + KILN_PACK_Q4_K_AUX == KILN_PACK_ROWS * sizeof(block_q4_K), "Q4_K group size");
static_assert(KILN_PACK_Q5_K_QS + KILN_PACK_Q5_K_AUX == KILN_PACK_ROWS * sizeof(block_q5_K), "Q5_K group size");
static_assert(KILN_PACK_Q6_K_QS + KILN_PACK_Q6_K_AUX == KILN_PACK_ROWS * sizeof(block_q6_K), "Q6_K group size");
static_assert(KILN_PACK_Q4_0_QS + KILN_PACK_Q4_0_AUX == KILN_PACK_ROWS * sizeof(block_q4_0), "Q4_0 group size");
static_assert(KILN_PACK_IQ4_NL_QS + KILN_PACK_IQ4_NL_AUX == KILN_PACK_ROWS * sizeof(block_iq4_nl), "IQ4_NL group size");
static_assert(KILN_PACK_Q5_0_QS + KILN_PACK_Q5_0_AUX == KILN_PACK_ROWS * sizeof(block_q5_0), "Q5_0 group size");
static_assert(KILN_PACK_Q5_1_QS + KILN_PACK_Q5_1_AUX == KILN_PACK_ROWS * sizeof(block_q5_1), "Q5_1 group size");
static_assert(KILN_PACK_IQ4_XS_QS + KILN_PACK_IQ4_XS_AUX == KILN_PACK_ROWS * sizeof(block_iq4_xs), "IQ4_XS group size");
static_assert(KILN_PACK_Q2_K_QS + KILN_PACK_Q2_K_AUX == KILN_PACK_ROWS * sizeof(block_q2_K), "Q2_K group size");
static_assert(KILN_PACK_Q3_K_QS + KILN_PACK_Q3_K_AUX == KILN_PACK_ROWS * sizeof(block_q3_K), "Q3_K group size");

static const pack_format *format_of(kiln_type t) {
    for (size_t i = 0; i < sizeof formats / sizeof formats[0]; i++)
        if (formats[i].type == t) return &formats[i];
    return NULL;
}

kiln_pack_gemm_fn kiln_pack_kernel(kiln_type t, kiln_simd level) {
    const pack_format *f = format_of(t);
    if (!f) return NULL;
    return level >= KILN_SIMD_AVX512 ? f->avx512 : level >= KILN_SIMD_AVX2 ? f->avx2 : NULL;
}

kiln_pack_gemm_fn kiln_pack_amx_kernel(kiln_type t) {
    const pack_format *f = format_of(t);
    return f ? f->amx : NULL;
}

kiln_pack_batch_fn kiln_pack_batch_kernel(kiln_type t, kiln_simd level) {
#if defined(__x86_64__)
    if (t == KILN_TYPE_Q2_K && level >= KILN_SIMD_AVX512) return kiln_pack_batch_q2_K_avx512;
    if (t == KILN_TYPE_Q3_K && level >= KILN_SIMD_AVX512) return kiln_pack_batch_q3_K_avx512;
#endif
    (void)t, (void)level;
    return NULL;
}

size_t kiln_pack_group_bytes(kiln_type t, int64_t nb) {
    const pack_format *f = format_of(t);
    if (!f || nb <= 0) return 0;
    const size_t b = kiln_ops_round_up(kiln_ops_mul((size_t)nb, f->qs + f->aux), 64);
    return b == SIZE_MAX ? 0 : b;
}

void kiln_pack_group(const kiln_tensor_view *W, int64_t g, char *dst) {
    const pack_format *f = format_of(W->type);
    assert(f && W->ne[0] % kiln_type_block_size(W->type) == 0);
    const int64_t nb = W->ne[0] / kiln_type_block_size(W->type), O = W->ne[1];
    const uint8_t *rows[KILN_PACK_ROWS];
    for (int r = 0; r < KILN_PACK_ROWS; r++) {
        const int64_t o = g * KILN_PACK_ROWS + r;
        rows[r] = o < O ? (const uint8_t *)W->data + (size_t)o * W->nb[1] : NULL;
    }
    f->pack(rows, nb, (uint8_t *)dst, (uint8_t *)dst + (size_t)nb * f->qs);
    const size_t used = (size_t)nb * (f->qs + f->aux);
    memset(dst + used, 0, kiln_pack_group_bytes(W->type, nb) - used);
}

/* ---------------------------------------------------------------- activation panels */

kiln_type kiln_pack_panel_type(kiln_type t) {
    const kiln_type_traits *tt = kiln_type_traits_get(t);
    return tt ? tt->vec_dot_type : KILN_TYPE_COUNT;
}

size_t kiln_pack_panel_row_bytes(kiln_type panel, int64_t I) {
    if (panel == KILN_TYPE_Q8_K) return kiln_type_row_bytes(KILN_TYPE_Q8_K, I);
    return kiln_ops_round_up(kiln_ops_add((size_t)I, kiln_ops_mul((size_t)(I / 32), 8)), 64);
}

void kiln_pack_panel_quantize(kiln_type panel, kiln_simd level, const float *x, char *row, int64_t I, int64_t b0, int64_t b1) {
    if (panel == KILN_TYPE_Q8_K) {
        kiln_get_from_float(KILN_TYPE_Q8_K, level)(x + b0 * QK_K, row + (size_t)b0 * sizeof(block_q8_K), (b1 - b0) * QK_K);
        return;
    }
#if defined(__x86_64__)
    if (level >= KILN_SIMD_AVX2) {
        kiln_pack_panel_q8_avx2(panel == KILN_TYPE_Q8_1, x, row, I, b0, b1);
        return;
    }
#endif
    const int64_t nb = I / 32;
    float *d = (float *)(row + I); /* row + I is 4-byte aligned: I is a multiple of 32 */
    if (panel == KILN_TYPE_Q8_0) {
        const kiln_from_float_fn q = kiln_get_from_float(KILN_TYPE_Q8_0, level);
        int32_t *corr = (int32_t *)(d + nb);
        for (int64_t b = b0; b < b1; b++) {
            block_q8_0 blk;
            q(x + 32 * b, &blk, 32);
            memcpy(row + 32 * b, blk.qs, 32);
            int32_t sum = 0;
            for (int i = 0; i < 32; i++) sum += blk.qs[i];
            d[b] = kiln_fp16_to_f32(blk.d);
            corr[b] = -128 * sum;
        }
        return;
    }
    assert(panel == KILN_TYPE_Q8_1);
    const kiln_from_float_fn q = kiln_get_from_float(KILN_TYPE_Q8_1, level);
    float *s = d + nb;
    for (int64_t b = b0; b < b1; b++) {
        block_q8_1 blk;
        q(x + 32 * b, &blk, 32);
        memcpy(row + 32 * b, blk.qs, 32);
        d[b] = kiln_fp16_to_f32(blk.d);
        s[b] = kiln_fp16_to_f32(blk.s);
    }
}

/* ---------------------------------------------------------------- the prepared set */

struct kiln_prepared {
    int64_t n;
    kiln_cpu_packed *items; /* sorted by W */
    void *arena;            /* every item's data */
};

const kiln_cpu_packed *kiln_cpu_packed_find(const kiln_ops_ctx *ctx, const kiln_tensor_view *W) {
    const struct kiln_prepared *p = ctx->prepared;
    if (!p) return NULL;
    int64_t lo = 0, hi = p->n;
    while (lo < hi) {
        const int64_t mid = (lo + hi) / 2;
        if ((uintptr_t)p->items[mid].W < (uintptr_t)W) lo = mid + 1;
        else hi = mid;
    }
    return lo < p->n && p->items[lo].W == W ? &p->items[lo] : NULL;
}

static int cmp_view_ptr(const void *a, const void *b) {
    const uintptr_t x = (uintptr_t) * (const kiln_tensor_view *const *)a, y = (uintptr_t) * (const kiln_tensor_view *const *)b;
    return x < y ? -1 : x > y;
}

/* Threads take groups of the first weight with groups left; whoever packs a weight's last group drops its pages. */
typedef struct {
    struct kiln_prepared *set;
    atomic_llong *next;  /* (n) groups handed out per item */
    atomic_llong *done;  /* (n) groups packed per item */
    bool drop;
    size_t page;
} pack_job;

static void drop_pages(const void *p, size_t n, size_t page) {
    const uintptr_t a = ((uintptr_t)p + page - 1) / page * page, b = ((uintptr_t)p + n) / page * page;
    if (b > a) (void)madvise((void *)a, b - a, MADV_DONTNEED); /* advice: a failure only leaves the pages resident */
}

static void pack_run(void *arg, int ith, int nth) {
    const pack_job *j = arg;
    (void)ith, (void)nth;
    for (int64_t i = 0; i < j->set->n; i++) {
        kiln_cpu_packed *it = &j->set->items[i];
        for (;;) {
            const int64_t g = atomic_fetch_add(&j->next[i], 1);
            if (g >= it->n_groups) break;
            kiln_pack_group(it->W, g, (char *)it->data + (size_t)g * it->group_bytes);
            if (atomic_fetch_add(&j->done[i], 1) + 1 == it->n_groups && j->drop) drop_pages(it->W->data, it->W->nbytes, j->page);
        }
    }
}

void kiln_cpu_release_weights(kiln_ops_ctx *ctx) {
    struct kiln_prepared *p = ctx->prepared;
    if (!p) return;
    free(p->arena);
    free(p->items);
    free(p);
    ctx->prepared = NULL;
}

kiln_status kiln_cpu_prepare_weights(kiln_ops_ctx *ctx, const kiln_tensor_view *const *W, int64_t n, bool drop_source) {
    kiln_cpu_release_weights(ctx);
    const kiln_simd level = kiln_cpu_ops_level();
    /* the weights worth packing: a kernel at this level, whole blocks, rows stored one after another */
    const kiln_tensor_view **keep = malloc(sizeof *keep * (size_t)(n > 0 ? n : 1));
    if (!keep) return kiln_fail(KILN_ERR_NOMEM, "prepare weights: out of memory for %lld views", (long long)n);
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++) {
        const kiln_tensor_view *w = W[i];
        if (!w || !kiln_pack_kernel(w->type, level) || w->ne[2] != 1 || w->ne[3] != 1) continue;
        if (w->ne[0] <= 0 || w->ne[1] <= 0 || w->ne[0] % kiln_type_block_size(w->type) != 0) continue;
        if (w->nb[1] != kiln_type_row_bytes(w->type, w->ne[0])) continue;
        keep[m++] = w;
    }
    qsort(keep, (size_t)m, sizeof *keep, cmp_view_ptr);
    int64_t u = 0; /* the same view named twice (a tied head) is packed once */
    for (int64_t i = 0; i < m; i++)
        if (u == 0 || keep[u - 1] != keep[i]) keep[u++] = keep[i];
    m = u;
    if (m == 0) {
        free(keep);
        return KILN_OK;
    }

    struct kiln_prepared *set = calloc(1, sizeof *set);
    kiln_cpu_packed *items = calloc((size_t)m, sizeof *items);
    atomic_llong *counters = calloc((size_t)(2 * m), sizeof *counters);
    size_t total = 0;
    bool overflow = false;
    for (int64_t i = 0; i < m && items; i++) {
        const kiln_tensor_view *w = keep[i];
        items[i].W = w;
        items[i].n_groups = (w->ne[1] + KILN_PACK_ROWS - 1) / KILN_PACK_ROWS;
        items[i].group_bytes = kiln_pack_group_bytes(w->type, w->ne[0] / kiln_type_block_size(w->type));
        items[i].gemm = kiln_pack_kernel(w->type, level);
        items[i].gemm16 = level >= KILN_SIMD_AVX512 && kiln_cpu_ops_amx() ? kiln_pack_amx_kernel(w->type) : NULL;
        items[i].batch = kiln_pack_batch_kernel(w->type, level);
        const size_t bytes = kiln_ops_mul(items[i].group_bytes, (size_t)items[i].n_groups);
        overflow |= items[i].group_bytes == 0 || bytes == SIZE_MAX;
        total = kiln_ops_add(total, bytes);
    }
    free(keep);
    void *arena = NULL;
    if (!set || !items || !counters || overflow || total == SIZE_MAX || posix_memalign(&arena, 64, total) != 0) {
        free(set), free(items), free(counters);
        return kiln_fail(KILN_ERR_NOMEM, "prepare weights: out of memory for %zu bytes of repacked weights", total);
    }
    size_t off = 0;
    for (int64_t i = 0; i < m; i++) {
        items[i].data = (const char *)arena + off;
        off += items[i].group_bytes * (size_t)items[i].n_groups;
    }
    *set = (struct kiln_prepared){.n = m, .items = items, .arena = arena};
    for (int64_t i = 0; i < 2 * m; i++) atomic_init(&counters[i], 0);
    const long page = sysconf(_SC_PAGESIZE);
    pack_job j = {.set = set, .next = counters, .done = counters + m, .drop = drop_source, .page = page > 0 ? (size_t)page : 4096};
    kiln_ops_run(ctx, pack_run, &j, true);
    free(counters);
    ctx->prepared = set;
    return KILN_OK;
}
