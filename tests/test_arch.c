/* test_arch.c: the architecture flags of the one forward (#6) against tests/ref/arch_ref.py's float64 numpy
 * reference. Each fixture (tests/ref/arch_*.gguf) is a tiny random F32 model whose file also holds the reference
 * token sequence (ref.tokens) and logits (ref.logits (T, V)); the reference rounds k and v to f16 as kiln's cache
 * does (that rounding alone moves gemma3's logits by 3.5e-3), so what is left is float32 arithmetic plus the odd k
 * or v that float32 rounds to the neighbouring f16: the bound is 2e-4 absolute on logits of magnitude up to ~4
 * (measured: qwen2 8e-7, gemma3 3e-6, muse 1e-5, qwen3 8e-7, mistral 7e-7, mistral3 8e-7, phi3 3.2e-5, gemma2 1.5e-6,
 * smollm3 6e-7, olmo2 1.1e-6; each feature below moves the reference's logits by 0.08 to 3.3 when turned off).
 *   qwen2:    q/k/v biases, NeoX RoPE, GQA.
 *   gemma3:   sqrt(C) embedding scale, HS from key_length (8, not C/NH = 12), per-head QK norm, sandwich norms,
 *             GeGLU, tied head, sliding window 4 on six of seven layers with the local RoPE base.
 *   muse:     NoPE layer, sigmoid output gate, post-norm epsilon, logit scale and softcap, window 5 every other layer
 *             with a local RoPE base, attention scale 0.25.
 *   qwen3:    per-head QK norm, NeoX, HS 16 from key_length (C/NH = 8), tied head.
 *   mistral:  a llama file with sliding_window 4 and no pattern: every layer slides; one KV head.
 *   mistral3: llama's graph under its own name.
 *   phi3:     fused attn_qkv and ffn_up (gate then up) bound as row views, partial NeoX rotary (4 of 8), window 5 on
 *             every layer, LongRoPE factor tensors present (ones).
 *   gemma2:   attention softcap 2, final softcap 3, window 4 on even layers, attention.scale 0.2, sandwich norms,
 *             GeGLU, embedding scale, tied head.
 *   smollm3:  NoPE on layers 3 and 7 of 8, interleaved RoPE.
 *   olmo2:    no pre-norms, post-norms, QK norm over the whole q (32) and k (16), NeoX.
 * Every fixture runs as one batch, in chunks of 3 and token by token, with 1 and 2 threads: with a window of 4
 * and chunks of 3 a sliding layer's ring holds 6 rows for 20 positions, so it wraps three times, and decode reads
 * keys across the wrap. test_window_attention checks the op itself at sizes that take the threaded paths (prefill by
 * (token, KV head), decode by key piece) against a double reference, a ring against the full cache, and token by
 * token against the batch bit for bit. Run from the repo root. */
#include "kiln.h"
#include "cpu/ops.h"
#include "fp16.h"
#include "model/model.h"
#include "train/llama_train.h"
#include "test.h"

#include <stdint.h>
#include <unistd.h>

#define BOUND 2e-4

typedef struct {
    kiln_gguf *g;
    kiln_model *m;
    int32_t ids[64];
    int64_t T, V;
    const float *ref; /* (T, V) */
} fixture;

static void fixture_close(fixture *f) {
    kiln_model_free(f->m);
    kiln_gguf_close(f->g);
}

static kiln_status fixture_open(const char *path, fixture *f) {
    memset(f, 0, sizeof *f);
    kiln_status s = kiln_gguf_open(path, &f->g);
    if (s) return s;
    const kiln_gguf_value *tok;
    if ((s = kiln_gguf_get_arr(f->g, "ref.tokens", KILN_GGUF_INT32, &tok))) return s;
    const kiln_tensor_view *lg = kiln_gguf_find_tensor(f->g, "ref.logits");
    if (!lg || lg->type != KILN_TYPE_F32 || tok->arr.n > 64 || lg->ne[1] != (int64_t)tok->arr.n) return KILN_ERR_FORMAT;
    f->T = (int64_t)tok->arr.n;
    f->V = lg->ne[0];
    f->ref = lg->data;
    for (int64_t t = 0; t < f->T; t++) f->ids[t] = (int32_t)kiln_gguf_arr_i64(tok, (uint64_t)t);
    return kiln_model_load(path, &f->m);
}

