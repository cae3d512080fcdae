/* test_cuda_train_matmul.c: the training matmuls (src/cuda/train_matmul.cu) against a double-precision host product
 * of the same bf16 values. x (N, I), W (O, I) and dy (N, O) are random bf16 (uniform in [-1, 1), never zero); the
 * reference multiplies their exact values in double, so the GPU's only error is the order and rounding of its fp32
 * accumulation (a product of two bf16 is exact in fp32) and, for a bf16 output, one final rounding. Cases, on each
 * (N, I, O) of (37, 64, 48), (256, 768, 1280), (1000, 2048, 768), (64, 768, 32000), plus an odd (37, 13, 11) with
 * every pointer off its allocation's alignment (bf16 by 2 bytes, f32 by 4):
 *   forward   y f32 = x W^T on a poisoned y; y f32 += x W^T on a random y0; y bf16 = x W^T on a poisoned y
 *   backward  dx f32 = dy W (poisoned) with dW += dy^T x (random dW0) in one call; dx f32 += dy W with dW NULL;
 *             dx bf16 = dy W (poisoned) with dW NULL; dW += dy^T x with dx NULL
 * The accumulated-into buffers start at the product's own RMS scale, so a dropped or doubled add shows.
 * Bounds, for a reduction of length K (I for y, O for dx, N for dW):
 *   f32 outputs   NMSE <= 1e-10 + 2^-48 (K/16)^2 and every |err| <= e32 = 10 sqrt(that) RMS(product). Rounding to
 *                 nearest, K fp32 adds of random-sign terms give NMSE ~ 2^-48 K / 6, below 1e-12 here. But tensor
 *                 cores are known to truncate (round toward zero) when they add a k = 16 block of products into
 *                 the fp32 accumulator, a bias of ~0.75 2^-24 of the running sum per step, which over M = K/16 steps
 *                 of a random walk gives NMSE ~ 0.19 2^-48 M^2: 1e-11 at K = 2048, 3e-9 at K = 32000. The bound is
 *                 5x that model plus 1e-10 (split-K or stream-K only shortens the chains). A host emulation of
 *                 that truncating accumulator measured 1.9e-9 at K = 32000 (bound 1.4e-8) and <= 5e-12 elsewhere.
 *                 A real bug (an operand rounded twice, a wrong transpose, a dropped beta) is >= 1e-6.
 *   bf16 outputs  got = bf16(f) with |f - ref| <= e32, so |got - ref| <= ulp_bf16(|ref| + e32) / 2 + e32: within
 *                 one rounding (2^-8 relative at most) of the exact value.
 * Every output is poisoned with 0xFF bytes (NaN) first, so an element left unwritten fails. Failures name the
 * op, shape, NMSE, max-abs and the first bad element (row, column, GPU and reference values). Argument checks
 * (bad shapes, accumulate into bf16, misaligned pointers, no handle) are tested to refuse. Skips without a GPU or
 * when kiln was built without CUDA. */
#include "cuda/cuda.h"
#include "test.h"

#ifdef KILN_CUDA
#include "test_cuda_util.h"
#include "cuda/train_kernels.h"
#include "fp16.h"

#include <stdbool.h>
#include <stdint.h>

/* bits (n) bf16 and val (n) their exact values: uniform in [-1, 1) rounded to bf16, never zero. */
static void random_bf16(uint16_t *bits, float *val, int64_t n, unsigned long long *rng) {
    for (int64_t i = 0; i < n; i++) {
        float v = test_rng_f32(rng);
        bits[i] = kiln_f32_to_bf16(v != 0.0f ? v : 0.5f);
        val[i] = kiln_bf16_to_f32(bits[i]);
    }
}

/* ---------------------------------------------------------------- the double-precision reference */

