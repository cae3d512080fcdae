/* test_cuda_matvec.c: the decode matmuls of src/cuda/matvec.cu (kiln_cuda_matvec_prepare, kiln_cuda_matvec,
 * kiln_cuda_matvec_glu; kiln_cuda_matvec_pair against two kiln_cuda_matvec launches and the prologue against the
 * kernels it saves, bit for bit) for every type, T in {1, 2, 3, 8}, odd row counts (partial last CTA) and widths from one
 * 32-thread group per row (256) to several passes of 128 threads (11008), add, and both GLU activations, against
 *  (a) a double-precision dot of the dequantized weights (scalar to_float) with x as the kernel sees it: for the
 *      block types x rounded to int8 blocks of 32 exactly as matvec_prepare does (d = amax / 127 in f32,
 *      q = roundf(x / d)), so only fp32 summation order separates the two: NMSE < 1e-8, max-abs < 1e-3 of the
 *      RMS (a host emulation of the kernels measured NMSE <= 4e-13); for F32, F16, BF16 x itself: NMSE < 1e-10,
 *      max-abs < 1e-4 RMS;
 *  (b) the CPU oracle, kiln_cpu_ops.matmul_forward (+ swiglu_forward / geglu_forward), which rounds x its own way
 *      (q8_0 / q8_1 blocks of 32 with an f16 scale, q8_K blocks of 256 for the K-quants, f16 or bf16 for those
 *      weights). Q4_0/Q4_1/Q5_0/Q8_0 share the codes (the CPU's f16 scale leaves NMSE ~1e-7); the K-quants' q8_K
 *      rounding was measured at NMSE <= 1.4e-4 over these shapes (max-abs 0.032 RMS), so block types take NMSE
 *      < 1e-3, max-abs < 0.25 RMS; F32 1e-10; F16 1e-6 (unit roundoff 2^-11, measured 5e-8); BF16 1e-4 (2^-8,
 *      measured 3e-6). The GLU's act(g) * u is heavy-tailed (measured up to 4x the matmul's NMSE), so against the
 *      CPU it takes 10x these bounds (max-abs 1.0 RMS for the block types): (a) is the sharp check.
 * Q5_1, Q2_K, Q3_K, IQ4_NL and IQ4_XS are dequantized for (a) by test_blocks_ggml.h (GGML's layouts, checked
 * against the gguf package); (b) runs for them once the CPU backend computes them (cpu_has), with the bounds of
 * the other block types, and is (a) again until then.
 * Weights are random bytes with finite f16 scales of either sign (every quant and scale bit pattern) or random
 * floats; x is uniform in [-1, 1); add's y0 is random and y - y0 is compared.
 * Every output is poisoned with NaN bytes before each launch. Skips without CUDA or without a GPU. */
#include "cpu/ops.h"
#include "cuda/cuda.h"
#include "cuda/kernels.h"
#include "fp16.h"
#include "quants.h"
#include "test.h"
#include "test_blocks_ggml.h"

#include <stddef.h>
#include <stdint.h>

#define COUNT(a) (int)(sizeof a / sizeof a[0])

#ifdef KILN_CUDA

static const kiln_type types[] = {KILN_TYPE_F32,  KILN_TYPE_F16,  KILN_TYPE_BF16, KILN_TYPE_Q4_0,  KILN_TYPE_Q4_1,
                                  KILN_TYPE_Q5_0, KILN_TYPE_Q8_0, KILN_TYPE_Q4_K, KILN_TYPE_Q5_K,  KILN_TYPE_Q6_K,
                                  KILN_TYPE_Q5_1, KILN_TYPE_Q2_K, KILN_TYPE_Q3_K, KILN_TYPE_IQ4_NL, KILN_TYPE_IQ4_XS};
static const int64_t Ts[] = {1, 2, 3, 8};
enum { TMAX = 8 };

typedef struct {
    double nmse_ref, max_ref; /* against the double reference */
    double nmse_cpu, max_cpu; /* against the CPU oracle */
} bounds;

static bool is_float(kiln_type t) { return t == KILN_TYPE_F32 || t == KILN_TYPE_F16 || t == KILN_TYPE_BF16; }

/* Whether this build's CPU backend computes t (the types issue 18 added come with h-quants' reference): without
 * it, only comparison (a) runs. */
static bool cpu_has(kiln_type t) {
    const kiln_type_traits *tt = kiln_type_traits_get(t);
    return tt && tt->computable && kiln_get_vec_dot(t, KILN_SIMD_SCALAR);
}

static bounds matvec_bounds(kiln_type t) {
    switch (t) {
    case KILN_TYPE_F32: return (bounds){1e-10, 1e-4, 1e-10, 1e-4};
    case KILN_TYPE_F16: return (bounds){1e-10, 1e-4, 1e-6, 5e-3};
    case KILN_TYPE_BF16: return (bounds){1e-10, 1e-4, 1e-4, 0.1};
    default: return (bounds){1e-8, 1e-3, 1e-3, 0.25};
    }
}

static bounds glu_bounds(kiln_type t) {
    bounds b = matvec_bounds(t);
    b.nmse_ref *= 2, b.max_ref *= 10;
    b.nmse_cpu *= 10, b.max_cpu = is_float(t) ? 10 * b.max_cpu : 1.0;
    return b;
}

/* xr (T, cols) = x as the kernel multiplies it: for the block types, matvec_prepare's int8 blocks times their
 * scale (the same f32 operations, so the same codes); for float types x itself. */
static void x_as_kernel_sees(float *xr, const float *x, int64_t T, int64_t cols, kiln_type t) {
    if (is_float(t)) {
        memcpy(xr, x, (size_t)(T * cols) * sizeof *xr);
        return;
    }
    for (int64_t b = 0; b < T * cols / 32; b++) {
        const float *xb = x + 32 * b;
        float amax = 0.0f;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(xb[i]));
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        for (int i = 0; i < 32; i++) xr[32 * b + i] = d * (float)(int)roundf(xb[i] * id);
    }
}

/* rows of cols weights of type t: random bytes with finite f16 scales of either sign, or uniform floats.
 * deq (rows, cols) gets them dequantized by the scalar reference. */
static uint8_t *make_weights(kiln_type t, int64_t rows, int64_t cols, float *deq, unsigned long long *rng) {
    const size_t row = kiln_type_row_bytes(t, cols), bs = kiln_type_block_bytes(t);
    const size_t bytes = row * (size_t)rows;
    uint8_t *w = malloc(bytes);
    const int64_t n = rows * cols;
    if (t == KILN_TYPE_F32)
        for (int64_t i = 0; i < n; i++) ((float *)w)[i] = test_rng_f32(rng);
    else if (t == KILN_TYPE_F16)
        for (int64_t i = 0; i < n; i++) ((kiln_fp16 *)w)[i] = kiln_f32_to_fp16(test_rng_f32(rng));
    else if (t == KILN_TYPE_BF16)
        for (int64_t i = 0; i < n; i++) ((kiln_bf16 *)w)[i] = kiln_f32_to_bf16(test_rng_f32(rng));
    else if (test_ggml_is_new(t)) {
        for (size_t i = 0; i < bytes; i++) w[i] = (uint8_t)test_rng_next(rng);
        test_ggml_fix_scales(t, w, n, 0.01f, 0.0f, rng);
    } else {
        for (size_t i = 0; i < bytes; i++) w[i] = (uint8_t)test_rng_next(rng);
        for (size_t b = 0; b < bytes / bs; b++) {
            uint8_t *p = w + b * bs;
            const kiln_fp16 d = kiln_f32_to_fp16(0.01f * test_rng_f32(rng)), m = kiln_f32_to_fp16(0.005f * test_rng_f32(rng));
            switch (t) {
            case KILN_TYPE_Q4_0:
            case KILN_TYPE_Q5_0:
            case KILN_TYPE_Q8_0: memcpy(p, &d, 2); break;
            case KILN_TYPE_Q6_K: memcpy(p + offsetof(block_q6_K, d), &d, 2); break;
            default: memcpy(p, &d, 2), memcpy(p + 2, &m, 2); break; /* Q4_1 d, m; Q4_K/Q5_K d, dmin */
            }
        }
    }
    test_ggml_to_float(t, w, deq, n);
    return w;
}

static kiln_tensor_view make_view(kiln_type t, int64_t cols, int64_t rows, const void *data) {
    const size_t row = kiln_type_row_bytes(t, cols);
    return (kiln_tensor_view){.name = "w", .type = t, .n_dims = 2, .ne = {cols, rows, 1, 1},
                              .nb = {kiln_type_block_bytes(t), row, row * (size_t)rows, row * (size_t)rows},
                              .nbytes = row * (size_t)rows, .data = data};
}

/* ref (T, rows) = x (T, cols) deq^T in double. */
static void ref_matmul(double *ref, const float *x, const float *deq, int64_t T, int64_t rows, int64_t cols) {
    for (int64_t t = 0; t < T; t++)
        for (int64_t o = 0; o < rows; o++) {
            double s = 0;
            for (int64_t i = 0; i < cols; i++) s += (double)deq[o * cols + i] * x[t * cols + i];
            ref[t * rows + o] = s;
        }
}

