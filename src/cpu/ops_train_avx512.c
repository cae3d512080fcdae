/* ops_train_avx512.c: AVX-512 kernels of the training ops whose scalar forms are the oracle: attention's forward
 * and backward (ops_attention.c), the cross-entropy row (ops_loss.c) and the SwiGLU forward and backward (ops_swiglu.c);
 * contracts in ops_internal.h. They compute the same sums in other orders, with FMA and a polynomial exp, so they
 * agree with the scalar kernels to float rounding, not bit for bit; the thread count still never changes a result
 * (a row, a block of rows or a 16-element vector is one call whatever the split). The attention kernels keep a
 * chunk's 64 scores and a row's output or dq sum (HS <= 128: 8 vectors) in registers, and the backward sums dk and
 * dv over a block of rows in registers, where the scalar kernels go through memory. Measured on one thread of the
 * 2-core VM (shared, +-20%), scalar -> AVX-512: attention at B 8, T 256, NH 8, HS 48 forward 50 -> 12 ms, backward
 * 104 -> 20 ms; cross-entropy with gradient over 2048 x 4096 logits 44 -> 11 ms; SwiGLU backward over 2048 x 1024
 * 11 -> 1.4 ms. tests/test_grad.c runs every op at both levels against finite differences of a double reference,
 * and prints the attention and loss timings. */
#if defined(__x86_64__)

#include "ops_internal.h"

#include <immintrin.h>
#include <math.h>

/* The register arrays below only stay in registers if their loops are unrolled; GCC -O2 needs telling. */
#define UNROLL _Pragma("GCC unroll 8")
#define INLINE static inline __attribute__((always_inline))

#define KC 64                                      /* keys per chunk: 4 vectors of scores */
#define NV_MAX (KILN_ATTN_TRAIN_AVX512_MAX_HS / 16) /* vectors of an output row */

/* exp(x): x = n ln2 + r with |r| <= ln2/2 (ln2 split in two for an exact product), exp(r) by the Cephes expf
 * polynomial (within 2 ulp of expf, as ops_attention_avx2.c's), times 2^n by vscalefps, which goes down through the
 * subnormals to 0 by itself. x is clamped at -104 (exp(-104) < 2^-150 rounds to 0) so n stays finite; the clamp
 * keeps a NaN x (maxps returns its second operand when either is NaN). */
INLINE __m512 exp512(__m512 x) {
    x = _mm512_max_ps(_mm512_set1_ps(-104.0f), x);
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
    return _mm512_scalef_ps(p, n);
}

/* The first rem lanes (all when rem >= 16, none when rem <= 0). */
INLINE __mmask16 lanes(int64_t rem) { return rem >= 16 ? (__mmask16)0xFFFF : rem <= 0 ? 0 : (__mmask16)((1u << rem) - 1); }

/* ---------------------------------------------------------------- attention rows */

/* The kernels are written once for a constant nv (vectors of an HSP row) and instantiated by a switch, so the
 * unrolled loops over nv keep their vectors in registers. An FMA has 4 cycles of latency and two issue per cycle:
 * a sum over keys into nv vectors (3 at HS 48) would wait on itself, so KU(nv) interleaved sets of them take keys
 * in turn (and the forward's scores take even and odd d in two sets): 6 to 16 chains in flight. */
#define KU(nv) ((nv) <= 2 ? 4 : 2)

/* acc[k] += p_i * rows[i] for i < nk rounded up to KU, key i going to set i % KU. The keys past nk (up to the
 * chunk's last vector of p) have p = 0 and zero-padded or real rows: they add nothing. */
INLINE void sum_rows(__m512 acc[4][NV_MAX], const float *p, const float *rows, int64_t nk, int64_t HSP, const int nv) {
    const int ku = KU(nv);
    for (int64_t i = 0; i < nk; i += ku)
        UNROLL for (int k = 0; k < ku; k++) {
            const __m512 pi = _mm512_set1_ps(p[i + k]);
            const float *row = rows + (i + k) * HSP;
            UNROLL for (int c = 0; c < nv; c++) acc[k][c] = _mm512_fmadd_ps(pi, _mm512_loadu_ps(row + 16 * c), acc[k][c]);
        }
}

