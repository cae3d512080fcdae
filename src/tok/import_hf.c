/* import_hf.c: a Hugging Face tokenizer into tokenizer.ggml.* metadata, as llama.cpp's convert_hf_to_gguf.py
 * (_set_vocab_gpt2, _set_vocab_sentencepiece) and gguf-py's SpecialVocab write it:
 *   tokenizer.json, a byte-level BPE: model "gpt2", the tokens as the file spells them (Ġ for a space), token_type
 *     (added special tokens CONTROL, other added ones USER_DEFINED, ids no token has [PAD<id>] UNUSED), merges, and
 *     the pre-tokenizer's name, recognised from tokenizer.json's pre_tokenizer (llama.cpp hashes a tokenization
 *     instead; these are the pre-tokenizers of the families kiln converts, and any other is refused);
 *   tokenizer.model, a SentencePiece ModelProto read by hand (protobuf wire format): model "llama", the pieces,
 *     scores and types (SentencePiece's type enum is GGUF's), with tokenizer_config.json's added tokens typed.
 * Then the special ids (tokenizer_config.json's tokens, else config.json's ids, else SentencePiece's trainer spec),
 * add_bos/add_eos (tokenizer_config.json, else tokenizer.json's TemplateProcessing) and the chat template.
 * tests/test_hf_oracle.c checks kiln's tokenization of converted tokenizers against the tokenizers package's. */
#include "tok/import_hf.h"
#include "status.h"

#include <errno.h>
#include <jansson.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_USER_DEFINED = 4, TT_UNUSED = 5, TT_BYTE = 6 };

/* ---------------------------------------------------------------- the vocabulary being built */

typedef struct vocab {
    char **text;   /* n tokens, owned */
    float *score;  /* n */
    int32_t *type; /* n */
    int64_t n, cap;
    int64_t bos, eos, unk, pad; /* -1: unknown */
} vocab;

static kiln_status vocab_grow(vocab *v, int64_t n) {
    if (n <= v->cap) return KILN_OK;
    if (n > (1 << 24)) return kiln_fail(KILN_ERR_RANGE, "a tokenizer of %lld tokens is too large (at most 2^24)", (long long)n);
    int64_t cap = v->cap ? v->cap : 1024;
    while (cap < n) cap *= 2;
    char **t = realloc(v->text, (size_t)cap * sizeof *t);
    if (t) v->text = t;
    float *s = realloc(v->score, (size_t)cap * sizeof *s);
    if (s) v->score = s;
    int32_t *ty = realloc(v->type, (size_t)cap * sizeof *ty);
    if (ty) v->type = ty;
    if (!t || !s || !ty) return kiln_fail(KILN_ERR_NOMEM, "out of memory for %lld tokens", (long long)cap);
    for (int64_t i = v->cap; i < cap; i++) v->text[i] = NULL, v->score[i] = 0, v->type[i] = TT_UNUSED;
    v->cap = cap;
    return KILN_OK;
}

/* Sets token id (growing the list); a NUL inside the text cannot be written as a GGUF C string. */
static kiln_status vocab_set(vocab *v, int64_t id, const char *text, size_t len, float score, int32_t type) {
    if (id < 0) return kiln_fail(KILN_ERR_FORMAT, "token id %lld is negative", (long long)id);
    kiln_status s = vocab_grow(v, id + 1);
    if (s) return s;
    if (memchr(text, 0, len)) return kiln_fail(KILN_ERR_UNSUPPORTED, "token %lld holds a NUL byte", (long long)id);
    char *t = malloc(len + 1);
    if (!t) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    memcpy(t, text, len);
    t[len] = 0;
    free(v->text[id]);
    v->text[id] = t, v->score[id] = score, v->type[id] = type;
    if (id >= v->n) v->n = id + 1;
    return KILN_OK;
}

static int64_t vocab_find(const vocab *v, const char *text) {
    for (int64_t i = 0; i < v->n; i++)
        if (v->text[i] && strcmp(v->text[i], text) == 0) return i;
    return -1;
}

