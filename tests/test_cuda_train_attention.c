/* test_cuda_train_attention.c: src/cuda/train_attention.cu (kiln_cuda_attention_forward_train / _backward) against the
 * CPU oracle kiln_cpu_ops.attention_forward_train / attention_backward (src/cpu/ops_attention.c) on fresh seeded
 * random inputs: q, k, v and dout normal(0, 1) rounded to bf16 (the GPU reads the packed bf16 qkv; the CPU gets
 * the same values as f32). Every GPU output is poisoned with 0xFF bytes (NaN) first, so an element left unwritten
 * fails. Shapes (B, T, NH, NKV, HS): odd T (7, 300, 200, 40: tails of every tile size), GQA groups of 1, 2, 3 and
 * no grouping, head sizes 8 .. 256 (200 = 25 pieces of 8 lanes: lanes past the head idle); for the tensor-core
 * path (HS 64 and 128) T 1, 63, 64, 65, 200, 1024 (tails of the 64-row tiles and of the 32-row ones at HS 128),
 * groups of 1 and 3, B 1 .. 3.
 * Bounds, CUDA-core path (every other HS; scale = max |reference|):
 *   out (bf16 vs the CPU's f32)  max-abs <= 4e-3 * scale: one bf16 rounding (2^-9 = 1.95e-3 relative) plus the
 *                                f32 sums' order (~1e-6); NMSE <= 1e-5 (a rounding error uniform in +-2^-9
 *                                relative gives ~1.3e-6, at most 2^-18 = 3.8e-6)
 *   lse (f32)                    |gpu - cpu| <= 1e-5 * max(1, |cpu|): only expf/logf ulps and the sums' order
 *   dq, dk, dv (f32)             NMSE <= 1e-5, max-abs <= 1e-4 * scale. The CPU backward is given the GPU's own
 *                                bf16 out (as f32) for D = rowsum(dout * out), so the bf16 rounding of out is the
 *                                same on both sides and what remains is f32 summation order and the lse's ulps
 *                                (each ~1e-7 relative: NMSE ~1e-13 expected)
 * Bounds, tensor-core path (HS 64, 128): the scores are exact bf16 products summed in f32 (lse as above), but P
 * (in out = P V / l and dv = P^T dout) and dS (in dq = dS K, dk = dS^T q) are each rounded once to bf16 as mma
 * operands, a relative error uniform in +-2^-9 per term, so 2^-18 / 3 = 1.3e-6 of NMSE for a sum of independent
 * terms (q, k, v, dout are independent random here: no cancellation to amplify it):
 *   out                          NMSE <= 2e-5 (1.3e-6 from P plus 1.3e-6 from out's own rounding, x7 margin);
 *                                max-abs <= 8e-3 * scale (out's rounding 2^-9 plus ~5 sigma of P's, 5 * 1.1e-3)
 *   dq, dk, dv                   NMSE <= 1e-4 (1.3e-6 expected: the rounding of P or dS and, for dk and dq, of
 *                                the f32 dP - D difference it scales; generous because dS sums to 0 over a row, so
 *                                a row's terms partly cancel); max-abs <= 1e-2 * scale (~5 sigma, 5 * 2^-9 / sqrt 3
 *                                of a term's size, which the largest output bounds) plus 1e-5 absolute: where one
 *                                key holds all the probability (T 1, and row 0 of every sequence) the exact dS is
 *                                p (dp - D) = dp - D = 0, but dp (an mma's f32 sum of HS products) and D (the
 *                                rowdot kernel's, another order) differ by f32 rounding, ~HS^0.5 2^-24 |dout| |v|
 *                                ~ 1e-6 (6.9e-7 measured at T 1), times scale |q| or |k|; the CUDA-core path sums
 *                                both in one order and gets 0 exactly
 *   determinism                  deterministic = true (and the CUDA-core path with either flag): a second
 *                                backward gives dqkv bit for bit. deterministic = false (dq added by f32 atomics
 *                                in arrival order): both runs within the bounds above of the CPU, dk and dv still
 *                                bit for bit, and the second run's dq within the same bounds of the first's (the
 *                                '# ' line counts how many dq elements differ in their bits)
 * Paths: on a device of compute capability 9.0 (and a CUDA_ARCH=sm_90 build) the forward at HS 64 and 128 and the
 * dk/dv and dq kernels at HS 64 can run on wgmma (train_attention_wg.cu, KILN_ATTN_WG); test_attention checks every
 * shape on mma.sync (KILN_ATTN_WG=0), test_attention_wgmma the same shapes on wgmma with the same bounds (and the
 * _plain, _pipe, _dq1 and _dq_mma variants the other block shapes, KILN_ATTN_WG_DQ); test_wgmma runs the forward in
 * each wgmma block shape against the CPU and against the first shape.
 * A '# ' line prints the worst measured errors. Skips without a GPU, or when kiln was built without CUDA. */