INLINE void fwd_row(const kiln_attn_train_unit *u, float *out, float *lse, const float *q, int64_t n, const int nv) {
    const int64_t HS = u->HS, HSP = u->HSP, TP = u->TP;
    const __m512 scale = _mm512_set1_ps(u->scale), ninf = _mm512_set1_ps(-INFINITY);
    const int ku = KU(nv);
    __m512 acc[4][NV_MAX];
    UNROLL for (int k = 0; k < ku; k++)
        UNROLL for (int c = 0; c < nv; c++) acc[k][c] = _mm512_setzero_ps();
    float M = -INFINITY, L = 0.0f;
    for (int64_t j0 = 0; j0 < n; j0 += KC) {
        const int64_t nk = n - j0 < KC ? n - j0 : KC;
        const int ns = (int)((nk + 15) / 16);
        __m512 s[4], s_odd[4];
        UNROLL for (int c = 0; c < 4; c++) s[c] = s_odd[c] = _mm512_setzero_ps();
        int64_t d = 0;
        for (; d + 1 < HS; d += 2) {
            const __m512 q0 = _mm512_set1_ps(q[d]), q1 = _mm512_set1_ps(q[d + 1]);
            const float *k = u->kT + d * TP + j0;
            UNROLL for (int c = 0; c < 4; c++) if (c < ns) {
                s[c] = _mm512_fmadd_ps(q0, _mm512_loadu_ps(k + 16 * c), s[c]);
                s_odd[c] = _mm512_fmadd_ps(q1, _mm512_loadu_ps(k + TP + 16 * c), s_odd[c]);
            }
        }
        if (d < HS) {
            const __m512 q0 = _mm512_set1_ps(q[d]);
            UNROLL for (int c = 0; c < 4; c++) if (c < ns)
                s[c] = _mm512_fmadd_ps(q0, _mm512_loadu_ps(u->kT + d * TP + j0 + 16 * c), s[c]);
        }
        __m512 mx = ninf;
        UNROLL for (int c = 0; c < 4; c++) if (c < ns) {
            /* past the causal edge: -inf */
            s[c] = _mm512_mask_mul_ps(ninf, lanes(nk - 16 * c), _mm512_add_ps(s[c], s_odd[c]), scale);
            mx = _mm512_max_ps(mx, s[c]);
        }
        const float m = fmaxf(M, _mm512_reduce_max_ps(mx));
        if (m > M) { /* a new running max rescales what came before (by 0 on the first chunk: M = -inf) */
            const float f = expf(M - m);
            L *= f;
            UNROLL for (int k = 0; k < ku; k++)
                UNROLL for (int c = 0; c < nv; c++) acc[k][c] = _mm512_mul_ps(acc[k][c], _mm512_set1_ps(f));
            M = m;
        }
        __m512 sum = _mm512_setzero_ps();
        UNROLL for (int c = 0; c < 4; c++) if (c < ns) {
            const __m512 p = _mm512_maskz_mov_ps(lanes(nk - 16 * c), exp512(_mm512_sub_ps(s[c], _mm512_set1_ps(M))));
            sum = _mm512_add_ps(sum, p);
            _mm512_storeu_ps(u->s + 16 * c, p);
        }
        L += _mm512_reduce_add_ps(sum);
        sum_rows(acc, u->s, u->vp + j0 * HSP, nk, HSP, nv);
    }
    UNROLL for (int c = 0; c < nv; c++) {
        __m512 a = _mm512_setzero_ps();
        UNROLL for (int k = 0; k < ku; k++) a = _mm512_add_ps(a, acc[k][c]);
        _mm512_mask_storeu_ps(out + 16 * c, lanes(HS - 16 * c), _mm512_div_ps(a, _mm512_set1_ps(L)));
    }
    *lse = M + logf(L);
}

/* The backward in two passes over a block of rows. First each row: p and scale * ds against its keys into P and dS
 * (zeros from its causal edge to wP, the block's widest row), its q and dout padded into qb and ob, and its dq,
 * summed in registers. */
