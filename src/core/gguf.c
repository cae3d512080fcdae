/* gguf.c: the GGUF reader. It mmaps the file and hands out zero-copy views of metadata and tensors.
 *
 * The format (v3, little-endian; v2 is the same layout):
 *   "GGUF"  u32 version  u64 n_tensors  u64 n_kv
 *   n_kv x  { string key; u32 value_type; value }
 *   n_tensors x { string name; u32 n_dims; u64 ne[n_dims]; u32 type; u64 offset }
 *   padding to general.alignment (default 32), then the tensor data section; each offset is relative
 *   to it and must be aligned.
 *   string = u64 length + bytes (no NUL); array = u32 element type + u64 count + elements (arrays nest).
 *
 * Every read goes through a cursor that checks the remaining length first, so a malformed file is a
 * KILN_ERR_FORMAT naming the file, the field and its byte offset, never a read outside the mapping.
 * tests/test_gguf.c has one test per rejection class; tests/fuzz/fuzz_gguf.c fuzzes this file. */
#include "status.h"
#include "file.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_ARRAY_DEPTH 8 /* nesting beyond this is rejected, so a crafted file cannot exhaust the stack */

struct kiln_gguf {
    char *path;             /* name used in messages */
    const uint8_t *base;    /* the file image */
    uint64_t size;
    bool mapped;            /* base came from mmap and is unmapped on close */
    uint32_t version;
    uint64_t alignment;
    uint64_t data_offset;
    int64_t n_kv;
    kiln_gguf_kv *kv;       /* (n_kv) */
    int64_t n_tensors;
    kiln_tensor_view *tensors; /* (n_tensors) */
    kiln_gguf_value **items_blocks; /* every items array allocated for strings / nested arrays */
    int64_t n_items_blocks, cap_items_blocks;
    uint32_t *tensor_hash; /* open-addressing index into tensors, 0 = empty, else i+1 */
    uint64_t tensor_hash_cap;
};

/* ---------------------------------------------------------------- bounded cursor */

typedef struct {
    const kiln_gguf *g;
    uint64_t pos;
} cursor;

static kiln_status truncated(const cursor *c, const char *what, uint64_t need) {
    return kiln_fail(KILN_ERR_FORMAT, "%s: truncated at byte %llu: %s needs %llu bytes, %llu remain", c->g->path,
                     (unsigned long long)c->pos, what, (unsigned long long)need,
                     (unsigned long long)(c->g->size - c->pos));
}

static kiln_status take(cursor *c, uint64_t n, const char *what, const uint8_t **out) {
    if (n > c->g->size - c->pos) return truncated(c, what, n);
    *out = c->g->base + c->pos;
    c->pos += n;
    return KILN_OK;
}

