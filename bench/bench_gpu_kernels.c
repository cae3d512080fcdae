/* bench_gpu_kernels.c: `kiln bench gpu-kernels [--quick] [--matvec] [--attention] [--few] [--sample] [--phases]`: the decode matmuls of src/cuda/matvec.cu alone, on the
 * shapes a 7B and a 1.1B LLaMA decode runs (q/k/v/o, merged qkv, GLU gate+up, down, the head) in the types those
 * models ship in, for T = 1, 2, 4, 8 tokens (--quick: T = 1, fewer repetitions); then for T = 16 and 32 (a server's
 * step of that many sequences) src/cuda/gemm_small.cu on the blocks beside cuBLASLt on bf16 weights of the same
 * shape (the engine's two paths for such a step; a GLU case is two matmuls), for the types gemm_small takes
 * (--few: only these). GB/s counts the bytes each reads: the blocks, or 2 per weight.
 *
 * Each case uploads one random weight (random bytes with finite f16 scales, as tests/test_cuda_matvec.c makes
 * them; random floats for F16) into enough copies to total >= ROTATE_BYTES (256 MiB, four times the H200's 60 MB
 * L2), so every launch streams its weight from HBM; launches rotate through the copies. x is random, prepared
 * once. A measurement is LAUNCHES launches timed on the host wall clock around kiln_cuda_sync (the seam has no
 * events), the median of REPS. The time per launch includes the gap between launches on the stream (with PDL,
 * matvec's launch overlaps its predecessor's tail); when the host cannot enqueue launches as fast as the GPU runs
 * them the figure is the host's: host_us, the enqueue time per launch, says when that is so (host_us ~= us).
 *
 * Output: one JSON object per case ({"bench":"gpu_kernel", op, type, rows, cols, T, us, host_us, gbs, roof_frac})
 * and a table. GB/s counts the weight bytes alone (x and y are < 1% of them); roof_frac = GB/s /
 * kiln_cuda_copy_bandwidth (bytes read plus written per second of a device copy, the roof bench_gpu.c holds
 * decode to). Without a GPU: one line on stderr, exit 1.
 *
 * Then the sampler (src/cuda/sample.cu; --sample runs this section alone): one sampled token's time on the GPU (the
 * 4-byte token read back) against the host's (the V logits read back, then kiln_sampler_sample), V 32,000 and
 * 151,936, three settings; JSON {"bench":"gpu_sample", ...} and a table.
 *
 * Then the training attention (src/cuda/train_attention.cu, kiln_cuda_attention_forward_train / _backward) at the
 * trainer's shapes, B 16 T 1024 HS 64 NKV 4, NH 12 (124M) and 16 (350M), and Llama-3-8B's heads (B 4 T 1024 NH 32
 * NKV 8 HS 128); --attention runs this section alone.
 * Each call is timed alone on the host clock around kiln_cuda_sync (ms-long calls: the ~10 us of launch and sync
 * is < 1%), the median of ATTN_REPS after ATTN_WARM warm-ups. FLOPs counted as the causal half of the matmuls:
 * forward 2 matmuls (S = QK^T, PV) = 4 B NH T^2 HS / 2, backward 5 (FA2: S, dP, dV, dK, dQ) = 2.5 x that (the
 * D = rowsum(dout * out) pass and the recomputation's exps not counted), for both backward modes: deterministic
 * (dk/dv kernel, then a dq kernel recomputing S and dP: 7 matmuls done) and atomic dq (one kernel, 5). JSON
 * {"bench":"train_attention", ...} and a table; peak_frac against 989 TFLOP/s, the H200's dense bf16 peak (this
 * file measures no GEMM rate). Where this build and device have the wgmma kernels (kiln_cuda_attention_wgmma), each
 * shape is timed on mma.sync (KILN_ATTN_WG=0) and on wgmma (KILN_ATTN_WG's shape, or 1) in the same run: "path" in
 * the JSON, a row each in the table, and the ratios after it.
 *
 * Then the cost of a dependency between two phases of work (src/cuda/phase_bench.cu; --phases runs this section
 * alone): per phase, a kernel boundary in a CUDA graph without and with PDL (how kiln's decode step runs) against a
 * grid barrier inside one persistent kernel (how a persistent decode kernel would), for 0, 2 KiB and 16 KiB read
 * by each of the one-per-SM CTAs a phase. JSON {"bench":"gpu_phases", ...} and a table. */
#include "bench/bench.h"
#include "tools/cli.h"

#include "cuda/cuda.h"
#include "cuda/kernels.h"
#include "cuda/train_kernels.h"
#include "fp16.h"
#include "status.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* gpu-kernels' flags (--quick, --attention, --few, --sample, --phases, --train, --matvec), checked in every build so a bad
 * one is named even without CUDA. --train: the training elementwise kernels and the cross-entropy alone; --matvec: the
 * decode matmuls alone (the sections after them skipped). */
static int parse_args(int argc, char **argv, bool *quick, bool *attention_only, bool *few_only, bool *sample_only,
                      bool *phases_only, bool *train_only, bool *matvec_only) {
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0) { /* ends the options; gpu-kernels takes no other argument */
            if (i + 1 < argc) return kiln_cli_error("bench gpu-kernels: unexpected argument '%s'", argv[i + 1]);
            break;
        }
        if (strcmp(argv[i], "--quick") == 0) *quick = true;
        else if (strcmp(argv[i], "--attention") == 0) *attention_only = true;
        else if (strcmp(argv[i], "--few") == 0) *few_only = true;
        else if (strcmp(argv[i], "--sample") == 0) *sample_only = true;
        else if (strcmp(argv[i], "--phases") == 0) *phases_only = true;
        else if (strcmp(argv[i], "--train") == 0) *train_only = true;
        else if (strcmp(argv[i], "--matvec") == 0) *matvec_only = true;
        else return kiln_cli_unknown("bench gpu-kernels", argv[i]);
    }
    return 0;
}

#ifdef KILN_CUDA /* the kernels exist only in a CUDA build */

#define ROTATE_BYTES ((size_t)256 << 20)
#define MAX_COPIES 64
#define LAUNCHES 200
#define REPS 5

typedef struct {
    const char *model, *what;
    kiln_type type;
    int64_t rows, cols; /* O, I */
    bool glu;
} mv_case;

