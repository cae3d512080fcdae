/* grammar.c: the recognizer under the GBNF matcher (grammar_mask.c): sets of stacks over a grammar's elements
 * (parsed by grammar_parse.c), their expansion and advance by one code point, UTF-8 decoded across bytes, and
 * kiln_grammar_match_text, which runs them over a text.
 *
 * The matcher is a pushdown recognizer over code points. A stack is a list of element positions, the top being
 * the next element to match; its other entries are where to go on when a rule's alternative ends. The state is a
 * set of stacks whose tops are character sets, plus the empty stack when the grammar may end here. Expanding a
 * stack whose top is a rule reference replaces it by one stack per alternative; a continuation that is an END is
 * not pushed, so right recursion (the repetitions' rules) keeps stacks flat.
 *
 * Tested by tests/test_grammar.c (sentences; the matcher's masks are checked against kiln_grammar_match_text) and
 * fuzzed by tests/fuzz/fuzz_grammar.c. */
#include "grammar_match.h"
#include "status.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- stack sets */

#define SET_LINEAR 32          /* sets of up to this many stacks are searched in order */
#define MEMO_AFTER 256         /* expand's calls into one set before it remembers the stacks it expanded */
#define EXPAND_WORK (1 << 17)  /* expand's calls into one set, at most: past it the grammar is too ambiguous */
#define SET_POS_MAX (1 << 22)  /* positions one set holds, at most (16 MB) */

/* Why expand last failed on this thread (0: out of memory elsewhere); kiln_grammar_expand_failed reports it and
 * clears it. */
enum { GF_NOMEM = 1, GF_DEPTH, GF_WORK, GF_SIZE };
static _Thread_local int expand_why;

static bool set_failed(int why) {
    expand_why = why;
    return false;
}

kiln_status kiln_grammar_expand_failed(void) {
    const int why = expand_why;
    expand_why = 0;
    if (why == GF_DEPTH)
        return kiln_fail(KILN_ERR_INVALID, "grammar: a step goes past %d rules deep (nested, or matching nothing one after another)", MAX_DEPTH);
    if (why == GF_WORK)
        return kiln_fail(KILN_ERR_INVALID, "grammar: too ambiguous: one character's step expands rules more than %d times", EXPAND_WORK);
    if (why == GF_SIZE) return kiln_fail(KILN_ERR_INVALID, "grammar: too ambiguous: one character's step holds more than %d stack entries", SET_POS_MAX);
    return kiln_fail(KILN_ERR_NOMEM, "grammar: out of memory");
}

void kiln_grammar_gset_clear(gset *s) {
    s->n = 0, s->n_pos = 0, s->accept = false, s->n_ix = 0, s->work = 0;
    if (s->seen) kiln_grammar_gset_clear(s->seen);
}

void kiln_grammar_gset_free(gset *s) {
    if (s->seen) kiln_grammar_gset_free(s->seen), free(s->seen);
    free(s->pos), free(s->off), free(s->ix), memset(s, 0, sizeof *s);
}

static bool stack_is(const gset *s, int32_t i, const int32_t *st, int32_t n) {
    return s->off[i + 1] - s->off[i] == n && memcmp(s->pos + s->off[i], st, (size_t)n * sizeof *st) == 0;
}

/* Indexes the stacks [n_ix, n) of s, past SET_LINEAR of them; false on out of memory. */
static bool set_index(gset *s) {
    if (s->cap_ix < 2 * s->n) {
        int32_t c = 128;
        while (c < 4 * s->n) c *= 2; /* n <= EXPAND_WORK */
        int32_t *t = realloc(s->ix, (size_t)c * sizeof *t);
        if (!t) return false;
        s->ix = t, s->cap_ix = c, s->n_ix = 0;
    }
    if (s->n_ix == 0) memset(s->ix, 0xff, (size_t)s->cap_ix * sizeof *s->ix);
    for (; s->n_ix < s->n; s->n_ix++) {
        const int32_t i = s->n_ix;
        uint32_t h = (uint32_t)stack_hash(s->pos + s->off[i], s->off[i + 1] - s->off[i]);
        while (s->ix[h & (uint32_t)(s->cap_ix - 1)] >= 0) h++;
        s->ix[h & (uint32_t)(s->cap_ix - 1)] = i;
    }
    return true;
}

