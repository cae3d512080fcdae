/* engine.cu: the CUDA backend of the forward's seam (src/model/backend.h). The forward itself is src/model/llama.c,
 * the same one the CPU runs; this file keeps the device resources it runs on and fills the seam's steps with the
 * kernels of kernels.h, fused where a kernel boundary costs more than it buys:
 *   - the residual add is folded into the wo and down projections (matvec/gemm with add); the residual step, the
 *     sandwich post-norm and the next RMSNorm are one kernel, which in decode also writes the next matvecs' int8
 *     input (residual_norm_xp), as the attention does for wo (attention_xp);
 *   - a single token's q, k and v come from one matvec over wq, wk, wv uploaded back to back when they share a type;
 *     when v differs (Q4_K_M's q6_K v) the q|k matvec and v's run in one launch if both are small
 *     (kiln_cuda_matvec_pair; KILN_MV_PAIR=0 keeps the two);
 *   - bias, QK-norm, RoPE and the cache store are one kernel (qkv_post; q8_0 and q4_0 caches add kv_quantize);
 *     in decode they run inside the attention kernel (qkv_attention,
 *     kiln_cuda_attention_post: one launch a layer fewer; KILN_ATTN_POST=0 keeps the two);
 *   - gate and up are one pass over both weights with the GLU applied (matvec_glu) in decode;
 *   - matmul_norm can fold the residual norm (and the GLU the prepare of down's input) into the matvec as its
 *     tail; measured slower (docs/cuda.md), so only KILN_MV_TAIL=all|norm|prep turns it on;
 *   - or the other way round, the matvec's prologue (kiln_cuda_mv_tail's pre_x): a one-token residual norm is deferred
 *     (pend) until the matvec that reads its output, whose CTAs each norm and quantize x for themselves, and a
 *     one-token matvec whose input is not prepared quantizes it itself; every other step runs a pending norm first
 *     (flush). Measured slower (docs/cuda.md), so only KILN_MV_PRE_COLS (PRE_COLS_DEFAULT 0) turns it on, with
 *     KILN_MV_PRE=0|norm|quant|all;
 *   - nonfinite, the check of a stage's output for a NaN or an infinity (the greedy argmax's row always, every layer
 *     with check_finite), is a small grid-stride kernel here that sets a flag in device memory the session reads back.
 * The context remembers which activation the prepared int8 buffer (xp) holds, so a matvec prepares its input only
 * when the step before did not.
 *
 * Decode (T <= 8 tokens) uses the memory-bound matvec kernels; a larger chunk multiplies on tensor cores (gemm.cu)
 * reading bf16 copies of the weights, made once here when they fit in the free memory with 1 GiB to spare, else
 * dequantized per call. record captures a single-token step once as a CUDA graph (its kernels launched with
 * programmatic dependent launch, launch.h) and replays it for every token: the session's token id and position are
 * copied from pinned host memory by the graph's first nodes and every kernel reads the position from device memory,
 * so one graph serves every position. tests/test_cuda_engine.c checks the GPU session against the CPU one, logits
 * and greedy tokens, on every architecture fixture. docs/cuda.md has the measurements. */
#include "cuda/engine.h"
#include "cuda/cuda.h"
#include "cuda/kernels.h"
#include "cuda/launch.h"
#include "model/backend.h"
#include "quants.h"
#include "status.h"

#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


/* The largest weight (rows x cols) a step of 9..32 rows multiplies with gemm_small rather than cuBLASLt on its bf16
 * copy. Measured on the H200 (bench gpu-kernels, T 16): gemm_small is ahead on 4096 x 4096 and the 1.1B shapes
 * (Q4_K 4096^2 11.7 us against 17.5; 1.1B q 6.4 against 10.6), even or behind on 7B's 11008 x 4096 and the head
 * (gate+up 60.8 against 60.1, Q6_K down 33.2 against 30.1, the head 103 against 70). kiln serve, 7B Q4_K_M, 16
 * streams: 2222 tok/s and 6.35 ms a step in the engine with this rule, 2095 and 6.89 ms without gemm_small, 2020
 * and 7.06 ms with it for every weight. */
#define GEMM_SMALL_MAX_ELEMS ((int64_t)1 << 24)

/* Bytes of the hinted weights a decode matvec prefetches into L2 (KILN_PREFETCH_MB overrides; 0: none). Off: measured
 * on an H100 (tg128, 2026-12-06) it gains nothing at 7B Q4_K_M (2 MiB: 425.6 tok/s against 422.8 and 423.0 off) and
 * loses at 1.1B (1,096 against 1,105) and 124M (2,496 against 2,963): the prefetching CTAs hold the matvec's last
 * wave longer than the small kernels after it take. */
#define PF_DEFAULT_MB 0

/* Decode steps of more rows than this take gemm_small's tensor cores for the weights it takes (KILN_MATVEC_ROWS
 * overrides, 1..8). Measured on an H100 (bench --gpu -b, 2026-12-06), agg tok/s with 8 (all on the matvecs) and 4:
 * B 8: 7B 1,260 -> 1,376, 1.1B 4,209 -> 4,722, 124M 12,806 -> 13,402; B 6: 7B 1,144 -> 1,195, 1.1B 3,839 -> 3,592,
 * 124M 10,945 -> 10,293. So 6: B 7 and 8 on gemm_small, up to 6 on the matvecs. */
#define MV_ROWS_DEFAULT 6

/* One-token matvecs of at most this many columns make their own prepared x (the matvec prologue; KILN_MV_PRE_COLS
 * overrides, 0: none): the norm or the prepare before them is then no kernel of its own. Measured slower on an H100
 * (tg128, 2026-12-06, up to 2048 columns): 1.1B Q4_K_M 1,132 -> 858 tok/s, 124M 3,150 -> 2,837; each CTA's chain of
 * L2 reads costs more than the kernel boundary it saves (docs/cuda.md). So 0: never. */
#define PRE_COLS_DEFAULT 0

/* ---------------------------------------------------------------- sizing and upload */

static bool type_supported(kiln_type t) {
    switch (t) {
    case KILN_TYPE_F32: case KILN_TYPE_F16: case KILN_TYPE_BF16: case KILN_TYPE_Q4_0: case KILN_TYPE_Q4_1:
    case KILN_TYPE_Q5_0: case KILN_TYPE_Q8_0: case KILN_TYPE_Q4_K: case KILN_TYPE_Q5_K: case KILN_TYPE_Q6_K:
    case KILN_TYPE_Q5_1: case KILN_TYPE_Q2_K: case KILN_TYPE_Q3_K: case KILN_TYPE_IQ4_NL: case KILN_TYPE_IQ4_XS: return true;
    default: return false;
    }
}

