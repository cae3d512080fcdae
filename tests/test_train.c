/* test_train.c: the trainer end to end.
 *   - loss and every parameter gradient of a 2-layer GQA model against tests/ref/train_ref.gguf (JAX float64
 *     autodiff, tests/ref/train_ref.py), in fp32 and with the bf16 mirror; then the losses of 10 AdamW steps;
 *   - gradients bit-identical with 1, 2 and 3 threads;
 *   - the training forward against the inference forward (session, f16 KV cache) on the same weights;
 *   - `kiln train`'s loop: a run stopped at step 3 and resumed ends byte-identical to an uninterrupted one;
 *   - a checkpoint write killed with SIGKILL leaves the previous checkpoint loadable;
 *   - the hardening of issue 17: options checked in the library, damaged checkpoints refused at resume, non-finite
 *     writes refused, the guard on the updated weights in a run, a failed checkpoint that still exports, outputs
 *     checked before step 1, stale temp files removed, log write errors (tests/test_train_faults.sh: the CLI). */
#include "test.h"
#include "cuda/cuda.h"
#include "cuda/dist.h"

#include "train/llama_train.h"
#include "train/data.h"
#include "train/trainer.h"

#include <signal.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define REF "tests/ref/train_ref.gguf"

static double ref_f64(const kiln_gguf *g, const char *key) {
    const kiln_gguf_value *v = kiln_gguf_find(g, key);
    return v ? v->f64 : NAN;
}

static const int32_t *ref_ids(const kiln_gguf *g, const char *name) {
    const kiln_tensor_view *t = kiln_gguf_find_tensor(g, name);
    return t && t->type == KILN_TYPE_I32 ? t->data : NULL;
}

