/* tokenize.c: the tokenizer entry points. Encoding first cuts the special tokens out of the text, as
 * llama.cpp's tokenizer_st_partition does, hands each plain stretch to its family (spm.c, bpe.c, wpm.c) and
 * adds BOS/EOS ([CLS]/[SEP] for WordPiece); decoding turns ids back into bytes as llama.cpp's
 * token_to_piece does. Tested by tests/test_tokenizer.c (llama.cpp's vectors, round trips, specials). */
#include "tok.h"
#include "status.h"

#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- special tokens in the text
 * llama.cpp takes the special tokens longest first and, for each, cuts every occurrence (leftmost first,
 * not overlapping) out of the stretches of plain text that earlier tokens left. User-defined tokens are cut
 * even without parse_special (HF tokenizers does the same with its non-special added tokens); control and
 * unknown-type tokens only with it; llama.cpp's per-model lstrip/rstrip (vocab.c sets them) drop the whitespace
 * beside a token. Rather than one scan of the text per special token (2,400 of them in
 * deepseek-llm), one pass finds every position where some special starts, through a filter on its first two
 * bytes and the index of texts; the occurrences are then accepted in llama.cpp's order. */

typedef struct special_match {
    size_t pos;
    uint32_t len;
    int32_t id;
    size_t strip_before, strip_after; /* whitespace dropped beside it (the token's lstrip/rstrip) */
} special_match;

static bool is_c_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

static bool special_applies(const kiln_tokenizer *t, int32_t id, bool parse_special) {
    kiln_token_type ty = t->tokens[id].type;
    if (ty == KILN_TOKEN_USER_DEFINED) return true;
    return parse_special && (ty == KILN_TOKEN_CONTROL || ty == KILN_TOKEN_UNKNOWN);
}

/* llama.cpp's order: longer texts first; vocab.c breaks ties by id. Then by position. */
static int cmp_match_order(const void *a, const void *b) {
    const special_match *x = a, *y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    if (x->id != y->id) return x->id < y->id ? -1 : 1;
    return x->pos < y->pos ? -1 : x->pos > y->pos;
}

static int cmp_match_pos(const void *a, const void *b) {
    const special_match *x = a, *y = b;
    return x->pos < y->pos ? -1 : x->pos > y->pos;
}

static kiln_status push_match(special_match **m, size_t *n, size_t *cap, special_match v) {
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 16;
        special_match *p = realloc(*m, c * sizeof *p);
        if (!p) return kiln_fail(KILN_ERR_NOMEM, "out of memory for %zu special-token matches", c);
        *m = p, *cap = c;
    }
    (*m)[(*n)++] = v;
    return KILN_OK;
}