#include "cuda/cuda.h"
#include "test.h"

#ifdef KILN_CUDA
#include "test_cuda_util.h"
#include "cpu/ops.h"
#include "cuda/train_kernels.h"
#include "fp16.h"
#include "pool.h"

#include <stdint.h>

/* A normal(0, 1) value rounded to bf16, never zero. */
static kiln_bf16 random_bf16(unsigned long long *rng) {
    float v = test_rng_normal(rng);
    if (v == 0.0f) v = 0.5f;
    return kiln_f32_to_bf16(v);
}

/* Packed bf16 qkv rows (N, Q + 2 KV) of random values, and the same values as f32 in q (N, Q), k and v (N, KV). */
static void fill_qkv(kiln_bf16 *qkv, float *q, float *k, float *v, int64_t N, int64_t Q, int64_t KV, unsigned long long *rng) {
    const int64_t W = Q + 2 * KV;
    for (int64_t n = 0; n < N; n++)
        for (int64_t e = 0; e < W; e++) {
            const kiln_bf16 b = random_bf16(rng);
            const float f = kiln_bf16_to_f32(b);
            qkv[n * W + e] = b;
            if (e < Q) q[n * Q + e] = f;
            else if (e < Q + KV) k[n * KV + e - Q] = f;
            else v[n * KV + e - Q - KV] = f;
        }
}

/* ---------------------------------------------------------------- comparison with a diagnostic */

typedef struct {
    double nmse, maxabs, scale;
    int64_t worst; /* index of the largest difference (a NaN counts as infinite) */
} diff;

static diff compare(const float *got, const float *ref, int64_t n) {
    diff d = {0, 0, 0, -1};
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = isnan(got[i]) || isinf(got[i]) ? INFINITY : fabs((double)got[i] - ref[i]);
        num += e * e, den += (double)ref[i] * ref[i];
        if (fabs(ref[i]) > d.scale) d.scale = fabs(ref[i]);
        if (e > d.maxabs || d.worst < 0) d.maxabs = e, d.worst = i;
    }
    d.nmse = den > 0 ? num / den : num;
    return d;
}

/* True when within bounds; otherwise msg says where: the element's (token, head, dim) for rows of heads of HS. */
static int within(const char *what, const float *got, const float *ref, int64_t n, int64_t heads, int64_t HS,
                  double rel_maxabs, double abs_floor, double nmse_bound, double *worst_nmse, char *msg, size_t msg_n) {
    diff d = compare(got, ref, n);
    if (d.nmse > *worst_nmse) *worst_nmse = d.nmse;
    if (d.maxabs <= rel_maxabs * d.scale + abs_floor && d.nmse <= nmse_bound) return 1;
    const int64_t w = d.worst, row = heads * HS;
    snprintf(msg, msg_n, "%s: nmse %.3g (bound %.3g), max-abs %.3g (bound %.3g = %.3g * scale %.3g + %.3g) at %lld (row %lld head %lld dim %lld): gpu %.9g cpu %.9g",
             what, d.nmse, nmse_bound, d.maxabs, rel_maxabs * d.scale + abs_floor, rel_maxabs, d.scale, abs_floor, (long long)w,
             (long long)(w / row), (long long)(w % row / HS), (long long)(w % HS), got[w], ref[w]);
    return 0;
}

static kiln_pool *pool;

typedef struct {
    int64_t B, T, NH, NKV, HS;
} shape;

