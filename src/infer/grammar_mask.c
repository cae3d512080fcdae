/* grammar_mask.c: the matcher that constrains sampling to a GBNF grammar: the allowed-token mask of its state, and
 * accepting a token. Its state is the recognizer's (grammar.c) set of stacks; the tokens are walked in the vocab's
 * trie (grammar_vocab.c).
 *
 * The allowed-token mask. A token is allowed in a state when some stack of it takes the token's bytes (advance
 * acts on each stack alone), so the mask is the union of the masks of the state's stacks, each remembered by the
 * stack's positions (sc: 8 MB of masks, round-robin). A stack's mask, when not remembered, is made in one of three
 * ways, all from a trie of the vocabulary's token bytes (built once per vocab) walked depth first with a state:
 * each completed code point advances it, an empty state prunes the subtree, and a code point still incomplete at a
 * node is kept when some stack's set holds a code point with that prefix.
 *   - chain_mask: the top is a character set e followed by a repetition of it (e{1,m}, x{m,n} and x* of a class).
 *     When no code point the stack below can take first is in e, a token can leave the run only after its last
 *     code point in e: the mask is row m of e's table (the tokens all in e with at most m code points, cumulative
 *     bitsets by count) plus what the stack below takes from e's leaving edges (where a run of e ends in the trie),
 *     remembered per context with each run's length, so each count costs a bitset copy.
 *   - frame_mask: the stack is split into its top frame (the top and the generated rules' entries under it, down
 *     to the first entry of a rule written in the grammar: a string's character and the rest of the string) and
 *     the context below. The frame alone is masked once and shared by every context: its tokens, and the trie nodes
 *     where it can end with bytes below, from which the context is walked. A frame whose runs of its top class stay
 *     on one stack (jchar* in a string, jchar{0,n}: frame_fixed) takes a row of the class's table and the leaving
 *     edges walked with the stacks each run hands over to, without walking the whole trie.
 *   - otherwise the trie walked with the one stack.
 * A code point left incomplete by the accepted tokens (byte-level BPE) is carried into the next token; while one is
 * pending the mask is the trie walked with the whole state. EOS is allowed exactly when the state holds the empty
 * stack (and no code point is half done); control tokens never are. tests/test_grammar.c checks every mask token by
 * token against kiln_grammar_match_text, which walks no trie. */
#include "grammar_match.h"
#include "status.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- the matcher */

/* One stack's allowed tokens, remembered by its positions (the mask of a state is the union of its stacks'). */
typedef struct {
    int32_t *key, n_key, cap_key; /* the stack's positions (its hash in sc_hash) */
    uint64_t *bits;               /* (W) */
} scache;

/* A class e's table, for the stacks whose top is e in a repetition of e (chain_mask, frame_fixed). A leaving edge
 * is where a run of L >= 1 code points of e can end: an edge from the node after them by a byte that begins a code
 * point not (or not surely) in e. */
typedef struct {
    int32_t L, d, edge; /* the run's length, the node's depth, the edge (an index of the vocab's edges) */
} ledge;

typedef struct {
    int32_t L, tok;
} ltok;

typedef struct {
    int32_t pos;   /* an element whose class this is */
    int8_t state;  /* 0 not built, 1 built, -1 too large (the tables unused for it) */
    int32_t K;     /* cum holds k = 0 .. K; no token of e's has more than K code points */
    uint64_t *cum; /* ((K + 1) * W) row k: the tokens all of whose code points (at most k) are in e */
    ledge *le;     /* (n_le) by L ascending */
    int32_t n_le, cap_le;
} ctable;

/* The tokens that one context (the stack below a repetition, expanded) takes after a class's runs, with the run's
 * length, by L ascending. */
typedef struct {
    uint64_t hash;
    int32_t *key, n_key, cap_key; /* the context's positions, then the class */
    ltok *d;
    int32_t n, cap;
    bool used, meets; /* meets: the context can take a code point of the class first (chain_mask does not apply) */
} xcache;

/* A stack's top frame (see frame_split) and what it takes alone: the tokens it takes whatever lies below it, and the
 * trie nodes where it can end with bytes still below (there the stack below takes over). */
typedef struct {
    uint64_t hash;
    int32_t *key, n_key, cap_key; /* the frame's positions */
    uint64_t *bits;               /* (W) */
    int32_t *exit, n_exit, cap_exit; /* (node, depth) pairs */
    bool used;
} fcache;

#define XCACHE 64
#define FCACHE 128
#define STACK_CACHE_BYTES ((size_t)8 << 20) /* the stack masks' memory: 441 masks at 152K tokens */
#define CLASS_TABLE_BYTES ((size_t)64 << 20)

struct kiln_grammar_matcher {
    const kiln_grammar *g;
    const kiln_grammar_vocab *v;
    kiln_grammar_vocab *own; /* made by kiln_grammar_matcher_new from a tokenizer */
    gset cur;
    u8state u8;      /* a code point the accepted tokens left incomplete */
    gset *lvl;       /* (max token length + 2) the walk's sets, one per depth */
    int32_t n_lvl;
    int32_t *scratch, *stk; /* (MAX_DEPTH + 2) each: advance's, and a context's stack being expanded */
    int32_t W;       /* 64-bit words of a mask: (V + 63) / 64 */
    uint64_t *bits;  /* (W) the mask being made */
    uint64_t *dst;   /* where walk marks tokens */
    scache *sc;      /* (n_sc) round-robin */
    uint64_t *sc_hash; /* (n_sc) each slot's stack hash, 0 when unused: scanned at each stack's lookup */
    int32_t n_sc, next_sc;
    int32_t *chain_m;   /* (n_el) for a character set followed by a repetition of it: how many copies at most
                         * (INT32_MAX: unbounded); 0 elsewhere */
    int32_t *chain_cls; /* (n_el) its class's index in ct */
    ctable *ct;
    int32_t n_ct, cap_ct;
    xcache xc[XCACHE];
    int32_t next_xc;
    fcache fc[FCACHE];
    int32_t next_fc;
    fcache *fx;         /* the frame a walk records its ends in (NULL: a plain walk) */
    xcache *xl;         /* the list a walk appends its tokens to, with run length xl_L (NULL: into dst) */
    int32_t xl_L;
    int32_t *el_rule;   /* (n_el) the rule an element is in */
    gset one, ctx, s1; /* a single stack; a context; frame_fixed's second one-stack set */
    gset *runs;        /* (n_runs) frame_fixed: the stacks a run of L code points of a class hands over to */
    int32_t n_runs, cap_runs;
    int64_t hits, misses;
};

