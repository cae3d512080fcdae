/* kiln.h: the public C API of kiln, a C engine that trains and runs LLaMA-family models.
 *
 * Conventions: opaque handles, functions named kiln_<object>_<verb>, every fallible call returns a
 * kiln_status. On failure kiln_last_error() holds a one-line message naming what was wrong and
 * where (file, field or tensor, byte offset). The library never prints to stdout and never exits. */
#ifndef KILN_H
#define KILN_H

/* The version of this header and of the library built with it. The Makefile reads these four lines for the
 * shared library's soname (libkiln.so.MAJOR) and kiln.pc, and stops when the string and the numbers disagree. */
#define KILN_VERSION "0.1.0"
#define KILN_VERSION_MAJOR 0
#define KILN_VERSION_MINOR 1
#define KILN_VERSION_PATCH 0

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- status */

typedef enum kiln_status {
    KILN_OK = 0,
    KILN_ERR_IO,          /* open/read/write/rename failed */
    KILN_ERR_FORMAT,      /* malformed file: bad magic, truncation, bad field */
    KILN_ERR_NOMEM,       /* allocation failed or a size overflowed */
    KILN_ERR_INVALID,     /* bad argument from the caller */
    KILN_ERR_UNSUPPORTED, /* valid input that kiln does not handle (yet) */
    KILN_ERR_NOT_FOUND,   /* missing key or tensor */
    KILN_ERR_RANGE,       /* a value out of its allowed range (token id, type id) */
} kiln_status;

const char *kiln_status_name(kiln_status s);
/* The message of the last failure on this thread ("" if none). */
const char *kiln_last_error(void);
/* Sets this thread's last-error message (printf-style, one line) and returns s, so code built on kiln (its CLI's
 * launcher and plot) reports failures the way the library does: `return kiln_fail(KILN_ERR_IO, "%s: ...", path)`. */
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
kiln_status kiln_fail(kiln_status s, const char *fmt, ...);

/* ---------------------------------------------------------------- progress and devices
 * One progress-callback shape for every long call (quantize, tokenizer training, data shards, training,
 * perplexity): the stage, the units done of the total (tensors, merges, bytes, steps, windows), the item being
 * worked on, the stage's headline number so far and, for training, the step's full report. The callback runs on
 * the calling thread. */
struct kiln_train_progress;
typedef struct kiln_progress {
    const char *stage;     /* "quantize", "tokenizer", "data", "train", "eval", "paused", "resumed", "perplexity" (static) */
    int64_t done, total;   /* total 0 when unknown */
    const char *item;      /* what comes next, as the input names it (quantize: the tensor; unescaped); or NULL */
    double metric;         /* loss for train/eval, perplexity for perplexity; NaN when the stage has none */
    const struct kiln_train_progress *train; /* train and eval: the step's report; NULL otherwise */
} kiln_progress;
typedef void (*kiln_progress_fn)(void *user, const kiln_progress *p);

/* Where a session runs or a model trains: the CPU, or CUDA device `index` (0 is the first). */
typedef enum kiln_device_kind { KILN_DEVICE_CPU = 0, KILN_DEVICE_CUDA = 1 } kiln_device_kind;
typedef struct kiln_device {
    kiln_device_kind kind;
    int index;
} kiln_device;
/* Usable CUDA devices: 0 when built without CUDA, without a driver, or without a GPU. */
int kiln_cuda_device_count(void);

/* ---------------------------------------------------------------- types
 * Tensor element types. The ids are GGML's and reach disk: append only, never renumber. */

typedef enum kiln_type {
    KILN_TYPE_F32 = 0,
    KILN_TYPE_F16 = 1,
    KILN_TYPE_Q4_0 = 2,
    KILN_TYPE_Q4_1 = 3,
    /* 4 and 5 were Q4_2 and Q4_3, removed from GGML */
    KILN_TYPE_Q5_0 = 6,
    KILN_TYPE_Q5_1 = 7,
    KILN_TYPE_Q8_0 = 8,
    KILN_TYPE_Q8_1 = 9,
    KILN_TYPE_Q2_K = 10,
    KILN_TYPE_Q3_K = 11,
    KILN_TYPE_Q4_K = 12,
    KILN_TYPE_Q5_K = 13,
    KILN_TYPE_Q6_K = 14,
    KILN_TYPE_Q8_K = 15,
    KILN_TYPE_IQ2_XXS = 16,
    KILN_TYPE_IQ2_XS = 17,
    KILN_TYPE_IQ3_XXS = 18,
    KILN_TYPE_IQ1_S = 19,
    KILN_TYPE_IQ4_NL = 20,
    KILN_TYPE_IQ3_S = 21,
    KILN_TYPE_IQ2_S = 22,
    KILN_TYPE_IQ4_XS = 23,
    KILN_TYPE_I8 = 24,
    KILN_TYPE_I16 = 25,
    KILN_TYPE_I32 = 26,
    KILN_TYPE_I64 = 27,
    KILN_TYPE_F64 = 28,
    KILN_TYPE_IQ1_M = 29,
    KILN_TYPE_BF16 = 30,
    /* 31..33 were the Q4_0_4_4/4_8/8_8 repacks, removed from GGML */
    KILN_TYPE_TQ1_0 = 34,
    KILN_TYPE_TQ2_0 = 35,
    /* 36..38 were IQ4_NL_4_4/4_8/8_8, removed */
    KILN_TYPE_MXFP4 = 39,
    KILN_TYPE_NVFP4 = 40,
    KILN_TYPE_Q1_0 = 41,
    KILN_TYPE_COUNT = 42,
} kiln_type;

/* Layout facts for any type GGUF files may hold (computable or not). */
const char *kiln_type_name(kiln_type t);          /* "q4_K"; NULL if the id is unknown */
bool kiln_type_known(uint32_t t);                 /* id names a layout kiln can size */
int64_t kiln_type_block_size(kiln_type t);        /* elements per block */
size_t kiln_type_block_bytes(kiln_type t);        /* bytes per block */
/* Bytes of a row of n elements; 0 and KILN_ERR_* via last error if n is not a whole number of blocks. */
size_t kiln_type_row_bytes(kiln_type t, int64_t n);
/* Parses a name as written by kiln_type_name, case-insensitive. Returns KILN_ERR_NOT_FOUND if unknown. */
kiln_status kiln_type_from_name(const char *name, kiln_type *out);

/* ---------------------------------------------------------------- GGUF reading
 * GGUF v3 (and v2) files are mmap'd. Every pointer handed out points into the mapping and lives as long
 * as the kiln_gguf. Validation is strict: any structural defect is a KILN_ERR_FORMAT with a message
 * "FILE: <what> at byte <offset>: <why>". */

typedef enum kiln_gguf_vtype {
    KILN_GGUF_UINT8 = 0,
    KILN_GGUF_INT8 = 1,
    KILN_GGUF_UINT16 = 2,
    KILN_GGUF_INT16 = 3,
    KILN_GGUF_UINT32 = 4,
    KILN_GGUF_INT32 = 5,
    KILN_GGUF_FLOAT32 = 6,
    KILN_GGUF_BOOL = 7,
    KILN_GGUF_STRING = 8,
    KILN_GGUF_ARRAY = 9,
    KILN_GGUF_UINT64 = 10,
    KILN_GGUF_INT64 = 11,
    KILN_GGUF_FLOAT64 = 12,
    KILN_GGUF_VTYPE_COUNT = 13,
} kiln_gguf_vtype;

typedef struct kiln_str {
    const char *ptr; /* not NUL-terminated: points into the file */
    uint64_t len;
} kiln_str;

/* A metadata value. Scalars are decoded; strings point into the file; arrays keep a pointer to their
 * packed elements (fixed-size element types) or an array of decoded items (strings, nested arrays). */
typedef struct kiln_gguf_value {
    kiln_gguf_vtype type;
    union {
        uint64_t u64; /* UINT8..UINT64, BOOL (0/1) */
        int64_t i64;  /* INT8..INT64 */
        double f64;   /* FLOAT32, FLOAT64 */
        kiln_str str;
        struct {
            kiln_gguf_vtype type;                /* element type */
            uint64_t n;                          /* element count */
            const uint8_t *data;                 /* packed little-endian elements (fixed-size types) */
            const struct kiln_gguf_value *items; /* decoded elements (STRING and ARRAY elements) */
        } arr;
    };
} kiln_gguf_value;

typedef struct kiln_gguf_kv {
    const char *key; /* NUL-terminated copy */
    uint64_t offset; /* byte offset of the key in the file, for messages */
    kiln_gguf_value value;
} kiln_gguf_kv;

typedef struct kiln_tensor_view {
    const char *name; /* NUL-terminated copy */
    kiln_type type;
    int n_dims;
    int64_t ne[4];   /* elements per dimension, ne[0] fastest (row length); unused dims are 1 */
    size_t nb[4];    /* strides in bytes; nb[0] is the block size in bytes */
    uint64_t offset; /* byte offset of the data from the start of the data section (kiln_gguf_data_offset), as the file stores it */
    size_t nbytes;
    const void *data; /* into the mmap */
} kiln_tensor_view;

typedef struct kiln_gguf kiln_gguf;

kiln_status kiln_gguf_open(const char *path, kiln_gguf **out);
/* Parses a GGUF image already in memory (used by the fuzzer and tests). name is used in messages.
 * The buffer must outlive the handle. */
