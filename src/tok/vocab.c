/* vocab.c: loading a tokenizer's vocabulary from GGUF metadata or a llama2.c tokenizer.bin into the hash indexes
 * that lookup.c reads (token text -> id, merge (left, right) -> rank), and dispatching to the family's init.
 *
 * GGUF keys read (llama.cpp's names): tokenizer.ggml.model, .pre, .tokens, .scores, .token_type, .merges,
 * .bos_token_id, .eos_token_id, .unknown_token_id, .padding_token_id, .seperator_token_id (sic),
 * .cls_token_id, .mask_token_id, .add_bos_token, .add_eos_token, .add_space_prefix.
 * Defaults when a key is absent follow llama.cpp: SPM adds BOS and a space prefix, BPE adds neither,
 * WordPiece adds [CLS] ... [SEP]. An id that names no token is an error naming the key. */
#include "tok.h"
#include "status.h"
#include "file.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t pow2_at_least(uint64_t n) {
    uint64_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

/* Builds the text index. Later duplicates of a text keep the first id, as llama.cpp's token_to_id map does. */
static kiln_status build_index(kiln_tokenizer *t) {
    t->index_cap = pow2_at_least((uint64_t)t->n_vocab * 2);
    t->index = calloc((size_t)t->index_cap, sizeof *t->index);
    if (!t->index) return kiln_fail(KILN_ERR_NOMEM, "out of memory for the token index");
    uint64_t mask = t->index_cap - 1;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        const tok_entry *e = &t->tokens[id];
        for (uint64_t h = kiln_tok_hash_text(e->text, e->len) & mask;; h = (h + 1) & mask) {
            uint32_t v = t->index[h];
            if (v == 0) {
                t->index[h] = (uint32_t)id + 1;
                break;
            }
            const tok_entry *o = &t->tokens[v - 1];
            if (o->len == e->len && memcmp(o->text, e->text, e->len) == 0) break;
        }
    }
    return KILN_OK;
}

/* ---------------------------------------------------------------- building the vocab */

static kiln_tokenizer *tokenizer_new(void) {
    kiln_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->bos = t->eos = t->unk = t->pad = t->sep = t->cls = t->mask = -1;
    for (int b = 0; b < 256; b++) t->byte_token[b] = -1;
    strcpy(t->pre, "default");
    return t;
}

/* Copies n token texts into one pool. texts[i] has lens[i] bytes. */
static kiln_status fill_tokens(kiln_tokenizer *t, const kiln_str *texts, int32_t n) {
    uint64_t total = 0;
    for (int32_t i = 0; i < n; i++) {
        if (texts[i].len > UINT32_MAX) return kiln_fail(KILN_ERR_FORMAT, "token %d is %llu bytes long", i, (unsigned long long)texts[i].len);
        total += texts[i].len + 1;
    }
    t->tokens = calloc((size_t)n, sizeof *t->tokens);
    t->pool = malloc((size_t)total ? (size_t)total : 1);
    if (!t->tokens || !t->pool) return kiln_fail(KILN_ERR_NOMEM, "out of memory for %d tokens", n);
    char *p = t->pool;
    for (int32_t i = 0; i < n; i++) {
        memcpy(p, texts[i].ptr, (size_t)texts[i].len);
        p[texts[i].len] = 0;
        t->tokens[i] = (tok_entry){.text = p, .len = (uint32_t)texts[i].len, .type = KILN_TOKEN_NORMAL};
        p += texts[i].len + 1;
    }
    t->n_vocab = n;
    return KILN_OK;
}

static int cmp_special_len(const void *a, const void *b, void *ctx) {
    const kiln_tokenizer *t = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (t->tokens[x].len != t->tokens[y].len) return t->tokens[x].len > t->tokens[y].len ? -1 : 1;
    return x < y ? -1 : x > y;
}

/* llama.cpp's cache_special_tokens: control, user-defined and unknown-type tokens can be cut out of text. */
static bool is_special_type(kiln_token_type ty) {
    return ty == KILN_TOKEN_CONTROL || ty == KILN_TOKEN_USER_DEFINED || ty == KILN_TOKEN_UNKNOWN;
}

