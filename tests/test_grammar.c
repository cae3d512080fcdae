/* test_grammar.c: GBNF grammars (src/infer/grammar_parse.c, grammar.c, grammar_vocab.c, grammar_mask.c).
 *   parse errors    each malformed grammar is KILN_ERR_FORMAT with the line and column or the rule in its message
 *   sentences       kiln_grammar_match_text on grammars of every construct: literals and escapes, classes and
 *                   negation, ".", groups, * + ? {m} {m,} {m,n} {,n}, comments, multi-line rules, UTF-8
 *   ambiguous       40 nullable rules in a row match (text and mask) without 2^40 work; 2^20 chained empty matches
 *                   and 64^3 distinct stacks in one step are refused with a message
 *   the mask        under the bench's grammars (a JSON grammar, free text, arithmetic, three JSON schemas through
 *                   kiln_json_schema_to_gbnf), several walks on one matcher (reset between, so remembered stacks,
 *                   frames and class tables are reused), on the bundled model's vocab, every vocab of
 *                   ../shared/data/vocab and Qwen2.5's (~/.cache/kiln): at each oracle step a token is allowed
 *                   exactly when the text so far plus its bytes begins a sentence (kiln_grammar_match_text, which
 *                   walks no trie: an oracle apart from the mask), EOS exactly when the text is a whole sentence,
 *                   control tokens never. The oracle matches the whole text per token, so it checks every step of
 *                   4 walks of 120 on the bundled vocab and the first steps of 2 walks on the large ones
 *   sampling        every walk greedy on random logits under the mask: accept takes the masked best and refuses a
 *                   masked-out token; a walk ended by EOS is a whole sentence (JSON for the JSON grammars, of the
 *                   json grammar's shape for it), one cut at its step limit a prefix of one */
#include "kiln.h"
#include "test.h"

#include <dirent.h>
#include <jansson.h>
#include <stdint.h>

static kiln_grammar *parse(const char *text) {
    kiln_grammar *g = NULL;
    return kiln_grammar_parse(text, strlen(text), NULL, &g) == KILN_OK ? g : NULL;
}

