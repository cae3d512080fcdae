/* test_wb_unit.c: the workbench's API (kiln serve --workbench; src/serve/routes_wb.c, jobs.c) through srv_handle,
 * without a socket, on a server without a model over a fresh data folder in /tmp: every route's errors (bad names and
 * path traversal, bad and unknown fields, a corpus too big, not UTF-8 or empty, an unknown job, stop of a finished
 * one, auth, the model routes' 503), then real jobs on a synthetic corpus: a tokenizer, shards, a short training
 * run, a train stopped mid-way (its checkpoint listed), a queued one stopped before it starts, the event stream of a
 * finished job, and a restart of the manager over the same folder (every job back with its final state, a job file
 * left "running" loaded as failed). */
#include "kiln.h"
#include "serve/jobs.h"
#include "serve/serve.h"
#include "test.h"

#include <jansson.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[64], data_dir[128], examples[128];
static srv_server *srv;

static srv_response req_n(const char *method, const char *path, const char *body, size_t n_body, const char *auth) {
    srv_kv h[1] = {{"authorization", auth}};
    srv_kv args[1];
    char p[512];
    snprintf(p, sizeof p, "%s", path);
    char *q = strchr(p, '?');
    size_t n_args = 0;
    if (q) {
        *q++ = 0;
        char *eq = strchr(q, '=');
        if (eq) *eq = 0, args[0] = (srv_kv){q, eq + 1}, n_args = 1;
    }
    srv_request rq = {.method = method, .path = p, .headers = h, .n_headers = auth ? 1 : 0, .args = args, .n_args = n_args, .body = body,
                      .n_body = n_body};
    srv_response rs;
    srv_handle(srv, &rq, &rs);
    return rs;
}

static srv_response req(const char *method, const char *path, const char *body) { return req_n(method, path, body, body ? strlen(body) : 0, NULL); }

static json_t *parse(const srv_response *rs) { return rs->body ? json_loadb(rs->body, rs->n_body, 0, NULL) : NULL; }

static const char *err_param(json_t *j) {
    json_t *p = json_object_get(json_object_get(j, "error"), "param");
    return json_is_string(p) ? json_string_value(p) : "";
}

/* The status of one request, and its error's param into param (64 bytes) when it has one. */
static int status_of(const char *method, const char *path, const char *body, char *param) {
    srv_response rs = req(method, path, body);
    json_t *j = parse(&rs);
    if (param) snprintf(param, 64, "%s", err_param(j));
    int st = rs.status;
    json_decref(j);
    srv_response_free(&rs);
    return st;
}

static void write_file(const char *path, const char *text, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fwrite(text, 1, n, f);
    fclose(f);
}

