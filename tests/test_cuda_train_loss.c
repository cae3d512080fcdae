/* test_cuda_train_loss.c: src/cuda/train_loss.cu against the CPU oracle on fresh seeded random inputs (never zeros):
 * kiln_cuda_cross_entropy against kiln_cpu_ops.cross_entropy (src/cpu/ops_loss.c), and kiln_cuda_adamw and the 8-bit
 * kiln_cuda_adamw8_check / _apply_checked against kiln_adamw_step (src/train/optim.c, fp32 and 8-bit moments). Every GPU output is poisoned with 0xFF bytes (NaN) first, so an
 * element left unwritten fails. Bounds:
 *   cross_entropy losses   finite rows: |d| <= 1e-6 max(|ref|, 1) and NMSE <= 1e-10 (the sums run in another order
 *                          and CUDA's expf is within 2 ulp of the host's: ~1e-7 absolute in z); a non-finite CPU loss
 *                          (the -inf row) must be the same NaN / +inf on the GPU
 *   cross_entropy dlogits  |gpu - ref| <= (2^-8 + 4e-6) |ref| + 1e-5 (|b| + |c| at the target) + 1e-38: one bf16
 *                          rounding (half an ulp of an 8-bit significand: up to 2^-8 relative just above a power of
 *                          two, 2^-9 on average) of a float that differs from the CPU's by up to ~2e-6 of the softmax
 *                          term a exp(x - M) (the sum's order, expf's ulps), which the subtraction of b = dscale eps / V
 *                          and of c = dscale (1 - eps) at the target can cancel down to a small result; a host
 *                          emulation of the kernel reached 0.996 of the bound (the 2^-8 rounding itself)
 *   adamw params, m, v     |d| <= 1e-6 (|ref| + rms(ref)) after every step (bit-exact unless the clip factor rounds
 *                          one ulp apart; the rms floor covers m crossing zero, b1 m + (1 - b1) g cancelling)
 *   adamw mirror           bit-exact where the params agree bitwise, else the next bf16 code
 *   adamw d_norm           within 1e-6 relative of kiln_grad_norm; a NaN gradient: d_skipped 1, d_norm not finite,
 *                          params, m, v and the mirror unchanged byte for byte
 * The logits are bf16 (the classifier's matmul writes them so); the CPU gets the same values as f32.
 * In place (dlogits == logits) must give the same bits as a separate dlogits, with and without the row's shared
 * copy (V <= 49152 has it).
 * Shapes: V = 50 and 32003 (scalar path: V % 4 != 0), 32000, 151936, 262144 (4-wide path; the last two without
 * the shared copy); AdamW n = 1, 1000,
 * 3000007 (a float4 tail of 3), with clipping off, inactive (1e30) and active (0.3 of step 1's norm), and n = 1000
 * from pointers one float off 16-byte alignment (the scalar path). Skips without a GPU, or when kiln was built
 * without CUDA. */
#include "cuda/cuda.h"
#include "test.h"

#ifdef KILN_CUDA
#include "test_cuda_util.h"
#include "cpu/ops.h"
#include "cuda/train_kernels.h"
#include "fp16.h"
#include "train/optim.h"

#include <stdint.h>

static kiln_pool *pool;

/* ---------------------------------------------------------------- cross-entropy */

#define IGNORE (-100)

/* Row kinds: 1 ignored; 2 large magnitudes (+-3000); 3 target 40 above the rest (loss ~ V e^-40, tests the floor);
 * 4 (when n > 4) five -inf logits away from the target; the rest 4 x normal. */
static void ce_inputs(float *x, int32_t *targets, int64_t n, int64_t V, unsigned long long *rng) {
    for (int64_t r = 0; r < n; r++) {
        float *row = x + r * V;
        const int32_t t = (int32_t)(test_rng_next(rng) % (unsigned long long)V);
        targets[r] = r == 1 ? IGNORE : t;
        for (int64_t i = 0; i < V; i++) {
            float v = r == 2 ? 3000.0f * test_rng_f32(rng) : 4.0f * test_rng_normal(rng);
            row[i] = v != 0.0f ? v : 0.5f;
        }
        if (r == 3) {
            float m = row[0];
            for (int64_t i = 1; i < V; i++) m = row[i] > m ? row[i] : m;
            row[t] = m + 40.0f;
        }
        if (r == 4)
            for (int k = 0; k < 5; k++) {
                int64_t i = (int64_t)(test_rng_next(rng) % (unsigned long long)V);
                if (i != t) row[i] = -INFINITY;
            }
    }
}