static uint64_t le_load(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static kiln_status read_u32(cursor *c, const char *what, uint32_t *out) {
    const uint8_t *p = NULL;
    kiln_status s = take(c, 4, what, &p);
    if (s == KILN_OK) *out = (uint32_t)le_load(p, 4);
    return s;
}

static kiln_status read_u64(cursor *c, const char *what, uint64_t *out) {
    const uint8_t *p = NULL;
    kiln_status s = take(c, 8, what, &p);
    if (s == KILN_OK) *out = le_load(p, 8);
    return s;
}

static kiln_status read_str(cursor *c, const char *what, kiln_str *out) {
    uint64_t start = c->pos, len;
    kiln_status s = read_u64(c, what, &len);
    if (s) return s;
    if (len > c->g->size - c->pos)
        return kiln_fail(KILN_ERR_FORMAT, "%s: %s at byte %llu: string length %llu runs past the end of the file (%llu bytes remain)",
                         c->g->path, what, (unsigned long long)start, (unsigned long long)len,
                         (unsigned long long)(c->g->size - c->pos));
    out->ptr = (const char *)c->g->base + c->pos;
    out->len = len;
    c->pos += len;
    return KILN_OK;
}

/* ---------------------------------------------------------------- metadata values */

size_t kiln_gguf_vtype_size(kiln_gguf_vtype t) {
    static const uint8_t sizes[KILN_GGUF_VTYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return (unsigned)t < KILN_GGUF_VTYPE_COUNT ? sizes[t] : 0;
}

const char *kiln_gguf_vtype_name(kiln_gguf_vtype t) {
    static const char *names[KILN_GGUF_VTYPE_COUNT] = {"u8",   "i8",  "u16",    "i16", "u32", "i32", "f32",
                                                       "bool", "str", "array",  "u64", "i64", "f64"};
    return (unsigned)t < KILN_GGUF_VTYPE_COUNT ? names[t] : "?";
}

static bool vtype_is_int(kiln_gguf_vtype t) {
    return t <= KILN_GGUF_INT32 || t == KILN_GGUF_UINT64 || t == KILN_GGUF_INT64;
}
static bool vtype_is_signed(kiln_gguf_vtype t) {
    return t == KILN_GGUF_INT8 || t == KILN_GGUF_INT16 || t == KILN_GGUF_INT32 || t == KILN_GGUF_INT64;
}

/* Decodes one packed fixed-size scalar. */
static void decode_scalar(kiln_gguf_vtype t, const uint8_t *p, kiln_gguf_value *v) {
    size_t n = kiln_gguf_vtype_size(t);
    uint64_t raw = le_load(p, (int)n);
    v->type = t;
    switch (t) {
    case KILN_GGUF_INT8: v->i64 = (int8_t)raw; break;
    case KILN_GGUF_INT16: v->i64 = (int16_t)raw; break;
    case KILN_GGUF_INT32: v->i64 = (int32_t)raw; break;
    case KILN_GGUF_INT64: v->i64 = (int64_t)raw; break;
    case KILN_GGUF_FLOAT32: {
        uint32_t u = (uint32_t)raw;
        float f;
        memcpy(&f, &u, 4);
        v->f64 = f;
        break;
    }
    case KILN_GGUF_FLOAT64: memcpy(&v->f64, &raw, 8); break;
    default: v->u64 = raw; break; /* unsigned and bool */
    }
}

static kiln_status track_items(kiln_gguf *g, kiln_gguf_value *items) {
    if (g->n_items_blocks == g->cap_items_blocks) {
        int64_t cap = g->cap_items_blocks ? g->cap_items_blocks * 2 : 16;
        kiln_gguf_value **nb = realloc(g->items_blocks, (size_t)cap * sizeof *nb);
        if (!nb) return kiln_fail(KILN_ERR_NOMEM, "%s: out of memory for metadata arrays", g->path);
        g->items_blocks = nb;
        g->cap_items_blocks = cap;
    }
    g->items_blocks[g->n_items_blocks++] = items;
    return KILN_OK;
}

static kiln_status read_value(kiln_gguf *g, cursor *c, kiln_gguf_vtype t, const char *key, int depth, kiln_gguf_value *v);

static kiln_status read_array(kiln_gguf *g, cursor *c, const char *key, int depth, kiln_gguf_value *v) {
    uint64_t at = c->pos;
    uint32_t et;
    uint64_t n;
    kiln_status s;
    if ((s = read_u32(c, "array element type", &et)) || (s = read_u64(c, "array length", &n))) return s;
    if (et >= KILN_GGUF_VTYPE_COUNT)
        return kiln_fail(KILN_ERR_FORMAT, "%s: key '%s' at byte %llu: unknown array element type %u", g->path, key,
                         (unsigned long long)at, et);
    if (et == KILN_GGUF_ARRAY && depth >= GGUF_MAX_ARRAY_DEPTH)
        return kiln_fail(KILN_ERR_FORMAT, "%s: key '%s' at byte %llu: arrays nested deeper than %d", g->path, key,
                         (unsigned long long)at, GGUF_MAX_ARRAY_DEPTH);
    v->type = KILN_GGUF_ARRAY;
    v->arr.type = (kiln_gguf_vtype)et;
    v->arr.n = n;
    v->arr.data = g->base + c->pos;
    v->arr.items = NULL;
    size_t es = kiln_gguf_vtype_size((kiln_gguf_vtype)et);
    /* Every element takes at least es bytes (strings 8, nested arrays 12): a count the rest of the file
     * cannot hold is rejected before anything is allocated for it. */
    uint64_t min_elem = es ? es : (et == KILN_GGUF_STRING ? 8 : 12);
    uint64_t remain = g->size - c->pos;
    if (n > remain / min_elem)
        return kiln_fail(KILN_ERR_FORMAT, "%s: key '%s' at byte %llu: array of %llu %s elements runs past the end of the file (%llu bytes remain)",
                         g->path, key, (unsigned long long)at, (unsigned long long)n,
                         kiln_gguf_vtype_name((kiln_gguf_vtype)et), (unsigned long long)remain);
    if (es) {
        if (et == KILN_GGUF_BOOL)
            for (uint64_t i = 0; i < n; i++)
                if (c->g->base[c->pos + i] > 1)
                    return kiln_fail(KILN_ERR_FORMAT, "%s: key '%s' at byte %llu: bool element %llu is %u, not 0 or 1",
                                     g->path, key, (unsigned long long)(c->pos + i), (unsigned long long)i,
                                     c->g->base[c->pos + i]);
        c->pos += n * es;
        return KILN_OK;
    }
    if (n == 0) return KILN_OK;
    kiln_gguf_value *items = calloc((size_t)n, sizeof *items);
    if (!items || (s = track_items(g, items))) {
        free(items);
        return kiln_fail(KILN_ERR_NOMEM, "%s: key '%s' at byte %llu: out of memory for %llu array elements", g->path,
                         key, (unsigned long long)at, (unsigned long long)n);
    }
    v->arr.items = items;
    for (uint64_t i = 0; i < n; i++)
        if ((s = read_value(g, c, (kiln_gguf_vtype)et, key, depth + 1, &items[i]))) return s;
    return KILN_OK;
}

static kiln_status read_value(kiln_gguf *g, cursor *c, kiln_gguf_vtype t, const char *key, int depth, kiln_gguf_value *v) {
    kiln_status s;
    if (t == KILN_GGUF_STRING) {
        v->type = t;
        return read_str(c, "string value", &v->str);
    }
    if (t == KILN_GGUF_ARRAY) return read_array(g, c, key, depth, v);
    const uint8_t *p = NULL;
    uint64_t at = c->pos;
    if ((s = take(c, kiln_gguf_vtype_size(t), "metadata value", &p))) return s;
    decode_scalar(t, p, v);
    if (t == KILN_GGUF_BOOL && v->u64 > 1)
        return kiln_fail(KILN_ERR_FORMAT, "%s: key '%s' at byte %llu: bool value is %llu, not 0 or 1", g->path, key,
                         (unsigned long long)at, (unsigned long long)v->u64);
    return KILN_OK;
}

/* ---------------------------------------------------------------- name index (duplicate detection, lookup) */

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ULL;
    return h;
}

/* Index of names[i] (stride bytes apart, first field a const char*) in an open-addressing table of
 * cap slots (power of two). Returns the existing index on a duplicate, else -1 after inserting. */
static int64_t index_insert(uint32_t *table, uint64_t cap, const char *const *names, size_t stride, int64_t i) {
    const char *name = *(const char *const *)((const char *)names + (size_t)i * stride);
    uint64_t h = hash_bytes(name, strlen(name)) & (cap - 1);
    for (;; h = (h + 1) & (cap - 1)) {
        if (table[h] == 0) {
            table[h] = (uint32_t)(i + 1);
            return -1;
        }
        const char *other = *(const char *const *)((const char *)names + (size_t)(table[h] - 1) * stride);
        if (strcmp(other, name) == 0) return table[h] - 1;
    }
}

static int64_t index_find(const uint32_t *table, uint64_t cap, const char *const *names, size_t stride, const char *name) {
    if (!cap) return -1;
    uint64_t h = hash_bytes(name, strlen(name)) & (cap - 1);
    for (;; h = (h + 1) & (cap - 1)) {
        if (table[h] == 0) return -1;
        const char *other = *(const char *const *)((const char *)names + (size_t)(table[h] - 1) * stride);
        if (strcmp(other, name) == 0) return table[h] - 1;
    }
}

static uint64_t index_cap(int64_t n) {
    uint64_t cap = 16;
    while (cap < (uint64_t)n * 2) cap <<= 1;
    return cap;
}

/* Copies a name out of the file into a NUL-terminated string; names must not be empty or hold a NUL. */
static kiln_status copy_name(kiln_gguf *g, kiln_str s, uint64_t at, const char *what, char **out) {
    if (s.len == 0) return kiln_fail(KILN_ERR_FORMAT, "%s: %s at byte %llu is empty", g->path, what, (unsigned long long)at);
    if (memchr(s.ptr, 0, (size_t)s.len))
        return kiln_fail(KILN_ERR_FORMAT, "%s: %s at byte %llu contains a NUL byte", g->path, what, (unsigned long long)at);
    char *p = malloc((size_t)s.len + 1);
    if (!p) return kiln_fail(KILN_ERR_NOMEM, "%s: out of memory for %s at byte %llu", g->path, what, (unsigned long long)at);
    memcpy(p, s.ptr, (size_t)s.len);
    p[s.len] = 0;
    *out = p;
    return KILN_OK;
}

/* ---------------------------------------------------------------- parsing */

static kiln_status parse_kv(kiln_gguf *g, cursor *c) {
    kiln_status s;
    uint64_t n_kv = (uint64_t)g->n_kv;
    /* a kv takes at least 8 (key length) + 1 (key) + 4 (type) + 1 (smallest value) bytes */
    if (n_kv > (g->size - c->pos) / 14)
        return kiln_fail(KILN_ERR_FORMAT, "%s: metadata count %llu at byte 16 exceeds what the file can hold (%llu bytes)",
                         g->path, (unsigned long long)n_kv, (unsigned long long)g->size);
    g->kv = calloc(n_kv ? (size_t)n_kv : 1, sizeof *g->kv);
    uint64_t cap = index_cap(g->n_kv);
    uint32_t *index = calloc((size_t)cap, sizeof *index);
    if (!g->kv || !index) {
        free(index);
        return kiln_fail(KILN_ERR_NOMEM, "%s: out of memory for %llu metadata entries", g->path, (unsigned long long)n_kv);
    }
    for (int64_t i = 0; i < g->n_kv; i++) {
        kiln_gguf_kv *kv = &g->kv[i];
        kiln_str key;
        uint32_t t;
        kv->offset = c->pos;
        if ((s = read_str(c, "metadata key", &key)) || (s = copy_name(g, key, kv->offset, "metadata key", (char **)&kv->key)))
            goto out;
        int64_t dup = index_insert(index, cap, (const char *const *)&g->kv[0].key, sizeof *kv, i);
        if (dup >= 0) {
            s = kiln_fail(KILN_ERR_FORMAT, "%s: key '%s' at byte %llu: duplicate key (first at byte %llu)", g->path,
                          kv->key, (unsigned long long)kv->offset, (unsigned long long)g->kv[dup].offset);
            goto out;
        }
        uint64_t type_at = c->pos;
        if ((s = read_u32(c, "metadata value type", &t))) goto out;
        if (t >= KILN_GGUF_VTYPE_COUNT) {
            s = kiln_fail(KILN_ERR_FORMAT, "%s: key '%s' at byte %llu: unknown value type %u", g->path, kv->key,
                          (unsigned long long)type_at, t);
            goto out;
        }
        if ((s = read_value(g, c, (kiln_gguf_vtype)t, kv->key, 0, &kv->value))) goto out;
    }
    s = KILN_OK;
out:
    free(index);
    return s;
}

static kiln_status parse_alignment(kiln_gguf *g) {
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    for (int64_t i = 0; i < g->n_kv; i++) {
        if (strcmp(g->kv[i].key, "general.alignment") != 0) continue;
        const kiln_gguf_value *v = &g->kv[i].value;
        if (v->type != KILN_GGUF_UINT32)
            return kiln_fail(KILN_ERR_FORMAT, "%s: key 'general.alignment' at byte %llu: type %s, expected u32", g->path,
                             (unsigned long long)g->kv[i].offset, kiln_gguf_vtype_name(v->type));
        if (v->u64 == 0 || (v->u64 & (v->u64 - 1)))
            return kiln_fail(KILN_ERR_FORMAT, "%s: key 'general.alignment' at byte %llu: %llu is not a power of two",
                             g->path, (unsigned long long)g->kv[i].offset, (unsigned long long)v->u64);
        g->alignment = v->u64;
    }
    return KILN_OK;
}

static kiln_status parse_tensor_info(kiln_gguf *g, cursor *c, kiln_tensor_view *t, uint64_t at) {
    kiln_status s;
    kiln_str name;
    uint32_t n_dims, type;
    if ((s = read_str(c, "tensor name", &name)) || (s = copy_name(g, name, at, "tensor name", (char **)&t->name)) ||
        (s = read_u32(c, "tensor n_dims", &n_dims)))
        return s;
    if (n_dims > 4)
        return kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s' at byte %llu: n_dims %u > 4", g->path, t->name,
                         (unsigned long long)at, n_dims);
    t->n_dims = (int)n_dims;
    uint64_t n_elem = 1;
    for (int d = 0; d < 4; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        uint64_t ne;
        if ((s = read_u64(c, "tensor dimension", &ne))) return s;
        if (ne == 0)
            return kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s' at byte %llu: dimension %u is zero", g->path, t->name,
                             (unsigned long long)at, d);
        if (ne > INT64_MAX || !kiln_mul_ok(n_elem, ne, &n_elem) || n_elem > INT64_MAX)
            return kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s' at byte %llu: element count overflows at dimension %u (%llu)",
                             g->path, t->name, (unsigned long long)at, d, (unsigned long long)ne);
        t->ne[d] = (int64_t)ne;
    }
    uint64_t type_at = c->pos;
    if ((s = read_u32(c, "tensor type", &type)) || (s = read_u64(c, "tensor offset", &t->offset))) return s;
    if (!kiln_type_known(type))
        return kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s' at byte %llu: unknown tensor type %u", g->path, t->name,
                         (unsigned long long)type_at, type);
    t->type = (kiln_type)type;
    int64_t blck = kiln_type_block_size(t->type);
    if (t->ne[0] % blck != 0)
        return kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s' at byte %llu: row length %lld is not a multiple of the %s block size %lld",
                         g->path, t->name, (unsigned long long)at, (long long)t->ne[0], kiln_type_name(t->type), (long long)blck);
    uint64_t nbytes;
    if (!kiln_mul_ok(n_elem / (uint64_t)blck, kiln_type_block_bytes(t->type), &nbytes) || nbytes > SIZE_MAX)
        return kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s' at byte %llu: byte size overflows", g->path, t->name,
                         (unsigned long long)at);
    t->nbytes = (size_t)nbytes;
    t->nb[0] = kiln_type_block_bytes(t->type);
    t->nb[1] = t->nb[0] * (size_t)(t->ne[0] / blck);
    for (int d = 2; d < 4; d++) t->nb[d] = t->nb[d - 1] * (size_t)t->ne[d - 1];
    return KILN_OK;
}

