/* test_context.c: the multi-sequence context (src/infer/context.c) on the CPU, on the bundled default model
 * (models/shakespeare.gguf, full attention) and on tests/ref/arch_gemma2.gguf (a sliding window of 4 on even layers,
 * softcaps, sandwich norms), against sessions, which run each sequence alone:
 *   interleaved  batches of 4 sequences, prefill chunks of some mixed with single tokens of others, entries of the
 *                sequences interleaved in a scrambled order, give each entry the logits its sequence gets alone in a
 *                session fed the same chunks: bit for bit (the CPU's matmuls quantize and sum each row on its own, and
 *                attention runs per segment with the session's T, so nothing depends on the other rows); then greedy
 *                decode of all 4 in one batch a step gives the same tokens and logits as each alone; then sampled
 *                decode of all 4 in one batch, each row drawn in the step under its sequence's own sampler
 *                (kiln_context_decode_sample), gives the tokens a twin sampler (same settings and seed) draws on the
 *                host from the rows; a penalty window past 256 distinct ids draws on the host, the same token
 *   validation   a bad sequence, token id, a gap or repeated position, more than n_batch entries, an empty batch and a
 *                full context are each refused naming the entry, and nothing moves: the next good batch gives the
 *                logits a fresh context gives
 *   keep, copy   keeping a prefix, or copying one into another sequence, then continuing equals a fresh evaluation;
 *                on the ring of a sliding layer, keep and copy give up (0, or an error) once the rows are overwritten
 *   save         save -> a new context -> restore -> continue is bit for bit what never saving gives; a truncated or damaged file,
 *                another model's, another n_ctx's or another cache type's is refused naming the field and the sequence
 *                is unchanged; a failed save leaves no file. */
#include "kiln.h"
#include "test.h"

#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#define MODEL "models/shakespeare.gguf"
#define WINDOW_MODEL "tests/ref/arch_gemma2.gguf"
#define NSEQ 4

static char tmpdir[64];

/* name in the test's temporary folder (made on first use), in one of 16 rotating buffers. */
static const char *tmp_path(const char *name) {
    static char buf[16][128];
    static int k;
    if (!tmpdir[0]) {
        snprintf(tmpdir, sizeof tmpdir, "/tmp/kiln_ctx_XXXXXX");
        if (!mkdtemp(tmpdir)) return NULL;
    }
    char *p = buf[k++ % 16];
    snprintf(p, 128, "%s/%s", tmpdir, name);
    return p;
}

static bool exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

static int32_t argmax(const float *x, int64_t n) {
    int32_t b = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = (int32_t)i;
    return b;
}

static double max_diff(const float *a, const float *b, int64_t n) {
    double d = 0;
    for (int64_t i = 0; i < n; i++) {
        const double e = fabs((double)a[i] - (double)b[i]);
        if (!(e <= d)) d = e; /* a NaN counts as the worst */
    }
    return d;
}

/* ---------------------------------------------------------------- interleaved batches */

#define MAXLEN 24
#define MAXCHUNK 32
#define GREEDY 6

/* The plan: each sequence's tokens, cut into chunks taken step by step; the same chunks feed the sessions. */
typedef struct plan {
    int len[NSEQ];
    int32_t tok[NSEQ][MAXLEN + GREEDY];
    int n_chunk[NSEQ], chunk[NSEQ][MAXCHUNK]; /* each sequence's chunk sizes in order */
} plan;

/* Each sequence alone in a session fed the plan's chunks: every position's logits (len, V) into ref[s], then GREEDY
 * greedy tokens (appended to the plan's tok) with their logits into ref[s] after the prompt's. */
static bool run_alone(const kiln_model *m, const kiln_session_params *sp, plan *p, float *ref[NSEQ]) {
    const int64_t V = kiln_model_n_vocab(m);
    for (int s = 0; s < NSEQ; s++) {
        kiln_session *ss = NULL;
        if (kiln_session_new(m, sp, &ss)) return false;
        bool ok = true;
        for (int c = 0, at = 0; ok && c < p->n_chunk[s]; at += p->chunk[s][c++])
            ok = kiln_session_eval(ss, p->tok[s] + at, (size_t)p->chunk[s][c], NULL, ref[s] + (size_t)at * V) == KILN_OK;
        for (int g = 0; ok && g < GREEDY; g++) {
            const int at = p->len[s] + g;
            p->tok[s][at] = argmax(ref[s] + (size_t)(at - 1) * V, V);
            ok = kiln_session_eval(ss, &p->tok[s][at], 1, ref[s] + (size_t)at * V, NULL) == KILN_OK;
        }
        kiln_session_free(ss);
        if (!ok) return false;
    }
    return true;
}

/* Builds the plan: prompts of different lengths; each step takes, for the sequences in a rotating order, a chunk of
 * 1..5 tokens while the step has room (n_batch), so prefill chunks of some run beside single tokens of others. */
static void make_plan(plan *p, int64_t V, int n_batch, unsigned long long seed) {
    static const int lens[NSEQ] = {13, 9, 17, 6};
    unsigned long long r = seed;
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
            int n = 1 + (int)(test_rng_next(&r) % 5);
            if (n > p->len[s] - done[s]) n = p->len[s] - done[s];
            if (n > room) n = room;
            if (n <= 0) continue;
            p->chunk[s][p->n_chunk[s]++] = n;
            done[s] += n, room -= n, any = 1;
        }
        if (!any) break;
    }
}

/* The entries of one step: the chunks (seq, first position, count), emitted in a scrambled interleaving that keeps
 * each sequence's positions in order. */