void kiln_grammar_matcher_free(kiln_grammar_matcher *m) {
    if (!m) return;
    for (int32_t i = 0; m->lvl && i < m->n_lvl; i++) kiln_grammar_gset_free(&m->lvl[i]);
    for (int32_t i = 0; m->sc && i < m->n_sc; i++) free(m->sc[i].key), free(m->sc[i].bits);
    for (int32_t i = 0; i < m->n_ct; i++) free(m->ct[i].cum), free(m->ct[i].le);
    for (int i = 0; i < XCACHE; i++) free(m->xc[i].key), free(m->xc[i].d);
    for (int i = 0; i < FCACHE; i++) free(m->fc[i].key), free(m->fc[i].bits), free(m->fc[i].exit);
    kiln_grammar_gset_free(&m->cur), kiln_grammar_gset_free(&m->one);
    kiln_grammar_gset_free(&m->ctx), kiln_grammar_gset_free(&m->s1);
    for (int32_t i = 0; i < m->n_runs; i++) kiln_grammar_gset_free(&m->runs[i]);
    free(m->runs);
    kiln_grammar_vocab_free(m->own);
    free(m->lvl), free(m->scratch), free(m->stk), free(m->bits), free(m->sc), free(m->sc_hash), free(m->chain_m), free(m->chain_cls), free(m->ct);
    free(m->el_rule);
    free(m);
}

/* ---------------------------------------------------------------- repetitions of one character set */

static bool same_class(const kiln_grammar *g, const gelem *a, const gelem *b) {
    return a->neg == b->neg && a->n == b->n &&
           (a->a == b->a || memcmp(g->rng + 2 * (size_t)a->a, g->rng + 2 * (size_t)b->a, 2 * (size_t)a->n * sizeof *g->rng) == 0);
}

/* R ::= e R' | () or R ::= e | () (in either order): a rule of a repetition of the character set e, as the parser
 * makes x{m,n} and x* of a class. *q is e's position, *next R' (-1 for the last). */
static bool chain_shape(const kiln_grammar *g, int32_t R, int32_t *q, int32_t *next) {
    if (g->rule_alt[R + 1] - g->rule_alt[R] != 2) return false;
    int32_t a0 = g->alt[g->rule_alt[R]], a1 = g->alt[g->rule_alt[R] + 1];
    if (g->el[a0].type == GE_END) {
        const int32_t t = a0;
        a0 = a1, a1 = t;
    }
    if (g->el[a1].type != GE_END || g->el[a0].type != GE_CHAR) return false;
    *q = a0;
    if (g->el[a0 + 1].type == GE_END) {
        *next = -1;
        return true;
    }
    *next = g->el[a0 + 1].a;
    return g->el[a0 + 1].type == GE_RULE && g->el[a0 + 2].type == GE_END;
}

/* For each rule, how many copies of its class a chain of such rules takes at most (rlen, INT32_MAX: unbounded, 0:
 * not a chain), following the chain iteratively (x{0,10000} is 10000 rules deep); rq: the class's position. */
static void chain_lengths(const kiln_grammar *g, int32_t *rlen, int32_t *rq, int32_t *path) {
    for (int32_t r = 0; r < g->n_rule; r++) rlen[r] = -2; /* -2 not seen, -1 on the path being followed */
    for (int32_t r0 = 0; r0 < g->n_rule; r0++) {
        if (rlen[r0] != -2) continue;
        int32_t n = 0, r = r0, nlen;
        for (;;) {
            if (rlen[r] >= 0) {
                nlen = rlen[r];
                break;
            }
            if (rlen[r] == -1) { /* a cycle path[j..n), as x* makes: unbounded when all of it is one class */
                int32_t j = n - 1;
                while (path[j] != r) j--;
                bool same = true;
                for (int32_t i = j; i < n; i++) same = same && same_class(g, &g->el[rq[path[i]]], &g->el[rq[r]]);
                for (int32_t i = j; i < n; i++) rlen[path[i]] = same ? INT32_MAX : 0;
                n = j, nlen = rlen[r];
                break;
            }
            int32_t q, nx;
            if (!chain_shape(g, r, &q, &nx)) {
                rlen[r] = 0, nlen = 0;
                break;
            }
            rq[r] = q;
            if (nx < 0) {
                rlen[r] = 1, nlen = 1;
                break;
            }
            rlen[r] = -1, path[n++] = r, r = nx;
        }
        for (int32_t i = n - 1; i >= 0; i--) { /* path[i] is followed by r */
            const int32_t pr = path[i];
            const bool ok = nlen > 0 && same_class(g, &g->el[rq[pr]], &g->el[rq[r]]);
            rlen[pr] = !ok ? 0 : nlen == INT32_MAX ? INT32_MAX : nlen + 1;
            nlen = rlen[pr], r = pr;
        }
    }
}

