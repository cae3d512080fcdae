/* bench_serve.c: `kiln bench serve`, an HTTP server under concurrent streaming load, as a client sees it.
 *
 *   kiln bench serve (--url URL | -m MODEL [-np N] [-t T] [--ctx-size C] [--gpu]) [-c 1,4,16] [-n 64] [-r R]
 *                    [--sample] [--peer-bin PATH/llama-server] [--api-key KEY]
 *
 * For each concurrency C of -c, C clients each stream R requests (-r, default 1) one after another: POST /completion
 * with one prompt of a fixed set (client i the (i mod 8)th), n_predict -n, temperature 0 (--sample: llama-server's
 * defaults temperature 0.8, top_k 40, top_p 0.95, min_p 0.05 with repeat_penalty 1.1 and seed i), ignore_eos (every
 * stream has exactly n tokens), cache_prompt false (no request reuses another's prefill), stream true, through libcurl's multi
 * interface on one thread. Before the cases one untimed request warms the server (page faults, first allocations).
 * Reported per engine and concurrency:
 *   tok_s    generated tokens of every stream (the final event's tokens_predicted) / the case's wall time
 *   ttft     time to first token: request sent -> first event with content, p50 and p99 over the streams (ms)
 *   itl      inter-token latency: the gaps between successive content events of a stream, p50 and p99 over all (ms)
 *   steps    from kiln's /metrics before and after the case (with -m; it starts kiln serve with --metrics): the
 *            batched decodes, their mean rows, the mean ms of one in the engine and of sampling and handing out
 *            its tokens, and how many carried prompt tokens
 * Percentiles are nearest-rank. With -m it starts `kiln serve` itself (this binary; --port 0, its port read from the
 * "listening on" line of its stderr); with --peer-bin it also starts llama-server on the same model, slots (-np),
 * threads (-t) and context, on a free loopback port, and runs the same cases against it in this command. Output: one
 * JSON object per case on stdout, then a table with kiln/peer ratios. The servers' stderr goes to temporary files,
 * named in the error when one does not come up. */
#include "bench/bench.h"
#include "tools/cli.h"

#include <curl/curl.h>
#include <jansson.h>

#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_CASES 16
#define MAX_CLIENTS 1024
#define START_SECONDS 180.0  /* a server's wait for /health: model load and repacking on a slow machine */

static const char *const prompts[8] = {
    "The capital of France is", "Once upon a time, in a small village by the sea,", "In computer science, a hash table is",
    "The three primary colors are", "Water boils at a temperature of", "def fibonacci(n):\n    \"\"\"Return the n-th",
    "The history of the Roman Empire begins", "Photosynthesis is the process by which",
};

/* One running server: what started it (pid 0 for --url) and where it listens. */
typedef struct {
    const char *engine;    /* "kiln" or "llama-server" */
    char url[128];
    pid_t pid;
    char log[64];          /* its stderr */
    bool keep_log;         /* it did not come up: the error names the log, which stays */
} server;

/* One streaming request in flight. t[0..n_t) are the arrival times of its content events. */
typedef struct {
    CURL *easy;
    struct curl_slist *hdr;
    int client, left;      /* the client's index; requests it has still to send after this one */
    double t0;             /* when it was sent */
    double *t;
    int n_t, cap_t;
    int64_t tokens;        /* the final event's tokens_predicted */
    bool stopped, failed;
    char *buf;             /* bytes of an event not yet ended by a newline */
    size_t n_buf, cap_buf;
    char body[512];
} stream;

/* A case's measurements. */
typedef struct {
    const char *engine;
    int clients;
    double tok_s, ttft50, ttft99, itl50, itl99, seconds;
    int64_t tokens;
    int errors;
    /* from kiln's /metrics around the case (-m only; NAN otherwise): batched decodes, their rows, the mean ms of a
     * decode in the engine and of handing out its tokens, the decodes that carried prompt tokens */
    double steps, rows, step_ms, emit_ms, mixed;
} result;

/* ---------------------------------------------------------------- servers */

static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t n = sizeof a;
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &n) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0) close(fd);
    return port;
}

