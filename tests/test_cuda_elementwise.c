/* test_cuda_elementwise.c: src/cuda/elementwise.cu against the CPU oracle (kiln_cpu_ops, src/cpu/ops*.c) and, for
 * the fusions, host loops built from those ops in llama.c's order, on fresh seeded random inputs (never zeros).
 * Every GPU output is poisoned with 0xFF bytes (NaN) before a launch, so an element left unwritten fails.
 * Bounds, per op (scale = max |reference|):
 *   embed                       bit-exact (same float ops as the CPU's to_float, then x * scale; for Q5_1, Q2_K,
 *                               Q3_K, IQ4_NL, IQ4_XS as test_blocks_ggml.h's GGML dequantizer)
 *   residual_norm               max-abs <= 1e-5 * scale, NMSE <= 1e-11 (only the double sum's order differs)
 *   residual_norm_xp            x and out bit-exact with residual_norm's; xp byte-exact with matvec_prepare(out);
 *                               refused arguments (T > 32, C % 32, NULL or unaligned xp, no out) leave x and xp as
 *                               they were
 *   qkv_post q (f32)            max-abs <= 1e-4 * max(scale, 1), NMSE <= 1e-10 (cosf/sinf at angles up to 1e5 rad
 *                               differ by ulps between CUDA and the host libm); v cache bit-exact; k cache within
 *                               one f16 rounding (|d| <= 1e-3 |r| + 1e-4 max(scale, 1)); rows not written unchanged
 *   glu, sigmoid_mul, softcap   max-abs <= 1e-5 * scale, NMSE <= 1e-11 (expf/tanhf ulps)
 *   argmax                      exact, lowest index among equal maxima
 * Skips without a GPU, or when kiln was built without CUDA. */
#include "cuda/cuda.h"
#include "test.h"
#include "test_blocks.h"
#include "test_blocks_ggml.h"

#ifdef KILN_CUDA
#include "test_cuda_util.h"
#include "cpu/ops.h"
#include "cuda/kernels.h"
#include "quants.h"

#include <stdint.h>

static void fill(float *x, int64_t n, float amp, unsigned long long *rng) {
    for (int64_t i = 0; i < n; i++) {
        float v = test_rng_f32(rng) * amp;
        x[i] = v != 0.0f ? v : amp * 0.5f;
    }
}


static kiln_pool *pool;
static kiln_ops_ctx cpu_ctx(void) { return (kiln_ops_ctx){.pool = pool}; }

/* ---------------------------------------------------------------- embed */

/* V rows of C of type t: random bytes, then every f16 scale field a finite half (as tests/test_cuda.c) and every
 * F32/F16/BF16 element a finite random value. */
static void *random_table(kiln_type t, int64_t V, int64_t C, unsigned long long *rng) {
    uint8_t *buf = host(kiln_type_row_bytes(t, C) * (size_t)V);
    test_random_blocks(t, buf, V * C, 100.0f, 0.02f, rng);
    test_ggml_fix_scales(t, buf, V * C, 0.01f, 0.02f, rng);
    return buf;
}

