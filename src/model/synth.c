/* synth.c: `kiln synth`, a llama-architecture GGUF with random but valid weights and complete metadata (or, with
 * qk_norm, a qwen3 one: the same tensors plus per-head QK-norm weights).
 * Real weights cannot travel to the GPU machine, so speed tests make their models there with this.
 * Weights are N(0, 0.02) like GPT-2/llm.c initialization; norms are 1. Weight types follow kiln quantize's
 * rules for the chosen ftype (so a q4_k_m file has q6_K attn_v/ffn_down where llama.cpp puts them). Each tensor
 * is generated row by row on the thread pool, quantized straight to its type and streamed through the GGUF
 * writer: memory stays at one tensor in its final type, and row r of tensor i always draws from the same
 * stream, so the file does not depend on the thread count. tests/test_quantize.c checks the output. */
#include "model.h"
#include "pool.h"
#include "model/quantize.h"
#include "quants.h"
#include "status.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

kiln_synth_params kiln_synth_default(void) {
    return (kiln_synth_params){.n_vocab = 4096, .n_embd = 256, .n_layer = 8, .n_head = 8, .n_head_kv = 4, .n_ff = 768,
                               .n_ctx = 2048, .rope_base = 10000.0f, .ftype = KILN_FTYPE_ALL_F32, .seed = 1};
}

typedef struct {
    const char *name;
    int64_t V, C, L, NH, NKV, F, ctx;
    float rope_base;
} synth_shape;

static const synth_shape shapes[] = {
    {"llama-124m", 32000, 768, 12, 12, 4, 2048, 2048, 10000.0f},
    {"tinyllama-1.1b", 32000, 2048, 22, 32, 4, 5632, 2048, 10000.0f},
    {"llama2-7b", 32000, 4096, 32, 32, 32, 11008, 4096, 10000.0f},
    {"llama3-8b", 128256, 4096, 32, 32, 8, 14336, 8192, 500000.0f},
};

kiln_status kiln_synth_shape(const char *name, kiln_synth_params *p) {
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        if (strcmp(shapes[i].name, name) == 0) {
            const synth_shape *s = &shapes[i];
            p->n_vocab = s->V, p->n_embd = s->C, p->n_layer = s->L, p->n_head = s->NH, p->n_head_kv = s->NKV;
            p->n_ff = s->F, p->n_ctx = s->ctx, p->rope_base = s->rope_base;
            return KILN_OK;
        }
    return kiln_fail(KILN_ERR_INVALID, "unknown shape '%s' (llama-124m, tinyllama-1.1b, llama2-7b, llama3-8b)", name);
}

static uint64_t rng_next(uint64_t *s) { /* xorshift64* */
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1DULL;
}

