/* common.c: what every route shares: the server object, OpenAI-style errors, the generation fields (one table for
 * llama-server's, OpenAI's and Ollama's names), prompts and messages into token ids, running a job (waiting, or
 * streaming it) and the usage, timings and probability objects. */
#include "serve/serve.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---------------------------------------------------------------- the server */

kiln_status srv_server_new(const kiln_model *m, kiln_context *c, const srv_opts *o, const srv_sched_params *sp, srv_server **out) {
    *out = NULL;
    if (!m) { /* the workbench without a model: no scheduler, no template */
        srv_server *s = calloc(1, sizeof *s);
        if (!s) return KILN_ERR_NOMEM;
        s->o = *o;
        if (!s->o.max_body) s->o.max_body = 8u << 20;
        s->created = (int64_t)time(NULL);
        pthread_mutex_init(&s->mu, NULL);
        snprintf(s->model_name, sizeof s->model_name, "none");
        *out = s;
        return KILN_OK;
    }
    if (!kiln_model_tokenizer(m)) return kiln_fail(KILN_ERR_INVALID, "serve: the model has no tokenizer (tokenizer.ggml.* keys)");
    srv_server *s = calloc(1, sizeof *s);
    if (!s) return KILN_ERR_NOMEM;
    s->o = *o;
    if (!s->o.max_body) s->o.max_body = 8u << 20;
    s->m = m, s->c = c, s->tok = kiln_model_tokenizer(m);
    s->created = (int64_t)time(NULL);
    pthread_mutex_init(&s->mu, NULL);
    kiln_status st = o->chat_template ? kiln_chat_template_from_name(o->chat_template, m, &s->tmpl) : kiln_chat_template_detect(m, &s->tmpl);
    if (st && o->chat_template) {
        free(s);
        return st;
    }
    if (st) kiln_chat_template_from_name("chatml", m, &s->tmpl); /* llama-server's fallback for a model without one */
    const char *name = o->alias;
    if (!name) {
        name = o->model_path ? strrchr(o->model_path, '/') : NULL;
        name = name ? name + 1 : o->model_path ? o->model_path : "kiln";
    }
    size_t n;
    char *clean = srv_utf8_sanitize(name, strlen(name), &n); /* a file name may be any bytes; JSON needs UTF-8 */
    snprintf(s->model_name, sizeof s->model_name, "%s", clean ? clean : "kiln");
    free(clean);
    srv_sched_params p = *sp;
    if (kiln_chat_end_of_turn(&s->tmpl, s->tok, &p.eot) != KILN_OK) p.eot = -1;
    if (p.eot == kiln_tokenizer_eos(s->tok)) p.eot = -1;
    if ((st = srv_sched_new(c, m, &p, &s->sched))) {
        free(s);
        return st;
    }
    *out = s;
    return KILN_OK;
}

void srv_server_free(srv_server *s) {
    if (!s) return;
    srv_sched_free(s->sched);
    kiln_context_free(s->c);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

void srv_new_id(srv_server *s, const char *prefix, char *buf, size_t cap) {
    pthread_mutex_lock(&s->mu);
    uint64_t n = ++s->seq;
    pthread_mutex_unlock(&s->mu);
    snprintf(buf, cap, "%s%llx%06llx", prefix, (unsigned long long)s->created, (unsigned long long)n);
}

void srv_response_free(srv_response *rs) {
    free(rs->body);
    if (rs->read_free) rs->read_free(rs->read_ud);
    srv_stream_free(rs->stream);
    memset(rs, 0, sizeof *rs);
}

/* ---------------------------------------------------------------- errors and JSON */

static const char *error_type(int status) {
    switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 405: return "invalid_request_error";
    case 501: return "not_supported_error";
    case 503: return "unavailable_error";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
    }
}

void srv_json(srv_response *rs, int status, json_t *j) {
    free(rs->body);
    rs->status = status;
    rs->content_type = "application/json; charset=utf-8";
    rs->body = j ? json_dumps(j, JSON_COMPACT) : NULL;
    if (!rs->body) {
        rs->status = 500;
        rs->body = strdup("{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,\"code\":500}}");
    }
    rs->n_body = rs->body ? strlen(rs->body) : 0;
    json_decref(j);
}

