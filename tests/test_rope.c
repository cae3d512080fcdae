/* test_rope.c: RoPE scaling (src/model/rope.c, the table the CPU rope reads) against tests/ref/rope_ref.py's
 * float64 reference, through the real model load and a session. Each fixture (tests/ref/rope_*.gguf) is a tiny
 * random F32 model with 48 tokens whose positions run past the original context (32); it holds ref.tokens and the
 * reference logits. Bound 2e-4 as tests/test_arch.c (f16 k/v in both; what is left is float32 arithmetic, and
 * the angles' float recurrence, ~1e-5 rad at position 47). The unscaled reference of the same weights lands 0.7 to
 * 2.7 away from every scaled one (rope_ref.py's forward, measured), so a scaling silently ignored fails by three orders
 * of magnitude. Measured: 6e-7 to 7e-6.
 *   linear   factor 4 (llama, interleaved), and the overrides --rope-scaling none / --rope-freq-scale 0.5
 *   yarn     factor 4 from 32 positions (qwen2, NeoX): the ramp over pairs 0..3, mscale 1.139
 *   freqs    rope_freqs.weight (Llama 3.1+)
 *   llama3   HF's llama3 rule from rope.scaling.* keys
 *   longrope long factors past 32 positions, short ones in a 32-position session, mscale from the ratio
 *   gemma3   linear factor 8 on the global layer only
 * test_rope_op checks the op with a table against a double formula; test_rope_rejects the refusals; test_rope_train
 * that CPU training reads the table (its forward's loss equals the inference forward's). Run from the repo root. */
#include "kiln.h"
#include "cpu/ops.h"
#include "model/model.h"
#include "train/llama_train.h"
#include "test.h"

#include <math.h>
#include <stdint.h>
#include <unistd.h>

#define BOUND 2e-4

/* Max |kiln - ref| over the first T positions of path's ref.tokens against tensor ref_name, in chunks of n_batch
 * (token by token when 1), with the session's context n_ctx (0: the model's), or -1 on an error. m NULL: load path. */
static double run_ref(const char *path, kiln_model *m, const char *ref_name, int64_t T, int64_t n_ctx, int64_t n_batch) {
    kiln_gguf *g = NULL;
    kiln_model *own = NULL;
    kiln_session *s = NULL;
    float *logits = NULL;
    double err = -1;
    const kiln_gguf_value *tok;
    if (kiln_gguf_open(path, &g) || kiln_gguf_get_arr(g, "ref.tokens", KILN_GGUF_INT32, &tok)) goto done;
    const kiln_tensor_view *ref = kiln_gguf_find_tensor(g, ref_name);
    if (!m && kiln_model_load(path, &own)) goto done;
    if (!m) m = own;
    const int64_t V = kiln_model_n_vocab(m);
    if (!ref || ref->ne[0] != V || ref->ne[1] < T || (int64_t)tok->arr.n < T) goto done;
    int32_t ids[64];
    for (int64_t t = 0; t < T && t < 64; t++) ids[t] = (int32_t)kiln_gguf_arr_i64(tok, (uint64_t)t);
    kiln_session_params p = {.n_ctx = n_ctx, .n_batch = n_batch, .n_threads = 2};
    if (kiln_session_new(m, &p, &s) || !(logits = malloc(sizeof *logits * (size_t)(T * V)))) goto done;
    if (n_batch == 1) {
        for (int64_t t = 0; t < T; t++)
            if (kiln_session_eval(s, ids + t, 1, logits + t * V, NULL)) goto done;
    } else if (kiln_session_eval(s, ids, (size_t)T, NULL, logits)) {
        goto done;
    }
    err = 0;
    const float *r = ref->data;
    for (int64_t i = 0; i < T * V; i++) {
        const double d = fabs((double)logits[i] - (double)r[i]);
        err = d > err || isnan(d) ? d : err;
    }
done:
    free(logits);
    kiln_session_free(s);
    kiln_model_free(own);
    kiln_gguf_close(g);
    return err;
}

