/* sched.h: the server's scheduler. One thread owns the kiln_context; its sequences are the slots. Requests become
 * jobs: a prompt (token ids) and the generation's parameters. Each iteration builds one batch (every decoding slot's
 * next token, then prefill chunks of slots still reading their prompt, up to n_batch entries), runs one
 * kiln_context_decode, and per slot samples, checks the ends (EOS, end of turn, n_predict, the context, stop strings,
 * the deadline) and hands the job its new text: whole UTF-8 sequences only, a possible stop string held back. With
 * speculative decoding a slot also feeds drafts (prompt lookup's or a draft model's) and keeps those its rows agree
 * with, each handed out as a sampled token is (docs/speculative.md). Jobs
 * with no free slot wait in a bounded queue. Slot files and erasing run on the scheduler thread too. Calls only
 * include/kiln.h. */
#ifndef KILN_SERVE_SCHED_H
#define KILN_SERVE_SCHED_H

#include "kiln.h"

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SRV_MAX_STOPS 16
#define SRV_MAX_PROBS 20

/* What a request asks of the generation. */
typedef struct srv_gen {
    kiln_sampler_params sp;
    int64_t n_predict;     /* -1: until an end or the context's end */
    char *stops[SRV_MAX_STOPS]; /* owned by the job */
    int n_stops;
    int n_probs;           /* top-n probabilities per token, 0 .. SRV_MAX_PROBS */
    bool cache_prompt;     /* reuse the longest cached prefix (default true) */
    int id_slot;           /* -1: any */
    bool ignore_eos;
    double timeout_s;      /* 0: none */
    bool seed_set;         /* sp.seed came from the request; else a fresh one */
    kiln_grammar *grammar; /* "grammar" (GBNF): every token the slot samples is one it allows; owned by the job */
    int spec_n_max;        /* "speculative.n_max": the most drafts a step, 0 none; -1: the server's --draft-max */
    int spec_n_min;        /* "speculative.n_min": fewer drafts are not verified; -1: the server's --draft-min */
} srv_gen;

typedef enum srv_finish { SRV_RUNNING = 0, SRV_FIN_EOS, SRV_FIN_STOP, SRV_FIN_LENGTH, SRV_FIN_CONTEXT, SRV_FIN_TIMEOUT, SRV_FIN_CANCEL, SRV_FIN_ERROR } srv_finish;

typedef struct srv_prob {
    int32_t id;
    float logprob;
} srv_prob;

/* One generated token, for logprobs: its id, its log-probability and the top-n (n_probs) alternatives. */
typedef struct srv_tokinfo {
    int32_t id;
    float logprob;
    int n_top;
    srv_prob top[SRV_MAX_PROBS];
} srv_tokinfo;

struct srv_job;
/* Called on the scheduler's emitter thread, in order, with the job's new text (valid UTF-8, may be empty with toks) and the tokens that
 * made it; done is true on the last call, when the job's results are final. Takes the job's lock itself. */
typedef void (*srv_emit_fn)(struct srv_job *j, const char *text, size_t n, const srv_tokinfo *toks, size_t n_toks, bool done);

typedef struct srv_job {
    /* in: set before srv_sched_submit, then read-only */
    int32_t *prompt; /* (n_prompt) owned */
    size_t n_prompt;
    srv_gen g;
    srv_emit_fn emit; /* NULL: results only */
    void *ud;         /* the route's stream state */
    void (*ud_free)(void *ud); /* frees ud with the job (the scheduler may still emit after the HTTP side let go) */
    /* shared: under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;         /* the HTTP side and the scheduler: freed by the last srv_job_release */
    bool cancel;      /* asked by the HTTP side: the client went away */
    bool done;
    /* out: final once done */
    srv_finish finish;
    char *text;       /* (n_text) the generated text, stop string cut, NUL-terminated */
    size_t n_text;
    srv_tokinfo *toks; /* (n_toks) when n_probs > 0 or logprobs asked */
    size_t n_toks, cap_toks;
    bool want_toks;
    int32_t *gen;     /* (n_gen) generated ids */
    size_t n_gen, cap_gen;
    char stop_word[256]; /* the stop string that ended it, "" if none */
    int slot;
    int64_t n_cached;    /* prompt tokens reused from a cache */
    int64_t n_evaluated; /* prompt tokens evaluated */
    bool spec;           /* the job speculated (sched.c's spec_eligible) */
    int64_t draft_n, draft_accepted; /* drafted tokens verified, and those taken */
    double t_submit, t_start, t_first, t_end; /* seconds: queued, slot taken, prompt read, done */
    int http_status;     /* an error that ended it (400, 500, 503); 0 if none */
    char err[256];
} srv_job;

