/* rope.c: RoPE scaling, as llama.cpp applies it (llama-model.cpp reads the keys, llama-context.cpp resolves the
 * attention factor, ggml's rope_yarn / ggml_rope_yarn_corr_dims turn it into angles). Every kind reduces to one
 * table per layer (kiln_rope in model.h): a multiplier per rotated pair of the unscaled angle, and mscale on cos and
 * sin. The model load builds the tables once; kiln_model_set_rope rebuilds them with llama.cpp's overrides.
 *   linear    freq[i] = freq_scale = 1 / factor
 *   YaRN      freq[i] = freq_scale (1 - mix_i) + mix_i, mix_i = ramp(i) * ext_factor between ggml's correction dims;
 *             mscale = 0.1 ln(factor) + 1 (llama.cpp's get_mscale, times rope.scaling.attn_factor)
 *   factors   freq[i] /= ff_i: rope_freqs.weight (Llama 3.1+), HF's llama3 rule from the keys when the tensor is
 *             absent, or Phi-3's rope_factors_long / _short.weight (long past original_context_length)
 * tests/test_rope.c checks each kind through a model load and a session against tests/ref/rope_ref.py's float64
 * reference, and the refusals. */
#include "model.h"
#include "status.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- metadata */

static const char *rope_key(char *buf, size_t n, const char *arch, const char *suffix) {
    snprintf(buf, n, "%s.rope.%s", arch, suffix);
    return buf;
}

/* An optional f32 key: finite, and positive (or >= 0 where zero means "absent", as llama.cpp's factor). */
static kiln_status rope_f32(const kiln_gguf *g, const char *k, bool zero_ok, float *out) {
    if (!kiln_gguf_find(g, k)) return KILN_OK;
    float v;
    TRY(kiln_gguf_get_f32(g, k, &v));
    if (!isfinite(v) || v < 0 || (!zero_ok && v == 0))
        return kiln_fail(KILN_ERR_FORMAT, "%s: key '%s' is %g; it must be finite and %s", kiln_gguf_path(g), k, (double)v,
                         zero_ok ? "not negative" : "positive");
    *out = v;
    return KILN_OK;
}

/* The scaling types llama.cpp names (LLAMA_ROPE_SCALING_TYPES), and kiln's "llama3" (HF's rope_type). */
static const struct {
    const char *name;
    kiln_rope_kind kind;
} rope_kinds[] = {
    {"none", KILN_ROPE_KIND_NONE}, {"linear", KILN_ROPE_KIND_LINEAR}, {"yarn", KILN_ROPE_KIND_YARN},
    {"longrope", KILN_ROPE_KIND_LONGROPE}, {"llama3", KILN_ROPE_KIND_NONE},
};

