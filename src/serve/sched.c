/* sched.c: the slots, the bounded queue, continuous batching, prompt caching, stop strings, sampling and slot files
 * (sched.h says how they fit). One thread runs sched_main and owns the contexts (the model's, and a draft model's); a
 * second, the emitter, builds the jobs' frames while the engine runs the next step; the HTTP threads only submit
 * jobs, cancel them and read snapshots, under the scheduler's lock. Speculative decoding's drafts and acceptance are
 * in sched_spec.c, the jobs themselves and the text helpers in job.c. Tested by tests/test_serve_unit.c and
 * tests/test_serve.sh. */
#include "serve/sched_impl.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---------------------------------------------------------------- the scheduler (its state: sched_impl.h) */

int32_t srv_sched_n_slots(const srv_sched *s) { return s->n_slots; }
const srv_spec_params *srv_sched_spec(const srv_sched *s) { return &s->spec; }
int64_t srv_sched_n_ctx_slot(const srv_sched *s) { return s->n_ctx; }

/* ---------------------------------------------------------------- the emitter */

/* One call of a job's emit, waiting for the emitter thread; the scheduler's reference to the job goes with done. */
typedef struct emit_rec {
    struct emit_rec *next;
    srv_job *j;
    char *text; /* owned; NULL: none */
    size_t n;
    bool has_ti, done;
    srv_tokinfo ti;
} emit_rec;

/* The job's results are final: its waiters wake and the scheduler's reference goes. */
static void job_done(srv_job *j) {
    pthread_mutex_lock(&j->mu);
    j->done = true;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    srv_job_release(j);
}

static void emit_run(srv_job *j, const char *text, size_t n, const srv_tokinfo *ti, bool done) {
    if (j->emit) j->emit(j, text ? text : "", text ? n : 0, ti, ti ? 1 : 0, done);
    if (done) job_done(j);
}

static void *emit_main(void *arg) {
    srv_sched *s = arg;
    pthread_mutex_lock(&s->em_mu);
    for (;;) {
        emit_rec *r = s->em_head;
        if (!r) {
            s->em_busy = false;
            pthread_cond_broadcast(&s->em_cv);
            if (s->em_stop) break;
            pthread_cond_wait(&s->em_cv, &s->em_mu);
            continue;
        }
        s->em_head = r->next;
        if (!s->em_head) s->em_tail = NULL;
        s->em_busy = true;
        pthread_mutex_unlock(&s->em_mu);
        emit_run(r->j, r->text, r->n, r->has_ti ? &r->ti : NULL, r->done);
        free(r->text), free(r);
        pthread_mutex_lock(&s->em_mu);
    }
    pthread_mutex_unlock(&s->em_mu);
    return NULL;
}

/* Hands job j's new text (owned, NULL for none), its token's log-probabilities (NULL when not asked) and, with done,
 * its end to the emitter thread. Without the thread, or without memory for the record, the call runs here once the
 * records before it have gone out, so a job's frames keep their order. */
static void post(srv_sched *s, srv_job *j, char *text, size_t n, const srv_tokinfo *ti, bool done) {
    emit_rec *r = NULL;
    if (s->em_on && j->emit && !(r = malloc(sizeof *r))) {
        pthread_mutex_lock(&s->em_mu);
        while (s->em_head || s->em_busy) pthread_cond_wait(&s->em_cv, &s->em_mu);
        pthread_mutex_unlock(&s->em_mu);
    }
    if (!r) { /* no frames (a job without a stream), no thread or no memory */
        emit_run(j, text, n, ti, done);
        free(text);
        return;
    }
    *r = (emit_rec){.j = j, .text = text, .n = n, .has_ti = ti != NULL, .done = done};
    if (ti) r->ti = *ti;
    pthread_mutex_lock(&s->em_mu);
    if (s->em_tail) s->em_tail->next = r;
    else s->em_head = r;
    s->em_tail = r;
    pthread_cond_broadcast(&s->em_cv);
    pthread_mutex_unlock(&s->em_mu);
}


/* Ends slot's job with reason: the held-back text goes out (sanitized) unless a stop string cut it. */
static void finish(srv_sched *s, slot *sl, srv_finish why, int http_status, const char *err) {
    srv_job *j = sl->job;
    size_t n_out = 0, n_all = 0;
    char *out = NULL;
    if (sl->sent < sl->n_text) out = srv_utf8_sanitize(sl->text + sl->sent, sl->n_text - sl->sent, &n_out);
    char *all = srv_utf8_sanitize(sl->text ? sl->text : "", sl->n_text, &n_all);
    pthread_mutex_lock(&j->mu);
    j->finish = why;
    free(j->text);
    j->text = all ? all : calloc(1, 1);
    j->n_text = all ? n_all : 0;
    j->t_end = srv_now();
    if (!j->t_first) j->t_first = j->t_end;
    if (http_status) {
        j->http_status = http_status;
        snprintf(j->err, sizeof j->err, "%s", err ? err : "");
    }
    pthread_mutex_unlock(&j->mu);
    s->met.requests_done++;
    if (j->t_start) {
        s->met.predicted_tokens += sl->n_decoded;
        s->met.predicted_s += j->t_end - j->t_first;
    }
    post(s, j, out, n_out, NULL, true);
    kiln_sampler_free(sl->smp);
    kiln_grammar_matcher_free(sl->gm);
    sl->smp = NULL, sl->gm = NULL, sl->job = NULL, sl->st = SLOT_IDLE;
    sl->n_text = sl->sent = 0;
}

