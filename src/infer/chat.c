/* chat.c: chat templates without a Jinja engine. A GGUF's tokenizer.chat_template is Jinja source; the four
 * families kiln supports (llama2, llama3, chatml, gemma) are told apart by substrings only their templates
 * contain, and each is written out here by hand, following its reference template to the byte: where it trims
 * (Python's str.strip / Jinja's trim), where it puts bos_token, how it places the system message. chatml
 * templates that add a system turn when there is none (SmolLM2, Qwen2) carry that text as a string literal,
 * which is read out of the template. tests/test_chat.c compares every family with tests/ref/chat_*.txt, the
 * output of the real templates rendered by jinja2 as transformers' apply_chat_template does. */
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

typedef struct {
    char *buf;
    size_t n, cap;
    bool failed;
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

/* Python's str.strip() and Jinja's trim filter, on ASCII whitespace */
static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
static void put_trimmed(sbuf *b, const char *s) {
    size_t n = strlen(s);
    while (n && is_ws(*s)) s++, n--;
    while (n && is_ws(s[n - 1])) n--;
    put(b, s, n);
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
        puts_(b, t->date);
        puts_(b, "\n\n");
        if ((first = n > 0 && strcmp(msgs[0].role, "system") == 0)) put_trimmed(b, msgs[0].content);
        puts_(b, "<|eot_id|>");
    }
    for (size_t i = first; i < n; i++) {
        if (i == 0 && !t->date[0]) put_str(b, t->bos); /* 3.0: bos opens the first message */
        puts_(b, "<|start_header_id|>");
        puts_(b, msgs[i].role);
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
        puts_(b, t->default_system);
        puts_(b, "<|im_end|>\n");
    }
    for (size_t i = 0; i < n; i++) {
        puts_(b, "<|im_start|>");
        puts_(b, msgs[i].role);
        puts_(b, "\n");
        puts_(b, msgs[i].content);
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
            puts_(b, msgs[0].content);
            puts_(b, "\n\n");
        }
        put_trimmed(b, msgs[i].content);
        puts_(b, "<end_of_turn>\n");
    }
    if (gen) puts_(b, "<start_of_turn>model\n");
    return KILN_OK;
}

kiln_status kiln_chat_format(const kiln_chat_template *t, const kiln_chat_msg *msgs, size_t n, bool add_generation_prompt,
                             char **out, size_t *len) {
    *out = NULL;
    if (len) *len = 0;
    if ((unsigned)t->family >= N_FAMILIES) return kiln_fail(KILN_ERR_INVALID, "chat: template family %d is unknown", (int)t->family);
    for (size_t i = 0; i < n; i++)
        if (!msgs[i].role || !msgs[i].content) return kiln_fail(KILN_ERR_INVALID, "chat: message %zu has no role or no content", i);
    sbuf b = {0};
    put(&b, "", 0); /* an empty conversation is "" (or just bos), never NULL */
    kiln_status s;
    switch (t->family) {
    case KILN_CHAT_LLAMA2: s = format_llama2(t, msgs, n, &b); break;
    case KILN_CHAT_LLAMA3: s = format_llama3(t, msgs, n, add_generation_prompt, &b); break;
    case KILN_CHAT_CHATML: s = format_chatml(t, msgs, n, add_generation_prompt, &b); break;
    default: s = format_gemma(t, msgs, n, add_generation_prompt, &b); break;
    }
    if (!s && b.failed) s = kiln_fail(KILN_ERR_NOMEM, "chat: out of memory formatting %zu messages", n);
    if (s) {
        free(b.buf);
        return s;
    }
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
