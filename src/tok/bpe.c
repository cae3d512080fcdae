/* bpe.c: byte-level BPE encoding, as llama.cpp's llm_tokenizer_bpe (llama-vocab.cpp) and unicode_regex_split
 * (unicode.cpp) do it. The pre-tokenizer named by tokenizer.ggml.pre is a list of regexes, each splitting the
 * pieces the previous one left into its matches and the gaps between them. Each word is then written in GPT-2's
 * byte alphabet, one symbol per byte, and the adjacent pair with the lowest merge rank merges first (ties: the
 * leftmost) until no pair has a merge. Tested by tests/test_bpe.c (hand-written splits, merge order, invalid
 * UTF-8, long runs, threads, llama.cpp's vectors) and tests/test_tokenizer.c (the vectors through the dispatcher).
 *
 * Merges are keyed by token ids, llama.cpp's by texts: the two differ only for a vocab whose merges name texts
 * that are no tokens (vocab.c drops those), where llama.cpp could still chain through them.
 *
 * llama.cpp runs its regexes with hand-written splitters (GPT-2, Llama 3) or std::regex over a text whose
 * non-ASCII code points are collapsed to one byte per Unicode category; kiln runs the same regexes with PCRE2
 * (UTF + UCP, JIT). For valid UTF-8 the two agree once \s is pinned to llama.cpp's whitespace (Unicode
 * White_Space: PCRE2 adds U+180E) and, for regexes without \p{..} (std::wregex in llama.cpp, which sees every
 * non-ASCII space as U+000B), non-ASCII spaces are kept out of explicit classes; see rewrite_regex. What can
 * still differ: code points whose category changed between Unicode 14 (PCRE2 10.42) and the tables llama.cpp
 * was generated from.
 *
 * Invalid UTF-8 is replaced as llama.cpp's unicode_cpts_from_utf8 does: its lax decoder accepts overlong forms
 * and surrogates (re-encoded from the code point), and each byte it rejects becomes U+FFFD. A sequence decoding
 * above U+10FFFF makes llama.cpp throw; kiln replaces each of its bytes with U+FFFD instead.
 *
 * Speed: words repeat, so each call keeps a cache of word -> ids (as HuggingFace tokenizers does); all scratch
 * memory belongs to the call, so one tokenizer may encode on many threads at once. */
#include "tok.h"
#include "status.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- pre-tokenizers
 * The regexes of llama.cpp's llm_tokenizer_bpe, per tokenizer.ggml.pre value (the names llama_vocab::load
 * maps to each LLAMA_VOCAB_PRE_TYPE_*). ignore_merges: a word that is a token as a whole is that token. */

#define BPE_MAX_REGEX 6

/* GPT-2's regex, shared by many families (the one llama.cpp's unicode_regex_split_custom_gpt2 implements) */
#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define RE_CONTRACTIONS "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
/* Llama 3's regex with (?i:...) spelled out (unicode_regex_split_custom_llama3) */
#define RE_LLAMA3 RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_QWEN2 RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* CJK ideographs, U+0800..U+4E00 and Hangul: "[一-龥ࠀ-一가-퟿]+" in llama.cpp */
#define RE_DEEPSEEK_CJK "[\\x{4E00}-\\x{9FA5}\\x{0800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+"
/* Tekken/GPT-4o: [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+ adapted by llama.cpp to lookaheads */
#define RE_UPPER_LOWER "((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+"
#define RE_LOWER_UPPER "((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*"
#define RE_POROS " ?[^(\\s|.,!?\\x{2026}\\x{3002}\\x{FF0C}\\x{3001}\\x{0964}\\x{06D4}\\x{060C})]+"

typedef struct bpe_pre {
    const char *names; /* tokenizer.ggml.pre values, space-separated */
    const char *regex[BPE_MAX_REGEX];
    bool ignore_merges;
} bpe_pre;

