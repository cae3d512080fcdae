/* optim.c: AdamW of optim.h, its 8-bit variant, the learning-rate schedule and the bf16 mirror conversion.
 * tests/test_optim.c holds the step against a double-precision AdamW written in the test, checks that the
 * results are bit-identical for 1, 2 and 3 threads, and that the 8-bit variant's loss curve tracks fp32's.
 *
 * A step is two passes over the pool. The first computes the gradient's squared norm as one double partial
 * per chunk of NORM_CHUNK elements (8 interleaved double accumulators inside a chunk, combined in a fixed
 * tree), and the caller adds the partials in index order: the chunks do not depend on the thread count, so
 * neither does the norm. A non-finite norm means a NaN or Inf in the gradient (squares of finite floats
 * cannot overflow a double): the step is skipped. A second pass computes the weights the update would give
 * without writing them, one sum of squares per chunk: a non-finite one (an overflow of m / (sqrt(v) + eps), a
 * weight already near FLT_MAX) skips the step the same way, so a skipped step leaves params and moments exactly
 * as they were (about 1.5x the cost of the update alone). The last pass is elementwise, so any split gives the
 * same bits; threads take whole KILN_ADAMW8_BLOCK blocks so the 8-bit variant never shares a block. The
 * update follows PyTorch's AdamW (torch.optim.AdamW, foreach=False), with t the step after increment:
 *   g = grad * min(1, clip / norm)
 *   m = b1 m + (1 - b1) g,   v = b2 v + (1 - b2) g^2
 *   p = p (1 - lr wd)        (only inside a segment with decay)
 *   p = p - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
 *
 * The 8-bit moments. Within a block of 256 the moments span orders of magnitude (a tensor's columns see
 * gradients of very different sizes, and v is their square), so a linear absmax code loses the small ones:
 * with 127 levels everything under absmax/254 becomes 0, and for v a 0 turns m / (sqrt(v) + eps) into
 * m / eps. Both moments therefore use a minifloat code relative to the block's absmax (the fp32 scale):
 * the relative rounding error has the same bound at every magnitude across 15 octaves, like bitsandbytes' dynamic
 * quantization (Dettmers et al. 2022, "8-bit Optimizers via Block-wise Quantization") but computed with
 * integer operations on the float's bits instead of a search through a code table.
 *   m8: sign and 7 bits E4M3 of |m| / m_scale, values 2^(e-15) (1 + f/8) for e = 1..15 and f/8 2^-14 for
 *       e = 0 (subnormals down to 2^-17): at most 6.25% relative error from 1.875 down to 2^-14, where a
 *       decay by b1 = 0.9 (10%) always moves the code (half a gap is at most 5.6%): m does not stick.
 *       m_scale = absmax|m| / 1.875.
 *   v8: E4M4 (4 exponent, 4 mantissa bits) of sqrt(v) / v_scale, v_scale = max sqrt(v) / 1.9375: storing
 *       sqrt(v) halves the dynamic range to cover and is what the update divides by; at most 3.1% relative
 *       error in sqrt(v) down to 2^-14 of the block's largest. A nonzero sqrt(v) never rounds to code 0
 *       (it is raised to the smallest code): a too-large denominator only shrinks that element's step.
 * Rounding is to nearest even, deterministic. With b2 near 1 (0.999 moves sqrt(v) 0.05% a step) a code moves
 * only once v has changed by half a gap, so a shrinking v lags: that element's steps come out too small,
 * never too large, and the block's scale (its largest element) still follows exactly. A step dequantizes a block, updates it in fp32 (the parameter
 * update uses these fp32 moments) and requantizes it. Blocks whose absmax is below 1e-30 are stored as zero
 * (1/absmax must stay finite): sqrt of a nonzero float v is above 3.7e-23, so such an m moved its parameter
 * by less than 3e-8 of a full step.
 * Measured in tests/test_optim.c (worst relative gap between the 8-bit and the fp32 loss curves, 102,400
 * parameters): on a noisy quadratic whose curvatures span 4 decades inside each block, 2.6e-2 with these
 * codes against 0.25 with linear uint8 sqrt(v) and 4.0 (stalled elements) with linear absmax int8 m and
 * uint8 v; on a sparse, Zipf-frequency least squares (an embedding table), 2.0e-3 (linear absmax 1.9e-3,
 * and divergence to a loss of 1.7e8 without the raise of nonzero v off code 0). Throughput at 10M
 * parameters with 2 threads on the shared 2-core development machine: fp32 200-440 M params/s (bound by
 * memory: 34 bytes an element with the norm pass and the mirror), 8-bit 70-140 M params/s (bound by the
 * scalar code arithmetic). */