kiln_status kiln_rope_read_config(const kiln_gguf *g, const char *arch, kiln_llama_config *c) {
    const char *path = kiln_gguf_path(g);
    kiln_rope_scaling_cfg *sc = &c->rope_scaling;
    char k[128];
    *sc = (kiln_rope_scaling_cfg){.kind = KILN_ROPE_KIND_LINEAR, .freq_scale = 1.0f, .orig_ctx = c->n_ctx_train,
                                  .attn_factor = 1.0f, .ext_factor = -1.0f, .yarn_attn_factor = 1.0f, .beta_fast = 32.0f,
                                  .beta_slow = 1.0f, .low_freq_factor = 1.0f, .high_freq_factor = 4.0f};
    /* llama.cpp's default type is linear: a factor without a type scales linearly */
    if (kiln_gguf_find(g, rope_key(k, sizeof k, arch, "scaling.type"))) {
        kiln_str t;
        TRY(kiln_gguf_get_str(g, k, &t));
        size_t i = 0, n = sizeof rope_kinds / sizeof rope_kinds[0];
        while (i < n && !(t.len == strlen(rope_kinds[i].name) && memcmp(t.ptr, rope_kinds[i].name, t.len) == 0)) i++;
        if (i == n)
            return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: %s is '%.*s'; kiln supports none, linear, yarn, longrope, llama3", path, k,
                             (int)(t.len > 32 ? 32 : t.len), t.ptr);
        sc->kind = rope_kinds[i].kind;
        sc->llama3 = strcmp(rope_kinds[i].name, "llama3") == 0;
    }
    bool have_attn = kiln_gguf_find(g, rope_key(k, sizeof k, arch, "scaling.attn_factor")) != NULL;
    TRY(rope_f32(g, rope_key(k, sizeof k, arch, "scaling.factor"), true, &sc->factor));
    if (sc->factor == 0) TRY(rope_f32(g, rope_key(k, sizeof k, arch, "scale_linear"), true, &sc->factor)); /* the old key */
    TRY(rope_f32(g, rope_key(k, sizeof k, arch, "scaling.attn_factor"), false, &sc->attn_factor));
    TRY(rope_f32(g, rope_key(k, sizeof k, arch, "scaling.yarn_attn_factor"), false, &sc->yarn_attn_factor));
    TRY(rope_f32(g, rope_key(k, sizeof k, arch, "scaling.yarn_beta_fast"), false, &sc->beta_fast));
    TRY(rope_f32(g, rope_key(k, sizeof k, arch, "scaling.yarn_beta_slow"), false, &sc->beta_slow));
    TRY(rope_f32(g, rope_key(k, sizeof k, arch, "scaling.low_freq_factor"), false, &sc->low_freq_factor));
    TRY(rope_f32(g, rope_key(k, sizeof k, arch, "scaling.high_freq_factor"), false, &sc->high_freq_factor));
    if (kiln_gguf_find(g, rope_key(k, sizeof k, arch, "scaling.yarn_ext_factor"))) {
        TRY(kiln_gguf_get_f32(g, k, &sc->ext_factor));
        if (!isfinite(sc->ext_factor) || sc->ext_factor < 0)
            return kiln_fail(KILN_ERR_FORMAT, "%s: key '%s' is %g; it must be finite and not negative", path, k, (double)sc->ext_factor);
    }
    if (kiln_gguf_find(g, rope_key(k, sizeof k, arch, "scaling.original_context_length"))) {
        int64_t v;
        TRY(kiln_gguf_get_i64(g, k, &v));
        if (v <= 0 || v > (1LL << 31))
            return kiln_fail(KILN_ERR_FORMAT, "%s: key '%s' is %lld, outside 1..2^31", path, k, (long long)v);
        sc->orig_ctx = v;
    }
    /* what kiln does not compute is refused, never ignored */
    static const char *const unsupported[] = {"scaling.yarn_log_multiplier", "scaling.alpha"};
    for (size_t i = 0; i < sizeof unsupported / sizeof unsupported[0]; i++) {
        float v = 0;
        if (!kiln_gguf_find(g, rope_key(k, sizeof k, arch, unsupported[i]))) continue;
        TRY(kiln_gguf_get_f32(g, k, &v));
        if (v != 0) return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: %s is %g; kiln does not support it", path, k, (double)v);
    }
    if (kiln_gguf_find(g, rope_key(k, sizeof k, arch, "dimension_sections")))
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: %s (multi-section RoPE) is not supported", path, k);
    /* llama3 and LongRoPE scale through their frequency factors; the angles keep freq_scale 1 */
    const bool scales = (sc->kind == KILN_ROPE_KIND_LINEAR || sc->kind == KILN_ROPE_KIND_YARN) && !sc->llama3;
    sc->freq_scale = scales && sc->factor > 0 ? 1.0f / sc->factor : 1.0f;
    if (sc->llama3 && sc->low_freq_factor >= sc->high_freq_factor)
        return kiln_fail(KILN_ERR_FORMAT, "%s: llama3 RoPE needs low_freq_factor %g below high_freq_factor %g", path,
                         (double)sc->low_freq_factor, (double)sc->high_freq_factor);
    if (sc->kind == KILN_ROPE_KIND_LONGROPE && !have_attn) { /* Phi-3's converter: sqrt(1 + ln s / ln orig) */
        const double s = (double)c->n_ctx_train / (double)sc->orig_ctx;
        sc->attn_factor = s > 1 && sc->orig_ctx > 1 ? (float)sqrt(1 + log(s) / log((double)sc->orig_ctx)) : 1.0f;
    }
    return KILN_OK;
}

/* ---------------------------------------------------------------- tables */

/* ggml_rope_yarn_corr_dims, in ggml's float arithmetic: the pairs below dims[0] keep their extrapolated angle, those
 * past dims[1] are interpolated, a linear ramp between. */
