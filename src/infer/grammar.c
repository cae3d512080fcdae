/* grammar.c: GBNF grammars (llama.cpp's syntax) and the matcher that constrains sampling to them.
 *
 * Parsing compiles the text into rules of alternatives, each a run of elements in one flat array ending in an END:
 * a character set (ranges, maybe negated; "." is every code point), or a reference to a rule. Groups and the
 * repetitions become rules of their own: x* is R ::= x R | (empty), x+ is x x*, x? is R ::= x | (empty), x{m,n}
 * m copies of x then n - m nested optionals, x{m,} m copies then x*. Undefined and twice-defined rules, a missing
 * root and left recursion (a rule that can reach itself before consuming a character) are errors naming the line
 * and column, or the rule.
 *
 * The matcher is a pushdown recognizer over code points. A stack is a list of element positions, the top being
 * the next element to match; its other entries are where to go on when a rule's alternative ends. The state is a
 * set of stacks whose tops are character sets, plus the empty stack when the grammar may end here. Expanding a
 * stack whose top is a rule reference replaces it by one stack per alternative; a continuation that is an END is
 * not pushed, so right recursion (the repetitions' rules) keeps stacks flat.
 *
 * The allowed-token mask walks a trie of the vocabulary's token bytes (built once per matcher) depth first with
 * the state: each completed code point advances the state, an empty state prunes the subtree, and a code point
 * still incomplete at a node is kept when some stack's set holds a code point with that prefix. A token ends at a
 * node; it is allowed when the state there is not empty. Tokens that split a code point carry its bytes into the
 * next one. EOS is allowed exactly when the state holds the empty stack (and no code point is half done); control
 * tokens never are. */
#include "kiln.h"
#include "status.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    int32_t cap_name;
};

/* ---------------------------------------------------------------- building */

/* While parsing, a rule's alternatives are kept as lists of element runs before they go into the flat arrays. */
typedef struct {
    gelem *el;
    int32_t n, cap;
} run;

typedef struct {
    run *alts;
    int32_t n, cap;
    bool defined;
    int line; /* where it was first referenced or defined */
} prule;

typedef struct {
    const char *s, *end, *line_start;
    int line;
    kiln_grammar *g;
    prule *r;
    int32_t n_r, cap_r;
    char err[200];
} parser;