/* y (N, O) = x (N, I) W (O, I)^T, four accumulators to break the add chain. */
static void ref_forward(double *y, const float *x, const float *W, int64_t N, int64_t I, int64_t O) {
    for (int64_t n = 0; n < N; n++) {
        const float *xr = x + n * I;
        for (int64_t o = 0; o < O; o++) {
            const float *wr = W + o * I;
            double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
            int64_t i = 0;
            for (; i + 4 <= I; i += 4) {
                s0 += (double)xr[i] * wr[i];
                s1 += (double)xr[i + 1] * wr[i + 1];
                s2 += (double)xr[i + 2] * wr[i + 2];
                s3 += (double)xr[i + 3] * wr[i + 3];
            }
            for (; i < I; i++) s0 += (double)xr[i] * wr[i];
            y[n * O + o] = (s0 + s1) + (s2 + s3);
        }
    }
}

/* dx (N, I) = dy (N, O) W (O, I): row n is the sum over o of dy[n, o] times row o of W. */
static void ref_dx(double *dx, const float *dy, const float *W, int64_t N, int64_t I, int64_t O) {
    for (int64_t n = 0; n < N; n++) {
        double *r = dx + n * I;
        for (int64_t i = 0; i < I; i++) r[i] = 0;
        for (int64_t o = 0; o < O; o++) {
            const double a = dy[n * O + o];
            const float *wr = W + o * I;
            for (int64_t i = 0; i < I; i++) r[i] += a * wr[i];
        }
    }
}

/* dW (O, I) = dy (N, O)^T x (N, I): row o is the sum over n of dy[n, o] times row n of x. */
static void ref_dW(double *dW, const float *dy, const float *x, int64_t N, int64_t I, int64_t O) {
    for (int64_t o = 0; o < O; o++) {
        double *r = dW + o * I;
        for (int64_t i = 0; i < I; i++) r[i] = 0;
        for (int64_t n = 0; n < N; n++) {
            const double a = dy[n * O + o];
            const float *xr = x + n * I;
            for (int64_t i = 0; i < I; i++) r[i] += a * xr[i];
        }
    }
}

static double rms(const double *v, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += v[i] * v[i];
    return sqrt(s / (double)n);
}

/* ---------------------------------------------------------------- bounds and comparisons (see the header) */

static double nmse_bound(int64_t K) {
    const double m = (double)K / 16, two_m48 = ldexp(1.0, -48);
    return 1e-10 + two_m48 * m * m;
}

/* The spacing of bf16 values at magnitude a (normal range): 2^(e-8) for a in [2^(e-1), 2^e). */
static double ulp_bf16(double a) {
    int e;
    frexp(fmax(a, ldexp(1.0, -126)), &e);
    return ldexp(1.0, e - 8);
}

/* got (n) f32 against want (n), rows of `cols`: NMSE <= nmse_max and every |err| <= e_max. */
static bool check_f32(const char *what, const float *got, const double *want, int64_t n, int64_t cols, double nmse_max,
                      double e_max, char *msg, size_t n_msg) {
    double se = 0, sw = 0, max_err = 0;
    int64_t bad = -1, worst = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = isfinite(got[i]) ? fabs((double)got[i] - want[i]) : INFINITY;
        se += e * e, sw += want[i] * want[i];
        if (e > max_err) max_err = e, worst = i;
        if (bad < 0 && !(e <= e_max)) bad = i;
    }
    double nmse = sw > 0 ? se / sw : INFINITY;
    if (bad < 0 && nmse <= nmse_max) return true;
    int64_t j = bad >= 0 ? bad : worst;
    snprintf(msg, n_msg, "%s: NMSE %.3g (bound %.3g), max-abs %.4g (bound %.4g); %s element %lld (row %lld, col %lld): gpu %.9g ref %.9g",
             what, nmse, nmse_max, max_err, e_max, bad >= 0 ? "first bad" : "worst", (long long)j, (long long)(j / cols),
             (long long)(j % cols), got[j], want[j]);
    return false;
}

