/* ops_dense.c: the dense matmul of training, y (N, O) = x (N, I) W^T for W of O rows of I stored F32 or BF16,
 * and its backward dx (N, I) += dy W, dW (O, I) += dy^T x, all accumulated in fp32. The hot loop of CPU training.
 *
 * The scalar level is the oracle: plain loops, one output row per thread share. The AVX2 and AVX-512 levels run
 * all three products through one blocked GEMM, C (M, J) (+)= A (M, K) B (K, J), laid out as in BLIS (Goto and
 * van de Geijn, "Anatomy of high-performance matrix multiplication", 2008): for each block of NC columns and
 * KC reduction steps, B's block is packed into KC x NR micro-panels, then for each block of MC rows A's block
 * into KC x MR micro-panels, and a register-tiled micro-kernel (ops_dense_avx512.c 12 x 32, ops_dense_avx2.c
 * 6 x 16) multiplies a micro-panel pair into one tile of C. An A micro-panel (12 KiB at MR = 12, KC = 256) stays
 * in L1 while the kernel walks the packed B block (KC x NC, up to 1 MiB) from L2; walking the A block for each B
 * micro-panel instead ran 10-15% slower where C is wide (O = 1024). The packing absorbs every layout: the forward
 * reads both x and W along I (panels are transposed as they are packed), dx reads W along its rows, dW reads dy
 * down its columns. Measured on one core of an Emerald Rapids Xeon (FMA peak 167 GFLOP/s) at N = 4096 and
 * I, O in {384, 1024}: forward and dx 150-158 GFLOP/s, with packing 5-9% of the time; dW 137-146, with packing
 * 14%, as both its operands stream from memory (tests/test_dense.c prints the two-core figures).
 *
 * BF16 weights are widened to f32 as they are packed (a 16-bit shift, exact), so a BF16 W gives the fp32
 * product of the widened weights with fp32 x, to fp32 rounding; the AVX512_BF16 dot (vdpbf16ps) is not used
 * because it would round x and dy to bf16 as well (8 significant bits, relative error 2^-9 a product).
 *
 * Determinism: each element of C is one chain of fused multiply-adds over k in order within a KC block, the
 * block's sum added to C block after block; the KC blocks depend on K alone. Threads split C's rows (or
 * columns) and never the reduction, and the panels are zero-padded so a tile at an edge computes its elements
 * exactly as a full tile would. So neither the thread count nor the row and column blocking (MC, NC, which are
 * shrunk when the scratch is short) changes a bit of the result. tests/test_dense.c checks every level against a
 * double reference, and 1, 2 and 3 threads bit for bit. */
#include "ops_internal.h"

#include "cpu/ops_dense.h"
#include "fp16.h"

#include <string.h>

/* Reduction steps per block at most: a 12-row A micro-panel of 256 steps is 12 KiB of a 48 KiB L1, a 32-wide
 * B micro-panel 32 KiB. K is cut into equal blocks of at most this (K = 384: two of 192). 192 and 384 measured
 * the same within noise; the value decides the result's bits, so it is one constant for every level. */
#define DENSE_KC_MAX 256
/* Rows of A packed at once (a multiple of both MR): 240 x 256 floats = 240 KiB. 120 and 480 measured the same. */
#define DENSE_MC_MAX 240
/* Columns of B packed at once (a multiple of both NR): 1024 x 256 floats = 1 MiB, with A's block inside a 2 MiB
 * L2. 512 and 2048 measured the same. */
#define DENSE_NC_MAX 1024

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* ---------------------------------------------------------------- scalar oracle */

static inline float weight_at(const void *W, kiln_type wtype, size_t i) {
    return wtype == KILN_TYPE_BF16 ? kiln_bf16_to_f32(((const kiln_bf16 *)W)[i]) : ((const float *)W)[i];
}

typedef struct {
    float *y, *dx, *dW; /* (N, O), (N, I), (O, I); any may be NULL */
    const float *x;     /* (N, I) */
    const float *dy;    /* (N, O) */
    const void *W;      /* (O rows of I) of wtype */
    kiln_type wtype;
    int64_t N, I, O;
} scalar_job;

