/* wb_tok.c: the workbench's vocabulary routes (docs/workbench.md), and what they share with wb_gen.c:
 *   GET  /wb/info                  devices, presets, schedules, export types, auth
 *   GET  /wb/tokenizers            the workbench's tokenizers, the GGUF vocabularies and the served model's
 *   GET  /wb/tokenizer?name=N      one: its size, specials, first merges, held-out bytes per token
 *   POST /wb/tokenize              text to its tokens, each with its piece
 *   POST /wb/compare               the same text through several tokenizers: bytes per token
 * A tokenizer name is NAME (DIR/tokenizers/NAME.gguf), gguf:FILE (DIR/models/FILE, else the vocab/ folder beside
 * the examples), "bundled" (models/shakespeare.gguf's) or "served" (the -m model's). Loaded tokenizers are kept (at most WB_TOK_CACHE, by path, size and
 * modification time), counted while a request uses one. */
#include "serve/jobs.h"
#include "serve/serve.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define WB_TOK_CACHE 6
#define TEXT_MAX (1 << 20)      /* bytes of a tokenize or compare text */
#define TOKENS_MAX 100000       /* tokens a tokenize answer lists (n_tokens counts them all) */
#define COMPARE_BYTES (4 << 20) /* of a corpus compared */

typedef struct {
    char path[4096];
    int64_t size, mtime_ns;
    kiln_tokenizer *t;
    int refs;
    uint64_t used;
} tok_entry;

struct wb_tok_cache {
    pthread_mutex_t mu;
    tok_entry e[WB_TOK_CACHE];
    uint64_t clock;
};