kiln_status kiln_gguf_open_memory(const void *data, size_t size, const char *name, kiln_gguf **out);
void kiln_gguf_close(kiln_gguf *g); /* accepts NULL */

uint32_t kiln_gguf_version(const kiln_gguf *g);
size_t kiln_gguf_alignment(const kiln_gguf *g);
uint64_t kiln_gguf_file_size(const kiln_gguf *g);
uint64_t kiln_gguf_data_offset(const kiln_gguf *g); /* start of the tensor data section */
const char *kiln_gguf_path(const kiln_gguf *g);

int64_t kiln_gguf_n_kv(const kiln_gguf *g);
const kiln_gguf_kv *kiln_gguf_kv_at(const kiln_gguf *g, int64_t i);
const kiln_gguf_value *kiln_gguf_find(const kiln_gguf *g, const char *key); /* NULL if absent */

int64_t kiln_gguf_n_tensors(const kiln_gguf *g);
const kiln_tensor_view *kiln_gguf_tensor_at(const kiln_gguf *g, int64_t i);
const kiln_tensor_view *kiln_gguf_find_tensor(const kiln_gguf *g, const char *name); /* NULL if absent */

/* Typed getters. A missing key is KILN_ERR_NOT_FOUND, a value of another type KILN_ERR_FORMAT; both name the key.
 * Integer getters accept any integer type whose value fits. */
kiln_status kiln_gguf_get_u64(const kiln_gguf *g, const char *key, uint64_t *out);
kiln_status kiln_gguf_get_i64(const kiln_gguf *g, const char *key, int64_t *out);
kiln_status kiln_gguf_get_u32(const kiln_gguf *g, const char *key, uint32_t *out);
kiln_status kiln_gguf_get_f32(const kiln_gguf *g, const char *key, float *out);
kiln_status kiln_gguf_get_bool(const kiln_gguf *g, const char *key, bool *out);
kiln_status kiln_gguf_get_str(const kiln_gguf *g, const char *key, kiln_str *out);
kiln_status kiln_gguf_get_arr(const kiln_gguf *g, const char *key, kiln_gguf_vtype elem, const kiln_gguf_value **out);

/* Element i of a fixed-size array value, decoded. */
uint64_t kiln_gguf_arr_u64(const kiln_gguf_value *arr, uint64_t i);
int64_t kiln_gguf_arr_i64(const kiln_gguf_value *arr, uint64_t i);
double kiln_gguf_arr_f64(const kiln_gguf_value *arr, uint64_t i);
size_t kiln_gguf_vtype_size(kiln_gguf_vtype t); /* bytes of a fixed-size scalar; 0 for STRING/ARRAY */
const char *kiln_gguf_vtype_name(kiln_gguf_vtype t);

/* ---------------------------------------------------------------- GGUF writing
 * Build metadata and a tensor list, then write. The file is written to PATH.tmp.<pid>, fsync'd, and renamed
 * over PATH, so a killed write never leaves a truncated PATH. Keys and tensor names are copied. */

typedef struct kiln_gguf_writer kiln_gguf_writer;

kiln_status kiln_gguf_writer_new(kiln_gguf_writer **out);
void kiln_gguf_writer_free(kiln_gguf_writer *w); /* accepts NULL; removes an unfinished temp file */

kiln_status kiln_gguf_writer_set_alignment(kiln_gguf_writer *w, size_t alignment); /* power of two; also writes general.alignment */
/* Sets a scalar or string. A key set twice keeps its place and takes the new value. */
kiln_status kiln_gguf_writer_set(kiln_gguf_writer *w, const char *key, const kiln_gguf_value *v);
kiln_status kiln_gguf_writer_set_u32(kiln_gguf_writer *w, const char *key, uint32_t v);
kiln_status kiln_gguf_writer_set_i32(kiln_gguf_writer *w, const char *key, int32_t v);
kiln_status kiln_gguf_writer_set_u64(kiln_gguf_writer *w, const char *key, uint64_t v);
kiln_status kiln_gguf_writer_set_f32(kiln_gguf_writer *w, const char *key, float v);
kiln_status kiln_gguf_writer_set_bool(kiln_gguf_writer *w, const char *key, bool v);
kiln_status kiln_gguf_writer_set_str(kiln_gguf_writer *w, const char *key, const char *s);
/* Arrays of fixed-size elements: n packed little-endian elements of type elem. */
kiln_status kiln_gguf_writer_set_arr(kiln_gguf_writer *w, const char *key, kiln_gguf_vtype elem, const void *data, uint64_t n);
kiln_status kiln_gguf_writer_set_arr_str(kiln_gguf_writer *w, const char *key, const char *const *strs, uint64_t n);
/* Copies every key of a reader, optionally skipping keys for which skip(key) is true. */
kiln_status kiln_gguf_writer_copy_kv(kiln_gguf_writer *w, const kiln_gguf *g, bool (*skip)(const char *key));

/* Adds a tensor. data may be NULL when it will be streamed with kiln_gguf_writer_write_tensor. ne has n_dims entries. */
kiln_status kiln_gguf_writer_add_tensor(kiln_gguf_writer *w, const char *name, kiln_type type, int n_dims, const int64_t *ne, const void *data);

/* One-shot: every tensor must have data. */
kiln_status kiln_gguf_writer_write_file(kiln_gguf_writer *w, const char *path);
/* Streaming: begin writes the header to the temp file; then write each tensor's data in order; finish
 * pads, fsyncs and renames. */
kiln_status kiln_gguf_writer_begin(kiln_gguf_writer *w, const char *path);
kiln_status kiln_gguf_writer_write_tensor(kiln_gguf_writer *w, int64_t i, const void *data, size_t nbytes);
/* The same in consecutive parts (a tensor larger than the caller's buffer): tensor i is done, and the next may
 * begin, once its parts add up to its size. */
kiln_status kiln_gguf_writer_write_part(kiln_gguf_writer *w, int64_t i, const void *data, size_t nbytes);
kiln_status kiln_gguf_writer_finish(kiln_gguf_writer *w);
/* The size of the file the writer would write now (header, metadata, tensors, padding), without writing. */
kiln_status kiln_gguf_writer_file_size(const kiln_gguf_writer *w, uint64_t *bytes);

/* ---------------------------------------------------------------- quantization */

/* The mixes kiln quantize offers, llama.cpp's file types (the ids are llama_ftype's and reach disk as
 * general.file_type): each tensor's type follows llama-quantize's rules for the mix (src/model/quantize.c). */
typedef enum kiln_ftype {
    KILN_FTYPE_ALL_F32 = 0,
    KILN_FTYPE_MOSTLY_F16 = 1,
    KILN_FTYPE_MOSTLY_Q4_0 = 2,
    KILN_FTYPE_MOSTLY_Q4_1 = 3,
    KILN_FTYPE_MOSTLY_Q8_0 = 7,
    KILN_FTYPE_MOSTLY_Q5_0 = 8,
    KILN_FTYPE_MOSTLY_Q5_1 = 9,
    KILN_FTYPE_MOSTLY_Q2_K = 10,
    KILN_FTYPE_MOSTLY_Q3_K_S = 11,
    KILN_FTYPE_MOSTLY_Q3_K_M = 12,
    KILN_FTYPE_MOSTLY_Q3_K_L = 13,
    KILN_FTYPE_MOSTLY_Q4_K_S = 14,
    KILN_FTYPE_MOSTLY_Q4_K_M = 15,
    KILN_FTYPE_MOSTLY_Q5_K_S = 16,
    KILN_FTYPE_MOSTLY_Q5_K_M = 17,
    KILN_FTYPE_MOSTLY_Q6_K = 18,
    KILN_FTYPE_MOSTLY_IQ4_NL = 25,
    KILN_FTYPE_MOSTLY_IQ4_XS = 30,
    KILN_FTYPE_MOSTLY_BF16 = 32,
} kiln_ftype;

typedef struct kiln_quantize_params {
    kiln_ftype ftype;
    int n_threads;                                  /* 0: all cores */
    kiln_progress_fn progress; /* stage "quantize", done/total in tensors, item the next tensor's name; or NULL */
    void *progress_ud;
} kiln_quantize_params;

/* Parses "q4_k_m" etc. into an ftype, case-insensitive; llama-quantize's aliases q3_k, q4_k and q5_k are the _M mixes. */
kiln_status kiln_ftype_from_name(const char *name, kiln_ftype *out);
const char *kiln_ftype_name(kiln_ftype f);
/* The names kiln_ftype_from_name takes, space-separated ("f32 f16 ... iq4_xs"), for usage lines. */
const char *kiln_ftype_names(void);
/* Reads in_path, writes out_path with every eligible weight converted per the mix rules. A tensor whose conversion
 * kiln lacks (no quantizer for its new type yet) fails before anything is written. */
kiln_status kiln_quantize_file(const char *in_path, const char *out_path, const kiln_quantize_params *p);

/* What kiln quantize would do to one tensor. */
typedef struct kiln_quantize_tensor {
    const char *name;   /* as the input names it (unescaped) */
    kiln_type from, to; /* its type in the input and in the output */
    int n_dims;
    int64_t ne[4];
    uint64_t bytes;     /* its data in the output */
    bool convertible;   /* to == from, or kiln can dequantize from and quantize to: a real run gets past it */
} kiln_quantize_tensor;

