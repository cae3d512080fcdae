/* sched_spec.c: the scheduler's speculative decoding (docs/speculative.md): which jobs may speculate, how many drafts a
 * slot feeds (prompt lookup's, or reserved for a draft model, whose own decodes fill them); sched.c's spec_step keeps
 * those the target's rows agree with. Runs on the scheduler thread and calls nothing of sched.c; tested by
 * tests/test_serve.sh's speculative cases. */
#include "serve/sched_impl.h"

#include <stdlib.h>
#include <string.h>

/* Whether job j may speculate: the server drafts and the request leaves it on, and acceptance gives the tokens the
 * slot's own sampling would: no penalties (the acceptance rule sees no history) and no grammar (drafts are not
 * checked against it). */
bool sched_spec_eligible(const srv_sched *s, const srv_job *j) {
    const kiln_sampler_params *p = &j->g.sp;
    const bool penalties = p->repeat_last_n != 0 && (p->repeat_penalty != 1 || p->presence_penalty != 0 || p->frequency_penalty != 0);
    return s->spec_on && j->g.spec_n_max != 0 && !penalties && !j->g.grammar;
}

/* How many drafts slot sl (decoding, its job eligible) feeds this step, at most room: what the request and the server
 * allow, and what the context and n_predict leave room for after last (a token past n_predict is never emitted);
 * prompt lookup's tokens into sl->draft, or that many reserved for the draft model (model_drafts). Fewer than the
 * minimum: none. */
int sched_spec_drafts(srv_sched *s, slot *sl, int64_t room) {
    const srv_gen *g = &sl->job->g;
    const int64_t pos = kiln_context_seq_pos(s->c, sl->id);
    int64_t k = g->spec_n_max >= 0 && g->spec_n_max < s->spec.draft_max ? g->spec_n_max : s->spec.draft_max;
    const int64_t n_min = g->spec_n_min >= 0 ? g->spec_n_min : s->spec.draft_min;
    if (k > room) k = room;
    if (k > s->n_ctx - 1 - pos) k = s->n_ctx - 1 - pos; /* the drafts' positions pos + 1 .. pos + k */
    if (g->n_predict >= 0 && k > g->n_predict - sl->n_decoded - 1) k = g->n_predict - sl->n_decoded - 1;
    if (k <= 0 || k < n_min) return 0;
    if (s->spec.draft) return (int)k;
    memcpy(s->spec_seq, kiln_context_seq_tokens(s->c, sl->id), (size_t)pos * sizeof *s->spec_seq);
    s->spec_seq[pos] = sl->last;
    k = (int64_t)kiln_spec_lookup(s->spec_seq, (size_t)pos + 1, 1, s->spec.lookup_ngram, (size_t)k, sl->draft);
    return k < n_min ? 0 : (int)k;
}

/* The draft model's token after slot sl's row r of its latest decode into sl->draft[t]: its argmax at temperature 0,
 * else a draw from its distribution under the slot's sampler settings, kept in spec_q for acceptance. */
static void draft_token(srv_sched *s, slot *sl, int r, int t) {
    if (sl->job->g.sp.temp == 0) {
        sl->draft[t] = s->dnext[r];
        return;
    }
    float *q = s->spec_q + (size_t)(sl->qrow + t) * (size_t)s->V;
    memcpy(q, s->dlogits + (size_t)r * (size_t)s->V, (size_t)s->V * sizeof *q);
    kiln_sampler_probs(sl->smp, q, NULL, 0);
    sl->draft[t] = kiln_sampler_draw(sl->smp, q);
}

/* Runs the draft context over dbatch[0, n): its argmaxes into dnext, and its logits into dlogits when a slot samples.
 * False on an error of the draft's. */
static bool draft_decode(srv_sched *s, size_t n, bool any_sampling) {
    if (!n) return true;
    if (kiln_context_decode(s->spec.draft, s->dbatch, n, any_sampling ? s->dlogits : NULL, s->dnext)) return false;
    return true;
}

/* The draft model's drafts for the slots that reserved some (sl->n_draft), run without the scheduler's lock (only this
 * thread touches the slots' drafts and the contexts). Each slot's draft sequence is caught up to its target's tokens
 * and last: the longest common prefix kept (kiln_context_seq_keep), the rest evaluated, batched over the slots in
 * chunks of the draft's n_batch. Then one token a slot a decode, batched over the slots, until each has its drafts. A
 * decode the draft fails marks every reserving slot -1 (its job ends with the error). */
void sched_model_drafts(srv_sched *s) {
    kiln_context *dc = s->spec.draft;
    const int64_t nb = kiln_context_n_batch(dc);
    bool sampling = false;
    int most = 0;
    for (int i = 0; i < s->n_slots; i++) {
        slot *sl = &s->slots[i];
        sl->drow = -1;
        if (sl->n_draft <= 0) continue;
        sampling = sampling || sl->job->g.sp.temp != 0;
        most = sl->n_draft > most ? sl->n_draft : most;
        /* last (at pos0) is evaluated whatever the draft holds: its logits give the first draft */
        const int64_t l = sched_lcp(kiln_context_seq_tokens(dc, sl->id), kiln_context_seq_pos(dc, sl->id), kiln_context_seq_tokens(s->c, sl->id),
                              sl->pos0);
        kiln_context_seq_keep(dc, sl->id, l);
    }
    for (bool behind = true; behind;) { /* the catch-up, a chunk of n_batch entries a decode */
        size_t n = 0;
        int r = 0;
        behind = false;
        for (int i = 0; i < s->n_slots; i++) {
            slot *sl = &s->slots[i];
            if (sl->n_draft <= 0) continue;
            const int32_t *tok = kiln_context_seq_tokens(s->c, sl->id);
            int64_t p = kiln_context_seq_pos(dc, sl->id);
            for (; p <= sl->pos0 && (int64_t)n < nb; p++)
                s->dbatch[n++] = (kiln_batch_entry){.seq = sl->id, .id = p == sl->pos0 ? sl->last : tok[p], .pos = p,
                                                    .logits = p == sl->pos0};
            if (p == sl->pos0 + 1 && kiln_context_seq_pos(dc, sl->id) <= sl->pos0) sl->drow = r++;
            behind = behind || p <= sl->pos0;
        }
        if (!draft_decode(s, n, sampling)) goto fail;
        for (int i = 0; i < s->n_slots; i++)
            if (s->slots[i].n_draft > 0 && s->slots[i].drow >= 0) draft_token(s, &s->slots[i], s->slots[i].drow, 0), s->slots[i].drow = -1;
    }
    for (int t = 1; t < most; t++) { /* draft t after draft t - 1, a token a slot */
        size_t n = 0;
        for (int i = 0; i < s->n_slots; i++) {
            slot *sl = &s->slots[i];
            if (sl->n_draft <= t) continue;
            sl->drow = (int)n;
            s->dbatch[n++] = (kiln_batch_entry){.seq = sl->id, .id = sl->draft[t - 1], .pos = sl->pos0 + t, .logits = true};
        }
        if (!draft_decode(s, n, sampling)) goto fail;
        for (int i = 0; i < s->n_slots; i++)
            if (s->slots[i].n_draft > t) draft_token(s, &s->slots[i], s->slots[i].drow, t);
    }
    return;
fail:
    for (int i = 0; i < s->n_slots; i++)
        if (s->slots[i].n_draft > 0) s->slots[i].n_draft = -1;
}
