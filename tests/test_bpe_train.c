/* test_bpe_train.c: the byte-level BPE trainer (src/tok/bpe_train.c).
 * First merges derived by hand on tiny corpora (counts, tie-break, min_frequency, specials), identical files
 * across runs and thread counts, invalid UTF-8, corpora that are a folder or a FIFO, 100 specials through
 * `kiln tokenizer train --specials` ($KILN_BIN), a Turkish round trip through kiln's encoder, and the
 * criterion: a 4096-token vocab trained on Turkish encodes held-out Turkish in fewer tokens than Llama-2's
 * 32000-token SentencePiece vocab (needs ../shared/data; prints bytes/token for both vocabs). */
#include "kiln.h"
#include "test.h"

#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---------------------------------------------------------------- helpers */

static char tmp_dir[64];

static const char *tmp_path(const char *name) {
    static char bufs[8][256];
    static int next;
    char *b = bufs[next++ % 8];
    snprintf(b, 256, "%s/%s", tmp_dir, name);
    return b;
}

static void remove_tmp_dir(void) {
    DIR *dir = opendir(tmp_dir);
    struct dirent *e;
    while (dir && (e = readdir(dir)))
        if (e->d_name[0] != '.') remove(tmp_path(e->d_name));
    if (dir) closedir(dir);
    rmdir(tmp_dir);
}

static int write_text(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    size_t w = fwrite(data, 1, n, f);
    return fclose(f) == 0 && w == n;
}

static char *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    rewind(f);
    char *b = malloc((size_t)size + 1);
    if (b && fread(b, 1, (size_t)size, f) != (size_t)size) {
        free(b);
        b = NULL;
    }
    fclose(f);
    if (b) b[size] = 0, *n = (size_t)size;
    return b;
}

static kiln_bpe_train_params params(int32_t vocab_size) {
    return (kiln_bpe_train_params){.vocab_size = vocab_size, .n_threads = 1};
}

static kiln_status train_text(const char *text, const kiln_bpe_train_params *p, const char *out) {
    const char *corpus = tmp_path("corpus.txt");
    if (!write_text(corpus, text, strlen(text))) return KILN_ERR_IO;
    return kiln_bpe_train(&corpus, 1, p, out);
}

/* A string element of an array key, as a NUL-terminated copy in buf. */
static const char *arr_str(const kiln_gguf *g, const char *key, uint64_t i, char *buf, size_t cap) {
    const kiln_gguf_value *a;
    if (kiln_gguf_get_arr(g, key, KILN_GGUF_STRING, &a) || i >= a->arr.n) return "(absent)";
    kiln_str s = a->arr.items[i].str;
    snprintf(buf, cap, "%.*s", (int)s.len, s.ptr);
    return buf;
}

static uint64_t arr_len(const kiln_gguf *g, const char *key) {
    const kiln_gguf_value *v = kiln_gguf_find(g, key);
    return v && v->type == KILN_GGUF_ARRAY ? v->arr.n : 0;
}

/* ---------------------------------------------------------------- hand-derived merges */

/* "aaab aaab aaab ab" pre-tokenizes to "aaab", " aaab" x2, " ab" (the regex keeps a space with the letters
 * after it; the byte alphabet writes it Ġ). Pair counts, each adjacent pair weighted by its word's count:
 *   (a,a) 2 + 2*2 = 6, (a,b) 1 + 2 + 1 = 4, (Ġ,a) 2 + 1 = 3   -> merge 1: a a
 *   words now [aa a b] [Ġ aa a b]x2 [Ġ a b]: (a,b) 4, (aa,a) 3, (Ġ,aa) 2, (Ġ,a) 1   -> merge 2: a b
 *   [aa ab] [Ġ aa ab]x2 [Ġ ab]: (aa,ab) 3, (Ġ,aa) 2, (Ġ,ab) 1   -> merge 3: aa ab
 *   [aaab] [Ġ aaab]x2 [Ġ ab]: (Ġ,aaab) 2, (Ġ,ab) 1   -> merge 4: Ġ aaab
 * Then only (Ġ,ab) is left, seen once: min_frequency 2 stops there, 1 merges it too. Ids: 4 specials,
 * the 256 bytes at 4 + byte, merged tokens from 260 in merge order. */
