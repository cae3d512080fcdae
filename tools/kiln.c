/* kiln.c: the command-line tool. The only place in kiln that prints or exits.
 *
 *   kiln inspect FILE.gguf [--all]        metadata and tensor table
 *   kiln quantize IN.gguf OUT.gguf TYPE   convert weights (f16 bf16 q8_0 q4_0 q4_1 q4_k q5_k q6_k q4_k_m q5_k_m)
 *   kiln synth [--shape S] [--type T] [--vocab V.gguf] -o OUT.gguf   a llama model with random weights
 *   kiln tokenize -m FILE [--add-special] [--parse-special] [--ids] (TEXT | --file PATH | -- -TEXT)
 *   kiln tokenizer train CORPUS... --vocab N -o OUT.gguf [--specials a,b,c] [--min-frequency N]
 *   kiln data CORPUS... -t TOKENIZER.gguf -o DIR [--val-fraction F] [--shard-tokens N]   (tools/cmd_data.c)
 *   kiln plot LOG.jsonl -o loss.svg [--title T]                                          (tools/cmd_plot.c)
 *   kiln bench quant [--quick]            dequantize / vec_dot throughput per type and SIMD level
 *   kiln bench grammar [--vocab F]...     the allowed-token mask's time per token under fixed grammars
 *   kiln bench spec -m TARGET [-md DRAFT] [--draft-max 2,4,8] [--simulate-accept A]   speculative decoding's speedup
 *   kiln bench -m MODEL.gguf [-t T] [-p 128,512] [-n 64] [-r R]   pp and tg tok/s, as llama-bench
 *   kiln convert llama2c MODEL.bin --tokenizer TOK.bin -o OUT.gguf | hf DIR -o OUT.gguf [--type T]     (tools/cmd_convert.c)
 *   kiln generate [-m MODEL.gguf] [-p PROMPT | -f FILE] [-n N] [sampling options] [-r STOP]... [--ignore-eos]
 *                 [--grammar GBNF | --grammar-file F | --json-schema SCHEMA | --json-schema-file F] [-t THREADS]
 *                 [-c CTX] [-b BATCH] [--chat] [--chat-template NAME] [--check-finite]
 *   kiln chat -m MODEL.gguf [-sys TEXT] [--chat-template NAME] [sampling options]                       (tools/cmd_chat.c)
 *   kiln serve -m MODEL.gguf [--host H] [--port N] [-np SLOTS] [-c CTX] [--api-key KEY] ...             (tools/cmd_serve.c)
 *   kiln --version
 *
 * Every command reads its arguments through one option table (kiln_cli_parse_args, tools/cli.c), with llama.cpp's
 * spellings beside kiln's short ones (--model, --prompt, --n-predict, --ctx-size, ...): numbers are strict, an
 * unknown flag is named with the nearest known one, "--" ends the options, and what came from a file or argv is printed escaped. Errors go to stderr as one
 * line, "kiln: <message>", and the exit status is 1. */
#include "kiln.h"
#include "bench/bench.h"
#include "tools/cli.h"
#include "tools/cmd.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Prints a string value from a file, escaped and cut at max bytes. */
static void print_str(kiln_str s, size_t max) {
    size_t n = s.len < max ? (size_t)s.len : max;
    kiln_cli_put_quoted(stdout, s.ptr, n);
    if (n < s.len) printf("...(%" PRIu64 " bytes)", s.len);
}

/* ---------------------------------------------------------------- synth */

/* An explicit dimension (--dim C ...) overrides the shape's, whatever their order. */
static int cmd_synth(int argc, char **argv) {
    kiln_synth_params p = kiln_synth_default();
    const char *out = NULL, *pos = NULL, *shape = NULL, *type = NULL;
    int64_t dims[7] = {0}; /* 0: not given */
    int64_t *const to[7] = {&p.n_vocab, &p.n_embd, &p.n_layer, &p.n_head, &p.n_head_kv, &p.n_ff, &p.n_ctx};
    const kiln_cli_opt opts[] = {
        {"--vocab-size", KILN_CLI_I64, &dims[0], 1, INT32_MAX}, {"--dim", KILN_CLI_I64, &dims[1], 1, INT32_MAX},
        {"--layers", KILN_CLI_I64, &dims[2], 1, INT32_MAX},     {"--heads", KILN_CLI_I64, &dims[3], 1, INT32_MAX},
        {"--kv-heads", KILN_CLI_I64, &dims[4], 1, INT32_MAX},   {"--ff", KILN_CLI_I64, &dims[5], 1, INT32_MAX},
        {"--ctx", KILN_CLI_I64, &dims[6], 1, INT32_MAX},        {"--tied", KILN_CLI_FLAG, &p.tied, 0, 0},
        {"--fast", KILN_CLI_FLAG, &p.fast, 0, 0},               {"--seed", KILN_CLI_U64, &p.seed, 0, 0},
        {"-t", KILN_CLI_INT, &p.n_threads, 0, 4096},            {"--vocab", KILN_CLI_STR, &p.vocab_path, 0, 0},
        {"--shape", KILN_CLI_STR, &shape, 0, 0},                {"--type", KILN_CLI_STR, &type, 0, 0},
        {"--qk-norm", KILN_CLI_FLAG, &p.qk_norm, 0, 0},         {"-o", KILN_CLI_STR, &out, 0, 0},
    };
    int n_pos;
    if (!kiln_cli_parse_args("synth", argc, argv, opts, sizeof opts / sizeof opts[0], &pos, 1, &n_pos)) return 1;
    if (pos && out) return kiln_cli_error("synth: unexpected argument '%s' (the output is -o %s)", pos, out);
    if (pos) out = pos;
    kiln_status s;
    if (shape && (s = kiln_synth_shape(shape, &p))) return kiln_cli_die(s);
    if (type && (s = kiln_ftype_from_name(type, &p.ftype))) return kiln_cli_die(s);
    for (int d = 0; d < 7; d++)
        if (dims[d]) *to[d] = dims[d];
    if (!out) {
        fprintf(stderr, "kiln: usage: kiln synth [--shape llama-124m|tinyllama-1.1b|llama2-7b|llama3-8b] [--type f32|f16|q8_0|q4_0|q4_k_m|...] "
                        "[--vocab VOCAB.gguf] [--dim C] [--layers L] [--heads NH] [--kv-heads NKV] [--ff F] [--vocab-size V] [--ctx N] "
                        "[--tied] [--qk-norm (qwen3: per-head QK-norm)] [--fast (random block bytes: for speed tests)] [--seed S] [-t N] "
                        "-o OUT.gguf\n");
        return 1;
    }
    if ((s = kiln_synth_llama(out, &p))) return kiln_cli_die(s);
    kiln_cli_note("wrote %s (%s, C=%lld L=%lld NH=%lld NKV=%lld F=%lld, %s%s%s)", out, p.qk_norm ? "qwen3" : "llama",
            (long long)p.n_embd, (long long)p.n_layer, (long long)p.n_head, (long long)p.n_head_kv, (long long)p.n_ff, kiln_ftype_name(p.ftype),
            p.vocab_path ? ", vocab from " : "", p.vocab_path ? p.vocab_path : "");
    return 0;
}

