/* test_cuda_gemm.c: the prefill matmul (src/cuda/gemm.cu) against a double-precision reference on the host.
 * For every weight type the CUDA backend computes, random blocks are dequantized by the scalar CPU oracle
 * (quants.h to_float; for Q5_1, Q2_K, Q3_K, IQ4_NL and IQ4_XS test_blocks_ggml.h's, written from GGML's layouts) and
 *   - kiln_cuda_dequantize_bf16 must equal the oracle's f32 rounded to nearest even to bf16, bit for bit;
 *   - kiln_cuda_gemm's y (T, O) = x (T, I) W^T, and y += x W^T with add, must match sum_i x[t,i] * W[o,i] in double
 *     within the bound below, on shapes (O, I, T) = (96, 256, 9), (1000, 2304, 33), (2048, 1024, 512), plus an odd
 *     (37, 13, 11) with misaligned weight and output pointers for the float types.
 * Bound: the GPU rounds both operands to bf16 (8 significant bits, relative error at most 2^-9 each, about
 * 2^-9/sqrt(3) RMS), so each product carries a relative error of RMS ~1.6e-3 and, with random-sign terms, the
 * sum's NMSE is about its square, ~3e-6; fp32 accumulation over at most 2304 terms adds ~1e-12. NMSE < 2e-4
 * leaves a 60x margin; max-abs < 3% of max |ref| is ~15x the largest of a million ~5-sigma errors. Outputs are
 * poisoned with NaN bytes first, so an unwritten output fails. Skips without CUDA or without a GPU. */
#include "cuda/cuda.h"
#include "cuda/kernels.h"
#include "quants.h"
#include "test.h"
#include "test_blocks.h"
#include "test_blocks_ggml.h"

#include <stdint.h>

#ifdef KILN_CUDA

static const kiln_type gemm_types[] = {KILN_TYPE_F32,  KILN_TYPE_F16,  KILN_TYPE_BF16, KILN_TYPE_Q4_0,  KILN_TYPE_Q4_1,
                                       KILN_TYPE_Q5_0, KILN_TYPE_Q8_0, KILN_TYPE_Q4_K, KILN_TYPE_Q5_K,  KILN_TYPE_Q6_K,
                                       KILN_TYPE_Q5_1, KILN_TYPE_Q2_K, KILN_TYPE_Q3_K, KILN_TYPE_IQ4_NL, KILN_TYPE_IQ4_XS};
#define N_TYPES (sizeof gemm_types / sizeof gemm_types[0])

static bool is_float_type(kiln_type t) { return t == KILN_TYPE_F32 || t == KILN_TYPE_F16 || t == KILN_TYPE_BF16; }

/* Random weight (rows, cols) of type t: random bytes in the quant payloads, finite f16 scales of magnitude <= 0.01
 * (as tests/test_cuda.c makes them), uniform [-1, 1) values for the float types. Returns the bytes (malloc). */
static uint8_t *random_weight(kiln_type t, int64_t rows, int64_t cols, unsigned long long *seed) {
    uint8_t *buf = malloc(kiln_type_row_bytes(t, rows * cols));
    if (buf) test_random_blocks(t, buf, rows * cols, 1.0f, 0.0f, seed), test_ggml_fix_scales(t, buf, rows * cols, 0.01f, 0.0f, seed);
    return buf;
}

/* Uploads `bytes` of h to a fresh device buffer at byte offset `off` (to test misaligned pointers); *base is what
 * to free. */
static void *upload_at(const void *h, size_t bytes, size_t off, void **base) {
    *base = NULL;
    if (kiln_cuda_alloc(base, bytes + off) != KILN_OK) return NULL;
    uint8_t *d = (uint8_t *)*base + off;
    if (kiln_cuda_upload(d, h, bytes) != KILN_OK) return NULL;
    return d;
}

/* ---------------------------------------------------------------- dequantization to bf16, bit for bit */