/* chain_m and chain_cls: a character set e at p followed by a rule of a repetition of e takes e{1,m}. */
static kiln_status chain_setup(kiln_grammar_matcher *m) {
    const kiln_grammar *g = m->g;
    const size_t nr = (size_t)(g->n_rule ? g->n_rule : 1), ne = (size_t)(g->n_el ? g->n_el : 1);
    int32_t *rlen = malloc(nr * sizeof *rlen), *rq = malloc(nr * sizeof *rq), *path = malloc(nr * sizeof *path);
    m->chain_m = calloc(ne, sizeof *m->chain_m);
    m->chain_cls = calloc(ne, sizeof *m->chain_cls);
    m->el_rule = calloc(ne, sizeof *m->el_rule);
    kiln_status st = rlen && rq && path && m->chain_m && m->chain_cls && m->el_rule ? KILN_OK : kiln_fail(KILN_ERR_NOMEM, "grammar: out of memory");
    if (!st) chain_lengths(g, rlen, rq, path);
    for (int32_t r = 0; !st && r < g->n_rule; r++) /* a rule's elements are contiguous, in rule order */
        for (int32_t e = g->alt[g->rule_alt[r]], end = r + 1 < g->n_rule ? g->alt[g->rule_alt[r + 1]] : g->n_el; e < end; e++)
            m->el_rule[e] = r;
    for (int32_t p = 0; !st && p + 1 < g->n_el; p++) {
        if (g->el[p].type != GE_CHAR || g->el[p + 1].type != GE_RULE) continue;
        const int32_t R = g->el[p + 1].a;
        if (rlen[R] <= 0 || !same_class(g, &g->el[p], &g->el[rq[R]])) continue;
        m->chain_m[p] = rlen[R] == INT32_MAX ? INT32_MAX : rlen[R] + 1;
        int32_t c = 0;
        while (c < m->n_ct && !same_class(g, &g->el[m->ct[c].pos], &g->el[p])) c++;
        if (c == m->n_ct) {
            if (!grow((void **)&m->ct, &m->cap_ct, m->n_ct + 1, sizeof *m->ct)) {
                st = kiln_fail(KILN_ERR_NOMEM, "grammar: out of memory");
                break;
            }
            m->ct[m->n_ct++] = (ctable){.pos = p};
        }
        m->chain_cls[p] = c;
    }
    free(rlen), free(rq), free(path);
    return st;
}

kiln_status kiln_grammar_matcher_new_vocab(const kiln_grammar *g, const kiln_grammar_vocab *v, kiln_grammar_matcher **out) {
    *out = NULL;
    kiln_grammar_matcher *m = calloc(1, sizeof *m);
    if (!m) return kiln_fail(KILN_ERR_NOMEM, "grammar: out of memory");
    m->g = g, m->v = v;
    m->n_lvl = v->max_len + 2;
    m->W = (v->V + 63) / 64;
    const size_t wb = (size_t)(m->W ? m->W : 1) * sizeof *m->bits;
    const size_t n_sc = STACK_CACHE_BYTES / wb;
    m->n_sc = n_sc < 16 ? 16 : n_sc > 1024 ? 1024 : (int32_t)n_sc;
    m->lvl = calloc((size_t)m->n_lvl, sizeof *m->lvl);
    m->scratch = malloc((MAX_DEPTH + 2) * sizeof *m->scratch);
    m->stk = malloc((MAX_DEPTH + 2) * sizeof *m->stk);
    m->bits = calloc(1, wb);
    m->sc = calloc((size_t)m->n_sc, sizeof *m->sc);
    m->sc_hash = calloc((size_t)m->n_sc, sizeof *m->sc_hash);
    kiln_status st = m->lvl && m->scratch && m->stk && m->bits && m->sc && m->sc_hash ? KILN_OK : kiln_fail(KILN_ERR_NOMEM, "grammar: out of memory");
    if (!st) st = chain_setup(m);
    if (!st) st = kiln_grammar_matcher_reset(m);
    if (st) {
        kiln_grammar_matcher_free(m);
        return st;
    }
    *out = m;
    return KILN_OK;
}

kiln_status kiln_grammar_matcher_new(const kiln_grammar *g, const kiln_tokenizer *tok, kiln_grammar_matcher **out) {
    *out = NULL;
    kiln_grammar_vocab *v;
    TRY(kiln_grammar_vocab_new(tok, &v));
    kiln_status st = kiln_grammar_matcher_new_vocab(g, v, out);
    if (st) kiln_grammar_vocab_free(v);
    else (*out)->own = v;
    return st;
}

kiln_status kiln_grammar_matcher_reset(kiln_grammar_matcher *m) {
    kiln_grammar_gset_clear(&m->cur);
    memset(&m->u8, 0, sizeof m->u8);
    m->scratch[0] = -1;
    const kiln_grammar *g = m->g;
    for (int32_t a = g->rule_alt[g->root]; a < g->rule_alt[g->root + 1]; a++) {
        m->scratch[0] = g->alt[a];
        if (!kiln_grammar_expand(g, &m->cur, m->scratch, 1, 0)) return kiln_grammar_expand_failed();
    }
    return KILN_OK;
}

bool kiln_grammar_matcher_done(const kiln_grammar_matcher *m) { return m->cur.accept && m->u8.left == 0; }

static bool walk(kiln_grammar_matcher *m, int32_t v, const gset *s, u8state st, int32_t d);

