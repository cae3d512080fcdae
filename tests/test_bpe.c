/* test_bpe.c: byte-level BPE (src/tok/bpe.c) on its own, below the special-token dispatcher: GPT-2's byte
 * alphabet, pre-tokenizer splits written out by hand (llama-bpe, qwen2, gpt-2, default, deepseek-llm), merge
 * order, ignore_merges and the not-a-token fallback on tiny vocabs written here, invalid UTF-8, long runs, and
 * llama.cpp's vectors for the BPE vocabs in ../shared/data that need no user-defined-token handling. */
#include "test.h"
#include "tok/tok.h"

#include <pthread.h>
#include <time.h>
#include <unistd.h>

/* ---------------------------------------------------------------- helpers */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* raw bytes -> their text in GPT-2's byte alphabet (NUL-terminated, malloc'd) */
static char *alpha(const char *raw, size_t n) {
    char *out = malloc(2 * n + 1), *o = out;
    for (size_t i = 0; i < n; i++) o += kiln_utf8_encode(kiln_bpe_byte_to_cp[(unsigned char)raw[i]], o);
    *o = 0;
    return out;
}

typedef struct merge_pair {
    const char *left, *right; /* raw bytes */
} merge_pair;

/* A vocab-only GGUF: token b (0..255) is byte b in the alphabet, except `missing` (if >= 0) which is a token
 * that matches nothing; then `extra` (raw bytes) from id 256; then the merges, ranked in order. */
static kiln_tokenizer *synth_vocab(const char *pre, const char *const *extra, int n_extra, const merge_pair *merges,
                                   int n_merges, int missing) {
    int n_tok = 256 + n_extra;
    char **toks = calloc((size_t)n_tok, sizeof *toks), **mer = calloc((size_t)n_merges + 1, sizeof *mer);
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        toks[b] = b == missing ? strdup("[missing]") : alpha(&c, 1);
    }
    for (int i = 0; i < n_extra; i++) toks[256 + i] = alpha(extra[i], strlen(extra[i]));
    for (int i = 0; i < n_merges; i++) {
        char *l = alpha(merges[i].left, strlen(merges[i].left)), *r = alpha(merges[i].right, strlen(merges[i].right));
        mer[i] = malloc(strlen(l) + strlen(r) + 2);
        sprintf(mer[i], "%s %s", l, r);
        free(l), free(r);
    }
    char path[] = "/tmp/kiln-bpe-XXXXXX";
    int fd = mkstemp(path);
    kiln_tokenizer *t = NULL;
    kiln_gguf_writer *w = NULL;
    if (fd >= 0 && kiln_gguf_writer_new(&w) == KILN_OK && kiln_gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2") == KILN_OK &&
        (!pre || kiln_gguf_writer_set_str(w, "tokenizer.ggml.pre", pre) == KILN_OK) &&
        kiln_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)toks, (uint64_t)n_tok) == KILN_OK &&
        kiln_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", (const char *const *)mer, (uint64_t)n_merges) == KILN_OK &&
        kiln_gguf_writer_write_file(w, path) == KILN_OK && kiln_tokenizer_load_file(path, &t) != KILN_OK)
        t = NULL;
    kiln_gguf_writer_free(w);
    if (fd >= 0) close(fd), unlink(path);
    for (int i = 0; i < n_tok; i++) free(toks[i]);
    for (int i = 0; i < n_merges; i++) free(mer[i]);
    free(toks), free(mer);
    return t;
}

/* The words of text under t's pre-tokenizer, as "w1|w2|..." with \n \r \t written as escapes (malloc'd). */
static char *split_str(const kiln_tokenizer *t, const char *text) {
    size_t *ends, n, len = strlen(text);
    if (kiln_bpe_split(t, text, len, &ends, &n) != KILN_OK) return strdup("(error)");
    char *out = malloc(4 * len + n + 1), *o = out;
    size_t start = 0;
    for (size_t i = 0; i < n; i++) {
        if (i) *o++ = '|';
        for (size_t j = start; j < ends[i]; j++) {
            char c = text[j];
            if (c == '\n' || c == '\r' || c == '\t') *o++ = '\\', *o++ = c == '\n' ? 'n' : c == '\r' ? 'r' : 't';
            else *o++ = c;
        }
        start = ends[i];
    }
    *o = 0;
    free(ends);
    return out;
}