/* Max |kiln - ref| over all logits of the sequence, evaluated in chunks of n_batch (token by token when
 * n_batch is 1, one eval per token), or -1 on an error. */
static double run(const fixture *f, int64_t n_batch, int n_threads) {
    kiln_session_params p = {.n_ctx = 0, .n_batch = n_batch, .n_threads = n_threads};
    kiln_session *s;
    if (kiln_session_new(f->m, &p, &s)) return -1;
    float *logits = malloc(sizeof *logits * (size_t)(f->T * f->V));
    double err = -1;
    if (!logits) goto done;
    if (n_batch == 1) {
        for (int64_t t = 0; t < f->T; t++)
            if (kiln_session_eval(s, f->ids + t, 1, logits + t * f->V, NULL)) goto done;
    } else if (kiln_session_eval(s, f->ids, (size_t)f->T, NULL, logits)) {
        goto done;
    }
    err = 0;
    for (int64_t i = 0; i < f->T * f->V; i++) {
        double d = fabs((double)logits[i] - (double)f->ref[i]);
        err = d > err || isnan(d) ? d : err;
    }
done:
    free(logits);
    kiln_session_free(s);
    return err;
}

static void check_fixture(const char *path) {
    fixture f;
    kiln_status st = fixture_open(path, &f);
    if (st) fixture_close(&f);
    CHECK(st == KILN_OK, "%s: %s", path, kiln_last_error());
    const int64_t batches[3] = {f.T, 3, 1};
    double worst = 0;
    for (int b = 0; b < 3; b++)
        for (int nth = 1; nth <= 2; nth++) {
            double e = run(&f, batches[b], nth);
            if (!(e >= 0 && e < BOUND)) fixture_close(&f);
            CHECK(e >= 0 && e < BOUND, "%s: n_batch %lld, %d threads: max |logit - ref| %.3g (bound %g)", path,
                  (long long)batches[b], nth, e, BOUND);
            worst = e > worst ? e : worst;
        }
    printf("# %s: %lld tokens, max |logit - ref| %.2e over n_batch %lld/3/1 and 1/2 threads\n", path, (long long)f.T,
           worst, (long long)f.T);
    fixture_close(&f);
}

static void test_arch_qwen2(void) { check_fixture("tests/ref/arch_qwen2.gguf"); }
static void test_arch_gemma3(void) { check_fixture("tests/ref/arch_gemma3.gguf"); }
static void test_arch_muse(void) { check_fixture("tests/ref/arch_muse.gguf"); }
static void test_arch_qwen3(void) { check_fixture("tests/ref/arch_qwen3.gguf"); }
static void test_arch_mistral(void) { check_fixture("tests/ref/arch_mistral.gguf"); }
static void test_arch_mistral3(void) { check_fixture("tests/ref/arch_mistral3.gguf"); }
static void test_arch_phi3(void) { check_fixture("tests/ref/arch_phi3.gguf"); }
static void test_arch_gemma2(void) { check_fixture("tests/ref/arch_gemma2.gguf"); }
static void test_arch_smollm3(void) { check_fixture("tests/ref/arch_smollm3.gguf"); }
static void test_arch_olmo2(void) { check_fixture("tests/ref/arch_olmo2.gguf"); }