/* The alignment a type's data is read at in place: the largest power of two, up to 8, dividing its block bytes
 * (f32 and q8_K 4, f16, bf16 and the fp16-scaled blocks 2 or more, f64 8). general.alignment below it would leave
 * typed loads misaligned (undefined behaviour: rmsnorm reading an f32 norm at an odd address). */
static uint64_t type_alignment(kiln_type t) {
    uint64_t b = kiln_type_block_bytes(t), a = 1;
    while (a < 8 && b % (a * 2) == 0) a *= 2;
    return a;
}

static uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

static int cmp_by_offset(const void *a, const void *b) {
    const kiln_tensor_view *x = *(const kiln_tensor_view *const *)a, *y = *(const kiln_tensor_view *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* The tensors, in data order (order, not overlapping), must tile the data section: each starts at the aligned end
 * of the one before, and the section ends within the last one's padding. Bytes that belong to no tensor mean the
 * header does not describe the file; a tensor count one lower than the tensors present lands here, since the
 * data section then starts inside the last tensor info and the last tensor's bytes are left over. */
static kiln_status check_coverage(const kiln_gguf *g, kiln_tensor_view *const *order, const uint64_t *info_at,
                                  uint64_t data_size) {
    uint64_t end = 0;
    for (int64_t i = 0; i < g->n_tensors; i++) {
        const kiln_tensor_view *t = order[i];
        if (t->offset > align_up(end, g->alignment))
            return kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s' at byte %llu: data offset %llu leaves bytes [%llu, %llu) of the data section (file byte %llu) in no tensor",
                             g->path, t->name, (unsigned long long)info_at[t - g->tensors], (unsigned long long)t->offset,
                             (unsigned long long)end, (unsigned long long)t->offset, (unsigned long long)(g->data_offset + end));
        end = t->offset + t->nbytes;
    }
    if (data_size > align_up(end, g->alignment))
        return kiln_fail(KILN_ERR_FORMAT, "%s: %llu bytes at file byte %llu follow the last tensor's data and belong to no tensor (is the tensor count %lld wrong?)",
                         g->path, (unsigned long long)(data_size - end), (unsigned long long)(g->data_offset + end),
                         (long long)g->n_tensors);
    return KILN_OK;
}

static kiln_status parse_tensors(kiln_gguf *g, cursor *c) {
    kiln_status s;
    uint64_t n = (uint64_t)g->n_tensors;
    uint64_t *info_at = NULL;
    kiln_tensor_view **order = NULL;
    /* a tensor info takes at least 8 + 1 + 4 + 4 + 8 bytes */
    if (n > (g->size - c->pos) / 25)
        return kiln_fail(KILN_ERR_FORMAT, "%s: tensor count %llu at byte 8 exceeds what the file can hold (%llu bytes)",
                         g->path, (unsigned long long)n, (unsigned long long)g->size);
    g->tensors = calloc(n ? (size_t)n : 1, sizeof *g->tensors);
    g->tensor_hash_cap = index_cap(g->n_tensors);
    g->tensor_hash = calloc((size_t)g->tensor_hash_cap, sizeof *g->tensor_hash);
    info_at = calloc(n ? (size_t)n : 1, sizeof *info_at);
    order = calloc(n ? (size_t)n : 1, sizeof *order);
    if (!g->tensors || !g->tensor_hash || !info_at || !order) {
        s = kiln_fail(KILN_ERR_NOMEM, "%s: out of memory for %llu tensor infos", g->path, (unsigned long long)n);
        goto out;
    }
    for (int64_t i = 0; i < g->n_tensors; i++) {
        info_at[i] = c->pos;
        if ((s = parse_tensor_info(g, c, &g->tensors[i], info_at[i]))) goto out;
        int64_t dup = index_insert(g->tensor_hash, g->tensor_hash_cap, (const char *const *)&g->tensors[0].name,
                                   sizeof *g->tensors, i);
        if (dup >= 0) {
            s = kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s' at byte %llu: duplicate tensor name (first at byte %llu)",
                          g->path, g->tensors[i].name, (unsigned long long)info_at[i], (unsigned long long)info_at[dup]);
            goto out;
        }
    }
    g->data_offset = align_up(c->pos, g->alignment);
    /* The data section may be absent when no tensor has bytes (vocab-only files end after the infos). */
    uint64_t data_size = g->size > g->data_offset ? g->size - g->data_offset : 0;
    for (int64_t i = 0; i < g->n_tensors; i++) {
        kiln_tensor_view *t = &g->tensors[i];
        if (g->alignment < type_alignment(t->type))
            s = kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s' at byte %llu: general.alignment %llu is below the %llu bytes %s data must be aligned to",
                          g->path, t->name, (unsigned long long)info_at[i], (unsigned long long)g->alignment,
                          (unsigned long long)type_alignment(t->type), kiln_type_name(t->type));
        else if (t->offset % g->alignment)
            s = kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s' at byte %llu: data offset %llu is not a multiple of the alignment %llu",
                          g->path, t->name, (unsigned long long)info_at[i], (unsigned long long)t->offset,
                          (unsigned long long)g->alignment);
        else if (t->offset > data_size || t->nbytes > data_size - t->offset)
            s = kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s' at byte %llu: data [%llu, +%llu) lies outside the file's data section of %llu bytes",
                          g->path, t->name, (unsigned long long)info_at[i], (unsigned long long)t->offset,
                          (unsigned long long)t->nbytes, (unsigned long long)data_size);
        if (s) goto out;
        t->data = g->base + g->data_offset + t->offset;
        order[i] = t;
    }
    qsort(order, (size_t)n, sizeof *order, cmp_by_offset);
    for (uint64_t i = 1; i < n; i++)
        if (order[i - 1]->offset + order[i - 1]->nbytes > order[i]->offset) {
            s = kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s' at byte %llu: data [%llu, +%llu) overlaps tensor '%s' at data offset %llu",
                          g->path, order[i]->name, (unsigned long long)info_at[order[i] - g->tensors],
                          (unsigned long long)order[i]->offset, (unsigned long long)order[i]->nbytes,
                          order[i - 1]->name, (unsigned long long)order[i - 1]->offset);
            goto out;
        }
    s = check_coverage(g, order, info_at, data_size);
