/* data.c: the shard writer (kiln_data_write), the manifest that makes a shard folder whole, and the mmapped shard
 * loader that feeds training batches (src/train/data.h has both file layouts; the tokenizer fingerprint each shard
 * carries is src/tok/fingerprint.c's).
 *
 * Writing. Every corpus is checked first, before anything in the output folder is touched: a regular file (by
 * stat, which cannot block on a FIFO) and valid UTF-8 in one pass (an error names the file and byte offset). Then
 * each is encoded by the streaming encoder (src/tok/stream.c) in bounded memory. The split point of a document, its last
 * val_fraction of tokens, is known only at its end, so a document's ids are held in memory up to 2^20 ids
 * (4 MiB) and spilled beyond that to an unlinked temporary file in the output folder, then routed to the train
 * and val shard streams. A shard goes to PATH.tmp.<pid> and is fsync'd and renamed over PATH (the folder
 * fsync'd after), as src/core/gguf_write.c does, so a killed run never leaves a half-written shard under a
 * shard's name. The old manifest is removed before the first shard and the new one written the same way after
 * the last, so a folder has a manifest only when every shard it lists is whole.
 *
 * Loading. The manifest lists the shards of each split with their token counts, sizes and hashes; the loader
 * refuses a folder without one, a listed shard missing or changed, and a shard file it does not list, naming the
 * file. Every shard is mmapped, hashed and every header field and token checked before the first batch, so a bad
 * shard fails at open with a one-line error rather than mid-run. tests/test_data.c round-trips shards against
 * kiln_tokenizer_encode and checks each failure; tests/fuzz/fuzz_shards.c fuzzes the manifest and the loader. */
#include "train/data.h"

#include "file.h"
#include "status.h"
#include "tok/tok.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---------------------------------------------------------------- little-endian helpers */