/* The walk's step along the edge ed from a node at depth d with the state s and the code point st in progress. */
static bool walk_edge(kiln_grammar_matcher *m, tedge ed, const gset *s, u8state st, int32_t d) {
    const int r = u8_feed(&st, ed.byte);
    if (r < 0) return true;
    if (r == 0) return !kiln_grammar_partial_ok(m->g, s, &st) || walk(m, ed.child, s, st, d + 1);
    gset *nx = &m->lvl[d + 1];
    if (!kiln_grammar_advance(m->g, s, st.cp, nx, m->scratch)) return false;
    if (nx->n == 0 && !nx->accept) return true;
    if (m->fx && nx->accept && m->v->node[ed.child].n_edge) { /* a frame's end with bytes below */
        fcache *f = m->fx;
        if (!grow((void **)&f->exit, &f->cap_exit, 2 * f->n_exit + 2, sizeof *f->exit)) return false;
        f->exit[2 * f->n_exit] = ed.child, f->exit[2 * f->n_exit + 1] = d + 1, f->n_exit++;
    }
    return walk(m, ed.child, nx, st, d + 1);
}

/* The walk below node v with the state s (at depth d) and the code point st in progress: marks allowed tokens in
 * m->dst (or appends them to m->xl). */
static bool walk(kiln_grammar_matcher *m, int32_t v, const gset *s, u8state st, int32_t d) {
    /* the walk only reaches a node whose state is alive (or whose incomplete code point some stack can take):
     * every token ending here is allowed */
    const tnode *nd = &m->v->node[v];
    if (v != 0)
        for (int32_t k = 0; k < nd->n_tok; k++) {
            const int32_t t = m->v->toks[nd->first_tok + k];
            if (!m->xl) {
                m->dst[t >> 6] |= 1ull << (t & 63);
            } else {
                xcache *x = m->xl;
                if (!grow((void **)&x->d, &x->cap, x->n + 1, sizeof *x->d)) return false;
                x->d[x->n++] = (ltok){m->xl_L, t};
            }
        }
    for (int32_t e = 0; e < nd->n_edge; e++)
        if (!walk_edge(m, m->v->edge[nd->first_edge + e], s, st, d)) return false;
    return true;
}

static int popcount64(uint64_t x) { /* SWAR: the build targets plain x86-64, without POPCNT */
    x = x - (x >> 1 & 0x5555555555555555ull);
    x = (x & 0x3333333333333333ull) + (x >> 2 & 0x3333333333333333ull);
    x = (x + (x >> 4)) & 0x0F0F0F0F0F0F0F0Full;
    return (int)(x * 0x0101010101010101ull >> 56);
}

/* e's code points as sorted disjoint ranges (lo, hi) into iv (room for 257); returns how many. */
static int32_t class_ranges(const kiln_grammar *g, const gelem *e, uint32_t *iv) {
    uint32_t t[2 * 256];
    const int32_t n = e->n;
    if (n) memcpy(t, g->rng + 2 * (size_t)e->a, 2 * (size_t)n * sizeof *t);
    for (int32_t i = 1; i < n; i++) /* insertion sort by lo: classes have at most 256 ranges */
        for (int32_t j = i; j > 0 && t[2 * j] < t[2 * j - 2]; j--) {
            const uint32_t lo = t[2 * j], hi = t[2 * j + 1];
            t[2 * j] = t[2 * j - 2], t[2 * j + 1] = t[2 * j - 1], t[2 * j - 2] = lo, t[2 * j - 1] = hi;
        }
    int32_t k = 0;
    for (int32_t i = 0; i < n; i++) {
        if (k && t[2 * i] <= iv[2 * k - 1] + 1) {
            if (t[2 * i + 1] > iv[2 * k - 1]) iv[2 * k - 1] = t[2 * i + 1];
        } else iv[2 * k] = t[2 * i], iv[2 * k + 1] = t[2 * i + 1], k++;
    }
    if (!e->neg) return k;
    uint32_t c[2 * 257];
    int32_t kc = 0;
    uint32_t next = 0; /* the first code point not yet covered */
    for (int32_t i = 0; i < k; i++) {
        if (iv[2 * i] > next) c[2 * kc] = next, c[2 * kc + 1] = iv[2 * i] - 1, kc++;
        next = iv[2 * i + 1] + 1;
    }
    if (next <= 0x10FFFF) c[2 * kc] = next, c[2 * kc + 1] = 0x10FFFF, kc++;
    memcpy(iv, c, 2 * (size_t)kc * sizeof *c);
    return kc;
}

static bool classes_meet(const kiln_grammar *g, const gelem *a, const gelem *b) {
    uint32_t x[2 * 257], y[2 * 257];
    const int32_t nx = class_ranges(g, a, x), ny = class_ranges(g, b, y);
    for (int32_t i = 0, j = 0; i < nx && j < ny;) {
        if (x[2 * i + 1] < y[2 * j]) i++;
        else if (y[2 * j + 1] < x[2 * i]) j++;
        else return true;
    }
    return false;
}

static int cmp_ledge(const void *x, const void *y) {
    const ledge *a = x, *b = y;
    return a->L != b->L ? (a->L > b->L) - (a->L < b->L) : (a->edge > b->edge) - (a->edge < b->edge);
}

/* Building a class's table: the trie walked depth first, each node's bytes decoded once. */
typedef struct {
    kiln_grammar_matcher *m;
    ctable *c;
    const gelem *e;
    int32_t *ncp_in; /* (V) code points of a token all of whose code points are in e, else 0 */
    int32_t K;
    bool oom;
} cbuild;

/* Node v at depth d, reached by ncp complete code points all in e and the code point u in progress. Only runs of e
 * are followed: what leaves e is a leaving edge at the last code point boundary, walked later with a state. */
