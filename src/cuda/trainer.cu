/* trainer.cu: a llama model being trained on the GPU (issue #8): the forward, loss and backward over
 * kiln_llama_train's layout with the kernels of train_kernels.h, and the fused AdamW. This is the GPU's own
 * orchestration, beside the CPU's in src/train/llama_train.c (as llm.c keeps train_gpt2.cu beside train_gpt2.c):
 * it differs in precision (bf16 activations and matmul inputs) and in its fusions, and tests/test_cuda_train.c
 * holds the two against each other. The model's flat buffers live on the device only: fp32 master params, fp32
 * grads, fp32 moments, the bf16 mirror the matmuls read. The activations of a B x T batch are saved per layer
 * (llm.c's mixed precision, train_kernels.h):
 *   x    (N, C) f32   the layer's residual input        ln1 (N, C) bf16, rstd1 (N) f32
 *   qkv  (N, Q + 2 KV) bf16, q and k roped in place      att (N, Q) bf16, lse (B, NH, T) f32
 *   mid  (N, C) f32   x + wo(att)                        ln2 (N, C) bf16, rstd2 (N) f32
 *   gu   (N, 2F) bf16 gate | up                          h   (N, F) bf16 silu(gate) * up
 * then xL (N, C) f32, lnf (N, C) bf16, rstdf (N). The residual add rides in the next norm kernel (x += y before
 * the norm), and wq|wk|wv and w_gate|w_up, adjacent in the flat buffer, are one matmul each. The classifier runs
 * over chunks of rows: logits (rows, V) bf16 -> cross-entropy -> dlogits bf16 over them -> the head's backward, so
 * no (N, V) tensor exists. Gradient buffers: dx (N, C) f32 the residual gradient and dxb (N, max(C, Q)) bf16 its
 * copy that the norm backward writes for the next matmul, dln (N, C) f32, dqkv (N, Q + 2 KV) f32 and its bf16 form,
 * dh (N, F) bf16, dgu (N, 2F) bf16 (also d att, which has its own buffer beside the weight gradients' stream: on one
 * GPU the backward's dW matmuls run on a second stream, dw_rows below). With KILN_CUDA_TRAIN_RECOMPUTE, ln1, ln2 and h are one shared
 * copy that each layer's backward first recomputes from x, mid (with their rstd) and gu. Every matmul output that
 * only feeds another kernel is bf16, as in llm.c: the bytes the memory-bound kernels move are what the step's
 * non-GEMM time is made of.
 *
 * tests/test_cuda_train.c checks it against the CPU trainer (one step's loss and every parameter gradient, two
 * accumulated micro-batches, two classifier chunks, ten AdamW steps, the options' bits), tests/test_train.c a
 * bit-exact resume; both pass on the H200 (docs/cuda/train_tests*.txt). The data-parallel paths (dist, issue #9):
 * tests/test_train.c's test_cli_data_parallel (2 GPUs against 1, with and without ZeRO-1, and a ZeRO-1 resume),
 * passing on two H200s (docs/cuda/dist_tests.txt). */
#include "cuda/cuda.h"
#include "cuda/dist.h"
#include "cuda/train_kernels.h"
#include "train/llama_train.h"
#include "train/optim.h"

#include <cuda_runtime.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "status.h"

#define CK(call, what)                                                                                           \
    do {                                                                                                         \
        cudaError_t e_ = (call);                                                                                 \
        if (e_ != cudaSuccess) return kiln_fail(KILN_ERR_IO, "CUDA %s failed: %s", what, cudaGetErrorString(e_)); \
    } while (0)

static_assert(KILN_CUDA_ADAMW8_BLOCK == KILN_ADAMW8_BLOCK, "the GPU's 8-bit AdamW blocks are optim.c's");

#define HEAD_CHUNK 4096 /* rows of logits at a time: 4096 x 32000 bf16 = 250 MiB */

typedef struct {
    float *x, *rstd1, *lse, *mid, *rstd2;   /* f32 */
    kiln_bf16_t *ln1, *qkv, *att, *ln2, *gu, *h; /* bf16 */
} layer_acts;

struct kiln_cuda_trainer {
    const kiln_llama_train *m; /* config and tensor table (host) */
    int64_t B, T, N, n;        /* n parameters */
    cudaStream_t stream;
    kiln_cuda_blas *blas;
    float *params, *grads, *am, *av; /* (n) each: master, gradient, AdamW moments (fp32; NULL with 8-bit moments) */
    bool eight_bit;                   /* 8-bit AdamW: q holds the moments (shard each, scales shard / 256) */
    kiln_cuda_adam8 q;
    kiln_bf16_t *mirror;              /* (n) */
    uint8_t *decay;                   /* (n) 1 where weight decay applies */
    int32_t *ids, *targets;           /* (N) */
    layer_acts *layers;               /* (L) */
    float *xL, *rstdf;                /* (N, C), (N) */
    kiln_bf16_t *lnf;                 /* (N, C) */
    kiln_bf16_t *logits;              /* (HEAD_CHUNK, V): the logits, then their gradient in place */
    float *losses;                    /* (N) */
    float *dx, *dln, *dqkv;           /* (N, C), (N, C), (N, Q + 2 KV) */
    kiln_bf16_t *dxb, *dqkvb, *dgu, *dh; /* (N, max(C, Q)), (N, Q + 2 KV), (N, 2F), (N, F) */
    void *ws;                         /* the largest kernel workspace */
    size_t ws_bytes;
    float *d_norm;                    /* (1) */
    int32_t *d_skipped, *d_embed_skipped;
    void *buf;                        /* every activation and buffer above, one allocation */
    size_t bytes;                     /* device bytes held */
    int64_t opt_step;                 /* AdamW updates applied */
    int64_t embed_skipped0;           /* skipped embedding-gradient rows before this trainer (a resume's count) */
    bool mirror_stale;                /* params were written: the mirror is refreshed before the next step or update */
    int gathered;                     /* ZeRO-1: the part whose full copy kiln_cuda_trainer_gather left readable, or -1 */
    float *h_losses;                  /* (N) pinned */
    bool deterministic;               /* attention backward: same bits every run (true) or dq by atomics */
    bool recompute;                   /* ln1, ln2, h: one shared copy, recomputed per layer in the backward */
    /* data parallel (kiln_dist): n_pad = n rounded up to a multiple of 64 world; params, grads, mirror and decay have
     * n_pad elements (the pad stays zero). Without ZeRO-1 every rank holds all moments (n) and the gradients are
     * all-reduced in buckets (a layer each, the head, the embedding) on the comm stream as soon as the backward has
     * finished them; with ZeRO-1 rank r holds the moments of shard [r S, r S + S), S = n_pad / world: each bucket
     * is summed into the ranks that own its parts (grouped reduces) during the backward, each rank updates its
     * shard and the bf16 mirror of it, the mirror is all-gathered, and so are the fp32 masters of the tensors the
     * forward reads in fp32 (the embedding and the norms). A rank's fp32 masters outside its shard are otherwise
     * stale: get_state and download gather them first. */
    kiln_dist *dist;                  /* NULL: one GPU */
    int rank, world;
    bool zero1;
    int64_t n_pad, shard;             /* shard: S with ZeRO-1, else n_pad */
    cudaStream_t comm;                /* the collectives' stream */
    cudaEvent_t *ev;                  /* (L + 3) bucket-ready events, then the comm-done event */
    bool reduce_next;                 /* the next step is the last micro-batch: reduce its buckets during its backward */
    bool reduced;                     /* the grads are already reduced for this optimizer step */
    double *d_red;                    /* (4) device doubles for the loss and flag collectives; d_red[3] the sum of squares */
    /* the weight check before each update (kiln_cuda_adamw_check): one segment per tensor, in the indices of the
     * range this rank updates (its ZeRO-1 shard, else the whole buffer); one allocation */
    int n_seg;
    int64_t n_chunks;                 /* the check's blocks: each segment in KILN_CUDA_ADAMW_CHECK_CHUNK pieces */
    int64_t *d_seg;                   /* (n_seg, 2) first element, length */
    double *d_wpartial;               /* (n_chunks) */
    double *d_wsumsq;                 /* (n_seg) the would-be weights' sums of squares */
    double *h_wsumsq;                 /* (n_seg) pinned: the step's one read of them */
    kiln_cuda_adamw_max *d_max;       /* (1) what the last applied update wrote: the check's bound (train_kernels.h) */
    bool max_known;                   /* d_max describes the weights and moments (not before the first update or
                                       * after a write) */
    bool bound;                       /* the check may take the bound (KILN_ADAMW_BOUND=0: never, to measure it) */
    /* The weight gradients' stream (one GPU; KILN_TRAIN_DW_STREAM=0 turns it off). The backward's dW += dy^T x matmuls
     * are off its critical path: nothing but the optimizer reads a gradient. So each runs on `side`, forked from the
     * compute stream once its dy is ready, beside the dx matmuls and the memory-bound kernels that follow, and the
     * compute stream waits for it only before it overwrites that dy (or, with recompute, the shared activations).
     * Roles: 0 down, 1 gate|up, 2 o, 3 qkv, 4 and 5 the classifier's even and odd chunks (their logits alternate
     * between two buffers, so a chunk's dW runs beside the next chunk's logits and cross-entropy); fork_ev marks dy
     * ready, join_ev[r] role r's last dW done. The compute stream has the higher priority, so its kernels take SMs
     * first and the dW matmuls fill what they leave. Every buffer is read and written in the same order as on one
     * stream: the same bits. */
    bool dw_side;
    cudaStream_t side;
    kiln_cuda_blas *blas_side;
    cudaEvent_t fork_ev, join_ev[6];
    kiln_bf16_t *datt; /* (N, Q) d att: its own buffer beside the side stream (dW of gate|up may still read dgu) */
};

