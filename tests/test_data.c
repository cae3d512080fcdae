/* test_data.c: token shards, the loader and the loss plot (src/train/data.c, tools/plot.c).
 * A small BPE tokenizer is trained by kiln_bpe_train on text the test writes to a temporary folder. Shards of
 * two corpora read back through the loader equal kiln_tokenizer_encode of each text (BOS first, the last
 * floor(n * f) tokens of each in the val split), also for a document long enough to spill to disk; then the
 * loader's wrap-around and pos/set_pos, and each refusal: another tokenizer's fingerprint, a truncated shard,
 * bad magic, a token outside the vocab, invalid UTF-8 (naming the file and byte offset); uint32 shards; the
 * fingerprint's sensitivity to one token type and one merge; the SVG's points, ticks and legend and a
 * malformed log line; and `kiln data` / `kiln plot` through $KILN_BIN (set by `make test`).
 * The manifest: kiln_shard_hash against an independent Python implementation, the manifest's exact text, and each
 * folder the loader must refuse (no manifest, a middle shard deleted, changed, swapped, truncated or grown, an
 * unlisted shard file, malformed manifests), runs stopped by a full disk (RLIMIT_FSIZE) or a kill in a child, a
 * corpus that is a folder or a FIFO; through the CLI, a llama2.c tokenizer refused by kiln data with kiln train's
 * reason, the strict numeric flags and `--`. */
#include "kiln.h"
#include "test.h"
#include "tok/tok.h"
#include "train/data.h"
#include "tools/plot.h"

#include <dirent.h>
#include <ftw.h>
#include <stdint.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---------------------------------------------------------------- helpers */

static char tmp_dir[64];
static kiln_tokenizer *tok;  /* trained once in main */
static char tok_path[256];

/* A path in the temporary folder; a ring of 256 buffers, more than any test holds at once. */
static const char *tmp_path(const char *name) {
    static char bufs[256][256];
    static int next;
    char *b = bufs[next++ % 256];
    snprintf(b, 256, "%s/%s", tmp_dir, name);
    return b;
}

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

static int write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    size_t w = fwrite(data, 1, n, f);
    return fclose(f) == 0 && w == n;
}

static unsigned char *read_bytes(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    rewind(f);
    unsigned char *b = malloc((size_t)size + 1);
    if (b && fread(b, 1, (size_t)size, f) != (size_t)size) {
        free(b);
        b = NULL;
    }
    fclose(f);
    if (b) b[size] = 0, *n = (size_t)size;
    return b;
}

/* Deterministic English-like text of at least n_bytes: words from a small list (ASCII ones only when ascii),
 * sentences and lines. */
static char *gen_text(unsigned long long seed, size_t n_bytes, int ascii) {
    static const char *words[] = {"the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "to", "house", "little", "big",
                                  "tree", "we", "saw", "bird", "sing", "over", "river", "café", "naïve", "日本", "über"};
    char *b = malloc(n_bytes + 32);
    size_t n = 0;
    int in_sentence = 0;
    while (n < n_bytes) {
        const char *w = words[test_rng_next(&seed) % (ascii ? 20 : sizeof words / sizeof *words)];
        size_t wl = strlen(w);
        if (in_sentence) b[n++] = ' ';
        memcpy(b + n, w, wl);
        n += wl;
        in_sentence++;
        if (in_sentence > 3 && test_rng_next(&seed) % 6 == 0) {
            b[n++] = '.';
            b[n++] = test_rng_next(&seed) % 3 == 0 ? '\n' : ' ';
            if (b[n - 1] == ' ') b[n++] = 'A';
            in_sentence = 0;
        }
    }
    b[n] = 0;
    return b;
}

/* Words of 1 to 8 random letters: about two bytes a token for a vocab trained on gen_text. */
static char *gen_letters(unsigned long long seed, size_t n_bytes) {
    char *b = malloc(n_bytes + 16);
    size_t n = 0;
    while (n < n_bytes) {
        int len = 1 + (int)(test_rng_next(&seed) % 8);
        for (int i = 0; i < len; i++) b[n++] = (char)('a' + test_rng_next(&seed) % 26);
        b[n++] = test_rng_next(&seed) % 10 ? ' ' : '\n';
    }
    b[n] = 0;
    return b;
}

static kiln_tokens encode(const char *text, size_t len) {
    kiln_tokens t = {0};
    if (kiln_tokenizer_encode(tok, text, len, true, false, &t)) kiln_tokens_free(&t);
    return t;
}

/* kiln_data_write with this file's tokenizer and no progress. */
static kiln_status write_shards(const char *const *corpora, int n, const char *dir, double val_fraction, int64_t shard_tokens,
                                kiln_data_stats *st) {
    const kiln_data_params p = {.val_fraction = val_fraction, .shard_tokens = shard_tokens};
    return kiln_data_write(corpora, n, tok, dir, &p, st);
}

/* All tokens of a split, through kiln_loader_next with one row of n-1 inputs (then the last target). */
static int32_t *read_split(const char *dir, const char *split, int64_t *n) {
    kiln_loader *l;
    if (kiln_loader_open(dir, split, kiln_tokenizer_fingerprint(tok), kiln_tokenizer_n_vocab(tok), &l)) return NULL;
    *n = kiln_loader_n_tokens(l);
    int32_t *in = malloc((size_t)*n * sizeof *in), *tg = malloc((size_t)*n * sizeof *tg);
    if (kiln_loader_next(l, 1, *n - 1, in, tg) == KILN_OK) in[*n - 1] = tg[*n - 2];
    else free(in), in = NULL;
    free(tg);
    kiln_loader_free(l);
    return in;
}

static int64_t n_val_of(int64_t n, double f) {
    if (f <= 0 || n == 0) return 0;
    int64_t v = (int64_t)((double)n * f);
    return v < 1 ? 1 : v;
}

static void put_u32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static void put_u64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* A shard written by hand: header fields as given, then the ids in bpt bytes each. */
static int write_shard(const char *path, uint32_t magic, uint64_t fp, uint64_t n_header, uint32_t bpt, const uint32_t *ids, size_t n) {
    size_t size = KILN_SHARD_HEADER + n * bpt;
    unsigned char *b = calloc(1, size);
    put_u32(b, magic);
    put_u32(b + 4, KILN_SHARD_VERSION);
    put_u64(b + 8, fp);
    put_u64(b + 16, n_header);
    put_u32(b + 24, bpt);
    put_u32(b + 28, 100000);
    for (size_t i = 0; i < n; i++)
        for (uint32_t k = 0; k < bpt; k++) b[KILN_SHARD_HEADER + i * bpt + k] = (unsigned char)(ids[i] >> (8 * k));
    int ok = write_bytes(path, b, size);
    free(b);
    return ok;
}

/* A manifest (src/train/data.h's layout) for the shards now in dir: n_train train and n_val val shards, each
 * listed with the token count its header says, its size and kiln_shard_hash of its bytes. For tests that edit
 * shards by hand and mean to reach the loader's checks past the manifest's. */
static int write_manifest(const char *dir, uint64_t fp, int n_train, int n_val) {
    char *text = malloc((size_t)(n_train + n_val + 4) * 96), path[512];
    int n = sprintf(text, "kiln-shards 1\nfingerprint %016llx\nshards %d %d\n", (unsigned long long)fp, n_train, n_val);
    for (int i = 0; i < n_train + n_val; i++) {
        const char *split = i < n_train ? "train" : "val";
        int k = i < n_train ? i : i - n_train;
        snprintf(path, sizeof path, "%s/%s_%03d.bin", dir, split, k);
        size_t sz;
        unsigned char *b = read_bytes(path, &sz);
        if (!b) {
            free(text);
            return 0;
        }
        uint64_t count = 0;
        for (int j = 7; j >= 0 && sz >= 24; j--) count = count << 8 | b[16 + j];
        n += sprintf(text + n, "%s_%03d.bin %llu %zu %016llx\n", split, k, (unsigned long long)count, sz, (unsigned long long)kiln_shard_hash(b, sz));
        free(b);
    }
    n += sprintf(text + n, "end\n");
    snprintf(path, sizeof path, "%s/manifest.txt", dir);
    int ok = write_bytes(path, text, (size_t)n);
    free(text);
    return ok;
}

/* ---------------------------------------------------------------- shards */

static const char *corpus_a =
    "Once upon a time there was a little cat.\nThe cat sat on the mat <s> and looked at the café.\n"
    "It was naïve, and über happy. 日本 is far away.\n";
static const char *corpus_b = "Another document, shorter.\nWith two lines and numbers 12345.\n";

typedef struct {
    int calls;
    bool bad; /* another stage, or done going back or past the total */
    int64_t done, total;
} data_progress;