static void class_node(cbuild *b, int32_t v, u8state u, int32_t ncp, int32_t d) {
    const kiln_grammar_vocab *voc = b->m->v;
    const tnode *nd = &voc->node[v];
    uint32_t lo, hi;
    const bool part_in = u.left && partial_range(&u, &lo, &hi) && range_meets(b->m->g, b->e, lo, hi);
    if (u.left && !part_in) return;
    for (int32_t k = 0; v && k < nd->n_tok; k++) {
        const int32_t t = voc->toks[nd->first_tok + k], n = ncp + (u.left ? 1 : 0);
        b->ncp_in[t] = n;
        if (n > b->K) b->K = n;
    }
    for (int32_t e = 0; e < nd->n_edge && !b->oom; e++) {
        const tedge ed = voc->edge[nd->first_edge + e];
        u8state ns = u;
        const int r = u8_feed(&ns, ed.byte);
        if (r < 0) continue; /* invalid UTF-8: never allowed */
        bool leaves = false;
        if (r == 1) {
            if (char_in(b->m->g, b->e, ns.cp)) class_node(b, ed.child, ns, ncp + 1, d + 1);
            else leaves = u.left == 0; /* a code point begun earlier and ending outside e: its lead edge leaves */
        } else if (u.left == 0) { /* the lead byte of a longer code point: it leaves unless all it can become is in e */
            uint32_t plo, phi;
            bool all_in = false;
            if (partial_range(&ns, &plo, &phi)) {
                uint32_t iv[2 * 257];
                const int32_t n = class_ranges(b->m->g, b->e, iv);
                for (int32_t i = 0; i < n && !all_in; i++) all_in = iv[2 * i] <= plo && iv[2 * i + 1] >= phi;
            }
            leaves = !all_in;
            class_node(b, ed.child, ns, ncp, d + 1);
        } else {
            class_node(b, ed.child, ns, ncp, d + 1);
        }
        if (leaves && ncp >= 1) {
            ctable *c = b->c;
            if (!grow((void **)&c->le, &c->cap_le, c->n_le + 1, sizeof *c->le)) b->oom = true;
            else c->le[c->n_le++] = (ledge){ncp, d, nd->first_edge + e};
        }
    }
}

/* A class's table: the tokens all in e by their count of code points (cum), and the leaving edges. */
static kiln_status class_build(kiln_grammar_matcher *m, ctable *c) {
    const kiln_grammar_vocab *v = m->v;
    cbuild b = {m, c, &m->g->el[c->pos], calloc((size_t)(v->V ? v->V : 1), sizeof *b.ncp_in), 0, false};
    if (!b.ncp_in) return kiln_fail(KILN_ERR_NOMEM, "grammar: out of memory");
    c->n_le = 0;
    class_node(&b, 0, (u8state){0}, 0, 0);
    int32_t *ncp_in = b.ncp_in;
    const int32_t K = b.K;
    if (b.oom) {
        free(ncp_in);
        return kiln_fail(KILN_ERR_NOMEM, "grammar: out of memory");
    }
    const size_t wb = (size_t)m->W * sizeof *c->cum;
    if ((size_t)(K + 1) * wb > CLASS_TABLE_BYTES) {
        free(ncp_in);
        c->state = -1;
        return KILN_OK;
    }
    c->cum = calloc((size_t)(K + 1), wb);
    if (!c->cum) {
        free(ncp_in);
        return kiln_fail(KILN_ERR_NOMEM, "grammar: out of memory");
    }
    for (int32_t t = 0; t < v->V; t++)
        if (ncp_in[t]) c->cum[(size_t)ncp_in[t] * (size_t)m->W + (size_t)(t >> 6)] |= 1ull << (t & 63);
    for (int32_t k = 1; k <= K; k++)
        for (int32_t w = 0; w < m->W; w++) c->cum[(size_t)k * (size_t)m->W + (size_t)w] |= c->cum[(size_t)(k - 1) * (size_t)m->W + (size_t)w];
    if (c->n_le) qsort(c->le, (size_t)c->n_le, sizeof *c->le, cmp_ledge); /* none: le is NULL */
    free(ncp_in);
    c->K = K, c->state = 1;
    return KILN_OK;
}

/* The mask of the stack st[0..n) whose top p is a character set e followed by a repetition of it: the stack takes
 * e{1,m} and then its context, st[0..n-1) with p's continuation past the repetition (if any) on top. When no code
 * point the context can take first is in e, a token can leave the run only after its last code point in e, so the
 * allowed tokens are those all in e of at most m code points (a row of the class's table) and those leaving e after
 * L <= m code points whose rest the context takes (checked once per context and class, kept in xc). Returns 1 with
 * bits made, 0 when this does not apply (the caller walks the trie), -1 out of memory. */
