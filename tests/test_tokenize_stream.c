/* test_tokenize_stream.c: kiln_tokenizer_encode_file (src/tok/stream.c) cuts files into chunks only where
 * the ids cannot change. For every family, a text longer than one 1 MiB chunk is encoded whole and streamed,
 * and the two id lists must be equal; a text with no cut point still streams (the buffer grows). */
#include "kiln.h"
#include "test.h"

#include <sys/wait.h>
#include <unistd.h>

typedef struct {
    int32_t *ids;
    size_t n, cap;
    size_t calls;
} collect;

static kiln_status collect_ids(void *ud, const int32_t *ids, size_t n) {
    collect *c = ud;
    if (c->n + n > c->cap) {
        size_t cap = (c->n + n) * 2;
        int32_t *p = realloc(c->ids, cap * sizeof *p);
        if (!p) return KILN_ERR_NOMEM;
        c->ids = p, c->cap = cap;
    }
    memcpy(c->ids + c->n, ids, n * sizeof *ids);
    c->n += n;
    c->calls++;
    return KILN_OK;
}

static char *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc(*n + 1);
    if (buf && fread(buf, 1, *n, f) != *n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    return buf;
}

/* Encodes path whole and streamed with the vocab; returns the number of emit calls (chunks), -1 on mismatch. */
static long compare(const char *vocab, const char *path, bool add_special, bool parse_special) {
    kiln_tokenizer *t;
    if (kiln_tokenizer_load_file(vocab, &t) != KILN_OK) {
        snprintf(test_msg_, sizeof test_msg_, "%s", kiln_last_error());
        return -1;
    }
    size_t n;
    char *text = read_all(path, &n);
    kiln_tokens whole = {0};
    collect c = {0};
    long result = -1;
    if (text && kiln_tokenizer_encode(t, text, n, add_special, parse_special, &whole) == KILN_OK &&
        kiln_tokenizer_encode_file(t, path, add_special, parse_special, collect_ids, &c) == KILN_OK) {
        size_t i = 0;
        while (i < whole.n && i < c.n && whole.ids[i] == c.ids[i]) i++;
        if (i == whole.n && i == c.n) result = (long)c.calls;
        else
            snprintf(test_msg_, sizeof test_msg_, "%s on %s: %zu whole vs %zu streamed ids, first difference at %zu", vocab, path,
                     whole.n, c.n, i);
    } else if (!text) snprintf(test_msg_, sizeof test_msg_, "cannot read %s", path);
    else snprintf(test_msg_, sizeof test_msg_, "%s", kiln_last_error());
    free(text);
    free(c.ids);
    kiln_tokens_free(&whole);
    kiln_tokenizer_free(t);
    return result;
}

#define CHECK_STREAM(vocab, path, add, parse, min_chunks)                            \
    do {                                                                              \
        long chunks_ = compare(vocab, path, add, parse);                              \
        if (chunks_ < 0) {                                                            \
            test_failed_ = 1;                                                         \
            return;                                                                   \
        }                                                                             \
        CHECK(chunks_ >= (min_chunks), "%s: %ld chunks, expected a streamed run", vocab, chunks_); \
    } while (0)

static char vocab_dir[512], shakespeare[512], turkish[512];

static bool have_data(void) {
    snprintf(vocab_dir, sizeof vocab_dir, "%s/vocab", test_data_dir());
    snprintf(shakespeare, sizeof shakespeare, "%s/corpora/english/tinyshakespeare.txt", test_data_dir());
    snprintf(turkish, sizeof turkish, "%s/corpora/turkish/manpages-tr_2.0.6-2_rendered.txt", test_data_dir());
    return access(shakespeare, R_OK) == 0 && access(turkish, R_OK) == 0;
}

static void test_stream_equals_whole(void) {
    if (!have_data()) SKIP("%s not found (needs ../shared/data)", shakespeare);
    const char *vocabs[] = {"llama-spm", "phi-3", "gpt-2", "deepseek-llm", "refact", "mpt", "bert-bge"};
    char path[600];
    for (size_t i = 0; i < sizeof vocabs / sizeof vocabs[0]; i++) {
        snprintf(path, sizeof path, "%s/ggml-vocab-%s.gguf", vocab_dir, vocabs[i]);
        /* the Turkish text is 2.9 MB: at least three chunks */
        CHECK_STREAM(path, turkish, true, false, 2);
        CHECK_STREAM(path, shakespeare, false, true, 1);
    }
}

