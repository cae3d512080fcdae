/* test_tokenizer.c: the tokenizers against llama.cpp.
 * Vectors: each vocab in ../shared/data/vocab with NAME.gguf.inp/.out (from llama.cpp's models/ folder) is
 * one test: every input is encoded with add_special = false, parse_special = false and its ids compared
 * exactly; the test prints how many inputs matched. Then: SPM round trips (decode(encode(x)) == x), the
 * llama2.c tokenizer tok512.bin, special tokens with and without parse_special, out-of-range ids, invalid
 * UTF-8, empty input, and the encoding speed on a 1.1 MB text (printed). Beyond these, spm.c, wpm.c and
 * tokenize.c were checked against llama.cpp itself (llama-cpp-python 0.3.36) on tens of thousands of random
 * strings; the llama.cpp ids hard-coded below come from that run (tok512's from sentencepiece, see there). */
#include "kiln.h"
#include "test.h"

#include <stdint.h>
#include <time.h>
#include <unistd.h>

/* ---------------------------------------------------------------- helpers */

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    for (size_t got; buf && (got = fread(buf + n, 1, cap - n, f)) > 0;) {
        n += got;
        if (n == cap) {
            char *nb = realloc(buf, 2 * cap + 1);
            if (!nb) free(buf);
            buf = nb, cap *= 2;
        }
    }
    fclose(f);
    if (buf) buf[n] = 0, *len = n;
    return buf;
}

static void vocab_path(char *out, size_t cap, const char *name, const char *suffix) {
    snprintf(out, cap, "%s/vocab/ggml-vocab-%s.gguf%s", test_data_dir(), name, suffix);
}

static kiln_tokenizer *load_vocab(const char *name) {
    char path[1024];
    vocab_path(path, sizeof path, name, "");
    kiln_tokenizer *t = NULL;
    if (access(path, R_OK) != 0 || kiln_tokenizer_load_file(path, &t) != KILN_OK) return NULL;
    return t;
}

static kiln_status encode(const kiln_tokenizer *t, const char *s, size_t n, bool add_special, bool parse_special, kiln_tokens *out) {
    out->n = 0;
    return kiln_tokenizer_encode(t, s, n, add_special, parse_special, out);
}

static bool ids_equal(const kiln_tokens *got, const int32_t *want, size_t n) {
    return got->n == n && (n == 0 || memcmp(got->ids, want, n * sizeof *want) == 0);
}

static void format_ids(char *out, size_t cap, const int32_t *ids, size_t n) {
    size_t k = 0;
    out[0] = 0;
    for (size_t i = 0; i < n && k + 16 < cap; i++) k += (size_t)snprintf(out + k, cap - k, i ? " %d" : "%d", ids[i]);
    if (k + 16 >= cap) snprintf(out + k, cap - k, " ...");
}

/* ---------------------------------------------------------------- llama.cpp's test vectors */

/* Parsed as tests/test-tokenizer-0.cpp does: inputs split on "\n__ggml_vocab_test__\n" (the text after the
 * last separator, if any, is one more input); outputs one line each, stripped, ids separated by spaces. */
typedef struct vectors {
    char *inp_raw, *out_raw;
    size_t n;
    const char **inp;
    size_t *inp_len;
    int32_t **ids;
    size_t *n_ids;
} vectors;

static void vectors_free(vectors *v) {
    for (size_t i = 0; v->ids && i < v->n; i++) free(v->ids[i]);
    free(v->inp_raw), free(v->out_raw), free(v->inp), free(v->inp_len), free(v->ids), free(v->n_ids);
    memset(v, 0, sizeof *v);
}