static void test_bpe_train_hand_merges(void) {
    const char *out = tmp_path("hand.gguf");
    kiln_bpe_train_params p = params(1000);
    CHECK(train_text("aaab aaab aaab ab", &p, out) == KILN_OK, "%s", kiln_last_error());
    kiln_gguf *g;
    CHECK(kiln_gguf_open(out, &g) == KILN_OK, "%s", kiln_last_error());
    char b[64];
    static const char *const merges[] = {"a a", "a b", "aa ab", "\xc4\xa0 aaab"};
    static const char *const added[] = {"aa", "ab", "aaab", "\xc4\xa0" "aaab"};
    uint64_t n_tok = arr_len(g, "tokenizer.ggml.tokens"), n_merge = arr_len(g, "tokenizer.ggml.merges");
    int ok_counts = n_tok == 264 && n_merge == 4;
    int ok = ok_counts;
    for (int i = 0; ok && i < 4; i++)
        ok = strcmp(arr_str(g, "tokenizer.ggml.merges", (uint64_t)i, b, sizeof b), merges[i]) == 0 &&
             strcmp(arr_str(g, "tokenizer.ggml.tokens", 260 + (uint64_t)i, b, sizeof b), added[i]) == 0;
    int ok_base = strcmp(arr_str(g, "tokenizer.ggml.tokens", 0, b, sizeof b), "<unk>") == 0 &&
                  strcmp(arr_str(g, "tokenizer.ggml.tokens", 3, b, sizeof b), "<pad>") == 0 &&
                  strcmp(arr_str(g, "tokenizer.ggml.tokens", 4 + ' ', b, sizeof b), "\xc4\xa0") == 0 &&
                  strcmp(arr_str(g, "tokenizer.ggml.tokens", 4 + 'a', b, sizeof b), "a") == 0 &&
                  strcmp(arr_str(g, "tokenizer.ggml.tokens", 4 + 0xff, b, sizeof b), "\xc3\xbf") == 0;
    kiln_str model = {0}, pre = {0};
    uint32_t bos = 0, eos = 0, unk = 9, pad = 0;
    bool add_bos = false, add_eos = true;
    int ok_keys = !kiln_gguf_get_str(g, "tokenizer.ggml.model", &model) && model.len == 4 && !memcmp(model.ptr, "gpt2", 4) &&
                  !kiln_gguf_get_str(g, "tokenizer.ggml.pre", &pre) && pre.len == 9 && !memcmp(pre.ptr, "llama-bpe", 9) &&
                  !kiln_gguf_get_u32(g, "tokenizer.ggml.bos_token_id", &bos) && bos == 1 &&
                  !kiln_gguf_get_u32(g, "tokenizer.ggml.eos_token_id", &eos) && eos == 2 &&
                  !kiln_gguf_get_u32(g, "tokenizer.ggml.unknown_token_id", &unk) && unk == 0 &&
                  !kiln_gguf_get_u32(g, "tokenizer.ggml.padding_token_id", &pad) && pad == 3 &&
                  !kiln_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &add_bos) && add_bos &&
                  !kiln_gguf_get_bool(g, "tokenizer.ggml.add_eos_token", &add_eos) && !add_eos &&
                  !kiln_gguf_find(g, "general.architecture");
    const kiln_gguf_value *types;
    int ok_types = !kiln_gguf_get_arr(g, "tokenizer.ggml.token_type", KILN_GGUF_INT32, &types) && types->arr.n == n_tok;
    for (uint64_t i = 0; ok_types && i < n_tok; i++) ok_types = kiln_gguf_arr_i64(types, i) == (i < 4 ? KILN_TOKEN_CONTROL : KILN_TOKEN_NORMAL);
    kiln_gguf_close(g);
    CHECK(ok_counts, "%llu tokens and %llu merges, want 264 and 4", (unsigned long long)n_tok, (unsigned long long)n_merge);
    CHECK(ok, "merges or merged tokens differ from the hand-derived ones");
    CHECK(ok_base, "specials or byte tokens misplaced");
    CHECK(ok_keys, "tokenizer keys");
    CHECK(ok_types, "token types");

    /* min_frequency 1 takes the last pair too */
    p.min_frequency = 1;
    CHECK(train_text("aaab aaab aaab ab", &p, out) == KILN_OK, "%s", kiln_last_error());
    CHECK(kiln_gguf_open(out, &g) == KILN_OK, "%s", kiln_last_error());
    n_tok = arr_len(g, "tokenizer.ggml.tokens");
    int ok5 = n_tok == 265 && strcmp(arr_str(g, "tokenizer.ggml.merges", 4, b, sizeof b), "\xc4\xa0 ab") == 0;
    kiln_gguf_close(g);
    CHECK(ok5, "with min_frequency 1: %llu tokens, merge 5 '%s'", (unsigned long long)n_tok, b);
}