static void test_embed(void) {
    release_all();
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    static const kiln_type types[] = {KILN_TYPE_F32,  KILN_TYPE_F16,  KILN_TYPE_BF16, KILN_TYPE_Q4_0,  KILN_TYPE_Q4_1,
                                      KILN_TYPE_Q5_0, KILN_TYPE_Q8_0, KILN_TYPE_Q4_K, KILN_TYPE_Q5_K,  KILN_TYPE_Q6_K,
                                      KILN_TYPE_Q5_1, KILN_TYPE_Q2_K, KILN_TYPE_Q3_K, KILN_TYPE_IQ4_NL, KILN_TYPE_IQ4_XS};
    static const int64_t Cs[] = {512, 2304}; /* 2304 = 9 super-blocks: not a power of two */
    static const int64_t Ts[] = {1, 5, 64};
    enum { V = 37 };
    unsigned long long rng = 101;
    char msg[512];
    kiln_ops_ctx ctx = cpu_ctx();
    for (int ci = 0; ci < COUNT(Cs); ci++) {
        const int64_t C = Cs[ci];
        for (int ti = 0; ti < COUNT(types); ti++) {
            const kiln_type t = types[ti];
            const size_t row = kiln_type_row_bytes(t, C);
            void *h_table = random_table(t, V, C, &rng);
            void *d_table = dev(row * V);
            CHECK(d_table && kiln_cuda_upload(d_table, h_table, row * V) == KILN_OK, "%s", kiln_last_error());
            kiln_cuda_wt wt = {.type = t, .rows = V, .cols = C, .row_bytes = row, .data = d_table};
            kiln_tensor_view view = {.name = "embd", .type = t, .n_dims = 2, .ne = {C, V, 1, 1},
                                     .nb = {kiln_type_block_bytes(t), row, row * V, row * V}, .nbytes = row * V,
                                     .data = h_table};
            for (int si = 0; si < COUNT(Ts); si++) {
                const int64_t T = Ts[si];
                int32_t *ids = host((size_t)T * 4);
                for (int64_t i = 0; i < T; i++) ids[i] = i == 0 ? V - 1 : i == 1 ? 0 : (int32_t)(test_rng_next(&rng) % V);
                float *ref = host((size_t)(T * C) * 4), *got = host((size_t)(T * C) * 4);
                int32_t *d_ids = dev((size_t)T * 4);
                float *d_out = dev((size_t)(T * C) * 4);
                CHECK(d_ids && d_out && kiln_cuda_upload(d_ids, ids, (size_t)T * 4) == KILN_OK);
                for (int sc = 0; sc < 2; sc++) {
                    const float scale = sc ? sqrtf((float)C) : 1.0f; /* gemma's embd_scale, as llama.c applies it */
                    if (test_ggml_is_new(t)) /* the rows through test_blocks_ggml.h: GGML's dequantization */
                        for (int64_t i = 0; i < T; i++)
                            test_ggml_to_float(t, (const uint8_t *)h_table + (size_t)ids[i] * row, ref + i * C, C);
                    else
                        kiln_cpu_ops.embed_forward(&ctx, ref, &view, ids, T);
                    if (scale != 1.0f) kiln_cpu_ops.scale_softcap_forward(&ctx, ref, T * C, scale, 0.0f);
                    CHECK(poison(d_out, (size_t)(T * C) * 4) == KILN_OK);
                    CHECK(kiln_cuda_embed(d_out, &wt, d_ids, T, scale, NULL) == KILN_OK, "%s", kiln_last_error());
                    CHECK(kiln_cuda_sync() == KILN_OK && kiln_cuda_download(got, d_out, (size_t)(T * C) * 4) == KILN_OK,
                          "%s", kiln_last_error());
                    int64_t bad = -1;
                    for (int64_t i = 0; i < T * C && bad < 0; i++)
                        if (memcmp(&got[i], &ref[i], 4)) bad = i;
                    snprintf(msg, sizeof msg, "embed %s T %lld C %lld scale %g: first differing element %lld (token %lld col %lld): gpu %.9g cpu %.9g",
                             kiln_type_name(t), (long long)T, (long long)C, scale, (long long)bad,
                             (long long)(bad >= 0 ? bad / C : -1), (long long)(bad >= 0 ? bad % C : -1),
                             bad >= 0 ? got[bad] : 0.0, bad >= 0 ? ref[bad] : 0.0);
                    CHECK(bad < 0, "%s", msg);
                }
            }
            release_all();
        }
    }
}

/* ---------------------------------------------------------------- residual_norm */

static void test_residual_norm(void) {
    release_all();
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    static const int64_t Cs[] = {64, 576, 577, 4096, 5120, 8192}; /* 577: odd, the scalar (non-float4) path */
    static const int64_t Ts[] = {1, 5, 64};
    /* modes: 0 x += y, out; 1 x += rmsnorm(y) * post_w, out; 2 out only (y NULL); 3 x += y only (out NULL);
     * 4 as 1 with y and out the same buffer */
    static const char *mode_name[] = {"add+norm", "post-norm add+norm", "norm only", "add only", "post-norm, y == out"};
    unsigned long long rng = 202;
    char msg[512];
    kiln_ops_ctx ctx = cpu_ctx();
    const float eps = 1e-6f, post_eps = 1e-5f;
    for (int ci = 0; ci < COUNT(Cs); ci++)
        for (int ti = 0; ti < COUNT(Ts); ti++)
            for (int mode = 0; mode < 5; mode++) {
                const int64_t C = Cs[ci], T = Ts[ti], n = T * C;
                const size_t bytes = (size_t)n * 4;
                float *x = host(bytes), *y = host(bytes), *w = host((size_t)C * 4), *pw = host((size_t)C * 4);
                float *rx = host(bytes), *rout = host(bytes), *tmp = host(bytes), *gx = host(bytes), *gout = host(bytes);
                fill(x, n, 2.0f, &rng), fill(y, n, 0.5f, &rng), fill(w, C, 1.5f, &rng), fill(pw, C, 1.5f, &rng);
                const bool has_y = mode != 2, has_out = mode != 3, post = mode == 1 || mode == 4;
                /* the reference, as llama.c: xb = rmsnorm(xb) * post_w; x += xb; out = rmsnorm(x) * w */
                memcpy(rx, x, bytes);
                if (has_y) {
                    memcpy(tmp, y, bytes);
                    if (post) kiln_cpu_ops.rmsnorm_forward(&ctx, tmp, tmp, pw, T, C, post_eps);
                    for (int64_t i = 0; i < n; i++) rx[i] += tmp[i];
                }
                if (has_out) kiln_cpu_ops.rmsnorm_forward(&ctx, rout, rx, w, T, C, eps);
                float *dx = dev(bytes), *dy = dev(bytes), *dout = dev(bytes), *dw = dev((size_t)C * 4), *dpw = dev((size_t)C * 4);
                CHECK(dx && dy && dout && dw && dpw);
                CHECK(kiln_cuda_upload(dx, x, bytes) == KILN_OK && kiln_cuda_upload(dy, y, bytes) == KILN_OK &&
                      kiln_cuda_upload(dw, w, (size_t)C * 4) == KILN_OK && kiln_cuda_upload(dpw, pw, (size_t)C * 4) == KILN_OK);
                float *out_arg = has_out ? (mode == 4 ? dy : dout) : NULL;
                if (has_out && mode != 4) CHECK(poison(dout, bytes) == KILN_OK);
                CHECK(kiln_cuda_residual_norm(dx, has_y ? dy : NULL, post ? dpw : NULL, post_eps, out_arg, dw, eps, T, C,
                                              NULL) == KILN_OK, "%s", kiln_last_error());
                CHECK(kiln_cuda_sync() == KILN_OK && kiln_cuda_download(gx, dx, bytes) == KILN_OK, "%s", kiln_last_error());
                char what[128];
                snprintf(what, sizeof what, "residual_norm %s T %lld C %lld: x", mode_name[mode], (long long)T, (long long)C);
                CHECK(gpu_within(what, gx, rx, n, 1e-5, 1e-11, 0.0, msg, sizeof msg), "%s", msg);
                if (has_out) {
                    CHECK(kiln_cuda_download(gout, out_arg, bytes) == KILN_OK, "%s", kiln_last_error());
                    snprintf(what, sizeof what, "residual_norm %s T %lld C %lld: out", mode_name[mode], (long long)T, (long long)C);
                    CHECK(gpu_within(what, gout, rout, n, 1e-5, 1e-11, 0.0, msg, sizeof msg), "%s", msg);
                }
                release_all();
            }
}

