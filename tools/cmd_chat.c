/* cmd_chat.c: `kiln chat -m MODEL [--system TEXT] [--chat-template NAME] [sampling options] [--grammar ... |
 * --json-schema ...]`, a conversation over stdin: each line is a user turn, the reply streams to stdout and ends at
 * the family's end-of-turn token (or EOS). With a grammar every reply is one of its sentences (the matcher restarts
 * each turn; the end of turn is allowed exactly where the grammar can end).
 * Each turn hands the whole conversation to kiln_chat_eval (src/infer/chat.c), which tokenizes it with only the
 * template's markers as special tokens (a typed "</s>" is text), keeps the KV cache up to the first token that
 * differs from what the session holds and evaluates the rest, so a turn costs its own tokens. When the context
 * fills, the oldest turns are dropped (the system message stays) with a notice on stderr; a turn too long for the
 * context alone is refused with an error and the chat goes on (the exit status is then 1). A reply that reaches
 * the end of the context stops there. Flags are read by kiln_cli_parse_args, with llama.cpp's spellings (tools/cli.h). Each turn ends with one stderr line, "kiln: turn N: K new tokens (cache kept
 * C) ...; E evaluated in all", which tests/test_chat.c reads, through $KILN_BIN, to see that a turn evaluates only
 * its own tokens. */
#include "kiln.h"
#include "tools/cmd.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char usage_line[] =
    "kiln: usage: kiln chat -m MODEL.gguf [-sys TEXT] [--chat-template llama2|llama3|chatml|gemma] [-n MAXTOK (1024)]\n"
    "                 [--temp T] [--top-k K] [--top-p P] [--min-p M] [--repeat-penalty R] [--repeat-last-n N]\n"
    "                 [--presence-penalty P] [--frequency-penalty F] [--seed S] [-t THREADS] [-c CTX (the model's, at\n"
    "                 most 4096)] [-b BATCH] [-r STOP]... [--ignore-eos] [--gpu | -ngl N] [--check-finite]\n"
    "                 [--grammar GBNF | --grammar-file F | --json-schema SCHEMA | --json-schema-file F] [--]\n"
    "                 (llama.cpp's long forms too: --model --system-prompt --n-predict --ctx-size --threads ...)\n";

#define DEFAULT_MAX_CTX 4096 /* the default context: enough for a conversation, a 128k-context model's KV cache is not */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
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
    kiln_cli_list stops; /* -r: a reply ends before the first of these it holds, which is neither printed nor kept */
    bool ignore_eos;     /* EOS and the end of turn are never sampled: each reply runs to -n or the context's end */
    const kiln_grammar *grammar; /* every reply is a sentence of it: its tokens are ones it allows, and the end of
                                  * turn (or EOS) comes exactly where it can end */
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

/* Drops messages first .. first + n - 1: the oldest turns kiln_chat_eval dropped, or a refused last turn. */
static void conv_drop(conversation *c, size_t first, size_t n) {
    for (size_t i = first; i < first + n; i++) free((char *)c->msgs[i].content);
    memmove(c->msgs + first, c->msgs + first + n, (c->n - first - n) * sizeof *c->msgs);
    c->n -= n;
}

/* Samples, prints and evaluates the reply until the end of the turn, a stop string, -n tokens or the end of the
 * context; the stop token itself is not evaluated (the next turn's text begins with it). reply gets the text, up to
 * reply->printed; *n_gen the tokens generated and *full whether the context ended the reply. */
static kiln_status reply_loop(kiln_session *sess, kiln_sampler *smp, kiln_grammar_matcher *gm, const kiln_tokenizer *tok, int32_t eot,
                              const chat_opts *o, int64_t V, float *logits, kiln_cli_stream *reply, char **buf, size_t *buf_cap,
                              int64_t *n_gen, bool *full) {
    const int32_t eos = kiln_tokenizer_eos(tok);
    const int64_t n_ctx = kiln_session_n_ctx(sess);
    /* on the GPU, once the turn's first token is drawn from the prompt's logits, each next one is drawn there and
     * only it comes back (--ignore-eos's banned ids with it: the sampler's); not where the host edits the logits (a
     * grammar) */
    const bool on_device = kiln_session_on_gpu(sess) && !gm;
    kiln_status s = gm ? kiln_grammar_matcher_reset(gm) : KILN_OK;
    *n_gen = 0, *full = false;
    int32_t next = 0;
    bool drawn = false; /* next came from the last eval */
    for (; !s && *n_gen < o->n_max; ++*n_gen) {
        if (gm) { /* the grammar's tokens only; where it can end, the end of turn as well as EOS */
            const float l_eot = eot >= 0 && eot < V ? logits[eot] : 0.0f;
            if ((s = kiln_grammar_matcher_mask(gm, logits))) return s;
            if (eot >= 0 && eot < V && kiln_grammar_matcher_done(gm)) logits[eot] = l_eot;
        }
        if (!drawn) next = kiln_sampler_sample(smp, logits, kiln_session_tokens(sess), (size_t)kiln_session_pos(sess));
        if (next == eot || next == eos) break;
        if (gm && (s = kiln_grammar_matcher_accept(gm, next))) return s;
        size_t n;
        if ((s = piece(tok, next, false, buf, buf_cap, &n))) return s;
        if (kiln_cli_stream_add(reply, *buf, n, &s)) {
            ++*n_gen;
            return KILN_OK;
        }
        if (s) return kiln_fail(KILN_ERR_NOMEM, "chat: out of memory for the reply");
        if (kiln_session_pos(sess) == n_ctx) {
            *full = true;
            ++*n_gen;
            break;
        }
        if ((s = on_device ? kiln_session_eval_sample(sess, &next, 1, smp, &next) : kiln_session_eval(sess, &next, 1, logits, NULL)))
            return s;
        drawn = on_device;
    }
    kiln_cli_stream_flush(reply);
    return KILN_OK;
}