static void check_ref(const char *name, const char *ref_name, int64_t T, int64_t n_ctx) {
    char path[128];
    snprintf(path, sizeof path, "tests/ref/%s.gguf", name);
    const int64_t batches[3] = {T, 5, 1};
    double worst = 0;
    for (int b = 0; b < 3; b++) {
        const double e = run_ref(path, NULL, ref_name, T, n_ctx, batches[b]);
        CHECK(e >= 0 && e < BOUND, "%s %s: n_batch %lld: max |logit - ref| %.3g (bound %g): %s", name, ref_name,
              (long long)batches[b], e, BOUND, e < 0 ? kiln_last_error() : "");
        worst = e > worst ? e : worst;
    }
    printf("# %s %s: %lld tokens, max |logit - ref| %.2e over n_batch %lld/5/1\n", name, ref_name, (long long)T, worst,
           (long long)T);
}

static void test_rope_linear(void) { check_ref("rope_linear", "ref.logits", 48, 0); }
static void test_rope_yarn(void) { check_ref("rope_yarn", "ref.logits", 48, 0); }
static void test_rope_freqs(void) { check_ref("rope_freqs", "ref.logits", 48, 0); }
static void test_rope_llama3(void) { check_ref("rope_llama3", "ref.logits", 48, 0); }
static void test_rope_longrope(void) {
    check_ref("rope_longrope", "ref.logits", 48, 0);        /* context 64 > 32: the long factors */
    check_ref("rope_longrope", "ref.logits_short", 32, 32); /* a context of 32: the short ones */
}
static void test_rope_gemma3(void) { check_ref("rope_gemma3", "ref.logits", 48, 0); }

/* The scaling reached the config and the layers: what rope.c read, independently of the logits. */
static void test_rope_config(void) {
    kiln_model *m;
    CHECK(kiln_model_load("tests/ref/rope_yarn.gguf", &m) == KILN_OK, "%s", kiln_last_error());
    const kiln_rope_scaling_cfg sc = m->cfg.rope_scaling;
    /* llama.cpp's figures for factor 4: mscale 0.1 ln 4 + 1; ramp pairs 0..3 of 8 (corr dims 0 and 3) */
    const float ms = m->layers[0].rope.mscale, *f = m->layers[0].rope.freq;
    bool ok = sc.kind == KILN_ROPE_KIND_YARN && sc.freq_scale == 0.25f && sc.orig_ctx == 32 && f && fabsf(ms - 1.138629f) < 1e-5f &&
              f[0] == 1.0f && fabsf(f[1] - 0.75f) < 1e-6f && fabsf(f[2] - 0.5f) < 1e-6f && f[3] == 0.25f && f[7] == 0.25f;
    kiln_model_free(m);
    CHECK(ok, "yarn table: mscale %g", (double)ms);
    CHECK(kiln_model_load("tests/ref/rope_gemma3.gguf", &m) == KILN_OK, "%s", kiln_last_error());
    ok = m->layers[0].window && !m->layers[0].rope.freq && !m->layers[1].window && m->layers[1].rope.freq &&
         m->layers[1].rope.freq[3] == 0.125f;
    kiln_model_free(m);
    CHECK(ok, "gemma3: the sliding layer unscaled, the global one at 1/8");
    /* an unscaled model keeps freq NULL: the rotation of before, bit for bit */
    CHECK(kiln_model_load("tests/ref/arch_qwen2.gguf", &m) == KILN_OK, "%s", kiln_last_error());
    ok = !m->rope_freq && !m->layers[0].rope.freq && m->layers[0].rope.mscale == 1.0f;
    kiln_model_free(m);
    CHECK(ok, "an unscaled model has no table");
}

/* llama.cpp's context overrides: --rope-scaling none gives the unscaled model, --rope-freq-scale 0.5 linear factor
 * 2; a bad value is refused and leaves the model as it was. */
