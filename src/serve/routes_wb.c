/* routes_wb.c: the workbench's job API (kiln serve --workbench, docs/workbench.md), under /wb/ to stay clear of
 * Ollama's /api/ routes (wb_tok.c has the vocabulary routes, wb_gen.c the models and generation):
 *   POST /wb/corpora?name=NAME   the body is the corpus text: saved as DIR/corpora/NAME (201)
 *   GET  /wb/corpora             the saved corpora and the examples (--examples-dir), with their sizes
 *   POST /wb/jobs                {"kind": "tokenizer"|"data"|"train"|"export", ...}: checked, then queued (202)
 *   GET  /wb/jobs, /wb/jobs/ID (?events=1 with its events), /wb/jobs/ID/events (SSE)
 *   POST /wb/jobs/ID/stop, /wb/jobs/ID/pause, /wb/jobs/ID/resume
 *   GET  /wb/runs                each run with its checkpoints (step, validation loss), last validation loss, export
 * Every field is checked against its kind's table before the job is queued (a 400 naming the field), so a job
 * fails only for what only running it can tell (a corpus that is not UTF-8, a full disk, a NaN stop), with the
 * library's one-line error. */
#include "serve/jobs.h"
#include "serve/serve.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

bool srv_wb_on(srv_server *s, srv_response *rs) {
    if (s->wb) return true;
    srv_error(rs, 404, NULL, "the workbench is off: start kiln serve with --workbench");
    return false;
}

static const char *arg(const srv_request *rq, const char *k) {
    for (size_t i = 0; i < rq->n_args; i++)
        if (strcmp(rq->args[i].key, k) == 0) return rq->args[i].value;
    return NULL;
}

#define NAME_RULE "1 to 64 bytes of A-Z a-z 0-9 . _ -, not starting with '.', without '..'"

static bool exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0;
}

/* ---------------------------------------------------------------- corpora */

void srv_route_wb_corpora_post(srv_server *s, const srv_request *rq, srv_response *rs) {
    if (!srv_wb_on(s, rs)) return;
    const char *name = arg(rq, "name");
    if (!wb_name_ok(name)) {
        srv_error(rs, 400, "name", "the query's name must be %s", NAME_RULE);
        return;
    }
    if (rq->n_body == 0) {
        srv_error(rs, 400, "body", "the corpus is empty: send its text as the body");
        return;
    }
    size_t n;
    char *clean = srv_utf8_sanitize(rq->body, rq->n_body, &n);
    if (!clean) {
        srv_error(rs, 500, NULL, "out of memory");
        return;
    }
    size_t bad = 0;
    while (bad < rq->n_body && bad < n && clean[bad] == rq->body[bad]) bad++;
    free(clean);
    if (bad < rq->n_body || n != rq->n_body) {
        srv_error(rs, 400, "body", "the corpus is not valid UTF-8 (byte %zu)", bad);
        return;
    }
    if (memchr(rq->body, 0, rq->n_body)) {
        srv_error(rs, 400, "body", "the corpus holds a NUL byte (byte %zu)", (size_t)((const char *)memchr(rq->body, 0, rq->n_body) - rq->body));
        return;
    }
    char path[4096], tmp[4096], hidden[WB_NAME_MAX + 8];
    snprintf(hidden, sizeof hidden, ".%s.part", name); /* no saved name starts with '.' */
    if (!wb_path(s->wb, path, sizeof path, "corpora", name) || !wb_path(s->wb, tmp, sizeof tmp, "corpora", hidden)) {
        srv_error(rs, 500, NULL, "the data folder's path is too long");
        return;
    }
    if (exists(path)) {
        srv_error(rs, 409, "name", "corpus %s exists already: pick another name", name);
        return;
    }
    FILE *f = fopen(tmp, "wb");
    bool ok = f && fwrite(rq->body, 1, rq->n_body, f) == rq->n_body;
    if (f) ok = fflush(f) == 0 && fsync(fileno(f)) == 0 && ok, ok = fclose(f) == 0 && ok;
    int e = errno;
    if (ok && link(tmp, path) != 0) ok = false, e = errno; /* link, not rename: a corpus saved meanwhile is kept */
    unlink(tmp);
    if (!ok) {
        srv_error(rs, e == EEXIST ? 409 : 507, e == EEXIST ? "name" : NULL, "cannot save corpus %s: %s", name, strerror(e));
        return;
    }
    srv_json(rs, 201, json_pack("{s:s,s:I,s:b}", "name", name, "bytes", (json_int_t)rq->n_body, "example", 0));
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The regular files of dir with a workbench name, sorted, each added to list as prefix + name with its size. */
static void list_files(const char *dir, const char *prefix, bool example, json_t *list) {
    DIR *d = opendir(dir);
    if (!d) return;
    char *names[1024];
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 1024)
        if (wb_name_ok(e->d_name) && (names[n] = strdup(e->d_name))) n++;
    closedir(d);
    qsort(names, n, sizeof *names, cmp_str);
    for (size_t i = 0; i < n; i++) {
        char p[8192], full[256];
        struct stat sb;
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        snprintf(full, sizeof full, "%s%s", prefix, names[i]);
        if (stat(p, &sb) == 0 && S_ISREG(sb.st_mode))
            json_array_append_new(list, json_pack("{s:s,s:I,s:b}", "name", full, "bytes", (json_int_t)sb.st_size, "example", example));
        free(names[i]);
    }
}