out:
    free(info_at);
    free(order);
    return s;
}

static kiln_status parse(kiln_gguf *g) {
    cursor c = {g, 0};
    const uint8_t *magic = NULL;
    uint64_t n_tensors, n_kv;
    kiln_status s;
    if ((s = take(&c, 4, "magic", &magic))) return s;
    if (memcmp(magic, "GGUF", 4) != 0)
        return kiln_fail(KILN_ERR_FORMAT, "%s: bad magic at byte 0: expected 'GGUF', found %02x %02x %02x %02x", g->path,
                         magic[0], magic[1], magic[2], magic[3]);
    if ((s = read_u32(&c, "version", &g->version))) return s;
    if (g->version != 2 && g->version != 3)
        return kiln_fail(KILN_ERR_FORMAT, "%s: unsupported GGUF version %u at byte 4 (kiln reads 2 and 3)", g->path, g->version);
    if ((s = read_u64(&c, "tensor count", &n_tensors)) || (s = read_u64(&c, "metadata count", &n_kv))) return s;
    if (n_tensors > INT64_MAX / 2 || n_kv > INT64_MAX / 2)
        return kiln_fail(KILN_ERR_FORMAT, "%s: count at byte 8 overflows (%llu tensors, %llu keys)", g->path,
                         (unsigned long long)n_tensors, (unsigned long long)n_kv);
    g->n_tensors = (int64_t)n_tensors;
    g->n_kv = (int64_t)n_kv;
    if ((s = parse_kv(g, &c)) || (s = parse_alignment(g)) || (s = parse_tensors(g, &c))) return s;
    return KILN_OK;
}

