/* test_serve_unit.c: kiln serve's request handling (src/serve/) without a socket: srv_handle on the bundled model
 * (models/shakespeare.gguf, run from the repo root) for every route's happy path and each error class (auth, 404,
 * 405, 413, malformed JSON, a field of the wrong type or out of range, a prompt too long, n != 1, a bad slot file
 * name), greedy output against a plain kiln_session's greedy decode, stop strings, streams read through
 * srv_stream_read, logprobs, the bounded queue's 503 and a cancelled stream freeing its slot, two slots driven by two
 * threads; and the text helpers (UTF-8 and stop-string holdback) on their own. */
#include "kiln.h"
#include "serve/serve.h"
#include "test.h"

#include <arpa/inet.h>
#include <jansson.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#define MODEL "models/shakespeare.gguf"

static kiln_model *model;

/* ---------------------------------------------------------------- the text helpers */

static void test_utf8_tail(void) {
    CHECK(srv_utf8_incomplete_tail("abc", 3) == 0);
    CHECK(srv_utf8_incomplete_tail("a\xc3", 2) == 1);          /* the lead of a 2-byte sequence */
    CHECK(srv_utf8_incomplete_tail("a\xc3\xa9", 3) == 0);      /* é, whole */
    CHECK(srv_utf8_incomplete_tail("\xe2\x82", 2) == 2);       /* 2 of €'s 3 bytes */
    CHECK(srv_utf8_incomplete_tail("\xe2\x82\xac", 3) == 0);
    CHECK(srv_utf8_incomplete_tail("\xf0\x9f\x98", 3) == 3);   /* 3 of an emoji's 4 */
    CHECK(srv_utf8_incomplete_tail("x\x80", 2) == 0);          /* a stray continuation byte is not held */
}

static void test_stop_holdback(void) {
    char *stops[] = {"</end>", "STOP"};
    CHECK(srv_stop_holdback("hello </e", 9, stops, 2) == 3);
    CHECK(srv_stop_holdback("hello S", 7, stops, 2) == 1);
    CHECK(srv_stop_holdback("hello", 5, stops, 2) == 0);
    CHECK(srv_stop_holdback("<", 1, stops, 2) == 1);
    CHECK(srv_stop_holdback("abcSTO", 6, stops, 2) == 3);
}

static void test_utf8_sanitize(void) {
    size_t n;
    char *s = srv_utf8_sanitize("a\xff" "b\xc3\xa9\xed\xa0\x80", 8, &n);
    CHECK(s && n == strlen(s));
    CHECK(strcmp(s, "a\xef\xbf\xbd" "b\xc3\xa9\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd") == 0, "got '%s'", s);
    free(s);
}

/* ---------------------------------------------------------------- a server without a socket */

/* spec: speculative decoding's settings, NULL for none. */
static srv_server *server_spec(int n_slots, int64_t n_ctx_slot, const srv_opts *o, int queue, const srv_spec_params *spec) {
    kiln_context_params cp = {.s = {.n_ctx = n_ctx_slot, .n_batch = 64, .n_threads = 1}, .n_seq = n_slots};
    kiln_context *c = NULL;
    srv_server *s = NULL;
    srv_sched_params sp = {.queue_max = queue};
    if (spec) sp.spec = *spec;
    srv_opts oo = *o;
    oo.model_path = MODEL;
    if (kiln_context_new(model, &cp, &c)) return NULL;
    if (srv_server_new(model, c, &oo, &sp, &s)) {
        kiln_context_free(c);
        return NULL;
    }
    return s;
}

static srv_server *server_with(int n_slots, int64_t n_ctx_slot, const srv_opts *o, int queue) {
    return server_spec(n_slots, n_ctx_slot, o, queue, NULL);
}

static srv_response req(srv_server *s, const char *method, const char *path, const char *body, const char *auth) {
    srv_kv h[1] = {{"authorization", auth}};
    srv_kv args[1];
    char p[256];
    snprintf(p, sizeof p, "%s", path);
    char *q = strchr(p, '?');
    size_t n_args = 0;
    if (q) {
        *q++ = 0;
        char *eq = strchr(q, '=');
        if (eq) *eq = 0, args[0] = (srv_kv){q, eq + 1}, n_args = 1;
    }
    srv_request rq = {.method = method, .path = p, .headers = h, .n_headers = auth ? 1 : 0, .args = args, .n_args = n_args, .body = body,
                      .n_body = body ? strlen(body) : 0};
    srv_response rs;
    srv_handle(s, &rq, &rs);
    return rs;
}

static json_t *parse(const srv_response *rs) { return rs->body ? json_loadb(rs->body, rs->n_body, 0, NULL) : NULL; }

/* The error's param ("" for null) of an error response. */
static const char *err_param(json_t *j) {
    json_t *p = json_object_get(json_object_get(j, "error"), "param");
    return json_is_string(p) ? json_string_value(p) : "";
}

/* Everything a stream writes, to its end. */
static char *drain(srv_stream *st) {
    size_t n = 0, cap = 1 << 16;
    char *out = malloc(cap);
    for (;;) {
        if (n + 4096 > cap) out = realloc(out, cap *= 2);
        long k = srv_stream_read(st, out + n, 4096, NULL, NULL);
        if (k <= 0) break;
        n += (size_t)k;
    }
    out[n] = 0;
    return out;
}

