/* engine.cu: a model running on the GPU. The engine uploads the weights once in the file's own block formats,
 * owns the f16 KV cache with the same row layout as the CPU session (position p in row p % rows[l]: sliding layers
 * keep a ring) and one chunk's activations, and runs the forward of src/model/llama.c with the kernels of
 * kernels.h, fused where a kernel boundary costs more than it buys:
 *   - the residual add is folded into the wo and down projections (matvec/gemm with add); the residual step, the
 *     sandwich post-norm and the next RMSNorm are one kernel, which in decode also writes the next matvecs' int8
 *     input (residual_norm_xp), as the attention does for wo (attention_xp);
 *   - a single token's q, k and v come from one matvec over wq, wk, wv uploaded back to back when they share a type
 *     (q and k alone when v differs, as in Q4_K_M);
 *   - bias, QK-norm, RoPE, the q scale and the f16 cache store are one kernel (qkv_post);
 *   - gate and up are one pass over both weights with the GLU applied (matvec_glu) in decode.
 * Decode (T <= 8 tokens) uses the memory-bound matvec kernels; a larger chunk multiplies on tensor cores (gemm.cu)
 * reading bf16 copies of the weights, made once here when they fit in the free memory with 1 GiB to spare, else
 * dequantized per call. The single-token step is captured once as a CUDA graph (its kernels launched with
 * programmatic dependent launch, launch.h) and replayed for every token: the token id and position are copied
 * from pinned host memory by the graph's first nodes and every kernel reads the position from device memory, so
 * one graph serves every position. Greedy decode reads back the 4-byte argmax instead of the logits.
 *
 * The engine's forward is its own rather than llama.c driving an ops table of device pointers: a captured graph
 * needs positions in device memory and the fusions above change the op boundaries. It reads the same config flags
 * (model.h) and tests/test_cuda_engine.c checks it against the CPU forward, logits and greedy tokens, on every
 * architecture fixture. docs/cuda.md has the measurements. */
#include "cuda/cuda.h"
#include "cuda/kernels.h"
#include "model/model.h"
#include "quants.h"

#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "status.h"

#define CK(call, what)                                                                                           \
    do {                                                                                                         \
        cudaError_t e_ = (call);                                                                                 \
        if (e_ != cudaSuccess) return kiln_fail(KILN_ERR_IO, "CUDA %s failed: %s", what, cudaGetErrorString(e_)); \
    } while (0)

/* A matmul weight on the device: the file's blocks, and for prefill a bf16 copy when the memory allows. */
typedef struct {
    kiln_cuda_wt q;  /* the GGUF block format, read by the decode matvecs */
    kiln_cuda_wt bf; /* BF16 copy the tensor cores read in place (data NULL: gemm dequantizes per call) */
} dev_wt;

/* One layer's weights on the device. */
typedef struct {
    dev_wt wq, wk, wv, wo, w_gate, w_up, w_down, w_attn_gate;
    int n_merged;      /* 3: wqkv is wq, wk, wv; 2: wq, wk (wv has another type, as Q4_K_M's Q6_K v); 0: none */
    dev_wt wqkv;       /* wq, wk (and wv) as one matrix of Q + KV (+ KV) rows when they share a type (back to back);
                        * data NULL otherwise. A single token's q, k, v in one launch instead of three */
    const float *attn_norm, *ffn_norm;           /* (C) */
    const float *bq, *bk, *bv;                   /* (Q), (KV), (KV) or NULL */
    const float *q_norm, *k_norm;                /* (HS) or NULL */
    const float *post_attn_norm, *post_ffn_norm; /* (C) or NULL */
} dev_layer;

/* The per-op breakdown of one decode step (kiln_cuda_engine_profile). */
enum { P_EMBED, P_NORM, P_QKV, P_QKV_POST, P_ATTN, P_WO, P_FFN_UP, P_DOWN, P_HEAD, P_OTHER, P_COUNT };
static const char *const prof_names[P_COUNT] = {"embed", "norm+residual", "matvec qkv", "bias/qknorm/rope/kv store",
                                                "attention", "matvec wo (+add)", "matvec gate/up + glu",
                                                "matvec down (+add)", "head + argmax", "other"};
#define PROF_MAX 8192
typedef struct {
    int n;
    int cat[PROF_MAX];
    cudaEvent_t ev[PROF_MAX + 1];
} prof_marks;

struct kiln_cuda_engine {
    const kiln_model *m;
    int64_t n_ctx, n_batch;
    cudaStream_t stream;
    void *wbuf; /* every weight and norm vector, one allocation */
    size_t wbytes;
    dev_layer *layers; /* (L) */
    kiln_cuda_wt tok_embd;
    dev_wt output;
    void *bfbuf; /* the bf16 prefill copies, one allocation (NULL when they did not fit) */
    const float *output_norm; /* (C) */
    uint16_t *kv;             /* every layer's k then v cache, f16 */
    uint16_t **k, **v;        /* (L) */
    int64_t *rows;            /* (L) */
    void *abuf;               /* activations, one allocation */
    float *x, *xb, *q, *kk, *vv, *att, *gate, *up, *ag, *logits; /* (n_batch, width) each; logits (n_batch, V) */
    float *qkv1;              /* (Q + 2 KV): one token's q, k, v from the merged matvec */
    void *xp;                 /* matvec-prepared activations */
    void *attn_ws;
    int32_t *d_ids, *d_pos0, *d_next; /* (n_batch), (1), (1) */
    int32_t *h_ids, *h_pos0, *h_next; /* pinned: what the graph's copy nodes read and write */
    float *h_logits;                  /* pinned (V) */
    kiln_cuda_gemm_ws gws;
    size_t dev_bytes;
    cudaGraphExec_t graph[2]; /* single-token step: [0] returns the argmax, [1] the logits too */
    prof_marks *prof;         /* non-NULL while profiling */
};

