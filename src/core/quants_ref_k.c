/* quants_ref_k.c: the scalar reference (the oracle) for the K-quants, 256-element super-blocks of 16 or 32-element
 * sub-blocks with their own scales: the weight formats Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and Q8_K, the activations
 * their vec_dots take.
 *
 * Dequantization repeats GGML's float32 arithmetic operation for operation (bit for bit llama.cpp's and the gguf
 * package's, tests/test_fixtures.c). The Q2_K and Q3_K quantizers follow llama-quantize's without an importance
 * matrix, and Q8_K's is GGML's; the Q4_K, Q5_K and Q6_K quantizers are kiln's own weighted scale searches.
 * tests/test_quants.c checks round-trip error, edge inputs and every vec_dot against a double-precision dot; the
 * SIMD levels are tested against this file. */
#include "quants_ref.h"

/* ---------------------------------------------------------------- the low-bit K-quants' scale searches (Q2_K, Q3_K)
 * Followed from GGML's make_qkx2_quants and make_q3_quants operation for operation in float, so kiln's Q2_K and
 * Q3_K files are llama-quantize's (no importance matrix); every float-to-int step is clamped first (round_clamp),
 * which equals GGML's nearest_int and clamp for every finite input in its range. */

/* x ~ scale*q - min over n elements, q in 0..nmax, min >= 0 stored (returned negated in *the_min), minimizing the
 * w-weighted absolute (use_mad) or squared error: the plain [min(x,0), max] grid, then nstep+1 grids of
 * nmax + rmin + rdelta*is levels over the range, each refit by weighted least squares. aux: n scratch codes. */
static float fit_qkx2(int n, int nmax, const float *x, const float *w, uint8_t *L, float *the_min, uint8_t *aux,
                      float rmin, float rdelta, int nstep, bool use_mad) {
    float min = x[0], max = x[0], sum_w = w[0], sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        memset(L, 0, (size_t)n);
        *the_min = -min;
        return 0.0f;
    }
    float iscale = (float)nmax / (max - min), scale = 1.0f / iscale, best_error = 0.0f;
    for (int i = 0; i < n; i++) {
        L[i] = (uint8_t)round_clamp(iscale * (x[i] - min), 0, nmax);
        const float diff = scale * (float)L[i] + min - x[i];
        best_error += w[i] * (use_mad ? fabsf(diff) : diff * diff);
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * (float)is + (float)nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            const int l = round_clamp(iscale * (x[i] - min), 0, nmax);
            aux[i] = (uint8_t)l;
            sum_l += w[i] * (float)l;
            sum_l2 += w[i] * (float)l * (float)l;
            sum_xl += w[i] * (float)l * x[i];
        }
        const float D = sum_w * sum_l2 - sum_l * sum_l;
        if (!(D > 0)) continue;
        float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D, this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
        if (this_min > 0) {
            this_min = 0;
            this_scale = sum_xl / sum_l2;
        }
        float cur_error = 0;
        for (int i = 0; i < n; i++) {
            const float diff = this_scale * (float)aux[i] + this_min - x[i];
            cur_error += w[i] * (use_mad ? fabsf(diff) : diff * diff);
        }
        if (cur_error < best_error) {
            memcpy(L, aux, (size_t)n);
            best_error = cur_error, scale = this_scale, min = this_min;
        }
    }
    *the_min = -min;
    return scale;
}

/* Symmetric x ~ scale*(q - nmax) with q - nmax in -nmax..nmax-1 (GGML's make_q3_quants with do_rmse): the signed
 * extreme maps to -nmax, then up to 5 passes move single codes while that raises <wxl>^2/<wll> (w = x^2).
 * Returns the scale (signed), 0 for a sub-block below 1e-15; L gets q = l + nmax. */
static float fit_q3(int n, int nmax, const float *x, int8_t *L) {
    const float max = signed_absmax(x, n);
    if (fabsf(max) < 1e-15f) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    const float iscale = -(float)nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        const int l = round_clamp(iscale * x[i], -nmax, nmax - 1);
        L[i] = (int8_t)l;
        const float w = x[i] * x[i];
        sumlx += w * x[i] * (float)l;
        suml2 += w * (float)l * (float)l;
    }
    for (int itry = 0; itry < 5; itry++) {
        int n_changed = 0;
        for (int i = 0; i < n; i++) {
            const float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * (float)L[i];
            if (!(slx > 0)) continue;
            float sl2 = suml2 - w * (float)L[i] * (float)L[i];
            const int new_l = round_clamp(x[i] * sl2 / slx, -nmax, nmax - 1);
            if (new_l == L[i]) continue;
            slx += w * x[i] * (float)new_l;
            sl2 += w * (float)new_l * (float)new_l;
            if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                L[i] = (int8_t)new_l, sumlx = slx, suml2 = sl2;
                n_changed++;
            }
        }
        if (!n_changed) break;
    }
    for (int i = 0; i < n; i++) L[i] = (int8_t)(L[i] + nmax);
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

