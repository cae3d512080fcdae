/* test_runtime.c: the session's runtime checks and its history (src/infer/session.c) and top-p 0 (src/infer/sampler.c).
 *
 * A tiny F32 llama from kiln_synth_llama is poisoned by writing huge finite weights (3e38) into one tensor of the
 * file, which overflow to infinities and NaNs at run time (the load refuses a NaN or an infinity in a weight itself):
 * the logits a session returns, and the row its greedy argmax reads, must then be an error naming the position,
 * and check_finite (or KILN_CHECK_FINITE=1) must name the stage that first holds one. Every check runs on the CPU and,
 * when a CUDA device is there, on the GPU (skipped otherwise). kiln_session_keep must give the logits of a fresh
 * session for the re-evaluated suffix, and top_p 0 must keep only the most likely token. */
#include "kiln.h"
#include "test.h"

#include <unistd.h>

static char tmp_dir[64];

#define V 64
#define L 3

/* A tiny F32 model at path; when tensor is not NULL, elements [first, first + n) of it are set to value. */
static bool make_model(const char *path, const char *tensor, int64_t first, int64_t n, float value) {
    kiln_synth_params p = kiln_synth_default();
    p.n_vocab = V, p.n_embd = 32, p.n_layer = L, p.n_head = 2, p.n_head_kv = 1, p.n_ff = 48, p.n_ctx = 64, p.n_threads = 1;
    if (kiln_synth_llama(path, &p) != KILN_OK) return false;
    if (!tensor) return true;
    kiln_gguf *g;
    if (kiln_gguf_open(path, &g) != KILN_OK) return false;
    const kiln_tensor_view *t = kiln_gguf_find_tensor(g, tensor);
    /* the view's offset is relative to the data section (gguf.c), whatever kiln.h's comment says */
    uint64_t off = t && t->type == KILN_TYPE_F32 ? kiln_gguf_data_offset(g) + t->offset + (uint64_t)first * sizeof(float) : 0;
    kiln_gguf_close(g);
    FILE *f = off ? fopen(path, "r+b") : NULL;
    if (!f) return false;
    bool ok = fseek(f, (long)off, SEEK_SET) == 0;
    for (int64_t i = 0; ok && i < n; i++) ok = fwrite(&value, sizeof value, 1, f) == 1;
    return fclose(f) == 0 && ok;
}

static const int32_t PROMPT[5] = {1, 9, 17, 33, 40};

static bool have_gpu(void) { return kiln_cuda_device_count() > 0; }

/* eval (logits) and eval_argmax of PROMPT on a session of m, with check_finite as given; the two statuses and the
 * messages, and the positions after each. */
typedef struct {
    kiln_status s_logits, s_argmax;
    char msg_logits[512], msg_argmax[512];
    int64_t pos_logits, pos_argmax;
} run_out;

static bool run_prompt(const char *path, int n_gpu_layers, bool check_finite, run_out *r) {
    memset(r, 0, sizeof *r);
    kiln_model *m = NULL;
    kiln_session *a = NULL, *b = NULL;
    float logits[V];
    kiln_session_params sp = {.n_ctx = 32, .n_batch = 8, .n_threads = 1, .n_gpu_layers = n_gpu_layers, .check_finite = check_finite};
    bool ok = kiln_model_load(path, &m) == KILN_OK && kiln_session_new(m, &sp, &a) == KILN_OK && kiln_session_new(m, &sp, &b) == KILN_OK;
    if (ok) {
        r->s_logits = kiln_session_eval(a, PROMPT, 5, logits, NULL);
        snprintf(r->msg_logits, sizeof r->msg_logits, "%s", kiln_last_error());
        int32_t next = -1;
        r->s_argmax = kiln_session_eval_argmax(b, PROMPT, 5, &next);
        snprintf(r->msg_argmax, sizeof r->msg_argmax, "%s", kiln_last_error());
        r->pos_logits = kiln_session_pos(a), r->pos_argmax = kiln_session_pos(b);
    }
    kiln_session_free(a);
    kiln_session_free(b);
    kiln_model_free(m);
    return ok;
}

