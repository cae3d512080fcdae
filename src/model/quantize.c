/* quantize.c: the rules of `kiln quantize` for a llama-family GGUF file, and its plan (each tensor's new type and
 * the file's size). The rules pick each tensor's type by its name, so they live with the model; the file's
 * conversion runs on the CPU backend (src/cpu/quantize.c), and a tensor's rows are converted by the core
 * (kiln_quantize_rows, src/core/quantize.c).
 *
 * They are llama-quantize's (llama.cpp src/llama-quant.cpp: llama_tensor_get_type, tensor_type_fallback), without
 * an importance matrix, for the architectures kiln loads; none of them has a rule of its own there (only falcon,
 * MoE files and glm5-next do, and kiln loads none of those):
 *   - only weights are quantized: 2-D or more, named *weight, not a norm (tensor_allows_quantization); every other
 *     tensor keeps its type;
 *   - F32, F16 and BF16 mixes give every weight that type;
 *   - a quantized mix gives each weight its base type (llama_ftype_get_default_type), then the rows of `rules`
 *     by the tensor's class and its place among its class (the first and last layers, or every third: use_more_bits);
 *   - output.weight, and token_embd.weight when it is the head too (no output.weight), take Q6_K, or Q8_0 in q8_0
 *     and where its rows do not hold whole blocks of the base type;
 *   - a row length that does not hold whole blocks of the chosen type falls back (`fallbacks`: Q4_K to Q5_0,
 *     Q5_K to Q5_1, Q6_K to Q8_0, ...), and to F16 when even that does not fit (SmolLM2's 576, Qwen2.5-0.5B's 896,
 *     Gemma 3 270M's 640 are not multiples of 256).
 * tests/test_quantize.c checks the rules by hand and, where the models are cached, against llama-quantize's own
 * files (tests/ref/quantize_mix_ref.txt): the same type for every tensor, the size within 1%. */
#include "model/quantize.h"
#include "status.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- the mixes */

typedef struct {
    const char *name;
    kiln_ftype ftype;
    kiln_type base; /* llama_ftype_get_default_type: the type of a weight no rule picks another for */
    bool alias;     /* another name of a mix listed above it (llama-quantize's Q3_K, Q4_K, Q5_K) */
} ftype_info;

static const ftype_info ftypes[] = {
    {"f32", KILN_FTYPE_ALL_F32, KILN_TYPE_F32, false},
    {"f16", KILN_FTYPE_MOSTLY_F16, KILN_TYPE_F16, false},
    {"bf16", KILN_FTYPE_MOSTLY_BF16, KILN_TYPE_BF16, false},
    {"q8_0", KILN_FTYPE_MOSTLY_Q8_0, KILN_TYPE_Q8_0, false},
    {"q4_0", KILN_FTYPE_MOSTLY_Q4_0, KILN_TYPE_Q4_0, false},
    {"q4_1", KILN_FTYPE_MOSTLY_Q4_1, KILN_TYPE_Q4_1, false},
    {"q5_0", KILN_FTYPE_MOSTLY_Q5_0, KILN_TYPE_Q5_0, false},
    {"q5_1", KILN_FTYPE_MOSTLY_Q5_1, KILN_TYPE_Q5_1, false},
    {"q2_k", KILN_FTYPE_MOSTLY_Q2_K, KILN_TYPE_Q2_K, false},
    {"q3_k_s", KILN_FTYPE_MOSTLY_Q3_K_S, KILN_TYPE_Q3_K, false},
    {"q3_k_m", KILN_FTYPE_MOSTLY_Q3_K_M, KILN_TYPE_Q3_K, false},
    {"q3_k_l", KILN_FTYPE_MOSTLY_Q3_K_L, KILN_TYPE_Q3_K, false},
    {"q4_k_s", KILN_FTYPE_MOSTLY_Q4_K_S, KILN_TYPE_Q4_K, false},
    {"q4_k_m", KILN_FTYPE_MOSTLY_Q4_K_M, KILN_TYPE_Q4_K, false},
    {"q5_k_s", KILN_FTYPE_MOSTLY_Q5_K_S, KILN_TYPE_Q5_K, false},
    {"q5_k_m", KILN_FTYPE_MOSTLY_Q5_K_M, KILN_TYPE_Q5_K, false},
    {"q6_k", KILN_FTYPE_MOSTLY_Q6_K, KILN_TYPE_Q6_K, false},
    {"iq4_nl", KILN_FTYPE_MOSTLY_IQ4_NL, KILN_TYPE_IQ4_NL, false},
    {"iq4_xs", KILN_FTYPE_MOSTLY_IQ4_XS, KILN_TYPE_IQ4_XS, false},
    {"q3_k", KILN_FTYPE_MOSTLY_Q3_K_M, KILN_TYPE_Q3_K, true},
    {"q4_k", KILN_FTYPE_MOSTLY_Q4_K_M, KILN_TYPE_Q4_K, true},
    {"q5_k", KILN_FTYPE_MOSTLY_Q5_K_M, KILN_TYPE_Q5_K, true},
};
#define N_FTYPES (sizeof ftypes / sizeof ftypes[0])