/* ---------------------------------------------------------------- residual_norm_xp */

/* First differing byte of two buffers, or -1. */
static int64_t first_diff(const void *a, const void *b, size_t n) {
    const uint8_t *p = a, *q = b;
    for (size_t i = 0; i < n; i++)
        if (p[i] != q[i]) return (int64_t)i;
    return -1;
}

/* residual_norm_xp against residual_norm and kiln_cuda_matvec_prepare on the same inputs: x and out bit for bit
 * (one kernel, the same operations), and xp byte for byte with matvec_prepare(out), codes and {d, d * sum} both.
 * off 1 shifts x, y and out one float past 16-byte alignment: the scalar path, 32 lanes per code block. */
static void test_residual_norm_xp(void) {
    release_all();
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    static const int64_t Cs[] = {64, 2048, 4096, 5120};
    static const int64_t Ts[] = {1, 3, 8, 17, 32};
    static const int modes[] = {0, 1, 2, 4}; /* test_residual_norm's modes that have an out */
    static const char *mode_name[] = {"add+norm", "post-norm add+norm", "norm only", "add only", "post-norm, y == out"};
    unsigned long long rng = 606;
    char msg[512];
    kiln_ops_ctx ctx = cpu_ctx();
    const float eps = 1e-6f, post_eps = 1e-5f;
    for (int ci = 0; ci < COUNT(Cs); ci++)
        for (int ti = 0; ti < COUNT(Ts); ti++)
            for (int mi = 0; mi < COUNT(modes); mi++)
                for (int off = 0; off < 2; off++) {
                    const int mode = modes[mi];
                    const int64_t C = Cs[ci], T = Ts[ti], n = T * C;
                    const size_t bytes = (size_t)n * 4, buf = bytes + 16, pb = kiln_cuda_matvec_prep_bytes(T, C);
                    const bool has_y = mode != 2, post = mode == 1 || mode == 4;
                    float *x = host(bytes), *y = host(bytes), *w = host((size_t)C * 4), *pw = host((size_t)C * 4);
                    float *rx = host(bytes), *rout = host(bytes), *tmp = host(bytes);
                    float *gx1 = host(bytes), *gx2 = host(bytes), *gout1 = host(bytes), *gout2 = host(bytes);
                    uint8_t *gxp1 = host(pb), *gxp2 = host(pb);
                    fill(x, n, 2.0f, &rng), fill(y, n, 0.5f, &rng), fill(w, C, 1.5f, &rng), fill(pw, C, 1.5f, &rng);
                    memcpy(rx, x, bytes);
                    if (has_y) {
                        memcpy(tmp, y, bytes);
                        if (post) kiln_cpu_ops.rmsnorm_forward(&ctx, tmp, tmp, pw, T, C, post_eps);
                        for (int64_t i = 0; i < n; i++) rx[i] += tmp[i];
                    }
                    kiln_cpu_ops.rmsnorm_forward(&ctx, rout, rx, w, T, C, eps);
                    /* set 1: residual_norm then matvec_prepare; set 2: residual_norm_xp */
                    float *b1x = dev(buf), *b1y = dev(buf), *b1o = dev(buf), *b2x = dev(buf), *b2y = dev(buf), *b2o = dev(buf);
                    float *dw = dev((size_t)C * 4), *dpw = dev((size_t)C * 4);
                    void *xp1 = dev(pb), *xp2 = dev(pb);
                    CHECK(b1x && b1y && b1o && b2x && b2y && b2o && dw && dpw && xp1 && xp2);
                    float *d1x = b1x + off, *d1y = b1y + off, *d2x = b2x + off, *d2y = b2y + off;
                    float *d1o = mode == 4 ? d1y : b1o + off, *d2o = mode == 4 ? d2y : b2o + off;
                    CHECK(kiln_cuda_upload(d1x, x, bytes) == KILN_OK && kiln_cuda_upload(d1y, y, bytes) == KILN_OK &&
                          kiln_cuda_upload(d2x, x, bytes) == KILN_OK && kiln_cuda_upload(d2y, y, bytes) == KILN_OK &&
                          kiln_cuda_upload(dw, w, (size_t)C * 4) == KILN_OK && kiln_cuda_upload(dpw, pw, (size_t)C * 4) == KILN_OK &&
                          poison(xp1, pb) == KILN_OK && poison(xp2, pb) == KILN_OK, "%s", kiln_last_error());
                    if (mode != 4) CHECK(poison(d1o, bytes) == KILN_OK && poison(d2o, bytes) == KILN_OK);
                    CHECK(kiln_cuda_residual_norm(d1x, has_y ? d1y : NULL, post ? dpw : NULL, post_eps, d1o, dw, eps, T, C,
                                                  NULL) == KILN_OK, "%s", kiln_last_error());
                    CHECK(kiln_cuda_matvec_prepare(xp1, d1o, T, C, NULL) == KILN_OK, "%s", kiln_last_error());
                    CHECK(kiln_cuda_residual_norm_xp(d2x, has_y ? d2y : NULL, post ? dpw : NULL, post_eps, d2o, xp2, dw, eps,
                                                     T, C, NULL) == KILN_OK, "%s", kiln_last_error());
                    CHECK(kiln_cuda_sync() == KILN_OK && kiln_cuda_download(gx1, d1x, bytes) == KILN_OK &&
                          kiln_cuda_download(gx2, d2x, bytes) == KILN_OK && kiln_cuda_download(gout1, d1o, bytes) == KILN_OK &&
                          kiln_cuda_download(gout2, d2o, bytes) == KILN_OK && kiln_cuda_download(gxp1, xp1, pb) == KILN_OK &&
                          kiln_cuda_download(gxp2, xp2, pb) == KILN_OK, "%s", kiln_last_error());
                    char what[160];
                    snprintf(what, sizeof what, "residual_norm_xp %s T %lld C %lld%s", mode_name[mode], (long long)T,
                             (long long)C, off ? " (unaligned)" : "");
                    int64_t bad = first_diff(gx2, gx1, bytes); /* bytes to floats below; -1 stays -1 */
                    bad = bad < 0 ? -1 : bad / 4;
                    CHECK(bad < 0, "%s: x differs from residual_norm's at %lld: %.9g vs %.9g", what, (long long)bad,
                          gx2[bad], gx1[bad]);
                    bad = first_diff(gout2, gout1, bytes);
                    bad = bad < 0 ? -1 : bad / 4;
                    CHECK(bad < 0, "%s: out differs from residual_norm's at %lld (token %lld col %lld): %.9g vs %.9g", what,
                          (long long)bad, (long long)(bad / C), (long long)(bad % C), gout2[bad], gout1[bad]);
                    char ow[200];
                    snprintf(ow, sizeof ow, "%s: out", what);
                    CHECK(gpu_within(ow, gout2, rout, n, 1e-5, 1e-11, 0.0, msg, sizeof msg), "%s", msg);
                    bad = first_diff(gxp2, gxp1, (size_t)n);
                    CHECK(bad < 0, "%s: code %lld (token %lld col %lld) is %d, matvec_prepare's %d (out %.9g)", what,
                          (long long)bad, (long long)(bad / C), (long long)(bad % C), (int)(int8_t)gxp2[bad],
                          (int)(int8_t)gxp1[bad], gout1[bad]);
                    bad = first_diff(gxp2 + n, gxp1 + n, pb - (size_t)n);
                    if (bad >= 0) {
                        const int64_t blk = bad / 8; /* float2 {d, d * sum} per block of 32 */
                        float a[2], r[2];
                        memcpy(a, gxp2 + n + 8 * blk, 8), memcpy(r, gxp1 + n + 8 * blk, 8);
                        CHECK(0, "%s: scales of block %lld (token %lld, cols %lld..) are {%.9g, %.9g}, matvec_prepare's {%.9g, %.9g}",
                              what, (long long)blk, (long long)(blk / (C / 32)), (long long)(blk % (C / 32) * 32), a[0], a[1],
                              r[0], r[1]);
                    }
                    release_all();
                }
}