static void test_parse_errors(void) {
    static const struct {
        const char *text, *want;
    } bad[] = {
        {"root ::= foo", "rule 'foo' is used but not defined"},
        {"start ::= \"a\"", "no rule named 'root'"},
        {"root ::= \"a\"\nroot ::= \"b\"", "line 2, column 1: rule 'root' is defined twice"},
        {"root ::= \"abc", "line 1, column 10: a literal without its closing \""},
        {"root ::= [a-z", "line 1, column 10: a character class without its closing ]"},
        {"root ::= [z-a]", "a character range whose end is before its start"},
        {"root ::= (\"a\" | \"b\"", "a ( without its closing )"},
        {"root ::= \"\\q\"", "line 1, column 11: an unknown escape"},
        {"root ::= \"\\x4\"", "2, 4 or 8 hex digits"},
        {"root ::= \"a\"{3,2}", "n < m"},
        {"root ::= \"a\"{}", "needs a count"},
        {"root ::= \"a\" )", "line 1, column 14: expected the end of the rule"},
        {"root := \"a\"", "expected ::="},
        {"root ::= \"a\"\n\n  ::= \"b\"", "line 3, column 3: expected a rule name"},
        {"root ::= x \"a\"\nx ::= root | \"b\"", "left recursion"},
        {"root ::= y* root\ny ::= \"a\"?", "left recursion"},
        {"root ::= \"\xff\"", "invalid UTF-8"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        kiln_grammar *g = NULL;
        kiln_status s = kiln_grammar_parse(bad[i].text, strlen(bad[i].text), NULL, &g);
        CHECK(s == KILN_ERR_FORMAT && !g, "case %zu: status %d", i, (int)s);
        CHECK(strstr(kiln_last_error(), bad[i].want), "case %zu: '%s' lacks '%s'", i, kiln_last_error(), bad[i].want);
    }
    /* nesting past 256 parentheses is refused (the parser recurses on them), 256 deep is fine */
    char deep[2 * 300 + 32];
    for (int depth = 256; depth <= 257; depth++) {
        int n = snprintf(deep, sizeof deep, "root ::= ");
        for (int i = 0; i < depth; i++) deep[n++] = '(';
        n += snprintf(deep + n, sizeof deep - (size_t)n, "\"a\"");
        for (int i = 0; i < depth; i++) deep[n++] = ')';
        deep[n] = 0;
        kiln_grammar *d = NULL;
        kiln_status s = kiln_grammar_parse(deep, (size_t)n, NULL, &d);
        CHECK(depth == 256 ? s == KILN_OK : s == KILN_ERR_FORMAT && strstr(kiln_last_error(), "nested more than 256"), "depth %d: %s",
              depth, kiln_last_error());
        kiln_grammar_free(d);
    }
    /* a root that recurses after a character is fine */
    kiln_grammar *ok = parse("root ::= \"(\" root \")\" | \"x\"");
    CHECK(ok, "%s", kiln_last_error());
    kiln_grammar_free(ok);
    kiln_grammar *g = NULL;
    CHECK(kiln_grammar_parse("top ::= \"a\"", 11, "top", &g) == KILN_OK && g, "a named root: %s", kiln_last_error());
    kiln_grammar_free(g);
}

/* full / prefix of each string under one grammar: "F" a sentence, "P" a proper prefix only, "-" neither. */
typedef struct {
    const char *text, *want;
} sent;

static void check_sentences(const char *grammar, const sent *cases, size_t n) {
    kiln_grammar *g = parse(grammar);
    CHECK(g, "%s: %s", grammar, kiln_last_error());
    for (size_t i = 0; i < n; i++) {
        bool full, prefix;
        CHECK(kiln_grammar_match_text(g, cases[i].text, strlen(cases[i].text), &full, &prefix) == KILN_OK);
        const char *got = full ? "F" : prefix ? "P" : "-";
        if (strcmp(got, cases[i].want) != 0) {
            kiln_grammar_free(g);
            CHECK(0, "grammar %s: '%s' is %s, want %s", grammar, cases[i].text, got, cases[i].want);
        }
    }
    kiln_grammar_free(g);
}

static void test_sentences(void) {
    static const sent rep[] = {{"", "P"}, {"a", "P"}, {"aa", "F"}, {"aab", "F"}, {"aaa", "F"}, {"aaab", "F"},
                               {"aaaa", "-"}, {"ab", "-"}, {"aabb", "-"}, {"b", "-"}};
    check_sentences("root ::= \"a\"{2,3} \"b\"?", rep, sizeof rep / sizeof *rep);
    static const sent star[] = {{"", "F"}, {"xyxy", "F"}, {"xyx", "P"}, {"yx", "-"}, {"xyxyz", "F"}, {"xyzz", "-"}};
    check_sentences("root ::= (\"x\" \"y\")* \"z\"?", star, sizeof star / sizeof *star);
    static const sent plus[] = {{"", "P"}, {"ab", "F"}, {"abab", "F"}, {"a", "P"}, {"aba", "P"}, {"abc", "-"}};
    check_sentences("root ::= \"ab\"+", plus, sizeof plus / sizeof *plus);
    static const sent exact[] = {{"1234", "F"}, {"123", "P"}, {"12345", "-"}, {"12a4", "-"}};
    check_sentences("root ::= [0-9]{4}", exact, sizeof exact / sizeof *exact);
    static const sent atmost[] = {{"", "F"}, {"q", "F"}, {"qq", "F"}, {"qqq", "-"}};
    check_sentences("root ::= \"q\"{,2}", atmost, sizeof atmost / sizeof *atmost);
    static const sent atleast[] = {{"q", "P"}, {"qq", "F"}, {"qqqqqqq", "F"}, {"qqqqqqqr", "-"}};
    check_sentences("root ::= \"q\"{2,}", atleast, sizeof atleast / sizeof *atleast);
    /* classes: negation, escapes, ranges, ".", a multi-line rule with comments, UTF-8 both in the grammar and the text */
    static const sent cls[] = {{"\"abc\"", "F"}, {"\"a\\\"b\"", "F"}, {"\"a\"b\"", "-"}, {"\"\xc3\xbc\xe2\x82\xac\"", "F"},
                               {"\"\xc3", "P"}, {"\"a\nb\"", "-"}, {"\"", "P"}, {"\"\\n\"", "F"}, {"\"\\z\"", "-"}};
    check_sentences("# a string\nroot ::= \"\\\"\" (\n  [^\"\\\\\\x00-\\x1f] | # any but a quote, a backslash, a control\n"
                    "  \"\\\\\" [\"\\\\nt]\n)* \"\\\"\"",
                    cls, sizeof cls / sizeof *cls);
    static const sent any[] = {{"<\xe6\x97\xa5>", "F"}, {"<\n>", "F"}, {"<>", "P"}, {"<", "P"}, {"<ab>", "-"}, {"<\xc0\xaf>", "-"}, {"<\xed\xa0\x80>", "-"}};
    check_sentences("root ::= \"<\" . \">\"", any, sizeof any / sizeof *any);
    static const sent uni[] = {{"\xc3\xbc", "F"}, {"\xe2\x82\xac", "F"}, {"u", "-"}, {"\xc3\xbd", "-"}};
    check_sentences("root ::= \"\\u00fc\" | \"\xe2\x82\xac\"", uni, sizeof uni / sizeof *uni);
    /* an empty first alternative with a rule after its rule (llama.cpp's ws ::= | " " | ...): expanding the empty
     * one must leave the stack under it for the next alternative */
    static const sent empty_alt[] = {{"{t}", "F"}, {"{ t}", "F"}, {"{\n t}", "F"}, {"{  t}", "-"}, {"{ }", "-"}};
    check_sentences("root ::= \"{\" ws val \"}\"\nval ::= \"t\"\nws ::= | \" \" | \"\\n\" [ ]?", empty_alt,
                    sizeof empty_alt / sizeof *empty_alt);
    /* recursion after a character, alternatives spanning lines inside a group */
    static const sent nest[] = {{"x", "F"}, {"((x))", "F"}, {"((x)", "P"}, {"(()", "-"}, {"[x]", "F"}, {"([x])", "F"}};
    check_sentences("root ::= \"(\" root \")\" | br | \"x\"\nbr ::= (\n  \"[\" root \"]\"\n)", nest, sizeof nest / sizeof *nest);
}

/* ---------------------------------------------------------------- the mask against the oracle */

/* A JSON object of at most 3 members (string keys of up to 6 characters; values a number, a short string, a bool,
 * null or an array of up to 3 numbers), written from the JSON grammar of RFC 8259, bounded so every walk ends. */
static const char *json_grammar =
    "root   ::= \"{\" ws ( member ( \",\" ws member ){0,2} )? \"}\"\n"
    "member ::= key ws \":\" ws value ws\n"
    "key    ::= \"\\\"\" [a-z_]{1,6} \"\\\"\"\n"
    "value  ::= number | str | \"true\" | \"false\" | \"null\" | arr\n"
    "arr    ::= \"[\" ws ( number ws ( \",\" ws number ws ){0,2} )? \"]\"\n"
    "str    ::= \"\\\"\" ( [^\"\\\\\\x00-\\x1f] | \"\\\\\" [\"\\\\/nt] ){0,8} \"\\\"\"\n"
    "number ::= \"-\"? ( \"0\" | [1-9] [0-9]{0,3} ) ( \".\" [0-9]{1,3} )?\n"
    "ws     ::= \" \"?\n";

/* Three JSON Schemas as kiln_json_schema_to_gbnf makes them (bench/bench_grammar.c's): strings unbounded, integers
 * with bounds, enums, arrays, nested objects, a uuid, a date and a pattern. */
static const char *person_schema =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":150},"
    "\"email\":{\"type\":\"string\"},\"role\":{\"enum\":[\"admin\",\"user\",\"guest\"]},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"maxItems\":5}},\"required\":[\"name\",\"age\",\"role\"]}";
static const char *order_schema =
    "{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"string\",\"format\":\"uuid\"},"
    "\"customer\":{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
    "\"address\":{\"type\":\"object\",\"properties\":{\"street\":{\"type\":\"string\"},\"city\":{\"type\":\"string\"},"
    "\"zip\":{\"type\":\"string\",\"pattern\":\"^[0-9]{5}$\"}},\"required\":[\"street\",\"city\"]}},\"required\":[\"name\"]},"
    "\"items\":{\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":{\"sku\":{\"type\":\"string\"},"
    "\"qty\":{\"type\":\"integer\",\"minimum\":1},\"price\":{\"type\":\"number\"}},\"required\":[\"sku\",\"qty\"]},"
    "\"minItems\":1,\"maxItems\":10},\"paid\":{\"type\":\"boolean\"}},\"required\":[\"id\",\"customer\",\"items\"]}";
static const char *event_schema =
    "{\"type\":\"object\",\"properties\":{\"title\":{\"type\":\"string\"},\"date\":{\"type\":\"string\",\"format\":\"date\"},"
    "\"priority\":{\"type\":\"string\",\"enum\":[\"low\",\"medium\",\"high\"]},"
    "\"attendees\":{\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
    "\"rsvp\":{\"type\":\"boolean\"}},\"required\":[\"name\"]}},\"notes\":{\"type\":[\"string\",\"null\"]}},"
    "\"required\":[\"title\",\"date\"]}";

/* The grammars the mask is checked under: repetitions of one class (text, expr), strings with escapes ({0,8} and
 * unbounded), nested rules. json marks those whose sentences are JSON texts. */
static const struct {
    const char *name, *text;
    bool schema, json;
} cases[] = {
    {"json", NULL, false, true}, /* json_grammar */
    {"text", "root ::= [^\\n]{1,120} \"\\n\"\n", false, false},
    {"expr", "root ::= expr \"\\n\"\nexpr ::= term ( ws [-+*/] ws term ){0,6}\n"
             "term ::= [0-9]{1,4} | [a-z]{1,5} | \"(\" ws expr ws \")\"\nws ::= \" \"?\n", false, false},
    {"person", NULL, true, true},
    {"order", NULL, true, true},
    {"event", NULL, true, true},
};

static kiln_grammar *case_grammar(size_t i) {
    const char *text = i == 0 ? json_grammar : cases[i].text;
    if (!cases[i].schema) return parse(text);
    const char *schema = i == 3 ? person_schema : i == 4 ? order_schema : event_schema;
    char *gbnf = NULL;
    size_t n = 0;
    if (kiln_json_schema_to_gbnf(schema, strlen(schema), &gbnf, &n) != KILN_OK) return NULL;
    kiln_grammar *g = NULL;
    kiln_grammar_parse(gbnf, n, NULL, &g);
    free(gbnf);
    return g;
}

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s >> 12, *s ^= *s << 25, *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

/* One greedy walk of random logits under the grammar with the matcher m (reset first), at most max_steps tokens;
 * the mask of each of the first oracle_steps steps is checked token by token. Returns the text (malloc'd; *ended
 * when the walk ended with EOS) or NULL with the failure in msg. */
static char *walk(const kiln_grammar *g, const kiln_tokenizer *tok, kiln_grammar_matcher *m, uint64_t seed, int oracle_steps, int max_steps,
                  bool *ended, size_t *len, char *msg, size_t n_msg) {
    const int32_t V = kiln_tokenizer_n_vocab(tok), eos = kiln_tokenizer_eos(tok);
    float *lg = malloc((size_t)V * sizeof *lg);
    char *text = calloc(1, 8192), *buf = malloc(8192 + 256);
    size_t n = 0;
    *ended = false;
    bool ok = lg && text && buf && kiln_grammar_matcher_reset(m) == KILN_OK;
    if (!ok) snprintf(msg, n_msg, "setup: %s", kiln_last_error());
    for (int step = 0; ok && step < max_steps; step++) {
        for (int32_t i = 0; i < V; i++) lg[i] = (float)(rng_next(&seed) >> 40) / 16777216.0f;
        if (kiln_grammar_matcher_mask(m, lg) != KILN_OK) {
            snprintf(msg, n_msg, "step %d, text '%.*s': mask: %s", step, (int)n, text, kiln_last_error());
            ok = false;
            break;
        }
        for (int32_t i = 0; step < oracle_steps && ok && i < V; i++) {
            bool want;
            if (i == eos) {
                bool full, prefix;
                kiln_grammar_match_text(g, text, n, &full, &prefix);
                want = full;
            } else if (kiln_tokenizer_token_type(tok, i) == KILN_TOKEN_CONTROL) {
                want = false;
            } else {
                size_t np = 0;
                memcpy(buf, text, n);
                if (kiln_tokenizer_piece(tok, i, false, buf + n, 256, &np) != KILN_OK || np > 256) np = 0;
                bool full, prefix = false;
                if (np) kiln_grammar_match_text(g, buf, n + np, &full, &prefix);
                want = prefix;
            }
            const bool got = lg[i] != -INFINITY;
            if (got != want) {
                snprintf(msg, n_msg, "step %d, text '%.*s': token %d is %s by the mask, %s by the oracle", step, (int)n, text, (int)i,
                         got ? "allowed" : "refused", want ? "allowed" : "refused");
                ok = false;
            }
        }
        int32_t best = -1;
        for (int32_t i = 0; i < V; i++)
            if (lg[i] != -INFINITY && (best < 0 || lg[i] > lg[best])) best = i;
        if (!ok) break;
        if (best == eos) {
            *ended = true;
            break;
        }
        /* a token the mask refused is refused by accept too, and leaves the state as it was */
        for (int32_t i = 0; i < V; i++)
            if (lg[i] == -INFINITY && i != eos && kiln_tokenizer_token_type(tok, i) != KILN_TOKEN_CONTROL) {
                if (kiln_grammar_matcher_accept(m, i) == KILN_OK) {
                    snprintf(msg, n_msg, "step %d: accept took token %d, which the mask refused", step, (int)i);
                    ok = false;
                }
                break;
            }
        if (ok && kiln_grammar_matcher_accept(m, best) != KILN_OK) {
            snprintf(msg, n_msg, "step %d: accept of the masked best %d: %s", step, (int)best, kiln_last_error());
            ok = false;
        }
        size_t np = 0;
        if (ok && (kiln_tokenizer_piece(tok, best, false, text + n, 8191 - n, &np) != KILN_OK || n + np >= 8191)) {
            snprintf(msg, n_msg, "step %d: the text outgrew its buffer", step);
            ok = false;
        }
        n += np, text[n] = 0;
    }
    if (ok && *ended && !kiln_grammar_matcher_done(m)) snprintf(msg, n_msg, "EOS where the grammar cannot end: '%s'", text), ok = false;
    free(lg), free(buf);
    if (!ok) free(text);
    *len = n;
    return ok ? text : NULL;
}

/* A JSON text of the grammar's shape: an object of at most 3 members whose values are scalars or arrays of numbers. */
static bool json_shape_ok(const char *text, char *msg, size_t n_msg) {
    json_error_t je;
    json_t *o = json_loads(text, JSON_DECODE_ANY, &je);
    bool ok = o && json_is_object(o) && json_object_size(o) <= 3;
    const char *k;
    json_t *v;
    if (ok)
        json_object_foreach(o, k, v) {
            ok = ok && strlen(k) >= 1 && strlen(k) <= 6 && !json_is_object(v);
            if (json_is_array(v)) ok = ok && json_array_size(v) <= 3;
        }
    if (!ok) snprintf(msg, n_msg, "'%s' is not an object of the grammar's shape (%s)", text, o ? "shape" : je.text);
    json_decref(o);
    return ok;
}

/* walks walks of grammar case ci on one matcher (reset between them, so its memory of stacks and frames carries
 * over): the first oracle_walks checked by the oracle for their first oracle_steps steps. A walk that ends is a whole
 * sentence (JSON for the JSON cases, of the json grammar's shape for it); one cut at max_steps begins one. */
/* walks walks under g's mask on tok (seeds seed0 + s * stride), the oracle at the first oracle_steps steps of the first
 * oracle_walks; each walk must end a whole sentence (EOS) or a prefix of one (its step limit), and an ended one be
 * JSON when json is set, of the JSON grammar's shape when shape is. False with msg set on the first that fails. */
static bool walks_ok(const kiln_grammar *g, const kiln_tokenizer *tok, int walks, int oracle_walks, int oracle_steps, int max_steps,
                     uint64_t seed0, uint64_t stride, bool json, bool shape, char *msg, size_t n_msg) {
    kiln_grammar_matcher *m = NULL;
    bool ok = kiln_grammar_matcher_new(g, tok, &m) == KILN_OK;
    if (!ok) snprintf(msg, n_msg, "%s", kiln_last_error());
    for (int s = 0; ok && s < walks; s++) {
        bool ended;
        size_t len = 0; /* the text may hold a NUL (a byte token) */
        char *text = walk(g, tok, m, seed0 + (uint64_t)s * stride, s < oracle_walks ? oracle_steps : 0, max_steps, &ended, &len, msg, n_msg);
        ok = text != NULL;
        if (ok) {
            bool full, prefix;
            ok = kiln_grammar_match_text(g, text, len, &full, &prefix) == KILN_OK && (ended ? full : prefix);
            if (!ok) snprintf(msg, n_msg, "'%s' is not a %s of the grammar", text, ended ? "whole sentence" : "prefix");
        }
        if (ok && ended && shape) ok = json_shape_ok(text, msg, n_msg);
        if (ok && ended && json) {
            json_error_t je;
            json_t *o = json_loadb(text, len, JSON_DECODE_ANY, &je);
            ok = o != NULL;
            if (!ok) snprintf(msg, n_msg, "'%s' is not JSON: %s", text, je.text);
            json_decref(o);
        }
        free(text);
    }
    kiln_grammar_matcher_free(m);
    return ok;
}

static void check_case(const kiln_tokenizer *tok, const char *name, size_t ci, int walks, int oracle_walks, int oracle_steps, int max_steps) {
    kiln_grammar *g = case_grammar(ci);
    CHECK(g, "%s: %s", cases[ci].name, kiln_last_error());
    char msg[700] = "";
    const bool ok = walks_ok(g, tok, walks, oracle_walks, oracle_steps, max_steps, 0x9E3779B97F4A7C15ull, 7919, cases[ci].json, ci == 0, msg,
                             sizeof msg);
    kiln_grammar_free(g);
    CHECK(ok, "%s, %s: %s", name, cases[ci].name, msg);
}

static void check_vocab(const kiln_tokenizer *tok, const char *name, int walks, int oracle_walks, int oracle_steps, int max_steps) {
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases && !test_failed_; ci++) check_case(tok, name, ci, walks, oracle_walks, oracle_steps, max_steps);
}

static void test_mask_bundled_vocab(void) {
    kiln_tokenizer *tok = NULL;
    if (kiln_tokenizer_load_file("models/shakespeare.gguf", &tok) != KILN_OK) SKIP("models/shakespeare.gguf: %s", kiln_last_error());
    check_vocab(tok, "models/shakespeare.gguf", 30, 4, 120, 200);
    kiln_tokenizer_free(tok);
}

/* Grammars whose stacks are reached along exponentially many paths. 40 nullable rules in a row (x x ... x, each x
 * "a"? | "c"?: 2^40 ways to skip them all) match in polynomial time, as text and under the bundled vocab's mask; a
 * grammar that chains 2^20 empty matches or holds 64^3 distinct stacks in a step is refused with a message, not run
 * for ever: by the parser when that step is the first, by the text match and the mask when it is a later one. */
static void test_ambiguous(void) {
    char gram[1024] = "root ::=";
    for (int i = 0; i < 40; i++) strcat(gram, " x");
    strcat(gram, " \"b\"\nx ::= \"a\"? | \"c\"?\n");
    char a40[48], a41[48];
    memset(a40, 'a', 40), memcpy(a40 + 40, "b", 2);
    memset(a41, 'a', 41), memcpy(a41 + 41, "b", 2);
    const sent nullable[] = {{"", "P"}, {"b", "F"}, {"aab", "F"}, {"acacb", "F"}, {"cccc", "P"}, {a40, "F"}, {a41, "-"}, {"d", "-"}, {"bb", "-"}};
    check_sentences(gram, nullable, sizeof nullable / sizeof *nullable);
    kiln_tokenizer *tok = NULL;
    if (kiln_tokenizer_load_file("models/shakespeare.gguf", &tok) == KILN_OK) {
        kiln_grammar *g = parse(gram);
        char msg[700] = "";
        const bool ok = g && walks_ok(g, tok, 4, 2, 20, 60, 0xA5A5ull, 31, false, false, msg, sizeof msg);
        kiln_grammar_free(g);
        if (!ok) kiln_tokenizer_free(tok);
        CHECK(ok, "40 nullable rules, the mask: %s", msg);
    }

    /* 2^20 empty matches chained: too deep; 64^3 distinct stacks (each rule 64 alternatives, each with its own
     * continuation): too ambiguous. At the first step each is refused by the parser; after a "q" by the text match
     * and by the matcher's mask. */
    static char deep[2048], wide[16384];
    snprintf(deep, sizeof deep, "root ::= r0\n");
    for (int i = 0; i < 20; i++) snprintf(deep + strlen(deep), sizeof deep - strlen(deep), "r%d ::= r%d r%d\n", i, i + 1, i + 1);
    strcat(deep, "r20 ::= \"a\"?\n");
    snprintf(wide, sizeof wide, "root ::= r0\nr3 ::= \"a\"\n");
    for (int i = 0; i < 3; i++) {
        snprintf(wide + strlen(wide), sizeof wide - strlen(wide), "r%d ::= r%d \"0\"", i, i + 1);
        for (int k = 1; k < 64; k++) snprintf(wide + strlen(wide), sizeof wide - strlen(wide), " | r%d \"%d\"", i + 1, k);
        strcat(wide, "\n");
    }
    const char *const grams[2] = {deep, wide}, *const says[2] = {"rules deep", "too ambiguous"};
    for (int c = 0; c < 2; c++) {
        kiln_grammar *g = NULL;
        kiln_status st = kiln_grammar_parse(grams[c], strlen(grams[c]), NULL, &g);
        char msg[256];
        snprintf(msg, sizeof msg, "%s", kiln_last_error());
        if (st != KILN_ERR_INVALID || g || !strstr(msg, says[c])) kiln_grammar_free(g), kiln_tokenizer_free(tok);
        CHECK(st == KILN_ERR_INVALID && !g && strstr(msg, says[c]), "%s, parsed: status %d, '%s'", says[c], (int)st, msg);

        static char later[16384]; /* the same after a "q": the root is now "q" r0 */
        snprintf(later, sizeof later, "root ::= \"q\" %s", grams[c] + strlen("root ::= "));
        g = parse(later);
        if (!g) kiln_tokenizer_free(tok);
        CHECK(g, "%s after q: %s", says[c], kiln_last_error());
        bool full = true, prefix = true;
        st = kiln_grammar_match_text(g, "qa", 2, &full, &prefix);
        snprintf(msg, sizeof msg, "%s", kiln_last_error());
        kiln_grammar_matcher *m = NULL;
        kiln_status st_m = KILN_ERR_INVALID;
        bool said_m = true;
        if (tok && kiln_grammar_matcher_new(g, tok, &m) == KILN_OK) {
            float *lg = calloc((size_t)kiln_tokenizer_n_vocab(tok), sizeof *lg);
            st_m = lg ? kiln_grammar_matcher_mask(m, lg) : KILN_ERR_NOMEM;
            said_m = strstr(kiln_last_error(), says[c]) != NULL;
            free(lg);
        } else if (tok) {
            st_m = KILN_OK, said_m = false; /* a matcher should start: the first step is one "q" */
        }
        kiln_grammar_matcher_free(m);
        kiln_grammar_free(g);
        if (!(st == KILN_ERR_INVALID && strstr(msg, says[c]) && !full && !prefix && st_m == KILN_ERR_INVALID && said_m))
            kiln_tokenizer_free(tok);
        CHECK(st == KILN_ERR_INVALID && strstr(msg, says[c]) && !full && !prefix, "%s after q, matched: status %d, '%s'", says[c], (int)st, msg);
        CHECK(st_m == KILN_ERR_INVALID && said_m, "%s after q, the mask: status %d, '%s'", says[c], (int)st_m, kiln_last_error());
    }
    kiln_tokenizer_free(tok);
}

/* Every vocab of the shared data that has an EOS: byte-level BPE (GPT-2 and its kin, where tokens split code points),
 * SPM with byte fallback, WordPiece. The oracle costs a match of the whole text per token, so it checks the first
 * steps of two walks; the rest run for the caches' sake. */
static void test_mask_shared_vocabs(void) {
    const char *dir = "../shared/data/vocab";
    DIR *d = opendir(dir);
    if (!d) SKIP("%s is absent (the shared data)", dir);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        const size_t len = strlen(e->d_name);
        if (len < 6 || strcmp(e->d_name + len - 5, ".gguf") != 0) continue;
        char path[512];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        kiln_tokenizer *tok = NULL;
        if (kiln_tokenizer_load_file(path, &tok) != KILN_OK) continue;
        if (kiln_tokenizer_eos(tok) >= 0) {
            check_vocab(tok, e->d_name, 6, 2, 10, 150);
            n++;
        }
        kiln_tokenizer_free(tok);
        if (test_failed_) break;
    }
    closedir(d);
    if (!test_failed_) CHECK(n >= 3, "only %d vocabs with an EOS in %s", n, dir);
}

