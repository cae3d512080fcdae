/* gguf_write.c: the GGUF v3 writer. Metadata and tensor infos are serialized into one header buffer;
 * tensor data follows, each tensor padded to the alignment. The output goes to PATH.tmp.<pid>, is
 * fsync'd and renamed over PATH (and the directory fsync'd), so a write killed at any point leaves
 * the old PATH intact. Checkpoints, conversion and quantization all write through here.
 * tests/test_gguf.c round-trips every value type and tensor byte through kiln_gguf_open. */
#include "status.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    uint8_t *p;
    size_t len, cap;
    bool oom;
} buf;

static void buf_put(buf *b, const void *src, size_t n) {
    if (b->oom) return;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n) cap *= 2;
        uint8_t *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, src, n);
    b->len += n;
}

static void buf_le(buf *b, uint64_t v, int n) {
    uint8_t tmp[8];
    for (int i = 0; i < n; i++) tmp[i] = (uint8_t)(v >> (8 * i));
    buf_put(b, tmp, (size_t)n);
}

static void buf_str(buf *b, const char *s, uint64_t n) {
    buf_le(b, n, 8);
    buf_put(b, s, (size_t)n);
}

typedef struct {
    char *key;
    buf value; /* serialized: u32 type + value */
} wkv;

typedef struct {
    char *name;
    kiln_type type;
    int n_dims;
    int64_t ne[4];
    size_t nbytes;
    uint64_t offset; /* relative to the data section */
    const void *data;
} wtensor;

struct kiln_gguf_writer {
    wkv *kv;
    int64_t n_kv, cap_kv;
    wtensor *t;
    int64_t n_t, cap_t;
    /* streaming state */
    int fd;
    char *path, *tmp_path;
    int64_t next_tensor;
    uint64_t alignment;
    uint64_t written; /* bytes of the data section written so far */
    size_t part;      /* bytes of tensor next_tensor written so far by write_part */
};

kiln_status kiln_gguf_writer_new(kiln_gguf_writer **out) {
    *out = calloc(1, sizeof **out);
    if (!*out) return kiln_fail(KILN_ERR_NOMEM, "out of memory for a GGUF writer");
    (*out)->fd = -1;
    return KILN_OK;
}

void kiln_gguf_writer_free(kiln_gguf_writer *w) {
    if (!w) return;
    if (w->fd >= 0) {
        close(w->fd);
        unlink(w->tmp_path);
    }
    for (int64_t i = 0; i < w->n_kv; i++) {
        free(w->kv[i].key);
        free(w->kv[i].value.p);
    }
    for (int64_t i = 0; i < w->n_t; i++) free(w->t[i].name);
    free(w->kv);
    free(w->t);
    free(w->path);
    free(w->tmp_path);
    free(w);
}

/* ---------------------------------------------------------------- metadata */

static kiln_status put_value(buf *b, const kiln_gguf_value *v, bool with_type, int depth);

static kiln_status put_array(buf *b, const kiln_gguf_value *v, int depth) {
    if (depth > 8) return kiln_fail(KILN_ERR_INVALID, "metadata arrays nested deeper than 8");
    if ((unsigned)v->arr.type >= KILN_GGUF_VTYPE_COUNT)
        return kiln_fail(KILN_ERR_INVALID, "unknown array element type %d", (int)v->arr.type);
    buf_le(b, (uint64_t)v->arr.type, 4);
    buf_le(b, v->arr.n, 8);
    size_t es = kiln_gguf_vtype_size(v->arr.type);
    if (es) {
        uint64_t n;
        if (!kiln_mul_ok(v->arr.n, es, &n) || n > SIZE_MAX) return kiln_fail(KILN_ERR_NOMEM, "metadata array too large");
        if (n) buf_put(b, v->arr.data, (size_t)n);
        return KILN_OK;
    }
    for (uint64_t i = 0; i < v->arr.n; i++) {
        kiln_status s = put_value(b, &v->arr.items[i], false, depth + 1);
        if (s) return s;
    }
    return KILN_OK;
}

