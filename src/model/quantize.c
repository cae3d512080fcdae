/* quantize.c: `kiln quantize`, converting every weight of a llama-family GGUF file to a block format. The rules
 * below pick each tensor's type by its name, so they live with the model; the conversion of a tensor's rows is the
 * core's (kiln_quantize_rows, src/core/quantize.c).
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
 * The output is streamed through the atomic GGUF writer.
 * tests/test_quantize.c checks the mix rules and a round trip through the reader. */
#include "model/quantize.h"
#include "cpu/simd.h"
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
    return kiln_fail(KILN_ERR_INVALID, "unknown quantization type '%s' (expected one of f16 bf16 q8_0 q4_0 q4_1 q4_k q5_k q6_k q4_k_m q5_k_m)", name);
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

static bool skip_quant_keys(const char *key) {
    return strcmp(key, "general.file_type") == 0 || strcmp(key, "general.quantization_version") == 0;
}

kiln_status kiln_quantize_file(const char *in_path, const char *out_path, const kiln_quantize_params *p) {
    const ftype_info *fi = ftype_find(p->ftype);
    if (!fi) return kiln_fail(KILN_ERR_INVALID, "unknown file type %d", (int)p->ftype);
    kiln_gguf *g = NULL;
    kiln_gguf_writer *w = NULL;
    kiln_pool *pool = NULL;
    kiln_type *types = NULL;
    void *out = NULL;
    float **scratch = NULL;
    kiln_status s;
    if ((s = kiln_gguf_open(in_path, &g))) return s;
    int64_t nt = kiln_gguf_n_tensors(g);
    int n_attn_v = 0, n_ffn_down = 0;
    bool has_output = kiln_gguf_find_tensor(g, "output.weight") != NULL;
    int64_t max_ne0 = 1;
    size_t max_bytes = 1;
    for (int64_t i = 0; i < nt; i++) {
        const kiln_tensor_view *t = kiln_gguf_tensor_at(g, i);
        n_attn_v += ends_with(t->name, ".attn_v.weight");
        n_ffn_down += ends_with(t->name, ".ffn_down.weight");
    }
    types = calloc(nt ? (size_t)nt : 1, sizeof *types);
    if (!types) {
        s = kiln_fail(KILN_ERR_NOMEM, "out of memory");
        goto out;
    }
    if ((s = kiln_gguf_writer_new(&w)) || (s = kiln_gguf_writer_copy_kv(w, g, skip_quant_keys)) ||
        (s = kiln_gguf_writer_set_u32(w, "general.file_type", (uint32_t)fi->ftype)) ||
        (s = kiln_gguf_writer_set_u32(w, "general.quantization_version", 2)))
        goto out;
    for (int64_t i = 0; i < nt; i++) {
        const kiln_tensor_view *t = kiln_gguf_tensor_at(g, i);
        types[i] = kiln_quantize_choose_type(t, fi->ftype, n_attn_v, n_ffn_down, has_output);
        const kiln_type_traits *src = kiln_type_traits_get(t->type), *dst = kiln_type_traits_get(types[i]);
        if (t->type != types[i] && (!src->computable || !dst->from_float_ref)) {
            s = kiln_fail(KILN_ERR_UNSUPPORTED, "%s: tensor '%s': converting %s to %s is not supported", in_path, t->name,
                          kiln_type_name(t->type), kiln_type_name(types[i]));
            goto out;
        }
        if ((s = kiln_gguf_writer_add_tensor(w, t->name, types[i], t->n_dims, t->ne, NULL))) goto out;
        size_t bytes = kiln_type_row_bytes(types[i], t->ne[0]) * (size_t)(t->nbytes / t->nb[1]);
        if (bytes > max_bytes) max_bytes = bytes;
        if (t->ne[0] > max_ne0) max_ne0 = t->ne[0];
    }
    if ((s = kiln_pool_create(p->n_threads, &pool))) goto out;
    int nth = kiln_pool_size(pool);
    out = malloc(max_bytes);
    scratch = calloc((size_t)nth, sizeof *scratch);
    for (int i = 0; scratch && i < nth; i++)
        if (!(scratch[i] = malloc((size_t)max_ne0 * sizeof(float)))) break;
    if (!out || !scratch || !scratch[nth - 1]) {
        s = kiln_fail(KILN_ERR_NOMEM, "out of memory for a %zu-byte output buffer", max_bytes);
        goto out;
    }
    if ((s = kiln_gguf_writer_begin(w, out_path))) goto out;
    kiln_simd level = kiln_simd_best();
    for (int64_t i = 0; i < nt; i++) {
        const kiln_tensor_view *t = kiln_gguf_tensor_at(g, i);
        if (p->progress) p->progress(p->progress_ud, i, nt, t->name);
        if (t->type == types[i]) {
            s = kiln_gguf_writer_write_tensor(w, i, t->data, t->nbytes);
        } else {
            kiln_quantize_rows(pool, t, kiln_get_to_float(t->type, level), types[i], out, scratch);
            s = kiln_gguf_writer_write_tensor(w, i, out, kiln_type_row_bytes(types[i], t->ne[0]) * (size_t)(t->nbytes / t->nb[1]));
        }
        if (s) goto out;
    }
    if (p->progress) p->progress(p->progress_ud, nt, nt, "done");
    s = kiln_gguf_writer_finish(w);
out:
    for (int i = 0; scratch && pool && i < kiln_pool_size(pool); i++) free(scratch[i]);
    free(scratch);
    free(out);
    free(types);
    kiln_pool_free(pool);
    kiln_gguf_writer_free(w);
    kiln_gguf_close(g);
    return s;
}
