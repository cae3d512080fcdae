/* test_sampler.c: the sampler's penalties (llama.cpp's repeat, frequency and presence rules) against values worked
 * out by hand below, on six logits that are binary fractions so every expected value is exact in float; and the
 * refusal of parameters that are not finite or out of range. (The seeded sampling itself is held to llama2.c's
 * output in tests/test_generate.c.) */
#include <math.h>

#include "kiln.h"
#include "model/sample_args.h"
#include "test.h"

#include <stdlib.h>

enum { V = 6 };
static const float base[V] = {2.0f, -1.0f, 0.5f, 3.0f, -2.0f, 0.0f};
static const int32_t history[] = {0, 1, 0, 3, 5, 0};

/* Greedy (temp 0), so the call leaves the penalized logits in place and returns their argmax. */
static int32_t penalize(kiln_sampler_params p, const int32_t *h, size_t n, float *out) {
    kiln_sampler *s;
    p.temp = 0;
    if (kiln_sampler_new(&p, V, &s) != KILN_OK) return -2;
    memcpy(out, base, sizeof base);
    int32_t id = kiln_sampler_sample(s, out, h, n);
    /* a second call on fresh logits must give the same: nothing is carried from one call to the next */
    float again[V];
    memcpy(again, base, sizeof base);
    if (kiln_sampler_sample(s, again, h, n) != id || memcmp(again, out, sizeof again) != 0) id = -3;
    kiln_sampler_free(s);
    return id;
}

static void test_sampler_penalties_last_n(void) {
    kiln_sampler_params p = kiln_sampler_default();
    p.repeat_penalty = 2.0f, p.frequency_penalty = 0.5f, p.presence_penalty = 0.25f, p.repeat_last_n = 4;
    float got[V];
    int32_t id = penalize(p, history, 6, got);
    /* the last 4 of the history are {0, 3, 5, 0}: token 0 twice, 3 and 5 once; 1, 2 and 4 are untouched.
     *   0:  2.0 / 2 = 1.0,  - (2 * 0.5 + 0.25) = -0.25
     *   3:  3.0 / 2 = 1.5,  - (1 * 0.5 + 0.25) =  0.75
     *   5:  0.0 * 2 = 0.0,  - (1 * 0.5 + 0.25) = -0.75   (zero is multiplied, as llama.cpp's logit <= 0) */
    const float want[V] = {-0.25f, -1.0f, 0.5f, 0.75f, -2.0f, -0.75f};
    CHECK(id == 3, "argmax %d", id);
    for (int i = 0; i < V; i++) CHECK(got[i] == want[i], "token %d: %.9g, want %.9g", i, got[i], want[i]);
}

static void test_sampler_penalties_whole_history(void) {
    kiln_sampler_params p = kiln_sampler_default();
    p.repeat_penalty = 2.0f, p.frequency_penalty = 0.5f, p.presence_penalty = 0.25f, p.repeat_last_n = -1;
    const int32_t h[] = {0, 1, 0, 3, 5, 0, -7, 99}; /* ids outside the vocab are not counted */
    float got[V];
    int32_t id = penalize(p, h, 8, got);
    /* all of it: 0 three times, 1, 3 and 5 once.
     *   0:  2.0 / 2 = 1.0,  - (3 * 0.5 + 0.25) = -0.75
     *   1: -1.0 * 2 = -2.0, - 0.75             = -2.75
     *   3:  1.5 - 0.75 = 0.75;  5: -0.75;  the top is now token 3 at 0.75 over token 2's 0.5 */
    const float want[V] = {-0.75f, -2.75f, 0.5f, 0.75f, -2.0f, -0.75f};
    CHECK(id == 3, "argmax %d", id);
    for (int i = 0; i < V; i++) CHECK(got[i] == want[i], "token %d: %.9g, want %.9g", i, got[i], want[i]);
    /* presence alone moves the top: 2.0 - 2.75 and 3.0 - 2.75 fall below 0.5, so token 2 wins */
    p.repeat_penalty = 1.0f, p.frequency_penalty = 0.0f, p.presence_penalty = 2.75f;
    CHECK((id = penalize(p, h, 8, got)) == 2 && got[0] == -0.75f && got[3] == 0.25f && got[1] == -3.75f, "argmax %d: %g %g %g", id,
          got[0], got[3], got[1]);
}