static void test_cross_entropy(void) {
    release_all();
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    static const int64_t Vs[] = {50, 32000, 32003, 151936, 262144};
    static const float cfg[][2] = {{0.0f, 0.0f}, {0.1f, 0.0f}, {0.0f, 1e-4f}, {0.1f, 1e-4f}}; /* label smoothing, z_loss */
    const float dscale = 1.0f / 7.0f;
    unsigned long long rng = 0x5eed0c0ffeeULL;
    for (int vi = 0; vi < COUNT(Vs); vi++) {
        const int64_t V = Vs[vi], n = V <= 1000 ? 37 : V <= 40000 ? 9 : 5, nV = n * V;
        float *x = host((size_t)nV * 4), *ref = host((size_t)nV * 4), *loss_ref = host((size_t)n * 4);
        float *loss = host((size_t)n * 4), *loss2 = host((size_t)n * 4);
        uint16_t *dl = host((size_t)nV * 2), *xb = host((size_t)nV * 2), *dl2 = host((size_t)nV * 2);
        int32_t *targets = host((size_t)n * 4);
        ce_inputs(x, targets, n, V, &rng);
        for (int64_t i = 0; i < nV; i++) xb[i] = kiln_f32_to_bf16(x[i]), x[i] = kiln_bf16_to_f32(xb[i]);
        uint16_t *d_x = dev((size_t)nV * 2), *d_xi = dev((size_t)nV * 2);
        float *d_loss = dev((size_t)n * 4);
        uint16_t *d_dl = dev((size_t)nV * 2);
        int32_t *d_t = dev((size_t)n * 4);
        CHECK(d_x && d_xi && d_loss && d_dl && d_t, "V %lld: device memory", (long long)V);
        CHECK(kiln_cuda_upload(d_x, xb, (size_t)nV * 2) == KILN_OK && kiln_cuda_upload(d_t, targets, (size_t)n * 4) == KILN_OK,
              "%s", kiln_last_error());
        const size_t scratch = kiln_cpu_ops.train_scratch_size(1, n, 1, 1, V, kiln_pool_size(pool));
        kiln_ops_ctx ctx = {.pool = pool, .scratch = host(scratch), .scratch_bytes = scratch};
        for (int ci = 0; ci < COUNT(cfg); ci++) {
            const float ls = cfg[ci][0], zl = cfg[ci][1];
            memcpy(ref, x, (size_t)nV * 4);
            int64_t counted = 0;
            kiln_cpu_ops.cross_entropy(&ctx, ref, loss_ref, targets, n, V, ls, zl, IGNORE, dscale, &counted);
            CHECK(counted == n - 1, "CPU counted %lld rows of %lld", (long long)counted, (long long)n);

            CHECK(poison(d_loss, (size_t)n * 4) == KILN_OK && poison(d_dl, (size_t)nV * 2) == KILN_OK, "%s", kiln_last_error());
            CHECK(kiln_cuda_cross_entropy(d_loss, d_dl, d_x, d_t, n, V, ls, zl, IGNORE, dscale, NULL) == KILN_OK, "%s",
                  kiln_last_error());
            CHECK(kiln_cuda_sync() == KILN_OK && kiln_cuda_download(loss, d_loss, (size_t)n * 4) == KILN_OK &&
                      kiln_cuda_download(dl, d_dl, (size_t)nV * 2) == KILN_OK,
                  "%s", kiln_last_error());

            /* losses */
            double num = 0, den = 0;
            for (int64_t r = 0; r < n; r++) {
                const double g = loss[r], w = loss_ref[r];
                if (!isfinite(w)) {
                    CHECK(isnan(w) ? isnan(g) : g == w, "cross_entropy V %lld eps %g z_loss %g row %lld: gpu loss %.9g, CPU %.9g",
                          (long long)V, ls, zl, (long long)r, g, w);
                    continue;
                }
                const double bound = 1e-6 * (fabs(w) > 1.0 ? fabs(w) : 1.0);
                CHECK(fabs(g - w) <= bound, "cross_entropy V %lld eps %g z_loss %g row %lld (target %d): gpu loss %.9g, CPU %.9g, "
                      "|d| %.3g > %.3g", (long long)V, ls, zl, (long long)r, targets[r], g, w, fabs(g - w), bound);
                num += (g - w) * (g - w), den += w * w;
            }
            CHECK(num <= 1e-10 * den, "cross_entropy V %lld eps %g z_loss %g: loss NMSE %.3g > 1e-10", (long long)V, ls, zl,
                  num / den);

            /* dlogits */
            const double b = fabs((double)dscale * ls / (double)V), c = fabs((double)dscale * (1.0 - ls));
            double worst = 0;
            int64_t worst_i = -1;
            for (int64_t r = 0; r < n; r++)
                for (int64_t i = 0; i < V; i++) {
                    const int64_t k = r * V + i;
                    const double g = kiln_bf16_to_f32(dl[k]), w = ref[k];
                    if (isnan(w) || isnan(g)) {
                        CHECK(isnan(w) && isnan(g), "cross_entropy V %lld eps %g z_loss %g dlogits row %lld [%lld]: gpu %.9g, CPU %.9g",
                              (long long)V, ls, zl, (long long)r, (long long)i, g, w);
                        continue;
                    }
                    const double bound = (0x1p-8 + 4e-6) * fabs(w) + 1e-5 * (b + (i == targets[r] ? c : 0.0)) + 1e-38;
                    const double ratio = fabs(g - w) / bound;
                    if (ratio > worst) worst = ratio, worst_i = k;
                }
            if (worst > 1.0) {
                const int64_t r = worst_i / V, i = worst_i % V;
                CHECK(worst <= 1.0, "cross_entropy V %lld eps %g z_loss %g dlogits row %lld [%lld] (target %d, logit %.9g): gpu %.9g "
                      "(bf16 %04x), CPU %.9g (bf16 of it %04x); |d| is %.3g x its bound", (long long)V, ls, zl, (long long)r,
                      (long long)i, targets[r], x[worst_i], kiln_bf16_to_f32(dl[worst_i]), dl[worst_i], ref[worst_i],
                      kiln_f32_to_bf16(ref[worst_i]), worst);
            }
            /* dlogits NULL: only the losses, the same bits */
            if (ci == COUNT(cfg) - 1) {
                CHECK(poison(d_loss, (size_t)n * 4) == KILN_OK, "%s", kiln_last_error());
                CHECK(kiln_cuda_cross_entropy(d_loss, NULL, d_x, d_t, n, V, ls, zl, IGNORE, dscale, NULL) == KILN_OK, "%s",
                      kiln_last_error());
                CHECK(kiln_cuda_sync() == KILN_OK && kiln_cuda_download(loss2, d_loss, (size_t)n * 4) == KILN_OK, "%s",
                      kiln_last_error());
                CHECK(memcmp(loss, loss2, (size_t)n * 4) == 0, "cross_entropy V %lld: losses without dlogits differ", (long long)V);
                /* in place: dlogits over the logits */
                CHECK(kiln_cuda_upload(d_xi, xb, (size_t)nV * 2) == KILN_OK && poison(d_loss, (size_t)n * 4) == KILN_OK, "%s",
                      kiln_last_error());
                CHECK(kiln_cuda_cross_entropy(d_loss, d_xi, d_xi, d_t, n, V, ls, zl, IGNORE, dscale, NULL) == KILN_OK, "%s",
                      kiln_last_error());
                CHECK(kiln_cuda_sync() == KILN_OK && kiln_cuda_download(loss2, d_loss, (size_t)n * 4) == KILN_OK &&
                          kiln_cuda_download(dl2, d_xi, (size_t)nV * 2) == KILN_OK,
                      "%s", kiln_last_error());
                CHECK(memcmp(loss, loss2, (size_t)n * 4) == 0, "cross_entropy V %lld: in-place losses differ", (long long)V);
                CHECK(memcmp(dl, dl2, (size_t)nV * 2) == 0, "cross_entropy V %lld: in-place dlogits differ", (long long)V);
            }
        }
        release_all();
    }
}

