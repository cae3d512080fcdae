/* convert_llama2c.c: `kiln convert llama2c`, a llama2.c checkpoint plus its tokenizer.bin into a llama F32 GGUF.
 * Two checkpoint layouts exist (llama2.c export.py):
 *   legacy (v0)  7 int32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len; a negative
 *                vocab_size means an unshared classifier), then token_embedding, rms_att, wq, wk, wv, wo, rms_ffn,
 *                w1, w2, w3, rms_final, freq_cis_real and _imag (seq_len * HS/2 each, unused: kiln computes RoPE),
 *                then wcls when unshared.
 *   v1           uint32 magic "ak42" (0x616b3432), int32 version 1, the 7 ints (vocab_size positive), a byte
 *                shared_classifier, zeros to byte 256; then rms_att, rms_ffn, rms_final, token_embedding, wq, wk,
 *                wv, wo, w1, w2, w3, then wcls when unshared. No freq_cis.
 * Every weight is PyTorch's (out, in) row-major, which is GGUF's ne = [in, out]: the bytes are written as they are.
 * llama2.c rotates interleaved pairs as llama.cpp's llama layout does, so q and k need no permutation (the golden
 * test in tests/test_generate.c would fail if they did). w1 is the gate, w3 the up and w2 the down projection. */
#include "kiln.h"
#include "model.h"
#include "status.h"
#include "file.h"
#include "tok/tok.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define LLAMA2C_MAGIC 0x616b3432u /* "ak42" */
#define LLAMA2C_V1_HEADER 256

typedef struct {
    int64_t C, F, L, NH, NKV, V, seq_len; /* width, FFN width, layers, heads, KV heads, vocab, context */
    bool shared;                          /* the classifier is the token embedding */
    int version;                          /* 0 legacy, 1 */
    uint64_t data_offset;
} llama2c_header;

static int32_t read_i32(const uint8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

static kiln_status parse_header(const char *path, const uint8_t *buf, uint64_t size, llama2c_header *h) {
    memset(h, 0, sizeof *h);
    if (size < 28) return kiln_fail(KILN_ERR_FORMAT, "%s: %llu bytes is too short for a llama2.c header (28 bytes)", path, (unsigned long long)size);
    const uint8_t *ints = buf;
    if ((uint32_t)read_i32(buf) == LLAMA2C_MAGIC) {
        int32_t version = size >= 8 ? read_i32(buf + 4) : -1;
        if (version != 1)
            return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: llama2.c export version %d is not supported (kiln reads the legacy format and version 1, float32)",
                             path, version);
        if (size < LLAMA2C_V1_HEADER) return kiln_fail(KILN_ERR_FORMAT, "%s: truncated at byte %llu: a version 1 header is 256 bytes", path, (unsigned long long)size);
        h->version = 1;
        ints = buf + 8;
        h->shared = buf[36] != 0;
        h->data_offset = LLAMA2C_V1_HEADER;
    } else {
        h->data_offset = 28;
    }
    int32_t v[7];
    for (int i = 0; i < 7; i++) v[i] = read_i32(ints + 4 * i);
    if (h->version == 0) {
        h->shared = v[5] > 0;
        if (v[5] < 0 && v[5] != INT32_MIN) v[5] = -v[5];
    }
    static const char *const names[7] = {"dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len"};
    for (int i = 0; i < 7; i++)
        if (v[i] <= 0 || v[i] > (1 << 24))
            return kiln_fail(KILN_ERR_FORMAT, "%s: header field %s at byte %llu is %d, outside 1..2^24", path, names[i],
                             (unsigned long long)((uint64_t)(ints - buf) + 4u * (unsigned)i), v[i]);
    h->C = v[0], h->F = v[1], h->L = v[2], h->NH = v[3], h->NKV = v[4], h->V = v[5], h->seq_len = v[6];
    if (h->C % h->NH || h->NH % h->NKV || (h->C / h->NH) % 2)
        return kiln_fail(KILN_ERR_FORMAT, "%s: dim %lld, n_heads %lld and n_kv_heads %lld do not give whole, even heads", path, (long long)h->C,
                         (long long)h->NH, (long long)h->NKV);
    return KILN_OK;
}

