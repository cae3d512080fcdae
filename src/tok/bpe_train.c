/* bpe_train.c: byte-level BPE training (kiln_bpe_train), writing a vocab-only GGUF that kiln's BPE encoder
 * and llama.cpp load as a "gpt2" tokenizer with the "llama-bpe" (Llama-3) pre-tokenizer.
 *
 * Counting. The corpus is streamed in chunks of about 4 MiB. A chunk ends at a safe cut, a place where the
 * pre-tokenizer is known to split (below), so the words of a chunk are those of the whole file. Each chunk is
 * pre-tokenized with the Llama-3 regex (PCRE2, UTF + UCP, JIT) and every word's bytes counted in a hash table.
 * Invalid UTF-8 splits the text into valid runs, and each invalid byte is a word of its own. With several
 * threads each takes a slice of the chunk (cut at safe cuts too) and counts into its own table; the tables
 * are added into the global one after each chunk. Counts are sums and the word list is sorted by its bytes
 * before training, so the result does not depend on the thread count.
 *
 * Training. Each distinct word is a sequence of symbol ids, its bytes at first. A hash map holds each
 * adjacent pair's count (summed over the words, weighted by the word's count) and its occurrence list (the
 * words that contain it). A binary max-heap orders pairs by count, ties going to the smaller (left id,
 * right id), that is the pair whose parts entered the vocab first (the byte tokens in byte order, then the
 * merged tokens in merge order). Heap entries are not updated when a count falls: a popped entry whose
 * count is stale is pushed again with the current count (lazy invalidation). Counts only fall, except for
 * the pairs holding the new symbol, which are pushed once when the step ends. Merging (a, b) -> z rewrites,
 * left to right, only the words on the pair's occurrence list, and adjusts only the pairs around each
 * occurrence: (x, a) -> (x, z), (b, y) -> (z, y), and (b, a) -> (z, z) between two adjacent occurrences.
 *
 * Cost. Counting is one regex pass over the corpus, O(bytes), plus a hash insert per word. Training builds
 * the heap of the P initial pairs in O(P log P); a merge then costs O(total length of the words that contain
 * the pair) plus O(log H) per heap operation, and re-pushes of stale entries, at most one per pair whose
 * count fell, are paid by the merges that made them stale. Nothing is ever recounted over the whole corpus.
 * Memory: the distinct words (their bytes in the table, then 4 bytes of symbol id per byte), the pairs and
 * their occurrence lists (about one entry per symbol of the distinct words), the heap.
 *
 * A merge whose bytes are already a token (ab + c after a + bc) is recorded and reuses the token's id, as
 * Hugging Face's trainer does; a merge whose text would equal a special token's is never made. Training stops
 * at vocab_size tokens, or early (KILN_OK, a smaller vocab, the last progress call showing fewer merges than
 * asked) when the best pair is seen fewer than min_frequency times. tests/test_bpe_train.c checks hand-derived
 * merges, determinism across runs and thread counts, a Turkish round trip through the encoder, and that the
 * trained vocab encodes held-out Turkish in fewer tokens than Llama-2's 32000-token vocab. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "pool.h"
#include "file.h"
#include "status.h"
#include "tok.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum {
    CHUNK_BYTES = 4 << 20,      /* a chunk is read up to this size, then cut at its last safe cut */
    MAX_CHUNK_BYTES = 64 << 20, /* a chunk with no safe cut grows up to this, then is cut at a character boundary */
    PROGRESS_EVERY = 100,       /* merges between progress calls */
};

/* Llama-3's pre-tokenizer as llama.cpp writes it (the contractions spelled as [sS] classes rather than (?i:),
 * which under Unicode case folding would also take 'ſ, U+017F). */
static const char llama3_regex[] = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
                                   "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static const char *const default_specials[] = {"<unk>", "<s>", "</s>", "<pad>"};

/* ---------------------------------------------------------------- hashing */

