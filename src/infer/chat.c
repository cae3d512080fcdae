/* chat.c: chat templates without a Jinja engine. A GGUF's tokenizer.chat_template is Jinja source; the four
 * families kiln supports (llama2, llama3, chatml, gemma) are told apart by substrings only their templates
 * contain, and each is written out here by hand, following its reference template to the byte: where it trims
 * (Python's str.strip / Jinja's trim), where it puts bos_token, how it places the system message. chatml
 * templates that add a system turn when there is none (SmolLM2, Qwen2) carry that text as a string literal,
 * which is read out of the template. tests/test_chat.c compares every family with tests/ref/chat_*.txt, the
 * output of the real templates rendered by jinja2 as transformers' apply_chat_template does.
 *
 * kiln_chat_tokenize tokenizes that text with special tokens cut only where the template wrote its markers, never in a
 * message's content; kiln_chat_eval runs a conversation in a session, keeping the KV cache up to the first token that
 * changed and dropping the oldest turns when the context is full. tests/test_chat.c checks both, and `kiln chat`
 * (tools/cmd_chat.c) over 200 piped turns. */
#include "model/model.h"
#include "status.h"
#include "tok/tok.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *const family_names[] = {
    [KILN_CHAT_LLAMA2] = "llama2",
    [KILN_CHAT_LLAMA3] = "llama3",
    [KILN_CHAT_CHATML] = "chatml",
    [KILN_CHAT_GEMMA] = "gemma",
};
#define N_FAMILIES (sizeof family_names / sizeof family_names[0])
#define NAMES_LIST "llama2, llama3, chatml, gemma"

/* Per family: the usual bos/eos texts (used when no vocab is at hand) and the text of the end-of-turn token
 * (NULL: EOS ends the turn). */
static const struct {
    const char *bos, *eos, *end_of_turn;
} family_tokens[] = {
    [KILN_CHAT_LLAMA2] = {"<s>", "</s>", NULL},
    [KILN_CHAT_LLAMA3] = {"<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"},
    [KILN_CHAT_CHATML] = {"", "", "<|im_end|>"},
    [KILN_CHAT_GEMMA] = {"<bos>", "<eos>", "<end_of_turn>"},
};

const char *kiln_chat_family_name(kiln_chat_family f) {
    return (unsigned)f < N_FAMILIES ? family_names[f] : "unknown";
}

static bool contains(const char *s, size_t n, const char *needle) {
    size_t k = strlen(needle);
    if (k > n) return false;
    for (size_t i = 0; i + k <= n; i++)
        if (s[i] == needle[0] && memcmp(s + i, needle, k) == 0) return true;
    return false;
}

static kiln_str cstr(const char *s) { return (kiln_str){s, strlen(s)}; }

/* chatml's default system turn: a string literal holding "<|im_start|>system\n" + TEXT + "<|im_end|>". The
 * literal may write the newline raw or as \n. Occurrences where the literal closes right after "system\n"
 * (Qwen2.5's tools branch, which appends the system text separately) are skipped. */
static kiln_status chatml_default_system(const char *where, const char *s, size_t n, kiln_chat_template *out) {
    static const char open[] = "<|im_start|>system", close[] = "<|im_end|>";
    const size_t open_len = sizeof open - 1, close_len = sizeof close - 1;
    out->default_system[0] = 0;
    for (size_t i = 0; i + open_len <= n; i++) {
        if (memcmp(s + i, open, open_len) != 0) continue;
        size_t j = i + open_len;
        if (j < n && s[j] == '\n') j++;
        else if (j + 1 < n && s[j] == '\\' && s[j + 1] == 'n') j += 2;
        else continue;
        /* copy literal characters up to "<|im_end|>"; a quote that is not escaped ends the literal: not a default */
        size_t w = 0;
        bool found = false;
        while (j < n) {
            if (j + close_len <= n && memcmp(s + j, close, close_len) == 0) {
                found = true;
                break;
            }
            char c = s[j++];
            if (c == '\'' || c == '"') break;
            if (c == '\\' && j < n) {
                char e = s[j++];
                c = e == 'n' ? '\n' : e == 't' ? '\t' : e;
            }
            if (w + 1 >= sizeof out->default_system)
                return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: the default system message at byte %zu is longer than %zu bytes",
                                 where, i, sizeof out->default_system - 1);
            out->default_system[w++] = c;
        }
        if (found && w > 0) {
            out->default_system[w] = 0;
            return KILN_OK;
        }
        out->default_system[0] = 0;
    }
    return KILN_OK;
}

