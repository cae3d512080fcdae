/* context_seq.c: a sequence's cache beyond its steps: keep its first n positions, copy it to another sequence,
 * save it to a file and restore it (the slot files of kiln serve). tests/test_context.c covers each, the files'
 * checks included (another model, cache type or context, a truncated or changed file). */
#include "infer/context_impl.h"
#include "file.h"
#include "status.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---------------------------------------------------------------- keep */

/* How much of sequence s's first n positions its cache still holds: the rows of positions n.. are only ever read
 * after they are written again, except on a sliding layer's ring, where a query at n reads positions n - window + 1
 * .. n - 1, which positions past n may have overwritten (row p % rows). Those are lost once pos > n + rows - window
 * + 1; then nothing is kept. */
static int64_t keepable(const kiln_context *c, const seq_state *s, int64_t n) {
    if (n < 0) n = 0;
    if (n >= s->pos) return s->pos;
    for (int64_t l = 0; l < c->m->cfg.n_layer && n > 0; l++) {
        const int64_t w = c->m->layers[l].window, rows = c->rows[l], oldest = n - w + 1 > 0 ? n - w + 1 : 0;
        if (w && rows < c->n_ctx && oldest + rows < s->pos) n = 0;
    }
    return n;
}

int64_t kiln_context_seq_keep(kiln_context *c, int32_t seq, int64_t n) {
    if (!seq_ok(c, seq)) return -1;
    return c->seq[seq].pos = keepable(c, &c->seq[seq], n);
}

/* ---------------------------------------------------------------- copy, save, restore */

/* Rows of layer l that hold a sequence's first n positions, counted from row 0: all n, or the whole ring. */
static int64_t held_rows(const kiln_context *c, int64_t l, int64_t n) { return n < c->rows[l] ? n : c->rows[l]; }

/* Host buffer <-> sequence seq's cache rows 0..held_rows(n) of every layer, k then v per layer (download: to host). */
static kiln_status move_rows(kiln_context *c, int32_t seq, int64_t n, uint8_t *host, bool download) {
    size_t row[2];
    kv_rows(c, &row[0], &row[1]);
    for (int64_t l = 0; l < c->m->cfg.n_layer; l++) {
        void *part[2] = {c->seq[seq].k[l], c->seq[seq].v[l]};
        for (int i = 0; i < 2; i++) {
            const size_t bytes = (size_t)held_rows(c, l, n) * row[i];
            TRY(download ? c->be->download(c->ctx, host, part[i], bytes) : c->be->upload(c->ctx, part[i], host, bytes));
            host += bytes;
        }
    }
    return c->be->synchronize(c->ctx);
}

/* Bytes move_rows moves for n positions. */
static size_t rows_bytes(const kiln_context *c, int64_t n) {
    size_t rk, rv, total = 0;
    kv_rows(c, &rk, &rv);
    for (int64_t l = 0; l < c->m->cfg.n_layer; l++) total += (size_t)held_rows(c, l, n) * (rk + rv);
    return total;
}

kiln_status kiln_context_seq_copy(kiln_context *c, int32_t src, int32_t dst, int64_t n) {
    if (!seq_ok(c, src) || !seq_ok(c, dst))
        return kiln_fail(KILN_ERR_RANGE, "%s: copy from sequence %d to %d: sequences are 0..%d", c->who, src, dst, c->n_seq - 1);
    if (n < 0 || n > c->seq[src].pos)
        return kiln_fail(KILN_ERR_RANGE, "%s: copy of %lld positions: sequence %d holds %lld", c->who, (long long)n, src,
                         (long long)c->seq[src].pos);
    if (keepable(c, &c->seq[src], n) != n)
        return kiln_fail(KILN_ERR_RANGE, "%s: sequence %d's sliding-window rings no longer hold the positions before %lld (later "
                         "ones overwrote them): nothing copied", c->who, src, (long long)n);
    if (src == dst) {
        c->seq[src].pos = n;
        return KILN_OK;
    }
    uint8_t *buf = malloc(rows_bytes(c, n) + 1);
    if (!buf) return kiln_fail(KILN_ERR_NOMEM, "%s: out of memory copying %lld positions", c->who, (long long)n);
    kiln_status st = move_rows(c, src, n, buf, true);
    if (!st) st = move_rows(c, dst, n, buf, false);
    free(buf);
    if (st) { /* dst's cache is partly overwritten: it holds nothing now */
        c->seq[dst].pos = 0;
        return st;
    }
    memcpy(c->seq[dst].hist, c->seq[src].hist, (size_t)n * sizeof *c->seq[dst].hist);
    c->seq[dst].pos = n;
    return KILN_OK;
}

