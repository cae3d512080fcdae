/* test_cuda_attention.c: kiln_cuda_attention (src/cuda/attention.cu) against the CPU oracle
 * kiln_cpu_ops.attention_window_forward on fresh random q (normal) and a random f16 cache (normal values rounded
 * by kiln_f32_to_fp16), both paths: decode (T = 1 at positions 0, 1, 255, 1000, 4095, the split-K kernel) and
 * prefill (T = 7, 64, 300 at pos0 0 and 517; T = 7 also takes the split-K path, one slice per token), head sizes
 * 64, 128, 256 (80 and 96 in a few cases), NH/NKV 8/8, 32/8, 4/1, windows 0 and 128 over a full cache (rows =
 * max_pos = 4096) and window 128 over a ring of window + T - 1 rows. A scale other than 1/sqrt(HS) is checked
 * against a double reference written here, and one launch (same arguments, same ws) replayed at two values of
 * *d_pos0 must give both right answers, as a captured CUDA graph does. The test models' small heads (HS 8, 16, 32,
 * 48; then 24, 40, 56 and the run-time head sizes 72, 112, 136, 200, 248) run the same kinds of cases with window 8,
 * and head sizes that are not a multiple of 8 in 8 .. 256 (4, 12, 264, 512) must return KILN_ERR_UNSUPPORTED.
 * Decode is one kernel whose last split merges, counting on counters at the start of ws: the test zeroes them once
 * per case (as the engine does once), poisons the rest of ws, and after every decode launch downloads them and
 * requires them back at zero (so a replayed graph finds them ready); replay runs one launch at several positions.
 * kiln_cuda_attention_xp (HS 64, 128, 256; T 1 and 3; one and several splits) must give attention's out bit for bit
 * and an xp byte-identical to kiln_cuda_matvec_prepare(out); it returns KILN_ERR_UNSUPPORTED for T > 8 or HS not a
 * multiple of 32, leaving xp alone.
 *
 * test_attention_cache_types does the same over f32, bf16, q8_0 and q4_0 caches (and mixed pairs), and checks the GPU's
 * q8_0 / q4_0 store byte for byte against the CPU quantizers.
 *
 * Bounds: on CUDA cores both sides compute in fp32 from the same exact f16 k and v, differing only in summation order
 * and expf, so max |gpu - ref| <= 1e-4 * max |ref| and NMSE <= 1e-8 (typical errors are ~1e-7 relative). Prefill
 * at HS 64 and 128 over an f16 cache runs on the tensor cores (attention_tc.cu), which round q and the
 * probabilities to f16: 4e-3 and 1e-5 there (kiln_cuda_attention_on_tc says which path a case takes), and
 * test_attention_cuda_cores runs the main grid again with KILN_ATTN_TC=0 under the tight bounds. Outputs and the
 * workspace are poisoned with 0xFF (NaN) before every launch so an unwritten element fails. Skips without CUDA
 * or a GPU. */
#include "test.h"

#include "cpu/ops.h"
#include "cuda/cuda.h"
#include "cuda/kernels.h"
#include "pool.h"
#include "quants.h"

#include <math.h>
#include <stdint.h>

#ifdef KILN_CUDA

#define MAX_POS 4096

typedef struct {
    int64_t HS, NH, NKV, T, pos0, window, rows;
} attn_case;

/* The scores' softcap every run below uses (0: none); test_attention_softcap sets it for its cases. */
static float softcap;

static kiln_pool *pool;

/* Errors of gpu against ref (n values): NMSE, max-abs over max |ref|, the first index past `bound` of the scale. */
typedef struct {
    double nmse, rel_max;
    int64_t first_bad;
} attn_err;

static attn_err compare(const float *gpu, const float *ref, int64_t n, double bound) {
    double num = 0, den = 0, amax = 0, scale = 0;
    for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs(ref[i]));
    attn_err e = {0, 0, -1};
    for (int64_t i = 0; i < n; i++) {
        const double d = (double)gpu[i] - ref[i];
        num += d * d, den += (double)ref[i] * ref[i];
        if (!(fabs(d) <= amax)) amax = isnan(d) ? INFINITY : fmax(amax, fabs(d));
        if (e.first_bad < 0 && !(fabs(d) <= bound * scale)) e.first_bad = i;
    }
    e.nmse = den > 0 ? num / den : INFINITY;
    e.rel_max = scale > 0 ? amax / scale : INFINITY;
    if (isnan(e.nmse)) e.nmse = INFINITY;
    return e;
}

/* Device buffers of one test shape (the largest: HS 256, NKV 8, T 300). */
typedef struct {
    uint16_t *kc, *vc;
    float *q, *out;
    int32_t *pos;
    void *ws;
    size_t ws_bytes;
} dev_bufs;

/* Host reference in double with an arbitrary scale. */
static void reference(float *out, const float *q, const uint16_t *kc, const uint16_t *vc, const attn_case *c, float scale) {
    const int64_t G = c->NH / c->NKV, kvw = c->NKV * c->HS;
    double *s = malloc((size_t)(c->pos0 + c->T) * sizeof *s), *acc = malloc((size_t)c->HS * sizeof *acc);
    for (int64_t t = 0; t < c->T; t++)
        for (int64_t h = 0; h < c->NH; h++) {
            const int64_t p = c->pos0 + t, lo = c->window > 0 && p - c->window + 1 > 0 ? p - c->window + 1 : 0;
            const float *qh = q + (t * c->NH + h) * c->HS;
            double m = -INFINITY, l = 0;
            for (int64_t j = lo; j <= p; j++) {
                const uint16_t *k = kc + (j % c->rows) * kvw + (h / G) * c->HS;
                double dot = 0;
                for (int64_t d = 0; d < c->HS; d++) dot += (double)qh[d] * kiln_fp16_to_f32(k[d]);
                s[j] = dot * scale;
                m = fmax(m, s[j]);
            }
            for (int64_t d = 0; d < c->HS; d++) acc[d] = 0;
            for (int64_t j = lo; j <= p; j++) {
                const double e = exp(s[j] - m);
                const uint16_t *v = vc + (j % c->rows) * kvw + (h / G) * c->HS;
                l += e;
                for (int64_t d = 0; d < c->HS; d++) acc[d] += e * kiln_fp16_to_f32(v[d]);
            }
            for (int64_t d = 0; d < c->HS; d++) out[(t * c->NH + h) * c->HS + d] = (float)(acc[d] / l);
        }
    free(s), free(acc);
}

static void cpu_oracle(float *out, const float *q, const uint16_t *kc, const uint16_t *vc, const attn_case *c) {
    const int64_t n_ctx = MAX_POS;
    size_t bytes = kiln_cpu_ops.scratch_size(c->T, c->NH * c->HS, c->NH, n_ctx, kiln_pool_size(pool));
    kiln_ops_ctx ctx = {.pool = pool, .scratch = malloc(bytes), .scratch_bytes = bytes};
    kiln_cpu_ops.attention_window_forward(&ctx, out, q, kc, vc, c->pos0, c->T, c->NH, c->NKV, c->HS, c->window, c->rows,
                                     softcap);
    free(ctx.scratch);
}

/* The decode counters at the start of ws (attention.cu: ATTN_ROWS_MAX * NH uint32, padded to 256 bytes). */
static size_t counter_bytes(int64_t NH) { return ((size_t)1024 * (size_t)NH * 4 + 255) / 256 * 256; }

