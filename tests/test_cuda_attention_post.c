/* test_cuda_attention_post.c: kiln_cuda_attention_post (src/cuda/attention.cu), the decode attention with the qkv
 * epilogue fused in, against the two launches it replaces: kiln_cuda_qkv_post (or _rows) then
 * kiln_cuda_attention_xp (or _rows), on the same random q, k, v, biases and caches. The fused launch must give the
 * same output floats, the same xp bytes and the same cache bytes (every byte of both caches: the row it stores and
 * the rows it must leave alone), bit for bit: it runs the same operations in the same order.
 *
 * Cases: head sizes 64, 128 and 256; GQA groups 1, 3, 4, 7 and 8 (the largest one block serves); biases or none;
 * QK-norm (per head, Qwen3's and gemma3's) or none; interleaved and NeoX rotation, a partial rotary dimension, RoPE scaling (per-pair factors and mscale), a NoPE
 * layer; one token at positions 0, 5, 700 (11 live splits: the last one stores the row) and 1000 over a ring of
 * 80 rows with a window of 64 (and of 520 rows with a window of 512 at HS 256); and rows of 3 sequences at different positions in one launch (with their own caches
 * at seq_stride, in reversed order). Every launch after the first leaves the split counters at zero (checked by
 * the next case's decode, which merges through them).
 *
 * The cache types: f16 (most cases), and q8_0, q4_0, bf16, f32 and mixed pairs (k one type, v another), one
 * token and rows of 3 sequences, the block types written a block of 32 a warp as kv_quantize writes them.
 *
 * kiln_cuda_attention_post_takes and the launcher refuse what has no fused kernel (HS 96, 16 query heads a KV
 * head, a softcap, one sequence's T > 1) with KILN_ERR_UNSUPPORTED. Skips without CUDA or a GPU. */
#include "test.h"

#ifdef KILN_CUDA

#include "cuda/cuda.h"
#include "cuda/kernels.h"
#include "fp16.h"
#include "quants.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#define MAXP 1024 /* max_pos of every launch */

typedef struct {
    int64_t NH, NKV, HS, rope_dim;
    bool neox, nope, bias, scaled, norm;
    int pos, window, rows; /* rows: cache rows a sequence (MAXP: the whole context) */
    int n_seq;             /* 0: one sequence, T = 1; else rows of n_seq sequences */
    kiln_kv_type kt, vt;   /* the caches' types */
} post_case;

#define CASE_FMT                                                                                                            \
    "NH %lld NKV %lld HS %lld rope_dim %lld neox %d nope %d bias %d scaled %d norm %d pos %d window %d rows %d seqs %d "   \
    "caches %s %s"
#define CASE_ARGS(c)                                                                                                        \
    (long long)(c).NH, (long long)(c).NKV, (long long)(c).HS, (long long)(c).rope_dim, (c).neox, (c).nope, (c).bias,        \
        (c).scaled, (c).norm, (c).pos, (c).window, (c).rows, (c).n_seq, kiln_kv_type_name((c).kt), kiln_kv_type_name((c).vt)

typedef struct {
    void *q, *qr, *k, *kr, *v, *vr, *bq, *bk, *bv, *nw, *kc, *vc, *kcr, *vcr, *out, *outr, *xp, *xpr, *ws, *pos, *seq;
} bufs;

static void *dalloc(size_t bytes, kiln_status *s) {
    void *p = NULL;
    if (*s == KILN_OK) *s = kiln_cuda_alloc(&p, bytes ? bytes : 16);
    return p;
}

static void fill_normal(float *x, int64_t n, unsigned long long *rng) {
    for (int64_t i = 0; i < n; i++) x[i] = test_rng_normal(rng);
}

/* n_caches caches of rows rows of KV elements of type t, each cache at stride bytes (the rest zero): random
 * normal values, or blocks with a scale of 0.02-0.03 and random codes. */
