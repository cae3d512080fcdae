/* json_schema.c: a JSON Schema turned into a GBNF grammar (grammar.c's syntax) whose root matches the JSON texts
 * valid under it, for the common subset (docs/grammars.md lists it).
 *
 * Each subschema becomes a GBNF expression appended to a string; objects, arrays, $ref targets and patterns that need
 * rules of their own get them in a second string (rules), named by kind and a counter. A $ref target's rule is named
 * before its body is written, so recursive schemas refer to it. The shared JSON rules (strings, numbers, any value)
 * come last. Whitespace is optional only where JSON allows it between tokens, and bounded (one space, or a newline
 * and up to 4 spaces) so that sampling ends. Numbers are bounded too (16 integer digits, 16 of fraction, 2 of
 * exponent, so no number overflows a double), as llama.cpp's converter bounds them. An object's properties come in the schema's order, the
 * required ones always, the optional ones maybe; without additionalProperties an object with properties has no others. An integer's bounds
 * become the digit strings of the range, split by length and by leading digit.
 *
 * Keywords that change validity and that this does not handle are KILN_ERR_UNSUPPORTED naming the keyword and its
 * JSON pointer; bad values (a minItems above maxItems, a $ref that does not resolve) KILN_ERR_FORMAT naming the
 * pointer. Annotations (title, description, default, examples, $comment, ...) and unknown keywords are ignored. */
#include "kiln.h"
#include "status.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
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

static void sb_put(sb *b, const char *s, size_t n) {
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
static void sb_str(sb *b, const char *s) { sb_put(b, s, strlen(s)); }
static void sb_fmt(sb *b, const char *fmt, ...) {
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

static kiln_status gen(conv *c, json_t *s, const char *ptr, sb *out);

/* A fresh rule name of a kind ("obj12"). */
static void new_name(conv *c, const char *kind, char name[32]) { snprintf(name, 32, "%s%d", kind, ++c->counter); }

static void add_rule(conv *c, const char *name, const sb *body) {
    sb_fmt(&c->rules, "%s ::= ", name);
    sb_put(&c->rules, body->s ? body->s : "", body->n);
    sb_str(&c->rules, "\n");
}

/* ptr + "/" + key with ~ and / escaped as JSON pointers do (~0, ~1); malloc'd. */
static char *ptr_join(const char *ptr, const char *key) {
    sb b = {0};
    sb_str(&b, ptr);
    sb_str(&b, "/");
    for (const char *k = key; *k; k++) sb_str(&b, *k == '~' ? "~0" : *k == '/' ? "~1" : (char[2]){*k, 0});
    if (b.oom) free(b.s);
    return b.oom ? NULL : b.s;
}
static char *ptr_idx(const char *ptr, size_t i) {
    char k[32];
    snprintf(k, sizeof k, "%zu", i);
    return ptr_join(ptr, k);
}
static const char *at(const char *ptr) { return *ptr ? ptr : "/"; } /* the root's pointer, "", reads as "/" */

/* A GBNF literal of the bytes s[0..n): quotes and backslashes escaped, bytes below 0x20 as \xHH. */
static void put_literal(sb *b, const char *s, size_t n) {
    sb_str(b, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '"' || ch == '\\')
            sb_fmt(b, "\\%c", ch);
        else if (ch < 0x20)
            sb_fmt(b, "\\x%02x", ch);
        else
            sb_put(b, (const char *)&ch, 1);
    }
    sb_str(b, "\"");
}

/* A JSON value as it is written compactly, as a GBNF literal. */
static kiln_status put_value_literal(sb *b, const json_t *v) {
    char *t = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!t) return kiln_fail(KILN_ERR_NOMEM, "json schema: a value could not be written");
    put_literal(b, t, strlen(t));
    free(t);
    return KILN_OK;
}

/* The keywords that change validity and are not handled here. */
static const char *const unsupported_kw[] = {
    "not",
    "if",
    "then",
    "else",
    "patternProperties",
    "propertyNames",
    "dependentRequired",
    "dependentSchemas",
    "dependencies",
    "contains",
    "minContains",
    "maxContains",
    "unevaluatedProperties",
    "unevaluatedItems",
    "minProperties",
    "maxProperties",
    "multipleOf",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "$dynamicRef",
    "$recursiveRef",
    "contentSchema",
};

static bool is_bound_kw(const char *k) {
    return !strcmp(k, "minimum") || !strcmp(k, "maximum") || !strcmp(k, "exclusiveMinimum") || !strcmp(k, "exclusiveMaximum");
}

static kiln_status check_keywords(json_t *s, const char *ptr) {
    json_t *ty = json_object_get(s, "type");
    const bool integer = json_is_string(ty) && strcmp(json_string_value(ty), "integer") == 0; /* gen_int takes bounds */
    for (size_t i = 0; i < sizeof unsupported_kw / sizeof *unsupported_kw; i++)
        if (json_object_get(s, unsupported_kw[i]) && !(integer && is_bound_kw(unsupported_kw[i])))
            return kiln_fail(KILN_ERR_UNSUPPORTED, "json schema %s: the keyword '%s' is not supported", at(ptr), unsupported_kw[i]);
    json_t *u = json_object_get(s, "uniqueItems");
    if (u && !json_is_false(u))
        return kiln_fail(KILN_ERR_UNSUPPORTED, "json schema %s: the keyword 'uniqueItems' is not supported", at(ptr));
    return KILN_OK;
}

/* A non-negative integer keyword into *v (-1 when absent). */
static kiln_status get_count(json_t *s, const char *key, const char *ptr, int64_t *v) {
    json_t *j = json_object_get(s, key);
    *v = -1;
    if (!j) return KILN_OK;
    if (json_is_real(j) && json_real_value(j) == (double)(int64_t)json_real_value(j) && json_real_value(j) >= 0 &&
        json_real_value(j) < 1e15)
        *v = (int64_t)json_real_value(j);
    else if (json_is_integer(j) && json_integer_value(j) >= 0)
        *v = json_integer_value(j);
    else
        return kiln_fail(KILN_ERR_FORMAT, "json schema %s/%s: not a non-negative integer", ptr, key);
    if (*v > 10000) return kiln_fail(KILN_ERR_UNSUPPORTED, "json schema %s/%s: %lld is above the 10000 supported", ptr, key, (long long)*v);
    return KILN_OK;
}

/* ---------------------------------------------------------------- strings and patterns */

/* A JSON string character: anything but a quote, a backslash or a control, or an escape (\u of a surrogate only
 * as a pair, as a JSON text must be valid UTF-16 to decode). */
