/* test_model_load.c: what kiln_model_load refuses in a file that the GGUF reader accepts: a block_count that is
 * not the layers present, a float key that is NaN, inf or out of its domain, a NaN or inf in a weight (float
 * elements, or the scales of a block format), and a tokenizer with fewer tokens than embedding rows. Each bad file
 * is a small synthetic model rewritten through kiln's GGUF writer with one key or a few bytes changed; every
 * message is checked whole. */
#include "kiln.h"
#include "fp16.h"
#include "test.h"

#include <stdint.h>
#include <unistd.h>

static char tmp_dir[] = "/tmp/kiln-model-load-XXXXXX";

/* A 2-layer llama of V 300 and C 256 (K-quant rows fit) in type ftype at path. */
static int synth(const char *path, kiln_ftype ftype) {
    kiln_synth_params p = kiln_synth_default();
    p.n_vocab = 300, p.n_embd = 256, p.n_layer = 2, p.n_head = 4, p.n_head_kv = 2, p.n_ff = 256, p.n_ctx = 64, p.seed = 3;
    p.ftype = ftype, p.n_threads = 2;
    return kiln_synth_llama(path, &p) == KILN_OK;
}

/* One change to a file: kv sets keys after the copy; patch edits a tensor's bytes (a private copy). */
typedef struct {
    void (*kv)(kiln_gguf_writer *w, const void *ud);
    void (*patch)(const char *name, kiln_type type, uint8_t *data, size_t nbytes, const void *ud);
    const void *ud;
} edit;

static int rewrite(const char *src, const char *dst, const edit *e) {
    kiln_gguf *g = NULL;
    kiln_gguf_writer *w = NULL;
    int64_t n = 0;
    uint8_t **copies = NULL;
    int ok = kiln_gguf_open(src, &g) == KILN_OK && kiln_gguf_writer_new(&w) == KILN_OK &&
             kiln_gguf_writer_copy_kv(w, g, NULL) == KILN_OK;
    if (ok && e->kv) e->kv(w, e->ud);
    if (ok) n = kiln_gguf_n_tensors(g), copies = calloc((size_t)n, sizeof *copies);
    for (int64_t i = 0; ok && i < n; i++) {
        const kiln_tensor_view *t = kiln_gguf_tensor_at(g, i);
        if (!(copies[i] = malloc(t->nbytes))) ok = 0;
        else memcpy(copies[i], t->data, t->nbytes);
        if (ok && e->patch) e->patch(t->name, t->type, copies[i], t->nbytes, e->ud);
        ok = ok && kiln_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, copies[i]) == KILN_OK;
    }
    ok = ok && kiln_gguf_writer_write_file(w, dst) == KILN_OK;
    for (int64_t i = 0; copies && i < n; i++) free(copies[i]);
    free(copies);
    kiln_gguf_writer_free(w);
    kiln_gguf_close(g);
    return ok;
}

/* Loads path and checks it fails with exactly "PATH: <want>". */
static int load_fails(const char *path, const char *want) {
    kiln_model *m = NULL;
    kiln_status s = kiln_model_load(path, &m);
    char full[512];
    snprintf(full, sizeof full, "%s: %s", path, want);
    if (s == KILN_OK) {
        kiln_model_free(m);
        snprintf(test_msg_, sizeof test_msg_, "loaded; wanted: %s", full);
        return 0;
    }
    if (strcmp(kiln_last_error(), full) != 0) {
        snprintf(test_msg_, sizeof test_msg_, "status %d\n  got:  %s\n  want: %s", (int)s, kiln_last_error(), full);
        return 0;
    }
    return 1;
}
#define LOAD_FAILS(path, want)                  \
    do {                                        \
        if (!load_fails(path, want)) {          \
            test_failed_ = 1;                   \
            return;                             \
        }                                       \
    } while (0)

static char load_err[512]; /* why loads() failed */

static int loads(const char *path) {
    kiln_model *m = NULL;
    kiln_status s = kiln_model_load(path, &m);
    kiln_model_free(m);
    if (s) snprintf(load_err, sizeof load_err, "%s", kiln_last_error());
    return s == KILN_OK;
}

