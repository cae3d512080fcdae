/* http.c: the request handler (routing, auth, limits, errors) and its libmicrohttpd front. srv_handle is a pure
 * function of the request (method, path, headers, query, body) to the response (status, headers, body or a stream),
 * what tests and the fuzzer call; srv_http_* serve it with MHD's thread per connection, bodies gathered up to
 * the limit, streams through MHD_create_response_from_callback, and a client that goes away cancelling its job. */
#include "serve/serve.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

/* ---------------------------------------------------------------- routing */

typedef void (*route_fn)(srv_server *, const srv_request *, srv_response *);
static const struct {
    const char *method, *path;
    route_fn fn;
    bool open;   /* no API key needed (llama-server's public endpoints) */
    bool prefix; /* path + "{id}" */
    bool model;  /* needs the model: 503 on a server without one (the workbench's) */
} ROUTES[] = {
    {"GET", "/health", srv_route_health, true, false, false},
    {"GET", "/v1/health", srv_route_health, true, false, false},
    {"POST", "/v1/chat/completions", srv_route_oai_chat, false, false, true},
    {"POST", "/chat/completions", srv_route_oai_chat, false, false, true},
    {"POST", "/v1/completions", srv_route_oai_completions, false, false, true},
    {"POST", "/completions", srv_route_oai_completions, false, false, true},
    {"GET", "/v1/models", srv_route_oai_models, false, false, true},
    {"GET", "/models", srv_route_oai_models, false, false, true},
    {"POST", "/completion", srv_route_completion, false, false, true},
    {"POST", "/tokenize", srv_route_tokenize, false, false, true},
    {"POST", "/detokenize", srv_route_detokenize, false, false, true},
    {"POST", "/apply-template", srv_route_apply_template, false, false, true},
    {"GET", "/props", srv_route_props, false, false, true},
    {"GET", "/slots", srv_route_slots, false, false, true},
    {"POST", "/slots/", srv_route_slot_action, false, true, true},
    {"GET", "/metrics", srv_route_metrics, false, false, true},
    {"POST", "/api/generate", srv_route_ollama_generate, false, false, true},
    {"POST", "/api/chat", srv_route_ollama_chat, false, false, true},
    {"GET", "/api/tags", srv_route_ollama_tags, false, false, true},
    {"POST", "/wb/corpora", srv_route_wb_corpora_post, false, false, false},
    {"GET", "/wb/corpora", srv_route_wb_corpora_get, false, false, false},
    {"POST", "/wb/jobs", srv_route_wb_jobs_post, false, false, false},
    {"GET", "/wb/jobs", srv_route_wb_jobs_get, false, false, false},
    {"GET", "/wb/jobs/", srv_route_wb_job_get, false, true, false},
    {"POST", "/wb/jobs/", srv_route_wb_job_post, false, true, false},
    {"GET", "/wb/runs", srv_route_wb_runs_get, false, false, false},
    {"GET", "/wb/info", srv_route_wb_info, false, false, false},
    {"GET", "/wb/tokenizers", srv_route_wb_tokenizers, false, false, false},
    {"GET", "/wb/tokenizer", srv_route_wb_tokenizer, false, false, false},
    {"POST", "/wb/tokenize", srv_route_wb_tokenize, false, false, false},
    {"POST", "/wb/compare", srv_route_wb_compare, false, false, false},
    {"GET", "/wb/models", srv_route_wb_models, false, false, false},
    {"POST", "/wb/generate", srv_route_wb_generate, false, false, false},
    {"GET", "/", srv_route_wb_static, true, false, false},
    {"GET", "/index.html", srv_route_wb_static, true, false, false},
    {"GET", "/wb/ui/", srv_route_wb_static, true, true, false},
};

static const char *header(const srv_request *rq, const char *name) {
    for (size_t i = 0; i < rq->n_headers; i++)
        if (strcasecmp(rq->headers[i].key, name) == 0) return rq->headers[i].value;
    return NULL;
}