void srv_route_wb_corpora_get(srv_server *s, const srv_request *rq, srv_response *rs) {
    if (!srv_wb_on(s, rs)) return;
    json_t *list = json_array();
    char p[4096];
    wb_path(s->wb, p, sizeof p, "corpora", NULL);
    list_files(p, "", false, list);
    DIR *d = s->wb->examples[0] ? opendir(s->wb->examples) : NULL; /* examples: SET/FILE */
    char *sets[256];
    size_t n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)) && n < 256)
        if (wb_name_ok(e->d_name) && (sets[n] = strdup(e->d_name))) n++;
    if (d) closedir(d);
    qsort(sets, n, sizeof *sets, cmp_str);
    for (size_t i = 0; i < n; i++) {
        char dir[8192], prefix[WB_NAME_MAX + 2];
        snprintf(dir, sizeof dir, "%s/%s", s->wb->examples, sets[i]);
        snprintf(prefix, sizeof prefix, "%s/", sets[i]);
        list_files(dir, prefix, true, list);
        free(sets[i]);
    }
    srv_json(rs, 200, json_pack("{s:o}", "corpora", list));
}

/* ---------------------------------------------------------------- job fields */

typedef enum { F_NAME, F_CORPORA, F_INT, F_NUM, F_BOOL, F_STRINGS, F_STRING, F_OBJECT } ftype;
typedef struct wb_field {
    const char *name;
    ftype t;
    bool required;
    double lo, hi, dflt; /* numbers: [lo, hi]; dflt when absent (a number, or a bool's 0/1) */
} wb_field;

#define NO_DFLT -1e300 /* absent and not required: left out */
static const wb_field TOKENIZER_FIELDS[] = {
    {"name", F_NAME, true, 0, 0, NO_DFLT},
    {"corpus", F_CORPORA, true, 0, 0, NO_DFLT},
    {"vocab_size", F_INT, true, 257, 1 << 20, NO_DFLT},
    {"special", F_STRINGS, false, 0, 0, NO_DFLT},
    {"min_frequency", F_INT, false, 1, 1e12, 2},
    {"threads", F_INT, false, 0, 1024, 0},
    {"heldout_fraction", F_NUM, false, 0, 0.5, 0.05},
};
static const wb_field DATA_FIELDS[] = {
    {"name", F_NAME, true, 0, 0, NO_DFLT},
    {"tokenizer", F_NAME, true, 0, 0, NO_DFLT},
    {"corpus", F_CORPORA, true, 0, 0, NO_DFLT},
    {"val_fraction", F_NUM, false, 0, 0.5, 0.05},
};
static const wb_field TRAIN_FIELDS[] = {
    {"name", F_NAME, false, 0, 0, NO_DFLT}, /* required unless resume names the run */
    {"resume", F_NAME, false, 0, 0, NO_DFLT},
    {"from_step", F_INT, false, 1, 1e12, NO_DFLT}, /* with resume: its checkpoint of this step (default the latest) */
    {"data", F_NAME, true, 0, 0, NO_DFLT},
    {"tokenizer", F_NAME, false, 0, 0, NO_DFLT}, /* default: the one data was made with */
    {"preset", F_STRING, false, 0, 0, NO_DFLT},
    {"dims", F_OBJECT, false, 0, 0, NO_DFLT},
    {"steps", F_INT, false, 1, 1e9, 200},
    {"lr", F_NUM, false, 1e-8, 10, 1e-3},
    {"min_lr", F_NUM, false, 0, 10, NO_DFLT},      /* default lr / 10 */
    {"warmup", F_INT, false, 0, 1e12, NO_DFLT},    /* default steps / 10 */
    {"lr_schedule", F_STRING, false, 0, 0, NO_DFLT}, /* cosine (default), linear, constant */
    {"batch", F_INT, false, 1, 4096, 8},
    {"context", F_INT, false, 2, 65536, 256},
    {"device", F_STRING, false, 0, 0, NO_DFLT},
    {"threads", F_INT, false, 0, 1024, 0},
    {"eight_bit", F_BOOL, false, 0, 0, 0},
    {"mixed", F_BOOL, false, 0, 0, 0},
    {"time_budget_s", F_NUM, false, 0, 1e9, 0},
    {"eval_interval", F_INT, false, 0, 1e9, 0},
    {"eval_batches", F_INT, false, 1, 1e6, 4},
    {"ckpt_interval", F_INT, false, 0, 1e9, 0},
    {"seed", F_INT, false, 0, 9007199254740991.0, 1337},
};
static const wb_field EXPORT_FIELDS[] = {
    {"run", F_NAME, true, 0, 0, NO_DFLT},
    {"step", F_INT, false, 1, 1e12, NO_DFLT},     /* default: the run's latest checkpoint */
    {"type", F_STRING, false, 0, 0, NO_DFLT},     /* an ftype name (kiln quantize's); default f32 */
    {"name", F_NAME, false, 0, 0, NO_DFLT},       /* default RUN-STEP-TYPE */
};
static const struct {
    const char *kind;
    const wb_field *fields;
    size_t n;
} KINDS[WB_N_KINDS] = {
    {"tokenizer", TOKENIZER_FIELDS, sizeof TOKENIZER_FIELDS / sizeof *TOKENIZER_FIELDS},
    {"data", DATA_FIELDS, sizeof DATA_FIELDS / sizeof *DATA_FIELDS},
    {"train", TRAIN_FIELDS, sizeof TRAIN_FIELDS / sizeof *TRAIN_FIELDS},
    {"export", EXPORT_FIELDS, sizeof EXPORT_FIELDS / sizeof *EXPORT_FIELDS},
};

