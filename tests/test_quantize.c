/* test_quantize.c: `kiln quantize` and `kiln synth`.
 * The mix rules are checked against a layer list written out by hand from llama.cpp's use_more_bits;
 * a synthetic model is quantized (1 and 2 threads give identical bytes), read back, its types and keys
 * checked and its weights compared with the source; the result round-trips through `kiln inspect`. */
#include "kiln.h"
#include "model/model.h"
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

/* A 16-layer model with untied head and GQA 2 (kiln_mix_model_read's facts of it). */
static const kiln_mix_model mix16 = {.n_layer = 16, .n_attn_v = 16, .n_gqa = 2};

static kiln_type choose(const char *name, int64_t ne0, kiln_ftype f, const kiln_mix_model *m, int rank) {
    kiln_tensor_view v = view(name, 2, ne0, 64);
    return kiln_quantize_choose_type(&v, f, m, rank);
}

/* Each case written out by hand from llama.cpp's llama_tensor_get_type_impl and tensor_type_fallback. */
static void test_mix_rules(void) {
    /* 16 layers: n/8 = 2, 7n/8 = 14, and (i - 2) % 3 == 2 adds 4, 7, 10, 13 */
    const int more_bits[16] = {1, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 1, 1};
    for (int i = 0; i < 16; i++) {
        kiln_type q4km = more_bits[i] ? KILN_TYPE_Q6_K : KILN_TYPE_Q4_K, q5km = more_bits[i] ? KILN_TYPE_Q6_K : KILN_TYPE_Q5_K;
        CHECK(choose("blk.x.attn_v.weight", 256, KILN_FTYPE_MOSTLY_Q4_K_M, &mix16, i) == q4km, "rank %d attn_v", i);
        CHECK(choose("blk.x.attn_qkv.weight", 256, KILN_FTYPE_MOSTLY_Q4_K_M, &mix16, i) == q4km, "rank %d fused qkv", i);
        CHECK(choose("blk.x.ffn_down.weight", 256, KILN_FTYPE_MOSTLY_Q5_K_M, &mix16, i) == q5km, "rank %d ffn_down", i);
        CHECK(choose("blk.x.attn_q.weight", 256, KILN_FTYPE_MOSTLY_Q4_K_M, &mix16, i) == KILN_TYPE_Q4_K);
        /* q4_k_s: attn_v of the first 4, ffn_down of the first n/8 = 2, in Q5_K */
        CHECK(choose("blk.x.attn_v.weight", 256, KILN_FTYPE_MOSTLY_Q4_K_S, &mix16, i) == (i < 4 ? KILN_TYPE_Q5_K : KILN_TYPE_Q4_K));
        CHECK(choose("blk.x.ffn_down.weight", 256, KILN_FTYPE_MOSTLY_Q4_K_S, &mix16, i) == (i < 2 ? KILN_TYPE_Q5_K : KILN_TYPE_Q4_K));
        /* q3_k_m: attn_v of the first 2 and ffn_down of the first n/16 = 1 in Q5_K, the others Q4_K */
        CHECK(choose("blk.x.attn_v.weight", 256, KILN_FTYPE_MOSTLY_Q3_K_M, &mix16, i) == (i < 2 ? KILN_TYPE_Q5_K : KILN_TYPE_Q4_K));
        CHECK(choose("blk.x.ffn_down.weight", 256, KILN_FTYPE_MOSTLY_Q3_K_M, &mix16, i) == (i < 1 ? KILN_TYPE_Q5_K : KILN_TYPE_Q4_K));
        /* iq4_xs: ffn_down of the first n/8 in Q5_K */
        CHECK(choose("blk.x.ffn_down.weight", 256, KILN_FTYPE_MOSTLY_IQ4_XS, &mix16, i) == (i < 2 ? KILN_TYPE_Q5_K : KILN_TYPE_IQ4_XS));
    }
    CHECK(choose("blk.0.attn_output.weight", 256, KILN_FTYPE_MOSTLY_Q3_K_M, &mix16, 0) == KILN_TYPE_Q4_K);
    CHECK(choose("blk.0.attn_output.weight", 256, KILN_FTYPE_MOSTLY_Q3_K_L, &mix16, 0) == KILN_TYPE_Q5_K);
    CHECK(choose("blk.0.attn_output.weight", 256, KILN_FTYPE_MOSTLY_Q3_K_S, &mix16, 0) == KILN_TYPE_Q3_K);
    CHECK(choose("blk.0.attn_v.weight", 256, KILN_FTYPE_MOSTLY_Q3_K_L, &mix16, 9) == KILN_TYPE_Q5_K);
    CHECK(choose("blk.0.ffn_down.weight", 256, KILN_FTYPE_MOSTLY_Q3_K_L, &mix16, 9) == KILN_TYPE_Q5_K);
    /* q2_k: attn_v by n_gqa (Q3_K below 4 KV-sharing heads, Q4_K from 4), ffn_down and attn_output Q3_K */
    kiln_mix_model gqa4 = mix16;
    gqa4.n_gqa = 4;
    CHECK(choose("blk.3.attn_v.weight", 256, KILN_FTYPE_MOSTLY_Q2_K, &mix16, 3) == KILN_TYPE_Q3_K);
    CHECK(choose("blk.3.attn_v.weight", 256, KILN_FTYPE_MOSTLY_Q2_K, &gqa4, 3) == KILN_TYPE_Q4_K);
    CHECK(choose("blk.3.ffn_down.weight", 256, KILN_FTYPE_MOSTLY_Q2_K, &mix16, 3) == KILN_TYPE_Q3_K);
    CHECK(choose("blk.3.attn_output.weight", 256, KILN_FTYPE_MOSTLY_Q2_K, &mix16, 3) == KILN_TYPE_Q3_K);
    CHECK(choose("blk.3.ffn_up.weight", 256, KILN_FTYPE_MOSTLY_Q2_K, &mix16, 3) == KILN_TYPE_Q2_K);
    CHECK(choose("blk.3.attn_v.weight", 256, KILN_FTYPE_MOSTLY_IQ4_NL, &gqa4, 3) == KILN_TYPE_Q5_K);
    CHECK(choose("blk.3.attn_v.weight", 256, KILN_FTYPE_MOSTLY_IQ4_NL, &mix16, 3) == KILN_TYPE_IQ4_NL);
    /* a 70B's attn_v: Q3_K and Q4_K become Q5_K, Q6_K stays */
    kiln_mix_model big = {.n_layer = 80, .n_attn_v = 80, .n_gqa = 8, .is_70b = true};
    CHECK(choose("blk.20.attn_v.weight", 8192, KILN_FTYPE_MOSTLY_Q4_K_M, &big, 20) == KILN_TYPE_Q5_K);
    CHECK(choose("blk.0.attn_v.weight", 8192, KILN_FTYPE_MOSTLY_Q4_K_M, &big, 0) == KILN_TYPE_Q6_K);
    CHECK(choose("blk.5.attn_v.weight", 8192, KILN_FTYPE_MOSTLY_Q3_K_S, &big, 5) == KILN_TYPE_Q5_K);
    /* rows of 576 (SmolLM2) hold 32-element blocks but not 256-element ones */
    const struct {
        kiln_ftype f;
        kiln_type want;
    } short_rows[] = {{KILN_FTYPE_MOSTLY_Q4_K_S, KILN_TYPE_Q5_0}, {KILN_FTYPE_MOSTLY_Q5_K_S, KILN_TYPE_Q5_1},
                      {KILN_FTYPE_MOSTLY_Q6_K, KILN_TYPE_Q8_0},   {KILN_FTYPE_MOSTLY_Q2_K, KILN_TYPE_Q4_0},
                      {KILN_FTYPE_MOSTLY_Q3_K_S, KILN_TYPE_Q4_0}, {KILN_FTYPE_MOSTLY_IQ4_XS, KILN_TYPE_IQ4_NL},
                      {KILN_FTYPE_MOSTLY_Q4_0, KILN_TYPE_Q4_0},   {KILN_FTYPE_MOSTLY_Q5_1, KILN_TYPE_Q5_1}};
    for (size_t i = 0; i < sizeof short_rows / sizeof short_rows[0]; i++)
        CHECK(choose("blk.0.attn_q.weight", 576, short_rows[i].f, &mix16, 0) == short_rows[i].want, "case %zu", i);
    CHECK(choose("blk.0.attn_v.weight", 576, KILN_FTYPE_MOSTLY_Q4_K_M, &mix16, 0) == KILN_TYPE_Q8_0, "Q6_K falls back to Q8_0");
    /* rows of 80 hold no block: F16 */
    CHECK(choose("blk.0.attn_q.weight", 80, KILN_FTYPE_MOSTLY_Q4_K_M, &mix16, 0) == KILN_TYPE_F16);
    CHECK(choose("blk.0.attn_q.weight", 80, KILN_FTYPE_MOSTLY_Q4_0, &mix16, 0) == KILN_TYPE_F16);
    /* the head: Q6_K, but Q8_0 in q8_0 and where its rows do not hold the base type's blocks */
    CHECK(choose("output.weight", 256, KILN_FTYPE_MOSTLY_Q4_K_M, &mix16, 0) == KILN_TYPE_Q6_K);
    CHECK(choose("output.weight", 576, KILN_FTYPE_MOSTLY_Q4_K_M, &mix16, 0) == KILN_TYPE_Q8_0);
    CHECK(choose("output.weight", 576, KILN_FTYPE_MOSTLY_Q4_0, &mix16, 0) == KILN_TYPE_Q8_0, "Q6_K, then the fallback");
    CHECK(choose("output.weight", 256, KILN_FTYPE_MOSTLY_Q4_0, &mix16, 0) == KILN_TYPE_Q6_K);
    CHECK(choose("output.weight", 256, KILN_FTYPE_MOSTLY_Q8_0, &mix16, 0) == KILN_TYPE_Q8_0);
    CHECK(choose("output.weight", 256, KILN_FTYPE_MOSTLY_F16, &mix16, 0) == KILN_TYPE_F16);
    CHECK(choose("output.weight", 256, KILN_FTYPE_MOSTLY_BF16, &mix16, 0) == KILN_TYPE_BF16);
    kiln_mix_model tied = mix16;
    tied.tied = true;
    CHECK(choose("token_embd.weight", 256, KILN_FTYPE_MOSTLY_Q4_K_M, &mix16, 0) == KILN_TYPE_Q4_K, "untied embedding");
    CHECK(choose("token_embd.weight", 256, KILN_FTYPE_MOSTLY_Q4_K_M, &tied, 0) == KILN_TYPE_Q6_K, "tied embedding");
    CHECK(choose("token_embd.weight", 576, KILN_FTYPE_MOSTLY_Q4_K_M, &mix16, 0) == KILN_TYPE_Q5_0, "untied, short rows");
    /* what llama.cpp never quantizes keeps its type: 1-D tensors, norms, biases, routers */
    kiln_tensor_view norm = view("blk.0.attn_norm.weight", 1, 256, 1), norm2 = view("blk.0.some_norm.weight", 2, 256, 4);
    kiln_tensor_view bias = view("blk.0.attn_q.bias", 2, 256, 4), router = view("blk.0.ffn_gate_inp.weight", 2, 256, 8);
    norm2.type = KILN_TYPE_F16;
    CHECK(kiln_quantize_choose_type(&norm, KILN_FTYPE_MOSTLY_Q4_K_M, &mix16, 0) == KILN_TYPE_F32);
    CHECK(kiln_quantize_choose_type(&norm2, KILN_FTYPE_MOSTLY_Q4_K_M, &mix16, 0) == KILN_TYPE_F16);
    CHECK(kiln_quantize_choose_type(&norm2, KILN_FTYPE_ALL_F32, &mix16, 0) == KILN_TYPE_F16);
    CHECK(kiln_quantize_choose_type(&bias, KILN_FTYPE_MOSTLY_Q8_0, &mix16, 0) == KILN_TYPE_F32);
    CHECK(kiln_quantize_choose_type(&router, KILN_FTYPE_MOSTLY_Q8_0, &mix16, 0) == KILN_TYPE_F32);
    kiln_tensor_view column = view("blk.0.attn_q.weight", 2, 256, 1); /* 2-D in the file, 1-D to ggml_n_dims */
    CHECK(kiln_quantize_choose_type(&column, KILN_FTYPE_MOSTLY_Q8_0, &mix16, 0) == KILN_TYPE_F32);
    kiln_ftype f;
    CHECK(kiln_ftype_from_name("Q4_K_M", &f) == KILN_OK && f == KILN_FTYPE_MOSTLY_Q4_K_M);
    CHECK(kiln_ftype_from_name("q3_k", &f) == KILN_OK && f == KILN_FTYPE_MOSTLY_Q3_K_M, "llama-quantize's alias");
    CHECK(kiln_ftype_from_name("IQ4_XS", &f) == KILN_OK && f == KILN_FTYPE_MOSTLY_IQ4_XS);
    CHECK(strcmp(kiln_ftype_name(KILN_FTYPE_MOSTLY_Q5_K_M), "q5_k_m") == 0, "the mix's name, not the alias q5_k");
    CHECK(kiln_ftype_from_name("q9_9", &f) == KILN_ERR_INVALID);
    CHECK(strcmp(kiln_last_error(), "unknown quantization type 'q9_9' (expected one of f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 "
                                    "q2_k q3_k_s q3_k_m q3_k_l q4_k_s q4_k_m q5_k_s q5_k_m q6_k iq4_nl iq4_xs)") == 0,
          "%s", kiln_last_error());
}