/* A job that never reached a slot (cancelled or timed out in the queue, or the scheduler stopping). */
static void finish_queued(srv_sched *s, srv_job *j, srv_finish why, int http_status, const char *err) {
    pthread_mutex_lock(&j->mu);
    j->finish = why;
    j->t_end = srv_now();
    j->text = calloc(1, 1);
    if (http_status) j->http_status = http_status, snprintf(j->err, sizeof j->err, "%s", err);
    pthread_mutex_unlock(&j->mu);
    post(s, j, NULL, 0, NULL, true);
}

/* Puts job j on slot sl: the prompt's longest cached prefix is kept (or copied from the slot that holds more of it),
 * at least its last token re-evaluated. */
static kiln_status start(srv_sched *s, slot *sl, srv_job *j) {
    kiln_status st = kiln_sampler_new(&j->g.sp, s->V, &sl->smp);
    if (!st && j->g.ignore_eos) { /* EOS and the end of turn never drawn, wherever the slot's sampler draws */
        const int32_t ends[2] = {s->eos, s->eot};
        st = kiln_sampler_ban(sl->smp, ends, 2);
    }
    if (!st && j->g.grammar && !s->gvocab) st = kiln_grammar_vocab_new(s->tok, &s->gvocab);
    if (!st && j->g.grammar) st = kiln_grammar_matcher_new_vocab(j->g.grammar, s->gvocab, &sl->gm);
    if (st) {
        kiln_sampler_free(sl->smp);
        sl->smp = NULL;
        return st;
    }
    int64_t np = (int64_t)j->n_prompt, keep = 0;
    if (j->g.cache_prompt) {
        int64_t mine = sched_lcp(kiln_context_seq_tokens(s->c, sl->id), kiln_context_seq_pos(s->c, sl->id), j->prompt, np);
        int src = -1;
        int64_t best = mine;
        for (int i = 0; i < s->n_slots; i++) {
            if (i == sl->id) continue;
            int64_t k = sched_lcp(kiln_context_seq_tokens(s->c, i), kiln_context_seq_pos(s->c, i), j->prompt, np);
            if (k > best) best = k, src = i;
        }
        if (best > np - 1) best = np - 1;
        if (src >= 0 && best > mine) {
            if ((st = kiln_context_seq_copy(s->c, src, sl->id, best))) best = 0;
        }
        keep = best;
    }
    sl->n_done = (size_t)kiln_context_seq_keep(s->c, sl->id, keep);
    sl->n_past = (int64_t)sl->n_done;
    sl->st = SLOT_PREFILL;
    sl->job = j;
    sl->n_decoded = 0;
    sl->n_text = sl->sent = 0;
    sl->n_prompt = np;
    sl->spec = sched_spec_eligible(s, j);
    pthread_mutex_lock(&j->mu);
    j->spec = sl->spec;
    j->slot = sl->id;
    j->t_start = srv_now();
    j->n_cached = (int64_t)sl->n_done;
    j->n_evaluated = np - (int64_t)sl->n_done;
    pthread_mutex_unlock(&j->mu);
    return KILN_OK;
}

/* Queued jobs to idle slots, in order; a job that names a busy slot waits for it without holding up the others. */
static void assign(srv_sched *s) {
    for (int qi = 0; qi < s->q_n;) {
        srv_job *j = s->queue[qi];
        slot *dst = NULL;
        if (j->g.id_slot >= 0) {
            if (s->slots[j->g.id_slot].st == SLOT_IDLE) dst = &s->slots[j->g.id_slot];
        } else {
            int64_t best = -1;
            for (int i = 0; i < s->n_slots; i++) {
                if (s->slots[i].st != SLOT_IDLE) continue;
                int32_t q = s->slots[i].id;
                int64_t pos = kiln_context_seq_pos(s->c, q);
                int64_t k = j->g.cache_prompt ? sched_lcp(kiln_context_seq_tokens(s->c, q), pos, j->prompt, (int64_t)j->n_prompt) : 0;
                /* the longest match; among equals the slot with the least cached (keeps the others' caches) */
                int64_t score = k * (s->n_ctx + 1) + (s->n_ctx - pos);
                if (score > best) best = score, dst = &s->slots[i];
            }
        }
        if (!dst) {
            qi++;
            continue;
        }
        memmove(s->queue + qi, s->queue + qi + 1, (size_t)(s->q_n - qi - 1) * sizeof *s->queue);
        s->q_n--;
        kiln_status st = start(s, dst, j);
        if (st) {
            dst->job = j;
            finish(s, dst, SRV_FIN_ERROR, 500, kiln_last_error());
        }
    }
}