static const shape shapes[] = {
    {1, 7, 2, 1, 8},      /* one partial tile of everything; the smallest head (one lane a row) */
    {2, 64, 4, 2, 64},    /* two sequences, groups of 2 */
    {1, 300, 6, 2, 64},   /* many key tiles, a tail of 12 rows; groups of 3 */
    {2, 128, 12, 4, 64},  /* groups of 3, exact tiles */
    {1, 200, 4, 4, 128},  /* no grouping */
    {1, 40, 2, 1, 256},   /* the widest head: 8 query rows a block, 5 blocks */
    {1, 33, 3, 1, 200},   /* HS 200: 25 of 32 lanes a row live; T one past a 32-key tile */
    {2, 19, 2, 2, 40},    /* HS 40: 5 of 8 lanes live */
    {1, 70, 6, 2, 96},    /* HS 96: the CUDA-core kernel laid out for 128 (64 and 128 themselves take tensor cores) */
    /* the tensor-core path: 64-row query and key tiles (32-row key / query tiles at HS 128 in the backward) */
    {1, 1, 3, 1, 64},     /* one row: a single masked tile, groups of 3 */
    {3, 63, 2, 2, 64},    /* one tile short by one, three sequences, no grouping */
    {2, 65, 6, 2, 64},    /* one past a tile: a second tile of one row */
    {1, 1024, 3, 1, 64},  /* the benchmark's T: 16 tiles, every tile pair on and off the diagonal */
    {3, 1, 2, 2, 128},
    {2, 63, 3, 1, 128},
    {1, 64, 2, 2, 128},   /* exact: the diagonal tile alone */
    {2, 65, 3, 1, 128},
    {3, 200, 6, 2, 128},  /* 200 = 3 x 64 + 8 = 6 x 32 + 8 */
    {1, 1024, 2, 2, 128},
};

/* The tensor-core path takes these head sizes (train_attention.cu): its bounds are the looser ones. */
static int tensor_core_hs(int64_t HS) { return HS == 64 || HS == 128; }