/* A dry run of kiln_quantize_file: every tensor's type and the exact size of the file it would write. */
typedef struct kiln_quantize_plan {
    kiln_ftype ftype;
    int64_t n_tensors;
    kiln_quantize_tensor *tensors;      /* (n_tensors), in the input's order, which the output keeps */
    int64_t n_of_type[KILN_TYPE_COUNT]; /* output tensors per type */
    int64_t n_inconvertible;            /* tensors with convertible false */
    uint64_t file_bytes;                /* the output file: header, metadata, tensor data and padding */
    uint64_t in_file_bytes;
    uint64_t n_elements;                /* of every tensor */
    char *names_;                       /* owns the names */
} kiln_quantize_plan;

kiln_status kiln_quantize_plan_make(const char *in_path, kiln_ftype ftype, kiln_quantize_plan *out);
void kiln_quantize_plan_free(kiln_quantize_plan *p); /* accepts NULL and a zeroed plan */

/* Whether kiln can run a model whose weights are of type t (a dot product on the CPU); the load of any other type
 * fails, naming these and `kiln quantize`. */
bool kiln_type_runnable(kiln_type t);

/* ---------------------------------------------------------------- synthetic models
 * A llama-architecture (or qwen3) GGUF with random weights (normal, std 0.02, seeded) and full metadata, for demos,
 * tests and benchmarks on machines where real weights cannot be carried. Tensor names and shapes follow
 * llama.cpp's llama layout: token_embd, blk.N.{attn_norm,attn_q,attn_k,attn_v,attn_output,ffn_norm,
 * ffn_gate,ffn_up,ffn_down}, output_norm, output (absent when tied). */
typedef struct kiln_synth_params {
    int64_t n_vocab;   /* V (taken from the vocab file when vocab_path is set) */
    int64_t n_embd;    /* C */
    int64_t n_layer;   /* L */
    int64_t n_head;    /* NH */
    int64_t n_head_kv; /* NKV */
    int64_t n_ff;      /* F */
    int64_t n_ctx;     /* context length written to metadata */
    float rope_base;   /* llama.rope.freq_base */
    bool tied;         /* no output.weight: the head reuses token_embd */
    kiln_ftype ftype;  /* weight types, with kiln quantize's rules (f32, f16, bf16, q8_0, q4_0, q4_k_m, ...) */
    const char *vocab_path; /* a GGUF whose tokenizer.ggml.* keys are copied in; NULL for none */
    uint64_t seed;     /* row r of tensor i draws from a stream seeded by (seed, i, r): any thread count, same file */
    int n_threads;     /* 0: all cores */
    bool fast;         /* block-format tensors get random block bytes with fixed scales (std near 0.02) instead of
                        * quantized normals: seconds instead of minutes for 7B, for speed measurements */
    bool qk_norm;      /* a qwen3-architecture file instead: llama's tensors plus blk.N.attn_{q,k}_norm (HS, ones),
                        * qwen3.* keys (NeoX RoPE, eps 1e-6), as Qwen3's dense models */
} kiln_synth_params;

/* Defaults: V 4096, C 256, L 8, NH 8, NKV 4, F 768, ctx 2048, rope base 10000, untied, F32, seed 1. */
kiln_synth_params kiln_synth_default(void);
/* Sets the dimensions of a standard shape: llama-124m, tinyllama-1.1b, llama2-7b, llama3-8b. */
kiln_status kiln_synth_shape(const char *name, kiln_synth_params *p);
kiln_status kiln_synth_llama(const char *path, const kiln_synth_params *p);

/* ---------------------------------------------------------------- conversion
 * A llama2.c checkpoint (the legacy float32 .bin or export version 1, "ak42") and its tokenizer.bin into a
 * llama-architecture F32 GGUF with the tokenizer inside. The header is checked (positive dimensions, whole
 * heads, the file size it implies); see src/model/convert_llama2c.c for both layouts. */
kiln_status kiln_convert_llama2c(const char *model_path, const char *tokenizer_path, const char *out_path);

/* A Hugging Face checkpoint folder (config.json, model.safetensors or its sharded index, tokenizer.json or
 * tokenizer.model, tokenizer_config.json) into a GGUF that kiln and llama.cpp run, with llama.cpp's
 * convert_hf_to_gguf.py keys, tensor names and transforms: Llama, Mistral, Qwen2, Qwen3, Gemma2, Gemma3, Phi3,
 * SmolLM3 and Olmo2 (ForCausalLM); any other architecture is KILN_ERR_UNSUPPORTED naming it. Safetensors F32, F16
 * and BF16 are read, every offset checked against its file. ftype F32, F16 (the default, as llama.cpp) or BF16
 * converts 2-D weights to it (1-D stay F32); for a quantized mix, convert to F32 and kiln_quantize_file the result
 * (another ftype is KILN_ERR_UNSUPPORTED). The write is atomic (see kiln_gguf_writer). See src/model/convert_hf.c. */
typedef struct kiln_convert_hf_params {
    kiln_ftype ftype; /* KILN_FTYPE_ALL_F32, _MOSTLY_F16 or _MOSTLY_BF16 */
} kiln_convert_hf_params;
kiln_status kiln_convert_hf(const char *dir, const char *out_path, const kiln_convert_hf_params *p); /* p NULL: F16 */

/* ---------------------------------------------------------------- tokenizers
 * Loaded from GGUF metadata (tokenizer.ggml.*) or a llama2.c tokenizer.bin. Three families, chosen by
 * tokenizer.ggml.model: "llama" (SentencePiece-style, score-driven merges, byte fallback), "gpt2"
 * (byte-level BPE with merge ranks and the pre-tokenizer named by tokenizer.ggml.pre) and "bert"
 * (WordPiece). Token ids reproduce llama.cpp's tokenizers exactly (tests/test_tokenizer.c). */

typedef struct kiln_tokenizer kiln_tokenizer;

/* Token types as GGUF stores them in tokenizer.ggml.token_type. */
typedef enum kiln_token_type {
    KILN_TOKEN_UNDEFINED = 0,
    KILN_TOKEN_NORMAL = 1,
    KILN_TOKEN_UNKNOWN = 2,
    KILN_TOKEN_CONTROL = 3,
    KILN_TOKEN_USER_DEFINED = 4,
    KILN_TOKEN_UNUSED = 5,
    KILN_TOKEN_BYTE = 6,
} kiln_token_type;

/* A growable list of token ids; zero-initialize, append with the encoders, free with kiln_tokens_free. */
typedef struct kiln_tokens {
    int32_t *ids;
    size_t n, cap;
} kiln_tokens;
void kiln_tokens_free(kiln_tokens *t);

kiln_status kiln_tokenizer_load_gguf(const kiln_gguf *g, kiln_tokenizer **out);
/* A GGUF file (model or vocab-only) or a llama2.c tokenizer.bin, told apart by the GGUF magic. */
kiln_status kiln_tokenizer_load_file(const char *path, kiln_tokenizer **out);
void kiln_tokenizer_free(kiln_tokenizer *t); /* accepts NULL */

int32_t kiln_tokenizer_n_vocab(const kiln_tokenizer *t);
const char *kiln_tokenizer_model(const kiln_tokenizer *t); /* "llama", "gpt2", "bert" */
int32_t kiln_tokenizer_bos(const kiln_tokenizer *t);       /* -1 when the vocab has none */
int32_t kiln_tokenizer_eos(const kiln_tokenizer *t);
kiln_token_type kiln_tokenizer_token_type(const kiln_tokenizer *t, int32_t id);
/* The stored text of a token (for SPM with the ▁, for BPE in the byte-to-unicode alphabet). */
kiln_str kiln_tokenizer_token_text(const kiln_tokenizer *t, int32_t id);

/* Appends the ids of text[0..len) to out. add_special adds BOS/EOS as the vocab's metadata says;
 * parse_special matches control and user-defined token texts inside the text (otherwise they are plain text).
 * Invalid UTF-8 is handled as the family's reference does (byte fallback), never a crash. */
kiln_status kiln_tokenizer_encode(const kiln_tokenizer *t, const char *text, size_t len, bool add_special,
                                  bool parse_special, kiln_tokens *out);
/* Appends the bytes of token id to buf (cap bytes); *n gets the length needed. An id outside the vocab is
 * KILN_ERR_RANGE naming the id and the vocab size. Control tokens decode to nothing unless special is true. */
kiln_status kiln_tokenizer_piece(const kiln_tokenizer *t, int32_t id, bool special, char *buf, size_t cap, size_t *n);
/* Decodes a whole sequence into a malloc'd buffer (NUL-terminated, *len excludes the NUL). SPM removes
 * the dummy-prefix space after BOS/at the start as llama.cpp does when skip_leading_space is true. */
kiln_status kiln_tokenizer_decode(const kiln_tokenizer *t, const int32_t *ids, size_t n, bool special, char **text, size_t *len);

/* Encodes a whole file in bounded memory. The file is read in chunks of about 1 MiB and cut only where the
 * family guarantees the ids of encoding the whole text at once (src/tok/stream.c says where); emit gets the
 * ids in order and may stop the run by returning an error. */
