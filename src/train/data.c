/* data.c: the shard writer (kiln_data_write) and the mmapped shard loader that feeds training batches
 * (src/train/data.h has the file layout; the tokenizer fingerprint each shard carries is src/tok/fingerprint.c's).
 *
 * Writing. Each corpus is checked for valid UTF-8 in one pass (an error names the file and byte offset), then
 * encoded by the streaming encoder (src/tok/stream.c) in bounded memory. The split point of a document, its last
 * val_fraction of tokens, is known only at its end, so a document's ids are held in memory up to 2^20 ids
 * (4 MiB) and spilled beyond that to an unlinked temporary file in the output folder, then routed to the train
 * and val shard streams. A shard goes to PATH.tmp.<pid> and is fsync'd and renamed over PATH (the folder
 * fsync'd after), as src/core/gguf_write.c does, so a killed run never leaves a half-written shard under a
 * shard's name; shards of an earlier, longer run of the same split are removed at the end.
 *
 * Loading. The shards of a split (SPLIT_000.bin, SPLIT_001.bin, ... up to the first missing index) are
 * mmapped and every header field and token checked before the first batch, so a bad shard fails at open with
 * a one-line error naming the file rather than mid-run. tests/test_data.c round-trips shards against
 * kiln_tokenizer_encode and checks each failure. */
#include "train/data.h"

#include "status.h"
#include "tok/tok.h"

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

/* ---------------------------------------------------------------- shard writer */

#define WBUF_TOKENS 65536 /* tokens buffered before a write(2): 128-256 KiB */

