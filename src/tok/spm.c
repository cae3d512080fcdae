/* spm.c: SentencePiece-style encoding, as llama.cpp's llm_tokenizer_spm does it (llama-vocab.cpp).
 * Spaces become ▁ (U+2581), a dummy ▁ starts the first fragment, the text splits into UTF-8 characters, and
 * the adjacent pair whose concatenation is the highest-scoring token merges first (ties: the leftmost) until
 * no pair is a token. Each symbol left is then a token, or goes out as <0xHH> byte tokens (byte fallback).
 * Tested by tests/test_tokenizer.c against llama.cpp's vectors for llama-spm and phi-3, and tok512.bin. */
#include "tok.h"
#include "status.h"

#include <stdlib.h>
#include <string.h>

/* A symbol is a span of the escaped text; merged symbols keep their left index and the right one empties. */
typedef struct spm_sym {
    int32_t prev, next; /* neighbours in the chain, -1 at the ends */
    uint32_t off, n;    /* bytes of the escaped text; n == 0 once merged into its left neighbour */
    int32_t id;         /* the token this symbol is, -1 while unknown (single characters) */
} spm_sym;

typedef struct spm_pair {
    float score;        /* of the token the two symbols make */
    int32_t left, right;
    uint32_t size;      /* left.n + right.n when queued: a pair whose symbols changed since is stale */
    int32_t id;
} spm_pair;

typedef struct spm_heap {
    spm_pair *a;
    size_t n, cap;
} spm_heap;

/* std::priority_queue order of llm_bigram_spm: higher score first, then the smaller left index. */
static bool pair_before(const spm_pair *x, const spm_pair *y) {
    return x->score > y->score || (x->score == y->score && x->left < y->left);
}

static kiln_status heap_push(spm_heap *h, spm_pair p) {
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 64;
        spm_pair *a = realloc(h->a, cap * sizeof *a);
        if (!a) return kiln_fail(KILN_ERR_NOMEM, "out of memory for %zu SPM merge candidates", cap);
        h->a = a, h->cap = cap;
    }
    size_t i = h->n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!pair_before(&p, &h->a[parent])) break;
        h->a[i] = h->a[parent];
        i = parent;
    }
    h->a[i] = p;
    return KILN_OK;
}

static spm_pair heap_pop(spm_heap *h) {
    spm_pair top = h->a[0], last = h->a[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && pair_before(&h->a[c + 1], &h->a[c])) c++;
        if (!pair_before(&h->a[c], &last)) break;
        h->a[i] = h->a[c];
        i = c;
    }
    if (h->n) h->a[i] = last;
    return top;
}

/* Queues (left, right) if their concatenation is a token. llama.cpp looks the text up among all tokens,
 * control ones included, and so does this. */
static kiln_status try_pair(const kiln_tokenizer *t, const char *buf, const spm_sym *sym, int32_t left, int32_t right, spm_heap *h) {
    if (left < 0 || right < 0) return KILN_OK;
    uint32_t size = sym[left].n + sym[right].n;
    int32_t id = kiln_tok_find(t, buf + sym[left].off, size);
    if (id < 0) return KILN_OK;
    return heap_push(h, (spm_pair){.score = t->tokens[id].score, .left = left, .right = right, .size = size, .id = id});
}

/* A byte with no token of its own: "<0xHH>", else the one-byte text (llama.cpp's byte_to_token), else unk. */
static kiln_status push_byte(const kiln_tokenizer *t, unsigned char b, kiln_tokens *out) {
    int32_t id = t->byte_token[b];
    if (id < 0) id = kiln_tok_find(t, (const char *)&b, 1);
    if (id < 0) id = t->unk;
    if (id < 0) return kiln_fail(KILN_ERR_UNSUPPORTED, "byte 0x%02X has no token (no <0x%02X>, no unknown token) in this vocab", b, b);
    return kiln_tokens_push(out, id);
}

/* Merges and emits buf[0..n), one stretch of escaped text; sym has room for n symbols. */
static kiln_status encode_segment(const kiln_tokenizer *t, const char *buf, size_t n, spm_sym *sym, spm_heap *heap, kiln_tokens *out) {
    size_t n_sym = 0;
    kiln_status s = KILN_OK;
    heap->n = 0;
    /* One symbol per UTF-8 character. llama.cpp takes the length from the lead byte alone, so an invalid
     * byte swallows the bytes after it (a ▁ among them, which then decodes as bytes, not as a space); here
     * an invalid byte is a symbol of its own. Valid UTF-8 splits the same either way. */
    for (size_t off = 0; off < n;) {
        uint32_t cp;
        int len = kiln_utf8_decode((const unsigned char *)buf + off, n - off, &cp);
        if (len == 0) len = 1;
        sym[n_sym] = (spm_sym){.prev = (int32_t)n_sym - 1, .next = off + (size_t)len == n ? -1 : (int32_t)n_sym + 1,
                               .off = (uint32_t)off, .n = (uint32_t)len, .id = -1};
        n_sym++;
        off += (size_t)len;
    }
    for (size_t i = 1; i < n_sym && !s; i++) s = try_pair(t, buf, sym, (int32_t)i - 1, (int32_t)i, heap);

    while (heap->n && !s) {
        spm_pair p = heap_pop(heap);
        spm_sym *l = &sym[p.left], *r = &sym[p.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != p.size) continue; /* one side merged since it was queued */
        l->n += r->n;
        l->id = p.id;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) sym[r->next].prev = p.left;
        if (!(s = try_pair(t, buf, sym, l->prev, p.left, heap))) s = try_pair(t, buf, sym, p.left, l->next, heap);
    }

    /* Every merged symbol is a token by construction, so llama.cpp's rev_merge re-split never fires:
     * what is left to resolve are single characters, as a token or byte by byte. */
    for (int32_t i = n_sym ? 0 : -1; i >= 0 && !s; i = sym[i].next) {
        int32_t id = sym[i].id >= 0 ? sym[i].id : kiln_tok_find(t, buf + sym[i].off, sym[i].n);
        if (id >= 0) {
            s = kiln_tokens_push(out, id);
            continue;
        }
        for (uint32_t j = 0; j < sym[i].n && !s; j++) s = push_byte(t, (unsigned char)buf[sym[i].off + j], out);
    }
    return s;
}

