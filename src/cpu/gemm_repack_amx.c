/* gemm_repack_amx.c: AMX int8 tile kernels over the 16-row groups of ops_repack.h, for prefill on CPUs with AMX
 * (detected at run time: kiln_simd_amx; the matmul hands them runs of exactly KILN_PACK_AMX_NT = 16 tokens and
 * the rest to the VNNI kernels of gemm_repack_avx512.c).
 *
 * The repacked layout is already the B operand of a tile multiply: a 64-byte vector whose lane r holds 4
 * consecutive quants of weight row r is one row of a B tile in the VNNI format (K/4 rows of 16 columns x 4 bytes).
 * So for each block of 32 (or sub-block of 32 of Q4_K/Q5_K) the kernel unpacks the weight's 8 vectors as the
 * VNNI kernel does (Q8_0's are used as stored), loads them as B (8 x 64 bytes, unsigned), loads the 16 tokens'
 * 32 activation bytes straight from the panel as A (16 rows of 32 bytes, x_row apart, signed), and one TDPBSUD
 * gives C = the 16 x 16 int32 sums that the VNNI kernel builds with 8 vpdpbusd per token. C goes through memory to
 * the same float epilogue as the VNNI kernel's, instruction for instruction, so every output has the VNNI kernel's
 * bits (tests/test_gemm.c checks that, where the CPU has AMX, against T = 1 calls that run the VNNI kernels).
 * Two sets of tiles alternate, so one block's multiply runs while the other's sums are scaled.
 *
 * Tiles: tmm0, tmm1 C (16 x 64 bytes); tmm2, tmm3 A (16 x 32 bytes); tmm4, tmm5 B (8 x 64 bytes). The kernel loads
 * this configuration on entry and releases the tiles on return, so no tile state outlives a call.
 *
 * Measured on a Sapphire Rapids-class Xeon (docs/cpu.md): 0.76-0.99x the VNNI kernels' prefill, so the matmul uses
 * these only when KILN_AMX=1 asks. The block formats put a scale on every 32 weights of a row, so each TDPBSUD has
 * K = 32 (half the tile's 64) and its C must go through memory to the float epilogue before the next block: per
 * block and 16 tokens, a B store and load, an A load, the multiply, a C store and 16 loads, about what 8
 * vpdpbusd per token cost. A tile kernel that wins needs the scales out of the inner loop (weights dequantized to
 * bf16 for TDPBF16PS, C accumulating over the whole row), at other bits than the VNNI kernels'. */
#if defined(__x86_64__)

#include "ops_repack.h"

#include <immintrin.h>
#include "cpu/simd_avx512.h"
#include "cpu/gemm_repack_avx512.h"

#define NT KILN_PACK_AMX_NT

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

static void tiles_on(void) {
    _Alignas(64) tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int i = 0; i < 2; i++) {
        cfg.colsb[i] = 64, cfg.rows[i] = NT;         /* C */
        cfg.colsb[2 + i] = 32, cfg.rows[2 + i] = NT; /* A */
        cfg.colsb[4 + i] = 64, cfg.rows[4 + i] = 8;  /* B */
    }
    /* not _tile_loadconfig: GCC 12's builtin does not declare that it reads the 64 bytes, and dropped the stores of
     * colsb and rows as dead (every tile then unconfigured: the first tile load faults, SIGILL). The "m" operand
     * of the whole struct makes the read explicit. */
    __asm__ volatile("ldtilecfg %0" : : "m"(cfg));
}

/* C = A B for one set of tiles: B from bb (8 rows of 64 bytes), A from xa (16 rows of 32 bytes, stride apart); the
 * sums to cb (16 rows of 16 int32). The compiler barrier keeps bb's stores ahead of the tile load, which the
 * intrinsic does not declare as a memory read. */
#define TILE_DOT(C, A, B, bb, xa, stride, cb)   \
    do {                                        \
        __asm__ volatile("" ::: "memory");      \
        _tile_loadd(B, bb, 64);                 \
        _tile_loadd(A, xa, (long)(stride));     \
        _tile_zero(C);                          \
        _tile_dpbsud(C, A, B);                  \
        _tile_stored(C, cb, 64);                \
    } while (0)

/* ---------------------------------------------------------------- Q8_0 and the 32-element types
 * As q8_0_nt and b32_nt of gemm_repack_avx512.c: a block's sum starts at the panel's correction (Q8_0: -128 sum(x);
 * Q4_0, Q5_0, IQ4_NL: that >> shift) where the VNNI kernel starts it, and is scaled by the same two float steps. */
enum { AMX_Q8_0 = 100 };