static size_t scramble(kiln_batch_entry *e, const int *seq, const int64_t *pos0, const int *cnt, int n_chunks, const plan *p,
                       unsigned long long *r) {
    int used[NSEQ] = {0};
    size_t n = 0, total = 0;
    for (int c = 0; c < n_chunks; c++) total += (size_t)cnt[c];
    while (n < total) {
        const int c = (int)(test_rng_next(r) % (unsigned long long)n_chunks);
        if (used[c] == cnt[c]) continue;
        const int64_t pos = pos0[c] + used[c]++;
        e[n++] = (kiln_batch_entry){.seq = seq[c], .id = p->tok[seq[c]][pos], .pos = pos, .logits = true};
    }
    return n;
}

/* SAMPLED steps of all NSEQ sequences in one batch (scrambled), each token drawn in the step under its sequence's
 * sampler (kiln_context_decode_sample: the settings, the penalty window after the step, the coin and the bans as a
 * step's args, drawn in the rows' order), against kiln_sampler_sample of a twin sampler on the same row of logits
 * and the sequence's tokens: the host's own pipeline, RNG and penalties over the history, so the step must carry all
 * of them to the right row. Each drawn token is fed in the next step. */
#define SAMPLED 4
static void check_sampled(kiln_context *c, const plan *p, float *got, int64_t V, const char *name, unsigned long long *r) {
    static const kiln_sampler_params sp[NSEQ] = {
        {.temp = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f, .repeat_penalty = 1.1f, .repeat_last_n = 64, .seed = 1},
        {.temp = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .repeat_penalty = 1.0f, .presence_penalty = 0.5f,
         .frequency_penalty = 0.3f, .repeat_last_n = 16, .seed = 2},
        {.temp = 0.0f, .top_k = 40, .top_p = 0.95f, .repeat_penalty = 1.3f, .repeat_last_n = -1, .seed = 3},
        {.temp = 0.7f, .top_k = 5, .top_p = 0.5f, .min_p = 0.1f, .repeat_penalty = 1.2f, .repeat_last_n = -1, .seed = 4},
    };
    kiln_sampler *a[NSEQ] = {0}, *h[NSEQ] = {0};
    for (int s = 0; s < NSEQ; s++)
        CHECK(kiln_sampler_new(&sp[s], V, &a[s]) == KILN_OK && kiln_sampler_new(&sp[s], V, &h[s]) == KILN_OK, "%s", kiln_last_error());
    const int32_t ban[2] = {5, 9}; /* the greedy sequence never draws these (as --ignore-eos bans the ends) */
    CHECK(kiln_sampler_ban(a[2], ban, 2) == KILN_OK && kiln_sampler_ban(h[2], ban, 2) == KILN_OK);
    int32_t feed[NSEQ];
    for (int s = 0; s < NSEQ; s++) {
        feed[s] = (int32_t)((p->tok[s][0] + 7 * s + 1) % V); /* any token: the rows it gives are what count */
        CHECK(kiln_context_seq_pos(c, s) == p->len[s] + GREEDY, "%s: sequence %d at %lld before sampling", name, s,
              (long long)kiln_context_seq_pos(c, s));
    }
    int differ = 0, draws = 0;
    for (int k = 0; k < SAMPLED; k++) {
        /* one token of three sequences (scrambled), then two of the fourth at the end, all wanted: the context runs
         * the two-token sequence's rows first, so the rows' order is not the batch's */
        kiln_batch_entry e[NSEQ + 1];
        kiln_sampler *smp[NSEQ + 1];
        int order[NSEQ] = {0, 1, 2, 3};
        for (int i = NSEQ - 1; i > 0; i--) {
            const int j = (int)(test_rng_next(r) % (unsigned long long)(i + 1)), t = order[i];
            order[i] = order[j], order[j] = t;
        }
        int n = 0;
        for (int i = 0; i < NSEQ; i++) {
            const int s = order[i];
            e[n] = (kiln_batch_entry){.seq = s, .id = feed[s], .pos = kiln_context_seq_pos(c, s), .logits = true};
            smp[n++] = a[s];
        }
        const int two = order[0];
        e[n] = (kiln_batch_entry){.seq = two, .id = (int32_t)((feed[two] * 3 + 1) % V), .pos = e[0].pos + 1, .logits = true};
        smp[n++] = a[two];
        const kiln_batch_entry first = e[0];
        memmove(e, e + 1, sizeof *e * (size_t)(n - 2)), memmove(smp, smp + 1, sizeof *smp * (size_t)(n - 2));
        e[n - 2] = first, smp[n - 2] = a[two];
        int32_t next[NSEQ + 1];
        CHECK(kiln_context_decode_sample(c, e, (size_t)n, smp, got, next) == KILN_OK, "%s sampled %d: %s", name, k, kiln_last_error());
        for (int i = 0; i < n; i++) { /* batch order: the two-token sequence's draws in its own order too */
            const int s = e[i].seq;
            float *row = got + (size_t)i * (size_t)V;
            differ += next[i] != argmax(row, V), draws++;
            const int32_t want = kiln_sampler_sample(h[s], row, kiln_context_seq_tokens(c, s), (size_t)e[i].pos + 1);
            CHECK(next[i] == want, "%s sampled %d: entry %d (sequence %d) drew %d in the step, the host sampler %d", name, k, i, s,
                  next[i], want);
            feed[s] = next[i];
        }
    }
    CHECK(differ > 0, "%s: %d sampled tokens were all the argmax: the settings did nothing", name, draws);
    /* a bad entry, or a wanted row without its sampler, is refused before anything runs */
    kiln_batch_entry bad = {.seq = 0, .id = -1, .pos = kiln_context_seq_pos(c, 0), .logits = true};
    int32_t nx;
    kiln_sampler *none = NULL;
    CHECK(kiln_context_decode_sample(c, &bad, 1, a, NULL, &nx) == KILN_ERR_RANGE, "a bad id: %s", kiln_last_error());
    bad.id = 0;
    CHECK(kiln_context_decode_sample(c, &bad, 1, &none, NULL, &nx) == KILN_ERR_INVALID, "no sampler: %s", kiln_last_error());
    CHECK(kiln_context_decode_sample(c, &bad, 1, NULL, NULL, &nx) == KILN_ERR_INVALID, "no samplers: %s", kiln_last_error());
    CHECK(kiln_context_seq_pos(c, 0) == bad.pos, "a refused batch moved sequence 0");
    for (int s = 0; s < NSEQ; s++) kiln_sampler_free(a[s]), kiln_sampler_free(h[s]);
}