/* Fills ids no token has, and pads to n_rows, with llama.cpp's [PAD<id>] UNUSED tokens. */
static kiln_status vocab_pad(vocab *v, int64_t n_rows, const char *what) {
    if (n_rows > 0 && v->n > n_rows)
        return kiln_fail(KILN_ERR_FORMAT, "%s has %lld tokens but the embedding has %lld rows", what, (long long)v->n, (long long)n_rows);
    int64_t n = n_rows > v->n ? n_rows : v->n;
    for (int64_t i = 0; i < n; i++) {
        if (i < v->n && v->text[i]) continue;
        char b[32];
        int len = snprintf(b, sizeof b, "[PAD%lld]", (long long)i);
        kiln_status s = vocab_set(v, i, b, (size_t)len, -1000.0f, TT_UNUSED);
        if (s) return s;
    }
    return KILN_OK;
}

static void vocab_free(vocab *v) {
    for (int64_t i = 0; i < v->cap; i++) free(v->text[i]);
    free(v->text);
    free(v->score);
    free(v->type);
}

/* ---------------------------------------------------------------- files */

static bool exists(const char *dir, const char *name, char *path, size_t n) {
    snprintf(path, n, "%s/%s", dir, name);
    return access(path, F_OK) == 0;
}

/* An optional JSON object file: NULL (and OK) when absent. */
static kiln_status opt_json(const char *dir, const char *name, json_t **out) {
    char path[4096];
    *out = NULL;
    if (!exists(dir, name, path, sizeof path)) return KILN_OK;
    json_error_t err;
    *out = json_load_file(path, 0, &err);
    if (!*out) return kiln_fail(KILN_ERR_FORMAT, "%s: not JSON (line %d: %s)", path, err.line, err.text);
    if (!json_is_object(*out)) {
        json_decref(*out);
        *out = NULL;
        return kiln_fail(KILN_ERR_FORMAT, "%s: not a JSON object", path);
    }
    return KILN_OK;
}

/* A whole small file (a chat template, a tokenizer.model) into a malloc'd buffer. */
static kiln_status read_all(const char *path, uint8_t **out, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return kiln_fail(KILN_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    kiln_status s = KILN_OK;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > (1 << 30))
        s = kiln_fail(KILN_ERR_IO, "%s: not a regular file of at most 1 GiB", path);
    *out = s ? NULL : malloc((size_t)st.st_size + 1);
    if (!s && !*out) s = kiln_fail(KILN_ERR_NOMEM, "out of memory");
    if (!s && fread(*out, 1, (size_t)st.st_size, f) != (size_t)st.st_size) s = kiln_fail(KILN_ERR_IO, "%s: short read", path);
    if (!s) (*out)[st.st_size] = 0, *n = (size_t)st.st_size;
    fclose(f);
    if (s) free(*out), *out = NULL;
    return s;
}

/* ---------------------------------------------------------------- tokenizer.json (byte-level BPE) */

/* The pre-tokenizer regexes of tokenizer.json as the families ship them, and llama.cpp's names for them. */
#define HF_RE_CONTRACTIONS "(?i:'s|'t|'re|'ve|'m|'ll|'d)"
#define HF_RE_LLAMA3_TAIL "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
static const struct {
    const char *regex;
    const char *pre;          /* tokenizer.ggml.pre */
    const char *pre_no_ignore; /* the name when the model does not set ignore_merges, or NULL for the same */
} hf_split_regexes[] = {
    {HF_RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}" HF_RE_LLAMA3_TAIL, "llama-bpe", "dbrx"},
    {HF_RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}" HF_RE_LLAMA3_TAIL, "qwen2", NULL},
};

static bool is_type(json_t *o, const char *t) {
    const char *s = json_string_value(json_object_get(o, "type"));
    return s && strcmp(s, t) == 0;
}