static void on_data_progress(void *ud, const kiln_progress *pr) {
    data_progress *d = ud;
    if (strcmp(pr->stage, "data") != 0 || pr->done < d->done || pr->done > pr->total || pr->train) d->bad = true;
    d->calls++, d->done = pr->done, d->total = pr->total;
}

/* The progress of kiln_data_write: one call a corpus, in corpus bytes, ending at their total. */
static void test_data_progress(void) {
    const char *a = tmp_path("pa.txt"), *b = tmp_path("pb.txt");
    CHECK(write_bytes(a, corpus_a, strlen(corpus_a)) && write_bytes(b, corpus_b, strlen(corpus_b)));
    const char *corpora[] = {a, b};
    data_progress seen = {0};
    kiln_data_params p = kiln_data_default();
    p.progress = on_data_progress, p.progress_ud = &seen;
    CHECK(kiln_data_write(corpora, 2, tok, tmp_path("prog"), &p, NULL) == KILN_OK, "%s", kiln_last_error());
    const int64_t bytes = (int64_t)(strlen(corpus_a) + strlen(corpus_b));
    CHECK(!seen.bad && seen.calls == 2 && seen.done == bytes && seen.total == bytes, "%d calls, %lld/%lld of %lld bytes",
          seen.calls, (long long)seen.done, (long long)seen.total, (long long)bytes);
}

/* Two corpora through kiln_data_write at 50 tokens a shard, read back and compared with the encoder. */
static void test_data_round_trip(void) {
    const char *a = tmp_path("a.txt"), *b = tmp_path("b.txt"), *dir = tmp_path("rt");
    CHECK(write_bytes(a, corpus_a, strlen(corpus_a)) && write_bytes(b, corpus_b, strlen(corpus_b)));
    const char *corpora[] = {a, b};
    kiln_data_stats st;
    CHECK(write_shards(corpora, 2, dir, 0.1, 50, &st) == KILN_OK, "%s", kiln_last_error());
    kiln_tokens ea = encode(corpus_a, strlen(corpus_a)), eb = encode(corpus_b, strlen(corpus_b));
    CHECK(ea.n > 50 && eb.n > 10);
    CHECK(ea.ids[0] == kiln_tokenizer_bos(tok) && eb.ids[0] == kiln_tokenizer_bos(tok), "BOS starts each document");
    int64_t va = n_val_of((int64_t)ea.n, 0.1), vb = n_val_of((int64_t)eb.n, 0.1);
    int64_t n_train = (int64_t)(ea.n + eb.n) - va - vb;
    CHECK(st.n_train_tokens == n_train && st.n_val_tokens == va + vb, "%lld %lld", (long long)st.n_train_tokens, (long long)st.n_val_tokens);
    CHECK(st.n_train_shards == (int)((n_train + 49) / 50) && st.n_val_shards == 1);
    CHECK(st.n_bytes_in == (int64_t)(strlen(corpus_a) + strlen(corpus_b)));

    int64_t n;
    int32_t *train = read_split(dir, "train", &n);
    CHECK(train && n == n_train, "%s", kiln_last_error());
    int64_t k = 0;
    for (size_t i = 0; i < ea.n - (size_t)va; i++, k++) CHECK(train[k] == ea.ids[i], "train token %lld", (long long)k);
    for (size_t i = 0; i < eb.n - (size_t)vb; i++, k++) CHECK(train[k] == eb.ids[i], "train token %lld", (long long)k);
    int32_t *val = read_split(dir, "val", &n);
    CHECK(val && n == va + vb, "%s", kiln_last_error());
    k = 0;
    for (size_t i = ea.n - (size_t)va; i < ea.n; i++, k++) CHECK(val[k] == ea.ids[i], "val token %lld", (long long)k);
    for (size_t i = eb.n - (size_t)vb; i < eb.n; i++, k++) CHECK(val[k] == eb.ids[i], "val token %lld", (long long)k);

    /* the header as data.h lays it out: uint16 ids for this 400-token vocab */
    size_t sz;
    unsigned char *h = read_bytes(tmp_path("rt/train_000.bin"), &sz);
    CHECK(h && sz == KILN_SHARD_HEADER + 50 * 2 && memcmp(h, "KSHD", 4) == 0 && h[24] == 2);
    free(h);
    DIR *d = opendir(dir);
    struct dirent *de;
    while (d && (de = readdir(d))) CHECK(!strstr(de->d_name, ".tmp"), "%s left behind", de->d_name);
    if (d) closedir(d);

    /* fewer, larger shards over the same folder: the old shards past the new last one are gone */
    CHECK(write_shards(corpora, 2, dir, 0, 0, &st) == KILN_OK, "%s", kiln_last_error());
    CHECK(st.n_train_shards == 1 && st.n_val_shards == 0 && st.n_train_tokens == (int64_t)(ea.n + eb.n));
    CHECK(access(tmp_path("rt/train_001.bin"), F_OK) != 0 && access(tmp_path("rt/val_000.bin"), F_OK) != 0);
    kiln_loader *l;
    CHECK(kiln_loader_open(dir, "val", kiln_tokenizer_fingerprint(tok), kiln_tokenizer_n_vocab(tok), &l) == KILN_ERR_NOT_FOUND && !l);
    free(train);
    free(val);
    kiln_tokens_free(&ea);
    kiln_tokens_free(&eb);
}

/* A document of more than the 2^20 ids data.c holds in memory goes through its spill file. */
static void test_data_long_document(void) {
    char *text = gen_letters(7, 2600000);
    const char *p = tmp_path("long.txt"), *dir = tmp_path("long");
    CHECK(write_bytes(p, text, strlen(text)));
    kiln_tokens e = encode(text, strlen(text));
    CHECK(e.n > (1u << 20) + 1000, "only %zu tokens: the document must outgrow the in-memory buffer", e.n);
    kiln_data_stats st;
    CHECK(write_shards(&p, 1, dir, 0.01, 300000, &st) == KILN_OK, "%s", kiln_last_error());
    int64_t nv = n_val_of((int64_t)e.n, 0.01), n;
    CHECK(st.n_val_tokens == nv && st.n_train_shards == (int)(((int64_t)e.n - nv + 299999) / 300000));
    int32_t *train = read_split(dir, "train", &n);
    CHECK(train && n == (int64_t)e.n - nv);
    CHECK(memcmp(train, e.ids, (size_t)n * sizeof *train) == 0, "train ids differ from the encoder's");
    int32_t *val = read_split(dir, "val", &n);
    CHECK(val && n == nv && memcmp(val, e.ids + e.n - nv, (size_t)nv * sizeof *val) == 0);
    free(train);
    free(val);
    free(text);
    kiln_tokens_free(&e);
}

/* ---------------------------------------------------------------- loader */

static void test_loader_wrap_and_pos(void) {
    const char *a = tmp_path("a.txt"), *dir = tmp_path("wrap");
    CHECK(write_bytes(a, corpus_a, strlen(corpus_a)));
    CHECK(write_shards(&a, 1, dir, 0, 7, NULL) == KILN_OK, "%s", kiln_last_error()); /* 7-token shards: many seams */
    kiln_tokens e = encode(corpus_a, strlen(corpus_a));
    int64_t N = (int64_t)e.n;
    kiln_loader *l;
    CHECK(kiln_loader_open(dir, "train", kiln_tokenizer_fingerprint(tok), kiln_tokenizer_n_vocab(tok), &l) == KILN_OK, "%s", kiln_last_error());
    CHECK(kiln_loader_n_tokens(l) == N);
    int64_t B = 3, T = N / 2 + 1; /* three rows of more than half the data: the second and third wrap */
    int32_t *in = malloc((size_t)(B * T) * sizeof *in), *tg = malloc((size_t)(B * T) * sizeof *tg);
    int64_t pos = 0;
    for (int step = 0; step < 3; step++) {
        CHECK(kiln_loader_pos(l) == pos);
        CHECK(kiln_loader_next(l, B, T, in, tg) == KILN_OK);
        for (int64_t b = 0; b < B; b++)
            for (int64_t t = 0; t < T; t++) {
                int64_t g = pos + b * T + t;
                CHECK(in[b * T + t] == e.ids[g % N] && tg[b * T + t] == e.ids[(g + 1) % N], "step %d row %lld col %lld", step, (long long)b, (long long)t);
            }
        pos = (pos + B * T) % N;
    }
    /* pos/set_pos: a batch after set_pos(saved) repeats the batch that followed saved */
    int64_t saved = kiln_loader_pos(l);
    int32_t *in2 = malloc((size_t)(B * T) * sizeof *in2), *tg2 = malloc((size_t)(B * T) * sizeof *tg2);
    CHECK(kiln_loader_next(l, B, T, in, tg) == KILN_OK && kiln_loader_next(l, 1, 5, in2, tg2) == KILN_OK);
    CHECK(kiln_loader_set_pos(l, saved) == KILN_OK && kiln_loader_pos(l) == saved);
    CHECK(kiln_loader_next(l, B, T, in2, tg2) == KILN_OK);
    CHECK(memcmp(in, in2, (size_t)(B * T) * sizeof *in) == 0 && memcmp(tg, tg2, (size_t)(B * T) * sizeof *tg) == 0);
    CHECK(kiln_loader_set_pos(l, 13) == KILN_OK && kiln_loader_next(l, 1, 4, in, tg) == KILN_OK && in[0] == e.ids[13] && tg[3] == e.ids[17]);
    CHECK(kiln_loader_set_pos(l, -1) == KILN_ERR_RANGE && kiln_loader_set_pos(l, N) == KILN_ERR_RANGE);
    CHECK(kiln_loader_next(l, 1, N, in, tg) == KILN_ERR_INVALID, "a row of N + 1 tokens needs more than N");
    kiln_loader_free(l);
    free(in), free(tg), free(in2), free(tg2);
    kiln_tokens_free(&e);
}

