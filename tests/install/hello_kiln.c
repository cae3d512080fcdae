/* hello_kiln.c: a program outside kiln's tree, built by tests/test_install.sh against an installed kiln with
 * `cc hello_kiln.c $(pkg-config --cflags --libs kiln)`, statically and against libkiln.so. It sees only kiln.h:
 * it loads MODEL.gguf, samples N tokens after the prompt with a fixed seed on the CPU and prints the prompt and
 * the text to stdout; then it trains a new small model for ten steps on the prompt's tokens and prints the first
 * and the last loss ("train: 10 steps, loss A -> B"), so the two link modes can be compared byte for byte.
 * Errors go to stderr, exit status 1.
 *
 *   hello_kiln MODEL.gguf PROMPT N SEED */
#include <kiln.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(const char *what, kiln_status s) {
    fprintf(stderr, "hello_kiln: %s: %s: %s\n", what, kiln_status_name(s), kiln_last_error());
    return 1;
}

/* Prompt, then up to n_new sampled tokens; stops early at EOS or BOS as `kiln generate` does. */
static kiln_status generate(const kiln_model *m, const char *prompt, int n_new, uint64_t seed) {
    const kiln_tokenizer *tok = kiln_model_tokenizer(m);
    if (!tok) return KILN_ERR_NOT_FOUND;
    const int32_t bos = kiln_tokenizer_bos(tok), eos = kiln_tokenizer_eos(tok);
    const int64_t V = kiln_model_n_vocab(m);
    kiln_tokens seq = {0};
    kiln_session *sess = NULL;
    kiln_sampler *smp = NULL;
    float *logits = malloc((size_t)V * sizeof *logits);
    int32_t *ids = NULL;
    kiln_status s = logits ? KILN_OK : KILN_ERR_NOMEM;
    if (!s) s = kiln_tokenizer_encode(tok, prompt, strlen(prompt), true, false, &seq);
    if (!s) ids = malloc((seq.n + (size_t)n_new) * sizeof *ids);
    if (!s && !ids) s = KILN_ERR_NOMEM;
    kiln_session_params sp = {.n_ctx = (int64_t)seq.n + n_new, .n_threads = 1};
    if (!s) s = kiln_session_new(m, &sp, &sess);
    kiln_sampler_params pp = kiln_sampler_default();
    pp.seed = seed;
    if (!s) s = kiln_sampler_new(&pp, V, &smp);
    size_t n = seq.n;
    if (!s) {
        memcpy(ids, seq.ids, n * sizeof *ids);
        fputs(prompt, stdout);
        s = kiln_session_eval(sess, ids, n, logits, NULL);
    }
    for (int i = 0; !s && i < n_new; i++) {
        int32_t next = kiln_sampler_sample(smp, logits, ids, n);
        if (next == eos || next == bos) break;
        char piece[256];
        size_t len = 0;
        if ((s = kiln_tokenizer_piece(tok, next, false, piece, sizeof piece, &len))) break;
        fwrite(piece, 1, len < sizeof piece ? len : sizeof piece, stdout);
        ids[n++] = next;
        if (i + 1 < n_new) s = kiln_session_eval(sess, &next, 1, logits, NULL);
    }
    fputc('\n', stdout);
    free(ids);
    free(logits);
    kiln_tokens_free(&seq);
    kiln_sampler_free(smp);
    kiln_session_free(sess);
    return s;
}

/* Ten optimizer steps of a new 2-layer model on the prompt's tokens, repeated to fill one batch: the next token
 * of each position is its target. */
static kiln_status train_ten(const kiln_model *m, const char *prompt) {
    const kiln_tokenizer *tok = kiln_model_tokenizer(m);
    kiln_tokens seq = {0};
    kiln_status s = kiln_tokenizer_encode(tok, prompt, strlen(prompt), true, false, &seq);
    if (s) return s;
    kiln_train_opts o = kiln_train_defaults();
    o.dims = (kiln_model_dims){.n_vocab = kiln_model_n_vocab(m), .n_embd = 64, .n_layer = 2, .n_head = 4, .n_head_kv = 2,
                               .n_ff = 128, .n_ctx = 64};
    o.B = 2, o.T = 32, o.steps = 10, o.n_threads = 1, o.seed = 7;
    o.lr.lr = 3e-3f, o.lr.warmup = 1;
    int32_t inputs[64], targets[64];
    for (int i = 0; i < 64; i++) {
        inputs[i] = seq.ids[(size_t)i % seq.n];
        targets[i] = seq.ids[(size_t)(i + 1) % seq.n];
    }
    kiln_tokens_free(&seq);
    kiln_trainer *t = NULL;
    double first = 0, loss = 0;
    if (!(s = kiln_trainer_new(&o, &t)))
        for (int i = 0; i < 10 && !s; i++) {
            s = kiln_trainer_step(t, inputs, targets, &loss);
            if (i == 0) first = loss;
        }
    if (!s) printf("train: %lld steps, loss %.4f -> %.4f\n", (long long)kiln_trainer_steps_done(t), first, loss);
    kiln_trainer_free(t);
    return s;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: hello_kiln MODEL.gguf PROMPT N SEED\n");
        return 2;
    }
    kiln_model *m = NULL;
    kiln_status s = kiln_model_load(argv[1], &m);
    if (s) return fail(argv[1], s);
    s = generate(m, argv[2], atoi(argv[3]), strtoull(argv[4], NULL, 10));
    if (s) {
        kiln_model_free(m);
        return fail("generate", s);
    }
    s = train_ten(m, argv[2]);
    kiln_model_free(m);
    if (s) return fail("train", s);
    return 0;
}
