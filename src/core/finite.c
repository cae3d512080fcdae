/* finite.c: whether a tensor's values are all finite, checked where weights come in (kiln_model_load, kiln
 * quantize) so a NaN or inf in a file is an error naming the tensor instead of NaN logits later.
 *
 * Float tensors (f32, f16, bf16) are checked element by element: an exponent of all ones is inf or NaN. A block
 * format's values are its codes times its scales, and the codes are small integers, so they are finite exactly
 * when the scales are: only the scale fields are read (the fp16 d and dmin or m of each block, q8_K's float d),
 * a few bytes per block, with a branch per block that is never taken in a good file. A float tensor is one max
 * reduction over its bits, which vectorizes; the offending element is looked for only after one is seen.
 * tests/test_model_load.c covers each kind. */
#include "quants.h"
#include "status.h"

#include <stddef.h>
#include <stdint.h>

/* The fp16 scales of a block format: their byte offset in the block and their count (consecutive). */
typedef struct {
    kiln_type type;
    size_t offset;
    int n;
} scale_fields;

static const scale_fields fp16_scales[] = {
    {KILN_TYPE_Q4_0, offsetof(block_q4_0, d), 1},  {KILN_TYPE_Q4_1, offsetof(block_q4_1, d), 2},
    {KILN_TYPE_Q5_0, offsetof(block_q5_0, d), 1},  {KILN_TYPE_Q8_0, offsetof(block_q8_0, d), 1},
    {KILN_TYPE_Q8_1, offsetof(block_q8_1, d), 2},  {KILN_TYPE_Q4_K, offsetof(block_q4_K, d), 2},
    {KILN_TYPE_Q5_K, offsetof(block_q5_K, d), 2},  {KILN_TYPE_Q6_K, offsetof(block_q6_K, d), 1},
    {KILN_TYPE_Q5_1, offsetof(block_q5_1, d), 2},  {KILN_TYPE_IQ4_NL, offsetof(block_iq4_nl, d), 1},
    {KILN_TYPE_Q2_K, offsetof(block_q2_K, d), 2},  {KILN_TYPE_Q3_K, offsetof(block_q3_K, d), 1},
    {KILN_TYPE_IQ4_XS, offsetof(block_iq4_xs, d), 1},
};

static bool bad16(uint16_t h, uint16_t exp_mask) { return (h & exp_mask) == exp_mask; }
static bool bad32(uint32_t u) { return (u & 0x7f800000u) == 0x7f800000u; }

static const char *what32(uint32_t u) { return u & 0x007fffffu ? "nan" : u >> 31 ? "-inf" : "inf"; }
static const char *what16(uint16_t h, uint16_t exp_mask) {
    uint16_t man = (uint16_t)(0x7fff & ~exp_mask);
    return h & man ? "nan" : h >> 15 ? "-inf" : "inf";
}

/* The largest magnitude bits of n contiguous 16- or 32-bit values: a value is not finite exactly when its bits
 * without the sign reach the exponent mask, so one max over the tensor answers (a reduction the compiler
 * vectorizes). Only for aligned data: a file's tensors are (the reader checks), a caller's memory image need not be. */
static uint16_t max_abs16(const uint16_t *x, int64_t n) {
    uint16_t m = 0;
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) /* a fixed trip count: -O2's cost model vectorizes only a loop without a tail */
        for (int j = 0; j < 64; j++) {
            uint16_t a = x[i + j] & 0x7fff;
            m = a > m ? a : m;
        }
    for (; i < n; i++) {
        uint16_t a = x[i] & 0x7fff;
        m = a > m ? a : m;
    }
    return m;
}

static uint32_t max_abs32(const uint32_t *x, int64_t n) {
    uint32_t m = 0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int j = 0; j < 32; j++) {
            uint32_t a = x[i + j] & 0x7fffffffu;
            m = a > m ? a : m;
        }
    for (; i < n; i++) {
        uint32_t a = x[i] & 0x7fffffffu;
        m = a > m ? a : m;
    }
    return m;
}

/* Index of the first of n 16-bit values (stride bytes apart) that is not finite, or -1. */
static int64_t find16(const uint8_t *p, int64_t n, size_t stride, uint16_t exp_mask) {
    if (stride == 2 && (uintptr_t)p % 2 == 0 && max_abs16((const uint16_t *)p, n) < exp_mask) return -1;
    for (int64_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, p + (size_t)i * stride, 2);
        if (bad16(h, exp_mask)) return i;
    }
    return -1;
}

static int64_t find32(const uint8_t *p, int64_t n, size_t stride) {
    if (stride == 4 && (uintptr_t)p % 4 == 0 && max_abs32((const uint32_t *)p, n) < 0x7f800000u) return -1;
    for (int64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, p + (size_t)i * stride, 4);
        if (bad32(u)) return i;
    }
    return -1;
}

kiln_status kiln_tensor_check_finite(const char *path, const kiln_tensor_view *t) {
    const uint8_t *p = t->data;
    const size_t bb = kiln_type_block_bytes(t->type);
    const int64_t n_blocks = bb ? (int64_t)(t->nbytes / bb) : 0;
    int64_t i;
    uint32_t u;
    uint16_t h;
    switch (t->type) {
    case KILN_TYPE_F32:
        if ((i = find32(p, n_blocks, 4)) < 0) return KILN_OK;
        memcpy(&u, p + 4 * i, 4);
        return kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s': element %lld is %s", path, t->name, (long long)i, what32(u));
    case KILN_TYPE_F16:
    case KILN_TYPE_BF16: {
        const uint16_t mask = t->type == KILN_TYPE_F16 ? 0x7c00 : 0x7f80;
        if ((i = find16(p, n_blocks, 2, mask)) < 0) return KILN_OK;
        memcpy(&h, p + 2 * i, 2);
        return kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s': element %lld is %s", path, t->name, (long long)i, what16(h, mask));
    }
    case KILN_TYPE_Q8_K:
        if ((i = find32(p + offsetof(block_q8_K, d), n_blocks, bb)) < 0) return KILN_OK;
        memcpy(&u, p + (size_t)i * bb + offsetof(block_q8_K, d), 4);
        return kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s': block %lld has scale %s", path, t->name, (long long)i, what32(u));
    default: break;
    }
    for (size_t k = 0; k < sizeof fp16_scales / sizeof fp16_scales[0]; k++) {
        const scale_fields *f = &fp16_scales[k];
        if (f->type != t->type) continue;
        for (int j = 0; j < f->n; j++) {
            const uint8_t *s0 = p + f->offset + 2 * (size_t)j;
            if ((i = find16(s0, n_blocks, bb, 0x7c00)) < 0) continue;
            memcpy(&h, s0 + (size_t)i * bb, 2);
            const bool has_m = t->type == KILN_TYPE_Q4_1 || t->type == KILN_TYPE_Q5_1;
            return kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s': block %lld has %s %s", path, t->name, (long long)i,
                             j ? (has_m ? "min" : t->type == KILN_TYPE_Q8_1 ? "sum" : "dmin") : "scale", what16(h, 0x7c00));
        }
    }
    return KILN_OK; /* a type without scales kiln knows of is not computable: binding refuses it */
}