/* The model presets: tiny (seconds a step on a laptop's CPU), small (kiln train's default) and 124m (kiln synth's
 * llama-124m); n_vocab is the tokenizer's. */
static const struct {
    const char *name;
    int64_t n_embd, n_layer, n_head, n_head_kv, n_ff;
} PRESETS[] = {
    {"tiny", 64, 2, 4, 2, 176},
    {"small", 256, 4, 8, 4, 704},
    {"124m", 768, 12, 12, 4, 2048},
};
static const char *const DIM_NAMES[] = {"n_embd", "n_layer", "n_head", "n_head_kv", "n_ff"};
static const double DIM_MAX[] = {1 << 16, 1024, 4096, 4096, 1 << 20};

static json_t *preset_dims(size_t i) {
    return json_pack("{s:I,s:I,s:I,s:I,s:I}", "n_embd", (json_int_t)PRESETS[i].n_embd, "n_layer", (json_int_t)PRESETS[i].n_layer, "n_head",
                     (json_int_t)PRESETS[i].n_head, "n_head_kv", (json_int_t)PRESETS[i].n_head_kv, "n_ff", (json_int_t)PRESETS[i].n_ff);
}

void srv_wb_presets(json_t *list) {
    for (size_t i = 0; i < sizeof PRESETS / sizeof *PRESETS; i++)
        json_array_append_new(list, json_pack("{s:s,s:o}", "name", PRESETS[i].name, "dims", preset_dims(i)));
}

