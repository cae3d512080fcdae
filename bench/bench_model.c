/* bench_model.c: `kiln bench -m MODEL`: prompt processing (pp) and token generation (tg) throughput of a whole
 * model on the CPU, as llama.cpp's llama-bench measures them. The llama.cpp peer (same model, same thread count,
 * same run) and the ratio live in bench/bench_llama.py, which runs this command as a subprocess.
 *
 * One session per thread count (n_batch 512, n_ctx the largest case needs), reset to position 0 before every
 * repetition, as llama-bench clears its cache; token ids are random valid ids (seeded).
 *   ppP  prefill of P tokens from position 0, last-row logits: P / seconds. GFLOP/s counts the matmuls done:
 *        2 * P * (layer weight elements) + 2 * (head elements, one row) + attention's QK and PV,
 *        4 * NH * HS * P(P+1)/2 per layer. The embedding lookup is not a matmul and is not counted.
 *   tgN  after an untimed prompt of TG_PROMPT tokens, N single-token decodes, each with its logits: N / seconds.
 *        GB/s counts the bytes a decode must read: every weight except token_embd, of which one row (all of
 *        it again when the head is tied), plus the keys and values of every position attended to, in the cache's
 *        types (-ctk/-ctv: f16 by default; f32, bf16, q8_0, q4_0).
 *        A model that fits the last-level cache is measured against that cache, not DRAM.
 * Each case runs once untimed (warm-up: page faults of the mmap, caches, thread start), then --reps times
 * (default 3); best and median are reported. Peak RSS is getrusage's ru_maxrss after the case (the mmap'd
 * weights that were touched count; the session's repacked copy replaces the pages it was made from).
 * session_s is kiln_session_new's time, most of it repacking the weights for the CPU kernels (src/cpu/ops_repack.c).
 * kv_bytes is the cache of n_ctx positions in those types (sliding layers counted as full ones), kv_bytes_f16 the
 * same in f16 and kv_saved_bytes the difference: what the types save against the default.
 * Output: one JSON object per case on stdout, then a table (--json-only leaves the table out). */
#include "bench/bench.h"
#include "tools/cli.h"

#include "model/model.h"
#include "pool.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#define MAX_ITEMS 16   /* models, prompt lengths or thread counts named on one command line */
#define MAX_REPS 1000
#define TG_PROMPT 8    /* tokens in the cache before tg's timed decodes start */

static long long peak_rss_bytes(void) {
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) == 0 ? (long long)ru.ru_maxrss * 1024 : -1; /* Linux: KiB */
}

/* ---------------------------------------------------------------- what a model costs */

/* Sizes read off the bound weights (not the file's tensor list, which may hold tensors the forward never reads). */
typedef struct {
    uint64_t layer_bytes;   /* every layer tensor, norms included */
    uint64_t embd_bytes;    /* token_embd */
    uint64_t embd_row;      /* one row of it */
    uint64_t head_bytes;    /* output_norm, and output when untied */
    uint64_t layer_params;  /* elements of the seven matmul weights of all layers */
    uint64_t head_params;   /* V * C */
    uint64_t kv_row_bytes;  /* one position's keys and values of every layer in the cache types (-ctk/-ctv) */
    uint64_t kv_row_f16;    /* the same in f16 (the default): L * 2 * NKV*HS * 2 */
} model_cost;

static uint64_t elems(const kiln_tensor_view *t) { return (uint64_t)(t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]); }

static model_cost model_cost_of(const kiln_model *m, const kiln_session_params *sp) {
    const kiln_llama_config *c = &m->cfg;
    const int64_t KV = c->n_head_kv * c->head_dim;
    model_cost k = {.embd_bytes = m->tok_embd->nbytes, .embd_row = m->tok_embd->nb[1],
                    .head_bytes = m->output_norm->nbytes + (c->tied ? 0 : m->output->nbytes),
                    .head_params = elems(m->output),
                    .kv_row_bytes = (uint64_t)c->n_layer * (kiln_kv_row_bytes(sp->type_k, KV) + kiln_kv_row_bytes(sp->type_v, KV)),
                    .kv_row_f16 = (uint64_t)(c->n_layer * 2 * KV * 2)};
    for (int64_t l = 0; l < c->n_layer; l++) {
        const kiln_llama_layer *w = &m->layers[l];
        const kiln_tensor_view *mats[] = {w->wq, w->wk, w->wv, w->wo, w->w_gate, w->w_up, w->w_down};
        k.layer_bytes += w->attn_norm->nbytes + w->ffn_norm->nbytes;
        for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++) {
            k.layer_bytes += mats[i]->nbytes;
            k.layer_params += elems(mats[i]);
        }
    }
    return k;
}

