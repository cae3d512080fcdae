/* test_smollm.c: kiln's forward on a real model, SmolLM2-135M-Instruct Q4_1, against golden logits from an
 * independent float64 numpy forward (tests/ref/llama_ref.py: gguf's dequantizer, HF tokenizers' ids).
 * tests/ref/smollm2_golden.txt holds, for 3 prompts of 32 positions, the token ids, the top-5 logits and the RMS
 * of all logits per position, and the perplexity of 256 tokens of tinyshakespeare; smollm2_logits_f16.bin holds
 * all logits at one position. The model is not in the repository: `bash tests/ref/fetch_models.sh` puts it in
 * KILN_CACHE (default ~/.cache/kiln), and every test here skips while it is absent. Run from the repo root. */
#include "kiln.h"
#include "fp16.h"
#include "test.h"

#include <errno.h>
#include <stdint.h>
#include <sys/stat.h>

#define GOLDEN_PATH "tests/ref/smollm2_golden.txt"
#define MODEL_NAME "smollm2-135m-instruct-q4_1.gguf"
#define MODEL_SIZE 98362432LL /* fetch_models.sh checks the sha256 too; here the size catches a wrong file */
#define MAX_PROMPTS 4
#define MAX_POS 32
#define MAX_PPL 512
#define TOP_K 5
#define N_CTX 512

/* Bounds. kiln rounds the input of every quantized matmul to 8 bits (Q8_1/Q8_K-style blocks of 32 or 256 with one
 * scale) and keeps K and V in f16; the reference does neither. Over 30 layers that noise moves a logit by up to ~1
 * (0.03 of the logits' spread on average, more at the few positions whose hidden state sits near a decision).
 * `llama_ref.py --error-model` runs the reference with exactly that rounding (ggml's Q8 block rule) and scores it on
 * the measures below: it lands where kiln does, so kiln's error is the rounding and not its forward. A bug lands
 * 10-30x further out: the same reference with the NeoX RoPE layout scores the numbers in the last column.
 *
 *                                     kiln: scalar / AVX2 / AVX-512   8-bit emulation   bound   NeoX RoPE
 *   top-5 logit error                     0.0232 / 0.0245 / 0.0240         0.0245        0.05     0.446
 *   max per-position logit RMS error      0.0709 / 0.0930 / 0.0930         0.0862        0.20     3.26
 *   all-logit error at one position       0.0320 / 0.0158 / 0.0510         0.0203        0.08     0.832
 *   max change of top1-top2 margin        0.506 (AVX-512)                  0.735         (1.0)    13.4
 *   perplexity vs reference               -0.06% / +0.61% / +0.30%         -0.15%        1.5%     +489%
 * (AVX-512 runs the repacked int8 kernels of src/cpu/gemm_repack_avx512.c, which quantize activations in their own
 * row format; the rounding differs from the vec_dot path's, so the single position moves within the same noise.
 * Its bound is 0.08: 1.6x the largest value, as the 0.06 of 2x the old 0.032 had too little room for it.)
 *
 * top-5 logit error: RMS over positions and the reference's top-5 ids of kiln - reference, over the RMS of all
 * logits. Logit RMS error: |RMS(kiln) - RMS(ref)| / RMS(ref) over all V logits of a position. All-logit error:
 * ||kiln - ref|| / ||ref|| at the position the f16 file holds (f16 storage adds 2^-11 relative). Top-1 is compared
 * only where the reference's top1-top2 margin exceeds TOP1_MARGIN: the rounding moves the margin by up to 0.74
 * (and flips position 9 of prompt 0, margin 0.22, in both kiln and the emulation), so 1.0 logit; 58 of the 96
 * positions qualify. Each bound is about 2x the largest value measured (KILN_SIMD picks the level). */
#define TOP1_MARGIN 1.0
#define TOP5_ERR_MAX 0.05
#define RMS_ERR_MAX 0.20
#define FULL_ERR_MAX 0.08
#define PPL_REL_MAX 0.015

typedef struct golden_pos {
    float rms;            /* RMS of all V logits */
    int32_t id[TOP_K];    /* top-5 ids, best first */
    float logit[TOP_K];
} golden_pos;