/* Everything derived from the token list once it is complete. */
static kiln_status finish_vocab(kiln_tokenizer *t) {
    kiln_status s = build_index(t);
    if (s) return s;
    int32_t n_special = 0;
    for (int32_t id = 0; id < t->n_vocab; id++)
        n_special += is_special_type(t->tokens[id].type);
    t->specials = malloc((size_t)(n_special ? n_special : 1) * sizeof *t->specials);
    if (!t->specials) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    for (int32_t id = 0; id < t->n_vocab; id++)
        if (is_special_type(t->tokens[id].type) && t->tokens[id].len)
            t->specials[t->n_specials++] = id;
    qsort_r(t->specials, (size_t)t->n_specials, sizeof *t->specials, cmp_special_len, t);
    if (t->kind == TOK_SPM) {
        char name[8];
        for (int b = 0; b < 256; b++) {
            snprintf(name, sizeof name, "<0x%02X>", b);
            t->byte_token[b] = kiln_tok_find(t, name, 6);
        }
        /* streaming is safe when no token joins a word to what precedes its ▁ (U+2581, e2 96 81) */
        t->spm_stream_safe = true;
        for (int32_t id = 0; id < t->n_vocab && t->spm_stream_safe; id++) {
            const tok_entry *e = &t->tokens[id];
            for (uint32_t i = 1; i + 3 <= e->len; i++)
                if (memcmp(e->text + i, "\xe2\x96\x81", 3) == 0 && !(i >= 3 && memcmp(e->text + i - 3, "\xe2\x96\x81", 3) == 0)) {
                    t->spm_stream_safe = false;
                    break;
                }
        }
    } else if (t->kind == TOK_BPE) {
        char buf[4];
        for (int b = 0; b < 256; b++) t->byte_token[b] = kiln_tok_find(t, buf, (size_t)kiln_utf8_encode(kiln_bpe_byte_to_cp[b], buf));
    }
    return KILN_OK;
}

/* ---------------------------------------------------------------- from GGUF */

static kiln_status optional_id(const kiln_gguf *g, kiln_tokenizer *t, const char *key, int32_t *out) {
    const kiln_gguf_value *v = kiln_gguf_find(g, key);
    if (!v) return KILN_OK;
    int64_t id;
    kiln_status s = kiln_gguf_get_i64(g, key, &id);
    if (s) return s;
    if (id < 0 || id >= t->n_vocab) {
        /* llama.cpp files use -1 (as u32 0xFFFFFFFF) for "none" */
        if (id == UINT32_MAX || id == -1) return KILN_OK;
        return kiln_fail(KILN_ERR_RANGE, "%s: key '%s' names token %lld, outside the vocab of %d", kiln_gguf_path(g), key,
                         (long long)id, t->n_vocab);
    }
    *out = (int32_t)id;
    return KILN_OK;
}

static kiln_status optional_bool(const kiln_gguf *g, const char *key, bool *out) {
    if (!kiln_gguf_find(g, key)) return KILN_OK;
    return kiln_gguf_get_bool(g, key, out);
}

