/* sampler.c: picking the next token from logits. The pipeline is the penalties (llama.cpp's rules: repeat,
 * frequency and presence over the last repeat_last_n tokens), then
 * greedy at temp 0, else logits / temp -> top-k -> softmax -> min-p -> top-p, with llama2.c's RNG (xorshift64*)
 * and llama2.c's sample_topp / sample_mult. With top_k 0 and min_p 0 the steps after the penalty are exactly
 * llama2.c's sample(), so a seeded run reproduces its output byte for byte (tests/test_generate.c). */
#include "kiln.h"
#include "model/sample_args.h"
#include "status.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct kiln_sampler {
    kiln_sampler_params p;
    int64_t n_vocab;      /* V */
    uint64_t rng;         /* xorshift64* state */
    struct prob_index {
        float prob;
        int32_t index;
    } *cand;              /* (V) top-k heap, then top-p candidates */
    uint32_t *seen;       /* (V) stamp per token: kept by top-k */
    uint32_t stamp;
    int32_t *count;       /* (V) occurrences in the penalty window; all zero between calls */
    int32_t ban[KILN_SAMPLE_MAX_BAN]; /* ids never drawn (kiln_sampler_ban), each in the vocab */
    int n_ban;
};

kiln_sampler_params kiln_sampler_default(void) {
    return (kiln_sampler_params){.temp = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f, .repeat_penalty = 1.0f,
                                 .repeat_last_n = 64, .presence_penalty = 0.0f, .frequency_penalty = 0.0f, .seed = 42};
}

kiln_status kiln_sampler_new(const kiln_sampler_params *p, int64_t n_vocab, kiln_sampler **out) {
    *out = NULL;
    if (n_vocab < 1 || n_vocab > INT32_MAX) return kiln_fail(KILN_ERR_INVALID, "sampler: a vocab of %lld tokens", (long long)n_vocab);
    if (!(p->temp >= 0) || p->top_k < 0 || !(p->top_p >= 0 && p->top_p <= 1) || !(p->min_p >= 0 && p->min_p <= 1) ||
        !(p->repeat_penalty > 0 && isfinite(p->repeat_penalty)) || p->repeat_last_n < -1 || !isfinite(p->presence_penalty) ||
        !isfinite(p->frequency_penalty))
        return kiln_fail(KILN_ERR_INVALID,
                         "sampler: temp %g must be >= 0, top_k %d >= 0, top_p %g and min_p %g in [0, 1], repeat_penalty %g finite "
                         "and > 0, repeat_last_n %d >= -1, presence_penalty %g and frequency_penalty %g finite", (double)p->temp,
                         p->top_k, (double)p->top_p, (double)p->min_p, (double)p->repeat_penalty, p->repeat_last_n,
                         (double)p->presence_penalty, (double)p->frequency_penalty);
    kiln_sampler *s = calloc(1, sizeof *s);
    if (!s) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    s->p = *p;
    s->n_vocab = n_vocab;
    s->rng = p->seed;
    s->cand = malloc((size_t)n_vocab * sizeof *s->cand);
    s->seen = calloc((size_t)n_vocab, sizeof *s->seen);
    s->count = calloc((size_t)n_vocab, sizeof *s->count);
    if (!s->cand || !s->seen || !s->count) {
        kiln_sampler_free(s);
        return kiln_fail(KILN_ERR_NOMEM, "sampler: out of memory for a vocab of %lld tokens", (long long)n_vocab);
    }
    *out = s;
    return KILN_OK;
}

void kiln_sampler_free(kiln_sampler *s) {
    if (!s) return;
    free(s->cand);
    free(s->seen);
    free(s->count);
    free(s);
}

kiln_status kiln_sampler_ban(kiln_sampler *s, const int32_t *ids, int n) {
    if (n < 0 || n > KILN_SAMPLE_MAX_BAN || (n && !ids))
        return kiln_fail(KILN_ERR_INVALID, "sampler: %d banned ids (at most %d)", n, KILN_SAMPLE_MAX_BAN);
    s->n_ban = 0;
    for (int i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < s->n_vocab) s->ban[s->n_ban++] = ids[i];
    return KILN_OK;
}

static void apply_bans(const kiln_sampler *s, float *logits) {
    for (int i = 0; i < s->n_ban; i++) logits[s->ban[i]] = -INFINITY;
}