/* About n bytes of words from a fixed seed: a corpus with enough repeated pairs for BPE and a falling loss. */
static char *synthetic_text(size_t n, size_t *len) {
    static const char *const words[] = {"the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "to", "its", "home", "in", "rain", "sun"};
    unsigned long long s = 42;
    char *t = malloc(n + 16);
    size_t k = 0;
    while (k < n) {
        const char *w = words[test_rng_next(&s) % 15];
        size_t m = strlen(w);
        memcpy(t + k, w, m), k += m;
        t[k++] = test_rng_next(&s) % 9 == 0 ? '\n' : ' ';
    }
    t[k] = 0;
    *len = k;
    return t;
}

/* The job's JSON (from GET /wb/jobs/ID), or NULL. */
static json_t *get_job(const char *id) {
    char p[64];
    snprintf(p, sizeof p, "/wb/jobs/%s", id);
    srv_response rs = req("GET", p, NULL);
    json_t *j = rs.status == 200 ? parse(&rs) : NULL;
    srv_response_free(&rs);
    return j;
}

static const char *state_of(json_t *j) { return json_string_value(json_object_get(j, "state")); }

/* Waits (60 s at most) until job id's state is not queued/running (or is want_running and has an event); its JSON. */
static json_t *wait_job(const char *id, bool want_running) {
    for (int i = 0; i < 6000; i++) {
        json_t *j = get_job(id);
        const char *s = state_of(j);
        if (s && (want_running ? strcmp(s, "running") == 0 && json_is_object(json_object_get(j, "progress"))
                               : strcmp(s, "queued") && strcmp(s, "running")))
            return j;
        json_decref(j);
        usleep(10 * 1000);
    }
    return NULL;
}

/* Submits body; the new job's id into id (16 bytes); the status. */
static int submit(const char *body, char *id) {
    srv_response rs = req("POST", "/wb/jobs", body);
    json_t *j = parse(&rs);
    snprintf(id, 16, "%s", json_string_value(json_object_get(j, "id")) ? json_string_value(json_object_get(j, "id")) : "");
    int st = rs.status;
    json_decref(j);
    srv_response_free(&rs);
    return st;
}

/* ---------------------------------------------------------------- errors */

static void test_wb_no_model_and_off(void) {
    char param[64];
    CHECK(status_of("GET", "/health", NULL, NULL) == 200);
    CHECK(status_of("GET", "/v1/models", NULL, NULL) == 503);
    CHECK(status_of("POST", "/v1/chat/completions", "{}", NULL) == 503);
    srv_response rs = req("POST", "/completion", "{}");
    CHECK(rs.body && strstr(rs.body, "no model loaded"), "%s", rs.body);
    srv_response_free(&rs);
    CHECK(status_of("DELETE", "/wb/jobs", NULL, NULL) == 405);
    CHECK(status_of("GET", "/wb/nothing", NULL, NULL) == 404);
    wb *w = srv->wb; /* the routes without a workbench */
    srv->wb = NULL;
    int st = status_of("GET", "/wb/jobs", NULL, param);
    srv->wb = w;
    CHECK(st == 404);
    srv->o.api_key = "k";
    st = status_of("GET", "/wb/jobs", NULL, NULL);
    srv_response ok = req_n("GET", "/wb/jobs", NULL, 0, "Bearer k");
    srv->o.api_key = NULL;
    CHECK(st == 401);
    CHECK(ok.status == 200);
    srv_response_free(&ok);
}

static void test_wb_corpus_errors(void) {
    char param[64];
    static const char *const bad[] = {"/wb/corpora", "/wb/corpora?name=", "/wb/corpora?name=..", "/wb/corpora?name=a/b",
                                      "/wb/corpora?name=.hidden", "/wb/corpora?name=a..b", "/wb/corpora?name=a%20b",
                                      "/wb/corpora?name=a b", "/wb/corpora?name=../../etc/passwd",
                                      "/wb/corpora?name=aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"}; /* 65 */
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        CHECK(status_of("POST", bad[i], "text", param) == 400, "%s", bad[i]);
        CHECK(strcmp(param, "name") == 0, "%s: %s", bad[i], param);
    }
    CHECK(status_of("POST", "/wb/corpora?name=empty", "", param) == 400 && strcmp(param, "body") == 0);
    srv_response rs = req_n("POST", "/wb/corpora?name=bad", "ab\xff" "cd", 5, NULL);
    CHECK(rs.status == 400 && strstr(rs.body, "UTF-8 (byte 2)"), "%d %s", rs.status, rs.body);
    srv_response_free(&rs);
    rs = req_n("POST", "/wb/corpora?name=nul", "ab\0cd", 5, NULL);
    CHECK(rs.status == 400 && strstr(rs.body, "NUL"), "%d %s", rs.status, rs.body);
    srv_response_free(&rs);
    size_t max = srv->o.max_body;
    srv->o.max_body = 16; /* too big: 413, nothing saved */
    int st = status_of("POST", "/wb/corpora?name=big", "0123456789abcdefg", NULL);
    srv->o.max_body = max;
    CHECK(st == 413);
    char p[256];
    snprintf(p, sizeof p, "%s/corpora/big", data_dir);
    CHECK(access(p, F_OK) != 0);
    CHECK(status_of("POST", "/wb/corpora?name=small.txt", "hello world\n", NULL) == 201);
    CHECK(status_of("POST", "/wb/corpora?name=small.txt", "again\n", param) == 409 && strcmp(param, "name") == 0);
    rs = req("GET", "/wb/corpora", NULL);
    json_t *j = parse(&rs), *list = json_object_get(j, "corpora");
    srv_response_free(&rs);
    bool saved = false, example = false, traversal = false;
    size_t i;
    json_t *e;
    json_array_foreach(list, i, e) {
        const char *n = json_string_value(json_object_get(e, "name"));
        if (strcmp(n, "small.txt") == 0) saved = json_integer_value(json_object_get(e, "bytes")) == 12 && json_is_false(json_object_get(e, "example"));
        if (strcmp(n, "set1/ex.txt") == 0) example = json_integer_value(json_object_get(e, "bytes")) == 5 && json_is_true(json_object_get(e, "example"));
        if (strstr(n, "hidden")) traversal = true;
    }
    json_decref(j);
    CHECK(saved && example && !traversal);
}