/* A ByteLevel pre-tokenizer that splits with GPT-2's regex (use_regex true, the default) or not at all. */
static bool byte_level(json_t *o, bool with_regex) {
    if (!is_type(o, "ByteLevel") || json_is_true(json_object_get(o, "add_prefix_space"))) return false;
    json_t *r = json_object_get(o, "use_regex");
    return with_regex ? !json_is_false(r) : json_is_false(r);
}

static const char *pre_name(json_t *model, json_t *pt) {
    if (byte_level(pt, true)) return "gpt-2";
    json_t *list = is_type(pt, "Sequence") ? json_object_get(pt, "pretokenizers") : NULL;
    if (json_array_size(list) != 2) return NULL;
    json_t *a = json_array_get(list, 0), *b = json_array_get(list, 1);
    if (is_type(a, "Digits") && json_is_true(json_object_get(a, "individual_digits")) && byte_level(b, true)) return "smollm";
    const char *re = json_string_value(json_object_get(json_object_get(a, "pattern"), "Regex"));
    if (!is_type(a, "Split") || !re || !byte_level(b, false)) return NULL;
    bool ignore = json_is_true(json_object_get(model, "ignore_merges"));
    for (size_t i = 0; i < sizeof hf_split_regexes / sizeof hf_split_regexes[0]; i++)
        if (strcmp(re, hf_split_regexes[i].regex) == 0)
            return !ignore && hf_split_regexes[i].pre_no_ignore ? hf_split_regexes[i].pre_no_ignore : hf_split_regexes[i].pre;
    return NULL;
}

typedef struct bpe_merges {
    char **m; /* n "left right" strings, owned */
    size_t n;
} bpe_merges;

static kiln_status read_merges(json_t *arr, const char *path, bpe_merges *out) {
    size_t n = json_array_size(arr);
    out->m = calloc(n ? n : 1, sizeof *out->m);
    out->n = 0;
    if (!out->m) return kiln_fail(KILN_ERR_NOMEM, "out of memory for %zu merges", n);
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(arr, i);
        const char *l = NULL, *r = NULL, *whole = json_string_value(e);
        if (json_is_array(e) && json_array_size(e) == 2) l = json_string_value(json_array_get(e, 0)), r = json_string_value(json_array_get(e, 1));
        if (!whole && (!l || !r)) return kiln_fail(KILN_ERR_FORMAT, "%s: merge %zu is neither \"a b\" nor [\"a\", \"b\"]", path, i);
        size_t len = whole ? strlen(whole) : strlen(l) + 1 + strlen(r);
        if (!(out->m[i] = malloc(len + 1))) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
        if (whole) memcpy(out->m[i], whole, len + 1);
        else snprintf(out->m[i], len + 1, "%s %s", l, r);
        out->n = i + 1;
    }
    return KILN_OK;
}

static void merges_free(bpe_merges *m) {
    for (size_t i = 0; i < m->n; i++) free(m->m[i]);
    free(m->m);
}

/* added_tokens / added_tokens_decoder entries: special ones CONTROL, the others USER_DEFINED. */
static kiln_status add_added(vocab *v, int64_t id, json_t *e, const char *path) {
    const char *content = json_string_value(json_object_get(e, "content"));
    if (!content) return kiln_fail(KILN_ERR_FORMAT, "%s: added token %lld has no content", path, (long long)id);
    return vocab_set(v, id, content, strlen(content), 0.0f, json_is_true(json_object_get(e, "special")) ? TT_CONTROL : TT_USER_DEFINED);
}