/* 0 on success, else a message in err. */
static int vectors_load(const char *name, vectors *v, char *err, size_t cap) {
    char path[1024];
    size_t n_inp_raw, n_out_raw;
    memset(v, 0, sizeof *v);
    vocab_path(path, sizeof path, name, ".inp");
    v->inp_raw = slurp(path, &n_inp_raw);
    vocab_path(path, sizeof path, name, ".out");
    v->out_raw = slurp(path, &n_out_raw);
    if (!v->inp_raw || !v->out_raw) return snprintf(err, cap, "cannot read %s(.inp/.out)", path), -1;
    static const char sep[] = "\n__ggml_vocab_test__\n";
    size_t cap_in = 16;
    v->inp = malloc(cap_in * sizeof *v->inp), v->inp_len = malloc(cap_in * sizeof *v->inp_len);
    for (size_t pos = 0; pos < n_inp_raw;) {
        if (v->n == cap_in) {
            cap_in *= 2;
            v->inp = realloc(v->inp, cap_in * sizeof *v->inp), v->inp_len = realloc(v->inp_len, cap_in * sizeof *v->inp_len);
        }
        const char *next = memmem(v->inp_raw + pos, n_inp_raw - pos, sep, sizeof sep - 1);
        size_t end = next ? (size_t)(next - v->inp_raw) : n_inp_raw;
        v->inp[v->n] = v->inp_raw + pos, v->inp_len[v->n] = end - pos, v->n++;
        pos = next ? end + sizeof sep - 1 : n_inp_raw;
    }
    v->ids = calloc(v->n ? v->n : 1, sizeof *v->ids), v->n_ids = calloc(v->n ? v->n : 1, sizeof *v->n_ids);
    size_t line = 0;
    for (char *p = v->out_raw, *end = v->out_raw + n_out_raw; p < end; line++) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        char *stop = nl ? nl : end;
        if (line < v->n) {
            v->ids[line] = malloc(((size_t)(stop - p) / 2 + 1) * sizeof **v->ids);
            for (char *q = p; q < stop;) {
                while (q < stop && (*q == ' ' || *q == '\r' || *q == '\t')) q++;
                if (q == stop) break;
                v->ids[line][v->n_ids[line]++] = (int32_t)strtol(q, &q, 10);
            }
        }
        p = stop + 1;
    }
    if (line != v->n) return snprintf(err, cap, "%s: %zu inputs but %zu output lines", name, v->n, line), -1;
    return 0;
}

/* Encodes every input of NAME's vectors and compares; fails naming the first mismatch. */
static void check_vectors(const char *name) {
    char path[1024], err[768] = "";
    vocab_path(path, sizeof path, name, ".inp");
    if (access(path, R_OK) != 0) SKIP("%s not found (llama.cpp's vectors for %s)", path, name);
    kiln_tokenizer *t = load_vocab(name);
    CHECK(t != NULL, "%s: %s", name, kiln_last_error());
    vectors v;
    if (vectors_load(name, &v, err, sizeof err) != 0) {
        vectors_free(&v);
        kiln_tokenizer_free(t);
        CHECK(0, "%s", err);
    }
    size_t matched = 0;
    kiln_tokens ids = {0};
    for (size_t i = 0; i < v.n; i++) {
        kiln_status s = encode(t, v.inp[i], v.inp_len[i], false, false, &ids);
        if (s == KILN_OK && ids_equal(&ids, v.ids[i], v.n_ids[i])) {
            matched++;
            continue;
        }
        if (err[0]) continue;
        char got[200], want[200];
        format_ids(got, sizeof got, ids.ids, s ? 0 : ids.n);
        format_ids(want, sizeof want, v.ids[i], v.n_ids[i]);
        snprintf(err, sizeof err, "input %zu \"%.*s\": %s%s%s; want [%s]", i, (int)(v.inp_len[i] < 40 ? v.inp_len[i] : 40), v.inp[i],
                 s ? "error: " : "got [", s ? kiln_last_error() : got, s ? "" : "]", want);
    }
    size_t n = v.n;
    printf("# vocab %s: %zu/%zu inputs match\n", name, matched, n);
    kiln_tokens_free(&ids);
    vectors_free(&v);
    kiln_tokenizer_free(t);
    CHECK(n > 0 && matched == n, "%s: %zu/%zu match; first mismatch: %s", name, matched, n, err);
}

