/* test_cuda_sample.c: the GPU sampler (src/cuda/sample.cu) against the CPU sampler (src/infer/sampler.c) on the same
 * logits, history and coins. Two samplers with one seed: one gives the step's args (kiln_sampler_step_args draws
 * the coin), the other samples on the host (kiln_sampler_sample draws the same coin). Vocabularies of 1,000, 32,000
 * and 151,936 (Qwen2.5's: its top-p candidates of flat logits overflow the shared-memory sort into the workspace),
 * peaked and flat logits, and the settings: the defaults, plain multinomial, top-p alone, top-k with min-p and all
 * three penalties, greedy with penalties, top_p 0, top_k 1. Greedy draws must all agree. The others may differ where
 * the coin falls within float rounding of a cdf boundary: the host sums the cdf in one float running sum (over a
 * flat 32,000-token row its error reaches ~1e-5, a third of one token's probability), the GPU in a tree. So every
 * GPU token is checked against the exact distribution instead: kiln_sampler_probs' probabilities summed in double in
 * the draw's order (index order, or probability descending for top-p) must put the coin within 1e-3 of the token's
 * interval, and the token's probability must be > 0; and at least 90% of all draws must equal the host's. (The
 * margin: where the host's float running sum crosses top-p one candidate earlier or later than the exact sum, the
 * two nuclei differ by that candidate and the coin scales by a mass that differs by its probability, up to ~1e-3 at
 * V 1,000; measured on an H100, the coin was at most 1.7e-4 outside.) The
 * logits are left untouched, and a second run gives the same tokens (determinism).
 * Skips without CUDA or without a GPU. */
#include "cuda/cuda.h"
#include "cuda/kernels.h"
#include "model/sample_args.h"
#include "test.h"

#include <stdint.h>

/* A sampler whose penalty window holds more distinct tokens than a step carries is refused, untouched (the caller
 * samples on the host): its next coin is still the one a fresh sampler of the same seed draws. */
static void test_sample_window_refused(void) {
    kiln_sampler_params p = kiln_sampler_default();
    p.repeat_penalty = 1.1f, p.repeat_last_n = -1;
    kiln_sampler *a = NULL, *b = NULL;
    CHECK(kiln_sampler_new(&p, 4096, &a) == KILN_OK && kiln_sampler_new(&p, 4096, &b) == KILN_OK);
    int32_t hist[KILN_SAMPLE_MAX_PEN + 1];
    for (int i = 0; i <= KILN_SAMPLE_MAX_PEN; i++) hist[i] = i;
    kiln_sample_args x, y;
    const bool refused = !kiln_sampler_step_args(a, hist, KILN_SAMPLE_MAX_PEN + 1, &x);
    const bool fits = kiln_sampler_step_args(a, hist, KILN_SAMPLE_MAX_PEN, &x);
    const bool fresh = kiln_sampler_step_args(b, hist, KILN_SAMPLE_MAX_PEN, &y);
    kiln_sampler_free(a), kiln_sampler_free(b);
    CHECK(refused, "a window of %d distinct tokens was taken", KILN_SAMPLE_MAX_PEN + 1);
    CHECK(fits && fresh && x.n_pen == KILN_SAMPLE_MAX_PEN && x.coin == y.coin, "n_pen %d, coins %g %g", x.n_pen, x.coin, y.coin);
}

#ifdef KILN_CUDA

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s >> 12, *s ^= *s << 25, *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1DULL;
}
static float rng_f32(uint64_t *s) { return (float)(rng_next(s) >> 40) / 16777216.0f; } /* [0, 1) */

/* How far coin lies outside token t's interval of the cdf of probs (V, summing to ~1) taken in double, in index
 * order or (sorted) by probability descending then index, as sample_mult and sample_topp walk it. */
static int cmp_desc(const void *a, const void *b, void *p) {
    const float *pr = p;
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (pr[x] != pr[y]) return pr[x] > pr[y] ? -1 : 1;
    return (x > y) - (x < y);
}

