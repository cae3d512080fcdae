/* routes_llama.c: llama-server's routes with its field names: POST /completion, /tokenize, /detokenize,
 * /apply-template, GET /health, /props, /slots and POST /slots/{id}?action=save|restore|erase. */
#include "serve/serve.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *stop_type(srv_finish f) {
    switch (f) {
    case SRV_FIN_EOS: return "eos";
    case SRV_FIN_STOP: return "word";
    case SRV_FIN_LENGTH: case SRV_FIN_CONTEXT: case SRV_FIN_TIMEOUT: return "limit";
    default: return "none";
    }
}

static json_t *settings(srv_server *s, const srv_job *j) {
    json_t *stops = json_array();
    for (int i = 0; j && i < j->g.n_stops; i++) json_array_append_new(stops, json_string(j->g.stops[i]));
    const kiln_sampler_params *p = j ? &j->g.sp : NULL;
    kiln_sampler_params d = kiln_sampler_default();
    if (!p) p = &d;
    const srv_spec_params *sp = srv_sched_spec(s->sched);
    const int n_max = j && j->g.spec_n_max >= 0 && j->g.spec_n_max < sp->draft_max ? j->g.spec_n_max : sp->draft_max;
    const int n_min = j && j->g.spec_n_min >= 0 ? j->g.spec_n_min : sp->draft_min;
    json_t *o = json_pack("{s:I,s:I,s:f,s:i,s:f,s:f,s:f,s:i,s:f,s:f,s:I,s:o,s:i,s:b}", "n_ctx", (json_int_t)srv_sched_n_ctx_slot(s->sched),
                          "n_predict", (json_int_t)(j ? j->g.n_predict : -1), "temperature", (double)p->temp, "top_k", (int)p->top_k, "top_p",
                          (double)p->top_p, "min_p", (double)p->min_p, "repeat_penalty", (double)p->repeat_penalty, "repeat_last_n",
                          (int)p->repeat_last_n, "presence_penalty", (double)p->presence_penalty, "frequency_penalty", (double)p->frequency_penalty,
                          "seed", (json_int_t)(p->seed & 0x7fffffffffffffffull), "stop", stops, "n_probs", j ? j->g.n_probs : 0, "ignore_eos",
                          j ? j->g.ignore_eos : 0);
    if (o) { /* llama-server's names; n_max 0 where the server does not speculate */
        json_object_set_new(o, "speculative.n_max", json_integer(sp->lookup || sp->draft ? n_max : 0));
        json_object_set_new(o, "speculative.n_min", json_integer(n_min));
    }
    return o;
}

/* The fields of the final object (streamed or not). */
static json_t *final_fields(srv_server *s, const srv_job *j, const char *content, size_t n) {
    json_t *o = json_pack("{s:i,s:s%,s:i,s:b,s:s,s:I,s:I,s:I,s:b,s:s,s:s,s:o,s:o}", "index", 0, "content", content, n, "id_slot", j->slot,
                          "stop", 1, "model", s->model_name, "tokens_predicted", (json_int_t)j->n_gen, "tokens_evaluated",
                          (json_int_t)j->n_prompt, "tokens_cached", (json_int_t)j->n_cached, "truncated", 0, "stop_type",
                          stop_type(j->finish), "stopping_word", j->stop_word, "timings", srv_timings(j), "generation_settings", settings(s, j));
    return o;
}

void srv_frames_llama(srv_stream *st, json_t *frames, const srv_job *j, const char *text, size_t n, const srv_tokinfo *toks, size_t n_toks, bool done) {
    if (n || n_toks) {
        json_t *f = json_pack("{s:i,s:s%,s:b,s:i}", "index", 0, "content", text, n, "stop", 0, "id_slot", j->slot);
        if (n_toks && j->g.n_probs > 0) json_object_set_new(f, "completion_probabilities", srv_probs_llama(st->srv, toks, n_toks));
        json_array_append_new(frames, f);
    }
    if (done) json_array_append_new(frames, final_fields(st->srv, j, "", 0));
}

