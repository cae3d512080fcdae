/* bench_gpu.c: `kiln bench --gpu -m MODEL`: prompt processing (pp) and token generation (tg) of a whole model on
 * CUDA device 0 (a session with every layer offloaded, params.n_gpu_layers = L, src/cuda/engine.cu), as
 * llama-bench measures them, against two roofs measured in the same run and against llama.cpp's CUDA figures that
 * issue #7 records.
 *
 * The device, measured once per run (one JSON object, "bench":"gpu_device"):
 *   copy_gbs    kiln_cuda_copy_bandwidth: a device-to-device copy, bytes read plus written per second. A decode
 *               only reads, so this is the roof it is held to (the engine's goal: 85% of it).
 *   gemm_tflops kiln_cuda_gemm on a BF16 weight of 8192 x 8192 (random finite bf16, used in place) and T = 8192
 *               random f32 input rows: 2 * 8192^3 flops per call, best of GEMM_ROUNDS rounds of GEMM_REPS calls
 *               timed on the host around kiln_cuda_sync. It includes gemm's f32 -> bf16 rounding of x (256 MiB
 *               read, 128 MiB written: about 0.1 ms of ~1.5 ms), so it is the rate kiln's prefill matmul path can
 *               reach, a little under cuBLAS alone (H200 dense bf16 peak: 989 TFLOP/s).
 *
 * Each model (one JSON object, "bench":"gpu_model"): one session, n_batch 512, n_ctx the longest case needs plus
 * CTX_SLACK, or -c's if that is larger (a decode graph's attention grid is sized by n_ctx, so a server's context of
 * 4096 can decode at another speed than the smallest one); token ids are random valid ids (seeded, the same every run). Every case runs once untimed (warm-up:
 * the first decode captures the CUDA graph, cuBLASLt picks its plans) and then --reps times (default 3); best and
 * median are reported. Times are host wall clock (CLOCK_MONOTONIC): every eval reads its argmax back, which
 * waits for the GPU, so the wall time covers the work.
 *   ppP  kiln_session_reset, then a prefill of P tokens from position 0 with kiln_session_eval_argmax (the last
 *        row's argmax; no logits copied back): P / seconds. TFLOP/s counts the matmuls as bench_model.c does:
 *        2 * P * (elements of every layer's matmul weights, the output gate's included) + 2 * V * C (the head,
 *        last row only) + attention's QK^T and PV, 4 * NH * HS per (query, key) pair seen, i.e. P(P+1)/2 pairs
 *        per full layer (a sliding layer of window W sees at most W keys per query). The embedding gather is not a
 *        matmul and is not counted, nor is the dequantization of block-format weights to bf16 that the prefill
 *        path does: both are overhead against the bf16 GEMM roof. roof_frac = TFLOP/s / gemm_tflops.
 *   tgN  kiln_session_reset, an untimed prompt of TG_PROMPT tokens, then N single-token greedy decodes with
 *        kiln_session_eval_argmax, each fed the argmax of the last: N / seconds. GB/s counts the bytes a decode
 *        must read: every weight except token_embd (norms and biases included), one row of token_embd (and the
 *        whole table again when the head is tied, m->output == m->tok_embd), and the f16 keys and values of every
 *        position attended to (a sliding layer: at most its window), summed over the N decodes' positions.
 *        roof_frac = GB/s / copy_gbs.
 *   vram_gib     kiln_session_device_bytes: what the engine holds (weights, cache, activations, workspaces).
 *   session_s    kiln_session_new: mostly the weights' upload.
 *   profile      kiln_session_profile: one decode step at position TG_PROMPT + N/2 (the tg decodes' middle),
 *                op by op, PROFILE_REPS times; each op's bytes as the engine counts them. The ops run outside the
 *                graph with events between launches, so their sum exceeds the graph's step (1000 / median tg tok/s)
 *                by the launch gaps; both are printed.
 *   batched      -b LIST: a context of max(B) sequences (the session freed first), and for each B: every sequence
 *                gets the TG_PROMPT-token prompt, then N steps decode one token of each of the B sequences in one
 *                kiln_context_decode, each fed its own argmax; aggregate tok/s = B * N / median seconds, and the step
 *                time against B = 1's (the weights are read once per step, so it should grow far slower than B).
 *   peer, goals  llama.cpp's CUDA figures on one H200 from issue #7 (not measured in this run), matched by shape
 *                (n_layer, n_embd, n_ff) and by the Q4_K_M mix read off the tensor types; or, with --peer-bin
 *                PATH, llama.cpp's llama-bench run on the same file in this run (-ngl 99 -fa 1 and the same -p, -n,
 *                -r; its mean tok/s per test, read from its -o jsonl lines). ratio = kiln's median tok/s / the
 *                peer's. The goals of issue #7 are judged on the median too, and only for the test they name.
 * Output: the device object, one object per model on stdout, then a table (--json-only leaves it out). An error
 * is one line on stderr and exit status 1 (2 for a bad command line); a failed profile alone is reported in the
 * model's object ("profile": null, "profile_error") and on stderr, the run goes on, and the exit status is 1. */
#include "bench/bench.h"
#include "tools/cli.h"

#include "cuda/cuda.h"
#include "cuda/kernels.h"
#include "model/backend.h"
#include "model/model.h"
#include "status.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_ITEMS 16     /* models or prompt lengths named on one command line */
#define MAX_REPS 1000
#define TG_PROMPT 16     /* tokens in the cache before tg's timed decodes start */
#define MAX_BATCH 256    /* -b: sequences decoded together at most */
#define CTX_SLACK 16     /* positions beyond the longest case */
#define PROFILE_REPS 20  /* decode steps the per-op profile averages */
#define GEMM_N 8192      /* the GEMM roof's O = I = T */
#define GEMM_REPS 10     /* calls per timed round */
#define GEMM_ROUNDS 3

static const char PEER_SOURCE[] = "issue #7, llama.cpp CUDA sm_90 FA on, same kind of machine, not this run";
static const char PEER_MEASURED[] = "llama.cpp's llama-bench (--peer-bin) in this run, same file, -ngl 99 -fa 1, same -p, -n, -r";

/* Prints "kiln bench --gpu: WHAT: <last error>" and returns 1. The caller clears the error before the call, so a
 * status returned without a message (the engine's temporary stub) shows its name, not a stale message. */
static int report(const char *what, kiln_status st) {
    const char *msg = kiln_last_error();
    fprintf(stderr, "kiln bench --gpu: %s: %s\n", what, *msg ? msg : kiln_status_name(st));
    return 1;
}

/* ---------------------------------------------------------------- the device's roofs */

typedef struct {
    char name[128];      /* kiln_cuda_device_describe */
    double copy_gbs;     /* read + written bytes per second / 1e9 */
    double gemm_tflops;  /* bf16 GEMM through kiln_cuda_gemm, 2 * GEMM_N^3 flops per call */
    double gemm_call_s;  /* its best time per call */
} device_roofs;

static uint64_t xorshift(uint64_t *x) { /* xorshift64*: the same numbers every run */
    *x ^= *x >> 12, *x ^= *x << 25, *x ^= *x >> 27;
    return *x * 0x2545F4914F6CDD1Dull;
}