static void scalar_rows(void *arg, int ith, int nth) {
    const scalar_job *j = arg;
    const int64_t N = j->N, I = j->I, O = j->O;
    int64_t lo, hi;
    kiln_ops_split(N, ith, nth, &lo, &hi);
    if (j->y) /* y[n][o] = x[n] . W[o] */
        for (int64_t n = lo; n < hi; n++)
            for (int64_t o = 0; o < O; o++) {
                float s = 0.0f;
                for (int64_t i = 0; i < I; i++) s += j->x[n * I + i] * weight_at(j->W, j->wtype, (size_t)(o * I + i));
                j->y[n * O + o] = s;
            }
    if (j->dx) /* dx[n] += sum_o dy[n][o] W[o] */
        for (int64_t n = lo; n < hi; n++)
            for (int64_t o = 0; o < O; o++) {
                const float d = j->dy[n * O + o];
                for (int64_t i = 0; i < I; i++) j->dx[n * I + i] += d * weight_at(j->W, j->wtype, (size_t)(o * I + i));
            }
    if (j->dW) { /* dW[o] += sum_n dy[n][o] x[n]: split over o */
        kiln_ops_split(O, ith, nth, &lo, &hi);
        for (int64_t o = lo; o < hi; o++)
            for (int64_t n = 0; n < N; n++) {
                const float d = j->dy[n * O + o];
                for (int64_t i = 0; i < I; i++) j->dW[o * I + i] += d * j->x[n * I + i];
            }
    }
}

/* ---------------------------------------------------------------- blocked GEMM */

typedef struct {
    kiln_dense_kernel_fn fn;
    kiln_dense_pack_fn copy, transpose;
    int mr, nr;
} dense_kernel;

/* The micro-kernel of exactly this level; false at the scalar level (and off x86). */
static bool dense_kernel_get(kiln_simd level, dense_kernel *k) {
#if defined(__x86_64__)
    if (level >= KILN_SIMD_AVX512) {
        *k = (dense_kernel){kiln_dense_kernel_avx512, kiln_dense_copy_avx512, kiln_dense_transpose_avx512,
                            KILN_DENSE_MR_AVX512, KILN_DENSE_NR_AVX512};
        return true;
    }
    if (level >= KILN_SIMD_AVX2) {
        *k = (dense_kernel){kiln_dense_kernel_avx2, kiln_dense_copy_avx2, kiln_dense_transpose_avx2, KILN_DENSE_MR_AVX2,
                            KILN_DENSE_NR_AVX2};
        return true;
    }
#endif
    (void)level, (void)k;
    return false;
}

typedef struct {
    const float *a;      /* A (M, K): element (m, k) at a[m * a_rs + k * a_cs]; a_rs or a_cs is 1 */
    int64_t a_rs, a_cs;
    const void *b;       /* B (K, J) of b_type (F32 or BF16): element (k, j) at b[k * b_rs + j * b_cs]; one is 1 */
    kiln_type b_type;
    int64_t b_rs, b_cs;
    float *c;            /* C (M, J), rows ldc apart */
    int64_t ldc;
    int64_t M, J, K;
    bool add;            /* C += AB, else C = AB */
    /* the plan (gemm_job_plan) */
    int64_t kc, mc, nc;  /* block sizes: kc from K alone (it decides the bits), mc and nc fitted to the scratch */
    int parts;           /* threads that get a share */
    bool split_m;        /* shares are runs of MR rows, else runs of NR columns */
} gemm;

/* kc: K in equal blocks of at most DENSE_KC_MAX. */
static int64_t gemm_kc(int64_t K) {
    const int64_t nb = (K + DENSE_KC_MAX - 1) / DENSE_KC_MAX;
    return nb ? (K + nb - 1) / nb : 0;
}

/* n rounded up to a multiple of q, capped at cap (a multiple of q). */
static int64_t cap_round(int64_t n, int64_t q, int64_t cap) { return n >= cap ? cap : (n + q - 1) / q * q; }

