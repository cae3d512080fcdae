/* types.c: the layout of every tensor type GGUF files may hold: name, elements per block, bytes per block.
 * This is all the GGUF reader needs to size and validate tensors, including types kiln cannot compute
 * (IQ*, TQ*, MXFP4), so that `kiln inspect` reads any file. The sizes are GGML's; tests/test_types.c
 * checks them against the gguf Python package's GGML_QUANT_SIZES. */
#include "status.h"

#include <ctype.h>
#include <string.h>

typedef struct { const char *name; int64_t blck; size_t bytes; } layout;

static const layout layouts[KILN_TYPE_COUNT] = {
    [KILN_TYPE_F32] = {"f32", 1, 4},
    [KILN_TYPE_F16] = {"f16", 1, 2},
    [KILN_TYPE_Q4_0] = {"q4_0", 32, 18},
    [KILN_TYPE_Q4_1] = {"q4_1", 32, 20},
    [KILN_TYPE_Q5_0] = {"q5_0", 32, 22},
    [KILN_TYPE_Q5_1] = {"q5_1", 32, 24},
    [KILN_TYPE_Q8_0] = {"q8_0", 32, 34},
    [KILN_TYPE_Q8_1] = {"q8_1", 32, 36},
    [KILN_TYPE_Q2_K] = {"q2_K", 256, 84},
    [KILN_TYPE_Q3_K] = {"q3_K", 256, 110},
    [KILN_TYPE_Q4_K] = {"q4_K", 256, 144},
    [KILN_TYPE_Q5_K] = {"q5_K", 256, 176},
    [KILN_TYPE_Q6_K] = {"q6_K", 256, 210},
    [KILN_TYPE_Q8_K] = {"q8_K", 256, 292},
    [KILN_TYPE_IQ2_XXS] = {"iq2_xxs", 256, 66},
    [KILN_TYPE_IQ2_XS] = {"iq2_xs", 256, 74},
    [KILN_TYPE_IQ3_XXS] = {"iq3_xxs", 256, 98},
    [KILN_TYPE_IQ1_S] = {"iq1_s", 256, 50},
    [KILN_TYPE_IQ4_NL] = {"iq4_nl", 32, 18},
    [KILN_TYPE_IQ3_S] = {"iq3_s", 256, 110},
    [KILN_TYPE_IQ2_S] = {"iq2_s", 256, 82},
    [KILN_TYPE_IQ4_XS] = {"iq4_xs", 256, 136},
    [KILN_TYPE_I8] = {"i8", 1, 1},
    [KILN_TYPE_I16] = {"i16", 1, 2},
    [KILN_TYPE_I32] = {"i32", 1, 4},
    [KILN_TYPE_I64] = {"i64", 1, 8},
    [KILN_TYPE_F64] = {"f64", 1, 8},
    [KILN_TYPE_IQ1_M] = {"iq1_m", 256, 56},
    [KILN_TYPE_BF16] = {"bf16", 1, 2},
    [KILN_TYPE_TQ1_0] = {"tq1_0", 256, 54},
    [KILN_TYPE_TQ2_0] = {"tq2_0", 256, 66},
    [KILN_TYPE_MXFP4] = {"mxfp4", 32, 17},
    [KILN_TYPE_NVFP4] = {"nvfp4", 64, 36},
    [KILN_TYPE_Q1_0] = {"q1_0", 128, 18},
};

bool kiln_type_known(uint32_t t) { return t < KILN_TYPE_COUNT && layouts[t].name != NULL; }

const char *kiln_type_name(kiln_type t) { return kiln_type_known((uint32_t)t) ? layouts[t].name : NULL; }

int64_t kiln_type_block_size(kiln_type t) { return kiln_type_known((uint32_t)t) ? layouts[t].blck : 0; }

size_t kiln_type_block_bytes(kiln_type t) { return kiln_type_known((uint32_t)t) ? layouts[t].bytes : 0; }

size_t kiln_type_row_bytes(kiln_type t, int64_t n) {
    if (!kiln_type_known((uint32_t)t)) {
        kiln_fail(KILN_ERR_RANGE, "unknown tensor type id %u", (unsigned)t);
        return 0;
    }
    if (n <= 0 || n % layouts[t].blck != 0) {
        kiln_fail(KILN_ERR_INVALID, "row of %lld elements is not a whole number of %s blocks of %lld",
                  (long long)n, layouts[t].name, (long long)layouts[t].blck);
        return 0;
    }
    uint64_t bytes;
    if (!kiln_mul_ok((uint64_t)(n / layouts[t].blck), layouts[t].bytes, &bytes) || bytes > SIZE_MAX) {
        kiln_fail(KILN_ERR_NOMEM, "row of %lld %s elements overflows", (long long)n, layouts[t].name);
        return 0;
    }
    return (size_t)bytes;
}

kiln_status kiln_type_from_name(const char *name, kiln_type *out) {
    for (int t = 0; t < KILN_TYPE_COUNT; t++) {
        if (!layouts[t].name) continue;
        const char *a = layouts[t].name, *b = name;
        while (*a && *b && tolower((unsigned char)*a) == tolower((unsigned char)*b)) a++, b++;
        if (!*a && !*b) {
            *out = (kiln_type)t;
            return KILN_OK;
        }
    }
    return kiln_fail(KILN_ERR_NOT_FOUND, "unknown tensor type '%s'", name);
}

/* ---------------------------------------------------------------- KV-cache element types (-ctk/-ctv)
 * Each kiln_kv_type is a tensor type's layout (llama.cpp's cache types are ggml types): f16 2 bytes, f32 4, bf16 2,
 * q8_0 34 and q4_0 18 bytes per block of 32. tests/test_kv.c checks the names and sizes. */
static const struct { const char *name; kiln_type type; } kv_types[KILN_KV_TYPE_COUNT] = {
    [KILN_KV_F16] = {"f16", KILN_TYPE_F16},   [KILN_KV_F32] = {"f32", KILN_TYPE_F32},
    [KILN_KV_BF16] = {"bf16", KILN_TYPE_BF16}, [KILN_KV_Q8_0] = {"q8_0", KILN_TYPE_Q8_0},
    [KILN_KV_Q4_0] = {"q4_0", KILN_TYPE_Q4_0},
};

static bool kv_type_known(kiln_kv_type t) { return (unsigned)t < KILN_KV_TYPE_COUNT; }

const char *kiln_kv_type_name(kiln_kv_type t) { return kv_type_known(t) ? kv_types[t].name : NULL; }

kiln_status kiln_kv_type_from_name(const char *name, kiln_kv_type *out) {
    for (int t = 0; name && t < KILN_KV_TYPE_COUNT; t++)
        if (strcmp(name, kv_types[t].name) == 0) {
            *out = (kiln_kv_type)t;
            return KILN_OK;
        }
    return kiln_fail(KILN_ERR_INVALID, "unknown KV cache type '%s' (f16, f32, bf16, q8_0, q4_0)", name ? name : "(null)");
}

/* 0 for an unknown type or n not a whole number of its blocks (kiln_type_row_bytes then says which). */
size_t kiln_kv_row_bytes(kiln_kv_type t, int64_t n) {
    if (!kv_type_known(t)) {
        kiln_fail(KILN_ERR_RANGE, "unknown KV cache type id %d", (int)t);
        return 0;
    }
    return kiln_type_row_bytes(kv_types[t].type, n);
}

kiln_type kiln_kv_tensor_type(kiln_kv_type t) { return kv_type_known(t) ? kv_types[t].type : KILN_TYPE_COUNT; }