#ifdef KILN_CUDA
static float rand_pm1(uint64_t *x) { return (float)((double)(xorshift(x) >> 40) / (double)(1ull << 24) * 2.0 - 1.0); }

/* y (T, O) = x (T, I) W^T with W (O = GEMM_N rows of I = GEMM_N) BF16 and T = GEMM_N, as the prefill runs it. */
static int measure_gemm(device_roofs *d) {
    const size_t n = (size_t)GEMM_N * GEMM_N;
    int rc = 1;
    kiln_status st;
    void *dw = NULL, *dx = NULL, *dy = NULL;
    kiln_cuda_gemm_ws ws = {0};
    uint16_t *hw = malloc(n * sizeof *hw); /* (O, I) bf16 bits */
    float *hx = malloc(n * sizeof *hx);    /* (T, I) f32 */
    if (!hw || !hx) {
        fprintf(stderr, "kiln bench --gpu: gemm roof: out of host memory for %zu MiB of inputs\n", n * 6 >> 20);
        goto out;
    }
    uint64_t seed = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < n; i++) { /* bf16 = the top half of an f32 in [-1, 1): finite, never NaN */
        const float f = rand_pm1(&seed);
        uint32_t u;
        memcpy(&u, &f, sizeof u);
        hw[i] = (uint16_t)(u >> 16);
        hx[i] = rand_pm1(&seed);
    }
    kiln_clear_error();
    if ((st = kiln_cuda_alloc(&dw, n * sizeof *hw)) || (st = kiln_cuda_alloc(&dx, n * sizeof *hx)) ||
        (st = kiln_cuda_alloc(&dy, n * sizeof(float)))) {
        report("gemm roof: device memory", st);
        goto out;
    }
    if ((st = kiln_cuda_upload(dw, hw, n * sizeof *hw)) || (st = kiln_cuda_upload(dx, hx, n * sizeof *hx))) {
        report("gemm roof: upload", st);
        goto out;
    }
    /* BF16 weights are used in place, so no weight workspace; x's bf16 copy needs T * I elements */
    if ((st = kiln_cuda_gemm_ws_new(&ws, 0, n))) {
        report("gemm roof: workspace", st);
        goto out;
    }
    const kiln_cuda_wt W = {.type = KILN_TYPE_BF16, .rows = GEMM_N, .cols = GEMM_N, .row_bytes = (size_t)GEMM_N * 2, .data = dw};
    for (int i = 0; i < 2; i++) /* warm-up: cuBLASLt's plan, clocks up */
        if ((st = kiln_cuda_gemm(dy, dx, &W, GEMM_N, false, &ws, NULL))) {
            report("gemm roof: kiln_cuda_gemm", st);
            goto out;
        }
    if ((st = kiln_cuda_sync())) {
        report("gemm roof: warm-up", st);
        goto out;
    }
    d->gemm_call_s = 1e30;
    for (int r = 0; r < GEMM_ROUNDS; r++) {
        const double a = kiln_bench_now();
        for (int i = 0; i < GEMM_REPS; i++)
            if ((st = kiln_cuda_gemm(dy, dx, &W, GEMM_N, false, &ws, NULL))) {
                report("gemm roof: kiln_cuda_gemm", st);
                goto out;
            }
        if ((st = kiln_cuda_sync())) {
            report("gemm roof: kiln_cuda_sync", st);
            goto out;
        }
        const double t = (kiln_bench_now() - a) / GEMM_REPS;
        if (t < d->gemm_call_s) d->gemm_call_s = t;
    }
    d->gemm_tflops = 2.0 * (double)GEMM_N * GEMM_N * GEMM_N / d->gemm_call_s / 1e12;
    rc = 0;
out:
    kiln_cuda_gemm_ws_free(&ws); /* accepts the zeroed ws */
    kiln_cuda_free(dw);
    kiln_cuda_free(dx);
    kiln_cuda_free(dy);
    free(hw);
    free(hx);
    return rc;
}
#else
static int measure_gemm(device_roofs *d) { /* unreachable: no device without CUDA; kernels.h has no stand-ins */
    fprintf(stderr, "kiln bench --gpu: gemm roof: kiln was built without CUDA\n");
    return 1;
}
#endif

static int measure_device(device_roofs *d) {
    kiln_status st;
    kiln_clear_error();
    if ((st = kiln_cuda_device_describe(d->name, sizeof d->name))) return report("device", st);
    kiln_clear_error();
    if ((st = kiln_cuda_copy_bandwidth(&d->copy_gbs))) return report("copy bandwidth", st);
    if (!(d->copy_gbs > 0)) {
        fprintf(stderr, "kiln bench --gpu: copy bandwidth: measured %g GB/s\n", d->copy_gbs);
        return 1;
    }
    if (measure_gemm(d)) return 1;
    printf("{\"bench\":\"gpu_device\",\"device\":");
    kiln_bench_json_str(d->name);
    printf(",\"copy_gbs\":%.3f,\"copy_note\":\"device-to-device copy, bytes read plus written\",\"gemm_tflops\":%.3f,"
           "\"gemm_call_s\":%.6e,\"gemm_O\":%d,\"gemm_I\":%d,\"gemm_T\":%d,\"gemm_reps\":%d,\"gemm_rounds\":%d,"
           "\"gemm_note\":\"kiln_cuda_gemm, BF16 weight in place, f32 x rounded to bf16 inside the call (included, small), "
           "f32 output; best round\"}\n",
           d->copy_gbs, d->gemm_tflops, d->gemm_call_s, GEMM_N, GEMM_N, GEMM_N, GEMM_REPS, GEMM_ROUNDS);
    fflush(stdout);
    return 0;
}

/* ---------------------------------------------------------------- what a model costs */

/* Sizes read off the bound weights (not the file's tensor list, which may hold tensors the forward never reads). */
typedef struct {
    uint64_t layer_bytes;   /* every layer tensor: matmuls, norms, biases */
    uint64_t embd_bytes;    /* token_embd */
    uint64_t embd_row;      /* one row of it */
    uint64_t head_bytes;    /* output_norm, and output when untied */
    uint64_t layer_params;  /* elements of the matmul weights of all layers (7, or 8 with the output gate) */
    uint64_t head_params;   /* V * C */
    uint64_t kv_pos_bytes;  /* one position's key and value in one layer, in the cache types (-ctk/-ctv) */
    bool tied;              /* the head is token_embd */
} model_cost;

static uint64_t elems(const kiln_tensor_view *t) { return (uint64_t)(t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]); }
static uint64_t nbytes(const kiln_tensor_view *t) { return t ? t->nbytes : 0; } /* optional tensors are NULL */

static model_cost model_cost_of(const kiln_model *m, const kiln_session_params *kv) {
    const kiln_llama_config *c = &m->cfg;
    const bool tied = m->output == m->tok_embd;
    const int64_t KV = c->n_head_kv * c->head_dim;
    model_cost k = {.embd_bytes = m->tok_embd->nbytes, .embd_row = m->tok_embd->nb[1],
                    .head_bytes = m->output_norm->nbytes + (tied ? 0 : m->output->nbytes), .head_params = elems(m->output),
                    .kv_pos_bytes = (uint64_t)(kiln_kv_row_bytes(kv->type_k, KV) + kiln_kv_row_bytes(kv->type_v, KV)), .tied = tied};
    for (int64_t l = 0; l < c->n_layer; l++) {
        const kiln_llama_layer *w = &m->layers[l];
        const kiln_tensor_view *mats[] = {w->wq, w->wk, w->wv, w->wo, w->w_gate, w->w_up, w->w_down, w->w_attn_gate};
        const kiln_tensor_view *small[] = {w->attn_norm, w->ffn_norm, w->bq, w->bk, w->bv, w->q_norm, w->k_norm,
                                           w->post_attn_norm, w->post_ffn_norm};
        for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++)
            if (mats[i]) k.layer_bytes += mats[i]->nbytes, k.layer_params += elems(mats[i]);
        for (size_t i = 0; i < sizeof small / sizeof small[0]; i++) k.layer_bytes += nbytes(small[i]);
    }
    return k;
}