/* Llama 3.1+'s date: `set date_string = "26 Jul 2024"` in the template, or today when it calls strftime_now("%d %b %Y")
 * (Llama 3.2), whose result transformers fills in from the local clock. */
#define LLAMA31_HEADER "Cutting Knowledge Date: December 2023"
static kiln_status llama3_date(const char *where, const char *s, size_t n, kiln_chat_template *out) {
    out->date[0] = 0;
    if (!contains(s, n, LLAMA31_HEADER)) return KILN_OK; /* Llama 3.0 */
    if (contains(s, n, "strftime_now(\"%d %b %Y\")")) {
        time_t now = time(NULL);
        struct tm tm;
        if (localtime_r(&now, &tm) && strftime(out->date, sizeof out->date, "%d %b %Y", &tm) > 0) return KILN_OK;
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s (llama3): cannot format today's date for its strftime_now", where);
    }
    static const char key[] = "set date_string = \"";
    for (size_t i = 0; i + sizeof key - 1 <= n; i++) {
        if (memcmp(s + i, key, sizeof key - 1) != 0) continue;
        size_t j = i + sizeof key - 1, w = 0;
        while (j < n && s[j] != '"' && w + 1 < sizeof out->date) out->date[w++] = s[j++];
        if (j < n && s[j] == '"' && w > 0) {
            out->date[w] = 0;
            return KILN_OK;
        }
        break;
    }
    return kiln_fail(KILN_ERR_UNSUPPORTED, "%s (llama3): it writes '" LLAMA31_HEADER "' but sets no date_string kiln can read; "
                     "pass --chat-template llama3 for the Llama 3.0 format", where);
}

static void set_family(kiln_chat_template *out, kiln_chat_family f) {
    memset(out, 0, sizeof *out);
    out->family = f;
    out->bos = cstr(family_tokens[f].bos);
    out->eos = cstr(family_tokens[f].eos);
}

/* where names the template's origin in messages ("FILE: tokenizer.chat_template" or "chat template") */
static kiln_status from_text(const char *where, const char *s, size_t n, kiln_chat_template *out) {
    /* the llama3 and chatml markers are single special tokens that never occur in the other families' templates;
     * gemma's turn markers likewise; llama2 is the last resort, and needs <<SYS>> as well as [INST], since
     * Mistral's [INST] templates format differently (no space before the answer, no system block) */
    if (contains(s, n, "<|start_header_id|>") && contains(s, n, "<|eot_id|>")) set_family(out, KILN_CHAT_LLAMA3);
    else if (contains(s, n, "<|im_start|>") && contains(s, n, "<|im_end|>")) set_family(out, KILN_CHAT_CHATML);
    else if (contains(s, n, "<start_of_turn>") && contains(s, n, "<end_of_turn>")) set_family(out, KILN_CHAT_GEMMA);
    else if (contains(s, n, "[INST]") && contains(s, n, "<<SYS>>")) set_family(out, KILN_CHAT_LLAMA2);
    else
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s (%zu bytes) is of no family kiln knows; pass --chat-template NAME "
                         "(" NAMES_LIST ") to pick one", where, n);
    if (out->family == KILN_CHAT_CHATML) return chatml_default_system(where, s, n, out);
    if (out->family == KILN_CHAT_LLAMA3) return llama3_date(where, s, n, out);
    return KILN_OK;
}

kiln_status kiln_chat_template_from_text(const char *s, size_t n, kiln_chat_template *out) {
    return from_text("chat template", s, n, out);
}

