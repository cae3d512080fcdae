/* grammar_vocab.c: a tokenizer's vocabulary as the GBNF matcher (grammar_mask.c) walks it: each token's bytes (none
 * for control tokens and empty pieces) in a trie, built once per vocab and shared by the matchers made on it.
 * Tested through the masks of tests/test_grammar.c, on the bundled model's vocab and those of ../shared/data/vocab. */
#include "grammar_match.h"
#include "status.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const uint8_t *b;
    int32_t n, id;
} tok_ref;

static int cmp_tok(const void *x, const void *y) {
    const tok_ref *a = x, *b = y;
    const int32_t n = a->n < b->n ? a->n : b->n;
    const int c = memcmp(a->b, b->b, (size_t)n);
    return c ? c : (a->n > b->n) - (a->n < b->n);
}

void kiln_grammar_vocab_free(kiln_grammar_vocab *v) {
    if (!v) return;
    for (int32_t i = 0; v->bytes && i < v->V; i++) free(v->bytes[i]);
    free(v->bytes), free(v->len), free(v->node), free(v->edge), free(v->toks), free(v);
}

/* The trie of the tokens' bytes: sorted, each token shares the nodes of its common prefix with the one before. */
static kiln_status build_trie(kiln_grammar_vocab *m) {
    tok_ref *t = malloc((size_t)m->V * sizeof *t);
    int32_t n = 0, max_len = 0;
    size_t total = 1;
    if (!t) return kiln_fail(KILN_ERR_NOMEM, "grammar: out of memory for the vocab's trie");
    for (int32_t i = 0; i < m->V; i++)
        if (m->bytes[i]) {
            t[n++] = (tok_ref){m->bytes[i], m->len[i], i};
            total += (size_t)m->len[i];
            if (m->len[i] > max_len) max_len = m->len[i];
        }
    qsort(t, (size_t)n, sizeof *t, cmp_tok);
    /* at most one node per byte of all tokens (plus the root); edges are one fewer than nodes */
    if (total > INT32_MAX) {
        free(t);
        return kiln_fail(KILN_ERR_NOMEM, "grammar: the vocab's trie is too large");
    }
    m->node = calloc(total, sizeof *m->node);
    m->edge = malloc(total * sizeof *m->edge);
    m->toks = malloc((size_t)(n ? n : 1) * sizeof *m->toks);
    int32_t *path = malloc((size_t)(max_len + 1) * sizeof *path);
    if (!m->node || !m->edge || !m->toks || !path) {
        free(t), free(path);
        return kiln_fail(KILN_ERR_NOMEM, "grammar: out of memory for the vocab's trie");
    }
    /* Nodes are numbered in DFS preorder, so a node's children come after it; their edges are appended in byte
     * order as the sorted tokens reach them. Edges are grouped per node afterwards by a counting pass. */
    int32_t n_node = 1, n_edge = 0;
    int32_t *parent = malloc(total * sizeof *parent);
    uint8_t *pbyte = malloc(total);
    if (!parent || !pbyte) {
        free(t), free(path), free(parent), free(pbyte);
        return kiln_fail(KILN_ERR_NOMEM, "grammar: out of memory for the vocab's trie");
    }
    path[0] = 0;
    int32_t depth_prev = 0;
    const uint8_t *prev = NULL;
    for (int32_t k = 0; k < n; k++) {
        int32_t common = 0;
        if (prev)
            while (common < t[k].n && common < depth_prev && prev[common] == t[k].b[common]) common++;
        for (int32_t d = common; d < t[k].n; d++) {
            const int32_t c = n_node++;
            parent[c] = path[d], pbyte[c] = t[k].b[d];
            path[d + 1] = c;
            n_edge++;
        }
        const int32_t end = path[t[k].n];
        if (m->node[end].n_tok == 0) m->node[end].first_tok = k;
        m->node[end].n_tok++;
        m->toks[k] = t[k].id;
        prev = t[k].b, depth_prev = t[k].n;
    }
    /* edges grouped by parent, in creation order (which is byte order within a parent) */
    for (int32_t c = 1; c < n_node; c++) m->node[parent[c]].n_edge++;
    int32_t at = 0;
    for (int32_t v = 0; v < n_node; v++) m->node[v].first_edge = at, at += m->node[v].n_edge, m->node[v].n_edge = 0;
    for (int32_t c = 1; c < n_node; c++) {
        tnode *pn = &m->node[parent[c]];
        m->edge[pn->first_edge + pn->n_edge++] = (tedge){pbyte[c], c};
    }
    (void)n_edge;
    m->n_node = n_node, m->max_len = max_len;
    free(t), free(path), free(parent), free(pbyte);
    return KILN_OK;
}

kiln_status kiln_grammar_vocab_new(const kiln_tokenizer *tok, kiln_grammar_vocab **out) {
    *out = NULL;
    kiln_grammar_vocab *m = calloc(1, sizeof *m);
    if (!m) return kiln_fail(KILN_ERR_NOMEM, "grammar: out of memory");
    m->V = kiln_tokenizer_n_vocab(tok);
    m->eos = kiln_tokenizer_eos(tok);
    m->bytes = calloc((size_t)m->V, sizeof *m->bytes);
    m->len = calloc((size_t)m->V, sizeof *m->len);
    kiln_status st = m->bytes && m->len ? KILN_OK : kiln_fail(KILN_ERR_NOMEM, "grammar: out of memory");
    char buf[256];
    for (int32_t i = 0; !st && i < m->V; i++) {
        const kiln_token_type tt = kiln_tokenizer_token_type(tok, i);
        if (tt == KILN_TOKEN_CONTROL) continue;
        size_t n = 0;
        if ((st = kiln_tokenizer_piece(tok, i, false, buf, sizeof buf, &n))) break;
        if (n == 0 || n > sizeof buf) continue; /* empty, or longer than 256 bytes: never allowed */
        if (!(m->bytes[i] = malloc(n))) st = kiln_fail(KILN_ERR_NOMEM, "grammar: out of memory");
        else memcpy(m->bytes[i], buf, n), m->len[i] = (int32_t)n;
    }
    if (!st) st = build_trie(m);
    if (st) {
        kiln_grammar_vocab_free(m);
        return st;
    }
    *out = m;
    return KILN_OK;
}