/* Slot files and erases, each once its slot is idle. */
static void run_ctrls(srv_sched *s) {
    for (ctrl **pp = &s->ctrls; *pp;) {
        ctrl *r = *pp;
        slot *sl = &s->slots[r->slot];
        if (sl->st != SLOT_IDLE) {
            r->status = 400;
            snprintf(r->msg, r->cap, "slot %d is busy: try again when its request is done", r->slot);
        } else {
            kiln_status st = KILN_OK;
            if (r->a == SRV_SLOT_SAVE) st = kiln_context_seq_save(s->c, r->slot, r->path), r->n_tokens = kiln_context_seq_pos(s->c, r->slot);
            else if (r->a == SRV_SLOT_RESTORE) st = kiln_context_seq_restore(s->c, r->slot, r->path, &r->n_tokens);
            else r->n_tokens = kiln_context_seq_pos(s->c, r->slot), kiln_context_seq_keep(s->c, r->slot, 0);
            r->status = st == KILN_OK ? 200 : st == KILN_ERR_NOMEM ? 500 : st == KILN_ERR_UNSUPPORTED ? 501 :
                        (st == KILN_ERR_IO && r->a == SRV_SLOT_SAVE) ? 500 : 400;
            if (st) snprintf(r->msg, r->cap, "%s", kiln_last_error()[0] ? kiln_last_error() : kiln_status_name(st));
        }
        sl->n_past = kiln_context_seq_pos(s->c, r->slot);
        r->done = true;
        *pp = r->next;
    }
    pthread_cond_broadcast(&s->ctrl_cv);
}

int srv_sched_slot_action(srv_sched *s, int slot_id, srv_slot_action a, const char *path, int64_t *n_tokens, char *msg, size_t cap) {
    ctrl r = {.slot = slot_id, .a = a, .path = path, .msg = msg, .cap = cap};
    msg[0] = 0;
    pthread_mutex_lock(&s->mu);
    if (s->stop) {
        pthread_mutex_unlock(&s->mu);
        snprintf(msg, cap, "the server is shutting down");
        return 503;
    }
    r.next = s->ctrls, s->ctrls = &r;
    pthread_cond_broadcast(&s->cv);
    while (!r.done) pthread_cond_wait(&s->ctrl_cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    *n_tokens = r.n_tokens;
    return r.status;
}

/* The bytes of token id into s->piece; *n its length. */
static kiln_status piece(srv_sched *s, int32_t id, size_t *n) {
    kiln_status st = kiln_tokenizer_piece(s->tok, id, false, s->piece, s->piece_cap, n);
    if (st || *n <= s->piece_cap) return st;
    char *p = realloc(s->piece, *n);
    if (!p) return KILN_ERR_NOMEM;
    s->piece = p, s->piece_cap = *n;
    return kiln_tokenizer_piece(s->tok, id, false, s->piece, s->piece_cap, n);
}

/* log-softmax of row into s->probs; ti gets token id's log-probability and the top n. */
static void logprobs(srv_sched *s, const float *row, int32_t id, int n_top, srv_tokinfo *ti) {
    float mx = -INFINITY;
    for (int64_t v = 0; v < s->V; v++) mx = row[v] > mx ? row[v] : mx;
    double sum = 0;
    for (int64_t v = 0; v < s->V; v++) sum += exp((double)(row[v] - mx));
    float lse = mx + (float)log(sum);
    ti->id = id;
    ti->logprob = row[id] - lse;
    ti->n_top = 0;
    for (int k = 0; k < n_top && k < s->V; k++) { /* selection: n_top is at most SRV_MAX_PROBS */
        int32_t best = -1;
        for (int64_t v = 0; v < s->V; v++) {
            bool taken = false;
            for (int t = 0; t < k && !taken; t++) taken = ti->top[t].id == v;
            if (!taken && (best < 0 || row[v] > row[best])) best = (int32_t)v;
        }
        ti->top[k] = (srv_prob){best, row[best] - lse};
        ti->n_top = k + 1;
    }
}

static bool grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return true;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q) return false;
    *p = q, *cap = c;
    return true;
}

/* Hands out token t that slot sl chose, ti its log-probabilities (NULL when not asked), pos the position it would be
 * fed at: the ends (EOS and end of turn, stop strings, n_predict, the context's end), the grammar, the text, the job's
 * new text. True while the job goes on (sl->last = t, fed next unless a verification already took it); false once it
 * ended. */