/* The new architectures' flags as each fixture's metadata and llama.cpp's rules set them. */
static void test_arch_config_more(void) {
    kiln_model *m;
    CHECK(kiln_model_load("tests/ref/arch_qwen3.gguf", &m) == KILN_OK, "%s", kiln_last_error());
    bool ok = m->cfg.qk_norm && !m->cfg.qk_norm_full && m->cfg.rope_neox && !m->cfg.qkv_bias && m->cfg.head_dim == 16 && m->cfg.tied;
    kiln_model_free(m);
    CHECK(ok, "qwen3 flags");
    CHECK(kiln_model_load("tests/ref/arch_mistral.gguf", &m) == KILN_OK, "%s", kiln_last_error());
    ok = !m->cfg.rope_neox && m->layers[0].window == 4 && m->layers[1].window == 4;
    kiln_model_free(m);
    CHECK(ok, "mistral flags: every layer slides");
    CHECK(kiln_model_load("tests/ref/arch_phi3.gguf", &m) == KILN_OK, "%s", kiln_last_error());
    const kiln_llama_layer *L = &m->layers[1];
    const kiln_tensor_view *qkv = kiln_gguf_find_tensor(m->gguf, "blk.1.attn_qkv.weight");
    const kiln_tensor_view *gu = kiln_gguf_find_tensor(m->gguf, "blk.1.ffn_up.weight");
    ok = m->cfg.fused_qkv && m->cfg.fused_gate_up && m->cfg.rope_neox && m->cfg.rope_dim == 4 && L->window == 5 && qkv && gu &&
         L->wq->data == qkv->data && L->wq->ne[1] == 32 && (const char *)L->wk->data == (const char *)qkv->data + 32 * qkv->nb[1] &&
         (const char *)L->wv->data == (const char *)qkv->data + 64 * qkv->nb[1] && L->wv->ne[1] == 32 &&
         L->w_gate->data == gu->data && L->w_gate->ne[1] == 40 && (const char *)L->w_up->data == (const char *)gu->data + 40 * gu->nb[1] &&
         L->w_up->nbytes == 40 * gu->nb[1];
    kiln_model_free(m);
    CHECK(ok, "phi3 flags and row views");
    CHECK(kiln_model_load("tests/ref/arch_gemma2.gguf", &m) == KILN_OK, "%s", kiln_last_error());
    ok = m->cfg.attn_softcap == 2.0f && m->cfg.logit_softcap == 3.0f && m->cfg.attn_scale == 0.2f && m->cfg.geglu &&
         m->cfg.sandwich_norm && m->cfg.embd_scale && !m->cfg.qk_norm && m->cfg.tied;
    for (int64_t l = 0; l < m->cfg.n_layer; l++) ok = ok && m->layers[l].window == (l % 2 == 0 ? 4 : 0); /* even layers slide */
    kiln_model_free(m);
    CHECK(ok, "gemma2 flags");
    CHECK(kiln_model_load("tests/ref/arch_smollm3.gguf", &m) == KILN_OK, "%s", kiln_last_error());
    ok = !m->cfg.rope_neox;
    for (int64_t l = 0; l < m->cfg.n_layer; l++) ok = ok && m->layers[l].nope == (l == 3 || l == 7);
    kiln_model_free(m);
    CHECK(ok, "smollm3 flags: NoPE on layers 3 and 7");
    CHECK(kiln_model_load("tests/ref/arch_olmo2.gguf", &m) == KILN_OK, "%s", kiln_last_error());
    ok = m->cfg.no_pre_norm && m->cfg.qk_norm && m->cfg.qk_norm_full && m->cfg.sandwich_norm && m->cfg.rope_neox &&
         !m->layers[0].attn_norm && !m->layers[0].ffn_norm && m->layers[0].q_norm->ne[0] == 32 && m->layers[0].k_norm->ne[0] == 16;
    kiln_model_free(m);
    CHECK(ok, "olmo2 flags");
}