static void test_sampler_penalties_off(void) {
    kiln_sampler_params p = kiln_sampler_default();
    p.repeat_penalty = 2.0f, p.frequency_penalty = 0.5f, p.presence_penalty = 0.25f, p.repeat_last_n = 0;
    float got[V];
    CHECK(penalize(p, history, 6, got) == 3);
    CHECK(memcmp(got, base, sizeof base) == 0, "repeat_last_n 0 changed the logits");
    p = kiln_sampler_default(); /* the defaults penalize nothing */
    CHECK(penalize(p, history, 6, got) == 3 && memcmp(got, base, sizeof base) == 0);
}

static void test_sampler_refuses_bad_params(void) {
    const struct {
        const char *what;
        kiln_sampler_params p;
    } bad[] = {
        {"presence NaN", {.temp = 1, .top_p = 1, .repeat_penalty = 1, .presence_penalty = NAN}},
        {"frequency inf", {.temp = 1, .top_p = 1, .repeat_penalty = 1, .frequency_penalty = INFINITY}},
        {"repeat 0", {.temp = 1, .top_p = 1, .repeat_penalty = 0}},
        {"repeat inf", {.temp = 1, .top_p = 1, .repeat_penalty = INFINITY}},
        {"last_n -2", {.temp = 1, .top_p = 1, .repeat_penalty = 1, .repeat_last_n = -2}},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kiln_sampler *s = (kiln_sampler *)1;
        CHECK(kiln_sampler_new(&bad[i].p, V, &s) == KILN_ERR_INVALID && !s && strstr(kiln_last_error(), "sampler:"), "%s: %s",
              bad[i].what, kiln_last_error());
    }
}

/* Greedy picks the lowest index among equal maxima, wherever it falls in the 16-lane passes, and passes NaNs over. */
static void test_sampler_greedy_ties(void) {
    enum { N = 1000 };
    static float x[N];
    kiln_sampler_params p = kiln_sampler_default();
    p.temp = 0, p.repeat_penalty = 1;
    kiln_sampler *s;
    CHECK(kiln_sampler_new(&p, N, &s) == KILN_OK, "new: %s", kiln_last_error());
    if (!s) return;
    struct { int a, b, nan; int32_t want; } cases[] = {
        {37, 901, -1, 37}, /* a tie across lanes and blocks: the first */
        {998, 999, -1, 998}, /* both in the tail past the last whole block of 16 */
        {5, 21, 3, 5},     /* same lane, a NaN before them */
        {0, 16, -1, 0},    /* the first element */
        {-1, 999, 500, 999}, /* the last element alone */
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        for (int i = 0; i < N; i++) x[i] = (float)(i % 97) * 0.01f - 2.0f;
        if (cases[c].a >= 0) x[cases[c].a] = 7.0f;
        x[cases[c].b] = 7.0f;
        if (cases[c].nan >= 0) x[cases[c].nan] = NAN;
        int32_t id = kiln_sampler_sample(s, x, NULL, 0);
        CHECK(id == cases[c].want, "case %zu: %d, want %d", c, id, cases[c].want);
    }
    for (int i = 0; i < N; i++) x[i] = -INFINITY;
    CHECK(kiln_sampler_sample(s, x, NULL, 0) == 0, "all -inf: the first");
    x[0] = NAN, x[10] = 1.0f;
    CHECK(kiln_sampler_sample(s, x, NULL, 0) == 0, "x[0] NaN: 0, as the running scan gave");
    kiln_sampler_free(s);
}

/* A step as args (kiln_sampler_step_args: settings, window counts, the coin) drawn by kiln_sample_args_draw (the CPU
 * backend's sample step) is the token kiln_sampler_sample draws from the same logits and history with a twin sampler:
 * every setting of the pipeline, 200 steps each over a vocab of 3,000 with a history of 300 tokens from 120 ids, and
 * the logits are left as they were; every other step also bans ids (args.ban), as a caller masks them to -inf before
 * kiln_sampler_sample. A window of more than KILN_SAMPLE_MAX_PEN distinct ids does not fit, and leaves
 * the sampler's RNG where it was. */