void srv_error(srv_response *rs, int status, const char *param, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    size_t n;
    char *clean = srv_utf8_sanitize(msg, strlen(msg), &n); /* a message may quote a field's bytes */
    json_t *e = json_pack("{s:{s:s,s:s,s:o,s:i}}", "error", "message", clean ? clean : "error", "type", error_type(status), "param",
                          param ? json_string(param) : json_null(), "code", status);
    free(clean);
    srv_json(rs, status, e);
}

json_t *srv_body_object(const srv_request *rq, srv_response *rs) {
    json_error_t err;
    json_t *j = json_loadb(rq->body ? rq->body : "", rq->n_body, JSON_REJECT_DUPLICATES, &err);
    if (!j) {
        srv_error(rs, 400, NULL, "the body is not valid JSON: %s at byte %d", err.text, err.position);
        return NULL;
    }
    if (!json_is_object(j)) {
        json_decref(j);
        srv_error(rs, 400, NULL, "the body must be a JSON object");
        return NULL;
    }
    return j;
}

/* ---------------------------------------------------------------- the generation's fields */

typedef enum { F_FLOAT, F_I32, F_I64, F_INT, F_BOOL } field_kind;
static const struct {
    const char *name;
    field_kind kind;
    size_t off;
    double lo, hi;
} GEN_FIELDS[] = {
    {"temperature", F_FLOAT, offsetof(srv_gen, sp.temp), 0, 100},
    {"temp", F_FLOAT, offsetof(srv_gen, sp.temp), 0, 100},
    {"top_k", F_I32, offsetof(srv_gen, sp.top_k), 0, 1e9},
    {"top_p", F_FLOAT, offsetof(srv_gen, sp.top_p), 0, 1},
    {"min_p", F_FLOAT, offsetof(srv_gen, sp.min_p), 0, 1},
    {"repeat_penalty", F_FLOAT, offsetof(srv_gen, sp.repeat_penalty), 1e-6, 100},
    {"repeat_last_n", F_I32, offsetof(srv_gen, sp.repeat_last_n), -1, 1e9},
    {"presence_penalty", F_FLOAT, offsetof(srv_gen, sp.presence_penalty), -2, 2},
    {"frequency_penalty", F_FLOAT, offsetof(srv_gen, sp.frequency_penalty), -2, 2},
    {"n_predict", F_I64, offsetof(srv_gen, n_predict), -1, 1e9},
    {"max_tokens", F_I64, offsetof(srv_gen, n_predict), 0, 1e9},
    {"max_completion_tokens", F_I64, offsetof(srv_gen, n_predict), 0, 1e9},
    {"num_predict", F_I64, offsetof(srv_gen, n_predict), -1, 1e9},
    {"n_probs", F_INT, offsetof(srv_gen, n_probs), 0, SRV_MAX_PROBS},
    {"top_logprobs", F_INT, offsetof(srv_gen, n_probs), 0, SRV_MAX_PROBS},
    {"cache_prompt", F_BOOL, offsetof(srv_gen, cache_prompt), 0, 0},
    {"id_slot", F_INT, offsetof(srv_gen, id_slot), -1, 1e6},
    {"ignore_eos", F_BOOL, offsetof(srv_gen, ignore_eos), 0, 0},
    {"speculative.n_max", F_INT, offsetof(srv_gen, spec_n_max), 0, 1024}, /* more than --draft-max: --draft-max */
    {"speculative.n_min", F_INT, offsetof(srv_gen, spec_n_min), 0, 1024},
};

static bool parse_stop(json_t *v, srv_job *j, srv_response *rs) {
    json_t *one[1] = {v};
    size_t n = json_is_string(v) ? 1 : json_is_array(v) ? json_array_size(v) : (size_t)-1;
    if (n == (size_t)-1) {
        srv_error(rs, 400, "stop", "stop must be a string or an array of strings");
        return false;
    }
    if (n > SRV_MAX_STOPS) {
        srv_error(rs, 400, "stop", "stop has %zu strings, at most %d are allowed", n, SRV_MAX_STOPS);
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_is_string(v) ? one[0] : json_array_get(v, i);
        size_t len = json_is_string(e) ? json_string_length(e) : 0;
        if (!json_is_string(e) || len == 0 || len > 255 || strlen(json_string_value(e)) != len) {
            srv_error(rs, 400, "stop", "stop[%zu] must be a non-empty string of at most 255 bytes without NUL", i);
            return false;
        }
        if (!(j->g.stops[j->g.n_stops] = strdup(json_string_value(e)))) {
            srv_error(rs, 500, NULL, "out of memory");
            return false;
        }
        j->g.n_stops++;
    }
    return true;
}

