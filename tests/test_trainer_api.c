/* test_trainer_api.c: training through kiln.h alone, as a program built against the installed library would: a
 * tiny new model stepped ten times on a synthetic token stream (the loss falls), a checkpoint and an export written,
 * the export loaded back with kiln_model_load and run, and the checkpoint resumed for two more steps that equal two
 * more steps of the trainer that wrote it. The CPU always; CUDA device 0 when there is one (skipped otherwise). */
#include "kiln.h"
#include "test.h"

#include <unistd.h>

enum { V = 64, B = 4, T = 16, STEPS = 10 };

/* A stream a small model learns quickly: each token is the previous one plus one (mod V), from random starts. */
static void batch(unsigned long long *rng, int32_t *inputs, int32_t *targets) {
    for (int b = 0; b < B; b++) {
        int32_t x = (int32_t)(test_rng_next(rng) % V);
        for (int t = 0; t < T; t++) {
            inputs[b * T + t] = x;
            x = (x + 1) % V;
            targets[b * T + t] = x;
        }
    }
}

static kiln_train_opts tiny_opts(kiln_device dev) {
    kiln_train_opts o = kiln_train_defaults();
    o.dims = (kiln_model_dims){.n_vocab = V, .n_embd = 32, .n_layer = 2, .n_head = 4, .n_head_kv = 2, .n_ff = 64};
    o.B = B, o.T = T, o.steps = STEPS + 2, o.n_threads = 2, o.device = dev, o.deterministic = true;
    o.lr = (kiln_lr_schedule){.lr = 1e-2f, .min_lr = 1e-3f, .warmup = 2};
    o.name = "api";
    return o;
}

static void check_trainer(kiln_device dev, const char *tag) {
    kiln_train_opts o = tiny_opts(dev);
    kiln_trainer *t;
    kiln_status s = kiln_trainer_new(&o, &t);
    if (s == KILN_ERR_UNSUPPORTED && dev.kind == KILN_DEVICE_CUDA) SKIP("%s", kiln_last_error()); /* no GPU, or no CUDA build */
    CHECK(s == KILN_OK, "%s", kiln_last_error());
    int32_t in[B * T], tg[B * T];
    unsigned long long rng = 3;
    double first = 0, last = 0;
    for (int i = 0; i < STEPS; i++) {
        batch(&rng, in, tg);
        double loss;
        CHECK(kiln_trainer_step(t, in, tg, &loss) == KILN_OK, "step %d: %s", i, kiln_last_error());
        CHECK(isfinite(loss), "step %d: loss %g", i, loss);
        if (i == 0) first = loss;
        last = loss;
    }
    CHECK(kiln_trainer_steps_done(t) == STEPS);
    /* ten steps at 1e-2 on a stream this regular: from ln(64) = 4.16 to well under it */
    printf("# %s: loss %.4f -> %.4f over %d steps\n", tag, first, last, STEPS);
    CHECK(last < first - 0.5, "the loss did not fall: %.4f -> %.4f", first, last);

    char dir[] = "/tmp/kiln-trainer-api-XXXXXX", ckpt[256], out[256], out2[256], out3[256];
    CHECK(mkdtemp(dir));
    snprintf(ckpt, sizeof ckpt, "%s/ckpt.gguf", dir);
    snprintf(out, sizeof out, "%s/model.gguf", dir);
    snprintf(out2, sizeof out2, "%s/model2.gguf", dir);
    snprintf(out3, sizeof out3, "%s/model3.gguf", dir);
    CHECK(kiln_trainer_save(t, ckpt) == KILN_OK, "%s", kiln_last_error());
    CHECK(kiln_trainer_export(t, out) == KILN_OK, "%s", kiln_last_error());

    /* the export is a llama GGUF any session runs */
    kiln_model *m;
    CHECK(kiln_model_load(out, &m) == KILN_OK, "%s", kiln_last_error());
    CHECK(kiln_model_n_vocab(m) == V && kiln_model_n_ctx_train(m) == T);
    kiln_session *ses;
    kiln_session_params sp = {.n_ctx = T, .n_threads = 1};
    CHECK(kiln_session_new(m, &sp, &ses) == KILN_OK, "%s", kiln_last_error());
    int32_t next = -1;
    CHECK(kiln_session_eval_argmax(ses, in, 4, &next) == KILN_OK, "%s", kiln_last_error());
    CHECK(next >= 0 && next < V);
    kiln_session_free(ses);
    kiln_model_free(m);

    /* the checkpoint resumes: two more steps from it equal two more steps of the trainer that wrote it */
    kiln_train_opts r = tiny_opts(dev);
    r.resume = ckpt;
    kiln_trainer *t2;
    CHECK(kiln_trainer_new(&r, &t2) == KILN_OK, "%s", kiln_last_error());
    CHECK(kiln_trainer_steps_done(t2) == STEPS);
    for (int i = 0; i < 2; i++) {
        batch(&rng, in, tg);
        double l1, l2;
        CHECK(kiln_trainer_step(t, in, tg, &l1) == KILN_OK && kiln_trainer_step(t2, in, tg, &l2) == KILN_OK, "%s", kiln_last_error());
        CHECK(l1 == l2, "resumed step %d: loss %.9g, uninterrupted %.9g", i, l2, l1);
    }
    CHECK(kiln_trainer_export(t, out2) == KILN_OK && kiln_trainer_export(t2, out3) == KILN_OK, "%s", kiln_last_error());
    FILE *a = fopen(out2, "rb"), *b = fopen(out3, "rb");
    CHECK(a && b);
    int same = 1, ca, cb;
    do {
        ca = fgetc(a), cb = fgetc(b);
        same = ca == cb;
    } while (same && ca != EOF);
    fclose(a), fclose(b);
    CHECK(same, "the resumed trainer's weights differ from the uninterrupted one's");
    kiln_trainer_free(t2);
    kiln_trainer_free(t);
    unlink(ckpt), unlink(out), unlink(out2), unlink(out3);
    rmdir(dir);
}

