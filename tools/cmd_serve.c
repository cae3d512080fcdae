/* cmd_serve.c: `kiln serve -m MODEL.gguf [options]`, an HTTP server speaking llama-server's, OpenAI's and Ollama's
 * APIs (src/serve/), with llama-server's flag names: -c is the total context and each of the -np slots gets c / np
 * positions, as llama-server without --kv-unified. It binds loopback unless --host says otherwise, prints
 * "kiln serve: listening on http://HOST:PORT" on stderr once it accepts (--port 0: a free port, the one printed), and
 * on SIGTERM or SIGINT stops accepting, lets the requests in flight finish and exits 0. --workbench adds the
 * workbench's job API under /wb/ (src/serve/routes_wb.c, jobs.c) over --data-dir (./kiln-workbench); -m is then
 * optional, and without it the model routes answer 503. --lookup or -md DRAFT.gguf decode speculatively
 * (docs/speculative.md): the draft model gets a context of its own with a sequence per slot, on the GPU when the
 * target is (-ngld its layers there). */
#include "kiln.h"
#include "serve/jobs.h"
#include "serve/serve.h"
#include "tools/cmd.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char usage_line[] =
    "kiln: usage: kiln serve -m MODEL.gguf [--host 127.0.0.1] [--port 8080] [-np SLOTS (1)] [-c CTX (the model's, at most 16384)]\n"
    "                  [-b BATCH (512)] [-t THREADS] [--gpu | -ngl N] [--api-key KEY | --api-key-file F] [--slot-save-path DIR]\n"
    "                  [--metrics] [--timeout S] [--chat-template NAME] [--alias NAME] [--queue N (4 x SLOTS)] [--no-warmup]\n"
    "                  [-ctk TYPE] [-ctv TYPE] (f16, f32, bf16, q8_0, q4_0)\n"
    "                  [--lookup [--lookup-ngram N (3)] | -md DRAFT.gguf [-ngld N]] [--draft-max N (16)] [--draft-min N (0)]\n"
    "       kiln serve --workbench [--data-dir DIR (./kiln-workbench)] [--examples-dir DIR (../shared/data/corpora)] [-m MODEL.gguf] ...\n";

#define DEFAULT_MAX_CTX 16384

/* The key of --api-key-file: its first line, without the newline. */
static char *read_key(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        kiln_cli_error("serve: --api-key-file %s: cannot open it", path);
        return NULL;
    }
    char buf[4096];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    buf[strcspn(buf, "\r\n")] = 0;
    if (!buf[0]) {
        kiln_cli_error("serve: --api-key-file %s: the first line is empty", path);
        return NULL;
    }
    return strdup(buf);
}