/* GGML's quantize_row_q5_0_ref on one block, worked by hand: the largest magnitude, -3.2, gives d = -3.2 / -16 = 0.2
 * and code 0; every code is trunc(x / d + 16.5), capped at 31. */
static void test_q5_0_quantizer(void) {
    float x[32] = {0};
    x[0] = -3.2f, x[1] = 3.0f, x[2] = 0.25f, x[17] = -1.0f, x[31] = 1.62f;
    block_q5_0 b;
    kiln_quantize_q5_0_ref(x, &b, 32);
    CHECK(fabsf(kiln_fp16_to_f32(b.d) - 0.2f) < 1e-4f, "d %g", kiln_fp16_to_f32(b.d));
    /* -3.2 -> 0.5 -> 0, 3.0 -> 31.5 -> 31, 0.25 -> 17.75 -> 17, -1.0 -> 11.5 -> 11, 1.62 -> 24.6 -> 24, 0 -> 16 */
    int want[32];
    for (int j = 0; j < 32; j++) want[j] = 16;
    want[0] = 0, want[1] = 31, want[2] = 17, want[17] = 11, want[31] = 24;
    uint32_t qh = (uint32_t)b.qh[0] | (uint32_t)b.qh[1] << 8 | (uint32_t)b.qh[2] << 16 | (uint32_t)b.qh[3] << 24;
    for (int j = 0; j < 32; j++) {
        int lo = j < 16 ? b.qs[j] & 0x0F : b.qs[j - 16] >> 4;
        int q = lo | (int)((qh >> j) & 1) << 4;
        CHECK(q == want[j], "element %d: code %d, want %d", j, q, want[j]);
    }
    float y[32];
    kiln_get_to_float(KILN_TYPE_Q5_0, KILN_SIMD_SCALAR)(&b, y, 32);
    CHECK(fabsf(y[0] + 3.2f) < 1e-3f && fabsf(y[1] - 3.0f) < 1e-3f, "%g %g", y[0], y[1]);
    CHECK(kiln_type_traits_get(KILN_TYPE_Q5_0)->from_float_ref == kiln_quantize_q5_0_ref, "kiln quantize writes q5_0");
}

