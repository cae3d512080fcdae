/* wpm.c: WordPiece (BERT) encoding, as llama.cpp's llm_tokenizer_wpm does it (llama-vocab.cpp).
 * The text is cut into words, with llama.cpp's BertNormalizer defaults (lowercase and strip_accents on; kiln
 * does not read the tokenizer.ggml.normalizer.* keys that can turn them off): each code point is mapped to
 * the first code point of its NFD decomposition (é -> e; a Hangul syllable keeps only its leading jamo) and
 * lowercased; whitespace ends a word; control characters (Cc Cf Co Cs), accent marks (\p{M}), U+0000 and
 * U+FFFD vanish; punctuation, ASCII symbols and CJK ideographs are words of their own; anything else
 * (unassigned code points too) joins the word. Each word, with a ▁ before it, is then cut greedily into the
 * longest tokens from the left; a word that cannot be cut entirely becomes the unknown token. llama.cpp's
 * converter stores BERT's word-initial pieces with that ▁ and its "##" continuations bare, so the lookups
 * match the vocab as stored. Character classes come from utf8proc (Unicode 15); llama.cpp's tables come from
 * UnicodeData.txt and Python's unicodedata.
 * Tested by tests/test_tokenizer.c against llama.cpp's vectors for bert-bge. */
#include "tok.h"
#include "status.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

typedef struct wpm_state {
    uint32_t max_len; /* longest token text in bytes: no match can be longer */
} wpm_state;

kiln_status kiln_wpm_init(kiln_tokenizer *t) {
    wpm_state *w = calloc(1, sizeof *w);
    if (!w) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    for (int32_t id = 0; id < t->n_vocab; id++)
        if (t->tokens[id].len > w->max_len) w->max_len = t->tokens[id].len;
    t->wpm = w;
    return KILN_OK;
}

void kiln_wpm_free(kiln_tokenizer *t) {
    if (!t) return;
    free(t->wpm);
    t->wpm = NULL;
}

/* llama.cpp's unicode_cpt_from_utf8: lenient (overlong forms and surrogates pass), and an invalid byte is
 * U+FFFD on its own. Lead bytes F5..F7 give values past U+10FFFF, which llama.cpp cannot re-encode (it
 * throws); they become U+FFFD here. */
static uint32_t decode_lenient(const unsigned char *s, size_t n, size_t *adv) {
    unsigned char c = s[0];
    int len = c < 0x80 ? 1 : !(c & 0x40) ? 0 : !(c & 0x20) ? 2 : !(c & 0x10) ? 3 : !(c & 0x08) ? 4 : 0;
    *adv = 1;
    if (len == 0 || (size_t)len > n) return 0xFFFD;
    uint32_t cp = len == 1 ? c : c & (0x7F >> len);
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0xFFFD;
        cp = cp << 6 | (s[i] & 0x3F);
    }
    *adv = (size_t)len;
    return cp > 0x10FFFF ? 0xFFFD : cp;
}