/* ||a - b|| / ||b|| over n floats */
static double rel_err(const float *a, const float *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * (double)b[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

typedef struct ref_case {
    kiln_model *src;
    kiln_llama_train *m;
    int64_t B, T;
} ref_case;

static int ref_open(ref_case *rc, bool mixed, kiln_pool *pool) {
    memset(rc, 0, sizeof *rc);
    if (kiln_model_load(REF, &rc->src) != KILN_OK) return 0;
    if (kiln_llama_train_from_model(rc->src, mixed, &rc->m) != KILN_OK) return 0;
    uint32_t B, T;
    kiln_gguf_get_u32(rc->src->gguf, "ref.B", &B);
    kiln_gguf_get_u32(rc->src->gguf, "ref.T", &T);
    rc->B = B, rc->T = T;
    rc->m->label_smoothing = (float)ref_f64(rc->src->gguf, "ref.label_smoothing");
    rc->m->z_loss = (float)ref_f64(rc->src->gguf, "ref.z_loss");
    return kiln_llama_train_reserve(rc->m, B, T, kiln_pool_size(pool)) == KILN_OK;
}

static void ref_close(ref_case *rc) {
    kiln_llama_train_free(rc->m);
    kiln_model_free(rc->src);
}

/* Gradients against JAX. fp32: loss relative error bound 1e-6 (measured 2e-9), per-tensor relative L2 error
 * of every gradient 1e-4 (measured worst 6.3e-6). Mixed (bf16 mirror): bounds 2e-3 and 1e-1 (measured 6.1e-4
 * and 6.6e-2, in blk.0.attn_q): the fixture's weights are 15x a real init, so its attention is peaked and bf16
 * rounding of the weights (2^-9 relative) moves the softmax; with the weights rounded to bf16 first, the fp32
 * gradient agrees with the mixed one to 1e-5 (checked below; measured: bit for bit), so the difference is the rounding itself. */
static void check_grads(bool mixed) {
    kiln_pool *pool;
    CHECK(kiln_pool_create(2, &pool) == KILN_OK);
    ref_case rc;
    CHECK(ref_open(&rc, mixed, pool), "%s", kiln_last_error());
    const kiln_gguf *g = rc.src->gguf;
    const int32_t *in = ref_ids(g, "ref.inputs"), *tg = ref_ids(g, "ref.targets");
    CHECK(in && tg);
    int64_t counted = kiln_count_targets(tg, rc.B * rc.T);
    CHECK(counted == rc.B * rc.T - 1, "the fixture ignores exactly one target");
    int64_t k;
    double loss = kiln_llama_train_step(rc.m, &kiln_cpu_ops, pool, in, tg, 1.0f / (float)counted, &k) / (double)counted;
    double want = ref_f64(g, "ref.loss");
    CHECK(k == counted);
    CHECK(fabs(loss - want) / want < (mixed ? 2e-3 : 1e-6), "loss %.9f, reference %.9f", loss, want);
    double worst = 0;
    const char *worst_name = "";
    for (int i = 0; i < rc.m->n_tensors; i++) {
        const kiln_train_tensor *t = &rc.m->tensors[i];
        char name[80];
        snprintf(name, sizeof name, "ref.grad.%s", t->name);
        const kiln_tensor_view *ref = kiln_gguf_find_tensor(g, name);
        CHECK(ref && ref->ne[0] * ref->ne[1] == t->n, "%s", name);
        double e = rel_err(rc.m->grads + t->offset, ref->data, t->n);
        if (e > worst) worst = e, worst_name = t->name;
        if (getenv("KILN_TEST_VERBOSE")) printf("#   %-28s %.3g\n", t->name, e);
    }
    CHECK(worst < (mixed ? 1e-1 : 1e-4), "worst gradient error %.3g in %s", worst, worst_name);
    printf("# %s: loss error %.2g, worst gradient error %.2g (%s)\n", mixed ? "mixed bf16" : "fp32", fabs(loss - want) / want, worst,
           worst_name);
    if (mixed) {
        /* the same weights rounded to bf16 (matrices and embedding; norms stay fp32, as the mirror does), in fp32 */
        ref_case rf;
        CHECK(ref_open(&rf, false, pool));
        for (int i = 0; i < rf.m->n_tensors; i++) {
            const kiln_train_tensor *t = &rf.m->tensors[i];
            if (t->n_dims == 1) continue;
            for (int64_t j = 0; j < t->n; j++) {
                uint32_t u;
                float *p = rf.m->params + t->offset + j;
                memcpy(&u, p, 4);
                u = (u + 0x7fffu + ((u >> 16) & 1)) & 0xffff0000u;
                memcpy(p, &u, 4);
            }
        }
        kiln_llama_train_step(rf.m, &kiln_cpu_ops, pool, in, tg, 1.0f / (float)counted, &k);
        double e = rel_err(rc.m->grads, rf.m->grads, rc.m->n_params);
        printf("# mixed vs fp32 on bf16-rounded weights: relative error %.2g\n", e);
        CHECK(e < 1e-5, "mixed gradient differs from the fp32 gradient of the rounded weights by %.3g", e);
        ref_close(&rf);
    }
    ref_close(&rc);
    kiln_pool_free(pool);
}

static void test_grads_fp32(void) { check_grads(false); }
static void test_grads_mixed(void) { check_grads(true); }

/* Ten AdamW steps on the reference's batches: each step's loss within 1e-5 relative (measured 3e-7: fp32
 * rounding compounds through the updates). */
static void test_adamw_steps(void) {
    kiln_pool *pool;
    CHECK(kiln_pool_create(2, &pool) == KILN_OK);
    ref_case rc;
    CHECK(ref_open(&rc, false, pool), "%s", kiln_last_error());
    const kiln_gguf *g = rc.src->gguf;
    kiln_adamw_cfg cfg = kiln_adamw_defaults();
    cfg.beta1 = (float)ref_f64(g, "ref.beta1");
    cfg.beta2 = (float)ref_f64(g, "ref.beta2");
    cfg.eps = (float)ref_f64(g, "ref.adam_eps");
    cfg.weight_decay = (float)ref_f64(g, "ref.weight_decay");
    cfg.grad_clip = (float)ref_f64(g, "ref.grad_clip");
    float lr = (float)ref_f64(g, "ref.lr");
    kiln_param_segment *segs = malloc((size_t)rc.m->n_tensors * sizeof *segs);
    kiln_train_segments(rc.m, segs);
    kiln_adamw opt;
    CHECK(kiln_adamw_init(&opt, &cfg, rc.m->n_params, segs, rc.m->n_tensors) == KILN_OK);
    const kiln_gguf_value *want = kiln_gguf_find(g, "ref.step_losses");
    const int32_t *in = ref_ids(g, "ref.step_inputs"), *tg = ref_ids(g, "ref.step_targets");
    CHECK(want && in && tg);
    const int64_t BT = rc.B * rc.T;
    double worst = 0;
    for (uint64_t s = 0; s < want->arr.n; s++) {
        memset(rc.m->grads, 0, (size_t)rc.m->n_params * sizeof(float));
        int64_t k;
        double loss = kiln_llama_train_step(rc.m, &kiln_cpu_ops, pool, in + s * BT, tg + s * BT, 1.0f / (float)BT, &k) / (double)BT;
        double w = kiln_gguf_arr_f64(want, s), e = fabs(loss - w) / w;
        if (e > worst) worst = e;
        CHECK(e < 1e-5, "step %llu: loss %.9f, reference %.9f", (unsigned long long)s, loss, w);
        kiln_adamw_result r = kiln_adamw_step(&opt, pool, rc.m->params, rc.m->grads, NULL, lr);
        CHECK(!r.skipped);
    }
    printf("# adamw: worst step-loss error %.2g over %llu steps\n", worst, (unsigned long long)want->arr.n);
    kiln_adamw_free(&opt);
    free(segs);
    ref_close(&rc);
    kiln_pool_free(pool);
}

/* The gradient does not depend on the thread count, bit for bit. */
static void test_threads_deterministic(void) {
    float *first = NULL;
    for (int nt = 1; nt <= 3; nt++) {
        kiln_pool *pool;
        CHECK(kiln_pool_create(nt, &pool) == KILN_OK);
        ref_case rc;
        CHECK(ref_open(&rc, false, pool));
        const int32_t *in = ref_ids(rc.src->gguf, "ref.inputs"), *tg = ref_ids(rc.src->gguf, "ref.targets");
        int64_t k;
        kiln_llama_train_step(rc.m, &kiln_cpu_ops, pool, in, tg, 0.01f, &k);
        size_t bytes = (size_t)rc.m->n_params * sizeof(float);
        if (!first) {
            first = malloc(bytes);
            memcpy(first, rc.m->grads, bytes);
        } else
            CHECK(memcmp(first, rc.m->grads, bytes) == 0, "%d threads differ from 1", nt);
        ref_close(&rc);
        kiln_pool_free(pool);
    }
    free(first);
}

/* A random tied model through the training forward and through a session on its exported GGUF. The
 * session keeps K and V in f16, so logits differ by f16 rounding: relative RMS bound 2e-3 (measured 5.7e-4;
 * with the weights at 1x init it is 4.5e-5, at 10x 1.2e-2: the error grows with K and V, as rounding does). */
static void test_train_forward_matches_inference(void) {
    kiln_llama_config c = {.n_vocab = 97, .n_embd = 48, .n_layer = 2, .n_head = 6, .n_head_kv = 2, .n_ff = 80,
                           .n_ctx_train = 32, .rope_base = 10000.0f, .rms_eps = 1e-5f, .tied = true};
    kiln_llama_train *m;
    CHECK(kiln_llama_train_new(&c, false, &m) == KILN_OK);
    kiln_llama_train_init_random(m, 7);
    for (int64_t i = 0; i < m->n_params; i++) m->params[i] *= 3; /* beyond init scale, so attention is not uniform */
    const int64_t T = 19;
    CHECK(kiln_llama_train_reserve(m, 1, T, 1) == KILN_OK);
    int32_t ids[19];
    unsigned long long rng = 99;
    for (int i = 0; i < T; i++) ids[i] = (int32_t)(test_rng_next(&rng) % 97);
    const float *lt = kiln_llama_train_logits(m, &kiln_cpu_ops, NULL, ids);

    char dir[] = "/tmp/kiln-train-XXXXXX", path[256];
    CHECK(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/model.gguf", dir);
    CHECK(kiln_train_save(m, NULL, "t", NULL, NULL, path) == KILN_OK, "%s", kiln_last_error());
    kiln_model *im;
    CHECK(kiln_model_load(path, &im) == KILN_OK, "%s", kiln_last_error());
    CHECK(im->cfg.tied);
    kiln_session *s;
    kiln_session_params sp = {.n_ctx = 32, .n_threads = 1};
    CHECK(kiln_session_new(im, &sp, &s) == KILN_OK);
    float *li = malloc((size_t)T * 97 * sizeof *li);
    CHECK(kiln_session_eval(s, ids, (size_t)T, NULL, li) == KILN_OK);
    double e = rel_err(li, lt, T * 97);
    printf("# train vs inference forward: relative RMS %.2g\n", e);
    CHECK(e < 2e-3, "relative RMS %.3g", e);
    free(li);
    kiln_session_free(s);
    kiln_model_free(im);
    kiln_llama_train_free(m);
    unlink(path);
    rmdir(dir);
}

/* ---- the loop: a small corpus, a tokenizer trained on it, shards, then runs */

static char work[64];
static char tok_path[256], data_dir[256];

static int setup_corpus(void) {
    if (work[0]) return 1;
    snprintf(work, sizeof work, "/tmp/kiln-trainloop-XXXXXX");
    if (!mkdtemp(work)) return 0;
    char corpus[256];
    snprintf(corpus, sizeof corpus, "%s/corpus.txt", work);
    FILE *f = fopen(corpus, "w");
    if (!f) return 0;
    unsigned long long rng = 5;
    const char *words[] = {"the", "king", "queen", "said", "to", "my", "lord", "and", "good", "night", "sweet", "prince"};
    for (int i = 0; i < 6000; i++) fprintf(f, "%s%s", words[test_rng_next(&rng) % 12], i % 13 == 12 ? ".\n" : " ");
    fclose(f);
    snprintf(tok_path, sizeof tok_path, "%s/tok.gguf", work);
    const char *paths[] = {corpus};
    kiln_bpe_train_params bp = {.vocab_size = 300, .min_frequency = 2, .n_threads = 1};
    if (kiln_bpe_train(paths, 1, &bp, tok_path) != KILN_OK) return 0;
    kiln_tokenizer *tok;
    if (kiln_tokenizer_load_file(tok_path, &tok) != KILN_OK) return 0;
    snprintf(data_dir, sizeof data_dir, "%s/data", work);
    kiln_data_stats st;
    kiln_status s = kiln_data_write(paths, 1, tok, data_dir, &(kiln_data_params){.val_fraction = 0.1, .shard_tokens = 0}, &st);
    kiln_tokenizer_free(tok);
    return s == KILN_OK;
}

static kiln_train_opts loop_opts(const char *tag) {
    static char ckpt[8][256], out[8][256], logp[8][256];
    static int n;
    int i = n++ % 8;
    kiln_train_opts o = kiln_train_defaults();
    o.dims = (kiln_model_dims){.n_embd = 32, .n_layer = 2, .n_head = 4, .n_head_kv = 2, .n_ff = 64, .rope_base = 10000.0f,
                               .rms_eps = 1e-5f};
    o.tokenizer = tok_path;
    o.data_dir = data_dir;
    o.B = 2, o.T = 16, o.steps = 6, o.n_threads = 2;
    o.lr = (kiln_lr_schedule){.lr = 3e-3f, .min_lr = 3e-4f, .warmup = 2, .total = 6, .decay = KILN_LR_COSINE};
    o.eval_interval = 2, o.eval_batches = 2;
    snprintf(ckpt[i], sizeof ckpt[i], "%s/%s.ckpt.gguf", work, tag);
    snprintf(out[i], sizeof out[i], "%s/%s.out.gguf", work, tag);
    snprintf(logp[i], sizeof logp[i], "%s/%s.jsonl", work, tag);
    o.ckpt_path = ckpt[i], o.out_path = out[i], o.log_path = logp[i];
    return o;
}

static int count_lines(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    int n = 0, ch;
    while ((ch = fgetc(f)) != EOF) n += ch == '\n';
    fclose(f);
    return n;
}

static int files_equal(const char *a, const char *b) {
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    int eq = fa && fb;
    while (eq) {
        int ca = fgetc(fa), cb = fgetc(fb);
        if (ca != cb) eq = 0;
        if (ca == EOF || cb == EOF) break;
    }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return eq;
}

/* The training losses of a JSONL log, in order (lines with "loss" but not "val_loss"). */
/* The numbers after each occurrence of key (one per line) in a JSONL log, at most max. */
static int read_values(const char *path, const char *key, double *out, int max) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[1024];
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        const char *p = strstr(line, key);
        if (p && n < max) out[n++] = atof(p + strlen(key));
    }
    fclose(f);
    return n;
}

static int read_losses(const char *path, double *out, int max) { return read_values(path, "\"loss\": ", out, max); }

static void check_resume(bool eight_bit, bool mixed, bool gpu) {
    CHECK(setup_corpus(), "%s", kiln_last_error());
    kiln_train_opts a = loop_opts(gpu ? (eight_bit ? "ag8" : "ag") : eight_bit ? "a8" : mixed ? "am" : "a");
    const kiln_device dev = {gpu ? KILN_DEVICE_CUDA : KILN_DEVICE_CPU, 0};
    a.adam.eight_bit = eight_bit, a.mixed = mixed, a.device = dev, a.deterministic = gpu;
    CHECK(kiln_train_run(&a, NULL, NULL) == KILN_OK, "%s", kiln_last_error());
    kiln_train_opts b = loop_opts(gpu ? (eight_bit ? "bg8" : "bg") : eight_bit ? "b8" : mixed ? "bm" : "b");
    b.adam.eight_bit = eight_bit, b.mixed = mixed, b.device = dev, b.deterministic = gpu;
    b.stop_after = 3;
    CHECK(kiln_train_run(&b, NULL, NULL) == KILN_OK, "%s", kiln_last_error());
    CHECK(!files_equal(a.out_path, b.out_path), "a run stopped at step 3 already equals the full run");
    b.stop_after = 0;
    b.resume = b.ckpt_path;
    CHECK(kiln_train_run(&b, NULL, NULL) == KILN_OK, "%s", kiln_last_error());
    CHECK(files_equal(a.out_path, b.out_path), "resumed model differs from the uninterrupted run");
    /* the logs read as one run: the same six training losses (the stopped run adds an evaluation at step 3) */
    double la[16], lb[16];
    int na = read_losses(a.log_path, la, 16), nb = read_losses(b.log_path, lb, 16);
    CHECK(na == 6 && nb == 6, "%d and %d training lines", na, nb);
    CHECK(memcmp(la, lb, sizeof la[0] * 6) == 0, "logged losses differ");
    CHECK(files_equal(a.ckpt_path, b.ckpt_path), "final checkpoints differ");
}

static void test_resume_bitexact(void) { check_resume(false, false, false); }
static void test_resume_bitexact_8bit_mixed(void) { check_resume(true, true, false); }
/* On the GPU with the deterministic option every reduction has a fixed order (the attention backward's dq, the
 * embedding scatter, the norm weight gradients, the AdamW norm; cuBLASLt with the same plan), so the resumed run is
 * the same bits as well. */
static void test_resume_bitexact_gpu(void) {
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    check_resume(false, true, true);
}
/* The same with 8-bit moments: their codes and scales stream through the checkpoint from the device and back. */
static void test_resume_bitexact_gpu_8bit(void) {
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    check_resume(true, true, true);
}

/* Gradient accumulation: two micro-batches of one sequence make the same step as one batch of two (the same
 * tokens, the gradient of the same mean); only the summation order differs, so the weights after 3 steps agree
 * to 1e-5 relative (measured 3e-7). */
static void test_grad_accum(void) {
    CHECK(setup_corpus());
    kiln_train_opts a = loop_opts("acc1"), b = loop_opts("acc2");
    a.steps = b.steps = 3, a.lr.total = b.lr.total = 3, a.eval_batches = b.eval_batches = 0;
    b.B = 1, b.grad_accum = 2;
    CHECK(kiln_train_run(&a, NULL, NULL) == KILN_OK, "%s", kiln_last_error());
    CHECK(kiln_train_run(&b, NULL, NULL) == KILN_OK, "%s", kiln_last_error());
    kiln_model *ma, *mb;
    CHECK(kiln_model_load(a.out_path, &ma) == KILN_OK && kiln_model_load(b.out_path, &mb) == KILN_OK);
    kiln_llama_train *ta, *tb;
    CHECK(kiln_llama_train_from_model(ma, false, &ta) == KILN_OK && kiln_llama_train_from_model(mb, false, &tb) == KILN_OK);
    double e = rel_err(ta->params, tb->params, ta->n_params);
    printf("# accumulation 2 x B=1 vs B=2: relative difference of the weights %.2g\n", e);
    CHECK(e < 1e-5, "relative difference %.3g", e);
    /* and the steps moved the weights well beyond that */
    kiln_llama_train *t0;
    kiln_llama_config c0 = ta->cfg;
    CHECK(kiln_llama_train_new(&c0, false, &t0) == KILN_OK);
    kiln_llama_train_init_random(t0, a.seed);
    double moved = rel_err(ta->params, t0->params, ta->n_params);
    CHECK(moved > 1e-2, "3 steps moved the weights by only %.3g", moved);
    kiln_llama_train_free(t0);
    kiln_llama_train_free(ta), kiln_llama_train_free(tb), kiln_model_free(ma), kiln_model_free(mb);
}

/* The exported model generates: kiln_model_load takes it and a session runs it. */
static void test_export_loads(void) {
    CHECK(setup_corpus());
    kiln_train_opts a = loop_opts("exp");
    a.steps = 2, a.lr.total = 2;
    CHECK(kiln_train_run(&a, NULL, NULL) == KILN_OK, "%s", kiln_last_error());
    kiln_model *m;
    CHECK(kiln_model_load(a.out_path, &m) == KILN_OK, "%s", kiln_last_error());
    CHECK(kiln_model_tokenizer(m) != NULL, "the export carries its tokenizer");
    kiln_gguf *g;
    CHECK(kiln_gguf_open(a.out_path, &g) == KILN_OK);
    CHECK(kiln_gguf_find_tensor(g, "optim.m") == NULL && kiln_gguf_find(g, "train.step") == NULL, "export has training state");
    kiln_gguf_close(g);
    kiln_model_free(m);
}

/* -V above the tokenizer's count pads the embedding table (as llm.c pads 50257 to 50304); the export pads the
 * tokenizer to the same rows with llama.cpp's "[PAD<id>]" UNUSED tokens, so the model loader, which requires the two
 * to be equal, takes it, and the padded ids are never what a text tokenizes to. */
static void test_export_pads_vocab(void) {
    CHECK(setup_corpus());
    kiln_train_opts a = loop_opts("pad");
    a.steps = 2, a.lr.total = 2;
    kiln_tokenizer *tok;
    kiln_gguf *tg;
    CHECK(kiln_gguf_open(a.tokenizer, &tg) == KILN_OK, "%s", kiln_last_error());
    CHECK(kiln_tokenizer_load_gguf(tg, &tok) == KILN_OK, "%s", kiln_last_error());
    const int n_tok = kiln_tokenizer_n_vocab(tok);
    kiln_tokenizer_free(tok), kiln_gguf_close(tg);
    a.dims.n_vocab = (n_tok + 63) / 64 * 64 + 64;
    CHECK(kiln_train_run(&a, NULL, NULL) == KILN_OK, "%s", kiln_last_error());
    kiln_model *m;
    CHECK(kiln_model_load(a.out_path, &m) == KILN_OK, "%s", kiln_last_error());
    const kiln_tokenizer *mt = kiln_model_tokenizer(m);
    CHECK(mt && kiln_tokenizer_n_vocab(mt) == a.dims.n_vocab, "the export's tokenizer has %d tokens, the model %lld rows",
          mt ? kiln_tokenizer_n_vocab(mt) : -1, (long long)a.dims.n_vocab);
    CHECK(kiln_tokenizer_token_type(mt, (int32_t)a.dims.n_vocab - 1) == 5, "a padding token is UNUSED");
    char text[64];
    snprintf(text, sizeof text, "[PAD%d] the text [PAD%lld]", n_tok, (long long)a.dims.n_vocab - 1);
    kiln_tokens ids = {0};
    CHECK(kiln_tokenizer_encode(mt, text, strlen(text), false, true, &ids) == KILN_OK, "%s", kiln_last_error());
    for (size_t i = 0; i < ids.n; i++) CHECK(ids.ids[i] < n_tok, "'%s' tokenized to padding id %d", text, ids.ids[i]);
    kiln_tokens_free(&ids);
    kiln_model_free(m);
}

/* Architectures the training forward does not compute are refused, never trained as plain llama. */
static void test_refuses_other_archs(void) {
    const char *files[] = {"tests/ref/arch_muse.gguf", "tests/ref/arch_qwen2.gguf", "tests/ref/arch_gemma3.gguf"};
    for (int i = 0; i < 3; i++) {
        kiln_model *m;
        CHECK(kiln_model_load(files[i], &m) == KILN_OK, "%s", kiln_last_error());
        kiln_llama_train *t = NULL;
        kiln_status s = kiln_llama_train_from_model(m, false, &t);
        kiln_model_free(m);
        CHECK(s == KILN_ERR_UNSUPPORTED && t == NULL, "%s was accepted for training", files[i]);
    }
}

/* A shard from another tokenizer is refused before the first step. */
static void test_fingerprint_preflight(void) {
    CHECK(setup_corpus());
    char other[256], corpus[256], dir2[256];
    snprintf(corpus, sizeof corpus, "%s/corpus.txt", work);
    snprintf(other, sizeof other, "%s/tok2.gguf", work);
    const char *paths[] = {corpus};
    kiln_bpe_train_params bp = {.vocab_size = 290, .min_frequency = 2, .n_threads = 1};
    CHECK(kiln_bpe_train(paths, 1, &bp, other) == KILN_OK);
    kiln_train_opts a = loop_opts("fp");
    a.tokenizer = other;
    snprintf(dir2, sizeof dir2, "%s", data_dir);
    a.data_dir = dir2;
    CHECK(kiln_train_run(&a, NULL, NULL) != KILN_OK);
    CHECK(strstr(kiln_last_error(), "fingerprint") != NULL, "%s", kiln_last_error());
}

/* `kiln train` killed with SIGKILL mid-run (checkpointing every step), then resumed with --resume, ends
 * byte-identical to an uninterrupted run of the same command. */
static void test_cli_kill_resume(void) {
    const char *bin = getenv("KILN_BIN");
    if (!bin || !*bin) SKIP("KILN_BIN is not set (make test sets it)");
    CHECK(setup_corpus());
    char cmd[2048], outa[300], outb[300], ckpt[300], logb[300];
    snprintf(outa, sizeof outa, "%s/cli_a.gguf", work);
    snprintf(outb, sizeof outb, "%s/cli_b.gguf", work);
    snprintf(ckpt, sizeof ckpt, "%s/cli_b.ckpt.gguf", work);
    snprintf(logb, sizeof logb, "%s/cli_b.jsonl", work);
    char common[1024];
    snprintf(common, sizeof common,
             "train --data %s -t %s -C 32 -L 2 --heads 4 --kv-heads 2 -F 64 -B 2 -T 16 --steps 40 --lr 3e-3 --warmup 4 "
             "--eval-batches 0 -j 2",
             data_dir, tok_path);
    snprintf(cmd, sizeof cmd, "'%s' %s -o %s 2>/dev/null", bin, common, outa);
    CHECK(system(cmd) == 0, "uninterrupted run failed");

    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        snprintf(cmd, sizeof cmd, "exec '%s' %s --ckpt %s --ckpt-every 1 --log %s -o %s 2>/dev/null", bin, common, ckpt, logb, outb);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    /* kill it once five steps are logged: well inside its 40 steps */
    int lines = 0;
    for (int spin = 0; spin < 100000 && lines < 5; spin++) {
        lines = count_lines(logb);
        if (lines < 5) usleep(200);
    }
    int status;
    bool exited = waitpid(pid, &status, WNOHANG) == pid;
    kill(pid, SIGKILL);
    if (!exited) waitpid(pid, &status, 0);
    CHECK(!exited, "the run finished before it could be killed");
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    CHECK(access(outb, F_OK) != 0, "a killed run left an export");
    snprintf(cmd, sizeof cmd, "'%s' %s --resume %s --ckpt %s --ckpt-every 1 --log %s -o %s 2>/dev/null", bin, common, ckpt, ckpt,
             logb, outb);
    CHECK(system(cmd) == 0, "resume failed");
    CHECK(files_equal(outa, outb), "the killed and resumed run differs from the uninterrupted one");
    double l[64];
    CHECK(read_losses(logb, l, 64) == 40, "the resumed log has %d training lines", read_losses(logb, l, 64));
}

/* The largest |x[i] - ref[i]| / ref[i] over n values (losses: positive). */
static double worst_rel(const double *x, const double *ref, int n) {
    double w = 0;
    for (int i = 0; i < n; i++) w = fmax(w, fabs(x[i] - ref[i]) / ref[i]);
    return w;
}

/* system(cmd) with its stderr kept; on failure, the last lines of it go to stdout as comments. */
static int run_logged(const char *cmd) {
    char full[2600];
    snprintf(full, sizeof full, "%s 2>%s/kiln.err", cmd, work);
    const int rc = system(full);
    if (rc != 0) {
        snprintf(full, sizeof full, "tail -4 %s/kiln.err | sed 's/^/# /'", work);
        if (system(full) != 0) fprintf(stderr, "could not show %s/kiln.err\n", work);
    }
    return rc;
}

/* Data parallel over NCCL (issue #9): `kiln train --gpu --nproc 2 -B 2` (a global batch of 4: 2 sequences per
 * GPU) against `kiln train --gpu -B 4` on one GPU, 50 steps of the same tokens from the same weights: the loss curves
 * agree within rounding (the gradient is summed in another order: GEMM accumulation over 4 rows against two
 * 2-row halves added by NCCL, so the last bits differ and grow a little over the steps; bound 4e-3 relative per
 * step, 5x the 7.6e-4 measured on two H200s), with and without ZeRO-1; and a ZeRO-1 run stopped at step 25 and
 * resumed from its checkpoint (the moments gathered from both ranks, then sharded again) logs the same losses as
 * the uninterrupted one (NCCL sums in the same order on the same two GPUs). Skips below 2 GPUs or without NCCL. */
static void test_cli_data_parallel(void) {
    const char *bin = getenv("KILN_BIN");
    if (!bin || !*bin) SKIP("KILN_BIN is not set (make test sets it)");
    if (!kiln_dist_available()) SKIP("kiln was built without NCCL");
    if (kiln_cuda_device_count() < 2) SKIP("fewer than 2 CUDA devices");
    CHECK(setup_corpus());
    char cmd[2048], common[1024], log1[300], log2[300], logz[300];
    snprintf(log1, sizeof log1, "%s/dp1.jsonl", work);
    snprintf(log2, sizeof log2, "%s/dp2.jsonl", work);
    snprintf(logz, sizeof logz, "%s/dpz.jsonl", work);
    snprintf(common, sizeof common,
             "train --gpu --deterministic --data %s -t %s -C 64 -L 2 --heads 4 --kv-heads 2 -F 128 -T 16 --steps 50 --lr 3e-3 "
             "--warmup 5 --eval-batches 0",
             data_dir, tok_path);
    snprintf(cmd, sizeof cmd, "'%s' %s -B 4 --log %s", bin, common, log1);
    CHECK(run_logged(cmd) == 0, "the one-GPU run failed");
    snprintf(cmd, sizeof cmd, "'%s' %s -B 2 --nproc 2 --log %s", bin, common, log2);
    CHECK(run_logged(cmd) == 0, "the two-GPU run failed");
    snprintf(cmd, sizeof cmd, "'%s' %s -B 2 --nproc 2 --zero1 --log %s", bin, common, logz);
    CHECK(run_logged(cmd) == 0, "the two-GPU ZeRO-1 run failed");
    double a[64], b[64], z[64];
    CHECK(read_losses(log1, a, 64) == 50 && read_losses(log2, b, 64) == 50 && read_losses(logz, z, 64) == 50,
          "the logs have %d, %d and %d training lines", read_losses(log1, a, 64), read_losses(log2, b, 64), read_losses(logz, z, 64));
    const double worst = worst_rel(b, a, 50), worst_z = worst_rel(z, a, 50);
    printf("# data parallel, 50 steps: worst step-loss relative difference %.2e (all-reduce), %.2e (ZeRO-1); first %.4f, last "
           "%.4f\n", worst, worst_z, a[0], a[49]);
    CHECK(a[49] < a[0], "the one-GPU run did not learn (%.4f -> %.4f)", a[0], a[49]);
    CHECK(worst <= 4e-3 && worst_z <= 4e-3, "the loss curves differ by %.3g and %.3g", worst, worst_z);
    char logr[300], ckpt[300];
    snprintf(logr, sizeof logr, "%s/dpr.jsonl", work);
    snprintf(ckpt, sizeof ckpt, "%s/dpr.ckpt.gguf", work);
    snprintf(cmd, sizeof cmd, "'%s' %s -B 2 --nproc 2 --zero1 --stop-after 25 --ckpt %s --log %s", bin, common, ckpt, logr);
    CHECK(run_logged(cmd) == 0, "the stopped ZeRO-1 run failed");
    snprintf(cmd, sizeof cmd, "'%s' %s -B 2 --nproc 2 --zero1 --resume %s --ckpt %s --log %s", bin, common, ckpt, ckpt, logr);
    CHECK(run_logged(cmd) == 0, "the resumed ZeRO-1 run failed");
    double r[64];
    CHECK(read_losses(logr, r, 64) == 50, "the resumed log has %d training lines", read_losses(logr, r, 64));
    CHECK(memcmp(r, z, sizeof r[0] * 50) == 0, "the resumed ZeRO-1 run's losses differ from the uninterrupted one's");

    /* the same stopped ZeRO-1 run resumed on one GPU at B 4 (the same global batch) follows the 2-GPU curve */
    char loge[300], ckpte[300];
    snprintf(loge, sizeof loge, "%s/dpe.jsonl", work), snprintf(ckpte, sizeof ckpte, "%s/dpe.ckpt.gguf", work);
    snprintf(cmd, sizeof cmd, "'%s' %s -B 2 --nproc 2 --zero1 --stop-after 25 --ckpt %s --log %s", bin, common, ckpte, loge);
    CHECK(run_logged(cmd) == 0, "the stopped ZeRO-1 run failed");
    snprintf(cmd, sizeof cmd, "'%s' %s -B 4 --resume %s --ckpt %s --log %s", bin, common, ckpte, ckpte, loge);
    CHECK(run_logged(cmd) == 0, "resuming the 2-GPU checkpoint on one GPU failed");
    CHECK(read_losses(loge, r, 64) == 50, "the elastic resume's log has %d training lines", read_losses(loge, r, 64));
    const double worst_e = worst_rel(r, z, 50);
    printf("# 2-GPU ZeRO-1 checkpoint resumed on one GPU: worst step-loss relative difference %.2e\n", worst_e);
    CHECK(worst_e <= 4e-3, "the resumed curve differs by %.3g", worst_e);

    /* ZeRO-1 with two micro-batches a step, evaluations and an export, against one GPU with the same: the step and
     * val losses within the bound above, and the exported weights within 1e-2 relative L2 (a bound not yet
     * calibrated on GPUs; an export that missed the gather of the fp32 masters would carry rank 1's stale half,
     * the initial weights, off by far more) */
    char la[300], lz[300], oa[300], oz[300];
    snprintf(la, sizeof la, "%s/acc1.jsonl", work), snprintf(lz, sizeof lz, "%s/accz.jsonl", work);
    snprintf(oa, sizeof oa, "%s/acc1.gguf", work), snprintf(oz, sizeof oz, "%s/accz.gguf", work);
    const char *more = "--accum 2 --eval-every 10 --eval-batches 2";
    snprintf(cmd, sizeof cmd, "'%s' %s -B 4 %s -o %s --log %s", bin, common, more, oa, la);
    CHECK(run_logged(cmd) == 0, "the one-GPU run with accumulation failed");
    snprintf(cmd, sizeof cmd, "'%s' %s -B 2 --nproc 2 --zero1 %s -o %s --log %s", bin, common, more, oz, lz);
    CHECK(run_logged(cmd) == 0, "the ZeRO-1 run with accumulation failed");
    CHECK(read_losses(la, a, 64) == 50 && read_losses(lz, z, 64) == 50, "the accumulation logs are short");
    const double wl = worst_rel(z, a, 50);
    double va[8], vz[8];
    const int nva = read_values(la, "\"val_loss\": ", va, 8), nvz = read_values(lz, "\"val_loss\": ", vz, 8);
    CHECK(nva == 5 && nvz == 5, "%d and %d evaluations logged, expected 5", nva, nvz);
    const double wv = worst_rel(vz, va, nva);
    kiln_gguf *ga, *gz;
    CHECK(kiln_gguf_open(oa, &ga) == KILN_OK && kiln_gguf_open(oz, &gz) == KILN_OK, "%s", kiln_last_error());
    double d2 = 0, a2 = 0;
    for (int64_t i = 0; i < kiln_gguf_n_tensors(ga); i++) {
        const kiln_tensor_view *ta = kiln_gguf_tensor_at(ga, i), *tz = kiln_gguf_find_tensor(gz, ta->name);
        CHECK(tz && ta->type == KILN_TYPE_F32 && tz->type == KILN_TYPE_F32 && ta->nbytes == tz->nbytes, "tensor %s differs in kind",
              ta->name);
        const float *xa = ta->data, *xz = tz->data;
        for (size_t k = 0; k < ta->nbytes / 4; k++) d2 += ((double)xz[k] - xa[k]) * ((double)xz[k] - xa[k]), a2 += (double)xa[k] * xa[k];
    }
    kiln_gguf_close(ga), kiln_gguf_close(gz);
    const double wrel = sqrt(d2 / a2);
    printf("# ZeRO-1 with accumulation: worst step loss %.2e, worst val loss %.2e, exported weights rel-L2 %.2e\n", wl, wv, wrel);
    CHECK(wl <= 4e-3 && wv <= 4e-3 && wrel <= 1e-2, "ZeRO-1 with accumulation differs: losses %.3g, val %.3g, weights %.3g", wl,
          wv, wrel);
}

/* A resume keeps the global batch (B x ranks) and T, which fix the data order and the schedule: another B on
 * the same number of ranks, or another T, is refused, naming both. */
static void test_resume_refuses_other_batch(void) {
    CHECK(setup_corpus());
    kiln_train_opts a = loop_opts("gb");
    a.steps = 2, a.lr.total = 2;
    CHECK(kiln_train_run(&a, NULL, NULL) == KILN_OK, "%s", kiln_last_error());
    for (int k = 0; k < 2; k++) {
        kiln_train_opts b = loop_opts("gb2");
        b.steps = 4, b.lr.total = 4, b.resume = a.ckpt_path;
        if (k == 0) b.B = a.B + 1;
        else b.T = a.T / 2;
        CHECK(kiln_train_run(&b, NULL, NULL) == KILN_ERR_INVALID, "a resume with another %s was accepted", k ? "T" : "B");
        CHECK(strstr(kiln_last_error(), "global batch"), "%s", kiln_last_error());
    }
}

/* `--nproc N` that cannot run is refused by the launcher itself, before any rank starts: without --gpu, and with
 * more ranks than GPUs (checked against this machine's count, so it runs with or without GPUs). */
static void test_cli_nproc_refusals(void) {
    const char *bin = getenv("KILN_BIN");
    if (!bin || !*bin) SKIP("KILN_BIN is not set (make test sets it)");
    CHECK(setup_corpus());
    const int n_dev = kiln_cuda_device_count();
    char cmd[1024], out[1024], want[128];
    const char *args[2] = {"--nproc 2", "--gpu --nproc 4096"};
    for (int k = 0; k < 2; k++) {
        snprintf(cmd, sizeof cmd, "'%s' train %s --data %s -t %s -C 32 -L 1 --heads 2 -F 64 -T 8 -B 1 --steps 1 2>&1", bin, args[k],
                 data_dir, tok_path);
        FILE *p = popen(cmd, "r");
        CHECK(p);
        const size_t got = fread(out, 1, sizeof out - 1, p);
        out[got] = 0;
        const int rc = pclose(p);
        if (k == 0) snprintf(want, sizeof want, "--nproc 2 trains on 2 GPUs: add --gpu");
        else snprintf(want, sizeof want, "--nproc 4096 needs 4096 GPUs; this machine has %d", n_dev);
        CHECK(rc != 0 && strstr(out, want) && !strstr(out, "rank "), "%s: status %d, said: %s", args[k], rc, out);
    }
}

/* SIGKILL during a checkpoint write: the previous checkpoint stays whole and loads. */
static void test_kill_during_checkpoint(void) {
    char dir[] = "/tmp/kiln-kill-XXXXXX", path[256];
    CHECK(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/ckpt.gguf", dir);
    /* big enough (about 40 MB with moments) that a write takes a while */
    kiln_llama_config c = {.n_vocab = 4096, .n_embd = 256, .n_layer = 4, .n_head = 8, .n_head_kv = 4, .n_ff = 704,
                           .n_ctx_train = 64, .rope_base = 10000.0f, .rms_eps = 1e-5f};
    kiln_llama_train *m;
    CHECK(kiln_llama_train_new(&c, false, &m) == KILN_OK);
    kiln_llama_train_init_random(m, 3);
    kiln_param_segment *segs = malloc((size_t)m->n_tensors * sizeof *segs);
    kiln_train_segments(m, segs);
    kiln_adamw_cfg cfg = kiln_adamw_defaults();
    kiln_adamw opt;
    CHECK(kiln_adamw_init(&opt, &cfg, m->n_params, segs, m->n_tensors) == KILN_OK);
    kiln_train_state st = {.step = 1, .data_pos = 111, .seed = 3, .B = 1, .T = 64};
    CHECK(kiln_train_save(m, NULL, "k", &opt, &st, path) == KILN_OK, "%s", kiln_last_error());
    float p0 = m->params[12345];

    int killed_mid_write = 0;
    for (int attempt = 0; attempt < 20 && !killed_mid_write; attempt++) {
        pid_t pid = fork();
        CHECK(pid >= 0);
        if (pid == 0) {
            st.step = 2;
            for (int64_t i = 0; i < m->n_params; i++) m->params[i] += 1.0f;
            for (;;) kiln_train_save(m, NULL, "k", &opt, &st, path);
        }
        char tmp[300];
        snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)pid);
        struct stat sb;
        for (int spin = 0; spin < 200000; spin++) {
            if (stat(tmp, &sb) == 0 && sb.st_size > 0) {
                /* a moment into the write, so the temp file is part-written */
                usleep(1000 + 500 * attempt);
                break;
            }
            usleep(50);
        }
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        killed_mid_write = stat(tmp, &sb) == 0;
        unlink(tmp);
    }
    CHECK(killed_mid_write, "never caught the child inside a checkpoint write");
    kiln_llama_train *back;
    kiln_adamw opt2;
    kiln_train_state st2;
    CHECK(kiln_train_load_checkpoint(path, false, &cfg, &back, &opt2, &st2) == KILN_OK, "%s", kiln_last_error());
    /* whichever checkpoint is there is whole: step 1 with the old weights or step 2 with the new */
    CHECK((st2.step == 1 && back->params[12345] == p0) || (st2.step == 2 && back->params[12345] == p0 + 1.0f));
    CHECK(st2.data_pos == 111 && st2.T == 64);
    kiln_adamw_free(&opt2);
    kiln_llama_train_free(back);
    kiln_adamw_free(&opt);
    free(segs);
    kiln_llama_train_free(m);
    unlink(path);
    rmdir(dir);
}