static void test_vocab_llama_spm(void) { check_vectors("llama-spm"); }
static void test_vocab_phi_3(void) { check_vectors("phi-3"); }
static void test_vocab_bert_bge(void) { check_vectors("bert-bge"); }
static void test_vocab_gpt_2(void) { check_vectors("gpt-2"); }
static void test_vocab_gpt_neox(void) { check_vectors("gpt-neox"); }
static void test_vocab_mpt(void) { check_vectors("mpt"); }
static void test_vocab_refact(void) { check_vectors("refact"); }
static void test_vocab_deepseek_llm(void) { check_vectors("deepseek-llm"); }

/* ---------------------------------------------------------------- SPM round trips */

/* decode(encode(x)) == x for every input of the vectors: SPM with byte fallback is lossless, the decoder drops
 * the dummy prefix. (A literal ▁ in the input would come back as a space; no vector has one.) With BOS in
 * front the result is the same. */
static void check_round_trip(const char *name) {
    kiln_tokenizer *t = load_vocab(name);
    if (!t) SKIP("vocab %s not found under %s/vocab", name, test_data_dir());
    vectors v;
    char err[256] = "", bad[512] = "";
    if (vectors_load(name, &v, err, sizeof err) != 0) {
        vectors_free(&v);
        kiln_tokenizer_free(t);
        SKIP("%s", err);
    }
    kiln_tokens ids = {0};
    for (size_t i = 0; i < v.n && !bad[0]; i++) {
        for (int with_bos = 0; with_bos < 2 && !bad[0]; with_bos++) {
            char *text = NULL;
            size_t len = 0;
            if (encode(t, v.inp[i], v.inp_len[i], with_bos, false, &ids) != KILN_OK ||
                kiln_tokenizer_decode(t, ids.ids, ids.n, false, &text, &len) != KILN_OK)
                snprintf(bad, sizeof bad, "input %zu: %s", i, kiln_last_error());
            else if (len != v.inp_len[i] || memcmp(text, v.inp[i], len) != 0)
                snprintf(bad, sizeof bad, "input %zu (bos %d): \"%.*s\" decoded as \"%.*s\"", i, with_bos,
                         (int)(v.inp_len[i] < 60 ? v.inp_len[i] : 60), v.inp[i], (int)(len < 60 ? len : 60), text);
            free(text);
        }
    }
    kiln_tokens_free(&ids);
    vectors_free(&v);
    kiln_tokenizer_free(t);
    CHECK(!bad[0], "%s: %s", name, bad);
}

static void test_round_trip_llama_spm(void) { check_round_trip("llama-spm"); }
static void test_round_trip_phi_3(void) { check_round_trip("phi-3"); }

/* ---------------------------------------------------------------- llama2.c's tok512.bin */

/* Expected ids come from the sentencepiece Python package (0.2) on the same vocab's tok512.model:
 * sp.encode("Once upon a time") and the longer sentence below. llama2.c's encode merges by the same scores
 * (best score, leftmost on ties) after the same dummy prefix, so it gives these ids too. */