static bool emit_token(srv_sched *s, slot *sl, int32_t t, const srv_tokinfo *ti, int64_t pos) {
    srv_job *j = sl->job;
    const bool want = ti != NULL;
    if (!grow((void **)&j->gen, &j->cap_gen, j->n_gen + 1, sizeof *j->gen)) {
        finish(s, sl, SRV_FIN_ERROR, 500, "out of memory");
        return false;
    }
    j->gen[j->n_gen++] = t;
    sl->n_decoded++;
    if (t == s->eos || t == s->eot) {
        finish(s, sl, SRV_FIN_EOS, 0, NULL);
        return false;
    }
    if (sl->gm && kiln_grammar_matcher_accept(sl->gm, t)) {
        finish(s, sl, SRV_FIN_ERROR, 500, kiln_last_error());
        return false;
    }
    size_t n;
    kiln_status st = piece(s, t, &n);
    if (st || !grow((void **)&sl->text, &sl->cap_text, sl->n_text + n + 1, 1) ||
        (want && !grow((void **)&j->toks, &j->cap_toks, j->n_toks + 1, sizeof *j->toks))) {
        finish(s, sl, SRV_FIN_ERROR, 500, st ? kiln_last_error() : "out of memory");
        return false;
    }
    if (want) j->toks[j->n_toks++] = *ti;
    size_t scan = sl->sent; /* a stop string may begin in the held-back bytes, never before them */
    memcpy(sl->text + sl->n_text, s->piece, n);
    sl->n_text += n;
    sl->text[sl->n_text] = 0;
    srv_finish why = SRV_RUNNING;
    size_t full = sl->n_text;
    for (int i = 0; i < j->g.n_stops; i++) {
        char *hit = memmem(sl->text + scan, full - scan, j->g.stops[i], strlen(j->g.stops[i]));
        if (hit && (size_t)(hit - sl->text) < (why == SRV_RUNNING ? full + 1 : sl->n_text)) {
            why = SRV_FIN_STOP;
            sl->n_text = (size_t)(hit - sl->text); /* the text ends before the earliest stop string */
            snprintf(j->stop_word, sizeof j->stop_word, "%s", j->g.stops[i]);
        }
    }
    size_t hold = why == SRV_FIN_STOP ? 0 : srv_stop_holdback(sl->text, sl->n_text, j->g.stops, j->g.n_stops);
    size_t u = srv_utf8_incomplete_tail(sl->text, sl->n_text - hold);
    size_t end = sl->n_text - hold - u;
    if (end < sl->sent) end = sl->sent;
    if (j->emit && (end > sl->sent || want)) {
        size_t n_out = 0;
        char *out = srv_utf8_sanitize(sl->text + sl->sent, end - sl->sent, &n_out);
        post(s, j, out, n_out, ti, false);
    }
    sl->sent = end;
    if (why == SRV_FIN_STOP) {
        finish(s, sl, SRV_FIN_STOP, 0, NULL);
        return false;
    }
    if (j->g.n_predict >= 0 && sl->n_decoded >= j->g.n_predict) {
        finish(s, sl, SRV_FIN_LENGTH, 0, NULL);
        return false;
    }
    if (pos >= s->n_ctx) { /* no position left to feed t */
        finish(s, sl, SRV_FIN_CONTEXT, 0, NULL);
        return false;
    }
    sl->last = t;
    sl->st = SLOT_DECODE;
    return true;
}

/* EOS and the end of turn never chosen (ignore_eos). */
static void mask_ends(const srv_sched *s, float *row) {
    if (s->eos >= 0) row[s->eos] = -INFINITY;
    if (s->eot >= 0) row[s->eot] = -INFINITY;
}

/* The token slot sl samples from row (the grammar's mask, the penalties over the sequence), handed out. */
static void on_token(srv_sched *s, slot *sl, float *row) {
    srv_job *j = sl->job;
    if (j->g.n_predict >= 0 && sl->n_decoded >= j->g.n_predict) { /* n_predict 0: the prompt only */
        finish(s, sl, SRV_FIN_LENGTH, 0, NULL);
        return;
    }
    if (j->g.ignore_eos) mask_ends(s, row);
    if (sl->gm) { /* the grammar's tokens only; its end also takes the end of turn */
        const float eot = s->eot >= 0 ? row[s->eot] : 0.0f;
        const kiln_status e = kiln_grammar_matcher_mask(sl->gm, row);
        if (e) { /* invalid: a later step too ambiguous or deep, the grammar's fault */
            finish(s, sl, SRV_FIN_ERROR, e == KILN_ERR_INVALID ? 400 : 500, kiln_last_error());
            return;
        }
        if (s->eot >= 0 && kiln_grammar_matcher_done(sl->gm)) row[s->eot] = eot;
    }
    srv_tokinfo ti = {0};
    bool want = j->want_toks || j->g.n_probs > 0;
    if (want) memcpy(s->probs, row, (size_t)s->V * sizeof *row);
    int64_t pos = kiln_context_seq_pos(s->c, sl->id);
    int32_t t = kiln_sampler_sample(sl->smp, row, kiln_context_seq_tokens(s->c, sl->id), (size_t)pos);
    if (want) logprobs(s, s->probs, t, j->g.n_probs, &ti);
    emit_token(s, sl, t, want ? &ti : NULL, pos);
}

/* Whether slot sl's token can be drawn in the step: nothing the host does to its row before the draw (a grammar's
 * mask; ignore_eos is the sampler's own ban) or with it after (log-probabilities), and no drafts to verify. */
static bool plain_slot(const slot *sl) {
    const srv_job *j = sl->job;
    return !sl->gm && !sl->n_draft && !j->want_toks && j->g.n_probs <= 0;
}