/* Greedy text of the prompt t (token ids; freed) from a plain session: the reference the server's greedy output
 * must equal. */
static char *greedy_reference_ids(kiln_tokens t, int n_predict) {
    const kiln_tokenizer *tok = kiln_model_tokenizer(model);
    kiln_session_params sp = {.n_ctx = 128, .n_threads = 1};
    kiln_session *sess;
    if (!t.n || kiln_session_new(model, &sp, &sess)) {
        kiln_tokens_free(&t);
        return NULL;
    }
    int32_t next;
    kiln_tokens gen = {0};
    kiln_status st = kiln_session_eval_argmax(sess, t.ids, t.n, &next);
    for (int i = 0; !st && i < n_predict; i++) {
        if (next == kiln_tokenizer_eos(tok)) break;
        gen.ids = realloc(gen.ids, (gen.n + 1) * sizeof *gen.ids);
        gen.ids[gen.n++] = next;
        if (i + 1 < n_predict) st = kiln_session_eval_argmax(sess, &next, 1, &next);
    }
    char *text = NULL;
    size_t len;
    if (!st) st = kiln_tokenizer_decode(tok, gen.ids, gen.n, false, &text, &len);
    kiln_session_free(sess);
    kiln_tokens_free(&t);
    kiln_tokens_free(&gen);
    return st ? NULL : text;
}

/* The same for a prompt's text, as /completion tokenizes it (BOS added, special tokens parsed). */
static char *greedy_reference(const char *prompt, int n_predict) {
    kiln_tokens t = {0};
    if (kiln_tokenizer_encode(kiln_model_tokenizer(model), prompt, strlen(prompt), true, true, &t)) return NULL;
    return greedy_reference_ids(t, n_predict);
}

/* The same for messages in the server's template (chatml: the bundled model has none of its own). */
static char *greedy_reference_chat(const kiln_chat_msg *msgs, size_t n, int n_predict) {
    kiln_chat_template tmpl;
    kiln_tokens t = {0};
    if (kiln_chat_template_from_name("chatml", model, &tmpl) || kiln_chat_tokenize(&tmpl, kiln_model_tokenizer(model), msgs, n, true, &t)) return NULL;
    return greedy_reference_ids(t, n_predict);
}

static srv_server *srv2; /* 2 slots of 128 positions, no key, metrics on, slot files in /tmp */
static char slot_dir[64];