bool srv_set_schema(json_t *schema, const char *field, srv_job *j, srv_response *rs) {
    if (j->g.grammar) {
        srv_error(rs, 400, field, "%s with a grammar: give one of them", field);
        return false;
    }
    if (!json_is_object(schema) && !json_is_boolean(schema)) {
        srv_error(rs, 400, field, "%s must be a JSON Schema (an object)", field);
        return false;
    }
    char *text = json_dumps(schema, JSON_COMPACT | JSON_ENCODE_ANY), *gbnf = NULL;
    size_t n = 0;
    if (!text) {
        srv_error(rs, 500, NULL, "out of memory");
        return false;
    }
    kiln_status st = kiln_json_schema_to_gbnf(text, strlen(text), &gbnf, &n);
    free(text);
    if (!st) st = kiln_grammar_parse(gbnf, n, NULL, &j->g.grammar);
    free(gbnf);
    if (st) {
        srv_error(rs, 400, field, "%s: %s", field, kiln_last_error());
        return false;
    }
    if (j->g.ignore_eos) {
        srv_error(rs, 400, field, "%s with ignore_eos: the schema's end is where the text ends", field);
        return false;
    }
    return true;
}

bool srv_parse_gen(srv_server *s, json_t *body, srv_job *j, srv_response *rs) {
    for (size_t i = 0; i < sizeof GEN_FIELDS / sizeof *GEN_FIELDS; i++) {
        json_t *v = json_object_get(body, GEN_FIELDS[i].name);
        if (!v || json_is_null(v)) continue;
        const char *f = GEN_FIELDS[i].name;
        char *dst = (char *)&j->g + GEN_FIELDS[i].off;
        if (GEN_FIELDS[i].kind == F_BOOL) {
            if (!json_is_boolean(v)) {
                srv_error(rs, 400, f, "%s must be a boolean", f);
                return false;
            }
            *(bool *)dst = json_is_true(v);
            continue;
        }
        bool integer = GEN_FIELDS[i].kind != F_FLOAT;
        if (!json_is_number(v) || (integer && !json_is_integer(v))) {
            srv_error(rs, 400, f, "%s must be %s", f, integer ? "an integer" : "a number");
            return false;
        }
        double x = json_number_value(v);
        if (!(x >= GEN_FIELDS[i].lo && x <= GEN_FIELDS[i].hi)) {
            srv_error(rs, 400, f, "%s is %g, outside [%g, %g]", f, x, GEN_FIELDS[i].lo, GEN_FIELDS[i].hi);
            return false;
        }
        switch (GEN_FIELDS[i].kind) {
        case F_FLOAT: *(float *)dst = (float)x; break;
        case F_I32: *(int32_t *)dst = (int32_t)x; break;
        case F_I64: *(int64_t *)dst = (int64_t)x; break;
        case F_INT: *(int *)dst = (int)x; break;
        case F_BOOL: break;
        }
    }
    json_t *v = json_object_get(body, "seed");
    if (v && !json_is_null(v)) {
        if (!json_is_integer(v) || json_integer_value(v) < -1) {
            srv_error(rs, 400, "seed", "seed must be an integer, -1 for a random one");
            return false;
        }
        if (json_integer_value(v) >= 0) j->g.sp.seed = (uint64_t)json_integer_value(v), j->g.seed_set = true;
    }
    if ((v = json_object_get(body, "stop")) && !json_is_null(v) && !parse_stop(v, j, rs)) return false;
    if ((v = json_object_get(body, "grammar")) && !json_is_null(v) && !(json_is_string(v) && json_string_length(v) == 0)) {
        if (!json_is_string(v) || strlen(json_string_value(v)) != json_string_length(v)) {
            srv_error(rs, 400, "grammar", "grammar must be a string of GBNF without NUL");
            return false;
        }
        kiln_grammar_free(j->g.grammar);
        j->g.grammar = NULL;
        if (kiln_grammar_parse(json_string_value(v), json_string_length(v), NULL, &j->g.grammar)) {
            srv_error(rs, 400, "grammar", "%s", kiln_last_error());
            return false;
        }
        if (j->g.ignore_eos) {
            srv_error(rs, 400, "grammar", "grammar with ignore_eos: the grammar's end is where the text ends");
            return false;
        }
    }
    if ((v = json_object_get(body, "json_schema")) && !json_is_null(v) && !srv_set_schema(v, "json_schema", j, rs)) return false;
    if (j->g.spec_n_max >= 0 && j->g.spec_n_min > j->g.spec_n_max) {
        srv_error(rs, 400, "speculative.n_min", "speculative.n_min %d is more than speculative.n_max %d", j->g.spec_n_min, j->g.spec_n_max);
        return false;
    }
    if (j->g.id_slot >= srv_sched_n_slots(s->sched)) {
        srv_error(rs, 400, "id_slot", "id_slot %d is not a slot: the server has %d", j->g.id_slot, (int)srv_sched_n_slots(s->sched));
        return false;
    }
    return true;
}