static void test_llama2c_tok512(void) {
    char path[1024];
    snprintf(path, sizeof path, "%s/models/stories260K/tok512.bin", test_data_dir());
    if (access(path, R_OK) != 0) SKIP("%s not found", path);
    kiln_tokenizer *t;
    CHECK(kiln_tokenizer_load_file(path, &t) == KILN_OK, "%s", kiln_last_error());
    kiln_tokens ids = {0};
    char *text = NULL;
    size_t len = 0;
    static const char s1[] = "Once upon a time", s2[] = "Once upon a time, there was a little girl named Lily.";
    static const int32_t want1[] = {403, 407, 261, 378}, want1_bos[] = {1, 403, 407, 261, 378};
    static const int32_t want2[] = {403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426};
    int32_t n_vocab = kiln_tokenizer_n_vocab(t);
    bool ok1 = encode(t, s1, strlen(s1), false, false, &ids) == KILN_OK && ids_equal(&ids, want1, 4);
    char got1[200];
    format_ids(got1, sizeof got1, ids.ids, ids.n);
    bool ok1b = encode(t, s1, strlen(s1), true, false, &ids) == KILN_OK && ids_equal(&ids, want1_bos, 5);
    bool dec = kiln_tokenizer_decode(t, ids.ids, ids.n, false, &text, &len) == KILN_OK;
    bool rt = dec && len == strlen(s1) && memcmp(text, s1, len) == 0;
    bool ok2 = encode(t, s2, strlen(s2), false, false, &ids) == KILN_OK && ids_equal(&ids, want2, sizeof want2 / sizeof *want2);
    free(text);
    kiln_tokens_free(&ids);
    kiln_tokenizer_free(t);
    CHECK(n_vocab == 512, "n_vocab %d", n_vocab);
    CHECK(ok1, "\"%s\" -> [%s], want [403 407 261 378]", s1, got1);
    CHECK(ok1b, "with add_special the ids must start with BOS 1");
    CHECK(rt, "round trip of \"%s\" failed", s1);
    CHECK(ok2, "\"%s\" mismatch", s2);
}

/* ---------------------------------------------------------------- special tokens */

/* A stretch of text after a special token gets the dummy prefix again (llama.cpp's is_prev_special), so
 * "<s>Hello</s> world" with parse_special is [<s>] + encode("Hello") + [</s>] + encode(" world"). */
static void test_special_tokens_spm(void) {
    kiln_tokenizer *t = load_vocab("llama-spm");
    if (!t) SKIP("vocab llama-spm not found under %s/vocab", test_data_dir());
    kiln_tokens a = {0}, h = {0}, w = {0};
    char *text = NULL;
    size_t len = 0;
    static const char s[] = "<s>Hello</s> world";
    bool ok_parse = encode(t, s, strlen(s), false, true, &a) == KILN_OK;
    bool ok_parts = encode(t, "Hello", 5, false, false, &h) == KILN_OK && encode(t, " world", 6, false, false, &w) == KILN_OK;
    bool shape = ok_parse && ok_parts && a.n == h.n + w.n + 2 && a.ids[0] == 1 && memcmp(a.ids + 1, h.ids, h.n * sizeof *h.ids) == 0 &&
                 a.ids[1 + h.n] == 2 && memcmp(a.ids + 2 + h.n, w.ids, w.n * sizeof *w.ids) == 0;
    /* without parse_special the markup is text: no id 1 or 2, and it decodes back */
    bool ok_plain = encode(t, s, strlen(s), false, false, &a) == KILN_OK;
    bool no_special = ok_plain;
    for (size_t i = 0; i < a.n; i++) no_special &= a.ids[i] != 1 && a.ids[i] != 2;
    bool rt = ok_plain && kiln_tokenizer_decode(t, a.ids, a.n, false, &text, &len) == KILN_OK && len == strlen(s) && memcmp(text, s, len) == 0;
    free(text);
    bool ok_enc3 = encode(t, "<s>", 3, false, true, &a) == KILN_OK && a.n == 1 && a.ids[0] == 1;
    /* unknown-type tokens are special too (llama.cpp's cache_special_tokens) */
    bool ok_unk = encode(t, "<unk>", 5, false, true, &a) == KILN_OK && a.n == 1 && a.ids[0] == 0;
    /* with special = true control tokens decode to their text, else to nothing */
    char piece[16];
    size_t n_piece = 99, n_hidden = 99;
    bool ok_piece = kiln_tokenizer_piece(t, 1, true, piece, sizeof piece, &n_piece) == KILN_OK &&
                    kiln_tokenizer_piece(t, 1, false, piece + 8, 8, &n_hidden) == KILN_OK;
    kiln_tokens_free(&a);
    kiln_tokens_free(&h);
    kiln_tokens_free(&w);
    kiln_tokenizer_free(t);
    CHECK(shape, "\"%s\" with parse_special: want [1] + ids(Hello) + [2] + ids( world)", s);
    CHECK(no_special, "without parse_special \"<s>\" must stay text");
    CHECK(rt, "without parse_special the text must decode back");
    CHECK(ok_enc3, "\"<s>\" alone with parse_special must be [1]");
    CHECK(ok_unk, "\"<unk>\" with parse_special must be [0]");
    CHECK(ok_piece && n_piece == 3 && memcmp(piece, "<s>", 3) == 0 && n_hidden == 0, "BOS piece: special shows <s>, else nothing");
}