static kiln_status put_value(buf *b, const kiln_gguf_value *v, bool with_type, int depth) {
    if ((unsigned)v->type >= KILN_GGUF_VTYPE_COUNT) return kiln_fail(KILN_ERR_INVALID, "unknown value type %d", (int)v->type);
    if (with_type) buf_le(b, (uint64_t)v->type, 4);
    switch (v->type) {
    case KILN_GGUF_STRING: buf_str(b, v->str.ptr, v->str.len); break;
    case KILN_GGUF_ARRAY: return put_array(b, v, depth);
    case KILN_GGUF_FLOAT32: {
        float f = (float)v->f64;
        uint32_t u;
        memcpy(&u, &f, 4);
        buf_le(b, u, 4);
        break;
    }
    case KILN_GGUF_FLOAT64: {
        uint64_t u;
        memcpy(&u, &v->f64, 8);
        buf_le(b, u, 8);
        break;
    }
    default: buf_le(b, v->u64, (int)kiln_gguf_vtype_size(v->type)); break; /* two's complement: i64 aliases u64 */
    }
    return KILN_OK;
}

kiln_status kiln_gguf_writer_set(kiln_gguf_writer *w, const char *key, const kiln_gguf_value *v) {
    if (!key || !*key) return kiln_fail(KILN_ERR_INVALID, "metadata key is empty");
    buf b = {0};
    kiln_status s = put_value(&b, v, true, 0);
    if (s == KILN_OK && b.oom) s = kiln_fail(KILN_ERR_NOMEM, "out of memory serializing key '%s'", key);
    if (s) {
        free(b.p);
        return s;
    }
    for (int64_t i = 0; i < w->n_kv; i++)
        if (strcmp(w->kv[i].key, key) == 0) {
            free(w->kv[i].value.p);
            w->kv[i].value = b;
            return KILN_OK;
        }
    if (w->n_kv == w->cap_kv) {
        int64_t cap = w->cap_kv ? w->cap_kv * 2 : 32;
        wkv *nk = realloc(w->kv, (size_t)cap * sizeof *nk);
        if (!nk) {
            free(b.p);
            return kiln_fail(KILN_ERR_NOMEM, "out of memory adding key '%s'", key);
        }
        w->kv = nk;
        w->cap_kv = cap;
    }
    char *k = strdup(key);
    if (!k) {
        free(b.p);
        return kiln_fail(KILN_ERR_NOMEM, "out of memory adding key '%s'", key);
    }
    w->kv[w->n_kv++] = (wkv){k, b};
    return KILN_OK;
}

kiln_status kiln_gguf_writer_set_u32(kiln_gguf_writer *w, const char *key, uint32_t v) {
    return kiln_gguf_writer_set(w, key, &(kiln_gguf_value){.type = KILN_GGUF_UINT32, .u64 = v});
}
kiln_status kiln_gguf_writer_set_i32(kiln_gguf_writer *w, const char *key, int32_t v) {
    return kiln_gguf_writer_set(w, key, &(kiln_gguf_value){.type = KILN_GGUF_INT32, .i64 = v});
}
kiln_status kiln_gguf_writer_set_u64(kiln_gguf_writer *w, const char *key, uint64_t v) {
    return kiln_gguf_writer_set(w, key, &(kiln_gguf_value){.type = KILN_GGUF_UINT64, .u64 = v});
}
kiln_status kiln_gguf_writer_set_f32(kiln_gguf_writer *w, const char *key, float v) {
    return kiln_gguf_writer_set(w, key, &(kiln_gguf_value){.type = KILN_GGUF_FLOAT32, .f64 = v});
}
kiln_status kiln_gguf_writer_set_bool(kiln_gguf_writer *w, const char *key, bool v) {
    return kiln_gguf_writer_set(w, key, &(kiln_gguf_value){.type = KILN_GGUF_BOOL, .u64 = v});
}
kiln_status kiln_gguf_writer_set_str(kiln_gguf_writer *w, const char *key, const char *s) {
    return kiln_gguf_writer_set(w, key, &(kiln_gguf_value){.type = KILN_GGUF_STRING, .str = {s, strlen(s)}});
}
kiln_status kiln_gguf_writer_set_arr(kiln_gguf_writer *w, const char *key, kiln_gguf_vtype elem, const void *data, uint64_t n) {
    if (!kiln_gguf_vtype_size(elem))
        return kiln_fail(KILN_ERR_INVALID, "key '%s': %s is not a fixed-size array element type", key, kiln_gguf_vtype_name(elem));
    kiln_gguf_value v = {.type = KILN_GGUF_ARRAY, .arr = {.type = elem, .n = n, .data = data}};
    return kiln_gguf_writer_set(w, key, &v);
}

