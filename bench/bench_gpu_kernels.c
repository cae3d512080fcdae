/* bench_gpu_kernels.c: `kiln bench gpu-kernels [--quick]`: the decode matmuls of src/cuda/matvec.cu alone, on the
 * shapes a 7B and a 1.1B LLaMA decode runs (q/k/v/o, merged qkv, GLU gate+up, down, the head) in the types those
 * models ship in, for T = 1, 2, 4, 8 tokens (--quick: T = 1, fewer repetitions).
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
 * decode to). Without a GPU: one line on stderr, exit 1. */
#include "bench/bench.h"

#include "cuda/cuda.h"
#include "cuda/kernels.h"
#include "fp16.h"
#include "status.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    {"7b", "q/k/v/o", KILN_TYPE_F16, 4096, 4096, false},
    {"7b", "gate+up", KILN_TYPE_F16, 11008, 4096, true},
    {"7b", "down", KILN_TYPE_F16, 4096, 11008, false},
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
        if (t == KILN_TYPE_Q6_K) memcpy(p + bs - 2, &d, 2); /* block_q6_K ends with d */
        else if (t == KILN_TYPE_Q8_0 || t == KILN_TYPE_Q4_0 || t == KILN_TYPE_Q5_0) memcpy(p, &d, 2);
        else memcpy(p, &d, 2), memcpy(p + 2, &m, 2); /* Q4_1 d, m; Q4_K / Q5_K d, dmin */
    }
    return w;
}

typedef struct {
    double us, host_us;
} timing;

/* One case at one T: the median of REPS rounds of n launches rotating over the copies. */
static kiln_status time_case(const mv_case *c, int64_t T, kiln_cuda_wt *wg, kiln_cuda_wt *wu, int n_copies, float *y,
                             const float *x, const void *xp, int reps, timing *out) {
    double t_all[REPS], t_host[REPS];
    kiln_status st;
    for (int i = 0; i < 10; i++) { /* warm-up: first-launch costs, clocks */
        st = c->glu ? kiln_cuda_matvec_glu(y, x, xp, &wg[i % n_copies], &wu[i % n_copies], T, false, NULL)
                    : kiln_cuda_matvec(y, x, xp, &wg[i % n_copies], T, false, NULL);
        if (st) return st;
    }
    if ((st = kiln_cuda_sync())) return st;
    for (int r = 0; r < reps; r++) {
        const double t0 = kiln_bench_now();
        for (int i = 0; i < LAUNCHES; i++) {
            const int k = i % n_copies;
            st = c->glu ? kiln_cuda_matvec_glu(y, x, xp, &wg[k], &wu[k], T, false, NULL)
                        : kiln_cuda_matvec(y, x, xp, &wg[k], T, false, NULL);
            if (st) return st;
        }
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
} result;

int kiln_bench_gpu_kernels(int argc, char **argv) {
    bool quick = false;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) quick = true;
        else {
            fprintf(stderr, "kiln bench gpu-kernels: unknown argument '%s' (usage: kiln bench gpu-kernels [--quick])\n", argv[i]);
            return 2;
        }
    }
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

    static const int64_t Ts_all[] = {1, 2, 4, 8};
    const int n_T = quick ? 1 : 4, reps = quick ? 3 : REPS;
    const int n_cases = (int)(sizeof cases / sizeof cases[0]);
    result *res = calloc((size_t)n_cases * 4, sizeof *res);
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
        float *hx = malloc((size_t)(8 * c->cols) * sizeof *hx);
        uint8_t *hw = make_weight(c->type, c->rows, c->cols, &rng);
        void *dx = NULL, *dy = NULL, *dxp = NULL;
        st = hw && hx ? KILN_OK : kiln_fail(KILN_ERR_NOMEM, "host buffers for %s", c->what);
        for (int k = 0; k < nw * n_copies && !st; k++)
            if (!(st = kiln_cuda_alloc(&dw[k], bytes))) st = kiln_cuda_upload(dw[k], hw, bytes);
        for (int64_t i = 0; hx && i < 8 * c->cols; i++) hx[i] = rng_f32(&rng);
        if (!st) st = kiln_cuda_alloc(&dx, (size_t)(8 * c->cols) * sizeof(float));
        if (!st) st = kiln_cuda_upload(dx, hx, (size_t)(8 * c->cols) * sizeof(float));
        if (!st) st = kiln_cuda_alloc(&dy, (size_t)(8 * c->rows) * sizeof(float));
        if (!st) st = kiln_cuda_alloc(&dxp, kiln_cuda_matvec_prep_bytes(8, c->cols));
        for (int k = 0; k < n_copies; k++) {
            wg[k] = (kiln_cuda_wt){c->type, c->rows, c->cols, row_bytes, dw[k]};
            wu[k] = (kiln_cuda_wt){c->type, c->rows, c->cols, row_bytes, dw[c->glu ? n_copies + k : k]};
        }
        for (int ti = 0; ti < n_T && !st; ti++) {
            const int64_t T = Ts_all[ti];
            if ((st = kiln_cuda_matvec_prepare(dxp, dx, T, c->cols, NULL))) break;
            {
                result *r = &res[n_res];
                *r = (result){c, T, {0, 0}, 0};
                if ((st = time_case(c, T, wg, wu, n_copies, dy, dx, dxp, reps, &r->tm))) break;
                r->gbs = (double)(nw * bytes) / (r->tm.us * 1e-6) / 1e9;
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
    printf("%-5s %-8s %-5s %6s %6s %2s %9s %9s %8s %6s\n", "model", "op", "type", "rows", "cols", "T", "us",
           "host_us", "GB/s", "roof");
    for (int i = 0; i < n_res; i++) {
        const result *r = &res[i];
        printf("%-5s %-8s %-5s %6lld %6lld %2lld %9.2f %9.2f %8.0f %5.0f%%\n", r->c->model, r->c->what,
               kiln_type_name(r->c->type), (long long)r->c->rows, (long long)r->c->cols, (long long)r->T,
               r->tm.us, r->tm.host_us, r->gbs, 100 * r->gbs / copy_gbs);
    }
    free(res);
    return rc;
}

#else

int kiln_bench_gpu_kernels(int argc, char **argv) {
    fprintf(stderr, "kiln: bench gpu-kernels: kiln was built without CUDA (nvcc was not on the PATH)\n");
    return 1;
}

#endif