/* llama2.c's random_u32 / random_f32: xorshift64*, the top 32 bits; a coin is 24 of them in [0, 1). */
static uint32_t random_u32(uint64_t *state) {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    return (uint32_t)((*state * 0x2545F4914F6CDD1DULL) >> 32);
}

static float random_f32(uint64_t *state) { return (float)(random_u32(state) >> 8) / 16777216.0f; }

/* A fresh stamp, so `seen` needs no clearing per call; on wrap-around it is cleared once. */
static uint32_t next_stamp(kiln_sampler *s) {
    if (++s->stamp == 0) {
        memset(s->seen, 0, (size_t)s->n_vocab * sizeof *s->seen);
        s->stamp = 1;
    }
    return s->stamp;
}

/* One penalized token that occurs c times in the window: llama.cpp's float order (below). */
static float penalized(float x, int32_t c, float repeat, float frequency, float presence) {
    x = x <= 0 ? x * repeat : x / repeat;
    return x - ((float)c * frequency + (float)(c > 0) * presence);
}

/* llama.cpp's penalties (llama_sampler_penalties_apply): each distinct token among the last repeat_last_n (-1: the
 * whole history) that occurs count times there is penalized once: a positive logit divided by repeat_penalty, zero
 * or negative multiplied by it, then count * frequency_penalty + presence_penalty subtracted, in that float order.
 * Ids outside the vocab are not counted. */
static void apply_penalties(kiln_sampler *s, float *logits, const int32_t *history, size_t n_history) {
    const kiln_sampler_params *p = &s->p;
    size_t n = p->repeat_last_n < 0 || (size_t)p->repeat_last_n > n_history ? n_history : (size_t)p->repeat_last_n;
    const int32_t *h = history + (n_history - n);
    for (size_t i = 0; i < n; i++)
        if (h[i] >= 0 && h[i] < s->n_vocab) s->count[h[i]]++;
    for (size_t i = 0; i < n; i++) {
        int32_t id = h[i];
        if (id < 0 || id >= s->n_vocab || s->count[id] == 0) continue;
        const int32_t c = s->count[id];
        s->count[id] = 0; /* each token once, and the array zero again for the next call */
        logits[id] = penalized(logits[id], c, p->repeat_penalty, p->frequency_penalty, p->presence_penalty);
    }
}

/* The lowest index among equal maxima, NaNs passed over (x[0] NaN: 0). Two passes: the maximum over 16 lanes,
 * which the compiler turns into vector max instructions, then its first index; a running index is a dependency
 * through every element, 2.7x slower at 32K entries (the greedy step of each of a server's rows). */
static int32_t argmax(const float *x, int64_t n) {
    enum { LANES = 16 };
    if (n <= 0 || x[0] != x[0]) return 0;
    float m[LANES], mx = x[0];
    for (int k = 0; k < LANES; k++) m[k] = x[0];
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int k = 0; k < LANES; k++) m[k] = x[i + k] > m[k] ? x[i + k] : m[k];
    for (int k = 0; k < LANES; k++) mx = m[k] > mx ? m[k] : mx;
    for (; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    for (int64_t j = 0; j < n; j++)
        if (x[j] == mx) return (int32_t)j;
    return 0;
}

/* a ranks below b: lower value, or equal value and higher index */
static bool ranks_below(struct prob_index a, struct prob_index b) { return a.prob < b.prob || (a.prob == b.prob && a.index > b.index); }

static void sift_down(struct prob_index *h, int64_t n, int64_t i) {
    for (;;) {
        int64_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && ranks_below(h[l], h[m])) m = l;
        if (r < n && ranks_below(h[r], h[m])) m = r;
        if (m == i) return;
        struct prob_index t = h[i];
        h[i] = h[m], h[m] = t;
        i = m;
    }
}

/* Keeps the k largest logits (the lower index wins a tie at the boundary) and sets the rest to -inf, which
 * softmax turns into probability 0. A min-heap of k entries: O(V log k). */