/* got (n) bf16 against want (n): every |got - want| <= ulp_bf16(|want| + e32) / 2 + e32. */
static bool check_bf16(const char *what, const uint16_t *got, const double *want, int64_t n, int64_t cols, double e32, char *msg,
                       size_t n_msg) {
    double se = 0, sw = 0, max_ratio = 0;
    int64_t bad = -1, worst = 0;
    for (int64_t i = 0; i < n; i++) {
        double g = kiln_bf16_to_f32(got[i]);
        double e = isfinite(g) ? fabs(g - want[i]) : INFINITY;
        double bound = 0.5 * ulp_bf16(fabs(want[i]) + e32) + e32;
        se += e * e, sw += want[i] * want[i];
        if (e / bound > max_ratio || i == 0) max_ratio = e / bound, worst = i;
        if (bad < 0 && !(e <= bound)) bad = i;
    }
    if (bad < 0) return true;
    double nmse = sw > 0 ? se / sw : INFINITY;
    const int64_t j = bad;
    const double gj = kiln_bf16_to_f32(got[j]), half_ulp = 0.5 * ulp_bf16(fabs(want[j]) + e32);
    snprintf(msg, n_msg, "%s: NMSE %.3g, worst error %.3g x its bound (element %lld); first bad element %lld (row %lld, col %lld): "
                         "gpu %.9g (0x%04x) ref %.9g, error %.3g > bound %.3g (half a bf16 ulp %.3g + e32 %.3g)",
             what, nmse, max_ratio, (long long)worst, (long long)j, (long long)(j / cols), (long long)(j % cols), gj, got[j], want[j],
             fabs(gj - want[j]), half_ulp + e32, half_ulp, e32);
    return false;
}

/* ---------------------------------------------------------------- one shape, every case */

#define TRY(cond, ...)                              \
    do {                                            \
        if (!(cond)) {                              \
            snprintf(msg, n_msg, __VA_ARGS__);      \
            return false;                           \
        }                                           \
    } while (0)

/* Waits for the launch st and downloads bytes of d into h. */
static kiln_status finish(kiln_status st, void *h, const void *d, size_t bytes) {
    if (st == KILN_OK) st = kiln_cuda_sync();
    if (st == KILN_OK) st = kiln_cuda_download(h, d, bytes);
    return st;
}

/* init (n) = uniform [-1, 1) * scale (f32, never zero) and want (n) = init + prod. */
static void random_init(float *init, double *want, const double *prod, int64_t n, double scale, unsigned long long *rng) {
    for (int64_t i = 0; i < n; i++) {
        float v = test_rng_f32(rng);
        init[i] = (v != 0.0f ? v : 0.5f) * (float)scale;
        want[i] = (double)init[i] + prod[i];
    }
}