static int chain_mask(kiln_grammar_matcher *m, const int32_t *st, int32_t n, uint64_t *bits) {
    const kiln_grammar *g = m->g;
    const int32_t p = st[n - 1], cm = m->chain_m[p];
    if (cm == 0 || n > MAX_DEPTH) return 0;
    ctable *c = &m->ct[m->chain_cls[p]];
    if (c->state == 0 && class_build(m, c)) return -1;
    if (c->state < 0) return 0;
    int32_t k = n - 1;
    memcpy(m->stk, st, (size_t)k * sizeof *st);
    if (g->el[p + 2].type != GE_END) m->stk[k++] = p + 2;
    const int32_t cls = m->chain_cls[p];
    const uint64_t h = stack_hash(m->stk, k) ^ (uint64_t)cls * 0x9E3779B97F4A7C15ull;
    xcache *x = NULL;
    for (int i = 0; i < XCACHE && !x; i++) {
        xcache *y = &m->xc[i];
        if (y->used && y->hash == h && y->n_key == k + 1 && y->key[k] == cls && memcmp(y->key, m->stk, (size_t)k * sizeof *y->key) == 0) x = y;
    }
    if (x && x->meets) return 0;
    if (!x) {
        x = &m->xc[m->next_xc];
        m->next_xc = (m->next_xc + 1) % XCACHE;
        x->used = false;
        if (!grow((void **)&x->key, &x->cap_key, k + 1, sizeof *x->key)) return -1;
        memcpy(x->key, m->stk, (size_t)k * sizeof *x->key);
        x->key[k] = cls, x->n_key = k + 1, x->hash = h, x->n = 0;
        kiln_grammar_gset_clear(&m->ctx);
        if (!kiln_grammar_expand(g, &m->ctx, m->stk, k, 0)) return -1;
        x->meets = false;
        for (int32_t i = 0; i < m->ctx.n && !x->meets; i++) x->meets = classes_meet(g, &g->el[m->ctx.pos[m->ctx.off[i + 1] - 1]], &g->el[p]);
        x->used = true;
        if (x->meets) return 0;
        x->used = false;
        m->xl = x;
        for (int32_t i = 0; i < c->n_le; i++) {
            const ledge le = c->le[i];
            m->xl_L = le.L;
            if (!walk_edge(m, m->v->edge[le.edge], &m->ctx, (u8state){0}, le.d)) {
                m->xl = NULL;
                return -1;
            }
        }
        m->xl = NULL;
        x->used = true;
    }
    const int32_t row = cm < c->K ? cm : c->K;
    memcpy(bits, c->cum + (size_t)row * (size_t)m->W, (size_t)m->W * sizeof *bits);
    for (int32_t i = 0; i < x->n && x->d[i].L <= cm; i++) bits[x->d[i].tok >> 6] |= 1ull << (x->d[i].tok & 63);
    return 1;
}

/* Where the stack st[0..n) splits into its context st[0..k) and its top frame st[k..n): the top, the entries of
 * generated rules (groups, repetitions) under it and the first entry of a rule written in the grammar, so that the
 * frame of a string's character is the rest of the string. 0 when the frame is the whole stack. */
static int32_t frame_split(const kiln_grammar_matcher *m, const int32_t *st, int32_t n) {
    int32_t k = n - 2;
    while (k >= 0 && m->g->generated[m->el_rule[st[k]]]) k--;
    return k < 0 ? 0 : k;
}

/* Sets s to the one stack st[0..n); false on out of memory. */
static bool set_one(gset *s, const int32_t *st, int32_t n) {
    kiln_grammar_gset_clear(s);
    if (!grow((void **)&s->pos, &s->cap_pos, n, sizeof *s->pos) || !grow((void **)&s->off, &s->cap_off, 2, sizeof *s->off)) return false;
    memcpy(s->pos, st, (size_t)n * sizeof *st);
    s->off[0] = 0, s->off[1] = n, s->n = 1, s->n_pos = n, s->accept = false;
    return true;
}

/* The class table of the character set at p, made on first use; NULL on out of memory. */
static ctable *class_of(kiln_grammar_matcher *m, int32_t p) {
    int32_t c = 0;
    while (c < m->n_ct && !same_class(m->g, &m->g->el[m->ct[c].pos], &m->g->el[p])) c++;
    if (c == m->n_ct) {
        if (!grow((void **)&m->ct, &m->cap_ct, m->n_ct + 1, sizeof *m->ct)) return NULL;
        m->ct[m->n_ct++] = (ctable){.pos = p};
    }
    if (m->ct[c].state == 0 && class_build(m, &m->ct[c])) return NULL;
    return &m->ct[c];
}

/* Run L's set (L >= 1) of frame_fixed, grown on demand; NULL on out of memory. */
static gset *run_set(kiln_grammar_matcher *m, int32_t L) {
    if (L > m->n_runs) {
        if (!grow((void **)&m->runs, &m->cap_runs, L, sizeof *m->runs)) return NULL;
        memset(m->runs + m->n_runs, 0, (size_t)(L - m->n_runs) * sizeof *m->runs);
        m->n_runs = L;
    }
    return &m->runs[L - 1];
}

/* A frame st[0..n) topped by a class e whose runs of e stay on one stack: after each code point of e its state holds
 * at most one stack that can take e again (the run's next, topped by e itself) and other stacks that take no code
 * point of e. So jchar* in a string (the next is the frame again: runs are unbounded) and jchar{0,n} (the next
 * counts down; the longest run is n). Then a token all in e with at most that many code points stays in the frame,
 * and one leaving e after L code points is in run L's other stacks there: the frame's tokens are a row of e's table
 * and e's leaving edges walked with those stacks, with no walk of the whole trie. Returns 1 with f made, 0 when the
 * frame is not of this kind, -1 out of memory. */