static void test_loader_refusals(void) {
    const char *a = tmp_path("a.txt"), *dir = tmp_path("bad");
    CHECK(write_bytes(a, corpus_a, strlen(corpus_a)));
    CHECK(write_shards(&a, 1, dir, 0, 0, NULL) == KILN_OK, "%s", kiln_last_error());
    uint64_t fp = kiln_tokenizer_fingerprint(tok);
    int64_t V = kiln_tokenizer_n_vocab(tok);
    kiln_loader *l;
    CHECK(kiln_loader_open(dir, "train", fp, V, &l) == KILN_OK);
    kiln_loader_free(l);

    /* shards of another tokenizer: one trained to a different vocab size */
    const char *c = tmp_path("tokc.txt"), *other = tmp_path("other.gguf");
    char *text = gen_text(11, 20000, 0);
    CHECK(write_bytes(c, text, strlen(text)));
    free(text);
    kiln_bpe_train_params p = {.vocab_size = 330, .n_threads = 1};
    CHECK(kiln_bpe_train(&c, 1, &p, other) == KILN_OK, "%s", kiln_last_error());
    kiln_tokenizer *t2;
    CHECK(kiln_tokenizer_load_file(other, &t2) == KILN_OK);
    uint64_t fp2 = kiln_tokenizer_fingerprint(t2);
    kiln_tokenizer_free(t2);
    CHECK(fp2 != fp);
    char want[64];
    snprintf(want, sizeof want, "%016llx", (unsigned long long)fp2);
    CHECK(kiln_loader_open(dir, "train", fp2, V, &l) == KILN_ERR_INVALID && !l);
    CHECK(strstr(kiln_last_error(), "bad/manifest.txt") && strstr(kiln_last_error(), want), "%s", kiln_last_error());
    /* a manifest of the other tokenizer over shards of this one: the shard's own fingerprint is checked too */
    CHECK(write_manifest(dir, fp2, 1, 0));
    CHECK(kiln_loader_open(dir, "train", fp2, V, &l) == KILN_ERR_INVALID && !l);
    CHECK(strstr(kiln_last_error(), "bad/train_000.bin") && strstr(kiln_last_error(), want), "%s", kiln_last_error());
    CHECK(write_manifest(dir, fp, 1, 0));

    /* truncated by one byte, and shorter than a header */
    size_t sz;
    unsigned char *bytes = read_bytes(tmp_path("bad/train_000.bin"), &sz);
    CHECK(bytes && sz > KILN_SHARD_HEADER + 2);
    CHECK(write_bytes(tmp_path("bad/train_000.bin"), bytes, sz - 1));
    CHECK(kiln_loader_open(dir, "train", fp, V, &l) == KILN_ERR_FORMAT);
    CHECK(strstr(kiln_last_error(), "bad/train_000.bin") && strstr(kiln_last_error(), "truncated"), "%s", kiln_last_error());
    CHECK(write_manifest(dir, fp, 1, 0)); /* the header's own check, past the manifest's size */
    CHECK(kiln_loader_open(dir, "train", fp, V, &l) == KILN_ERR_FORMAT);
    CHECK(strstr(kiln_last_error(), "bad/train_000.bin") && strstr(kiln_last_error(), "truncated"), "%s", kiln_last_error());
    CHECK(write_bytes(tmp_path("bad/train_000.bin"), bytes, 40) && write_manifest(dir, fp, 1, 0));
    CHECK(kiln_loader_open(dir, "train", fp, V, &l) == KILN_ERR_FORMAT && strstr(kiln_last_error(), "truncated"), "%s", kiln_last_error());
    /* a trailing byte is as wrong as a missing one */
    unsigned char *longer = malloc(sz + 1);
    memcpy(longer, bytes, sz);
    longer[sz] = 0;
    CHECK(write_bytes(tmp_path("bad/train_000.bin"), longer, sz + 1) && write_manifest(dir, fp, 1, 0));
    free(longer);
    CHECK(kiln_loader_open(dir, "train", fp, V, &l) == KILN_ERR_FORMAT && strstr(kiln_last_error(), "bad/train_000.bin"), "%s", kiln_last_error());
    /* bad magic */
    bytes[0] = 'X';
    CHECK(write_bytes(tmp_path("bad/train_000.bin"), bytes, sz) && write_manifest(dir, fp, 1, 0));
    CHECK(kiln_loader_open(dir, "train", fp, V, &l) == KILN_ERR_FORMAT);
    CHECK(strstr(kiln_last_error(), "bad/train_000.bin") && strstr(kiln_last_error(), "magic"), "%s", kiln_last_error());
    free(bytes);

    /* a token outside the vocab, in a second shard: the error names it and its index */
    uint32_t ids[5] = {1, 2, 3, (uint32_t)V, 4};
    CHECK(write_shard(tmp_path("bad/train_000.bin"), KILN_SHARD_MAGIC, fp, 3, 2, ids, 3));
    CHECK(write_shard(tmp_path("bad/train_001.bin"), KILN_SHARD_MAGIC, fp, 2, 2, ids + 3, 2) && write_manifest(dir, fp, 2, 0));
    CHECK(kiln_loader_open(dir, "train", fp, V, &l) == KILN_ERR_RANGE, "%s", kiln_last_error());
    snprintf(want, sizeof want, "token %lld at index 0", (long long)V);
    CHECK(strstr(kiln_last_error(), "bad/train_001.bin") && strstr(kiln_last_error(), want), "%s", kiln_last_error());
    CHECK(kiln_loader_open(dir, "train", fp, V + 1, &l) == KILN_OK, "a model vocab larger than the tokenizer's takes the id");
    kiln_loader_free(l);
    /* a header whose count disagrees with the data, and bytes per token other than 2 or 4 */
    CHECK(write_shard(tmp_path("bad/train_001.bin"), KILN_SHARD_MAGIC, fp, 3, 2, ids, 2) && write_manifest(dir, fp, 2, 0));
    CHECK(kiln_loader_open(dir, "train", fp, V, &l) == KILN_ERR_FORMAT && strstr(kiln_last_error(), "truncated"), "%s", kiln_last_error());
    CHECK(write_shard(tmp_path("bad/train_001.bin"), KILN_SHARD_MAGIC, fp, 2, 3, ids, 2) && write_manifest(dir, fp, 2, 0));
    CHECK(kiln_loader_open(dir, "train", fp, V, &l) == KILN_ERR_FORMAT && strstr(kiln_last_error(), "bytes per token"), "%s", kiln_last_error());
}

/* Ids of a vocab past 65536 are stored in 4 bytes; the loader reads them back, each shard in its own width. */
static void test_loader_uint32(void) {
    CHECK(mkdir(tmp_path("u32"), 0700) == 0);
    uint32_t wide[4] = {0, 65535, 65536, 99999}, narrow[2] = {4464, 5};
    CHECK(write_shard(tmp_path("u32/train_000.bin"), KILN_SHARD_MAGIC, 42, 4, 4, wide, 4));
    CHECK(write_shard(tmp_path("u32/train_001.bin"), KILN_SHARD_MAGIC, 42, 2, 2, narrow, 2) && write_manifest(tmp_path("u32"), 42, 2, 0));
    kiln_loader *l;
    CHECK(kiln_loader_open(tmp_path("u32"), "train", 42, 100000, &l) == KILN_OK, "%s", kiln_last_error());
    CHECK(kiln_loader_n_tokens(l) == 6);
    int32_t in[5], tg[5];
    CHECK(kiln_loader_next(l, 1, 5, in, tg) == KILN_OK);
    int32_t want[6] = {0, 65535, 65536, 99999, 4464, 5};
    for (int i = 0; i < 5; i++) CHECK(in[i] == want[i] && tg[i] == want[i + 1], "token %d", i);
    kiln_loader_free(l);
    CHECK(kiln_loader_open(tmp_path("u32"), "train", 42, 99999, &l) == KILN_ERR_RANGE && strstr(kiln_last_error(), "token 99999 at index 3"), "%s",
          kiln_last_error());
}

