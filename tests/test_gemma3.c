/* test_gemma3.c: kiln's forward on a real gemma3 model, Gemma 3 270M Q4_K_M, against golden logits from an
 * independent float64 numpy forward of llama.cpp's gemma3 graph (tests/ref/gemma_ref.py: gguf's dequantizer, HF
 * tokenizers' ids). tests/ref/gemma3_golden.txt holds, for 3 prompts of 32 positions, the token ids, the top-5
 * logits and the RMS of all logits per position; a 640-token prompt of tinyshakespeare (its text embedded, so no
 * shared data is needed) with the same per-position lines for positions 0..31 and 496..639, past the 512-token
 * sliding window of the local layers, and its perplexity; gemma3_logits_f16.bin holds all logits at one position.
 * The model is not in the repository: `bash tests/ref/fetch_models.sh` puts it in KILN_CACHE (default
 * ~/.cache/kiln), and every test here skips while it is absent. Run from the repo root. */
#include "kiln.h"
#include "fp16.h"
#include "test.h"

#include <errno.h>
#include <stdint.h>
#include <sys/stat.h>

#define GOLDEN_PATH "tests/ref/gemma3_golden.txt"
#define MODEL_NAME "gemma3-270m-q4_k_m.gguf"
#define MODEL_SIZE 253113024LL /* fetch_models.sh checks the sha256 too; here the size catches a wrong file */
#define MAX_PROMPTS 4
#define MAX_POS 32
#define MAX_LONG 1024
#define MAX_TEXT 8192
#define TOP_K 5
#define N_CTX 1024
#define N_SWA 512              /* gemma3.attention.sliding_window: the long prompt's positions from here on test it */

/* Bounds. kiln rounds the input of every quantized matmul to 8 bits (Q8_0 blocks of 32 with an f16 scale for the
 * q5_0/q8_0 weights, Q8_K blocks of 256 with an f32 scale for q4_K/q6_K) and keeps K and V in f16; the reference
 * does neither. `gemma_ref.py --error-model` runs the reference with exactly that rounding and scores it on the
 * measures below (no kiln gemma3 forward existed when these were set: the bounds are 2x the emulation, as
 * test_smollm.c's are 2x what both kiln and its emulation measured). `gemma_ref.py --check` scores deliberate bugs:
 *
 *                                        8-bit emulation  bound   llama RoPE  no window  one RoPE base  no sqrt(C)
 *   top-5 logit error                         0.0285      0.06      0.644      0.124       0.236         6.19
 *   ... past the sliding window alone         0.0409      0.08        -        0.336         -             -
 *   max per-position logit RMS error          0.0708      0.15      2.41       0.511       0.689         18.8
 *   all-logit error at one position           0.0252      0.05      0.603      0.0002      0.185         2.85
 *   max change of top1-top2 margin            0.399       (1.0)     18.5       5.84        9.05          20.2
 *   perplexity vs reference                   +0.78%      2%        +1037%     +8.1%       +118%         huge
 * ("no window": every layer global; "one RoPE base": the global base 1e6 on the local layers too. A window one
 * key too wide, 513, moves nothing measurably: 0.0008 top-5 error, +0.01% perplexity. The perplexity bound has
 * more room than 2x because test_smollm.c saw kiln land up to 4x its emulation's perplexity change.)
 *
 * top-5 logit error: RMS over positions and the reference's top-5 ids of kiln - reference, over the RMS of all
 * logits. Logit RMS error: |RMS(kiln) - RMS(ref)| / RMS(ref) over all V logits of a position. All-logit error:
 * ||kiln - ref|| / ||ref|| at the position the f16 file holds (f16 storage adds 2^-11 relative). Top-1 is compared
 * only where the reference's top1-top2 margin exceeds TOP1_MARGIN: the emulation moves a margin by up to 0.40 and
 * flips 12 positions, all with margins under 0.21; 130 of the 272 positions qualify. The long prompt's positions
 * past the window are also scored on their own, so that a window bug cannot hide in the average.
 *
 * kiln measured (AVX-512, when the test moved out of tests/pending with Q5_0 support): top-5 error 0.0331, past
 * the window 0.0410, logit RMS error 0.0817, all-logit error 0.0252, perplexity 39.1005 vs 39.0242 (+0.20%),
 * top-1 equal at all 130 decided positions: each within 1.2x of the 8-bit emulation, so the bounds stand. */