typedef kiln_status (*kiln_tokens_emit_fn)(void *ud, const int32_t *ids, size_t n);
kiln_status kiln_tokenizer_encode_file(const kiln_tokenizer *t, const char *path, bool add_special, bool parse_special,
                                       kiln_tokens_emit_fn emit, void *ud);

/* Byte-level BPE training: see src/tok/bpe_train.c. */
typedef struct kiln_bpe_train_params {
    int32_t vocab_size;          /* total, specials and the 256 byte tokens included */
    const char *const *specials; /* NULL: "<unk>", "<s>", "</s>", "<pad>" */
    int n_specials;
    int64_t min_frequency;       /* pairs seen fewer times are never merged (default 2) */
    int n_threads;               /* for counting; 0 = all cores. The result does not depend on it. */
    kiln_progress_fn progress;   /* stage "tokenizer", done/total in merges: every 100 merges and at the end; or NULL */
    void *progress_ud;
} kiln_bpe_train_params;
kiln_status kiln_bpe_train(const char *const *corpus_paths, int n_paths, const kiln_bpe_train_params *p, const char *out_path);

/* FNV-1a 64 over the model (family, tokenizer.ggml.model, pre-tokenizer name), every token's bytes and type
 * (and, for SentencePiece, whose merges follow the scores, its score) and every merge in rank order, strings
 * length-prefixed. Two tokenizers with the same vocabulary and merges have the same fingerprint; changing one
 * token, type or merge changes it. Token shards carry it (kiln_data_write), so training refuses another
 * tokenizer's shards. */
uint64_t kiln_tokenizer_fingerprint(const kiln_tokenizer *tok);

/* ---------------------------------------------------------------- training data
 * Token shards for training, what `kiln data` writes: DIR/train_000.bin, ..., DIR/val_000.bin, each a 64-byte
 * header (magic "KSHD", version, the tokenizer's fingerprint, token count, bytes per token, vocab size) and the
 * tokens as uint16 (or uint32 for vocabularies over 65536), and last DIR/manifest.txt listing every shard with its
 * token count, size and hash and the tokenizer's fingerprint; src/train/data.h has both layouts. Training reads a
 * folder only through its manifest: one without it, or with a listed shard missing or changed, or a shard file it
 * does not list, is refused naming the file. */
typedef struct kiln_data_params {
    double val_fraction;       /* of each document's tokens, its last ones, for the val split; [0, 1), 0: none */
    int64_t shard_tokens;      /* tokens per shard at most; 0: 100M */
    kiln_progress_fn progress; /* stage "data": done/total in corpus bytes, after each corpus file; may be NULL */
    void *progress_ud;
} kiln_data_params;

typedef struct kiln_data_stats {
    int64_t n_train_tokens, n_val_tokens;
    int n_train_shards, n_val_shards;
    int64_t n_bytes_in; /* corpus bytes read */
} kiln_data_stats;

kiln_data_params kiln_data_default(void); /* val_fraction 0.05, shard_tokens 0 (100M), no progress */
/* Loads the tokenizer of a GGUF file (a vocab from kiln tokenizer train, or a model) through the check kiln train
 * applies to its -t, so that kiln data never writes shards training then refuses: a directory, FIFO or other
 * non-regular file is KILN_ERR_IO, a file that is not GGUF (a llama2.c tokenizer.bin) KILN_ERR_UNSUPPORTED, both
 * naming the file and saying why. */
kiln_status kiln_data_tokenizer_load(const char *path, kiln_tokenizer **out);
/* Tokenizes the corpora (streaming, each file its own document, encoded as kiln_tokenizer_encode with
 * add_special on and parse_special off: BOS/EOS as the tokenizer adds them, "<s>" in the text stays text) and
 * writes shards to out_dir (created if missing). The last n_val = max(1, floor(n * val_fraction)) of a
 * document's n tokens go to the validation split (none when val_fraction is 0), the rest to train, in corpus
 * order. Invalid UTF-8 in a corpus is an error naming the file and byte offset, a corpus that is not a regular
 * file (a directory, a FIFO) one naming what it is; every corpus is checked before out_dir is touched. Shards are written atomically; shards of the
 * same split left by an earlier run with more of them are removed. The old manifest is removed first and the new
 * one written last (temp file, fsync, rename), so a run that fails or is stopped leaves a folder training refuses.
 * p NULL: kiln_data_default().
 * stats (may be NULL) gets the counts. */
kiln_status kiln_data_write(const char *const *corpora, int n_corpora, const kiln_tokenizer *tok, const char *out_dir,
                            const kiln_data_params *p, kiln_data_stats *stats);

/* ---------------------------------------------------------------- models
 * A llama-architecture GGUF (LLaMA 1/2/3, TinyLlama, SmolLM, Mistral). Loading checks every required key
 * (an absent one is KILN_ERR_NOT_FOUND naming it) and every weight's type and shape. Weights stay mmap'd. */
typedef struct kiln_model kiln_model;

kiln_status kiln_model_load(const char *path, kiln_model **out);
void kiln_model_free(kiln_model *m); /* accepts NULL */
const kiln_tokenizer *kiln_model_tokenizer(const kiln_model *m); /* NULL when the file has none */
int64_t kiln_model_n_vocab(const kiln_model *m);
int64_t kiln_model_n_ctx_train(const kiln_model *m);

/* What a loaded model is: its architecture and sizes, as the loader read and checked them. */
typedef struct kiln_model_info {
    const char *arch;    /* general.architecture ("llama", "gemma3", ...): a static string */
    int64_t n_vocab;     /* V */
    int64_t n_embd;      /* C */
    int64_t n_layer;     /* L */
    int64_t n_head;      /* NH */
    int64_t n_head_kv;   /* NKV */
    int64_t head_dim;    /* HS */
    int64_t n_ff;        /* F */
    int64_t n_ctx_train; /* the training context */
    int64_t n_params;    /* elements of every weight tensor of the file */
    bool tied;           /* no output.weight: the head reuses token_embd */
} kiln_model_info;
void kiln_model_get_info(const kiln_model *m, kiln_model_info *out);
/* The GGUF the model's weights are mapped from: its tensors (names, types, shapes) and metadata, for as long as
 * the model is loaded. */
const kiln_gguf *kiln_model_gguf(const kiln_model *m);

/* RoPE scaling as the file sets it (<arch>.rope.scaling.*, rope_freqs.weight, rope_factors_{long,short}.weight:
 * linear, YaRN, Llama 3's frequency factors, Phi-3's LongRoPE), overridden field by field as llama.cpp's context
 * parameters override the model's (--rope-scaling, --rope-scale, --rope-freq-base, --rope-freq-scale,
 * --yarn-orig-ctx, --yarn-ext-factor, --yarn-attn-factor, --yarn-beta-slow, --yarn-beta-fast). Call
 * kiln_model_set_rope after kiln_model_load and before any session or trainer is made from the model; it recomputes
 * every layer's RoPE table. A value outside its domain is KILN_ERR_INVALID naming the field, and leaves m as it was. */
typedef enum kiln_rope_scaling_type {
    KILN_ROPE_SCALING_UNSET = 0, /* the file's */
    KILN_ROPE_SCALING_NONE,      /* no scaling: freq_scale 1 (the file's frequency factors still apply, as llama.cpp) */
    KILN_ROPE_SCALING_LINEAR,
    KILN_ROPE_SCALING_YARN,
} kiln_rope_scaling_type;
typedef struct kiln_rope_overrides {
    kiln_rope_scaling_type type;
    float freq_base;        /* 0: the file's rope.freq_base (the global layers') */
    float freq_scale;       /* 0: the file's 1 / rope.scaling.factor */
    int64_t yarn_orig_ctx;  /* 0: the file's rope.scaling.original_context_length */
    float yarn_ext_factor;  /* negative: the file's (yarn: 1) */
    float yarn_attn_factor; /* negative: the file's (1) */
    float yarn_beta_slow;   /* negative: the file's (1) */
    float yarn_beta_fast;   /* negative: the file's (32) */
} kiln_rope_overrides;
/* Every field unset. */
kiln_rope_overrides kiln_rope_overrides_default(void);
kiln_status kiln_model_set_rope(kiln_model *m, const kiln_rope_overrides *ov);

/* ---------------------------------------------------------------- sessions
 * A session runs a model over a growing sequence: it owns the KV cache (f16, sized from n_ctx) and scratch
 * proportional to the prefill chunk. Token ids are validated here: an id outside the vocab is KILN_ERR_RANGE
 * naming the id and the vocab size; going past n_ctx is KILN_ERR_RANGE naming both. Logits that hold a NaN or an
 * infinity (weights or metadata that make one) are KILN_ERR_RANGE naming the position, on the CPU and the GPU, for
 * kiln_session_eval's logits and kiln_session_eval_argmax's row alike. The session keeps the ids at its positions
 * (kiln_session_tokens), so a caller can keep the cache up to the first token that changes (kiln_session_keep). */
typedef struct kiln_session kiln_session;

/* The element type of the KV cache, llama.cpp's -ctk/-ctv: f16 (the default, zero), f32, bf16, q8_0, q4_0 (blocks of
 * 32 along each cached row, as the GGUF block formats). The cache holds K and V rows of NKV*HS elements; the block
 * types need NKV*HS to be a multiple of 32 (else the session is KILN_ERR_UNSUPPORTED, naming the width). */