static void attention_checks(void) {
    release_all();
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    unsigned long long rng = 808;
    char msg[768], what[160];
    double worst_out[2] = {0, 0}, worst_lse = 0; /* [tensor-core path] */
    double worst_d[3][3] = {{0}}; /* [CUDA cores, tensor cores deterministic, tensor cores atomic dq][dq, dk, dv] */
    double worst_rerun = 0;       /* atomic dq: max |run 2 - run 1| / max |run 1| */
    int64_t atomic_differ = 0, atomic_total = 0;
    for (int c = 0; c < COUNT(shapes); c++) {
        const shape s = shapes[c];
        const int tc = tensor_core_hs(s.HS);
        const double out_max = tc ? 8e-3 : 4e-3, out_nmse = tc ? 2e-5 : 1e-5, d_max = tc ? 1e-2 : 1e-4, d_nmse = tc ? 1e-4 : 1e-5;
        const double d_floor = tc ? 1e-5 : 0; /* dq, dk where the exact gradient is 0: the header's floor */
        const int64_t N = s.B * s.T, Q = s.NH * s.HS, KV = s.NKV * s.HS, W = Q + 2 * KV, nl = s.B * s.NH * s.T;
        /* host inputs: packed bf16 qkv and dout; the same values as f32 for the CPU */
        kiln_bf16 *qkv = host((size_t)(N * W) * 2), *dout_bf = host((size_t)(N * Q) * 2);
        float *q = host((size_t)(N * Q) * 4), *k = host((size_t)(N * KV) * 4), *v = host((size_t)(N * KV) * 4);
        float *dout = host((size_t)(N * Q) * 4);
        fill_qkv(qkv, q, k, v, N, Q, KV, &rng);
        for (int64_t i = 0; i < N * Q; i++) dout[i] = kiln_bf16_to_f32(dout_bf[i] = random_bf16(&rng));

        /* the CPU forward */
        const size_t scratch = kiln_cpu_ops.train_scratch_size(s.B, s.T, Q, s.NH, 1, kiln_pool_size(pool));
        kiln_ops_ctx ctx = {.pool = pool, .scratch = host(scratch), .scratch_bytes = scratch};
        float *out_ref = host((size_t)(N * Q) * 4), *lse_ref = host((size_t)nl * 4);
        kiln_cpu_ops.attention_forward_train(&ctx, out_ref, lse_ref, q, k, v, s.B, s.T, s.NH, s.NKV, s.HS);

        /* the GPU forward */
        kiln_bf16_t *d_qkv = dev((size_t)(N * W) * 2), *d_out = dev((size_t)(N * Q) * 2), *d_dout = dev((size_t)(N * Q) * 2);
        float *d_lse = dev((size_t)nl * 4), *d_dqkv = dev((size_t)(N * W) * 4);
        const size_t ws_bytes = kiln_cuda_attention_backward_ws_bytes(s.B, s.T, s.NH);
        void *d_ws = dev(ws_bytes);
        CHECK(d_qkv && d_out && d_dout && d_lse && d_dqkv && d_ws, "%s", kiln_last_error());
        CHECK(ws_bytes >= (size_t)nl * 4, "ws_bytes %zu < %lld floats of D", ws_bytes, (long long)nl);
        CHECK(kiln_cuda_upload(d_qkv, qkv, (size_t)(N * W) * 2) == KILN_OK &&
              kiln_cuda_upload(d_dout, dout_bf, (size_t)(N * Q) * 2) == KILN_OK, "%s", kiln_last_error());
        CHECK(poison(d_out, (size_t)(N * Q) * 2) == KILN_OK && poison(d_lse, (size_t)nl * 4) == KILN_OK);
        CHECK(kiln_cuda_attention_forward_train(d_out, d_lse, d_qkv, s.B, s.T, s.NH, s.NKV, s.HS, NULL) == KILN_OK, "%s",
              kiln_last_error());
        kiln_bf16 *out_bf = host((size_t)(N * Q) * 2);
        float *out = host((size_t)(N * Q) * 4), *lse = host((size_t)nl * 4);
        CHECK(kiln_cuda_sync() == KILN_OK && kiln_cuda_download(out_bf, d_out, (size_t)(N * Q) * 2) == KILN_OK &&
              kiln_cuda_download(lse, d_lse, (size_t)nl * 4) == KILN_OK, "%s", kiln_last_error());
        for (int64_t i = 0; i < N * Q; i++) out[i] = kiln_bf16_to_f32(out_bf[i]);
        char sh[96];
        snprintf(sh, sizeof sh, "B %lld T %lld NH %lld NKV %lld HS %lld", (long long)s.B, (long long)s.T, (long long)s.NH, (long long)s.NKV, (long long)s.HS);
        snprintf(what, sizeof what, "attention_forward %s: out", sh);
        CHECK(within(what, out, out_ref, N * Q, s.NH, s.HS, out_max, 0, out_nmse, &worst_out[tc], msg, sizeof msg), "%s", msg);
        for (int64_t i = 0; i < nl; i++) {
            const double e = isnan(lse[i]) ? INFINITY : fabs((double)lse[i] - lse_ref[i]), rel = fmax(1.0, fabs(lse_ref[i]));
            const double bound = 1e-5 * rel;
            if (e / rel > worst_lse) worst_lse = e / rel;
            CHECK(e <= bound, "attention_forward %s: lse at %lld (b %lld head %lld t %lld): gpu %.9g cpu %.9g, |diff| %.3g > %.3g",
                  sh, (long long)i, (long long)(i / (s.NH * s.T)), (long long)(i / s.T % s.NH), (long long)(i % s.T),
                  lse[i], lse_ref[i], e, bound);
        }

        /* the CPU backward, from the GPU's bf16 out (the same D) and its own lse */
        float *dq = host((size_t)(N * Q) * 4), *dk = host((size_t)(N * KV) * 4), *dv = host((size_t)(N * KV) * 4);
        memset(dq, 0, (size_t)(N * Q) * 4), memset(dk, 0, (size_t)(N * KV) * 4), memset(dv, 0, (size_t)(N * KV) * 4);
        kiln_cpu_ops.attention_backward(&ctx, dq, dk, dv, dout, q, k, v, out, lse_ref, s.B, s.T, s.NH, s.NKV, s.HS);

        /* the GPU backward, each mode twice: deterministic (and the CUDA-core path in either mode) must give the
         * same bits; the atomic dq two results within the bounds of each other */
        float *dqkv = host((size_t)(N * W) * 4), *dqkv2 = host((size_t)(N * W) * 4);
        float *gq = host((size_t)(N * Q) * 4), *gk = host((size_t)(N * KV) * 4), *gv = host((size_t)(N * KV) * 4);
        float *gq2 = host((size_t)(N * Q) * 4);
        for (int mode = 0; mode < 2; mode++) {
            const bool det = mode == 0;
            const int path = tc ? 1 + mode : 0; /* worst_d's row */
            const char *mname = det ? "deterministic" : "atomic dq";
            for (int run = 0; run < 2; run++) {
                CHECK(poison(d_dqkv, (size_t)(N * W) * 4) == KILN_OK && poison(d_ws, ws_bytes) == KILN_OK);
                CHECK(kiln_cuda_attention_backward(d_dqkv, d_dout, d_qkv, d_out, d_lse, s.B, s.T, s.NH, s.NKV, s.HS, det, d_ws,
                                                   NULL) == KILN_OK, "%s", kiln_last_error());
                CHECK(kiln_cuda_sync() == KILN_OK && kiln_cuda_download(run ? dqkv2 : dqkv, d_dqkv, (size_t)(N * W) * 4) == KILN_OK,
                      "%s", kiln_last_error());
            }
            for (int64_t n = 0; n < N; n++) {
                memcpy(gq + n * Q, dqkv + n * W, (size_t)Q * 4);
                memcpy(gq2 + n * Q, dqkv2 + n * W, (size_t)Q * 4);
                memcpy(gk + n * KV, dqkv + n * W + Q, (size_t)KV * 4);
                memcpy(gv + n * KV, dqkv + n * W + Q + KV, (size_t)KV * 4);
            }
            snprintf(what, sizeof what, "attention_backward (%s) %s: dq", mname, sh);
            CHECK(within(what, gq, dq, N * Q, s.NH, s.HS, d_max, d_floor, d_nmse, &worst_d[path][0], msg, sizeof msg), "%s", msg);
            snprintf(what, sizeof what, "attention_backward (%s) %s: dk", mname, sh);
            CHECK(within(what, gk, dk, N * KV, s.NKV, s.HS, d_max, d_floor, d_nmse, &worst_d[path][1], msg, sizeof msg), "%s", msg);
            snprintf(what, sizeof what, "attention_backward (%s) %s: dv", mname, sh);
            CHECK(within(what, gv, dv, N * KV, s.NKV, s.HS, d_max, d_floor, d_nmse, &worst_d[path][2], msg, sizeof msg), "%s", msg);
            if (det || !tc) {
                int64_t bad = -1;
                for (int64_t i = 0; i < N * W && bad < 0; i++)
                    if (memcmp(&dqkv[i], &dqkv2[i], 4)) bad = i;
                CHECK(bad < 0, "attention_backward (%s) %s: not deterministic: dqkv element %lld (row %lld col %lld) %.9g then %.9g",
                      mname, sh, (long long)bad, (long long)(bad / W), (long long)(bad % W), dqkv[bad], dqkv2[bad]);
            } else {
                /* dk, dv are written once in a fixed order even here: only dq may move */
                int64_t bad = -1, differ = 0;
                for (int64_t n = 0; n < N; n++)
                    for (int64_t e = Q; e < W; e++)
                        if (bad < 0 && memcmp(&dqkv[n * W + e], &dqkv2[n * W + e], 4)) bad = n * W + e;
                CHECK(bad < 0, "attention_backward (%s) %s: dk/dv not deterministic at dqkv element %lld", mname, sh, (long long)bad);
                for (int64_t i = 0; i < N * Q; i++) differ += memcmp(&gq[i], &gq2[i], 4) != 0;
                atomic_differ += differ, atomic_total += N * Q;
                double rerun_nmse = 0;
                snprintf(what, sizeof what, "attention_backward (%s) %s: dq run 2 vs run 1", mname, sh);
                CHECK(within(what, gq2, gq, N * Q, s.NH, s.HS, d_max, d_floor, d_nmse, &rerun_nmse, msg, sizeof msg), "%s", msg);
                const diff rr = compare(gq2, gq, N * Q);
                if (rr.scale > 0 && rr.maxabs / rr.scale > worst_rerun) worst_rerun = rr.maxabs / rr.scale;
            }
        }
        release_all();
    }
    printf("# train attention, CUDA cores: worst NMSE out %.2e (bound 1e-5), dq %.2e dk %.2e dv %.2e (bound 1e-5)\n",
           worst_out[0], worst_d[0][0], worst_d[0][1], worst_d[0][2]);
    printf("# train attention, tensor cores (HS 64, 128): worst NMSE out %.2e (bound 2e-5); backward, bound 1e-4: "
           "deterministic dq %.2e dk %.2e dv %.2e, atomic dq: dq %.2e dk %.2e dv %.2e\n",
           worst_out[1], worst_d[1][0], worst_d[1][1], worst_d[1][2], worst_d[2][0], worst_d[2][1], worst_d[2][2]);
    printf("# train attention, atomic dq: %lld of %lld dq elements differ between two runs, worst max-abs / scale %.2e\n",
           (long long)atomic_differ, (long long)atomic_total, worst_rerun);
    printf("# train attention: worst lse rel %.2e (bound 1e-5); HS 64 on %s, HS 128's forward on %s\n", worst_lse,
           kiln_cuda_attention_wgmma(64) ? "wgmma" : "mma.sync", kiln_cuda_attention_wgmma(128) ? "wgmma" : "mma.sync");
}