static void test_routes_errors(void) {
    srv_response r = req(srv2, "GET", "/nope", NULL, NULL);
    json_t *j = parse(&r);
    CHECK(r.status == 404 && json_is_object(json_object_get(j, "error")));
    json_decref(j), srv_response_free(&r);
    r = req(srv2, "GET", "/completion", NULL, NULL);
    CHECK(r.status == 405);
    srv_response_free(&r);
    const struct {
        const char *path, *body, *param;
    } bad[] = {
        {"/completion", "{\"prompt\": \"hi\",", ""},                           /* malformed */
        {"/completion", "[1, 2]", ""},                                         /* not an object */
        {"/completion", "{\"prompt\": 5}", "prompt"},                          /* wrong type */
        {"/completion", "{\"prompt\": \"hi\", \"n_predict\": \"3\"}", "n_predict"},
        {"/completion", "{\"prompt\": \"hi\", \"top_p\": 2}", "top_p"},        /* out of range */
        {"/completion", "{\"prompt\": \"hi\", \"temperature\": -1}", "temperature"},
        {"/completion", "{\"prompt\": \"hi\", \"stop\": [1]}", "stop"},
        {"/completion", "{\"prompt\": \"hi\", \"id_slot\": 7}", "id_slot"},
        {"/completion", "{\"prompt\": [1, 99999999]}", "prompt"},              /* a token id outside the vocab */
        {"/completion", "{\"prompt\": []}", "prompt"},                        /* no tokens */
        {"/completion", "{\"prompt\": \"hi\", \"cache_prompt\": 1}", "cache_prompt"},
        {"/v1/chat/completions", "{\"messages\": []}", "messages"},
        {"/v1/chat/completions", "{\"messages\": [{\"role\": \"wizard\", \"content\": \"x\"}]}", "messages"},
        {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"n\": 2}", "n"},
        {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"logprobs\": 3}", "logprobs"},
        {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"stream\": \"yes\"}", "stream"},
        {"/v1/completions", "{\"prompt\": \"x\", \"max_tokens\": -5}", "max_tokens"},
        {"/tokenize", "{\"content\": 3}", "content"},
        {"/detokenize", "{\"tokens\": \"abc\"}", "tokens"},
        {"/api/generate", "{\"prompt\": \"x\", \"options\": {\"top_k\": 1.5}}", "top_k"},
        {"/api/generate", "{\"prompt\": 5}", "prompt"},
        {"/api/generate", "{\"prompt\": \"x\", \"system\": 5}", "system"},
        {"/api/generate", "{\"prompt\": \"x\", \"raw\": \"yes\"}", "raw"},
        {"/api/generate", "{\"prompt\": \"x\", \"raw\": true, \"system\": \"Be brief.\"}", "system"}, /* raw has no template for it */
        {"/api/generate", "{\"prompt\": \"x\", \"template\": \"{{ .Prompt }}\"}", "template"}, /* no Go templates */
        {"/api/generate", "{\"prompt\": \"x\", \"template\": 3}", "template"},
        {"/api/generate", "{\"prompt\": \"x\", \"format\": \"yaml\"}", "format"}, /* "json" or a schema */
        {"/api/generate", "{\"prompt\": \"x\", \"images\": [\"aGk=\"]}", "images"},
        {"/api/generate", "{\"prompt\": \"x\", \"suffix\": \"end\"}", "suffix"},
        {"/api/generate", "{\"prompt\": \"x\", \"context\": [1, 2]}", "context"},
        {"/api/chat", "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"format\": {\"type\": \"tuple\"}}", "format"},
        {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"response_format\": {\"type\": \"xml\"}}", "response_format"},
        {"/completion", "{\"prompt\": \"x\", \"json_schema\": {\"not\": {}}}", "json_schema"},
        {"/completion", "{\"prompt\": \"x\", \"grammar\": \"root ::= nothing\"}", "grammar"},
        {"/api/chat", "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": \"function\"}]}", "tools"},
        {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]}", "tools"},
        {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": \"f\"}", "tools"},
        {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tool_choice\": \"required\"}", "tool_choice"},
        {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"f\"}}}", "tool_choice"},
        {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"functions\": [{\"name\": \"f\"}]}", "functions"},
        {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"function_call\": {\"name\": \"f\"}}", "function_call"},
        {"/slots/0?action=save", "{\"filename\": \"../escape.bin\"}", "filename"},
        {"/slots/0?action=save", "{\"filename\": \"a/b\"}", "filename"},
        {"/slots/0?action=fly", "{}", "action"},
        {"/slots/9?action=erase", "{}", "id_slot"},
        {"/completion", "{\"prompt\": \"x\", \"speculative.n_max\": -1}", "speculative.n_max"},
        {"/completion", "{\"prompt\": \"x\", \"speculative.n_max\": \"4\"}", "speculative.n_max"},
        {"/completion", "{\"prompt\": \"x\", \"speculative.n_min\": 1.5}", "speculative.n_min"},
        {"/completion", "{\"prompt\": \"x\", \"speculative.n_max\": 2, \"speculative.n_min\": 3}", "speculative.n_min"},
        {"/v1/completions", "{\"prompt\": \"x\", \"speculative.n_max\": 5000}", "speculative.n_max"},
        {"/api/generate", "{\"prompt\": \"x\", \"options\": {\"speculative.n_min\": -2}}", "speculative.n_min"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        r = req(srv2, "POST", bad[i].path, bad[i].body, NULL);
        j = parse(&r);
        json_t *e = json_object_get(j, "error");
        CHECK(r.status == 400, "%s %s: status %d", bad[i].path, bad[i].body, r.status);
        CHECK(json_is_string(json_object_get(e, "message")) && strcmp(json_string_value(json_object_get(e, "type")), "invalid_request_error") == 0);
        CHECK(strcmp(err_param(j), bad[i].param) == 0, "%s: param '%s', expected '%s'", bad[i].body, err_param(j), bad[i].param);
        json_decref(j), srv_response_free(&r);
    }
    /* a prompt longer than the slot: 400 naming both counts */
    char big[4096] = "{\"prompt\": [";
    for (int i = 0; i < 200; i++) strcat(big, i ? ",5" : "5");
    strcat(big, "]}");
    r = req(srv2, "POST", "/completion", big, NULL);
    j = parse(&r);
    const char *msg = json_string_value(json_object_get(json_object_get(j, "error"), "message"));
    CHECK(r.status == 400 && msg && strstr(msg, "200") && strstr(msg, "128"), "%d %s", r.status, msg ? msg : "");
    json_decref(j), srv_response_free(&r);
}

static void test_auth_and_limits(void) {
    srv_opts o = {.api_key = "s3cret", .max_body = 256};
    srv_server *s = server_with(1, 64, &o, 0);
    CHECK(s);
    srv_response r = req(s, "GET", "/health", NULL, NULL);
    CHECK(r.status == 200, "health needs no key");
    srv_response_free(&r);
    const char *keys[] = {NULL, "Bearer wrong", "Bearer s3cre", "Bearer s3cret!", "s3cret"};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
        r = req(s, "GET", "/v1/models", NULL, keys[i]);
        json_t *j = parse(&r);
        CHECK(r.status == 401 && strcmp(json_string_value(json_object_get(json_object_get(j, "error"), "type")), "authentication_error") == 0,
              "key '%s': %d", keys[i] ? keys[i] : "(none)", r.status);
        json_decref(j), srv_response_free(&r);
    }
    r = req(s, "GET", "/v1/models", NULL, "Bearer s3cret");
    json_t *j = parse(&r);
    CHECK(r.status == 200 && strcmp(json_string_value(json_object_get(json_array_get(json_object_get(j, "data"), 0), "id")), "shakespeare.gguf") == 0);
    json_decref(j), srv_response_free(&r);
    char body[400];
    memset(body, ' ', sizeof body - 1), body[sizeof body - 1] = 0;
    r = req(s, "POST", "/tokenize", body, "Bearer s3cret");
    CHECK(r.status == 413, "a body over the limit: %d", r.status);
    srv_response_free(&r);
    srv_server_free(s);
}