/* After a decode launch: the index of the first counter not back at zero, -1 if none, -2 if the download failed. */
static int64_t counters_dirty(const void *ws, int64_t NH) {
    const size_t n = counter_bytes(NH) / 4;
    uint32_t *h = malloc(n * 4);
    int64_t bad = kiln_cuda_download(h, ws, n * 4) == KILN_OK ? -1 : -2;
    for (size_t i = 0; bad == -1 && i < n; i++)
        if (h[i]) bad = (int64_t)i;
    free(h);
    return bad;
}

static int64_t last_ctr_bad = -1; /* counters_dirty after the last decode gpu_run */

/* Runs c on the GPU at *d_pos0 = c->pos0 (uploaded here) into h_out; the cache and q are already on the device.
 * For decode (T <= 8) also sets last_ctr_bad. */
static kiln_status gpu_run(float *h_out, const dev_bufs *b, const attn_case *c, float scale) {
    const size_t out_bytes = (size_t)(c->T * c->NH * c->HS) * sizeof(float);
    int32_t pos = (int32_t)c->pos0;
    memset(h_out, 0xff, out_bytes);
    kiln_status s = kiln_cuda_upload(b->out, h_out, out_bytes); /* poison */
    if (s == KILN_OK) s = kiln_cuda_upload(b->pos, &pos, sizeof pos);
    if (s != KILN_OK) return s;
    s = kiln_cuda_attention(b->out, b->q, b->kc, b->vc, KILN_KV_F16, KILN_KV_F16, b->pos, c->T, c->NH, c->NKV, c->HS, c->window, c->rows, MAX_POS,
                            scale, softcap, b->ws, NULL);
    if (s == KILN_OK) s = kiln_cuda_sync();
    if (s == KILN_OK) s = kiln_cuda_download(h_out, b->out, out_bytes);
    last_ctr_bad = s == KILN_OK && c->T <= 8 ? counters_dirty(b->ws, c->NH) : -1;
    return s;
}

/* Fresh random cache rows and q for c, uploaded: the rows that hold positions 0 .. pos0 + T - 1 (the kernels read
 * no other; the rest keep the zeros of calloc or an earlier case's values). */
static kiln_status fill_case(dev_bufs *b, uint16_t *kc, uint16_t *vc, float *q, const attn_case *c, unsigned long long *rng) {
    const int64_t used = c->rows < c->pos0 + c->T ? c->rows : c->pos0 + c->T;
    const int64_t kvn = used * c->NKV * c->HS, qn = c->T * c->NH * c->HS;
    for (int64_t i = 0; i < kvn; i++) {
        kc[i] = kiln_f32_to_fp16(test_rng_normal(rng));
        vc[i] = kiln_f32_to_fp16(test_rng_normal(rng));
    }
    for (int64_t i = 0; i < qn; i++) q[i] = test_rng_normal(rng);
    kiln_status s = kiln_cuda_upload(b->kc, kc, (size_t)kvn * 2);
    if (s == KILN_OK) s = kiln_cuda_upload(b->vc, vc, (size_t)kvn * 2);
    if (s == KILN_OK) s = kiln_cuda_upload(b->q, q, (size_t)qn * sizeof(float));
    /* a poisoned workspace: the merge must read only the splits the decode kernel wrote; zero counters (the
     * engine zeroes ws once) */
    unsigned char *junk = malloc(b->ws_bytes);
    memset(junk, 0xff, b->ws_bytes);
    memset(junk, 0, counter_bytes(c->NH));
    if (s == KILN_OK) s = kiln_cuda_upload(b->ws, junk, b->ws_bytes);
    free(junk);
    return s;
}

#define BOUND_MAX 1e-4
#define BOUND_NMSE 1e-8
/* The tensor-core prefill (f16 q and probabilities, 2^-11 relative each; typical errors ~3e-4 of max |ref|) */
#define BOUND_MAX_TC 4e-3
#define BOUND_NMSE_TC 1e-5

/* A case's bounds: the tensor-core kernel's where it runs the case (the f16 cache of these tests, the current softcap). */
static void case_bounds(const attn_case *c, double *bmax, double *bnmse) {
    const bool tc = kiln_cuda_attention_on_tc(c->T, c->HS, KILN_KV_F16, KILN_KV_F16, softcap);
    *bmax = tc ? BOUND_MAX_TC : BOUND_MAX, *bnmse = tc ? BOUND_NMSE_TC : BOUND_NMSE;
}

static const int64_t MAX_T = 300, MAX_QW = 32 * 256, MAX_KVW = 8 * 256;

static int alloc_bufs(dev_bufs *b) {
    memset(b, 0, sizeof *b);
    b->ws_bytes = kiln_cuda_attention_ws_bytes(MAX_T, 32, 256, MAX_POS);
    return kiln_cuda_alloc((void **)&b->kc, (size_t)(MAX_POS * MAX_KVW) * 2) == KILN_OK &&
           kiln_cuda_alloc((void **)&b->vc, (size_t)(MAX_POS * MAX_KVW) * 2) == KILN_OK &&
           kiln_cuda_alloc((void **)&b->q, (size_t)(MAX_T * MAX_QW) * 4) == KILN_OK &&
           kiln_cuda_alloc((void **)&b->out, (size_t)(MAX_T * MAX_QW) * 4) == KILN_OK &&
           kiln_cuda_alloc((void **)&b->pos, 4) == KILN_OK && kiln_cuda_alloc(&b->ws, b->ws_bytes) == KILN_OK;
}

static void free_bufs(dev_bufs *b) {
    kiln_cuda_free(b->kc), kiln_cuda_free(b->vc), kiln_cuda_free(b->q), kiln_cuda_free(b->out), kiln_cuda_free(b->pos);
    kiln_cuda_free(b->ws);
}

#define CASE_FMT "HS %lld NH %lld NKV %lld T %lld pos0 %lld window %lld rows %lld"
#define CASE_ARGS(c) (long long)(c).HS, (long long)(c).NH, (long long)(c).NKV, (long long)(c).T, (long long)(c).pos0, \
                     (long long)(c).window, (long long)(c).rows

/* The outcome of a list of cases against the CPU oracle: the first failing case (-1: none) with its error and the
 * values at its first bad index, and the worst errors over the cases that ran. */
typedef struct {
    kiln_status s;
    int alloc_ok, bad_case;
    attn_err e;
    float gpu, ref;
    double worst[2], worst_tc[2]; /* max-abs/max|ref| and NMSE: the cases on CUDA cores, those on tensor cores */
    int64_t ctr_bad; /* the first decode counter left nonzero (-2: not read), -1: all zero */
} cases_result;

/* Runs each case (fresh random cache and q, scale 1/sqrt(HS)) on the GPU and the CPU oracle, stopping at the first
 * failure. */
