/* perplexity.c: `kiln perplexity`, the exponentiated mean negative log-likelihood of a text under a model, computed
 * as llama.cpp's llama-perplexity does (tools/perplexity/perplexity.cpp, perplexity()): the text is tokenized with
 * BOS only where the vocab's add_bos_token says so (Qwen2.5 says no) and never EOS; it is cut into
 * tokens / n_ctx non-overlapping windows (the tail is dropped), and at least two are needed; a window's first token
 * is replaced by BOS where add_bos_token says so; the first n_ctx/2 positions of each window are context only and
 * the n_ctx - 1 - n_ctx/2 predictions after them are scored. The log-softmax runs in double.
 * tests/test_perplexity.c checks it against a direct computation and against llama-perplexity's own figures
 * (tests/ref/perplexity_ref.txt). */
#include "model/model.h"
#include "status.h"
#include "tok/tok.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

kiln_status kiln_perplexity(const kiln_model *m, const char *text, size_t len, int64_t n_ctx, const kiln_session_params *run,
                            kiln_progress_fn progress, void *ud, kiln_perplexity_result *out) {
    memset(out, 0, sizeof *out);
    const kiln_tokenizer *tok = kiln_model_tokenizer(m);
    if (!tok) return kiln_fail(KILN_ERR_UNSUPPORTED, "perplexity: the model file has no tokenizer");
    if (n_ctx < 16) return kiln_fail(KILN_ERR_INVALID, "perplexity: a context of %lld tokens is too short (at least 16)", (long long)n_ctx);
    int64_t V = m->cfg.n_vocab;
    kiln_tokens ids = {0};
    kiln_session *sess = NULL;
    float *logits = NULL;
    int32_t *window = NULL;
    int32_t bos, eos_unused; /* bos: -1 where add_bos_token is false */
    kiln_tok_special_ends(tok, &bos, &eos_unused);
    kiln_status s = bos >= 0 ? kiln_tokens_push(&ids, bos) : KILN_OK;
    if (!s) s = kiln_tok_encode_part(tok, text, len, false, true, &ids);
    if (s) goto out;
    /* llama.cpp refuses fewer than two windows' tokens, so a figure always averages at least two windows */
    int64_t n_windows = (int64_t)ids.n / n_ctx;
    if (n_windows < 2) {
        s = kiln_fail(KILN_ERR_INVALID, "perplexity: the text has %zu tokens, fewer than two windows of %lld (as llama-perplexity, "
                      "at least %lld)", ids.n, (long long)n_ctx, 2 * (long long)n_ctx);
        goto out;
    }
    kiln_session_params sp = run ? *run : (kiln_session_params){0};
    sp.n_ctx = n_ctx;
    if ((s = kiln_session_new(m, &sp, &sess))) goto out;
    logits = malloc((size_t)n_ctx * (size_t)V * sizeof *logits);
    window = malloc((size_t)n_ctx * sizeof *window);
    if (!logits || !window) {
        s = kiln_fail(KILN_ERR_NOMEM, "perplexity: out of memory for %lld x %lld logits", (long long)n_ctx, (long long)V);
        goto out;
    }
    double sum = 0, sum2 = 0;
    int64_t n = 0;
    for (int64_t w = 0; w < n_windows; w++) {
        memcpy(window, ids.ids + w * n_ctx, (size_t)n_ctx * sizeof *window);
        if (bos >= 0) window[0] = bos;
        kiln_session_reset(sess);
        if ((s = kiln_session_eval(sess, window, (size_t)n_ctx, NULL, logits))) goto out;
        for (int64_t i = n_ctx / 2; i + 1 < n_ctx; i++) {
            const float *row = logits + i * V;
            float max = row[0];
            for (int64_t v = 1; v < V; v++) max = row[v] > max ? row[v] : max;
            double z = 0;
            for (int64_t v = 0; v < V; v++) z += exp((double)row[v] - max);
            double nll = log(z) + max - row[window[i + 1]];
            sum += nll, sum2 += nll * nll, n++;
        }
        if (progress) {
            const kiln_progress pr = {.stage = "perplexity", .done = w + 1, .total = n_windows, .metric = exp(sum / (double)n)};
            progress(ud, &pr);
        }
    }
    double mean = sum / (double)n, var = n > 1 ? (sum2 / (double)n - mean * mean) * (double)n / (double)(n - 1) : 0;
    out->ppl = exp(mean);
    out->ppl_err = out->ppl * sqrt(var > 0 ? var / (double)n : 0);
    out->n_scored = n;
    out->n_windows = n_windows;
out:
    free(window);
    free(logits);
    kiln_session_free(sess);
    kiln_tokens_free(&ids);
    return s;
}
