/* quantize.c: the rules of `kiln quantize` for a llama-family GGUF file. They pick each tensor's type by its name,
 * so they live with the model; the file's conversion runs on the CPU backend (src/cpu/quantize.c), and a tensor's
 * rows are converted by the core (kiln_quantize_rows, src/core/quantize.c).
 *
 * The type of each tensor follows llama.cpp's rules, so files are interchangeable with its quantizer:
 *   - 1-D tensors and norms stay (or become) F32;
 *   - output.weight becomes Q6_K in every quantized mix except q8_0 (and token_embd.weight too when
 *     the head is tied, i.e. there is no output.weight);
 *   - in the _M mixes, attn_v.weight and ffn_down.weight of layer i of n take Q6_K when
 *     i < n/8, i >= 7n/8, or (i - n/8) % 3 == 2 (llama.cpp's use_more_bits): the first and last layers and
 *     every third in between are the most sensitive;
 *   - a row length that is not a multiple of 256 cannot hold K-quant blocks: such a tensor falls back to
 *     Q8_0 (if a multiple of 32) or F16.
 * tests/test_quantize.c checks the mix rules and a round trip through the reader. */
#include "model/quantize.h"
#include "pool.h"
#include "status.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *name;
    kiln_ftype ftype;
    kiln_type base;  /* type of ordinary weights */
    bool mix_m;      /* the _M rules for attn_v / ffn_down */
} ftype_info;

static const ftype_info ftypes[] = {
    {"f32", KILN_FTYPE_ALL_F32, KILN_TYPE_F32, false},
    {"f16", KILN_FTYPE_MOSTLY_F16, KILN_TYPE_F16, false},
    {"bf16", KILN_FTYPE_MOSTLY_BF16, KILN_TYPE_BF16, false},
    {"q8_0", KILN_FTYPE_MOSTLY_Q8_0, KILN_TYPE_Q8_0, false},
    {"q4_0", KILN_FTYPE_MOSTLY_Q4_0, KILN_TYPE_Q4_0, false},
    {"q4_1", KILN_FTYPE_MOSTLY_Q4_1, KILN_TYPE_Q4_1, false},
    {"q4_k", KILN_FTYPE_MOSTLY_Q4_K_S, KILN_TYPE_Q4_K, false},
    {"q5_k", KILN_FTYPE_MOSTLY_Q5_K_S, KILN_TYPE_Q5_K, false},
    {"q6_k", KILN_FTYPE_MOSTLY_Q6_K, KILN_TYPE_Q6_K, false},
    {"q4_k_m", KILN_FTYPE_MOSTLY_Q4_K_M, KILN_TYPE_Q4_K, true},
    {"q5_k_m", KILN_FTYPE_MOSTLY_Q5_K_M, KILN_TYPE_Q5_K, true},
    /* plain single-type targets (output.weight Q6_K, rows not a multiple of the block Q8_0), not llama.cpp's mixes */
    {"q5_1", KILN_FTYPE_MOSTLY_Q5_1, KILN_TYPE_Q5_1, false},
    {"q2_k", KILN_FTYPE_MOSTLY_Q2_K, KILN_TYPE_Q2_K, false},
    {"q3_k", KILN_FTYPE_MOSTLY_Q3_K_S, KILN_TYPE_Q3_K, false},
    {"iq4_nl", KILN_FTYPE_MOSTLY_IQ4_NL, KILN_TYPE_IQ4_NL, false},
    {"iq4_xs", KILN_FTYPE_MOSTLY_IQ4_XS, KILN_TYPE_IQ4_XS, false},
};
#define N_FTYPES (sizeof ftypes / sizeof ftypes[0])

static const ftype_info *ftype_find(kiln_ftype f) {
    for (size_t i = 0; i < N_FTYPES; i++)
        if (ftypes[i].ftype == f) return &ftypes[i];
    return NULL;
}

kiln_status kiln_ftype_from_name(const char *name, kiln_ftype *out) {
    char lower[16];
    size_t n = strlen(name);
    if (n < sizeof lower) {
        for (size_t i = 0; i <= n; i++) lower[i] = (char)(name[i] >= 'A' && name[i] <= 'Z' ? name[i] + 32 : name[i]);
        for (size_t i = 0; i < N_FTYPES; i++)
            if (strcmp(ftypes[i].name, lower) == 0) {
                *out = ftypes[i].ftype;
                return KILN_OK;
            }
    }
    return kiln_fail(KILN_ERR_INVALID, "unknown quantization type '%s' (expected one of f16 bf16 q8_0 q4_0 q4_1 q4_k q5_k q6_k q4_k_m q5_k_m q5_1 q2_k q3_k iq4_nl iq4_xs)", name);
}

const char *kiln_ftype_name(kiln_ftype f) {
    const ftype_info *fi = ftype_find(f);
    return fi ? fi->name : "unknown";
}

/* ---------------------------------------------------------------- choosing each tensor's type */

static bool ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* Layer index from "blk.N.", or -1. */
static int layer_of(const char *name) {
    if (strncmp(name, "blk.", 4) != 0) return -1;
    char *end;
    long i = strtol(name + 4, &end, 10);
    return end != name + 4 && *end == '.' && i >= 0 && i < 1000000 ? (int)i : -1;
}

/* llama.cpp's use_more_bits: which layers of n get the bigger type in the _M mixes. */
static bool use_more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

static kiln_type fit_row(kiln_type want, int64_t ne0) {
    if (ne0 % kiln_type_block_size(want) == 0) return want;
    return ne0 % QK8_0 == 0 ? KILN_TYPE_Q8_0 : KILN_TYPE_F16;
}

kiln_type kiln_quantize_choose_type(const kiln_tensor_view *t, kiln_ftype ftype, int n_attn_v, int n_ffn_down, bool has_output) {
    const ftype_info *fi = ftype_find(ftype);
    const char *name = t->name;
    if (t->n_dims < 2 || !ends_with(name, "weight") || strstr(name, "norm")) return KILN_TYPE_F32;
    kiln_type want = fi->base;
    bool quantized = want != KILN_TYPE_F32 && want != KILN_TYPE_F16 && want != KILN_TYPE_BF16;
    if (quantized && want != KILN_TYPE_Q8_0) {
        if (strcmp(name, "output.weight") == 0 || (!has_output && strcmp(name, "token_embd.weight") == 0))
            want = KILN_TYPE_Q6_K;
        else if (fi->mix_m) {
            int i = layer_of(name);
            if (i >= 0 && ends_with(name, ".attn_v.weight") && use_more_bits(i, n_attn_v)) want = KILN_TYPE_Q6_K;
            if (i >= 0 && ends_with(name, ".ffn_down.weight") && use_more_bits(i, n_ffn_down)) want = KILN_TYPE_Q6_K;
        }
    }
    return fit_row(want, t->ne[0]);
}

bool kiln_ftype_known(kiln_ftype f) { return ftype_find(f) != NULL; }

void kiln_quantize_count(const kiln_gguf *g, int *n_attn_v, int *n_ffn_down) {
    *n_attn_v = *n_ffn_down = 0;
    for (int64_t i = 0; i < kiln_gguf_n_tensors(g); i++) {
        const kiln_tensor_view *t = kiln_gguf_tensor_at(g, i);
        *n_attn_v += ends_with(t->name, ".attn_v.weight");
        *n_ffn_down += ends_with(t->name, ".ffn_down.weight");
    }
}