/* ---- hardening (issue 17): options, damaged checkpoints, the weight guard, failing outputs */

/* The options are checked in the library, the field named: a NaN rate, a floor above the peak, warmup past the
 * schedule, an infinite clip, smoothing of 5, a negative time, beta2 of 1, B of 0; kiln_train_run also its own
 * (grad_accum). Nothing is built or written for any of them. */
static void test_opts_validated(void) {
    const char *fields[] = {"lr.lr", "lr.min_lr", "lr.warmup", "adam.grad_clip", "label_smoothing",
                            "time_budget_s", "adam.beta2", "opts.B", "grad_accum", "steps"};
    for (size_t k = 0; k < sizeof fields / sizeof fields[0]; k++) {
        kiln_train_opts o = kiln_train_defaults();
        o.dims = (kiln_model_dims){.n_vocab = 64, .n_embd = 16, .n_layer = 1, .n_head = 2, .n_head_kv = 1, .n_ff = 32};
        o.B = 1, o.T = 8, o.steps = 10, o.lr.warmup = 2, o.lr.total = 10;
        switch (k) {
        case 0: o.lr.lr = NAN; break;
        case 1: o.lr.min_lr = 2 * o.lr.lr; break;
        case 2: o.lr.warmup = 11; break;
        case 3: o.adam.grad_clip = INFINITY; break;
        case 4: o.label_smoothing = 5; break;
        case 5: o.time_budget_s = -5; break;
        case 6: o.adam.beta2 = 1; break;
        case 7: o.B = 0; break;
        case 8: o.grad_accum = 0; break;
        case 9: o.steps = (int64_t)1e13; break;
        }
        kiln_trainer *t = NULL;
        kiln_status s = k == 8 ? (o.data_dir = "/nonexistent", kiln_train_run(&o, NULL, NULL)) : kiln_trainer_new(&o, &t);
        CHECK(s == KILN_ERR_INVALID && !t, "case %s: status %d", fields[k], (int)s);
        CHECK(strstr(kiln_last_error(), fields[k]), "case %s: %s", fields[k], kiln_last_error());
    }
}