static uint64_t mix64(uint64_t x) { /* splitmix64 finalizer */
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

static uint64_t hash_bytes(const uint8_t *s, size_t n) {
    uint64_t h = 1469598103934665603ULL ^ n; /* FNV-1a, then mixed: open addressing masks the low bits */
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 1099511628211ULL;
    return mix64(h);
}

static uint64_t pow2_at_least(uint64_t n) {
    uint64_t c = 64;
    while (c < n) c <<= 1;
    return c;
}

/* Grows *p (an array of *cap elements of size sz) to hold at least need elements. */
static bool grow(void **p, uint64_t *cap, uint64_t need, size_t sz) {
    if (need <= *cap) return true;
    uint64_t c = *cap ? *cap : 16, bytes;
    while (c < need) c *= 2;
    if (!kiln_mul_ok(c, sz, &bytes) || bytes > SIZE_MAX) return false;
    void *q = realloc(*p, (size_t)bytes);
    if (!q) return false;
    *p = q;
    *cap = c;
    return true;
}

/* ---------------------------------------------------------------- word counts */

typedef struct wslot {
    uint64_t hash;
    uint64_t off;  /* of the word's bytes in the arena */
    int64_t count; /* 0: empty slot */
    uint32_t len;
} wslot;

typedef struct wtab {
    wslot *slots; /* (cap), open addressing, at most half full */
    uint64_t cap, n;
    uint8_t *arena; /* (arena_n) word bytes back to back */
    uint64_t arena_n, arena_cap;
} wtab;

static void wtab_free(wtab *t) {
    free(t->slots);
    free(t->arena);
    *t = (wtab){0};
}

static void wtab_clear(wtab *t) {
    if (t->slots) memset(t->slots, 0, (size_t)t->cap * sizeof *t->slots);
    t->n = t->arena_n = 0;
}

static bool wtab_rehash(wtab *t) {
    uint64_t cap = t->cap ? t->cap * 2 : 1024;
    wslot *slots = calloc((size_t)cap, sizeof *slots);
    if (!slots) return false;
    for (uint64_t i = 0; i < t->cap; i++) {
        if (!t->slots[i].count) continue;
        uint64_t h = t->slots[i].hash & (cap - 1);
        while (slots[h].count) h = (h + 1) & (cap - 1);
        slots[h] = t->slots[i];
    }
    free(t->slots);
    t->slots = slots;
    t->cap = cap;
    return true;
}

/* Adds count to the word s[0..len) with hash h. False when out of memory. */
static bool wtab_add(wtab *t, const uint8_t *s, uint32_t len, uint64_t h, int64_t count) {
    if ((t->n + 1) * 2 > t->cap && !wtab_rehash(t)) return false;
    uint64_t mask = t->cap - 1;
    for (uint64_t i = h & mask;; i = (i + 1) & mask) {
        wslot *e = &t->slots[i];
        if (!e->count) {
            if (!grow((void **)&t->arena, &t->arena_cap, t->arena_n + len, 1)) return false;
            memcpy(t->arena + t->arena_n, s, len);
            *e = (wslot){.hash = h, .off = t->arena_n, .count = count, .len = len};
            t->arena_n += len;
            t->n++;
            return true;
        }
        if (e->hash == h && e->len == len && memcmp(t->arena + e->off, s, len) == 0) {
            e->count += count;
            return true;
        }
    }
}

/* ---------------------------------------------------------------- pre-tokenizing a chunk */

/* A safe cut at p (0 < p < n): the regex never matches across it, and every match before it is the same
 * whether the text goes on or ends there. Two shapes qualify, both in ASCII so invalid UTF-8 cannot straddle:
 * - a space after a printable non-space ASCII byte ("word| next"): no alternative joins a non-space to a
 *   following space, and the one look-ahead, (?!\S), reads a space there as it reads the end;
 * - a printable ASCII byte after a newline ("\n|next"): no alternative continues past a newline into a
 *   non-space, and a whitespace run ending in a newline is taken whole by \s*[\r\n]+ before (?!\S) is tried. */
static bool safe_cut(const uint8_t *s, size_t p) {
    return (s[p] == ' ' && s[p - 1] > 0x20 && s[p - 1] < 0x7F) || (s[p - 1] == '\n' && s[p] > 0x20 && s[p] < 0x7F);
}

/* The last safe cut in (lo, n), or 0 if there is none. */
static size_t last_safe_cut(const uint8_t *s, size_t lo, size_t n) {
    for (size_t p = n - 1; p > lo; p--)
        if (safe_cut(s, p)) return p;
    return 0;
}

typedef struct counter {
    pcre2_match_data *md;
    pcre2_match_context *mc;
    pcre2_jit_stack *stack;
    wtab words;
    int err;      /* PCRE2 error code of a failed match, 0 if none */
    uint64_t at;  /* file offset of that match */
    bool oom;
} counter;

typedef struct count_job {
    const pcre2_code *re;
    bool jit;
    const uint8_t *chunk;
    uint64_t chunk_at; /* file offset of chunk[0], for messages */
    size_t *bounds;    /* (nth + 1) slice boundaries in the chunk */
    counter *ctr;      /* (nth) */
} count_job;

static bool add_word(counter *c, const uint8_t *s, size_t n) {
    if (!wtab_add(&c->words, s, (uint32_t)n, hash_bytes(s, n), 1)) c->oom = true;
    return !c->oom;
}

/* Splits valid UTF-8 s[0..n) into words and counts them. */
static bool count_run(const count_job *job, counter *c, const uint8_t *s, size_t n) {
    size_t pos = 0;
    while (pos < n) {
        int rc = job->jit ? pcre2_jit_match(job->re, s, n, pos, 0, c->md, c->mc)
                          : pcre2_match(job->re, s, n, pos, PCRE2_NO_UTF_CHECK, c->md, c->mc);
        if (rc == PCRE2_ERROR_NOMATCH) return add_word(c, s + pos, n - pos); /* the regex covers every character */
        if (rc < 0) {
            c->err = rc;
            c->at = job->chunk_at + (uint64_t)(s + pos - job->chunk);
            return false;
        }
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->md);
        size_t start = ov[0], end = ov[1];
        if (start > pos && !add_word(c, s + pos, start - pos)) return false;
        if (end <= start) { /* no alternative matches empty; step over one character if one ever did */
            end = start + 1;
            while (end < n && (s[end] & 0xC0) == 0x80) end++;
        }
        if (!add_word(c, s + start, end - start)) return false;
        pos = end;
    }
    return true;
}