static void fill_cache(uint8_t *buf, size_t bytes, kiln_kv_type t, int64_t n_caches, int64_t rows, int64_t KV, size_t stride,
                       unsigned long long *rng) {
    memset(buf, 0, bytes);
    const size_t rb = kiln_kv_row_bytes(t, KV);
    for (int64_t c = 0; c < n_caches; c++)
        for (int64_t r = 0; r < rows; r++) {
            uint8_t *row = buf + (size_t)c * stride + (size_t)r * rb;
            if (t == KILN_KV_Q8_0 || t == KILN_KV_Q4_0) {
                const size_t bb = t == KILN_KV_Q8_0 ? 34 : 18;
                for (int64_t b = 0; b < KV / 32; b++) {
                    uint8_t *blk = row + (size_t)b * bb;
                    const uint16_t d = kiln_f32_to_fp16(0.02f + 0.01f * test_rng_f32(rng));
                    memcpy(blk, &d, 2);
                    for (size_t i = 2; i < bb; i++) blk[i] = (uint8_t)test_rng_next(rng);
                }
            } else {
                for (int64_t i = 0; i < KV; i++) {
                    const float x = test_rng_normal(rng);
                    if (t == KILN_KV_F32) memcpy(row + 4 * i, &x, 4);
                    else {
                        const uint16_t h = t == KILN_KV_BF16 ? kiln_f32_to_bf16(x) : kiln_f32_to_fp16(x);
                        memcpy(row + 2 * i, &h, 2);
                    }
                }
            }
        }
}

/* The first byte where a and b (n bytes) differ, -1 if none. */
static int64_t first_diff(const void *a, const void *b, size_t n) {
    const unsigned char *x = a, *y = b;
    for (size_t i = 0; i < n; i++)
        if (x[i] != y[i]) return (int64_t)i;
    return -1;
}