INLINE void bwd_rows(const kiln_attn_train_unit *u, float *dq, const float *q, const float *dout, const float *D,
                     const float *lse, int64_t t0, int64_t nt, int64_t stride, int64_t wP, const int nv) {
    const int64_t HS = u->HS, HSP = u->HSP, TP = u->TP;
    const __m512 scale = _mm512_set1_ps(u->scale);
    for (int64_t r = 0; r < nt; r++, q += stride, dout += stride, dq += stride) {
        const int64_t n = t0 + r + 1;
        float *P = u->P + r * TP, *dS = u->dS + r * TP;
        const __m512 lse_v = _mm512_set1_ps(lse[r]), D_v = _mm512_set1_ps(D[r]);
        const int ku = KU(nv);
        __m512 dqa[4][NV_MAX];
        UNROLL for (int c = 0; c < nv; c++) {
            const __mmask16 m = lanes(HS - 16 * c);
            _mm512_storeu_ps(u->qb + r * HSP + 16 * c, _mm512_maskz_loadu_ps(m, q + 16 * c));
            _mm512_storeu_ps(u->ob + r * HSP + 16 * c, _mm512_maskz_loadu_ps(m, dout + 16 * c));
            UNROLL for (int k = 0; k < ku; k++) dqa[k][c] = _mm512_setzero_ps();
        }
        for (int64_t j0 = 0; j0 < n; j0 += KC) {
            const int64_t nk = n - j0 < KC ? n - j0 : KC;
            const int ns = (int)((nk + 15) / 16);
            __m512 s[4], g[4]; /* scores, dout . v_j */
            UNROLL for (int c = 0; c < 4; c++) s[c] = g[c] = _mm512_setzero_ps();
            for (int64_t d = 0; d < HS; d++) {
                const __m512 qd = _mm512_set1_ps(q[d]), od = _mm512_set1_ps(dout[d]);
                const float *k = u->kT + d * TP + j0, *v = u->vT + d * TP + j0;
                UNROLL for (int c = 0; c < 4; c++) if (c < ns) {
                    s[c] = _mm512_fmadd_ps(qd, _mm512_loadu_ps(k + 16 * c), s[c]);
                    g[c] = _mm512_fmadd_ps(od, _mm512_loadu_ps(v + 16 * c), g[c]);
                }
            }
            /* Past the causal edge p = 0 and so ds = 0. */
            UNROLL for (int c = 0; c < 4; c++) if (c < ns) {
                const __m512 p = _mm512_maskz_mov_ps(lanes(nk - 16 * c), exp512(_mm512_fmsub_ps(s[c], scale, lse_v)));
                _mm512_storeu_ps(P + j0 + 16 * c, p);
                _mm512_storeu_ps(dS + j0 + 16 * c, _mm512_mul_ps(_mm512_mul_ps(p, _mm512_sub_ps(g[c], D_v)), scale));
            }
            sum_rows(dqa, dS + j0, u->kp + j0 * HSP, nk, HSP, nv);
        }
        for (int64_t i = (n + 15) & ~(int64_t)15; i < wP; i += 16) {
            _mm512_storeu_ps(P + i, _mm512_setzero_ps());
            _mm512_storeu_ps(dS + i, _mm512_setzero_ps());
        }
        UNROLL for (int c = 0; c < nv; c++) {
            const __mmask16 m = lanes(HS - 16 * c);
            __m512 a = _mm512_setzero_ps();
            UNROLL for (int k = 0; k < ku; k++) a = _mm512_add_ps(a, dqa[k][c]);
            _mm512_mask_storeu_ps(dq + 16 * c, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, dq + 16 * c), a));
        }
    }
}

/* Then the columns: dkT[d][j] += sum over the rows of qb[r][d] dS[r][j], and dvT from ob and P, 4 d by 32 keys at
 * a time in 16 registers, so each row's dS and P vectors are loaded once for 4 d and dkT, dvT are written once per
 * block (adding into them row by row was bound by the stores). Rows before a key pair's first key have p = 0 there
 * and are skipped. */
