/* json_schema.c: a JSON Schema turned into a GBNF grammar (grammar.c's syntax) whose root matches the JSON texts
 * valid under it, for the common subset (docs/grammars.md lists it): the walk over the schema (objects, arrays, $ref,
 * anyOf/oneOf/allOf, types) and kiln_json_schema_to_gbnf; json_schema_scalar.c writes strings and integers. Tested by
 * tests/test_json_schema.c (texts, errors, sampling) and tests/test_json_schema.sh (kiln generate).
 *
 * Each subschema becomes a GBNF expression appended to a string; objects, arrays, $ref targets and patterns that need
 * rules of their own get them in a second string (rules), named by kind and a counter. A $ref target's rule is named
 * before its body is written, so recursive schemas refer to it. The shared JSON rules (strings, numbers, any value)
 * come last. Whitespace is optional only where JSON allows it between tokens, and bounded (one space, or a newline
 * and up to 4 spaces) so that sampling ends. Numbers are bounded too (16 integer digits, 16 of fraction, 2 of
 * exponent, so no number overflows a double), as llama.cpp's converter bounds them. An object's properties come in the schema's order, the
 * required ones always, the optional ones maybe; without additionalProperties an object with properties has no others.
 *
 * Keywords that change validity and that this does not handle are KILN_ERR_UNSUPPORTED naming the keyword and its
 * JSON pointer; bad values (a minItems above maxItems, a $ref that does not resolve) KILN_ERR_FORMAT naming the
 * pointer. Annotations (title, description, default, examples, $comment, ...) and unknown keywords are ignored. */
#include "json_schema_impl.h"
#include "status.h"

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- the converter */

static kiln_status gen(conv *c, json_t *s, const char *ptr, sb *out);

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

/* A JSON value as it is written compactly, as a GBNF literal. */
static kiln_status put_value_literal(sb *b, const json_t *v) {
    char *t = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!t) return kiln_fail(KILN_ERR_NOMEM, "json schema: a value could not be written");
    js_put_literal(b, t, strlen(t));
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

/* ---------------------------------------------------------------- the shared JSON rules */

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
    kiln_status st = js_get_count(s, "minItems", ptr, &lo);
    if (!st) st = js_get_count(s, "maxItems", ptr, &hi);
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
                js_put_literal(&kv, enc, strlen(enc));
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

static const char *const type_names[] = {"object", "array", "string", "number", "integer", "boolean", "null"};

static kiln_status gen_type(conv *c, json_t *s, const char *type, const char *ptr, sb *out) {
    if (strcmp(type, "object") == 0) return gen_object(c, s, ptr, out);
    if (strcmp(type, "array") == 0) return gen_array(c, s, ptr, out);
    if (strcmp(type, "string") == 0) return js_gen_string(c, s, ptr, out);
    if (strcmp(type, "number") == 0) return sb_str(out, "jnumber"), KILN_OK;
    if (strcmp(type, "integer") == 0) return js_gen_int(s, ptr, out);
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