static double silu_d(double g) { return g / (1.0 + exp(-g)); }
static double gelu_d(double g) { return 0.5 * g * (1.0 + tanh(0.7978845608028654 * (g + 0.044715 * g * g * g))); }

typedef struct {
    double nmse, maxabs, rms;
    int64_t bad; /* first index past the max-abs bound or not finite, -1 if none */
    double got, want;
} cmp;

static cmp compare(const float *got, const double *want, int64_t n, double max_rel) {
    cmp c = {0, 0, 0, -1, 0, 0};
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) den += want[i] * want[i];
    c.rms = sqrt(den / (double)n);
    for (int64_t i = 0; i < n; i++) {
        const double e = (double)got[i] - want[i];
        num += e * e;
        if (fabs(e) > c.maxabs || e != e) c.maxabs = e != e ? INFINITY : fabs(e);
        if (c.bad < 0 && (!isfinite(got[i]) || fabs(e) > max_rel * c.rms)) c.bad = i, c.got = got[i], c.want = want[i];
    }
    c.nmse = den > 0 ? num / den : num;
    if (c.nmse != c.nmse) c.nmse = INFINITY;
    return c;
}

/* Fails the test with the op, shape, type, T (what), which comparison (against), NMSE, max-abs and first bad index. */
#define CHECK_CMP(c, nb, mb, what, against)                                                                               \
    CHECK((c).nmse < (nb) && (c).bad < 0,                                                                                 \
          "%s vs %s: NMSE %.3g (bound %.3g), max-abs %.3g (bound %.3g of RMS %.3g), first bad index %lld: got %.9g want %.9g", \
          (what), (against), (c).nmse, (nb), (c).maxabs, (mb) * (c).rms, (c).rms, (long long)(c).bad, (c).got, (c).want)

static kiln_pool *pool;

static kiln_ops_ctx make_ctx(int64_t cols) {
    size_t bytes = kiln_cpu_ops.scratch_size(TMAX, cols, 8, 1, kiln_pool_size(pool));
    return (kiln_ops_ctx){.pool = pool, .scratch = malloc(bytes), .scratch_bytes = bytes};
}

static void poison(float *d, int64_t n) {
    float *h = malloc((size_t)n * sizeof *h);
    memset(h, 0xFF, (size_t)n * sizeof *h);
    kiln_cuda_upload(d, h, (size_t)n * sizeof *h);
    free(h);
}

typedef struct {
    int64_t rows, cols;
} shape;

/* (37, 256): one partial CTA of short rows; (1000, 2304): 9 K-blocks, 72 Q4_0 pieces per row, a second partial pass
 * of a 64-thread group; (4096, 512): many CTAs of 32-thread groups; (129, 11008): 7B FFN width, 128-thread groups in
 * several passes, the last CTA holding one row. Float types also take widths that are not multiples of 8 or 32
 * (the one-weight-per-thread path, and a prepare that must succeed doing nothing). */
/* {4097, 2304} and the GLU's {2049, 2304}: >= 2048 groups, so the K-quants run one warp per group from T = 4 on
 * (launch_t), with a partial last group */
static const shape shapes[] = {{37, 256}, {1000, 2304}, {4096, 512}, {129, 11008}, {4097, 2304}};
static const shape float_shapes[] = {{37, 100}, {5, 8}, {64, 264}};

static void test_matvec_type(kiln_type t, shape sh, bool add, unsigned long long *rng, bool *ok) {
    *ok = false;
    const int64_t rows = sh.rows, cols = sh.cols;
    const char *tn = kiln_type_name(t);
    const bounds bd = matvec_bounds(t);
    float *deq = malloc((size_t)(rows * cols) * sizeof *deq), *x = malloc((size_t)(TMAX * cols) * sizeof *x);
    float *y0 = malloc((size_t)(TMAX * rows) * sizeof *y0), *y = malloc((size_t)(TMAX * rows) * sizeof *y);
    float *ycpu = malloc((size_t)(TMAX * rows) * sizeof *ycpu), *xr = malloc((size_t)(TMAX * cols) * sizeof *xr);
    double *ref = malloc((size_t)(TMAX * rows) * sizeof *ref), *cpu = malloc((size_t)(TMAX * rows) * sizeof *cpu);
    uint8_t *w = make_weights(t, rows, cols, deq, rng);
    for (int64_t i = 0; i < TMAX * cols; i++) x[i] = test_rng_f32(rng);
    for (int64_t i = 0; i < TMAX * rows; i++) y0[i] = test_rng_f32(rng);
    const size_t wbytes = kiln_type_row_bytes(t, cols) * (size_t)rows, xpb = kiln_cuda_matvec_prep_bytes(TMAX, cols);
    void *dw = NULL, *dxp = NULL;
    float *dx = NULL, *dy = NULL;
    kiln_ops_ctx ctx = make_ctx(cols);
    const kiln_tensor_view view = make_view(t, cols, rows, w);
    bool fine = kiln_cuda_alloc(&dw, wbytes) == KILN_OK && kiln_cuda_alloc((void **)&dx, (size_t)(TMAX * cols) * 4) == KILN_OK &&
                kiln_cuda_alloc(&dxp, xpb) == KILN_OK && kiln_cuda_alloc((void **)&dy, (size_t)(TMAX * rows) * 4) == KILN_OK &&
                kiln_cuda_upload(dw, w, wbytes) == KILN_OK && kiln_cuda_upload(dx, x, (size_t)(TMAX * cols) * 4) == KILN_OK;
    const kiln_cuda_wt W = {.type = t, .rows = rows, .cols = cols, .row_bytes = kiln_type_row_bytes(t, cols), .data = dw};
    char what[160] = "";
    cmp c1 = {0}, c2 = {0};
    kiln_status st = fine ? KILN_OK : KILN_ERR_IO;
    for (int ti = 0; st == KILN_OK && ti < COUNT(Ts); ti++) {
        const int64_t T = Ts[ti];
        snprintf(what, sizeof what, "matvec %s rows %lld cols %lld T %lld%s", tn, (long long)rows, (long long)cols, (long long)T,
                 add ? " add" : "");
        x_as_kernel_sees(xr, x, T, cols, t);
        ref_matmul(ref, xr, deq, T, rows, cols);
        if (cpu_has(t)) kiln_cpu_ops.matmul_forward(&ctx, ycpu, x, &view, T);
        for (int64_t i = 0; i < T * rows; i++) cpu[i] = cpu_has(t) ? ycpu[i] : ref[i];
        poison(dy, TMAX * rows);
        if (add) kiln_cuda_upload(dy, y0, (size_t)(T * rows) * 4);
        if ((st = kiln_cuda_matvec_prepare(dxp, dx, T, cols, NULL)) != KILN_OK) break;
        if ((st = kiln_cuda_matvec(dy, dx, dxp, &W, T, add, NULL)) != KILN_OK) break;
        if ((st = kiln_cuda_sync()) != KILN_OK || (st = kiln_cuda_download(y, dy, (size_t)(T * rows) * 4)) != KILN_OK) break;
        if (add) /* y - y0 against the plain result: the subtraction's rounding (~1e-7 of |y0| <= 1) is far inside */
            for (int64_t i = 0; i < T * rows; i++) y[i] = (float)((double)y[i] - y0[i]);
        c1 = compare(y, ref, T * rows, bd.max_ref);
        c2 = compare(y, cpu, T * rows, bd.max_cpu);
        if (!(c1.nmse < bd.nmse_ref && c1.bad < 0 && c2.nmse < bd.nmse_cpu && c2.bad < 0)) break;
        if (ti == COUNT(Ts) - 1) *ok = true;
    }
    kiln_cuda_free(dw), kiln_cuda_free(dx), kiln_cuda_free(dxp), kiln_cuda_free(dy);
    free(deq), free(x), free(xr), free(y0), free(y), free(ycpu), free(ref), free(cpu), free(w), free(ctx.scratch);
    CHECK(st == KILN_OK, "%s: %s", what, kiln_last_error());
    CHECK_CMP(c1, bd.nmse_ref, bd.max_ref, what, "the double reference on x as the kernel rounds it");
    CHECK_CMP(c2, bd.nmse_cpu, bd.max_cpu, what, "CPU matmul_forward");
}

static void test_matvec(void) {
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    unsigned long long rng = 0x6d617476ULL;
    for (int ti = 0; ti < COUNT(types); ti++) {
        const kiln_type t = types[ti];
        for (int add = 0; add < 2; add++) {
            for (int si = 0; si < COUNT(shapes); si++) {
                bool ok;
                test_matvec_type(t, shapes[si], add, &rng, &ok);
                if (!ok) return; /* CHECK inside said why */
            }
            for (int si = 0; is_float(t) && si < COUNT(float_shapes); si++) {
                bool ok;
                test_matvec_type(t, float_shapes[si], add, &rng, &ok);
                if (!ok) return;
            }
        }
    }
}

static void test_matvec_glu_type(kiln_type t, shape sh, bool geglu, unsigned long long *rng, bool *ok);

