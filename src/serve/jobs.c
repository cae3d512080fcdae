/* jobs.c: the workbench's job manager (jobs.h says how it fits): the job files, the queues and their workers, the
 * four kinds' runs through kiln.h, progress into events, stop and pause, and the event stream. */
#include "serve/jobs.h"
#include "serve/sched.h" /* srv_now */
#include "serve/serve.h" /* srv_sse_* */

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static const char *const KIND_NAMES[WB_N_KINDS] = {"tokenizer", "data", "train", "export"};
static const char *const STATE_NAMES[] = {"queued", "running", "paused", "done", "failed", "stopped"};
static const char *const SUBDIRS[] = {"corpora", "tokenizers", "data", "runs", "jobs", "models"};

const char *wb_kind_name(wb_kind k) { return k < WB_N_KINDS ? KIND_NAMES[k] : "?"; }
const char *wb_state_name(wb_state s) { return s <= WB_STOPPED ? STATE_NAMES[s] : "?"; }

static double unix_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---------------------------------------------------------------- names and paths */

bool wb_name_ok(const char *s) {
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n > WB_NAME_MAX || s[0] == '.' || strstr(s, "..")) return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-')) return false;
    }
    return true;
}

bool wb_path(const wb *w, char *buf, size_t cap, const char *sub, const char *name) {
    int n = snprintf(buf, cap, "%s/%s%s%s", w->dir, sub, name ? "/" : "", name ? name : "");
    return n > 0 && (size_t)n < cap;
}