/* Each body must be refused with status and the error naming param. */
static const struct {
    const char *body;
    int status;
    const char *param;
} BAD_JOBS[] = {
    {"not json", 400, ""},
    {"[1]", 400, ""},
    {"{}", 400, "kind"},
    {"{\"kind\":\"bake\"}", 400, "kind"},
    {"{\"kind\":\"tokenizer\",\"name\":\"t\",\"corpus\":[\"small.txt\"],\"vocab_size\":300,\"colour\":1}", 400, "colour"},
    {"{\"kind\":\"tokenizer\",\"corpus\":[\"small.txt\"],\"vocab_size\":300}", 400, "name"},
    {"{\"kind\":\"tokenizer\",\"name\":\"../t\",\"corpus\":[\"small.txt\"],\"vocab_size\":300}", 400, "name"},
    {"{\"kind\":\"tokenizer\",\"name\":7,\"corpus\":[\"small.txt\"],\"vocab_size\":300}", 400, "name"},
    {"{\"kind\":\"tokenizer\",\"name\":\"t\",\"corpus\":\"small.txt\",\"vocab_size\":300}", 400, "corpus"},
    {"{\"kind\":\"tokenizer\",\"name\":\"t\",\"corpus\":[],\"vocab_size\":300}", 400, "corpus"},
    {"{\"kind\":\"tokenizer\",\"name\":\"t\",\"corpus\":[\"nope\"],\"vocab_size\":300}", 400, "corpus"},
    {"{\"kind\":\"tokenizer\",\"name\":\"t\",\"corpus\":[\"../jobs/j1.json\"],\"vocab_size\":300}", 400, "corpus"},
    {"{\"kind\":\"tokenizer\",\"name\":\"t\",\"corpus\":[\"set1/../../corpora/small.txt\"],\"vocab_size\":300}", 400, "corpus"},
    {"{\"kind\":\"tokenizer\",\"name\":\"t\",\"corpus\":[\"/etc/passwd\"],\"vocab_size\":300}", 400, "corpus"},
    {"{\"kind\":\"tokenizer\",\"name\":\"t\",\"corpus\":[\"small.txt\"]}", 400, "vocab_size"},
    {"{\"kind\":\"tokenizer\",\"name\":\"t\",\"corpus\":[\"small.txt\"],\"vocab_size\":300.5}", 400, "vocab_size"},
    {"{\"kind\":\"tokenizer\",\"name\":\"t\",\"corpus\":[\"small.txt\"],\"vocab_size\":99999999}", 400, "vocab_size"},
    {"{\"kind\":\"tokenizer\",\"name\":\"t\",\"corpus\":[\"small.txt\"],\"vocab_size\":259}", 400, "vocab_size"}, /* < 256 + 4 */
    {"{\"kind\":\"tokenizer\",\"name\":\"t\",\"corpus\":[\"small.txt\"],\"vocab_size\":300,\"special\":[\"<s>\",\"<s>\"]}", 400, "special"},
    {"{\"kind\":\"tokenizer\",\"name\":\"t\",\"corpus\":[\"small.txt\"],\"vocab_size\":300,\"special\":[\"\"]}", 400, "special"},
    {"{\"kind\":\"tokenizer\",\"name\":\"t\",\"corpus\":[\"small.txt\"],\"vocab_size\":300,\"threads\":-1}", 400, "threads"},
    {"{\"kind\":\"data\",\"name\":\"d\",\"tokenizer\":\"none\",\"corpus\":[\"small.txt\"]}", 400, "tokenizer"},
    {"{\"kind\":\"data\",\"name\":\"d\",\"tokenizer\":\"none\",\"corpus\":[\"small.txt\"],\"val_fraction\":1}", 400, "val_fraction"},
    {"{\"kind\":\"train\",\"name\":\"r\",\"data\":\"none\"}", 400, "data"},
    {"{\"kind\":\"train\",\"name\":\"r\"}", 400, "data"},
    {"{\"kind\":\"train\",\"name\":\"r\",\"data\":\"none\",\"steps\":0}", 400, "steps"},
    {"{\"kind\":\"train\",\"name\":\"r\",\"data\":\"none\",\"lr\":\"fast\"}", 400, "lr"},
    {"{\"kind\":\"train\",\"name\":\"r\",\"data\":\"none\",\"mixed\":1}", 400, "mixed"},
    {"{\"kind\":\"train\",\"name\":\"r\",\"data\":\"none\",\"resume\":\"../r\"}", 400, "resume"},
};