/* Bytes one decode at position pos reads: the weights (one embedding row; the whole table again as a tied head)
 * and the cache of positions 0..pos. */
static uint64_t decode_bytes(const kiln_model *m, const model_cost *k, int64_t pos) {
    return k->layer_bytes + k->head_bytes + k->embd_row + (m->cfg.tied ? k->embd_bytes : 0) +
           (uint64_t)(pos + 1) * k->kv_row_bytes;
}

/* Multiply-adds x 2 of a prefill of P tokens from position 0 with last-row logits. */
static double prefill_flops(const kiln_model *m, const model_cost *k, int64_t P) {
    const kiln_llama_config *c = &m->cfg;
    const double attn = 4.0 * (double)(c->n_head * c->head_dim) * (double)P * (double)(P + 1) / 2.0 * (double)c->n_layer;
    return 2.0 * (double)P * (double)k->layer_params + 2.0 * (double)k->head_params + attn;
}

/* ---------------------------------------------------------------- cases */

typedef struct {
    const char *model;           /* path */
    char test[24];               /* "pp128", "tg64" */
    int threads, reps;
    int64_t n_prompt, n_gen;
    double best_s, median_s;
    double best_tps, median_tps;
    double rate;                 /* pp: GFLOP/s, tg: GB/s (best) */
    double session_s;            /* kiln_session_new: cache and scratch, and the weights repacked for the CPU kernels */
    long long rss;
    uint64_t file_bytes, kv_bytes, kv_bytes_f16;
} case_result;

typedef struct {
    const char *path;
    const kiln_model *m;
    const model_cost *cost;
    uint64_t file_bytes, kv_bytes, kv_bytes_f16; /* the cache of n_ctx positions in the asked types, and in f16 */
    const char *type_k, *type_v;
    const char *ftype;
    int64_t n_ctx;
    double load_s;
} model_info;

static int eval_or_report(kiln_session *s, const int32_t *ids, size_t n, float *logits, const char *what) {
    const kiln_status st = kiln_session_eval(s, ids, n, logits, NULL);
    if (st == KILN_OK) return 0;
    const char *msg = kiln_last_error();
    fprintf(stderr, "kiln bench: %s: %s\n", what, *msg ? msg : kiln_status_name(st));
    return 1;
}

/* One timed repetition of a case; returns seconds, or a negative number after printing the error. */
static double run_pp(kiln_session *s, const int32_t *ids, int64_t P, float *logits) {
    kiln_session_reset(s);
    const double a = kiln_bench_now();
    if (eval_or_report(s, ids, (size_t)P, logits, "prefill")) return -1.0;
    return kiln_bench_now() - a;
}

static double run_tg(kiln_session *s, const int32_t *ids, int64_t N, float *logits) {
    kiln_session_reset(s);
    if (eval_or_report(s, ids, TG_PROMPT, logits, "tg prompt")) return -1.0;
    const double a = kiln_bench_now();
    for (int64_t i = 0; i < N; i++)
        if (eval_or_report(s, ids + TG_PROMPT + i, 1, logits, "decode")) return -1.0;
    return kiln_bench_now() - a;
}