static const bpe_pre bpe_pres[] = {
    {"default", {"[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]"}, false},
    {"gpt-2 phi-2 jina-es jina-de gigachat jina-v2-es jina-v2-de a.x-4.0 mellum modern-bert jina-v1-en jina-v2-code "
     "roberta-bpe exaone4 mpt olmo jais trillion granite-docling",
     {RE_GPT2}, false},
    {"llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2 jina-v5-nano", {RE_LLAMA3}, true},
    {"dbrx smaug-bpe glm4 chatglm-bpe", {RE_LLAMA3}, false},
    {"qwen2 deepseek-r1-qwen kormo f2llmv2 megrez stablelm2 hunyuan solar-open grok-2", {RE_QWEN2}, false},
    {"starcoder refact command-r smollm codeshell exaone minerva-7b mellum2", {"\\p{N}", RE_GPT2}, false},
    {"falcon", {"[\\p{P}\\$\\+<=>\\^~\\|`]+", RE_GPT2, "[0-9][0-9][0-9]"}, false},
    {"deepseek-llm",
     {"[\r\n]",
      /* llama.cpp writes these as literal characters; six of them (U+1F7D, U+1FBE, U+1FD3, U+1FDB, U+2126, U+212A)
       * have canonical singletons that an editor may silently normalize, so here they are code points */
      "\\s?[A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}\\x{1C4}-\\x{293}\\x{295}-\\x{2AF}"
      "\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}\\x{37F}\\x{386}\\x{388}-\\x{38A}\\x{38C}\\x{38E}-\\x{3A1}"
      "\\x{3A3}-\\x{3F5}\\x{3F7}-\\x{481}\\x{48A}-\\x{52F}\\x{531}-\\x{556}\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}"
      "\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}"
      "\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}"
      "\\x{1F5D}\\x{1F5F}-\\x{1F7D}\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}\\x{1FC6}-\\x{1FCC}"
      "\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}"
      "\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}\\x{2124}\\x{2126}\\x{2128}\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}"
      "\\x{2139}\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}\\x{214E}\\x{2183}\\x{2184}\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}"
      "\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}"
      "\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}"
      "\\x{10400}-\\x{1044F}\\x{104B0}-\\x{104D3}\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}"
      "\\x{118A0}-\\x{118DF}\\x{1E900}-\\x{1E943}]+",
      "\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3000}-\\x{3002}]+", "\\s+$", RE_DEEPSEEK_CJK,
      "\\p{N}+"},
     false},
    {"deepseek-coder", {"[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", RE_DEEPSEEK_CJK, "\\p{N}"}, false},
    {"poro-chat bloom gpt3-finnish", {RE_POROS}, false},
    {"viking", {RE_POROS, "\\p{N}"}, false},
    {"tekken",
     {"[^\\r\\n\\p{L}\\p{N}]?" RE_UPPER_LOWER "|[^\\r\\n\\p{L}\\p{N}]?" RE_LOWER_UPPER
      "|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
     true},
    {"gpt-4o llama4 kanana2 talkie minimax-m2",
     {"[^\\r\\n\\p{L}\\p{N}]?" RE_UPPER_LOWER RE_CONTRACTIONS "?|[^\\r\\n\\p{L}\\p{N}]?" RE_LOWER_UPPER RE_CONTRACTIONS
      "?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
     false},
    {"qwen35",
     {RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
     false},
    {"seed-coder",
     {RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}, false},
    {"bailingmoe bailingmoe2 llada-moe",
     {"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+"},
     false},
    {"ufakzeka", {"[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}, false},
    {"minicpm5",
     {"\\p{N}{1,3}", RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}+| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
     true},
    {"laguna", {"[^\\n]+|[\\n]+", RE_QWEN2}, false},
    {"jais-2",
     {RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s{512}(?!\\S)"
                      "|\\s{256}(?!\\S)|\\s{128}(?!\\S)|\\s{64}(?!\\S)|\\s{32}(?!\\S)|\\s{16}(?!\\S)|\\s{8}(?!\\S)|\\s{4}(?!\\S)"
                      "|\\s{1,2}(?!\\S)|\\s{1}"},
     false},
    {"exaone-moe",
     {RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?(?:\\p{L}\\p{M}*(?: \\p{L}\\p{M}*)*)+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]?"
                      "|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+"},
     false},
};

static const bpe_pre *find_pre(const char *name) {
    size_t n = strlen(name);
    for (size_t i = 0; i < sizeof bpe_pres / sizeof bpe_pres[0]; i++)
        for (const char *p = bpe_pres[i].names; *p;) {
            size_t w = strcspn(p, " ");
            if (w == n && memcmp(p, name, n) == 0) return &bpe_pres[i];
            p += w + (p[w] == ' ');
        }
    return NULL;
}

/* ---------------------------------------------------------------- regexes: llama.cpp's meaning in PCRE2 */

/* Unicode White_Space, the set llama.cpp's unicode_cpt_flags.is_whitespace holds, as class items */
#define WS_ITEMS "\\t\\n\\x0B\\f\\r\\x20\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"
#define WS_NON_ASCII "[\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}]"

static void put(char **o, const char *s, size_t n) {
    memcpy(*o, s, n);
    *o += n;
}
#define PUT(o, lit) put(o, lit, sizeof lit - 1)

/* Length of the escape at p: \\c, or \\x{..} / \\p{..} / \\P{..} through the brace. */
static size_t escape_len(const char *p) {
    if ((p[1] == 'x' || p[1] == 'p' || p[1] == 'P') && p[2] == '{') {
        const char *close = strchr(p, '}');
        return close ? (size_t)(close - p) + 1 : strlen(p);
    }
    return p[1] ? 2 : 1;
}

/* Scans the class that opens at p: returns the character after its closing ']' (NULL if unclosed), and says
 * whether it is negated and whether it holds \s. */
static const char *scan_class(const char *p, bool *negated, bool *has_space) {
    const char *q = p + 1;
    *negated = *q == '^';
    *has_space = false;
    if (*negated) q++;
    if (*q == ']') q++; /* a leading ] is a literal */
    while (*q && *q != ']') {
        if (*q == '\\') {
            *has_space |= q[1] == 's';
            q += escape_len(q);
        } else {
            q++;
        }
    }
    return *q ? q + 1 : NULL;
}

/* Rewrites one of the regexes above for PCRE2 into out, which has room for 64 * strlen(re) + 1 bytes (a 2-byte
 * \s or \S grows to at most 96, a class of at least 3 bytes by 87):
 * - \s and \S become explicit White_Space classes (PCRE2's \s also matches U+180E, which llama.cpp's does not).
 * - A regex with no \p{..} runs in llama.cpp on std::wregex with every non-ASCII space replaced by U+000B, so a
 *   positive class without \s never matches one (deepseek's [　-。] and [ࠀ-一] span spaces): such classes get a
 *   lookahead that rejects non-ASCII spaces.
 * Returns false for \S inside a class or an unclosed class, which the table never has. */
static bool rewrite_regex(const char *re, char *out) {
    const bool wide_regex = strstr(re, "\\p{") == NULL;
    char *o = out;
    for (const char *p = re; *p;) {
        if (p[0] == '[') {
            bool negated, has_space;
            const char *end = scan_class(p, &negated, &has_space);
            if (!end) return false;
            const bool guard = wide_regex && !negated && !has_space;
            if (guard) PUT(&o, "(?:(?!" WS_NON_ASCII ")");
            for (const char *q = p; q < end;) {
                if (q[0] == '\\' && q[1] == 'S') return false;
                if (q[0] == '\\' && q[1] == 's') {
                    PUT(&o, WS_ITEMS);
                    q += 2;
                } else {
                    size_t n = *q == '\\' ? escape_len(q) : 1;
                    put(&o, q, n);
                    q += n;
                }
            }
            if (guard) PUT(&o, ")");
            p = end;
        } else if (p[0] == '\\' && p[1] == 's') {
            PUT(&o, "[" WS_ITEMS "]");
            p += 2;
        } else if (p[0] == '\\' && p[1] == 'S') {
            PUT(&o, "[^" WS_ITEMS "]");
            p += 2;
        } else {
            size_t n = *p == '\\' ? escape_len(p) : 1;
            put(&o, p, n);
            p += n;
        }
    }
    *o = 0;
    return true;
}

/* ---------------------------------------------------------------- the compiled state */

/* (left id, right id) -> (rank, id of the merged text), open addressing; key UINT64_MAX is empty */
typedef struct bpe_merge {
    uint64_t key;
    int32_t rank;
    int32_t result; /* -1 if the concatenation is not a token (a malformed vocab) */
} bpe_merge;

typedef struct bpe_state {
    const bpe_pre *pre;
    int n_regex;
    pcre2_code *re[BPE_MAX_REGEX];
    bool jit[BPE_MAX_REGEX]; /* JIT-compiled: pcre2_jit_match, which skips pcre2_match's checks, may run it */
    bpe_merge *merges; /* (merge_cap) */
    uint64_t merge_cap;
    /* the merge of two single-byte symbols, indexed by byte a << 8 | byte b (rank -1: none): most lookups are
     * these, and a dense 512 KB table misses the cache far less than the hash table */
    bpe_merge *byte_pairs; /* (65536) */
    /* the fallback for a symbol that is not a token: llama.cpp looks up each byte of its (byte-alphabet) UTF-8
     * text as a one-byte token */
    int32_t one_byte_token[256];
    char alpha[256][2]; /* UTF-8 of kiln_bpe_byte_to_cp[b]: every code point of the alphabet is below U+0800 */
    uint8_t alpha_len[256];
} bpe_state;

static uint64_t mix64(uint64_t x) { /* splitmix64 finalizer */
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

static const bpe_merge *merge_find(const bpe_state *st, int32_t left, int32_t right) {
    uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right, mask = st->merge_cap - 1;
    for (uint64_t h = mix64(key) & mask;; h = (h + 1) & mask) {
        if (st->merges[h].key == key) return &st->merges[h];
        if (st->merges[h].key == UINT64_MAX) return NULL;
    }
}

/* Copies vocab.c's merge table, adding the id each merge makes. */
static kiln_status build_merges(const kiln_tokenizer *t, bpe_state *st) {
    uint64_t cap = 16;
    while (cap < (uint64_t)t->n_merges * 2) cap <<= 1;
    st->merge_cap = cap;
    st->merges = malloc((size_t)cap * sizeof *st->merges);
    if (!st->merges) return kiln_fail(KILN_ERR_NOMEM, "out of memory for %d BPE merges", t->n_merges);
    for (uint64_t i = 0; i < cap; i++) st->merges[i].key = UINT64_MAX;
    char *buf = NULL;
    size_t buf_cap = 0;
    for (uint64_t s = 0; s < t->merge_cap; s++) {
        uint64_t key = t->merge_keys[s];
        if (key == UINT64_MAX) continue;
        const tok_entry *l = &t->tokens[key >> 32], *r = &t->tokens[(uint32_t)key];
        size_t n = (size_t)l->len + r->len;
        if (n > buf_cap) {
            char *nb = realloc(buf, n);
            if (!nb) {
                free(buf);
                return kiln_fail(KILN_ERR_NOMEM, "out of memory");
            }
            buf = nb, buf_cap = n;
        }
        memcpy(buf, l->text, l->len);
        memcpy(buf + l->len, r->text, r->len);
        uint64_t mask = cap - 1, h = mix64(key) & mask;
        while (st->merges[h].key != UINT64_MAX) h = (h + 1) & mask;
        st->merges[h] = (bpe_merge){key, t->merge_ranks[s], kiln_tok_find(t, buf, n)};
    }
    free(buf);
    st->byte_pairs = malloc(65536 * sizeof *st->byte_pairs);
    if (!st->byte_pairs) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    for (int a = 0; a < 256; a++)
        for (int b = 0; b < 256; b++) {
            int32_t l = t->byte_token[a], r = t->byte_token[b];
            const bpe_merge *m = l < 0 || r < 0 ? NULL : merge_find(st, l, r);
            st->byte_pairs[a << 8 | b] = m ? *m : (bpe_merge){0, -1, -1};
        }
    return KILN_OK;
}

kiln_status kiln_bpe_init(kiln_tokenizer *t) {
    const bpe_pre *pre = find_pre(t->pre);
    if (!pre)
        return kiln_fail(KILN_ERR_UNSUPPORTED,
                         "BPE pre-tokenizer '%s' (tokenizer.ggml.pre) is not supported; llama.cpp refuses names it does not "
                         "know, and kiln lacks some it knows (e.g. gemma4, kimi-k2, deepseek-v3)",
                         t->pre);
    bpe_state *st = calloc(1, sizeof *st);
    if (!st) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    t->bpe = st;
    st->pre = pre;
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        st->one_byte_token[b] = kiln_tok_find(t, &c, 1);
        char buf[4];
        st->alpha_len[b] = (uint8_t)kiln_utf8_encode(kiln_bpe_byte_to_cp[b], buf);
        memcpy(st->alpha[b], buf, 2);
    }
    kiln_status s = build_merges(t, st);
    if (s) return s;
    for (int i = 0; i < BPE_MAX_REGEX && pre->regex[i]; i++) {
        size_t n = strlen(pre->regex[i]);
        char *pattern = malloc(64 * n + 1);
        if (!pattern) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
        if (!rewrite_regex(pre->regex[i], pattern)) {
            free(pattern);
            return kiln_fail(KILN_ERR_UNSUPPORTED, "pre-tokenizer '%s': regex %d has a construct kiln cannot translate",
                             t->pre, i);
        }
        int err;
        PCRE2_SIZE at;
        /* DOLLAR_ENDONLY: $ is ECMAScript's end of the piece, not also "before a final newline" */
        st->re[i] = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY,
                                  &err, &at, NULL);
        free(pattern);
        if (!st->re[i]) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(err, msg, sizeof msg);
            return kiln_fail(KILN_ERR_FORMAT, "pre-tokenizer '%s': regex %d does not compile at offset %zu: %s", t->pre, i,
                             (size_t)at, (const char *)msg);
        }
        st->n_regex = i + 1;
        st->jit[i] = pcre2_jit_compile(st->re[i], PCRE2_JIT_COMPLETE) == 0; /* else (no JIT on this CPU) interpreted */
    }
    return KILN_OK;
}

void kiln_bpe_free(kiln_tokenizer *t) {
    if (!t || !t->bpe) return;
    bpe_state *st = t->bpe;
    for (int i = 0; i < BPE_MAX_REGEX; i++) pcre2_code_free(st->re[i]);
    free(st->merges);
    free(st->byte_pairs);
    free(st);
    t->bpe = NULL;
}

/* ---------------------------------------------------------------- one call's scratch */

typedef struct bpe_pair {
    uint64_t key;   /* rank << 32 | left: llm_bigram_bpe's order, the lowest rank first, then the leftmost */
    int32_t right;
    int32_t result; /* the merged id */
    uint32_t size;  /* left + right bytes when queued: a pair whose symbols changed since is stale */
} bpe_pair;

/* A symbol of the word being merged: symbol i starts at byte i of the word. */
typedef struct bpe_sym {
    int32_t id;         /* the token it is, -1 if none */
    int32_t prev, next; /* neighbours in the chain, -1 at the ends */
    uint32_t len;       /* bytes; 0 once merged into its left neighbour */
} bpe_sym;

typedef struct cache_entry {
    uint64_t hash;
    size_t key;     /* the word is text[key .. key + key_len) of the call's (normalized) text */
    uint32_t key_len; /* 0: empty slot */
    uint32_t n_ids;
    size_t ids;     /* into the session's id arena */
} cache_entry;

typedef struct bpe_session {
    const kiln_tokenizer *t;
    const bpe_state *st;
    const char *text;  /* the text the words are cut from: the input, or its replacement when invalid */
    size_t text_len;
    const char *match; /* the text the regexes see: text with surrogates as U+E000 */
    char *norm, *norm_match; /* owned copies when the input was invalid UTF-8 */
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jit_stack;
    size_t *ends[2]; /* word ends, the pieces before and after one regex */
    size_t ends_n[2], ends_cap[2];
    bpe_sym *sym;
    size_t sym_cap;
    bpe_pair *heap;
    size_t heap_n, heap_cap;
    char *word_alpha; /* a word in the byte alphabet (ignore_merges) */
    size_t word_alpha_cap;
    int32_t *ids; /* arena: the ids of cached words, then those of the word at hand */
    size_t ids_n, ids_cap;
    cache_entry *cache;
    size_t cache_n, cache_cap;
} bpe_session;

/* Words longer than this are encoded every time: they rarely repeat, and the cache keeps its keys short. */
#define CACHE_MAX_WORD 256
/* A text of fewer words goes without a cache: setting one up would cost more than it saves. */
#define CACHE_MIN_WORDS 64

/* The array p of *cap elem-byte items, reallocated to hold at least need. Out of memory, it frees p and returns
 * NULL with *cap 0: the call is failing anyway. */
static void *grow_array(void *p, size_t *cap, size_t need, size_t elem) {
    size_t c = *cap ? *cap : 64;
    while (c < need && c <= SIZE_MAX / 4 / elem) c *= 2;
    void *q = c >= need ? realloc(p, c * elem) : NULL;
    if (!q) free(p);
    *cap = q ? c : 0;
    return q;
}
/* true when the array p (with cap) holds need items, growing it if it must */
#define GROW(p, cap, need) ((need) <= (cap) || ((p) = grow_array((p), &(cap), (need), sizeof *(p))) != NULL)

static void session_free(bpe_session *s) {
    free(s->norm);
    free(s->norm_match);
    pcre2_match_data_free(s->md);
    pcre2_match_context_free(s->mctx);
    pcre2_jit_stack_free(s->jit_stack);
    free(s->ends[0]);
    free(s->ends[1]);
    free(s->sym);
    free(s->heap);
    free(s->word_alpha);
    free(s->ids);
    free(s->cache);
}

static kiln_status oom(void) { return kiln_fail(KILN_ERR_NOMEM, "out of memory while BPE-encoding"); }

/* ---------------------------------------------------------------- UTF-8 as llama.cpp reads it */

/* Length of the valid UTF-8 prefix of s[0..n). */
static size_t valid_utf8_prefix(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        if (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (!(w & 0x8080808080808080ULL)) {
                i += 8;
                continue;
            }
        }
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp;
        int l = kiln_utf8_decode(s + i, n - i, &cp);
        if (!l) return i;
        i += (size_t)l;
    }
    return n;
}

/* llama.cpp's unicode_cpt_from_utf8: checks the lead byte's length and the continuation bytes, nothing else
 * (overlong forms and surrogates pass). Returns the length, or 0 where it throws. */
static int lax_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp) {
    unsigned char c = s[0];
    int len = c < 0x80 ? 1 : !(c & 0x40) ? 0 : !(c & 0x20) ? 2 : !(c & 0x10) ? 3 : !(c & 0x08) ? 4 : 0;
    if (len == 0 || (size_t)len > n) return 0;
    uint32_t v = len == 1 ? c : c & (0x7F >> len);
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        v = v << 6 | (s[i] & 0x3F);
    }
    *cp = v;
    return len;
}