static void test_rope_overrides(void) {
    const char *path = "tests/ref/rope_linear.gguf";
    kiln_model *m;
    CHECK(kiln_model_load(path, &m) == KILN_OK, "%s", kiln_last_error());
    kiln_rope_overrides ov = kiln_rope_overrides_default();
    ov.type = KILN_ROPE_SCALING_NONE;
    CHECK(kiln_model_set_rope(m, &ov) == KILN_OK, "%s", kiln_last_error());
    double e = run_ref(path, m, "ref.logits_none", 48, 0, 48);
    CHECK(e >= 0 && e < BOUND, "--rope-scaling none: %.3g", e);
    ov = kiln_rope_overrides_default();
    ov.freq_scale = 0.5f;
    CHECK(kiln_model_set_rope(m, &ov) == KILN_OK, "%s", kiln_last_error());
    e = run_ref(path, m, "ref.logits_fs2", 48, 0, 48);
    CHECK(e >= 0 && e < BOUND, "--rope-freq-scale 0.5: %.3g", e);
    ov = kiln_rope_overrides_default();
    ov.freq_base = NAN;
    CHECK(kiln_model_set_rope(m, &ov) == KILN_ERR_INVALID && strstr(kiln_last_error(), "freq_base"), "%s", kiln_last_error());
    ov = kiln_rope_overrides_default();
    ov.yarn_beta_fast = INFINITY;
    CHECK(kiln_model_set_rope(m, &ov) == KILN_ERR_INVALID && strstr(kiln_last_error(), "yarn_beta_fast"), "%s", kiln_last_error());
    ov = kiln_rope_overrides_default();
    ov.type = (kiln_rope_scaling_type)7;
    CHECK(kiln_model_set_rope(m, &ov) == KILN_ERR_INVALID, "%s", kiln_last_error());
    e = run_ref(path, m, "ref.logits_fs2", 48, 0, 48);
    CHECK(e >= 0 && e < BOUND, "a refused override changed the model: %.3g", e);
    /* --rope-freq-base: the same table as a file with that base (the unscaled path's angles change) */
    ov = kiln_rope_overrides_default();
    ov.freq_base = 1000.0f;
    CHECK(kiln_model_set_rope(m, &ov) == KILN_OK && m->layers[0].rope_base == 1000.0f && m->cfg.rope_base == 1000.0f, "%s",
          kiln_last_error());
    kiln_model_free(m);
}

/* ---------------------------------------------------------------- refusals */

typedef struct {
    const char *src;      /* fixture name */
    const char *drop_key; /* left out (and set again when key is the same) */
    const char *key;      /* set: str, else f */
    const char *str;
    float f;
    const int32_t *arr;   /* set key to an int32 array of n instead */
    int64_t n;
    const char *drop_tensor, *tensor; /* a tensor left out; a f32 vector tensor (vals, nv) added */
    const float *vals;
    int64_t nv;
} variant;

static const char *dropped_key;
static bool drop_key(const char *k) { return dropped_key && strcmp(k, dropped_key) == 0; }

static kiln_status load_variant(const variant *v, const char *out, kiln_model **m) {
    char in[128];
    snprintf(in, sizeof in, "tests/ref/%s.gguf", v->src);
    kiln_gguf *g;
    kiln_gguf_writer *w = NULL;
    kiln_status s = kiln_gguf_open(in, &g);
    if (s) return s;
    dropped_key = v->drop_key;
    if (!(s = kiln_gguf_writer_new(&w))) s = kiln_gguf_writer_copy_kv(w, g, drop_key);
    if (!s && v->key && v->arr) s = kiln_gguf_writer_set_arr(w, v->key, KILN_GGUF_INT32, v->arr, (uint64_t)v->n);
    else if (!s && v->key) s = v->str ? kiln_gguf_writer_set_str(w, v->key, v->str) : kiln_gguf_writer_set_f32(w, v->key, v->f);
    for (int64_t i = 0; !s && i < kiln_gguf_n_tensors(g); i++) {
        const kiln_tensor_view *t = kiln_gguf_tensor_at(g, i);
        if ((v->drop_tensor && strcmp(t->name, v->drop_tensor) == 0) || (v->tensor && strcmp(t->name, v->tensor) == 0)) continue;
        s = kiln_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data);
    }
    if (!s && v->tensor) s = kiln_gguf_writer_add_tensor(w, v->tensor, KILN_TYPE_F32, 1, (int64_t[4]){v->nv, 1, 1, 1}, v->vals);
    if (!s) s = kiln_gguf_writer_write_file(w, out);
    kiln_gguf_writer_free(w);
    kiln_gguf_close(g);
    dropped_key = NULL;
    *m = NULL;
    return s ? s : kiln_model_load(out, m);
}