/* Overwrites element i of tensor name in the GGUF at path with v (the file's bytes, in place). */
static int poke_tensor(const char *path, const char *name, int64_t i, float v) {
    kiln_gguf *g;
    if (kiln_gguf_open(path, &g) != KILN_OK) return 0;
    const kiln_tensor_view *t = kiln_gguf_find_tensor(g, name);
    const long off = t && t->type == KILN_TYPE_F32 ? (long)(kiln_gguf_data_offset(g) + t->offset + 4 * (uint64_t)i) : -1;
    kiln_gguf_close(g);
    FILE *f = off >= 0 ? fopen(path, "r+b") : NULL;
    int ok = f && fseek(f, off, SEEK_SET) == 0 && fwrite(&v, 4, 1, f) == 1;
    if (f) ok = fclose(f) == 0 && ok;
    return ok;
}

static int copy_file(const char *from, const char *to) {
    char cmd[700];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", from, to);
    return system(cmd) == 0;
}

/* A resume refuses what would poison the run, naming it: a NaN first moment, a negative second moment, a NaN weight,
 * a step past the schedule, and absurd run keys (a step of 1e15, as a damaged file might hold). */
static void test_resume_refuses_bad_state(void) {
    CHECK(setup_corpus());
    kiln_train_opts a = loop_opts("rv");
    a.steps = 2, a.lr.total = 2;
    CHECK(kiln_train_run(&a, NULL, NULL) == KILN_OK, "%s", kiln_last_error());
    char bad[300];
    snprintf(bad, sizeof bad, "%s/rv.bad.gguf", work);
    const struct { const char *tensor; float v; const char *says; } pokes[] = {
        {"optim.m", NAN, "optim.m"}, {"optim.v", -1.0f, "optim.v"}, {"blk.1.ffn_up.weight", NAN, "blk.1.ffn_up.weight"},
    };
    for (int k = 0; k < 3; k++) {
        CHECK(copy_file(a.ckpt_path, bad) && poke_tensor(bad, pokes[k].tensor, 5, pokes[k].v));
        kiln_train_opts b = loop_opts("rv2");
        b.resume = bad;
        kiln_trainer *t = NULL;
        const kiln_status s = kiln_trainer_new(&b, &t);
        CHECK(s == KILN_ERR_FORMAT && !t && strstr(kiln_last_error(), pokes[k].says), "%s: status %d: %s", pokes[k].tensor, (int)s,
              kiln_last_error());
        CHECK(kiln_train_run(&b, NULL, NULL) == KILN_ERR_FORMAT, "kiln_train_run resumed a damaged %s", pokes[k].tensor);
    }
    /* past the schedule: the 2-step checkpoint resumed as a 1-step run */
    kiln_train_opts c = loop_opts("rv3");
    c.resume = a.ckpt_path, c.steps = 1, c.lr.total = 1, c.lr.warmup = 1;
    CHECK(kiln_train_run(&c, NULL, NULL) == KILN_ERR_INVALID && strstr(kiln_last_error(), "past this run's 1 steps"), "%s",
          kiln_last_error());
    /* a huge step, written as a real checkpoint would be */
    kiln_llama_config cfg = {.n_vocab = 300, .n_embd = 32, .n_layer = 2, .n_head = 4, .n_head_kv = 2, .n_ff = 64, .n_ctx_train = 16,
                             .rope_base = 10000.0f, .rms_eps = 1e-5f};
    kiln_llama_train *m;
    CHECK(kiln_llama_train_new(&cfg, false, &m) == KILN_OK);
    kiln_llama_train_init_random(m, 1);
    kiln_param_segment *segs = malloc((size_t)m->n_tensors * sizeof *segs);
    kiln_train_segments(m, segs);
    kiln_adamw_cfg ac = kiln_adamw_defaults();
    kiln_adamw opt;
    CHECK(kiln_adamw_init(&opt, &ac, m->n_params, segs, m->n_tensors) == KILN_OK);
    kiln_train_state st = {.step = (int64_t)1e15, .seed = 1, .B = 2, .T = 16, .world = 1};
    CHECK(kiln_train_save(m, NULL, "huge", &opt, &st, bad) == KILN_OK, "%s", kiln_last_error());
    kiln_train_opts d = loop_opts("rv4");
    d.resume = bad;
    CHECK(kiln_train_run(&d, NULL, NULL) == KILN_ERR_FORMAT && strstr(kiln_last_error(), "out of range"), "%s", kiln_last_error());
    kiln_adamw_free(&opt);
    free(segs);
    kiln_llama_train_free(m);
}

