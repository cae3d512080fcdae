/* ops_attention_avx512.c: prefill attention over an f16 cache with up to 16 query rows in the lanes of a vector
 * (contract in ops_internal.h, kiln_attn_rows16). A row is one (token, head) of a KV group; the rows of a call share
 * the keys' reads and conversions, and no step needs a horizontal sum.
 *
 * It computes exactly what the AVX2 chunk kernel (ops_attention_avx2.c) and ops_attention.c's merge compute for each
 * row alone, the same operations on the same values in the same order, so a token's output has the same bits in a
 * prefill as alone (tests/test_ops.c, tests/test_kv.c):
 *  - score: the AVX2 kernel sums q . k in 8 lanes (lane l takes d = l, l + 8, ...) and adds the lanes as
 *    ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)); here 8 vectors take those classes of d, added in that order,
 *    then times the scale.
 *  - softmax of a chunk: the max, exp(s - max) by the same polynomial, and its sum in 8 classes of keys, added as above.
 *  - a = sum_j p_j v_j, one FMA per key in key order; then the merge into (M, L, A), with libm's expf per row.
 * A row sees keys [0, n) in chunks of kc from 0; keys at or past a row's n are masked out of its lane. */
#if defined(__x86_64__)

#include "ops_internal.h"

#include <immintrin.h>
#include <math.h>

#define UNROLL _Pragma("GCC unroll 16")
#define INLINE static inline __attribute__((always_inline))

/* simd_avx2.h's exp_ps, 16 lanes: the same operations. */
INLINE __m512 exp16(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-86.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    const __m512i e = _mm512_slli_epi32(_mm512_cvtps_epi32(n), 23);
    return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(p), e));
}

/* hsum_ps's order over the 8 classes. */
INLINE __m512 tree8(const __m512 c[8]) {
    return _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(c[0], c[4]), _mm512_add_ps(c[2], c[6])),
                         _mm512_add_ps(_mm512_add_ps(c[1], c[5]), _mm512_add_ps(c[3], c[7])));
}

/* merge's first steps per active lane, for the chunk's max m and sum l: its factor f into fv (libm's expf, as
 * merge), L and M updated; returns the lanes whose chunk max is the larger. */
static __mmask16 merge_factors(__m512 mv, __m512 lv, __mmask16 active, float *Mv, float *Lv, float *fv) {
    float m[16], l[16];
    _mm512_storeu_ps(m, mv), _mm512_storeu_ps(l, lv);
    __mmask16 up = 0;
    for (int r = 0; r < 16; r++) {
        if (!(active >> r & 1)) {
            fv[r] = 0.0f;
            continue;
        }
        if (m[r] > Mv[r]) {
            up |= (__mmask16)(1u << r);
            fv[r] = expf(Mv[r] - m[r]);
            Lv[r] = Lv[r] * fv[r] + l[r];
            Mv[r] = m[r];
        } else {
            fv[r] = expf(m[r] - Mv[r]);
            Lv[r] = Lv[r] + l[r] * fv[r];
        }
    }
    return up;
}

/* A (16 elements of every row, rows in lanes) merges the chunk's a: A * f + a where up, A + a * f where down. */
INLINE void merge_block(float *A, const __m512 a[16], __m512 f, __mmask16 up, __mmask16 down) {
    UNROLL for (int e = 0; e < 16; e++) {
        const __m512 Av = _mm512_loadu_ps(A + e * 16);
        __m512 r = _mm512_mask_add_ps(Av, up, _mm512_mul_ps(Av, f), a[e]);
        r = _mm512_mask_add_ps(r, down, Av, _mm512_mul_ps(a[e], f));
        _mm512_storeu_ps(A + e * 16, r);
    }
}

/* n rows of HS halves, stride apart, into float rows of HS. */
static void rows_to_f32(float *out, const uint16_t *src, int64_t n, int64_t stride, int64_t HS) {
    for (int64_t j = 0; j < n; j++)
        for (int64_t d = 0; d < HS; d += 16)
            _mm512_storeu_ps(out + j * HS + d, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + j * stride + d))));
}

/* Scores of keys j0 and j1 (j1 = j0 for a lone last key) into st[j * 16], before masking. */
INLINE void scores2(float *st, const float *qt, const float *kf, int64_t j0, int64_t j1, int64_t HS, __m512 scale) {
    __m512 c0[8], c1[8];
    UNROLL for (int l = 0; l < 8; l++) c0[l] = c1[l] = _mm512_setzero_ps();
    const float *k0 = kf + j0 * HS, *k1 = kf + j1 * HS;
    for (int64_t d = 0; d < HS; d += 8)
        UNROLL for (int l = 0; l < 8; l++) {
            const __m512 q = _mm512_loadu_ps(qt + (d + l) * 16);
            c0[l] = _mm512_fmadd_ps(q, _mm512_set1_ps(k0[d + l]), c0[l]);
            c1[l] = _mm512_fmadd_ps(q, _mm512_set1_ps(k1[d + l]), c1[l]);
        }
    _mm512_storeu_ps(st + j0 * 16, _mm512_mul_ps(tree8(c0), scale));
    if (j1 != j0) _mm512_storeu_ps(st + j1 * 16, _mm512_mul_ps(tree8(c1), scale));
}