typedef struct shard_writer {
    const char *dir, *split;
    uint64_t fingerprint;
    uint32_t n_vocab, bpt; /* bytes per token: 2 or 4 */
    int64_t shard_tokens;  /* the most tokens a shard holds */
    int fd;                /* -1 when no shard is open */
    int index;             /* of the open shard, or of the next one */
    int64_t n_in_shard, n_total;
    char path[4096], tmp[4160];
    unsigned char *buf; /* (WBUF_TOKENS * bpt) */
    size_t buf_n;       /* bytes in buf */
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
    snprintf(w->tmp, sizeof w->tmp, "%s.tmp.%ld", w->path, (long)getpid());
    w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
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

static kiln_status shard_close(shard_writer *w) {
    kiln_status s = w->fd >= 0 ? shard_finish(w) : KILN_OK;
    /* shards left by an earlier run with more of them would be read as part of this one */
    for (int i = w->index;; i++) {
        char p[4096];
        snprintf(p, sizeof p, "%s/%s_%03d.bin", w->dir, w->split, i);
        if (unlink(p) != 0) break;
    }
    return s;
}

static void shard_abort(shard_writer *w) {
    if (w->fd >= 0) {
        close(w->fd);
        unlink(w->tmp);
        w->fd = -1;
    }
    free(w->buf);
    w->buf = NULL;
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

/* Reads path once and fails at the first invalid UTF-8 sequence, naming the byte offset. *bytes gets the size. */
static kiln_status check_utf8(const char *path, int64_t *bytes) {
    FILE *f = fopen(path, "rb");
    if (!f) return kiln_fail(KILN_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
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
            if (!s) *bytes = base + (int64_t)len;
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
    kiln_status s = make_dirs(out_dir);
    if (s) return s;

    kiln_data_stats st = {0};
    uint32_t bpt = tok->n_vocab <= 65536 ? 2 : 4; /* ids 0..65535 fit a uint16 */
    shard_writer tw = {.dir = out_dir, .split = "train", .fingerprint = kiln_tokenizer_fingerprint(tok), .n_vocab = (uint32_t)tok->n_vocab,
                       .bpt = bpt, .shard_tokens = shard_tokens, .fd = -1};
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
        if (stat(corpora[c], &cst) == 0) prog.total += (int64_t)cst.st_size;
    }
    for (int c = 0; c < n_corpora && !s; c++) {
        int64_t bytes = 0;
        if ((s = check_utf8(corpora[c], &bytes))) break;
        st.n_bytes_in += bytes;
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
        if (p->progress) {
            prog.done = st.n_bytes_in;
            p->progress(p->progress_ud, &prog);
        }
    }
    if (!s) s = shard_close(&tw);
    if (!s) s = shard_close(&vw);
    if (!s) fsync_dir(out_dir);
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

/* Maps path and checks everything about it (src/train/data.h's header, the size, each token). */
static kiln_status shard_open(const char *path, uint64_t fingerprint, int64_t n_vocab, shard_map *sm) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return kiln_fail(KILN_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return kiln_fail(KILN_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    }
    if (st.st_size < KILN_SHARD_HEADER) {
        close(fd);
        return kiln_fail(KILN_ERR_FORMAT, "%s: truncated: %lld bytes, less than the %d-byte shard header", path, (long long)st.st_size,
                         KILN_SHARD_HEADER);
    }
    sm->size = (size_t)st.st_size;
    void *m = mmap(NULL, sm->size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED) return kiln_fail(KILN_ERR_IO, "%s: mmap failed: %s", path, strerror(errno));
    sm->map = m;
    const unsigned char *h = sm->map;
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
    if (fp != fingerprint)
        return kiln_fail(KILN_ERR_INVALID, "%s: tokenizer fingerprint %016llx does not match this tokenizer's %016llx (shards made by another tokenizer)",
                         path, (unsigned long long)fp, (unsigned long long)fingerprint);
    sm->tokens = h + KILN_SHARD_HEADER;
    sm->n = (int64_t)n;
    sm->bpt = bpt;
    madvise(m, sm->size, MADV_SEQUENTIAL);
    for (uint64_t i = 0; i < n; i++) {
        uint64_t id = get_le(sm->tokens + i * bpt, (int)bpt);
        if ((int64_t)id >= n_vocab)
            return kiln_fail(KILN_ERR_RANGE, "%s: token %llu at index %llu is outside the vocab of %lld", path, (unsigned long long)id,
                             (unsigned long long)i, (long long)n_vocab);
    }
    return KILN_OK;
}

kiln_status kiln_loader_open(const char *dir, const char *split, uint64_t fingerprint, int64_t n_vocab, kiln_loader **out) {
    *out = NULL;
    if (!dir || !split || n_vocab <= 0) return kiln_fail(KILN_ERR_INVALID, "loader: no folder or split, or vocab size %lld", (long long)n_vocab);
    kiln_loader *l = calloc(1, sizeof *l);
    if (!l) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    kiln_status s = KILN_OK;
    for (int i = 0;; i++) {
        char path[4096];
        int k = snprintf(path, sizeof path, "%s/%s_%03d.bin", dir, split, i);
        if (k < 0 || (size_t)k >= sizeof path) {
            s = kiln_fail(KILN_ERR_INVALID, "%s: folder path too long", dir);
            break;
        }
        if (access(path, F_OK) != 0) break;
        shard_map *ns = realloc(l->shards, (size_t)(l->n_shards + 1) * sizeof *ns);
        if (!ns) {
            s = kiln_fail(KILN_ERR_NOMEM, "out of memory");
            break;
        }
        l->shards = ns;
        shard_map *sm = &l->shards[l->n_shards++];
        *sm = (shard_map){.path = strdup(path), .start = l->n_tokens};
        if (!sm->path) {
            s = kiln_fail(KILN_ERR_NOMEM, "out of memory");
            break;
        }
        if ((s = shard_open(path, fingerprint, n_vocab, sm))) break;
        l->n_tokens += sm->n;
    }
    if (!s && l->n_shards == 0) s = kiln_fail(KILN_ERR_NOT_FOUND, "%s: no %s shards (%s/%s_000.bin is missing)", dir, split, dir, split);
    if (!s && l->n_tokens == 0) s = kiln_fail(KILN_ERR_FORMAT, "%s: the %s shards hold no tokens", dir, split);
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
