/* lookup.c: what the loader (vocab.c) and the three families (spm.c, bpe.c, wpm.c) share: UTF-8 decoding and
 * encoding, GPT-2's byte alphabet, token-id lists, and the hash lookups token text -> id and merge (left, right)
 * -> rank over the indexes vocab.c builds. It calls nothing of theirs. Tested through tests/test_tokenizer.c. */
#include "tok.h"
#include "status.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- UTF-8 */

int kiln_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp) {
    if (n == 0) return 0;
    unsigned char c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    int len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
    if (len == 0 || (size_t)len > n || c > 0xF4) return 0;
    uint32_t v = c & (0x7F >> len);
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        v = v << 6 | (s[i] & 0x3F);
    }
    static const uint32_t min_of_len[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (v < min_of_len[len] || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
    *cp = v;
    return len;
}

int kiln_utf8_encode(uint32_t cp, char *out) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | cp >> 6);
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | cp >> 12);
        out[1] = (char)(0x80 | (cp >> 6 & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | cp >> 18);
    out[1] = (char)(0x80 | (cp >> 12 & 0x3F));
    out[2] = (char)(0x80 | (cp >> 6 & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* ---------------------------------------------------------------- GPT-2's byte alphabet */

/* Bytes '!'..'~', 0xA1..0xAC and 0xAE..0xFF stand for themselves; the other 68 take U+0100.. in byte order. */
const uint16_t kiln_bpe_byte_to_cp[256] = {
    0x100, 0x101, 0x102, 0x103, 0x104, 0x105, 0x106, 0x107, 0x108, 0x109, 0x10A, 0x10B, 0x10C, 0x10D, 0x10E, 0x10F,
    0x110, 0x111, 0x112, 0x113, 0x114, 0x115, 0x116, 0x117, 0x118, 0x119, 0x11A, 0x11B, 0x11C, 0x11D, 0x11E, 0x11F,
    0x120, 0x21, 0x22, 0x23, 0x24, 0x25, 0x26, 0x27, 0x28, 0x29, 0x2A, 0x2B, 0x2C, 0x2D, 0x2E, 0x2F,
    0x30, 0x31, 0x32, 0x33, 0x34, 0x35, 0x36, 0x37, 0x38, 0x39, 0x3A, 0x3B, 0x3C, 0x3D, 0x3E, 0x3F,
    0x40, 0x41, 0x42, 0x43, 0x44, 0x45, 0x46, 0x47, 0x48, 0x49, 0x4A, 0x4B, 0x4C, 0x4D, 0x4E, 0x4F,
    0x50, 0x51, 0x52, 0x53, 0x54, 0x55, 0x56, 0x57, 0x58, 0x59, 0x5A, 0x5B, 0x5C, 0x5D, 0x5E, 0x5F,
    0x60, 0x61, 0x62, 0x63, 0x64, 0x65, 0x66, 0x67, 0x68, 0x69, 0x6A, 0x6B, 0x6C, 0x6D, 0x6E, 0x6F,
    0x70, 0x71, 0x72, 0x73, 0x74, 0x75, 0x76, 0x77, 0x78, 0x79, 0x7A, 0x7B, 0x7C, 0x7D, 0x7E, 0x121,
    0x122, 0x123, 0x124, 0x125, 0x126, 0x127, 0x128, 0x129, 0x12A, 0x12B, 0x12C, 0x12D, 0x12E, 0x12F, 0x130, 0x131,
    0x132, 0x133, 0x134, 0x135, 0x136, 0x137, 0x138, 0x139, 0x13A, 0x13B, 0x13C, 0x13D, 0x13E, 0x13F, 0x140, 0x141,
    0x142, 0xA1, 0xA2, 0xA3, 0xA4, 0xA5, 0xA6, 0xA7, 0xA8, 0xA9, 0xAA, 0xAB, 0xAC, 0x143, 0xAE, 0xAF,
    0xB0, 0xB1, 0xB2, 0xB3, 0xB4, 0xB5, 0xB6, 0xB7, 0xB8, 0xB9, 0xBA, 0xBB, 0xBC, 0xBD, 0xBE, 0xBF,
    0xC0, 0xC1, 0xC2, 0xC3, 0xC4, 0xC5, 0xC6, 0xC7, 0xC8, 0xC9, 0xCA, 0xCB, 0xCC, 0xCD, 0xCE, 0xCF,
    0xD0, 0xD1, 0xD2, 0xD3, 0xD4, 0xD5, 0xD6, 0xD7, 0xD8, 0xD9, 0xDA, 0xDB, 0xDC, 0xDD, 0xDE, 0xDF,
    0xE0, 0xE1, 0xE2, 0xE3, 0xE4, 0xE5, 0xE6, 0xE7, 0xE8, 0xE9, 0xEA, 0xEB, 0xEC, 0xED, 0xEE, 0xEF,
    0xF0, 0xF1, 0xF2, 0xF3, 0xF4, 0xF5, 0xF6, 0xF7, 0xF8, 0xF9, 0xFA, 0xFB, 0xFC, 0xFD, 0xFE, 0xFF,
};

static int16_t remapped_byte[0x44]; /* byte of code point U+0100 + i */
static pthread_once_t remapped_once = PTHREAD_ONCE_INIT;

static void build_remapped(void) {
    for (int b = 0; b < 256; b++)
        if (kiln_bpe_byte_to_cp[b] >= 0x100) remapped_byte[kiln_bpe_byte_to_cp[b] - 0x100] = (int16_t)b;
}

int kiln_bpe_cp_to_byte(uint32_t cp) {
    if (cp >= 0x100 && cp <= 0x143) {
        pthread_once(&remapped_once, build_remapped);
        return remapped_byte[cp - 0x100];
    }
    if (cp < 0x100 && kiln_bpe_byte_to_cp[cp] == cp) return (int)cp;
    return -1;
}

/* ---------------------------------------------------------------- token ids */

void kiln_tokens_free(kiln_tokens *t) {
    if (!t) return;
    free(t->ids);
    t->ids = NULL;
    t->n = t->cap = 0;
}

kiln_status kiln_tokens_push(kiln_tokens *out, int32_t id) {
    if (out->n == out->cap) {
        size_t cap = out->cap ? out->cap * 2 : 64;
        int32_t *ids = realloc(out->ids, cap * sizeof *ids);
        if (!ids) return kiln_fail(KILN_ERR_NOMEM, "out of memory for %zu token ids", cap);
        out->ids = ids;
        out->cap = cap;
    }
    out->ids[out->n++] = id;
    return KILN_OK;
}

/* ---------------------------------------------------------------- hashing */

uint64_t kiln_tok_hash_text(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ULL;
    return h;
}

uint64_t kiln_tok_hash_pair(uint64_t x) { /* splitmix64 finalizer */
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

int32_t kiln_tok_find(const kiln_tokenizer *t, const char *text, size_t len) {
    uint64_t mask = t->index_cap - 1;
    for (uint64_t h = kiln_tok_hash_text(text, len) & mask;; h = (h + 1) & mask) {
        uint32_t v = t->index[h];
        if (v == 0) return -1;
        const tok_entry *e = &t->tokens[v - 1];
        if (e->len == len && memcmp(e->text, text, len) == 0) return (int32_t)(v - 1);
    }
}

int32_t kiln_tok_merge_rank(const kiln_tokenizer *t, int32_t left, int32_t right) {
    if (!t->merge_cap) return -1;
    uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right, mask = t->merge_cap - 1;
    for (uint64_t h = kiln_tok_hash_pair(key) & mask;; h = (h + 1) & mask) {
        if (t->merge_keys[h] == UINT64_MAX) return -1;
        if (t->merge_keys[h] == key) return t->merge_ranks[h];
    }
}