/* The first row of f: the mix's own name, never an alias. */
static const ftype_info *ftype_find(kiln_ftype f) {
    for (size_t i = 0; i < N_FTYPES; i++)
        if (ftypes[i].ftype == f) return &ftypes[i];
    return NULL;
}

bool kiln_ftype_known(kiln_ftype f) { return ftype_find(f) != NULL; }

const char *kiln_ftype_name(kiln_ftype f) {
    const ftype_info *fi = ftype_find(f);
    return fi ? fi->name : "unknown";
}

/* Space-separated lists built once from the tables they name. */
static char ftype_names[256], runnable_names[256];
static pthread_once_t names_once = PTHREAD_ONCE_INIT;

static void build_names(void) {
    size_t n = 0;
    for (size_t i = 0; i < N_FTYPES; i++)
        if (!ftypes[i].alias) n += (size_t)snprintf(ftype_names + n, sizeof ftype_names - n, n ? " %s" : "%s", ftypes[i].name);
    n = 0;
    for (int t = 0; t < KILN_TYPE_COUNT; t++)
        if (kiln_type_runnable((kiln_type)t))
            n += (size_t)snprintf(runnable_names + n, sizeof runnable_names - n, n ? " %s" : "%s", kiln_type_name((kiln_type)t));
}

const char *kiln_ftype_names(void) {
    pthread_once(&names_once, build_names);
    return ftype_names;
}

const char *kiln_runnable_type_names(void) {
    pthread_once(&names_once, build_names);
    return runnable_names;
}

bool kiln_type_runnable(kiln_type t) {
    const kiln_type_traits *tt = kiln_type_traits_get(t);
    return tt && tt->computable && tt->vec_dot[KILN_SIMD_SCALAR];
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
    return kiln_fail(KILN_ERR_INVALID, "unknown quantization type '%s' (expected one of %s)", name, kiln_ftype_names());
}

/* ---------------------------------------------------------------- tensor classes */

/* llama.cpp's tensor categories (tensor_get_category) that a rule of the mixes below names. */
typedef enum {
    CLS_OTHER,
    CLS_OUTPUT,
    CLS_TOKEN_EMBD,
    CLS_ATTN_V, /* attn_v, and the fused attn_qkv (phi3) and attn_kv_b, which llama.cpp treats as attn_v */
    CLS_ATTN_K,
    CLS_ATTN_Q,
    CLS_ATTN_OUTPUT,
    CLS_FFN_UP, /* ffn_up, and phi3's fused gate and up */
    CLS_FFN_GATE,
    CLS_FFN_DOWN,
} tensor_class;

