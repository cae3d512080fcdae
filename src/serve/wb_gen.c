/* wb_gen.c: the workbench's Generate tab (docs/workbench.md):
 *   GET  /wb/models     every checkpoint (run:NAME@STEP), each run's export (run:NAME), the GGUFs in DIR/models
 *                       (gguf:FILE), the bundled model (bundled) and the -m model (served)
 *   POST /wb/generate   a prompt (or chat messages) through one of them, streamed as SSE: the prompt's tokens, then
 *                       each token with its piece and the model's top-n probabilities at that step, then the end
 * A request has its own session (CPU threads or a GPU) on a model kept loaded for the next (at most WB_MODELS, by
 * path, size and modification time; counted while a stream uses one). The stream runs on the connection's thread:
 * each read makes the next token, and a client that goes away ends it. */
#include "serve/jobs.h"
#include "serve/sched.h" /* srv_now */
#include "serve/serve.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#define WB_MODELS 2
#define TOP_MAX 10

/* ---------------------------------------------------------------- models */

typedef struct {
    char path[4096];
    int64_t size, mtime_ns;
    kiln_model *m;
    int refs;
    uint64_t used;
} model_entry;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER; /* the loaded models: one set per process (one workbench) */
static model_entry g_models[WB_MODELS];
static uint64_t g_clock;

/* The file of model id (the top says which), or "" for "served"; false with a 400/404. */
static bool model_path(srv_server *s, const char *id, char *buf, size_t cap, srv_response *rs) {
    struct stat sb;
    char name[WB_NAME_MAX + 1];
    buf[0] = 0;
    if (id && strcmp(id, "served") == 0) {
        if (s->m) return true;
        srv_error(rs, 404, "model", "no model is served (kiln serve -m MODEL.gguf)");
        return false;
    }
    if (id && strcmp(id, "bundled") == 0) {
        if (s->wb->bundled && (size_t)snprintf(buf, cap, "%s", s->wb->bundled) < cap && stat(buf, &sb) == 0) return true;
    } else if (id && strncmp(id, "gguf:", 5) == 0 && wb_name_ok(id + 5)) {
        if (wb_path(s->wb, buf, cap, "models", id + 5) && stat(buf, &sb) == 0 && S_ISREG(sb.st_mode)) return true;
    } else if (id && strncmp(id, "run:", 4) == 0) {
        const char *at = strchr(id + 4, '@');
        size_t k = at ? (size_t)(at - id - 4) : strlen(id + 4);
        char *end = NULL;
        long long step = at ? strtoll(at + 1, &end, 10) : 0;
        if (k <= WB_NAME_MAX && (!at || (at[1] >= '1' && at[1] <= '9' && !*end))) {
            memcpy(name, id + 4, k), name[k] = 0;
            char dir[4096];
            if (wb_name_ok(name) && wb_path(s->wb, dir, sizeof dir, "runs", name)) {
                int n = at ? snprintf(buf, cap, "%s/ckpt-%lld.gguf", dir, step) : snprintf(buf, cap, "%s/model.gguf", dir);
                if (n > 0 && (size_t)n < cap && stat(buf, &sb) == 0 && S_ISREG(sb.st_mode)) return true;
            }
        }
    } else {
        srv_error(rs, 400, "model", "model must be run:NAME@STEP, run:NAME, gguf:FILE, bundled or served (GET /wb/models)");
        return false;
    }
    srv_error(rs, 404, "model", "no model %s (GET /wb/models lists them)", id);
    return false;
}