/* Starts argv (argv[0] a path) with stderr and stdout into a new temporary file. */
static bool spawn(server *s, char **argv) {
    snprintf(s->log, sizeof s->log, "/tmp/kiln-bench-serve-XXXXXX");
    int fd = mkstemp(s->log);
    if (fd < 0) return false;
    s->pid = fork();
    if (s->pid == 0) {
        dup2(fd, 1), dup2(fd, 2);
        execv(argv[0], argv);
        _exit(127);
    }
    close(fd);
    return s->pid > 0;
}

static size_t discard(char *p, size_t sz, size_t n, void *u) { return sz * n; }

/* GET url/health answers 200. */
static bool healthy(const char *url) {
    char u[160];
    snprintf(u, sizeof u, "%s/health", url);
    CURL *e = curl_easy_init();
    long code = 0;
    if (!e) return false;
    curl_easy_setopt(e, CURLOPT_URL, u);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, discard);
    curl_easy_setopt(e, CURLOPT_TIMEOUT, 5L);
    if (curl_easy_perform(e) == CURLE_OK) curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &code);
    curl_easy_cleanup(e);
    return code == 200;
}

/* The port of kiln serve's "listening on http://127.0.0.1:PORT" line in its log, or 0 while there is none. */
static int logged_port(const char *log) {
    FILE *f = fopen(log, "r");
    char line[1024];
    int port = 0;
    while (f && !port && fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "listening on http://127.0.0.1:");
        if (p) port = atoi(p + strlen("listening on http://127.0.0.1:"));
    }
    if (f) fclose(f);
    return port;
}

/* Waits for the server to answer /health (kiln's port from its log first); false when it exits or time runs out. */
static bool wait_up(server *s, bool port_from_log) {
    for (double t0 = kiln_bench_now(); kiln_bench_now() - t0 < START_SECONDS; usleep(100 * 1000)) {
        int st;
        if (waitpid(s->pid, &st, WNOHANG) == s->pid) {
            s->pid = 0;
            return false;
        }
        if (port_from_log && !strchr(s->url + 7, ':')) {
            int port = logged_port(s->log);
            if (port) snprintf(s->url, sizeof s->url, "http://127.0.0.1:%d", port);
            continue;
        }
        if (healthy(s->url)) return true;
    }
    return false;
}

/* SIGTERM, then SIGKILL after 30 s; removes the log. */
static void stop(server *s) {
    if (s->pid > 0) {
        kill(s->pid, SIGTERM);
        int st;
        for (int i = 0; i < 300 && waitpid(s->pid, &st, WNOHANG) == 0; i++) usleep(100 * 1000);
        if (kill(s->pid, 0) == 0) kill(s->pid, SIGKILL), waitpid(s->pid, &st, 0);
        s->pid = 0;
    }
    if (s->log[0] && !s->keep_log) unlink(s->log), s->log[0] = 0;
}

typedef struct {
    const char *model, *peer_bin;
    int64_t np, threads, ctx;
    bool gpu;
} launch;

/* `kiln serve` from this binary: -m MODEL -np N -t T -c CTX --port 0 [--gpu]. */
static bool start_kiln(server *s, const launch *l) {
    char np[24], t[24], c[24], self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return false;
    self[n] = 0;
    snprintf(np, sizeof np, "%lld", (long long)l->np), snprintf(t, sizeof t, "%lld", (long long)l->threads);
    snprintf(c, sizeof c, "%lld", (long long)l->ctx);
    char *argv[] = {self, "serve", "-m", (char *)l->model, "-np", np, "-t", t, "-c", c, "--port", "0", "--metrics",
                    l->gpu ? "--gpu" : NULL, NULL};
    snprintf(s->url, sizeof s->url, "http://127.0.0.1");
    return spawn(s, argv) && wait_up(s, true);
}

/* llama-server on a free loopback port with the same model, slots, threads and context (-ngl 99 with --gpu). */
static bool start_peer(server *s, const launch *l) {
    char np[24], t[24], c[24], port[24];
    int p = free_port();
    if (p <= 0) return false;
    snprintf(np, sizeof np, "%lld", (long long)l->np), snprintf(t, sizeof t, "%lld", (long long)l->threads);
    snprintf(c, sizeof c, "%lld", (long long)l->ctx), snprintf(port, sizeof port, "%d", p);
    char *argv[] = {(char *)l->peer_bin, "-m", (char *)l->model, "-np", np, "-t", t, "-c", c, "--host", "127.0.0.1",
                    "--port", port, "-ngl", l->gpu ? "99" : "0", NULL};
    snprintf(s->url, sizeof s->url, "http://127.0.0.1:%d", p);
    return spawn(s, argv) && wait_up(s, false);
}