/* A 7B-sized weight (4096 x 4096: 2^24 elements, 4096 columns), which one token's matvec takes with 4 rows a group
 * (launch_t's rule for large weights), against the same references, for the 7B Q4_K_M mix's types and Q8_0, F16. */
static void test_matvec_large(void) {
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    unsigned long long rng = 0x6c617267ULL;
    static const kiln_type lt[] = {KILN_TYPE_Q4_K, KILN_TYPE_Q6_K, KILN_TYPE_Q8_0, KILN_TYPE_F16};
    for (int ti = 0; ti < COUNT(lt); ti++)
        for (int add = 0; add < 2; add++) {
            bool ok;
            test_matvec_type(lt[ti], (shape){4096, 4096}, add, &rng, &ok);
            if (!ok) return;
        }
    bool ok; /* the GLU's 2 rows of each weight a group */
    test_matvec_glu_type(KILN_TYPE_Q4_K, (shape){4096, 4096}, false, &rng, &ok);
}

static void test_matvec_glu_type(kiln_type t, shape sh, bool geglu, unsigned long long *rng, bool *ok) {
    *ok = false;
    const int64_t rows = sh.rows, cols = sh.cols;
    const char *tn = kiln_type_name(t);
    const bounds bd = glu_bounds(t);
    float *dg = malloc((size_t)(rows * cols) * sizeof *dg), *du = malloc((size_t)(rows * cols) * sizeof *du);
    float *x = malloc((size_t)(TMAX * cols) * sizeof *x), *y = malloc((size_t)(TMAX * rows) * sizeof *y);
    float *xr = malloc((size_t)(TMAX * cols) * sizeof *xr);
    float *gc = malloc((size_t)(TMAX * rows) * sizeof *gc), *uc = malloc((size_t)(TMAX * rows) * sizeof *uc);
    double *gr = malloc((size_t)(TMAX * rows) * sizeof *gr), *ur = malloc((size_t)(TMAX * rows) * sizeof *ur);
    double *cpu = malloc((size_t)(TMAX * rows) * sizeof *cpu);
    uint8_t *wg = make_weights(t, rows, cols, dg, rng), *wu = make_weights(t, rows, cols, du, rng);
    for (int64_t i = 0; i < TMAX * cols; i++) x[i] = test_rng_f32(rng);
    const size_t wbytes = kiln_type_row_bytes(t, cols) * (size_t)rows, xpb = kiln_cuda_matvec_prep_bytes(TMAX, cols);
    void *dwg = NULL, *dwu = NULL, *dxp = NULL;
    float *dx = NULL, *dy = NULL;
    kiln_ops_ctx ctx = make_ctx(cols);
    const kiln_tensor_view vg = make_view(t, cols, rows, wg), vu = make_view(t, cols, rows, wu);
    bool fine = kiln_cuda_alloc(&dwg, wbytes) == KILN_OK && kiln_cuda_alloc(&dwu, wbytes) == KILN_OK &&
                kiln_cuda_alloc((void **)&dx, (size_t)(TMAX * cols) * 4) == KILN_OK && kiln_cuda_alloc(&dxp, xpb) == KILN_OK &&
                kiln_cuda_alloc((void **)&dy, (size_t)(TMAX * rows) * 4) == KILN_OK && kiln_cuda_upload(dwg, wg, wbytes) == KILN_OK &&
                kiln_cuda_upload(dwu, wu, wbytes) == KILN_OK && kiln_cuda_upload(dx, x, (size_t)(TMAX * cols) * 4) == KILN_OK;
    const size_t rb = kiln_type_row_bytes(t, cols);
    const kiln_cuda_wt Wg = {.type = t, .rows = rows, .cols = cols, .row_bytes = rb, .data = dwg};
    const kiln_cuda_wt Wu = {.type = t, .rows = rows, .cols = cols, .row_bytes = rb, .data = dwu};
    char what[160] = "";
    cmp c1 = {0}, c2 = {0};
    kiln_status st = fine ? KILN_OK : KILN_ERR_IO;
    for (int ti = 0; st == KILN_OK && ti < COUNT(Ts); ti++) {
        const int64_t T = Ts[ti];
        snprintf(what, sizeof what, "matvec_glu (%s) %s rows %lld cols %lld T %lld", geglu ? "gelu_tanh" : "silu", tn,
                 (long long)rows, (long long)cols, (long long)T);
        x_as_kernel_sees(xr, x, T, cols, t);
        ref_matmul(gr, xr, dg, T, rows, cols);
        ref_matmul(ur, xr, du, T, rows, cols);
        for (int64_t i = 0; i < T * rows; i++) gr[i] = (geglu ? gelu_d(gr[i]) : silu_d(gr[i])) * ur[i];
        if (cpu_has(t)) {
            kiln_cpu_ops.matmul_forward(&ctx, gc, x, &vg, T);
            kiln_cpu_ops.matmul_forward(&ctx, uc, x, &vu, T);
            if (geglu) kiln_cpu_ops.geglu_forward(&ctx, gc, gc, uc, T * rows);
            else kiln_cpu_ops.swiglu_forward(&ctx, gc, gc, uc, T * rows);
        }
        for (int64_t i = 0; i < T * rows; i++) cpu[i] = cpu_has(t) ? gc[i] : gr[i];
        poison(dy, TMAX * rows);
        if ((st = kiln_cuda_matvec_prepare(dxp, dx, T, cols, NULL)) != KILN_OK) break;
        if ((st = kiln_cuda_matvec_glu(dy, dx, dxp, &Wg, &Wu, T, geglu, NULL)) != KILN_OK) break;
        if ((st = kiln_cuda_sync()) != KILN_OK || (st = kiln_cuda_download(y, dy, (size_t)(T * rows) * 4)) != KILN_OK) break;
        c1 = compare(y, gr, T * rows, bd.max_ref);
        c2 = compare(y, cpu, T * rows, bd.max_cpu);
        if (!(c1.nmse < bd.nmse_ref && c1.bad < 0 && c2.nmse < bd.nmse_cpu && c2.bad < 0)) break;
        if (ti == COUNT(Ts) - 1) *ok = true;
    }
    kiln_cuda_free(dwg), kiln_cuda_free(dwu), kiln_cuda_free(dx), kiln_cuda_free(dxp), kiln_cuda_free(dy);
    free(dg), free(du), free(x), free(xr), free(y), free(gc), free(uc), free(gr), free(ur), free(cpu), free(wg), free(wu);
    free(ctx.scratch);
    CHECK(st == KILN_OK, "%s: %s", what, kiln_last_error());
    CHECK_CMP(c1, bd.nmse_ref, bd.max_ref, what, "the double reference on x as the kernel rounds it");
    CHECK_CMP(c2, bd.nmse_cpu, bd.max_cpu, what, "CPU matmul + activation");
}

static void test_matvec_glu(void) {
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    unsigned long long rng = 0x676c75ULL;
    static const shape glu_shapes[] = {{37, 256}, {1000, 2304}, {129, 11008}, {2049, 2304}};
    for (int ti = 0; ti < COUNT(types); ti++)
        for (int geglu = 0; geglu < 2; geglu++)
            for (int si = 0; si < COUNT(glu_shapes) + (is_float(types[ti]) ? 1 : 0); si++) {
                bool ok;
                test_matvec_glu_type(types[ti], si < COUNT(glu_shapes) ? glu_shapes[si] : float_shapes[0], geglu, &rng, &ok);
                if (!ok) return;
            }
}

/* The tails (kiln_cuda_mv_tail) against the kernels they replace, byte for byte: a matvec with add and the NORM
 * tail against the same matvec then kiln_cuda_residual_norm_xp (y, xb and the prepared bytes; the tail sums the
 * squares in another order, in double, which leaves the float scale the same), and the GLU with the PREPARE tail
 * against the GLU then kiln_cuda_matvec_prepare. Each tail runs twice, the second time after the first left its
 * counters, which must be back at zero. Shapes: one CTA (96 rows), 4096 rows of short rows (one warp a group
 * from T 4 on for the K-quants: the other store path), 2048 rows of 2304. */