/* bos/eos as the model's vocab writes them, when it has them */
static void take_vocab_specials(const kiln_model *m, kiln_chat_template *out) {
    const kiln_tokenizer *tok = m ? kiln_model_tokenizer(m) : NULL;
    if (!tok) return;
    int32_t bos = kiln_tokenizer_bos(tok), eos = kiln_tokenizer_eos(tok);
    if (bos >= 0 && out->family != KILN_CHAT_CHATML) out->bos = kiln_tokenizer_token_text(tok, bos);
    if (eos >= 0) out->eos = kiln_tokenizer_token_text(tok, eos);
}

kiln_status kiln_chat_template_detect(const kiln_model *m, kiln_chat_template *out) {
    const char *path = kiln_gguf_path(m->gguf);
    const kiln_gguf_value *v = kiln_gguf_find(m->gguf, "tokenizer.chat_template");
    if (!v)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: the model has no tokenizer.chat_template; pass --chat-template NAME (" NAMES_LIST ")",
                         path);
    if (v->type != KILN_GGUF_STRING)
        return kiln_fail(KILN_ERR_FORMAT, "%s: tokenizer.chat_template is a %s, not a string", path, kiln_gguf_vtype_name(v->type));
    char where[600];
    snprintf(where, sizeof where, "%s: tokenizer.chat_template", path);
    kiln_status s = from_text(where, v->str.ptr, (size_t)v->str.len, out);
    if (s) return s;
    take_vocab_specials(m, out);
    return KILN_OK;
}

kiln_status kiln_chat_template_from_name(const char *name, const kiln_model *m, kiln_chat_template *out) {
    for (size_t f = 0; f < N_FAMILIES; f++) {
        if (strcmp(name, family_names[f]) != 0) continue;
        set_family(out, (kiln_chat_family)f);
        take_vocab_specials(m, out);
        return KILN_OK;
    }
    return kiln_fail(KILN_ERR_NOT_FOUND, "chat template '%s' is unknown (known: " NAMES_LIST ")", name);
}

/* ---------------------------------------------------------------- formatting */

/* The text being written and, when spans is set, where its content lies: the messages' roles and contents, the
 * date and the default system text, which kiln_chat_tokenize never searches for special tokens. */
typedef struct {
    char *buf;
    size_t n, cap;
    bool failed;
    bool spans;      /* record the content spans */
    size_t *span;    /* (n_span, 2) [start, end) of each content span, in order */
    size_t n_span, cap_span;
} sbuf;

static void put(sbuf *b, const char *s, size_t n) {
    if (b->failed) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) {
            if (cap > SIZE_MAX / 2) {
                b->failed = true;
                return;
            }
            cap *= 2;
        }
        char *p = realloc(b->buf, cap);
        if (!p) {
            b->failed = true;
            return;
        }
        b->buf = p, b->cap = cap;
    }
    memcpy(b->buf + b->n, s, n);
    b->n += n;
    b->buf[b->n] = 0;
}
static void puts_(sbuf *b, const char *s) { put(b, s, strlen(s)); }
static void put_str(sbuf *b, kiln_str s) { put(b, s.ptr, (size_t)s.len); }

/* Content: text the template did not write, put as plain text (a span continues one that ends where it starts). */
static void put_content(sbuf *b, const char *s, size_t n) {
    const size_t start = b->n;
    put(b, s, n);
    if (!b->spans || b->failed || n == 0) return;
    if (b->n_span && b->span[2 * b->n_span - 1] == start) {
        b->span[2 * b->n_span - 1] = b->n;
        return;
    }
    if (b->n_span == b->cap_span) {
        size_t cap = b->cap_span ? 2 * b->cap_span : 16;
        size_t *p = realloc(b->span, 2 * cap * sizeof *p);
        if (!p) {
            b->failed = true;
            return;
        }
        b->span = p, b->cap_span = cap;
    }
    b->span[2 * b->n_span] = start, b->span[2 * b->n_span + 1] = b->n;
    b->n_span++;
}
static void puts_content(sbuf *b, const char *s) { put_content(b, s, strlen(s)); }