/* Whether this step's rows all draw in the step, then each row's sampler into ssmp. */
static bool draw_in_step(srv_sched *s, int n_groups) {
    if (!s->in_step || n_groups == 0) return false;
    for (int g = 0; g < n_groups; g++) {
        const slot *sl = &s->slots[s->row_slot[g]];
        if (!plain_slot(sl) || sl->row >= s->n_slots) return false;
    }
    for (int g = 0; g < n_groups; g++) {
        const slot *sl = &s->slots[s->row_slot[g]];
        s->ssmp[sl->row] = sl->smp;
    }
    return true;
}

/* on_token for a token drawn in the step. */
static void on_drawn(srv_sched *s, slot *sl, int32_t t) {
    srv_job *j = sl->job;
    if (j->g.n_predict >= 0 && sl->n_decoded >= j->g.n_predict) {
        finish(s, sl, SRV_FIN_LENGTH, 0, NULL);
        return;
    }
    emit_token(s, sl, t, NULL, kiln_context_seq_pos(s->c, sl->id));
}

/* A speculating slot's step: its 1 + k rows (row i after last and draft[0..i)) decide the drafts taken and the
 * target's own token after them (kiln_spec_accept_greedy at temperature 0, else kiln_spec_accept_sample: prompt
 * lookup's drafts are certain, a draft model's were drawn from spec_q's rows). The sequence is cut back to last and
 * the taken drafts, and the tokens go out one by one as sampled ones do, the rest dropped once one ends the job.
 * Log-probabilities come from each token's own row: greedy acceptance leaves the rows as they were, sampling turns
 * them into probabilities, so they are copied first (spec_rows_copy). */
static void spec_step(srv_sched *s, slot *sl, float *rows) {
    srv_job *j = sl->job;
    const size_t k = (size_t)sl->n_draft, V = (size_t)s->V;
    if (j->g.ignore_eos)
        for (size_t i = 0; i <= k; i++) mask_ends(s, rows + i * V);
    const bool greedy = j->g.sp.temp == 0, want = j->want_toks || j->g.n_probs > 0;
    const float *lp_rows = rows; /* the rows the log-probabilities come from */
    if (want && !greedy) {
        if (!s->spec_rows_copy && !(s->spec_rows_copy = malloc(((size_t)s->spec.draft_max + 1) * V * sizeof *s->spec_rows_copy))) {
            finish(s, sl, SRV_FIN_ERROR, 500, "out of memory");
            return;
        }
        memcpy(s->spec_rows_copy, rows, (k + 1) * V * sizeof *rows);
        lp_rows = s->spec_rows_copy;
    }
    const size_t n = greedy ? kiln_spec_accept_greedy(rows, s->V, sl->draft, k, s->spec_out)
                            : kiln_spec_accept_sample(sl->smp, rows, s->V, s->spec.draft ? s->spec_q + (size_t)sl->qrow * V : NULL,
                                                      sl->draft, k, s->spec_out);
    const int64_t keep = sl->pos0 + (int64_t)n; /* last and the n - 1 drafts taken */
    if (kiln_context_seq_keep(s->c, sl->id, keep) != keep) {
        finish(s, sl, SRV_FIN_ERROR, 500, "speculative decoding: the model's sliding-window cache cannot be cut back");
        return;
    }
    sl->n_past = keep;
    j->draft_n += (int64_t)k, j->draft_accepted += (int64_t)n - 1;
    s->met.draft_tokens += (int64_t)k, s->met.draft_accepted += (int64_t)n - 1;
    for (size_t i = 0; i < n; i++) {
        srv_tokinfo ti = {0};
        if (want) logprobs(s, lp_rows + i * V, s->spec_out[i], j->g.n_probs, &ti);
        if (!emit_token(s, sl, s->spec_out[i], want ? &ti : NULL, sl->pos0 + 1 + (int64_t)i)) return;
    }
}

static bool has_work(srv_sched *s) {
    if (s->ctrls || s->q_n) return true;
    for (int i = 0; i < s->n_slots; i++)
        if (s->slots[i].st != SLOT_IDLE) return true;
    return false;
}

/* Cancelled and timed-out jobs leave their slots and the queue. */
static void reap(srv_sched *s) {
    double now = srv_now();
    for (int i = 0; i < s->n_slots; i++) {
        slot *sl = &s->slots[i];
        if (sl->st == SLOT_IDLE) continue;
        if (srv_job_cancelled(sl->job)) finish(s, sl, SRV_FIN_CANCEL, 0, NULL);
        else if (sl->job->g.timeout_s > 0 && now - sl->job->t_submit > sl->job->g.timeout_s) finish(s, sl, SRV_FIN_TIMEOUT, 0, NULL);
    }
    for (int qi = 0; qi < s->q_n;) {
        srv_job *j = s->queue[qi];
        bool cancel = srv_job_cancelled(j), late = j->g.timeout_s > 0 && now - j->t_submit > j->g.timeout_s;
        if (!cancel && !late) {
            qi++;
            continue;
        }
        memmove(s->queue + qi, s->queue + qi + 1, (size_t)(s->q_n - qi - 1) * sizeof *s->queue);
        s->q_n--;
        finish_queued(s, j, cancel ? SRV_FIN_CANCEL : SRV_FIN_TIMEOUT, cancel ? 0 : 503, "the request timed out waiting for a slot");
    }
}