static void count_slice(void *ctx, int ith, int nth) {
    (void)nth;
    const count_job *job = ctx;
    counter *c = &job->ctr[ith];
    const uint8_t *s = job->chunk + job->bounds[ith];
    size_t n = job->bounds[ith + 1] - job->bounds[ith], run = 0, i = 0;
    while (i < n) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp;
        int len = kiln_utf8_decode(s + i, n - i, &cp);
        if (len > 0) {
            i += (size_t)len;
            continue;
        }
        if (!count_run(job, c, s + run, i - run) || !add_word(c, s + i, 1)) return;
        run = ++i;
    }
    count_run(job, c, s + run, n - run);
}

typedef struct counting {
    pcre2_code *re;
    bool jit;
    kiln_pool *pool;
    int nth;
    counter *ctr; /* (nth) */
    size_t *bounds;
    wtab total;
} counting;

static void counting_free(counting *k) {
    for (int i = 0; k->ctr && i < k->nth; i++) {
        pcre2_match_data_free(k->ctr[i].md);
        pcre2_match_context_free(k->ctr[i].mc);
        pcre2_jit_stack_free(k->ctr[i].stack);
        wtab_free(&k->ctr[i].words);
    }
    free(k->ctr);
    free(k->bounds);
    kiln_pool_free(k->pool);
    pcre2_code_free(k->re);
    wtab_free(&k->total);
}

static kiln_status counting_init(counting *k, int n_threads) {
    int err;
    PCRE2_SIZE err_at;
    k->re = pcre2_compile((PCRE2_SPTR)llama3_regex, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &err, &err_at, NULL);
    if (!k->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return kiln_fail(KILN_ERR_UNSUPPORTED, "pre-tokenizer regex does not compile at offset %zu: %s", (size_t)err_at, (char *)msg);
    }
    k->jit = pcre2_jit_compile(k->re, PCRE2_JIT_COMPLETE) == 0; /* without JIT (unsupported CPU) it is just slower */
    kiln_status s = kiln_pool_create(n_threads, &k->pool);
    if (s) return s;
    k->nth = kiln_pool_size(k->pool);
    k->ctr = calloc((size_t)k->nth, sizeof *k->ctr);
    k->bounds = calloc((size_t)k->nth + 1, sizeof *k->bounds);
    if (!k->ctr || !k->bounds) return kiln_fail(KILN_ERR_NOMEM, "out of memory for %d counting threads", k->nth);
    for (int i = 0; i < k->nth; i++) {
        counter *c = &k->ctr[i];
        c->md = pcre2_match_data_create(1, NULL);
        c->mc = pcre2_match_context_create(NULL);
        /* the JIT's backtracking stack: long whitespace runs with (?!\S) need more than the 32 KiB default */
        c->stack = k->jit ? pcre2_jit_stack_create(32 << 10, 8 << 20, NULL) : NULL;
        if (!c->md || !c->mc || (k->jit && !c->stack)) return kiln_fail(KILN_ERR_NOMEM, "out of memory for the regex matcher");
        if (c->stack) pcre2_jit_stack_assign(c->mc, NULL, c->stack);
    }
    return KILN_OK;
}

/* Counts the words of chunk[0..n), which starts at byte `at` of path. */
static kiln_status count_chunk(counting *k, const uint8_t *chunk, size_t n, uint64_t at, const char *path) {
    k->bounds[0] = 0;
    for (int t = 1; t < k->nth; t++) {
        size_t p = n / (size_t)k->nth * (size_t)t, lo = k->bounds[t - 1];
        while (p > lo && !safe_cut(chunk, p)) p--;
        k->bounds[t] = p > lo ? p : lo;
    }
    k->bounds[k->nth] = n;
    count_job job = {.re = k->re, .jit = k->jit, .chunk = chunk, .chunk_at = at, .bounds = k->bounds, .ctr = k->ctr};
    kiln_pool_run(k->pool, count_slice, &job);
    for (int t = 0; t < k->nth; t++) {
        counter *c = &k->ctr[t];
        if (c->oom) return kiln_fail(KILN_ERR_NOMEM, "%s: out of memory counting words", path);
        if (c->err) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(c->err, msg, sizeof msg);
            return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: pre-tokenizer failed at byte %llu: %s", path, (unsigned long long)c->at, (char *)msg);
        }
        for (uint64_t i = 0; i < c->words.cap; i++) {
            const wslot *e = &c->words.slots[i];
            if (e->count && !wtab_add(&k->total, c->words.arena + e->off, e->len, e->hash, e->count))
                return kiln_fail(KILN_ERR_NOMEM, "%s: out of memory counting words", path);
        }
        wtab_clear(&c->words);
    }
    return KILN_OK;
}

/* Corpora open through core/file.h: a folder or a FIFO is refused by name, and the open cannot block. */