/* One weight of the checkpoint: its GGUF shape and where it starts (in floats from the data offset). Per-layer
 * weights are stored stacked, [L][rows][cols], so layer l's slice is a fixed stride further on; their names and
 * shapes are the layer tensor table's (model.h). */
typedef struct {
    const char *name; /* the GGUF name of a whole-model weight; NULL for a layer's (lt) or the unused freq tables */
    int lt;           /* a layer weight's kiln_layer_tensor, or -1 */
    int64_t ne0, ne1; /* GGUF shape: row length, rows (1 for a vector) */
    uint64_t start;   /* offset in floats */
} llama2c_weight;

enum { W_EMB, W_ATT_NORM, W_Q, W_K, W_V, W_O, W_FFN_NORM, W_GATE, W_DOWN, W_UP, W_OUT_NORM, W_FREQ, W_CLS, W_COUNT };

/* The plain llama config of a header, for the table's shape rules. */
static kiln_llama_config header_config(const llama2c_header *h) {
    kiln_llama_config c = {.n_vocab = h->V, .n_embd = h->C, .n_layer = h->L, .n_head = h->NH, .n_head_kv = h->NKV,
                           .head_dim = h->C / h->NH, .n_ff = h->F};
    return c;
}

/* A layer weight, shaped by the table. */
static llama2c_weight layer_weight(const kiln_llama_config *c, kiln_layer_tensor lt) {
    llama2c_weight x = {NULL, (int)lt, kiln_dim_size(c, kiln_layer_tensors[lt].ne0), kiln_dim_size(c, kiln_layer_tensors[lt].ne1), 0};
    return x;
}

/* Lays out the weights in the file's order; *n_floats gets the count the file must hold. False on overflow
 * (only a corrupt header gets near: each dimension is at most 2^24). */
static bool layout(const llama2c_header *h, llama2c_weight *w, uint64_t *n_floats) {
    const kiln_llama_config c = header_config(h);
    int64_t C = h->C, HS = h->C / h->NH;
    w[W_EMB] = (llama2c_weight){"token_embd.weight", -1, C, h->V, 0};
    w[W_ATT_NORM] = layer_weight(&c, KILN_LT_ATTN_NORM);
    w[W_Q] = layer_weight(&c, KILN_LT_WQ);
    w[W_K] = layer_weight(&c, KILN_LT_WK);
    w[W_V] = layer_weight(&c, KILN_LT_WV);
    w[W_O] = layer_weight(&c, KILN_LT_WO);
    w[W_FFN_NORM] = layer_weight(&c, KILN_LT_FFN_NORM);
    w[W_GATE] = layer_weight(&c, KILN_LT_W_GATE); /* w1 */
    w[W_DOWN] = layer_weight(&c, KILN_LT_W_DOWN); /* w2 */
    w[W_UP] = layer_weight(&c, KILN_LT_W_UP);     /* w3 */
    w[W_OUT_NORM] = (llama2c_weight){"output_norm.weight", -1, C, 1, 0};
    w[W_FREQ] = (llama2c_weight){NULL, -1, HS / 2, 2 * h->seq_len, 0}; /* legacy only: the cos and sin tables */
    w[W_CLS] = (llama2c_weight){"output.weight", -1, C, h->V, 0};
    static const int legacy[] = {W_EMB, W_ATT_NORM, W_Q, W_K, W_V, W_O, W_FFN_NORM, W_GATE, W_DOWN, W_UP, W_OUT_NORM, W_FREQ, W_CLS};
    static const int v1[] = {W_ATT_NORM, W_FFN_NORM, W_OUT_NORM, W_EMB, W_Q, W_K, W_V, W_O, W_GATE, W_DOWN, W_UP, W_CLS};
    const int *order = h->version == 1 ? v1 : legacy;
    int n = h->version == 1 ? (int)(sizeof v1 / sizeof v1[0]) : (int)(sizeof legacy / sizeof legacy[0]);
    uint64_t at = 0, count;
    for (int i = 0; i < n; i++) {
        llama2c_weight *x = &w[order[i]];
        if (order[i] == W_CLS && h->shared) break;
        x->start = at;
        if (!kiln_mul_ok((uint64_t)x->ne0, (uint64_t)x->ne1, &count) || !kiln_mul_ok(count, (uint64_t)(x->lt >= 0 ? h->L : 1), &count) ||
            !kiln_add_ok(at, count, &at))
            return false;
    }
    *n_floats = at;
    return true;
}

