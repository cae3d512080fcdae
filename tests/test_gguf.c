/* test_gguf.c: the GGUF reader and writer.
 * Round trip: every metadata type (nested arrays too) and tensor bytes written, read back and compared.
 * Rejections: one test per malformed class with its exact one-line message, every prefix of a valid file,
 * and the regression inputs the fuzzer found (tests/fuzz/regress). Atomic writes: an unfinished write
 * leaves the old file and no temp file behind. */
#include "kiln.h"
#include "test.h"

#include <dirent.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---------------------------------------------------------------- a byte builder for hand-made files */

typedef struct {
    uint8_t b[8192];
    size_t n;
} img;

static void put(img *m, const void *p, size_t n) { memcpy(m->b + m->n, p, n), m->n += n; }
static void u32(img *m, uint32_t v) { put(m, &v, 4); }
static void u64(img *m, uint64_t v) { put(m, &v, 8); }
static void str(img *m, const char *s) { u64(m, strlen(s)), put(m, s, strlen(s)); }
static void header(img *m, uint64_t n_tensors, uint64_t n_kv) {
    m->n = 0;
    put(m, "GGUF", 4), u32(m, 3), u64(m, n_tensors), u64(m, n_kv);
}
static void kv_u32(img *m, const char *k, uint32_t v) { str(m, k), u32(m, 4), u32(m, v); }
static void tinfo(img *m, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type, uint64_t off) {
    str(m, name), u32(m, n_dims);
    for (uint32_t d = 0; d < n_dims; d++) u64(m, ne[d]);
    u32(m, type), u64(m, off);
}
static void pad_data(img *m, size_t data_bytes) { /* align to 32 then data_bytes of data */
    while (m->n % 32) m->b[m->n++] = 0;
    memset(m->b + m->n, 0x3c, data_bytes);
    m->n += data_bytes;
}

/* Opens the image and checks it fails with exactly `want` (a printf format given the file name "t.gguf"). */
static int expect_error(const img *m, kiln_status want_status, const char *want) {
    kiln_gguf *g = NULL;
    kiln_status s = kiln_gguf_open_memory(m->b, m->n, "t.gguf", &g);
    if (s == KILN_OK) {
        kiln_gguf_close(g);
        snprintf(test_msg_, sizeof test_msg_, "accepted a malformed file, wanted: %s", want);
        return 0;
    }
    if (s != want_status || strcmp(kiln_last_error(), want) != 0) {
        snprintf(test_msg_, sizeof test_msg_, "status %d message\n  got:  %s\n  want: %s", (int)s, kiln_last_error(), want);
        return 0;
    }
    return 1;
}
#define EXPECT_ERROR(m, msg)                      \
    do {                                          \
        if (!expect_error(m, KILN_ERR_FORMAT, msg)) { \
            test_failed_ = 1;                     \
            return;                               \
        }                                         \
    } while (0)

/* A valid file: two keys, an F32 [4] tensor and a Q4_0 [32, 2] tensor. */
static void valid(img *m) {
    uint64_t ne_a[1] = {4}, ne_b[2] = {32, 2};
    header(m, 2, 2);
    kv_u32(m, "a.count", 7);
    str(m, "b.name"), u32(m, 8), str(m, "kiln");
    tinfo(m, "a", 1, ne_a, 0, 0);
    tinfo(m, "b", 2, ne_b, 2, 32);
    pad_data(m, 32 + 2 * 18);
}

static void test_valid_hand_made(void) {
    img m;
    valid(&m);
    kiln_gguf *g;
    CHECK(kiln_gguf_open_memory(m.b, m.n, "t.gguf", &g) == KILN_OK, "%s", kiln_last_error());
    uint32_t c;
    kiln_str s;
    CHECK(kiln_gguf_get_u32(g, "a.count", &c) == KILN_OK && c == 7);
    CHECK(kiln_gguf_get_str(g, "b.name", &s) == KILN_OK && s.len == 4 && memcmp(s.ptr, "kiln", 4) == 0);
    const kiln_tensor_view *b = kiln_gguf_find_tensor(g, "b");
    CHECK(b && b->type == KILN_TYPE_Q4_0 && b->ne[0] == 32 && b->ne[1] == 2 && b->nbytes == 36 && b->nb[1] == 18);
    CHECK((const uint8_t *)b->data == m.b + kiln_gguf_data_offset(g) + 32, "zero-copy view into the image");
    CHECK(kiln_gguf_get_u32(g, "missing", &c) == KILN_ERR_NOT_FOUND);
    CHECK(strcmp(kiln_last_error(), "t.gguf: missing metadata key 'missing'") == 0, "%s", kiln_last_error());
    CHECK(kiln_gguf_get_u32(g, "b.name", &c) == KILN_ERR_FORMAT);
    CHECK(strcmp(kiln_last_error(), "t.gguf: key 'b.name' has type str, expected an integer") == 0, "%s", kiln_last_error());
    kiln_gguf_close(g);
}

static void test_bad_magic(void) {
    img m;
    valid(&m);
    memcpy(m.b, "GGML", 4);
    EXPECT_ERROR(&m, "t.gguf: bad magic at byte 0: expected 'GGUF', found 47 47 4d 4c");
}