static bool linear_case(kiln_cuda_blas *b, int64_t N, int64_t I, int64_t O, bool misalign, unsigned long long *rng, char *msg,
                        size_t n_msg) {
    const int64_t nx = N * I, nw = O * I, ny = N * O;
    const int64_t nmax = nx > nw ? (nx > ny ? nx : ny) : (nw > ny ? nw : ny);
    const size_t ho = misalign ? 2 : 0, fo = misalign ? 4 : 0; /* byte offsets of bf16 and f32 pointers */
    char shape[96], what[192];
    snprintf(shape, sizeof shape, "(N %lld, I %lld, O %lld%s)", (long long)N, (long long)I, (long long)O,
             misalign ? ", misaligned pointers" : "");

    uint16_t *hx = host((size_t)nx * 2), *hw = host((size_t)nw * 2), *hdy = host((size_t)ny * 2), *gbf = host((size_t)nmax * 2);
    float *fx = host((size_t)nx * 4), *fw = host((size_t)nw * 4), *fdy = host((size_t)ny * 4);
    float *g32 = host((size_t)nmax * 4), *init = host((size_t)nmax * 4);
    double *ry = host((size_t)ny * 8), *rdx = host((size_t)nx * 8), *rdW = host((size_t)nw * 8), *want = host((size_t)nmax * 8);
    random_bf16(hx, fx, nx, rng), random_bf16(hw, fw, nw, rng), random_bf16(hdy, fdy, ny, rng);
    ref_forward(ry, fx, fw, N, I, O);
    ref_dx(rdx, fdy, fw, N, I, O);
    ref_dW(rdW, fdy, fx, N, I, O);
    /* bounds per reduction length: I for y, O for dx, N for dW */
    const double sy = rms(ry, ny), sdx = rms(rdx, nx), sdW = rms(rdW, nw);
    const double by = nmse_bound(I), bdx = nmse_bound(O), bdW = nmse_bound(N);
    const double ey = 10 * sqrt(by) * sy, edx = 10 * sqrt(bdx) * sdx, edW = 10 * sqrt(bdW) * sdW;

    kiln_bf16_t *dx_in = dev_at((size_t)nx * 2, ho), *dW_in = dev_at((size_t)nw * 2, ho), *ddy = dev_at((size_t)ny * 2, ho);
    float *y32 = dev_at((size_t)ny * 4, fo), *dx32 = dev_at((size_t)nx * 4, fo), *dW32 = dev_at((size_t)nw * 4, fo);
    kiln_bf16_t *ybf = dev_at((size_t)ny * 2, ho), *dxbf = dev_at((size_t)nx * 2, ho);
    TRY(dx_in && dW_in && ddy && y32 && dx32 && dW32 && ybf && dxbf, "%s: device allocation failed: %s", shape, kiln_last_error());
    TRY(kiln_cuda_upload(dx_in, hx, (size_t)nx * 2) == KILN_OK && kiln_cuda_upload(dW_in, hw, (size_t)nw * 2) == KILN_OK &&
            kiln_cuda_upload(ddy, hdy, (size_t)ny * 2) == KILN_OK,
        "%s: upload failed: %s", shape, kiln_last_error());
    kiln_status st;

    /* forward, y f32 overwritten */
    snprintf(what, sizeof what, "forward y f32 = x W^T %s", shape);
    TRY(poison(y32, (size_t)ny * 4) == KILN_OK, "%s: poison: %s", what, kiln_last_error());
    st = finish(kiln_cuda_linear_forward_train(b, y32, true, false, dx_in, dW_in, N, I, O, NULL), g32, y32, (size_t)ny * 4);
    TRY(st == KILN_OK, "%s: %s", what, kiln_last_error());
    if (!check_f32(what, g32, ry, ny, O, by, ey, msg, n_msg)) return false;

    /* forward, y f32 += x W^T */
    snprintf(what, sizeof what, "forward y f32 += x W^T %s", shape);
    random_init(init, want, ry, ny, sy, rng);
    TRY(kiln_cuda_upload(y32, init, (size_t)ny * 4) == KILN_OK, "%s: upload: %s", what, kiln_last_error());
    st = finish(kiln_cuda_linear_forward_train(b, y32, true, true, dx_in, dW_in, N, I, O, NULL), g32, y32, (size_t)ny * 4);
    TRY(st == KILN_OK, "%s: %s", what, kiln_last_error());
    if (!check_f32(what, g32, want, ny, O, by, ey, msg, n_msg)) return false;

    /* forward, y bf16 */
    snprintf(what, sizeof what, "forward y bf16 = x W^T %s", shape);
    TRY(poison(ybf, (size_t)ny * 2) == KILN_OK, "%s: poison: %s", what, kiln_last_error());
    st = finish(kiln_cuda_linear_forward_train(b, ybf, false, false, dx_in, dW_in, N, I, O, NULL), gbf, ybf, (size_t)ny * 2);
    TRY(st == KILN_OK, "%s: %s", what, kiln_last_error());
    if (!check_bf16(what, gbf, ry, ny, O, ey, msg, n_msg)) return false;

    /* backward, dx f32 overwritten and dW += in one call */
    snprintf(what, sizeof what, "backward dx f32 = dy W (with dW) %s", shape);
    TRY(poison(dx32, (size_t)nx * 4) == KILN_OK, "%s: poison: %s", what, kiln_last_error());
    random_init(init, want, rdW, nw, sdW, rng); /* want = dW0 + dy^T x */
    TRY(kiln_cuda_upload(dW32, init, (size_t)nw * 4) == KILN_OK, "%s: upload: %s", what, kiln_last_error());
    st = finish(kiln_cuda_linear_backward(b, dx32, true, false, dW32, ddy, dx_in, dW_in, N, I, O, NULL), g32, dx32, (size_t)nx * 4);
    TRY(st == KILN_OK, "%s: %s", what, kiln_last_error());
    if (!check_f32(what, g32, rdx, nx, I, bdx, edx, msg, n_msg)) return false;
    snprintf(what, sizeof what, "backward dW f32 += dy^T x (with dx f32) %s", shape);
    TRY(kiln_cuda_download(g32, dW32, (size_t)nw * 4) == KILN_OK, "%s: download: %s", what, kiln_last_error());
    if (!check_f32(what, g32, want, nw, I, bdW, edW, msg, n_msg)) return false;

    /* backward, dx f32 += dy W, dW skipped */
    snprintf(what, sizeof what, "backward dx f32 += dy W (dW NULL) %s", shape);
    random_init(init, want, rdx, nx, sdx, rng);
    TRY(kiln_cuda_upload(dx32, init, (size_t)nx * 4) == KILN_OK, "%s: upload: %s", what, kiln_last_error());
    st = finish(kiln_cuda_linear_backward(b, dx32, true, true, NULL, ddy, dx_in, dW_in, N, I, O, NULL), g32, dx32, (size_t)nx * 4);
    TRY(st == KILN_OK, "%s: %s", what, kiln_last_error());
    if (!check_f32(what, g32, want, nx, I, bdx, edx, msg, n_msg)) return false;

    /* backward, dx bf16, dW skipped */
    snprintf(what, sizeof what, "backward dx bf16 = dy W (dW NULL) %s", shape);
    TRY(poison(dxbf, (size_t)nx * 2) == KILN_OK, "%s: poison: %s", what, kiln_last_error());
    st = finish(kiln_cuda_linear_backward(b, dxbf, false, false, NULL, ddy, dx_in, dW_in, N, I, O, NULL), gbf, dxbf, (size_t)nx * 2);
    TRY(st == KILN_OK, "%s: %s", what, kiln_last_error());
    if (!check_bf16(what, gbf, rdx, nx, I, edx, msg, n_msg)) return false;

    /* backward, dW += dy^T x alone, dx skipped */
    snprintf(what, sizeof what, "backward dW f32 += dy^T x (dx NULL) %s", shape);
    random_init(init, want, rdW, nw, sdW, rng);
    TRY(kiln_cuda_upload(dW32, init, (size_t)nw * 4) == KILN_OK, "%s: upload: %s", what, kiln_last_error());
    st = finish(kiln_cuda_linear_backward(b, NULL, true, false, dW32, ddy, dx_in, dW_in, N, I, O, NULL), g32, dW32, (size_t)nw * 4);
    TRY(st == KILN_OK, "%s: %s", what, kiln_last_error());
    if (!check_f32(what, g32, want, nw, I, bdW, edW, msg, n_msg)) return false;
    return true;
}

