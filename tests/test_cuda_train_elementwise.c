/* test_cuda_train_elementwise.c: src/cuda/train_elementwise.cu against the CPU training oracle (kiln_cpu_ops,
 * src/cpu/ops*.c) on fresh seeded random inputs (never zeros). Every GPU output is poisoned with 0xFF bytes (NaN as
 * f32 and as bf16) before a launch, so an element left unwritten fails; workspaces are poisoned too, so nothing
 * may rely on what they held. Bounds, per op (scale = max |reference| over the tensor; "bf16" below means, per
 * element, |gpu - ref| <= (2^-8 + 2^-20) |ref| + floor against the CPU's f32 value ref: rounding a GPU f32 value v
 * to bf16 (round to nearest even) moves it by at most half a bf16 ulp <= 2^-8 |v|, the 2^-20 covers v being a few
 * f32 ulps from ref, and the floor the absolute f32 differences that cancellation can make large relative to a
 * small result):
 *   embed_forward              bit-exact (a copy of the master rows; the CPU's F32 embed_forward)
 *   embed_backward (atomic)    per element |d| <= 2 k 2^-24 (|dtable0| + sum |dx|) over its k rows (each side's k
 *                              float adds), NMSE <= 1e-12; skipped count exact
 *   embed_backward_det         bit-identical over two runs, and bit-exact with the CPU (ops.c's embed_backward
 *                              adds each id's finite rows onto dtable in row order, as the GPU); skipped count exact
 *   rmsnorm_forward            x (after += y) bit-exact; rstd max-abs <= 1e-6 scale, NMSE <= 1e-11 (the double sum's
 *                              order); out bf16 with floor 0 (an ulp of rstd moves out by 2^-23 relative, in the 2^-20)
 *   rmsnorm_backward           dx and dw max-abs <= 1e-6 scale, NMSE <= 1e-11 (double sums' order); dx_bf
 *                              bit-equal to the GPU's own dx rounded to nearest even (kiln_f32_to_bf16); a second
 *                              run, and a third with dx_bf NULL, give dx and dw (and dx_bf) the same bits
 *   rope forward / backward    bf16 with floor 1e-6 scale (CUDA sincosf vs the host's cosf/sinf: ulps of the
 *                              inputs' magnitude, which cancellation can make large relative to a small result);
 *                              the forward reads bf16 (out of place and in place), the oracle its f32 values; v
 *                              bit-exact bf16(v) (in place: untouched)
 *   swiglu forward / backward  bf16 with floor 1e-6 scale (expf ulps; dgate's 1 + g (1 - sig) cancels near
 *                              g = -1.28); gu and dh are bf16, the oracle gets their f32 values
 *   to_bf16                    bit-exact with kiln_f32_to_bf16 (NaN: any NaN)
 * Skips without a GPU, or when kiln was built without CUDA. */
#include "cuda/cuda.h"
#include "test.h"

#ifdef KILN_CUDA
#include "test_cuda_util.h"
#include "cpu/ops.h"
#include "cuda/train_kernels.h"
#include "fp16.h"

#include <float.h>
#include <stdint.h>

/* A device copy of n bytes of h (NULL on failure). */
static void *dev_copy(const void *h, size_t bytes) {
    void *d = dev(bytes);
    if (d && kiln_cuda_upload(d, h, bytes) != KILN_OK) return NULL;
    return d;
}

static void fill(float *x, int64_t n, float amp, unsigned long long *rng) {
    for (int64_t i = 0; i < n; i++) {
        float v = test_rng_f32(rng) * amp;
        x[i] = v != 0.0f ? v : amp * 0.5f;
    }
}

static float bf(kiln_bf16 h) { return kiln_bf16_to_f32(h); }

/* ---------------------------------------------------------------- comparisons with a diagnostic */


/* Bit equality of n floats; otherwise msg names the first differing one (row and column of width C). */
static int same_bits(const char *what, const float *got, const float *ref, int64_t n, int64_t C, char *msg, size_t msg_n) {
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&got[i], &ref[i], 4)) {
            int64_t bad = 0;
            for (int64_t j = i; j < n; j++) bad += memcmp(&got[j], &ref[j], 4) != 0;
            snprintf(msg, msg_n, "%s: %lld of %lld differ, first at %lld (row %lld col %lld): gpu %.9g (0x%08x) ref %.9g (0x%08x)",
                     what, (long long)bad, (long long)n, (long long)i, (long long)(i / C), (long long)(i % C), got[i],
                     kiln_f32_bits(got[i]), ref[i], kiln_f32_bits(ref[i]));
            return 0;
        }
    return 1;
}

/* A bf16 output against the f32 reference: |gpu - ref| <= (2^-8 + 2^-20) |ref| + floor_rel * scale for every
 * element (a NaN anywhere fails); msg gives the count, the first and the worst offender (with bf16(ref), what an
 * exact kernel would give), and the NMSE against the f32 reference. */