static void test_bad_version(void) {
    img m;
    valid(&m);
    m.b[4] = 4;
    EXPECT_ERROR(&m, "t.gguf: unsupported GGUF version 4 at byte 4 (kiln reads 2 and 3)");
}

static void test_truncated(void) {
    img m;
    valid(&m);
    m.n = 70; /* inside the length of the second value */
    EXPECT_ERROR(&m, "t.gguf: truncated at byte 65: string value needs 8 bytes, 5 remain");
    m.n = 75; /* inside the second value's bytes */
    EXPECT_ERROR(&m, "t.gguf: string value at byte 65: string length 4 runs past the end of the file (2 bytes remain)");
    m.n = 20; /* inside the metadata count */
    EXPECT_ERROR(&m, "t.gguf: truncated at byte 16: metadata count needs 8 bytes, 4 remain");
    /* every prefix of a valid file is rejected, never a crash or an out-of-bounds read (ASan run in CI) */
    img full;
    valid(&full);
    for (size_t n = 0; n < full.n; n++) {
        kiln_gguf *g = NULL;
        CHECK(kiln_gguf_open_memory(full.b, n, "t.gguf", &g) == KILN_ERR_FORMAT, "prefix of %zu bytes accepted", n);
    }
}

static void test_truncated_on_disk(void) {
    img m;
    valid(&m);
    char path[] = "/tmp/kiln-test-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    CHECK(write(fd, m.b, m.n - 10) == (ssize_t)(m.n - 10));
    close(fd);
    kiln_gguf *g = NULL;
    kiln_status s = kiln_gguf_open(path, &g);
    char want[256];
    snprintf(want, sizeof want, "%s: tensor 'b' at byte 110: data [32, +36) lies outside the file's data section of 58 bytes", path);
    unlink(path);
    CHECK(s == KILN_ERR_FORMAT && strcmp(kiln_last_error(), want) == 0, "\n  got:  %s\n  want: %s", kiln_last_error(), want);
    CHECK(kiln_gguf_open("/nonexistent/x.gguf", &g) == KILN_ERR_IO);
    CHECK(strcmp(kiln_last_error(), "/nonexistent/x.gguf: cannot open: No such file or directory") == 0, "%s", kiln_last_error());
}

static void test_count_overflow(void) {
    img m;
    valid(&m);
    uint64_t huge = 1ULL << 63;
    memcpy(m.b + 16, &huge, 8);
    EXPECT_ERROR(&m, "t.gguf: count at byte 8 overflows (2 tensors, 9223372036854775808 keys)");
    valid(&m);
    huge = 1ULL << 40;
    memcpy(m.b + 8, &huge, 8);
    EXPECT_ERROR(&m, "t.gguf: tensor count 1099511627776 at byte 8 exceeds what the file can hold (228 bytes)");
    valid(&m);
    memcpy(m.b + 16, &huge, 8);
    EXPECT_ERROR(&m, "t.gguf: metadata count 1099511627776 at byte 16 exceeds what the file can hold (228 bytes)");
}

static void test_string_past_end(void) {
    img m;
    header(&m, 0, 1);
    u64(&m, UINT64_MAX - 3); /* key length that would wrap a naive pos + len check */
    put(&m, "abcdefghijklmnop", 16);
    EXPECT_ERROR(&m, "t.gguf: metadata key at byte 24: string length 18446744073709551612 runs past the end of the file (16 bytes remain)");
    header(&m, 0, 1);
    str(&m, "k"), u32(&m, 8), u64(&m, 100), put(&m, "short", 5);
    EXPECT_ERROR(&m, "t.gguf: string value at byte 37: string length 100 runs past the end of the file (5 bytes remain)");
}

static void test_array_past_end(void) {
    img m;
    header(&m, 0, 1);
    str(&m, "arr"), u32(&m, 9), u32(&m, 4), u64(&m, 1ULL << 61), u32(&m, 1);
    EXPECT_ERROR(&m, "t.gguf: key 'arr' at byte 39: array of 2305843009213693952 u32 elements runs past the end of the file (4 bytes remain)");
    header(&m, 0, 1);
    str(&m, "arr"), u32(&m, 9), u32(&m, 8), u64(&m, 3), str(&m, "one");
    EXPECT_ERROR(&m, "t.gguf: key 'arr' at byte 39: array of 3 str elements runs past the end of the file (11 bytes remain)");
    header(&m, 0, 1);
    str(&m, "arr"), u32(&m, 9), u32(&m, 77), u64(&m, 1);
    EXPECT_ERROR(&m, "t.gguf: key 'arr' at byte 39: unknown array element type 77");
}