/* A seed of its own for a request that names none, as llama-server's -1. */
static uint64_t fresh_seed(srv_server *s) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    pthread_mutex_lock(&s->mu);
    uint64_t n = ++s->seq;
    pthread_mutex_unlock(&s->mu);
    uint64_t x = (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ull ^ (uint64_t)ts.tv_sec ^ n << 32;
    return x ? x : 1;
}

bool srv_parse_prompt(srv_server *s, json_t *v, const char *field, kiln_tokens *out, srv_response *rs) {
    if (json_is_string(v)) {
        kiln_status st = kiln_tokenizer_encode(s->tok, json_string_value(v), json_string_length(v), true, true, out);
        if (st) {
            srv_error(rs, 400, field, "%s: %s", field, kiln_last_error());
            return false;
        }
    } else if (json_is_array(v)) {
        int32_t V = kiln_tokenizer_n_vocab(s->tok);
        size_t n = json_array_size(v);
        out->ids = malloc((n ? n : 1) * sizeof *out->ids);
        if (!out->ids) {
            srv_error(rs, 500, NULL, "out of memory");
            return false;
        }
        out->cap = n ? n : 1;
        for (size_t i = 0; i < n; i++) {
            json_t *e = json_array_get(v, i);
            if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) >= V) {
                srv_error(rs, 400, field, "%s[%zu] must be a token id in [0, %d)", field, i, (int)V);
                return false;
            }
            out->ids[out->n++] = (int32_t)json_integer_value(e);
        }
    } else {
        srv_error(rs, 400, field, "%s must be a string or an array of token ids", field);
        return false;
    }
    if (out->n == 0) {
        srv_error(rs, 400, field, "%s is empty", field);
        return false;
    }
    return true;
}

bool srv_parse_messages(srv_server *s, json_t *msgs, kiln_tokens *out, srv_response *rs) {
    return srv_parse_messages_with(&s->tmpl, s->tok, msgs, out, rs);
}

bool srv_parse_messages_with(const kiln_chat_template *tmpl, const kiln_tokenizer *tok, json_t *msgs, kiln_tokens *out, srv_response *rs) {
    if (!json_is_array(msgs) || json_array_size(msgs) == 0) {
        srv_error(rs, 400, "messages", "messages must be a non-empty array");
        return false;
    }
    size_t n = json_array_size(msgs);
    kiln_chat_msg *m = calloc(n, sizeof *m);
    char **owned = calloc(n, sizeof *owned);
    bool ok = m && owned;
    if (!ok) srv_error(rs, 500, NULL, "out of memory");
    for (size_t i = 0; ok && i < n; i++) {
        json_t *e = json_array_get(msgs, i), *role = json_object_get(e, "role"), *content = json_object_get(e, "content");
        const char *r = json_string_value(role);
        if (!json_is_object(e) || !r || (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "developer"))) {
            srv_error(rs, 400, "messages", "messages[%zu].role must be system, user or assistant", i);
            ok = false;
            break;
        }
        m[i].role = strcmp(r, "developer") ? r : "system";
        if (json_is_string(content)) {
            if (strlen(json_string_value(content)) != json_string_length(content)) {
                srv_error(rs, 400, "messages", "messages[%zu].content holds a NUL byte", i);
                ok = false;
            }
            m[i].content = json_string_value(content);
        } else if (json_is_array(content)) { /* parts: only text ones */
            size_t len = 0, k;
            json_t *part;
            json_array_foreach(content, k, part) {
                json_t *t = json_object_get(part, "text");
                if (!json_is_string(t) || strcmp(json_string_value(json_object_get(part, "type")) ? json_string_value(json_object_get(part, "type")) : "", "text")) {
                    srv_error(rs, 400, "messages", "messages[%zu].content[%zu] must be a text part", i, k);
                    ok = false;
                    break;
                }
                len += json_string_length(t);
            }
            if (ok && !(owned[i] = malloc(len + 1))) ok = false, srv_error(rs, 500, NULL, "out of memory");
            size_t at = 0;
            json_array_foreach(content, k, part) {
                if (!ok) break;
                json_t *t = json_object_get(part, "text");
                memcpy(owned[i] + at, json_string_value(t), json_string_length(t)), at += json_string_length(t);
            }
            if (ok) owned[i][at] = 0, m[i].content = owned[i];
        } else if (json_is_null(content) || !content) {
            m[i].content = "";
        } else {
            srv_error(rs, 400, "messages", "messages[%zu].content must be a string or an array of text parts", i);
            ok = false;
        }
    }
    if (ok) {
        kiln_status st = kiln_chat_tokenize(tmpl, tok, m, n, true, out);
        if (st) srv_error(rs, 400, "messages", "messages: %s", kiln_last_error()), ok = false;
    }
    for (size_t i = 0; owned && i < n; i++) free(owned[i]);
    free(owned), free(m);
    return ok;
}