/* ---------------------------------------------------------------- the load */

static bool push_time(stream *st, double t) {
    if (st->n_t == st->cap_t) {
        int cap = st->cap_t ? 2 * st->cap_t : 128;
        double *p = realloc(st->t, (size_t)cap * sizeof *p);
        if (!p) return false;
        st->t = p, st->cap_t = cap;
    }
    st->t[st->n_t++] = t;
    return true;
}

/* One "data: {...}" line: a content event is a token's arrival; the stop event carries tokens_predicted. */
static void on_event(stream *st, const char *json, double now) {
    json_error_t e;
    json_t *o = json_loads(json, JSON_ALLOW_NUL, &e); /* a token may be the byte 0: "\u0000" */
    if (!o) {
        if (!st->failed) fprintf(stderr, "bench serve: client %d: an event that is not JSON (%s)\n", st->client, e.text);
        st->failed = true;
        return;
    }
    const char *content = json_string_value(json_object_get(o, "content"));
    if (content && *content && !push_time(st, now)) st->failed = true;
    if (json_is_true(json_object_get(o, "stop"))) {
        st->stopped = true;
        st->tokens = json_integer_value(json_object_get(o, "tokens_predicted"));
    }
    if (json_object_get(o, "error")) {
        if (!st->failed) fprintf(stderr, "bench serve: client %d: the server answered an error\n", st->client);
        st->failed = true;
    }
    json_decref(o);
}

static size_t on_data(char *p, size_t sz, size_t n, void *user) {
    stream *st = user;
    const size_t len = sz * n;
    const double now = kiln_bench_now();
    if (st->n_buf + len + 1 > st->cap_buf) {
        size_t cap = 2 * (st->n_buf + len + 1);
        char *b = realloc(st->buf, cap);
        if (!b) return 0; /* libcurl ends the transfer: counted as an error */
        st->buf = b, st->cap_buf = cap;
    }
    memcpy(st->buf + st->n_buf, p, len);
    st->n_buf += len;
    st->buf[st->n_buf] = 0;
    char *line = st->buf, *nl;
    while ((nl = strchr(line, '\n'))) {
        *nl = 0;
        if (strncmp(line, "data: ", 6) == 0 && strcmp(line + 6, "[DONE]") != 0) on_event(st, line + 6, now);
        else if (line[0] == '{') on_event(st, line, now); /* a JSON error body */
        line = nl + 1;
    }
    st->n_buf -= (size_t)(line - st->buf);
    memmove(st->buf, line, st->n_buf);
    return len;
}