/* A checkpoint or export with a non-finite weight or moment is refused and nothing is written (no file, no temp). */
static void test_write_refuses_nonfinite(void) {
    char dir[] = "/tmp/kiln-nanw-XXXXXX", path[256], tmp[300];
    CHECK(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/m.gguf", dir);
    kiln_llama_config cfg = {.n_vocab = 64, .n_embd = 16, .n_layer = 1, .n_head = 2, .n_head_kv = 1, .n_ff = 32, .n_ctx_train = 8,
                             .rope_base = 10000.0f, .rms_eps = 1e-5f};
    kiln_llama_train *m;
    CHECK(kiln_llama_train_new(&cfg, false, &m) == KILN_OK);
    kiln_llama_train_init_random(m, 1);
    kiln_param_segment *segs = malloc((size_t)m->n_tensors * sizeof *segs);
    kiln_train_segments(m, segs);
    kiln_adamw_cfg ac = kiln_adamw_defaults();
    kiln_adamw opt;
    CHECK(kiln_adamw_init(&opt, &ac, m->n_params, segs, m->n_tensors) == KILN_OK);
    kiln_train_state st = {.step = 1, .seed = 1, .B = 1, .T = 8, .world = 1};
    m->params[m->n_params - 3] = INFINITY;
    CHECK(kiln_train_save(m, NULL, "x", NULL, NULL, path) == KILN_ERR_INVALID, "an export with Inf was written");
    CHECK(strstr(kiln_last_error(), "nothing was written"), "%s", kiln_last_error());
    m->params[m->n_params - 3] = 0.5f;
    opt.v[7] = NAN;
    CHECK(kiln_train_save(m, NULL, "x", &opt, &st, path) == KILN_ERR_INVALID && strstr(kiln_last_error(), "optim.v"), "%s",
          kiln_last_error());
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    CHECK(access(path, F_OK) != 0 && access(tmp, F_OK) != 0, "a refused write left a file");
    opt.v[7] = 0;
    CHECK(kiln_train_save(m, NULL, "x", &opt, &st, path) == KILN_OK, "%s", kiln_last_error());
    unlink(path);
    rmdir(dir);
    kiln_adamw_free(&opt);
    free(segs);
    kiln_llama_train_free(m);
}

/* The guard on the updated weights in a real run: a checkpoint whose first moment is 3e38 where v is 0 (finite, so
 * the resume takes it) makes every update overflow that weight. Every step is skipped, not applied; the run says
 * how many and fails, and its export holds finite weights (the checkpoint's). */
static void test_weight_guard_run(void) {
    CHECK(setup_corpus());
    kiln_train_opts a = loop_opts("wg");
    a.steps = 2, a.lr.total = 2;
    CHECK(kiln_train_run(&a, NULL, NULL) == KILN_OK, "%s", kiln_last_error());
    CHECK(poke_tensor(a.ckpt_path, "optim.m", 100, 3e38f) && poke_tensor(a.ckpt_path, "optim.v", 100, 0.0f));
    kiln_train_opts b = loop_opts("wg2");
    b.resume = a.ckpt_path;
    b.eval_batches = 0;
    const kiln_status s = kiln_train_run(&b, NULL, NULL);
    CHECK(s == KILN_ERR_RANGE && strstr(kiln_last_error(), "4 of the run's 4 steps were skipped"), "status %d: %s", (int)s,
          kiln_last_error());
    kiln_model *out;
    CHECK(kiln_model_load(b.out_path, &out) == KILN_OK, "%s", kiln_last_error());
    for (int64_t i = 0; i < kiln_gguf_n_tensors(out->gguf); i++) {
        const kiln_tensor_view *t = kiln_gguf_tensor_at(out->gguf, i);
        const float *x = t->data;
        for (size_t j = 0; j < t->nbytes / 4; j++) CHECK(isfinite(x[j]), "%s[%zu] is %g", t->name, j, x[j]);
    }
    kiln_model_free(out);
}

/* Stops the run's checkpoint from being written: at step 3 its folder goes (the last step's checkpoint is the only
 * one, ckpt_interval 0). */
static void lose_ckpt_dir(void *user, const kiln_progress *p) {
    if (p->train && p->train->step == 3 && strcmp(p->stage, "train") == 0) rmdir((const char *)user);
}

/* A checkpoint that cannot be written ends the run with its error, yet the final export is still written. */
static void test_ckpt_failure_still_exports(void) {
    CHECK(setup_corpus());
    char dir[300], ckpt[340];
    snprintf(dir, sizeof dir, "%s/gone", work);
    snprintf(ckpt, sizeof ckpt, "%s/ckpt.gguf", dir);
    CHECK(mkdir(dir, 0755) == 0);
    kiln_train_opts o = loop_opts("cf");
    o.ckpt_path = ckpt, o.ckpt_interval = 0, o.eval_batches = 0;
    const kiln_status s = kiln_train_run(&o, lose_ckpt_dir, dir);
    CHECK(s == KILN_ERR_IO && strstr(kiln_last_error(), "exported to"), "status %d: %s", (int)s, kiln_last_error());
    CHECK(!strchr(kiln_last_error(), '\n'));
    kiln_model *out;
    CHECK(kiln_model_load(o.out_path, &out) == KILN_OK, "the export after the failed checkpoint: %s", kiln_last_error());
    kiln_model_free(out);
}

/* The outputs are checked before step 1: a missing folder, a folder as the path, -o the same file as --ckpt (by
 * name and through a symlinked folder); each fails before any progress is reported. */
static bool progressed;
static void note_progress(void *user, const kiln_progress *p) { progressed = true; }

static void test_outputs_checked_first(void) {
    CHECK(setup_corpus());
    char missing[300], link[300], via[340];
    snprintf(missing, sizeof missing, "%s/no/such/dir/out.gguf", work);
    snprintf(link, sizeof link, "%s/link", work);
    unlink(link);
    CHECK(symlink(work, link) == 0);
    for (int k = 0; k < 4; k++) {
        kiln_train_opts o = loop_opts("oc");
        if (k == 0) o.out_path = missing;
        else if (k == 1) o.ckpt_path = work;
        else if (k == 2) o.out_path = o.ckpt_path;
        else {
            snprintf(via, sizeof via, "%s/oc.ckpt.gguf", link);
            o.out_path = via;
        }
        progressed = false;
        const kiln_status s = kiln_train_run(&o, note_progress, NULL);
        CHECK(s != KILN_OK && !progressed, "case %d: status %d, progressed %d", k, (int)s, progressed);
        const char *want[] = {"does not exist", "is a folder", "same file", "same file"};
        CHECK(strstr(kiln_last_error(), want[k]), "case %d: %s", k, kiln_last_error());
    }
    unlink(link);
}

/* Temp files of killed runs beside the outputs are removed at the start: a dead process's, not a live one's. */
static void test_stale_temps_removed(void) {
    CHECK(setup_corpus());
    kiln_train_opts o = loop_opts("st");
    o.steps = 1, o.lr.total = 1, o.lr.warmup = 1, o.eval_batches = 0;
    pid_t dead = fork();
    CHECK(dead >= 0);
    if (dead == 0) _exit(0);
    waitpid(dead, NULL, 0);
    pid_t live = fork(); /* alive until killed below */
    CHECK(live >= 0);
    if (live == 0) {
        pause();
        _exit(0);
    }
    char dead_tmp[2][400], live_tmp[400], other[400];
    snprintf(dead_tmp[0], sizeof dead_tmp[0], "%s.tmp.%d", o.out_path, (int)dead);
    snprintf(dead_tmp[1], sizeof dead_tmp[1], "%s.tmp.%d", o.ckpt_path, (int)dead);
    snprintf(live_tmp, sizeof live_tmp, "%s.tmp.%d", o.ckpt_path, (int)live);
    snprintf(other, sizeof other, "%s.tmp.%dx", o.out_path, (int)dead); /* not a pid: not ours */
    const char *all[] = {dead_tmp[0], dead_tmp[1], live_tmp, other};
    for (int i = 0; i < 4; i++) {
        FILE *f = fopen(all[i], "w");
        CHECK(f && fputs("partial", f) >= 0 && fclose(f) == 0);
    }
    const kiln_status s = kiln_train_run(&o, NULL, NULL);
    kill(live, SIGKILL);
    waitpid(live, NULL, 0);
    CHECK(s == KILN_OK, "%s", kiln_last_error());
    CHECK(access(dead_tmp[0], F_OK) != 0 && access(dead_tmp[1], F_OK) != 0, "a dead run's temp file is still there");
    CHECK(access(live_tmp, F_OK) == 0 && access(other, F_OK) == 0, "a live run's temp file (or another file) was removed");
    unlink(live_tmp), unlink(other);
}

/* The log on a full disk (/dev/full): the run fails with the log named, not an empty log and success. */
static void test_log_write_errors(void) {
    CHECK(setup_corpus());
    if (access("/dev/full", W_OK) != 0) SKIP("no writable /dev/full");
    kiln_train_opts o = loop_opts("lf");
    o.log_path = "/dev/full";
    const kiln_status s = kiln_train_run(&o, NULL, NULL);
    CHECK(s == KILN_ERR_IO && strstr(kiln_last_error(), "/dev/full") && strstr(kiln_last_error(), "log"), "status %d: %s", (int)s,
          kiln_last_error());
}

int main(void) {
    RUN(test_grads_fp32);
    RUN(test_grads_mixed);
    RUN(test_adamw_steps);
    RUN(test_threads_deterministic);
    RUN(test_train_forward_matches_inference);
    RUN(test_resume_bitexact);
    RUN(test_resume_bitexact_8bit_mixed);
    RUN(test_resume_bitexact_gpu);
    RUN(test_resume_bitexact_gpu_8bit);
    RUN(test_grad_accum);
    RUN(test_export_loads);
    RUN(test_export_pads_vocab);
    RUN(test_refuses_other_archs);
    RUN(test_fingerprint_preflight);
    RUN(test_kill_during_checkpoint);
    RUN(test_cli_kill_resume);
    RUN(test_cli_data_parallel);
    RUN(test_cli_nproc_refusals);
    RUN(test_resume_refuses_other_batch);
    RUN(test_opts_validated);
    RUN(test_resume_refuses_bad_state);
    RUN(test_write_refuses_nonfinite);
    RUN(test_weight_guard_run);
    RUN(test_ckpt_failure_still_exports);
    RUN(test_outputs_checked_first);
    RUN(test_stale_temps_removed);
    RUN(test_log_write_errors);
    if (work[0]) {
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf %s", work);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", work);
    }
    TEST_EXIT();
}
