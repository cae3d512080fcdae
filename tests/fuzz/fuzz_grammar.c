/* fuzz_grammar.c: libFuzzer harness for the GBNF parser and the matcher's code-point walk (src/infer/grammar.c,
 * `make fuzz-grammar FUZZ_SECONDS=N`). The input up to its first NUL byte is a grammar; what follows is a text. The
 * grammar is parsed (from its root, then from a rule named "value"); when it parses, the text and each of its
 * prefixes are matched against it. A malformed grammar must be a status with a message, never a crash, a hang or
 * a read out of bounds (ASan, UBSan); inputs that crash land in tests/fuzz/crashes/. */
#include "kiln.h"

#include <stdint.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nul = memchr(data, 0, size);
    const size_t n_g = nul ? (size_t)(nul - data) : size;
    const char *text = nul ? (const char *)nul + 1 : "";
    const size_t n_t = nul ? size - n_g - 1 : 0;
    static const char *const roots[2] = {NULL, "value"};
    for (int r = 0; r < 2; r++) {
        kiln_grammar *g = NULL;
        if (kiln_grammar_parse((const char *)data, n_g, roots[r], &g) != KILN_OK) {
            if (g || !kiln_last_error()[0]) __builtin_trap(); /* a failure has its message and leaves nothing */
            continue;
        }
        bool full, prefix;
        for (size_t k = 0; k <= n_t && k <= 64; k++) kiln_grammar_match_text(g, text, k, &full, &prefix);
        kiln_grammar_match_text(g, text, n_t, &full, &prefix);
        kiln_grammar_free(g);
    }
    return 0;
}