static void test_completion_greedy_and_stop(void) {
    char *ref = greedy_reference("ROMEO:", 24);
    CHECK(ref && strlen(ref) > 8);
    srv_response r = req(srv2, "POST", "/completion", "{\"prompt\": \"ROMEO:\", \"n_predict\": 24, \"temperature\": 0}", NULL);
    json_t *j = parse(&r);
    const char *content = json_string_value(json_object_get(j, "content"));
    CHECK(r.status == 200 && content && strcmp(content, ref) == 0, "server '%s' vs session '%s'", content ? content : "", ref);
    CHECK(json_integer_value(json_object_get(j, "tokens_predicted")) == 24 && strcmp(json_string_value(json_object_get(j, "stop_type")), "limit") == 0);
    json_decref(j), srv_response_free(&r);
    /* a stop string from the middle of the reference: the content ends right before it */
    char stop[8];
    snprintf(stop, sizeof stop, "%.3s", ref + 6);
    char body[256];
    snprintf(body, sizeof body, "{\"prompt\": \"ROMEO:\", \"n_predict\": 24, \"temperature\": 0, \"stop\": [\"zzzz\", \"%s\"]}", stop);
    r = req(srv2, "POST", "/completion", body, NULL);
    j = parse(&r);
    content = json_string_value(json_object_get(j, "content"));
    size_t cut = (size_t)(strstr(ref, stop) - ref);
    CHECK(r.status == 200 && content && strlen(content) == cut && strncmp(content, ref, cut) == 0, "stop '%s': '%s'", stop, content ? content : "");
    CHECK(strcmp(json_string_value(json_object_get(j, "stop_type")), "word") == 0 && strcmp(json_string_value(json_object_get(j, "stopping_word")), stop) == 0);
    json_decref(j), srv_response_free(&r);
    /* the same streamed: the deltas add up to the same text and no delta holds the stop string */
    snprintf(body, sizeof body, "{\"prompt\": \"ROMEO:\", \"n_predict\": 24, \"temperature\": 0, \"stream\": true, \"stop\": \"%s\"}", stop);
    r = req(srv2, "POST", "/completion", body, NULL);
    CHECK(r.status == 200 && r.stream);
    char *all = drain(r.stream), acc[512] = "";
    srv_response_free(&r);
    int last_stop = 0;
    for (char *line = strtok(all, "\n"); line; line = strtok(NULL, "\n")) {
        CHECK(strncmp(line, "data: ", 6) == 0, "line '%s'", line);
        json_t *f = json_loads(line + 6, 0, NULL);
        CHECK(f);
        strncat(acc, json_string_value(json_object_get(f, "content")), sizeof acc - strlen(acc) - 1);
        last_stop = json_is_true(json_object_get(f, "stop"));
        json_decref(f);
    }
    free(all);
    CHECK(last_stop && strlen(acc) == cut && strncmp(acc, ref, cut) == 0, "streamed '%s'", acc);
    free(ref);
}

/* Prompt lookup in the scheduler: the greedy text of a repetitive prompt is a plain session's, with drafts taken, on
 * 2 slots at once; speculative.n_max 0 turns it off (no draft_n in timings); the request's settings show in
 * generation_settings. */
static void test_spec_lookup(void) {
    const char *prompt = "KING HENRY:\nO God, O God, O God, O God! O God, O God, O God, O God!";
    char *ref = greedy_reference(prompt, 40);
    CHECK(ref && strlen(ref) > 8);
    srv_opts o = {.metrics = true};
    srv_server *s = server_spec(2, 128, &o, 0, &(srv_spec_params){.lookup = true, .draft_max = 8});
    CHECK(s, "%s", kiln_last_error());
    if (!s || !ref) return free(ref);
    char body[256];
    snprintf(body, sizeof body, "{\"prompt\": \"KING HENRY:\\nO God, O God, O God, O God! O God, O God, O God, O God!\", \"n_predict\": 40, "
                                "\"temperature\": 0, \"speculative.n_min\": 1}");
    srv_response r = req(s, "POST", "/completion", body, NULL);
    json_t *j = parse(&r), *t = json_object_get(j, "timings");
    const char *content = json_string_value(json_object_get(j, "content"));
    CHECK(r.status == 200 && content && strcmp(content, ref) == 0, "speculative '%s' vs session '%s'", content ? content : "", ref);
    json_int_t n = json_integer_value(json_object_get(t, "draft_n")), a = json_integer_value(json_object_get(t, "draft_n_accepted"));
    CHECK(n > 0 && a > 0 && a <= n, "draft_n %lld, accepted %lld", (long long)n, (long long)a);
    json_t *gs = json_object_get(j, "generation_settings");
    CHECK(json_integer_value(json_object_get(gs, "speculative.n_max")) == 8 && json_integer_value(json_object_get(gs, "speculative.n_min")) == 1);
    srv_metrics m;
    srv_sched_metrics(s->sched, &m);
    CHECK(m.draft_tokens == n && m.draft_accepted == a, "metrics %lld %lld", (long long)m.draft_tokens, (long long)m.draft_accepted);
    json_decref(j), srv_response_free(&r);
    snprintf(body, sizeof body, "{\"prompt\": \"KING HENRY:\\nO God, O God, O God, O God! O God, O God, O God, O God!\", \"n_predict\": 40, "
                                "\"temperature\": 0, \"speculative.n_max\": 0}");
    r = req(s, "POST", "/completion", body, NULL);
    j = parse(&r), t = json_object_get(j, "timings");
    content = json_string_value(json_object_get(j, "content"));
    CHECK(r.status == 200 && content && strcmp(content, ref) == 0 && !json_object_get(t, "draft_n"));
    json_decref(j), srv_response_free(&r);
    srv_server_free(s);
    free(ref);
}