/* ---------------------------------------------------------------- open / close */

static kiln_status open_image(const void *data, uint64_t size, const char *name, bool mapped, kiln_gguf **out) {
    *out = NULL;
    kiln_gguf *g = calloc(1, sizeof *g);
    if (!g || !(g->path = strdup(name))) {
        free(g);
        return kiln_fail(KILN_ERR_NOMEM, "%s: out of memory", name);
    }
    g->base = data;
    g->size = size;
    g->mapped = mapped;
    kiln_status s = parse(g);
    if (s) {
        kiln_gguf_close(g);
        return s;
    }
    *out = g;
    return KILN_OK;
}

kiln_status kiln_gguf_open_memory(const void *data, size_t size, const char *name, kiln_gguf **out) {
    return open_image(data, size, name ? name : "<memory>", false, out);
}

kiln_status kiln_gguf_open(const char *path, kiln_gguf **out) {
    *out = NULL;
    int fd;
    kiln_status s = kiln_open_regular(path, &fd);
    if (s) return s;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        s = kiln_fail(KILN_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
        close(fd);
        return s;
    }
    void *map = NULL;
    if (st.st_size > 0) {
        map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            close(fd);
            return kiln_fail(KILN_ERR_IO, "%s: mmap of %lld bytes failed: %s", path, (long long)st.st_size, strerror(errno));
        }
    }
    close(fd);
    s = open_image(map ? map : "", (uint64_t)st.st_size, path, map != NULL, out);
    if (s && map) munmap(map, (size_t)st.st_size);
    return s;
}