/* Builds the text llama.cpp tokenizes for an input that is not valid UTF-8: each code point its lax decoder reads,
 * re-encoded, and U+FFFD for each byte it rejects. The regexes see a copy with surrogates (which PCRE2 refuses)
 * as U+E000: both are category C to every regex here, and both are 3 bytes. */
static kiln_status normalize_text(bpe_session *s, const unsigned char *in, size_t n) {
    if (n > SIZE_MAX / 3) return oom();
    s->norm = malloc(3 * n + 1);
    s->norm_match = malloc(3 * n + 1);
    if (!s->norm || !s->norm_match) return oom();
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp = 0xFFFD;
        int l = lax_utf8_decode(in + i, n - i, &cp);
        if (l == 0 || cp > 0x10FFFF) cp = 0xFFFD, l = 1;
        i += (size_t)l;
        int m = kiln_utf8_encode(cp, s->norm + o);
        if (cp >= 0xD800 && cp <= 0xDFFF) memcpy(s->norm_match + o, "\xEE\x80\x80", 3);
        else memcpy(s->norm_match + o, s->norm + o, (size_t)m);
        o += (size_t)m;
    }
    s->text = s->norm;
    s->match = s->norm_match;
    s->text_len = o;
    return KILN_OK;
}

/* ---------------------------------------------------------------- splitting */

