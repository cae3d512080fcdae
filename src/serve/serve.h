/* serve.h: kiln serve's server: the request handler (a pure function of method, path, headers, query and body, so
 * that tests and the fuzzer call it without a socket), its routes (routes_oai.c, routes_llama.c, routes_ollama.c,
 * metrics.c) and the libmicrohttpd front (http.c). Calls only include/kiln.h. */
#ifndef KILN_SERVE_SERVE_H
#define KILN_SERVE_SERVE_H

#include "kiln.h"
#include "serve/sched.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct srv_opts {
    const char *model_path;  /* for /props and /v1/models */
    const char *draft_path;  /* the draft model (-md), for /props; NULL: none */
    const char *alias;       /* the model's name in responses (NULL: the file's base name) */
    const char *api_key;     /* NULL: no auth */
    const char *slot_save_path; /* NULL: slot files refused */
    const char *chat_template;  /* a family name, or NULL: the model's, else chatml */
    bool metrics;
    double timeout_s;        /* a request's wall time bound; 0: none */
    size_t max_body;         /* bytes; 0: 8 MiB */
    int64_t max_predict;     /* caps every request's n_predict (the fuzzer's); 0: none */
} srv_opts;

typedef struct srv_kv {
    const char *key, *value;
} srv_kv;

typedef struct srv_request {
    const char *method, *path; /* path without the query */
    const srv_kv *headers;     /* (n_headers), names compared case-insensitively */
    size_t n_headers;
    const srv_kv *args;        /* (n_args) the query's arguments */
    size_t n_args;
    const char *body;
    size_t n_body;
    bool (*alive)(void *ud);   /* false once the client is gone (NULL: always there) */
    void *alive_ud;
} srv_request;

typedef struct srv_stream srv_stream;

typedef struct srv_response {
    int status;
    const char *content_type; /* static */
    char *body;               /* (n_body) malloc'd */
    size_t n_body;
    int retry_after;          /* seconds; 0: no Retry-After */
    bool no_cache;            /* Cache-Control: no-cache (the workbench's page) */
    srv_stream *stream;       /* not NULL: the body comes from srv_stream_read */
    /* not NULL: the body comes from read(read_ud, ...) as srv_stream_read's (> 0 bytes, 0 at the end, -1 when the
     * client is gone), and read_free(read_ud) once it is done (the workbench's event streams) */
    long (*read)(void *ud, char *buf, size_t cap, bool (*alive)(void *), void *alive_ud);
    void (*read_free)(void *ud);
    void *read_ud;
} srv_response;

struct wb;
typedef struct srv_server {
    srv_opts o;
    struct wb *wb;            /* the workbench's jobs (kiln serve --workbench; serve/jobs.h), or NULL; not owned */
    const kiln_model *m;
    const kiln_tokenizer *tok;
    kiln_context *c;
    srv_sched *sched;
    kiln_chat_template tmpl;
    char model_name[256];
    int64_t created;
    uint64_t seq;             /* ids of responses */
    pthread_mutex_t mu;       /* seq */
} srv_server;

/* Takes c (freed by srv_server_free); m must outlive the server. m and c NULL: a server without a model (the
 * workbench's), whose model routes answer 503. */
kiln_status srv_server_new(const kiln_model *m, kiln_context *c, const srv_opts *o, const srv_sched_params *sp, srv_server **out);
void srv_server_free(srv_server *s);
void srv_handle(srv_server *s, const srv_request *rq, srv_response *rs);
void srv_response_free(srv_response *rs);
/* The next bytes of a streamed body into buf (at most cap): > 0 bytes, 0 at the end; waits for the scheduler,
 * and cancels the job and returns -1 once alive(ud) says the client is gone. */
long srv_stream_read(srv_stream *st, char *buf, size_t cap, bool (*alive)(void *), void *ud);
void srv_stream_cancel(srv_stream *st);
void srv_stream_free(srv_stream *st);

/* ---------------------------------------------------------------- shared by the routes */

