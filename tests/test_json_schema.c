/* test_json_schema.c: JSON Schema to GBNF (src/infer/json_schema.c).
 *   texts        for each schema, hand-written JSON texts that are valid ("F") or not ("-", or "P" a proper prefix of a
 *                valid one) under it, through kiln_grammar_match_text on the converted grammar
 *   errors       malformed JSON (line and column), unsupported keywords (named with their JSON pointer), bad values
 *   sampling     random logits, greedy under the grammar's mask on the bundled model's vocab: every text parses with
 *                jansson and satisfies its schema, as checked here by hand */
#include "kiln.h"
#include "test.h"

#include <jansson.h>
#include <math.h>
#include <stdint.h>

static kiln_grammar *convert(const char *schema) {
    char *gbnf = NULL;
    size_t n = 0;
    if (kiln_json_schema_to_gbnf(schema, strlen(schema), &gbnf, &n) != KILN_OK) return NULL;
    kiln_grammar *g = NULL;
    if (strlen(gbnf) != n || kiln_grammar_parse(gbnf, n, NULL, &g) != KILN_OK) g = NULL;
    free(gbnf);
    return g;
}

typedef struct {
    const char *text, *want; /* "F" valid, "P" a proper prefix of a valid text, "-" neither */
} sent;

static void check_texts(const char *schema, const sent *cases, size_t n) {
    kiln_grammar *g = convert(schema);
    CHECK(g, "%s: %s", schema, kiln_last_error());
    for (size_t i = 0; i < n; i++) {
        bool full, prefix;
        CHECK(kiln_grammar_match_text(g, cases[i].text, strlen(cases[i].text), &full, &prefix) == KILN_OK);
        const char *got = full ? "F" : prefix ? "P" : "-";
        if (strcmp(got, cases[i].want) != 0) {
            kiln_grammar_free(g);
            CHECK(0, "schema %s: '%s' is %s, want %s", schema, cases[i].text, got, cases[i].want);
        }
    }
    kiln_grammar_free(g);
}
#define TEXTS(schema, ...)                                                                                                                 \
    do {                                                                                                                                   \
        static const sent c_[] = {__VA_ARGS__};                                                                                            \
        check_texts(schema, c_, sizeof c_ / sizeof *c_);                                                                                   \
    } while (0)

static void test_scalars(void) {
    TEXTS("{\"type\":\"integer\"}", {"0", "F"}, {"-12", "F"}, {"012", "-"}, {"1.5", "-"}, {"-", "P"}, {"\"1\"", "-"}, {"1e3", "-"});
    TEXTS("{\"type\":\"integer\",\"minimum\":-15,\"maximum\":230}", {"-15", "F"}, {"-16", "-"}, {"-9", "F"}, {"0", "F"}, {"-0", "-"},
          {"7", "F"}, {"99", "F"}, {"100", "F"}, {"199", "F"}, {"229", "F"}, {"230", "F"}, {"231", "-"}, {"240", "-"}, {"300", "-"},
          {"1000", "-"}, {"-20", "-"}, {"-100", "-"}, {"23", "F"});
    TEXTS("{\"type\":\"integer\",\"exclusiveMinimum\":99}", {"99", "P"}, {"100", "F"}, {"5", "P"}, {"50", "P"}, {"0", "-"},
          {"1234567", "F"}, {"-1", "-"}, {"123", "F"}, {"10", "P"});
    TEXTS("{\"type\":\"integer\",\"maximum\":-3.5}", {"-4", "F"}, {"-3", "P"}, {"-30", "F"}, {"-1000", "F"}, {"0", "-"}, {"1", "-"});
    TEXTS("{\"type\":\"integer\",\"minimum\":1024,\"exclusiveMaximum\":1100}", {"1024", "F"}, {"1099", "F"}, {"1100", "-"}, {"1023", "-"},
          {"1050", "F"}, {"1030", "F"}, {"1020", "-"}, {"999", "-"});
    TEXTS("{\"type\":\"integer\",\"minimum\":5,\"maximum\":5}", {"5", "F"}, {"4", "-"}, {"6", "-"}, {"55", "-"});
    TEXTS("{\"type\":\"number\"}", {"0", "F"}, {"-1.25", "F"}, {"1e-7", "F"}, {"2.5E+10", "F"}, {"1.", "P"}, {".5", "-"}, {"01", "-"},
          {"NaN", "-"}, {"-0.0", "F"});
    TEXTS("{\"type\":\"boolean\"}", {"true", "F"}, {"false", "F"}, {"tru", "P"}, {"True", "-"}, {"null", "-"});
    TEXTS("{\"type\":\"null\"}", {"null", "F"}, {"nul", "P"}, {"0", "-"});
    TEXTS("{\"type\":[\"integer\",\"null\"]}", {"7", "F"}, {"null", "F"}, {"true", "-"}, {"7.5", "-"});
    TEXTS("{\"const\":{\"a\":[1,\"x\"]}}", {"{\"a\":[1,\"x\"]}", "F"}, {"{\"a\":[1]}", "-"}, {"{\"a\"", "P"});
    TEXTS("{\"enum\":[\"red\",42,null,true,[1]]}", {"\"red\"", "F"}, {"42", "F"}, {"null", "F"}, {"true", "F"}, {"[1]", "F"},
          {"\"blue\"", "-"}, {"43", "-"}, {"false", "-"});
}