/* The metadata reached the config: each fixture's flags, read independently of the logits. */
static void test_arch_config(void) {
    kiln_model *m;
    CHECK(kiln_model_load("tests/ref/arch_gemma3.gguf", &m) == KILN_OK, "%s", kiln_last_error());
    const kiln_llama_config c = m->cfg;
    bool ok = c.head_dim == 8 && c.rope_neox && c.qk_norm && c.sandwich_norm && c.geglu && c.embd_scale && c.tied &&
              c.sliding_window == 4 && c.swa_pattern == 6 && !c.qkv_bias && !c.output_gate;
    for (int64_t l = 0; l < c.n_layer; l++)
        ok = ok && m->layers[l].window == (l == 5 ? 0 : 4) && m->layers[l].rope_base == (l == 5 ? 1e6f : 10000.0f);
    kiln_model_free(m);
    CHECK(ok, "gemma3 flags");
    CHECK(kiln_model_load("tests/ref/arch_muse.gguf", &m) == KILN_OK, "%s", kiln_last_error());
    const kiln_llama_config d = m->cfg;
    ok = !d.rope_neox && d.output_gate && d.sandwich_norm && d.post_norm_eps == 1e-2f && d.rms_eps == 1e-5f &&
         d.logit_scale == 0.5f && d.logit_softcap == 3.0f && d.attn_scale == 0.25f && !m->layers[0].nope && m->layers[1].nope &&
         m->layers[0].window == 5 && m->layers[1].window == 0 && m->layers[2].window == 5 && m->layers[0].rope_base == 500.0f;
    kiln_model_free(m);
    CHECK(ok, "muse flags");
    CHECK(kiln_model_load("tests/ref/arch_qwen2.gguf", &m) == KILN_OK, "%s", kiln_last_error());
    ok = m->cfg.qkv_bias && m->cfg.rope_neox && !m->cfg.geglu && m->cfg.sliding_window == 0;
    kiln_model_free(m);
    CHECK(ok, "qwen2 flags");
}

/* Training computes the plain llama layer: each new architecture fixture is refused by the checks kiln_trainer_new
 * runs (kiln_llama_train_check_model, then the layout), naming what it cannot train, except mistral3, which is
 * plain llama and trains. */