static void test_matvec_tails(void) {
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    static const kiln_type tt[] = {KILN_TYPE_Q4_K, KILN_TYPE_Q6_K, KILN_TYPE_Q8_0, KILN_TYPE_Q4_0, KILN_TYPE_F16};
    static const shape tsh[] = {{96, 256}, {4096, 512}, {2048, 2304}};
    static const int64_t tT[] = {1, 3, 8};
    unsigned long long rng = 0x7461696cULL;
    char what[160] = "";
    for (int ti = 0; ti < COUNT(tt); ti++)
        for (int si = 0; si < COUNT(tsh); si++) {
            const kiln_type t = tt[ti];
            const int64_t rows = tsh[si].rows, cols = tsh[si].cols, n_out = TMAX * rows;
            float *deq = malloc((size_t)(rows * cols) * 4), *x = malloc((size_t)(TMAX * cols) * 4), *y0 = malloc((size_t)n_out * 4);
            float *nw = malloc((size_t)rows * 4), *got = malloc((size_t)n_out * 4), *want = malloc((size_t)n_out * 4);
            const size_t xpo = kiln_cuda_matvec_prep_bytes(TMAX, rows);
            uint8_t *pg = malloc(xpo), *pw = malloc(xpo);
            unsigned cnt_h[TMAX * 4096 / 32];
            uint8_t *w = make_weights(t, rows, cols, deq, &rng), *w2 = make_weights(t, rows, cols, deq, &rng);
            for (int64_t i = 0; i < TMAX * cols; i++) x[i] = test_rng_f32(&rng);
            for (int64_t i = 0; i < n_out; i++) y0[i] = 4.0f * test_rng_f32(&rng);
            for (int64_t i = 0; i < rows; i++) nw[i] = 1.0f + 0.5f * test_rng_f32(&rng);
            const size_t rb = kiln_type_row_bytes(t, cols), wbytes = rb * (size_t)rows;
            void *dw = NULL, *dw2 = NULL, *dxp = NULL, *dxpa = NULL, *dxpb = NULL;
            float *dx = NULL, *dya = NULL, *dyb = NULL, *dxba = NULL, *dxbb = NULL, *dnw = NULL;
            unsigned *dcnt = NULL;
            kiln_status st = KILN_OK;
            bool same = true;
            if (kiln_cuda_alloc(&dw, wbytes) || kiln_cuda_alloc(&dw2, wbytes) || kiln_cuda_alloc((void **)&dx, (size_t)(TMAX * cols) * 4) ||
                kiln_cuda_alloc(&dxp, kiln_cuda_matvec_prep_bytes(TMAX, cols)) || kiln_cuda_alloc(&dxpa, xpo) || kiln_cuda_alloc(&dxpb, xpo) ||
                kiln_cuda_alloc((void **)&dya, (size_t)n_out * 4) || kiln_cuda_alloc((void **)&dyb, (size_t)n_out * 4) ||
                kiln_cuda_alloc((void **)&dxba, (size_t)n_out * 4) || kiln_cuda_alloc((void **)&dxbb, (size_t)n_out * 4) ||
                kiln_cuda_alloc((void **)&dnw, (size_t)rows * 4) || kiln_cuda_alloc((void **)&dcnt, sizeof cnt_h) ||
                kiln_cuda_upload(dw, w, wbytes) || kiln_cuda_upload(dw2, w2, wbytes) || kiln_cuda_upload(dx, x, (size_t)(TMAX * cols) * 4) ||
                kiln_cuda_upload(dnw, nw, (size_t)rows * 4))
                st = KILN_ERR_IO;
            const kiln_cuda_wt W = {.type = t, .rows = rows, .cols = cols, .row_bytes = rb, .data = dw};
            const kiln_cuda_wt W2 = {.type = t, .rows = rows, .cols = cols, .row_bytes = rb, .data = dw2};
            for (int k = 0; st == KILN_OK && same && k < COUNT(tT); k++) {
                const int64_t T = tT[k], n = T * rows;
                const size_t xpn = kiln_cuda_matvec_prep_bytes(T, rows);
                if ((st = kiln_cuda_matvec_prepare(dxp, dx, T, cols, NULL)) != KILN_OK) break;
                for (int glu = 0; glu < 2 && st == KILN_OK && same; glu++) {
                    snprintf(what, sizeof what, "%s tail %s rows %lld cols %lld T %lld", glu ? "glu" : "matvec",
                             glu ? "prepare" : "norm", (long long)rows, (long long)cols, (long long)T);
                    /* the two kernels */
                    poison(dxba, n_out), poison(dxbb, n_out);
                    kiln_cuda_upload(dya, y0, (size_t)n * 4);
                    if (glu) {
                        if ((st = kiln_cuda_matvec_glu(dya, dx, dxp, &W, &W2, T, false, NULL)) ||
                            (st = kiln_cuda_matvec_prepare(dxpa, dya, T, rows, NULL)))
                            break;
                    } else if ((st = kiln_cuda_matvec(dya, dx, dxp, &W, T, true, NULL)) ||
                               (st = kiln_cuda_residual_norm_xp(dya, NULL, NULL, 0.0f, dxba, dxpa, dnw, 1e-5f, T, rows, NULL))) {
                        break;
                    }
                    if ((st = kiln_cuda_sync()) != KILN_OK) break;
                    /* the tail, twice */
                    const kiln_cuda_mv_tail tail = {.kind = glu ? KILN_CUDA_TAIL_PREPARE : KILN_CUDA_TAIL_NORM, .cnt = dcnt, .xp = dxpb,
                                                    .xb = glu ? NULL : dxbb, .w = glu ? NULL : dnw, .eps = 1e-5f};
                    memset(cnt_h, 0, sizeof cnt_h);
                    kiln_cuda_upload(dcnt, cnt_h, sizeof cnt_h);
                    for (int rep = 0; rep < 2 && st == KILN_OK && same; rep++) {
                        kiln_cuda_upload(dyb, y0, (size_t)n * 4);
                        memset(pg, 0xff, xpo);
                        kiln_cuda_upload(dxpb, pg, xpo);
                        st = glu ? kiln_cuda_matvec_glu_tail(dyb, dx, dxp, &W, &W2, T, false, &tail, NULL)
                                 : kiln_cuda_matvec_tail(dyb, dx, dxp, &W, T, true, &tail, NULL);
                        if (st || (st = kiln_cuda_sync())) break;
                        if ((st = kiln_cuda_download(got, dyb, (size_t)n * 4)) || (st = kiln_cuda_download(want, dya, (size_t)n * 4))) break;
                        if (memcmp(got, want, (size_t)n * 4)) {
                            same = false, snprintf(what + strlen(what), sizeof what - strlen(what), ": y differs (run %d)", rep + 1);
                            break;
                        }
                        if (!glu && ((st = kiln_cuda_download(got, dxbb, (size_t)n * 4)) || (st = kiln_cuda_download(want, dxba, (size_t)n * 4))))
                            break;
                        if (!glu && memcmp(got, want, (size_t)n * 4)) {
                            int64_t i = 0;
                            while (got[i] == want[i]) i++;
                            same = false, snprintf(what + strlen(what), sizeof what - strlen(what), ": xb[%lld] %.9g, the norm kernel's %.9g",
                                                   (long long)i, got[i], want[i]);
                            break;
                        }
                        if ((st = kiln_cuda_download(pg, dxpb, xpn)) || (st = kiln_cuda_download(pw, dxpa, xpn))) break;
                        if (memcmp(pg, pw, xpn)) {
                            same = false, snprintf(what + strlen(what), sizeof what - strlen(what), ": prepared bytes differ (run %d)", rep + 1);
                            break;
                        }
                        if ((st = kiln_cuda_download(cnt_h, dcnt, sizeof cnt_h))) break;
                        for (size_t i = 0; i < COUNT(cnt_h); i++)
                            if (cnt_h[i]) {
                                same = false, snprintf(what + strlen(what), sizeof what - strlen(what), ": counter %zu left at %u", i, cnt_h[i]);
                                break;
                            }
                    }
                }
            }
            kiln_cuda_free(dw), kiln_cuda_free(dw2), kiln_cuda_free(dx), kiln_cuda_free(dxp), kiln_cuda_free(dxpa), kiln_cuda_free(dxpb);
            kiln_cuda_free(dya), kiln_cuda_free(dyb), kiln_cuda_free(dxba), kiln_cuda_free(dxbb), kiln_cuda_free(dnw), kiln_cuda_free(dcnt);
            free(deq), free(x), free(y0), free(nw), free(got), free(want), free(pg), free(pw), free(w), free(w2);
            CHECK(st == KILN_OK, "%s (%s): %s", what, kiln_type_name(t), kiln_last_error());
            CHECK(same, "%s (%s)", what, kiln_type_name(t));
        }
}

/* A matvec that prefetches other weights into L2 as it ends (kiln_cuda_mv_tail's pf, with and without a tail kind)
 * gives the same bytes as one that does not: the prefetch is a hint. Spans: the whole second weight, a 16-byte
 * piece, and a span whose size is not a multiple of the kernel's 16 KiB chunk. */