/* The contract's refusals, each before anything runs: x keeps its bytes and xp its poison. */
static void test_residual_norm_xp_errors(void) {
    release_all();
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    enum { T = 33, C = 96 };
    unsigned long long rng = 707;
    float *x = host(T * C * 4), *got = host(T * C * 4);
    fill(x, T * C, 2.0f, &rng);
    const size_t pb = kiln_cuda_matvec_prep_bytes(T, C);
    uint8_t *gxp = host(pb), *poisoned = host(pb);
    memset(poisoned, 0xff, pb);
    float *dx = dev(T * C * 4), *dy = dev(T * C * 4), *dout = dev(T * C * 4), *dw = dev(C * 4);
    uint8_t *dxp = dev(pb + 16);
    CHECK(dx && dy && dout && dw && dxp);
    CHECK(kiln_cuda_upload(dx, x, T * C * 4) == KILN_OK && kiln_cuda_upload(dy, x, T * C * 4) == KILN_OK &&
          kiln_cuda_upload(dw, x, C * 4) == KILN_OK && poison(dxp, pb) == KILN_OK, "%s", kiln_last_error());
    struct {
        const char *what;
        float *out;
        void *xp;
        const float *w;
        int64_t T, C;
    } bad[] = {
        {"T 33 > KILN_CUDA_GEMM_SMALL_MAX_T", dout, dxp, dw, 33, 64},
        {"C 48 not a multiple of 32", dout, dxp, dw, 1, 48},
        {"C 100 not a multiple of 32", dout, dxp, dw, 2, 100},
        {"out NULL", NULL, dxp, dw, 1, 64},
        {"xp NULL", dout, NULL, dw, 1, 64},
        {"xp not 16-byte aligned", dout, dxp + 4, dw, 1, 64},
        {"w NULL", dout, dxp, NULL, 1, 64},
        {"T < 0", dout, dxp, dw, -1, 64},
        {"C 0", dout, dxp, dw, 1, 0},
    };
    for (int i = 0; i < COUNT(bad); i++) {
        kiln_status s = kiln_cuda_residual_norm_xp(dx, dy, NULL, 1e-5f, bad[i].out, bad[i].xp, bad[i].w, 1e-6f, bad[i].T,
                                                   bad[i].C, NULL);
        CHECK(s == KILN_ERR_INVALID, "residual_norm_xp with %s: status %d, want KILN_ERR_INVALID", bad[i].what, (int)s);
    }
    CHECK(kiln_cuda_residual_norm(dx, dy, NULL, 1e-5f, dout, NULL, 1e-6f, 1, 64, NULL) == KILN_ERR_INVALID,
          "residual_norm with out but no w");
    CHECK(kiln_cuda_sync() == KILN_OK && kiln_cuda_download(got, dx, T * C * 4) == KILN_OK &&
          kiln_cuda_download(gxp, dxp, pb) == KILN_OK, "%s", kiln_last_error());
    CHECK(memcmp(got, x, T * C * 4) == 0, "a refused call modified x (first differing byte %lld)",
          (long long)first_diff(got, x, T * C * 4));
    CHECK(memcmp(gxp, poisoned, pb) == 0, "a refused call wrote xp (first written byte %lld)",
          (long long)first_diff(gxp, poisoned, pb));
    release_all();
}