/* ---------------------------------------------------------------- server-sent events */

bool srv_sse_append(srv_sse_buf *b, const char *event, json_t *data) {
    char *d = data ? json_dumps(data, JSON_COMPACT) : NULL;
    if (!d) return false;
    size_t need = b->n + strlen(event) + strlen(d) + 32;
    if (need > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < need) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            free(d);
            return false;
        }
        b->p = p, b->cap = cap;
    }
    b->n += (size_t)sprintf(b->p + b->n, "event: %s\ndata: %s\n\n", event, d);
    free(d);
    return true;
}

size_t srv_sse_take(srv_sse_buf *b, char *buf, size_t cap) {
    if (b->off == b->n) {
        b->off = b->n = 0;
        return 0;
    }
    size_t k = b->n - b->off < cap ? b->n - b->off : cap;
    memcpy(buf, b->p + b->off, k);
    b->off += k;
    return k;
}

/* ---------------------------------------------------------------- jobs and streams */

static void stream_free_cb(void *ud) {
    srv_stream *st = ud;
    free(st->buf);
    free(st);
}

static bool append(srv_stream *st, const char *a, size_t na, const char *b, size_t nb, const char *c, size_t nc) {
    size_t need = st->n + na + nb + nc;
    if (need > st->cap) {
        size_t cap = st->cap ? st->cap : 1024;
        while (cap < need) cap *= 2;
        char *p = realloc(st->buf, cap);
        if (!p) return false;
        st->buf = p, st->cap = cap;
    }
    memcpy(st->buf + st->n, a, na), st->n += na;
    memcpy(st->buf + st->n, b, nb), st->n += nb;
    memcpy(st->buf + st->n, c, nc), st->n += nc;
    return true;
}

/* The scheduler's emit for a streamed job: the route's frames, as SSE events or NDJSON lines. */
static void stream_emit(srv_job *j, const char *text, size_t n, const srv_tokinfo *toks, size_t n_toks, bool done) {
    srv_stream *st = j->ud;
    json_t *frames = json_array();
    if (done && j->http_status) {
        srv_response e = {0};
        srv_error(&e, j->http_status, NULL, "%s", j->err);
        json_array_append_new(frames, json_loads(e.body, 0, NULL));
        free(e.body);
    } else {
        st->frames(st, frames, j, text, n, toks, n_toks, done);
    }
    bool ndjson = st->fmt == SRV_FMT_OLLAMA_GEN || st->fmt == SRV_FMT_OLLAMA_CHAT;
    pthread_mutex_lock(&j->mu);
    size_t i;
    json_t *f;
    json_array_foreach(frames, i, f) {
        char *s = json_dumps(f, JSON_COMPACT);
        if (s) append(st, ndjson ? "" : "data: ", ndjson ? 0 : 6, s, strlen(s), ndjson ? "\n" : "\n\n", ndjson ? 1 : 2);
        free(s);
    }
    if (done && (st->fmt == SRV_FMT_OAI_CHAT || st->fmt == SRV_FMT_OAI_TEXT)) append(st, "data: [DONE]\n\n", 14, "", 0, "", 0);
    if (done) st->ended = true;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    json_decref(frames);
}

