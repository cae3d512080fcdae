/* routes_ollama.c: Ollama's POST /api/generate, POST /api/chat (NDJSON streaming by default, as Ollama) and
 * GET /api/tags, with its field names: options{} for sampling, response / message.content, and the last record's
 * done, done_reason and counts (nanosecond durations). /api/generate formats its prompt as Ollama does: a user
 * message in the model's chat template, after the system message `system` when given; `raw: true` takes the
 * prompt's text as it is (with the model's BOS). "format" ("json" or a JSON Schema) constrains the answer as
 * response_format does. Fields kiln does not implement (tools, images, ...) get a 400. */
#include "serve/serve.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

static void created_at(char *buf, size_t cap) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char b[32];
    strftime(b, sizeof b, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf, cap, "%s.%06ldZ", b, ts.tv_nsec / 1000);
}

static json_t *record(srv_server *s, bool chat, const char *text, size_t n, bool done) {
    char at[64];
    created_at(at, sizeof at);
    json_t *o = json_pack("{s:s,s:s}", "model", s->model_name, "created_at", at);
    if (chat) json_object_set_new(o, "message", json_pack("{s:s,s:s%}", "role", "assistant", "content", text, n));
    else json_object_set_new(o, "response", json_stringn(text, n));
    json_object_set_new(o, "done", json_boolean(done));
    return o;
}

static void add_counts(json_t *o, const srv_job *j) {
    double ns = 1e9;
    json_object_set_new(o, "done_reason", json_string(srv_finish_oai(j->finish)));
    json_object_set_new(o, "total_duration", json_integer((json_int_t)(ns * (j->t_end - j->t_submit))));
    json_object_set_new(o, "load_duration", json_integer(0));
    json_object_set_new(o, "prompt_eval_count", json_integer((json_int_t)j->n_evaluated));
    json_object_set_new(o, "prompt_eval_duration", json_integer((json_int_t)(j->t_first > j->t_start ? ns * (j->t_first - j->t_start) : 0)));
    json_object_set_new(o, "eval_count", json_integer((json_int_t)j->n_gen));
    json_object_set_new(o, "eval_duration", json_integer((json_int_t)(j->t_end > j->t_first ? ns * (j->t_end - j->t_first) : 0)));
}

void srv_frames_ollama(srv_stream *st, json_t *frames, const srv_job *j, const char *text, size_t n, const srv_tokinfo *toks, size_t n_toks, bool done) {
    bool chat = st->fmt == SRV_FMT_OLLAMA_CHAT;
    if (n) json_array_append_new(frames, record(st->srv, chat, text, n, false));
    if (!done) return;
    json_t *o = record(st->srv, chat, "", 0, true);
    add_counts(o, j);
    json_array_append_new(frames, o);
}

/* A string field of /api/generate: *out is NULL when absent or null, else the string (without NUL bytes). */
static bool string_field(json_t *body, const char *name, const char **out, srv_response *rs) {
    json_t *v = json_object_get(body, name);
    *out = NULL;
    if (!v || json_is_null(v)) return true;
    if (!json_is_string(v) || strlen(json_string_value(v)) != json_string_length(v)) {
        srv_error(rs, 400, name, "%s must be a string without NUL bytes", name);
        return false;
    }
    *out = json_string_value(v);
    return true;
}

/* Ollama's fields kiln serve does not implement: a value other than null, "", [] or {} gets a 400 naming the field,
 * never an answer that silently ignored it. */
static const struct {
    const char *name;
    bool generate, chat; /* the routes that take it */
    const char *why;
} UNSUPPORTED[] = {
    {"template", true, false, "a Go template overriding the model's; kiln serve formats prompts with the model's chat template only"},
    {"tools", false, true, "function calling is not supported by kiln serve"},
    {"images", true, false, "kiln serve's models take text only"},
    {"suffix", true, false, "fill-in-the-middle is not supported by kiln serve"},
    {"context", true, false, "the deprecated context of a previous answer is not supported: send the conversation to /api/chat"},
};

static bool supported(json_t *body, bool chat, srv_response *rs) {
    for (size_t i = 0; i < sizeof UNSUPPORTED / sizeof *UNSUPPORTED; i++) {
        json_t *v = json_object_get(body, UNSUPPORTED[i].name);
        if (!(chat ? UNSUPPORTED[i].chat : UNSUPPORTED[i].generate) || !v || json_is_null(v)) continue;
        if ((json_is_string(v) && !json_string_length(v)) || (json_is_array(v) && !json_array_size(v)) || (json_is_object(v) && !json_object_size(v))) continue;
        srv_error(rs, 400, UNSUPPORTED[i].name, "%s is not supported: %s", UNSUPPORTED[i].name, UNSUPPORTED[i].why);
        return false;
    }
    return true;
}

/* /api/generate's prompt p (a string, or NULL when absent) into token ids: in the chat template as a user message,
 * after the system message `system` when one is given, unless raw is true (then the text as it is, as /completion
 * takes it). An empty prompt leaves t empty (no tokens): the caller's "load" answer. `system` with raw is refused,
 * since raw applies no formatting to place it in. */