/* words written out by hand, joined as split_str joins them */
static char *join(const char *const *words, int n) {
    size_t len = 1;
    for (int i = 0; i < n; i++) len += 2 * strlen(words[i]) + 1;
    char *out = malloc(len), *o = out;
    for (int i = 0; i < n; i++) {
        if (i) *o++ = '|';
        for (const char *c = words[i]; *c; c++) {
            if (*c == '\n' || *c == '\r' || *c == '\t') *o++ = '\\', *o++ = *c == '\n' ? 'n' : *c == '\r' ? 'r' : 't';
            else *o++ = *c;
        }
    }
    *o = 0;
    return out;
}

#define CHECK_SPLIT(t, text, ...)                                                         \
    do {                                                                                  \
        static const char *const want_[] = {__VA_ARGS__};                                 \
        char *got_ = split_str(t, text), *exp_ = join(want_, sizeof want_ / sizeof *want_); \
        int same_ = strcmp(got_, exp_) == 0;                                              \
        if (!same_) snprintf(split_msg, sizeof split_msg, "got %s want %s", got_, exp_);  \
        free(got_), free(exp_);                                                           \
        CHECK(same_, "%s", split_msg);                                                    \
    } while (0)
static char split_msg[700];

static bool encode(const kiln_tokenizer *t, const char *text, size_t len, kiln_tokens *out) {
    out->n = 0;
    return kiln_bpe_encode(t, text, len, out) == KILN_OK;
}

/* With a synth_vocab without merges, token id b < 256 is byte b: the ids are the bytes BPE saw. */
static bool ids_are_bytes(const kiln_tokens *ids, const char *bytes, size_t n) {
    if (ids->n != n) return false;
    for (size_t i = 0; i < n; i++)
        if (ids->ids[i] != (unsigned char)bytes[i]) return false;
    return true;
}

static char *read_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    rewind(f);
    char *b = malloc((size_t)size + 1);
    *n = fread(b, 1, (size_t)size, f);
    b[*n] = 0;
    fclose(f);
    return b;
}

static kiln_tokenizer *data_vocab(const char *name) {
    char path[512];
    snprintf(path, sizeof path, "%s/vocab/ggml-vocab-%s.gguf", test_data_dir(), name);
    if (access(path, R_OK) != 0) return NULL;
    kiln_tokenizer *t = NULL;
    if (kiln_tokenizer_load_file(path, &t) != KILN_OK) {
        fprintf(stderr, "%s: %s\n", path, kiln_last_error());
        return NULL;
    }
    return t;
}

/* ---------------------------------------------------------------- the byte alphabet */

static void test_byte_alphabet_round_trip(void) {
    unsigned char seen[0x200] = {0};
    for (int b = 0; b < 256; b++) {
        uint32_t cp = kiln_bpe_byte_to_cp[b];
        CHECK(cp < 0x200 && !seen[cp], "byte %d -> U+%04X", b, cp);
        seen[cp] = 1;
        CHECK(kiln_bpe_cp_to_byte(cp) == b, "U+%04X -> %d, want %d", cp, kiln_bpe_cp_to_byte(cp), b);
        if (b >= '!' && b <= '~') CHECK(cp == (uint32_t)b, "printable ASCII %d maps to itself", b);
    }
    CHECK(kiln_bpe_byte_to_cp[' '] == 0x120 && kiln_bpe_byte_to_cp['\n'] == 0x10A); /* Ġ, Ċ */
    for (uint32_t cp = 0; cp < 0x200; cp++)
        if (!seen[cp]) CHECK(kiln_bpe_cp_to_byte(cp) == -1, "U+%04X is not in the alphabet", cp);
    CHECK(kiln_bpe_cp_to_byte(0x10FFFF) == -1);
}

/* ---------------------------------------------------------------- splits */