/* The model of path (loading it, or the served one for ""), held until model_put; NULL with a 422/503. */
static const kiln_model *model_get(srv_server *s, const char *path, model_entry **held, srv_response *rs) {
    *held = NULL;
    if (!path[0]) return s->m;
    struct stat sb;
    if (stat(path, &sb) != 0) {
        srv_error(rs, 404, "model", "%s is gone", path);
        return NULL;
    }
    int64_t mt = (int64_t)sb.st_mtim.tv_sec * 1000000000 + sb.st_mtim.tv_nsec;
    pthread_mutex_lock(&g_mu);
    model_entry *hit = NULL, *slot = NULL;
    for (int i = 0; i < WB_MODELS; i++) {
        model_entry *e = &g_models[i];
        if (e->m && strcmp(e->path, path) == 0 && e->size == (int64_t)sb.st_size && e->mtime_ns == mt) hit = e;
        if (e->refs == 0 && (!slot || !e->m || (slot->m && e->used < slot->used))) slot = e;
    }
    if (!hit && slot) {
        kiln_model *m;
        if (kiln_model_load(path, &m)) {
            pthread_mutex_unlock(&g_mu);
            srv_error(rs, 422, "model", "%s", kiln_last_error());
            return NULL;
        }
        kiln_model_free(slot->m);
        *slot = (model_entry){.size = (int64_t)sb.st_size, .mtime_ns = mt, .m = m};
        snprintf(slot->path, sizeof slot->path, "%s", path);
        hit = slot;
    }
    if (hit) hit->refs++, hit->used = ++g_clock;
    pthread_mutex_unlock(&g_mu);
    if (!hit) srv_error(rs, 503, NULL, "every model slot is generating: try again when one ends");
    *held = hit;
    return hit ? hit->m : NULL;
}

static void model_put(model_entry *e) {
    if (!e) return;
    pthread_mutex_lock(&g_mu);
    e->refs--;
    pthread_mutex_unlock(&g_mu);
}

/* Whether the GGUF at path has a chat template kiln knows. */
static bool has_chat(const char *path) {
    kiln_gguf *g;
    if (kiln_gguf_open(path, &g)) return false;
    kiln_str t;
    kiln_chat_template ct;
    bool ok = kiln_gguf_get_str(g, "tokenizer.chat_template", &t) == KILN_OK && kiln_chat_template_from_text(t.ptr, (size_t)t.len, &ct) == KILN_OK;
    kiln_gguf_close(g);
    return ok;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The entries of dir with a workbench name (sorted, at most 512) into names; their count. */
static size_t list_dir(const char *dir, char **names) {
    DIR *d = opendir(dir);
    size_t n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)) && n < 512)
        if (wb_name_ok(e->d_name) && (names[n] = strdup(e->d_name))) n++;
    if (d) closedir(d);
    qsort(names, n, sizeof *names, cmp_str);
    return n;
}

/* The val_loss a train job of run recorded for step, or NaN; w->mu held. */
static double val_loss_at(wb *w, const char *run, long long step) {
    double v = NAN;
    for (size_t k = 0; k < w->n_jobs; k++) {
        const char *jn = json_string_value(json_object_get(w->jobs[k]->params, "name"));
        if (w->jobs[k]->kind != WB_TRAIN || !jn || strcmp(jn, run)) continue;
        size_t i;
        json_t *c;
        json_array_foreach(json_object_get(w->jobs[k]->outputs, "checkpoints"), i, c)
            if (json_integer_value(json_object_get(c, "step")) == step && json_is_number(json_object_get(c, "val_loss")))
                v = json_number_value(json_object_get(c, "val_loss"));
    }
    return v;
}

