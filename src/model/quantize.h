/* quantize.h: the tensor-type rules of `kiln quantize` for llama-family files (quantize.c). */
#ifndef KILN_MODEL_QUANTIZE_H
#define KILN_MODEL_QUANTIZE_H

#include "quants.h"

/* The type `kiln quantize` gives tensor t under ftype (quantize.c has the rules). n_attn_v and n_ffn_down
 * count the model's layers with those tensors; has_output says the head is untied. */
kiln_type kiln_quantize_choose_type(const kiln_tensor_view *t, kiln_ftype ftype, int n_attn_v, int n_ffn_down, bool has_output);

/* Whether f is one of the mixes kiln quantize writes. */
bool kiln_ftype_known(kiln_ftype f);
/* The layers of g with attn_v and with ffn_down weights, as kiln_quantize_choose_type counts them. */
void kiln_quantize_count(const kiln_gguf *g, int *n_attn_v, int *n_ffn_down);

#endif