static size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }
static bool is_matrix(int i) { return kiln_layer_tensors[i].ne1 != KILN_DIM_ONE; }

/* The profile's step kind of a layer's matrix. */
static int cat_of(int i) {
    switch (i) {
    case KILN_LT_WO: return P_WO;
    case KILN_LT_W_GATE: case KILN_LT_W_UP: return P_FFN_UP;
    case KILN_LT_W_DOWN: return P_DOWN;
    default: return P_QKV; /* wq, wk, wv, the output gate */
    }
}

static kiln_weight bind(const kiln_tensor_view *t, const void *impl) {
    kiln_weight w;
    w.view = t;
    w.impl = impl;
    return w;
}

/* How many of wq, wk, wv go back to back as one matrix: those that share wq's type and row length, in order, with
 * every one before the last ending on 16 bytes. 3, 2 (q and k) or 0. */
static int qkv_mergeable(const kiln_llama_layer *L) {
    if (L->wq->type != L->wk->type || L->wq->ne[0] != L->wk->ne[0] || L->wq->nbytes % 16) return 0;
    return L->wq->type == L->wv->type && L->wq->ne[0] == L->wv->ne[0] && L->wk->nbytes % 16 == 0 ? 3 : 2;
}

static size_t weight_bytes(const kiln_model *m) {
    size_t n = 0;
    for (int64_t l = 0; l < m->cfg.n_layer; l++)
        for (int i = 0; i < KILN_LT_COUNT; i++)
            if (m->layers[l].t[i]) n += align256(m->layers[l].t[i]->nbytes);
    n += align256(m->tok_embd->nbytes) + align256(m->output_norm->nbytes);
    if (m->output != m->tok_embd) n += align256(m->output->nbytes);
    return n;
}

/* Copies view t into the weight buffer at *off and returns its device address; the next tensor starts on 256
 * bytes, or right after this one when packed (wq, wk, wv of a merged qkv). */