/* One weight: GPU bf16 vs kiln_f32_to_bf16 of the CPU oracle. Returns false with msg set on a mismatch. */
static bool dequant_case(kiln_type t, int64_t rows, int64_t cols, size_t misalign, unsigned long long *seed, char *msg, size_t n_msg) {
    int64_t n = rows * cols;
    size_t wbytes = kiln_type_row_bytes(t, cols) * (size_t)rows;
    uint8_t *hw = random_weight(t, rows, cols, seed);
    float *wf = malloc((size_t)n * 4);
    uint16_t *got = malloc((size_t)n * 2);
    void *wbase = NULL, *dout = NULL;
    bool ok = false;
    snprintf(msg, n_msg, "%s (%lld x %lld, weight offset %zu): setup failed: %s", kiln_type_name(t), (long long)rows,
             (long long)cols, misalign, kiln_last_error());
    if (!hw || !wf || !got) goto done;
    test_ggml_to_float(t, hw, wf, n);
    const void *dw = upload_at(hw, wbytes, misalign, &wbase);
    if (!dw || kiln_cuda_alloc(&dout, (size_t)n * 2) != KILN_OK) goto done;
    memset(got, 0xFF, (size_t)n * 2);
    if (kiln_cuda_upload(dout, got, (size_t)n * 2) != KILN_OK) goto done; /* poison: 0xFFFF is a NaN */
    kiln_cuda_wt W = {t, rows, cols, kiln_type_row_bytes(t, cols), dw};
    kiln_status st = kiln_cuda_dequantize_bf16(&W, dout, NULL);
    if (st == KILN_OK) st = kiln_cuda_sync();
    if (st == KILN_OK) st = kiln_cuda_download(got, dout, (size_t)n * 2);
    if (st != KILN_OK) {
        snprintf(msg, n_msg, "%s (%lld x %lld): kiln_cuda_dequantize_bf16: %s", kiln_type_name(t), (long long)rows, (long long)cols,
                 kiln_last_error());
        goto done;
    }
    ok = true;
    for (int64_t i = 0; i < n; i++) {
        uint16_t want = kiln_f32_to_bf16(wf[i]);
        if (got[i] != want) {
            snprintf(msg, n_msg, "%s (%lld x %lld, weight offset %zu): element %lld (row %lld, col %lld): cpu f32 %.9g -> bf16 0x%04x, gpu 0x%04x (%.9g)",
                     kiln_type_name(t), (long long)rows, (long long)cols, misalign, (long long)i, (long long)(i / cols),
                     (long long)(i % cols), wf[i], want, got[i], kiln_bf16_to_f32(got[i]));
            ok = false;
            break;
        }
    }
done:
    kiln_cuda_free(wbase), kiln_cuda_free(dout);
    free(hw), free(wf), free(got);
    return ok;
}

static void test_dequantize_bf16_bit_exact(void) {
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    unsigned long long seed = 11;
    char msg[512];
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        kiln_type t = gemm_types[ti];
        CHECK(dequant_case(t, 1000, 2304, 0, &seed, msg, sizeof msg), "%s", msg);
        if (is_float_type(t)) {
            /* 481 elements: not a multiple of 8 (the vector path's tail), then a pointer off 16-byte alignment */
            CHECK(dequant_case(t, 37, 13, 0, &seed, msg, sizeof msg), "%s", msg);
            CHECK(dequant_case(t, 37, 13, kiln_type_block_bytes(t), &seed, msg, sizeof msg), "%s", msg);
        }
    }
}

/* ---------------------------------------------------------------- the matmul against a double reference */

