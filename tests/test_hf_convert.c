/* test_hf_convert.c: kiln_convert_hf without python. A tiny Llama folder is written here by hand (config.json,
 * a safetensors file of F16 and BF16 weights, the stories260K tokenizer.model when ../shared/data has it) and:
 *   - converted to F32: the q/k rows come out in llama.cpp's interleaved order (checked against the permutation
 *     written out per row here, not the converter's), the other weights exactly as their F16/BF16 values;
 *   - the SentencePiece import tokenizes text as kiln's loader of the same vocabulary from llama2.c's tok512.bin;
 *   - broken folders are refused with one line naming the file and what is wrong: an unknown architecture, a
 *     tensor past the end of the file, a size that is not the shape's, an unsupported dtype, a header length past
 *     the file, a tensor with no GGUF name, a BF16 value that F16 cannot hold, and no output file is left behind. */
#include "kiln.h"
#include "fp16.h"
#include "test.h"

#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmp_dir[] = "/tmp/kiln-hf-convert-XXXXXX";

/* The model: C 64, 2 heads of 32 (1 KV head), FFN 128, 1 layer, V 512 (the stories260K tokenizer's). */
enum { C = 64, NH = 2, NKV = 1, HS = 32, F = 128, V = 512 };

typedef struct st_tensor {
    const char *name, *dtype;
    int64_t rows, cols; /* cols 0: a vector of rows */
} st_tensor;

static const st_tensor tensors[] = {
    {"model.embed_tokens.weight", "F16", V, C},
    {"model.layers.0.input_layernorm.weight", "BF16", C, 0},
    {"model.layers.0.self_attn.q_proj.weight", "F16", NH * HS, C},
    {"model.layers.0.self_attn.k_proj.weight", "F16", NKV * HS, C},
    {"model.layers.0.self_attn.v_proj.weight", "BF16", NKV * HS, C},
    {"model.layers.0.self_attn.o_proj.weight", "F16", C, NH * HS},
    {"model.layers.0.post_attention_layernorm.weight", "F16", C, 0},
    {"model.layers.0.mlp.gate_proj.weight", "F16", F, C},
    {"model.layers.0.mlp.up_proj.weight", "F16", F, C},
    {"model.layers.0.mlp.down_proj.weight", "F16", C, F},
    {"model.norm.weight", "F16", C, 0},
    {"lm_head.weight", "F16", V, C},
};
#define N_TENSORS (sizeof tensors / sizeof tensors[0])

/* Element j of tensor i: a value exact in F16 and BF16 alike (k/64 for small k). */
static float value(size_t i, int64_t j) { return (float)((int64_t)((j * 7 + (int64_t)i * 13) % 61) - 30) / 64.0f; }

static void write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (f) fwrite(data, 1, n, f), fclose(f);
}

/* How a broken file differs from a good one. */
typedef struct breakage {
    const char *dtype0;  /* the first tensor's dtype string, or NULL */
    int64_t end_extra;   /* added to the first tensor's end offset */
    int64_t hlen_extra;  /* added to the header length field */
    bool extra_tensor;   /* a tensor with no GGUF name */
    bool big_v;          /* v_proj's (BF16) element 5 is 1e5, past F16's range */
} breakage;

