/* quants.h: the block formats GGUF stores, and one traits table that says how to use each.
 *
 * Layouts are GGML's byte for byte (static_assert'd below). Each computable type has a scalar reference
 * (quants_ref.c: the float types; quants_ref_legacy.c, quants_ref_k.c, quants_ref_iq.c: the block formats by family),
 * which is the oracle; the CPU backend adds AVX2 and AVX-512 versions to the table (src/cpu/simd.h),
 * chosen at run time and tested against it (tests/test_quants.c, tests/test_simd.c). */
#ifndef KILN_QUANTS_H
#define KILN_QUANTS_H

#include "kiln.h"
#include "fp16.h"

#include <assert.h>

#define QK4_0 32
#define QK4_1 32
#define QK5_0 32
#define QK5_1 32
#define QK4_NL 32
#define QK8_0 32
#define QK8_1 32
#define QK_K 256
#define K_SCALE_SIZE 12

/* 18 bytes, 4.5 bits/weight: x = d * (q - 8), q in 0..15. qs[j] holds element j (low nibble) and j+16 (high). */
typedef struct { kiln_fp16 d; uint8_t qs[QK4_0 / 2]; } block_q4_0;
static_assert(sizeof(block_q4_0) == 2 + QK4_0 / 2, "block_q4_0 size");

/* 20 bytes, 5 bits/weight: x = d * q + m. */
typedef struct { kiln_fp16 d; kiln_fp16 m; uint8_t qs[QK4_1 / 2]; } block_q4_1;
static_assert(sizeof(block_q4_1) == 4 + QK4_1 / 2, "block_q4_1 size");

/* 22 bytes, 5.5 bits/weight: x = d * (q - 16), q in 0..31. qs[j] holds the low 4 bits of element j (low nibble)
 * and j+16 (high); bit i of qh (4 bytes, little-endian uint32) is bit 4 of element i. */
typedef struct { kiln_fp16 d; uint8_t qh[4]; uint8_t qs[QK5_0 / 2]; } block_q5_0;
static_assert(sizeof(block_q5_0) == 2 + 4 + QK5_0 / 2, "block_q5_0 size");

/* 24 bytes, 6 bits/weight: x = d * q + m, q in 0..31, the 5th bits in qh as in Q5_0. */
typedef struct { kiln_fp16 d; kiln_fp16 m; uint8_t qh[4]; uint8_t qs[QK5_1 / 2]; } block_q5_1;
static_assert(sizeof(block_q5_1) == 4 + 4 + QK5_1 / 2, "block_q5_1 size");

/* 18 bytes, 4.5 bits/weight: x = d * kiln_iq4nl_values[q], q in 0..15 packed as Q4_0 (element j low nibble of
 * qs[j], element j+16 high nibble). */
typedef struct { kiln_fp16 d; uint8_t qs[QK4_NL / 2]; } block_iq4_nl;
static_assert(sizeof(block_iq4_nl) == 2 + QK4_NL / 2, "block_iq4_nl size");

/* The 16 non-uniform levels of IQ4_NL and IQ4_XS (GGML's kvalues_iq4nl). */
static const int8_t kiln_iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

/* 34 bytes, 8.5 bits/weight: x = d * q. */
typedef struct { kiln_fp16 d; int8_t qs[QK8_0]; } block_q8_0;
static_assert(sizeof(block_q8_0) == 2 + QK8_0, "block_q8_0 size");

/* 36 bytes: activations paired with Q4_1. s = d * sum(qs). */
typedef struct { kiln_fp16 d; kiln_fp16 s; int8_t qs[QK8_1]; } block_q8_1;
static_assert(sizeof(block_q8_1) == 4 + QK8_1, "block_q8_1 size");

/* 84 bytes, 2.625 bits/weight. 16 sub-blocks of 16; scales[j] holds sub-block j's 4-bit scale (low nibble) and
 * 4-bit min (high); x = d * sc * q - dmin * m, q 2-bit: for each 128-element half, 32 bytes of qs whose bit pairs
 * 0-1, 2-3, 4-5, 6-7 are elements 0..31, 32..63, 64..95, 96..127. */
typedef struct { uint8_t scales[QK_K / 16]; uint8_t qs[QK_K / 4]; kiln_fp16 d; kiln_fp16 dmin; } block_q2_K;
static_assert(sizeof(block_q2_K) == QK_K / 16 + QK_K / 4 + 4, "block_q2_K size");