static kiln_status push_end(bpe_session *s, int k, size_t end) {
    if (!GROW(s->ends[k], s->ends_cap[k], s->ends_n[k] + 1)) return oom();
    s->ends[k][s->ends_n[k]++] = end;
    return KILN_OK;
}

/* One match of regex r; a JIT stack overflow (a group repeated over a long word) retries with a big JIT stack,
 * then with the interpreter. */
static int match_at(bpe_session *s, int r, const char *subj, size_t n, size_t at, uint32_t opts) {
    const pcre2_code *re = s->st->re[r];
    int rc = s->st->jit[r] && !opts ? pcre2_jit_match(re, (PCRE2_SPTR)subj, n, at, 0, s->md, s->mctx)
                                    : pcre2_match(re, (PCRE2_SPTR)subj, n, at, opts | PCRE2_NO_UTF_CHECK, s->md, s->mctx);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !s->jit_stack) {
        s->jit_stack = pcre2_jit_stack_create(32 * 1024, 64 * 1024 * 1024, NULL);
        if (!s->mctx) s->mctx = pcre2_match_context_create(NULL);
        if (s->jit_stack && s->mctx) {
            pcre2_jit_stack_assign(s->mctx, NULL, s->jit_stack);
            rc = pcre2_match(re, (PCRE2_SPTR)subj, n, at, opts | PCRE2_NO_UTF_CHECK, s->md, s->mctx);
        }
    }
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
        rc = pcre2_match(re, (PCRE2_SPTR)subj, n, at, opts | PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, s->md, s->mctx);
    return rc;
}