/* ---------------------------------------------------------------- tokenize */

typedef struct {
    const kiln_tokenizer *tok;
    bool ids_only;
    size_t n_done;
    char *piece;
    size_t piece_cap;
} tokenize_out;

/* Prints ids as they stream in: space-separated, or one `ID -> "piece"` per line (as llama-tokenize does). */
static kiln_status print_ids(void *ud, const int32_t *ids, size_t n) {
    tokenize_out *o = ud;
    for (size_t i = 0; i < n; i++, o->n_done++) {
        if (o->ids_only) {
            printf(o->n_done ? " %d" : "%d", ids[i]);
            continue;
        }
        size_t len;
        kiln_status s = kiln_tokenizer_piece(o->tok, ids[i], true, o->piece, o->piece_cap, &len);
        if (s) return s;
        if (len > o->piece_cap) {
            char *p = realloc(o->piece, len);
            if (!p) return KILN_ERR_NOMEM;
            o->piece = p, o->piece_cap = len;
            if ((s = kiln_tokenizer_piece(o->tok, ids[i], true, o->piece, o->piece_cap, &len))) return s;
        }
        printf("%6d -> ", ids[i]);
        print_str((kiln_str){o->piece, len}, SIZE_MAX);
        putchar('\n');
    }
    return KILN_OK;
}

static int cmd_tokenize(int argc, char **argv) {
    const char *model = NULL, *file = NULL, *text = NULL, *prompt = NULL;
    bool add_special = false, parse_special = false, ids_only = false;
    const kiln_cli_opt opts[] = {
        {"-m", KILN_CLI_STR, &model, 0, 0},
        {"--model", KILN_CLI_STR, &model, 0, 0},
        {"-f", KILN_CLI_STR, &file, 0, 0},
        {"--file", KILN_CLI_STR, &file, 0, 0},
        {"-p", KILN_CLI_STR, &prompt, 0, 0},
        {"--prompt", KILN_CLI_STR, &prompt, 0, 0},
        {"--add-special", KILN_CLI_FLAG, &add_special, 0, 0},
        {"--parse-special", KILN_CLI_FLAG, &parse_special, 0, 0},
        {"--ids", KILN_CLI_FLAG, &ids_only, 0, 0},
    };
    int n_pos;
    if (!kiln_cli_parse_args("tokenize", argc, argv, opts, sizeof opts / sizeof opts[0], &text, 1, &n_pos)) return 1;
    if (!model || (!!text + !!file + !!prompt) != 1) {
        fprintf(stderr, "kiln: usage: kiln tokenize -m FILE [--add-special] [--parse-special] [--ids] (TEXT | -p TEXT | -f PATH | -- -TEXT)\n");
        return 1;
    }
    kiln_tokenizer *tok;
    kiln_status s = kiln_tokenizer_load_file(model, &tok);
    if (s) return kiln_cli_die(s);
    if (prompt) text = prompt;
    tokenize_out o = {.tok = tok, .ids_only = ids_only};
    if (file) {
        /* the file's bytes exactly, trailing newline included, streamed in bounded memory */
        s = kiln_tokenizer_encode_file(tok, file, add_special, parse_special, print_ids, &o);
    } else {
        kiln_tokens ids = {0};
        s = kiln_tokenizer_encode(tok, text, strlen(text), add_special, parse_special, &ids);
        if (!s) s = print_ids(&o, ids.ids, ids.n);
        kiln_tokens_free(&ids);
    }
    if (ids_only && !s) putchar('\n');
    free(o.piece);
    kiln_tokenizer_free(tok);
    return s ? kiln_cli_die(s) : 0;
}

/* ---------------------------------------------------------------- tokenizer train */