/* (Re)arms st for its client's next request and adds it to m. */
static bool send_one(CURLM *m, stream *st, const char *url, int64_t n_predict, bool sample) {
    char u[160];
    snprintf(u, sizeof u, "%s/completion", url);
    json_t *o = json_pack("{s:s, s:I, s:f, s:b, s:b, s:b}", "prompt", prompts[st->client % 8], "n_predict", (json_int_t)n_predict,
                          "temperature", sample ? 0.8 : 0.0, "ignore_eos", 1, "cache_prompt", 0, "stream", 1);
    if (o && sample && (json_object_set_new(o, "top_k", json_integer(40)) || json_object_set_new(o, "top_p", json_real(0.95)) ||
                        json_object_set_new(o, "min_p", json_real(0.05)) || json_object_set_new(o, "repeat_penalty", json_real(1.1)) ||
                        json_object_set_new(o, "seed", json_integer(st->client))))
        json_decref(o), o = NULL;
    char *b = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!b || strlen(b) >= sizeof st->body) return free(b), false;
    strcpy(st->body, b);
    free(b);
    if (!st->easy && !(st->easy = curl_easy_init())) return false;
    curl_easy_setopt(st->easy, CURLOPT_URL, u);
    curl_easy_setopt(st->easy, CURLOPT_POSTFIELDS, st->body);
    curl_easy_setopt(st->easy, CURLOPT_HTTPHEADER, st->hdr);
    curl_easy_setopt(st->easy, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(st->easy, CURLOPT_WRITEDATA, st);
    curl_easy_setopt(st->easy, CURLOPT_PRIVATE, st);
    curl_easy_setopt(st->easy, CURLOPT_TIMEOUT, 600L);
    curl_easy_setopt(st->easy, CURLOPT_TCP_NODELAY, 1L);
    st->n_buf = 0, st->stopped = false;
    st->t0 = kiln_bench_now();
    return curl_multi_add_handle(m, st->easy) == CURLM_OK;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The nearest-rank q-th percentile (0 < q <= 1) of v[0..n), sorted in place; NAN when n is 0. */
static double percentile(double *v, size_t n, double q) {
    if (n == 0) return NAN;
    qsort(v, n, sizeof *v, cmp_double);
    size_t k = (size_t)ceil(q * (double)n);
    return v[(k ? k : 1) - 1];
}

/* kiln's step counters from GET url/metrics into v: n_decode_total, kiln:step_rows_total,
 * kiln:step_decode_seconds_total, kiln:step_emit_seconds_total, kiln:steps_mixed_total. False without them. */
typedef struct {
    char *b;
    size_t n;
} body_buf;

static size_t keep(char *p, size_t sz, size_t n, void *u) {
    body_buf *bb = u;
    if (bb->n + sz * n >= 65536) return 0;
    char *nb = realloc(bb->b, bb->n + sz * n + 1);
    if (!nb) return 0;
    memcpy(nb + bb->n, p, sz * n);
    bb->b = nb, bb->n += sz * n, bb->b[bb->n] = 0;
    return sz * n;
}

static bool scrape(const char *url, double v[5]) {
    static const char *const names[5] = {"llamacpp:n_decode_total ", "kiln:step_rows_total ", "kiln:step_decode_seconds_total ",
                                         "kiln:step_emit_seconds_total ", "kiln:steps_mixed_total "};
    char u[160];
    snprintf(u, sizeof u, "%s/metrics", url);
    body_buf bb = {0};
    CURL *e = curl_easy_init();
    long code = 0;
    bool ok = e && curl_easy_setopt(e, CURLOPT_URL, u) == CURLE_OK && curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, keep) == CURLE_OK &&
              curl_easy_setopt(e, CURLOPT_WRITEDATA, &bb) == CURLE_OK && curl_easy_setopt(e, CURLOPT_TIMEOUT, 10L) == CURLE_OK &&
              curl_easy_perform(e) == CURLE_OK && curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &code) == CURLE_OK && code == 200 && bb.b;
    for (int i = 0; ok && i < 5; i++) {
        const char *p = strstr(bb.b, names[i]);
        while (p && p != bb.b && p[-1] != '\n') p = strstr(p + 1, names[i]); /* the sample line, not a # HELP */
        ok = p != NULL;
        if (ok) v[i] = strtod(p + strlen(names[i]), NULL);
    }
    if (e) curl_easy_cleanup(e);
    free(bb.b);
    return ok;
}