void srv_route_wb_models(srv_server *s, const srv_request *rq, srv_response *rs) {
    if (!srv_wb_on(s, rs)) return;
    json_t *list = json_array();
    char dir[4096], *runs[512], *files[512];
    wb_path(s->wb, dir, sizeof dir, "runs", NULL);
    size_t nr = list_dir(dir, runs);
    pthread_mutex_lock(&s->wb->mu);
    for (size_t i = 0; i < nr; i++) {
        char rdir[8192], p[8400], id[WB_NAME_MAX + 32], label[WB_NAME_MAX + 64];
        snprintf(rdir, sizeof rdir, "%s/%s", dir, runs[i]);
        size_t nf = list_dir(rdir, files);
        long long steps[512];
        size_t ns = 0;
        for (size_t k = 0; k < nf; k++) {
            char tail[8];
            if (sscanf(files[k], "ckpt-%lld.%7s", &steps[ns], tail) == 2 && strcmp(tail, "gguf") == 0 && steps[ns] > 0) ns++;
            free(files[k]);
        }
        for (size_t a = 1; a < ns; a++) /* step order */
            for (size_t b = a; b > 0 && steps[b - 1] > steps[b]; b--) {
                long long t = steps[b];
                steps[b] = steps[b - 1], steps[b - 1] = t;
            }
        for (size_t k = 0; k < ns; k++) {
            snprintf(id, sizeof id, "run:%s@%lld", runs[i], steps[k]);
            double v = val_loss_at(s->wb, runs[i], steps[k]);
            if (isfinite(v)) snprintf(label, sizeof label, "%s, step %lld (val loss %.3f)", runs[i], steps[k], v);
            else snprintf(label, sizeof label, "%s, step %lld", runs[i], steps[k]);
            json_array_append_new(list, json_pack("{s:s,s:s,s:s,s:s,s:I,s:b}", "id", id, "kind", "checkpoint", "label", label, "run", runs[i], "step",
                                                  (json_int_t)steps[k], "chat", 0));
        }
        snprintf(p, sizeof p, "%s/model.gguf", rdir);
        struct stat sb;
        if (stat(p, &sb) == 0) {
            snprintf(id, sizeof id, "run:%s", runs[i]);
            snprintf(label, sizeof label, "%s, export", runs[i]);
            json_array_append_new(list, json_pack("{s:s,s:s,s:s,s:s,s:b}", "id", id, "kind", "export", "label", label, "run", runs[i], "chat", 0));
        }
        free(runs[i]);
    }
    pthread_mutex_unlock(&s->wb->mu);
    wb_path(s->wb, dir, sizeof dir, "models", NULL);
    size_t nm = list_dir(dir, files);
    for (size_t i = 0; i < nm; i++) {
        char p[8400], id[WB_NAME_MAX + 8];
        size_t k = strlen(files[i]);
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        snprintf(id, sizeof id, "gguf:%s", files[i]);
        if (k > 5 && strcmp(files[i] + k - 5, ".gguf") == 0)
            json_array_append_new(list, json_pack("{s:s,s:s,s:s,s:b}", "id", id, "kind", "gguf", "label", files[i], "chat", has_chat(p)));
        free(files[i]);
    }
    if (s->wb->bundled)
        json_array_append_new(list, json_pack("{s:s,s:s,s:s,s:b}", "id", "bundled", "kind", "gguf", "label", "shakespeare.gguf (bundled)", "chat",
                                              has_chat(s->wb->bundled)));
    if (s->m) {
        kiln_chat_template ct;
        json_array_append_new(list, json_pack("{s:s,s:s,s:s,s:b}", "id", "served", "kind", "served", "label", s->model_name, "chat",
                                              kiln_chat_template_detect(s->m, &ct) == KILN_OK));
    }
    srv_json(rs, 200, json_pack("{s:o}", "models", list));
}

/* ---------------------------------------------------------------- generation */

typedef struct gen {
    model_entry *held;
    const kiln_model *m;
    const kiln_tokenizer *tok;
    kiln_session *ss;
    kiln_sampler *smp;
    kiln_tokens ids;    /* the prompt, then each token made */
    size_t n_prompt;
    float *logits, *work; /* (V) the last logits; the sampler's copy */
    int64_t V;
    int64_t n_predict, made;
    int top_n;
    int32_t eos, eot;   /* -1: none */
    char pend[8];       /* bytes of a character not complete yet */
    size_t n_pend;
    double t0;
    int phase;          /* 0 the prompt, 1 tokens, 2 the end sent */
    srv_sse_buf q;      /* the events formatted, not yet read */
} gen;

static void gen_free(void *ud) {
    gen *g = ud;
    if (!g) return;
    kiln_session_free(g->ss);
    kiln_sampler_free(g->smp);
    kiln_tokens_free(&g->ids);
    free(g->logits), free(g->work), free(g->q.p);
    model_put(g->held);
    free(g);
}