/* One field of body checked by f into out; false with a 400 naming it. */
static bool check_field(srv_server *s, json_t *body, const wb_field *f, json_t *out, srv_response *rs) {
    json_t *v = json_object_get(body, f->name);
    const char *k = f->name;
    if (!v || json_is_null(v)) {
        if (f->required) {
            srv_error(rs, 400, k, "%s is required", k);
            return false;
        }
        if (f->dflt == NO_DFLT) return true;
        json_object_set_new(out, k, f->t == F_BOOL ? json_boolean(f->dflt != 0) : f->t == F_INT ? json_integer((json_int_t)f->dflt) : json_real(f->dflt));
        return true;
    }
    switch (f->t) {
    case F_NAME:
        if (!json_is_string(v) || !wb_name_ok(json_string_value(v))) {
            srv_error(rs, 400, k, "%s must be %s", k, NAME_RULE);
            return false;
        }
        break;
    case F_CORPORA: {
        size_t n = json_is_array(v) ? json_array_size(v) : 0;
        if (n == 0 || n > 64) {
            srv_error(rs, 400, k, "%s must be an array of 1 to 64 corpus names", k);
            return false;
        }
        for (size_t i = 0; i < n; i++) {
            const char *c = json_string_value(json_array_get(v, i));
            char p[4096];
            if (!c || !wb_corpus_path(s->wb, c, p, sizeof p)) {
                srv_error(rs, 400, k, "%s[%zu] is no corpus: a saved one (GET /wb/corpora) or an example SET/FILE", k, i);
                return false;
            }
        }
        break;
    }
    case F_INT: case F_NUM: {
        double x = json_number_value(v);
        if (!json_is_number(v) || (f->t == F_INT && !json_is_integer(v))) {
            srv_error(rs, 400, k, "%s must be %s", k, f->t == F_INT ? "an integer" : "a number");
            return false;
        }
        if (!(x >= f->lo && x <= f->hi)) {
            srv_error(rs, 400, k, "%s is %g, outside [%g, %g]", k, x, f->lo, f->hi);
            return false;
        }
        break;
    }
    case F_BOOL:
        if (!json_is_boolean(v)) {
            srv_error(rs, 400, k, "%s must be a boolean", k);
            return false;
        }
        break;
    case F_STRINGS: {
        size_t n = json_is_array(v) ? json_array_size(v) : (size_t)-1;
        if (n == (size_t)-1 || n > 64) {
            srv_error(rs, 400, k, "%s must be an array of at most 64 strings", k);
            return false;
        }
        for (size_t i = 0; i < n; i++) {
            json_t *e = json_array_get(v, i);
            size_t len = json_string_length(e);
            if (!json_is_string(e) || len == 0 || len > 64 || strlen(json_string_value(e)) != len) {
                srv_error(rs, 400, k, "%s[%zu] must be a non-empty string of at most 64 bytes without NUL", k, i);
                return false;
            }
            for (size_t m = 0; m < i; m++)
                if (strcmp(json_string_value(json_array_get(v, m)), json_string_value(e)) == 0) {
                    srv_error(rs, 400, k, "%s[%zu] repeats %s[%zu]", k, i, k, m);
                    return false;
                }
        }
        break;
    }
    case F_STRING:
        if (!json_is_string(v)) {
            srv_error(rs, 400, k, "%s must be a string", k);
            return false;
        }
        break;
    case F_OBJECT:
        if (!json_is_object(v)) {
            srv_error(rs, 400, k, "%s must be an object", k);
            return false;
        }
        break;
    }
    json_object_set(out, k, v);
    return true;
}

/* Whether a job of kind still queued or running, or done, makes the output name (one name, one output). */
static wb_job *same_output(wb *w, wb_kind kind, const char *name) {
    for (size_t i = 0; i < w->n_jobs; i++) {
        wb_job *j = w->jobs[i];
        const char *n = json_string_value(json_object_get(j->params, "name"));
        if (j->kind == kind && n && strcmp(n, name) == 0 && j->state < WB_DONE) return j;
    }
    return NULL;
}

/* The tokenizer data/N was made with: the last done data job's. */
static const char *data_tokenizer(wb *w, const char *data) {
    for (size_t i = w->n_jobs; i-- > 0;) {
        wb_job *j = w->jobs[i];
        const char *n = json_string_value(json_object_get(j->params, "name"));
        if (j->kind == WB_DATA && j->state == WB_DONE && n && strcmp(n, data) == 0) return json_string_value(json_object_get(j->params, "tokenizer"));
    }
    return NULL;
}

/* The dims of a train job (a preset's or the request's) into p.dims; false with a 400. */
static bool train_dims(json_t *p, srv_response *rs) {
    json_t *d = json_object_get(p, "dims");
    const char *preset = json_string_value(json_object_get(p, "preset"));
    if (d && preset) {
        srv_error(rs, 400, "dims", "give preset or dims, not both");
        return false;
    }
    if (!d) {
        size_t i = 0, n = sizeof PRESETS / sizeof *PRESETS;
        while (i < n && strcmp(PRESETS[i].name, preset ? preset : "tiny")) i++;
        if (i == n) {
            srv_error(rs, 400, "preset", "preset must be tiny, small or 124m (or give dims)");
            return false;
        }
        json_object_set_new(p, "preset", json_string(PRESETS[i].name));
        json_object_set_new(p, "dims", preset_dims(i));
        return true;
    }
    const char *key;
    json_t *v;
    json_object_foreach(d, key, v) {
        size_t i = 0;
        while (i < 5 && strcmp(DIM_NAMES[i], key)) i++;
        if (i == 5) {
            srv_error(rs, 400, "dims", "dims.%s is not a dimension (n_embd, n_layer, n_head, n_head_kv, n_ff)", key);
            return false;
        }
    }
    int64_t x[5];
    for (int i = 0; i < 5; i++) {
        v = json_object_get(d, DIM_NAMES[i]);
        if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > DIM_MAX[i]) {
            srv_error(rs, 400, "dims", "dims.%s must be an integer in [1, %g]", DIM_NAMES[i], DIM_MAX[i]);
            return false;
        }
        x[i] = json_integer_value(v);
    }
    if (x[0] % x[2] || (x[0] / x[2]) % 2) {
        srv_error(rs, 400, "dims", "dims.n_embd %lld must be n_head %lld times an even head size", (long long)x[0], (long long)x[2]);
        return false;
    }
    if (x[2] % x[3]) {
        srv_error(rs, 400, "dims", "dims.n_head_kv %lld must divide n_head %lld", (long long)x[3], (long long)x[2]);
        return false;
    }
    return true;
}