static const mv_case cases[] = {
    {"7b", "q/k/v/o", KILN_TYPE_Q4_K, 4096, 4096, false},
    {"7b", "qkv", KILN_TYPE_Q4_K, 12288, 4096, false},
    {"7b", "gate+up", KILN_TYPE_Q4_K, 11008, 4096, true},
    {"7b", "down", KILN_TYPE_Q4_K, 4096, 11008, false},
    {"7b", "v", KILN_TYPE_Q6_K, 4096, 4096, false},
    {"7b", "down", KILN_TYPE_Q6_K, 4096, 11008, false},
    {"7b", "head", KILN_TYPE_Q6_K, 32000, 4096, false},
    {"7b", "q/k/v/o", KILN_TYPE_Q8_0, 4096, 4096, false},
    {"7b", "gate+up", KILN_TYPE_Q8_0, 11008, 4096, true},
    {"7b", "down", KILN_TYPE_Q8_0, 4096, 11008, false},
    {"7b", "q/k/v/o", KILN_TYPE_Q5_K, 4096, 4096, false},
    {"7b", "gate+up", KILN_TYPE_Q5_K, 11008, 4096, true},
    {"7b", "down", KILN_TYPE_Q5_K, 4096, 11008, false},
    {"7b", "q/k/v/o", KILN_TYPE_Q4_0, 4096, 4096, false},
    {"7b", "gate+up", KILN_TYPE_Q4_0, 11008, 4096, true},
    {"7b", "down", KILN_TYPE_Q4_0, 4096, 11008, false},
    {"7b", "q/k/v/o", KILN_TYPE_F16, 4096, 4096, false},
    {"7b", "gate+up", KILN_TYPE_F16, 11008, 4096, true},
    {"7b", "down", KILN_TYPE_F16, 4096, 11008, false},
    /* the types issue 18 added, at the 7B shapes */
    {"7b", "q/k/v/o", KILN_TYPE_Q2_K, 4096, 4096, false},
    {"7b", "gate+up", KILN_TYPE_Q2_K, 11008, 4096, true},
    {"7b", "down", KILN_TYPE_Q2_K, 4096, 11008, false},
    {"7b", "q/k/v/o", KILN_TYPE_Q3_K, 4096, 4096, false},
    {"7b", "gate+up", KILN_TYPE_Q3_K, 11008, 4096, true},
    {"7b", "down", KILN_TYPE_Q3_K, 4096, 11008, false},
    {"7b", "q/k/v/o", KILN_TYPE_IQ4_XS, 4096, 4096, false},
    {"7b", "gate+up", KILN_TYPE_IQ4_XS, 11008, 4096, true},
    {"7b", "down", KILN_TYPE_IQ4_XS, 4096, 11008, false},
    {"7b", "q/k/v/o", KILN_TYPE_IQ4_NL, 4096, 4096, false},
    {"7b", "gate+up", KILN_TYPE_IQ4_NL, 11008, 4096, true},
    {"7b", "q/k/v/o", KILN_TYPE_Q5_1, 4096, 4096, false},
    {"7b", "gate+up", KILN_TYPE_Q5_1, 11008, 4096, true},
    {"1.1b", "q/o", KILN_TYPE_Q4_K, 2048, 2048, false},
    {"1.1b", "qkv", KILN_TYPE_Q4_K, 2560, 2048, false},
    {"1.1b", "gate+up", KILN_TYPE_Q4_K, 5632, 2048, true},
    {"1.1b", "down", KILN_TYPE_Q4_K, 2048, 5632, false},
    {"1.1b", "down", KILN_TYPE_Q6_K, 2048, 5632, false},
    {"1.1b", "head", KILN_TYPE_Q6_K, 32000, 2048, false},
    {"1.1b", "gate+up", KILN_TYPE_Q8_0, 5632, 2048, true},
    {"1.1b", "gate+up", KILN_TYPE_F16, 5632, 2048, true},
};

static uint64_t rng_next(uint64_t *s) { /* xorshift64* */
    *s ^= *s >> 12, *s ^= *s << 25, *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}
static float rng_f32(uint64_t *s) { return (float)(rng_next(s) >> 40) / 16777216.0f * 2.0f - 1.0f; } /* [-1, 1) */

/* rows x cols of type t: random bytes with finite f16 scales (the d / dmin fields), or random F16 values. */
static uint8_t *make_weight(kiln_type t, int64_t rows, int64_t cols, uint64_t *rng) {
    const size_t bytes = kiln_type_row_bytes(t, cols) * (size_t)rows, bs = kiln_type_block_bytes(t);
    uint8_t *w = malloc(bytes);
    if (!w) return NULL;
    if (t == KILN_TYPE_F16) {
        for (size_t i = 0; i < bytes / 2; i++) ((kiln_fp16 *)w)[i] = kiln_f32_to_fp16(rng_f32(rng));
        return w;
    }
    for (size_t i = 0; i + 8 <= bytes; i += 8) {
        const uint64_t r = rng_next(rng);
        memcpy(w + i, &r, 8);
    }
    for (size_t b = 0; b < bytes / bs; b++) {
        uint8_t *p = w + b * bs;
        const kiln_fp16 d = kiln_f32_to_fp16(0.01f * rng_f32(rng)), m = kiln_f32_to_fp16(0.005f * rng_f32(rng));
        if (t == KILN_TYPE_Q6_K || t == KILN_TYPE_Q3_K) memcpy(p + bs - 2, &d, 2); /* block_q6_K / q3_K end with d */
        else if (t == KILN_TYPE_Q2_K) memcpy(p + bs - 4, &d, 2), memcpy(p + bs - 2, &m, 2); /* ... with d, dmin */
        else if (t == KILN_TYPE_Q8_0 || t == KILN_TYPE_Q4_0 || t == KILN_TYPE_Q5_0 || t == KILN_TYPE_IQ4_NL || t == KILN_TYPE_IQ4_XS)
            memcpy(p, &d, 2);
        else memcpy(p, &d, 2), memcpy(p + 2, &m, 2); /* Q4_1 / Q5_1 d, m; Q4_K / Q5_K d, dmin */
    }
    return w;
}

typedef struct {
    double us, host_us;
} timing;

/* ---------------------------------------------------------------- the timed launches */

enum { K_MATVEC, K_SMALL, K_BLAS };

/* One launch on copy k: the matvec (the GLU's one pass over both weights), or for a few rows gemm_small on the
 * blocks or cuBLASLt on the bf16 copies (a GLU case two matmuls, as the engine runs it). */
typedef struct {
    const mv_case *c;
    int64_t T;
    kiln_cuda_wt *wg, *wu, *bg, *bu; /* the block copies; the bf16 copies (cuBLASLt's operand in the engine) */
    float *y;
    const float *x;
    const void *xp;
    kiln_cuda_gemm_ws *ws;
    int kind;
} few_args;

static kiln_status few_launch(const few_args *a, int k) {
    if (a->kind == K_MATVEC)
        return a->c->glu ? kiln_cuda_matvec_glu(a->y, a->x, a->xp, &a->wg[k], &a->wu[k], a->T, false, NULL)
                         : kiln_cuda_matvec(a->y, a->x, a->xp, &a->wg[k], a->T, false, NULL);
    const bool blas = a->kind == K_BLAS;
    const kiln_cuda_wt *g = blas ? &a->bg[k] : &a->wg[k], *u = blas ? &a->bu[k] : &a->wu[k];
    kiln_status st = blas ? kiln_cuda_gemm(a->y, a->x, g, a->T, false, a->ws, NULL)
                          : kiln_cuda_gemm_small(a->y, a->xp, g, a->T, false, a->ws, NULL);
    if (!st && a->c->glu)
        st = blas ? kiln_cuda_gemm(a->y, a->x, u, a->T, false, a->ws, NULL) : kiln_cuda_gemm_small(a->y, a->xp, u, a->T, false, a->ws, NULL);
    return st;
}