static void print_case_json(const model_info *mi, const case_result *r, const double *times, double rate_median) {
    const model_cost *k = mi->cost;
    printf("{\"bench\":\"model\",\"model\":");
    kiln_bench_json_str(kiln_bench_base_name(mi->path));
    printf(",\"path\":");
    kiln_bench_json_str(mi->path);
    printf(",\"ftype\":\"%s\",\"file_bytes\":%llu,\"n_params_layers\":%llu,\"n_params_head\":%llu,\"n_params_embd\":%llu,"
           "\"weight_bytes_layers\":%llu,\"weight_bytes_embd\":%llu,\"tied\":%s,\"test\":\"%s\",\"n_prompt\":%lld,"
           "\"n_gen\":%lld,\"threads\":%d,\"n_batch\":512,\"n_ctx\":%lld,\"type_k\":\"%s\",\"type_v\":\"%s\",\"kv_bytes\":%llu,"
           "\"kv_bytes_f16\":%llu,\"kv_saved_bytes\":%lld,\"load_s\":%.4f,\"session_s\":%.4f,\"reps\":%d,\"times_s\":[",
           mi->ftype, (unsigned long long)mi->file_bytes, (unsigned long long)k->layer_params,
           (unsigned long long)k->head_params, (unsigned long long)elems(mi->m->tok_embd), (unsigned long long)k->layer_bytes,
           (unsigned long long)k->embd_bytes, mi->m->cfg.tied ? "true" : "false", r->test, (long long)r->n_prompt,
           (long long)r->n_gen, r->threads, (long long)mi->n_ctx, mi->type_k, mi->type_v, (unsigned long long)mi->kv_bytes,
           (unsigned long long)mi->kv_bytes_f16, (long long)mi->kv_bytes_f16 - (long long)mi->kv_bytes, mi->load_s, r->session_s,
           r->reps);
    for (int i = 0; i < r->reps; i++) printf("%s%.6e", i ? "," : "", times[i]);
    printf("],\"best_s\":%.6e,\"median_s\":%.6e,\"best_tps\":%.3f,\"median_tps\":%.3f", r->best_s, r->median_s, r->best_tps,
           r->median_tps);
    if (r->n_gen) {
        uint64_t bytes = 0;
        for (int64_t i = 0; i < r->n_gen; i++) bytes += decode_bytes(mi->m, k, TG_PROMPT + i);
        printf(",\"tg_prompt\":%d,\"bytes_read\":%llu,\"best_gbs\":%.3f,\"median_gbs\":%.3f", TG_PROMPT,
               (unsigned long long)bytes, r->rate, rate_median);
    } else {
        printf(",\"flops\":%.6e,\"best_gflops\":%.3f,\"median_gflops\":%.3f", prefill_flops(mi->m, k, r->n_prompt), r->rate,
               rate_median);
    }
    printf(",\"peak_rss_bytes\":%lld}\n", r->rss);
    fflush(stdout);
}

/* Runs a case: warm-up, then reps timed repetitions. is_tg picks tg (n tokens decoded) or pp (n prefilled). */
static int bench_case(const model_info *mi, kiln_session *s, double session_s, int threads, bool is_tg, int64_t n, int reps,
                      const int32_t *ids, float *logits, case_result *r) {
    double times[MAX_REPS];
    if ((is_tg ? run_tg(s, ids, n, logits) : run_pp(s, ids, n, logits)) < 0) return 1;
    for (int i = 0; i < reps; i++)
        if ((times[i] = is_tg ? run_tg(s, ids, n, logits) : run_pp(s, ids, n, logits)) < 0) return 1;
    double sorted[MAX_REPS];
    memcpy(sorted, times, sizeof(double) * (size_t)reps);
    *r = (case_result){.model = mi->path, .threads = threads, .reps = reps, .n_prompt = is_tg ? 0 : n, .n_gen = is_tg ? n : 0,
                       .session_s = session_s};
    snprintf(r->test, sizeof r->test, "%s%lld", is_tg ? "tg" : "pp", (long long)n);
    r->median_s = kiln_bench_median(sorted, reps);
    r->best_s = sorted[0];
    r->best_tps = (double)n / r->best_s;
    r->median_tps = (double)n / r->median_s;
    double work;
    if (is_tg) {
        uint64_t bytes = 0;
        for (int64_t i = 0; i < n; i++) bytes += decode_bytes(mi->m, mi->cost, TG_PROMPT + i);
        work = (double)bytes;
    } else {
        work = prefill_flops(mi->m, mi->cost, n);
    }
    r->rate = work / r->best_s / 1e9;
    r->rss = peak_rss_bytes();
    r->file_bytes = mi->file_bytes, r->kv_bytes = mi->kv_bytes, r->kv_bytes_f16 = mi->kv_bytes_f16;
    print_case_json(mi, r, times, work / r->median_s / 1e9);
    return 0;
}