static void test_arch_train_refuses(void) {
    static const struct {
        const char *name, *says; /* says: a piece of the refusal, NULL: trainable */
    } cases[] = {
        {"arch_qwen3", "NeoX"}, {"arch_mistral", "sliding-window"}, {"arch_phi3", "rope_dim 4 of 8"},
        {"arch_gemma2", "NeoX"}, {"arch_smollm3", "NoPE"}, {"arch_olmo2", "NeoX"}, {"arch_mistral3", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char path[96];
        snprintf(path, sizeof path, "tests/ref/%s.gguf", cases[i].name);
        kiln_model *m;
        CHECK(kiln_model_load(path, &m) == KILN_OK, "%s", kiln_last_error());
        kiln_llama_config c;
        kiln_llama_train *t = NULL;
        kiln_status s = kiln_llama_train_check_model(m, &c);
        if (!s) s = kiln_llama_train_layout(&c, &t);
        kiln_llama_train_free(t);
        kiln_model_free(m);
        if (cases[i].says)
            CHECK(s == KILN_ERR_UNSUPPORTED && strstr(kiln_last_error(), cases[i].says), "%s: status %d: %s", path, (int)s,
                  s ? kiln_last_error() : "trains");
        else
            CHECK(s == KILN_OK, "%s: %s", path, kiln_last_error());
    }
    /* the flags each refusal names, past the RoPE checks that come first in a file (a config built by hand) */
    const kiln_llama_config base = {.n_vocab = 64, .n_embd = 32, .n_layer = 2, .n_head = 4, .n_head_kv = 4, .n_ff = 48};
    kiln_llama_config soft = base, post = base;
    soft.attn_softcap = 50.0f;
    post.no_pre_norm = true;
    kiln_llama_train *t = NULL;
    CHECK(kiln_llama_train_layout(&soft, &t) == KILN_ERR_UNSUPPORTED && strstr(kiln_last_error(), "attention softcap"), "%s",
          kiln_last_error());
    CHECK(kiln_llama_train_layout(&post, &t) == KILN_ERR_UNSUPPORTED && strstr(kiln_last_error(), "pre-norms"), "%s",
          kiln_last_error());
    CHECK(kiln_llama_train_layout(&base, &t) == KILN_OK, "%s", kiln_last_error());
    kiln_llama_train_free(t);
}

/* attention_window_forward over a ring against a double reference of the windowed softmax over the full history.
 * Cases: decode steps (T = 1, 2: keys split over threads, pieces cut at the wrap), a prefill batch (T = 6), a
 * window past the 128-key chunk (W = 300), and W larger than the history (no sliding yet). Bound: 2e-6 of
 * sum_j p_j |v_j|, as tests/test_ops.c's attention (float sums over at most a few hundred keys). */
static void test_window_attention(void) {
    typedef struct {
        int64_t NH, NKV, HS, W, pos0, T;
    } wcase;
    static const wcase cases[] = {
        {8, 2, 64, 100, 600, 1}, {8, 2, 64, 100, 517, 2}, {8, 2, 64, 64, 250, 6}, {4, 1, 64, 300, 700, 3}, {4, 2, 32, 50, 20, 4},
    };
    unsigned long long rng = 66;
    kiln_pool *pools[2] = {NULL, NULL};
    CHECK(kiln_pool_create(1, &pools[0]) == KILN_OK && kiln_pool_create(2, &pools[1]) == KILN_OK);
    double worst = 0;
    int bits_differ = 0; /* 1 + the case whose threads or token-by-token run differed */
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        const wcase k = cases[c];
        const int64_t n = k.pos0 + k.T, kv = k.NKV * k.HS, qw = k.NH * k.HS, R = k.W + k.T - 1; /* ring rows */
        uint16_t *kf = malloc((size_t)(n * kv) * 2), *vf = malloc((size_t)(n * kv) * 2);  /* (n, kv) full history */
        uint16_t *kr = malloc((size_t)(R * kv) * 2), *vr = malloc((size_t)(R * kv) * 2);  /* (R, kv) ring */
        float *q = malloc(sizeof *q * (size_t)(k.T * qw)), *out = malloc(sizeof *out * (size_t)(k.T * qw));
        float *first = malloc(sizeof *first * (size_t)(k.T * qw));
        double *s = malloc(sizeof *s * (size_t)n);
        for (int64_t i = 0; i < n * kv; i++) {
            kf[i] = kiln_f32_to_fp16(test_rng_normal(&rng));
            vf[i] = kiln_f32_to_fp16(test_rng_normal(&rng));
        }
        for (int64_t p = n > R ? n - R : 0; p < n; p++) { /* the ring holds the last R positions, p in row p % R */
            memcpy(kr + (p % R) * kv, kf + p * kv, (size_t)kv * 2);
            memcpy(vr + (p % R) * kv, vf + p * kv, (size_t)kv * 2);
        }
        for (int64_t i = 0; i < k.T * qw; i++) q[i] = test_rng_normal(&rng);
        for (int p = 0; p < 2; p++) {
            const size_t bytes = kiln_cpu_ops.scratch_size(k.T, qw, k.NH, n, kiln_pool_size(pools[p]));
            kiln_ops_ctx ctx = {.pool = pools[p], .scratch = malloc(bytes), .scratch_bytes = bytes};
            kiln_cpu_ops.attention_window_forward(&ctx, out, q, kr, vr, k.pos0, k.T, k.NH, k.NKV, k.HS, k.W, R, 0.0f);
            if (p == 0) memcpy(first, out, sizeof *out * (size_t)(k.T * qw));
            bool same = memcmp(first, out, sizeof *out * (size_t)(k.T * qw)) == 0;
            for (int64_t t = 0; t < k.T && same; t++) { /* token by token, same bits */
                float one[512];
                kiln_cpu_ops.attention_window_forward(&ctx, one, q + t * qw, kr, vr, k.pos0 + t, 1, k.NH, k.NKV, k.HS, k.W, R, 0.0f);
                same = memcmp(one, first + t * qw, sizeof *one * (size_t)qw) == 0;
            }
            free(ctx.scratch);
            if (!same) bits_differ = (int)c + 1;
        }
        double err = 0;
        for (int64_t t = 0; t < k.T; t++)
            for (int64_t h = 0; h < k.NH; h++) {
                const int64_t g = h / (k.NH / k.NKV), p = k.pos0 + t, lo = p - k.W + 1 > 0 ? p - k.W + 1 : 0;
                double mx = -INFINITY, sum = 0;
                for (int64_t j = lo; j <= p; j++) {
                    double d = 0;
                    for (int64_t e = 0; e < k.HS; e++) d += (double)q[t * qw + h * k.HS + e] * kiln_fp16_to_f32(kf[j * kv + g * k.HS + e]);
                    s[j] = d / sqrt((double)k.HS);
                    mx = s[j] > mx ? s[j] : mx;
                }
                for (int64_t j = lo; j <= p; j++) sum += (s[j] = exp(s[j] - mx));
                for (int64_t e = 0; e < k.HS; e++) {
                    double o = 0, scale = 0;
                    for (int64_t j = lo; j <= p; j++) {
                        const double vj = kiln_fp16_to_f32(vf[j * kv + g * k.HS + e]);
                        o += s[j] / sum * vj;
                        scale += s[j] / sum * fabs(vj);
                    }
                    const double rel = fabs(out[t * qw + h * k.HS + e] - o) / scale;
                    err = rel > err || isnan(rel) ? rel : err;
                }
            }
        free(kf), free(vf), free(kr), free(vr), free(q), free(out), free(first), free(s);
        worst = err > worst ? err : worst;
        if (!(err < 2e-6)) {
            kiln_pool_free(pools[0]), kiln_pool_free(pools[1]);
            CHECK(err < 2e-6, "case %zu: error %.3g of sum p|v|", c, err);
        }
    }
    kiln_pool_free(pools[0]), kiln_pool_free(pools[1]);
    CHECK(!bits_differ, "case %d: 2 threads or token by token differ from 1 thread's batch", bits_differ - 1);
    printf("# windowed ring attention: max error %.2e of sum_j p_j |v_j| (bound 2e-6)\n", worst);
}