/* Refused arguments return an error and launch nothing. */
static void test_cross_entropy_errors(void) {
    release_all();
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    float *d = dev(64);
    CHECK(d);
    CHECK(kiln_cuda_cross_entropy(d, NULL, (const uint16_t *)d, (const int32_t *)d, -1, 4, 0, 0, IGNORE, 1, NULL) == KILN_ERR_INVALID);
    CHECK(kiln_cuda_cross_entropy(d, NULL, (const uint16_t *)d, (const int32_t *)d, 1, 0, 0, 0, IGNORE, 1, NULL) == KILN_ERR_INVALID);
    CHECK(kiln_cuda_cross_entropy(NULL, NULL, (const uint16_t *)d, (const int32_t *)d, 1, 4, 0, 0, IGNORE, 1, NULL) == KILN_ERR_INVALID);
    CHECK(kiln_cuda_cross_entropy(NULL, NULL, NULL, NULL, 0, 4, 0, 0, IGNORE, 1, NULL) == KILN_OK, "n = 0 is nothing to do");
    CHECK(kiln_cuda_sync() == KILN_OK, "%s", kiln_last_error());
    release_all();
}

/* ---------------------------------------------------------------- AdamW */

typedef struct {
    float *params, *grads, *m, *v; /* (n) each */
    uint16_t *mirror;              /* (n) */
    uint8_t *decay;                /* (n) */
    float *norm;                   /* (1) */
    int32_t *skipped;              /* (1) */
    void *ws;
} adamw_dev;

/* |gpu - cpu| <= 1e-6 (|cpu| + rms(cpu)); msg names the first element out of bounds. */
static int close_arrays(const char *what, const float *g, const float *c, int64_t n, char *msg, size_t msg_n) {
    double ss = 0;
    for (int64_t i = 0; i < n; i++) ss += (double)c[i] * c[i];
    const double rms = sqrt(ss / (double)(n > 0 ? n : 1));
    int64_t exact = 0;
    for (int64_t i = 0; i < n; i++) {
        exact += memcmp(&g[i], &c[i], 4) == 0;
        const double d = fabs((double)g[i] - c[i]), bound = 1e-6 * (fabs(c[i]) + rms);
        if (!(d <= bound)) {
            snprintf(msg, msg_n, "%s [%lld]: gpu %.9g cpu %.9g, |d| %.3g > %.3g (rms %.3g; %lld of %lld bit-exact before it)",
                     what, (long long)i, g[i], c[i], d, bound, rms, (long long)exact, (long long)i);
            return 0;
        }
    }
    return 1;
}

static int close_mirror(const uint16_t *g, const uint16_t *c, const float *gp, const float *cp, int64_t n, char *msg, size_t msg_n) {
    for (int64_t i = 0; i < n; i++) {
        const bool same_p = memcmp(&gp[i], &cp[i], 4) == 0;
        const bool ok = same_p ? g[i] == c[i] : ((g[i] ^ c[i]) & 0x8000) == 0 && abs((int)(g[i] & 0x7fff) - (int)(c[i] & 0x7fff)) <= 1;
        if (!ok) {
            snprintf(msg, msg_n, "mirror [%lld]: gpu %04x cpu %04x (params gpu %.9g cpu %.9g, %s)", (long long)i, g[i], c[i], gp[i],
                     cp[i], same_p ? "bitwise equal" : "differ");
            return 0;
        }
    }
    return 1;
}

/* The first element (of size elem) where a and b differ in their bytes, or -1. */
static int64_t first_diff(const void *a, const void *b, size_t bytes, size_t elem) {
    const unsigned char *x = a, *y = b;
    for (size_t i = 0; i < bytes; i++)
        if (x[i] != y[i]) return (int64_t)(i / elem);
    return -1;
}

/* clip_mode 0: off (0), 1: inactive (1e30), 2: active (0.3 of step 1's norm). misalign: device arrays start one
 * element past their allocation (16-byte alignment lost: the scalar paths). */