/* Splits match[start..end) with regex r into matches and the gaps between them (unicode_regex_split_stl),
 * appending the ends to list k. A zero-length match only separates: as std::regex_iterator does, the next try
 * is a non-empty match anchored there, then a search one character on. */
static kiln_status split_piece(bpe_session *s, int r, size_t start, size_t end, int k) {
    const char *subj = s->match + start;
    size_t n = end - start, at = 0, gap = 0;
    uint32_t opts = 0;
    kiln_status st;
    while (at <= n) {
        int rc = match_at(s, r, subj, n, at, opts);
        if (rc == PCRE2_ERROR_NOMATCH) {
            if (!opts) break;
            opts = 0; /* no non-empty match at an empty one: search from the next character */
            at++;
            while (at < n && ((unsigned char)subj[at] & 0xC0) == 0x80) at++;
            continue;
        }
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return kiln_fail(KILN_ERR_UNSUPPORTED, "pre-tokenizer '%s', regex %d, at byte %zu: %s", s->t->pre, r, start + at,
                             (const char *)msg);
        }
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(s->md);
        size_t ms = ov[0], me = ov[1];
        if (ms > gap && (st = push_end(s, k, start + ms))) return st;
        if (me > ms && (st = push_end(s, k, start + me))) return st;
        gap = me;
        at = me;
        opts = me == ms ? PCRE2_NOTEMPTY_ATSTART | PCRE2_ANCHORED : 0;
    }
    if (gap < n && (st = push_end(s, k, end))) return st;
    return KILN_OK;
}