static void test_wb_job_errors(void) {
    for (size_t i = 0; i < sizeof BAD_JOBS / sizeof *BAD_JOBS; i++) {
        char param[64];
        int st = status_of("POST", "/wb/jobs", BAD_JOBS[i].body, param);
        CHECK(st == BAD_JOBS[i].status && strcmp(param, BAD_JOBS[i].param) == 0, "%s: %d '%s'", BAD_JOBS[i].body, st, param);
    }
    char param[64];
    CHECK(status_of("GET", "/wb/jobs/j999", NULL, NULL) == 404);
    CHECK(status_of("GET", "/wb/jobs/j999/events", NULL, NULL) == 404);
    CHECK(status_of("GET", "/wb/jobs/abc", NULL, NULL) == 404);
    CHECK(status_of("GET", "/wb/jobs/j1/../../x", NULL, NULL) == 404);
    CHECK(status_of("GET", "/wb/jobs/j1/more", NULL, NULL) == 404);
    CHECK(status_of("POST", "/wb/jobs/j999/stop", NULL, param) == 404);
    CHECK(status_of("POST", "/wb/jobs/j1", NULL, NULL) == 404);
    srv_response rs = req("GET", "/wb/jobs", NULL);
    json_t *j = parse(&rs);
    srv_response_free(&rs);
    CHECK(json_array_size(json_object_get(j, "jobs")) == 0, "a refused job was queued");
    json_decref(j);
    rs = req("GET", "/wb/runs", NULL);
    j = parse(&rs);
    srv_response_free(&rs);
    CHECK(json_is_array(json_object_get(j, "runs")) && json_array_size(json_object_get(j, "runs")) == 0);
    json_decref(j);
}

/* ---------------------------------------------------------------- jobs that run */

static char tok_id[16], data_id[16], train_id[16], stop_id[16], queued_id[16];