/* A penalty window of more than 256 distinct ids does not fit a step's args: kiln_context_decode_sample then draws on
 * the host, still the twin sampler's token, and the logits it returns are the row kiln_context_decode gives. */
static void test_sampled_wide_window(void) {
    kiln_model *m = NULL;
    CHECK(kiln_model_load(MODEL, &m) == KILN_OK, "%s", kiln_last_error());
    if (!m) return;
    const int64_t V = kiln_model_n_vocab(m), N = 290;
    const kiln_context_params cp = {.s = {.n_ctx = 300, .n_batch = 64, .n_threads = 2}, .n_seq = 1};
    kiln_context *c = NULL, *twin = NULL;
    CHECK(kiln_context_new(m, &cp, &c) == KILN_OK && kiln_context_new(m, &cp, &twin) == KILN_OK, "%s", kiln_last_error());
    kiln_batch_entry e[64];
    for (int64_t p0 = 0; c && twin && p0 < N; p0 += 64) { /* ids 0..289, all distinct */
        const int64_t n = N - p0 < 64 ? N - p0 : 64;
        for (int64_t i = 0; i < n; i++) e[i] = (kiln_batch_entry){.seq = 0, .id = (int32_t)((p0 + i) % V), .pos = p0 + i};
        CHECK(kiln_context_decode(c, e, (size_t)n, NULL, NULL) == KILN_OK && kiln_context_decode(twin, e, (size_t)n, NULL, NULL) == KILN_OK,
              "%s", kiln_last_error());
    }
    kiln_sampler_params sp = {.temp = 0.9f, .top_k = 0, .top_p = 0.9f, .repeat_penalty = 1.3f, .repeat_last_n = -1, .seed = 77};
    kiln_sampler *a = NULL, *h = NULL;
    CHECK(kiln_sampler_new(&sp, V, &a) == KILN_OK && kiln_sampler_new(&sp, V, &h) == KILN_OK);
    float *got = malloc(sizeof *got * (size_t)V), *want = malloc(sizeof *want * (size_t)V);
    int same = 0, kept = 0;
    for (int k = 0; got && want && a && h && k < 4; k++) {
        const kiln_batch_entry one = {.seq = 0, .id = (int32_t)(7 + k), .pos = N + k, .logits = true};
        int32_t next = -1;
        CHECK(kiln_context_decode_sample(c, &one, 1, &a, got, &next) == KILN_OK, "%s", kiln_last_error());
        CHECK(kiln_context_decode(twin, &one, 1, want, NULL) == KILN_OK, "%s", kiln_last_error());
        kept += memcmp(got, want, sizeof *got * (size_t)V) == 0;
        same += next == kiln_sampler_sample(h, want, kiln_context_seq_tokens(twin, 0), (size_t)(N + k + 1));
    }
    CHECK(kept == 4 && same == 4, "logits kept %d of 4, draws equal %d of 4", kept, same);
    kiln_sampler_free(a), kiln_sampler_free(h);
    free(got), free(want);
    kiln_context_free(c), kiln_context_free(twin);
    kiln_model_free(m);
}

