/* routes_oai.c: OpenAI's routes, POST /v1/chat/completions, POST /v1/completions and GET /v1/models, with their
 * response shapes (ids, created, model, choices, finish_reason "stop"/"length", usage) and their SSE chunks. */
#include "serve/serve.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Function calling needs a tool-call parser kiln does not have: a chat request that offers tools (tools, or the
 * legacy functions) or forces a call (tool_choice, function_call) gets a 400, never an answer that silently ignored
 * them. null, an empty list and the choices "none" and "auto" (with nothing to call, both mean no call) pass. */
static const struct {
    const char *name;
    bool choice; /* a choice ("none", "auto" or a function to call) rather than a list of tools */
} TOOL_FIELDS[] = {{"tools", false}, {"functions", false}, {"tool_choice", true}, {"function_call", true}};

static bool no_tools(json_t *body, srv_response *rs) {
    for (size_t i = 0; i < sizeof TOOL_FIELDS / sizeof *TOOL_FIELDS; i++) {
        const char *f = TOOL_FIELDS[i].name, *c;
        json_t *v = json_object_get(body, f);
        if (!v || json_is_null(v)) continue;
        if (TOOL_FIELDS[i].choice ? (c = json_string_value(v)) && (!strcmp(c, "none") || !strcmp(c, "auto"))
                                  : json_is_array(v) && json_array_size(v) == 0) continue;
        if (!TOOL_FIELDS[i].choice && !json_is_array(v)) srv_error(rs, 400, f, "%s must be an array", f);
        else srv_error(rs, 400, f, "%s: function calling is not supported by kiln serve", f);
        return false;
    }
    return true;
}

/* The fields both routes share beyond the generation's: n (1 only), stream, stream_options, logprobs,
 * response_format, and the chat route's tool fields (none). *stream and extra get what srv_run_job needs. */
static bool oai_fields(srv_server *s, json_t *body, srv_job *j, bool chat, bool *stream, json_t *extra, srv_response *rs) {
    json_t *v;
    if (!srv_parse_gen(s, body, j, rs)) return false;
    if ((v = json_object_get(body, "n")) && !json_is_null(v) && !(json_is_integer(v) && json_integer_value(v) == 1)) {
        srv_error(rs, 400, "n", "n must be 1: one choice per request");
        return false;
    }
    *stream = false;
    if ((v = json_object_get(body, "stream")) && !json_is_null(v)) {
        if (!json_is_boolean(v)) {
            srv_error(rs, 400, "stream", "stream must be a boolean");
            return false;
        }
        *stream = json_is_true(v);
    }
    if ((v = json_object_get(body, "stream_options")) && !json_is_null(v)) {
        json_t *u = json_object_get(v, "include_usage");
        if (!json_is_object(v) || (u && !json_is_boolean(u) && !json_is_null(u))) {
            srv_error(rs, 400, "stream_options", "stream_options must be an object whose include_usage is a boolean");
            return false;
        }
        json_object_set(extra, "include_usage", json_is_true(u) ? json_true() : json_false());
    }
    if ((v = json_object_get(body, "logprobs")) && !json_is_null(v)) {
        if (chat ? !json_is_boolean(v) : !(json_is_integer(v) && json_integer_value(v) >= 0 && json_integer_value(v) <= SRV_MAX_PROBS)) {
            srv_error(rs, 400, "logprobs", chat ? "logprobs must be a boolean" : "logprobs must be an integer in [0, %d]", SRV_MAX_PROBS);
            return false;
        }
        if (chat) j->want_toks = json_is_true(v);
        else j->want_toks = true, j->g.n_probs = (int)json_integer_value(v);
    }
    if (chat && j->g.n_probs > 0 && !j->want_toks) {
        srv_error(rs, 400, "top_logprobs", "top_logprobs needs logprobs: true");
        return false;
    }
    if (j->want_toks) json_object_set_new(extra, "logprobs", json_true());
    if (chat && !no_tools(body, rs)) return false;
    if ((v = json_object_get(body, "response_format")) && !json_is_null(v)) {
        /* OpenAI's structured output: json_object (any JSON object) or json_schema ({name, schema, strict}) */
        const char *t = json_string_value(json_object_get(v, "type"));
        if (!json_is_object(v) || !t || (strcmp(t, "text") && strcmp(t, "json_object") && strcmp(t, "json_schema"))) {
            srv_error(rs, 400, "response_format", "response_format must be {\"type\": \"text\" | \"json_object\" | \"json_schema\"}");
            return false;
        }
        if (strcmp(t, "json_object") == 0) {
            json_t *any = json_pack("{s:s}", "type", "object");
            const bool ok = any && srv_set_schema(any, "response_format", j, rs);
            json_decref(any);
            if (!ok) return false;
        } else if (strcmp(t, "json_schema") == 0) {
            json_t *js = json_object_get(v, "json_schema"), *schema = json_is_object(js) ? json_object_get(js, "schema") : NULL;
            if (!schema) {
                srv_error(rs, 400, "response_format", "response_format json_schema needs json_schema.schema");
                return false;
            }
            if (!srv_set_schema(schema, "response_format", j, rs)) return false;
        }
    }
    return true;
}