/* One case at one T: the median of reps rounds of LAUNCHES launches rotating over the n copies. */
static kiln_status time_few(const few_args *a, int n_copies, int reps, timing *out) {
    double t_all[REPS], t_host[REPS];
    kiln_status st;
    for (int i = 0; i < 10; i++) /* warm-up: first-launch costs, clocks */
        if ((st = few_launch(a, i % n_copies))) return st;
    if ((st = kiln_cuda_sync())) return st;
    for (int r = 0; r < reps; r++) {
        const double t0 = kiln_bench_now();
        for (int i = 0; i < LAUNCHES; i++)
            if ((st = few_launch(a, i % n_copies))) return st;
        const double t1 = kiln_bench_now();
        if ((st = kiln_cuda_sync())) return st;
        const double t2 = kiln_bench_now();
        t_all[r] = (t2 - t0) / LAUNCHES * 1e6, t_host[r] = (t1 - t0) / LAUNCHES * 1e6;
    }
    out->us = kiln_bench_median(t_all, reps);
    out->host_us = kiln_bench_median(t_host, reps);
    return KILN_OK;
}

typedef struct {
    const mv_case *c;
    int64_t T;
    timing tm;
    double gbs;
    const char *kernel; /* "matvec", "gemm_small", "cublaslt bf16" */
} result;

/* ---------------------------------------------------------------- training attention */

#define ATTN_WARM 3
#define ATTN_REPS 10
#define ATTN_PEAK_TFLOPS 989.0 /* H200 dense bf16 */

typedef struct {
    const char *model;
    int64_t B, T, NH, NKV, HS;
} attn_case;

static const attn_case attn_cases[] = {
    {"124m", 16, 1024, 12, 4, 64},
    {"350m", 16, 1024, 16, 4, 64},
    {"8b", 4, 1024, 32, 8, 128}, /* Llama-3-8B's heads: the forward at HS 128 (its backward stays on mma.sync) */
};

/* Medians of ATTN_REPS forward and backward calls of one shape, in ms: bwd_ms[0] deterministic, [1] atomic dq. */
static kiln_status time_attention(const attn_case *c, uint64_t *rng, double *fwd_ms, double bwd_ms[2]) {
    const int64_t N = c->B * c->T, Q = c->NH * c->HS, W = Q + 2 * c->NKV * c->HS;
    const size_t ws_bytes = kiln_cuda_attention_backward_ws_bytes(c->B, c->T, c->NH);
    kiln_bf16 *h = malloc((size_t)(N * W) * sizeof *h);
    void *qkv = NULL, *out = NULL, *dout = NULL, *lse = NULL, *dqkv = NULL, *ws = NULL;
    kiln_status st = h ? KILN_OK : kiln_fail(KILN_ERR_NOMEM, "host qkv for attention %s", c->model);
    for (int64_t i = 0; h && i < N * W; i++) h[i] = kiln_f32_to_bf16(2.0f * rng_f32(rng));
    if (!st) st = kiln_cuda_alloc(&qkv, (size_t)(N * W) * 2);
    if (!st) st = kiln_cuda_upload(qkv, h, (size_t)(N * W) * 2);
    if (!st) st = kiln_cuda_alloc(&dout, (size_t)(N * Q) * 2);
    if (!st) st = kiln_cuda_upload(dout, h, (size_t)(N * Q) * 2); /* any bf16 values will do */
    if (!st) st = kiln_cuda_alloc(&out, (size_t)(N * Q) * 2);
    if (!st) st = kiln_cuda_alloc(&lse, (size_t)(c->B * c->NH * c->T) * 4);
    if (!st) st = kiln_cuda_alloc(&dqkv, (size_t)(N * W) * 4);
    if (!st) st = kiln_cuda_alloc(&ws, ws_bytes);
    double tf[ATTN_REPS], tb[2][ATTN_REPS];
    for (int r = -ATTN_WARM; r < ATTN_REPS && !st; r++) {
        const double t0 = kiln_bench_now();
        st = kiln_cuda_attention_forward_train(out, lse, qkv, c->B, c->T, c->NH, c->NKV, c->HS, NULL);
        if (!st) st = kiln_cuda_sync();
        const double t1 = kiln_bench_now();
        double t2 = t1;
        for (int m = 0; m < 2 && !st; m++) {
            t2 = kiln_bench_now();
            st = kiln_cuda_attention_backward(dqkv, dout, qkv, out, lse, c->B, c->T, c->NH, c->NKV, c->HS, m == 0, ws, NULL);
            if (!st) st = kiln_cuda_sync();
            if (r >= 0) tb[m][r] = (kiln_bench_now() - t2) * 1e3;
        }
        if (r >= 0) tf[r] = (t1 - t0) * 1e3;
    }
    if (!st) {
        *fwd_ms = kiln_bench_median(tf, ATTN_REPS);
        for (int m = 0; m < 2; m++) bwd_ms[m] = kiln_bench_median(tb[m], ATTN_REPS);
    }
    kiln_cuda_free(qkv), kiln_cuda_free(out), kiln_cuda_free(dout), kiln_cuda_free(lse), kiln_cuda_free(dqkv), kiln_cuda_free(ws);
    free(h);
    return st;
}

/* Sets KILN_ATTN_WG to value (NULL: unset); returns the old value (malloc'd, or NULL) for attn_env_restore. */
static char *attn_env_set(const char *value) {
    const char *e = getenv("KILN_ATTN_WG");
    char *keep = e ? strdup(e) : NULL;
    if (value) setenv("KILN_ATTN_WG", value, 1);
    else unsetenv("KILN_ATTN_WG");
    return keep;
}
static void attn_env_restore(char *keep) {
    if (keep) setenv("KILN_ATTN_WG", keep, 1), free(keep);
    else unsetenv("KILN_ATTN_WG");
}