/* Layer 1's attention norm scaled by 3e38 makes its normalized rows infinite, and every logit NaN: both calls fail
 * naming position 4, the last of the prompt, and the session does not move. */
static void check_nan_layer(int ngl) {
    char path[128];
    snprintf(path, sizeof path, "%s/nan_layer.gguf", tmp_dir);
    CHECK(make_model(path, "blk.1.attn_norm.weight", 0, 32, 3e38f), "%s", kiln_last_error());
    run_out r;
    CHECK(run_prompt(path, ngl, false, &r), "%s", kiln_last_error());
    CHECK(r.s_logits == KILN_ERR_RANGE, "eval: %s", kiln_status_name(r.s_logits));
    CHECK(strstr(r.msg_logits, "position 4 are not finite") && strstr(r.msg_logits, "KILN_CHECK_FINITE=1"), "%s", r.msg_logits);
    CHECK(r.s_argmax == KILN_ERR_RANGE, "eval_argmax: %s", kiln_status_name(r.s_argmax));
    CHECK(strstr(r.msg_argmax, "position 4 are not finite"), "%s", r.msg_argmax);
    CHECK(r.pos_logits == 0 && r.pos_argmax == 0, "positions %lld %lld", (long long)r.pos_logits, (long long)r.pos_argmax);
    /* check_finite names the layer */
    CHECK(run_prompt(path, ngl, true, &r), "%s", kiln_last_error());
    CHECK(r.s_logits == KILN_ERR_RANGE && strstr(r.msg_logits, "layer 1's output at positions 0..4 is not finite"), "%s", r.msg_logits);
    CHECK(r.s_argmax == KILN_ERR_RANGE && strstr(r.msg_argmax, "layer 1's output"), "%s", r.msg_argmax);
}
static void test_nan_layer_cpu(void) { check_nan_layer(0); }
static void test_nan_layer_gpu(void) {
    if (!have_gpu()) SKIP("no CUDA device");
    check_nan_layer(99);
}

/* One overflowing row of the head (token 7's, every weight 3e38): a single logit is infinite, which an argmax
 * could take as its answer. Both calls must still fail; the host check names the token, check_finite the logits. */
static void check_nan_logit(int ngl) {
    char path[128];
    snprintf(path, sizeof path, "%s/nan_logit.gguf", tmp_dir);
    CHECK(make_model(path, "output.weight", 7 * 32, 32, 3e38f), "%s", kiln_last_error());
    run_out r;
    CHECK(run_prompt(path, ngl, false, &r), "%s", kiln_last_error());
    CHECK(r.s_logits == KILN_ERR_RANGE && strstr(r.msg_logits, "position 4 are not finite (token 7's is "), "%s", r.msg_logits);
    CHECK(r.s_argmax == KILN_ERR_RANGE && strstr(r.msg_argmax, "position 4 are not finite"), "%s", r.msg_argmax);
    CHECK(run_prompt(path, ngl, true, &r), "%s", kiln_last_error());
    CHECK(r.s_argmax == KILN_ERR_RANGE && strstr(r.msg_argmax, "the logits (the output norm and head) at positions 0..4"), "%s",
          r.msg_argmax);
}
static void test_nan_logit_cpu(void) { check_nan_logit(0); }
static void test_nan_logit_gpu(void) {
    if (!have_gpu()) SKIP("no CUDA device");
    check_nan_logit(99);
}

/* An infinity in the embedding row of token 17 (the prompt's third token) is refused at load, naming the tensor;
 * KILN_CHECK_FINITE=1 without the parameter turns the per-stage check on, here naming layer 0 (its attention norm
 * scaled by 3e38). */