static void cache_free(struct wb_tok_cache *c) {
    if (!c) return;
    for (int i = 0; i < WB_TOK_CACHE; i++) kiln_tokenizer_free(c->e[i].t);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

static struct wb_tok_cache *cache_of(wb *w) { /* made at the first use, under w->mu */
    pthread_mutex_lock(&w->mu);
    if (!w->toks && (w->toks = calloc(1, sizeof *w->toks))) pthread_mutex_init(&w->toks->mu, NULL), w->toks_free = cache_free;
    struct wb_tok_cache *c = w->toks;
    pthread_mutex_unlock(&w->mu);
    return c;
}

bool wb_vocab_dir(const wb *w, char *buf, size_t cap) {
    const char *e = w->examples, *slash = strrchr(e, '/');
    if (!e[0]) return false;
    int n = slash ? snprintf(buf, cap, "%.*s/vocab", (int)(slash - e), e) : snprintf(buf, cap, "vocab");
    return n > 0 && (size_t)n < cap;
}

static bool is_file(const char *p, struct stat *sb) { return stat(p, sb) == 0 && S_ISREG(sb->st_mode); }

/* The file of tokenizer name (see the top), or "" for "served"; false with a 400/404 in rs. */
static bool tok_path(srv_server *s, const char *name, char *buf, size_t cap, srv_response *rs) {
    struct stat sb;
    buf[0] = 0;
    if (name && strcmp(name, "served") == 0) {
        if (s->tok) return true;
        srv_error(rs, 404, "tokenizer", "no model is served (kiln serve -m MODEL.gguf)");
        return false;
    }
    if (name && strcmp(name, "bundled") == 0) {
        if (s->wb->bundled && (size_t)snprintf(buf, cap, "%s", s->wb->bundled) < cap && is_file(buf, &sb)) return true;
        srv_error(rs, 404, "tokenizer", "the bundled model (models/shakespeare.gguf) is not beside this kiln");
        return false;
    }
    if (name && strncmp(name, "gguf:", 5) == 0 && wb_name_ok(name + 5)) {
        char dir[4096];
        if (wb_path(s->wb, buf, cap, "models", name + 5) && is_file(buf, &sb)) return true;
        if (wb_vocab_dir(s->wb, dir, sizeof dir) && (size_t)snprintf(buf, cap, "%s/%s", dir, name + 5) < cap && is_file(buf, &sb)) return true;
        srv_error(rs, 404, "tokenizer", "no GGUF %s in the models or vocab folder (GET /wb/tokenizers)", name + 5);
        return false;
    }
    char file[WB_NAME_MAX + 8];
    if (!wb_name_ok(name)) {
        srv_error(rs, 400, "tokenizer", "a tokenizer is NAME, gguf:FILE or served (GET /wb/tokenizers)");
        return false;
    }
    snprintf(file, sizeof file, "%s.gguf", name);
    if (wb_path(s->wb, buf, cap, "tokenizers", file) && is_file(buf, &sb)) return true;
    srv_error(rs, 404, "tokenizer", "no tokenizer %s (train one with a tokenizer job)", name);
    return false;
}

/* The tokenizer named name, held until wb_tok_put(*entry); false with the error in rs. */
bool wb_tok_get(srv_server *s, const char *name, const kiln_tokenizer **out, void **entry, srv_response *rs) {
    char path[4096];
    *out = NULL, *entry = NULL;
    if (!tok_path(s, name, path, sizeof path, rs)) return false;
    if (!path[0]) return *out = s->tok, true;
    struct wb_tok_cache *c = cache_of(s->wb);
    struct stat sb;
    if (!c || !is_file(path, &sb)) {
        srv_error(rs, c ? 404 : 500, c ? "tokenizer" : NULL, c ? "tokenizer %s is gone" : "out of memory", name);
        return false;
    }
    int64_t mt = (int64_t)sb.st_mtim.tv_sec * 1000000000 + sb.st_mtim.tv_nsec;
    pthread_mutex_lock(&c->mu);
    tok_entry *hit = NULL, *free_slot = NULL;
    for (int i = 0; i < WB_TOK_CACHE; i++) {
        tok_entry *e = &c->e[i];
        if (e->t && strcmp(e->path, path) == 0 && e->size == (int64_t)sb.st_size && e->mtime_ns == mt) hit = e;
        if (e->refs == 0 && (!free_slot || !e->t || (free_slot->t && e->used < free_slot->used))) free_slot = e;
    }
    if (!hit && free_slot) { /* loaded under the lock: a second request for it waits rather than loading it twice */
        kiln_tokenizer *t;
        if (kiln_tokenizer_load_file(path, &t)) {
            pthread_mutex_unlock(&c->mu);
            srv_error(rs, 422, "tokenizer", "tokenizer %s: %s", name, kiln_last_error());
            return false;
        }
        kiln_tokenizer_free(free_slot->t);
        *free_slot = (tok_entry){.size = (int64_t)sb.st_size, .mtime_ns = mt, .t = t};
        snprintf(free_slot->path, sizeof free_slot->path, "%s", path);
        hit = free_slot;
    }
    if (hit) hit->refs++, hit->used = ++c->clock;
    pthread_mutex_unlock(&c->mu);
    if (!hit) {
        srv_error(rs, 503, NULL, "every tokenizer slot is in use: try again");
        return false;
    }
    *out = hit->t, *entry = hit;
    return true;
}

void wb_tok_put(srv_server *s, void *entry) {
    if (!entry) return;
    pthread_mutex_lock(&s->wb->toks->mu);
    ((tok_entry *)entry)->refs--;
    pthread_mutex_unlock(&s->wb->toks->mu);
}

/* ---------------------------------------------------------------- info */

void srv_route_wb_info(srv_server *s, const srv_request *rq, srv_response *rs) {
    if (!srv_wb_on(s, rs)) return;
    json_t *dev = json_array(), *types = json_array(), *presets = json_array();
    json_array_append_new(dev, json_pack("{s:s,s:i}", "name", "cpu", "threads", (int)sysconf(_SC_NPROCESSORS_ONLN)));
    for (int i = 0; i < kiln_cuda_device_count() && i < WB_MAX_QUEUES - 1; i++) {
        char n[16];
        snprintf(n, sizeof n, "cuda:%d", i);
        json_array_append_new(dev, json_pack("{s:s}", "name", n));
    }
    const char *names = kiln_ftype_names(); /* "f32 f16 ...": the export types */
    for (const char *p = names; *p;) {
        size_t k = strcspn(p, " ");
        json_array_append_new(types, json_stringn(p, k));
        p += k + (p[k] == ' ');
    }
    srv_wb_presets(presets);
    srv_json(rs, 200, json_pack("{s:s,s:b,s:o,s:o,s:o,s:[sss],s:s?}", "version", KILN_VERSION, "auth", s->o.api_key != NULL, "devices", dev,
                                "presets", presets, "export_types", types, "lr_schedules", "cosine", "linear", "constant", "model",
                                s->m ? s->model_name : NULL));
}

/* ---------------------------------------------------------------- tokenizers */

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The names in dir ending in suffix (sorted), each appended to list by add. */
static void each_file(const char *dir, const char *suffix, void (*add)(json_t *, const char *, void *), json_t *list, void *ud) {
    DIR *d = opendir(dir);
    if (!d) return;
    char *names[512];
    size_t n = 0, ls = strlen(suffix);
    struct dirent *e;
    while ((e = readdir(d)) && n < 512) {
        size_t k = strlen(e->d_name);
        if (wb_name_ok(e->d_name) && k > ls && strcmp(e->d_name + k - ls, suffix) == 0 && (names[n] = strdup(e->d_name))) n++;
    }
    closedir(d);
    qsort(names, n, sizeof *names, cmp_str);
    for (size_t i = 0; i < n; i++) add(list, names[i], ud), free(names[i]);
}

static void add_workbench(json_t *list, const char *file, void *ud) {
    json_array_append_new(list, json_pack("{s:s#,s:s}", "name", file, (int)(strlen(file) - 5), "source", "workbench"));
}

static void add_gguf(json_t *list, const char *file, void *ud) {
    char name[WB_NAME_MAX + 8];
    snprintf(name, sizeof name, "gguf:%s", file);
    for (size_t i = 0; i < json_array_size(list); i++) /* DIR/models first: the same file name in vocab/ is hidden */
        if (strcmp(json_string_value(json_object_get(json_array_get(list, i), "name")), name) == 0) return;
    json_array_append_new(list, json_pack("{s:s,s:s,s:s}", "name", name, "source", "gguf", "folder", (const char *)ud));
}

void srv_route_wb_tokenizers(srv_server *s, const srv_request *rq, srv_response *rs) {
    if (!srv_wb_on(s, rs)) return;
    json_t *list = json_array();
    char dir[4096];
    wb_path(s->wb, dir, sizeof dir, "tokenizers", NULL);
    each_file(dir, ".gguf", add_workbench, list, NULL);
    wb_path(s->wb, dir, sizeof dir, "models", NULL);
    each_file(dir, ".gguf", add_gguf, list, "models");
    if (wb_vocab_dir(s->wb, dir, sizeof dir)) each_file(dir, ".gguf", add_gguf, list, "vocab");
    if (s->wb->bundled) json_array_append_new(list, json_pack("{s:s,s:s}", "name", "bundled", "source", "bundled"));
    if (s->tok) json_array_append_new(list, json_pack("{s:s,s:s,s:I}", "name", "served", "source", "served", "n_vocab", (json_int_t)kiln_tokenizer_n_vocab(s->tok)));
    srv_json(rs, 200, json_pack("{s:o}", "tokenizers", list));
}

/* s's text as JSON with every invalid UTF-8 byte as U+FFFD. */
static json_t *text_json(const char *p, size_t n) {
    size_t m;
    char *clean = srv_utf8_sanitize(p, n, &m);
    json_t *j = clean ? json_stringn(clean, m) : json_string("");
    free(clean);
    return j;
}

/* GPT-2's byte-level alphabet back to bytes: the printable bytes stand for themselves, the other 68 are code points
 * 256.. in byte order. A code point outside the alphabet is kept as its UTF-8. */
static size_t unbyte(const char *p, size_t n, char *out) {
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        unsigned c = (unsigned char)p[i];
        unsigned cp = c, len = 1;
        if (c >= 0xC0 && c < 0xE0 && i + 1 < n) cp = ((c & 0x1F) << 6) | ((unsigned char)p[i + 1] & 0x3F), len = 2;
        bool printable = (cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || (cp >= 174 && cp <= 255);
        if (len == 2 && cp >= 256 && cp < 256 + 68) { /* the cp-256'th byte that is not printable */
            unsigned want = cp - 256, b = 0;
            for (;; b++) {
                bool pr = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
                if (!pr && want-- == 0) break;
            }
            out[k++] = (char)b;
        } else if (len == 2 && printable) {
            out[k++] = (char)cp;
        } else {
            memcpy(out + k, p + i, len), k += len;
        }
        i += len;
    }
    return k;
}

/* A merge side's text as people read it: byte-level BPE's alphabet decoded, SentencePiece's ▁ as a space. */
static json_t *merge_side(const char *model, const char *p, size_t n) {
    char buf[1024];
    if (n > 512) n = 512;
    if (strcmp(model, "gpt2") == 0) return text_json(buf, unbyte(p, n, buf));
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (i + 2 < n && memcmp(p + i, "\xE2\x96\x81", 3) == 0) buf[k++] = ' ', i += 2;
        else buf[k++] = p[i];
    }
    return text_json(buf, k);
}