static void test_trainer_cpu(void) { check_trainer((kiln_device){KILN_DEVICE_CPU, 0}, "cpu"); }
static void test_trainer_cuda(void) { check_trainer((kiln_device){KILN_DEVICE_CUDA, 0}, "cuda"); }

/* Bad options are refused with a message, never trained. */
static void test_trainer_refusals(void) {
    kiln_train_opts o = tiny_opts((kiln_device){KILN_DEVICE_CPU, 0});
    o.dims.n_vocab = 0; /* a new model without a tokenizer has no vocab */
    kiln_trainer *t = NULL;
    CHECK(kiln_trainer_new(&o, &t) == KILN_ERR_INVALID && t == NULL);
    CHECK(strstr(kiln_last_error(), "tokenizer"), "%s", kiln_last_error());
    o = tiny_opts((kiln_device){KILN_DEVICE_CPU, 0});
    o.dims.n_head = 5; /* 32 does not split into 5 heads */
    CHECK(kiln_trainer_new(&o, &t) == KILN_ERR_INVALID && t == NULL);
    o = tiny_opts((kiln_device){KILN_DEVICE_CPU, 0});
    CHECK(kiln_trainer_new(&o, &t) == KILN_OK, "%s", kiln_last_error());
    int32_t in[B * T], tg[B * T];
    unsigned long long rng = 9;
    batch(&rng, in, tg);
    in[5] = V; /* outside the vocab */
    double loss;
    CHECK(kiln_trainer_step(t, in, tg, &loss) == KILN_ERR_RANGE, "an id outside the vocab was trained on");
    kiln_trainer_free(t);
}

int main(void) {
    RUN(test_trainer_cpu);
    RUN(test_trainer_cuda);
    RUN(test_trainer_refusals);
    TEST_EXIT();
}