/* One case: clients streams of reps requests each against url. */
static int run_case(const char *url, const char *api_key, int clients, int64_t reps, int64_t n_predict, bool sample, result *r) {
    CURLM *m = curl_multi_init();
    stream *ss = calloc((size_t)clients, sizeof *ss);
    const size_t max_itl = (size_t)clients * (size_t)reps * (size_t)(n_predict + 1);
    double *ttft = malloc((size_t)(clients * reps) * sizeof *ttft), *itl = malloc(max_itl * sizeof *itl);
    size_t n_ttft = 0, n_itl = 0;
    char auth[300];
    int rc = 0, running = 0;
    memset(r, 0, sizeof *r);
    if (!m || !ss || !ttft || !itl) rc = kiln_cli_error("bench serve: out of memory");
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", api_key ? api_key : "");
    const double t0 = kiln_bench_now();
    for (int i = 0; !rc && i < clients; i++) {
        ss[i].client = i, ss[i].left = (int)reps - 1;
        ss[i].hdr = curl_slist_append(NULL, "Content-Type: application/json");
        if (api_key) ss[i].hdr = curl_slist_append(ss[i].hdr, auth);
        if (!ss[i].hdr || !send_one(m, &ss[i], url, n_predict, sample)) rc = kiln_cli_error("bench serve: cannot start a request");
        else running++;
    }
    while (!rc && running > 0) {
        int still;
        curl_multi_perform(m, &still);
        CURLMsg *msg;
        int q;
        while ((msg = curl_multi_info_read(m, &q))) {
            if (msg->msg != CURLMSG_DONE) continue;
            stream *st;
            long code = 0;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&st);
            curl_easy_getinfo(msg->easy_handle, CURLINFO_RESPONSE_CODE, &code);
            curl_multi_remove_handle(m, msg->easy_handle);
            if (msg->data.result != CURLE_OK || code != 200 || st->failed || !st->stopped) {
                if (!st->failed)
                    fprintf(stderr, "bench serve: client %d: %s, HTTP %ld%s\n", st->client, curl_easy_strerror(msg->data.result), code,
                            st->stopped ? "" : ", the stream ended without its stop event");
                r->errors++;
            }
            else {
                r->tokens += st->tokens;
                if (st->n_t > 0) ttft[n_ttft++] = st->t[0] - st->t0;
                for (int k = 1; k < st->n_t && n_itl < max_itl; k++) itl[n_itl++] = st->t[k] - st->t[k - 1];
            }
            st->n_t = 0, st->failed = false;
            if (st->left-- > 0 && send_one(m, st, url, n_predict, sample)) continue;
            running--;
        }
        if (running > 0) curl_multi_poll(m, NULL, 0, 100, NULL);
    }
    r->seconds = kiln_bench_now() - t0;
    r->clients = clients;
    r->tok_s = r->seconds > 0 ? (double)r->tokens / r->seconds : NAN;
    r->ttft50 = 1e3 * percentile(ttft, n_ttft, 0.50), r->ttft99 = 1e3 * percentile(ttft, n_ttft, 0.99);
    r->itl50 = 1e3 * percentile(itl, n_itl, 0.50), r->itl99 = 1e3 * percentile(itl, n_itl, 0.99);
    for (int i = 0; ss && i < clients; i++) {
        if (ss[i].easy) curl_easy_cleanup(ss[i].easy);
        curl_slist_free_all(ss[i].hdr);
        free(ss[i].t), free(ss[i].buf);
    }
    free(ss), free(ttft), free(itl);
    if (m) curl_multi_cleanup(m);
    return rc;
}

static void print_json(const result *r, const char *model, int64_t np, int64_t n_predict, int64_t reps, bool sample) {
    char b[11][32];
    printf("{\"bench\": \"serve\", \"engine\": ");
    kiln_bench_json_str(r->engine);
    printf(", \"model\": ");
    kiln_bench_json_str(model);
    printf(", \"sampling\": \"%s\"", sample ? "sampled" : "greedy");
    printf(", \"slots\": %lld, \"clients\": %d, \"n_predict\": %lld, \"requests\": %lld, \"tokens\": %lld, \"errors\": %d, "
           "\"seconds\": %s, \"tok_s\": %s, \"ttft_p50_ms\": %s, \"ttft_p99_ms\": %s, \"itl_p50_ms\": %s, \"itl_p99_ms\": %s, "
           "\"steps\": %s, \"rows_per_step\": %s, \"step_decode_ms\": %s, \"step_emit_ms\": %s, \"steps_mixed\": %s}\n",
           (long long)np, r->clients, (long long)n_predict, (long long)(r->clients * reps), (long long)r->tokens, r->errors,
           kiln_bench_json_num(b[0], 32, r->seconds, 3), kiln_bench_json_num(b[1], 32, r->tok_s, 1),
           kiln_bench_json_num(b[2], 32, r->ttft50, 1), kiln_bench_json_num(b[3], 32, r->ttft99, 1),
           kiln_bench_json_num(b[4], 32, r->itl50, 2), kiln_bench_json_num(b[5], 32, r->itl99, 2),
           kiln_bench_json_num(b[6], 32, r->steps, 0), kiln_bench_json_num(b[7], 32, r->rows, 2),
           kiln_bench_json_num(b[8], 32, r->step_ms, 3), kiln_bench_json_num(b[9], 32, r->emit_ms, 3),
           kiln_bench_json_num(b[10], 32, r->mixed, 0));
    fflush(stdout);
}