void srv_route_completion(srv_server *s, const srv_request *rq, srv_response *rs) {
    json_t *body = srv_body_object(rq, rs), *v;
    srv_job *j = srv_job_new();
    kiln_tokens t = {0};
    bool stream = false;
    if (!body || !j) {
        if (!j) srv_error(rs, 500, NULL, "out of memory");
        goto out;
    }
    if (!srv_parse_gen(s, body, j, rs)) goto out;
    if ((v = json_object_get(body, "stream")) && !json_is_null(v)) {
        if (!json_is_boolean(v)) {
            srv_error(rs, 400, "stream", "stream must be a boolean");
            goto out;
        }
        stream = json_is_true(v);
    }
    if (!srv_parse_prompt(s, json_object_get(body, "prompt"), "prompt", &t, rs)) goto out;
    j->prompt = t.ids, j->n_prompt = t.n, t.ids = NULL;
    if (!srv_run_job(s, rq, j, stream, SRV_FMT_LLAMA, srv_frames_llama, NULL, rs)) goto out;
    if (stream) {
        j = NULL;
        goto out;
    }
    json_t *o = final_fields(s, j, j->text, j->n_text);
    json_t *ids = json_array();
    for (size_t i = 0; i < j->n_gen; i++) json_array_append_new(ids, json_integer(j->gen[i]));
    json_object_set_new(o, "tokens", ids);
    if (j->g.n_probs > 0) json_object_set_new(o, "completion_probabilities", srv_probs_llama(s, j->toks, j->n_toks));
    srv_json(rs, 200, o);
out:
    kiln_tokens_free(&t);
    srv_job_release(j);
    json_decref(body);
}

static bool opt_bool(json_t *body, const char *f, bool dflt, bool *out, srv_response *rs) {
    json_t *v = json_object_get(body, f);
    *out = dflt;
    if (!v || json_is_null(v)) return true;
    if (!json_is_boolean(v)) {
        srv_error(rs, 400, f, "%s must be a boolean", f);
        return false;
    }
    *out = json_is_true(v);
    return true;
}

void srv_route_tokenize(srv_server *s, const srv_request *rq, srv_response *rs) {
    json_t *body = srv_body_object(rq, rs), *c;
    bool add, parse, pieces;
    kiln_tokens t = {0};
    if (!body) return;
    if (!opt_bool(body, "add_special", false, &add, rs) || !opt_bool(body, "parse_special", true, &parse, rs) ||
        !opt_bool(body, "with_pieces", false, &pieces, rs))
        goto out;
    if (!json_is_string(c = json_object_get(body, "content"))) {
        srv_error(rs, 400, "content", "content must be a string");
        goto out;
    }
    if (kiln_tokenizer_encode(s->tok, json_string_value(c), json_string_length(c), add, parse, &t)) {
        srv_error(rs, 400, "content", "content: %s", kiln_last_error());
        goto out;
    }
    json_t *a = json_array();
    for (size_t i = 0; i < t.n; i++) {
        if (!pieces) {
            json_array_append_new(a, json_integer(t.ids[i]));
            continue;
        }
        char buf[256];
        size_t n = 0, m;
        if (kiln_tokenizer_piece(s->tok, t.ids[i], true, buf, sizeof buf, &n) || n > sizeof buf) n = 0;
        char *clean = srv_utf8_sanitize(buf, n, &m);
        json_array_append_new(a, json_pack("{s:i,s:s%}", "id", (int)t.ids[i], "piece", clean ? clean : "", clean ? m : 0));
        free(clean);
    }
    srv_json(rs, 200, json_pack("{s:o}", "tokens", a));
out:
    kiln_tokens_free(&t);
    json_decref(body);
}