long srv_stream_read(srv_stream *st, char *buf, size_t cap, bool (*alive)(void *), void *ud) {
    srv_job *j = st->job;
    pthread_mutex_lock(&j->mu);
    for (;;) {
        if (st->off < st->n) {
            size_t k = st->n - st->off < cap ? st->n - st->off : cap;
            memcpy(buf, st->buf + st->off, k);
            st->off += k;
            if (st->off == st->n) st->off = st->n = 0;
            pthread_mutex_unlock(&j->mu);
            return (long)k;
        }
        if (st->ended) {
            pthread_mutex_unlock(&j->mu);
            return 0;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&j->cv, &j->mu, &ts);
        if (st->off == st->n && !st->ended && alive && !alive(ud)) {
            j->cancel = true;
            pthread_mutex_unlock(&j->mu);
            return -1;
        }
    }
}

void srv_stream_cancel(srv_stream *st) {
    if (st) srv_job_cancel(st->job);
}

void srv_stream_free(srv_stream *st) {
    if (!st) return;
    srv_job_cancel(st->job); /* a no-op once done; a client gone mid-stream frees its slot at the next step */
    srv_job_release(st->job); /* the stream itself goes with the job */
}

bool srv_run_job(srv_server *s, const srv_request *rq, srv_job *j, bool stream, srv_fmt fmt, srv_frames_fn frames, json_t *extra,
                 srv_response *rs) {
    int64_t n_ctx = srv_sched_n_ctx_slot(s->sched);
    if ((int64_t)j->n_prompt >= n_ctx) {
        srv_error(rs, 400, fmt == SRV_FMT_OAI_CHAT || fmt == SRV_FMT_OLLAMA_CHAT ? "messages" : "prompt",
                  "the prompt has %zu tokens, the slot's context holds %lld: it must be shorter", j->n_prompt, (long long)n_ctx);
        return false;
    }
    if (s->o.max_predict > 0 && (j->g.n_predict < 0 || j->g.n_predict > s->o.max_predict)) j->g.n_predict = s->o.max_predict;
    j->g.timeout_s = s->o.timeout_s;
    if (!j->g.seed_set) j->g.sp.seed = fresh_seed(s);
    if (stream) {
        srv_stream *st = calloc(1, sizeof *st);
        if (!st) {
            srv_error(rs, 500, NULL, "out of memory");
            return false;
        }
        st->job = j, st->srv = s, st->fmt = fmt, st->frames = frames, st->created = (int64_t)time(NULL), st->first = true;
        st->include_usage = json_is_true(json_object_get(extra, "include_usage"));
        st->logprobs = json_is_true(json_object_get(extra, "logprobs"));
        const char *id = json_string_value(json_object_get(extra, "id"));
        snprintf(st->id, sizeof st->id, "%s", id ? id : "");
        j->emit = stream_emit, j->ud = st, j->ud_free = stream_free_cb;
    }
    if (!srv_sched_submit(s->sched, j)) {
        rs->retry_after = 1;
        srv_error(rs, 503, NULL, "every slot is busy and the queue is full: try again later");
        return false;
    }
    if (stream) {
        rs->status = 200; /* the caller's reference to j is now the stream's, dropped by srv_stream_free */
        rs->content_type = fmt == SRV_FMT_OLLAMA_GEN || fmt == SRV_FMT_OLLAMA_CHAT ? "application/x-ndjson" : "text/event-stream";
        rs->stream = j->ud;
        return true;
    }
    if (!srv_job_wait(j, rq->alive, rq->alive_ud)) {
        srv_error(rs, 499, NULL, "the client closed the connection");
        return false;
    }
    if (j->http_status) {
        if (j->http_status == 503) rs->retry_after = 1;
        srv_error(rs, j->http_status, NULL, "%s", j->err);
        return false;
    }
    return true;
}

/* ---------------------------------------------------------------- shared objects */

const char *srv_finish_oai(srv_finish f) { return f == SRV_FIN_EOS || f == SRV_FIN_STOP ? "stop" : "length"; }

json_t *srv_usage(const srv_job *j) {
    return json_pack("{s:I,s:I,s:I,s:{s:I}}", "prompt_tokens", (json_int_t)j->n_prompt, "completion_tokens", (json_int_t)j->n_gen,
                     "total_tokens", (json_int_t)(j->n_prompt + j->n_gen), "prompt_tokens_details", "cached_tokens", (json_int_t)j->n_cached);
}