static bool regular_file(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

bool wb_corpus_path(const wb *w, const char *name, char *buf, size_t cap) {
    const char *slash = name ? strchr(name, '/') : NULL;
    if (!slash) return wb_name_ok(name) && wb_path(w, buf, cap, "corpora", name) && regular_file(buf);
    char set[WB_NAME_MAX + 1];
    size_t k = (size_t)(slash - name);
    if (k > WB_NAME_MAX) return false;
    memcpy(set, name, k), set[k] = 0;
    if (!wb_name_ok(set) || !wb_name_ok(slash + 1)) return false;
    if (!w->examples[0]) return false; /* no examples folder: SET/FILE names nothing (never a path from the root) */
    int n = snprintf(buf, cap, "%s/%s/%s", w->examples, set, slash + 1);
    return n > 0 && (size_t)n < cap && regular_file(buf);
}

/* ---------------------------------------------------------------- job files */

static void set_real(json_t *o, const char *k, double x) { /* JSON has no NaN: a non-finite number is left out */
    if (isfinite(x)) json_object_set_new(o, k, json_real(x));
}

json_t *wb_job_json(const wb_job *j, bool events) {
    json_t *o = json_pack("{s:s,s:s,s:s,s:s,s:O,s:o,s:O,s:I}", "id", j->id, "kind", wb_kind_name(j->kind), "state", wb_state_name(j->state),
                          "queue", j->queue, "params", j->params, "progress", j->progress ? json_incref(j->progress) : json_null(),
                          "outputs", j->outputs, "n_events", (json_int_t)j->n_seq);
    if (!o) return NULL;
    if (j->state == WB_RUNNING && __atomic_load_n(&j->pause, __ATOMIC_RELAXED)) json_object_set_new(o, "pausing", json_true());
    size_t n;
    char *clean = j->error[0] ? srv_utf8_sanitize(j->error, strlen(j->error), &n) : NULL; /* may quote a path's bytes, or be cut */
    json_object_set_new(o, "error", clean ? json_stringn(clean, n) : json_null());
    free(clean);
    set_real(o, "created", j->created);
    if (j->started) set_real(o, "started", j->started);
    if (j->ended) set_real(o, "ended", j->ended);
    if (events) json_object_set(o, "events", j->events);
    return o;
}

/* Writes j's file (temp file, fsync, rename); the caller holds w->mu. A failure is printed, the job goes on. */
static void job_write(wb *w, wb_job *j) {
    char path[4096], tmp[4200];
    if (!wb_path(w, path, sizeof path, "jobs", j->id)) return;
    snprintf(path + strlen(path), sizeof path - strlen(path), ".json");
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    json_t *o = wb_job_json(j, true);
    FILE *f = o ? fopen(tmp, "wb") : NULL;
    bool ok = f && json_dumpf(o, f, JSON_COMPACT) == 0;
    if (f) ok = fflush(f) == 0 && fsync(fileno(f)) == 0 && ok, ok = fclose(f) == 0 && ok;
    if (ok) ok = rename(tmp, path) == 0;
    if (!ok) {
        fprintf(stderr, "kiln serve: workbench: cannot write %s: %s\n", path, strerror(errno));
        unlink(tmp);
    }
    json_decref(o);
    j->written = srv_now();
}

static wb_job *job_alloc(void) {
    wb_job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    j->events = json_array(), j->outputs = json_object();
    if (!j->events || !j->outputs) {
        json_decref(j->events), json_decref(j->outputs), free(j);
        return NULL;
    }
    return j;
}

static void job_free(wb_job *j) {
    if (!j) return;
    json_decref(j->params), json_decref(j->progress), json_decref(j->events), json_decref(j->outputs);
    free(j);
}

static bool add_job(wb *w, wb_job *j) {
    if (w->n_jobs == w->cap_jobs) {
        size_t cap = w->cap_jobs ? 2 * w->cap_jobs : 64;
        wb_job **p = realloc(w->jobs, cap * sizeof *p);
        if (!p) return false;
        w->jobs = p, w->cap_jobs = cap;
    }
    w->jobs[w->n_jobs++] = j;
    return true;
}

/* One job file back into a job; NULL (and a line on stderr) for a file that is not one. */
static wb_job *job_load(const char *path) {
    json_error_t err;
    json_t *o = json_load_file(path, JSON_REJECT_DUPLICATES, &err);
    wb_job *j = o ? job_alloc() : NULL;
    const char *id = json_string_value(json_object_get(o, "id")), *kind = json_string_value(json_object_get(o, "kind"));
    const char *state = json_string_value(json_object_get(o, "state")), *queue = json_string_value(json_object_get(o, "queue"));
    int k = -1, st = -1;
    for (int i = 0; kind && i < WB_N_KINDS; i++)
        if (strcmp(kind, KIND_NAMES[i]) == 0) k = i;
    for (int i = 0; state && i <= WB_STOPPED; i++)
        if (strcmp(state, STATE_NAMES[i]) == 0) st = i;
    long long num = 0;
    if (!j || !id || sscanf(id, "j%lld", &num) != 1 || num <= 0 || k < 0 || st < 0 || !queue || strlen(queue) >= sizeof j->queue ||
        !json_is_object(json_object_get(o, "params"))) {
        fprintf(stderr, "kiln serve: workbench: %s is not a job file (%s); left out\n", path, o ? "a field is missing or wrong" : err.text);
        json_decref(o), job_free(j);
        return NULL;
    }
    snprintf(j->id, sizeof j->id, "j%lld", num);
    j->num = num, j->kind = (wb_kind)k, j->state = (wb_state)st;
    snprintf(j->queue, sizeof j->queue, "%s", queue);
    j->params = json_incref(json_object_get(o, "params"));
    json_t *v;
    if (json_is_object(v = json_object_get(o, "progress"))) j->progress = json_incref(v);
    if (json_is_object(v = json_object_get(o, "outputs"))) json_decref(j->outputs), j->outputs = json_incref(v);
    if (json_is_array(v = json_object_get(o, "events"))) json_decref(j->events), j->events = json_incref(v);
    j->n_seq = json_integer_value(json_object_get(o, "n_events"));
    snprintf(j->error, sizeof j->error, "%s", json_string_value(json_object_get(o, "error")) ? json_string_value(json_object_get(o, "error")) : "");
    j->created = json_number_value(json_object_get(o, "created"));
    j->started = json_number_value(json_object_get(o, "started"));
    j->ended = json_number_value(json_object_get(o, "ended"));
    json_decref(o);
    return j;
}

static int by_num(const void *a, const void *b) {
    int64_t x = (*(wb_job *const *)a)->num, y = (*(wb_job *const *)b)->num;
    return x < y ? -1 : x > y;
}

static kiln_status load_jobs(wb *w) {
    char path[4096];
    if (!wb_path(w, path, sizeof path, "jobs", NULL)) return kiln_fail(KILN_ERR_INVALID, "workbench: --data-dir %s is too long", w->dir);
    DIR *d = opendir(path);
    if (!d) return kiln_fail(KILN_ERR_IO, "workbench: cannot read %s", path);
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (n < 6 || strcmp(e->d_name + n - 5, ".json") || e->d_name[0] != 'j') continue;
        char p[4400];
        snprintf(p, sizeof p, "%s/%s", path, e->d_name);
        wb_job *j = job_load(p);
        if (!j) continue;
        if (!add_job(w, j)) {
            job_free(j), closedir(d);
            return kiln_fail(KILN_ERR_NOMEM, "workbench: out of memory loading the jobs");
        }
        if (j->num >= w->next_num) w->next_num = j->num + 1;
        if (j->state < WB_DONE) { /* the last server died or stopped with it */
            j->state = WB_FAILED;
            snprintf(j->error, sizeof j->error, "the server stopped while it ran");
            j->ended = unix_now();
            job_write(w, j);
        }
    }
    closedir(d);
    if (w->n_jobs) qsort(w->jobs, w->n_jobs, sizeof *w->jobs, by_num);
    return KILN_OK;
}

kiln_status wb_new(const char *dir, const char *examples_dir, wb **out) {
    *out = NULL;
    if (strlen(dir) > 3000) return kiln_fail(KILN_ERR_INVALID, "workbench: --data-dir is longer than 3000 bytes");
    wb *w = calloc(1, sizeof *w);
    if (!w) return KILN_ERR_NOMEM;
    w->dir = strdup(dir), w->examples = strdup(examples_dir ? examples_dir : "");
    w->next_num = 1;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    kiln_status st = w->dir && w->examples ? KILN_OK : KILN_ERR_NOMEM;
    if (!st && mkdir(dir, 0755) && errno != EEXIST) st = kiln_fail(KILN_ERR_IO, "workbench: cannot make %s: %s", dir, strerror(errno));
    for (size_t i = 0; !st && i < sizeof SUBDIRS / sizeof *SUBDIRS; i++) {
        char p[4096];
        wb_path(w, p, sizeof p, SUBDIRS[i], NULL);
        if (mkdir(p, 0755) && errno != EEXIST) st = kiln_fail(KILN_ERR_IO, "workbench: cannot make %s: %s", p, strerror(errno));
    }
    if (!st) st = load_jobs(w);
    if (st) {
        w->n_queues = 0;
        wb_free(w, 0);
        return st;
    }
    *out = w;
    return KILN_OK;
}