/* Every case of one model: pp for each prompt length, then tg, for each thread count. */
static int bench_model(const char *path, const int64_t *pps, int n_pp, int64_t n_gen, const int *threads, int n_threads,
                       int reps, case_result *res, int *n_res, kiln_cli_rope *rope, const kiln_session_params *kv) {
    kiln_model *m = NULL;
    const double t0 = kiln_bench_now();
    kiln_status st = kiln_model_load(path, &m);
    if (st) {
        const char *msg = kiln_last_error();
        fprintf(stderr, "kiln bench: %s\n", *msg ? msg : kiln_status_name(st));
        return 1;
    }
    if (!kiln_cli_rope_apply("bench", rope, m)) { /* --rope-* / --yarn-*, as generate */
        kiln_model_free(m);
        return 1;
    }
    const double load_s = kiln_bench_now() - t0;
    const model_cost cost = model_cost_of(m, kv);
    const kiln_llama_config *c = &m->cfg;

    int64_t n_ctx = n_gen ? TG_PROMPT + n_gen : 0;
    for (int i = 0; i < n_pp; i++) n_ctx = pps[i] > n_ctx ? pps[i] : n_ctx;
    uint32_t ft = 0;
    const bool has_ft = kiln_gguf_get_u32(m->gguf, "general.file_type", &ft) == KILN_OK;
    model_info mi = {.path = path, .m = m, .cost = &cost, .file_bytes = kiln_gguf_file_size(m->gguf),
                     .kv_bytes = (uint64_t)n_ctx * cost.kv_row_bytes, .kv_bytes_f16 = (uint64_t)n_ctx * cost.kv_row_f16,
                     .type_k = kiln_kv_type_name(kv->type_k), .type_v = kiln_kv_type_name(kv->type_v),
                     .ftype = has_ft ? kiln_ftype_name((kiln_ftype)ft) : "unknown",
                     .n_ctx = n_ctx, .load_s = load_s};
    if (n_ctx > c->n_ctx_train)
        fprintf(stderr, "kiln bench: note: %s: a context of %lld is beyond the %lld it was trained for (speed only)\n", path,
                (long long)n_ctx, (long long)c->n_ctx_train);

    int rc = 1;
    kiln_session *s = NULL;
    int32_t *ids = malloc(sizeof *ids * (size_t)n_ctx);
    float *logits = malloc(sizeof *logits * (size_t)c->n_vocab);
    if (!ids || !logits) {
        fprintf(stderr, "kiln bench: out of memory for %lld ids and %lld logits\n", (long long)n_ctx, (long long)c->n_vocab);
        goto out;
    }
    uint64_t x = 0x9E3779B97F4A7C15ull; /* xorshift64*: the same ids every run */
    for (int64_t i = 0; i < n_ctx; i++) {
        x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
        ids[i] = (int32_t)((x * 0x2545F4914F6CDD1Dull >> 32) % (uint64_t)c->n_vocab);
    }
    for (int ti = 0; ti < n_threads; ti++) {
        const kiln_session_params sp = {.n_ctx = n_ctx, .n_batch = 512, .n_threads = threads[ti], .type_k = kv->type_k,
                                        .type_v = kv->type_v};
        const double s0 = kiln_bench_now();
        if ((st = kiln_session_new(m, &sp, &s)) != KILN_OK) {
            const char *msg = kiln_last_error();
            fprintf(stderr, "kiln bench: %s: session of %lld positions: %s\n", path, (long long)n_ctx, *msg ? msg : kiln_status_name(st));
            goto out;
        }
        const double session_s = kiln_bench_now() - s0;
        for (int i = 0; i < n_pp; i++)
            if (bench_case(&mi, s, session_s, threads[ti], false, pps[i], reps, ids, logits, &res[(*n_res)++]) != 0) goto out;
        if (n_gen && bench_case(&mi, s, session_s, threads[ti], true, n_gen, reps, ids, logits, &res[(*n_res)++]) != 0) goto out;
        kiln_session_free(s);
        s = NULL;
    }
    rc = 0;
out:
    kiln_session_free(s);
    kiln_model_free(m);
    free(ids);
    free(logits);
    return rc;
}

