/* backend.h: the seam between the model and a backend. The inference forward (src/model/llama.c) is written once
 * against this table; the CPU (src/cpu/backend.c) and CUDA (src/cuda/engine.cu) backends fill it. The CPU backend
 * builds each step out of its kernels (src/cpu/ops.h, the scalar path of which is the oracle every other
 * implementation is tested against); the CUDA backend runs each step as one or two fused kernels (kernels.h).
 *
 * A backend is a context (threads and scratch, or a device, its stream and workspaces), buffers in its own memory
 * (alloc, upload, download, free: "backend memory" below; the CPU's is host memory), synchronize, and the steps of
 * the forward. Every step only enqueues work on the context's stream: nothing waits for the device until
 * synchronize, so a whole token step can be recorded once and replayed (record: a CUDA graph on the GPU; the CPU
 * runs the steps as they come). Token ids and positions live in backend memory, so one recording serves every
 * position; a step never reads them on the host.
 *
 * Steps the forward takes for each layer (the fused steps of the CUDA engine):
 *   residual_norm   x += block output (post-normed with sandwich norms); xb = rmsnorm(x) * w, also writing the
 *                   next matmul's prepared input where the backend has one (the GPU's int8 rows)
 *   qkv             q, k, v = xb Wq, Wk, Wv (one matmul over the three where the backend can)
 *   qkv_post        biases, QK-norm, RoPE, and the store of k and v into the KV cache
 *   attention       causal GQA attention over the cache, full or sliding over a ring
 *   matmul          y (+)= x W (the output and down projections add into the residual stream)
 *   ffn_up          gate = act(xb Wg) * (xb Wu)
 *   matmul_norm     x += y W, then residual_norm's xb, as one step where a backend fuses the two (optional)
 *   qkv_attention   qkv_post then attention as one step where a backend fuses the two (optional)
 * and once per call embed, head (the logits with their scale and softcap) and argmax, and nonfinite where the
 * forward is asked to check a stage's output for a NaN or an infinity.
 *
 * Shapes: T tokens, C width, NH/NKV heads, HS head size, F FFN width, V vocab; activations are float, row-major
 * (T, width). */
#ifndef KILN_MODEL_BACKEND_H
#define KILN_MODEL_BACKEND_H

#include "model.h"
#include "model/sample_args.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A weight as the forward hands it to a backend: the model's view (type, shape, name, the mmap'd bytes) and the
 * backend's own copy (device memory, another layout), or NULL where the backend reads the view in place. */
typedef struct kiln_weight {
    const kiln_tensor_view *view; /* NULL: the model has no such tensor */
    const void *impl;
} kiln_weight;

/* Every weight of a model, bound by a backend (load_weights). */
typedef struct kiln_weights {
    kiln_weight tok_embd, output_norm, output;
    kiln_weight (*layers)[KILN_LT_COUNT]; /* (L), indexed by kiln_layer_tensor */
} kiln_weights;

/* What a backend context is opened for: the model, the largest batch, the context and the cache rows of each
 * layer (kiln_llama_kv), so it can size its workspaces and check its memory once, before anything is allocated. */
typedef struct kiln_backend_params {
    int64_t n_ctx, n_batch;
    const int64_t *rows;     /* (L) */
    size_t kv_bytes, act_bytes; /* the buffers the caller will alloc: counted in the memory check */
    kiln_kv_type type_k, type_v; /* the cache's element types */
    int64_t n_seq;           /* sequences: the most single-row segments a batch holds (seq_rows) */
    int n_threads;           /* CPU: 0 for all cores */
    int device;              /* CUDA: the device index */
} kiln_backend_params;