/* One thread's packing area: A's block (mc x kc) then B's (kc x nc), each 64-byte aligned. */
static size_t area_bytes(int64_t mc, int64_t kc, int64_t nc) {
    return kiln_ops_round_up((size_t)(mc * kc) * sizeof(float), KILN_OPS_ALIGN) +
           kiln_ops_round_up((size_t)(kc * nc) * sizeof(float), KILN_OPS_ALIGN);
}

static size_t gemm_area_full(int64_t M, int64_t J, int64_t K, const dense_kernel *kn) {
    return area_bytes(cap_round(M, kn->mr, DENSE_MC_MAX), gemm_kc(K), cap_round(J, kn->nr, DENSE_NC_MAX));
}

/* Ap: A[m0 .. m0+mc) x [k0 .. k0+kc) as micro-panels of mr rows, panel p at p * mr * kc holding (k, r) at
 * k * mr + r, rows past mc zero. */
static void pack_a(float *dst, const gemm *g, int64_t m0, int64_t mc, int64_t k0, int64_t kc, const dense_kernel *kn) {
    const float *src = g->a + m0 * g->a_rs + k0 * g->a_cs;
    if (g->a_cs == 1) /* rows of A contiguous along k (x, dy by rows) */
        kn->transpose(dst, kn->mr, src, false, g->a_rs, mc, kc);
    else /* columns of A contiguous along m (dy read down its columns) */
        kn->copy(dst, kn->mr, src, false, g->a_cs, mc, kc);
}

/* Bp: B[k0 .. k0+kc) x [j0 .. j0+nc) as micro-panels of nr columns, panel p at p * nr * kc holding (k, j) at
 * k * nr + j, columns past nc zero. BF16 is widened exactly. */
static void pack_b(float *dst, const gemm *g, int64_t k0, int64_t kc, int64_t j0, int64_t nc, const dense_kernel *kn) {
    const bool bf16 = g->b_type == KILN_TYPE_BF16;
    const size_t off = (size_t)(k0 * g->b_rs + j0 * g->b_cs);
    const void *src = bf16 ? (const void *)((const kiln_bf16 *)g->b + off) : (const void *)((const float *)g->b + off);
    if (g->b_cs == 1) /* rows of B contiguous along j (W in dx, x in dW) */
        kn->copy(dst, kn->nr, src, bf16, g->b_rs, nc, kc);
    else /* columns of B contiguous along k (W's rows in the forward) */
        kn->transpose(dst, kn->nr, src, bf16, g->b_cs, nc, kc);
}

/* Thread ith's share of g, packing into ap (mc x kc) and bp (kc x nc). */
static void gemm_share(const gemm *g, const dense_kernel *kn, float *ap, float *bp, int ith) {
    const int mr = kn->mr, nr = kn->nr;
    int64_t m_lo = 0, m_hi = g->M, j_lo = 0, j_hi = g->J, lo, hi;
    if (g->split_m) {
        kiln_ops_split((g->M + mr - 1) / mr, ith, g->parts, &lo, &hi);
        m_lo = lo * mr, m_hi = min64(hi * mr, g->M);
    } else {
        kiln_ops_split((g->J + nr - 1) / nr, ith, g->parts, &lo, &hi);
        j_lo = lo * nr, j_hi = min64(hi * nr, g->J);
    }
    for (int64_t jc = j_lo; jc < j_hi; jc += g->nc) {
        const int64_t nc = min64(g->nc, j_hi - jc);
        for (int64_t pc = 0; pc < g->K; pc += g->kc) {
            const int64_t kc = min64(g->kc, g->K - pc);
            const bool add = g->add || pc > 0;
            pack_b(bp, g, pc, kc, jc, nc, kn);
            for (int64_t ic = m_lo; ic < m_hi; ic += g->mc) {
                const int64_t mc = min64(g->mc, m_hi - ic);
                pack_a(ap, g, ic, mc, pc, kc, kn);
                for (int64_t ir = 0; ir < mc; ir += mr)
                    for (int64_t jr = 0; jr < nc; jr += nr)
                        kn->fn(kc, ap + ir * kc, bp + jr * kc, g->c + (ic + ir) * g->ldc + jc + jr, g->ldc,
                               (int)min64(mr, mc - ir), (int)min64(nr, nc - jr), add);
            }
        }
    }
}