static void test_bad_values(void) {
    img m;
    header(&m, 0, 1);
    str(&m, "k"), u32(&m, 13), u32(&m, 0);
    EXPECT_ERROR(&m, "t.gguf: key 'k' at byte 33: unknown value type 13");
    header(&m, 0, 1);
    str(&m, "k"), u32(&m, 7), put(&m, "\x02", 1);
    EXPECT_ERROR(&m, "t.gguf: key 'k' at byte 37: bool value is 2, not 0 or 1");
    header(&m, 0, 1);
    kv_u32(&m, "general.alignment", 48);
    EXPECT_ERROR(&m, "t.gguf: key 'general.alignment' at byte 24: 48 is not a power of two");
    header(&m, 0, 1);
    str(&m, ""), u32(&m, 4), u32(&m, 0);
    EXPECT_ERROR(&m, "t.gguf: metadata key at byte 24 is empty");
    /* arrays nested 9 deep */
    header(&m, 0, 1);
    str(&m, "deep");
    u32(&m, 9);
    for (int i = 0; i < 9; i++) u32(&m, 9), u64(&m, 1);
    u32(&m, 4), u64(&m, 0);
    EXPECT_ERROR(&m, "t.gguf: key 'deep' at byte 136: arrays nested deeper than 8");
}

static void test_bad_dims(void) {
    img m;
    uint64_t ne5[5] = {1, 1, 1, 1, 1}, ne0[2] = {4, 0}, big[3] = {1ULL << 32, 1ULL << 32, 1ULL << 32};
    header(&m, 1, 0), tinfo(&m, "t5", 5, ne5, 0, 0), pad_data(&m, 32);
    EXPECT_ERROR(&m, "t.gguf: tensor 't5' at byte 24: n_dims 5 > 4");
    header(&m, 1, 0), tinfo(&m, "z", 2, ne0, 0, 0), pad_data(&m, 32);
    EXPECT_ERROR(&m, "t.gguf: tensor 'z' at byte 24: dimension 1 is zero");
    header(&m, 1, 0), tinfo(&m, "big", 3, big, 0, 0), pad_data(&m, 32);
    EXPECT_ERROR(&m, "t.gguf: tensor 'big' at byte 24: element count overflows at dimension 1 (4294967296)");
}

static void test_bad_type(void) {
    img m;
    uint64_t ne[1] = {32}, ne33[1] = {33};
    header(&m, 1, 0), tinfo(&m, "t", 1, ne, 99, 0), pad_data(&m, 32);
    EXPECT_ERROR(&m, "t.gguf: tensor 't' at byte 45: unknown tensor type 99");
    header(&m, 1, 0), tinfo(&m, "t", 1, ne, 4, 0), pad_data(&m, 32); /* 4 was Q4_2, removed from GGML */
    EXPECT_ERROR(&m, "t.gguf: tensor 't' at byte 45: unknown tensor type 4");
    header(&m, 1, 0), tinfo(&m, "t", 1, ne33, 2, 0), pad_data(&m, 32);
    EXPECT_ERROR(&m, "t.gguf: tensor 't' at byte 24: row length 33 is not a multiple of the q4_0 block size 32");
}

static void test_bad_data_placement(void) {
    img m;
    uint64_t ne[1] = {8};
    header(&m, 1, 0), tinfo(&m, "t", 1, ne, 0, 16), pad_data(&m, 64);
    EXPECT_ERROR(&m, "t.gguf: tensor 't' at byte 24: data offset 16 is not a multiple of the alignment 32");
    header(&m, 1, 0), tinfo(&m, "t", 1, ne, 0, 64), pad_data(&m, 64);
    EXPECT_ERROR(&m, "t.gguf: tensor 't' at byte 24: data [64, +32) lies outside the file's data section of 64 bytes");
    header(&m, 1, 0), tinfo(&m, "t", 1, ne, 0, UINT64_MAX - 31), pad_data(&m, 64);
    EXPECT_ERROR(&m, "t.gguf: tensor 't' at byte 24: data [18446744073709551584, +32) lies outside the file's data section of 64 bytes");
    uint64_t ne16[1] = {16};
    header(&m, 2, 0), tinfo(&m, "x", 1, ne16, 0, 0), tinfo(&m, "y", 1, ne16, 0, 64), pad_data(&m, 128);
    kiln_gguf *g; /* x [0, 64) and y [64, 128) touch but do not overlap */
    CHECK(kiln_gguf_open_memory(m.b, m.n, "t.gguf", &g) == KILN_OK, "%s", kiln_last_error());
    kiln_gguf_close(g);
    header(&m, 2, 0), tinfo(&m, "x", 1, ne16, 0, 32), tinfo(&m, "y", 1, ne16, 0, 64), pad_data(&m, 128);
    EXPECT_ERROR(&m, "t.gguf: tensor 'y' at byte 57: data [64, +64) overlaps tensor 'x' at data offset 32");
}

static void test_duplicates(void) {
    img m;
    header(&m, 0, 2), kv_u32(&m, "k", 1), kv_u32(&m, "k", 2);
    EXPECT_ERROR(&m, "t.gguf: key 'k' at byte 41: duplicate key (first at byte 24)");
    uint64_t ne[1] = {8};
    header(&m, 2, 0), tinfo(&m, "w", 1, ne, 0, 0), tinfo(&m, "w", 1, ne, 0, 32), pad_data(&m, 64);
    EXPECT_ERROR(&m, "t.gguf: tensor 'w' at byte 57: duplicate tensor name (first at byte 24)");
}