kiln_status kiln_gguf_writer_set_arr_str(kiln_gguf_writer *w, const char *key, const char *const *strs, uint64_t n) {
    kiln_gguf_value *items = calloc(n ? (size_t)n : 1, sizeof *items);
    if (!items) return kiln_fail(KILN_ERR_NOMEM, "out of memory for key '%s'", key);
    for (uint64_t i = 0; i < n; i++) items[i] = (kiln_gguf_value){.type = KILN_GGUF_STRING, .str = {strs[i], strlen(strs[i])}};
    kiln_gguf_value v = {.type = KILN_GGUF_ARRAY, .arr = {.type = KILN_GGUF_STRING, .n = n, .items = items}};
    kiln_status s = kiln_gguf_writer_set(w, key, &v);
    free(items);
    return s;
}

kiln_status kiln_gguf_writer_copy_kv(kiln_gguf_writer *w, const kiln_gguf *g, bool (*skip)(const char *key)) {
    for (int64_t i = 0; i < kiln_gguf_n_kv(g); i++) {
        const kiln_gguf_kv *kv = kiln_gguf_kv_at(g, i);
        if (skip && skip(kv->key)) continue;
        kiln_status s = kiln_gguf_writer_set(w, kv->key, &kv->value);
        if (s) return s;
    }
    return KILN_OK;
}

kiln_status kiln_gguf_writer_set_alignment(kiln_gguf_writer *w, size_t alignment) {
    if (alignment == 0 || (alignment & (alignment - 1)) || alignment > UINT32_MAX)
        return kiln_fail(KILN_ERR_INVALID, "alignment %zu is not a power of two", alignment);
    return kiln_gguf_writer_set_u32(w, "general.alignment", (uint32_t)alignment);
}

/* ---------------------------------------------------------------- tensors */

kiln_status kiln_gguf_writer_add_tensor(kiln_gguf_writer *w, const char *name, kiln_type type, int n_dims, const int64_t *ne,
                                        const void *data) {
    if (w->fd >= 0) return kiln_fail(KILN_ERR_INVALID, "tensor '%s' added after the header was written", name);
    if (!name || !*name) return kiln_fail(KILN_ERR_INVALID, "tensor name is empty");
    if (n_dims < 1 || n_dims > 4) return kiln_fail(KILN_ERR_INVALID, "tensor '%s': n_dims %d not in 1..4", name, n_dims);
    if (!kiln_type_known((uint32_t)type)) return kiln_fail(KILN_ERR_INVALID, "tensor '%s': unknown type %d", name, (int)type);
    for (int64_t i = 0; i < w->n_t; i++)
        if (strcmp(w->t[i].name, name) == 0) return kiln_fail(KILN_ERR_INVALID, "tensor '%s' added twice", name);
    wtensor t = {.type = type, .n_dims = n_dims, .ne = {1, 1, 1, 1}, .data = data};
    uint64_t rows = 1;
    for (int d = 0; d < n_dims; d++) {
        if (ne[d] <= 0) return kiln_fail(KILN_ERR_INVALID, "tensor '%s': dimension %d is %lld", name, d, (long long)ne[d]);
        t.ne[d] = ne[d];
        if (d > 0 && !kiln_mul_ok(rows, (uint64_t)ne[d], &rows)) return kiln_fail(KILN_ERR_NOMEM, "tensor '%s' too large", name);
    }
    size_t row = kiln_type_row_bytes(type, ne[0]);
    if (!row) return kiln_fail(KILN_ERR_INVALID, "tensor '%s': %s", name, kiln_last_error());
    uint64_t nbytes;
    if (!kiln_mul_ok(rows, row, &nbytes) || nbytes > SIZE_MAX) return kiln_fail(KILN_ERR_NOMEM, "tensor '%s' too large", name);
    t.nbytes = (size_t)nbytes;
    if (w->n_t == w->cap_t) {
        int64_t cap = w->cap_t ? w->cap_t * 2 : 64;
        wtensor *nt = realloc(w->t, (size_t)cap * sizeof *nt);
        if (!nt) return kiln_fail(KILN_ERR_NOMEM, "out of memory adding tensor '%s'", name);
        w->t = nt;
        w->cap_t = cap;
    }
    if (!(t.name = strdup(name))) return kiln_fail(KILN_ERR_NOMEM, "out of memory adding tensor '%s'", name);
    w->t[w->n_t++] = t;
    return KILN_OK;
}

/* ---------------------------------------------------------------- writing */