/* 1 when s holds the stack st[0..n), 0 when not, -1 on out of memory. */
static int set_has(gset *s, const int32_t *st, int32_t n) {
    if (s->n <= SET_LINEAR) {
        for (int32_t i = 0; i < s->n; i++)
            if (stack_is(s, i, st, n)) return 1;
        return 0;
    }
    if (!set_index(s)) return -1;
    for (uint32_t h = (uint32_t)stack_hash(st, n);; h++) {
        const int32_t i = s->ix[h & (uint32_t)(s->cap_ix - 1)];
        if (i < 0) return 0;
        if (stack_is(s, i, st, n)) return 1;
    }
}

/* Appends the stack st[0..n) to s; false (expand_why set) on out of memory or past SET_POS_MAX. */
static bool set_add(gset *s, const int32_t *st, int32_t n) {
    if (s->n_pos + n > SET_POS_MAX) return set_failed(GF_SIZE);
    if (!grow((void **)&s->pos, &s->cap_pos, s->n_pos + n, sizeof *s->pos) ||
        !grow((void **)&s->off, &s->cap_off, s->n + 2, sizeof *s->off))
        return set_failed(GF_NOMEM);
    if (s->n == 0) s->off[0] = 0;
    memcpy(s->pos + s->n_pos, st, (size_t)n * sizeof *st);
    s->n_pos += n;
    s->off[++s->n] = s->n_pos;
    return true;
}

static bool expand_rule(const kiln_grammar *g, gset *out, int32_t *st, int32_t n, int depth);

/* Adds the stack st[0..n) (top last), expanded until its top is a character set; false with expand_why set on out
 * of memory, past MAX_DEPTH, or past the step's budget (EXPAND_WORK, SET_POS_MAX).
 * st is scratch from n up to MAX_DEPTH; positions below n are the caller's stack and are as they were on return. */
bool kiln_grammar_expand(const kiln_grammar *g, gset *out, int32_t *st, int32_t n, int depth) {
    if (depth > MAX_DEPTH || n > MAX_DEPTH) return set_failed(GF_DEPTH);
    if (++out->work > EXPAND_WORK) return set_failed(GF_WORK);
    const int32_t n0 = n;
    while (n > 0 && g->el[st[n - 1]].type == GE_END) n--; /* an alternative done: its rule's continuation */
    if (n == 0) {
        out->accept = true;
        return true;
    }
    /* A stack's expansion depends on its positions alone, so one reached again adds nothing. Nullable rules in a
     * row reach the same stacks along many paths (x? x? x? ...: 2^k), so past MEMO_AFTER calls each is done once. */
    if (out->work > MEMO_AFTER && g->el[st[n - 1]].type == GE_RULE) {
        if (!out->seen && !(out->seen = calloc(1, sizeof *out->seen))) return set_failed(GF_NOMEM);
        const int h = set_has(out->seen, st, n);
        if (h) return h > 0 ? true : set_failed(GF_NOMEM);
        if (!set_add(out->seen, st, n)) return false;
    }
    if (n == n0 || g->el[st[n - 1]].type != GE_RULE) return expand_rule(g, out, st, n, depth);
    /* Ends were popped, so the rule at the top is the caller's stack (an empty alternative, say, with a rule after
     * it): expanding it overwrites st[n - 1 ..], which the caller's next alternatives still stand on. */
    int32_t keep_local[16], *keep = keep_local;
    const int32_t n_keep = n0 - n + 1;
    if (n_keep > 16 && !(keep = malloc((size_t)n_keep * sizeof *keep))) return set_failed(GF_NOMEM);
    memcpy(keep, st + n - 1, (size_t)n_keep * sizeof *keep);
    const bool ok = expand_rule(g, out, st, n, depth);
    memcpy(st + n - 1, keep, (size_t)n_keep * sizeof *keep);
    if (keep != keep_local) free(keep);
    return ok;
}

