/* train.h: the training run behind `kiln train`: a llama model (new, from dimensions, or fine-tuned from a
 * GGUF) trained on token shards with AdamW, mixed precision, an LR schedule, gradient accumulation,
 * periodic evaluation, a JSONL log and atomic GGUF checkpoints that resume bit for bit.
 *
 * Checkpoint format: a llama GGUF (general.architecture llama, the tokenizer's tokenizer.ggml.* keys, F32
 * weights under their llama names) plus
 *   keys    train.step, train.tokens_seen, train.data_pos, train.seed, train.B, train.T, train.world, train.mixed,
 *           train.n_embed_skipped, train.optim ("adamw" or "adamw8bit"), train.optim_step, train.n_skipped
 * After the random init nothing in a run is random (no dropout; batches are read in order), so the step,
 * the data position and the optimizer state are the whole state: a resumed run repeats the uninterrupted one.
 *   tensors optim.m, optim.v (F32, n_params) for AdamW, or optim.m8, optim.v8 (I8, n_params) and
 *           optim.m_scale, optim.v_scale (F32, one per 256) for 8-bit AdamW
 * kiln generate loads a checkpoint as it is (it binds the weights by name and ignores the rest); the
 * exported model (-o) carries the weights only, so any GGUF reader loads it.
 * tests/test_train.c covers the reference dump, resume and a SIGKILL during a checkpoint write. */
#ifndef KILN_TRAIN_TRAIN_H
#define KILN_TRAIN_TRAIN_H

#include "model/llama_train.h"
#include "optim.h"

typedef struct kiln_train_opts {
    /* the model: dimensions (cfg.n_vocab 0: the tokenizer's), or init_from a GGUF, or resume */
    kiln_llama_config cfg;
    const char *init_from;   /* fine-tune these weights (NULL: random init from seed) */
    const char *resume;      /* continue this checkpoint (NULL: start fresh) */
    const char *tokenizer;   /* GGUF with tokenizer.ggml.* (NULL: init_from's / resume's) */
    const char *data_dir;    /* shards written by kiln data */
    /* the run */
    int64_t B, T;            /* sequences per micro-batch, tokens per sequence */
    int64_t grad_accum;      /* micro-batches per step */
    int64_t steps;           /* total optimizer steps */
    double time_budget_s;    /* stop after this long (0: no limit); the schedule still spans steps */
    int64_t stop_after;      /* stop once this step is done (0: run to steps); the schedule still spans steps */
    kiln_lr_schedule lr;
    kiln_adamw_cfg adam;
    bool mixed;              /* bf16 compute mirror of the fp32 master weights */
    float label_smoothing, z_loss;
    uint64_t seed;
    int n_threads;           /* 0: all cores */
    bool gpu;                /* train on CUDA device 0 (src/cuda/trainer.cu): fp32 AdamW, bf16 matmuls */
    bool deterministic;      /* with gpu: fixed-order reductions everywhere (bit-exact resume), a little slower */
    bool recompute;          /* with gpu: recompute the norms' and SwiGLU's outputs in the backward (less memory) */
    bool zero1;              /* data parallel: shard the AdamW moments over the ranks (ZeRO-1) */
    /* evaluation and output */
    int64_t eval_interval;   /* steps between validation passes (0: only at the end) */
    int64_t eval_batches;    /* micro-batches per validation pass */
    int64_t ckpt_interval;   /* steps between checkpoints (0: only at the end) */
    const char *ckpt_path;   /* checkpoint file (NULL: none) */
    const char *out_path;    /* exported model (NULL: none) */
    bool out_best;           /* export at each evaluation that improves the validation loss, not at the end */
    const char *log_path;    /* JSONL log (NULL: none) */
    const char *name;        /* general.name of the outputs */
} kiln_train_opts;

/* Defaults: B 8, T 256, accumulation 1, 1000 steps, lr 1e-3 cosine to 1e-4 with 10% warmup, AdamW defaults,
 * mixed off, eval every 100 steps over 20 batches, checkpoint at the end, seed 1337. */
kiln_train_opts kiln_train_defaults(void);

/* What the progress callback sees after each step (and after each evaluation, with val_loss set). */
typedef struct kiln_train_progress {
    int64_t step, steps;     /* completed steps, target */
    double loss;             /* mean training loss of this step */
    double lr, grad_norm;
    double tok_per_s;        /* this step */
    double elapsed_s, eta_s;
    double val_loss, val_ppl;/* NaN when this report is not an evaluation */
    int64_t n_skipped;       /* non-finite steps skipped so far */
    bool checkpoint;         /* a checkpoint was written after this step */
    int64_t n_params;
    size_t state_bytes, act_bytes; /* training state (master, mirror, grads, moments) and activations */
} kiln_train_progress;

typedef void (*kiln_train_progress_fn)(void *user, const kiln_train_progress *p);

kiln_status kiln_train_run(const kiln_train_opts *opts, kiln_train_progress_fn progress, void *user);

/* ---- checkpoints (checkpoint.c) */

typedef struct kiln_train_state {
    int64_t step, tokens_seen, data_pos, n_embed_skipped;
    uint64_t seed;
    int64_t B, T;
    int64_t world; /* data-parallel ranks (train.world; a checkpoint without the key: 1) */
} kiln_train_state;

/* Writes m's weights with the metadata of a llama GGUF and the tokenizer keys of tok_src (may be NULL) to
 * path, atomically. With opt and st it is a checkpoint (optimizer state and the run's keys). */
kiln_status kiln_train_save(const kiln_llama_train *m, const kiln_gguf *tok_src, const char *name, const kiln_adamw *opt,
                            const kiln_train_state *st, const char *path);
/* Loads a checkpoint: the model (mixed as asked), the optimizer state into opt (initialized here with
 * cfg, whose eight_bit must match the file's) and the run state. */
kiln_status kiln_train_load_checkpoint(const char *path, bool mixed, const kiln_adamw_cfg *cfg, kiln_llama_train **m,
                                       kiln_adamw *opt, kiln_train_state *st);
/* The optimizer's segments for m's tensors: decay as each tensor says. segs has m->n_tensors entries. */
void kiln_train_segments(const kiln_llama_train *m, kiln_param_segment *segs);

#endif