/* The largest STEP of the run folder's ckpt-STEP.gguf files; 0 when it has none. */
static int64_t latest_step(const char *dir) {
    DIR *d = opendir(dir);
    int64_t best = 0;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        long long n;
        char tail[8];
        if (sscanf(e->d_name, "ckpt-%lld.%7s", &n, tail) == 2 && strcmp(tail, "gguf") == 0 && n > best) best = n;
    }
    if (d) closedir(d);
    return best;
}

/* An export's run, step (default the latest checkpoint), type (default f32) and name (default RUN-STEP-TYPE); its
 * output file into path. False with a 400. */
static bool export_checks(wb *w, json_t *p, char *path, size_t cap, srv_response *rs) {
    const char *run = json_string_value(json_object_get(p, "run")), *type = json_string_value(json_object_get(p, "type"));
    char dir[4096], ck[4200];
    kiln_ftype ft;
    if (type && kiln_ftype_from_name(type, &ft)) {
        srv_error(rs, 400, "type", "type must be one of %s", kiln_ftype_names());
        return false;
    }
    if (!type) json_object_set_new(p, "type", json_string(type = "f32"));
    wb_path(w, dir, sizeof dir, "runs", run);
    if (!json_object_get(p, "step")) json_object_set_new(p, "step", json_integer(latest_step(dir)));
    int64_t step = json_integer_value(json_object_get(p, "step"));
    snprintf(ck, sizeof ck, "%s/ckpt-%lld.gguf", dir, (long long)step);
    if (!exists(ck)) {
        srv_error(rs, 400, step ? "step" : "run", step ? "run %s has no checkpoint of step %lld (GET /wb/runs lists them)" : "run %s has no checkpoint",
                  run, (long long)step);
        return false;
    }
    if (!json_object_get(p, "name")) {
        char name[WB_NAME_MAX + 64];
        snprintf(name, sizeof name, "%s-%lld-%s", run, (long long)step, type);
        for (char *c = name; *c; c++) *c = (char)(*c >= 'A' && *c <= 'Z' ? *c + 32 : *c);
        if (!wb_name_ok(name)) {
            srv_error(rs, 400, "name", "name is required: %s is not a name (%s)", name, NAME_RULE);
            return false;
        }
        json_object_set_new(p, "name", json_string(name));
    }
    char file[WB_NAME_MAX + 8];
    snprintf(file, sizeof file, "%s.gguf", json_string_value(json_object_get(p, "name")));
    wb_path(w, path, cap, "models", file);
    return true;
}

/* A train job's schedule: lr_schedule one of three, min_lr at most lr (but for constant), warmup at most steps. */
static bool schedule_checks(json_t *p, srv_response *rs) {
    const char *sched = json_string_value(json_object_get(p, "lr_schedule"));
    if (sched && strcmp(sched, "cosine") && strcmp(sched, "linear") && strcmp(sched, "constant")) {
        srv_error(rs, 400, "lr_schedule", "lr_schedule must be cosine, linear or constant");
        return false;
    }
    json_t *min = json_object_get(p, "min_lr"), *warm = json_object_get(p, "warmup");
    double lr = json_number_value(json_object_get(p, "lr"));
    if (min && (!sched || strcmp(sched, "constant")) && json_number_value(min) > lr) {
        srv_error(rs, 400, "min_lr", "min_lr %g is above lr %g: the decay goes down to it", json_number_value(min), lr);
        return false;
    }
    if (warm && json_integer_value(warm) > json_integer_value(json_object_get(p, "steps"))) {
        srv_error(rs, 400, "warmup", "warmup %lld is more than the %lld steps", (long long)json_integer_value(warm),
                  (long long)json_integer_value(json_object_get(p, "steps")));
        return false;
    }
    return true;
}

