/* test_quantize.c: `kiln quantize` and `kiln synth`.
 * The mix rules are checked against a layer list written out by hand from llama.cpp's use_more_bits;
 * a synthetic model is quantized (1 and 2 threads give identical bytes), read back, its types and keys
 * checked and its weights compared with the source; the result round-trips through `kiln inspect`. */
#include "kiln.h"
#include "model/quantize.h"
#include "quants.h"
#include "test.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static kiln_tensor_view view(const char *name, int n_dims, int64_t ne0, int64_t ne1) {
    kiln_tensor_view t = {.name = name, .type = KILN_TYPE_F32, .n_dims = n_dims, .ne = {ne0, ne1, 1, 1}};
    return t;
}

static void test_mix_rules(void) {
    /* 16 layers: n/8 = 2, 7n/8 = 14, and (i - 2) % 3 == 2 adds 4, 7, 10, 13 */
    const int more_bits[16] = {1, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 1, 1};
    char name[64];
    for (int i = 0; i < 16; i++) {
        snprintf(name, sizeof name, "blk.%d.attn_v.weight", i);
        kiln_tensor_view v = view(name, 2, 256, 256);
        kiln_type want = more_bits[i] ? KILN_TYPE_Q6_K : KILN_TYPE_Q4_K;
        CHECK(kiln_quantize_choose_type(&v, KILN_FTYPE_MOSTLY_Q4_K_M, 16, 16, true) == want, "layer %d attn_v", i);
        snprintf(name, sizeof name, "blk.%d.ffn_down.weight", i);
        v = view(name, 2, 256, 256);
        want = more_bits[i] ? KILN_TYPE_Q6_K : KILN_TYPE_Q5_K;
        CHECK(kiln_quantize_choose_type(&v, KILN_FTYPE_MOSTLY_Q5_K_M, 16, 16, true) == want, "layer %d ffn_down", i);
        /* plain q4_k has no _M rules */
        CHECK(kiln_quantize_choose_type(&v, KILN_FTYPE_MOSTLY_Q4_K_S, 16, 16, true) == KILN_TYPE_Q4_K);
        snprintf(name, sizeof name, "blk.%d.attn_q.weight", i);
        v = view(name, 2, 256, 256);
        CHECK(kiln_quantize_choose_type(&v, KILN_FTYPE_MOSTLY_Q4_K_M, 16, 16, true) == KILN_TYPE_Q4_K);
    }
    kiln_tensor_view out = view("output.weight", 2, 256, 1000), emb = view("token_embd.weight", 2, 256, 1000);
    CHECK(kiln_quantize_choose_type(&out, KILN_FTYPE_MOSTLY_Q4_K_M, 16, 16, true) == KILN_TYPE_Q6_K);
    CHECK(kiln_quantize_choose_type(&out, KILN_FTYPE_MOSTLY_Q4_0, 16, 16, true) == KILN_TYPE_Q6_K);
    CHECK(kiln_quantize_choose_type(&out, KILN_FTYPE_MOSTLY_Q8_0, 16, 16, true) == KILN_TYPE_Q8_0);
    CHECK(kiln_quantize_choose_type(&out, KILN_FTYPE_MOSTLY_F16, 16, 16, true) == KILN_TYPE_F16);
    CHECK(kiln_quantize_choose_type(&emb, KILN_FTYPE_MOSTLY_Q4_K_M, 16, 16, true) == KILN_TYPE_Q4_K, "untied embedding");
    CHECK(kiln_quantize_choose_type(&emb, KILN_FTYPE_MOSTLY_Q4_K_M, 16, 16, false) == KILN_TYPE_Q6_K, "tied embedding");
    kiln_tensor_view norm = view("blk.0.attn_norm.weight", 1, 256, 1), norm2 = view("blk.0.some_norm.weight", 2, 256, 4);
    CHECK(kiln_quantize_choose_type(&norm, KILN_FTYPE_MOSTLY_Q4_K_M, 16, 16, true) == KILN_TYPE_F32);
    CHECK(kiln_quantize_choose_type(&norm2, KILN_FTYPE_MOSTLY_Q4_K_M, 16, 16, true) == KILN_TYPE_F32);
    /* rows that cannot hold 256-element blocks fall back */
    kiln_tensor_view narrow = view("blk.0.attn_q.weight", 2, 96, 96), odd = view("blk.0.attn_q.weight", 2, 80, 8);
    CHECK(kiln_quantize_choose_type(&narrow, KILN_FTYPE_MOSTLY_Q4_K_M, 16, 16, true) == KILN_TYPE_Q8_0);
    CHECK(kiln_quantize_choose_type(&odd, KILN_FTYPE_MOSTLY_Q4_K_M, 16, 16, true) == KILN_TYPE_F16);
    kiln_ftype f;
    CHECK(kiln_ftype_from_name("Q4_K_M", &f) == KILN_OK && f == KILN_FTYPE_MOSTLY_Q4_K_M);
    CHECK(kiln_ftype_from_name("q7_k", &f) == KILN_ERR_INVALID);
    CHECK(strcmp(kiln_last_error(), "unknown quantization type 'q7_k' (expected one of f16 bf16 q8_0 q4_0 q4_1 q4_k q5_k "
                                    "q6_k q4_k_m q5_k_m q5_1 q2_k q3_k iq4_nl iq4_xs)") == 0,
          "%s", kiln_last_error());
    CHECK(kiln_ftype_from_name("q3_k", &f) == KILN_OK && f == KILN_FTYPE_MOSTLY_Q3_K_S);
}