/* ---------------------------------------------------------------- events */

/* Appends an event (taken) to j, thinning the history when full, and writes j's file when a second has passed;
 * the caller holds w->mu. */
static void add_event(wb *w, wb_job *j, json_t *ev) {
    if (!ev) return;
    json_object_set_new(ev, "seq", json_integer(j->n_seq++));
    set_real(ev, "t", srv_now() - j->t0);
    if (json_array_size(j->events) >= WB_MAX_EVENTS) { /* keep every other one: the whole run stays visible */
        json_t *kept = json_array();
        for (size_t i = 0; kept && i < json_array_size(j->events); i += 2) json_array_append(kept, json_array_get(j->events, i));
        if (kept) json_decref(j->events), j->events = kept;
    }
    json_array_append(j->events, ev);
    json_decref(j->progress);
    j->progress = ev;
    pthread_cond_broadcast(&w->cv);
    if (srv_now() - j->written >= 1.0) job_write(w, j);
}

typedef struct {
    wb *w;
    wb_job *j;
    char ckpt[4200]; /* train: the run's ckpt.gguf, linked as ckpt-STEP.gguf at each checkpoint */
} prog_ctx;

/* A train job's checkpoint of step: ckpt.gguf (just renamed into place by kiln_trainer_save) gets a second name,
 * ckpt-STEP.gguf, which the next save leaves alone; listed in outputs.checkpoints. The caller holds w->mu. */
static void keep_checkpoint(prog_ctx *c, int64_t step) {
    char file[64], path[4300];
    snprintf(file, sizeof file, "ckpt-%lld.gguf", (long long)step);
    snprintf(path, sizeof path, "%.*s/%s", (int)(strrchr(c->ckpt, '/') - c->ckpt), c->ckpt, file);
    unlink(path); /* a resumed run that reached this step again: the newer one */
    if (link(c->ckpt, path) != 0) {
        fprintf(stderr, "kiln serve: workbench: cannot link %s: %s\n", path, strerror(errno));
        return;
    }
    json_t *list = json_object_get(c->j->outputs, "checkpoints");
    if (!list) json_object_set_new(c->j->outputs, "checkpoints", list = json_array());
    json_array_append_new(list, json_pack("{s:I,s:s,s:n}", "step", (json_int_t)step, "file", file, "val_loss"));
}

static void on_progress(void *ud, const kiln_progress *p) {
    prog_ctx *c = ud;
    json_t *ev = json_pack("{s:s,s:I,s:I}", "stage", p->stage ? p->stage : "", "done", (json_int_t)p->done, "total", (json_int_t)p->total);
    if (!ev) return;
    set_real(ev, "metric", p->metric);
    const kiln_train_progress *t = p->train;
    if (t) {
        json_object_set_new(ev, "step", json_integer(t->step));
        json_object_set_new(ev, "steps", json_integer(t->steps));
        set_real(ev, "loss", t->loss), set_real(ev, "lr", t->lr), set_real(ev, "grad_norm", t->grad_norm);
        set_real(ev, "tok_s", t->tok_per_s), set_real(ev, "elapsed_s", t->elapsed_s), set_real(ev, "eta_s", t->eta_s);
        set_real(ev, "val_loss", t->val_loss), set_real(ev, "val_ppl", t->val_ppl);
        json_object_set_new(ev, "n_skipped", json_integer(t->n_skipped));
        json_object_set_new(ev, "checkpoint", json_boolean(t->checkpoint));
        json_object_set_new(ev, "n_params", json_integer(t->n_params));
        json_object_set_new(ev, "state_bytes", json_integer((json_int_t)t->state_bytes));
        json_object_set_new(ev, "act_bytes", json_integer((json_int_t)t->act_bytes));
        /* what the run holds on its device: the training state and the activations (GPU memory on cuda:N) */
        json_object_set_new(ev, "memory_bytes", json_integer((json_int_t)(t->state_bytes + t->act_bytes)));
        json_object_set_new(ev, "device", json_string(c->j->queue));
    }
    bool train = p->stage && strcmp(p->stage, "train") == 0, eval = p->stage && strcmp(p->stage, "eval") == 0;
    pthread_mutex_lock(&c->w->mu);
    if (t && train && t->checkpoint) {
        json_object_set_new(c->j->outputs, "checkpoint_step", json_integer(t->step));
        if (c->ckpt[0]) keep_checkpoint(c, t->step);
    }
    if (t && eval && isfinite(t->val_loss)) {
        json_object_set_new(c->j->outputs, "val_loss", json_real(t->val_loss));
        json_object_set_new(c->j->outputs, "val_step", json_integer(t->step));
        json_t *list = json_object_get(c->j->outputs, "checkpoints"), *last = json_array_get(list, json_array_size(list) - 1);
        if (last && json_integer_value(json_object_get(last, "step")) == t->step) json_object_set_new(last, "val_loss", json_real(t->val_loss));
    }
    wb_state was = c->j->state;
    if (p->stage && strcmp(p->stage, "paused") == 0) c->j->state = WB_PAUSED;
    if (p->stage && strcmp(p->stage, "resumed") == 0) c->j->state = WB_RUNNING;
    json_object_set_new(ev, "state", json_string(wb_state_name(c->j->state)));
    add_event(c->w, c->j, ev);
    if (c->j->state != was) job_write(c->w, c->j);
    pthread_mutex_unlock(&c->w->mu);
}