/* ---------------------------------------------------------------- sizing and upload */

static bool type_supported(kiln_type t) {
    switch (t) {
    case KILN_TYPE_F32: case KILN_TYPE_F16: case KILN_TYPE_BF16: case KILN_TYPE_Q4_0: case KILN_TYPE_Q4_1:
    case KILN_TYPE_Q5_0: case KILN_TYPE_Q8_0: case KILN_TYPE_Q4_K: case KILN_TYPE_Q5_K: case KILN_TYPE_Q6_K: return true;
    default: return false;
    }
}

static size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

/* Calls f(view) for every tensor the engine uploads, in one fixed order. */
#define FOR_EACH_LAYER_TENSOR(L, X) \
    X(L->attn_norm) X(L->wq) X(L->wk) X(L->wv) X(L->wo) X(L->ffn_norm) X(L->w_gate) X(L->w_up) X(L->w_down) \
    X(L->bq) X(L->bk) X(L->bv) X(L->q_norm) X(L->k_norm) X(L->w_attn_gate) X(L->post_attn_norm) X(L->post_ffn_norm)

/* How many of wq, wk, wv go back to back as one matrix: those that share wq's type and row length, in order, with
 * every one before the last ending on 16 bytes. 3, 2 (q and k) or 0. */
static int qkv_mergeable(const kiln_llama_layer *L) {
    if (L->wq->type != L->wk->type || L->wq->ne[0] != L->wk->ne[0] || L->wq->nbytes % 16) return 0;
    return L->wq->type == L->wv->type && L->wq->ne[0] == L->wv->ne[0] && L->wk->nbytes % 16 == 0 ? 3 : 2;
}

static size_t weight_bytes(const kiln_model *m) {
    size_t n = 0;
#define ADD(t) if (t) n += align256((t)->nbytes);
    for (int64_t l = 0; l < m->cfg.n_layer; l++) {
        const kiln_llama_layer *L = &m->layers[l];
        FOR_EACH_LAYER_TENSOR(L, ADD)
    }
    ADD(m->tok_embd) ADD(m->output_norm)
    if (m->output != m->tok_embd) ADD(m->output)
#undef ADD
    return n;
}

/* Copies view t into the weight buffer at *off and returns its device address; the next tensor starts on 256
 * bytes, or right after this one when packed (wq, wk, wv of a merged qkv). */
static const void *upload_at(kiln_cuda_engine *e, const kiln_tensor_view *t, size_t *off, bool packed, kiln_status *st) {
    if (!t || *st) return NULL;
    char *dst = (char *)e->wbuf + *off;
    cudaError_t err = cudaMemcpy(dst, t->data, t->nbytes, cudaMemcpyHostToDevice);
    if (err != cudaSuccess) {
        *st = kiln_fail(KILN_ERR_IO, "CUDA upload of %s failed: %s", t->name, cudaGetErrorString(err));
        return NULL;
    }
    *off += packed ? t->nbytes : align256(t->nbytes);
    return dst;
}

static const void *upload(kiln_cuda_engine *e, const kiln_tensor_view *t, size_t *off, kiln_status *st) {
    return upload_at(e, t, off, false, st);
}

static kiln_cuda_wt wt_of(const kiln_tensor_view *t, const void *d) {
    kiln_cuda_wt w = {};
    if (!t) return w;
    w.type = t->type;
    w.cols = t->ne[0];
    w.rows = t->ne[1];
    w.row_bytes = t->nb[1];
    w.data = d;
    return w;
}

/* Activation floats of a chunk of T rows: x, xb (C); q, att, ag (Q); k, v (KV); gate (F); up max(F, C). */
static size_t act_floats(const kiln_llama_config *c, int64_t T) {
    const int64_t Q = c->n_head * c->head_dim, KV = c->n_head_kv * c->head_dim;
    const int64_t upw = c->n_ff > c->n_embd ? c->n_ff : c->n_embd;
    return (size_t)T * (size_t)(2 * c->n_embd + 2 * Q + 2 * KV + c->n_ff + upw + (c->output_gate ? Q : 0));
}

/* W's bf16 prefill copy at *off of the copies' buffer, dequantized on the GPU from the uploaded blocks. */
static kiln_status bf16_copy(kiln_cuda_engine *e, dev_wt *W, size_t *off) {
    if (!W->q.data || W->q.type == KILN_TYPE_BF16) return KILN_OK; /* absent, or already what the tensor cores read */
    W->bf = W->q;
    W->bf.type = KILN_TYPE_BF16;
    W->bf.row_bytes = (size_t)W->q.cols * 2;
    W->bf.data = (char *)e->bfbuf + *off;
    *off += align256((size_t)(W->q.rows * W->q.cols) * 2);
    return kiln_cuda_dequantize_bf16(&W->q, (void *)W->bf.data, e->stream);
}