static int bench_attention(void) {
    const int n = (int)(sizeof attn_cases / sizeof attn_cases[0]);
    double ms[sizeof attn_cases / sizeof attn_cases[0]][2][3] = {{{0}}}; /* [case][mma.sync, wgmma][fwd, bwd det., bwd atomic dq] */
    /* the wgmma path (train_attention_wg.cu) where this build and device have it: in the shape KILN_ATTN_WG names, or
     * the default shape; both paths are timed in this run */
    const char *user = getenv("KILN_ATTN_WG");
    const char *wg_setting = user && strcmp(user, "0") != 0 ? user : "1";
    char *keep = attn_env_set(wg_setting);
    bool wg[sizeof attn_cases / sizeof attn_cases[0]];
    for (int i = 0; i < n; i++) wg[i] = kiln_cuda_attention_wgmma(attn_cases[i].HS);
    attn_env_restore(keep);
    uint64_t rng = 0x2545F4914F6CDD1Dull;
    int done = 0;
    for (; done < n; done++) {
        const attn_case *c = &attn_cases[done];
        int failed = 0;
        for (int p = 0; p < (wg[done] ? 2 : 1) && !failed; p++) {
            keep = attn_env_set(p ? wg_setting : "0");
            failed = time_attention(c, &rng, &ms[done][p][0], &ms[done][p][1]) != KILN_OK; /* bwd into [1], [2] */
            attn_env_restore(keep);
            if (failed) {
                fprintf(stderr, "kiln bench gpu-kernels: attention %s (%s): %s\n", c->model, p ? "wgmma" : "mma.sync", kiln_last_error());
                break;
            }
            const double *m = ms[done][p], fl = 4.0 * c->B * c->NH * (double)c->T * c->T * c->HS / 2;
            const double tf = fl / (m[0] * 1e-3) / 1e12, tb = 2.5 * fl / (m[1] * 1e-3) / 1e12, ta = 2.5 * fl / (m[2] * 1e-3) / 1e12;
            printf("{\"bench\":\"train_attention\",\"model\":\"%s\",\"path\":\"%s\",\"B\":%lld,\"T\":%lld,\"NH\":%lld,\"NKV\":%lld,"
                   "\"HS\":%lld,\"fwd_ms\":%.3f,\"fwd_tflops\":%.1f,\"fwd_peak_frac\":%.3f,\"bwd_ms\":%.3f,"
                   "\"bwd_tflops\":%.1f,\"bwd_peak_frac\":%.3f,\"bwd_atomic_ms\":%.3f,\"bwd_atomic_tflops\":%.1f,"
                   "\"bwd_atomic_peak_frac\":%.3f}\n",
                   c->model, p ? "wgmma" : "mma.sync", (long long)c->B, (long long)c->T, (long long)c->NH, (long long)c->NKV,
                   (long long)c->HS, m[0], tf, tf / ATTN_PEAK_TFLOPS, m[1], tb, tb / ATTN_PEAK_TFLOPS, m[2], ta,
                   ta / ATTN_PEAK_TFLOPS);
            fflush(stdout);
        }
        if (failed) break;
    }
    printf("\ntraining attention (causal FLOPs; bwd = 2.5 x fwd; peak %.0f TFLOP/s dense bf16)\n", ATTN_PEAK_TFLOPS);
    printf("%-5s %-8s %3s %5s %3s %3s %3s %9s %8s %5s %9s %8s %5s %9s %8s %5s\n", "model", "path", "B", "T", "NH", "NKV", "HS",
           "fwd ms", "TFLOP/s", "peak", "bwd det", "TFLOP/s", "peak", "bwd atom", "TFLOP/s", "peak");
    for (int i = 0; i < done; i++)
        for (int p = 0; p < (wg[i] ? 2 : 1); p++) {
            const attn_case *c = &attn_cases[i];
            const double *m = ms[i][p], fl = 4.0 * c->B * c->NH * (double)c->T * c->T * c->HS / 2;
            const double tf = fl / (m[0] * 1e-3) / 1e12, tb = 2.5 * fl / (m[1] * 1e-3) / 1e12, ta = 2.5 * fl / (m[2] * 1e-3) / 1e12;
            printf("%-5s %-8s %3lld %5lld %3lld %3lld %3lld %9.3f %8.1f %4.0f%% %9.3f %8.1f %4.0f%% %9.3f %8.1f %4.0f%%\n", c->model,
                   p ? "wgmma" : "mma.sync", (long long)c->B, (long long)c->T, (long long)c->NH, (long long)c->NKV,
                   (long long)c->HS, m[0], tf, 100 * tf / ATTN_PEAK_TFLOPS, m[1], tb, 100 * tb / ATTN_PEAK_TFLOPS, m[2], ta,
                   100 * ta / ATTN_PEAK_TFLOPS);
        }
    for (int i = 0; i < done; i++)
        if (wg[i])
            printf("%-5s wgmma (KILN_ATTN_WG %s) against mma.sync: forward %.2fx, backward deterministic %.2fx, atomic dq %.2fx\n",
                   attn_cases[i].model, wg_setting, ms[i][0][0] / ms[i][1][0], ms[i][0][1] / ms[i][1][1], ms[i][0][2] / ms[i][1][2]);
    return done == n ? 0 : 1;
}

/* ---------------------------------------------------------------- training elementwise kernels
 * src/cuda/train_elementwise.cu's per-layer kernels at the 124M trainer's shapes (N = B T = 16384 rows, C 768,
 * F 2048, NH 12, NKV 4, HS 64: a packed q|k|v row of 1280, T 1024). The seam has no events, so as the matvec
 * section: EW_LAUNCHES back-to-back launches timed on the host clock around one kiln_cuda_sync (the ~10 us of
 * sync is < 1% of 30 launches of 20-80 us), the median of EW_REPS after one warm-up. Launches rotate over
 * EW_COPIES sets of buffers (>= 120 MB per op, twice the 60 MB L2), so each streams from HBM. GB/s counts the
 * bytes each kernel must move once (reads + writes, the dw partials left out: < 2%); roof = GB/s / copy_gbs.
 * The cross-entropy (src/cuda/train_loss.cu) runs at the trainer's head chunk: 4096 rows of V 32000 bf16 logits,
 * dlogits written over them (so later launches see gradients as logits: finite values, the same work). */

#define EW_COPIES 3
#define EW_LAUNCHES 30
#define EW_REPS 7

enum { EW_NORM_FWD, EW_NORM_BWD, EW_NORM_BWD_NOBF, EW_ROPE_FWD, EW_ROPE_BWD, EW_SWIGLU_FWD, EW_SWIGLU_BWD, EW_TO_BF16, EW_CE, EW_OPS };
#define EW_CE_ROWS 4096
#define EW_CE_V 32000

typedef struct {
    float *x, *y, *rstd, *dout, *dx, *dqkv;                     /* (N, C) f32 but rstd (N), dqkv (N, W) */
    kiln_bf16_t *out, *dx_bf, *qkv, *dqkv_bf, *gu, *h, *dh, *dgu; /* (N, C), (N, C), (N, W) x2, (N, 2F), (N, F) x2, (N, 2F) */
    kiln_bf16_t *logits;                                          /* (EW_CE_ROWS, EW_CE_V), its dlogits in place */
    int32_t *targets;                                             /* (EW_CE_ROWS) */
    float *losses;                                                /* (EW_CE_ROWS) */
} ew_set;