/* expand's work on a stack whose top is not an end: a character set is added, a rule expanded. */
static bool expand_rule(const kiln_grammar *g, gset *out, int32_t *st, int32_t n, int depth) {
    const gelem e = g->el[st[n - 1]];
    if (e.type == GE_CHAR) {
        const int h = set_has(out, st, n);
        if (h) return h > 0 ? true : set_failed(GF_NOMEM);
        return set_add(out, st, n);
    }
    /* a rule: its continuation (unless the alternative ends there), then each alternative's first element */
    const int32_t cont = st[n - 1] + 1;
    int32_t m = n - 1;
    if (g->el[cont].type != GE_END) st[m++] = cont;
    for (int32_t a = g->rule_alt[e.a]; a < g->rule_alt[e.a + 1]; a++) {
        st[m] = g->alt[a];
        if (!kiln_grammar_expand(g, out, st, m + 1, depth + 1)) return false;
    }
    return true;
}

/* out = the stacks of in that take cp, advanced and expanded. scratch holds MAX_DEPTH + 1 positions. */
bool kiln_grammar_advance(const kiln_grammar *g, const gset *in, uint32_t cp, gset *out, int32_t *scratch) {
    kiln_grammar_gset_clear(out);
    for (int32_t i = 0; i < in->n; i++) {
        const int32_t *st = in->pos + in->off[i], n = in->off[i + 1] - in->off[i];
        if (!char_in(g, &g->el[st[n - 1]], cp)) continue;
        memcpy(scratch, st, (size_t)n * sizeof *st);
        scratch[n - 1]++;
        if (!kiln_grammar_expand(g, out, scratch, n, 0)) return false;
    }
    return true;
}

/* ---------------------------------------------------------------- UTF-8 decoding across bytes */

/* Some stack of s could take a code point beginning with the incomplete st. */
bool kiln_grammar_partial_ok(const kiln_grammar *g, const gset *s, const u8state *st) {
    uint32_t lo, hi;
    if (!partial_range(st, &lo, &hi)) return false;
    for (int32_t i = 0; i < s->n; i++)
        if (range_meets(g, &g->el[s->pos[s->off[i + 1] - 1]], lo, hi)) return true;
    return false;
}

/* ---------------------------------------------------------------- a text */

/* Text against the grammar from its root: *full when all of it is a sentence, *prefix when it begins one. */
kiln_status kiln_grammar_match_text(const kiln_grammar *g, const char *s, size_t n, bool *full, bool *prefix) {
    *full = *prefix = false;
    gset a = {0}, b = {0};
    int32_t *scratch = malloc((MAX_DEPTH + 2) * sizeof *scratch);
    kiln_status st = scratch ? KILN_OK : kiln_fail(KILN_ERR_NOMEM, "grammar: out of memory");
    for (int32_t alt = g->rule_alt[g->root]; !st && alt < g->rule_alt[g->root + 1]; alt++) {
        scratch[0] = g->alt[alt];
        if (!kiln_grammar_expand(g, &a, scratch, 1, 0)) st = kiln_grammar_expand_failed();
    }
    u8state u = {0};
    bool alive = true;
    for (size_t i = 0; !st && alive && i < n; i++) {
        const int r = u8_feed(&u, (uint8_t)s[i]);
        if (r < 0) alive = false;
        if (r != 1) continue;
        if (!kiln_grammar_advance(g, &a, u.cp, &b, scratch)) st = kiln_grammar_expand_failed();
        gset t = a;
        a = b, b = t;
        alive = a.n > 0 || a.accept;
    }
    if (!st && alive) {
        *prefix = u.left == 0 ? true : kiln_grammar_partial_ok(g, &a, &u);
        *full = u.left == 0 && a.accept;
    }
    kiln_grammar_gset_free(&a), kiln_grammar_gset_free(&b), free(scratch);
    return st;
}