/* ---------------------------------------------------------------- qkv_post */

typedef struct {
    int64_t T, NH, NKV, HS, rope_dim;
    bool neox, nope, bias, norm;
    float q_scale, base;
    int64_t rows, pos0;
    bool scaled; /* a RoPE scaling table (random multipliers in 0.1..1.1) and mscale 1.25, against the CPU's */
} qkv_case;

static void test_qkv_post(void) {
    release_all();
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    static const qkv_case cases[] = {
        /* T NH NKV HS rope  neox   nope   bias   norm   q_scale base     rows  pos0  scaled */
        {1, 8, 2, 64, 64, false, false, false, false, 1.0f, 10000.0f, 4096, 5, false},
        {5, 4, 4, 128, 128, true, false, true, true, 0.5f, 1e6f, 1024, 100000, false},     /* ring row = p % rows */
        {64, 16, 8, 256, 128, true, false, false, true, 1.0f, 10000.0f, 80, 1000, false}, /* partial rope, ring wraps in batch */
        {5, 6, 2, 80, 80, false, true, true, false, 1.0f, 10000.0f, 16, 30, false},       /* nope, HS 80 */
        {64, 8, 1, 128, 64, false, false, true, true, 0.125f, 500000.0f, 8192, 0, false}, /* interleaved partial rope */
        {1, 4, 2, 256, 256, false, false, true, true, 0.0625f, 10000.0f, 512, 99999, false},
        {1, 32, 8, 128, 128, true, false, false, false, 1.0f, 500000.0f, 8192, 100000, false},
        {5, 2, 2, 64, 32, true, false, false, true, 2.0f, 10000.0f, 7, 3, false}, /* a 7-row ring: positions 3..7 -> 3,4,5,6,0 */
        {5, 4, 2, 128, 128, false, false, false, false, 1.0f, 500000.0f, 65536, 60000, true}, /* scaled, interleaved */
        {64, 8, 4, 256, 256, true, false, true, true, 1.0f, 1e6f, 128, 30000, true},         /* scaled NeoX, 128 pairs */
        {1, 4, 2, 96, 64, true, false, false, false, 1.0f, 10000.0f, 512, 300, true},        /* scaled, partial rope */
    };
    unsigned long long rng = 303;
    char msg[512], what[256];
    kiln_ops_ctx ctx = cpu_ctx();
    const float eps = 1e-6f;
    for (int ci = 0; ci < COUNT(cases); ci++) {
        const qkv_case *c = &cases[ci];
        const int64_t T = c->T, Q = c->NH * c->HS, KV = c->NKV * c->HS;
        float *q = host((size_t)(T * Q) * 4), *k = host((size_t)(T * KV) * 4), *v = host((size_t)(T * KV) * 4);
        float *bq = host((size_t)Q * 4), *bk = host((size_t)KV * 4), *bv = host((size_t)KV * 4);
        float *qn = host((size_t)c->HS * 4), *kn = host((size_t)c->HS * 4);
        fill(q, T * Q, 2.0f, &rng), fill(k, T * KV, 2.0f, &rng), fill(v, T * KV, 2.0f, &rng);
        fill(bq, Q, 0.5f, &rng), fill(bk, KV, 0.5f, &rng), fill(bv, KV, 0.5f, &rng);
        fill(qn, c->HS, 1.5f, &rng), fill(kn, c->HS, 1.5f, &rng);
        /* the reference: llama.c's sequence, bias -> qk norm -> rope -> q scale -> f16 rows p % rows */
        float *rq = host((size_t)(T * Q) * 4), *rk = host((size_t)(T * KV) * 4), *rv = host((size_t)(T * KV) * 4);
        memcpy(rq, q, (size_t)(T * Q) * 4), memcpy(rk, k, (size_t)(T * KV) * 4), memcpy(rv, v, (size_t)(T * KV) * 4);
        int32_t *pos = host((size_t)T * 4);
        for (int64_t t = 0; t < T; t++) pos[t] = (int32_t)(c->pos0 + t);
        if (c->bias) {
            kiln_cpu_ops.add_bias_forward(&ctx, rq, bq, T, Q);
            kiln_cpu_ops.add_bias_forward(&ctx, rk, bk, T, KV);
            kiln_cpu_ops.add_bias_forward(&ctx, rv, bv, T, KV);
        }
        if (c->norm) {
            kiln_cpu_ops.rmsnorm_forward(&ctx, rq, rq, qn, T * c->NH, c->HS, eps);
            kiln_cpu_ops.rmsnorm_forward(&ctx, rk, rk, kn, T * c->NKV, c->HS, eps);
        }
        float *freq = NULL;
        const float mscale = c->scaled ? 1.25f : 1.0f;
        if (c->scaled) {
            freq = host((size_t)(c->rope_dim / 2) * 4);
            fill(freq, c->rope_dim / 2, 0.5f, &rng);
            for (int64_t i = 0; i < c->rope_dim / 2; i++) freq[i] += 0.6f; /* 0.1..1.1 */
        }
        if (!c->nope) {
            kiln_cpu_ops.rope_forward(&ctx, rq, pos, T, c->NH, c->HS, c->rope_dim, c->base, freq, mscale, c->neox);
            kiln_cpu_ops.rope_forward(&ctx, rk, pos, T, c->NKV, c->HS, c->rope_dim, c->base, freq, mscale, c->neox);
        }
        if (c->q_scale != 1.0f) kiln_cpu_ops.scale_softcap_forward(&ctx, rq, T * Q, c->q_scale, 0.0f);
        const size_t cache_bytes = (size_t)(c->rows * KV) * 2;
        uint16_t *rkc = host(cache_bytes), *rvc = host(cache_bytes), *gkc = host(cache_bytes), *gvc = host(cache_bytes);
        memset(rkc, 0xff, cache_bytes), memset(rvc, 0xff, cache_bytes); /* the poison the GPU caches start with */
        for (int64_t t = 0; t < T; t++) {
            const int64_t r = (c->pos0 + t) % c->rows;
            for (int64_t i = 0; i < KV; i++) {
                rkc[r * KV + i] = kiln_f32_to_fp16(rk[t * KV + i]);
                rvc[r * KV + i] = kiln_f32_to_fp16(rv[t * KV + i]);
            }
        }
        float *dq = dev((size_t)(T * Q) * 4), *dk = dev((size_t)(T * KV) * 4), *dv = dev((size_t)(T * KV) * 4);
        float *dbq = dev((size_t)Q * 4), *dbk = dev((size_t)KV * 4), *dbv = dev((size_t)KV * 4);
        float *dqn = dev((size_t)c->HS * 4), *dkn = dev((size_t)c->HS * 4);
        uint16_t *dkc = dev(cache_bytes), *dvc = dev(cache_bytes);
        int32_t *dpos0 = dev(4);
        const int32_t pos0 = (int32_t)c->pos0;
        CHECK(dq && dk && dv && dbq && dbk && dbv && dqn && dkn && dkc && dvc && dpos0);
        CHECK(kiln_cuda_upload(dq, q, (size_t)(T * Q) * 4) == KILN_OK && kiln_cuda_upload(dk, k, (size_t)(T * KV) * 4) == KILN_OK &&
              kiln_cuda_upload(dv, v, (size_t)(T * KV) * 4) == KILN_OK && kiln_cuda_upload(dbq, bq, (size_t)Q * 4) == KILN_OK &&
              kiln_cuda_upload(dbk, bk, (size_t)KV * 4) == KILN_OK && kiln_cuda_upload(dbv, bv, (size_t)KV * 4) == KILN_OK &&
              kiln_cuda_upload(dqn, qn, (size_t)c->HS * 4) == KILN_OK && kiln_cuda_upload(dkn, kn, (size_t)c->HS * 4) == KILN_OK &&
              kiln_cuda_upload(dpos0, &pos0, 4) == KILN_OK && poison(dkc, cache_bytes) == KILN_OK &&
              poison(dvc, cache_bytes) == KILN_OK, "%s", kiln_last_error());
        CHECK(kiln_cuda_qkv_post(dq, dk, dv, c->bias ? dbq : NULL, c->bias ? dbk : NULL, c->bias ? dbv : NULL,
                                 c->norm ? dqn : NULL, c->norm ? dkn : NULL, eps, dpos0, T, c->NH, c->NKV, c->HS, c->rope_dim,
                                 c->base, freq, mscale, c->neox, c->nope, c->q_scale, dkc, dvc, KILN_KV_F16, KILN_KV_F16, c->rows, NULL) == KILN_OK,
              "%s", kiln_last_error());
        float *gq = host((size_t)(T * Q) * 4), *gk_in = host((size_t)(T * KV) * 4);
        CHECK(kiln_cuda_sync() == KILN_OK && kiln_cuda_download(gq, dq, (size_t)(T * Q) * 4) == KILN_OK &&
              kiln_cuda_download(gkc, dkc, cache_bytes) == KILN_OK && kiln_cuda_download(gvc, dvc, cache_bytes) == KILN_OK &&
              kiln_cuda_download(gk_in, dk, (size_t)(T * KV) * 4) == KILN_OK, "%s", kiln_last_error());
        snprintf(what, sizeof what, "qkv_post case %d (T %lld NH %lld NKV %lld HS %lld rope_dim %lld %s%s%s%s%s pos0 %lld rows %lld)",
                 ci, (long long)T, (long long)c->NH, (long long)c->NKV, (long long)c->HS, (long long)c->rope_dim,
                 c->nope ? "nope" : c->neox ? "neox" : "interleaved", c->bias ? " bias" : "", c->norm ? " qk-norm" : "",
                 c->q_scale != 1.0f ? " q_scale" : "", c->scaled ? " rope-scaled" : "", (long long)c->pos0, (long long)c->rows);
        char qwhat[300];
        snprintf(qwhat, sizeof qwhat, "%s: q", what);
        CHECK(gpu_within(qwhat, gq, rq, T * Q, 1e-4, 1e-10, 1.0, msg, sizeof msg), "%s", msg);
        CHECK(memcmp(gk_in, k, (size_t)(T * KV) * 4) == 0, "%s: the k input was modified", what);
        CHECK(kiln_cuda_download(gk_in, dv, (size_t)(T * KV) * 4) == KILN_OK && memcmp(gk_in, v, (size_t)(T * KV) * 4) == 0,
              "%s: the v input was modified", what);
        /* caches: v bit for bit; k within one f16 step; rows no position maps to keep their poison */
        double kscale = 1.0;
        for (int64_t i = 0; i < T * KV; i++) kscale = fabs(rk[i]) > kscale ? fabs(rk[i]) : kscale;
        for (int64_t i = 0; i < c->rows * KV; i++) {
            const int64_t r = i / KV, col = i % KV;
            CHECK(gvc[i] == rvc[i], "%s: v cache row %lld col %lld: gpu 0x%04x ref 0x%04x", what, (long long)r, (long long)col,
                  gvc[i], rvc[i]);
            if (rkc[i] == 0xffff) {
                CHECK(gkc[i] == 0xffff, "%s: k cache row %lld (no position of this batch) was written", what, (long long)r);
                continue;
            }
            const float g = kiln_fp16_to_f32(gkc[i]), rf = kiln_fp16_to_f32(rkc[i]);
            CHECK(fabsf(g - rf) <= 1e-3f * fabsf(rf) + 1e-4f * (float)kscale,
                  "%s: k cache row %lld col %lld: gpu %.6g ref %.6g", what, (long long)r, (long long)col, g, rf);
        }
        release_all();
    }
}