/* The scratch of a call (kiln_attn_rows16_floats) and the lanes' state. */
typedef struct {
    float *qt, *at, *st, *kf, *vf; /* q transposed (HS, 16), A (HS, 16), a chunk's scores then p (kc, 16), its k and v */
    float *M, *L, *f;              /* per lane: the running max and sum, the chunk's merge factor */
    __m512i n;                     /* per lane: keys seen (0 for padding) */
    __m512 scale;
} rows_state;

/* Key j's lanes: those that see it. */
INLINE __mmask16 sees(const rows_state *w, int64_t j) { return _mm512_cmpgt_epi32_mask(w->n, _mm512_set1_epi32((int)j)); }

/* Keys [c0, c0 + nk) for the active lanes, merged into A, M, L. masked: some active lane sees fewer than the nk
 * keys, so each key's lanes are masked; else none is (an inactive lane's results are never merged). Written once,
 * specialized by the constant flag. */
INLINE void chunk(const kiln_attn_rows16 *u, rows_state *w, int64_t c0, int64_t nk, __mmask16 active, const bool masked) {
    const int64_t HS = u->HS;
    rows_to_f32(w->kf, u->k + c0 * u->kv_stride, nk, u->kv_stride, HS);
    rows_to_f32(w->vf, u->v + c0 * u->kv_stride, nk, u->kv_stride, HS);
    for (int64_t j = 0; j < nk; j += 2) scores2(w->st, w->qt, w->kf, j, j + 1 < nk ? j + 1 : j, HS, w->scale);
    /* softmax_partial per lane: the max over the lane's keys, then exp and its sum in 8 classes of keys */
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (int64_t j = 0; j < nk; j++) {
        const __m512 s = _mm512_loadu_ps(w->st + j * 16);
        mx = masked ? _mm512_mask_max_ps(mx, sees(w, c0 + j), mx, s) : _mm512_max_ps(mx, s);
    }
    __m512 cl[8];
    UNROLL for (int l = 0; l < 8; l++) cl[l] = _mm512_setzero_ps();
    for (int64_t j = 0; j < nk; j++) {
        const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(w->st + j * 16), mx));
        _mm512_storeu_ps(w->st + j * 16, e);
        cl[j & 7] = masked ? _mm512_mask_add_ps(cl[j & 7], sees(w, c0 + j), cl[j & 7], e) : _mm512_add_ps(cl[j & 7], e);
    }
    const __mmask16 up = merge_factors(mx, tree8(cl), active, w->M, w->L, w->f);
    const __m512 f = _mm512_loadu_ps(w->f);
    const __mmask16 down = active & (__mmask16)~up;
    /* a = sum_j p_j v_j, 16 elements of every row at a time, merged into A */
    for (int64_t d0 = 0; d0 < HS; d0 += 16) {
        __m512 a[16];
        UNROLL for (int e = 0; e < 16; e++) a[e] = _mm512_setzero_ps();
        for (int64_t j = 0; j < nk; j++) {
            const __m512 p = _mm512_loadu_ps(w->st + j * 16);
            const float *vr = w->vf + j * HS + d0;
            if (masked) {
                const __mmask16 k = sees(w, c0 + j);
                UNROLL for (int e = 0; e < 16; e++) a[e] = _mm512_mask3_fmadd_ps(p, _mm512_set1_ps(vr[e]), a[e], k);
            } else {
                UNROLL for (int e = 0; e < 16; e++) a[e] = _mm512_fmadd_ps(p, _mm512_set1_ps(vr[e]), a[e]);
            }
        }
        merge_block(w->at + d0 * 16, a, f, up, down);
    }
}

void kiln_attn_rows16_avx512(const kiln_attn_rows16 *u) {
    const int64_t HS = u->HS, kc = u->kc;
    rows_state w = {.qt = u->scratch, .scale = _mm512_set1_ps(u->scale)};
    w.at = w.qt + 16 * HS, w.st = w.at + 16 * HS, w.kf = w.st + 16 * kc, w.vf = w.kf + kc * HS;
    w.M = w.vf + kc * HS, w.L = w.M + 16, w.f = w.L + 16;
    int64_t nmax = 0;
    int32_t nl[16];
    for (int r = 0; r < 16; r++) {
        nl[r] = r < u->nr ? (int32_t)u->n[r] : 0;
        nmax = nl[r] > nmax ? nl[r] : nmax;
        w.M[r] = -INFINITY, w.L[r] = 0.0f;
    }
    w.n = _mm512_loadu_si512(nl);
    for (int64_t d = 0; d < HS; d++)
        for (int r = 0; r < 16; r++) w.qt[d * 16 + r] = r < u->nr ? u->q[r][d] : 0.0f;
    for (int64_t i = 0; i < 16 * HS; i += 16) _mm512_storeu_ps(w.at + i, _mm512_setzero_ps());
    for (int64_t c0 = 0; c0 < nmax; c0 += kc) {
        const int64_t nk = nmax - c0 < kc ? nmax - c0 : kc;
        const __mmask16 active = sees(&w, c0);
        if (active & _mm512_cmplt_epi32_mask(w.n, _mm512_set1_epi32((int)(c0 + nk))))
            chunk(u, &w, c0, nk, active, true);
        else
            chunk(u, &w, c0, nk, active, false);
    }
    for (int r = 0; r < u->nr; r++)
        for (int64_t d = 0; d < HS; d++) u->out[r][d] = w.at[d * 16 + r] / w.L[r];
}

#endif