static cases_result check_cases(const attn_case *cases, int n_cases, unsigned long long seed) {
    cases_result res = {KILN_OK, 0, -1, {0, 0, -1}, 0, 0, {0, 0}, {0, 0}, -1};
    dev_bufs b;
    uint16_t *kc = calloc((size_t)(MAX_POS * MAX_KVW), 2), *vc = calloc((size_t)(MAX_POS * MAX_KVW), 2);
    float *q = malloc((size_t)(MAX_T * MAX_QW) * 4), *ref = malloc((size_t)(MAX_T * MAX_QW) * 4);
    float *gpu = malloc((size_t)(MAX_T * MAX_QW) * 4);
    res.alloc_ok = alloc_bufs(&b);
    res.s = res.alloc_ok ? KILN_OK : KILN_ERR_NOMEM;
    unsigned long long rng = seed;
    for (int ci = 0; res.s == KILN_OK && res.bad_case < 0 && ci < n_cases; ci++) {
        const attn_case c = cases[ci];
        res.s = fill_case(&b, kc, vc, q, &c, &rng);
        if (res.s == KILN_OK) res.s = gpu_run(gpu, &b, &c, 1.0f / sqrtf((float)c.HS));
        if (res.s != KILN_OK) {
            res.bad_case = ci;
            break;
        }
        if (last_ctr_bad != -1) { /* a decode launch left a counter set: the next one would merge too early or never */
            res.ctr_bad = last_ctr_bad, res.bad_case = ci;
            break;
        }
        cpu_oracle(ref, q, kc, vc, &c);
        double bmax, bnmse;
        case_bounds(&c, &bmax, &bnmse);
        res.e = compare(gpu, ref, c.T * c.NH * c.HS, bmax);
        double *worst = bmax == BOUND_MAX ? res.worst : res.worst_tc;
        worst[0] = fmax(worst[0], res.e.rel_max), worst[1] = fmax(worst[1], res.e.nmse);
        if (res.e.first_bad >= 0 || res.e.nmse > bnmse) {
            res.bad_case = ci;
            const int64_t i = res.e.first_bad >= 0 ? res.e.first_bad : 0;
            res.gpu = gpu[i], res.ref = ref[i];
        }
    }
    free(kc), free(vc), free(q), free(ref), free(gpu), free_bufs(&b);
    return res;
}

/* CHECKs a cases_result with the failing case's shape, errors and first bad element (token, head, dim). */
#define CHECK_CASES(res, cases)                                                                                            \
    do {                                                                                                                   \
        const attn_case c_ = (cases)[(res).bad_case >= 0 ? (res).bad_case : 0];                                           \
        const int64_t i_ = (res).e.first_bad >= 0 ? (res).e.first_bad : 0;                                                 \
        CHECK((res).s == KILN_OK, "case %d: " CASE_FMT ": %s", (res).bad_case, CASE_ARGS(c_),                              \
              (res).alloc_ok ? kiln_last_error() : "device allocation failed");                                            \
        CHECK((res).ctr_bad == -1, "case %d: " CASE_FMT ": decode counter %lld not back at zero (-2: unreadable)",     \
              (res).bad_case, CASE_ARGS(c_), (long long)(res).ctr_bad);                                                  \
        double bmax_, bnmse_;                                                                                              \
        case_bounds(&c_, &bmax_, &bnmse_);                                                                                 \
        CHECK((res).bad_case < 0, "case %d: " CASE_FMT ": NMSE %.3g (bound %.0e) max-abs/max|ref| %.3g (bound %.0e), "     \
              "first bad index %lld (token %lld head %lld dim %lld): gpu %.7g cpu %.7g", (res).bad_case, CASE_ARGS(c_),    \
              (res).e.nmse, bnmse_, (res).e.rel_max, bmax_, (long long)i_, (long long)(i_ / (c_.NH * c_.HS)),            \
              (long long)(i_ / c_.HS % c_.NH), (long long)(i_ % c_.HS), (res).gpu, (res).ref);                             \
    } while (0)

/* The worst errors of a cases_result, by path. */
static void print_worst(int n_cases, const cases_result *r) {
    printf("# %d cases: worst max-abs/max|ref| %.2e, NMSE %.2e on CUDA cores (bounds %.0e, %.0e); %.2e, %.2e on tensor "
           "cores (bounds %.0e, %.0e)\n",
           n_cases, r->worst[0], r->worst[1], BOUND_MAX, BOUND_NMSE, r->worst_tc[0], r->worst_tc[1], BOUND_MAX_TC, BOUND_NMSE_TC);
}

/* The main grid: HS 64, 128, 256 over NH/NKV 8/8, 32/8, 4/1, decode at five positions and prefill of 7, 64 and 300
 * tokens at pos0 0 and 517, window 0 and 128 over the full cache and 128 over a ring; then HS 80 and 96. */
static int main_cases(attn_case *cases) {
    static const int64_t hs[] = {64, 128, 256}, heads[][2] = {{8, 8}, {32, 8}, {4, 1}};
    static const int64_t tp[][2] = {{1, 0}, {1, 1}, {1, 255}, {1, 1000}, {1, 4095}, {7, 0}, {7, 517},
                                    {64, 0}, {64, 517}, {300, 0}, {300, 517}};
    int n_cases = 0;
    for (int a = 0; a < 3; a++)
        for (int hd = 0; hd < 3; hd++)
            for (int i = 0; i < 11; i++)
                for (int w = 0; w < 3; w++) {
                    attn_case c = {hs[a], heads[hd][0], heads[hd][1], tp[i][0], tp[i][1], w == 0 ? 0 : 128, MAX_POS};
                    if (w == 2) c.rows = c.window + c.T - 1; /* the ring: smaller than the positions when pos0 + T > rows */
                    cases[n_cases++] = c;
                }
    /* the other templated head sizes, one decode and one prefill each, a ring among them */
    cases[n_cases++] = (attn_case){80, 8, 2, 1, 2000, 0, MAX_POS};
    cases[n_cases++] = (attn_case){80, 8, 2, 33, 700, 128, 128 + 33 - 1};
    cases[n_cases++] = (attn_case){96, 12, 4, 1, 3000, 128, 128};
    cases[n_cases++] = (attn_case){96, 12, 4, 45, 100, 0, MAX_POS};
    return n_cases;
}
#define N_MAIN_CASES (3 * 3 * 11 * 3 + 4)

/* The main grid with the defaults: HS 64 and 128 prefill on the tensor cores (attention_tc.cu), the rest on CUDA
 * cores. */
static void test_attention_matches_cpu(void) {
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    static attn_case cases[N_MAIN_CASES];
    const int n_cases = main_cases(cases);
    const cases_result res = check_cases(cases, n_cases, 20240607);
    CHECK_CASES(res, cases);
    print_worst(n_cases, &res);
}

/* The main grid again with KILN_ATTN_TC=0: every prefill on the CUDA-core kernel, under its own (tight) bounds. */
static void test_attention_cuda_cores(void) {
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    static attn_case cases[N_MAIN_CASES];
    const int n_cases = main_cases(cases);
    setenv("KILN_ATTN_TC", "0", 1);
    CHECK(!kiln_cuda_attention_on_tc(300, 128, KILN_KV_F16, KILN_KV_F16, 0.0f), "KILN_ATTN_TC=0 still takes the tensor cores");
    const cases_result res = check_cases(cases, n_cases, 20240607);
    CHECK_CASES(res, cases); /* its bounds read while KILN_ATTN_TC is still 0 */
    unsetenv("KILN_ATTN_TC");
    print_worst(n_cases, &res);
    CHECK(res.worst_tc[0] == 0, "a case ran on the tensor cores with KILN_ATTN_TC=0");
}

/* The test models' small heads (stories260K and the arch fixtures have HS 8): HS 8, 16, 32, 48 over NH/NKV 8/4, 4/1,
 * 2/1, T = 1 at positions 0, 5, 300 and T = 5 at 300 (split-K), T = 12 and 37 at pos0 0 and 20 (prefill), window 0
 * and 8 over the full cache and window 8 over a ring of 8 + T - 1 rows. Then the other head sizes once or twice
 * each, decode and prefill: 24, 40, 56 (8 dims per prefill lane), 72, 112 (the run-time kernel laid out for 128),
 * 136, 200, 248 (for 256), and a group of 16 query heads (two decode head batches) at HS 8. */