/* Adds weight x (layer l's slice when per-layer) as an F32 tensor pointing into the mapped checkpoint. */
static kiln_status add_weight(kiln_gguf_writer *w, const llama2c_weight *x, int64_t l, const float *data) {
    char name[96];
    if (x->lt >= 0) kiln_layer_tensor_name(name, sizeof name, l, (kiln_layer_tensor)x->lt);
    else snprintf(name, sizeof name, "%s", x->name);
    int64_t ne[2] = {x->ne0, x->ne1};
    uint64_t per_layer = (uint64_t)x->ne0 * (uint64_t)x->ne1;
    return kiln_gguf_writer_add_tensor(w, name, KILN_TYPE_F32, x->ne1 == 1 ? 1 : 2, ne, data + x->start + (uint64_t)l * per_layer);
}

static kiln_status write_tokenizer(kiln_gguf_writer *w, const kiln_tokenizer *tok) {
    int32_t n = kiln_tokenizer_n_vocab(tok);
    const char **texts = malloc((size_t)n * sizeof *texts);
    float *scores = malloc((size_t)n * sizeof *scores);
    int32_t *types = malloc((size_t)n * sizeof *types);
    kiln_status s = KILN_OK;
    if (!texts || !scores || !types) s = kiln_fail(KILN_ERR_NOMEM, "out of memory for %d tokens", n);
    for (int32_t i = 0; !s && i < n; i++) {
        kiln_str t = kiln_tokenizer_token_text(tok, i);
        /* the texts live NUL-terminated in the tokenizer's pool; one holding a NUL could not be written whole */
        if (memchr(t.ptr, 0, (size_t)t.len)) s = kiln_fail(KILN_ERR_UNSUPPORTED, "token %d holds a NUL byte", i);
        texts[i] = t.ptr;
        scores[i] = tok->tokens[i].score;
        types[i] = (int32_t)kiln_tokenizer_token_type(tok, i);
    }
    if (!s) s = kiln_gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    if (!s) s = kiln_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", texts, (uint64_t)n);
    if (!s) s = kiln_gguf_writer_set_arr(w, "tokenizer.ggml.scores", KILN_GGUF_FLOAT32, scores, (uint64_t)n);
    if (!s) s = kiln_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", KILN_GGUF_INT32, types, (uint64_t)n);
    if (!s) s = kiln_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1);
    if (!s) s = kiln_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2);
    if (!s) s = kiln_gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", 0);
    if (!s) s = kiln_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", true);
    if (!s) s = kiln_gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", false);
    free(texts);
    free(scores);
    free(types);
    return s;
}

static kiln_status write_gguf(const char *out_path, const llama2c_header *h, const llama2c_weight *lw, const float *data,
                              const kiln_tokenizer *tok) {
    kiln_gguf_writer *w = NULL;
    kiln_status s = kiln_gguf_writer_new(&w);
    uint32_t HS = (uint32_t)(h->C / h->NH);
    if (!s) s = kiln_gguf_writer_set_str(w, "general.architecture", "llama");
    if (!s) s = kiln_gguf_writer_set_str(w, "general.name", "llama2.c");
    if (!s) s = kiln_gguf_writer_set_u32(w, "general.file_type", KILN_FTYPE_ALL_F32);
    if (!s) s = kiln_gguf_writer_set_u32(w, "llama.vocab_size", (uint32_t)h->V);
    if (!s) s = kiln_gguf_writer_set_u32(w, "llama.context_length", (uint32_t)h->seq_len);
    if (!s) s = kiln_gguf_writer_set_u32(w, "llama.embedding_length", (uint32_t)h->C);
    if (!s) s = kiln_gguf_writer_set_u32(w, "llama.block_count", (uint32_t)h->L);
    if (!s) s = kiln_gguf_writer_set_u32(w, "llama.feed_forward_length", (uint32_t)h->F);
    if (!s) s = kiln_gguf_writer_set_u32(w, "llama.attention.head_count", (uint32_t)h->NH);
    if (!s) s = kiln_gguf_writer_set_u32(w, "llama.attention.head_count_kv", (uint32_t)h->NKV);
    if (!s) s = kiln_gguf_writer_set_u32(w, "llama.rope.dimension_count", HS);
    /* run.c's constants: RoPE base 10000, RMSNorm eps 1e-5 */
    if (!s) s = kiln_gguf_writer_set_f32(w, "llama.rope.freq_base", 10000.0f);
    if (!s) s = kiln_gguf_writer_set_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    if (!s) s = write_tokenizer(w, tok);

    /* tensors in llama.cpp's order, each layer's in the table's; the writer streams them out of the mapping */
    if (!s) s = add_weight(w, &lw[W_EMB], 0, data);
    for (int64_t l = 0; l < h->L; l++)
        for (int lt = 0; !s && lt < KILN_LT_COUNT; lt++)
            for (int i = 0; !s && i < W_COUNT; i++)
                if (lw[i].lt == lt) s = add_weight(w, &lw[i], l, data);
    if (!s) s = add_weight(w, &lw[W_OUT_NORM], 0, data);
    if (!s && !h->shared) s = add_weight(w, &lw[W_CLS], 0, data);
    if (!s) s = kiln_gguf_writer_write_file(w, out_path);
    kiln_gguf_writer_free(w);
    return s;
}