/* Invalid UTF-8 names the file and the byte offset, also across the validator's 1 MiB chunks. */
static void test_data_invalid_utf8(void) {
    char *text = gen_text(3, (1u << 20) + 4096, 1);
    size_t n = strlen(text);
    /* a valid 3-byte character straddling the end of the first 1 MiB chunk */
    memcpy(text + (1u << 20) - 1, "\xe2\x82\xac", 3);
    const char *p = tmp_path("straddle.txt"), *dir = tmp_path("utf8");
    CHECK(write_bytes(p, text, n));
    CHECK(write_shards(&p, 1, dir, 0.05, 0, NULL) == KILN_OK, "%s", kiln_last_error());
    /* a lone continuation byte */
    text[1000] = (char)0x80;
    const char *bad = tmp_path("bad-utf8.txt");
    CHECK(write_bytes(bad, text, n));
    const char *both[] = {p, bad};
    CHECK(write_shards(both, 2, dir, 0.05, 0, NULL) == KILN_ERR_FORMAT);
    CHECK(strstr(kiln_last_error(), "bad-utf8.txt") && strstr(kiln_last_error(), "byte 1000"), "%s", kiln_last_error());
    /* a sequence cut by the chunk end whose continuation is wrong */
    text[1000] = 'a';
    memcpy(text + (1u << 20) - 1, "\xe2\x82" "a", 3);
    CHECK(write_bytes(bad, text, n));
    CHECK(write_shards(&bad, 1, dir, 0.05, 0, NULL) == KILN_ERR_FORMAT);
    char want[64];
    snprintf(want, sizeof want, "byte %u", (1u << 20) - 1);
    CHECK(strstr(kiln_last_error(), want), "%s", kiln_last_error());
    /* truncated at the end of the file */
    CHECK(write_bytes(bad, "ok \xc3", 4));
    CHECK(write_shards(&bad, 1, dir, 0.05, 0, NULL) == KILN_ERR_FORMAT && strstr(kiln_last_error(), "byte 3"), "%s", kiln_last_error());
    const char *missing = tmp_path("no-such.txt");
    CHECK(write_shards(&missing, 1, dir, 0.05, 0, NULL) == KILN_ERR_IO && strstr(kiln_last_error(), "no-such.txt"));
    CHECK(write_shards(&p, 1, dir, 1.0, 0, NULL) == KILN_ERR_INVALID);
    free(text);
}

/* ---------------------------------------------------------------- manifest */

/* kiln_shard_hash against values from an independent Python implementation of data.h's description (lanes,
 * tail, length, splitmix64 finalizer), so a change to the hash, which would orphan every manifest on disk, fails. */
static void test_shard_hash(void) {
    unsigned char b[1000];
    for (int i = 0; i < 1000; i++) b[i] = (unsigned char)(i * 7 + 3);
    unsigned char r[100];
    for (int i = 0; i < 100; i++) r[i] = (unsigned char)i;
    CHECK(kiln_shard_hash("", 0) == 0x766c7601bfa28fe9ull && kiln_shard_hash("a", 1) == 0x569b86e37b2d48c6ull);
    CHECK(kiln_shard_hash("kiln", 4) == 0xff4ecfe1837a1100ull && kiln_shard_hash(r, 100) == 0x64cd277dbbe9b428ull);
    CHECK(kiln_shard_hash(b, 1000) == 0x7f848e201fdb9e36ull);
    /* every single-bit change of a 100-byte input moves it */
    uint64_t h = kiln_shard_hash(r, 100);
    for (int i = 0; i < 800; i++) {
        r[i / 8] ^= (unsigned char)(1 << (i % 8));
        CHECK(kiln_shard_hash(r, 100) != h, "bit %d", i);
        r[i / 8] ^= (unsigned char)(1 << (i % 8));
    }
}

/* The manifest kiln_data_write leaves: the layout of data.h, each shard's count, size and hash of its bytes. */
static void test_manifest_written(void) {
    const char *a = tmp_path("a.txt"), *b = tmp_path("b.txt"), *dir = tmp_path("mf");
    CHECK(write_bytes(a, corpus_a, strlen(corpus_a)) && write_bytes(b, corpus_b, strlen(corpus_b)));
    const char *corpora[] = {a, b};
    kiln_data_stats st;
    CHECK(write_shards(corpora, 2, dir, 0.1, 20, &st) == KILN_OK, "%s", kiln_last_error());
    CHECK(st.n_train_shards >= 3 && st.n_val_shards == 1);
    char want[4096], path[512];
    int n = snprintf(want, sizeof want, "kiln-shards 1\nfingerprint %016llx\nshards %d %d\n", (unsigned long long)kiln_tokenizer_fingerprint(tok),
                     st.n_train_shards, st.n_val_shards);
    int64_t left = st.n_train_tokens;
    for (int i = 0; i < st.n_train_shards + 1; i++) {
        bool val = i == st.n_train_shards;
        int64_t count = val ? st.n_val_tokens : left < 20 ? left : 20;
        left -= val ? 0 : count;
        snprintf(path, sizeof path, "%s/%s_%03d.bin", dir, val ? "val" : "train", val ? 0 : i);
        size_t sz;
        unsigned char *bytes = read_bytes(path, &sz);
        CHECK(bytes && sz == (size_t)(KILN_SHARD_HEADER + 2 * count), "%s", path);
        n += snprintf(want + n, sizeof want - (size_t)n, "%s_%03d.bin %lld %zu %016llx\n", val ? "val" : "train", val ? 0 : i, (long long)count, sz,
                      (unsigned long long)kiln_shard_hash(bytes, sz));
        free(bytes);
    }
    n += snprintf(want + n, sizeof want - (size_t)n, "end\n");
    size_t got_n;
    char *got = (char *)read_bytes(tmp_path("mf/manifest.txt"), &got_n);
    CHECK(got && got_n == (size_t)n && memcmp(got, want, got_n) == 0, "manifest:\n%s\nwant:\n%s", got ? got : "(none)", want);
    free(got);
    DIR *d = opendir(dir);
    struct dirent *de;
    while (d && (de = readdir(d))) CHECK(!strstr(de->d_name, ".tmp"), "%s left behind", de->d_name);
    if (d) closedir(d);
}

static kiln_status open_train(const char *dir) {
    kiln_loader *l = NULL;
    kiln_status s = kiln_loader_open(dir, "train", kiln_tokenizer_fingerprint(tok), kiln_tokenizer_n_vocab(tok), &l);
    kiln_loader_free(l);
    return s;
}

static int copy_file(const char *from, const char *to) {
    size_t n;
    unsigned char *b = read_bytes(from, &n);
    int ok = b && write_bytes(to, b, n);
    free(b);
    return ok;
}

/* The loader trusts a folder only through its manifest: each way a folder can be incomplete or mixed is refused,
 * naming the file. */