static int within_bf16(const char *what, const kiln_bf16 *got, const float *ref, int64_t n, double floor_rel, int64_t C,
                       char *msg, size_t msg_n) {
    double scale = 0, num = 0, den = 0, worst_ratio = 0;
    for (int64_t i = 0; i < n; i++) scale = fabs(ref[i]) > scale ? fabs(ref[i]) : scale;
    const double floor_abs = floor_rel * scale;
    int64_t bad = 0, first = -1, worst = -1;
    for (int64_t i = 0; i < n; i++) {
        const double g = bf(got[i]), r = ref[i];
        const double e = fabs(g - r), bound = (ldexp(1.0, -8) + ldexp(1.0, -20)) * fabs(r) + floor_abs;
        const double de = isnan(g) ? INFINITY : g - r;
        num += de * de, den += (double)ref[i] * ref[i];
        if (!(e <= bound)) {
            bad++;
            if (first < 0) first = i;
            const double ratio = bound > 0 ? e / bound : INFINITY;
            if (!(ratio <= worst_ratio)) worst_ratio = ratio, worst = i;
        }
    }
    if (!bad) return 1;
    snprintf(msg, msg_n, "%s: %lld of %lld beyond (2^-8 + 2^-20) |ref| + %.3g (floor %.3g * scale %.3g); first at %lld (row %lld col %lld): "
             "gpu %.9g ref %.9g bf16(ref) %.9g; worst at %lld: gpu %.9g ref %.9g (%.3g x bound); nmse vs f32 ref %.3g",
             what, (long long)bad, (long long)n, floor_abs, floor_rel, scale, (long long)first, (long long)(first / C),
             (long long)(first % C), bf(got[first]), ref[first], bf(kiln_f32_to_bf16(ref[first])), (long long)worst,
             bf(got[worst]), ref[worst], worst_ratio, den > 0 ? num / den : num);
    return 0;
}

static kiln_pool *pool;
static kiln_ops_ctx cpu_ctx(void) { return (kiln_ops_ctx){.pool = pool}; } /* these ops use no scratch */

static const int64_t Ns[] = {1, 37, 512, 2048};

/* ---------------------------------------------------------------- embed forward */

static void test_embed_forward(void) {
    release_all();
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    static const int64_t Cs[] = {64, 768, 4096, 67}; /* 67: the scalar (non-float4) path */
    enum { V = 1000 };
    unsigned long long rng = 11;
    char msg[512], what[128];
    kiln_ops_ctx ctx = cpu_ctx();
    for (int ci = 0; ci < COUNT(Cs); ci++)
        for (int ni = 0; ni < COUNT(Ns); ni++) {
            const int64_t C = Cs[ci], N = Ns[ni];
            float *table = host((size_t)(V * C) * 4), *ref = host((size_t)(N * C) * 4), *got = host((size_t)(N * C) * 4);
            int32_t *ids = host((size_t)N * 4);
            fill(table, V * C, 2.0f, &rng);
            for (int64_t n = 0; n < N; n++) ids[n] = n == 0 ? V - 1 : n == 1 ? 0 : (int32_t)(test_rng_next(&rng) % V);
            kiln_tensor_view view = {.name = "token_embd", .type = KILN_TYPE_F32, .n_dims = 2, .ne = {C, V, 1, 1},
                                     .nb = {4, (size_t)C * 4, (size_t)(V * C) * 4, (size_t)(V * C) * 4},
                                     .nbytes = (size_t)(V * C) * 4, .data = table};
            kiln_cpu_ops.embed_forward(&ctx, ref, &view, ids, N);
            float *d_table = dev_copy(table, (size_t)(V * C) * 4), *d_x = dev((size_t)(N * C) * 4);
            int32_t *d_ids = dev_copy(ids, (size_t)N * 4);
            CHECK(d_table && d_x && d_ids && poison(d_x, (size_t)(N * C) * 4) == KILN_OK, "%s", kiln_last_error());
            CHECK(kiln_cuda_embed_forward_train(d_x, d_table, d_ids, N, C, NULL) == KILN_OK, "%s", kiln_last_error());
            CHECK(kiln_cuda_sync() == KILN_OK && kiln_cuda_download(got, d_x, (size_t)(N * C) * 4) == KILN_OK, "%s",
                  kiln_last_error());
            snprintf(what, sizeof what, "embed_forward N %lld C %lld", (long long)N, (long long)C);
            CHECK(same_bits(what, got, ref, N * C, C, msg, sizeof msg), "%s", msg);
            release_all();
        }
}

/* ---------------------------------------------------------------- embed backward, atomic and deterministic */

/* ids: 0 random over V; 1 a few hot ids (ids % 13, many rows per id); 2 every row the same id (one bucket of N). */
static void make_ids(int32_t *ids, int64_t N, int64_t V, int mode, unsigned long long *rng) {
    for (int64_t n = 0; n < N; n++) {
        const uint64_t r = test_rng_next(rng);
        ids[n] = mode == 2 ? 7 : mode == 1 ? (int32_t)(r % 13) * 71 : (int32_t)(r % (uint64_t)V);
    }
    if (N > 2 && mode != 2) ids[0] = (int32_t)V - 1, ids[N - 1] = ids[N / 2]; /* the last id; a repeat at the end */
}