typedef enum kiln_kv_type {
    KILN_KV_F16 = 0,
    KILN_KV_F32 = 1,
    KILN_KV_BF16 = 2,
    KILN_KV_Q8_0 = 3,
    KILN_KV_Q4_0 = 4,
} kiln_kv_type;
#define KILN_KV_TYPE_COUNT 5
const char *kiln_kv_type_name(kiln_kv_type t); /* "f16", "f32", "bf16", "q8_0", "q4_0"; NULL if unknown */
/* llama.cpp's names for -ctk/-ctv; anything else is KILN_ERR_INVALID listing them */
kiln_status kiln_kv_type_from_name(const char *name, kiln_kv_type *out);
size_t kiln_kv_row_bytes(kiln_kv_type t, int64_t n); /* bytes of one cached row of n elements */

typedef struct kiln_session_params {
    int64_t n_ctx;   /* 0: the model's training context */
    int64_t n_batch; /* prefill chunk in tokens; 0: 512 */
    int n_threads;   /* 0: all cores */
    int n_gpu_layers; /* llama.cpp's -ngl. 0: the CPU. At least the layer count (-ngl 99): the whole model on CUDA
                       * device 0 (src/cuda/engine.cu). Between: KILN_ERR_UNSUPPORTED, as kiln offloads all or none.
                       * KILN_ERR_UNSUPPORTED without a GPU, KILN_ERR_NOMEM when weights and cache exceed its free memory */
    kiln_device device; /* KILN_DEVICE_CUDA: the whole model on device `index`, as n_gpu_layers >= the layer count
                         * (an index the machine lacks: KILN_ERR_INVALID naming it; sessions on several devices may
                         * run from one thread). KILN_DEVICE_CPU (zero): as n_gpu_layers says */
    kiln_kv_type type_k, type_v; /* the cache's element types (-ctk, -ctv); zero: f16 */
    bool check_finite;  /* also check the embedding and every layer's output for a NaN or an infinity, and name the first
                         * that holds one (a debugging aid: one more pass over the activations per layer). The environment
                         * variable KILN_CHECK_FINITE=1 turns it on for every session */
} kiln_session_params;

kiln_status kiln_session_new(const kiln_model *m, const kiln_session_params *p, kiln_session **out);
void kiln_session_free(kiln_session *s); /* accepts NULL */
/* Appends n tokens at the next positions (prefill in chunks of n_batch). logits, when not NULL, receives the
 * last token's V logits; all_logits, when not NULL, receives n x V logits (row per token). On an error the position
 * stays after the last chunk that succeeded. */
kiln_status kiln_session_eval(kiln_session *s, const int32_t *ids, size_t n, float *logits, float *all_logits);
/* As kiln_session_eval, but returns only the last token's argmax in *next (greedy decode): on the GPU the logits
 * never leave the device. */
kiln_status kiln_session_eval_argmax(kiln_session *s, const int32_t *ids, size_t n, int32_t *next);
int64_t kiln_session_pos(const kiln_session *s);
bool kiln_session_on_gpu(const kiln_session *s);
size_t kiln_session_device_bytes(const kiln_session *s); /* GPU memory the session holds; 0 on the CPU */
void kiln_session_reset(kiln_session *s); /* back to position 0 */
int64_t kiln_session_n_ctx(const kiln_session *s); /* positions the cache holds */
/* The ids at positions 0 .. kiln_session_pos - 1, in the session's memory (valid until the next eval or free). */
const int32_t *kiln_session_tokens(const kiln_session *s);
/* Keeps the first n positions (the cache and the history up to them) and drops the rest, so the next eval appends
 * at n. Returns the positions kept: n (at most the current position), or 0 where a sliding-window layer's ring has
 * already overwritten positions the next query at n would read. */
int64_t kiln_session_keep(kiln_session *s, int64_t n);
/* Tokens run through the model since the session was made (every eval's, a re-evaluated one counted again). */
int64_t kiln_session_n_evaluated(const kiln_session *s);

/* ---------------------------------------------------------------- contexts: many sequences, one forward
 * A context holds a model on a backend (its weights bound once) and n_seq sequences, each with its own KV cache of
 * n_ctx positions and its own history. kiln_context_decode runs a batch, a list of (sequence, position, token)
 * entries, through one forward: the matmuls read the weights once for all the batch's tokens and attention runs
 * over each token's own sequence. A server's slots are a context's sequences; a session is a context of one
 * sequence (kiln_session_context). Token ids, sequences and positions are validated as a session's are. */
typedef struct kiln_context kiln_context;

typedef struct kiln_context_params {
    kiln_session_params s; /* n_ctx: each sequence's positions; n_batch: the most entries one decode takes, over all
                            * sequences (0: 512); threads, device, cache types and checks as a session's */
    int32_t n_seq;         /* sequences; 0: 1 */
} kiln_context_params;

typedef struct kiln_batch_entry {
    int32_t seq;  /* 0 .. n_seq - 1 */
    int32_t id;   /* a token id of the vocab */
    int64_t pos;  /* the sequence's next position: its position plus the entries of the same sequence before this one */
    bool logits;  /* this entry's logits (and argmax) are wanted */
} kiln_batch_entry;

kiln_status kiln_context_new(const kiln_model *m, const kiln_context_params *p, kiln_context **out);
void kiln_context_free(kiln_context *c); /* accepts NULL */
int32_t kiln_context_n_seq(const kiln_context *c);
int64_t kiln_context_n_ctx(const kiln_context *c);   /* positions of each sequence */
int64_t kiln_context_n_batch(const kiln_context *c); /* the most entries of one decode */
bool kiln_context_on_gpu(const kiln_context *c);
size_t kiln_context_device_bytes(const kiln_context *c); /* GPU memory held; 0 on the CPU */
size_t kiln_context_kv_bytes(const kiln_context *c);     /* the KV caches of all sequences */
/* Runs n entries (1 <= n <= n_batch; sequences in any order and interleaved, each sequence's entries in position
 * order) through one forward. logits, when not NULL, gets (rows, V): a row per entry with .logits set, in batch order; next, when not
 * NULL, the argmax of each such row. Bad entries are KILN_ERR_RANGE / KILN_ERR_INVALID naming the entry, checked
 * before anything runs; on any error no sequence moves. */
kiln_status kiln_context_decode(kiln_context *c, const kiln_batch_entry *b, size_t n, float *logits, int32_t *next);
typedef struct kiln_sampler kiln_sampler; /* the sampler: kiln_sampler_new, below */
/* kiln_context_decode with each wanted row's token drawn by a sampler instead of its argmax: smp[k] for the k-th
 * entry with .logits, over that row and its sequence's ids up to and with the entry, as kiln_sampler_sample would
 * draw it (its settings, penalties, bans and RNG); next[k] gets it. On a GPU the samplers run there in the step and
 * only the tokens come back (the same draws up to float rounding at a cdf boundary); on the CPU, or where a penalty
 * window holds more than 256 distinct ids, each sampler draws on the host. logits, when not NULL, get the rows as
 * kiln_context_decode's do (before any penalty). The batch is checked first, as kiln_context_decode's. */
kiln_status kiln_context_decode_sample(kiln_context *c, const kiln_batch_entry *b, size_t n, kiln_sampler *const *smp, float *logits,
                                       int32_t *next);
int64_t kiln_context_seq_pos(const kiln_context *c, int32_t seq); /* -1 for a sequence outside 0 .. n_seq - 1 */
/* the ids at positions 0 .. pos - 1 (valid until the next decode, restore or free); NULL for a bad sequence */
const int32_t *kiln_context_seq_tokens(const kiln_context *c, int32_t seq);
/* As kiln_session_keep, for one sequence; -1 for a bad sequence. */
int64_t kiln_context_seq_keep(kiln_context *c, int32_t seq, int64_t n);
/* dst's first n positions (cache rows and ids) become src's first n, and dst's position n: a prompt cached in another
 * sequence. n at most src's position; src == dst keeps n. Where a sliding layer's ring no longer holds the positions
 * the prefix needs (kiln_context_seq_keep would keep 0), nothing is copied: KILN_ERR_RANGE, dst as it was. */
kiln_status kiln_context_seq_copy(kiln_context *c, int32_t src, int32_t dst, int64_t n);
/* A sequence's state as a file: the model's fingerprint, the cache's shape and types, the ids and the cache rows of
 * its positions. Written to a temporary file and renamed, so a failed save leaves no partial file. restore checks
 * everything before it changes anything: a file of another model or shape is KILN_ERR_INVALID naming what differs,
 * and the sequence is then as it was. A restored sequence continues bit for bit as the saved one would have. */
kiln_status kiln_context_seq_save(const kiln_context *c, int32_t seq, const char *path);
kiln_status kiln_context_seq_restore(kiln_context *c, int32_t seq, const char *path, int64_t *n_tokens);
/* The context a session runs on (its sequence 0). */
kiln_context *kiln_session_context(kiln_session *s);

/* ---------------------------------------------------------------- sampling
 * The RNG is llama2.c's xorshift64* and top-p follows llama2.c's procedure (../shared/data/README.md), so a
 * seeded run reproduces llama2.c's output. temp 0 is greedy. top_k 0, top_p 1 and min_p 0 disable their filters;
 * top_p 0 keeps only the most likely token, as llama.cpp's top-p keeps at least one; repeat_penalty 1 disables the
 * penalty. */