static void adamw_case(int64_t n, int clip_mode, bool misalign, unsigned long long *rng) {
    const int64_t off = misalign ? 1 : 0;
    char msg[512];
    const size_t fb = (size_t)n * 4, hb = (size_t)n * 2;
    float *p = host(fb), *g = host(fb), *gp = host(fb), *gm = host(fb), *gv = host(fb);
    uint16_t *mir = host(hb), *gmir = host(hb), *snap_mir = host(hb);
    float *snap_p = host(fb), *snap_m = host(fb), *snap_v = host(fb); /* the GPU state after the last step */
    uint8_t *decay = host((size_t)n);
    /* segments: [0, n/3) decays, [n/3, +n/5) does not, a gap of 7 that does not, then the rest decays */
    const int64_t s0 = n / 3 > 1 ? n / 3 : 1, s1 = n / 5, s2o = s0 + s1 + 7 < n ? s0 + s1 + 7 : n;
    const kiln_param_segment segs[3] = {{0, s0, true}, {s0, s1, false}, {s2o, n - s2o, true}};
    for (int64_t i = 0; i < n; i++) decay[i] = (i < s0) || (i >= s2o);
    for (int64_t i = 0; i < n; i++) {
        float r = 0.5f * test_rng_normal(rng);
        p[i] = r != 0.0f ? r : 0.25f;
    }
    kiln_f32_to_bf16_row(p, mir, n);

    adamw_dev d;
    float *base[4];
    for (int k = 0; k < 4; k++) {
        base[k] = dev(fb + 16);
        CHECK(base[k], "device memory");
    }
    d.params = base[0] + off, d.grads = base[1] + off, d.m = base[2] + off, d.v = base[3] + off;
    uint16_t *mbase = dev(hb + 16);
    uint8_t *dbase = dev((size_t)n + 16);
    d.norm = dev(4), d.skipped = dev(4), d.ws = dev(kiln_cuda_adamw_ws_bytes(n));
    CHECK(mbase && dbase && d.norm && d.skipped && d.ws, "device memory");
    d.mirror = mbase + off, d.decay = dbase + off;
    memset(gm, 0, fb);
    CHECK(kiln_cuda_upload(d.params, p, fb) == KILN_OK && kiln_cuda_upload(d.m, gm, fb) == KILN_OK &&
              kiln_cuda_upload(d.v, gm, fb) == KILN_OK && kiln_cuda_upload(d.mirror, mir, hb) == KILN_OK &&
              kiln_cuda_upload(d.decay, decay, (size_t)n) == KILN_OK,
          "%s", kiln_last_error());

    kiln_adamw_cfg cfg = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .grad_clip = 0.0f};
    kiln_adamw opt;
    static const float lrs[4] = {1e-3f, 2e-3f, 7e-4f, 5e-4f};
    for (int s = 0; s < 4; s++) { /* s == 2: a NaN gradient, skipped */
        for (int64_t i = 0; i < n; i++) {
            float r = test_rng_f32(rng);
            g[i] = r != 0.0f ? r : 0.125f;
        }
        if (s == 2) g[n / 2] = NAN;
        if (s == 0) {
            if (clip_mode == 1) cfg.grad_clip = 1e30f;
            if (clip_mode == 2) cfg.grad_clip = (float)(0.3 * kiln_grad_norm(NULL, g, n));
            CHECK(kiln_adamw_init(&opt, &cfg, n, segs, 3) == KILN_OK, "%s", kiln_last_error());
        }
        const int64_t t = opt.step + 1;
        kiln_status st = kiln_cuda_upload(d.grads, g, fb);
        if (st == KILN_OK) st = poison(d.norm, 4);
        if (st == KILN_OK) st = poison(d.skipped, 4);
        if (st == KILN_OK) st = poison(d.ws, kiln_cuda_adamw_ws_bytes(n));
        if (st == KILN_OK) st = kiln_cuda_adamw(d.params, d.grads, d.m, d.v, d.mirror, d.decay, n, lrs[s], cfg.beta1, cfg.beta2, cfg.eps,
                                         cfg.weight_decay, cfg.grad_clip, t, d.norm, d.skipped, d.ws, NULL);
        if (st != KILN_OK) kiln_adamw_free(&opt);
        CHECK(st == KILN_OK, "%s", kiln_last_error());
        kiln_adamw_result res = kiln_adamw_step(&opt, NULL, p, g, mir, lrs[s]);
        float norm;
        int32_t skipped;
        st = kiln_cuda_sync();
        if (st == KILN_OK) st = kiln_cuda_download(&norm, d.norm, 4);
        if (st == KILN_OK) st = kiln_cuda_download(&skipped, d.skipped, 4);
        if (st == KILN_OK) st = kiln_cuda_download(gp, d.params, fb);
        if (st == KILN_OK) st = kiln_cuda_download(gm, d.m, fb);
        if (st == KILN_OK) st = kiln_cuda_download(gv, d.v, fb);
        if (st == KILN_OK) st = kiln_cuda_download(gmir, d.mirror, hb);
        const char *where = misalign ? "misaligned" : "aligned";
        int ok = st == KILN_OK;
        if (!ok) snprintf(msg, sizeof msg, "%s", kiln_last_error());
        if (ok && s == 2) {
            ok = res.skipped && skipped == 1 && !isfinite(norm);
            if (!ok) snprintf(msg, sizeof msg, "NaN gradient: CPU skipped %d, gpu d_skipped %d, d_norm %g", res.skipped, skipped, norm);
            /* the CPU state did not move either, and matched the GPU's bit for bit or within bounds after the
             * previous step: compare with a snapshot of the GPU's own state taken before this step */
            if (ok) {
                const bool sp = memcmp(gp, snap_p, fb) == 0, sm = memcmp(gm, snap_m, fb) == 0, sv = memcmp(gv, snap_v, fb) == 0,
                           smir = memcmp(gmir, snap_mir, hb) == 0;
                ok = sp && sm && sv && smir;
                if (!ok)
                    snprintf(msg, sizeof msg, "NaN gradient: the GPU state changed (params %s, m %s, v %s, mirror %s)",
                             sp ? "same" : "differ", sm ? "same" : "differ", sv ? "same" : "differ", smir ? "same" : "differ");
            }
        } else if (ok) {
            ok = !res.skipped && skipped == 0 && fabs((double)norm - res.grad_norm) <= 1e-6 * res.grad_norm;
            if (!ok)
                snprintf(msg, sizeof msg, "norm: gpu %.9g (skipped %d), CPU %.17g (skipped %d)", norm, skipped, res.grad_norm,
                         res.skipped);
            ok = ok && close_arrays("params", gp, p, n, msg, sizeof msg) && close_arrays("m", gm, opt.m, n, msg, sizeof msg) &&
                 close_arrays("v", gv, opt.v, n, msg, sizeof msg) && close_mirror(gmir, mir, gp, p, n, msg, sizeof msg);
        }
        if (ok) {
            memcpy(snap_p, gp, fb), memcpy(snap_m, gm, fb), memcpy(snap_v, gv, fb), memcpy(snap_mir, gmir, hb);
        }
        if (!ok) kiln_adamw_free(&opt);
        CHECK(ok, "adamw n %lld, %s, clip %g (mode %d), step %d (t %lld, lr %g): %s", (long long)n, where, cfg.grad_clip, clip_mode,
              s, (long long)t, lrs[s], msg);
    }
    kiln_adamw_free(&opt);
}