#define TOP1_MARGIN 1.0
#define TOP5_ERR_MAX 0.06
#define TOP5_PAST_ERR_MAX 0.08
#define RMS_ERR_MAX 0.15
#define FULL_ERR_MAX 0.05
#define PPL_REL_MAX 0.02

typedef struct golden_pos {
    int pos;              /* position in its sequence */
    float rms;            /* RMS of all V logits */
    int32_t id[TOP_K];    /* top-5 ids, best first */
    float logit[TOP_K];
} golden_pos;

typedef struct golden_prompt {
    char text[512];       /* UTF-8, encoded with add_special (BOS) and parse_special */
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
    char long_text[MAX_TEXT]; /* a prefix of tinyshakespeare; BOS and its first n_long-1 tokens are long_ids */
    size_t long_text_len;
    int32_t long_ids[MAX_LONG];
    int n_long;
    golden_pos long_pos[MAX_LONG]; /* a subset of the positions, increasing */
    int n_long_pos;
    double long_ppl;      /* of long_ids in one window, over its n_long-1 predictions */
} golden;

static golden G;
static char golden_error[512];  /* non-empty: the fixture or the model is broken, every test fails */
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

/* Decodes hex into out (cap bytes, one kept for a terminator). */
static bool parse_hex(const char *s, char *out, size_t cap, size_t *len) {
    size_t n = strlen(s);
    if (n % 2 || n / 2 >= cap) return false;
    for (size_t i = 0; i < n / 2; i++) {
        int hi = hexval(s[2 * i]), lo = hexval(s[2 * i + 1]);
        if (hi < 0 || lo < 0) return false;
        out[i] = (char)(hi * 16 + lo);
    }
    out[n / 2] = 0;
    *len = n / 2;
    return true;
}

/* "P RMS id1 logit1 ... id5 logit5" */
static bool parse_pos(const char *s, golden_pos *g) {
    char *end;
    g->pos = (int)strtol(s, &end, 10);
    if (end == s || g->pos < 0) return false;
    g->rms = strtof(end, &end);
    for (int j = 0; j < TOP_K; j++) {
        const char *before = end;
        g->id[j] = (int32_t)strtol(end, &end, 10);
        g->logit[j] = strtof(end, &end);
        if (end == before || g->id[j] < 0) return false;
    }
    return g->rms > 0;
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
        return parse_hex(val, p->text, sizeof p->text, &p->text_len);
    }
    if (!strcmp(key, "prompt_ids")) return p && parse_ids(val, p->prompt_ids, MAX_POS, &p->n_prompt);
    if (!strcmp(key, "ids")) return p && parse_ids(val, p->ids, MAX_POS, &p->n_ids);
    if (!strcmp(key, "pos")) {
        if (!p || p->n_pos >= p->n_ids) return false;
        golden_pos *g = &p->pos[p->n_pos];
        return parse_pos(val, g) && g->pos == p->n_pos++;
    }
    if (!strcmp(key, "full_logits"))
        return sscanf(val, "%127s %d %d", G.full_file, &G.full_prompt, &G.full_pos) == 3;
    if (!strcmp(key, "long_text")) return parse_hex(val, G.long_text, sizeof G.long_text, &G.long_text_len);
    if (!strcmp(key, "long_ids")) return parse_ids(val, G.long_ids, MAX_LONG, &G.n_long);
    if (!strcmp(key, "long_pos")) {
        if (G.n_long_pos >= G.n_long) return false;
        golden_pos *g = &G.long_pos[G.n_long_pos];
        bool ok = parse_pos(val, g) && g->pos < G.n_long && (G.n_long_pos == 0 || g->pos > g[-1].pos);
        G.n_long_pos++;
        return ok;
    }
    if (!strcmp(key, "long_ppl")) {
        int n;
        return sscanf(val, "%d %lf", &n, &G.long_ppl) == 2 && n == G.n_long;
    }
    return true; /* provenance keys (model, versions, long_corpus) are for people */
}