#include "train/optim.h"
#include "fp16.h"
#include "status.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define NORM_CHUNK 4096         /* elements per double partial of the norm */
#define NORM_MAX_PARTIALS 1024  /* partials kept on the stack (8 KiB); past 4M elements the chunk grows instead */
#define PARALLEL_MIN (1 << 15)  /* below this many elements a pool wake-up (10-90 us) costs more than it saves */
#define M_MAX 1.875f            /* the largest E4M3 value: the code of the block's absmax */
#define S_MAX 1.9375f           /* the largest E4M4 value */
#define TINY_BLOCK 1e-30f       /* absmax below which a block is stored as zero (1 / absmax must not overflow) */

static void run(kiln_pool *pool, kiln_pool_fn fn, void *ctx, int64_t n) {
    if (pool && kiln_pool_size(pool) > 1 && n >= PARALLEL_MIN)
        kiln_pool_run(pool, fn, ctx);
    else
        fn(ctx, 0, 1);
}

static void split(int64_t n, int ith, int nth, int64_t *lo, int64_t *hi) {
    *lo = n * ith / nth;
    *hi = n * (ith + 1) / nth;
}

/* ---------------------------------------------------------------- bf16 */

/* Branch-free, so the fixed-length inner loop of kiln_f32_to_bf16_row vectorizes (SSE2 at -O2); equal to
 * fp16.h's kiln_f32_to_bf16. */
static inline uint16_t bf16_rne(float f) {
    uint32_t u = kiln_f32_bits(f);
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1)) >> 16;
    uint32_t quiet = (u >> 16) | 0x40;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
}

void kiln_f32_to_bf16_row(const float *x, uint16_t *y, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++) y[i + j] = bf16_rne(x[i + j]);
    for (; i < n; i++) y[i] = bf16_rne(x[i]);
}

/* ---------------------------------------------------------------- norm */