/* Runs f with the environment variable name set to value (NULL: unset), then restores it, whether f passed or not. */
static void with_env(const char *name, const char *value, void (*f)(void)) {
    const char *saved = getenv(name);
    char *keep = saved ? strdup(saved) : NULL;
    if (value) setenv(name, value, 1);
    else unsetenv(name);
    f();
    if (keep) setenv(name, keep, 1), free(keep);
    else unsetenv(name);
}
static void with_attn_wg(const char *value, void (*f)(void)) { with_env("KILN_ATTN_WG", value, f); }

/* Every shape on mma.sync (KILN_ATTN_WG 0), then on wgmma (KILN_ATTN_WG 1: the forward at HS 64 and 128, the dk/dv
 * kernel at 64) where
 * this build and device have it, with the same bounds: both paths stay tested whichever is the default. */
static void test_attention(void) { with_attn_wg("0", attention_checks); }

static bool wgmma_here(void) {
    const char *saved = getenv("KILN_ATTN_WG");
    char *keep = saved ? strdup(saved) : NULL;
    setenv("KILN_ATTN_WG", "1", 1);
    const bool on = kiln_cuda_attention_wgmma(64);
    if (keep) setenv("KILN_ATTN_WG", keep, 1), free(keep);
    else unsetenv("KILN_ATTN_WG");
    return on;
}