/* llama.cpp's unicode_set_whitespace: the White_Space property. */
static bool is_whitespace(uint32_t cp) {
    return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
           cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

/* llama.cpp's is_chinese_char, with its 0x2B920 (HF's value) where Unicode says 0x2B820. */
static bool is_chinese(uint32_t cp) {
    return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) || (cp >= 0x20000 && cp <= 0x2A6DF) ||
           (cp >= 0x2A700 && cp <= 0x2B73F) || (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B920 && cp <= 0x2CEAF) ||
           (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

typedef enum { CH_SPACE, CH_DROP, CH_ALONE, CH_JOIN } char_class;

/* Classifies one input code point and gives the (NFD-first, lowercased) code point it contributes. */
static char_class classify(uint32_t cp, uint32_t *outcp) {
    if (cp >= 0x80) { /* llama.cpp's "NFD" keeps the first code point of the canonical decomposition (at most 4) */
        utf8proc_int32_t dec[8];
        int boundclass = 0;
        if (utf8proc_decompose_char((utf8proc_int32_t)cp, dec, 8, UTF8PROC_DECOMPOSE, &boundclass) >= 1) cp = (uint32_t)dec[0];
    }
    if (cp < 0x80) { /* ASCII: every printable non-alphanumeric is \p{P} or \p{S}, so a word of its own */
        *outcp = cp >= 'A' && cp <= 'Z' ? cp + 32 : cp;
        if (is_whitespace(cp)) return CH_SPACE;
        if (cp < 0x20 || cp == 0x7F) return CH_DROP;
        bool alnum = (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z');
        return alnum ? CH_JOIN : CH_ALONE;
    }
    if (is_whitespace(cp)) return CH_SPACE;
    *outcp = (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp);
    switch (utf8proc_category((utf8proc_int32_t)cp)) {
    case UTF8PROC_CATEGORY_CC: case UTF8PROC_CATEGORY_CF: case UTF8PROC_CATEGORY_CS: case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME:
        return CH_DROP;
    case UTF8PROC_CATEGORY_PC: case UTF8PROC_CATEGORY_PD: case UTF8PROC_CATEGORY_PS: case UTF8PROC_CATEGORY_PE:
    case UTF8PROC_CATEGORY_PI: case UTF8PROC_CATEGORY_PF: case UTF8PROC_CATEGORY_PO:
        return CH_ALONE;
    default:
        return cp == 0xFFFD ? CH_DROP : is_chinese(cp) ? CH_ALONE : CH_JOIN;
    }
}

/* Greedy longest-match of w[0..n) (which starts with ▁); the unknown token if some position has no match. */
static kiln_status encode_word(const kiln_tokenizer *t, uint32_t max_len, const char *w, size_t n, kiln_tokens *out) {
    size_t start = out->n;
    for (size_t i = 0; i < n;) {
        size_t j = n - i > (size_t)max_len + 1 ? i + max_len + 1 : n;
        int32_t id = -1;
        for (; j > i; j--)
            if ((id = kiln_tok_find(t, w + i, j - i)) >= 0) break;
        if (id < 0) {
            out->n = start; /* discard the partial word */
            break;
        }
        kiln_status s = kiln_tokens_push(out, id);
        if (s) return s;
        i = j;
    }
    if (out->n > start) return KILN_OK;
    if (t->unk < 0) return kiln_fail(KILN_ERR_UNSUPPORTED, "word '%.*s' has no WordPiece split and the vocab has no unknown token",
                                     (int)(n - 3 > 64 ? 64 : n - 3), w + 3);
    return kiln_tokens_push(out, t->unk);
}

kiln_status kiln_wpm_encode(const kiln_tokenizer *t, const char *text, size_t len, kiln_tokens *out) {
    const wpm_state *st = t->wpm;
    if (!st) return kiln_fail(KILN_ERR_INVALID, "WordPiece state missing: not a bert tokenizer");
    /* a word holds at most 4 bytes per input byte (one code point out per code point in) after its ▁ */
    if (len > (SIZE_MAX - 8) / 4) return kiln_fail(KILN_ERR_NOMEM, "text of %zu bytes is too long", len);
    char *w = malloc(4 * len + 8);
    if (!w) return kiln_fail(KILN_ERR_NOMEM, "out of memory for WordPiece encoding of %zu bytes", len);
    memcpy(w, "\xe2\x96\x81", 3);
    size_t n = 3;
    kiln_status s = KILN_OK;
    const unsigned char *u = (const unsigned char *)text;
    for (size_t i = 0, adv; i < len && !s; i += adv) {
        uint32_t cp = decode_lenient(u + i, len - i, &adv), outcp = cp;
        switch (cp == 0 ? CH_DROP : classify(cp, &outcp)) {
        case CH_DROP:
            break;
        case CH_SPACE:
            if (n > 3) s = encode_word(t, st->max_len, w, n, out);
            n = 3;
            break;
        case CH_ALONE:
            if (n > 3 && (s = encode_word(t, st->max_len, w, n, out))) break;
            n = 3 + (size_t)kiln_utf8_encode(outcp, w + 3);
            s = encode_word(t, st->max_len, w, n, out);
            n = 3;
            break;
        case CH_JOIN:
            n += (size_t)kiln_utf8_encode(outcp, w + n);
            break;
        }
    }
    if (!s && n > 3) s = encode_word(t, st->max_len, w, n, out);
    free(w);
    return s;
}
