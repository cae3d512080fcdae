/* trainer.h: the one interface of kiln's two trainers, picked once when a run starts: the CPU's (trainer_cpu.c:
 * src/train/llama_train.c's forward and backward through the CPU ops table, and kiln_adamw, fp32 or 8-bit) and the
 * GPU's (trainer_cuda.c over src/cuda/trainer.cu: its own fused bf16 orchestration and a fused AdamW, fp32 or 8-bit). Both
 * train the layout of a kiln_llama_train (the tensor table, so the flat buffer's offsets are the same on both).
 *
 * The gradient convention, the same on both: a step ADDS into the parameter gradients (+=), so micro-batches
 * accumulate until zero_grads; the activation gradients are the trainer's own work buffers, which every step
 * overwrites (=). Below the trainers, the ops state their own: the CPU ops accumulate into every gradient and the
 * orchestration zeroes an activation gradient before building it (src/cpu/ops.h); the CUDA kernels say per kernel
 * (src/cuda/train_kernels.h).
 *
 * The state (get_state, set_state) is read and written in parts and ranges, so a checkpoint streams between the
 * file and wherever the trainer keeps it (the GPU keeps no host copy of its parameters, gradients or moments).
 * Data parallel (the GPU with a kiln_dist), the calls marked collective must be made by every rank in the same
 * order. tests/test_train.c and tests/test_trainer_api.c drive both through this interface. */
#ifndef KILN_TRAIN_TRAINER_H
#define KILN_TRAIN_TRAINER_H

#include "train/llama_train.h"
#include "optim.h"

struct kiln_dist;

/* The parts of a trainer's state, each a flat array over the parameter buffer's n_params elements (the scales:
 * one per KILN_ADAMW8_BLOCK). M and V for fp32 AdamW, M8, V8 and the scales for 8-bit AdamW. */
typedef enum kiln_train_part {
    KILN_PART_PARAMS,  /* f32, the master weights */
    KILN_PART_M,       /* f32 */
    KILN_PART_V,       /* f32 */
    KILN_PART_M8,      /* int8 */
    KILN_PART_V8,      /* uint8 */
    KILN_PART_M_SCALE, /* f32 */
    KILN_PART_V_SCALE, /* f32 */
} kiln_train_part;

/* Counters a checkpoint keeps besides the arrays. */
typedef struct kiln_train_counters {
    int64_t opt_step;        /* AdamW updates applied (skipped steps do not count) */
    int64_t n_embed_skipped; /* rows of non-finite embedding gradient skipped so far (summed over the ranks) */
} kiln_train_counters;

/* What a trainer is made for. */
typedef struct kiln_trainer_cfg {
    bool mixed;                /* bf16 compute mirror (always on the GPU) */
    kiln_adamw_cfg adam;
    float label_smoothing, z_loss;
    int64_t B, T;              /* the micro-batch */
    kiln_pool *pool;           /* CPU: the threads (borrowed) */
    int device;                /* CUDA: the device index */
    unsigned cuda_flags;       /* CUDA: KILN_CUDA_TRAIN_* (src/cuda/cuda.h) */
    struct kiln_dist *dist;    /* CUDA: data parallel (NULL: one GPU) */
} kiln_trainer_cfg;

typedef struct kiln_trainer_impl kiln_trainer_impl;

typedef struct kiln_trainer_ops {
    const char *name; /* "cpu", "cuda" */
    /* One micro-batch of B*T inputs and targets (-1 ignored): forward and loss, and when grad_scale != 0 the
     * backward, grads += grad_scale * d(sum of counted losses)/d(params). *loss_sum and *n_counted are over every
     * rank's rows. Collective. */
    kiln_status (*step)(kiln_trainer_impl *t, const int32_t *inputs, const int32_t *targets, float grad_scale, double *loss_sum,
                        int64_t *n_counted);
    kiln_status (*zero_grads)(kiln_trainer_impl *t);
    /* One AdamW update at lr from the accumulated gradient (summed over the ranks first); *out gets the norm and
     * whether a non-finite gradient skipped it. Collective. */
    kiln_status (*optimizer_step)(kiln_trainer_impl *t, float lr, kiln_adamw_result *out);
    /* Data parallel: the next step is the last micro-batch before optimizer_step, so its backward may sum the
     * gradient over the ranks as it goes. A no-op on one device. */
    void (*reduce_next)(kiln_trainer_impl *t);
    /* Data parallel: *flag becomes rank 0's. Collective; a no-op on one device. */
    kiln_status (*agree)(kiln_trainer_impl *t, bool *flag);
    /* Makes part readable on this rank (data parallel: gathers what other ranks hold); until the next step or the
     * next state_begin. Collective. */
    kiln_status (*state_begin)(kiln_trainer_impl *t, kiln_train_part part);
    /* Elements [first, first + n) of part into host memory dst, after state_begin of part. */
    kiln_status (*get_state)(kiln_trainer_impl *t, kiln_train_part part, int64_t first, int64_t n, void *dst);
    /* The same range of part from host memory src (the caller may free it on return; a file's mmap is fine). Every
     * rank sets the whole of every part; each keeps what it holds. Setting PARAMS refreshes the mirror before the
     * next step. */
    kiln_status (*set_state)(kiln_trainer_impl *t, kiln_train_part part, int64_t first, int64_t n, const void *src);
    /* Collective. */
    kiln_status (*get_counters)(kiln_trainer_impl *t, kiln_train_counters *c);
    kiln_status (*set_counters)(kiln_trainer_impl *t, const kiln_train_counters *c);
    /* Bytes of activations and work buffers (the CPU) or of everything on the device (the GPU), for reports. */
    size_t (*act_bytes)(const kiln_trainer_impl *t);
    void (*free)(kiln_trainer_impl *t);
} kiln_trainer_ops;