/* Appends an event (data taken) to the stream's queue. */
static bool emit(gen *g, const char *event, json_t *data) {
    bool ok = srv_sse_append(&g->q, event, data);
    json_decref(data);
    return ok;
}

/* The text of token id (its bytes, invalid UTF-8 as U+FFFD). */
static json_t *piece(const kiln_tokenizer *t, int32_t id) {
    char b[512];
    size_t k;
    if (kiln_tokenizer_piece(t, id, true, b, sizeof b, &k) || k > sizeof b) k = 0;
    size_t m;
    char *c = srv_utf8_sanitize(b, k, &m);
    json_t *j = c ? json_stringn(c, m) : json_string("");
    free(c);
    return j;
}

/* How many of the n bytes at p end in whole characters: a lead byte whose sequence runs past the end is held back. */
static size_t whole(const char *p, size_t n) {
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        unsigned char c = (unsigned char)p[n - back];
        if ((c & 0xC0) == 0x80) continue;
        size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        return len > back ? n - back : n;
    }
    return n;
}

/* The token event of the logits in g->logits: the top-n at temperature 1, the sampled token, its text so far. */
static bool next_token(gen *g, int32_t *id) {
    float mx = -INFINITY;
    for (int64_t i = 0; i < g->V; i++) mx = g->logits[i] > mx ? g->logits[i] : mx;
    double sum = 0;
    for (int64_t i = 0; i < g->V; i++) sum += exp((double)(g->logits[i] - mx));
    int32_t top[TOP_MAX];
    int nt = 0;
    for (int64_t i = 0; g->top_n > 0 && i < g->V; i++) { /* insertion into the top_n, largest first */
        if (nt == g->top_n && !(g->logits[i] > g->logits[top[nt - 1]])) continue;
        int k = nt < g->top_n ? nt++ : nt - 1;
        while (k > 0 && g->logits[top[k - 1]] < g->logits[i]) top[k] = top[k - 1], k--;
        top[k] = (int32_t)i;
    }
    memcpy(g->work, g->logits, (size_t)g->V * sizeof *g->work);
    *id = kiln_sampler_sample(g->smp, g->work, g->ids.ids, g->ids.n);
    json_t *tops = json_array();
    for (int k = 0; k < nt; k++)
        json_array_append_new(tops, json_pack("{s:i,s:o,s:f}", "id", (int)top[k], "piece", piece(g->tok, top[k]), "p",
                                              exp((double)(g->logits[top[k]] - mx)) / sum));
    char b[520];
    size_t k = 0;
    if (kiln_tokenizer_piece(g->tok, *id, false, b + g->n_pend, sizeof b - g->n_pend, &k) || k > sizeof b - g->n_pend) k = 0;
    memcpy(b, g->pend, g->n_pend);
    k += g->n_pend;
    size_t w = whole(b, k), m;
    g->n_pend = k - w;
    memcpy(g->pend, b + w, g->n_pend);
    char *text = srv_utf8_sanitize(b, w, &m);
    json_t *ev = json_pack("{s:i,s:o,s:s%,s:f,s:o}", "id", (int)*id, "piece", piece(g->tok, *id), "text", text ? text : "", text ? m : 0, "p",
                           exp((double)(g->logits[*id] - mx)) / sum, "top", tops);
    free(text);
    return emit(g, "token", ev);
}

static bool end(gen *g, const char *stop) {
    double dt = srv_now() - g->t0;
    g->phase = 2;
    return emit(g, "end", json_pack("{s:I,s:s,s:f}", "n_tokens", (json_int_t)g->made, "stop", stop, "tok_s", dt > 0 ? (double)g->made / dt : 0.0));
}