static void check_interleaved(const char *path, const char *name) {
    kiln_model *m = NULL;
    CHECK(kiln_model_load(path, &m) == KILN_OK, "%s", kiln_last_error());
    const int64_t V = kiln_model_n_vocab(m);
    const int n_batch = 8;
    const kiln_session_params sp = {.n_ctx = 48, .n_batch = n_batch, .n_threads = 2};
    plan *p = malloc(sizeof *p);
    float *ref[NSEQ] = {0}, *got = malloc(sizeof *got * (size_t)(n_batch * V));
    for (int s = 0; s < NSEQ; s++) ref[s] = malloc(sizeof *ref[s] * (size_t)((MAXLEN + GREEDY) * V));
    CHECK(p && got && ref[0] && ref[1] && ref[2] && ref[3]);
    make_plan(p, V, n_batch, 0x5eedull);
    CHECK(run_alone(m, &sp, p, ref), "%s", kiln_last_error());

    kiln_context *c = NULL;
    const kiln_context_params cp = {.s = sp, .n_seq = NSEQ};
    CHECK(kiln_context_new(m, &cp, &c) == KILN_OK, "%s", kiln_last_error());
    CHECK(kiln_context_n_seq(c) == NSEQ && kiln_context_n_batch(c) == n_batch && kiln_context_n_ctx(c) == 48 && !kiln_context_on_gpu(c));
    /* the prompts: step k takes chunk k' of each sequence in the order make_plan took them */
    unsigned long long r = 0xabcdull;
    int next_chunk[NSEQ] = {0};
    double worst = 0;
    int steps = 0, mixed = 0;
    for (bool any = true; any; steps++) {
        int seq[NSEQ], cnt[NSEQ], nc = 0, room = n_batch;
        int64_t pos0[NSEQ];
        any = false;
        for (int k = 0; k < NSEQ; k++) { /* make_plan's rotation: chunks are taken in the same steps */
            const int s = (k + steps) % NSEQ;
            if (next_chunk[s] == p->n_chunk[s] || p->chunk[s][next_chunk[s]] > room) continue;
            seq[nc] = s, pos0[nc] = kiln_context_seq_pos(c, s), cnt[nc] = p->chunk[s][next_chunk[s]++];
            room -= cnt[nc++];
            any = true;
        }
        if (!any) break;
        kiln_batch_entry e[64];
        const size_t n = scramble(e, seq, pos0, cnt, nc, p, &r);
        bool multi = false, single = false;
        for (int k = 0; k < nc; k++) multi |= cnt[k] > 1, single |= cnt[k] == 1;
        mixed += multi && single;
        CHECK(kiln_context_decode(c, e, n, got, NULL) == KILN_OK, "%s step %d: %s", name, steps, kiln_last_error());
        for (size_t i = 0; i < n; i++) {
            const double d = max_diff(got + i * (size_t)V, ref[e[i].seq] + (size_t)e[i].pos * (size_t)V, V);
            if (d > worst) worst = d;
        }
    }
    for (int s = 0; s < NSEQ; s++) CHECK(kiln_context_seq_pos(c, s) == p->len[s], "%s: sequence %d at %lld", name, s, (long long)kiln_context_seq_pos(c, s));
    CHECK(mixed > 0, "%s: no step mixed a prefill chunk with a single token", name);
    /* greedy: every sequence's next token in one batch, the sequences in a scrambled order, argmax on the backend */
    for (int g = 0; g < GREEDY; g++) {
        kiln_batch_entry e[NSEQ];
        int order[NSEQ] = {0, 1, 2, 3};
        for (int i = NSEQ - 1; i > 0; i--) {
            const int j = (int)(test_rng_next(&r) % (unsigned long long)(i + 1)), t = order[i];
            order[i] = order[j], order[j] = t;
        }
        for (int i = 0; i < NSEQ; i++) {
            const int s = order[i];
            const int64_t pos = p->len[s] + g;
            e[i] = (kiln_batch_entry){.seq = s, .id = p->tok[s][pos], .pos = pos, .logits = true};
        }
        int32_t next[NSEQ];
        CHECK(kiln_context_decode(c, e, NSEQ, got, next) == KILN_OK, "%s greedy %d: %s", name, g, kiln_last_error());
        for (int i = 0; i < NSEQ; i++) {
            const int s = order[i];
            const float *want = ref[s] + (size_t)(p->len[s] + g) * (size_t)V;
            const double d = max_diff(got + (size_t)i * (size_t)V, want, V);
            if (d > worst) worst = d;
            CHECK(next[i] == argmax(want, V), "%s greedy %d: sequence %d's argmax %d, alone %d", name, g, s, next[i], argmax(want, V));
            if (g + 1 < GREEDY) CHECK(next[i] == p->tok[s][p->len[s] + g + 1]);
        }
    }
    check_sampled(c, p, got, V, name, &r);
    printf("# %s: %d steps of %d sequences (%d mixing prefill chunks and single tokens), max |logit - alone| %.3g\n", name, steps,
           NSEQ, mixed, worst);
    CHECK(worst == 0, "%s: the logits of a batch of sequences differ from each alone by %.3g", name, worst);
    for (int s = 0; s < NSEQ; s++)
        CHECK(memcmp(kiln_context_seq_tokens(c, s), p->tok[s], sizeof(int32_t) * (size_t)(p->len[s] + GREEDY)) == 0);
    kiln_context_free(c);
    for (int s = 0; s < NSEQ; s++) free(ref[s]);
    free(got);
    free(p);
    kiln_model_free(m);
}

static void test_interleaved_default(void) { check_interleaved(MODEL, "shakespeare"); }
static void test_interleaved_window(void) { check_interleaved(WINDOW_MODEL, "gemma2 fixture"); }

/* ---------------------------------------------------------------- validation */

/* One refused batch: the status, the message naming what, and every sequence where it was. */
static bool refused(kiln_context *c, const kiln_batch_entry *e, size_t n, kiln_status want, const char *what, const int64_t *pos) {
    const kiln_status st = kiln_context_decode(c, e, n, NULL, NULL);
    if (st != want || !strstr(kiln_last_error(), what)) {
        printf("# got %d '%s', wanted %d naming '%s'\n", st, kiln_last_error(), want, what);
        return false;
    }
    for (int s = 0; s < kiln_context_n_seq(c); s++)
        if (kiln_context_seq_pos(c, s) != pos[s]) return false;
    return true;
}