/* 110 bytes, 3.4375 bits/weight. 16 sub-blocks of 16 with 6-bit signed scales (stored + 32) packed in scales[12];
 * x = d * (sc - 32) * (q - 4 * !hbit), q 2-bit in qs as Q2_K, the high bit of element i in bit i / 32 of
 * hmask[i % 32]: a set bit means q as is, a clear one q - 4. */
typedef struct { uint8_t hmask[QK_K / 8]; uint8_t qs[QK_K / 4]; uint8_t scales[K_SCALE_SIZE]; kiln_fp16 d; } block_q3_K;
static_assert(sizeof(block_q3_K) == QK_K / 8 + QK_K / 4 + K_SCALE_SIZE + 2, "block_q3_K size");

/* 136 bytes, 4.25 bits/weight. 8 sub-blocks of 32 with 6-bit scales (stored + 32): low 4 bits in scales_l (two
 * per byte, sub-block 2i low nibble), high 2 bits in scales_h (bits 2j, 2j+1 for sub-block j);
 * x = d * (sc - 32) * kiln_iq4nl_values[q], each sub-block's 16 bytes of qs packed as IQ4_NL. */
typedef struct { kiln_fp16 d; uint16_t scales_h; uint8_t scales_l[QK_K / 64]; uint8_t qs[QK_K / 2]; } block_iq4_xs;
static_assert(sizeof(block_iq4_xs) == 4 + QK_K / 64 + QK_K / 2, "block_iq4_xs size");

/* 144 bytes, 4.5 bits/weight. 8 sub-blocks of 32; each has a 6-bit scale and 6-bit min packed in scales[12];
 * x = d * sc * q - dmin * m. qs: for each 64-element chunk, 32 bytes: low nibbles are elements 0..31, high 32..63. */
typedef struct { kiln_fp16 d; kiln_fp16 dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qs[QK_K / 2]; } block_q4_K;
static_assert(sizeof(block_q4_K) == 4 + K_SCALE_SIZE + QK_K / 2, "block_q4_K size");

/* 176 bytes, 5.5 bits/weight: Q4_K plus one high bit per element in qh. */
typedef struct { kiln_fp16 d; kiln_fp16 dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2]; } block_q5_K;
static_assert(sizeof(block_q5_K) == 4 + K_SCALE_SIZE + QK_K / 8 + QK_K / 2, "block_q5_K size");

/* 210 bytes, 6.5625 bits/weight. 16 sub-blocks of 16 with int8 scales; x = d * sc * (q - 32), q 6-bit
 * from 4 low bits in ql and 2 high bits in qh. */
typedef struct { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; kiln_fp16 d; } block_q6_K;
static_assert(sizeof(block_q6_K) == QK_K / 2 + QK_K / 4 + QK_K / 16 + 2, "block_q6_K size");

/* 292 bytes: activations paired with the K-quants. float d; bsums[i] = sum of qs[16i..16i+15]. */
typedef struct { float d; int8_t qs[QK_K]; int16_t bsums[QK_K / 16]; } block_q8_K;
static_assert(sizeof(block_q8_K) == 4 + QK_K + QK_K / 8, "block_q8_K size");

/* Unpacks the 6-bit scale and min of sub-block j (0..7) from a Q4_K/Q5_K scales[12]. */
static inline void kiln_get_scale_min_k4(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4);
    }
}

/* Q4_K/Q5_K scales[12] -> out[0..7] the 6-bit scales, out[8..15] the 6-bit mins (as kiln_get_scale_min_k4 gives them,
 * four sub-blocks per 32-bit word). Bytes 0..3 hold sc0..3 and m0..3 in their low 6 bits at [0..3] and
 * [4..7], with the top 2 bits of sc4..7 and m4..7; bytes 8..11 hold the low 4 bits of sc4..7 / m4..7. */
static inline void kiln_unpack_scales_k4(const uint8_t *scales, uint32_t out[4]) {
    uint32_t a, b, c;
    memcpy(&a, scales, 4);
    memcpy(&b, scales + 4, 4);
    memcpy(&c, scales + 8, 4);
    out[0] = a & 0x3f3f3f3f;
    out[1] = (c & 0x0f0f0f0f) | (((a >> 6) & 0x03030303) << 4);
    out[2] = b & 0x3f3f3f3f;
    out[3] = ((c >> 4) & 0x0f0f0f0f) | (((b >> 6) & 0x03030303) << 4);
}

