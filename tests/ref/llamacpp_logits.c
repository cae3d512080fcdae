/* llamacpp_logits.c: the logits of every position of a token list, from llama.cpp's runtime or from kiln's, for
 * tests/test_llamacpp_peer.sh, which compiles it against a llama.cpp build (libllama, llama.h) and libkiln; `make`
 * never builds it. One engine runs per process, on the CPU, on the same GGUF and the same ids:
 *   llamacpp_logits [--kiln [-b N]] [-g N] [-t THREADS] MODEL.gguf OUT.bin (-p TEXT | ID...)
 *     (-b: kiln's prefill chunk, so that a prefill in several chunks is compared too)
 *     writes OUT.bin: T x V float32 (little-endian, row per input position), and prints
 *       tokens: the T input ids (with -p, the engine's tokenization of TEXT, BOS as the vocab says)
 *       greedy: N argmax steps after the input (each fed back, one token a step; N default 8)
 *       margin: (llama.cpp only) each greedy step's top1 - top2 logit, how far the other engine may move before
 *               its argmax may differ there
 *     llama.cpp runs with llama.cpp's defaults but for: n_ctx T + N, one llama_batch of T with logits at every
 *     position, n_ubatch 16 (the CPU's small-batch kernels, as tests/ref/perplexity_ref.txt), flash attention off
 *     (kiln's attention is the plain softmax(QK^T)V), f16 K and V (both engines' default cache type).
 *   llamacpp_logits --compare A.bin B.bin V
 *     prints "err E argmax K/T abs A": A = max |a - b| over all T x V (a NaN sticks), E = A / max |b|, K the
 *     positions where the argmax of a equals that of b. */
#include "kiln.h"
#include "llama.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_TOKENS 4096

typedef struct run_opts {
    const char *model, *out, *prompt;
    int32_t ids[MAX_TOKENS];
    int n_ids, n_greedy, n_threads, n_batch; /* n_batch: kiln's prefill chunk (0: its default) */
} run_opts;

typedef struct run_result {
    int32_t ids[MAX_TOKENS]; /* the input, as run */
    int n_ids;
    int32_t greedy[64];
    float margin[64]; /* llama.cpp only: top1 - top2 of the logits each greedy token was taken from */
    int64_t V;
    float *logits; /* n_ids x V */
} run_result;

static int die(const char *fmt, const char *arg) {
    fprintf(stderr, "llamacpp_logits: ");
    fprintf(stderr, fmt, arg);
    fputc('\n', stderr);
    return 1;
}

static int32_t argmax(const float *row, int64_t V) {
    int32_t best = 0;
    for (int64_t v = 1; v < V; v++)
        if (row[v] > row[best]) best = (int32_t)v;
    return best;
}

/* row's best logit less its second best: how far the other engine's logits may move before its argmax differs */
static float top_margin(const float *row, int64_t V) {
    int32_t best = argmax(row, V);
    float second = -INFINITY;
    for (int64_t v = 0; v < V; v++)
        if (v != best && row[v] > second) second = row[v];
    return row[best] - second;
}

/* ---------------------------------------------------------------- llama.cpp */