static int chat(const kiln_model *m, const chat_opts *o) {
    const kiln_tokenizer *tok = kiln_model_tokenizer(m);
    if (!tok) {
        fprintf(stderr, "kiln: %s: the model has no tokenizer (tokenizer.ggml.* keys)\n", o->model_path);
        return 1;
    }
    kiln_chat_template tmpl;
    kiln_status s = o->template_name ? kiln_chat_template_from_name(o->template_name, m, &tmpl) : kiln_chat_template_detect(m, &tmpl);
    int32_t eot = -1;
    if (!s) s = kiln_chat_end_of_turn(&tmpl, tok, &eot);
    if (s) return kiln_cli_die(s);
    int64_t V = kiln_model_n_vocab(m), n_ctx = o->sess.n_ctx;
    if (n_ctx == 0) n_ctx = kiln_model_n_ctx_train(m) < DEFAULT_MAX_CTX ? kiln_model_n_ctx_train(m) : DEFAULT_MAX_CTX;
    /* room kept for a reply when old turns can be dropped to make it: -n, at most a quarter of the context */
    const int64_t reserve = o->n_max < n_ctx / 4 ? o->n_max : n_ctx / 4;
    fprintf(stderr, "kiln: chat template %s, context %lld tokens%s\n", kiln_chat_family_name(tmpl.family), (long long)n_ctx,
            o->template_name ? "" : " (template detected from tokenizer.chat_template)");

    kiln_session *sess = NULL;
    kiln_sampler *smp = NULL;
    kiln_grammar_matcher *gm = NULL;
    kiln_session_params sp = o->sess;
    sp.n_ctx = n_ctx;
    s = kiln_session_new(m, &sp, &sess);
    if (!s) s = kiln_sampler_new(&o->sampler, V, &smp);
    if (!s && o->ignore_eos) { /* EOS and the end of turn never sampled */
        const int32_t ban[2] = {eot, kiln_tokenizer_eos(tok)};
        s = kiln_sampler_ban(smp, ban, 2);
    }
    if (!s && o->grammar) s = kiln_grammar_matcher_new(o->grammar, tok, &gm);
    if (s) {
        kiln_sampler_free(smp);
        kiln_session_free(sess);
        return kiln_cli_die(s);
    }
    float *logits = malloc((size_t)V * sizeof *logits); /* (V) */
    conversation conv = {0};
    kiln_cli_stream reply = {.stops = &o->stops};
    char *line = NULL, *buf = NULL;
    size_t line_cap = 0, buf_cap = 0;
    bool refused = false; /* a turn was too long for the context */
    if (!logits || (o->system && !conv_push(&conv, "system", o->system, strlen(o->system))))
        s = kiln_fail(KILN_ERR_NOMEM, "chat: out of memory");
    const size_t first = o->system ? 1 : 0; /* the oldest turn after the system message */
    bool tty = isatty(STDIN_FILENO);
    for (int turn = 1; !s; turn++) {
        if (tty) fputs("> ", stderr), fflush(stderr);
        ssize_t got = getline(&line, &line_cap, stdin);
        if (got < 0) break; /* EOF ends the chat */
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r')) line[--got] = 0;
        if (got == 0) {
            turn--;
            continue;
        }
        if (!conv_push(&conv, "user", line, (size_t)got)) {
            s = kiln_fail(KILN_ERR_NOMEM, "chat: out of memory");
            break;
        }
        double t0 = now_s();
        kiln_chat_eval_info info;
        s = kiln_chat_eval(sess, &tmpl, tok, conv.msgs, conv.n, reserve, logits, &info);
        if (s && info.too_long) { /* this turn is refused; the conversation goes on without it */
            fprintf(stderr, "kiln: turn %d: %s\n", turn, kiln_last_error());
            conv_drop(&conv, conv.n - 1, 1);
            refused = true;
            s = KILN_OK;
            continue;
        }
        if (s) break;
        if (info.n_dropped) {
            conv_drop(&conv, first, info.n_dropped);
            fprintf(stderr, "kiln: the context of %lld tokens is full: dropped the oldest %zu messages (%lld tokens)%s\n",
                    (long long)n_ctx, info.n_dropped, (long long)info.n_dropped_tokens, first ? ", kept the system message" : "");
        }
        double t1 = now_s();
        reply.n = reply.printed = 0;
        int64_t n_gen;
        bool full;
        s = reply_loop(sess, smp, gm, tok, eot, o, V, logits, &reply, &buf, &buf_cap, &n_gen, &full);
        double t2 = now_s();
        fputc('\n', stdout);
        fflush(stdout);
        if (!s && !conv_push(&conv, "assistant", reply.p ? reply.p : "", reply.printed)) s = kiln_fail(KILN_ERR_NOMEM, "chat: out of memory");
        if (s) break;
        fprintf(stderr, "kiln: turn %d: %lld new tokens (cache kept %lld) in %.3f s; %lld generated in %.3f s (%.1f tok/s)%s; %lld "
                "evaluated in all\n", turn, (long long)info.n_eval, (long long)info.n_kept, t1 - t0, (long long)n_gen, t2 - t1,
                n_gen ? (double)n_gen / (t2 - t1) : 0.0, full ? "; stopped at the end of the context" : n_gen == o->n_max ? "; stopped at -n" : "",
                (long long)kiln_session_n_evaluated(sess));
    }
    free(line);
    free(buf);
    free(reply.p);
    conv_free(&conv);
    free(logits);
    kiln_grammar_matcher_free(gm);
    kiln_sampler_free(smp);
    kiln_session_free(sess);
    if (s) return kiln_cli_die(s);
    return refused ? 1 : 0;
}