static void top_k_filter(kiln_sampler *s, float *logits, int64_t k) {
    struct prob_index *h = s->cand;
    for (int64_t i = 0; i < k; i++) h[i] = (struct prob_index){logits[i], (int32_t)i};
    for (int64_t i = k / 2 - 1; i >= 0; i--) sift_down(h, k, i);
    for (int64_t i = k; i < s->n_vocab; i++) {
        struct prob_index e = {logits[i], (int32_t)i};
        if (ranks_below(h[0], e)) {
            h[0] = e;
            sift_down(h, k, 0);
        }
    }
    uint32_t stamp = next_stamp(s);
    for (int64_t i = 0; i < k; i++) s->seen[h[i].index] = stamp;
    for (int64_t i = 0; i < s->n_vocab; i++)
        if (s->seen[i] != stamp) logits[i] = -INFINITY;
}

/* llama2.c's softmax, operation for operation (float sums in index order), so the probabilities match. */
static void softmax(float *x, int64_t n) {
    float max_val = x[0];
    for (int64_t i = 1; i < n; i++)
        if (x[i] > max_val) max_val = x[i];
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - max_val);
        sum += x[i];
    }
    for (int64_t i = 0; i < n; i++) x[i] /= sum;
}

/* min-p (llama.cpp): drop tokens less likely than min_p times the most likely one, then renormalize so the
 * top-p threshold that follows still reads as a fraction of the whole. */
static void min_p_filter(float *probs, int64_t n, float min_p) {
    float pmax = probs[argmax(probs, n)], cut = min_p * pmax, sum = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        if (probs[i] < cut) probs[i] = 0.0f;
        sum += probs[i];
    }
    for (int64_t i = 0; i < n; i++) probs[i] /= sum;
}

/* llama2.c's sample_mult: the first index whose running cdf exceeds the coin. */
static int32_t sample_mult(const float *probs, int64_t n, float coin) {
    float cdf = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        cdf += probs[i];
        if (coin < cdf) return (int32_t)i;
    }
    return (int32_t)(n - 1); /* rounding */
}

static int cmp_prob_desc(const void *a, const void *b) {
    const struct prob_index *x = a, *y = b;
    if (x->prob != y->prob) return x->prob > y->prob ? -1 : 1;
    return (x->index > y->index) - (x->index < y->index); /* what a stable sort of index-ordered input gives */
}

/* llama2.c's sample_topp. Tokens below (1 - p) / (n - 1) cannot be in the nucleus (even if all of them were
 * kept their mass could not reach 1 - p), so they are dropped before the sort, which is what makes it fast on
 * large vocabularies. Then: sort descending, cut where the cumulative probability first exceeds p, and sample
 * coin * (kept mass) from the kept ones. */
static int32_t sample_topp(kiln_sampler *s, const float *probs, int64_t n, float topp, float coin) {
    struct prob_index *c = s->cand;
    int64_t n0 = 0;
    const float cutoff = (1.0f - topp) / (float)(n - 1);
    for (int64_t i = 0; i < n; i++)
        if (probs[i] >= cutoff) c[n0++] = (struct prob_index){probs[i], (int32_t)i};
    if (n0 == 0) return argmax(probs, n); /* p < 1/n can cut every token; the nucleus then is the top one */
    qsort(c, (size_t)n0, sizeof *c, cmp_prob_desc);
    float cumulative_prob = 0.0f;
    int64_t last_idx = n0 - 1;
    for (int64_t i = 0; i < n0; i++) {
        cumulative_prob += c[i].prob;
        if (cumulative_prob > topp) {
            last_idx = i;
            break;
        }
    }
    float r = coin * cumulative_prob, cdf = 0.0f;
    for (int64_t i = 0; i <= last_idx; i++) {
        cdf += c[i].prob;
        if (r < cdf) return c[i].index;
    }
    return c[last_idx].index; /* rounding */
}

/* The distribution kiln_sampler_sample draws from, into logits (V probabilities summing to 1): the same pipeline,
 * with the top-p nucleus (llama2.c's cut) renormalized in place of the draw. temp 0 is the argmax's one-hot. */
