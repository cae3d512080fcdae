/* backend.c: the CPU backend of the forward's seam (src/model/backend.h). Each step is built out of the CPU kernels
 * of the ops table (ops.h), in the order the forward ran them before the seam had fused steps, so the arithmetic,
 * and with it every golden test, is unchanged. Backend memory is host memory: alloc is calloc aligned to a cache line, upload and download
 * are copies, nothing is ever pending, and record just runs the steps.
 *
 * The context owns the thread pool, the kernels' scratch, the positions of a batch (RoPE reads a position per
 * row) and a buffer for a matmul whose result is added (the residual adds the forward folds into the projections),
 * and the matmul weights in the kernels' own layout (16 rows interleaved for the VNNI kernels, ops_repack.c), which
 * replace the model's mmap pages they were copied from. */
#include "model/backend.h"
#include "cpu/ops.h"
#include "cpu/simd.h"
#include "quants.h"
#include "status.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct cpu_ctx {
    const kiln_ops *ops;
    kiln_pool *pool;
    kiln_ops_ctx k;     /* pool, scratch, prepared weights */
    int64_t n_batch;
    int32_t *pos;       /* (n_batch) the positions of a batch */
    float *sum;         /* (n_batch, max width): a matmul's result before it is added */
    kiln_from_float_fn to_cache[KILN_KV_TYPE_COUNT]; /* each cache type's row writer, from float */
    kiln_weight (*layers)[KILN_LT_COUNT];
} cpu_ctx;

static void cpu_close(void *p) {
    cpu_ctx *c = p;
    if (!c) return;
    if (c->ops->release_weights) c->ops->release_weights(&c->k);
    kiln_pool_free(c->pool);
    free(c->k.scratch);
    free(c->pos);
    free(c->sum);
    free(c->layers);
    free(c);
}

static kiln_status cpu_open(const kiln_model *m, const kiln_backend_params *p, void **out) {
    *out = NULL;
    const kiln_llama_config *cfg = &m->cfg;
    cpu_ctx *c = calloc(1, sizeof *c);
    if (!c) return kiln_fail(KILN_ERR_NOMEM, "session: out of memory");
    c->ops = &kiln_cpu_ops;
    c->n_batch = p->n_batch;
    /* float -> each KV cache type: f16 the same bits as kiln_f32_to_fp16 at every SIMD level (F16C rounds to nearest
     * even); the others by the core's scalar references: f32 copied, bf16 rounded to nearest even (kiln_f32_to_bf16),
     * q8_0 and q4_0 GGML's quantize_row_q8_0_ref / q4_0_ref byte for byte */
    for (int t = 0; t < KILN_KV_TYPE_COUNT; t++) {
        const kiln_type tt = kiln_kv_tensor_type((kiln_kv_type)t);
        c->to_cache[t] = tt == KILN_TYPE_F16 ? kiln_get_from_float(tt, kiln_simd_best()) : kiln_type_traits_get(tt)->from_float_ref;
    }
    kiln_status st = kiln_pool_create(p->n_threads, &c->pool);
    if (st) {
        cpu_close(c);
        return st;
    }
    const int64_t W = kiln_llama_max_width(cfg);
    c->k.pool = c->pool;
    c->k.scratch_bytes = c->ops->scratch_size(p->n_batch, W, cfg->n_head, p->n_ctx, kiln_pool_size(c->pool));
    if (p->type_k != KILN_KV_F16 || p->type_v != KILN_KV_F16) /* attention converts their rows to float */
        c->k.scratch_bytes += c->ops->kv_scratch_size(W, cfg->n_head, p->n_ctx, kiln_pool_size(c->pool));
    c->k.scratch = NULL; /* on a cache line, as the buffers of cpu_alloc: the threads write their parts of it */
    if (c->k.scratch_bytes && posix_memalign(&c->k.scratch, 64, c->k.scratch_bytes) != 0) c->k.scratch = NULL;
    c->pos = malloc(sizeof *c->pos * (size_t)p->n_batch);
    c->sum = malloc(sizeof *c->sum * (size_t)(p->n_batch * W));
    if ((c->k.scratch_bytes && !c->k.scratch) || !c->pos || !c->sum) {
        cpu_close(c);
        return kiln_fail(KILN_ERR_NOMEM, "session: out of memory for %llu bytes of scratch", (unsigned long long)c->k.scratch_bytes);
    }
    *out = c;
    return KILN_OK;
}