static const char *base_rules =
    "ws ::= ( \" \" | \"\\n\" \" \"{0,4} )?\n"
    "jhex ::= [0-9a-fA-F]\n"
    "jchar ::= [^\"\\\\\\x00-\\x1f] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" ( [0-9a-cA-Ce-fE-F] jhex{3} | [dD] [0-7] jhex{2} | "
    "[dD] [89abAB] jhex{2} \"\\\\u\" [dD] [c-fC-F] jhex{2} ) )\n"
    "jstring ::= \"\\\"\" jchar* \"\\\"\"\n"
    "jint ::= \"-\"? ( \"0\" | [1-9] [0-9]{0,15} )\n"
    "jnumber ::= jint ( \".\" [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,2} )?\n"
    "jbool ::= \"true\" | \"false\"\n"
    "jnull ::= \"null\"\n"
    "jvalue ::= jobject | jarray | jstring | jnumber | jbool | jnull\n"
    "jobject ::= \"{\" ws ( jstring ws \":\" ws jvalue ws ( \",\" ws jstring ws \":\" ws jvalue ws )* )? \"}\"\n"
    "jarray ::= \"[\" ws ( jvalue ws ( \",\" ws jvalue ws )* )? \"]\"\n";

/* The formats that constrain a string here (others are ignored, as annotations). */
static const struct {
    const char *name, *gbnf;
} formats[] = {
    {"date", "[0-9]{4} \"-\" ( \"0\" [1-9] | \"1\" [0-2] ) \"-\" ( \"0\" [1-9] | [12] [0-9] | \"3\" [01] )"},
    {"time", "( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] \":\" [0-5] [0-9] ( \".\" [0-9]{1,6} )? "
             "( [zZ] | [-+] ( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] )"},
    {"uuid", "jhex{8} \"-\" jhex{4} \"-\" jhex{4} \"-\" jhex{4} \"-\" jhex{12}"},
};

/* A regex's character set: code point ranges, maybe negated. */
typedef struct {
    uint32_t lo[64], hi[64];
    int n;
    bool neg;
} cset;

static bool cset_add(cset *k, uint32_t lo, uint32_t hi) {
    if (k->n == 64) return false;
    k->lo[k->n] = lo, k->hi[k->n] = hi, k->n++;
    return true;
}
static bool cset_has(const cset *k, uint32_t c) {
    bool in = false;
    for (int i = 0; i < k->n; i++) in = in || (c >= k->lo[i] && c <= k->hi[i]);
    return in != k->neg;
}

static void put_cp(sb *b, uint32_t c) { /* a code point inside a GBNF class */
    if (c < 0x80 && c > 0x20 && !strchr("\\]-^[\"", (int)c))
        sb_fmt(b, "%c", (int)c);
    else if (c <= 0xff)
        sb_fmt(b, "\\x%02x", c);
    else if (c <= 0xffff)
        sb_fmt(b, "\\u%04x", c);
    else
        sb_fmt(b, "\\U%08x", c);
}

/* A set as JSON string content: the raw characters of the set less quotes, backslashes and controls, and the
 * escapes of those the set holds. */
static void put_cset(sb *b, const cset *k) {
    static const char *const esc[0x20] = {[8] = "\\\\b", [9] = "\\\\t", [10] = "\\\\n", [12] = "\\\\f", [13] = "\\\\r"};
    sb alt = {0};
    int n_alt = 0;
    for (uint32_t c = 0; c < 0x20; c++)
        if (cset_has(k, c)) {
            if (n_alt++) sb_str(&alt, " | ");
            if (esc[c])
                sb_fmt(&alt, "\"%s\"", esc[c]);
            else
                sb_fmt(&alt, "\"\\\\u00\" [%c] [%c%c]", c < 16 ? '0' : '1', "0123456789abcdef"[c & 15], "0123456789ABCDEF"[c & 15]);
        }
    if (cset_has(k, '"')) sb_fmt(&alt, "%s\"\\\\\\\"\"", n_alt++ ? " | " : "");
    if (cset_has(k, '\\')) sb_fmt(&alt, "%s\"\\\\\\\\\"", n_alt++ ? " | " : "");
    sb cls = {0};
    bool any_raw = false;
    if (k->neg) {
        sb_str(&cls, "[^");
        for (int i = 0; i < k->n; i++) {
            put_cp(&cls, k->lo[i]);
            if (k->hi[i] != k->lo[i]) sb_str(&cls, "-"), put_cp(&cls, k->hi[i]);
        }
        sb_str(&cls, "\\\"\\\\\\x00-\\x1f]");
        any_raw = true;
    } else {
        sb_str(&cls, "[");
        for (int i = 0; i < k->n; i++) {
            /* the range less 0x00-0x1f, '"' and '\\' */
            uint32_t cut[][2] = {{0x20, 0x21}, {0x23, 0x5b}, {0x5d, 0x10ffff}};
            for (int j = 0; j < 3; j++) {
                uint32_t lo = k->lo[i] > cut[j][0] ? k->lo[i] : cut[j][0], hi = k->hi[i] < cut[j][1] ? k->hi[i] : cut[j][1];
                if (lo > hi) continue;
                put_cp(&cls, lo);
                if (hi != lo) sb_str(&cls, "-"), put_cp(&cls, hi);
                any_raw = true;
            }
        }
        sb_str(&cls, "]");
    }
    sb_str(b, "( ");
    if (any_raw) sb_put(b, cls.s, cls.n);
    if (n_alt) {
        if (any_raw) sb_str(b, " | ");
        sb_put(b, alt.s, alt.n);
    }
    if (!any_raw && !n_alt) sb_str(b, "[^\\x00-\\U0010ffff]"); /* nothing: a set no character is in */
    sb_str(b, " )");
    b->oom |= alt.oom || cls.oom;
    free(alt.s), free(cls.s);
}

typedef struct {
    const char *s, *end, *start;
    const char *ptr;
    conv *c;
    int depth;    /* groups open */
    bool top_alt; /* a | outside every group */
} rx;

static kiln_status rx_fail(rx *r, kiln_status st, const char *what) {
    return kiln_fail(st, "json schema %s/pattern: %s at offset %d", r->ptr, what, (int)(r->s - r->start));
}

/* The next UTF-8 code point (jansson's strings are valid UTF-8). */
static uint32_t rx_cp(rx *r) {
    const unsigned char *p = (const unsigned char *)r->s;
    uint32_t c = *p;
    int n = c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
    if (n > 1) c &= 0x3f >> (n - 1);
    for (int i = 1; i < n && r->s + i < r->end; i++) c = c << 6 | (p[i] & 0x3f);
    r->s += n;
    return c;
}

/* A class escape (\d \w \s and their negations) into k; false when e is none of them. */
static bool class_escape(char e, cset *k, bool *neg) {
    *neg = e == 'D' || e == 'W' || e == 'S';
    switch (e | 0x20) {
    case 'd':
        return cset_add(k, '0', '9');
    case 'w':
        return cset_add(k, '0', '9') && cset_add(k, 'A', 'Z') && cset_add(k, 'a', 'z') && cset_add(k, '_', '_');
    case 's':
        return cset_add(k, ' ', ' ') && cset_add(k, '\t', '\r');
    default:
        return false;
    }
}

/* A single-character escape's code point, or -1 when it is not one this handles. */
static int64_t char_escape(rx *r) {
    char e = *r->s++;
    switch (e) {
    case 'n':
        return '\n';
    case 't':
        return '\t';
    case 'r':
        return '\r';
    case 'f':
        return '\f';
    case 'v':
        return '\v';
    case '0':
        return 0;
    case 'u': {
        if (r->end - r->s < 4) return -1;
        char h[5] = {0};
        memcpy(h, r->s, 4);
        char *e2;
        long v = strtol(h, &e2, 16);
        if (*e2) return -1;
        r->s += 4;
        return v;
    }
    default:
        if (strchr("\\/.^$*+?()[]{}|-\"'", e)) return (unsigned char)e;
        return -1;
    }
}

/* A code point as JSON string content in a GBNF expression. */
static void put_char(sb *b, uint32_t c) {
    cset k = {.n = 0};
    if (c < 0x20 || c == '"' || c == '\\') {
        cset_add(&k, c, c);
        put_cset(b, &k);
        return;
    }
    char u[5];
    int n = c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4;
    if (n == 1)
        u[0] = (char)c;
    else {
        for (int i = n - 1; i > 0; i--) u[i] = (char)(0x80 | (c & 0x3f)), c >>= 6;
        u[0] = (char)((0xf00 >> n) | c);
    }
    put_literal(b, u, (size_t)n);
}

static kiln_status rx_alt(rx *r, sb *out);

static kiln_status rx_class(rx *r, sb *out) {
    cset k = {.n = 0};
    r->s++; /* [ */
    if (r->s < r->end && *r->s == '^') k.neg = true, r->s++;
    bool first = true;
    while (r->s < r->end && (*r->s != ']' || first)) {
        first = false;
        int64_t lo;
        if (*r->s == '\\') {
            r->s++;
            if (r->s >= r->end) return rx_fail(r, KILN_ERR_FORMAT, "a class without its closing ]");
            bool neg;
            cset sub = {.n = 0};
            if (class_escape(*r->s, &sub, &neg)) {
                if (neg) return rx_fail(r, KILN_ERR_UNSUPPORTED, "a negated class escape inside a class");
                for (int i = 0; i < sub.n; i++)
                    if (!cset_add(&k, sub.lo[i], sub.hi[i])) return rx_fail(r, KILN_ERR_UNSUPPORTED, "a class of more than 64 ranges");
                r->s++;
                continue;
            }
            if ((lo = char_escape(r)) < 0) return rx_fail(r, KILN_ERR_UNSUPPORTED, "an escape");
        } else
            lo = rx_cp(r);
        int64_t hi = lo;
        if (r->s + 1 < r->end && *r->s == '-' && r->s[1] != ']') {
            r->s++;
            if (*r->s == '\\') {
                r->s++;
                if (r->s >= r->end || (hi = char_escape(r)) < 0) return rx_fail(r, KILN_ERR_UNSUPPORTED, "an escape");
            } else
                hi = rx_cp(r);
            if (hi < lo) return rx_fail(r, KILN_ERR_FORMAT, "a class range whose end is before its start");
        }
        if (!cset_add(&k, (uint32_t)lo, (uint32_t)hi)) return rx_fail(r, KILN_ERR_UNSUPPORTED, "a class of more than 64 ranges");
    }
    if (r->s >= r->end) return rx_fail(r, KILN_ERR_FORMAT, "a class without its closing ]");
    r->s++;
    put_cset(out, &k);
    return KILN_OK;
}

static kiln_status rx_atom(rx *r, sb *out) {
    char ch = *r->s;
    if (ch == '(') {
        r->s++;
        if (r->s < r->end && *r->s == '?') {
            if (r->s + 1 < r->end && r->s[1] == ':')
                r->s += 2;
            else
                return rx_fail(r, KILN_ERR_UNSUPPORTED, "a group of (? other than (?:");
        }
        sb_str(out, "( ");
        r->depth++;
        kiln_status s = rx_alt(r, out);
        r->depth--;
        if (s) return s;
        if (r->s >= r->end || *r->s != ')') return rx_fail(r, KILN_ERR_FORMAT, "a ( without its closing )");
        r->s++;
        sb_str(out, " )");
        return KILN_OK;
    }
    if (ch == '[') return rx_class(r, out);
    if (ch == '.') {
        cset k = {.neg = true};
        cset_add(&k, '\n', '\n');
        cset_add(&k, '\r', '\r');
        r->s++;
        put_cset(out, &k);
        return KILN_OK;
    }
    if (ch == '^' || ch == '$') return rx_fail(r, KILN_ERR_UNSUPPORTED, "an anchor inside the pattern");
    if (strchr("*+?{", ch)) return rx_fail(r, KILN_ERR_FORMAT, "a repetition of nothing");
    if (ch == ')') return rx_fail(r, KILN_ERR_FORMAT, "a ) without its (");
    if (ch == '\\') {
        r->s++;
        if (r->s >= r->end) return rx_fail(r, KILN_ERR_FORMAT, "a pattern that ends in a backslash");
        cset k = {.n = 0};
        bool neg;
        if (class_escape(*r->s, &k, &neg)) {
            k.neg = neg, r->s++;
            put_cset(out, &k);
            return KILN_OK;
        }
        const char *at_esc = r->s;
        int64_t c = char_escape(r);
        if (c < 0) {
            r->s = at_esc;
            return rx_fail(r, KILN_ERR_UNSUPPORTED, "an escape (back-references, \\b and the like)");
        }
        put_char(out, (uint32_t)c);
        return KILN_OK;
    }
    put_char(out, rx_cp(r));
    return KILN_OK;
}

/* A quantifier after an atom, if any: ? * + {m} {m,} {m,n} (a lazy ? after it matches the same strings). */
static kiln_status rx_quant(rx *r, sb *out) {
    if (r->s >= r->end) return KILN_OK;
    char ch = *r->s;
    if (ch == '?' || ch == '*' || ch == '+') {
        sb_fmt(out, "%c", ch), r->s++;
    } else if (ch == '{') {
        const char *p = r->s + 1;
        char *e;
        long m = strtol(p, &e, 10), n = m;
        if (e == p || m < 0) return rx_fail(r, KILN_ERR_UNSUPPORTED, "a { that is not a count");
        if (*e == ',') {
            p = e + 1;
            n = strtol(p, &e, 10);
            if (e == p) n = -1;
        }
        if (*e != '}' || (n >= 0 && n < m)) return rx_fail(r, KILN_ERR_FORMAT, "a bad {m,n}");
        if (m > 10000 || n > 10000) return rx_fail(r, KILN_ERR_UNSUPPORTED, "a count above 10000");
        if (n < 0)
            sb_fmt(out, "{%ld,}", m);
        else
            sb_fmt(out, "{%ld,%ld}", m, n);
        r->s = e + 1;
    } else
        return KILN_OK;
    if (r->s < r->end && (*r->s == '?' || *r->s == '+')) r->s++; /* lazy or possessive: the same language */
    if (r->s < r->end && strchr("*+?{", *r->s)) return rx_fail(r, KILN_ERR_FORMAT, "a repetition of a repetition");
    return KILN_OK;
}

static kiln_status rx_seq(rx *r, sb *out) {
    bool any = false;
    while (r->s < r->end && *r->s != '|' && *r->s != ')') {
        if (*r->s == '$' && r->s + 1 == r->end) break; /* the end anchor, the caller's */
        if (any) sb_str(out, " ");
        sb_str(out, "( ");
        kiln_status s = rx_atom(r, out);
        if (!s) sb_str(out, " )");
        if (!s) s = rx_quant(r, out);
        if (s) return s;
        any = true;
    }
    if (!any) sb_str(out, "\"\"");
    return KILN_OK;
}

static kiln_status rx_alt(rx *r, sb *out) {
    sb_str(out, "( ");
    kiln_status s = rx_seq(r, out);
    while (!s && r->s < r->end && *r->s == '|') {
        r->top_alt |= r->depth == 0;
        r->s++;
        sb_str(out, " | ");
        s = rx_seq(r, out);
    }
    sb_str(out, " )");
    return s;
}

/* A pattern (ECMA-262 regex, unanchored unless ^ and $ anchor it) as a JSON string. */
static kiln_status gen_pattern(conv *c, const char *pat, size_t n, const char *ptr, sb *out) {
    rx r = {pat, pat + n, pat, ptr, c, 0, false};
    sb body = {0};
    bool start = n && *pat == '^';
    if (start) r.s++;
    if (!start) sb_str(&body, "jchar* ");
    kiln_status s = rx_alt(&r, &body);
    bool end = false;
    if (!s && r.s < r.end && *r.s == '$' && r.s + 1 == r.end) end = true, r.s++;
    if (!s && r.s < r.end)
        s = rx_fail(&r, *r.s == ')' ? KILN_ERR_FORMAT : KILN_ERR_UNSUPPORTED,
                    *r.s == ')' ? "a ) without its (" : "an anchor inside the pattern");
    if (!s && (start || end) && r.top_alt) {
        r.s = pat;
        s = rx_fail(&r, KILN_ERR_UNSUPPORTED, "an anchor with a | outside groups (write ^(a|b)$)");
    }
    if (!s && !end) sb_str(&body, " jchar*");
    if (!s) {
        char name[32];
        new_name(c, "pat", name);
        add_rule(c, name, &body);
        sb_fmt(out, "\"\\\"\" %s \"\\\"\"", name);
    }
    free(body.s);
    return s;
}

static kiln_status gen_string(conv *c, json_t *s, const char *ptr, sb *out) {
    json_t *pat = json_object_get(s, "pattern"), *fmt = json_object_get(s, "format");
    int64_t lo, hi;
    kiln_status st = get_count(s, "minLength", ptr, &lo);
    if (!st) st = get_count(s, "maxLength", ptr, &hi);
    if (st) return st;
    if (lo >= 0 && hi >= 0 && lo > hi)
        return kiln_fail(KILN_ERR_FORMAT, "json schema %s: minLength %lld is above maxLength %lld", at(ptr), (long long)lo, (long long)hi);
    if (pat) {
        if (!json_is_string(pat)) return kiln_fail(KILN_ERR_FORMAT, "json schema %s/pattern: not a string", ptr);
        if (lo >= 0 || hi >= 0)
            return kiln_fail(KILN_ERR_UNSUPPORTED, "json schema %s: pattern together with minLength or maxLength is not supported",
                             at(ptr));
        return gen_pattern(c, json_string_value(pat), json_string_length(pat), ptr, out);
    }
    if (fmt && json_is_string(fmt))
        for (size_t i = 0; i < sizeof formats / sizeof *formats; i++)
            if (strcmp(json_string_value(fmt), formats[i].name) == 0) {
                if (lo >= 0 || hi >= 0)
                    return kiln_fail(KILN_ERR_UNSUPPORTED,
                                     "json schema %s: format '%s' together with minLength or maxLength is not supported", at(ptr),
                                     formats[i].name);
                sb_fmt(out, "\"\\\"\" %s \"\\\"\"", formats[i].gbnf);
                return KILN_OK;
            }
    if (lo < 0 && hi < 0)
        sb_str(out, "jstring");
    else if (hi < 0)
        sb_fmt(out, "\"\\\"\" jchar{%lld,} \"\\\"\"", (long long)lo);
    else
        sb_fmt(out, "\"\\\"\" jchar{%lld,%lld} \"\\\"\"", (long long)(lo < 0 ? 0 : lo), (long long)hi);
    return KILN_OK;
}

/* ---------------------------------------------------------------- arrays and objects */

/* The subschema s[key] (true when absent) written into out; a false one is none (*none). */
static kiln_status gen_sub(conv *c, json_t *sub, const char *ptr, const char *key, sb *out, bool *none) {
    *none = sub && json_is_false(sub);
    if (*none) return KILN_OK;
    if (!sub || json_is_true(sub)) {
        sb_str(out, "jvalue");
        return KILN_OK;
    }
    char *p = ptr_join(ptr, key);
    if (!p) return kiln_fail(KILN_ERR_NOMEM, "json schema: out of memory");
    kiln_status s = gen(c, sub, p, out);
    free(p);
    return s;
}

/* An array: item i is prefixItems[i] while there is one, then items; between minItems and maxItems of them.
 * t_i, what may follow i items, is "," ws item_i ws t_{i+1} (or nothing once i >= minItems) inside the prefix, and
 * past it a repetition of "," ws item ws. */
static kiln_status gen_array(conv *c, json_t *s, const char *ptr, sb *out) {
    int64_t lo, hi;
    kiln_status st = get_count(s, "minItems", ptr, &lo);
    if (!st) st = get_count(s, "maxItems", ptr, &hi);
    if (st) return st;
    if (lo < 0) lo = 0;
    if (hi >= 0 && lo > hi)
        return kiln_fail(KILN_ERR_FORMAT, "json schema %s: minItems %lld is above maxItems %lld", at(ptr), (long long)lo, (long long)hi);
    json_t *prefix = json_object_get(s, "prefixItems"), *items = json_object_get(s, "items");
    if (prefix && !json_is_array(prefix)) return kiln_fail(KILN_ERR_FORMAT, "json schema %s/prefixItems: not an array", ptr);
    if (items && json_is_array(items))
        return kiln_fail(KILN_ERR_UNSUPPORTED, "json schema %s/items: an array of schemas (use prefixItems)", ptr);
    const int64_t P = prefix ? (int64_t)json_array_size(prefix) : 0;
    sb item = {0};
    bool none = false;
    st = gen_sub(c, items, ptr, "items", &item, &none);
    int64_t top = hi; /* the most items, -1 no bound */
    if (none && (top < 0 || top > P)) top = P;
    if (!st && top >= 0 && lo > top)
        st = kiln_fail(KILN_ERR_FORMAT, "json schema %s: minItems %lld is above the %lld items allowed", at(ptr), (long long)lo,
                       (long long)top);
    /* item i's expression into b */
    sb *its = calloc((size_t)P + 1, sizeof *its);
    char *pp = ptr_join(ptr, "prefixItems");
    if (!st && (!its || !pp)) st = kiln_fail(KILN_ERR_NOMEM, "json schema: out of memory");
    for (int64_t i = 0; !st && i < P && (top < 0 || i < top); i++) {
        char *p = ptr_idx(pp, (size_t)i);
        st = p ? gen(c, json_array_get(prefix, (size_t)i), p, &its[i]) : kiln_fail(KILN_ERR_NOMEM, "json schema: out of memory");
        free(p);
    }
    char name[32];
    new_name(c, "arr", name);
    const int64_t last = P > 1 ? P : 1; /* t_1 .. t_last, t_last the repetition */
    sb body = {0};
    for (int64_t i = 1; !st && i <= last; i++) {
        body.n = 0;
        if (top >= 0 && i >= top)
            sb_str(&body, "\"\"");
        else if (i < P) {
            sb_fmt(&body, "\",\" ws ( %s ) ws %s-t%lld", its[i].s, name, (long long)(i + 1));
            if (i >= lo) sb_str(&body, " | \"\"");
        } else if (none)
            sb_str(&body, "\"\"");
        else {
            sb_fmt(&body, "( \",\" ws ( %s ) ws ){%lld,", item.s, (long long)(lo > i ? lo - i : 0));
            if (top >= 0) sb_fmt(&body, "%lld", (long long)(top - i));
            sb_str(&body, "}");
        }
        char tn[64];
        snprintf(tn, sizeof tn, "%s-t%lld", name, (long long)i);
        add_rule(c, tn, &body);
    }
    if (!st) {
        body.n = 0;
        sb_str(&body, "\"[\" ws ");
        if (top == 0 || (none && P == 0))
            sb_str(&body, "\"]\"");
        else {
            sb_fmt(&body, "( ( %s ) ws %s-t1", P ? its[0].s : item.s, name);
            if (lo == 0) sb_str(&body, " | \"\"");
            sb_str(&body, " ) \"]\"");
        }
        add_rule(c, name, &body);
        sb_str(out, name);
    }
    for (int64_t i = 0; its && i < P; i++) free(its[i].s);
    free(its), free(pp), free(item.s), free(body.s);
    return st;
}

/* The properties of an object schema, merged over allOf's object members. */
typedef struct {
    const char *key[256];
    json_t *schema[256];
    char *ptr[256];
    bool required[256];
    int n;
    json_t *additional; /* NULL: absent */
    const char *additional_ptr;
} props;

static kiln_status resolve(conv *c, json_t *s, const char *ptr, const char *ref, json_t **out);

static kiln_status collect_props(conv *c, json_t *s, const char *ptr, props *pr, int depth) {
    if (depth > 32) return kiln_fail(KILN_ERR_UNSUPPORTED, "json schema %s: allOf nested deeper than 32", at(ptr));
    json_t *ref = json_object_get(s, "$ref");
    if (ref) {
        json_t *t;
        kiln_status st = resolve(c, ref, ptr, json_string_value(ref), &t);
        return st ? st : collect_props(c, t, json_string_value(ref) + 1, pr, depth + 1);
    }
    kiln_status st = check_keywords(s, ptr);
    if (st) return st;
    static const char *const not_object[] = {"anyOf",       "oneOf",   "enum",      "const",    "items",
                                             "prefixItems", "pattern", "minLength", "maxLength"};
    for (size_t i = 0; depth > 0 && i < sizeof not_object / sizeof *not_object; i++)
        if (json_object_get(s, not_object[i]))
            return kiln_fail(KILN_ERR_UNSUPPORTED, "json schema %s: '%s' in a member of allOf (only objects' keywords are merged)", at(ptr),
                             not_object[i]);
    json_t *ty = json_object_get(s, "type");
    if (depth > 0 && ty && !(json_is_string(ty) && strcmp(json_string_value(ty), "object") == 0))
        return kiln_fail(KILN_ERR_UNSUPPORTED, "json schema %s/type: a member of allOf that is not an object", ptr);
    json_t *p = json_object_get(s, "properties"), *req = json_object_get(s, "required"), *all = json_object_get(s, "allOf");
    if (p && !json_is_object(p)) return kiln_fail(KILN_ERR_FORMAT, "json schema %s/properties: not an object", ptr);
    if (req && !json_is_array(req)) return kiln_fail(KILN_ERR_FORMAT, "json schema %s/required: not an array", ptr);
    const char *k;
    json_t *v;
    json_object_foreach(p, k, v) {
        int i = 0;
        while (i < pr->n && strcmp(pr->key[i], k) != 0) i++;
        if (i < pr->n) return kiln_fail(KILN_ERR_UNSUPPORTED, "json schema %s/properties: '%s' defined twice across allOf", ptr, k);
        if (pr->n == 256) return kiln_fail(KILN_ERR_UNSUPPORTED, "json schema %s/properties: more than 256 properties", ptr);
        char *pp = ptr_join(ptr, "properties");
        pr->ptr[pr->n] = pp ? ptr_join(pp, k) : NULL;
        free(pp);
        if (!pr->ptr[pr->n]) return kiln_fail(KILN_ERR_NOMEM, "json schema: out of memory");
        pr->key[pr->n] = k, pr->schema[pr->n] = v, pr->required[pr->n] = false, pr->n++;
    }
    size_t i;
    json_array_foreach(req, i, v) if (!json_is_string(v)) return kiln_fail(KILN_ERR_FORMAT, "json schema %s/required/%zu: not a string",
                                                                           ptr, i);
    if (all) {
        if (!json_is_array(all)) return kiln_fail(KILN_ERR_FORMAT, "json schema %s/allOf: not an array", ptr);
        char *ap = ptr_join(ptr, "allOf");
        json_array_foreach(all, i, v) {
            char *p2 = ap ? ptr_idx(ap, i) : NULL;
            st = p2 ? json_is_object(v) ? collect_props(c, v, p2, pr, depth + 1)
                                        : kiln_fail(KILN_ERR_UNSUPPORTED, "json schema %s: allOf of a boolean schema", p2)
                    : kiln_fail(KILN_ERR_NOMEM, "json schema: out of memory");
            free(p2);
            if (st) break;
        }
        free(ap);
        if (st) return st;
    }
    json_array_foreach(req, i, v) {
        int j = 0;
        while (j < pr->n && strcmp(pr->key[j], json_string_value(v)) != 0) j++;
        if (j == pr->n)
            return kiln_fail(KILN_ERR_UNSUPPORTED, "json schema %s/required/%zu: '%s' is not among the properties", ptr, i,
                             json_string_value(v));
        pr->required[j] = true;
    }
    json_t *add = json_object_get(s, "additionalProperties");
    if (add) {
        if (pr->additional && !json_equal(pr->additional, add))
            return kiln_fail(KILN_ERR_UNSUPPORTED, "json schema %s: differing additionalProperties across allOf", ptr);
        pr->additional = add, pr->additional_ptr = ptr;
    }
    return KILN_OK;
}

/* An object: A_i (nothing written yet, from property i) and B_i (something written) as
 *   A_i ::= kv_i B_{i+1} | A_{i+1} (the second only when i is optional),  B_i ::= "," ws kv_i B_{i+1} | B_{i+1}
 * (the second only when optional), A_n / B_n the additional members (none, or any number of key: value). */
static kiln_status gen_object(conv *c, json_t *s, const char *ptr, sb *out) {
    props *pr = calloc(1, sizeof *pr);
    if (!pr) return kiln_fail(KILN_ERR_NOMEM, "json schema: out of memory");
    kiln_status st = collect_props(c, s, ptr, pr, 0);
    char name[32];
    new_name(c, "obj", name);
    sb kv = {0}, body = {0}, extra = {0};
    /* the additional members: none when additionalProperties is false, or absent with properties */
    bool more = pr->additional ? !json_is_false(pr->additional) : pr->n == 0;
    if (!st && more) {
        sb_str(&extra, "jstring ws \":\" ws ( ");
        if (!pr->additional || json_is_true(pr->additional))
            sb_str(&extra, "jvalue");
        else {
            char *p = ptr_join(pr->additional_ptr, "additionalProperties");
            st = p ? gen(c, pr->additional, p, &extra) : kiln_fail(KILN_ERR_NOMEM, "json schema: out of memory");
            free(p);
        }
        sb_str(&extra, " ) ws");
    }
    for (int i = pr->n; !st && i >= 0; i--) {
        kv.n = 0;
        if (kv.s) kv.s[0] = 0;
        if (i < pr->n) {
            json_t *ks = json_string(pr->key[i]);
            char *enc = ks ? json_dumps(ks, JSON_ENCODE_ANY) : NULL; /* the key as JSON writes it, quotes and escapes */
            json_decref(ks);
            if (!enc)
                st = kiln_fail(KILN_ERR_NOMEM, "json schema: out of memory");
            else
                put_literal(&kv, enc, strlen(enc));
            free(enc);
            sb_str(&kv, " ws \":\" ws ( ");
            if (!st) {
                if (json_is_true(pr->schema[i]))
                    sb_str(&kv, "jvalue");
                else if (json_is_false(pr->schema[i]))
                    st = kiln_fail(KILN_ERR_UNSUPPORTED, "json schema %s: a false schema", pr->ptr[i]);
                else
                    st = gen(c, pr->schema[i], pr->ptr[i], &kv);
            }
            sb_str(&kv, " ) ws");
        }
        if (st) break;
        char an[48], bn[48];
        snprintf(an, sizeof an, "%s-a%d", name, i), snprintf(bn, sizeof bn, "%s-b%d", name, i);
        body.n = 0;
        if (i == pr->n) { /* A_n: (extra ("," ws extra)*)?  B_n: ("," ws extra)* */
            if (more)
                sb_fmt(&body, "( %s ( \",\" ws %s )* )?", extra.s, extra.s);
            else
                sb_str(&body, "\"\"");
            add_rule(c, an, &body);
            body.n = 0;
            if (more)
                sb_fmt(&body, "( \",\" ws %s )*", extra.s);
            else
                sb_str(&body, "\"\"");
            add_rule(c, bn, &body);
            continue;
        }
        sb_fmt(&body, "%s %s-b%d", kv.s, name, i + 1);
        if (!pr->required[i]) sb_fmt(&body, " | %s-a%d", name, i + 1);
        add_rule(c, an, &body);
        body.n = 0;
        sb_fmt(&body, "\",\" ws %s %s-b%d", kv.s, name, i + 1);
        if (!pr->required[i]) sb_fmt(&body, " | %s-b%d", name, i + 1);
        add_rule(c, bn, &body);
    }
    if (!st) sb_fmt(out, "\"{\" ws %s-a0 \"}\"", name);
    for (int i = 0; i < pr->n; i++) free(pr->ptr[i]);
    free(pr), free(kv.s), free(body.s), free(extra.s);
    return st;
}

/* ---------------------------------------------------------------- $ref, combinators, types */

/* A "#/..." reference's target in the root document. */
static kiln_status resolve(conv *c, json_t *ref, const char *ptr, const char *r, json_t **out) {
    if (!json_is_string(ref)) return kiln_fail(KILN_ERR_FORMAT, "json schema %s/$ref: not a string", ptr);
    if (r[0] != '#' || (r[1] && r[1] != '/'))
        return kiln_fail(KILN_ERR_UNSUPPORTED, "json schema %s/$ref: '%s' is not within the document (#/...)", ptr, r);
    json_t *t = c->root;
    const char *p = r + 1;
    while (*p == '/' && t) {
        p++;
        const char *e = strchr(p, '/');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        char key[256];
        size_t k = 0;
        for (size_t i = 0; i < n && k < sizeof key - 1; i++) {
            if (p[i] == '~' && i + 1 < n && (p[i + 1] == '0' || p[i + 1] == '1'))
                key[k++] = p[++i] == '0' ? '~' : '/';
            else
                key[k++] = p[i];
        }
        key[k] = 0;
        if (json_is_array(t)) {
            char *end;
            unsigned long idx = strtoul(key, &end, 10);
            t = *key && !*end ? json_array_get(t, idx) : NULL;
        } else
            t = json_object_get(t, key);
        p += n;
    }
    if (!t) return kiln_fail(KILN_ERR_FORMAT, "json schema %s/$ref: '%s' does not resolve", ptr, r);
    *out = t;
    return KILN_OK;
}

static kiln_status gen_ref(conv *c, json_t *ref, const char *ptr, sb *out) {
    const char *r = json_is_string(ref) ? json_string_value(ref) : "";
    for (int i = 0; i < c->n_refs; i++)
        if (strcmp(c->refs[i].ref, r) == 0) {
            sb_str(out, c->refs[i].name);
            return KILN_OK;
        }
    json_t *t;
    kiln_status st = resolve(c, ref, ptr, r, &t);
    if (st) return st;
    if (c->n_refs == c->cap_refs) {
        int cap = c->cap_refs ? 2 * c->cap_refs : 8;
        memo *m = realloc(c->refs, (size_t)cap * sizeof *m);
        if (!m) return kiln_fail(KILN_ERR_NOMEM, "json schema: out of memory");
        c->refs = m, c->cap_refs = cap;
    }
    char name[32];
    new_name(c, "ref", name);
    c->refs[c->n_refs].ref = strdup(r), c->refs[c->n_refs].name = strdup(name);
    if (!c->refs[c->n_refs].ref || !c->refs[c->n_refs].name) {
        free(c->refs[c->n_refs].ref), free(c->refs[c->n_refs].name);
        return kiln_fail(KILN_ERR_NOMEM, "json schema: out of memory");
    }
    c->n_refs++;
    sb body = {0};
    st = gen(c, t, r + 1, &body);
    if (!st) add_rule(c, name, &body);
    free(body.s);
    if (!st) sb_str(out, name);
    return st;
}

/* anyOf / oneOf: alternatives (oneOf's "exactly one" is not checked: a text valid under two passes). */
static kiln_status gen_alts(conv *c, json_t *a, const char *ptr, const char *key, sb *out) {
    if (!json_is_array(a) || json_array_size(a) == 0)
        return kiln_fail(KILN_ERR_FORMAT, "json schema %s/%s: not a non-empty array", ptr, key);
    char *kp = ptr_join(ptr, key);
    if (!kp) return kiln_fail(KILN_ERR_NOMEM, "json schema: out of memory");
    kiln_status st = KILN_OK;
    size_t i;
    json_t *v;
    sb_str(out, "( ");
    json_array_foreach(a, i, v) {
        char *p = ptr_idx(kp, i);
        if (i) sb_str(out, " | ");
        sb_str(out, "( ");
        st = p ? gen(c, v, p, out) : kiln_fail(KILN_ERR_NOMEM, "json schema: out of memory");
        sb_str(out, " )");
        free(p);
        if (st) break;
    }
    sb_str(out, " )");
    free(kp);
    return st;
}

/* ---------------------------------------------------------------- integer bounds */

/* The decimal strings of one length n from lo to hi (both n digits, lo <= hi), as GBNF: the first digits they share,
 * then lo's digit with what may follow it, the digits between with anything, hi's digit with what may follow it. */
static void same_len(sb *b, const char *lo, const char *hi, int n) {
    if (n == 0) {
        sb_str(b, "\"\"");
        return;
    }
    if (lo[0] == hi[0]) {
        sb_fmt(b, "\"%c\" ", lo[0]);
        same_len(b, lo + 1, hi + 1, n - 1);
        return;
    }
    bool lo_zeros = true, hi_nines = true;
    for (int i = 1; i < n; i++) lo_zeros &= lo[i] == '0', hi_nines &= hi[i] == '9';
    if (lo_zeros && hi_nines) {
        sb_fmt(b, "[%c-%c] [0-9]{%d}", lo[0], hi[0], n - 1);
        return;
    }
    char nines[24], zeros[24];
    memset(nines, '9', (size_t)n), memset(zeros, '0', (size_t)n);
    sb_fmt(b, "( \"%c\" ( ", lo[0]);
    same_len(b, lo + 1, nines, n - 1);
    sb_str(b, " )");
    if (hi[0] - lo[0] > 1) sb_fmt(b, " | [%c-%c] [0-9]{%d}", lo[0] + 1, hi[0] - 1, n - 1);
    sb_fmt(b, " | \"%c\" ( ", hi[0]);
    same_len(b, zeros, hi + 1, n - 1);
    sb_str(b, " ) )");
}

/* The integers lo .. hi (0 <= lo <= hi; hi < 0 for no bound) written without leading zeros, as alternatives. */
static void nonneg_range(sb *b, int64_t lo, int64_t hi) {
    int n_lo = snprintf(NULL, 0, "%lld", (long long)lo), n_hi = hi < 0 ? n_lo : snprintf(NULL, 0, "%lld", (long long)hi);
    sb_str(b, "( ");
    for (int n = n_lo; n <= n_hi; n++) {
        int64_t p = 1;
        for (int i = 1; i < n; i++) p *= 10;
        const int64_t a = n == 1 ? 0 : p, z = p * 10 - 1;                      /* the n-digit numbers */
        const int64_t from = lo > a ? lo : a, to = hi >= 0 && hi < z ? hi : z; /* hi < 0: n is n_lo, to z */
        if (n > n_lo) sb_str(b, " | ");
        char sa[24], sz[24];
        snprintf(sa, sizeof sa, "%lld", (long long)from), snprintf(sz, sizeof sz, "%lld", (long long)to);
        same_len(b, sa, sz, n);
    }
    if (hi < 0 && n_lo < 16) sb_fmt(b, " | [1-9] [0-9]{%d,15}", n_lo); /* no bound: the longer ones, to jint's 16 digits */
    sb_str(b, " )");
}

/* A bound of an integer: minimum / maximum as they are, exclusiveMinimum / exclusiveMaximum one past; reals rounded
 * inward. *have false when absent. */
static kiln_status int_bound(json_t *s, const char *key, const char *ptr, bool low, bool exclusive, int64_t *v, bool *have) {
    json_t *j = json_object_get(s, key);
    *have = j != NULL;
    if (!j) return KILN_OK;
    if (!json_is_number(j))
        return kiln_fail(KILN_ERR_UNSUPPORTED, "json schema %s/%s: not a number (draft 4's boolean form is not supported)", ptr, key);
    double x = json_number_value(j);
    if (!(x >= -1e15 && x <= 1e15)) return kiln_fail(KILN_ERR_UNSUPPORTED, "json schema %s/%s: beyond +-1e15", ptr, key);
    double r = low ? ceil(x) : floor(x);
    if (exclusive && r == x) r += low ? 1 : -1;
    *v = (int64_t)r;
    return KILN_OK;
}

/* An integer between its bounds: the negatives as "-" and their magnitudes, then the non-negatives. */
static kiln_status gen_int(json_t *s, const char *ptr, sb *out) {
    int64_t lo = 0, hi = 0, v = 0;
    bool has_lo = false, has_hi = false, h;
    static const struct {
        const char *key;
        bool low, exclusive;
    } kws[] = {{"minimum", true, false}, {"exclusiveMinimum", true, true}, {"maximum", false, false}, {"exclusiveMaximum", false, true}};
    for (size_t i = 0; i < sizeof kws / sizeof *kws; i++) {
        kiln_status st = int_bound(s, kws[i].key, ptr, kws[i].low, kws[i].exclusive, &v, &h);
        if (st) return st;
        if (h && kws[i].low) lo = has_lo && lo > v ? lo : v, has_lo = true;
        if (h && !kws[i].low) hi = has_hi && hi < v ? hi : v, has_hi = true;
    }
    if (!has_lo && !has_hi) return sb_str(out, "jint"), KILN_OK;
    if (has_lo && has_hi && lo > hi)
        return kiln_fail(KILN_ERR_FORMAT, "json schema %s: no integer is within minimum %lld and maximum %lld", at(ptr), (long long)lo,
                         (long long)hi);
    sb_str(out, "( ");
    bool any = false;
    if (!has_lo || lo < 0) { /* negatives from -1 (or hi) down to lo */
        sb_str(out, "\"-\" ");
        nonneg_range(out, has_hi && hi < -1 ? -hi : 1, has_lo ? -lo : -1);
        any = true;
    }
    if (!has_hi || hi >= 0) {
        if (any) sb_str(out, " | ");
        nonneg_range(out, has_lo && lo > 0 ? lo : 0, has_hi ? hi : -1);
    }
    sb_str(out, " )");
    return KILN_OK;
}

static const char *const type_names[] = {"object", "array", "string", "number", "integer", "boolean", "null"};

static kiln_status gen_type(conv *c, json_t *s, const char *type, const char *ptr, sb *out) {
    if (strcmp(type, "object") == 0) return gen_object(c, s, ptr, out);
    if (strcmp(type, "array") == 0) return gen_array(c, s, ptr, out);
    if (strcmp(type, "string") == 0) return gen_string(c, s, ptr, out);
    if (strcmp(type, "number") == 0) return sb_str(out, "jnumber"), KILN_OK;
    if (strcmp(type, "integer") == 0) return gen_int(s, ptr, out);
    if (strcmp(type, "boolean") == 0) return sb_str(out, "jbool"), KILN_OK;
    if (strcmp(type, "null") == 0) return sb_str(out, "jnull"), KILN_OK;
    return kiln_fail(KILN_ERR_FORMAT, "json schema %s/type: '%s' is not a JSON Schema type", ptr, type);
}

/* The type a schema's other keywords imply when it names none (properties: an object, items: an array, ...). */
static const char *implied_type(json_t *s) {
    static const struct {
        const char *kw, *type;
    } kws[] = {{"properties", "object"}, {"additionalProperties", "object"},
               {"required", "object"},   {"items", "array"},
               {"prefixItems", "array"}, {"minItems", "array"},
               {"maxItems", "array"},    {"minLength", "string"},
               {"maxLength", "string"},  {"pattern", "string"}};
    for (size_t i = 0; i < sizeof kws / sizeof *kws; i++)
        if (json_object_get(s, kws[i].kw)) return kws[i].type;
    return NULL;
}

static kiln_status gen_schema(conv *c, json_t *s, const char *ptr, sb *out) {
    if (json_is_true(s)) return sb_str(out, "jvalue"), KILN_OK;
    if (json_is_false(s)) return kiln_fail(KILN_ERR_UNSUPPORTED, "json schema %s: a false schema (it matches nothing)", at(ptr));
    if (!json_is_object(s)) return kiln_fail(KILN_ERR_FORMAT, "json schema %s: a schema is an object or a boolean", at(ptr));
    kiln_status st = check_keywords(s, ptr);
    if (st) return st;
    json_t *ref = json_object_get(s, "$ref"), *cnst = json_object_get(s, "const"), *en = json_object_get(s, "enum");
    json_t *any = json_object_get(s, "anyOf"), *one = json_object_get(s, "oneOf"), *all = json_object_get(s, "allOf");
    json_t *type = json_object_get(s, "type");
    if (ref) return gen_ref(c, ref, ptr, out);
    if (cnst) return put_value_literal(out, cnst);
    if (en) {
        if (!json_is_array(en) || json_array_size(en) == 0)
            return kiln_fail(KILN_ERR_FORMAT, "json schema %s/enum: not a non-empty array", ptr);
        size_t i;
        json_t *v;
        sb_str(out, "( ");
        json_array_foreach(en, i, v) {
            if (i) sb_str(out, " | ");
            if ((st = put_value_literal(out, v))) return st;
        }
        sb_str(out, " )");
        return KILN_OK;
    }
    if (any && one) return kiln_fail(KILN_ERR_UNSUPPORTED, "json schema %s: anyOf together with oneOf", at(ptr));
    if (any || one) {
        if (type || all)
            return kiln_fail(KILN_ERR_UNSUPPORTED, "json schema %s: %s together with %s", at(ptr), any ? "anyOf" : "oneOf",
                             type ? "type" : "allOf");
        return gen_alts(c, any ? any : one, ptr, any ? "anyOf" : "oneOf", out);
    }
    if (all) {
        if (type && !(json_is_string(type) && strcmp(json_string_value(type), "object") == 0))
            return kiln_fail(KILN_ERR_UNSUPPORTED, "json schema %s/allOf: only allOf of objects is supported", ptr);
        return gen_object(c, s, ptr, out); /* collect_props refuses members that are not objects' */
    }
    if (!type) {
        const char *t = implied_type(s);
        if (t) return gen_type(c, s, t, ptr, out);
        sb_str(out, "jvalue"); /* {} or only annotations: any JSON value */
        return KILN_OK;
    }
    if (json_is_string(type)) return gen_type(c, s, json_string_value(type), ptr, out);
    if (!json_is_array(type) || json_array_size(type) == 0)
        return kiln_fail(KILN_ERR_FORMAT, "json schema %s/type: not a type name or an array of them", ptr);
    size_t i;
    json_t *v;
    sb_str(out, "( ");
    json_array_foreach(type, i, v) {
        if (!json_is_string(v)) return kiln_fail(KILN_ERR_FORMAT, "json schema %s/type/%zu: not a type name", ptr, i);
        bool known = false;
        for (size_t k = 0; k < sizeof type_names / sizeof *type_names; k++)
            known = known || strcmp(json_string_value(v), type_names[k]) == 0;
        if (!known)
            return kiln_fail(KILN_ERR_FORMAT, "json schema %s/type/%zu: '%s' is not a JSON Schema type", ptr, i, json_string_value(v));
        if (i) sb_str(out, " | ");
        if ((st = gen_type(c, s, json_string_value(v), ptr, out))) return st;
    }
    sb_str(out, " )");
    return KILN_OK;
}

static kiln_status gen(conv *c, json_t *s, const char *ptr, sb *out) {
    if (++c->depth > 64) {
        c->depth--;
        return kiln_fail(KILN_ERR_UNSUPPORTED, "json schema %s: nested deeper than 64", at(ptr));
    }
    kiln_status st = gen_schema(c, s, ptr, out);
    c->depth--;
    if (!st && (out->oom || c->rules.oom)) st = kiln_fail(KILN_ERR_NOMEM, "json schema: out of memory");
    return st;
}

kiln_status kiln_json_schema_to_gbnf(const char *schema, size_t len, char **gbnf, size_t *n) {
    if (!schema || !gbnf || !n) return kiln_fail(KILN_ERR_INVALID, "json schema: NULL argument");
    *gbnf = NULL, *n = 0;
    json_error_t je;
    json_t *root = json_loadb(schema, len, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &je);
    if (!root) return kiln_fail(KILN_ERR_FORMAT, "json schema: line %d, column %d: %s", je.line, je.column, je.text);
    conv c = {.root = root};
    sb top = {0};
    sb_str(&top, "root ::= ");
    kiln_status st = gen(&c, root, "", &top);
    if (!st) {
        sb_str(&top, "\n");
        sb_put(&top, c.rules.s ? c.rules.s : "", c.rules.n);
        sb_str(&top, base_rules);
        if (top.oom) st = kiln_fail(KILN_ERR_NOMEM, "json schema: out of memory");
    }
    for (int i = 0; i < c.n_refs; i++) free(c.refs[i].ref), free(c.refs[i].name);
    free(c.refs), free(c.rules.s);
    json_decref(root);
    if (st) {
        free(top.s);
        return st;
    }
    *gbnf = top.s, *n = top.n;
    return KILN_OK;
}