static const char *arg(const srv_request *rq, const char *k) {
    for (size_t i = 0; i < rq->n_args; i++)
        if (strcmp(rq->args[i].key, k) == 0) return rq->args[i].value;
    return NULL;
}

/* The held-out measure of a workbench tokenizer: its last done tokenizer job's outputs.heldout, or NULL. */
static json_t *heldout_of(wb *w, const char *name) {
    json_t *h = NULL;
    pthread_mutex_lock(&w->mu);
    for (size_t i = w->n_jobs; i-- > 0 && !h;) {
        wb_job *j = w->jobs[i];
        const char *n = json_string_value(json_object_get(j->params, "name"));
        if (j->kind == WB_TOKENIZER && j->state == WB_DONE && n && strcmp(n, name) == 0)
            h = json_deep_copy(json_object_get(j->outputs, "heldout")), i = 0;
    }
    pthread_mutex_unlock(&w->mu);
    return h;
}

void srv_route_wb_tokenizer(srv_server *s, const srv_request *rq, srv_response *rs) {
    if (!srv_wb_on(s, rs)) return;
    const char *name = arg(rq, "name"), *m = arg(rq, "merges");
    char *end = NULL;
    long n_merges = m ? strtol(m, &end, 10) : 50;
    if (m && (*end || end == m || n_merges < 0 || n_merges > 10000)) {
        srv_error(rs, 400, "merges", "merges must be an integer in [0, 10000]");
        return;
    }
    char path[4096];
    const kiln_tokenizer *t;
    void *e;
    if (!tok_path(s, name, path, sizeof path, rs) || !wb_tok_get(s, name, &t, &e, rs)) return;
    json_t *special = json_array(), *merges = json_array();
    for (int32_t i = 0; i < kiln_tokenizer_n_vocab(t) && json_array_size(special) < 256; i++) {
        kiln_token_type ty = kiln_tokenizer_token_type(t, i);
        if (ty == KILN_TOKEN_CONTROL || ty == KILN_TOKEN_USER_DEFINED) {
            kiln_str x = kiln_tokenizer_token_text(t, i);
            json_array_append_new(special, json_pack("{s:i,s:o}", "id", (int)i, "text", text_json(x.ptr, (size_t)x.len)));
        }
    }
    kiln_gguf *g = NULL; /* the merges' file: the tokenizer's, or the served model's */
    const kiln_gguf_value *mv = NULL;
    const char *model = kiln_tokenizer_model(t);
    if (path[0] && kiln_gguf_open(path, &g) == KILN_OK) mv = kiln_gguf_find(g, "tokenizer.ggml.merges");
    else if (!path[0]) mv = kiln_gguf_find(kiln_model_gguf(s->m), "tokenizer.ggml.merges");
    for (uint64_t i = 0; mv && mv->type == KILN_GGUF_ARRAY && mv->arr.type == KILN_GGUF_STRING && i < mv->arr.n && i < (uint64_t)n_merges; i++) {
        kiln_str x = mv->arr.items[i].str;
        const char *sp = memchr(x.ptr, ' ', x.len);
        if (!sp) continue;
        json_array_append_new(merges, json_pack("{s:I,s:o,s:o}", "rank", (json_int_t)i, "left", merge_side(model, x.ptr, (size_t)(sp - x.ptr)), "right",
                                                merge_side(model, sp + 1, (size_t)(x.ptr + x.len - sp - 1))));
    }
    json_t *o = json_pack("{s:s,s:I,s:s,s:o,s:o,s:I}", "name", name, "n_vocab", (json_int_t)kiln_tokenizer_n_vocab(t), "model", model, "special", special,
                          "merges", merges, "n_merges", (json_int_t)(mv && mv->type == KILN_GGUF_ARRAY ? mv->arr.n : 0));
    json_t *h = wb_name_ok(name) ? heldout_of(s->wb, name) : NULL;
    json_object_set_new(o, "heldout", h ? h : json_null());
    kiln_gguf_close(g);
    wb_tok_put(s, e);
    srv_json(rs, 200, o);
}