srv_job *srv_job_new(void);
void srv_job_release(srv_job *j); /* drops one reference */
void srv_job_cancel(srv_job *j);
bool srv_job_cancelled(srv_job *j);
/* Waits until done (true) or until alive(ud) says the client is gone (cancels, returns false); polls every 100 ms. */
bool srv_job_wait(srv_job *j, bool (*alive)(void *), void *ud);

/* Speculative decoding (docs/speculative.md): each step a decoding slot whose job allows it feeds its next token and
 * up to draft_max drafts, all with logits, and keeps those the target agrees with. */
typedef struct srv_spec_params {
    bool lookup;             /* prompt lookup drafts (--lookup) */
    int lookup_ngram;        /* the longest n-gram looked up (--lookup-ngram; 0: 3) */
    kiln_context *draft;     /* a draft model's context (-md), n_seq = the slots, or NULL; the scheduler's once made */
    int draft_max, draft_min; /* --draft-max (0: 16), --draft-min */
} srv_spec_params;

typedef struct srv_sched_params {
    int queue_max;       /* jobs that may wait for a slot (0: 4 x n_slots) */
    srv_spec_params spec; /* none when neither lookup nor draft */
    int32_t eot;         /* the chat template's end-of-turn token, which ends a reply as EOS does; -1: none
                          * (srv_server_new sets it from its template) */
} srv_sched_params;

/* A slot as /slots and /metrics show it. */
typedef struct srv_slot_info {
    int id;
    bool busy;
    int64_t n_past;     /* positions cached */
    int64_t n_prompt, n_decoded;
} srv_slot_info;

typedef struct srv_metrics {
    int64_t prompt_tokens, predicted_tokens; /* totals */
    double prompt_s, predicted_s;
    int64_t requests_done, decodes;
    int processing, deferred;
    int64_t kv_used, kv_total;  /* positions cached over all slots; slots x n_ctx_slot */
    int64_t n_busy_max;         /* the most slots busy at once */
    /* the scheduler's steps: rows decoded, seconds in the engine's decode, seconds handing out the sampled tokens,
     * and the steps that carried prompt tokens */
    int64_t step_rows, steps_mixed;
    double step_decode_s, step_emit_s;
    int64_t draft_tokens, draft_accepted; /* drafts verified and taken, over all jobs */
} srv_metrics;

typedef struct srv_sched srv_sched;

/* Starts the scheduler thread over c (which it then owns until srv_sched_free); tok for the texts. */
kiln_status srv_sched_new(kiln_context *c, const kiln_model *m, const srv_sched_params *p, srv_sched **out);
/* Stops the thread (the running and queued jobs end SRV_FIN_CANCEL) and frees it; not the context. */
void srv_sched_free(srv_sched *s);
/* Queues j (its reference is taken). False when the queue is full (j untouched): the caller answers 503. */
bool srv_sched_submit(srv_sched *s, srv_job *j);
int32_t srv_sched_n_slots(const srv_sched *s);
int64_t srv_sched_n_ctx_slot(const srv_sched *s);
const srv_spec_params *srv_sched_spec(const srv_sched *s); /* the settings in force (defaults filled in) */
void srv_sched_slots(srv_sched *s, srv_slot_info *out); /* n_slots entries */
void srv_sched_metrics(srv_sched *s, srv_metrics *out);
/* Jobs queued or running. */
int srv_sched_pending(srv_sched *s);
/* A slot file: save, restore or erase slot `slot` on the scheduler thread, once it is idle. Returns the HTTP status
 * (200, 400 busy or a bad file, 500) with msg set on failure; *n_tokens the positions saved or restored. */
typedef enum { SRV_SLOT_SAVE, SRV_SLOT_RESTORE, SRV_SLOT_ERASE } srv_slot_action;
int srv_sched_slot_action(srv_sched *s, int slot, srv_slot_action a, const char *path, int64_t *n_tokens, char *msg, size_t cap);

/* Text helpers (pure, tested on their own). Bytes of s[0..n) that end in an incomplete UTF-8 sequence: how many of
 * the last bytes to hold back until the next piece (0..3). */
size_t srv_utf8_incomplete_tail(const char *s, size_t n);
/* The length of the longest suffix of s[0..n) that is a proper prefix of one of stops: bytes to hold back. */
size_t srv_stop_holdback(const char *s, size_t n, char *const *stops, int n_stops);
/* A copy of s[0..n) with every invalid UTF-8 sequence replaced by U+FFFD (for JSON); *out_n its length. */
char *srv_utf8_sanitize(const char *s, size_t n, size_t *out_n);
double srv_now(void);

#endif