static void test_rope_rejects(void) {
    static const float four[4] = {1, 2, 3, 4}, zero[8] = {1, 2, 0, 4, 5, 6, 7, 8}, ok8[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    static const int32_t both[2] = {0, 1};
    const struct {
        variant v;
        kiln_status want;
        const char *msg;
    } cases[] = {
        {{.src = "rope_linear", .drop_key = "llama.rope.scaling.type", .key = "llama.rope.scaling.type", .str = "dynamic"},
         KILN_ERR_UNSUPPORTED, "llama.rope.scaling.type is 'dynamic'; kiln supports none, linear, yarn, longrope, llama3"},
        {{.src = "rope_linear", .drop_key = "llama.rope.scaling.factor", .key = "llama.rope.scaling.factor", .f = NAN},
         KILN_ERR_FORMAT, "key 'llama.rope.scaling.factor' is nan; it must be finite and not negative"},
        {{.src = "rope_linear", .key = "llama.rope.scaling.yarn_log_multiplier", .f = 0.1f}, KILN_ERR_UNSUPPORTED,
         "llama.rope.scaling.yarn_log_multiplier is 0.1; kiln does not support it"},
        {{.src = "rope_yarn", .drop_key = "qwen2.rope.scaling.original_context_length",
          .key = "qwen2.rope.scaling.original_context_length", .f = 32.0f},
         KILN_ERR_FORMAT, "original_context_length"}, /* a float where an integer belongs */
        {{.src = "rope_freqs", .tensor = "rope_freqs.weight", .vals = four, .nv = 4}, KILN_ERR_FORMAT,
         "tensor 'rope_freqs.weight' is f32 [4], expected f32 [8] (rope_dim / 2)"},
        {{.src = "rope_freqs", .tensor = "rope_freqs.weight", .vals = zero, .nv = 8}, KILN_ERR_FORMAT,
         "tensor 'rope_freqs.weight' element 2 is 0; a frequency factor must be finite and positive"},
        {{.src = "rope_longrope", .drop_tensor = "rope_factors_short.weight"}, KILN_ERR_FORMAT,
         "LongRoPE needs both rope_factors_long.weight and rope_factors_short.weight"},
        {{.src = "rope_longrope", .tensor = "rope_factors_long.weight", .vals = four, .nv = 4}, KILN_ERR_FORMAT,
         "tensor 'rope_factors_long.weight' is f32 [4], expected f32 [8]"},
        {{.src = "rope_longrope", .drop_tensor = "rope_factors_short.weight", .tensor = "rope_factors_long.weight", .vals = ok8,
          .nv = 8, .drop_key = "x"}, KILN_ERR_FORMAT, "LongRoPE needs both"},
        {{.src = "rope_linear", .key = "llama.attention.nope_layers", .arr = both, .n = 2}, KILN_ERR_UNSUPPORTED,
         "RoPE scaling is set but every layer is NoPE"},
    };
    char out[64];
    snprintf(out, sizeof out, "/tmp/kiln_test_rope_%d.gguf", (int)getpid());
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kiln_model *m;
        const kiln_status st = load_variant(&cases[i].v, out, &m);
        const bool ok = st == cases[i].want && !m && strstr(kiln_last_error(), cases[i].msg);
        kiln_model_free(m);
        CHECK(ok, "case %zu: status %d, '%s' (want %d, '%s')", i, st, kiln_last_error(), cases[i].want, cases[i].msg);
    }
    /* the same edits made harmless load: the copy itself is sound */
    kiln_model *m;
    const variant fine = {.src = "rope_longrope", .key = "llama.rope.scaling.attn_factor", .f = 1.5f};
    CHECK(load_variant(&fine, out, &m) == KILN_OK && m->layers[0].rope.mscale == 1.5f, "%s", kiln_last_error());
    kiln_model_free(m);
    /* llama.cpp's rope.freq_base_swa sets gemma3's sliding layers' base (10000 without it) */
    const variant swa = {.src = "rope_gemma3", .key = "gemma3.rope.freq_base_swa", .f = 2000.0f};
    CHECK(load_variant(&swa, out, &m) == KILN_OK && m->layers[0].rope_base == 2000.0f && m->layers[1].rope_base == 1e6f, "%s",
          kiln_last_error());
    kiln_model_free(m);
    unlink(out);
}

/* What a trainer's export writes (kiln_rope_write_config) reads back as the same tables: each fixture without its
 * rope.scaling.* keys, written again from its config. */
static bool not_scaling(const char *k) { return strstr(k, ".rope.scaling.") != NULL; }