/* Runs the regexes in turn over the text; leaves the word ends in ends[*k]. */
static kiln_status split_text(bpe_session *s, size_t n, int *k_out) {
    int k = 0;
    s->ends_n[0] = 0;
    kiln_status st;
    if (n && (st = push_end(s, 0, n))) return st;
    for (int r = 0; r < s->st->n_regex; r++) {
        int nk = k ^ 1;
        s->ends_n[nk] = 0;
        size_t start = 0;
        for (size_t i = 0; i < s->ends_n[k]; i++) {
            if ((st = split_piece(s, r, start, s->ends[k][i], nk))) return st;
            start = s->ends[k][i];
        }
        k = nk;
    }
    *k_out = k;
    return KILN_OK;
}

/* ---------------------------------------------------------------- merging one word */

static bool pair_before(const bpe_pair *a, const bpe_pair *b) { return a->key < b->key; }

static bool heap_push(bpe_session *s, bpe_pair p) {
    if (!GROW(s->heap, s->heap_cap, s->heap_n + 1)) return false;
    size_t i = s->heap_n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!pair_before(&p, &s->heap[parent])) break;
        s->heap[i] = s->heap[parent];
        i = parent;
    }
    s->heap[i] = p;
    return true;
}

static bpe_pair heap_pop(bpe_session *s) {
    bpe_pair top = s->heap[0], last = s->heap[--s->heap_n];
    size_t i = 0, n = s->heap_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && pair_before(&s->heap[c + 1], &s->heap[c])) c++;
        if (!pair_before(&s->heap[c], &last)) break;
        s->heap[i] = s->heap[c];
        i = c;
    }
    if (n) s->heap[i] = last;
    return top;
}