typedef struct {
    gemm g[2]; /* run one after the other by each thread; they write different outputs */
    int n_gemm;
    dense_kernel kn;
    char *scratch;  /* thread ith packs into [ith * area, (ith + 1) * area) */
    size_t area;
} gemm_job;

static void gemm_job_run(void *arg, int ith, int nth) {
    const gemm_job *j = arg;
    (void)nth;
    for (int i = 0; i < j->n_gemm; i++) {
        const gemm *g = &j->g[i];
        if (ith >= g->parts) continue;
        float *ap = (float *)(j->scratch + (size_t)ith * j->area);
        float *bp = (float *)((char *)ap + kiln_ops_round_up((size_t)(g->mc * g->kc) * sizeof(float), KILN_OPS_ALIGN));
        gemm_share(g, &j->kn, ap, bp, ith);
    }
}

/* Plans j's gemms for the scratch: the full blocks and a share for every thread where they fit; else fewer
 * threads; else smaller mc and nc for one thread. Neither changes the result (see the top of the file). */
static void gemm_job_plan(kiln_ops_ctx *ctx, gemm_job *j, int nth) {
    size_t bytes;
    j->scratch = kiln_ops_scratch(ctx, &bytes);
    j->area = 0;
    for (int i = 0; i < j->n_gemm; i++) {
        gemm *g = &j->g[i];
        g->kc = gemm_kc(g->K);
        g->mc = cap_round(g->M, j->kn.mr, DENSE_MC_MAX);
        g->nc = cap_round(g->J, j->kn.nr, DENSE_NC_MAX);
        size_t a = area_bytes(g->mc, g->kc, g->nc);
        if (a > j->area) j->area = a;
    }
    int parts = j->area ? (int)min64(nth, (int64_t)(bytes / j->area)) : nth;
    if (parts < 1) {
        parts = 1;
        j->area = 0;
        for (int i = 0; i < j->n_gemm; i++) {
            gemm *g = &j->g[i];
            while (area_bytes(g->mc, g->kc, g->nc) > bytes && g->nc > j->kn.nr) g->nc = cap_round(g->nc / 2, j->kn.nr, g->nc);
            while (area_bytes(g->mc, g->kc, g->nc) > bytes && g->mc > j->kn.mr) g->mc = cap_round(g->mc / 2, j->kn.mr, g->mc);
            size_t a = area_bytes(g->mc, g->kc, g->nc);
            assert(a <= bytes && "dense scratch too small: size it with kiln_cpu_dense_scratch_size");
            if (a > j->area) j->area = a;
        }
    }
    for (int i = 0; i < j->n_gemm; i++) {
        gemm *g = &j->g[i];
        const int64_t mp = (g->M + j->kn.mr - 1) / j->kn.mr, jp = (g->J + j->kn.nr - 1) / j->kn.nr;
        /* Rows split unless there are too few row panels to go round (a handful of tokens). */
        g->split_m = mp >= 2 * parts || mp >= jp;
        g->parts = (int)min64(parts, g->split_m ? mp : jp);
    }
}

static void gemm_job_exec(kiln_ops_ctx *ctx, gemm_job *j) {
    double work = 0;
    for (int i = 0; i < j->n_gemm; i++) work += (double)j->g[i].M * (double)j->g[i].J * (double)j->g[i].K;
    /* 1M multiply-adds are ~10 us on one core at AVX-512 speed, about what a pool wake-up costs. */
    const bool parallel = work >= (double)(1 << 20);
    gemm_job_plan(ctx, j, parallel ? kiln_ops_n_threads(ctx) : 1);
    kiln_ops_run(ctx, gemm_job_run, j, parallel);
}

/* ---------------------------------------------------------------- entry points */