/* Equal strings, in time that depends on the lengths only. */
static bool same_secret(const char *a, const char *b) {
    size_t na = strlen(a), nb = strlen(b), n = na > nb ? na : nb;
    unsigned char d = na != nb;
    for (size_t i = 0; i < n; i++) d |= (unsigned char)(i < na ? a[i] : 0) ^ (unsigned char)(i < nb ? b[i] : 0);
    return d == 0;
}

static bool authorized(const srv_server *s, const srv_request *rq) {
    if (!s->o.api_key) return true;
    const char *h = header(rq, "Authorization"), *key = NULL;
    if (h && strncasecmp(h, "Bearer ", 7) == 0) key = h + 7;
    if (!key) key = header(rq, "X-Api-Key");
    return key && same_secret(key, s->o.api_key);
}

void srv_handle(srv_server *s, const srv_request *rq, srv_response *rs) {
    memset(rs, 0, sizeof *rs);
    bool path_known = false;
    for (size_t i = 0; i < sizeof ROUTES / sizeof *ROUTES; i++) {
        size_t n = strlen(ROUTES[i].path);
        bool match = ROUTES[i].prefix ? strncmp(rq->path, ROUTES[i].path, n) == 0 && rq->path[n] : strcmp(rq->path, ROUTES[i].path) == 0;
        if (!match) continue;
        path_known = true;
        if (strcmp(rq->method, ROUTES[i].method)) continue;
        if (!ROUTES[i].open && !authorized(s, rq)) {
            srv_error(rs, 401, NULL, "invalid API key: send Authorization: Bearer KEY");
            return;
        }
        if (rq->n_body > s->o.max_body) {
            srv_error(rs, 413, NULL, "the body has %zu bytes, more than the limit of %zu", rq->n_body, s->o.max_body);
            return;
        }
        if (ROUTES[i].model && !s->m) {
            srv_error(rs, 503, NULL, "no model loaded: the workbench's jobs still work (start kiln serve with -m MODEL.gguf for %s)", ROUTES[i].path);
            return;
        }
        ROUTES[i].fn(s, rq, rs);
        return;
    }
    if (path_known) srv_error(rs, 405, NULL, "method %s is not allowed on this route", rq->method);
    else srv_error(rs, 404, NULL, "no route %s", rq->path);
}

/* ---------------------------------------------------------------- the MHD front */

struct srv_http {
    srv_server *srv;
    struct MHD_Daemon *d;
    pthread_mutex_t mu;
    int active; /* requests in flight */
};

/* One request's state across the access handler's calls. */
typedef struct conn_ctx {
    srv_http *h;
    struct MHD_Connection *conn;
    char *body;
    size_t n, cap;
    bool too_big;
    double t0;
    srv_kv *kv; /* headers then args, collected at the end */
    size_t n_kv, cap_kv, n_headers;
} conn_ctx;

/* A log line's text: printable ASCII as is, anything else as \xNN (what came from the network). */
static void put_escaped(FILE *f, const char *s, size_t max) {
    for (size_t i = 0; s[i] && i < max; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c < 0x7f && c != '\\') fputc(c, f);
        else fprintf(f, "\\x%02x", c);
    }
}