static void test_split_llama3(void) {
    kiln_tokenizer *t = synth_vocab("llama-bpe", NULL, 0, NULL, 0, -1);
    CHECK(t, "%s", kiln_last_error());
    CHECK_SPLIT(t, "Hello world 123456 don't\n\n  x", "Hello", " world", " ", "123", "456", " don", "'t", "\n\n", " ", " x");
    /* contractions in any case; a space before a quote goes with it; digits in threes from the left */
    CHECK_SPLIT(t, "I'VE got 'RE 1234567", "I", "'VE", " got", " '", "RE", " ", "123", "456", "7");
    /* any non-letter, non-digit, non-newline character may lead a word (here U+3000 and a tab) */
    CHECK_SPLIT(t, "Ünïcödé  テスト\u3000ok\tx\r\n y", "Ünïcödé", " ", " テスト", "\u3000ok", "\tx", "\r\n", " y");
    kiln_tokenizer_free(t);
}

static void test_split_qwen2(void) {
    kiln_tokenizer *t = synth_vocab("qwen2", NULL, 0, NULL, 0, -1);
    CHECK(t, "%s", kiln_last_error());
    CHECK_SPLIT(t, "Hello world 123456 don't\n\n  x", "Hello", " world", " ", "1", "2", "3", "4", "5", "6", " don", "'t", "\n\n",
                " ", " x");
    CHECK_SPLIT(t, "I'VE got 'RE 1234567", "I", "'VE", " got", " '", "RE", " ", "1", "2", "3", "4", "5", "6", "7");
    kiln_tokenizer_free(t);
}

static void test_split_gpt2(void) {
    kiln_tokenizer *t = synth_vocab("gpt-2", NULL, 0, NULL, 0, -1);
    CHECK(t, "%s", kiln_last_error());
    CHECK_SPLIT(t, "Hello world 123456 don't\n\n  x", "Hello", " world", " 123456", " don", "'t", "\n\n ", " x");
    /* U+180E is no space to llama.cpp (Unicode White_Space), though PCRE2's \s takes it; U+3000 is one */
    CHECK_SPLIT(t, "x!\u180e! \u3000 y", "x", "!\u180e!", " \u3000", " y");
    kiln_tokenizer_free(t);
}

static void test_split_default(void) {
    /* no tokenizer.ggml.pre at all: llama.cpp's "default", four regexes in a row */
    kiln_tokenizer *t = synth_vocab(NULL, NULL, 0, NULL, 0, -1);
    CHECK(t, "%s", kiln_last_error());
    CHECK(strcmp(t->pre, "default") == 0);
    CHECK_SPLIT(t, "a+b=c, 12345 $x", "a", "+", "b", "=", "c", ",", " ", "123", "45", " ", "$", "x");
    kiln_tokenizer_free(t);
}

static void test_split_deepseek_wide_spaces(void) {
    /* llama.cpp runs deepseek's regexes without \p{..} on std::wregex, after turning U+3000 into U+000B: so the
     * class [　-。] never takes U+3000 (only \s? does), and [ࠀ-一] takes 。 but not U+3000 */
    kiln_tokenizer *t = synth_vocab("deepseek-llm", NULL, 0, NULL, 0, -1);
    CHECK(t, "%s", kiln_last_error());
    CHECK_SPLIT(t, "a\u3000\u3000\u3002 b\u3000\uff01", "a", "\u3000", "\u3000", "\u3002", " b", "\u3000\uff01");
    kiln_tokenizer_free(t);
}

static void test_pre_names(void) {
    static const char *const known[] = {"default", "gpt-2", "mpt", "olmo", "llama-bpe", "llama3", "dbrx", "qwen2", "starcoder",
                                        "refact", "command-r", "smollm", "falcon", "deepseek-llm", "deepseek-coder", "tekken",
                                        "gpt-4o", "qwen35", "seed-coder", "bailingmoe", "poro-chat", "viking", "minicpm5",
                                        "laguna", "jais-2", "exaone-moe", "ufakzeka", "chatglm-bpe"};
    for (size_t i = 0; i < sizeof known / sizeof *known; i++) {
        kiln_tokenizer *t = synth_vocab(known[i], NULL, 0, NULL, 0, -1);
        CHECK(t, "pre '%s': %s", known[i], kiln_last_error());
        kiln_tokens ids = {0};
        bool ok = encode(t, "Hello, World! 12 \u00e9\u4e2d\n", strlen("Hello, World! 12 \u00e9\u4e2d\n"), &ids);
        kiln_tokens_free(&ids);
        kiln_tokenizer_free(t);
        CHECK(ok, "pre '%s': %s", known[i], kiln_last_error());
    }
    /* llama.cpp refuses a name it does not know; so does kiln (and names it knows but kiln does not handle) */
    CHECK(synth_vocab("no-such-pre", NULL, 0, NULL, 0, -1) == NULL);
    CHECK(strstr(kiln_last_error(), "no-such-pre") != NULL, "%s", kiln_last_error());
    CHECK(synth_vocab("gemma4", NULL, 0, NULL, 0, -1) == NULL);
}

