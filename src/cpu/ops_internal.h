/* ops_internal.h: what the files of the CPU ops table (src/cpu/ops*.c) share: each op family's entry points,
 * the SIMD level they all use, and the helpers that split work over the pool. Not part of the library's API;
 * tests include it only to force a SIMD level: test_ops.c to check a level against the oracle, test_generate.c
 * to run a golden at the scalar level. */
#ifndef KILN_CPU_OPS_INTERNAL_H
#define KILN_CPU_OPS_INTERNAL_H

#include "ops.h"
#include "quants.h"
#include "cpu/simd.h"

#include <math.h>
#include <stdatomic.h>

/* Every op needs this alignment for its scratch rows (a cache line: threads never share one). */
#define KILN_OPS_ALIGN 64

/* ops_util.c: the level every op dispatches on: kiln_simd_best() read once, because CPUID traps to the hypervisor in a
 * VM (measured 50 us a call, more than a whole small matmul). force_level lowers it for tests; a level above
 * what the CPU supports is capped to it. */
kiln_simd kiln_cpu_ops_level(void);
void kiln_cpu_ops_force_level(kiln_simd level);
/* Whether the repacked matmuls use the AMX tile kernels (gemm_repack_amx.c) for runs of 16 tokens: only where
 * the CPU has AMX, at the AVX-512 level, and KILN_AMX=1 asks for them (measured slower than the VNNI kernels on a
 * Sapphire Rapids-class Xeon, docs/cpu.md); force_amx sets it for tests, on only where the CPU has AMX. */
bool kiln_cpu_ops_amx(void);
void kiln_cpu_ops_force_amx(bool on);

/* Runs fn(arg, ith, nth) on every thread of the pool when parallel is true and there is a pool, else once
 * on the caller as (0, 1). A pool wake-up costs 10-90 us (condition variable round trip), so an op asks
 * for threads only when its work is worth more than that. */
void kiln_ops_run(kiln_ops_ctx *ctx, kiln_pool_fn fn, void *arg, bool parallel);
int kiln_ops_n_threads(const kiln_ops_ctx *ctx);

/* The scratch buffer rounded up to KILN_OPS_ALIGN, and the bytes left after that. */
void *kiln_ops_scratch(const kiln_ops_ctx *ctx, size_t *bytes);

/* Thread ith's share [*lo, *hi) of n items in nth near-equal contiguous parts. */
static inline void kiln_ops_split(int64_t n, int ith, int nth, int64_t *lo, int64_t *hi) {
    *lo = n * ith / nth;
    *hi = n * (ith + 1) / nth;
}

/* A one-shot barrier inside a pool job: every thread of the job increments, then spins until all have.
 * The job's threads all run at once (kiln_pool_run starts every one), so spinning is safe; it yields after
 * a while so oversubscribed machines (more threads than cores, sanitizers) still make progress. */
void kiln_ops_barrier(atomic_int *count, int nth);

/* Sizes: a*b, or SIZE_MAX when it overflows (so the allocation that follows fails instead of being short). */
static inline size_t kiln_ops_mul(size_t a, size_t b) { return a && b > SIZE_MAX / a ? SIZE_MAX : a * b; }
static inline size_t kiln_ops_add(size_t a, size_t b) { return a > SIZE_MAX - b ? SIZE_MAX : a + b; }
static inline size_t kiln_ops_round_up(size_t n, size_t a) { return n > SIZE_MAX - (a - 1) ? SIZE_MAX : (n + a - 1) / a * a; }

/* ---- one op family per file; signatures as in kiln_ops (ops.h) */

/* ops.c */
void kiln_cpu_embed_forward(kiln_ops_ctx *ctx, float *out, const kiln_tensor_view *table, const int32_t *ids, int64_t T);
size_t kiln_cpu_scratch_size(int64_t T, int64_t max_width, int64_t NH, int64_t n_ctx, int n_threads);
/* ops_rmsnorm.c */
void kiln_cpu_rmsnorm_forward(kiln_ops_ctx *ctx, float *out, const float *x, const float *w, int64_t T, int64_t C, float eps);
/* ops_matmul.c */
void kiln_cpu_matmul_forward(kiln_ops_ctx *ctx, float *y, const float *x, const kiln_tensor_view *W, int64_t T);
void kiln_cpu_matmul_n_forward(kiln_ops_ctx *ctx, int n, float *const *y, const float *x, const kiln_tensor_view *const *W,
                               int64_t T);