/* The 2-bit codes of a Q2_K/Q3_K super-block, L[256] in 0..3: for each 128-element half, byte l of its 32 holds
 * elements l, l+32, l+64, l+96 in bit pairs 0-1, 2-3, 4-5, 6-7. */
static void pack_2bit(const uint8_t *L, uint8_t *qs) {
    for (int h = 0; h < QK_K; h += 128)
        for (int l = 0; l < 32; l++)
            qs[h / 4 + l] = (uint8_t)(L[h + l] | L[h + l + 32] << 2 | L[h + l + 64] << 4 | L[h + l + 96] << 6);
}

/* The 2 low bits of element 32*r + l (r = 0..3) of the 128-element half whose 32 bytes are q. */
static inline int two_bits(const uint8_t *q, int r, int l) { return (q[l] >> (2 * r)) & 3; }

/* ---------------------------------------------------------------- Q2_K: 84 bytes per 256, x = d*sc*q - dmin*m
 * Sub-block s (16 elements) is elements 16s..16s+15; scales[s] is its 4-bit scale (low) and 4-bit min (high). */

void kiln_to_float_q2_K_ref(const void *vx, float *y, int64_t k) {
    assert(k % QK_K == 0);
    const block_q2_K *x = vx;
    for (int64_t i = 0; i < k / QK_K; i++) {
        const float d = kiln_fp16_to_f32(x[i].d), dmin = kiln_fp16_to_f32(x[i].dmin);
        for (int s = 0; s < QK_K / 16; s++, y += 16) {
            const uint8_t *q = x[i].qs + 32 * (s / 8);
            const int r = (s % 8) / 2, l0 = 16 * (s % 2);
            const float dl = d * (float)(x[i].scales[s] & 0xF), ml = dmin * (float)(x[i].scales[s] >> 4);
            for (int l = 0; l < 16; l++) y[l] = dl * (float)two_bits(q, r, l0 + l) - ml;
        }
    }
}

/* GGML's quantize_row_q2_K_ref: each sub-block fit by fit_qkx2 (weights |x|, absolute error, 16 grids from
 * nmax-0.5), scales and mins to 4 bits against d = max scale/15 and dmin = max min/15, codes requantized. */
void kiln_quantize_q2_K_ref(const float *x, void *vy, int64_t k) {
    assert(k % QK_K == 0);
    block_q2_K *y = vy;
    uint8_t L[QK_K], aux[16];
    float w[16], mins[QK_K / 16], scales[QK_K / 16];
    for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
        float max_scale = 0, max_min = 0;
        for (int j = 0; j < QK_K / 16; j++) {
            for (int l = 0; l < 16; l++) w[l] = fabsf(x[16 * j + l]);
            scales[j] = fit_qkx2(16, 3, x + 16 * j, w, L + 16 * j, &mins[j], aux, -0.5f, 0.1f, 15, true);
            if (scales[j] > max_scale) max_scale = scales[j];
            if (mins[j] > max_min) max_min = mins[j];
        }
        memset(y[i].scales, 0, sizeof y[i].scales);
        y[i].d = y[i].dmin = kiln_f32_to_fp16(0.0f);
        if (max_scale > 0) {
            const float iscale = 15.0f / max_scale;
            for (int j = 0; j < QK_K / 16; j++) y[i].scales[j] = (uint8_t)round_clamp(iscale * scales[j], 0, 15);
            y[i].d = kiln_f32_to_fp16(max_scale / 15.0f);
        }
        if (max_min > 0) {
            const float iscale = 15.0f / max_min;
            for (int j = 0; j < QK_K / 16; j++) y[i].scales[j] |= (uint8_t)(round_clamp(iscale * mins[j], 0, 15) << 4);
            y[i].dmin = kiln_f32_to_fp16(max_min / 15.0f);
        }
        for (int j = 0; j < QK_K / 16; j++) {
            const float d = kiln_fp16_to_f32(y[i].d) * (float)(y[i].scales[j] & 0xF);
            if (d == 0.0f) continue;
            const float dm = kiln_fp16_to_f32(y[i].dmin) * (float)(y[i].scales[j] >> 4);
            for (int l = 0; l < 16; l++) L[16 * j + l] = (uint8_t)round_clamp((x[16 * j + l] + dm) / d, 0, 3);
        }
        pack_2bit(L, y[i].qs);
    }
}

/* The min term needs only y's bsums (one per sub-block of 16). */
void kiln_vec_dot_q2_K_q8_K_ref(int64_t n, float *s, const void *vx, const void *vy) {
    assert(n % QK_K == 0);
    const block_q2_K *x = vx;
    const block_q8_K *y = vy;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int32_t sumi = 0, summ = 0; /* |sumi| <= 256*15*3*127 ~ 1.5e6 */
        for (int sb = 0; sb < QK_K / 16; sb++) {
            const uint8_t *q = x[i].qs + 32 * (sb / 8);
            const int r = (sb % 8) / 2, l0 = 16 * (sb % 2);
            const int8_t *q8 = y[i].qs + 16 * sb;
            int32_t dot = 0;
            for (int l = 0; l < 16; l++) dot += two_bits(q, r, l0 + l) * q8[l];
            sumi += (x[i].scales[sb] & 0xF) * dot;
            summ += (x[i].scales[sb] >> 4) * y[i].bsums[sb];
        }
        const float d = kiln_fp16_to_f32(x[i].d) * y[i].d, dmin = kiln_fp16_to_f32(x[i].dmin) * y[i].d;
        sum += d * (float)sumi;
        sum -= dmin * (float)summ;
    }
    *s = sum;
}