/* The checks that need the data folder, and the queue; w->mu held. False with the error. */
static bool check_kind(srv_server *s, wb_kind kind, json_t *p, char *queue, size_t qcap, srv_response *rs) {
    wb *w = s->wb;
    char path[4096], file[WB_NAME_MAX + 8];
    const char *name = json_string_value(json_object_get(p, "name")), *tok = json_string_value(json_object_get(p, "tokenizer"));
    snprintf(queue, qcap, "cpu");
    if (kind == WB_TOKENIZER) {
        json_t *sp = json_object_get(p, "special");
        size_t n_sp = sp ? json_array_size(sp) : 4;
        if (json_integer_value(json_object_get(p, "vocab_size")) < 256 + (json_int_t)n_sp) {
            srv_error(rs, 400, "vocab_size", "vocab_size must be at least 256 bytes + %zu special tokens = %zu", n_sp, 256 + n_sp);
            return false;
        }
        snprintf(file, sizeof file, "%s.gguf", name);
        wb_path(w, path, sizeof path, "tokenizers", file);
    } else if (kind == WB_DATA) {
        snprintf(file, sizeof file, "%s.gguf", tok);
        wb_path(w, path, sizeof path, "tokenizers", file);
        if (!exists(path)) {
            srv_error(rs, 400, "tokenizer", "no tokenizer %s (train one with a tokenizer job)", tok);
            return false;
        }
        wb_path(w, path, sizeof path, "data", name);
    } else if (kind == WB_EXPORT) {
        if (!export_checks(w, p, path, sizeof path, rs)) return false;
        name = json_string_value(json_object_get(p, "name"));
    } else {
        const char *resume = json_string_value(json_object_get(p, "resume")), *data = json_string_value(json_object_get(p, "data"));
        if (resume && name && strcmp(resume, name)) {
            srv_error(rs, 400, "name", "a resumed run keeps its name: give resume alone, or name equal to it");
            return false;
        }
        if (resume) json_object_set_new(p, "name", json_string(resume)), name = resume;
        if (!name) {
            srv_error(rs, 400, "name", "name is required (the run's), or resume naming a run");
            return false;
        }
        wb_path(w, path, sizeof path, "data", data);
        snprintf(path + strlen(path), sizeof path - strlen(path), "/manifest.txt");
        if (!exists(path)) {
            srv_error(rs, 400, "data", "no data %s (make shards with a data job)", data);
            return false;
        }
        if (!tok && !(tok = data_tokenizer(w, data))) {
            srv_error(rs, 400, "tokenizer", "tokenizer is required: no done data job made %s", data);
            return false;
        }
        json_object_set_new(p, "tokenizer", json_string(tok));
        snprintf(file, sizeof file, "%s.gguf", tok);
        wb_path(w, path, sizeof path, "tokenizers", file);
        if (!exists(path)) {
            srv_error(rs, 400, "tokenizer", "no tokenizer %s", tok);
            return false;
        }
        if (!train_dims(p, rs) || !schedule_checks(p, rs)) return false;
        const char *dev = json_string_value(json_object_get(p, "device"));
        if (dev && strcmp(dev, "cpu")) {
            char *end;
            long idx = strncmp(dev, "cuda:", 5) == 0 && dev[5] >= '0' && dev[5] <= '9' ? strtol(dev + 5, &end, 10) : -1;
            if (idx < 0 || *end || idx >= WB_MAX_QUEUES - 1) {
                srv_error(rs, 400, "device", "device must be cpu or cuda:N (N 0 to %d)", WB_MAX_QUEUES - 2);
                return false;
            }
            int n_dev = kiln_cuda_device_count();
            if (idx >= n_dev) {
                srv_error(rs, 400, "device", "device %s: this server sees %d GPU%s", dev, n_dev, n_dev == 1 ? "" : "s");
                return false;
            }
            snprintf(queue, qcap, "%s", dev);
        }
        json_object_set_new(p, "device", json_string(queue));
        wb_path(w, path, sizeof path, "runs", name);
        char ck[4200];
        snprintf(ck, sizeof ck, "%s/ckpt.gguf", path);
        json_t *from = json_object_get(p, "from_step");
        if (from && !resume) {
            srv_error(rs, 400, "from_step", "from_step picks a checkpoint of the run resumed: give resume too");
            return false;
        }
        if (from) snprintf(ck, sizeof ck, "%s/ckpt-%lld.gguf", path, (long long)json_integer_value(from));
        if (resume && !exists(ck)) {
            srv_error(rs, 400, from ? "from_step" : "resume", "run %s has no checkpoint%s to resume", resume,
                      from ? " of that step (GET /wb/runs lists them)" : "");
            return false;
        }
        if (!resume && exists(path)) {
            srv_error(rs, 409, "name", "run %s exists: resume it ({\"resume\": \"%s\"}) or pick another name", name, name);
            return false;
        }
    }
    if (kind != WB_TRAIN && exists(path)) {
        srv_error(rs, 409, "name", "%s %s exists already: pick another name", wb_kind_name(kind), name);
        return false;
    }
    wb_job *o = same_output(w, kind, name);
    if (o) {
        srv_error(rs, 409, "name", "job %s (%s) makes %s %s already", o->id, wb_state_name(o->state), wb_kind_name(kind), name);
        return false;
    }
    return true;
}