/* ref (T, O) = x (T, I) wf^T in double. Four accumulators break the add chain (the largest case is 1G products). */
static void reference(double *ref, const float *x, const float *wf, int64_t rows, int64_t cols, int64_t T) {
    for (int64_t t = 0; t < T; t++) {
        const float *xr = x + t * cols;
        for (int64_t o = 0; o < rows; o++) {
            const float *wr = wf + o * cols;
            double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
            int64_t i = 0;
            for (; i + 4 <= cols; i += 4) {
                s0 += (double)xr[i] * wr[i];
                s1 += (double)xr[i + 1] * wr[i + 1];
                s2 += (double)xr[i + 2] * wr[i + 2];
                s3 += (double)xr[i + 3] * wr[i + 3];
            }
            for (; i < cols; i++) s0 += (double)xr[i] * wr[i];
            ref[t * rows + o] = (s0 + s1) + (s2 + s3);
        }
    }
}

/* y against want (both n): NMSE < 2e-4 and every |y - want| < 3% of max |want| (see the header). */
static bool compare(const float *y, const double *want, int64_t n, int64_t rows, const char *what, char *msg, size_t n_msg) {
    double se = 0, sw = 0, max_err = 0, max_ref = 0;
    for (int64_t i = 0; i < n; i++) max_ref = fmax(max_ref, fabs(want[i]));
    int64_t first_bad = -1;
    for (int64_t i = 0; i < n; i++) {
        double e = (double)y[i] - want[i];
        se += e * e, sw += want[i] * want[i];
        if (!isfinite(y[i]) || !(fabs(e) < 0.03 * max_ref)) {
            if (first_bad < 0) first_bad = i;
            max_err = isfinite(y[i]) ? fmax(max_err, fabs(e)) : INFINITY;
        } else
            max_err = fmax(max_err, fabs(e));
    }
    double nmse = sw > 0 ? se / sw : INFINITY;
    if (first_bad < 0 && nmse < 2e-4) return true;
    int64_t b = first_bad >= 0 ? first_bad : 0;
    snprintf(msg, n_msg, "%s: NMSE %.3g (bound 2e-4), max-abs %.4g = %.3g%% of max |ref| %.4g (bound 3%%); first bad index %lld "
                         "(t %lld, o %lld): gpu %.9g ref %.9g",
             what, nmse, max_err, 100 * max_err / max_ref, max_ref, (long long)first_bad, (long long)(b / rows),
             (long long)(b % rows), y[b], want[b]);
    return false;
}

/* One (type, O, I, T): add = false on a poisoned y, then add = true on random y0. misalign shifts the weight
 * (one element) and y (one float) off their allocations' alignment. */