static void test_adamw(void) {
    release_all();
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    static const int64_t ns[] = {1, 1000, 3000007};
    unsigned long long rng = 0xada3ULL;
    for (int i = 0; i < COUNT(ns); i++)
        for (int clip = 0; clip < 3; clip++) {
            adamw_case(ns[i], clip, false, &rng);
            release_all();
            if (test_failed_) return;
        }
    adamw_case(1000, 2, true, &rng);
    release_all();
}

/* 8-bit AdamW: grad_sumsq, the check over three segments, then the update, against kiln_adamw_step with 8-bit
 * moments, 6 steps (step 2 a NaN gradient: skipped, nothing written). The gradients span 5 decades inside each
 * block and every 11th is 0 (moments decaying towards code 0, the subnormal codes, the raise of a nonzero sqrt(v)
 * off code 0). With the clip off or inactive the codes, scales, params and mirror must be the CPU's bits; with
 * the clip active (its factor from a double norm summed in another order may round one ulp apart) the params
 * within 1e-6 (|ref| + rms), the codes within 1 and the scales within 1e-6 relative. */
static void adamw8_case(int64_t n, int clip_mode, unsigned long long *rng) {
    char msg[512] = "";
    const int64_t nb = (n + KILN_ADAMW8_BLOCK - 1) / KILN_ADAMW8_BLOCK;
    const size_t fb = (size_t)n * 4, hb = (size_t)n * 2, sb = (size_t)nb * 4;
    float *p = host(fb), *g = host(fb), *gp = host(fb), *gms = host(sb), *gvs = host(sb);
    int8_t *gm8 = host((size_t)n);
    uint8_t *gv8 = host((size_t)n), *decay = host((size_t)n);
    uint16_t *mir = host(hb), *gmir = host(hb);
    const int64_t s0 = n / 3 > 1 ? n / 3 : 1, s1 = n / 5, s2o = s0 + s1 + 7 < n ? s0 + s1 + 7 : n;
    const kiln_param_segment segs[3] = {{0, s0, true}, {s0, s1, false}, {s2o, n - s2o, true}};
    for (int64_t i = 0; i < n; i++) decay[i] = (i < s0) || (i >= s2o);
    for (int64_t i = 0; i < n; i++) {
        float r = 0.5f * test_rng_normal(rng);
        p[i] = r != 0.0f ? r : 0.25f;
    }
    kiln_f32_to_bf16_row(p, mir, n);
    float *d_p = dev(fb), *d_g = dev(fb), *d_ms = dev(sb), *d_vs = dev(sb), *d_norm = dev(4);
    int8_t *d_m8 = dev((size_t)n);
    uint8_t *d_v8 = dev((size_t)n), *d_decay = dev((size_t)n);
    uint16_t *d_mir = dev(hb);
    int32_t *d_skipped = dev(4);
    double *d_sumsq = dev(8), *d_wsumsq = dev(8);
    kiln_cuda_adamw_max *d_max = dev(sizeof *d_max);
    bool max_known = false; /* after the first applied step the check may take the bound */
    void *ws = dev(kiln_cuda_adamw_ws_bytes(n));
    const int64_t h_seg[2] = {0, n}, n_chunks = kiln_cuda_adamw_check_chunks(h_seg, 1);
    int64_t *d_seg = dev(sizeof h_seg);
    double *partial = dev((size_t)n_chunks * 8);
    CHECK(d_p && d_g && d_ms && d_vs && d_norm && d_m8 && d_v8 && d_decay && d_mir && d_skipped && d_sumsq && d_wsumsq && d_max && ws &&
              d_seg && partial,
          "device memory");
    memset(gms, 0, sb);
    memset(gm8, 0, (size_t)n);
    CHECK(kiln_cuda_upload(d_p, p, fb) == KILN_OK && kiln_cuda_upload(d_m8, gm8, (size_t)n) == KILN_OK &&
              kiln_cuda_upload(d_v8, gm8, (size_t)n) == KILN_OK && kiln_cuda_upload(d_ms, gms, sb) == KILN_OK &&
              kiln_cuda_upload(d_vs, gms, sb) == KILN_OK && kiln_cuda_upload(d_mir, mir, hb) == KILN_OK &&
              kiln_cuda_upload(d_decay, decay, (size_t)n) == KILN_OK && kiln_cuda_upload(d_seg, h_seg, sizeof h_seg) == KILN_OK,
          "%s", kiln_last_error());
    const kiln_cuda_adam8 q = {d_m8, d_v8, d_ms, d_vs};
    kiln_adamw_cfg cfg = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .grad_clip = 0.0f, .eight_bit = true};
    kiln_adamw opt;
    static const float lrs[6] = {1e-3f, 2e-3f, 7e-4f, 5e-4f, 1e-3f, 3e-4f};
    static const float decades[5] = {1.0f, 0.1f, 0.01f, 1e-3f, 1e-4f};
    for (int s = 0; s < 6; s++) {
        for (int64_t i = 0; i < n; i++) {
            float r = test_rng_f32(rng) * decades[(i / 3) % 5];
            g[i] = i % 11 == 5 ? 0.0f : r != 0.0f ? r : 0.125f;
        }
        if (s == 2) g[n / 2] = NAN;
        if (s == 0) {
            if (clip_mode == 1) cfg.grad_clip = 1e30f;
            if (clip_mode == 2) cfg.grad_clip = (float)(0.3 * kiln_grad_norm(NULL, g, n));
            CHECK(kiln_adamw_init(&opt, &cfg, n, segs, 3) == KILN_OK, "%s", kiln_last_error());
        }
        const int64_t t = opt.step + 1;
        kiln_status st = kiln_cuda_upload(d_g, g, fb);
        if (st == KILN_OK) st = poison(d_norm, 4);
        if (st == KILN_OK) st = poison(d_skipped, 4);
        if (st == KILN_OK) st = kiln_cuda_grad_sumsq(d_sumsq, d_g, n, ws, NULL);
        if (st == KILN_OK)
            st = kiln_cuda_adamw8_check(d_wsumsq, partial, d_seg, 1, n_chunks, d_p, d_g, q, d_decay, lrs[s], cfg.beta1, cfg.beta2, cfg.eps,
                                        cfg.weight_decay, cfg.grad_clip, t, d_sumsq, max_known ? d_max : NULL, NULL);
        double wsumsq = -1;
        if (st == KILN_OK) st = kiln_cuda_sync();
        if (st == KILN_OK) st = kiln_cuda_download(&wsumsq, d_wsumsq, 8);
        if (st == KILN_OK)
            st = kiln_cuda_adamw8_apply_checked(d_p, d_g, q, d_mir, d_decay, n, lrs[s], cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay,
                                                cfg.grad_clip, t, d_sumsq, d_wsumsq, 1, d_max, d_norm, d_skipped, ws, NULL);
        if (st != KILN_OK) kiln_adamw_free(&opt);
        CHECK(st == KILN_OK, "%s", kiln_last_error());
        const kiln_adamw_result res = kiln_adamw_step(&opt, NULL, p, g, mir, lrs[s]);
        float norm;
        int32_t skipped;
        st = kiln_cuda_sync();
        if (st == KILN_OK) st = kiln_cuda_download(&norm, d_norm, 4);
        if (st == KILN_OK) st = kiln_cuda_download(&skipped, d_skipped, 4);
        if (st == KILN_OK) st = kiln_cuda_download(gp, d_p, fb);
        if (st == KILN_OK) st = kiln_cuda_download(gm8, d_m8, (size_t)n);
        if (st == KILN_OK) st = kiln_cuda_download(gv8, d_v8, (size_t)n);
        if (st == KILN_OK) st = kiln_cuda_download(gms, d_ms, sb);
        if (st == KILN_OK) st = kiln_cuda_download(gvs, d_vs, sb);
        if (st == KILN_OK) st = kiln_cuda_download(gmir, d_mir, hb);
        int ok = st == KILN_OK;
        if (!ok) snprintf(msg, sizeof msg, "%s", kiln_last_error());
        if (ok) {
            ok = res.skipped == (skipped == 1) && res.skipped == (s == 2);
            if (!ok) snprintf(msg, sizeof msg, "skipped: CPU %d, gpu %d", res.skipped, skipped);
        }
        if (ok && s != 2) { /* the check read the weights exactly when no update had given its maxima yet */
            ok = max_known ? wsumsq == 0.0 : wsumsq > 0.0 && isfinite(wsumsq);
            if (!ok) snprintf(msg, sizeof msg, "the check's sum %g with%s maxima", wsumsq, max_known ? "" : "out");
        }
        if (!res.skipped) max_known = true;
        const bool exact = clip_mode != 2;
        if (ok && exact) { /* the CPU state is the reference whether or not the step was skipped */
            const int64_t bad_p = first_diff(gp, p, fb, 4), bad_m = first_diff(gm8, opt.m8, (size_t)n, 1),
                          bad_v = first_diff(gv8, opt.v8, (size_t)n, 1), bad_ms = first_diff(gms, opt.m_scale, sb, 4),
                          bad_vs = first_diff(gvs, opt.v_scale, sb, 4), bad_mir = first_diff(gmir, mir, hb, 2);
            ok = bad_p < 0 && bad_m < 0 && bad_v < 0 && bad_ms < 0 && bad_vs < 0 && bad_mir < 0;
            if (!ok)
                snprintf(msg, sizeof msg,
                         "not the CPU's bits: params at %lld, m8 at %lld (gpu %d cpu %d), v8 at %lld (gpu %d cpu %d), m_scale at %lld, "
                         "v_scale at %lld, mirror at %lld",
                         (long long)bad_p, (long long)bad_m, bad_m >= 0 ? gm8[bad_m] : 0, bad_m >= 0 ? opt.m8[bad_m] : 0,
                         (long long)bad_v, bad_v >= 0 ? gv8[bad_v] : 0, bad_v >= 0 ? opt.v8[bad_v] : 0, (long long)bad_ms,
                         (long long)bad_vs, (long long)bad_mir);
        } else if (ok) {
            ok = close_arrays("params", gp, p, n, msg, sizeof msg) && close_arrays("m_scale", gms, opt.m_scale, nb, msg, sizeof msg) &&
                 close_arrays("v_scale", gvs, opt.v_scale, nb, msg, sizeof msg);
            for (int64_t i = 0; ok && i < n; i++) {
                ok = abs(gm8[i] - opt.m8[i]) <= 1 && abs(gv8[i] - opt.v8[i]) <= 1;
                if (!ok) snprintf(msg, sizeof msg, "codes [%lld]: m8 gpu %d cpu %d, v8 gpu %d cpu %d", (long long)i, gm8[i], opt.m8[i], gv8[i], opt.v8[i]);
            }
        }
        if (!ok) kiln_adamw_free(&opt);
        CHECK(ok, "adamw8 n %lld, clip mode %d, step %d (t %lld): %s", (long long)n, clip_mode, s, (long long)t, msg);
    }
    kiln_adamw_free(&opt);
}