static void test_attention_wgmma(void) {
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    if (!wgmma_here()) SKIP("no wgmma kernels here (they need a device of compute capability 9.0 and a CUDA_ARCH=sm_90 build)");
    with_attn_wg("1", attention_checks);
}
/* The same on the plain wgmma kernels (KILN_ATTN_WG 2x64; the default pipelines the dk/dv kernel). */
static void test_attention_wgmma_plain(void) {
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    if (!wgmma_here()) SKIP("no wgmma kernels here (they need a device of compute capability 9.0 and a CUDA_ARCH=sm_90 build)");
    with_attn_wg("2x64", attention_checks);
}
/* The default wgmma kernels with the deterministic backward's dq kernel in its other shapes (KILN_ATTN_WG_DQ): one
 * warpgroup a block (the default is two), and the mma.sync dq kernel after the wgmma dk/dv kernel. */
static void wgmma_default_checks(void) { with_attn_wg("1", attention_checks); }
static void test_attention_wgmma_dq1(void) {
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    if (!wgmma_here()) SKIP("no wgmma kernels here (they need a device of compute capability 9.0 and a CUDA_ARCH=sm_90 build)");
    with_env("KILN_ATTN_WG_DQ", "1", wgmma_default_checks);
}
static void test_attention_wgmma_dq_mma(void) {
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    if (!wgmma_here()) SKIP("no wgmma kernels here (they need a device of compute capability 9.0 and a CUDA_ARCH=sm_90 build)");
    with_env("KILN_ATTN_WG_DQ", "0", wgmma_default_checks);
}
/* The same on the pipelined wgmma kernels (KILN_ATTN_WG 2x64p: the next S in flight during the softmax in the
 * forward, dP^T in flight during P^T and dV in the dk/dv kernel). */
static void test_attention_wgmma_pipe(void) {
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    if (!wgmma_here()) SKIP("no wgmma kernels here (they need a device of compute capability 9.0 and a CUDA_ARCH=sm_90 build)");
    with_attn_wg("2x64p", attention_checks);
}

/* The forward on wgmma (train_attention_wg.cu, head sizes 64 and 128 on compute capability 9.0) in each of its block
 * shapes (KILN_ATTN_WG = warpgroups x key-tile rows; HS 128 takes key tiles of 64 in either; a p: the pipelined
 * kernel, which must give the plain shape's bits) and the mma.sync kernel (KILN_ATTN_WG 0), over every shape of HS 64
 * and 128:
 * each within the tensor-core bounds of the CPU oracle (out, lse), and the two paths' outputs within two bf16
 * roundings of each other (they differ only in the order of their f32 sums, then in the rounding of P). */