static void test_validation(void) {
    kiln_model *m = NULL;
    CHECK(kiln_model_load(MODEL, &m) == KILN_OK, "%s", kiln_last_error());
    const int64_t V = kiln_model_n_vocab(m);
    const kiln_context_params cp = {.s = {.n_ctx = 8, .n_batch = 4, .n_threads = 2}, .n_seq = 3};
    kiln_context *c = NULL, *fresh = NULL;
    CHECK(kiln_context_new(m, &cp, &c) == KILN_OK && kiln_context_new(m, &cp, &fresh) == KILN_OK, "%s", kiln_last_error());
    const kiln_batch_entry start[3] = {{0, 5, 0, false}, {1, 6, 0, false}, {0, 7, 1, false}};
    CHECK(kiln_context_decode(c, start, 3, NULL, NULL) == KILN_OK, "%s", kiln_last_error());
    CHECK(kiln_context_decode(fresh, start, 3, NULL, NULL) == KILN_OK, "%s", kiln_last_error());
    const int64_t pos[3] = {2, 1, 0};
    const kiln_batch_entry bad_seq[2] = {{2, 1, 0, true}, {3, 1, 0, true}};
    CHECK(refused(c, bad_seq, 2, KILN_ERR_RANGE, "entry 1: sequence 3 is outside 0..2", pos));
    const kiln_batch_entry neg_seq[1] = {{-1, 1, 0, true}};
    CHECK(refused(c, neg_seq, 1, KILN_ERR_RANGE, "entry 0: sequence -1", pos));
    const kiln_batch_entry bad_id[3] = {{0, 1, 2, true}, {1, 2, 1, true}, {2, (int32_t)V, 0, true}};
    CHECK(refused(c, bad_id, 3, KILN_ERR_RANGE, "entry 2: token id 2048 is outside the vocab", pos));
    const kiln_batch_entry neg_id[1] = {{1, -4, 1, true}};
    CHECK(refused(c, neg_id, 1, KILN_ERR_RANGE, "entry 0: token id -4", pos));
    const kiln_batch_entry gap[2] = {{1, 1, 1, true}, {0, 1, 3, true}};
    CHECK(refused(c, gap, 2, KILN_ERR_INVALID, "entry 1: position 3 of sequence 0 is not its next position 2", pos));
    const kiln_batch_entry dup[3] = {{2, 1, 0, false}, {0, 1, 2, false}, {0, 1, 2, true}};
    CHECK(refused(c, dup, 3, KILN_ERR_INVALID, "entry 2: position 2 of sequence 0 is not its next position 3", pos));
    const kiln_batch_entry back[1] = {{0, 1, 1, true}};
    CHECK(refused(c, back, 1, KILN_ERR_INVALID, "entry 0: position 1 of sequence 0 is not its next position 2", pos));
    const kiln_batch_entry many[5] = {{2, 1, 0, 0}, {2, 1, 1, 0}, {2, 1, 2, 0}, {2, 1, 3, 0}, {2, 1, 4, 0}};
    CHECK(refused(c, many, 5, KILN_ERR_RANGE, "a batch of 5 entries is more than n_batch 4", pos));
    CHECK(refused(c, many, 0, KILN_ERR_INVALID, "an empty batch", pos));
    /* sequence 0 up to position 7 of 8, then two more: the second is past the context */
    const kiln_batch_entry fill[4] = {{0, 1, 2, 0}, {0, 2, 3, 0}, {0, 3, 4, 0}, {0, 4, 5, 0}};
    CHECK(kiln_context_decode(c, fill, 4, NULL, NULL) == KILN_OK && kiln_context_decode(fresh, fill, 4, NULL, NULL) == KILN_OK);
    const kiln_batch_entry over[3] = {{1, 3, 1, true}, {0, 5, 6, true}, {0, 6, 7, true}};
    CHECK(kiln_context_decode(c, over, 2, NULL, NULL) == KILN_OK && kiln_context_decode(fresh, over, 2, NULL, NULL) == KILN_OK);
    const int64_t pos3[3] = {7, 2, 0};
    const kiln_batch_entry past[2] = {{0, 6, 7, true}, {0, 6, 8, true}};
    CHECK(refused(c, past, 2, KILN_ERR_RANGE, "entry 1: position 8 exceeds sequence 0's context of 8 tokens", pos3));
    /* nothing moved: the next good batch gives what the context that never saw the bad ones gives */
    const kiln_batch_entry good[3] = {{2, 9, 0, true}, {0, 6, 7, true}, {1, 4, 2, true}};
    float *a = malloc(sizeof *a * (size_t)(3 * V)), *b = malloc(sizeof *b * (size_t)(3 * V));
    CHECK(a && b);
    CHECK(kiln_context_decode(c, good, 3, a, NULL) == KILN_OK && kiln_context_decode(fresh, good, 3, b, NULL) == KILN_OK, "%s", kiln_last_error());
    CHECK(memcmp(a, b, sizeof *a * (size_t)(3 * V)) == 0, "a refused batch changed what a later one computes");
    const int32_t hist0[8] = {5, 7, 1, 2, 3, 4, 5, 6};
    CHECK(memcmp(kiln_context_seq_tokens(c, 0), hist0, sizeof hist0) == 0);
    CHECK(kiln_context_seq_pos(c, 0) == 8 && kiln_context_seq_pos(c, 1) == 3 && kiln_context_seq_pos(c, 2) == 1);
    free(a);
    free(b);
    kiln_context_free(c);
    kiln_context_free(fresh);
    kiln_model_free(m);
}

/* ---------------------------------------------------------------- keep and copy */