/* The first row whose pattern is the whole name (whole) or occurs in it, in tensor_get_category's order. */
static const struct {
    const char *pattern;
    bool whole;
    tensor_class cls;
} class_patterns[] = {
    {"output.weight", true, CLS_OUTPUT},         {"token_embd.weight", true, CLS_TOKEN_EMBD},
    {"per_layer_token_embd.weight", true, CLS_TOKEN_EMBD},
    {"attn_qkv.weight", false, CLS_ATTN_V},      {"attn_kv_b.weight", false, CLS_ATTN_V},
    {"attn_v.weight", false, CLS_ATTN_V},        {"attn_k.weight", false, CLS_ATTN_K},
    {"attn_q.weight", false, CLS_ATTN_Q},        {"attn_output.weight", false, CLS_ATTN_OUTPUT},
    {"ffn_up", false, CLS_FFN_UP},               {"ffn_gate", false, CLS_FFN_GATE},
    {"ffn_down", false, CLS_FFN_DOWN},
};

static tensor_class class_of(const char *name) {
    for (size_t i = 0; i < sizeof class_patterns / sizeof class_patterns[0]; i++)
        if (class_patterns[i].whole ? strcmp(name, class_patterns[i].pattern) == 0 : strstr(name, class_patterns[i].pattern) != NULL)
            return class_patterns[i].cls;
    return CLS_OTHER;
}

/* Weights llama.cpp never quantizes although they are 2-D and named *weight (those of its list that a
 * llama-family file can hold): norms, MoE routers, position and token-type embeddings, Gemma 3n's small tables. */
static const char *const kept_patterns[] = {"_norm.weight", "ffn_gate_inp.weight", "position_embd", "token_types.weight",
                                            "altup", "laurel", "per_layer_model_proj"};

/* As ggml_n_dims counts them: up to the last dimension above 1, so a [C, 1] matrix is 1-D. */
static int real_dims(const kiln_tensor_view *t) {
    int d = t->n_dims;
    while (d > 1 && t->ne[d - 1] == 1) d--;
    return d;
}

static bool quantizable(const kiln_tensor_view *t) {
    size_t n = strlen(t->name);
    if (real_dims(t) < 2 || n < 6 || strcmp(t->name + n - 6, "weight") != 0) return false;
    for (size_t i = 0; i < sizeof kept_patterns / sizeof kept_patterns[0]; i++)
        if (strstr(t->name, kept_patterns[i])) return false;
    return true;
}

/* Layer index from "blk.N.", or -1 (llama.cpp's sscanf "blk.%d."). */
static int layer_of(const char *name) {
    if (strncmp(name, "blk.", 4) != 0) return -1;
    char *end;
    long i = strtol(name + 4, &end, 10);
    return end != name + 4 && *end == '.' && i >= 0 && i < 1000000 ? (int)i : -1;
}

/* ---------------------------------------------------------------- the rules */

/* Which tensors of a class a rule takes, by rank i among the n of the class (n is n_attn_v for attn_v, n_layer for
 * ffn_down, as llama.cpp counts them). */
typedef enum {
    ALWAYS,
    GQA_4,      /* n_gqa >= 4: the attn_v of a model with few KV heads is small, so more bits cost little */
    FIRST_2,    /* i < 2 */
    FIRST_4,    /* i < 4 */
    FIRST_8TH,  /* i < n/8 */
    FIRST_16TH, /* i < n/16 */
    MORE_BITS,  /* use_more_bits: i < n/8, i >= 7n/8, or (i - n/8) % 3 == 2: the first and last layers and every
                 * third between them, the most sensitive to quantization */
} rule_when;

typedef struct {
    kiln_ftype ftype;
    tensor_class cls;
    rule_when when;
    kiln_type type;
} mix_rule;

/* llama_tensor_get_type_impl's branches for the mixes kiln writes. For one mix and class the first row that holds
 * wins, as its else-if chains do; a mix and class without a row keep the base type. */