static void test_matvec_prefetch(void) {
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    static const kiln_type pt[] = {KILN_TYPE_Q4_K, KILN_TYPE_Q6_K, KILN_TYPE_F16};
    static const shape psh[] = {{96, 256}, {4096, 512}, {11008, 256}};
    static const int64_t pT[] = {1, 3};
    unsigned long long rng = 0x70726566ULL;
    for (int ti = 0; ti < COUNT(pt); ti++)
        for (int si = 0; si < COUNT(psh); si++) {
            const kiln_type t = pt[ti];
            const int64_t rows = psh[si].rows, cols = psh[si].cols, n_max = 3 * rows;
            float *deq = malloc((size_t)(rows * cols) * 4), *x = malloc((size_t)(3 * cols) * 4);
            float *got = malloc((size_t)n_max * 4), *want = malloc((size_t)n_max * 4);
            uint8_t *w = make_weights(t, rows, cols, deq, &rng), *w2 = make_weights(t, rows, cols, deq, &rng);
            for (int64_t i = 0; i < 3 * cols; i++) x[i] = test_rng_f32(&rng);
            const size_t rb = kiln_type_row_bytes(t, cols), wbytes = rb * (size_t)rows;
            void *dw = NULL, *dw2 = NULL, *dxp = NULL;
            float *dx = NULL, *dya = NULL, *dyb = NULL;
            kiln_status st = KILN_OK;
            char what[128] = "";
            bool same = true;
            if (kiln_cuda_alloc(&dw, wbytes) || kiln_cuda_alloc(&dw2, wbytes) || kiln_cuda_alloc((void **)&dx, (size_t)(3 * cols) * 4) ||
                kiln_cuda_alloc(&dxp, kiln_cuda_matvec_prep_bytes(3, cols)) || kiln_cuda_alloc((void **)&dya, (size_t)n_max * 4) ||
                kiln_cuda_alloc((void **)&dyb, (size_t)n_max * 4) || kiln_cuda_upload(dw, w, wbytes) || kiln_cuda_upload(dw2, w2, wbytes) ||
                kiln_cuda_upload(dx, x, (size_t)(3 * cols) * 4))
                st = KILN_ERR_IO;
            const kiln_cuda_wt W = {.type = t, .rows = rows, .cols = cols, .row_bytes = rb, .data = dw};
            const kiln_cuda_wt W2 = {.type = t, .rows = rows, .cols = cols, .row_bytes = rb, .data = dw2};
            kiln_cuda_mv_tail pf = {.kind = KILN_CUDA_TAIL_NONE};
            pf.pf[0] = dw2, pf.pf_bytes[0] = wbytes & ~(size_t)15;
            pf.pf[1] = dw, pf.pf_bytes[1] = 16;
            pf.pf[3] = (const uint8_t *)dw + 32, pf.pf_bytes[3] = ((wbytes - 32) / 3) & ~(size_t)15;
            for (int k = 0; st == KILN_OK && same && k < COUNT(pT); k++)
                for (int glu = 0; glu < 2 && st == KILN_OK && same; glu++) {
                    const int64_t T = pT[k], n = T * rows;
                    snprintf(what, sizeof what, "%s %s rows %lld cols %lld T %lld", glu ? "glu" : "matvec", kiln_type_name(t),
                             (long long)rows, (long long)cols, (long long)T);
                    if ((st = kiln_cuda_matvec_prepare(dxp, dx, T, cols, NULL))) break;
                    poison(dya, n), poison(dyb, n);
                    st = glu ? kiln_cuda_matvec_glu(dya, dx, dxp, &W, &W2, T, false, NULL) : kiln_cuda_matvec(dya, dx, dxp, &W, T, false, NULL);
                    if (st || (st = glu ? kiln_cuda_matvec_glu_tail(dyb, dx, dxp, &W, &W2, T, false, &pf, NULL)
                                        : kiln_cuda_matvec_tail(dyb, dx, dxp, &W, T, false, &pf, NULL)))
                        break;
                    if ((st = kiln_cuda_sync()) || (st = kiln_cuda_download(got, dyb, (size_t)n * 4)) ||
                        (st = kiln_cuda_download(want, dya, (size_t)n * 4)))
                        break;
                    same = memcmp(got, want, (size_t)n * 4) == 0;
                }
            kiln_cuda_free(dw), kiln_cuda_free(dw2), kiln_cuda_free(dx), kiln_cuda_free(dxp), kiln_cuda_free(dya), kiln_cuda_free(dyb);
            free(deq), free(x), free(got), free(want), free(w), free(w2);
            CHECK(st == KILN_OK, "%s: %s", what, kiln_last_error());
            CHECK(same, "%s: the output with a prefetch differs", what);
        }
}

/* kiln_cuda_matvec_pair: Q4_K (and Q5_K) rows beside Q6_K rows in one launch give the two separate launches'
 * outputs bit for bit: the merged q|k and v of a 1.1B-like layer (2048 wide), a 4096-wide pair below the 4-rows
 * size, and an odd row count (a partial last CTA in each part). Then what it refuses: a pair of types it has no
 * kernel for, widths that differ, a 7B-like q|k (4096 x 8192: 4 rows a group alone). */
static void test_matvec_pair(void) {
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    const struct {
        kiln_type t1;
        int64_t rows1, rows2, cols;
    } cases[] = {{KILN_TYPE_Q4_K, 2048 + 256, 256, 2048}, {KILN_TYPE_Q4_K, 2048 + 512, 512, 4096}, {KILN_TYPE_Q5_K, 777, 131, 512}};
    unsigned long long rng = 4242;
    for (int ci = 0; ci < COUNT(cases); ci++) {
        const int64_t r1 = cases[ci].rows1, r2 = cases[ci].rows2, cols = cases[ci].cols;
        const kiln_type t1 = cases[ci].t1, t2 = KILN_TYPE_Q6_K;
        float *deq1 = malloc((size_t)(r1 * cols) * 4), *deq2 = malloc((size_t)(r2 * cols) * 4), *x = malloc((size_t)cols * 4);
        float *a1 = malloc((size_t)r1 * 4), *a2 = malloc((size_t)r2 * 4), *b1 = malloc((size_t)r1 * 4), *b2 = malloc((size_t)r2 * 4);
        uint8_t *w1 = make_weights(t1, r1, cols, deq1, &rng), *w2 = make_weights(t2, r2, cols, deq2, &rng);
        for (int64_t i = 0; i < cols; i++) x[i] = test_rng_f32(&rng);
        const size_t wb1 = kiln_type_row_bytes(t1, cols) * (size_t)r1, wb2 = kiln_type_row_bytes(t2, cols) * (size_t)r2;
        void *dw1 = NULL, *dw2 = NULL, *dxp = NULL;
        float *dx = NULL, *dy1 = NULL, *dy2 = NULL;
        kiln_status st = KILN_OK;
        if (!st) st = kiln_cuda_alloc(&dw1, wb1);
        if (!st) st = kiln_cuda_alloc(&dw2, wb2);
        if (!st) st = kiln_cuda_alloc(&dxp, kiln_cuda_matvec_prep_bytes(1, cols));
        if (!st) st = kiln_cuda_alloc((void **)&dx, (size_t)cols * 4);
        if (!st) st = kiln_cuda_alloc((void **)&dy1, (size_t)r1 * 4);
        if (!st) st = kiln_cuda_alloc((void **)&dy2, (size_t)r2 * 4);
        if (!st) st = kiln_cuda_upload(dw1, w1, wb1);
        if (!st) st = kiln_cuda_upload(dw2, w2, wb2);
        if (!st) st = kiln_cuda_upload(dx, x, (size_t)cols * 4);
        const kiln_cuda_wt W1 = {.type = t1, .rows = r1, .cols = cols, .row_bytes = kiln_type_row_bytes(t1, cols), .data = dw1};
        const kiln_cuda_wt W2 = {.type = t2, .rows = r2, .cols = cols, .row_bytes = kiln_type_row_bytes(t2, cols), .data = dw2};
        if (!st) st = kiln_cuda_matvec_prepare(dxp, dx, 1, cols, NULL);
        if (!st) poison(dy1, r1), poison(dy2, r2);
        if (!st) st = kiln_cuda_matvec(dy1, dx, dxp, &W1, 1, false, NULL);
        if (!st) st = kiln_cuda_matvec(dy2, dx, dxp, &W2, 1, false, NULL);
        if (!st) st = kiln_cuda_sync();
        if (!st) st = kiln_cuda_download(a1, dy1, (size_t)r1 * 4);
        if (!st) st = kiln_cuda_download(a2, dy2, (size_t)r2 * 4);
        if (!st) poison(dy1, r1), poison(dy2, r2);
        const bool takes = kiln_cuda_matvec_pair_takes(&W1, &W2);
        if (!st) st = kiln_cuda_matvec_pair(dy1, &W1, dy2, &W2, dxp, NULL);
        if (!st) st = kiln_cuda_sync();
        if (!st) st = kiln_cuda_download(b1, dy1, (size_t)r1 * 4);
        if (!st) st = kiln_cuda_download(b2, dy2, (size_t)r2 * 4);
        const bool same = !st && memcmp(a1, b1, (size_t)r1 * 4) == 0 && memcmp(a2, b2, (size_t)r2 * 4) == 0;
        bool finite = true;
        for (int64_t i = 0; !st && i < r1; i++) finite = finite && isfinite(b1[i]);
        for (int64_t i = 0; !st && i < r2; i++) finite = finite && isfinite(b2[i]);
        kiln_cuda_free(dw1), kiln_cuda_free(dw2), kiln_cuda_free(dxp), kiln_cuda_free(dx), kiln_cuda_free(dy1), kiln_cuda_free(dy2);
        free(deq1), free(deq2), free(x), free(a1), free(a2), free(b1), free(b2), free(w1), free(w2);
        CHECK(takes, "case %d: %s beside q6_K is not taken", ci, kiln_type_name(t1));
        CHECK(st == KILN_OK, "case %d: %s", ci, kiln_last_error());
        CHECK(finite, "case %d: a non-finite output (an unwritten row keeps the poison)", ci);
        CHECK(same, "case %d (%s %lld + q6_K %lld rows of %lld): the pair differs from the two launches", ci, kiln_type_name(t1),
              (long long)r1, (long long)r2, (long long)cols);
    }
    float dummy[4];
    const kiln_cuda_wt q4 = {.type = KILN_TYPE_Q4_K, .rows = 256, .cols = 256, .row_bytes = 144, .data = dummy};
    const kiln_cuda_wt q8 = {.type = KILN_TYPE_Q8_0, .rows = 256, .cols = 256, .row_bytes = 272, .data = dummy};
    const kiln_cuda_wt q6 = {.type = KILN_TYPE_Q6_K, .rows = 64, .cols = 512, .row_bytes = 420, .data = dummy};
    CHECK(!kiln_cuda_matvec_pair_takes(&q4, &q8), "q4_K beside q8_0");
    CHECK(kiln_cuda_matvec_pair(dummy, &q4, dummy, &q8, dummy, NULL) == KILN_ERR_UNSUPPORTED, "q4_K beside q8_0 launched");
    CHECK(!kiln_cuda_matvec_pair_takes(&q4, &q6), "widths 256 and 512");
    CHECK(kiln_cuda_matvec_pair(dummy, &q4, dummy, &q6, dummy, NULL) == KILN_ERR_UNSUPPORTED, "widths 256 and 512 launched");
    const kiln_cuda_wt qk = {.type = KILN_TYPE_Q4_K, .rows = 8192, .cols = 4096, .row_bytes = 2304, .data = dummy};
    const kiln_cuda_wt v6 = {.type = KILN_TYPE_Q6_K, .rows = 4096, .cols = 4096, .row_bytes = 3360, .data = dummy};
    CHECK(!kiln_cuda_matvec_pair_takes(&qk, &v6), "a 7B-like q|k beside its v");
    CHECK(kiln_cuda_matvec_pair(dummy, &qk, dummy, &v6, dummy, NULL) == KILN_ERR_UNSUPPORTED, "a 7B-like pair launched");
}