/* The views in place; the matmul weights (every layer's matrices, then the head) also into the kernels' layout,
 * dropping each one's mmap pages once copied, so resident memory holds the weights once. */
static kiln_status cpu_load_weights(void *p, const kiln_model *m, kiln_weights *w) {
    cpu_ctx *c = p;
    const kiln_llama_config *cfg = &m->cfg;
    c->layers = calloc((size_t)cfg->n_layer, sizeof *c->layers);
    if (!c->layers) return kiln_fail(KILN_ERR_NOMEM, "session: out of memory");
    w->layers = c->layers;
    w->tok_embd = (kiln_weight){m->tok_embd, NULL};
    w->output_norm = (kiln_weight){m->output_norm, NULL};
    w->output = (kiln_weight){m->output, NULL};
    int64_t n = 0;
    for (int64_t l = 0; l < cfg->n_layer; l++)
        for (int i = 0; i < KILN_LT_COUNT; i++) {
            c->layers[l][i] = (kiln_weight){m->layers[l].t[i], NULL};
            n += m->layers[l].t[i] && kiln_layer_tensors[i].ne1 != KILN_DIM_ONE;
        }
    if (!c->ops->prepare_weights) return KILN_OK;
    const kiln_tensor_view **mats = malloc(sizeof *mats * (size_t)(n + 1));
    if (!mats) return kiln_fail(KILN_ERR_NOMEM, "session: out of memory");
    n = 0;
    for (int64_t l = 0; l < cfg->n_layer; l++)
        for (int i = 0; i < KILN_LT_COUNT; i++)
            if (m->layers[l].t[i] && kiln_layer_tensors[i].ne1 != KILN_DIM_ONE) mats[n++] = m->layers[l].t[i];
    mats[n++] = m->output;
    kiln_status st = c->ops->prepare_weights(&c->k, mats, n, true);
    free(mats);
    return st;
}

static size_t cpu_device_bytes(void *p) { return 0; }

/* Buffers start on a cache line. calloc's 16-byte alignment put every activation row 16 or 32 bytes off: a GEMM
 * kernel's 64-byte store of 16 outputs then straddled two lines, each shared with the neighbouring row group,
 * which the other thread was writing (SmolLM2 pp128 at two threads: 1.6x one thread, against 2x for two
 * processes). The raw pointer is kept just below the aligned one. calloc, not posix_memalign and memset: the pages
 * of a long context's cache are only touched as positions fill. */
enum { BUF_ALIGN = 64 };

static kiln_status cpu_alloc(void *p, size_t bytes, void **out) {
    *out = NULL;
    if (bytes > SIZE_MAX - BUF_ALIGN - sizeof(void *))
        return kiln_fail(KILN_ERR_NOMEM, "session: out of memory for %llu bytes", (unsigned long long)bytes);
    char *raw = calloc(1, bytes + BUF_ALIGN + sizeof(void *));
    if (!raw) return kiln_fail(KILN_ERR_NOMEM, "session: out of memory for %llu bytes", (unsigned long long)bytes);
    char *at = (char *)(((uintptr_t)raw + sizeof(void *) + BUF_ALIGN - 1) & ~(uintptr_t)(BUF_ALIGN - 1));
    ((void **)at)[-1] = raw;
    *out = at;
    return KILN_OK;
}
static void cpu_free(void *p, void *buf) {
    if (buf) free(((void **)buf)[-1]);
}
static kiln_status cpu_copy(void *p, void *dst, const void *src, size_t bytes) {
    if (dst != src) memcpy(dst, src, bytes);
    return KILN_OK;
}
static kiln_status cpu_synchronize(void *p) { return KILN_OK; }
static kiln_status cpu_record(void *p, int slot, kiln_status (*enqueue)(void *arg), void *arg) { return enqueue(arg); }

/* ---------------------------------------------------------------- the steps */

static kiln_status cpu_embed(void *p, float *x, const kiln_weight *table, const int32_t *ids, int64_t T, int64_t C, float scale) {
    cpu_ctx *c = p;
    c->ops->embed_forward(&c->k, x, table->view, ids, T);
    if (scale != 1.0f) c->ops->scale_softcap_forward(&c->k, x, T * C, scale, 0.0f);
    return KILN_OK;
}

