/* test_perplexity.c: kiln_perplexity against a direct computation: the mean NLL of every second-half token
 * of each BOS-led window, from logits taken one window at a time through a session. Uses a small synthetic
 * model with the Llama-2 vocabulary. */
#include "kiln.h"
#include "test.h"

#include <unistd.h>

typedef struct {
    int calls;
    bool bad; /* a call of another stage, out of order, or with another total */
    kiln_progress last;
} progress_seen;

static void on_progress(void *ud, const kiln_progress *pr) {
    progress_seen *s = ud;
    if (strcmp(pr->stage, "perplexity") != 0 || pr->done != s->last.done + 1 || (s->calls && pr->total != s->last.total))
        s->bad = true;
    s->calls++;
    s->last = *pr;
}

static void test_perplexity_matches_direct(void) {
    char vocab[512], path[64];
    snprintf(vocab, sizeof vocab, "%s/vocab/ggml-vocab-llama-spm.gguf", test_data_dir());
    if (access(vocab, R_OK) != 0) SKIP("%s not found (needs ../shared/data)", vocab);
    snprintf(path, sizeof path, "/tmp/kiln-ppl-%d.gguf", (int)getpid());
    kiln_synth_params sp = kiln_synth_default();
    sp.n_embd = 64, sp.n_layer = 2, sp.n_head = 4, sp.n_head_kv = 2, sp.n_ff = 128, sp.vocab_path = vocab;
    CHECK(kiln_synth_llama(path, &sp) == KILN_OK, "%s", kiln_last_error());
    kiln_model *m;
    CHECK(kiln_model_load(path, &m) == KILN_OK, "%s", kiln_last_error());
    unlink(path);
    const char *text = "Once upon a time there was a little girl who lived in a village near the forest. "
                       "Whenever she went out, the little girl wore a red riding cloak, so everyone in the village "
                       "called her Little Red Riding Hood. One morning she asked her mother if she could go visit her grandmother.";
    const int64_t n_ctx = 16;
    kiln_perplexity_result r;
    /* the model's info: the synth shape above, and every tensor's elements counted */
    kiln_model_info info;
    kiln_model_get_info(m, &info);
    int64_t n_params = 0;
    for (int64_t i = 0; i < kiln_gguf_n_tensors(kiln_model_gguf(m)); i++) {
        const kiln_tensor_view *t = kiln_gguf_tensor_at(kiln_model_gguf(m), i);
        n_params += t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
    }
    CHECK(strcmp(info.arch, "llama") == 0 && info.n_embd == 64 && info.n_layer == 2 && info.n_head == 4 &&
              info.n_head_kv == 2 && info.n_ff == 128 && info.head_dim == 16 && info.n_params == n_params && n_params > 0,
          "%s C %lld L %lld params %lld", info.arch, (long long)info.n_embd, (long long)info.n_layer, (long long)info.n_params);
    /* a session's device: a negative index is refused, and a device this machine lacks (no GPU, no CUDA build, or
     * fewer devices) fails at the backend's open, naming why */
    kiln_session *bad = NULL;
    CHECK(kiln_session_new(m, &(kiln_session_params){.device = {KILN_DEVICE_CUDA, -1}}, &bad) == KILN_ERR_INVALID && !bad &&
              strstr(kiln_last_error(), "index -1 is negative"),
          "%s", kiln_last_error());
    kiln_status ds = kiln_session_new(m, &(kiln_session_params){.device = {KILN_DEVICE_CUDA, 64}}, &bad);
    CHECK(ds != KILN_OK && !bad && (strstr(kiln_last_error(), "device 64 does not exist") || strstr(kiln_last_error(), "CUDA")),
          "%d %s", ds, kiln_last_error());
    progress_seen seen = {0};
    kiln_status s = kiln_perplexity(m, text, strlen(text), n_ctx, &(kiln_session_params){.n_threads = 2}, on_progress, &seen, &r);
    if (s) kiln_model_free(m);
    CHECK(s == KILN_OK, "%s", kiln_last_error());
    /* direct: the same windows, scored here */
    kiln_tokens ids = {0};
    kiln_tokenizer_encode(kiln_model_tokenizer(m), text, strlen(text), true, false, &ids);
    int64_t V = kiln_model_n_vocab(m), windows = (int64_t)ids.n / n_ctx, n = 0;
    float *logits = malloc((size_t)(n_ctx * V) * sizeof *logits);
    kiln_session *sess;
    kiln_session_params p = {.n_ctx = n_ctx, .n_threads = 1};
    double sum = 0;
    CHECK(kiln_session_new(m, &p, &sess) == KILN_OK);
    for (int64_t w = 0; w < windows; w++) {
        int32_t win[16];
        memcpy(win, ids.ids + w * n_ctx, sizeof win);
        win[0] = kiln_tokenizer_bos(kiln_model_tokenizer(m));
        kiln_session_reset(sess);
        CHECK(kiln_session_eval(sess, win, (size_t)n_ctx, NULL, logits) == KILN_OK);
        for (int64_t i = n_ctx / 2; i < n_ctx - 1; i++, n++) {
            double z = 0;
            for (int64_t v = 0; v < V; v++) z += exp((double)logits[i * V + v]);
            sum += log(z) - logits[i * V + win[i + 1]];
        }
    }
    kiln_session_free(sess);
    free(logits);
    kiln_tokens_free(&ids);
    kiln_model_free(m);
    double ppl = exp(sum / (double)n);
    CHECK(r.n_windows == windows && r.n_scored == n, "%lld windows, %lld scored; direct %lld, %lld", (long long)r.n_windows,
          (long long)r.n_scored, (long long)windows, (long long)n);
    CHECK(fabs(r.ppl - ppl) < 1e-6 * ppl, "ppl %.9g, direct %.9g", r.ppl, ppl);
    /* one progress call a window, in order, the last one with the final perplexity */
    CHECK(!seen.bad && seen.calls == windows && seen.last.done == windows && seen.last.total == windows &&
          seen.last.metric == r.ppl, "%d calls, last %lld/%lld ppl %.9g", seen.calls, (long long)seen.last.done,
          (long long)seen.last.total, seen.last.metric);
    /* a random model knows nothing: its perplexity is near the vocab size, and the error bar is finite */
    CHECK(r.ppl > 1000 && r.ppl < 3 * V && r.ppl_err > 0 && r.ppl_err < r.ppl, "ppl %.1f +/- %.1f", r.ppl, r.ppl_err);
}

int main(void) {
    RUN(test_perplexity_matches_direct);
    TEST_EXIT();
}