/* Runs c both ways; what names the first difference (NULL: none), at its byte. */
static kiln_status run_case(const post_case *c, const bufs *b, unsigned long long *rng, const char **what, int64_t *at) {
    const int64_t T = c->n_seq ? c->n_seq : 1, Q = c->NH * c->HS, KV = c->NKV * c->HS, n_caches = c->n_seq ? c->n_seq : 1;
    const size_t rbk = kiln_kv_row_bytes(c->kt, KV), rbv = kiln_kv_row_bytes(c->vt, KV), rb = rbk > rbv ? rbk : rbv;
    const size_t stride = (size_t)c->rows * rb; /* one stride for both caches of a sequence, as a session's */
    const size_t qb = (size_t)(T * Q) * 4, kvb = (size_t)(T * KV) * 4, cache_b = (size_t)n_caches * stride;
    const size_t xpb = kiln_cuda_matvec_prep_bytes(T, Q);
    float *hq = malloc(qb), *hk = malloc(kvb), *hv = malloc(kvb), *hb = malloc((size_t)(Q + 2 * KV) * 4);
    float *o1 = malloc(qb), *o2 = malloc(qb), freq[128], nw[512];
    uint8_t *cache = malloc(cache_b), *c1 = malloc(cache_b), *c2 = malloc(cache_b);
    unsigned char *x1 = malloc(xpb), *x2 = malloc(xpb);
    int32_t pos[8], seq[8];
    kiln_status s = KILN_OK;
    *what = NULL;
    fill_normal(hq, T * Q, rng), fill_normal(hk, T * KV, rng), fill_normal(hv, T * KV, rng), fill_normal(hb, Q + 2 * KV, rng);
    for (int i = 0; i < 128; i++) freq[i] = 0.25f + 0.75f * (float)i / 128.0f;
    for (int i = 0; i < 512; i++) nw[i] = 1.0f + 0.5f * test_rng_normal(rng); /* q's norm weights, then k's */
    for (int64_t t = 0; t < T; t++) pos[t] = c->pos + 37 * (int32_t)t, seq[t] = (int32_t)(T - 1 - t);
    const float scale = 1.0f / sqrtf((float)c->HS), mscale = c->scaled ? 1.125f : 1.0f, base = 10000.0f;
    const float *h_freq = c->scaled ? freq : NULL;
    const float *bq = c->bias ? b->bq : NULL, *bk = c->bias ? b->bk : NULL, *bv = c->bias ? b->bv : NULL;
    const int32_t *dseq = c->n_seq ? (const int32_t *)b->seq : NULL;
    const float *qn = c->norm ? b->nw : NULL, *kn = c->norm ? (const float *)b->nw + 256 : NULL, eps = 1e-6f;
#define UP(d, h, n) \
    if (s == KILN_OK) s = kiln_cuda_upload(d, h, n)
    UP(b->q, hq, qb);
    UP(b->qr, hq, qb);
    UP(b->k, hk, kvb);
    UP(b->kr, hk, kvb);
    UP(b->v, hv, kvb);
    UP(b->vr, hv, kvb);
    UP(b->bq, hb, (size_t)Q * 4);
    UP(b->bk, hb + Q, (size_t)KV * 4);
    UP(b->bv, hb + Q + KV, (size_t)KV * 4);
    UP(b->nw, nw, sizeof nw);
    fill_cache(cache, cache_b, c->kt, n_caches, c->rows, KV, stride, rng);
    UP(b->kc, cache, cache_b);
    UP(b->kcr, cache, cache_b);
    fill_cache(cache, cache_b, c->vt, n_caches, c->rows, KV, stride, rng);
    UP(b->vc, cache, cache_b);
    UP(b->vcr, cache, cache_b);
    UP(b->pos, pos, sizeof pos);
    UP(b->seq, seq, sizeof seq);
    memset(o1, 0xff, qb), memset(x1, 0xff, xpb); /* poison: an unwritten output fails */
    UP(b->out, o1, qb);
    UP(b->outr, o1, qb);
    UP(b->xp, x1, xpb);
    UP(b->xpr, x1, xpb);
#undef UP
    /* the two launches */
    if (s == KILN_OK)
        s = c->n_seq ? kiln_cuda_qkv_post_rows(b->qr, b->kr, b->vr, bq, bk, bv, qn, kn, eps, b->pos, dseq, stride, T, c->NH, c->NKV,
                                               c->HS, c->rope_dim, base, h_freq, mscale, c->neox, c->nope, 1.0f, b->kcr, b->vcr,
                                               c->kt, c->vt, c->rows, NULL)
                     : kiln_cuda_qkv_post(b->qr, b->kr, b->vr, bq, bk, bv, qn, kn, eps, b->pos, T, c->NH, c->NKV, c->HS,
                                          c->rope_dim, base, h_freq, mscale, c->neox, c->nope, 1.0f, b->kcr, b->vcr, c->kt,
                                          c->vt, c->rows, NULL);
    if (s == KILN_OK)
        s = c->n_seq ? kiln_cuda_attention_rows(b->outr, b->xpr, b->qr, b->kcr, b->vcr, c->kt, c->vt, b->pos, dseq, stride, T,
                                                c->NH, c->NKV, c->HS, c->window, c->rows, MAXP, scale, 0.0f, b->ws, NULL)
                     : kiln_cuda_attention_xp(b->outr, b->xpr, b->qr, b->kcr, b->vcr, c->kt, c->vt, b->pos, T, c->NH,
                                              c->NKV, c->HS, c->window, c->rows, MAXP, scale, 0.0f, b->ws, NULL);
    /* the fused one */
    const kiln_cuda_attn_post post = {b->k, b->v, bq, bk, bv, qn, kn, eps, c->rope_dim, base, mscale, h_freq, c->neox, c->nope};
    if (s == KILN_OK)
        s = kiln_cuda_attention_post(b->out, b->xp, b->q, &post, b->kc, b->vc, c->kt, c->vt, b->pos, dseq, stride, T, c->NH,
                                     c->NKV, c->HS, c->window, c->rows, MAXP, scale, 0.0f, b->ws, NULL);
    if (s == KILN_OK) s = kiln_cuda_sync();
    if (s == KILN_OK) s = kiln_cuda_download(o1, b->out, qb);
    if (s == KILN_OK) s = kiln_cuda_download(o2, b->outr, qb);
    if (s == KILN_OK) s = kiln_cuda_download(x1, b->xp, xpb);
    if (s == KILN_OK) s = kiln_cuda_download(x2, b->xpr, xpb);
    int64_t d;
    if (s == KILN_OK && (d = first_diff(o1, o2, qb)) >= 0) *what = "out differs at byte", *at = d;
    if (s == KILN_OK && !*what && (d = first_diff(x1, x2, xpb)) >= 0) *what = "xp differs at byte", *at = d;
    for (int kv = 0; kv < 2 && s == KILN_OK && !*what; kv++) {
        s = kiln_cuda_download(c1, kv ? b->vc : b->kc, cache_b);
        if (s == KILN_OK) s = kiln_cuda_download(c2, kv ? b->vcr : b->kcr, cache_b);
        if (s == KILN_OK && (d = first_diff(c1, c2, cache_b)) >= 0) *what = kv ? "v cache differs at byte" : "k cache differs at byte", *at = d;
    }
    free(hq), free(hk), free(hv), free(hb), free(o1), free(o2), free(cache), free(c1), free(c2), free(x1), free(x2);
    return s;
}