/* ---------------------------------------------------------------- merging */

static void test_merge_order(void) {
    static const char *const extra[] = {"ab", "bc", "aa"}; /* ids 256, 257, 258 */
    static const merge_pair merges[] = {{"b", "c"}, {"a", "b"}, {"a", "a"}};
    kiln_tokenizer *t = synth_vocab("gpt-2", extra, 3, merges, 3, -1);
    CHECK(t, "%s", kiln_last_error());
    kiln_tokens ids = {0};
    CHECK(encode(t, "abc", 3, &ids) && ids.n == 2 && ids.ids[0] == 'a' && ids.ids[1] == 257, "the lowest rank merges first");
    CHECK(encode(t, "aaa", 3, &ids) && ids.n == 2 && ids.ids[0] == 258 && ids.ids[1] == 'a', "ties: the leftmost first");
    CHECK(encode(t, "abab", 4, &ids) && ids.n == 2 && ids.ids[0] == 256 && ids.ids[1] == 256);
    CHECK(encode(t, "aabc", 4, &ids) && ids.n == 2 && ids.ids[0] == 258 && ids.ids[1] == 257);
    kiln_tokens_free(&ids);
    kiln_tokenizer_free(t);
}

static void test_ignore_merges(void) {
    static const char *const extra[] = {"ab", "abc"}; /* no merge makes "abc" */
    static const merge_pair merges[] = {{"a", "b"}};
    kiln_tokens ids = {0};
    /* llama-bpe: a word that is a token as a whole is that token */
    kiln_tokenizer *t = synth_vocab("llama-bpe", extra, 2, merges, 1, -1);
    CHECK(t, "%s", kiln_last_error());
    CHECK(encode(t, "abc", 3, &ids) && ids.n == 1 && ids.ids[0] == 257);
    kiln_tokenizer_free(t);
    /* qwen2 uses the same kind of regex but merges */
    t = synth_vocab("qwen2", extra, 2, merges, 1, -1);
    CHECK(t, "%s", kiln_last_error());
    CHECK(encode(t, "abc", 3, &ids) && ids.n == 2 && ids.ids[0] == 256 && ids.ids[1] == 'c');
    kiln_tokens_free(&ids);
    kiln_tokenizer_free(t);
}

static void test_not_a_token_fallback(void) {
    /* A merge whose result is no token still merges; the symbol then goes out as the one-byte tokens of its
     * byte-alphabet text, those that exist (llama.cpp's byte_str lookups): "Ġa" is C4 A0 61, and only "a" is one */
    static const merge_pair merges[] = {{" ", "a"}, {"x", "y"}};
    kiln_tokenizer *t = synth_vocab("gpt-2", NULL, 0, merges, 2, -1);
    CHECK(t, "%s", kiln_last_error());
    kiln_tokens ids = {0};
    CHECK(encode(t, "b a", 3, &ids) && ids.n == 2 && ids.ids[0] == 'b' && ids.ids[1] == 'a');
    CHECK(encode(t, "xy", 2, &ids) && ids.n == 2 && ids.ids[0] == 'x' && ids.ids[1] == 'y');
    kiln_tokenizer_free(t);
    /* a byte whose alphabet character is no token: dropped unless its text is a one-byte token */
    t = synth_vocab("gpt-2", NULL, 0, NULL, 0, 'q');
    CHECK(t, "%s", kiln_last_error());
    CHECK(encode(t, "aqb", 3, &ids) && ids.n == 2 && ids.ids[0] == 'a' && ids.ids[1] == 'b');
    kiln_tokens_free(&ids);
    kiln_tokenizer_free(t);
}

/* ---------------------------------------------------------------- invalid UTF-8 */