/* A copy of tests/ref/arch_muse.gguf with one metadata key set (a u32 when arr is NULL, else an i32 array), or,
 * with drop, without the tensors whose name ends in drop; then loaded: returns the load's status and, with keep,
 * the model (NULL on failure). */
static kiln_status load_variant(const char *key, uint32_t u32, const int32_t *arr, uint64_t n, const char *drop,
                                kiln_model **keep) {
    char path[64];
    snprintf(path, sizeof path, "/tmp/kiln_arch_variant_%d.gguf", (int)getpid());
    kiln_gguf *g = NULL;
    kiln_gguf_writer *w = NULL;
    kiln_status s = kiln_gguf_open("tests/ref/arch_muse.gguf", &g);
    if (!s) s = kiln_gguf_writer_new(&w);
    if (!s) s = kiln_gguf_writer_copy_kv(w, g, NULL);
    if (!s && key) s = arr ? kiln_gguf_writer_set_arr(w, key, KILN_GGUF_INT32, arr, n) : kiln_gguf_writer_set_u32(w, key, u32);
    for (int64_t i = 0; !s && i < kiln_gguf_n_tensors(g); i++) {
        const kiln_tensor_view *t = kiln_gguf_tensor_at(g, i);
        size_t len = strlen(t->name), dl = drop ? strlen(drop) : 0;
        if (drop && len >= dl && strcmp(t->name + len - dl, drop) == 0) continue;
        s = kiln_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data);
    }
    if (!s) s = kiln_gguf_writer_write_file(w, path);
    kiln_gguf_writer_free(w);
    kiln_gguf_close(g);
    if (s) return KILN_ERR_IO; /* the writing failed, not the load */
    kiln_model *m = NULL;
    s = kiln_model_load(path, &m);
    if (keep)
        *keep = m;
    else
        kiln_model_free(m);
    remove(path);
    return s;
}