static size_t al(size_t n) { return (n + 255) & ~(size_t)255; }

/* The next `bytes` of the one activation allocation at *p (256-byte aligned). */
static void *carve(char **p, size_t bytes) {
    void *at = *p;
    *p += al(bytes);
    return at;
}

#define PEER_TIMEOUT_S 900.0 /* data parallel: a step that waits this long on its peers gives up */

/* Waits for the trainer's stream. Data parallel, it polls instead of blocking, asking NCCL for asynchronous errors
 * between polls, so a peer that died fails this rank (within PEER_TIMEOUT_S at worst, for the transports that
 * cannot notice a dead peer) instead of leaving it blocked in a collective forever. */
static kiln_status wait_stream(kiln_cuda_trainer *t, const char *what) {
    if (!t->dist) {
        const cudaError_t e = cudaStreamSynchronize(t->stream);
        return e == cudaSuccess ? KILN_OK : kiln_fail(KILN_ERR_IO, "CUDA %s failed: %s", what, cudaGetErrorString(e));
    }
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (unsigned spin = 0;; spin++) {
        const cudaError_t e = cudaStreamQuery(t->stream);
        if (e == cudaSuccess) return KILN_OK;
        if (e != cudaErrorNotReady) return kiln_fail(KILN_ERR_IO, "CUDA %s failed: %s", what, cudaGetErrorString(e));
        kiln_status s = kiln_dist_check(t->dist);
        if (s != KILN_OK) return s;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if ((double)(now.tv_sec - t0.tv_sec) + 1e-9 * (double)(now.tv_nsec - t0.tv_nsec) > PEER_TIMEOUT_S)
            return kiln_fail(KILN_ERR_IO, "rank %d: %s waited %.0f s for the other ranks; a peer has stopped", t->rank, what, PEER_TIMEOUT_S);
        if (spin > 64) { /* a short spin first: most waits end within a step's tail */
            const struct timespec nap = {0, 100000};
            nanosleep(&nap, NULL);
        }
    }
}

extern "C" void kiln_cuda_trainer_free(kiln_cuda_trainer *t) {
    if (!t) return;
    if (t->ev)
        for (int64_t i = 0; i < t->m->cfg.n_layer + 3; i++)
            if (t->ev[i]) cudaEventDestroy(t->ev[i]);
    free(t->ev);
    if (t->comm) cudaStreamDestroy(t->comm);
    if (t->fork_ev) cudaEventDestroy(t->fork_ev);
    for (int r = 0; r < 6; r++)
        if (t->join_ev[r]) cudaEventDestroy(t->join_ev[r]);
    if (t->side) cudaStreamDestroy(t->side);
    kiln_cuda_blas_free(t->blas_side);
    kiln_cuda_blas_free(t->blas);
    cudaFree(t->params);
    cudaFree(t->buf);
    cudaFree(t->d_seg);
    cudaFreeHost(t->h_losses);
    cudaFreeHost(t->h_wsumsq);
    if (t->stream) cudaStreamDestroy(t->stream);
    free(t->layers);
    free(t);
}

/* The weight check's segments: each tensor's part of the range [o, o + shard) this rank updates, relative to o. */
static kiln_status check_setup(kiln_cuda_trainer *t) {
    const int n_seg = t->m->n_tensors;
    const int64_t o = t->zero1 ? (int64_t)t->rank * t->shard : 0, end = o + t->shard;
    if (n_seg < 1 || n_seg > 65535) return kiln_fail(KILN_ERR_UNSUPPORTED, "gpu train: %d tensors (the weight check takes 1..65535)", n_seg);
    int64_t *h_seg = (int64_t *)malloc((size_t)n_seg * 2 * sizeof *h_seg);
    if (!h_seg) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n_seg; i++) {
        const kiln_train_tensor *ts = &t->m->tensors[i];
        const int64_t lo = ts->offset > o ? ts->offset : o, hi = ts->offset + ts->n < end ? ts->offset + ts->n : end;
        h_seg[2 * i] = hi > lo ? lo - o : 0;
        h_seg[2 * i + 1] = hi > lo ? hi - lo : 0;
    }
    const int64_t n_chunks = kiln_cuda_adamw_check_chunks(h_seg, n_seg);
    const size_t seg_bytes = al((size_t)n_seg * 2 * sizeof(int64_t)), part_bytes = al((size_t)(n_chunks ? n_chunks : 1) * 8);
    char *p = NULL;
    const size_t sums_bytes = al((size_t)n_seg * 8), all = seg_bytes + part_bytes + sums_bytes + sizeof(kiln_cuda_adamw_max);
    cudaError_t e = cudaMalloc((void **)&p, all);
    if (e == cudaSuccess) {
        t->d_seg = (int64_t *)p, t->d_wpartial = (double *)(p + seg_bytes), t->d_wsumsq = (double *)(p + seg_bytes + part_bytes);
        t->d_max = (kiln_cuda_adamw_max *)(p + seg_bytes + part_bytes + sums_bytes);
        t->n_seg = n_seg, t->n_chunks = n_chunks;
        e = cudaMallocHost((void **)&t->h_wsumsq, (size_t)n_seg * 8);
    }
    if (e == cudaSuccess) e = cudaMemcpyAsync(t->d_seg, h_seg, (size_t)n_seg * 2 * sizeof *h_seg, cudaMemcpyHostToDevice, t->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(t->stream); /* before h_seg goes */
    free(h_seg);
    if (e != cudaSuccess) return kiln_fail(KILN_ERR_NOMEM, "gpu train: the weight check's buffers: %s", cudaGetErrorString(e));
    t->bytes += all;
    return KILN_OK;
}