static void check_env_and_load(int ngl) {
    char path[128];
    snprintf(path, sizeof path, "%s/inf_embd.gguf", tmp_dir);
    CHECK(make_model(path, "token_embd.weight", 17 * 32 + 3, 1, INFINITY), "%s", kiln_last_error());
    kiln_model *m = NULL;
    CHECK(kiln_model_load(path, &m) != KILN_OK && strstr(kiln_last_error(), "token_embd.weight") &&
              strstr(kiln_last_error(), "is inf"), "%s", kiln_last_error());
    kiln_model_free(m);
    snprintf(path, sizeof path, "%s/huge_layer0.gguf", tmp_dir);
    CHECK(make_model(path, "blk.0.attn_norm.weight", 0, 32, 3e38f), "%s", kiln_last_error());
    setenv("KILN_CHECK_FINITE", "1", 1);
    run_out r;
    bool ok = run_prompt(path, ngl, false, &r);
    unsetenv("KILN_CHECK_FINITE");
    CHECK(ok, "%s", kiln_last_error());
    CHECK(r.s_logits == KILN_ERR_RANGE && strstr(r.msg_logits, "layer 0's output at positions 0..4 is not finite"), "%s",
          r.msg_logits);
    CHECK(run_prompt(path, ngl, false, &r), "%s", kiln_last_error());
    CHECK(r.s_logits == KILN_ERR_RANGE && strstr(r.msg_logits, "position 4 are not finite"), "%s", r.msg_logits);
}
static void test_env_and_load_cpu(void) { check_env_and_load(0); }
static void test_env_and_load_gpu(void) {
    if (!have_gpu()) SKIP("no CUDA device");
    check_env_and_load(99);
}

/* A clean model passes every check, and the checks change no logit (token by token too: the recorded GPU step). */
static void check_clean(int ngl) {
    char path[128];
    snprintf(path, sizeof path, "%s/clean.gguf", tmp_dir);
    CHECK(make_model(path, NULL, 0, 0, 0), "%s", kiln_last_error());
    kiln_model *m = NULL;
    kiln_session *a = NULL, *b = NULL;
    float la[V], lb[V];
    bool same = true;
    kiln_status s = kiln_model_load(path, &m);
    kiln_session_params sp = {.n_ctx = 32, .n_batch = 8, .n_threads = 1, .n_gpu_layers = ngl};
    if (!s) s = kiln_session_new(m, &sp, &a);
    sp.check_finite = true;
    if (!s) s = kiln_session_new(m, &sp, &b);
    if (!s) s = kiln_session_eval(a, PROMPT, 5, la, NULL);
    if (!s) s = kiln_session_eval(b, PROMPT, 5, lb, NULL);
    same = !s && memcmp(la, lb, sizeof la) == 0;
    for (int i = 0; i < 4 && !s && same; i++) {
        int32_t na = -1, nb = -2;
        if (!s) s = kiln_session_eval_argmax(a, &PROMPT[i], 1, &na);
        if (!s) s = kiln_session_eval_argmax(b, &PROMPT[i], 1, &nb);
        same = na == nb;
    }
    kiln_session_free(a);
    kiln_session_free(b);
    kiln_model_free(m);
    CHECK(s == KILN_OK, "%s", kiln_last_error());
    CHECK(same, "check_finite changed the result");
}
static void test_clean_cpu(void) { check_clean(0); }
static void test_clean_gpu(void) {
    if (!have_gpu()) SKIP("no CUDA device");
    check_clean(99);
}

/* keep(6) after 10 tokens, then tokens 6..9 again with others in their place: the logits equal a fresh session's
 * run of the new sequence, the history is the new sequence, and 14 tokens were evaluated in all. */
