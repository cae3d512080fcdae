/* grammar_parse.c: GBNF grammars (llama.cpp's syntax) compiled into the flat form of grammar_impl.h.
 *
 * Parsing compiles the text into rules of alternatives, each a run of elements in one flat array ending in an END:
 * a character set (ranges, maybe negated; "." is every code point), or a reference to a rule. Groups and the
 * repetitions become rules of their own: x* is R ::= x R | (empty), x+ is x x*, x? is R ::= x | (empty), x{m,n}
 * m copies of x then n - m nested optionals, x{m,} m copies then x*. Undefined and twice-defined rules, a missing
 * root and left recursion (a rule that can reach itself before consuming a character) are errors naming the line
 * and column, or the rule.
 *
 * The recognizer is grammar.c, the matcher that constrains sampling to a grammar grammar_mask.c. Tested by tests/test_grammar.c (parse errors,
 * sentences) and fuzzed by tests/fuzz/fuzz_grammar.c. */
#include "grammar_impl.h"
#include "status.h"

#include <stdio.h>
#include <string.h>

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
    bool generated; /* a group's or a repetition's */
    int line; /* where it was first referenced or defined */
} prule;

typedef struct {
    const char *s, *end, *line_start;
    int line;
    kiln_grammar *g;
    prule *r;
    int32_t n_r, cap_r;
    int depth;       /* parentheses open */
    int64_t n_total; /* elements made so far */
    char err[200];
} parser;

#define MAX_NESTING 256
#define MAX_ELEMENTS ((int64_t)1 << 22)


static bool fail(parser *p, const char *at, const char *msg) {
    if (!p->err[0]) {
        const int col = (int)(at - p->line_start) + 1;
        snprintf(p->err, sizeof p->err, "line %d, column %d: %s", p->line, col, msg);
    }
    return false;
}

static bool run_push(parser *p, run *r, gelem e) {
    if (++p->n_total > MAX_ELEMENTS) return fail(p, p->s, "the grammar is too large (more than 4M elements once repetitions are expanded)");
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
    if (r >= 0) p->r[r].defined = p->r[r].generated = true;
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
    if (n) memcpy(g->rng + g->n_rng, lohi, (size_t)n * 2 * sizeof *lohi); /* [] has no ranges */
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
            if (++p->depth > MAX_NESTING) return fail(p, at, "parentheses nested more than 256 deep");
            const int32_t R = gen_rule(p, rule);
            if (R < 0) return fail(p, at, "out of memory");
            if (!parse_alternatives(p, R, true)) return false;
            p->depth--;
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
    g->generated = malloc((size_t)(p->n_r ? p->n_r : 1));
    if (!g->rule_alt || !g->generated) return fail(p, p->s, "out of memory");
    for (int32_t r = 0; r < p->n_r; r++) {
        g->rule_alt[r] = g->n_alt;
        g->generated[r] = p->r[r].generated;
        for (int32_t a = 0; a < p->r[r].n; a++) {
            const run *x = &p->r[r].alts[a];
            if (!grow((void **)&g->alt, &g->cap_alt, g->n_alt + 1, sizeof *g->alt) ||
                !grow((void **)&g->el, &g->cap_el, g->n_el + x->n + 1, sizeof *g->el))
                return fail(p, p->s, "out of memory");
            g->alt[g->n_alt++] = g->n_el;
            if (x->n) memcpy(g->el + g->n_el, x->el, (size_t)x->n * sizeof *x->el); /* an empty alternative has no run */
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
    free(g->name), free(g->generated), free(g->el), free(g->rng), free(g->alt), free(g->rule_alt), free(g);
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
    bool full, prefix; /* the first step expanded once: one too ambiguous or too deep is refused here, as the input's fault */
    const kiln_status st = kiln_grammar_match_text(g, "", 0, &full, &prefix);
    if (st) {
        kiln_grammar_free(g);
        return st;
    }
    *out = g;
    return KILN_OK;
}

int32_t kiln_grammar_n_rules(const kiln_grammar *g) { return g->n_rule; }