void kiln_gguf_close(kiln_gguf *g) {
    if (!g) return;
    for (int64_t i = 0; g->kv && i < g->n_kv; i++) free((char *)g->kv[i].key);
    for (int64_t i = 0; g->tensors && i < g->n_tensors; i++) free((char *)g->tensors[i].name);
    for (int64_t i = 0; i < g->n_items_blocks; i++) free(g->items_blocks[i]);
    free(g->items_blocks);
    free(g->kv);
    free(g->tensors);
    free(g->tensor_hash);
    if (g->mapped) munmap((void *)g->base, (size_t)g->size);
    free(g->path);
    free(g);
}

/* ---------------------------------------------------------------- accessors */

uint32_t kiln_gguf_version(const kiln_gguf *g) { return g->version; }
size_t kiln_gguf_alignment(const kiln_gguf *g) { return (size_t)g->alignment; }
uint64_t kiln_gguf_file_size(const kiln_gguf *g) { return g->size; }
uint64_t kiln_gguf_data_offset(const kiln_gguf *g) { return g->data_offset; }
const char *kiln_gguf_path(const kiln_gguf *g) { return g->path; }
int64_t kiln_gguf_n_kv(const kiln_gguf *g) { return g->n_kv; }
int64_t kiln_gguf_n_tensors(const kiln_gguf *g) { return g->n_tensors; }

