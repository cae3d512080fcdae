/* fingerprint.c: kiln_tokenizer_fingerprint (kiln.h), the 64-bit hash of a tokenizer that token shards carry
 * (src/train/data.h), so the trainer refuses shards made by another tokenizer before its first step.
 * tests/test_data.c checks that it is stable across loads and changes with any token, type or merge. */
#include "tok.h"

#include <stdlib.h>
#include <string.h>

/* FNV-1a 64 (Fowler, Noll, Vo): offset basis 14695981039346656037, prime 1099511628211. */
#define FNV_OFFSET 14695981039346656037ull
#define FNV_PRIME 1099511628211ull

static void fnv_bytes(uint64_t *h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) *h = (*h ^ b[i]) * FNV_PRIME;
}

static void fnv_u32(uint64_t *h, uint32_t v) {
    unsigned char b[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16), (unsigned char)(v >> 24)};
    fnv_bytes(h, b, 4);
}

/* A length-prefixed byte string, so ("ab","c") and ("a","bc") hash apart. */
static void fnv_str(uint64_t *h, const char *s, size_t n) {
    fnv_u32(h, (uint32_t)n);
    fnv_bytes(h, s, n);
}

typedef struct merge_rank {
    int32_t rank;
    uint64_t key; /* left << 32 | right */
} merge_rank;

static int cmp_rank(const void *a, const void *b) {
    int32_t x = ((const merge_rank *)a)->rank, y = ((const merge_rank *)b)->rank;
    return (x > y) - (x < y);
}

uint64_t kiln_tokenizer_fingerprint(const kiln_tokenizer *t) {
    uint64_t h = FNV_OFFSET;
    fnv_u32(&h, (uint32_t)t->kind);
    fnv_str(&h, t->model, strnlen(t->model, sizeof t->model));
    fnv_str(&h, t->pre, strnlen(t->pre, sizeof t->pre));
    fnv_u32(&h, (uint32_t)t->n_vocab);
    for (int32_t i = 0; i < t->n_vocab; i++) {
        const tok_entry *e = &t->tokens[i];
        fnv_str(&h, e->text, e->len);
        fnv_u32(&h, (uint32_t)e->type);
        /* SentencePiece merges by score, so for it the scores are the merges */
        if (t->kind == TOK_SPM) {
            uint32_t bits;
            memcpy(&bits, &e->score, 4);
            fnv_u32(&h, bits);
        }
    }
    /* BPE merges live in a hash table; ranks are the merges' indices in tokenizer.ggml.merges (merges of texts
     * the vocab lacks are dropped, leaving gaps), so sorting by rank recovers the file's order. */
    int64_t n = 0;
    merge_rank *m = t->n_merges > 0 ? malloc((size_t)t->n_merges * sizeof *m) : NULL;
    for (uint64_t i = 0; m && i < t->merge_cap; i++)
        if (t->merge_keys[i] != UINT64_MAX && n < t->n_merges) m[n++] = (merge_rank){t->merge_ranks[i], t->merge_keys[i]};
    if (t->n_merges > 0 && !m) return 0; /* no memory for the sort (16 bytes a merge): 0, which no shard's check matches by chance */
    qsort(m, (size_t)n, sizeof *m, cmp_rank);
    fnv_u32(&h, (uint32_t)n);
    for (int64_t i = 0; i < n; i++) {
        fnv_u32(&h, (uint32_t)(m[i].key >> 32));
        fnv_u32(&h, (uint32_t)m[i].key);
    }
    free(m);
    return h;
}