/* ---------------------------------------------------------------- Q3_K: 110 bytes per 256, x = d*(sc-32)*(q-4*!h)
 * Sub-block s's 6-bit scale: low 4 bits in scales[s % 8] (low nibble for s < 8, high for s >= 8), top 2 bits at
 * bit 2*(s/4) of scales[8 + s%4]. Element e's high bit is bit e/32 of hmask[e%32]. */

static inline int q3_scale(const uint8_t *scales, int s) {
    const int lo = s < 8 ? scales[s] & 0xF : scales[s - 8] >> 4;
    return (lo | ((scales[8 + s % 4] >> (2 * (s / 4))) & 3) << 4) - 32;
}

/* Code of element 32*r + l of half h, in -4..3. */
static inline int q3_code(const block_q3_K *b, int h, int r, int l) {
    return two_bits(b->qs + 32 * h, r, l) - ((b->hmask[l] >> (4 * h + r)) & 1 ? 0 : 4);
}

void kiln_to_float_q3_K_ref(const void *vx, float *y, int64_t k) {
    assert(k % QK_K == 0);
    const block_q3_K *x = vx;
    for (int64_t i = 0; i < k / QK_K; i++) {
        const float d = kiln_fp16_to_f32(x[i].d);
        for (int s = 0; s < QK_K / 16; s++, y += 16) {
            const int h = s / 8, r = (s % 8) / 2, l0 = 16 * (s % 2);
            const float dl = d * (float)q3_scale(x[i].scales, s);
            for (int l = 0; l < 16; l++) y[l] = dl * (float)q3_code(&x[i], h, r, l0 + l);
        }
    }
}

/* GGML's quantize_row_q3_K_ref: each sub-block fit by fit_q3 (4 levels each side), the scales to 6 bits signed
 * against d = (signed largest)/-32, codes requantized against the stored scales. */
void kiln_quantize_q3_K_ref(const float *x, void *vy, int64_t k) {
    assert(k % QK_K == 0);
    block_q3_K *y = vy;
    int8_t L[QK_K];
    float scales[QK_K / 16];
    for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
        for (int j = 0; j < QK_K / 16; j++) scales[j] = fit_q3(16, 4, x + 16 * j, L + 16 * j);
        const float max_scale = signed_absmax(scales, QK_K / 16);
        memset(y[i].scales, 0, sizeof y[i].scales);
        y[i].d = kiln_f32_to_fp16(0.0f);
        if (max_scale != 0.0f) {
            const float iscale = -32.0f / max_scale;
            for (int j = 0; j < QK_K / 16; j++) {
                const int l = round_clamp(iscale * scales[j], -32, 31) + 32;
                y[i].scales[j % 8] |= (uint8_t)((l & 0xF) << (j < 8 ? 0 : 4));
                y[i].scales[8 + j % 4] |= (uint8_t)((l >> 4) << (2 * (j / 4)));
            }
            y[i].d = kiln_f32_to_fp16(1.0f / iscale);
        }
        for (int j = 0; j < QK_K / 16; j++) {
            const float d = kiln_fp16_to_f32(y[i].d) * (float)q3_scale(y[i].scales, j);
            if (d == 0.0f) continue;
            for (int l = 0; l < 16; l++) L[16 * j + l] = (int8_t)(round_clamp(x[16 * j + l] / d, -4, 3) + 4);
        }
        uint8_t low[QK_K];
        memset(y[i].hmask, 0, sizeof y[i].hmask);
        for (int j = 0; j < QK_K; j++) {
            if (L[j] > 3) y[i].hmask[j % 32] |= (uint8_t)(1u << (j / 32));
            low[j] = (uint8_t)(L[j] > 3 ? L[j] - 4 : L[j]);
        }
        pack_2bit(low, y[i].qs);
    }
}

void kiln_vec_dot_q3_K_q8_K_ref(int64_t n, float *s, const void *vx, const void *vy) {
    assert(n % QK_K == 0);
    const block_q3_K *x = vx;
    const block_q8_K *y = vy;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int32_t sumi = 0; /* |sumi| <= 256*32*4*128 ~ 4.2e6 */
        for (int sb = 0; sb < QK_K / 16; sb++) {
            const int h = sb / 8, r = (sb % 8) / 2, l0 = 16 * (sb % 2);
            const int8_t *q8 = y[i].qs + 16 * sb;
            int32_t dot = 0;
            for (int l = 0; l < 16; l++) dot += q3_code(&x[i], h, r, l0 + l) * q8[l];
            sumi += q3_scale(x[i].scales, sb) * dot;
        }
        sum += kiln_fp16_to_f32(x[i].d) * y[i].d * (float)sumi;
    }
    *s = sum;
}