/* Keys the query at position p sees in a layer of window w (0: full attention). */
static uint64_t keys_seen(int64_t p, int64_t w) { return (uint64_t)(w && p + 1 > w ? w : p + 1); }

/* (query, key) pairs of a prefill of P tokens from position 0: sum over p < P of keys_seen(p, w). */
static double pairs_seen(int64_t P, int64_t w) {
    if (!w || P <= w) return (double)P * (double)(P + 1) / 2.0;
    return (double)w * (double)(w + 1) / 2.0 + (double)(P - w) * (double)w;
}

/* Bytes one decode at position pos reads: the weights (one embedding row; the whole table again as a tied head)
 * and each layer's cache of the positions its query sees. */
static uint64_t decode_bytes(const kiln_model *m, const model_cost *k, int64_t pos) {
    uint64_t b = k->layer_bytes + k->head_bytes + k->embd_row + (k->tied ? k->embd_bytes : 0);
    for (int64_t l = 0; l < m->cfg.n_layer; l++) b += keys_seen(pos, m->layers[l].window) * k->kv_pos_bytes;
    return b;
}

/* Multiply-adds x 2 of a prefill of P tokens from position 0 with the head on the last row. */
static double prefill_flops(const kiln_model *m, const model_cost *k, int64_t P) {
    const kiln_llama_config *c = &m->cfg;
    double attn = 0;
    for (int64_t l = 0; l < c->n_layer; l++) attn += 4.0 * (double)(c->n_head * c->head_dim) * pairs_seen(P, m->layers[l].window);
    return 2.0 * (double)P * (double)k->layer_params + 2.0 * (double)k->head_params + attn;
}

/* ---------------------------------------------------------------- the peer: issue #7's llama.cpp figures */

typedef struct {
    const char *name;
    int64_t n_layer, n_embd, n_ff; /* the shape it is matched by */
    double file_mib;               /* the Q4_K_M file llama.cpp ran */
    double tg128, pp512;           /* llama.cpp CUDA tok/s on one H200 */
    double goal_tg128, goal_pp512; /* issue #7's goals for kiln; 0: none */
} peer_ref;

static const peer_ref PEERS[] = {
    {"llama2-7b Q4_K_M", 32, 4096, 11008, 3.80 * 1024, 230, 9572, 900, 20000},
    {"tinyllama-1.1b Q4_K_M", 22, 2048, 5632, 636, 521, 33745, 3000, 0},
};

/* llama.cpp's Q4_K_M mix, read off the tensor types: every q, k, o, gate and up projection Q4_K; v and down Q4_K
 * or Q6_K, with down Q6_K in some layers (use_more_bits: the first and last eighth and every third between). */
static bool is_q4_k_m(const kiln_model *m) {
    bool some_q6 = false;
    for (int64_t l = 0; l < m->cfg.n_layer; l++) {
        const kiln_llama_layer *w = &m->layers[l];
        const kiln_tensor_view *q4[] = {w->wq, w->wk, w->wo, w->w_gate, w->w_up};
        for (size_t i = 0; i < sizeof q4 / sizeof q4[0]; i++)
            if (q4[i]->type != KILN_TYPE_Q4_K) return false;
        const kiln_tensor_view *mixed[] = {w->wv, w->w_down};
        for (size_t i = 0; i < sizeof mixed / sizeof mixed[0]; i++)
            if (mixed[i]->type != KILN_TYPE_Q4_K && mixed[i]->type != KILN_TYPE_Q6_K) return false;
        some_q6 |= w->w_down->type == KILN_TYPE_Q6_K;
    }
    return some_q6;
}

static const peer_ref *peer_of(const kiln_model *m, bool q4km) {
    if (!q4km) return NULL;
    for (size_t i = 0; i < sizeof PEERS / sizeof PEERS[0]; i++)
        if (PEERS[i].n_layer == m->cfg.n_layer && PEERS[i].n_embd == m->cfg.n_embd && PEERS[i].n_ff == m->cfg.n_ff)
            return &PEERS[i];
    return NULL;
}

/* ---------------------------------------------------------------- cases */

typedef struct {
    char test[24];              /* "pp512", "tg128" */
    bool is_tg;
    int64_t n;                  /* P or N */
    int reps;
    double times[MAX_REPS];     /* seconds, in run order */
    double best_s, median_s, best_tps, median_tps;
    double work;                /* pp: flops; tg: bytes read over the N decodes */
    double best_rate, median_rate; /* pp: TFLOP/s; tg: GB/s */
    double roof_frac;           /* best rate / the device's gemm or copy roof */
    double peer_tps;            /* the peer's figure for this very test, 0 if none */
    double goal_tps;            /* issue #7's goal for this test, 0 if none */
} gpu_case;

/* One batch size of -b. */
typedef struct {
    int64_t B;
    double best_s, median_s;        /* the N steps */
    double agg_tps, step_ms;        /* B * N / median_s; median_s / N */
} batch_case;

typedef struct {
    const char *path;
    int n_cases;
    gpu_case cases[MAX_ITEMS + 1];  /* the pp lengths, then tg */
    double vram_gib;
    const peer_ref *peer;
    const char *type_k, *type_v; /* the KV cache's types (-ctk, -ctv) */
    int64_t profile_pos;
    int n_ops;                      /* -1: the profile failed */
    kiln_op_time ops[KILN_PROFILE_OPS];
    double tg_step_ms;              /* 1000 / median tg tok/s, 0 without tg */
    int n_batched;                  /* -b: decode of B sequences at once */
    batch_case batched[MAX_ITEMS];
    bool peer_measured;             /* --peer-bin: peer_tps came from this run */
    char peer_commit[48];
} model_result;

/* One timed repetition; seconds, or a negative number after printing the error. */
static double run_pp(kiln_session *s, const int32_t *ids, int64_t P) {
    int32_t next;
    kiln_session_reset(s);
    kiln_clear_error();
    const double a = kiln_bench_now();
    const kiln_status st = kiln_session_eval_argmax(s, ids, (size_t)P, &next);
    const double t = kiln_bench_now() - a;
    return st ? -report("prefill", st) : t;
}

static double run_tg(kiln_session *s, const int32_t *ids, int64_t N) {
    int32_t tok, next;
    kiln_session_reset(s);
    kiln_clear_error();
    kiln_status st = kiln_session_eval_argmax(s, ids, TG_PROMPT, &tok);
    if (st) return -report("tg prompt", st);
    const double a = kiln_bench_now();
    for (int64_t i = 0; i < N; i++) {
        if ((st = kiln_session_eval_argmax(s, &tok, 1, &next))) return -report("decode", st);
        tok = next; /* greedy: the argmax is a valid id, so the session's check passes */
    }
    return kiln_bench_now() - a;
}