static void yarn_corr_dims(int64_t n_dims, int64_t n_ctx_orig, float base, float beta_fast, float beta_slow, float dims[2]) {
    const float pi = 3.14159265358979323846f;
    const float lo = (float)n_dims * logf((float)n_ctx_orig / (beta_fast * 2 * pi)) / (2 * logf(base));
    const float hi = (float)n_dims * logf((float)n_ctx_orig / (beta_slow * 2 * pi)) / (2 * logf(base));
    const float start = floorf(lo), end = ceilf(hi);
    dims[0] = start > 0 ? start : 0;
    dims[1] = end < (float)(n_dims - 1) ? end : (float)(n_dims - 1);
}

/* ggml's rope_yarn_ramp for pair i (ggml's i0 / 2). */
static float yarn_ramp(float low, float high, int64_t i) {
    const float d = high - low > 0.001f ? high - low : 0.001f;
    const float y = ((float)i - low) / d;
    return 1 - (y < 0 ? 0 : y > 1 ? 1 : y);
}

static float resolved_ext_factor(const kiln_rope_scaling_cfg *sc) {
    return sc->ext_factor >= 0 ? sc->ext_factor : sc->kind == KILN_ROPE_KIND_YARN ? 1.0f : 0.0f;
}

void kiln_rope_table(const kiln_rope_scaling_cfg *sc, int64_t rope_dim, float base, float fs, const float *ff, float *freq,
                     float *mscale) {
    /* a zeroed config (one built by hand, training's) is the unscaled rotation */
    const float ext = resolved_ext_factor(sc), fs_glob = sc->freq_scale > 0 ? sc->freq_scale : 1.0f;
    if (!(fs > 0)) fs = 1.0f;
    float dims[2] = {0, 0};
    if (ext != 0) yarn_corr_dims(rope_dim, sc->orig_ctx, base, sc->beta_fast, sc->beta_slow, dims);
    for (int64_t i = 0; i < rope_dim / 2; i++) {
        const float mix = ext != 0 ? yarn_ramp(dims[0], dims[1], i) * ext : 0.0f;
        const float f = ext != 0 ? fs * (1 - mix) + mix : fs;
        freq[i] = ff ? f / ff[i] : f;
    }
    /* llama-context.cpp: with YaRN the attention factor is get_mscale(1 / freq_scale) = 0.1 ln(factor) + 1, divided
     * by the 1 + 0.1 ln(1 / fs) that ggml's rope_yarn multiplies back per layer; then rope.scaling.attn_factor */
    float attn = sc->yarn_attn_factor > 0 ? sc->yarn_attn_factor : 1.0f;
    if (ext != 0) {
        const float factor = 1.0f / fs_glob;
        attn = (factor <= 1.0f ? 1.0f : 0.1f * logf(factor) + 1.0f) * (1.0f / (1.0f + 0.1f * logf(factor)));
        attn *= 1.0f + 0.1f * logf(1.0f / fs);
    }
    *mscale = sc->attn_factor > 0 ? attn * sc->attn_factor : attn;
}

/* HF's llama3 rope_type (transformers' _compute_llama3_parameters, llama.cpp's converter writes the same as
 * rope_freqs.weight): wavelengths shorter than orig / high_freq_factor keep their frequency, longer than
 * orig / low_freq_factor are divided by factor, a smooth blend between. ff_i is the divisor. */
static void llama3_factors(const kiln_rope_scaling_cfg *sc, int64_t rope_dim, float base, float *ff) {
    const double factor = sc->factor > 0 ? sc->factor : 8.0, orig = (double)sc->orig_ctx;
    const double lo_wl = orig / sc->low_freq_factor, hi_wl = orig / sc->high_freq_factor;
    for (int64_t i = 0; i < rope_dim / 2; i++) {
        const double freq = 1.0 / pow((double)base, (double)(2 * i) / (double)rope_dim), wl = 2 * M_PI / freq;
        if (wl < hi_wl) ff[i] = 1.0f;
        else if (wl > lo_wl) ff[i] = (float)factor;
        else {
            const double smooth = (orig / wl - sc->low_freq_factor) / (sc->high_freq_factor - sc->low_freq_factor);
            ff[i] = (float)(1.0 / ((1 - smooth) / factor + smooth));
        }
    }
}