/* ids through sequence seq in chunks of the context's n_batch, one entry each, the last row's logits into out. */
static kiln_status feed(kiln_context *c, int32_t seq, const int32_t *ids, int64_t n, float *out) {
    const int64_t B = kiln_context_n_batch(c);
    kiln_batch_entry e[64];
    for (int64_t done = 0; done < n;) {
        const int64_t T = n - done < B ? n - done : B;
        const int64_t p0 = kiln_context_seq_pos(c, seq);
        for (int64_t t = 0; t < T; t++) e[t] = (kiln_batch_entry){seq, ids[done + t], p0 + t, done + t == n - 1};
        kiln_status st = kiln_context_decode(c, e, (size_t)T, done + T == n ? out : NULL, NULL);
        if (st) return st;
        done += T;
    }
    return KILN_OK;
}

static void check_keep_copy(const char *path, const char *name, bool window) {
    kiln_model *m = NULL;
    CHECK(kiln_model_load(path, &m) == KILN_OK, "%s", kiln_last_error());
    const int64_t V = kiln_model_n_vocab(m);
    const kiln_context_params cp = {.s = {.n_ctx = 40, .n_batch = 3, .n_threads = 2}, .n_seq = 3};
    kiln_context *c = NULL, *f = NULL;
    CHECK(kiln_context_new(m, &cp, &c) == KILN_OK && kiln_context_new(m, &cp, &f) == KILN_OK, "%s", kiln_last_error());
    int32_t a[30], b[30];
    unsigned long long r = 77;
    for (int i = 0; i < 30; i++) a[i] = (int32_t)(test_rng_next(&r) % (unsigned long long)V), b[i] = (int32_t)(test_rng_next(&r) % (unsigned long long)V);
    float *x = malloc(sizeof *x * (size_t)V), *y = malloc(sizeof *y * (size_t)V);
    CHECK(x && y);
    /* sequence 0 runs a[0..9], keeps 6 (the window's ring of 4 + 3 - 1 = 6 rows still holds positions 3..5: 9 <= 3 + 6)
     * and continues with b; a fresh sequence runs a[0..5] then b, in the same chunks */
    CHECK(feed(c, 0, a, 6, NULL) == KILN_OK && feed(c, 0, a + 6, 3, NULL) == KILN_OK, "%s", kiln_last_error());
    CHECK(kiln_context_seq_keep(c, 0, 6) == 6, "%s: keep(6) at 9 gave %lld", name, (long long)kiln_context_seq_pos(c, 0));
    CHECK(feed(c, 0, b, 5, x) == KILN_OK && feed(f, 0, a, 6, NULL) == KILN_OK && feed(f, 0, b, 5, y) == KILN_OK, "%s", kiln_last_error());
    CHECK(memcmp(x, y, sizeof *x * (size_t)V) == 0, "%s: keep then continue differs from a fresh run by %.3g", name, max_diff(x, y, V));
    /* copy sequence 0's first 8 (a[0..5] b[0..1]) into 1, which continues with a[20..]; fresh: sequence 1 of f */
    CHECK(kiln_context_seq_copy(c, 0, 1, 8) == KILN_OK, "%s: %s", name, kiln_last_error());
    CHECK(kiln_context_seq_pos(c, 1) == 8 && memcmp(kiln_context_seq_tokens(c, 1), kiln_context_seq_tokens(c, 0), 8 * sizeof(int32_t)) == 0);
    CHECK(feed(c, 1, a + 20, 4, x) == KILN_OK, "%s", kiln_last_error());
    CHECK(feed(f, 1, a, 6, NULL) == KILN_OK && feed(f, 1, b, 2, NULL) == KILN_OK && feed(f, 1, a + 20, 4, y) == KILN_OK, "%s", kiln_last_error());
    CHECK(memcmp(x, y, sizeof *x * (size_t)V) == 0, "%s: copy then continue differs from a fresh run by %.3g", name, max_diff(x, y, V));
    /* sequence 0 went on to 11 meanwhile untouched: it continues as f's sequence 0 does */
    CHECK(feed(c, 0, b + 10, 2, x) == KILN_OK && feed(f, 0, b + 10, 2, y) == KILN_OK && memcmp(x, y, sizeof *x * (size_t)V) == 0,
          "%s: the copy changed its source", name);
    /* copy onto itself keeps; out of range is refused */
    CHECK(kiln_context_seq_copy(c, 1, 1, 12) == KILN_OK && kiln_context_seq_pos(c, 1) == 12);
    CHECK(kiln_context_seq_copy(c, 0, 2, 14) == KILN_ERR_RANGE && strstr(kiln_last_error(), "sequence 0 holds 13"), "%s", kiln_last_error());
    CHECK(kiln_context_seq_copy(c, 0, 3, 1) == KILN_ERR_RANGE && kiln_context_seq_keep(c, 5, 1) == -1);
    if (window) {
        /* sequence 0 at 13: a prefix of 4 needs positions 1..3, long overwritten in the 6-row ring (4 + 6 < 13) */
        CHECK(feed(c, 2, b + 20, 2, NULL) == KILN_OK);
        CHECK(kiln_context_seq_copy(c, 0, 2, 4) == KILN_ERR_RANGE && strstr(kiln_last_error(), "nothing copied"), "%s", kiln_last_error());
        CHECK(kiln_context_seq_pos(c, 2) == 2 && memcmp(kiln_context_seq_tokens(c, 2), b + 20, 2 * sizeof(int32_t)) == 0,
              "a refused copy changed its destination");
        CHECK(kiln_context_seq_keep(c, 0, 4) == 0, "%s: keep(4) at 13 kept a ring's lost rows", name);
    } else {
        CHECK(kiln_context_seq_copy(c, 0, 2, 4) == KILN_OK && kiln_context_seq_keep(c, 0, 4) == 4);
    }
    free(x);
    free(y);
    kiln_context_free(c);
    kiln_context_free(f);
    kiln_model_free(m);
}