/* ---------------------------------------------------------------- CLI */

static void usage(FILE *f) {
    fprintf(f, "usage: kiln bench -m MODEL.gguf [-m MODEL2.gguf ...] [-t THREADS] [-p 128,512] [-n 64] [-r REPS] [-ctk T]\n"
               "                  [-ctv T] [--json-only]\n"
               "  (also `kiln bench model ...`) prompt processing and generation tok/s, as llama-bench measures them;\n"
               "  bench/bench_llama.py adds llama.cpp on the same model and thread count, and the ratio\n"
               "  -t THREADS  comma-separated thread counts (default: all cores)\n"
               "  -p LIST     prompt lengths for pp, comma-separated (default 128,512; 0: no pp)\n"
               "  -ctk T, -ctv T  KV cache types (--cache-type-k/-v): f16 (default), f32, bf16, q8_0, q4_0\n"
               "  -n N        tokens decoded one at a time for tg, after a prompt of %d tokens (default 64; 0: no tg)\n"
               "  -r REPS     timed repetitions per case after one warm-up (default 3); best and median reported\n"
               "  llama-bench's --model, --threads, --n-prompt, --n-gen and --repetitions are the same flags\n",
            TG_PROMPT);
}

/* llama-bench's long forms (tools/llama-bench) of the flags below: the short form they stand for, or a itself. */
static const char *short_form(const char *a) {
    static const char *const longs[][2] = {
        {"--model", "-m"}, {"--threads", "-t"}, {"--n-prompt", "-p"}, {"--n-gen", "-n"}, {"--repetitions", "-r"},
    };
    for (size_t i = 0; i < sizeof longs / sizeof longs[0]; i++)
        if (strcmp(a, longs[i][0]) == 0) return longs[i][1];
    return a;
}

/* The options that take a value. */
static bool takes_value(const char *a) {
    return strcmp(a, "-m") == 0 || strcmp(a, "-t") == 0 || strcmp(a, "-p") == 0 || strcmp(a, "-n") == 0 || strcmp(a, "-r") == 0;
}