/* User-defined tokens are cut out even without parse_special (llama.cpp, like HF's non-special added tokens):
 * deepseek-llm's [PAD100015] needs no BPE around it. */
static void test_special_user_defined(void) {
    kiln_tokenizer *t = load_vocab("deepseek-llm");
    if (!t) SKIP("vocab deepseek-llm not found under %s/vocab", test_data_dir());
    kiln_tokens a = {0};
    static const int32_t want[] = {100015, 100016};
    bool ok = encode(t, "[PAD100015][PAD100016]", 22, false, false, &a) == KILN_OK && ids_equal(&a, want, 2);
    kiln_tokens_free(&a);
    kiln_tokenizer_free(t);
    CHECK(ok, "[PAD100015][PAD100016] without parse_special must be [100015 100016]");
}

/* phi-3: llama.cpp gives its special tokens rstrip (by general.name), so the newline after <|user|> goes, and
 * the next stretch gets the dummy prefix. Ids checked against llama.cpp (llama-cpp-python 0.3.36). */
static void test_special_rstrip_phi_3(void) {
    kiln_tokenizer *t = load_vocab("phi-3");
    if (!t) SKIP("vocab phi-3 not found under %s/vocab", test_data_dir());
    kiln_tokens a = {0};
    static const char s[] = "<|user|>\nHi there<|end|>\n<|assistant|>";
    static const int32_t want[] = {32010, 6324, 727, 32007, 32001};
    bool ok = encode(t, s, strlen(s), false, true, &a) == KILN_OK && ids_equal(&a, want, 5);
    char got[200];
    format_ids(got, sizeof got, a.ids, a.n);
    /* control tokens stay text without parse_special */
    bool ok_ctl = encode(t, "<|user|>", 8, false, false, &a) == KILN_OK && a.n > 1;
    kiln_tokens_free(&a);
    kiln_tokenizer_free(t);
    CHECK(ok, "got [%s], want [32010 6324 727 32007 32001]", got);
    CHECK(ok_ctl, "<|user|> without parse_special is text");
}

/* WordPiece strips accents: a precomposed é, e + U+0301 and É all give the ids of "cafe". */
static void test_wpm_accents(void) {
    kiln_tokenizer *t = load_vocab("bert-bge");
    if (!t) SKIP("vocab bert-bge not found under %s/vocab", test_data_dir());
    kiln_tokens a = {0}, b = {0};
    bool ok = encode(t, "cafe cafe cafe", 14, false, false, &b) == KILN_OK;
    static const char s[] = "caf\xc3\xa9 cafe\xcc\x81 CAF\xc3\x89";
    ok = ok && encode(t, s, strlen(s), false, false, &a) == KILN_OK && a.n == b.n && memcmp(a.ids, b.ids, a.n * sizeof *a.ids) == 0;
    kiln_tokens_free(&a);
    kiln_tokens_free(&b);
    kiln_tokenizer_free(t);
    CHECK(ok, "accented forms must encode as \"cafe\"");
}