static void write_folder(const char *dir, const char *arch, const breakage *b) {
    char path[512];
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/config.json", dir);
    char cfg[1024];
    int n = snprintf(cfg, sizeof cfg,
                     "{\"architectures\": [\"%s\"], \"vocab_size\": %d, \"hidden_size\": %d, \"num_hidden_layers\": 1, "
                     "\"intermediate_size\": %d, \"num_attention_heads\": %d, \"num_key_value_heads\": %d, "
                     "\"max_position_embeddings\": 128, \"rms_norm_eps\": 1e-5, \"rope_theta\": 10000.0}",
                     arch, V, C, F, NH, NKV);
    write_file(path, cfg, (size_t)n);
    /* header: every tensor's dtype, shape and offsets; then the data */
    char *hdr = malloc(8192);
    size_t hn = 0, data = 0;
    hn += (size_t)snprintf(hdr + hn, 8192 - hn, "{\"__metadata__\": {\"format\": \"pt\"}");
    size_t nt = N_TENSORS + (b && b->extra_tensor);
    for (size_t i = 0; i < nt; i++) {
        st_tensor t = i < N_TENSORS ? tensors[i] : (st_tensor){"model.layers.0.mlp.mystery.weight", "F16", 4, 0};
        const char *dt = i == 0 && b && b->dtype0 ? b->dtype0 : t.dtype;
        size_t bytes = (size_t)(t.rows * (t.cols ? t.cols : 1)) * 2;
        char shape[64];
        if (t.cols) snprintf(shape, sizeof shape, "[%lld, %lld]", (long long)t.rows, (long long)t.cols);
        else snprintf(shape, sizeof shape, "[%lld]", (long long)t.rows);
        long long end = (long long)(data + bytes) + (i == 0 && b ? b->end_extra : 0);
        hn += (size_t)snprintf(hdr + hn, 8192 - hn, ", \"%s\": {\"dtype\": \"%s\", \"shape\": %s, \"data_offsets\": [%zu, %lld]}", t.name, dt,
                               shape, data, end);
        data += bytes;
    }
    hn += (size_t)snprintf(hdr + hn, 8192 - hn, "}");
    uint8_t *file = calloc(1, 8 + hn + data);
    uint64_t hlen = (uint64_t)((int64_t)hn + (b ? b->hlen_extra : 0));
    for (int k = 0; k < 8; k++) file[k] = (uint8_t)(hlen >> (8 * k));
    memcpy(file + 8, hdr, hn);
    uint8_t *p = file + 8 + hn;
    for (size_t i = 0; i < nt; i++) {
        st_tensor t = i < N_TENSORS ? tensors[i] : (st_tensor){"", "F16", 4, 0};
        int64_t ne = t.rows * (t.cols ? t.cols : 1);
        for (int64_t j = 0; j < ne; j++, p += 2) {
            float v = b && b->big_v && i == 4 && j == 5 ? 1e5f : value(i, j);
            uint16_t h = strcmp(t.dtype, "BF16") == 0 ? kiln_f32_to_bf16(v) : kiln_f32_to_fp16(v);
            memcpy(p, &h, 2);
        }
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    write_file(path, file, 8 + hn + data);
    free(file);
    free(hdr);
    /* the tokenizer: stories260K's SentencePiece model when it is there, else none (the good case then skips) */
    char src[512];
    snprintf(src, sizeof src, "%s/models/stories260K/tok512.model", test_data_dir());
    FILE *in = fopen(src, "rb");
    if (in) {
        static uint8_t buf[1 << 20];
        size_t got = fread(buf, 1, sizeof buf, in);
        fclose(in);
        snprintf(path, sizeof path, "%s/tokenizer.model", dir);
        write_file(path, buf, got);
    }
}

/* The converted GGUF's tensor name as the float it holds at (row r, col j). */
static float gguf_at(const kiln_gguf *g, const char *name, int64_t r, int64_t j) {
    const kiln_tensor_view *t = kiln_gguf_find_tensor(g, name);
    if (!t || t->type != KILN_TYPE_F32) return NAN;
    float f;
    memcpy(&f, (const uint8_t *)t->data + 4 * (size_t)(r * t->ne[0] + j), 4);
    return f;
}

static void test_hf_convert_llama(void) {
    char dir[600], out[700], tokbin[512];
    snprintf(tokbin, sizeof tokbin, "%s/models/stories260K/tok512.model", test_data_dir());
    if (access(tokbin, R_OK) != 0) SKIP("%s is missing (run tests/ref/fetch_models.sh)", tokbin);
    snprintf(dir, sizeof dir, "%s/good", tmp_dir);
    snprintf(out, sizeof out, "%s/good.gguf", tmp_dir);
    write_folder(dir, "LlamaForCausalLM", NULL);
    kiln_convert_hf_params p = {.ftype = KILN_FTYPE_ALL_F32};
    kiln_status s = kiln_convert_hf(dir, out, &p);
    CHECK(s == KILN_OK, "%s", kiln_last_error());
    kiln_model *m = NULL;
    CHECK(kiln_model_load(out, &m) == KILN_OK, "%s", kiln_last_error());
    const kiln_gguf *g = kiln_model_gguf(m);
    /* q: out row h*HS + 2i is HF row h*HS + i, out row h*HS + 2i + 1 is HF row h*HS + HS/2 + i (rotate-half to pairs) */
    int bad = 0;
    for (int h = 0; h < NH; h++)
        for (int i = 0; i < HS / 2; i++)
            for (int j = 0; j < C; j++) {
                bad += gguf_at(g, "blk.0.attn_q.weight", h * HS + 2 * i, j) != value(2, (h * HS + i) * C + j);
                bad += gguf_at(g, "blk.0.attn_q.weight", h * HS + 2 * i + 1, j) != value(2, (h * HS + HS / 2 + i) * C + j);
            }
    for (int i = 0; i < HS / 2; i++)
        for (int j = 0; j < C; j++) bad += gguf_at(g, "blk.0.attn_k.weight", 2 * i + 1, j) != value(3, (HS / 2 + i) * C + j);
    CHECK(bad == 0, "%d q/k elements are not in llama.cpp's interleaved order", bad);
    /* the rest as stored: v (BF16), ffn_norm (post_attention_layernorm), the head */
    for (int r = 0; r < NKV * HS; r++)
        for (int j = 0; j < C; j++) bad += gguf_at(g, "blk.0.attn_v.weight", r, j) != value(4, r * C + j);
    for (int j = 0; j < C; j++) bad += gguf_at(g, "blk.0.ffn_norm.weight", 0, j) != value(6, j);
    for (int j = 0; j < C; j++) bad += gguf_at(g, "output.weight", V - 1, j) != value(11, (V - 1) * C + j);
    CHECK(bad == 0, "%d elements differ from the checkpoint's", bad);
    /* the tokenizer: the same ids as llama2.c's tok512.bin of the same vocabulary, loaded by kiln's own reader */
    snprintf(tokbin, sizeof tokbin, "%s/models/stories260K/tok512.bin", test_data_dir());
    kiln_tokenizer *ref = NULL;
    CHECK(kiln_tokenizer_load_file(tokbin, &ref) == KILN_OK, "%s", kiln_last_error());
    const char *text = "Once upon a time, Lily saw a big red ball. \"Mom!\" she said, 1234 times.";
    kiln_tokens a = {0}, b = {0};
    CHECK(kiln_tokenizer_encode(kiln_model_tokenizer(m), text, strlen(text), true, false, &a) == KILN_OK, "%s", kiln_last_error());
    CHECK(kiln_tokenizer_encode(ref, text, strlen(text), true, false, &b) == KILN_OK, "%s", kiln_last_error());
    CHECK(a.n == b.n && a.n > 10 && memcmp(a.ids, b.ids, a.n * sizeof *a.ids) == 0, "%zu ids against tok512.bin's %zu", a.n, b.n);
    CHECK(a.ids[0] == 1, "BOS is %d", a.ids[0]);
    kiln_tokens_free(&a);
    kiln_tokens_free(&b);
    kiln_tokenizer_free(ref);
    kiln_model_free(m);
}

/* Converting dir fails with status want and a message containing each of the fragments; no output is left. */
static int refused(const char *name, const char *arch, const breakage *b, kiln_status want, const char *frag1, const char *frag2) {
    char dir[600], out[700];
    snprintf(dir, sizeof dir, "%s/%s", tmp_dir, name);
    snprintf(out, sizeof out, "%s/%s.gguf", tmp_dir, name);
    write_folder(dir, arch, b);
    kiln_convert_hf_params p = {.ftype = KILN_FTYPE_MOSTLY_F16};
    kiln_status s = kiln_convert_hf(dir, out, &p);
    const char *msg = kiln_last_error();
    if (s != want || !strstr(msg, frag1) || (frag2 && !strstr(msg, frag2)) || strchr(msg, '\n') || access(out, F_OK) == 0) {
        printf("  %s: status %d, message '%s'\n", name, s, msg);
        return 0;
    }
    return 1;
}

static void test_hf_convert_refusals(void) {
    CHECK(refused("arch", "GPTNeoXForCausalLM", NULL, KILN_ERR_UNSUPPORTED, "config.json: architecture GPTNeoXForCausalLM is not supported", NULL));
    breakage past = {.end_extra = 2};
    CHECK(refused("past", "LlamaForCausalLM", &past, KILN_ERR_FORMAT, "model.safetensors: tensor 'model.embed_tokens.weight'", "holds"));
    breakage dtype = {.dtype0 = "I64"};
    CHECK(refused("dtype", "LlamaForCausalLM", &dtype, KILN_ERR_UNSUPPORTED, "'model.embed_tokens.weight' has dtype I64", NULL));
    breakage f32 = {.dtype0 = "F32"}; /* the bytes are an F16 tensor's: half what F32 of that shape needs */
    CHECK(refused("size", "LlamaForCausalLM", &f32, KILN_ERR_FORMAT, "holds 65536 bytes, but F32 of that shape is 131072", NULL));
    breakage hlen = {.hlen_extra = 1 << 30};
    CHECK(refused("hlen", "LlamaForCausalLM", &hlen, KILN_ERR_FORMAT, "model.safetensors: header length", "does not fit"));
    breakage extra = {.extra_tensor = true};
    CHECK(refused("extra", "LlamaForCausalLM", &extra, KILN_ERR_UNSUPPORTED, "tensor 'model.layers.0.mlp.mystery.weight' has no GGUF name",
                  NULL));
    breakage big = {.big_v = true};
    char tok[512];
    snprintf(tok, sizeof tok, "%s/models/stories260K/tok512.model", test_data_dir());
    CHECK(access(tok, R_OK) != 0 || refused("big", "LlamaForCausalLM", &big, KILN_ERR_RANGE,
                  "tensor 'model.layers.0.self_attn.v_proj.weight' element 5 is 99840, outside F16's range", NULL));
    char none[600];
    snprintf(none, sizeof none, "%s/none", tmp_dir);
    mkdir(none, 0755);
    CHECK(kiln_convert_hf(none, "/dev/null/x.gguf", NULL) != KILN_OK && strstr(kiln_last_error(), "config.json"), "%s", kiln_last_error());
}

int main(void) {
    if (!mkdtemp(tmp_dir)) return 1;
    RUN(test_hf_convert_llama);
    RUN(test_hf_convert_refusals);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_dir);
    if (system(cmd) != 0) return 1;
    TEST_EXIT();
}
