/* cmd_chat.c: `kiln chat -m MODEL [--system TEXT] [--chat-template NAME] [sampling options]`, a conversation over
 * stdin: each line is a user turn, the reply streams to stdout and ends at the family's end-of-turn token (or EOS).
 * The KV cache is kept across turns: the whole conversation is formatted with the chat template (src/infer/chat.c)
 * and, when the text already in the cache is a prefix of it, only the new suffix is tokenized and evaluated; if it
 * is not (a template that rewrites earlier turns, as llama2's strip() does) the session restarts from position 0.
 * Each turn ends with one stderr line, "kiln: turn N: K new tokens ..., G generated ...", which
 * tests/test_chat.c greps, through $KILN_BIN, to see that a second turn evaluates only its own tokens. */
#include "kiln.h"
#include "tools/cmd.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char usage_line[] =
    "kiln: usage: kiln chat -m MODEL.gguf [--system TEXT] [--chat-template llama2|llama3|chatml|gemma] [-n MAXTOK (1024)]\n"
    "                 [--temp T] [--top-k K] [--top-p P] [--min-p M] [--repeat-penalty R] [--repeat-last-n N] [--seed S]\n"
    "                 [-t THREADS] [-c CTX (the model's, at most 4096)] [--gpu | -ngl N]\n";

#define DEFAULT_MAX_CTX 4096 /* the default context: enough for a conversation, a 128k-context model's KV cache is not */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A growable byte string: the text already in the KV cache, and each reply. */
typedef struct {
    char *p;
    size_t n, cap;
} text;

static bool text_put(text *t, const char *s, size_t n) {
    if (t->n + n + 1 > t->cap) {
        size_t cap = t->cap ? t->cap : 1024;
        while (cap < t->n + n + 1) cap *= 2;
        char *p = realloc(t->p, cap);
        if (!p) return false;
        t->p = p, t->cap = cap;
    }
    memcpy(t->p + t->n, s, n);
    t->n += n;
    t->p[t->n] = 0;
    return true;
}

/* The bytes of token id into *buf (grown as needed); *n gets the length. */
static kiln_status piece(const kiln_tokenizer *tok, int32_t id, bool special, char **buf, size_t *cap, size_t *n) {
    kiln_status s = kiln_tokenizer_piece(tok, id, special, *buf, *cap, n);
    if (s || *n <= *cap) return s;
    char *p = realloc(*buf, *n);
    if (!p) return KILN_ERR_NOMEM;
    *buf = p, *cap = *n;
    return kiln_tokenizer_piece(tok, id, special, *buf, *cap, n);
}

typedef struct {
    const char *model_path, *system, *template_name;
    int64_t n_max;
    kiln_session_params sess; /* n_ctx 0: the training context, at most DEFAULT_MAX_CTX */
    kiln_sampler_params sampler;
} chat_opts;

/* The conversation so far; contents are owned. */
typedef struct {
    kiln_chat_msg *msgs;
    size_t n, cap;
} conversation;

static bool conv_push(conversation *c, const char *role, const char *content, size_t len) {
    if (c->n == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 16;
        kiln_chat_msg *p = realloc(c->msgs, cap * sizeof *p);
        if (!p) return false;
        c->msgs = p, c->cap = cap;
    }
    char *copy = malloc(len + 1);
    if (!copy) return false;
    memcpy(copy, content, len);
    copy[len] = 0;
    c->msgs[c->n++] = (kiln_chat_msg){role, copy};
    return true;
}

static void conv_free(conversation *c) {
    for (size_t i = 0; i < c->n; i++) free((char *)c->msgs[i].content);
    free(c->msgs);
}