void kiln_cpu_dense_forward(kiln_ops_ctx *ctx, float *y, const float *x, const void *W, kiln_type wtype,
                            int64_t N, int64_t I, int64_t O) {
    assert((wtype == KILN_TYPE_F32 || wtype == KILN_TYPE_BF16) && N >= 0 && I >= 0 && O >= 0);
    if (N == 0 || O == 0) return;
    if (I == 0) {
        memset(y, 0, (size_t)(N * O) * sizeof(float));
        return;
    }
    gemm_job j = {.n_gemm = 1};
    if (!dense_kernel_get(kiln_cpu_ops_level(), &j.kn)) {
        scalar_job s = {.y = y, .x = x, .W = W, .wtype = wtype, .N = N, .I = I, .O = O};
        kiln_ops_run(ctx, scalar_rows, &s, N > 1 && (double)N * (double)I * (double)O >= (double)(1 << 18));
        return;
    }
    /* y (N, O) = x (N, I) . W^T: A = x by rows, B (I, O) = W^T, read along W's rows */
    j.g[0] = (gemm){.a = x, .a_rs = I, .a_cs = 1, .b = W, .b_type = wtype, .b_rs = 1, .b_cs = I,
                    .c = y, .ldc = O, .M = N, .J = O, .K = I, .add = false};
    gemm_job_exec(ctx, &j);
}

void kiln_cpu_dense_backward(kiln_ops_ctx *ctx, float *dx, float *dW, const float *dy, const float *x, const void *W,
                             kiln_type wtype, int64_t N, int64_t I, int64_t O) {
    assert((wtype == KILN_TYPE_F32 || wtype == KILN_TYPE_BF16) && N >= 0 && I >= 0 && O >= 0);
    if (N == 0 || I == 0 || O == 0) return; /* nothing to add */
    gemm_job j = {.n_gemm = 0};
    if (!dense_kernel_get(kiln_cpu_ops_level(), &j.kn)) {
        scalar_job s = {.dx = dx, .dW = dW, .x = x, .dy = dy, .W = W, .wtype = wtype, .N = N, .I = I, .O = O};
        kiln_ops_run(ctx, scalar_rows, &s, N > 1 && (double)N * (double)I * (double)O >= (double)(1 << 18));
        return;
    }
    /* dx (N, I) += dy (N, O) . W (O, I): B = W read along its rows */
    if (dx)
        j.g[j.n_gemm++] = (gemm){.a = dy, .a_rs = O, .a_cs = 1, .b = W, .b_type = wtype, .b_rs = I, .b_cs = 1,
                                 .c = dx, .ldc = I, .M = N, .J = I, .K = O, .add = true};
    /* dW (O, I) += dy^T (O, N) . x (N, I): A = dy read down its columns */
    if (dW)
        j.g[j.n_gemm++] = (gemm){.a = dy, .a_rs = 1, .a_cs = O, .b = x, .b_type = KILN_TYPE_F32, .b_rs = I, .b_cs = 1,
                                 .c = dW, .ldc = I, .M = O, .J = I, .K = N, .add = true};
    if (j.n_gemm) gemm_job_exec(ctx, &j);
}

/* The largest packing area of the three products at any level's kernel, for every thread. */
size_t kiln_cpu_dense_scratch_size(int64_t N, int64_t I, int64_t O, int n_threads) {
    if (N <= 0 || I <= 0 || O <= 0) return 0;
    size_t area = 0;
    for (int l = KILN_SIMD_AVX2; l < KILN_SIMD_COUNT; l++) {
        dense_kernel kn;
        if (!dense_kernel_get((kiln_simd)l, &kn)) continue;
        const size_t a[3] = {gemm_area_full(N, O, I, &kn), gemm_area_full(N, I, O, &kn), gemm_area_full(O, I, N, &kn)};
        for (int i = 0; i < 3; i++)
            if (a[i] > area) area = a[i];
    }
    return area ? kiln_ops_add(kiln_ops_mul(area, (size_t)(n_threads > 0 ? n_threads : 1)), KILN_OPS_ALIGN) : 0;
}