static void bwd_columns(const kiln_attn_train_unit *u, int64_t t0, int64_t nt, int64_t wP) {
    const int64_t HSP = u->HSP, TP = u->TP, HS4 = (u->HS + 3) & ~(int64_t)3; /* HS4 <= HSP: qb, ob pads are 0 */
    for (int64_t j = 0; j < wP; j += 32) {
        const int64_t r0 = j > t0 ? j - t0 : 0; /* < nt: j < wP - 31 <= t0 + nt */
        for (int64_t d0 = 0; d0 < HS4; d0 += 4) {
            __m512 ak[4][2], av[4][2];
            UNROLL for (int dd = 0; dd < 4; dd++) ak[dd][0] = ak[dd][1] = av[dd][0] = av[dd][1] = _mm512_setzero_ps();
            for (int64_t r = r0; r < nt; r++) {
                const float *dS = u->dS + r * TP + j, *P = u->P + r * TP + j;
                const float *qr = u->qb + r * HSP + d0, *orow = u->ob + r * HSP + d0;
                const __m512 s0 = _mm512_loadu_ps(dS), s1 = _mm512_loadu_ps(dS + 16);
                const __m512 p0 = _mm512_loadu_ps(P), p1 = _mm512_loadu_ps(P + 16);
                UNROLL for (int dd = 0; dd < 4; dd++) {
                    const __m512 qd = _mm512_set1_ps(qr[dd]), od = _mm512_set1_ps(orow[dd]);
                    ak[dd][0] = _mm512_fmadd_ps(qd, s0, ak[dd][0]);
                    ak[dd][1] = _mm512_fmadd_ps(qd, s1, ak[dd][1]);
                    av[dd][0] = _mm512_fmadd_ps(od, p0, av[dd][0]);
                    av[dd][1] = _mm512_fmadd_ps(od, p1, av[dd][1]);
                }
            }
            UNROLL for (int dd = 0; dd < 4; dd++) {
                float *dk = u->dkT + (d0 + dd) * TP + j, *dv = u->dvT + (d0 + dd) * TP + j;
                _mm512_storeu_ps(dk, _mm512_add_ps(_mm512_loadu_ps(dk), ak[dd][0]));
                _mm512_storeu_ps(dk + 16, _mm512_add_ps(_mm512_loadu_ps(dk + 16), ak[dd][1]));
                _mm512_storeu_ps(dv, _mm512_add_ps(_mm512_loadu_ps(dv), av[dd][0]));
                _mm512_storeu_ps(dv + 16, _mm512_add_ps(_mm512_loadu_ps(dv + 16), av[dd][1]));
            }
        }
    }
}

void kiln_attn_train_fwd_avx512(const kiln_attn_train_unit *u, float *out, float *lse, const float *q, int64_t n) {
    assert(u->HSP <= KILN_ATTN_TRAIN_AVX512_MAX_HS);
    switch (u->HSP / 16) {
    case 1: fwd_row(u, out, lse, q, n, 1); break;
    case 2: fwd_row(u, out, lse, q, n, 2); break;
    case 3: fwd_row(u, out, lse, q, n, 3); break;
    case 4: fwd_row(u, out, lse, q, n, 4); break;
    case 5: fwd_row(u, out, lse, q, n, 5); break;
    case 6: fwd_row(u, out, lse, q, n, 6); break;
    case 7: fwd_row(u, out, lse, q, n, 7); break;
    default: fwd_row(u, out, lse, q, n, 8); break;
    }
}

void kiln_attn_train_bwd_avx512(const kiln_attn_train_unit *u, float *dq, const float *q, const float *dout,
                                const float *D, const float *lse, int64_t t0, int64_t nt, int64_t stride) {
    assert(u->HSP <= KILN_ATTN_TRAIN_AVX512_MAX_HS && nt <= KILN_ATTN_TRAIN_QB);
    const int64_t wP = (t0 + nt + 31) & ~(int64_t)31; /* <= TP, a multiple of 32 */
    switch (u->HSP / 16) {
    case 1: bwd_rows(u, dq, q, dout, D, lse, t0, nt, stride, wP, 1); break;
    case 2: bwd_rows(u, dq, q, dout, D, lse, t0, nt, stride, wP, 2); break;
    case 3: bwd_rows(u, dq, q, dout, D, lse, t0, nt, stride, wP, 3); break;
    case 4: bwd_rows(u, dq, q, dout, D, lse, t0, nt, stride, wP, 4); break;
    case 5: bwd_rows(u, dq, q, dout, D, lse, t0, nt, stride, wP, 5); break;
    case 6: bwd_rows(u, dq, q, dout, D, lse, t0, nt, stride, wP, 6); break;
    case 7: bwd_rows(u, dq, q, dout, D, lse, t0, nt, stride, wP, 7); break;
    default: bwd_rows(u, dq, q, dout, D, lse, t0, nt, stride, wP, 8); break;
    }
    bwd_columns(u, t0, nt, wP);
}