static void put_le(unsigned char *p, uint64_t v, int n) {
    for (int i = 0; i < n; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static uint64_t get_le(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

/* ---------------------------------------------------------------- shard hash */

#define HASH_K1 0x9E3779B97F4A7C15ull /* 2^64 / golden ratio */
#define HASH_K2 0xC2B2AE3D27D4EB4Full /* a 64-bit odd constant with well-mixed bits */

static uint64_t word_le(const unsigned char *p) {
    uint64_t w;
    memcpy(&w, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    w = __builtin_bswap64(w);
#endif
    return w;
}

static uint64_t hash_lane(uint64_t h, uint64_t w) {
    h ^= w * HASH_K1;
    h = h << 31 | h >> 33;
    return h * HASH_K2;
}

uint64_t kiln_shard_hash(const void *p, size_t n) {
    const unsigned char *b = p;
    uint64_t v[4] = {HASH_K1, HASH_K2, ~HASH_K1, ~HASH_K2};
    size_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int k = 0; k < 4; k++) v[k] = hash_lane(v[k], word_le(b + i + 8 * k));
    uint64_t h = (uint64_t)n;
    for (int k = 0; k < 4; k++) h = hash_lane(h, v[k]);
    /* the last n mod 32 bytes: whole words, then the rest zero-padded to one */
    for (; i + 8 <= n; i += 8) h = hash_lane(h, word_le(b + i));
    if (i < n) {
        unsigned char last[8] = {0};
        memcpy(last, b + i, n - i);
        h = hash_lane(h, word_le(last));
    }
    h ^= h >> 30, h *= 0xBF58476D1CE4E5B9ull; /* splitmix64's finalizer */
    h ^= h >> 27, h *= 0x94D049BB133111EBull;
    return h ^ h >> 31;
}

/* ---------------------------------------------------------------- input files */

/* Input files open through core/file.h: anything but a regular file is refused by name before a read can block on
 * it (a FIFO) or fail at its first byte (a folder). */

/* ---------------------------------------------------------------- shard writer */

#define WBUF_TOKENS 65536 /* tokens buffered before a write(2): 128-256 KiB */

typedef struct shard_writer {
    const char *dir, *split;
    uint64_t fingerprint;
    uint32_t n_vocab, bpt; /* bytes per token: 2 or 4 */
    int64_t shard_tokens;  /* the most tokens a shard holds */
    int fd;                /* -1 when no shard is open */
    int index;             /* of the open shard, or of the next one: the shards finished */
    int64_t n_in_shard, n_total;
    char path[4096], tmp[4160];
    unsigned char *buf; /* (WBUF_TOKENS * bpt) */
    size_t buf_n;       /* bytes in buf */
    kiln_manifest_shard *done; /* (index) what the manifest lists of each finished shard */
    int done_cap;
} shard_writer;

static kiln_status write_all(int fd, const char *path, const void *p, size_t n) {
    const char *c = p;
    while (n) {
        ssize_t k = write(fd, c, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return kiln_fail(KILN_ERR_IO, "%s: write failed: %s", path, k < 0 ? strerror(errno) : "short write");
        c += k, n -= (size_t)k;
    }
    return KILN_OK;
}

static void fsync_dir(const char *dir) {
    int dfd = open(dir, O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
}

static kiln_status shard_begin(shard_writer *w) {
    int n = snprintf(w->path, sizeof w->path, "%s/%s_%03d.bin", w->dir, w->split, w->index);
    if (n < 0 || (size_t)n >= sizeof w->path) return kiln_fail(KILN_ERR_INVALID, "%s: output folder path too long", w->dir);
    if (w->index >= KILN_MANIFEST_MAX_SHARDS)
        return kiln_fail(KILN_ERR_INVALID, "%s: more than %d %s shards: pass a larger shard size", w->dir, KILN_MANIFEST_MAX_SHARDS, w->split);
    snprintf(w->tmp, sizeof w->tmp, "%s.tmp.%ld", w->path, (long)getpid());
    w->fd = open(w->tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644); /* read back for its hash */
    if (w->fd < 0) return kiln_fail(KILN_ERR_IO, "%s: cannot create: %s", w->tmp, strerror(errno));
    unsigned char hdr[KILN_SHARD_HEADER] = {0}; /* the token count is filled in by shard_finish */
    w->n_in_shard = 0;
    w->buf_n = 0;
    return write_all(w->fd, w->tmp, hdr, sizeof hdr);
}

static kiln_status shard_flush(shard_writer *w) {
    kiln_status s = write_all(w->fd, w->tmp, w->buf, w->buf_n);
    w->buf_n = 0;
    return s;
}

/* The finished shard's manifest line: its size and the hash of the bytes as they are in the file. */
static kiln_status shard_record(shard_writer *w) {
    if (w->index == w->done_cap) {
        int cap = w->done_cap ? 2 * w->done_cap : 16;
        kiln_manifest_shard *d = realloc(w->done, (size_t)cap * sizeof *d);
        if (!d) return kiln_fail(KILN_ERR_NOMEM, "out of memory for the manifest");
        w->done = d, w->done_cap = cap;
    }
    size_t size = KILN_SHARD_HEADER + (size_t)w->n_in_shard * w->bpt;
    void *m = mmap(NULL, size, PROT_READ, MAP_SHARED, w->fd, 0);
    if (m == MAP_FAILED) return kiln_fail(KILN_ERR_IO, "%s: cannot map to hash it: %s", w->tmp, strerror(errno));
    w->done[w->index] = (kiln_manifest_shard){.n_tokens = w->n_in_shard, .size = size, .hash = kiln_shard_hash(m, size)};
    munmap(m, size);
    return KILN_OK;
}

static kiln_status shard_finish(shard_writer *w) {
    kiln_status s = shard_flush(w);
    unsigned char hdr[KILN_SHARD_HEADER] = {0};
    put_le(hdr + 0, KILN_SHARD_MAGIC, 4);
    put_le(hdr + 4, KILN_SHARD_VERSION, 4);
    put_le(hdr + 8, w->fingerprint, 8);
    put_le(hdr + 16, (uint64_t)w->n_in_shard, 8);
    put_le(hdr + 24, w->bpt, 4);
    put_le(hdr + 28, w->n_vocab, 4);
    if (!s && pwrite(w->fd, hdr, sizeof hdr, 0) != (ssize_t)sizeof hdr) s = kiln_fail(KILN_ERR_IO, "%s: header write failed: %s", w->tmp, strerror(errno));
    if (!s && fsync(w->fd) != 0) s = kiln_fail(KILN_ERR_IO, "%s: fsync failed: %s", w->tmp, strerror(errno));
    if (!s) s = shard_record(w);
    if (close(w->fd) != 0 && !s) s = kiln_fail(KILN_ERR_IO, "%s: close failed: %s", w->tmp, strerror(errno));
    w->fd = -1;
    if (!s && rename(w->tmp, w->path) != 0) s = kiln_fail(KILN_ERR_IO, "%s: rename from %s failed: %s", w->path, w->tmp, strerror(errno));
    if (s) unlink(w->tmp);
    else w->index++;
    return s;
}

/* Appends n tokens, finishing a shard when it holds shard_tokens and opening the next only when a token comes,
 * so no split ends with an empty shard. */
static kiln_status shard_put(shard_writer *w, const int32_t *ids, size_t n) {
    kiln_status s = KILN_OK;
    for (size_t i = 0; i < n && !s; i++) {
        if (w->fd < 0 && (s = shard_begin(w))) break;
        put_le(w->buf + w->buf_n, (uint32_t)ids[i], (int)w->bpt);
        w->buf_n += w->bpt;
        w->n_in_shard++, w->n_total++;
        if (w->buf_n == (size_t)WBUF_TOKENS * w->bpt) s = shard_flush(w);
        if (!s && w->n_in_shard == w->shard_tokens) s = shard_finish(w);
    }
    return s;
}

/* A name of the form SPLIT_<digits>.bin: *split_val says which split, *index its number (-1 past 10^9). */
static bool shard_name(const char *name, bool *split_val, int64_t *index) {
    const char *p;
    if (strncmp(name, "train_", 6) == 0) p = name + 6, *split_val = false;
    else if (strncmp(name, "val_", 4) == 0) p = name + 4, *split_val = true;
    else return false;
    int64_t v = 0;
    const char *d = p;
    for (; *p >= '0' && *p <= '9'; p++) v = p - d < 9 ? v * 10 + (*p - '0') : -1;
    return p > d && strcmp(p, ".bin") == 0 && (*index = v, true);
}

/* Removes the shard files of w's split numbered from w->index up (as kiln data names them), which an earlier run
 * of more shards left: the loader would refuse the folder for them. */
static kiln_status shard_remove_stale(const shard_writer *w) {
    DIR *d = opendir(w->dir);
    if (!d) return kiln_fail(KILN_ERR_IO, "%s: cannot list: %s", w->dir, strerror(errno));
    kiln_status s = KILN_OK;
    struct dirent *e;
    while (!s && (e = readdir(d))) {
        bool val;
        int64_t i;
        char want[32];
        if (!shard_name(e->d_name, &val, &i) || val != (strcmp(w->split, "val") == 0) || i < w->index) continue;
        snprintf(want, sizeof want, "%s_%03d.bin", w->split, (int)i);
        if (strcmp(e->d_name, want) != 0) continue; /* not a name kiln data writes: the loader names it instead */
        char p[4352];
        snprintf(p, sizeof p, "%s/%s", w->dir, e->d_name);
        if (unlink(p) != 0 && errno != ENOENT) s = kiln_fail(KILN_ERR_IO, "%s: cannot remove a stale shard: %s", p, strerror(errno));
    }
    closedir(d);
    return s;
}

static kiln_status shard_close(shard_writer *w) {
    kiln_status s = w->fd >= 0 ? shard_finish(w) : KILN_OK;
    return s ? s : shard_remove_stale(w);
}

static void shard_abort(shard_writer *w) {
    if (w->fd >= 0) {
        close(w->fd);
        unlink(w->tmp);
        w->fd = -1;
    }
    free(w->buf);
    free(w->done);
    w->buf = NULL, w->done = NULL;
}

/* ---------------------------------------------------------------- manifest */

static kiln_status manifest_path(const char *dir, char *p, size_t cap) {
    int n = snprintf(p, cap, "%s/%s", dir, KILN_MANIFEST_NAME);
    if (n < 0 || (size_t)n >= cap) return kiln_fail(KILN_ERR_INVALID, "%s: folder path too long", dir);
    return KILN_OK;
}

/* Writes dir's manifest for the finished shards of both splits: PATH.tmp.<pid>, fsync, rename, fsync the folder. */
static kiln_status manifest_write(const char *dir, uint64_t fingerprint, const shard_writer *tw, const shard_writer *vw) {
    char path[4096], tmp[4160];
    TRY(manifest_path(dir, path, sizeof path));
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    enum { LINE = 96 }; /* "val_1000000.bin", 3 numbers of at most 20 digits, 16 hex digits and spaces: < 96 */
    size_t cap = (size_t)(tw->index + vw->index + 4) * LINE, n = 0;
    char *text = malloc(cap);
    if (!text) return kiln_fail(KILN_ERR_NOMEM, "out of memory for the manifest");
    n += (size_t)snprintf(text + n, cap - n, "kiln-shards %d\nfingerprint %016llx\nshards %d %d\n", KILN_MANIFEST_VERSION,
                          (unsigned long long)fingerprint, tw->index, vw->index);
    for (int k = 0; k < 2; k++) {
        const shard_writer *w = k ? vw : tw;
        for (int i = 0; i < w->index; i++)
            n += (size_t)snprintf(text + n, cap - n, "%s_%03d.bin %lld %llu %016llx\n", w->split, i, (long long)w->done[i].n_tokens,
                                  (unsigned long long)w->done[i].size, (unsigned long long)w->done[i].hash);
    }
    n += (size_t)snprintf(text + n, cap - n, "end\n");
    kiln_status s = KILN_OK;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) s = kiln_fail(KILN_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    if (!s) s = write_all(fd, tmp, text, n);
    if (!s && fsync(fd) != 0) s = kiln_fail(KILN_ERR_IO, "%s: fsync failed: %s", tmp, strerror(errno));
    if (fd >= 0 && close(fd) != 0 && !s) s = kiln_fail(KILN_ERR_IO, "%s: close failed: %s", tmp, strerror(errno));
    if (!s && rename(tmp, path) != 0) s = kiln_fail(KILN_ERR_IO, "%s: rename from %s failed: %s", path, tmp, strerror(errno));
    if (s) unlink(tmp);
    else fsync_dir(dir);
    free(text);
    return s;
}

/* Removes dir's manifest before any shard is replaced: from then until the new one is written the folder is not
 * whole, and the loader must say so. */
static kiln_status manifest_remove(const char *dir) {
    char path[4096];
    TRY(manifest_path(dir, path, sizeof path));
    if (unlink(path) != 0 && errno != ENOENT) return kiln_fail(KILN_ERR_IO, "%s: cannot remove the old manifest: %s", path, strerror(errno));
    fsync_dir(dir);
    return KILN_OK;
}

/* The words of one manifest line, split at single spaces: their count, or -1 for an empty word or more than max. */
static int line_words(const char *p, size_t n, const char **w, size_t *wl, int max) {
    int k = 0;
    size_t i = 0;
    for (;;) {
        size_t j = i;
        while (j < n && p[j] != ' ') j++;
        if (j == i || k == max) return -1;
        w[k] = p + i, wl[k] = j - i, k++;
        if (j == n) return k;
        i = j + 1;
    }
}

static bool word_is(const char *w, size_t n, const char *lit) { return n == strlen(lit) && memcmp(w, lit, n) == 0; }

/* Decimal digits without sign or leading zeros, at most max. */
static bool word_dec(const char *w, size_t n, uint64_t max, uint64_t *out) {
    if (n == 0 || n > 20 || (n > 1 && w[0] == '0')) return false;
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (w[i] < '0' || w[i] > '9' || !kiln_mul_ok(v, 10, &v) || !kiln_add_ok(v, (uint64_t)(w[i] - '0'), &v)) return false;
    }
    *out = v;
    return v <= max;
}

/* Exactly 16 lowercase hex digits. */
static bool word_hex16(const char *w, size_t n, uint64_t *out) {
    if (n != 16) return false;
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        int d = w[i] >= '0' && w[i] <= '9' ? w[i] - '0' : w[i] >= 'a' && w[i] <= 'f' ? w[i] - 'a' + 10 : -1;
        if (d < 0) return false;
        v = v << 4 | (uint64_t)d;
    }
    *out = v;
    return true;
}

void kiln_manifest_free(kiln_manifest *m) {
    if (!m) return;
    free(m->shards);
    *m = (kiln_manifest){0};
}

kiln_status kiln_manifest_parse(const char *text, size_t len, const char *path, kiln_manifest *out) {
    *out = (kiln_manifest){0};
    kiln_manifest m = {0};
    size_t at = 0;
    int64_t line = 0, n_lines = 4; /* lines to read: grows by the shard count once "shards" is read */
    kiln_status s = KILN_OK;
    for (; line < n_lines && !s; line++) {
        const char *nl = at < len ? memchr(text + at, '\n', len - at) : NULL;
        if (!nl) {
            s = kiln_fail(KILN_ERR_FORMAT, "%s:%lld: truncated: the line has no end (a manifest ends with \"end\")", path, (long long)line + 1);
            break;
        }
        const char *p = text + at, *w[4];
        size_t n = (size_t)(nl - p), wl[4];
        at += n + 1;
        if (memchr(p, 0, n)) {
            s = kiln_fail(KILN_ERR_FORMAT, "%s:%lld: a NUL byte", path, (long long)line + 1);
            break;
        }
        int k = line_words(p, n, w, wl, 4);
        uint64_t a, b;
        if (line == 0) {
            if (k != 2 || !word_is(w[0], wl[0], "kiln-shards") || !word_dec(w[1], wl[1], INT32_MAX, &a))
                s = kiln_fail(KILN_ERR_FORMAT, "%s:1: not a kiln shard manifest (it starts with \"kiln-shards %d\")", path, KILN_MANIFEST_VERSION);
            else if (a != KILN_MANIFEST_VERSION)
                s = kiln_fail(KILN_ERR_UNSUPPORTED, "%s:1: manifest version %llu, kiln reads version %d", path, (unsigned long long)a, KILN_MANIFEST_VERSION);
        } else if (line == 1) {
            if (k != 2 || !word_is(w[0], wl[0], "fingerprint") || !word_hex16(w[1], wl[1], &m.fingerprint))
                s = kiln_fail(KILN_ERR_FORMAT, "%s:2: expected \"fingerprint\" and 16 lowercase hex digits", path);
        } else if (line == 2) {
            if (k != 3 || !word_is(w[0], wl[0], "shards") || !word_dec(w[1], wl[1], KILN_MANIFEST_MAX_SHARDS, &a) ||
                !word_dec(w[2], wl[2], KILN_MANIFEST_MAX_SHARDS, &b)) {
                s = kiln_fail(KILN_ERR_FORMAT, "%s:3: expected \"shards NTRAIN NVAL\", each at most %d", path, KILN_MANIFEST_MAX_SHARDS);
                break;
            }
            /* a shard line is at least 34 bytes ("val_000.bin 0 0 " and 16 hex digits and its '\n'): a count the
             * rest of the text cannot hold is refused before anything is allocated for it */
            if ((a + b) * 34 > len - at) {
                s = kiln_fail(KILN_ERR_FORMAT, "%s:3: %llu shards listed but the manifest is too short for them", path, (unsigned long long)(a + b));
                break;
            }
            m.n_train = (int)a, m.n_val = (int)b;
            m.shards = calloc(a + b ? a + b : 1, sizeof *m.shards);
            if (!m.shards) s = kiln_fail(KILN_ERR_NOMEM, "out of memory for the manifest");
            n_lines += (int64_t)(a + b);
        } else if (line < n_lines - 1) {
            int64_t i = line - 3;
            bool val = i >= m.n_train;
            char want[32];
            snprintf(want, sizeof want, "%s_%03d.bin", val ? "val" : "train", (int)(val ? i - m.n_train : i));
            kiln_manifest_shard *e = &m.shards[i];
            if (k != 4 || !word_is(w[0], wl[0], want) || !word_dec(w[1], wl[1], INT64_MAX, &a) || !word_dec(w[2], wl[2], INT64_MAX, &e->size) ||
                !word_hex16(w[3], wl[3], &e->hash))
                s = kiln_fail(KILN_ERR_FORMAT, "%s:%lld: expected \"%s TOKENS BYTES HASH\"", path, (long long)line + 1, want);
            e->n_tokens = (int64_t)a;
        } else if (k != 1 || !word_is(w[0], wl[0], "end"))
            s = kiln_fail(KILN_ERR_FORMAT, "%s:%lld: expected \"end\" after the %d shards", path, (long long)line + 1, m.n_train + m.n_val);
    }
    if (!s && at != len) s = kiln_fail(KILN_ERR_FORMAT, "%s:%lld: text after \"end\"", path, (long long)line + 1);
    if (s) {
        kiln_manifest_free(&m);
        return s;
    }
    *out = m;
    return KILN_OK;
}

/* Reads and parses dir's manifest; path gets its name. A folder without one is KILN_ERR_NOT_FOUND. */
static kiln_status manifest_read(const char *dir, char *path, size_t cap, kiln_manifest *m) {
    TRY(manifest_path(dir, path, cap));
    struct stat st;
    if (stat(path, &st) != 0 && errno == ENOENT)
        return kiln_fail(KILN_ERR_NOT_FOUND, "%s: missing: %s is not a complete kiln data folder (kiln data writes the manifest after "
                                             "the last shard; a run that stopped early leaves none): run kiln data again", path, dir);
    int fd;
    TRY(kiln_open_regular(path, &fd));
    kiln_status s = KILN_OK;
    enum { MAX_BYTES = 256 << 20 }; /* KILN_MANIFEST_MAX_SHARDS lines of both splits, under 96 bytes each */
    char *text = NULL;
    if (fstat(fd, &st) != 0) s = kiln_fail(KILN_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    else if (st.st_size > MAX_BYTES) s = kiln_fail(KILN_ERR_FORMAT, "%s: %lld bytes, more than a manifest holds", path, (long long)st.st_size);
    else if (!(text = malloc((size_t)st.st_size + 1))) s = kiln_fail(KILN_ERR_NOMEM, "out of memory for %s", path);
    size_t n = 0;
    while (!s && n < (size_t)st.st_size) {
        ssize_t k = read(fd, text + n, (size_t)st.st_size - n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) s = kiln_fail(KILN_ERR_IO, "%s: read failed at byte %zu: %s", path, n, k < 0 ? strerror(errno) : "file shrank");
        else n += (size_t)k;
    }
    close(fd);
    if (!s) s = kiln_manifest_parse(text, n, path, m);
    free(text);
    return s;
}

/* ---------------------------------------------------------------- tokenizer */

kiln_status kiln_data_tokenizer_gguf(const char *path, kiln_gguf **out) {
    *out = NULL;
    int fd;
    TRY(kiln_open_regular(path, &fd));
    unsigned char magic[4] = {0};
    ssize_t got = pread(fd, magic, 4, 0);
    close(fd);
    if (got != 4 || memcmp(magic, "GGUF", 4) != 0)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: not a GGUF file: training takes its tokenizer from a GGUF (kiln tokenizer train's vocab, "
                                               "or a model), whose tokenizer keys its checkpoints and exported model carry; a llama2.c "
                                               "tokenizer.bin has none", path);
    return kiln_gguf_open(path, out);
}

kiln_status kiln_data_tokenizer_load(const char *path, kiln_tokenizer **out) {
    *out = NULL;
    kiln_gguf *g;
    TRY(kiln_data_tokenizer_gguf(path, &g));
    kiln_status s = kiln_tokenizer_load_gguf(g, out);
    kiln_gguf_close(g);
    return s;
}

/* ---------------------------------------------------------------- document routing */

/* Ids of one document held in memory before spilling: 4 MiB. Spilling costs a write and a read of 4 bytes an
 * id, small beside the encoder's cost per id, so a small buffer loses nothing. */
#define DOC_MEM_IDS (1u << 20)

typedef struct doc_state {
    const char *dir;
    int32_t *ids; /* (n of DOC_MEM_IDS) the document's ids not yet spilled */
    size_t n;
    int spill_fd; /* -1 until the document outgrows ids; unlinked at creation */
    int64_t n_spilled;
    char spill_path[4160];
} doc_state;

static kiln_status doc_emit(void *ud, const int32_t *ids, size_t n) {
    doc_state *d = ud;
    while (n) {
        if (d->n == DOC_MEM_IDS) {
            if (d->spill_fd < 0) {
                snprintf(d->spill_path, sizeof d->spill_path, "%s/.spill.tmp.%ld", d->dir, (long)getpid());
                d->spill_fd = open(d->spill_path, O_RDWR | O_CREAT | O_TRUNC, 0600);
                if (d->spill_fd < 0) return kiln_fail(KILN_ERR_IO, "%s: cannot create: %s", d->spill_path, strerror(errno));
                unlink(d->spill_path); /* gone with the descriptor, whatever happens */
            }
            kiln_status s = write_all(d->spill_fd, d->spill_path, d->ids, d->n * sizeof *d->ids);
            if (s) return s;
            d->n_spilled += (int64_t)d->n;
            d->n = 0;
        }
        size_t k = DOC_MEM_IDS - d->n < n ? DOC_MEM_IDS - d->n : n;
        memcpy(d->ids + d->n, ids, k * sizeof *ids);
        d->n += k, ids += k, n -= k;
    }
    return KILN_OK;
}

/* Sends ids [from, to) of the document (spilled ones first, then those in memory) to w. */
static kiln_status doc_route(doc_state *d, int64_t from, int64_t to, shard_writer *w, int32_t *tmp) {
    while (from < to && from < d->n_spilled) {
        int64_t k = to < d->n_spilled ? to - from : d->n_spilled - from;
        if (k > (int64_t)WBUF_TOKENS) k = WBUF_TOKENS;
        size_t bytes = (size_t)k * sizeof *tmp;
        ssize_t got = pread(d->spill_fd, tmp, bytes, (off_t)from * (off_t)sizeof *tmp);
        if (got != (ssize_t)bytes) return kiln_fail(KILN_ERR_IO, "%s: read back failed: %s", d->spill_path, got < 0 ? strerror(errno) : "short read");
        kiln_status s = shard_put(w, tmp, (size_t)k);
        if (s) return s;
        from += k;
    }
    if (from < to) return shard_put(w, d->ids + (from - d->n_spilled), (size_t)(to - from));
    return KILN_OK;
}

/* ---------------------------------------------------------------- UTF-8 check */

/* Reads path once and fails at the first invalid UTF-8 sequence, naming the byte offset. *bytes (bytes may be
 * NULL) gets the size. A folder, FIFO or device is refused before the first read. */
static kiln_status check_utf8(const char *path, int64_t *bytes) {
    int fd;
    TRY(kiln_open_regular(path, &fd));
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        close(fd);
        return kiln_fail(KILN_ERR_NOMEM, "%s: cannot open a stream: %s", path, strerror(errno));
    }
    enum { CH = 1 << 20 };
    unsigned char *buf = malloc(CH + 4);
    if (!buf) {
        fclose(f);
        return kiln_fail(KILN_ERR_NOMEM, "out of memory for a read buffer");
    }
    kiln_status s = KILN_OK;
    size_t carry = 0; /* bytes of a sequence cut by the chunk end, moved to the front */
    int64_t base = 0; /* file offset of buf[0] */
    for (;;) {
        size_t got = fread(buf + carry, 1, CH, f), len = carry + got;
        bool eof = got < CH;
        if (eof && ferror(f)) {
            s = kiln_fail(KILN_ERR_IO, "%s: read failed at byte %lld", path, (long long)(base + (int64_t)carry));
            break;
        }
        size_t i = 0;
        while (i < len) {
            if (buf[i] < 0x80) { /* ASCII, most of most corpora */
                i++;
                continue;
            }
            uint32_t cp;
            int n = kiln_utf8_decode(buf + i, len - i, &cp);
            if (n == 0) {
                /* a lead byte whose sequence runs past the chunk end is only cut, not invalid, unless at EOF */
                size_t need = buf[i] >= 0xF0 ? 4 : buf[i] >= 0xE0 ? 3 : 2;
                if (!eof && len - i < need) break;
                s = kiln_fail(KILN_ERR_FORMAT, "%s: invalid UTF-8 at byte %lld (0x%02x)", path, (long long)(base + (int64_t)i), buf[i]);
                break;
            }
            i += (size_t)n;
        }
        if (s || eof) {
            if (!s && bytes) *bytes = base + (int64_t)len;
            break;
        }
        carry = len - i;
        memmove(buf, buf + i, carry);
        base += (int64_t)i;
    }
    free(buf);
    fclose(f);
    return s;
}

/* ---------------------------------------------------------------- kiln_data_write */

static kiln_status make_dirs(const char *dir) {
    char p[4096];
    size_t n = strlen(dir);
    if (n == 0 || n >= sizeof p) return kiln_fail(KILN_ERR_INVALID, "bad output folder '%s'", dir);
    memcpy(p, dir, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (p[i] != '/' && p[i] != 0) continue;
        char c = p[i];
        p[i] = 0;
        if (mkdir(p, 0755) != 0 && errno != EEXIST) return kiln_fail(KILN_ERR_IO, "%s: cannot create folder: %s", p, strerror(errno));
        p[i] = c;
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) return kiln_fail(KILN_ERR_IO, "%s: not a folder", dir);
    return KILN_OK;
}

kiln_data_params kiln_data_default(void) { return (kiln_data_params){.val_fraction = 0.05}; }


kiln_status kiln_data_write(const char *const *corpora, int n_corpora, const kiln_tokenizer *tok, const char *out_dir,
                            const kiln_data_params *p, kiln_data_stats *stats) {
    const kiln_data_params defaults = kiln_data_default();
    if (!p) p = &defaults;
    const double val_fraction = p->val_fraction;
    int64_t shard_tokens = p->shard_tokens;
    if (!corpora || n_corpora <= 0 || !tok || !out_dir) return kiln_fail(KILN_ERR_INVALID, "data: no corpus, tokenizer or output folder");
    if (!(val_fraction >= 0 && val_fraction < 1)) return kiln_fail(KILN_ERR_INVALID, "data: val fraction %g is outside [0, 1)", val_fraction);
    if (shard_tokens < 0) return kiln_fail(KILN_ERR_INVALID, "data: shard size %lld tokens is negative", (long long)shard_tokens);
    if (shard_tokens == 0) shard_tokens = 100000000;
    /* every corpus is checked (a regular file, valid UTF-8) before anything in out_dir is touched: bad input
     * leaves an earlier run's folder as it was */
    kiln_status s = KILN_OK;
    for (int c = 0; c < n_corpora && !s; c++) s = kiln_check_regular(corpora[c]);
    for (int c = 0; c < n_corpora && !s; c++) s = check_utf8(corpora[c], NULL);
    if (!s) s = make_dirs(out_dir);
    if (!s) s = manifest_remove(out_dir);
    if (s) return s;

    kiln_data_stats st = {0};
    uint32_t bpt = tok->n_vocab <= 65536 ? 2 : 4; /* ids 0..65535 fit a uint16 */
    const uint64_t fingerprint = kiln_tokenizer_fingerprint(tok);
    shard_writer tw = {.dir = out_dir, .split = "train", .fingerprint = fingerprint, .n_vocab = (uint32_t)tok->n_vocab, .bpt = bpt,
                       .shard_tokens = shard_tokens, .fd = -1};
    shard_writer vw = tw;
    vw.split = "val";
    tw.buf = malloc((size_t)WBUF_TOKENS * bpt);
    vw.buf = malloc((size_t)WBUF_TOKENS * bpt);
    doc_state d = {.dir = out_dir, .ids = malloc((size_t)DOC_MEM_IDS * sizeof(int32_t)), .spill_fd = -1};
    int32_t *tmp = malloc((size_t)WBUF_TOKENS * sizeof *tmp);
    if (!tw.buf || !vw.buf || !d.ids || !tmp) s = kiln_fail(KILN_ERR_NOMEM, "data: out of memory for buffers");

    /* the progress total: the corpora's sizes (a file stat cannot read counts 0 here; check_utf8 then names it) */
    kiln_progress prog = {.stage = "data", .metric = NAN};
    for (int c = 0; c < n_corpora && p->progress; c++) {
        struct stat cst;
        if (stat(corpora[c], &cst) == 0 && S_ISREG(cst.st_mode)) prog.total += (int64_t)cst.st_size;
    }
    for (int c = 0; c < n_corpora && !s; c++) {
        struct stat cst;
        if (stat(corpora[c], &cst) != 0) {
            s = kiln_fail(KILN_ERR_IO, "%s: cannot stat: %s", corpora[c], strerror(errno));
            break;
        }
        d.n = 0, d.n_spilled = 0;
        /* parse_special off: text that spells "<s>" in a corpus is text, not a control token */
        if ((s = kiln_tokenizer_encode_file(tok, corpora[c], true, false, doc_emit, &d))) break;
        int64_t n = d.n_spilled + (int64_t)d.n;
        int64_t n_val = 0;
        if (val_fraction > 0 && n > 0) {
            n_val = (int64_t)((double)n * val_fraction);
            if (n_val < 1) n_val = 1;
        }
        if ((s = doc_route(&d, 0, n - n_val, &tw, tmp)) || (s = doc_route(&d, n - n_val, n, &vw, tmp))) break;
        if (d.spill_fd >= 0) {
            close(d.spill_fd);
            d.spill_fd = -1;
        }
        st.n_bytes_in += (int64_t)cst.st_size;
        if (p->progress) {
            prog.done = st.n_bytes_in;
            p->progress(p->progress_ud, &prog);
        }
    }
    if (!s) s = shard_close(&tw);
    if (!s) s = shard_close(&vw);
    if (!s) fsync_dir(out_dir);
    if (!s) s = manifest_write(out_dir, fingerprint, &tw, &vw); /* last: the folder is whole from here on */
    if (d.spill_fd >= 0) close(d.spill_fd);
    st.n_train_tokens = tw.n_total, st.n_val_tokens = vw.n_total;
    st.n_train_shards = tw.index, st.n_val_shards = vw.index;
    shard_abort(&tw);
    shard_abort(&vw);
    free(d.ids);
    free(tmp);
    if (stats) *stats = st;
    return s;
}

/* ---------------------------------------------------------------- loader */

typedef struct shard_map {
    char *path;
    const unsigned char *map; /* the whole file, mmapped */
    size_t size;
    const unsigned char *tokens; /* map + KILN_SHARD_HEADER */
    int64_t n;                   /* tokens */
    int64_t start;               /* index of its first token in the concatenation */
    uint32_t bpt;
} shard_map;

struct kiln_loader {
    shard_map *shards; /* (n_shards) */
    int n_shards;
    int64_t n_tokens; /* total over the shards */
    int64_t pos;      /* next token read, [0, n_tokens) */
    int cur;          /* shard holding pos, a hint for the sequential reads */
};

void kiln_loader_free(kiln_loader *l) {
    if (!l) return;
    for (int i = 0; i < l->n_shards; i++) {
        if (l->shards[i].map) munmap((void *)l->shards[i].map, l->shards[i].size);
        free(l->shards[i].path);
    }
    free(l->shards);
    free(l);
}

/* Opens a shard the manifest lists (ms) and maps it: the file must be there, a regular file of the listed size. */
static kiln_status shard_map_file(const char *path, const char *manifest, const kiln_manifest_shard *ms, shard_map *sm) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT)
        return kiln_fail(KILN_ERR_FORMAT, "%s: missing, but %s lists it: the data folder is incomplete (run kiln data again)", path, manifest);
    if (fd < 0) return kiln_fail(KILN_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    kiln_status s = KILN_OK;
    if (fstat(fd, &st) != 0) s = kiln_fail(KILN_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    else if (!S_ISREG(st.st_mode)) s = kiln_fail(KILN_ERR_FORMAT, "%s: is not a regular file", path);
    else if ((uint64_t)st.st_size != ms->size)
        s = kiln_fail(KILN_ERR_FORMAT, "%s: %s since kiln data wrote it: %lld bytes, %s lists %llu", path,
                      (uint64_t)st.st_size < ms->size ? "truncated" : "grown", (long long)st.st_size, manifest, (unsigned long long)ms->size);
    else if (st.st_size < KILN_SHARD_HEADER)
        s = kiln_fail(KILN_ERR_FORMAT, "%s: truncated: %lld bytes, less than the %d-byte shard header", path, (long long)st.st_size,
                      KILN_SHARD_HEADER);
    if (s) {
        close(fd);
        return s;
    }
    sm->size = (size_t)st.st_size;
    void *m = mmap(NULL, sm->size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED) return kiln_fail(KILN_ERR_IO, "%s: mmap failed: %s", path, strerror(errno));
    sm->map = m;
    madvise(m, sm->size, MADV_SEQUENTIAL);
    return KILN_OK;
}

/* Maps path and checks everything about it: its hash and size against the manifest, src/train/data.h's header,
 * each token. */
static kiln_status shard_open(const char *path, const char *manifest, const kiln_manifest_shard *ms, uint64_t fingerprint, int64_t n_vocab,
                              shard_map *sm) {
    TRY(shard_map_file(path, manifest, ms, sm));
    const unsigned char *h = sm->map;
    uint64_t hash = kiln_shard_hash(h, sm->size);
    if (hash != ms->hash)
        return kiln_fail(KILN_ERR_FORMAT, "%s: changed since kiln data wrote it: hash %016llx, %s lists %016llx", path, (unsigned long long)hash,
                         manifest, (unsigned long long)ms->hash);
    uint32_t magic = (uint32_t)get_le(h, 4), version = (uint32_t)get_le(h + 4, 4), bpt = (uint32_t)get_le(h + 24, 4);
    uint64_t fp = get_le(h + 8, 8), n = get_le(h + 16, 8);
    if (magic != KILN_SHARD_MAGIC)
        return kiln_fail(KILN_ERR_FORMAT, "%s: bad magic 0x%08x (a kiln token shard starts with \"KSHD\")", path, magic);
    if (version != KILN_SHARD_VERSION)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: shard version %u, kiln reads version %d", path, version, KILN_SHARD_VERSION);
    if (bpt != 2 && bpt != 4) return kiln_fail(KILN_ERR_FORMAT, "%s: %u bytes per token (must be 2 or 4)", path, bpt);
    uint64_t data = sm->size - KILN_SHARD_HEADER, want;
    if (!kiln_mul_ok(n, bpt, &want) || want != data)
        return kiln_fail(KILN_ERR_FORMAT, "%s: %s: the header says %llu tokens of %u bytes but %llu bytes follow it", path,
                         want > data ? "truncated" : "size mismatch", (unsigned long long)n, bpt, (unsigned long long)data);
    if (n != (uint64_t)ms->n_tokens)
        return kiln_fail(KILN_ERR_FORMAT, "%s: the header says %llu tokens, %s lists %lld", path, (unsigned long long)n, manifest,
                         (long long)ms->n_tokens);
    if (fp != fingerprint)
        return kiln_fail(KILN_ERR_INVALID, "%s: tokenizer fingerprint %016llx does not match this tokenizer's %016llx (shards made by another tokenizer)",
                         path, (unsigned long long)fp, (unsigned long long)fingerprint);
    sm->tokens = h + KILN_SHARD_HEADER;
    sm->n = (int64_t)n;
    sm->bpt = bpt;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t id = get_le(sm->tokens + i * bpt, (int)bpt);
        if ((int64_t)id >= n_vocab)
            return kiln_fail(KILN_ERR_RANGE, "%s: token %llu at index %llu is outside the vocab of %lld", path, (unsigned long long)id,
                             (unsigned long long)i, (long long)n_vocab);
    }
    return KILN_OK;
}

/* Refuses a file in dir named as a shard (train_N.bin, val_N.bin) that m does not list: a shard of another run, which
 * the loader would otherwise skip without a word. */
static kiln_status check_unlisted(const char *dir, const char *manifest, const kiln_manifest *m) {
    DIR *d = opendir(dir);
    if (!d) return kiln_fail(KILN_ERR_IO, "%s: cannot list: %s", dir, strerror(errno));
    kiln_status s = KILN_OK;
    struct dirent *e;
    while (!s && (e = readdir(d))) {
        bool val;
        int64_t i;
        if (!shard_name(e->d_name, &val, &i)) continue;
        char want[32];
        snprintf(want, sizeof want, "%s_%03d.bin", val ? "val" : "train", (int)(i < 0 ? 0 : i));
        if (i < 0 || i >= (val ? m->n_val : m->n_train) || strcmp(e->d_name, want) != 0)
            s = kiln_fail(KILN_ERR_FORMAT, "%s/%s: a shard file %s does not list (left by another run?): remove it or run kiln data again", dir,
                          e->d_name, manifest);
    }
    closedir(d);
    return s;
}

kiln_status kiln_loader_open(const char *dir, const char *split, uint64_t fingerprint, int64_t n_vocab, kiln_loader **out) {
    *out = NULL;
    if (!dir || !split || n_vocab <= 0) return kiln_fail(KILN_ERR_INVALID, "loader: no folder or split, or vocab size %lld", (long long)n_vocab);
    const bool val = strcmp(split, "val") == 0;
    if (!val && strcmp(split, "train") != 0) return kiln_fail(KILN_ERR_INVALID, "loader: split '%s' is neither train nor val", split);
    char manifest[4096];
    kiln_manifest m;
    TRY(manifest_read(dir, manifest, sizeof manifest, &m));
    kiln_status s = KILN_OK;
    kiln_loader *l = NULL;
    const int first = val ? m.n_train : 0, count = val ? m.n_val : m.n_train;
    if (m.fingerprint != fingerprint)
        s = kiln_fail(KILN_ERR_INVALID, "%s: tokenizer fingerprint %016llx does not match this tokenizer's %016llx (shards made by another tokenizer)",
                      manifest, (unsigned long long)m.fingerprint, (unsigned long long)fingerprint);
    if (!s) s = check_unlisted(dir, manifest, &m);
    if (!s && count == 0) s = kiln_fail(KILN_ERR_NOT_FOUND, "%s: no %s shards (%s lists none)", dir, split, manifest);
    if (!s && (!(l = calloc(1, sizeof *l)) || !(l->shards = calloc((size_t)count, sizeof *l->shards)))) s = kiln_fail(KILN_ERR_NOMEM, "out of memory");
    for (int i = 0; i < count && !s; i++) {
        char path[4096];
        int k = snprintf(path, sizeof path, "%s/%s_%03d.bin", dir, split, i);
        if (k < 0 || (size_t)k >= sizeof path) {
            s = kiln_fail(KILN_ERR_INVALID, "%s: folder path too long", dir);
            break;
        }
        shard_map *sm = &l->shards[l->n_shards++];
        *sm = (shard_map){.path = strdup(path), .start = l->n_tokens};
        if (!sm->path) s = kiln_fail(KILN_ERR_NOMEM, "out of memory");
        else if (!(s = shard_open(path, manifest, &m.shards[first + i], fingerprint, n_vocab, sm))) l->n_tokens += sm->n;
    }
    if (!s && l->n_tokens == 0) s = kiln_fail(KILN_ERR_FORMAT, "%s: the %s shards hold no tokens", dir, split);
    kiln_manifest_free(&m);
    if (s) {
        kiln_loader_free(l);
        return s;
    }
    *out = l;
    return KILN_OK;
}

int64_t kiln_loader_n_tokens(const kiln_loader *l) { return l->n_tokens; }
int64_t kiln_loader_pos(const kiln_loader *l) { return l->pos; }

kiln_status kiln_loader_set_pos(kiln_loader *l, int64_t pos) {
    if (pos < 0 || pos >= l->n_tokens)
        return kiln_fail(KILN_ERR_RANGE, "loader: position %lld is outside the %lld tokens of the shards", (long long)pos, (long long)l->n_tokens);
    l->pos = pos;
    return KILN_OK;
}

/* Copies n tokens starting at pos (mod n_tokens) into dst, wrapping at the end of the last shard. */
static void copy_tokens(kiln_loader *l, int64_t pos, int64_t n, int32_t *dst) {
    pos %= l->n_tokens;
    int c = l->cur;
    while (n > 0) {
        /* sequential reads stay in the hinted shard or move to the next; a set_pos jump searches */
        if (pos < l->shards[c].start || pos >= l->shards[c].start + l->shards[c].n) {
            int lo = 0, hi = l->n_shards - 1;
            while (lo < hi) {
                int mid = (lo + hi + 1) / 2;
                if (l->shards[mid].start <= pos) lo = mid;
                else hi = mid - 1;
            }
            c = lo; /* the last shard starting at or before pos: never an empty one, which shares its start with the next */
        }
        const shard_map *sm = &l->shards[c];
        int64_t off = pos - sm->start, k = sm->n - off < n ? sm->n - off : n;
        if (sm->bpt == 2) {
            const unsigned char *p = sm->tokens + off * 2;
            for (int64_t i = 0; i < k; i++) dst[i] = (int32_t)(p[2 * i] | p[2 * i + 1] << 8);
        } else {
            const unsigned char *p = sm->tokens + off * 4;
            for (int64_t i = 0; i < k; i++) dst[i] = (int32_t)get_le(p + 4 * i, 4);
        }
        dst += k, n -= k, pos += k;
        if (pos == l->n_tokens) pos = 0;
    }
    l->cur = c;
}

kiln_status kiln_loader_next(kiln_loader *l, int64_t B, int64_t T, int32_t *inputs, int32_t *targets) {
    if (B <= 0 || T <= 0) return kiln_fail(KILN_ERR_INVALID, "loader: batch %lld x %lld", (long long)B, (long long)T);
    if (l->n_tokens < T + 1)
        return kiln_fail(KILN_ERR_INVALID, "loader: %lld tokens in the shards, a row of %lld + 1 needs more", (long long)l->n_tokens, (long long)T);
    for (int64_t b = 0; b < B; b++) {
        copy_tokens(l, l->pos, T, inputs + b * T);      /* inputs  (B, T) */
        copy_tokens(l, l->pos + 1, T, targets + b * T); /* targets (B, T) */
        l->pos = (l->pos + T) % l->n_tokens;
    }
    return KILN_OK;
}