/* ---------------------------------------------------------------- the header must describe the data section */

/* A file of three f32 tensors (a 8, b 16, c 8 elements) written by kiln's writer, read back into m. */
static int written_three(img *m, size_t alignment) {
    char path[] = "/tmp/kiln-three-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return 0;
    close(fd);
    static float data[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
    int64_t n8[1] = {8}, n16[1] = {16};
    kiln_gguf_writer *w;
    int ok = kiln_gguf_writer_new(&w) == KILN_OK && (!alignment || kiln_gguf_writer_set_alignment(w, alignment) == KILN_OK) &&
             kiln_gguf_writer_set_u32(w, "k", 1) == KILN_OK &&
             kiln_gguf_writer_add_tensor(w, "a", KILN_TYPE_F32, 1, n8, data) == KILN_OK &&
             kiln_gguf_writer_add_tensor(w, "b", KILN_TYPE_F32, 1, n16, data) == KILN_OK &&
             kiln_gguf_writer_add_tensor(w, "c", KILN_TYPE_F32, 1, n8, data) == KILN_OK &&
             kiln_gguf_writer_write_file(w, path) == KILN_OK;
    kiln_gguf_writer_free(w);
    FILE *f = ok ? fopen(path, "rb") : NULL;
    if (f) m->n = fread(m->b, 1, sizeof m->b, f), fclose(f);
    unlink(path);
    return f != NULL;
}

/* One tensor fewer in the count than in the table: the data section would start inside the last tensor info and
 * every tensor's bytes would shift (quantize wrote garbage, exit 0). The last tensor's bytes are left over. */
static void test_wrong_tensor_count(void) {
    img m;
    CHECK(written_three(&m, 0), "%s", kiln_last_error());
    kiln_gguf *g;
    CHECK(kiln_gguf_open_memory(m.b, m.n, "t.gguf", &g) == KILN_OK, "%s", kiln_last_error());
    kiln_gguf_close(g);
    /* header 24 + key 'k' 17 + infos a, b, c of 33 each = 140, data at 160: a [0, 32), b [32, 96), c [96, 128) */
    CHECK(m.n == 160 + 128, "the writer's file has %zu bytes", m.n);
    uint64_t two = 2;
    memcpy(m.b + 8, &two, 8);
    /* the table now ends at 107, the data section starts at 128: a [0,32) and b [32,96) leave 64 bytes over */
    EXPECT_ERROR(&m, "t.gguf: 64 bytes at file byte 224 follow the last tensor's data and belong to no tensor (is the tensor count 2 wrong?)");
    uint64_t four = 4; /* one more than the table: the data is read as a fourth tensor info, which cannot parse */
    CHECK(written_three(&m, 0));
    memcpy(m.b + 8, &four, 8);
    kiln_status st = kiln_gguf_open_memory(m.b, m.n, "t.gguf", &g);
    CHECK(st == KILN_ERR_FORMAT, "a tensor count of 4 for 3 tensors gave status %d: %s", (int)st, kiln_last_error());
}

static void test_data_not_covered(void) {
    img m;
    uint64_t ne8[1] = {8};
    /* a gap of one alignment unit before the only tensor */
    header(&m, 1, 0), tinfo(&m, "t", 1, ne8, 0, 32), pad_data(&m, 64);
    EXPECT_ERROR(&m, "t.gguf: tensor 't' at byte 24: data offset 32 leaves bytes [0, 32) of the data section (file byte 64) in no tensor");
    /* a gap between two tensors */
    header(&m, 2, 0), tinfo(&m, "x", 1, ne8, 0, 0), tinfo(&m, "y", 1, ne8, 0, 64), pad_data(&m, 96);
    EXPECT_ERROR(&m, "t.gguf: tensor 'y' at byte 57: data offset 64 leaves bytes [32, 64) of the data section (file byte 128) in no tensor");
    /* bytes after the last tensor beyond its padding; within the padding (or without it) is fine */
    uint64_t ne4[1] = {4};
    header(&m, 1, 0), tinfo(&m, "t", 1, ne4, 0, 0), pad_data(&m, 33);
    EXPECT_ERROR(&m, "t.gguf: 17 bytes at file byte 80 follow the last tensor's data and belong to no tensor (is the tensor count 1 wrong?)");
    kiln_gguf *g;
    for (size_t n = 16; n <= 32; n += 16) {
        header(&m, 1, 0), tinfo(&m, "t", 1, ne4, 0, 0), pad_data(&m, n);
        CHECK(kiln_gguf_open_memory(m.b, m.n, "t.gguf", &g) == KILN_OK, "%zu data bytes: %s", n, kiln_last_error());
        kiln_gguf_close(g);
    }
    /* a file without tensors ends after its header (and padding) */
    header(&m, 0, 1), kv_u32(&m, "k", 1), pad_data(&m, 4);
    EXPECT_ERROR(&m, "t.gguf: 4 bytes at file byte 64 follow the last tensor's data and belong to no tensor (is the tensor count 0 wrong?)");
}

/* general.alignment = 1 is legal GGUF but left an f32 tensor at an odd address (UBSan: misaligned load in rmsnorm). */
static void test_alignment_below_type(void) {
    img m;
    CHECK(written_three(&m, 1));
    EXPECT_ERROR(&m, "t.gguf: tensor 'a' at byte 74: general.alignment 1 is below the 4 bytes f32 data must be aligned to");
    CHECK(written_three(&m, 2));
    EXPECT_ERROR(&m, "t.gguf: tensor 'a' at byte 74: general.alignment 2 is below the 4 bytes f32 data must be aligned to");
    CHECK(written_three(&m, 4));
    kiln_gguf *g;
    CHECK(kiln_gguf_open_memory(m.b, m.n, "t.gguf", &g) == KILN_OK, "%s", kiln_last_error());
    for (int64_t i = 0; i < kiln_gguf_n_tensors(g); i++)
        CHECK((uintptr_t)kiln_gguf_tensor_at(g, i)->data % 4 == 0, "tensor %lld misaligned", (long long)i);
    CHECK(((const float *)kiln_gguf_find_tensor(g, "c")->data)[7] == 8.0f);
    kiln_gguf_close(g);
}

static kiln_status count_ids(void *ud, const int32_t *ids, size_t n) { return KILN_OK; }

/* A FIFO with no writer blocked the open; a directory said "read failed at byte 0". */
static void test_open_not_regular(void) {
    char dir[] = "/tmp/kiln-fifo-XXXXXX", fifo[64];
    CHECK(mkdtemp(dir));
    snprintf(fifo, sizeof fifo, "%s/f", dir);
    CHECK(mkfifo(fifo, 0600) == 0);
    char want[128];
    kiln_gguf *g = NULL;
    kiln_tokenizer *t = NULL;
    snprintf(want, sizeof want, "%s: is not a regular file", fifo);
    CHECK(kiln_gguf_open(fifo, &g) == KILN_ERR_IO && !g && strcmp(kiln_last_error(), want) == 0, "%s", kiln_last_error());
    CHECK(kiln_tokenizer_load_file(fifo, &t) == KILN_ERR_IO && strcmp(kiln_last_error(), want) == 0, "%s", kiln_last_error());
    snprintf(want, sizeof want, "%s: is a directory", dir);
    CHECK(kiln_gguf_open(dir, &g) == KILN_ERR_IO && strcmp(kiln_last_error(), want) == 0, "%s", kiln_last_error());
    CHECK(kiln_tokenizer_load_file(dir, &t) == KILN_ERR_IO && strcmp(kiln_last_error(), want) == 0, "%s", kiln_last_error());
    /* token text streams open the same way (the bundled model's tokenizer reads them) */
    CHECK(kiln_tokenizer_load_file("models/shakespeare.gguf", &t) == KILN_OK, "%s", kiln_last_error());
    kiln_status es = kiln_tokenizer_encode_file(t, dir, false, false, count_ids, NULL);
    CHECK(es == KILN_ERR_IO && strcmp(kiln_last_error(), want) == 0, "%s", kiln_last_error());
    es = kiln_tokenizer_encode_file(t, fifo, false, false, count_ids, NULL);
    kiln_tokenizer_free(t);
    snprintf(want, sizeof want, "%s: is not a regular file", fifo);
    CHECK(es == KILN_ERR_IO && strcmp(kiln_last_error(), want) == 0, "%s", kiln_last_error());
    snprintf(want, sizeof want, "%s: is a directory", dir);
    /* the llama2.c converter opens its checkpoint the same way, once its (SentencePiece) tokenizer has loaded */
    char tok[80];
    snprintf(tok, sizeof tok, "%s/tok.gguf", dir);
    const char *pieces[4] = {"<unk>", "<s>", "</s>", "a"};
    const float scores[4] = {0, 0, 0, -1};
    const int32_t types[4] = {2, 3, 3, 1};
    kiln_gguf_writer *w;
    CHECK(kiln_gguf_writer_new(&w) == KILN_OK && kiln_gguf_writer_set_str(w, "tokenizer.ggml.model", "llama") == KILN_OK &&
          kiln_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", pieces, 4) == KILN_OK &&
          kiln_gguf_writer_set_arr(w, "tokenizer.ggml.scores", KILN_GGUF_FLOAT32, scores, 4) == KILN_OK &&
          kiln_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", KILN_GGUF_INT32, types, 4) == KILN_OK &&
          kiln_gguf_writer_write_file(w, tok) == KILN_OK, "%s", kiln_last_error());
    kiln_gguf_writer_free(w);
    CHECK(kiln_convert_llama2c(dir, tok, "/tmp/kiln-unused.gguf") == KILN_ERR_IO && strcmp(kiln_last_error(), want) == 0,
          "%s", kiln_last_error());
    snprintf(want, sizeof want, "%s: is not a regular file", fifo);
    CHECK(kiln_convert_llama2c(fifo, tok, "/tmp/kiln-unused.gguf") == KILN_ERR_IO && strcmp(kiln_last_error(), want) == 0,
          "%s", kiln_last_error());
    unlink(tok);
    unlink(fifo);
    rmdir(dir);
}

/* A name from the file reaches an error message with its control bytes escaped (ESC [2J would clear a terminal). */
static void test_escaped_names(void) {
    img m;
    uint64_t ne[1] = {8};
    header(&m, 2, 0), tinfo(&m, "\x1b[2Jw", 1, ne, 0, 0), tinfo(&m, "\x1b[2Jw", 1, ne, 0, 32), pad_data(&m, 64);
    EXPECT_ERROR(&m, "t.gguf: tensor '\\x1b[2Jw' at byte 61: duplicate tensor name (first at byte 24)");
    header(&m, 0, 1);
    str(&m, "\x1b[2Jk"), u32(&m, 7), put(&m, "\x02", 1);
    EXPECT_ERROR(&m, "t.gguf: key '\\x1b[2Jk' at byte 41: bool value is 2, not 0 or 1");
    for (const char *p = kiln_last_error(); *p; p++) CHECK((unsigned char)*p >= 0x20 && *p != 0x7f, "raw control byte in the message");
}

/* ---------------------------------------------------------------- writer round trip */

static void test_round_trip(void) {
    char path[] = "/tmp/kiln-rt-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    close(fd);
    kiln_gguf_writer *w;
    CHECK(kiln_gguf_writer_new(&w) == KILN_OK);
    CHECK(kiln_gguf_writer_set_alignment(w, 64) == KILN_OK);
    uint8_t u8s[3] = {0, 7, 255};
    int16_t i16s[2] = {-32768, 12345};
    double f64s[2] = {3.141592653589793, -0.0};
    const char *strs[3] = {"", "t\xc3\xbcrk\xc3\xa7" "e", "a\0b" /* stops at the NUL: strings are C strings here */};
    kiln_gguf_value scalars[] = {
        {.type = KILN_GGUF_UINT8, .u64 = 200},   {.type = KILN_GGUF_INT8, .i64 = -100},
        {.type = KILN_GGUF_UINT16, .u64 = 65535}, {.type = KILN_GGUF_INT16, .i64 = -30000},
        {.type = KILN_GGUF_UINT32, .u64 = 4000000000u}, {.type = KILN_GGUF_INT32, .i64 = -2000000000},
        {.type = KILN_GGUF_FLOAT32, .f64 = 0.1f}, {.type = KILN_GGUF_BOOL, .u64 = 1},
        {.type = KILN_GGUF_UINT64, .u64 = UINT64_MAX}, {.type = KILN_GGUF_INT64, .i64 = INT64_MIN},
        {.type = KILN_GGUF_FLOAT64, .f64 = 1e300},
    };
    char key[32];
    for (size_t i = 0; i < sizeof scalars / sizeof scalars[0]; i++) {
        snprintf(key, sizeof key, "s.%zu", i);
        CHECK(kiln_gguf_writer_set(w, key, &scalars[i]) == KILN_OK);
    }
    CHECK(kiln_gguf_writer_set_str(w, "s.str", "merhaba d\xc3\xbcnya") == KILN_OK);
    CHECK(kiln_gguf_writer_set_arr(w, "a.u8", KILN_GGUF_UINT8, u8s, 3) == KILN_OK);
    CHECK(kiln_gguf_writer_set_arr(w, "a.i16", KILN_GGUF_INT16, i16s, 2) == KILN_OK);
    CHECK(kiln_gguf_writer_set_arr(w, "a.f64", KILN_GGUF_FLOAT64, f64s, 2) == KILN_OK);
    CHECK(kiln_gguf_writer_set_arr(w, "a.empty", KILN_GGUF_UINT32, NULL, 0) == KILN_OK);
    CHECK(kiln_gguf_writer_set_arr_str(w, "a.str", strs, 3) == KILN_OK);
    /* [[1, 2], ["x"]] */
    uint32_t inner_u32[2] = {1, 2};
    kiln_gguf_value x = {.type = KILN_GGUF_STRING, .str = {"x", 1}};
    kiln_gguf_value inner[2] = {{.type = KILN_GGUF_ARRAY, .arr = {.type = KILN_GGUF_UINT32, .n = 2, .data = (const uint8_t *)inner_u32}},
                                {.type = KILN_GGUF_ARRAY, .arr = {.type = KILN_GGUF_STRING, .n = 1, .items = &x}}};
    kiln_gguf_value nested = {.type = KILN_GGUF_ARRAY, .arr = {.type = KILN_GGUF_ARRAY, .n = 2, .items = inner}};
    CHECK(kiln_gguf_writer_set(w, "a.nested", &nested) == KILN_OK);
    CHECK(kiln_gguf_writer_set_u32(w, "s.replaced", 1) == KILN_OK && kiln_gguf_writer_set_u32(w, "s.replaced", 2) == KILN_OK);

    /* tensors of several types with random bytes */
    unsigned long long seed = 42;
    static uint8_t data[3][4096];
    for (int t = 0; t < 3; t++)
        for (int i = 0; i < 4096; i++) data[t][i] = (uint8_t)test_rng_next(&seed);
    int64_t ne_f32[2] = {5, 3}, ne_q4k[2] = {256, 2}, ne_q8[4] = {32, 2, 3, 2};
    CHECK(kiln_gguf_writer_add_tensor(w, "f32", KILN_TYPE_F32, 2, ne_f32, data[0]) == KILN_OK);
    CHECK(kiln_gguf_writer_add_tensor(w, "blk.0.q4k", KILN_TYPE_Q4_K, 2, ne_q4k, data[1]) == KILN_OK);
    CHECK(kiln_gguf_writer_add_tensor(w, "q8", KILN_TYPE_Q8_0, 4, ne_q8, data[2]) == KILN_OK);
    int64_t bad[1] = {100};
    CHECK(kiln_gguf_writer_add_tensor(w, "bad", KILN_TYPE_Q4_0, 1, bad, data[0]) == KILN_ERR_INVALID);
    CHECK(kiln_gguf_writer_write_file(w, path) == KILN_OK, "%s", kiln_last_error());
    kiln_gguf_writer_free(w);

    kiln_gguf *g;
    CHECK(kiln_gguf_open(path, &g) == KILN_OK, "%s", kiln_last_error());
    CHECK(kiln_gguf_alignment(g) == 64 && kiln_gguf_data_offset(g) % 64 == 0);
    for (size_t i = 0; i < sizeof scalars / sizeof scalars[0]; i++) {
        snprintf(key, sizeof key, "s.%zu", i);
        const kiln_gguf_value *v = kiln_gguf_find(g, key);
        CHECK(v && v->type == scalars[i].type, "%s", key);
        CHECK(memcmp(&v->u64, &scalars[i].u64, 8) == 0, "%s value differs", key);
    }
    kiln_str s;
    CHECK(kiln_gguf_get_str(g, "s.str", &s) == KILN_OK && s.len == 14 && memcmp(s.ptr, "merhaba d\xc3\xbcnya", 14) == 0);
    const kiln_gguf_value *a;
    CHECK(kiln_gguf_get_arr(g, "a.u8", KILN_GGUF_UINT8, &a) == KILN_OK && a->arr.n == 3);
    CHECK(kiln_gguf_arr_u64(a, 2) == 255 && kiln_gguf_arr_u64(a, 1) == 7);
    CHECK(kiln_gguf_get_arr(g, "a.i16", KILN_GGUF_INT16, &a) == KILN_OK && kiln_gguf_arr_i64(a, 0) == -32768);
    CHECK(kiln_gguf_get_arr(g, "a.f64", KILN_GGUF_FLOAT64, &a) == KILN_OK && kiln_gguf_arr_f64(a, 0) == f64s[0]);
    CHECK(signbit(kiln_gguf_arr_f64(a, 1)));
    CHECK(kiln_gguf_get_arr(g, "a.empty", KILN_GGUF_UINT32, &a) == KILN_OK && a->arr.n == 0);
    CHECK(kiln_gguf_get_arr(g, "a.str", KILN_GGUF_STRING, &a) == KILN_OK && a->arr.n == 3);
    CHECK(a->arr.items[0].str.len == 0 && a->arr.items[1].str.len == 8 && memcmp(a->arr.items[1].str.ptr, strs[1], 8) == 0);
    CHECK(a->arr.items[2].str.len == 1);
    CHECK(kiln_gguf_get_arr(g, "a.nested", KILN_GGUF_ARRAY, &a) == KILN_OK && a->arr.n == 2);
    CHECK(a->arr.items[0].arr.type == KILN_GGUF_UINT32 && kiln_gguf_arr_u64(&a->arr.items[0], 1) == 2);
    CHECK(a->arr.items[1].arr.items[0].str.len == 1 && a->arr.items[1].arr.items[0].str.ptr[0] == 'x');
    uint32_t r;
    CHECK(kiln_gguf_get_u32(g, "s.replaced", &r) == KILN_OK && r == 2);
    CHECK(kiln_gguf_n_tensors(g) == 3);
    const kiln_tensor_view *t = kiln_gguf_find_tensor(g, "f32");
    CHECK(t && t->nbytes == 60 && memcmp(t->data, data[0], 60) == 0);
    t = kiln_gguf_find_tensor(g, "blk.0.q4k");
    CHECK(t && t->type == KILN_TYPE_Q4_K && t->nbytes == 288 && memcmp(t->data, data[1], 288) == 0);
    t = kiln_gguf_find_tensor(g, "q8");
    CHECK(t && t->n_dims == 4 && t->ne[3] == 2 && t->nbytes == 34 * 12 && memcmp(t->data, data[2], 34 * 12) == 0);
    CHECK(t->nb[1] == 34 && t->nb[2] == 68 && t->nb[3] == 204);

    /* copying every key and tensor gives a byte-identical file */
    char path2[] = "/tmp/kiln-rt2-XXXXXX";
    fd = mkstemp(path2);
    close(fd);
    CHECK(kiln_gguf_writer_new(&w) == KILN_OK && kiln_gguf_writer_copy_kv(w, g, NULL) == KILN_OK);
    for (int64_t i = 0; i < kiln_gguf_n_tensors(g); i++) {
        const kiln_tensor_view *v = kiln_gguf_tensor_at(g, i);
        CHECK(kiln_gguf_writer_add_tensor(w, v->name, v->type, v->n_dims, v->ne, v->data) == KILN_OK);
    }
    CHECK(kiln_gguf_writer_write_file(w, path2) == KILN_OK, "%s", kiln_last_error());
    kiln_gguf_writer_free(w);
    kiln_gguf *g2;
    CHECK(kiln_gguf_open(path2, &g2) == KILN_OK);
    CHECK(kiln_gguf_file_size(g) == kiln_gguf_file_size(g2));
    /* same bytes: compare the whole images through the first tensor's view back to the start */
    const uint8_t *b1 = (const uint8_t *)kiln_gguf_tensor_at(g, 0)->data - kiln_gguf_data_offset(g);
    const uint8_t *b2 = (const uint8_t *)kiln_gguf_tensor_at(g2, 0)->data - kiln_gguf_data_offset(g2);
    CHECK(memcmp(b1, b2, (size_t)kiln_gguf_file_size(g)) == 0, "copied file differs");
    kiln_gguf_close(g2);
    kiln_gguf_close(g);
    unlink(path);
    unlink(path2);
}

static void test_reads_vocab_files(void) {
    char dir[256];
    snprintf(dir, sizeof dir, "%s/vocab", test_data_dir());
    DIR *d = opendir(dir);
    if (!d) SKIP("%s not found (needs ../shared/data)", dir);
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l < 5 || strcmp(e->d_name + l - 5, ".gguf") != 0) continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        kiln_gguf *g;
        kiln_status s = kiln_gguf_open(path, &g);
        if (s) closedir(d);
        CHECK(s == KILN_OK, "%s", kiln_last_error());
        const kiln_gguf_value *toks;
        s = kiln_gguf_get_arr(g, "tokenizer.ggml.tokens", KILN_GGUF_STRING, &toks);
        bool ok = s == KILN_OK && toks->arr.n > 1000;
        kiln_gguf_close(g);
        if (!ok) closedir(d);
        CHECK(ok, "%s: no token list", path);
        n++;
    }
    closedir(d);
    CHECK(n >= 9, "found only %d vocab files", n);
}