/* B sequences decoded together, one token each per step: each gets the TG_PROMPT-token prompt (one decode per
 * sequence, untimed), then N steps of B entries, each fed its own argmax: seconds for the N steps, or a negative
 * number after printing the error. */
static double run_batched(kiln_context *c, const int32_t *ids, int64_t B, int64_t N) {
    kiln_batch_entry e[TG_PROMPT > MAX_BATCH ? TG_PROMPT : MAX_BATCH];
    int32_t next[MAX_BATCH];
    kiln_status st;
    kiln_clear_error();
    for (int32_t b = 0; b < B; b++) {
        kiln_context_seq_keep(c, b, 0);
        for (int64_t i = 0; i < TG_PROMPT; i++) e[i] = (kiln_batch_entry){.seq = b, .id = ids[i], .pos = i, .logits = i == TG_PROMPT - 1};
        if ((st = kiln_context_decode(c, e, TG_PROMPT, NULL, &next[b]))) return -report("batched prompt", st);
    }
    const double a = kiln_bench_now();
    for (int64_t i = 0; i < N; i++) {
        for (int32_t b = 0; b < B; b++) e[b] = (kiln_batch_entry){.seq = b, .id = next[b], .pos = TG_PROMPT + i, .logits = true};
        if ((st = kiln_context_decode(c, e, (size_t)B, NULL, next))) return -report("batched decode", st);
    }
    return kiln_bench_now() - a;
}

/* Every batch size of bs: a context of max(bs) sequences on the GPU, a warm-up and reps timed runs each. */
static int bench_batched(const kiln_model *m, const kiln_session_params *sp, const int64_t *bs, int n_bs, int64_t N, int reps,
                         const int32_t *ids, model_result *res) {
    int64_t max_b = 1;
    for (int i = 0; i < n_bs; i++) max_b = bs[i] > max_b ? bs[i] : max_b;
    kiln_context_params cp = {.s = *sp, .n_seq = (int32_t)max_b};
    cp.s.n_batch = 512;
    kiln_context *c = NULL;
    kiln_clear_error();
    kiln_status st = kiln_context_new(m, &cp, &c);
    if (st) return report("batched decode: GPU context", st);
    int rc = 0;
    for (int i = 0; i < n_bs && !rc; i++) {
        double t[MAX_REPS];
        if (run_batched(c, ids, bs[i], N) < 0) rc = 1;
        for (int r = 0; r < reps && !rc; r++)
            if ((t[r] = run_batched(c, ids, bs[i], N)) < 0) rc = 1;
        if (rc) break;
        const double med = kiln_bench_median(t, reps); /* sorts t: t[0] is the best */
        batch_case *out = &res->batched[res->n_batched++];
        out->B = bs[i], out->best_s = t[0], out->median_s = med;
        out->agg_tps = (double)(bs[i] * N) / med, out->step_ms = 1e3 * med / (double)N;
    }
    kiln_context_free(c);
    return rc;
}

/* ---------------------------------------------------------------- the peer measured: llama-bench in this run */

/* The number after "key": in one of llama-bench's JSON lines; false when absent. */
static bool json_field(const char *line, const char *key, double *out) {
    char pat[48];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(line, pat);
    if (!p) return false;
    char *end;
    *out = strtod(p + strlen(pat), &end);
    return end != p + strlen(pat);
}

/* Runs bin (llama.cpp's llama-bench) on path as kiln runs it: every layer on the GPU, flash attention, the same
 * prompt lengths, generation length and repetitions; reads its JSON lines (-o jsonl) and sets each case's peer_tps
 * to llama-bench's mean tok/s for the same test. Its stderr goes to a temporary file, removed after; on a failure
 * its last line is printed (escaped) with the reason. Returns 0, or 1 after printing why. */
/* The last non-empty line (at most n - 1 bytes of its end) of the file open at fd. */
static bool last_line(int fd, char *out, size_t n) {
    const off_t end = lseek(fd, 0, SEEK_END);
    const off_t from = end > (off_t)(n - 1) ? end - (off_t)(n - 1) : 0;
    const ssize_t got = end > 0 ? pread(fd, out, (size_t)(end - from), from) : 0;
    if (got <= 0) return false;
    out[got] = 0;
    char *e = out + got;
    while (e > out && (e[-1] == '\n' || e[-1] == '\r')) *--e = 0;
    char *b = strrchr(out, '\n');
    if (b) memmove(out, b + 1, strlen(b + 1) + 1);
    return out[0] != 0;
}

static int run_peer(const char *bin, const char *path, const int64_t *pps, int n_pp, int64_t n_gen, int reps, model_result *res) {
    char plist[16 * MAX_ITEMS + 2] = "0", nb[24], rb[24];
    for (int i = 0, o = 0; i < n_pp; i++) o += snprintf(plist + o, sizeof plist - (size_t)o, "%s%lld", i ? "," : "", (long long)pps[i]);
    snprintf(nb, sizeof nb, "%lld", (long long)n_gen);
    snprintf(rb, sizeof rb, "%d", reps);
    char *argv[] = {(char *)bin, "-m", (char *)path, "-ngl", "99", "-fa", "1", "-p", plist, "-n", nb, "-r", rb, "-o", "jsonl", NULL};
    int fd[2];
    char errlog[] = "/tmp/kiln-bench-peer-XXXXXX";
    const int ef = mkstemp(errlog);
    if (ef < 0) return fprintf(stderr, "kiln bench --gpu: --peer-bin: a temporary file: %s\n", strerror(errno)), 1;
    if (pipe(fd)) return fprintf(stderr, "kiln bench --gpu: --peer-bin: pipe: %s\n", strerror(errno)), close(ef), unlink(errlog), 1;
    fflush(stdout);
    const pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "kiln bench --gpu: --peer-bin: fork: %s\n", strerror(errno));
        return close(fd[0]), close(fd[1]), close(ef), unlink(errlog), 1;
    }
    if (pid == 0) {
        dup2(fd[1], 1);
        dup2(ef, 2);
        close(fd[0]), close(fd[1]), close(ef);
        execv(bin, argv);
        _exit(127);
    }
    close(fd[1]);
    FILE *f = fdopen(fd[0], "r");
    char *line = NULL;
    size_t cap = 0;
    int seen = 0;
    while (f && getline(&line, &cap, f) > 0) {
        double np, ng, ts;
        if (!json_field(line, "n_prompt", &np) || !json_field(line, "n_gen", &ng) || !json_field(line, "avg_ts", &ts)) continue;
        const char *cm = strstr(line, "\"build_commit\": \"");
        if (cm) sscanf(cm + 17, "%47[0-9a-zA-Z]", res->peer_commit);
        for (int i = 0; i < res->n_cases; i++) {
            gpu_case *r = &res->cases[i];
            if ((r->is_tg && ng == (double)r->n && np == 0) || (!r->is_tg && np == (double)r->n && ng == 0)) r->peer_tps = ts, seen++;
        }
    }
    free(line);
    if (f) fclose(f);
    else close(fd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    const bool failed = !WIFEXITED(status) || WEXITSTATUS(status) != 0 || seen == 0;
    if (failed) {
        fprintf(stderr, "kiln bench --gpu: --peer-bin %s on %s: %s", bin, path,
                !WIFEXITED(status) ? "it was killed" : WEXITSTATUS(status) == 127 ? "could not be run" : WEXITSTATUS(status) ? "it failed"
                                                                                  : "it printed no result");
        char last[512] = "";
        if (last_line(ef, last, sizeof last)) {
            fputs("; its last words: ", stderr);
            kiln_cli_put_escaped(stderr, last);
        }
        fputc('\n', stderr);
    }
    close(ef);
    unlink(errlog);
    if (failed) return 1;
    res->peer_measured = true;
    return 0;
}