static kiln_status load_merges(const kiln_gguf *g, kiln_tokenizer *t) {
    const kiln_gguf_value *m;
    if (!kiln_gguf_find(g, "tokenizer.ggml.merges"))
        return kiln_fail(KILN_ERR_NOT_FOUND, "%s: missing metadata key 'tokenizer.ggml.merges' (needed by a gpt2 tokenizer)", kiln_gguf_path(g));
    kiln_status s = kiln_gguf_get_arr(g, "tokenizer.ggml.merges", KILN_GGUF_STRING, &m);
    if (s) return s;
    if (m->arr.n > INT32_MAX) return kiln_fail(KILN_ERR_FORMAT, "%s: too many merges", kiln_gguf_path(g));
    t->merge_cap = pow2_at_least(m->arr.n * 2);
    t->merge_keys = malloc((size_t)t->merge_cap * sizeof *t->merge_keys);
    t->merge_ranks = malloc((size_t)t->merge_cap * sizeof *t->merge_ranks);
    if (!t->merge_keys || !t->merge_ranks) return kiln_fail(KILN_ERR_NOMEM, "out of memory for %llu merges", (unsigned long long)m->arr.n);
    memset(t->merge_keys, 0xFF, (size_t)t->merge_cap * sizeof *t->merge_keys);
    uint64_t mask = t->merge_cap - 1;
    for (uint64_t i = 0; i < m->arr.n; i++) {
        kiln_str ms = m->arr.items ? m->arr.items[i].str : (kiln_str){0};
        /* "left right": BPE token texts never hold a plain space (it is Ġ), so the first space splits */
        const char *sp = ms.len ? memchr(ms.ptr + 1, ' ', (size_t)ms.len - 1) : NULL;
        if (!sp)
            return kiln_fail(KILN_ERR_FORMAT, "%s: merge %llu '%.*s' is not two tokens separated by a space", kiln_gguf_path(g),
                             (unsigned long long)i, (int)(ms.len > 64 ? 64 : ms.len), ms.ptr);
        int32_t left = kiln_tok_find(t, ms.ptr, (size_t)(sp - ms.ptr));
        int32_t right = kiln_tok_find(t, sp + 1, (size_t)(ms.ptr + ms.len - sp - 1));
        if (left < 0 || right < 0) continue; /* a merge of texts the vocab lacks can never apply */
        uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
        for (uint64_t h = kiln_tok_hash_pair(key) & mask;; h = (h + 1) & mask) {
            if (t->merge_keys[h] == key) break; /* a repeated merge keeps its first (best) rank */
            if (t->merge_keys[h] == UINT64_MAX) {
                t->merge_keys[h] = key;
                t->merge_ranks[h] = (int32_t)i;
                break;
            }
        }
        t->n_merges++;
    }
    return KILN_OK;
}

/* llama.cpp's per-model strip attributes, which GGUF does not store: it sets them from general.name,
 * general.architecture and the pre-tokenizer name (llama_vocab::impl::load, "set attributes by model"). */
static void set_strip_attrs(const kiln_gguf *g, kiln_tokenizer *t) {
    char name[128] = "", arch[64] = "";
    kiln_str v;
    if (kiln_gguf_find(g, "general.name") && kiln_gguf_get_str(g, "general.name", &v) == KILN_OK)
        snprintf(name, sizeof name, "%.*s", (int)(v.len < 127 ? v.len : 127), v.ptr);
    if (kiln_gguf_find(g, "general.architecture") && kiln_gguf_get_str(g, "general.architecture", &v) == KILN_OK)
        snprintf(arch, sizeof arch, "%.*s", (int)(v.len < 63 ? v.len : 63), v.ptr);
    for (char *c = name; *c; c++) *c = (char)(*c >= 'A' && *c <= 'Z' ? *c + 32 : *c);
    int32_t id;
    if (strstr(t->pre, "jina-v2-de") || strstr(t->pre, "jina-v2-es") || strstr(t->pre, "jina-v2-code") ||
        strstr(arch, "nomic-bert-moe") || strstr(arch, "jina-bert-v3")) {
        if ((id = kiln_tok_find(t, "<mask>", 6)) >= 0) t->tokens[id].strip |= TOK_LSTRIP;
    } else if (strstr(name, "phi-3") || strstr(name, "phi3")) {
        for (int32_t i = 0; i < t->n_specials; i++) t->tokens[t->specials[i]].strip |= TOK_RSTRIP;
        if ((id = kiln_tok_find(t, "</s>", 4)) >= 0) t->tokens[id].strip |= TOK_RSTRIP;
        static const char *const keep[] = {"<unk>", "<s>", "<|endoftext|>"};
        for (int k = 0; k < 3; k++)
            if ((id = kiln_tok_find(t, keep[k], strlen(keep[k]))) >= 0) t->tokens[id].strip &= (uint8_t)~TOK_RSTRIP;
    } else if (strstr(name, "modern-bert")) {
        if ((id = kiln_tok_find(t, "[MASK]", 6)) >= 0) t->tokens[id].strip |= TOK_LSTRIP;
    }
}

