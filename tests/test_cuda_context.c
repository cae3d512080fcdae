/* test_cuda_context.c: the multi-sequence context (src/infer/context.c) on the GPU, on the bundled default model
 * (q8_0) and the sliding-window fixture tests/ref/arch_gemma2.gguf (F32, window 4 on even layers, softcaps):
 *   against the CPU  4 sequences in interleaved batches (prefill chunks beside single tokens, the sequences'
 *                    entries scrambled), with n_batch 16 so a step of more than 8 rows takes the tensor-core GEMM
 *                    path: every row's logits within test_cuda_engine.c's bounds of the CPU's (relative RMS 8e-2 for
 *                    a step on the GEMM path, bf16 rounding; 3e-2 on the matvec path)
 *   against itself   the same with n_batch 8 (every step on the matvec path) against each sequence alone in a GPU
 *                    session fed the same chunks: relative RMS 1e-4 (the same kernels on the same rows; only the rows
 *                    that share a launch differ), then 6 greedy steps of all 4 in one batch give each sequence's
 *                    greedy tokens alone (the graph-replayed single-token step), except where the alone run's own
 *                    top-2 margin is under 1e-3
 *   decode rows      20 sequences stepping one token each, as a server's slots do (one launch of qkv_post and of
 *                    attention per layer over all their caches, and one recorded step per batch size): steps of
 *                    all 20 (the GEMM path), then two different sets of 12, two of 6 and two single sequences (each
 *                    size's recording replayed over other sequences at other positions), every row against a CPU
 *                    context fed the same batches within the bounds above, the device's argmax equal to the row's,
 *                    with the f16 cache and with q8_0 (the window fixture's rows of 8 take only f16)
 *   sampled rows     the same sequences' tokens drawn on the device by each one's own sampler
 *                    (kiln_context_decode_sample, as the server's slots), steps of 20, 12, 6 and 1 rows, each size's
 *                    recording replayed with new args: every token is the one a host sampler of the same seed draws
 *                    from the step's row and the sequence's history (the greedy and banned rows exactly; the others
 *                    but for at most 1 draw in 40, a coin within float rounding of a cdf boundary, as
 *                    test_generate's sampled steps allow)
 * Compiled with KILN_CUDA only; skips without a GPU. */
#include "test.h"
#include "cuda/cuda.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifdef KILN_CUDA

#define MODEL "models/shakespeare.gguf"
#define WINDOW_MODEL "tests/ref/arch_gemma2.gguf"
#define NSEQ 4
#define MAXLEN 40
#define MAXCHUNK 64
#define GREEDY 6
#define N_CTX 64