/* The cases of one engine into res[0..n_cases); the warm-up request first. */
static int run_engine(const char *engine, const char *url, const char *api_key, const int64_t *cs, int n_cases, int64_t reps,
                      int64_t n_predict, bool sample, const char *model, int64_t np, result *res) {
    result warm;
    int rc = run_case(url, api_key, 1, 1, 4, sample, &warm);
    if (!rc && warm.errors) rc = kiln_cli_error("bench serve: %s at %s: the warm-up request failed", engine, url);
    for (int i = 0; !rc && i < n_cases; i++) {
        double m0[5], m1[5];
        const bool own = strcmp(engine, "kiln") == 0 && scrape(url, m0);
        rc = run_case(url, api_key, (int)cs[i], reps, n_predict, sample, &res[i]);
        res[i].engine = engine;
        res[i].steps = res[i].rows = res[i].step_ms = res[i].emit_ms = res[i].mixed = NAN;
        if (!rc && own && scrape(url, m1) && m1[0] > m0[0]) {
            const double n = m1[0] - m0[0];
            res[i].steps = n, res[i].rows = (m1[1] - m0[1]) / n, res[i].step_ms = 1e3 * (m1[2] - m0[2]) / n;
            res[i].emit_ms = 1e3 * (m1[3] - m0[3]) / n, res[i].mixed = m1[4] - m0[4];
        }
        if (!rc) print_json(&res[i], model, np, n_predict, reps, sample);
    }
    return rc;
}

static void print_table(const result *k, const result *p, int n_cases) {
    printf("\n%8s %10s %10s %6s %18s %18s %16s %16s %6s\n", "clients", "kiln tok/s", "peer tok/s", "ratio", "kiln ttft p50/p99",
           "peer ttft p50/p99", "kiln itl p50/p99", "peer itl p50/p99", "errors");
    for (int i = 0; i < n_cases; i++) {
        char kt[40], pt[40], ki[40], pi[40], pr[16] = "-", ptok[16] = "-";
        snprintf(kt, sizeof kt, "%.1f/%.1f ms", k[i].ttft50, k[i].ttft99);
        snprintf(ki, sizeof ki, "%.2f/%.2f ms", k[i].itl50, k[i].itl99);
        snprintf(pt, sizeof pt, "-"), snprintf(pi, sizeof pi, "-");
        if (p) {
            snprintf(pt, sizeof pt, "%.1f/%.1f ms", p[i].ttft50, p[i].ttft99);
            snprintf(pi, sizeof pi, "%.2f/%.2f ms", p[i].itl50, p[i].itl99);
            snprintf(ptok, sizeof ptok, "%.1f", p[i].tok_s);
            snprintf(pr, sizeof pr, "%.2fx", k[i].tok_s / p[i].tok_s);
        }
        printf("%8d %10.1f %10s %6s %18s %18s %16s %16s %3d/%-3d\n", k[i].clients, k[i].tok_s, ptok, pr, kt, pt, ki, pi,
               k[i].errors, p ? p[i].errors : 0);
    }
    bool any = false;
    for (int i = 0; i < n_cases; i++) any = any || !isnan(k[i].steps);
    if (!any) return;
    printf("\nkiln's steps (its /metrics around each case): decodes, mean rows, mean ms in the engine and handing out tokens\n");
    printf("%8s %8s %10s %14s %12s %12s\n", "clients", "steps", "rows/step", "engine ms", "emit ms", "with prompts");
    for (int i = 0; i < n_cases; i++)
        printf("%8d %8.0f %10.2f %14.3f %12.3f %12.0f\n", k[i].clients, k[i].steps, k[i].rows, k[i].step_ms, k[i].emit_ms, k[i].mixed);
}