/* The arguments of a layer's qkv_post and attention steps. */
typedef struct kiln_attn_args {
    int64_t NH, NKV, HS;
    const kiln_weight *bq, *bk, *bv;     /* NULL: no biases */
    const kiln_weight *q_norm, *k_norm;  /* NULL: no QK-norm */
    bool qk_norm_full;                   /* q_norm, k_norm (NH*HS), (NKV*HS): one RMSNorm over each token's whole q
                                          * and k (olmo2) instead of one per head (HS) */
    float eps;                           /* of the QK-norm */
    int64_t rope_dim;
    float rope_base;
    const float *rope_freq;              /* (rope_dim / 2) host memory: each pair's angle multiplier (kiln_rope in
                                          * model.h), NULL: unscaled; the CUDA backend passes it by value */
    float rope_mscale;                   /* cos and sin are multiplied by it; 1 unscaled */
    bool neox, nope;
    void *k_cache, *v_cache;             /* (rows, NKV*HS) of type_k, type_v: position p in row p % rows (the block
                                          * types in blocks of 32 along the row, kiln_kv_row_bytes(type, NKV*HS) a row) */
    kiln_kv_type type_k, type_v;
    int64_t rows;
    int64_t window;                      /* 0: full attention */
    float scale;                         /* the score scale; 0: 1/sqrt(HS) */
    float softcap;                       /* scores s = softcap tanh(s / softcap) after the scale, before the mask and
                                          * softmax (gemma2); 0: none */
    /* Rows of several sequences (only for a backend with seq_rows): when seq is set (backend memory, (T)), row t
     * is one token of sequence seq[t] at position pos0[t] (pos0 then holds T positions), its cache rows at k_cache
     * and v_cache + seq[t] * seq_stride bytes. NULL: the T rows are one sequence's, at *pos0 + t. */
    const int32_t *seq;
    size_t seq_stride;
} kiln_attn_args;

/* One step's share of a token's decode (profile). */
typedef struct kiln_op_time {
    const char *name; /* static */
    double ms;        /* per token, mean over the repetitions */
    double bytes;     /* device bytes the step must read per token: its weights, attention's KV positions; 0 if none */
} kiln_op_time;
#define KILN_PROFILE_OPS 16