static kiln_status read_bpe(const char *path, vocab *v, bpe_merges *merges, const char **pre, json_t **root_out) {
    json_error_t err;
    json_t *root = *root_out = json_load_file(path, 0, &err);
    if (!root) return kiln_fail(KILN_ERR_FORMAT, "%s: not JSON (line %d: %s)", path, err.line, err.text);
    json_t *model = json_object_get(root, "model"), *vmap = json_object_get(model, "vocab");
    const char *type = json_string_value(json_object_get(model, "type"));
    if (!type || strcmp(type, "BPE") != 0)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: a %s tokenizer; kiln convert reads byte-level BPE tokenizer.json files", path,
                         type ? type : "typeless");
    if (!(*pre = pre_name(model, json_object_get(root, "pre_tokenizer"))))
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: the pre_tokenizer is not one kiln recognises (byte-level GPT-2, Llama 3, Qwen2, "
                                               "SmolLM); a SentencePiece-style tokenizer.json needs its tokenizer.model",
                         path);
    if (!json_is_object(vmap)) return kiln_fail(KILN_ERR_FORMAT, "%s: model.vocab is not an object", path);
    const char *tok;
    json_t *idv;
    kiln_status s = KILN_OK;
    json_object_foreach(vmap, tok, idv) {
        if (!json_is_integer(idv)) return kiln_fail(KILN_ERR_FORMAT, "%s: the id of token '%s' is not an integer", path, tok);
        if ((s = vocab_set(v, json_integer_value(idv), tok, strlen(tok), 0.0f, TT_NORMAL))) return s;
    }
    json_t *added = json_object_get(root, "added_tokens");
    for (size_t i = 0; i < json_array_size(added); i++) {
        json_t *e = json_array_get(added, i), *id = json_object_get(e, "id");
        if (!json_is_integer(id)) return kiln_fail(KILN_ERR_FORMAT, "%s: added token %zu has no integer id", path, i);
        if ((s = add_added(v, json_integer_value(id), e, path))) return s;
    }
    return read_merges(json_object_get(model, "merges"), path, merges);
}

/* tokenizer.json's post_processor: a TemplateProcessing (maybe inside a Sequence) whose single template starts
 * (ends) with a special token adds BOS (EOS). */
static void template_adds(json_t *root, int *add_bos, int *add_eos) {
    json_t *pp = json_object_get(root, "post_processor");
    if (is_type(pp, "Sequence")) {
        json_t *list = json_object_get(pp, "processors");
        pp = NULL;
        for (size_t i = 0; i < json_array_size(list); i++)
            if (is_type(json_array_get(list, i), "TemplateProcessing")) pp = json_array_get(list, i);
    }
    json_t *single = is_type(pp, "TemplateProcessing") ? json_object_get(pp, "single") : NULL;
    size_t n = json_array_size(single);
    if (!n) return;
    *add_bos = json_object_get(json_array_get(single, 0), "SpecialToken") != NULL;
    *add_eos = n > 1 && json_object_get(json_array_get(single, n - 1), "SpecialToken") != NULL;
}

/* ---------------------------------------------------------------- tokenizer.model (SentencePiece protobuf) */

typedef struct pb {
    const uint8_t *p, *end;
} pb;

static bool pb_varint(pb *b, uint64_t *out) {
    uint64_t v = 0;
    for (int shift = 0; shift < 64 && b->p < b->end; shift += 7) {
        uint8_t c = *b->p++;
        v |= (uint64_t)(c & 0x7f) << shift;
        if (!(c & 0x80)) {
            *out = v;
            return true;
        }
    }
    return false;
}

/* The next field: its number, wire type, and for wire type 2 its bytes, for 0 its value. Skips 1 and 5. */
static bool pb_field(pb *b, uint32_t *field, int *wt, pb *sub, uint64_t *val) {
    uint64_t key, len;
    if (!pb_varint(b, &key)) return false;
    *field = (uint32_t)(key >> 3), *wt = (int)(key & 7);
    switch (*wt) {
    case 0: return pb_varint(b, val);
    case 1:
        if (b->end - b->p < 8) return false;
        memcpy(val, b->p, 8), b->p += 8;
        return true;
    case 5: {
        uint32_t u;
        if (b->end - b->p < 4) return false;
        memcpy(&u, b->p, 4), b->p += 4, *val = u;
        return true;
    }
    case 2:
        if (!pb_varint(b, &len) || len > (uint64_t)(b->end - b->p)) return false;
        sub->p = b->p, sub->end = b->p + len, b->p += len;
        return true;
    default: return false;
    }
}