size_t kiln_cpu_matmul_scratch_size(int64_t T, int64_t max_width);
/* ops_repack.c (its own header, ops_repack.h, has the layouts and kernels) */
kiln_status kiln_cpu_prepare_weights(kiln_ops_ctx *ctx, const kiln_tensor_view *const *W, int64_t n, bool drop_source);
void kiln_cpu_release_weights(kiln_ops_ctx *ctx);
/* Multi-row dot kernels for prefill (src/cpu/gemm_*.c): s[r * bs] = vec_dot(n, x, y + r * by) for the 4
 * activation rows r = 0..3, each weight block unpacked once for all 4; bit-for-bit equal to 4 calls of the
 * same level's vec_dot. kiln_cpu_get_gemm4 returns the kernel of exactly that level, or NULL where there is
 * none (the matmul then calls vec_dot per row). */
typedef void (*kiln_gemm4_fn)(int64_t n, float *s, size_t bs, const void *x, const void *y, size_t by);
kiln_gemm4_fn kiln_cpu_get_gemm4(kiln_type t, kiln_simd level);
void kiln_gemm4_q4_K_q8_K_avx2(int64_t n, float *s, size_t bs, const void *x, const void *y, size_t by);
void kiln_gemm4_q8_0_q8_0_avx2(int64_t n, float *s, size_t bs, const void *x, const void *y, size_t by);
void kiln_gemm4_q4_K_q8_K_avx512(int64_t n, float *s, size_t bs, const void *x, const void *y, size_t by);
void kiln_gemm4_q8_0_q8_0_avx512(int64_t n, float *s, size_t bs, const void *x, const void *y, size_t by);
void kiln_gemm4_q6_K_q8_K_avx2(int64_t n, float *s, size_t bs, const void *x, const void *y, size_t by);
void kiln_gemm4_q6_K_q8_K_avx512(int64_t n, float *s, size_t bs, const void *x, const void *y, size_t by);
void kiln_gemm4_q4_1_q8_1_avx2(int64_t n, float *s, size_t bs, const void *x, const void *y, size_t by);
void kiln_gemm4_q4_1_q8_1_avx512(int64_t n, float *s, size_t bs, const void *x, const void *y, size_t by);
void kiln_gemm4_q5_K_q8_K_avx2(int64_t n, float *s, size_t bs, const void *x, const void *y, size_t by);
void kiln_gemm4_q5_K_q8_K_avx512(int64_t n, float *s, size_t bs, const void *x, const void *y, size_t by);
/* ops_rope.c */
void kiln_cpu_rope_forward(kiln_ops_ctx *ctx, float *x, const int32_t *pos, int64_t T, int64_t n_heads, int64_t HS,
                           int64_t rope_dim, float base, const float *freq, float mscale, bool neox);
/* ops_attention.c */
void kiln_cpu_attention_forward(kiln_ops_ctx *ctx, float *out, const float *q, const uint16_t *k_cache,
                                const uint16_t *v_cache, int64_t pos0, int64_t T, int64_t NH, int64_t NKV, int64_t HS);
void kiln_cpu_attention_window_forward(kiln_ops_ctx *ctx, float *out, const float *q, const uint16_t *k_cache,
                                       const uint16_t *v_cache, int64_t pos0, int64_t T, int64_t NH, int64_t NKV, int64_t HS,
                                       int64_t window, int64_t rows, float softcap);
void kiln_cpu_attention_kv_forward(kiln_ops_ctx *ctx, float *out, const float *q, const void *k_cache,
                                   const void *v_cache, kiln_kv_type type_k, kiln_kv_type type_v, int64_t pos0, int64_t T,
                                   int64_t NH, int64_t NKV, int64_t HS, int64_t window, int64_t rows, float softcap);
