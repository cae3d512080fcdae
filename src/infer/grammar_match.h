/* grammar_match.h: what the matcher (grammar_mask.c) uses of the recognizer (grammar.c: stack sets, their expansion
 * and their advance by a code point, UTF-8 across bytes) and of the vocab's trie (grammar_vocab.c). Not a public
 * header: kiln.h is the API; grammar_impl.h is the compiled grammar all of them read. */
#ifndef KILN_GRAMMAR_MATCH_H
#define KILN_GRAMMAR_MATCH_H

#include "grammar_impl.h"

#include <stdbool.h>
#include <stdint.h>

/* ---------------------------------------------------------------- stack sets */

typedef struct gset {
    int32_t *pos; /* stack i is pos[off[i] .. off[i + 1]), top last */
    int32_t *off;
    int32_t n, n_pos, cap_pos, cap_off;
    bool accept; /* holds the empty stack */
    /* past SET_LINEAR stacks, a hash index of stacks [0, n_ix): open addressing over cap_ix slots, -1 empty */
    int32_t *ix, cap_ix, n_ix;
    /* one expansion's bookkeeping (reset by kiln_grammar_gset_clear): expand's calls so far, and past MEMO_AFTER of
     * them the stacks topped by a rule that were expanded, so that one reached again is not expanded again */
    int32_t work;
    struct gset *seen;
} gset;

#define MAX_DEPTH 1024

/* Never 0, which marks an unused stack cache slot. */
static inline uint64_t stack_hash(const int32_t *st, int32_t n) {
    uint64_t h = 1469598103934665603ull ^ (uint64_t)n;
    for (int32_t i = 0; i < n; i++) h = (h ^ (uint32_t)st[i]) * 1099511628211ull;
    return h | 1;
}

static inline bool char_in(const kiln_grammar *g, const gelem *e, uint32_t cp) {
    bool in = false;
    for (int32_t i = 0; i < e->n && !in; i++) in = cp >= g->rng[2 * (e->a + i)] && cp <= g->rng[2 * (e->a + i) + 1];
    return in != (bool)e->neg;
}

/* Some code point in [lo, hi] is in e's set. */
static inline bool range_meets(const kiln_grammar *g, const gelem *e, uint32_t lo, uint32_t hi) {
    if (e->neg) { /* only when one range covers all of [lo, hi] is every such code point out */
        for (int32_t i = 0; i < e->n; i++)
            if (g->rng[2 * (e->a + i)] <= lo && g->rng[2 * (e->a + i) + 1] >= hi) return false;
        return true;
    }
    for (int32_t i = 0; i < e->n; i++)
        if (g->rng[2 * (e->a + i)] <= hi && g->rng[2 * (e->a + i) + 1] >= lo) return true;
    return false;
}

void kiln_grammar_gset_clear(gset *s);
void kiln_grammar_gset_free(gset *s);

/* Adds the stack st[0..n) (top last) to out, expanded until its top is a character set; false on out of memory,
 * past MAX_DEPTH or past the step's budget, which kiln_grammar_expand_failed then reports. st is scratch from n up
 * to MAX_DEPTH; positions below n are the caller's stack and are as they were on return. */
bool kiln_grammar_expand(const kiln_grammar *g, gset *out, int32_t *st, int32_t n, int depth);

/* The status of the last failed expansion on this thread (out of memory when it set no reason), which it clears. */
kiln_status kiln_grammar_expand_failed(void);

/* out = the stacks of in that take cp, advanced and expanded. scratch holds MAX_DEPTH + 1 positions. */
bool kiln_grammar_advance(const kiln_grammar *g, const gset *in, uint32_t cp, gset *out, int32_t *scratch);

/* ---------------------------------------------------------------- UTF-8 decoding across bytes */

typedef struct {
    uint32_t cp;  /* the bits so far */
    int8_t left;  /* continuation bytes still to come; -1 after an invalid byte */
    int8_t total; /* continuation bytes of this code point */
} u8state;

/* Feeds byte b: 1 when a code point completed (in st->cp), 0 when one is still incomplete, -1 when invalid. */
static inline int u8_feed(u8state *st, uint8_t b) {
    if (st->left == 0) {
        int n = b < 0x80 ? 0 : (b >> 5) == 6 ? 1 : (b >> 4) == 14 ? 2 : (b >> 3) == 30 ? 3 : -1;
        if (n < 0) return -1;
        st->cp = n == 0 ? b : (uint32_t)(b & (0x3F >> n));
        st->left = st->total = (int8_t)n;
        return n == 0 ? 1 : 0;
    }
    if ((b & 0xC0) != 0x80) return -1;
    st->cp = st->cp << 6 | (b & 0x3F);
    if (--st->left) return 0;
    static const uint32_t min_cp[4] = {0, 0x80, 0x800, 0x10000}; /* shorter forms are overlong, so invalid */
    return st->cp < min_cp[st->total] || st->cp > 0x10FFFF || (st->cp >= 0xD800 && st->cp <= 0xDFFF) ? -1 : 1;
}

/* The code points an incomplete st can still become: [lo, hi], false when none. */
static inline bool partial_range(const u8state *st, uint32_t *lo, uint32_t *hi) {
    static const uint32_t min_cp[4] = {0, 0x80, 0x800, 0x10000};
    *lo = st->cp << (6 * st->left), *hi = *lo | ((1u << (6 * st->left)) - 1);
    if (*lo < min_cp[st->total]) *lo = min_cp[st->total];
    if (*hi > 0x10FFFF) *hi = 0x10FFFF;
    if (*lo >= 0xD800 && *lo <= 0xDFFF) *lo = 0xE000; /* surrogates never complete (a prefix such as ED A0 is dead) */
    if (*hi >= 0xD800 && *hi <= 0xDFFF) *hi = 0xD7FF;
    return *lo <= *hi;
}

/* Some stack of s could take a code point beginning with the incomplete st. */
bool kiln_grammar_partial_ok(const kiln_grammar *g, const gset *s, const u8state *st);

/* ---------------------------------------------------------------- the vocab's trie */

typedef struct {
    int32_t first_edge, n_edge; /* edges[first_edge .. + n_edge) sorted by byte */
    int32_t first_tok, n_tok;   /* tokens whose bytes end here: toks[first_tok .. + n_tok) */
} tnode;

typedef struct {
    uint8_t byte;
    int32_t child;
} tedge;

struct kiln_grammar_vocab {
    int32_t V, eos;
    tnode *node;
    tedge *edge;
    int32_t *toks;
    int32_t n_node, max_len;
    uint8_t **bytes; /* (V) each token's bytes (NULL for control tokens and empty pieces) */
    int32_t *len;
};

#endif