/* ---------------------------------------------------------------- the runs */

/* The corpus files of params.corpus into paths (each 4096 bytes); false with the error set. */
static kiln_status corpus_paths(wb *w, json_t *names, char (*paths)[4096], const char **ptrs, int *n) {
    *n = 0;
    size_t i;
    json_t *v;
    json_array_foreach(names, i, v) {
        if (i >= 64) return kiln_fail(KILN_ERR_INVALID, "at most 64 corpora");
        if (!wb_corpus_path(w, json_string_value(v), paths[i], sizeof paths[i]))
            return kiln_fail(KILN_ERR_NOT_FOUND, "corpus '%s' is gone (neither saved nor an example)", json_string_value(v) ? json_string_value(v) : "?");
        ptrs[i] = paths[i];
        ++*n;
    }
    return KILN_OK;
}

static int64_t pint(json_t *p, const char *k) { return json_integer_value(json_object_get(p, k)); }
static const char *pstr(json_t *p, const char *k) { return json_string_value(json_object_get(p, k)); }

#define HELDOUT_MAX (1 << 20) /* bytes of a tokenizer's held-out text at most */

/* Copies n bytes of in (from its position) to out; false on a read or write error. */
static bool copy_bytes(FILE *in, FILE *out, int64_t n) {
    char buf[65536];
    while (n > 0) {
        size_t k = fread(buf, 1, n < (int64_t)sizeof buf ? (size_t)n : sizeof buf, in);
        if (k == 0 || fwrite(buf, 1, k, out) != k) return false;
        n -= (int64_t)k;
    }
    return true;
}

/* A tokenizer job's held-out text: the tail of its last corpus, heldout_fraction of all the corpora's bytes (at most
 * 1 MiB and half that file), cut at a line start when one is near, else at a character start, written to held. The
 * rest of that file goes to train_tmp, which takes its place in path for the training. *n_held 0: nothing held out
 * (fraction 0), path unchanged. */
static kiln_status hold_out(const char **ptrs, int n, double fraction, char *train_tmp, const char *held, int64_t *n_held) {
    *n_held = 0;
    int64_t total = 0, size = 0;
    for (int i = 0; i < n; i++) {
        struct stat sb;
        if (stat(ptrs[i], &sb) != 0) return kiln_fail(KILN_ERR_IO, "cannot read %s: %s", ptrs[i], strerror(errno));
        total += sb.st_size, size = sb.st_size;
    }
    int64_t want = (int64_t)(fraction * (double)total);
    if (want > HELDOUT_MAX) want = HELDOUT_MAX;
    if (want > size / 2) want = size / 2;
    if (fraction <= 0 || want < 1) return KILN_OK;
    FILE *in = fopen(ptrs[n - 1], "rb");
    if (!in) return kiln_fail(KILN_ERR_IO, "cannot read %s: %s", ptrs[n - 1], strerror(errno));
    /* the cut: the first line start in the 4 KiB after size - want, else the first character start */
    int64_t cut = size - want;
    unsigned char look[4096];
    fseek(in, (long)cut, SEEK_SET);
    size_t got = fread(look, 1, sizeof look, in), k = 0;
    while (k < got && look[k] != '\n') k++;
    if (k < got && cut + (int64_t)k + 1 < size) cut += (int64_t)k + 1;
    else for (k = 0; k < got && (look[k] & 0xC0) == 0x80; k++) cut++;
    if (cut >= size) { /* the whole tail is one broken character: nothing held out */
        fclose(in);
        return KILN_OK;
    }
    FILE *t = fopen(train_tmp, "wb"), *h = fopen(held, "wb");
    bool ok = t && h && fseek(in, 0, SEEK_SET) == 0 && copy_bytes(in, t, cut) && copy_bytes(in, h, size - cut);
    int e = errno;
    if (t) ok = fclose(t) == 0 && ok;
    if (h) ok = fclose(h) == 0 && ok;
    fclose(in);
    if (!ok) {
        unlink(train_tmp), unlink(held);
        return kiln_fail(KILN_ERR_IO, "cannot write the held-out split of %s: %s", ptrs[n - 1], strerror(e ? e : EIO));
    }
    ptrs[n - 1] = train_tmp, *n_held = size - cut;
    return KILN_OK;
}

/* Bytes per token of the file at path through tok into o (bytes, tokens, bytes_per_token); false when it cannot. */
static bool measure(const kiln_tokenizer *tok, const char *path, json_t *o) {
    FILE *f = fopen(path, "rb");
    char *text = f ? malloc(HELDOUT_MAX + 1) : NULL;
    size_t n = text ? fread(text, 1, HELDOUT_MAX, f) : 0;
    if (f) fclose(f);
    kiln_tokens ids = {0};
    bool ok = text && n > 0 && kiln_tokenizer_encode(tok, text, n, false, false, &ids) == KILN_OK && ids.n > 0;
    if (ok) {
        json_object_set_new(o, "bytes", json_integer((json_int_t)n));
        json_object_set_new(o, "tokens", json_integer((json_int_t)ids.n));
        json_object_set_new(o, "bytes_per_token", json_real((double)n / (double)ids.n));
    }
    kiln_tokens_free(&ids);
    free(text);
    return ok;
}