static void test_attention_small_heads(void) {
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    static const int64_t hs[] = {8, 16, 32, 48}, heads[][2] = {{8, 4}, {4, 1}, {2, 1}};
    static const int64_t tp[][2] = {{1, 0}, {1, 5}, {1, 300}, {5, 300}, {12, 0}, {12, 20}, {37, 0}, {37, 20}};
    int n_cases = 0;
    static attn_case cases[4 * 3 * 8 * 3 + 24];
    for (int a = 0; a < 4; a++)
        for (int hd = 0; hd < 3; hd++)
            for (int i = 0; i < 8; i++)
                for (int w = 0; w < 3; w++) {
                    attn_case c = {hs[a], heads[hd][0], heads[hd][1], tp[i][0], tp[i][1], w == 0 ? 0 : 8, MAX_POS};
                    if (w == 2) c.rows = c.window + c.T - 1;
                    cases[n_cases++] = c;
                }
    static const attn_case more[] = {
        {24, 8, 4, 1, 300, 0, MAX_POS},  {24, 8, 4, 37, 20, 8, 8 + 37 - 1}, {40, 4, 1, 1, 5, 8, 8},
        {40, 4, 1, 12, 20, 0, MAX_POS},  {56, 2, 1, 1, 4095, 0, MAX_POS},  {56, 2, 1, 37, 0, 8, MAX_POS},
        {72, 8, 4, 1, 1000, 0, MAX_POS}, {72, 8, 4, 37, 20, 8, 8 + 37 - 1}, {112, 4, 1, 1, 300, 8, 8},
        {112, 4, 1, 64, 517, 0, MAX_POS}, {136, 8, 2, 1, 4095, 0, MAX_POS}, {136, 8, 2, 12, 20, 0, MAX_POS},
        {200, 8, 4, 5, 300, 8, 8 + 5 - 1}, {200, 8, 4, 37, 20, 0, MAX_POS}, {248, 4, 1, 1, 2000, 128, 128},
        {248, 4, 1, 300, 517, 128, 128 + 300 - 1}, {16, 4, 1, 1, 4095, 0, MAX_POS}, {8, 4, 1, 300, 517, 8, 8 + 300 - 1},
        {8, 32, 2, 1, 1000, 0, MAX_POS}, {8, 32, 2, 5, 300, 8, 8 + 5 - 1}, {8, 32, 2, 40, 100, 8, 8 + 40 - 1},
    };
    for (int i = 0; i < (int)(sizeof more / sizeof more[0]); i++) cases[n_cases++] = more[i];
    const cases_result res = check_cases(cases, n_cases, 777);
    CHECK_CASES(res, cases);
    print_worst(n_cases, &res);
}

/* The scores' softcap (gemma2's attn_logit_softcapping) against the CPU oracle's: cap 1.5 on scores of about N(0, 1)
 * changes most of them. Decode and prefill, exact head sizes (8, 128, 256: gemma2's) and a run-time one (72), full
 * cache, window and ring. */
static void test_attention_softcap(void) {
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    const attn_case cases[] = {
        {8, 4, 1, 1, 700, 0, MAX_POS},           {8, 4, 1, 37, 20, 8, 8 + 37 - 1}, {128, 32, 8, 1, 1500, 0, MAX_POS},
        {128, 16, 8, 40, 300, 128, 128 + 40 - 1}, {256, 8, 4, 1, 3000, 0, MAX_POS}, {256, 8, 4, 20, 90, 0, MAX_POS},
        {72, 8, 4, 5, 300, 8, 8 + 5 - 1},        {72, 8, 4, 37, 20, 0, MAX_POS},
    };
    const int n_cases = (int)(sizeof cases / sizeof cases[0]);
    softcap = 1.5f;
    const cases_result res = check_cases(cases, n_cases, 4242);
    softcap = 0.0f;
    CHECK_CASES(res, cases);
    printf("# softcap: ");
    print_worst(n_cases, &res);
}

/* A scale other than 1/sqrt(HS) (the CPU oracle fixes that one) against the double reference, decode and prefill. */
static void test_attention_scale(void) {
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    const attn_case cases[] = {{128, 32, 8, 1, 1500, 0, MAX_POS}, {64, 8, 8, 40, 300, 128, 128 + 40 - 1},
                               {256, 4, 1, 20, 90, 0, MAX_POS}, {8, 4, 1, 1, 700, 0, MAX_POS},
                               {8, 4, 1, 37, 20, 8, 8 + 37 - 1}, {72, 8, 4, 12, 300, 0, MAX_POS}};
    const float scale = 0.3f;
    dev_bufs b;
    uint16_t *kc = calloc((size_t)(MAX_POS * MAX_KVW), 2), *vc = calloc((size_t)(MAX_POS * MAX_KVW), 2);
    float *q = malloc((size_t)(MAX_T * MAX_QW) * 4), *ref = malloc((size_t)(MAX_T * MAX_QW) * 4);
    float *gpu = malloc((size_t)(MAX_T * MAX_QW) * 4);
    int ok = alloc_bufs(&b), bad_case = -1;
    kiln_status s = ok ? KILN_OK : KILN_ERR_NOMEM;
    attn_err e = {0, 0, -1};
    unsigned long long rng = 99;
    for (int ci = 0; s == KILN_OK && bad_case < 0 && ci < (int)(sizeof cases / sizeof cases[0]); ci++) {
        s = fill_case(&b, kc, vc, q, &cases[ci], &rng);
        if (s == KILN_OK) s = gpu_run(gpu, &b, &cases[ci], scale);
        if (s != KILN_OK) break;
        if (last_ctr_bad != -1) {
            bad_case = ci;
            break;
        }
        reference(ref, q, kc, vc, &cases[ci], scale);
        double bmax, bnmse;
        case_bounds(&cases[ci], &bmax, &bnmse);
        e = compare(gpu, ref, cases[ci].T * cases[ci].NH * cases[ci].HS, bmax);
        if (e.first_bad >= 0 || e.nmse > bnmse) bad_case = ci;
    }
    const attn_case c = cases[bad_case >= 0 ? bad_case : 0];
    const int64_t i = e.first_bad >= 0 ? e.first_bad : 0;
    const float g = gpu[i], r = ref[i];
    free(kc), free(vc), free(q), free(ref), free(gpu), free_bufs(&b);
    CHECK(s == KILN_OK, "%s", kiln_last_error());
    CHECK(last_ctr_bad == -1, "scale %.2f, " CASE_FMT ": decode counter %lld not back at zero", scale, CASE_ARGS(c),
          (long long)last_ctr_bad);
    CHECK(bad_case < 0, "scale %.2f, " CASE_FMT ": NMSE %.3g max-abs/max|ref| %.3g, first bad index %lld: gpu %.7g ref %.7g",
          scale, CASE_ARGS(c), e.nmse, e.rel_max, (long long)i, g, r);
}

/* One set of launch arguments and one ws, two values of *d_pos0 (then the second again): every answer right, so
 * nothing about the position is decided on the host (a captured graph replays at every position), and after each
 * decode launch the counters are back at zero. Decode (one split and several, T 1 and 3) and prefill, full and
 * ring. */