typedef struct kiln_sampler_params {
    float temp;
    int32_t top_k;
    float top_p;     /* [0, 1] */
    float min_p;
    /* llama.cpp's penalties, applied first (before temp) to each distinct token that occurs count > 0 times among the
     * last repeat_last_n of the history: a positive logit divided by repeat_penalty (a negative one multiplied),
     * then count * frequency_penalty + presence_penalty subtracted */
    float repeat_penalty;    /* > 0; 1 disables it */
    int32_t repeat_last_n;   /* tokens the penalties look back over; 0 disables them, -1 the whole history */
    float presence_penalty;  /* 0 disables it */
    float frequency_penalty; /* 0 disables it */
    uint64_t seed;
} kiln_sampler_params;

/* kiln_sampler is declared with the contexts above (kiln_context_decode_sample takes samplers) */
kiln_sampler_params kiln_sampler_default(void); /* temp 0.8, top_k 40, top_p 0.95, min_p 0.05, penalties off, seed 42 */
kiln_status kiln_sampler_new(const kiln_sampler_params *p, int64_t n_vocab, kiln_sampler **out);
void kiln_sampler_free(kiln_sampler *s);
/* Ids s never draws (at most 4; ids outside the vocab, such as -1, are passed over; n 0 clears them): their logits
 * are -inf before the penalties in kiln_sampler_sample and kiln_sampler_probs, and in a session's sampled step on
 * the GPU (--ignore-eos's end tokens). KILN_ERR_INVALID for more than 4, nothing changed. */
kiln_status kiln_sampler_ban(kiln_sampler *s, const int32_t *ids, int n);
/* Picks a token from logits (modified in place); history is the sequence so far, for the repetition penalty. */
int32_t kiln_sampler_sample(kiln_sampler *s, float *logits, const int32_t *history, size_t n_history);
/* As kiln_session_eval, then *next = kiln_sampler_sample(smp, the last token's logits, the session's tokens): on the
 * GPU the sampler runs there and only the token comes back (the same draw up to float rounding at a cdf boundary);
 * on the CPU, or with a penalty window of more than 256 distinct tokens, the logits come back and smp picks. */
kiln_status kiln_session_eval_sample(kiln_session *s, const int32_t *ids, size_t n, kiln_sampler *smp, int32_t *next);
/* The distribution kiln_sampler_sample draws from, written over logits (V probabilities; temp 0: the argmax's
 * one-hot); one coin of the sampler's RNG in [0, 1), for a caller that draws with it (speculative.c); and a token
 * drawn with one coin from V non-negative weights (renormalized; a token of weight 0 is never drawn unless all are,
 * then token 0), as a drafter samples from its kiln_sampler_probs. */
void kiln_sampler_probs(kiln_sampler *s, float *logits, const int32_t *history, size_t n_history);
float kiln_sampler_coin(kiln_sampler *s);
int32_t kiln_sampler_draw(kiln_sampler *s, const float *probs);

/* ---------------------------------------------------------------- grammars (src/infer/grammar_parse.c, grammar*.c)
 * llama.cpp's GBNF: rules `name ::= alternatives`, literals "..." (escapes \n \r \t \\ \" \xHH \uHHHH \UHHHHHHHH),
 * classes [a-z] and [^...], "." for any character, groups ( ), repetitions * + ? {m} {m,} {m,n} {,n}, # comments;
 * a rule's alternatives end at a newline outside parentheses. A malformed grammar is KILN_ERR_FORMAT with the line
 * and column (or the rule) in the message: undefined or twice-defined rules, a missing root, left recursion. One whose
 * first step is too ambiguous (past 2^17 rule expansions or 4M stack entries) or nests past 1,024 rules is
 * KILN_ERR_INVALID; so is a later step of the matcher's (kiln_grammar_matcher_mask, _accept, _match_text). */
typedef struct kiln_grammar kiln_grammar;
/* root: the start rule, "root" when NULL. */
kiln_status kiln_grammar_parse(const char *text, size_t len, const char *root, kiln_grammar **out);
void kiln_grammar_free(kiln_grammar *g); /* accepts NULL */
int32_t kiln_grammar_n_rules(const kiln_grammar *g); /* with the rules groups and repetitions made */
/* Whether text[0..n) is a whole sentence of the grammar (*full) and whether it begins one (*prefix). */
kiln_status kiln_grammar_match_text(const kiln_grammar *g, const char *text, size_t n, bool *full, bool *prefix);

/* A grammar's state over generated tokens. mask sets the logits of the tokens the grammar does not allow next to
 * -INFINITY: a token is allowed when its bytes continue a sentence of the grammar (a code point split across
 * tokens is carried to the next), EOS only when the text so far is a whole sentence, control tokens never. When
 * no token is allowed it is KILN_ERR_INVALID. accept moves the state over the token picked (KILN_ERR_INVALID if
 * the grammar does not allow it). g and tok must outlive the matcher. */
typedef struct kiln_grammar_matcher kiln_grammar_matcher;
kiln_status kiln_grammar_matcher_new(const kiln_grammar *g, const kiln_tokenizer *tok, kiln_grammar_matcher **out);
/* The vocab's side (each token's bytes in a trie), built once and shared by the matchers of many requests (a server's);
 * it must outlive them. kiln_grammar_matcher_new builds one of its own. */
typedef struct kiln_grammar_vocab kiln_grammar_vocab;
kiln_status kiln_grammar_vocab_new(const kiln_tokenizer *tok, kiln_grammar_vocab **out);
void kiln_grammar_vocab_free(kiln_grammar_vocab *v); /* accepts NULL */
kiln_status kiln_grammar_matcher_new_vocab(const kiln_grammar *g, const kiln_grammar_vocab *v, kiln_grammar_matcher **out);
void kiln_grammar_matcher_free(kiln_grammar_matcher *m); /* accepts NULL */
kiln_status kiln_grammar_matcher_reset(kiln_grammar_matcher *m); /* back to the grammar's start */
kiln_status kiln_grammar_matcher_mask(kiln_grammar_matcher *m, float *logits);
kiln_status kiln_grammar_matcher_accept(kiln_grammar_matcher *m, int32_t token);
bool kiln_grammar_matcher_done(const kiln_grammar_matcher *m); /* the text so far is a whole sentence */
/* A mask is the union of its state's stacks' masks: those made (misses; one per mask while a code point is half
 * done) and those taken from the matcher's memory of earlier stacks (hits). */
void kiln_grammar_matcher_cache_stats(const kiln_grammar_matcher *m, int64_t *hits, int64_t *misses);

/* ---------------------------------------------------------------- speculative decoding (src/infer/speculative.c)
 * Prompt lookup: the tokens that followed the latest earlier occurrence of seq's last g tokens (g from ngram_max
 * down to ngram_min, the longest that occurs), at most max_draft, into draft; returns how many (0: none). */
size_t kiln_spec_lookup(const int32_t *seq, size_t n, int ngram_min, int ngram_max, size_t max_draft, int32_t *draft);
/* A draft model's k tokens into draft: feeds ids[0..n) (what the draft session ds has not seen yet; n >= 1), then
 * drafts one token at a time, each fed back but the last, so ds ends k - 1 + n positions on. smp NULL: greedy (ds's
 * argmax; q unused); else each is drawn from kiln_sampler_probs of ds's logits under smp's settings, whose k rows
 * (k x n_vocab) go into q for kiln_spec_accept_sample. After the target's verdict the caller cuts ds back to the
 * tokens taken (kiln_session_keep). */
kiln_status kiln_spec_draft(kiln_session *ds, kiln_sampler *smp, int64_t n_vocab, const int32_t *ids, size_t n, size_t k,
                            int32_t *draft, float *q);
/* Row-level acceptance, for a caller that runs the target's forward itself (a server's batch). rows: k + 1 rows of
 * n_vocab logits, row i the target's after t0 and draft[0..i). Returns taken + 1, the tokens in out (taken drafts,
 * then the target's own next token; out holds k + 1). Greedy: the drafts are taken while each is the row's argmax. */
size_t kiln_spec_accept_greedy(const float *rows, int64_t n_vocab, const int32_t *draft, size_t k, int32_t *out);
/* The same for sampling with smp's pipeline (no penalties: the history is not passed; rows are overwritten with the
 * target's probabilities). q: NULL for drafts certain under their drafter (prompt lookup), else k rows of the
 * drafter's probabilities (as kiln_sampler_probs gives them) that draft[i] was sampled from. Draft i is taken with
 * probability min(1, p/q), the first refused one replaced by a draw from max(0, p - q) renormalized, one more drawn
 * from p after the last taken: every emitted token is distributed as sampling without drafts. */
size_t kiln_spec_accept_sample(kiln_sampler *smp, float *rows, int64_t n_vocab, const float *q, const int32_t *draft,
                               size_t k, int32_t *out);
/* Session-level verification: evaluates t0 (the token the session feeds next) and draft[0..k) in one forward,
 * accepts as kiln_spec_accept_greedy / kiln_spec_accept_sample do (*n_out = taken + 1), and cuts the session back
 * so it keeps t0 and the taken drafts; out's last token is not evaluated yet, as a sampled token in plain decoding.
 * More drafts than the context's free positions: KILN_ERR_RANGE, nothing evaluated. */