/* One iteration's batch: each decoding slot's token (and the drafts of a speculating one, while the rows for drafts
 * and the batch last: every decoding slot's token comes first), then prefill chunks up to n_batch. *n_groups gets the
 * slots with logits rows (s->row_slot). Called with the lock held; the draft model runs without it. */
static size_t build_batch(srv_sched *s, int *n_groups, size_t *chunk) {
    size_t n = 0;
    int g = 0;
    int64_t rows = 0, n_dec = 0;
    memset(chunk, 0, (size_t)s->n_slots * sizeof *chunk);
    for (int i = 0; i < s->n_slots; i++) n_dec += s->slots[i].st == SLOT_DECODE;
    int64_t room = s->n_batch - n_dec < s->spec_rows ? s->n_batch - n_dec : s->spec_rows; /* entries for drafts */
    bool reserved = false;
    s->spec_turn = s->n_slots ? (s->spec_turn + 1) % s->n_slots : 0;
    for (int i0 = 0; i0 < s->n_slots; i0++) { /* from the slot whose turn it is: past the rows, each waits for its turn */
        slot *sl = &s->slots[(s->spec_turn + i0) % s->n_slots];
        sl->n_draft = 0;
        if (sl->st != SLOT_DECODE) continue;
        sl->pos0 = kiln_context_seq_pos(s->c, sl->id);
        sl->qrow = s->spec_rows - room;
        if (sl->spec && room > 0) sl->n_draft = sched_spec_drafts(s, sl, room);
        room -= sl->n_draft;
        reserved = reserved || sl->n_draft;
    }
    if (reserved && s->spec.draft) {
        pthread_mutex_unlock(&s->mu);
        sched_model_drafts(s);
        pthread_mutex_lock(&s->mu);
        char msg[300];
        snprintf(msg, sizeof msg, "the draft model's decode failed: %s", kiln_last_error());
        for (int i = 0; i < s->n_slots; i++)
            if (s->slots[i].n_draft < 0) s->slots[i].n_draft = 0, finish(s, &s->slots[i], SRV_FIN_ERROR, 500, msg);
    }
    for (int i = 0; i < s->n_slots && (int64_t)n < s->n_batch; i++) {
        slot *sl = &s->slots[i];
        if (sl->st != SLOT_DECODE) continue;
        s->batch[n++] = (kiln_batch_entry){.seq = sl->id, .id = sl->last, .pos = sl->pos0, .logits = true};
        sl->row = rows++;
        for (int t = 0; t < sl->n_draft; t++)
            s->batch[n++] = (kiln_batch_entry){.seq = sl->id, .id = sl->draft[t], .pos = sl->pos0 + 1 + t, .logits = true};
        rows += sl->n_draft;
        s->row_slot[g++] = i;
    }
    for (int i = 0; i < s->n_slots && (int64_t)n < s->n_batch; i++) {
        slot *sl = &s->slots[i];
        if (sl->st != SLOT_PREFILL) continue;
        size_t left = sl->job->n_prompt - sl->n_done, room_b = (size_t)s->n_batch - n, k = left < room_b ? left : room_b;
        int64_t pos = kiln_context_seq_pos(s->c, sl->id);
        for (size_t t = 0; t < k; t++)
            s->batch[n++] = (kiln_batch_entry){.seq = sl->id, .id = sl->job->prompt[sl->n_done + t], .pos = pos + (int64_t)t,
                                               .logits = sl->n_done + t + 1 == sl->job->n_prompt};
        chunk[i] = k;
        sl->n_draft = 0;
        if (sl->n_done + k == sl->job->n_prompt) sl->row = rows++, s->row_slot[g++] = i;
    }
    *n_groups = g;
    return n;
}

