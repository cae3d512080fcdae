/* test_cuda_train.c: the GPU trainer (src/cuda/trainer.cu) against the CPU trainer (src/train/llama_train.c), the
 * oracle, on a small llama (C 128, L 2, NH 4, NKV 2, F 256, V 500; B 2, T 40; label smoothing 0.1, z-loss 1e-4,
 * two ignored targets; untied and tied), weights at 2x the init scale (attention scores of std ~0.8: far from
 * uniform, yet not saturated).
 *   - one step: the loss, and every parameter tensor's gradient by relative L2 error (untied; tied with z-loss 1e-2,
 *     large enough that a wrong z-loss term fails; two accumulated micro-batches, so every gradient write must add);
 *   - ten AdamW steps (clipping active), fp32 and 8-bit moments: the per-step losses and gradient norms;
 *   - the classifier's multi-chunk path (B 2 x T 2100 = 4200 rows > the 4096-row chunk): loss and head gradients.
 * The CPU runs in mixed precision (bf16 weights, fp32 activations), the GPU in llm.c's (bf16 weights and matmul
 * inputs, fp32 residual stream; its embedding reads the fp32 master weights where the CPU reads the mirror), so
 * the two differ by bf16 roundings of activations, ~2^-9 relative each, compounded over the layers. The scale of
 * that noise is measured, not guessed: the same step on the CPU in fp32 against the CPU in mixed precision (one
 * set of bf16 roundings, the weights') differs by 0.4% to 1.2% per tensor at this scale (printed as "noise").
 * The GPU adds the activations' roundings, so 2 to 4 times that is expected; bounds: loss 3e-3 relative,
 * gradients 5e-2 relative L2 per tensor, step losses 2e-2, gradient norms 5e-2. A wrong term (a missing
 * accumulation, a transposed weight, a wrong RoPE position) gives O(1) errors. At 4x the init scale the softmax
 * saturates and even fp32 against mixed CPU differs by 12%: no bound separates bugs from noise there.
 *   - the options: deterministic twice, with activation recomputation, and with every matmul on one stream (the
 *     weight gradients' own stream off) give the same bits; the fast mode (dq by atomics) stays within 1e-5 of them.
 *   - the weight gradients' stream over three classifier chunks: the one-stream bits when its matmuls are chosen for
 *     the whole GPU, within 1e-5 of them (and the same bits twice) when for half the SMs, the default.
 *   - the weight check before the update: an update that would overflow a weight is skipped and changes nothing;
 *     a resume with NaN moments is refused.
 * The checkpoint round trip (a resumed GPU run equals an uninterrupted one, bit for bit) is test_train.c's.
 * Compiled with KILN_CUDA only; skips without a GPU. */
#include "test.h"
#include "cuda/cuda.h"
#include "train/llama_train.h"
#include "train/optim.h"
#include "train/trainer.h"
#include "pool.h"

#include <unistd.h>

#ifdef KILN_CUDA

#define B_ 2
#define T_ 40