static bool generate_prompt(srv_server *s, json_t *body, json_t *p, kiln_tokens *t, srv_response *rs) {
    json_t *v = json_object_get(body, "raw");
    const char *sys;
    if (v && !json_is_null(v) && !json_is_boolean(v)) {
        srv_error(rs, 400, "raw", "raw must be a boolean");
        return false;
    }
    bool raw = json_is_true(v);
    if (!string_field(body, "system", &sys, rs)) return false;
    if (raw && sys && *sys) {
        srv_error(rs, 400, "system", "system cannot be used with raw: true, which applies no template to put it in");
        return false;
    }
    if (!json_string_length(p)) return true;
    if (raw) return srv_parse_prompt(s, p, "prompt", t, rs);
    if (strlen(json_string_value(p)) != json_string_length(p)) {
        srv_error(rs, 400, "prompt", "prompt holds a NUL byte");
        return false;
    }
    kiln_chat_msg m[2] = {{"system", sys}, {"user", json_string_value(p)}};
    bool with_sys = sys && *sys; /* "" is no system message, as Ollama's */
    if (kiln_chat_tokenize(&s->tmpl, s->tok, m + !with_sys, 1 + with_sys, true, t)) {
        srv_error(rs, 400, "prompt", "prompt: %s", kiln_last_error());
        return false;
    }
    return true;
}

static void ollama_route(srv_server *s, const srv_request *rq, srv_response *rs, bool chat) {
    json_t *body = srv_body_object(rq, rs), *v;
    srv_job *j = srv_job_new();
    kiln_tokens t = {0};
    bool stream = true; /* Ollama streams unless told not to */
    if (!body || !j) {
        if (!j) srv_error(rs, 500, NULL, "out of memory");
        goto out;
    }
    if (!supported(body, chat, rs)) goto out;
    if ((v = json_object_get(body, "options")) && !json_is_null(v)) {
        if (!json_is_object(v)) {
            srv_error(rs, 400, "options", "options must be an object");
            goto out;
        }
        if (!srv_parse_gen(s, v, j, rs)) goto out;
    }
    /* structured output: "json" (any JSON object) or a JSON Schema */
    if ((v = json_object_get(body, "format")) && !json_is_null(v) && !(json_is_string(v) && !json_string_length(v))) {
        json_t *any = json_is_string(v) && strcmp(json_string_value(v), "json") == 0 ? json_pack("{s:s}", "type", "object") : NULL;
        if (json_is_string(v) && !any) {
            srv_error(rs, 400, "format", "format must be \"json\" or a JSON Schema");
            goto out;
        }
        const bool ok = srv_set_schema(any ? any : v, "format", j, rs);
        json_decref(any);
        if (!ok) goto out;
    }
    if ((v = json_object_get(body, "stream")) && !json_is_null(v)) {
        if (!json_is_boolean(v)) {
            srv_error(rs, 400, "stream", "stream must be a boolean");
            goto out;
        }
        stream = json_is_true(v);
    }
    if (chat) {
        if (!srv_parse_messages(s, json_object_get(body, "messages"), &t, rs)) goto out;
    } else {
        json_t *p = json_object_get(body, "prompt");
        if (p && !json_is_null(p) && !json_is_string(p)) {
            srv_error(rs, 400, "prompt", "prompt must be a string");
            goto out;
        }
        if (!generate_prompt(s, body, p, &t, rs)) goto out;
        if (t.n == 0) { /* Ollama's answer to an empty prompt: the model is loaded, nothing generated (one object) */
            json_t *o = record(s, false, "", 0, true);
            json_object_set_new(o, "done_reason", json_string("load"));
            srv_json(rs, 200, o);
            goto out;
        }
    }
    j->prompt = t.ids, j->n_prompt = t.n, t.ids = NULL;
    if (!srv_run_job(s, rq, j, stream, chat ? SRV_FMT_OLLAMA_CHAT : SRV_FMT_OLLAMA_GEN, srv_frames_ollama, NULL, rs)) goto out;
    if (stream) {
        j = NULL;
        goto out;
    }
    json_t *o = record(s, chat, j->text, j->n_text, true);
    add_counts(o, j);
    srv_json(rs, 200, o);
out:
    kiln_tokens_free(&t);
    srv_job_release(j);
    json_decref(body);
}

void srv_route_ollama_generate(srv_server *s, const srv_request *rq, srv_response *rs) { ollama_route(s, rq, rs, false); }
void srv_route_ollama_chat(srv_server *s, const srv_request *rq, srv_response *rs) { ollama_route(s, rq, rs, true); }

void srv_route_ollama_tags(srv_server *s, const srv_request *rq, srv_response *rs) {
    struct stat sb;
    json_int_t size = s->o.model_path && stat(s->o.model_path, &sb) == 0 ? (json_int_t)sb.st_size : 0;
    char at[64];
    created_at(at, sizeof at);
    kiln_model_info mi;
    kiln_model_get_info(s->m, &mi);
    srv_json(rs, 200, json_pack("{s:[{s:s,s:s,s:s,s:I,s:s,s:{s:s,s:s,s:I}}]}", "models", "name", s->model_name, "model", s->model_name,
                                "modified_at", at, "size", size, "digest", "", "details", "format", "gguf", "family", mi.arch,
                                "parameter_count", (json_int_t)mi.n_params));
}