/* The special tokens cut out of text[0..len), in text order, in *out (malloc'd, NULL when none). */
static kiln_status find_specials(const kiln_tokenizer *t, const char *text, size_t len, bool parse_special, special_match **out,
                                 size_t *n_out) {
    *out = NULL, *n_out = 0;
    uint32_t *lens = NULL, n_lens = 0, min_len = UINT32_MAX;
    uint64_t *pair_seen = NULL;      /* (65536 bits) first two bytes of a special of 2+ bytes */
    uint64_t byte_seen[4] = {0};     /* (256 bits) the byte of a one-byte special */
    special_match *occ = NULL;
    size_t n_occ = 0, cap_occ = 0;
    unsigned char *covered = NULL;
    kiln_status s = KILN_OK;
    for (int32_t i = 0; i < t->n_specials; i++) {
        int32_t id = t->specials[i];
        if (!special_applies(t, id, parse_special)) continue;
        uint32_t l = t->tokens[id].len;
        if (l < min_len) min_len = l;
        if (!lens && !(lens = malloc((size_t)t->n_specials * sizeof *lens))) goto nomem;
        if (n_lens == 0 || lens[n_lens - 1] != l) lens[n_lens++] = l; /* specials come longest first */
        const unsigned char *u = (const unsigned char *)t->tokens[id].text;
        if (l == 1) {
            byte_seen[u[0] >> 6] |= 1ull << (u[0] & 63);
            continue;
        }
        if (!pair_seen && !(pair_seen = calloc(1024, sizeof *pair_seen))) goto nomem;
        unsigned k = (unsigned)u[0] << 8 | u[1];
        pair_seen[k >> 6] |= 1ull << (k & 63);
    }
    if (n_lens == 0 || len < min_len) goto done;

    const unsigned char *u = (const unsigned char *)text;
    for (size_t p = 0; p < len; p++) {
        bool one = byte_seen[u[p] >> 6] >> (u[p] & 63) & 1, two = false;
        if (p + 1 < len && pair_seen) {
            unsigned k = (unsigned)u[p] << 8 | u[p + 1];
            two = pair_seen[k >> 6] >> (k & 63) & 1;
        }
        if (!one && !two) continue;
        for (uint32_t j = 0; j < n_lens; j++) {
            uint32_t l = lens[j];
            if (l > len - p || (l == 1 ? !one : !two)) continue;
            int32_t id = kiln_tok_find(t, text + p, l);
            if (id >= 0 && special_applies(t, id, parse_special) &&
                (s = push_match(&occ, &n_occ, &cap_occ, (special_match){.pos = p, .len = l, .id = id})))
                goto done;
        }
    }
    if (n_occ == 0) goto done;

    /* Token by token in llama.cpp's order, an occurrence is cut when all its bytes are still plain text:
     * that is what a left-to-right find within the remaining fragments accepts. A token with lstrip/rstrip
     * also takes the plain whitespace (C isspace) next to it out of the text. */
    qsort(occ, n_occ, sizeof *occ, cmp_match_order);
    if (!(covered = calloc(len, 1))) goto nomem;
    size_t n_acc = 0;
    for (size_t i = 0; i < n_occ; i++) {
        special_match m = occ[i];
        if (memchr(covered + m.pos, 1, m.len)) continue;
        memset(covered + m.pos, 1, m.len);
        uint8_t strip = t->tokens[m.id].strip;
        size_t a = m.pos, b = m.pos + m.len;
        if (strip & TOK_LSTRIP)
            while (a > 0 && !covered[a - 1] && is_c_space(text[a - 1])) covered[--a] = 1;
        if (strip & TOK_RSTRIP)
            while (b < len && !covered[b] && is_c_space(text[b])) covered[b++] = 1;
        m.strip_before = m.pos - a, m.strip_after = b - m.pos - m.len;
        occ[n_acc++] = m;
    }
    qsort(occ, n_acc, sizeof *occ, cmp_match_pos);
    *out = occ, *n_out = n_acc;
    occ = NULL;
    goto done;
nomem:
    s = kiln_fail(KILN_ERR_NOMEM, "out of memory while matching special tokens");
done:
    free(lens);
    free(pair_seen);
    free(occ);
    free(covered);
    return s;
}

/* ---------------------------------------------------------------- encoding */

static kiln_status encode_plain(const kiln_tokenizer *t, const char *text, size_t len, bool first, kiln_tokens *out) {
    switch (t->kind) {
    case TOK_SPM: return kiln_spm_encode(t, text, len, first, out);
    case TOK_BPE: return kiln_bpe_encode(t, text, len, out);
    case TOK_WPM: return kiln_wpm_encode(t, text, len, out);
    }
    return kiln_fail(KILN_ERR_INVALID, "tokenizer of unknown kind %d", (int)t->kind);
}

kiln_status kiln_tok_encode_part(const kiln_tokenizer *t, const char *text, size_t len, bool parse_special, bool at_start,
                                 kiln_tokens *out) {
    special_match *m;
    size_t n_m;
    kiln_status s = find_specials(t, text, len, parse_special, &m, &n_m);
    if (s) return s;
    /* SPM's dummy prefix goes on a stretch at the start or right after a special token (llama.cpp's
     * is_prev_special) */
    bool first = at_start;
    size_t pos = 0;
    for (size_t i = 0; i <= n_m && !s; i++) {
        size_t end = i < n_m ? m[i].pos - m[i].strip_before : len;
        if (end > pos) {
            s = encode_plain(t, text + pos, end - pos, first, out);
            first = false;
        }
        if (i < n_m && !s) {
            s = kiln_tokens_push(out, m[i].id);
            first = true;
            pos = m[i].pos + m[i].len + m[i].strip_after;
        }
    }
    free(m);
    return s;
}