/* Qwen2.5's byte-level BPE of 151,936 tokens, the bench's vocab (from tests/ref/fetch_models.sh). */
static void test_mask_qwen_vocab(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/.cache/kiln/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", getenv("HOME") ? getenv("HOME") : ".");
    kiln_tokenizer *tok = NULL;
    if (kiln_tokenizer_load_file(path, &tok) != KILN_OK) SKIP("%s: absent (tests/ref/fetch_models.sh fetches it)", path);
    check_vocab(tok, "qwen2.5", 8, 2, 6, 200);
    kiln_tokenizer_free(tok);
}

/* ---------------------------------------------------------------- llama.cpp's grammar files */

/* The GBNF files llama.cpp ships (tests/ref/fetch_grammars.sh puts them in KILN_CACHE/llama.cpp-grammars): each
 * parses, and takes or refuses each string as llama.cpp's grammar engine does by the file's rules (the expectations
 * are worked out from the grammars' text: their repetitions, mandatory whitespace and classes); then walks under the
 * mask on the bundled vocab, the oracle at every step of the first walk, a walk that ended being a whole sentence
 * (JSON for the json files, by jansson). */
static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = malloc(1 << 16);
    size_t n = buf ? fread(buf, 1, (1 << 16) - 1, f) : 0;
    fclose(f);
    if (buf) buf[n] = 0;
    return buf;
}