/* Warm-up, then reps timed repetitions; fills r. */
static int bench_case(kiln_session *s, const kiln_model *m, const model_cost *k, const device_roofs *d, const peer_ref *peer,
                      bool is_tg, int64_t n, int reps, const int32_t *ids, gpu_case *r) {
    *r = (gpu_case){.is_tg = is_tg, .n = n, .reps = reps};
    snprintf(r->test, sizeof r->test, "%s%lld", is_tg ? "tg" : "pp", (long long)n);
    if ((is_tg ? run_tg(s, ids, n) : run_pp(s, ids, n)) < 0) return 1;
    for (int i = 0; i < reps; i++)
        if ((r->times[i] = is_tg ? run_tg(s, ids, n) : run_pp(s, ids, n)) < 0) return 1;
    double sorted[MAX_REPS];
    memcpy(sorted, r->times, sizeof(double) * (size_t)reps);
    r->median_s = kiln_bench_median(sorted, reps);
    r->best_s = sorted[0];
    r->best_tps = (double)n / r->best_s;
    r->median_tps = (double)n / r->median_s;
    if (is_tg) {
        uint64_t bytes = 0;
        for (int64_t i = 0; i < n; i++) bytes += decode_bytes(m, k, TG_PROMPT + i);
        r->work = (double)bytes;
        r->best_rate = r->work / r->best_s / 1e9;
        r->median_rate = r->work / r->median_s / 1e9;
        r->roof_frac = r->best_rate / d->copy_gbs;
    } else {
        r->work = prefill_flops(m, k, n);
        r->best_rate = r->work / r->best_s / 1e12;
        r->median_rate = r->work / r->median_s / 1e12;
        r->roof_frac = r->best_rate / d->gemm_tflops;
    }
    if (peer && is_tg && n == 128) r->peer_tps = peer->tg128, r->goal_tps = peer->goal_tg128;
    if (peer && !is_tg && n == 512) r->peer_tps = peer->pp512, r->goal_tps = peer->goal_pp512;
    return 0;
}

/* ---------------------------------------------------------------- JSON */

static int64_t n_gen_of(const model_result *res) {
    for (int i = 0; i < res->n_cases; i++)
        if (res->cases[i].is_tg) return res->cases[i].n;
    return 0;
}

static void print_case_json(const gpu_case *r) {
    printf("{\"test\":\"%s\",\"n\":%lld,\"reps\":%d,\"times_s\":[", r->test, (long long)r->n, r->reps);
    for (int i = 0; i < r->reps; i++) printf("%s%.6e", i ? "," : "", r->times[i]);
    printf("],\"best_s\":%.6e,\"median_s\":%.6e,\"best_tps\":%.3f,\"median_tps\":%.3f", r->best_s, r->median_s, r->best_tps,
           r->median_tps);
    if (r->is_tg)
        printf(",\"tg_prompt\":%d,\"bytes_read\":%.0f,\"best_gbs\":%.3f,\"median_gbs\":%.3f,\"copy_frac\":%.4f", TG_PROMPT, r->work,
               r->best_rate, r->median_rate, r->roof_frac);
    else
        printf(",\"flops\":%.6e,\"best_tflops\":%.4f,\"median_tflops\":%.4f,\"gemm_frac\":%.4f", r->work, r->best_rate,
               r->median_rate, r->roof_frac);
    if (r->peer_tps) printf(",\"peer_tps\":%.1f,\"ratio\":%.4f", r->peer_tps, r->median_tps / r->peer_tps);
    else printf(",\"peer_tps\":null,\"ratio\":null");
    if (r->goal_tps) printf(",\"goal_tps\":%.0f,\"goal_met\":%s", r->goal_tps, r->median_tps >= r->goal_tps ? "true" : "false");
    else printf(",\"goal_tps\":null,\"goal_met\":null");
    putchar('}');
}