static const void *upload_at(engine *e, const kiln_tensor_view *t, size_t *off, bool packed, kiln_status *st) {
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

/* W's bf16 prefill copy at *off of the copies' buffer, dequantized on the GPU from the uploaded blocks. */
static kiln_status bf16_copy(engine *e, dev_wt *W, size_t *off) {
    if (!W->q.data || W->q.type == KILN_TYPE_BF16) return KILN_OK; /* absent, or already what the tensor cores read */
    W->bf = W->q;
    W->bf.type = KILN_TYPE_BF16;
    W->bf.row_bytes = (size_t)W->q.cols * 2;
    W->bf.data = (char *)e->bfbuf + *off;
    *off += align256((size_t)(W->q.rows * W->q.cols) * 2);
    return kiln_cuda_dequantize_bf16(&W->q, (void *)W->bf.data, e->stream);
}

/* Every matmul weight's bf16 copy (bytes in all, as counted before allocating): milliseconds of dequantization. */
static kiln_status make_bf16_copies(engine *e, size_t bytes) {
    cudaError_t err = cudaMalloc(&e->bfbuf, bytes);
    if (err != cudaSuccess) {
        e->bfbuf = NULL;
        return kiln_fail(KILN_ERR_NOMEM, "gpu: allocating %.2f GiB for the bf16 prefill weights failed: %s", bytes / 1073741824.0,
                         cudaGetErrorString(err));
    }
    size_t off = 0;
    kiln_status st = KILN_OK;
    for (int64_t l = 0; l < e->m->cfg.n_layer && !st; l++)
        for (int i = 0; i < KILN_LT_COUNT && !st; i++)
            if (is_matrix(i)) st = bf16_copy(e, &e->layers[l].w[i], &off);
    return st ? st : bf16_copy(e, &e->output, &off);
}

/* Makes the engine's device current (a no-op on the common single-device path), so sessions on two devices can
 * run from one thread; the steps the forward enqueues between two such entries stay on it. */
static kiln_status use_device(const engine *e) {
    int cur = -1;
    if (cudaGetDevice(&cur) == cudaSuccess && cur == e->device) return KILN_OK;
    CK(cudaSetDevice(e->device), "cudaSetDevice");
    return KILN_OK;
}

static void cuda_close(void *p) {
    engine *e = (engine *)p;
    if (!e) return;
    use_device(e);
    for (int i = 0; i < e->n_graph; i++)
        if (e->graph[i]) cudaGraphExecDestroy(e->graph[i]);
    free(e->graph);
    kiln_cuda_gemm_ws_free(&e->gws);
    cudaFree(e->wbuf);
    cudaFree(e->bfbuf);
    cudaFree(e->wsbuf);
    if (e->stream) cudaStreamDestroy(e->stream);
    free(e->layers);
    free(e->bound);
    free(e);
}

/* KILN_BENCH_OMIT's list as engine.h's omit bits (unknown names ignored). */
static unsigned engine_omit_read(const char *v) {
    static const struct { const char *name; int bit; } names[] = {{"norm", P_NORM}, {"qkv", P_QKV}, {"attn", P_ATTN}, {"wo", P_WO},
                                                                  {"ffn", P_FFN_UP}, {"down", P_DOWN}, {"head", P_HEAD},
                                                                  {"prep", P_COUNT}};
    unsigned bits = 0;
    for (size_t i = 0; v && i < sizeof names / sizeof names[0]; i++) {
        const size_t n = strlen(names[i].name);
        for (const char *s = strstr(v, names[i].name); s; s = strstr(s + 1, names[i].name))
            if ((s == v || s[-1] == ',') && (s[n] == ',' || s[n] == '\0')) bits |= 1u << names[i].bit;
    }
    return bits;
}

/* Whether a decode step of kind bit is left out (KILN_BENCH_OMIT). */
static bool omitted(const engine *e, int bit, int64_t T) { return (e->omit >> bit & 1u) && T <= KILN_CUDA_MATVEC_MAX_T; }

/* Checks every type and shape and counts the memory (the weights, the session's cache and activations, the
 * workspaces) against the free VRAM before anything is allocated, then uploads the weights. */
static kiln_status cuda_open(const kiln_model *m, const kiln_backend_params *p, void **out) {
    *out = NULL;
    const kiln_llama_config *c = &m->cfg;
    const int64_t NH = c->n_head, HS = c->head_dim, W = kiln_llama_max_width(c);
    const int64_t n_ctx = p->n_ctx, n_batch = p->n_batch;
    if (kiln_cuda_device_count() == 0) return kiln_fail(KILN_ERR_UNSUPPORTED, "gpu: no CUDA device (or kiln was built without CUDA)");
    if (p->device < 0 || p->device >= kiln_cuda_device_count())
        return kiln_fail(KILN_ERR_INVALID, "gpu: device %d does not exist (%d CUDA devices)", p->device, kiln_cuda_device_count());
    CK(cudaSetDevice(p->device), "cudaSetDevice");
    TRY(kiln_cuda_check_device()); /* the compute capability this build's kernels need */

    size_t max_w = (size_t)(m->output->ne[0] * m->output->ne[1]), bf_bytes = 0;
    for (int64_t l = 0; l < c->n_layer; l++)
        for (int i = 0; i < KILN_LT_COUNT; i++) {
            const kiln_tensor_view *t = m->layers[l].t[i];
            if (!t || !is_matrix(i)) continue;
            if (!type_supported(t->type))
                return kiln_fail(KILN_ERR_UNSUPPORTED, "gpu: tensor %s has type %s, which the CUDA backend does not compute", t->name,
                                 kiln_type_name(t->type));
            size_t n = (size_t)(t->ne[0] * t->ne[1]);
            if (n > max_w) max_w = n;
            /* bf16 copies of the matmul weights let prefill skip dequantizing every weight in every chunk (about a
             * third of a 7B pp512's time) */
            if (t->type != KILN_TYPE_BF16) bf_bytes += align256(n * 2);
        }
    if (HS % 8 || HS > 256)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "gpu: head size %lld is not supported (a multiple of 8 up to 256)", (long long)HS);
    if (!type_supported(m->tok_embd->type) || !type_supported(m->output->type))
        return kiln_fail(KILN_ERR_UNSUPPORTED, "gpu: the embedding or output type (%s, %s) is not supported", kiln_type_name(m->tok_embd->type),
                         kiln_type_name(m->output->type));
    if (m->output->type != KILN_TYPE_BF16) bf_bytes += align256((size_t)(m->output->ne[0] * m->output->ne[1]) * 2);
    const size_t wbytes = weight_bytes(m);
    /* prepared rows: the matvecs' and gemm_small's */
    const size_t xp_bytes = align256(kiln_cuda_matvec_prep_bytes(
        KILN_CUDA_GEMM_SMALL_MAX_T > KILN_CUDA_MATVEC_MAX_T ? KILN_CUDA_GEMM_SMALL_MAX_T : KILN_CUDA_MATVEC_MAX_T, W));
    /* decode rows per attention launch: a sequence's 8 tokens, or one token of each sequence (more run in pieces) */
    int64_t decode_rows = p->n_seq > 8 ? p->n_seq : 8;
    if (decode_rows > n_batch) decode_rows = n_batch;
    if (decode_rows > 256) decode_rows = 256;
    const size_t attn_ws = align256(kiln_cuda_attention_ws_bytes(decode_rows, NH, HS, n_ctx));
    /* the tails' counters: a block of 32 outputs of the widest matvec each */
    const size_t cnt_bytes = align256(sizeof(unsigned) * (size_t)(W / 32 + 1));
    const size_t gws_bytes = kiln_cuda_gemm_ws_bytes(max_w, (size_t)(n_batch * W));
    const size_t kv_bytes = align256(p->kv_bytes), act_bytes = align256(p->act_bytes) + 2 * xp_bytes + cnt_bytes + attn_ws;
    const size_t need = wbytes + kv_bytes + act_bytes + gws_bytes;
    size_t free_b = 0, total_b = 0;
    CK(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
    const size_t margin = (size_t)256 << 20; /* the CUDA context's own allocations and cuBLAS */
    /* the bf16 copies are kept when they fit with 1 GiB to spare; otherwise gemm dequantizes per call */
    const bool keep_bf = need + bf_bytes + ((size_t)1 << 30) <= free_b;
    if (need + margin > free_b)
        return kiln_fail(KILN_ERR_NOMEM,
                         "gpu: the model needs %.2f GiB of GPU memory (weights %.2f, KV cache of %lld positions %.2f, scratch %.2f) but %.2f GiB of %.2f is free",
                         need / 1073741824.0, wbytes / 1073741824.0, (long long)n_ctx, kv_bytes / 1073741824.0,
                         (act_bytes + gws_bytes) / 1073741824.0, free_b / 1073741824.0, total_b / 1073741824.0);

    engine *e = (engine *)calloc(1, sizeof *e);
    if (!e) return kiln_fail(KILN_ERR_NOMEM, "gpu: out of memory");
    e->m = m;
    e->device = p->device;
    e->n_ctx = n_ctx;
    e->n_batch = n_batch;
    e->decode_rows = decode_rows;
    const char *gs = getenv("KILN_GEMM_SMALL");
    e->gemm_small_max = gs && strcmp(gs, "0") == 0 ? 0 : gs && strcmp(gs, "all") == 0 ? INT64_MAX : GEMM_SMALL_MAX_ELEMS;
    e->n_graph = 8 * (int)(decode_rows + 1);
    e->dev_bytes = wbytes + 2 * xp_bytes + cnt_bytes + attn_ws + gws_bytes + (keep_bf ? bf_bytes : 0);
    const char *pf = getenv("KILN_PREFETCH_MB");
    const long pf_mb = pf ? strtol(pf, NULL, 10) : PF_DEFAULT_MB;
    e->pf_budget = pf_mb > 0 && pf_mb <= 1024 ? (size_t)pf_mb << 20 : 0;
    const char *mvr = getenv("KILN_MATVEC_ROWS");
    const long mv_rows = mvr ? strtol(mvr, NULL, 10) : MV_ROWS_DEFAULT;
    e->mv_rows = mv_rows >= 1 && mv_rows <= KILN_CUDA_MATVEC_MAX_T ? mv_rows : MV_ROWS_DEFAULT;
    const char *fp = getenv("KILN_ATTN_POST");
    e->fuse_post = !(fp && strcmp(fp, "0") == 0);
    const char *mp = getenv("KILN_MV_PAIR");
    e->pair = !(mp && strcmp(mp, "0") == 0);
    const char *pre = getenv("KILN_MV_PRE"), *pre_cols = getenv("KILN_MV_PRE_COLS");
    e->pre_kinds = !pre ? PRE_NORM | PRE_QUANT : strcmp(pre, "norm") == 0 ? PRE_NORM : strcmp(pre, "quant") == 0 ? PRE_QUANT
                 : strcmp(pre, "0") == 0 ? 0 : PRE_NORM | PRE_QUANT;
    const long pc = pre_cols ? strtol(pre_cols, NULL, 10) : PRE_COLS_DEFAULT;
    e->pre_cols = pc >= 0 && pc <= KILN_CUDA_MV_PRE_MAX_COLS ? pc : PRE_COLS_DEFAULT;
    e->omit = engine_omit_read(getenv("KILN_BENCH_OMIT"));
    const char *tails = getenv("KILN_MV_TAIL");
    e->tails = !tails ? 0 : strcmp(tails, "all") == 0 ? TAIL_PREPARE | TAIL_NORM : strcmp(tails, "prep") == 0 ? TAIL_PREPARE
             : strcmp(tails, "norm") == 0 ? TAIL_NORM : 0;
    kiln_status st = KILN_OK;
    e->layers = (dev_layer *)calloc((size_t)c->n_layer, sizeof *e->layers);
    e->bound = (kiln_weight(*)[KILN_LT_COUNT])calloc((size_t)c->n_layer, sizeof *e->bound);
    e->graph = (cudaGraphExec_t *)calloc((size_t)e->n_graph, sizeof *e->graph);
    if (!e->layers || !e->bound || !e->graph) {
        cuda_close(e);
        return kiln_fail(KILN_ERR_NOMEM, "gpu: out of memory");
    }
    cudaError_t err;
    if ((err = cudaStreamCreateWithFlags(&e->stream, cudaStreamNonBlocking)) != cudaSuccess ||
        (err = cudaMalloc(&e->wbuf, wbytes)) != cudaSuccess || (err = cudaMalloc(&e->wsbuf, 2 * xp_bytes + cnt_bytes + attn_ws)) != cudaSuccess) {
        cuda_close(e);
        return kiln_fail(KILN_ERR_NOMEM, "gpu: allocating %.2f GiB failed: %s", need / 1073741824.0, cudaGetErrorString(err));
    }
    e->xp = e->wsbuf;
    e->xp_next = (char *)e->wsbuf + xp_bytes;
    e->mv_cnt = (unsigned *)((char *)e->wsbuf + 2 * xp_bytes);
    e->attn_ws = (char *)e->wsbuf + 2 * xp_bytes + cnt_bytes;
    if ((st = kiln_cuda_gemm_ws_new(&e->gws, max_w, (size_t)(n_batch * W))) != KILN_OK) {
        cuda_close(e);
        return st;
    }

    /* weights, in the table's order, wq, wk (and wv) back to back where they merge */
    size_t off = 0;
    for (int64_t l = 0; l < c->n_layer && !st; l++) {
        const kiln_llama_layer *L = &m->layers[l];
        dev_layer *D = &e->layers[l];
        const int merge = qkv_mergeable(L);
        for (int i = 0; i < KILN_LT_COUNT; i++) {
            const bool packed = (i == KILN_LT_WQ && merge > 0) || (i == KILN_LT_WK && merge == 3);
            const void *d = upload_at(e, L->t[i], &off, packed, &st);
            if (is_matrix(i)) {
                D->w[i].q = wt_of(L->t[i], d);
                D->w[i].cat = cat_of(i);
            } else {
                D->vec[i] = (const float *)d;
            }
            e->bound[l][i] = bind(L->t[i], is_matrix(i) ? (const void *)&D->w[i] : d);
        }
        D->w[KILN_LT_WQ].n_merged = merge;
        if (merge) {
            D->w[KILN_LT_WQ].qkv = D->w[KILN_LT_WQ].q;
            D->w[KILN_LT_WQ].qkv.rows = L->wq->ne[1] + L->wk->ne[1] + (merge == 3 ? L->wv->ne[1] : 0);
        }
    }
    e->tok_embd.q = wt_of(m->tok_embd, upload_at(e, m->tok_embd, &off, false, &st));
    e->output_norm = (const float *)upload_at(e, m->output_norm, &off, false, &st);
    e->output.q = m->output == m->tok_embd ? e->tok_embd.q : wt_of(m->output, upload_at(e, m->output, &off, false, &st));
    e->output.cat = P_HEAD;
    if (!st && keep_bf) st = make_bf16_copies(e, bf_bytes);
    /* the counters and the attention's workspace must start at zero; xp too, so that a step reading it unprepared
     * (KILN_BENCH_OMIT=prep) reads finite codes */
    if (!st && (err = cudaMemsetAsync(e->wsbuf, 0, 2 * xp_bytes + cnt_bytes + attn_ws, e->stream)) != cudaSuccess)
        st = kiln_fail(KILN_ERR_IO, "CUDA workspace clear failed: %s", cudaGetErrorString(err));
    if (!st && (err = cudaStreamSynchronize(e->stream)) != cudaSuccess)
        st = kiln_fail(KILN_ERR_IO, "CUDA weight upload failed: %s", cudaGetErrorString(err));
    if (st) {
        cuda_close(e);
        return st;
    }
    *out = e;
    return KILN_OK;
}

static kiln_status cuda_load_weights(void *p, const kiln_model *m, kiln_weights *w) {
    engine *e = (engine *)p;
    w->layers = e->bound;
    w->tok_embd = bind(m->tok_embd, &e->tok_embd);
    w->output_norm = bind(m->output_norm, e->output_norm);
    w->output = bind(m->output, &e->output);
    return KILN_OK;
}

static size_t cuda_device_bytes(void *p) { return ((engine *)p)->dev_bytes; }

/* ---------------------------------------------------------------- buffers */

static kiln_status cuda_alloc(void *p, size_t bytes, void **out) {
    engine *e = (engine *)p;
    *out = NULL;
    TRY(use_device(e));
    cudaError_t err = cudaMalloc(out, bytes ? bytes : 1);
    if (err != cudaSuccess) {
        *out = NULL;
        return kiln_fail(KILN_ERR_NOMEM, "gpu: allocating %.2f MiB failed: %s", bytes / 1048576.0, cudaGetErrorString(err));
    }
    e->dev_bytes += bytes;
    /* zeroed, so no cache row is ever uninitialized */
    CK(cudaMemsetAsync(*out, 0, bytes, e->stream), "cudaMemsetAsync");
    return KILN_OK;
}
static void cuda_free(void *p, void *buf) {
    use_device((engine *)p);
    cudaFree(buf);
}
static kiln_status cuda_alloc_host(void *p, size_t bytes, void **out) {
    *out = NULL;
    TRY(use_device((engine *)p));
    cudaError_t err = cudaMallocHost(out, bytes ? bytes : 1);
    if (err != cudaSuccess) {
        *out = NULL;
        return kiln_fail(KILN_ERR_NOMEM, "gpu: allocating %.2f MiB of pinned host memory failed: %s", bytes / 1048576.0,
                         cudaGetErrorString(err));
    }
    memset(*out, 0, bytes);
    return KILN_OK;
}
static void cuda_free_host(void *p, void *buf) { cudaFreeHost(buf); }

/* The deferred residual norm (pend), launched now: every step but the matvec that takes it as its prologue begins
 * here, so the norm runs before anything that could read its output or change its input. */
static kiln_status flush(engine *e) {
    if (!e->pend.on) return KILN_OK;
    e->pend.on = false;
    return kiln_cuda_residual_norm_xp(e->pend.x, NULL, NULL, 0.0f, e->pend.xb, e->xp, e->pend.w, e->pend.eps, 1, e->pend.C,
                                      e->stream);
}

static kiln_status cuda_upload(void *p, void *dst, const void *src, size_t bytes) {
    TRY(use_device((engine *)p));
    TRY(flush((engine *)p));
    CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, ((engine *)p)->stream), "cudaMemcpyAsync");
    return KILN_OK;
}
static kiln_status cuda_download(void *p, void *dst, const void *src, size_t bytes) {
    TRY(use_device((engine *)p));
    TRY(flush((engine *)p));
    CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, ((engine *)p)->stream), "cudaMemcpyAsync");
    return KILN_OK;
}
static kiln_status cuda_synchronize(void *p) {
    TRY(use_device((engine *)p));
    TRY(flush((engine *)p));
    CK(cudaStreamSynchronize(((engine *)p)->stream), "forward");
    return KILN_OK;
}

