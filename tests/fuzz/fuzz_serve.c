/* fuzz_serve.c: libFuzzer harness of kiln serve's request handling (srv_handle, src/serve/http.c), on the bundled
 * model (models/shakespeare.gguf from the repo root, or KILN_FUZZ_MODEL) with one slot of 64 positions, an API key and
 * every generation capped at 2 tokens. An input is: a byte choosing the method, a byte choosing the route (or, past
 * the table, a path taken from the input), the Authorization header up to the first NUL, and the body (JSON,
 * mostly). Streams are read to their end. The response must be a status in 200..599 whose body, when not a
 * stream, is JSON (or the metrics' text). Built and run by `make fuzz-serve`. */
#include "kiln.h"
#include "serve/serve.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static srv_server *srv;

static const char *const METHODS[] = {"GET", "POST", "PUT", "DELETE", "OPTIONS", "HEAD"};
static const char *const PATHS[] = {
    "/health", "/v1/chat/completions", "/v1/completions", "/v1/models", "/completion", "/tokenize", "/detokenize", "/apply-template",
    "/props", "/slots", "/slots/0", "/slots/1", "/slots/-1", "/slots/x", "/metrics", "/api/generate", "/api/chat", "/api/tags", "/",
};

static void init(void) {
    const char *path = getenv("KILN_FUZZ_MODEL");
    kiln_model *m;
    if (kiln_model_load(path ? path : "models/shakespeare.gguf", &m)) {
        fprintf(stderr, "fuzz_serve: %s\n", kiln_last_error());
        abort();
    }
    kiln_context_params cp = {.s = {.n_ctx = 64, .n_batch = 32, .n_threads = 1}, .n_seq = 1};
    kiln_context *c;
    srv_opts o = {.api_key = "k", .metrics = true, .max_predict = 2, .max_body = 1 << 16, .slot_save_path = "/nonexistent"};
    srv_sched_params sp = {0};
    if (kiln_context_new(m, &cp, &c) || srv_server_new(m, c, &o, &sp, &srv)) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!srv) init();
    if (size < 2) return 0;
    const char *method = METHODS[data[0] % (sizeof METHODS / sizeof *METHODS)];
    char path[128];
    size_t at = 2;
    if (data[1] < sizeof PATHS / sizeof *PATHS) {
        snprintf(path, sizeof path, "%s", PATHS[data[1]]);
    } else { /* a path from the input, up to a NUL */
        size_t k = 0;
        while (at < size && data[at] && k < sizeof path - 1) path[k++] = (char)data[at++];
        path[k] = 0;
        at++;
    }
    char auth[64];
    size_t k = 0;
    while (at < size && data[at] && k < sizeof auth - 1) auth[k++] = (char)data[at++];
    auth[k] = 0;
    at++;
    srv_kv h[1] = {{"Authorization", auth}}, args[1] = {{"action", (data[1] & 1) ? "save" : "erase"}};
    srv_request rq = {.method = method, .path = path, .headers = h, .n_headers = k ? 1 : 0, .args = args, .n_args = 1,
                      .body = at < size ? (const char *)data + at : "", .n_body = at < size ? size - at : 0};
    srv_response rs;
    srv_handle(srv, &rq, &rs);
    if (rs.status < 200 || rs.status > 599) abort();
    if (rs.stream) {
        char buf[4096];
        while (srv_stream_read(rs.stream, buf, sizeof buf, NULL, NULL) > 0) {
        }
    } else if (strncmp(rs.content_type ? rs.content_type : "", "application/json", 16) == 0) {
        json_t *j = json_loadb(rs.body, rs.n_body, 0, NULL);
        if (!j) abort(); /* every JSON answer parses */
        json_decref(j);
    }
    srv_response_free(&rs);
    return 0;
}