/* Python's str.strip() and Jinja's trim filter, on ASCII whitespace */
static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
static void put_trimmed(sbuf *b, const char *s) { /* always content */
    size_t n = strlen(s);
    while (n && is_ws(*s)) s++, n--;
    while (n && is_ws(s[n - 1])) n--;
    put_content(b, s, n);
}

/* llama2 and gemma: after the optional system message, user and assistant alternate from a user turn */
static kiln_status check_alternating(const kiln_chat_template *t, const kiln_chat_msg *msgs, size_t n, size_t first) {
    for (size_t i = first; i < n; i++) {
        const char *want = (i - first) % 2 == 0 ? "user" : "assistant";
        if (strcmp(msgs[i].role, want) != 0)
            return kiln_fail(KILN_ERR_INVALID, "chat %s: message %zu has role '%s' where the template needs '%s' (user and assistant "
                             "turns must alternate, after an optional first system message)", kiln_chat_family_name(t->family), i,
                             msgs[i].role, want);
    }
    return KILN_OK;
}

static kiln_status format_llama2(const kiln_chat_template *t, const kiln_chat_msg *msgs, size_t n, sbuf *b) {
    size_t first = n > 0 && strcmp(msgs[0].role, "system") == 0;
    kiln_status s = check_alternating(t, msgs, n, first);
    if (s) return s;
    for (size_t i = first; i < n; i++) {
        if (strcmp(msgs[i].role, "user") == 0) {
            /* bos + "[INST] " + strip(content) + " [/INST]", where the first turn's content is prefixed by the system
             * block; strip() applies to the whole, so the system text loses its leading whitespace only */
            put_str(b, t->bos);
            puts_(b, "[INST] ");
            if (i == first && first) {
                sbuf c = {0};
                puts_(&c, "<<SYS>>\n");
                puts_(&c, msgs[0].content);
                puts_(&c, "\n<</SYS>>\n\n");
                puts_(&c, msgs[i].content);
                if (c.failed) b->failed = true;
                else put_trimmed(b, c.buf);
                free(c.buf);
            } else
                put_trimmed(b, msgs[i].content);
            puts_(b, " [/INST]");
        } else {
            puts_(b, " ");
            put_trimmed(b, msgs[i].content);
            puts_(b, " ");
            put_str(b, t->eos);
        }
    }
    return KILN_OK;
}