/* SentencePiece {1: piece, 2: score (float), 3: type (default NORMAL)}. */
static kiln_status spm_piece(pb m, int64_t id, vocab *v, const char *path) {
    pb sub = {0}, text = {NULL, NULL};
    uint32_t f;
    int wt;
    uint64_t val = 0;
    float score = 0;
    int32_t type = TT_NORMAL;
    while (m.p < m.end) {
        if (!pb_field(&m, &f, &wt, &sub, &val)) return kiln_fail(KILN_ERR_FORMAT, "%s: piece %lld is not valid protobuf", path, (long long)id);
        if (f == 1 && wt == 2) text = sub;
        else if (f == 2 && wt == 5) {
            uint32_t u = (uint32_t)val;
            memcpy(&score, &u, 4);
        } else if (f == 3 && wt == 0) {
            if (val < TT_NORMAL || val > TT_BYTE)
                return kiln_fail(KILN_ERR_FORMAT, "%s: piece %lld has type %llu (1..6)", path, (long long)id, (unsigned long long)val);
            type = (int32_t)val;
        }
    }
    if (!text.p) return kiln_fail(KILN_ERR_FORMAT, "%s: piece %lld has no text", path, (long long)id);
    return vocab_set(v, id, (const char *)text.p, (size_t)(text.end - text.p), score, type);
}

/* ModelProto {1: pieces (repeated), 2: trainer_spec {40 unk_id, 41 bos_id, 42 eos_id, 43 pad_id},
 * 3: normalizer_spec {3: add_dummy_prefix, default true}}. The trainer spec's ids are kept for when no JSON names
 * them; add_dummy_prefix is llama.cpp's add_space_prefix (false in Gemma's models, which llama.cpp's gemma
 * converters write as a constant). */
static kiln_status read_spm(const char *path, vocab *v, int64_t spec_ids[4], bool *dummy_prefix) {
    uint8_t *buf;
    size_t n;
    kiln_status s = read_all(path, &buf, &n);
    if (s) return s;
    pb b = {buf, buf + n}, sub;
    uint32_t f;
    int wt;
    uint64_t val;
    int64_t id = 0;
    while (!s && b.p < b.end) {
        if (!pb_field(&b, &f, &wt, &sub, &val)) s = kiln_fail(KILN_ERR_FORMAT, "%s: not a SentencePiece model (bad protobuf at byte %lld)", path,
                                                              (long long)(b.p - buf));
        else if (f == 1 && wt == 2) s = spm_piece(sub, id++, v, path);
        else if (f == 2 && wt == 2) {
            pb ts = sub, x;
            while (!s && ts.p < ts.end) {
                if (!pb_field(&ts, &f, &wt, &x, &val)) s = kiln_fail(KILN_ERR_FORMAT, "%s: the trainer spec is not valid protobuf", path);
                else if (wt == 0 && f >= 40 && f <= 43) spec_ids[f - 40] = (int64_t)(int32_t)(uint32_t)val;
            }
        } else if (f == 3 && wt == 2) {
            pb ns = sub, x;
            while (!s && ns.p < ns.end) {
                if (!pb_field(&ns, &f, &wt, &x, &val)) s = kiln_fail(KILN_ERR_FORMAT, "%s: the normalizer spec is not valid protobuf", path);
                else if (wt == 0 && f == 3) *dummy_prefix = val != 0;
            }
        }
    }
    if (!s && id == 0) s = kiln_fail(KILN_ERR_FORMAT, "%s: a SentencePiece model with no pieces", path);
    free(buf);
    return s;
}

/* ---------------------------------------------------------------- special tokens, template */

/* A tokenizer_config.json token: a string or {"content": ...}. */
static const char *token_content(json_t *cfg, const char *key) {
    json_t *t = json_object_get(cfg, key);
    return json_is_object(t) ? json_string_value(json_object_get(t, "content")) : json_string_value(t);
}