static void quiet_log(enum ggml_log_level level, const char *text, void *ud) {
    (void)ud;
    if (level == GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

static int run_llama(const run_opts *o, run_result *r) {
    llama_log_set(quiet_log, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    struct llama_model *model = llama_model_load_from_file(o->model, mp);
    if (!model) return die("llama.cpp cannot load %s", o->model);
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    r->V = llama_vocab_n_tokens(vocab);
    if (o->prompt) {
        r->n_ids = llama_tokenize(vocab, o->prompt, (int32_t)strlen(o->prompt), r->ids, MAX_TOKENS, true, false);
        if (r->n_ids <= 0) return die("llama.cpp's tokenization of the prompt failed or is empty: %s", o->prompt);
    } else {
        memcpy(r->ids, o->ids, (size_t)o->n_ids * sizeof *r->ids);
        r->n_ids = o->n_ids;
    }
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)(r->n_ids + o->n_greedy);
    cp.n_batch = (uint32_t)r->n_ids;
    cp.n_ubatch = 16;
    cp.n_seq_max = 1;
    cp.n_threads = cp.n_threads_batch = o->n_threads;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.type_k = cp.type_v = GGML_TYPE_F16;
    cp.no_perf = true;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) return die("llama.cpp cannot make a context for %s", o->model);
    r->logits = malloc((size_t)r->n_ids * (size_t)r->V * sizeof(float));
    struct llama_batch b = llama_batch_init(r->n_ids, 0, 1);
    int rc = r->logits ? 0 : die("out of memory%s", "");
    for (int i = 0; !rc && i < r->n_ids; i++) {
        b.token[i] = r->ids[i], b.pos[i] = i, b.n_seq_id[i] = 1, b.seq_id[i][0] = 0, b.logits[i] = 1;
    }
    b.n_tokens = r->n_ids;
    if (!rc && llama_decode(ctx, b) != 0) rc = die("llama_decode failed on the input of %s", o->model);
    for (int i = 0; !rc && i < r->n_ids; i++) {
        const float *row = llama_get_logits_ith(ctx, i);
        if (!row) rc = die("llama.cpp returned no logits for a position of %s", o->model);
        else memcpy(r->logits + (size_t)i * (size_t)r->V, row, (size_t)r->V * sizeof(float));
    }
    const float *row = rc ? NULL : r->logits + (size_t)(r->n_ids - 1) * (size_t)r->V;
    for (int k = 0; !rc && k < o->n_greedy; k++) {
        r->greedy[k] = argmax(row, r->V), r->margin[k] = top_margin(row, r->V);
        if (k + 1 == o->n_greedy) break;
        b.token[0] = r->greedy[k], b.pos[0] = r->n_ids + k, b.n_seq_id[0] = 1, b.seq_id[0][0] = 0, b.logits[0] = 1;
        b.n_tokens = 1;
        if (llama_decode(ctx, b) != 0 || !(row = llama_get_logits_ith(ctx, 0)))
            rc = die("llama_decode failed on a greedy step of %s", o->model);
    }
    llama_batch_free(b);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return rc;
}

/* ---------------------------------------------------------------- kiln */

static int kiln_die(void) {
    return die("kiln: %s", kiln_last_error());
}

static int run_kiln(const run_opts *o, run_result *r) {
    kiln_model *m = NULL;
    if (kiln_model_load(o->model, &m)) return kiln_die();
    r->V = kiln_model_n_vocab(m);
    int rc = 0;
    if (o->prompt) {
        kiln_tokens t = {0};
        const kiln_tokenizer *tok = kiln_model_tokenizer(m);
        if (!tok) rc = die("%s has no tokenizer", o->model);
        else if (kiln_tokenizer_encode(tok, o->prompt, strlen(o->prompt), true, false, &t)) rc = kiln_die();
        else if (t.n == 0 || t.n > MAX_TOKENS)
            rc = die("kiln's tokenization of the prompt is empty or too long: %s", o->prompt);
        else memcpy(r->ids, t.ids, t.n * sizeof *r->ids), r->n_ids = (int)t.n;
        kiln_tokens_free(&t);
    } else {
        memcpy(r->ids, o->ids, (size_t)o->n_ids * sizeof *r->ids);
        r->n_ids = o->n_ids;
    }
    kiln_session_params sp = {.n_ctx = r->n_ids + o->n_greedy, .n_batch = o->n_batch, .n_threads = o->n_threads};
    kiln_session *s = NULL;
    if (!rc && kiln_session_new(m, &sp, &s)) rc = kiln_die();
    if (!rc && !(r->logits = malloc((size_t)r->n_ids * (size_t)r->V * sizeof(float)))) rc = die("out of memory%s", "");
    if (!rc && kiln_session_eval(s, r->ids, (size_t)r->n_ids, NULL, r->logits)) rc = kiln_die();
    if (!rc && o->n_greedy > 0) r->greedy[0] = argmax(r->logits + (size_t)(r->n_ids - 1) * (size_t)r->V, r->V);
    for (int k = 1; !rc && k < o->n_greedy; k++)
        if (kiln_session_eval_argmax(s, &r->greedy[k - 1], 1, &r->greedy[k])) rc = kiln_die();
    kiln_session_free(s);
    kiln_model_free(m);
    return rc;
}

/* ---------------------------------------------------------------- files */

static float *read_floats(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    float *p = len > 0 && len % 4 == 0 ? malloc((size_t)len) : NULL;
    *n = p ? (size_t)len / 4 : 0;
    if (p && fread(p, 4, *n, f) != *n) free(p), p = NULL;
    fclose(f);
    return p;
}

static int compare(const char *pa, const char *pb, const char *vs) {
    char *end;
    long long V = strtoll(vs, &end, 10);
    if (*end || V <= 0) return die("--compare: V must be a positive integer, not '%s'", vs);
    size_t na, nb;
    float *a = read_floats(pa, &na), *b = read_floats(pb, &nb);
    int rc = 0;
    if (!a || !b) rc = die("--compare: cannot read %s", !a ? pa : pb);
    else if (na != nb || na % (size_t)V)
        rc = die("--compare: %s and the other file differ in size or are not rows of V", pa);
    if (!rc) {
        double max_ref = 0, max_err = 0;
        for (size_t i = 0; i < na; i++) {
            double r = fabs(b[i]), e = fabs((double)a[i] - b[i]);
            if (r > max_ref) max_ref = r;
            if (!(e <= max_err)) max_err = e;
        }
        size_t T = na / (size_t)V, agree = 0;
        for (size_t t = 0; t < T; t++) agree += argmax(a + t * V, V) == argmax(b + t * V, V);
        printf("err %.3e argmax %zu/%zu abs %.4f\n", max_err / max_ref, agree, T, max_err);
    }
    free(a);
    free(b);
    return rc;
}

int main(int argc, char **argv) {
    if (argc == 5 && strcmp(argv[1], "--compare") == 0) return compare(argv[2], argv[3], argv[4]);
    run_opts o = {.n_greedy = 8, .n_threads = 2};
    bool kiln = false;
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        if (strcmp(argv[i], "--kiln") == 0) kiln = true;
        else if (strlen(argv[i]) == 2 && strchr("gtb", argv[i][1]) && i + 1 < argc) {
            char *end;
            long v = strtol(argv[i + 1], &end, 10);
            int *dst = argv[i][1] == 'g' ? &o.n_greedy : argv[i][1] == 't' ? &o.n_threads : &o.n_batch;
            if (*end || v < (argv[i][1] == 'g' ? 0 : 1) || v > (argv[i][1] == 'b' ? MAX_TOKENS : 64))
                return die("%s needs an integer in range", argv[i]);
            *dst = (int)v;
            i++;
        } else return die("unknown option '%s'", argv[i]);
    }
    if (argc - i < 3)
        return die("usage: llamacpp_logits [--kiln [-b N]] [-g N] [-t T] MODEL.gguf OUT.bin (-p TEXT | ID...)%s\n"
                   "       llamacpp_logits --compare A.bin B.bin V", "");
    o.model = argv[i], o.out = argv[i + 1];
    if (strcmp(argv[i + 2], "-p") == 0) {
        if (argc - i != 4) return die("-p takes one TEXT and nothing after it%s", "");
        o.prompt = argv[i + 3];
    } else
        for (int k = i + 2; k < argc; k++) {
            char *end;
            long v = strtol(argv[k], &end, 10);
            if (*end || v < 0 || v > INT32_MAX || o.n_ids == MAX_TOKENS) return die("bad token id '%s'", argv[k]);
            o.ids[o.n_ids++] = (int32_t)v;
        }
    run_result *r = calloc(1, sizeof *r);
    if (!r) return die("out of memory%s", "");
    int rc = kiln ? run_kiln(&o, r) : run_llama(&o, r);
    if (!rc) {
        FILE *f = fopen(o.out, "wb");
        size_t n = (size_t)r->n_ids * (size_t)r->V;
        if (!f || fwrite(r->logits, sizeof(float), n, f) != n) rc = die("cannot write %s", o.out);
        if (f && fclose(f) != 0 && !rc) rc = die("cannot write %s", o.out);
    }
    if (!rc) {
        printf("tokens:");
        for (int k = 0; k < r->n_ids; k++) printf(" %d", r->ids[k]);
        printf("\ngreedy:");
        for (int k = 0; k < o.n_greedy; k++) printf(" %d", r->greedy[k]);
        if (!kiln) {
            printf("\nmargin:");
            for (int k = 0; k < o.n_greedy; k++) printf(" %.4f", r->margin[k]);
        }
        printf("\n");
    }
    free(r->logits);
    free(r);
    return rc;
}