typedef struct golden_prompt {
    char text[512];       /* UTF-8, encoded with parse_special and no BOS */
    size_t text_len;
    int32_t prompt_ids[MAX_POS];
    int n_prompt;
    int32_t ids[MAX_POS]; /* the prompt, then the reference's greedy continuation */
    int n_ids;
    golden_pos pos[MAX_POS];
    int n_pos;
} golden_prompt;

typedef struct golden {
    char model_sha256[80];
    int64_t n_vocab;
    golden_prompt prompt[MAX_PROMPTS];
    int n_prompts;
    char full_file[128];  /* all logits, f16, at position full_pos of prompt full_prompt */
    int full_prompt, full_pos;
    char ppl_corpus[256]; /* relative to the shared data folder */
    int ppl_n;
    long ppl_bytes;
    double ppl;
    int32_t ppl_ids[MAX_PPL];
    int n_ppl_ids;
} golden;

static golden G;
static char golden_error[512];  /* non-empty: the fixture is broken, every test fails */
static char model_path[1024];
static char skip_reason[1400];  /* non-empty: no model, every test skips */
static kiln_model *model;
static int64_t V;
static float *kiln_logits[MAX_PROMPTS]; /* n_ids x V per prompt, computed once */
static char eval_error[512];

/* ---------------------------------------------------------------- fixture */

/* Parses "N v1 ... vN" into out (cap entries). */
static bool parse_ids(const char *s, int32_t *out, int cap, int *n) {
    char *end;
    long cnt = strtol(s, &end, 10);
    if (end == s || cnt < 0 || cnt > cap) return false;
    for (long i = 0; i < cnt; i++) {
        s = end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 0 || v > INT32_MAX) return false;
        out[i] = (int32_t)v;
    }
    *n = (int)cnt;
    return true;
}