/* Bad metadata and missing feature tensors fail the load with a message naming the key or tensor. */
static void test_arch_rejects(void) {
    const int32_t bad_layer[2] = {0, 3}; /* the model has 3 layers */
    CHECK(load_variant("llama.attention.nope_layers", 0, bad_layer, 2, NULL, NULL) == KILN_ERR_FORMAT);
    CHECK(strstr(kiln_last_error(), "nope_layers") && strstr(kiln_last_error(), "layer 3"), "%s", kiln_last_error());
    CHECK(load_variant(NULL, 0, NULL, 0, "blk.2.attn_gate.weight", NULL) == KILN_ERR_NOT_FOUND);
    CHECK(strstr(kiln_last_error(), "blk.2.attn_gate.weight"), "%s", kiln_last_error());
    CHECK(load_variant(NULL, 0, NULL, 0, "blk.1.post_ffw_norm.weight", NULL) == KILN_ERR_NOT_FOUND);
    CHECK(strstr(kiln_last_error(), "blk.1.post_ffw_norm.weight"), "%s", kiln_last_error());
    CHECK(load_variant("llama.attention.value_length", 4, NULL, 0, NULL, NULL) == KILN_ERR_UNSUPPORTED);
    CHECK(strstr(kiln_last_error(), "value_length"), "%s", kiln_last_error());
    CHECK(load_variant(NULL, 0, NULL, 0, NULL, NULL) == KILN_OK, "the unchanged copy loads: %s", kiln_last_error());
    /* the sliding pattern as one flag per layer (llama.cpp's array form) */
    const int32_t flags[3] = {0, 1, 1};
    CHECK(load_variant("llama.attention.sliding_window_pattern", 0, flags, 2, NULL, NULL) == KILN_ERR_FORMAT);
    CHECK(strstr(kiln_last_error(), "2 entries for 3 layers"), "%s", kiln_last_error());
    kiln_model *m;
    CHECK(load_variant("llama.attention.sliding_window_pattern", 0, flags, 3, NULL, &m) == KILN_OK, "%s", kiln_last_error());
    const bool ok = m->layers[0].window == 0 && m->layers[1].window == 5 && m->layers[2].window == 5 &&
                    m->layers[0].rope_base == 10000.0f && m->layers[1].rope_base == 500.0f;
    kiln_model_free(m);
    CHECK(ok, "per-layer sliding flags");
}

/* A copy of fixture src with: the f32 key fkey (when not NULL), the u32 key ukey (when not NULL), a tensor named add
 * (when not NULL: a copy of output_norm.weight's data) and without the tensor named drop; then loaded, the model
 * freed. Returns the load's status. */
typedef struct {
    const char *src, *fkey;
    float f;
    const char *ukey;
    uint32_t u;
    const char *add, *drop;
} variant;

static kiln_status load_copy(const variant *v, int64_t *window0) {
    char path[64];
    snprintf(path, sizeof path, "/tmp/kiln_arch_copy_%d.gguf", (int)getpid());
    kiln_gguf *g = NULL;
    kiln_gguf_writer *w = NULL;
    kiln_status s = kiln_gguf_open(v->src, &g);
    if (!s) s = kiln_gguf_writer_new(&w);
    if (!s) s = kiln_gguf_writer_copy_kv(w, g, NULL);
    if (!s && v->fkey) s = kiln_gguf_writer_set_f32(w, v->fkey, v->f);
    if (!s && v->ukey) s = kiln_gguf_writer_set_u32(w, v->ukey, v->u);
    for (int64_t i = 0; !s && i < kiln_gguf_n_tensors(g); i++) {
        const kiln_tensor_view *t = kiln_gguf_tensor_at(g, i);
        if (v->drop && strcmp(t->name, v->drop) == 0) continue;
        s = kiln_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data);
        if (!s && v->add && strcmp(t->name, "output_norm.weight") == 0)
            s = kiln_gguf_writer_add_tensor(w, v->add, t->type, t->n_dims, t->ne, t->data);
    }
    if (!s) s = kiln_gguf_writer_write_file(w, path);
    kiln_gguf_writer_free(w);
    kiln_gguf_close(g);
    if (s) return KILN_ERR_IO; /* the writing failed, not the load */
    kiln_model *m = NULL;
    s = kiln_model_load(path, &m);
    if (m && window0) *window0 = m->layers[0].window;
    kiln_model_free(m);
    remove(path);
    return s;
}