static kiln_status format_llama3(const kiln_chat_template *t, const kiln_chat_msg *msgs, size_t n, bool gen, sbuf *b) {
    size_t first = 0;
    if (t->date[0]) { /* 3.1+: bos and the system header come first whatever the conversation; the system text is trimmed */
        put_str(b, t->bos);
        puts_(b, "<|start_header_id|>system<|end_header_id|>\n\n" LLAMA31_HEADER "\nToday Date: ");
        puts_content(b, t->date);
        puts_(b, "\n\n");
        if ((first = n > 0 && strcmp(msgs[0].role, "system") == 0)) put_trimmed(b, msgs[0].content);
        puts_(b, "<|eot_id|>");
    }
    for (size_t i = first; i < n; i++) {
        if (i == 0 && !t->date[0]) put_str(b, t->bos); /* 3.0: bos opens the first message */
        puts_(b, "<|start_header_id|>");
        puts_content(b, msgs[i].role);
        puts_(b, "<|end_header_id|>\n\n");
        put_trimmed(b, msgs[i].content);
        puts_(b, "<|eot_id|>");
    }
    if (gen) puts_(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
    return KILN_OK;
}

static kiln_status format_chatml(const kiln_chat_template *t, const kiln_chat_msg *msgs, size_t n, bool gen, sbuf *b) {
    if (n > 0 && t->default_system[0] && strcmp(msgs[0].role, "system") != 0) {
        puts_(b, "<|im_start|>system\n");
        puts_content(b, t->default_system);
        puts_(b, "<|im_end|>\n");
    }
    for (size_t i = 0; i < n; i++) {
        puts_(b, "<|im_start|>");
        puts_content(b, msgs[i].role);
        puts_(b, "\n");
        puts_content(b, msgs[i].content);
        puts_(b, "<|im_end|>\n");
    }
    if (gen) puts_(b, "<|im_start|>assistant\n");
    return KILN_OK;
}

static kiln_status format_gemma(const kiln_chat_template *t, const kiln_chat_msg *msgs, size_t n, bool gen, sbuf *b) {
    size_t first = n > 0 && strcmp(msgs[0].role, "system") == 0;
    kiln_status s = check_alternating(t, msgs, n, first);
    if (s) return s;
    put_str(b, t->bos);
    for (size_t i = first; i < n; i++) {
        bool user = strcmp(msgs[i].role, "user") == 0;
        puts_(b, user ? "<start_of_turn>user\n" : "<start_of_turn>model\n");
        if (i == first && first) { /* the system text, untrimmed, then a blank line, opens the first turn */
            puts_content(b, msgs[0].content);
            puts_(b, "\n\n");
        }
        put_trimmed(b, msgs[i].content);
        puts_(b, "<end_of_turn>\n");
    }
    if (gen) puts_(b, "<start_of_turn>model\n");
    return KILN_OK;
}

/* The conversation into b (with b->spans: and where its content lies); on an error b is freed. */
static kiln_status format_into(const kiln_chat_template *t, const kiln_chat_msg *msgs, size_t n, bool gen, sbuf *b) {
    if ((unsigned)t->family >= N_FAMILIES) return kiln_fail(KILN_ERR_INVALID, "chat: template family %d is unknown", (int)t->family);
    for (size_t i = 0; i < n; i++)
        if (!msgs[i].role || !msgs[i].content) return kiln_fail(KILN_ERR_INVALID, "chat: message %zu has no role or no content", i);
    put(b, "", 0); /* an empty conversation is "" (or just bos), never NULL */
    kiln_status s;
    switch (t->family) {
    case KILN_CHAT_LLAMA2: s = format_llama2(t, msgs, n, b); break;
    case KILN_CHAT_LLAMA3: s = format_llama3(t, msgs, n, gen, b); break;
    case KILN_CHAT_CHATML: s = format_chatml(t, msgs, n, gen, b); break;
    default: s = format_gemma(t, msgs, n, gen, b); break;
    }
    if (!s && b->failed) s = kiln_fail(KILN_ERR_NOMEM, "chat: out of memory formatting %zu messages", n);
    if (s) {
        free(b->buf);
        free(b->span);
        *b = (sbuf){0};
    }
    return s;
}

kiln_status kiln_chat_format(const kiln_chat_template *t, const kiln_chat_msg *msgs, size_t n, bool add_generation_prompt,
                             char **out, size_t *len) {
    *out = NULL;
    if (len) *len = 0;
    sbuf b = {0};
    kiln_status s = format_into(t, msgs, n, add_generation_prompt, &b);
    if (s) return s;
    *out = b.buf;
    if (len) *len = b.n;
    return KILN_OK;
}

kiln_status kiln_chat_end_of_turn(const kiln_chat_template *t, const kiln_tokenizer *tok, int32_t *id) {
    *id = -1;
    if ((unsigned)t->family >= N_FAMILIES) return kiln_fail(KILN_ERR_INVALID, "chat: template family %d is unknown", (int)t->family);
    const char *text = family_tokens[t->family].end_of_turn;
    if (!text) {
        *id = kiln_tokenizer_eos(tok);
        if (*id < 0) return kiln_fail(KILN_ERR_NOT_FOUND, "chat %s: the vocab has no EOS token to end a turn", family_names[t->family]);
        return KILN_OK;
    }
    *id = kiln_tok_find(tok, text, strlen(text));
    if (*id < 0)
        return kiln_fail(KILN_ERR_NOT_FOUND, "chat %s: the vocab has no '%s' token to end a turn (wrong --chat-template?)",
                         family_names[t->family], text);
    return KILN_OK;
}

/* ---------------------------------------------------------------- tokens */

/* One stretch of plain text: the family's encoder alone, so no special token, control or user-defined, is cut out of
 * it. first: it starts the conversation or follows a special token (SPM's dummy prefix, as llama.cpp). */
static kiln_status encode_plain(const kiln_tokenizer *tok, const char *text, size_t len, bool first, kiln_tokens *out) {
    if (len == 0) return KILN_OK;
    switch (tok->kind) {
    case TOK_SPM: return kiln_spm_encode(tok, text, len, first, out);
    case TOK_BPE: return kiln_bpe_encode(tok, text, len, out);
    case TOK_WPM: return kiln_wpm_encode(tok, text, len, out);
    }
    return kiln_fail(KILN_ERR_INVALID, "tokenizer of unknown kind %d", (int)tok->kind);
}

/* The special token the template wrote at text[p..end), if any: one of its markers that the vocab holds as a
 * control, user-defined or unknown-type token, the longest first. *len gets its length. */
static int32_t marker_at(const kiln_chat_template *t, const kiln_tokenizer *tok, const char *text, size_t p, size_t end, size_t *len) {
    static const char *const markers[] = {"<|start_header_id|>", "<|end_header_id|>", "<start_of_turn>", "<end_of_turn>",
                                          "<|im_start|>", "<|im_end|>", "<|eot_id|>"};
    kiln_str cand[2 + sizeof markers / sizeof markers[0]];
    size_t n = 0, best_len = 0;
    int32_t best = -1;
    cand[n++] = t->bos, cand[n++] = t->eos;
    for (size_t i = 0; i < sizeof markers / sizeof markers[0]; i++) cand[n++] = cstr(markers[i]);
    for (size_t i = 0; i < n; i++) {
        const size_t l = (size_t)cand[i].len;
        if (l == 0 || l <= best_len || l > end - p || memcmp(text + p, cand[i].ptr, l) != 0) continue;
        int32_t id = kiln_tok_find(tok, cand[i].ptr, l);
        if (id < 0) continue;
        kiln_token_type ty = tok->tokens[id].type;
        if (ty != KILN_TOKEN_CONTROL && ty != KILN_TOKEN_USER_DEFINED && ty != KILN_TOKEN_UNKNOWN) continue;
        best = id, best_len = l;
    }
    *len = best_len;
    return best;
}

/* The text b tokenized as llama.cpp tokenizes with special tokens parsed, except that they are looked for only
 * outside the content spans, and only among the template's markers. */
static kiln_status tokenize_formatted(const kiln_chat_template *t, const kiln_tokenizer *tok, const sbuf *b, kiln_tokens *out) {
    size_t plain = 0, span = 0; /* the plain stretch starts at plain; span is the next content span */
    bool first = true;
    kiln_status s = KILN_OK;
    for (size_t p = 0; p < b->n && !s;) {
        if (span < b->n_span && p >= b->span[2 * span]) { /* inside content: skip to its end */
            p = b->span[2 * span + 1];
            span++;
            continue;
        }
        const size_t end = span < b->n_span ? b->span[2 * span] : b->n; /* template text up to here */
        size_t len;
        int32_t id = marker_at(t, tok, b->buf, p, end, &len);
        if (id < 0) {
            p++;
            continue;
        }
        /* a token with lstrip/rstrip takes the whitespace beside it out of the text, as in tokenize.c */
        size_t stop = p, next = p + len;
        if (tok->tokens[id].strip & TOK_LSTRIP)
            while (stop > plain && is_ws(b->buf[stop - 1])) stop--;
        if (tok->tokens[id].strip & TOK_RSTRIP)
            while (next < b->n && is_ws(b->buf[next])) next++;
        if (!(s = encode_plain(tok, b->buf + plain, stop - plain, first, out))) s = kiln_tokens_push(out, id);
        first = true;
        plain = p = next;
        while (span < b->n_span && b->span[2 * span + 1] <= p) span++; /* rstrip may run into content */
    }
    if (!s && plain < b->n) s = encode_plain(tok, b->buf + plain, b->n - plain, first, out);
    return s;
}

kiln_status kiln_chat_tokenize(const kiln_chat_template *t, const kiln_tokenizer *tok, const kiln_chat_msg *msgs, size_t n,
                               bool add_generation_prompt, kiln_tokens *out) {
    sbuf b = {.spans = true};
    kiln_status s = format_into(t, msgs, n, add_generation_prompt, &b);
    if (s) return s;
    s = tokenize_formatted(t, tok, &b, out);
    free(b.buf);
    free(b.span);
    return s;
}

/* ---------------------------------------------------------------- a conversation in a session */

/* How many messages after the leading system message (first: 1 with one, else 0) to drop so that the conversation
 * starts again at a user message; the last message is never dropped. */
static size_t turn_length(const kiln_chat_msg *msgs, size_t n, size_t first) {
    size_t k = first < n - 1 ? 1 : 0;
    while (first + k < n - 1 && strcmp(msgs[first + k].role, "user") != 0) k++;
    return k;
}

kiln_status kiln_chat_eval(kiln_session *s, const kiln_chat_template *t, const kiln_tokenizer *tok, const kiln_chat_msg *msgs, size_t n,
                           int64_t reserve, float *logits, kiln_chat_eval_info *info) {
    memset(info, 0, sizeof *info);
    if (n == 0) return kiln_fail(KILN_ERR_INVALID, "chat: no messages to evaluate");
    if (reserve < 0) return kiln_fail(KILN_ERR_INVALID, "chat: reserve %lld is negative", (long long)reserve);
    const int64_t n_ctx = kiln_session_n_ctx(s);
    const size_t first = strcmp(msgs[0].role, "system") == 0 && n > 1 ? 1 : 0;
    /* the oldest turns after the system message go, a whole turn at a time, until the conversation and reserve fit */
    kiln_chat_msg *kept = malloc(n * sizeof *kept);
    kiln_tokens ids = {0};
    if (!kept) return kiln_fail(KILN_ERR_NOMEM, "chat: out of memory for %zu messages", n);
    memcpy(kept, msgs, n * sizeof *kept);
    size_t n_kept = n;
    kiln_status st = KILN_OK;
    for (;;) {
        ids.n = 0;
        if ((st = kiln_chat_tokenize(t, tok, kept, n_kept, true, &ids))) break;
        const size_t k = turn_length(kept, n_kept, first);
        if ((int64_t)ids.n + reserve <= n_ctx || k == 0) break;
        if (info->n_dropped == 0) info->n_dropped_tokens = (int64_t)ids.n;
        memmove(kept + first, kept + first + k, (n_kept - first - k) * sizeof *kept);
        n_kept -= k;
        info->n_dropped += k;
    }
    if (!st && info->n_dropped) info->n_dropped_tokens -= (int64_t)ids.n;
    if (!st && (int64_t)ids.n >= n_ctx) {
        info->too_long = true;
        st = kiln_fail(KILN_ERR_RANGE, "chat: the last turn needs %zu tokens%s, and the context holds %lld with one left to reply in; "
                       "shorten it or raise the context", ids.n, first ? " with the system message" : "", (long long)n_ctx);
    }
    if (st) {
        info->n_dropped = 0, info->n_dropped_tokens = 0; /* nothing was dropped: the session is as it was */
        free(kept);
        kiln_tokens_free(&ids);
        return st;
    }
    /* keep the cache up to the first token that differs; at least the last token is evaluated, for its logits */
    const int32_t *hist = kiln_session_tokens(s);
    const int64_t pos = kiln_session_pos(s), n_ids = (int64_t)ids.n;
    int64_t same = 0;
    while (same < pos && same < n_ids && hist[same] == ids.ids[same]) same++;
    if (same == n_ids) same--;
    same = kiln_session_keep(s, same);
    info->n_tokens = n_ids;
    info->n_kept = same;
    info->n_eval = n_ids - same;
    st = kiln_session_eval(s, ids.ids + same, (size_t)(n_ids - same), logits, NULL);
    free(kept);
    kiln_tokens_free(&ids);
    return st;
}