static void test_rope_write_config(void) {
    const char *names[][2] = {{"rope_linear", "llama"}, {"rope_yarn", "qwen2"}, {"rope_llama3", "llama"}};
    char out[64];
    snprintf(out, sizeof out, "/tmp/kiln_test_rope_w%d.gguf", (int)getpid());
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char in[128];
        snprintf(in, sizeof in, "tests/ref/%s.gguf", names[i][0]);
        kiln_model *a = NULL, *b = NULL;
        kiln_gguf_writer *w = NULL;
        kiln_status s = kiln_model_load(in, &a);
        if (!s) s = kiln_gguf_writer_new(&w);
        if (!s) s = kiln_gguf_writer_copy_kv(w, a->gguf, not_scaling);
        if (!s) s = kiln_rope_write_config(w, names[i][1], &a->cfg.rope_scaling);
        for (int64_t t = 0; !s && t < kiln_gguf_n_tensors(a->gguf); t++) {
            const kiln_tensor_view *v = kiln_gguf_tensor_at(a->gguf, t);
            s = kiln_gguf_writer_add_tensor(w, v->name, v->type, v->n_dims, v->ne, v->data);
        }
        if (!s) s = kiln_gguf_writer_write_file(w, out);
        if (!s) s = kiln_model_load(out, &b);
        bool same = !s;
        for (int64_t l = 0; same && l < a->cfg.n_layer; l++) {
            const kiln_rope *ra = &a->layers[l].rope, *rb = &b->layers[l].rope;
            same = ra->mscale == rb->mscale && !ra->freq == !rb->freq &&
                   (!ra->freq || memcmp(ra->freq, rb->freq, sizeof(float) * (size_t)(a->cfg.rope_dim / 2)) == 0);
        }
        kiln_gguf_writer_free(w);
        kiln_model_free(a);
        kiln_model_free(b);
        CHECK(!s, "%s: %s", names[i][0], kiln_last_error());
        CHECK(same, "%s: the written config gives other tables", names[i][0]);
    }
    unlink(out);
}

/* ---------------------------------------------------------------- the op */

/* rope_forward with a table against the double formula on the float recurrence's angles (the documented definition:
 * theta_i = fl(p * fl(base^(-2/d))^i) by repeated float products, times freq[i] in float, then cos, sin and mscale
 * in double); bound 2e-6 on |x| < 1 (cosf/sinf and the products, a few ulps; measured below). freq NULL and mscale 1 equal
 * a table of ones bit for bit, and the backward is the transpose: <R x, y> = <x, R^T y>. */
static void test_rope_op(void) {
    enum { T = 6, NHEAD = 3, HS = 24 };
    unsigned long long rng = 4242;
    kiln_ops_ctx ctx = {.pool = NULL, .scratch = NULL, .scratch_bytes = 0};
    const int32_t pos[T] = {0, 1, 31, 32, 1000, 5000};
    for (int neox = 0; neox < 2; neox++)
        for (int partial = 0; partial < 2; partial++) {
            const int64_t d = partial ? 16 : HS, half = d / 2;
            const float base = 10000.0f, mscale = 1.2f;
            float freq[HS / 2], ones[HS / 2], x[T * NHEAD * HS], y[T * NHEAD * HS], a[T * NHEAD * HS], b[T * NHEAD * HS];
            for (int64_t i = 0; i < half; i++) freq[i] = 0.1f + 0.9f * (test_rng_f32(&rng) + 1) / 2, ones[i] = 1.0f;
            for (int i = 0; i < T * NHEAD * HS; i++) x[i] = test_rng_f32(&rng), y[i] = test_rng_f32(&rng);
            memcpy(a, x, sizeof x);
            kiln_cpu_ops.rope_forward(&ctx, a, pos, T, NHEAD, HS, d, base, freq, mscale, neox);
            double err = 0;
            const float ts = powf(base, -2.0f / (float)d);
            for (int t = 0; t < T; t++) {
                float th = (float)pos[t];
                for (int64_t i = 0; i < half; i++, th *= ts) {
                    const double ang = (double)(th * freq[i]), c = mscale * cos(ang), s = mscale * sin(ang);
                    for (int h = 0; h < NHEAD; h++) {
                        const int64_t o = (int64_t)(t * NHEAD + h) * HS, ia = o + (neox ? i : 2 * i), ib = ia + (neox ? half : 1);
                        const double r0 = x[ia] * c - x[ib] * s, r1 = x[ia] * s + x[ib] * c;
                        err = fmax(err, fmax(fabs(a[ia] - r0), fabs(a[ib] - r1)));
                    }
                }
                for (int h = 0; h < NHEAD; h++) /* dims past rope_dim are left alone */
                    for (int64_t i = d; i < HS; i++) {
                        const int64_t o = (int64_t)(t * NHEAD + h) * HS + i;
                        CHECK(a[o] == x[o], "neox %d partial %d: column %lld past rope_dim moved", neox, partial, (long long)i);
                    }
            }
            CHECK(err < 2e-6, "neox %d rope_dim %lld: max error %.3g against the double formula (bound 2e-6)", neox, (long long)d, err);
            /* NULL, 1 and a table of ones: the same bits */
            memcpy(a, x, sizeof x), memcpy(b, x, sizeof x);
            kiln_cpu_ops.rope_forward(&ctx, a, pos, T, NHEAD, HS, d, base, NULL, 1.0f, neox);
            kiln_cpu_ops.rope_forward(&ctx, b, pos, T, NHEAD, HS, d, base, ones, 1.0f, neox);
            CHECK(memcmp(a, b, sizeof a) == 0, "neox %d: a table of ones changed the bits", neox);
            /* the backward is the transpose of the scaled forward */
            memcpy(a, x, sizeof x), memcpy(b, y, sizeof y);
            kiln_cpu_ops.rope_forward(&ctx, a, pos, T, NHEAD, HS, d, base, freq, mscale, neox);
            kiln_cpu_ops.rope_backward(&ctx, b, pos, T, NHEAD, HS, d, base, freq, mscale, neox);
            double lhs = 0, rhs = 0;
            for (int i = 0; i < T * NHEAD * HS; i++) lhs += (double)a[i] * y[i], rhs += (double)x[i] * b[i];
            CHECK(fabs(lhs - rhs) < 1e-4, "neox %d: <R x, y> %.9g != <x, R^T y> %.9g", neox, lhs, rhs);
            printf("# rope op neox %d rope_dim %lld: max error %.2e, transpose gap %.1e\n", neox, (long long)d, err, fabs(lhs - rhs));
        }
}