kiln_status kiln_spec_verify_greedy(kiln_session *s, int64_t n_vocab, int32_t t0, const int32_t *draft, size_t k, int32_t *out,
                                    size_t *n_out);
kiln_status kiln_spec_verify_sample(kiln_session *s, kiln_sampler *smp, int64_t n_vocab, int32_t t0, const float *q,
                                    const int32_t *draft, size_t k, int32_t *out, size_t *n_out);

/* ---------------------------------------------------------------- JSON Schema (src/infer/json_schema.c)
 * A JSON Schema as GBNF whose root rule matches the JSON texts valid under it, for the subset docs/grammars.md lists
 * (type, properties, required, additionalProperties, items, prefixItems, minItems, maxItems, minLength, maxLength,
 * pattern, format date/time/uuid, integer minimum/maximum, enum, const, anyOf, oneOf, allOf of objects, $ref within
 * the document). Objects keep the schema's property order; whitespace and numbers' digits are bounded so sampling
 * ends. *gbnf is malloc'd and NUL-terminated, *n its length. Malformed JSON or a bad value is KILN_ERR_FORMAT, a
 * keyword that changes validity and is not handled (not, if, patternProperties, multipleOf, ...) KILN_ERR_UNSUPPORTED;
 * both name the JSON pointer. */
kiln_status kiln_json_schema_to_gbnf(const char *schema, size_t len, char **gbnf, size_t *n);

/* ---------------------------------------------------------------- chat
 * Chat templates for four families, recognized by distinctive substrings of tokenizer.chat_template (kiln has no
 * Jinja engine): llama2 ([INST] ... [/INST] with <<SYS>>), llama3 (<|start_header_id|> ... <|eot_id|>), chatml
 * (<|im_start|>role ... <|im_end|>: SmolLM, Qwen) and gemma (<start_of_turn> ... <end_of_turn>, the assistant
 * is 'model', a system message opens the first user turn). kiln_chat_format writes the text the family's Hugging
 * Face template renders, bos_token included (tests/ref/chat_*.txt are jinja2 renderings). kiln_chat_tokenize gives
 * its tokens with only the template's own markers as special tokens: what a user types is always plain text. */
typedef enum kiln_chat_family {
    KILN_CHAT_LLAMA2 = 0,
    KILN_CHAT_LLAMA3 = 1,
    KILN_CHAT_CHATML = 2,
    KILN_CHAT_GEMMA = 3,
} kiln_chat_family;

typedef struct kiln_chat_template {
    kiln_chat_family family;
    kiln_str bos; /* bos_token as the template writes it ("<s>", "<|begin_of_text|>", "<bos>"); len 0: none */
    kiln_str eos; /* eos_token, which closes a llama2 assistant turn ("</s>") */
    /* chatml: the system turn the template adds when the conversation has none (SmolLM2: "You are a helpful AI
     * assistant named SmolLM, ..."), unescaped from its string literal; "" when it adds none */
    char default_system[512];
    /* llama3 from 3.1 on: those templates always open with a system header, "Cutting Knowledge Date: December 2023\n
     * Today Date: DATE\n\n" + the system message. DATE is the template's literal default ("26 Jul 2024"), or today's
     * date ("%d %b %Y", local time) when it calls strftime_now, as transformers provides it. "" for Llama 3.0's
     * template, which has no such header (and for kiln_chat_template_from_name). The caller may overwrite it. */
    char date[32];
} kiln_chat_template;

typedef struct kiln_chat_msg {
    const char *role; /* "system", "user", "assistant" */
    const char *content;
} kiln_chat_msg;

/* The model's tokenizer.chat_template. Missing or of no known family: KILN_ERR_UNSUPPORTED, naming the
 * --chat-template NAME override. bos/eos come from the vocab and point into the model: keep it loaded. */
kiln_status kiln_chat_template_detect(const kiln_model *m, kiln_chat_template *out);
/* The same recognition on a template's source text; bos/eos get the family's usual texts. */
kiln_status kiln_chat_template_from_text(const char *text, size_t len, kiln_chat_template *out);
/* A family by name (llama2, llama3, chatml, gemma); m, when not NULL, supplies bos/eos from its vocab. */
kiln_status kiln_chat_template_from_name(const char *name, const kiln_model *m, kiln_chat_template *out);
const char *kiln_chat_family_name(kiln_chat_family f);
/* Formats n messages into a malloc'd NUL-terminated string (*len excludes the NUL). add_generation_prompt
 * appends the header that opens the assistant's turn (llama2 has none: its user turn ends with [/INST]).
 * llama2 and gemma need user/assistant turns alternating from a user turn (after an optional leading system
 * message), as their templates do: anything else is KILN_ERR_INVALID naming the message. */
kiln_status kiln_chat_format(const kiln_chat_template *t, const kiln_chat_msg *msgs, size_t n, bool add_generation_prompt,
                             char **out, size_t *len);
/* The token that ends an assistant turn, looked up in the vocab by its text: <|im_end|>, <|eot_id|>,
 * <end_of_turn>; EOS for llama2. KILN_ERR_NOT_FOUND when the vocab lacks it. */
kiln_status kiln_chat_end_of_turn(const kiln_chat_template *t, const kiln_tokenizer *tok, int32_t *id);
/* Appends the tokens of kiln_chat_format's text to out, tokenized as llama.cpp does with special tokens parsed, except
 * that only the markers the template wrote (bos, eos, <|im_start|>, <|eot_id|>, <start_of_turn>, ...) become special
 * tokens: a message's role and content are plain text, so a user who types "</s>" or "<|im_end|>" gets the ordinary
 * tokens of those characters, never the control token. */
kiln_status kiln_chat_tokenize(const kiln_chat_template *t, const kiln_tokenizer *tok, const kiln_chat_msg *msgs, size_t n,
                               bool add_generation_prompt, kiln_tokens *out);

/* What kiln_chat_eval did. */
typedef struct kiln_chat_eval_info {
    size_t n_dropped;         /* messages dropped after the system message to fit the context (0: none) */
    int64_t n_dropped_tokens; /* the tokens that saved */
    int64_t n_tokens;         /* the conversation's tokens, now the session's positions */
    int64_t n_kept;           /* of them, already in the KV cache (the prefix shared with the session's history) */
    int64_t n_eval;           /* evaluated by this call: n_tokens - n_kept */
    bool too_long;            /* the call failed because the last turn alone does not fit the context */
} kiln_chat_eval_info;

/* Brings session s to the conversation msgs[0..n) with the generation prompt, and leaves the last token's V logits in
 * logits. The cache is kept up to the first token that differs from the session's history (kiln_session_tokens), so
 * a turn costs its new tokens (and the last reply's, where its text tokenizes otherwise than it was generated).
 * When the conversation and reserve more tokens (room for the reply) exceed the context, the oldest turns after an
 * optional leading system message are dropped, whole turns (a user message and what follows it) at a time, and
 * info->n_dropped says how many messages went: the caller drops msgs[f .. f + n_dropped) from its own list (f is 1
 * with a system message, else 0), and the cache is re-evaluated from there. The last message is never dropped: when
 * it and the system message alone leave no position to reply in, KILN_ERR_RANGE names the sizes, nothing is dropped
 * and the session is as it was. */
kiln_status kiln_chat_eval(kiln_session *s, const kiln_chat_template *t, const kiln_tokenizer *tok, const kiln_chat_msg *msgs, size_t n,
                           int64_t reserve, float *logits, kiln_chat_eval_info *info);

/* ---------------------------------------------------------------- training
 * A llama model trained with AdamW (fp32, or 8-bit moments on the CPU) on B x T token batches, on the CPU or a CUDA
 * device: new from dimensions, fine-tuned from a GGUF (init_from) or resumed from a checkpoint. kiln_train_run is
 * the whole run behind `kiln train` (data shards written by kiln data, evaluation, JSONL log, checkpoints, export);
 * kiln_trainer steps a model from the caller's own token ids:
 *
 *     kiln_train_opts o = kiln_train_defaults();
 *     o.dims = (kiln_model_dims){.n_vocab = 512, .n_embd = 64, .n_layer = 2, .n_head = 4, .n_head_kv = 2, .n_ff = 128};
 *     o.B = 4, o.T = 64, o.steps = 10;        the schedule spans o.steps
 *     kiln_trainer *t;
 *     kiln_trainer_new(&o, &t);
 *     for (int i = 0; i < 10; i++) kiln_trainer_step(t, inputs, targets, &loss);   B*T ids each
 *     kiln_trainer_export(t, "model.gguf");  kiln_model_load reads it
 *     kiln_trainer_free(t);
 *
 * A checkpoint (kiln_trainer_save, or the run's ckpt_path) is a llama GGUF with the optimizer state and the run's
 * position as train.* keys; resume continues it bit for bit. An export carries the weights (F32) and the
 * tokenizer's keys. */

/* A new model's shape. n_vocab 0: the tokenizer's; n_ctx 0: T. rope_base and rms_eps 0: 10000 and 1e-5. */
typedef struct kiln_model_dims {
    int64_t n_vocab;   /* V */
    int64_t n_embd;    /* C: a multiple of n_head with an even head size */
    int64_t n_layer;   /* L */
    int64_t n_head;    /* NH */
    int64_t n_head_kv; /* NKV: divides n_head */
    int64_t n_ff;      /* F */
    int64_t n_ctx;     /* the context length the model records */
    float rope_base, rms_eps;
    bool tied;         /* the output head is token_embd (no output.weight) */
} kiln_model_dims;