/* What every implementation starts with. */
struct kiln_trainer_impl {
    const kiln_trainer_ops *ops;
    const kiln_llama_train *m; /* the layout (config and tensor table), owned by the trainer; on the CPU the model */
    kiln_trainer_cfg cfg;
};

/* A trainer of a model of config c (kiln_llama_train_new's rules), parameters zero until set_state. The CUDA one
 * refuses anything the GPU cannot hold, before it allocates. */
kiln_status kiln_trainer_cpu_new(const kiln_llama_config *c, const kiln_trainer_cfg *cfg, kiln_trainer_impl **out);
kiln_status kiln_trainer_cuda_new(const kiln_llama_config *c, const kiln_trainer_cfg *cfg, kiln_trainer_impl **out);
void kiln_trainer_impl_free(kiln_trainer_impl *t); /* accepts NULL */

/* The CPU trainer over a model and optimizer the caller keeps and frees (opt NULL: the weights alone): how
 * checkpoint.c's host-side save and load reach the same writer and reader. storage holds it; nothing to free. */
typedef struct kiln_cpu_trainer kiln_cpu_trainer;
struct kiln_cpu_trainer {
    kiln_trainer_impl base;
    kiln_llama_train *m;
    kiln_adamw *opt;
    kiln_adamw own_opt; /* the optimizer of a trainer made by kiln_trainer_cpu_new */
    bool owned, mirror_stale;
};
kiln_trainer_impl *kiln_trainer_cpu_borrow(kiln_cpu_trainer *storage, kiln_llama_train *m, kiln_adamw *opt);
/* The CPU model of a CPU trainer (for the tests and the benchmark), NULL for another. */
kiln_llama_train *kiln_trainer_cpu_model(kiln_trainer_impl *t);

/* ---- the state in files (checkpoint.c) */

/* t's parameters from the random init of seed, or from a loaded model's weights, streamed through set_state
 * (kiln_llama_train_stream_random and _stream_model). */
kiln_status kiln_trainer_load_random(kiln_trainer_impl *t, uint64_t seed);
kiln_status kiln_trainer_load_model(kiln_trainer_impl *t, const kiln_model *src);

/* The run's position, which a checkpoint keeps beside the trainer's state. */
typedef struct kiln_train_state {
    int64_t step, tokens_seen, data_pos, n_embed_skipped;
    uint64_t seed;
    int64_t B, T;
    int64_t world;     /* data-parallel ranks (train.world; a checkpoint without the key: 1) */
    int64_t n_skipped; /* steps skipped for a non-finite loss or gradient */
} kiln_train_state;

/* Streams t's weights with the metadata of a llama GGUF and the tokenizer keys of tok_src (may be NULL) to path,
 * atomically, through a bounded host buffer; with st it is a checkpoint (optimizer state and the run's keys).
 * Collective: every rank calls it, and only the one with write set touches the file. */
kiln_status kiln_train_write(kiln_trainer_impl *t, const kiln_gguf *tok_src, const char *name, const kiln_train_state *st,
                             bool write, const char *path);
/* Opens a checkpoint: its model (for the config and the weights' mmap) and the run's keys into st, checking that
 * the optimizer is the one cfg asks for. */
kiln_status kiln_train_open_checkpoint(const char *path, const kiln_adamw_cfg *cfg, kiln_model **src, kiln_train_state *st,
                                       kiln_train_counters *counters);
/* The weights, moments and counters of an opened checkpoint into t, straight from its mmap. */
kiln_status kiln_train_restore(kiln_trainer_impl *t, const kiln_model *src, const kiln_train_counters *counters);

/* Host-side conveniences over the same writer and reader (tests, small tools). kiln_train_save writes m's weights
 * and, with opt and st, a checkpoint. kiln_train_load_checkpoint loads one into a new host model (mixed as asked)
 * and opt (initialized here with cfg, whose eight_bit must match the file's). */
kiln_status kiln_train_save(kiln_llama_train *m, const kiln_gguf *tok_src, const char *name, kiln_adamw *opt,
                            const kiln_train_state *st, const char *path);
kiln_status kiln_train_load_checkpoint(const char *path, bool mixed, const kiln_adamw_cfg *cfg, kiln_llama_train **m,
                                       kiln_adamw *opt, kiln_train_state *st);
/* The optimizer's segments for m's tensors: decay as each tensor says. segs has m->n_tensors entries. */
void kiln_train_segments(const kiln_llama_train *m, kiln_param_segment *segs);

#endif