/* A sequence file, in host byte order (the magic tells another order apart):
 *   magic "KILNSEQ1" (8) | version u32 | n_layer u32 | fingerprint u64 | n_ctx i64 | type_k u32 | type_v u32 |
 *   n_tokens i64 | per layer: width i64 (NKV*HS), rows i64 | ids (n_tokens) i32 |
 *   per layer: k rows then v rows 0 .. min(n_tokens, rows) - 1, kv_row_bytes of its type and width each |
 *   checksum u64 (body_sum of the ids and the rows), so a file damaged inside its rows is refused too */
#define SEQ_MAGIC "KILNSEQ1"
#define SEQ_VERSION 2u
typedef struct seq_header {
    char magic[8];
    uint32_t version, n_layer;
    uint64_t fingerprint;
    int64_t n_ctx;
    uint32_t type_k, type_v;
    int64_t n_tokens;
} seq_header;

static size_t file_bytes(const kiln_context *c, int64_t n) {
    return sizeof(seq_header) + (size_t)c->m->cfg.n_layer * 2 * sizeof(int64_t) + (size_t)n * sizeof(int32_t) + rows_bytes(c, n) +
           sizeof(uint64_t);
}

/* The checksum of a file's body: FNV-1a over its 8-byte words (then the tail bytes), fast enough for a cache of
 * gigabytes. */
static uint64_t body_sum(const uint8_t *p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull, w;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) memcpy(&w, p + i, 8), h = (h ^ w) * 0x100000001b3ull;
    return fnv(h, p + i, n - i);
}

/* The whole file image of sequence seq, (file_bytes) malloc'd into *out. */
static kiln_status seq_image(const kiln_context *c, int32_t seq, uint8_t **out) {
    const seq_state *s = &c->seq[seq];
    const int64_t L = c->m->cfg.n_layer, KV = c->m->cfg.n_head_kv * c->m->cfg.head_dim;
    uint8_t *img = malloc(file_bytes(c, s->pos));
    if (!img) return kiln_fail(KILN_ERR_NOMEM, "%s: out of memory saving sequence %d", c->who, seq);
    seq_header h = {.version = SEQ_VERSION, .n_layer = (uint32_t)L, .fingerprint = c->fingerprint, .n_ctx = c->n_ctx,
                    .type_k = (uint32_t)c->type_k, .type_v = (uint32_t)c->type_v, .n_tokens = s->pos};
    memcpy(h.magic, SEQ_MAGIC, 8);
    uint8_t *p = img;
    memcpy(p, &h, sizeof h), p += sizeof h;
    for (int64_t l = 0; l < L; l++) {
        const int64_t shape[2] = {KV, c->rows[l]};
        memcpy(p, shape, sizeof shape), p += sizeof shape;
    }
    uint8_t *body = p;
    memcpy(p, s->hist, (size_t)s->pos * sizeof(int32_t)), p += (size_t)s->pos * sizeof(int32_t);
    kiln_status st = move_rows((kiln_context *)c, seq, s->pos, p, true);
    if (st) {
        free(img);
        return st;
    }
    p += rows_bytes(c, s->pos);
    const uint64_t sum = body_sum(body, (size_t)(p - body));
    memcpy(p, &sum, sizeof sum);
    *out = img;
    return KILN_OK;
}

