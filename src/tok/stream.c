/* stream.c: encoding a file of any size in bounded memory.
 *
 * The file is read in chunks of 1 MiB. Each chunk is cut at the last place where the family guarantees
 * that encoding the two sides apart gives the ids of encoding them together, the part before the cut is
 * encoded and emitted, and the rest is carried into the next chunk:
 *   SPM: before a space that starts a word (non-space before it and after it), when no token of the vocab
 *        holds a ▁ after a non-▁ character (t->spm_stream_safe), so no token can span the cut and no merge
 *        crosses it; the second part gets no dummy prefix.
 *   BPE: after a newline that follows a non-space ASCII byte and precedes an ASCII letter. The pre-tokenizer
 *        regexes have no look-behind, a newline there is always a piece of its own ("\n" matched by \s+ or
 *        \s*[\r\n]+), and BPE merges never cross pieces. (A newline after spaces is avoided: GPT-2's
 *        \s+(?!\S) would take "  \n" whole at the end of a chunk but only "  " inside the text.)
 *   WPM: after a space: words never span whitespace.
 * No cut goes through or next to a special token the encoder would cut out of the text.
 * Text with no cut point grows the buffer: memory is bounded by the longest stretch between
 * cut points, time stays linear. tests/test_tokenizer.c checks streamed ids against whole-text ids. */
#include "tok.h"
#include "status.h"
#include "file.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK (1u << 20)

static bool is_ascii_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
static bool is_ascii_letter(unsigned char c) { return (c | 0x20) >= 'a' && (c | 0x20) <= 'z'; }

/* Whether a special token the encoder would cut out of the text (user-defined ones always, the rest with
 * parse_special) lies across the cut at p or touches it. Across, it would be split; touching, the text next to
 * it could lose whitespace (llama.cpp's lstrip/rstrip) or, for SPM, get the dummy prefix that follows a
 * special token: either way the two sides encoded apart would differ from the whole. */
static bool special_at_cut(const kiln_tokenizer *t, const unsigned char *b, size_t len, size_t p, bool parse_special) {
    for (int32_t i = 0; i < t->n_specials; i++) {
        const tok_entry *e = &t->tokens[t->specials[i]];
        if (!parse_special && e->type != KILN_TOKEN_USER_DEFINED) continue;
        size_t first = p > e->len ? p - e->len : 0;
        for (size_t start = first; start <= p && start + e->len <= len; start++) {
            if (memcmp(b + start, e->text, e->len) == 0) return true;
        }
    }
    return false;
}

/* The last safe cut in buf[0..len), or 0 if there is none. b[len] must be readable. */
static size_t safe_cut(const kiln_tokenizer *t, const unsigned char *b, size_t len, bool parse_special) {
    if (t->kind == TOK_SPM && !t->spm_stream_safe) return 0;
    for (size_t p = len - 1; p >= 2; p--) {
        bool ok = false;
        switch (t->kind) {
        case TOK_SPM: ok = b[p] == ' ' && b[p - 1] != ' ' && b[p + 1] != ' '; break;
        case TOK_BPE: ok = b[p - 1] == '\n' && is_ascii_letter(b[p]) && b[p - 2] < 0x80 && !is_ascii_space(b[p - 2]); break;
        case TOK_WPM: ok = b[p - 1] == ' '; break;
        }
        if (ok && !special_at_cut(t, b, len + 1, p, parse_special)) return p;
    }
    return 0;
}

static kiln_status emit_tokens(kiln_tokens *ids, kiln_tokens_emit_fn emit, void *ud) {
    kiln_status s = ids->n ? emit(ud, ids->ids, ids->n) : KILN_OK;
    ids->n = 0;
    return s;
}

kiln_status kiln_tokenizer_encode_file(const kiln_tokenizer *t, const char *path, bool add_special, bool parse_special,
                                       kiln_tokens_emit_fn emit, void *ud) {
    FILE *f;
    kiln_status fs = kiln_fopen_regular(path, &f);
    if (fs) return fs;
    size_t cap = 2 * CHUNK, len = 0;
    unsigned char *buf = malloc(cap + 1);
    kiln_tokens ids = {0};
    kiln_status s = KILN_OK;
    bool at_start = true, eof = false;
    int32_t first = -1, last = -1;
    if (add_special) kiln_tok_special_ends(t, &first, &last);
    if (!buf) {
        fclose(f);
        return kiln_fail(KILN_ERR_NOMEM, "out of memory for a %zu-byte read buffer", cap);
    }
    if (first >= 0) s = kiln_tokens_push(&ids, first);
    while (!s && !eof) {
        if (cap - len < CHUNK) { /* no cut point in the carried text: grow */
            unsigned char *nb = realloc(buf, cap * 2 + 1);
            if (!nb) {
                s = kiln_fail(KILN_ERR_NOMEM, "%s: out of memory: no cut point in %zu bytes of text", path, len);
                break;
            }
            buf = nb, cap *= 2;
        }
        size_t got = fread(buf + len, 1, CHUNK, f);
        if (got < CHUNK) {
            if (ferror(f)) {
                s = kiln_fail(KILN_ERR_IO, "%s: read failed at byte %zu", path, len);
                break;
            }
            eof = true;
        }
        len += got;
        size_t cut = eof ? len : len > 3 ? safe_cut(t, buf, len - 1, parse_special) : 0;
        if (cut == 0) continue;
        if ((s = kiln_tok_encode_part(t, (const char *)buf, cut, parse_special, at_start, &ids)) || (s = emit_tokens(&ids, emit, ud))) break;
        at_start = false;
        memmove(buf, buf + cut, len - cut);
        len -= cut;
    }
    if (!s && last >= 0 && !(s = kiln_tokens_push(&ids, last))) s = emit_tokens(&ids, emit, ud);
    fclose(f);
    free(buf);
    kiln_tokens_free(&ids);
    return s;
}