static void print_model_json(const model_result *res, const kiln_model *m, const model_cost *k, const char *ftype, bool q4km,
                             uint64_t file_bytes, int64_t n_ctx, double load_s, double session_s, const device_roofs *d,
                             const char *profile_error) {
    const kiln_llama_config *c = &m->cfg;
    printf("{\"bench\":\"gpu_model\",\"model\":");
    kiln_bench_json_str(kiln_bench_base_name(res->path));
    printf(",\"path\":");
    kiln_bench_json_str(res->path);
    printf(",\"device\":");
    kiln_bench_json_str(d->name);
    printf(",\"ftype\":\"%s\",\"q4_k_m\":%s,\"file_bytes\":%llu,\"n_layer\":%lld,\"n_embd\":%lld,\"n_ff\":%lld,\"n_head\":%lld,"
           "\"n_head_kv\":%lld,\"head_dim\":%lld,\"n_vocab\":%lld,\"tied\":%s,\"n_params_layers\":%llu,\"n_params_head\":%llu,"
           "\"weight_bytes_layers\":%llu,\"weight_bytes_embd\":%llu,\"n_batch\":512,\"n_ctx\":%lld,\"type_k\":\"%s\","
           "\"type_v\":\"%s\",\"load_s\":%.4f,"
           "\"session_s\":%.4f,\"vram_gib\":%.4f,\"copy_gbs\":%.3f,\"gemm_tflops\":%.3f,\"cases\":[",
           ftype, q4km ? "true" : "false", (unsigned long long)file_bytes, (long long)c->n_layer, (long long)c->n_embd,
           (long long)c->n_ff, (long long)c->n_head, (long long)c->n_head_kv, (long long)c->head_dim, (long long)c->n_vocab,
           k->tied ? "true" : "false", (unsigned long long)k->layer_params, (unsigned long long)k->head_params,
           (unsigned long long)k->layer_bytes, (unsigned long long)k->embd_bytes, (long long)n_ctx, res->type_k, res->type_v, load_s, session_s,
           res->vram_gib, d->copy_gbs, d->gemm_tflops);
    for (int i = 0; i < res->n_cases; i++) {
        if (i) putchar(',');
        print_case_json(&res->cases[i]);
    }
    printf("],\"profile\":");
    if (res->n_ops < 0) {
        printf("null,\"profile_error\":");
        kiln_bench_json_str(profile_error);
    } else {
        double sum = 0;
        printf("{\"pos0\":%lld,\"reps\":%d,\"ops\":[", (long long)res->profile_pos, PROFILE_REPS);
        for (int i = 0; i < res->n_ops; i++) {
            const kiln_op_time *o = &res->ops[i];
            const double gbs = o->ms > 0 ? o->bytes / (o->ms * 1e-3) / 1e9 : 0;
            printf("%s{\"op\":", i ? "," : "");
            kiln_bench_json_str(o->name ? o->name : "?");
            printf(",\"ms\":%.6f,\"bytes\":%.0f,\"gbs\":%.3f,\"copy_frac\":%.4f}", o->ms, o->bytes, gbs, gbs / d->copy_gbs);
            sum += o->ms;
        }
        printf("],\"sum_ms\":%.6f,", sum);
        if (res->tg_step_ms > 0) printf("\"graph_step_ms\":%.6f}", res->tg_step_ms);
        else printf("\"graph_step_ms\":null}");
    }
    printf(",\"batched\":[");
    for (int i = 0; i < res->n_batched; i++)
        printf("%s{\"B\":%lld,\"n\":%lld,\"best_s\":%.6e,\"median_s\":%.6e,\"agg_tps\":%.3f,\"step_ms\":%.6f,\"step_vs_first\":%.4f}",
               i ? "," : "", (long long)res->batched[i].B, (long long)n_gen_of(res), res->batched[i].best_s, res->batched[i].median_s,
               res->batched[i].agg_tps, res->batched[i].step_ms, res->batched[i].step_ms / res->batched[0].step_ms);
    printf("],\"peer\":");
    const peer_ref *p = res->peer;
    if (res->peer_measured) {
        printf("{\"name\":\"llama-bench\",\"build_commit\":");
        kiln_bench_json_str(res->peer_commit);
        printf("},\"peer_source\":\"%s\"", PEER_MEASURED);
    } else if (p) {
        printf("{\"name\":\"%s\",\"file_mib\":%.0f,\"tg128_tps\":%.0f,\"pp512_tps\":%.0f}", p->name, p->file_mib, p->tg128, p->pp512);
        printf(",\"peer_source\":\"%s\"", PEER_SOURCE);
    } else {
        printf("null,\"peer_source\":null");
    }
    printf(",\"goals\":[");
    if (p) {
        /* every goal of the issue, met or not, or null when this run did not measure its test */
        const struct { const char *test; bool is_tg; int64_t n; double goal; } goals[] = {
            {"tg128", true, 128, p->goal_tg128}, {"pp512", false, 512, p->goal_pp512}};
        bool first = true;
        for (size_t g = 0; g < sizeof goals / sizeof goals[0]; g++) {
            if (!goals[g].goal) continue;
            const gpu_case *hit = NULL;
            for (int i = 0; i < res->n_cases; i++)
                if (res->cases[i].is_tg == goals[g].is_tg && res->cases[i].n == goals[g].n) hit = &res->cases[i];
            printf("%s{\"test\":\"%s\",\"goal_tps\":%.0f,", first ? "" : ",", goals[g].test, goals[g].goal);
            if (hit) printf("\"median_tps\":%.3f,\"met\":%s}", hit->median_tps, hit->median_tps >= goals[g].goal ? "true" : "false");
            else printf("\"median_tps\":null,\"met\":null}");
            first = false;
        }
    }
    printf("]}\n");
    fflush(stdout);
}

/* ---------------------------------------------------------------- one model */

/* Every case of one model: pp for each prompt length, then tg, then the profile. Returns 0, 1 on an error (nothing
 * printed for the model), or 3 when everything but the profile ran (the object is printed with "profile": null). */
static int bench_model(const char *path, const int64_t *pps, int n_pp, int64_t n_gen, int64_t ctx_min, int reps,
                       const device_roofs *d, model_result *res, kiln_cli_rope *rope, const kiln_session_params *kv,
                       const int64_t *bs, int n_bs, const char *peer_bin) {
    kiln_model *m = NULL;
    kiln_clear_error();
    const double t0 = kiln_bench_now();
    kiln_status st = kiln_model_load(path, &m);
    if (st) {
        const char *msg = kiln_last_error();
        fprintf(stderr, "kiln bench --gpu: %s\n", *msg ? msg : kiln_status_name(st));
        return 1;
    }
    if (!kiln_cli_rope_apply("bench --gpu", rope, m)) { /* --rope-* / --yarn-*, as generate */
        kiln_model_free(m);
        return 1;
    }
    const double load_s = kiln_bench_now() - t0;
    const kiln_llama_config *c = &m->cfg;
    const model_cost cost = model_cost_of(m, kv);
    const bool q4km = is_q4_k_m(m);
    const bool f16_cache = kv->type_k == KILN_KV_F16 && kv->type_v == KILN_KV_F16; /* the peer's figures are of an f16 cache */
    memset(res, 0, sizeof *res); /* (not a compound literal: the struct holds every case's times) */
    res->path = path, res->peer = f16_cache ? peer_of(m, q4km) : NULL, res->n_ops = -1;
    res->type_k = kiln_kv_type_name(kv->type_k), res->type_v = kiln_kv_type_name(kv->type_v);

    /* the profile's step writes the cache row of its position, TG_PROMPT + n_gen / 2 < TG_PROMPT + n_gen + 1 */
    int64_t n_ctx = TG_PROMPT + n_gen + 1, n_ids = TG_PROMPT;
    for (int i = 0; i < n_pp; i++) {
        n_ctx = pps[i] > n_ctx ? pps[i] : n_ctx;
        n_ids = pps[i] > n_ids ? pps[i] : n_ids;
    }
    n_ctx += CTX_SLACK;
    if (ctx_min > n_ctx) n_ctx = ctx_min;
    uint32_t ft = 0;
    const char *ftype = kiln_gguf_get_u32(m->gguf, "general.file_type", &ft) == KILN_OK && kiln_ftype_name((kiln_ftype)ft)
                            ? kiln_ftype_name((kiln_ftype)ft)
                            : "unknown";
    if (n_ctx > c->n_ctx_train)
        fprintf(stderr, "kiln bench --gpu: note: %s: a context of %lld is beyond the %lld it was trained for (speed only)\n", path,
                (long long)n_ctx, (long long)c->n_ctx_train);

    int rc = 1;
    kiln_session *s = NULL;
    int32_t *ids = malloc(sizeof *ids * (size_t)n_ids);
    if (!ids) {
        fprintf(stderr, "kiln bench --gpu: out of memory for %lld token ids\n", (long long)n_ids);
        goto out;
    }
    uint64_t x = 0x9E3779B97F4A7C15ull; /* the same ids every run, as bench_model.c draws them */
    for (int64_t i = 0; i < n_ids; i++) ids[i] = (int32_t)((xorshift(&x) >> 32) % (uint64_t)c->n_vocab);

    /* every layer offloaded (-ngl L): the whole model on the GPU, as kiln offloads all or none */
    const kiln_session_params sp = {.n_ctx = n_ctx, .n_batch = 512, .n_gpu_layers = (int)c->n_layer, .type_k = kv->type_k,
                                    .type_v = kv->type_v};
    kiln_clear_error();
    const double s0 = kiln_bench_now();
    if ((st = kiln_session_new(m, &sp, &s)) != KILN_OK) {
        char what[512];
        snprintf(what, sizeof what, "%s: GPU session of %lld positions", path, (long long)n_ctx);
        report(what, st);
        goto out;
    }
    const double session_s = kiln_bench_now() - s0;
    if (!kiln_session_on_gpu(s)) {
        fprintf(stderr, "kiln bench --gpu: %s: the session was made with every layer offloaded but does not run on the GPU\n", path);
        goto out;
    }
    res->vram_gib = (double)kiln_session_device_bytes(s) / (double)(1ull << 30);

    for (int i = 0; i < n_pp; i++)
        if (bench_case(s, m, &cost, d, res->peer, false, pps[i], reps, ids, &res->cases[res->n_cases++])) goto out;
    if (n_gen) {
        gpu_case *tg = &res->cases[res->n_cases++];
        if (bench_case(s, m, &cost, d, res->peer, true, n_gen, reps, ids, tg)) goto out;
        res->tg_step_ms = 1000.0 / tg->median_tps;
    }

    /* one decode step op by op, at the tg decodes' middle position (the cache there holds tg's keys) */
    res->profile_pos = TG_PROMPT + n_gen / 2;
    char profile_error[512] = "";
    int n_ops = 0;
    kiln_clear_error();
    if ((st = kiln_session_profile(s, res->profile_pos, PROFILE_REPS, res->ops, &n_ops)) != KILN_OK) {
        const char *msg = kiln_last_error();
        snprintf(profile_error, sizeof profile_error, "%s", *msg ? msg : kiln_status_name(st));
        fprintf(stderr, "kiln bench --gpu: %s: decode profile: %s\n", path, profile_error);
    } else if (n_ops < 0 || n_ops > KILN_PROFILE_OPS) {
        snprintf(profile_error, sizeof profile_error, "the engine reported %d ops (at most %d)", n_ops, KILN_PROFILE_OPS);
        fprintf(stderr, "kiln bench --gpu: %s: decode profile: %s\n", path, profile_error);
    } else {
        res->n_ops = n_ops;
    }
    kiln_session_free(s); /* the batched case's context holds its own copy of the weights */
    s = NULL;
    if (n_bs && n_gen && bench_batched(m, &sp, bs, n_bs, n_gen, reps, ids, res)) goto out;
    if (peer_bin) { /* its figures replace issue #7's; the goals stay */
        for (int i = 0; i < res->n_cases; i++) res->cases[i].peer_tps = 0;
        if (run_peer(peer_bin, path, pps, n_pp, n_gen, reps, res)) goto out;
    }
    print_model_json(res, m, &cost, ftype, q4km, kiln_gguf_file_size(m->gguf), n_ctx, load_s, session_s, d, profile_error);
    rc = res->n_ops < 0 ? 3 : 0;
out:
    kiln_session_free(s);
    kiln_model_free(m);
    free(ids);
    return rc;
}