static void test_stream_without_cut_points(void) {
    if (!have_data()) SKIP("%s not found (needs ../shared/data)", shakespeare);
    char path[64], vocab[600];
    snprintf(path, sizeof path, "/tmp/kiln-nocut-%d.txt", (int)getpid());
    FILE *f = fopen(path, "wb");
    CHECK(f);
    for (int i = 0; i < 300000; i++) fputs("abcdefg", f); /* 2.1 MB without a space or newline */
    fclose(f);
    snprintf(vocab, sizeof vocab, "%s/ggml-vocab-gpt-2.gguf", vocab_dir);
    long chunks = compare(vocab, path, false, false);
    unlink(path);
    if (chunks < 0) { /* compare() left the reason in test_msg_ */
        test_failed_ = 1;
        return;
    }
    CHECK(chunks == 1, "a text without cut points is one chunk, got %ld", chunks);
}

/* phi-3's <|end|> strips the whitespace after it and </s> is cut out of the text: cuts must avoid both. */
static void test_stream_around_specials(void) {
    if (!have_data()) SKIP("%s not found (needs ../shared/data)", shakespeare);
    char path[64], vocab[600];
    snprintf(path, sizeof path, "/tmp/kiln-specials-%d.txt", (int)getpid());
    FILE *f = fopen(path, "wb");
    CHECK(f);
    for (int i = 0; i < 60000; i++) fprintf(f, "line %d<|end|> said</s> the <s> king\n<|user|>\nhello world ", i);
    fclose(f);
    snprintf(vocab, sizeof vocab, "%s/ggml-vocab-phi-3.gguf", vocab_dir);
    long special = compare(vocab, path, true, true), plain = special >= 0 ? compare(vocab, path, true, false) : -1;
    unlink(path);
    if (special < 0 || plain < 0) {
        test_failed_ = 1;
        return;
    }
    CHECK(special >= 2 && plain >= 2, "expected streamed runs, got %ld and %ld chunks", special, plain);
}

/* `kiln tokenize --ids --file` reads the file's bytes exactly (the trailing newline is a token). */
static void test_cli_tokenize(void) {
    const char *bin = getenv("KILN_BIN");
    if (!bin) SKIP("KILN_BIN not set (make test sets it)");
    if (!have_data()) SKIP("%s not found (needs ../shared/data)", shakespeare);
    char path[64], cmd[1024], line[4096];
    snprintf(path, sizeof path, "/tmp/kiln-cli-%d.txt", (int)getpid());
    FILE *f = fopen(path, "wb");
    CHECK(f);
    fputs("Hello world\n", f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s tokenize -m %s/ggml-vocab-gpt-2.gguf --ids --file %s", bin, vocab_dir, path);
    FILE *p = popen(cmd, "r");
    CHECK(p);
    char *got = fgets(line, sizeof line, p);
    int rc = pclose(p);
    unlink(path);
    /* GPT-2: "Hello" 15496, " world" 995, "\n" 198 */
    CHECK(got && rc == 0 && strcmp(line, "15496 995 198\n") == 0, "got '%s'", got ? line : "(nothing)");
    snprintf(cmd, sizeof cmd, "%s tokenize -m %s/ggml-vocab-llama-spm.gguf --add-special 'Hello world'", bin, vocab_dir);
    p = popen(cmd, "r");
    CHECK(p);
    char out[3][128] = {{0}};
    for (int i = 0; i < 3 && fgets(out[i], sizeof out[i], p); i++) {}
    rc = pclose(p);
    CHECK(rc == 0 && strcmp(out[0], "     1 -> \"<s>\"\n") == 0 && strcmp(out[1], " 15043 -> \" Hello\"\n") == 0 &&
              strcmp(out[2], "  3186 -> \" world\"\n") == 0,
          "got '%s' '%s' '%s'", out[0], out[1], out[2]);
    snprintf(cmd, sizeof cmd, "%s tokenize -m /nonexistent.gguf x 2>&1", bin);
    p = popen(cmd, "r");
    CHECK(p && fgets(line, sizeof line, p));
    rc = pclose(p);
    CHECK(WEXITSTATUS(rc) == 1 && strcmp(line, "kiln: /nonexistent.gguf: cannot open: No such file or directory\n") == 0, "%s", line);
}

int main(void) {
    RUN(test_cli_tokenize);
    RUN(test_stream_around_specials);
    RUN(test_stream_equals_whole);
    RUN(test_stream_without_cut_points);
    TEST_EXIT();
}