static void test_invalid_utf8(void) {
    kiln_tokenizer *t = synth_vocab("gpt-2", NULL, 0, NULL, 0, -1);
    CHECK(t, "%s", kiln_last_error());
    /* input -> the text llama.cpp's unicode_cpts_from_utf8 makes of it */
    static const struct {
        const char *in, *want;
    } cases[] = {
        {"a\xff" "b", "a\xef\xbf\xbd" "b"},               /* a byte no sequence starts with */
        {"\x80x", "\xef\xbf\xbdx"},                       /* a lone continuation byte */
        {"ab\xe2\x82", "ab\xef\xbf\xbd\xef\xbf\xbd"},     /* truncated at the end: each byte alone */
        {"\xe2\x82" "c", "\xef\xbf\xbd\xef\xbf\xbd" "c"}, /* truncated before ASCII */
        {"\xc0\xaf", "/"},                                /* overlong: the lax decoder accepts it */
        {"\xed\xa0\x80", "\xed\xa0\x80"},                 /* a surrogate: decoded, re-encoded as is */
        {"\xf4\x90\x80\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"}, /* > U+10FFFF: llama.cpp throws */
        {"\xf8\x88\x80\x80\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},
    };
    kiln_tokens ids = {0};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        CHECK(encode(t, cases[i].in, strlen(cases[i].in), &ids), "case %zu: %s", i, kiln_last_error());
        CHECK(ids_are_bytes(&ids, cases[i].want, strlen(cases[i].want)), "case %zu", i);
    }
    CHECK(encode(t, "a\0b", 3, &ids) && ids_are_bytes(&ids, "a\0b", 3), "NUL is a byte like any other");
    /* random bytes, biased towards lead and continuation bytes: no error, and the words cover the text */
    unsigned long long rng = 42;
    static const unsigned char pool[] = {'a', ' ', '\n', '1', '!', 0x80, 0xbf, 0xc0, 0xc3, 0xe2, 0xed, 0xf0, 0xf4, 0xf8, 0xff, 0xa0};
    char buf[64];
    for (int iter = 0; iter < 3000; iter++) {
        size_t n = test_rng_next(&rng) % sizeof buf;
        for (size_t i = 0; i < n; i++) buf[i] = (char)pool[test_rng_next(&rng) % sizeof pool];
        CHECK(encode(t, buf, n, &ids), "iteration %d: %s", iter, kiln_last_error());
        size_t *ends, n_words;
        CHECK(kiln_bpe_split(t, buf, n, &ends, &n_words) == KILN_OK);
        bool ordered = n_words == 0 ? ids.n == 0 : ends[n_words - 1] == ids.n;
        for (size_t i = 0; i + 1 < n_words; i++) ordered &= ends[i] < ends[i + 1];
        free(ends);
        CHECK(ordered, "iteration %d: words do not tile the %zu bytes BPE saw", iter, ids.n);
    }
    kiln_tokens_free(&ids);
    kiln_tokenizer_free(t);
    kiln_tokenizer *g = data_vocab("gpt-2");
    if (!g) SKIP("%s/vocab/ggml-vocab-gpt-2.gguf is absent", test_data_dir());
    for (int iter = 0; iter < 300; iter++) {
        size_t n = test_rng_next(&rng) % sizeof buf;
        for (size_t i = 0; i < n; i++) buf[i] = (char)(test_rng_next(&rng) & 0xFF);
        CHECK(encode(g, buf, n, &ids), "gpt-2, iteration %d: %s", iter, kiln_last_error());
    }
    kiln_tokens_free(&ids);
    kiln_tokenizer_free(g);
}

/* ---------------------------------------------------------------- long runs */