static void test_sampler_args_draw(void) {
    enum { NV = 3000, NH = 300, STEPS = 200 };
    static const kiln_sampler_params ps[] = {
        {.temp = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f, .repeat_penalty = 1.1f, .repeat_last_n = 64, .seed = 42},
        {.temp = 1.0f, .top_k = 0, .top_p = 1.0f, .repeat_penalty = 1.0f, .presence_penalty = 0.4f, .frequency_penalty = 0.2f,
         .repeat_last_n = -1, .seed = 7},
        {.temp = 1.3f, .top_k = 0, .top_p = 0.9f, .repeat_penalty = 1.0f, .repeat_last_n = 64, .seed = 9},
        {.temp = 0.0f, .top_k = 40, .top_p = 0.95f, .repeat_penalty = 1.5f, .repeat_last_n = 32, .seed = 1},
        {.temp = 0.6f, .top_k = 3, .top_p = 0.0f, .min_p = 0.2f, .repeat_penalty = 1.2f, .repeat_last_n = 8, .seed = 3},
    };
    static float logits[NV], a_row[NV], h_row[NV];
    int32_t hist[NH];
    unsigned long long r = 0x5a4d504cULL;
    void *work = malloc(kiln_sample_args_work_bytes(NV));
    CHECK(work != NULL);
    for (size_t c = 0; work && c < sizeof ps / sizeof *ps; c++) {
        kiln_sampler *a = NULL, *h = NULL;
        CHECK(kiln_sampler_new(&ps[c], NV, &a) == KILN_OK && kiln_sampler_new(&ps[c], NV, &h) == KILN_OK, "%s", kiln_last_error());
        int same = 0, kept = 0;
        for (int k = 0; a && h && k < STEPS; k++) {
            for (int i = 0; i < NV; i++) logits[i] = 4.0f * test_rng_f32(&r);
            for (int i = 0; i < NH; i++) hist[i] = (int32_t)(test_rng_next(&r) % 120);
            memcpy(a_row, logits, sizeof a_row), memcpy(h_row, logits, sizeof h_row);
            kiln_sample_args args;
            const size_t w = kiln_sampler_window(a, NH);
            CHECK(kiln_sampler_step_args(a, hist + (NH - w), w, &args), "case %zu: the window fits", c);
            if (k % 2) { /* every other step bans the top logit and a penalized id, as ignore_eos masks the ends */
                int32_t top = 0;
                for (int i = 1; i < NV; i++) top = logits[i] > logits[top] ? i : top;
                args.n_ban = 3, args.ban[0] = top, args.ban[1] = hist[NH - 1], args.ban[2] = NV + 5; /* the last: passed over */
                h_row[top] = -INFINITY, h_row[hist[NH - 1]] = -INFINITY;
            }
            const int32_t got = kiln_sample_args_draw(&args, a_row, NV, work), want = kiln_sampler_sample(h, h_row, hist, NH);
            same += got == want;
            kept += memcmp(a_row, logits, sizeof a_row) == 0;
        }
        CHECK(same == STEPS, "case %zu: %d of %d draws agree with kiln_sampler_sample", c, same, STEPS);
        CHECK(kept == STEPS, "case %zu: the logits changed in %d draws", c, STEPS - kept);
        kiln_sampler_free(a), kiln_sampler_free(h);
    }
    /* 300 distinct ids in the window: too many for args, and the coin is not drawn */
    kiln_sampler *a = NULL, *h = NULL;
    CHECK(kiln_sampler_new(&ps[1], NV, &a) == KILN_OK && kiln_sampler_new(&ps[1], NV, &h) == KILN_OK);
    for (int i = 0; i < NH; i++) hist[i] = i;
    CHECK(!kiln_sampler_step_fits(a, hist, NH), "300 distinct ids fit");
    CHECK(kiln_sampler_step_fits(a, hist, KILN_SAMPLE_MAX_PEN), "%d distinct ids do not fit", KILN_SAMPLE_MAX_PEN);
    kiln_sample_args args;
    CHECK(!kiln_sampler_step_args(a, hist, NH, &args));
    CHECK(kiln_sampler_coin(a) == kiln_sampler_coin(h), "a refused window moved the RNG");
    kiln_sampler_free(a), kiln_sampler_free(h);
    free(work);
}