const kiln_gguf_kv *kiln_gguf_kv_at(const kiln_gguf *g, int64_t i) {
    return i >= 0 && i < g->n_kv ? &g->kv[i] : NULL;
}

const kiln_tensor_view *kiln_gguf_tensor_at(const kiln_gguf *g, int64_t i) {
    return i >= 0 && i < g->n_tensors ? &g->tensors[i] : NULL;
}

const kiln_gguf_value *kiln_gguf_find(const kiln_gguf *g, const char *key) {
    /* metadata is small (tens of keys): a scan beats keeping a second index */
    for (int64_t i = 0; i < g->n_kv; i++)
        if (strcmp(g->kv[i].key, key) == 0) return &g->kv[i].value;
    return NULL;
}

const kiln_tensor_view *kiln_gguf_find_tensor(const kiln_gguf *g, const char *name) {
    int64_t i = index_find(g->tensor_hash, g->tensor_hash_cap, (const char *const *)&g->tensors[0].name,
                           sizeof *g->tensors, name);
    return i >= 0 ? &g->tensors[i] : NULL;
}

/* ---------------------------------------------------------------- typed getters */

static kiln_status find_typed(const kiln_gguf *g, const char *key, const kiln_gguf_value **out) {
    *out = kiln_gguf_find(g, key);
    if (!*out) return kiln_fail(KILN_ERR_NOT_FOUND, "%s: missing metadata key '%s'", g->path, key);
    return KILN_OK;
}

static kiln_status wrong_type(const kiln_gguf *g, const char *key, const kiln_gguf_value *v, const char *want) {
    return kiln_fail(KILN_ERR_FORMAT, "%s: key '%s' has type %s, expected %s", g->path, key, kiln_gguf_vtype_name(v->type), want);
}