/* ---------------------------------------------------------------- K-quant scale search (Q4_K, Q5_K)
 *
 * Each 32-element sub-block is fit as x ~ scale*q - min with q in 0..nmax, scale >= 0 and min >= 0 (both are
 * stored unsigned), minimizing sum w*(scale*q - min - x)^2. The weights w = rms(sub-block) + |x| are GGML's:
 * they favour the large weights a model is most sensitive to, without ignoring the small ones. */

/* Weighted squared error of x ~ scale*q + off. */
static double fit_error(int n, const float *x, const float *w, const uint8_t *q, double scale, double off) {
    double err = 0.0;
    for (int i = 0; i < n; i++) {
        const double diff = scale * q[i] + off - x[i];
        err += w[i] * diff * diff;
    }
    return err;
}

/* Codes for x ~ scale*q + off: the nearest level, clamped. */
static void assign_levels(int n, int nmax, const float *x, double scale, double off, uint8_t *q) {
    const float is = scale > 0 ? (float)(1.0 / scale) : 0.0f;
    for (int i = 0; i < n; i++) q[i] = (uint8_t)round_clamp((float)(x[i] - off) * is, 0, nmax);
}

/* Weighted least squares for (scale, off) given codes q: the 2x2 normal equations, off kept <= 0 (the stored
 * min is -off >= 0). False when the codes cannot determine a positive scale. */
static bool fit_given_levels(int n, const float *x, const float *w, const uint8_t *q, double *scale, double *off) {
    double sw = 0, sl = 0, sl2 = 0, sx = 0, slx = 0;
    for (int i = 0; i < n; i++) {
        sw += w[i];
        sl += w[i] * q[i];
        sl2 += w[i] * q[i] * q[i];
        sx += w[i] * x[i];
        slx += w[i] * q[i] * x[i];
    }
    const double det = sw * sl2 - sl * sl;
    if (!(det > 0)) return false;
    double a = (sw * slx - sx * sl) / det, b = (sl2 * sx - sl * slx) / det;
    if (b > 0) { /* the best offset would be positive: pin it to 0 and refit the scale alone */
        b = 0;
        a = slx / sl2;
    }
    if (!(a > 0)) return false;
    *scale = a, *off = b;
    return true;
}

/* Fits one sub-block. Start from the plain [min(x,0), max(x)] grid, then try nstep+1 slightly stretched or
 * shrunk grids (nmax + rmin + rdelta*is levels over the range, GGML's search) and refit each by least squares;
 * the best is polished by alternating level assignment and refit until it stops improving. Returns the scale,
 * *min gets the (non-negative) min, q the codes. A constant sub-block gets scale 0 and min = -x. */
static float fit_scale_min(int n, int nmax, const float *x, const float *w, uint8_t *q, float *min,
                           float rmin, float rdelta, int nstep) {
    assert(n <= 32);
    float lo, hi;
    min_max(x, n, &lo, &hi);
    if (lo > 0) lo = 0; /* the min is stored non-negative, so the grid starts at or below 0 */
    if (hi == lo) {
        memset(q, 0, (size_t)n);
        *min = -lo;
        return 0.0f;
    }
    double best_scale = (hi - lo) / (double)nmax, best_off = lo;
    assign_levels(n, nmax, x, best_scale, best_off, q);
    double best_err = fit_error(n, x, w, q, best_scale, best_off);

    uint8_t cand[32];
    for (int is = 0; is <= nstep; is++) {
        const double scale0 = (hi - lo) / (nmax + rmin + rdelta * is);
        double scale, off;
        assign_levels(n, nmax, x, scale0, lo, cand);
        if (!fit_given_levels(n, x, w, cand, &scale, &off)) continue;
        const double err = fit_error(n, x, w, cand, scale, off);
        if (err < best_err) best_err = err, best_scale = scale, best_off = off, memcpy(q, cand, (size_t)n);
    }
    for (int iter = 0; iter < 8; iter++) {
        double scale, off;
        assign_levels(n, nmax, x, best_scale, best_off, cand);
        if (!fit_given_levels(n, x, w, cand, &scale, &off)) break;
        const double err = fit_error(n, x, w, cand, scale, off);
        if (!(err < best_err)) break;
        best_err = err, best_scale = scale, best_off = off, memcpy(q, cand, (size_t)n);
    }
    *min = (float)-best_off;
    return (float)best_scale;
}

/* Sub-block weights: rms of the sub-block plus |x|. */
static void k_weights(const float *x, float *w) {
    double sum_x2 = 0;
    for (int l = 0; l < 32; l++) sum_x2 += (double)x[l] * x[l];
    const float rms = (float)sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; l++) w[l] = rms + fabsf(x[l]);
}