static void block_signals(sigset_t *sigs) {
    /* SIGINT and SIGTERM go to this thread alone (sigwait): every thread made from here on blocks them */
    sigemptyset(sigs);
    sigaddset(sigs, SIGINT);
    sigaddset(sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
}

/* kiln serve --workbench without -m: the workbench's routes, the model routes 503. Takes key. */
/* The bundled model (models/shakespeare.gguf), offered by the workbench as a model to generate from and a
 * vocabulary to compare with, when it is there. */
static void offer_bundled(wb *w) {
    char buf[4096];
    if (w && kiln_cli_default_model(buf, sizeof buf)) w->bundled = strdup(buf);
}

static int serve_workbench_only(const srv_opts *o, const char *host, int port, const char *data_dir, const char *examples_dir, char *key) {
    sigset_t sigs;
    block_signals(&sigs);
    wb *w = NULL;
    srv_server *srv = NULL;
    srv_http *http = NULL;
    int bound = 0;
    kiln_status s = wb_new(data_dir, examples_dir, &w);
    offer_bundled(w);
    if (!s) s = srv_server_new(NULL, NULL, o, &(srv_sched_params){0}, &srv);
    if (srv) srv->wb = w;
    if (!s) s = srv_http_start(srv, host, port, &bound, &http);
    if (s) {
        srv_server_free(srv), wb_free(w, 0), free(key);
        return kiln_cli_die(s);
    }
    fprintf(stderr, "kiln serve: workbench over %s (%zu jobs), no model\n", data_dir, w->n_jobs);
    fprintf(stderr, "kiln serve: listening on http://%s%s%s:%d\n", strchr(host, ':') ? "[" : "", host, strchr(host, ':') ? "]" : "", bound);
    int sig = 0;
    sigwait(&sigs, &sig);
    fprintf(stderr, "kiln serve: %s: draining the requests in flight\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    wb_close(w);
    srv_http_stop(http, o->timeout_s > 0 ? o->timeout_s : 600);
    srv_server_free(srv);
    wb_free(w, 30);
    free(key);
    fprintf(stderr, "kiln serve: stopped\n");
    return 0;
}

/* On the GPU each decode step of one token in each of T slots is recorded as a CUDA graph the first time a step of
 * that T runs, which costs a capture and an instantiation (several ms on a 7B) inside some request's inter-token
 * latency. This runs each such step once at startup instead, T = 1 .. the slots (a token at position 0 of sequences
 * 0 .. T - 1, with the logits the scheduler asks for), then empties the sequences. llama-server warms up too
 * (--no-warmup skips it). */
static kiln_status warmup(kiln_context *c, const kiln_model *m, int n_slots) {
    const int64_t V = kiln_model_n_vocab(m);
    const kiln_tokenizer *tok = kiln_model_tokenizer(m); /* without one srv_server_new refuses the model next */
    const int32_t bos = tok ? kiln_tokenizer_bos(tok) : -1;
    kiln_batch_entry *b = calloc((size_t)n_slots, sizeof *b);
    float *logits = malloc((size_t)n_slots * (size_t)V * sizeof *logits);
    kiln_status s = b && logits ? KILN_OK : kiln_fail(KILN_ERR_NOMEM, "serve: out of memory for the warm-up");
    for (int T = 1; !s && T <= n_slots && T <= kiln_context_n_batch(c); T++) {
        for (int i = 0; i < T; i++) b[i] = (kiln_batch_entry){.seq = i, .id = bos >= 0 ? bos : 0, .pos = 0, .logits = true};
        s = kiln_context_decode(c, b, (size_t)T, logits, NULL);
        for (int i = 0; i < T; i++) kiln_context_seq_keep(c, i, 0);
    }
    free(b), free(logits);
    return s;
}

/* -md: the draft model (*dm) and its context (*out): a sequence per slot of the target's positions and batch, on the
 * GPU when the target is (ngld layers there, -1: all). Its vocab must be the target's: drafts are the target's ids. */
static kiln_status draft_context(const char *path, const kiln_model *m, const kiln_context *c, const kiln_context_params *cp, int ngld,
                                 kiln_model **dm, kiln_context **out) {
    kiln_status s = kiln_model_load(path, dm);
    if (s) return s;
    if (kiln_model_n_vocab(*dm) != kiln_model_n_vocab(m))
        return kiln_fail(KILN_ERR_INVALID, "serve: -md %s: the draft model's vocab has %lld tokens, the model's %lld: they must share a tokenizer",
                         path, (long long)kiln_model_n_vocab(*dm), (long long)kiln_model_n_vocab(m));
    kiln_context_params dp = *cp;
    dp.s.n_gpu_layers = kiln_context_on_gpu(c) ? (ngld >= 0 ? ngld : INT32_MAX) : 0;
    dp.s.device = kiln_context_on_gpu(c) ? cp->s.device : (kiln_device){0};
    return kiln_context_new(*dm, &dp, out);
}

int kiln_cmd_serve(int argc, char **argv) {
    const char *model_path = NULL, *host = "127.0.0.1", *key_file = NULL;
    const char *data_dir = "kiln-workbench", *examples_dir = "../shared/data/corpora";
    bool workbench = false;
    srv_opts o = {0};
    int port = 8080, n_slots = 1, queue = 0;
    int64_t n_ctx = 0;
    bool gpu = false, no_warmup = false;
    kiln_session_params sp = {.n_batch = 512};
    srv_spec_params spec = {.lookup_ngram = 3, .draft_max = 16};
    int ngld = -1;
    kiln_cli_opt opts[48 + KILN_CLI_N_KV] = {
        {"-m", KILN_CLI_STR, &model_path, 0, 0},
        {"--model", KILN_CLI_STR, &model_path, 0, 0},
        {"--host", KILN_CLI_STR, &host, 0, 0},
        {"--port", KILN_CLI_INT, &port, 0, 65535},
        {"-np", KILN_CLI_INT, &n_slots, 1, 256},
        {"--parallel", KILN_CLI_INT, &n_slots, 1, 256},
        {"-c", KILN_CLI_I64, &n_ctx, 0, 1 << 24},
        {"--ctx-size", KILN_CLI_I64, &n_ctx, 0, 1 << 24},
        {"-b", KILN_CLI_I64, &sp.n_batch, 1, 1 << 16},
        {"--batch-size", KILN_CLI_I64, &sp.n_batch, 1, 1 << 16},
        {"-t", KILN_CLI_INT, &sp.n_threads, 0, 1024},
        {"--threads", KILN_CLI_INT, &sp.n_threads, 0, 1024},
        {"--gpu", KILN_CLI_FLAG, &gpu, 0, 0},
        {"-ngl", KILN_CLI_INT, &sp.n_gpu_layers, 0, INT32_MAX},
        {"--gpu-layers", KILN_CLI_INT, &sp.n_gpu_layers, 0, INT32_MAX},
        {"--n-gpu-layers", KILN_CLI_INT, &sp.n_gpu_layers, 0, INT32_MAX},
        {"--api-key", KILN_CLI_STR, &o.api_key, 0, 0},
        {"--api-key-file", KILN_CLI_STR, &key_file, 0, 0},
        {"--slot-save-path", KILN_CLI_STR, &o.slot_save_path, 0, 0},
        {"--metrics", KILN_CLI_FLAG, &o.metrics, 0, 0},
        {"--timeout", KILN_CLI_DOUBLE, &o.timeout_s, 0, 1e7},
        {"-to", KILN_CLI_DOUBLE, &o.timeout_s, 0, 1e7},
        {"--chat-template", KILN_CLI_STR, &o.chat_template, 0, 0},
        {"--alias", KILN_CLI_STR, &o.alias, 0, 0},
        {"-a", KILN_CLI_STR, &o.alias, 0, 0},
        {"--queue", KILN_CLI_INT, &queue, 0, 1 << 20},
        {"--workbench", KILN_CLI_FLAG, &workbench, 0, 0},
        {"--no-warmup", KILN_CLI_FLAG, &no_warmup, 0, 0},
        {"--data-dir", KILN_CLI_STR, &data_dir, 0, 0},
        {"--examples-dir", KILN_CLI_STR, &examples_dir, 0, 0},
        {"--lookup", KILN_CLI_FLAG, &spec.lookup, 0, 0},
        {"--lookup-ngram", KILN_CLI_INT, &spec.lookup_ngram, 1, 16},
        {"-md", KILN_CLI_STR, &o.draft_path, 0, 0},
        {"--model-draft", KILN_CLI_STR, &o.draft_path, 0, 0},
        {"-ngld", KILN_CLI_INT, &ngld, 0, INT32_MAX},
        {"--gpu-layers-draft", KILN_CLI_INT, &ngld, 0, INT32_MAX},
        {"--n-gpu-layers-draft", KILN_CLI_INT, &ngld, 0, INT32_MAX},
        {"--draft-max", KILN_CLI_INT, &spec.draft_max, 1, 256},
        {"--draft", KILN_CLI_INT, &spec.draft_max, 1, 256},
        {"--draft-min", KILN_CLI_INT, &spec.draft_min, 0, 256},
    }; /* then -ctk/-ctv */
    int n_opts = 0, n_pos = 0;
    while (opts[n_opts].name) n_opts++;
    n_opts += kiln_cli_kv_opts(opts + n_opts, &sp);
    if (!kiln_cli_parse_args("serve", argc, argv, opts, n_opts, NULL, 0, &n_pos)) {
        fputs(usage_line, stderr);
        return 1;
    }
    if (!model_path && !workbench) {
        fputs(usage_line, stderr);
        return kiln_cli_error("serve: -m MODEL.gguf is required (or --workbench)");
    }
    if (!data_dir[0]) return kiln_cli_error("serve: --data-dir is empty");
    if (o.api_key && key_file) return kiln_cli_error("serve: give --api-key or --api-key-file, not both");
    if (o.api_key && !o.api_key[0]) return kiln_cli_error("serve: --api-key is empty");
    char *key = NULL;
    if (key_file && !(o.api_key = key = read_key(key_file))) return 1;
    /* the workbench runs jobs that write files and burn hours of compute: beyond loopback, only for a key holder */
    bool loopback = strcmp(host, "127.0.0.1") == 0 || strcmp(host, "localhost") == 0 || strcmp(host, "::1") == 0 || strncmp(host, "127.", 4) == 0;
    if (workbench && !loopback && !o.api_key) {
        free(key);
        return kiln_cli_error("serve: --workbench on %s (beyond loopback) needs --api-key or --api-key-file", host);
    }
    struct stat sb;
    if (o.slot_save_path && (stat(o.slot_save_path, &sb) != 0 || !S_ISDIR(sb.st_mode))) {
        free(key);
        return kiln_cli_error("serve: --slot-save-path %s is not a folder", o.slot_save_path);
    }
    if (gpu) sp.n_gpu_layers = INT32_MAX;
    const char *spec_why = spec.lookup && o.draft_path ? "give --lookup or -md, not both"
                           : spec.draft_min > spec.draft_max ? "--draft-min is more than --draft-max"
                           : workbench && !model_path && (spec.lookup || o.draft_path) ? "--lookup and -md need -m" : NULL;
    if (spec_why) {
        free(key);
        return kiln_cli_error("serve: %s", spec_why);
    }

    if (!model_path) return serve_workbench_only(&o, host, port, data_dir, examples_dir, key);
    kiln_model *m;
    kiln_status s = kiln_model_load(model_path, &m);
    if (s) {
        free(key);
        return kiln_cli_die(s);
    }
    wb *w = NULL;
    if (workbench && (s = wb_new(data_dir, examples_dir, &w))) {
        kiln_model_free(m), free(key);
        return kiln_cli_die(s);
    }
    offer_bundled(w);
    if (!n_ctx) n_ctx = kiln_model_n_ctx_train(m) < DEFAULT_MAX_CTX ? kiln_model_n_ctx_train(m) : DEFAULT_MAX_CTX;
    if (n_ctx / n_slots < 8) {
        kiln_model_free(m), free(key);
        return kiln_cli_error("serve: -c %lld over %d slots leaves %lld positions a slot: give at least 8 each", (long long)n_ctx, n_slots,
                              (long long)(n_ctx / n_slots));
    }
    sp.n_ctx = n_ctx / n_slots;
    kiln_context_params cp = {.s = sp, .n_seq = n_slots};
    kiln_context *c = NULL;
    srv_server *srv = NULL;
    srv_http *http = NULL;
    int bound = 0;
    o.model_path = model_path;
    srv_sched_params schp = {.queue_max = queue};
    sigset_t sigs;
    block_signals(&sigs);
    kiln_model *dm = NULL;
    s = kiln_context_new(m, &cp, &c);
    if (!s && !no_warmup && kiln_context_on_gpu(c)) s = warmup(c, m, n_slots);
    if (!s && o.draft_path) s = draft_context(o.draft_path, m, c, &cp, ngld, &dm, &spec.draft);
    schp.spec = spec;
    if (s && c) kiln_context_free(c), c = NULL;
    if (!s) s = srv_server_new(m, c, &o, &schp, &srv);
    if (s && c && !srv) kiln_context_free(c), kiln_context_free(spec.draft);
    if (srv) srv->wb = w;
    if (!s) s = srv_http_start(srv, host, port, &bound, &http);
    if (s) {
        srv_server_free(srv);
        wb_free(w, 0);
        kiln_model_free(dm), kiln_model_free(m), free(key);
        return kiln_cli_die(s);
    }
    if (w) fprintf(stderr, "kiln serve: workbench over %s (%zu jobs)\n", data_dir, w->n_jobs);
    fprintf(stderr, "kiln serve: %d slot%s of %lld positions, batch %lld, %s, chat template %s\n", n_slots, n_slots == 1 ? "" : "s",
            (long long)sp.n_ctx, (long long)kiln_context_n_batch(c), kiln_context_on_gpu(c) ? "GPU" : "CPU",
            kiln_chat_family_name(srv->tmpl.family));
    if (spec.lookup || spec.draft)
        fprintf(stderr, "kiln serve: speculative decoding with %s, %d to %d drafts a step\n", spec.draft ? o.draft_path : "prompt lookup",
                spec.draft_min, spec.draft_max);
    fprintf(stderr, "kiln serve: listening on http://%s%s%s:%d\n", strchr(host, ':') ? "[" : "", host, strchr(host, ':') ? "]" : "", bound);
    int sig = 0;
    sigwait(&sigs, &sig);
    fprintf(stderr, "kiln serve: %s: draining the requests in flight\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    if (w) wb_close(w); /* event streams end, trains stop after their step */
    srv_http_stop(http, o.timeout_s > 0 ? o.timeout_s : 600);
    srv_server_free(srv);
    wb_free(w, 30);
    kiln_model_free(dm);
    kiln_model_free(m);
    free(key);
    fprintf(stderr, "kiln serve: stopped\n");
    return 0;
}