/* Integer bounds against arithmetic: every integer of -1200 .. 1200 is matched exactly when it is within them. */
static void test_int_ranges(void) {
    static const struct {
        int lo, hi; /* INT32_MIN / INT32_MAX: no bound */
    } r[] = {{0, 9},       {1, 10},    {-1, 1},        {-7, -7},       {-999, -100},     {7, 1000},       {19, 81},          {100, 109},
             {-1000, 999}, {101, 990}, {0, INT32_MAX}, {3, INT32_MAX}, {-55, INT32_MAX}, {INT32_MIN, 12}, {INT32_MIN, -120}, {1001, 1002}};
    for (size_t i = 0; i < sizeof r / sizeof *r; i++) {
        char schema[160], num[16];
        int n = snprintf(schema, sizeof schema, "{\"type\":\"integer\"");
        if (r[i].lo != INT32_MIN) n += snprintf(schema + n, sizeof schema - n, ",\"minimum\":%d", r[i].lo);
        if (r[i].hi != INT32_MAX) n += snprintf(schema + n, sizeof schema - n, ",\"maximum\":%d", r[i].hi);
        snprintf(schema + n, sizeof schema - n, "}");
        kiln_grammar *g = convert(schema);
        CHECK(g, "%s: %s", schema, kiln_last_error());
        for (int v = -1200; v <= 1200; v++) {
            bool full, prefix;
            snprintf(num, sizeof num, "%d", v);
            kiln_grammar_match_text(g, num, strlen(num), &full, &prefix);
            if (full != (v >= r[i].lo && v <= r[i].hi)) {
                kiln_grammar_free(g);
                CHECK(0, "%s: %d is %s", schema, v, full ? "matched" : "not matched");
            }
        }
        kiln_grammar_free(g);
    }
}

static void test_strings(void) {
    /* escapes: the seven short ones, \u (a surrogate only as a pair), no raw controls */
    TEXTS("{\"type\":\"string\"}", {"\"\"", "F"}, {"\"abc\"", "F"}, {"\"a\\\"b\\\\c\\/d\\b\\f\\n\\r\\t\"", "F"},
          {"\"\\u00e9\\uABCD\"", "F"}, {"\"\\ud83d\\ude00\"", "F"}, {"\"\\ud83d\"", "-"}, {"\"\\ude00\"", "-"}, {"\"a\nb\"", "-"},
          {"\"\x01\"", "-"}, {"\"\\x41\"", "-"}, {"\"\\u12\"", "-"}, {"\"\xc3\xa9\xe2\x82\xac\"", "F"}, {"\"abc", "P"}, {"abc", "-"});
    TEXTS("{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}", {"\"ab\"", "F"}, {"\"abc\"", "F"}, {"\"a\"", "-"}, {"\"abcd\"", "-"},
          {"\"\\n\\t\"", "F"}, {"\"\xc3\xa9\xc3\xa9\xc3\xa9\"", "F"}, {"\"\\ud83d\\ude00x\"", "F"});
    TEXTS("{\"maxLength\":0}", {"\"\"", "F"}, {"\"a\"", "-"});
    TEXTS("{\"type\":\"string\",\"enum\":[\"a\\\"b\",\"c\\\\d\"]}", {"\"a\\\"b\"", "F"}, {"\"c\\\\d\"", "F"}, {"\"a\"", "-"});
    TEXTS("{\"type\":\"string\",\"format\":\"date\"}", {"\"2024-02-29\"", "F"}, {"\"2024-13-01\"", "-"}, {"\"2024-1-01\"", "-"},
          {"\"2024-12-32\"", "-"});
    TEXTS("{\"type\":\"string\",\"format\":\"time\"}", {"\"23:59:59Z\"", "F"}, {"\"12:00:00.123+02:00\"", "F"}, {"\"24:00:00Z\"", "-"},
          {"\"12:00:00", "P"}, {"\"12:00:00\"", "-"});
    TEXTS("{\"type\":\"string\",\"format\":\"uuid\"}", {"\"123e4567-e89b-12d3-a456-426614174000\"", "F"},
          {"\"123e4567-e89b-12d3-a456-42661417400\"", "-"}, {"\"123e4567e89b12d3a456426614174000\"", "-"});
    TEXTS("{\"type\":\"string\",\"format\":\"email\"}", {"\"anything\"", "F"}); /* other formats are annotations */
}