static kiln_status cpu_residual_norm(void *p, float *x, float *y, const kiln_weight *post_w, float post_eps, float *xb,
                                     const kiln_weight *w, float eps, int64_t T, int64_t C) {
    cpu_ctx *c = p;
    if (y) {
        if (post_w) c->ops->rmsnorm_forward(&c->k, y, y, post_w->view->data, T, C, post_eps);
        for (int64_t i = 0; i < T * C; i++) x[i] += y[i];
    }
    if (w)
        c->ops->rmsnorm_forward(&c->k, xb, x, w->view->data, T, C, eps);
    else /* no pre-norm (olmo2) */
        memcpy(xb, x, sizeof *xb * (size_t)(T * C));
    return KILN_OK;
}

/* n matmuls of one x as one job where the kernels have matmul_n_forward: x is quantized once and small k and v
 * share the threads with q (a pool wake-up costs 10-90 us; decode has ~10 per layer). */
static void matmul_n(cpu_ctx *c, int n, float *const *y, const float *x, const kiln_weight *const *W, int64_t T) {
    const kiln_tensor_view *v[3];
    for (int i = 0; i < n; i++) v[i] = W[i]->view;
    if (c->ops->matmul_n_forward) {
        c->ops->matmul_n_forward(&c->k, n, y, x, v, T);
        return;
    }
    for (int i = 0; i < n; i++) c->ops->matmul_forward(&c->k, y[i], x, v[i], T);
}

static kiln_status cpu_qkv(void *p, float *q, float *k, float *v, const float *x, const kiln_weight *wq, const kiln_weight *wk,
                           const kiln_weight *wv, int64_t T) {
    float *const y[3] = {q, k, v};
    const kiln_weight *const W[3] = {wq, wk, wv};
    matmul_n(p, 3, y, x, W, T);
    return KILN_OK;
}

/* Writes n rows of src (n, KV) for positions p.. into cache rows p % rows.. of type t (row_bytes each): one
 * conversion, or two where the ring wraps. */
static void store_rows(const cpu_ctx *c, kiln_kv_type t, void *cache, int64_t rows, const float *src, int64_t p, int64_t n,
                       int64_t KV) {
    const size_t row_bytes = kiln_kv_row_bytes(t, KV);
    const int64_t r = p % rows, first = n < rows - r ? n : rows - r;
    c->to_cache[t](src, (char *)cache + (size_t)r * row_bytes, first * KV);
    if (first < n) c->to_cache[t](src + first * KV, cache, (n - first) * KV);
}

static kiln_status cpu_qkv_post(void *p, float *q, float *k, float *v, const kiln_attn_args *a, const int32_t *pos0, int64_t T) {
    cpu_ctx *c = p;
    const int64_t Q = a->NH * a->HS, KV = a->NKV * a->HS;
    if (a->bq) {
        c->ops->add_bias_forward(&c->k, q, a->bq->view->data, T, Q);
        c->ops->add_bias_forward(&c->k, k, a->bk->view->data, T, KV);
        c->ops->add_bias_forward(&c->k, v, a->bv->view->data, T, KV);
    }
    if (a->q_norm && a->qk_norm_full) { /* each token's q and k are one RMSNorm row each (olmo2) */
        c->ops->rmsnorm_forward(&c->k, q, q, a->q_norm->view->data, T, Q, a->eps);
        c->ops->rmsnorm_forward(&c->k, k, k, a->k_norm->view->data, T, KV, a->eps);
    } else if (a->q_norm) { /* each head's row of HS is one RMSNorm row */
        c->ops->rmsnorm_forward(&c->k, q, q, a->q_norm->view->data, T * a->NH, a->HS, a->eps);
        c->ops->rmsnorm_forward(&c->k, k, k, a->k_norm->view->data, T * a->NKV, a->HS, a->eps);
    }
    if (!a->nope) {
        for (int64_t t = 0; t < T; t++) c->pos[t] = (int32_t)(*pos0 + t);
        c->ops->rope_forward(&c->k, q, c->pos, T, a->NH, a->HS, a->rope_dim, a->rope_base, a->rope_freq, a->rope_mscale, a->neox);
        c->ops->rope_forward(&c->k, k, c->pos, T, a->NKV, a->HS, a->rope_dim, a->rope_base, a->rope_freq, a->rope_mscale, a->neox);
    }
    store_rows(c, a->type_k, a->k_cache, a->rows, k, *pos0, T, KV);
    store_rows(c, a->type_v, a->v_cache, a->rows, v, *pos0, T, KV);
    return KILN_OK;
}

