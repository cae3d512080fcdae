/* jobs.h: the workbench's job manager (kiln serve --workbench). A job is a tokenizer training (kiln_bpe_train), a
 * shard writing (kiln_data_write), a training run (kiln_train_run) or an export of a checkpoint (kiln_trainer_export,
 * then kiln_quantize_file), with its parameters (JSON, checked by the route
 * before it is queued), state, progress, a bounded history of progress events, a one-line error and its outputs.
 * Each queue ("cpu", "cuda:N") has one worker thread that runs its jobs one at a time in the order they came; the
 * others wait queued. A job's JSON is written atomically (temp file, rename) to DIR/jobs/<id>.json at each state
 * change and about every second of progress, and loaded again at start: a job that was queued or running when the
 * server died is failed, "the server stopped while it ran". Everything shared is under wb.mu. Calls only
 * include/kiln.h. */
#ifndef KILN_SERVE_JOBS_H
#define KILN_SERVE_JOBS_H

#include "kiln.h"

#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum { WB_TOKENIZER, WB_DATA, WB_TRAIN, WB_EXPORT, WB_N_KINDS } wb_kind;
/* from WB_DONE on a state is final */
typedef enum { WB_QUEUED, WB_RUNNING, WB_PAUSED, WB_DONE, WB_FAILED, WB_STOPPED } wb_state;

#define WB_MAX_EVENTS 10000 /* a job's stored events; when full, every other one is dropped (the seq numbers stay) */
#define WB_MAX_QUEUES 9     /* cpu and cuda:0 .. cuda:7 */
#define WB_NAME_MAX 64

typedef struct wb_job {
    char id[16];      /* "j<N>", N counting up over the data folder's life */
    int64_t num;      /* N */
    wb_kind kind;
    char queue[16];   /* "cpu" or "cuda:N" */
    json_t *params;   /* the checked fields (the route's); read-only once queued */
    wb_state state;
    json_t *progress; /* the last event (NULL before the first) */
    json_t *events;   /* array, seq ascending */
    int64_t n_seq;    /* events made: the seq of the next */
    char error[512];  /* one line, "" unless failed */
    double created, started, ended; /* unix seconds; 0: not yet */
    json_t *outputs;  /* object: paths and what they hold (checkpoint_step, val_loss, ...) */
    int cancel;       /* train: set with __atomic_store_n by a stop, read by kiln_train_run */
    int pause;        /* train: set and cleared by wb_act, read by kiln_train_run (the state follows its reports) */
    double written;   /* srv_now() of the last write of its file */
    double t0;        /* srv_now() at its start: events' "t" */
} wb_job;

struct wb;
typedef struct wb_queue {
    struct wb *w;
    char name[16];
    pthread_t th;
    bool started;
    wb_job *running;  /* NULL: idle */
} wb_queue;

typedef struct wb {
    char *dir, *examples; /* the data folder; the example corpora's folder (may not exist) */
    char *bundled;        /* the bundled model (kiln_cli_default_model), offered as model and tokenizer; or NULL */
    pthread_mutex_t mu;
    pthread_cond_t cv;    /* a job queued, a state changed, an event */
    wb_job **jobs;        /* (n_jobs) in the order they came; never removed before wb_free */
    size_t n_jobs, cap_jobs;
    wb_queue queues[WB_MAX_QUEUES];
    int n_queues;
    int64_t next_num;
    struct wb_tok_cache *toks; /* the tokenizers the routes load (routes_wb.c), freed by wb_free */
    void (*toks_free)(struct wb_tok_cache *);
    bool closing;         /* wb_close: no new jobs, workers finish the one they run */
} wb;

const char *wb_kind_name(wb_kind k);
const char *wb_state_name(wb_state s);

/* Makes DIR and its corpora/, tokenizers/, data/, runs/ and jobs/ (as needed) and loads DIR/jobs/. */
kiln_status wb_new(const char *dir, const char *examples_dir, wb **out);
/* No new jobs; queued ones are left for the next start (they load as failed), running trains are asked to stop,
 * event streams end. Called before the HTTP front stops. */
void wb_close(wb *w);
/* Waits (up to wait_s) for the workers, then frees everything; a worker still inside a tokenizer or data job is
 * left to the process's exit (its job written as failed) and w is then not freed. */
void wb_free(wb *w, double wait_s);

/* Queues a job of kind on queue with params (taken); *out its pointer (valid until wb_free). False when closing or
 * out of memory (params freed). Under no lock: takes w->mu. */
bool wb_submit(wb *w, wb_kind kind, const char *queue, json_t *params, wb_job **out);
/* The job with id, under w->mu (the caller holds it), or NULL. */
wb_job *wb_find(wb *w, const char *id);
/* The job as JSON (with its events when events is true); the caller holds w->mu. */
json_t *wb_job_json(const wb_job *j, bool events);
/* What POST /wb/jobs/ID/ACTION does to job id: stop (a queued one at once, a running or paused train after its
 * current step), pause (a running train waits before its next step) or resume it. The HTTP status (200, 404, 409)
 * and, when not 200, why in msg. */
typedef enum { WB_STOP, WB_PAUSE, WB_RESUME } wb_action;
int wb_act(wb *w, const char *id, wb_action a, char *msg, size_t cap);

/* Whether s is a workbench name: 1..WB_NAME_MAX bytes of [A-Za-z0-9._-], not starting with '.', no "..". */
bool wb_name_ok(const char *s);
/* DIR/sub/name into buf; false when it does not fit. */
bool wb_path(const wb *w, char *buf, size_t cap, const char *sub, const char *name);
/* A corpus name's file: a saved one (corpora/NAME) or an example ("SET/FILE" under the examples folder, each part a
 * name). False when the name is neither (a bad name or no such file). */
bool wb_corpus_path(const wb *w, const char *name, char *buf, size_t cap);

/* The event stream of a job (GET /wb/jobs/ID/events): every stored event, then the live ones, then an "end" event
 * with the final job; ends early when the workbench closes. Read as srv_response's reader. */
typedef struct wb_sse wb_sse;
wb_sse *wb_sse_new(wb *w, wb_job *j);
long wb_sse_read(void *sse, char *buf, size_t cap, bool (*alive)(void *), void *ud);
void wb_sse_free(void *sse);

#endif
