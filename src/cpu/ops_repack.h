/* ops_repack.h: weights repacked 16 rows at a time for the VNNI kernels (gemm_repack_avx512.c), the activation
 * rows those kernels read, and the set of repacked weights a session keeps (ops_repack.c).
 *
 * A weight of O rows becomes ceil(O/16) groups of 16 rows (the last padded with zero rows). A group is every
 * block of its rows: first the quants of block 0, 1, ... (QS bytes each, whole 64-byte vectors in which lane r
 * holds 4 consecutive quants of row r), then the scales of block 0, 1, ... (AUX bytes each, 16 rows side by
 * side), then padding to 64 bytes. QS + AUX is 16 blocks of the GGUF type: the copy is the size of the original.
 * Not part of the library's API; tests/test_gemm.c checks the kernels against vec_dot and a double reference. */
#ifndef KILN_CPU_OPS_REPACK_H
#define KILN_CPU_OPS_REPACK_H

#include "ops_internal.h"

#define KILN_PACK_ROWS 16 /* rows per group: one 32-bit lane of a 512-bit vector each */
#define KILN_PACK_NT 8    /* tokens per kernel call: each weight vector is unpacked once for all of them */
#define KILN_PACK_AMX_NT 16 /* tokens per AMX kernel call (gemm_repack_amx.c): the rows of an A tile */

/* Bytes per block in a group of 16 rows. */
#define KILN_PACK_Q8_0_QS 512  /* 8 vectors of quants + 128 (unsigned, as vpdpbusd wants) */
#define KILN_PACK_Q8_0_AUX 32  /* d, f16 */
#define KILN_PACK_Q4_1_QS 256  /* 4 vectors of packed nibbles */
#define KILN_PACK_Q4_1_AUX 64  /* d, then m, f16 */
#define KILN_PACK_Q4_K_QS 2048 /* 4 chunks x 8 vectors of packed nibbles */
#define KILN_PACK_Q4_K_AUX 256 /* d, dmin (f16), then scales[12] as 12 planes of 16 bytes */
#define KILN_PACK_Q5_K_QS 2560 /* Q4_K's nibbles, then 8 vectors of qh */
#define KILN_PACK_Q5_K_AUX 256 /* as Q4_K */
#define KILN_PACK_Q6_K_QS 3072 /* per half, per k: ql low, ql high, qh vectors */
#define KILN_PACK_Q6_K_AUX 288 /* d (f16), then scales[16] as 16 planes of 16 bytes */
#define KILN_PACK_Q4_0_QS 256  /* Q4_1's nibbles */
#define KILN_PACK_Q4_0_AUX 32  /* d */
#define KILN_PACK_IQ4_NL_QS 256 /* Q4_1's nibbles (level indices) */
#define KILN_PACK_IQ4_NL_AUX 32 /* d */
#define KILN_PACK_Q5_0_QS 320  /* Q4_1's nibbles, then 1 vector of fifth bits (ops_repack.c: pack_b32) */
#define KILN_PACK_Q5_0_AUX 32  /* d */
#define KILN_PACK_Q5_1_QS 320  /* as Q5_0 */
#define KILN_PACK_Q5_1_AUX 64  /* d, then m */
#define KILN_PACK_IQ4_XS_QS 2048 /* per sub-block of 32, 4 vectors of nibbles (level indices) */
#define KILN_PACK_IQ4_XS_AUX 128 /* d, scales_h as 2 planes, scales_l[4] as 4 planes of 16 bytes */
#define KILN_PACK_Q2_K_QS 1024 /* 2 halves x 8 vectors of qs (4 bit pairs each) */
#define KILN_PACK_Q2_K_AUX 320 /* d, dmin (f16), then scales[16] as 16 planes of 16 bytes */
#define KILN_PACK_Q3_K_QS 1536 /* Q2_K's qs, then 8 vectors of hmask */
#define KILN_PACK_Q3_K_AUX 224 /* d (f16), then scales[12] as 12 planes of 16 bytes */