typedef struct kiln_backend {
    const char *name;  /* "cpu", "cuda" */
    bool host_memory;  /* backend memory is host memory: a step may write straight into the caller's buffers */
    bool seq_rows;     /* qkv_post and attention take kiln_attn_args.seq: the decode rows of many sequences in one
                        * launch each (the forward otherwise runs them a segment at a time) */

    /* ---- the context */
    kiln_status (*open)(const kiln_model *m, const kiln_backend_params *p, void **ctx);
    void (*close)(void *ctx); /* accepts NULL */
    /* Binds every weight of m (uploading or repacking it) into w, owned by ctx. */
    kiln_status (*load_weights)(void *ctx, const kiln_model *m, kiln_weights *w);
    size_t (*device_bytes)(void *ctx); /* device memory held; 0 on the CPU */

    /* ---- buffers. alloc zero-fills. alloc_host gives host memory the backend copies from and to asynchronously
     * (pinned on the GPU), which a recorded step's uploads and downloads must use. upload and download are
     * enqueued: the host side must stay untouched until synchronize. */
    kiln_status (*alloc)(void *ctx, size_t bytes, void **out);
    void (*free)(void *ctx, void *p);
    kiln_status (*alloc_host)(void *ctx, size_t bytes, void **out);
    void (*free_host)(void *ctx, void *p);
    kiln_status (*upload)(void *ctx, void *dst, const void *src, size_t bytes);
    kiln_status (*download)(void *ctx, void *dst, const void *src, size_t bytes);
    kiln_status (*synchronize)(void *ctx);
    /* Runs enqueue(arg). The first call of a slot records what it enqueues (a CUDA graph), later calls of the slot
     * replay the recording without calling enqueue; the CPU has no recording and calls it every time. enqueue must
     * enqueue the same work every time: the same buffers, T and flags. Slots from 0; a backend that keeps fewer
     * runs enqueue unrecorded for the slots past its table (the CUDA engine keeps 8 per decode size up to its
     * decode rows, at least 8: a context of one sequence records its steps at 0..7, one of several sequences its
     * steps of one token each of T sequences at 8 T .. 8 T + 7, by the outputs wanted). */
    kiln_status (*record)(void *ctx, int slot, kiln_status (*enqueue)(void *arg), void *arg);
    /* Times the steps of a decode at position pos0: runs step(arg) (one token's step, enqueued and synchronized, not
     * replayed) reps times with a mark after every step, and sums each kind of step (events between launches, so the
     * sum exceeds a replay's time by the launch gaps). ops holds KILN_PROFILE_OPS. NULL where the backend has none. */
    kiln_status (*profile)(void *ctx, int64_t pos0, int reps, kiln_status (*step)(void *arg), void *arg, kiln_op_time *ops,
                           int *n_ops);

    /* ---- the forward's steps. Pointers are backend memory. */
    /* x (T, C) = scale * rows ids[t] of the table. Ids are valid (sessions check them). */
    kiln_status (*embed)(void *ctx, float *x, const kiln_weight *table, const int32_t *ids, int64_t T, int64_t C, float scale);
    /* x (T, C) += y, or += rmsnorm(y, post_eps) * post_w when post_w (y may be NULL: nothing added); then
     * xb = rmsnorm(x, eps) * w, or xb = x when w is NULL (no pre-norm: olmo2). y is not needed afterwards (a
     * backend may overwrite it). */
    kiln_status (*residual_norm)(void *ctx, float *x, float *y, const kiln_weight *post_w, float post_eps, float *xb,
                                 const kiln_weight *w, float eps, int64_t T, int64_t C);
    /* q (T, NH*HS), k, v (T, NKV*HS) = x Wq^T, x Wk^T, x Wv^T. k follows q and v follows k in memory when T is 1. */
    kiln_status (*qkv)(void *ctx, float *q, float *k, float *v, const float *x, const kiln_weight *wq, const kiln_weight *wk,
                       const kiln_weight *wv, int64_t T);
    /* In order: the biases, the QK-norm of each head (or of the whole q and k: qk_norm_full), RoPE at positions *pos0 + t (not when nope), and k, v stored as
     * type_k, type_v into cache rows (p % rows). q is updated in place. */
    kiln_status (*qkv_post)(void *ctx, float *q, float *k, float *v, const kiln_attn_args *a, const int32_t *pos0, int64_t T);
    /* out (T, NH*HS): the query at position p = *pos0 + t sees the cached keys max(0, p - window + 1) .. p, with
     * the scores' scale and softcap. */
    kiln_status (*attention)(void *ctx, float *out, float *q, const kiln_attn_args *a, const int32_t *pos0, int64_t T);
    /* x (n) *= sigmoid(g (n)): the attention output gate. */
    kiln_status (*sigmoid_mul)(void *ctx, float *x, const float *g, int64_t n);
    /* y (T, W rows) = x W^T, or y += x W^T when add. */
    kiln_status (*matmul)(void *ctx, float *y, const float *x, const kiln_weight *W, int64_t T, bool add);
    /* gate (T, F) = act(x Wg^T) * (x Wu^T), act silu or tanh-GELU (geglu); up (T, F) is scratch. */
    kiln_status (*ffn_up)(void *ctx, float *gate, float *up, const float *x, const kiln_weight *wg, const kiln_weight *wu,
                          int64_t T, bool geglu);
    /* logits (T, V) = x W^T, then cap * tanh(scale * logits / cap), or scale * logits when cap is 0. */
    kiln_status (*head)(void *ctx, float *logits, const float *x, const kiln_weight *W, int64_t T, float scale, float cap);
    /* *next = the index of the largest of x (n), the lowest on ties. */
    kiln_status (*argmax)(void *ctx, int32_t *next, const float *x, int64_t n);
    /* *flag = code when x (n) holds a NaN or an infinity and *flag is still 0, so the first stage checked that made
     * one is the one reported (flag is backend memory, zeroed by the caller before the step). */
    kiln_status (*nonfinite)(void *ctx, int32_t *flag, const float *x, int64_t n, int32_t code);
    /* *next = the token the sampler's pipeline (sampler.c) draws from x (n) under args (backend memory, read when the
     * step runs, so a recorded step takes each replay's args); work holds sample_work_bytes(n): CUDA's sample.cu.
     * NULL (both) where a backend has none: on a host-memory backend (the CPU) the context then draws each row after
     * the forward (sampler.c's kiln_sample_args_draw); elsewhere the logits come back and the host samples. */
    kiln_status (*sample)(void *ctx, int32_t *next, const float *x, int64_t n, const kiln_sample_args *args, void *work);
    size_t (*sample_work_bytes)(int64_t n);
    /* x (T, C) += in W^T, then xb = rmsnorm(x, eps) * w: matmul with add and residual_norm without y as one step, for
     * a backend that fuses them (CUDA: in decode the matvec's last CTA norms); NULL: the forward runs the two. */
    kiln_status (*matmul_norm)(void *ctx, float *x, const float *in, const kiln_weight *W, float *xb, const kiln_weight *w,
                               float eps, int64_t T, int64_t C);
    /* A hint: a coming matmul reads W (with W2 beside it row by row, as ffn_up reads gate and up; W2 may be NULL).
     * A backend may start fetching them while the steps before it run (CUDA: the next decode matvec's last CTAs
     * prefetch them into L2, kiln_cuda_mv_tail's pf); it changes no result. NULL: the forward gives no hints. */
    kiln_status (*prefetch)(void *ctx, const kiln_weight *W, const kiln_weight *W2);
    /* qkv_post then attention (same arguments) as one step, for a backend that fuses them (CUDA: in decode the
     * attention kernel's blocks apply the biases and RoPE and store the row's k and v themselves); NULL: the forward
     * runs the two. q, k and v are scratch afterwards either way. */
    kiln_status (*qkv_attention)(void *ctx, float *out, float *q, float *k, float *v, const kiln_attn_args *a, const int32_t *pos0,
                                 int64_t T);
} kiln_backend;

