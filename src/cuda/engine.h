/* engine.h: the CUDA engine's state, shared by engine.cu (the seam's steps), engine_prefetch.cu (the L2 prefetch
 * hints of the decode matvecs) and engine_measure.cu (the per-step profile and the copy-bandwidth measurement).
 * Private to src/cuda. */
#ifndef KILN_CUDA_ENGINE_H
#define KILN_CUDA_ENGINE_H

#include "cuda/kernels.h"
#include "model/backend.h"
#include "status.h"

#include <cuda_runtime.h>

#define CK(call, what)                                                                                           \
    do {                                                                                                         \
        cudaError_t e_ = (call);                                                                                 \
        if (e_ != cudaSuccess) return kiln_fail(KILN_ERR_IO, "CUDA %s failed: %s", what, cudaGetErrorString(e_)); \
    } while (0)

/* The per-step breakdown of one decode step (profile). */
enum { P_EMBED, P_NORM, P_QKV, P_QKV_POST, P_ATTN, P_WO, P_FFN_UP, P_DOWN, P_HEAD, P_OTHER, P_COUNT };
#define PROF_MAX 8192
enum { TAIL_PREPARE = 1, TAIL_NORM = 2 };
enum { PRE_NORM = 1, PRE_QUANT = 2 };
typedef struct {
    int n;
    int cat[PROF_MAX];
    cudaEvent_t ev[PROF_MAX + 1];
} prof_marks;

/* A matmul weight on the device: the file's blocks, and for prefill a bf16 copy when the memory allows. */
typedef struct dev_wt {
    kiln_cuda_wt q;  /* the GGUF block format, read by the decode matvecs */
    kiln_cuda_wt bf; /* BF16 copy the tensor cores read in place (data NULL: gemm dequantizes per call) */
    int cat;         /* the profile's step kind */
    /* wq only: how many of wq, wk, wv lie back to back as one matrix of Q + KV (+ KV) rows (3: all, 2: wq and wk,
     * as Q4_K_M's Q6_K v differs; 0: none), and that matrix. A single token's q, k, v in one launch instead of three */
    int n_merged;
    kiln_cuda_wt qkv;
} dev_wt;

/* One layer's weights on the device, by kiln_layer_tensor: matrices in w, vectors (f32) in vec. */
typedef struct {
    dev_wt w[KILN_LT_COUNT];
    const float *vec[KILN_LT_COUNT];
} dev_layer;

typedef struct engine {
    const kiln_model *m;
    int device;     /* the CUDA device: made current by every entry the session calls between steps */
    int64_t n_ctx, n_batch;
    size_t kv_pos_bytes; /* a position's k and v row in the cache types qkv_post last stored (the profile's bytes) */
    cudaStream_t stream;
    void *wbuf; /* every weight and norm vector, one allocation */
    dev_layer *layers; /* (L) */
    dev_wt tok_embd, output;
    const float *output_norm; /* (C) */
    kiln_weight (*bound)[KILN_LT_COUNT]; /* (L) the seam's view of layers */
    void *bfbuf;   /* the bf16 prefill copies, one allocation (NULL when they did not fit) */
    void *wsbuf;   /* xp, xp_next, the tails' counters and the attention's workspace, one allocation */
    void *xp;      /* matvec-prepared activations */
    void *xp_next; /* where a matvec's tail prepares the next matvec's input while the matvec reads xp (then swapped) */
    unsigned *mv_cnt; /* the tails' counters (kiln_cuda_mv_tail), zero between launches */
    bool fuse_post; /* qkv_attention runs qkv_post inside the decode attention where it can (KILN_ATTN_POST=0: never) */
    bool pair;      /* a token's merged q|k and its v of another type in one launch (kiln_cuda_matvec_pair; KILN_MV_PAIR=0:
                     * two launches) */
    /* Timing experiments only (KILN_BENCH_OMIT=norm,qkv,attn,wo,ffn,down,head,prep): decode steps (T <= 8) leave
     * these steps out, so the step's time without them gives their share of the captured graph. The tokens are
     * then wrong. Bit P_* for a step kind, bit P_COUNT for the matvec input's prepare. */
    unsigned omit;
    int tails;     /* the matvecs' tails in decode: TAIL_PREPARE (the GLU prepares down's input), TAIL_NORM (wo and
                    * down norm the residual). Off unless KILN_MV_TAIL=all, prep or norm: measured slower (docs/cuda.md) */
    /* The matvec prologue (kiln_cuda_mv_tail's pre_x) in decode: a one-token matvec of at most pre_cols columns makes
     * its prepared x itself, normed (PRE_NORM: the residual norm before it, deferred in pend until the matvec that
     * reads its output) or not (PRE_QUANT: instead of the prepare). KILN_MV_PRE=0|norm|quant|all, KILN_MV_PRE_COLS. */
    int pre_kinds;
    int64_t pre_cols;
    struct {
        bool on;
        float *x, *xb;
        const float *w;
        float eps;
        int64_t C;
    } pend;
    void *attn_ws;
    kiln_cuda_gemm_ws gws;
    size_t dev_bytes;
    /* which activation xp holds the prepared form of (NULL: none), for T rows of cols */
    const float *xp_of;
    int64_t xp_T, xp_cols;
    int64_t decode_rows;      /* the most rows of many sequences one attention launch takes (its workspace's) */
    int64_t gemm_small_max;   /* 9..32 rows take kiln_cuda_gemm_small where it takes the type and the weight has at most
                               * this many elements (GEMM_SMALL_MAX_ELEMS; KILN_GEMM_SMALL=0: none, =all: any) */
    /* L2 prefetch (kiln_cuda_mv_tail's pf): the forward's hints since the last decode matvec (a weight, and the one
     * read beside it or NULL), which that matvec's last CTAs fetch, up to pf_budget bytes; and how far this step has
     * fetched each weight (reset by embed, the step's first op), so a later hint of the same weight goes on from there */
    size_t pf_budget; /* KILN_PREFETCH_MB, 0: off */
    int64_t mv_rows;  /* steps of more rows than this (up to 8) take gemm_small where it takes the weight, the matvecs
                       * otherwise: KILN_MATVEC_ROWS, MV_ROWS_DEFAULT by default */
    const kiln_cuda_wt *hint[8][2];
    int n_hint;
    struct {
        const void *p;
        size_t done;
    } pf_seen[16];
    int n_seen;
    cudaGraphExec_t *graph;   /* (n_graph) record's slots: 8 for each decode batch size, 0..decode_rows */
    int n_graph;
    prof_marks *prof;         /* non-NULL while profiling */
} engine;

/* The pending prefetch hints into a decode matvec's spans (engine_prefetch.cu); a matmul that is not a matvec drops
 * them. */
void engine_pf_spans(engine *e, kiln_cuda_mv_tail *t);
static inline void engine_pf_drop(engine *e) { e->n_hint = 0; }
/* The seam's prefetch step: a hint for the next decode matvec (engine_prefetch.cu). */
kiln_status engine_prefetch(void *p, const kiln_weight *W, const kiln_weight *W2);
/* The seam's profile step: one decode step's time and bytes by step kind (engine_measure.cu). */
kiln_status engine_profile(void *p, int64_t pos0, int reps, kiln_status (*step)(void *arg), void *arg, kiln_op_time *ops,
                           int *n_ops);

#endif