/* What the new architectures' files may hold that kiln does not run is refused, naming it; the keys that are
 * supported in one value and not another take the supported one. */
static void test_arch_rejects_more(void) {
    static const struct {
        variant v;
        kiln_status want;
        const char *says;
    } cases[] = {
        {{"tests/ref/arch_mistral3.gguf", .fkey = "mistral3.attention.temperature_scale", .f = 0.1f}, KILN_ERR_UNSUPPORTED, "temperature"},
        {{"tests/ref/arch_mistral3.gguf", .fkey = "mistral3.attention.temperature_scale", .f = 0.0f}, KILN_OK, NULL},
        {{"tests/ref/arch_muse.gguf", .add = "blk.0.ffn_gate_inp.weight"}, KILN_ERR_UNSUPPORTED, "mixture-of-experts"},
        {{"tests/ref/arch_phi3.gguf", .add = "blk.0.attn_qkv.bias"}, KILN_ERR_UNSUPPORTED, "attn_qkv.bias"},
        {{"tests/ref/arch_phi3.gguf", .drop = "blk.1.attn_qkv.weight"}, KILN_ERR_NOT_FOUND, "blk.1.attn_qkv.weight"},
        {{"tests/ref/arch_phi3.gguf", .drop = "blk.0.ffn_up.weight"}, KILN_ERR_NOT_FOUND, "blk.0.ffn_up.weight"},
        {{"tests/ref/arch_olmo2.gguf", .add = "blk.0.attn_q.bias"}, KILN_ERR_UNSUPPORTED, "full-width QK norm"},
        {{"tests/ref/arch_olmo2.gguf", .drop = "blk.1.attn_k_norm.weight"}, KILN_ERR_NOT_FOUND, "blk.1.attn_k_norm.weight"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const kiln_status s = load_copy(&cases[i].v, NULL);
        CHECK(s == cases[i].want && (!cases[i].says || strstr(kiln_last_error(), cases[i].says)), "case %zu: status %d: %s", i,
              (int)s, kiln_last_error());
    }
    /* phi3's converter writes sliding_window 0 for "none" (Phi-4): every layer is then full */
    int64_t w0 = -1;
    const variant none = {"tests/ref/arch_phi3.gguf", .ukey = "phi3.attention.sliding_window", .u = 0};
    CHECK(load_copy(&none, &w0) == KILN_OK && w0 == 0, "sliding_window 0: %s, window %lld", kiln_last_error(), (long long)w0);
}

int main(void) {
    RUN(test_arch_rejects_more);
    RUN(test_arch_rejects);
    RUN(test_window_attention);
    RUN(test_arch_config);
    RUN(test_arch_qwen2);
    RUN(test_arch_gemma3);
    RUN(test_arch_muse);
    RUN(test_arch_config_more);
    RUN(test_arch_train_refuses);
    RUN(test_arch_qwen3);
    RUN(test_arch_mistral);
    RUN(test_arch_mistral3);
    RUN(test_arch_phi3);
    RUN(test_arch_gemma2);
    RUN(test_arch_smollm3);
    RUN(test_arch_olmo2);
    TEST_EXIT();
}