/* ---------------------------------------------------------------- training */

/* The CPU trainer reads the table: a trainer made from the linear fixture gives the logits of the inference forward
 * (the scaled model's), far from the unscaled model's (ref.logits_none). The trainer keeps k and v in f32, the
 * session in f16: that is the gap allowed (measured below, bound 5e-3). */
static void test_rope_train(void) {
    enum { T = 40 };
    const char *path = "tests/ref/rope_linear.gguf";
    kiln_model *m;
    CHECK(kiln_model_load(path, &m) == KILN_OK, "%s", kiln_last_error());
    kiln_llama_train *tm = NULL;
    kiln_status st = kiln_llama_train_from_model(m, false, &tm);
    if (!st) st = kiln_llama_train_reserve(tm, 1, T, 1);
    if (st) kiln_model_free(m);
    CHECK(st == KILN_OK, "%s", kiln_last_error());
    const bool table = tm->rope_freq && tm->rope_freq[0] == 0.25f && tm->rope_mscale == 1.0f;
    int32_t ids[T];
    kiln_gguf *g = NULL;
    const kiln_gguf_value *tok;
    st = kiln_gguf_open(path, &g);
    if (!st) st = kiln_gguf_get_arr(g, "ref.tokens", KILN_GGUF_INT32, &tok);
    for (int t = 0; !st && t < T; t++) ids[t] = (int32_t)kiln_gguf_arr_i64(tok, (uint64_t)t);
    const kiln_tensor_view *none = st ? NULL : kiln_gguf_find_tensor(g, "ref.logits_none");
    const int64_t V = m->cfg.n_vocab;
    float *logits = malloc(sizeof *logits * (size_t)(T * V));
    kiln_session *s = NULL;
    if (!st) st = kiln_session_new(m, &(kiln_session_params){.n_ctx = 64, .n_threads = 1}, &s);
    if (!st) st = kiln_session_eval(s, ids, T, NULL, logits);
    const float *tl = st ? NULL : kiln_llama_train_logits(tm, &kiln_cpu_ops, NULL, ids);
    double e_scaled = 0, e_none = 0;
    for (int64_t i = 0; tl && none && i < T * V; i++) {
        e_scaled = fmax(e_scaled, fabs((double)tl[i] - logits[i]));
        e_none = fmax(e_none, fabs((double)tl[i] - ((const float *)none->data)[i]));
    }
    kiln_session_free(s);
    free(logits);
    kiln_gguf_close(g);
    kiln_llama_train_free(tm);
    kiln_model_free(m);
    CHECK(st == KILN_OK && none, "%s", kiln_last_error());
    CHECK(table, "the trainer's table is not linear factor 4's");
    CHECK(e_scaled < 5e-3 && e_none > 0.1, "training logits: %.3g from the inference forward (bound 5e-3), %.3g from the "
          "unscaled model's (must exceed 0.1)", e_scaled, e_none);
    printf("# training forward with linear scaling: %.2e from inference, %.2e from the unscaled model\n", e_scaled, e_none);
}

