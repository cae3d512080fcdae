/* json_schema_scalar.c: the GBNF of json_schema.c's leaf schemas: a string's length, format or pattern (an ECMA-262
 * regex turned into GBNF over JSON string content), and an integer's bounds as the digit strings of the range, split
 * by length and by leading digit. Tested through kiln_json_schema_to_gbnf by tests/test_json_schema.c. */
#include "json_schema_impl.h"
#include "status.h"

#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- literals and counts, json_schema.c's too */

/* A GBNF literal of the bytes s[0..n): quotes and backslashes escaped, bytes below 0x20 as \xHH. */
void js_put_literal(sb *b, const char *s, size_t n) {
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

/* A non-negative integer keyword into *v (-1 when absent). */
kiln_status js_get_count(json_t *s, const char *key, const char *ptr, int64_t *v) {
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
    js_put_literal(b, u, (size_t)n);
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

kiln_status js_gen_string(conv *c, json_t *s, const char *ptr, sb *out) {
    json_t *pat = json_object_get(s, "pattern"), *fmt = json_object_get(s, "format");
    int64_t lo, hi;
    kiln_status st = js_get_count(s, "minLength", ptr, &lo);
    if (!st) st = js_get_count(s, "maxLength", ptr, &hi);
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
kiln_status js_gen_int(json_t *s, const char *ptr, sb *out) {
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