/* Ties go to the smaller (left id, right id): "cd\ncd\nab\nab" has (a,b) and (c,d) twice each (a newline
 * is a word of its own and lends no Ġ), and the corpus order must not matter. A vocab of 261 stops after one merge. */
static void test_bpe_train_tie_break(void) {
    const char *out = tmp_path("tie.gguf");
    kiln_bpe_train_params p = params(261);
    CHECK(train_text("cd\ncd\nab\nab", &p, out) == KILN_OK, "%s", kiln_last_error());
    kiln_gguf *g;
    CHECK(kiln_gguf_open(out, &g) == KILN_OK, "%s", kiln_last_error());
    char b[64];
    int ok = arr_len(g, "tokenizer.ggml.tokens") == 261 && arr_len(g, "tokenizer.ggml.merges") == 1 &&
             strcmp(arr_str(g, "tokenizer.ggml.merges", 0, b, sizeof b), "a b") == 0;
    kiln_gguf_close(g);
    CHECK(ok, "first merge '%s', want 'a b'", b);
}

/* Custom specials: their ids come first, and a merge that would spell one ("ab" here) is never made.
 * "ab ab ab" is "ab", " ab" x2: (a,b) 3 is barred, so (Ġ,a) 2 then (Ġa,b) 2. */
static void test_bpe_train_specials(void) {
    const char *out = tmp_path("specials.gguf");
    static const char *const specials[] = {"ab", "<s>"};
    kiln_bpe_train_params p = params(1000);
    p.specials = specials, p.n_specials = 2;
    CHECK(train_text("ab ab ab", &p, out) == KILN_OK, "%s", kiln_last_error());
    kiln_gguf *g;
    CHECK(kiln_gguf_open(out, &g) == KILN_OK, "%s", kiln_last_error());
    char b1[64], b2[64], b3[64];
    uint32_t bos = 99;
    int ok = arr_len(g, "tokenizer.ggml.tokens") == 260 && arr_len(g, "tokenizer.ggml.merges") == 2 &&
             strcmp(arr_str(g, "tokenizer.ggml.tokens", 0, b1, sizeof b1), "ab") == 0 &&
             strcmp(arr_str(g, "tokenizer.ggml.merges", 0, b2, sizeof b2), "\xc4\xa0 a") == 0 &&
             strcmp(arr_str(g, "tokenizer.ggml.merges", 1, b3, sizeof b3), "\xc4\xa0" "a b") == 0 &&
             !kiln_gguf_get_u32(g, "tokenizer.ggml.bos_token_id", &bos) && bos == 1 && !kiln_gguf_find(g, "tokenizer.ggml.eos_token_id");
    kiln_gguf_close(g);
    CHECK(ok, "tokens/merges with specials: '%s' '%s' '%s' bos %u", b1, b2, b3, bos);

    static const char *const dup[] = {"<s>", "<s>"}, *const byte[] = {"a"}, *const empty[] = {""};
    p.specials = dup;
    CHECK(train_text("ab", &p, out) == KILN_ERR_INVALID);
    p.specials = byte, p.n_specials = 1;
    CHECK(train_text("ab", &p, out) == KILN_ERR_INVALID && strstr(kiln_last_error(), "byte token 0x61"), "%s", kiln_last_error());
    p.specials = empty;
    CHECK(train_text("ab", &p, out) == KILN_ERR_INVALID);
}