/* A frequency-factor tensor: (rope_dim / 2) f32, every factor finite and positive (each divides a frequency). */
static kiln_status factor_tensor(const kiln_model *m, const char *name, const float **out) {
    const kiln_tensor_view *t = kiln_gguf_find_tensor(m->gguf, name);
    const char *path = kiln_gguf_path(m->gguf);
    const int64_t half = m->cfg.rope_dim / 2;
    *out = NULL;
    if (!t) return KILN_OK;
    if (t->type != KILN_TYPE_F32 || t->n_dims != 1 || t->ne[0] != half)
        return kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s' is %s [%lld], expected f32 [%lld] (rope_dim / 2)", path, name,
                         kiln_type_name(t->type), (long long)t->ne[0], (long long)half);
    const float *f = t->data;
    for (int64_t i = 0; i < half; i++)
        if (!isfinite(f[i]) || !(f[i] > 0))
            return kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s' element %lld is %g; a frequency factor must be finite and positive",
                             path, name, (long long)i, (double)f[i]);
    *out = f;
    return KILN_OK;
}

/* Whether a table is the unscaled rotation (every multiplier 1, mscale 1): then the layer keeps freq NULL. */
static bool is_identity(const float *freq, int64_t half, float mscale) {
    for (int64_t i = 0; i < half; i++)
        if (freq[i] != 1.0f) return false;
    return mscale == 1.0f;
}

kiln_status kiln_rope_build_model(kiln_model *m) {
    const kiln_llama_config *c = &m->cfg;
    const kiln_rope_scaling_cfg *sc = &c->rope_scaling;
    const char *path = kiln_gguf_path(m->gguf);
    const int64_t half = c->rope_dim / 2, L = c->n_layer;
    const float *freqs, *lng, *shrt;
    TRY(factor_tensor(m, "rope_freqs.weight", &freqs));
    TRY(factor_tensor(m, "rope_factors_long.weight", &lng));
    TRY(factor_tensor(m, "rope_factors_short.weight", &shrt));
    if (!freqs && (!lng != !shrt))
        return kiln_fail(KILN_ERR_FORMAT, "%s: LongRoPE needs both rope_factors_long.weight and rope_factors_short.weight", path);
    if (sc->kind == KILN_ROPE_KIND_LONGROPE && !freqs && !lng)
        return kiln_fail(KILN_ERR_FORMAT, "%s: rope.scaling.type is longrope but the file has no rope_factors_long.weight", path);
    bool all_nope = true;
    for (int64_t l = 0; l < L; l++) all_nope &= m->layers[l].nope;

    /* (2, L, half): each layer's table, then its long one; a float buffer of 2 L rope_dim / 2, small next to any weight */
    float *tab = malloc(sizeof *tab * (size_t)(2 * L * (half > 0 ? half : 1)));
    float *ff = malloc(sizeof *ff * (size_t)(half > 0 ? half : 1));
    if (!tab || !ff) {
        free(tab), free(ff);
        return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    }
    bool scaled = false;
    kiln_rope *rope = malloc(sizeof *rope * (size_t)(2 * L));
    if (!rope) {
        free(tab), free(ff);
        return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    }
    for (int64_t l = 0; l < L; l++) {
        const kiln_llama_layer *Ly = &m->layers[l];
        const float base = Ly->rope_base > 0 ? Ly->rope_base : c->rope_base;
        const float fs = sc->swa_unscaled && Ly->window ? 1.0f : sc->freq_scale;
        const float *f0 = freqs ? freqs : lng ? shrt : NULL;
        if (!f0 && sc->llama3) llama3_factors(sc, c->rope_dim, base, ff), f0 = ff;
        for (int j = 0; j < 2; j++) {
            float *t = tab + ((size_t)j * (size_t)L + (size_t)l) * (size_t)half;
            kiln_rope *r = &rope[j * L + l];
            if (j == 1 && (freqs || !lng)) { /* no long factors */
                *r = (kiln_rope){NULL, 1.0f};
                continue;
            }
            kiln_rope_table(sc, c->rope_dim, base, fs, j ? lng : f0, t, &r->mscale);
            const bool id = is_identity(t, half, r->mscale);
            r->freq = id ? NULL : t;
            scaled |= !id;
        }
    }
    free(ff);
    if (scaled && all_nope) {
        free(tab), free(rope);
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: RoPE scaling is set but every layer is NoPE (no RoPE to scale)", path);
    }
    for (int64_t l = 0; l < L; l++) m->layers[l].rope = rope[l], m->layers[l].rope_long = rope[L + l];
    free(rope);
    free(m->rope_freq);
    m->rope_freq = scaled ? tab : NULL;
    if (!scaled) free(tab);
    return KILN_OK;
}

