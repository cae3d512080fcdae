/* import_hf.h: a Hugging Face tokenizer (tokenizer.json byte-level BPE, or tokenizer.model SentencePiece) into
 * the tokenizer.ggml.* metadata llama.cpp's convert_hf_to_gguf.py writes, for kiln convert hf. */
#ifndef KILN_TOK_IMPORT_HF_H
#define KILN_TOK_IMPORT_HF_H

#include "kiln.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct kiln_hf_tok_params {
    bool prefer_spm;      /* tokenizer.model before tokenizer.json (llama, mistral, gemma, phi3 as llama.cpp does) */
    int64_t n_rows;       /* the embedding's rows: the token list is padded with [PAD<id>] (UNUSED) up to it */
} kiln_hf_tok_params;

/* Writes the tokenizer of folder dir into w. dir's config.json, tokenizer_config.json, chat_template.jinja and
 * generation_config.json add special ids, add_bos/add_eos and the chat template. More tokens than n_rows, a model
 * type other than BPE/SentencePiece, or a pre-tokenizer kiln does not recognise is an error naming it. */
kiln_status kiln_hf_tokenizer_write(kiln_gguf_writer *w, const char *dir, const kiln_hf_tok_params *p);

#endif