static void test_patterns(void) {
    TEXTS("{\"type\":\"string\",\"pattern\":\"^[a-c]+[0-9]{2,3}$\"}", {"\"ab12\"", "F"}, {"\"c123\"", "F"}, {"\"ab1\"", "-"},
          {"\"ab1234\"", "-"}, {"\"12\"", "-"}, {"\"d12\"", "-"});
    TEXTS("{\"pattern\":\"^(foo|ba(r|z))?-\\\\d*$\"}", {"\"foo-\"", "F"}, {"\"baz-12\"", "F"}, {"\"-\"", "F"}, {"\"bar\"", "-"},
          {"\"fo-\"", "-"}, {"\"baz-1a\"", "-"});
    /* unanchored: the match may be anywhere */
    TEXTS("{\"pattern\":\"ab\"}", {"\"ab\"", "F"}, {"\"xxabyy\"", "F"}, {"\"a b\"", "-"});
    TEXTS("{\"pattern\":\"^ab\"}", {"\"abyy\"", "F"}, {"\"xab\"", "-"});
    TEXTS("{\"pattern\":\"ab$\"}", {"\"xab\"", "F"}, {"\"abx\"", "-"});
    /* quotes, backslashes and controls in the pattern are written escaped in the JSON text */
    TEXTS("{\"pattern\":\"^a\\\"\\\\\\\\\\\\n[\\\\s]$\"}", {"\"a\\\"\\\\\\n \"", "F"}, {"\"a\\\"\\\\\\n\\t\"", "F"},
          {"\"a\\\"\\\\\\nx\"", "-"});
    /* negated classes and . leave out what they should, escaped or not */
    TEXTS("{\"pattern\":\"^[^a\\\"]\\\\W.$\"}", {"\"b!x\"", "F"}, {"\"\\\\ \\t\"", "F"}, {"\"a!x\"", "-"}, {"\"\\\"!x\"", "-"},
          {"\"bax\"", "-"}, {"\"b!\\n\"", "-"});
    TEXTS("{\"pattern\":\"^(a|b)$\"}", {"\"a\"", "F"}, {"\"b\"", "F"}, {"\"ab\"", "-"});
    TEXTS("{\"pattern\":\"a|b\"}", {"\"xbx\"", "F"}, {"\"xax\"", "F"}, {"\"xx\"", "-"});
    TEXTS("{\"pattern\":\"^(?:x{2}|y{1,})z?$\"}", {"\"xx\"", "F"}, {"\"yyyz\"", "F"}, {"\"x\"", "-"}, {"\"xxx\"", "-"});
    TEXTS("{\"pattern\":\"^\\\\.\\\\u00e9[-+]$\"}", {"\".\xc3\xa9-\"", "F"}, {"\".\xc3\xa9+\"", "F"}, {"\"x\xc3\xa9-\"", "-"});
}