int kiln_bench_model(int argc, char **argv) {
    const char *models[MAX_ITEMS], *cmd = "bench";
    int n_models = 0, n_pp = 2, n_thr = 1;
    int64_t pps[MAX_ITEMS] = {128, 512}, thr64[MAX_ITEMS] = {0};
    int64_t n_gen = 64, reps = 3;
    bool json_only = false;
    kiln_cli_rope rope;
    kiln_cli_rope_init(&rope);
    kiln_session_params kv = {0}; /* -ctk, -ctv */
    for (int i = 0; i < argc; i++) {
        int rr = kiln_cli_rope_opt(cmd, argv[i], i + 1 < argc ? argv[i + 1] : NULL, &rope);
        if (rr == 0) rr = kiln_cli_kv_opt(cmd, argv[i], i + 1 < argc ? argv[i + 1] : NULL, &kv);
        if (rr < 0) return 1;
        if (rr > 0) {
            i++;
            continue;
        }
        const char *a = short_form(argv[i]), *typed = argv[i], *v; /* the errors name the flag as typed */
        if (strcmp(a, "--") == 0) { /* ends the options; bench takes no other argument */
            if (i + 1 < argc) return kiln_cli_error("%s: unexpected argument '%s'", cmd, argv[i + 1]);
            break;
        }
        if (strcmp(a, "--json-only") == 0) json_only = true;
        else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (!takes_value(a)) return kiln_cli_unknown(cmd, typed);
        else if (!(v = kiln_cli_value(cmd, argc, argv, &i))) return 1;
        else if (strcmp(a, "-m") == 0) {
            if (n_models == MAX_ITEMS) return kiln_cli_error("%s: more than %d models", cmd, MAX_ITEMS);
            models[n_models++] = v;
        } else if (strcmp(a, "-t") == 0) {
            if (kiln_bench_parse_list(cmd, typed, v, 0, 4096, thr64, MAX_ITEMS, &n_thr)) return 1;
        } else if (strcmp(a, "-p") == 0) {
            if (kiln_bench_parse_list(cmd, typed, v, 0, INT32_MAX, pps, MAX_ITEMS, &n_pp)) return 1;
        } else if (strcmp(a, "-n") == 0) {
            if (!kiln_cli_parse_int(cmd, typed, v, 0, INT32_MAX - TG_PROMPT, &n_gen)) return 1;
        } else if (!kiln_cli_parse_int(cmd, typed, v, 1, MAX_REPS, &reps)) /* -r */
            return 1;
    }
    if (n_models == 0) {
        fprintf(stderr, "kiln: bench: need -m MODEL.gguf (kiln bench --help)\n");
        return 1;
    }
    /* -p 0 turns pp off */
    int n_pp_on = 0;
    for (int i = 0; i < n_pp; i++)
        if (pps[i] > 0) pps[n_pp_on++] = pps[i];
    if (n_pp_on == 0 && n_gen == 0) {
        fprintf(stderr, "kiln: bench: -p 0 and -n 0 leave nothing to run\n");
        return 1;
    }
    int threads[MAX_ITEMS];
    for (int i = 0; i < n_thr; i++) threads[i] = thr64[i] ? (int)thr64[i] : kiln_n_cores();

    case_result *res = calloc((size_t)n_models * (size_t)n_thr * (size_t)(n_pp_on + 1), sizeof *res);
    int n_res = 0;
    if (!res) {
        fprintf(stderr, "kiln bench: out of memory\n");
        return 1;
    }
    for (int mi = 0; mi < n_models; mi++)
        if (bench_model(models[mi], pps, n_pp_on, n_gen, threads, n_thr, (int)reps, res, &n_res, &rope, &kv) != 0) {
            free(res);
            return 1;
        }
    if (!json_only) {
        printf("\nkiln bench: pp = prefill of P tokens from position 0 (n_batch 512), tg = N single-token decodes after a "
               "prompt of %d tokens;\nbest (median) of %d repetitions after a warm-up; GFLOP/s for pp (matmuls + attention), GB/s "
               "for tg (weights + KV read per token);\nthe llama.cpp peer and the ratio: bench/bench_llama.py\n\n",
               TG_PROMPT, (int)reps);
        printf("%-36s %-7s %3s %10s %10s %15s %9s %9s %11s %8s %9s\n", "model", "test", "t", "tok/s", "med tok/s", "rate",
               "file MiB", "RSS MiB", "KV k/v", "KV MiB", "vs f16");
        for (int i = 0; i < n_res; i++) {
            const case_result *r = &res[i];
            char rate[32];
            snprintf(rate, sizeof rate, "%.2f %s", r->rate, r->n_gen ? "GB/s" : "GFLOP/s");
            char types[24], saved[24];
            snprintf(types, sizeof types, "%s/%s", kiln_kv_type_name(kv.type_k), kiln_kv_type_name(kv.type_v));
            snprintf(saved, sizeof saved, "%+.1f%%", 100.0 * ((double)r->kv_bytes / (double)r->kv_bytes_f16 - 1));
            printf("%-36s %-7s %3d %10.2f %10.2f %15s %9.1f %9.1f %11s %8.2f %9s\n", kiln_bench_base_name(r->model), r->test,
                   r->threads, r->best_tps, r->median_tps, rate, (double)r->file_bytes / (1 << 20), (double)r->rss / (1 << 20), types,
                   (double)r->kv_bytes / (1 << 20), saved);
        }
    }
    free(res);
    return 0;
}
