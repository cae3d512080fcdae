/* fuzz_tokenize.c: libFuzzer harness for the tokenizers (`make fuzz-tokenize FUZZ_SECONDS=N`).
 * Random bytes are encoded by one SentencePiece, one byte-level BPE and one WordPiece vocab from
 * ../shared/data/vocab (KILN_DATA overrides the folder), with special-token parsing on and off, and decoded
 * again. Invalid UTF-8 must never crash; for valid UTF-8 the byte-level BPE must decode back to the input
 * bytes exactly.
 * Seeds (tests/fuzz/corpus-tok): short hand-written strings, and excerpts of a few KB, cut at line ends, of
 * ../shared/data/corpora so that mutations start from long real text: tr-ud.txt and tr-ud-test.txt from the UD
 * Turkish-BOUN treebank (dev and test sentences, CC BY-SA 4.0, Universal Dependencies), en-shakespeare.txt
 * (tinyshakespeare, public domain), en-tinystories.txt (TinyStories V2 validation, CDLA-Sharing-1.0),
 * en-jargon.txt (the Jargon File 4.4.7, public domain), and code-c.txt, C from kiln's src/train/data.c. */
#include "kiln.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static kiln_tokenizer *spm, *bpe, *wpm;

static kiln_tokenizer *load(const char *name) {
    const char *dir = getenv("KILN_DATA");
    char path[1024];
    snprintf(path, sizeof path, "%s/vocab/%s", dir && *dir ? dir : "../shared/data", name);
    kiln_tokenizer *t;
    if (kiln_tokenizer_load_file(path, &t) != KILN_OK) {
        fprintf(stderr, "fuzz_tokenize: %s\n", kiln_last_error());
        exit(1);
    }
    return t;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    spm = load("ggml-vocab-llama-spm.gguf");
    bpe = load("ggml-vocab-gpt-2.gguf");
    wpm = load("ggml-vocab-bert-bge.gguf");
    return 0;
}

/* Encodes and decodes; when lossless, the decoded bytes must equal the input (SPM: after its dummy prefix). */
static void round_trip(const kiln_tokenizer *t, const uint8_t *data, size_t size, bool parse_special, bool lossless) {
    kiln_tokens ids = {0};
    if (kiln_tokenizer_encode(t, (const char *)data, size, false, parse_special, &ids) != KILN_OK) __builtin_trap();
    char *text = NULL;
    size_t len = 0;
    if (kiln_tokenizer_decode(t, ids.ids, ids.n, true, &text, &len) != KILN_OK) __builtin_trap();
    if (lossless && !parse_special && (len != size || memcmp(text, data, size) != 0)) __builtin_trap();
    free(text);
    kiln_tokens_free(&ids);
}

/* Strict UTF-8: no overlongs, surrogates or code points past U+10FFFF. */
static bool valid_utf8(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n;) {
        uint8_t c = s[i];
        size_t len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
        if (!len || i + len > n) return false;
        uint32_t cp = len == 1 ? c : c & (0x7F >> len);
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return false;
            cp = cp << 6 | (s[i + k] & 0x3F);
        }
        if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) || cp > 0x10FFFF ||
            (cp >= 0xD800 && cp <= 0xDFFF))
            return false;
        i += len;
    }
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    bool utf8 = valid_utf8(data, size);
    for (int special = 0; special < 2; special++) {
        round_trip(bpe, data, size, special, utf8);
        round_trip(spm, data, size, special, false);
        round_trip(wpm, data, size, special, false);
    }
    return 0;
}