static void test_arrays(void) {
    TEXTS("{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":1,\"maxItems\":3}", {"[1]", "F"}, {"[1,2,3]", "F"},
          {"[ 1 , 2 ]", "F"}, {"[]", "-"}, {"[1,2,3,4]", "-"}, {"[1,]", "-"}, {"[\"a\"]", "-"}, {"[1,2", "P"});
    TEXTS("{\"type\":\"array\"}", {"[]", "F"}, {"[1,\"a\",[null],{\"k\":false}]", "F"}, {"[1 2]", "-"});
    TEXTS("{\"type\":\"array\",\"maxItems\":0}", {"[]", "F"}, {"[1]", "-"});
    TEXTS("{\"prefixItems\":[{\"type\":\"string\"},{\"type\":\"integer\"}],\"items\":false}", {"[]", "F"}, {"[\"a\"]", "F"},
          {"[\"a\",1]", "F"}, {"[\"a\",1,2]", "-"}, {"[1]", "-"});
    TEXTS("{\"prefixItems\":[{\"const\":1}],\"items\":{\"type\":\"boolean\"},\"minItems\":2,\"maxItems\":3}", {"[1,true]", "F"},
          {"[1,true,false]", "F"}, {"[1]", "-"}, {"[1,true,false,true]", "-"}, {"[true,true]", "-"});
    TEXTS("{\"items\":{\"type\":\"array\",\"items\":{\"type\":\"null\"},\"maxItems\":1}}", {"[[],[null]]", "F"}, {"[[null,null]]", "-"});
}

static void test_objects(void) {
    const char *s = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\"},"
                    "\"c\":{\"type\":\"boolean\"}},\"required\":[\"b\"]}";
    TEXTS(s, {"{\"b\":\"x\"}", "F"}, {"{\"a\":1,\"b\":\"x\"}", "F"}, {"{\"a\":1,\"b\":\"x\",\"c\":true}", "F"},
          {"{\"b\":\"x\",\"c\":false}", "F"}, {"{ \"a\" : 1 ,\n  \"b\": \"x\" }", "F"}, {"{\"a\":1}", "-"}, {"{\"a\":1", "P"}, {"{}", "-"},
          {"{\"b\":\"x\",\"a\":1}", "-"}, {"{\"b\":\"x\",\"d\":1}", "-"}, {"{\"a\":1,,\"b\":\"x\"}", "-"}, {"{,\"b\":\"x\"}", "-"},
          {"{\"b\":\"x\",}", "-"});
    /* no required: every subset, in order */
    TEXTS("{\"properties\":{\"x\":{\"const\":1},\"y\":{\"const\":2}}}", {"{}", "F"}, {"{\"x\":1}", "F"}, {"{\"y\":2}", "F"},
          {"{\"x\":1,\"y\":2}", "F"}, {"{\"y\":2,\"x\":1}", "-"});
    TEXTS("{\"properties\":{\"x\":{\"const\":1}},\"required\":[\"x\"],\"additionalProperties\":{\"type\":\"integer\"}}", {"{\"x\":1}", "F"},
          {"{\"x\":1,\"q\":5,\"r\":6}", "F"}, {"{\"x\":1,\"q\":\"s\"}", "-"});
    TEXTS("{\"type\":\"object\"}", {"{}", "F"}, {"{\"k\":[1,{\"z\":null}],\"j\":\"v\"}", "F"}, {"{\"k\"}", "-"}, {"{1:2}", "-"});
    TEXTS("{\"type\":\"object\",\"additionalProperties\":false}", {"{}", "F"}, {"{\"a\":1}", "-"});
    TEXTS("{\"properties\":{\"k\\\"/\\u00e9\":{\"type\":\"null\"}},\"required\":[\"k\\\"/\\u00e9\"]}", {"{\"k\\\"/\xc3\xa9\":null}", "F"},
          {"{\"k\":null}", "-"});
    /* allOf of objects merges properties and required */
    TEXTS("{\"allOf\":[{\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]},{\"$ref\":\"#/$defs/b\"}],"
          "\"$defs\":{\"b\":{\"properties\":{\"b\":{\"type\":\"integer\"}}}}}",
          {"{\"a\":1}", "F"}, {"{\"a\":1,\"b\":2}", "F"}, {"{\"b\":2}", "-"});
}