/* The text field of a body: a string of at most TEXT_MAX bytes without NUL; NULL with a 400. */
static const char *body_text(json_t *body, const char *k, size_t *n, srv_response *rs) {
    json_t *v = json_object_get(body, k);
    if (!json_is_string(v) || json_string_length(v) > TEXT_MAX || strlen(json_string_value(v)) != json_string_length(v)) {
        srv_error(rs, 400, k, "%s must be a string of at most %d bytes without NUL", k, TEXT_MAX);
        return NULL;
    }
    *n = json_string_length(v);
    return json_string_value(v);
}

/* Refuses a field of body not in the NULL-ended list; false with a 400. */
bool wb_known_fields(json_t *body, const char *const *known, srv_response *rs) {
    const char *key;
    json_t *v;
    json_object_foreach(body, key, v) {
        size_t i = 0;
        while (known[i] && strcmp(known[i], key)) i++;
        if (!known[i]) {
            srv_error(rs, 400, key, "%s is not a field of this request", key);
            return false;
        }
    }
    return true;
}

void srv_route_wb_tokenize(srv_server *s, const srv_request *rq, srv_response *rs) {
    if (!srv_wb_on(s, rs)) return;
    json_t *body = srv_body_object(rq, rs);
    if (!body) return;
    static const char *const known[] = {"tokenizer", "text", NULL};
    size_t n;
    const char *text = wb_known_fields(body, known, rs) ? body_text(body, "text", &n, rs) : NULL;
    const kiln_tokenizer *t;
    void *e;
    if (!text || !wb_tok_get(s, json_string_value(json_object_get(body, "tokenizer")), &t, &e, rs)) {
        json_decref(body);
        return;
    }
    kiln_tokens ids = {0};
    kiln_status st = kiln_tokenizer_encode(t, text, n, false, false, &ids);
    if (st) {
        srv_error(rs, 422, "text", "%s", kiln_last_error());
    } else {
        json_t *list = json_array();
        for (size_t i = 0; i < ids.n && i < TOKENS_MAX; i++) {
            char buf[512];
            size_t k;
            if (kiln_tokenizer_piece(t, ids.ids[i], true, buf, sizeof buf, &k) || k > sizeof buf) k = 0;
            kiln_token_type ty = kiln_tokenizer_token_type(t, ids.ids[i]);
            json_array_append_new(list, json_pack("{s:i,s:o,s:b}", "id", (int)ids.ids[i], "piece", text_json(buf, k), "special",
                                                  ty == KILN_TOKEN_CONTROL || ty == KILN_TOKEN_USER_DEFINED));
        }
        json_t *o = json_pack("{s:o,s:I,s:I,s:b}", "tokens", list, "n_bytes", (json_int_t)n, "n_tokens", (json_int_t)ids.n, "truncated", ids.n > TOKENS_MAX);
        json_object_set_new(o, "bytes_per_token", ids.n ? json_real((double)n / (double)ids.n) : json_null());
        srv_json(rs, 200, o);
    }
    kiln_tokens_free(&ids);
    wb_tok_put(s, e);
    json_decref(body);
}