static bool gemm_case(kiln_type t, int64_t rows, int64_t cols, int64_t T, bool misalign, bool small, kiln_cuda_gemm_ws *ws,
                      unsigned long long *seed, char *msg, size_t n_msg) {
    int64_t nw = rows * cols, nx = T * cols, ny = T * rows;
    size_t wbytes = kiln_type_row_bytes(t, cols) * (size_t)rows;
    uint8_t *hw = random_weight(t, rows, cols, seed);
    float *wf = malloc((size_t)nw * 4), *x = malloc((size_t)nx * 4), *y = malloc((size_t)ny * 4), *y0 = malloc((size_t)ny * 4);
    double *ref = malloc((size_t)ny * sizeof(double)), *want = malloc((size_t)ny * sizeof(double));
    void *wbase = NULL, *xbase = NULL, *ybase = NULL, *dxp = NULL;
    bool ok = false;
    char what[160];
    snprintf(what, sizeof what, "%s%s y (T %lld, O %lld) = x (T, I %lld) W^T%s", small ? "gemm_small: " : "", kiln_type_name(t),
             (long long)T, (long long)rows, (long long)cols, misalign ? " (misaligned W and y)" : "");
    snprintf(msg, n_msg, "%s: setup failed: %s", what, kiln_last_error());
    if (!hw || !wf || !x || !y || !y0 || !ref || !want) goto done;
    test_ggml_to_float(t, hw, wf, nw);
    for (int64_t i = 0; i < nx; i++) x[i] = test_rng_f32(seed);
    reference(ref, x, wf, rows, cols, T);

    const void *dw = upload_at(hw, wbytes, misalign ? kiln_type_block_bytes(t) : 0, &wbase);
    const float *dx = upload_at(x, (size_t)nx * 4, 0, &xbase);
    memset(y, 0xFF, (size_t)ny * 4); /* poison: NaN */
    float *dy = upload_at(y, (size_t)ny * 4, misalign ? 4 : 0, &ybase);
    if (!dw || !dx || !dy) goto done;
    kiln_cuda_wt W = {t, rows, cols, kiln_type_row_bytes(t, cols), dw};

    for (int add = 0; add <= 1; add++) {
        double rms = 0;
        for (int64_t i = 0; i < ny; i++) rms += ref[i] * ref[i];
        rms = sqrt(rms / (double)ny);
        for (int64_t i = 0; i < ny; i++) {
            /* the residual: of the product's own scale, so a dropped or doubled add shows in the NMSE */
            y0[i] = add ? test_rng_f32(seed) * (float)rms : 0.0f;
            want[i] = (double)y0[i] + ref[i];
        }
        if (add && kiln_cuda_upload(dy, y0, (size_t)ny * 4) != KILN_OK) goto done;
        kiln_status st = KILN_OK;
        if (small) { /* gemm_small takes matvec_prepare's form of x */
            if (!dxp) st = kiln_cuda_alloc(&dxp, kiln_cuda_matvec_prep_bytes(T, cols));
            if (st == KILN_OK) st = kiln_cuda_matvec_prepare(dxp, dx, T, cols, NULL);
            if (st == KILN_OK) st = kiln_cuda_gemm_small(dy, dxp, &W, T, add, ws, NULL);
        } else {
            st = kiln_cuda_gemm(dy, dx, &W, T, add, ws, NULL);
        }
        if (st == KILN_OK) st = kiln_cuda_sync();
        if (st == KILN_OK) st = kiln_cuda_download(y, dy, (size_t)ny * 4);
        char what_add[200];
        snprintf(what_add, sizeof what_add, "%s, add %s", what, add ? "true" : "false");
        if (st != KILN_OK) {
            snprintf(msg, n_msg, "%s: %s", what_add, kiln_last_error());
            goto done;
        }
        if (!compare(y, want, ny, rows, what_add, msg, n_msg)) goto done;
    }
    ok = true;
done:
    kiln_cuda_free(wbase), kiln_cuda_free(xbase), kiln_cuda_free(ybase), kiln_cuda_free(dxp);
    free(hw), free(wf), free(x), free(y), free(y0), free(ref), free(want);
    return ok;
}

static const int64_t gemm_shapes[][3] = {{96, 256, 9}, {1000, 2304, 33}, {2048, 1024, 512}}; /* O, I, T */

static void test_gemm_matches_reference(void) {
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    const size_t max_w = 1000 * 2304, max_x = 512 * 1024;
    kiln_cuda_gemm_ws ws;
    CHECK(kiln_cuda_gemm_ws_new(&ws, max_w, max_x) == KILN_OK, "%s", kiln_last_error());
    /* the engine sizes its VRAM check with ws_bytes: it must be what ws_new took */
    size_t took = ws.w_bytes + ws.x_bytes + ws.lt_ws_bytes + ws.part_bytes, said = kiln_cuda_gemm_ws_bytes(max_w, max_x);
    bool bytes_ok = took == said && ws.w_bytes >= 2 * max_w && ws.x_bytes >= 2 * max_x;
    unsigned long long seed = 23;
    char msg[640] = "";
    bool ok = true;
    for (size_t ti = 0; ti < N_TYPES && ok && bytes_ok; ti++) {
        kiln_type t = gemm_types[ti];
        for (size_t si = 0; si < sizeof gemm_shapes / sizeof gemm_shapes[0] && ok; si++)
            ok = gemm_case(t, gemm_shapes[si][0], gemm_shapes[si][1], gemm_shapes[si][2], false, false, &ws, &seed, msg, sizeof msg);
        if (ok && is_float_type(t)) ok = gemm_case(t, 37, 13, 11, true, false, &ws, &seed, msg, sizeof msg);
    }
    kiln_cuda_gemm_ws_free(&ws);
    kiln_cuda_gemm_ws_free(&ws); /* a zeroed ws is accepted */
    CHECK(bytes_ok, "ws_new took %zu bytes, ws_bytes says %zu", took, said);
    CHECK(ok, "%s", msg);
}