static int frame_fixed(kiln_grammar_matcher *m, const int32_t *st, int32_t n, fcache *f) {
    const kiln_grammar *g = m->g;
    const gelem *e = &g->el[st[n - 1]];
    uint32_t iv[2 * 257];
    if (class_ranges(g, e, iv) == 0) return 0;
    gset *cur = &m->one, *nxt = &m->s1; /* the run's stack so far, as a set of one */
    if (!set_one(cur, st, n)) return -1;
    int32_t run = 0, fixed = 0; /* the longest run; the run from which on the sets repeat (0: none) */
    for (int32_t L = 1; L <= m->v->max_len && !run; L++) {
        gset *s = run_set(m, L);
        if (!s || !kiln_grammar_advance(g, cur, iv[0], s, m->scratch)) return -1; /* a stack's next state is one for every cp it takes */
        if (s->accept) return 0;
        int32_t self = -1;
        for (int32_t i = 0; i < s->n; i++)
            if (classes_meet(g, &g->el[s->pos[s->off[i + 1] - 1]], e)) {
                if (self >= 0 || !same_class(g, &g->el[s->pos[s->off[i + 1] - 1]], e)) return 0;
                self = i;
            }
        if (self < 0) {
            /* not a run (a plain walk is as cheap), or a run of L dead where one of L - 1 with a partial code point
             * is not: no row of the table */
            if (L == 1 || s->n == 0) return 0;
            run = L;
            break;
        }
        const int32_t o = s->off[self], k = s->off[self + 1] - o;
        const bool same = k == cur->n_pos && memcmp(s->pos + o, cur->pos, (size_t)k * sizeof *s->pos) == 0;
        if (!set_one(nxt, s->pos + o, k)) return -1;
        memmove(s->pos + o, s->pos + o + k, (size_t)(s->n_pos - o - k) * sizeof *s->pos); /* s less the run's stack */
        for (int32_t i = self + 1; i < s->n; i++) s->off[i] = s->off[i + 1] - k;
        s->n--, s->n_pos -= k;
        gset *t = cur;
        cur = nxt, nxt = t;
        if (same) run = fixed = L;
    }
    if (!run) run = fixed = m->v->max_len; /* no token has a longer run */
    const ctable *c = class_of(m, st[n - 1]);
    if (!c) return -1;
    if (c->state < 0) return 0;
    const int32_t row = fixed || run > c->K ? c->K : run;
    memcpy(f->bits, c->cum + (size_t)row * (size_t)m->W, (size_t)m->W * sizeof *f->bits);
    f->n_exit = 0;
    m->dst = f->bits, m->fx = f;
    for (int32_t i = 0; i < c->n_le; i++) {
        const ledge le = c->le[i];
        if (!fixed && le.L > run) break; /* by L ascending */
        const gset *s = &m->runs[(fixed && le.L > fixed ? fixed : le.L) - 1];
        if (s->n && !walk_edge(m, m->v->edge[le.edge], s, (u8state){0}, le.d)) {
            m->fx = NULL;
            return -1;
        }
    }
    m->fx = NULL;
    return 1;
}

/* The frame st[0..n) walked alone (an empty stack meaning the frame ended), remembered by its positions. */
static const fcache *frame_get(kiln_grammar_matcher *m, const int32_t *st, int32_t n) {
    const uint64_t h = stack_hash(st, n);
    for (int i = 0; i < FCACHE; i++) {
        const fcache *f = &m->fc[i];
        if (f->hash == h && f->used && f->n_key == n && memcmp(f->key, st, (size_t)n * sizeof *st) == 0) return f;
    }
    fcache *f = &m->fc[m->next_fc];
    m->next_fc = (m->next_fc + 1) % FCACHE;
    f->used = false, f->n_exit = 0;
    if (!f->bits && !(f->bits = malloc((size_t)m->W * sizeof *f->bits))) return NULL;
    if (!grow((void **)&f->key, &f->cap_key, n, sizeof *f->key)) return NULL;
    const int r = frame_fixed(m, st, n, f);
    if (r < 0) return NULL;
    if (r == 0) {
        if (!set_one(&m->one, st, n)) return NULL;
        memset(f->bits, 0, (size_t)m->W * sizeof *f->bits);
        f->n_exit = 0;
        m->dst = f->bits, m->fx = f;
        const bool ok = walk(m, 0, &m->one, (u8state){0}, 0);
        m->fx = NULL;
        if (!ok) return NULL;
    }
    memcpy(f->key, st, (size_t)n * sizeof *st);
    f->n_key = n, f->hash = h, f->used = true;
    return f;
}

/* A stack's mask from its top frame's: the frame's tokens, and below each trie node where the frame can end, the
 * walk with the context st[0..k) (expanded). false on out of memory. */
static bool frame_mask(kiln_grammar_matcher *m, const int32_t *st, int32_t n, int32_t k, uint64_t *bits) {
    const fcache *f = frame_get(m, st + k, n - k);
    if (!f) return false;
    memcpy(bits, f->bits, (size_t)m->W * sizeof *bits);
    if (!f->n_exit) return true;
    memcpy(m->stk, st, (size_t)k * sizeof *st);
    kiln_grammar_gset_clear(&m->ctx);
    if (!kiln_grammar_expand(m->g, &m->ctx, m->stk, k, 0)) return false;
    if (m->ctx.n == 0) return true; /* the grammar's end: nothing more */
    m->dst = bits;
    for (int32_t i = 0; i < f->n_exit; i++)
        if (!walk(m, f->exit[2 * i], &m->ctx, (u8state){0}, f->exit[2 * i + 1])) return false;
    return true;
}

/* The allowed tokens of one stack (its top a character set), remembered by its positions; NULL on out of memory. */
static const uint64_t *stack_mask(kiln_grammar_matcher *m, const int32_t *st, int32_t n) {
    const uint64_t h = stack_hash(st, n);
    for (int32_t i = 0; i < m->n_sc; i++) {
        if (m->sc_hash[i] != h) continue;
        const scache *c = &m->sc[i];
        if (c->n_key == n && memcmp(c->key, st, (size_t)n * sizeof *st) == 0) {
            m->hits++;
            return c->bits;
        }
    }
    m->misses++;
    const int32_t slot = m->next_sc;
    scache *c = &m->sc[slot];
    m->next_sc = (m->next_sc + 1) % m->n_sc;
    m->sc_hash[slot] = 0;
    if (!c->bits && !(c->bits = malloc((size_t)m->W * sizeof *c->bits))) return NULL;
    if (!grow((void **)&c->key, &c->cap_key, n, sizeof *c->key)) return NULL;
    const int r = chain_mask(m, st, n, c->bits);
    if (r < 0) return NULL;
    if (r == 0 && !frame_mask(m, st, n, frame_split(m, st, n), c->bits)) return NULL;
    memcpy(c->key, st, (size_t)n * sizeof *st);
    c->n_key = n, m->sc_hash[slot] = h;
    return c->bits;
}