/* ---------------------------------------------------------------- the table */

static void print_table(const device_roofs *d, const model_result *res, int n_res, int reps, const char *peer_bin,
                        int64_t ctx_min) {
    printf("\nkiln bench --gpu: %s; copy %.0f GB/s (read + written); bf16 GEMM %d^3 through kiln_cuda_gemm %.1f TFLOP/s\n"
           "pp = prefill of P tokens from position 0 (n_batch 512), last row's argmax; tg = N greedy decodes after a prompt "
           "of %d tokens;\nbest (median) of %d repetitions after a warm-up. rate: TFLOP/s for pp (matmuls + attention), GB/s "
           "for tg (weights + KV read per token);\nroof: pp of the bf16 GEMM rate, tg of the copy bandwidth. peer: %s%s;\n"
           "ratio (kiln's median / the peer's) and goals use the median.\n\n",
           d->name, d->copy_gbs, GEMM_N, d->gemm_tflops, TG_PROMPT, reps,
           peer_bin ? "llama.cpp's llama-bench in this run (mean t/s, -ngl 99 -fa 1): " : "llama.cpp CUDA on one H200 as issue #7 records it (not this run)",
           peer_bin ? peer_bin : "");
    if (ctx_min)
        printf("-c %lld: each session holds at least %lld positions; the peer's figures are at the context its cases "
               "need.\n\n", (long long)ctx_min, (long long)ctx_min);
    printf("%-34s %-7s %10s %10s %15s %6s %8s %9s %7s %7s %5s\n", "model", "test", "tok/s", "med tok/s", "rate", "roof",
           "VRAM GiB", "peer t/s", "ratio", "goal", "met");
    for (int mi = 0; mi < n_res; mi++) {
        const model_result *mr = &res[mi];
        for (int i = 0; i < mr->n_cases; i++) {
            const gpu_case *r = &mr->cases[i];
            char rate[32], peer[16] = "-", ratio[16] = "-", goal[16] = "-", met[8] = "-";
            snprintf(rate, sizeof rate, "%.2f %s", r->best_rate, r->is_tg ? "GB/s" : "TFLOP/s");
            if (r->peer_tps) {
                snprintf(peer, sizeof peer, "%.0f", r->peer_tps);
                snprintf(ratio, sizeof ratio, "%.2fx", r->median_tps / r->peer_tps);
            }
            if (r->goal_tps) {
                snprintf(goal, sizeof goal, "%.0f", r->goal_tps);
                snprintf(met, sizeof met, "%s", r->median_tps >= r->goal_tps ? "yes" : "no");
            }
            printf("%-34s %-7s %10.1f %10.1f %15s %5.1f%% %8.2f %9s %7s %7s %5s\n", kiln_bench_base_name(mr->path), r->test,
                   r->best_tps, r->median_tps, rate, 100.0 * r->roof_frac, mr->vram_gib, peer, ratio, goal, met);
        }
    }
    for (int mi = 0; mi < n_res; mi++) {
        const model_result *mr = &res[mi];
        if (!mr->n_batched) continue;
        printf("\n%s: B sequences decoded together (one token each per step, greedy, %lld steps after a %d-token prompt each)\n",
               kiln_bench_base_name(mr->path), (long long)n_gen_of(mr), TG_PROMPT);
        printf("%6s %14s %12s %12s %14s\n", "B", "agg tok/s", "step ms", "step / 1st", "agg / 1st");
        for (int i = 0; i < mr->n_batched; i++)
            printf("%6lld %14.1f %12.4f %11.2fx %13.2fx\n", (long long)mr->batched[i].B, mr->batched[i].agg_tps, mr->batched[i].step_ms,
                   mr->batched[i].step_ms / mr->batched[0].step_ms, mr->batched[i].agg_tps / mr->batched[0].agg_tps);
    }
    for (int mi = 0; mi < n_res; mi++) {
        const model_result *mr = &res[mi];
        if (mr->n_ops < 0) {
            printf("\n%s: no decode profile (see stderr)\n", kiln_bench_base_name(mr->path));
            continue;
        }
        double sum = 0;
        for (int i = 0; i < mr->n_ops; i++) sum += mr->ops[i].ms;
        printf("\n%s: one decode step at position %lld, op by op (mean of %d, outside the graph)\n",
               kiln_bench_base_name(mr->path), (long long)mr->profile_pos, PROFILE_REPS);
        printf("%-24s %10s %7s %12s %10s %7s\n", "op", "ms/token", "% sum", "MiB read", "GB/s", "% copy");
        for (int i = 0; i < mr->n_ops; i++) {
            const kiln_op_time *o = &mr->ops[i];
            const double gbs = o->ms > 0 ? o->bytes / (o->ms * 1e-3) / 1e9 : 0;
            printf("%-24s %10.4f %6.1f%% %12.2f %10.1f %6.1f%%\n", o->name ? o->name : "?", o->ms, sum > 0 ? 100.0 * o->ms / sum : 0,
                   o->bytes / (1 << 20), gbs, 100.0 * gbs / d->copy_gbs);
        }
        printf("%-24s %10.4f", "sum of ops", sum);
        if (mr->tg_step_ms > 0)
            printf("   graph step %.4f ms (1000 / median tg tok/s); the sum is %.1f%% of it (over 100%%: the gaps between the "
                   "profile's separate launches, which the graph removes)\n",
                   mr->tg_step_ms, 100.0 * sum / mr->tg_step_ms);
        else
            printf("   (no tg case, so no graph step to compare)\n");
    }
}