static void test_wb_tokenizer_and_data(void) {
    size_t n;
    char *text = synthetic_text(40000, &n);
    srv_response rs = req_n("POST", "/wb/corpora?name=syn", text, n, NULL);
    free(text);
    CHECK(rs.status == 201, "%s", rs.body);
    srv_response_free(&rs);
    CHECK(submit("{\"kind\":\"tokenizer\",\"name\":\"tk\",\"corpus\":[\"syn\",\"set1/ex.txt\"],\"vocab_size\":300,\"threads\":1}", tok_id) == 202);
    char param[64];
    CHECK(status_of("POST", "/wb/jobs", "{\"kind\":\"tokenizer\",\"name\":\"tk\",\"corpus\":[\"syn\"],\"vocab_size\":300}", param) == 409,
          "a second job making tk");
    json_t *j = wait_job(tok_id, false);
    CHECK(j && strcmp(state_of(j), "done") == 0, "%s", j ? json_dumps(j, 0) : "timeout");
    json_t *prog = json_object_get(j, "progress");
    CHECK(strcmp(json_string_value(json_object_get(prog, "stage")), "tokenizer") == 0);
    CHECK(json_integer_value(json_object_get(prog, "done")) == json_integer_value(json_object_get(prog, "total")));
    const char *out = json_string_value(json_object_get(json_object_get(j, "outputs"), "tokenizer"));
    kiln_tokenizer *tok = NULL;
    CHECK(out && kiln_data_tokenizer_load(out, &tok) == KILN_OK, "%s", kiln_last_error());
    CHECK(kiln_tokenizer_n_vocab(tok) == 300);
    kiln_tokenizer_free(tok);
    json_decref(j);
    CHECK(status_of("POST", "/wb/jobs", "{\"kind\":\"tokenizer\",\"name\":\"tk\",\"corpus\":[\"syn\"],\"vocab_size\":300}", param) == 409 &&
          strcmp(param, "name") == 0, "tokenizers/tk.gguf exists");
    char stop[64];
    snprintf(stop, sizeof stop, "/wb/jobs/%s/stop", tok_id);
    rs = req("POST", stop, NULL);
    CHECK(rs.status == 409 && strstr(rs.body, "done already"), "%d %s", rs.status, rs.body);
    srv_response_free(&rs);

    CHECK(submit("{\"kind\":\"data\",\"name\":\"ds\",\"tokenizer\":\"tk\",\"corpus\":[\"syn\"],\"val_fraction\":0.1}", data_id) == 202);
    j = wait_job(data_id, false);
    CHECK(j && strcmp(state_of(j), "done") == 0, "%s", j ? json_dumps(j, 0) : "timeout");
    json_t *o = json_object_get(j, "outputs");
    CHECK(json_integer_value(json_object_get(o, "train_tokens")) > 1000 && json_integer_value(json_object_get(o, "val_tokens")) > 100);
    json_decref(j);
}