static void test_special_tokens_bert(void) {
    kiln_tokenizer *t = load_vocab("bert-bge");
    if (!t) SKIP("vocab bert-bge not found under %s/vocab", test_data_dir());
    kiln_tokens a = {0};
    bool ok_p = encode(t, "[CLS]", 5, false, true, &a) == KILN_OK && a.n == 1 && a.ids[0] == 101;
    /* words "[", "cls", "]": ▁[ ▁cl s ▁] */
    static const int32_t cls_text[] = {1031, 18856, 2015, 1033};
    bool ok_t = encode(t, "[CLS]", 5, false, false, &a) == KILN_OK && ids_equal(&a, cls_text, 4);
    /* add_special wraps in [CLS] ... [SEP] */
    bool ok_w = encode(t, "hello", 5, true, false, &a) == KILN_OK && a.n == 3 && a.ids[0] == 101 && a.ids[2] == 102;
    bool ok_e = encode(t, "", 0, true, false, &a) == KILN_OK && a.n == 2 && a.ids[0] == 101 && a.ids[1] == 102;
    kiln_tokens_free(&a);
    kiln_tokenizer_free(t);
    CHECK(ok_p, "[CLS] with parse_special must be 101");
    CHECK(ok_t, "[CLS] without parse_special must be the pieces of [ cls ]");
    CHECK(ok_w, "add_special: [CLS] hello [SEP]");
    CHECK(ok_e, "empty with add_special: [CLS] [SEP]");
}

static void test_special_tokens_gpt2(void) {
    kiln_tokenizer *t = load_vocab("gpt-2");
    if (!t) SKIP("vocab gpt-2 not found under %s/vocab", test_data_dir());
    kiln_tokens a = {0};
    static const char s[] = "<|endoftext|>";
    bool ok = encode(t, s, strlen(s), false, true, &a) == KILN_OK && a.n == 1 && a.ids[0] == 50256;
    kiln_tokens_free(&a);
    kiln_tokenizer_free(t);
    CHECK(ok, "<|endoftext|> with parse_special must be 50256");
}

/* ---------------------------------------------------------------- edges */

static void test_piece_out_of_range(void) {
    kiln_tokenizer *t = load_vocab("llama-spm");
    if (!t) SKIP("vocab llama-spm not found under %s/vocab", test_data_dir());
    char buf[32], msg_hi[128], msg_lo[128];
    size_t n;
    kiln_status hi = kiln_tokenizer_piece(t, 32000, false, buf, sizeof buf, &n);
    snprintf(msg_hi, sizeof msg_hi, "%s", kiln_last_error());
    kiln_status lo = kiln_tokenizer_piece(t, -1, false, buf, sizeof buf, &n);
    snprintf(msg_lo, sizeof msg_lo, "%s", kiln_last_error());
    int32_t bad[] = {15043, 40000};
    char *text = NULL;
    size_t len;
    kiln_status dec = kiln_tokenizer_decode(t, bad, 2, false, &text, &len);
    free(text);
    kiln_tokenizer_free(t);
    CHECK(hi == KILN_ERR_RANGE && strcmp(msg_hi, "token id 32000 is outside the vocab of 32000 tokens") == 0, "got %d '%s'", hi, msg_hi);
    CHECK(lo == KILN_ERR_RANGE && strcmp(msg_lo, "token id -1 is outside the vocab of 32000 tokens") == 0, "got %d '%s'", lo, msg_lo);
    CHECK(dec == KILN_ERR_RANGE, "decode of an out-of-range id must fail");
}

/* A piece longer than the buffer: *n says how much is needed. */
static void test_piece_small_buffer(void) {
    kiln_tokenizer *t = load_vocab("llama-spm");
    if (!t) SKIP("vocab llama-spm not found under %s/vocab", test_data_dir());
    kiln_tokens a = {0};
    bool ok = encode(t, "Hello", 5, false, false, &a) == KILN_OK && a.n == 1; /* ▁Hello */
    char buf[8] = {0};
    size_t n = 0;
    kiln_status s = ok ? kiln_tokenizer_piece(t, a.ids[0], false, buf, 2, &n) : KILN_ERR_INVALID;
    size_t n_full = 0;
    kiln_status s2 = ok ? kiln_tokenizer_piece(t, a.ids[0], false, buf, sizeof buf, &n_full) : KILN_ERR_INVALID;
    kiln_tokens_free(&a);
    kiln_tokenizer_free(t);
    CHECK(ok, "Hello must be one token");
    CHECK(s == KILN_OK && n == 6, "needed length 6, got %zu", n);
    CHECK(s2 == KILN_OK && n_full == 6 && memcmp(buf, " Hello", 6) == 0, "piece ' Hello'");
}