/* 100k repeats of one character encode in well under a second: no quadratic merging or regex backtracking. */
static void test_long_runs(void) {
    static const merge_pair merges[] = {{"a", "a"}, {"aa", "aa"}, {"aaaa", "aaaa"}};
    static const char *const extra[] = {"aa", "aaaa", "aaaaaaaa"};
    static const char *const pres[] = {"gpt-2", "llama-bpe", "deepseek-llm", "tekken", "gpt-4o", "exaone-moe", "default"};
    static const char *const units[] = {"a", " ", "\n", "1", "\xc3\xa9", "A", " \n"};
    const size_t reps = 100000;
    char *text = malloc(2 * reps + 2);
    kiln_tokens ids = {0};
    for (size_t p = 0; p < sizeof pres / sizeof *pres; p++) {
        kiln_tokenizer *t = synth_vocab(pres[p], extra, 3, merges, 3, -1);
        CHECK(t, "%s", kiln_last_error());
        for (size_t u = 0; u < sizeof units / sizeof *units; u++) {
            size_t ul = strlen(units[u]), n = 0;
            for (size_t i = 0; i < reps; i++, n += ul) memcpy(text + n, units[u], ul);
            text[n++] = 'x'; /* a different last character: lookaheads and backtracking at the end of the run */
            double t0 = now_s();
            bool ok = encode(t, text, n, &ids);
            double dt = now_s() - t0;
            CHECK(ok, "%s: %s", pres[p], kiln_last_error());
            CHECK(dt < 0.5, "pre %s, 100k x '%s': %.2f s", pres[p], units[u], dt);
            if (u == 0) CHECK(ids.n == reps / 8 + 1 && ids.ids[0] == 258, "pre %s: %zu ids", pres[p], ids.n);
        }
        kiln_tokenizer_free(t);
    }
    kiln_tokenizer *g = data_vocab("gpt-2");
    if (!g) {
        free(text);
        kiln_tokens_free(&ids);
        SKIP("%s/vocab/ggml-vocab-gpt-2.gguf is absent (the synthetic vocabs passed)", test_data_dir());
    }
    memset(text, 'a', reps);
    double t0 = now_s();
    bool ok = encode(g, text, reps, &ids);
    double dt = now_s() - t0;
    free(text);
    kiln_tokenizer_free(g);
    kiln_tokens_free(&ids);
    CHECK(ok && dt < 0.5, "gpt-2, 100k 'a': %.2f s", dt);
}

/* ---------------------------------------------------------------- threads */

typedef struct encode_job {
    const kiln_tokenizer *t;
    const char *text;
    size_t len;
    kiln_tokens ids;
    kiln_status status;
} encode_job;

static void *encode_thread(void *arg) {
    encode_job *j = arg;
    for (int rep = 0; rep < 4 && j->status == KILN_OK; rep++) {
        j->ids.n = 0;
        j->status = kiln_bpe_encode(j->t, j->text, j->len, &j->ids);
    }
    return NULL;
}

/* One tokenizer, four threads encoding at once: all scratch memory (and the word cache) belongs to the call. */
static void test_threads_share_a_tokenizer(void) {
    static const char *const extra[] = {"th", "the", " the", "he", "in"};
    static const merge_pair merges[] = {{"t", "h"}, {"th", "e"}, {" ", "the"}, {"h", "e"}, {"i", "n"}};
    kiln_tokenizer *t = synth_vocab("llama-bpe", extra, 5, merges, 5, -1);
    CHECK(t, "%s", kiln_last_error());
    static const char *const words[] = {"the", " then", " in", " thin", "\n", " 12345", " \xc3\xa9t\xc3\xa9", "!", "\xff"};
    size_t len = 0, cap = 200000;
    char *text = malloc(cap + 16);
    unsigned long long rng = 7;
    while (len < cap) {
        const char *w = words[test_rng_next(&rng) % (sizeof words / sizeof *words)];
        memcpy(text + len, w, strlen(w)), len += strlen(w);
    }
    encode_job one = {t, text, len, {0}, KILN_OK}, jobs[4];
    encode_thread(&one);
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = one;
        jobs[i].ids = (kiln_tokens){0};
        pthread_create(&th[i], NULL, encode_thread, &jobs[i]);
    }
    bool same = one.status == KILN_OK;
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        same &= jobs[i].status == KILN_OK && jobs[i].ids.n == one.ids.n &&
                memcmp(jobs[i].ids.ids, one.ids.ids, one.ids.n * sizeof *one.ids.ids) == 0;
        kiln_tokens_free(&jobs[i].ids);
    }
    size_t n = one.ids.n;
    kiln_tokens_free(&one.ids);
    kiln_tokenizer_free(t);
    free(text);
    CHECK(same && n > 0, "threads disagree with one thread (%zu ids)", n);
}

/* ---------------------------------------------------------------- llama.cpp's vectors */