static void test_bpe_train_errors(void) {
    kiln_bpe_train_params p = params(259); /* below 4 specials + 256 bytes */
    CHECK(train_text("ab", &p, tmp_path("e.gguf")) == KILN_ERR_INVALID && strstr(kiln_last_error(), "vocab size 259"), "%s", kiln_last_error());
    p.vocab_size = 300;
    const char *missing = tmp_path("no-such-file.txt");
    CHECK(kiln_bpe_train(&missing, 1, &p, tmp_path("e.gguf")) == KILN_ERR_IO && strstr(kiln_last_error(), "no-such-file.txt"), "%s",
          kiln_last_error());
    CHECK(kiln_bpe_train(&missing, 0, &p, tmp_path("e.gguf")) == KILN_ERR_INVALID);
    /* an empty corpus gives the base vocab, and so does one of invalid UTF-8 and spaces: each invalid byte is
     * a word of its own, so no pair forms */
    static const char *const base_only[] = {"", "\xc4\xc4 \xc4\xc4 \xff\xff \xff\xff"};
    for (int i = 0; i < 2; i++) {
        CHECK(train_text(base_only[i], &p, tmp_path("e.gguf")) == KILN_OK, "%s", kiln_last_error());
        kiln_gguf *g;
        CHECK(kiln_gguf_open(tmp_path("e.gguf"), &g) == KILN_OK, "%s", kiln_last_error());
        uint64_t n = arr_len(g, "tokenizer.ggml.tokens");
        kiln_gguf_close(g);
        CHECK(n == 260, "corpus %d: %llu tokens", i, (unsigned long long)n);
    }
}

/* A corpus that is a folder or a FIFO is refused by name before counting; the FIFO must not block (alarm: a
 * blocked open ends the program, a failure). */
static void test_bpe_train_not_regular(void) {
    kiln_bpe_train_params p = params(300);
    const char *good = tmp_path("good.txt"), *folder = tmp_path("a-folder"), *fifo = tmp_path("a.fifo");
    CHECK(write_text(good, "ab ab ab", 8) && mkdir(folder, 0700) == 0 && mkfifo(fifo, 0600) == 0);
    const char *with_folder[] = {good, folder}, *with_fifo[] = {good, fifo};
    CHECK(kiln_bpe_train(with_folder, 2, &p, tmp_path("nr.gguf")) == KILN_ERR_IO && strstr(kiln_last_error(), "a-folder: is a directory"), "%s",
          kiln_last_error());
    alarm(20);
    kiln_status s = kiln_bpe_train(with_fifo, 2, &p, tmp_path("nr.gguf"));
    alarm(0);
    CHECK(s == KILN_ERR_IO && strstr(kiln_last_error(), "a.fifo: is not a regular file"), "%s", kiln_last_error());
    CHECK(access(tmp_path("nr.gguf"), F_OK) != 0, "no vocab written");
}

/* `kiln tokenizer train --specials` with 100 of them keeps all 100, ids 0..99 in the order given. */
static void test_bpe_train_cli_many_specials(void) {
    const char *bin = getenv("KILN_BIN");
    if (!bin || !*bin) SKIP("KILN_BIN is not set (make test sets it)");
    char list[2048], cmd[4096];
    size_t n = 0;
    for (int i = 0; i < 100; i++) n += (size_t)snprintf(list + n, sizeof list - n, "%s<sp%d>", i ? "," : "", i);
    const char *corpus = tmp_path("sp.txt"), *out = tmp_path("sp.gguf");
    CHECK(write_text(corpus, "ab ab ab cd cd", 14));
    snprintf(cmd, sizeof cmd, "'%s' tokenizer train '%s' --vocab 400 -o '%s' --specials '%s' 2>/dev/null", bin, corpus, out, list);
    int rc = system(cmd);
    CHECK(rc == 0, "%s", cmd);
    kiln_gguf *g;
    CHECK(kiln_gguf_open(out, &g) == KILN_OK, "%s", kiln_last_error());
    char b[64], want[16];
    int bad = -1;
    for (int i = 0; i < 100 && bad < 0; i++) {
        snprintf(want, sizeof want, "<sp%d>", i);
        if (strcmp(arr_str(g, "tokenizer.ggml.tokens", (uint64_t)i, b, sizeof b), want) != 0) bad = i;
    }
    /* then the 256 byte tokens: token 100 is byte 0x00, written by the byte alphabet as U+0100 */
    int byte_ok = strcmp(arr_str(g, "tokenizer.ggml.tokens", 100, b, sizeof b), "\xc4\x80") == 0;
    kiln_gguf_close(g);
    CHECK(bad < 0, "token %d is '%s'", bad, b);
    CHECK(byte_ok, "token 100 is '%s'", b);
}

/* ---------------------------------------------------------------- determinism */

/* About 60 KB of Turkish-like text: 300 stems with suffixes, words repeated with a skewed distribution,
 * punctuation, digits, newlines, and a few invalid UTF-8 bytes (a lone 0xFF, a truncated 0xC4). */