static void test_atomic_write(void) {
    char path[] = "/tmp/kiln-atomic-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    CHECK(write(fd, "old", 3) == 3);
    close(fd);
    kiln_gguf_writer *w;
    float data[64] = {1};
    int64_t ne[1] = {64};
    CHECK(kiln_gguf_writer_new(&w) == KILN_OK);
    CHECK(kiln_gguf_writer_add_tensor(w, "a", KILN_TYPE_F32, 1, ne, data) == KILN_OK);
    CHECK(kiln_gguf_writer_add_tensor(w, "b", KILN_TYPE_F32, 1, ne, data) == KILN_OK);
    CHECK(kiln_gguf_writer_begin(w, path) == KILN_OK);
    CHECK(kiln_gguf_writer_write_tensor(w, 1, data, sizeof data) == KILN_ERR_INVALID, "out of order write accepted");
    CHECK(kiln_gguf_writer_write_tensor(w, 0, data, sizeof data) == KILN_OK);
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    struct stat st;
    CHECK(stat(tmp, &st) == 0, "temp file exists while writing");
    /* the write is abandoned (a killed process or an error): the old file is untouched, no temp remains */
    kiln_gguf_writer_free(w);
    CHECK(stat(tmp, &st) != 0, "temp file left behind");
    CHECK(stat(path, &st) == 0 && st.st_size == 3, "old file changed");
    unlink(path);
}