/* One kernel call: y[t * ldy + r] = dot(row r of the group, activation row t) for t < nt, r < nrows. */
typedef struct {
    const char *w;  /* the group */
    int64_t nb;     /* blocks per row */
    const char *x;  /* nt activation rows, x_row bytes apart, in the weight type's panel format */
    size_t x_row;
    int nt;         /* 1..KILN_PACK_NT */
    float *y;
    size_t ldy;
    int nrows;      /* 1..16: rows of the group that exist */
    size_t pf;      /* decode: prefetch this many bytes ahead (kiln_pack_prefetch), 0: none */
} kiln_pack_call;
typedef void (*kiln_pack_gemm_fn)(const kiln_pack_call *c);
/* A batch: the same for T tokens (c->nt unused), at least KILN_PACK_BATCH_MIN, with the same bits as the type's
 * kernel; for types whose unpacking is worth doing once for many tokens. */
typedef void (*kiln_pack_batch_fn)(const kiln_pack_call *c, int64_t T);
#define KILN_PACK_BATCH_MIN 32

/* Software prefetch for decode, where a group is read once and its bytes come from DRAM: as a kernel starts block b
 * it asks for the lines of the block's share of the group (QS + AUX = bytes: 16 GGUF blocks), c->pf bytes further
 * on, into L2. Groups of a run lie one after another, so the stream runs on into the next group and the next call
 * finds its first c->pf bytes in L2. The kernels then run at their in-cache speed while memory streams behind
 * them (measured on a 2-core Zen 4 VM: the 124m Q4_K_M decode 1.9x, docs/cpu.md); without it, compute and memory
 * take turns. Always inlined: GCC judges a function of prefetches alone free of effects and drops its calls. */
static inline __attribute__((always_inline)) void kiln_pack_prefetch(const kiln_pack_call *c, int64_t b, size_t bytes) {
    if (!c->pf) return;
    const char *p = c->w + (size_t)b * bytes + c->pf;
    for (size_t off = 0; off < bytes; off += 64) __builtin_prefetch(p + off, 0, 2);
}

void kiln_pack_gemm_q8_0_avx512(const kiln_pack_call *c);
void kiln_pack_gemm_q4_1_avx512(const kiln_pack_call *c);
void kiln_pack_gemm_q4_K_avx512(const kiln_pack_call *c);
void kiln_pack_gemm_q5_K_avx512(const kiln_pack_call *c);
void kiln_pack_gemm_q6_K_avx512(const kiln_pack_call *c);
void kiln_pack_gemm_q4_0_avx512(const kiln_pack_call *c);
void kiln_pack_gemm_iq4_nl_avx512(const kiln_pack_call *c);
void kiln_pack_gemm_q5_0_avx512(const kiln_pack_call *c);
void kiln_pack_gemm_q5_1_avx512(const kiln_pack_call *c);
void kiln_pack_gemm_iq4_xs_avx512(const kiln_pack_call *c);
void kiln_pack_gemm_q2_K_avx512(const kiln_pack_call *c);
void kiln_pack_gemm_q3_K_avx512(const kiln_pack_call *c);
void kiln_pack_batch_q2_K_avx512(const kiln_pack_call *c, int64_t T);
void kiln_pack_batch_q3_K_avx512(const kiln_pack_call *c, int64_t T);
/* AVX2 (gemm_repack_avx2.c): every type (Q8_0, IQ4_NL and IQ4_XS with the sign on the activations) */
void kiln_pack_gemm_q4_0_avx2(const kiln_pack_call *c);
void kiln_pack_gemm_q4_1_avx2(const kiln_pack_call *c);
void kiln_pack_gemm_q5_0_avx2(const kiln_pack_call *c);
void kiln_pack_gemm_q5_1_avx2(const kiln_pack_call *c);
void kiln_pack_gemm_q4_K_avx2(const kiln_pack_call *c);
void kiln_pack_gemm_q5_K_avx2(const kiln_pack_call *c);
void kiln_pack_gemm_q2_K_avx2(const kiln_pack_call *c);
void kiln_pack_gemm_q3_K_avx2(const kiln_pack_call *c);
void kiln_pack_gemm_q6_K_avx2(const kiln_pack_call *c);
void kiln_pack_gemm_iq4_xs_avx2(const kiln_pack_call *c);
void kiln_pack_gemm_q8_0_avx2(const kiln_pack_call *c);
void kiln_pack_gemm_iq4_nl_avx2(const kiln_pack_call *c);