static void *sched_main(void *arg) {
    srv_sched *s = arg;
    size_t *chunk = calloc((size_t)s->n_slots, sizeof *chunk);
    pthread_mutex_lock(&s->mu);
    while (!s->stop) {
        if (!has_work(s)) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 100 * 1000 * 1000;
            if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
            pthread_cond_timedwait(&s->cv, &s->mu, &ts);
            continue;
        }
        run_ctrls(s);
        reap(s);
        assign(s);
        int busy = 0;
        for (int i = 0; i < s->n_slots; i++) busy += s->slots[i].st != SLOT_IDLE;
        if (busy > s->met.n_busy_max) s->met.n_busy_max = busy;
        int n_groups;
        size_t n = build_batch(s, &n_groups, chunk);
        if (!n) continue;
        const bool drawn = draw_in_step(s, n_groups);
        pthread_mutex_unlock(&s->mu);
        double t0 = srv_now();
        kiln_status st = drawn ? kiln_context_decode_sample(s->c, s->batch, n, s->ssmp, NULL, s->snext)
                               : kiln_context_decode(s->c, s->batch, n, s->logits, NULL);
        double dt = srv_now() - t0;
        pthread_mutex_lock(&s->mu);
        s->met.decodes++;
        s->met.step_rows += (int64_t)n, s->met.step_decode_s += dt;
        if (st) {
            char msg[256];
            snprintf(msg, sizeof msg, "decode failed: %s", kiln_last_error());
            for (int i = 0; i < s->n_slots; i++)
                if (s->slots[i].st != SLOT_IDLE && (chunk[i] || s->slots[i].st == SLOT_DECODE)) finish(s, &s->slots[i], SRV_FIN_ERROR, 500, msg);
            continue;
        }
        for (int i = 0; i < s->n_slots; i++) s->slots[i].n_past = kiln_context_seq_pos(s->c, i);
        for (int i = 0; i < s->n_slots; i++) {
            slot *sl = &s->slots[i];
            if (sl->st != SLOT_PREFILL || !chunk[i]) continue;
            sl->n_done += chunk[i];
            s->met.prompt_tokens += (int64_t)chunk[i];
            s->met.prompt_s += dt * (double)chunk[i] / (double)n;
            if (sl->n_done == sl->job->n_prompt) {
                pthread_mutex_lock(&sl->job->mu);
                sl->job->t_first = srv_now();
                pthread_mutex_unlock(&sl->job->mu);
            }
        }
        bool mixed = false;
        for (int i = 0; i < s->n_slots; i++) mixed = mixed || chunk[i];
        s->met.steps_mixed += mixed;
        const double t1 = srv_now();
        for (int g = 0; g < n_groups; g++) {
            slot *sl = &s->slots[s->row_slot[g]];
            float *row = s->logits + (size_t)sl->row * (size_t)s->V;
            if (drawn) on_drawn(s, sl, s->snext[sl->row]);
            else if (sl->n_draft) spec_step(s, sl, row);
            else on_token(s, sl, row);
        }
        s->met.step_emit_s += srv_now() - t1;
    }
    /* stopping: every job ends */
    run_ctrls(s);
    for (int i = 0; i < s->n_slots; i++)
        if (s->slots[i].st != SLOT_IDLE) finish(s, &s->slots[i], SRV_FIN_CANCEL, 503, "the server is shutting down");
    while (s->q_n) finish_queued(s, s->queue[--s->q_n], SRV_FIN_CANCEL, 503, "the server is shutting down");
    pthread_mutex_unlock(&s->mu);
    free(chunk);
    return NULL;
}

kiln_status srv_sched_new(kiln_context *c, const kiln_model *m, const srv_sched_params *p, srv_sched **out) {
    *out = NULL;
    const kiln_tokenizer *tok = kiln_model_tokenizer(m);
    if (!tok) return kiln_fail(KILN_ERR_INVALID, "serve: the model has no tokenizer (tokenizer.ggml.* keys)");
    srv_sched *s = calloc(1, sizeof *s);
    if (!s) return KILN_ERR_NOMEM;
    s->c = c, s->m = m, s->tok = tok;
    s->V = kiln_model_n_vocab(m);
    s->n_slots = kiln_context_n_seq(c);
    s->n_ctx = kiln_context_n_ctx(c);
    s->n_batch = kiln_context_n_batch(c);
    s->queue_max = p->queue_max > 0 ? p->queue_max : 4 * s->n_slots;
    s->eos = kiln_tokenizer_eos(tok);
    s->eot = p->eot;
    s->spec = p->spec;
    s->spec_on = p->spec.lookup || p->spec.draft;
    if (s->spec.draft_max <= 0) s->spec.draft_max = 16;
    if (s->spec.lookup_ngram <= 0) s->spec.lookup_ngram = 3;
    if (s->spec_on) s->spec_rows = (int64_t)s->spec.draft_max * (s->n_slots < SPEC_SLOTS ? s->n_slots : SPEC_SLOTS);
    s->slots = calloc((size_t)s->n_slots, sizeof *s->slots);
    s->queue = calloc((size_t)s->queue_max, sizeof *s->queue);
    s->batch = calloc((size_t)s->n_batch, sizeof *s->batch);
    s->row_slot = calloc((size_t)s->n_slots, sizeof *s->row_slot);
    s->logits = malloc(((size_t)s->n_slots + (size_t)s->spec_rows) * (size_t)s->V * sizeof *s->logits);
    s->probs = malloc((size_t)s->V * sizeof *s->probs);
    const char *host = getenv("KILN_SAMPLE_ON_HOST");
    s->in_step = !(host && strcmp(host, "1") == 0);
    s->ssmp = malloc((size_t)s->n_slots * sizeof *s->ssmp);
    s->snext = malloc((size_t)s->n_slots * sizeof *s->snext);
    bool spec_ok = !s->spec_on;
    if (s->spec_on) {
        s->spec_seq = malloc(((size_t)s->n_ctx + 1) * sizeof *s->spec_seq);
        s->spec_out = malloc(((size_t)s->spec.draft_max + 1) * sizeof *s->spec_out);
        spec_ok = s->spec_seq && s->spec_out;
        if (s->spec.draft) {
            s->dbatch = malloc((size_t)kiln_context_n_batch(s->spec.draft) * sizeof *s->dbatch);
            s->dnext = malloc((size_t)s->n_slots * sizeof *s->dnext);
            s->dlogits = malloc((size_t)s->n_slots * (size_t)s->V * sizeof *s->dlogits);
            s->spec_q = malloc((size_t)s->spec_rows * (size_t)s->V * sizeof *s->spec_q);
            spec_ok = spec_ok && s->dbatch && s->dnext && s->dlogits && s->spec_q;
        }
        for (int i = 0; spec_ok && s->slots && i < s->n_slots; i++)
            spec_ok = (s->slots[i].draft = malloc((size_t)s->spec.draft_max * sizeof *s->slots[i].draft)) != NULL;
    }
    if (!s->slots || !s->queue || !s->batch || !s->row_slot || !s->logits || !s->probs || !s->ssmp || !s->snext || !spec_ok) {
        for (int i = 0; s->slots && i < s->n_slots; i++) free(s->slots[i].draft);
        free(s->slots), free(s->queue), free(s->batch), free(s->row_slot), free(s->logits), free(s->probs), free(s->spec_seq), free(s->spec_out);
        free(s->dbatch), free(s->dnext), free(s->dlogits), free(s->spec_q), free(s->ssmp), free(s->snext), free(s);
        return KILN_ERR_NOMEM;
    }
    for (int i = 0; i < s->n_slots; i++) s->slots[i].id = i;
    s->met.kv_total = (int64_t)s->n_slots * s->n_ctx;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    pthread_cond_init(&s->ctrl_cv, NULL);
    pthread_mutex_init(&s->em_mu, NULL);
    pthread_cond_init(&s->em_cv, NULL);
    s->em_on = pthread_create(&s->em_th, NULL, emit_main, s) == 0; /* without it the scheduler emits itself */
    if (pthread_create(&s->th, NULL, sched_main, s)) {
        s->spec.draft = NULL; /* the caller's still */
        srv_sched_free(s);
        return kiln_fail(KILN_ERR_NOMEM, "serve: cannot start the scheduler thread");
    }
    *out = s;
    return KILN_OK;
}