/* The mix file: per source model and mix, llama-quantize's type for each tensor and its file size. */
typedef struct {
    char line[4096];
    FILE *f;
} ref_reader;

/* The next line that is not a comment, without its newline; false at the end. */
static bool ref_next(ref_reader *r) {
    while (fgets(r->line, sizeof r->line, r->f)) {
        r->line[strcspn(r->line, "\n")] = 0;
        if (r->line[0] && r->line[0] != '#') return true;
    }
    return false;
}

static const kiln_quantize_tensor *plan_find(const kiln_quantize_plan *p, const char *name) {
    for (int64_t i = 0; i < p->n_tensors; i++)
        if (strcmp(p->tensors[i].name, name) == 0) return &p->tensors[i];
    return NULL;
}

/* One tensor of the fixture against the plan: present, with llama-quantize's type. Returns false (and says why in
 * why[]) on a difference. */
static bool ref_tensor(const kiln_quantize_plan *p, const char *name, const char *type, char *why, size_t n) {
    const kiln_quantize_tensor *t = plan_find(p, name);
    if (!t) return snprintf(why, n, "%s: not in kiln's plan", name), false;
    if (strcmp(kiln_type_name(t->to), type) != 0)
        return snprintf(why, n, "%s: kiln %s, llama-quantize %s", name, kiln_type_name(t->to), type), false;
    return true;
}