static kiln_status count_file(counting *k, const char *path, uint8_t **buf, uint64_t *cap) {
    FILE *f;
    TRY(kiln_fopen_regular(path, &f));
    kiln_status s = KILN_OK;
    uint64_t want = CHUNK_BYTES, at = 0; /* at: file offset of (*buf)[0] */
    size_t have = 0;
    bool eof = false;
    for (;;) {
        if (!grow((void **)buf, cap, want, 1)) {
            s = kiln_fail(KILN_ERR_NOMEM, "%s: out of memory for a %llu-byte chunk", path, (unsigned long long)want);
            break;
        }
        while (!eof && have < want) {
            size_t got = fread(*buf + have, 1, (size_t)want - have, f);
            if (got == 0) {
                if (ferror(f)) s = kiln_fail(KILN_ERR_IO, "%s: read failed at byte %llu: %s", path, (unsigned long long)(at + have), strerror(errno));
                eof = true;
            }
            have += got;
        }
        if (s || have == 0) break;
        size_t cut = have;
        if (!eof) {
            cut = last_safe_cut(*buf, 0, have);
            if (cut == 0 && want < MAX_CHUNK_BYTES) { /* a very long line with no space: read more */
                want *= 2;
                continue;
            }
            if (cut == 0) { /* MAX_CHUNK_BYTES with no safe cut: cut before the last character, at worst splitting a word */
                cut = have - 1;
                while (cut > 0 && ((*buf)[cut] & 0xC0) == 0x80 && have - cut < 4) cut--;
                if (cut == 0) cut = have;
            }
        }
        if ((s = count_chunk(k, *buf, cut, at, path))) break;
        memmove(*buf, *buf + cut, have - cut);
        have -= cut;
        at += cut;
        if (eof && have == 0) break;
    }
    fclose(f);
    return s;
}

/* ---------------------------------------------------------------- training state */

typedef struct pair {
    int64_t count;
    int32_t left, right;
    int32_t *occ;      /* (n_occ) words that contain the pair, or did: stale and repeated entries are harmless */
    uint32_t n_occ, cap_occ;
    int32_t occ_word;  /* the last word appended, */
    int32_t occ_step;  /* in this step: a word is listed once per step */
    int32_t rose_step; /* the step in which the count last rose (the pair is then on the rose list) */
    bool banned;       /* merging it would give a special token's text */
} pair;

typedef struct heap_entry {
    int64_t count;
    uint64_t key; /* left << 32 | right: ties go to the smaller */
    int32_t pair;
} heap_entry;

typedef struct trainer {
    /* words, sorted by their bytes */
    int32_t n_words;
    int64_t *wcount; /* (n_words) occurrences in the corpus */
    uint64_t *woff;  /* (n_words) start of the word's symbols in sym */
    uint32_t *wlen;  /* (n_words) current number of symbols */
    int32_t *wstep;  /* (n_words) the last step that rewrote the word */
    int32_t *sym;    /* symbol ids of every word, back to back */
    /* pairs */
    pair *pairs;
    uint64_t n_pairs, cap_pairs;
    uint64_t *map_keys; /* (map_cap) left << 32 | right, UINT64_MAX empty */
    int32_t *map_vals;  /* (map_cap) pair index */
    uint64_t map_cap;
    heap_entry *heap;
    uint64_t n_heap, cap_heap;
    int32_t *rose; /* pairs whose count rose in this step, pushed when it ends */
    uint64_t n_rose, cap_rose;
    int32_t step, word; /* the merge step and the word being rewritten */
    /* tokens: ids 0..n_specials-1 are the specials (no bytes), then the 256 bytes, then merges */
    int32_t n_tokens;
    uint64_t *tok_off;  /* (vocab_size) of the token's bytes in tok_bytes */
    uint32_t *tok_len;  /* (vocab_size) */
    uint8_t *tok_bytes;
    uint64_t tok_bytes_n, tok_bytes_cap;
    int32_t *tok_index; /* (tok_index_cap) bytes -> id + 1, 0 empty */
    uint64_t tok_index_cap;
    int32_t *merges;    /* (2 * n_merges) left, right in merge order */
    uint64_t n_merges, cap_merges;
    bool oom;
} trainer;

static void trainer_free(trainer *t) {
    free(t->wcount);
    free(t->woff);
    free(t->wlen);
    free(t->wstep);
    free(t->sym);
    for (uint64_t i = 0; i < t->n_pairs; i++) free(t->pairs[i].occ);
    free(t->pairs);
    free(t->map_keys);
    free(t->map_vals);
    free(t->heap);
    free(t->rose);
    free(t->tok_off);
    free(t->tok_len);
    free(t->tok_bytes);
    free(t->tok_index);
    free(t->merges);
}

static uint64_t pair_key(int32_t l, int32_t r) { return (uint64_t)(uint32_t)l << 32 | (uint32_t)r; }

static bool map_rehash(trainer *t) {
    uint64_t cap = t->map_cap ? t->map_cap * 2 : 1 << 16;
    uint64_t *keys = malloc((size_t)cap * sizeof *keys);
    int32_t *vals = malloc((size_t)cap * sizeof *vals);
    if (!keys || !vals) {
        free(keys);
        free(vals);
        return false;
    }
    memset(keys, 0xFF, (size_t)cap * sizeof *keys);
    for (uint64_t i = 0; i < t->map_cap; i++) {
        if (t->map_keys[i] == UINT64_MAX) continue;
        uint64_t h = mix64(t->map_keys[i]) & (cap - 1);
        while (keys[h] != UINT64_MAX) h = (h + 1) & (cap - 1);
        keys[h] = t->map_keys[i], vals[h] = t->map_vals[i];
    }
    free(t->map_keys);
    free(t->map_vals);
    t->map_keys = keys, t->map_vals = vals, t->map_cap = cap;
    return true;
}