static kiln_status capture(engine *e, kiln_status (*enqueue)(void *arg), void *arg, cudaGraphExec_t *out) {
    cudaGraph_t g = NULL;
    CK(cudaStreamBeginCapture(e->stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    kiln_status st = enqueue(arg);
    if (!st) st = flush(e); /* a norm the step left pending belongs to the graph */
    e->pend.on = false;
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

static kiln_status cuda_record(void *p, int slot, kiln_status (*enqueue)(void *arg), void *arg) {
    engine *e = (engine *)p;
    TRY(use_device(e));
    if (slot < 0) return kiln_fail(KILN_ERR_INVALID, "gpu: record slot %d is negative", slot);
    if (slot >= e->n_graph) return enqueue(arg); /* a batch past the table's sizes runs as it comes */
    if (!e->graph[slot]) TRY(capture(e, enqueue, arg, &e->graph[slot]));
    CK(cudaGraphLaunch(e->graph[slot], e->stream), "cudaGraphLaunch");
    return KILN_OK;
}

/* ---------------------------------------------------------------- the steps */

static kiln_status mark(engine *e, int cat, kiln_status st) {
    if (st || !e->prof || e->prof->n >= PROF_MAX) return st;
    e->prof->cat[e->prof->n] = cat;
    cudaEventRecord(e->prof->ev[++e->prof->n], e->stream);
    return KILN_OK;
}

static void prepared(engine *e, const float *x, int64_t T, int64_t cols) { e->xp_of = x, e->xp_T = T, e->xp_cols = cols; }

/* xp <- x's prepared form for the matvecs, unless it already holds it. */
static kiln_status prepare(engine *e, const float *x, int64_t T, int64_t cols) {
    TRY(flush(e));
    if (e->xp_of == x && e->xp_T == T && e->xp_cols == cols) return KILN_OK;
    if (!omitted(e, P_COUNT, T)) TRY(kiln_cuda_matvec_prepare(e->xp, x, T, cols, e->stream));
    prepared(e, x, T, cols);
    return KILN_OK;
}

/* After a matvec whose tail prepared x into xp_next: that buffer is now xp. */
static void prepared_next(engine *e, const float *x, int64_t T, int64_t cols) {
    void *t = e->xp;
    e->xp = e->xp_next, e->xp_next = t;
    prepared(e, x, T, cols);
}

/* Whether the one-token matvec over W that reads x makes x's prepared form itself (t's prologue): the pending norm
 * whose output is x, or, with none pending, x's prepare. xp then holds x's prepared form (and xb the norm's output)
 * after the matvec, as after the kernel it saves. Otherwise the caller prepares (which runs a pending norm first). */
static bool take_pre(engine *e, kiln_cuda_mv_tail *t, const float *x, const kiln_cuda_wt *W, int64_t T) {
    if (T != 1 || W->cols > e->pre_cols) return false;
    if (e->pend.on) {
        if (x != e->pend.xb || W->cols != e->pend.C || !kiln_cuda_matvec_pre_takes(W, 1, true)) return false;
        t->pre_x = e->pend.x, t->pre_w = e->pend.w, t->pre_eps = e->pend.eps, t->pre_xb = e->pend.xb;
        e->pend.on = false; /* xp_of is xb since the norm step */
        return true;
    }
    if (!(e->pre_kinds & PRE_QUANT) || (e->xp_of == x && e->xp_T == 1 && e->xp_cols == W->cols) || ((uintptr_t)x & 15) ||
        !kiln_cuda_matvec_pre_takes(W, 1, false))
        return false;
    t->pre_x = x;
    prepared(e, x, 1, W->cols);
    return true;
}

/* Whether a matvec of T rows over W, into y, can run a tail (kiln_cuda_mv_tail's conditions). */
static bool tail_fits(const engine *e, int kind, const kiln_cuda_wt *W, const float *y, int64_t T) {
    return (e->tails & kind) && T <= KILN_CUDA_MATVEC_MAX_T && W->rows % 32 == 0 && ((uintptr_t)y & 15) == 0;
}

/* Whether gemm_small multiplies T rows by q in this engine (its types, and the size rule). */
static bool small_takes(const engine *e, const kiln_cuda_wt *q, int64_t T) {
    return q->rows * q->cols <= e->gemm_small_max && kiln_cuda_gemm_small_takes(q, T);
}

/* y (T, W.rows) (+)= x W^T: matvec on the prepared xp for a decode-sized T (above mv_rows only where gemm_small does
 * not take the weight), the blocks on the tensor cores for a few more rows (a step of many sequences' tokens), else
 * cuBLASLt (on the bf16 copy when there is one). */

static kiln_status mm(engine *e, float *y, const float *x, const dev_wt *W, const kiln_cuda_wt *q, int64_t T, bool add) {
    if (T <= KILN_CUDA_MATVEC_MAX_T && (T <= e->mv_rows || !small_takes(e, q, T))) {
        kiln_cuda_mv_tail t = {};
        if (!take_pre(e, &t, x, q, T)) TRY(prepare(e, x, T, q->cols));
        engine_pf_spans(e, &t);
        TRY(kiln_cuda_matvec_tail(y, x, e->xp, q, T, add, &t, e->stream));
    } else if (small_takes(e, q, T)) {
        engine_pf_drop(e);
        TRY(prepare(e, x, T, q->cols));
        TRY(kiln_cuda_gemm_small(y, e->xp, q, T, add, &e->gws, e->stream));
    } else {
        TRY(flush(e));
        engine_pf_drop(e);
        TRY(kiln_cuda_gemm(y, x, W->bf.data && q == &W->q ? &W->bf : q, T, add, &e->gws, e->stream));
    }
    if (y == e->xp_of) e->xp_of = NULL;
    return KILN_OK;
}

static kiln_status cuda_embed(void *p, float *x, const kiln_weight *table, const int32_t *ids, int64_t T, int64_t C, float scale) {
    engine *e = (engine *)p;
    e->xp_of = NULL;
    e->pend.on = false;           /* left by a step that failed: its output is not wanted */
    e->n_hint = 0, e->n_seen = 0; /* a step begins */
    return mark(e, P_EMBED, kiln_cuda_embed(x, &((const dev_wt *)table->impl)->q, ids, T, scale, e->stream));
}

static kiln_status cuda_residual_norm(void *p, float *x, float *y, const kiln_weight *post_w, float post_eps, float *xb,
                                      const kiln_weight *w, float eps, int64_t T, int64_t C) {
    engine *e = (engine *)p;
    const float *pw = post_w ? (const float *)post_w->impl : NULL, *nw = w ? (const float *)w->impl : NULL;
    TRY(flush(e));
    e->xp_of = NULL;
    if (omitted(e, P_NORM, T)) return prepared(e, xb, T, C), mark(e, P_NORM, KILN_OK);
    if (w && !y && !pw && T == 1 && (e->pre_kinds & PRE_NORM) && C % 32 == 0 && C <= KILN_CUDA_MV_PRE_NORM_MAX_COLS && C <= e->pre_cols &&
        !(((uintptr_t)x | (uintptr_t)xb | (uintptr_t)nw) & 15)) {
        /* one token's norm alone: deferred to the matvec that reads xb, which runs it as its prologue (take_pre) */
        e->pend.on = true, e->pend.x = x, e->pend.xb = xb, e->pend.w = nw, e->pend.eps = eps, e->pend.C = C;
        prepared(e, xb, T, C);
    } else if (!w) { /* no pre-norm (olmo2): the residual add alone, then xb = x; the matvec prepares xb itself */
        TRY(kiln_cuda_residual_norm(x, y, pw, post_eps, NULL, NULL, eps, T, C, e->stream));
        CK(cudaMemcpyAsync(xb, x, sizeof(float) * (size_t)(T * C), cudaMemcpyDeviceToDevice, e->stream), "cudaMemcpyAsync (xb = x)");
    } else if ((T <= KILN_CUDA_MATVEC_MAX_T || (e->gemm_small_max && T <= KILN_CUDA_GEMM_SMALL_MAX_T)) && C % 32 == 0) {
        TRY(kiln_cuda_residual_norm_xp(x, y, pw, post_eps, xb, e->xp, nw, eps, T, C, e->stream));
        prepared(e, xb, T, C);
    } else {
        TRY(kiln_cuda_residual_norm(x, y, pw, post_eps, xb, nw, eps, T, C, e->stream));
    }
    return mark(e, P_NORM, KILN_OK);
}

static kiln_status cuda_qkv(void *p, float *q, float *k, float *v, const float *x, const kiln_weight *wq, const kiln_weight *wk,
                            const kiln_weight *wv, int64_t T) {
    engine *e = (engine *)p;
    const dev_wt *Q = (const dev_wt *)wq->impl, *K = (const dev_wt *)wk->impl, *V = (const dev_wt *)wv->impl;
    if (omitted(e, P_QKV, T)) return mark(e, P_QKV, KILN_OK);
    if (T == 1 && Q->n_merged == 2 && k == q + Q->q.rows && e->pair && kiln_cuda_matvec_pair_takes(&Q->qkv, &V->q)) {
        engine_pf_drop(e); /* q|k and v (Q4_K_M's q6_K) in one launch */
        kiln_cuda_mv_tail t = {};
        if (!take_pre(e, &t, x, &Q->qkv, 1)) TRY(prepare(e, x, 1, Q->qkv.cols));
        TRY(kiln_cuda_matvec_pair_pre(q, &Q->qkv, v, &V->q, e->xp, &t, e->stream));
        if (q == e->xp_of || v == e->xp_of) e->xp_of = NULL;
    } else if (T == 1 && Q->n_merged && k == q + Q->q.rows && v == k + K->q.rows) {
        TRY(mm(e, q, x, Q, &Q->qkv, 1, false));
        if (Q->n_merged == 2) TRY(mm(e, v, x, V, &V->q, 1, false));
    } else {
        TRY(mm(e, q, x, Q, &Q->q, T, false));
        TRY(mm(e, k, x, K, &K->q, T, false));
        TRY(mm(e, v, x, V, &V->q, T, false));
    }
    return mark(e, P_QKV, KILN_OK);
}

static const float *vec(const kiln_weight *w) { return w ? (const float *)w->impl : NULL; }

/* The attention's score scale: the model's, else 1/sqrt(head size). */
static float attn_scale(const kiln_attn_args *a) { return a->scale > 0 ? a->scale : 1.0f / sqrtf((float)a->HS); }

/* The bytes of one position's k and v rows in the cache types this step stores (the profile's attention bytes). */
static void note_kv_bytes(engine *e, const kiln_attn_args *a) {
    e->kv_pos_bytes = kiln_kv_row_bytes(a->type_k, a->NKV * a->HS) + kiln_kv_row_bytes(a->type_v, a->NKV * a->HS);
}

/* How many of the T rows from row r one attention launch takes: one token of each of many sequences goes
 * decode_rows rows at a time (the workspace's size), one sequence's rows all at once. */
static int64_t attn_launch_rows(const engine *e, const kiln_attn_args *a, int64_t T, int64_t r) {
    const int64_t per = a->seq ? e->decode_rows : T;
    return T - r < per ? T - r : per;
}

static kiln_status cuda_qkv_post(void *p, float *q, float *k, float *v, const kiln_attn_args *a, const int32_t *pos0, int64_t T) {
    engine *e = (engine *)p;
    TRY(flush(e));
    e->xp_of = NULL;
    const bool full = a->q_norm && a->qk_norm_full; /* olmo2: a token's whole q and k are one norm row each */
    if (full) { /* the model refuses biases beside it, so the norm comes first here as it does on the CPU */
        TRY(kiln_cuda_residual_norm(q, NULL, NULL, 0.0f, q, vec(a->q_norm), a->eps, T, a->NH * a->HS, e->stream));
        TRY(kiln_cuda_residual_norm(k, NULL, NULL, 0.0f, k, vec(a->k_norm), a->eps, T, a->NKV * a->HS, e->stream));
    }
    const float *qn = full ? NULL : vec(a->q_norm), *kn = full ? NULL : vec(a->k_norm);
    note_kv_bytes(e, a);
    if (a->seq) /* one token of each of T sequences */
        return mark(e, P_QKV_POST,
                    kiln_cuda_qkv_post_rows(q, k, v, vec(a->bq), vec(a->bk), vec(a->bv), qn, kn, a->eps, pos0, a->seq, a->seq_stride,
                                            T, a->NH, a->NKV, a->HS, a->rope_dim, a->rope_base, a->rope_freq, a->rope_mscale,
                                            a->neox, a->nope, 1.0f, a->k_cache, a->v_cache, a->type_k, a->type_v, a->rows,
                                            e->stream));
    return mark(e, P_QKV_POST,
                kiln_cuda_qkv_post(q, k, v, vec(a->bq), vec(a->bk), vec(a->bv), qn, kn, a->eps, pos0, T, a->NH, a->NKV,
                                   a->HS, a->rope_dim, a->rope_base, a->rope_freq, a->rope_mscale, a->neox, a->nope, 1.0f,
                                   a->k_cache, a->v_cache, a->type_k, a->type_v, a->rows, e->stream));
}

/* Whether the attention of T rows also writes its output's prepared form for wo (nothing comes between them). */
static bool attn_writes_xp(const engine *e, const kiln_attn_args *a, int64_t T) {
    /* the rows of many sequences write it for gemm_small's T too, when one launch takes them all */
    const int64_t xp_rows = e->gemm_small_max ? KILN_CUDA_GEMM_SMALL_MAX_T : KILN_CUDA_MATVEC_MAX_T;
    return !e->m->cfg.output_gate && a->HS % 32 == 0 &&
           (a->seq ? T <= xp_rows && T <= e->decode_rows : T <= KILN_CUDA_MATVEC_MAX_T);
}

/* The attention writes its output's prepared form for wo too, where it can and nothing comes between. */
static kiln_status cuda_attention(void *p, float *out, float *q, const kiln_attn_args *a, const int32_t *pos0, int64_t T) {
    engine *e = (engine *)p;
    TRY(flush(e));
    const float scale = attn_scale(a);
    e->xp_of = NULL;
    const bool xp = attn_writes_xp(e, a, T);
    if (a->seq) { /* one token of each of T sequences, decode_rows of them per launch */
        const int64_t Q = a->NH * a->HS;
        for (int64_t r = 0, n; r < T; r += n) {
            n = attn_launch_rows(e, a, T, r);
            TRY(kiln_cuda_attention_rows(out + r * Q, xp ? e->xp : NULL, q + r * Q, a->k_cache, a->v_cache, a->type_k, a->type_v,
                                         pos0 + r, a->seq + r, a->seq_stride, n, a->NH, a->NKV, a->HS, a->window, a->rows,
                                         e->n_ctx, scale, a->softcap, e->attn_ws, e->stream));
        }
        if (xp) prepared(e, out, T, Q);
    } else if (xp) {
        TRY(kiln_cuda_attention_xp(out, e->xp, q, a->k_cache, a->v_cache, a->type_k, a->type_v, pos0, T, a->NH, a->NKV, a->HS, a->window, a->rows, e->n_ctx,
                                   scale, a->softcap, e->attn_ws, e->stream));
        prepared(e, out, T, a->NH * a->HS);
    } else {
        TRY(kiln_cuda_attention(out, q, a->k_cache, a->v_cache, a->type_k, a->type_v, pos0, T, a->NH, a->NKV, a->HS, a->window, a->rows, e->n_ctx, scale,
                                a->softcap, e->attn_ws, e->stream));
    }
    return mark(e, P_ATTN, KILN_OK);
}

/* qkv_post inside the decode attention (kiln_cuda_attention_post: one launch instead of two, three with a q8_0 or
 * q4_0 cache) where it takes the layer: one token, or one row each of many sequences; QK-norm only per head (not
 * olmo2's whole-row norm); any cache type. Else the two steps. */
static kiln_status cuda_qkv_attention(void *p, float *out, float *q, float *k, float *v, const kiln_attn_args *a, const int32_t *pos0,
                                      int64_t T) {
    engine *e = (engine *)p;
    TRY(flush(e));
    if (!e->fuse_post || ((a->q_norm || a->k_norm) && a->qk_norm_full) ||
        !kiln_cuda_attention_post_takes(T, a->seq != NULL, a->NH, a->NKV, a->HS, a->type_k, a->type_v, a->softcap)) {
        TRY(cuda_qkv_post(p, q, k, v, a, pos0, T));
        return cuda_attention(p, out, q, a, pos0, T);
    }
    const float scale = attn_scale(a);
    e->xp_of = NULL;
    note_kv_bytes(e, a);
    const bool xp = attn_writes_xp(e, a, T);
    const int64_t Q = a->NH * a->HS, KV = a->NKV * a->HS;
    if (omitted(e, P_ATTN, T)) {
        if (xp) prepared(e, out, T, Q);
        return mark(e, P_ATTN, KILN_OK);
    }
    for (int64_t r = 0, n; r < T; r += n) {
        n = attn_launch_rows(e, a, T, r);
        const kiln_cuda_attn_post post = {k + r * KV, v + r * KV, vec(a->bq), vec(a->bk), vec(a->bv), vec(a->q_norm), vec(a->k_norm),
                                          a->eps, a->rope_dim, a->rope_base, a->rope_mscale, a->rope_freq, a->neox, a->nope};
        TRY(kiln_cuda_attention_post(out + r * Q, xp ? e->xp : NULL, q + r * Q, &post, a->k_cache, a->v_cache, a->type_k, a->type_v,
                                     pos0 + r, a->seq ? a->seq + r : NULL, a->seq_stride, n, a->NH, a->NKV, a->HS, a->window,
                                     a->rows, e->n_ctx, scale, a->softcap, e->attn_ws, e->stream));
    }
    if (xp) prepared(e, out, T, Q);
    return mark(e, P_ATTN, KILN_OK);
}

static kiln_status cuda_sigmoid_mul(void *p, float *x, const float *g, int64_t n) {
    engine *e = (engine *)p;
    TRY(flush(e));
    e->xp_of = NULL;
    return mark(e, P_OTHER, kiln_cuda_sigmoid_mul(x, g, n, e->stream));
}

static kiln_status cuda_matmul(void *p, float *y, const float *x, const kiln_weight *W, int64_t T, bool add) {
    engine *e = (engine *)p;
    const dev_wt *D = (const dev_wt *)W->impl;
    if (omitted(e, D->cat, T)) return mark(e, D->cat, KILN_OK);
    return mark(e, D->cat, mm(e, y, x, D, &D->q, T, add));
}

/* In decode the GLU's tail prepares gate for the down projection. */
/* x += in W^T, then xb = rmsnorm(x) * w: in decode one matvec whose last CTA norms (its tail), else the two steps. */
static kiln_status cuda_matmul_norm(void *p, float *x, const float *in, const kiln_weight *W, float *xb, const kiln_weight *w,
                                    float eps, int64_t T, int64_t C) {
    engine *e = (engine *)p;
    const dev_wt *D = (const dev_wt *)W->impl;
    if (tail_fits(e, TAIL_NORM, &D->q, x, T) && D->q.rows == C && ((uintptr_t)xb & 15) == 0) {
        TRY(prepare(e, in, T, D->q.cols));
        kiln_cuda_mv_tail tail = {KILN_CUDA_TAIL_NORM, e->mv_cnt, e->xp_next, xb, (const float *)w->impl, eps};
        engine_pf_spans(e, &tail);
        TRY(kiln_cuda_matvec_tail(x, in, e->xp, &D->q, T, true, &tail, e->stream));
        prepared_next(e, xb, T, C);
        return mark(e, D->cat, KILN_OK);
    }
    TRY(cuda_matmul(p, x, in, W, T, true));
    return cuda_residual_norm(p, x, NULL, NULL, 0.0f, xb, w, eps, T, C);
}

static kiln_status cuda_ffn_up(void *p, float *gate, float *up, const float *x, const kiln_weight *wg, const kiln_weight *wu, int64_t T,
                               bool geglu) {
    engine *e = (engine *)p;
    const dev_wt *G = (const dev_wt *)wg->impl, *U = (const dev_wt *)wu->impl;
    if (omitted(e, P_FFN_UP, T)) return mark(e, P_FFN_UP, KILN_OK);
    if (T <= KILN_CUDA_MATVEC_MAX_T && G->q.type == U->q.type && (T <= e->mv_rows || !small_takes(e, &G->q, T))) {
        kiln_cuda_mv_tail tail = {};
        if (!take_pre(e, &tail, x, &G->q, T)) TRY(prepare(e, x, T, G->q.cols));
        engine_pf_spans(e, &tail);
        if (tail_fits(e, TAIL_PREPARE, &G->q, gate, T)) {
            tail.kind = KILN_CUDA_TAIL_PREPARE, tail.cnt = e->mv_cnt, tail.xp = e->xp_next;
            TRY(kiln_cuda_matvec_glu_tail(gate, x, e->xp, &G->q, &U->q, T, geglu, &tail, e->stream));
            prepared_next(e, gate, T, G->q.rows);
            return mark(e, P_FFN_UP, KILN_OK);
        }
        TRY(kiln_cuda_matvec_glu_tail(gate, x, e->xp, &G->q, &U->q, T, geglu, &tail, e->stream));
    } else {
        TRY(mm(e, gate, x, G, &G->q, T, false));
        TRY(mm(e, up, x, U, &U->q, T, false));
        TRY(kiln_cuda_glu(gate, gate, up, T * G->q.rows, geglu, e->stream));
    }
    if (gate == e->xp_of || up == e->xp_of) e->xp_of = NULL;
    return mark(e, P_FFN_UP, KILN_OK);
}

static kiln_status cuda_head(void *p, float *logits, const float *x, const kiln_weight *W, int64_t T, float scale, float cap) {
    engine *e = (engine *)p;
    const dev_wt *D = (const dev_wt *)W->impl;
    if (omitted(e, P_HEAD, T)) return mark(e, P_HEAD, KILN_OK);
    TRY(mm(e, logits, x, D, &D->q, T, false));
    if (scale != 1.0f || cap > 0) TRY(kiln_cuda_scale_softcap(logits, T * D->q.rows, scale, cap, e->stream));
    return mark(e, P_HEAD, KILN_OK);
}

static kiln_status cuda_argmax(void *p, int32_t *next, const float *x, int64_t n) {
    engine *e = (engine *)p;
    TRY(flush(e));
    return mark(e, P_HEAD, kiln_cuda_argmax(next, x, 1, n, e->stream));
}

/* *flag = code when some x (n) is a NaN or an infinity (exponent bits all set) and *flag is 0: a grid-stride pass
 * of one read per float, a few microseconds for a vocab's logits. */
#define NONFINITE_THREADS 256
__global__ void nonfinite_kernel(int32_t *flag, const float *x, int64_t n, int32_t code) {
    kiln_pdl_wait();
    kiln_pdl_trigger();
    bool bad = false;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n && !bad; i += stride)
        bad = (__float_as_uint(x[i]) & 0x7f800000u) == 0x7f800000u;
    if (__syncthreads_or(bad) && threadIdx.x == 0) atomicCAS(flag, 0, code);
}

static kiln_status cuda_nonfinite(void *p, int32_t *flag, const float *x, int64_t n, int32_t code) {
    engine *e = (engine *)p;
    TRY(flush(e));
    if (n <= 0) return KILN_OK;
    int64_t blocks = (n + NONFINITE_THREADS - 1) / NONFINITE_THREADS;
    if (blocks > 264) blocks = 264; /* two waves of the H200's 132 SMs; each thread then loops */
    const cudaError_t err = kiln_launch(nonfinite_kernel, dim3((unsigned)blocks), dim3(NONFINITE_THREADS), 0, e->stream, flag, x, n, code);
    return mark(e, P_HEAD, kiln_launch_status("nonfinite", err));
}

static kiln_status cuda_sample(void *p, int32_t *next, const float *x, int64_t n, const kiln_sample_args *args, void *work) {
    engine *e = (engine *)p;
    TRY(flush(e));
    return mark(e, P_HEAD, kiln_cuda_sample(next, x, n, args, work, e->stream));
}

extern "C" const kiln_backend kiln_cuda_backend = {
    /* .name = */ "cuda",
    /* .host_memory = */ false,
    /* .seq_rows = */ true,
    /* .open = */ cuda_open,
    /* .close = */ cuda_close,
    /* .load_weights = */ cuda_load_weights,
    /* .device_bytes = */ cuda_device_bytes,
    /* .alloc = */ cuda_alloc,
    /* .free = */ cuda_free,
    /* .alloc_host = */ cuda_alloc_host,
    /* .free_host = */ cuda_free_host,
    /* .upload = */ cuda_upload,
    /* .download = */ cuda_download,
    /* .synchronize = */ cuda_synchronize,
    /* .record = */ cuda_record,
    /* .profile = */ engine_profile,
    /* .embed = */ cuda_embed,
    /* .residual_norm = */ cuda_residual_norm,
    /* .qkv = */ cuda_qkv,
    /* .qkv_post = */ cuda_qkv_post,
    /* .attention = */ cuda_attention,
    /* .sigmoid_mul = */ cuda_sigmoid_mul,
    /* .matmul = */ cuda_matmul,
    /* .ffn_up = */ cuda_ffn_up,
    /* .head = */ cuda_head,
    /* .argmax = */ cuda_argmax,
    /* .nonfinite = */ cuda_nonfinite,
    /* .sample = */ cuda_sample,
    /* .sample_work_bytes = */ kiln_cuda_sample_work_bytes,
    /* .matmul_norm = */ cuda_matmul_norm,
    /* .prefetch = */ engine_prefetch,
    /* .qkv_attention = */ cuda_qkv_attention,
};