void srv_route_wb_jobs_post(srv_server *s, const srv_request *rq, srv_response *rs) {
    if (!srv_wb_on(s, rs)) return;
    json_t *body = srv_body_object(rq, rs);
    if (!body) return;
    const char *kind = json_string_value(json_object_get(body, "kind"));
    int k = 0;
    while (k < WB_N_KINDS && !(kind && strcmp(kind, KINDS[k].kind) == 0)) k++;
    json_t *p = json_object();
    if (k == WB_N_KINDS) {
        srv_error(rs, 400, "kind", "kind must be tokenizer, data, train or export");
        goto out;
    }
    const char *key;
    json_t *v;
    json_object_foreach(body, key, v) { /* a field kiln does not know is refused, never ignored */
        size_t i = 0;
        while (i < KINDS[k].n && strcmp(KINDS[k].fields[i].name, key)) i++;
        if (i == KINDS[k].n && strcmp(key, "kind")) {
            srv_error(rs, 400, key, "%s is not a field of a %s job", key, kind);
            goto out;
        }
    }
    for (size_t i = 0; i < KINDS[k].n; i++)
        if (!check_field(s, body, &KINDS[k].fields[i], p, rs)) goto out;
    char queue[16];
    pthread_mutex_lock(&s->wb->mu);
    bool ok = check_kind(s, (wb_kind)k, p, queue, sizeof queue, rs);
    pthread_mutex_unlock(&s->wb->mu); /* a twin submitted between here and the queue fails on its own output */
    if (!ok) goto out;
    wb_job *j;
    if (!wb_submit(s->wb, (wb_kind)k, queue, p, &j)) {
        p = NULL;
        srv_error(rs, 503, NULL, "the workbench is stopping (or out of memory): no new jobs");
        goto out;
    }
    p = NULL;
    pthread_mutex_lock(&s->wb->mu);
    json_t *o = wb_job_json(j, false);
    pthread_mutex_unlock(&s->wb->mu);
    srv_json(rs, 202, o);
out:
    json_decref(p);
    json_decref(body);
}

void srv_route_wb_jobs_get(srv_server *s, const srv_request *rq, srv_response *rs) {
    if (!srv_wb_on(s, rs)) return;
    json_t *a = json_array();
    pthread_mutex_lock(&s->wb->mu);
    for (size_t i = 0; i < s->wb->n_jobs; i++) json_array_append_new(a, wb_job_json(s->wb->jobs[i], false));
    pthread_mutex_unlock(&s->wb->mu);
    srv_json(rs, 200, json_pack("{s:o}", "jobs", a));
}

/* The ID of /wb/jobs/ID[/tail] into id, tail at what follows; false for an id no job can have. */
static bool job_id(const srv_request *rq, char *id, size_t cap, const char **tail) {
    const char *p = rq->path + strlen("/wb/jobs/"), *slash = strchr(p, '/');
    size_t n = slash ? (size_t)(slash - p) : strlen(p);
    *tail = slash ? slash : "";
    if (n < 2 || n >= cap || p[0] != 'j') return false;
    for (size_t i = 1; i < n; i++)
        if (p[i] < '0' || p[i] > '9') return false;
    memcpy(id, p, n), id[n] = 0;
    return true;
}

void srv_route_wb_job_get(srv_server *s, const srv_request *rq, srv_response *rs) {
    if (!srv_wb_on(s, rs)) return;
    char id[16];
    const char *tail;
    if (!job_id(rq, id, sizeof id, &tail) || (*tail && strcmp(tail, "/events"))) {
        srv_error(rs, 404, NULL, "no route %s (GET /wb/jobs/ID or /wb/jobs/ID/events)", rq->path);
        return;
    }
    pthread_mutex_lock(&s->wb->mu);
    wb_job *j = wb_find(s->wb, id);
    json_t *o = j && !*tail ? wb_job_json(j, arg(rq, "events") && strcmp(arg(rq, "events"), "0")) : NULL;
    pthread_mutex_unlock(&s->wb->mu);
    if (!j) {
        srv_error(rs, 404, NULL, "no job %s", id);
    } else if (!*tail) {
        srv_json(rs, 200, o);
    } else if (!(rs->read_ud = wb_sse_new(s->wb, j))) {
        srv_error(rs, 500, NULL, "out of memory");
    } else {
        rs->status = 200, rs->content_type = "text/event-stream";
        rs->read = wb_sse_read, rs->read_free = wb_sse_free;
    }
}