/* Function shapes. k and n are element counts, multiples of the block size. */
typedef void (*kiln_to_float_fn)(const void *x, float *y, int64_t k);
typedef void (*kiln_from_float_fn)(const float *x, void *y, int64_t k);
/* s = dot(x, y) over n elements; x is of the weight type, y of its vec_dot_type. */
typedef void (*kiln_vec_dot_fn)(int64_t n, float *s, const void *x, const void *y);

/* Implementation levels, best last. A NULL entry at a level falls back to the level below. */
typedef enum kiln_simd {
    KILN_SIMD_SCALAR = 0,
    KILN_SIMD_AVX2 = 1,   /* AVX2 + FMA + F16C */
    KILN_SIMD_AVX512 = 2, /* AVX-512 F/BW/VL/VNNI (+BF16 used when present) */
    KILN_SIMD_COUNT = 3,
} kiln_simd;

typedef struct kiln_type_traits {
    const char *name;
    int64_t blck_size;   /* elements per block */
    size_t type_size;    /* bytes per block */
    bool is_quantized;
    bool computable;     /* has to_float / from_float / vec_dot below */
    kiln_type vec_dot_type; /* activations are quantized to this type before vec_dot */
    kiln_to_float_fn to_float[KILN_SIMD_COUNT];
    kiln_from_float_fn from_float_ref;   /* scalar reference quantizer (weights) */
    kiln_from_float_fn from_float[KILN_SIMD_COUNT]; /* fast quantizer, for activations (Q8_0, Q8_1, Q8_K) */
    kiln_vec_dot_fn vec_dot[KILN_SIMD_COUNT];
} kiln_type_traits;

/* The table entry for a type id; NULL if unknown. */
const kiln_type_traits *kiln_type_traits_get(kiln_type t);

/* Sets type t's entries at a SIMD level (not the scalar one, which is the oracle's): the CPU backend registers its
 * kernels with it (src/cpu/simd.c), once, before it hands out any level above scalar. */
void kiln_type_traits_set(kiln_type t, kiln_simd level, kiln_to_float_fn to_float, kiln_from_float_fn from_float,
                          kiln_vec_dot_fn vec_dot);

/* The tensor type whose blocks a KV-cache type stores (types.c); KILN_TYPE_COUNT for an unknown one. */
kiln_type kiln_kv_tensor_type(kiln_kv_type t);

/* Best available implementation at or below level; NULL if the type has none. */
kiln_to_float_fn kiln_get_to_float(kiln_type t, kiln_simd level);
kiln_from_float_fn kiln_get_from_float(kiln_type t, kiln_simd level);
kiln_vec_dot_fn kiln_get_vec_dot(kiln_type t, kiln_simd level);