size_t kiln_cpu_attention_scratch_size(int64_t T, int64_t max_width, int64_t NH, int64_t n_ctx, int n_threads);
size_t kiln_cpu_attention_kv_scratch_size(int64_t max_width, int64_t NH, int64_t n_ctx, int n_threads);
/* ops_arch.c: the elementwise ops of the architecture features (#6) */
void kiln_cpu_geglu_forward(kiln_ops_ctx *ctx, float *out, const float *gate, const float *up, int64_t n);
/* out[i] = gelu_tanh(gate[i]) * up[i] for i in [lo, hi): the scalar oracle (libm tanhf) and AVX2 (ops_arch_avx2.c,
 * a polynomial exp; within 1e-6 of the scalar's magnitude, tests/test_ops.c) */
void kiln_geglu_scalar(float *out, const float *gate, const float *up, int64_t lo, int64_t hi);
void kiln_geglu_avx2(float *out, const float *gate, const float *up, int64_t lo, int64_t hi);
void kiln_cpu_add_bias_forward(kiln_ops_ctx *ctx, float *x, const float *b, int64_t T, int64_t n);
void kiln_cpu_sigmoid_mul_forward(kiln_ops_ctx *ctx, float *x, const float *g, int64_t n);
void kiln_cpu_scale_softcap_forward(kiln_ops_ctx *ctx, float *x, int64_t n, float scale, float cap);
/* ops_swiglu.c */
void kiln_cpu_swiglu_forward(kiln_ops_ctx *ctx, float *out, const float *gate, const float *up, int64_t n);
/* Its kernel over n elements (out may equal gate): scalar (ops_swiglu.c, the oracle, expf) and AVX-512
 * (ops_train_avx512.c, the polynomial exp). */
typedef void (*kiln_swiglu_fwd_fn)(float *out, const float *gate, const float *up, int64_t n);
void kiln_swiglu_fwd_scalar(float *out, const float *gate, const float *up, int64_t n);
void kiln_swiglu_fwd_avx512(float *out, const float *gate, const float *up, int64_t n);

/* Attention's chunk kernel: over nk keys (rows kv_stride halves apart in k and v, f16), for each of G heads
 * (q rows HS apart): s (G, nk) the scores scale * q.k_j (then cap tanh(s / cap) when cap > 0), m (G) their max, s then exp(s - m), l (G) its sum, and
 * a (G, HS) = sum_j s_j v_j. The scalar one (ops_attention.c) is the oracle; the AVX2 + FMA + F16C one
 * (ops_attention_avx2.c, HS a multiple of 8) sums in another order and uses a polynomial exp within 2 ulp. */
typedef void (*kiln_attn_chunk_fn)(float *a, float *m, float *l, float *s, const float *q, const uint16_t *k,
                                   const uint16_t *v, int64_t kv_stride, int64_t nk, int64_t HS, int64_t G, float scale,
                                   float cap);
void kiln_attn_chunk_scalar(float *a, float *m, float *l, float *s, const float *q, const uint16_t *k, const uint16_t *v,
                            int64_t kv_stride, int64_t nk, int64_t HS, int64_t G, float scale, float cap);
void kiln_attn_chunk_avx2(float *a, float *m, float *l, float *s, const float *q, const uint16_t *k, const uint16_t *v,
                          int64_t kv_stride, int64_t nk, int64_t HS, int64_t G, float scale, float cap);
/* The same over float rows, k_stride and v_stride floats apart: the caches other than f16, each piece's rows
 * converted to float first (an f32 cache read in place). */
typedef void (*kiln_attn_chunk_f32_fn)(float *a, float *m, float *l, float *s, const float *q, const float *k,
                                       const float *v, int64_t k_stride, int64_t v_stride, int64_t nk, int64_t HS, int64_t G,
                                       float scale, float cap);
void kiln_attn_chunk_f32_scalar(float *a, float *m, float *l, float *s, const float *q, const float *k, const float *v,
                                int64_t k_stride, int64_t v_stride, int64_t nk, int64_t HS, int64_t G, float scale, float cap);
void kiln_attn_chunk_f32_avx2(float *a, float *m, float *l, float *s, const float *q, const float *k, const float *v,
                              int64_t k_stride, int64_t v_stride, int64_t nk, int64_t HS, int64_t G, float scale, float cap);