void srv_route_wb_job_post(srv_server *s, const srv_request *rq, srv_response *rs) {
    if (!srv_wb_on(s, rs)) return;
    char id[16], msg[256];
    const char *tail;
    if (!job_id(rq, id, sizeof id, &tail) || (strcmp(tail, "/stop") && strcmp(tail, "/pause") && strcmp(tail, "/resume"))) {
        srv_error(rs, 404, NULL, "no route %s (POST /wb/jobs/ID/stop, /pause or /resume)", rq->path);
        return;
    }
    int status = wb_act(s->wb, id, strcmp(tail, "/stop") == 0 ? WB_STOP : strcmp(tail, "/pause") == 0 ? WB_PAUSE : WB_RESUME, msg, sizeof msg);
    if (status != 200) {
        srv_error(rs, status, NULL, "%s", msg);
        return;
    }
    pthread_mutex_lock(&s->wb->mu);
    wb_job *j = wb_find(s->wb, id);
    json_t *o = wb_job_json(j, false);
    pthread_mutex_unlock(&s->wb->mu);
    srv_json(rs, 200, o);
}

/* The checkpoints of run name that are still there (DIR/runs/NAME/ckpt-STEP.gguf), step ascending, each with the
 * validation loss of its step (null when none was measured) from the train jobs' outputs; w->mu held. */
static json_t *checkpoints_of(wb *w, const char *dir, const char *name) {
    json_t *out = json_array();
    for (size_t k = 0; k < w->n_jobs; k++) {
        wb_job *j = w->jobs[k];
        const char *jn = json_string_value(json_object_get(j->params, "name"));
        if (j->kind != WB_TRAIN || !jn || strcmp(jn, name)) continue;
        size_t i;
        json_t *c;
        json_array_foreach(json_object_get(j->outputs, "checkpoints"), i, c) {
            char p[8400];
            snprintf(p, sizeof p, "%s/%s/%s", dir, name, json_string_value(json_object_get(c, "file")));
            if (!exists(p)) continue;
            size_t at = 0; /* a later job's checkpoint of the same step (a resume from before it) replaces it */
            while (at < json_array_size(out) && json_integer_value(json_object_get(json_array_get(out, at), "step")) < json_integer_value(json_object_get(c, "step"))) at++;
            json_t *o = json_deep_copy(c);
            json_object_set_new(o, "path", json_string(p));
            if (at < json_array_size(out) && json_integer_value(json_object_get(json_array_get(out, at), "step")) == json_integer_value(json_object_get(c, "step")))
                json_array_set_new(out, at, o);
            else
                json_array_insert_new(out, at, o);
        }
    }
    return out;
}

void srv_route_wb_runs_get(srv_server *s, const srv_request *rq, srv_response *rs) {
    if (!srv_wb_on(s, rs)) return;
    char dir[4096];
    wb_path(s->wb, dir, sizeof dir, "runs", NULL);
    json_t *a = json_array();
    DIR *d = opendir(dir);
    char *names[1024];
    size_t n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)) && n < 1024)
        if (wb_name_ok(e->d_name) && (names[n] = strdup(e->d_name))) n++;
    if (d) closedir(d);
    qsort(names, n, sizeof *names, cmp_str);
    pthread_mutex_lock(&s->wb->mu);
    for (size_t i = 0; i < n; i++) {
        char ck[8192], ex[8192];
        snprintf(ck, sizeof ck, "%s/%s/ckpt.gguf", dir, names[i]);
        snprintf(ex, sizeof ex, "%s/%s/model.gguf", dir, names[i]);
        json_t *r = json_pack("{s:s,s:o,s:o}", "name", names[i], "checkpoint", exists(ck) ? json_string(ck) : json_null(), "export",
                              exists(ex) ? json_string(ex) : json_null());
        wb_job *last = NULL, *with_ckpt = NULL, *with_val = NULL; /* the run's train jobs, latest first */
        for (size_t k = s->wb->n_jobs; k-- > 0;) {
            wb_job *j = s->wb->jobs[k];
            const char *jn = json_string_value(json_object_get(j->params, "name"));
            if (j->kind != WB_TRAIN || !jn || strcmp(jn, names[i])) continue;
            if (!last) last = j;
            if (!with_ckpt && json_object_get(j->outputs, "checkpoint_step")) with_ckpt = j;
            if (!with_val && json_object_get(j->outputs, "val_loss")) with_val = j;
        }
        if (last) json_object_set_new(r, "job", json_string(last->id)), json_object_set_new(r, "state", json_string(wb_state_name(last->state)));
        if (with_ckpt && exists(ck)) json_object_set(r, "checkpoint_step", json_object_get(with_ckpt->outputs, "checkpoint_step"));
        if (with_val) json_object_set(r, "val_loss", json_object_get(with_val->outputs, "val_loss")),
            json_object_set(r, "val_step", json_object_get(with_val->outputs, "val_step"));
        json_object_set_new(r, "checkpoints", checkpoints_of(s->wb, dir, names[i]));
        json_array_append_new(a, r);
        free(names[i]);
    }
    pthread_mutex_unlock(&s->wb->mu);
    srv_json(rs, 200, json_pack("{s:o}", "runs", a));
}