static void test_embed_backward(void) {
    release_all();
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    static const int64_t Cs[] = {64, 768, 4096, 67};
    static const char *mode_name[] = {"random ids", "13 hot ids", "one id"};
    enum { V = 1000 };
    unsigned long long rng = 22;
    char msg[640], what[160];
    kiln_ops_ctx ctx = cpu_ctx();
    for (int ci = 0; ci < COUNT(Cs); ci++)
        for (int ni = 0; ni < COUNT(Ns); ni++)
            for (int mode = 0; mode < 3; mode++) {
                const int64_t C = Cs[ci], N = Ns[ni];
                const size_t tb = (size_t)(V * C) * 4, xb = (size_t)(N * C) * 4;
                float *dtable0 = host(tb), *dx = host(xb), *ref = host(tb), *got = host(tb), *got2 = host(tb);
                double *abs_sum = host((size_t)(V * C) * 8);
                int32_t *ids = host((size_t)N * 4), *rows_of = host((size_t)V * 4);
                fill(dtable0, V * C, 1.0f, &rng), fill(dx, N * C, 1.0f, &rng);
                make_ids(ids, N, V, mode, &rng);
                /* non-finite rows, skipped whole: a NaN in row 3, an inf at the end of row N/2 + 1, -inf in row N - 2 */
                int64_t want_skipped = 0;
                if (N > 3) dx[3 * C + C / 2] = NAN, want_skipped++;
                if (N > 8) dx[(N / 2 + 1) * C + C - 1] = INFINITY, dx[(N - 2) * C] = -INFINITY, want_skipped += 2;
                memcpy(ref, dtable0, tb);
                const int64_t skipped = kiln_cpu_ops.embed_backward(&ctx, ref, dx, ids, N, C);
                CHECK(skipped == want_skipped, "CPU oracle skipped %lld rows, want %lld", (long long)skipped,
                      (long long)want_skipped);
                /* the atomic version's bound: per element 2 k 2^-24 (|dtable0| + sum |dx|) over its k finite rows */
                memset(rows_of, 0, (size_t)V * 4);
                for (int64_t i = 0; i < V * C; i++) abs_sum[i] = fabs(dtable0[i]);
                for (int64_t n = 0; n < N; n++) {
                    bool fin = true;
                    for (int64_t i = 0; i < C; i++) fin = fin && isfinite(dx[n * C + i]);
                    if (!fin) continue;
                    rows_of[ids[n]]++;
                    for (int64_t i = 0; i < C; i++) abs_sum[ids[n] * C + i] += fabs(dx[n * C + i]);
                }
                float *d_dtable = dev(tb), *d_dx = dev_copy(dx, xb);
                int32_t *d_ids = dev_copy(ids, (size_t)N * 4), *d_skipped = dev(4);
                const size_t wsb = kiln_cuda_embed_backward_det_ws_bytes(N, V);
                void *d_ws = dev(wsb);
                CHECK(d_dtable && d_dx && d_ids && d_skipped && d_ws, "%s", kiln_last_error());
                const int32_t zero = 0;
                int32_t got_skipped = -1;

                /* atomic */
                CHECK(kiln_cuda_upload(d_dtable, dtable0, tb) == KILN_OK && kiln_cuda_upload(d_skipped, &zero, 4) == KILN_OK);
                CHECK(kiln_cuda_embed_backward(d_dtable, d_dx, d_ids, N, C, d_skipped, NULL) == KILN_OK, "%s", kiln_last_error());
                CHECK(kiln_cuda_sync() == KILN_OK && kiln_cuda_download(got, d_dtable, tb) == KILN_OK &&
                      kiln_cuda_download(&got_skipped, d_skipped, 4) == KILN_OK, "%s", kiln_last_error());
                snprintf(what, sizeof what, "embed_backward (atomic) %s N %lld C %lld", mode_name[mode], (long long)N, (long long)C);
                CHECK(got_skipped == want_skipped, "%s: skipped %d rows, want %lld", what, got_skipped, (long long)want_skipped);
                for (int64_t i = 0; i < V * C; i++) {
                    const double bound = 2.0 * rows_of[i / C] * ldexp(abs_sum[i], -24), e = fabs((double)got[i] - ref[i]);
                    CHECK(e <= bound, "%s: element %lld (id %lld col %lld, %d rows): gpu %.9g ref %.9g, |d| %.3g > bound %.3g",
                          what, (long long)i, (long long)(i / C), (long long)(i % C), rows_of[i / C], got[i], ref[i], e, bound);
                }
                CHECK(gpu_within(what, got, ref, V * C, INFINITY, 1e-12, 0.0, msg, sizeof msg), "%s", msg);

                /* deterministic, twice, each on a poisoned workspace; the second without a skip counter */
                for (int run = 0; run < 2; run++) {
                    CHECK(kiln_cuda_upload(d_dtable, dtable0, tb) == KILN_OK && kiln_cuda_upload(d_skipped, &zero, 4) == KILN_OK &&
                          poison(d_ws, wsb) == KILN_OK);
                    CHECK(kiln_cuda_embed_backward_det(d_dtable, d_dx, d_ids, N, C, V, run ? NULL : d_skipped, d_ws, NULL) == KILN_OK,
                          "%s", kiln_last_error());
                    CHECK(kiln_cuda_sync() == KILN_OK && kiln_cuda_download(run ? got2 : got, d_dtable, tb) == KILN_OK &&
                          kiln_cuda_download(&got_skipped, d_skipped, 4) == KILN_OK, "%s", kiln_last_error());
                    snprintf(what, sizeof what, "embed_backward_det run %d %s N %lld C %lld", run, mode_name[mode], (long long)N,
                             (long long)C);
                    CHECK(got_skipped == (run ? 0 : want_skipped), "%s: skip counter %d, want %lld", what, got_skipped,
                          run ? 0LL : (long long)want_skipped);
                }
                CHECK(same_bits(what, got2, got, V * C, C, msg, sizeof msg), "two runs differ: %s", msg);
                CHECK(same_bits(what, got, ref, V * C, C, msg, sizeof msg), "vs the CPU (row order): %s", msg);
                release_all();
            }
}

