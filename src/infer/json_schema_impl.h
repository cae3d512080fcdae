/* json_schema_impl.h: the converter's state and the small helpers shared by json_schema.c (the walk over the
 * schema and kiln_json_schema_to_gbnf) and json_schema_scalar.c (strings, patterns, integers). Not a public header:
 * kiln.h is the API. */
#ifndef KILN_INFER_JSON_SCHEMA_IMPL_H
#define KILN_INFER_JSON_SCHEMA_IMPL_H

#include "kiln.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- growing strings */

typedef struct {
    char *s;
    size_t n, cap;
    bool oom;
} sb;

static inline void sb_put(sb *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t c = b->cap ? b->cap : 256;
        while (c < b->n + n + 1) c *= 2;
        char *p = realloc(b->s, c);
        if (!p) {
            b->oom = true;
            return;
        }
        b->s = p, b->cap = c;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n, b->s[b->n] = 0;
}
static inline void sb_str(sb *b, const char *s) { sb_put(b, s, strlen(s)); }
static inline void sb_fmt(sb *b, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    sb_put(b, tmp, n < 0 ? 0 : (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* ---------------------------------------------------------------- the converter */

typedef struct {
    char *ref, *name;
} memo;

typedef struct {
    json_t *root;
    sb rules;
    int counter;
    memo *refs;
    int n_refs, cap_refs;
    int depth;
} conv;

/* A fresh rule name of a kind ("obj12"). */
static inline void new_name(conv *c, const char *kind, char name[32]) {
    snprintf(name, 32, "%s%d", kind, ++c->counter);
}

static inline void add_rule(conv *c, const char *name, const sb *body) {
    sb_fmt(&c->rules, "%s ::= ", name);
    sb_put(&c->rules, body->s ? body->s : "", body->n);
    sb_str(&c->rules, "\n");
}
static inline const char *at(const char *ptr) { return *ptr ? ptr : "/"; } /* the root's pointer, "", reads as "/" */

/* In json_schema_scalar.c, for json_schema.c's walk. They call nothing of the walk back, so the two files' calls
 * go one way (tools/check_deps.py refuses a circle). */
void js_put_literal(sb *b, const char *s, size_t n);
kiln_status js_get_count(json_t *s, const char *key, const char *ptr, int64_t *v);
kiln_status js_gen_string(conv *c, json_t *s, const char *ptr, sb *out);
kiln_status js_gen_int(json_t *s, const char *ptr, sb *out);

#endif