kiln_rope kiln_llama_layer_rope(const kiln_model *m, int64_t l, int64_t n_ctx) {
    const kiln_llama_layer *L = &m->layers[l];
    return L->rope_long.freq && n_ctx > m->cfg.rope_scaling.orig_ctx ? L->rope_long : L->rope;
}

kiln_status kiln_rope_config_table(const kiln_llama_config *c, float **freq, float *mscale) {
    const int64_t half = c->rope_dim / 2;
    float *t = malloc(sizeof *t * (size_t)(half > 0 ? half : 1)), *ff = NULL;
    if (!t) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    if (c->rope_scaling.llama3 && !(ff = malloc(sizeof *ff * (size_t)(half > 0 ? half : 1)))) {
        free(t);
        return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    }
    if (ff) llama3_factors(&c->rope_scaling, c->rope_dim, c->rope_base, ff);
    kiln_rope_table(&c->rope_scaling, c->rope_dim, c->rope_base, c->rope_scaling.freq_scale, ff, t, mscale);
    free(ff);
    if (is_identity(t, half, *mscale)) free(t), t = NULL;
    *freq = t;
    return KILN_OK;
}

kiln_status kiln_rope_write_config(kiln_gguf_writer *w, const char *arch, const kiln_rope_scaling_cfg *sc) {
    char k[128];
    const char *type = sc->llama3 ? "llama3" : NULL;
    for (size_t i = 0; !type && i < sizeof rope_kinds / sizeof rope_kinds[0]; i++)
        if (rope_kinds[i].kind == sc->kind) type = rope_kinds[i].name;
    const bool scaled = sc->llama3 || (sc->freq_scale > 0 && sc->freq_scale != 1.0f) || sc->kind == KILN_ROPE_KIND_YARN;
    if (!scaled && sc->kind != KILN_ROPE_KIND_LONGROPE && !(sc->attn_factor > 0 && sc->attn_factor != 1.0f)) return KILN_OK;
    if (sc->kind == KILN_ROPE_KIND_LONGROPE)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "LongRoPE's factor tensors cannot be written with the config alone");
    TRY(kiln_gguf_writer_set_str(w, rope_key(k, sizeof k, arch, "scaling.type"), type));
    const float factor = sc->llama3 ? sc->factor : sc->freq_scale > 0 ? 1.0f / sc->freq_scale : 1.0f;
    TRY(kiln_gguf_writer_set_f32(w, rope_key(k, sizeof k, arch, "scaling.factor"), factor));
    TRY(kiln_gguf_writer_set_u32(w, rope_key(k, sizeof k, arch, "scaling.original_context_length"), (uint32_t)sc->orig_ctx));
    if (sc->attn_factor > 0 && sc->attn_factor != 1.0f)
        TRY(kiln_gguf_writer_set_f32(w, rope_key(k, sizeof k, arch, "scaling.attn_factor"), sc->attn_factor));
    if (sc->llama3) {
        TRY(kiln_gguf_writer_set_f32(w, rope_key(k, sizeof k, arch, "scaling.low_freq_factor"), sc->low_freq_factor));
        TRY(kiln_gguf_writer_set_f32(w, rope_key(k, sizeof k, arch, "scaling.high_freq_factor"), sc->high_freq_factor));
    }
    if (sc->kind != KILN_ROPE_KIND_YARN) return KILN_OK;
    if (sc->ext_factor >= 0) TRY(kiln_gguf_writer_set_f32(w, rope_key(k, sizeof k, arch, "scaling.yarn_ext_factor"), sc->ext_factor));
    TRY(kiln_gguf_writer_set_f32(w, rope_key(k, sizeof k, arch, "scaling.yarn_attn_factor"),
                                 sc->yarn_attn_factor > 0 ? sc->yarn_attn_factor : 1.0f));
    TRY(kiln_gguf_writer_set_f32(w, rope_key(k, sizeof k, arch, "scaling.yarn_beta_fast"), sc->beta_fast));
    TRY(kiln_gguf_writer_set_f32(w, rope_key(k, sizeof k, arch, "scaling.yarn_beta_slow"), sc->beta_slow));
    return KILN_OK;
}

/* ---------------------------------------------------------------- overrides */

kiln_rope_overrides kiln_rope_overrides_default(void) {
    return (kiln_rope_overrides){.type = KILN_ROPE_SCALING_UNSET, .yarn_ext_factor = -1.0f, .yarn_attn_factor = -1.0f,
                                 .yarn_beta_slow = -1.0f, .yarn_beta_fast = -1.0f};
}