static kiln_status ew_launch(int op, const ew_set *b, float *w, float *dw, void *ws, int64_t N, int64_t C, int64_t F,
                             int64_t T, int64_t NH, int64_t NKV, int64_t HS) {
    switch (op) {
    case EW_NORM_FWD: return kiln_cuda_rmsnorm_forward_train(b->x, b->y, b->out, b->rstd, w, N, C, 1e-5f, NULL);
    case EW_NORM_BWD: return kiln_cuda_rmsnorm_backward(b->dx, b->dx_bf, dw, b->dout, b->x, w, b->rstd, N, C, ws, NULL);
    case EW_NORM_BWD_NOBF: return kiln_cuda_rmsnorm_backward(b->dx, NULL, dw, b->dout, b->x, w, b->rstd, N, C, ws, NULL);
    case EW_ROPE_FWD: return kiln_cuda_rope_forward_train(b->qkv, b->qkv, N, T, NH, NKV, HS, HS, 10000.0f, NULL, 1.0f, false, NULL);
    case EW_ROPE_BWD: return kiln_cuda_rope_backward(b->dqkv_bf, b->dqkv, N, T, NH, NKV, HS, HS, 10000.0f, NULL, 1.0f, false, NULL);
    case EW_SWIGLU_FWD: return kiln_cuda_swiglu_forward_train(b->h, b->gu, N, F, NULL);
    case EW_SWIGLU_BWD: return kiln_cuda_swiglu_backward(b->dgu, b->dh, b->gu, N, F, NULL);
    case EW_TO_BF16: return kiln_cuda_to_bf16(b->dx_bf, b->dx, N * C, NULL);
    default:
        return kiln_cuda_cross_entropy(b->losses, b->logits, b->logits, b->targets, EW_CE_ROWS, EW_CE_V, 0.0f, 1e-4f, -1,
                                       1.0f / (EW_CE_ROWS * 4), NULL);
    }
}

static int bench_train_elementwise(double copy_gbs) {
    const int64_t N = 16384, C = 768, F = 2048, T = 1024, NH = 12, NKV = 4, HS = 64, W = (NH + 2 * NKV) * HS;
    static const char *names[EW_OPS] = {"rmsnorm_forward (x += y)", "rmsnorm_backward (+ dx_bf)", "rmsnorm_backward (no dx_bf)",
                                        "rope_forward (bf16, in place)", "rope_backward (f32 -> bf16)", "swiglu_forward (bf16)",
                                        "swiglu_backward (bf16)", "to_bf16 (N x C)", "cross_entropy (4096 x 32000)"};
    const double nc = (double)(N * C), nf = (double)(N * F), rot = (double)(N * (NH + NKV) * HS);
    const double bytes[EW_OPS] = {
        14 * nc + 4.0 * N, /* x, y read; x, out, rstd written */
        18 * nc + 4.0 * N, /* dout, x, dx, rstd read; dx, dx_bf written */
        16 * nc + 4.0 * N, /* the same without dx_bf */
        4 * rot,           /* q, k read and written in bf16; v untouched */
        6.0 * N * W,       /* dqkv f32 read, bf16 written */
        6 * nf,            /* gu read, h written */
        10 * nf,           /* dh, gu read; dgu written */
        6 * nc,
        4.0 * EW_CE_ROWS * EW_CE_V, /* bf16 logits read, dlogits written over them */
    };
    ew_set set[EW_COPIES];
    memset(set, 0, sizeof set);
    float *w = NULL, *dw = NULL, *hf = malloc((size_t)(N * W) * sizeof *hf);
    int32_t *ht = malloc(EW_CE_ROWS * sizeof *ht);
    kiln_bf16 *hb = malloc((size_t)(N * 2 * F) * sizeof *hb);
    void *ws = NULL;
    uint64_t rng = 0xD1B54A32D192ED03ull;
    kiln_status st = hf && hb && ht ? KILN_OK : kiln_fail(KILN_ERR_NOMEM, "host buffers for the elementwise kernels");
    for (int i = 0; ht && i < EW_CE_ROWS; i++) ht[i] = (int32_t)(rng_next(&rng) % EW_CE_V);
    for (int64_t i = 0; hf && i < N * W; i++) hf[i] = rng_f32(&rng) + 1.5f; /* in [0.5, 2.5): rstd, w stay tame */
    for (int64_t i = 0; hb && i < N * 2 * F; i++) hb[i] = kiln_f32_to_bf16(2.0f * rng_f32(&rng));
    const size_t ncb = (size_t)(N * C) * 4;
    if (!st) st = kiln_cuda_alloc((void **)&w, (size_t)C * 4);
    if (!st) st = kiln_cuda_upload(w, hf, (size_t)C * 4);
    if (!st) st = kiln_cuda_alloc((void **)&dw, (size_t)C * 4);
    if (!st) st = kiln_cuda_upload(dw, hf, (size_t)C * 4);
    if (!st) st = kiln_cuda_alloc(&ws, kiln_cuda_rmsnorm_backward_ws_bytes(N, C));
    for (int k = 0; k < EW_COPIES && !st; k++) {
        ew_set *b = &set[k];
        float **f32s[] = {&b->x, &b->y, &b->dout, &b->dx};
        for (int i = 0; i < 4 && !st; i++)
            if (!(st = kiln_cuda_alloc((void **)f32s[i], ncb))) st = kiln_cuda_upload(*f32s[i], hf, ncb);
        if (!st && !(st = kiln_cuda_alloc((void **)&b->rstd, (size_t)N * 4))) st = kiln_cuda_upload(b->rstd, hf, (size_t)N * 4);
        if (!st && !(st = kiln_cuda_alloc((void **)&b->dqkv, (size_t)(N * W) * 4)))
            st = kiln_cuda_upload(b->dqkv, hf, (size_t)(N * W) * 4);
        if (!st) st = kiln_cuda_alloc((void **)&b->out, ncb / 2);
        if (!st) st = kiln_cuda_alloc((void **)&b->dx_bf, ncb / 2);
        if (!st) st = kiln_cuda_alloc((void **)&b->dqkv_bf, (size_t)(N * W) * 2);
        if (!st) st = kiln_cuda_alloc((void **)&b->h, (size_t)(N * F) * 2);
        if (!st) st = kiln_cuda_alloc((void **)&b->dgu, (size_t)(N * 2 * F) * 2);
        if (!st && !(st = kiln_cuda_alloc((void **)&b->qkv, (size_t)(N * W) * 2))) st = kiln_cuda_upload(b->qkv, hb, (size_t)(N * W) * 2);
        if (!st && !(st = kiln_cuda_alloc((void **)&b->gu, (size_t)(N * 2 * F) * 2)))
            st = kiln_cuda_upload(b->gu, hb, (size_t)(N * 2 * F) * 2);
        if (!st && !(st = kiln_cuda_alloc((void **)&b->dh, (size_t)(N * F) * 2))) st = kiln_cuda_upload(b->dh, hb, (size_t)(N * F) * 2);
        const size_t ce_half = (size_t)EW_CE_ROWS * EW_CE_V; /* bytes: half the logits, each half from hb */
        if (!st && !(st = kiln_cuda_alloc((void **)&b->logits, ce_half * 2)) && !(st = kiln_cuda_upload(b->logits, hb, ce_half)))
            st = kiln_cuda_upload(b->logits + ce_half / 2, hb, ce_half);
        if (!st && !(st = kiln_cuda_alloc((void **)&b->targets, EW_CE_ROWS * 4))) st = kiln_cuda_upload(b->targets, ht, EW_CE_ROWS * 4);
        if (!st) st = kiln_cuda_alloc((void **)&b->losses, EW_CE_ROWS * 4);
    }
    const bool set_up = !st;
    double us[EW_OPS] = {0};
    int done = 0;
    for (; done < EW_OPS && !st; done++) {
        double t[EW_REPS];
        for (int r = -1; r < EW_REPS && !st; r++) {
            const double t0 = kiln_bench_now();
            for (int i = 0; i < EW_LAUNCHES && !st; i++)
                st = ew_launch(done, &set[i % EW_COPIES], w, dw, ws, N, C, F, T, NH, NKV, HS);
            if (!st) st = kiln_cuda_sync();
            if (r >= 0) t[r] = (kiln_bench_now() - t0) * 1e6 / EW_LAUNCHES;
        }
        if (st) break;
        us[done] = kiln_bench_median(t, EW_REPS);
        const double gbs = bytes[done] / (us[done] * 1e-6) / 1e9;
        printf("{\"bench\":\"train_elementwise\",\"op\":");
        kiln_bench_json_str(names[done]);
        printf(",\"N\":%lld,\"C\":%lld,\"F\":%lld,\"W\":%lld,\"mb\":%.1f,\"us\":%.2f,\"gbs\":%.1f,\"roof_frac\":%.3f}\n",
               (long long)N, (long long)C, (long long)F, (long long)W, bytes[done] / 1e6, us[done], gbs, gbs / copy_gbs);
        fflush(stdout);
    }
    if (st) fprintf(stderr, "kiln bench gpu-kernels: elementwise %s: %s\n", set_up ? names[done] : "setup", kiln_last_error());
    printf("\ntraining elementwise kernels, N %lld C %lld F %lld qkv row %lld (copy %.0f GB/s)\n", (long long)N, (long long)C,
           (long long)F, (long long)W, copy_gbs);
    printf("%-30s %8s %9s %8s %6s\n", "op", "MB", "us", "GB/s", "roof");
    for (int i = 0; i < done; i++) {
        const double gbs = bytes[i] / (us[i] * 1e-6) / 1e9;
        printf("%-30s %8.1f %9.2f %8.0f %5.0f%%\n", names[i], bytes[i] / 1e6, us[i], gbs, 100 * gbs / copy_gbs);
    }
    printf("\n");
    for (int k = 0; k < EW_COPIES; k++) {
        ew_set *b = &set[k];
        void *p[] = {b->x,     b->y,  b->rstd, b->dout, b->dx,     b->dqkv,    b->out,   b->dx_bf, b->qkv,
                     b->dqkv_bf, b->gu, b->h,    b->dh,   b->dgu, b->logits, b->targets, b->losses};
        for (int i = 0; i < (int)(sizeof p / sizeof p[0]); i++) kiln_cuda_free(p[i]);
    }
    kiln_cuda_free(w), kiln_cuda_free(dw), kiln_cuda_free(ws);
    free(hf), free(hb), free(ht);
    return st ? 1 : 0;
}