static kiln_status run_tokenizer(wb *w, wb_job *j, prog_ctx *pc) {
    char (*paths)[4096] = malloc(64 * sizeof *paths); /* (64) the corpora's files */
    const char *ptrs[64];
    int n;
    kiln_status s = paths ? corpus_paths(w, json_object_get(j->params, "corpus"), paths, ptrs, &n) : KILN_ERR_NOMEM;
    if (s) {
        free(paths);
        return s;
    }
    const char *specials[64], *name = pstr(j->params, "name");
    json_t *sp = json_object_get(j->params, "special");
    size_t ns = json_array_size(sp);
    for (size_t i = 0; i < ns && i < 64; i++) specials[i] = json_string_value(json_array_get(sp, i));
    kiln_bpe_train_params p = {.vocab_size = (int32_t)pint(j->params, "vocab_size"), .specials = sp ? specials : NULL,
                               .n_specials = (int)ns, .min_frequency = pint(j->params, "min_frequency"),
                               .n_threads = (int)pint(j->params, "threads"), .progress = on_progress, .progress_ud = pc};
    char out[4096], held[4096], tmp[4096], file[WB_NAME_MAX + 16];
    snprintf(file, sizeof file, "%s.gguf", name);
    wb_path(w, out, sizeof out, "tokenizers", file);
    snprintf(file, sizeof file, "%s.heldout.txt", name);
    wb_path(w, held, sizeof held, "tokenizers", file);
    snprintf(file, sizeof file, ".%s.train.tmp", name); /* hidden: no name starts with '.' */
    wb_path(w, tmp, sizeof tmp, "tokenizers", file);
    int64_t n_held;
    s = hold_out(ptrs, n, json_number_value(json_object_get(j->params, "heldout_fraction")), tmp, held, &n_held);
    if (!s) s = kiln_bpe_train(ptrs, n, &p, out);
    if (n_held) unlink(tmp);
    if (s && n_held) unlink(held);
    free(paths);
    if (s) return s;
    json_t *m = json_object();
    kiln_tokenizer *tok = NULL;
    if (n_held && kiln_tokenizer_load_file(out, &tok) == KILN_OK && !measure(tok, held, m)) json_object_clear(m);
    kiln_tokenizer_free(tok);
    pthread_mutex_lock(&w->mu);
    json_object_set_new(j->outputs, "tokenizer", json_string(out));
    if (json_object_size(m)) json_object_set_new(j->outputs, "heldout", m), json_object_set_new(m, "file", json_string(held));
    else json_decref(m);
    pthread_mutex_unlock(&w->mu);
    return KILN_OK;
}

static kiln_status run_data(wb *w, wb_job *j, prog_ctx *pc) {
    char (*paths)[4096] = malloc(64 * sizeof *paths); /* (64) the corpora's files */
    const char *ptrs[64];
    int n;
    kiln_status s = paths ? corpus_paths(w, json_object_get(j->params, "corpus"), paths, ptrs, &n) : KILN_ERR_NOMEM;
    if (s) {
        free(paths);
        return s;
    }
    char tp[4096], out[4096], name[WB_NAME_MAX + 8];
    snprintf(name, sizeof name, "%s.gguf", pstr(j->params, "tokenizer"));
    wb_path(w, tp, sizeof tp, "tokenizers", name);
    wb_path(w, out, sizeof out, "data", pstr(j->params, "name"));
    kiln_tokenizer *tok;
    if ((s = kiln_data_tokenizer_load(tp, &tok))) {
        free(paths);
        return s;
    }
    kiln_data_params p = kiln_data_default();
    p.val_fraction = json_number_value(json_object_get(j->params, "val_fraction"));
    p.progress = on_progress, p.progress_ud = pc;
    kiln_data_stats st = {0};
    s = kiln_data_write(ptrs, n, tok, out, &p, &st);
    kiln_tokenizer_free(tok);
    free(paths);
    if (s) return s;
    pthread_mutex_lock(&w->mu);
    json_object_set_new(j->outputs, "data", json_string(out));
    json_object_set_new(j->outputs, "train_tokens", json_integer(st.n_train_tokens));
    json_object_set_new(j->outputs, "val_tokens", json_integer(st.n_val_tokens));
    pthread_mutex_unlock(&w->mu);
    return KILN_OK;
}