void srv_route_detokenize(srv_server *s, const srv_request *rq, srv_response *rs) {
    json_t *body = srv_body_object(rq, rs);
    kiln_tokens t = {0};
    if (!body) return;
    json_t *v = json_object_get(body, "tokens");
    if (!json_is_array(v)) {
        srv_error(rs, 400, "tokens", "tokens must be an array of token ids");
    } else if (json_array_size(v) == 0) {
        srv_json(rs, 200, json_pack("{s:s}", "content", ""));
    } else if (srv_parse_prompt(s, v, "tokens", &t, rs)) {
        char *text = NULL;
        size_t n = 0, m;
        if (kiln_tokenizer_decode(s->tok, t.ids, t.n, false, &text, &n)) {
            srv_error(rs, 400, "tokens", "tokens: %s", kiln_last_error());
        } else {
            char *clean = srv_utf8_sanitize(text, n, &m);
            srv_json(rs, 200, clean ? json_pack("{s:s%}", "content", clean, m) : NULL);
            free(clean);
        }
        free(text);
    }
    kiln_tokens_free(&t);
    json_decref(body);
}

void srv_route_apply_template(srv_server *s, const srv_request *rq, srv_response *rs) {
    json_t *body = srv_body_object(rq, rs);
    if (!body) return;
    /* the same checks as a chat request, then the text of the template instead of its tokens */
    kiln_tokens t = {0};
    json_t *msgs = json_object_get(body, "messages");
    if (srv_parse_messages(s, msgs, &t, rs)) {
        size_t n = json_array_size(msgs);
        kiln_chat_msg *m = calloc(n, sizeof *m);
        char *text = NULL;
        size_t len = 0;
        for (size_t i = 0; m && i < n; i++) {
            json_t *e = json_array_get(msgs, i);
            const char *r = json_string_value(json_object_get(e, "role"));
            m[i].role = strcmp(r, "developer") ? r : "system";
            m[i].content = json_is_string(json_object_get(e, "content")) ? json_string_value(json_object_get(e, "content")) : "";
        }
        if (!m || kiln_chat_format(&s->tmpl, m, n, true, &text, &len)) srv_error(rs, 400, "messages", "messages: %s", kiln_last_error());
        else srv_json(rs, 200, json_pack("{s:s%}", "prompt", text, len));
        free(text), free(m);
    }
    kiln_tokens_free(&t);
    json_decref(body);
}

void srv_route_health(srv_server *s, const srv_request *rq, srv_response *rs) { srv_json(rs, 200, json_pack("{s:s}", "status", "ok")); }

/* The server's speculative decoding: the drafter (none, lookup or draft_model), its settings. */
static json_t *spec_props(srv_server *s) {
    const srv_spec_params *sp = srv_sched_spec(s->sched);
    const char *name = s->o.draft_path ? strrchr(s->o.draft_path, '/') : NULL;
    name = name ? name + 1 : s->o.draft_path;
    size_t n = 0;
    char *clean = name ? srv_utf8_sanitize(name, strlen(name), &n) : NULL;
    json_t *o = json_pack("{s:s,s:i,s:i,s:i,s:o}", "drafter", sp->draft ? "draft_model" : sp->lookup ? "lookup" : "none", "n_max",
                          sp->draft_max, "n_min", sp->draft_min, "lookup_ngram", sp->lookup_ngram, "draft_model",
                          clean ? json_stringn(clean, n) : json_null());
    free(clean);
    return o;
}

void srv_route_props(srv_server *s, const srv_request *rq, srv_response *rs) {
    srv_json(rs, 200, json_pack("{s:o,s:i,s:s,s:s,s:s,s:{s:b,s:b},s:o}", "default_generation_settings", settings(s, NULL), "total_slots",
                                (int)srv_sched_n_slots(s->sched), "model_path", s->model_name, "model_alias", s->model_name, "chat_template",
                                kiln_chat_family_name(s->tmpl.family), "modalities", "vision", 0, "audio", 0, "speculative", spec_props(s)));
}