/* Packs the eight 6-bit scales and mins: sub-blocks 0..3 in the low 6 bits of bytes 0..3 (scale) and 4..7
 * (min); sub-blocks 4..7 keep their low 4 bits in bytes 8..11 (scale low nibble, min high nibble) and their
 * top 2 bits in the top bits of bytes 0..3 (scale) and 4..7 (min). kiln_get_scale_min_k4 is the inverse. */
static void pack_scale_min_k4(const uint8_t *ls, const uint8_t *lm, uint8_t *scales) {
    for (int j = 0; j < 4; j++) {
        scales[j] = (uint8_t)(ls[j] | (ls[j + 4] >> 4) << 6);
        scales[j + 4] = (uint8_t)(lm[j] | (lm[j + 4] >> 4) << 6);
        scales[j + 8] = (uint8_t)((ls[j + 4] & 0x0F) | (lm[j + 4] & 0x0F) << 4);
    }
}

/* Weighted error of one sub-block quantized with the final float scale d and min m (codes recomputed). */
static double sub_block_error(int nmax, const float *x, const float *w, float d, float m, uint8_t *q) {
    double err = 0.0;
    for (int l = 0; l < 32; l++) {
        q[l] = d > 0 ? (uint8_t)round_clamp((x[l] + m) / d, 0, nmax) : 0;
        const double diff = (double)(d * q[l] - m) - x[l];
        err += w[l] * diff * diff;
    }
    return err;
}

/* One Q4_K/Q5_K super-block: fit the 8 sub-blocks, store d = max scale/63 and dmin = max min/63 as f16, round
 * each scale and min to 6 bits against those, then pick each sub-block's final 6-bit scale and min from the
 * rounded values +-1 by the error they actually give, and requantize its codes with them (q: 256 codes). */
static void quantize_k_super_block(int nmax, float rmin, float rdelta, int nstep, const float *x,
                                   kiln_fp16 *d_out, kiln_fp16 *dmin_out, uint8_t *scales, uint8_t *q) {
    float w[QK_K], sc[8], mn[8], max_sc = 0, max_mn = 0;
    for (int j = 0; j < 8; j++) {
        k_weights(x + 32 * j, w + 32 * j);
        sc[j] = fit_scale_min(32, nmax, x + 32 * j, w + 32 * j, q + 32 * j, &mn[j], rmin, rdelta, nstep);
        if (sc[j] > max_sc) max_sc = sc[j];
        if (mn[j] > max_mn) max_mn = mn[j];
    }
    *d_out = kiln_f32_to_fp16(max_sc / 63.0f);
    *dmin_out = kiln_f32_to_fp16(max_mn / 63.0f);
    const float d = kiln_fp16_to_f32(*d_out), dmin = kiln_fp16_to_f32(*dmin_out);
    uint8_t ls[8], lm[8], trial[32];
    for (int j = 0; j < 8; j++) {
        const int ls0 = d > 0 ? round_clamp(sc[j] / d, 0, 63) : 0;
        const int lm0 = dmin > 0 ? round_clamp(mn[j] / dmin, 0, 63) : 0;
        double best = INFINITY;
        ls[j] = (uint8_t)ls0, lm[j] = (uint8_t)lm0;
        for (int a = ls0 - 1; a <= ls0 + 1; a++) {
            for (int b = lm0 - 1; b <= lm0 + 1; b++) {
                if (a < 0 || a > 63 || b < 0 || b > 63) continue;
                /* d*a and dmin*b as the dequantizer forms them */
                const double err = sub_block_error(nmax, x + 32 * j, w + 32 * j, d * (float)a, dmin * (float)b, trial);
                if (err < best) best = err, ls[j] = (uint8_t)a, lm[j] = (uint8_t)b, memcpy(q + 32 * j, trial, 32);
            }
        }
    }
    pack_scale_min_k4(ls, lm, scales);
}

/* ---------------------------------------------------------------- Q4_K: 144 bytes per 256, x = d*sc*q - dmin*m */

/* d * sc and dmin * m of sub-block j (0..7) of a Q4_K or Q5_K super-block, the factors its elements dequantize with. */
static inline void k4_sub_block(const uint8_t *scales, int j, float d, float dmin, float *dl, float *ml) {
    uint8_t sc, m;
    kiln_get_scale_min_k4(j, scales, &sc, &m);
    *dl = d * sc, *ml = dmin * m;
}

void kiln_to_float_q4_K_ref(const void *vx, float *y, int64_t k) {
    assert(k % QK_K == 0);
    const block_q4_K *x = vx;
    for (int64_t i = 0; i < k / QK_K; i++) {
        const float d = kiln_fp16_to_f32(x[i].d), dmin = kiln_fp16_to_f32(x[i].dmin);
        const uint8_t *q = x[i].qs;
        for (int j = 0; j < QK_K / 64; j++, q += 32) { /* one 64-element chunk: two sub-blocks */
            float d1, m1, d2, m2;
            k4_sub_block(x[i].scales, 2 * j, d, dmin, &d1, &m1);
            k4_sub_block(x[i].scales, 2 * j + 1, d, dmin, &d2, &m2);
            for (int l = 0; l < 32; l++) *y++ = d1 * (float)(q[l] & 0x0F) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * (float)(q[l] >> 4) - m2;
        }
    }
}

