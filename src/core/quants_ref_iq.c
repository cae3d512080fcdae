/* quants_ref_iq.c: the scalar reference (the oracle) for IQ4_NL (18 bytes per 32) and IQ4_XS (136 bytes per 256),
 * whose codes index the 16 non-uniform levels kiln_iq4nl_values (quants.h, shared with the SIMD and CUDA decoders).
 *
 * Dequantization and the vec_dots are GGML's; the quantizers follow llama-quantize's without an importance matrix
 * byte for byte. tests/test_quants.c checks round-trip error, edge inputs and every vec_dot against a
 * double-precision dot; the SIMD levels are tested against this file. */
#include "quants_ref.h"

/* ---------------------------------------------------------------- IQ4_NL and IQ4_XS: 16 non-uniform levels
 * Both store indices into kiln_iq4nl_values, 32 elements to 16 bytes (element j low nibble of byte j, j+16 high). */

/* The index of the level nearest v (the lower one on a tie), GGML's best_index_int8; NaN gives 15. */
static int iq4_index(float v) {
    const int8_t *val = kiln_iq4nl_values;
    if (v <= val[0]) return 0;
    if (v >= val[15]) return 15;
    int lo = 0, hi = 15;
    while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (v < val[mid]) hi = mid;
        else lo = mid;
    }
    return v - val[hi - 1] < val[hi] - v ? hi - 1 : hi;
}

/* The least-squares sums of a 32-element block on the grid id (w = x^2, q = the level nearest id*x):
 * <wqx> and <wqq>, accumulated in index order. */
static void iq4_grid_sums(const float *x, float id, float *sumqx, float *sumq2) {
    float sqx = 0, sq2 = 0;
    for (int j = 0; j < 32; j++) {
        const float q = (float)kiln_iq4nl_values[iq4_index(id * x[j])], w = x[j] * x[j];
        sqx += w * q * x[j];
        sq2 += w * q * q;
    }
    *sumqx = sqx, *sumq2 = sq2;
}

/* One 32-element block's scale, GGML's quantize_row_iq4_nl_impl without an importance matrix (w = x^2, ntry 7,
 * as llama-quantize runs it): the signed extreme at level -127, refit by least squares, then 15 grids putting it
 * at -127 + itry; the best by <wxq>^2/<wqq>. 0 for a block below 1e-15. */
static float iq4_block_scale(const float *x) {
    const float max = signed_absmax(x, 32);
    if (fabsf(max) < 1e-15f) return 0.0f;
    const float v0 = (float)kiln_iq4nl_values[0];
    float sumqx, sumq2;
    iq4_grid_sums(x, 1.0f / (-max / v0), &sumqx, &sumq2);
    float d = sumq2 > 0 ? sumqx / sumq2 : 0.0f, best = d * sumqx;
    for (int itry = -7; itry <= 7; itry++) {
        iq4_grid_sums(x, ((float)itry + v0) / max, &sumqx, &sumq2);
        if (sumq2 > 0 && sumqx * sumqx > best * sumq2) d = sumqx / sumq2, best = d * sumqx;
    }
    return d;
}

/* 32 elements' indices against scale d (0: the level nearest 0), packed into 16 bytes. */
static void iq4_pack(const float *x, float d, uint8_t *qs) {
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    uint8_t q[32];
    for (int j = 0; j < 32; j++) q[j] = (uint8_t)iq4_index(id * x[j]);
    pack_nibbles(q, qs);
}

/* The 32 elements of one IQ4_NL payload (16 bytes) at scale d: y = d * level. */
static void iq4_levels(const uint8_t *qs, float d, float *y) {
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)kiln_iq4nl_values[qs[j] & 0xF];
        y[j + 16] = d * (float)kiln_iq4nl_values[qs[j] >> 4];
    }
}

/* The integer dot of one IQ4_NL payload's levels with 32 int8 codes. */
static inline int iq4_dot(const uint8_t *qs, const int8_t *q8) {
    int sum = 0;
    for (int j = 0; j < 16; j++)
        sum += kiln_iq4nl_values[qs[j] & 0xF] * q8[j] + kiln_iq4nl_values[qs[j] >> 4] * q8[j + 16];
    return sum;
}

/* ---------------------------------------------------------------- IQ4_NL: 18 bytes per 32, x = d * values[q] */