static void test_attention_replay(void) {
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    const attn_case cases[][2] = {
        {{128, 32, 8, 1, 37, 0, MAX_POS}, {128, 32, 8, 1, 3999, 0, MAX_POS}},
        {{64, 8, 8, 1, 5, 128, 128}, {64, 8, 8, 1, 2900, 128, 128}},
        {{128, 32, 8, 64, 0, 0, MAX_POS}, {128, 32, 8, 64, 1900, 0, MAX_POS}},
        {{256, 4, 1, 64, 10, 128, 128 + 63}, {256, 4, 1, 64, 3000, 128, 128 + 63}},
        {{8, 4, 1, 1, 3, 8, 8}, {8, 4, 1, 1, 2001, 8, 8}},
        {{8, 2, 1, 12, 0, 8, 8 + 11}, {8, 2, 1, 12, 450, 8, 8 + 11}},
        {{128, 32, 8, 3, 10, 0, MAX_POS}, {128, 32, 8, 3, 3000, 0, MAX_POS}},
        {{64, 8, 2, 1, 700, 0, MAX_POS}, {64, 8, 2, 1, 3900, 0, MAX_POS}},
        {{256, 16, 2, 2, 1500, 0, MAX_POS}, {256, 16, 2, 2, 200, 0, MAX_POS}},
    };
    dev_bufs b;
    uint16_t *kc = calloc((size_t)(MAX_POS * MAX_KVW), 2), *vc = calloc((size_t)(MAX_POS * MAX_KVW), 2);
    float *q = malloc((size_t)(MAX_T * MAX_QW) * 4), *ref = malloc((size_t)(MAX_T * MAX_QW) * 4);
    float *gpu = malloc((size_t)(MAX_T * MAX_QW) * 4);
    int ok = alloc_bufs(&b), bad = -1;
    kiln_status s = ok ? KILN_OK : KILN_ERR_NOMEM;
    attn_err e = {0, 0, -1};
    unsigned long long rng = 5;
    for (int ci = 0; s == KILN_OK && bad < 0 && ci < (int)(sizeof cases / sizeof cases[0]); ci++) {
        /* one cache and q for both positions: the later one's rows (the larger pos0 is second but in the last case) */
        s = fill_case(&b, kc, vc, q, cases[ci][1].pos0 > cases[ci][0].pos0 ? &cases[ci][1] : &cases[ci][0], &rng);
        for (int k = 0; s == KILN_OK && bad < 0 && k < 3; k++) {
            const attn_case *ck = &cases[ci][k == 0 ? 0 : 1];
            s = gpu_run(gpu, &b, ck, 1.0f / sqrtf((float)ck->HS)); /* only *d_pos0 changes */
            if (s != KILN_OK) break;
            if (last_ctr_bad != -1) {
                bad = 2 * ci + (k == 0 ? 0 : 1);
                break;
            }
            cpu_oracle(ref, q, kc, vc, ck);
            double bmax, bnmse;
            case_bounds(ck, &bmax, &bnmse);
            e = compare(gpu, ref, ck->T * ck->NH * ck->HS, bmax);
            if (e.first_bad >= 0 || e.nmse > bnmse) bad = 2 * ci + (k == 0 ? 0 : 1);
        }
    }
    const attn_case c = cases[bad >= 0 ? bad / 2 : 0][bad >= 0 ? bad % 2 : 0];
    const int64_t i = e.first_bad >= 0 ? e.first_bad : 0;
    const float g = gpu[i], r = ref[i];
    free(kc), free(vc), free(q), free(ref), free(gpu), free_bufs(&b);
    CHECK(s == KILN_OK, "%s", kiln_last_error());
    CHECK(last_ctr_bad == -1, "replay at *d_pos0 %lld, " CASE_FMT ": decode counter %lld not back at zero", (long long)c.pos0,
          CASE_ARGS(c), (long long)last_ctr_bad);
    CHECK(bad < 0, "replay at *d_pos0 %lld, " CASE_FMT ": NMSE %.3g max-abs/max|ref| %.3g, first bad index %lld: gpu %.7g cpu %.7g",
          (long long)c.pos0, CASE_ARGS(c), e.nmse, e.rel_max, (long long)i, g, r);
}

/* kiln_cuda_attention_xp against kiln_cuda_attention then kiln_cuda_matvec_prepare: out bit for bit, xp byte for byte
 * (the same float values through the same arithmetic). HS 64, 128, 256; T 1 and 3; one split (pos0 5) and several
 * (1000, 4095); G 1, 4 and 8; a full cache and a ring. */
static void test_attention_xp(void) {
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    const attn_case cases[] = {
        {64, 8, 8, 1, 5, 0, MAX_POS},      {64, 32, 8, 3, 1000, 0, MAX_POS},   {64, 16, 2, 1, 4095, 128, 128},
        {128, 32, 32, 1, 1000, 0, MAX_POS}, {128, 32, 8, 3, 5, 0, MAX_POS},     {128, 32, 8, 1, 4095, 0, MAX_POS},
        {128, 32, 8, 3, 2000, 128, 130},    {256, 4, 1, 1, 1000, 0, MAX_POS},   {256, 8, 2, 3, 4000, 0, MAX_POS},
        {256, 8, 1, 3, 7, 0, MAX_POS},
    };
    const int n_cases = (int)(sizeof cases / sizeof cases[0]);
    dev_bufs b;
    uint16_t *kc = calloc((size_t)(MAX_POS * MAX_KVW), 2), *vc = calloc((size_t)(MAX_POS * MAX_KVW), 2);
    float *q = malloc((size_t)(MAX_T * MAX_QW) * 4), *o_ref = malloc((size_t)(8 * MAX_QW) * 4);
    float *o_xp = malloc((size_t)(8 * MAX_QW) * 4);
    const size_t xp_max = kiln_cuda_matvec_prep_bytes(8, MAX_QW);
    unsigned char *h_xp = malloc(xp_max), *h_xp_ref = malloc(xp_max);
    void *xp = NULL, *xp_ref = NULL;
    int ok = alloc_bufs(&b) && kiln_cuda_alloc(&xp, xp_max) == KILN_OK && kiln_cuda_alloc(&xp_ref, xp_max) == KILN_OK;
    kiln_status s = ok ? KILN_OK : KILN_ERR_NOMEM;
    int bad = -1;
    const char *what = "";
    int64_t at = -1;
    unsigned long long rng = 31;
    for (int ci = 0; s == KILN_OK && bad < 0 && ci < n_cases; ci++) {
        const attn_case c = cases[ci];
        const int64_t C = c.NH * c.HS;
        const size_t ob = (size_t)(c.T * C) * 4, xb = kiln_cuda_matvec_prep_bytes(c.T, C);
        const float scale = 1.0f / sqrtf((float)c.HS);
        s = fill_case(&b, kc, vc, q, &c, &rng);
        if (s == KILN_OK) s = gpu_run(o_ref, &b, &c, scale); /* attention alone: out into o_ref */
        if (s != KILN_OK) break;
        if (last_ctr_bad != -1) {
            bad = ci, what = "counter after attention", at = last_ctr_bad;
            break;
        }
        memset(h_xp, 0xff, xb), memset(o_xp, 0xff, ob);
        s = kiln_cuda_upload(xp, h_xp, xb);
        if (s == KILN_OK) s = kiln_cuda_upload(b.out, o_xp, ob);
        if (s == KILN_OK)
            s = kiln_cuda_attention_xp(b.out, xp, b.q, b.kc, b.vc, KILN_KV_F16, KILN_KV_F16, b.pos, c.T, c.NH, c.NKV, c.HS, c.window, c.rows, MAX_POS,
                                       scale, softcap, b.ws, NULL);
        if (s == KILN_OK) s = kiln_cuda_matvec_prepare(xp_ref, b.out, c.T, C, NULL);
        if (s == KILN_OK) s = kiln_cuda_sync();
        if (s == KILN_OK) s = kiln_cuda_download(o_xp, b.out, ob);
        if (s == KILN_OK) s = kiln_cuda_download(h_xp, xp, xb);
        if (s == KILN_OK) s = kiln_cuda_download(h_xp_ref, xp_ref, xb);
        if (s != KILN_OK) break;
        const int64_t cb = counters_dirty(b.ws, c.NH);
        if (cb != -1) {
            bad = ci, what = "counter after attention_xp", at = cb;
            break;
        }
        for (int64_t i = 0; i < c.T * C && bad < 0; i++)
            if (memcmp(&o_xp[i], &o_ref[i], 4)) bad = ci, what = "out differs from attention's at index", at = i;
        for (size_t i = 0; i < xb && bad < 0; i++)
            if (h_xp[i] != h_xp_ref[i])
                bad = ci, what = i < (size_t)(c.T * C) ? "xq differs from matvec_prepare's at byte" : "xds differs from matvec_prepare's at byte",
                at = (int64_t)i;
    }
    const attn_case c = cases[bad >= 0 ? bad : 0];
    free(kc), free(vc), free(q), free(o_ref), free(o_xp), free(h_xp), free(h_xp_ref), free_bufs(&b);
    kiln_cuda_free(xp), kiln_cuda_free(xp_ref);
    CHECK(s == KILN_OK, "%s", ok ? kiln_last_error() : "device allocation failed");
    CHECK(bad < 0, CASE_FMT ": %s %lld", CASE_ARGS(c), what, (long long)at);
}