static const mix_rule rules[] = {
    {KILN_FTYPE_MOSTLY_Q2_K, CLS_ATTN_V, GQA_4, KILN_TYPE_Q4_K},
    {KILN_FTYPE_MOSTLY_Q2_K, CLS_ATTN_V, ALWAYS, KILN_TYPE_Q3_K},
    {KILN_FTYPE_MOSTLY_Q3_K_M, CLS_ATTN_V, FIRST_2, KILN_TYPE_Q5_K},
    {KILN_FTYPE_MOSTLY_Q3_K_M, CLS_ATTN_V, ALWAYS, KILN_TYPE_Q4_K},
    {KILN_FTYPE_MOSTLY_Q3_K_L, CLS_ATTN_V, ALWAYS, KILN_TYPE_Q5_K},
    {KILN_FTYPE_MOSTLY_IQ4_NL, CLS_ATTN_V, GQA_4, KILN_TYPE_Q5_K},
    {KILN_FTYPE_MOSTLY_IQ4_XS, CLS_ATTN_V, GQA_4, KILN_TYPE_Q5_K},
    {KILN_FTYPE_MOSTLY_Q4_K_M, CLS_ATTN_V, MORE_BITS, KILN_TYPE_Q6_K},
    {KILN_FTYPE_MOSTLY_Q5_K_M, CLS_ATTN_V, MORE_BITS, KILN_TYPE_Q6_K},
    {KILN_FTYPE_MOSTLY_Q4_K_S, CLS_ATTN_V, FIRST_4, KILN_TYPE_Q5_K},

    {KILN_FTYPE_MOSTLY_Q2_K, CLS_FFN_DOWN, ALWAYS, KILN_TYPE_Q3_K},
    {KILN_FTYPE_MOSTLY_Q3_K_M, CLS_FFN_DOWN, FIRST_16TH, KILN_TYPE_Q5_K},
    {KILN_FTYPE_MOSTLY_Q3_K_M, CLS_FFN_DOWN, ALWAYS, KILN_TYPE_Q4_K},
    {KILN_FTYPE_MOSTLY_Q3_K_L, CLS_FFN_DOWN, ALWAYS, KILN_TYPE_Q5_K},
    {KILN_FTYPE_MOSTLY_Q4_K_M, CLS_FFN_DOWN, MORE_BITS, KILN_TYPE_Q6_K},
    {KILN_FTYPE_MOSTLY_IQ4_NL, CLS_FFN_DOWN, FIRST_8TH, KILN_TYPE_Q5_K},
    {KILN_FTYPE_MOSTLY_IQ4_XS, CLS_FFN_DOWN, FIRST_8TH, KILN_TYPE_Q5_K},
    {KILN_FTYPE_MOSTLY_Q5_K_M, CLS_FFN_DOWN, MORE_BITS, KILN_TYPE_Q6_K},
    {KILN_FTYPE_MOSTLY_Q4_K_S, CLS_FFN_DOWN, FIRST_8TH, KILN_TYPE_Q5_K},

    {KILN_FTYPE_MOSTLY_Q2_K, CLS_ATTN_OUTPUT, ALWAYS, KILN_TYPE_Q3_K},
    {KILN_FTYPE_MOSTLY_Q3_K_M, CLS_ATTN_OUTPUT, ALWAYS, KILN_TYPE_Q4_K},
    {KILN_FTYPE_MOSTLY_Q3_K_L, CLS_ATTN_OUTPUT, ALWAYS, KILN_TYPE_Q5_K},
};

/* tensor_type_fallback: the type of a row that cannot hold whole blocks of `from` (256 elements), in 32-element
 * blocks of about as many bits. */
static const struct {
    kiln_type from, to;
} fallbacks[] = {
    {KILN_TYPE_Q2_K, KILN_TYPE_Q4_0}, {KILN_TYPE_Q3_K, KILN_TYPE_Q4_0},   {KILN_TYPE_Q4_K, KILN_TYPE_Q5_0},
    {KILN_TYPE_Q5_K, KILN_TYPE_Q5_1}, {KILN_TYPE_Q6_K, KILN_TYPE_Q8_0},   {KILN_TYPE_IQ4_XS, KILN_TYPE_IQ4_NL},
};