/* ---------------------------------------------------------------- RMSNorm */

/* The kernels' tiers (train_elementwise.cu's rms_plan_for): a row per warp up to C 1024 in float4s (8, 100, 768)
 * and 256 in floats (102, C % 4 != 0: the scalar path), a row per block beyond (4096, 8192 in float4s; 1030 in
 * floats). N 1 and 7: warps of the block with no row; N 4100: 171 dw chunks of 24 rows, the last of 20. */
static const int64_t norm_Cs[] = {8, 100, 102, 768, 1030, 4096, 8192};
static const int64_t norm_Ns[] = {1, 7, 300, 4100};

static void test_rmsnorm_forward(void) {
    release_all();
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    unsigned long long rng = 33;
    char msg[640], what[160];
    kiln_ops_ctx ctx = cpu_ctx();
    const float eps = 1e-5f;
    for (int ci = 0; ci < COUNT(norm_Cs); ci++)
        for (int ni = 0; ni < COUNT(norm_Ns); ni++)
            for (int has_y = 0; has_y < 2; has_y++) {
                const int64_t C = norm_Cs[ci], N = norm_Ns[ni], n = N * C;
                const size_t xb = (size_t)n * 4;
                float *x = host(xb), *y = host(xb), *w = host((size_t)C * 4), *rx = host(xb), *rout = host(xb);
                float *rrstd = host((size_t)N * 4), *gx = host(xb), *grstd = host((size_t)N * 4);
                kiln_bf16 *gout = host((size_t)n * 2);
                fill(x, n, 2.0f, &rng), fill(y, n, 0.5f, &rng), fill(w, C, 1.5f, &rng);
                memcpy(rx, x, xb);
                if (has_y)
                    for (int64_t i = 0; i < n; i++) rx[i] += y[i];
                kiln_cpu_ops.rmsnorm_forward_train(&ctx, rout, rrstd, rx, w, N, C, eps);
                float *d_x = dev_copy(x, xb), *d_y = dev_copy(y, xb), *d_w = dev_copy(w, (size_t)C * 4), *d_rstd = dev((size_t)N * 4);
                kiln_bf16 *d_out = dev((size_t)n * 2);
                CHECK(d_x && d_y && d_w && d_rstd && d_out && poison(d_rstd, (size_t)N * 4) == KILN_OK &&
                      poison(d_out, (size_t)n * 2) == KILN_OK, "%s", kiln_last_error());
                CHECK(kiln_cuda_rmsnorm_forward_train(d_x, has_y ? d_y : NULL, d_out, d_rstd, d_w, N, C, eps, NULL) == KILN_OK, "%s",
                      kiln_last_error());
                CHECK(kiln_cuda_sync() == KILN_OK && kiln_cuda_download(gx, d_x, xb) == KILN_OK &&
                      kiln_cuda_download(grstd, d_rstd, (size_t)N * 4) == KILN_OK &&
                      kiln_cuda_download(gout, d_out, (size_t)n * 2) == KILN_OK, "%s", kiln_last_error());
                snprintf(what, sizeof what, "rmsnorm_forward%s N %lld C %lld", has_y ? " (x += y)" : "", (long long)N, (long long)C);
                CHECK(same_bits(what, gx, rx, n, C, msg, sizeof msg), "x: %s", msg);
                CHECK(gpu_within(what, grstd, rrstd, N, 1e-6, 1e-11, 0.0, msg, sizeof msg), "rstd: %s", msg);
                CHECK(within_bf16(what, gout, rout, n, 0.0, C, msg, sizeof msg), "out: %s", msg);
                release_all();
            }
}

/* The backward three times from the same dx and dw: run 1 with dx_bf, run 2 the same (every output must repeat
 * its bits: fixed summation orders), run 3 with dx_bf NULL (dx and dw must still be the same bits). */