static kiln_status cpu_attention(void *p, float *out, float *q, const kiln_attn_args *a, const int32_t *pos0, int64_t T) {
    cpu_ctx *c = p;
    const int64_t pos = *pos0;
    /* the kernels scale by 1/sqrt(HS): another scale goes into q */
    if (a->scale > 0) c->ops->scale_softcap_forward(&c->k, q, T * a->NH * a->HS, a->scale * sqrtf((float)a->HS), 0.0f);
    if (a->type_k != KILN_KV_F16 || a->type_v != KILN_KV_F16)
        c->ops->attention_kv_forward(&c->k, out, q, a->k_cache, a->v_cache, a->type_k, a->type_v, pos, T, a->NH, a->NKV, a->HS,
                                     a->window, a->rows, a->softcap);
    else if (a->window || a->rows < pos + T || a->softcap > 0)
        c->ops->attention_window_forward(&c->k, out, q, a->k_cache, a->v_cache, pos, T, a->NH, a->NKV, a->HS, a->window, a->rows,
                                         a->softcap);
    else
        c->ops->attention_forward(&c->k, out, q, a->k_cache, a->v_cache, pos, T, a->NH, a->NKV, a->HS);
    return KILN_OK;
}

static kiln_status cpu_sigmoid_mul(void *p, float *x, const float *g, int64_t n) {
    cpu_ctx *c = p;
    c->ops->sigmoid_mul_forward(&c->k, x, g, n);
    return KILN_OK;
}

static kiln_status cpu_matmul(void *p, float *y, const float *x, const kiln_weight *W, int64_t T, bool add) {
    cpu_ctx *c = p;
    if (!add) {
        c->ops->matmul_forward(&c->k, y, x, W->view, T);
        return KILN_OK;
    }
    const int64_t n = T * W->view->ne[1];
    c->ops->matmul_forward(&c->k, c->sum, x, W->view, T);
    for (int64_t i = 0; i < n; i++) y[i] += c->sum[i];
    return KILN_OK;
}

static kiln_status cpu_ffn_up(void *p, float *gate, float *up, const float *x, const kiln_weight *wg, const kiln_weight *wu, int64_t T,
                              bool geglu) {
    cpu_ctx *c = p;
    float *const y[2] = {gate, up};
    const kiln_weight *const W[2] = {wg, wu};
    matmul_n(c, 2, y, x, W, T);
    const int64_t n = T * wg->view->ne[1];
    if (geglu)
        c->ops->geglu_forward(&c->k, gate, gate, up, n);
    else
        c->ops->swiglu_forward(&c->k, gate, gate, up, n);
    return KILN_OK;
}

static kiln_status cpu_head(void *p, float *logits, const float *x, const kiln_weight *W, int64_t T, float scale, float cap) {
    cpu_ctx *c = p;
    c->ops->matmul_forward(&c->k, logits, x, W->view, T);
    if (scale != 1.0f || cap > 0) c->ops->scale_softcap_forward(&c->k, logits, T * W->view->ne[1], scale, cap);
    return KILN_OK;
}

static kiln_status cpu_argmax(void *p, int32_t *next, const float *x, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    *next = (int32_t)best;
    return KILN_OK;
}

static kiln_status cpu_nonfinite(void *p, int32_t *flag, const float *x, int64_t n, int32_t code) {
    if (*flag) return KILN_OK;
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i])) {
            *flag = code;
            break;
        }
    return KILN_OK;
}

const kiln_backend kiln_cpu_backend = {
    .name = "cpu",
    .host_memory = true,
    .open = cpu_open,
    .close = cpu_close,
    .load_weights = cpu_load_weights,
    .device_bytes = cpu_device_bytes,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .alloc_host = cpu_alloc,
    .free_host = cpu_free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .synchronize = cpu_synchronize,
    .record = cpu_record,
    .embed = cpu_embed,
    .residual_norm = cpu_residual_norm,
    .qkv = cpu_qkv,
    .qkv_post = cpu_qkv_post,
    .attention = cpu_attention,
    .sigmoid_mul = cpu_sigmoid_mul,
    .matmul = cpu_matmul,
    .ffn_up = cpu_ffn_up,
    .head = cpu_head,
    .argmax = cpu_argmax,
    .nonfinite = cpu_nonfinite,
};