void kiln_to_float_iq4_nl_ref(const void *vx, float *y, int64_t k) {
    assert(k % QK4_NL == 0);
    const block_iq4_nl *x = vx;
    for (int64_t i = 0; i < k / QK4_NL; i++, y += QK4_NL) iq4_levels(x[i].qs, kiln_fp16_to_f32(x[i].d), y);
}

/* The float scale is stored as f16; the indices are chosen against the float one, as GGML does. */
void kiln_quantize_iq4_nl_ref(const float *x, void *vy, int64_t k) {
    assert(k % QK4_NL == 0);
    block_iq4_nl *y = vy;
    for (int64_t i = 0; i < k / QK4_NL; i++, x += QK4_NL) {
        const float d = iq4_block_scale(x);
        y[i].d = kiln_f32_to_fp16(d);
        iq4_pack(x, d, y[i].qs);
    }
}

void kiln_vec_dot_iq4_nl_q8_0_ref(int64_t n, float *s, const void *vx, const void *vy) {
    assert(n % QK8_0 == 0);
    const block_iq4_nl *x = vx;
    const block_q8_0 *y = vy;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK8_0; i++) {
        const int sumi = iq4_dot(x[i].qs, y[i].qs);
        sum += (float)sumi * (kiln_fp16_to_f32(x[i].d) * kiln_fp16_to_f32(y[i].d));
    }
    *s = sum;
}

/* ---------------------------------------------------------------- IQ4_XS: 136 bytes per 256, x = d*(ls-32)*values[q]
 * Sub-block s (32 elements): ls's low 4 bits are nibble s%2 of scales_l[s/2], its top 2 bits bits 2s..2s+1 of
 * scales_h; its indices are qs[16s..16s+15] packed as IQ4_NL. */

static inline int iq4_xs_scale(const block_iq4_xs *b, int s) {
    return (((b->scales_l[s / 2] >> (4 * (s % 2))) & 0xF) | ((b->scales_h >> (2 * s)) & 3) << 4) - 32;
}

void kiln_to_float_iq4_xs_ref(const void *vx, float *y, int64_t k) {
    assert(k % QK_K == 0);
    const block_iq4_xs *x = vx;
    for (int64_t i = 0; i < k / QK_K; i++) {
        const float d = kiln_fp16_to_f32(x[i].d);
        for (int s = 0; s < QK_K / 32; s++, y += 32) iq4_levels(x[i].qs + 16 * s, d * (float)iq4_xs_scale(&x[i], s), y);
    }
}

/* GGML's quantize_iq4_xs without an importance matrix: each sub-block's scale by iq4_block_scale, then 6-bit
 * signed sub-scales against d = (signed largest)/-32 (rounded against the float d, which is stored as f16) and
 * the indices chosen again against d*l. */
void kiln_quantize_iq4_xs_ref(const float *x, void *vy, int64_t k) {
    assert(k % QK_K == 0);
    block_iq4_xs *y = vy;
    for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
        float scales[QK_K / 32];
        for (int s = 0; s < QK_K / 32; s++) scales[s] = iq4_block_scale(x + 32 * s);
        const float d = -signed_absmax(scales, QK_K / 32) / 32.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = kiln_f32_to_fp16(d);
        y[i].scales_h = 0;
        memset(y[i].scales_l, 0, sizeof y[i].scales_l);
        for (int s = 0; s < QK_K / 32; s++) {
            const int l = round_clamp(id * scales[s], -32, 31);
            iq4_pack(x + 32 * s, d * (float)l, y[i].qs + 16 * s);
            y[i].scales_l[s / 2] |= (uint8_t)(((l + 32) & 0xF) << (4 * (s % 2)));
            y[i].scales_h |= (uint16_t)(((l + 32) >> 4) << (2 * s));
        }
    }
}

void kiln_vec_dot_iq4_xs_q8_K_ref(int64_t n, float *s, const void *vx, const void *vy) {
    assert(n % QK_K == 0);
    const block_iq4_xs *x = vx;
    const block_q8_K *y = vy;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int32_t sumi = 0; /* |sumi| <= 256*32*127*127 ~ 1.3e8 */
        for (int sb = 0; sb < QK_K / 32; sb++)
            sumi += iq4_xs_scale(&x[i], sb) * iq4_dot(x[i].qs + 16 * sb, y[i].qs + 32 * sb);
        sum += kiln_fp16_to_f32(x[i].d) * y[i].d * (float)sumi;
    }
    *s = sum;
}