void srv_sched_free(srv_sched *s) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->stop = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (s->th) pthread_join(s->th, NULL);
    if (s->em_on) { /* the jobs' last frames go out before the emitter stops */
        pthread_mutex_lock(&s->em_mu);
        s->em_stop = true;
        pthread_cond_broadcast(&s->em_cv);
        pthread_mutex_unlock(&s->em_mu);
        pthread_join(s->em_th, NULL);
    }
    pthread_mutex_destroy(&s->em_mu);
    pthread_cond_destroy(&s->em_cv);
    for (int i = 0; i < s->n_slots; i++) free(s->slots[i].text), free(s->slots[i].draft);
    free(s->slots), free(s->queue), free(s->batch), free(s->row_slot), free(s->logits), free(s->probs), free(s->piece);
    free(s->spec_seq), free(s->spec_out), free(s->dbatch), free(s->dnext), free(s->dlogits), free(s->spec_q), free(s->spec_rows_copy);
    free(s->ssmp), free(s->snext);
    kiln_context_free(s->spec.draft);
    kiln_grammar_vocab_free(s->gvocab);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    pthread_cond_destroy(&s->ctrl_cv);
    free(s);
}

bool srv_sched_submit(srv_sched *s, srv_job *j) {
    pthread_mutex_lock(&s->mu);
    if (s->stop || s->q_n >= s->queue_max) {
        pthread_mutex_unlock(&s->mu);
        return false;
    }
    pthread_mutex_lock(&j->mu);
    j->refs++;
    j->t_submit = srv_now();
    pthread_mutex_unlock(&j->mu);
    s->queue[s->q_n++] = j;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return true;
}

void srv_sched_slots(srv_sched *s, srv_slot_info *out) {
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < s->n_slots; i++) {
        const slot *sl = &s->slots[i];
        out[i] = (srv_slot_info){.id = i, .busy = sl->st != SLOT_IDLE, .n_past = sl->n_past, .n_prompt = sl->n_prompt,
                                 .n_decoded = sl->n_decoded};
    }
    pthread_mutex_unlock(&s->mu);
}

void srv_sched_metrics(srv_sched *s, srv_metrics *out) {
    pthread_mutex_lock(&s->mu);
    *out = s->met;
    out->processing = 0, out->deferred = s->q_n, out->kv_used = 0;
    for (int i = 0; i < s->n_slots; i++) {
        out->processing += s->slots[i].st != SLOT_IDLE;
        out->kv_used += s->slots[i].n_past;
    }
    pthread_mutex_unlock(&s->mu);
}

int srv_sched_pending(srv_sched *s) {
    pthread_mutex_lock(&s->mu);
    int n = s->q_n;
    for (int i = 0; i < s->n_slots; i++) n += s->slots[i].st != SLOT_IDLE;
    pthread_mutex_unlock(&s->mu);
    return n;
}