/* Queues the pair (left, right) of the word w if the two symbols have a merge
 * (llm_tokenizer_bpe_session::add_new_bigram). */
static bool add_pair(bpe_session *s, const unsigned char *w, int32_t left, int32_t right) {
    if (left < 0 || right < 0) return true;
    const bpe_sym *a = &s->sym[left], *b = &s->sym[right];
    const bpe_merge *m;
    if (a->len == 1 && b->len == 1) {
        m = &s->st->byte_pairs[w[left] << 8 | w[right]];
        if (m->rank < 0) return true;
    } else {
        if (a->id < 0 || b->id < 0 || !(m = merge_find(s->st, a->id, b->id))) return true;
    }
    bpe_pair p = {(uint64_t)(uint32_t)m->rank << 32 | (uint32_t)left, right, m->result, a->len + b->len};
    return heap_push(s, p);
}

static bool push_id(bpe_session *s, int32_t id) {
    if (!GROW(s->ids, s->ids_cap, s->ids_n + 1)) return false;
    s->ids[s->ids_n++] = id;
    return true;
}

/* A symbol that is no token: each byte of its byte-alphabet text as a one-byte token, those that exist. */
static bool push_fallback(bpe_session *s, const unsigned char *w, size_t n) {
    for (size_t i = 0; i < n; i++)
        for (int j = 0; j < s->st->alpha_len[w[i]]; j++) {
            int32_t id = s->st->one_byte_token[(unsigned char)s->st->alpha[w[i]][j]];
            if (id >= 0 && !push_id(s, id)) return false;
        }
    return true;
}

/* Appends the ids of one word (raw bytes w[0..n)) to the id arena. */
static kiln_status encode_word(bpe_session *s, const unsigned char *w, size_t n) {
    const kiln_tokenizer *t = s->t;
    if (s->st->pre->ignore_merges && n > 1) {
        if (!GROW(s->word_alpha, s->word_alpha_cap, 2 * n)) return oom();
        size_t m = 0;
        for (size_t i = 0; i < n; i++) {
            memcpy(s->word_alpha + m, s->st->alpha[w[i]], s->st->alpha_len[w[i]]);
            m += s->st->alpha_len[w[i]];
        }
        int32_t id = kiln_tok_find(t, s->word_alpha, m);
        if (id >= 0) return push_id(s, id) ? KILN_OK : oom();
    }
    if (n == 1) {
        int32_t id = t->byte_token[w[0]];
        if (id >= 0) return push_id(s, id) ? KILN_OK : oom();
        return push_fallback(s, w, 1) ? KILN_OK : oom();
    }
    if (n > INT32_MAX) return kiln_fail(KILN_ERR_UNSUPPORTED, "a pre-tokenizer word of %zu bytes is too long", n);
    if (!GROW(s->sym, s->sym_cap, n)) return oom();
    bpe_sym *sym = s->sym;
    for (size_t i = 0; i < n; i++)
        sym[i] = (bpe_sym){t->byte_token[w[i]], (int32_t)i - 1, i + 1 < n ? (int32_t)i + 1 : -1, 1};
    s->heap_n = 0;
    for (size_t i = 1; i < n; i++)
        if (!add_pair(s, w, (int32_t)i - 1, (int32_t)i)) return oom();
    while (s->heap_n) {
        bpe_pair p = heap_pop(s);
        int32_t l = (int32_t)(uint32_t)p.key, r = p.right;
        if (sym[l].len == 0 || sym[r].len == 0 || sym[l].len + sym[r].len != p.size) continue;
        sym[l].id = p.result;
        sym[l].len += sym[r].len;
        sym[r].len = 0;
        sym[l].next = sym[r].next;
        if (sym[r].next >= 0) sym[sym[r].next].prev = l;
        if (!add_pair(s, w, sym[l].prev, l) || !add_pair(s, w, l, sym[l].next)) return oom();
    }
    for (int32_t i = 0; i != -1; i = sym[i].next) {
        if (sym[i].id >= 0) {
            if (!push_id(s, sym[i].id)) return oom();
        } else if (!push_fallback(s, w + i, sym[i].len)) {
            return oom();
        }
    }
    return KILN_OK;
}

/* ---------------------------------------------------------------- the word cache */