static void test_wb_train_stop_and_events(void) {
    CHECK(submit("{\"kind\":\"train\",\"name\":\"r1\",\"data\":\"ds\",\"preset\":\"tiny\",\"steps\":12,\"batch\":2,\"context\":32,\"threads\":1,"
                 "\"eval_interval\":6,\"eval_batches\":2}", train_id) == 202);
    json_t *j = wait_job(train_id, false);
    CHECK(j && strcmp(state_of(j), "done") == 0, "%s", j ? json_dumps(j, 0) : "timeout");
    json_t *o = json_object_get(j, "outputs");
    CHECK(json_integer_value(json_object_get(o, "checkpoint_step")) == 12);
    CHECK(json_is_number(json_object_get(o, "val_loss")));
    const char *exp = json_string_value(json_object_get(o, "export"));
    kiln_model *m = NULL;
    CHECK(exp && kiln_model_load(exp, &m) == KILN_OK, "%s", kiln_last_error());
    CHECK(kiln_model_n_vocab(m) == 300);
    kiln_model_free(m);
    json_decref(j);
    char param[64];
    CHECK(status_of("POST", "/wb/jobs", "{\"kind\":\"train\",\"name\":\"r1\",\"data\":\"ds\"}", param) == 409 && strcmp(param, "name") == 0);
    CHECK(status_of("POST", "/wb/jobs", "{\"kind\":\"train\",\"name\":\"r9\",\"data\":\"ds\",\"resume\":\"r1\"}", param) == 400 && strcmp(param, "name") == 0);
    CHECK(status_of("POST", "/wb/jobs", "{\"kind\":\"train\",\"data\":\"ds\",\"resume\":\"nothing\"}", param) == 400 && strcmp(param, "resume") == 0);
    CHECK(status_of("POST", "/wb/jobs", "{\"kind\":\"train\",\"name\":\"rx\",\"data\":\"ds\",\"preset\":\"huge\"}", param) == 400 && strcmp(param, "preset") == 0);
    CHECK(status_of("POST", "/wb/jobs", "{\"kind\":\"train\",\"name\":\"rx\",\"data\":\"ds\",\"preset\":\"tiny\",\"dims\":{}}", param) == 400 && strcmp(param, "dims") == 0);
    CHECK(status_of("POST", "/wb/jobs", "{\"kind\":\"train\",\"name\":\"rx\",\"data\":\"ds\",\"dims\":{\"n_embd\":60,\"n_layer\":1,\"n_head\":8,\"n_head_kv\":2,\"n_ff\":8}}", param) == 400 &&
          strcmp(param, "dims") == 0);
    CHECK(status_of("POST", "/wb/jobs", "{\"kind\":\"train\",\"name\":\"rx\",\"data\":\"ds\",\"dims\":{\"n_embd\":64,\"n_layer\":1,\"n_head\":4,\"n_head_kv\":2,\"n_ff\":8,\"x\":1}}", param) == 400 &&
          strcmp(param, "dims") == 0);
    CHECK(status_of("POST", "/wb/jobs", "{\"kind\":\"train\",\"name\":\"rx\",\"data\":\"ds\",\"device\":\"gpu\"}", param) == 400 && strcmp(param, "device") == 0);
    CHECK(status_of("POST", "/wb/jobs", "{\"kind\":\"train\",\"name\":\"rx\",\"data\":\"ds\",\"device\":\"cuda:7\"}", param) == 400 && strcmp(param, "device") == 0);

    /* the event stream of the finished run: every step's event, the loss present, then the end with the final state */
    char p[64];
    snprintf(p, sizeof p, "/wb/jobs/%s/events", train_id);
    srv_response rs = req("GET", p, NULL);
    CHECK(rs.status == 200 && rs.read && strcmp(rs.content_type, "text/event-stream") == 0);
    char *all = calloc(1, 1 << 20), buf[4096];
    size_t n = 0;
    long k;
    while ((k = rs.read(rs.read_ud, buf, sizeof buf, NULL, NULL)) > 0 && n + (size_t)k < (1 << 20)) memcpy(all + n, buf, (size_t)k), n += (size_t)k;
    srv_response_free(&rs);
    int steps = 0, evals = 0;
    for (char *q = all; (q = strstr(q, "event: progress\ndata: {\"stage\":\"")); q++) {
        if (strncmp(q + 32, "train", 5) == 0) steps++;
        if (strncmp(q + 32, "eval", 4) == 0) evals++;
    }
    char *end = strstr(all, "event: end\ndata: ");
    bool end_done = end && strstr(end, "\"state\":\"done\"") && strstr(end, "\n\n") == all + n - 2;
    free(all);
    CHECK(k == 0);
    CHECK(steps == 12 && evals == 2, "%d train events, %d eval", steps, evals);
    CHECK(end_done, "no end event with the final state last");

    /* a long run stopped mid-way: stopped, with its checkpoint; a run queued behind it stopped before it starts */
    CHECK(submit("{\"kind\":\"train\",\"name\":\"r2\",\"data\":\"ds\",\"steps\":1000000,\"batch\":2,\"context\":32,\"threads\":1}", stop_id) == 202);
    CHECK(submit("{\"kind\":\"train\",\"name\":\"r3\",\"data\":\"ds\",\"steps\":10,\"batch\":2,\"context\":32,\"threads\":1}", queued_id) == 202);
    j = wait_job(stop_id, true);
    CHECK(j, "the long run never ran");
    json_decref(j);
    j = get_job(queued_id);
    CHECK(strcmp(state_of(j), "queued") == 0, "one job at a time on the cpu queue: %s", state_of(j));
    json_decref(j);
    snprintf(p, sizeof p, "/wb/jobs/%s/stop", queued_id);
    CHECK(status_of("POST", p, NULL, NULL) == 200);
    j = get_job(queued_id);
    CHECK(strcmp(state_of(j), "stopped") == 0);
    json_decref(j);
    snprintf(p, sizeof p, "/wb/jobs/%s/stop", tok_id); /* tokenizer jobs: 409 naming why, here finished */
    CHECK(status_of("POST", p, NULL, NULL) == 409);
    snprintf(p, sizeof p, "/wb/jobs/%s/stop", stop_id);
    CHECK(status_of("POST", p, NULL, NULL) == 200);
    j = wait_job(stop_id, false);
    CHECK(j && strcmp(state_of(j), "stopped") == 0, "%s", j ? state_of(j) : "timeout");
    o = json_object_get(j, "outputs");
    int64_t at = json_integer_value(json_object_get(o, "checkpoint_step"));
    CHECK(at >= 1 && at < 1000000 && json_is_string(json_object_get(o, "checkpoint")) && json_is_string(json_object_get(o, "export")));
    json_decref(j);
    CHECK(status_of("POST", p, NULL, NULL) == 409, "a stopped job stopped again");

    rs = req("GET", "/wb/runs", NULL);
    j = parse(&rs);
    srv_response_free(&rs);
    json_t *runs = json_object_get(j, "runs");
    CHECK(json_array_size(runs) == 2, "%zu runs", json_array_size(runs)); /* r1, r2 (r3 never started) */
    json_t *r1 = json_array_get(runs, 0), *r2 = json_array_get(runs, 1);
    CHECK(strcmp(json_string_value(json_object_get(r1, "name")), "r1") == 0 && json_integer_value(json_object_get(r1, "checkpoint_step")) == 12 &&
          json_is_number(json_object_get(r1, "val_loss")) && json_is_string(json_object_get(r1, "export")));
    CHECK(strcmp(json_string_value(json_object_get(r2, "state")), "stopped") == 0 && json_integer_value(json_object_get(r2, "checkpoint_step")) == at);
    json_decref(j);

    /* resume the stopped run for a few more steps (steps counts from 0: past its checkpoint) */
    char rid[16];
    char body[256];
    snprintf(body, sizeof body, "{\"kind\":\"train\",\"data\":\"ds\",\"resume\":\"r2\",\"steps\":%lld,\"batch\":2,\"context\":32,\"threads\":1}",
             (long long)at + 3);
    CHECK(submit(body, rid) == 202);
    j = wait_job(rid, false);
    CHECK(j && strcmp(state_of(j), "done") == 0, "%s", j ? json_dumps(j, 0) : "timeout");
    CHECK(json_integer_value(json_object_get(json_object_get(j, "outputs"), "checkpoint_step")) == at + 3);
    json_decref(j);
}