static bool rule_holds(rule_when w, int i, int n, const kiln_mix_model *m) {
    switch (w) {
    case ALWAYS: return true;
    case GQA_4: return m->n_gqa >= 4;
    case FIRST_2: return i < 2;
    case FIRST_4: return i < 4;
    case FIRST_8TH: return i < n / 8;
    case FIRST_16TH: return i < n / 16;
    case MORE_BITS: return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
    }
    return false;
}

static kiln_type fit_row(kiln_type want, int64_t ne0) {
    if (ne0 % kiln_type_block_size(want) == 0) return want;
    for (size_t i = 0; i < sizeof fallbacks / sizeof fallbacks[0]; i++)
        if (fallbacks[i].from == want) return ne0 % kiln_type_block_size(fallbacks[i].to) == 0 ? fallbacks[i].to : KILN_TYPE_F16;
    return KILN_TYPE_F16; /* a 32-element type (or one kiln never picks) that does not fit */
}

kiln_type kiln_quantize_choose_type(const kiln_tensor_view *t, kiln_ftype ftype, const kiln_mix_model *m, int rank) {
    const ftype_info *fi = ftype_find(ftype);
    if (!fi || !quantizable(t)) return t->type;
    kiln_type type = fi->base;
    if (type == KILN_TYPE_F32 || type == KILN_TYPE_F16 || type == KILN_TYPE_BF16) return type;
    tensor_class c = class_of(t->name);
    if (c == CLS_OUTPUT || (m->tied && c == CLS_TOKEN_EMBD)) {
        if (t->ne[0] % kiln_type_block_size(type) != 0) type = KILN_TYPE_Q8_0;
        else if (type != KILN_TYPE_Q8_0) type = KILN_TYPE_Q6_K;
    } else {
        int n = c == CLS_ATTN_V ? m->n_attn_v : m->n_layer;
        for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++)
            if (rules[i].ftype == ftype && rules[i].cls == c && rule_holds(rules[i].when, rank, n, m)) {
                type = rules[i].type;
                break;
            }
        /* a 70B's 8 query heads share each attn_v: it is an eighth of attn_q, so more bits cost little */
        if (c == CLS_ATTN_V && m->is_70b && (type == KILN_TYPE_Q3_K || type == KILN_TYPE_Q4_K)) type = KILN_TYPE_Q5_K;
    }
    return fit_row(type, t->ne[0]);
}

/* ---------------------------------------------------------------- the model's facts */

/* {arch}.suffix as an integer (the first element of a per-layer array), or dflt when absent. */
static int64_t arch_int(const kiln_gguf *g, kiln_str arch, const char *suffix, int64_t dflt) {
    char key[128];
    snprintf(key, sizeof key, "%.*s.%s", (int)(arch.len < 64 ? arch.len : 64), arch.ptr, suffix);
    const kiln_gguf_value *v = kiln_gguf_find(g, key);
    if (!v) return dflt;
    if (v->type == KILN_GGUF_ARRAY) {
        bool ints = v->arr.type <= KILN_GGUF_INT32 || v->arr.type == KILN_GGUF_UINT64 || v->arr.type == KILN_GGUF_INT64;
        return v->arr.n && v->arr.data && ints ? kiln_gguf_arr_i64(v, 0) : dflt;
    }
    int64_t x;
    return kiln_gguf_get_i64(g, key, &x) == KILN_OK ? x : dflt;
}

/* The architectures whose 80-layer models llama.cpp calls 70B (src/models/llama.cpp, qwen2.cpp). */
static const struct {
    const char *arch;
    bool needs_gqa; /* llama's 80-layer model without GQA is the 65B */
} arch_70b[] = {{"llama", true}, {"qwen2", false}};