/* Search over 21 grids from nmax-1 to nmax+1 levels across the range (GGML's for Q4_K). */
void kiln_quantize_q4_K_ref(const float *x, void *vy, int64_t k) {
    assert(k % QK_K == 0);
    block_q4_K *y = vy;
    uint8_t q[QK_K];
    for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
        quantize_k_super_block(15, -1.0f, 0.1f, 20, x, &y[i].d, &y[i].dmin, y[i].scales, q);
        for (int j = 0; j < QK_K / 64; j++)
            for (int l = 0; l < 32; l++) y[i].qs[32 * j + l] = (uint8_t)(q[64 * j + l] | q[64 * j + 32 + l] << 4);
    }
}

/* Per sub-block: the integer dot of codes times its 6-bit scale; the min term needs only y's bsums. */
void kiln_vec_dot_q4_K_q8_K_ref(int64_t n, float *s, const void *vx, const void *vy) {
    assert(n % QK_K == 0);
    const block_q4_K *x = vx;
    const block_q8_K *y = vy;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int32_t sumi = 0, summ = 0; /* |sumi| <= 256*63*15*127 ~ 3.1e7: no overflow */
        for (int j = 0; j < QK_K / 32; j++) {
            uint8_t sc, m;
            kiln_get_scale_min_k4(j, x[i].scales, &sc, &m);
            const uint8_t *q = x[i].qs + 32 * (j / 2);
            const int8_t *q8 = y[i].qs + 32 * j;
            const int shift = 4 * (j % 2);
            int32_t dot = 0;
            for (int l = 0; l < 32; l++) dot += ((q[l] >> shift) & 0x0F) * q8[l];
            sumi += sc * dot;
            summ += m * (y[i].bsums[2 * j] + y[i].bsums[2 * j + 1]);
        }
        const float d = kiln_fp16_to_f32(x[i].d) * y[i].d, dmin = kiln_fp16_to_f32(x[i].dmin) * y[i].d;
        sum += d * (float)sumi;
        sum -= dmin * (float)summ;
    }
    *s = sum;
}

/* ---------------------------------------------------------------- Q5_K: 176 bytes per 256, Q4_K plus a 5th bit
 * Sub-block j's fifth bits are bit j of qh[0..31]. */

void kiln_to_float_q5_K_ref(const void *vx, float *y, int64_t k) {
    assert(k % QK_K == 0);
    const block_q5_K *x = vx;
    for (int64_t i = 0; i < k / QK_K; i++) {
        const float d = kiln_fp16_to_f32(x[i].d), dmin = kiln_fp16_to_f32(x[i].dmin);
        const uint8_t *ql = x[i].qs, *qh = x[i].qh;
        for (int j = 0; j < QK_K / 64; j++, ql += 32) {
            float d1, m1, d2, m2;
            k4_sub_block(x[i].scales, 2 * j, d, dmin, &d1, &m1);
            k4_sub_block(x[i].scales, 2 * j + 1, d, dmin, &d2, &m2);
            for (int l = 0; l < 32; l++) *y++ = d1 * (float)((ql[l] & 0x0F) | ((qh[l] >> (2 * j)) & 1) << 4) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * (float)((ql[l] >> 4) | ((qh[l] >> (2 * j + 1)) & 1) << 4) - m2;
        }
    }
}

/* Search over 16 grids from nmax-0.5 to nmax+1 levels (GGML's for Q5_K). */
void kiln_quantize_q5_K_ref(const float *x, void *vy, int64_t k) {
    assert(k % QK_K == 0);
    block_q5_K *y = vy;
    uint8_t q[QK_K];
    for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
        quantize_k_super_block(31, -0.5f, 0.1f, 15, x, &y[i].d, &y[i].dmin, y[i].scales, q);
        memset(y[i].qh, 0, sizeof y[i].qh);
        for (int j = 0; j < QK_K / 64; j++) {
            for (int l = 0; l < 32; l++) {
                const int q0 = q[64 * j + l], q1 = q[64 * j + 32 + l];
                y[i].qs[32 * j + l] = (uint8_t)((q0 & 0x0F) | (q1 & 0x0F) << 4);
                y[i].qh[l] |= (uint8_t)((q0 >> 4) << (2 * j) | (q1 >> 4) << (2 * j + 1));
            }
        }
    }
}