/* Prefill over an f16 cache with up to 16 query rows in a vector's lanes (ops_attention_avx512.c): row r < nr reads
 * q[r] (HS floats), sees keys [0, n[r]) of the k and v rows (kv_stride halves apart, at the group's head offset)
 * in chunks of kc from 0 with no softcap, and writes out[r]; the bits of kiln_attn_chunk_avx2 and ops_attention.c's
 * merge for that row alone. scratch: kiln_attn_rows16_floats(HS, kc) floats. HS a multiple of 16. */
typedef struct kiln_attn_rows16 {
    float *out[16];
    const float *q[16];
    int64_t n[16];
    int nr;
    const uint16_t *k, *v;
    int64_t kv_stride, HS, kc;
    float scale;
    float *scratch;
} kiln_attn_rows16;
static inline size_t kiln_attn_rows16_floats(int64_t HS, int64_t kc) { return (size_t)(2 * 16 * HS + 16 * kc + 2 * kc * HS + 48); }
void kiln_attn_rows16_avx512(const kiln_attn_rows16 *u);
/* s (n) = cap tanh(s / cap): the attention scores' softcap (gemma2), shared by both chunk kernels (inline: the two
 * kernel files must not call each other). */
static inline void kiln_attn_softcap(float *s, int64_t n, float cap) {
    const float inv = 1.0f / cap;
    for (int64_t j = 0; j < n; j++) s[j] = cap * tanhf(s[j] * inv);
}


/* ---- training (#5): each backward in its forward's file */
/* ops.c */
int64_t kiln_cpu_embed_backward(kiln_ops_ctx *ctx, float *dtable, const float *dout, const int32_t *ids, int64_t N, int64_t C);
size_t kiln_cpu_train_scratch_size(int64_t B, int64_t T, int64_t max_width, int64_t NH, int64_t V, int n_threads);
/* ops_rmsnorm.c */
void kiln_cpu_rmsnorm_forward_train(kiln_ops_ctx *ctx, float *out, float *rstd, const float *x, const float *w,
                                    int64_t N, int64_t C, float eps);
void kiln_cpu_rmsnorm_backward(kiln_ops_ctx *ctx, float *dx, float *dw, const float *dout, const float *x, const float *w,
                               const float *rstd, int64_t N, int64_t C);
/* ops_dense.c */
void kiln_cpu_dense_forward(kiln_ops_ctx *ctx, float *y, const float *x, const void *W, kiln_type wtype,
                            int64_t N, int64_t I, int64_t O);
void kiln_cpu_dense_backward(kiln_ops_ctx *ctx, float *dx, float *dW, const float *dy, const float *x, const void *W,
                             kiln_type wtype, int64_t N, int64_t I, int64_t O);
size_t kiln_cpu_dense_scratch_size(int64_t N, int64_t I, int64_t O, int n_threads);
/* ops_rope.c */
void kiln_cpu_rope_backward(kiln_ops_ctx *ctx, float *dx, const int32_t *pos, int64_t T, int64_t n_heads, int64_t HS,
                            int64_t rope_dim, float base, const float *freq, float mscale, bool neox);
/* ops_attention.c */
void kiln_cpu_attention_forward_train(kiln_ops_ctx *ctx, float *out, float *lse, const float *q, const float *k,
                                      const float *v, int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS);
void kiln_cpu_attention_backward(kiln_ops_ctx *ctx, float *dq, float *dk, float *dv, const float *dout, const float *q,
                                 const float *k, const float *v, const float *out, const float *lse,
                                 int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS);