/* llama.cpp: SPM and BPE add BOS/EOS as the vocab's add_bos/add_eos say; WordPiece always wraps the text in
 * [CLS] ... [SEP] (its BOS and separator ids). */
void kiln_tok_special_ends(const kiln_tokenizer *t, int32_t *first, int32_t *last) {
    if (t->kind == TOK_WPM) {
        *first = t->cls >= 0 ? t->cls : t->bos;
        *last = t->sep >= 0 ? t->sep : t->eos;
    } else {
        *first = t->add_bos ? t->bos : -1;
        *last = t->add_eos ? t->eos : -1;
    }
}

kiln_status kiln_tokenizer_encode(const kiln_tokenizer *t, const char *text, size_t len, bool add_special, bool parse_special,
                                  kiln_tokens *out) {
    int32_t first = -1, last = -1;
    if (add_special) kiln_tok_special_ends(t, &first, &last);
    kiln_status s = KILN_OK;
    if (first >= 0 && (s = kiln_tokens_push(out, first))) return s;
    if ((s = kiln_tok_encode_part(t, text, len, parse_special, true, out))) return s;
    if (last >= 0) s = kiln_tokens_push(out, last);
    return s;
}

/* ---------------------------------------------------------------- decoding */

/* Writes bytes into buf while they fit and counts them all. */
typedef struct piece_out {
    char *buf;
    size_t cap, n;
} piece_out;

static void put_bytes(piece_out *o, const char *p, size_t n) {
    if (o->n < o->cap) memcpy(o->buf + o->n, p, n < o->cap - o->n ? n : o->cap - o->n);
    o->n += n;
}