static uint64_t hash_bytes(const unsigned char *p, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ n;
    for (; n >= 8; p += 8, n -= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        h = (h ^ v) * 0xff51afd7ed558ccdULL;
        h ^= h >> 32;
    }
    uint64_t v = 0; /* byte by byte: a memcpy of n < 8 bytes through the stack stalls store forwarding */
    for (size_t i = 0; i < n; i++) v |= (uint64_t)p[i] << (8 * i);
    return mix64(h ^ v);
}

static bool cache_grow(bpe_session *s) {
    size_t cap = s->cache_cap ? s->cache_cap * 2 : 1024;
    cache_entry *c = calloc(cap, sizeof *c);
    if (!c) return false;
    for (size_t i = 0; i < s->cache_cap; i++) {
        if (!s->cache[i].key_len) continue;
        size_t h = (size_t)s->cache[i].hash & (cap - 1);
        while (c[h].key_len) h = (h + 1) & (cap - 1);
        c[h] = s->cache[i];
    }
    free(s->cache);
    s->cache = c;
    s->cache_cap = cap;
    return true;
}

static kiln_status append_ids(kiln_tokens *out, const int32_t *ids, size_t n) {
    if (out->n + n > out->cap) {
        size_t cap = out->cap ? out->cap : 64;
        while (cap < out->n + n) cap *= 2;
        int32_t *p = realloc(out->ids, cap * sizeof *p);
        if (!p) return kiln_fail(KILN_ERR_NOMEM, "out of memory for %zu token ids", cap);
        out->ids = p;
        out->cap = cap;
    }
    memcpy(out->ids + out->n, ids, n * sizeof *ids);
    out->n += n;
    return KILN_OK;
}

/* Encodes the word text[start..start+n) into out, through the cache. */
static kiln_status emit_word(bpe_session *s, size_t start, size_t n, kiln_tokens *out) {
    const unsigned char *w = (const unsigned char *)s->text + start;
    kiln_status st;
    if (n > CACHE_MAX_WORD || !s->cache_cap) { /* its ids leave the arena once copied */
        size_t base = s->ids_n;
        if ((st = encode_word(s, w, n))) return st;
        st = append_ids(out, s->ids + base, s->ids_n - base);
        s->ids_n = base;
        return st;
    }
    uint64_t h = hash_bytes(w, n);
    size_t mask = s->cache_cap - 1, i = (size_t)h & mask;
    for (; s->cache[i].key_len; i = (i + 1) & mask) {
        const cache_entry *e = &s->cache[i];
        if (e->hash == h && e->key_len == n && memcmp(s->text + e->key, w, n) == 0)
            return append_ids(out, s->ids + e->ids, e->n_ids);
    }
    size_t base = s->ids_n;
    if ((st = encode_word(s, w, n))) return st;
    if ((st = append_ids(out, s->ids + base, s->ids_n - base))) return st;
    s->cache[i] = (cache_entry){h, start, (uint32_t)n, (uint32_t)(s->ids_n - base), base};
    if (++s->cache_n * 2 > s->cache_cap && !cache_grow(s)) return oom();
    return KILN_OK;
}

/* ---------------------------------------------------------------- entry points */

static kiln_status session_begin(bpe_session *s, const kiln_tokenizer *t, const char *text, size_t len) {
    memset(s, 0, sizeof *s);
    s->t = t;
    s->st = t->bpe;
    if (!s->st) return kiln_fail(KILN_ERR_INVALID, "tokenizer '%s' has no BPE pre-tokenizer", t->model);
    s->text = s->match = text;
    s->text_len = len;
    s->md = pcre2_match_data_create(1, NULL);
    if (!s->md) return oom();
    const unsigned char *in = (const unsigned char *)text;
    if (valid_utf8_prefix(in, len) < len) return normalize_text(s, in, len);
    return KILN_OK;
}

kiln_status kiln_bpe_encode(const kiln_tokenizer *t, const char *text, size_t len, kiln_tokens *out) {
    bpe_session s;
    kiln_status st = session_begin(&s, t, text, len);
    int k = 0;
    if (!st) st = split_text(&s, s.text_len, &k);
    if (!st && s.ends_n[k] >= CACHE_MIN_WORDS && !cache_grow(&s)) st = oom();
    size_t start = 0;
    for (size_t i = 0; !st && i < s.ends_n[k]; i++) {
        st = emit_word(&s, start, s.ends[k][i] - start, out);
        start = s.ends[k][i];
    }
    session_free(&s);
    return st;
}

kiln_status kiln_bpe_split(const kiln_tokenizer *t, const char *text, size_t len, size_t **ends, size_t *n) {
    *ends = NULL, *n = 0;
    bpe_session s;
    kiln_status st = session_begin(&s, t, text, len);
    int k = 0;
    if (!st) st = split_text(&s, s.text_len, &k);
    if (!st) {
        *ends = s.ends[k], *n = s.ends_n[k];
        s.ends[k] = NULL;
    }
    session_free(&s);
    return st;
}