static void test_adamw8(void) {
    release_all();
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    static const int64_t ns[] = {1, 255, 256, 257, 1000, 24581, 1000003};
    unsigned long long rng = 0xada8ULL;
    for (int i = 0; i < COUNT(ns); i++)
        for (int clip = 0; clip < 3; clip++) {
            adamw8_case(ns[i], clip, &rng);
            release_all();
            if (test_failed_) return;
        }
}

/* The check's bound (train_kernels.h), fp32 moments: two GPU states A and B take the same steps, A's check with the
 * maxima of its last applied update, B's without (reading every weight). They must stay bit for bit equal while A
 * reads nothing where the bound holds (its sum exactly 0, B's positive):
 *   step 1  no maxima yet: both read; the update leaves in d_max the largest |p| and |m| it wrote, which must be
 *           the bits of the host's max over the downloaded params and m;
 *   step 2  ordinary gradients: A takes the bound;
 *   step 3  one gradient of 3e37 with the clip off: the bound (|m'| / eps ~ 3e44) fails, so A reads every weight
 *           too; the update is finite (its square overflows v to inf, which only zeroes that element's step) and
 *           applies, leaving an m of 3e36;
 *   step 4  lr 3e38: lr / (1 - b1^t) overflows the float step size, every weight would be non-finite: both read,
 *           both skip, nothing changes, and A's d_max stays as step 3 left it;
 *   step 5  ordinary gradients, but that m of 3e36 (d_max kept through the skipped step) still fails the bound:
 *           A reads. */