static bool grow(void **p, int32_t *cap, int32_t need, size_t size) {
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

static bool fail(parser *p, const char *at, const char *msg) {
    if (!p->err[0]) {
        const int col = (int)(at - p->line_start) + 1;
        snprintf(p->err, sizeof p->err, "line %d, column %d: %s", p->line, col, msg);
    }
    return false;
}

static bool run_push(parser *p, run *r, gelem e) {
    if (!grow((void **)&r->el, &r->cap, r->n + 1, sizeof *r->el)) return fail(p, p->s, "out of memory");
    r->el[r->n++] = e;
    return true;
}

static int32_t new_rule(parser *p, const char *name, size_t len) {
    if (!grow((void **)&p->r, &p->cap_r, p->n_r + 1, sizeof *p->r) ||
        !grow((void **)&p->g->name, &p->g->cap_name, p->n_r + 1, sizeof *p->g->name))
        return -1;
    char *nm = malloc(len + 1);
    if (!nm) return -1;
    memcpy(nm, name, len), nm[len] = 0;
    memset(&p->r[p->n_r], 0, sizeof p->r[p->n_r]);
    p->r[p->n_r].line = p->line;
    p->g->name[p->n_r] = nm;
    p->g->n_rule = p->n_r + 1; /* the names to free */
    return p->n_r++;
}

static int32_t find_rule(parser *p, const char *name, size_t len) {
    for (int32_t i = 0; i < p->n_r; i++)
        if (strlen(p->g->name[i]) == len && memcmp(p->g->name[i], name, len) == 0) return i;
    return new_rule(p, name, len);
}

/* A fresh rule for a group or a repetition, named after its parent. */
static int32_t gen_rule(parser *p, int32_t parent) {
    char nm[96];
    snprintf(nm, sizeof nm, "%.60s-%d", p->g->name[parent], (int)p->n_r);
    const int32_t r = new_rule(p, nm, strlen(nm));
    if (r >= 0) p->r[r].defined = true;
    return r;
}

static run *add_alt(parser *p, int32_t rule) {
    prule *r = &p->r[rule];
    if (!grow((void **)&r->alts, &r->cap, r->n + 1, sizeof *r->alts)) return NULL;
    memset(&r->alts[r->n], 0, sizeof r->alts[r->n]);
    return &r->alts[r->n++];
}

static int32_t add_ranges(parser *p, const uint32_t *lohi, int32_t n) {
    kiln_grammar *g = p->g;
    if (!grow((void **)&g->rng, &g->cap_rng, g->n_rng + 2 * n, sizeof *g->rng)) return -1;
    memcpy(g->rng + g->n_rng, lohi, (size_t)n * 2 * sizeof *lohi);
    const int32_t a = g->n_rng / 2;
    g->n_rng += 2 * n;
    return a;
}

/* ---------------------------------------------------------------- the syntax */

static bool is_name(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_'; }

/* Spaces, tabs and # comments; newlines too when newline_ok. */
static void skip_space(parser *p, bool newline_ok) {
    while (p->s < p->end) {
        const char c = *p->s;
        if (c == ' ' || c == '\t') p->s++;
        else if (c == '#') {
            while (p->s < p->end && *p->s != '\n') p->s++;
        } else if (newline_ok && (c == '\n' || c == '\r')) {
            if (c == '\n') p->line++, p->line_start = p->s + 1;
            p->s++;
        } else break;
    }
}

/* One UTF-8 code point at p->s (invalid bytes are an error). */
static bool utf8_cp(parser *p, uint32_t *cp) {
    const unsigned char *u = (const unsigned char *)p->s;
    const size_t left = (size_t)(p->end - p->s);
    int n = u[0] < 0x80 ? 1 : (u[0] >> 5) == 6 ? 2 : (u[0] >> 4) == 14 ? 3 : (u[0] >> 3) == 30 ? 4 : 0;
    if (!n || (size_t)n > left) return fail(p, p->s, "invalid UTF-8");
    uint32_t v = n == 1 ? u[0] : u[0] & (0x7F >> n);
    for (int i = 1; i < n; i++) {
        if ((u[i] & 0xC0) != 0x80) return fail(p, p->s, "invalid UTF-8");
        v = v << 6 | (u[i] & 0x3F);
    }
    *cp = v, p->s += n;
    return true;
}

/* A character of a literal or a class: an escape or a code point. */
static bool parse_char(parser *p, uint32_t *cp) {
    if (p->s >= p->end) return fail(p, p->s, "unexpected end of the grammar");
    if (*p->s != '\\') return utf8_cp(p, cp);
    const char *at = p->s++;
    if (p->s >= p->end) return fail(p, at, "an escape at the end of the grammar");
    const char c = *p->s++;
    int hex = c == 'x' ? 2 : c == 'u' ? 4 : c == 'U' ? 8 : 0;
    if (hex) {
        uint32_t v = 0;
        for (int i = 0; i < hex; i++, p->s++) {
            const char h = p->s < p->end ? *p->s : 0;
            const int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
            if (d < 0) return fail(p, at, "a \\x, \\u or \\U escape needs 2, 4 or 8 hex digits");
            v = v << 4 | (uint32_t)d;
        }
        if (v > 0x10FFFF) return fail(p, at, "an escape past U+10FFFF");
        *cp = v;
        return true;
    }
    switch (c) {
    case 'n': *cp = '\n'; return true;
    case 'r': *cp = '\r'; return true;
    case 't': *cp = '\t'; return true;
    case '\\': case '"': case '[': case ']': case '-': case '^': *cp = (uint32_t)c; return true;
    default: return fail(p, at, "an unknown escape (\\n \\r \\t \\\\ \\\" \\[ \\] \\xHH \\uHHHH \\UHHHHHHHH)");
    }
}

static bool parse_alternatives(parser *p, int32_t rule, bool nested);

static bool parse_int(parser *p, int *v) {
    if (p->s >= p->end || *p->s < '0' || *p->s > '9') return false;
    long n = 0;
    while (p->s < p->end && *p->s >= '0' && *p->s <= '9') {
        n = n * 10 + (*p->s++ - '0');
        if (n > 100000) return false;
    }
    *v = (int)n;
    return true;
}

/* The element e repeated: appends to r what {min, max} (max -1: unbounded) of it becomes. */
static bool repeat(parser *p, int32_t rule, run *r, gelem e, int min, int max) {
    for (int i = 0; i < min; i++)
        if (!run_push(p, r, e)) return false;
    if (max == min) return true;
    /* the rest: R ::= e R | () for unbounded, else R_k ::= e R_{k-1} | () nested max - min deep */
    const int32_t first = p->n_r;
    const int n_opt = max < 0 ? 1 : max - min;
    for (int k = 0; k < n_opt; k++) {
        const int32_t R = gen_rule(p, rule);
        if (R < 0 || !add_alt(p, R) || !add_alt(p, R) || !run_push(p, &p->r[R].alts[0], e)) return fail(p, p->s, "out of memory");
        if (max < 0 && !run_push(p, &p->r[R].alts[0], (gelem){GE_RULE, 0, R, 0})) return false;
        if (max >= 0 && k + 1 < n_opt && !run_push(p, &p->r[R].alts[0], (gelem){GE_RULE, 0, R + 1, 0})) return false;
    }
    return run_push(p, r, (gelem){GE_RULE, 0, first, 0});
}

/* A run of terms up to a newline (outside parentheses), a '|' or a ')'. */
static bool parse_sequence(parser *p, int32_t rule, run *r, bool nested) {
    for (;;) {
        skip_space(p, nested);
        if (p->s >= p->end) return true;
        const char c = *p->s;
        const char *at = p->s;
        gelem e;
        int32_t n_before = r->n; /* a literal's characters: the repetition applies to all of them as a group */
        bool literal = false;
        if (c == '"') {
            p->s++;
            literal = true;
            while (p->s < p->end && *p->s != '"') {
                uint32_t cp;
                if (!parse_char(p, &cp)) return false;
                const uint32_t lohi[2] = {cp, cp};
                const int32_t a = add_ranges(p, lohi, 1);
                if (a < 0 || !run_push(p, r, (gelem){GE_CHAR, 0, a, 1})) return fail(p, at, "out of memory");
            }
            if (p->s >= p->end) return fail(p, at, "a literal without its closing \"");
            p->s++;
        } else if (c == '[') {
            p->s++;
            bool neg = p->s < p->end && *p->s == '^';
            if (neg) p->s++;
            uint32_t lohi[2 * 256];
            int32_t n = 0;
            while (p->s < p->end && *p->s != ']') {
                uint32_t lo, hi;
                if (!parse_char(p, &lo)) return false;
                hi = lo;
                if (p->s + 1 < p->end && *p->s == '-' && p->s[1] != ']') {
                    p->s++;
                    if (!parse_char(p, &hi)) return false;
                    if (hi < lo) return fail(p, at, "a character range whose end is before its start");
                }
                if (n == 256) return fail(p, at, "a character class of more than 256 ranges");
                lohi[2 * n] = lo, lohi[2 * n + 1] = hi, n++;
            }
            if (p->s >= p->end) return fail(p, at, "a character class without its closing ]");
            p->s++;
            const int32_t a = add_ranges(p, lohi, n);
            if (a < 0) return fail(p, at, "out of memory");
            e = (gelem){GE_CHAR, (uint8_t)neg, a, n};
        } else if (c == '.') {
            p->s++;
            const uint32_t lohi[2] = {0, 0x10FFFF};
            const int32_t a = add_ranges(p, lohi, 1);
            if (a < 0) return fail(p, at, "out of memory");
            e = (gelem){GE_CHAR, 0, a, 1};
        } else if (is_name(c)) {
            const char *n0 = p->s;
            while (p->s < p->end && is_name(*p->s)) p->s++;
            const char *n1 = p->s;
            skip_space(p, false);
            if (p->end - p->s >= 3 && p->s[0] == ':' && p->s[1] == ':' && p->s[2] == '=') {
                p->s = n0; /* the next rule's name: this sequence ends */
                return nested ? fail(p, n0, "a rule definition inside parentheses") : true;
            }
            p->s = n1;
            const int32_t ref = find_rule(p, n0, (size_t)(n1 - n0));
            if (ref < 0) return fail(p, at, "out of memory");
            e = (gelem){GE_RULE, 0, ref, 0};
        } else if (c == '(') {
            p->s++;
            const int32_t R = gen_rule(p, rule);
            if (R < 0) return fail(p, at, "out of memory");
            if (!parse_alternatives(p, R, true)) return false;
            skip_space(p, true);
            if (p->s >= p->end || *p->s != ')') return fail(p, at, "a ( without its closing )");
            p->s++;
            e = (gelem){GE_RULE, 0, R, 0};
        } else {
            return true; /* '|', ')', a newline or something the caller reports */
        }
        /* a repetition applies to the term just parsed; a literal of several characters becomes a group first */
        const char q = p->s < p->end ? *p->s : 0;
        if (literal) {
            if (q != '*' && q != '+' && q != '?' && q != '{') continue;
            if (r->n - n_before == 1) {
                e = r->el[--r->n];
            } else {
                const int32_t R = gen_rule(p, rule);
                run *a = R >= 0 ? add_alt(p, R) : NULL;
                if (!a) return fail(p, at, "out of memory");
                for (int32_t i = n_before; i < r->n; i++)
                    if (!run_push(p, &p->r[R].alts[0], r->el[i])) return false;
                r->n = n_before;
                e = (gelem){GE_RULE, 0, R, 0};
            }
        }
        int min = 1, max = 1;
        if (q == '*') min = 0, max = -1, p->s++;
        else if (q == '+') min = 1, max = -1, p->s++;
        else if (q == '?') min = 0, max = 1, p->s++;
        else if (q == '{') {
            const char *b = p->s++;
            skip_space(p, false);
            min = 0;
            const bool has_min = parse_int(p, &min);
            skip_space(p, false);
            if (p->s < p->end && *p->s == ',') {
                p->s++;
                skip_space(p, false);
                if (!parse_int(p, &max)) max = -1;
            } else {
                if (!has_min) return fail(p, b, "a {} repetition needs a count: {m}, {m,}, {m,n} or {,n}");
                max = min;
            }
            skip_space(p, false);
            if (p->s >= p->end || *p->s != '}') return fail(p, b, "a { repetition without its closing }");
            p->s++;
            if (max >= 0 && max < min) return fail(p, b, "a {m,n} repetition with n < m");
        }
        if (!repeat(p, rule, r, e, min, max)) return false;
    }
}

static bool parse_alternatives(parser *p, int32_t rule, bool nested) {
    for (;;) {
        const int32_t i = p->r[rule].n;
        if (!add_alt(p, rule)) return fail(p, p->s, "out of memory");
        run tmp = {0};
        const bool ok = parse_sequence(p, rule, &tmp, nested);
        p->r[rule].alts[i] = tmp; /* the rule's array may have moved while the sequence added rules */
        if (!ok) return false;
        skip_space(p, nested);
        if (p->s >= p->end || *p->s != '|') return true;
        p->s++;
        skip_space(p, true);
    }
}

static bool parse_rules(parser *p) {
    for (;;) {
        skip_space(p, true);
        if (p->s >= p->end) return true;
        const char *at = p->s;
        if (!is_name(*p->s)) return fail(p, at, "expected a rule name");
        while (p->s < p->end && is_name(*p->s)) p->s++;
        const int32_t r = find_rule(p, at, (size_t)(p->s - at));
        if (r < 0) return fail(p, at, "out of memory");
        if (p->r[r].defined) {
            char m[120];
            snprintf(m, sizeof m, "rule '%.60s' is defined twice", p->g->name[r]);
            return fail(p, at, m);
        }
        p->r[r].defined = true, p->r[r].line = p->line;
        skip_space(p, false);
        if (p->end - p->s < 3 || memcmp(p->s, "::=", 3) != 0) return fail(p, p->s, "expected ::= after the rule name");
        p->s += 3;
        skip_space(p, true);
        if (!parse_alternatives(p, r, false)) return false;
        skip_space(p, false);
        if (p->s < p->end && *p->s != '\n' && *p->s != '\r') return fail(p, p->s, "expected the end of the rule");
    }
}

/* ---------------------------------------------------------------- checks and the flat form */

/* Nullable rules (can match the empty string), then left recursion: an edge r -> s when s can come first in r. */
static bool check_left_recursion(parser *p) {
    const int32_t n = p->n_r;
    bool *nul = calloc((size_t)n, 1);
    int8_t *mark = calloc((size_t)n, 1);
    int32_t *stk = malloc((size_t)n * 2 * sizeof *stk);
    if (!nul || !mark || !stk) {
        free(nul), free(mark), free(stk);
        return fail(p, p->s, "out of memory");
    }
    for (bool changed = true; changed;) {
        changed = false;
        for (int32_t r = 0; r < n; r++) {
            if (nul[r]) continue;
            for (int32_t a = 0; a < p->r[r].n && !nul[r]; a++) {
                bool all = true;
                for (int32_t i = 0; i < p->r[r].alts[a].n && all; i++) {
                    const gelem e = p->r[r].alts[a].el[i];
                    all = e.type == GE_RULE && nul[e.a];
                }
                if (all) nul[r] = true, changed = true;
            }
        }
    }
    bool ok = true;
    /* iterative DFS over the "can come first" graph: mark 1 on the path, 2 done */
    for (int32_t s0 = 0; s0 < n && ok; s0++) {
        if (mark[s0]) continue;
        int32_t sp = 0;
        stk[sp++] = s0, stk[sp++] = 0;
        mark[s0] = 1;
        while (sp && ok) {
            const int32_t r = stk[sp - 2];
            int32_t k = stk[sp - 1]++;
            /* the k-th "first" reference of r, walking alternatives and their nullable prefixes */
            int32_t next = -1;
            for (int32_t a = 0, seen = 0; a < p->r[r].n && next < 0; a++)
                for (int32_t i = 0; i < p->r[r].alts[a].n; i++) {
                    const gelem e = p->r[r].alts[a].el[i];
                    if (e.type != GE_RULE) break;
                    if (seen++ == k) {
                        next = e.a;
                        break;
                    }
                    if (!nul[e.a]) break;
                }
            if (next < 0) {
                mark[r] = 2, sp -= 2;
                continue;
            }
            if (mark[next] == 1) {
                char m[160];
                snprintf(m, sizeof m, "left recursion: rule '%.60s' can reach itself before it matches a character", p->g->name[next]);
                snprintf(p->err, sizeof p->err, "%s", m);
                ok = false;
            } else if (!mark[next]) {
                mark[next] = 1;
                stk[sp++] = next, stk[sp++] = 0;
            }
        }
    }
    free(nul), free(mark), free(stk);
    return ok;
}

static bool flatten(parser *p) {
    kiln_grammar *g = p->g;
    g->rule_alt = malloc((size_t)(p->n_r + 1) * sizeof *g->rule_alt);
    if (!g->rule_alt) return fail(p, p->s, "out of memory");
    for (int32_t r = 0; r < p->n_r; r++) {
        g->rule_alt[r] = g->n_alt;
        for (int32_t a = 0; a < p->r[r].n; a++) {
            const run *x = &p->r[r].alts[a];
            if (!grow((void **)&g->alt, &g->cap_alt, g->n_alt + 1, sizeof *g->alt) ||
                !grow((void **)&g->el, &g->cap_el, g->n_el + x->n + 1, sizeof *g->el))
                return fail(p, p->s, "out of memory");
            g->alt[g->n_alt++] = g->n_el;
            if (x->n) memcpy(g->el + g->n_el, x->el, (size_t)x->n * sizeof *x->el); /* an empty alternative ("") has no run */
            g->n_el += x->n;
            g->el[g->n_el++] = (gelem){GE_END, 0, 0, 0};
        }
    }
    g->rule_alt[p->n_r] = g->n_alt;
    g->n_rule = p->n_r;
    return true;
}

void kiln_grammar_free(kiln_grammar *g) {
    if (!g) return;
    for (int32_t i = 0; g->name && i < g->n_rule; i++) free(g->name[i]);
    free(g->name), free(g->el), free(g->rng), free(g->alt), free(g->rule_alt), free(g);
}

kiln_status kiln_grammar_parse(const char *text, size_t len, const char *root, kiln_grammar **out) {
    *out = NULL;
    if (!text) return kiln_fail(KILN_ERR_INVALID, "grammar: no text");
    kiln_grammar *g = calloc(1, sizeof *g);
    if (!g) return kiln_fail(KILN_ERR_NOMEM, "grammar: out of memory");
    parser p = {.s = text, .end = text + len, .line_start = text, .line = 1, .g = g};
    bool ok = parse_rules(&p);
    for (int32_t r = 0; ok && r < p.n_r; r++)
        if (!p.r[r].defined) {
            snprintf(p.err, sizeof p.err, "line %d: rule '%.60s' is used but not defined", p.r[r].line, g->name[r]);
            ok = false;
        }
    const char *rn = root ? root : "root";
    g->root = -1;
    for (int32_t r = 0; ok && r < p.n_r; r++)
        if (strcmp(g->name[r], rn) == 0) g->root = r;
    if (ok && g->root < 0) snprintf(p.err, sizeof p.err, "the grammar has no rule named '%.60s'", rn), ok = false;
    if (ok) ok = check_left_recursion(&p);
    g->n_rule = p.n_r; /* names to free, even on failure */
    if (ok) ok = flatten(&p);
    for (int32_t r = 0; r < p.n_r; r++) {
        for (int32_t a = 0; a < p.r[r].n; a++) free(p.r[r].alts[a].el);
        free(p.r[r].alts);
    }
    free(p.r);
    if (!ok) {
        kiln_grammar_free(g);
        return kiln_fail(KILN_ERR_FORMAT, "grammar: %s", p.err);
    }
    *out = g;
    return KILN_OK;
}

int32_t kiln_grammar_n_rules(const kiln_grammar *g) { return g->n_rule; }

/* ---------------------------------------------------------------- stack sets */

typedef struct {
    int32_t *pos; /* stack i is pos[off[i] .. off[i + 1]), top last */
    int32_t *off;
    int32_t n, n_pos, cap_pos, cap_off;
    bool accept; /* holds the empty stack */
} gset;

#define MAX_DEPTH 1024

static void set_clear(gset *s) { s->n = 0, s->n_pos = 0, s->accept = false; }

static void set_free(gset *s) { free(s->pos), free(s->off), memset(s, 0, sizeof *s); }

static bool set_has(const gset *s, const int32_t *st, int32_t n) {
    for (int32_t i = 0; i < s->n; i++)
        if (s->off[i + 1] - s->off[i] == n && memcmp(s->pos + s->off[i], st, (size_t)n * sizeof *st) == 0) return true;
    return false;
}

/* Adds the stack st[0..n) (top last), expanded until its top is a character set; false on out of memory or depth. */
static bool expand(const kiln_grammar *g, gset *out, int32_t *st, int32_t n, int depth) {
    if (depth > MAX_DEPTH || n > MAX_DEPTH) return false;
    while (n > 0 && g->el[st[n - 1]].type == GE_END) n--; /* an alternative done: its rule's continuation */
    if (n == 0) {
        out->accept = true;
        return true;
    }
    const gelem e = g->el[st[n - 1]];
    if (e.type == GE_CHAR) {
        if (set_has(out, st, n)) return true;
        if (!grow((void **)&out->pos, &out->cap_pos, out->n_pos + n, sizeof *out->pos) ||
            !grow((void **)&out->off, &out->cap_off, out->n + 2, sizeof *out->off))
            return false;
        if (out->n == 0) out->off[0] = 0;
        memcpy(out->pos + out->n_pos, st, (size_t)n * sizeof *st);
        out->n_pos += n;
        out->off[++out->n] = out->n_pos;
        return true;
    }
    /* a rule: its continuation (unless the alternative ends there), then each alternative's first element */
    const int32_t cont = st[n - 1] + 1;
    int32_t m = n - 1;
    if (g->el[cont].type != GE_END) st[m++] = cont;
    for (int32_t a = g->rule_alt[e.a]; a < g->rule_alt[e.a + 1]; a++) {
        st[m] = g->alt[a];
        if (!expand(g, out, st, m + 1, depth + 1)) return false;
    }
    return true;
}

static bool char_in(const kiln_grammar *g, const gelem *e, uint32_t cp) {
    bool in = false;
    for (int32_t i = 0; i < e->n && !in; i++) in = cp >= g->rng[2 * (e->a + i)] && cp <= g->rng[2 * (e->a + i) + 1];
    return in != (bool)e->neg;
}

/* Some code point in [lo, hi] is in e's set. */
static bool range_meets(const kiln_grammar *g, const gelem *e, uint32_t lo, uint32_t hi) {
    if (e->neg) { /* only when one range covers all of [lo, hi] is every such code point out */
        for (int32_t i = 0; i < e->n; i++)
            if (g->rng[2 * (e->a + i)] <= lo && g->rng[2 * (e->a + i) + 1] >= hi) return false;
        return true;
    }
    for (int32_t i = 0; i < e->n; i++)
        if (g->rng[2 * (e->a + i)] <= hi && g->rng[2 * (e->a + i) + 1] >= lo) return true;
    return false;
}

/* out = the stacks of in that take cp, advanced and expanded. scratch holds MAX_DEPTH + 1 positions. */
static bool advance(const kiln_grammar *g, const gset *in, uint32_t cp, gset *out, int32_t *scratch) {
    set_clear(out);
    for (int32_t i = 0; i < in->n; i++) {
        const int32_t *st = in->pos + in->off[i], n = in->off[i + 1] - in->off[i];
        if (!char_in(g, &g->el[st[n - 1]], cp)) continue;
        memcpy(scratch, st, (size_t)n * sizeof *st);
        scratch[n - 1]++;
        if (!expand(g, out, scratch, n, 0)) return false;
    }
    return true;
}

/* ---------------------------------------------------------------- UTF-8 decoding across bytes */

typedef struct {
    uint32_t cp;  /* the bits so far */
    int8_t left;  /* continuation bytes still to come; -1 after an invalid byte */
    int8_t total; /* continuation bytes of this code point */
} u8state;

/* Feeds byte b: 1 when a code point completed (in st->cp), 0 when one is still incomplete, -1 when invalid. */
static int u8_feed(u8state *st, uint8_t b) {
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

/* Some stack of s could take a code point beginning with the incomplete st. */
static bool partial_ok(const kiln_grammar *g, const gset *s, const u8state *st) {
    static const uint32_t min_cp[4] = {0, 0x80, 0x800, 0x10000};
    uint32_t lo = st->cp << (6 * st->left), hi = lo | ((1u << (6 * st->left)) - 1);
    if (lo < min_cp[st->total]) lo = min_cp[st->total];
    if (hi > 0x10FFFF) hi = 0x10FFFF;
    if (lo > hi) return false;
    for (int32_t i = 0; i < s->n; i++)
        if (range_meets(g, &g->el[s->pos[s->off[i + 1] - 1]], lo, hi)) return true;
    return false;
}

/* ---------------------------------------------------------------- the matcher */

typedef struct {
    int32_t first_edge, n_edge; /* edges[first_edge .. + n_edge) sorted by byte */
    int32_t first_tok, n_tok;   /* tokens whose bytes end here: toks[first_tok .. + n_tok) */
} tnode;

typedef struct {
    uint8_t byte;
    int32_t child;
} tedge;

struct kiln_grammar_matcher {
    const kiln_grammar *g;
    int32_t V, eos;
    tnode *node;
    tedge *edge;
    int32_t *toks;
    int32_t n_node;
    uint8_t **bytes; /* (V) each token's bytes (NULL for control tokens and empty pieces) */
    int32_t *len;
    gset cur;
    u8state u8;      /* a code point the accepted tokens left incomplete */
    gset *lvl;       /* (max token length + 1) the walk's sets, one per depth */
    int32_t n_lvl;
    int32_t *scratch;
    bool *allowed;
};

typedef struct {
    const uint8_t *b;
    int32_t n, id;
} tok_ref;

static int cmp_tok(const void *x, const void *y) {
    const tok_ref *a = x, *b = y;
    const int32_t n = a->n < b->n ? a->n : b->n;
    const int c = memcmp(a->b, b->b, (size_t)n);
    return c ? c : (a->n > b->n) - (a->n < b->n);
}

void kiln_grammar_matcher_free(kiln_grammar_matcher *m) {
    if (!m) return;
    for (int32_t i = 0; m->bytes && i < m->V; i++) free(m->bytes[i]);
    for (int32_t i = 0; m->lvl && i < m->n_lvl; i++) set_free(&m->lvl[i]);
    set_free(&m->cur);
    free(m->bytes), free(m->len), free(m->node), free(m->edge), free(m->toks), free(m->lvl), free(m->scratch), free(m->allowed), free(m);
}

/* The trie of the tokens' bytes: sorted, each token shares the nodes of its common prefix with the one before. */
static kiln_status build_trie(kiln_grammar_matcher *m) {
    tok_ref *t = malloc((size_t)m->V * sizeof *t);
    int32_t n = 0, max_len = 0;
    size_t total = 1;
    if (!t) return kiln_fail(KILN_ERR_NOMEM, "grammar: out of memory for the vocab's trie");
    for (int32_t i = 0; i < m->V; i++)
        if (m->bytes[i]) {
            t[n++] = (tok_ref){m->bytes[i], m->len[i], i};
            total += (size_t)m->len[i];
            if (m->len[i] > max_len) max_len = m->len[i];
        }
    qsort(t, (size_t)n, sizeof *t, cmp_tok);
    /* at most one node per byte of all tokens (plus the root); edges are one fewer than nodes */
    if (total > INT32_MAX) {
        free(t);
        return kiln_fail(KILN_ERR_NOMEM, "grammar: the vocab's trie is too large");
    }
    m->node = calloc(total, sizeof *m->node);
    m->edge = malloc(total * sizeof *m->edge);
    m->toks = malloc((size_t)(n ? n : 1) * sizeof *m->toks);
    int32_t *path = malloc((size_t)(max_len + 1) * sizeof *path);
    if (!m->node || !m->edge || !m->toks || !path) {
        free(t), free(path);
        return kiln_fail(KILN_ERR_NOMEM, "grammar: out of memory for the vocab's trie");
    }
    /* Nodes are numbered in DFS preorder, so a node's children come after it; their edges are appended in byte
     * order as the sorted tokens reach them. Edges are grouped per node afterwards by a counting pass. */
    int32_t n_node = 1, n_edge = 0;
    int32_t *parent = malloc(total * sizeof *parent);
    uint8_t *pbyte = malloc(total);
    if (!parent || !pbyte) {
        free(t), free(path), free(parent), free(pbyte);
        return kiln_fail(KILN_ERR_NOMEM, "grammar: out of memory for the vocab's trie");
    }
    path[0] = 0;
    int32_t depth_prev = 0;
    const uint8_t *prev = NULL;
    for (int32_t k = 0; k < n; k++) {
        int32_t common = 0;
        if (prev)
            while (common < t[k].n && common < depth_prev && prev[common] == t[k].b[common]) common++;
        for (int32_t d = common; d < t[k].n; d++) {
            const int32_t c = n_node++;
            parent[c] = path[d], pbyte[c] = t[k].b[d];
            path[d + 1] = c;
            n_edge++;
        }
        const int32_t end = path[t[k].n];
        if (m->node[end].n_tok == 0) m->node[end].first_tok = k;
        m->node[end].n_tok++;
        m->toks[k] = t[k].id;
        prev = t[k].b, depth_prev = t[k].n;
    }
    /* edges grouped by parent, in creation order (which is byte order within a parent) */
    for (int32_t c = 1; c < n_node; c++) m->node[parent[c]].n_edge++;
    int32_t at = 0;
    for (int32_t v = 0; v < n_node; v++) m->node[v].first_edge = at, at += m->node[v].n_edge, m->node[v].n_edge = 0;
    for (int32_t c = 1; c < n_node; c++) {
        tnode *pn = &m->node[parent[c]];
        m->edge[pn->first_edge + pn->n_edge++] = (tedge){pbyte[c], c};
    }
    (void)n_edge;
    m->n_node = n_node;
    free(t), free(path), free(parent), free(pbyte);
    m->n_lvl = max_len + 2;
    m->lvl = calloc((size_t)m->n_lvl, sizeof *m->lvl);
    return m->lvl ? KILN_OK : kiln_fail(KILN_ERR_NOMEM, "grammar: out of memory");
}

kiln_status kiln_grammar_matcher_new(const kiln_grammar *g, const kiln_tokenizer *tok, kiln_grammar_matcher **out) {
    *out = NULL;
    kiln_grammar_matcher *m = calloc(1, sizeof *m);
    if (!m) return kiln_fail(KILN_ERR_NOMEM, "grammar: out of memory");
    m->g = g;
    m->V = kiln_tokenizer_n_vocab(tok);
    m->eos = kiln_tokenizer_eos(tok);
    m->bytes = calloc((size_t)m->V, sizeof *m->bytes);
    m->len = calloc((size_t)m->V, sizeof *m->len);
    m->scratch = malloc((MAX_DEPTH + 2) * sizeof *m->scratch);
    m->allowed = malloc((size_t)m->V);
    kiln_status st = m->bytes && m->len && m->scratch && m->allowed ? KILN_OK : kiln_fail(KILN_ERR_NOMEM, "grammar: out of memory");
    char buf[256];
    for (int32_t i = 0; !st && i < m->V; i++) {
        const kiln_token_type tt = kiln_tokenizer_token_type(tok, i);
        if (tt == KILN_TOKEN_CONTROL) continue;
        size_t n = 0;
        if ((st = kiln_tokenizer_piece(tok, i, false, buf, sizeof buf, &n))) break;
        if (n == 0 || n > sizeof buf) continue; /* empty, or longer than any token a grammar walk needs */
        if (!(m->bytes[i] = malloc(n))) st = kiln_fail(KILN_ERR_NOMEM, "grammar: out of memory");
        else memcpy(m->bytes[i], buf, n), m->len[i] = (int32_t)n;
    }
    if (!st) st = build_trie(m);
    if (!st) st = kiln_grammar_matcher_reset(m);
    if (st) {
        kiln_grammar_matcher_free(m);
        return st;
    }
    *out = m;
    return KILN_OK;
}

kiln_status kiln_grammar_matcher_reset(kiln_grammar_matcher *m) {
    set_clear(&m->cur);
    memset(&m->u8, 0, sizeof m->u8);
    m->scratch[0] = -1;
    const kiln_grammar *g = m->g;
    for (int32_t a = g->rule_alt[g->root]; a < g->rule_alt[g->root + 1]; a++) {
        m->scratch[0] = g->alt[a];
        if (!expand(g, &m->cur, m->scratch, 1, 0)) return kiln_fail(KILN_ERR_NOMEM, "grammar: out of memory or nesting past %d", MAX_DEPTH);
    }
    return KILN_OK;
}

bool kiln_grammar_matcher_done(const kiln_grammar_matcher *m) { return m->cur.accept && m->u8.left == 0; }

/* The walk below node v with the state s (at depth d) and the code point st in progress: marks allowed tokens. */
static bool walk(kiln_grammar_matcher *m, int32_t v, const gset *s, u8state st, int32_t d) {
    /* the walk only reaches a node whose state is alive (or whose incomplete code point some stack can take):
     * every token ending here is allowed */
    const tnode *nd = &m->node[v];
    if (v != 0)
        for (int32_t k = 0; k < nd->n_tok; k++) m->allowed[m->toks[nd->first_tok + k]] = true;
    for (int32_t e = 0; e < nd->n_edge; e++) {
        const tedge ed = m->edge[nd->first_edge + e];
        u8state ns = st;
        const int r = u8_feed(&ns, ed.byte);
        if (r < 0) continue;
        if (r == 0) {
            if (!partial_ok(m->g, s, &ns)) continue;
            if (!walk(m, ed.child, s, ns, d + 1)) return false;
            continue;
        }
        gset *nx = &m->lvl[d + 1];
        if (!advance(m->g, s, ns.cp, nx, m->scratch)) return false;
        if (nx->n == 0 && !nx->accept) continue;
        if (!walk(m, ed.child, nx, ns, d + 1)) return false;
    }
    return true;
}

kiln_status kiln_grammar_matcher_mask(kiln_grammar_matcher *m, float *logits) {
    memset(m->allowed, 0, (size_t)m->V);
    if (!walk(m, 0, &m->cur, m->u8, 0)) return kiln_fail(KILN_ERR_NOMEM, "grammar: out of memory or nesting past %d", MAX_DEPTH);
    if (m->eos >= 0 && m->eos < m->V) m->allowed[m->eos] = kiln_grammar_matcher_done(m);
    int32_t n = 0;
    for (int32_t i = 0; i < m->V; i++) {
        if (!m->allowed[i]) logits[i] = -INFINITY;
        n += m->allowed[i];
    }
    if (n == 0) return kiln_fail(KILN_ERR_INVALID, "grammar: no token of the vocab can continue the text here");
    return KILN_OK;
}

kiln_status kiln_grammar_matcher_accept(kiln_grammar_matcher *m, int32_t token) {
    if (token < 0 || token >= m->V) return kiln_fail(KILN_ERR_RANGE, "grammar: token %d is outside the vocab of %d", (int)token, (int)m->V);
    if (token == m->eos) {
        if (!kiln_grammar_matcher_done(m)) return kiln_fail(KILN_ERR_INVALID, "grammar: the end of the text (EOS) where the grammar cannot end");
        return KILN_OK;
    }
    if (!m->bytes[token]) return kiln_fail(KILN_ERR_INVALID, "grammar: token %d has no text the grammar can match", (int)token);
    gset *a = &m->lvl[0], *b = &m->lvl[1];
    /* a copy of the current state into a (its stacks are expanded already), then byte by byte */
    if (!grow((void **)&a->pos, &a->cap_pos, m->cur.n_pos + 1, sizeof *a->pos) ||
        !grow((void **)&a->off, &a->cap_off, m->cur.n + 2, sizeof *a->off))
        return kiln_fail(KILN_ERR_NOMEM, "grammar: out of memory");
    if (m->cur.n) {
        memcpy(a->pos, m->cur.pos, (size_t)m->cur.n_pos * sizeof *a->pos);
        memcpy(a->off, m->cur.off, (size_t)(m->cur.n + 1) * sizeof *a->off);
    }
    a->n = m->cur.n, a->n_pos = m->cur.n_pos, a->accept = m->cur.accept;
    if (a->n == 0) a->off[0] = 0;
    u8state st = m->u8;
    for (int32_t k = 0; k < m->len[token]; k++) {
        const int r = u8_feed(&st, m->bytes[token][k]);
        if (r < 0) return kiln_fail(KILN_ERR_INVALID, "grammar: token %d is not valid UTF-8 here", (int)token);
        if (r == 0) continue;
        if (!advance(m->g, a, st.cp, b, m->scratch)) return kiln_fail(KILN_ERR_NOMEM, "grammar: out of memory");
        if (b->n == 0 && !b->accept)
            return kiln_fail(KILN_ERR_INVALID, "grammar: token %d does not continue the text the grammar allows", (int)token);
        gset t = *a;
        *a = *b, *b = t;
    }
    if (st.left && !partial_ok(m->g, a, &st))
        return kiln_fail(KILN_ERR_INVALID, "grammar: token %d does not continue the text the grammar allows", (int)token);
    gset t = m->cur;
    m->cur = *a, *a = t;
    m->u8 = st;
    return KILN_OK;
}

/* Text against the grammar from its root: *full when all of it is a sentence, *prefix when it begins one. */
kiln_status kiln_grammar_match_text(const kiln_grammar *g, const char *s, size_t n, bool *full, bool *prefix) {
    *full = *prefix = false;
    gset a = {0}, b = {0};
    int32_t *scratch = malloc((MAX_DEPTH + 2) * sizeof *scratch);
    kiln_status st = scratch ? KILN_OK : kiln_fail(KILN_ERR_NOMEM, "grammar: out of memory");
    for (int32_t alt = g->rule_alt[g->root]; !st && alt < g->rule_alt[g->root + 1]; alt++) {
        scratch[0] = g->alt[alt];
        if (!expand(g, &a, scratch, 1, 0)) st = kiln_fail(KILN_ERR_NOMEM, "grammar: out of memory");
    }
    u8state u = {0};
    bool alive = true;
    for (size_t i = 0; !st && alive && i < n; i++) {
        const int r = u8_feed(&u, (uint8_t)s[i]);
        if (r < 0) alive = false;
        if (r != 1) continue;
        if (!advance(g, &a, u.cp, &b, scratch)) st = kiln_fail(KILN_ERR_NOMEM, "grammar: out of memory");
        gset t = a;
        a = b, b = t;
        alive = a.n > 0 || a.accept;
    }
    if (!st && alive) {
        *prefix = u.left == 0 ? true : partial_ok(g, &a, &u);
        *full = u.left == 0 && a.accept;
    }
    set_free(&a), set_free(&b), free(scratch);
    return st;
}