static void load_golden(void) {
    FILE *f = fopen(GOLDEN_PATH, "r");
    if (!f) {
        snprintf(golden_error, sizeof golden_error, "%s: %s (run from the repo root)", GOLDEN_PATH, strerror(errno));
        return;
    }
    static char line[65536]; /* long_text is 2 hex digits a byte, long_ids ~7 characters an id */
    int ln = 0;
    while (fgets(line, sizeof line, f)) {
        ln++;
        if (!strchr(line, '\n') && !feof(f)) {
            snprintf(golden_error, sizeof golden_error, "%s:%d: line longer than %zu bytes", GOLDEN_PATH, ln,
                     sizeof line);
            break;
        }
        if (!parse_line(line)) {
            snprintf(golden_error, sizeof golden_error, "%s:%d: malformed line", GOLDEN_PATH, ln);
            break;
        }
    }
    fclose(f);
    if (golden_error[0]) return;
    bool ok = G.n_vocab > 0 && G.n_prompts > 0 && G.full_file[0] && G.full_prompt < G.n_prompts &&
              G.n_long > N_SWA && G.n_long_pos > 0 && G.long_pos[G.n_long_pos - 1].pos >= N_SWA &&
              G.long_text_len > 0 && G.long_ppl > 1;
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
    /* A kiln without the gemma3 forward fails here ("architecture 'gemma3' is not supported"): every test
     * then fails with that message rather than skipping, since the model is present. */
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

/* Errors of kiln's logits against golden positions, accumulated over prompts. */
typedef struct logit_score {
    double se_top, ss_rms, rms_err_max;
    int n_top, n_pos, n_top1;
    int bad_top1_pos, bad_top1_best; /* first decided position whose top-1 differs, -1 if none */
    float bad_top1_logit, bad_top1_ref, bad_top1_kiln;
    int bad_top1_ref_id;
    int n_nonfinite;
} logit_score;

static void score_positions(logit_score *s, const float *z, const golden_pos *g, int n) {
    for (int i = 0; i < n; i++) {
        const float *zt = z + (size_t)g[i].pos * (size_t)V;
        int64_t best = 0;
        double ss = 0;
        for (int64_t v = 0; v < V; v++) {
            if (!isfinite(zt[v])) s->n_nonfinite++;
            if (zt[v] > zt[best]) best = v;
            ss += (double)zt[v] * zt[v];
        }
        if (g[i].logit[0] - g[i].logit[1] > TOP1_MARGIN) {
            if (best != g[i].id[0] && s->bad_top1_pos < 0) {
                s->bad_top1_pos = g[i].pos;
                s->bad_top1_best = (int)best;
                s->bad_top1_logit = zt[best];
                s->bad_top1_ref_id = g[i].id[0];
                s->bad_top1_ref = g[i].logit[0];
                s->bad_top1_kiln = zt[g[i].id[0]];
            }
            s->n_top1++;
        }
        for (int j = 0; j < TOP_K; j++) {
            double d = (double)zt[g[i].id[j]] - g[i].logit[j];
            s->se_top += d * d;
            s->n_top++;
        }
        double rms = sqrt(ss / (double)V);
        s->rms_err_max = fmax(s->rms_err_max, fabs(rms - g[i].rms) / g[i].rms);
        s->ss_rms += (double)g[i].rms * g[i].rms;
        s->n_pos++;
    }
}

static double top5_err(const logit_score *s) { return sqrt(s->se_top / s->n_top) / sqrt(s->ss_rms / s->n_pos); }

/* The long prompt, evaluated once in chunks of LONG_CHUNK tokens so that only LONG_CHUNK x V logits are held
 * (all 640 rows would be 671 MB at V = 262144): its golden positions are scored and its NLL summed on the way. */
#define LONG_CHUNK 32
static struct {
    bool done, ok;
    logit_score all, past; /* all golden positions; those at N_SWA and after */
    double nll;            /* over the n_long-1 next-token predictions */
} long_eval;

static bool eval_long(void) {
    if (long_eval.done) return long_eval.ok;
    long_eval.done = true;
    long_eval.all.bad_top1_pos = long_eval.past.bad_top1_pos = -1;
    kiln_session *s = NULL;
    kiln_session_params sp = {.n_ctx = N_CTX};
    float *z = malloc((size_t)LONG_CHUNK * (size_t)V * sizeof *z); /* LONG_CHUNK x V */
    kiln_status st = z ? kiln_session_new(model, &sp, &s) : KILN_ERR_NOMEM;
    int gi = 0; /* next golden position */
    for (int t0 = 0; st == KILN_OK && t0 < G.n_long; t0 += LONG_CHUNK) {
        int n = G.n_long - t0 < LONG_CHUNK ? G.n_long - t0 : LONG_CHUNK;
        st = kiln_session_eval(s, G.long_ids + t0, (size_t)n, NULL, z);
        if (st != KILN_OK) break;
        for (int i = 0; i < n; i++) {
            int t = t0 + i;
            const float *zt = z + (size_t)i * (size_t)V;
            if (gi < G.n_long_pos && G.long_pos[gi].pos == t) {
                golden_pos g = G.long_pos[gi++];
                g.pos = i; /* row within this chunk */
                bool had = long_eval.all.bad_top1_pos >= 0;
                score_positions(&long_eval.all, z, &g, 1);
                if (!had && long_eval.all.bad_top1_pos >= 0) long_eval.all.bad_top1_pos = t; /* not the row */
                if (t >= N_SWA) score_positions(&long_eval.past, z, &g, 1);
            }
            if (t + 1 < G.n_long) {
                double mx = zt[0], sum = 0;
                for (int64_t v = 1; v < V; v++) mx = fmax(mx, zt[v]);
                for (int64_t v = 0; v < V; v++) sum += exp(zt[v] - mx);
                long_eval.nll += mx + log(sum) - zt[G.long_ids[t + 1]];
            }
        }
    }
    if (st != KILN_OK) snprintf(eval_error, sizeof eval_error, "%s: %s", kiln_status_name(st), kiln_last_error());
    free(z);
    kiln_session_free(s);
    long_eval.ok = st == KILN_OK;
    return long_eval.ok;
}

static bool same_ids(const kiln_tokens *t, const int32_t *want, int n) {
    if (t->n < (size_t)n) return false;
    for (int i = 0; i < n; i++)
        if (t->ids[i] != want[i]) return false;
    return true;
}

/* ---------------------------------------------------------------- tests */

/* kiln's tokenizer (SentencePiece-style, with BOS) gives the reference's ids for the prompts and for the long
 * prompt's text, whose first n_long ids it must reproduce. */
static void test_gemma3_tokenizer(void) {
    REQUIRE_MODEL();
    const kiln_tokenizer *tok = kiln_model_tokenizer(model);
    CHECK(tok != NULL);
    for (int i = 0; i < G.n_prompts; i++) {
        const golden_prompt *p = &G.prompt[i];
        kiln_tokens t = {0};
        kiln_status st = kiln_tokenizer_encode(tok, p->text, p->text_len, true, true, &t);
        bool same = st == KILN_OK && t.n == (size_t)p->n_prompt && same_ids(&t, p->prompt_ids, p->n_prompt);
        size_t n = t.n;
        kiln_tokens_free(&t);
        CHECK(same, "prompt %d (%.*s): %s, %zu ids, reference %d", i, (int)p->text_len, p->text,
              kiln_status_name(st), n, p->n_prompt);
    }
    kiln_tokens t = {0};
    kiln_status st = kiln_tokenizer_encode(tok, G.long_text, G.long_text_len, true, true, &t);
    bool same = st == KILN_OK && same_ids(&t, G.long_ids, G.n_long);
    size_t n = t.n;
    kiln_tokens_free(&t);
    CHECK(same, "long prompt (%zu bytes): %s, %zu ids, the first %d differ from the reference's", G.long_text_len,
          kiln_status_name(st), n, G.n_long);
}

/* Top-1 where the reference is decided, top-5 logits and per-position logit RMS, over the short prompts and the
 * long prompt's positions; the long prompt's positions past the sliding window are also scored on their own. */
static void test_gemma3_logits(void) {
    REQUIRE_MODEL();
    logit_score all = {.bad_top1_pos = -1};
    for (int i = 0; i < G.n_prompts; i++) {
        const float *z = prompt_logits(i);
        CHECK(z != NULL, "prompt %d: %s", i, eval_error);
        score_positions(&all, z, G.prompt[i].pos, G.prompt[i].n_pos);
        CHECK(all.n_nonfinite == 0, "prompt %d: %d logits are not finite", i, all.n_nonfinite);
        CHECK(all.bad_top1_pos < 0, "prompt %d pos %d: kiln's top-1 is %d (%.4f), the reference's %d (%.4f; kiln "
              "%.4f)", i, all.bad_top1_pos, all.bad_top1_best, all.bad_top1_logit, all.bad_top1_ref_id,
              all.bad_top1_ref, all.bad_top1_kiln);
    }
    CHECK(eval_long(), "long prompt: %s", eval_error);
    const logit_score *l = &long_eval.all;
    CHECK(l->n_nonfinite == 0, "long prompt: %d logits are not finite", l->n_nonfinite);
    CHECK(l->bad_top1_pos < 0, "long prompt pos %d: kiln's top-1 is %d (%.4f), the reference's %d (%.4f; kiln "
          "%.4f)", l->bad_top1_pos, l->bad_top1_best, l->bad_top1_logit, l->bad_top1_ref_id, l->bad_top1_ref,
          l->bad_top1_kiln);
    all.se_top += l->se_top;
    all.ss_rms += l->ss_rms;
    all.rms_err_max = fmax(all.rms_err_max, l->rms_err_max);
    all.n_top += l->n_top;
    all.n_pos += l->n_pos;
    all.n_top1 += l->n_top1;
    double err = top5_err(&all), err_past = top5_err(&long_eval.past);
    printf("# top-1 equal at %d decided positions of %d; top-5 logit error %.4f (bound %.2f; past the window, %d "
           "positions: %.4f, bound %.2f), logit RMS error %.4f (bound %.2f)\n", all.n_top1, all.n_pos, err,
           TOP5_ERR_MAX, long_eval.past.n_pos, err_past, TOP5_PAST_ERR_MAX, all.rms_err_max, RMS_ERR_MAX);
    CHECK(err < TOP5_ERR_MAX, "top-5 logit error %.4f", err);
    CHECK(err_past < TOP5_PAST_ERR_MAX, "top-5 logit error past the sliding window %.4f", err_past);
    CHECK(all.rms_err_max < RMS_ERR_MAX, "logit RMS error %.4f", all.rms_err_max);
}

/* All V logits at one position against the reference's, stored as f16 (relative rounding 2^-11, far below the
 * bound). */
static void test_gemma3_full_logits(void) {
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

/* Perplexity of the long prompt (BOS + tinyshakespeare), one window from position 0: past position 512 the local
 * layers drop the oldest keys, so a window bug shows here too. */
static void test_gemma3_perplexity(void) {
    REQUIRE_MODEL();
    CHECK(eval_long(), "long prompt: %s", eval_error);
    double ppl = exp(long_eval.nll / (G.n_long - 1));
    double rel = ppl / G.long_ppl - 1;
    printf("# perplexity of the %d-token long prompt: kiln %.4f, reference %.4f (%+.2f%%, bound %.1f%%)\n", G.n_long,
           ppl, G.long_ppl, 100 * rel, 100 * PPL_REL_MAX);
    CHECK(fabs(rel) < PPL_REL_MAX, "kiln %.4f, reference %.4f", ppl, G.long_ppl);
}

int main(void) {
    load_golden();
    if (!golden_error[0]) load_model();
    RUN(test_gemma3_tokenizer);
    RUN(test_gemma3_logits);
    RUN(test_gemma3_full_logits);
    RUN(test_gemma3_perplexity);
    for (int i = 0; i < MAX_PROMPTS; i++) free(kiln_logits[i]);
    kiln_model_free(model);
    TEST_EXIT();
}