static int chat(const kiln_model *m, const chat_opts *o) {
    const kiln_tokenizer *tok = kiln_model_tokenizer(m);
    if (!tok) {
        fprintf(stderr, "kiln: %s: the model has no tokenizer (tokenizer.ggml.* keys)\n", o->model_path);
        return 1;
    }
    kiln_chat_template tmpl;
    kiln_status s = o->template_name ? kiln_chat_template_from_name(o->template_name, m, &tmpl) : kiln_chat_template_detect(m, &tmpl);
    int32_t eot = -1, eos = kiln_tokenizer_eos(tok);
    if (!s) s = kiln_chat_end_of_turn(&tmpl, tok, &eot);
    if (s) return kiln_cli_die(s);
    int64_t V = kiln_model_n_vocab(m), n_ctx = o->sess.n_ctx;
    if (n_ctx == 0) n_ctx = kiln_model_n_ctx_train(m) < DEFAULT_MAX_CTX ? kiln_model_n_ctx_train(m) : DEFAULT_MAX_CTX;
    fprintf(stderr, "kiln: chat template %s, context %lld tokens%s\n", kiln_chat_family_name(tmpl.family), (long long)n_ctx,
            o->template_name ? "" : " (template detected from tokenizer.chat_template)");

    kiln_session *sess = NULL;
    kiln_sampler *smp = NULL;
    kiln_session_params sp = o->sess;
    sp.n_ctx = n_ctx;
    s = kiln_session_new(m, &sp, &sess);
    if (!s) s = kiln_sampler_new(&o->sampler, V, &smp);
    if (s) {
        kiln_session_free(sess);
        return kiln_cli_die(s);
    }
    int32_t *ids = malloc((size_t)(n_ctx + 1) * sizeof *ids); /* (n_ctx + 1) the cached tokens, for the repeat penalty */
    float *logits = malloc((size_t)V * sizeof *logits);      /* (V) */
    conversation conv = {0};
    text cached = {0}, reply = {0};
    char *line = NULL, *formatted = NULL, *buf = NULL;
    size_t line_cap = 0, buf_cap = 0, n_ids = 0;
    kiln_tokens enc = {0};
    const char *err = NULL;
    char msg[256];
    if (!ids || !logits || !text_put(&cached, "", 0) || (o->system && !conv_push(&conv, "system", o->system, strlen(o->system))))
        err = "out of memory";
    bool tty = isatty(STDIN_FILENO);
    for (int turn = 1; !err && !s; turn++) {
        if (tty) fputs("> ", stderr), fflush(stderr);
        ssize_t got = getline(&line, &line_cap, stdin);
        if (got < 0) break; /* EOF ends the chat */
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r')) line[--got] = 0;
        if (got == 0) {
            turn--;
            continue;
        }
        if (!conv_push(&conv, "user", line, (size_t)got)) {
            err = "out of memory";
            break;
        }
        free(formatted);
        size_t len;
        if ((s = kiln_chat_format(&tmpl, conv.msgs, conv.n, true, &formatted, &len))) break;
        /* keep the cache when the text in it is a prefix of the conversation; otherwise start over */
        bool kept = cached.n <= len && memcmp(cached.p, formatted, cached.n) == 0;
        size_t n_before = n_ids;
        if (!kept) {
            kiln_session_reset(sess);
            cached.n = 0, n_ids = 0;
        }
        enc.n = 0;
        if ((s = kiln_tokenizer_encode(tok, formatted + cached.n, len - cached.n, false, true, &enc))) break;
        if ((int64_t)(n_ids + enc.n) > n_ctx) {
            snprintf(msg, sizeof msg, "chat: turn %d needs %zu tokens of context, more than the %lld of -c; start a new chat or raise -c",
                     turn, n_ids + enc.n, (long long)n_ctx);
            err = msg;
            break;
        }
        double t0 = now_s();
        if ((s = kiln_session_eval(sess, enc.ids, enc.n, logits, NULL))) break;
        memcpy(ids + n_ids, enc.ids, enc.n * sizeof *ids);
        n_ids += enc.n;
        if (!text_put(&cached, formatted + cached.n, len - cached.n)) {
            err = "out of memory";
            break;
        }
        double t1 = now_s();
        /* sample, print and evaluate until the end of the turn; the stop token itself is not evaluated, the next turn's
         * text begins with it */
        reply.n = 0;
        if (!text_put(&reply, "", 0)) {
            err = "out of memory";
            break;
        }
        int64_t n_gen = 0;
        for (; n_gen < o->n_max; n_gen++) {
            int32_t next = kiln_sampler_sample(smp, logits, ids, n_ids);
            if (next == eot || next == eos) break;
            size_t n;
            if ((s = piece(tok, next, false, &buf, &buf_cap, &n))) break;
            fwrite(buf, 1, n, stdout);
            fflush(stdout);
            if (!text_put(&reply, buf, n)) {
                err = "out of memory";
                break;
            }
            /* the cache's text takes the piece with control tokens spelled out, so a stray one breaks the prefix */
            if ((s = piece(tok, next, true, &buf, &buf_cap, &n))) break;
            if (!text_put(&cached, buf, n)) {
                err = "out of memory";
                break;
            }
            if ((int64_t)n_ids == n_ctx) {
                snprintf(msg, sizeof msg, "chat: the context of %lld tokens is full in turn %d; start a new chat or raise -c",
                         (long long)n_ctx, turn);
                err = msg;
                break;
            }
            ids[n_ids++] = next;
            if ((s = kiln_session_eval(sess, &next, 1, logits, NULL))) break;
        }
        double t2 = now_s();
        fputc('\n', stdout);
        fflush(stdout);
        if (!err && !s && !conv_push(&conv, "assistant", reply.p, reply.n)) err = "out of memory";
        if (err || s) break;
        fprintf(stderr, "kiln: turn %d: %zu new tokens (%s %zu) in %.3f s; %lld generated in %.3f s (%.1f tok/s)%s\n", turn, enc.n,
                kept ? "cache kept" : "cache reset, dropped", n_before, t1 - t0, (long long)n_gen, t2 - t1,
                n_gen ? (double)n_gen / (t2 - t1) : 0.0, n_gen == o->n_max ? "; stopped at -n" : "");
    }
    kiln_tokens_free(&enc);
    free(formatted);
    free(line);
    free(buf);
    free(cached.p);
    free(reply.p);
    conv_free(&conv);
    free(logits);
    free(ids);
    kiln_sampler_free(smp);
    kiln_session_free(sess);
    if (err) {
        fprintf(stderr, "kiln: %s\n", err);
        return 1;
    }
    return s ? kiln_cli_die(s) : 0;
}