static void test_llamacpp_grammar_files(void) {
    static const sent arithmetic[] = {{"1+2=3\n", "F"}, {"x*(y+1)=z\n", "F"}, {"a = 4\n1/2=0\n", "F"}, {"1+2=3", "P"},
                                      {"=3\n", "-"}, {"1+=3\n", "-"}, {"", "P"}};
    static const sent c[] = {{"", "F"}, {"int main(){return 0;}", "F"}, {"int f(int x){x = x+1;return x;}", "F"},
                             {"float g(){while(a<b){a = a*2;}}", "F"}, {"char h(){// hi\n}", "F"}, {"int main() {}", "-"},
                             {"intmain(){}", "-"}, {"int main(){", "P"}, {"int main(){return;}", "-"}};
    static const sent chess[] = {{"1. e4 e5\n2. Nf3 Nc6\n", "F"}, {"1. O-O-O Kxh8#\n2. exd8=Q+ O-O\n", "F"}, {"1. e4 e5\n", "P"},
                                 {"1. e9 e5\n", "-"}, {"2. e4 e5\n", "-"}, {"1. e4  e5\n", "-"}};
    static const sent english[] = {{"Hello, world!\nOk", "F"}, {"a\tb", "F"}, {"", "P"}, {"two  spaces", "-"},
                                   {"h\xc3\xa9llo", "-"}, {"end ", "P"}};
    static const sent japanese[] = {{"\xe3\x81\x93\xe3\x82\x93\xe3\x81\xab\xe3\x81\xa1\xe3\x81\xaf \xe4\xb8\x96\xe7\x95\x8c", "F"},
                                    {"\xe3\x82\xab\xe3\x82\xbf\xe3\x80\x81", "F"}, {"abc", "-"}, {"\xe3\x81", "P"}, {"", "P"}};
    static const sent list[] = {{"- one\n- two\n", "F"}, {"- \xc3\xa9t\xc3\xa9\n", "F"}, {"- \n", "-"}, {"one\n", "-"}, {"- a", "P"},
                                {"- a\r\n", "-"}};
    static const sent json[] = {{"{\"a\": [1, 2.5e3, \"x\\u00e9\"], \"b\": null}", "F"}, {"{}", "F"}, {"{\"a\":true}\n  ", "F"},
                                {"[1]", "-"}, {"{\"a\" 1}", "-"}, {"{\"a\": 01}", "-"}, {"{\"a\": \"\\q\"}", "-"}, {"{\"a\": ", "P"}};
    static const sent json_arr[] = {{"[\n1,\n2]", "F"}, {"[\n]", "F"}, {"[\n{\"k\": \"v\"}]", "F"}, {"[1]", "-"}, {"[\n1, 2]", "-"},
                                    {"[\n1]\n", "-"}};
    static const struct {
        const char *name;
        const sent *cases;
        size_t n;
        bool json;
    } files[] = {{"arithmetic", arithmetic, sizeof arithmetic / sizeof *arithmetic, false}, {"c", c, sizeof c / sizeof *c, false},
                 {"chess", chess, sizeof chess / sizeof *chess, false}, {"english", english, sizeof english / sizeof *english, false},
                 {"japanese", japanese, sizeof japanese / sizeof *japanese, false}, {"list", list, sizeof list / sizeof *list, false},
                 {"json", json, sizeof json / sizeof *json, true}, {"json_arr", json_arr, sizeof json_arr / sizeof *json_arr, true}};
    const char *cache = getenv("KILN_CACHE"), *home = getenv("HOME");
    char dir[512];
    snprintf(dir, sizeof dir, "%s/llama.cpp-grammars", cache ? cache : "");
    if (!cache) snprintf(dir, sizeof dir, "%s/.cache/kiln/llama.cpp-grammars", home ? home : "");
    char path[700];
    snprintf(path, sizeof path, "%s/json.gbnf", dir);
    char *probe = read_text(path);
    if (!probe) SKIP("%s is absent (run `bash tests/ref/fetch_grammars.sh`)", dir);
    free(probe);
    kiln_tokenizer *tok = NULL;
    CHECK(kiln_tokenizer_load_file("models/shakespeare.gguf", &tok) == KILN_OK, "%s", kiln_last_error());
    for (size_t f = 0; f < sizeof files / sizeof *files && !test_failed_; f++) {
        snprintf(path, sizeof path, "%s/%s.gbnf", dir, files[f].name);
        char *text = read_text(path);
        if (!text) kiln_tokenizer_free(tok);
        CHECK(text, "%s: cannot read it", path);
        check_sentences(text, files[f].cases, files[f].n);
        if (test_failed_) { /* its message names the string */
            free(text);
            kiln_tokenizer_free(tok);
            return;
        }
        kiln_grammar *g = parse(text);
        char msg[700] = "";
        if (!g) snprintf(msg, sizeof msg, "%s", kiln_last_error());
        const bool ok = g && walks_ok(g, tok, 6, 1, 60, 150, 0xC0FFEEull, 104729, files[f].json, false, msg, sizeof msg);
        kiln_grammar_free(g);
        free(text);
        if (!ok) kiln_tokenizer_free(tok);
        CHECK(ok, "%s.gbnf: %s", files[f].name, msg);
    }
    kiln_tokenizer_free(tok);
}

int main(void) {
    RUN(test_parse_errors);
    RUN(test_sentences);
    RUN(test_ambiguous);
    RUN(test_llamacpp_grammar_files);
    RUN(test_mask_bundled_vocab);
    RUN(test_mask_shared_vocabs);
    RUN(test_mask_qwen_vocab);
    TEST_EXIT();
}