static void test_rmsnorm_backward(void) {
    release_all();
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    unsigned long long rng = 44;
    char msg[640], what[160];
    kiln_ops_ctx ctx = cpu_ctx();
    const float eps = 1e-5f;
    for (int ci = 0; ci < COUNT(norm_Cs); ci++)
        for (int ni = 0; ni < COUNT(norm_Ns); ni++) {
            const int64_t C = norm_Cs[ci], N = norm_Ns[ni], n = N * C;
            const size_t xb = (size_t)n * 4, cb = (size_t)C * 4;
            float *x = host(xb), *w = host(cb), *dout = host(xb), *out = host(xb), *rstd = host((size_t)N * 4);
            float *dx0 = host(xb), *dw0 = host(cb), *rdx = host(xb), *rdw = host(cb);
            float *gdx[3] = {host(xb), host(xb), host(xb)}, *gdw[3] = {host(cb), host(cb), host(cb)};
            kiln_bf16 *gbf[2] = {host((size_t)n * 2), host((size_t)n * 2)};
            fill(x, n, 2.0f, &rng), fill(w, C, 1.5f, &rng), fill(dout, n, 1.0f, &rng);
            fill(dx0, n, 0.5f, &rng), fill(dw0, C, 0.5f, &rng); /* the backward accumulates into these */
            kiln_cpu_ops.rmsnorm_forward_train(&ctx, out, rstd, x, w, N, C, eps);
            memcpy(rdx, dx0, xb), memcpy(rdw, dw0, cb);
            kiln_cpu_ops.rmsnorm_backward(&ctx, rdx, rdw, dout, x, w, rstd, N, C);
            const size_t wsb = kiln_cuda_rmsnorm_backward_ws_bytes(N, C);
            float *d_x = dev_copy(x, xb), *d_w = dev_copy(w, cb), *d_dout = dev_copy(dout, xb), *d_rstd = dev_copy(rstd, (size_t)N * 4);
            float *d_dx = dev(xb), *d_dw = dev(cb);
            kiln_bf16 *d_bf = dev((size_t)n * 2);
            void *d_ws = dev(wsb);
            CHECK(d_x && d_w && d_dout && d_rstd && d_dx && d_dw && d_bf && d_ws, "%s", kiln_last_error());
            for (int run = 0; run < 3; run++) {
                kiln_bf16 *bf = run < 2 ? d_bf : NULL;
                CHECK(kiln_cuda_upload(d_dx, dx0, xb) == KILN_OK && kiln_cuda_upload(d_dw, dw0, cb) == KILN_OK &&
                      poison(d_ws, wsb) == KILN_OK && poison(d_bf, (size_t)n * 2) == KILN_OK, "%s", kiln_last_error());
                CHECK(kiln_cuda_rmsnorm_backward(d_dx, bf, d_dw, d_dout, d_x, d_w, d_rstd, N, C, d_ws, NULL) == KILN_OK, "%s",
                      kiln_last_error());
                CHECK(kiln_cuda_sync() == KILN_OK && kiln_cuda_download(gdx[run], d_dx, xb) == KILN_OK &&
                      kiln_cuda_download(gdw[run], d_dw, cb) == KILN_OK, "%s", kiln_last_error());
                if (bf) CHECK(kiln_cuda_download(gbf[run], d_bf, (size_t)n * 2) == KILN_OK, "%s", kiln_last_error());
            }
            snprintf(what, sizeof what, "rmsnorm_backward N %lld C %lld", (long long)N, (long long)C);
            CHECK(gpu_within(what, gdx[0], rdx, n, 1e-6, 1e-11, 0.0, msg, sizeof msg), "dx: %s", msg);
            CHECK(gpu_within(what, gdw[0], rdw, C, 1e-6, 1e-11, 0.0, msg, sizeof msg), "dw: %s", msg);
            /* dx_bf is the GPU's own dx rounded to nearest even, bit for bit */
            for (int64_t i = 0; i < n; i++)
                CHECK(gbf[0][i] == kiln_f32_to_bf16(gdx[0][i]),
                      "%s: dx_bf at %lld (row %lld col %lld) is 0x%04x, bf16(dx %.9g = 0x%08x) = 0x%04x", what, (long long)i,
                      (long long)(i / C), (long long)(i % C), gbf[0][i], gdx[0][i], kiln_f32_bits(gdx[0][i]),
                      kiln_f32_to_bf16(gdx[0][i]));
            CHECK(!memcmp(gbf[1], gbf[0], (size_t)n * 2), "%s: dx_bf differs between two runs", what);
            for (int run = 1; run < 3; run++) {
                char w2[200];
                snprintf(w2, sizeof w2, "%s, run %d (%s) against run 0", what, run, run == 1 ? "again" : "dx_bf NULL");
                CHECK(same_bits(w2, gdx[run], gdx[0], n, C, msg, sizeof msg), "dx: %s", msg);
                CHECK(same_bits(w2, gdw[run], gdw[0], C, C, msg, sizeof msg), "dw: %s", msg);
            }
            release_all();
        }
}

/* ---------------------------------------------------------------- RoPE */

/* Modes: the forward from bf16 out of place (v copied) and in place (v untouched), the backward from f32. HS 64
 * and 128 take the 16-byte path; HS 40 too when interleaved (rope_dim 20 splits a unit of 8), not NeoX (rope_dim
 * % 16 != 0); HS 6 the per-pair path. */
