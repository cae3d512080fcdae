/* synth.c: `kiln synth`, a llama-architecture GGUF with random weights and complete metadata.
 * Real weights cannot travel to the GPU machine, so benchmarks and device tests make their models
 * there with this. Weights are N(0, 0.02) like GPT-2/llm.c initialization; norms are 1. Each tensor is
 * generated and streamed through the GGUF writer, so memory stays at one tensor. */
#include "quants.h"
#include "status.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

kiln_synth_params kiln_synth_default(void) {
    return (kiln_synth_params){.n_vocab = 4096, .n_embd = 256, .n_layer = 8, .n_head = 8, .n_head_kv = 4,
                               .n_ff = 768, .n_ctx = 2048, .tied = false, .type = KILN_TYPE_F32, .seed = 1};
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

typedef struct {
    char name[64];
    int n_dims;
    int64_t ne[2];
    bool norm;
} synth_tensor;

/* Appends one tensor; fmt holds at most one %lld, the layer. */
static void add(synth_tensor *ts, int64_t *n, int n_dims, int64_t ne0, int64_t ne1, bool norm, const char *fmt, int64_t layer) {
    synth_tensor *t = &ts[(*n)++];
    snprintf(t->name, sizeof t->name, fmt, (long long)layer);
    t->n_dims = n_dims;
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
    if (p->type != KILN_TYPE_F32 && p->type != KILN_TYPE_F16 && p->type != KILN_TYPE_BF16)
        return kiln_fail(KILN_ERR_INVALID, "synth: weights must be f32, f16 or bf16 (quantize the result for other types)");
    if (p->n_vocab > INT32_MAX || p->n_embd > (1 << 20) || p->n_ff > (1 << 22) || p->n_layer > 4096)
        return kiln_fail(KILN_ERR_INVALID, "synth: dimensions too large");
    return KILN_OK;
}

kiln_status kiln_synth_llama(const char *path, const kiln_synth_params *p) {
    kiln_status s = check_params(p);
    if (s) return s;
    int64_t C = p->n_embd, V = p->n_vocab, F = p->n_ff, HS = C / p->n_head, KV = HS * p->n_head_kv;
    int64_t n_tensors = 3 + 9 * p->n_layer;
    synth_tensor *ts = calloc((size_t)n_tensors, sizeof *ts);
    if (!ts) return kiln_fail(KILN_ERR_NOMEM, "synth: out of memory");
    int64_t n = 0;
    add(ts, &n, 2, C, V, false, "token_embd.weight", 0);
    for (int64_t l = 0; l < p->n_layer; l++) {
        add(ts, &n, 1, C, 1, true, "blk.%lld.attn_norm.weight", l);
        add(ts, &n, 2, C, C, false, "blk.%lld.attn_q.weight", l);
        add(ts, &n, 2, C, KV, false, "blk.%lld.attn_k.weight", l);
        add(ts, &n, 2, C, KV, false, "blk.%lld.attn_v.weight", l);
        add(ts, &n, 2, C, C, false, "blk.%lld.attn_output.weight", l);
        add(ts, &n, 1, C, 1, true, "blk.%lld.ffn_norm.weight", l);
        add(ts, &n, 2, C, F, false, "blk.%lld.ffn_gate.weight", l);
        add(ts, &n, 2, C, F, false, "blk.%lld.ffn_up.weight", l);
        add(ts, &n, 2, F, C, false, "blk.%lld.ffn_down.weight", l);
    }
    add(ts, &n, 1, C, 1, true, "output_norm.weight", 0);
    if (!p->tied) add(ts, &n, 2, C, V, false, "output.weight", 0);
    kiln_gguf_writer *w = NULL;
    float *row = NULL;
    void *out = NULL;
    s = kiln_gguf_writer_new(&w);
    uint32_t file_type = p->type == KILN_TYPE_F32 ? KILN_FTYPE_ALL_F32 : p->type == KILN_TYPE_F16 ? KILN_FTYPE_MOSTLY_F16 : KILN_FTYPE_MOSTLY_BF16;
    if (!s) s = kiln_gguf_writer_set_str(w, "general.architecture", "llama");
    if (!s) s = kiln_gguf_writer_set_str(w, "general.name", "kiln-synth");
    if (!s) s = kiln_gguf_writer_set_u32(w, "general.file_type", file_type);
    if (!s) s = kiln_gguf_writer_set_u32(w, "llama.vocab_size", (uint32_t)V);
    if (!s) s = kiln_gguf_writer_set_u32(w, "llama.context_length", (uint32_t)p->n_ctx);
    if (!s) s = kiln_gguf_writer_set_u32(w, "llama.embedding_length", (uint32_t)C);
    if (!s) s = kiln_gguf_writer_set_u32(w, "llama.block_count", (uint32_t)p->n_layer);
    if (!s) s = kiln_gguf_writer_set_u32(w, "llama.feed_forward_length", (uint32_t)F);
    if (!s) s = kiln_gguf_writer_set_u32(w, "llama.attention.head_count", (uint32_t)p->n_head);
    if (!s) s = kiln_gguf_writer_set_u32(w, "llama.attention.head_count_kv", (uint32_t)p->n_head_kv);
    if (!s) s = kiln_gguf_writer_set_u32(w, "llama.rope.dimension_count", (uint32_t)HS);
    if (!s) s = kiln_gguf_writer_set_f32(w, "llama.rope.freq_base", 10000.0f);
    if (!s) s = kiln_gguf_writer_set_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    for (int64_t i = 0; !s && i < n; i++)
        s = kiln_gguf_writer_add_tensor(w, ts[i].name, ts[i].norm ? KILN_TYPE_F32 : p->type, ts[i].n_dims, ts[i].ne, NULL);
    int64_t max_row = C > F ? C : F;
    size_t max_elems = (size_t)(V > F ? V : F) * (size_t)max_row;
    if (!s && (!(row = malloc(max_elems * sizeof(float))) || !(out = malloc(max_elems * sizeof(float)))))
        s = kiln_fail(KILN_ERR_NOMEM, "synth: out of memory for a %zu-element tensor", max_elems);
    if (!s) s = kiln_gguf_writer_begin(w, path);
    uint64_t rng = p->seed ? p->seed : 1;
    for (int64_t i = 0; !s && i < n; i++) {
        size_t ne = (size_t)(ts[i].ne[0] * ts[i].ne[1]);
        for (size_t j = 0; j < ne; j++) row[j] = ts[i].norm ? 1.0f : 0.02f * rng_normal(&rng);
        kiln_type t = ts[i].norm ? KILN_TYPE_F32 : p->type;
        kiln_get_from_float(t, KILN_SIMD_SCALAR)(row, out, (int64_t)ne);
        s = kiln_gguf_writer_write_tensor(w, i, out, ne * kiln_type_block_bytes(t));
    }
    if (!s) s = kiln_gguf_writer_finish(w);
    kiln_gguf_writer_free(w);
    free(row);
    free(out);
    free(ts);
    return s;
}