static int hexval(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

static bool parse_line(char *line) {
    char *nl = strchr(line, '\n');
    if (nl) *nl = 0;
    if (line[0] == '#' || line[0] == 0) return true;
    char *sp = strchr(line, ' ');
    if (!sp) return false;
    *sp = 0;
    const char *key = line, *val = sp + 1;
    golden_prompt *p = G.n_prompts ? &G.prompt[G.n_prompts - 1] : NULL;
    if (!strcmp(key, "format")) return !strcmp(val, "kiln-golden-1");
    if (!strcmp(key, "model_sha256")) return snprintf(G.model_sha256, sizeof G.model_sha256, "%s", val) > 0;
    if (!strcmp(key, "n_vocab")) return (G.n_vocab = strtoll(val, NULL, 10)) > 0;
    if (!strcmp(key, "top_k")) return atoi(val) == TOP_K;
    if (!strcmp(key, "prompt")) {
        if (G.n_prompts == MAX_PROMPTS) return false;
        p = &G.prompt[G.n_prompts++];
        size_t n = strlen(val);
        if (n % 2 || n / 2 >= sizeof p->text) return false;
        for (size_t i = 0; i < n / 2; i++) {
            int hi = hexval(val[2 * i]), lo = hexval(val[2 * i + 1]);
            if (hi < 0 || lo < 0) return false;
            p->text[i] = (char)(hi * 16 + lo);
        }
        p->text_len = n / 2;
        return true;
    }
    if (!strcmp(key, "prompt_ids")) return p && parse_ids(val, p->prompt_ids, MAX_POS, &p->n_prompt);
    if (!strcmp(key, "ids")) return p && parse_ids(val, p->ids, MAX_POS, &p->n_ids);
    if (!strcmp(key, "pos")) {
        if (!p || p->n_pos >= p->n_ids) return false;
        golden_pos *g = &p->pos[p->n_pos];
        char *end;
        if (strtol(val, &end, 10) != p->n_pos) return false;
        g->rms = strtof(end, &end);
        for (int j = 0; j < TOP_K; j++) {
            g->id[j] = (int32_t)strtol(end, &end, 10);
            g->logit[j] = strtof(end, &end);
        }
        p->n_pos++;
        return g->rms > 0;
    }
    if (!strcmp(key, "full_logits"))
        return sscanf(val, "%127s %d %d", G.full_file, &G.full_prompt, &G.full_pos) == 3;
    if (!strcmp(key, "ppl_corpus")) return snprintf(G.ppl_corpus, sizeof G.ppl_corpus, "%s", val) > 0;
    if (!strcmp(key, "ppl")) return sscanf(val, "%d %ld %lf", &G.ppl_n, &G.ppl_bytes, &G.ppl) == 3;
    if (!strcmp(key, "ppl_ids")) return parse_ids(val, G.ppl_ids, MAX_PPL, &G.n_ppl_ids);
    return true; /* provenance keys (model, versions) are for people */
}

static void load_golden(void) {
    FILE *f = fopen(GOLDEN_PATH, "r");
    if (!f) {
        snprintf(golden_error, sizeof golden_error, "%s: %s (run from the repo root)", GOLDEN_PATH, strerror(errno));
        return;
    }
    static char line[16384];
    int ln = 0;
    while (fgets(line, sizeof line, f)) {
        ln++;
        if (!parse_line(line)) {
            snprintf(golden_error, sizeof golden_error, "%s:%d: malformed line", GOLDEN_PATH, ln);
            break;
        }
    }
    fclose(f);
    if (golden_error[0]) return;
    bool ok = G.n_vocab > 0 && G.n_prompts > 0 && G.full_file[0] && G.full_prompt < G.n_prompts &&
              G.n_ppl_ids == G.ppl_n && G.ppl_n > 1 && G.ppl > 1;
    for (int i = 0; i < G.n_prompts; i++)
        ok = ok && G.prompt[i].n_pos == G.prompt[i].n_ids && G.prompt[i].n_prompt <= G.prompt[i].n_ids;
    ok = ok && G.full_pos < G.prompt[G.full_prompt].n_ids;
    if (!ok) snprintf(golden_error, sizeof golden_error, "%s: incomplete (a key or a position is missing)", GOLDEN_PATH);
}

/* ---------------------------------------------------------------- model */

static void load_model(void) {
    const char *cache = getenv("KILN_CACHE");
    const char *home = getenv("HOME");
    if (cache && *cache)
        snprintf(model_path, sizeof model_path, "%s/%s", cache, MODEL_NAME);
    else
        snprintf(model_path, sizeof model_path, "%s/.cache/kiln/%s", home ? home : ".", MODEL_NAME);
    struct stat st;
    if (stat(model_path, &st) != 0) {
        snprintf(skip_reason, sizeof skip_reason, "%s not found (run `bash tests/ref/fetch_models.sh`)", model_path);
        return;
    }
    if (st.st_size != MODEL_SIZE) {
        snprintf(golden_error, sizeof golden_error, "%s has %lld bytes, expected %lld (remove it and rerun "
                 "tests/ref/fetch_models.sh)", model_path, (long long)st.st_size, MODEL_SIZE);
        return;
    }
    if (kiln_model_load(model_path, &model) != KILN_OK) {
        snprintf(golden_error, sizeof golden_error, "kiln_model_load: %s", kiln_last_error());
        return;
    }
    V = kiln_model_n_vocab(model);
}

/* All logits of ids from position 0 in a fresh session; NULL with eval_error set on failure. */
static float *eval_all(const int32_t *ids, int n) {
    kiln_session *s = NULL;
    kiln_session_params sp = {.n_ctx = N_CTX};
    float *out = malloc((size_t)n * (size_t)V * sizeof *out);
    kiln_status st = out ? kiln_session_new(model, &sp, &s) : KILN_ERR_NOMEM;
    if (st == KILN_OK) st = kiln_session_eval(s, ids, (size_t)n, NULL, out);
    if (st != KILN_OK) {
        snprintf(eval_error, sizeof eval_error, "%s: %s", kiln_status_name(st), kiln_last_error());
        free(out);
        out = NULL;
    }
    kiln_session_free(s);
    return out;
}

static float *prompt_logits(int i) {
    if (!kiln_logits[i]) kiln_logits[i] = eval_all(G.prompt[i].ids, G.prompt[i].n_ids);
    return kiln_logits[i];
}

/* Fails on a broken fixture or model, skips when the model is absent. */
#define REQUIRE_MODEL()                                   \
    do {                                                  \
        CHECK(!golden_error[0], "%s", golden_error);      \
        if (skip_reason[0]) SKIP("%s", skip_reason);      \
        CHECK(V == G.n_vocab, "model V %lld, fixture %lld", (long long)V, (long long)G.n_vocab); \
    } while (0)

static bool same_ids(const kiln_tokens *t, const int32_t *want, int n) {
    if (t->n != (size_t)n) return false;
    for (int i = 0; i < n; i++)
        if (t->ids[i] != want[i]) return false;
    return true;
}

/* ---------------------------------------------------------------- tests */

/* kiln's tokenizer gives the reference's ids for the prompts and, when the shared corpus is there, the
 * perplexity window. */
static void test_smollm_tokenizer(void) {
    REQUIRE_MODEL();
    const kiln_tokenizer *tok = kiln_model_tokenizer(model);
    CHECK(tok != NULL);
    for (int i = 0; i < G.n_prompts; i++) {
        const golden_prompt *p = &G.prompt[i];
        kiln_tokens t = {0};
        kiln_status st = kiln_tokenizer_encode(tok, p->text, p->text_len, false, true, &t);
        bool same = st == KILN_OK && same_ids(&t, p->prompt_ids, p->n_prompt);
        size_t n = t.n;
        kiln_tokens_free(&t);
        CHECK(same, "prompt %d (%.*s): %s, %zu ids, reference %d", i, (int)p->text_len, p->text,
              kiln_status_name(st), n, p->n_prompt);
    }
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", test_data_dir(), G.ppl_corpus);
    FILE *f = fopen(path, "rb");
    if (!f) {
        printf("# %s absent: perplexity window ids not re-tokenized\n", path);
        return;
    }
    char *text = malloc((size_t)G.ppl_bytes);
    size_t got = text ? fread(text, 1, (size_t)G.ppl_bytes, f) : 0;
    fclose(f);
    kiln_tokens t = {0};
    kiln_status st = got == (size_t)G.ppl_bytes ? kiln_tokenizer_encode(tok, text, got, false, true, &t) : KILN_ERR_IO;
    free(text);
    bool same = st == KILN_OK && t.n >= (size_t)G.ppl_n;
    for (int i = 0; same && i < G.ppl_n; i++) same = t.ids[i] == G.ppl_ids[i];
    kiln_tokens_free(&t);
    CHECK(same, "first %d ids of the first %ld bytes of %s differ from the reference's (%s)", G.ppl_n, G.ppl_bytes,
          path, kiln_status_name(st));
}

/* Top-1 where the reference is decided, top-5 logits and per-position logit RMS, over all prompts. */
static void test_smollm_logits(void) {
    REQUIRE_MODEL();
    double se_top = 0, ss_rms = 0, rms_err_max = 0;
    int n_top = 0, n_pos = 0, n_top1 = 0;
    for (int i = 0; i < G.n_prompts; i++) {
        const golden_prompt *p = &G.prompt[i];
        const float *z = prompt_logits(i);
        CHECK(z != NULL, "prompt %d: %s", i, eval_error);
        for (int t = 0; t < p->n_ids; t++) {
            const float *zt = z + (size_t)t * (size_t)V;
            const golden_pos *g = &p->pos[t];
            int64_t best = 0;
            double ss = 0;
            for (int64_t v = 0; v < V; v++) {
                if (zt[v] > zt[best]) best = v;
                ss += (double)zt[v] * zt[v];
            }
            for (int64_t v = 0; v < V; v++) CHECK(isfinite(zt[v]), "prompt %d pos %d: logit %lld is %g", i, t, (long long)v, zt[v]);
            if (g->logit[0] - g->logit[1] > TOP1_MARGIN) {
                CHECK(best == g->id[0], "prompt %d pos %d: kiln's top-1 is %lld (%.4f), the reference's %d (%.4f; kiln %.4f, "
                      "margin %.4f)", i, t, (long long)best, zt[best], g->id[0], g->logit[0], zt[g->id[0]],
                      g->logit[0] - g->logit[1]);
                n_top1++;
            }
            for (int j = 0; j < TOP_K; j++) {
                double d = (double)zt[g->id[j]] - g->logit[j];
                se_top += d * d;
                n_top++;
            }
            double rms = sqrt(ss / (double)V);
            rms_err_max = fmax(rms_err_max, fabs(rms - g->rms) / g->rms);
            ss_rms += (double)g->rms * g->rms;
            n_pos++;
        }
    }
    double top_err = sqrt(se_top / n_top) / sqrt(ss_rms / n_pos);
    printf("# top-1 equal at %d decided positions of %d; top-5 logit error %.4f (bound %.2f), logit RMS error %.4f "
           "(bound %.2f)\n", n_top1, n_pos, top_err, TOP5_ERR_MAX, rms_err_max, RMS_ERR_MAX);
    CHECK(top_err < TOP5_ERR_MAX, "top-5 logit error %.4f", top_err);
    CHECK(rms_err_max < RMS_ERR_MAX, "logit RMS error %.4f", rms_err_max);
}

/* All V logits at one position against the reference's, stored as f16 (relative rounding 2^-11, far below the
 * bound). */
static void test_smollm_full_logits(void) {
    REQUIRE_MODEL();
    char path[256];
    snprintf(path, sizeof path, "tests/ref/%s", G.full_file);
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL, "%s: %s", path, strerror(errno));
    kiln_fp16 *h = malloc((size_t)V * sizeof *h);
    size_t got = h ? fread(h, sizeof *h, (size_t)V, f) : 0;
    int extra = fgetc(f);
    fclose(f);
    if (got != (size_t)V || extra != EOF) free(h);
    CHECK(got == (size_t)V && extra == EOF, "%s: expected exactly %lld f16 logits", path, (long long)V);
    const float *z = prompt_logits(G.full_prompt);
    if (!z) free(h);
    CHECK(z != NULL, "prompt %d: %s", G.full_prompt, eval_error);
    z += (size_t)G.full_pos * (size_t)V;
    double se = 0, ss = 0;
    for (int64_t v = 0; v < V; v++) {
        double r = kiln_fp16_to_f32(h[v]);
        se += (z[v] - r) * (z[v] - r);
        ss += r * r;
    }
    free(h);
    double err = sqrt(se / ss);
    printf("# all %lld logits at prompt %d position %d: relative error %.4f (bound %.2f)\n", (long long)V,
           G.full_prompt, G.full_pos, err, FULL_ERR_MAX);
    CHECK(err < FULL_ERR_MAX, "relative error %.4f", err);
}