static void test_keep_copy_default(void) { check_keep_copy(MODEL, "shakespeare", false); }
static void test_keep_copy_window(void) { check_keep_copy(WINDOW_MODEL, "gemma2 fixture", true); }

/* ---------------------------------------------------------------- save and restore */

/* GREEDY tokens of greedy decode of sequence seq from its last logits x: the tokens into tok, the logits rows into
 * rows ((GREEDY, V)). */
static kiln_status greedy(kiln_context *c, int32_t seq, float *x, int64_t V, int32_t *tok, float *rows) {
    for (int g = 0; g < GREEDY; g++) {
        tok[g] = argmax(g ? rows + (size_t)(g - 1) * V : x, V);
        const kiln_batch_entry e = {seq, tok[g], kiln_context_seq_pos(c, seq), true};
        kiln_status st = kiln_context_decode(c, &e, 1, rows + (size_t)g * V, NULL);
        if (st) return st;
    }
    return KILN_OK;
}

static bool copy_file(const char *from, const char *to, long cut, long patch_at, uint32_t patch) {
    FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
    bool ok = a && b;
    if (ok) {
        fseek(a, 0, SEEK_END);
        const long n = ftell(a) - cut;
        fseek(a, 0, SEEK_SET);
        char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
        ok = buf && fread(buf, 1, (size_t)n, a) == (size_t)n;
        if (ok && patch_at >= 0) memcpy(buf + patch_at, &patch, sizeof patch);
        ok = ok && fwrite(buf, 1, (size_t)n, b) == (size_t)n;
        free(buf);
    }
    if (a) fclose(a);
    if (b && fclose(b) != 0) ok = false;
    return ok;
}

static void check_save(const char *path, const char *name) {
    kiln_model *m = NULL, *other = NULL;
    CHECK(kiln_model_load(path, &m) == KILN_OK, "%s", kiln_last_error());
    CHECK(kiln_model_load(strcmp(path, MODEL) ? MODEL : WINDOW_MODEL, &other) == KILN_OK, "%s", kiln_last_error());
    const int64_t V = kiln_model_n_vocab(m);
    const kiln_context_params cp = {.s = {.n_ctx = 40, .n_batch = 4, .n_threads = 2}, .n_seq = 3};
    kiln_context *c = NULL, *d = NULL;
    CHECK(kiln_context_new(m, &cp, &c) == KILN_OK && kiln_context_new(m, &cp, &d) == KILN_OK, "%s", kiln_last_error());
    int32_t a[20], tok1[GREEDY], tok2[GREEDY];
    unsigned long long r = 99;
    for (int i = 0; i < 20; i++) a[i] = (int32_t)(test_rng_next(&r) % (unsigned long long)V);
    float *x = malloc(sizeof *x * (size_t)V), *rows1 = malloc(sizeof *rows1 * (size_t)(GREEDY * V)),
          *rows2 = malloc(sizeof *rows2 * (size_t)(GREEDY * V));
    CHECK(x && rows1 && rows2);
    char file[128];
    CHECK(tmp_path("seq.bin"));
    snprintf(file, sizeof file, "%s", tmp_path("seq.bin"));
    /* sequence 1 of c: 13 tokens (past the window's 7-row ring), saved, then greedy */
    CHECK(feed(c, 0, a + 5, 3, NULL) == KILN_OK && feed(c, 1, a, 13, x) == KILN_OK, "%s", kiln_last_error());
    CHECK(kiln_context_seq_save(c, 1, file) == KILN_OK, "%s", kiln_last_error());
    CHECK(!exists(tmp_path("seq.bin.tmp")), "the temporary file is left");
    CHECK(greedy(c, 1, x, V, tok1, rows1) == KILN_OK, "%s", kiln_last_error());
    /* d's sequence 2, holding something else first, restores it and continues */
    CHECK(feed(d, 2, a + 3, 5, NULL) == KILN_OK);
    int64_t n = -1;
    CHECK(kiln_context_seq_restore(d, 2, file, &n) == KILN_OK, "%s", kiln_last_error());
    CHECK(n == 13 && kiln_context_seq_pos(d, 2) == 13 && memcmp(kiln_context_seq_tokens(d, 2), a, sizeof(int32_t) * 13) == 0);
    CHECK(greedy(d, 2, x, V, tok2, rows2) == KILN_OK, "%s", kiln_last_error());
    CHECK(memcmp(tok1, tok2, sizeof tok1) == 0 && memcmp(rows1, rows2, sizeof *rows1 * (size_t)(GREEDY * V)) == 0,
          "%s: the restored sequence differs from the saved one by %.3g", name, max_diff(rows1, rows2, GREEDY * V));

    /* refusals: sequence 0 of d holds 3 tokens and must keep them */
    CHECK(feed(d, 0, a + 9, 3, NULL) == KILN_OK);
    const int32_t held[3] = {a[9], a[10], a[11]};
    struct {
        const char *what, *needle;
        long cut, patch_at;
        uint32_t patch;
    } bad[] = {
        {"truncated", "bytes, its header says", 1, -1, 0},
        {"cut to the header", "bytes, its header says", 0, -1, 0}, /* cut set below */
        {"a cache type", "cache types type_k f32", 0, 32, 1},
        {"a version", "version 7", 0, 8, 7},
        {"a magic", "bad magic", 0, 0, 0x4b4c4e58u},
        {"a damaged row", "checksum", 0, 0, 0x5a5a5a5au}, /* patch_at set below: inside the last cache row */
    };
    { /* the fixed header is 48 bytes, then 16 a layer (n_layer at offset 12) */
        struct stat sb;
        uint32_t n_layer = 0;
        FILE *fh = fopen(file, "rb");
        CHECK(fh && stat(file, &sb) == 0 && fseek(fh, 12, SEEK_SET) == 0 && fread(&n_layer, 4, 1, fh) == 1);
        fclose(fh);
        bad[1].cut = (long)sb.st_size - 48 - 16 * (long)n_layer;
        bad[5].patch_at = (long)sb.st_size - 8 - 16; /* before the 8-byte checksum */
    }
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        const char *f = tmp_path("bad.bin");
        CHECK(copy_file(file, f, bad[i].cut, bad[i].patch_at, bad[i].patch));
        const kiln_status st = kiln_context_seq_restore(d, 0, f, &n);
        CHECK(st == KILN_ERR_INVALID && strstr(kiln_last_error(), bad[i].needle), "%s: %d '%s'", bad[i].what, st, kiln_last_error());
        CHECK(kiln_context_seq_pos(d, 0) == 3 && memcmp(kiln_context_seq_tokens(d, 0), held, sizeof held) == 0, "%s moved the sequence",
              bad[i].what);
    }
    /* another model's file, another n_ctx's context */
    kiln_context *o = NULL, *e = NULL;
    const kiln_context_params other_ctx = {.s = {.n_ctx = 32, .n_batch = 4, .n_threads = 2}, .n_seq = 1};
    CHECK(kiln_context_new(other, &cp, &o) == KILN_OK && kiln_context_new(m, &other_ctx, &e) == KILN_OK, "%s", kiln_last_error());
    CHECK(kiln_context_seq_restore(o, 0, file, &n) == KILN_ERR_INVALID && strstr(kiln_last_error(), "model fingerprint"), "%s", kiln_last_error());
    CHECK(kiln_context_seq_pos(o, 0) == 0);
    CHECK(kiln_context_seq_restore(e, 0, file, &n) == KILN_ERR_INVALID && strstr(kiln_last_error(), "n_ctx 40 is not this context's 32"),
          "%s", kiln_last_error());
    CHECK(kiln_context_seq_restore(d, 0, tmp_path("missing.bin"), &n) != KILN_OK && kiln_context_seq_pos(d, 0) == 3);
    /* a save that cannot be written leaves nothing */
    CHECK(kiln_context_seq_save(c, 1, "/nonexistent-kiln-dir/seq.bin") == KILN_ERR_IO, "%s", kiln_last_error());
    CHECK(!exists("/nonexistent-kiln-dir/seq.bin") && !exists("/nonexistent-kiln-dir/seq.bin.tmp"));
    CHECK(kiln_context_seq_save(c, 3, tmp_path("x.bin")) == KILN_ERR_RANGE && !exists(tmp_path("x.bin")));
    /* an empty sequence saves and restores too */
    CHECK(kiln_context_seq_save(c, 2, tmp_path("empty.bin")) == KILN_OK, "%s", kiln_last_error());
    CHECK(kiln_context_seq_restore(d, 0, tmp_path("empty.bin"), &n) == KILN_OK && n == 0 && kiln_context_seq_pos(d, 0) == 0);
    unlink(file);
    unlink(tmp_path("bad.bin"));
    unlink(tmp_path("empty.bin"));
    kiln_context_free(o);
    kiln_context_free(e);
    free(x);
    free(rows1);
    free(rows2);
    kiln_context_free(c);
    kiln_context_free(d);
    kiln_model_free(m);
    kiln_model_free(other);
}