static void test_oai_chat_and_stream(void) {
    const char *body = "{\"model\": \"x\", \"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \"Hello\"}],"
                       " \"max_tokens\": 12, \"temperature\": 0, \"logprobs\": true, \"top_logprobs\": 3}";
    srv_response r = req(srv2, "POST", "/v1/chat/completions", body, NULL);
    json_t *j = parse(&r);
    CHECK(r.status == 200 && strcmp(json_string_value(json_object_get(j, "object")), "chat.completion") == 0);
    json_t *c = json_array_get(json_object_get(j, "choices"), 0), *u = json_object_get(j, "usage");
    const char *content = json_string_value(json_object_get(json_object_get(c, "message"), "content"));
    CHECK(content && strcmp(json_string_value(json_object_get(c, "finish_reason")), "length") == 0);
    /* the prompt is the template's tokens: the same count kiln_chat_tokenize gives */
    kiln_chat_template t;
    kiln_tokens ids = {0};
    kiln_chat_msg msgs[] = {{"system", "Be brief."}, {"user", "Hello"}};
    CHECK(kiln_chat_template_from_name("chatml", model, &t) == KILN_OK);
    CHECK(kiln_chat_tokenize(&t, kiln_model_tokenizer(model), msgs, 2, true, &ids) == KILN_OK);
    CHECK(json_integer_value(json_object_get(u, "prompt_tokens")) == (json_int_t)ids.n && json_integer_value(json_object_get(u, "completion_tokens")) == 12);
    kiln_tokens_free(&ids);
    json_t *lp = json_object_get(json_object_get(c, "logprobs"), "content");
    CHECK(json_array_size(lp) == 12);
    for (size_t i = 0; i < 12; i++) { /* greedy: the chosen token is the most likely one */
        json_t *e = json_array_get(lp, i), *top = json_object_get(e, "top_logprobs");
        CHECK(json_array_size(top) == 3);
        double chosen = json_real_value(json_object_get(e, "logprob")), best = json_real_value(json_object_get(json_array_get(top, 0), "logprob"));
        CHECK(chosen <= 0 && fabs(chosen - best) < 1e-6, "token %zu: %g vs %g", i, chosen, best);
    }
    char *ref = strdup(content);
    json_decref(j), srv_response_free(&r);
    /* streamed: role first, deltas equal the whole, a finish chunk, usage last, [DONE] */
    const char *sbody = "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \"Hello\"}],"
                        " \"max_tokens\": 12, \"temperature\": 0, \"stream\": true, \"stream_options\": {\"include_usage\": true}}";
    r = req(srv2, "POST", "/v1/chat/completions", sbody, NULL);
    CHECK(r.status == 200 && r.stream && strcmp(r.content_type, "text/event-stream") == 0);
    char *all = drain(r.stream), acc[1024] = "";
    srv_response_free(&r);
    CHECK(strlen(all) > 20 && strcmp(all + strlen(all) - 14, "data: [DONE]\n\n") == 0);
    int n_chunks = 0, usage_seen = 0, finish_seen = 0;
    for (char *line = strtok(all, "\n"); line; line = strtok(NULL, "\n")) {
        if (strcmp(line, "data: [DONE]") == 0) break;
        json_t *f = json_loads(line + 6, 0, NULL);
        CHECK(f && strcmp(json_string_value(json_object_get(f, "object")), "chat.completion.chunk") == 0);
        json_t *ch = json_array_get(json_object_get(f, "choices"), 0);
        if (n_chunks++ == 0) CHECK(strcmp(json_string_value(json_object_get(json_object_get(ch, "delta"), "role")), "assistant") == 0);
        const char *d = json_string_value(json_object_get(json_object_get(ch, "delta"), "content"));
        if (d) strncat(acc, d, sizeof acc - strlen(acc) - 1);
        if (json_is_string(json_object_get(ch, "finish_reason"))) finish_seen = 1;
        if (json_object_get(f, "usage")) usage_seen = json_integer_value(json_object_get(json_object_get(f, "usage"), "completion_tokens")) == 12;
        json_decref(f);
    }
    free(all);
    CHECK(strcmp(acc, ref) == 0, "streamed '%s' vs '%s'", acc, ref);
    CHECK(finish_seen && usage_seen);
    /* no tools offered and no call forced: accepted, the same answer */
    r = req(srv2, "POST", "/v1/chat/completions",
            "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \"Hello\"}],"
            " \"max_tokens\": 12, \"temperature\": 0, \"tools\": [], \"tool_choice\": \"auto\", \"functions\": null, \"function_call\": \"none\"}", NULL);
    j = parse(&r);
    content = json_string_value(json_object_get(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message"), "content"));
    CHECK(r.status == 200 && content && strcmp(content, ref) == 0, "%d %s", r.status, r.body ? r.body : "");
    json_decref(j), srv_response_free(&r);
    free(ref);
}

static void test_llama_routes(void) {
    srv_response r = req(srv2, "POST", "/tokenize", "{\"content\": \"ROMEO: hi\", \"with_pieces\": false}", NULL);
    json_t *j = parse(&r), *toks = json_object_get(j, "tokens");
    CHECK(r.status == 200 && json_array_size(toks) > 1);
    json_t *req_body = json_pack("{s:O}", "tokens", toks);
    char *body = json_dumps(req_body, 0);
    json_decref(req_body);
    json_decref(j), srv_response_free(&r);
    r = req(srv2, "POST", "/detokenize", body, NULL);
    free(body);
    j = parse(&r);
    CHECK(r.status == 200 && strcmp(json_string_value(json_object_get(j, "content")), "ROMEO: hi") == 0, "%s", r.body);
    json_decref(j), srv_response_free(&r);
    r = req(srv2, "POST", "/apply-template", "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}]}", NULL);
    j = parse(&r);
    const char *p = json_string_value(json_object_get(j, "prompt"));
    CHECK(r.status == 200 && p && strstr(p, "<|im_start|>user\nHi<|im_end|>") && strstr(p, "<|im_start|>assistant\n"), "%s", p ? p : "");
    json_decref(j), srv_response_free(&r);
    r = req(srv2, "GET", "/props", NULL, NULL);
    j = parse(&r);
    CHECK(r.status == 200 && json_integer_value(json_object_get(j, "total_slots")) == 2 &&
          json_integer_value(json_object_get(json_object_get(j, "default_generation_settings"), "n_ctx")) == 128);
    json_decref(j), srv_response_free(&r);
    r = req(srv2, "GET", "/slots", NULL, NULL);
    j = parse(&r);
    CHECK(r.status == 200 && json_array_size(j) == 2 && json_is_false(json_object_get(json_array_get(j, 1), "is_processing")));
    json_decref(j), srv_response_free(&r);
    r = req(srv2, "GET", "/metrics", NULL, NULL);
    CHECK(r.status == 200 && r.body && strstr(r.body, "# TYPE llamacpp:tokens_predicted_total counter") && strstr(r.body, "llamacpp:requests_processing 0"));
    srv_response_free(&r);
    r = req(srv2, "GET", "/api/tags", NULL, NULL);
    j = parse(&r);
    CHECK(r.status == 200 && json_array_size(json_object_get(j, "models")) == 1);
    json_decref(j), srv_response_free(&r);
    r = req(srv2, "POST", "/completion", "{\"prompt\": \"ROMEO:\", \"n_predict\": 3, \"n_probs\": 2, \"temperature\": 0}", NULL);
    j = parse(&r);
    json_t *probs = json_object_get(j, "completion_probabilities");
    CHECK(r.status == 200 && json_array_size(probs) == 3 && json_array_size(json_object_get(json_array_get(probs, 0), "top_logprobs")) == 2);
    json_decref(j), srv_response_free(&r);
}

static void test_ollama_routes(void) {
    srv_response r = req(srv2, "POST", "/api/generate", "{\"model\": \"m\", \"prompt\": \"ROMEO:\", \"raw\": true, \"options\": {\"num_predict\": 6, \"temperature\": 0}}", NULL);
    CHECK(r.status == 200 && r.stream && strcmp(r.content_type, "application/x-ndjson") == 0);
    char *all = drain(r.stream), acc[512] = "";
    srv_response_free(&r);
    json_t *last = NULL;
    for (char *line = strtok(all, "\n"); line; line = strtok(NULL, "\n")) {
        json_decref(last);
        last = json_loads(line, 0, NULL);
        CHECK(last, "line '%s'", line);
        strncat(acc, json_string_value(json_object_get(last, "response")), sizeof acc - strlen(acc) - 1);
    }
    free(all);
    CHECK(json_is_true(json_object_get(last, "done")) && json_integer_value(json_object_get(last, "eval_count")) == 6);
    json_decref(last);
    char *ref = greedy_reference("ROMEO:", 6);
    CHECK(ref && strcmp(acc, ref) == 0, "'%s' vs '%s'", acc, ref ? ref : "");
    free(ref);
    /* not raw: the prompt is a user message in the template, after the system message when one is given */
    const struct {
        const char *body;
        kiln_chat_msg msgs[2];
        size_t n;
    } tmpl[] = {
        {"{\"prompt\": \"ROMEO:\", \"stream\": false, \"options\": {\"num_predict\": 6, \"temperature\": 0}}", {{"user", "ROMEO:"}}, 1},
        {"{\"prompt\": \"Hello\", \"system\": \"Be brief.\", \"raw\": false, \"stream\": false, \"options\": {\"num_predict\": 6, \"temperature\": 0}}",
         {{"system", "Be brief."}, {"user", "Hello"}}, 2},
    };
    for (size_t i = 0; i < sizeof tmpl / sizeof *tmpl; i++) {
        r = req(srv2, "POST", "/api/generate", tmpl[i].body, NULL);
        json_t *j = parse(&r);
        const char *got = json_string_value(json_object_get(j, "response"));
        ref = greedy_reference_chat(tmpl[i].msgs, tmpl[i].n, 6);
        CHECK(r.status == 200 && json_is_true(json_object_get(j, "done")) && json_integer_value(json_object_get(j, "eval_count")) == 6, "%s", r.body);
        CHECK(got && ref && strcmp(got, ref) == 0, "%s: '%s' vs '%s'", tmpl[i].body, got ? got : "", ref ? ref : "");
        free(ref);
        json_decref(j), srv_response_free(&r);
    }
    /* an empty prompt: Ollama's "load" answer, one object, nothing generated */
    r = req(srv2, "POST", "/api/generate", "{\"model\": \"m\"}", NULL);
    json_t *j = parse(&r);
    CHECK(r.status == 200 && !r.stream && json_is_true(json_object_get(j, "done")), "%d %s", r.status, r.body ? r.body : "");
    CHECK(strcmp(json_string_value(json_object_get(j, "done_reason")) ? json_string_value(json_object_get(j, "done_reason")) : "", "load") == 0 &&
          strcmp(json_string_value(json_object_get(j, "response")) ? json_string_value(json_object_get(j, "response")) : "x", "") == 0, "%s", r.body);
    json_decref(j), srv_response_free(&r);
    r = req(srv2, "POST", "/api/chat", "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"stream\": false, \"format\": \"\", \"tools\": [],"
                                       " \"options\": {\"num_predict\": 4}}", NULL); /* the empty unsupported fields pass */
    j = parse(&r);
    CHECK(r.status == 200 && json_is_true(json_object_get(j, "done")) && json_is_string(json_object_get(json_object_get(j, "message"), "content")));
    json_decref(j), srv_response_free(&r);
}

static void test_slot_files(void) {
    srv_response r = req(srv2, "POST", "/slots/1?action=erase", "{}", NULL);
    CHECK(r.status == 200, "erase: %d", r.status);
    srv_response_free(&r);
    r = req(srv2, "POST", "/completion", "{\"prompt\": \"ROMEO:\", \"n_predict\": 8, \"temperature\": 0, \"id_slot\": 1}", NULL);
    json_t *j = parse(&r);
    char *ref = strdup(json_string_value(json_object_get(j, "content")));
    json_decref(j), srv_response_free(&r);
    r = req(srv2, "POST", "/slots/1?action=save", "{\"filename\": \"s1.bin\"}", NULL);
    j = parse(&r);
    CHECK(r.status == 200 && json_integer_value(json_object_get(j, "n_saved")) > 0, "save: %d %s", r.status, r.body);
    json_decref(j), srv_response_free(&r);
    r = req(srv2, "POST", "/slots/1?action=erase", "{}", NULL);
    srv_response_free(&r);
    r = req(srv2, "POST", "/slots/1?action=restore", "{\"filename\": \"s1.bin\"}", NULL);
    CHECK(r.status == 200, "restore: %d %s", r.status, r.body);
    srv_response_free(&r);
    r = req(srv2, "POST", "/slots/1?action=restore", "{\"filename\": \"missing.bin\"}", NULL);
    CHECK(r.status == 400, "a missing file: %d", r.status);
    srv_response_free(&r);
    free(ref);
}

/* One slot, a queue of one: a stream holds the slot, a second request waits, a third gets 503 with Retry-After;
 * dropping the streams (a client gone) frees the slot. */
static bool slot_busy(srv_server *s, int id) {
    srv_slot_info info[4];
    srv_sched_slots(s->sched, info);
    return info[id].busy;
}

static void test_queue_full_and_cancel(void) {
    srv_opts o = {0};
    srv_server *s = server_with(1, 128, &o, 1);
    CHECK(s);
    const char *body = "{\"prompt\": \"ROMEO:\", \"n_predict\": 120, \"ignore_eos\": true, \"stream\": true}";
    srv_response a = req(s, "POST", "/completion", body, NULL);
    CHECK(a.status == 200 && a.stream);
    for (int i = 0; i < 500 && !slot_busy(s, 0); i++) usleep(2000);
    srv_response b = req(s, "POST", "/completion", body, NULL);
    CHECK(b.status == 200 && b.stream, "queued: %d", b.status);
    srv_response c = req(s, "POST", "/completion", "{\"prompt\": \"ROMEO:\", \"n_predict\": 2}", NULL);
    CHECK(c.status == 503 && c.retry_after > 0, "past the queue: %d", c.status);
    srv_response_free(&c);
    srv_response_free(&b); /* gone while queued */
    srv_response_free(&a); /* gone mid-stream */
    bool freed = false;
    for (int i = 0; i < 1000 && !(freed = !slot_busy(s, 0) && srv_sched_pending(s->sched) == 0); i++) usleep(2000);
    CHECK(freed, "the slot is still busy after its client left");
    srv_metrics m;
    srv_sched_metrics(s->sched, &m);
    CHECK(m.predicted_tokens < 120, "the cancelled stream ran to its end (%lld tokens)", (long long)m.predicted_tokens);
    srv_server_free(s);
}

/* Two threads, two slots, two prompts: each gets its single-client greedy text. */
typedef struct {
    const char *prompt;
    char out[512];
    int status;
} client;

static void *client_main(void *arg) {
    client *c = arg;
    char body[256];
    snprintf(body, sizeof body, "{\"prompt\": \"%s\", \"n_predict\": 40, \"temperature\": 0, \"cache_prompt\": false}", c->prompt);
    srv_response r = req(srv2, "POST", "/completion", body, NULL);
    json_t *j = parse(&r);
    c->status = r.status;
    snprintf(c->out, sizeof c->out, "%s", json_string_value(json_object_get(j, "content")) ? json_string_value(json_object_get(j, "content")) : "");
    json_decref(j), srv_response_free(&r);
    return NULL;
}

static void test_two_slots_threads(void) {
    client cl[2] = {{.prompt = "JULIET:"}, {.prompt = "KING HENRY:"}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, client_main, &cl[i]);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 2; i++) {
        char *ref = greedy_reference(cl[i].prompt, 40);
        CHECK(cl[i].status == 200 && ref && strcmp(cl[i].out, ref) == 0, "%s: '%s' vs '%s'", cl[i].prompt, cl[i].out, ref ? ref : "");
        free(ref);
    }
    /* a repeated prompt reuses its cached prefix */
    srv_response r = req(srv2, "POST", "/v1/completions", "{\"prompt\": \"JULIET:\", \"max_tokens\": 2, \"temperature\": 0}", NULL);
    r = (srv_response_free(&r), req(srv2, "POST", "/v1/completions", "{\"prompt\": \"JULIET:\", \"max_tokens\": 2, \"temperature\": 0}", NULL));
    json_t *j = parse(&r);
    json_t *u = json_object_get(j, "usage");
    CHECK(r.status == 200 && json_integer_value(json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens")) ==
                                 json_integer_value(json_object_get(u, "prompt_tokens")) - 1, "%s", r.body);
    json_decref(j), srv_response_free(&r);
}

/* ---------------------------------------------------------------- the MHD front, over a real socket */

static int dial(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a)) {
        if (fd >= 0) close(fd);
        return -1;
    }
    return fd;
}