/* An OpenAI-style error: {"error": {"message", "type", "param", "code"}}; param may be NULL. */
void srv_error(srv_response *rs, int status, const char *param, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* Takes j (a JSON value) and writes it as the body. */
void srv_json(srv_response *rs, int status, json_t *j);
/* The body as a JSON object, or false with a 400 naming the problem. */
json_t *srv_body_object(const srv_request *rq, srv_response *rs);

/* The stream formats. */
typedef enum { SRV_FMT_OAI_CHAT, SRV_FMT_OAI_TEXT, SRV_FMT_LLAMA, SRV_FMT_OLLAMA_GEN, SRV_FMT_OLLAMA_CHAT } srv_fmt;

/* Reads the generation fields of body (llama-server's and OpenAI's names) into j->g; false with a 400 naming the
 * field. */
bool srv_parse_gen(srv_server *s, json_t *body, srv_job *j, srv_response *rs);
/* j's grammar from a JSON Schema (kiln_json_schema_to_gbnf): a 400 naming field for a bad schema, or when the job has
 * a grammar already or ignore_eos. */
bool srv_set_schema(json_t *schema, const char *field, srv_job *j, srv_response *rs);
/* The prompt of a field: a string (tokenized, BOS as the vocab says, special tokens parsed as llama-server does) or
 * an array of token ids; false with a 400 naming field. */
bool srv_parse_prompt(srv_server *s, json_t *v, const char *field, kiln_tokens *out, srv_response *rs);
/* The messages array through the chat template into ids; false with a 400. */
bool srv_parse_messages(srv_server *s, json_t *msgs, kiln_tokens *out, srv_response *rs);
/* Queues j (its prompt set) and, for stream, answers with the stream, which then owns the caller's reference to j;
 * otherwise waits and leaves j done (true). False when the response is already an error (a prompt too long, the
 * queue full, the client gone): the caller still holds j. extra: the stream's id, include_usage, logprobs. */
typedef void (*srv_frames_fn)(srv_stream *st, json_t *frames, const srv_job *j, const char *text, size_t n, const srv_tokinfo *toks,
                              size_t n_toks, bool done);
bool srv_run_job(srv_server *s, const srv_request *rq, srv_job *j, bool stream, srv_fmt fmt, srv_frames_fn frames, json_t *extra,
                 srv_response *rs);
/* "chatcmpl-..." etc.: a fresh id with the prefix. */
void srv_new_id(srv_server *s, const char *prefix, char *buf, size_t cap);
const char *srv_finish_oai(srv_finish f);  /* "stop", "length" */
json_t *srv_timings(const srv_job *j);     /* llama-server's timings object */

void srv_route_oai_chat(srv_server *s, const srv_request *rq, srv_response *rs);
void srv_route_oai_completions(srv_server *s, const srv_request *rq, srv_response *rs);
void srv_route_oai_models(srv_server *s, const srv_request *rq, srv_response *rs);
void srv_route_completion(srv_server *s, const srv_request *rq, srv_response *rs);
void srv_route_tokenize(srv_server *s, const srv_request *rq, srv_response *rs);
void srv_route_detokenize(srv_server *s, const srv_request *rq, srv_response *rs);
void srv_route_apply_template(srv_server *s, const srv_request *rq, srv_response *rs);
void srv_route_health(srv_server *s, const srv_request *rq, srv_response *rs);
void srv_route_props(srv_server *s, const srv_request *rq, srv_response *rs);
void srv_route_slots(srv_server *s, const srv_request *rq, srv_response *rs);
void srv_route_slot_action(srv_server *s, const srv_request *rq, srv_response *rs);
void srv_route_metrics(srv_server *s, const srv_request *rq, srv_response *rs);
void srv_route_ollama_generate(srv_server *s, const srv_request *rq, srv_response *rs);
void srv_route_ollama_chat(srv_server *s, const srv_request *rq, srv_response *rs);
void srv_route_ollama_tags(srv_server *s, const srv_request *rq, srv_response *rs);
/* The workbench's routes (routes_wb.c): 404 unless s->wb is set. */
void srv_route_wb_corpora_post(srv_server *s, const srv_request *rq, srv_response *rs);
void srv_route_wb_corpora_get(srv_server *s, const srv_request *rq, srv_response *rs);
void srv_route_wb_jobs_post(srv_server *s, const srv_request *rq, srv_response *rs);
void srv_route_wb_jobs_get(srv_server *s, const srv_request *rq, srv_response *rs);
void srv_route_wb_job_get(srv_server *s, const srv_request *rq, srv_response *rs);  /* /wb/jobs/ID, /wb/jobs/ID/events */
void srv_route_wb_job_post(srv_server *s, const srv_request *rq, srv_response *rs); /* /wb/jobs/ID/stop */
void srv_route_wb_runs_get(srv_server *s, const srv_request *rq, srv_response *rs);
void srv_route_wb_info(srv_server *s, const srv_request *rq, srv_response *rs);       /* wb_tok.c */
void srv_route_wb_tokenizers(srv_server *s, const srv_request *rq, srv_response *rs);
void srv_route_wb_tokenizer(srv_server *s, const srv_request *rq, srv_response *rs);
void srv_route_wb_tokenize(srv_server *s, const srv_request *rq, srv_response *rs);
void srv_route_wb_compare(srv_server *s, const srv_request *rq, srv_response *rs);
void srv_route_wb_models(srv_server *s, const srv_request *rq, srv_response *rs);     /* wb_gen.c */
void srv_route_wb_generate(srv_server *s, const srv_request *rq, srv_response *rs);
/* A queue of server-sent events: each appended at n as "event: E\ndata: JSON\n\n", read from off (the workbench's
 * job events and generation). srv_sse_append: false when out of memory (data is not taken); srv_sse_take: up to cap
 * pending bytes into buf, 0 when none are left (the queue then starts over empty). */
typedef struct srv_sse_buf {
    char *p;
    size_t n, off, cap;
} srv_sse_buf;
bool srv_sse_append(srv_sse_buf *b, const char *event, json_t *data);
size_t srv_sse_take(srv_sse_buf *b, char *buf, size_t cap);

/* The workbench's shared pieces: whether it is on (else a 404 in rs); the model presets as [{name, dims}] into
 * list; a body's fields checked against a NULL-ended list (a 400 naming the first other one); the vocab folder
 * beside the examples; a tokenizer by name (wb_tok.c's names) held until wb_tok_put. */
bool srv_wb_on(srv_server *s, srv_response *rs);
void srv_wb_presets(json_t *list);
bool wb_known_fields(json_t *body, const char *const *known, srv_response *rs);
struct wb;
bool wb_vocab_dir(const struct wb *w, char *buf, size_t cap);
bool wb_tok_get(srv_server *s, const char *name, const kiln_tokenizer **out, void **entry, srv_response *rs);
void wb_tok_put(srv_server *s, void *entry);
/* The messages array through template tmpl and tokenizer tok into ids (srv_parse_messages with the served model's);
 * false with a 400. */
bool srv_parse_messages_with(const kiln_chat_template *tmpl, const kiln_tokenizer *tok, json_t *msgs, kiln_tokens *out, srv_response *rs);
/* The workbench's page (routes_static.c): GET /, /index.html, /wb/ui/FILE. */
void srv_route_wb_static(srv_server *s, const srv_request *rq, srv_response *rs);

/* A streamed response: the job, and the bytes its emits formatted (SSE for OpenAI and llama-server, NDJSON for
 * Ollama) waiting for the connection, under the job's lock. */
struct srv_stream {
    srv_job *job;
    srv_server *srv;
    srv_fmt fmt;
    srv_frames_fn frames; /* the route's (a pointer, so that common.c calls no route) */
    char id[64];
    int64_t created;
    bool include_usage, logprobs, first;
    char *buf; /* (n) pending bytes from off */
    size_t n, cap, off;
    bool ended; /* the last frame is in buf */
};
/* Each route's frames for one emit, appended to frames (a JSON array): text, toks as the scheduler gave them; done on
 * the last. The final objects of the non-streamed responses are the routes' own. */
void srv_frames_oai(srv_stream *st, json_t *frames, const srv_job *j, const char *text, size_t n, const srv_tokinfo *toks, size_t n_toks, bool done);
void srv_frames_llama(srv_stream *st, json_t *frames, const srv_job *j, const char *text, size_t n, const srv_tokinfo *toks, size_t n_toks, bool done);
void srv_frames_ollama(srv_stream *st, json_t *frames, const srv_job *j, const char *text, size_t n, const srv_tokinfo *toks, size_t n_toks, bool done);
json_t *srv_usage(const srv_job *j); /* OpenAI's usage object */
json_t *srv_logprobs_oai(srv_server *s, const srv_tokinfo *t, size_t n, bool chat); /* OpenAI's logprobs */
json_t *srv_probs_llama(srv_server *s, const srv_tokinfo *t, size_t n); /* llama-server's completion_probabilities */

/* The MHD front: listens on host:port (0: a free one, *port gets it). */
typedef struct srv_http srv_http;
kiln_status srv_http_start(srv_server *s, const char *host, int port, int *bound_port, srv_http **out);
/* Stops accepting, waits up to drain_s for the requests in flight, then stops. */
void srv_http_stop(srv_http *h, double drain_s);

#endif