static void test_save_restore_default(void) { check_save(MODEL, "shakespeare"); }
static void test_save_restore_window(void) { check_save(WINDOW_MODEL, "gemma2 fixture"); }

/* A session is its context's sequence 0: what the session evaluates, the context holds. */
static void test_session_context(void) {
    kiln_model *m = NULL;
    CHECK(kiln_model_load(MODEL, &m) == KILN_OK, "%s", kiln_last_error());
    const kiln_session_params sp = {.n_ctx = 16, .n_batch = 4, .n_threads = 1};
    kiln_session *s = NULL;
    CHECK(kiln_session_new(m, &sp, &s) == KILN_OK, "%s", kiln_last_error());
    const int32_t ids[5] = {3, 1, 4, 1, 5};
    CHECK(kiln_session_eval(s, ids, 5, NULL, NULL) == KILN_OK);
    kiln_context *c = kiln_session_context(s);
    CHECK(c && kiln_context_n_seq(c) == 1 && kiln_context_seq_pos(c, 0) == 5 && kiln_context_n_ctx(c) == 16 &&
          memcmp(kiln_context_seq_tokens(c, 0), ids, sizeof ids) == 0);
    CHECK(kiln_context_kv_bytes(c) > 0 && kiln_context_device_bytes(c) == 0);
    CHECK(kiln_context_seq_keep(c, 0, 2) == 2 && kiln_session_pos(s) == 2);
    kiln_session_free(s);
    kiln_model_free(m);
}

int main(void) {
    RUN(test_interleaved_default);
    RUN(test_interleaved_window);
    RUN(test_sampled_wide_window);
    RUN(test_validation);
    RUN(test_keep_copy_default);
    RUN(test_keep_copy_window);
    RUN(test_save_restore_default);
    RUN(test_save_restore_window);
    RUN(test_session_context);
    if (tmpdir[0]) rmdir(tmpdir);
    TEST_EXIT();
}