/* kiln_sampler_ban: banned ids are never drawn, greedy or sampled, and have probability 0; ids outside the vocab are
 * passed over; a step's args carry them (kiln_sample_args_draw agrees); more than 4 are refused, the bans kept. */
static void test_sampler_ban(void) {
    kiln_sampler_params p = kiln_sampler_default();
    p.temp = 0;
    kiln_sampler *s = NULL;
    CHECK(kiln_sampler_new(&p, V, &s) == KILN_OK);
    if (!s) return;
    float x[V];
    const int32_t ban[3] = {3, -1, 99};
    CHECK(kiln_sampler_ban(s, ban, 3) == KILN_OK, "%s", kiln_last_error());
    memcpy(x, base, sizeof x);
    CHECK(kiln_sampler_sample(s, x, NULL, 0) == 0, "greedy with 3 banned: the next best, 0");
    const int32_t five[5] = {0, 1, 2, 4, 5};
    CHECK(kiln_sampler_ban(s, five, 5) == KILN_ERR_INVALID, "5 bans were taken");
    memcpy(x, base, sizeof x);
    CHECK(kiln_sampler_sample(s, x, NULL, 0) == 0, "a refused ban changed the bans");
    kiln_sample_args args;
    CHECK(kiln_sampler_step_args(s, NULL, 0, &args) && args.n_ban == 1 && args.ban[0] == 3, "args: %d bans", args.n_ban);
    void *work = malloc(kiln_sample_args_work_bytes(V));
    CHECK(work && kiln_sample_args_draw(&args, base, V, work) == 0, "args draw");
    free(work);
    kiln_sampler_free(s);
    /* sampled at a high temperature, over many draws: never a banned id; the probabilities give them 0 */
    p = kiln_sampler_default();
    p.temp = 5.0f, p.top_k = 0, p.top_p = 1.0f, p.min_p = 0.0f;
    CHECK(kiln_sampler_new(&p, V, &s) == KILN_OK);
    if (!s) return;
    const int32_t two[2] = {3, 0};
    CHECK(kiln_sampler_ban(s, two, 2) == KILN_OK);
    int hits = 0, seen[V] = {0};
    for (int k = 0; k < 600; k++) {
        memcpy(x, base, sizeof x);
        const int32_t t = kiln_sampler_sample(s, x, NULL, 0);
        hits += t == 3 || t == 0;
        if (t >= 0 && t < V) seen[t] = 1;
    }
    CHECK(hits == 0, "%d draws of a banned id", hits);
    CHECK(seen[1] && seen[2] && seen[4] && seen[5], "the others drawn: %d %d %d %d", seen[1], seen[2], seen[4], seen[5]);
    memcpy(x, base, sizeof x);
    kiln_sampler_probs(s, x, NULL, 0);
    CHECK(x[3] == 0.0f && x[0] == 0.0f && x[1] > 0.0f, "probs %g %g %g", x[3], x[0], x[1]);
    CHECK(kiln_sampler_ban(s, NULL, 0) == KILN_OK);
    memcpy(x, base, sizeof x);
    kiln_sampler_probs(s, x, NULL, 0);
    CHECK(x[3] > 0.0f && x[0] > 0.0f, "cleared: probs %g %g", x[3], x[0]);
    kiln_sampler_free(s);
}

int main(void) {
    RUN(test_sampler_args_draw);
    RUN(test_sampler_ban);
    RUN(test_sampler_greedy_ties);
    RUN(test_sampler_penalties_last_n);
    RUN(test_sampler_penalties_whole_history);
    RUN(test_sampler_penalties_off);
    RUN(test_sampler_refuses_bad_params);
    TEST_EXIT();
}
