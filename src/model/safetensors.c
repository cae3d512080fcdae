/* safetensors.c: reads Hugging Face safetensors files by hand. A file is an 8-byte little-endian header length N,
 * N bytes of JSON {"name": {"dtype": "F16", "shape": [rows, cols], "data_offsets": [begin, end]}, ...,
 * "__metadata__": {...}}, then the data, offsets relative to its start. Every offset and size is checked against
 * the file before a byte is read; tests/test_hf_convert.c feeds it truncated and inconsistent headers. */
#include "safetensors.h"
#include "file.h"
#include "status.h"
#include "fp16.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* A header larger than this is not a checkpoint's (a 405B model's is ~100 KB per shard). */
#define ST_MAX_HEADER (64u << 20)

static const struct {
    const char *name;
    kiln_st_dtype dtype;
    int size;
} st_dtypes[] = {{"F32", KILN_ST_F32, 4}, {"F16", KILN_ST_F16, 2}, {"BF16", KILN_ST_BF16, 2}};

static kiln_status add_tensor(kiln_st_set *s, const char *path, const uint8_t *data, uint64_t data_size, const char *name,
                              json_t *info) {
    json_t *dt = json_object_get(info, "dtype"), *shape = json_object_get(info, "shape"), *offs = json_object_get(info, "data_offsets");
    if (!json_is_string(dt) || !json_is_array(shape) || !json_is_array(offs) || json_array_size(offs) != 2)
        return kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s' lacks a dtype string, a shape array or two data_offsets", path, name);
    int size = 0;
    kiln_st_dtype dtype = KILN_ST_F32;
    for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
        if (strcmp(json_string_value(dt), st_dtypes[i].name) == 0) dtype = st_dtypes[i].dtype, size = st_dtypes[i].size;
    if (!size)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: tensor '%s' has dtype %s; kiln convert reads F32, F16 and BF16", path, name,
                         json_string_value(dt));
    size_t nd = json_array_size(shape);
    if (nd < 1 || nd > KILN_ST_MAX_DIMS)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: tensor '%s' has %zu dimensions (1..%d supported)", path, name, nd, KILN_ST_MAX_DIMS);
    kiln_st_tensor t = {.dtype = dtype, .n_dims = (int)nd, .file = s->maps[s->n_maps - 1].path};
    uint64_t numel = 1, begin, end, want;
    for (size_t i = 0; i < nd; i++) {
        json_t *d = json_array_get(shape, i);
        if (!json_is_integer(d) || json_integer_value(d) <= 0 || !kiln_mul_ok(numel, (uint64_t)json_integer_value(d), &numel) ||
            numel > (uint64_t)INT64_MAX)
            return kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s' has a shape entry that is not a positive size", path, name);
        t.shape[i] = json_integer_value(d);
    }
    json_t *b = json_array_get(offs, 0), *e = json_array_get(offs, 1);
    if (!json_is_integer(b) || !json_is_integer(e) || json_integer_value(b) < 0 || json_integer_value(e) < json_integer_value(b))
        return kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s' has data_offsets that are not 0 <= begin <= end", path, name);
    begin = (uint64_t)json_integer_value(b), end = (uint64_t)json_integer_value(e);
    if (end > data_size)
        return kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s' ends at data byte %llu, past the file's %llu data bytes", path, name,
                         (unsigned long long)end, (unsigned long long)data_size);
    if (!kiln_mul_ok(numel, (uint64_t)size, &want) || end - begin != want)
        return kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s' holds %llu bytes, but %s of that shape is %llu", path, name,
                         (unsigned long long)(end - begin), json_string_value(dt), (unsigned long long)want);
    if (kiln_st_find(s, name)) return kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s' appears twice in the checkpoint", path, name);
    t.numel = (int64_t)numel;
    t.data = data + begin;
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 256;
        kiln_st_tensor *nt = realloc(s->t, cap * sizeof *nt);
        if (!nt) return kiln_fail(KILN_ERR_NOMEM, "out of memory for %zu tensors", cap);
        s->t = nt, s->cap = cap;
    }
    if (!(t.name = strdup(name))) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    s->t[s->n++] = t;
    return KILN_OK;
}