kiln_status kiln_context_seq_save(const kiln_context *c, int32_t seq, const char *path) {
    if (!seq_ok(c, seq)) return kiln_fail(KILN_ERR_RANGE, "%s: save of sequence %d: sequences are 0..%d", c->who, seq, c->n_seq - 1);
    uint8_t *img = NULL;
    TRY(seq_image(c, seq, &img));
    const size_t bytes = file_bytes(c, c->seq[seq].pos), plen = strlen(path);
    char *tmp = malloc(plen + 5);
    if (!tmp) {
        free(img);
        return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    }
    memcpy(tmp, path, plen), memcpy(tmp + plen, ".tmp", 5);
    kiln_status st = KILN_OK;
    const int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) st = kiln_fail(KILN_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    for (size_t done = 0; !st && done < bytes;) {
        const ssize_t w = write(fd, img + done, bytes - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) st = kiln_fail(KILN_ERR_IO, "%s: write failed: %s", tmp, w < 0 ? strerror(errno) : "no progress");
        else done += (size_t)w;
    }
    if (!st && fsync(fd) != 0) st = kiln_fail(KILN_ERR_IO, "%s: fsync failed: %s", tmp, strerror(errno));
    if (fd >= 0 && close(fd) != 0 && !st) st = kiln_fail(KILN_ERR_IO, "%s: close failed: %s", tmp, strerror(errno));
    if (!st && rename(tmp, path) != 0) st = kiln_fail(KILN_ERR_IO, "%s: rename from %s failed: %s", path, tmp, strerror(errno));
    if (st && fd >= 0) unlink(tmp);
    free(tmp);
    free(img);
    return st;
}

/* The header of a sequence file checked against the context, field by field. */
static kiln_status check_header(const kiln_context *c, const char *path, const seq_header *h, const int64_t *shape, uint64_t size) {
    const int64_t L = c->m->cfg.n_layer, KV = c->m->cfg.n_head_kv * c->m->cfg.head_dim;
    if (memcmp(h->magic, SEQ_MAGIC, 8) != 0) return kiln_fail(KILN_ERR_INVALID, "%s: not a kiln sequence file (bad magic)", path);
    if (h->version != SEQ_VERSION)
        return kiln_fail(KILN_ERR_INVALID, "%s: version %u, kiln reads version %u", path, h->version, SEQ_VERSION);
    if (h->fingerprint != c->fingerprint)
        return kiln_fail(KILN_ERR_INVALID, "%s: model fingerprint %016llx is not this model's %016llx (saved from another model file)", path,
                         (unsigned long long)h->fingerprint, (unsigned long long)c->fingerprint);
    if (h->n_layer != (uint32_t)L) return kiln_fail(KILN_ERR_INVALID, "%s: n_layer %u, the model has %lld", path, h->n_layer, (long long)L);
    if (h->n_ctx != c->n_ctx)
        return kiln_fail(KILN_ERR_INVALID, "%s: n_ctx %lld is not this context's %lld", path, (long long)h->n_ctx, (long long)c->n_ctx);
    if (h->type_k != (uint32_t)c->type_k || h->type_v != (uint32_t)c->type_v) {
        return kiln_fail(KILN_ERR_INVALID, "%s: cache types type_k %s, type_v %s are not this context's %s, %s", path, kv_name(h->type_k),
                         kv_name(h->type_v), kv_name(c->type_k), kv_name(c->type_v));
    }
    if (h->n_tokens < 0 || h->n_tokens > c->n_ctx)
        return kiln_fail(KILN_ERR_INVALID, "%s: n_tokens %lld is outside the context's 0..%lld", path, (long long)h->n_tokens, (long long)c->n_ctx);
    for (int64_t l = 0; l < L; l++)
        if (shape[2 * l] != KV || shape[2 * l + 1] != c->rows[l])
            return kiln_fail(KILN_ERR_INVALID, "%s: layer %lld's cache is (%lld rows, %lld wide), this context's is (%lld, %lld)", path,
                             (long long)l, (long long)shape[2 * l + 1], (long long)shape[2 * l], (long long)c->rows[l], (long long)KV);
    if (size != file_bytes(c, h->n_tokens))
        return kiln_fail(KILN_ERR_INVALID, "%s: %llu bytes, its header says %llu (truncated or extended)", path, (unsigned long long)size,
                         (unsigned long long)file_bytes(c, h->n_tokens));
    return KILN_OK;
}