kiln_status kiln_gguf_get_i64(const kiln_gguf *g, const char *key, int64_t *out) {
    const kiln_gguf_value *v;
    kiln_status s = find_typed(g, key, &v);
    if (s) return s;
    if (!vtype_is_int(v->type)) return wrong_type(g, key, v, "an integer");
    if (!vtype_is_signed(v->type) && v->u64 > INT64_MAX)
        return kiln_fail(KILN_ERR_RANGE, "%s: key '%s' value %llu does not fit in int64", g->path, key, (unsigned long long)v->u64);
    *out = vtype_is_signed(v->type) ? v->i64 : (int64_t)v->u64;
    return KILN_OK;
}

kiln_status kiln_gguf_get_u64(const kiln_gguf *g, const char *key, uint64_t *out) {
    const kiln_gguf_value *v;
    kiln_status s = find_typed(g, key, &v);
    if (s) return s;
    if (!vtype_is_int(v->type)) return wrong_type(g, key, v, "an integer");
    if (vtype_is_signed(v->type) && v->i64 < 0)
        return kiln_fail(KILN_ERR_RANGE, "%s: key '%s' value %lld is negative", g->path, key, (long long)v->i64);
    *out = v->u64;
    return KILN_OK;
}

kiln_status kiln_gguf_get_u32(const kiln_gguf *g, const char *key, uint32_t *out) {
    uint64_t v;
    kiln_status s = kiln_gguf_get_u64(g, key, &v);
    if (s) return s;
    if (v > UINT32_MAX)
        return kiln_fail(KILN_ERR_RANGE, "%s: key '%s' value %llu does not fit in uint32", g->path, key, (unsigned long long)v);
    *out = (uint32_t)v;
    return KILN_OK;
}

kiln_status kiln_gguf_get_f32(const kiln_gguf *g, const char *key, float *out) {
    const kiln_gguf_value *v;
    kiln_status s = find_typed(g, key, &v);
    if (s) return s;
    if (v->type != KILN_GGUF_FLOAT32 && v->type != KILN_GGUF_FLOAT64) return wrong_type(g, key, v, "a float");
    *out = (float)v->f64;
    return KILN_OK;
}

kiln_status kiln_gguf_get_bool(const kiln_gguf *g, const char *key, bool *out) {
    const kiln_gguf_value *v;
    kiln_status s = find_typed(g, key, &v);
    if (s) return s;
    if (v->type != KILN_GGUF_BOOL) return wrong_type(g, key, v, "bool");
    *out = v->u64 != 0;
    return KILN_OK;
}

kiln_status kiln_gguf_get_str(const kiln_gguf *g, const char *key, kiln_str *out) {
    const kiln_gguf_value *v;
    kiln_status s = find_typed(g, key, &v);
    if (s) return s;
    if (v->type != KILN_GGUF_STRING) return wrong_type(g, key, v, "string");
    *out = v->str;
    return KILN_OK;
}

kiln_status kiln_gguf_get_arr(const kiln_gguf *g, const char *key, kiln_gguf_vtype elem, const kiln_gguf_value **out) {
    kiln_status s = find_typed(g, key, out);
    if (s) return s;
    if ((*out)->type != KILN_GGUF_ARRAY) return wrong_type(g, key, *out, "array");
    if ((*out)->arr.type != elem)
        return kiln_fail(KILN_ERR_FORMAT, "%s: key '%s' is an array of %s, expected %s", g->path, key,
                         kiln_gguf_vtype_name((*out)->arr.type), kiln_gguf_vtype_name(elem));
    return KILN_OK;
}

static kiln_gguf_value arr_elem(const kiln_gguf_value *arr, uint64_t i) {
    kiln_gguf_value v = {0};
    assert(arr->type == KILN_GGUF_ARRAY && i < arr->arr.n && kiln_gguf_vtype_size(arr->arr.type));
    decode_scalar(arr->arr.type, arr->arr.data + i * kiln_gguf_vtype_size(arr->arr.type), &v);
    return v;
}

uint64_t kiln_gguf_arr_u64(const kiln_gguf_value *arr, uint64_t i) { return arr_elem(arr, i).u64; }
int64_t kiln_gguf_arr_i64(const kiln_gguf_value *arr, uint64_t i) {
    kiln_gguf_value v = arr_elem(arr, i);
    return vtype_is_signed(v.type) ? v.i64 : (int64_t)v.u64;
}
double kiln_gguf_arr_f64(const kiln_gguf_value *arr, uint64_t i) {
    kiln_gguf_value v = arr_elem(arr, i);
    if (v.type == KILN_GGUF_FLOAT32 || v.type == KILN_GGUF_FLOAT64) return v.f64;
    return vtype_is_signed(v.type) ? (double)v.i64 : (double)v.u64;
}