/* AMX (gemm_repack_amx.c): the same groups, exactly KILN_PACK_AMX_NT tokens a call, the same results bit for bit
 * as the AVX-512 kernel of the type (the same integer sums, the same float steps in the same order). */
void kiln_pack_gemm_q8_0_amx(const kiln_pack_call *c);
void kiln_pack_gemm_q4_0_amx(const kiln_pack_call *c);
void kiln_pack_gemm_q4_1_amx(const kiln_pack_call *c);
void kiln_pack_gemm_iq4_nl_amx(const kiln_pack_call *c);
void kiln_pack_gemm_q5_0_amx(const kiln_pack_call *c);
void kiln_pack_gemm_q5_1_amx(const kiln_pack_call *c);
void kiln_pack_gemm_q4_K_amx(const kiln_pack_call *c);
void kiln_pack_gemm_q5_K_amx(const kiln_pack_call *c);

/* The AMX kernel for weight type t, or NULL where t has none (whether the CPU has AMX is kiln_cpu_ops_amx's). */
kiln_pack_gemm_fn kiln_pack_amx_kernel(kiln_type t);

/* The batch kernel for weight type t at this level, or NULL. */
kiln_pack_batch_fn kiln_pack_batch_kernel(kiln_type t, kiln_simd level);

/* The kernel for weight type t at this level (AVX-512 VNNI, else AVX2), or NULL where t has no packed form at
 * this level. */
kiln_pack_gemm_fn kiln_pack_kernel(kiln_type t, kiln_simd level);
/* Bytes of one group of 16 rows of nb blocks of type t (a kiln_pack_kernel type); 0 on overflow. */
size_t kiln_pack_group_bytes(kiln_type t, int64_t nb);
/* Packs group g (rows 16g..16g+15, those < O) of the 2-D weight W into dst (kiln_pack_group_bytes). */
void kiln_pack_group(const kiln_tensor_view *W, int64_t g, char *dst);

/* Activation rows ("panels"), one format per vec_dot_type, which kiln_pack_panel_type gives for a weight type:
 * Q8_K panels are plain Q8_K blocks (the K-quants, IQ4_XS); Q8_0 panels are qs[I], then d[nb] (float) and
 * -128 * sum(qs) per block (int32) (Q8_0, Q4_0, Q5_0, IQ4_NL); Q8_1 panels are qs[I], then d[nb] and s[nb]
 * (float) of the Q8_1 blocks (Q4_1, Q5_1). The quants and scales are those kiln_get_from_float gives the
 * vec_dot_type at the same level, so every weight of one panel type reads the same quantized x. */
kiln_type kiln_pack_panel_type(kiln_type weight);
size_t kiln_pack_panel_row_bytes(kiln_type panel, int64_t I);
/* The Q8_0 and Q8_1 panels' blocks with AVX2 + F16C (quants_avx2.c), the same bits as the path through the quantizer. */
void kiln_pack_panel_q8_avx2(bool q8_1, const float *x, char *row, int64_t I, int64_t b0, int64_t b1);
/* Blocks [b0, b1) of the panel row of x (I wide), quantized at level. */
void kiln_pack_panel_quantize(kiln_type panel, kiln_simd level, const float *x, char *row, int64_t I, int64_t b0, int64_t b1);

/* One weight of a prepared set. */
typedef struct kiln_cpu_packed {
    const kiln_tensor_view *W; /* the view it was packed from: the key matmul looks it up by */
    int64_t n_groups;
    size_t group_bytes;
    const char *data;          /* n_groups * group_bytes, 64-byte aligned */
    kiln_pack_gemm_fn gemm;
    kiln_pack_gemm_fn gemm16;  /* the AMX kernel for runs of KILN_PACK_AMX_NT tokens, or NULL */
    kiln_pack_batch_fn batch;  /* the batch kernel for runs of KILN_PACK_BATCH_MIN tokens or more, or NULL */
} kiln_cpu_packed;

/* W's packed copy in ctx's prepared set, or NULL. */
const kiln_cpu_packed *kiln_cpu_packed_find(const kiln_ops_ctx *ctx, const kiln_tensor_view *W);

#endif