static double coin_miss(const float *probs, int64_t V, bool sorted, int32_t t, float coin, int32_t *order) {
    int64_t n = 0;
    for (int64_t i = 0; i < V; i++)
        if (probs[i] > 0) order[n++] = (int32_t)i;
    if (sorted) qsort_r(order, (size_t)n, sizeof *order, cmp_desc, (void *)probs);
    double total = 0, before = -1, at = 0;
    for (int64_t i = 0; i < n; i++) {
        if (order[i] == t) before = total, at = probs[t];
        total += probs[order[i]];
    }
    if (before < 0 || total <= 0) return 1.0; /* probability 0 */
    const double lo = before / total, hi = (before + at) / total;
    return coin < lo ? lo - coin : coin > hi ? coin - hi : 0.0;
}

typedef struct {
    const char *name;
    kiln_sampler_params p;
    bool greedy;
} setting;

static void test_sample_matches_cpu(void) {
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    static const int64_t vocabs[] = {1000, 32000, 151936};
    kiln_sampler_params d = kiln_sampler_default();
    setting sets[7];
    int ns = 0;
    sets[ns++] = (setting){"defaults", d, false};
    sets[ns++] = (setting){"multinomial", {.temp = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .repeat_penalty = 1.0f, .repeat_last_n = 64, .seed = 7}, false};
    sets[ns++] = (setting){"top-p", {.temp = 0.7f, .top_k = 0, .top_p = 0.9f, .min_p = 0.0f, .repeat_penalty = 1.0f, .repeat_last_n = 64, .seed = 9}, false};
    sets[ns++] = (setting){"top-k+min-p+penalties",
                           {.temp = 1.2f, .top_k = 200, .top_p = 0.8f, .min_p = 0.02f, .repeat_penalty = 1.3f, .repeat_last_n = 64,
                            .presence_penalty = 0.5f, .frequency_penalty = 0.2f, .seed = 11}, false};
    sets[ns++] = (setting){"greedy+penalties",
                           {.temp = 0.0f, .top_k = 40, .top_p = 0.95f, .repeat_penalty = 1.5f, .repeat_last_n = -1,
                            .presence_penalty = 1.0f, .frequency_penalty = 0.3f, .seed = 13}, true};
    sets[ns++] = (setting){"top_p 0", {.temp = 0.9f, .top_k = 0, .top_p = 0.0f, .repeat_penalty = 1.0f, .repeat_last_n = 64, .seed = 15}, true};
    sets[ns++] = (setting){"top_k 1", {.temp = 0.9f, .top_k = 1, .top_p = 0.95f, .repeat_penalty = 1.0f, .repeat_last_n = 64, .seed = 17}, true};

    const int64_t Vmax = 151936;
    const int STEPS = 24, HIST = 96;
    float *h = malloc(sizeof(float) * (size_t)Vmax), *host = malloc(sizeof(float) * (size_t)Vmax), *back = malloc(sizeof(float) * (size_t)Vmax);
    float *probs = malloc(sizeof(float) * (size_t)Vmax);
    int32_t *order = malloc(sizeof(int32_t) * (size_t)Vmax);
    int32_t hist[96];
    void *d_logits = NULL, *d_args = NULL, *d_out = NULL, *work = NULL;
    kiln_status st = kiln_cuda_alloc(&d_logits, sizeof(float) * (size_t)Vmax);
    if (!st) st = kiln_cuda_alloc(&d_args, sizeof(kiln_sample_args));
    if (!st) st = kiln_cuda_alloc(&d_out, 2 * sizeof(int32_t));
    if (!st) st = kiln_cuda_alloc(&work, kiln_cuda_sample_work_bytes(Vmax));
    CHECK(st == KILN_OK && h && host && back && probs && order, "%s", kiln_last_error());
    uint64_t rng = 0x5eed;
    int draws = 0, differ = 0, greedy_differ = 0, bad = 0, changed = 0, unstable = 0;
    double worst_miss = 0;
    char first[256] = "";
    for (size_t vi = 0; vi < sizeof vocabs / sizeof *vocabs; vi++) {
        const int64_t V = vocabs[vi];
        for (int si = 0; si < ns; si++)
            for (int flat = 0; flat < 2; flat++) {
                kiln_sampler *sg = NULL, *sc = NULL, *sp = NULL;
                CHECK(kiln_sampler_new(&sets[si].p, V, &sg) == KILN_OK && kiln_sampler_new(&sets[si].p, V, &sc) == KILN_OK &&
                      kiln_sampler_new(&sets[si].p, V, &sp) == KILN_OK);
                for (int step = 0; step < STEPS && !st; step++) {
                    const float scale = flat ? 0.3f : 4.0f;
                    for (int64_t i = 0; i < V; i++) h[i] = (rng_f32(&rng) * 2.0f - 1.0f) * scale;
                    for (int i = 0; i < HIST; i++) /* repeats: ids from a small range half the time */
                        hist[i] = (int32_t)(rng_next(&rng) % (uint64_t)(i % 2 ? V : (V < 50 ? V : 50)));
                    kiln_sample_args a;
                    CHECK(kiln_sampler_step_args(sg, hist, HIST, &a), "a window of %d tokens refused", HIST);
                    int32_t tok[2] = {-1, -1};
                    st = kiln_cuda_upload(d_logits, h, sizeof(float) * (size_t)V);
                    if (!st) st = kiln_cuda_upload(d_args, &a, sizeof a);
                    for (int rep = 0; rep < 2 && !st; rep++) {
                        st = kiln_cuda_sample((int32_t *)d_out + rep, d_logits, V, d_args, work, NULL);
                        if (!st) st = kiln_cuda_sync();
                    }
                    if (!st) st = kiln_cuda_download(tok, d_out, sizeof tok);
                    if (!st) st = kiln_cuda_download(back, d_logits, sizeof(float) * (size_t)V);
                    CHECK(st == KILN_OK, "%s", kiln_last_error());
                    changed += memcmp(back, h, sizeof(float) * (size_t)V) != 0;
                    unstable += tok[0] != tok[1];
                    memcpy(host, h, sizeof(float) * (size_t)V);
                    const int32_t want = kiln_sampler_sample(sc, host, hist, HIST);
                    memcpy(probs, h, sizeof(float) * (size_t)V);
                    kiln_sampler_probs(sp, probs, hist, HIST);
                    draws++;
                    if (tok[0] < 0 || tok[0] >= V) {
                        bad++;
                        continue;
                    }
                    if (tok[0] != want) {
                        if (sets[si].greedy) greedy_differ++;
                        else differ++;
                        const double miss = coin_miss(probs, V, sets[si].p.top_p < 1.0f, tok[0], a.coin, order);
                        if (miss > worst_miss) worst_miss = miss;
                        if (!(probs[tok[0]] > 0.0f) || miss > 1e-3) bad++;
                        if (!first[0])
                            snprintf(first, sizeof first, "V %lld %s %s step %d: gpu %d (p %g), cpu %d (p %g), coin %g", (long long)V,
                                     sets[si].name, flat ? "flat" : "peaked", step, tok[0], probs[tok[0]], want, probs[want], a.coin);
                    }
                }
                kiln_sampler_free(sg), kiln_sampler_free(sc), kiln_sampler_free(sp);
            }
    }
    kiln_cuda_free(d_logits), kiln_cuda_free(d_args), kiln_cuda_free(d_out), kiln_cuda_free(work);
    free(h), free(host), free(back), free(probs), free(order);
    printf("# %d draws: %d non-greedy and %d greedy differ from the CPU sampler, the coin at most %.2e outside the GPU "
           "token's exact interval%s%s\n", draws, differ, greedy_differ, worst_miss, first[0] ? "; first: " : "", first);
    CHECK(st == KILN_OK, "%s", kiln_last_error());
    CHECK(bad == 0, "%d tokens outside the vocab, of probability 0 or more than 1e-3 off the coin (%s)", bad, first);
    CHECK(greedy_differ == 0, "%d greedy draws differ (%s)", greedy_differ, first);
    CHECK(differ * 10 <= draws, "%d of %d draws differ (%s)", differ, draws, first);
    CHECK(changed == 0, "the kernel changed the logits in %d steps", changed);
    CHECK(unstable == 0, "%d steps gave two tokens on two runs", unstable);
}

#else

static void test_sample_matches_cpu(void) { SKIP("kiln built without CUDA"); }

#endif

int main(void) {
    RUN(test_sample_window_refused);
    RUN(test_sample_matches_cpu);
    TEST_EXIT();
}