static char f32_path[256], bad_path[256];

/* ---------------------------------------------------------------- block_count */

static void set_block_count(kiln_gguf_writer *w, const void *ud) {
    kiln_gguf_writer_set_u32(w, "llama.block_count", *(const uint32_t *)ud);
}

/* block_count 1 for 2 layers loaded and silently ran one layer; 3 failed as a missing blk.2 tensor */
static void test_block_count(void) {
    CHECK(loads(f32_path), "%s", load_err);
    uint32_t n = 1;
    CHECK(rewrite(f32_path, bad_path, &(edit){.kv = set_block_count, .ud = &n}), "%s", kiln_last_error());
    LOAD_FAILS(bad_path, "block_count is 1 but the tensors are of 2 layers (blk.0 to blk.1)");
    n = 3;
    CHECK(rewrite(f32_path, bad_path, &(edit){.kv = set_block_count, .ud = &n}), "%s", kiln_last_error());
    LOAD_FAILS(bad_path, "block_count is 3 but the tensors are of 2 layers (blk.0 to blk.1)");
}

/* ---------------------------------------------------------------- float keys */

typedef struct {
    const char *key;
    float v;
} key_f32;

static void set_f32(kiln_gguf_writer *w, const void *ud) {
    const key_f32 *k = ud;
    kiln_gguf_writer_set_f32(w, k->key, k->v);
}