/* Every matmul weight's bf16 copy (bytes in all, as counted before allocating): milliseconds of dequantization. */
static kiln_status make_bf16_copies(kiln_cuda_engine *e, size_t bytes) {
    cudaError_t err = cudaMalloc(&e->bfbuf, bytes);
    if (err != cudaSuccess) {
        e->bfbuf = NULL;
        return kiln_fail(KILN_ERR_NOMEM, "gpu: allocating %.2f GiB for the bf16 prefill weights failed: %s", bytes / 1073741824.0,
                         cudaGetErrorString(err));
    }
    size_t off = 0;
    kiln_status st = KILN_OK;
    for (int64_t l = 0; l < e->m->cfg.n_layer && !st; l++) {
        dev_layer *D = &e->layers[l];
        dev_wt *ws[8] = {&D->wq, &D->wk, &D->wv, &D->wo, &D->w_gate, &D->w_up, &D->w_down, &D->w_attn_gate};
        for (int i = 0; i < 8 && !st; i++) st = bf16_copy(e, ws[i], &off);
    }
    return st ? st : bf16_copy(e, &e->output, &off);
}

extern "C" void kiln_cuda_engine_free(kiln_cuda_engine *e) {
    if (!e) return;
    for (int i = 0; i < 2; i++)
        if (e->graph[i]) cudaGraphExecDestroy(e->graph[i]);
    kiln_cuda_gemm_ws_free(&e->gws);
    cudaFree(e->wbuf);
    cudaFree(e->bfbuf);
    cudaFree(e->kv);
    cudaFree(e->abuf);
    cudaFreeHost(e->h_ids);
    if (e->stream) cudaStreamDestroy(e->stream);
    free(e->layers);
    free(e->k);
    free(e->v);
    free(e->rows);
    free(e);
}

