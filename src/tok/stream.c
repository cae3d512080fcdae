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
 * With parse_special, a special token whose text holds a newline or a space could straddle a cut; then no
 * cut is made. Text with no cut point grows the buffer: memory is bounded by the longest stretch between
 * cut points, time stays linear. tests/test_tokenizer.c checks streamed ids against whole-text ids. */
#include "tok.h"
#include "status.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK (1u << 20)

static bool is_ascii_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
static bool is_ascii_letter(unsigned char c) { return (c | 0x20) >= 'a' && (c | 0x20) <= 'z'; }

/* A special token text that could straddle a cut of this family. */
static bool specials_block_cuts(const kiln_tokenizer *t) {
    for (int32_t i = 0; i < t->n_specials; i++) {
        const tok_entry *e = &t->tokens[t->specials[i]];
        if (memchr(e->text, '\n', e->len) || memchr(e->text, ' ', e->len)) return true;
    }
    return false;
}

/* The last safe cut in buf[0..len), or 0 if there is none. */
static size_t safe_cut(const kiln_tokenizer *t, const unsigned char *b, size_t len) {
    if (t->kind == TOK_SPM && !t->spm_stream_safe) return 0;
    for (size_t p = len - 1; p >= 2; p--) {
        switch (t->kind) {
        case TOK_SPM:
            if (b[p] == ' ' && b[p - 1] != ' ' && b[p + 1] != ' ') return p;
            break;
        case TOK_BPE:
            if (b[p - 1] == '\n' && is_ascii_letter(b[p]) && b[p - 2] < 0x80 && !is_ascii_space(b[p - 2])) return p;
            break;
        case TOK_WPM:
            if (b[p - 1] == ' ') return p;
            break;
        }
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
    FILE *f = fopen(path, "rb");
    if (!f) return kiln_fail(KILN_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 2 * CHUNK, len = 0;
    unsigned char *buf = malloc(cap + 1);
    kiln_tokens ids = {0};
    kiln_status s = KILN_OK;
    bool at_start = true, cuts = !(parse_special && specials_block_cuts(t)), eof = false;
    if (!buf) {
        fclose(f);
        return kiln_fail(KILN_ERR_NOMEM, "out of memory for a %zu-byte read buffer", cap);
    }
    if (add_special && t->add_bos && t->bos >= 0) s = kiln_tokens_push(&ids, t->bos);
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
        size_t cut = eof ? len : cuts && len > 2 ? safe_cut(t, buf, len - 1) : 0;
        if (cut == 0) continue;
        if ((s = kiln_tok_encode_part(t, (const char *)buf, cut, parse_special, at_start, &ids)) || (s = emit_tokens(&ids, emit, ud))) break;
        at_start = false;
        memmove(buf, buf + cut, len - cut);
        len -= cut;
    }
    if (!s && add_special && t->add_eos && t->eos >= 0 && !(s = kiln_tokens_push(&ids, t->eos))) s = emit_tokens(&ids, emit, ud);
    fclose(f);
    free(buf);
    kiln_tokens_free(&ids);
    return s;
}