kiln_status kiln_mix_model_read(const kiln_gguf *g, kiln_mix_model *m) {
    *m = (kiln_mix_model){.tied = kiln_gguf_find_tensor(g, "output.weight") == NULL};
    int max_layer = -1;
    for (int64_t i = 0; i < kiln_gguf_n_tensors(g); i++) {
        const char *name = kiln_gguf_tensor_at(g, i)->name;
        m->n_attn_v += class_of(name) == CLS_ATTN_V;
        int l = layer_of(name);
        if (l > max_layer) max_layer = l;
    }
    kiln_str arch = {.ptr = "", .len = 0};
    kiln_gguf_get_str(g, "general.architecture", &arch); /* absent: only the tensors count */
    int64_t n_layer = arch_int(g, arch, "block_count", max_layer + 1);
    int64_t n_head = arch_int(g, arch, "attention.head_count", 0);
    int64_t n_head_kv = arch_int(g, arch, "attention.head_count_kv", n_head);
    if (n_layer < 0 || n_layer > 1000000 || n_head < 0 || n_head_kv < 0)
        return kiln_fail(KILN_ERR_FORMAT, "%s: block_count %lld, head_count %lld, head_count_kv %lld out of range",
                         kiln_gguf_path(g), (long long)n_layer, (long long)n_head, (long long)n_head_kv);
    m->n_layer = (int)n_layer;
    m->n_gqa = n_head_kv ? (int)(n_head / n_head_kv) : 0;
    for (size_t i = 0; i < sizeof arch_70b / sizeof arch_70b[0]; i++)
        if (arch.len == strlen(arch_70b[i].arch) && memcmp(arch.ptr, arch_70b[i].arch, arch.len) == 0)
            m->is_70b = n_layer == 80 && (!arch_70b[i].needs_gqa || n_head != n_head_kv);
    return KILN_OK;
}

/* ---------------------------------------------------------------- the plan */

/* llama.cpp walks the tensors by layer, then name (weight_name_comparer) and counts each class as it goes. */
typedef struct {
    tensor_class cls;
    int layer;
    const char *name;
    int64_t index;
} rank_key;

static int rank_cmp(const void *pa, const void *pb) {
    const rank_key *a = pa, *b = pb;
    if (a->cls != b->cls) return a->cls < b->cls ? -1 : 1;
    if (a->layer != b->layer) return a->layer < b->layer ? -1 : 1;
    return strcmp(a->name, b->name);
}

/* rank[i]: tensor i's index among the tensors of its class in llama.cpp's order. */
static kiln_status class_ranks(const kiln_gguf *g, int *rank) {
    int64_t nt = kiln_gguf_n_tensors(g);
    rank_key *keys = malloc((size_t)(nt ? nt : 1) * sizeof *keys);
    if (!keys) return kiln_fail(KILN_ERR_NOMEM, "out of memory ranking %lld tensors", (long long)nt);
    for (int64_t i = 0; i < nt; i++) {
        const char *name = kiln_gguf_tensor_at(g, i)->name;
        keys[i] = (rank_key){class_of(name), layer_of(name), name, i};
    }
    qsort(keys, (size_t)nt, sizeof *keys, rank_cmp);
    for (int64_t i = 0, r = 0; i < nt; i++) {
        r = i > 0 && keys[i].cls == keys[i - 1].cls ? r + 1 : 0;
        rank[keys[i].index] = (int)r;
    }
    free(keys);
    return KILN_OK;
}

static bool convertible(kiln_type from, kiln_type to) {
    if (from == to) return true;
    const kiln_type_traits *dst = kiln_type_traits_get(to);
    return kiln_get_to_float(from, KILN_SIMD_SCALAR) && dst && dst->from_float_ref;
}

void kiln_quantize_plan_free(kiln_quantize_plan *p) {
    if (!p) return;
    free(p->tensors);
    free(p->names_);
    memset(p, 0, sizeof *p);
}

static bool skip_quant_keys(const char *key) {
    return strcmp(key, "general.file_type") == 0 || strcmp(key, "general.quantization_version") == 0;
}