/* ---- a level's function set: KILN_DECLARE_LEVEL(ref) is quants_ref*.c's; src/cpu/simd.h declares the others ---- */
#define KILN_DECLARE_LEVEL(sfx) \
    void kiln_to_float_f32_##sfx(const void *x, float *y, int64_t k); \
    void kiln_to_float_f16_##sfx(const void *x, float *y, int64_t k); \
    void kiln_to_float_bf16_##sfx(const void *x, float *y, int64_t k); \
    void kiln_to_float_q4_0_##sfx(const void *x, float *y, int64_t k); \
    void kiln_to_float_q4_1_##sfx(const void *x, float *y, int64_t k); \
    void kiln_to_float_q5_0_##sfx(const void *x, float *y, int64_t k); \
    void kiln_to_float_q5_1_##sfx(const void *x, float *y, int64_t k); \
    void kiln_to_float_iq4_nl_##sfx(const void *x, float *y, int64_t k); \
    void kiln_to_float_q8_0_##sfx(const void *x, float *y, int64_t k); \
    void kiln_to_float_q8_1_##sfx(const void *x, float *y, int64_t k); \
    void kiln_to_float_q2_K_##sfx(const void *x, float *y, int64_t k); \
    void kiln_to_float_q3_K_##sfx(const void *x, float *y, int64_t k); \
    void kiln_to_float_q4_K_##sfx(const void *x, float *y, int64_t k); \
    void kiln_to_float_q5_K_##sfx(const void *x, float *y, int64_t k); \
    void kiln_to_float_q6_K_##sfx(const void *x, float *y, int64_t k); \
    void kiln_to_float_iq4_xs_##sfx(const void *x, float *y, int64_t k); \
    void kiln_to_float_q8_K_##sfx(const void *x, float *y, int64_t k); \
    void kiln_from_float_f32_##sfx(const float *x, void *y, int64_t k); \
    void kiln_from_float_f16_##sfx(const float *x, void *y, int64_t k); \
    void kiln_from_float_bf16_##sfx(const float *x, void *y, int64_t k); \
    void kiln_from_float_q8_0_##sfx(const float *x, void *y, int64_t k); \
    void kiln_from_float_q8_1_##sfx(const float *x, void *y, int64_t k); \
    void kiln_from_float_q8_K_##sfx(const float *x, void *y, int64_t k); \
    void kiln_vec_dot_f32_##sfx(int64_t n, float *s, const void *x, const void *y); \
    void kiln_vec_dot_f16_##sfx(int64_t n, float *s, const void *x, const void *y); \
    void kiln_vec_dot_bf16_##sfx(int64_t n, float *s, const void *x, const void *y); \
    void kiln_vec_dot_q4_0_q8_0_##sfx(int64_t n, float *s, const void *x, const void *y); \
    void kiln_vec_dot_q4_1_q8_1_##sfx(int64_t n, float *s, const void *x, const void *y); \
    void kiln_vec_dot_q5_0_q8_0_##sfx(int64_t n, float *s, const void *x, const void *y); \
    void kiln_vec_dot_q5_1_q8_1_##sfx(int64_t n, float *s, const void *x, const void *y); \
    void kiln_vec_dot_iq4_nl_q8_0_##sfx(int64_t n, float *s, const void *x, const void *y); \
    void kiln_vec_dot_q2_K_q8_K_##sfx(int64_t n, float *s, const void *x, const void *y); \
    void kiln_vec_dot_q3_K_q8_K_##sfx(int64_t n, float *s, const void *x, const void *y); \
    void kiln_vec_dot_q8_0_q8_0_##sfx(int64_t n, float *s, const void *x, const void *y); \
    void kiln_vec_dot_q4_K_q8_K_##sfx(int64_t n, float *s, const void *x, const void *y); \
    void kiln_vec_dot_q5_K_q8_K_##sfx(int64_t n, float *s, const void *x, const void *y); \
    void kiln_vec_dot_q6_K_q8_K_##sfx(int64_t n, float *s, const void *x, const void *y); \
    void kiln_vec_dot_iq4_xs_q8_K_##sfx(int64_t n, float *s, const void *x, const void *y);

KILN_DECLARE_LEVEL(ref)

/* Scalar reference quantizers for weight types (slow, careful scale search). */
void kiln_quantize_q4_0_ref(const float *x, void *y, int64_t k);
void kiln_quantize_q4_1_ref(const float *x, void *y, int64_t k);
void kiln_quantize_q5_0_ref(const float *x, void *y, int64_t k);
void kiln_quantize_q5_1_ref(const float *x, void *y, int64_t k);
void kiln_quantize_iq4_nl_ref(const float *x, void *y, int64_t k);
void kiln_quantize_q2_K_ref(const float *x, void *y, int64_t k);
void kiln_quantize_q3_K_ref(const float *x, void *y, int64_t k);
void kiln_quantize_q4_K_ref(const float *x, void *y, int64_t k);
void kiln_quantize_q5_K_ref(const float *x, void *y, int64_t k);
void kiln_quantize_q6_K_ref(const float *x, void *y, int64_t k);
void kiln_quantize_iq4_xs_ref(const float *x, void *y, int64_t k);

/* KILN_OK when every value of t is finite, else KILN_ERR_FORMAT naming path, the tensor and the first element (float
 * types) or block (block formats, whose values are finite exactly when their fp16 or f32 scales are). (finite.c) */
kiln_status kiln_tensor_check_finite(const char *path, const kiln_tensor_view *t);

/* dst (the rows of src, converted to dst_type by its reference quantizer) = src's rows through to_float, on every
 * thread of pool; scratch holds one row of src->ne[0] floats per pool thread. (quantize.c) */
struct kiln_pool;
void kiln_quantize_rows(struct kiln_pool *pool, const kiln_tensor_view *src, kiln_to_float_fn to_float, kiln_type dst_type,
                        void *dst, float *const *scratch);

#endif
