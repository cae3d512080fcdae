/* sched_impl.h: the scheduler's state (the slots and srv_sched) and the helpers its two files share: sched.c (the
 * loop, batching, sampling, the ends, and the acceptance of drafts) and sched_spec.c (the drafts, which calls
 * nothing of sched.c). Only these two include it; the server's other files see sched.h. */
#ifndef KILN_SERVE_SCHED_IMPL_H
#define KILN_SERVE_SCHED_IMPL_H

#include "serve/sched.h"

typedef enum { SLOT_IDLE, SLOT_PREFILL, SLOT_DECODE } slot_state;

typedef struct slot {
    int id;
    slot_state st;
    srv_job *job;
    kiln_sampler *smp;
    kiln_grammar_matcher *gm; /* the job's grammar over the tokens sampled so far (NULL without one) */
    size_t n_done;     /* prompt tokens in the cache */
    int32_t last;      /* SLOT_DECODE: the sampled token the next batch feeds */
    int64_t n_decoded;
    char *text;        /* (n_text) generated so far; text[0..sent) handed to the job */
    size_t n_text, cap_text, sent;
    int64_t n_prompt;  /* the last job's, for /slots */
    int64_t n_past;    /* the sequence's position, kept by the scheduler thread for readers under the lock */
    bool spec;         /* the job may speculate (spec_eligible) */
    int32_t *draft;    /* (draft_max) this step's drafts, fed after last */
    int n_draft;       /* how many are in this step's batch */
    int64_t pos0;      /* last's position in this step's batch */
    int64_t row;       /* this step's first logits row (last's); the drafts' follow */
    int64_t qrow;      /* a draft model's drafts: their first row of spec_q */
    int drow;          /* the draft model's logits row of the slot in its latest decode; -1: none */
} slot;

/* A slot file or erase, waiting for the scheduler thread. */
typedef struct ctrl {
    struct ctrl *next;
    int slot;
    srv_slot_action a;
    const char *path;
    int status;
    int64_t n_tokens;
    char *msg;
    size_t cap;
    bool done;
} ctrl;

struct srv_sched {
    kiln_context *c;
    const kiln_model *m;
    const kiln_tokenizer *tok;
    kiln_grammar_vocab *gvocab; /* the vocab's trie for grammars, made on the first job that has one */
    int32_t eos, eot;
    int64_t V, n_ctx, n_batch;
    int32_t n_slots;
    slot *slots;         /* (n_slots) */
    srv_job **queue;     /* (queue_max) FIFO */
    int q_n, queue_max;
    ctrl *ctrls;
    pthread_mutex_t mu;
    pthread_cond_t cv, ctrl_cv;
    pthread_t th;
    bool stop;
    srv_metrics met;
    kiln_batch_entry *batch; /* (n_batch) */
    int *row_slot;           /* (n_slots) the slots with logits rows this step, in the rows' order */
    float *logits;           /* (n_slots + spec_rows, V) */
    srv_spec_params spec;    /* speculation's settings, defaults filled in; spec.draft owned */
    bool spec_on;            /* lookup or a draft model */
    int64_t spec_rows;       /* logits rows for drafts in one step, over all slots: draft_max x SPEC_SLOTS at most */
    int spec_turn;           /* the slot the drafts' rows go to first this step */
    int32_t *spec_seq;       /* (n_ctx + 1) a slot's tokens and its next one, for prompt lookup */
    int32_t *spec_out;       /* (draft_max + 1) the tokens a verification gives */
    kiln_batch_entry *dbatch; /* (the draft's n_batch) the draft model's batch */
    int32_t *dnext;          /* (n_slots) its argmaxes: a row a slot at most, each decode */
    float *dlogits;          /* (n_slots, V) its logits */
    float *spec_q;           /* (spec_rows, V) the draft's probabilities that each draft was drawn from, at a temperature */
    float *spec_rows_copy;   /* (draft_max + 1, V) a sampling slot's rows before acceptance, for log-probabilities; made
                              * on the first such job */
    float *probs;            /* (V) scratch for log-probabilities */
    /* a step whose rows all come from plain slots (no grammar, log-probabilities or drafts) draws them in the step
     * (kiln_context_decode_sample: on a GPU only the tokens come back), unless KILN_SAMPLE_ON_HOST=1 */
    bool in_step;
    kiln_sampler **ssmp;     /* (n_slots) this step's samplers, by logits row */
    int32_t *snext;          /* (n_slots) the tokens drawn */
    char *piece;
    size_t piece_cap;
    /* the emitter thread: the jobs' frames are built and handed to the HTTP side off the scheduler thread, in the
     * order they were posted, while the engine runs the next step */
    pthread_t em_th;
    pthread_mutex_t em_mu;
    pthread_cond_t em_cv;    /* a record posted, or the emitter idle */
    struct emit_rec *em_head, *em_tail;
    bool em_on, em_stop, em_busy;
};

/* Slots whose drafts one step verifies at most, which bounds the logits rows: at 152K vocab a row is 600 KB, so 16
 * drafts for 4 slots hold 39 MB. Further slots decode plainly in that step; the first slot served turns each step. */
#define SPEC_SLOTS 4

/* The length of the longest common prefix of two token sequences (the prompt cache's and the draft's catch-up). */
static inline int64_t sched_lcp(const int32_t *a, int64_t na, const int32_t *b, int64_t nb) {
    int64_t k = 0;
    while (k < na && k < nb && a[k] == b[k]) k++;
    return k;
}

/* sched_spec.c */
bool sched_spec_eligible(const srv_sched *s, const srv_job *j);
int sched_spec_drafts(srv_sched *s, slot *sl, int64_t room);
void sched_model_drafts(srv_sched *s);

#endif
