/* tok.h: the tokenizer's insides, shared by the loader (vocab.c), the dispatcher and special-token
 * handling (tokenize.c), the lookups they all use (lookup.c) and the three families: spm.c
 * (SentencePiece-style), bpe.c (byte-level BPE with PCRE2 pre-tokenizers) and wpm.c (WordPiece). */
#ifndef KILN_TOK_H
#define KILN_TOK_H

#include "kiln.h"

typedef enum tok_kind { TOK_SPM, TOK_BPE, TOK_WPM } tok_kind;

typedef struct tok_entry {
    const char *text; /* into the tokenizer's text pool, NUL-terminated (texts with a NUL use len) */
    uint32_t len;
    float score;
    kiln_token_type type;
    uint8_t strip; /* TOK_LSTRIP | TOK_RSTRIP: cutting this special out of text also drops the whitespace beside it */
} tok_entry;

enum { TOK_LSTRIP = 1, TOK_RSTRIP = 2 };

struct kiln_tokenizer {
    tok_kind kind;
    char model[16];        /* tokenizer.ggml.model */
    char pre[64];          /* tokenizer.ggml.pre, "default" when absent */
    int32_t n_vocab;
    tok_entry *tokens;     /* (n_vocab) */
    char *pool;            /* every token text, back to back */
    uint32_t *index;       /* text -> id, open addressing: 0 empty, else id + 1 */
    uint64_t index_cap;
    /* BPE merges: (left id, right id) -> rank, open addressing over packed 64-bit keys */
    uint64_t *merge_keys;  /* (merge_cap) key = (uint64_t)left << 32 | right, UINT64_MAX empty */
    int32_t *merge_ranks;  /* (merge_cap) */
    uint64_t merge_cap;
    int32_t n_merges;
    /* special ids, -1 when absent */
    int32_t bos, eos, unk, pad, sep, cls, mask;
    bool add_bos, add_eos, add_space_prefix;
    /* SPM: id of "<0xHH>" for each byte (-1 if absent); BPE: id of the one-character token for each byte */
    int32_t byte_token[256];
    /* control, user-defined and unknown-type tokens, longest text first, for parse_special */
    int32_t *specials;
    int32_t n_specials;
    bool spm_stream_safe; /* SPM: no token has a ▁ after a non-▁ character, so text may be cut before a word */
    void *bpe;            /* bpe.c's compiled pre-tokenizer, freed by kiln_bpe_free */
    void *wpm;            /* wpm.c's state, freed by kiln_wpm_free */
};

/* lookup.c: the hashes vocab.c builds its indexes with (open addressing, linear probing), and the lookups */
uint64_t kiln_tok_hash_text(const char *s, size_t n);   /* FNV-1a */
uint64_t kiln_tok_hash_pair(uint64_t left_right);       /* splitmix64's finalizer of (left << 32 | right) */
int32_t kiln_tok_find(const kiln_tokenizer *t, const char *text, size_t len); /* -1 if absent */
int32_t kiln_tok_merge_rank(const kiln_tokenizer *t, int32_t left, int32_t right); /* -1 if no such merge */
kiln_status kiln_tokens_push(kiln_tokens *out, int32_t id);

/* tokenize.c: encodes text without BOS/EOS; at_start says the text begins the input (SPM's dummy prefix
 * goes there). kiln_tokenizer_encode is BOS + this + EOS; stream.c calls it chunk by chunk. */
kiln_status kiln_tok_encode_part(const kiln_tokenizer *t, const char *text, size_t len, bool parse_special, bool at_start,
                                 kiln_tokens *out);
/* tokenize.c: the ids add_special puts before and after the text, -1 for none: BOS/EOS as add_bos/add_eos say,
 * always [CLS] ... [SEP] for WordPiece (llama.cpp). */
void kiln_tok_special_ends(const kiln_tokenizer *t, int32_t *first, int32_t *last);

/* The families. Each encodes one fragment (no special tokens inside, no BOS/EOS) and appends ids.
 * first says the fragment starts the text or follows a special token (SPM adds its dummy prefix there). */
kiln_status kiln_spm_encode(const kiln_tokenizer *t, const char *text, size_t len, bool first, kiln_tokens *out);
kiln_status kiln_bpe_encode(const kiln_tokenizer *t, const char *text, size_t len, kiln_tokens *out);
kiln_status kiln_wpm_encode(const kiln_tokenizer *t, const char *text, size_t len, kiln_tokens *out);
/* Called by the loader once the vocab is read; free accepts a tokenizer whose init never ran. */
kiln_status kiln_bpe_init(kiln_tokenizer *t);
void kiln_bpe_free(kiln_tokenizer *t);
/* The BPE pre-tokenizer alone (for tests): *ends (malloc'd, n entries) gets the end of each word, in bytes of text
 * (of llama.cpp's U+FFFD replacement of it when text is not valid UTF-8). */
kiln_status kiln_bpe_split(const kiln_tokenizer *t, const char *text, size_t len, size_t **ends, size_t *n);
kiln_status kiln_wpm_init(kiln_tokenizer *t);
void kiln_wpm_free(kiln_tokenizer *t);

/* lookup.c: GPT-2's byte <-> unicode alphabet: byte b is the code point kiln_bpe_byte_to_cp[b]; printable Latin-1
 * bytes map to themselves, the rest to U+0100 upwards. */
extern const uint16_t kiln_bpe_byte_to_cp[256];
int kiln_bpe_cp_to_byte(uint32_t cp); /* -1 if cp is not in the alphabet */

/* lookup.c: decodes one UTF-8 sequence at s[0..n): returns its length (1..4) and the code point, or 0 if invalid
 * (overlong, surrogate, > U+10FFFF, truncated). */
int kiln_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp);
int kiln_utf8_encode(uint32_t cp, char *out); /* returns 1..4 */

#endif