static json_t *choice_delta(srv_stream *st, const srv_job *j, const char *text, size_t n, const srv_tokinfo *toks, size_t n_toks,
                            const char *finish) {
    bool chat = st->fmt == SRV_FMT_OAI_CHAT;
    json_t *c = json_object();
    json_object_set_new(c, "index", json_integer(0));
    if (chat) {
        json_t *d = json_object();
        if (st->first) json_object_set_new(d, "role", json_string("assistant"));
        if (n || !finish) json_object_set_new(d, "content", json_stringn(text, n));
        json_object_set_new(c, "delta", d);
    } else {
        json_object_set_new(c, "text", json_stringn(text, n));
    }
    json_object_set_new(c, "logprobs", st->logprobs && n_toks ? srv_logprobs_oai(st->srv, toks, n_toks, chat) : json_null());
    json_object_set_new(c, "finish_reason", finish ? json_string(finish) : json_null());
    st->first = false;
    return c;
}

static json_t *chunk(srv_stream *st, json_t *choices) {
    return json_pack("{s:s,s:s,s:I,s:s,s:o}", "id", st->id, "object", st->fmt == SRV_FMT_OAI_CHAT ? "chat.completion.chunk" : "text_completion",
                     "created", (json_int_t)st->created, "model", st->srv->model_name, "choices", choices);
}

void srv_frames_oai(srv_stream *st, json_t *frames, const srv_job *j, const char *text, size_t n, const srv_tokinfo *toks, size_t n_toks, bool done) {
    if (n || n_toks || st->first) json_array_append_new(frames, chunk(st, json_pack("[o]", choice_delta(st, j, text, n, toks, n_toks, NULL))));
    if (!done) return;
    json_array_append_new(frames, chunk(st, json_pack("[o]", choice_delta(st, j, "", 0, NULL, 0, srv_finish_oai(j->finish)))));
    if (st->include_usage) {
        json_t *u = chunk(st, json_array());
        json_object_set_new(u, "usage", srv_usage(j));
        json_array_append_new(frames, u);
    }
}

static void oai_route(srv_server *s, const srv_request *rq, srv_response *rs, bool chat) {
    json_t *body = srv_body_object(rq, rs), *extra = json_object();
    srv_job *j = srv_job_new();
    kiln_tokens t = {0};
    bool stream = false;
    char id[64];
    srv_new_id(s, chat ? "chatcmpl-" : "cmpl-", id, sizeof id);
    json_object_set_new(extra, "id", json_string(id));
    if (!body || !j) {
        if (!j) srv_error(rs, 500, NULL, "out of memory");
        goto out;
    }
    if (!oai_fields(s, body, j, chat, &stream, extra, rs)) goto out;
    if (chat ? !srv_parse_messages(s, json_object_get(body, "messages"), &t, rs)
             : !srv_parse_prompt(s, json_object_get(body, "prompt"), "prompt", &t, rs)) goto out;
    j->prompt = t.ids, j->n_prompt = t.n, t.ids = NULL;
    if (!srv_run_job(s, rq, j, stream, chat ? SRV_FMT_OAI_CHAT : SRV_FMT_OAI_TEXT, srv_frames_oai, extra, rs)) goto out;
    if (stream) {
        j = NULL;
        goto out;
    }
    json_t *c = json_object();
    json_object_set_new(c, "index", json_integer(0));
    if (chat) json_object_set_new(c, "message", json_pack("{s:s,s:s%}", "role", "assistant", "content", j->text, j->n_text));
    else json_object_set_new(c, "text", json_stringn(j->text, j->n_text));
    json_object_set_new(c, "logprobs", j->want_toks ? srv_logprobs_oai(s, j->toks, j->n_toks, chat) : json_null());
    json_object_set_new(c, "finish_reason", json_string(srv_finish_oai(j->finish)));
    srv_json(rs, 200, json_pack("{s:s,s:s,s:I,s:s,s:[o],s:o,s:o}", "id", id, "object", chat ? "chat.completion" : "text_completion", "created",
                                (json_int_t)time(NULL), "model", s->model_name, "choices", c, "usage", srv_usage(j), "timings", srv_timings(j)));
out:
    kiln_tokens_free(&t);
    srv_job_release(j);
    json_decref(body);
    json_decref(extra);
}

void srv_route_oai_chat(srv_server *s, const srv_request *rq, srv_response *rs) { oai_route(s, rq, rs, true); }
void srv_route_oai_completions(srv_server *s, const srv_request *rq, srv_response *rs) { oai_route(s, rq, rs, false); }

void srv_route_oai_models(srv_server *s, const srv_request *rq, srv_response *rs) {
    srv_json(rs, 200, json_pack("{s:s,s:[{s:s,s:s,s:I,s:s}]}", "object", "list", "data", "id", s->model_name, "object", "model", "created",
                                (json_int_t)s->created, "owned_by", "kiln"));
}