void kiln_vec_dot_q5_K_q8_K_ref(int64_t n, float *s, const void *vx, const void *vy) {
    assert(n % QK_K == 0);
    const block_q5_K *x = vx;
    const block_q8_K *y = vy;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int32_t sumi = 0, summ = 0; /* |sumi| <= 256*63*31*127 ~ 6.3e7 */
        for (int j = 0; j < QK_K / 32; j++) {
            uint8_t sc, m;
            kiln_get_scale_min_k4(j, x[i].scales, &sc, &m);
            const uint8_t *ql = x[i].qs + 32 * (j / 2);
            const int8_t *q8 = y[i].qs + 32 * j;
            const int shift = 4 * (j % 2);
            int32_t dot = 0;
            for (int l = 0; l < 32; l++) dot += (((ql[l] >> shift) & 0x0F) | ((x[i].qh[l] >> j) & 1) << 4) * q8[l];
            sumi += sc * dot;
            summ += m * (y[i].bsums[2 * j] + y[i].bsums[2 * j + 1]);
        }
        const float d = kiln_fp16_to_f32(x[i].d) * y[i].d, dmin = kiln_fp16_to_f32(x[i].dmin) * y[i].d;
        sum += d * (float)sumi;
        sum -= dmin * (float)summ;
    }
    *s = sum;
}

/* ---------------------------------------------------------------- Q6_K: 210 bytes per 256, x = d*sc*(q - 32)
 * Each 128-element half uses 64 bytes of ql and 32 of qh. For l in 0..31, element l+32*r (r = 0..3) has its
 * low 4 bits in ql[l + 32*(r%2)] (low nibble for r < 2, high for r >= 2) and its top 2 bits at bit 2r of qh[l]. */