kiln_status kiln_convert_llama2c(const char *model_path, const char *tokenizer_path, const char *out_path) {
    kiln_tokenizer *tok = NULL;
    kiln_status s = kiln_tokenizer_load_file(tokenizer_path, &tok);
    if (s) return s;
    if (strcmp(kiln_tokenizer_model(tok), "llama") != 0) {
        kiln_tokenizer_free(tok);
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: a %s tokenizer; a llama2.c model takes a llama (SentencePiece) one", tokenizer_path,
                         kiln_tokenizer_model(tok));
    }
    int fd;
    if ((s = kiln_open_regular(model_path, &fd))) {
        kiln_tokenizer_free(tok);
        return s;
    }
    struct stat st;
    void *map = MAP_FAILED;
    uint64_t size = 0;
    if (fstat(fd, &st) != 0) s = kiln_fail(KILN_ERR_IO, "%s: cannot stat: %s", model_path, strerror(errno));
    else if ((size = (uint64_t)st.st_size) == 0) s = kiln_fail(KILN_ERR_FORMAT, "%s: the file is empty", model_path);
    else if ((map = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0)) == MAP_FAILED)
        s = kiln_fail(KILN_ERR_IO, "%s: cannot map: %s", model_path, strerror(errno));
    close(fd);
    llama2c_header h;
    llama2c_weight lw[W_COUNT];
    if (!s) s = parse_header(model_path, map, size, &h);
    if (!s) {
        uint64_t n_floats = 0, want = 0;
        if (!layout(&h, lw, &n_floats) || !kiln_mul_ok(n_floats, 4, &want) || !kiln_add_ok(want, h.data_offset, &want) || size != want)
            s = kiln_fail(KILN_ERR_FORMAT,
                          "%s: %llu bytes, but a %s checkpoint with dim %lld, hidden_dim %lld, n_layers %lld, n_heads %lld, n_kv_heads %lld, "
                          "vocab_size %lld (%s classifier), seq_len %lld is %llu bytes",
                          model_path, (unsigned long long)size, h.version ? "version 1" : "legacy", (long long)h.C, (long long)h.F,
                          (long long)h.L, (long long)h.NH, (long long)h.NKV, (long long)h.V, h.shared ? "shared" : "separate",
                          (long long)h.seq_len, (unsigned long long)want);
    }
    if (!s && kiln_tokenizer_n_vocab(tok) != h.V)
        s = kiln_fail(KILN_ERR_FORMAT, "%s has %d tokens but %s has vocab_size %lld", tokenizer_path, kiln_tokenizer_n_vocab(tok), model_path,
                      (long long)h.V);
    if (!s) s = write_gguf(out_path, &h, lw, (const float *)((const uint8_t *)map + h.data_offset), tok);
    if (map != MAP_FAILED) munmap(map, (size_t)size);
    kiln_tokenizer_free(tok);
    return s;
}