static double rel_l2(const float *a, const float *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d, den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* heads: 4 (head size 32: the CUDA-core attention) or 2 (head size 64: the tensor-core one, wgmma on Hopper) query
 * heads, with half as many KV heads */
static kiln_llama_train *make_model_heads(bool tied, float z_loss, bool mixed, int64_t n_ctx, int64_t heads) {
    kiln_llama_config c = {.n_vocab = 500, .n_embd = 128, .n_layer = 2, .n_head = heads, .n_head_kv = heads / 2, .n_ff = 256,
                           .n_ctx_train = n_ctx, .rope_base = 10000.0f, .rms_eps = 1e-5f, .tied = tied};
    kiln_llama_train *m = NULL;
    if (kiln_llama_train_new(&c, mixed, &m) != KILN_OK) return NULL;
    kiln_llama_train_init_random(m, 11);
    for (int64_t i = 0; i < m->n_params; i++) m->params[i] *= 2;
    if (mixed) kiln_llama_train_refresh_mirror(m);
    m->label_smoothing = 0.1f, m->z_loss = z_loss;
    return m;
}
static kiln_llama_train *make_model(bool tied, float z_loss, bool mixed, int64_t n_ctx) {
    return make_model_heads(tied, z_loss, mixed, n_ctx, 4);
}

static void batch(int32_t *in, int32_t *tg, int64_t N, int64_t V, unsigned long long *rng) {
    for (int64_t i = 0; i < N; i++) in[i] = (int32_t)(test_rng_next(rng) % (unsigned long long)V);
    for (int64_t i = 0; i < N; i++) tg[i] = (int32_t)(test_rng_next(rng) % (unsigned long long)V);
    tg[3] = tg[N - 1] = -1;
}

/* One micro-batch, or two accumulated (the second step adds to the first's gradients on all sides: every
 * gradient write of the backward must add, not overwrite), of B sequences of T. The same steps on an fp32 CPU
 * model measure the noise that bf16 weights alone cause; the three worst tensors are printed with it. */
static void one_step_heads(bool tied, float z_loss, int micro, int64_t B, int64_t T, int64_t heads) {
    const int64_t N = B * T;
    kiln_llama_train *m = make_model_heads(tied, z_loss, true, T, heads), *m32 = make_model_heads(tied, z_loss, false, T, heads);
    CHECK(m && m32, "%s", kiln_last_error());
    kiln_pool *pool = NULL;
    CHECK(kiln_pool_create(2, &pool) == KILN_OK);
    CHECK(kiln_llama_train_reserve(m, B, T, 2) == KILN_OK, "%s", kiln_last_error());
    CHECK(kiln_llama_train_reserve(m32, B, T, 2) == KILN_OK, "%s", kiln_last_error());
    kiln_cuda_trainer *g = NULL;
    kiln_status st = kiln_cuda_trainer_new(m, B, T, 0, NULL, &g);
    CHECK(st == KILN_OK, "gpu trainer: %s", kiln_last_error());
    int32_t *in = malloc((size_t)N * sizeof *in), *tg = malloc((size_t)N * sizeof *tg);
    float *gg = malloc((size_t)m->n_params * sizeof *gg);
    CHECK(in && tg && gg);
    unsigned long long rng = 5;
    int64_t k_cpu = 0, k_gpu = 0;
    double l_cpu = 0, l_gpu = 0;
    memset(m->grads, 0, (size_t)m->n_params * sizeof(float));
    memset(m32->grads, 0, (size_t)m->n_params * sizeof(float));
    const float scale = 1.0f / (float)(micro * (N - 2));
    for (int u = 0; u < micro; u++) {
        batch(in, tg, N, m->cfg.n_vocab, &rng);
        int64_t kc, kg;
        double lg;
        l_cpu += kiln_llama_train_step(m, &kiln_cpu_ops, pool, in, tg, scale, &kc);
        kiln_llama_train_step(m32, &kiln_cpu_ops, pool, in, tg, scale, &kc);
        CHECK(kiln_cuda_trainer_step(g, in, tg, scale, &lg, &kg) == KILN_OK, "%s", kiln_last_error());
        l_gpu += lg, k_cpu += kc, k_gpu += kg;
    }
    CHECK(k_cpu == k_gpu, "counted %lld vs %lld", (long long)k_cpu, (long long)k_gpu);
    const double le = fabs(l_gpu - l_cpu) / fabs(l_cpu);
    CHECK(kiln_cuda_trainer_download(g, NULL, gg) == KILN_OK, "%s", kiln_last_error());
    int worst[3] = {-1, -1, -1};
    double err[64], noise[64];
    CHECK(m->n_tensors <= 64);
    for (int i = 0; i < m->n_tensors; i++) {
        const kiln_train_tensor *t = &m->tensors[i];
        err[i] = rel_l2(gg + t->offset, m->grads + t->offset, t->n);
        noise[i] = rel_l2(m32->grads + t->offset, m->grads + t->offset, t->n);
        if (isnan(err[i])) err[i] = INFINITY;
        for (int j = 0, c = i; j < 3; j++)
            if (worst[j] < 0 || err[c] > err[worst[j]]) {
                int tmp = worst[j];
                worst[j] = c, c = tmp;
                if (c < 0) break;
            }
    }
    printf("# %s, head size %lld, z-loss %g, %d micro-batch(es) of %lldx%lld: loss %.6f (cpu %.6f, rel %.2e); worst gradients rel-L2:", tied ? "tied" : "untied",
           (long long)(m->cfg.n_embd / heads), z_loss, micro, (long long)B, (long long)T, l_gpu / (double)k_gpu, l_cpu / (double)k_cpu, le);
    for (int j = 0; j < 3 && worst[j] >= 0; j++) printf(" %s %.2e (noise %.2e)", m->tensors[worst[j]].name, err[worst[j]], noise[worst[j]]);
    printf("\n");
    CHECK(le < 3e-3, "loss %.6f vs cpu %.6f", l_gpu, l_cpu);
    CHECK(err[worst[0]] < 5e-2, "gradient of %s: rel-L2 %.3e", m->tensors[worst[0]].name, err[worst[0]]);
    free(gg), free(in), free(tg);
    kiln_cuda_trainer_free(g);
    kiln_llama_train_free(m);
    kiln_llama_train_free(m32);
    kiln_pool_free(pool);
}

static void one_step(bool tied, float z_loss, int micro, int64_t B, int64_t T) { one_step_heads(tied, z_loss, micro, B, T, 4); }

static void test_step_untied(void) {
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    one_step(false, 1e-4f, 1, B_, T_);
}

/* z-loss 1e-2 here: with z ~ 12 it is ~10% of the loss, so a wrong z-loss term cannot hide under the bounds */
static void test_step_tied(void) {
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    one_step(true, 1e-2f, 1, B_, T_);
}

static void test_grad_accumulation(void) {
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    one_step(false, 1e-4f, 2, B_, T_);
}

/* 4200 rows: the classifier's second chunk (rows 4096 ..) must see the right lnf rows and targets */
static void test_head_chunks(void) {
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    one_step(true, 1e-4f, 1, 2, 2100);
}

/* An environment variable set (value) or unset (NULL) for a while: env_set returns what to give env_back after. */
static char *env_set(const char *name, const char *value) {
    const char *saved = getenv(name);
    char *keep = saved ? strdup(saved) : NULL;
    if (value) setenv(name, value, 1);
    else unsetenv(name);
    return keep;
}
static void env_back(const char *name, char *keep) {
    if (keep) setenv(name, keep, 1), free(keep);
    else unsetenv(name);
}

/* The weight gradients' stream over the classifier's chunks: 8400 rows are three chunks, so the logits buffers
 * alternate (the third chunk reuses the first's buffer after its dW), and the tied output's gradient is the
 * embedding's, which the embedding backward adds to on the compute stream; two accumulated micro-batches.
 *   0  the stream on, its matmuls chosen for the whole GPU (KILN_TRAIN_DW_SMS=0)
 *   1  one stream: the same loss and gradient bits as 0
 *   2  the default (the side's matmuls chosen for half the SMs, which may be other kernels, so other summation
 *      orders): within 1e-5 relative L2 of 1, as the fast mode is
 *   3  the default again: the same bits as 2 (a resumed run repeats an uninterrupted one) */
static void test_dw_stream(void) {
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    const int64_t B = 4, T = 2100, N = B * T;
    kiln_llama_train *m = make_model_heads(true, 1e-4f, true, T, 4);
    CHECK(m, "%s", kiln_last_error());
    int32_t *in = malloc((size_t)N * sizeof *in), *tg = malloc((size_t)N * sizeof *tg);
    float *g[4];
    for (int k = 0; k < 4; k++) g[k] = malloc((size_t)m->n_params * sizeof(float));
    CHECK(in && tg && g[0] && g[1] && g[2] && g[3]);
    static const char *stream[4] = {"1", "0", NULL, NULL}, *sms[4] = {"0", NULL, NULL, NULL};
    double loss[4] = {0, 0, 0, 0};
    for (int k = 0; k < 4; k++) {
        char *keep = env_set("KILN_TRAIN_DW_STREAM", stream[k]), *keep_sms = env_set("KILN_TRAIN_DW_SMS", sms[k]);
        kiln_cuda_trainer *t = NULL;
        const kiln_status st = kiln_cuda_trainer_new(m, B, T, KILN_CUDA_TRAIN_DETERMINISTIC, NULL, &t);
        env_back("KILN_TRAIN_DW_STREAM", keep), env_back("KILN_TRAIN_DW_SMS", keep_sms);
        CHECK(st == KILN_OK, "%s", kiln_last_error());
        unsigned long long rng = 31;
        for (int u = 0; u < 2; u++) {
            batch(in, tg, N, m->cfg.n_vocab, &rng);
            double l;
            int64_t cnt;
            CHECK(kiln_cuda_trainer_step(t, in, tg, 1.0f / (float)(2 * (N - 2)), &l, &cnt) == KILN_OK, "%s", kiln_last_error());
            loss[k] += l;
        }
        CHECK(kiln_cuda_trainer_download(t, NULL, g[k]) == KILN_OK, "%s", kiln_last_error());
        kiln_cuda_trainer_free(t);
    }
    int64_t diff = 0;
    for (int64_t i = 0; i < m->n_params; i++) diff += memcmp(&g[0][i], &g[1][i], sizeof(float)) != 0;
    CHECK(loss[0] == loss[1] && diff == 0, "the stream on the whole GPU: loss %.9g vs %.9g, %lld of %lld gradients differ", loss[0],
          loss[1], (long long)diff, (long long)m->n_params);
    const double e = rel_l2(g[2], g[1], m->n_params);
    CHECK(fabs(loss[2] - loss[1]) <= 1e-6 * fabs(loss[1]) && e <= 1e-5, "the default stream: loss %.9g vs %.9g, gradients rel-L2 %.3g",
          loss[2], loss[1], e);
    CHECK(loss[3] == loss[2] && memcmp(g[3], g[2], (size_t)m->n_params * sizeof(float)) == 0, "the default stream twice differs");
    printf("# weight gradients' stream, 3 classifier chunks: the one-stream bits on the whole GPU; on half the SMs within %.2e, "
           "the same bits twice\n", e);
    for (int k = 0; k < 4; k++) free(g[k]);
    free(in), free(tg);
    kiln_llama_train_free(m);
}

/* Head size 64, 3 tiles of 64 rows and a partial one: the tensor-core attention (wgmma on a Hopper device, by
 * default) in a whole step, against the CPU trainer. */
static void test_step_hs64(void) {
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    one_step_heads(false, 1e-4f, 1, 2, 200, 2);
}

/* The options change no value: deterministic (dq in a fixed order) twice gives the same bits, and with activation
 * recomputation (the norms' and SwiGLU's outputs recomputed in the backward by the same kernels) the same bits
 * again, for the loss and every gradient; the fast mode (dq by atomics; on wgmma at head size 64 the deterministic
 * backward, the faster there) stays within 1e-5 relative L2 of them. The weight gradients' own stream
 * (KILN_TRAIN_DW_STREAM, on in the first five, its matmuls chosen for the whole GPU) changes no bit either: the
 * sixth runs everything on one stream. (Chosen for fewer SMs, its matmuls may be other kernels: test_dw_stream.) */
static void options_same_bits(int64_t heads, int64_t T) {
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    kiln_llama_train *m = make_model_heads(false, 1e-4f, true, T, heads);
    CHECK(m, "%s", kiln_last_error());
    int32_t in[B_ * 200], tg[B_ * 200];
    CHECK(T <= 200);
    unsigned long long rng = 23;
    batch(in, tg, B_ * T, m->cfg.n_vocab, &rng);
    static const unsigned flags[] = {KILN_CUDA_TRAIN_DETERMINISTIC, KILN_CUDA_TRAIN_DETERMINISTIC,
                                     KILN_CUDA_TRAIN_DETERMINISTIC | KILN_CUDA_TRAIN_RECOMPUTE, 0, KILN_CUDA_TRAIN_RECOMPUTE,
                                     KILN_CUDA_TRAIN_DETERMINISTIC};
    float *g[6];
    double loss[6];
    size_t bytes[6];
    char *keep = env_set("KILN_TRAIN_DW_STREAM", NULL), *keep_sms = env_set("KILN_TRAIN_DW_SMS", "0");
    for (int k = 0; k < 6; k++) {
        kiln_cuda_trainer *t = NULL;
        setenv("KILN_TRAIN_DW_STREAM", k < 5 ? "1" : "0", 1); /* read when the trainer is made */
        CHECK(kiln_cuda_trainer_new(m, B_, T, flags[k], NULL, &t) == KILN_OK, "%s", kiln_last_error());
        bytes[k] = kiln_cuda_trainer_bytes(t);
        g[k] = malloc((size_t)m->n_params * sizeof(float));
        int64_t cnt;
        CHECK(g[k] && kiln_cuda_trainer_step(t, in, tg, 1.0f / (float)(B_ * T - 2), &loss[k], &cnt) == KILN_OK &&
                  kiln_cuda_trainer_download(t, NULL, g[k]) == KILN_OK,
              "%s", kiln_last_error());
        kiln_cuda_trainer_free(t);
    }
    env_back("KILN_TRAIN_DW_STREAM", keep), env_back("KILN_TRAIN_DW_SMS", keep_sms);
    CHECK(loss[1] == loss[0] && memcmp(g[1], g[0], (size_t)m->n_params * sizeof(float)) == 0, "deterministic twice differs");
    CHECK(loss[5] == loss[0] && memcmp(g[5], g[0], (size_t)m->n_params * sizeof(float)) == 0,
          "the weight gradients' stream changes the bits");
    CHECK(bytes[5] < bytes[0], "one stream takes %zu bytes, not fewer than %zu", bytes[5], bytes[0]);
    CHECK(loss[2] == loss[0] && memcmp(g[2], g[0], (size_t)m->n_params * sizeof(float)) == 0, "recompute changes the bits");
    CHECK(bytes[2] < bytes[0], "recompute takes %zu bytes, not fewer than %zu", bytes[2], bytes[0]);
    for (int k = 3; k < 5; k++) {
        const double e = rel_l2(g[k], g[0], m->n_params);
        CHECK(fabs(loss[k] - loss[0]) <= 1e-6 * fabs(loss[0]) && e <= 1e-5, "fast mode %u: loss %.9g vs %.9g, gradients rel-L2 %.3g",
              flags[k], loss[k], loss[0], e);
    }
    printf("# options, head size %lld: deterministic, recompute and one stream bit-identical; fast mode gradients within %.2e; recompute %.1f%% "
           "of the bytes\n", (long long)(m->cfg.n_embd / heads), rel_l2(g[3], g[0], m->n_params), 100.0 * (double)bytes[2] / (double)bytes[0]);
    for (int k = 0; k < 6; k++) free(g[k]);
    kiln_llama_train_free(m);
}
static void test_options_same_bits(void) { options_same_bits(4, T_); }
/* The same on the tensor-core attention (head size 64, T 200: the deterministic dq kernel after the dk/dv one) */
static void test_options_same_bits_hs64(void) { options_same_bits(2, 200); }

static void check_ten_adamw_steps(bool eight) {
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    kiln_llama_train *m = make_model(false, 1e-4f, true, T_);
    CHECK(m, "%s", kiln_last_error());
    kiln_pool *pool = NULL;
    CHECK(kiln_pool_create(2, &pool) == KILN_OK);
    CHECK(kiln_llama_train_reserve(m, B_, T_, 2) == KILN_OK, "%s", kiln_last_error());
    kiln_cuda_trainer *g = NULL;
    CHECK(kiln_cuda_trainer_new(m, B_, T_, eight ? KILN_CUDA_TRAIN_ADAM8 : 0, NULL, &g) == KILN_OK, "%s", kiln_last_error());
    kiln_adamw_cfg cfg = kiln_adamw_defaults();
    cfg.grad_clip = 0.5f; /* active: the 2x-scale model's gradient norm (~11) is above it */
    cfg.eight_bit = eight;
    kiln_param_segment *segs = malloc((size_t)m->n_tensors * sizeof *segs);
    kiln_train_segments(m, segs);
    kiln_adamw opt;
    CHECK(kiln_adamw_init(&opt, &cfg, m->n_params, segs, m->n_tensors) == KILN_OK, "%s", kiln_last_error());
    unsigned long long rng = 17;
    double worst = 0;
    for (int s = 0; s < 10; s++) {
        int32_t in[B_ * T_], tg[B_ * T_];
        batch(in, tg, B_ * T_, m->cfg.n_vocab, &rng);
        int64_t k;
        const float scale = 1.0f / (float)(B_ * T_ - 2);
        memset(m->grads, 0, (size_t)m->n_params * sizeof(float));
        double lc = kiln_llama_train_step(m, &kiln_cpu_ops, pool, in, tg, scale, &k) / (double)k, lg = 0;
        kiln_adamw_result r = kiln_adamw_step(&opt, pool, m->params, m->grads, m->mirror, 1e-3f);
        CHECK(kiln_cuda_trainer_zero_grads(g) == KILN_OK, "%s", kiln_last_error());
        CHECK(kiln_cuda_trainer_step(g, in, tg, scale, &lg, &k) == KILN_OK, "%s", kiln_last_error());
        lg /= (double)k;
        double norm;
        bool skipped;
        CHECK(kiln_cuda_trainer_adamw(g, &cfg, 1e-3f, &norm, &skipped) == KILN_OK, "%s", kiln_last_error());
        CHECK(!skipped && !r.skipped, "step %d skipped (gpu %d, cpu %d)", s, skipped, r.skipped);
        const double e = fabs(lg - lc) / lc, ne = fabs(norm - r.grad_norm) / r.grad_norm;
        if (e > worst) worst = e;
        CHECK(e < 2e-2, "step %d: loss %.6f, cpu %.6f", s, lg, lc);
        CHECK(ne < 5e-2, "step %d: gradient norm %.6f, cpu %.6f", s, norm, r.grad_norm);
    }
    printf("# ten AdamW steps (%s moments): worst step-loss relative error %.2e\n", eight ? "8-bit" : "fp32", worst);
    if (eight) { /* the other kind of step is refused, and the fp32 parts are not this trainer's */
        cfg.eight_bit = false;
        double norm;
        bool skipped;
        float x = 0;
        CHECK(kiln_cuda_trainer_adamw(g, &cfg, 1e-3f, &norm, &skipped) == KILN_ERR_INVALID, "an fp32 step on 8-bit moments");
        CHECK(kiln_cuda_trainer_read(g, KILN_CUDA_TRAIN_M, 0, 1, &x) == KILN_ERR_INVALID, "fp32 moments read from an 8-bit trainer");
    }
    kiln_adamw_free(&opt);
    free(segs);
    kiln_cuda_trainer_free(g);
    kiln_llama_train_free(m);
    kiln_pool_free(pool);
}

static void test_ten_adamw_steps(void) { check_ten_adamw_steps(false); }
static void test_ten_adamw8_steps(void) { check_ten_adamw_steps(true); }

/* The weight check before the update: a first moment of 3e38 where v is 0 makes m / (sqrt(v) + eps) overflow, so
 * the update would write -inf into a weight though the gradient is finite. The step is skipped and changes nothing
 * (weights, moments, the update count); with the moment back to 0 the next step applies. With 8-bit moments the
 * moment is code 127 (1.875) of its block's scale 3e38 / 1.875, and the scale goes back to 0. */
static void check_weight_check_skips(bool eight) {
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    kiln_llama_train *m = make_model(false, 0.0f, true, T_);
    CHECK(m, "%s", kiln_last_error());
    kiln_cuda_trainer *g = NULL;
    CHECK(kiln_cuda_trainer_new(m, B_, T_, eight ? KILN_CUDA_TRAIN_ADAM8 : 0, NULL, &g) == KILN_OK, "%s", kiln_last_error());
    const int64_t n = m->n_params;
    float *p0 = malloc((size_t)n * sizeof *p0), *p1 = malloc((size_t)n * sizeof *p1), *m1 = malloc((size_t)n * sizeof *m1);
    CHECK(p0 && p1 && m1);
    const float huge = eight ? 3e38f / 1.875f : 3e38f, zero = 0.0f;
    const int8_t top = 127;
    const int64_t at = m->tensors[m->layers[1].wq].offset + 7; /* inside a matrix that decays and has a gradient */
    const kiln_cuda_train_part mpart = eight ? KILN_CUDA_TRAIN_M_SCALE : KILN_CUDA_TRAIN_M;
    const int64_t mat = eight ? at / KILN_ADAMW8_BLOCK : at;
    if (eight) CHECK(kiln_cuda_trainer_write(g, KILN_CUDA_TRAIN_M8, at, 1, &top) == KILN_OK, "%s", kiln_last_error());
    CHECK(kiln_cuda_trainer_write(g, mpart, mat, 1, &huge) == KILN_OK, "%s", kiln_last_error());
    CHECK(kiln_cuda_trainer_download(g, p0, NULL) == KILN_OK, "%s", kiln_last_error());
    kiln_adamw_cfg cfg = kiln_adamw_defaults();
    cfg.eight_bit = eight;
    unsigned long long rng = 3;
    int32_t in[B_ * T_], tg[B_ * T_];
    batch(in, tg, B_ * T_, m->cfg.n_vocab, &rng);
    double l, norm;
    int64_t k, opt_step, emb;
    bool skipped;
    CHECK(kiln_cuda_trainer_zero_grads(g) == KILN_OK && kiln_cuda_trainer_step(g, in, tg, 1.0f / (B_ * T_ - 2), &l, &k) == KILN_OK);
    CHECK(kiln_cuda_trainer_adamw(g, &cfg, 1e-3f, &norm, &skipped) == KILN_OK, "%s", kiln_last_error());
    CHECK(skipped && isfinite(norm), "skipped %d, norm %g: the overflowing update was applied", skipped, norm);
    CHECK(kiln_cuda_trainer_download(g, p1, NULL) == KILN_OK && !memcmp(p0, p1, (size_t)n * sizeof *p0), "a skipped step changed weights");
    const int64_t mn = eight ? (n + KILN_ADAMW8_BLOCK - 1) / KILN_ADAMW8_BLOCK : n;
    CHECK(kiln_cuda_trainer_read(g, mpart, 0, mn, m1) == KILN_OK && m1[mat] == huge && m1[0] == 0.0f, "the moments changed");
    if (eight) {
        int8_t code = 0;
        CHECK(kiln_cuda_trainer_read(g, KILN_CUDA_TRAIN_M8, at, 1, &code) == KILN_OK && code == top, "m8 changed: %d", code);
        CHECK(kiln_cuda_trainer_read(g, KILN_CUDA_TRAIN_M_SCALE, mn, 1, m1) == KILN_ERR_RANGE, "a scale past the last block was read");
    }
    CHECK(kiln_cuda_trainer_get_counters(g, &opt_step, &emb) == KILN_OK && opt_step == 0, "opt_step %lld", (long long)opt_step);
    CHECK(kiln_cuda_trainer_write(g, mpart, mat, 1, &zero) == KILN_OK);
    CHECK(kiln_cuda_trainer_adamw(g, &cfg, 1e-3f, &norm, &skipped) == KILN_OK && !skipped, "the sane step was skipped");
    CHECK(kiln_cuda_trainer_download(g, p1, NULL) == KILN_OK && memcmp(p0, p1, (size_t)n * sizeof *p0) != 0);
    for (int64_t i = 0; i < n; i++) CHECK(isfinite(p1[i]), "weight %lld is %g", (long long)i, p1[i]);
    free(p0), free(p1), free(m1);
    kiln_cuda_trainer_free(g);
    kiln_llama_train_free(m);
}

static void test_weight_check_skips(void) { check_weight_check_skips(false); }
static void test_weight_check_skips_8bit(void) { check_weight_check_skips(true); }

/* A GPU resume validates the checkpoint as the CPU's does: NaN second moments are refused before any step. */
static void test_resume_refuses_bad_moments(void) {
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device");
    kiln_llama_train *m = make_model(false, 0.0f, false, T_);
    CHECK(m, "%s", kiln_last_error());
    kiln_param_segment *segs = malloc((size_t)m->n_tensors * sizeof *segs);
    kiln_train_segments(m, segs);
    kiln_adamw_cfg cfg = kiln_adamw_defaults();
    kiln_adamw opt;
    CHECK(kiln_adamw_init(&opt, &cfg, m->n_params, segs, m->n_tensors) == KILN_OK);
    char dir[] = "/tmp/kiln-cudackpt-XXXXXX", path[256];
    CHECK(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/ckpt.gguf", dir);
    kiln_train_state st = {.step = 1, .seed = 1, .B = B_, .T = T_, .world = 1};
    opt.step = 1;
    CHECK(kiln_train_save(m, NULL, "t", &opt, &st, path) == KILN_OK, "%s", kiln_last_error());
    /* damage the file's optim.v in place: its first element */
    kiln_model *src;
    CHECK(kiln_model_load(path, &src) == KILN_OK);
    const kiln_tensor_view *v = kiln_gguf_find_tensor(src->gguf, "optim.v");
    CHECK(v);
    const long off = (long)(kiln_gguf_data_offset(src->gguf) + v->offset);
    kiln_model_free(src);
    FILE *f = fopen(path, "r+b");
    const float nan_ = NAN;
    CHECK(f && fseek(f, off, SEEK_SET) == 0 && fwrite(&nan_, 4, 1, f) == 1);
    fclose(f);
    kiln_train_opts o = kiln_train_defaults();
    o.resume = path, o.B = B_, o.T = T_, o.steps = 4, o.device = (kiln_device){KILN_DEVICE_CUDA, 0};
    kiln_trainer *t = NULL;
    const kiln_status s = kiln_trainer_new(&o, &t);
    CHECK(s == KILN_ERR_FORMAT && strstr(kiln_last_error(), "optim.v"), "status %d: %s", (int)s, kiln_last_error());
    kiln_trainer_free(t);
    kiln_adamw_free(&opt);
    free(segs);
    kiln_llama_train_free(m);
    unlink(path);
    rmdir(dir);
}

int main(void) {
    RUN(test_step_untied);
    RUN(test_step_tied);
    RUN(test_grad_accumulation);
    RUN(test_head_chunks);
    RUN(test_dw_stream);
    RUN(test_step_hs64);
    RUN(test_options_same_bits);
    RUN(test_options_same_bits_hs64);
    RUN(test_ten_adamw_steps);
    RUN(test_ten_adamw8_steps);
    RUN(test_weight_check_skips);
    RUN(test_weight_check_skips_8bit);
    RUN(test_resume_refuses_bad_moments);
    TEST_EXIT();
}

#else

static void test_trainer(void) { SKIP("kiln built without CUDA (nvcc not on the PATH)"); }

int main(void) {
    RUN(test_trainer);
    TEST_EXIT();
}
#endif