void kiln_sampler_probs(kiln_sampler *s, float *logits, const int32_t *history, size_t n_history) {
    const kiln_sampler_params *p = &s->p;
    const int64_t V = s->n_vocab;
    apply_bans(s, logits);
    const bool penalize = p->repeat_penalty != 1.0f || p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f;
    if (penalize && p->repeat_last_n != 0 && n_history > 0) apply_penalties(s, logits, history, n_history);
    if (p->temp == 0.0f || p->top_p <= 0.0f) { /* greedy, or a nucleus of the top token alone: the argmax's one-hot */
        const int32_t top = argmax(logits, V);
        for (int64_t i = 0; i < V; i++) logits[i] = i == top ? 1.0f : 0.0f;
        return;
    }
    for (int64_t i = 0; i < V; i++) logits[i] /= p->temp;
    if (p->top_k > 0 && p->top_k < V) top_k_filter(s, logits, p->top_k);
    softmax(logits, V);
    if (p->min_p > 0.0f) min_p_filter(logits, V, p->min_p);
    if (p->top_p >= 1.0f || V == 1) return;
    /* the nucleus: sample_topp's candidates and cut, then the kept mass renormalized, the rest 0 */
    struct prob_index *c = s->cand;
    int64_t n0 = 0;
    const float cutoff = (1.0f - p->top_p) / (float)(V - 1);
    for (int64_t i = 0; i < V; i++)
        if (logits[i] >= cutoff) c[n0++] = (struct prob_index){logits[i], (int32_t)i};
    if (n0 == 0) {
        const int32_t top = argmax(logits, V);
        for (int64_t i = 0; i < V; i++) logits[i] = i == top ? 1.0f : 0.0f;
        return;
    }
    qsort(c, (size_t)n0, sizeof *c, cmp_prob_desc);
    float cum = 0.0f;
    int64_t last = n0 - 1;
    for (int64_t i = 0; i < n0; i++) {
        cum += c[i].prob;
        if (cum > p->top_p) {
            last = i;
            break;
        }
    }
    for (int64_t i = 0; i < V; i++) logits[i] = 0.0f;
    for (int64_t i = 0; i <= last; i++) logits[c[i].index] = c[i].prob / cum;
}

float kiln_sampler_coin(kiln_sampler *s) { return random_f32(&s->rng); }

int32_t kiln_sampler_draw(kiln_sampler *s, const float *probs) {
    double total = 0;
    for (int64_t i = 0; i < s->n_vocab; i++) total += probs[i];
    const double r = random_f32(&s->rng) * total;
    double cdf = 0;
    int32_t last = 0;
    for (int64_t i = 0; i < s->n_vocab; i++) {
        if (probs[i] <= 0) continue;
        cdf += probs[i], last = (int32_t)i;
        if (r < cdf) return (int32_t)i;
    }
    return last; /* rounding */
}

/* The pipeline after the penalties: greedy at temp 0, else temp -> top-k -> softmax -> min-p -> the draw under coin
 * (NULL: the next of s's RNG, drawn where kiln_sampler_sample has always drawn it). */
static int32_t sample_penalized(kiln_sampler *s, float *logits, const float *coin_in) {
    const kiln_sampler_params *p = &s->p;
    const int64_t V = s->n_vocab;
    if (p->temp == 0.0f) return argmax(logits, V);
    for (int64_t i = 0; i < V; i++) logits[i] /= p->temp;
    if (p->top_k > 0 && p->top_k < V) top_k_filter(s, logits, p->top_k);
    softmax(logits, V);
    if (p->min_p > 0.0f) min_p_filter(logits, V, p->min_p);
    const float coin = coin_in ? *coin_in : random_f32(&s->rng);
    if (p->top_p >= 1.0f || V == 1) return sample_mult(logits, V, coin);
    /* top_p 0: the nucleus is the top token alone (llama.cpp keeps min_keep = 1); the coin is still drawn, so the
     * sequence of coins does not depend on top_p */
    if (p->top_p <= 0.0f) return argmax(logits, V);
    return sample_topp(s, logits, V, p->top_p, coin);
}

int32_t kiln_sampler_sample(kiln_sampler *s, float *logits, const int32_t *history, size_t n_history) {
    const kiln_sampler_params *p = &s->p;
    apply_bans(s, logits);
    const bool penalize = p->repeat_penalty != 1.0f || p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f;
    if (penalize && p->repeat_last_n != 0 && n_history > 0) apply_penalties(s, logits, history, n_history);
    return sample_penalized(s, logits, NULL);
}

/* work: the logits' copy (V floats), then the candidates (V), then top-k's stamps (V), each 64-byte aligned. */
static size_t work_part(size_t bytes) { return (bytes + 63) & ~(size_t)63; }

size_t kiln_sample_args_work_bytes(int64_t V) {
    if (V < 1) return 0;
    return work_part((size_t)V * sizeof(float)) + work_part((size_t)V * sizeof(struct prob_index)) +
           work_part((size_t)V * sizeof(uint32_t));
}