static void test_loader_manifest_refusals(void) {
    const char *a = tmp_path("a.txt"), *dir = tmp_path("mr");
    CHECK(write_bytes(a, corpus_a, strlen(corpus_a)));
    CHECK(write_shards(&a, 1, dir, 0.1, 10, NULL) == KILN_OK, "%s", kiln_last_error());
    CHECK(open_train(dir) == KILN_OK, "%s", kiln_last_error());
    const char *mf = tmp_path("mr/manifest.txt"), *s1 = tmp_path("mr/train_001.bin"), *keep = tmp_path("mr-keep.bin");
    size_t mf_n, s1_n;
    char *mf_text = (char *)read_bytes(mf, &mf_n);
    unsigned char *s1_bytes = read_bytes(s1, &s1_n);
    CHECK(mf_text && s1_bytes);

    /* no manifest: a run that stopped before it */
    CHECK(rename(mf, tmp_path("mr-keep.txt")) == 0);
    CHECK(open_train(dir) == KILN_ERR_NOT_FOUND && strstr(kiln_last_error(), "mr/manifest.txt: missing"), "%s", kiln_last_error());
    CHECK(rename(tmp_path("mr-keep.txt"), mf) == 0 && open_train(dir) == KILN_OK);
    /* a middle shard deleted: the data after it is not dropped in silence */
    CHECK(rename(s1, keep) == 0);
    CHECK(open_train(dir) == KILN_ERR_FORMAT && strstr(kiln_last_error(), "mr/train_001.bin: missing"), "%s", kiln_last_error());
    CHECK(rename(keep, s1) == 0 && open_train(dir) == KILN_OK);
    /* one token changed, the size kept */
    s1_bytes[KILN_SHARD_HEADER] ^= 1;
    CHECK(write_bytes(s1, s1_bytes, s1_n));
    CHECK(open_train(dir) == KILN_ERR_FORMAT && strstr(kiln_last_error(), "mr/train_001.bin: changed"), "%s", kiln_last_error());
    s1_bytes[KILN_SHARD_HEADER] ^= 1;
    /* two shards of the same size swapped */
    CHECK(copy_file(tmp_path("mr/train_000.bin"), s1));
    CHECK(open_train(dir) == KILN_ERR_FORMAT && strstr(kiln_last_error(), "mr/train_001.bin: changed"), "%s", kiln_last_error());
    /* truncated, grown */
    CHECK(write_bytes(s1, s1_bytes, s1_n - 2));
    CHECK(open_train(dir) == KILN_ERR_FORMAT && strstr(kiln_last_error(), "mr/train_001.bin: truncated"), "%s", kiln_last_error());
    unsigned char *grown = calloc(1, s1_n + 2);
    memcpy(grown, s1_bytes, s1_n);
    CHECK(write_bytes(s1, grown, s1_n + 2));
    free(grown);
    CHECK(open_train(dir) == KILN_ERR_FORMAT && strstr(kiln_last_error(), "mr/train_001.bin: grown"), "%s", kiln_last_error());
    CHECK(write_bytes(s1, s1_bytes, s1_n) && open_train(dir) == KILN_OK);
    /* shard files the manifest does not list: one past the last, a val shard, a name kiln data never writes */
    const char *extras[] = {"mr/train_099.bin", "mr/val_001.bin", "mr/train_0001.bin", "mr/val_5.bin"};
    for (int i = 0; i < 4; i++) {
        CHECK(copy_file(s1, tmp_path(extras[i])));
        CHECK(open_train(dir) == KILN_ERR_FORMAT && strstr(kiln_last_error(), extras[i]) && strstr(kiln_last_error(), "does not list"), "%s",
              kiln_last_error());
        CHECK(unlink(tmp_path(extras[i])) == 0);
    }
    CHECK(open_train(dir) == KILN_OK, "%s", kiln_last_error());
    /* the manifest refers to folders, not paths: a shard-like name elsewhere is no concern */
    CHECK(copy_file(s1, tmp_path("mr-train_007.bin")) && open_train(dir) == KILN_OK);

    /* malformed manifests: each a located error */
    struct {
        const char *from, *to, *line;
    } bad[] = {
        {"kiln-shards 1", "kiln-shards 2", "manifest.txt:1:"},        /* a version kiln does not read */
        {"kiln-shards 1", "kiln shards 1", "manifest.txt:1:"},
        {"fingerprint ", "fingerprint  ", "manifest.txt:2:"},          /* two spaces */
        {"train_000.bin", "train_001.bin", "manifest.txt:4:"},         /* out of order */
        {"\nend\n", "\nend\nmore\n", "text after"},
        {"\nend\n", "\nend", "truncated"},
        {"\nend\n", "\n", "truncated"},
        {"\nshards ", "\nshards 9", "manifest.txt:3:"},                /* more shards than the text holds */
        {"\nshards ", "\nshards 0", "manifest.txt:3:"},                /* a leading zero */
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char *p = strstr(mf_text, bad[i].from);
        CHECK(p, "case %zu", i);
        size_t fl = strlen(bad[i].from), tl = strlen(bad[i].to), off = (size_t)(p - mf_text);
        char *t = malloc(mf_n + tl + 1);
        memcpy(t, mf_text, off);
        memcpy(t + off, bad[i].to, tl);
        memcpy(t + off + tl, p + fl, mf_n - off - fl);
        CHECK(write_bytes(mf, t, mf_n - fl + tl));
        free(t);
        kiln_status s = open_train(dir);
        CHECK((s == KILN_ERR_FORMAT || (i == 0 && s == KILN_ERR_UNSUPPORTED)) && strstr(kiln_last_error(), bad[i].line), "case %zu: %s", i,
              kiln_last_error());
    }
    CHECK(write_bytes(mf, mf_text, mf_n) && open_train(dir) == KILN_OK);
    /* a manifest that is a folder */
    CHECK(unlink(mf) == 0 && mkdir(mf, 0700) == 0);
    CHECK(open_train(dir) == KILN_ERR_IO && strstr(kiln_last_error(), "is a directory"), "%s", kiln_last_error());
    CHECK(rmdir(mf) == 0);
    free(mf_text);
    free(s1_bytes);
}

/* Runs kiln_data_write in a child with the process's file size limit at limit bytes (a full disk for every
 * write past it: EFBIG once SIGXFSZ is ignored), or stopping it with _exit after its first corpus when limit is 0
 * (a kill). Returns the child's exit status: 0 when kiln_data_write failed, 2 when it succeeded, 3 when it was
 * stopped. */
static void exit_after_first(void *ud, const kiln_progress *p) {
    (void)ud, (void)p;
    _exit(3);
}

static int data_write_stopped(const char *const *corpora, int n, const char *dir, long limit) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        kiln_data_params p = {.val_fraction = 0.1, .shard_tokens = 5};
        if (limit) {
            signal(SIGXFSZ, SIG_IGN);
            struct rlimit rl = {.rlim_cur = (rlim_t)limit, .rlim_max = (rlim_t)limit};
            setrlimit(RLIMIT_FSIZE, &rl);
        } else
            p.progress = exit_after_first;
        _exit(kiln_data_write(corpora, n, tok, dir, &p, NULL) == KILN_OK ? 2 : 0);
    }
    int st;
    if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st)) return -1;
    return WEXITSTATUS(st);
}

/* A run stopped by a full disk or a kill leaves a folder the loader refuses, also over an earlier whole run. */
static void test_data_stopped_run(void) {
    const char *a = tmp_path("a.txt"), *b = tmp_path("b.txt"), *dir = tmp_path("full");
    CHECK(write_bytes(a, corpus_a, strlen(corpus_a)) && write_bytes(b, corpus_b, strlen(corpus_b)));
    const char *corpora[] = {a, b};
    /* 5-token shards are 74 bytes; the manifest of their 15-odd is past 500: the disk fills at the manifest */
    int rc = data_write_stopped(corpora, 2, dir, 500);
    CHECK(rc == 0, "child status %d", rc);
    CHECK(access(tmp_path("full/train_000.bin"), F_OK) == 0, "the shards before the full disk are there");
    CHECK(open_train(dir) == KILN_ERR_NOT_FOUND && strstr(kiln_last_error(), "manifest.txt: missing"), "%s", kiln_last_error());
    DIR *d = opendir(dir);
    struct dirent *de;
    while (d && (de = readdir(d))) CHECK(!strstr(de->d_name, ".tmp"), "%s left behind", de->d_name);
    if (d) closedir(d);
    /* a whole run, then a second run over it killed after its first corpus: the old manifest does not vouch for
     * the new shards */
    CHECK(write_shards(corpora, 2, dir, 0.1, 5, NULL) == KILN_OK && open_train(dir) == KILN_OK, "%s", kiln_last_error());
    const char *other[] = {b, a};
    CHECK(data_write_stopped(other, 2, dir, 0) == 3);
    CHECK(open_train(dir) == KILN_ERR_NOT_FOUND && strstr(kiln_last_error(), "manifest.txt: missing"), "%s", kiln_last_error());
    CHECK(write_shards(corpora, 2, dir, 0.1, 5, NULL) == KILN_OK && open_train(dir) == KILN_OK, "%s", kiln_last_error());
}

/* A corpus that is a folder or a FIFO is refused by name before any read; the FIFO must not block (alarm: a
 * blocked open ends the program, a failure). Bad input, these or invalid UTF-8, leaves an earlier run's folder
 * whole. */