static char *synthetic_corpus(size_t *n) {
    static const char *const stems[] = {"ev", "kitap", "göz", "yol", "kapı", "şehir", "ağaç", "çocuk", "iş", "gün", "söz", "dil",
                                        "İstanbul", "Şule", "Ğ", "ölçü", "üzüm", "ışık", "çiçek", "öğretmen"};
    static const char *const suffixes[] = {"", "ler", "lar", "de", "da", "den", "dan", "in", "ın", "ün", "e", "a", "i", "ı", "lerimiz", "ğı"};
    size_t cap = 80000, len = 0;
    char *buf = malloc(cap);
    unsigned long long rng = 42;
    for (int w = 0; len + 64 < cap; w++) {
        unsigned long long r = test_rng_next(&rng);
        const char *stem = stems[(r >> 8) & 1 ? r % 20 : (r >> 9) % 3]; /* half the words from 3 stems */
        const char *suf = suffixes[(r >> 16) % 16];
        len += (size_t)snprintf(buf + len, cap - len, "%s%s%s", w % 17 == 0 ? "" : " ", stem, suf);
        if (w % 11 == 0) len += (size_t)snprintf(buf + len, cap - len, "%s", (r >> 24) % 2 ? ", " : ".\n");
        if (w % 97 == 0) len += (size_t)snprintf(buf + len, cap - len, " %u ", (unsigned)(r >> 32) % 100000);
        if (w % 1009 == 0) len += (size_t)snprintf(buf + len, cap - len, " \xff \xc4 x\n\n  ");
    }
    *n = len;
    return buf;
}

static int same_file(const char *a, const char *b) {
    size_t na, nb;
    char *x = read_all(a, &na), *y = read_all(b, &nb);
    int same = x && y && na == nb && memcmp(x, y, na) == 0;
    free(x);
    free(y);
    return same;
}

static int progress_calls, progress_last_done, progress_last_total, progress_bad;
static void on_progress(void *ud, const kiln_progress *pr) {
    (void)ud;
    const int done = (int)pr->done, total = (int)pr->total;
    if (strcmp(pr->stage, "tokenizer") != 0 || pr->train || !isnan(pr->metric)) progress_bad = 1;
    if (done < progress_last_done || (progress_calls && total != progress_last_total)) progress_bad = 1;
    progress_calls++, progress_last_done = done, progress_last_total = total;
}

static void test_bpe_train_deterministic(void) {
    size_t n;
    char *text = synthetic_corpus(&n);
    const char *corpus = tmp_path("synthetic.txt");
    int wrote = write_text(corpus, text, n);
    free(text);
    CHECK(wrote);
    const char *outs[3] = {tmp_path("det1.gguf"), tmp_path("det2.gguf"), tmp_path("det3.gguf")};
    kiln_bpe_train_params p = params(700);
    p.progress = on_progress;
    CHECK(kiln_bpe_train(&corpus, 1, &p, outs[0]) == KILN_OK, "%s", kiln_last_error());
    CHECK(!progress_bad && progress_calls >= 4 && progress_last_done <= progress_last_total && progress_last_total == 700 - 260,
          "progress: %d calls, last %d of %d", progress_calls, progress_last_done, progress_last_total);
    p.progress = NULL;
    CHECK(kiln_bpe_train(&corpus, 1, &p, outs[1]) == KILN_OK, "%s", kiln_last_error());
    p.n_threads = 2;
    CHECK(kiln_bpe_train(&corpus, 1, &p, outs[2]) == KILN_OK, "%s", kiln_last_error());
    CHECK(same_file(outs[0], outs[1]), "two runs differ");
    CHECK(same_file(outs[0], outs[2]), "1 and 2 threads differ");
    /* the same corpus given as two files splits no word differently: same counts, same vocab */
    p.n_threads = 3;
    const char *two[2] = {corpus, tmp_path("empty.txt")};
    CHECK(write_text(two[1], "", 0));
    CHECK(kiln_bpe_train(two, 2, &p, outs[1]) == KILN_OK, "%s", kiln_last_error());
    CHECK(same_file(outs[0], outs[1]), "3 threads and an extra empty file differ");
}

/* ---------------------------------------------------------------- through the encoder */