static double sum_squares(const float *x, int64_t n) {
    double acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += (double)x[i + j] * (double)x[i + j]; /* exact products */
    for (int j = 0; i < n; i++, j++) acc[j] += (double)x[i] * (double)x[i];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

typedef struct {
    const float *x; /* (n) */
    int64_t n, chunk, n_chunks;
    double *partial; /* (n_chunks) */
} norm_job;

static void norm_chunks(void *arg, int ith, int nth) {
    const norm_job *j = arg;
    int64_t lo, hi;
    split(j->n_chunks, ith, nth, &lo, &hi);
    for (int64_t c = lo; c < hi; c++) {
        int64_t a = c * j->chunk, len = j->n - a < j->chunk ? j->n - a : j->chunk;
        j->partial[c] = sum_squares(j->x + a, len);
    }
}

double kiln_grad_norm(kiln_pool *pool, const float *x, int64_t n) {
    assert(n >= 0 && (x || n == 0));
    double partial[NORM_MAX_PARTIALS];
    int64_t chunk = NORM_CHUNK, n4k = (n + NORM_CHUNK - 1) / NORM_CHUNK;
    if (n4k > NORM_MAX_PARTIALS) chunk = NORM_CHUNK * ((n4k + NORM_MAX_PARTIALS - 1) / NORM_MAX_PARTIALS);
    norm_job j = {x, n, chunk, (n + chunk - 1) / chunk, partial};
    run(pool, norm_chunks, &j, n);
    double sum = 0.0;
    for (int64_t c = 0; c < j.n_chunks; c++) sum += partial[c];
    return sqrt(sum);
}

/* ---------------------------------------------------------------- 8-bit codes */

/* x + 2^23 - 2^23 rounds a float in [0, 2^22] to the nearest integer, ties to even */
static inline int round_even(float x) { return (int)((x + 0x1p23f) - 0x1p23f); }

/* y in [0, M_MAX] to E4M3 code 0..127 */
static inline int encode_e4m3(float y) {
    if (y < 0x1p-14f) return round_even(y * 0x1p17f); /* subnormal steps of 2^-17: 0..8 */
    uint32_t u = kiln_f32_bits(y);
    u += 0x7ffffu + ((u >> 20) & 1); /* keep 3 mantissa bits, ties to even */
    int c = (int)(u >> 20) - (112 << 3); /* rebias the exponent: 2^-14 is e = 1 */
    return c > 127 ? 127 : c;
}

/* y in [0, S_MAX] to E4M4 code 0..255 */
static inline int encode_e4m4(float y) {
    if (y < 0x1p-14f) return round_even(y * 0x1p18f);
    uint32_t u = kiln_f32_bits(y);
    u += 0x3ffffu + ((u >> 19) & 1);
    int c = (int)(u >> 19) - (112 << 4);
    return c > 255 ? 255 : c;
}

/* The decode tables: m_val indexed by the int8 code's byte, s_val by the uint8 code. */
static void code_tables(float m_val[256], float s_val[256]) {
    for (int c = 0; c < 128; c++) {
        int e = c >> 3, f = c & 7;
        float v = e == 0 ? (float)f * 0x1p-17f : ldexpf(1.0f + (float)f / 8.0f, e - 15);
        m_val[c] = v;
        m_val[(uint8_t)(int8_t)-c] = -v;
    }
    m_val[128] = -M_MAX; /* -128 is never written */
    for (int c = 0; c < 256; c++) {
        int e = c >> 4, f = c & 15;
        s_val[c] = e == 0 ? (float)f * 0x1p-18f : ldexpf(1.0f + (float)f / 16.0f, e - 15);
    }
}

/* ---------------------------------------------------------------- step */

typedef struct {
    float b1, b2, one_minus_b1, one_minus_b2;
    float clip;         /* min(1, grad_clip / norm) */
    float step_size;    /* lr / (1 - b1^t) */
    float inv_sqrt_bc2; /* 1 / sqrt(1 - b2^t) */
    float eps;
    float decay_mul; /* 1 - lr wd */
} adam_consts;

/* One element's update: the new moment, the new v (sqrt(v) when sqrt_v, the 8-bit path's layout) and the new
 * parameter. adam_run applies it and check_run only looks at the parameter, so both see the same bits. */
static inline float adam_elem(const adam_consts *k, float p, float g, float dmul, bool sqrt_v, float *m, float *v) {
    float gi = g * k->clip;
    float mi = k->b1 * *m + k->one_minus_b1 * gi;
    float vprev = sqrt_v ? *v * *v : *v;
    float vi = k->b2 * vprev + k->one_minus_b2 * (gi * gi);
    float s = sqrtf(vi);
    *m = mi;
    *v = sqrt_v ? s : vi;
    return p * dmul - k->step_size * (mi / (s * k->inv_sqrt_bc2 + k->eps));
}

/* n elements. sqrt_v: v holds sqrt(v) on input and output (the 8-bit path's layout), else v itself. */
static inline void adam_run(const adam_consts *k, float *p, const float *g, float *m, float *v, uint16_t *mirror, int64_t n,
                            bool decay, bool sqrt_v) {
    const float dmul = decay ? k->decay_mul : 1.0f;
    for (int64_t i = 0; i < n; i++) {
        float pi = adam_elem(k, p[i], g[i], dmul, sqrt_v, &m[i], &v[i]);
        p[i] = pi;
        if (mirror) mirror[i] = bf16_rne(pi);
    }
}

/* The sum of squares of the n parameters adam_run would write, writing nothing. */
static inline double check_run(const adam_consts *k, const float *p, const float *g, const float *m, const float *v, int64_t n,
                               bool decay, bool sqrt_v) {
    const float dmul = decay ? k->decay_mul : 1.0f;
    double acc = 0.0;
    for (int64_t i = 0; i < n; i++) {
        float mi = m[i], vi = v[i];
        const double pi = adam_elem(k, p[i], g[i], dmul, sqrt_v, &mi, &vi);
        acc += pi * pi;
    }
    return acc;
}

/* The run of constant decay starting at pos, ending at *end <= hi. *k walks the segments (sorted by
 * offset) forward; elements outside every segment do not decay. */
static bool decay_run(const kiln_adamw *o, int64_t pos, int64_t hi, int *k, int64_t *end) {
    while (*k < o->n_segs && o->segs[*k].offset + o->segs[*k].n <= pos) (*k)++;
    if (*k == o->n_segs) {
        *end = hi;
        return false;
    }
    const kiln_param_segment *s = &o->segs[*k];
    if (s->offset > pos) {
        *end = s->offset < hi ? s->offset : hi;
        return false;
    }
    *end = s->offset + s->n < hi ? s->offset + s->n : hi;
    return s->decay;
}

typedef struct {
    kiln_adamw *o;
    float *params;       /* (n) */
    const float *grads;  /* (n) */
    uint16_t *mirror;    /* (n) or NULL */
    adam_consts k;
    float m_val[256], s_val[256]; /* 8-bit decode tables */
} step_job;

static void step_f32(void *arg, int ith, int nth) {
    step_job *j = arg;
    kiln_adamw *o = j->o;
    int64_t blo, bhi;
    split((o->n + KILN_ADAMW8_BLOCK - 1) / KILN_ADAMW8_BLOCK, ith, nth, &blo, &bhi);
    int64_t lo = blo * KILN_ADAMW8_BLOCK, hi = bhi * KILN_ADAMW8_BLOCK < o->n ? bhi * KILN_ADAMW8_BLOCK : o->n;
    int k = 0;
    for (int64_t a = lo, b; a < hi; a = b) {
        bool decay = decay_run(o, a, hi, &k, &b);
        adam_run(&j->k, j->params + a, j->grads + a, o->m + a, o->v + a, j->mirror ? j->mirror + a : NULL, b - a, decay, false);
    }
}

static void step_8bit(void *arg, int ith, int nth) {
    step_job *j = arg;
    kiln_adamw *o = j->o;
    int64_t blo, bhi;
    split((o->n + KILN_ADAMW8_BLOCK - 1) / KILN_ADAMW8_BLOCK, ith, nth, &blo, &bhi);
    int k = 0;
    for (int64_t blk = blo; blk < bhi; blk++) {
        int64_t lo = blk * KILN_ADAMW8_BLOCK, len = o->n - lo < KILN_ADAMW8_BLOCK ? o->n - lo : KILN_ADAMW8_BLOCK;
        float m[KILN_ADAMW8_BLOCK], s[KILN_ADAMW8_BLOCK]; /* (len) the block's moments in fp32; s = sqrt(v) */
        const float ms = o->m_scale[blk], vs = o->v_scale[blk];
        for (int64_t i = 0; i < len; i++) {
            m[i] = ms * j->m_val[(uint8_t)o->m8[lo + i]];
            s[i] = vs * j->s_val[o->v8[lo + i]];
        }
        for (int64_t a = lo, b; a < lo + len; a = b) {
            bool decay = decay_run(o, a, lo + len, &k, &b);
            adam_run(&j->k, j->params + a, j->grads + a, m + (a - lo), s + (a - lo), j->mirror ? j->mirror + a : NULL, b - a,
                     decay, true);
        }
        float m_max = 0.0f, s_max = 0.0f;
        for (int64_t i = 0; i < len; i++) { /* not fmaxf: a libm call without -ffinite-math-only */
            m_max = fabsf(m[i]) > m_max ? fabsf(m[i]) : m_max;
            s_max = s[i] > s_max ? s[i] : s_max;
        }
        const float m_inv = m_max >= TINY_BLOCK ? M_MAX / m_max : 0.0f;
        const float s_inv = s_max >= TINY_BLOCK ? S_MAX / s_max : 0.0f;
        o->m_scale[blk] = m_max >= TINY_BLOCK ? m_max / M_MAX : 0.0f;
        o->v_scale[blk] = s_max >= TINY_BLOCK ? s_max / S_MAX : 0.0f;
        for (int64_t i = 0; i < len; i++) {
            int c = encode_e4m3(fabsf(m[i]) * m_inv);
            o->m8[lo + i] = (int8_t)(m[i] < 0.0f ? -c : c);
            int d = encode_e4m4(s[i] * s_inv);
            o->v8[lo + i] = (uint8_t)(d == 0 && s[i] > 0.0f && s_inv > 0.0f ? 1 : d);
        }
    }
}

/* The check before an update: one sum of squares of the would-be parameters per chunk (chunk: a multiple of
 * KILN_ADAMW8_BLOCK), into partial. Squares of finite floats cannot overflow a double, so a chunk's sum is
 * finite exactly when every weight in it would be. */
typedef struct {
    step_job *j;
    int64_t chunk, n_chunks;
    double *partial; /* (n_chunks) */
} check_job;

static void check_chunks(void *arg, int ith, int nth) {
    const check_job *c = arg;
    const step_job *j = c->j;
    const kiln_adamw *o = j->o;
    int64_t lo, hi;
    split(c->n_chunks, ith, nth, &lo, &hi);
    for (int64_t ch = lo; ch < hi; ch++) {
        const int64_t a0 = ch * c->chunk, a1 = o->n - a0 < c->chunk ? o->n : a0 + c->chunk;
        double acc = 0.0;
        int k = 0;
        for (int64_t blk = a0; blk < a1; blk += KILN_ADAMW8_BLOCK) {
            const int64_t len = a1 - blk < KILN_ADAMW8_BLOCK ? a1 - blk : KILN_ADAMW8_BLOCK;
            float m8[KILN_ADAMW8_BLOCK], s8[KILN_ADAMW8_BLOCK]; /* (len) the 8-bit block's moments in fp32 */
            const float *m = o->m ? o->m + blk : m8, *v = o->v ? o->v + blk : s8;
            if (o->cfg.eight_bit) {
                const float ms = o->m_scale[blk / KILN_ADAMW8_BLOCK], vs = o->v_scale[blk / KILN_ADAMW8_BLOCK];
                for (int64_t i = 0; i < len; i++) {
                    m8[i] = ms * j->m_val[(uint8_t)o->m8[blk + i]];
                    s8[i] = vs * j->s_val[o->v8[blk + i]];
                }
            }
            for (int64_t a = blk, b; a < blk + len; a = b) {
                bool decay = decay_run(o, a, blk + len, &k, &b);
                acc += check_run(&j->k, j->params + a, j->grads + a, m + (a - blk), v + (a - blk), b - a, decay, o->cfg.eight_bit);
            }
        }
        c->partial[ch] = acc;
    }
}

/* The first element of the first chunk whose updated weights would not all be finite, or -1. */
static int64_t check_update(kiln_pool *pool, step_job *j) {
    double partial[NORM_MAX_PARTIALS];
    const int64_t n = j->o->n, n4k = (n + NORM_CHUNK - 1) / NORM_CHUNK;
    int64_t chunk = NORM_CHUNK;
    if (n4k > NORM_MAX_PARTIALS) chunk = NORM_CHUNK * ((n4k + NORM_MAX_PARTIALS - 1) / NORM_MAX_PARTIALS);
    check_job c = {j, chunk, (n + chunk - 1) / chunk, partial};
    run(pool, check_chunks, &c, n);
    for (int64_t i = 0; i < c.n_chunks; i++)
        if (!isfinite(partial[i])) return i * chunk;
    return -1;
}

kiln_adamw_result kiln_adamw_step(kiln_adamw *opt, kiln_pool *pool, float *params, const float *grads, uint16_t *mirror, float lr) {
    assert(opt && ((params && grads) || opt->n == 0));
    kiln_adamw_result r = {kiln_grad_norm(pool, grads, opt->n), false, -1};
    if (!isfinite(r.grad_norm)) {
        r.skipped = true;
        opt->n_skipped++;
        return r;
    }
    const kiln_adamw_cfg *c = &opt->cfg;
    const int64_t t = opt->step + 1;
    const double bc1 = 1.0 - pow((double)c->beta1, (double)t), bc2 = 1.0 - pow((double)c->beta2, (double)t);
    double clip = 1.0;
    if (c->grad_clip > 0.0f && r.grad_norm > (double)c->grad_clip) clip = (double)c->grad_clip / r.grad_norm;
    step_job job = {.o = opt, .params = params, .grads = grads, .mirror = mirror}, *j = &job;
    j->k = (adam_consts){
        .b1 = c->beta1,
        .b2 = c->beta2,
        .one_minus_b1 = 1.0f - c->beta1,
        .one_minus_b2 = 1.0f - c->beta2,
        .clip = (float)clip,
        .step_size = (float)((double)lr / bc1),
        .inv_sqrt_bc2 = (float)(1.0 / sqrt(bc2)),
        .eps = c->eps,
        .decay_mul = (float)(1.0 - (double)lr * (double)c->weight_decay),
    };
    if (c->eight_bit) code_tables(j->m_val, j->s_val);
    if ((r.bad_at = check_update(pool, j)) >= 0) { /* a step that would leave a non-finite weight is not applied */
        r.skipped = true;
        opt->n_skipped++;
        return r;
    }
    if (c->eight_bit) {
        run(pool, step_8bit, j, opt->n);
    } else {
        run(pool, step_f32, j, opt->n);
    }
    opt->step = t;
    return r;
}

/* ---------------------------------------------------------------- init */

kiln_adamw_cfg kiln_adamw_defaults(void) {
    return (kiln_adamw_cfg){.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .grad_clip = 1.0f, .eight_bit = false};
}

static int by_offset(const void *a, const void *b) {
    const kiln_param_segment *x = a, *y = b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

kiln_status kiln_adamw_init(kiln_adamw *opt, const kiln_adamw_cfg *cfg, int64_t n, const kiln_param_segment *segs, int n_segs) {
    memset(opt, 0, sizeof *opt);
    if (!(cfg->beta1 >= 0.0f && cfg->beta1 < 1.0f && cfg->beta2 >= 0.0f && cfg->beta2 < 1.0f))
        return kiln_fail(KILN_ERR_INVALID, "adamw: betas (%g, %g) must lie in [0, 1)", (double)cfg->beta1, (double)cfg->beta2);
    if (!(cfg->eps > 0.0f && isfinite(cfg->eps)))
        return kiln_fail(KILN_ERR_INVALID, "adamw: eps %g must be positive and finite (0 gives 0/0 where v is 0)", (double)cfg->eps);
    if (!(cfg->weight_decay >= 0.0f && isfinite(cfg->weight_decay)))
        return kiln_fail(KILN_ERR_INVALID, "adamw: weight decay %g must be finite and >= 0", (double)cfg->weight_decay);
    if (isnan(cfg->grad_clip)) return kiln_fail(KILN_ERR_INVALID, "adamw: gradient clip is NaN");
    if (n < 0 || n_segs < 0 || (n_segs > 0 && !segs))
        return kiln_fail(KILN_ERR_INVALID, "adamw: %lld parameters in %d segments", (long long)n, n_segs);
    opt->cfg = *cfg;
    opt->n = n;
    if (n_segs > 0) {
        if (!(opt->segs = malloc((size_t)n_segs * sizeof *opt->segs))) return kiln_fail(KILN_ERR_NOMEM, "adamw: out of memory for %d segments", n_segs);
        memcpy(opt->segs, segs, (size_t)n_segs * sizeof *segs);
        opt->n_segs = n_segs;
        for (int i = 0; i < n_segs; i++) {
            const kiln_param_segment *s = &segs[i];
            if (s->offset < 0 || s->n < 0 || s->offset > n || s->n > n - s->offset) {
                kiln_adamw_free(opt);
                return kiln_fail(KILN_ERR_RANGE, "adamw: segment %d [%lld, +%lld) lies outside the %lld parameters", i,
                                 (long long)s->offset, (long long)s->n, (long long)n);
            }
        }
        qsort(opt->segs, (size_t)n_segs, sizeof *opt->segs, by_offset);
        int64_t end = 0; /* of the segments so far */
        for (int i = 0, last = -1; i < n_segs; i++) {
            const kiln_param_segment *s = &opt->segs[i];
            if (s->n == 0) continue;
            if (s->offset < end) {
                const kiln_param_segment *p = &opt->segs[last];
                kiln_status st = kiln_fail(KILN_ERR_INVALID, "adamw: segments [%lld, %lld) and [%lld, %lld) overlap", (long long)p->offset,
                                           (long long)(p->offset + p->n), (long long)s->offset, (long long)(s->offset + s->n));
                kiln_adamw_free(opt);
                return st;
            }
            end = s->offset + s->n;
            last = i;
        }
    }
    const size_t un = (size_t)n, nb = (size_t)((n + KILN_ADAMW8_BLOCK - 1) / KILN_ADAMW8_BLOCK);
    bool ok;
    if (cfg->eight_bit) {
        opt->m8 = calloc(un ? un : 1, 1);
        opt->v8 = calloc(un ? un : 1, 1);
        opt->m_scale = calloc(nb ? nb : 1, sizeof(float));
        opt->v_scale = calloc(nb ? nb : 1, sizeof(float));
        ok = opt->m8 && opt->v8 && opt->m_scale && opt->v_scale;
    } else {
        opt->m = calloc(un ? un : 1, sizeof(float));
        opt->v = calloc(un ? un : 1, sizeof(float));
        ok = opt->m && opt->v;
    }
    if (!ok) {
        kiln_adamw_free(opt);
        return kiln_fail(KILN_ERR_NOMEM, "adamw: out of memory for the moments of %lld parameters", (long long)n);
    }
    return KILN_OK;
}

void kiln_adamw_free(kiln_adamw *opt) {
    if (!opt) return;
    free(opt->segs);
    free(opt->m);
    free(opt->v);
    free(opt->m8);
    free(opt->v8);
    free(opt->m_scale);
    free(opt->v_scale);
    memset(opt, 0, sizeof *opt);
}

/* ---------------------------------------------------------------- schedule */

float kiln_lr_at(const kiln_lr_schedule *s, int64_t step) {
    if (step < 0) step = 0;
    if (step < s->warmup) return (float)((double)s->lr * (double)(step + 1) / (double)s->warmup);
    if (s->decay == KILN_LR_CONSTANT) return s->lr;
    if (step >= s->total) return s->min_lr;
    const double progress = (double)(step - s->warmup) / (double)(s->total - s->warmup); /* [0, 1) */
    const double lr = s->lr, lo = s->min_lr;
    if (s->decay == KILN_LR_LINEAR) return (float)(lr + (lo - lr) * progress);
    return (float)(lo + 0.5 * (lr - lo) * (1.0 + cos(3.14159265358979323846 * progress)));
}