static const char invalid_utf8[] = "\xff\xfe abc \xc3";

/* SPM: byte fallback keeps every byte, so invalid UTF-8 round-trips. WordPiece drops what is not a character. */
static void test_invalid_utf8(void) {
    kiln_tokenizer *spm = load_vocab("llama-spm"), *wpm = load_vocab("bert-bge");
    if (!spm || !wpm) {
        kiln_tokenizer_free(spm), kiln_tokenizer_free(wpm);
        SKIP("vocabs llama-spm and bert-bge not found under %s/vocab", test_data_dir());
    }
    size_t n = sizeof invalid_utf8 - 1;
    kiln_tokens a = {0};
    char *text = NULL;
    size_t len = 0;
    bool enc = encode(spm, invalid_utf8, n, false, false, &a) == KILN_OK;
    bool rt = enc && kiln_tokenizer_decode(spm, a.ids, a.n, false, &text, &len) == KILN_OK && len == n && memcmp(text, invalid_utf8, n) == 0;
    free(text);
    bool wenc = encode(wpm, invalid_utf8, n, false, false, &a) == KILN_OK;
    size_t wn = a.n;
    bool wabc = wenc && a.n == 1 && kiln_tokenizer_token_text(wpm, a.ids[0]).len == 6; /* "▁abc" */
    /* every prefix of the invalid text, under both parse_special settings */
    bool prefixes = true;
    for (size_t k = 0; k <= n; k++)
        for (int ps = 0; ps < 2; ps++)
            prefixes &= encode(spm, invalid_utf8, k, true, ps, &a) == KILN_OK && encode(wpm, invalid_utf8, k, true, ps, &a) == KILN_OK;
    kiln_tokens_free(&a);
    kiln_tokenizer_free(spm);
    kiln_tokenizer_free(wpm);
    CHECK(enc && rt, "SPM must round-trip invalid UTF-8 through byte tokens");
    CHECK(wabc, "WordPiece: only 'abc' survives (%zu ids)", wn);
    CHECK(prefixes, "encoding a prefix failed: %s", kiln_last_error());
}

/* Byte-level BPE as llama.cpp: invalid bytes become U+FFFD before the byte-level mapping (its
 * unicode_cpts_from_utf8), so they decode as EF BF BD; ids checked against llama.cpp (llama-cpp-python 0.3.36). */
static void test_invalid_utf8_bpe(void) {
    kiln_tokenizer *t = load_vocab("gpt-2");
    if (!t) SKIP("vocab gpt-2 not found under %s/vocab", test_data_dir());
    size_t n = sizeof invalid_utf8 - 1;
    kiln_tokens a = {0};
    char *text = NULL;
    size_t len = 0;
    static const int32_t want[] = {6353, 450, 66, 20543};
    static const char replaced[] = "\xef\xbf\xbd\xef\xbf\xbd abc \xef\xbf\xbd";
    bool enc = encode(t, invalid_utf8, n, false, false, &a) == KILN_OK && ids_equal(&a, want, 4);
    bool rt = enc && kiln_tokenizer_decode(t, a.ids, a.n, false, &text, &len) == KILN_OK && len == sizeof replaced - 1 &&
              memcmp(text, replaced, len) == 0;
    free(text);
    kiln_tokens_free(&a);
    kiln_tokenizer_free(t);
    CHECK(enc, "want [6353 450 66 20543]");
    CHECK(rt, "invalid bytes must decode as U+FFFD");
}