/* One step of the stream into g->buf: the prompt's evaluation and tokens, a token, or the end. */
static void step(gen *g) {
    if (g->phase == 0) {
        g->phase = 1;
        json_t *list = json_array();
        for (size_t i = 0; i < g->n_prompt; i++) json_array_append_new(list, json_pack("{s:i,s:o}", "id", (int)g->ids.ids[i], "piece", piece(g->tok, g->ids.ids[i])));
        if (kiln_session_eval(g->ss, g->ids.ids, g->n_prompt, g->logits, NULL)) {
            json_decref(list);
            g->phase = 2, emit(g, "error", json_pack("{s:s}", "message", kiln_last_error()));
            return;
        }
        g->t0 = srv_now();
        emit(g, "prompt", json_pack("{s:o}", "tokens", list));
        return;
    }
    int32_t id;
    if (!next_token(g, &id)) {
        g->phase = 2, emit(g, "error", json_pack("{s:s}", "message", "out of memory"));
        return;
    }
    g->made++;
    if (g->ids.n == g->ids.cap) { /* the history, for the sampler's penalties */
        size_t cap = g->ids.cap ? 2 * g->ids.cap : 64;
        int32_t *p = realloc(g->ids.ids, cap * sizeof *p);
        if (p) g->ids.ids = p, g->ids.cap = cap;
    }
    if (g->ids.n < g->ids.cap) g->ids.ids[g->ids.n++] = id;
    if (id == g->eos || id == g->eot) {
        end(g, "eos");
    } else if (g->made >= g->n_predict) {
        end(g, "length");
    } else if (kiln_session_eval(g->ss, &id, 1, g->logits, NULL)) {
        g->phase = 2, emit(g, "error", json_pack("{s:s}", "message", kiln_last_error()));
    }
}

static long gen_read(void *ud, char *buf, size_t cap, bool (*alive)(void *), void *aud) {
    gen *g = ud;
    size_t k;
    while (!(k = srv_sse_take(&g->q, buf, cap))) {
        if (g->phase == 2) return 0;
        if (alive && !alive(aud)) return -1; /* the client is gone: no more tokens for it */
        step(g);
    }
    return (long)k;
}

/* A number field of body in [lo, hi] (dflt when absent) into *out; false with a 400. */
static bool num_field(json_t *body, const char *k, double lo, double hi, double dflt, bool integer, double *out, srv_response *rs) {
    json_t *v = json_object_get(body, k);
    *out = dflt;
    if (!v || json_is_null(v)) return true;
    if (!json_is_number(v) || (integer && !json_is_integer(v)) || !(json_number_value(v) >= lo && json_number_value(v) <= hi)) {
        srv_error(rs, 400, k, "%s must be %s in [%g, %g]", k, integer ? "an integer" : "a number", lo, hi);
        return false;
    }
    *out = json_number_value(v);
    return true;
}