/* Head sizes without a kernel and impossible shapes fail with a status, launching nothing. */
/* ---------------------------------------------------------------- KV cache types (-ctk/-ctv)
 * Each type and two mixed pairs: a cache of random normal rows written by the CPU's quantizers (quants_ref.c), the
 * decode and prefill kernels against the CPU oracle over the same bytes (attention_kv_forward), at HS 64 (a head is
 * two blocks), 128, 8 (four heads share a block) and 72 (a run-time head size), with a window over a ring once. Both
 * sides widen the same bytes to the same floats (code times scale), so the f16 bounds hold: 1e-4 of max |ref|.
 * Then kiln_cuda_kv_quantize must write the CPU quantizer's bytes exactly for the same floats (ring rows included),
 * and a row that is not whole blocks of 32 is KILN_ERR_UNSUPPORTED / KILN_ERR_INVALID. */
static void fill_cache_row(kiln_kv_type t, const float *x, int64_t n, void *out) {
    switch (t) {
    case KILN_KV_F32: memcpy(out, x, (size_t)n * 4); break;
    case KILN_KV_F16: kiln_type_traits_get(KILN_TYPE_F16)->from_float_ref(x, out, n); break;
    case KILN_KV_BF16: kiln_type_traits_get(KILN_TYPE_BF16)->from_float_ref(x, out, n); break;
    case KILN_KV_Q8_0: kiln_type_traits_get(KILN_TYPE_Q8_0)->from_float_ref(x, out, n); break;
    case KILN_KV_Q4_0: kiln_type_traits_get(KILN_TYPE_Q4_0)->from_float_ref(x, out, n); break;
    }
}