/* The allowed tokens of the current state into m->bits: the union of its stacks' masks, or, while a code point is
 * half done (rare), the trie walked with the whole state. */
static kiln_status allowed_now(kiln_grammar_matcher *m) {
    const int32_t W = m->W;
    memset(m->bits, 0, (size_t)W * sizeof *m->bits);
    if (m->u8.left) {
        m->misses++;
        m->dst = m->bits;
        if (!walk(m, 0, &m->cur, m->u8, 0)) return kiln_grammar_expand_failed();
        return KILN_OK;
    }
    for (int32_t i = 0; i < m->cur.n; i++) {
        const uint64_t *b = stack_mask(m, m->cur.pos + m->cur.off[i], m->cur.off[i + 1] - m->cur.off[i]);
        if (!b) return kiln_grammar_expand_failed();
        for (int32_t w = 0; w < W; w++) m->bits[w] |= b[w];
    }
    return KILN_OK;
}

/* -INFINITY into l[0..n), n <= 64; a whole word is a loop of known length, which the compiler vectorizes */
static void fill_refused(float *l, int32_t n) {
    if (n == 64)
        for (int32_t j = 0; j < 64; j++) l[j] = -INFINITY;
    else
        for (int32_t j = 0; j < n; j++) l[j] = -INFINITY;
}

kiln_status kiln_grammar_matcher_mask(kiln_grammar_matcher *m, float *logits) {
    TRY(allowed_now(m));
    const int32_t V = m->v->V, eos = m->v->eos;
    if (eos >= 0 && eos < V) {
        if (kiln_grammar_matcher_done(m)) m->bits[eos >> 6] |= 1ull << (eos & 63);
        else m->bits[eos >> 6] &= ~(1ull << (eos & 63));
    }
    uint64_t any = 0;
    for (int32_t w = 0; w < m->W; w++) {
        const int32_t base = w * 64, lim = V - base < 64 ? V - base : 64;
        const uint64_t full = lim == 64 ? ~0ull : (1ull << lim) - 1, b = m->bits[w] & full;
        any |= b;
        if (b == full) continue;
        float *l = logits + base;
        if (b == 0) {
            fill_refused(l, lim);
            continue;
        }
        /* a mixed word: the refused ones one by one, or when fewer are allowed, all refused and the allowed put back */
        uint64_t z = ~b & full, t = b;
        if (popcount64(b) * 2 >= lim) {
            for (; z; z &= z - 1) l[__builtin_ctzll(z)] = -INFINITY;
            continue;
        }
        float keep[64];
        int k = 0;
        for (; t; t &= t - 1) keep[k++] = l[__builtin_ctzll(t)];
        fill_refused(l, lim);
        for (t = b, k = 0; t; t &= t - 1) l[__builtin_ctzll(t)] = keep[k++];
    }
    if (!any) return kiln_fail(KILN_ERR_INVALID, "grammar: no token of the vocab can continue the text here");
    return KILN_OK;
}

void kiln_grammar_matcher_cache_stats(const kiln_grammar_matcher *m, int64_t *hits, int64_t *misses) {
    *hits = m->hits, *misses = m->misses;
}

kiln_status kiln_grammar_matcher_accept(kiln_grammar_matcher *m, int32_t token) {
    if (token < 0 || token >= m->v->V) return kiln_fail(KILN_ERR_RANGE, "grammar: token %d is outside the vocab of %d", (int)token, (int)m->v->V);
    if (token == m->v->eos) {
        if (!kiln_grammar_matcher_done(m)) return kiln_fail(KILN_ERR_INVALID, "grammar: the end of the text (EOS) where the grammar cannot end");
        return KILN_OK;
    }
    if (!m->v->bytes[token]) return kiln_fail(KILN_ERR_INVALID, "grammar: token %d has no text the grammar can match", (int)token);
    gset *a = &m->lvl[0], *b = &m->lvl[1];
    /* a copy of the current state into a (its stacks are expanded already), then byte by byte */
    kiln_grammar_gset_clear(a);
    if (!grow((void **)&a->pos, &a->cap_pos, m->cur.n_pos + 1, sizeof *a->pos) ||
        !grow((void **)&a->off, &a->cap_off, m->cur.n + 2, sizeof *a->off))
        return kiln_fail(KILN_ERR_NOMEM, "grammar: out of memory");
    if (m->cur.n) {
        memcpy(a->pos, m->cur.pos, (size_t)m->cur.n_pos * sizeof *a->pos);
        memcpy(a->off, m->cur.off, (size_t)(m->cur.n + 1) * sizeof *a->off);
    }
    a->n = m->cur.n, a->n_pos = m->cur.n_pos, a->accept = m->cur.accept;
    if (a->n == 0) a->off[0] = 0;
    u8state st = m->u8;
    for (int32_t k = 0; k < m->v->len[token]; k++) {
        const int r = u8_feed(&st, m->v->bytes[token][k]);
        if (r < 0) return kiln_fail(KILN_ERR_INVALID, "grammar: token %d is not valid UTF-8 here", (int)token);
        if (r == 0) continue;
        if (!kiln_grammar_advance(m->g, a, st.cp, b, m->scratch)) return kiln_grammar_expand_failed();
        if (b->n == 0 && !b->accept)
            return kiln_fail(KILN_ERR_INVALID, "grammar: token %d does not continue the text the grammar allows", (int)token);
        gset t = *a;
        *a = *b, *b = t;
    }
    if (st.left && !kiln_grammar_partial_ok(m->g, a, &st))
        return kiln_fail(KILN_ERR_INVALID, "grammar: token %d does not continue the text the grammar allows", (int)token);
    gset t = m->cur;
    m->cur = *a, *a = t;
    m->u8 = st;
    return KILN_OK;
}