json_t *srv_timings(const srv_job *j) {
    double pms = j->t_start && j->t_first ? 1e3 * (j->t_first - j->t_start) : 0;
    double gms = j->t_first && j->t_end ? 1e3 * (j->t_end - j->t_first) : 0;
    double pn = (double)j->n_evaluated, gn = (double)j->n_gen;
    json_t *t = json_pack("{s:I,s:I,s:f,s:f,s:f,s:I,s:f,s:f,s:f}", "cache_n", (json_int_t)j->n_cached, "prompt_n",
                          (json_int_t)j->n_evaluated, "prompt_ms", pms, "prompt_per_token_ms", pn > 0 ? pms / pn : 0.0,
                          "prompt_per_second", pms > 0 ? 1e3 * pn / pms : 0.0, "predicted_n", (json_int_t)j->n_gen, "predicted_ms",
                          gms, "predicted_per_token_ms", gn > 0 ? gms / gn : 0.0, "predicted_per_second",
                          gms > 0 ? 1e3 * gn / gms : 0.0);
    if (t && j->spec) { /* llama-server's, for a job that speculated */
        json_object_set_new(t, "draft_n", json_integer(j->draft_n));
        json_object_set_new(t, "draft_n_accepted", json_integer(j->draft_accepted));
    }
    return t;
}

/* A token's text (control tokens too), sanitized, and its raw bytes. */
static json_t *token_text(srv_server *s, int32_t id, json_t **bytes) {
    char buf[256];
    size_t n = 0;
    if (kiln_tokenizer_piece(s->tok, id, true, buf, sizeof buf, &n) || n > sizeof buf) n = 0;
    if (bytes) {
        *bytes = json_array();
        for (size_t i = 0; i < n; i++) json_array_append_new(*bytes, json_integer((unsigned char)buf[i]));
    }
    size_t m;
    char *clean = srv_utf8_sanitize(buf, n, &m);
    json_t *t = json_stringn(clean ? clean : "", clean ? m : 0);
    free(clean);
    return t;
}

json_t *srv_logprobs_oai(srv_server *s, const srv_tokinfo *t, size_t n, bool chat) {
    if (chat) {
        json_t *content = json_array();
        for (size_t i = 0; i < n; i++) {
            json_t *b, *top = json_array();
            json_t *tok = token_text(s, t[i].id, &b);
            for (int k = 0; k < t[i].n_top; k++) {
                json_t *bb, *tt = token_text(s, t[i].top[k].id, &bb);
                json_array_append_new(top, json_pack("{s:o,s:f,s:o}", "token", tt, "logprob", (double)t[i].top[k].logprob, "bytes", bb));
            }
            json_array_append_new(content, json_pack("{s:o,s:f,s:o,s:o}", "token", tok, "logprob", (double)t[i].logprob, "bytes", b, "top_logprobs", top));
        }
        return json_pack("{s:o}", "content", content);
    }
    json_t *toks = json_array(), *lps = json_array(), *tops = json_array();
    for (size_t i = 0; i < n; i++) {
        json_array_append_new(toks, token_text(s, t[i].id, NULL));
        json_array_append_new(lps, json_real(t[i].logprob));
        json_t *top = json_object();
        for (int k = 0; k < t[i].n_top; k++) {
            json_t *tt = token_text(s, t[i].top[k].id, NULL);
            json_object_set_new(top, json_string_value(tt), json_real(t[i].top[k].logprob));
            json_decref(tt);
        }
        json_array_append_new(tops, top);
    }
    return json_pack("{s:o,s:o,s:o}", "tokens", toks, "token_logprobs", lps, "top_logprobs", tops);
}

json_t *srv_probs_llama(srv_server *s, const srv_tokinfo *t, size_t n) {
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++) {
        json_t *b, *top = json_array(), *tok = token_text(s, t[i].id, &b);
        for (int k = 0; k < t[i].n_top; k++) {
            json_t *bb, *tt = token_text(s, t[i].top[k].id, &bb);
            json_array_append_new(top, json_pack("{s:i,s:o,s:f,s:o}", "id", (int)t[i].top[k].id, "token", tt, "logprob",
                                                 (double)t[i].top[k].logprob, "bytes", bb));
        }
        json_array_append_new(a, json_pack("{s:i,s:o,s:f,s:o,s:o}", "id", (int)t[i].id, "token", tok, "logprob", (double)t[i].logprob, "bytes", b,
                                           "top_logprobs", top));
    }
    return a;
}