/* ---------------------------------------------------------------- the sampler
 * One sampled token's cost to a decode step, each way, on random logits (uniform in [-4, 4): peaked, as a model's):
 * the GPU sampler (kiln_cuda_sample, then the 4-byte token read back, synchronized), against the host's (the V
 * logits read back, synchronized, then kiln_sampler_sample). The median of SAMPLE_REPS after 5 warm-ups. */
#define SAMPLE_REPS 200

static int bench_sample(void) {
    static const int64_t vocabs[] = {32000, 151936};
    struct {
        const char *name;
        kiln_sampler_params p;
    } sets[3] = {{"defaults", kiln_sampler_default()},
                 {"multinomial", {.temp = 1.0f, .top_p = 1.0f, .repeat_penalty = 1.0f, .seed = 1}},
                 {"top-p 0.9", {.temp = 0.8f, .top_p = 0.9f, .repeat_penalty = 1.0f, .seed = 1}}};
    sets[0].p.repeat_penalty = 1.1f; /* and the penalties over the default window of 64 */
    const int64_t Vmax = 151936;
    float *h = malloc(sizeof(float) * (size_t)Vmax), *back = malloc(sizeof(float) * (size_t)Vmax);
    int32_t hist[64];
    void *d_logits = NULL, *d_args = NULL, *d_out = NULL, *work = NULL;
    kiln_status st = h && back ? KILN_OK : kiln_fail(KILN_ERR_NOMEM, "out of memory");
    if (!st) st = kiln_cuda_alloc(&d_logits, sizeof(float) * (size_t)Vmax);
    if (!st) st = kiln_cuda_alloc(&d_args, sizeof(kiln_sample_args));
    if (!st) st = kiln_cuda_alloc(&d_out, sizeof(int32_t));
    if (!st) st = kiln_cuda_alloc(&work, kiln_cuda_sample_work_bytes(Vmax));
    uint64_t rng = 99;
    double res[2][3][2];
    for (int vi = 0; vi < 2 && !st; vi++) {
        const int64_t V = vocabs[vi];
        for (int64_t i = 0; i < V; i++) h[i] = rng_f32(&rng) * 4.0f;
        for (int i = 0; i < 64; i++) hist[i] = (int32_t)(rng_next(&rng) % (uint64_t)V);
        if (!st) st = kiln_cuda_upload(d_logits, h, sizeof(float) * (size_t)V);
        for (int si = 0; si < 3 && !st; si++) {
            kiln_sampler *sg = NULL, *sc = NULL;
            st = kiln_sampler_new(&sets[si].p, V, &sg);
            if (!st) st = kiln_sampler_new(&sets[si].p, V, &sc);
            double t_gpu[SAMPLE_REPS], t_host[SAMPLE_REPS];
            for (int r = -5; r < SAMPLE_REPS && !st; r++) {
                kiln_sample_args a;
                int32_t tok;
                double t0 = kiln_bench_now();
                if (!kiln_sampler_step_args(sg, hist, 64, &a)) st = kiln_fail(KILN_ERR_INVALID, "sample bench: window refused");
                if (!st) st = kiln_cuda_upload(d_args, &a, sizeof a);
                if (!st) st = kiln_cuda_sample((int32_t *)d_out, d_logits, V, d_args, work, NULL);
                if (!st) st = kiln_cuda_download(&tok, d_out, sizeof tok);
                if (!st) st = kiln_cuda_sync();
                double t1 = kiln_bench_now();
                if (!st) st = kiln_cuda_download(back, d_logits, sizeof(float) * (size_t)V);
                if (!st) st = kiln_cuda_sync();
                if (!st) tok = kiln_sampler_sample(sc, back, hist, 64);
                double t2 = kiln_bench_now();
                if (r >= 0) t_gpu[r] = t1 - t0, t_host[r] = t2 - t1;
            }
            kiln_sampler_free(sg), kiln_sampler_free(sc);
            if (st) break;
            res[vi][si][0] = kiln_bench_median(t_gpu, SAMPLE_REPS) * 1e6;
            res[vi][si][1] = kiln_bench_median(t_host, SAMPLE_REPS) * 1e6;
            printf("{\"bench\":\"gpu_sample\",\"vocab\":%lld,\"setting\":\"%s\",\"gpu_us\":%.2f,\"host_us\":%.2f,\"speedup\":%.2f}\n",
                   (long long)V, sets[si].name, res[vi][si][0], res[vi][si][1], res[vi][si][1] / res[vi][si][0]);
        }
    }
    kiln_cuda_free(d_logits), kiln_cuda_free(d_args), kiln_cuda_free(d_out), kiln_cuda_free(work);
    free(h), free(back);
    if (st) {
        fprintf(stderr, "kiln bench gpu-kernels: sample: %s\n", kiln_last_error());
        return 1;
    }
    printf("\none sampled token (us, median of %d): GPU sampler + 4-byte read back, against V logits read back + the host sampler\n",
           SAMPLE_REPS);
    printf("%-7s %-12s %9s %9s %8s\n", "vocab", "setting", "gpu us", "host us", "speedup");
    for (int vi = 0; vi < 2; vi++)
        for (int si = 0; si < 3; si++)
            printf("%-7lld %-12s %9.1f %9.1f %7.2fx\n", (long long)vocabs[vi], sets[si].name, res[vi][si][0], res[vi][si][1],
                   res[vi][si][1] / res[vi][si][0]);
    return 0;
}