static kiln_status write_all(kiln_gguf_writer *w, const void *p, size_t n) {
    const uint8_t *c = p;
    while (n) {
        ssize_t k = write(w->fd, c, n > (1u << 30) ? (1u << 30) : n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return kiln_fail(KILN_ERR_IO, "%s: write failed: %s", w->tmp_path, k < 0 ? strerror(errno) : "short write");
        c += k;
        n -= (size_t)k;
    }
    return KILN_OK;
}

static kiln_status write_padding(kiln_gguf_writer *w, uint64_t len) {
    static const uint8_t zeros[64];
    uint64_t pad = (w->alignment - len % w->alignment) % w->alignment;
    while (pad) {
        size_t k = pad > sizeof zeros ? sizeof zeros : (size_t)pad;
        kiln_status s = write_all(w, zeros, k);
        if (s) return s;
        pad -= k;
    }
    return KILN_OK;
}

/* The alignment is whatever general.alignment says (set_alignment or copy_kv), else GGUF's default 32. */
static uint64_t writer_alignment(const kiln_gguf_writer *w) {
    for (int64_t i = 0; i < w->n_kv; i++) {
        const buf *v = &w->kv[i].value;
        if (strcmp(w->kv[i].key, "general.alignment") == 0 && v->len == 8 && v->p[0] == KILN_GGUF_UINT32) {
            uint32_t a = (uint32_t)v->p[4] | (uint32_t)v->p[5] << 8 | (uint32_t)v->p[6] << 16 | (uint32_t)v->p[7] << 24;
            if (a && !(a & (a - 1))) return a;
        }
    }
    return 32;
}

kiln_status kiln_gguf_writer_begin(kiln_gguf_writer *w, const char *path) {
    if (w->fd >= 0) return kiln_fail(KILN_ERR_INVALID, "%s: writer already begun for %s", path, w->path);
    w->alignment = writer_alignment(w);
    buf h = {0};
    buf_put(&h, "GGUF", 4);
    buf_le(&h, 3, 4);
    buf_le(&h, (uint64_t)w->n_t, 8);
    buf_le(&h, (uint64_t)w->n_kv, 8);
    for (int64_t i = 0; i < w->n_kv; i++) {
        buf_str(&h, w->kv[i].key, strlen(w->kv[i].key));
        buf_put(&h, w->kv[i].value.p, w->kv[i].value.len);
    }
    uint64_t off = 0;
    for (int64_t i = 0; i < w->n_t; i++) {
        wtensor *t = &w->t[i];
        t->offset = off;
        buf_str(&h, t->name, strlen(t->name));
        buf_le(&h, (uint64_t)t->n_dims, 4);
        for (int d = 0; d < t->n_dims; d++) buf_le(&h, (uint64_t)t->ne[d], 8);
        buf_le(&h, (uint64_t)t->type, 4);
        buf_le(&h, t->offset, 8);
        off += (t->nbytes + w->alignment - 1) / w->alignment * w->alignment;
    }
    if (h.oom) {
        free(h.p);
        return kiln_fail(KILN_ERR_NOMEM, "%s: out of memory building the GGUF header", path);
    }
    free(w->path);
    free(w->tmp_path);
    w->path = strdup(path);
    size_t tl = strlen(path) + 32;
    w->tmp_path = malloc(tl);
    if (!w->path || !w->tmp_path) {
        free(h.p);
        return kiln_fail(KILN_ERR_NOMEM, "%s: out of memory", path);
    }
    snprintf(w->tmp_path, tl, "%s.tmp.%ld", path, (long)getpid());
    w->fd = open(w->tmp_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (w->fd < 0) {
        free(h.p);
        return kiln_fail(KILN_ERR_IO, "%s: cannot create: %s", w->tmp_path, strerror(errno));
    }
    kiln_status s = write_all(w, h.p, h.len);
    if (!s) s = write_padding(w, h.len);
    free(h.p);
    w->next_tensor = 0;
    w->written = 0;
    w->part = 0;
    return s;
}

kiln_status kiln_gguf_writer_write_tensor(kiln_gguf_writer *w, int64_t i, const void *data, size_t nbytes) {
    if (w->fd < 0) return kiln_fail(KILN_ERR_INVALID, "write_tensor before begin");
    if (i != w->next_tensor || i >= w->n_t || w->part)
        return kiln_fail(KILN_ERR_INVALID, "%s: tensor %lld written out of order (expected %lld)", w->path, (long long)i,
                         (long long)w->next_tensor);
    if (nbytes != w->t[i].nbytes)
        return kiln_fail(KILN_ERR_INVALID, "%s: tensor '%s' has %zu bytes, expected %zu", w->path, w->t[i].name, nbytes,
                         w->t[i].nbytes);
    kiln_status s = write_all(w, data, nbytes);
    if (!s) s = write_padding(w, nbytes);
    w->next_tensor++;
    return s;
}

kiln_status kiln_gguf_writer_write_part(kiln_gguf_writer *w, int64_t i, const void *data, size_t nbytes) {
    if (w->fd < 0) return kiln_fail(KILN_ERR_INVALID, "write_part before begin");
    if (i != w->next_tensor || i >= w->n_t)
        return kiln_fail(KILN_ERR_INVALID, "%s: tensor %lld written out of order (expected %lld)", w->path, (long long)i,
                         (long long)w->next_tensor);
    if (nbytes > w->t[i].nbytes - w->part)
        return kiln_fail(KILN_ERR_INVALID, "%s: tensor '%s' gets %zu bytes past its %zu", w->path, w->t[i].name,
                         w->part + nbytes - w->t[i].nbytes, w->t[i].nbytes);
    kiln_status s = write_all(w, data, nbytes);
    w->part += nbytes;
    if (!s && w->part == w->t[i].nbytes) {
        s = write_padding(w, w->part);
        w->part = 0;
        w->next_tensor++;
    }
    return s;
}

kiln_status kiln_gguf_writer_finish(kiln_gguf_writer *w) {
    if (w->fd < 0) return kiln_fail(KILN_ERR_INVALID, "finish before begin");
    if (w->next_tensor != w->n_t)
        return kiln_fail(KILN_ERR_INVALID, "%s: only %lld of %lld tensors written", w->path, (long long)w->next_tensor,
                         (long long)w->n_t);
    if (fsync(w->fd) != 0) return kiln_fail(KILN_ERR_IO, "%s: fsync failed: %s", w->tmp_path, strerror(errno));
    int fd = w->fd;
    w->fd = -1;
    if (close(fd) != 0) {
        unlink(w->tmp_path);
        return kiln_fail(KILN_ERR_IO, "%s: close failed: %s", w->tmp_path, strerror(errno));
    }
    if (rename(w->tmp_path, w->path) != 0) {
        kiln_status s = kiln_fail(KILN_ERR_IO, "%s: rename from %s failed: %s", w->path, w->tmp_path, strerror(errno));
        unlink(w->tmp_path);
        return s;
    }
    /* make the rename itself durable */
    char *dir = strdup(w->path);
    if (dir) {
        int dfd = open(dirname(dir), O_RDONLY | O_DIRECTORY);
        if (dfd >= 0) {
            fsync(dfd);
            close(dfd);
        }
        free(dir);
    }
    return KILN_OK;
}

kiln_status kiln_gguf_writer_write_file(kiln_gguf_writer *w, const char *path) {
    for (int64_t i = 0; i < w->n_t; i++)
        if (!w->t[i].data) return kiln_fail(KILN_ERR_INVALID, "%s: tensor '%s' has no data", path, w->t[i].name);
    kiln_status s = kiln_gguf_writer_begin(w, path);
    for (int64_t i = 0; !s && i < w->n_t; i++) s = kiln_gguf_writer_write_tensor(w, i, w->t[i].data, w->t[i].nbytes);
    if (!s) s = kiln_gguf_writer_finish(w);
    if (s && w->fd >= 0) {
        close(w->fd);
        w->fd = -1;
        unlink(w->tmp_path);
    }
    return s;
}

/* The bytes begin and the tensor writes would put on disk, counted as begin lays them out: the header (magic,
 * version, counts, each key and value, each tensor's info) padded to the alignment, then each tensor padded. */
kiln_status kiln_gguf_writer_file_size(const kiln_gguf_writer *w, uint64_t *bytes) {
    uint64_t a = writer_alignment(w), n = 4 + 4 + 8 + 8;
    for (int64_t i = 0; i < w->n_kv; i++) n += 8 + strlen(w->kv[i].key) + w->kv[i].value.len;
    for (int64_t i = 0; i < w->n_t; i++) n += 8 + strlen(w->t[i].name) + 4 + 8 * (uint64_t)w->t[i].n_dims + 4 + 8;
    n = (n + a - 1) / a * a;
    for (int64_t i = 0; i < w->n_t; i++) {
        uint64_t t = (w->t[i].nbytes + a - 1) / a * a;
        if (n > UINT64_MAX - t) return kiln_fail(KILN_ERR_NOMEM, "GGUF file size overflows");
        n += t;
    }
    *bytes = n;
    return KILN_OK;
}