/* Where the stretch starting at buf[from] ends: before the next ▁ that follows a character other than ▁.
 * With spm_stream_safe no token holds a ▁ after another character, so no merge can cross that point and the
 * stretches merge independently, in the same order the whole text would (ties go by position, kept within a
 * stretch). Small stretches keep the merge queue in cache: this is most of the speed. */
static size_t segment_end(const char *buf, size_t from, size_t n) {
    for (size_t p = from + 1; p + 3 <= n;) {
        const char *hit = memmem(buf + p, n - p, "\xe2\x96\x81", 3);
        if (!hit) break;
        p = (size_t)(hit - buf);
        if (!(p >= from + 3 && memcmp(buf + p - 3, "\xe2\x96\x81", 3) == 0)) return p;
        p += 3;
    }
    return n;
}

/* Natural text repeats its words, so long texts remember the ids of recent stretches: a direct-mapped table
 * keyed by the stretch's bytes, whose ids are the ones already written to out. */
#define SPM_CACHE_SLOTS 4096
#define SPM_CACHE_MIN_TEXT 4096 /* shorter texts skip the cache: clearing it would cost more than it saves */

typedef struct spm_cache_slot {
    uint64_t hash;
    size_t seg_off, out_off; /* the stretch in the escaped text; its ids in out->ids */
    uint32_t seg_len, n_ids; /* seg_len 0: empty slot */
} spm_cache_slot;

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ULL;
    return h;
}

kiln_status kiln_spm_encode(const kiln_tokenizer *t, const char *text, size_t len, bool first, kiln_tokens *out) {
    /* the escaped text is at most 3 bytes per input byte plus the prefix, and its offsets are 32-bit */
    if (len > (INT32_MAX - 3) / 3)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "a text fragment of %zu bytes is too long for SPM encoding (at most %d)", len, (INT32_MAX - 3) / 3);
    if (len == 0) return KILN_OK; /* llama.cpp makes no fragment of empty text, so no lone dummy prefix */
    size_t n_buf = 0;
    char *buf = malloc(3 * len + 3);
    spm_sym *sym = malloc((len + 1) * sizeof *sym);
    bool use_cache = t->spm_stream_safe && len >= SPM_CACHE_MIN_TEXT;
    spm_cache_slot *cache = use_cache ? calloc(SPM_CACHE_SLOTS, sizeof *cache) : NULL;
    spm_heap heap = {0};
    kiln_status s = KILN_OK;
    if (!buf || !sym || (use_cache && !cache)) {
        s = kiln_fail(KILN_ERR_NOMEM, "out of memory for SPM encoding of %zu bytes", len);
        goto done;
    }
    if (first && t->add_space_prefix) memcpy(buf, "\xe2\x96\x81", 3), n_buf = 3;
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') memcpy(buf + n_buf, "\xe2\x96\x81", 3), n_buf += 3;
        else buf[n_buf++] = text[i];
    }
    for (size_t from = 0, end; from < n_buf && !s; from = end) {
        end = t->spm_stream_safe ? segment_end(buf, from, n_buf) : n_buf;
        size_t n = end - from;
        if (!cache) {
            s = encode_segment(t, buf + from, n, sym, &heap, out);
            continue;
        }
        uint64_t h = hash_bytes(buf + from, n);
        spm_cache_slot *c = &cache[h & (SPM_CACHE_SLOTS - 1)];
        if (c->seg_len == n && c->hash == h && memcmp(buf + c->seg_off, buf + from, n) == 0) {
            for (uint32_t i = 0; i < c->n_ids && !s; i++) s = kiln_tokens_push(out, out->ids[c->out_off + i]);
            continue;
        }
        size_t before = out->n;
        s = encode_segment(t, buf + from, n, sym, &heap, out);
        *c = (spm_cache_slot){.hash = h, .seg_off = from, .out_off = before, .seg_len = (uint32_t)n, .n_ids = (uint32_t)(out->n - before)};
    }
done:
    free(buf);
    free(sym);
    free(cache);
    free(heap.a);
    return s;
}