static void test_combinators(void) {
    TEXTS("{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"string\",\"maxLength\":1}]}", {"5", "F"}, {"\"a\"", "F"}, {"\"ab\"", "-"},
          {"null", "-"});
    TEXTS("{\"oneOf\":[{\"const\":\"a\"},{\"type\":\"array\",\"items\":{\"const\":0}}]}", {"\"a\"", "F"}, {"[0,0]", "F"}, {"[1]", "-"});
    TEXTS("{}", {"1", "F"}, {"\"s\"", "F"}, {"{\"a\":[true,null,-1.5e3]}", "F"}, {"tru", "P"}, {"{\"a\" 1}", "-"}, {"[1,]", "-"});
    TEXTS("true", {"null", "F"}, {"[]", "F"});
    /* $ref to $defs and definitions, and a recursive one */
    TEXTS("{\"$defs\":{\"n\":{\"type\":\"integer\"}},\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/n\"}}", {"[1,2]", "F"},
          {"[\"1\"]", "-"});
    TEXTS("{\"definitions\":{\"t\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},"
          "\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/definitions/t\"}}},\"required\":[\"v\"]}},\"$ref\":\"#/definitions/t\"}",
          {"{\"v\":1}", "F"}, {"{\"v\":1,\"kids\":[{\"v\":2,\"kids\":[{\"v\":3}]},{\"v\":4}]}", "F"}, {"{\"v\":1,\"kids\":[{}]}", "-"});
    /* annotations and unknown keywords are ignored */
    TEXTS("{\"title\":\"t\",\"description\":\"d\",\"default\":1,\"examples\":[1],\"$schema\":\"x\",\"x-foo\":3,\"type\":\"integer\"}",
          {"1", "F"}, {"\"1\"", "-"});
}