extern const kiln_backend kiln_cpu_backend;
/* The CUDA backend; built without CUDA, its open fails with KILN_ERR_UNSUPPORTED saying so. */
extern const kiln_backend kiln_cuda_backend;

/* ---- the forward (llama.c) */

/* Floats of activations a batch of T tokens needs. */
size_t kiln_llama_act_floats(const kiln_llama_config *c, int64_t T);
/* What kiln_llama_forward checks for a NaN or an infinity, and the flag (backend memory, zeroed by the caller) where
 * the backend's nonfinite step writes the first stage that holds one: KILN_LLAMA_STAGE_EMBED, layer l as
 * KILN_LLAMA_STAGE_LAYER + l, then KILN_LLAMA_STAGE_LAYER + L for the head's logits; 0 when every check passed. */
typedef struct kiln_llama_checks {
    int32_t *flag;  /* NULL: no checks */
    bool logits;    /* the logits rows the forward writes (with next: the row argmax reads, on the device) */
    bool layers;    /* the embedding and every layer's output (the residual stream), for KILN_CHECK_FINITE */
} kiln_llama_checks;
enum { KILN_LLAMA_STAGE_EMBED = 1, KILN_LLAMA_STAGE_LAYER = 2 };

/* A run of consecutive rows of a batch that belong to one sequence: its cache, and the position of its first row in
 * backend memory (so a recorded step serves every position). Its rows are at positions *pos0 .. *pos0 + T - 1. */
typedef struct kiln_llama_segment {
    const kiln_llama_kv *kv; /* the sequence's cache; every segment of a batch has the same n_ctx (a context's) */
    const int32_t *pos0;     /* (1) backend memory */
    int64_t T;               /* rows */
} kiln_llama_segment;

/* A batch as the forward runs it: T rows of ids in segments, and the rows whose logits are wanted. */
typedef struct kiln_llama_batch {
    const int32_t *ids;            /* (T) backend memory, valid ids (the caller checks them) */
    int64_t T;
    const kiln_llama_segment *seg; /* (n_seg) host memory: rows 0..T-1 in order, each segment's rows consecutive */
    int64_t n_seg;
    /* Where the caches lie, for a backend with seq_rows (NULL: unknown, each segment runs alone): segment s's cache
     * is kv0's plus seq[s] * kv_stride bytes (seq: (n_seg) backend memory), and seg[s].pos0 is seg[0].pos0 + s. The
     * single-row segments that end the batch (a step's decode tokens) then run qkv_post and attention once. */
    const int32_t *seq;
    const kiln_llama_kv *kv0;
    size_t kv_stride;
    const int64_t *out;            /* (n_out) host memory: ascending rows of 0..T-1 whose logits are wanted */
    int64_t n_out;
    /* With next: each out row o's token drawn by the backend's sample under sample[o] (backend memory, n_out of them)
     * instead of its argmax; NULL: the argmax */
    const kiln_sample_args *sample;
    void *sample_work;             /* the backend's sample_work_bytes(V), which the rows' draws take in turn */
} kiln_llama_batch;

/* Enqueues batch b through the model: the matmuls, norms and FFN over all T rows at once (each weight read once),
 * qkv_post and attention per segment over its own cache, which gets the segment's k and v. With logits (backend
 * memory), the head's rows of b->out land there ((n_out, V), in b->out's order); with next (backend memory, (n_out)),
 * each of those rows' argmax (its draw with b->sample). act holds kiln_llama_act_floats(T). checks may be NULL. A
 * batch of one segment whose out rows are first..T-1 is the single-sequence forward, bit for bit. */
kiln_status kiln_llama_forward(const kiln_model *m, const kiln_backend *be, void *ctx, const kiln_weights *w, float *act,
                               const kiln_llama_batch *b, float *logits, int32_t *next, const kiln_llama_checks *checks);

/* ---- sessions (src/infer/session.c), for the benchmarks */

/* The backend's per-step profile of one decode at position pos0 (the step writes the cache row of pos0). */
kiln_status kiln_session_profile(kiln_session *s, int64_t pos0, int reps, kiln_op_time *ops, int *n_ops);

#ifdef __cplusplus
}
#endif

#endif