static void test_post_matches_two_launches(void) {
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    const post_case cases[] = {
        /* NH NKV HS rope_dim neox nope bias scaled norm pos window rows n_seq kt vt */
        {12, 4, 64, 64, false, false, false, false, false, 0, 0, MAXP, 0, KILN_KV_F16, KILN_KV_F16},
        {12, 4, 64, 64, false, false, false, false, false, 5, 0, MAXP, 0, KILN_KV_F16, KILN_KV_F16},
        {12, 4, 64, 64, false, false, true, false, false, 700, 0, MAXP, 0, KILN_KV_F16, KILN_KV_F16},
        {32, 32, 128, 128, false, false, false, false, false, 700, 0, MAXP, 0, KILN_KV_F16, KILN_KV_F16},
        {14, 2, 64, 64, true, false, true, false, false, 300, 0, MAXP, 0, KILN_KV_F16, KILN_KV_F16},
        {32, 4, 128, 128, true, false, false, true, false, 1000, 64, 80, 0, KILN_KV_F16, KILN_KV_F16},
        {8, 1, 128, 64, false, false, true, false, false, 129, 0, MAXP, 0, KILN_KV_F16, KILN_KV_F16},
        {16, 2, 128, 96, true, false, false, true, false, 700, 0, MAXP, 0, KILN_KV_F16, KILN_KV_F16},
        {12, 4, 64, 64, false, true, true, false, false, 700, 0, MAXP, 0, KILN_KV_F16, KILN_KV_F16},
        {12, 4, 64, 64, false, false, true, false, false, 3, 0, MAXP, 3, KILN_KV_F16, KILN_KV_F16},
        {32, 8, 128, 128, true, false, false, true, false, 600, 64, 80, 3, KILN_KV_F16, KILN_KV_F16},
        /* QK-norm: Qwen3's shape (with biases too, as qkv_post takes both), NoPE, gemma3's HS 256 over a ring */
        {16, 8, 128, 128, true, false, true, false, true, 700, 0, MAXP, 0, KILN_KV_F16, KILN_KV_F16},
        {12, 4, 64, 64, false, true, false, false, true, 40, 0, MAXP, 0, KILN_KV_F16, KILN_KV_F16},
        {4, 1, 256, 256, true, false, false, false, true, 1000, 512, 520, 0, KILN_KV_F16, KILN_KV_F16},
        {8, 1, 256, 256, true, false, false, true, true, 5, 0, MAXP, 0, KILN_KV_F16, KILN_KV_F16},
        {8, 2, 256, 128, false, false, true, false, false, 300, 0, MAXP, 0, KILN_KV_F16, KILN_KV_F16},
        {16, 8, 128, 128, true, false, false, false, true, 600, 64, 80, 3, KILN_KV_F16, KILN_KV_F16},
        {8, 2, 256, 256, true, false, false, false, true, 9, 0, MAXP, 3, KILN_KV_F16, KILN_KV_F16},
        /* the other cache types, and mixed pairs */
        {32, 8, 128, 128, true, false, false, false, false, 700, 0, MAXP, 0, KILN_KV_Q8_0, KILN_KV_Q8_0},
        {12, 4, 64, 64, false, false, true, false, false, 5, 0, MAXP, 0, KILN_KV_Q4_0, KILN_KV_Q4_0},
        {16, 8, 128, 128, true, false, true, false, true, 300, 0, MAXP, 0, KILN_KV_Q8_0, KILN_KV_F16},
        {12, 4, 64, 64, false, false, false, true, false, 1000, 64, 80, 0, KILN_KV_F16, KILN_KV_Q4_0},
        {8, 1, 256, 256, true, false, false, false, true, 600, 0, MAXP, 0, KILN_KV_BF16, KILN_KV_BF16},
        {12, 4, 64, 64, false, true, true, false, false, 40, 0, MAXP, 0, KILN_KV_F32, KILN_KV_F32},
        {32, 8, 128, 128, true, false, false, true, false, 600, 64, 80, 3, KILN_KV_Q8_0, KILN_KV_Q8_0},
        {12, 4, 64, 64, false, false, true, false, true, 3, 0, MAXP, 3, KILN_KV_Q4_0, KILN_KV_BF16},
        {8, 2, 256, 256, true, false, false, false, true, 9, 0, MAXP, 3, KILN_KV_Q8_0, KILN_KV_Q4_0},
    };
    kiln_status s = KILN_OK;
    bufs b;
    const size_t QB = (size_t)3 * 32 * 128 * 4, KVB = (size_t)3 * 32 * 128 * 4, CB = (size_t)3 * MAXP * 32 * 128 * 4;
    b.q = dalloc(QB, &s), b.qr = dalloc(QB, &s), b.k = dalloc(KVB, &s), b.kr = dalloc(KVB, &s), b.v = dalloc(KVB, &s);
    b.vr = dalloc(KVB, &s), b.bq = dalloc(QB, &s), b.bk = dalloc(KVB, &s), b.bv = dalloc(KVB, &s), b.kc = dalloc(CB, &s);
    b.nw = dalloc(512 * 4, &s);
    b.vc = dalloc(CB, &s), b.kcr = dalloc(CB, &s), b.vcr = dalloc(CB, &s), b.out = dalloc(QB, &s), b.outr = dalloc(QB, &s);
    const size_t xpb = kiln_cuda_matvec_prep_bytes(3, 32 * 128), wsb = kiln_cuda_attention_ws_bytes(3, 32, 128, MAXP);
    b.xp = dalloc(xpb, &s), b.xpr = dalloc(xpb, &s), b.ws = dalloc(wsb, &s), b.pos = dalloc(64, &s), b.seq = dalloc(64, &s);
    if (s == KILN_OK) { /* the split counters start at zero */
        void *z = calloc(1, wsb);
        s = kiln_cuda_upload(b.ws, z, wsb);
        free(z);
    }
    unsigned long long rng = 77;
    const char *what = NULL;
    int64_t at = -1;
    int ci = 0;
    for (; s == KILN_OK && !what && ci < (int)(sizeof cases / sizeof cases[0]); ci++) s = run_case(&cases[ci], &b, &rng, &what, &at);
    void *all[] = {b.q, b.qr, b.k, b.kr, b.v, b.vr, b.bq, b.bk, b.bv, b.nw, b.kc, b.vc, b.kcr, b.vcr, b.out, b.outr, b.xp, b.xpr, b.ws, b.pos, b.seq};
    for (int i = 0; i < (int)(sizeof all / sizeof all[0]); i++) kiln_cuda_free(all[i]);
    CHECK(s == KILN_OK, "%s", kiln_last_error());
    if (what) {
        const post_case c = cases[ci - 1];
        CHECK(!what, CASE_FMT ": %s %lld", CASE_ARGS(c), what, (long long)at);
    }
}