/* `> 0` let +inf through (and a NaN rope base or logit scale was never checked) */
static void test_float_keys(void) {
    const struct {
        key_f32 kv;
        const char *want;
    } cases[] = {
        {{"llama.attention.layer_norm_rms_epsilon", INFINITY}, "key 'llama.attention.layer_norm_rms_epsilon' is inf; it must be finite and positive"},
        {{"llama.attention.layer_norm_rms_epsilon", NAN}, "key 'llama.attention.layer_norm_rms_epsilon' is nan; it must be finite and positive"},
        {{"llama.attention.layer_norm_rms_epsilon", 0.0f}, "key 'llama.attention.layer_norm_rms_epsilon' is 0; it must be finite and positive"},
        {{"llama.rope.freq_base", INFINITY}, "key 'llama.rope.freq_base' is inf; it must be finite and positive"},
        {{"llama.rope.freq_base", -1.0f}, "key 'llama.rope.freq_base' is -1; it must be finite and positive"},
        {{"llama.attention.layer_norm_rms_epsilon_post", INFINITY}, "key 'llama.attention.layer_norm_rms_epsilon_post' is inf; it must be finite and positive"},
        {{"llama.logit_scale", NAN}, "key 'llama.logit_scale' is nan; it must be finite and not negative"},
        {{"llama.final_logit_softcapping", INFINITY}, "key 'llama.final_logit_softcapping' is inf; it must be finite and not negative"},
        {{"llama.attention.scale", NAN}, "key 'llama.attention.scale' is nan; it must be finite and not negative"},
        {{"llama.attention.scale", -0.5f}, "key 'llama.attention.scale' is -0.5; it must be finite and not negative"},
        {{"llama.rope.local.freq_base", INFINITY}, "key 'llama.rope.local.freq_base' is inf; it must be finite and not negative"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        CHECK(rewrite(f32_path, bad_path, &(edit){.kv = set_f32, .ud = &cases[i].kv}), "%s", kiln_last_error());
        LOAD_FAILS(bad_path, cases[i].want);
    }
    key_f32 fine = {"llama.logit_scale", 0.5f};
    CHECK(rewrite(f32_path, bad_path, &(edit){.kv = set_f32, .ud = &fine}), "%s", kiln_last_error());
    CHECK(loads(bad_path), "%s", load_err);
}

/* ---------------------------------------------------------------- non-finite weights */

typedef struct {
    const char *tensor;
    size_t at;     /* byte offset in the tensor */
    int width;     /* 2 or 4 */
    uint32_t bits; /* written little-endian */
} poke;

static void apply_poke(const char *name, kiln_type type, uint8_t *data, size_t nbytes, const void *ud) {
    const poke *p = ud;
    if (strcmp(name, p->tensor) == 0 && p->at + (size_t)p->width <= nbytes) memcpy(data + p->at, &p->bits, (size_t)p->width);
}

static void expect_poke_fails(const char *src, const poke *p, const char *want) {
    CHECK(rewrite(src, bad_path, &(edit){.patch = apply_poke, .ud = p}), "%s", kiln_last_error());
    LOAD_FAILS(bad_path, want);
}
#define POKE_FAILS(src, tensor, at, width, bits, want)                              \
    do {                                                                           \
        expect_poke_fails(src, &(poke){tensor, at, width, bits}, want);             \
        if (test_failed_) return;                                                  \
    } while (0)

static void test_weights_finite_float(void) {
    char f16[256], bf16[256];
    snprintf(f16, sizeof f16, "%s/f16.gguf", tmp_dir);
    snprintf(bf16, sizeof bf16, "%s/bf16.gguf", tmp_dir);
    CHECK(synth(f16, KILN_FTYPE_MOSTLY_F16) && synth(bf16, KILN_FTYPE_MOSTLY_BF16), "%s", kiln_last_error());
    CHECK(loads(f16) && loads(bf16), "%s", load_err);
    POKE_FAILS(f32_path, "output_norm.weight", 4 * 5, 4, 0x7fc00000u, "tensor 'output_norm.weight': element 5 is nan");
    POKE_FAILS(f32_path, "blk.1.attn_norm.weight", 4 * 255, 4, 0xff800000u, "tensor 'blk.1.attn_norm.weight': element 255 is -inf");
    POKE_FAILS(f32_path, "blk.0.attn_q.weight", 4 * 1000, 4, 0x7f800000u, "tensor 'blk.0.attn_q.weight': element 1000 is inf");
    POKE_FAILS(f16, "blk.1.ffn_up.weight", 2 * 100, 2, 0x7c00, "tensor 'blk.1.ffn_up.weight': element 100 is inf");
    POKE_FAILS(f16, "token_embd.weight", 2 * 70001, 2, 0xfe00, "tensor 'token_embd.weight': element 70001 is nan");
    POKE_FAILS(bf16, "output.weight", 2 * 3, 2, 0xff80, "tensor 'output.weight': element 3 is -inf");
    /* the largest finite half still loads */
    CHECK(rewrite(f16, bad_path, &(edit){.patch = apply_poke, .ud = &(poke){"blk.1.ffn_up.weight", 200, 2, 0x7bff}}));
    CHECK(loads(bad_path), "%s", load_err);
    unlink(f16);
    unlink(bf16);
}

/* Block formats: the scales decide. Q8_0 (34-byte blocks, d first), Q4_K (144, d then dmin), Q6_K (210, d last). */
static void test_weights_finite_blocks(void) {
    char q8[256], q4km[256];
    snprintf(q8, sizeof q8, "%s/q8_0.gguf", tmp_dir);
    snprintf(q4km, sizeof q4km, "%s/q4_k_m.gguf", tmp_dir);
    CHECK(synth(q8, KILN_FTYPE_MOSTLY_Q8_0) && synth(q4km, KILN_FTYPE_MOSTLY_Q4_K_M), "%s", kiln_last_error());
    CHECK(loads(q8) && loads(q4km), "%s", load_err);
    kiln_gguf *g;
    CHECK(kiln_gguf_open(q4km, &g) == KILN_OK);
    /* llama.cpp's mix: output.weight Q6_K; ffn_up of each layer the base Q4_K */
    CHECK(kiln_gguf_find_tensor(g, "output.weight")->type == KILN_TYPE_Q6_K &&
          kiln_gguf_find_tensor(g, "blk.0.ffn_up.weight")->type == KILN_TYPE_Q4_K);
    kiln_gguf_close(g);
    POKE_FAILS(q8, "blk.0.attn_k.weight", 34 * 3, 2, 0x7e00, "tensor 'blk.0.attn_k.weight': block 3 has scale nan");
    POKE_FAILS(q4km, "blk.0.ffn_up.weight", 144 * 2 + 2, 2, 0x7c00, "tensor 'blk.0.ffn_up.weight': block 2 has dmin inf");
    POKE_FAILS(q4km, "blk.0.ffn_up.weight", 144 * 7, 2, 0xfc00, "tensor 'blk.0.ffn_up.weight': block 7 has scale -inf");
    POKE_FAILS(q4km, "output.weight", 210 * 1 + 208, 2, 0x7c01, "tensor 'output.weight': block 1 has scale nan");
    /* a code byte that looks like an inf half is only codes: it loads */
    CHECK(rewrite(q8, bad_path, &(edit){.patch = apply_poke, .ud = &(poke){"blk.0.attn_k.weight", 34 * 3 + 2, 2, 0x7c00}}));
    CHECK(loads(bad_path), "%s", load_err);
    unlink(q8);
    unlink(q4km);
}

/* ---------------------------------------------------------------- tokenizer size */

/* A SentencePiece-style ("llama") tokenizer of *ud tokens: <unk>, <s>, </s>, then pieces t3, t4, ... */
static void set_tokenizer(kiln_gguf_writer *w, const void *ud) {
    const int n = *(const int *)ud;
    static char texts[300][8];
    static const char *ptrs[300];
    static float scores[300];
    static int32_t types[300];
    for (int i = 0; i < n; i++) {
        snprintf(texts[i], sizeof texts[i], i == 0 ? "<unk>" : i == 1 ? "<s>" : i == 2 ? "</s>" : "t%d", i);
        ptrs[i] = texts[i], scores[i] = (float)-i, types[i] = i < 3 ? (i ? 3 : 2) : 1;
    }
    kiln_gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    kiln_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", ptrs, (uint64_t)n);
    kiln_gguf_writer_set_arr(w, "tokenizer.ggml.scores", KILN_GGUF_FLOAT32, scores, (uint64_t)n);
    kiln_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", KILN_GGUF_INT32, types, (uint64_t)n);
}

/* 290 tokens for 300 embedding rows loaded, and a sampled id >= 290 failed to decode mid-generation. llama.cpp
 * sizes token_embd by the tokenizer and refuses any other shape; kiln does the same. */
static void test_tokenizer_rows(void) {
    int n = 300;
    CHECK(rewrite(f32_path, bad_path, &(edit){.kv = set_tokenizer, .ud = &n}), "%s", kiln_last_error());
    kiln_model *m;
    CHECK(kiln_model_load(bad_path, &m) == KILN_OK, "%s", kiln_last_error());
    CHECK(kiln_model_tokenizer(m) && kiln_tokenizer_n_vocab(kiln_model_tokenizer(m)) == 300 && kiln_model_n_vocab(m) == 300);
    kiln_model_free(m);
    n = 290;
    CHECK(rewrite(f32_path, bad_path, &(edit){.kv = set_tokenizer, .ud = &n}), "%s", kiln_last_error());
    LOAD_FAILS(bad_path, "the tokenizer has 290 tokens but token_embd.weight has 300 rows; they must be equal");
}

int main(void) {
    if (!mkdtemp(tmp_dir)) return 1;
    snprintf(f32_path, sizeof f32_path, "%s/f32.gguf", tmp_dir);
    snprintf(bad_path, sizeof bad_path, "%s/bad.gguf", tmp_dir);
    if (!synth(f32_path, KILN_FTYPE_ALL_F32)) {
        printf("FAIL synth: %s\n", kiln_last_error());
        return 1;
    }
    RUN(test_block_count);
    RUN(test_float_keys);
    RUN(test_weights_finite_float);
    RUN(test_weights_finite_blocks);
    RUN(test_tokenizer_rows);
    unlink(f32_path);
    unlink(bad_path);
    rmdir(tmp_dir);
    TEST_EXIT();
}