static kiln_status run_train(wb *w, wb_job *j, prog_ctx *pc) {
    json_t *p = j->params, *d = json_object_get(p, "dims");
    const char *name = pstr(p, "name");
    char rdir[4096], ckpt[4200], log[4200], exp[4200], data[4096], tp[4096], tname[WB_NAME_MAX + 8];
    wb_path(w, rdir, sizeof rdir, "runs", name);
    wb_path(w, data, sizeof data, "data", pstr(p, "data"));
    snprintf(tname, sizeof tname, "%s.gguf", pstr(p, "tokenizer"));
    wb_path(w, tp, sizeof tp, "tokenizers", tname);
    snprintf(ckpt, sizeof ckpt, "%s/ckpt.gguf", rdir);
    snprintf(log, sizeof log, "%s/log.jsonl", rdir);
    snprintf(exp, sizeof exp, "%s/model.gguf", rdir);
    if (mkdir(rdir, 0755) && errno != EEXIST) return kiln_fail(KILN_ERR_IO, "cannot make %s: %s", rdir, strerror(errno));
    bool resume = json_is_string(json_object_get(p, "resume")); /* the run's own name: continue its checkpoint */
    char from[4300]; /* the checkpoint resumed: ckpt.gguf, or ckpt-STEP.gguf of from_step */
    if (json_object_get(p, "from_step")) snprintf(from, sizeof from, "%s/ckpt-%lld.gguf", rdir, (long long)pint(p, "from_step"));
    else snprintf(from, sizeof from, "%s", ckpt);
    if (resume && !regular_file(from)) return kiln_fail(KILN_ERR_NOT_FOUND, "run '%s' has no checkpoint %s to resume", name, from);
    snprintf(pc->ckpt, sizeof pc->ckpt, "%s", ckpt);
    kiln_train_opts o = kiln_train_defaults();
    o.dims = (kiln_model_dims){.n_embd = pint(d, "n_embd"), .n_layer = pint(d, "n_layer"), .n_head = pint(d, "n_head"),
                               .n_head_kv = pint(d, "n_head_kv"), .n_ff = pint(d, "n_ff")};
    o.tokenizer = tp, o.data_dir = data, o.resume = resume ? from : NULL;
    o.B = pint(p, "batch"), o.T = pint(p, "context"), o.steps = pint(p, "steps");
    o.time_budget_s = json_number_value(json_object_get(p, "time_budget_s"));
    o.lr.lr = (float)json_number_value(json_object_get(p, "lr"));
    o.lr.min_lr = json_object_get(p, "min_lr") ? (float)json_number_value(json_object_get(p, "min_lr")) : o.lr.lr / 10;
    o.lr.total = o.steps; /* the warmup default is kiln train's: a tenth of the steps */
    o.lr.warmup = json_object_get(p, "warmup") ? pint(p, "warmup") : o.steps / 10;
    const char *sched = pstr(p, "lr_schedule");
    o.lr.decay = !sched || strcmp(sched, "cosine") == 0 ? KILN_LR_COSINE : strcmp(sched, "linear") == 0 ? KILN_LR_LINEAR : KILN_LR_CONSTANT;
    o.adam.eight_bit = json_is_true(json_object_get(p, "eight_bit"));
    o.mixed = json_is_true(json_object_get(p, "mixed"));
    o.seed = (uint64_t)pint(p, "seed");
    o.n_threads = (int)pint(p, "threads");
    const char *dev = pstr(p, "device");
    if (dev && strncmp(dev, "cuda:", 5) == 0) o.device = (kiln_device){KILN_DEVICE_CUDA, atoi(dev + 5)};
    o.eval_interval = pint(p, "eval_interval"), o.eval_batches = pint(p, "eval_batches");
    o.ckpt_interval = pint(p, "ckpt_interval");
    o.ckpt_path = ckpt, o.log_path = log, o.out_path = exp, o.name = name;
    o.cancel = &j->cancel, o.pause = &j->pause;
    pthread_mutex_lock(&w->mu);
    json_object_set_new(j->outputs, "run", json_string(rdir));
    json_object_set_new(j->outputs, "log", json_string(log));
    pthread_mutex_unlock(&w->mu);
    kiln_status s = kiln_train_run(&o, on_progress, pc);
    pthread_mutex_lock(&w->mu);
    if (regular_file(ckpt)) json_object_set_new(j->outputs, "checkpoint", json_string(ckpt));
    if (regular_file(exp)) json_object_set_new(j->outputs, "export", json_string(exp));
    pthread_mutex_unlock(&w->mu);
    return s;
}

/* A checkpoint of a run to DIR/models/NAME.gguf: its weights exported (F32), then quantized to type unless f32. */
static kiln_status run_export(wb *w, wb_job *j, prog_ctx *pc) {
    json_t *p = j->params;
    char rdir[4096], ck[4300], out[4096], tmp[4200], file[WB_NAME_MAX + 16];
    wb_path(w, rdir, sizeof rdir, "runs", pstr(p, "run"));
    snprintf(ck, sizeof ck, "%s/ckpt-%lld.gguf", rdir, (long long)pint(p, "step"));
    if (!regular_file(ck)) return kiln_fail(KILN_ERR_NOT_FOUND, "run '%s' has no checkpoint of step %lld", pstr(p, "run"), (long long)pint(p, "step"));
    snprintf(file, sizeof file, "%s.gguf", pstr(p, "name"));
    wb_path(w, out, sizeof out, "models", file);
    snprintf(file, sizeof file, ".%s.f32.tmp", pstr(p, "name")); /* hidden until whole */
    wb_path(w, tmp, sizeof tmp, "models", file);
    kiln_ftype ft;
    kiln_status s = kiln_ftype_from_name(pstr(p, "type"), &ft);
    if (s) return s;
    kiln_train_opts o = kiln_train_defaults();
    o.resume = ck, o.steps = (int64_t)1e12; /* any step the run reached */
    pthread_mutex_lock(&w->mu);
    for (size_t i = w->n_jobs; i-- > 0;) { /* what the checkpoint must be resumed with: the run's last train job's */
        json_t *q = w->jobs[i]->params;
        if (w->jobs[i]->kind != WB_TRAIN || !pstr(q, "name") || strcmp(pstr(q, "name"), pstr(p, "run"))) continue;
        o.adam.eight_bit = json_is_true(json_object_get(q, "eight_bit")), o.mixed = json_is_true(json_object_get(q, "mixed"));
        o.B = pint(q, "batch"), o.T = pint(q, "context");
        break;
    }
    pthread_mutex_unlock(&w->mu);
    kiln_trainer *t;
    if ((s = kiln_trainer_new(&o, &t))) return s;
    on_progress(pc, &(kiln_progress){.stage = "export", .done = 0, .total = 2, .metric = NAN});
    s = kiln_trainer_export(t, ft == KILN_FTYPE_ALL_F32 ? out : tmp);
    kiln_trainer_free(t);
    if (!s && ft != KILN_FTYPE_ALL_F32) {
        on_progress(pc, &(kiln_progress){.stage = "export", .done = 1, .total = 2, .metric = NAN});
        kiln_quantize_params q = {.ftype = ft, .progress = on_progress, .progress_ud = pc};
        s = kiln_quantize_file(tmp, out, &q);
    }
    unlink(tmp);
    if (s) return s;
    struct stat sb;
    pthread_mutex_lock(&w->mu);
    json_object_set_new(j->outputs, "model", json_string(out));
    if (stat(out, &sb) == 0) json_object_set_new(j->outputs, "bytes", json_integer((json_int_t)sb.st_size));
    pthread_mutex_unlock(&w->mu);
    return KILN_OK;
}