static void test_empty_input(void) {
    kiln_tokenizer *t = load_vocab("llama-spm");
    if (!t) SKIP("vocab llama-spm not found under %s/vocab", test_data_dir());
    kiln_tokens a = {0};
    bool none = encode(t, "", 0, false, false, &a) == KILN_OK && a.n == 0;
    bool none_p = encode(t, "", 0, false, true, &a) == KILN_OK && a.n == 0;
    bool bos = encode(t, "", 0, true, true, &a) == KILN_OK && a.n == 1 && a.ids[0] == kiln_tokenizer_bos(t);
    char *text = NULL;
    size_t len = 99;
    bool dec = kiln_tokenizer_decode(t, a.ids, 0, false, &text, &len) == KILN_OK && len == 0 && text && text[0] == 0;
    free(text);
    kiln_tokens_free(&a);
    kiln_tokenizer_free(t);
    CHECK(none && none_p, "empty text must give no ids");
    CHECK(bos, "empty text with add_special must give only BOS");
    CHECK(dec, "decoding no ids gives an empty string");
}

/* ---------------------------------------------------------------- speed */

#define KILN_SPEED_TEXT "english/tinyshakespeare.txt" /* 1.1 MB */

/* Encodes a 1.1 MB text as one string and prints the speed (no bound is checked: machines differ).
 * (Streamed encoding, stream.c, is checked by tests/test_tokenize_stream.c.) */
static void check_speed(const char *name) {
    char path[1024];
    snprintf(path, sizeof path, "%s/corpora/" KILN_SPEED_TEXT, test_data_dir());
    kiln_tokenizer *t = load_vocab(name);
    size_t len = 0;
    char *text = t ? slurp(path, &len) : NULL;
    if (!t || !text) {
        kiln_tokenizer_free(t);
        free(text);
        SKIP("vocab %s or %s not found", name, path);
    }
    kiln_tokens ids = {0};
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    kiln_status s = encode(t, text, len, false, false, &ids);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    char msg[256];
    snprintf(msg, sizeof msg, "%s", s ? kiln_last_error() : "");
    double sec = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    if (!s) printf("# %s: %zu bytes -> %zu ids in %.3f s (%.1f MB/s)\n", name, len, ids.n, sec, (double)len / 1e6 / (sec > 0 ? sec : 1e-9));
    kiln_tokens_free(&ids);
    free(text);
    kiln_tokenizer_free(t);
    CHECK(!s, "%s: %s", name, msg);
}

static void test_speed_llama_spm(void) { check_speed("llama-spm"); }
static void test_speed_bert_bge(void) { check_speed("bert-bge"); }
static void test_speed_gpt_2(void) { check_speed("gpt-2"); }

int main(void) {
    RUN(test_vocab_llama_spm);
    RUN(test_vocab_phi_3);
    RUN(test_vocab_bert_bge);
    RUN(test_vocab_gpt_2);
    RUN(test_vocab_gpt_neox);
    RUN(test_vocab_mpt);
    RUN(test_vocab_refact);
    RUN(test_vocab_deepseek_llm);
    RUN(test_round_trip_llama_spm);
    RUN(test_round_trip_phi_3);
    RUN(test_llama2c_tok512);
    RUN(test_special_tokens_spm);
    RUN(test_special_user_defined);
    RUN(test_special_rstrip_phi_3);
    RUN(test_wpm_accents);
    RUN(test_special_tokens_bert);
    RUN(test_special_tokens_gpt2);
    RUN(test_piece_out_of_range);
    RUN(test_piece_small_buffer);
    RUN(test_invalid_utf8);
    RUN(test_invalid_utf8_bpe);
    RUN(test_empty_input);
    RUN(test_speed_llama_spm);
    RUN(test_speed_bert_bge);
    RUN(test_speed_gpt_2);
    TEST_EXIT();
}