static int hex_digit(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* llama.cpp's token_to_byte: the two characters after "<0x", read as hex (strtol: stops at a non-digit). */
static unsigned char byte_of_token(const tok_entry *e) {
    unsigned v = 0;
    for (uint32_t i = 3; i < 5 && i < e->len && hex_digit(e->text[i]) >= 0; i++) v = v * 16 + (unsigned)hex_digit(e->text[i]);
    return (unsigned char)v;
}

/* llama.cpp's llama_decode_text: each code point of a BPE token stands for one byte of GPT-2's alphabet; one
 * outside it comes out as "[UNK_BYTE_0x<its UTF-8 in hex><the token text>]". */
static void put_bpe_text(piece_out *o, const tok_entry *e) {
    const unsigned char *u = (const unsigned char *)e->text;
    for (size_t i = 0; i < e->len;) {
        uint32_t cp;
        int n = kiln_utf8_decode(u + i, e->len - i, &cp);
        if (n == 0) n = 1, cp = 0xFFFD;
        i += (size_t)n;
        int b = kiln_bpe_cp_to_byte(cp);
        if (b >= 0) {
            char c = (char)b;
            put_bytes(o, &c, 1);
            continue;
        }
        char utf8[4], hex[9];
        int m = kiln_utf8_encode(cp, utf8);
        for (int k = 0; k < m; k++) hex[2 * k] = "0123456789abcdef"[(unsigned char)utf8[k] >> 4], hex[2 * k + 1] = "0123456789abcdef"[utf8[k] & 15];
        put_bytes(o, "[UNK_BYTE_0x", 12);
        put_bytes(o, hex, (size_t)(2 * m));
        put_bytes(o, e->text, e->len);
        put_bytes(o, "]", 1);
    }
}

/* The bytes of one token, as llama.cpp's token_to_piece: control and unknown tokens only when special,
 * user-defined ones as stored; SPM/WordPiece turn ▁ into a space and <0xHH> into its byte; BPE maps its
 * alphabet back to bytes. Byte-type tokens of BPE, unused and undefined tokens give nothing. */
static kiln_status piece_into(const kiln_tokenizer *t, int32_t id, bool special, piece_out *o) {
    if (id < 0 || id >= t->n_vocab) return kiln_fail(KILN_ERR_RANGE, "token id %d is outside the vocab of %d tokens", id, t->n_vocab);
    const tok_entry *e = &t->tokens[id];
    switch (e->type) {
    case KILN_TOKEN_CONTROL:
    case KILN_TOKEN_UNKNOWN:
        if (special) put_bytes(o, e->text, e->len);
        return KILN_OK;
    case KILN_TOKEN_USER_DEFINED:
        put_bytes(o, e->text, e->len);
        return KILN_OK;
    case KILN_TOKEN_NORMAL:
        if (t->kind == TOK_BPE) {
            put_bpe_text(o, e);
            return KILN_OK;
        }
        for (uint32_t i = 0; i < e->len;) {
            if (e->len - i >= 3 && memcmp(e->text + i, "\xe2\x96\x81", 3) == 0) {
                put_bytes(o, " ", 1);
                i += 3;
                continue;
            }
            uint32_t j = i + 1;
            while (j < e->len && !(e->len - j >= 3 && memcmp(e->text + j, "\xe2\x96\x81", 3) == 0)) j++;
            put_bytes(o, e->text + i, j - i);
            i = j;
        }
        return KILN_OK;
    case KILN_TOKEN_BYTE:
        if (t->kind != TOK_BPE) {
            unsigned char b = byte_of_token(e);
            put_bytes(o, (const char *)&b, 1);
        }
        return KILN_OK;
    default:
        return KILN_OK;
    }
}

kiln_status kiln_tokenizer_piece(const kiln_tokenizer *t, int32_t id, bool special, char *buf, size_t cap, size_t *n) {
    piece_out o = {buf, cap, 0};
    kiln_status s = piece_into(t, id, special, &o);
    *n = o.n;
    return s;
}

/* The pieces joined. With add_space_prefix (SPM) the first piece after an optional leading BOS loses one
 * leading space: the dummy prefix the encoder added, as llama2.c does after BOS and llama.cpp's detokenize
 * does for the first token. llama.cpp's clean_spaces pass (" ." -> ".", BERT/GPT-2 style) is not applied:
 * the bytes are exactly the pieces', so byte-level BPE and SPM with byte fallback decode losslessly. */
kiln_status kiln_tokenizer_decode(const kiln_tokenizer *t, const int32_t *ids, size_t n, bool special, char **text, size_t *len) {
    *text = NULL, *len = 0;
    size_t cap = n * 4 + 16, used = 0;
    char *buf = malloc(cap);
    if (!buf) return kiln_fail(KILN_ERR_NOMEM, "out of memory for decoding %zu tokens", n);
    size_t strip_at = n > 0 && t->bos >= 0 && ids[0] == t->bos ? 1 : 0;
    for (size_t i = 0; i < n; i++) {
        piece_out o = {buf + used, cap - used - 1, 0}; /* one byte kept for the NUL */
        kiln_status s = piece_into(t, ids[i], special, &o);
        if (s) {
            free(buf);
            return s;
        }
        if (o.n > cap - used - 1) {
            size_t ncap = cap;
            while (o.n > ncap - used - 1) ncap *= 2;
            char *nb = realloc(buf, ncap);
            if (!nb) {
                free(buf);
                return kiln_fail(KILN_ERR_NOMEM, "out of memory for %zu bytes of decoded text", ncap);
            }
            buf = nb, cap = ncap;
            o = (piece_out){buf + used, cap - used - 1, 0};
            piece_into(t, ids[i], special, &o);
        }
        if (i == strip_at && t->add_space_prefix && o.n > 0 && buf[used] == ' ') {
            memmove(buf + used, buf + used + 1, o.n - 1);
            o.n--;
        }
        used += o.n;
    }
    buf[used] = 0;
    *text = buf, *len = used;
    return KILN_OK;
}