static void test_errors(void) {
    static const struct {
        const char *schema;
        kiln_status st;
        const char *want;
    } bad[] = {
        {"{\"type\":", KILN_ERR_FORMAT, "line 1, column 8"},
        {"{\"a\":1,\n \"a\":2}", KILN_ERR_FORMAT, "line 2"},
        {"{\"not\":{\"type\":\"null\"}}", KILN_ERR_UNSUPPORTED, "json schema /: the keyword 'not' is not supported"},
        {"{\"properties\":{\"a\":{\"if\":{}}}}", KILN_ERR_UNSUPPORTED, "json schema /properties/a: the keyword 'if'"},
        {"{\"patternProperties\":{}}", KILN_ERR_UNSUPPORTED, "'patternProperties'"},
        {"{\"items\":{\"minimum\":3}}", KILN_ERR_UNSUPPORTED, "json schema /items: the keyword 'minimum'"},
        {"{\"type\":\"number\",\"maximum\":3}", KILN_ERR_UNSUPPORTED, "json schema /: the keyword 'maximum'"},
        {"{\"type\":\"integer\",\"minimum\":3,\"exclusiveMaximum\":3}", KILN_ERR_FORMAT, "no integer is within minimum 3 and maximum 2"},
        {"{\"type\":\"integer\",\"minimum\":1e20}", KILN_ERR_UNSUPPORTED, "/minimum: beyond +-1e15"},
        {"{\"type\":\"integer\",\"minimum\":1,\"exclusiveMinimum\":true}", KILN_ERR_UNSUPPORTED, "/exclusiveMinimum: not a number"},
        {"{\"type\":\"array\",\"uniqueItems\":true}", KILN_ERR_UNSUPPORTED, "'uniqueItems'"},
        {"{\"anyOf\":[{},{\"multipleOf\":2}]}", KILN_ERR_UNSUPPORTED, "json schema /anyOf/1: the keyword 'multipleOf'"},
        {"{\"properties\":{\"a/b~\":{\"not\":{}}}}", KILN_ERR_UNSUPPORTED, "/properties/a~1b~0:"},
        {"{\"type\":\"array\",\"minItems\":3,\"maxItems\":2}", KILN_ERR_FORMAT, "json schema /: minItems 3 is above maxItems 2"},
        {"{\"items\":{\"minLength\":5,\"maxLength\":1}}", KILN_ERR_FORMAT, "json schema /items: minLength 5 is above maxLength 1"},
        {"{\"minItems\":-1}", KILN_ERR_FORMAT, "/minItems: not a non-negative integer"},
        {"{\"maxLength\":\"3\"}", KILN_ERR_FORMAT, "/maxLength: not a non-negative integer"},
        {"{\"$ref\":\"#/$defs/missing\"}", KILN_ERR_FORMAT, "json schema /$ref: '#/$defs/missing' does not resolve"},
        {"{\"items\":{\"$ref\":\"#/definitions/x\"},\"definitions\":{}}", KILN_ERR_FORMAT,
         "/items/$ref: '#/definitions/x' does not resolve"},
        {"{\"$ref\":\"other.json#/a\"}", KILN_ERR_UNSUPPORTED, "/$ref: 'other.json#/a' is not within the document"},
        {"{\"type\":\"float\"}", KILN_ERR_FORMAT, "/type: 'float' is not a JSON Schema type"},
        {"{\"type\":[\"string\",7]}", KILN_ERR_FORMAT, "/type/1: not a type name"},
        {"{\"enum\":[]}", KILN_ERR_FORMAT, "/enum: not a non-empty array"},
        {"{\"required\":[\"a\"]}", KILN_ERR_UNSUPPORTED, "/required/0: 'a' is not among the properties"},
        {"7", KILN_ERR_FORMAT, "a schema is an object or a boolean"},
        {"false", KILN_ERR_UNSUPPORTED, "a false schema"},
        {"{\"pattern\":\"^a(?=b)$\"}", KILN_ERR_UNSUPPORTED, "json schema /pattern: a group of (? other than (?: at offset 3"},
        {"{\"pattern\":\"(a)\\\\1\"}", KILN_ERR_UNSUPPORTED, "/pattern: an escape (back-references"},
        {"{\"pattern\":\"a^b\"}", KILN_ERR_UNSUPPORTED, "an anchor inside the pattern at offset 1"},
        {"{\"pattern\":\"[abc\"}", KILN_ERR_FORMAT, "/pattern: a class without its closing ]"},
        {"{\"pattern\":\"(ab\"}", KILN_ERR_FORMAT, "a ( without its closing )"},
        {"{\"pattern\":\"ab)\"}", KILN_ERR_FORMAT, "a ) without its ("},
        {"{\"pattern\":\"*a\"}", KILN_ERR_FORMAT, "a repetition of nothing"},
        {"{\"pattern\":\"a{3,1}\"}", KILN_ERR_FORMAT, "a bad {m,n}"},
        {"{\"pattern\":\"[z-a]\"}", KILN_ERR_FORMAT, "a class range whose end is before its start"},
        {"{\"allOf\":[{\"type\":\"string\"}],\"type\":\"string\"}", KILN_ERR_UNSUPPORTED, "only allOf of objects"},
        {"{\"items\":[{}]}", KILN_ERR_UNSUPPORTED, "/items: an array of schemas"},
        {"{\"pattern\":\"^a|b$\"}", KILN_ERR_UNSUPPORTED, "an anchor with a | outside groups"},
        {"{\"allOf\":[{\"anyOf\":[{}]}]}", KILN_ERR_UNSUPPORTED, "json schema /allOf/0: 'anyOf' in a member of allOf"},
        {"{\"allOf\":[{\"type\":\"string\"}]}", KILN_ERR_UNSUPPORTED, "/allOf/0/type: a member of allOf that is not an object"},
        {"{\"maxLength\":10001}", KILN_ERR_UNSUPPORTED, "/maxLength: 10001 is above the 10000 supported"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char *gbnf = (char *)1;
        size_t n = 7;
        kiln_status s = kiln_json_schema_to_gbnf(bad[i].schema, strlen(bad[i].schema), &gbnf, &n);
        CHECK(s == bad[i].st && !gbnf && n == 0, "case %zu (%s): status %d", i, bad[i].schema, (int)s);
        CHECK(strstr(kiln_last_error(), bad[i].want), "case %zu: '%s' lacks '%s'", i, kiln_last_error(), bad[i].want);
        CHECK(!strchr(kiln_last_error(), '\n'), "case %zu: not one line: %s", i, kiln_last_error());
    }
}

/* ---------------------------------------------------------------- sampling walks */

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s >> 12, *s ^= *s << 25, *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

/* One greedy walk of random logits under g; the text (malloc'd) or NULL with the failure in msg. */
static char *walk(const kiln_grammar *g, const kiln_tokenizer *tok, uint64_t seed, char *msg, size_t n_msg) {
    const int32_t V = kiln_tokenizer_n_vocab(tok), eos = kiln_tokenizer_eos(tok);
    kiln_grammar_matcher *m = NULL;
    float *lg = malloc((size_t)V * sizeof *lg);
    char *text = calloc(1, 8192);
    size_t n = 0;
    bool ok = lg && text && kiln_grammar_matcher_new(g, tok, &m) == KILN_OK, ended = false;
    if (!ok) snprintf(msg, n_msg, "setup: %s", kiln_last_error());
    for (int step = 0; ok && step < 1000; step++) {
        for (int32_t i = 0; i < V; i++) lg[i] = (float)(rng_next(&seed) >> 40) / 16777216.0f;
        if (kiln_grammar_matcher_mask(m, lg) != KILN_OK) {
            snprintf(msg, n_msg, "step %d, text '%s': mask: %s", step, text, kiln_last_error());
            ok = false;
            break;
        }
        int32_t best = -1;
        for (int32_t i = 0; i < V; i++)
            if (lg[i] != -INFINITY && (best < 0 || lg[i] > lg[best])) best = i;
        if (best == eos) {
            ended = true;
            break;
        }
        size_t np = 0;
        if (kiln_grammar_matcher_accept(m, best) != KILN_OK || kiln_tokenizer_piece(tok, best, false, text + n, 8191 - n, &np) != KILN_OK ||
            n + np >= 8191) {
            snprintf(msg, n_msg, "step %d: accept or the text's buffer: %s", step, kiln_last_error());
            ok = false;
        }
        n += np, text[n] = 0;
    }
    if (ok && !ended) snprintf(msg, n_msg, "the walk did not end in 1000 tokens: '%.300s'", text), ok = false;
    kiln_grammar_matcher_free(m);
    free(lg);
    if (!ok) free(text);
    return ok ? text : NULL;
}

/* The schemas walked, each with a check written by hand of what it allows. */
static bool str_len_ok(const json_t *v, size_t lo, size_t hi) {
    if (!json_is_string(v)) return false;
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)json_string_value(v); *p; p++) n += (*p & 0xc0) != 0x80;
    return n >= lo && n <= hi;
}