static void test_post_refuses(void) {
    CHECK(kiln_cuda_attention_post_takes(1, false, 32, 8, 128, KILN_KV_F16, KILN_KV_F16, 0.0f), "the plain case is taken");
    CHECK(kiln_cuda_attention_post_takes(5, true, 32, 8, 64, KILN_KV_F16, KILN_KV_F16, 0.0f), "rows of sequences are taken");
    CHECK(!kiln_cuda_attention_post_takes(2, false, 32, 8, 128, KILN_KV_F16, KILN_KV_F16, 0.0f), "2 tokens of one sequence");
    CHECK(!kiln_cuda_attention_post_takes(1, false, 32, 8, 96, KILN_KV_F16, KILN_KV_F16, 0.0f), "HS 96");
    CHECK(kiln_cuda_attention_post_takes(1, false, 4, 1, 256, KILN_KV_F16, KILN_KV_F16, 0.0f), "HS 256 is taken");
    CHECK(kiln_cuda_attention_post_takes(1, false, 32, 8, 128, KILN_KV_Q8_0, KILN_KV_F16, 0.0f), "a q8_0 cache is taken");
    CHECK(!kiln_cuda_attention_post_takes(1, false, 32, 8, 128, (kiln_kv_type)9, KILN_KV_F16, 0.0f), "cache type 9");
    CHECK(!kiln_cuda_attention_post_takes(1, false, 32, 2, 128, KILN_KV_F16, KILN_KV_F16, 0.0f), "16 query heads a KV head");
    CHECK(!kiln_cuda_attention_post_takes(1, false, 32, 8, 128, KILN_KV_F16, KILN_KV_F16, 30.0f), "a softcap");
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    /* the launcher refuses before touching anything: every pointer may be a dummy */
    float dummy[4];
    const kiln_cuda_attn_post post = {dummy, dummy, NULL, NULL, NULL, NULL, NULL, 0.0f, 128, 10000.0f, 1.0f, NULL, false, false};
    const kiln_status s = kiln_cuda_attention_post(dummy, NULL, dummy, &post, dummy, dummy, KILN_KV_F16, KILN_KV_F16, (const int32_t *)dummy,
                                                   NULL, 0, 1, 32, 8, 96, 0, 64, 64, 0.1f, 0.0f, dummy, NULL);
    CHECK(s == KILN_ERR_UNSUPPORTED, "HS 96: status %d, want KILN_ERR_UNSUPPORTED", (int)s);
    const kiln_cuda_attn_post odd = {dummy, dummy, NULL, NULL, NULL, NULL, NULL, 0.0f, 63, 10000.0f, 1.0f, NULL, false, false};
    const kiln_status s2 = kiln_cuda_attention_post(dummy, NULL, dummy, &odd, dummy, dummy, KILN_KV_F16, KILN_KV_F16, (const int32_t *)dummy,
                                                    NULL, 0, 1, 32, 8, 128, 0, 64, 64, 0.1f, 0.0f, dummy, NULL);
    CHECK(s2 == KILN_ERR_INVALID, "rope_dim 63: status %d, want KILN_ERR_INVALID", (int)s2);
}

int main(void) {
    RUN(test_post_refuses);
    RUN(test_post_matches_two_launches);
    TEST_EXIT();
}

#else

static void test_attention_post(void) { SKIP("kiln built without CUDA"); }

int main(void) {
    RUN(test_attention_post);
    TEST_EXIT();
}

#endif