static double rel_rms(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * (double)b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static int32_t argmax_margin(const float *x, int64_t n, double *margin) {
    int32_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = (int32_t)i;
    double second = -INFINITY;
    for (int64_t i = 0; i < n; i++)
        if (i != best && x[i] > second) second = x[i];
    *margin = (double)x[best] - second;
    return best;
}

/* Each sequence's tokens and the chunks they are fed in, step by step: a step takes, for the sequences in a rotating
 * order, a chunk of 1..max_chunk tokens while it has room (n_batch). */
typedef struct plan {
    int len[NSEQ];
    int32_t tok[NSEQ][MAXLEN];
    int n_chunk[NSEQ], chunk[NSEQ][MAXCHUNK], step[NSEQ][MAXCHUNK]; /* each chunk's size and step */
    int n_step;
} plan;

static void make_plan(plan *p, int64_t V, int n_batch, int max_chunk) {
    static const int lens[NSEQ] = {37, 9, 23, 6};
    unsigned long long r = 0x5eedull;
    memset(p, 0, sizeof *p);
    for (int s = 0; s < NSEQ; s++) {
        p->len[s] = lens[s];
        for (int i = 0; i < lens[s]; i++) p->tok[s][i] = (int32_t)(test_rng_next(&r) % (unsigned long long)V);
    }
    int done[NSEQ] = {0};
    for (int step = 0;; step++) {
        int room = n_batch, any = 0;
        for (int k = 0; k < NSEQ; k++) {
            const int s = (k + step) % NSEQ;
            int n = 1 + (int)(test_rng_next(&r) % (unsigned long long)max_chunk);
            if (n > p->len[s] - done[s]) n = p->len[s] - done[s];
            if (n > room) n = room;
            if (n <= 0) continue;
            p->step[s][p->n_chunk[s]] = step;
            p->chunk[s][p->n_chunk[s]++] = n;
            done[s] += n, room -= n, any = 1;
        }
        if (!any) break;
        p->n_step = step + 1;
    }
}

/* The plan through context c: every entry's logits into out[s] ((len, V) per sequence); rows_at_step[s][pos] gets the
 * step's row count (which path the matmuls took). */
static kiln_status run_plan(kiln_context *c, const plan *p, int64_t V, float *out[NSEQ], int step_T[NSEQ][MAXLEN]) {
    const int64_t B = kiln_context_n_batch(c);
    kiln_batch_entry *e = malloc(sizeof *e * (size_t)B);
    float *got = malloc(sizeof *got * (size_t)(B * V));
    unsigned long long r = 0xabcdull;
    kiln_status st = e && got ? KILN_OK : KILN_ERR_NOMEM;
    int next_chunk[NSEQ] = {0};
    for (int step = 0; !st && step < p->n_step; step++) {
        int seq[NSEQ], cnt[NSEQ], used[NSEQ] = {0}, nc = 0;
        int64_t pos0[NSEQ];
        size_t total = 0, n = 0;
        for (int s = 0; s < NSEQ; s++)
            if (next_chunk[s] < p->n_chunk[s] && p->step[s][next_chunk[s]] == step) {
                seq[nc] = s, pos0[nc] = kiln_context_seq_pos(c, s), cnt[nc] = p->chunk[s][next_chunk[s]++];
                total += (size_t)cnt[nc++];
            }
        while (n < total) { /* scrambled, each sequence's positions in order */
            const int k = (int)(test_rng_next(&r) % (unsigned long long)nc);
            if (used[k] == cnt[k]) continue;
            const int64_t pos = pos0[k] + used[k]++;
            e[n++] = (kiln_batch_entry){.seq = seq[k], .id = p->tok[seq[k]][pos], .pos = pos, .logits = true};
        }
        if ((st = kiln_context_decode(c, e, n, got, NULL))) break;
        for (size_t i = 0; i < n; i++) {
            memcpy(out[e[i].seq] + (size_t)e[i].pos * (size_t)V, got + i * (size_t)V, sizeof *got * (size_t)V);
            if (step_T) step_T[e[i].seq][e[i].pos] = (int)n;
        }
    }
    free(e);
    free(got);
    return st;
}

static bool alloc_rows(float *x[NSEQ], int64_t V) {
    bool ok = true;
    for (int s = 0; s < NSEQ; s++) ok = (x[s] = malloc(sizeof *x[s] * (size_t)((MAXLEN + GREEDY) * V))) && ok;
    return ok;
}

static void free_rows(float *x[NSEQ]) {
    for (int s = 0; s < NSEQ; s++) free(x[s]);
}

/* 4 sequences on the GPU against the same on the CPU, n_batch 16. */
static void check_against_cpu(const char *path) {
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    kiln_model *m = NULL;
    CHECK(kiln_model_load(path, &m) == KILN_OK, "%s", kiln_last_error());
    const int64_t V = kiln_model_n_vocab(m);
    plan *p = malloc(sizeof *p);
    float *gpu[NSEQ], *cpu[NSEQ];
    static int step_T[NSEQ][MAXLEN];
    CHECK(p && alloc_rows(gpu, V) && alloc_rows(cpu, V));
    make_plan(p, V, 16, 12);
    kiln_context_params cp = {.s = {.n_ctx = N_CTX, .n_batch = 16, .n_threads = 2}, .n_seq = NSEQ};
    kiln_context *c = NULL, *g = NULL;
    CHECK(kiln_context_new(m, &cp, &c) == KILN_OK, "%s", kiln_last_error());
    cp.s.device = (kiln_device){.kind = KILN_DEVICE_CUDA, .index = 0};
    CHECK(kiln_context_new(m, &cp, &g) == KILN_OK, "%s", kiln_last_error());
    CHECK(kiln_context_on_gpu(g) && kiln_context_device_bytes(g) > 0);
    CHECK(run_plan(c, p, V, cpu, NULL) == KILN_OK, "cpu: %s", kiln_last_error());
    CHECK(run_plan(g, p, V, gpu, step_T) == KILN_OK, "gpu: %s", kiln_last_error());
    double worst_gemm = 0, worst_mv = 0;
    for (int s = 0; s < NSEQ; s++)
        for (int i = 0; i < p->len[s]; i++) {
            const double e = rel_rms(gpu[s] + (size_t)i * (size_t)V, cpu[s] + (size_t)i * (size_t)V, (size_t)V);
            double *w = step_T[s][i] > 8 ? &worst_gemm : &worst_mv;
            if (!(e <= *w)) *w = e;
        }
    printf("# %s: GPU against CPU, 4 sequences: relative RMS %.3g on GEMM steps, %.3g on matvec steps\n", path, worst_gemm, worst_mv);
    CHECK(worst_gemm <= 8e-2 && worst_mv <= 3e-2, "%s: %.3g %.3g", path, worst_gemm, worst_mv);
    kiln_context_free(c);
    kiln_context_free(g);
    free_rows(gpu);
    free_rows(cpu);
    free(p);
    kiln_model_free(m);
}

/* 4 sequences in one GPU context against each alone in a GPU session, n_batch 8; then greedy decode together.
 * Bit for bit: so every row must take the same matmul kernels alone and batched, and KILN_MATVEC_ROWS=8 keeps
 * steps of 7 and 8 rows on the matvecs, whose rows do not depend on each other (by default gemm_small takes them,
 * on the tensor cores, and a chunk of 7 alone then rounds differently from the same rows within a batch of 9 on
 * cuBLASLt: 0.75% apart). What this test checks is the batching: each sequence's cache rows and positions. */
static void check_against_alone(const char *path) {
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    setenv("KILN_MATVEC_ROWS", "8", 1); /* read when each engine opens */
    kiln_model *m = NULL;
    CHECK(kiln_model_load(path, &m) == KILN_OK, "%s", kiln_last_error());
    const int64_t V = kiln_model_n_vocab(m);
    plan *p = malloc(sizeof *p);
    float *got[NSEQ], *ref[NSEQ], *row = malloc(sizeof *row * (size_t)(NSEQ * V));
    CHECK(p && row && alloc_rows(got, V) && alloc_rows(ref, V));
    make_plan(p, V, 8, 5);
    const kiln_session_params sp = {.n_ctx = N_CTX, .n_batch = 8, .device = {.kind = KILN_DEVICE_CUDA, .index = 0}};
    int32_t alone[NSEQ][GREEDY];
    double margin[NSEQ][GREEDY];
    for (int s = 0; s < NSEQ; s++) { /* the reference: the plan's chunks, then greedy through the recorded step */
        kiln_session *ss = NULL;
        CHECK(kiln_session_new(m, &sp, &ss) == KILN_OK, "%s", kiln_last_error());
        bool ok = true;
        for (int k = 0, at = 0; ok && k < p->n_chunk[s]; at += p->chunk[s][k++])
            ok = kiln_session_eval(ss, p->tok[s] + at, (size_t)p->chunk[s][k], NULL, ref[s] + (size_t)at * V) == KILN_OK;
        const float *last = ref[s] + (size_t)(p->len[s] - 1) * V;
        for (int k = 0; ok && k < GREEDY; k++) {
            alone[s][k] = argmax_margin(last, V, &margin[s][k]);
            ok = kiln_session_eval(ss, &alone[s][k], 1, ref[s] + (size_t)(p->len[s] + k) * V, NULL) == KILN_OK;
            last = ref[s] + (size_t)(p->len[s] + k) * V;
        }
        kiln_session_free(ss);
        CHECK(ok, "%s", kiln_last_error());
    }
    kiln_context *g = NULL;
    const kiln_context_params cp = {.s = sp, .n_seq = NSEQ};
    CHECK(kiln_context_new(m, &cp, &g) == KILN_OK, "%s", kiln_last_error());
    CHECK(run_plan(g, p, V, got, NULL) == KILN_OK, "%s", kiln_last_error());
    double worst = 0;
    for (int s = 0; s < NSEQ; s++)
        for (int i = 0; i < p->len[s]; i++) {
            const double e = rel_rms(got[s] + (size_t)i * (size_t)V, ref[s] + (size_t)i * (size_t)V, (size_t)V);
            if (!(e <= worst)) worst = e;
        }
    /* greedy: the 4 sequences' next tokens in one batch, in reverse order, argmax on the device */
    int32_t cur[NSEQ];
    for (int s = 0; s < NSEQ; s++) cur[s] = alone[s][0];
    int diverged = 0;
    for (int k = 0; k < GREEDY && !diverged; k++) {
        kiln_batch_entry e[NSEQ];
        for (int i = 0; i < NSEQ; i++) {
            const int s = NSEQ - 1 - i;
            e[i] = (kiln_batch_entry){.seq = s, .id = cur[s], .pos = kiln_context_seq_pos(g, s), .logits = true};
        }
        int32_t next[NSEQ];
        CHECK(kiln_context_decode(g, e, NSEQ, row, next) == KILN_OK, "%s", kiln_last_error());
        for (int i = 0; i < NSEQ; i++) {
            const int s = NSEQ - 1 - i;
            const double d = rel_rms(row + (size_t)i * (size_t)V, ref[s] + (size_t)(p->len[s] + k) * V, (size_t)V);
            if (!(d <= worst)) worst = d;
            if (k + 1 < GREEDY) {
                if (next[i] != alone[s][k + 1]) {
                    CHECK(margin[s][k + 1] < 1e-3, "%s: sequence %d's greedy token %d is %d, alone %d (margin %.3g)", path, s, k + 1,
                          next[i], alone[s][k + 1], margin[s][k + 1]);
                    diverged = 1;
                }
                cur[s] = next[i];
            }
        }
    }
    printf("# %s: 4 GPU sequences in one context against each alone: relative RMS %.3g%s\n", path, worst,
           diverged ? " (a near-tie diverged)" : "");
    CHECK(worst <= 1e-4, "%s: %.3g", path, worst);
    kiln_context_free(g);
    free_rows(got);
    free_rows(ref);
    free(row);
    free(p);
    kiln_model_free(m);
}

/* NR sequences decoding a token each per step on the GPU and the CPU, in the step sets described at the top. */
#define NR 20
static void check_decode_rows(const char *path, kiln_kv_type tk, kiln_kv_type tv) {
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    kiln_model *m = NULL;
    CHECK(kiln_model_load(path, &m) == KILN_OK, "%s", kiln_last_error());
    const int64_t V = kiln_model_n_vocab(m);
    kiln_context_params cp = {.s = {.n_ctx = N_CTX, .n_batch = 32, .n_threads = 2, .type_k = tk, .type_v = tv}, .n_seq = NR};
    kiln_context *c = NULL, *g = NULL;
    CHECK(kiln_context_new(m, &cp, &c) == KILN_OK, "%s", kiln_last_error());
    cp.s.device = (kiln_device){.kind = KILN_DEVICE_CUDA, .index = 0};
    CHECK(kiln_context_new(m, &cp, &g) == KILN_OK, "%s", kiln_last_error());
    float *lc = malloc(sizeof *lc * (size_t)(NR * V)), *lg = malloc(sizeof *lg * (size_t)(NR * V));
    CHECK(lc && lg);
    unsigned long long r = 0x70c5ull;
    kiln_batch_entry e[NR + 12];
    for (int s = 0; s < NR; s++) { /* prompts of 1..11 tokens, one batch each */
        const int len = 1 + (s * 7) % 11;
        for (int i = 0; i < len; i++)
            e[i] = (kiln_batch_entry){.seq = s, .id = (int32_t)(test_rng_next(&r) % (unsigned long long)V), .pos = i};
        CHECK(kiln_context_decode(c, e, (size_t)len, NULL, NULL) == KILN_OK, "cpu: %s", kiln_last_error());
        CHECK(kiln_context_decode(g, e, (size_t)len, NULL, NULL) == KILN_OK, "gpu: %s", kiln_last_error());
    }
    static const int first[] = {0, 0, 0, 8, 0, 1, 19, 2, 0}, count[] = {NR, NR, 12, 12, 6, 6, 1, 1, NR}, stride[] = {1, 1, 1, 1, 3, 3, 1, 1, 1};
    double worst_gemm = 0, worst_mv = 0;
    int bad_next = 0;
    for (int k = 0; k < (int)(sizeof count / sizeof *count); k++) {
        const int n = count[k];
        for (int i = 0; i < n; i++) {
            const int s = first[k] + i * stride[k];
            e[i] = (kiln_batch_entry){.seq = s, .id = (int32_t)(test_rng_next(&r) % (unsigned long long)V),
                                      .pos = kiln_context_seq_pos(g, s), .logits = true};
        }
        for (int i = n - 1; i > 0; i--) { /* scrambled */
            const int j = (int)(test_rng_next(&r) % (unsigned long long)(i + 1));
            const kiln_batch_entry t = e[i];
            e[i] = e[j], e[j] = t;
        }
        int32_t next[NR];
        const bool greedy = k % 2; /* the argmaxes too, on the device: the other recording of each size */
        CHECK(kiln_context_decode(c, e, (size_t)n, lc, NULL) == KILN_OK, "cpu: %s", kiln_last_error());
        CHECK(kiln_context_decode(g, e, (size_t)n, lg, greedy ? next : NULL) == KILN_OK, "gpu: %s", kiln_last_error());
        for (int i = 0; i < n; i++) {
            const double d = rel_rms(lg + (size_t)i * V, lc + (size_t)i * V, (size_t)V);
            double *w = n > 8 ? &worst_gemm : &worst_mv;
            if (!(d <= *w)) *w = d;
            double margin;
            if (greedy && next[i] != argmax_margin(lg + (size_t)i * V, V, &margin)) bad_next++;
        }
    }
    printf("# %s (%s/%s cache): %d sequences a token each: relative RMS %.3g on GEMM steps, %.3g on matvec steps\n", path,
           kiln_kv_type_name(tk), kiln_kv_type_name(tv), NR, worst_gemm, worst_mv);
    CHECK(worst_gemm <= 8e-2 && worst_mv <= 3e-2, "%s: %.3g %.3g", path, worst_gemm, worst_mv);
    CHECK(bad_next == 0, "%s: %d device argmaxes differ from their rows'", path, bad_next);
    kiln_context_free(c);
    kiln_context_free(g);
    free(lc);
    free(lg);
    kiln_model_free(m);
}

static void check_sampled_rows(const char *path) {
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    kiln_model *m = NULL;
    CHECK(kiln_model_load(path, &m) == KILN_OK, "%s", kiln_last_error());
    const int64_t V = kiln_model_n_vocab(m);
    kiln_context_params cp = {.s = {.n_ctx = N_CTX, .n_batch = 32, .n_threads = 2}, .n_seq = NR};
    cp.s.device = (kiln_device){.kind = KILN_DEVICE_CUDA, .index = 0};
    kiln_context *g = NULL;
    CHECK(kiln_context_new(m, &cp, &g) == KILN_OK, "%s", kiln_last_error());
    static const kiln_sampler_params sp[4] = {
        {.temp = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f, .repeat_penalty = 1.1f, .repeat_last_n = 64},
        {.temp = 1.0f, .top_k = 0, .top_p = 1.0f, .repeat_penalty = 1.0f, .presence_penalty = 0.5f, .frequency_penalty = 0.3f, .repeat_last_n = 16},
        {.temp = 0.0f, .top_k = 40, .top_p = 0.95f, .repeat_penalty = 1.3f, .repeat_last_n = -1}, /* greedy, penalized, bans */
        {.temp = 0.7f, .top_k = 5, .top_p = 0.5f, .min_p = 0.1f, .repeat_penalty = 1.2f, .repeat_last_n = -1},
    };
    kiln_sampler *a[NR] = {0}, *h[NR] = {0};
    for (int s = 0; s < NR; s++) {
        kiln_sampler_params q = sp[s % 4];
        q.seed = 100 + (uint64_t)s;
        CHECK(kiln_sampler_new(&q, V, &a[s]) == KILN_OK && kiln_sampler_new(&q, V, &h[s]) == KILN_OK, "%s", kiln_last_error());
        const int32_t ban[2] = {(int32_t)(s % V), (int32_t)((7 * s + 3) % V)}; /* the greedy ones ban two ids */
        if (s % 4 == 2) CHECK(kiln_sampler_ban(a[s], ban, 2) == KILN_OK && kiln_sampler_ban(h[s], ban, 2) == KILN_OK);
    }
    float *lg = malloc(sizeof *lg * (size_t)(NR * V));
    int32_t feed[NR];
    CHECK(lg);
    unsigned long long r = 0x5a3dull;
    kiln_batch_entry e[NR + 12];
    for (int s = 0; s < NR; s++) { /* prompts of 1..11 tokens */
        const int len = 1 + (s * 5) % 11;
        for (int i = 0; i < len; i++) e[i] = (kiln_batch_entry){.seq = s, .id = (int32_t)(test_rng_next(&r) % (unsigned long long)V), .pos = i};
        CHECK(kiln_context_decode(g, e, (size_t)len, NULL, NULL) == KILN_OK, "%s", kiln_last_error());
        feed[s] = (int32_t)(test_rng_next(&r) % (unsigned long long)V);
    }
    static const int count[] = {NR, NR, 12, 12, 6, 6, 1, 1, NR};
    int draws = 0, off = 0, off_exact = 0;
    for (int k = 0; k < (int)(sizeof count / sizeof *count); k++) {
        const int n = count[k];
        kiln_sampler *smp[NR];
        int seq[NR];
        for (int i = 0; i < n; i++) seq[i] = (k * 7 + i * 3) % NR; /* NR and 3 coprime: distinct */
        for (int i = n - 1; i > 0; i--) {
            const int j = (int)(test_rng_next(&r) % (unsigned long long)(i + 1)), t = seq[i];
            seq[i] = seq[j], seq[j] = t;
        }
        for (int i = 0; i < n; i++) {
            const int s = seq[i];
            e[i] = (kiln_batch_entry){.seq = s, .id = feed[s], .pos = kiln_context_seq_pos(g, s), .logits = true};
            smp[i] = a[s];
        }
        int32_t next[NR];
        CHECK(kiln_context_decode_sample(g, e, (size_t)n, smp, lg, next) == KILN_OK, "step %d: %s", k, kiln_last_error());
        for (int i = 0; i < n; i++) {
            const int s = seq[i];
            float *row = lg + (size_t)i * (size_t)V;
            const int32_t want = kiln_sampler_sample(h[s], row, kiln_context_seq_tokens(g, s), (size_t)kiln_context_seq_pos(g, s));
            draws++;
            if (next[i] != want) off++, off_exact += sp[s % 4].temp == 0.0f;
            feed[s] = next[i];
        }
    }
    printf("# %s: %d tokens drawn on the device in rows of 20, 12, 6 and 1, %d differ from the host's draw\n", path, draws, off);
    CHECK(off_exact == 0, "%s: %d greedy rows differ from the host's", path, off_exact);
    CHECK(off * 40 <= draws, "%s: %d of %d draws differ from the host's", path, off, draws);
    for (int s = 0; s < NR; s++) kiln_sampler_free(a[s]), kiln_sampler_free(h[s]);
    kiln_context_free(g);
    free(lg);
    kiln_model_free(m);
}

static void test_gpu_sampled_rows_default(void) { check_sampled_rows(MODEL); }
static void test_gpu_sampled_rows_window(void) { check_sampled_rows(WINDOW_MODEL); }

static void test_gpu_decode_rows_default(void) { check_decode_rows(MODEL, KILN_KV_F16, KILN_KV_F16); }
static void test_gpu_decode_rows_q8(void) { check_decode_rows(MODEL, KILN_KV_Q8_0, KILN_KV_Q8_0); }
static void test_gpu_decode_rows_window(void) { check_decode_rows(WINDOW_MODEL, KILN_KV_F16, KILN_KV_F16); }

static void test_gpu_against_cpu_default(void) { check_against_cpu(MODEL); }
static void test_gpu_against_cpu_window(void) { check_against_cpu(WINDOW_MODEL); }
static void test_gpu_against_alone_default(void) {
    check_against_alone(MODEL);
    unsetenv("KILN_MATVEC_ROWS"); /* also after a failed CHECK */
}
static void test_gpu_against_alone_window(void) {
    check_against_alone(WINDOW_MODEL);
    unsetenv("KILN_MATVEC_ROWS");
}

int main(void) {
    RUN(test_gpu_against_cpu_default);
    RUN(test_gpu_against_cpu_window);
    RUN(test_gpu_against_alone_default);
    RUN(test_gpu_against_alone_window);
    RUN(test_gpu_decode_rows_default);
    RUN(test_gpu_decode_rows_q8);
    RUN(test_gpu_decode_rows_window);
    RUN(test_gpu_sampled_rows_default);
    RUN(test_gpu_sampled_rows_window);
    TEST_EXIT();
}

#else

static void test_cuda_context(void) { SKIP("kiln built without CUDA (nvcc not on the PATH)"); }

int main(void) {
    RUN(test_cuda_context);
    TEST_EXIT();
}
#endif