static void test_data_not_regular(void) {
    const char *dir = tmp_path("nr"), *fifo = tmp_path("nr.fifo"), *a = tmp_path("a.txt");
    CHECK(write_bytes(a, corpus_a, strlen(corpus_a)));
    CHECK(write_shards(&a, 1, dir, 0.1, 7, NULL) == KILN_OK && open_train(dir) == KILN_OK, "%s", kiln_last_error());
    CHECK(mkdir(tmp_path("nr-corpus"), 0700) == 0 && mkfifo(fifo, 0600) == 0);
    const char *folder = tmp_path("nr-corpus");
    CHECK(write_shards(&folder, 1, dir, 0.1, 0, NULL) == KILN_ERR_IO);
    CHECK(strstr(kiln_last_error(), "nr-corpus: is a directory"), "%s", kiln_last_error());
    alarm(20);
    const char *two[] = {a, fifo};
    kiln_status s = write_shards(two, 2, dir, 0.1, 0, NULL);
    alarm(0);
    CHECK(s == KILN_ERR_IO && strstr(kiln_last_error(), "nr.fifo: is not a regular file"), "%s", kiln_last_error());
    /* refused before anything was written: the earlier run's folder is whole, and so after invalid UTF-8 in a
     * second corpus */
    CHECK(open_train(dir) == KILN_OK, "%s", kiln_last_error());
    const char *bad = tmp_path("nr-bad.txt"), *with_bad[] = {a, bad};
    CHECK(write_bytes(bad, "ok \xff", 4));
    CHECK(write_shards(with_bad, 2, dir, 0.1, 0, NULL) == KILN_ERR_FORMAT && strstr(kiln_last_error(), "nr-bad.txt"), "%s", kiln_last_error());
    CHECK(open_train(dir) == KILN_OK && access(tmp_path("nr/train_001.bin"), F_OK) == 0, "%s", kiln_last_error());
}

/* ---------------------------------------------------------------- fingerprint */

static void test_fingerprint(void) {
    kiln_tokenizer *t1, *t2;
    CHECK(kiln_tokenizer_load_file(tok_path, &t1) == KILN_OK && kiln_tokenizer_load_file(tok_path, &t2) == KILN_OK);
    uint64_t f = kiln_tokenizer_fingerprint(t1);
    CHECK(f == kiln_tokenizer_fingerprint(t2) && f == kiln_tokenizer_fingerprint(tok), "the same file loaded twice");
    /* one token's type */
    kiln_token_type old = t2->tokens[300].type;
    t2->tokens[300].type = KILN_TOKEN_USER_DEFINED;
    CHECK(kiln_tokenizer_fingerprint(t2) != f);
    t2->tokens[300].type = old;
    CHECK(kiln_tokenizer_fingerprint(t2) == f);
    /* two merges swapping ranks: the same set of merges in another order */
    CHECK(t2->n_merges >= 2);
    int64_t i0 = -1, i1 = -1;
    for (uint64_t i = 0; i < t2->merge_cap; i++)
        if (t2->merge_keys[i] != UINT64_MAX) {
            if (t2->merge_ranks[i] == 0) i0 = (int64_t)i;
            if (t2->merge_ranks[i] == 1) i1 = (int64_t)i;
        }
    CHECK(i0 >= 0 && i1 >= 0);
    t2->merge_ranks[i0] = 1, t2->merge_ranks[i1] = 0;
    CHECK(kiln_tokenizer_fingerprint(t2) != f);
    t2->merge_ranks[i0] = 0, t2->merge_ranks[i1] = 1;
    /* one merge's right part */
    uint64_t key = t2->merge_keys[i0];
    t2->merge_keys[i0] = (key & ~0xFFFFFFFFull) | 65;
    CHECK(kiln_tokenizer_fingerprint(t2) != f);
    t2->merge_keys[i0] = key;
    CHECK(kiln_tokenizer_fingerprint(t2) == f);
    kiln_tokenizer_free(t1);
    kiln_tokenizer_free(t2);
    /* a published vocab, when the shared data has it, differs from ours */
    char path[512];
    snprintf(path, sizeof path, "%s/vocab/ggml-vocab-gpt-2.gguf", test_data_dir());
    if (access(path, R_OK) == 0) {
        CHECK(kiln_tokenizer_load_file(path, &t1) == KILN_OK);
        CHECK(kiln_tokenizer_fingerprint(t1) != f);
        kiln_tokenizer_free(t1);
    }
}

/* ---------------------------------------------------------------- plot */

/* The points of <polyline class="cls" ... points="...">, -1 if there is none. */
static int polyline_points(const char *svg, const char *cls) {
    char key[64];
    snprintf(key, sizeof key, "<polyline class=\"%s\"", cls);
    const char *p = strstr(svg, key);
    if (!p) return -1;
    p = strstr(p, "points=\"");
    if (!p) return -1;
    p += 8;
    int n = 0;
    for (;;) {
        char *e;
        double x = strtod(p, &e);
        if (e == p || *e != ',') break;
        double y = strtod(e + 1, &e);
        (void)x, (void)y;
        n++;
        p = e;
        while (*p == ' ') p++;
    }
    return *p == '"' ? n : -1;
}

/* Every element opened is closed in order (or self-closed): a small XML well-formedness check. */
static int xml_balanced(const char *s) {
    char stack[64][32];
    int depth = 0;
    for (const char *p = strchr(s, '<'); p; p = strchr(p + 1, '<')) {
        if (p[1] == '?') continue;
        const char *e = strchr(p, '>');
        if (!e) return 0;
        int close = p[1] == '/';
        const char *name = p + 1 + close;
        size_t nl = strcspn(name, " />");
        if (nl == 0 || nl >= 32) return 0;
        if (close) {
            if (depth == 0 || strncmp(stack[depth - 1], name, nl) || stack[depth - 1][nl]) return 0;
            depth--;
        } else if (e[-1] != '/') {
            if (depth == 64) return 0;
            memcpy(stack[depth], name, nl);
            stack[depth++][nl] = 0;
        }
    }
    return depth == 0;
}

/* The values of <text class="cls" ...>V</text>, in order; returns their count. */
static int tick_labels(const char *svg, const char *cls, double *out, int max) {
    char key[64];
    snprintf(key, sizeof key, "<text class=\"%s\"", cls);
    int n = 0;
    for (const char *p = strstr(svg, key); p && n < max; p = strstr(p + 1, key)) out[n++] = strtod(strchr(p, '>') + 1, NULL);
    return n;
}

/* Equally spaced by 1, 2 or 5 times a power of ten. */
static int nice_spacing(const double *v, int n) {
    if (n < 2) return 0;
    double d = v[1] - v[0];
    for (int i = 2; i < n; i++)
        if (fabs(v[i] - v[i - 1] - d) > 1e-9 * fabs(d)) return 0;
    double m = d / pow(10, floor(log10(d) + 1e-9));
    return fabs(m - 1) < 1e-6 || fabs(m - 2) < 1e-6 || fabs(m - 5) < 1e-6;
}

static char *plot(const char *log_text, const char *title, kiln_status *st) {
    const char *log = tmp_path("log.jsonl"), *svg = tmp_path("loss.svg");
    remove(svg);
    write_bytes(log, log_text, strlen(log_text));
    *st = kiln_plot_loss_svg(log, svg, title);
    size_t n;
    return *st ? NULL : (char *)read_bytes(svg, &n);
}

static void test_plot_svg(void) {
    /* 10 training points at steps 10..100, loss 5.0 down to 3.2, 3 validation points, and lines to ignore */
    char log[4096];
    size_t n = (size_t)snprintf(log, sizeof log, "{\"event\": \"start\", \"config\": {\"lr\": [1, 2]}}\n\n");
    for (int i = 1; i <= 10; i++) {
        n += (size_t)snprintf(log + n, sizeof log - n, "{\"step\": %d, \"loss\": %.2f, \"lr\": 0.001, \"grad_norm\": 0.9, \"tok_s\": 12000}\n", 10 * i,
                              5.0 - 0.2 * (i - 1));
        if (i % 4 == 0) n += (size_t)snprintf(log + n, sizeof log - n, "{\"step\": %d, \"val_loss\": %.2f, \"val_ppl\": 22.2}\n", 10 * i, 4.9 - 0.2 * i);
    }
    n += (size_t)snprintf(log + n, sizeof log - n, "{\"step\": 100, \"val_loss\": 2.9}\n");
    kiln_status st;
    char *svg = plot(log, "tiny <run> & co", &st);
    CHECK(svg, "%s", kiln_last_error());
    CHECK(strstr(svg, "<svg") && strstr(svg, "</svg>") && xml_balanced(svg));
    CHECK(polyline_points(svg, "train") == 10 && polyline_points(svg, "val") == 3 && polyline_points(svg, "train-ema") == -1);
    CHECK(strstr(svg, ">train (last 3.2)</text>") && strstr(svg, ">val (last 2.9)</text>"), "legend");
    CHECK(strstr(svg, "tiny &lt;run&gt; &amp; co") && strstr(svg, ">step</text>") && strstr(svg, ">loss</text>"));
    int circles = 0;
    for (const char *p = strstr(svg, "class=\"val-markers\""); p && (p = strstr(p, "<circle")); p++) circles++;
    CHECK(circles == 3 + 1, "3 markers and the legend's");
    /* x ticks: nice, spanning the steps 10..100; y ticks: nice, inside [2.9, 5.0] padded by 5% */
    double xt[32], yt[32];
    int nx = tick_labels(svg, "xtick", xt, 32), ny = tick_labels(svg, "ytick", yt, 32);
    CHECK(nx >= 3 && nice_spacing(xt, nx) && xt[0] <= 10 && xt[nx - 1] >= 100, "%d x ticks", nx);
    CHECK(ny >= 3 && nice_spacing(yt, ny) && yt[0] >= 2.9 - 0.105 - 1e-9 && yt[ny - 1] <= 5.0 + 0.105 + 1e-9, "%d y ticks", ny);
    CHECK(yt[1] - yt[0] <= (5.0 - 2.9) / 2, "at least three ticks over the data");
    free(svg);

    /* a long curve: raw under a smoothed line, both with every point */
    char *big = malloc(200 * 64);
    n = 0;
    unsigned long long seed = 5;
    for (int i = 0; i < 200; i++) n += (size_t)sprintf(big + n, "{\"step\": %d, \"loss\": %.4f}\n", i, 4.0 + 0.5 * test_rng_f32(&seed));
    svg = plot(big, NULL, &st);
    free(big);
    CHECK(svg, "%s", kiln_last_error());
    CHECK(polyline_points(svg, "train") == 200 && polyline_points(svg, "train-ema") == 200 && polyline_points(svg, "val") == -1);
    CHECK(strstr(svg, ">training loss</text>") && xml_balanced(svg));
    free(svg);
}