/* A mix's tensor lines against the plan (names expanded from blk.*.SUFFIX TYPE*N runs); *covered counts them. A NULL
 * plan (the source is not cached) reads them off. */
static bool ref_mix(ref_reader *r, const kiln_quantize_plan *p, int64_t *covered, char *why, size_t n) {
    long pos = ftell(r->f);
    while (ref_next(r)) {
        if (strncmp(r->line, "mix ", 4) == 0 || strncmp(r->line, "mixdata ", 8) == 0 || strncmp(r->line, "model ", 6) == 0) {
            fseek(r->f, pos, SEEK_SET);
            return true;
        }
        pos = ftell(r->f);
        if (!p) continue;
        char name[256], *rest = strchr(r->line, ' ');
        if (!rest || rest - r->line >= (long)sizeof name) return snprintf(why, n, "bad line '%s'", r->line), false;
        memcpy(name, r->line, (size_t)(rest - r->line));
        name[rest - r->line] = 0;
        if (strncmp(name, "blk.*.", 6) != 0) {
            if (!ref_tensor(p, name, rest + 1, why, n)) return false;
            ++*covered;
            continue;
        }
        int layer = 0;
        for (char *run = strtok(rest + 1, " "); run; run = strtok(NULL, " ")) {
            char *star = strchr(run, '*');
            if (!star) return snprintf(why, n, "bad run '%s' of %s", run, name), false;
            *star = 0;
            for (int k = atoi(star + 1); k > 0; k--, layer++) {
                char full[300];
                snprintf(full, sizeof full, "blk.%d.%s", layer, name + 6);
                if (!ref_tensor(p, full, run, why, n)) return false;
                ++*covered;
            }
        }
    }
    return true;
}