static void test_wb_restart(void) {
    /* a job file a dead server left running */
    char p[256];
    snprintf(p, sizeof p, "%s/jobs/j500.json", data_dir);
    const char *dead = "{\"id\":\"j500\",\"kind\":\"data\",\"state\":\"running\",\"queue\":\"cpu\",\"params\":{\"name\":\"x\"},\"outputs\":{},\"n_events\":0}";
    write_file(p, dead, strlen(dead));
    snprintf(p, sizeof p, "%s/jobs/junk.json", data_dir);
    write_file(p, "{", 1);
    srv_response rs = req("GET", "/wb/jobs", NULL);
    json_t *before = parse(&rs);
    srv_response_free(&rs);
    wb_free(srv->wb, 60);
    srv->wb = NULL;
    CHECK(wb_new(data_dir, examples, &srv->wb) == KILN_OK, "%s", kiln_last_error());
    rs = req("GET", "/wb/jobs", NULL);
    json_t *after = parse(&rs);
    srv_response_free(&rs);
    json_t *a = json_object_get(before, "jobs"), *b = json_object_get(after, "jobs");
    CHECK(json_array_size(b) == json_array_size(a) + 1, "%zu jobs after, %zu before", json_array_size(b), json_array_size(a));
    for (size_t i = 0; i < json_array_size(a); i++) {
        json_t *x = json_array_get(a, i), *y = json_array_get(b, i);
        CHECK(strcmp(json_string_value(json_object_get(x, "id")), json_string_value(json_object_get(y, "id"))) == 0);
        CHECK(strcmp(state_of(x), state_of(y)) == 0, "%s: %s then %s", json_string_value(json_object_get(x, "id")), state_of(x), state_of(y));
        CHECK(json_equal(json_object_get(x, "outputs"), json_object_get(y, "outputs")));
    }
    json_t *d = json_array_get(b, json_array_size(b) - 1);
    CHECK(strcmp(json_string_value(json_object_get(d, "id")), "j500") == 0 && strcmp(state_of(d), "failed") == 0 &&
          strcmp(json_string_value(json_object_get(d, "error")), "the server stopped while it ran") == 0);
    json_decref(before), json_decref(after);
    char id[16];
    CHECK(submit("{\"kind\":\"tokenizer\",\"name\":\"tk2\",\"corpus\":[\"small.txt\"],\"vocab_size\":260}", id) == 202);
    CHECK(strcmp(id, "j501") == 0, "the next id is %s", id);
    json_t *j = wait_job(id, false);
    CHECK(j && strcmp(state_of(j), "done") == 0);
    json_decref(j);
    json_t *ev = get_job(tok_id);
    CHECK(ev && json_integer_value(json_object_get(ev, "n_events")) >= 1);
    json_decref(ev);
    snprintf(p, sizeof p, "/wb/jobs/%s?events=1", tok_id);
    rs = req("GET", p, NULL);
    ev = parse(&rs);
    srv_response_free(&rs);
    CHECK(json_array_size(json_object_get(ev, "events")) >= 1, "the events came back from the file");
    json_decref(ev);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/kiln-wb-test-XXXXXX");
    if (!mkdtemp(dir)) return 1;
    snprintf(data_dir, sizeof data_dir, "%s/data", dir);
    snprintf(examples, sizeof examples, "%s/examples", dir);
    char p[256];
    mkdir(examples, 0755);
    snprintf(p, sizeof p, "%s/set1", examples);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/set1/ex.txt", examples);
    write_file(p, "hello", 5);
    snprintf(p, sizeof p, "%s/set1/.hidden", examples);
    write_file(p, "x", 1);
    srv_opts o = {0};
    wb *w = NULL;
    if (wb_new(data_dir, examples, &w) || srv_server_new(NULL, NULL, &o, &(srv_sched_params){0}, &srv)) {
        printf("FAIL test_wb_server: %s\n", kiln_last_error());
        return 1;
    }
    srv->wb = w;
    RUN(test_wb_no_model_and_off);
    RUN(test_wb_corpus_errors);
    RUN(test_wb_job_errors);
    RUN(test_wb_tokenizer_and_data);
    RUN(test_wb_train_stop_and_events);
    RUN(test_wb_restart);
    wb_free(srv->wb, 60);
    srv_server_free(srv);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) return 1;
    TEST_EXIT();
}