/* ---------------------------------------------------------------- cross-entropy row */

/* Sums of 16 floats into two vectors of 8 doubles: the double sums of the scalar kernel, in 16 interleaved parts. */
INLINE void add_pd(__m512d *lo, __m512d *hi, __m512 x) {
    *lo = _mm512_add_pd(*lo, _mm512_cvtps_pd(_mm512_castps512_ps256(x)));
    *hi = _mm512_add_pd(*hi, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1))));
}

void kiln_ce_row_avx512(float *x, int64_t V, bool write, float *max, double *sum_x, double *sum_e) {
    __m512 mx = _mm512_set1_ps(-INFINITY);
    __m512d sx_lo = _mm512_setzero_pd(), sx_hi = _mm512_setzero_pd();
    for (int64_t i = 0; i < V; i += 16) {
        const __mmask16 m = lanes(V - i);
        const __m512 v = _mm512_maskz_loadu_ps(m, x + i);
        mx = _mm512_mask_max_ps(mx, m, mx, v);
        add_pd(&sx_lo, &sx_hi, v);
    }
    const float mxs = _mm512_reduce_max_ps(mx);
    const __m512 mv = _mm512_set1_ps(mxs);
    __m512d se_lo = _mm512_setzero_pd(), se_hi = _mm512_setzero_pd();
    for (int64_t i = 0; i < V; i += 16) {
        const __mmask16 m = lanes(V - i);
        const __m512 e = _mm512_maskz_mov_ps(m, exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), mv)));
        if (write) _mm512_mask_storeu_ps(x + i, m, e);
        add_pd(&se_lo, &se_hi, e);
    }
    *max = mxs;
    *sum_x = _mm512_reduce_add_pd(_mm512_add_pd(sx_lo, sx_hi));
    *sum_e = _mm512_reduce_add_pd(_mm512_add_pd(se_lo, se_hi));
}

/* ---------------------------------------------------------------- swiglu forward and backward */

void kiln_swiglu_fwd_avx512(float *out, const float *gate, const float *up, int64_t n) {
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = lanes(n - i);
        const __m512 g = _mm512_maskz_loadu_ps(m, gate + i);
        /* the scalar kernel's g / (1 + exp(-g)) * up, overflow included: exp(-g) = inf for g < -88.7 gives -0 */
        const __m512 s = _mm512_div_ps(g, _mm512_add_ps(one, exp512(_mm512_sub_ps(_mm512_setzero_ps(), g))));
        _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(s, _mm512_maskz_loadu_ps(m, up + i)));
    }
}

void kiln_swiglu_bwd_avx512(float *dgate, float *dup, const float *dout, const float *gate, const float *up, int64_t n) {
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = lanes(n - i);
        const __m512 g = _mm512_maskz_loadu_ps(m, gate + i), d = _mm512_maskz_loadu_ps(m, dout + i);
        /* exp(-g) overflows to inf for g < -88.7, and sig to 0, as with expf */
        const __m512 sig = _mm512_div_ps(one, _mm512_add_ps(one, exp512(_mm512_sub_ps(_mm512_setzero_ps(), g))));
        const __m512 dsig = _mm512_mul_ps(sig, _mm512_fmadd_ps(g, _mm512_sub_ps(one, sig), one));
        _mm512_mask_storeu_ps(dup + i, m, _mm512_fmadd_ps(d, _mm512_mul_ps(g, sig), _mm512_maskz_loadu_ps(m, dup + i)));
        _mm512_mask_storeu_ps(dgate + i, m, _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_maskz_loadu_ps(m, up + i)), dsig,
                                                            _mm512_maskz_loadu_ps(m, dgate + i)));
    }
}

#endif