/* The index of pair (l, r), created with count 0 if absent; -1 when out of memory. */
static int32_t pair_get(trainer *t, int32_t l, int32_t r) {
    if ((t->n_pairs + 1) * 2 > t->map_cap && !map_rehash(t)) return -1;
    uint64_t key = pair_key(l, r), mask = t->map_cap - 1;
    for (uint64_t h = mix64(key) & mask;; h = (h + 1) & mask) {
        if (t->map_keys[h] == key) return t->map_vals[h];
        if (t->map_keys[h] != UINT64_MAX) continue;
        if (t->n_pairs >= INT32_MAX || !grow((void **)&t->pairs, &t->cap_pairs, t->n_pairs + 1, sizeof *t->pairs)) return -1;
        t->pairs[t->n_pairs] = (pair){.left = l, .right = r, .occ_word = -1, .occ_step = -1, .rose_step = -1};
        t->map_keys[h] = key;
        t->map_vals[h] = (int32_t)t->n_pairs;
        return (int32_t)t->n_pairs++;
    }
}

/* Adds delta to the count of (l, r). A rise lists the current word under the pair and queues the pair for the heap. */
static void pair_add(trainer *t, int32_t l, int32_t r, int64_t delta) {
    int32_t i = pair_get(t, l, r);
    if (i < 0) {
        t->oom = true;
        return;
    }
    pair *p = &t->pairs[i];
    p->count += delta;
    if (delta <= 0) return;
    if (p->occ_word != t->word || p->occ_step != t->step) {
        uint64_t cap = p->cap_occ;
        if (p->n_occ == UINT32_MAX || !grow((void **)&p->occ, &cap, (uint64_t)p->n_occ + 1, sizeof *p->occ)) {
            t->oom = true;
            return;
        }
        p->cap_occ = (uint32_t)(cap < UINT32_MAX ? cap : UINT32_MAX);
        p->occ[p->n_occ++] = t->word;
        p->occ_word = t->word, p->occ_step = t->step;
    }
    if (p->rose_step != t->step) {
        if (!grow((void **)&t->rose, &t->cap_rose, t->n_rose + 1, sizeof *t->rose)) {
            t->oom = true;
            return;
        }
        t->rose[t->n_rose++] = i;
        p->rose_step = t->step;
    }
}

static bool heap_before(const heap_entry *x, const heap_entry *y) {
    return x->count > y->count || (x->count == y->count && x->key < y->key);
}

static bool heap_push(trainer *t, int32_t pi) {
    if (!grow((void **)&t->heap, &t->cap_heap, t->n_heap + 1, sizeof *t->heap)) return false;
    const pair *p = &t->pairs[pi];
    heap_entry e = {p->count, pair_key(p->left, p->right), pi};
    uint64_t i = t->n_heap++;
    while (i > 0 && heap_before(&e, &t->heap[(i - 1) / 2])) {
        t->heap[i] = t->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    t->heap[i] = e;
    return true;
}

static heap_entry heap_pop(trainer *t) {
    heap_entry top = t->heap[0], last = t->heap[--t->n_heap];
    uint64_t i = 0, n = t->n_heap;
    for (;;) {
        uint64_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && heap_before(&t->heap[c + 1], &t->heap[c])) c++;
        if (!heap_before(&t->heap[c], &last)) break;
        t->heap[i] = t->heap[c];
        i = c;
    }
    if (n) t->heap[i] = last;
    return top;
}

/* Pushes the pairs whose count rose in this step (and are frequent enough to matter). */
static bool push_risen(trainer *t, int64_t min_frequency) {
    for (uint64_t i = 0; i < t->n_rose; i++)
        if (t->pairs[t->rose[i]].count >= min_frequency && !heap_push(t, t->rose[i])) return false;
    t->n_rose = 0;
    return true;
}

/* ---------------------------------------------------------------- tokens */

static int32_t token_find(const trainer *t, const uint8_t *s, size_t n, uint64_t h) {
    uint64_t mask = t->tok_index_cap - 1;
    for (uint64_t i = h & mask;; i = (i + 1) & mask) {
        int32_t v = t->tok_index[i];
        if (v == 0) return -1;
        if (t->tok_len[v - 1] == n && memcmp(t->tok_bytes + t->tok_off[v - 1], s, n) == 0) return v - 1;
    }
}

/* Appends a token with bytes s[0..n) (the caller checked it is new and that the vocab has room). */
static bool token_add(trainer *t, const uint8_t *s, size_t n, uint64_t h) {
    if (!grow((void **)&t->tok_bytes, &t->tok_bytes_cap, t->tok_bytes_n + n, 1)) return false;
    int32_t id = t->n_tokens++;
    memcpy(t->tok_bytes + t->tok_bytes_n, s, n);
    t->tok_off[id] = t->tok_bytes_n, t->tok_len[id] = (uint32_t)n;
    t->tok_bytes_n += n;
    uint64_t mask = t->tok_index_cap - 1, i = h & mask;
    while (t->tok_index[i]) i = (i + 1) & mask;
    t->tok_index[i] = id + 1;
    return true;
}

/* ---------------------------------------------------------------- merging */