/* Inputs are separated by "\n__ggml_vocab_test__\n"; the .out file has one line of ids per input. */
static void check_vectors(const char *name, int *n_checked) {
    char path[512];
    size_t ni, no;
    snprintf(path, sizeof path, "%s/vocab/ggml-vocab-%s.gguf.inp", test_data_dir(), name);
    char *inp = read_file(path, &ni);
    snprintf(path, sizeof path, "%s/vocab/ggml-vocab-%s.gguf.out", test_data_dir(), name);
    char *outp = read_file(path, &no);
    kiln_tokenizer *t = data_vocab(name);
    *n_checked = -1;
    if (!inp || !outp || !t) {
        free(inp), free(outp), kiln_tokenizer_free(t);
        return;
    }
    *n_checked = 0;
    const char *sep = "\n__ggml_vocab_test__\n";
    char *p = inp, *o = outp, *q;
    kiln_tokens ids = {0};
    bool ok = true;
    while (ok && (q = strstr(p, sep)) != NULL) {
        char *eol = strchr(o, '\n');
        ok = eol && encode(t, p, (size_t)(q - p), &ids);
        char *c = o;
        for (size_t i = 0; ok && i < ids.n; i++) {
            long want = strtol(c, &c, 10);
            ok = c <= eol && want == ids.ids[i];
        }
        ok = ok && strspn(c, " ") == (size_t)(eol - c);
        if (!ok) snprintf(split_msg, sizeof split_msg, "%s: input %d ('%.*s') differs", name, *n_checked, (int)(q - p), p);
        (*n_checked)++;
        p = q + strlen(sep), o = eol + 1;
    }
    if (!ok) *n_checked = -2;
    kiln_tokens_free(&ids);
    kiln_tokenizer_free(t);
    free(inp), free(outp);
}

static void test_llama_cpp_vectors(void) {
    /* mpt is left to test_tokenizer.c: its "  " tokens are user-defined, which the dispatcher matches first */
    static const char *const names[] = {"gpt-2", "refact", "deepseek-llm"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        int n;
        check_vectors(names[i], &n);
        if (n == -1) SKIP("%s/vocab/ggml-vocab-%s.gguf(.inp/.out) absent", test_data_dir(), names[i]);
        CHECK(n != -2, "%s", split_msg);
        CHECK(n == 46, "%s: %d inputs", names[i], n);
    }
}

/* Every id's text, read back through the byte alphabet, gives the input bytes (gpt-2 on the .inp inputs). */
static void test_gpt2_pieces_round_trip(void) {
    char path[512];
    size_t n;
    snprintf(path, sizeof path, "%s/vocab/ggml-vocab-gpt-2.gguf.inp", test_data_dir());
    char *inp = read_file(path, &n);
    kiln_tokenizer *t = data_vocab("gpt-2");
    if (!inp || !t) {
        free(inp), kiln_tokenizer_free(t);
        SKIP("%s/vocab/ggml-vocab-gpt-2.gguf(.inp) absent", test_data_dir());
    }
    kiln_tokens ids = {0};
    char *back = malloc(n + 1);
    bool ok = encode(t, inp, n, &ids);
    size_t m = 0;
    for (size_t i = 0; ok && i < ids.n; i++) {
        kiln_str s = kiln_tokenizer_token_text(t, ids.ids[i]);
        for (size_t j = 0; ok && j < s.len;) {
            uint32_t cp;
            int l = kiln_utf8_decode((const unsigned char *)s.ptr + j, (size_t)s.len - j, &cp);
            int b = l ? kiln_bpe_cp_to_byte(cp) : -1;
            ok = b >= 0 && m < n;
            if (ok) back[m++] = (char)b, j += (size_t)l;
        }
    }
    bool same = ok && m == n && memcmp(back, inp, n) == 0;
    free(back), free(inp);
    kiln_tokens_free(&ids);
    kiln_tokenizer_free(t);
    CHECK(same, "decoded %zu of %zu bytes", m, n);
}

int main(void) {
    RUN(test_byte_alphabet_round_trip);
    RUN(test_split_llama3);
    RUN(test_split_qwen2);
    RUN(test_split_gpt2);
    RUN(test_split_default);
    RUN(test_split_deepseek_wide_spaces);
    RUN(test_pre_names);
    RUN(test_merge_order);
    RUN(test_ignore_merges);
    RUN(test_not_a_token_fallback);
    RUN(test_invalid_utf8);
    RUN(test_long_runs);
    RUN(test_threads_share_a_tokenizer);
    RUN(test_llama_cpp_vectors);
    RUN(test_gpt2_pieces_round_trip);
    TEST_EXIT();
}