size_t kiln_cpu_attention_train_scratch_size(int64_t T, int64_t max_width, int64_t NH, int n_threads);
/* Training attention's kernels. A unit (one sequence, one KV head) has its keys and values in thread scratch,
 * transposed kT, vT (HS, TP) and as rows kp, vp (TP, HSP), zeros past T and HS (TP: T rounded up to 32; HSP: HS
 * rounded up to 16); dkT, dvT (HSP, TP) sum its dk, dv. A query row q (HS) sees keys 0..n-1 (n = t + 1), scores
 * scale * q . k_j:
 *   fwd: one row: out (HS) = softmax(scores) . v, *lse = the scores' log-sum-exp, online over chunks of 64 keys.
 *   bwd: rows t0 .. t0 + nt - 1 (nt <= QB) of one head, q, dout and dq rows stride floats apart, D (nt) =
 *        dout . out and lse (nt): with p_j = exp(score_j - lse), ds_j = p_j (dout . v_j - D):
 *        dq += scale sum_j ds_j k_j, dkT[:, j] += scale sum_t ds_j q, dvT[:, j] += sum_t p_j dout.
 * The rest of the unit is the kernels' own scratch: s, dp (TP) and acc (HSP) for a row; P, dS (QB, TP) and qb, ob
 * (QB, HSP) for a block of rows. The scalar kernels (ops_attention.c) are the oracle; the AVX-512 ones
 * (ops_train_avx512.c, HS up to 128) use FMA and a polynomial exp within 2 ulp of expf. */
#define KILN_ATTN_TRAIN_QB 32
#define KILN_ATTN_TRAIN_AVX512_MAX_HS 128
typedef struct kiln_attn_train_unit {
    float *kT, *vT, *kp, *vp, *dkT, *dvT;
    float *s, *dp, *acc, *P, *dS, *qb, *ob;
    int64_t HS, HSP, TP;
    float scale;
} kiln_attn_train_unit;
typedef void (*kiln_attn_train_fwd_fn)(const kiln_attn_train_unit *u, float *out, float *lse, const float *q, int64_t n);
typedef void (*kiln_attn_train_bwd_fn)(const kiln_attn_train_unit *u, float *dq, const float *q, const float *dout,
                                       const float *D, const float *lse, int64_t t0, int64_t nt, int64_t stride);
void kiln_attn_train_fwd_scalar(const kiln_attn_train_unit *u, float *out, float *lse, const float *q, int64_t n);
void kiln_attn_train_bwd_scalar(const kiln_attn_train_unit *u, float *dq, const float *q, const float *dout,
                                const float *D, const float *lse, int64_t t0, int64_t nt, int64_t stride);
void kiln_attn_train_fwd_avx512(const kiln_attn_train_unit *u, float *out, float *lse, const float *q, int64_t n);
void kiln_attn_train_bwd_avx512(const kiln_attn_train_unit *u, float *dq, const float *q, const float *dout,
                                const float *D, const float *lse, int64_t t0, int64_t nt, int64_t stride);
/* ops_swiglu.c */
void kiln_cpu_swiglu_backward(kiln_ops_ctx *ctx, float *dgate, float *dup, const float *dout, const float *gate,
                              const float *up, int64_t n);
/* Its kernel over n elements: scalar (ops_swiglu.c, the oracle, expf) and AVX-512 (ops_train_avx512.c, the
 * polynomial exp). */
typedef void (*kiln_swiglu_bwd_fn)(float *dgate, float *dup, const float *dout, const float *gate, const float *up,
                                   int64_t n);
void kiln_swiglu_bwd_scalar(float *dgate, float *dup, const float *dout, const float *gate, const float *up, int64_t n);
void kiln_swiglu_bwd_avx512(float *dgate, float *dup, const float *dout, const float *gate, const float *up, int64_t n);
/* ops_loss.c */
double kiln_cpu_cross_entropy(kiln_ops_ctx *ctx, float *logits, float *losses, const int32_t *targets, int64_t N,
                              int64_t V, float label_smoothing, float z_loss, int32_t ignore_index, float dscale,
                              int64_t *n_counted);
size_t kiln_cpu_cross_entropy_scratch_size(int64_t N);
/* Cross-entropy's passes over one row x (V): *max, *sum_x = sum x and *sum_e = sum exp(x - max) (both double), and
 * when write, x[i] = exp(x[i] - max) in place. Scalar (ops_loss.c, the oracle) and AVX-512 (ops_train_avx512.c, the
 * polynomial exp). A NaN logit makes sum_x, and so the loss, NaN. */
typedef void (*kiln_ce_row_fn)(float *x, int64_t V, bool write, float *max, double *sum_x, double *sum_e);
void kiln_ce_row_scalar(float *x, int64_t V, bool write, float *max, double *sum_x, double *sum_e);
void kiln_ce_row_avx512(float *x, int64_t V, bool write, float *max, double *sum_x, double *sum_e);

#endif