kiln_status kiln_tokenizer_load_gguf(const kiln_gguf *g, kiln_tokenizer **out) {
    *out = NULL;
    const char *path = kiln_gguf_path(g);
    kiln_str model;
    kiln_status s = kiln_gguf_get_str(g, "tokenizer.ggml.model", &model);
    if (s) return s;
    kiln_tokenizer *t = tokenizer_new();
    if (!t) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    kiln_str *texts = NULL;
    snprintf(t->model, sizeof t->model, "%.*s", (int)(model.len < 15 ? model.len : 15), model.ptr);
    if (strcmp(t->model, "llama") == 0) {
        t->kind = TOK_SPM;
        t->add_bos = true, t->add_space_prefix = true;
    } else if (strcmp(t->model, "gpt2") == 0) {
        t->kind = TOK_BPE;
    } else if (strcmp(t->model, "bert") == 0) {
        t->kind = TOK_WPM;
        t->add_bos = t->add_eos = true;
    } else {
        s = kiln_fail(KILN_ERR_UNSUPPORTED, "%s: tokenizer model '%.*s' is not supported (kiln reads llama, gpt2 and bert)", path,
                      (int)(model.len > 32 ? 32 : model.len), model.ptr);
        goto fail;
    }
    kiln_str pre;
    if (kiln_gguf_find(g, "tokenizer.ggml.pre")) {
        if ((s = kiln_gguf_get_str(g, "tokenizer.ggml.pre", &pre))) goto fail;
        if (pre.len >= sizeof t->pre) {
            s = kiln_fail(KILN_ERR_UNSUPPORTED, "%s: pre-tokenizer name of %llu bytes is too long", path, (unsigned long long)pre.len);
            goto fail;
        }
        memcpy(t->pre, pre.ptr, (size_t)pre.len);
        t->pre[pre.len] = 0;
    }
    const kiln_gguf_value *toks, *scores = NULL, *types = NULL;
    if ((s = kiln_gguf_get_arr(g, "tokenizer.ggml.tokens", KILN_GGUF_STRING, &toks))) goto fail;
    if (toks->arr.n == 0 || toks->arr.n > INT32_MAX - 1) {
        s = kiln_fail(KILN_ERR_FORMAT, "%s: key 'tokenizer.ggml.tokens' holds %llu tokens", path, (unsigned long long)toks->arr.n);
        goto fail;
    }
    int32_t n = (int32_t)toks->arr.n;
    if (kiln_gguf_find(g, "tokenizer.ggml.scores") && (s = kiln_gguf_get_arr(g, "tokenizer.ggml.scores", KILN_GGUF_FLOAT32, &scores))) goto fail;
    if (kiln_gguf_find(g, "tokenizer.ggml.token_type") && (s = kiln_gguf_get_arr(g, "tokenizer.ggml.token_type", KILN_GGUF_INT32, &types))) goto fail;
    if ((scores && scores->arr.n != (uint64_t)n) || (types && types->arr.n != (uint64_t)n)) {
        s = kiln_fail(KILN_ERR_FORMAT, "%s: %llu scores and %llu token types for %d tokens", path,
                      (unsigned long long)(scores ? scores->arr.n : 0), (unsigned long long)(types ? types->arr.n : 0), n);
        goto fail;
    }
    texts = malloc((size_t)n * sizeof *texts);
    if (!texts) {
        s = kiln_fail(KILN_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (int32_t i = 0; i < n; i++) texts[i] = toks->arr.items[i].str;
    if ((s = fill_tokens(t, texts, n))) goto fail;
    for (int32_t i = 0; i < n; i++) {
        if (scores) t->tokens[i].score = (float)kiln_gguf_arr_f64(scores, (uint64_t)i);
        if (types) {
            int64_t ty = kiln_gguf_arr_i64(types, (uint64_t)i);
            if (ty < KILN_TOKEN_NORMAL || ty > KILN_TOKEN_BYTE) {
                s = kiln_fail(KILN_ERR_FORMAT, "%s: token %d has type %lld (valid: 1..6)", path, i, (long long)ty);
                goto fail;
            }
            t->tokens[i].type = (kiln_token_type)ty;
        }
    }
    if (t->kind == TOK_SPM) t->bos = 1 < n ? 1 : -1, t->eos = 2 < n ? 2 : -1, t->unk = 0;
    if (t->kind == TOK_WPM) t->unk = 100 < n ? 100 : -1, t->cls = 101 < n ? 101 : -1, t->sep = 102 < n ? 102 : -1;
    if ((s = optional_id(g, t, "tokenizer.ggml.bos_token_id", &t->bos)) || (s = optional_id(g, t, "tokenizer.ggml.eos_token_id", &t->eos)) ||
        (s = optional_id(g, t, "tokenizer.ggml.unknown_token_id", &t->unk)) ||
        (s = optional_id(g, t, "tokenizer.ggml.padding_token_id", &t->pad)) ||
        (s = optional_id(g, t, "tokenizer.ggml.seperator_token_id", &t->sep)) ||
        (s = optional_id(g, t, "tokenizer.ggml.cls_token_id", &t->cls)) ||
        (s = optional_id(g, t, "tokenizer.ggml.mask_token_id", &t->mask)) ||
        (s = optional_bool(g, "tokenizer.ggml.add_bos_token", &t->add_bos)) ||
        (s = optional_bool(g, "tokenizer.ggml.add_eos_token", &t->add_eos)) ||
        (s = optional_bool(g, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix)))
        goto fail;
    if ((s = finish_vocab(t))) goto fail;
    set_strip_attrs(g, t);
    if (t->kind == TOK_BPE && ((s = load_merges(g, t)) || (s = kiln_bpe_init(t)))) goto fail;
    if (t->kind == TOK_WPM && (s = kiln_wpm_init(t))) goto fail;
    free(texts);
    *out = t;
    return KILN_OK;
fail:
    free(texts);
    kiln_tokenizer_free(t);
    return s;
}

/* ---------------------------------------------------------------- llama2.c tokenizer.bin
 * int32 max_token_length, then per token: float32 score, int32 length, bytes. The file does not store the
 * count: tokens run to the end of the file. Ids 0, 1, 2 are <unk>, <s>, </s>; "<0xHH>" pieces are bytes. */

/* llama2.c's export wrote SentencePiece's ▁ (U+2581) as a plain space; this puts the ▁ back, so the vocab
 * reads as a GGUF one does. The texts then point into *out (malloc'd). */
static kiln_status restore_spm_spaces(kiln_str *texts, int32_t n, char **out) {
    uint64_t total = 1;
    for (int32_t i = 0; i < n; i++) {
        total += texts[i].len;
        for (uint64_t j = 0; j < texts[i].len; j++) total += texts[i].ptr[j] == ' ' ? 2 : 0;
    }
    char *p = *out = malloc((size_t)total);
    if (!p) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    for (int32_t i = 0; i < n; i++) {
        const char *src = texts[i].ptr;
        uint64_t len = texts[i].len;
        texts[i].ptr = p;
        for (uint64_t j = 0; j < len; j++) {
            if (src[j] == ' ') memcpy(p, "\xe2\x96\x81", 3), p += 3;
            else *p++ = src[j];
        }
        texts[i].len = (uint64_t)(p - texts[i].ptr);
    }
    return KILN_OK;
}

static kiln_status load_llama2c(const char *path, const uint8_t *buf, size_t size, kiln_tokenizer **out) {
    kiln_tokenizer *t = tokenizer_new();
    kiln_str *texts = NULL;
    float *scores = NULL;
    char *spaced = NULL;
    kiln_status s;
    if (!t) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    strcpy(t->model, "llama");
    t->kind = TOK_SPM;
    t->add_bos = true, t->add_space_prefix = true;
    size_t pos = 4, cap = 0;
    int32_t n = 0;
    if (size < 4) {
        s = kiln_fail(KILN_ERR_FORMAT, "%s: truncated at byte 0: max_token_length needs 4 bytes", path);
        goto fail;
    }
    while (pos < size) {
        int32_t len;
        if (size - pos < 8) {
            s = kiln_fail(KILN_ERR_FORMAT, "%s: truncated at byte %zu: token %d needs a score and a length", path, pos, n);
            goto fail;
        }
        memcpy(&len, buf + pos + 4, 4);
        if (len < 0 || (size_t)len > size - pos - 8) {
            s = kiln_fail(KILN_ERR_FORMAT, "%s: token %d at byte %zu: length %d runs past the end of the file", path, n, pos, len);
            goto fail;
        }
        if ((size_t)n == cap) {
            cap = cap ? cap * 2 : 1024;
            kiln_str *nt = realloc(texts, cap * sizeof *nt);
            float *ns = nt ? realloc(scores, cap * sizeof *ns) : NULL;
            if (nt) texts = nt;
            if (ns) scores = ns;
            if (!nt || !ns) {
                s = kiln_fail(KILN_ERR_NOMEM, "out of memory");
                goto fail;
            }
        }
        memcpy(&scores[n], buf + pos, 4);
        texts[n] = (kiln_str){(const char *)buf + pos + 8, (uint64_t)len};
        pos += 8 + (size_t)len;
        n++;
    }
    if (n < 3) {
        s = kiln_fail(KILN_ERR_FORMAT, "%s: only %d tokens (a llama2.c vocab starts with <unk> <s> </s>)", path, n);
        goto fail;
    }
    if ((s = restore_spm_spaces(texts, n, &spaced)) || (s = fill_tokens(t, texts, n))) goto fail;
    for (int32_t i = 0; i < n; i++) {
        tok_entry *e = &t->tokens[i];
        e->score = scores[i];
        unsigned hex;
        char tail;
        if (i == 0) e->type = KILN_TOKEN_UNKNOWN;
        else if (i <= 2) e->type = KILN_TOKEN_CONTROL;
        else if (e->len == 6 && sscanf(e->text, "<0x%2X%c", &hex, &tail) == 2 && tail == '>') e->type = KILN_TOKEN_BYTE;
    }
    t->unk = 0, t->bos = 1, t->eos = 2;
    if ((s = finish_vocab(t))) goto fail;
    free(texts);
    free(scores);
    free(spaced);
    *out = t;
    return KILN_OK;
fail:
    free(texts);
    free(scores);
    free(spaced);
    kiln_tokenizer_free(t);
    return s;
}

kiln_status kiln_tokenizer_load_file(const char *path, kiln_tokenizer **out) {
    *out = NULL;
    FILE *f;
    kiln_status fs = kiln_fopen_regular(path, &f);
    if (fs) return fs;
    char magic[4] = {0};
    size_t got = fread(magic, 1, 4, f);
    if (got == 4 && memcmp(magic, "GGUF", 4) == 0) {
        fclose(f);
        kiln_gguf *g;
        kiln_status s = kiln_gguf_open(path, &g);
        if (s) return s;
        s = kiln_tokenizer_load_gguf(g, out);
        kiln_gguf_close(g);
        return s;
    }
    /* llama2.c vocabularies are small (hundreds of KB): read the whole file */
    if (fseek(f, 0, SEEK_END) != 0) {
        fclose(f);
        return kiln_fail(KILN_ERR_IO, "%s: cannot seek", path);
    }
    long size = ftell(f);
    if (size < 0 || size > (1L << 30)) {
        fclose(f);
        return kiln_fail(KILN_ERR_FORMAT, "%s: not a GGUF file, and %ld bytes is no llama2.c tokenizer", path, size);
    }
    uint8_t *buf = malloc((size_t)size + 1);
    rewind(f);
    if (!buf || fread(buf, 1, (size_t)size, f) != (size_t)size) {
        free(buf);
        fclose(f);
        return kiln_fail(KILN_ERR_IO, "%s: read failed", path);
    }
    fclose(f);
    kiln_status s = load_llama2c(path, buf, (size_t)size, out);
    free(buf);
    return s;
}

void kiln_tokenizer_free(kiln_tokenizer *t) {
    if (!t) return;
    kiln_bpe_free(t);
    kiln_wpm_free(t);
    free(t->tokens);
    free(t->pool);
    free(t->index);
    free(t->merge_keys);
    free(t->merge_ranks);
    free(t->specials);
    free(t);
}

/* ---------------------------------------------------------------- accessors */

int32_t kiln_tokenizer_n_vocab(const kiln_tokenizer *t) { return t->n_vocab; }
const char *kiln_tokenizer_model(const kiln_tokenizer *t) { return t->model; }
int32_t kiln_tokenizer_bos(const kiln_tokenizer *t) { return t->bos; }
int32_t kiln_tokenizer_eos(const kiln_tokenizer *t) { return t->eos; }

kiln_token_type kiln_tokenizer_token_type(const kiln_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_vocab ? t->tokens[id].type : KILN_TOKEN_UNDEFINED;
}

kiln_str kiln_tokenizer_token_text(const kiln_tokenizer *t, int32_t id) {
    if (id < 0 || id >= t->n_vocab) return (kiln_str){"", 0};
    return (kiln_str){t->tokens[id].text, t->tokens[id].len};
}