static void test_rope(void) {
    release_all();
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    unsigned long long rng = 55;
    char msg[640], what[240];
    kiln_ops_ctx ctx = cpu_ctx();
    static const int64_t heads[][2] = {{12, 4}, {8, 8}};
    static const int64_t HSs[] = {64, 128, 40, 6}, Ts[] = {16, 300};
    static const char *mode_name[] = {"forward bf16 out of place", "forward bf16 in place", "backward f32"};
    for (int hi = 0; hi < COUNT(heads); hi++)
        for (int si = 0; si < COUNT(HSs); si++)
            for (int ti = 0; ti < COUNT(Ts); ti++)
                for (int neox = 0; neox < 2; neox++)
                    for (int partial = 0; partial < 2; partial++)
                        for (int mode = 0; mode < 6; mode++) { /* modes 3..5: the same with a scaling table */
                            const bool scaled = mode >= 3;
                            const int64_t NH = heads[hi][0], NKV = heads[hi][1], HS = HSs[si], T = Ts[ti];
                            const int64_t rope_dim = partial ? HS / 2 / 2 * 2 : HS, N = 2 * T + 5; /* two sequences and a part */
                            const int64_t Q = NH * HS, KV = NKV * HS, W = Q + 2 * KV, n = N * W;
                            const float base = 10000.0f;
                            const bool bwd = mode % 3 == 2;
                            float *qkv = host((size_t)n * 4), *q = host((size_t)(N * Q) * 4), *k = host((size_t)(N * KV) * 4);
                            float *ref = host((size_t)n * 4);
                            kiln_bf16 *qkv_bf = host((size_t)n * 2), *got = host((size_t)n * 2);
                            int32_t *pos = host((size_t)N * 4);
                            fill(qkv, n, 2.0f, &rng);
                            /* the forward's input is bf16: the oracle rotates the very values the GPU reads */
                            for (int64_t i = 0; i < n; i++) {
                                qkv_bf[i] = kiln_f32_to_bf16(qkv[i]);
                                if (!bwd) qkv[i] = bf(qkv_bf[i]);
                            }
                            for (int64_t r = 0; r < N; r++) {
                                pos[r] = (int32_t)(r % T);
                                memcpy(q + r * Q, qkv + r * W, (size_t)Q * 4);
                                memcpy(k + r * KV, qkv + r * W + Q, (size_t)KV * 4);
                            }
                            /* scaled: multipliers in 0.25..1.25 and mscale 1.2, as a YaRN table has */
                            float *freq = scaled ? host((size_t)(rope_dim / 2) * 4) : NULL;
                            const float mscale = scaled ? 1.2f : 1.0f;
                            if (freq) {
                                fill(freq, rope_dim / 2, 0.5f, &rng);
                                for (int64_t i = 0; i < rope_dim / 2; i++) freq[i] += 0.75f;
                            }
                            if (bwd) {
                                kiln_cpu_ops.rope_backward(&ctx, q, pos, N, NH, HS, rope_dim, base, freq, mscale, neox);
                                kiln_cpu_ops.rope_backward(&ctx, k, pos, N, NKV, HS, rope_dim, base, freq, mscale, neox);
                            } else {
                                kiln_cpu_ops.rope_forward(&ctx, q, pos, N, NH, HS, rope_dim, base, freq, mscale, neox);
                                kiln_cpu_ops.rope_forward(&ctx, k, pos, N, NKV, HS, rope_dim, base, freq, mscale, neox);
                            }
                            memcpy(ref, qkv, (size_t)n * 4);
                            for (int64_t r = 0; r < N; r++) {
                                memcpy(ref + r * W, q + r * Q, (size_t)Q * 4);
                                memcpy(ref + r * W + Q, k + r * KV, (size_t)KV * 4);
                            }
                            kiln_status s;
                            kiln_bf16 *d_out;
                            if (bwd) {
                                float *d_in = dev_copy(qkv, (size_t)n * 4);
                                d_out = dev((size_t)n * 2);
                                CHECK(d_in && d_out && poison(d_out, (size_t)n * 2) == KILN_OK, "%s", kiln_last_error());
                                s = kiln_cuda_rope_backward(d_out, d_in, N, T, NH, NKV, HS, rope_dim, base, freq, mscale, neox, NULL);
                            } else {
                                kiln_bf16 *d_in = dev_copy(qkv_bf, (size_t)n * 2);
                                d_out = mode % 3 == 1 ? d_in : dev((size_t)n * 2);
                                CHECK(d_in && d_out && (mode % 3 == 1 || poison(d_out, (size_t)n * 2) == KILN_OK), "%s", kiln_last_error());
                                s = kiln_cuda_rope_forward_train(d_out, d_in, N, T, NH, NKV, HS, rope_dim, base, freq, mscale, neox, NULL);
                            }
                            CHECK(s == KILN_OK, "%s", kiln_last_error());
                            CHECK(kiln_cuda_sync() == KILN_OK && kiln_cuda_download(got, d_out, (size_t)n * 2) == KILN_OK, "%s",
                                  kiln_last_error());
                            snprintf(what, sizeof what, "rope %s%s NH %lld NKV %lld HS %lld rope_dim %lld %s T %lld N %lld (row width %lld)",
                                     mode_name[mode % 3], scaled ? " scaled" : "", (long long)NH, (long long)NKV, (long long)HS, (long long)rope_dim,
                                     neox ? "neox" : "interleaved", (long long)T, (long long)N, (long long)W);
                            CHECK(within_bf16(what, got, ref, n, 1e-6, W, msg, sizeof msg), "%s", msg);
                            for (int64_t r = 0; r < N; r++)
                                for (int64_t i = Q + KV; i < W; i++)
                                    CHECK(got[r * W + i] == qkv_bf[r * W + i],
                                          "%s: v at row %lld col %lld is 0x%04x, bf16(%.9g) = 0x%04x", what, (long long)r,
                                          (long long)(i - Q - KV), got[r * W + i], qkv[r * W + i], qkv_bf[r * W + i]);
                            release_all();
                        }
}