/* Block b's 8 B rows: Q8_0's stored vectors, or the b32 vectors unpacked in element order (lo 0..3, hi 0..3). */
static inline __attribute__((always_inline)) const char *b32_b(const char *q, const int kind, __m512i table, char *bb) {
    if (kind == AMX_Q8_0) return q;
    UNROLL for (int k = 0; k < 4; k++) {
        __m512i lo, hi;
        b32_quants(q, kind, k, table, &lo, &hi);
        _mm512_store_si512((void *)(bb + 64 * k), lo);
        _mm512_store_si512((void *)(bb + 256 + 64 * k), hi);
    }
    return bb;
}

static inline __attribute__((always_inline)) void b32_epilogue(const kiln_pack_call *c, const int kind, int64_t b, const char *aux,
                                                              const int32_t *cb, __m512 acc[NT]) {
    const bool has_m = kind == B32_Q4_1 || kind == B32_Q5_1;
    const int shift = kind == B32_Q4_0 ? 4 : kind == B32_Q5_0 ? 3 : 0;
    const int64_t nb = c->nb, I = nb * 32;
    const __m512 dw = f16x16(aux);
    UNROLL for (int t = 0; t < NT; t++) {
        const char *xs = c->x + t * c->x_row + I;
        __m512i s = _mm512_load_si512((const void *)(cb + 16 * t));
        if (kind == AMX_Q8_0) s = _mm512_add_epi32(bcast4(xs + 4 * nb + 4 * b), s);
        else if (!has_m) s = _mm512_add_epi32(_mm512_srai_epi32(bcast4(xs + 4 * nb + 4 * b), shift), s);
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw, bcastf(xs + 4 * b)), acc[t]);
        if (has_m) acc[t] = _mm512_fmadd_ps(f16x16(aux + 32), bcastf(xs + 4 * nb + 4 * b), acc[t]);
    }
}

static inline __attribute__((always_inline)) void b32_amx(const kiln_pack_call *c, const int kind) {
    const bool q5 = kind == B32_Q5_0 || kind == B32_Q5_1, has_m = kind == B32_Q4_1 || kind == B32_Q5_1;
    const size_t bq = kind == AMX_Q8_0 ? KILN_PACK_Q8_0_QS : q5 ? KILN_PACK_Q5_0_QS : KILN_PACK_Q4_0_QS;
    const size_t ba = kind == AMX_Q8_0 ? KILN_PACK_Q8_0_AUX : has_m ? KILN_PACK_Q5_1_AUX : KILN_PACK_Q4_0_AUX;
    const int64_t nb = c->nb;
    const char *wq = c->w, *wa = c->w + nb * bq;
    const __m512i table = kind == B32_IQ4_NL ? iq4nl_table() : _mm512_setzero_si512();
    _Alignas(64) char bb[2][512];
    _Alignas(64) int32_t cb[2][NT * 16];
    __m512 acc[NT];
    UNROLL for (int t = 0; t < NT; t++) acc[t] = _mm512_setzero_ps();
    tiles_on();
    int64_t b = 0;
    for (; b + 1 < nb; b += 2) {
        TILE_DOT(0, 2, 4, b32_b(wq + b * bq, kind, table, bb[0]), c->x + 32 * b, c->x_row, cb[0]);
        TILE_DOT(1, 3, 5, b32_b(wq + (b + 1) * bq, kind, table, bb[1]), c->x + 32 * (b + 1), c->x_row, cb[1]);
        b32_epilogue(c, kind, b, wa + b * ba, cb[0], acc);
        b32_epilogue(c, kind, b + 1, wa + (b + 1) * ba, cb[1], acc);
    }
    if (b < nb) {
        TILE_DOT(0, 2, 4, b32_b(wq + b * bq, kind, table, bb[0]), c->x + 32 * b, c->x_row, cb[0]);
        b32_epilogue(c, kind, b, wa + b * ba, cb[0], acc);
    }
    _tile_release();
    UNROLL for (int t = 0; t < NT; t++) store_rows(c->y + t * c->ldy, acc[t], c->nrows);
}

void kiln_pack_gemm_q8_0_amx(const kiln_pack_call *c) { b32_amx(c, AMX_Q8_0); }
void kiln_pack_gemm_q4_0_amx(const kiln_pack_call *c) { b32_amx(c, B32_Q4_0); }
void kiln_pack_gemm_q4_1_amx(const kiln_pack_call *c) { b32_amx(c, B32_Q4_1); }
void kiln_pack_gemm_iq4_nl_amx(const kiln_pack_call *c) { b32_amx(c, B32_IQ4_NL); }
void kiln_pack_gemm_q5_0_amx(const kiln_pack_call *c) { b32_amx(c, B32_Q5_0); }
void kiln_pack_gemm_q5_1_amx(const kiln_pack_call *c) { b32_amx(c, B32_Q5_1); }