static kiln_status (*const RUNS[WB_N_KINDS])(wb *, wb_job *, prog_ctx *) = {run_tokenizer, run_data, run_train, run_export};

/* ---------------------------------------------------------------- queues */

static wb_job *next_queued(wb *w, const char *queue) {
    for (size_t i = 0; i < w->n_jobs; i++)
        if (w->jobs[i]->state == WB_QUEUED && strcmp(w->jobs[i]->queue, queue) == 0) return w->jobs[i];
    return NULL;
}

static void *worker(void *arg) {
    wb_queue *q = arg;
    wb *w = q->w;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        wb_job *j = NULL;
        while (!w->closing && !(j = next_queued(w, q->name))) pthread_cond_wait(&w->cv, &w->mu);
        if (!j) break;
        j->state = WB_RUNNING, j->started = unix_now(), j->t0 = srv_now();
        q->running = j;
        job_write(w, j);
        pthread_cond_broadcast(&w->cv);
        pthread_mutex_unlock(&w->mu);
        prog_ctx pc = {w, j, ""};
        kiln_status s = RUNS[j->kind](w, j, &pc);
        pthread_mutex_lock(&w->mu);
        if (s) j->state = WB_FAILED, snprintf(j->error, sizeof j->error, "%s", kiln_last_error());
        else j->state = __atomic_load_n(&j->cancel, __ATOMIC_RELAXED) ? WB_STOPPED : WB_DONE;
        j->ended = unix_now();
        q->running = NULL;
        job_write(w, j);
        pthread_cond_broadcast(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

/* The queue named name, its worker started; the caller holds w->mu. NULL when there are too many. */
static wb_queue *queue_of(wb *w, const char *name) {
    for (int i = 0; i < w->n_queues; i++)
        if (strcmp(w->queues[i].name, name) == 0) return &w->queues[i];
    if (w->n_queues == WB_MAX_QUEUES) return NULL;
    wb_queue *q = &w->queues[w->n_queues];
    memset(q, 0, sizeof *q);
    snprintf(q->name, sizeof q->name, "%s", name);
    q->w = w;
    if (pthread_create(&q->th, NULL, worker, q)) return NULL;
    q->started = true;
    w->n_queues++;
    return q;
}

bool wb_submit(wb *w, wb_kind kind, const char *queue, json_t *params, wb_job **out) {
    *out = NULL;
    wb_job *j = job_alloc();
    if (!j) {
        json_decref(params);
        return false;
    }
    j->kind = kind, j->params = params, j->state = WB_QUEUED, j->created = unix_now();
    snprintf(j->queue, sizeof j->queue, "%s", queue);
    pthread_mutex_lock(&w->mu);
    bool ok = !w->closing && queue_of(w, j->queue) && add_job(w, j);
    if (ok) {
        j->num = w->next_num++;
        snprintf(j->id, sizeof j->id, "j%lld", (long long)j->num);
        job_write(w, j);
        pthread_cond_broadcast(&w->cv);
        *out = j;
    }
    pthread_mutex_unlock(&w->mu);
    if (!ok) job_free(j);
    return ok;
}

wb_job *wb_find(wb *w, const char *id) {
    for (size_t i = 0; i < w->n_jobs; i++)
        if (strcmp(w->jobs[i]->id, id) == 0) return w->jobs[i];
    return NULL;
}

/* A stop of j (held under w->mu): a queued one at once, a running or paused train after its step. */
static int stop_job(wb *w, wb_job *j, char *msg, size_t cap) {
    if (j->state == WB_QUEUED) {
        j->state = WB_STOPPED, j->ended = unix_now();
        job_write(w, j);
        pthread_cond_broadcast(&w->cv);
    } else if (j->state >= WB_DONE) {
        snprintf(msg, cap, "job %s is %s already: only a queued, running or paused job can be stopped", j->id, wb_state_name(j->state));
        return 409;
    } else if (j->kind != WB_TRAIN) {
        snprintf(msg, cap, "job %s is a running %s job, which cannot be stopped mid-way: it ends on its own", j->id, wb_kind_name(j->kind));
        return 409;
    } else {
        __atomic_store_n(&j->cancel, 1, __ATOMIC_RELAXED); /* kiln_train_run stops after the current step */
    }
    return 200;
}

/* A pause (pause true) or resume of j, a running train job; w->mu held. */
static int pause_job(wb_job *j, bool pause, char *msg, size_t cap) {
    if (j->kind != WB_TRAIN || (j->state != WB_RUNNING && j->state != WB_PAUSED)) {
        snprintf(msg, cap, "job %s is a %s %s job: only a running train job can be %s", j->id, wb_state_name(j->state), wb_kind_name(j->kind),
                 pause ? "paused" : "resumed");
        return 409;
    }
    if (__atomic_load_n(&j->pause, __ATOMIC_RELAXED) == (int)pause) {
        snprintf(msg, cap, "job %s is %s already", j->id, pause ? "pausing or paused" : "running");
        return 409;
    }
    __atomic_store_n(&j->pause, (int)pause, __ATOMIC_RELAXED); /* kiln_train_run waits before its next step */
    return 200;
}

int wb_act(wb *w, const char *id, wb_action a, char *msg, size_t cap) {
    pthread_mutex_lock(&w->mu);
    wb_job *j = wb_find(w, id);
    int status = !j ? 404 : a == WB_STOP ? stop_job(w, j, msg, cap) : pause_job(j, a == WB_PAUSE, msg, cap);
    if (!j) snprintf(msg, cap, "no job %s", id);
    pthread_mutex_unlock(&w->mu);
    return status;
}

void wb_close(wb *w) {
    pthread_mutex_lock(&w->mu);
    w->closing = true;
    for (int i = 0; i < w->n_queues; i++)
        if (w->queues[i].running && w->queues[i].running->kind == WB_TRAIN) __atomic_store_n(&w->queues[i].running->cancel, 1, __ATOMIC_RELAXED);
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

void wb_free(wb *w, double wait_s) {
    if (!w) return;
    wb_close(w);
    double t0 = srv_now();
    bool busy = false;
    for (;;) {
        pthread_mutex_lock(&w->mu);
        busy = false;
        for (int i = 0; i < w->n_queues; i++) busy |= w->queues[i].running != NULL;
        if (busy && srv_now() - t0 >= wait_s) { /* left to the process's exit: say so in its file */
            for (int i = 0; i < w->n_queues; i++) {
                wb_job *j = w->queues[i].running;
                if (!j) continue;
                j->state = WB_FAILED, j->ended = unix_now();
                snprintf(j->error, sizeof j->error, "the server stopped while it ran");
                job_write(w, j);
            }
            pthread_mutex_unlock(&w->mu);
            return;
        }
        pthread_mutex_unlock(&w->mu);
        if (!busy) break;
        usleep(50 * 1000);
    }
    for (int i = 0; i < w->n_queues; i++)
        if (w->queues[i].started) pthread_join(w->queues[i].th, NULL);
    for (size_t i = 0; i < w->n_jobs; i++) job_free(w->jobs[i]);
    if (w->toks_free) w->toks_free(w->toks);
    free(w->jobs), free(w->dir), free(w->examples), free(w->bundled);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    free(w);
}

/* ---------------------------------------------------------------- the event stream */

struct wb_sse {
    wb *w;
    wb_job *j;
    int64_t next; /* the seq of the next event to send */
    bool ended;
    srv_sse_buf q; /* the events formatted, not yet read */
};

wb_sse *wb_sse_new(wb *w, wb_job *j) {
    wb_sse *s = calloc(1, sizeof *s);
    if (s) s->w = w, s->j = j;
    return s;
}

/* The events not sent yet, then the end once the job is over; the caller holds w->mu. */
static void sse_fill(wb_sse *s) {
    json_t *ev = s->j->events;
    size_t n = json_array_size(ev), i = n;
    while (i > 0 && json_integer_value(json_object_get(json_array_get(ev, i - 1), "seq")) >= s->next) i--;
    for (; i < n; i++) {
        json_t *e = json_array_get(ev, i);
        if (!srv_sse_append(&s->q, "progress", e)) return;
        s->next = json_integer_value(json_object_get(e, "seq")) + 1;
    }
    if (s->j->state >= WB_DONE && s->next >= s->j->n_seq) {
        json_t *o = wb_job_json(s->j, false);
        if (o && srv_sse_append(&s->q, "end", o)) s->ended = true;
        json_decref(o);
    }
}

long wb_sse_read(void *ud, char *buf, size_t cap, bool (*alive)(void *), void *aud) {
    wb_sse *s = ud;
    pthread_mutex_lock(&s->w->mu);
    for (;;) {
        size_t k = srv_sse_take(&s->q, buf, cap);
        if (!k && !s->ended) sse_fill(s), k = srv_sse_take(&s->q, buf, cap);
        if (k) {
            pthread_mutex_unlock(&s->w->mu);
            return (long)k;
        }
        if (s->ended || s->w->closing) {
            pthread_mutex_unlock(&s->w->mu);
            return 0;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 200 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&s->w->cv, &s->w->mu, &ts);
        if (alive && !alive(aud)) { /* the client is gone: it is dropped, the job goes on */
            pthread_mutex_unlock(&s->w->mu);
            return -1;
        }
    }
}

void wb_sse_free(void *ud) {
    wb_sse *s = ud;
    if (!s) return;
    free(s->q.p);
    free(s);
}