/* Perplexity of the reference's 256-token window of tinyshakespeare, one window from position 0. */
static void test_smollm_perplexity(void) {
    REQUIRE_MODEL();
    float *z = eval_all(G.ppl_ids, G.ppl_n);
    CHECK(z != NULL, "%s", eval_error);
    double nll = 0;
    for (int t = 0; t + 1 < G.ppl_n; t++) {
        const float *zt = z + (size_t)t * (size_t)V;
        double mx = zt[0], sum = 0;
        for (int64_t v = 1; v < V; v++) mx = fmax(mx, zt[v]);
        for (int64_t v = 0; v < V; v++) sum += exp(zt[v] - mx);
        nll += mx + log(sum) - zt[G.ppl_ids[t + 1]];
    }
    free(z);
    double ppl = exp(nll / (G.ppl_n - 1));
    double rel = ppl / G.ppl - 1;
    printf("# perplexity of %d tokens of %s: kiln %.4f, reference %.4f (%+.2f%%, bound %.1f%%)\n", G.ppl_n,
           G.ppl_corpus, ppl, G.ppl, 100 * rel, 100 * PPL_REL_MAX);
    CHECK(fabs(rel) < PPL_REL_MAX, "kiln %.4f, reference %.4f", ppl, G.ppl);
}

int main(void) {
    load_golden();
    if (!golden_error[0]) load_model();
    RUN(test_smollm_tokenizer);
    RUN(test_smollm_logits);
    RUN(test_smollm_full_logits);
    RUN(test_smollm_perplexity);
    for (int i = 0; i < MAX_PROMPTS; i++) free(kiln_logits[i]);
    kiln_model_free(model);
    TEST_EXIT();
}
