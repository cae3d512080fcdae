/* kernels.h: the launchers of kiln's CUDA inference kernels, callable from C and from the engine (engine.cu).
 * Every pointer is device memory unless its name starts with h_; every launcher enqueues on `stream` (a
 * cudaStream_t, NULL for the default stream), never synchronizes, and returns KILN_OK or the launch error, so a
 * whole decode step can be captured into one CUDA graph. Positions come from device memory (d_pos0), so a graph
 * captured once replays at every position.
 *
 * Each kernel family is one file: matvec.cu (decode matmuls), gemm.cu (prefill matmuls on tensor cores),
 * attention.cu, elementwise.cu. tests/test_cuda_*.c check each against the CPU oracle (src/cpu/ops.h) on fresh
 * random inputs with a stated NMSE and max-abs bound; they are compiled only with KILN_CUDA and skip without a GPU.
 *
 * Shapes: T tokens, C width, NH/NKV heads, HS head size, F FFN width, V vocab; activations f32 row-major (T, width). */
#ifndef KILN_CUDA_KERNELS_H
#define KILN_CUDA_KERNELS_H

#include "kiln.h"
#include "model/sample_args.h"

#ifdef __cplusplus
extern "C" {
#endif

/* RoPE scaling as a kernel takes it, by value (kernel parameters, captured by a CUDA graph like any other, so no
 * device copy to keep): pair i's angle is multiplied by f[i] and cos, sin by mscale (kiln_rope, src/model/model.h).
 * scaled false: the unscaled rotation, untouched. 128 pairs: the kernels' largest head (HS 256). */
#define KILN_CUDA_ROPE_MAX_PAIRS 128
typedef struct kiln_cuda_rope_freq {
    float f[KILN_CUDA_ROPE_MAX_PAIRS];
    float mscale;
    bool scaled;
} kiln_cuda_rope_freq;

/* The by-value table of h_freq (half, host memory, NULL: all 1) and mscale; half <= KILN_CUDA_ROPE_MAX_PAIRS. */
static inline kiln_cuda_rope_freq kiln_cuda_rope_freq_make(const float *h_freq, int64_t half, float mscale) {
    kiln_cuda_rope_freq r;
    r.mscale = mscale;
    r.scaled = h_freq || mscale != 1.0f;
    for (int64_t i = 0; i < KILN_CUDA_ROPE_MAX_PAIRS; i++) r.f[i] = h_freq && i < half ? h_freq[i] : 1.0f;
    return r;
}

/* A weight matrix on the GPU in its GGUF block format, exactly the file's bytes: rows of `cols` elements, row o
 * at data + o * row_bytes. cols is a whole number of blocks. */
typedef struct kiln_cuda_wt {
    kiln_type type;
    int64_t rows, cols; /* O outputs, I inputs (GGUF ne[1], ne[0]) */
    size_t row_bytes;
    const void *data;
} kiln_cuda_wt;

/* ---------------------------------------------------------------- matvec.cu: decode matmuls (T <= 8)
 * Batch-1 decode is memory-bound: each kernel streams the weight once at close to the copy bandwidth. The
 * activations are first put into the form the dot products want (for the block formats, int8 blocks of 32 with a
 * scale and sum, llama.cpp's q8_1, so a 4-byte dp4a does four multiply-adds) by matvec_prepare; every matmul of
 * that input then reads the prepared form. */

#define KILN_CUDA_MATVEC_MAX_T 8

/* Bytes of prepared activations for T rows of `cols` (cols a multiple of 32 for the block formats). */
size_t kiln_cuda_matvec_prep_bytes(int64_t T, int64_t cols);
/* xp <- x (T, cols) in the prepared form. */
kiln_status kiln_cuda_matvec_prepare(void *xp, const float *x, int64_t T, int64_t cols, void *stream);
/* y (T, W.rows) = x W^T, or y += x W^T when add (the residual add folded into the wo and down projections).
 * x is the float activation (T, W.cols), xp its prepared form; a kernel reads whichever its type wants.
 * T <= KILN_CUDA_MATVEC_MAX_T. Every type of the CPU backend: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q8_0, Q4_K,
 * Q5_K, Q6_K. */
kiln_status kiln_cuda_matvec(float *y, const float *x, const void *xp, const kiln_cuda_wt *W, int64_t T, bool add,
                             void *stream);
/* The gated FFN's first half in one pass over both weights: out (T, F) = act(x Wg^T) * (x Wu^T), act silu
 * (SwiGLU) or tanh-GELU (geglu). Wg and Wu have the same type and shape. */
kiln_status kiln_cuda_matvec_glu(float *out, const float *x, const void *xp, const kiln_cuda_wt *Wg, const kiln_cuda_wt *Wu,
                                 int64_t T, bool geglu, void *stream);

/* A matvec's tail: an epilogue for the kernel after it, run inside the matvec by the CTA that finishes the last
 * part of its input (an atomic counter per part in cnt, which that CTA sets back to zero), so a decode step saves
 * the kernel and its launch:
 *   KILN_CUDA_TAIL_PREPARE  out's prepared form (kiln_cuda_matvec_prepare's layout for T rows of W.rows) into xp,
 *                           each block of 32 outputs quantized by the CTA that completes it (the GLU before down);
 *   KILN_CUDA_TAIL_NORM     xb = rmsnorm(y, eps) * w for each of the T rows of y (the residual stream the wo and down
 *                           projections add into) and xb's prepared form into xp, by the last CTA of the grid.
 * cnt holds W.rows / 32 + 1 zeroed counters and is left zeroed; xp must not be the xp the matvec reads. */
typedef enum { KILN_CUDA_TAIL_NONE, KILN_CUDA_TAIL_PREPARE, KILN_CUDA_TAIL_NORM } kiln_cuda_tail_kind;
#define KILN_CUDA_PF_SPANS 4
typedef struct kiln_cuda_mv_tail {
    kiln_cuda_tail_kind kind;
    unsigned *cnt; /* device counters, zero */
    void *xp;      /* 16-byte aligned, kiln_cuda_matvec_prep_bytes(T, W.rows) */
    float *xb;     /* NORM: (T, W.rows) */
    const float *w; /* NORM: (W.rows) */
    float eps;
    /* L2 prefetch (any kind, NONE too): spans of the weights the next matmuls read, which the matvec's last CTAs
     * (up to 128 of them, in its last wave) start bringing into L2 (cp.async.bulk.prefetch.L2: a hint, no memory
     * effect), so that they arrive while the small kernels between the matmuls leave the memory idle. Each used
     * span (pf non-NULL) must be 16-byte aligned with pf_bytes a multiple of 16, else KILN_ERR_INVALID. */
    const void *pf[KILN_CUDA_PF_SPANS];
    size_t pf_bytes[KILN_CUDA_PF_SPANS];
    /* The prologue (pre_x non-NULL; kiln_cuda_matvec_pre_takes): the matvec makes its prepared x itself instead of
     * reading xp, so a decode step saves the kernel before it. Each CTA quantizes pre_x (W.cols floats) into shared
     * memory, after normalizing it when pre_w is given: xb = rmsnorm(pre_x, pre_eps) * pre_w, with
     * kiln_cuda_residual_norm_xp's arithmetic in its order, so the output is that kernel's and the matvec's bytes.
     * CTA 0 also writes xb to pre_xb (pre_w only; NULL: not written) and the prepared bytes to xp, which the launch
     * then writes and does not read: afterwards xp and pre_xb hold what residual_norm_xp (or matvec_prepare, without
     * pre_w) would have left. Needs no tail kind; combines with the prefetch. */
    const float *pre_x;  /* (W.cols), 16-byte aligned */
    const float *pre_w;  /* (W.cols), 16-byte aligned, or NULL */
    float pre_eps;
    float *pre_xb;       /* (W.cols), 16-byte aligned, or NULL */
} kiln_cuda_mv_tail;
/* Whether a matvec of T rows over W takes the prologue (normed: with pre_w): one token, W a block type the prologue
 * is built for (q4_0, q8_0, q4_K, q5_K, q6_K) of width a multiple of 32, at most KILN_CUDA_MV_PRE_MAX_COLS (the normed
 * prologue: KILN_CUDA_MV_PRE_NORM_MAX_COLS, so that a CTA holds the norm kernel's loads in registers). */
#define KILN_CUDA_MV_PRE_MAX_COLS 16384
#define KILN_CUDA_MV_PRE_NORM_MAX_COLS 4096
/* The threads of kiln_cuda_residual_norm's kernel for rows of n accesses, at most maxn a thread: whole warps. The
 * normed prologue replays that kernel's sums thread by thread, so it takes its thread count from here too. */
static inline int kiln_cuda_norm_threads(int64_t n, int maxn) { return (int)((n + maxn - 1) / maxn + 31) / 32 * 32; }
bool kiln_cuda_matvec_pre_takes(const kiln_cuda_wt *W, int64_t T, bool normed);
/* kiln_cuda_matvec and kiln_cuda_matvec_glu with a tail (NULL or KILN_CUDA_TAIL_NONE: none). For a tail W.rows must
 * be a multiple of 32 and y 16-byte aligned, else KILN_ERR_INVALID before launching. */
kiln_status kiln_cuda_matvec_tail(float *y, const float *x, const void *xp, const kiln_cuda_wt *W, int64_t T, bool add,
                                  const kiln_cuda_mv_tail *tail, void *stream);
/* y1 = x W1^T and y2 = x W2^T for one token in one launch, over the same prepared x (xp, T 1): each CTA is the one
 * kiln_cuda_matvec would run, so both outputs are its bytes. For weights of two types side by side (Q4_K_M's
 * merged q|k beside its Q6_K v): a q4_K or q5_K W1 beside a q6_K W2 of the same width, neither large enough for
 * kiln_cuda_matvec's 4 rows a group (kiln_cuda_matvec_pair_takes); others KILN_ERR_UNSUPPORTED. */
bool kiln_cuda_matvec_pair_takes(const kiln_cuda_wt *W1, const kiln_cuda_wt *W2);
kiln_status kiln_cuda_matvec_pair(float *y1, const kiln_cuda_wt *W1, float *y2, const kiln_cuda_wt *W2, const void *xp,
                                  void *stream);
/* The same with a prologue (pre: its pre_* fields only; NULL or pre_x NULL: none), as kiln_cuda_mv_tail says. */
kiln_status kiln_cuda_matvec_pair_pre(float *y1, const kiln_cuda_wt *W1, float *y2, const kiln_cuda_wt *W2, const void *xp,
                                      const kiln_cuda_mv_tail *pre, void *stream);
kiln_status kiln_cuda_matvec_glu_tail(float *out, const float *x, const void *xp, const kiln_cuda_wt *Wg,
                                      const kiln_cuda_wt *Wu, int64_t T, bool geglu, const kiln_cuda_mv_tail *tail,
                                      void *stream);

/* ---------------------------------------------------------------- gemm.cu: prefill matmuls (tensor cores)
 * A batch of T > 8 tokens is compute-bound: the weight is dequantized to bf16 into ws->w, x is rounded to bf16
 * into ws->x, and cuBLAS multiplies them with fp32 accumulation and output. */
typedef struct kiln_cuda_gemm_ws {
    void *blas;     /* cublasLt handle (kiln_cuda_gemm_ws_new) */
    void *w;        /* bf16, the largest weight's rows * cols */
    void *x;        /* bf16, max_T * the widest input */
    void *lt_ws;    /* cuBLASLt workspace */
    void *part;     /* f32, kiln_cuda_gemm_small's split partials */
    size_t w_bytes, x_bytes, lt_ws_bytes, part_bytes;
    int n_sm;       /* the device's SMs (gemm_small's split) */
} kiln_cuda_gemm_ws;

/* Allocates the workspace for weights of at most max_w_elems elements and inputs of at most max_x_elems. */
kiln_status kiln_cuda_gemm_ws_new(kiln_cuda_gemm_ws *ws, size_t max_w_elems, size_t max_x_elems);
void kiln_cuda_gemm_ws_free(kiln_cuda_gemm_ws *ws); /* accepts a zeroed ws */
/* Device bytes kiln_cuda_gemm_ws_new will take (for the engine's VRAM check before it allocates). */
size_t kiln_cuda_gemm_ws_bytes(size_t max_w_elems, size_t max_x_elems);
/* y (T, W.rows) = x (T, W.cols) W^T, or += when add. Any T >= 1; any type matvec takes. */
kiln_status kiln_cuda_gemm(float *y, const float *x, const kiln_cuda_wt *W, int64_t T, bool add, kiln_cuda_gemm_ws *ws,
                           void *stream);
/* gemm_small.cu: y (T, W.rows) = x W^T (+= when add) for a few rows, on the int8 tensor cores from W's blocks (each
 * weight byte read once for all T). xp is x (T, W.cols) in kiln_cuda_matvec_prepare's form, as for the matvecs, and
 * the result is theirs up to the order of the f32 sums. kiln_cuda_gemm_small_takes says whether it applies: Q4_0,
 * Q4_1, Q5_0, Q8_0, Q4_K, Q5_K or Q6_K, cols a multiple of 256, 1 <= T <= KILN_CUDA_GEMM_SMALL_MAX_T; otherwise
 * KILN_ERR_UNSUPPORTED. ws from kiln_cuda_gemm_ws_new (its split partials). */
#define KILN_CUDA_GEMM_SMALL_MAX_T 32
bool kiln_cuda_gemm_small_takes(const kiln_cuda_wt *W, int64_t T);
kiln_status kiln_cuda_gemm_small(float *y, const void *xp, const kiln_cuda_wt *W, int64_t T, bool add, kiln_cuda_gemm_ws *ws,
                                 void *stream);
/* The weight alone to bf16 (rows * cols elements): the dequantization gemm uses, for tests. */
kiln_status kiln_cuda_dequantize_bf16(const kiln_cuda_wt *W, void *out, void *stream);

/* ---------------------------------------------------------------- attention.cu
 * Causal GQA attention over the KV cache. q (T, NH*HS) f32 holds the queries of positions p0..p0+T-1 with
 * p0 = *d_pos0 (device memory, so a captured graph replays at any position). k_cache and v_cache are
 * (rows, NKV*HS) of type_k and type_v (kv.cuh's layouts; the block types need NKV*HS % 32 == 0, else
 * KILN_ERR_UNSUPPORTED) and hold position j in row j % rows (a ring when rows < max_pos; rows = the context for a
 * full layer). The query at p sees keys max(0, p - window + 1) .. p (window 0: all). Scores are scaled by
 * `scale` (1/sqrt(HS), or the model's), then capped to softcap tanh(s / softcap) when softcap > 0 (gemma2; 0: none).
 * out (T, NH*HS) f32. HS is any multiple of 8 up to 256 (compiled for each size
 * up to 64 and for 80, 96, 128, 256; the rest share run-time-sized kernels). ws_bytes(T) covers every launch of at
 * most T tokens. Decode (T <= 8) splits the keys over blocks (flash-decoding) into ws, the last block of
 * each query combining them (ws holds counters that must be zero-filled once before the first launch; each launch
 * leaves them zero); T > 8 runs a flash-attention kernel that never forms the T x T scores: on the tensor cores
 * (attention_tc.cu: q and the probabilities rounded to f16, about 1e-3 of the output's scale) for HS 64 and 128 over
 * an f16 cache without softcap unless KILN_ATTN_TC=0, else on CUDA cores in f32. max_pos bounds p0 + T (the
 * context), for sizing the split grid without reading d_pos0 on the host. */
size_t kiln_cuda_attention_ws_bytes(int64_t T, int64_t NH, int64_t HS, int64_t max_pos);
kiln_status kiln_cuda_attention(float *out, const float *q, const void *k_cache, const void *v_cache, kiln_kv_type type_k,
                                kiln_kv_type type_v, const int32_t *d_pos0, int64_t T, int64_t NH, int64_t NKV, int64_t HS, int64_t window,
                                int64_t rows, int64_t max_pos, float scale, float softcap, void *ws, void *stream);
/* Whether kiln_cuda_attention runs T tokens of one sequence on the tensor cores (q and out as cudaMalloc aligns them). */
bool kiln_cuda_attention_on_tc(int64_t T, int64_t HS, kiln_kv_type type_k, kiln_kv_type type_v, float softcap);
/* As kiln_cuda_attention, and also out's prepared form for the wo matvec (kiln_cuda_matvec_prepare's layout for
 * T rows of NH*HS) into xp when T <= KILN_CUDA_MATVEC_MAX_T and HS % 32 == 0; otherwise xp is left alone and
 * the call returns KILN_ERR_UNSUPPORTED before launching anything (the engine then prepares separately). */
kiln_status kiln_cuda_attention_xp(float *out, void *xp, const float *q, const void *k_cache, const void *v_cache,
                                   kiln_kv_type type_k, kiln_kv_type type_v, const int32_t *d_pos0, int64_t T, int64_t NH, int64_t NKV, int64_t HS, int64_t window,
                                   int64_t rows, int64_t max_pos, float scale, float softcap, void *ws, void *stream);
/* The decode rows of T sequences (T <= 1024) in one launch: row t of q is one token of the sequence whose caches lie
 * at k_cache and v_cache + d_seq[t] * seq_stride bytes, at position d_pos[t] (both (T) device memory); the rest as
 * kiln_cuda_attention's decode path (ws from kiln_cuda_attention_ws_bytes(>= T)), with out's prepared form into xp
 * when xp is not NULL (then T <= KILN_CUDA_MATVEC_MAX_T and HS % 32 == 0, else KILN_ERR_UNSUPPORTED). The batched
 * decode step of a context of many sequences: one launch per layer, not one per sequence. */
kiln_status kiln_cuda_attention_rows(float *out, void *xp, const float *q, const void *k_cache, const void *v_cache,
                                     kiln_kv_type type_k, kiln_kv_type type_v, const int32_t *d_pos, const int32_t *d_seq,
                                     size_t seq_stride, int64_t T, int64_t NH, int64_t NKV, int64_t HS, int64_t window,
                                     int64_t rows, int64_t max_pos, float scale, float softcap, void *ws, void *stream);
/* kiln_cuda_qkv_post without the QK-norm, fused into the decode attention: the arguments it takes beside the
 * attention's. k and v are the rows' keys and values as the qkv matmul left them; q too is read as the matmul
 * left it (and is not written). */
typedef struct kiln_cuda_attn_post {
    const float *k, *v;        /* (T, NKV*HS) */
    const float *bq, *bk, *bv; /* (NH*HS), (NKV*HS), (NKV*HS) biases, or NULL */
    const float *q_norm, *k_norm; /* (HS) each, or NULL: QK-norm over each head (not olmo2's whole-row norm) */
    float eps;
    int64_t rope_dim;
    float base, rope_mscale;
    const float *h_rope_freq; /* (rope_dim / 2) host memory, or NULL */
    bool neox, nope;
} kiln_cuda_attn_post;
/* Whether kiln_cuda_attention_post takes a launch: T = 1 of one sequence, or T rows of as many sequences (rows);
 * at most 8 query heads a KV head; HS 64, 128 or 256; any cache types (q8_0 and q4_0 quantized a block of 32 a
 * warp, as kiln_cuda_kv_quantize does); no softcap. */
bool kiln_cuda_attention_post_takes(int64_t T, bool rows, int64_t NH, int64_t NKV, int64_t HS, kiln_kv_type type_k,
                                    kiln_kv_type type_v, float softcap);
/* kiln_cuda_qkv_post (or _rows, with d_seq) then kiln_cuda_attention_xp (or _rows; xp may be NULL) in one decode
 * launch: each block gives its query heads their biases, QK-norm and RoPE in shared memory, and the block whose split holds
 * the row's own position stores its key and value into the cache before it reads it. The output, xp and the cache
 * are the two launches' bytes. */
kiln_status kiln_cuda_attention_post(float *out, void *xp, const float *q, const kiln_cuda_attn_post *post, void *k_cache,
                                     void *v_cache, kiln_kv_type type_k, kiln_kv_type type_v, const int32_t *d_pos,
                                     const int32_t *d_seq, size_t seq_stride, int64_t T, int64_t NH, int64_t NKV, int64_t HS,
                                     int64_t window, int64_t rows, int64_t max_pos, float scale, float softcap, void *ws,
                                     void *stream);

/* ---------------------------------------------------------------- phase_bench.cu
 * The time per phase of n_phases phases of trivial work (each of the one-per-SM CTAs reads bytes_per_cta and
 * writes a float; *n_cta gets their count): us[0] a kernel a phase in a CUDA graph, us[1] the same with PDL,
 * us[2] one persistent kernel with a grid barrier between phases. For `kiln bench gpu-kernels --phases`. */
kiln_status kiln_cuda_phase_bench(int n_phases, size_t bytes_per_cta, int *n_cta, double us[3]);

/* ---------------------------------------------------------------- elementwise.cu: everything else, fused */
/* out (T, C) = scale * dequantized rows d_ids[t] of table (V rows of C): the embedding gather, one row per token
 * dequantized on the GPU. Ids were validated by the session. */
kiln_status kiln_cuda_embed(float *out, const kiln_cuda_wt *table, const int32_t *d_ids, int64_t T, float scale,
                            void *stream);
/* The residual step between sub-blocks, one kernel per row of C:
 *   if y:     x += (post_w ? rmsnorm(y, post_eps) * post_w : y)      (the sandwich norm's post-norm when post_w)
 *   if out:   out = rmsnorm(x, eps) * w
 * x (T, C) is the residual stream; y (T, C) a block's output or NULL; out (T, C) or NULL. */
kiln_status kiln_cuda_residual_norm(float *x, const float *y, const float *post_w, float post_eps, float *out,
                                    const float *w, float eps, int64_t T, int64_t C, void *stream);
/* As kiln_cuda_residual_norm with out, also writing out's prepared form for the matvecs that read it
 * (kiln_cuda_matvec_prepare's layout for T rows of C) into xp; T <= KILN_CUDA_MATVEC_MAX_T and C % 32 == 0, or
 * KILN_ERR_INVALID before launching. Saves the prepare kernel after each norm in decode. */
kiln_status kiln_cuda_residual_norm_xp(float *x, const float *y, const float *post_w, float post_eps, float *out, void *xp,
                                       const float *w, float eps, int64_t T, int64_t C, void *stream);
/* After the q, k, v projections, per token and head: add the biases (bq/bk/bv, or NULL), RMSNorm each head of q
 * and k (q_norm/k_norm (HS), or NULL; eps), rotate the first rope_dim of each head at position *d_pos0 + t with
 * base (interleaved pairs, or NeoX halves when neox; not at all when nope) by llama.cpp's float recurrence
 * (src/cpu/ops_rope.c), multiply q by q_scale, and store k and v as type_k and type_v into cache rows (p % rows):
 * f16, f32, bf16 rounded to nearest even by the same kernel; q8_0 and q4_0 by a second one (kiln_cuda_kv_quantize)
 * from the final k (and v + bias) that the first writes back over k and v. q (T, NH*HS) is updated in place; k, v
 * (T, NKV*HS) are read, and overwritten so for a block type. */
kiln_status kiln_cuda_qkv_post(float *q, float *k, float *v, const float *bq, const float *bk, const float *bv,
                               const float *q_norm, const float *k_norm, float eps, const int32_t *d_pos0, int64_t T,
                               int64_t NH, int64_t NKV, int64_t HS, int64_t rope_dim, float base, const float *h_rope_freq,
                               float rope_mscale, bool neox, bool nope, float q_scale, void *k_cache, void *v_cache,
                               kiln_kv_type type_k, kiln_kv_type type_v, int64_t rows, void *stream);
/* As kiln_cuda_qkv_post over T rows of T sequences: row t is at position d_pos[t] and stores into the caches at
 * k_cache and v_cache + d_seq[t] * seq_stride bytes (d_pos, d_seq (T) device memory). */
kiln_status kiln_cuda_qkv_post_rows(float *q, float *k, float *v, const float *bq, const float *bk, const float *bv,
                                    const float *q_norm, const float *k_norm, float eps, const int32_t *d_pos,
                                    const int32_t *d_seq, size_t seq_stride, int64_t T, int64_t NH, int64_t NKV, int64_t HS,
                                    int64_t rope_dim, float base, const float *h_rope_freq, float rope_mscale, bool neox,
                                    bool nope, float q_scale, void *k_cache, void *v_cache, kiln_kv_type type_k,
                                    kiln_kv_type type_v, int64_t rows, void *stream);
/* cache rows (p0 + t) % rows (p0 = *d_pos0) = src (T, KV) quantized as type (q8_0 or q4_0, KV % 32 == 0) by GGML's
 * reference quantizers (quantize_row_q8_0_ref / q4_0_ref), the CPU's bytes for the same floats. */
kiln_status kiln_cuda_kv_quantize(void *cache, const float *src, kiln_kv_type type, const int32_t *d_pos0, int64_t T,
                                  int64_t KV, int64_t rows, void *stream);
/* out (n) = act(gate) * up, act silu or tanh-GELU (geglu); out may equal gate. */
kiln_status kiln_cuda_glu(float *out, const float *gate, const float *up, int64_t n, bool geglu, void *stream);
/* x (n) *= sigmoid(g (n)): the attention output gate. */
kiln_status kiln_cuda_sigmoid_mul(float *x, const float *g, int64_t n, void *stream);
/* x (n) = cap * tanh(scale * x / cap), or scale * x when cap is 0. */
kiln_status kiln_cuda_scale_softcap(float *x, int64_t n, float scale, float cap, void *stream);
/* d_out (T) = the index of each row's largest value in x (T, n), the lowest index on ties (greedy decode reads
 * back 4 bytes per token). */
kiln_status kiln_cuda_argmax(int32_t *d_out, const float *x, int64_t T, int64_t n, void *stream);
/* *d_out = the token the CPU sampler's pipeline draws from the row logits (V) under d_args (device memory, read when
 * the kernel runs), in one CTA (sample.cu). work holds kiln_cuda_sample_work_bytes(V); logits are left as they are. */
size_t kiln_cuda_sample_work_bytes(int64_t V);
kiln_status kiln_cuda_sample(int32_t *d_out, const float *logits, int64_t V, const kiln_sample_args *d_args, void *work,
                             void *stream);

#ifdef __cplusplus
}
#endif
#endif