void srv_route_wb_generate(srv_server *s, const srv_request *rq, srv_response *rs) {
    if (!srv_wb_on(s, rs)) return;
    json_t *body = srv_body_object(rq, rs);
    if (!body) return;
    static const char *const known[] = {"model", "prompt", "messages", "n_predict", "temperature", "top_k", "top_p", "min_p", "seed", "top_n", "device", NULL};
    gen *g = calloc(1, sizeof *g);
    char path[4096];
    double n_predict, temp, top_k, top_p, min_p, seed, top_n;
    json_t *prompt = json_object_get(body, "prompt"), *msgs = json_object_get(body, "messages");
    json_t *devj = json_object_get(body, "device");
    const char *dev = json_string_value(devj);
    if (!g) {
        srv_error(rs, 500, NULL, "out of memory");
        goto fail;
    }
    if (!wb_known_fields(body, known, rs) || !num_field(body, "n_predict", 1, 4096, 128, true, &n_predict, rs) ||
        !num_field(body, "temperature", 0, 100, 0.8, false, &temp, rs) || !num_field(body, "top_k", 0, 1e9, 40, true, &top_k, rs) ||
        !num_field(body, "top_p", 0, 1, 0.95, false, &top_p, rs) || !num_field(body, "min_p", 0, 1, 0.05, false, &min_p, rs) ||
        !num_field(body, "seed", 0, 9007199254740991.0, -1, true, &seed, rs) || !num_field(body, "top_n", 0, TOP_MAX, 5, true, &top_n, rs))
        goto fail;
    if (!!prompt == !!msgs || (prompt && (!json_is_string(prompt) || strlen(json_string_value(prompt)) != json_string_length(prompt)))) {
        srv_error(rs, 400, prompt ? "prompt" : "messages", prompt && msgs ? "give prompt or messages, not both" : prompt ? "prompt must be a string without NUL" : "prompt or messages is required");
        goto fail;
    }
    kiln_session_params sp = {0};
    if ((devj && !dev) || (dev && strcmp(dev, "cpu"))) {
        char *e;
        long idx = dev && strncmp(dev, "cuda:", 5) == 0 && dev[5] >= '0' && dev[5] <= '9' ? strtol(dev + 5, &e, 10) : -1;
        if (idx < 0 || *e || idx >= kiln_cuda_device_count()) {
            srv_error(rs, 400, "device", "device must be cpu or cuda:N of the %d GPU%s this server sees", kiln_cuda_device_count(),
                      kiln_cuda_device_count() == 1 ? "" : "s");
            goto fail;
        }
        sp.device = (kiln_device){KILN_DEVICE_CUDA, (int)idx};
    }
    if (!model_path(s, json_string_value(json_object_get(body, "model")), path, sizeof path, rs) || !(g->m = model_get(s, path, &g->held, rs))) goto fail;
    if (!(g->tok = kiln_model_tokenizer(g->m))) {
        srv_error(rs, 422, "model", "the model has no tokenizer");
        goto fail;
    }
    kiln_chat_template ct;
    if (msgs) {
        if (kiln_chat_template_detect(g->m, &ct)) {
            srv_error(rs, 400, "messages", "this model has no chat template kiln knows: send a prompt");
            goto fail;
        }
        if (!srv_parse_messages_with(&ct, g->tok, msgs, &g->ids, rs)) goto fail;
        if (kiln_chat_end_of_turn(&ct, g->tok, &g->eot)) g->eot = -1;
    } else {
        g->eot = -1;
        if (kiln_tokenizer_encode(g->tok, json_string_value(prompt), json_string_length(prompt), true, false, &g->ids)) {
            srv_error(rs, 400, "prompt", "%s", kiln_last_error());
            goto fail;
        }
    }
    if (g->ids.n == 0) {
        srv_error(rs, 400, "prompt", "the prompt has no tokens (and the vocabulary adds no BOS): type something");
        goto fail;
    }
    g->n_prompt = g->ids.n, g->n_predict = (int64_t)n_predict, g->top_n = (int)top_n, g->eos = kiln_tokenizer_eos(g->tok);
    g->V = kiln_model_n_vocab(g->m);
    sp.n_ctx = (int64_t)g->n_prompt + g->n_predict;
    kiln_sampler_params smp = kiln_sampler_default();
    smp.temp = (float)temp, smp.top_k = (int32_t)top_k, smp.top_p = (float)top_p, smp.min_p = (float)min_p;
    smp.seed = seed >= 0 ? (uint64_t)seed : (uint64_t)time(NULL) ^ (uint64_t)(uintptr_t)g;
    g->logits = malloc((size_t)g->V * sizeof *g->logits), g->work = malloc((size_t)g->V * sizeof *g->work);
    if (!g->logits || !g->work || kiln_sampler_new(&smp, g->V, &g->smp) || kiln_session_new(g->m, &sp, &g->ss)) {
        srv_error(rs, g->logits && g->work ? 422 : 500, NULL, "%s", g->logits && g->work ? kiln_last_error() : "out of memory");
        goto fail;
    }
    rs->status = 200, rs->content_type = "text/event-stream";
    rs->read = gen_read, rs->read_free = gen_free, rs->read_ud = g;
    json_decref(body);
    return;
fail:
    gen_free(g);
    json_decref(body);
}