static float rng_normal(uint64_t *s) { /* Box-Muller */
    double u1 = ((double)(rng_next(s) >> 11) + 1.0) * (1.0 / 9007199254740993.0);
    double u2 = (double)(rng_next(s) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

static uint64_t row_seed(uint64_t seed, int64_t tensor, int64_t row) { /* splitmix64 of the three */
    uint64_t x = seed * 0x9E3779B97F4A7C15ULL ^ (uint64_t)tensor * 0xBF58476D1CE4E5B9ULL ^ (uint64_t)row * 0x94D049BB133111EBULL;
    x ^= x >> 31;
    x *= 0xD6E8FEB86659FD93ULL;
    x ^= x >> 32;
    return x ? x : 1;
}

typedef struct {
    char name[64];
    int n_dims;
    int64_t ne[2];
    bool norm;
    kiln_type type;
} synth_tensor;

/* Appends one tensor: a vector (ne1 1, a norm) or a matrix. */
static void add(synth_tensor *ts, int64_t *n, int64_t ne0, int64_t ne1, const char *name) {
    synth_tensor *t = &ts[(*n)++];
    snprintf(t->name, sizeof t->name, "%s", name);
    const bool norm = ne1 == 1;
    t->n_dims = norm ? 1 : 2;
    t->ne[0] = ne0;
    t->ne[1] = ne1;
    t->norm = norm;
}

static kiln_status check_params(const kiln_synth_params *p) {
    if (p->n_vocab < 1 || p->n_embd < 1 || p->n_layer < 1 || p->n_head < 1 || p->n_head_kv < 1 || p->n_ff < 1 || p->n_ctx < 1)
        return kiln_fail(KILN_ERR_INVALID, "synth: every dimension must be positive");
    if (p->n_embd % p->n_head || p->n_head % p->n_head_kv)
        return kiln_fail(KILN_ERR_INVALID, "synth: n_embd %lld must divide by n_head %lld, and n_head by n_head_kv %lld",
                         (long long)p->n_embd, (long long)p->n_head, (long long)p->n_head_kv);
    if ((p->n_embd / p->n_head) % 2) return kiln_fail(KILN_ERR_INVALID, "synth: head size %lld must be even for RoPE", (long long)(p->n_embd / p->n_head));
    if (p->n_vocab > INT32_MAX || p->n_embd > (1 << 20) || p->n_ff > (1 << 22) || p->n_layer > 4096)
        return kiln_fail(KILN_ERR_INVALID, "synth: dimensions too large");
    if (!(p->rope_base > 0)) return kiln_fail(KILN_ERR_INVALID, "synth: rope base must be positive");
    return KILN_OK;
}

typedef struct {
    const synth_tensor *t;
    int64_t index;
    uint64_t seed;
    void *out;
    size_t row_bytes;
    float **rows; /* (nth, ne0) */
    kiln_from_float_fn quantize;
    bool raw; /* params.fast on a block format: random block bytes, then fixed scales (raw_blocks) */
} synth_job;

/* params.fast: every byte of the row random, then each block's f16 scale fields set to constants that give its
 * values a standard deviation near 0.02 over the random quants (q uniform in its range, 6-bit sub-block scales
 * uniform): e.g. Q4_0 d (q - 8), std(q - 8) = 4.6, so d = 0.0043. The values are not normals, but the shapes, types
 * and byte traffic are a real model's, at the speed of the RNG: a 7B file in seconds rather than the minutes the
 * quantizer's search takes. For speed measurements, where what the numbers are does not matter. */
static void raw_blocks(kiln_type t, uint8_t *row, size_t row_bytes, uint64_t *rng) {
    for (size_t i = 0; i < row_bytes; i += 8) {
        uint64_t x = rng_next(rng);
        memcpy(row + i, &x, row_bytes - i < 8 ? row_bytes - i : 8);
    }
    const size_t bs = kiln_type_block_bytes(t);
    float d = 0, m = 0; /* the scale fields: d at offset 0 and m at 2, except Q6_K's and Q3_K's d at the end, Q2_K's
                         * d and dmin the last 4 bytes */
    switch (t) {
    case KILN_TYPE_Q5_1: d = 0.0022f, m = -0.034f; break;
    case KILN_TYPE_Q2_K: d = 1.7e-3f, m = 2.5e-3f; break; /* d sc q - dmin m, sc and m 4-bit */
    case KILN_TYPE_Q3_K: d = 4.7e-4f; break;              /* d (sc - 32) (q - 4), sc 6-bit */
    case KILN_TYPE_IQ4_NL: d = 3e-4f; break;              /* d * level, level std ~68 */
    case KILN_TYPE_IQ4_XS: d = 1.6e-5f; break;            /* d (ls - 32) level */
    case KILN_TYPE_Q4_0: d = 0.0043f; break;
    case KILN_TYPE_Q4_1: d = 0.0043f, m = -0.032f; break;
    case KILN_TYPE_Q5_0: d = 0.0022f; break;
    case KILN_TYPE_Q8_0: d = 0.00027f; break;
    case KILN_TYPE_Q4_K: d = 6e-5f, m = 4.5e-4f; break; /* d sc q - dmin m, sc and m 6-bit */
    case KILN_TYPE_Q5_K: d = 3e-5f, m = 4.5e-4f; break;
    case KILN_TYPE_Q6_K: d = 1.5e-5f; break; /* d sc (q - 32), sc int8 */
    default: return;
    }
    const kiln_fp16 hd = kiln_f32_to_fp16(d), hm = kiln_f32_to_fp16(m);
    for (size_t b = 0; b < row_bytes; b += bs) {
        if (t == KILN_TYPE_Q6_K || t == KILN_TYPE_Q3_K) {
            memcpy(row + b + bs - 2, &hd, 2);
            continue;
        }
        if (t == KILN_TYPE_Q2_K) {
            memcpy(row + b + bs - 4, &hd, 2);
            memcpy(row + b + bs - 2, &hm, 2);
            continue;
        }
        memcpy(row + b, &hd, 2);
        if (t == KILN_TYPE_Q4_1 || t == KILN_TYPE_Q4_K || t == KILN_TYPE_Q5_K || t == KILN_TYPE_Q5_1) memcpy(row + b + 2, &hm, 2);
    }
}

static void synth_rows(void *ctx, int ith, int nth) {
    synth_job *j = ctx;
    int64_t ne0 = j->t->ne[0], n_rows = j->t->ne[1];
    float *row = j->rows[ith];
    for (int64_t r = ith; r < n_rows; r += nth) {
        uint64_t rng = row_seed(j->seed, j->index, r);
        if (j->raw) {
            raw_blocks(j->t->type, (uint8_t *)j->out + (size_t)r * j->row_bytes, j->row_bytes, &rng);
            continue;
        }
        for (int64_t k = 0; k < ne0; k++) row[k] = j->t->norm ? 1.0f : 0.02f * rng_normal(&rng);
        j->quantize(row, (uint8_t *)j->out + (size_t)r * j->row_bytes, ne0);
    }
}

/* copy_kv skips what this returns true for: every key but the tokenizer's */
static bool not_tokenizer_key(const char *key) { return strncmp(key, "tokenizer.", 10) != 0; }

kiln_status kiln_synth_llama(const char *path, const kiln_synth_params *params) {
    kiln_synth_params p = *params;
    kiln_gguf *vocab = NULL;
    kiln_status s = KILN_OK;
    if (p.vocab_path) {
        const kiln_gguf_value *toks;
        if ((s = kiln_gguf_open(p.vocab_path, &vocab)) || (s = kiln_gguf_get_arr(vocab, "tokenizer.ggml.tokens", KILN_GGUF_STRING, &toks))) {
            kiln_gguf_close(vocab);
            return s;
        }
        p.n_vocab = (int64_t)toks->arr.n;
    }
    if ((s = check_params(&p))) {
        kiln_gguf_close(vocab);
        return s;
    }
    int64_t C = p.n_embd, V = p.n_vocab, F = p.n_ff, HS = C / p.n_head;
    /* a plain llama: the table's tensors that every layer has */
    const kiln_llama_config cfg = {.n_vocab = V, .n_embd = C, .n_layer = p.n_layer, .n_head = p.n_head, .n_head_kv = p.n_head_kv,
                                   .head_dim = HS, .n_ff = F, .qk_norm = p.qk_norm};
    const char *arch = p.qk_norm ? "qwen3" : "llama";
    int64_t n_max = 3 + KILN_LT_COUNT * p.n_layer, n = 0;
    synth_tensor *ts = calloc((size_t)n_max, sizeof *ts);
    kiln_gguf_writer *w = NULL;
    kiln_pool *pool = NULL;
    float **rows = NULL;
    void *out = NULL;
    if (!ts) {
        kiln_gguf_close(vocab);
        return kiln_fail(KILN_ERR_NOMEM, "synth: out of memory");
    }
    char name[64], kb[96];
    add(ts, &n, C, V, "token_embd.weight");
    for (int64_t l = 0; l < p.n_layer; l++)
        for (int i = 0; i < KILN_LT_COUNT; i++)
            if (kiln_layer_has(&cfg, (kiln_layer_tensor)i))
                add(ts, &n, kiln_dim_size(&cfg, kiln_layer_tensors[i].ne0), kiln_dim_size(&cfg, kiln_layer_tensors[i].ne1),
                    kiln_layer_tensor_name(name, sizeof name, l, (kiln_layer_tensor)i));
    add(ts, &n, C, 1, "output_norm.weight");
    if (!p.tied) add(ts, &n, C, V, "output.weight");
    size_t max_bytes = 1;
    /* every layer has one tensor of each class, so a tensor's rank in its class is its layer */
    kiln_mix_model mix = {.n_layer = (int)p.n_layer, .n_attn_v = (int)p.n_layer, .n_gqa = (int)(p.n_head / p.n_head_kv),
                          .tied = p.tied};
    for (int64_t i = 0; i < n; i++) {
        kiln_tensor_view v = {.name = ts[i].name, .n_dims = ts[i].n_dims, .ne = {ts[i].ne[0], ts[i].ne[1], 1, 1}};
        int layer = strncmp(v.name, "blk.", 4) == 0 ? atoi(v.name + 4) : 0;
        ts[i].type = kiln_quantize_choose_type(&v, p.ftype, &mix, layer);
        size_t bytes = kiln_type_row_bytes(ts[i].type, ts[i].ne[0]) * (size_t)ts[i].ne[1];
        if (bytes > max_bytes) max_bytes = bytes;
        /* a type without a quantizer yet: only --fast, which writes random blocks, can make it */
        if (!p.fast && !kiln_type_traits_get(ts[i].type)->from_float_ref && !s)
            s = kiln_fail(KILN_ERR_UNSUPPORTED, "synth: kiln cannot write %s yet (it has no quantizer for it)",
                          kiln_type_name(ts[i].type));
    }
    if (!s) s = kiln_gguf_writer_new(&w);
    if (!s) s = kiln_gguf_writer_set_str(w, "general.architecture", arch);
    if (!s) s = kiln_gguf_writer_set_str(w, "general.name", "kiln-synth");
    if (!s) s = kiln_gguf_writer_set_u32(w, "general.file_type", (uint32_t)p.ftype);
    if (!s && p.ftype != KILN_FTYPE_ALL_F32) s = kiln_gguf_writer_set_u32(w, "general.quantization_version", 2);
    if (!s) s = kiln_gguf_writer_set_u32(w, kiln_arch_key(kb, sizeof kb, arch, "vocab_size"), (uint32_t)V);
    if (!s) s = kiln_gguf_writer_set_u32(w, kiln_arch_key(kb, sizeof kb, arch, "context_length"), (uint32_t)p.n_ctx);
    if (!s) s = kiln_gguf_writer_set_u32(w, kiln_arch_key(kb, sizeof kb, arch, "embedding_length"), (uint32_t)C);
    if (!s) s = kiln_gguf_writer_set_u32(w, kiln_arch_key(kb, sizeof kb, arch, "block_count"), (uint32_t)p.n_layer);
    if (!s) s = kiln_gguf_writer_set_u32(w, kiln_arch_key(kb, sizeof kb, arch, "feed_forward_length"), (uint32_t)F);
    if (!s) s = kiln_gguf_writer_set_u32(w, kiln_arch_key(kb, sizeof kb, arch, "attention.head_count"), (uint32_t)p.n_head);
    if (!s) s = kiln_gguf_writer_set_u32(w, kiln_arch_key(kb, sizeof kb, arch, "attention.head_count_kv"), (uint32_t)p.n_head_kv);
    if (!s) s = kiln_gguf_writer_set_u32(w, kiln_arch_key(kb, sizeof kb, arch, "rope.dimension_count"), (uint32_t)HS);
    if (!s && p.qk_norm) s = kiln_gguf_writer_set_u32(w, kiln_arch_key(kb, sizeof kb, arch, "attention.key_length"), (uint32_t)HS);
    if (!s) s = kiln_gguf_writer_set_f32(w, kiln_arch_key(kb, sizeof kb, arch, "rope.freq_base"), p.rope_base);
    if (!s) s = kiln_gguf_writer_set_f32(w, kiln_arch_key(kb, sizeof kb, arch, "attention.layer_norm_rms_epsilon"), p.qk_norm ? 1e-6f : 1e-5f);
    if (!s && vocab) s = kiln_gguf_writer_copy_kv(w, vocab, not_tokenizer_key);
    for (int64_t i = 0; !s && i < n; i++) s = kiln_gguf_writer_add_tensor(w, ts[i].name, ts[i].type, ts[i].n_dims, ts[i].ne, NULL);
    if (!s) s = kiln_pool_create(p.n_threads, &pool);
    int nth = pool ? kiln_pool_size(pool) : 0;
    int64_t max_row = C > F ? C : F;
    if (!s && (!(out = malloc(max_bytes)) || !(rows = calloc((size_t)nth, sizeof *rows))))
        s = kiln_fail(KILN_ERR_NOMEM, "synth: out of memory for a %zu-byte tensor", max_bytes);
    for (int i = 0; !s && i < nth; i++)
        if (!(rows[i] = malloc((size_t)max_row * sizeof(float)))) s = kiln_fail(KILN_ERR_NOMEM, "synth: out of memory");
    if (!s) s = kiln_gguf_writer_begin(w, path);
    for (int64_t i = 0; !s && i < n; i++) {
        synth_job j = {.t = &ts[i], .index = i, .seed = p.seed, .out = out, .rows = rows,
                       .row_bytes = kiln_type_row_bytes(ts[i].type, ts[i].ne[0]),
                       .quantize = kiln_type_traits_get(ts[i].type)->from_float_ref,
                       .raw = p.fast && !ts[i].norm && kiln_type_block_size(ts[i].type) > 1};
        kiln_pool_run(pool, synth_rows, &j);
        s = kiln_gguf_writer_write_tensor(w, i, out, j.row_bytes * (size_t)ts[i].ne[1]);
    }
    if (!s) s = kiln_gguf_writer_finish(w);
    for (int i = 0; rows && i < nth; i++) free(rows[i]);
    free(rows);
    free(out);
    kiln_pool_free(pool);
    kiln_gguf_writer_free(w);
    kiln_gguf_close(vocab);
    free(ts);
    return s;
}