kiln_status kiln_quantize_writer(const kiln_gguf *g, const kiln_quantize_plan *p, kiln_gguf_writer **out) {
    kiln_gguf_writer *w = NULL;
    kiln_status s;
    if ((s = kiln_gguf_writer_new(&w)) || (s = kiln_gguf_writer_copy_kv(w, g, skip_quant_keys)) ||
        (s = kiln_gguf_writer_set_u32(w, "general.file_type", (uint32_t)p->ftype)) ||
        (s = kiln_gguf_writer_set_u32(w, "general.quantization_version", 2)))
        goto fail;
    for (int64_t i = 0; i < p->n_tensors; i++) {
        const kiln_quantize_tensor *t = &p->tensors[i];
        if ((s = kiln_gguf_writer_add_tensor(w, t->name, t->to, t->n_dims, t->ne, NULL))) goto fail;
    }
    *out = w;
    return KILN_OK;
fail:
    kiln_gguf_writer_free(w);
    return s;
}

kiln_status kiln_quantize_plan_gguf(const kiln_gguf *g, kiln_ftype ftype, kiln_quantize_plan *out) {
    memset(out, 0, sizeof *out);
    if (!kiln_ftype_known(ftype)) return kiln_fail(KILN_ERR_INVALID, "unknown file type %d", (int)ftype);
    kiln_mix_model m;
    kiln_status s = kiln_mix_model_read(g, &m);
    if (s) return s;
    int64_t nt = kiln_gguf_n_tensors(g);
    size_t name_bytes = 0;
    for (int64_t i = 0; i < nt; i++) name_bytes += strlen(kiln_gguf_tensor_at(g, i)->name) + 1;
    int *rank = malloc((size_t)(nt ? nt : 1) * sizeof *rank);
    out->tensors = calloc((size_t)(nt ? nt : 1), sizeof *out->tensors);
    out->names_ = malloc(name_bytes ? name_bytes : 1);
    out->ftype = ftype;
    out->n_tensors = nt;
    out->in_file_bytes = kiln_gguf_file_size(g);
    if (!rank || !out->tensors || !out->names_) {
        s = kiln_fail(KILN_ERR_NOMEM, "out of memory planning %lld tensors", (long long)nt);
        goto out;
    }
    if ((s = class_ranks(g, rank))) goto out;
    char *names = out->names_;
    for (int64_t i = 0; i < nt; i++) {
        const kiln_tensor_view *v = kiln_gguf_tensor_at(g, i);
        kiln_quantize_tensor *t = &out->tensors[i];
        size_t len = strlen(v->name) + 1;
        memcpy(names, v->name, len);
        *t = (kiln_quantize_tensor){.name = names, .from = v->type, .n_dims = v->n_dims,
                                    .to = kiln_quantize_choose_type(v, ftype, &m, rank[i])};
        names += len;
        memcpy(t->ne, v->ne, sizeof t->ne);
        uint64_t rows = (uint64_t)v->ne[1] * (uint64_t)v->ne[2] * (uint64_t)v->ne[3]; /* the reader bounds each */
        size_t row = kiln_type_row_bytes(t->to, v->ne[0]);
        if (!row || !kiln_mul_ok(rows, row, &t->bytes)) {
            s = kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s' is too large as %s", kiln_gguf_path(g), v->name, kiln_type_name(t->to));
            goto out;
        }
        t->convertible = convertible(t->from, t->to);
        out->n_of_type[t->to]++;
        out->n_inconvertible += !t->convertible;
        out->n_elements += (uint64_t)v->ne[0] * rows;
    }
    kiln_gguf_writer *w = NULL;
    if (!(s = kiln_quantize_writer(g, out, &w))) s = kiln_gguf_writer_file_size(w, &out->file_bytes);
    kiln_gguf_writer_free(w);
out:
    free(rank);
    if (s) kiln_quantize_plan_free(out);
    return s;
}

kiln_status kiln_quantize_plan_make(const char *in_path, kiln_ftype ftype, kiln_quantize_plan *out) {
    memset(out, 0, sizeof *out);
    kiln_gguf *g;
    kiln_status s = kiln_gguf_open(in_path, &g);
    if (s) return s;
    s = kiln_quantize_plan_gguf(g, ftype, out);
    kiln_gguf_close(g);
    return s;
}