static void test_attention_cache_types(void) {
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    static const kiln_kv_type pairs[][2] = {{KILN_KV_F32, KILN_KV_F32},   {KILN_KV_BF16, KILN_KV_BF16}, {KILN_KV_Q8_0, KILN_KV_Q8_0},
                                            {KILN_KV_Q4_0, KILN_KV_Q4_0}, {KILN_KV_Q8_0, KILN_KV_F16},  {KILN_KV_F32, KILN_KV_Q4_0}};
    static const attn_case cases[] = {
        {64, 8, 2, 1, 300, 0, MAX_POS}, {64, 8, 2, 37, 100, 0, MAX_POS}, {128, 8, 8, 1, 1000, 0, MAX_POS},
        {128, 32, 8, 7, 0, 0, MAX_POS}, {8, 8, 4, 1, 200, 0, MAX_POS},  {8, 8, 4, 20, 50, 0, MAX_POS},
        {72, 4, 4, 3, 90, 0, MAX_POS},  {64, 8, 2, 9, 400, 64, 72},
    };
    unsigned long long rng = 4242;
    double worst = 0;
    for (size_t pi = 0; pi < sizeof pairs / sizeof pairs[0]; pi++)
        for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
            const attn_case c = cases[ci];
            const kiln_kv_type tk = pairs[pi][0], tv = pairs[pi][1];
            const int64_t KV = c.NKV * c.HS, QW = c.NH * c.HS;
            if ((KV % 32) && (tk == KILN_KV_Q8_0 || tk == KILN_KV_Q4_0 || tv == KILN_KV_Q8_0 || tv == KILN_KV_Q4_0)) continue;
            const size_t kr = kiln_kv_row_bytes(tk, KV), vr = kiln_kv_row_bytes(tv, KV);
            uint8_t *hk = calloc(1, kr * (size_t)c.rows), *hv = calloc(1, vr * (size_t)c.rows);
            float *x = malloc(sizeof(float) * (size_t)KV), *q = malloc(sizeof(float) * (size_t)(c.T * QW));
            float *ref = malloc(sizeof(float) * (size_t)(c.T * QW)), *got = malloc(sizeof(float) * (size_t)(c.T * QW));
            const int64_t n_fill = c.rows < c.pos0 + c.T ? c.rows : c.pos0 + c.T; /* the rows any query sees */
            for (int64_t r = 0; r < n_fill; r++) {
                for (int64_t i = 0; i < KV; i++) x[i] = test_rng_normal(&rng);
                fill_cache_row(tk, x, KV, hk + (size_t)r * kr);
                for (int64_t i = 0; i < KV; i++) x[i] = test_rng_normal(&rng);
                fill_cache_row(tv, x, KV, hv + (size_t)r * vr);
            }
            for (int64_t i = 0; i < c.T * QW; i++) q[i] = test_rng_normal(&rng);
            const size_t bytes = kiln_cpu_ops.scratch_size(c.T, QW, c.NH, MAX_POS, kiln_pool_size(pool)) +
                                 kiln_cpu_ops.kv_scratch_size(QW, c.NH, MAX_POS, kiln_pool_size(pool));
            kiln_ops_ctx ctx = {.pool = pool, .scratch = malloc(bytes), .scratch_bytes = bytes};
            kiln_cpu_ops.attention_kv_forward(&ctx, ref, q, hk, hv, tk, tv, c.pos0, c.T, c.NH, c.NKV, c.HS, c.window, c.rows, 0.0f);
            free(ctx.scratch);
            void *dk = NULL, *dv = NULL, *ws = NULL;
            float *dq = NULL, *dout = NULL;
            int32_t *dpos = NULL, pos = (int32_t)c.pos0;
            const size_t ws_bytes = kiln_cuda_attention_ws_bytes(c.T, c.NH, c.HS, MAX_POS);
            kiln_status st = kiln_cuda_alloc(&dk, kr * (size_t)c.rows);
            if (!st) st = kiln_cuda_alloc(&dv, vr * (size_t)c.rows);
            if (!st) st = kiln_cuda_alloc((void **)&dq, sizeof(float) * (size_t)(c.T * QW));
            if (!st) st = kiln_cuda_alloc((void **)&dout, sizeof(float) * (size_t)(c.T * QW));
            if (!st) st = kiln_cuda_alloc((void **)&dpos, 4);
            if (!st) st = kiln_cuda_alloc(&ws, ws_bytes);
            uint8_t *zero = calloc(1, ws_bytes);
            memset(got, 0xff, sizeof(float) * (size_t)(c.T * QW));
            if (!st) st = kiln_cuda_upload(ws, zero, ws_bytes);
            if (!st) st = kiln_cuda_upload(dk, hk, kr * (size_t)c.rows);
            if (!st) st = kiln_cuda_upload(dv, hv, vr * (size_t)c.rows);
            if (!st) st = kiln_cuda_upload(dq, q, sizeof(float) * (size_t)(c.T * QW));
            if (!st) st = kiln_cuda_upload(dout, got, sizeof(float) * (size_t)(c.T * QW));
            if (!st) st = kiln_cuda_upload(dpos, &pos, 4);
            if (!st)
                st = kiln_cuda_attention(dout, dq, dk, dv, tk, tv, dpos, c.T, c.NH, c.NKV, c.HS, c.window, c.rows, MAX_POS,
                                         1.0f / sqrtf((float)c.HS), 0.0f, ws, NULL);
            if (!st) st = kiln_cuda_sync();
            if (!st) st = kiln_cuda_download(got, dout, sizeof(float) * (size_t)(c.T * QW));
            kiln_cuda_free(dk), kiln_cuda_free(dv), kiln_cuda_free(dq), kiln_cuda_free(dout), kiln_cuda_free(dpos), kiln_cuda_free(ws);
            free(zero);
            const bool tc = kiln_cuda_attention_on_tc(c.T, c.HS, tk, tv, 0.0f);
            const double bmax = tc ? BOUND_MAX_TC : BOUND_MAX, bnmse = tc ? BOUND_NMSE_TC : BOUND_NMSE;
            const attn_err e = st ? (attn_err){INFINITY, INFINITY, 0} : compare(got, ref, c.T * QW, bmax);
            free(hk), free(hv), free(x), free(q), free(ref), free(got);
            CHECK(st == KILN_OK, "%s/%s " CASE_FMT ": %s", kiln_kv_type_name(tk), kiln_kv_type_name(tv), CASE_ARGS(c), kiln_last_error());
            if (!tc) worst = fmax(worst, e.rel_max);
            CHECK(e.first_bad < 0 && e.nmse <= bnmse, "%s/%s " CASE_FMT ": max %.2e of max |ref| (bound %.0e), nmse %.2e",
                  kiln_kv_type_name(tk), kiln_kv_type_name(tv), CASE_ARGS(c), e.rel_max, bmax, e.nmse);
        }
    printf("# attention over f32, bf16, q8_0, q4_0 and mixed caches: %.2e of max |ref| at worst (bound %.0e)\n", worst, BOUND_MAX);

    /* the GPU's q8_0 / q4_0 store: T = 3 rows at positions 4, 5, 6 of a ring of 5 (rows 4, 0, 1) */
    const int64_t KV = 128, T = 3, R = 5;
    float *src = malloc(sizeof(float) * (size_t)(T * KV));
    for (int64_t i = 0; i < T * KV; i++) src[i] = (i % 97 == 0) ? 0.0f : 2.5f * test_rng_normal(&rng);
    for (int64_t i = 0; i < 32; i++) src[KV + i] = 0.0f; /* an all-zero block */
    src[2 * KV + 40] = -7.0f, src[2 * KV + 41] = 7.0f;   /* a tie of magnitudes: the first wins (q4_0) */
    static const kiln_kv_type blocks[] = {KILN_KV_Q8_0, KILN_KV_Q4_0};
    for (int b = 0; b < 2; b++) {
        const size_t rb = kiln_kv_row_bytes(blocks[b], KV);
        uint8_t *want = malloc(rb * (size_t)R), *have = malloc(rb * (size_t)R);
        memset(want, 0xA5, rb * (size_t)R);
        for (int64_t t = 0; t < T; t++) fill_cache_row(blocks[b], src + t * KV, KV, want + (size_t)((4 + t) % R) * rb);
        void *dc = NULL;
        float *ds = NULL;
        int32_t *dpos = NULL, pos = 4;
        kiln_status st = kiln_cuda_alloc(&dc, rb * (size_t)R);
        if (!st) st = kiln_cuda_alloc((void **)&ds, sizeof(float) * (size_t)(T * KV));
        if (!st) st = kiln_cuda_alloc((void **)&dpos, 4);
        memset(have, 0xA5, rb * (size_t)R);
        if (!st) st = kiln_cuda_upload(dc, have, rb * (size_t)R);
        if (!st) st = kiln_cuda_upload(ds, src, sizeof(float) * (size_t)(T * KV));
        if (!st) st = kiln_cuda_upload(dpos, &pos, 4);
        if (!st) st = kiln_cuda_kv_quantize(dc, ds, blocks[b], dpos, T, KV, R, NULL);
        if (!st) st = kiln_cuda_sync();
        if (!st) st = kiln_cuda_download(have, dc, rb * (size_t)R);
        kiln_cuda_free(dc), kiln_cuda_free(ds), kiln_cuda_free(dpos);
        size_t at = 0;
        while (at < rb * (size_t)R && have[at] == want[at]) at++;
        free(want), free(have);
        CHECK(st == KILN_OK, "kv_quantize %s: %s", kiln_kv_type_name(blocks[b]), kiln_last_error());
        CHECK(at == rb * (size_t)R, "kv_quantize %s: byte %zu (row %zu) differs from the CPU quantizer's", kiln_kv_type_name(blocks[b]),
              at, at / rb);
    }
    free(src);
    CHECK(kiln_cuda_kv_quantize(NULL, NULL, KILN_KV_Q8_0, NULL, 1, 48, 4, NULL) == KILN_ERR_INVALID, "a row of 48");
    CHECK(kiln_cuda_kv_quantize(NULL, NULL, KILN_KV_F16, NULL, 1, 64, 4, NULL) == KILN_ERR_INVALID, "f16 is not a block type");
    float dummy;
    int32_t p0 = 0;
    CHECK(kiln_cuda_attention(&dummy, &dummy, &dummy, &dummy, KILN_KV_Q4_0, KILN_KV_F16, &p0, 1, 4, 2, 8, 0, 64, 64, 1.0f, 0.0f,
                              &dummy, NULL) == KILN_ERR_UNSUPPORTED, "q4_0 over rows of 16");
}