static void wgmma_checks(void) {
    release_all();
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    if (!wgmma_here()) SKIP("no wgmma kernels here (they need a device of compute capability 9.0 and a CUDA_ARCH=sm_90 build)");
    static const char *cfgs[] = {"2x64", "2x128", "3x64", "3x128", "2x64p", "3x64p", "0"};
    /* the plain shape whose bits each pipelined one must give: HS 128 runs 3x64p as 2x64p */
    const int same_as[2][COUNT(cfgs)] = {{-1, -1, -1, -1, 0, 2, -1}, {-1, -1, -1, -1, 0, 0, -1}};
    unsigned long long rng = 909;
    char msg[768], what[200];
    double worst_out = 0, worst_pair = 0, worst_lse = 0;
    for (int c = 0; c < COUNT(shapes); c++) {
        const shape s = shapes[c];
        if (!tensor_core_hs(s.HS)) continue;
        release_all(); /* the last shape's buffers (the tracked host and device buffers are 64 each) */
        const int64_t N = s.B * s.T, Q = s.NH * s.HS, KV = s.NKV * s.HS, W = Q + 2 * KV, nl = s.B * s.NH * s.T;
        kiln_bf16 *qkv = host((size_t)(N * W) * 2);
        float *q = host((size_t)(N * Q) * 4), *k = host((size_t)(N * KV) * 4), *v = host((size_t)(N * KV) * 4);
        fill_qkv(qkv, q, k, v, N, Q, KV, &rng);
        const size_t scratch = kiln_cpu_ops.train_scratch_size(s.B, s.T, Q, s.NH, 1, kiln_pool_size(pool));
        kiln_ops_ctx ctx = {.pool = pool, .scratch = host(scratch), .scratch_bytes = scratch};
        float *out_ref = host((size_t)(N * Q) * 4), *lse_ref = host((size_t)nl * 4);
        kiln_cpu_ops.attention_forward_train(&ctx, out_ref, lse_ref, q, k, v, s.B, s.T, s.NH, s.NKV, s.HS);
        kiln_bf16_t *d_qkv = dev((size_t)(N * W) * 2), *d_out = dev((size_t)(N * Q) * 2);
        float *d_lse = dev((size_t)nl * 4);
        CHECK(d_qkv && d_out && d_lse, "%s", kiln_last_error());
        CHECK(kiln_cuda_upload(d_qkv, qkv, (size_t)(N * W) * 2) == KILN_OK, "%s", kiln_last_error());
        kiln_bf16 *out_bf = host((size_t)(N * Q) * 2);
        float *out[COUNT(cfgs)], *lses[COUNT(cfgs)];
        for (int f = 0; f < COUNT(cfgs); f++) {
            setenv("KILN_ATTN_WG", cfgs[f], 1);
            float *lse = lses[f] = host((size_t)nl * 4);
            CHECK(kiln_cuda_attention_wgmma(s.HS) == (f < 6), "HS %lld, KILN_ATTN_WG %s: wgmma %d", (long long)s.HS, cfgs[f],
                  (int)kiln_cuda_attention_wgmma(s.HS));
            CHECK(poison(d_out, (size_t)(N * Q) * 2) == KILN_OK && poison(d_lse, (size_t)nl * 4) == KILN_OK);
            CHECK(kiln_cuda_attention_forward_train(d_out, d_lse, d_qkv, s.B, s.T, s.NH, s.NKV, s.HS, NULL) == KILN_OK, "%s",
                  kiln_last_error());
            CHECK(kiln_cuda_sync() == KILN_OK && kiln_cuda_download(out_bf, d_out, (size_t)(N * Q) * 2) == KILN_OK &&
                  kiln_cuda_download(lse, d_lse, (size_t)nl * 4) == KILN_OK, "%s", kiln_last_error());
            out[f] = host((size_t)(N * Q) * 4);
            for (int64_t i = 0; i < N * Q; i++) out[f][i] = kiln_bf16_to_f32(out_bf[i]);
            snprintf(what, sizeof what, "B %lld T %lld NH %lld NKV %lld HS %lld, KILN_ATTN_WG %s: out", (long long)s.B,
                     (long long)s.T, (long long)s.NH, (long long)s.NKV, (long long)s.HS, cfgs[f]);
            CHECK(within(what, out[f], out_ref, N * Q, s.NH, s.HS, 8e-3, 0, 2e-5, &worst_out, msg, sizeof msg), "%s", msg);
            for (int64_t i = 0; i < nl; i++) {
                const double e = isnan(lse[i]) ? INFINITY : fabs((double)lse[i] - lse_ref[i]), rel = fmax(1.0, fabs(lse_ref[i]));
                if (e / rel > worst_lse) worst_lse = e / rel;
                CHECK(e <= 1e-5 * rel, "%s: lse at %lld: gpu %.9g cpu %.9g", what, (long long)i, lse[i], lse_ref[i]);
            }
            if (f > 0) { /* every shape against the first: both sides rounded to bf16 */
                snprintf(what, sizeof what, "T %lld HS %lld: KILN_ATTN_WG %s against %s", (long long)s.T, (long long)s.HS, cfgs[f],
                         cfgs[0]);
                CHECK(within(what, out[f], out[0], N * Q, s.NH, s.HS, 8e-3, 0, 2e-5, &worst_pair, msg, sizeof msg), "%s", msg);
            }
            const int same = same_as[s.HS == 128][f];
            if (same >= 0) { /* the pipelined kernel does the plain one's arithmetic in its order */
                CHECK(memcmp(out[f], out[same], (size_t)(N * Q) * 4) == 0 && memcmp(lse, lses[same], (size_t)nl * 4) == 0,
                      "B %lld T %lld HS %lld: KILN_ATTN_WG %s differs from %s", (long long)s.B, (long long)s.T,
                      (long long)s.HS, cfgs[f], cfgs[same]);
            }
        }
    }
    printf("# wgmma forward: worst out NMSE against the CPU %.3g, between the paths %.3g; worst lse rel. error %.3g\n",
           worst_out, worst_pair, worst_lse);
}
static void test_wgmma(void) { with_attn_wg(NULL, wgmma_checks); }