static void test_linear_matches_reference(void) {
    release_all();
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    static const int64_t shapes[][4] = {
        /* N, I, O, misaligned pointers */
        {37, 64, 48, 0}, {37, 13, 11, 1}, {256, 768, 1280, 0}, {1000, 2048, 768, 0}, {64, 768, 32000, 0},
    };
    kiln_cuda_blas *b = NULL;
    CHECK(kiln_cuda_blas_new(&b) == KILN_OK, "%s", kiln_last_error());
    unsigned long long rng = 808;
    char msg[1024] = "";
    bool ok = true;
    for (int si = 0; si < COUNT(shapes) && ok; si++) {
        ok = linear_case(b, shapes[si][0], shapes[si][1], shapes[si][2], shapes[si][3] != 0, &rng, msg, sizeof msg);
        release_all();
    }
    /* the cached plans again, now hits: the first shape once more */
    if (ok) ok = linear_case(b, 37, 64, 48, false, &rng, msg, sizeof msg);
    release_all();
    kiln_cuda_blas_free(b);
    kiln_cuda_blas_free(NULL);
    CHECK(ok, "%s", msg);
}

/* Arguments the launchers must refuse (KILN_ERR_INVALID) before launching anything, and a backward with both
 * outputs NULL, which does nothing. */