int kiln_cmd_chat(int argc, char **argv) {
    chat_opts o = {.n_max = 1024, .sampler = kiln_sampler_default()};
    int r;
    for (int i = 0; i < argc; i += 2) {
        const char *f = argv[i], *a = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = true;
        if (kiln_cli_gpu_flag(f, &o.sess)) { /* the one flag without a value */
            i--;
            continue;
        }
        if (!a) {
            fprintf(stderr, "kiln: chat: %s needs a value\n", f);
            fputs(usage_line, stderr);
            return 1;
        }
        if (strcmp(f, "-m") == 0) o.model_path = a;
        else if (strcmp(f, "--system") == 0) o.system = a;
        else if (strcmp(f, "--chat-template") == 0) o.template_name = a;
        else if (strcmp(f, "-n") == 0) ok = kiln_cli_parse_int("chat", f, a, 1, 1000000000, &o.n_max);
        else if ((r = kiln_cli_sampling_opt("chat", f, a, &o.sampler, &o.sess))) ok = r > 0;
        else {
            fprintf(stderr, "kiln: chat: unexpected argument '%s'\n", f);
            fputs(usage_line, stderr);
            return 1;
        }
        if (!ok) return 1;
    }
    if (!o.model_path) {
        fputs(usage_line, stderr);
        return 1;
    }
    kiln_model *m;
    kiln_status s = kiln_model_load(o.model_path, &m);
    if (s) return kiln_cli_die(s);
    int rc = chat(m, &o);
    kiln_model_free(m);
    return rc;
}