static void test_plot_errors(void) {
    kiln_status st;
    char *svg = plot("{\"step\": 1, \"loss\": 3}\n{\"step\": 2, \"loss\": 2.9}\n{\"step\": 5, \"loss\": }\n", NULL, &st);
    CHECK(!svg && st == KILN_ERR_FORMAT && strstr(kiln_last_error(), "log.jsonl:3:"), "%s", kiln_last_error());
    svg = plot("{\"step\": 1, \"loss\": \"low\"}\n", NULL, &st);
    CHECK(!svg && st == KILN_ERR_FORMAT && strstr(kiln_last_error(), "log.jsonl:1:"), "%s", kiln_last_error());
    svg = plot("{\"step\": 1, \"loss\": 3}\n\n{\"step\": 2, \"loss\": 3} trailing\n", NULL, &st);
    CHECK(!svg && st == KILN_ERR_FORMAT && strstr(kiln_last_error(), "log.jsonl:3:"), "%s", kiln_last_error());
    svg = plot("step 1 loss 3\n", NULL, &st);
    CHECK(!svg && st == KILN_ERR_FORMAT && strstr(kiln_last_error(), "log.jsonl:1:"), "%s", kiln_last_error());
    svg = plot("", NULL, &st);
    CHECK(!svg && st == KILN_ERR_FORMAT && strstr(kiln_last_error(), "no points"), "%s", kiln_last_error());
    svg = plot("{\"event\": \"start\"}\n{\"step\": 3}\n", NULL, &st);
    CHECK(!svg && st == KILN_ERR_FORMAT && strstr(kiln_last_error(), "no points"), "%s", kiln_last_error());
    CHECK(kiln_plot_loss_svg(tmp_path("missing.jsonl"), tmp_path("x.svg"), NULL) == KILN_ERR_IO);
    /* a diverged run's nan is read, not drawn */
    svg = plot("{\"step\": 1, \"loss\": 3}\n{\"step\": 2, \"loss\": nan}\n{\"step\": 3, \"loss\": 2.5}\n", NULL, &st);
    CHECK(svg && polyline_points(svg, "train") == 2, "%s", kiln_last_error());
    free(svg);
}

/* ---------------------------------------------------------------- CLI */

static int run_cmd(const char *cmd) {
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static void test_cli(void) {
    const char *bin = getenv("KILN_BIN");
    if (!bin || !*bin) SKIP("KILN_BIN is not set (make test sets it)");
    /* the CLI's shards are byte for byte the library's (round trip test, same corpora and options) */
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' data '%s' '%s' -t '%s' -o '%s' --val-fraction 0.1 --shard-tokens 50 2>'%s'", bin, tmp_path("a.txt"),
             tmp_path("b.txt"), tok_path, tmp_path("cli"), tmp_path("cli.err"));
    CHECK(write_bytes(tmp_path("a.txt"), corpus_a, strlen(corpus_a)) && write_bytes(tmp_path("b.txt"), corpus_b, strlen(corpus_b)));
    CHECK(run_cmd(cmd) == 0, "%s", cmd);
    const char *corpora[] = {tmp_path("a.txt"), tmp_path("b.txt")};
    kiln_data_stats st;
    CHECK(write_shards(corpora, 2, tmp_path("lib"), 0.1, 50, &st) == KILN_OK);
    for (int i = 0; i < st.n_train_shards + st.n_val_shards; i++) {
        char n1[64], n2[64];
        const char *split = i < st.n_train_shards ? "train" : "val";
        int k = i < st.n_train_shards ? i : i - st.n_train_shards;
        snprintf(n1, sizeof n1, "cli/%s_%03d.bin", split, k);
        snprintf(n2, sizeof n2, "lib/%s_%03d.bin", split, k);
        size_t s1, s2;
        unsigned char *b1 = read_bytes(tmp_path(n1), &s1), *b2 = read_bytes(tmp_path(n2), &s2);
        int same = b1 && b2 && s1 == s2 && memcmp(b1, b2, s1) == 0;
        free(b1), free(b2);
        CHECK(same, "%s", n1);
    }
    size_t en;
    char *err = (char *)read_bytes(tmp_path("cli.err"), &en);
    CHECK(err && strstr(err, "train tokens") && strstr(err, "tokens/s"), "%s", err ? err : "");
    free(err);
    /* errors: one line on stderr and status 1 */
    CHECK(write_bytes(tmp_path("bad.txt"), "ab\xff", 3));
    snprintf(cmd, sizeof cmd, "'%s' data '%s' -t '%s' -o '%s' 2>'%s'", bin, tmp_path("bad.txt"), tok_path, tmp_path("cli"), tmp_path("cli.err"));
    CHECK(run_cmd(cmd) == 1);
    err = (char *)read_bytes(tmp_path("cli.err"), &en);
    CHECK(err && strstr(err, "bad.txt") && strstr(err, "byte 2") && strchr(err, '\n') == err + en - 1, "%s", err ? err : "");
    free(err);
    snprintf(cmd, sizeof cmd, "'%s' data '%s' -o '%s' 2>/dev/null", bin, tmp_path("a.txt"), tmp_path("cli"));
    CHECK(run_cmd(cmd) == 1, "no tokenizer");
    /* plot */
    const char *good = "{\"step\": 1, \"loss\": 3}\n{\"step\": 2, \"loss\": 2.5}\n", *bad_log = "{\"step\": 1, \"loss\": 3}\n{oops\n";
    CHECK(write_bytes(tmp_path("cli.jsonl"), good, strlen(good)));
    snprintf(cmd, sizeof cmd, "'%s' plot '%s' -o '%s' --title 'a run' 2>/dev/null", bin, tmp_path("cli.jsonl"), tmp_path("cli.svg"));
    CHECK(run_cmd(cmd) == 0);
    char *svg = (char *)read_bytes(tmp_path("cli.svg"), &en);
    CHECK(svg && strstr(svg, ">a run</text>") && polyline_points(svg, "train") == 2);
    free(svg);
    CHECK(write_bytes(tmp_path("cli.jsonl"), bad_log, strlen(bad_log)));
    snprintf(cmd, sizeof cmd, "'%s' plot '%s' -o '%s' 2>'%s'", bin, tmp_path("cli.jsonl"), tmp_path("cli.svg"), tmp_path("cli.err"));
    CHECK(run_cmd(cmd) == 1);
    err = (char *)read_bytes(tmp_path("cli.err"), &en);
    CHECK(err && strstr(err, "cli.jsonl:2:"), "%s", err ? err : "");
    free(err);
}