void kiln_to_float_q6_K_ref(const void *vx, float *y, int64_t k) {
    assert(k % QK_K == 0);
    const block_q6_K *x = vx;
    for (int64_t i = 0; i < k / QK_K; i++) {
        const float d = kiln_fp16_to_f32(x[i].d);
        for (int h = 0; h < 2; h++, y += 128) {
            const uint8_t *ql = x[i].ql + 64 * h, *qh = x[i].qh + 32 * h;
            const int8_t *sc = x[i].scales + 8 * h;
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                const int q1 = ((ql[l] & 0x0F) | ((qh[l] >> 0) & 3) << 4) - 32;
                const int q2 = ((ql[l + 32] & 0x0F) | ((qh[l] >> 2) & 3) << 4) - 32;
                const int q3 = ((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32;
                const int q4 = ((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32;
                /* (d*sc)*q in that order, as GGML and gguf-py do: d*sc is exact, the last product rounds */
                y[l] = d * (float)sc[is + 0] * (float)q1;
                y[l + 32] = d * (float)sc[is + 2] * (float)q2;
                y[l + 64] = d * (float)sc[is + 4] * (float)q3;
                y[l + 96] = d * (float)sc[is + 6] * (float)q4;
            }
        }
    }
}

/* Codes round(iscale*x) in -32..31 and their least-squares scale; keeps it if its gain beats *best_gain. */
static bool q6_try(const float *x, float iscale, double *best_scale, double *best_gain) {
    double sxl = 0, sll = 0;
    for (int i = 0; i < 16; i++) {
        const int l = round_clamp(iscale * x[i], -32, 31);
        const double w = (double)x[i] * x[i];
        sxl += w * x[i] * l;
        sll += w * l * l;
    }
    if (!(sll > 0) || !(sxl * sxl / sll > *best_gain)) return false;
    *best_gain = sxl * sxl / sll, *best_scale = sxl / sll;
    return true;
}

/* Symmetric fit of a 16-element sub-block, x ~ scale*l with l in -32..31, weighted by x^2 (GGML's choice for
 * Q6_K: with 64 levels the large weights decide). Grids map the signed extreme to -(32 + 0.1*is), is in
 * -9..9, so the extreme may use the extra negative level; each is refit by least squares, scale = <wxl>/<wll>,
 * which leaves error <wxx> - <wxl>^2/<wll>, and the best is polished by reassign-and-refit. Returns the
 * scale (signed); 0 for a sub-block below 1e-15. */
static float fit_scale_q6(const float *x) {
    const float max = signed_absmax(x, 16);
    if (fabsf(max) < 1e-15f) return 0.0f;
    double best_scale = 0.0, best_gain = 0.0; /* gain = <wxl>^2/<wll>: larger is smaller error */
    for (int is = -9; is <= 9; is++)
        q6_try(x, -(32.0f + 0.1f * (float)is) / max, &best_scale, &best_gain);
    for (int iter = 0; iter < 8 && best_scale != 0.0; iter++)
        if (!q6_try(x, (float)(1.0 / best_scale), &best_scale, &best_gain)) break;
    return (float)best_scale;
}

/* Error (x^2-weighted, as the fit) of one sub-block with the final float scale d, codes l+32 written to q. */
static double sub_block_error_q6(const float *x, float d, uint8_t *q) {
    double err = 0.0;
    for (int i = 0; i < 16; i++) {
        const int l = d != 0.0f ? round_clamp(x[i] / d, -32, 31) : 0;
        q[i] = (uint8_t)(l + 32);
        const double diff = (double)(d * (float)l) - x[i];
        err += (double)x[i] * x[i] * diff * diff;
    }
    return err;
}

/* Sub-scales are int8 against d = (signed largest scale)/-128 stored as f16, so the largest uses -128. Each is
 * rounded against the stored d, then chosen from that +-1 by the error it gives, and its codes requantized. */
void kiln_quantize_q6_K_ref(const float *x, void *vy, int64_t k) {
    assert(k % QK_K == 0);
    block_q6_K *y = vy;
    for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
        float scales[QK_K / 16];
        for (int j = 0; j < QK_K / 16; j++) scales[j] = fit_scale_q6(x + 16 * j);
        const kiln_fp16 dh = kiln_f32_to_fp16(signed_absmax(scales, QK_K / 16) / -128.0f);
        const float d = kiln_fp16_to_f32(dh);
        if (d == 0.0f) { /* all-zero or tiny block (scale below the smallest f16): all zeros */
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        uint8_t q[QK_K], trial[16];
        for (int j = 0; j < QK_K / 16; j++) {
            const int s0 = round_clamp(scales[j] / d, -128, 127);
            double best = INFINITY;
            y[i].scales[j] = (int8_t)s0;
            for (int sc = s0 - 1; sc <= s0 + 1; sc++) {
                if (sc < -128 || sc > 127) continue;
                const double err = sub_block_error_q6(x + 16 * j, d * (float)sc, trial);
                if (err < best) best = err, y[i].scales[j] = (int8_t)sc, memcpy(q + 16 * j, trial, 16);
            }
        }
        y[i].d = dh;
        for (int h = 0; h < 2; h++) {
            uint8_t *ql = y[i].ql + 64 * h, *qh = y[i].qh + 32 * h;
            const uint8_t *L = q + 128 * h;
            for (int l = 0; l < 32; l++) {
                ql[l] = (uint8_t)((L[l] & 0x0F) | (L[l + 64] & 0x0F) << 4);
                ql[l + 32] = (uint8_t)((L[l + 32] & 0x0F) | (L[l + 96] & 0x0F) << 4);
                qh[l] = (uint8_t)((L[l] >> 4) | (L[l + 32] >> 4) << 2 | (L[l + 64] >> 4) << 4 | (L[l + 96] >> 4) << 6);
            }
        }
    }
}

void kiln_vec_dot_q6_K_q8_K_ref(int64_t n, float *s, const void *vx, const void *vy) {
    assert(n % QK_K == 0);
    const block_q6_K *x = vx;
    const block_q8_K *y = vy;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int32_t sumi = 0; /* |sumi| <= 256*128*32*127 ~ 1.3e8 */
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = x[i].ql + 64 * h, *qh = x[i].qh + 32 * h;
            const int8_t *q8 = y[i].qs + 128 * h;
            for (int r = 0; r < 4; r++) {     /* element l + 32r of this half */
                for (int g = 0; g < 2; g++) { /* sub-block of 16 */
                    int32_t dot = 0;
                    for (int l = 16 * g; l < 16 * g + 16; l++) {
                        const int lo = (ql[l + 32 * (r % 2)] >> (4 * (r / 2))) & 0x0F;
                        const int q = (lo | ((qh[l] >> (2 * r)) & 3) << 4) - 32;
                        dot += q * q8[l + 32 * r];
                    }
                    sumi += x[i].scales[8 * h + 2 * r + g] * dot;
                }
            }
        }
        sum += kiln_fp16_to_f32(x[i].d) * y[i].d * (float)sumi;
    }
    *s = sum;
}

/* ---------------------------------------------------------------- Q8_K: 292 bytes per 256, x = d * q (float d) */

void kiln_to_float_q8_K_ref(const void *vx, float *y, int64_t k) {
    assert(k % QK_K == 0);
    const block_q8_K *x = vx;
    for (int64_t i = 0; i < k / QK_K; i++, y += QK_K)
        for (int j = 0; j < QK_K; j++) y[j] = x[i].d * (float)x[i].qs[j];
}

/* GGML's quantize_row_q8_K_ref: the signed extreme maps to -127 (iscale = -127/max; -128 would suit the
 * K-quant dots but not IQ2's AVX code), codes round half to even, capped at 127; bsums[j] sums codes 16j..16j+15.
 * An all-zero block (or one so tiny that -127/max overflows, where GGML's codes would be garbage) is d = 0 with
 * zero codes and bsums; GGML leaves bsums unwritten there. */
void kiln_from_float_q8_K_ref(const float *x, void *vy, int64_t k) {
    assert(k % QK_K == 0);
    block_q8_K *y = vy;
    for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
        const float max = signed_absmax(x, QK_K);
        const float iscale = max != 0.0f ? -127.0f / max : 0.0f;
        if (!isfinite(iscale) || iscale == 0.0f) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        for (int j = 0; j < QK_K; j++) y[i].qs[j] = (int8_t)round_clamp(iscale * x[j], -127, 127);
        for (int j = 0; j < QK_K / 16; j++) {
            int sum = 0;
            for (int l = 0; l < 16; l++) sum += y[i].qs[16 * j + l];
            y[i].bsums[j] = (int16_t)sum;
        }
        y[i].d = 1.0f / iscale;
    }
}