static void cache_path(char *out, size_t n, const char *name) {
    const char *cache = getenv("KILN_CACHE"), *home = getenv("HOME");
    if (cache && *cache) snprintf(out, n, "%s/%s", cache, name);
    else snprintf(out, n, "%s/.cache/kiln/%s", home ? home : ".", name);
}

/* kiln's plan for every mix of the fixture's sources equals llama-quantize's types, tensor by tensor, and its size
 * (the file's, or the tensor data's where the fixture has llama-quantize's dry run) is within 1%. */
static void test_mix_matches_llama_cpp(void) {
    ref_reader r = {.f = fopen("tests/ref/quantize_mix_ref.txt", "r")};
    CHECK(r.f, "tests/ref/quantize_mix_ref.txt: cannot open (run from the repository root)");
    char model[512] = "", missing[512] = "", why[512] = "";
    int n_mixes = 0;
    double worst = 0;
    bool ok = true;
    while (ok && ref_next(&r)) {
        char name[256];
        unsigned long long bytes;
        if (sscanf(r.line, "model %255s %llu", name, &bytes) == 2) {
            cache_path(model, sizeof model, name);
            struct stat st;
            if (stat(model, &st) != 0 || (unsigned long long)st.st_size != bytes) {
                snprintf(missing, sizeof missing, "%s (tests/ref/fetch_models.sh fetches it)", model);
                model[0] = 0;
            }
            continue;
        }
        double mib = 0; /* mixdata: llama-quantize --dry-run's size of the tensor data, in MiB */
        if (sscanf(r.line, "mix %255s %llu", name, &bytes) != 2 && sscanf(r.line, "mixdata %255s %lf", name, &mib) != 2) {
            ok = false;
            snprintf(why, sizeof why, "unexpected line '%s'", r.line);
            break;
        }
        if (!model[0]) {
            int64_t none = 0;
            ref_mix(&r, NULL, &none, why, sizeof why);
            continue;
        }
        kiln_ftype f;
        kiln_quantize_plan p;
        CHECK(kiln_ftype_from_name(name, &f) == KILN_OK, "%s", kiln_last_error());
        CHECK(kiln_quantize_plan_make(model, f, &p) == KILN_OK, "%s", kiln_last_error());
        int64_t covered = 0;
        ok = ref_mix(&r, &p, &covered, why, sizeof why);
        if (ok && covered != p.n_tensors) {
            ok = false;
            snprintf(why, sizeof why, "%lld of kiln's %lld tensors in the fixture", (long long)covered, (long long)p.n_tensors);
        }
        uint64_t data = 0;
        for (int64_t i = 0; i < p.n_tensors; i++) data += p.tensors[i].bytes;
        double got = mib ? (double)data / (1 << 20) : (double)p.file_bytes, want = mib ? mib : (double)bytes;
        double rel = fabs(got - want) / want;
        if (ok && rel > 0.01) {
            ok = false;
            snprintf(why, sizeof why, "%s %.2f, llama-quantize's %.2f", mib ? "tensor MiB" : "file bytes", got, want);
        }
        if (rel > worst) worst = rel;
        kiln_quantize_plan_free(&p);
        if (!ok) {
            char tmp[600];
            snprintf(tmp, sizeof tmp, "%s %s: %s", model, name, why);
            snprintf(why, sizeof why, "%s", tmp);
        }
        n_mixes++;
    }
    fclose(r.f);
    CHECK(ok, "%s", why);
    if (!n_mixes) SKIP("%s missing", missing);
    printf("  %d mixes match llama-quantize's types; sizes within %.3f%%%s%s\n", n_mixes, 100 * worst, missing[0] ? "; skipped " : "",
           missing);
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

/* `kiln quantize --dry-run` prints each tensor's type and the plan's exact size, writing nothing; a real run to a
 * file that is not a terminal prints one plain line per tensor (no \r) and a summary with the mix and the size. */
static void test_quantize_cli(void) {
    const char *bin = getenv("KILN_BIN");
    if (!bin) SKIP("KILN_BIN not set (make test sets it)");
    char cmd[1024], line[512], dst[64], log[64];
    snprintf(dst, sizeof dst, "/tmp/kiln-q-cli-%d.gguf", (int)getpid());
    snprintf(log, sizeof log, "/tmp/kiln-q-cli-%d.log", (int)getpid());
    kiln_quantize_plan plan;
    CHECK(kiln_quantize_plan_make(src_path, KILN_FTYPE_MOSTLY_Q4_K_M, &plan) == KILN_OK, "%s", kiln_last_error());
    snprintf(cmd, sizeof cmd, "%s quantize %s %s --type q4_k_m --dry-run", bin, src_path, dst);
    FILE *p = popen(cmd, "r");
    CHECK(p);
    int rows = 0, q6 = 0, size_ok = 0, mix_ok = 0;
    char want_size[64], want_mix[128];
    snprintf(want_size, sizeof want_size, "size: %llu bytes", (unsigned long long)plan.file_bytes);
    snprintf(want_mix, sizeof want_mix, "tensors: %lld f32, %lld q4_K, %lld q6_K", (long long)plan.n_of_type[KILN_TYPE_F32],
             (long long)plan.n_of_type[KILN_TYPE_Q4_K], (long long)plan.n_of_type[KILN_TYPE_Q6_K]);
    while (fgets(line, sizeof line, p)) {
        rows += strstr(line, " -> ") != NULL;
        q6 += strstr(line, "-> q6_K") != NULL;
        size_ok += strncmp(line, want_size, strlen(want_size)) == 0;
        mix_ok += strstr(line, want_mix) != NULL;
    }
    int rc = pclose(p);
    struct stat st;
    CHECK(WIFEXITED(rc) && WEXITSTATUS(rc) == 0 && stat(dst, &st) != 0, "the dry run failed or wrote %s", dst);
    CHECK(rows == plan.n_tensors && q6 == 17 && size_ok == 1 && mix_ok == 1, "rows %d, q6_K %d, '%s' %d, '%s' %d", rows, q6, want_size,
          size_ok, want_mix, mix_ok);
    snprintf(cmd, sizeof cmd, "%s quantize %s %s --type q4_k_m -t 2 2>%s", bin, src_path, dst, log);
    rc = system(cmd);
    CHECK(WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "kiln quantize failed");
    CHECK(stat(dst, &st) == 0 && (uint64_t)st.st_size == plan.file_bytes, "the file has %lld bytes, the plan %llu",
          (long long)st.st_size, (unsigned long long)plan.file_bytes);
    FILE *f = fopen(log, "r");
    CHECK(f);
    int lines = 0, cr = 0, summary = 0;
    int c, prev = '\n';
    while ((c = fgetc(f)) != EOF) cr += c == '\r', lines += c == '\n', prev = c;
    rewind(f);
    while (fgets(line, sizeof line, f)) summary += strncmp(line, "kiln: wrote ", 12) == 0 && strstr(line, want_mix + 9);
    fclose(f);
    CHECK(cr == 0 && prev == '\n' && lines == plan.n_tensors + 1 && summary == 1, "%d \\r, %d lines for %lld tensors, summary %d",
          cr, lines, (long long)plan.n_tensors, summary);
    kiln_quantize_plan_free(&plan);
    unlink(dst);
    unlink(log);
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

/* A copy of the F32 model src with blk.0.attn_q.weight stored as type t (zero blocks). */
static bool write_with_type(const char *src, const char *dst, kiln_type t) {
    kiln_gguf *g;
    kiln_gguf_writer *w;
    if (kiln_gguf_open(src, &g) || kiln_gguf_writer_new(&w)) return false;
    bool ok = kiln_gguf_writer_copy_kv(w, g, NULL) == KILN_OK;
    void *zeros = NULL;
    for (int64_t i = 0; ok && i < kiln_gguf_n_tensors(g); i++) {
        const kiln_tensor_view *v = kiln_gguf_tensor_at(g, i);
        if (strcmp(v->name, "blk.0.attn_q.weight") == 0) {
            zeros = calloc(kiln_type_row_bytes(t, v->ne[0]), (size_t)v->ne[1]);
            ok = zeros && kiln_gguf_writer_add_tensor(w, v->name, t, v->n_dims, v->ne, zeros) == KILN_OK;
        } else {
            ok = kiln_gguf_writer_add_tensor(w, v->name, v->type, v->n_dims, v->ne, v->data) == KILN_OK;
        }
    }
    ok = ok && kiln_gguf_writer_write_file(w, dst) == KILN_OK;
    free(zeros);
    kiln_gguf_writer_free(w);
    kiln_gguf_close(g);
    return ok;
}

/* The output of `kiln inspect path`, in out[n]; false when it fails. */
static bool inspect_output(const char *bin, const char *path, char *out, size_t n) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s inspect %s 2>&1", bin, path);
    FILE *p = popen(cmd, "r");
    if (!p) return false;
    size_t got = fread(out, 1, n - 1, p);
    out[got] = 0;
    return pclose(p) == 0;
}

/* A weight of a type kiln cannot run: the load names the types it runs and the command that converts the file, and
 * `kiln inspect` says the same; for a type kiln cannot even dequantize (iq2_xxs) both point at the model's F16 file.
 * q8_K stands for a type kiln reads but does not run (it has no dot product as a weight). */
static void test_unrunnable_types(void) {
    char f32[64], q8k[64], iq2[64], want[512], out[1 << 16];
    snprintf(f32, sizeof f32, "/tmp/kiln-q-run-%d.gguf", (int)getpid());
    snprintf(q8k, sizeof q8k, "/tmp/kiln-q-q8k-%d.gguf", (int)getpid());
    snprintf(iq2, sizeof iq2, "/tmp/kiln-q-iq2-%d.gguf", (int)getpid());
    kiln_synth_params sp = kiln_synth_default();
    sp.n_vocab = 300, sp.n_layer = 1, sp.n_ff = 512, sp.n_embd = 256, sp.n_head = 4, sp.n_head_kv = 2, sp.n_threads = 2;
    CHECK(kiln_synth_llama(f32, &sp) == KILN_OK, "%s", kiln_last_error());
    CHECK(write_with_type(f32, q8k, KILN_TYPE_Q8_K) && write_with_type(f32, iq2, KILN_TYPE_IQ2_XXS), "%s", kiln_last_error());
    kiln_model *m = NULL;
    CHECK(kiln_model_load(q8k, &m) == KILN_ERR_UNSUPPORTED);
    snprintf(want, sizeof want, "%s: tensor 'blk.0.attn_q.weight' has type q8_K, which kiln cannot run (it runs %s); convert the file "
             "with `kiln quantize %s OUT.gguf --type q4_k_m`", q8k, kiln_runnable_type_names(), q8k);
    CHECK(strcmp(kiln_last_error(), want) == 0, "\n  got:  %s\n  want: %s", kiln_last_error(), want);
    /* the list: every type with a dot product, and not the activation types q8_1 and q8_K */
    char list[300];
    snprintf(list, sizeof list, " %s ", kiln_runnable_type_names());
    const char *runs[] = {" f32 ", " f16 ", " bf16 ", " q4_0 ", " q4_1 ", " q5_0 ", " q8_0 ", " q4_K ", " q5_K ", " q6_K "};
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) CHECK(strstr(list, runs[i]), "%s not in '%s'", runs[i], list);
    CHECK(!strstr(list, " q8_K ") && !strstr(list, " q8_1 ") && !strstr(list, " iq2_xxs "), "%s", list);
    CHECK(kiln_model_load(iq2, &m) == KILN_ERR_UNSUPPORTED);
    CHECK(strstr(kiln_last_error(), "has type iq2_xxs, which kiln cannot run (it runs f32 f16 ") &&
              strstr(kiln_last_error(), "; kiln cannot read it either: convert the model's F16 or BF16 GGUF with `kiln quantize "
                                         "MODEL-F16.gguf OUT.gguf --type q4_k_m`"),
          "%s", kiln_last_error());
    const char *bin = getenv("KILN_BIN");
    if (bin) {
        CHECK(inspect_output(bin, q8k, out, sizeof out), "%s", out);
        snprintf(want, sizeof want, "\nkiln cannot run 1 of these tensors: q8_K (1); it runs %s\nconvert the file with: kiln quantize %s "
                 "OUT.gguf --type q4_k_m\n", kiln_runnable_type_names(), q8k);
        CHECK(strstr(out, want), "inspect printed:\n%s", out + (strlen(out) > 600 ? strlen(out) - 600 : 0));
        CHECK(inspect_output(bin, iq2, out, sizeof out), "%s", out);
        CHECK(strstr(out, "\nkiln cannot run 1 of these tensors: iq2_xxs (1); it runs ") &&
                  strstr(out, "kiln cannot read them to convert them; convert the model's F16 file with: kiln quantize MODEL-F16.gguf "
                              "OUT.gguf --type q4_k_m\n"),
              "%s", out + (strlen(out) > 600 ? strlen(out) - 600 : 0));
        CHECK(inspect_output(bin, f32, out, sizeof out) && !strstr(out, "cannot run"), "a runnable file gets the note");
    }
    /* the advice holds: the q8_K file converts, and the result loads */
    kiln_quantize_params qp = {.ftype = KILN_FTYPE_MOSTLY_Q4_K_M, .n_threads = 2};
    CHECK(kiln_quantize_file(q8k, f32, &qp) == KILN_OK, "%s", kiln_last_error());
    CHECK(kiln_model_load(f32, &m) == KILN_OK, "%s", kiln_last_error());
    kiln_model_free(m);
    /* the iq2_xxs one does not: refused before anything is written */
    CHECK(kiln_quantize_file(iq2, f32, &qp) == KILN_ERR_UNSUPPORTED);
    snprintf(want, sizeof want, "%s: tensor 'blk.0.attn_q.weight' is iq2_xxs, which kiln cannot dequantize to convert it", iq2);
    CHECK(strcmp(kiln_last_error(), want) == 0, "%s", kiln_last_error());
    unlink(f32);
    unlink(q8k);
    unlink(iq2);
    if (!bin) SKIP("KILN_BIN not set: kiln inspect not run (make test sets it)");
}