/* Head sizes the kernels do not take are refused, and nothing is launched for an empty batch. */
static void test_refused(void) {
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    kiln_bf16_t *d = NULL;
    CHECK(kiln_cuda_alloc((void **)&d, 4096) == KILN_OK, "%s", kiln_last_error());
    const kiln_status a = kiln_cuda_attention_forward_train(d, (float *)d, d, 1, 4, 2, 1, 12, NULL);
    const kiln_status b = kiln_cuda_attention_forward_train(d, (float *)d, d, 1, 4, 2, 1, 264, NULL);
    const kiln_status e = kiln_cuda_attention_forward_train(d, (float *)d, d, 1, 4, 3, 2, 8, NULL); /* NH % NKV */
    const kiln_status z = kiln_cuda_attention_backward((float *)d, d, d, d, (float *)d, 0, 4, 2, 1, 8, true, NULL, NULL);
    kiln_cuda_free(d);
    CHECK(a == KILN_ERR_UNSUPPORTED && b == KILN_ERR_UNSUPPORTED, "HS 12: %d, HS 264: %d", (int)a, (int)b);
    CHECK(e == KILN_ERR_INVALID, "NH 3 NKV 2: %d", (int)e);
    CHECK(z == KILN_OK, "B 0: %d", (int)z);
}

int main(void) {
    if (kiln_pool_create(0, &pool) != KILN_OK) return 1;
    RUN(test_attention);
    RUN(test_attention_wgmma);
    RUN(test_attention_wgmma_plain);
    RUN(test_attention_wgmma_pipe);
    RUN(test_attention_wgmma_dq1);
    RUN(test_attention_wgmma_dq_mma);
    RUN(test_wgmma);
    RUN(test_refused);
    release_all();
    kiln_pool_free(pool);
    TEST_EXIT();
}

#else

static void test_attention(void) { SKIP("kiln built without CUDA"); }
static void test_attention_wgmma(void) { SKIP("kiln built without CUDA"); }
static void test_attention_wgmma_plain(void) { SKIP("kiln built without CUDA"); }
static void test_attention_wgmma_pipe(void) { SKIP("kiln built without CUDA"); }
static void test_attention_wgmma_dq1(void) { SKIP("kiln built without CUDA"); }
static void test_attention_wgmma_dq_mma(void) { SKIP("kiln built without CUDA"); }
static void test_wgmma(void) { SKIP("kiln built without CUDA"); }

int main(void) {
    RUN(test_attention);
    RUN(test_attention_wgmma);
    RUN(test_attention_wgmma_plain);
    RUN(test_attention_wgmma_pipe);
    RUN(test_attention_wgmma_dq1);
    RUN(test_attention_wgmma_dq_mma);
    RUN(test_wgmma);
    TEST_EXIT();
}

#endif