/* KILN_MV_TWO=0 (never), 1 (always) and unset (where the grid is one wave) give the same bits, a thread's two pieces
 * of a row loaded before the PDL wait or not: one token, rows of 72 to 256 pieces (the 1.1B and 7B down projections'
 * K-quant widths, Q8_0 and Q4_0), a partial last CTA, add, the GLU. The variable is read at every call. */
static void test_matvec_two(void) {
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    const struct {
        kiln_type t;
        int64_t rows, cols;
        int kind; /* 0 plain, 1 plain + add, 2 GLU */
    } cases[] = {{KILN_TYPE_Q4_K, 1003, 5632, 0}, {KILN_TYPE_Q6_K, 4099, 11008, 1}, {KILN_TYPE_Q4_K, 4096, 11008, 0},
                 {KILN_TYPE_Q5_K, 515, 5632, 1},  {KILN_TYPE_Q4_K, 777, 5632, 2},   {KILN_TYPE_Q8_0, 1000, 2304, 0},
                 {KILN_TYPE_Q4_0, 33, 8192, 1}};
    unsigned long long rng = 2222;
    char *keep = getenv("KILN_MV_TWO") ? strdup(getenv("KILN_MV_TWO")) : NULL;
    for (int ci = 0; ci < COUNT(cases); ci++) {
        const kiln_type t = cases[ci].t;
        const int64_t rows = cases[ci].rows, cols = cases[ci].cols;
        const int kind = cases[ci].kind;
        float *deq = malloc((size_t)(rows * cols) * 4), *x = malloc((size_t)cols * 4), *y[3];
        for (int v = 0; v < 3; v++) y[v] = malloc((size_t)rows * 4);
        uint8_t *w = make_weights(t, rows, cols, deq, &rng), *w2 = kind == 2 ? make_weights(t, rows, cols, deq, &rng) : NULL;
        for (int64_t i = 0; i < cols; i++) x[i] = test_rng_f32(&rng);
        const size_t rb = kiln_type_row_bytes(t, cols);
        void *dw = NULL, *dw2 = NULL, *dxp = NULL;
        float *dx = NULL, *dy = NULL;
        kiln_status st = KILN_OK;
        if (!st) st = kiln_cuda_alloc(&dw, rb * (size_t)rows);
        if (!st && w2) st = kiln_cuda_alloc(&dw2, rb * (size_t)rows);
        if (!st) st = kiln_cuda_alloc(&dxp, kiln_cuda_matvec_prep_bytes(1, cols));
        if (!st) st = kiln_cuda_alloc((void **)&dx, (size_t)cols * 4);
        if (!st) st = kiln_cuda_alloc((void **)&dy, (size_t)rows * 4);
        if (!st) st = kiln_cuda_upload(dw, w, rb * (size_t)rows);
        if (!st && w2) st = kiln_cuda_upload(dw2, w2, rb * (size_t)rows);
        if (!st) st = kiln_cuda_upload(dx, x, (size_t)cols * 4);
        if (!st) st = kiln_cuda_matvec_prepare(dxp, dx, 1, cols, NULL);
        const kiln_cuda_wt W = {.type = t, .rows = rows, .cols = cols, .row_bytes = rb, .data = dw};
        const kiln_cuda_wt W2 = {.type = t, .rows = rows, .cols = cols, .row_bytes = rb, .data = dw2};
        static const char *const modes[3] = {"0", "1", NULL};
        for (int v = 0; v < 3 && !st; v++) {
            if (modes[v]) setenv("KILN_MV_TWO", modes[v], 1);
            else unsetenv("KILN_MV_TWO");
            for (int64_t i = 0; i < rows; i++) y[v][i] = (float)i * 0.25f - 3.0f; /* what add adds to */
            if (!st) st = kiln_cuda_upload(dy, y[v], (size_t)rows * 4);
            if (!st && kind <= 1) st = kiln_cuda_matvec(dy, dx, dxp, &W, 1, kind == 1, NULL);
            if (!st && kind == 2) st = kiln_cuda_matvec_glu(dy, dx, dxp, &W, &W2, 1, false, NULL);
            if (!st) st = kiln_cuda_sync();
            if (!st) st = kiln_cuda_download(y[v], dy, (size_t)rows * 4);
        }
        if (keep) setenv("KILN_MV_TWO", keep, 1);
        else unsetenv("KILN_MV_TWO");
        double num = 0, den = 0; /* the plain kernel against the double reference: the comparison below is not of garbage */
        for (int64_t o = 0; !st && kind <= 1 && o < rows; o++) {
            double r = kind == 1 ? (double)o * 0.25 - 3.0 : 0.0;
            for (int64_t i = 0; i < cols; i++) r += (double)deq[o * cols + i] * x[i];
            num += (y[0][o] - r) * (y[0][o] - r), den += r * r;
        }
        const bool same = !st && memcmp(y[0], y[1], (size_t)rows * 4) == 0 && memcmp(y[0], y[2], (size_t)rows * 4) == 0;
        kiln_cuda_free(dw), kiln_cuda_free(dw2), kiln_cuda_free(dxp), kiln_cuda_free(dx), kiln_cuda_free(dy);
        free(deq), free(x), free(y[0]), free(y[1]), free(y[2]), free(w), free(w2);
        CHECK(st == KILN_OK, "case %d: %s", ci, kiln_last_error());
        CHECK(kind == 2 || (den > 0 && num / den < 1e-4), "case %d: the plain kernel is %.3g (NMSE) from the reference", ci, den > 0 ? num / den : -1.0);
        CHECK(same, "case %d (%s %lld x %lld, kind %d): two pieces before the wait differ from the plain kernel", ci, kiln_type_name(t),
              (long long)rows, (long long)cols, kind);
    }
    free(keep);
}

/* The matvec prologue (kiln_cuda_mv_tail's pre_x): one token's matvec that makes its own prepared x gives the bytes
 * of the kernels it saves, bit for bit: y, and the xb and xp that CTA 0 leaves, against residual_norm_xp (normed)
 * or matvec_prepare (not) followed by the matvec reading xp. Widths 768, 2048 and 4096 (the norm kernel's 64, 128
 * and 256 threads, replayed by a CTA of 128) and 5632 and 11008 unnormed; row counts that leave a partial last CTA;
 * add; the GLU; the pair (q|k beside v). x spans several magnitudes so the norm's sum has many bits to lose. */
typedef struct {
    kiln_type t;
    int64_t rows, cols;
    bool normed, glu, add, pair;
} pre_case;