static void check_keep(int ngl) {
    char path[128];
    snprintf(path, sizeof path, "%s/clean.gguf", tmp_dir);
    CHECK(make_model(path, NULL, 0, 0, 0), "%s", kiln_last_error());
    static const int32_t first[10] = {1, 5, 9, 13, 17, 21, 25, 29, 33, 37}, second[10] = {1, 5, 9, 13, 17, 21, 2, 4, 6, 8};
    kiln_model *m = NULL;
    kiln_session *a = NULL, *b = NULL;
    float la[V], lb[V];
    kiln_session_params sp = {.n_ctx = 32, .n_batch = 4, .n_threads = 1, .n_gpu_layers = ngl};
    kiln_status s = kiln_model_load(path, &m);
    if (!s) s = kiln_session_new(m, &sp, &a);
    if (!s) s = kiln_session_new(m, &sp, &b);
    int64_t kept_past = -1, kept = -1, pos = -1, n_eval = -1;
    bool hist = false;
    if (!s) s = kiln_session_eval(a, first, 10, NULL, NULL);
    if (!s) {
        kept_past = kiln_session_keep(a, 12); /* past the position: keeps all 10 */
        kept = kiln_session_keep(a, 6);
        s = kiln_session_eval(a, second + 6, 4, la, NULL);
        pos = kiln_session_pos(a), n_eval = kiln_session_n_evaluated(a);
        hist = !s && memcmp(kiln_session_tokens(a), second, sizeof second) == 0;
    }
    if (!s) s = kiln_session_eval(b, second, 10, lb, NULL);
    float diff = 0;
    for (int i = 0; !s && i < V; i++) diff = fmaxf(diff, fabsf(la[i] - lb[i]));
    kiln_session_free(a);
    kiln_session_free(b);
    kiln_model_free(m);
    CHECK(s == KILN_OK, "%s", kiln_last_error());
    CHECK(kept_past == 10 && kept == 6 && pos == 10, "kept %lld then %lld, position %lld", (long long)kept_past, (long long)kept,
          (long long)pos);
    CHECK(hist, "the history is not the second sequence");
    CHECK(n_eval == 14, "%lld tokens evaluated, expected 10 + 4", (long long)n_eval);
    /* the same positions through other chunks: the CPU's chunked prefill agrees to float rounding (test_generate) */
    CHECK(diff < 1e-4f, "logits differ by %g from a fresh session's", (double)diff);
}
static void test_keep_cpu(void) { check_keep(0); }
static void test_keep_gpu(void) {
    if (!have_gpu()) SKIP("no CUDA device");
    check_keep(99);
}

/* top_p 0 keeps the most likely token (llama.cpp keeps at least one), whatever the coin; top_p 1 samples the others
 * too; outside [0, 1] is refused. */
static void test_top_p_zero(void) {
    float base[8] = {0.1f, 0.3f, 0.2f, 0.5f, 0.45f, 0.0f, -0.2f, 0.4f}; /* token 3 is the most likely, by a little */
    kiln_sampler_params p = {.temp = 1, .top_k = 0, .top_p = 0, .min_p = 0, .repeat_penalty = 1, .repeat_last_n = 0, .seed = 7};
    kiln_sampler *s = NULL;
    CHECK(kiln_sampler_new(&p, 8, &s) == KILN_OK, "%s", kiln_last_error());
    int other = 0;
    for (int i = 0; i < 200; i++) {
        float l[8];
        memcpy(l, base, sizeof l);
        other += kiln_sampler_sample(s, l, NULL, 0) != 3;
    }
    kiln_sampler_free(s);
    CHECK(other == 0, "top_p 0 picked another token than the top one %d times in 200", other);
    p.top_p = 1;
    CHECK(kiln_sampler_new(&p, 8, &s) == KILN_OK, "%s", kiln_last_error());
    for (int i = 0; i < 200; i++) {
        float l[8];
        memcpy(l, base, sizeof l);
        other += kiln_sampler_sample(s, l, NULL, 0) != 3;
    }
    kiln_sampler_free(s);
    CHECK(other > 50, "top_p 1 picked the top token %d times in 200", 200 - other);
    p.top_p = -0.1f;
    CHECK(kiln_sampler_new(&p, 8, &s) == KILN_ERR_INVALID && strstr(kiln_last_error(), "top_p -0.1"), "%s", kiln_last_error());
    p.top_p = 1.5f;
    CHECK(kiln_sampler_new(&p, 8, &s) == KILN_ERR_INVALID);
}

int main(void) {
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/kiln_test_runtime_XXXXXX");
    if (!mkdtemp(tmp_dir)) {
        perror("mkdtemp");
        return 1;
    }
    RUN(test_nan_layer_cpu);
    RUN(test_nan_layer_gpu);
    RUN(test_nan_logit_cpu);
    RUN(test_nan_logit_gpu);
    RUN(test_env_and_load_cpu);
    RUN(test_env_and_load_gpu);
    RUN(test_clean_cpu);
    RUN(test_clean_gpu);
    RUN(test_keep_cpu);
    RUN(test_keep_gpu);
    RUN(test_top_p_zero);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp_dir);
    TEST_EXIT();
}