/* Whether the client of conn is still there: its socket has not hung up. */
static bool conn_alive(void *ud) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(ud, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return false;
    struct pollfd p = {.fd = ci->connect_fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) == 0 || !(p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

static enum MHD_Result collect(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    conn_ctx *c = cls;
    if (c->n_kv == c->cap_kv) {
        size_t cap = c->cap_kv ? 2 * c->cap_kv : 32;
        if (cap > 1024) return MHD_NO; /* enough headers and arguments for anyone */
        srv_kv *p = realloc(c->kv, cap * sizeof *p);
        if (!p) return MHD_NO;
        c->kv = p, c->cap_kv = cap;
    }
    c->kv[c->n_kv++] = (srv_kv){key, value ? value : ""};
    return MHD_YES;
}

/* A streamed body's reader: the stream and the connection it goes to (valid while MHD calls the reader). */
typedef struct {
    srv_stream *st; /* a job's stream, or NULL for a route's own reader: */
    long (*read)(void *ud, char *buf, size_t cap, bool (*alive)(void *), void *alive_ud);
    void (*read_free)(void *ud);
    void *read_ud;
    struct MHD_Connection *conn;
} reader;

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    reader *r = cls;
    long k = r->st ? srv_stream_read(r->st, buf, max, conn_alive, r->conn) : r->read(r->read_ud, buf, max, conn_alive, r->conn);
    return k > 0 ? (ssize_t)k : k == 0 ? MHD_CONTENT_READER_END_OF_STREAM : MHD_CONTENT_READER_END_WITH_ERROR;
}

static void stream_free(void *cls) { /* the response is done, sent or not: a job still running is cancelled */
    reader *r = cls;
    srv_stream_free(r->st);
    if (r->read_free) r->read_free(r->read_ud);
    free(r);
}

static enum MHD_Result send_response(conn_ctx *c, srv_response *rs, const char *method, const char *url) {
    struct MHD_Response *r;
    if (rs->stream) {
        reader *rd = malloc(sizeof *rd);
        r = rd ? MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_reader, rd, stream_free) : NULL;
        if (r) *rd = (reader){.st = rs->stream, .conn = c->conn}, rs->stream = NULL; /* now MHD's, freed through stream_free */
        else free(rd);
    } else if (rs->read) {
        reader *rd = malloc(sizeof *rd);
        r = rd ? MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_reader, rd, stream_free) : NULL;
        if (r) *rd = (reader){.read = rs->read, .read_free = rs->read_free, .read_ud = rs->read_ud, .conn = c->conn}, rs->read_free = NULL;
        else free(rd);
    } else {
        r = MHD_create_response_from_buffer(rs->n_body, rs->body, MHD_RESPMEM_MUST_COPY);
    }
    if (!r) {
        srv_response_free(rs);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", rs->content_type ? rs->content_type : "application/json");
    if (rs->no_cache || (rs->status == 200 && strstr(rs->content_type ? rs->content_type : "", "event-stream")))
        MHD_add_response_header(r, "Cache-Control", "no-cache");
    if (rs->retry_after) {
        char b[16];
        snprintf(b, sizeof b, "%d", rs->retry_after);
        MHD_add_response_header(r, "Retry-After", b);
    }
    if (rs->status == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    enum MHD_Result ok = MHD_queue_response(c->conn, (unsigned)rs->status, r);
    MHD_destroy_response(r);
    fputs("kiln serve: ", stderr);
    put_escaped(stderr, method, 16);
    fputc(' ', stderr);
    put_escaped(stderr, url, 200);
    fprintf(stderr, " %d %.1f ms\n", rs->status, 1e3 * (srv_now() - c->t0)); /* a stream's: when it began */
    srv_response_free(rs);
    return ok;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size, void **con_cls) {
    srv_http *h = cls;
    conn_ctx *c = *con_cls;
    if (!c) { /* the headers are in: start, and refuse a declared body over the limit before reading it */
        if (!(c = calloc(1, sizeof *c))) return MHD_NO;
        c->h = h, c->conn = conn, c->t0 = srv_now();
        *con_cls = c;
        pthread_mutex_lock(&h->mu);
        h->active++;
        pthread_mutex_unlock(&h->mu);
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > h->srv->o.max_body) {
            srv_response rs = {0};
            srv_error(&rs, 413, NULL, "the body has %s bytes, more than the limit of %zu", cl, h->srv->o.max_body);
            c->too_big = true;
            return send_response(c, &rs, method, url);
        }
        return MHD_YES;
    }
    if (*upload_data_size) { /* a part of the body */
        size_t k = *upload_data_size;
        *upload_data_size = 0;
        if (c->too_big || c->n + k > h->srv->o.max_body) {
            c->too_big = true;
            return MHD_YES; /* the rest is read and dropped; the answer is 413 */
        }
        if (c->n + k + 1 > c->cap) {
            size_t cap = c->cap ? c->cap : 4096;
            while (cap < c->n + k + 1) cap *= 2;
            char *p = realloc(c->body, cap);
            if (!p) return MHD_NO;
            c->body = p, c->cap = cap;
        }
        memcpy(c->body + c->n, upload_data, k);
        c->n += k;
        return MHD_YES;
    }
    srv_response rs = {0};
    if (c->too_big) {
        srv_error(&rs, 413, NULL, "the body is larger than the limit of %zu bytes", h->srv->o.max_body);
        return send_response(c, &rs, method, url);
    }
    MHD_get_connection_values(conn, MHD_HEADER_KIND, collect, c);
    c->n_headers = c->n_kv;
    MHD_get_connection_values(conn, MHD_GET_ARGUMENT_KIND, collect, c);
    srv_request rq = {.method = method, .path = url, .headers = c->kv, .n_headers = c->n_headers, .args = c->kv + c->n_headers,
                      .n_args = c->n_kv - c->n_headers, .body = c->body, .n_body = c->n, .alive = conn_alive, .alive_ud = conn};
    srv_handle(h->srv, &rq, &rs);
    return send_response(c, &rs, method, url);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe) {
    srv_http *h = cls;
    conn_ctx *c = *con_cls;
    if (!c) return;
    free(c->body);
    free(c->kv);
    free(c);
    *con_cls = NULL;
    pthread_mutex_lock(&h->mu);
    h->active--;
    pthread_mutex_unlock(&h->mu);
}