/* An override that is unset (negative) or finite and, when positive_only, above 0. */
static kiln_status check_opt(const char *field, float v, bool positive) {
    if (isnan(v) || isinf(v) || (v >= 0 && positive && v == 0))
        return kiln_fail(KILN_ERR_INVALID, "rope overrides: %s is %g; it must be finite%s (negative: unset)", field, (double)v,
                         positive ? " and positive" : "");
    return KILN_OK;
}

kiln_status kiln_model_set_rope(kiln_model *m, const kiln_rope_overrides *ov) {
    if (!m || !ov) return kiln_fail(KILN_ERR_INVALID, "rope overrides: no model or no overrides");
    if (ov->type < KILN_ROPE_SCALING_UNSET || ov->type > KILN_ROPE_SCALING_YARN)
        return kiln_fail(KILN_ERR_INVALID, "rope overrides: type %d is not none, linear or yarn", (int)ov->type);
    if (!isfinite(ov->freq_base) || ov->freq_base < 0 || !isfinite(ov->freq_scale) || ov->freq_scale < 0)
        return kiln_fail(KILN_ERR_INVALID, "rope overrides: freq_base %g and freq_scale %g must be finite and positive (0: unset)",
                         (double)ov->freq_base, (double)ov->freq_scale);
    if (ov->yarn_orig_ctx < 0 || ov->yarn_orig_ctx > (1LL << 31))
        return kiln_fail(KILN_ERR_INVALID, "rope overrides: yarn_orig_ctx %lld is outside 0..2^31", (long long)ov->yarn_orig_ctx);
    TRY(check_opt("yarn_ext_factor", ov->yarn_ext_factor, false));
    TRY(check_opt("yarn_attn_factor", ov->yarn_attn_factor, true));
    TRY(check_opt("yarn_beta_slow", ov->yarn_beta_slow, true));
    TRY(check_opt("yarn_beta_fast", ov->yarn_beta_fast, true));

    /* llama-context.cpp's order: each set field replaces the file's, then type none forces freq_scale 1 */
    kiln_llama_config *c = &m->cfg;
    const kiln_llama_config saved = *c;
    float *saved_base = malloc(sizeof *saved_base * (size_t)c->n_layer);
    if (!saved_base) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    kiln_rope_scaling_cfg *sc = &c->rope_scaling;
    static const kiln_rope_kind kinds[] = {KILN_ROPE_KIND_NONE, KILN_ROPE_KIND_NONE, KILN_ROPE_KIND_LINEAR, KILN_ROPE_KIND_YARN};
    /* the frequency factors (tensors, or llama3's keys) stay under any type, as llama.cpp applies them */
    if (ov->type != KILN_ROPE_SCALING_UNSET) sc->kind = kinds[ov->type];
    if (ov->freq_scale > 0) sc->freq_scale = ov->freq_scale;
    if (ov->type == KILN_ROPE_SCALING_NONE) sc->freq_scale = 1.0f;
    if (ov->yarn_orig_ctx > 0) sc->orig_ctx = ov->yarn_orig_ctx;
    if (ov->yarn_ext_factor >= 0) sc->ext_factor = ov->yarn_ext_factor;
    if (ov->yarn_attn_factor >= 0) sc->yarn_attn_factor = ov->yarn_attn_factor;
    if (ov->yarn_beta_slow > 0) sc->beta_slow = ov->yarn_beta_slow;
    if (ov->yarn_beta_fast > 0) sc->beta_fast = ov->yarn_beta_fast;
    for (int64_t l = 0; l < c->n_layer; l++) saved_base[l] = m->layers[l].rope_base;
    if (ov->freq_base > 0) { /* the global layers' base; a sliding layer's own base stays (llama.cpp's freq_base_swa) */
        c->rope_base = ov->freq_base;
        for (int64_t l = 0; l < c->n_layer; l++)
            if (!(m->layers[l].window && c->rope_base_local > 0)) m->layers[l].rope_base = ov->freq_base;
    }
    kiln_status s = kiln_rope_build_model(m);
    if (s) {
        *c = saved;
        for (int64_t l = 0; l < c->n_layer; l++) m->layers[l].rope_base = saved_base[l];
    }
    free(saved_base);
    return s;
}