int kiln_cmd_chat(int argc, char **argv) {
    chat_opts o = {.n_max = 1024, .sampler = kiln_sampler_default()};
    bool gpu = false;
    kiln_cli_rope rope;
    kiln_cli_rope_init(&rope);
    enum { N_OWN = 14 };
    kiln_cli_grammar gram = {0};
    kiln_cli_opt opts[N_OWN + KILN_CLI_N_SAMPLING + KILN_CLI_N_ROPE + KILN_CLI_N_KV + KILN_CLI_N_GRAMMAR] = {
        {"-m", KILN_CLI_STR, &o.model_path, 0, 0},
        {"--model", KILN_CLI_STR, &o.model_path, 0, 0},
        {"-sys", KILN_CLI_STR, &o.system, 0, 0},
        {"--system-prompt", KILN_CLI_STR, &o.system, 0, 0},
        {"--system", KILN_CLI_STR, &o.system, 0, 0},
        {"--chat-template", KILN_CLI_STR, &o.template_name, 0, 0},
        {"-n", KILN_CLI_I64, &o.n_max, 1, 1000000000},
        {"--n-predict", KILN_CLI_I64, &o.n_max, 1, 1000000000},
        {"--predict", KILN_CLI_I64, &o.n_max, 1, 1000000000},
        {"--gpu", KILN_CLI_FLAG, &gpu, 0, 0}, /* all layers on the GPU, as -ngl 99 */
        {"--check-finite", KILN_CLI_FLAG, &o.sess.check_finite, 0, 0},
        {"-r", KILN_CLI_LIST, &o.stops, 0, 0},
        {"--reverse-prompt", KILN_CLI_LIST, &o.stops, 0, 0},
        {"--ignore-eos", KILN_CLI_FLAG, &o.ignore_eos, 0, 0},
    }; /* then the session and sampling options generate shares */
    int n_opts = N_OWN + kiln_cli_sampling_opts(opts + N_OWN, &o.sampler, &o.sess), n_pos;
    n_opts += kiln_cli_rope_opts(opts + n_opts, &rope);
    n_opts += kiln_cli_kv_opts(opts + n_opts, &o.sess);
    n_opts += kiln_cli_grammar_opts(opts + n_opts, &gram);
    if (!kiln_cli_parse_args("chat", argc, argv, opts, n_opts, NULL, 0, &n_pos)) return 1;
    if (gpu) kiln_cli_gpu_flag("--gpu", &o.sess);
    for (int i = 0; i < o.stops.n; i++)
        if (!*o.stops.v[i]) return kiln_cli_error("chat: -r needs a non-empty stop string");
    if (!o.model_path) {
        fputs(usage_line, stderr);
        return 1;
    }
    if (kiln_cli_grammar_given(&gram) && o.ignore_eos)
        return kiln_cli_error("chat: --ignore-eos with a grammar: the grammar's end is where the turn ends");
    kiln_grammar *g = NULL;
    if (!kiln_cli_grammar_load("chat", &gram, &g)) return 1;
    o.grammar = g;
    kiln_model *m;
    kiln_status s = kiln_model_load(o.model_path, &m);
    if (s) {
        kiln_grammar_free(g);
        return kiln_cli_die(s);
    }
    int rc = kiln_cli_rope_apply("chat", &rope, m) ? chat(m, &o) : 1;
    kiln_model_free(m);
    kiln_grammar_free(g);
    return rc;
}