/* ---------------------------------------------------------------- SwiGLU */

static void test_swiglu(void) {
    release_all();
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    static const int64_t Fs[] = {2048, 5632, 68, 67}; /* 68 (F % 8 != 0) and 67: the per-column path */
    unsigned long long rng = 66;
    char msg[640], what[160];
    kiln_ops_ctx ctx = cpu_ctx();
    /* every F with every N of Ns, then F 16 over 70000 rows: past the grid's 65535 rows, so blocks loop */
    for (int ci = 0; ci <= COUNT(Fs) * COUNT(Ns); ci++) {
            const bool tall = ci == COUNT(Fs) * COUNT(Ns);
            const int64_t F = tall ? 16 : Fs[ci / COUNT(Ns)], N = tall ? 70000 : Ns[ci % COUNT(Ns)], n = N * F;
            float *gu = host((size_t)(2 * n) * 4), *gate = host((size_t)n * 4), *up = host((size_t)n * 4);
            float *dh = host((size_t)n * 4), *rh = host((size_t)n * 4), *rdgu = host((size_t)(2 * n) * 4);
            float *rdg = host((size_t)n * 4), *rdu = host((size_t)n * 4);
            kiln_bf16 *gh = host((size_t)n * 2), *gdgu = host((size_t)(2 * n) * 2);
            kiln_bf16 *gu_bf = host((size_t)(2 * n) * 2), *dh_bf = host((size_t)n * 2);
            fill(gu, 2 * n, 4.0f, &rng), fill(dh, n, 1.0f, &rng);
            /* gu and dh are bf16 (matmul outputs): the oracle gets the very values the GPU reads */
            for (int64_t i = 0; i < 2 * n; i++) gu_bf[i] = kiln_f32_to_bf16(gu[i]), gu[i] = bf(gu_bf[i]);
            for (int64_t i = 0; i < n; i++) dh_bf[i] = kiln_f32_to_bf16(dh[i]), dh[i] = bf(dh_bf[i]);
            for (int64_t r = 0; r < N; r++) {
                memcpy(gate + r * F, gu + r * 2 * F, (size_t)F * 4);
                memcpy(up + r * F, gu + r * 2 * F + F, (size_t)F * 4);
            }
            kiln_cpu_ops.swiglu_forward(&ctx, rh, gate, up, n);
            memset(rdg, 0, (size_t)n * 4), memset(rdu, 0, (size_t)n * 4); /* the CPU accumulates; the GPU overwrites */
            kiln_cpu_ops.swiglu_backward(&ctx, rdg, rdu, dh, gate, up, n);
            for (int64_t r = 0; r < N; r++) {
                memcpy(rdgu + r * 2 * F, rdg + r * F, (size_t)F * 4);
                memcpy(rdgu + r * 2 * F + F, rdu + r * F, (size_t)F * 4);
            }
            kiln_bf16 *d_gu = dev_copy(gu_bf, (size_t)(2 * n) * 2), *d_dh = dev_copy(dh_bf, (size_t)n * 2);
            kiln_bf16 *d_h = dev((size_t)n * 2), *d_dgu = dev((size_t)(2 * n) * 2);
            CHECK(d_gu && d_dh && d_h && d_dgu && poison(d_h, (size_t)n * 2) == KILN_OK &&
                  poison(d_dgu, (size_t)(2 * n) * 2) == KILN_OK, "%s", kiln_last_error());
            CHECK(kiln_cuda_swiglu_forward_train(d_h, d_gu, N, F, NULL) == KILN_OK, "%s", kiln_last_error());
            CHECK(kiln_cuda_swiglu_backward(d_dgu, d_dh, d_gu, N, F, NULL) == KILN_OK, "%s", kiln_last_error());
            CHECK(kiln_cuda_sync() == KILN_OK && kiln_cuda_download(gh, d_h, (size_t)n * 2) == KILN_OK &&
                  kiln_cuda_download(gdgu, d_dgu, (size_t)(2 * n) * 2) == KILN_OK, "%s", kiln_last_error());
            snprintf(what, sizeof what, "swiglu_forward N %lld F %lld", (long long)N, (long long)F);
            CHECK(within_bf16(what, gh, rh, n, 1e-6, F, msg, sizeof msg), "h: %s", msg);
            snprintf(what, sizeof what, "swiglu_backward N %lld F %lld (columns < F: dgate, >= F: dup)", (long long)N, (long long)F);
            CHECK(within_bf16(what, gdgu, rdgu, 2 * n, 1e-6, 2 * F, msg, sizeof msg), "dgu: %s", msg);
            release_all();
        }
}

/* ---------------------------------------------------------------- to_bf16 */