/* Rewrites word w with (a, b) -> z, left to right, adjusting the counts of the pairs around each occurrence. */
static void merge_word(trainer *t, int32_t w, int32_t a, int32_t b, int32_t z, int32_t pi) {
    int32_t *s = t->sym + t->woff[w];
    uint32_t n = t->wlen[w], i = 0, j = 0;
    int64_t c = t->wcount[w];
    bool after_merge = false; /* s[j - 1] is a z made from s[i - 2], s[i - 1] */
    t->word = w;
    while (i < n) {
        if (i + 1 < n && s[i] == a && s[i + 1] == b) {
            t->pairs[pi].count -= c;
            if (j > 0 && after_merge) { /* ... z | a b: the (b, a) between two occurrences becomes (z, z) */
                pair_add(t, b, a, -c);
                pair_add(t, z, z, c);
            } else if (j > 0) {
                pair_add(t, s[j - 1], a, -c);
                pair_add(t, s[j - 1], z, c);
            }
            if (i + 2 < n && !(i + 3 < n && s[i + 2] == a && s[i + 3] == b)) { /* the next occurrence handles (b, a) */
                pair_add(t, b, s[i + 2], -c);
                pair_add(t, z, s[i + 2], c);
            }
            s[j++] = z;
            i += 2;
            after_merge = true;
        } else {
            s[j++] = s[i++];
            after_merge = false;
        }
    }
    t->wlen[w] = j;
}

/* Loads the counted words, sorted by their bytes, as symbol sequences, and counts the initial pairs. */
static int cmp_words(const void *x, const void *y, void *ctx) {
    const wtab *wt = ctx;
    const wslot *a = *(const wslot *const *)x, *b = *(const wslot *const *)y;
    int c = memcmp(wt->arena + a->off, wt->arena + b->off, a->len < b->len ? a->len : b->len);
    return c ? c : (a->len > b->len) - (a->len < b->len);
}

static kiln_status load_words(trainer *t, const wtab *wt, int32_t byte0, int64_t min_frequency) {
    if (wt->n > INT32_MAX) return kiln_fail(KILN_ERR_UNSUPPORTED, "the corpus has %llu distinct words (kiln trains on at most 2^31)", (unsigned long long)wt->n);
    const wslot **order = malloc((size_t)(wt->n ? wt->n : 1) * sizeof *order);
    uint64_t n = 0;
    if (!order) return kiln_fail(KILN_ERR_NOMEM, "out of memory sorting %llu words", (unsigned long long)wt->n);
    for (uint64_t i = 0; i < wt->cap; i++)
        if (wt->slots[i].count) order[n++] = &wt->slots[i];
    qsort_r(order, (size_t)n, sizeof *order, cmp_words, (void *)wt);
    t->n_words = (int32_t)n;
    size_t nw = n ? (size_t)n : 1;
    t->wcount = malloc(nw * sizeof *t->wcount);
    t->woff = malloc(nw * sizeof *t->woff);
    t->wlen = malloc(nw * sizeof *t->wlen);
    t->wstep = calloc(nw, sizeof *t->wstep);
    uint64_t sym_bytes;
    if (!kiln_mul_ok(wt->arena_n ? wt->arena_n : 1, sizeof *t->sym, &sym_bytes) || sym_bytes > SIZE_MAX) goto oom;
    t->sym = malloc((size_t)sym_bytes);
    if (!t->wcount || !t->woff || !t->wlen || !t->wstep || !t->sym) goto oom;
    uint64_t off = 0;
    for (int32_t w = 0; w < t->n_words; w++) {
        const wslot *e = order[w];
        const uint8_t *bytes = wt->arena + e->off;
        t->wcount[w] = e->count, t->woff[w] = off, t->wlen[w] = e->len;
        for (uint32_t k = 0; k < e->len; k++) t->sym[off + k] = byte0 + bytes[k];
        t->word = w;
        for (uint32_t k = 0; k + 1 < e->len; k++) pair_add(t, t->sym[off + k], t->sym[off + k + 1], e->count);
        if (t->oom) goto oom;
        off += e->len;
    }
    free(order);
    return push_risen(t, min_frequency) ? KILN_OK : kiln_fail(KILN_ERR_NOMEM, "out of memory for the pair heap");
oom:
    free(order);
    return kiln_fail(KILN_ERR_NOMEM, "out of memory for %llu words of %llu bytes", (unsigned long long)n, (unsigned long long)wt->arena_n);
}

/* True when bytes b[0..n), written in GPT-2's byte alphabet, spell text exactly. */
static bool bytes_spell(const uint8_t *b, size_t n, const char *text) {
    char buf[4];
    for (size_t i = 0; i < n; i++) {
        int l = kiln_utf8_encode(kiln_bpe_byte_to_cp[b[i]], buf);
        if (strncmp(text, buf, (size_t)l) != 0) return false;
        text += l;
    }
    return *text == 0;
}

/* The one progress shape (kiln.h): merges done of the merges asked for. */
static void report(const kiln_bpe_train_params *p, int32_t done, int32_t total) {
    p->progress(p->progress_ud, &(kiln_progress){.stage = "tokenizer", .done = done, .total = total, .metric = NAN});
}