static void test_matvec_pre(void) {
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    static const pre_case cases[] = {
        {KILN_TYPE_Q4_K, 2304, 768, true, false, false, false},  {KILN_TYPE_Q6_K, 1000, 768, true, false, true, false},
        {KILN_TYPE_Q8_0, 2560, 2048, true, false, false, false}, {KILN_TYPE_Q4_0, 777, 2048, true, true, false, false},
        {KILN_TYPE_Q5_K, 4097, 4096, true, false, false, false}, {KILN_TYPE_Q4_K, 11008, 4096, true, true, false, false},
        {KILN_TYPE_Q6_K, 2048, 5632, false, false, true, false}, {KILN_TYPE_Q4_K, 768, 2048, false, false, true, false},
        {KILN_TYPE_Q8_0, 4096, 11008, false, false, false, false}, {KILN_TYPE_Q4_0, 96, 256, false, true, false, false},
        {KILN_TYPE_Q4_K, 2048 + 512, 2048, true, false, false, true}, {KILN_TYPE_Q5_K, 1280, 768, true, false, false, true},
        {KILN_TYPE_Q4_K, 777, 2048, false, false, false, true},
    };
    unsigned long long rng = 0x707265ULL;
    for (int ci = 0; ci < COUNT(cases); ci++) {
        const pre_case c = cases[ci];
        const int64_t rows = c.rows, cols = c.cols, r2 = c.pair ? 256 + ci : 0; /* the pair's q6_K part */
        const size_t xpn = kiln_cuda_matvec_prep_bytes(1, cols);
        const kiln_type t2 = KILN_TYPE_Q6_K;
        float *deq = malloc((size_t)(rows * cols) * 4), *deq2 = malloc((size_t)((r2 ? r2 : 1) * cols) * 4);
        float *x = malloc((size_t)cols * 4), *nw = malloc((size_t)cols * 4), *y0 = malloc((size_t)(rows + r2) * 4);
        float *ga = malloc((size_t)(rows + r2) * 4), *gb = malloc((size_t)(rows + r2) * 4);
        float *xba = malloc((size_t)cols * 4), *xbb = malloc((size_t)cols * 4);
        uint8_t *pa = malloc(xpn), *pb = malloc(xpn);
        uint8_t *w = make_weights(c.t, rows, cols, deq, &rng), *wu = make_weights(c.t, rows, cols, deq, &rng);
        uint8_t *w2 = r2 ? make_weights(t2, r2, cols, deq2, &rng) : NULL;
        for (int64_t i = 0; i < cols; i++) x[i] = test_rng_f32(&rng) * (float)(1 << (i % 7)) * 0.37f;
        for (int64_t i = 0; i < cols; i++) nw[i] = 1.0f + 0.5f * test_rng_f32(&rng);
        for (int64_t i = 0; i < rows + r2; i++) y0[i] = 4.0f * test_rng_f32(&rng);
        const size_t rb = kiln_type_row_bytes(c.t, cols), rb2 = kiln_type_row_bytes(t2, cols);
        void *dw = NULL, *dwu = NULL, *dw2 = NULL, *dxpa = NULL, *dxpb = NULL;
        float *dx = NULL, *dnw = NULL, *dya = NULL, *dyb = NULL, *dxba = NULL, *dxbb = NULL;
        kiln_status st = KILN_OK;
        if (!st) st = kiln_cuda_alloc(&dw, rb * (size_t)rows);
        if (!st) st = kiln_cuda_alloc(&dwu, rb * (size_t)rows);
        if (!st) st = kiln_cuda_alloc(&dw2, rb2 * (size_t)(r2 ? r2 : 1));
        if (!st) st = kiln_cuda_alloc(&dxpa, xpn);
        if (!st) st = kiln_cuda_alloc(&dxpb, xpn);
        if (!st) st = kiln_cuda_alloc((void **)&dx, (size_t)cols * 4);
        if (!st) st = kiln_cuda_alloc((void **)&dnw, (size_t)cols * 4);
        if (!st) st = kiln_cuda_alloc((void **)&dya, (size_t)(rows + r2) * 4);
        if (!st) st = kiln_cuda_alloc((void **)&dyb, (size_t)(rows + r2) * 4);
        if (!st) st = kiln_cuda_alloc((void **)&dxba, (size_t)cols * 4);
        if (!st) st = kiln_cuda_alloc((void **)&dxbb, (size_t)cols * 4);
        if (!st) st = kiln_cuda_upload(dw, w, rb * (size_t)rows);
        if (!st) st = kiln_cuda_upload(dwu, wu, rb * (size_t)rows);
        if (!st && r2) st = kiln_cuda_upload(dw2, w2, rb2 * (size_t)r2);
        if (!st) st = kiln_cuda_upload(dx, x, (size_t)cols * 4);
        if (!st) st = kiln_cuda_upload(dnw, nw, (size_t)cols * 4);
        const kiln_cuda_wt W = {.type = c.t, .rows = rows, .cols = cols, .row_bytes = rb, .data = dw};
        const kiln_cuda_wt Wu = {.type = c.t, .rows = rows, .cols = cols, .row_bytes = rb, .data = dwu};
        const kiln_cuda_wt W2 = {.type = t2, .rows = r2, .cols = cols, .row_bytes = rb2, .data = dw2};
        const bool takes = kiln_cuda_matvec_pre_takes(&W, 1, c.normed);
        /* the separate kernels: the norm (or the prepare), then the matvec reading xp */
        if (!st) poison(dxba, cols), poison(dxbb, cols), poison(dya, rows + r2), poison(dyb, rows + r2);
        if (!st && c.add) st = kiln_cuda_upload(dya, y0, (size_t)rows * 4);
        if (!st && c.add) st = kiln_cuda_upload(dyb, y0, (size_t)rows * 4);
        const float *xin = c.normed ? dxba : dx;
        if (!st) st = c.normed ? kiln_cuda_residual_norm_xp(dx, NULL, NULL, 0.0f, dxba, dxpa, dnw, 1e-5f, 1, cols, NULL)
                               : kiln_cuda_matvec_prepare(dxpa, dx, 1, cols, NULL);
        if (!st) st = c.pair ? kiln_cuda_matvec_pair(dya, &W, dya + rows, &W2, dxpa, NULL)
                      : c.glu ? kiln_cuda_matvec_glu(dya, xin, dxpa, &W, &Wu, 1, false, NULL)
                              : kiln_cuda_matvec(dya, xin, dxpa, &W, 1, c.add, NULL);
        /* the prologue, into a poisoned xp */
        kiln_cuda_mv_tail pre = {.kind = KILN_CUDA_TAIL_NONE, .pre_x = dx, .pre_w = c.normed ? dnw : NULL, .pre_eps = 1e-5f,
                                 .pre_xb = c.normed ? dxbb : NULL};
        memset(pb, 0xA5, xpn);
        if (!st) st = kiln_cuda_upload(dxpb, pb, xpn);
        if (!st) st = c.pair ? kiln_cuda_matvec_pair_pre(dyb, &W, dyb + rows, &W2, dxpb, &pre, NULL)
                      : c.glu ? kiln_cuda_matvec_glu_tail(dyb, NULL, dxpb, &W, &Wu, 1, false, &pre, NULL)
                              : kiln_cuda_matvec_tail(dyb, NULL, dxpb, &W, 1, c.add, &pre, NULL);
        if (!st) st = kiln_cuda_sync();
        if (!st) st = kiln_cuda_download(ga, dya, (size_t)(rows + r2) * 4);
        if (!st) st = kiln_cuda_download(gb, dyb, (size_t)(rows + r2) * 4);
        if (!st) st = kiln_cuda_download(xba, dxba, (size_t)cols * 4);
        if (!st) st = kiln_cuda_download(xbb, dxbb, (size_t)cols * 4);
        if (!st) st = kiln_cuda_download(pa, dxpa, xpn);
        if (!st) st = kiln_cuda_download(pb, dxpb, xpn);
        int64_t bad_y = -1;
        for (int64_t i = 0; !st && i < rows + r2 && bad_y < 0; i++)
            if (memcmp(&ga[i], &gb[i], 4) || !isfinite(gb[i])) bad_y = i;
        const bool same_xb = !c.normed || memcmp(xba, xbb, (size_t)cols * 4) == 0, same_xp = memcmp(pa, pb, xpn) == 0;
        kiln_cuda_free(dw), kiln_cuda_free(dwu), kiln_cuda_free(dw2), kiln_cuda_free(dxpa), kiln_cuda_free(dxpb), kiln_cuda_free(dx);
        kiln_cuda_free(dnw), kiln_cuda_free(dya), kiln_cuda_free(dyb), kiln_cuda_free(dxba), kiln_cuda_free(dxbb);
        free(deq), free(deq2), free(x), free(nw), free(y0), free(ga), free(gb), free(xba), free(xbb), free(pa), free(pb);
        free(w), free(wu), free(w2);
        CHECK(takes, "case %d: %s over %lld columns (%s) not taken", ci, kiln_type_name(c.t), (long long)cols, c.normed ? "normed" : "quantized");
        CHECK(st == KILN_OK, "case %d: %s", ci, kiln_last_error());
        CHECK(bad_y < 0, "case %d (%s %lld x %lld, %s%s%s%s): y[%lld] differs from the separate kernels'", ci, kiln_type_name(c.t),
              (long long)rows, (long long)cols, c.normed ? "normed" : "quantized", c.glu ? ", glu" : "", c.add ? ", add" : "",
              c.pair ? ", pair" : "", (long long)bad_y);
        CHECK(same_xb, "case %d: xb differs from the norm kernel's", ci);
        CHECK(same_xp, "case %d: the prepared bytes differ", ci);
    }
    /* what it refuses, before launching */
    float dummy[8];
    const kiln_cuda_wt f16 = {.type = KILN_TYPE_F16, .rows = 64, .cols = 256, .row_bytes = 512, .data = dummy};
    const kiln_cuda_wt q4 = {.type = KILN_TYPE_Q4_K, .rows = 64, .cols = 8192, .row_bytes = 4608, .data = dummy};
    const kiln_cuda_wt q2 = {.type = KILN_TYPE_Q2_K, .rows = 64, .cols = 256, .row_bytes = 84, .data = dummy};
    const kiln_cuda_wt q8 = {.type = KILN_TYPE_Q8_0, .rows = 64, .cols = 32 * 640, .row_bytes = 34 * 640, .data = dummy};
    CHECK(!kiln_cuda_matvec_pre_takes(&q4, 2, false), "two tokens");
    CHECK(!kiln_cuda_matvec_pre_takes(&f16, 1, false), "an f16 weight");
    CHECK(!kiln_cuda_matvec_pre_takes(&q2, 1, false), "a q2_K weight (no prologue built)");
    CHECK(!kiln_cuda_matvec_pre_takes(&q4, 1, true) && kiln_cuda_matvec_pre_takes(&q4, 1, false), "8192 columns: normed no, quantized yes");
    CHECK(!kiln_cuda_matvec_pre_takes(&q8, 1, false), "20480 columns");
    const kiln_cuda_mv_tail pre = {.pre_x = (const float *)dummy, .pre_w = (const float *)dummy};
    const kiln_status s_t2 = kiln_cuda_matvec_tail(dummy, dummy, dummy, &q4, 2, false, &pre, NULL);
    const kiln_status s_f16 = kiln_cuda_matvec_tail(dummy, dummy, dummy, &f16, 1, false, &pre, NULL);
    const kiln_status s_wide = kiln_cuda_matvec_tail(dummy, dummy, dummy, &q4, 1, false, &pre, NULL);
    CHECK(s_t2 == KILN_ERR_UNSUPPORTED && s_f16 == KILN_ERR_UNSUPPORTED && s_wide == KILN_ERR_UNSUPPORTED,
          "two tokens %d, f16 %d, a normed 8192 %d", s_t2, s_f16, s_wide);
}