#define PHASES 2000

static int bench_phases(void) {
    static const size_t bytes[] = {0, 2048, 16384};
    double us[3][3];
    int n_cta = 0;
    for (int i = 0; i < 3; i++) {
        if (kiln_cuda_phase_bench(PHASES, bytes[i], &n_cta, us[i])) {
            fprintf(stderr, "kiln bench gpu-kernels: phases: %s\n", kiln_last_error());
            return 1;
        }
        printf("{\"bench\":\"gpu_phases\",\"phases\":%d,\"ctas\":%d,\"bytes_per_cta\":%zu,\"kernel_us\":%.3f,"
               "\"kernel_pdl_us\":%.3f,\"barrier_us\":%.3f,\"barrier_vs_pdl\":%.3f}\n",
               PHASES, n_cta, bytes[i], us[i][0], us[i][1], us[i][2], us[i][2] / us[i][1]);
    }
    printf("\none phase of %d CTAs (one per SM) that each read their bytes and write a float, us a phase (best of 5 x %d):\n"
           "a kernel a phase in a CUDA graph, without and with PDL, against a grid barrier in one persistent kernel\n",
           n_cta, PHASES);
    printf("%-12s %12s %12s %12s %16s\n", "bytes a CTA", "kernel", "kernel+PDL", "barrier", "barrier/(k+PDL)");
    for (int i = 0; i < 3; i++)
        printf("%-12zu %12.3f %12.3f %12.3f %15.2fx\n", bytes[i], us[i][0], us[i][1], us[i][2], us[i][2] / us[i][1]);
    return 0;
}

