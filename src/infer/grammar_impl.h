/* grammar_impl.h: the compiled form of a GBNF grammar, shared by the parser (grammar_parse.c) and the matcher
 * (grammar.c, grammar_mask.c). A rule's alternatives are runs of elements in one flat array, each ending in an END. */
#ifndef KILN_GRAMMAR_IMPL_H
#define KILN_GRAMMAR_IMPL_H

#include "kiln.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

enum { GE_END, GE_CHAR, GE_RULE };

typedef struct {
    uint8_t type;
    uint8_t neg;  /* GE_CHAR: matches code points outside the ranges */
    int32_t a, n; /* GE_CHAR: ranges[a .. a + n); GE_RULE: a = the rule */
} gelem;

struct kiln_grammar {
    gelem *el;
    int32_t n_el, cap_el;
    uint32_t *rng; /* (lo, hi) pairs */
    int32_t n_rng, cap_rng;
    int32_t *alt;      /* alternatives' first elements, rule r's at alt[rule_alt[r] .. rule_alt[r + 1]) */
    int32_t n_alt, cap_alt;
    int32_t *rule_alt; /* (n_rule + 1) once compiled */
    int32_t n_rule, root;
    char **name;       /* (n_rule) a rule's name; generated rules are named after the one they came from */
    uint8_t *generated; /* (n_rule) made for a group or a repetition, not written in the grammar */
    int32_t cap_name;
};

/* Grows *p (of *cap elements of size bytes) to hold need; false on overflow or out of memory. */
static inline bool grow(void **p, int32_t *cap, int32_t need, size_t size) {
    if (need <= *cap) return true;
    int32_t c = *cap ? *cap : 16;
    while (c < need) {
        if (c > INT32_MAX / 2) return false;
        c *= 2;
    }
    void *q = realloc(*p, (size_t)c * size);
    if (!q) return false;
    *p = q, *cap = c;
    return true;
}

#endif