/* ---------------------------------------------------------------- Q4_K and Q5_K
 * As k4_block of gemm_repack_avx512.c: sub-block j's 8 vectors (k_quants: Q4_K's high nibbles as q * 16, their
 * scale divided by 16) are B, the tokens' Q8_K quants 32j.. are A, and F[t] = sum_j s_j A_j[t] in the VNNI
 * kernel's order; the mins term from the bsums as there. The 16 tokens' F live in registers, their running sums in
 * memory (acc), since 32 accumulators would not fit beside the temporaries. */
static inline __attribute__((always_inline)) void k4_amx(const kiln_pack_call *c, const bool q5) {
    const int64_t nb = c->nb;
    const size_t qs = q5 ? KILN_PACK_Q5_K_QS : KILN_PACK_Q4_K_QS, ax = q5 ? KILN_PACK_Q5_K_AUX : KILN_PACK_Q4_K_AUX;
    _Alignas(64) char bb[8][512];
    _Alignas(64) int32_t cb[8][NT * 16];
    _Alignas(64) float acc[NT][16];
    memset(acc, 0, sizeof acc);
    tiles_on();
    for (int64_t b = 0; b < nb; b++) {
        const char *q = c->w + b * qs, *aux = c->w + nb * qs + b * ax, *xb = c->x + b * (int64_t)sizeof(block_q8_K);
        UNROLL for (int j = 0; j < 8; j++)
            UNROLL for (int k = 0; k < 8; k++) _mm512_store_si512((void *)(bb[j] + 64 * k), k_quants(q, q5, j, k));
        TILE_DOT(0, 2, 4, bb[0], xb + Q8K_QS + 0, c->x_row, cb[0]);
        TILE_DOT(1, 3, 5, bb[1], xb + Q8K_QS + 32, c->x_row, cb[1]);
        TILE_DOT(0, 2, 4, bb[2], xb + Q8K_QS + 64, c->x_row, cb[2]);
        TILE_DOT(1, 3, 5, bb[3], xb + Q8K_QS + 96, c->x_row, cb[3]);
        TILE_DOT(0, 2, 4, bb[4], xb + Q8K_QS + 128, c->x_row, cb[4]);
        TILE_DOT(1, 3, 5, bb[5], xb + Q8K_QS + 160, c->x_row, cb[5]);
        TILE_DOT(0, 2, 4, bb[6], xb + Q8K_QS + 192, c->x_row, cb[6]);
        TILE_DOT(1, 3, 5, bb[7], xb + Q8K_QS + 224, c->x_row, cb[7]);
        const __m512 d = f16x16(aux), dmin = f16x16(aux + 32), sixteenth = _mm512_set1_ps(1.0f / 16.0f);
        const k4_scales ks = k4_unpack(aux + 64);
        __m512 s[8];
        __m512i mm[8];
        UNROLL for (int j = 0; j < 8; j++) {
            s[j] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(lane_u8(j < 4 ? ks.sc_lo : ks.sc_hi, j)));
            if ((j & 1) && !q5) s[j] = _mm512_mul_ps(s[j], sixteenth);
            const __m512i m = lane_u8(j < 4 ? ks.m_lo : ks.m_hi, j);
            mm[j] = _mm512_or_si512(m, _mm512_slli_epi32(m, 16));
        }
        for (int t = 0; t < NT; t++) {
            const char *xt = xb + t * c->x_row;
            __m512 F = _mm512_setzero_ps();
            __m512i M = _mm512_setzero_si512();
            UNROLL for (int j = 0; j < 8; j++)
                F = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512((const void *)(cb[j] + 16 * t))), s[j], F);
            UNROLL for (int j = 0; j < 8; j++) M = _mm512_dpwssd_epi32(M, mm[j], bcast4(xt + Q8K_BSUMS + 4 * j));
            const __m512 a = _mm512_load_ps(acc[t]);
            _mm512_store_ps(acc[t], _mm512_fmadd_ps(_mm512_fnmadd_ps(dmin, _mm512_cvtepi32_ps(M), F), bcastf(xt), a));
        }
    }
    _tile_release();
    for (int t = 0; t < NT; t++) store_rows(c->y + t * c->ldy, _mm512_load_ps(acc[t]), c->nrows);
}

void kiln_pack_gemm_q4_K_amx(const kiln_pack_call *c) { k4_amx(c, false); }
void kiln_pack_gemm_q5_K_amx(const kiln_pack_call *c) { k4_amx(c, true); }

#endif /* __x86_64__ */