static char src_path[64], out_path[64], out1_path[64];

static int read_file(const char *path, unsigned char **buf, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    *buf = malloc(*n);
    size_t got = fread(*buf, 1, *n, f);
    fclose(f);
    return got == *n;
}

static void test_quantize_file(void) {
    snprintf(src_path, sizeof src_path, "/tmp/kiln-q-src-%d.gguf", (int)getpid());
    snprintf(out_path, sizeof out_path, "/tmp/kiln-q-out-%d.gguf", (int)getpid());
    snprintf(out1_path, sizeof out1_path, "/tmp/kiln-q-out1-%d.gguf", (int)getpid());
    kiln_synth_params sp = kiln_synth_default();
    sp.n_vocab = 512, sp.n_layer = 16, sp.n_ff = 512, sp.n_embd = 256;
    CHECK(kiln_synth_llama(src_path, &sp) == KILN_OK, "%s", kiln_last_error());
    kiln_quantize_params qp = {.ftype = KILN_FTYPE_MOSTLY_Q4_K_M, .n_threads = 2};
    CHECK(kiln_quantize_file(src_path, out_path, &qp) == KILN_OK, "%s", kiln_last_error());
    qp.n_threads = 1;
    CHECK(kiln_quantize_file(src_path, out1_path, &qp) == KILN_OK, "%s", kiln_last_error());
    unsigned char *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    int same = read_file(out_path, &a, &na) && read_file(out1_path, &b, &nb) && na == nb && memcmp(a, b, na) == 0;
    free(a);
    free(b);
    unlink(out1_path);
    CHECK(same, "1 and 2 threads give different files");

    kiln_gguf *src, *q;
    CHECK(kiln_gguf_open(src_path, &src) == KILN_OK);
    CHECK(kiln_gguf_open(out_path, &q) == KILN_OK, "%s", kiln_last_error());
    uint32_t ft, qv, L;
    CHECK(kiln_gguf_get_u32(q, "general.file_type", &ft) == KILN_OK && ft == 15);
    CHECK(kiln_gguf_get_u32(q, "general.quantization_version", &qv) == KILN_OK && qv == 2);
    CHECK(kiln_gguf_get_u32(q, "llama.block_count", &L) == KILN_OK && L == 16, "metadata copied");
    CHECK(kiln_gguf_n_tensors(q) == kiln_gguf_n_tensors(src));
    int n_q6 = 0;
    for (int64_t i = 0; i < kiln_gguf_n_tensors(q); i++) {
        const kiln_tensor_view *t = kiln_gguf_tensor_at(q, i), *s = kiln_gguf_find_tensor(src, t->name);
        CHECK(s && s->ne[0] == t->ne[0] && s->ne[1] == t->ne[1], "%s shape", t->name);
        if (t->n_dims == 1) CHECK(t->type == KILN_TYPE_F32, "%s", t->name);
        else CHECK(t->type == KILN_TYPE_Q4_K || t->type == KILN_TYPE_Q6_K, "%s is %s", t->name, kiln_type_name(t->type));
        n_q6 += t->type == KILN_TYPE_Q6_K;
        /* the weights survive: relative RMS error within what Q4_K/Q6_K give on Gaussian data */
        int64_t ne = t->ne[0] * t->ne[1];
        float *x = malloc((size_t)ne * 4), *y = malloc((size_t)ne * 4);
        kiln_get_to_float(s->type, KILN_SIMD_SCALAR)(s->data, x, ne);
        kiln_get_to_float(t->type, KILN_SIMD_SCALAR)(t->data, y, ne);
        double err = 0, ref = 0;
        for (int64_t j = 0; j < ne; j++) err += (double)(x[j] - y[j]) * (x[j] - y[j]), ref += (double)x[j] * x[j];
        free(x);
        free(y);
        double rel = sqrt(err / ref);
        CHECK(rel < (t->type == KILN_TYPE_Q6_K ? 0.025 : t->type == KILN_TYPE_Q4_K ? 0.09 : 1e-7), "%s error %.4f", t->name, rel);
    }
    CHECK(n_q6 == 1 + 8 + 8, "output + 8 attn_v + 8 ffn_down in Q6_K, got %d", n_q6);
    kiln_gguf_close(q);
    kiln_gguf_close(src);
}