kiln_status srv_http_start(srv_server *s, const char *host, int port, int *bound_port, srv_http **out) {
    *out = NULL;
    struct sockaddr_storage ss = {0};
    bool v6 = strchr(host, ':') != NULL;
    if (v6) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
        a->sin6_family = AF_INET6, a->sin6_port = htons((uint16_t)port);
        if (inet_pton(AF_INET6, host, &a->sin6_addr) != 1) return kiln_fail(KILN_ERR_INVALID, "serve: --host '%s' is not an IP address", host);
    } else {
        struct sockaddr_in *a = (struct sockaddr_in *)&ss;
        a->sin_family = AF_INET, a->sin_port = htons((uint16_t)port);
        if (strcmp(host, "localhost") == 0) host = "127.0.0.1";
        if (inet_pton(AF_INET, host, &a->sin_addr) != 1) return kiln_fail(KILN_ERR_INVALID, "serve: --host '%s' is not an IP address", host);
    }
    srv_http *h = calloc(1, sizeof *h);
    if (!h) return KILN_ERR_NOMEM;
    h->srv = s;
    pthread_mutex_init(&h->mu, NULL);
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_ITC | (v6 ? MHD_USE_IPv6 : 0);
    h->d = MHD_start_daemon(flags, (uint16_t)port, NULL, NULL, on_request, h, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, h, MHD_OPTION_CONNECTION_LIMIT, (unsigned)256,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)600, MHD_OPTION_END);
    if (!h->d) {
        pthread_mutex_destroy(&h->mu);
        free(h);
        return kiln_fail(KILN_ERR_IO, "serve: cannot listen on %s port %d (in use, or not this machine's address)", host, port);
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    *bound_port = di ? (int)di->port : port;
    *out = h;
    return KILN_OK;
}

void srv_http_stop(srv_http *h, double drain_s) {
    if (!h) return;
    MHD_socket fd = MHD_quiesce_daemon(h->d); /* no new connections */
    if (fd != MHD_INVALID_SOCKET) close(fd);
    double t0 = srv_now();
    for (;;) {
        pthread_mutex_lock(&h->mu);
        int n = h->active;
        pthread_mutex_unlock(&h->mu);
        if (n == 0 || srv_now() - t0 > drain_s) break;
        usleep(20 * 1000);
    }
    MHD_stop_daemon(h->d);
    pthread_mutex_destroy(&h->mu);
    free(h);
}