/* Merges until the vocab has vocab_size tokens or the best pair is rarer than min_frequency. */
static kiln_status train(trainer *t, const kiln_bpe_train_params *p, int64_t min_frequency, const char *const *specials,
                         int n_specials, int32_t n_base) {
    int32_t total = p->vocab_size - n_base;
    uint8_t *tmp = NULL;
    uint64_t tmp_cap = 0;
    while (t->n_tokens < p->vocab_size && t->n_heap) {
        heap_entry top = heap_pop(t);
        pair *pr = &t->pairs[top.pair];
        if (pr->banned) continue;
        if (top.count != pr->count) { /* stale: its count fell since it was pushed */
            if (top.count > pr->count && pr->count >= min_frequency && !heap_push(t, top.pair)) goto oom;
            continue;
        }
        if (pr->count < min_frequency) break;
        int32_t a = pr->left, b = pr->right;
        uint64_t la = t->tok_len[a], lb = t->tok_len[b];
        if (!grow((void **)&tmp, &tmp_cap, la + lb, 1)) goto oom;
        memcpy(tmp, t->tok_bytes + t->tok_off[a], la);
        memcpy(tmp + la, t->tok_bytes + t->tok_off[b], lb);
        size_t n = (size_t)(la + lb);
        bool clash = false;
        for (int i = 0; i < n_specials; i++) clash |= bytes_spell(tmp, n, specials[i]);
        if (clash) {
            pr->banned = true;
            continue;
        }
        uint64_t h = hash_bytes(tmp, n);
        int32_t z = token_find(t, tmp, n, h);
        if (z < 0) {
            if (n > UINT32_MAX || !token_add(t, tmp, n, h)) goto oom;
            z = t->n_tokens - 1;
            int32_t done = t->n_tokens - n_base;
            if (p->progress && done % PROGRESS_EVERY == 0 && t->n_tokens < p->vocab_size) report(p, done, total);
        }
        if (!grow((void **)&t->merges, &t->cap_merges, 2 * (t->n_merges + 1), sizeof *t->merges)) goto oom;
        t->merges[2 * t->n_merges] = a, t->merges[2 * t->n_merges + 1] = b;
        t->n_merges++;
        /* take the occurrence list: the pair's count is 0 after this step, and only an id reuse could raise it again */
        int32_t *occ = pr->occ;
        uint32_t n_occ = pr->n_occ;
        pr->occ = NULL, pr->n_occ = pr->cap_occ = 0;
        t->step++;
        for (uint32_t k = 0; k < n_occ; k++) {
            int32_t w = occ[k];
            if (t->wstep[w] == t->step) continue; /* listed twice */
            t->wstep[w] = t->step;
            merge_word(t, w, a, b, z, top.pair);
        }
        free(occ);
        if (t->oom) goto oom;
        assert(t->pairs[top.pair].count == 0);
        if (!push_risen(t, min_frequency)) goto oom;
    }
    free(tmp);
    if (p->progress) report(p, t->n_tokens - n_base, total);
    return KILN_OK;
oom:
    free(tmp);
    return kiln_fail(KILN_ERR_NOMEM, "out of memory after %llu merges", (unsigned long long)t->n_merges);
}

/* ---------------------------------------------------------------- output */

/* Appends token id's text in GPT-2's byte alphabet to out. */
static char *put_token_text(const trainer *t, int32_t id, char *out) {
    const uint8_t *s = t->tok_bytes + t->tok_off[id];
    for (uint32_t i = 0; i < t->tok_len[id]; i++) out += kiln_utf8_encode(kiln_bpe_byte_to_cp[s[i]], out);
    return out;
}

static int32_t special_id(const char *const *specials, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (strcmp(specials[i], name) == 0) return i;
    return -1;
}