static void test_attention_rejects(void) {
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    float *dummy = NULL;
    CHECK(kiln_cuda_alloc((void **)&dummy, 1 << 16) == KILN_OK, "%s", kiln_last_error());
    const uint16_t *h = (const uint16_t *)dummy;
    const int32_t *pos = (const int32_t *)dummy;
    kiln_status s12 = kiln_cuda_attention(dummy, dummy, h, h, KILN_KV_F16, KILN_KV_F16, pos, 1, 4, 4, 12, 0, 64, 64, 1.0f, 0.0f, dummy, NULL);
    kiln_status s4 = kiln_cuda_attention(dummy, dummy, h, h, KILN_KV_F16, KILN_KV_F16, pos, 20, 4, 4, 4, 0, 64, 64, 1.0f, 0.0f, dummy, NULL);
    kiln_status s264 = kiln_cuda_attention(dummy, dummy, h, h, KILN_KV_F16, KILN_KV_F16, pos, 1, 4, 4, 264, 0, 64, 64, 1.0f, 0.0f, dummy, NULL);
    kiln_status s512 = kiln_cuda_attention(dummy, dummy, h, h, KILN_KV_F16, KILN_KV_F16, pos, 20, 4, 4, 512, 0, 64, 64, 1.0f, 0.0f, dummy, NULL);
    kiln_status s0 = kiln_cuda_attention(dummy, dummy, h, h, KILN_KV_F16, KILN_KV_F16, pos, 1, 4, 4, 0, 0, 64, 64, 1.0f, 0.0f, dummy, NULL);
    /* 512 cache rows: a context of 4096 without a window, and window 600 (+ 1 token) it cannot hold */
    kiln_status s512rows = kiln_cuda_attention(dummy, dummy, h, h, KILN_KV_F16, KILN_KV_F16, pos, 1, 4, 4, 8, 0, 512, 4096, 1.0f, 0.0f, dummy, NULL);
    kiln_status s512win = kiln_cuda_attention(dummy, dummy, h, h, KILN_KV_F16, KILN_KV_F16, pos, 1, 4, 4, 8, 600, 512, 4096, 1.0f, 0.0f, dummy, NULL);
    kiln_status sgrp = kiln_cuda_attention(dummy, dummy, h, h, KILN_KV_F16, KILN_KV_F16, pos, 1, 6, 4, 64, 0, 64, 64, 1.0f, 0.0f, dummy, NULL);
    kiln_status sring = kiln_cuda_attention(dummy, dummy, h, h, KILN_KV_F16, KILN_KV_F16, pos, 1, 4, 4, 64, 0, 32, 64, 1.0f, 0.0f, dummy, NULL);
    kiln_status sws = kiln_cuda_attention(dummy, dummy, h, h, KILN_KV_F16, KILN_KV_F16, pos, 1, 4, 4, 64, 0, 64, 64, 1.0f, 0.0f, NULL, NULL);
    kiln_status scap = kiln_cuda_attention(dummy, dummy, h, h, KILN_KV_F16, KILN_KV_F16, pos, 1, 4, 4, 64, 0, 64, 64, 1.0f, -1.0f, dummy, NULL);
    /* attention_xp: T 9 (prefill), HS 8, 72 and 80 (a block of 32 would cross heads): unsupported, xp untouched
     * (the second half of dummy, poisoned, must stay so) */
    unsigned char *h_poison = malloc(1 << 15), *h_after = malloc(1 << 15);
    memset(h_poison, 0xa5, 1 << 15);
    void *xp = (char *)dummy + (1 << 15);
    kiln_status sup = kiln_cuda_upload(xp, h_poison, 1 << 15);
    kiln_status sx9 = kiln_cuda_attention_xp(dummy, xp, dummy, h, h, KILN_KV_F16, KILN_KV_F16, pos, 9, 4, 4, 64, 0, 64, 64, 1.0f, 0.0f, dummy, NULL);
    kiln_status sx8 = kiln_cuda_attention_xp(dummy, xp, dummy, h, h, KILN_KV_F16, KILN_KV_F16, pos, 1, 4, 4, 8, 0, 64, 64, 1.0f, 0.0f, dummy, NULL);
    kiln_status sx72 = kiln_cuda_attention_xp(dummy, xp, dummy, h, h, KILN_KV_F16, KILN_KV_F16, pos, 1, 4, 4, 72, 0, 64, 64, 1.0f, 0.0f, dummy, NULL);
    kiln_status sx80 = kiln_cuda_attention_xp(dummy, xp, dummy, h, h, KILN_KV_F16, KILN_KV_F16, pos, 3, 4, 4, 80, 0, 64, 64, 1.0f, 0.0f, dummy, NULL);
    kiln_status sxnull = kiln_cuda_attention_xp(dummy, NULL, dummy, h, h, KILN_KV_F16, KILN_KV_F16, pos, 1, 4, 4, 64, 0, 64, 64, 1.0f, 0.0f, dummy, NULL);
    if (sup == KILN_OK) sup = kiln_cuda_sync();
    if (sup == KILN_OK) sup = kiln_cuda_download(h_after, xp, 1 << 15);
    const int xp_kept = sup == KILN_OK && memcmp(h_poison, h_after, 1 << 15) == 0;
    free(h_poison), free(h_after);
    kiln_cuda_free(dummy);
    CHECK(s12 == KILN_ERR_UNSUPPORTED, "HS 12 (decode): status %d", (int)s12);
    CHECK(s4 == KILN_ERR_UNSUPPORTED, "HS 4 (prefill): status %d", (int)s4);
    CHECK(s264 == KILN_ERR_UNSUPPORTED, "HS 264 (decode): status %d", (int)s264);
    CHECK(s512 == KILN_ERR_UNSUPPORTED, "HS 512 (prefill): status %d", (int)s512);
    CHECK(s0 == KILN_ERR_UNSUPPORTED, "HS 0: status %d", (int)s0);
    CHECK(s512rows == KILN_ERR_INVALID, "a 512-row cache for 4096 positions without a window: status %d", (int)s512rows);
    CHECK(s512win == KILN_ERR_INVALID, "a 512-row ring for window 600: status %d", (int)s512win);
    CHECK(sgrp == KILN_ERR_INVALID, "NH 6 over NKV 4: status %d", (int)sgrp);
    CHECK(sring == KILN_ERR_INVALID, "a 32-row cache without a window: status %d", (int)sring);
    CHECK(sws == KILN_ERR_INVALID, "decode without a workspace: status %d", (int)sws);
    CHECK(scap == KILN_ERR_INVALID, "a negative softcap: status %d", (int)scap);
    CHECK(sx9 == KILN_ERR_UNSUPPORTED, "attention_xp T 9: status %d", (int)sx9);
    CHECK(sx8 == KILN_ERR_UNSUPPORTED, "attention_xp HS 8: status %d", (int)sx8);
    CHECK(sx72 == KILN_ERR_UNSUPPORTED, "attention_xp HS 72: status %d", (int)sx72);
    CHECK(sx80 == KILN_ERR_UNSUPPORTED, "attention_xp HS 80: status %d", (int)sx80);
    CHECK(sxnull == KILN_ERR_INVALID, "attention_xp without xp: status %d", (int)sxnull);
    CHECK(xp_kept, "attention_xp touched xp when unsupported (or the check failed: %s)", kiln_last_error());
    CHECK(kiln_cuda_attention_ws_bytes(1, 32, 128, 4096) > 0);
    CHECK(kiln_cuda_attention_ws_bytes(300, 32, 128, 4096) >= kiln_cuda_attention_ws_bytes(1, 32, 128, 4096));
}

int main(void) {
    if (kiln_pool_create(0, &pool) != KILN_OK) {
        printf("FAIL pool: %s\n", kiln_last_error());
        return 1;
    }
    RUN(test_attention_matches_cpu);
    RUN(test_attention_cuda_cores);
    RUN(test_attention_small_heads);
    RUN(test_attention_scale);
    RUN(test_attention_softcap);
    RUN(test_attention_replay);
    RUN(test_attention_xp);
    RUN(test_attention_cache_types);
    RUN(test_attention_rejects);
    kiln_pool_free(pool);
    TEST_EXIT();
}

#else

static void test_attention(void) { SKIP("kiln built without CUDA"); }

int main(void) {
    RUN(test_attention);
    TEST_EXIT();
}

#endif