/* Inputs the fuzzer once crashed on, replayed forever: each must be rejected or accepted cleanly. */
static void test_fuzz_regressions(void) {
    DIR *d = opendir("tests/fuzz/regress");
    CHECK(d, "tests/fuzz/regress missing (run from the repo root)");
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[512];
        snprintf(path, sizeof path, "tests/fuzz/regress/%s", e->d_name);
        kiln_gguf *g = NULL;
        kiln_status s = kiln_gguf_open(path, &g);
        if (s == KILN_OK)
            for (int64_t i = 0; i < kiln_gguf_n_tensors(g); i++) (void)kiln_gguf_tensor_at(g, i)->name;
        kiln_gguf_close(g);
    }
    closedir(d);
}

int main(void) {
    RUN(test_valid_hand_made);
    RUN(test_bad_magic);
    RUN(test_bad_version);
    RUN(test_truncated);
    RUN(test_truncated_on_disk);
    RUN(test_count_overflow);
    RUN(test_string_past_end);
    RUN(test_array_past_end);
    RUN(test_bad_values);
    RUN(test_bad_dims);
    RUN(test_bad_type);
    RUN(test_bad_data_placement);
    RUN(test_duplicates);
    RUN(test_wrong_tensor_count);
    RUN(test_data_not_covered);
    RUN(test_alignment_below_type);
    RUN(test_open_not_regular);
    RUN(test_escaped_names);
    RUN(test_round_trip);
    RUN(test_reads_vocab_files);
    RUN(test_atomic_write);
    RUN(test_fuzz_regressions);
    TEST_EXIT();
}