/* ---------------------------------------------------------------- glu, sigmoid_mul, scale_softcap */

static void test_activations(void) {
    release_all();
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    static const int64_t ns[] = {1, 3, 1000, 4099, 64 * 5120 + 3};
    unsigned long long rng = 404;
    char msg[512], what[160];
    kiln_ops_ctx ctx = cpu_ctx();
    for (int ni = 0; ni < COUNT(ns); ni++)
        for (int off = 0; off < 2; off++) { /* off 1: pointers one float past 16-byte alignment, the scalar path */
            const int64_t n = ns[ni];
            const size_t bytes = (size_t)(n + 1) * 4;
            float *a = host(bytes), *b = host(bytes), *ref = host(bytes), *got = host(bytes);
            fill(a, n + 1, 6.0f, &rng), fill(b, n + 1, 2.0f, &rng);
            float *da = dev(bytes), *db = dev(bytes), *dout = dev(bytes);
            CHECK(da && db && dout);
            for (int op = 0; op < 6; op++) {
                /* 0 swiglu, 1 geglu, 2 swiglu in place (out == gate), 3 sigmoid_mul, 4 scale, 5 softcap */
                static const char *names[] = {"swiglu", "geglu", "swiglu out==gate", "sigmoid_mul", "scale", "softcap 30"};
                CHECK(kiln_cuda_upload(da, a, bytes) == KILN_OK && kiln_cuda_upload(db, b, bytes) == KILN_OK &&
                      poison(dout, bytes) == KILN_OK);
                memcpy(ref, a, bytes);
                kiln_status s;
                float *dres = da + off;
                switch (op) {
                case 0:
                case 2:
                    kiln_cpu_ops.swiglu_forward(&ctx, ref + off, a + off, b + off, n);
                    dres = op == 0 ? dout + off : da + off;
                    s = kiln_cuda_glu(dres, da + off, db + off, n, false, NULL);
                    break;
                case 1:
                    kiln_cpu_ops.geglu_forward(&ctx, ref + off, a + off, b + off, n);
                    dres = dout + off;
                    s = kiln_cuda_glu(dres, da + off, db + off, n, true, NULL);
                    break;
                case 3:
                    kiln_cpu_ops.sigmoid_mul_forward(&ctx, ref + off, b + off, n);
                    s = kiln_cuda_sigmoid_mul(da + off, db + off, n, NULL);
                    break;
                case 4:
                    kiln_cpu_ops.scale_softcap_forward(&ctx, ref + off, n, 0.0883883f, 0.0f);
                    s = kiln_cuda_scale_softcap(da + off, n, 0.0883883f, 0.0f, NULL);
                    break;
                default:
                    kiln_cpu_ops.scale_softcap_forward(&ctx, ref + off, n, 7.5f, 30.0f);
                    s = kiln_cuda_scale_softcap(da + off, n, 7.5f, 30.0f, NULL);
                    break;
                }
                CHECK(s == KILN_OK, "%s: %s", names[op], kiln_last_error());
                CHECK(kiln_cuda_sync() == KILN_OK && kiln_cuda_download(got + off, dres, (size_t)n * 4) == KILN_OK, "%s",
                      kiln_last_error());
                snprintf(what, sizeof what, "%s n %lld%s", names[op], (long long)n, off ? " (unaligned)" : "");
                CHECK(gpu_within(what, got + off, ref + off, n, 1e-5, 1e-11, 0.0, msg, sizeof msg), "%s", msg);
            }
            release_all();
        }
}