/* The launchers refuse what they cannot compute, with a message, and never launch. */
static void test_matvec_refuses(void) {
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    void *dw = NULL, *dxp = NULL;
    float *dx = NULL, *dy = NULL;
    CHECK(kiln_cuda_alloc(&dw, kiln_type_row_bytes(KILN_TYPE_Q8_1, 256) * 4) == KILN_OK);
    CHECK(kiln_cuda_alloc((void **)&dx, 9 * 256 * 4) == KILN_OK && kiln_cuda_alloc((void **)&dy, 9 * 4 * 4) == KILN_OK);
    CHECK(kiln_cuda_alloc(&dxp, kiln_cuda_matvec_prep_bytes(9, 256)) == KILN_OK);
    const kiln_cuda_wt q81 = {.type = KILN_TYPE_Q8_1, .rows = 4, .cols = 256, .row_bytes = kiln_type_row_bytes(KILN_TYPE_Q8_1, 256), .data = dw};
    const kiln_cuda_wt q80 = {.type = KILN_TYPE_Q8_0, .rows = 4, .cols = 256, .row_bytes = kiln_type_row_bytes(KILN_TYPE_Q8_0, 256), .data = dw};
    const kiln_cuda_wt f32 = {.type = KILN_TYPE_F32, .rows = 4, .cols = 100, .row_bytes = 400, .data = dw};
    const kiln_status s_type = kiln_cuda_matvec(dy, dx, dxp, &q81, 1, false, NULL);
    const kiln_status s_t0 = kiln_cuda_matvec(dy, dx, dxp, &q80, 0, false, NULL);
    const kiln_status s_t9 = kiln_cuda_matvec(dy, dx, dxp, &q80, 9, false, NULL);
    const kiln_status s_noxp = kiln_cuda_matvec(dy, dx, NULL, &q80, 1, false, NULL);
    const kiln_status s_shape = kiln_cuda_matvec_glu(dy, dx, dxp, &q80, &f32, 1, false, NULL);
    const kiln_status s_prep = kiln_cuda_matvec_prepare(dxp, dx, 3, 100, NULL); /* float-only width: nothing to do */
    /* a tail wants rows in blocks of 32, its own xp, counters */
    unsigned *dcnt = NULL;
    CHECK(kiln_cuda_alloc((void **)&dcnt, 64) == KILN_OK);
    const kiln_cuda_mv_tail own = {.kind = KILN_CUDA_TAIL_PREPARE, .cnt = dcnt, .xp = dxp},
                            nocnt = {.kind = KILN_CUDA_TAIL_PREPARE, .xp = dy};
    const kiln_cuda_mv_tail nonorm = {.kind = KILN_CUDA_TAIL_NORM, .cnt = dcnt, .xp = dy};
    const kiln_status s_rows = kiln_cuda_matvec_tail(dy, dx, dxp, &q80, 1, false, &nonorm, NULL); /* 4 rows */
    const kiln_cuda_wt q80w = {.type = KILN_TYPE_Q8_0, .rows = 32, .cols = 256, .row_bytes = q80.row_bytes, .data = dw};
    const kiln_status s_own = kiln_cuda_matvec_tail(dy, dx, dxp, &q80w, 1, false, &own, NULL);
    const kiln_status s_cnt = kiln_cuda_matvec_tail(dy, dx, dxp, &q80w, 1, false, &nocnt, NULL);
    const kiln_status s_nonorm = kiln_cuda_matvec_tail(dy, dx, dxp, &q80w, 1, false, &nonorm, NULL);
    /* a prefetch span must be 16-byte aligned, a multiple of 16 bytes */
    kiln_cuda_mv_tail odd = {.kind = KILN_CUDA_TAIL_NONE}, mis = {.kind = KILN_CUDA_TAIL_NONE};
    odd.pf[2] = dw, odd.pf_bytes[2] = 24;
    mis.pf[0] = (const uint8_t *)dw + 8, mis.pf_bytes[0] = 32;
    const kiln_status s_odd = kiln_cuda_matvec_tail(dy, dx, dxp, &q80, 1, false, &odd, NULL);
    const kiln_status s_mis = kiln_cuda_matvec_glu_tail(dy, dx, dxp, &q80, &q80, 1, false, &mis, NULL);
    kiln_cuda_free(dcnt);
    const kiln_status s_sync = kiln_cuda_sync();
    kiln_cuda_free(dw), kiln_cuda_free(dx), kiln_cuda_free(dxp), kiln_cuda_free(dy);
    CHECK(s_type == KILN_ERR_UNSUPPORTED, "q8_1 weight: status %d", s_type);
    CHECK(s_t0 == KILN_ERR_INVALID && s_t9 == KILN_ERR_INVALID, "T 0: %d, T 9: %d", s_t0, s_t9);
    CHECK(s_noxp == KILN_ERR_INVALID, "q8_0 without xp: %d", s_noxp);
    CHECK(s_shape == KILN_ERR_INVALID, "gate and up of different types: %d", s_shape);
    CHECK(s_prep == KILN_OK && s_sync == KILN_OK, "prepare of 100 columns: %d, sync %d", s_prep, s_sync);
    CHECK(s_rows == KILN_ERR_INVALID && s_own == KILN_ERR_INVALID && s_cnt == KILN_ERR_INVALID && s_nonorm == KILN_ERR_INVALID,
          "tails: 4 rows %d, the matvec's own xp %d, no counters %d, a norm without xb %d", s_rows, s_own, s_cnt, s_nonorm);
    CHECK(s_odd == KILN_ERR_INVALID && s_mis == KILN_ERR_INVALID, "prefetch of 24 bytes: %d, at 8 mod 16: %d", s_odd, s_mis);
    CHECK(kiln_cuda_matvec_prep_bytes(8, 11008) >= (size_t)8 * 11008 + 8 * 344 * 8);
    CHECK(kiln_cuda_matvec_prep_bytes(3, 100) > 0);
}

int main(void) {
    if (kiln_pool_create(4, &pool) != KILN_OK) {
        printf("FAIL main: kiln_pool_create: %s\n", kiln_last_error());
        return 1;
    }
    RUN(test_matvec);
    RUN(test_matvec_large);
    RUN(test_matvec_glu);
    RUN(test_matvec_tails);
    RUN(test_matvec_prefetch);
    RUN(test_matvec_pair);
    RUN(test_matvec_two);
    RUN(test_matvec_pre);
    RUN(test_matvec_refuses);
    kiln_pool_free(pool);
    TEST_EXIT();
}

#else

static void test_matvec(void) { SKIP("kiln built without CUDA"); }

int main(void) {
    RUN(test_matvec);
    TEST_EXIT();
}

#endif