/* kiln_cuda_gemm_small (a few rows on the int8 tensor cores from the blocks) on every type it takes: against the
 * double reference of the float x within the bound above (its int8 rounding of x, d = amax / 127, has a relative
 * RMS error of ~4e-3 for these uniform inputs, an NMSE of ~2e-5), on shapes (O, I, T) that take one split and
 * several (O 96: 3 CTAs; I 2816: 11 super-blocks; O 200, I 4096: 16 over 2 splits), row counts not a multiple of 32
 * (200, 1000), both tile widths (T 9, 16: 16 tokens; 17, 24, 32: 32), with add; then what it refuses. */
static const int64_t small_shapes[][3] = {{96, 2816, 9}, {200, 256, 16}, {1000, 2304, 17}, {64, 512, 32}, {4096, 1024, 24},
                                          {200, 4096, 32}};
static const kiln_type small_types[] = {KILN_TYPE_Q4_0, KILN_TYPE_Q4_1, KILN_TYPE_Q5_0, KILN_TYPE_Q8_0,
                                        KILN_TYPE_Q4_K, KILN_TYPE_Q5_K, KILN_TYPE_Q6_K};

static void test_gemm_small_matches_reference(void) {
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    const size_t max_w = 4096 * 2816, max_x = 32 * 4096;
    kiln_cuda_gemm_ws ws;
    CHECK(kiln_cuda_gemm_ws_new(&ws, max_w, max_x) == KILN_OK, "%s", kiln_last_error());
    unsigned long long seed = 29;
    char msg[640] = "";
    bool ok = true;
    int n = 0;
    for (size_t ti = 0; ti < sizeof small_types / sizeof *small_types && ok; ti++) {
        kiln_type t = small_types[ti];
        for (size_t si = 0; si < sizeof small_shapes / sizeof small_shapes[0] && ok; si++, n++) {
            const kiln_cuda_wt W = {t, small_shapes[si][0], small_shapes[si][1], kiln_type_row_bytes(t, small_shapes[si][1]), NULL};
            ok = kiln_cuda_gemm_small_takes(&W, small_shapes[si][2]);
            if (!ok) snprintf(msg, sizeof msg, "%s %lld x %lld at T %lld: not taken", kiln_type_name(t), (long long)W.rows,
                              (long long)W.cols, (long long)small_shapes[si][2]);
            else ok = gemm_case(t, small_shapes[si][0], small_shapes[si][1], small_shapes[si][2], false, true, &ws, &seed, msg, sizeof msg);
        }
    }
    CHECK(ok, "%s", msg);
    CHECK(n == 7 * 6, "%d cases", n);
    /* refused: a float weight, a type without a decoder, columns not a multiple of 256, T outside 1..32 */
    const kiln_type others[] = {KILN_TYPE_F16, KILN_TYPE_Q5_1, KILN_TYPE_Q2_K, KILN_TYPE_Q3_K, KILN_TYPE_IQ4_NL, KILN_TYPE_IQ4_XS};
    for (size_t i = 0; i < sizeof others / sizeof *others; i++) {
        const kiln_cuda_wt o = {others[i], 64, 256, kiln_type_row_bytes(others[i], 256), NULL};
        CHECK(!kiln_cuda_gemm_small_takes(&o, 16), "%s taken", kiln_type_name(others[i]));
    }
    const kiln_cuda_wt q4k = {KILN_TYPE_Q4_K, 64, 256, kiln_type_row_bytes(KILN_TYPE_Q4_K, 256), NULL},
                       q8 = {KILN_TYPE_Q8_0, 64, 96, kiln_type_row_bytes(KILN_TYPE_Q8_0, 96), NULL};
    CHECK(!kiln_cuda_gemm_small_takes(&q8, 16) && !kiln_cuda_gemm_small_takes(&q4k, 33) && !kiln_cuda_gemm_small_takes(&q4k, 0) &&
          kiln_cuda_gemm_small_takes(&q4k, 1));
    CHECK(kiln_cuda_gemm_small(NULL, NULL, &q8, 16, false, &ws, NULL) == KILN_ERR_UNSUPPORTED);
    CHECK(kiln_cuda_gemm_small(NULL, NULL, &q4k, 16, false, &ws, NULL) == KILN_ERR_INVALID); /* no input, no weight */
    kiln_cuda_gemm_ws_free(&ws);
}