static int cmd_tokenizer(int argc, char **argv) {
    if (argc < 1 || strcmp(argv[0], "train") != 0) {
        fprintf(stderr, "kiln: usage: kiln tokenizer train CORPUS... --vocab N -o OUT.gguf [--specials a,b,c] [--min-frequency N]\n");
        return 1;
    }
    kiln_bpe_train_params p = {.vocab_size = 0, .min_frequency = 2, .progress = kiln_cli_progress};
    const char *out = NULL, *spec_arg = NULL;
    const char **corpus = calloc((size_t)argc, sizeof *corpus), **specials = NULL;
    char *spec_buf = NULL;
    int n_corpus = 0, rc = 1;
    const kiln_cli_opt opts[] = {
        {"--vocab", KILN_CLI_INT, &p.vocab_size, 1, INT32_MAX},
        {"-o", KILN_CLI_STR, &out, 0, 0},
        {"--min-frequency", KILN_CLI_I64, &p.min_frequency, 0, INT32_MAX},
        {"-t", KILN_CLI_INT, &p.n_threads, 0, 4096},
        {"--specials", KILN_CLI_STR, &spec_arg, 0, 0},
    };
    if (!corpus) return kiln_cli_error("out of memory");
    if (!kiln_cli_parse_args("tokenizer train", argc - 1, argv + 1, opts, sizeof opts / sizeof opts[0], corpus, argc, &n_corpus))
        goto out;
    if (spec_arg) {
        if (!(spec_buf = strdup(spec_arg))) {
            kiln_cli_error("out of memory");
            goto out;
        }
        /* as many as the list has: it has at most one more than its commas */
        size_t most = 1;
        for (const char *c = spec_arg; *c; c++) most += *c == ',';
        if (!(specials = calloc(most, sizeof *specials))) {
            kiln_cli_error("out of memory");
            goto out;
        }
        for (char *tok = strtok(spec_buf, ","); tok; tok = strtok(NULL, ",")) specials[p.n_specials++] = tok;
        p.specials = specials;
    }
    if (!out || n_corpus == 0 || p.vocab_size <= 0) {
        fprintf(stderr, "kiln: usage: kiln tokenizer train CORPUS... --vocab N -o OUT.gguf [--specials a,b,c] [--min-frequency N]\n");
        goto out;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    kiln_status s = kiln_bpe_train(corpus, n_corpus, &p, out);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (s) {
        kiln_cli_die(s);
        goto out;
    }
    kiln_cli_note("wrote %s in %.2f s", out, (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
    rc = 0;
out:
    free(corpus);
    free(spec_buf);
    free(specials);
    return rc;
}

/* ---------------------------------------------------------------- generate */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The text of token id as llama2.c's run.c prints it, so seeded runs match its output byte for byte: a piece right
 * after BOS loses its leading space (the SentencePiece dummy prefix), a byte token is its byte, and a lone byte that
 * is neither printable nor whitespace (a stray UTF-8 fragment, a control byte) is nothing. *out and *n_out get it,
 * inside *buf. */
static kiln_status piece_text(const kiln_tokenizer *tok, int32_t prev, int32_t id, char **buf, size_t *cap, const char **out,
                              size_t *n_out) {
    size_t n;
    kiln_status s = kiln_tokenizer_piece(tok, id, false, *buf, *cap, &n);
    if (s) return s;
    if (n > *cap) {
        char *p = realloc(*buf, n);
        if (!p) return KILN_ERR_NOMEM;
        *buf = p, *cap = n;
        if ((s = kiln_tokenizer_piece(tok, id, false, *buf, *cap, &n))) return s;
    }
    const char *p = *buf;
    if (prev == kiln_tokenizer_bos(tok) && n > 0 && p[0] == ' ' && kiln_tokenizer_token_type(tok, id) != KILN_TOKEN_BYTE) p++, n--;
    if (n == 1 && !(isprint((unsigned char)p[0]) || isspace((unsigned char)p[0]))) n = 0;
    *out = p, *n_out = n;
    return KILN_OK;
}

typedef struct {
    int64_t n_new; /* tokens to generate */
    kiln_session_params sess; /* n_ctx 0: what the run needs, at most the training context */
    kiln_sampler_params sampler;
    bool chat;       /* the prompt is a chat turn (chat_ids, tokenized by kiln_chat_tokenize): do not echo it */
    int32_t eot;     /* with chat: the end-of-turn token, which stops generation like EOS */
    kiln_tokens chat_ids; /* with chat: the templated prompt, only the template's markers special */
    kiln_cli_list stops;  /* -r: stop when the generated text holds one of these, which is not printed */
    bool ignore_eos;      /* EOS, BOS and the end of turn are never sampled (their logits -inf), as llama.cpp's */
    kiln_cli_rope rope;   /* --rope-* / --yarn-*, applied to the model once loaded */
    const kiln_grammar *grammar; /* --grammar / --grammar-file: every new token is one the grammar allows */
    /* speculative decoding: drafts from prompt lookup (--lookup) or a draft model (-md), verified in one batched
     * forward of the target each */
    bool lookup;
    const char *draft_path;
    int64_t draft_max, draft_min, lookup_ngram;
} generate_opts;

/* The argmax of V logits. */
static int32_t argmax_row(const float *row, int32_t V) {
    int32_t best = 0;
    for (int32_t i = 1; i < V; i++)
        if (row[i] > row[best]) best = i;
    return best;
}

/* generate's loop with speculative decoding (the prompt evaluated, its last logits in logits): each round drafts up
 * to draft_max tokens after the sequence (prompt lookup, or the draft model: greedy, or sampled from its own
 * distribution at a temperature), the target verifies them with the token it feeds next in one forward
 * (kiln_spec_verify_greedy, or kiln_spec_verify_sample with the drafter's distributions), and the tokens it takes
 * are printed one by one as plain decoding would. */
static kiln_status generate_spec(const kiln_model *m, const kiln_tokenizer *tok, kiln_session *sess, kiln_sampler *smp, const generate_opts *o,
                                 int32_t *seq, size_t n_prompt, int64_t n_ctx, float *logits, kiln_cli_stream *text, char **piece,
                                 size_t *piece_cap, size_t *n_io, bool *full, bool *stopped) {
    const bool sampling = o->sampler.temp != 0;
    const int32_t V = (int32_t)kiln_model_n_vocab(m), eos = kiln_tokenizer_eos(tok), bos = kiln_tokenizer_bos(tok);
    kiln_model *dm = NULL;
    kiln_session *ds = NULL;
    kiln_status s = KILN_OK;
    if (o->draft_path) {
        kiln_session_params dp = o->sess;
        dp.n_ctx = n_ctx;
        s = kiln_model_load(o->draft_path, &dm);
        if (!s && kiln_model_n_vocab(dm) != V)
            s = kiln_fail(KILN_ERR_INVALID, "%s: the draft model's vocab has %lld tokens, the model's %lld: they must share a tokenizer",
                          o->draft_path, (long long)kiln_model_n_vocab(dm), (long long)V);
        if (!s) s = kiln_session_new(dm, &dp, &ds);
    }
    const size_t dmax = (size_t)o->draft_max;
    int32_t *queue = malloc((dmax + 1) * sizeof *queue), *draft = malloc((dmax + 1) * sizeof *draft);
    float *q = sampling && ds ? malloc(dmax * (size_t)V * sizeof *q) : NULL; /* (k, V): the drafter's distributions */
    if (!s && (!queue || !draft || (sampling && ds && !q))) s = kiln_fail(KILN_ERR_NOMEM, "out of memory");
    size_t n = n_prompt, q_n = 0, q_i = 0;
    int64_t dpos = 0, drafted = 0, accepted = 0, rounds = 0;
    if (!s) queue[q_n++] = sampling ? kiln_sampler_sample(smp, logits, seq, n) : argmax_row(logits, V);
    for (int64_t i = 0; !s && i < o->n_new; i++) {
        const int32_t tok_id = queue[q_i++];
        if (tok_id == eos || tok_id == bos || (o->chat && tok_id == o->eot)) break;
        const char *p;
        size_t np;
        if ((s = piece_text(tok, seq[n - 1], tok_id, piece, piece_cap, &p, &np))) break;
        seq[n++] = tok_id;
        if ((*stopped = kiln_cli_stream_add(text, p, np, &s)) || s) break;
        if (i + 1 == o->n_new) break;
        if (q_i < q_n) continue; /* the next token was verified with this one: it is in the cache already */
        if ((*full = kiln_session_pos(sess) == n_ctx)) break;
        /* a round: the drafts, at most what the context and -n leave room for */
        size_t room = (size_t)(n_ctx - kiln_session_pos(sess) - 1), left = (size_t)(o->n_new - i - 2), k = dmax;
        if (k > room) k = room;
        if (k > left) k = left;
        if (k < (size_t)o->draft_min) k = 0; /* before the draft model runs: its cache must hold only what is kept */
        if (k && ds) {
            if (!(s = kiln_spec_draft(ds, sampling ? smp : NULL, V, seq + dpos, n - (size_t)dpos, k, draft, q)))
                dpos = (int64_t)(n + k - 1);
        } else if (k) {
            k = kiln_spec_lookup(seq, n, 1, (int)o->lookup_ngram, k, draft);
            if (k < (size_t)o->draft_min) k = 0;
        }
        if (s) break;
        size_t got = 0;
        if ((s = sampling ? kiln_spec_verify_sample(sess, smp, V, tok_id, q, draft, k, queue, &got)
                          : kiln_spec_verify_greedy(sess, V, tok_id, draft, k, queue, &got)))
            break;
        rounds++, drafted += (int64_t)k, accepted += (int64_t)got - 1;
        if (ds) { /* the draft's cache: the sequence so far and the drafts that were taken */
            const int64_t keep = (int64_t)n + (int64_t)(got - 1 < k ? got - 1 : k - 1);
            if (k && kiln_session_keep(ds, keep) != keep) s = kiln_fail(KILN_ERR_UNSUPPORTED, "the draft model's cache cannot be cut back");
            if (k) dpos = keep;
        }
        q_n = got, q_i = 0;
    }
    *n_io = n;
    if (!s)
        fprintf(stderr, "\nkiln: speculative (%s): %lld rounds, %lld drafted, %lld accepted (%.1f%%)", ds ? "draft model" : "prompt lookup",
                (long long)rounds, (long long)drafted, (long long)accepted, drafted ? 100.0 * (double)accepted / (double)drafted : 0.0);
    free(queue), free(draft), free(q);
    kiln_session_free(ds);
    kiln_model_free(dm);
    return s;
}

/* Prompt -> prefill -> sample/print/decode until n_new tokens, EOS, a stop string or a full context. Prints the
 * prompt as given, then each new piece as it comes (held back while it could begin a stop string); timings go to
 * stderr. */
static int generate(const kiln_model *m, const char *model_path, const char *prompt, const generate_opts *o) {
    const kiln_tokenizer *tok = kiln_model_tokenizer(m);
    if (!tok) return kiln_cli_error("%s: the model has no tokenizer (tokenizer.ggml.* keys)", model_path);
    int32_t bos = kiln_tokenizer_bos(tok), eos = kiln_tokenizer_eos(tok);
    int64_t V = kiln_model_n_vocab(m);
    kiln_tokens enc = {0};
    kiln_status s = KILN_OK;
    if (o->chat) {
        if (!(enc.ids = malloc((o->chat_ids.n ? o->chat_ids.n : 1) * sizeof *enc.ids))) return kiln_cli_error("out of memory");
        memcpy(enc.ids, o->chat_ids.ids, o->chat_ids.n * sizeof *enc.ids);
        enc.n = enc.cap = o->chat_ids.n;
    } else if (prompt)
        s = kiln_tokenizer_encode(tok, prompt, strlen(prompt), true, false, &enc);
    if (s) return kiln_cli_die(s);
    if (enc.n == 0 && bos < 0) {
        kiln_tokens_free(&enc);
        return kiln_cli_error("%s: the vocab has no BOS token to start from; give a prompt", model_path);
    }
    size_t n_prompt = enc.n ? enc.n : 1;
    int64_t n_ctx = o->sess.n_ctx;
    if (n_ctx == 0) {
        n_ctx = (int64_t)n_prompt + o->n_new;
        if (n_ctx > kiln_model_n_ctx_train(m)) n_ctx = kiln_model_n_ctx_train(m);
    }
    /* the sequence: the prompt's ids (BOS alone when there is no prompt), then the new tokens; the last token
     * sampled is never fed back, so it holds at most n_ctx + 1 */
    size_t n_seq = n_prompt + (size_t)o->n_new;
    if (n_seq > (size_t)n_ctx + 1) n_seq = (size_t)n_ctx + 1;
    if (n_seq < n_prompt) n_seq = n_prompt;
    int32_t *seq = malloc(n_seq * sizeof *seq);
    float *logits = malloc((size_t)V * sizeof *logits);
    char *piece = NULL;
    size_t piece_cap = 0;
    kiln_cli_stream text = {.stops = &o->stops};
    kiln_session *sess = NULL;
    kiln_sampler *smp = NULL;
    kiln_grammar_matcher *gm = NULL;
    const char *err = NULL; /* a failure of this function's own, printed as is */
    if (!seq || !logits) err = "out of memory";
    else if (enc.n) memcpy(seq, enc.ids, enc.n * sizeof *seq);
    else seq[0] = bos;
    kiln_tokens_free(&enc);
    char msg[128];
    if (!err && (int64_t)n_prompt > n_ctx) {
        snprintf(msg, sizeof msg, "the prompt is %zu tokens, more than the context of %lld", n_prompt, (long long)n_ctx);
        err = msg;
    }
    kiln_session_params sp = o->sess;
    sp.n_ctx = n_ctx;
    if (err) s = KILN_ERR_INVALID;
    if (!s) s = kiln_session_new(m, &sp, &sess);
    const int32_t banned[3] = {eos, bos, o->chat ? o->eot : -1}; /* with --ignore-eos */
    if (!s) s = kiln_sampler_new(&o->sampler, V, &smp);
    if (!s && o->ignore_eos) s = kiln_sampler_ban(smp, banned, 3);
    if (!s && o->grammar) s = kiln_grammar_matcher_new(o->grammar, tok, &gm);
    if (!s && prompt && !o->chat) {
        fputs(prompt, stdout);
        fflush(stdout);
    }
    double t0 = now_s();
    size_t n = n_prompt;
    bool full = false, stopped = false;
    /* on the GPU the token is picked there and 4 bytes come back instead of the logits: the argmax (greedy), or the
     * sampler's draw (--ignore-eos's banned ids travel with it); not where the host edits the logits first (a
     * grammar) or drafts (speculation) */
    const kiln_sampler_params *sm = &o->sampler;
    const bool on_device = sess && kiln_session_on_gpu(sess) && !gm && !o->lookup && !o->draft_path;
    const bool argmax = on_device && !o->ignore_eos && sm->temp == 0 && sm->repeat_penalty == 1 && sm->presence_penalty == 0 &&
                        sm->frequency_penalty == 0;
    const bool sampled = on_device && !argmax;
    int32_t next = 0;
    if (!s)
        s = argmax ? kiln_session_eval_argmax(sess, seq, n_prompt, &next)
            : sampled ? kiln_session_eval_sample(sess, seq, n_prompt, smp, &next)
                      : kiln_session_eval(sess, seq, n_prompt, logits, NULL);
    double t1 = now_s();
    if (!s && (o->lookup || o->draft_path)) {
        s = generate_spec(m, tok, sess, smp, o, seq, n_prompt, n_ctx, logits, &text, &piece, &piece_cap, &n, &full, &stopped);
        goto done;
    }
    for (int64_t i = 0; !s && i < o->n_new; i++) {
        if (gm && (s = kiln_grammar_matcher_mask(gm, logits))) break; /* before the sampler: its filters see only these */
        if (!argmax && !sampled) next = kiln_sampler_sample(smp, logits, seq, n);
        /* EOS ends the text; so does BOS, which llama2.c's stories use to separate documents */
        if (next == eos || next == bos || (o->chat && next == o->eot)) break;
        if (gm && (s = kiln_grammar_matcher_accept(gm, next))) break;
        const char *p;
        size_t np;
        if ((s = piece_text(tok, seq[n - 1], next, &piece, &piece_cap, &p, &np))) break;
        seq[n++] = next;
        if ((stopped = kiln_cli_stream_add(&text, p, np, &s)) || s) break;
        if (i + 1 == o->n_new) break;
        if ((full = kiln_session_pos(sess) == n_ctx)) break;
        s = argmax ? kiln_session_eval_argmax(sess, &next, 1, &next)
            : sampled ? kiln_session_eval_sample(sess, &next, 1, smp, &next)
                      : kiln_session_eval(sess, &next, 1, logits, NULL);
    }
done:;
    double t2 = now_s();
    if (!s && !stopped) kiln_cli_stream_flush(&text);
    if (!s) {
        size_t n_gen = n - n_prompt;
        fputc('\n', stderr); /* the text has no newline of its own at the end */
        if (stopped) fprintf(stderr, "kiln: stopped at a stop string (-r)\n");
        if (full) fprintf(stderr, "kiln: stopped: the context of %lld tokens is full\n", (long long)n_ctx);
        fprintf(stderr, "kiln: prompt %zu tokens in %.3f s (%.1f tok/s); generated %zu tokens in %.3f s (%.1f tok/s)\n", n_prompt,
                t1 - t0, (double)n_prompt / (t1 - t0), n_gen, t2 - t1, n_gen ? (double)n_gen / (t2 - t1) : 0.0);
    }
    free(piece);
    free(text.p);
    free(logits);
    free(seq);
    if (!s && gm && !kiln_grammar_matcher_done(gm))
        fprintf(stderr, "kiln: the text stopped before the grammar's end (-n, a stop string or the context)\n");
    kiln_grammar_matcher_free(gm);
    kiln_sampler_free(smp);
    kiln_session_free(sess);
    if (err) fprintf(stderr, "kiln: %s\n", err);
    else if (s) kiln_cli_die(s);
    return s ? 1 : 0;
}

#define DEFAULT_MODEL "shakespeare.gguf" /* models/: kiln_cli_default_model finds it */

/* generate's work after its options: the model (the bundled default without -m), the chat template, the run. */
static int generate_with(const char *model_path, const char *prompt, const char *chat_template, generate_opts *o) {
    char default_path[4096];
    if (!model_path && !(model_path = kiln_cli_default_model(default_path, sizeof default_path))) {
        fprintf(stderr, "kiln: generate: no -m MODEL.gguf and the bundled default (models/" DEFAULT_MODEL ") was not found next to "
                        "the kiln binary or in the current folder\n");
        return 1;
    }
    kiln_model *m;
    kiln_status s = kiln_model_load(model_path, &m);
    if (s) return kiln_cli_die(s);
    if (!kiln_cli_rope_apply("generate", &o->rope, m)) {
        kiln_model_free(m);
        return 1;
    }
    /* --chat: -p becomes one user turn of the chat template, with the assistant's header after it; only the
     * template's markers are special tokens, so a "</s>" typed in -p stays text */
    kiln_chat_template t;
    if (o->chat && (!prompt || !kiln_model_tokenizer(m))) {
        fprintf(stderr, "kiln: generate: --chat needs %s\n", prompt ? "a model with a tokenizer" : "a prompt (-p)");
        kiln_model_free(m);
        return 1;
    }
    if (o->chat) {
        s = chat_template ? kiln_chat_template_from_name(chat_template, m, &t) : kiln_chat_template_detect(m, &t);
        if (!s) s = kiln_chat_end_of_turn(&t, kiln_model_tokenizer(m), &o->eot);
        if (!s) s = kiln_chat_tokenize(&t, kiln_model_tokenizer(m), &(kiln_chat_msg){"user", prompt}, 1, true, &o->chat_ids);
    }
    int rc = s ? kiln_cli_die(s) : generate(m, model_path, prompt, o);
    kiln_tokens_free(&o->chat_ids);
    kiln_model_free(m);
    return rc;
}

static int cmd_generate(int argc, char **argv) {
    const char *model_path = NULL, *prompt = NULL, *prompt_file = NULL, *chat_template = NULL;
    kiln_cli_grammar gram = {0};
    generate_opts o = {.n_new = 256, .sampler = kiln_sampler_default(), .draft_max = 16, .draft_min = 0, .lookup_ngram = 3};
    bool gpu = false;
    enum { N_OWN = 26 };
    kiln_cli_rope_init(&o.rope);
    kiln_cli_opt opts[N_OWN + KILN_CLI_N_SAMPLING + KILN_CLI_N_ROPE + KILN_CLI_N_KV] = {
        {"-m", KILN_CLI_STR, &model_path, 0, 0},
        {"--model", KILN_CLI_STR, &model_path, 0, 0},
        {"-p", KILN_CLI_STR, &prompt, 0, 0},
        {"--prompt", KILN_CLI_STR, &prompt, 0, 0},
        {"-f", KILN_CLI_STR, &prompt_file, 0, 0}, /* the prompt from a file, less one final newline */
        {"--file", KILN_CLI_STR, &prompt_file, 0, 0},
        {"-r", KILN_CLI_LIST, &o.stops, 0, 0},
        {"--reverse-prompt", KILN_CLI_LIST, &o.stops, 0, 0},
        {"--ignore-eos", KILN_CLI_FLAG, &o.ignore_eos, 0, 0},
        {"-n", KILN_CLI_I64, &o.n_new, 0, 1000000000},
        {"--n-predict", KILN_CLI_I64, &o.n_new, 0, 1000000000},
        {"--predict", KILN_CLI_I64, &o.n_new, 0, 1000000000},
        {"--chat", KILN_CLI_FLAG, &o.chat, 0, 0},
        {"--chat-template", KILN_CLI_STR, &chat_template, 0, 0},
        {"--gpu", KILN_CLI_FLAG, &gpu, 0, 0}, /* all layers on the GPU, as -ngl 99 */
        {"--check-finite", KILN_CLI_FLAG, &o.sess.check_finite, 0, 0}, /* name the first layer whose output is NaN/Inf */
        {"--grammar", KILN_CLI_STR, &gram.grammar, 0, 0},
        {"--grammar-file", KILN_CLI_STR, &gram.grammar_file, 0, 0},
        {"--lookup", KILN_CLI_FLAG, &o.lookup, 0, 0},
        {"-md", KILN_CLI_STR, &o.draft_path, 0, 0},
        {"--model-draft", KILN_CLI_STR, &o.draft_path, 0, 0},
        {"--draft-max", KILN_CLI_I64, &o.draft_max, 1, 256},
        {"--draft-min", KILN_CLI_I64, &o.draft_min, 0, 256},
        {"--lookup-ngram", KILN_CLI_I64, &o.lookup_ngram, 1, 16},
        {"--json-schema", KILN_CLI_STR, &gram.schema, 0, 0}, /* a JSON Schema, made a grammar (kiln_json_schema_to_gbnf) */
        {"--json-schema-file", KILN_CLI_STR, &gram.schema_file, 0, 0},
    }; /* then the session and sampling options chat shares */
    int n_opts = N_OWN + kiln_cli_sampling_opts(opts + N_OWN, &o.sampler, &o.sess), n_pos;
    n_opts += kiln_cli_rope_opts(opts + n_opts, &o.rope);
    n_opts += kiln_cli_kv_opts(opts + n_opts, &o.sess);
    if (!kiln_cli_parse_args("generate", argc, argv, opts, n_opts, NULL, 0, &n_pos)) return 1;
    if (gpu) kiln_cli_gpu_flag("--gpu", &o.sess);
    if (chat_template) o.chat = true;
    for (int i = 0; i < o.stops.n; i++)
        if (!*o.stops.v[i]) return kiln_cli_error("generate: -r needs a non-empty stop string");
    if (prompt && prompt_file) return kiln_cli_error("generate: give the prompt as -p or as -f, not both");
    char *file_text = NULL;
    if (prompt_file) {
        size_t len;
        if (!(file_text = kiln_cli_read_file("generate", prompt_file, &len))) return 1;
        if (strlen(file_text) != len) {
            kiln_cli_error("generate: %s: a NUL byte at offset %zu; a prompt is text", prompt_file, strlen(file_text));
            free(file_text);
            return 1;
        }
        if (len && file_text[len - 1] == '\n') file_text[len - 1] = 0; /* as llama.cpp's -f */
        prompt = file_text;
    }
    if (kiln_cli_grammar_given(&gram) && o.ignore_eos) {
        free(file_text);
        return kiln_cli_error("generate: --ignore-eos with a grammar: the grammar's end is where EOS comes");
    }
    if (o.lookup || o.draft_path) {
        const kiln_sampler_params *sm = &o.sampler;
        const char *why = o.lookup && o.draft_path ? "give --lookup or -md, not both"
                          : sm->repeat_penalty != 1 || sm->presence_penalty != 0 || sm->frequency_penalty != 0
                              ? "speculative decoding with penalties is not supported yet"
                          : kiln_cli_grammar_given(&gram) ? "speculative decoding with a grammar is not supported yet"
                          : o.ignore_eos ? "speculative decoding with --ignore-eos is not supported yet"
                          : o.draft_min > o.draft_max ? "--draft-min is more than --draft-max" : NULL;
        if (why) {
            free(file_text);
            return kiln_cli_error("generate: %s", why);
        }
    }
    kiln_grammar *g = NULL;
    if (!kiln_cli_grammar_load("generate", &gram, &g)) {
        free(file_text);
        return 1;
    }
    o.grammar = g;
    int rc = generate_with(model_path, prompt, chat_template, &o);
    kiln_grammar_free(g);
    free(file_text);
    return rc;
}

/* ---------------------------------------------------------------- perplexity */

static int cmd_perplexity(int argc, char **argv) {
    const char *model = NULL, *file = NULL;
    int64_t n_ctx = 512;
    kiln_session_params run = {0};
    bool gpu = false;
    kiln_cli_rope rope;
    kiln_cli_rope_init(&rope);
    enum { N_OWN = 15 };
    kiln_cli_opt opts[N_OWN + KILN_CLI_N_ROPE + KILN_CLI_N_KV] = {
        {"-m", KILN_CLI_STR, &model, 0, 0},
        {"--model", KILN_CLI_STR, &model, 0, 0},
        {"-f", KILN_CLI_STR, &file, 0, 0},
        {"--file", KILN_CLI_STR, &file, 0, 0},
        {"-c", KILN_CLI_I64, &n_ctx, 16, INT32_MAX},
        {"--ctx-size", KILN_CLI_I64, &n_ctx, 16, INT32_MAX},
        {"--ctx", KILN_CLI_I64, &n_ctx, 16, INT32_MAX},
        {"-b", KILN_CLI_I64, &run.n_batch, 1, INT32_MAX},
        {"--batch-size", KILN_CLI_I64, &run.n_batch, 1, INT32_MAX},
        {"-t", KILN_CLI_INT, &run.n_threads, 0, 4096},
        {"--threads", KILN_CLI_INT, &run.n_threads, 0, 4096},
        {"-ngl", KILN_CLI_INT, &run.n_gpu_layers, 0, INT32_MAX},
        {"--gpu-layers", KILN_CLI_INT, &run.n_gpu_layers, 0, INT32_MAX},
        {"--n-gpu-layers", KILN_CLI_INT, &run.n_gpu_layers, 0, INT32_MAX},
        {"--gpu", KILN_CLI_FLAG, &gpu, 0, 0},
    };
    int n_pos, n_opts = N_OWN + kiln_cli_rope_opts(opts + N_OWN, &rope);
    n_opts += kiln_cli_kv_opts(opts + n_opts, &run);
    if (!kiln_cli_parse_args("perplexity", argc, argv, opts, n_opts, NULL, 0, &n_pos)) return 1;
    if (gpu) kiln_cli_gpu_flag("--gpu", &run);
    if (!model || !file) {
        fprintf(stderr, "kiln: usage: kiln perplexity -m MODEL -f TEXT [-c N (512)] [-b N] [-t THREADS] [--gpu | -ngl N]\n");
        return 1;
    }
    size_t len;
    char *text = kiln_cli_read_file("perplexity", file, &len);
    if (!text) return 1;
    kiln_model *m;
    kiln_status s = kiln_model_load(model, &m);
    if (!s && !kiln_cli_rope_apply("perplexity", &rope, m)) {
        free(text);
        kiln_model_free(m);
        return 1;
    }
    kiln_perplexity_result r;
    if (!s) s = kiln_perplexity(m, text, len, n_ctx, &run, kiln_cli_progress, NULL, &r);
    free(text);
    kiln_model_free(m);
    if (s) return kiln_cli_die(s);
    printf("perplexity %.4f +/- %.4f (%lld tokens scored in %lld windows of %lld)\n", r.ppl, r.ppl_err, (long long)r.n_scored,
           (long long)r.n_windows, (long long)n_ctx);
    return 0;
}

/* ---------------------------------------------------------------- main */

static void usage(FILE *f) {
    fprintf(f, "usage: kiln COMMAND ...\n"
               "  inspect FILE.gguf [--all]              print metadata and the tensor table\n"
               "  quantize IN.gguf OUT.gguf TYPE [-t N]  TYPE: f16 bf16 q8_0 q4_0 q4_1 q4_k q5_k q6_k q4_k_m q5_k_m\n"
               "  perplexity -m MODEL -f TEXT [-c N] [-b N] [-t N] [--gpu]  perplexity as llama-perplexity computes it\n"
               "  tokenize -m FILE [--add-special] [--parse-special] [--ids] (TEXT | -p TEXT | -f PATH | -- -TEXT)\n"
               "  tokenizer train CORPUS... --vocab N -o OUT.gguf [--specials a,b,c] [--min-frequency N]\n"
               "  data CORPUS... -t TOKENIZER.gguf -o DIR [--val-fraction F] [--shard-tokens N]   token shards for training\n"
               "  plot LOG.jsonl -o loss.svg [--title T]  train and val loss curves of a training log as an SVG\n"
               "  synth [--shape S] [--type T] [--vocab V.gguf] -o OUT.gguf  a llama model with random weights\n"
               "  bench quant [--quick]                  dequantize and vec_dot throughput per type, scalar vs SIMD\n"
               "  bench grammar [--vocab F.gguf]... [--walks N]   the allowed-token mask's time per token under fixed grammars\n"
               "  bench spec -m TARGET [-md DRAFT] [--gpu] [-p P | -f F] [-n N] [--draft-max 2,4,8] [--temp T]\n"
               "             [--simulate-accept A] [--reps R]   speculative decoding: acceptance, tokens/forward, speedup\n"
               "  bench -m MODEL.gguf [-t T] [-p 128,512] [-n 64] [-r R]   prompt and generation tok/s, as llama-bench\n"
               "  bench --gpu -m MODEL.gguf [-p 512] [-n 128] [-r R]   the same on the GPU, with GB/s, VRAM and a per-op decode profile\n"
               "  bench serve (--url URL | -m MODEL [-np N] [-t T]) [-c 1,4,16] [-n 64] [--peer-bin llama-server]\n"
               "                                         streaming clients: tok/s, time to first token, inter-token p50/p99\n"
               "  bench train [--config tiny|small|124m|350m] [-B B] [-T T] [-t N] [--steps N] [--mixed] [--8bit] [--peer PYTHON]\n"
               "              [--gpu [--peer-script PY] [--max-batch] [--recompute] [--nproc N [--zero1]]]\n"
               "                                         training tok/s and MFU, beside PyTorch with --peer\n"
               "  bench gpu-kernels [--quick] [--matvec] [--attention] [--train] [--few] [--sample] [--phases]\n"
               "                                         the CUDA kernels alone: GB/s or TFLOP/s against the measured ceilings\n"
               "  convert llama2c MODEL.bin --tokenizer TOK.bin -o OUT.gguf   a llama2.c checkpoint to GGUF\n"
               "  convert hf DIR -o OUT.gguf [--type T]  a Hugging Face checkpoint folder to GGUF\n"
               "  generate [-m MODEL.gguf] [-p PROMPT | -f FILE] [-n N] [--temp T] [--top-k K] [--top-p P] [--min-p M]\n"
               "           [--repeat-penalty R] [--repeat-last-n N] [--presence-penalty P] [--frequency-penalty F]\n"
               "           [-s SEED] [-r STOP]... [--ignore-eos] [--grammar GBNF | --grammar-file F]\n"
               "           [--json-schema SCHEMA | --json-schema-file F] [-t THREADS] [-c CTX]\n"
               "           [-b BATCH] [--gpu | -ngl N]\n"
               "           [--chat] [--chat-template NAME]   -p as one user turn of the model's chat template\n"
               "           [--check-finite]   name the first layer whose output is NaN or infinite (KILN_CHECK_FINITE=1)\n"
               "  chat -m MODEL.gguf [-sys TEXT] [--chat-template llama2|llama3|chatml|gemma] [-n MAXTOK] [sampling opts]\n"
               "                                         a conversation over stdin lines, replies streamed to stdout\n"
               "  serve -m MODEL.gguf [--host 127.0.0.1] [--port 8080] [-np SLOTS] [-c CTX] [-b N] [-t N] [--gpu | -ngl N]\n"
               "        [--api-key KEY | --api-key-file F] [--slot-save-path DIR] [--metrics] [--timeout S] [--alias NAME]\n"
               "                                         an HTTP server: llama-server's, OpenAI's and Ollama's routes\n"
               "  --gpu (or -ngl N, N at least the layer count, as llama.cpp's -ngl 99) runs the whole model on the GPU\n"
               "  llama.cpp's long forms work too: --model --prompt --file --n-predict --ctx-size --threads --batch-size\n"
               "  --seed --temperature --reverse-prompt --n-gpu-layers --system-prompt; kiln --version prints the version\n"

               "  generate, chat, perplexity, bench: llama.cpp's RoPE overrides --rope-scaling none|linear|yarn, --rope-scale N,\n"
               "           --rope-freq-base N, --rope-freq-scale N, --yarn-orig-ctx N, --yarn-ext-factor N,\n"
               "           --yarn-attn-factor N, --yarn-beta-slow N, --yarn-beta-fast N\n");
}

static bool is_help(const char *a) { return strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0; }

int main(int argc, char **argv) {
    if (argc < 2 || is_help(argv[1])) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "version") == 0) cmd = "--version";
    if (kiln_cli_version(cmd)) return 0;
    /* `kiln COMMAND --help` and `kiln bench NAME --help`: train and the benchmarks with a usage of their own (bench
     * -m, --gpu, quant, tokenize, model) print theirs; every other command prints this one, which lists every
     * command's options, and exits 0 as llama.cpp's tools do */
    const bool bench = strcmp(cmd, "bench") == 0;
    if (!bench && strcmp(cmd, "train") != 0 && argc >= 3 && is_help(argv[2])) {
        usage(stdout);
        return 0;
    }
    if (bench && argc >= 4 && is_help(argv[3]) &&
        (strcmp(argv[2], "train") == 0 || strcmp(argv[2], "serve") == 0 || strcmp(argv[2], "spec") == 0 ||
         strcmp(argv[2], "grammar") == 0 || strcmp(argv[2], "gpu-kernels") == 0)) {
        usage(stdout);
        return 0;
    }
    if (strcmp(cmd, "inspect") == 0) return kiln_cmd_inspect(argc - 2, argv + 2);
    if (strcmp(cmd, "quantize") == 0) return kiln_cmd_quantize(argc - 2, argv + 2);
    if (strcmp(cmd, "synth") == 0) return cmd_synth(argc - 2, argv + 2);
    if (strcmp(cmd, "tokenize") == 0) return cmd_tokenize(argc - 2, argv + 2);
    if (strcmp(cmd, "tokenizer") == 0) return cmd_tokenizer(argc - 2, argv + 2);
    if (strcmp(cmd, "convert") == 0) return kiln_cmd_convert(argc - 2, argv + 2);
    if (strcmp(cmd, "perplexity") == 0) return cmd_perplexity(argc - 2, argv + 2);
    if (strcmp(cmd, "generate") == 0) return cmd_generate(argc - 2, argv + 2);
    if (strcmp(cmd, "data") == 0) return kiln_cmd_data(argc - 2, argv + 2);
    if (strcmp(cmd, "plot") == 0) return kiln_cmd_plot(argc - 2, argv + 2);
    if (strcmp(cmd, "train") == 0) return kiln_cmd_train(argc - 2, argv + 2);
    if (strcmp(cmd, "chat") == 0) return kiln_cmd_chat(argc - 2, argv + 2);
    if (strcmp(cmd, "serve") == 0) return kiln_cmd_serve(argc - 2, argv + 2);
    if (strcmp(cmd, "bench") == 0) {
        if (argc >= 3 && strcmp(argv[2], "quant") == 0) return kiln_bench_quant(argc - 3, argv + 3);
        if (argc >= 3 && strcmp(argv[2], "tokenize") == 0) return kiln_bench_tokenize(argc - 3, argv + 3);
        if (argc >= 3 && strcmp(argv[2], "grammar") == 0) return kiln_bench_grammar(argc - 3, argv + 3);
        if (argc >= 3 && strcmp(argv[2], "spec") == 0) return kiln_bench_spec(argc - 3, argv + 3);
        if (argc >= 3 && strcmp(argv[2], "train") == 0) return kiln_bench_train(argc - 3, argv + 3);
        if (argc >= 3 && strcmp(argv[2], "serve") == 0) return kiln_bench_serve(argc - 3, argv + 3);
        if (argc >= 3 && strcmp(argv[2], "model") == 0) return kiln_bench_model(argc - 3, argv + 3);
        if (argc >= 3 && strcmp(argv[2], "gpu-kernels") == 0) return kiln_bench_gpu_kernels(argc - 3, argv + 3);
        for (int i = 2; i < argc; i++) /* --version anywhere: kiln's; --gpu: the GPU benchmark (bench/bench_gpu.c) */
            if (kiln_cli_version(argv[i])) return 0;
        for (int i = 2; i < argc; i++)
            if (strcmp(argv[i], "--gpu") == 0) return kiln_bench_gpu(argc - 2, argv + 2);
        if (argc >= 3 && argv[2][0] == '-') return kiln_bench_model(argc - 2, argv + 2); /* -m MODEL, in any order */
        return kiln_cli_error("bench: unknown benchmark '%s' (available: quant, tokenize, train, serve, model or -m MODEL)", argc >= 3 ? argv[2] : "");
    }
    return kiln_cli_error("unknown command '%s' (kiln --help lists them)", cmd);
}