/* Sends req and reads until the server closes or cap bytes; returns the bytes read. */
static size_t exchange(int port, const char *rq, char *out, size_t cap) {
    int fd = dial(port);
    if (fd < 0) return 0;
    size_t n = 0;
    if (write(fd, rq, strlen(rq)) == (ssize_t)strlen(rq))
        for (ssize_t k; n + 1 < cap && (k = read(fd, out + n, cap - 1 - n)) > 0;) n += (size_t)k;
    out[n] = 0;
    close(fd);
    return n;
}

static void test_http_front(void) {
    srv_opts o = {.max_body = 1024};
    srv_server *s = server_with(1, 128, &o, 0);
    srv_http *h = NULL;
    int port = 0;
    CHECK(s && srv_http_start(s, "127.0.0.1", 0, &port, &h) == KILN_OK && port > 0);
    char buf[8192];
    exchange(port, "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", buf, sizeof buf);
    CHECK(strncmp(buf, "HTTP/1.1 200", 12) == 0 && strstr(buf, "{\"status\":\"ok\"}"), "%s", buf);
    exchange(port, "POST /tokenize HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 999999\r\n\r\n{}", buf, sizeof buf);
    CHECK(strncmp(buf, "HTTP/1.1 413", 12) == 0, "%s", buf);
    exchange(port, "POST /completion HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 44\r\n\r\n"
                   "{\"prompt\": \"ROMEO:\", \"n_predict\": 3, \"x\": 1}", buf, sizeof buf);
    CHECK(strncmp(buf, "HTTP/1.1 200", 12) == 0 && strstr(buf, "\"tokens_predicted\":3"), "%s", buf);
    /* a stream whose client hangs up after its first bytes: the slot is free again long before 120 tokens */
    const char *body = "{\"prompt\": \"ROMEO:\", \"n_predict\": 120, \"ignore_eos\": true, \"stream\": true}";
    char rq[512];
    snprintf(rq, sizeof rq, "POST /completion HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\n\r\n%s", strlen(body), body);
    int fd = dial(port);
    CHECK(fd >= 0 && write(fd, rq, strlen(rq)) == (ssize_t)strlen(rq));
    ssize_t k = read(fd, buf, 512);
    CHECK(k > 12 && strncmp(buf, "HTTP/1.1 200", 12) == 0);
    close(fd);
    bool freed = false;
    for (int i = 0; i < 1500 && !(freed = srv_sched_pending(s->sched) == 0); i++) usleep(2000);
    srv_metrics m;
    srv_sched_metrics(s->sched, &m);
    CHECK(freed && m.predicted_tokens < 120 + 3, "slot freed %d after %lld tokens", freed, (long long)m.predicted_tokens);
    srv_http_stop(h, 5);
    srv_server_free(s);
}