extern "C" kiln_status kiln_cuda_engine_new(const kiln_model *m, int64_t n_ctx, int64_t n_batch, const int64_t *rows,
                                            kiln_cuda_engine **out) {
    *out = NULL;
    TRY(kiln_cuda_check_device());
    const kiln_llama_config *c = &m->cfg;
    const int64_t C = c->n_embd, NH = c->n_head, NKV = c->n_head_kv, HS = c->head_dim, F = c->n_ff, V = c->n_vocab;
    const int64_t Q = NH * HS, KV = NKV * HS, W = kiln_llama_max_width(c);
    if (kiln_cuda_device_count() == 0) return kiln_fail(KILN_ERR_UNSUPPORTED, "gpu: no CUDA device (or kiln was built without CUDA)");

    /* every type and shape is checked, and the memory counted, before anything is allocated */
    size_t max_w = (size_t)(m->output->ne[0] * m->output->ne[1]);
    for (int64_t l = 0; l < c->n_layer; l++) {
        const kiln_llama_layer *L = &m->layers[l];
        const kiln_tensor_view *mats[8] = {L->wq, L->wk, L->wv, L->wo, L->w_gate, L->w_up, L->w_down, L->w_attn_gate};
        for (int i = 0; i < 8; i++) {
            if (!mats[i]) continue;
            if (!type_supported(mats[i]->type))
                return kiln_fail(KILN_ERR_UNSUPPORTED, "gpu: tensor %s has type %s, which the CUDA backend does not compute", mats[i]->name,
                                 kiln_type_name(mats[i]->type));
            size_t n = (size_t)(mats[i]->ne[0] * mats[i]->ne[1]);
            if (n > max_w) max_w = n;
        }
        if (HS % 8 || HS > 256)
            return kiln_fail(KILN_ERR_UNSUPPORTED, "gpu: head size %lld is not supported (a multiple of 8 up to 256)", (long long)HS);
    }
    if (!type_supported(m->tok_embd->type) || !type_supported(m->output->type))
        return kiln_fail(KILN_ERR_UNSUPPORTED, "gpu: the embedding or output type (%s, %s) is not supported", kiln_type_name(m->tok_embd->type),
                         kiln_type_name(m->output->type));
    size_t kv_rows = 0;
    for (int64_t l = 0; l < c->n_layer; l++) kv_rows += (size_t)rows[l];
    const size_t wbytes = weight_bytes(m), kv_bytes = align256(kv_rows * 2 * (size_t)KV * 2);
    const size_t xp_bytes = align256(kiln_cuda_matvec_prep_bytes(KILN_CUDA_MATVEC_MAX_T, W));
    const size_t attn_ws = align256(kiln_cuda_attention_ws_bytes(n_batch, NH, HS, n_ctx));
    const size_t qkv1_bytes = align256((size_t)(Q + 2 * KV) * 4);
    const size_t act_bytes = align256(act_floats(c, n_batch) * 4) + align256((size_t)(n_batch * V) * 4) + xp_bytes + attn_ws +
                             qkv1_bytes + align256((size_t)(n_batch + 2) * 4);
    const size_t gws_bytes = kiln_cuda_gemm_ws_bytes(max_w, (size_t)(n_batch * W));
    const size_t need = wbytes + kv_bytes + act_bytes + gws_bytes;
    size_t free_b = 0, total_b = 0;
    CK(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
    const size_t margin = (size_t)256 << 20; /* the CUDA context's own allocations and cuBLAS */
    /* bf16 copies of the matmul weights let prefill skip dequantizing every weight in every chunk (about a third of a
     * 7B pp512's time); they are kept when they fit with 1 GiB to spare, and otherwise gemm dequantizes per call */
    size_t bf_bytes = 0;
    for (int64_t l = 0; l < c->n_layer; l++) {
        const kiln_llama_layer *L = &m->layers[l];
        const kiln_tensor_view *mats[8] = {L->wq, L->wk, L->wv, L->wo, L->w_gate, L->w_up, L->w_down, L->w_attn_gate};
        for (int i = 0; i < 8; i++)
            if (mats[i] && mats[i]->type != KILN_TYPE_BF16) bf_bytes += align256((size_t)(mats[i]->ne[0] * mats[i]->ne[1]) * 2);
    }
    if (m->output->type != KILN_TYPE_BF16) bf_bytes += align256((size_t)(m->output->ne[0] * m->output->ne[1]) * 2);
    const bool keep_bf = need + bf_bytes + ((size_t)1 << 30) <= free_b;
    if (need + margin > free_b)
        return kiln_fail(KILN_ERR_NOMEM,
                         "gpu: the model needs %.2f GiB of GPU memory (weights %.2f, KV cache of %lld positions %.2f, scratch %.2f) but %.2f GiB of %.2f is free",
                         need / 1073741824.0, wbytes / 1073741824.0, (long long)n_ctx, kv_bytes / 1073741824.0,
                         (act_bytes + gws_bytes) / 1073741824.0, free_b / 1073741824.0, total_b / 1073741824.0);

    kiln_cuda_engine *e = (kiln_cuda_engine *)calloc(1, sizeof *e);
    if (!e) return kiln_fail(KILN_ERR_NOMEM, "gpu: out of memory");
    e->m = m;
    e->n_ctx = n_ctx;
    e->n_batch = n_batch;
    e->dev_bytes = need + (keep_bf ? bf_bytes : 0);
    kiln_status st = KILN_OK;
    e->layers = (dev_layer *)calloc((size_t)c->n_layer, sizeof *e->layers);
    e->k = (uint16_t **)calloc((size_t)c->n_layer, sizeof *e->k);
    e->v = (uint16_t **)calloc((size_t)c->n_layer, sizeof *e->v);
    e->rows = (int64_t *)calloc((size_t)c->n_layer, sizeof *e->rows);
    if (!e->layers || !e->k || !e->v || !e->rows) {
        kiln_cuda_engine_free(e);
        return kiln_fail(KILN_ERR_NOMEM, "gpu: out of memory");
    }
    cudaError_t err;
    if ((err = cudaStreamCreateWithFlags(&e->stream, cudaStreamNonBlocking)) != cudaSuccess ||
        (err = cudaMalloc(&e->wbuf, wbytes)) != cudaSuccess || (err = cudaMalloc((void **)&e->kv, kv_bytes)) != cudaSuccess ||
        (err = cudaMalloc(&e->abuf, act_bytes)) != cudaSuccess ||
        (err = cudaMallocHost((void **)&e->h_ids, (size_t)(n_batch + 2) * 4 + (size_t)V * 4)) != cudaSuccess) {
        kiln_cuda_engine_free(e);
        return kiln_fail(KILN_ERR_NOMEM, "gpu: allocating %.2f GiB failed: %s", need / 1073741824.0, cudaGetErrorString(err));
    }
    if ((st = kiln_cuda_gemm_ws_new(&e->gws, max_w, (size_t)(n_batch * W))) != KILN_OK) {
        kiln_cuda_engine_free(e);
        return st;
    }
    e->h_pos0 = e->h_ids + n_batch;
    e->h_next = e->h_pos0 + 1;
    e->h_logits = (float *)(e->h_next + 1);

    /* weights, in FOR_EACH_LAYER_TENSOR's order */
    size_t off = 0;
    for (int64_t l = 0; l < c->n_layer && !st; l++) {
        const kiln_llama_layer *L = &m->layers[l];
        dev_layer *D = &e->layers[l];
        D->attn_norm = (const float *)upload(e, L->attn_norm, &off, &st);
        const int merge = qkv_mergeable(L);
        D->wq.q = wt_of(L->wq, upload_at(e, L->wq, &off, merge > 0, &st));
        D->wk.q = wt_of(L->wk, upload_at(e, L->wk, &off, merge == 3, &st));
        D->wv.q = wt_of(L->wv, upload(e, L->wv, &off, &st));
        D->n_merged = merge;
        if (merge) {
            D->wqkv.q = D->wq.q;
            D->wqkv.q.rows = L->wq->ne[1] + L->wk->ne[1] + (merge == 3 ? L->wv->ne[1] : 0);
        }
        D->wo.q = wt_of(L->wo, upload(e, L->wo, &off, &st));
        D->ffn_norm = (const float *)upload(e, L->ffn_norm, &off, &st);
        D->w_gate.q = wt_of(L->w_gate, upload(e, L->w_gate, &off, &st));
        D->w_up.q = wt_of(L->w_up, upload(e, L->w_up, &off, &st));
        D->w_down.q = wt_of(L->w_down, upload(e, L->w_down, &off, &st));
        D->bq = (const float *)upload(e, L->bq, &off, &st);
        D->bk = (const float *)upload(e, L->bk, &off, &st);
        D->bv = (const float *)upload(e, L->bv, &off, &st);
        D->q_norm = (const float *)upload(e, L->q_norm, &off, &st);
        D->k_norm = (const float *)upload(e, L->k_norm, &off, &st);
        D->w_attn_gate.q = wt_of(L->w_attn_gate, upload(e, L->w_attn_gate, &off, &st));
        D->post_attn_norm = (const float *)upload(e, L->post_attn_norm, &off, &st);
        D->post_ffn_norm = (const float *)upload(e, L->post_ffn_norm, &off, &st);
    }
    e->tok_embd = wt_of(m->tok_embd, upload(e, m->tok_embd, &off, &st));
    e->output_norm = (const float *)upload(e, m->output_norm, &off, &st);
    e->output.q = m->output == m->tok_embd ? e->tok_embd : wt_of(m->output, upload(e, m->output, &off, &st));
    if (!st && keep_bf) st = make_bf16_copies(e, bf_bytes);
    if (st) {
        kiln_cuda_engine_free(e);
        return st;
    }

    /* the cache: layer l's k then v, rows[l] x KV halves each; zeroed so no row is ever uninitialized */
    uint16_t *next = e->kv;
    for (int64_t l = 0; l < c->n_layer; l++) {
        e->rows[l] = rows[l];
        e->k[l] = next;
        e->v[l] = next + (size_t)rows[l] * (size_t)KV;
        next += 2 * (size_t)rows[l] * (size_t)KV;
    }
    cudaMemsetAsync(e->kv, 0, kv_bytes, e->stream);

    /* activations */
    float *a = (float *)e->abuf;
    const int64_t upw = F > C ? F : C;
    e->x = a, a += n_batch * C;
    e->xb = a, a += n_batch * C;
    e->q = a, a += n_batch * Q;
    e->kk = a, a += n_batch * KV;
    e->vv = a, a += n_batch * KV;
    e->att = a, a += n_batch * Q;
    e->gate = a, a += n_batch * F;
    e->up = a, a += n_batch * upw;
    if (c->output_gate) e->ag = a, a += n_batch * Q;
    char *b = (char *)e->abuf + align256(act_floats(c, n_batch) * 4);
    e->logits = (float *)b, b += align256((size_t)(n_batch * V) * 4);
    e->xp = b, b += xp_bytes;
    e->attn_ws = b, b += attn_ws;
    e->qkv1 = (float *)b, b += qkv1_bytes;
    e->d_ids = (int32_t *)b;
    e->d_pos0 = e->d_ids + n_batch;
    e->d_next = e->d_pos0 + 1;
    cudaMemsetAsync(e->attn_ws, 0, attn_ws, e->stream); /* the decode kernel's split counters start at zero */
    if ((err = cudaGetLastError()) != cudaSuccess || (err = cudaStreamSynchronize(e->stream)) != cudaSuccess) {
        kiln_cuda_engine_free(e);
        return kiln_fail(KILN_ERR_IO, "CUDA cache clear failed: %s", cudaGetErrorString(err));
    }
    *out = e;
    return KILN_OK;
}

extern "C" size_t kiln_cuda_engine_bytes(const kiln_cuda_engine *e) { return e->dev_bytes; }

/* ---------------------------------------------------------------- the forward */

static kiln_status mark(kiln_cuda_engine *e, int cat, kiln_status st) {
    if (st || !e->prof || e->prof->n >= PROF_MAX) return st;
    e->prof->cat[e->prof->n] = cat;
    cudaEventRecord(e->prof->ev[++e->prof->n], e->stream);
    return KILN_OK;
}

/* y (T, W.rows) (+)= x W^T: matvec on the prepared xp for a decode-sized T, else tensor cores (on the bf16 copy
 * when there is one). */
static kiln_status matmul(kiln_cuda_engine *e, float *y, const float *x, const dev_wt *W, int64_t T, bool add) {
    if (T <= KILN_CUDA_MATVEC_MAX_T) return kiln_cuda_matvec(y, x, e->xp, &W->q, T, add, e->stream);
    return kiln_cuda_gemm(y, x, W->bf.data ? &W->bf : &W->q, T, add, &e->gws, e->stream);
}

/* xp <- x's prepared form for the matvecs, unless the kernel that wrote x already wrote it (prepared). */
static kiln_status prepare(kiln_cuda_engine *e, const float *x, int64_t T, int64_t cols, bool prepared) {
    if (T > KILN_CUDA_MATVEC_MAX_T || prepared) return KILN_OK;
    return kiln_cuda_matvec_prepare(e->xp, x, T, cols, e->stream);
}

/* The residual step: x += y (post-normed with post_w when given), xb = rmsnorm(x) * w, and in decode xb's
 * prepared form in the same kernel. Returns whether xp now holds xb. */
static kiln_status residual_norm(kiln_cuda_engine *e, const float *y, const float *post_w, const float *w, int64_t T, bool *prepared) {
    const kiln_llama_config *c = &e->m->cfg;
    *prepared = T <= KILN_CUDA_MATVEC_MAX_T && c->n_embd % 32 == 0;
    if (*prepared)
        return kiln_cuda_residual_norm_xp(e->x, y, post_w, c->post_norm_eps, e->xb, e->xp, w, c->rms_eps, T, c->n_embd, e->stream);
    return kiln_cuda_residual_norm(e->x, y, post_w, c->post_norm_eps, e->xb, w, c->rms_eps, T, c->n_embd, e->stream);
}

/* T tokens from d_ids at positions *d_pos0..; with head, leaves the logits of rows first..T-1 in e->logits and,
 * when want_next, the last row's argmax in d_next (a prefill chunk whose logits nobody reads skips the head).
 * Enqueues only: no host synchronization, so it can be captured. */
static kiln_status forward(kiln_cuda_engine *e, int64_t T, int64_t first, bool head, bool want_next) {
    const kiln_model *m = e->m;
    const kiln_llama_config *c = &m->cfg;
    const int64_t C = c->n_embd, NH = c->n_head, NKV = c->n_head_kv, HS = c->head_dim, F = c->n_ff, V = c->n_vocab;
    const int64_t Q = NH * HS, KV = NKV * HS;
    cudaStream_t s = e->stream;
    const float scale = c->attn_scale > 0 ? c->attn_scale : 1.0f / sqrtf((float)HS);
    bool xb_prep = false; /* xp holds xb's prepared form */

    TRY(mark(e, P_EMBED, kiln_cuda_embed(e->x, &e->tok_embd, e->d_ids, T, c->embd_scale ? sqrtf((float)C) : 1.0f, s)));
    TRY(mark(e, P_NORM, residual_norm(e, NULL, NULL, e->layers[0].attn_norm, T, &xb_prep)));
    for (int64_t l = 0; l < c->n_layer; l++) {
        const dev_layer *D = &e->layers[l];
        const kiln_llama_layer *L = &m->layers[l];
        /* attention block: xb is this block's normed input; one token's q, k, v come from one merged matvec */
        float *q = e->q, *kk = e->kk, *vv = e->vv;
        TRY(prepare(e, e->xb, T, C, xb_prep));
        if (T == 1 && D->n_merged) {
            q = e->qkv1, kk = q + Q, vv = kk + KV;
            TRY(matmul(e, q, e->xb, &D->wqkv, 1, false));
            if (D->n_merged == 2) TRY(matmul(e, vv, e->xb, &D->wv, 1, false));
        } else {
            TRY(matmul(e, q, e->xb, &D->wq, T, false));
            TRY(matmul(e, kk, e->xb, &D->wk, T, false));
            TRY(matmul(e, vv, e->xb, &D->wv, T, false));
        }
        if (c->output_gate) TRY(matmul(e, e->ag, e->xb, &D->w_attn_gate, T, false));
        TRY(mark(e, P_QKV, KILN_OK));
        const float base = L->rope_base > 0 ? L->rope_base : c->rope_base;
        TRY(mark(e, P_QKV_POST, kiln_cuda_qkv_post(q, kk, vv, D->bq, D->bk, D->bv, D->q_norm, D->k_norm, c->rms_eps, e->d_pos0, T, NH, NKV,
                                                   HS, c->rope_dim, base, c->rope_neox, L->nope, 1.0f, e->k[l], e->v[l],
                                                   e->rows[l], s)));
        /* the attention writes att's prepared form for wo too, where it can and nothing comes between */
        bool att_prep = !c->output_gate && T <= KILN_CUDA_MATVEC_MAX_T && HS % 32 == 0;
        if (att_prep)
            TRY(mark(e, P_ATTN, kiln_cuda_attention_xp(e->att, e->xp, q, e->k[l], e->v[l], e->d_pos0, T, NH, NKV, HS, L->window,
                                                       e->rows[l], e->n_ctx, scale, e->attn_ws, s)));
        else
            TRY(mark(e, P_ATTN, kiln_cuda_attention(e->att, q, e->k[l], e->v[l], e->d_pos0, T, NH, NKV, HS, L->window, e->rows[l],
                                                    e->n_ctx, scale, e->attn_ws, s)));
        if (c->output_gate) TRY(mark(e, P_OTHER, kiln_cuda_sigmoid_mul(e->att, e->ag, T * Q, s)));
        TRY(prepare(e, e->att, T, Q, att_prep));
        if (c->sandwich_norm) { /* x += rmsnorm(att Wo^T) * post; xb = rmsnorm(x) * ffn_norm */
            TRY(mark(e, P_WO, matmul(e, e->up, e->att, &D->wo, T, false)));
            TRY(mark(e, P_NORM, residual_norm(e, e->up, D->post_attn_norm, D->ffn_norm, T, &xb_prep)));
        } else {
            TRY(mark(e, P_WO, matmul(e, e->x, e->att, &D->wo, T, true)));
            TRY(mark(e, P_NORM, residual_norm(e, NULL, NULL, D->ffn_norm, T, &xb_prep)));
        }

        /* feed-forward block */
        TRY(prepare(e, e->xb, T, C, xb_prep));
        if (T <= KILN_CUDA_MATVEC_MAX_T && D->w_gate.q.type == D->w_up.q.type) {
            TRY(mark(e, P_FFN_UP, kiln_cuda_matvec_glu(e->gate, e->xb, e->xp, &D->w_gate.q, &D->w_up.q, T, c->geglu, s)));
        } else {
            TRY(matmul(e, e->gate, e->xb, &D->w_gate, T, false));
            TRY(matmul(e, e->up, e->xb, &D->w_up, T, false));
            TRY(mark(e, P_FFN_UP, kiln_cuda_glu(e->gate, e->gate, e->up, T * F, c->geglu, s)));
        }
        TRY(prepare(e, e->gate, T, F, false));
        const float *next_norm = l + 1 < c->n_layer ? e->layers[l + 1].attn_norm : e->output_norm;
        if (c->sandwich_norm) {
            TRY(mark(e, P_DOWN, matmul(e, e->up, e->gate, &D->w_down, T, false)));
            TRY(mark(e, P_NORM, residual_norm(e, e->up, D->post_ffn_norm, next_norm, T, &xb_prep)));
        } else {
            TRY(mark(e, P_DOWN, matmul(e, e->x, e->gate, &D->w_down, T, true)));
            TRY(mark(e, P_NORM, residual_norm(e, NULL, NULL, next_norm, T, &xb_prep)));
        }
    }
    /* xb holds rmsnorm(x) * output_norm for every row; the head runs only for the rows wanted */
    if (!head) return KILN_OK;
    const int64_t n = T - first;
    const float *hx = e->xb + first * C;
    TRY(prepare(e, hx, n, C, xb_prep && n == T));
    TRY(matmul(e, e->logits, hx, &e->output, n, false));
    const float lscale = c->logit_scale > 0 ? c->logit_scale : 1.0f;
    if (lscale != 1.0f || c->logit_softcap > 0) TRY(kiln_cuda_scale_softcap(e->logits, n * V, lscale, c->logit_softcap, s));
    if (want_next) TRY(kiln_cuda_argmax(e->d_next, e->logits + (n - 1) * V, 1, V, s));
    return mark(e, P_HEAD, KILN_OK);
}

/* The single-token step as enqueued work: ids and position in, argmax (and logits) out, all through pinned
 * memory, so the captured graph needs nothing else from the host. */
static kiln_status step1(kiln_cuda_engine *e, bool want_logits) {
    const int64_t V = e->m->cfg.n_vocab;
    CK(cudaMemcpyAsync(e->d_ids, e->h_ids, 4, cudaMemcpyHostToDevice, e->stream), "cudaMemcpyAsync");
    CK(cudaMemcpyAsync(e->d_pos0, e->h_pos0, 4, cudaMemcpyHostToDevice, e->stream), "cudaMemcpyAsync");
    TRY(forward(e, 1, 0, true, true));
    CK(cudaMemcpyAsync(e->h_next, e->d_next, 4, cudaMemcpyDeviceToHost, e->stream), "cudaMemcpyAsync");
    if (want_logits) CK(cudaMemcpyAsync(e->h_logits, e->logits, (size_t)V * 4, cudaMemcpyDeviceToHost, e->stream), "cudaMemcpyAsync");
    return KILN_OK;
}

static kiln_status capture(kiln_cuda_engine *e, bool want_logits, cudaGraphExec_t *out) {
    cudaGraph_t g = NULL;
    CK(cudaStreamBeginCapture(e->stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    kiln_status st = step1(e, want_logits);
    cudaError_t err = cudaStreamEndCapture(e->stream, &g);
    if (st) {
        if (g) cudaGraphDestroy(g);
        return st;
    }
    if (err != cudaSuccess) return kiln_fail(KILN_ERR_IO, "CUDA graph capture failed: %s", cudaGetErrorString(err));
    err = cudaGraphInstantiate(out, g, 0);
    cudaGraphDestroy(g);
    if (err != cudaSuccess) return kiln_fail(KILN_ERR_IO, "CUDA graph instantiation failed: %s", cudaGetErrorString(err));
    return KILN_OK;
}

extern "C" kiln_status kiln_cuda_engine_eval(kiln_cuda_engine *e, const int32_t *ids, int64_t T, int64_t pos0, float *logits,
                                             bool all_logits, int32_t *next) {
    const int64_t V = e->m->cfg.n_vocab;
    if (T < 1 || T > e->n_batch || pos0 < 0 || pos0 + T > e->n_ctx)
        return kiln_fail(KILN_ERR_INVALID, "gpu: %lld tokens at position %lld do not fit a chunk of %lld in a context of %lld", (long long)T,
                         (long long)pos0, (long long)e->n_batch, (long long)e->n_ctx);
    memcpy(e->h_ids, ids, (size_t)T * 4);
    *e->h_pos0 = (int32_t)pos0;
    if (T == 1 && !all_logits && !e->prof) {
        const int gi = logits ? 1 : 0;
        if (!e->graph[gi]) TRY(capture(e, gi == 1, &e->graph[gi]));
        CK(cudaGraphLaunch(e->graph[gi], e->stream), "cudaGraphLaunch");
        CK(cudaStreamSynchronize(e->stream), "decode step");
        if (logits) memcpy(logits, e->h_logits, (size_t)V * 4);
        if (next) *next = *e->h_next;
        return KILN_OK;
    }
    CK(cudaMemcpyAsync(e->d_ids, e->h_ids, (size_t)T * 4, cudaMemcpyHostToDevice, e->stream), "cudaMemcpyAsync");
    CK(cudaMemcpyAsync(e->d_pos0, e->h_pos0, 4, cudaMemcpyHostToDevice, e->stream), "cudaMemcpyAsync");
    const int64_t first = all_logits ? 0 : T - 1;
    TRY(forward(e, T, first, logits || next, next != NULL));
    if (logits) {
        const size_t bytes = (size_t)((T - first) * V) * 4;
        CK(cudaMemcpyAsync(logits, e->logits, bytes, cudaMemcpyDeviceToHost, e->stream), "cudaMemcpyAsync");
    }
    if (next) CK(cudaMemcpyAsync(e->h_next, e->d_next, 4, cudaMemcpyDeviceToHost, e->stream), "cudaMemcpyAsync");
    CK(cudaStreamSynchronize(e->stream), "forward");
    if (next) *next = *e->h_next;
    return KILN_OK;
}

/* ---------------------------------------------------------------- measurement */

extern "C" kiln_status kiln_cuda_engine_profile(kiln_cuda_engine *e, int64_t pos0, int reps, kiln_cuda_op_time *ops, int *n_ops) {
    const kiln_llama_config *c = &e->m->cfg;
    prof_marks *p = (prof_marks *)calloc(1, sizeof *p);
    if (!p) return kiln_fail(KILN_ERR_NOMEM, "gpu profile: out of memory");
    kiln_status st = KILN_OK;
    int made = 0;
    for (; made <= PROF_MAX && st == KILN_OK; made++)
        if (cudaEventCreate(&p->ev[made]) != cudaSuccess) st = kiln_fail(KILN_ERR_IO, "gpu profile: cudaEventCreate failed");
    double ms[P_COUNT] = {0};
    for (int r = 0; r < reps && !st; r++) {
        p->n = 0;
        e->prof = p;
        int32_t id = 1 % (int32_t)c->n_vocab, nx;
        cudaEventRecord(p->ev[0], e->stream);
        st = kiln_cuda_engine_eval(e, &id, 1, pos0, NULL, false, &nx);
        e->prof = NULL;
        for (int i = 0; i < p->n && !st; i++) {
            float t = 0;
            cudaEventElapsedTime(&t, p->ev[i], p->ev[i + 1]);
            ms[p->cat[i]] += t / reps;
        }
    }
    for (int i = 0; i < made; i++) cudaEventDestroy(p->ev[i]);
    free(p);
    if (st) return st;
    /* bytes each op must read in one decode step: its weights (and the KV positions attention sees) */
    double bytes[P_COUNT] = {0};
    const double KVb = (double)(c->n_head_kv * c->head_dim) * 2;
    for (int64_t l = 0; l < c->n_layer; l++) {
        const kiln_llama_layer *L = &e->m->layers[l];
        bytes[P_QKV] += (double)(L->wq->nbytes + L->wk->nbytes + L->wv->nbytes + (L->w_attn_gate ? L->w_attn_gate->nbytes : 0));
        bytes[P_WO] += (double)L->wo->nbytes;
        bytes[P_FFN_UP] += (double)(L->w_gate->nbytes + L->w_up->nbytes);
        bytes[P_DOWN] += (double)L->w_down->nbytes;
        int64_t seen = pos0 + 1;
        if (L->window && L->window < seen) seen = L->window;
        bytes[P_ATTN] += 2 * KVb * (double)seen;
    }
    bytes[P_HEAD] = (double)e->m->output->nbytes;
    int n = 0;
    for (int i = 0; i < P_COUNT; i++) {
        if (ms[i] <= 0) continue;
        ops[n].name = prof_names[i];
        ops[n].ms = ms[i];
        ops[n].bytes = bytes[i];
        n++;
    }
    *n_ops = n;
    return KILN_OK;
}

extern "C" kiln_status kiln_cuda_copy_bandwidth(double *gb_per_s) {
    const size_t n = (size_t)1 << 30; /* 1 GiB each way: far past the 60 MB L2 */
    void *a = NULL, *b = NULL;
    cudaEvent_t t0 = NULL, t1 = NULL;
    kiln_status st = KILN_OK;
    float best = 1e30f;
    if (cudaMalloc(&a, n) != cudaSuccess || cudaMalloc(&b, n) != cudaSuccess || cudaEventCreate(&t0) != cudaSuccess ||
        cudaEventCreate(&t1) != cudaSuccess)
        st = kiln_fail(KILN_ERR_NOMEM, "gpu: no memory for the copy-bandwidth measurement");
    else {
        cudaMemset(a, 1, n);
        for (int r = 0; r < 6; r++) {
            cudaEventRecord(t0);
            cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice);
            cudaEventRecord(t1);
            cudaEventSynchronize(t1);
            float ms = 0;
            cudaEventElapsedTime(&ms, t0, t1);
            if (r > 0 && ms < best) best = ms;
        }
        *gb_per_s = 2.0 * (double)n / (best * 1e-3) / 1e9; /* bytes read plus bytes written */
    }
    if (t0) cudaEventDestroy(t0);
    if (t1) cudaEventDestroy(t1);
    cudaFree(a);
    cudaFree(b);
    return st;
}