/* config.json's id: an integer or a list (the first). */
static int64_t config_id(json_t *cfg, const char *key) {
    json_t *t = json_object_get(cfg, key);
    if (json_is_array(t)) t = json_array_get(t, 0);
    return json_is_integer(t) ? json_integer_value(t) : -1;
}

static const struct {
    const char *tc_key, *config_key, *gguf_key;
    size_t off;
} special_ids[] = {
    {"bos_token", "bos_token_id", "tokenizer.ggml.bos_token_id", offsetof(vocab, bos)},
    {"eos_token", "eos_token_id", "tokenizer.ggml.eos_token_id", offsetof(vocab, eos)},
    {"unk_token", "unk_token_id", "tokenizer.ggml.unknown_token_id", offsetof(vocab, unk)},
    {"pad_token", "pad_token_id", "tokenizer.ggml.padding_token_id", offsetof(vocab, pad)},
};

static void find_specials(vocab *v, json_t *tc, json_t *cfg) {
    for (size_t i = 0; i < sizeof special_ids / sizeof special_ids[0]; i++) {
        int64_t *id = (int64_t *)((char *)v + special_ids[i].off);
        const char *content = token_content(tc, special_ids[i].tc_key);
        int64_t found = content ? vocab_find(v, content) : -1;
        if (found < 0) found = config_id(cfg, special_ids[i].config_key);
        if (found >= 0 && found < v->n) *id = found;
    }
}

static kiln_status write_template(kiln_gguf_writer *w, const char *dir, json_t *tc) {
    char path[4096];
    if (exists(dir, "chat_template.jinja", path, sizeof path)) {
        uint8_t *t;
        size_t n;
        kiln_status s = read_all(path, &t, &n);
        if (s) return s;
        if (memchr(t, 0, n)) s = kiln_fail(KILN_ERR_FORMAT, "%s holds a NUL byte", path);
        if (!s) s = kiln_gguf_writer_set_str(w, "tokenizer.chat_template", (const char *)t);
        free(t);
        return s;
    }
    json_t *ct = json_object_get(tc, "chat_template");
    if (json_is_string(ct)) return kiln_gguf_writer_set_str(w, "tokenizer.chat_template", json_string_value(ct));
    /* a list of {name, template}: "default" is the template, the others tokenizer.chat_template.<name> */
    for (size_t i = 0; i < json_array_size(ct); i++) {
        const char *name = json_string_value(json_object_get(json_array_get(ct, i), "name"));
        const char *tmpl = json_string_value(json_object_get(json_array_get(ct, i), "template"));
        if (!name || !tmpl) continue;
        char key[256];
        if (strcmp(name, "default") == 0) snprintf(key, sizeof key, "tokenizer.chat_template");
        else snprintf(key, sizeof key, "tokenizer.chat_template.%s", name);
        kiln_status s = kiln_gguf_writer_set_str(w, key, tmpl);
        if (s) return s;
    }
    return KILN_OK;
}

/* ---------------------------------------------------------------- entry point */

static kiln_status write_vocab(kiln_gguf_writer *w, const vocab *v, bool scores) {
    kiln_status s = kiln_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)v->text, (uint64_t)v->n);
    if (!s && scores) s = kiln_gguf_writer_set_arr(w, "tokenizer.ggml.scores", KILN_GGUF_FLOAT32, v->score, (uint64_t)v->n);
    if (!s) s = kiln_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", KILN_GGUF_INT32, v->type, (uint64_t)v->n);
    for (size_t i = 0; !s && i < sizeof special_ids / sizeof special_ids[0]; i++) {
        int64_t id = *(const int64_t *)((const char *)v + special_ids[i].off);
        if (id >= 0) s = kiln_gguf_writer_set_u32(w, special_ids[i].gguf_key, (uint32_t)id);
    }
    return s;
}