/* A file of three tensors (one 1-D norm, two matrices of 2 x 32 f32) with bad[i] written into element at[i] of
 * tensor i when at[i] >= 0. */
static int write_small(const char *path, const int at[3], float bad) {
    static float w[3][64];
    const char *names[3] = {"output_norm.weight", "blk.0.attn_q.weight", "token_embd.weight"};
    int64_t ne[3][2] = {{32, 1}, {32, 2}, {32, 2}};
    kiln_gguf_writer *gw;
    if (kiln_gguf_writer_new(&gw) != KILN_OK) return 0;
    int ok = 1;
    for (int t = 0; t < 3; t++) {
        for (int i = 0; i < 64; i++) w[t][i] = (float)((i * 7 + t) % 13) / 13.0f - 0.5f;
        if (at[t] >= 0) w[t][at[t]] = bad;
        ok = ok && kiln_gguf_writer_add_tensor(gw, names[t], KILN_TYPE_F32, t ? 2 : 1, ne[t], w[t]) == KILN_OK;
    }
    ok = ok && kiln_gguf_writer_write_file(gw, path) == KILN_OK;
    kiln_gguf_writer_free(gw);
    return ok;
}

/* NaN and inf weights: quantizing them was undefined behaviour and wrote garbage; now an error naming the tensor,
 * with no output file (and no temp file) left behind. A tensor count one too low wrote shifted garbage, exit 0. */