static kiln_status write_vocab(const trainer *t, const char *const *specials, int n_specials, const char *path) {
    /* a byte takes at most 2 UTF-8 bytes in the alphabet (code points below U+0144) */
    uint64_t text_bytes = 2 * t->tok_bytes_n + (uint64_t)t->n_tokens, merge_bytes = 0;
    for (int i = 0; i < n_specials; i++) text_bytes += strlen(specials[i]);
    for (uint64_t m = 0; m < t->n_merges; m++) merge_bytes += 2 * ((uint64_t)t->tok_len[t->merges[2 * m]] + t->tok_len[t->merges[2 * m + 1]]) + 2;
    char *pool = malloc((size_t)(text_bytes + merge_bytes));
    const char **texts = malloc((size_t)t->n_tokens * sizeof *texts);
    const char **merges = malloc((size_t)(t->n_merges ? t->n_merges : 1) * sizeof *merges);
    int32_t *types = malloc((size_t)t->n_tokens * sizeof *types);
    kiln_gguf_writer *w = NULL;
    kiln_status s = KILN_OK;
    if (!pool || !texts || !merges || !types) {
        s = kiln_fail(KILN_ERR_NOMEM, "out of memory writing %d tokens", t->n_tokens);
        goto done;
    }
    char *q = pool;
    for (int32_t id = 0; id < t->n_tokens; id++) {
        texts[id] = q;
        if (id < n_specials) {
            size_t len = strlen(specials[id]);
            memcpy(q, specials[id], len);
            q += len;
            types[id] = KILN_TOKEN_CONTROL; /* llama.cpp's BPE has no unknown token: all specials are control */
        } else {
            q = put_token_text(t, id, q);
            types[id] = KILN_TOKEN_NORMAL;
        }
        *q++ = 0;
    }
    for (uint64_t m = 0; m < t->n_merges; m++) {
        merges[m] = q;
        q = put_token_text(t, t->merges[2 * m], q);
        *q++ = ' ';
        q = put_token_text(t, t->merges[2 * m + 1], q);
        *q++ = 0;
    }
    if ((s = kiln_gguf_writer_new(&w))) goto done;
    int32_t unk = special_id(specials, n_specials, "<unk>"), bos = special_id(specials, n_specials, "<s>");
    int32_t eos = special_id(specials, n_specials, "</s>"), pad = special_id(specials, n_specials, "<pad>");
    if ((s = kiln_gguf_writer_set_str(w, "general.name", "kiln-bpe")) || (s = kiln_gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2")) ||
        (s = kiln_gguf_writer_set_str(w, "tokenizer.ggml.pre", "llama-bpe")) ||
        (s = kiln_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", texts, (uint64_t)t->n_tokens)) ||
        (s = kiln_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", KILN_GGUF_INT32, types, (uint64_t)t->n_tokens)) ||
        (s = kiln_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", merges, t->n_merges)) ||
        (bos >= 0 && (s = kiln_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)bos))) ||
        (eos >= 0 && (s = kiln_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)eos))) ||
        (unk >= 0 && (s = kiln_gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", (uint32_t)unk))) ||
        (pad >= 0 && (s = kiln_gguf_writer_set_u32(w, "tokenizer.ggml.padding_token_id", (uint32_t)pad))) ||
        (s = kiln_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", bos >= 0)) ||
        (s = kiln_gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", false)))
        goto done;
    s = kiln_gguf_writer_write_file(w, path);
done:
    kiln_gguf_writer_free(w);
    free(pool);
    free(texts);
    free(merges);
    free(types);
    return s;
}

/* ---------------------------------------------------------------- entry point */

/* Specials must be non-empty, distinct, and not the text of a byte token. */
static kiln_status check_specials(const char *const *specials, int n) {
    for (int i = 0; i < n; i++) {
        const char *sp = specials[i];
        if (!sp || !*sp) return kiln_fail(KILN_ERR_INVALID, "special token %d is empty", i);
        for (int j = 0; j < i; j++)
            if (strcmp(specials[j], sp) == 0) return kiln_fail(KILN_ERR_INVALID, "special token '%s' is given twice (%d and %d)", sp, j, i);
        for (int b = 0; b < 256; b++)
            if (bytes_spell(&(uint8_t){(uint8_t)b}, 1, sp))
                return kiln_fail(KILN_ERR_INVALID, "special token '%s' is the text of the byte token 0x%02X", sp, b);
    }
    return KILN_OK;
}

kiln_status kiln_bpe_train(const char *const *corpus_paths, int n_paths, const kiln_bpe_train_params *p, const char *out_path) {
    if (!corpus_paths || n_paths < 1) return kiln_fail(KILN_ERR_INVALID, "BPE training needs at least one corpus file");
    if (!p || !out_path) return kiln_fail(KILN_ERR_INVALID, "BPE training needs parameters and an output path");
    const char *const *specials = p->specials ? p->specials : default_specials;
    int n_specials = p->specials ? p->n_specials : 4;
    int64_t min_frequency = p->min_frequency > 0 ? p->min_frequency : 2;
    if (n_specials < 0 || n_specials > 1 << 20) return kiln_fail(KILN_ERR_INVALID, "%d special tokens", n_specials);
    int32_t n_base = n_specials + 256;
    if (p->vocab_size < n_base)
        return kiln_fail(KILN_ERR_INVALID, "vocab size %d is below the %d special and 256 byte tokens it starts with", p->vocab_size, n_specials);
    kiln_status s = check_specials(specials, n_specials);
    for (int i = 0; i < n_paths && !s; i++) s = kiln_check_regular(corpus_paths[i]); /* all, before counting any */
    counting k = {0};
    trainer t = {0};
    uint8_t *buf = NULL;
    uint64_t buf_cap = 0;
    if (s || (s = counting_init(&k, p->n_threads))) goto done;
    for (int i = 0; i < n_paths; i++)
        if ((s = count_file(&k, corpus_paths[i], &buf, &buf_cap))) goto done;
    free(buf);
    buf = NULL;

    size_t nv = (size_t)p->vocab_size;
    t.tok_index_cap = pow2_at_least(2 * (uint64_t)nv);
    t.tok_off = malloc(nv * sizeof *t.tok_off);
    t.tok_len = calloc(nv, sizeof *t.tok_len);
    t.tok_index = calloc((size_t)t.tok_index_cap, sizeof *t.tok_index);
    if (!t.tok_off || !t.tok_len || !t.tok_index) {
        s = kiln_fail(KILN_ERR_NOMEM, "out of memory for a vocab of %d", p->vocab_size);
        goto done;
    }
    for (int32_t i = 0; i < n_specials; i++) t.tok_off[i] = 0; /* specials have no bytes: merges never reach them */
    t.n_tokens = n_specials;
    for (int b = 0; b < 256; b++) {
        uint8_t byte = (uint8_t)b;
        if (!token_add(&t, &byte, 1, hash_bytes(&byte, 1))) {
            s = kiln_fail(KILN_ERR_NOMEM, "out of memory");
            goto done;
        }
    }
    if ((s = load_words(&t, &k.total, n_specials, min_frequency))) goto done;
    counting_free(&k);
    k = (counting){0};
    if ((s = train(&t, p, min_frequency, specials, n_specials, n_base))) goto done;
    s = write_vocab(&t, specials, n_specials, out_path);
done:
    free(buf);
    counting_free(&k);
    trainer_free(&t);
    return s;
}