kiln_status kiln_hf_tokenizer_write(kiln_gguf_writer *w, const char *dir, const kiln_hf_tok_params *p) {
    char spm_path[4096], json_path[4096];
    bool has_spm = exists(dir, "tokenizer.model", spm_path, sizeof spm_path);
    bool has_json = exists(dir, "tokenizer.json", json_path, sizeof json_path);
    if (!has_spm && !has_json) return kiln_fail(KILN_ERR_NOT_FOUND, "%s: neither tokenizer.json nor tokenizer.model is there", dir);
    bool spm = has_spm && (p->prefer_spm || !has_json);
    vocab v = {.bos = -1, .eos = -1, .unk = -1, .pad = -1};
    bpe_merges merges = {0};
    json_t *tc = NULL, *cfg = NULL, *tj = NULL;
    const char *pre = NULL;
    int64_t spec[4] = {-1, -1, -1, -1}; /* unk, bos, eos, pad */
    int add_bos = -1, add_eos = -1;
    bool dummy_prefix = true;
    kiln_status s = opt_json(dir, "tokenizer_config.json", &tc);
    if (!s) s = opt_json(dir, "config.json", &cfg);
    if (!s) s = spm ? read_spm(spm_path, &v, spec, &dummy_prefix) : read_bpe(json_path, &v, &merges, &pre, &tj);
    /* SentencePiece: tokenizer_config.json's added tokens type (and extend) the pieces */
    json_t *dec = spm ? json_object_get(tc, "added_tokens_decoder") : NULL;
    const char *ids;
    json_t *e;
    json_object_foreach(dec, ids, e) {
        if (s) break;
        char *endp;
        long long id = strtoll(ids, &endp, 10);
        if (*endp || id < 0) s = kiln_fail(KILN_ERR_FORMAT, "%s/tokenizer_config.json: added token id '%s' is not a number", dir, ids);
        else s = add_added(&v, id, e, "tokenizer_config.json");
    }
    if (!s) s = vocab_pad(&v, p->n_rows, spm ? spm_path : json_path);
    if (!s) {
        find_specials(&v, tc, cfg);
        if (spm) {
            int64_t *dst[4] = {&v.unk, &v.bos, &v.eos, &v.pad};
            for (int i = 0; i < 4; i++)
                if (*dst[i] < 0 && spec[i] >= 0 && spec[i] < v.n) *dst[i] = spec[i];
        }
        if (tj) template_adds(tj, &add_bos, &add_eos);
        json_t *b = json_object_get(tc, "add_bos_token"), *eo = json_object_get(tc, "add_eos_token");
        if (json_is_boolean(b)) add_bos = json_is_true(b);
        if (json_is_boolean(eo)) add_eos = json_is_true(eo);
    }
    if (!s) s = kiln_gguf_writer_set_str(w, "tokenizer.ggml.model", spm ? "llama" : "gpt2");
    if (!s) s = kiln_gguf_writer_set_str(w, "tokenizer.ggml.pre", spm ? "default" : pre); /* llama.cpp's for SentencePiece */
    if (!s) s = write_vocab(w, &v, spm);
    if (!s && !spm)
        s = kiln_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", (const char *const *)merges.m, (uint64_t)merges.n);
    if (!s && add_bos >= 0) s = kiln_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", add_bos);
    if (!s && add_eos >= 0) s = kiln_gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", add_eos);
    json_t *asp = json_object_get(tc, "add_prefix_space");
    if (!s && spm && !dummy_prefix) s = kiln_gguf_writer_set_bool(w, "tokenizer.ggml.add_space_prefix", false);
    else if (!s && json_is_boolean(asp)) s = kiln_gguf_writer_set_bool(w, "tokenizer.ggml.add_space_prefix", json_is_true(asp));
    if (!s) s = write_template(w, dir, tc);
    vocab_free(&v);
    merges_free(&merges);
    json_decref(tc);
    json_decref(cfg);
    json_decref(tj);
    return s;
}