extern "C" kiln_status kiln_cuda_trainer_new(const kiln_llama_train *m, int64_t B, int64_t T, unsigned flags, struct kiln_dist *dist,
                                              kiln_cuda_trainer **out) {
    *out = NULL;
    const kiln_llama_config *c = &m->cfg;
    const int64_t N = B * T, C = c->n_embd, NH = c->n_head, NKV = c->n_head_kv, HS = c->head_dim, F = c->n_ff, V = c->n_vocab;
    const int64_t Q = NH * HS, KV = NKV * HS, QKV = Q + 2 * KV, L = c->n_layer;
    TRY(kiln_cuda_check_device());
    if (B <= 0 || T <= 0 || T > c->n_ctx_train)
        return kiln_fail(KILN_ERR_INVALID, "gpu train: batch B=%lld T=%lld is invalid (T must be 1..%lld)", (long long)B, (long long)T,
                         (long long)c->n_ctx_train);
    if (c->rope_neox || c->rope_dim != HS || c->qkv_bias || c->qk_norm || c->sandwich_norm || c->geglu || c->output_gate)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "gpu train: only the plain llama architecture is trained");
    if (HS % 8 || HS > 256 || B > 65535) /* the attention kernels' limits, refused before anything is allocated */
        return kiln_fail(KILN_ERR_UNSUPPORTED, "gpu train: head size %lld (a multiple of 8 up to 256) or B=%lld (at most 65535)",
                         (long long)HS, (long long)B);
    if (Q > 2 * F) /* the backward keeps d att (N, Q) bf16 in the (N, 2F) buffer of d gate|up */
        return kiln_fail(KILN_ERR_UNSUPPORTED, "gpu train: NH*HS %lld wider than 2*F %lld", (long long)Q, (long long)(2 * F));
    /* wq|wk|wv and w_gate|w_up are adjacent in the flat buffer: one matmul each */
    for (int64_t l = 0; l < L; l++) {
        const kiln_train_layer *w = &m->layers[l];
        const kiln_train_tensor *ts = m->tensors;
        if (ts[w->wk].offset != ts[w->wq].offset + Q * C || ts[w->wv].offset != ts[w->wk].offset + KV * C ||
            ts[w->w_up].offset != ts[w->w_gate].offset + F * C)
            return kiln_fail(KILN_ERR_INVALID, "gpu train: layer %lld's projections are not adjacent in the parameter buffer", (long long)l);
    }
    const int64_t chunk = N < HEAD_CHUNK ? N : HEAD_CHUNK;
    const size_t f4 = 4, b2 = 2;
    const int world = dist ? kiln_dist_world(dist) : 1;
    const bool zero1 = world > 1 && (flags & KILN_CUDA_TRAIN_ZERO1) != 0;
    /* shards of a multiple of 64 elements, so every rank's slice keeps the 16-byte alignment of the vector paths */
    /* 8-bit moments: shards of whole KILN_ADAMW8_BLOCK blocks, so a rank's scales are its blocks' */
    const bool eight = (flags & KILN_CUDA_TRAIN_ADAM8) != 0;
    const int64_t n = m->n_params, unit = world > 1 ? (eight ? KILN_ADAMW8_BLOCK : 64) * (int64_t)world : 1;
    const int64_t n_pad = (n + unit - 1) / unit * unit, shard = zero1 ? n_pad / world : n_pad;
    /* per layer: x, mid (N C f32), rstd1, rstd2 (N), lse (N NH), gu (N 2F bf16), ln1, ln2 (N C bf16), qkv (N QKV
     * bf16), att (N Q bf16), h (N F bf16) */
    /* with recompute, ln1, ln2 and h are one shared copy (counted once, after the layers) */
    const bool recompute = (flags & KILN_CUDA_TRAIN_RECOMPUTE) != 0;
    const size_t saved_bytes = 2 * al((size_t)(N * C) * b2) + al((size_t)(N * F) * b2); /* ln1, ln2, h */
    const size_t layer_bytes = 2 * al((size_t)(N * C) * f4) + 2 * al((size_t)N * f4) + al((size_t)(N * NH) * f4) +
                               al((size_t)(N * 2 * F) * b2) + al((size_t)(N * QKV) * b2) + al((size_t)(N * Q) * b2) +
                               (recompute ? 0 : saved_bytes);
    size_t ws = kiln_cuda_adamw_ws_bytes(n_pad);
    const size_t ws_att = kiln_cuda_attention_backward_ws_bytes(B, T, NH), ws_norm = kiln_cuda_rmsnorm_backward_ws_bytes(N, C);
    const size_t ws_emb = kiln_cuda_embed_backward_det_ws_bytes(N, V);
    if (ws_att > ws) ws = ws_att;
    if (ws_norm > ws) ws = ws_norm;
    if (ws_emb > ws) ws = ws_emb;
    const int64_t wide = C > Q ? C : Q;
    /* the weight gradients' stream (the struct says how), on one GPU unless KILN_TRAIN_DW_STREAM=0; read per trainer */
    const char *dws = getenv("KILN_TRAIN_DW_STREAM");
    const bool dw_side = world <= 1 && !(dws && strcmp(dws, "0") == 0);
    const int n_logits = dw_side && N > chunk ? 2 : 1; /* logits buffers */
    const size_t buf_bytes = (dw_side ? al((size_t)(N * Q) * b2) : 0) + (size_t)(n_logits - 1) * al((size_t)(chunk * V) * b2) +
                             (size_t)L * layer_bytes + (recompute ? saved_bytes : 0) + al((size_t)(N * C) * f4) + al((size_t)N * f4) + al((size_t)(N * C) * b2) +
                             al((size_t)(chunk * V) * b2) + al((size_t)N * f4) + 2 * al((size_t)(N * C) * f4) +
                             al((size_t)(N * QKV) * f4) + al((size_t)(N * wide) * b2) + al((size_t)(N * QKV) * b2) +
                             al((size_t)(N * 2 * F) * b2) + al((size_t)(N * F) * b2) + al(ws) + 2 * al((size_t)N * 4) + al(64) +
                             (size_t)n_pad;
    /* params, grads (n_pad f32), m, v (shard f32 each), mirror (n_pad bf16); 8-bit: params, grads, mirror, then m8, v8
     * (shard bytes each) and the two scales (shard / 256 f32 each) */
    const int64_t shard_blocks = (shard + KILN_ADAMW8_BLOCK - 1) / KILN_ADAMW8_BLOCK;
    const size_t param_bytes = eight ? al((size_t)n_pad * (2 * f4 + b2)) + 2 * al((size_t)shard) + 2 * al((size_t)shard_blocks * f4)
                                     : (size_t)n_pad * (2 * f4 + b2) + (size_t)shard * 2 * f4;
    size_t free_b = 0, total_b = 0;
    CK(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
    const size_t need = buf_bytes + param_bytes + (dw_side ? 2 : 1) * kiln_cuda_blas_bytes();
    /* NCCL connects lazily and allocates its buffers at the first collective: 1 GiB more headroom for it */
    const size_t margin = ((size_t)256 << 20) + (world > 1 ? ((size_t)1 << 30) : 0);
    if (need + margin > free_b)
        return kiln_fail(KILN_ERR_NOMEM, "gpu train: B=%lld T=%lld needs %.2f GiB of GPU memory (activations %.2f, parameters and state %.2f) "
                         "but %.2f GiB of %.2f is free", (long long)B, (long long)T, need / 1073741824.0, buf_bytes / 1073741824.0,
                         param_bytes / 1073741824.0, free_b / 1073741824.0, total_b / 1073741824.0);

    kiln_cuda_trainer *t = (kiln_cuda_trainer *)calloc(1, sizeof *t);
    if (!t) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    t->m = m, t->B = B, t->T = T, t->N = N, t->n = n, t->bytes = need;
    t->dist = world > 1 ? dist : NULL, t->world = world, t->rank = dist ? kiln_dist_rank(dist) : 0, t->zero1 = zero1;
    t->n_pad = n_pad, t->shard = shard;
    t->embed_skipped0 = m->n_embed_skipped;
    t->gathered = -1;
    const char *bound = getenv("KILN_ADAMW_BOUND");
    t->bound = !(bound && strcmp(bound, "0") == 0);
    /* On wgmma (head size 64) the deterministic backward (both its kernels on wgmma, the heavy tiles first) is also
     * the faster one (kiln bench gpu-kernels --attention, docs/cuda.md), so every run takes it there;
     * KILN_ATTN_ATOMIC=1 keeps dq by atomics without --deterministic, to time the step both ways */
    const char *atomic = getenv("KILN_ATTN_ATOMIC");
    t->deterministic = (flags & KILN_CUDA_TRAIN_DETERMINISTIC) != 0 ||
                       (HS == 64 && kiln_cuda_attention_wgmma(64) && !(atomic && strcmp(atomic, "1") == 0));
    t->recompute = recompute;
    t->eight_bit = eight;
    t->layers = (layer_acts *)calloc((size_t)L, sizeof *t->layers);
    kiln_status st = t->layers ? KILN_OK : kiln_fail(KILN_ERR_NOMEM, "out of memory");
    cudaError_t e = cudaSuccess;
    /* with the side stream, the compute stream has the greatest priority and the side the least */
    int prio_least = 0, prio_greatest = 0;
    const char *prio = getenv("KILN_TRAIN_DW_PRIO"); /* =0: both streams at the default priority, to measure it */
    if (dw_side && !(prio && strcmp(prio, "0") == 0) && cudaDeviceGetStreamPriorityRange(&prio_least, &prio_greatest) != cudaSuccess)
        prio_least = prio_greatest = 0;
    if (!st && ((e = cudaStreamCreateWithPriority(&t->stream, cudaStreamNonBlocking, prio_greatest)) != cudaSuccess ||
                (e = cudaMalloc((void **)&t->params, param_bytes)) != cudaSuccess || (e = cudaMalloc(&t->buf, buf_bytes)) != cudaSuccess ||
                (e = cudaMallocHost((void **)&t->h_losses, (size_t)N * f4)) != cudaSuccess))
        st = kiln_fail(KILN_ERR_NOMEM, "gpu train: allocating %.2f GiB failed: %s", need / 1073741824.0, cudaGetErrorString(e));
    if (!st) st = kiln_cuda_blas_new(&t->blas);
    if (!st && dw_side) {
        t->dw_side = true;
        st = kiln_cuda_blas_new(&t->blas_side);
        if (!st && (e = cudaStreamCreateWithPriority(&t->side, cudaStreamNonBlocking, prio_least)) != cudaSuccess)
            st = kiln_fail(KILN_ERR_IO, "gpu train: a stream for the weight gradients: %s", cudaGetErrorString(e));
        for (int r = -1; !st && r < 6; r++)
            if ((e = cudaEventCreateWithFlags(r < 0 ? &t->fork_ev : &t->join_ev[r], cudaEventDisableTiming)) != cudaSuccess)
                st = kiln_fail(KILN_ERR_IO, "gpu train: events for the weight gradients: %s", cudaGetErrorString(e));
        /* the side's matmuls are chosen for half the SMs (cuBLASLt's SM count target), so they leave room for the
         * compute stream's kernels: measured on an H100 against the whole GPU and 33, 50, 80 SMs (docs/cuda.md).
         * KILN_TRAIN_DW_SMS=n picks n instead (0: the whole GPU). */
        const char *sms = getenv("KILN_TRAIN_DW_SMS");
        int dev = 0, n_sm = 0;
        if (!st && !sms && cudaGetDevice(&dev) == cudaSuccess &&
            cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess)
            kiln_cuda_blas_sm_target(t->blas_side, n_sm / 2);
        if (!st && sms) kiln_cuda_blas_sm_target(t->blas_side, atoi(sms));
    }
    if (!st && t->dist) { /* the comm stream and its events */
        t->ev = (cudaEvent_t *)calloc((size_t)(L + 3), sizeof *t->ev);
        if (!t->ev) st = kiln_fail(KILN_ERR_NOMEM, "out of memory");
        if (!st && (e = cudaStreamCreateWithFlags(&t->comm, cudaStreamNonBlocking)) != cudaSuccess)
            st = kiln_fail(KILN_ERR_IO, "gpu train: a stream for the collectives: %s", cudaGetErrorString(e));
        for (int64_t i = 0; !st && i < L + 3; i++)
            if ((e = cudaEventCreateWithFlags(&t->ev[i], cudaEventDisableTiming)) != cudaSuccess)
                st = kiln_fail(KILN_ERR_IO, "gpu train: events for the collectives: %s", cudaGetErrorString(e));
    }
    if (st) {
        kiln_cuda_trainer_free(t);
        return st;
    }
    /* parameter state: params, grads (n_pad), m, v (shard) (f32) then the mirror (bf16, n_pad), one allocation */
    t->grads = t->params + n_pad;
    if (!eight) {
        t->am = t->grads + n_pad, t->av = t->am + shard;
        t->mirror = (kiln_bf16_t *)(t->av + shard);
    } else {
        t->mirror = (kiln_bf16_t *)(t->grads + n_pad);
        char *q = (char *)t->params + al((size_t)n_pad * (2 * f4 + b2));
        t->q.m8 = (int8_t *)q, q += al((size_t)shard);
        t->q.v8 = (uint8_t *)q, q += al((size_t)shard);
        t->q.m_scale = (float *)q, q += al((size_t)shard_blocks * f4);
        t->q.v_scale = (float *)q;
    }
    char *p = (char *)t->buf;
    if (dw_side) t->datt = (kiln_bf16_t *)carve(&p, (size_t)(N * Q) * sizeof(kiln_bf16_t));
    for (int64_t l = 0; l < L; l++) {
        layer_acts *a = &t->layers[l];
        a->x = (float *)carve(&p, (size_t)(N * C) * sizeof(float));
        a->mid = (float *)carve(&p, (size_t)(N * C) * sizeof(float));
        a->rstd1 = (float *)carve(&p, (size_t)N * sizeof(float));
        a->rstd2 = (float *)carve(&p, (size_t)N * sizeof(float));
        a->lse = (float *)carve(&p, (size_t)(N * NH) * sizeof(float));
        a->gu = (kiln_bf16_t *)carve(&p, (size_t)(N * 2 * F) * sizeof(kiln_bf16_t));
        a->qkv = (kiln_bf16_t *)carve(&p, (size_t)(N * QKV) * sizeof(kiln_bf16_t));
        a->att = (kiln_bf16_t *)carve(&p, (size_t)(N * Q) * sizeof(kiln_bf16_t));
        if (!recompute || l == 0) {
            a->ln1 = (kiln_bf16_t *)carve(&p, (size_t)(N * C) * sizeof(kiln_bf16_t));
            a->ln2 = (kiln_bf16_t *)carve(&p, (size_t)(N * C) * sizeof(kiln_bf16_t));
            a->h = (kiln_bf16_t *)carve(&p, (size_t)(N * F) * sizeof(kiln_bf16_t));
        } else { /* every layer writes the shared copy in the forward; the backward recomputes it per layer */
            a->ln1 = t->layers[0].ln1, a->ln2 = t->layers[0].ln2, a->h = t->layers[0].h;
        }
    }
    t->xL = (float *)carve(&p, (size_t)(N * C) * sizeof(float));
    t->rstdf = (float *)carve(&p, (size_t)N * sizeof(float));
    t->lnf = (kiln_bf16_t *)carve(&p, (size_t)(N * C) * sizeof(kiln_bf16_t));
    t->logits = (kiln_bf16_t *)carve(&p, (size_t)(n_logits * chunk * V) * sizeof(kiln_bf16_t));
    t->losses = (float *)carve(&p, (size_t)N * sizeof(float));
    t->dx = (float *)carve(&p, (size_t)(N * C) * sizeof(float));
    t->dln = (float *)carve(&p, (size_t)(N * C) * sizeof(float));
    t->dqkv = (float *)carve(&p, (size_t)(N * QKV) * sizeof(float));
    t->dxb = (kiln_bf16_t *)carve(&p, (size_t)(N * wide) * sizeof(kiln_bf16_t));
    t->dqkvb = (kiln_bf16_t *)carve(&p, (size_t)(N * QKV) * sizeof(kiln_bf16_t));
    t->dgu = (kiln_bf16_t *)carve(&p, (size_t)(N * 2 * F) * sizeof(kiln_bf16_t));
    t->dh = (kiln_bf16_t *)carve(&p, (size_t)(N * F) * sizeof(kiln_bf16_t));
    t->ws = p, t->ws_bytes = ws, p += al(ws);
    t->ids = (int32_t *)carve(&p, (size_t)N * sizeof(int32_t));
    t->targets = (int32_t *)carve(&p, (size_t)N * sizeof(int32_t));
    t->d_norm = (float *)p, t->d_skipped = (int32_t *)(p + 4), t->d_embed_skipped = (int32_t *)(p + 8);
    t->d_red = (double *)(p + 16), p += al(64);
    t->decay = (uint8_t *)p;
    /* the master weights (when the host model has them) and the decay mask from the tensor table; grads and moments
     * zero; the mirror from params */
    uint8_t *h_decay = (uint8_t *)calloc((size_t)n_pad, 1);
    if (!h_decay) {
        kiln_cuda_trainer_free(t);
        return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < m->n_tensors; i++)
        if (m->tensors[i].decay) memset(h_decay + m->tensors[i].offset, 1, (size_t)m->tensors[i].n);
    /* everything on the trainer's stream: it is non-blocking, so it would not wait for the legacy default stream */
    e = cudaMemsetAsync(t->params, 0, param_bytes, t->stream); /* the pad, grads and moments zero */
    if (e == cudaSuccess && m->params) e = cudaMemcpyAsync(t->params, m->params, (size_t)n * f4, cudaMemcpyHostToDevice, t->stream);
    if (e == cudaSuccess) e = cudaMemcpyAsync(t->decay, h_decay, (size_t)n_pad, cudaMemcpyHostToDevice, t->stream);
    if (e == cudaSuccess) e = cudaMemsetAsync(t->d_norm, 0, 64, t->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(t->stream); /* before h_decay goes */
    free(h_decay);
    if (e != cudaSuccess) {
        kiln_cuda_trainer_free(t);
        return kiln_fail(KILN_ERR_IO, "gpu train: upload failed: %s", cudaGetErrorString(e));
    }
    if ((st = kiln_cuda_to_bf16(t->mirror, t->params, n_pad, t->stream)) || (e = cudaStreamSynchronize(t->stream)) != cudaSuccess) {
        kiln_cuda_trainer_free(t);
        return st ? st : kiln_fail(KILN_ERR_IO, "gpu train: mirror failed: %s", cudaGetErrorString(e));
    }
    if ((st = check_setup(t))) {
        kiln_cuda_trainer_free(t);
        return st;
    }
    *out = t;
    return KILN_OK;
}

extern "C" size_t kiln_cuda_trainer_bytes(const kiln_cuda_trainer *t) { return t->bytes; }

/* ---------------------------------------------------------------- forward, loss, backward */

static const kiln_bf16_t *W(const kiln_cuda_trainer *t, int idx) { return t->mirror + t->m->tensors[idx].offset; }
static float *P(const kiln_cuda_trainer *t, int idx) { return t->params + t->m->tensors[idx].offset; }
static float *G(const kiln_cuda_trainer *t, int idx) { return t->grads + t->m->tensors[idx].offset; }

static kiln_status forward(kiln_cuda_trainer *t) {
    const kiln_llama_train *m = t->m;
    const kiln_llama_config *c = &m->cfg;
    const int64_t B = t->B, T = t->T, N = t->N, C = c->n_embd, NH = c->n_head, NKV = c->n_head_kv, HS = c->head_dim, F = c->n_ff;
    const int64_t Q = NH * HS, KV = NKV * HS, QKV = Q + 2 * KV, L = c->n_layer;
    void *s = t->stream;
    TRY(kiln_cuda_embed_forward_train(t->layers[0].x, P(t, m->tok_embd), t->ids, N, C, s));
    /* the first norm has no residual to add; every later one adds the block output it follows */
    TRY(kiln_cuda_rmsnorm_forward_train(t->layers[0].x, NULL, t->layers[0].ln1, t->layers[0].rstd1, P(t, m->layers[0].attn_norm), N, C,
                                  c->rms_eps, s));
    for (int64_t l = 0; l < L; l++) {
        const kiln_train_layer *w = &m->layers[l];
        layer_acts *a = &t->layers[l];
        TRY(kiln_cuda_linear_forward_train(t->blas, a->qkv, false, false, a->ln1, W(t, w->wq), N, C, QKV, s));
        TRY(kiln_cuda_rope_forward_train(a->qkv, a->qkv, N, T, NH, NKV, HS, c->rope_dim, c->rope_base, m->rope_freq, m->rope_mscale,
                                         c->rope_neox, s));
        TRY(kiln_cuda_attention_forward_train(a->att, a->lse, a->qkv, B, T, NH, NKV, HS, s));
        /* mid = wo(att), then mid += x inside the ffn norm */
        TRY(kiln_cuda_linear_forward_train(t->blas, a->mid, true, false, a->att, W(t, w->wo), N, Q, C, s));
        TRY(kiln_cuda_rmsnorm_forward_train(a->mid, a->x, a->ln2, a->rstd2, P(t, w->ffn_norm), N, C, c->rms_eps, s));
        TRY(kiln_cuda_linear_forward_train(t->blas, a->gu, false, false, a->ln2, W(t, w->w_gate), N, C, 2 * F, s));
        TRY(kiln_cuda_swiglu_forward_train(a->h, a->gu, N, F, s));
        /* x_next = down(h), then x_next += mid inside the next norm */
        float *x_next = l + 1 < L ? t->layers[l + 1].x : t->xL;
        TRY(kiln_cuda_linear_forward_train(t->blas, x_next, true, false, a->h, W(t, w->w_down), N, F, C, s));
        if (l + 1 < L)
            TRY(kiln_cuda_rmsnorm_forward_train(x_next, a->mid, t->layers[l + 1].ln1, t->layers[l + 1].rstd1,
                                          P(t, m->layers[l + 1].attn_norm), N, C, c->rms_eps, s));
        else
            TRY(kiln_cuda_rmsnorm_forward_train(x_next, a->mid, t->lnf, t->rstdf, P(t, m->output_norm), N, C, c->rms_eps, s));
    }
    return KILN_OK;
}

/* ---------------------------------------------------------------- the weight gradients' stream
 * dW (role r) += dy^T x on the side stream once the compute stream has made dy (or on the compute stream, without
 * the side stream); dw_wait(r) makes the compute stream wait for the last dW of role r before it overwrites dy. */
static kiln_status dw_rows(kiln_cuda_trainer *t, int r, float *dW, const kiln_bf16_t *dy, const kiln_bf16_t *x, int64_t N, int64_t I,
                           int64_t O) {
    if (!t->dw_side) return kiln_cuda_linear_backward(t->blas, NULL, false, false, dW, dy, x, NULL, N, I, O, t->stream);
    CK(cudaEventRecord(t->fork_ev, t->stream), "cudaEventRecord");
    CK(cudaStreamWaitEvent(t->side, t->fork_ev, 0), "cudaStreamWaitEvent");
    TRY(kiln_cuda_linear_backward(t->blas_side, NULL, false, false, dW, dy, x, NULL, N, I, O, t->side));
    CK(cudaEventRecord(t->join_ev[r], t->side), "cudaEventRecord");
    return KILN_OK;
}
static kiln_status dw(kiln_cuda_trainer *t, int r, float *dW, const kiln_bf16_t *dy, const kiln_bf16_t *x, int64_t I, int64_t O) {
    return dw_rows(t, r, dW, dy, x, t->N, I, O);
}

/* The compute stream waits for role r's last dW (a never-recorded event is complete: a no-op the first time). The
 * side stream runs in order, so waiting for role 3 (the layer's last) waits for everything before it. */
static kiln_status dw_wait(kiln_cuda_trainer *t, int r) {
    if (t->dw_side) CK(cudaStreamWaitEvent(t->stream, t->join_ev[r], 0), "cudaStreamWaitEvent");
    return KILN_OK;
}

/* The classifier chunk by chunk: logits, the loss into losses, and with dscale != 0 the head's backward:
 * dln (N, C) f32 = dlogits W_out and dW_out += dlogits^T lnf, dlogits written over the logits. */
static kiln_status head(kiln_cuda_trainer *t, float dscale) {
    const kiln_llama_train *m = t->m;
    const kiln_llama_config *c = &m->cfg;
    const int64_t N = t->N, C = c->n_embd, V = c->n_vocab, chunk = N < HEAD_CHUNK ? N : HEAD_CHUNK;
    void *s = t->stream;
    for (int64_t r0 = 0, k = 0; r0 < N; r0 += chunk, k++) {
        const int64_t n = N - r0 < chunk ? N - r0 : chunk;
        /* beside the side stream, chunk k's logits are buffer k % 2 (when there are two), which the dW of chunk k - 2
         * may still read */
        const int r = 4 + (int)(k & 1);
        kiln_bf16_t *lg = t->logits + (t->dw_side && N > chunk ? (k & 1) * chunk * V : 0);
        TRY(dw_wait(t, r));
        TRY(kiln_cuda_linear_forward_train(t->blas, lg, false, false, t->lnf + r0 * C, W(t, m->output), n, C, V, s));
        TRY(kiln_cuda_cross_entropy(t->losses + r0, dscale != 0 ? lg : NULL, lg, t->targets + r0, n, V, m->label_smoothing,
                                    m->z_loss, -1, dscale, s));
        if (dscale != 0) { /* the dW first: it forks as soon as the cross-entropy has written dlogits */
            TRY(dw_rows(t, r, G(t, m->output), lg, t->lnf + r0 * C, n, C, V));
            TRY(kiln_cuda_linear_backward(t->blas, t->dln + r0 * C, true, false, NULL, lg, NULL, W(t, m->output), n, C, V, s));
        }
    }
    return KILN_OK;
}

/* ---------------------------------------------------------------- data parallel: gradient buckets
 * Bucket b < L is layer b's tensors (contiguous in the flat buffer: attn_norm .. w_down), b == L everything after
 * the last layer (output norm, an untied output, the pad), b == L + 1 everything before layer 0 (the embedding,
 * which a tied output shares). The backward finishes them in the order L, L - 1, ..., 0, L + 1. False when the
 * layout is not so (then the gradient is reduced in one piece before the update). */
static bool bucket_range(const kiln_cuda_trainer *t, int64_t b, int64_t *off, int64_t *len) {
    const kiln_llama_train *m = t->m;
    const int64_t L = m->cfg.n_layer;
    int64_t lo[2], hi[2];
    for (int k = 0; k < 2; k++) { /* layer 0 and layer L - 1's spans */
        const kiln_train_layer *w = &m->layers[k == 0 ? 0 : L - 1];
        lo[k] = INT64_MAX, hi[k] = 0;
        for (int i = 0; i < KILN_LT_COUNT; i++) {
            if (w->t[i] < 0) continue; /* not in this layout */
            const kiln_train_tensor *ts = &m->tensors[w->t[i]];
            if (ts->offset < lo[k]) lo[k] = ts->offset;
            if (ts->offset + ts->n > hi[k]) hi[k] = ts->offset + ts->n;
        }
    }
    const int64_t per = hi[0] - lo[0]; /* every layer has the same shapes */
    if (hi[1] - lo[1] != per || lo[1] != lo[0] + (L - 1) * per) return false;
    if (b < L) *off = lo[0] + b * per, *len = per;
    else if (b == L) *off = hi[1], *len = t->n_pad - hi[1];
    else *off = 0, *len = lo[0];
    return true;
}

/* ZeRO-1: buf[off, off + len) (f32 when reduce, else bytes of `elem`) between the ranks by the owner of each part
 * (rank r owns [r S, r S + S)): reduce, every part summed into its owner (a reduce-scatter of an unaligned range);
 * else broadcast, every part from its owner to every rank (an all-gather of one). One NCCL group. */
static kiln_status by_owners(kiln_cuda_trainer *t, void *buf, size_t elem, int64_t off, int64_t len, bool reduce, cudaStream_t stream) {
    TRY(kiln_dist_group_begin());
    kiln_status s = KILN_OK;
    for (int r = 0; r < t->world && !s; r++) {
        const int64_t a = off > r * t->shard ? off : r * t->shard, e = off + len < (r + 1) * t->shard ? off + len : (r + 1) * t->shard;
        if (e <= a) continue;
        s = reduce ? kiln_dist_reduce_f32(t->dist, (float *)buf + a, e - a, r, stream)
                   : kiln_dist_broadcast(t->dist, (char *)buf + (size_t)a * elem, (size_t)(e - a) * elem, r, stream);
    }
    const kiln_status g = kiln_dist_group_end();
    return s ? s : g;
}

/* ZeRO-1: every rank's fp32 masters of the tensors the forward reads in fp32 (the embedding and the norms: the
 * vectors of the table) from their owners, after the update. */
static kiln_status gather_fp32_read(kiln_cuda_trainer *t) {
    const kiln_llama_train *m = t->m;
    TRY(kiln_dist_group_begin()); /* groups nest: the whole gather is one launch */
    kiln_status s = KILN_OK;
    for (int i = 0; i < m->n_tensors && !s; i++) {
        const kiln_train_tensor *ts = &m->tensors[i];
        if (i == m->tok_embd || ts->n_dims == 1) s = by_owners(t, t->params, 4, ts->offset, ts->n, false, t->stream);
    }
    const kiln_status g = kiln_dist_group_end();
    return s ? s : g;
}

/* ZeRO-1: all of every rank's fp32 masters (for a checkpoint or a download). */
static kiln_status gather_params(kiln_cuda_trainer *t) {
    if (!t->zero1) return KILN_OK;
    TRY(kiln_dist_allgather(t->dist, t->params + (int64_t)t->rank * t->shard, t->params, (size_t)t->shard * 4, t->stream));
    return wait_stream(t, "gathering the parameters");
}

/* Bucket b's gradient is final on the compute stream: sum it over the ranks (ZeRO-1: into its owners) on the comm
 * stream, after it. */
static kiln_status reduce_bucket(kiln_cuda_trainer *t, int64_t b) {
    int64_t off, len;
    if (!bucket_range(t, b, &off, &len)) return kiln_fail(KILN_ERR_INVALID, "gpu train: the gradient buckets do not tile the buffer");
    CK(cudaEventRecord(t->ev[b], t->stream), "cudaEventRecord");
    CK(cudaStreamWaitEvent(t->comm, t->ev[b], 0), "cudaStreamWaitEvent");
    if (t->dw_side) CK(cudaStreamWaitEvent(t->comm, t->join_ev[3], 0), "cudaStreamWaitEvent"); /* the layer's dW */
    if (len == 0) return KILN_OK;
    return t->zero1 ? by_owners(t, t->grads, 4, off, len, true, t->comm) : kiln_dist_allreduce_f32(t->dist, t->grads + off, len, t->comm);
}

static kiln_status backward(kiln_cuda_trainer *t, bool reduce) {
    const kiln_llama_train *m = t->m;
    const kiln_llama_config *c = &m->cfg;
    const int64_t B = t->B, T = t->T, N = t->N, C = c->n_embd, NH = c->n_head, NKV = c->n_head_kv, HS = c->head_dim, F = c->n_ff;
    const int64_t Q = NH * HS, KV = NKV * HS, QKV = Q + 2 * KV, L = c->n_layer;
    void *s = t->stream;
    cudaStream_t cs = t->stream;
    CK(cudaMemsetAsync(t->dx, 0, (size_t)(N * C) * 4, cs), "cudaMemsetAsync");
    TRY(kiln_cuda_rmsnorm_backward(t->dx, t->dxb, G(t, m->output_norm), t->dln, t->xL, P(t, m->output_norm), t->rstdf, N, C, t->ws,
                                   s));
    if (reduce) TRY(reduce_bucket(t, L)); /* the output norm and an untied output are final */
    for (int64_t l = L - 1; l >= 0; l--) {
        const kiln_train_layer *w = &m->layers[l];
        layer_acts *a = &t->layers[l];
        if (t->recompute) { /* the forward's values from its saved inputs, by the same kernels: the same bits */
            TRY(dw_wait(t, 3)); /* the last layer's dW matmuls read the shared copy */
            TRY(kiln_cuda_rmsnorm_forward_train(a->x, NULL, a->ln1, a->rstd1, P(t, w->attn_norm), N, C, c->rms_eps, s));
            TRY(kiln_cuda_rmsnorm_forward_train(a->mid, NULL, a->ln2, a->rstd2, P(t, w->ffn_norm), N, C, c->rms_eps, s));
            TRY(kiln_cuda_swiglu_forward_train(a->h, a->gu, N, F, s));
        }
        /* feed-forward block: x_next = mid + down(h); dx holds d x_next, dxb its bf16 copy */
        TRY(dw(t, 0, G(t, w->w_down), t->dxb, a->h, F, C));
        TRY(kiln_cuda_linear_backward(t->blas, t->dh, false, false, NULL, t->dxb, NULL, W(t, w->w_down), N, F, C, s));
        TRY(dw_wait(t, 1)); /* the last layer's dW of gate|up read dgu */
        TRY(kiln_cuda_swiglu_backward(t->dgu, t->dh, a->gu, N, F, s));
        TRY(dw(t, 1, G(t, w->w_gate), t->dgu, a->ln2, C, 2 * F));
        TRY(kiln_cuda_linear_backward(t->blas, t->dln, true, false, NULL, t->dgu, NULL, W(t, w->w_gate), N, C, 2 * F, s));
        TRY(dw_wait(t, 0)); /* dW of down reads dxb */
        TRY(kiln_cuda_rmsnorm_backward(t->dx, t->dxb, G(t, w->ffn_norm), t->dln, a->mid, P(t, w->ffn_norm), a->rstd2, N, C, t->ws, s));
        /* attention block: mid = x + wo(att); dx holds d mid, dxb its bf16 copy */
        TRY(dw(t, 2, G(t, w->wo), t->dxb, a->att, Q, C));
        /* d att (N, Q) bf16: in dgu, free until the next layer's swiglu backward, unless dW of gate|up may still read it */
        kiln_bf16_t *datt = t->dw_side ? t->datt : t->dgu;
        TRY(kiln_cuda_linear_backward(t->blas, datt, false, false, NULL, t->dxb, NULL, W(t, w->wo), N, Q, C, s));
        TRY(kiln_cuda_attention_backward(t->dqkv, datt, a->qkv, a->att, a->lse, B, T, NH, NKV, HS, t->deterministic, t->ws, s));
        TRY(dw_wait(t, 3)); /* the last layer's dW of qkv read dqkvb */
        TRY(kiln_cuda_rope_backward(t->dqkvb, t->dqkv, N, T, NH, NKV, HS, c->rope_dim, c->rope_base, t->m->rope_freq,
                                    t->m->rope_mscale, c->rope_neox, s));
        TRY(dw(t, 3, G(t, w->wq), t->dqkvb, a->ln1, C, QKV));
        TRY(kiln_cuda_linear_backward(t->blas, t->dln, true, false, NULL, t->dqkvb, NULL, W(t, w->wq), N, C, QKV, s));
        TRY(dw_wait(t, 2)); /* dW of o reads dxb */
        /* the first layer's dx goes to the embedding only: no bf16 copy */
        TRY(kiln_cuda_rmsnorm_backward(t->dx, l > 0 ? t->dxb : NULL, G(t, w->attn_norm), t->dln, a->x, P(t, w->attn_norm), a->rstd1, N,
                                       C, t->ws, s));
        if (reduce) TRY(reduce_bucket(t, l));
    }
    /* the deterministic scatter: the same bits every run, so a resumed run repeats an uninterrupted one (it costs
     * ~0.1 ms a step at N 16384 over the atomic one, so it is used in both modes) */
    TRY(kiln_cuda_embed_backward_det(G(t, m->tok_embd), t->dx, t->ids, N, C, c->n_vocab, t->d_embed_skipped, t->ws, s));
    if (reduce) { /* the embedding, then the compute stream waits for every bucket */
        TRY(reduce_bucket(t, L + 1));
        CK(cudaEventRecord(t->ev[L + 2], t->comm), "cudaEventRecord");
        CK(cudaStreamWaitEvent(t->stream, t->ev[L + 2], 0), "cudaStreamWaitEvent");
    }
    return dw_wait(t, 3); /* every weight gradient, before the step reports done */
}

/* After kiln_cuda_trainer_write of params: the mirror the matmuls read, from them (all of it: every rank wrote all). */
static kiln_status refresh_mirror(kiln_cuda_trainer *t) {
    if (!t->mirror_stale) return KILN_OK;
    TRY(kiln_cuda_to_bf16(t->mirror, t->params, t->n_pad, t->stream));
    t->mirror_stale = false;
    return KILN_OK;
}

extern "C" kiln_status kiln_cuda_trainer_step(kiln_cuda_trainer *t, const int32_t *inputs, const int32_t *targets, float grad_scale,
                                              double *loss_sum, int64_t *n_counted) {
    const int64_t N = t->N;
    const int64_t V = t->m->cfg.n_vocab;
    int64_t counted = 0;
    for (int64_t i = 0; i < N; i++) {
        if (inputs[i] < 0 || inputs[i] >= V || targets[i] < -1 || targets[i] >= V)
            return kiln_fail(KILN_ERR_RANGE, "gpu train: token id %d (input) or %d (target) at row %lld is outside the vocab of %lld",
                             inputs[i], targets[i], (long long)i, (long long)V);
        counted += targets[i] != -1;
    }
    TRY(refresh_mirror(t));
    t->gathered = -1; /* the backward writes the gradient buffer */
    CK(cudaMemcpyAsync(t->ids, inputs, (size_t)N * 4, cudaMemcpyHostToDevice, t->stream), "cudaMemcpyAsync");
    CK(cudaMemcpyAsync(t->targets, targets, (size_t)N * 4, cudaMemcpyHostToDevice, t->stream), "cudaMemcpyAsync");
    TRY(forward(t));
    TRY(head(t, grad_scale));
    const bool reduce = t->reduce_next && grad_scale != 0;
    t->reduce_next = false;
    if (grad_scale != 0) TRY(backward(t, reduce));
    if (reduce) t->reduced = true;
    CK(cudaMemcpyAsync(t->h_losses, t->losses, (size_t)N * 4, cudaMemcpyDeviceToHost, t->stream), "cudaMemcpyAsync");
    TRY(wait_stream(t, "training step"));
    double sum = 0; /* in row order, in double: the same bits every run */
    for (int64_t i = 0; i < N; i++) sum += t->h_losses[i];
    if (t->dist) { /* the sums over every rank's rows */
        double red[2] = {sum, (double)counted};
        CK(cudaMemcpyAsync(t->d_red, red, sizeof red, cudaMemcpyHostToDevice, t->stream), "cudaMemcpyAsync");
        TRY(kiln_dist_allreduce_f64(t->dist, t->d_red, 2, t->stream));
        CK(cudaMemcpyAsync(red, t->d_red, sizeof red, cudaMemcpyDeviceToHost, t->stream), "cudaMemcpyAsync");
        TRY(wait_stream(t, "the loss over the ranks"));
        sum = red[0], counted = (int64_t)red[1];
    }
    *loss_sum = sum;
    *n_counted = counted;
    return KILN_OK;
}

extern "C" void kiln_cuda_trainer_reduce_next(kiln_cuda_trainer *t) {
    int64_t off, len;
    t->reduce_next = t->dist && bucket_range(t, 0, &off, &len);
}

extern "C" kiln_status kiln_cuda_trainer_agree(kiln_cuda_trainer *t, bool *flag) {
    if (!t->dist) return KILN_OK;
    double v = *flag ? 1.0 : 0.0;
    CK(cudaMemcpyAsync(t->d_red, &v, sizeof v, cudaMemcpyHostToDevice, t->stream), "cudaMemcpyAsync");
    TRY(kiln_dist_broadcast(t->dist, t->d_red, sizeof v, 0, t->stream));
    CK(cudaMemcpyAsync(&v, t->d_red, sizeof v, cudaMemcpyDeviceToHost, t->stream), "cudaMemcpyAsync");
    TRY(wait_stream(t, "a flag from rank 0"));
    *flag = v != 0.0;
    return KILN_OK;
}

extern "C" kiln_status kiln_cuda_trainer_zero_grads(kiln_cuda_trainer *t) {
    CK(cudaMemsetAsync(t->grads, 0, (size_t)t->n_pad * 4, t->stream), "cudaMemsetAsync");
    t->reduced = false;
    t->gathered = -1;
    return KILN_OK;
}

/* One AdamW update, checked before it is applied: the gradient's norm (summed over the ranks), then the weights the
 * update would give, squared and summed per tensor (over the shards with ZeRO-1, so every rank decides alike), and
 * the update only when all of them are finite; else nothing changes and the step counts as skipped, as on the CPU.
 * Once an update has been applied, the check starts from the maxima it wrote (d_max): when they bound every new
 * weight well below overflow, as in any sane step, it reads nothing (0.8 ms of a 124m step on an H100) and its sums
 * are 0; a rank that reads contributes its own sums, so the ranks still decide alike. The host reads the norm, the
 * flag and the sums once, after the update. */
extern "C" kiln_status kiln_cuda_trainer_adamw(kiln_cuda_trainer *t, const kiln_adamw_cfg *cfg, float lr, double *grad_norm,
                                               bool *skipped) {
    if (cfg->eight_bit != t->eight_bit)
        return kiln_fail(KILN_ERR_INVALID, "gpu train: the trainer keeps %s moments but the step asks for %s", t->eight_bit ? "8-bit" : "fp32",
                         cfg->eight_bit ? "8-bit" : "fp32");
    TRY(refresh_mirror(t));
    const int64_t S = t->shard, o = t->zero1 ? (int64_t)t->rank * S : 0;
    double *d_sumsq = t->d_red + 3;
    if (t->zero1 && !t->reduced) TRY(kiln_dist_reduce_scatter_f32(t->dist, t->grads, t->grads + o, S, t->stream));
    if (!t->zero1 && t->dist && !t->reduced) TRY(kiln_dist_allreduce_f32(t->dist, t->grads, t->n_pad, t->stream));
    TRY(kiln_cuda_grad_sumsq(d_sumsq, t->grads + o, S, t->ws, t->stream));
    if (t->zero1) TRY(kiln_dist_allreduce_f64(t->dist, d_sumsq, 1, t->stream));
    const kiln_cuda_adamw_max *known = t->bound && t->max_known ? t->d_max : NULL; /* the bound's maxima, if any */
    if (t->eight_bit)
        TRY(kiln_cuda_adamw8_check(t->d_wsumsq, t->d_wpartial, t->d_seg, t->n_seg, t->n_chunks, t->params + o, t->grads + o, t->q,
                                   t->decay + o, lr, cfg->beta1, cfg->beta2, cfg->eps, cfg->weight_decay, cfg->grad_clip, t->opt_step + 1,
                                   d_sumsq, known, t->stream));
    else
        TRY(kiln_cuda_adamw_check(t->d_wsumsq, t->d_wpartial, t->d_seg, t->n_seg, t->n_chunks, t->params + o, t->grads + o, t->am, t->av,
                                  t->decay + o, lr, cfg->beta1, cfg->beta2, cfg->eps, cfg->weight_decay, cfg->grad_clip, t->opt_step + 1,
                                  d_sumsq, known, t->stream));
    if (t->zero1) TRY(kiln_dist_allreduce_f64(t->dist, t->d_wsumsq, t->n_seg, t->stream)); /* each rank summed its shard */
    if (t->eight_bit)
        TRY(kiln_cuda_adamw8_apply_checked(t->params + o, t->grads + o, t->q, t->mirror + o, t->decay + o, S, lr, cfg->beta1, cfg->beta2,
                                           cfg->eps, cfg->weight_decay, cfg->grad_clip, t->opt_step + 1, d_sumsq, t->d_wsumsq, t->n_seg,
                                           t->d_max, t->d_norm, t->d_skipped, t->ws, t->stream));
    else
        TRY(kiln_cuda_adamw_apply_checked(t->params + o, t->grads + o, t->am, t->av, t->mirror + o, t->decay + o, S, lr, cfg->beta1,
                                          cfg->beta2, cfg->eps, cfg->weight_decay, cfg->grad_clip, t->opt_step + 1, d_sumsq, t->d_wsumsq,
                                          t->n_seg, t->d_max, t->d_norm, t->d_skipped, t->ws, t->stream));
    if (t->zero1) {
        TRY(kiln_dist_allgather(t->dist, t->mirror + o, t->mirror, (size_t)S * 2, t->stream));
        TRY(gather_fp32_read(t));
    }
    t->reduced = false;
    float norm = 0;
    int32_t skip = 0;
    CK(cudaMemcpyAsync(&norm, t->d_norm, 4, cudaMemcpyDeviceToHost, t->stream), "cudaMemcpyAsync");
    CK(cudaMemcpyAsync(&skip, t->d_skipped, 4, cudaMemcpyDeviceToHost, t->stream), "cudaMemcpyAsync");
    CK(cudaMemcpyAsync(t->h_wsumsq, t->d_wsumsq, (size_t)t->n_seg * 8, cudaMemcpyDeviceToHost, t->stream), "cudaMemcpyAsync");
    TRY(wait_stream(t, "AdamW step"));
    bool weights_ok = true;
    for (int i = 0; i < t->n_seg; i++) weights_ok = weights_ok && isfinite(t->h_wsumsq[i]);
    if (!skip) { /* as the CPU's kiln_adamw, a skipped step does not count; it left d_max (and the weights) as they were */
        t->opt_step++;
        t->max_known = true; /* the update wrote d_max */
    }
    *grad_norm = norm;
    *skipped = skip != 0 || !weights_ok;
    return KILN_OK;
}

extern "C" kiln_status kiln_cuda_trainer_download(kiln_cuda_trainer *t, float *params, float *grads) {
    if (params) TRY(gather_params(t));
    CK(cudaStreamSynchronize(t->stream), "training work before a download");
    if (params) CK(cudaMemcpy(params, t->params, (size_t)t->n * 4, cudaMemcpyDeviceToHost), "cudaMemcpy params");
    if (grads) CK(cudaMemcpy(grads, t->grads, (size_t)t->n * 4, cudaMemcpyDeviceToHost), "cudaMemcpy grads");
    return KILN_OK;
}

extern "C" kiln_status kiln_cuda_set_device(int index) {
    const int n = kiln_cuda_device_count();
    if (index < 0 || index >= n) return kiln_fail(KILN_ERR_INVALID, "gpu: CUDA device %d does not exist (this machine has %d)", index, n);
    CK(cudaSetDevice(index), "cudaSetDevice");
    return KILN_OK;
}

/* A part as stored on this rank: its device array (the shard's, with ZeRO-1), the element size, the elements of the
 * whole part (over n params) and the first element this rank holds and how many (all of them without ZeRO-1). */
typedef struct {
    char *dev;
    size_t elem;
    int64_t total, held_first, held_n;
} part_info;

static kiln_status part_of(const kiln_cuda_trainer *t, kiln_cuda_train_part part, part_info *pi) {
    const int64_t o = t->zero1 ? (int64_t)t->rank * t->shard : 0, B = KILN_ADAMW8_BLOCK;
    const bool wants8 = part != KILN_CUDA_TRAIN_PARAMS && part != KILN_CUDA_TRAIN_M && part != KILN_CUDA_TRAIN_V;
    if (part != KILN_CUDA_TRAIN_PARAMS && wants8 != t->eight_bit)
        return kiln_fail(KILN_ERR_INVALID, "gpu train: the trainer keeps %s moments, not this part", t->eight_bit ? "8-bit" : "fp32");
    switch (part) {
    case KILN_CUDA_TRAIN_PARAMS: *pi = (part_info){(char *)t->params, 4, t->n, 0, t->n}; return KILN_OK;
    case KILN_CUDA_TRAIN_M: *pi = (part_info){(char *)t->am, 4, t->n, o, t->shard}; break;
    case KILN_CUDA_TRAIN_V: *pi = (part_info){(char *)t->av, 4, t->n, o, t->shard}; break;
    case KILN_CUDA_TRAIN_M8: *pi = (part_info){(char *)t->q.m8, 1, t->n, o, t->shard}; break;
    case KILN_CUDA_TRAIN_V8: *pi = (part_info){(char *)t->q.v8, 1, t->n, o, t->shard}; break;
    case KILN_CUDA_TRAIN_M_SCALE: *pi = (part_info){(char *)t->q.m_scale, 4, (t->n + B - 1) / B, o / B, (t->shard + B - 1) / B}; break;
    case KILN_CUDA_TRAIN_V_SCALE: *pi = (part_info){(char *)t->q.v_scale, 4, (t->n + B - 1) / B, o / B, (t->shard + B - 1) / B}; break;
    default: return kiln_fail(KILN_ERR_INVALID, "gpu train: no state part %d", (int)part);
    }
    return KILN_OK;
}

extern "C" kiln_status kiln_cuda_trainer_gather(kiln_cuda_trainer *t, kiln_cuda_train_part part) {
    part_info pi;
    TRY(part_of(t, part, &pi));
    if (!t->zero1) return KILN_OK;
    if (part == KILN_CUDA_TRAIN_PARAMS) return gather_params(t);
    /* every rank gathers the moments' shards through the gradient buffer, dead until the next step */
    TRY(kiln_dist_allgather(t->dist, pi.dev, t->grads, (size_t)pi.held_n * pi.elem, t->stream));
    TRY(wait_stream(t, "gathering the moments"));
    t->gathered = (int)part;
    return KILN_OK;
}

/* Elements [first, first + n) of part: in range of the whole part. */
static kiln_status part_range(const part_info *pi, int64_t first, int64_t n) {
    if (first < 0 || n < 0 || first > pi->total || n > pi->total - first)
        return kiln_fail(KILN_ERR_RANGE, "gpu train: state range [%lld, %lld) outside the part's %lld elements", (long long)first,
                         (long long)(first + n), (long long)pi->total);
    return KILN_OK;
}

extern "C" kiln_status kiln_cuda_trainer_read(kiln_cuda_trainer *t, kiln_cuda_train_part part, int64_t first, int64_t n, void *dst) {
    part_info pi;
    TRY(part_of(t, part, &pi));
    TRY(part_range(&pi, first, n));
    const char *src = pi.dev;
    if (part != KILN_CUDA_TRAIN_PARAMS && t->zero1) {
        if (t->gathered != (int)part) return kiln_fail(KILN_ERR_INVALID, "gpu train: moments read before kiln_cuda_trainer_gather");
        src = (const char *)t->grads; /* the whole part, gathered */
    }
    if (n == 0) return KILN_OK;
    CK(cudaMemcpyAsync(dst, src + (size_t)first * pi.elem, (size_t)n * pi.elem, cudaMemcpyDeviceToHost, t->stream), "cudaMemcpyAsync state");
    return wait_stream(t, "reading the training state");
}

extern "C" kiln_status kiln_cuda_trainer_write(kiln_cuda_trainer *t, kiln_cuda_train_part part, int64_t first, int64_t n,
                                               const void *src) {
    part_info pi;
    TRY(part_of(t, part, &pi));
    TRY(part_range(&pi, first, n));
    /* with ZeRO-1 a rank keeps the moments of its shard: the part of the range inside it */
    const int64_t lo = first > pi.held_first ? first : pi.held_first;
    const int64_t hi = first + n < pi.held_first + pi.held_n ? first + n : pi.held_first + pi.held_n;
    if (hi <= lo) return KILN_OK; /* none of it is this rank's */
    CK(cudaMemcpyAsync(pi.dev + (size_t)(lo - pi.held_first) * pi.elem, (const char *)src + (size_t)(lo - first) * pi.elem,
                       (size_t)(hi - lo) * pi.elem, cudaMemcpyHostToDevice, t->stream),
       "cudaMemcpyAsync state");
    if (part == KILN_CUDA_TRAIN_PARAMS) t->mirror_stale = true;
    t->max_known = false; /* the next check reads every weight */
    return wait_stream(t, "writing the training state"); /* the caller may free src on return */
}

extern "C" kiln_status kiln_cuda_trainer_get_counters(kiln_cuda_trainer *t, int64_t *opt_step, int64_t *n_embed_skipped) {
    int32_t k = 0;
    CK(cudaMemcpyAsync(&k, t->d_embed_skipped, 4, cudaMemcpyDeviceToHost, t->stream), "cudaMemcpyAsync");
    TRY(wait_stream(t, "reading the counters"));
    double sk = (double)k;
    if (t->dist) { /* every rank skips its own rows: the count is the sum */
        CK(cudaMemcpyAsync(t->d_red + 2, &sk, sizeof sk, cudaMemcpyHostToDevice, t->stream), "cudaMemcpyAsync");
        TRY(kiln_dist_allreduce_f64(t->dist, t->d_red + 2, 1, t->stream));
        CK(cudaMemcpyAsync(&sk, t->d_red + 2, sizeof sk, cudaMemcpyDeviceToHost, t->stream), "cudaMemcpyAsync");
        TRY(wait_stream(t, "the skipped rows over the ranks"));
    }
    *n_embed_skipped = t->embed_skipped0 + (int64_t)sk;
    *opt_step = t->opt_step;
    return KILN_OK;
}

extern "C" kiln_status kiln_cuda_trainer_set_counters(kiln_cuda_trainer *t, int64_t opt_step, int64_t n_embed_skipped) {
    CK(cudaMemsetAsync(t->d_embed_skipped, 0, 4, t->stream), "cudaMemsetAsync");
    TRY(wait_stream(t, "setting the counters"));
    t->opt_step = opt_step;
    t->embed_skipped0 = n_embed_skipped;
    return KILN_OK;
}