typedef enum kiln_lr_decay { KILN_LR_COSINE, KILN_LR_LINEAR, KILN_LR_CONSTANT } kiln_lr_decay;

typedef struct kiln_lr_schedule {
    float lr;            /* peak */
    float min_lr;        /* floor reached at the end of the decay */
    int64_t warmup;      /* steps of linear warmup from lr/warmup to lr */
    int64_t total;       /* the step at which the decay reaches min_lr (0 in kiln_train_opts: steps) */
    kiln_lr_decay decay;
} kiln_lr_schedule;

/* The learning rate of step (0-based): (step+1)/warmup * lr during warmup, then the decay from lr to min_lr
 * over steps warmup..total, min_lr after. KILN_LR_CONSTANT stays at lr after the warmup (min_lr unused). */
float kiln_lr_at(const kiln_lr_schedule *s, int64_t step);

typedef struct kiln_adamw_cfg {
    float beta1, beta2;  /* 0.9, 0.95 */
    float eps;           /* 1e-8; must be > 0 (v is 0 where the gradient always was) */
    float weight_decay;  /* 0.1, decoupled: p -= lr * wd * p on the matrices (not the norms or the embedding) */
    float grad_clip;     /* global L2 norm bound; <= 0 disables clipping */
    bool eight_bit;      /* int8 moments with one fp32 scale per 256 elements (CPU only) */
} kiln_adamw_cfg;

/* Defaults as commented in kiln_adamw_cfg (grad_clip 1). */
kiln_adamw_cfg kiln_adamw_defaults(void);

typedef struct kiln_train_opts {
    /* the model: dimensions, or init_from a GGUF, or resume */
    kiln_model_dims dims;
    const char *init_from;   /* fine-tune these weights (NULL: random init from seed) */
    const char *resume;      /* continue this checkpoint (NULL: start fresh) */
    const char *tokenizer;   /* GGUF with tokenizer.ggml.* (NULL: init_from's / resume's; a kiln_trainer of a new
                              * model with dims.n_vocab set may have none) */
    const char *data_dir;    /* kiln_train_run: shards written by kiln data */
    /* the run */
    int64_t B, T;            /* sequences per micro-batch, tokens per sequence */
    int64_t grad_accum;      /* kiln_train_run: micro-batches per step */
    int64_t steps;           /* total optimizer steps */
    double time_budget_s;    /* stop after this long (0: no limit); the schedule still spans steps */
    int64_t stop_after;      /* stop once this step is done (0: run to steps); the schedule still spans steps */
    kiln_lr_schedule lr;
    kiln_adamw_cfg adam;
    bool mixed;              /* bf16 compute mirror of the fp32 master weights */
    float label_smoothing, z_loss;
    uint64_t seed;
    int n_threads;           /* CPU threads, 0: all cores */
    kiln_device device;      /* CPU, or CUDA device index (fp32 AdamW, bf16 matmuls) */
    bool deterministic;      /* CUDA: fixed-order reductions everywhere (bit-exact resume), a little slower */
    bool recompute;          /* CUDA: recompute the norms' and SwiGLU's outputs in the backward (less memory) */
    bool zero1;              /* data parallel: shard the AdamW moments over the ranks (ZeRO-1) */
    /* evaluation and output (kiln_train_run) */
    int64_t eval_interval;   /* steps between validation passes (0: only at the end) */
    int64_t eval_batches;    /* micro-batches per validation pass */
    int64_t ckpt_interval;   /* steps between checkpoints (0: only at the end) */
    const char *ckpt_path;   /* checkpoint file (NULL: none) */
    const char *out_path;    /* exported model (NULL: none) */
    bool out_best;           /* export at each evaluation that improves the validation loss, not at the end */
    const char *log_path;    /* JSONL log (NULL: none) */
    const char *name;        /* general.name of the outputs */
    const int *cancel;       /* kiln_train_run: when *cancel becomes nonzero (another thread sets it, e.g. with
                              * __atomic_store_n), the run stops after the current step: the checkpoint and the export
                              * are written as at the end, and the run returns KILN_OK. One process only (a data
                              * parallel run decides by rank 0's clock alone). NULL: never */
    const int *pause;        /* kiln_train_run: while *pause is nonzero (set by another thread) the run waits before its
                              * next step, after a progress report of stage "paused"; "resumed" when it goes on. The
                              * time paused counts neither toward time_budget_s nor the ETA. One process only. NULL: never */
} kiln_train_opts;

/* Defaults: B 8, T 256, accumulation 1, 1000 steps, lr 1e-3 cosine to 1e-4 with 100 warmup steps over 1000, AdamW
 * defaults, mixed off, the CPU, eval every 100 steps over 20 batches, checkpoint at the end, seed 1337. */
kiln_train_opts kiln_train_defaults(void);

/* A step's report, the progress callback's p->train: stage "train" after each step (done = step, total = steps,
 * metric = loss), "eval" after each evaluation (metric = val_loss). */
typedef struct kiln_train_progress {
    int64_t step, steps;     /* completed steps, target */
    double loss;             /* mean training loss of this step */
    double lr, grad_norm;
    double tok_per_s;        /* this step */
    double elapsed_s, eta_s;
    double val_loss, val_ppl;/* NaN when this report is not an evaluation */
    int64_t n_skipped;       /* non-finite steps skipped so far */
    bool checkpoint;         /* a checkpoint was written after this step */
    int64_t n_params;
    size_t state_bytes, act_bytes; /* training state (master, mirror, grads, moments) and activations */
} kiln_train_progress;

/* The whole run (`kiln train`). Data parallel when started as one of several ranks (`kiln train --nproc N`).
 * Every number of opts is checked first (KILN_ERR_INVALID naming the field: finite and in range), then the outputs
 * (writable folders, room for one checkpoint, -o not the checkpoint), before step 1; stale PATH.tmp.<pid> files of
 * dead runs beside the outputs are removed. A checkpoint or log that cannot be written ends the run with its
 * error, after the final export has still been tried (one process). A run that skipped more than half of its steps
 * (non-finite loss, gradient or updated weight) fails with KILN_ERR_RANGE and the count, after writing its outputs. */
kiln_status kiln_train_run(const kiln_train_opts *opts, kiln_progress_fn progress, void *user);

typedef struct kiln_trainer kiln_trainer;
/* A model and its optimizer as opts say (the model, B, T, lr, adam, device, ...; data_dir and the output paths are
 * not used). opts is checked as kiln_train_run checks it; a resumed checkpoint must hold finite weights and moments
 * (second moments >= 0) and a step within opts.steps (KILN_ERR_FORMAT / KILN_ERR_INVALID naming what is wrong). */
kiln_status kiln_trainer_new(const kiln_train_opts *opts, kiln_trainer **out);
void kiln_trainer_free(kiln_trainer *t); /* accepts NULL */
/* One optimizer step on one micro-batch: inputs and targets (B*T ids each, row-major (B, T); a target of -1 is
 * ignored), the gradient of the mean loss over the counted targets, then AdamW at the schedule's rate for this
 * step. *loss gets that mean. A non-finite loss or gradient, or an update that would make a weight non-finite,
 * skips the update (nothing changes; the step still counts). */
kiln_status kiln_trainer_step(kiln_trainer *t, const int32_t *inputs, const int32_t *targets, double *loss);
/* Optimizer steps taken (resumed ones included). */
int64_t kiln_trainer_steps_done(const kiln_trainer *t);
/* A checkpoint that opts.resume continues, and an export of the weights alone; both atomic (temp file, rename). A
 * non-finite weight or moment is refused (KILN_ERR_INVALID) and nothing is written. */
kiln_status kiln_trainer_save(kiln_trainer *t, const char *path);
kiln_status kiln_trainer_export(kiln_trainer *t, const char *path);

/* ---------------------------------------------------------------- perplexity
 * As llama.cpp's llama-perplexity computes it: the text is tokenized with BOS only where the vocab's
 * add_bos_token says so, and cut into non-overlapping windows of n_ctx tokens (at least two; the tail is dropped);
 * each window's first token becomes BOS (again only where add_bos_token says so) and only its second half is
 * scored, n_ctx - 1 - n_ctx/2 tokens a window, so every scored token has at least n_ctx/2 tokens of context.
 * ppl = exp(mean NLL); ppl_err = ppl * the standard error of that mean. */
typedef struct kiln_perplexity_result {
    double ppl, ppl_err;
    int64_t n_scored;  /* tokens scored */
    int64_t n_windows;
} kiln_perplexity_result;
/* run: the session's threads and GPU use (its n_ctx is replaced by the window's), or NULL for the defaults.
 * progress (may be NULL): stage "perplexity", done/total in windows, metric the perplexity of the windows so far. */
kiln_status kiln_perplexity(const kiln_model *m, const char *text, size_t len, int64_t n_ctx, const kiln_session_params *run,
                            kiln_progress_fn progress, void *ud, kiln_perplexity_result *out);

#ifdef __cplusplus
}
#endif
#endif /* KILN_H */