/* ---------------------------------------------------------------- CLI */

static void usage(FILE *f) {
    fprintf(f, "usage: kiln bench --gpu -m MODEL.gguf [-m MODEL2.gguf ...] [-p 512] [-n 128] [-r REPS] [-b 1,2,4] [--peer-bin LLAMA_BENCH]\n"
               "                      [-c N] [-ctk T] [-ctv T] [--json-only]\n"
               "  prompt processing and generation tok/s of a whole model on CUDA device 0, against the measured copy\n"
               "  bandwidth and bf16 GEMM rate, and llama.cpp's figures from issue #7 where the model matches\n"
               "  -b LIST     also decode B sequences together for each B (1..%d): aggregate tok/s and step time\n"
               "  --peer-bin PATH  run llama.cpp's llama-bench at PATH on each model (-ngl 99 -fa 1, the same -p, -n, -r)\n"
               "              and compare against its figures instead of issue #7's\n"
               "  -p LIST     prompt lengths for pp, comma-separated (default 512; 0: no pp)\n"
               "  -n N        tokens decoded one at a time for tg, after a prompt of %d tokens (default 128; 0: no tg)\n"
               "  -r REPS     timed repetitions per case after one warm-up (default 3); best and median reported\n"
               "  -c N, --ctx-size N  the session's context at least N positions (default: what the longest case needs;\n"
               "              llama-bench has no such flag, so its figures stay at its own)\n"
               "  -ctk T, -ctv T  KV cache types (--cache-type-k/-v): f16 (default), f32, bf16, q8_0, q4_0; the peer's figures\n"
               "              are of an f16 cache, so another type shows none\n",
            MAX_BATCH, TG_PROMPT);
}

/* The options that take a value. */
static bool takes_value(const char *a) {
    return strcmp(a, "-m") == 0 || strcmp(a, "-p") == 0 || strcmp(a, "-n") == 0 || strcmp(a, "-r") == 0 || strcmp(a, "-b") == 0 ||
           strcmp(a, "--peer-bin") == 0 || strcmp(a, "-c") == 0 || strcmp(a, "--ctx-size") == 0;
}

int kiln_bench_gpu(int argc, char **argv) {
    const char *models[MAX_ITEMS], *cmd = "bench --gpu";
    int n_models = 0, n_pp = 1;
    int64_t pps[MAX_ITEMS] = {512};
    int64_t n_gen = 128, reps = 3, bs[MAX_ITEMS], ctx_min = 0;
    int n_bs = 0;
    const char *peer_bin = NULL;
    bool json_only = false;
    kiln_cli_rope rope;
    kiln_cli_rope_init(&rope);
    kiln_session_params kv = {0}; /* -ctk, -ctv */
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v;
        int rr = kiln_cli_rope_opt(cmd, a, i + 1 < argc ? argv[i + 1] : NULL, &rope);
        if (rr == 0) rr = kiln_cli_kv_opt(cmd, a, i + 1 < argc ? argv[i + 1] : NULL, &kv);
        if (rr < 0) return 1;
        if (rr > 0) {
            i++;
            continue;
        }
        if (strcmp(a, "--") == 0) { /* ends the options; bench takes no other argument */
            if (i + 1 < argc) return kiln_cli_error("%s: unexpected argument '%s'", cmd, argv[i + 1]);
            break;
        }
        if (strcmp(a, "--gpu") == 0) continue; /* how kiln.c chose this driver */
        if (strcmp(a, "--json-only") == 0) json_only = true;
        else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (!takes_value(a)) return kiln_cli_unknown(cmd, a);
        else if (!(v = kiln_cli_value(cmd, argc, argv, &i))) return 1;
        else if (strcmp(a, "-m") == 0) {
            if (n_models == MAX_ITEMS) return kiln_cli_error("%s: more than %d models", cmd, MAX_ITEMS);
            models[n_models++] = v;
        } else if (strcmp(a, "-p") == 0) {
            if (kiln_bench_parse_list(cmd, a, v, 0, INT32_MAX - CTX_SLACK, pps, MAX_ITEMS, &n_pp)) return 1;
        } else if (strcmp(a, "-b") == 0) {
            if (kiln_bench_parse_list(cmd, a, v, 1, MAX_BATCH, bs, MAX_ITEMS, &n_bs)) return 1;
        } else if (strcmp(a, "--peer-bin") == 0) {
            peer_bin = v;
        } else if (strcmp(a, "-n") == 0) {
            if (!kiln_cli_parse_int(cmd, a, v, 0, INT32_MAX - TG_PROMPT - CTX_SLACK - 1, &n_gen)) return 1;
        } else if (strcmp(a, "-c") == 0 || strcmp(a, "--ctx-size") == 0) {
            if (!kiln_cli_parse_int(cmd, a, v, 1, INT32_MAX, &ctx_min)) return 1;
        } else if (!kiln_cli_parse_int(cmd, a, v, 1, MAX_REPS, &reps)) /* -r */
            return 1;
    }
    if (n_models == 0) {
        fprintf(stderr, "kiln: bench --gpu: need -m MODEL.gguf (kiln bench --gpu --help)\n");
        return 1;
    }
    int n_pp_on = 0; /* -p 0 turns pp off */
    for (int i = 0; i < n_pp; i++)
        if (pps[i] > 0) pps[n_pp_on++] = pps[i];
    if (n_pp_on == 0 && n_gen == 0) {
        fprintf(stderr, "kiln: bench --gpu: -p 0 and -n 0 leave nothing to run\n");
        return 1;
    }
    if (kiln_cuda_device_count() == 0) {
#ifdef KILN_CUDA
        fprintf(stderr, "kiln bench --gpu: no CUDA device (no GPU, or no driver, on this machine)\n");
#else
        fprintf(stderr, "kiln bench --gpu: kiln was built without CUDA (nvcc was not on the PATH)\n");
#endif
        return 1;
    }

    device_roofs d = {0};
    if (measure_device(&d)) return 1;
    model_result *res = calloc((size_t)n_models, sizeof *res);
    if (!res) {
        fprintf(stderr, "kiln bench --gpu: out of memory\n");
        return 1;
    }
    int n_res = 0, rc = 0;
    for (int mi = 0; mi < n_models; mi++) {
        const int r =
            bench_model(models[mi], pps, n_pp_on, n_gen, ctx_min, (int)reps, &d, &res[n_res], &rope, &kv, bs, n_bs, peer_bin);
        if (r == 1) {
            free(res);
            return 1;
        }
        if (r == 3) rc = 1; /* printed, but without its profile */
        n_res++;
    }
    if (!json_only) print_table(&d, res, n_res, (int)reps, peer_bin, ctx_min);
    free(res);
    return rc;
}