static bool check_person(const json_t *o) {
    /* {name: string 1..8 (required), age: integer 0..120 (required), tags: array of "a"/"b"/3/null up to 3, kind: "x\"y"} */
    if (!json_is_object(o)) return false;
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)o, k, v) {
        if (strcmp(k, "name") == 0) {
            if (!str_len_ok(v, 1, 8)) return false;
        } else if (strcmp(k, "age") == 0) {
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 120) return false;
        } else if (strcmp(k, "tags") == 0) {
            if (!json_is_array(v) || json_array_size(v) > 3) return false;
            size_t i;
            json_t *t;
            json_array_foreach(v, i, t) if (!(json_is_null(t) || (json_is_integer(t) && json_integer_value(t) == 3) ||
                                              (json_is_string(t) && (strcmp(json_string_value(t), "a") == 0 ||
                                                                     strcmp(json_string_value(t), "b") == 0)))) return false;
        } else if (strcmp(k, "kind") == 0) {
            if (!json_is_string(v) || strcmp(json_string_value(v), "x\"y") != 0) return false;
        } else
            return false;
    }
    return json_object_get(o, "name") && json_object_get(o, "age");
}

static bool check_points(const json_t *a) {
    /* an array of 1..3 [number, number] pairs or nulls */
    if (!json_is_array(a) || json_array_size(a) < 1 || json_array_size(a) > 3) return false;
    size_t i;
    json_t *p;
    json_array_foreach((json_t *)a, i, p) {
        if (json_is_null(p)) continue;
        if (!json_is_array(p) || json_array_size(p) != 2 || !json_is_number(json_array_get(p, 0)) || !json_is_number(json_array_get(p, 1)))
            return false;
    }
    return true;
}

static bool check_code(const json_t *o) {
    /* {"code": ^[A-Z]{2}-[0-9]{3}$, "when": a date} both required, nothing else */
    if (!json_is_object(o) || json_object_size(o) != 2) return false;
    const json_t *c = json_object_get(o, "code"), *w = json_object_get(o, "when");
    if (!json_is_string(c) || !json_is_string(w) || strlen(json_string_value(c)) != 6 || strlen(json_string_value(w)) != 10) return false;
    const char *s = json_string_value(c), *d = json_string_value(w);
    bool ok = s[0] >= 'A' && s[0] <= 'Z' && s[1] >= 'A' && s[1] <= 'Z' && s[2] == '-';
    for (int i = 3; i < 6; i++) ok = ok && s[i] >= '0' && s[i] <= '9';
    int y, mo, da;
    ok = ok && sscanf(d, "%4d-%2d-%2d", &y, &mo, &da) == 3 && d[4] == '-' && d[7] == '-' && mo >= 1 && mo <= 12 && da >= 1 && da <= 31;
    return ok;
}