/* A llama2.c tokenizer.bin: max_token_length, then each token's float score, int32 length and bytes. */
static int write_llama2c_tok(const char *path) {
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    int32_t max_len = 8;
    fwrite(&max_len, 4, 1, f);
    const char *fixed[] = {"<unk>", "<s>", "</s>"};
    for (int i = 0; i < 3 + 256 + 26; i++) {
        char text[16];
        if (i < 3) snprintf(text, sizeof text, "%s", fixed[i]);
        else if (i < 259) snprintf(text, sizeof text, "<0x%02X>", i - 3);
        else snprintf(text, sizeof text, "%c", 'a' + i - 259);
        float score = i < 259 ? 0.0f : -(float)i;
        int32_t len = (int32_t)strlen(text);
        fwrite(&score, 4, 1, f);
        fwrite(&len, 4, 1, f);
        fwrite(text, 1, (size_t)len, f);
    }
    return fclose(f) == 0;
}

/* The last line kiln wrote to path (its error, after any progress line), without its newline, or "" (static). */
static const char *err_line(const char *path) {
    static char line[2048];
    size_t n = 0;
    char *e = (char *)read_bytes(path, &n);
    while (n && e[n - 1] == '\n') e[--n] = 0;
    const char *last = e ? e : "";
    for (size_t i = 0; i < n; i++)
        if (e[i] == '\n' || e[i] == '\r') last = e + i + 1;
    snprintf(line, sizeof line, "%s", last);
    free(e);
    return line;
}

/* kiln data refuses what kiln train refuses, with the same reason: a llama2.c tokenizer.bin, which
 * kiln_tokenizer_load_file reads, and a folder given as -t. */
static void test_cli_tokenizer_check(void) {
    const char *bin = getenv("KILN_BIN");
    if (!bin || !*bin) SKIP("KILN_BIN is not set (make test sets it)");
    const char *l2c = tmp_path("tok-l2c.bin");
    CHECK(write_llama2c_tok(l2c) && write_bytes(tmp_path("a.txt"), corpus_a, strlen(corpus_a)));
    kiln_tokenizer *t;
    CHECK(kiln_tokenizer_load_file(l2c, &t) == KILN_OK, "the file is a tokenizer kiln reads: %s", kiln_last_error());
    kiln_tokenizer_free(t);
    CHECK(kiln_data_tokenizer_load(l2c, &t) == KILN_ERR_UNSUPPORTED && !t && strstr(kiln_last_error(), "not a GGUF file"), "%s", kiln_last_error());
    CHECK(kiln_data_tokenizer_load(tmp_dir, &t) == KILN_ERR_IO && strstr(kiln_last_error(), "is a directory"), "%s", kiln_last_error());
    CHECK(kiln_data_tokenizer_load(tok_path, &t) == KILN_OK && kiln_tokenizer_fingerprint(t) == kiln_tokenizer_fingerprint(tok));
    kiln_tokenizer_free(t);
    const char *toks[] = {l2c, tmp_dir};
    for (int i = 0; i < 2; i++) {
        char cmd[2048], data_err[2048], train_err[2048];
        snprintf(cmd, sizeof cmd, "'%s' data '%s' -t '%s' -o '%s' 2>'%s'", bin, tmp_path("a.txt"), toks[i], tmp_path("cli-l2c"), tmp_path("d.err"));
        CHECK(run_cmd(cmd) == 1, "%s", cmd);
        snprintf(data_err, sizeof data_err, "%s", err_line(tmp_path("d.err")));
        CHECK(access(tmp_path("cli-l2c/train_000.bin"), F_OK) != 0, "no shards written");
        snprintf(cmd, sizeof cmd, "'%s' train --data '%s' -t '%s' -C 32 -L 1 --heads 2 --kv-heads 2 -F 32 -B 1 -T 8 --steps 1 -o '%s' 2>'%s'",
                 bin, tmp_path("cli"), toks[i], tmp_path("l2c.gguf"), tmp_path("t.err"));
        CHECK(run_cmd(cmd) == 1, "%s", cmd);
        snprintf(train_err, sizeof train_err, "%s", err_line(tmp_path("t.err")));
        CHECK(strstr(data_err, toks[i]) && (strstr(data_err, "not a GGUF file") || strstr(data_err, "is a directory")), "%s", data_err);
        CHECK(strcmp(data_err, train_err) == 0, "kiln data: %s; kiln train: %s", data_err, train_err);
    }
}

/* kiln data's numeric flags take the strict parsers (the error names the flag), and -- ends the options. */
static void test_cli_data_flags(void) {
    const char *bin = getenv("KILN_BIN");
    if (!bin || !*bin) SKIP("KILN_BIN is not set (make test sets it)");
    CHECK(write_bytes(tmp_path("a.txt"), corpus_a, strlen(corpus_a)));
    struct {
        const char *flag, *value;
    } bad[] = {{"--val-fraction", "0x0.1"}, {"--val-fraction", "nan"}, {"--val-fraction", "1"},   {"--val-fraction", "-0.1"},
               {"--val-fraction", "0.1x"},  {"--shard-tokens", "1e3"},  {"--shard-tokens", "0"}, {"--shard-tokens", "-5"},
               {"--shard-tokens", "99999999999999999999"}, {"--shard-tokens", ""}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char cmd[2048];
        snprintf(cmd, sizeof cmd, "'%s' data '%s' -t '%s' -o '%s' %s '%s' 2>'%s'", bin, tmp_path("a.txt"), tok_path, tmp_path("flags"), bad[i].flag,
                 bad[i].value, tmp_path("f.err"));
        CHECK(run_cmd(cmd) == 1, "%s", cmd);
        const char *e = err_line(tmp_path("f.err"));
        CHECK(strstr(e, bad[i].flag) && strstr(e, "kiln: data:"), "%s %s: %s", bad[i].flag, bad[i].value, e);
        CHECK(access(tmp_path("flags/manifest.txt"), F_OK) != 0, "%s %s wrote shards", bad[i].flag, bad[i].value);
    }
    /* a corpus whose name starts with '-' after --, and an option after -- read as a corpus */
    CHECK(write_bytes(tmp_path("-dash.txt"), corpus_b, strlen(corpus_b)));
    char cmd[2048], abs_bin[4096];
    CHECK(realpath(bin, abs_bin), "%s", bin); /* the commands below run in the temporary folder */
    bin = abs_bin;
    snprintf(cmd, sizeof cmd, "cd '%s' && '%s' data -t '%s' -o dash --shard-tokens 1000 -- -dash.txt 2>dash.err", tmp_dir, bin, tok_path);
    CHECK(run_cmd(cmd) == 0, "%s: %s", cmd, err_line(tmp_path("dash.err")));
    kiln_tokens e = encode(corpus_b, strlen(corpus_b));
    int64_t n;
    int32_t *train = read_split(tmp_path("dash"), "train", &n);
    CHECK(train && n == (int64_t)e.n - n_val_of((int64_t)e.n, 0.05), "%s", kiln_last_error());
    free(train);
    kiln_tokens_free(&e);
    snprintf(cmd, sizeof cmd, "cd '%s' && '%s' data -t '%s' -o dash2 -- a.txt --val-fraction 2>dash.err", tmp_dir, bin, tok_path);
    CHECK(run_cmd(cmd) == 1 && strstr(err_line(tmp_path("dash.err")), "--val-fraction"), "%s", err_line(tmp_path("dash.err")));
}

int main(void) {
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/kiln-data-XXXXXX");
    if (!mkdtemp(tmp_dir)) {
        perror(tmp_dir);
        return 1;
    }
    /* a 400-token byte-level BPE vocab ("<s>" is BOS, added) trained on 200 kB of generated text */
    char *text = gen_text(1, 200000, 0);
    const char *corpus = tmp_path("tok.txt");
    snprintf(tok_path, sizeof tok_path, "%s", tmp_path("tok.gguf"));
    kiln_bpe_train_params p = {.vocab_size = 400, .n_threads = 1};
    if (!write_bytes(corpus, text, strlen(text)) || kiln_bpe_train(&corpus, 1, &p, tok_path) || kiln_tokenizer_load_file(tok_path, &tok)) {
        fprintf(stderr, "test_data: cannot make the test tokenizer: %s\n", kiln_last_error());
        return 1;
    }
    free(text);
    RUN(test_data_round_trip);
    RUN(test_data_progress);
    RUN(test_data_long_document);
    RUN(test_loader_wrap_and_pos);
    RUN(test_loader_refusals);
    RUN(test_loader_uint32);
    RUN(test_data_invalid_utf8);
    RUN(test_shard_hash);
    RUN(test_manifest_written);
    RUN(test_loader_manifest_refusals);
    RUN(test_data_stopped_run);
    RUN(test_data_not_regular);
    RUN(test_fingerprint);
    RUN(test_plot_svg);
    RUN(test_plot_errors);
    RUN(test_cli);
    RUN(test_cli_tokenizer_check);
    RUN(test_cli_data_flags);
    kiln_tokenizer_free(tok);
    nftw(tmp_dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    TEST_EXIT();
}