static void test_to_bf16(void) {
    release_all();
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    static const int64_t ns[] = {1, 37, 4096, 1000003};
    unsigned long long rng = 77;
    for (int ni = 0; ni < COUNT(ns); ni++)
        for (int off = 0; off < 2; off++) { /* off 1: x one float past 16-byte alignment, the scalar path */
            const int64_t n = ns[ni];
            float *x = host((size_t)n * 4);
            kiln_bf16 *got = host((size_t)n * 2);
            fill(x, n, 3.0f, &rng);
            /* specials and rounding ties: 0, -0, +-inf, a subnormal, FLT_MAX (rounds to inf), a NaN, exact ties */
            const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, 1e-40f, FLT_MAX, NAN,
                                     kiln_bits_f32(0x3f808000u), kiln_bits_f32(0x3f818000u), kiln_bits_f32(0xbf808001u)};
            for (int i = 0; i < COUNT(special) && i < n; i++) x[(i * 7919) % n] = special[i];
            float *d_buf = dev((size_t)(n + 4) * 4);
            kiln_bf16 *d_out = dev((size_t)n * 2);
            CHECK(d_buf && d_out && kiln_cuda_upload(d_buf + off, x, (size_t)n * 4) == KILN_OK &&
                  poison(d_out, (size_t)n * 2) == KILN_OK, "%s", kiln_last_error());
            CHECK(kiln_cuda_to_bf16(d_out, d_buf + off, n, NULL) == KILN_OK, "%s", kiln_last_error());
            CHECK(kiln_cuda_sync() == KILN_OK && kiln_cuda_download(got, d_out, (size_t)n * 2) == KILN_OK, "%s", kiln_last_error());
            for (int64_t i = 0; i < n; i++) {
                const kiln_bf16 want = kiln_f32_to_bf16(x[i]);
                const bool ok = isnan(x[i]) ? isnan(bf(got[i])) : got[i] == want;
                CHECK(ok, "to_bf16 n %lld off %d: element %lld = %.9g (0x%08x) gave 0x%04x, want 0x%04x", (long long)n, off,
                      (long long)i, x[i], kiln_f32_bits(x[i]), got[i], want);
            }
            release_all();
        }
}

/* ---------------------------------------------------------------- refused arguments */

static void test_refusals(void) {
    release_all();
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    float *d = dev(4096);
    kiln_bf16 *b = dev(4096);
    CHECK(d && b);
    struct {
        const char *what;
        kiln_status s;
    } r[] = {
        {"rope rope_dim odd", kiln_cuda_rope_forward_train(b, b, 1, 1, 1, 1, 64, 63, 1e4f, NULL, 1.0f, false, NULL)},
        {"rope rope_dim > HS", kiln_cuda_rope_forward_train(b, b, 1, 1, 1, 1, 64, 128, 1e4f, NULL, 1.0f, false, NULL)},
        {"rope HS 512", kiln_cuda_rope_backward(b, d, 1, 1, 1, 1, 512, 512, 1e4f, NULL, 1.0f, true, NULL)},
        {"rope T 0", kiln_cuda_rope_forward_train(b, b, 1, 0, 1, 1, 64, 64, 1e4f, NULL, 1.0f, false, NULL)},
        {"rmsnorm C 0", kiln_cuda_rmsnorm_forward_train(d, NULL, b, d, d, 1, 0, 1e-5f, NULL)},
        /* rows past what stays in registers: 8196 (float4s, past 8192) and 4098 (floats, past 4096) */
        {"rmsnorm C 8196", kiln_cuda_rmsnorm_forward_train(d, NULL, b, d, d, 1, 8196, 1e-5f, NULL)},
        {"rmsnorm C 4098", kiln_cuda_rmsnorm_forward_train(d, NULL, b, d, d, 1, 4098, 1e-5f, NULL)},
        {"rmsnorm_backward ws NULL", kiln_cuda_rmsnorm_backward(d, b, d, d, d, d, d, 1, 64, NULL, NULL)},
        {"rmsnorm_backward C 8196", kiln_cuda_rmsnorm_backward(d, NULL, d, d, d, d, d, 1, 8196, d, NULL)},
        {"rmsnorm_backward C 4098", kiln_cuda_rmsnorm_backward(d, b, d, d, d, d, d, 1, 4098, d, NULL)},
        {"embed_backward_det ws NULL", kiln_cuda_embed_backward_det(d, d, (const int32_t *)d, 1, 64, 10, NULL, NULL, NULL)},
        {"swiglu F 0", kiln_cuda_swiglu_forward_train(b, b, 1, 0, NULL)},
        {"swiglu_backward N < 0", kiln_cuda_swiglu_backward(b, b, b, -1, 64, NULL)},
        {"to_bf16 n < 0", kiln_cuda_to_bf16(b, d, -1, NULL)},
    };
    for (int i = 0; i < COUNT(r); i++) CHECK(r[i].s == KILN_ERR_INVALID, "%s: status %d, want KILN_ERR_INVALID", r[i].what, (int)r[i].s);
    CHECK(kiln_cuda_sync() == KILN_OK, "%s", kiln_last_error());
    release_all();
}

int main(void) {
    if (kiln_pool_create(4, &pool) != KILN_OK) return 1;
    RUN(test_embed_forward);
    RUN(test_embed_backward);
    RUN(test_rmsnorm_forward);
    RUN(test_rmsnorm_backward);
    RUN(test_rope);
    RUN(test_swiglu);
    RUN(test_to_bf16);
    RUN(test_refusals);
    release_all();
    kiln_pool_free(pool);
    TEST_EXIT();
}

#else

static void test_cuda_train_elementwise(void) { SKIP("kiln built without CUDA"); }

int main(void) {
    RUN(test_cuda_train_elementwise);
    TEST_EXIT();
}

#endif
