/* context_impl.h: a context's state, shared by context.c (making one, its steps, sampling, the profile) and
 * context_seq.c (a sequence's cache: keep, copy, save, restore); and the small helpers both use. Not a public
 * header: kiln.h and context.h are the API. */
#ifndef KILN_INFER_CONTEXT_IMPL_H
#define KILN_INFER_CONTEXT_IMPL_H

#include "infer/context.h"

/* One sequence: its position, history and cache (in the context's kv buffer). */
typedef struct seq_state {
    int64_t pos;       /* next position */
    int32_t *hist;     /* (n_ctx) the ids at positions 0..pos-1 */
    void **k, **v;     /* (L) layer l's k and v rows, (rows[l], NKV*HS) of type_k and type_v */
    kiln_llama_kv kv;  /* k, v, the context's rows and n_ctx, as the forward takes them */
} seq_state;

struct kiln_context {
    const kiln_model *m;
    const kiln_backend *be;
    void *ctx;           /* the backend's context */
    kiln_weights w;      /* bound by the backend, owned by ctx */
    const char *who;     /* the messages' first word: "session" or "context" */
    int32_t n_seq;
    int64_t n_ctx;       /* positions of each sequence */
    int64_t n_batch;     /* entries per forward call */
    kiln_kv_type type_k, type_v;
    uint64_t fingerprint; /* the model's (model_fingerprint), for the sequence files */
    int64_t n_evaluated; /* tokens run through the forward since the context began */
    bool check_layers;   /* check_finite: the embedding and every layer's output are checked too */
    int64_t *rows;       /* (L) n_ctx for a full layer, min(n_ctx, window + n_batch - 1) for a sliding one */
    size_t seq_kv_bytes; /* one sequence's cache: every layer's k then v */
    seq_state *seq;      /* (n_seq) */
    /* backend memory */
    uint8_t *kv;         /* (n_seq, seq_kv_bytes) */
    float *act;          /* kiln_llama_act_floats(n_batch) */
    int32_t *d_io;       /* ids (n_batch) | argmaxes (n_batch) | the non-finite flag (1) | segment positions (n_batch) |
                          * segment sequences (n_batch) */
    float *d_logits;     /* (n_batch, V) on a device; (V) where backend memory is host memory */
    /* host memory the backend copies from and to: the same layout as d_io, then (V) logits */
    int32_t *h_io;
    float *h_logits;
    /* host scratch of a step, (n_batch) each */
    kiln_llama_segment *segs;
    int32_t *seg_seq;    /* each segment's sequence */
    int64_t *out;        /* the rows whose logits are wanted (the batch's) */
    int64_t *perm;       /* decode: row r runs entry perm[r] */
    int64_t *dest;       /* decode: out row o goes to row dest[o] of the caller's logits */
    int64_t *inv;        /* decode: dest's inverse */
    bool *done;          /* decode: the rows permute_rows has placed */
    int64_t *cnt;        /* (n_seq) decode: each sequence's entries */
    int64_t *start;      /* (n_seq) decode: each sequence's first row */
    /* a sampled step (kiln_context_eval_seq_sampled, kiln_context_decode_sample; made at the first): one args per out
     * row, n_batch of them. A backend with its own sample step draws there; on a host-memory backend without one
     * (the CPU) the step draws each row after the forward, on the host (kiln_sample_args_draw) */
    kiln_sample_args *h_sargs; /* host memory the step's upload reads, in the rows' order */
    kiln_sample_args *d_sargs; /* backend memory (a backend with a sample step) */
    void *d_swork;             /* the backend's sample_work_bytes(V) */
    void *h_swork;             /* kiln_sample_args_work_bytes(V) (the host's draws) */
    kiln_sample_args *k_sargs; /* (n_batch) kiln_context_decode_sample's, in the caller's order of wanted rows */
    bool sample_pending;       /* the next step's next is a draw under h_sargs */
    /* the step being enqueued (step_enqueue's arguments) */
    kiln_llama_batch b;
    float *fwd_logits;   /* where the forward writes the logits: d_logits, or a host buffer on host memory */
    bool want_logits, want_next, want_sample, staged;
};

/* Bytes of one cached row of n elements of type t (0 where a block type does not fit n). */
static inline size_t kv_row_bytes(kiln_kv_type t, int64_t n) { return kiln_kv_row_bytes(t, n); }

/* The bytes of a cached k row and v row of context c (types type_k, type_v; NKV*HS elements). */
static inline void kv_rows(const kiln_context *c, size_t *k, size_t *v) {
    const int64_t KV = c->m->cfg.n_head_kv * c->m->cfg.head_dim;
    *k = kv_row_bytes(c->type_k, KV), *v = kv_row_bytes(c->type_v, KV);
}

/* A cache type's name, "(unknown)" for an id kiln does not know (a file's field). */
static inline const char *kv_name(uint32_t t) {
    const char *n = t < KILN_KV_TYPE_COUNT ? kiln_kv_type_name((kiln_kv_type)t) : NULL;
    return n ? n : "(unknown)";
}

/* FNV-1a, 64 bits. */
static inline uint64_t fnv(uint64_t h, const void *p, size_t n) {
    for (size_t i = 0; i < n; i++) h = (h ^ ((const uint8_t *)p)[i]) * 0x100000001b3ull;
    return h;
}

/* Whether seq names one of the context's sequences. */
static inline bool seq_ok(const kiln_context *c, int32_t seq) { return seq >= 0 && seq < c->n_seq; }

#endif