static void test_quantize_refuses_bad_input(void) {
    char in[64], outp[64], tmp[96], want[256];
    snprintf(in, sizeof in, "/tmp/kiln-q-bad-%d.gguf", (int)getpid());
    snprintf(outp, sizeof outp, "/tmp/kiln-q-bad-out-%d.gguf", (int)getpid());
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", outp, (int)getpid());
    kiln_quantize_params qp = {.ftype = KILN_FTYPE_MOSTLY_Q8_0, .n_threads = 2};
    CHECK(write_small(in, (const int[3]){-1, -1, -1}, 0), "%s", kiln_last_error());
    CHECK(kiln_quantize_file(in, outp, &qp) == KILN_OK, "%s", kiln_last_error());
    unlink(outp);
    const struct {
        int at[3];
        float v;
        const char *msg;
    } cases[] = {
        {{-1, 37, -1}, NAN, "tensor 'blk.0.attn_q.weight': element 37 is nan"},     /* converted to q8_0 */
        {{-1, -1, 0}, -INFINITY, "tensor 'token_embd.weight': element 0 is -inf"},  /* converted to q8_0 */
        {{31, -1, -1}, INFINITY, "tensor 'output_norm.weight': element 31 is inf"}, /* copied as f32 */
    };
    struct stat st;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        CHECK(write_small(in, cases[c].at, cases[c].v), "%s", kiln_last_error());
        snprintf(want, sizeof want, "%s: %s", in, cases[c].msg);
        CHECK(kiln_quantize_file(in, outp, &qp) == KILN_ERR_FORMAT && strcmp(kiln_last_error(), want) == 0,
              "\n  got:  %s\n  want: %s", kiln_last_error(), want);
        CHECK(stat(outp, &st) != 0 && stat(tmp, &st) != 0, "an output file was left for a refused input");
    }
    /* one tensor fewer in the count than in the table */
    CHECK(write_small(in, (const int[3]){-1, -1, -1}, 0));
    FILE *f = fopen(in, "r+b");
    uint64_t two = 2;
    CHECK(f && fseek(f, 8, SEEK_SET) == 0 && fwrite(&two, 8, 1, f) == 1);
    fclose(f);
    CHECK(kiln_quantize_file(in, outp, &qp) == KILN_ERR_FORMAT, "a tensor count of 2 for 3 tensors was quantized");
    CHECK(strstr(kiln_last_error(), "belong to no tensor (is the tensor count 2 wrong?)"), "%s", kiln_last_error());
    CHECK(stat(outp, &st) != 0);
    unlink(in);
}

static void test_inspect_quantized(void) {
    const char *bin = getenv("KILN_BIN");
    if (!bin) SKIP("KILN_BIN not set (make test sets it)");
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s inspect %s", bin, out_path);
    FILE *p = popen(cmd, "r");
    CHECK(p);
    char line[512];
    int q4k = 0, q6k = 0, total = 0, ftype = 0;
    while (fgets(line, sizeof line, p)) {
        q4k += strstr(line, " q4_K ") != NULL;
        q6k += strstr(line, " q6_K ") != NULL;
        total += strstr(line, "bits per weight") != NULL;
        ftype += strstr(line, "general.file_type") && strstr(line, " 15");
    }
    int rc = pclose(p);
    CHECK(WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "kiln inspect failed");
    CHECK(q6k == 17 && q4k > 0 && total == 1 && ftype == 1, "q4_K rows %d, q6_K rows %d", q4k, q6k);
    snprintf(cmd, sizeof cmd, "%s quantize %s /tmp/kiln-never.gguf q9_9 2>&1", bin, out_path);
    p = popen(cmd, "r");
    CHECK(p && fgets(line, sizeof line, p));
    rc = pclose(p);
    CHECK(WEXITSTATUS(rc) == 1 && strncmp(line, "kiln: unknown quantization type 'q9_9'", 38) == 0, "%s", line);
}

static void test_requantize_and_errors(void) {
    /* an already-quantized file can be converted again (dequantize, quantize) */
    char again[64];
    snprintf(again, sizeof again, "/tmp/kiln-q-again-%d.gguf", (int)getpid());
    kiln_quantize_params qp = {.ftype = KILN_FTYPE_MOSTLY_Q8_0, .n_threads = 2};
    CHECK(kiln_quantize_file(out_path, again, &qp) == KILN_OK, "%s", kiln_last_error());
    kiln_gguf *g;
    CHECK(kiln_gguf_open(again, &g) == KILN_OK);
    CHECK(kiln_gguf_find_tensor(g, "output.weight")->type == KILN_TYPE_Q8_0);
    kiln_gguf_close(g);
    unlink(again);
    CHECK(kiln_quantize_file("/nonexistent.gguf", again, &qp) == KILN_ERR_IO);
    CHECK(strcmp(kiln_last_error(), "/nonexistent.gguf: cannot open: No such file or directory") == 0, "%s", kiln_last_error());
    kiln_synth_params bad = kiln_synth_default();
    bad.n_head = 7;
    CHECK(kiln_synth_llama(again, &bad) == KILN_ERR_INVALID);
    unlink(out_path);
    unlink(src_path);
}

int main(void) {
    RUN(test_mix_rules);
    RUN(test_quantize_file);
    RUN(test_quantize_refuses_bad_input);
    RUN(test_inspect_quantized);
    RUN(test_requantize_and_errors);
    TEST_EXIT();
}