static bool check_tree(const json_t *o, int depth) {
    /* {"v": integer (required), "kids": up to 2 trees} */
    if (!json_is_object(o) || depth > 50 || !json_is_integer(json_object_get(o, "v"))) return false;
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)o, k, v) {
        if (strcmp(k, "v") == 0) continue;
        if (strcmp(k, "kids") != 0 || !json_is_array(v) || json_array_size(v) > 2) return false;
        size_t i;
        json_t *t;
        json_array_foreach(v, i, t) if (!check_tree(t, depth + 1)) return false;
    }
    return true;
}

static const struct {
    const char *schema;
    bool (*check)(const json_t *);
} walked[] = {
    {"{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":8},\"age\":{\"type\":\"integer\","
     "\"minimum\":0,"
     "\"maximum\":120},\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\",3,null]},\"maxItems\":3},\"kind\":{\"const\":"
     "\"x\\\"y\"}},"
     "\"required\":[\"name\",\"age\"]}",
     check_person},
    {"{\"type\":\"array\",\"minItems\":1,\"maxItems\":3,\"items\":{\"anyOf\":[{\"type\":\"null\"},"
     "{\"prefixItems\":[{\"type\":\"number\"},{\"type\":\"number\"}],\"items\":false,\"minItems\":2}]}}",
     check_points},
    {"{\"type\":\"object\",\"properties\":{\"code\":{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}-[0-9]{3}$\"},"
     "\"when\":{\"type\":\"string\",\"format\":\"date\"}},\"required\":[\"code\",\"when\"],\"additionalProperties\":false}",
     check_code},
};

static bool check_tree_root(const json_t *o) { return check_tree(o, 0); }

static void test_sampling(void) {
    kiln_tokenizer *tok = NULL;
    if (kiln_tokenizer_load_file("models/shakespeare.gguf", &tok) != KILN_OK) SKIP("models/shakespeare.gguf: %s", kiln_last_error());
    /* the tree, with kids bounded so a walk ends */
    static const char *tree = "{\"$defs\":{\"t\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},"
                              "\"kids\":{\"type\":\"array\",\"maxItems\":2,\"items\":{\"$ref\":\"#/$defs/t\"}}},"
                              "\"required\":[\"v\"],\"additionalProperties\":false}},\"$ref\":\"#/$defs/t\"}";
    char msg[800] = "";
    bool ok = true;
    for (size_t k = 0; ok && k <= sizeof walked / sizeof *walked; k++) {
        const char *schema = k < sizeof walked / sizeof *walked ? walked[k].schema : tree;
        bool (*check)(const json_t *) = k < sizeof walked / sizeof *walked ? walked[k].check : check_tree_root;
        kiln_grammar *g = convert(schema);
        if (!g) {
            snprintf(msg, sizeof msg, "schema %zu: %s", k, kiln_last_error());
            ok = false;
            break;
        }
        for (int s = 0; ok && s < 20; s++) {
            char *text = walk(g, tok, 0x9E3779B97F4A7C15ull + (uint64_t)s * 7919 + k, msg, sizeof msg);
            ok = text != NULL;
            if (ok) {
                json_error_t je;
                json_t *v = json_loads(text, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
                ok = v && check(v);
                if (!ok) snprintf(msg, sizeof msg, "schema %zu, seed %d: '%.400s' %s", k, s, text, v ? "breaks the schema" : je.text);
                json_decref(v);
            }
            free(text);
        }
        kiln_grammar_free(g);
    }
    kiln_tokenizer_free(tok);
    CHECK(ok, "%s", msg);
}

int main(void) {
    RUN(test_scalars);
    RUN(test_int_ranges);
    RUN(test_strings);
    RUN(test_patterns);
    RUN(test_arrays);
    RUN(test_objects);
    RUN(test_combinators);
    RUN(test_errors);
    RUN(test_sampling);
    TEST_EXIT();
}
