/* quantize.h: the tensor-type rules of `kiln quantize` for llama-family files, llama-quantize's (quantize.c). */
#ifndef KILN_MODEL_QUANTIZE_H
#define KILN_MODEL_QUANTIZE_H

#include "quants.h"

/* What llama.cpp's rules read of the whole model (kiln_mix_model_read fills it from a file). */
typedef struct kiln_mix_model {
    int n_layer;  /* {arch}.block_count: llama.cpp's n_ffn_down, the n of ffn_down's layer rules */
    int n_attn_v; /* tensors of the attn_v class (attn_v, the fused attn_qkv): the n of attn_v's layer rules */
    int n_gqa;    /* head_count / head_count_kv (integer division, as llama.cpp); 0 when unknown */
    bool tied;    /* no output.weight: token_embd is the head and takes the head's type */
    bool is_70b;  /* llama.cpp's LLM_TYPE_70B (llama with 80 layers and GQA, qwen2 with 80): attn_v gets Q5_K */
} kiln_mix_model;

/* The type kiln quantize gives tensor t under ftype. rank is t's index among the tensors of its class (attn_v,
 * ffn_down, ...) in llama.cpp's order (by layer, then name): in a model with one of each per layer, its layer. */
kiln_type kiln_quantize_choose_type(const kiln_tensor_view *t, kiln_ftype ftype, const kiln_mix_model *m, int rank);
kiln_status kiln_mix_model_read(const kiln_gguf *g, kiln_mix_model *m);

/* Whether f is one of the mixes kiln quantize writes. */
bool kiln_ftype_known(kiln_ftype f);

/* kiln_quantize_plan_make on an open file. */
kiln_status kiln_quantize_plan_gguf(const kiln_gguf *g, kiln_ftype ftype, kiln_quantize_plan *out);
/* A writer holding g's metadata (file type and quantization version set for p) and p's tensor table, ready to begin. */
kiln_status kiln_quantize_writer(const kiln_gguf *g, const kiln_quantize_plan *p, kiln_gguf_writer **out);

/* "f32 f16 bf16 q4_0 ...": the types kiln_type_runnable accepts, for messages. */
const char *kiln_runnable_type_names(void);

#endif