/* Arguments gemm must refuse, before touching the device. */
static void test_gemm_rejects(void) {
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    kiln_cuda_gemm_ws ws;
    CHECK(kiln_cuda_gemm_ws_new(&ws, 64 * 64, 16 * 64) == KILN_OK, "%s", kiln_last_error());
    void *buf = NULL;
    kiln_status alloc = kiln_cuda_alloc(&buf, 1 << 20);
    kiln_status unsupported = KILN_OK, not_blocks = KILN_OK, too_big = KILN_OK, too_long = KILN_OK, no_tokens = KILN_OK;
    if (alloc == KILN_OK) {
        float *y = buf, *x = (float *)buf + 4096;
        kiln_cuda_wt q8_1 = {KILN_TYPE_Q8_1, 64, 64, kiln_type_row_bytes(KILN_TYPE_Q8_1, 64), buf}; /* activations only */
        kiln_cuda_wt odd = {KILN_TYPE_Q4_0, 64, 48, 48 / 32 * 18, buf};
        kiln_cuda_wt big = {KILN_TYPE_Q8_0, 65, 64, kiln_type_row_bytes(KILN_TYPE_Q8_0, 64), buf};
        kiln_cuda_wt fine = {KILN_TYPE_Q8_0, 64, 64, kiln_type_row_bytes(KILN_TYPE_Q8_0, 64), buf};
        unsupported = kiln_cuda_gemm(y, x, &q8_1, 16, false, &ws, NULL);
        not_blocks = kiln_cuda_gemm(y, x, &odd, 16, false, &ws, NULL);
        too_big = kiln_cuda_gemm(y, x, &big, 16, false, &ws, NULL);
        too_long = kiln_cuda_gemm(y, x, &fine, 17, false, &ws, NULL);
        no_tokens = kiln_cuda_gemm(y, x, &fine, 0, false, &ws, NULL);
    }
    kiln_cuda_free(buf);
    kiln_cuda_gemm_ws_free(&ws);
    CHECK(alloc == KILN_OK, "%s", kiln_last_error());
    CHECK(unsupported == KILN_ERR_UNSUPPORTED, "q8_1 weight: status %d", unsupported);
    CHECK(not_blocks == KILN_ERR_INVALID, "q4_0 with 48 cols: status %d", not_blocks);
    CHECK(too_big == KILN_ERR_INVALID, "65 x 64 weight in a 64*64 workspace: status %d", too_big);
    CHECK(too_long == KILN_ERR_INVALID, "17 x 64 input in a 16*64 workspace: status %d", too_long);
    CHECK(no_tokens == KILN_ERR_INVALID, "T = 0: status %d", no_tokens);
}

#else

static void test_dequantize_bf16_bit_exact(void) { SKIP("kiln built without CUDA"); }
static void test_gemm_matches_reference(void) { SKIP("kiln built without CUDA"); }
static void test_gemm_small_matches_reference(void) { SKIP("kiln built without CUDA"); }
static void test_gemm_rejects(void) { SKIP("kiln built without CUDA"); }

#endif

int main(void) {
    RUN(test_dequantize_bf16_bit_exact);
    RUN(test_gemm_matches_reference);
    RUN(test_gemm_small_matches_reference);
    RUN(test_gemm_rejects);
    TEST_EXIT();
}