int kiln_bench_gpu_kernels(int argc, char **argv) {
    bool quick = false, attention_only = false, few_only = false, sample_only = false, phases_only = false, train_only = false,
         matvec_only = false;
    if (parse_args(argc, argv, &quick, &attention_only, &few_only, &sample_only, &phases_only, &train_only, &matvec_only)) return 1;
    if (kiln_cuda_device_count() == 0) {
        fprintf(stderr, "kiln bench gpu-kernels: no CUDA device (or kiln built without CUDA)\n");
        return 1;
    }
    char dev[128];
    double copy_gbs = 0;
    kiln_status st = kiln_cuda_device_describe(dev, sizeof dev);
    if (!st) st = kiln_cuda_copy_bandwidth(&copy_gbs);
    if (st) {
        fprintf(stderr, "kiln bench gpu-kernels: %s\n", kiln_last_error());
        return 1;
    }
    printf("{\"bench\":\"gpu_kernels_device\",\"device\":");
    kiln_bench_json_str(dev);
    printf(",\"copy_gbs\":%.1f}\n", copy_gbs);
    if (attention_only) return bench_attention();
    if (sample_only) return bench_sample();
    if (phases_only) return bench_phases();
    if (train_only) return bench_train_elementwise(copy_gbs);

    static const int64_t Ts_all[] = {1, 2, 4, 8}, Ts_few[] = {16, 32};
    const int n_T = few_only ? 0 : quick ? 1 : 4, n_few = quick ? 0 : 2, reps = quick ? 3 : REPS;
    const int n_cases = (int)(sizeof cases / sizeof cases[0]);
    result *res = calloc((size_t)n_cases * 8, sizeof *res);
    kiln_cuda_gemm_ws ws = {0};
    if (n_few && (st = kiln_cuda_gemm_ws_new(&ws, 0, 32 * 11008))) {
        fprintf(stderr, "kiln bench gpu-kernels: %s\n", kiln_last_error());
        return 1;
    }
    int n_res = 0;
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    int rc = 0;
    for (int ci = 0; ci < n_cases && !rc; ci++) {
        const mv_case *c = &cases[ci];
        const size_t row_bytes = kiln_type_row_bytes(c->type, c->cols), bytes = row_bytes * (size_t)c->rows;
        const int nw = c->glu ? 2 : 1;
        int n_copies = (int)((ROTATE_BYTES + nw * bytes - 1) / (nw * bytes));
        if (n_copies < 2) n_copies = 2;
        if (n_copies > MAX_COPIES) n_copies = MAX_COPIES;
        kiln_cuda_wt wg[MAX_COPIES], wu[MAX_COPIES];
        void *dw[2 * MAX_COPIES] = {0};
        float *hx = malloc((size_t)(32 * c->cols) * sizeof *hx);
        uint8_t *hw = make_weight(c->type, c->rows, c->cols, &rng);
        void *dx = NULL, *dy = NULL, *dxp = NULL;
        st = hw && hx ? KILN_OK : kiln_fail(KILN_ERR_NOMEM, "host buffers for %s", c->what);
        for (int k = 0; k < nw * n_copies && !st; k++)
            if (!(st = kiln_cuda_alloc(&dw[k], bytes))) st = kiln_cuda_upload(dw[k], hw, bytes);
        for (int64_t i = 0; hx && i < 32 * c->cols; i++) hx[i] = rng_f32(&rng);
        if (!st) st = kiln_cuda_alloc(&dx, (size_t)(32 * c->cols) * sizeof(float));
        if (!st) st = kiln_cuda_upload(dx, hx, (size_t)(32 * c->cols) * sizeof(float));
        if (!st) st = kiln_cuda_alloc(&dy, (size_t)(32 * c->rows) * sizeof(float));
        if (!st) st = kiln_cuda_alloc(&dxp, kiln_cuda_matvec_prep_bytes(32, c->cols));
        for (int k = 0; k < n_copies; k++) {
            wg[k] = (kiln_cuda_wt){c->type, c->rows, c->cols, row_bytes, dw[k]};
            wu[k] = (kiln_cuda_wt){c->type, c->rows, c->cols, row_bytes, dw[c->glu ? n_copies + k : k]};
        }
        for (int ti = 0; ti < n_T && !st; ti++) {
            const int64_t T = Ts_all[ti];
            if ((st = kiln_cuda_matvec_prepare(dxp, dx, T, c->cols, NULL))) break;
            {
                result *r = &res[n_res];
                *r = (result){c, T, {0, 0}, 0, "matvec"};
                const few_args fa = {c, T, wg, wu, NULL, NULL, dy, dx, dxp, NULL, K_MATVEC};
                if ((st = time_few(&fa, n_copies, reps, &r->tm))) break;
                r->gbs = (double)(nw * bytes) / (r->tm.us * 1e-6) / 1e9;
                r->kernel = "matvec";
                n_res++;
                printf("{\"bench\":\"gpu_kernel\",\"model\":\"%s\",\"op\":\"%s\",\"type\":\"%s\",\"rows\":%lld,\"cols\":%lld,"
                       "\"glu\":%s,\"T\":%lld,\"weight_mb\":%.2f,\"us\":%.2f,\"host_us\":%.2f,\"gbs\":%.1f,"
                       "\"roof_frac\":%.3f}\n",
                       c->model, c->what, kiln_type_name(c->type), (long long)c->rows, (long long)c->cols,
                       c->glu ? "true" : "false", (long long)T, (double)(nw * bytes) / 1e6, r->tm.us,
                       r->tm.host_us, r->gbs, r->gbs / copy_gbs);
                fflush(stdout);
            }
        }
        /* 16 and 32 rows: gemm_small on the blocks, then cuBLASLt on bf16 copies (left unwritten: its time does not
         * depend on the values) of as many bytes in all */
        const kiln_cuda_wt probe = {c->type, c->rows, c->cols, row_bytes, NULL};
        const int n_bf = (int)((ROTATE_BYTES + nw * 2 * (size_t)(c->rows * c->cols) - 1) / (nw * 2 * (size_t)(c->rows * c->cols))) + 1;
        void *dbf[2 * MAX_COPIES] = {0};
        kiln_cuda_wt bg[MAX_COPIES], bu[MAX_COPIES];
        const bool few = n_few && !st && kiln_cuda_gemm_small_takes(&probe, 16) && n_bf <= MAX_COPIES;
        for (int k = 0; few && k < nw * n_bf && !st; k++)
            st = kiln_cuda_alloc(&dbf[k], 2 * (size_t)(c->rows * c->cols));
        for (int k = 0; few && k < n_bf; k++) {
            bg[k] = (kiln_cuda_wt){KILN_TYPE_BF16, c->rows, c->cols, 2 * (size_t)c->cols, dbf[k]};
            bu[k] = (kiln_cuda_wt){KILN_TYPE_BF16, c->rows, c->cols, 2 * (size_t)c->cols, dbf[c->glu ? n_bf + k : k]};
        }
        for (int ti = 0; few && ti < n_few && !st; ti++) {
            const int64_t T = Ts_few[ti];
            if ((st = kiln_cuda_matvec_prepare(dxp, dx, T, c->cols, NULL))) break;
            for (int blas = 0; blas <= 1 && !st; blas++) {
                const few_args fa = {c, T, wg, wu, bg, bu, dy, dx, dxp, &ws, blas ? K_BLAS : K_SMALL};
                result *r = &res[n_res];
                *r = (result){c, T, {0, 0}, 0, blas ? "cublaslt bf16" : "gemm_small"};
                if ((st = time_few(&fa, blas ? n_bf : n_copies, reps, &r->tm))) break;
                const double wbytes = blas ? (double)(nw * 2 * c->rows * c->cols) : (double)(nw * bytes);
                r->gbs = wbytes / (r->tm.us * 1e-6) / 1e9;
                n_res++;
                printf("{\"bench\":\"gpu_kernel\",\"model\":\"%s\",\"op\":\"%s\",\"type\":\"%s\",\"kernel\":\"%s\",\"rows\":%lld,"
                       "\"cols\":%lld,\"glu\":%s,\"T\":%lld,\"weight_mb\":%.2f,\"us\":%.2f,\"host_us\":%.2f,\"gbs\":%.1f,"
                       "\"roof_frac\":%.3f}\n",
                       c->model, c->what, kiln_type_name(c->type), r->kernel, (long long)c->rows, (long long)c->cols,
                       c->glu ? "true" : "false", (long long)T, wbytes / 1e6, r->tm.us, r->tm.host_us, r->gbs, r->gbs / copy_gbs);
                fflush(stdout);
            }
        }
        for (int k = 0; k < 2 * MAX_COPIES; k++) kiln_cuda_free(dbf[k]);
        if (st) {
            fprintf(stderr, "kiln bench gpu-kernels: %s %s %s %lld x %lld: %s\n", c->model, c->what,
                    kiln_type_name(c->type), (long long)c->rows, (long long)c->cols, kiln_last_error());
            rc = 1;
        }
        for (int k = 0; k < nw * n_copies; k++) kiln_cuda_free(dw[k]);
        kiln_cuda_free(dx), kiln_cuda_free(dy), kiln_cuda_free(dxp);
        free(hw), free(hx);
    }

    printf("\n%s, copy %.0f GB/s (read + write)\n", dev, copy_gbs);
    printf("%-5s %-8s %-5s %-13s %6s %6s %2s %9s %9s %8s %6s\n", "model", "op", "type", "kernel", "rows", "cols", "T", "us",
           "host_us", "GB/s", "roof");
    for (int i = 0; i < n_res; i++) {
        const result *r = &res[i];
        printf("%-5s %-8s %-5s %-13s %6lld %6lld %2lld %9.2f %9.2f %8.0f %5.0f%%\n", r->c->model, r->c->what,
               kiln_type_name(r->c->type), r->kernel, (long long)r->c->rows, (long long)r->c->cols, (long long)r->T,
               r->tm.us, r->tm.host_us, r->gbs, 100 * r->gbs / copy_gbs);
    }
    free(res);
    kiln_cuda_gemm_ws_free(&ws);
    printf("\n");
    if (few_only || matvec_only) return rc;
    rc |= bench_sample();
    rc |= bench_train_elementwise(copy_gbs);
    rc |= bench_phases();
    return bench_attention() || rc;
}

#else

int kiln_bench_gpu_kernels(int argc, char **argv) {
    bool quick = false, attention_only = false, few_only = false, sample_only = false, phases_only = false, train_only = false,
         matvec_only = false;
    if (parse_args(argc, argv, &quick, &attention_only, &few_only, &sample_only, &phases_only, &train_only, &matvec_only)) return 1;
    fprintf(stderr, "kiln: bench gpu-kernels: kiln was built without CUDA (nvcc was not on the PATH)\n");
    return 1;
}

#endif