/* Reads exactly n bytes at the stream's position. */
static kiln_status read_all(FILE *f, const char *path, void *p, size_t n) {
    if (fread(p, 1, n, f) != n) return kiln_fail(KILN_ERR_INVALID, "%s: truncated (read failed)", path);
    return KILN_OK;
}

kiln_status kiln_context_seq_restore(kiln_context *c, int32_t seq, const char *path, int64_t *n_tokens) {
    if (n_tokens) *n_tokens = 0;
    if (!seq_ok(c, seq)) return kiln_fail(KILN_ERR_RANGE, "%s: restore of sequence %d: sequences are 0..%d", c->who, seq, c->n_seq - 1);
    FILE *f;
    TRY(kiln_fopen_regular(path, &f));
    const int64_t L = c->m->cfg.n_layer, V = c->m->cfg.n_vocab;
    struct stat sb;
    seq_header h;
    int64_t *shape = malloc(sizeof *shape * 2 * (size_t)L);
    uint8_t *body = NULL;
    kiln_status st = shape ? KILN_OK : kiln_fail(KILN_ERR_NOMEM, "out of memory");
    if (!st && fstat(fileno(f), &sb) != 0) st = kiln_fail(KILN_ERR_IO, "%s: stat failed: %s", path, strerror(errno));
    if (!st && (uint64_t)sb.st_size < sizeof h + 2 * sizeof(int64_t) * (uint64_t)L)
        st = kiln_fail(KILN_ERR_INVALID, "%s: %llu bytes is shorter than a sequence file's header", path, (unsigned long long)sb.st_size);
    if (!st) st = read_all(f, path, &h, sizeof h);
    if (!st) st = read_all(f, path, shape, sizeof *shape * 2 * (size_t)L);
    if (!st) st = check_header(c, path, &h, shape, (uint64_t)sb.st_size);
    const size_t ids_bytes = st ? 0 : (size_t)h.n_tokens * sizeof(int32_t), body_bytes = st ? 0 : ids_bytes + rows_bytes(c, h.n_tokens);
    if (!st && !(body = malloc(body_bytes + sizeof(uint64_t)))) st = kiln_fail(KILN_ERR_NOMEM, "%s: out of memory for %zu bytes", path, body_bytes);
    if (!st) st = read_all(f, path, body, body_bytes + sizeof(uint64_t));
    fclose(f);
    uint64_t sum = 0;
    if (!st) memcpy(&sum, body + body_bytes, sizeof sum);
    if (!st && sum != body_sum(body, body_bytes))
        st = kiln_fail(KILN_ERR_INVALID, "%s: checksum %016llx does not match its contents' %016llx (the file is damaged)", path,
                       (unsigned long long)sum, (unsigned long long)body_sum(body, body_bytes));
    const int32_t *ids = (const int32_t *)body;
    for (int64_t i = 0; !st && i < h.n_tokens; i++)
        if (ids[i] < 0 || ids[i] >= V)
            st = kiln_fail(KILN_ERR_INVALID, "%s: token %lld's id %d is outside the vocab of %lld tokens", path, (long long)i, ids[i], (long long)V);
    /* everything checked: now the sequence changes */
    if (!st && (st = move_rows(c, seq, h.n_tokens, body + ids_bytes, false)))
        c->seq[seq].pos = 0; /* the backend failed mid-upload: the cache holds nothing whole now */
    if (st) {
        free(shape);
        free(body);
        return st;
    }
    memcpy(c->seq[seq].hist, ids, ids_bytes);
    c->seq[seq].pos = h.n_tokens;
    if (n_tokens) *n_tokens = h.n_tokens;
    free(shape);
    free(body);
    return KILN_OK;
}