/* ---------------------------------------------------------------- argmax */

static int32_t argmax_ref(const float *x, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return (int32_t)best;
}

static void test_argmax(void) {
    release_all();
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    static const int64_t ns[] = {1, 7, 1000, 32000, 151936, 256000, 262145}; /* 7 and 262145: the scalar path */
    static const int64_t Ts[] = {1, 3, 8};
    unsigned long long rng = 505;
    for (int ni = 0; ni < COUNT(ns); ni++)
        for (int ti = 0; ti < COUNT(Ts); ti++) {
            const int64_t n = ns[ni], T = Ts[ti];
            float *x = host((size_t)(T * n) * 4);
            int32_t *ref = host((size_t)T * 4), *got = host((size_t)T * 4);
            for (int64_t t = 0; t < T; t++) {
                float *r = x + t * n;
                fill(r, n, 10.0f, &rng);
                /* row kinds: t % 4 == 0 random; 1 the max at the last index; 2 ties of the max at three places;
                 * 3 every value equal (answer 0) */
                const int kind = (int)((t + ni) % 4);
                if (kind == 1) r[n - 1] = 20.0f;
                if (kind == 2 && n > 2) {
                    const int64_t a = (int64_t)(test_rng_next(&rng) % (uint64_t)n), b = n - 1, c = a / 2;
                    r[a] = r[b] = r[c] = 25.0f;
                }
                if (kind == 3)
                    for (int64_t i = 0; i < n; i++) r[i] = -3.5f;
                ref[t] = argmax_ref(r, n);
            }
            float *dx = dev((size_t)(T * n) * 4);
            int32_t *dout = dev((size_t)T * 4);
            CHECK(dx && dout && kiln_cuda_upload(dx, x, (size_t)(T * n) * 4) == KILN_OK && poison(dout, (size_t)T * 4) == KILN_OK);
            CHECK(kiln_cuda_argmax(dout, dx, T, n, NULL) == KILN_OK, "%s", kiln_last_error());
            CHECK(kiln_cuda_sync() == KILN_OK && kiln_cuda_download(got, dout, (size_t)T * 4) == KILN_OK, "%s", kiln_last_error());
            for (int64_t t = 0; t < T; t++)
                CHECK(got[t] == ref[t], "argmax T %lld n %lld row %lld: gpu %d (%.9g) ref %d (%.9g)", (long long)T, (long long)n,
                      (long long)t, got[t], got[t] >= 0 && got[t] < n ? x[t * n + got[t]] : NAN, ref[t], x[t * n + ref[t]]);
            release_all();
        }
}

int main(void) {
    if (kiln_pool_create(1, &pool) != KILN_OK) return 1;
    RUN(test_embed);
    RUN(test_residual_norm);
    RUN(test_residual_norm_xp);
    RUN(test_residual_norm_xp_errors);
    RUN(test_qkv_post);
    RUN(test_activations);
    RUN(test_argmax);
    release_all();
    kiln_pool_free(pool);
    TEST_EXIT();
}

#else

static void test_cuda_elementwise(void) { SKIP("kiln built without CUDA"); }

int main(void) {
    RUN(test_cuda_elementwise);
    TEST_EXIT();
}

#endif