int kiln_bench_serve(int argc, char **argv) {
    const char *url = NULL, *clients = "1,4", *api_key = NULL;
    launch l = {.np = 0, .threads = 0, .ctx = 0};
    int64_t n_predict = 64, reps = 1;
    bool sample = false;
    kiln_cli_opt opts[] = {
        {"--url", KILN_CLI_STR, &url, 0, 0},          {"-m", KILN_CLI_STR, &l.model, 0, 0},
        {"--model", KILN_CLI_STR, &l.model, 0, 0},    {"-np", KILN_CLI_I64, &l.np, 1, 4096},
        {"--parallel", KILN_CLI_I64, &l.np, 1, 4096}, {"-t", KILN_CLI_I64, &l.threads, 1, 4096},
        {"--threads", KILN_CLI_I64, &l.threads, 1, 4096}, {"--ctx-size", KILN_CLI_I64, &l.ctx, 16, 1 << 24},
        {"-c", KILN_CLI_STR, &clients, 0, 0},         {"--clients", KILN_CLI_STR, &clients, 0, 0},
        {"-n", KILN_CLI_I64, &n_predict, 1, 1 << 20}, {"--n-predict", KILN_CLI_I64, &n_predict, 1, 1 << 20},
        {"-r", KILN_CLI_I64, &reps, 1, 1000},         {"--peer-bin", KILN_CLI_STR, &l.peer_bin, 0, 0},
        {"--api-key", KILN_CLI_STR, &api_key, 0, 0},  {"--gpu", KILN_CLI_FLAG, &l.gpu, 0, 0},
        {"--sample", KILN_CLI_FLAG, &sample, 0, 0},
    };
    int n_pos;
    if (!kiln_cli_parse_args("bench serve", argc, argv, opts, (int)(sizeof opts / sizeof *opts), NULL, 0, &n_pos)) return 1;
    if (!url == !l.model) return kiln_cli_error("bench serve: give --url URL (a running server) or -m MODEL (to start kiln serve)");
    if (url && l.peer_bin) return kiln_cli_error("bench serve: --peer-bin needs -m MODEL (both servers are started on it)");
    if (url && strlen(url) > 100) return kiln_cli_error("bench serve: --url is longer than 100 bytes");
    int64_t cs[MAX_CASES];
    int n_cases;
    if (kiln_bench_parse_list("bench serve", "-c", clients, 1, MAX_CLIENTS, cs, MAX_CASES, &n_cases)) return 1;
    int64_t most = 0;
    for (int i = 0; i < n_cases; i++) most = cs[i] > most ? cs[i] : most;
    if (!l.np) l.np = most;
    if (!l.threads) l.threads = sysconf(_SC_NPROCESSORS_ONLN) > 0 ? sysconf(_SC_NPROCESSORS_ONLN) : 1;
    if (!l.ctx) l.ctx = l.np * 512; /* each slot gets 512: a prompt and up to ~480 tokens */
    if (n_predict + 32 > l.ctx / l.np) return kiln_cli_error("bench serve: -n %lld does not fit a slot's context (%lld)", (long long)n_predict,
                                                             (long long)(l.ctx / l.np));
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) return kiln_cli_error("bench serve: libcurl did not initialize");
    signal(SIGPIPE, SIG_IGN);
    result k[MAX_CASES], p[MAX_CASES];
    server ks = {.engine = "kiln"}, ps = {.engine = "llama-server"};
    int rc = 0;
    if (url) snprintf(ks.url, sizeof ks.url, "%s", url);
    else if (!start_kiln(&ks, &l))
        rc = kiln_cli_error("bench serve: kiln serve -m %s did not come up (its log: %s)", l.model, ks.log), ks.keep_log = true;
    const char *model = l.model ? kiln_bench_base_name(l.model) : url;
    if (!rc) rc = run_engine("kiln", ks.url, api_key, cs, n_cases, reps, n_predict, sample, model, l.np, k);
    stop(&ks);
    if (!rc && l.peer_bin) {
        if (!start_peer(&ps, &l))
            rc = kiln_cli_error("bench serve: %s did not come up (its log: %s)", l.peer_bin, ps.log), ps.keep_log = true;
        if (!rc) rc = run_engine("llama-server", ps.url, NULL, cs, n_cases, reps, n_predict, sample, model, l.np, p);
        stop(&ps);
    }
    if (!rc) print_table(k, l.peer_bin ? p : NULL, n_cases);
    curl_global_cleanup();
    return rc;
}