/* The first cap bytes of file path into a malloc'd buffer (*n), cut back to a character start; NULL when unreadable. */
static char *read_head(const char *path, size_t cap, size_t *n) {
    FILE *f = fopen(path, "rb");
    char *b = f ? malloc(cap + 1) : NULL;
    *n = b ? fread(b, 1, cap + 1, f) : 0; /* one byte more: whether the cut falls inside a character */
    if (f) fclose(f);
    if (*n > cap)
        for (*n = cap; *n > 0 && ((unsigned char)b[*n] & 0xC0) == 0x80;) --*n;
    return b;
}

void srv_route_wb_compare(srv_server *s, const srv_request *rq, srv_response *rs) {
    if (!srv_wb_on(s, rs)) return;
    json_t *body = srv_body_object(rq, rs);
    if (!body) return;
    static const char *const known[] = {"tokenizers", "heldout", "corpus", "text", NULL};
    json_t *names = json_object_get(body, "tokenizers");
    char *owned = NULL, path[4096];
    const char *text = NULL;
    size_t n = 0;
    int given = !!json_object_get(body, "heldout") + !!json_object_get(body, "corpus") + !!json_object_get(body, "text");
    if (!wb_known_fields(body, known, rs)) goto out;
    if (!json_is_array(names) || json_array_size(names) < 1 || json_array_size(names) > 8) {
        srv_error(rs, 400, "tokenizers", "tokenizers must be an array of 1 to 8 tokenizer names");
        goto out;
    }
    if (given != 1) {
        srv_error(rs, 400, "text", "give one of heldout (a tokenizer's held-out text), corpus or text");
        goto out;
    }
    if (json_object_get(body, "text")) {
        if (!(text = body_text(body, "text", &n, rs))) goto out;
    } else if (json_object_get(body, "corpus")) {
        const char *c = json_string_value(json_object_get(body, "corpus"));
        if (!c || !wb_corpus_path(s->wb, c, path, sizeof path)) {
            srv_error(rs, 404, "corpus", "no corpus %s (GET /wb/corpora)", c ? c : "");
            goto out;
        }
        text = owned = read_head(path, COMPARE_BYTES, &n);
    } else {
        const char *tn = json_string_value(json_object_get(body, "heldout"));
        json_t *h = tn && wb_name_ok(tn) ? heldout_of(s->wb, tn) : NULL;
        const char *file = json_string_value(json_object_get(h, "file"));
        if (file) text = owned = read_head(file, COMPARE_BYTES, &n);
        json_decref(h);
        if (!file) {
            srv_error(rs, 404, "heldout", "tokenizer %s has no held-out text (a tokenizer job with heldout_fraction > 0 makes one)", tn ? tn : "");
            goto out;
        }
    }
    if (!text || n == 0) {
        srv_error(rs, text ? 400 : 404, text ? "text" : NULL, text ? "the text is empty" : "the text's file cannot be read (gone?)");
        goto out;
    }
    json_t *results = json_array();
    for (size_t i = 0; i < json_array_size(names); i++) {
        const char *tn = json_string_value(json_array_get(names, i));
        const kiln_tokenizer *t;
        void *e;
        if (!wb_tok_get(s, tn, &t, &e, rs)) {
            json_decref(results);
            goto out;
        }
        kiln_tokens ids = {0};
        kiln_status st = kiln_tokenizer_encode(t, text, n, false, false, &ids);
        wb_tok_put(s, e);
        if (st) {
            srv_error(rs, 422, "tokenizers", "%s: %s", tn, kiln_last_error());
            kiln_tokens_free(&ids), json_decref(results);
            goto out;
        }
        json_array_append_new(results, json_pack("{s:s,s:I,s:f}", "tokenizer", tn, "tokens", (json_int_t)ids.n, "bytes_per_token",
                                                 ids.n ? (double)n / (double)ids.n : 0.0));
        kiln_tokens_free(&ids);
    }
    srv_json(rs, 200, json_pack("{s:I,s:o}", "bytes", (json_int_t)n, "results", results));
out:
    free(owned);
    json_decref(body);
}