static void test_adamw_bound(void) {
    release_all();
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    const int64_t n = 100003, h_seg[2] = {0, n}, n_chunks = kiln_cuda_adamw_check_chunks(h_seg, 1);
    const size_t fb = (size_t)n * 4, hb = (size_t)n * 2;
    unsigned long long rng = 0xb0dULL;
    float *p = host(fb), *g = host(fb), *zero = host(fb), *got[2][3];
    uint8_t *decay = host((size_t)n);
    uint16_t *mir = host(hb);
    CHECK(p && g && zero && decay && mir, "host memory");
    for (int k = 0; k < 2; k++)
        for (int j = 0; j < 3; j++) CHECK((got[k][j] = host(fb)), "host memory");
    for (int64_t i = 0; i < n; i++) p[i] = 0.5f * test_rng_normal(&rng), decay[i] = i % 3 != 0, zero[i] = 0.0f;
    kiln_f32_to_bf16_row(p, mir, n);
    float *dp[2], *dm[2], *dv[2], *d_g = dev(fb), *d_norm = dev(4);
    uint16_t *dmir[2];
    uint8_t *d_decay = dev((size_t)n);
    int32_t *d_skipped = dev(4);
    double *d_sumsq = dev(8), *d_wsumsq = dev(8), *partial = dev((size_t)n_chunks * 8);
    int64_t *d_seg = dev(sizeof h_seg);
    kiln_cuda_adamw_max *d_max = dev(sizeof *d_max);
    void *ws = dev(kiln_cuda_adamw_ws_bytes(n));
    CHECK(d_g && d_norm && d_decay && d_skipped && d_sumsq && d_wsumsq && partial && d_seg && d_max && ws, "device memory");
    for (int k = 0; k < 2; k++) {
        dp[k] = dev(fb), dm[k] = dev(fb), dv[k] = dev(fb), dmir[k] = dev(hb);
        CHECK(dp[k] && dm[k] && dv[k] && dmir[k], "device memory");
        CHECK(kiln_cuda_upload(dp[k], p, fb) == KILN_OK && kiln_cuda_upload(dm[k], zero, fb) == KILN_OK &&
                  kiln_cuda_upload(dv[k], zero, fb) == KILN_OK && kiln_cuda_upload(dmir[k], mir, hb) == KILN_OK,
              "%s", kiln_last_error());
    }
    CHECK(kiln_cuda_upload(d_decay, decay, (size_t)n) == KILN_OK && kiln_cuda_upload(d_seg, h_seg, sizeof h_seg) == KILN_OK,
          "%s", kiln_last_error());
    const float b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
    kiln_cuda_adamw_max after3 = {0, 0};
    int64_t t = 1;
    for (int s = 1; s <= 5; s++) {
        for (int64_t i = 0; i < n; i++) g[i] = test_rng_f32(&rng);
        if (s == 3) g[n / 2] = 3e37f;
        const float lr = s == 4 ? 3e38f : 1e-3f;
        double wsum[2] = {-1, -1};
        int32_t skipped[2] = {-1, -1};
        kiln_cuda_adamw_max mx = {0, 0};
        kiln_status st = kiln_cuda_upload(d_g, g, fb);
        for (int k = 0; k < 2 && st == KILN_OK; k++) { /* k 0: A (the bound once known), 1: B */
            const kiln_cuda_adamw_max *known = k == 0 && s > 1 ? d_max : NULL;
            st = kiln_cuda_grad_sumsq(d_sumsq, d_g, n, ws, NULL);
            if (st == KILN_OK) st = poison(d_wsumsq, 8);
            if (st == KILN_OK)
                st = kiln_cuda_adamw_check(d_wsumsq, partial, d_seg, 1, n_chunks, dp[k], d_g, dm[k], dv[k], d_decay, lr, b1, b2, eps, wd, 0.0f,
                                           t, d_sumsq, known, NULL);
            if (st == KILN_OK) st = kiln_cuda_sync();
            if (st == KILN_OK) st = kiln_cuda_download(&wsum[k], d_wsumsq, 8);
            if (st == KILN_OK)
                st = kiln_cuda_adamw_apply_checked(dp[k], d_g, dm[k], dv[k], dmir[k], d_decay, n, lr, b1, b2, eps, wd, 0.0f, t, d_sumsq,
                                                   d_wsumsq, 1, k == 0 ? d_max : NULL, d_norm, d_skipped, ws, NULL);
            if (st == KILN_OK) st = kiln_cuda_sync();
            if (st == KILN_OK) st = kiln_cuda_download(&skipped[k], d_skipped, 4);
            if (st == KILN_OK) st = kiln_cuda_download(got[k][0], dp[k], fb);
            if (st == KILN_OK) st = kiln_cuda_download(got[k][1], dm[k], fb);
            if (st == KILN_OK) st = kiln_cuda_download(got[k][2], dv[k], fb);
        }
        if (st == KILN_OK) st = kiln_cuda_download(&mx, d_max, sizeof mx);
        CHECK(st == KILN_OK, "step %d: %s", s, kiln_last_error());
        const bool bound = s == 2;
        CHECK(skipped[0] == (s == 4) && skipped[1] == (s == 4), "step %d: skipped A %d, B %d", s, skipped[0], skipped[1]);
        CHECK(bound ? wsum[0] == 0.0 : wsum[0] > 0.0 || s == 4, "step %d: A's check summed %g (the bound %s)", s, wsum[0],
              bound ? "holds" : "fails");
        CHECK(s == 4 ? !isfinite(wsum[1]) : wsum[1] > 0.0 && isfinite(wsum[1]), "step %d: B's check summed %g", s, wsum[1]);
        for (int j = 0; j < 3; j++) {
            const int64_t bad = first_diff(got[0][j], got[1][j], fb, 4);
            CHECK(bad < 0, "step %d: %s of A and B differ at %lld (%.9g, %.9g)", s, j == 0 ? "params" : j == 1 ? "m" : "v",
                  (long long)bad, bad >= 0 ? got[0][j][bad] : 0.0, bad >= 0 ? got[1][j][bad] : 0.0);
        }
        if (s != 4) {
            float pm = 0.0f, mm = 0.0f;
            for (int64_t i = 0; i < n; i++) pm = fmaxf(pm, fabsf(got[0][0][i])), mm = fmaxf(mm, fabsf(got[0][1][i]));
            uint32_t pb, mb;
            memcpy(&pb, &pm, 4), memcpy(&mb, &mm, 4);
            CHECK(mx.p == pb && mx.m == mb, "step %d: d_max %08x %08x, the host's %08x (%g) %08x (%g)", s, mx.p, mx.m, pb, pm, mb, mm);
            t++;
        } else {
            CHECK(mx.p == after3.p && mx.m == after3.m, "the skipped step changed d_max");
        }
        if (s == 3) after3 = mx;
        if (s == 3) CHECK(isinf(got[0][2][n / 2]), "step 3: v at the huge gradient is %g (the test wants its square to overflow)",
                          got[0][2][n / 2]);
    }
    release_all();
}