void srv_route_slots(srv_server *s, const srv_request *rq, srv_response *rs) {
    int n = srv_sched_n_slots(s->sched);
    srv_slot_info *info = calloc((size_t)n, sizeof *info);
    if (!info) {
        srv_error(rs, 500, NULL, "out of memory");
        return;
    }
    srv_sched_slots(s->sched, info);
    json_t *a = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(a, json_pack("{s:i,s:I,s:b,s:I,s:I,s:I}", "id", info[i].id, "n_ctx", (json_int_t)srv_sched_n_ctx_slot(s->sched),
                                           "is_processing", info[i].busy, "n_past", (json_int_t)info[i].n_past, "n_prompt_tokens",
                                           (json_int_t)info[i].n_prompt, "n_decoded", (json_int_t)info[i].n_decoded));
    free(info);
    srv_json(rs, 200, a);
}

/* A plain file name: no folder, not hidden, no control bytes, at most 255 bytes. */
static bool plain_name(const char *f, size_t n) {
    if (n == 0 || n > 255 || f[0] == '.' || strlen(f) != n) return false;
    for (size_t i = 0; i < n; i++)
        if (f[i] == '/' || f[i] == '\\' || (unsigned char)f[i] < 0x20 || f[i] == 0x7f) return false;
    return true;
}

void srv_route_slot_action(srv_server *s, const srv_request *rq, srv_response *rs) {
    const char *p = rq->path + strlen("/slots/"), *action = NULL;
    char *end;
    long id = strtol(p, &end, 10);
    if (!*p || *end || p[0] == '-' || p[0] == '+' || id >= srv_sched_n_slots(s->sched)) {
        srv_error(rs, 400, "id_slot", "'%s' is not a slot: the server has %d", p, (int)srv_sched_n_slots(s->sched));
        return;
    }
    for (size_t i = 0; i < rq->n_args; i++)
        if (strcmp(rq->args[i].key, "action") == 0) action = rq->args[i].value;
    srv_slot_action a;
    if (action && strcmp(action, "save") == 0) a = SRV_SLOT_SAVE;
    else if (action && strcmp(action, "restore") == 0) a = SRV_SLOT_RESTORE;
    else if (action && strcmp(action, "erase") == 0) a = SRV_SLOT_ERASE;
    else {
        srv_error(rs, 400, "action", "action must be save, restore or erase");
        return;
    }
    char path[4096] = "", msg[512];
    const char *fname = "";
    json_t *body = NULL;
    if (a != SRV_SLOT_ERASE) {
        if (!s->o.slot_save_path) {
            srv_error(rs, 501, NULL, "slot files are off: start the server with --slot-save-path DIR");
            return;
        }
        if (!(body = srv_body_object(rq, rs))) return;
        json_t *f = json_object_get(body, "filename");
        if (!json_is_string(f) || !plain_name(json_string_value(f), json_string_length(f))) {
            srv_error(rs, 400, "filename", "filename must be a plain file name inside the slot save path (no '/', not hidden)");
            json_decref(body);
            return;
        }
        fname = json_string_value(f);
        snprintf(path, sizeof path, "%s/%s", s->o.slot_save_path, fname);
    }
    int64_t n_tok = 0;
    double t0 = srv_now();
    int status = srv_sched_slot_action(s->sched, (int)id, a, path, &n_tok, msg, sizeof msg);
    double ms = 1e3 * (srv_now() - t0);
    if (status != 200) srv_error(rs, status, a == SRV_SLOT_ERASE ? NULL : "filename", "slot %ld: %s", id, msg);
    else if (a == SRV_SLOT_SAVE)
        srv_json(rs, 200, json_pack("{s:i,s:s,s:I,s:{s:f}}", "id_slot", (int)id, "filename", fname, "n_saved", (json_int_t)n_tok, "timings", "save_ms", ms));
    else if (a == SRV_SLOT_RESTORE)
        srv_json(rs, 200, json_pack("{s:i,s:s,s:I,s:{s:f}}", "id_slot", (int)id, "filename", fname, "n_restored", (json_int_t)n_tok, "timings", "restore_ms", ms));
    else srv_json(rs, 200, json_pack("{s:i,s:I}", "id_slot", (int)id, "n_erased", (json_int_t)n_tok));
    json_decref(body);
}