/* ---------------------------------------------------------------- the CLI */

/* stderr and the exit status of `kiln ARGS` (stdout and stdin closed). */
static int run_cli(const char *bin, const char *args, char *out, size_t n) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' %s 2>&1 >/dev/null </dev/null", bin, args);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t got = fread(out, 1, n - 1, p);
    out[got] = 0;
    return pclose(p);
}

/* The flags reach kiln_model_set_rope on generate, perplexity and chat; a bad value is one line naming the flag. */
static void test_rope_cli(void) {
    const char *bin = getenv("KILN_BIN");
    if (!bin || !*bin) SKIP("KILN_BIN is not set (make test sets it)");
    const struct {
        const char *args, *want;
    } cases[] = {
        {"generate -m tests/ref/rope_linear.gguf -n 1 --rope-scaling bogus",
         "kiln: generate: --rope-scaling needs none, linear or yarn, got 'bogus'\n"},
        {"perplexity -m tests/ref/rope_linear.gguf -f /dev/null --yarn-beta-fast nan",
         "kiln: perplexity: --yarn-beta-fast needs a finite number in ["},
        {"chat -m tests/ref/rope_linear.gguf --rope-freq-scale 0", "kiln: chat: --rope-freq-scale needs a finite number"},
        {"chat -m tests/ref/rope_linear.gguf --rope-scaling yarn --yarn-orig-ctx", "kiln: chat: --yarn-orig-ctx needs a value"},
        {"bench -m tests/ref/rope_linear.gguf -p 0 -n 1 -r 1 --rope-scaling linear --rope-freq-scale -2",
         "kiln: bench: --rope-freq-scale needs a finite number"},
        {"bench -m tests/ref/rope_linear.gguf -p 0 -n 1 -r 1 --yarn-ext-factor nan", "--yarn-ext-factor needs a finite number"},
        /* accepted and applied: generate goes on to need a tokenizer, which the fixture lacks */
        {"generate -m tests/ref/rope_linear.gguf -n 1 -p x --rope-scaling yarn --rope-scale 2 --yarn-orig-ctx 16 "
         "--yarn-ext-factor 0.5 --yarn-attn-factor 1 --yarn-beta-slow 1 --yarn-beta-fast 16 --rope-freq-base 900",
         "tokenizer"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char out[2048];
        const int rc = run_cli(bin, cases[i].args, out, sizeof out);
        const bool applied_case = i == sizeof cases / sizeof cases[0] - 1; /* must not fail on a rope flag */
        CHECK(rc != 0 && strstr(out, cases[i].want) && !(applied_case && (strstr(out, "--rope") || strstr(out, "--yarn"))),
              "kiln %s: exit %d, stderr '%s' (want '%s')", cases[i].args, rc, out, cases[i].want);
    }
    /* a whole run with the flags: bench needs no tokenizer */
    char out[4096];
    const char *args = "bench -m tests/ref/rope_linear.gguf -p 8 -n 2 -r 1 -t 1 --json-only --rope-scaling yarn --rope-scale 4 "
                       "--yarn-orig-ctx 16";
    const int rc = run_cli(bin, args, out, sizeof out);
    CHECK(rc == 0, "kiln %s: exit %d, stderr '%s'", args, rc, out);
}

int main(void) {
    RUN(test_rope_op);
    RUN(test_rope_config);
    RUN(test_rope_linear);
    RUN(test_rope_yarn);
    RUN(test_rope_freqs);
    RUN(test_rope_llama3);
    RUN(test_rope_longrope);
    RUN(test_rope_gemma3);
    RUN(test_rope_overrides);
    RUN(test_rope_rejects);
    RUN(test_rope_write_config);
    RUN(test_rope_train);
    RUN(test_rope_cli);
    TEST_EXIT();
}