static const char turkish[] =
    "Ağaçların gölgesinde oturan çocuklar, ılık rüzgârın getirdiği çiçek kokusunu içlerine çektiler.\n"
    "İstanbul'un Şişli ilçesinde yaşayan Ömer, her sabah işe gitmeden önce çay içer.\n"
    "Öğretmenimiz dün sınıfta Türkçe dilbilgisi kurallarını anlattı; öğrenciler soru sordu.\n"
    "Ğ harfi hiçbir Türkçe kelimenin başında yer almaz, ama ŞİŞE ve IĞDIR büyük harfle yazılır.\n"
    "Güneşli bir günde gölün kıyısında yürüyüş yapmak çok güzeldir, değil mi?\n";

static void test_bpe_train_turkish_round_trip(void) {
    char *text = malloc(sizeof turkish * 30);
    size_t n = 0;
    for (int i = 0; i < 30; i++) memcpy(text + n, turkish, sizeof turkish - 1), n += sizeof turkish - 1;
    const char *corpus = tmp_path("turkish.txt"), *out = tmp_path("turkish.gguf");
    int wrote = write_text(corpus, text, n);
    free(text);
    CHECK(wrote);
    kiln_bpe_train_params p = params(500);
    CHECK(kiln_bpe_train(&corpus, 1, &p, out) == KILN_OK, "%s", kiln_last_error());

    kiln_tokenizer *t;
    CHECK(kiln_tokenizer_load_file(out, &t) == KILN_OK, "%s", kiln_last_error());
    static const char *const samples[] = {
        "Öğretmenimiz dün sınıfta Türkçe dilbilgisi kurallarını anlattı.",
        "ğüşıöç İŞĞ ĞÜŞİÖÇ: ağaç, çiçek, ılık, gölge 2024'te 3.14 kez!\n\n  boşluklar\tve sekme",
        "Yeni kelimeler: kütüphanecilik, Çanakkale, Eskişehir \xf0\x9f\x8c\xb3 and English text.",
        "",
    };
    char model[16];
    snprintf(model, sizeof model, "%s", kiln_tokenizer_model(t));
    int32_t n_vocab = kiln_tokenizer_n_vocab(t), bos = kiln_tokenizer_bos(t), eos = kiln_tokenizer_eos(t);
    int fail = -1;
    size_t first_len = 0, n_ids0 = 0;
    for (int i = 0; i < 4 && fail < 0; i++) {
        kiln_tokens ids = {0};
        char *back = NULL;
        size_t len = 0;
        size_t in_len = strlen(samples[i]);
        if (kiln_tokenizer_encode(t, samples[i], in_len, false, false, &ids) ||
            kiln_tokenizer_decode(t, ids.ids, ids.n, false, &back, &len) || len != in_len || memcmp(back, samples[i], len) != 0)
            fail = i;
        if (i == 0) first_len = in_len, n_ids0 = ids.n;
        free(back);
        kiln_tokens_free(&ids);
    }
    /* add_special puts BOS first (add_bos_token true) and no EOS */
    kiln_tokens ids = {0};
    kiln_status s = kiln_tokenizer_encode(t, "ağaç", strlen("ağaç"), true, false, &ids);
    int ok_bos = s == KILN_OK && ids.n >= 2 && ids.ids[0] == 1 && ids.ids[ids.n - 1] != 2;
    kiln_tokens_free(&ids);
    kiln_tokenizer_free(t);
    CHECK(strcmp(model, "gpt2") == 0 && n_vocab == 500 && bos == 1 && eos == 2, "loaded as '%s', a vocab of %d with BOS %d and EOS %d; want gpt2, 500, 1, 2",
          model, n_vocab, bos, eos);
    CHECK(fail < 0, "sample %d does not survive encode + decode: %s", fail, kiln_last_error());
    /* a sentence of the corpus must compress well: fewer than one token per 3 bytes */
    CHECK(n_ids0 * 3 < first_len, "%zu tokens for %zu bytes", n_ids0, first_len);
    CHECK(ok_bos, "BOS with add_special");
}

/* ---------------------------------------------------------------- the criterion */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Tokens for a whole file, no BOS/EOS. */
static long count_tokens(const kiln_tokenizer *t, const char *path, size_t *bytes) {
    size_t n;
    char *text = read_all(path, &n);
    if (!text) return -1;
    kiln_tokens ids = {0};
    kiln_status s = kiln_tokenizer_encode(t, text, n, false, false, &ids);
    long count = s ? -1 : (long)ids.n;
    kiln_tokens_free(&ids);
    free(text);
    *bytes = n;
    return count;
}