/* synth with qk_norm: a qwen3 file (its keys, key_length, the per-head norm weights) that loads as Qwen3. */
static void test_synth_qwen3(void) {
    char path[64];
    snprintf(path, sizeof path, "/tmp/kiln-q-qwen3-%d.gguf", (int)getpid());
    kiln_synth_params sp = kiln_synth_default();
    sp.n_vocab = 300, sp.n_layer = 2, sp.n_embd = 256, sp.n_head = 2, sp.n_head_kv = 1, sp.n_ff = 512, sp.n_threads = 2;
    sp.qk_norm = true;
    CHECK(kiln_synth_llama(path, &sp) == KILN_OK, "%s", kiln_last_error());
    kiln_gguf *g = NULL;
    CHECK(kiln_gguf_open(path, &g) == KILN_OK, "%s", kiln_last_error());
    kiln_str arch = {0};
    uint32_t key_length = 0;
    CHECK(kiln_gguf_get_str(g, "general.architecture", &arch) == KILN_OK && arch.len == 5 && memcmp(arch.ptr, "qwen3", 5) == 0);
    CHECK(kiln_gguf_get_u32(g, "qwen3.attention.key_length", &key_length) == KILN_OK && key_length == 128, "%u", key_length);
    CHECK(!kiln_gguf_find(g, "llama.block_count"), "llama keys in a qwen3 file");
    for (int l = 0; l < 2; l++) {
        char qn[48], kn[48];
        snprintf(qn, sizeof qn, "blk.%d.attn_q_norm.weight", l), snprintf(kn, sizeof kn, "blk.%d.attn_k_norm.weight", l);
        const kiln_tensor_view *q = kiln_gguf_find_tensor(g, qn), *k = kiln_gguf_find_tensor(g, kn);
        CHECK(q && k && q->ne[0] == 128 && k->ne[0] == 128 && q->type == KILN_TYPE_F32, "layer %d's QK-norm weights", l);
    }
    kiln_gguf_close(g);
    kiln_model *m = NULL;
    CHECK(kiln_model_load(path, &m) == KILN_OK, "%s", kiln_last_error());
    if (m) {
        CHECK(m->cfg.qk_norm && !m->cfg.qk_norm_full && m->cfg.rope_neox && m->cfg.head_dim == 128 && m->cfg.rms_eps == 1e-6f,
              "qk_norm %d full %d neox %d HS %lld eps %g", m->cfg.qk_norm, m->cfg.qk_norm_full, m->cfg.rope_neox,
              (long long)m->cfg.head_dim, (double)m->cfg.rms_eps);
        CHECK(m->layers[1].q_norm && m->layers[1].k_norm, "the model has no QK-norm weights");
        kiln_model_free(m);
    }
    unlink(path);
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
    RUN(test_q5_0_quantizer);
    RUN(test_mix_matches_llama_cpp);
    RUN(test_quantize_file);
    RUN(test_quantize_refuses_bad_input);
    RUN(test_inspect_quantized);
    RUN(test_quantize_cli);
    RUN(test_unrunnable_types);
    RUN(test_synth_qwen3);
    RUN(test_requantize_and_errors);
    TEST_EXIT();
}