/* Refused arguments; n = 0 still writes d_norm = 0 and d_skipped = 0 (the CPU's norm of nothing is 0, a step). */
static void test_adamw_edges(void) {
    release_all();
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    float *d = dev(64), *norm = dev(4);
    int32_t *skipped = dev(4);
    void *ws = dev(kiln_cuda_adamw_ws_bytes(0));
    uint8_t *decay = dev(16);
    CHECK(d && norm && skipped && ws && decay);
    CHECK(kiln_cuda_adamw(d, d, d, d, NULL, decay, 4, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 0, norm, skipped, ws, NULL) ==
          KILN_ERR_INVALID, "step 0");
    CHECK(kiln_cuda_adamw(d, d, d, d, NULL, decay, 4, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 1, norm, skipped, NULL, NULL) ==
          KILN_ERR_INVALID, "no ws");
    CHECK(kiln_cuda_adamw(d, d, d, d, NULL, NULL, 4, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 1, norm, skipped, ws, NULL) ==
          KILN_ERR_INVALID, "no decay");
    CHECK(kiln_cuda_adamw(d, d, d, d, NULL, decay, 4, 1e-3f, 1.0f, 0.95f, 1e-8f, 0.1f, 1.0f, 1, norm, skipped, ws, NULL) ==
          KILN_ERR_INVALID, "beta1 1");
    CHECK(poison(norm, 4) == KILN_OK && poison(skipped, 4) == KILN_OK && poison(ws, kiln_cuda_adamw_ws_bytes(0)) == KILN_OK);
    CHECK(kiln_cuda_adamw(NULL, NULL, NULL, NULL, NULL, NULL, 0, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 1, norm, skipped, ws,
                          NULL) == KILN_OK, "%s", kiln_last_error());
    float h_norm;
    int32_t h_skipped;
    CHECK(kiln_cuda_sync() == KILN_OK && kiln_cuda_download(&h_norm, norm, 4) == KILN_OK &&
              kiln_cuda_download(&h_skipped, skipped, 4) == KILN_OK,
          "%s", kiln_last_error());
    CHECK(h_norm == 0.0f && h_skipped == 0, "n = 0: d_norm %g, d_skipped %d", h_norm, h_skipped);
    release_all();
}

int main(void) {
    if (kiln_pool_create(4, &pool) != KILN_OK) return 1;
    RUN(test_cross_entropy);
    RUN(test_cross_entropy_errors);
    RUN(test_adamw);
    RUN(test_adamw8);
    RUN(test_adamw_bound);
    RUN(test_adamw_edges);
    release_all();
    kiln_pool_free(pool);
    TEST_EXIT();
}

#else

static void test_cuda_train_loss(void) { SKIP("kiln built without CUDA"); }

int main(void) {
    RUN(test_cuda_train_loss);
    TEST_EXIT();
}

#endif