int main(void) {
    RUN(test_utf8_tail);
    RUN(test_stop_holdback);
    RUN(test_utf8_sanitize);
    if (kiln_model_load(MODEL, &model) != KILN_OK) {
        printf("skip test_serve_routes: %s not found (run from the repo root)\n", MODEL);
        TEST_EXIT();
    }
    snprintf(slot_dir, sizeof slot_dir, "/tmp/kiln-serve-test-XXXXXX");
    if (!mkdtemp(slot_dir)) return 1;
    srv_opts o = {.metrics = true, .slot_save_path = slot_dir};
    srv2 = server_with(2, 128, &o, 0);
    if (!srv2) {
        printf("FAIL test_serve_server: %s\n", kiln_last_error());
        return 1;
    }
    RUN(test_routes_errors);
    RUN(test_auth_and_limits);
    RUN(test_completion_greedy_and_stop);
    RUN(test_spec_lookup);
    RUN(test_oai_chat_and_stream);
    RUN(test_llama_routes);
    RUN(test_ollama_routes);
    RUN(test_slot_files);
    RUN(test_queue_full_and_cancel);
    RUN(test_two_slots_threads);
    RUN(test_http_front);
    srv_server_free(srv2);
    kiln_model_free(model);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", slot_dir);
    if (system(cmd)) return 1;
    TEST_EXIT();
}