/* Maps one file and adds its tensors. */
static kiln_status open_file(kiln_st_set *s, const char *path) {
    struct kiln_st_map *nm = realloc(s->maps, (s->n_maps + 1) * sizeof *nm);
    if (!nm) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    s->maps = nm;
    struct kiln_st_map *m = &s->maps[s->n_maps];
    *m = (struct kiln_st_map){MAP_FAILED, 0, strdup(path)};
    if (!m->path) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    s->n_maps++;
    int fd;
    kiln_status st = kiln_open_regular(path, &fd);
    if (st) return st;
    struct stat sb;
    if (fstat(fd, &sb) != 0) st = kiln_fail(KILN_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    else if (sb.st_size < 8) st = kiln_fail(KILN_ERR_FORMAT, "%s: %lld bytes is too short for a safetensors header", path, (long long)sb.st_size);
    else if ((m->map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0)) == MAP_FAILED)
        st = kiln_fail(KILN_ERR_IO, "%s: cannot map: %s", path, strerror(errno));
    close(fd);
    if (st) return st;
    m->size = (size_t)sb.st_size;
    const uint8_t *p = m->map;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | p[i];
    if (hlen > m->size - 8 || hlen > ST_MAX_HEADER)
        return kiln_fail(KILN_ERR_FORMAT, "%s: header length %llu does not fit the file's %zu bytes", path, (unsigned long long)hlen, m->size);
    json_error_t err;
    json_t *root = json_loadb((const char *)p + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &err);
    if (!root) return kiln_fail(KILN_ERR_FORMAT, "%s: header is not JSON (byte %d: %s)", path, err.position + 8, err.text);
    if (!json_is_object(root)) st = kiln_fail(KILN_ERR_FORMAT, "%s: header is not a JSON object", path);
    const char *name;
    json_t *info;
    json_object_foreach(root, name, info) {
        if (st) break;
        if (strcmp(name, "__metadata__") == 0) continue;
        if (!json_is_object(info)) st = kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s' is not a JSON object", path, name);
        else st = add_tensor(s, path, p + 8 + hlen, m->size - 8 - hlen, name, info);
    }
    json_decref(root);
    return st;
}

/* The shard names of model.safetensors.index.json's weight_map, each once and each a plain file name. */
static kiln_status open_index(kiln_st_set *s, const char *dir, const char *index_path) {
    json_error_t err;
    json_t *root = json_load_file(index_path, JSON_REJECT_DUPLICATES, &err);
    if (!root) return kiln_fail(KILN_ERR_FORMAT, "%s: not JSON (line %d: %s)", index_path, err.line, err.text);
    json_t *wm = json_object_get(root, "weight_map");
    kiln_status st = json_is_object(wm) && json_object_size(wm) ? KILN_OK
                                                                 : kiln_fail(KILN_ERR_FORMAT, "%s: no weight_map object", index_path);
    const char *tname;
    json_t *file;
    json_object_foreach(wm, tname, file) {
        if (st) break;
        const char *f = json_string_value(file);
        if (!f || !*f || strchr(f, '/') || strcmp(f, "..") == 0) {
            st = kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s' maps to a file name that is not a plain name in the folder", index_path, tname);
            break;
        }
        char path[4096];
        if (snprintf(path, sizeof path, "%s/%s", dir, f) >= (int)sizeof path) {
            st = kiln_fail(KILN_ERR_INVALID, "%s: path too long", dir);
            break;
        }
        bool seen = false;
        for (size_t i = 0; i < s->n_maps; i++) seen |= strcmp(s->maps[i].path, path) == 0;
        if (!seen) st = open_file(s, path);
    }
    /* every tensor the index names must be where it says */
    json_object_foreach(wm, tname, file) {
        if (st) break;
        const kiln_st_tensor *t = kiln_st_find(s, tname);
        if (!t) st = kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s' is not in %s", index_path, tname, json_string_value(file));
    }
    json_decref(root);
    return st;
}

kiln_status kiln_st_open_dir(const char *dir, kiln_st_set *out) {
    memset(out, 0, sizeof *out);
    char path[4096];
    if (snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir) >= (int)sizeof path)
        return kiln_fail(KILN_ERR_INVALID, "%s: path too long", dir);
    kiln_status st;
    if (access(path, F_OK) == 0) st = open_index(out, dir, path);
    else {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        if (access(path, F_OK) != 0)
            return kiln_fail(KILN_ERR_NOT_FOUND, "%s: neither model.safetensors nor model.safetensors.index.json is there", dir);
        st = open_file(out, path);
    }
    if (st) kiln_st_close(out);
    return st;
}

void kiln_st_close(kiln_st_set *s) {
    for (size_t i = 0; i < s->n; i++) free(s->t[i].name);
    for (size_t i = 0; i < s->n_maps; i++) {
        if (s->maps[i].map != MAP_FAILED) munmap(s->maps[i].map, s->maps[i].size);
        free(s->maps[i].path);
    }
    free(s->t);
    free(s->maps);
    memset(s, 0, sizeof *s);
}

kiln_st_tensor *kiln_st_find(const kiln_st_set *s, const char *name) {
    for (size_t i = 0; i < s->n; i++)
        if (strcmp(s->t[i].name, name) == 0) return &s->t[i];
    return NULL;
}

float kiln_st_get(const kiln_st_tensor *t, int64_t i) {
    switch (t->dtype) {
    case KILN_ST_F32: {
        float f;
        memcpy(&f, t->data + 4 * i, 4);
        return f;
    }
    case KILN_ST_F16: {
        kiln_fp16 h;
        memcpy(&h, t->data + 2 * i, 2);
        return kiln_fp16_to_f32(h);
    }
    case KILN_ST_BF16: {
        kiln_bf16 h;
        memcpy(&h, t->data + 2 * i, 2);
        return kiln_bf16_to_f32(h);
    }
    }
    return 0.0f;
}