static void test_bpe_train_turkish_beats_llama2(void) {
    char train_a[512], train_b[512], test_tr[512], test_en[512], spm[512];
    const char *d = test_data_dir();
    snprintf(train_a, sizeof train_a, "%s/corpora/turkish/manpages-tr_2.0.6-2_rendered.txt", d);
    snprintf(train_b, sizeof train_b, "%s/corpora/turkish/tr_boun-ud-dev.txt", d);
    snprintf(test_tr, sizeof test_tr, "%s/corpora/turkish/tr_boun-ud-test.txt", d);
    snprintf(test_en, sizeof test_en, "%s/corpora/english/tinyshakespeare.txt", d);
    snprintf(spm, sizeof spm, "%s/vocab/ggml-vocab-llama-spm.gguf", d);
    if (access(train_a, R_OK) || access(train_b, R_OK) || access(test_tr, R_OK) || access(test_en, R_OK) || access(spm, R_OK))
        SKIP("needs %s/corpora/{turkish,english} and %s/vocab/ggml-vocab-llama-spm.gguf", d, d);
    const char *out = tmp_path("turkish-4096.gguf");
    const char *corpus[2] = {train_a, train_b};
    kiln_bpe_train_params p = params(4096);
    p.n_threads = 0;
    double t0 = now_s();
    CHECK(kiln_bpe_train(corpus, 2, &p, out) == KILN_OK, "%s", kiln_last_error());
    double secs = now_s() - t0;
    struct stat sa, sb;
    double mb = stat(train_a, &sa) || stat(train_b, &sb) ? 0 : (double)(sa.st_size + sb.st_size) / 1e6;
    printf("# trained a 4096-token vocab on %.2f MB of Turkish in %.2f s (%d threads)\n", mb, secs, (int)sysconf(_SC_NPROCESSORS_ONLN));

    kiln_tokenizer *ours = NULL, *llama = NULL;
    CHECK(kiln_tokenizer_load_file(out, &ours) == KILN_OK, "%s", kiln_last_error());
    if (kiln_tokenizer_load_file(spm, &llama)) {
        kiln_tokenizer_free(ours);
        CHECK(0, "%s", kiln_last_error());
    }
    size_t b_tr = 0, b_en = 0;
    long ours_tr = count_tokens(ours, test_tr, &b_tr), llama_tr = count_tokens(llama, test_tr, &b_tr);
    long ours_en = count_tokens(ours, test_en, &b_en), llama_en = count_tokens(llama, test_en, &b_en);
    kiln_tokenizer_free(ours);
    kiln_tokenizer_free(llama);
    CHECK(ours_tr > 0 && llama_tr > 0 && ours_en > 0 && llama_en > 0, "encoding failed: %s", kiln_last_error());
    printf("# Turkish test (%zu bytes): kiln-bpe 4096 %ld tokens (%.3f bytes/token), llama-spm 32000 %ld tokens (%.3f bytes/token)\n", b_tr,
           ours_tr, (double)b_tr / ours_tr, llama_tr, (double)b_tr / llama_tr);
    printf("# English tinyshakespeare (%zu bytes): kiln-bpe 4096 %ld tokens (%.3f bytes/token), llama-spm 32000 %ld tokens (%.3f bytes/token)\n",
           b_en, ours_en, (double)b_en / ours_en, llama_en, (double)b_en / llama_en);
    CHECK(ours_tr < llama_tr, "the Turkish vocab takes %ld tokens for the held-out text, Llama-2's %ld", ours_tr, llama_tr);
}

int main(void) {
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/kiln-bpe-train-%d", (int)getpid());
    if (mkdir(tmp_dir, 0700)) {
        perror(tmp_dir);
        return 1;
    }
    RUN(test_bpe_train_hand_merges);
    RUN(test_bpe_train_tie_break);
    RUN(test_bpe_train_specials);
    RUN(test_bpe_train_errors);
    RUN(test_bpe_train_not_regular);
    RUN(test_bpe_train_cli_many_specials);
    RUN(test_bpe_train_deterministic);
    RUN(test_bpe_train_turkish_round_trip);
    RUN(test_bpe_train_turkish_beats_llama2);
    remove_tmp_dir();
    TEST_EXIT();
}