static void test_linear_rejects(void) {
    release_all();
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    CHECK(kiln_cuda_blas_bytes() >= ((size_t)1 << 20), "workspace of %zu bytes", kiln_cuda_blas_bytes());
    kiln_cuda_blas *b = NULL;
    CHECK(kiln_cuda_blas_new(&b) == KILN_OK, "%s", kiln_last_error());
    uint8_t *buf = dev_at(1 << 20, 0);
    kiln_status s[10];
    for (int i = 0; i < COUNT(s); i++) s[i] = KILN_OK;
    if (buf) {
        kiln_bf16_t *x = (kiln_bf16_t *)buf, *W = (kiln_bf16_t *)(buf + 65536), *dy = (kiln_bf16_t *)(buf + 131072);
        float *y = (float *)(buf + 262144);
        s[0] = kiln_cuda_linear_forward_train(b, y, false, true, x, W, 16, 32, 32, NULL); /* accumulate into bf16 */
        s[1] = kiln_cuda_linear_forward_train(b, y, true, false, x, W, 0, 32, 32, NULL);  /* N = 0 */
        s[2] = kiln_cuda_linear_forward_train(b, y, true, false, x, W, 16, -1, 32, NULL); /* I < 0 */
        s[3] = kiln_cuda_linear_forward_train(NULL, y, true, false, x, W, 16, 32, 32, NULL);
        s[4] = kiln_cuda_linear_forward_train(b, (uint8_t *)y + 2, true, false, x, W, 16, 32, 32, NULL); /* f32 y 2-byte aligned */
        s[5] = kiln_cuda_linear_forward_train(b, y, true, false, (const kiln_bf16_t *)(buf + 1), W, 16, 32, 32, NULL); /* odd x */
        s[6] = kiln_cuda_linear_backward(b, y, false, true, NULL, dy, x, W, 16, 32, 32, NULL); /* accumulate into bf16 dx */
        s[7] = kiln_cuda_linear_backward(b, y, true, false, y + 4096, NULL, x, W, 16, 32, 32, NULL); /* no dy */
        s[8] = kiln_cuda_linear_backward(b, NULL, true, false, y, dy, NULL, W, 16, 32, 32, NULL);   /* dW without x */
        s[9] = kiln_cuda_linear_backward(b, NULL, true, false, NULL, dy, x, W, 16, 32, 32, NULL);  /* nothing to do */
    }
    kiln_status sync = kiln_cuda_sync();
    release_all();
    kiln_cuda_blas_free(b);
    CHECK(buf != NULL, "%s", kiln_last_error());
    for (int i = 0; i < 9; i++) CHECK(s[i] == KILN_ERR_INVALID, "refused call %d: status %d (want %d)", i, s[i], KILN_ERR_INVALID);
    CHECK(s[9] == KILN_OK, "backward with dx and dW NULL: status %d: %s", s[9], kiln_last_error());
    CHECK(sync == KILN_OK, "%s", kiln_last_error());
}

#else

static void test_linear_matches_reference(void) { SKIP("kiln built without CUDA"); }
static void test_linear_rejects(void) { SKIP("kiln built without CUDA"); }

#endif

int main(void) {
    RUN(test_linear_matches_reference);
    RUN(test_linear_rejects);
    TEST_EXIT();
}