int32_t kiln_sample_args_draw(const kiln_sample_args *a, const float *logits, int64_t V, void *work) {
    float *x = work;
    kiln_sampler s = {.p = {.temp = a->temp, .top_k = a->top_k, .top_p = a->top_p, .min_p = a->min_p,
                            .repeat_penalty = a->repeat_penalty, .presence_penalty = a->presence_penalty,
                            .frequency_penalty = a->frequency_penalty},
                      .n_vocab = V};
    s.cand = (struct prob_index *)((char *)work + work_part((size_t)V * sizeof(float)));
    s.seen = (uint32_t *)((char *)s.cand + work_part((size_t)V * sizeof(struct prob_index)));
    memcpy(x, logits, (size_t)V * sizeof *x);
    /* apply_penalties over the window's distinct tokens and counts, in the same float order */
    for (int32_t i = 0; i < a->n_pen && i < KILN_SAMPLE_MAX_PEN; i++) {
        const int32_t id = a->pen_id[i], c = a->pen_count[i];
        if (id < 0 || id >= V || c < 1) continue;
        x[id] = penalized(x[id], c, a->repeat_penalty, a->frequency_penalty, a->presence_penalty);
    }
    for (int32_t i = 0; i < a->n_ban && i < KILN_SAMPLE_MAX_BAN; i++)
        if (a->ban[i] >= 0 && a->ban[i] < V) x[a->ban[i]] = -INFINITY;
    if (s.p.top_k > 0 && s.p.top_k < V) memset(s.seen, 0, (size_t)V * sizeof *s.seen); /* stamps start again at 1 */
    return sample_penalized(&s, x, &a->coin);
}

bool kiln_sampler_step_fits(kiln_sampler *s, const int32_t *history, size_t n_history) {
    const size_t n = kiln_sampler_window(s, n_history);
    const int32_t *h = history + (n_history - n);
    int32_t n_pen = 0;
    for (size_t i = 0; i < n; i++)
        if (h[i] >= 0 && h[i] < s->n_vocab && s->count[h[i]]++ == 0) n_pen++;
    for (size_t i = 0; i < n; i++)
        if (h[i] >= 0 && h[i] < s->n_vocab) s->count[h[i]] = 0;
    return n_pen <= KILN_SAMPLE_MAX_PEN;
}

size_t kiln_sampler_window(const kiln_sampler *s, size_t n_history) {
    const kiln_sampler_params *p = &s->p;
    const bool penalize = p->repeat_penalty != 1.0f || p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f;
    if (!penalize || p->repeat_last_n == 0) return 0;
    return p->repeat_last_n < 0 || (size_t)p->repeat_last_n > n_history ? n_history : (size_t)p->repeat_last_n;
}

bool kiln_sampler_step_args(kiln_sampler *s, const int32_t *history, size_t n_history, kiln_sample_args *args) {
    const kiln_sampler_params *p = &s->p;
    int32_t n_pen = 0;
    const size_t n = kiln_sampler_window(s, n_history); /* apply_penalties' window and counts */
    if (n > 0) {
        const int32_t *h = history + (n_history - n);
        for (size_t i = 0; i < n; i++)
            if (h[i] >= 0 && h[i] < s->n_vocab) s->count[h[i]]++;
        for (size_t i = 0; i < n; i++) {
            const int32_t id = h[i];
            if (id < 0 || id >= s->n_vocab || s->count[id] == 0) continue;
            if (n_pen < KILN_SAMPLE_MAX_PEN) args->pen_id[n_pen] = id, args->pen_count[n_pen] = s->count[id];
            n_pen++;
            s->count[id] = 0; /* each once, and zero again for the next call */
        }
        if (n_pen > KILN_SAMPLE_MAX_PEN) return false;
    }
    args->temp = p->temp, args->top_p = p->top_p, args->min_p = p->min_p, args->top_k = p->top_k;
    args->repeat_penalty = p->repeat_penalty, args->presence_penalty = p->presence_penalty;
    args->frequency_penalty = p->frequency_penalty;
    args->n_pen = n_pen;
    args->n_ban = s->n_ban; /* after the penalties there, as -inf stays -inf under them */
    for (int i = 0; i < s->n_ban; i++) args->ban[i] = s->ban[i];
    args->coin = p->temp == 0.0f ? 0.0f : random_f32(&s->rng);
    return true;
}
