/* checkpoint.c: a trainer's state to and from GGUF. The weights go out as a standard llama GGUF (F32, llama names,
 * the tokenizer's keys), so `kiln generate` and any GGUF reader load the export; a checkpoint adds the optimizer's
 * moments as flat tensors and the run's position as train.* keys:
 *   keys    train.step, train.tokens_seen, train.data_pos, train.seed, train.B, train.T, train.world, train.mixed,
 *           train.n_embed_skipped, train.optim ("adamw" or "adamw8bit"), train.optim_step, train.n_skipped
 *   tensors optim.m, optim.v (F32, n_params) for AdamW, or optim.m8, optim.v8 (I8, n_params) and
 *           optim.m_scale, optim.v_scale (F32, one per 256) for 8-bit AdamW
 * After the random init nothing in a run is random (no dropout; batches are read in order), so the step, the data
 * position and the optimizer state are the whole state: a resumed run repeats the uninterrupted one. kiln generate
 * loads a checkpoint as it is (it binds the weights by name and ignores the rest).
 *
 * Both directions stream through the trainer's get_state and set_state (src/train/trainer.h) in chunks of
 * KILN_TRAIN_CHUNK floats, so no n_params-sized host array is needed where the trainer keeps none (the GPU); a
 * resume reads the file's mmap straight into the trainer. Writes go through the GGUF writer's temp file + fsync +
 * rename, so a write killed halfway leaves the previous checkpoint in place. Nothing non-finite goes out or comes
 * in: a write with a non-finite weight or moment fails before the rename, and a resume refuses non-finite weights,
 * moments that are not finite (or second moments and scales below 0) and run keys out of range.
 * tests/test_train.c resumes bit for bit, kills a write with SIGKILL mid-way and feeds damaged checkpoints;
 * tests/fuzz/fuzz_checkpoint.c fuzzes the loader. */
#include "trainer.h"
#include "status.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool not_tokenizer_key(const char *key) { return strncmp(key, "tokenizer.", 10) != 0; }

static bool is_token_array(const char *key) {
    return strcmp(key, "tokenizer.ggml.tokens") == 0 || strcmp(key, "tokenizer.ggml.scores") == 0 ||
           strcmp(key, "tokenizer.ggml.token_type") == 0;
}
static bool not_tokenizer_or_token_array(const char *key) { return not_tokenizer_key(key) || is_token_array(key); }

/* tok_src's tokenizer keys. A vocabulary shorter than the model's n_vocab rows (kiln train -V padding the table, as
 * llm.c pads 50257 to 50304) is padded the way llama.cpp's converters pad one: tokens "[PAD<id>]" of type UNUSED (5)
 * and score -1000, which no tokenization produces, so the file loads wherever the token count must equal the
 * embedding's rows (kiln's model loader and llama.cpp's). */
static kiln_status put_tokenizer(kiln_gguf_writer *w, const kiln_gguf *g, int64_t n_vocab) {
    const kiln_gguf_value *tokens = kiln_gguf_find(g, "tokenizer.ggml.tokens");
    if (!tokens || tokens->type != KILN_GGUF_ARRAY || tokens->arr.type != KILN_GGUF_STRING || !tokens->arr.items ||
        (int64_t)tokens->arr.n >= n_vocab)
        return kiln_gguf_writer_copy_kv(w, g, not_tokenizer_key);
    const uint64_t n = tokens->arr.n, nv = (uint64_t)n_vocab;
    const kiln_gguf_value *scores = kiln_gguf_find(g, "tokenizer.ggml.scores"), *types = kiln_gguf_find(g, "tokenizer.ggml.token_type");
    kiln_gguf_value *items = calloc(nv, sizeof *items);
    char *pads = calloc(nv - n, 24);
    float *sc = malloc(nv * sizeof *sc);
    int32_t *ty = malloc(nv * sizeof *ty);
    kiln_status s = items && pads && sc && ty ? KILN_OK : kiln_fail(KILN_ERR_NOMEM, "out of memory for the padded tokenizer");
    for (uint64_t i = 0; !s && i < nv; i++) {
        if (i < n) {
            items[i] = tokens->arr.items[i];
        } else {
            char *p = pads + (i - n) * 24;
            int len = snprintf(p, 24, "[PAD%llu]", (unsigned long long)i);
            items[i] = (kiln_gguf_value){.type = KILN_GGUF_STRING, .str = {p, (uint64_t)len}};
        }
        bool have_score = scores && scores->type == KILN_GGUF_ARRAY && i < scores->arr.n;
        bool have_type = types && types->type == KILN_GGUF_ARRAY && i < types->arr.n;
        sc[i] = i < n ? (have_score ? (float)kiln_gguf_arr_f64(scores, i) : 0.0f) : -1000.0f;
        ty[i] = i < n ? (have_type ? (int32_t)kiln_gguf_arr_i64(types, i) : 1) : 5;
    }
    if (!s) s = kiln_gguf_writer_copy_kv(w, g, not_tokenizer_or_token_array);
    if (!s) {
        kiln_gguf_value v = {.type = KILN_GGUF_ARRAY, .arr = {.type = KILN_GGUF_STRING, .n = nv, .items = items}};
        s = kiln_gguf_writer_set(w, "tokenizer.ggml.tokens", &v);
    }
    if (!s && scores) s = kiln_gguf_writer_set_arr(w, "tokenizer.ggml.scores", KILN_GGUF_FLOAT32, sc, nv);
    if (!s) s = kiln_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", KILN_GGUF_INT32, ty, nv);
    free(items), free(pads), free(sc), free(ty);
    return s;
}

/* One tensor of the file: a range of a state part. */
typedef struct ckpt_tensor {
    const char *name;
    kiln_type type;
    int n_dims;
    int64_t ne[2];
    kiln_train_part part;
    int64_t first; /* element of the part where the tensor starts */
} ckpt_tensor;

/* The file's tensors in order: the weights, then (with optim) the optimizer's. *n gets their number. */
static ckpt_tensor *file_tensors(const kiln_llama_train *m, bool optim, bool eight_bit, int *n) {
    ckpt_tensor *ts = calloc((size_t)m->n_tensors + 4, sizeof *ts);
    if (!ts) return NULL;
    int k = 0;
    for (int i = 0; i < m->n_tensors; i++) {
        const kiln_train_tensor *t = &m->tensors[i];
        ts[k++] = (ckpt_tensor){t->name, KILN_TYPE_F32, t->n_dims, {t->ne[0], t->ne[1]}, KILN_PART_PARAMS, t->offset};
    }
    const int64_t np = m->n_params, nb = (np + KILN_ADAMW8_BLOCK - 1) / KILN_ADAMW8_BLOCK;
    if (optim && eight_bit) {
        ts[k++] = (ckpt_tensor){"optim.m8", KILN_TYPE_I8, 1, {np, 1}, KILN_PART_M8, 0};
        ts[k++] = (ckpt_tensor){"optim.v8", KILN_TYPE_I8, 1, {np, 1}, KILN_PART_V8, 0};
        ts[k++] = (ckpt_tensor){"optim.m_scale", KILN_TYPE_F32, 1, {nb, 1}, KILN_PART_M_SCALE, 0};
        ts[k++] = (ckpt_tensor){"optim.v_scale", KILN_TYPE_F32, 1, {nb, 1}, KILN_PART_V_SCALE, 0};
    } else if (optim) {
        ts[k++] = (ckpt_tensor){"optim.m", KILN_TYPE_F32, 1, {np, 1}, KILN_PART_M, 0};
        ts[k++] = (ckpt_tensor){"optim.v", KILN_TYPE_F32, 1, {np, 1}, KILN_PART_V, 0};
    }
    *n = k;
    return ts;
}

static kiln_status put_keys(kiln_gguf_writer *w, const kiln_trainer_impl *t, const kiln_gguf *tok_src, const char *name,
                            const kiln_train_state *st, const kiln_train_counters *cn) {
    const kiln_llama_config *c = &t->m->cfg;
    TRY(kiln_gguf_writer_set_str(w, "general.architecture", "llama"));
    TRY(kiln_gguf_writer_set_str(w, "general.name", name ? name : "kiln"));
    TRY(kiln_gguf_writer_set_u32(w, "general.file_type", 0)); /* all F32 */
    TRY(kiln_gguf_writer_set_u32(w, "llama.context_length", (uint32_t)c->n_ctx_train));
    TRY(kiln_gguf_writer_set_u32(w, "llama.embedding_length", (uint32_t)c->n_embd));
    TRY(kiln_gguf_writer_set_u32(w, "llama.block_count", (uint32_t)c->n_layer));
    TRY(kiln_gguf_writer_set_u32(w, "llama.feed_forward_length", (uint32_t)c->n_ff));
    TRY(kiln_gguf_writer_set_u32(w, "llama.attention.head_count", (uint32_t)c->n_head));
    TRY(kiln_gguf_writer_set_u32(w, "llama.attention.head_count_kv", (uint32_t)c->n_head_kv));
    TRY(kiln_gguf_writer_set_u32(w, "llama.rope.dimension_count", (uint32_t)c->rope_dim));
    TRY(kiln_gguf_writer_set_f32(w, "llama.rope.freq_base", c->rope_base));
    TRY(kiln_rope_write_config(w, "llama", &c->rope_scaling));
    TRY(kiln_gguf_writer_set_f32(w, "llama.attention.layer_norm_rms_epsilon", c->rms_eps));
    TRY(kiln_gguf_writer_set_u32(w, "llama.vocab_size", (uint32_t)c->n_vocab));
    if (tok_src) TRY(put_tokenizer(w, tok_src, c->n_vocab));
    if (!st) return KILN_OK;
    TRY(kiln_gguf_writer_set_u64(w, "train.step", (uint64_t)st->step));
    TRY(kiln_gguf_writer_set_u64(w, "train.tokens_seen", (uint64_t)st->tokens_seen));
    TRY(kiln_gguf_writer_set_u64(w, "train.data_pos", (uint64_t)st->data_pos));
    TRY(kiln_gguf_writer_set_u64(w, "train.seed", st->seed));
    TRY(kiln_gguf_writer_set_u64(w, "train.B", (uint64_t)st->B));
    TRY(kiln_gguf_writer_set_u64(w, "train.T", (uint64_t)st->T));
    TRY(kiln_gguf_writer_set_u64(w, "train.world", (uint64_t)(st->world > 0 ? st->world : 1)));
    TRY(kiln_gguf_writer_set_u64(w, "train.n_embed_skipped", (uint64_t)cn->n_embed_skipped));
    TRY(kiln_gguf_writer_set_bool(w, "train.mixed", t->cfg.mixed));
    TRY(kiln_gguf_writer_set_str(w, "train.optim", t->cfg.adam.eight_bit ? "adamw8bit" : "adamw"));
    TRY(kiln_gguf_writer_set_u64(w, "train.optim_step", (uint64_t)cn->opt_step));
    TRY(kiln_gguf_writer_set_u64(w, "train.n_skipped", (uint64_t)st->n_skipped));
    return KILN_OK;
}

static size_t type_bytes(kiln_type t) { return t == KILN_TYPE_I8 ? 1 : 4; }

/* The tensor of m holding element offset of the flat buffer (the last one for the pad after them). */
static const char *param_name(const kiln_llama_train *m, int64_t offset) {
    int k = 0;
    for (int i = 0; i < m->n_tensors; i++)
        if (m->tensors[i].offset <= offset) k = i;
    return m->tensors[k].name;
}

/* The values a float part may hold: finite, and for the second moments and the scales not negative. The 8-bit
 * codes have no invalid values. */
static bool nonnegative_part(kiln_train_part part) {
    return part == KILN_PART_V || part == KILN_PART_M_SCALE || part == KILN_PART_V_SCALE;
}

/* The first element of x (n, of part) that part may not hold, or -1. */
static int64_t bad_value(kiln_train_part part, const float *x, int64_t n) {
    const bool nonneg = nonnegative_part(part);
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i]) || (nonneg && x[i] < 0.0f)) return i;
    return -1;
}

/* Refuses chunk x (n elements of the tensor ts, from element j of it) when it holds a value its part may not. */
static kiln_status check_chunk(const char *path, const ckpt_tensor *ts, const void *x, int64_t j, int64_t n, bool reading) {
    if (ts->type != KILN_TYPE_F32) return KILN_OK;
    const int64_t i = bad_value(ts->part, x, n);
    if (i < 0) return KILN_OK;
    const float v = ((const float *)x)[i];
    return kiln_fail(reading ? KILN_ERR_FORMAT : KILN_ERR_INVALID, "%s: tensor '%s' element %lld is %g%s; %s", path, ts->name,
                     (long long)(j + i), (double)v, isfinite(v) ? " (a second moment or a scale is never negative)" : "",
                     reading ? "the checkpoint is damaged" : "nothing was written (the run diverged)");
}

kiln_status kiln_train_write(kiln_trainer_impl *t, const kiln_gguf *tok_src, const char *name, const kiln_train_state *st,
                             bool write, const char *path) {
    int n_files;
    ckpt_tensor *ts = file_tensors(t->m, st != NULL, t->cfg.adam.eight_bit, &n_files);
    if (!ts) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    kiln_train_counters cn = {0};
    kiln_gguf_writer *w = NULL;
    const size_t chunk_bytes = (size_t)KILN_TRAIN_CHUNK * sizeof(float);
    void *buf = NULL;
    kiln_status s = st ? t->ops->get_counters(t, &cn) : KILN_OK; /* every rank: it sums over them */
    if (!s && write && !(s = kiln_gguf_writer_new(&w)) && !(s = put_keys(w, t, tok_src, name, st, &cn))) {
        for (int i = 0; i < n_files && !s; i++)
            s = kiln_gguf_writer_add_tensor(w, ts[i].name, ts[i].type, ts[i].n_dims, ts[i].ne, NULL);
        if (!s && !(buf = malloc(chunk_bytes))) s = kiln_fail(KILN_ERR_NOMEM, "out of memory");
        if (!s) s = kiln_gguf_writer_begin(w, path);
    }
    for (int i = 0; i < n_files && !s; i++) {
        /* each part's first tensor makes the part readable (every rank: a gather, data parallel) */
        if (i == 0 || ts[i].part != ts[i - 1].part) s = t->ops->state_begin(t, ts[i].part);
        if (!write) continue;
        const size_t elem = type_bytes(ts[i].type);
        const int64_t n = ts[i].ne[0] * ts[i].ne[1], per = (int64_t)(chunk_bytes / elem);
        for (int64_t j = 0; j < n && !s; j += per) {
            const int64_t k = n - j < per ? n - j : per;
            if (!(s = t->ops->get_state(t, ts[i].part, ts[i].first + j, k, buf)) && !(s = check_chunk(path, &ts[i], buf, j, k, false)))
                s = kiln_gguf_writer_write_part(w, i, buf, (size_t)k * elem);
        }
    }
    if (!s && write) s = kiln_gguf_writer_finish(w);
    kiln_gguf_writer_free(w); /* removes the temp file of a failed write */
    free(buf);
    free(ts);
    return s;
}

kiln_status kiln_train_save(kiln_llama_train *m, const kiln_gguf *tok_src, const char *name, kiln_adamw *opt,
                            const kiln_train_state *st, const char *path) {
    kiln_cpu_trainer host;
    kiln_trainer_impl *t = kiln_trainer_cpu_borrow(&host, m, opt);
    if (st && !opt) return kiln_fail(KILN_ERR_INVALID, "%s: a checkpoint needs the optimizer", path);
    return kiln_train_write(t, tok_src, name, opt ? st : NULL, true, path);
}

/* The flat optimizer tensor name: of the expected type and element count. */
static kiln_status find_flat(const kiln_gguf *g, const char *name, kiln_type type, int64_t n, const kiln_tensor_view **out) {
    const kiln_tensor_view *t = kiln_gguf_find_tensor(g, name);
    if (!t) return kiln_fail(KILN_ERR_NOT_FOUND, "%s: checkpoint has no tensor '%s'", kiln_gguf_path(g), name);
    if (t->type != type || t->ne[0] != n || t->n_dims != 1)
        return kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s' is %s [%lld], expected %s [%lld]", kiln_gguf_path(g), name,
                         kiln_type_name(t->type), (long long)t->ne[0], kiln_type_name(type), (long long)n);
    *out = t;
    return KILN_OK;
}

kiln_status kiln_train_open_checkpoint(const char *path, const kiln_adamw_cfg *cfg, kiln_model **out, kiln_train_state *st,
                                       kiln_train_counters *cn) {
    *out = NULL;
    kiln_model *src;
    TRY(kiln_model_load(path, &src));
    const kiln_gguf *g = src->gguf;
    uint64_t u[9];
    const char *keys[] = {"train.step", "train.tokens_seen", "train.data_pos", "train.seed",      "train.B",
                          "train.T",    "train.n_embed_skipped", "train.optim_step", "train.n_skipped"};
    kiln_status s = KILN_OK;
    for (int i = 0; i < 9 && !s; i++) s = kiln_gguf_get_u64(g, keys[i], &u[i]);
    uint64_t world = 1; /* optional: checkpoints from before data-parallel training have no world */
    if (!s && kiln_gguf_find(g, "train.world")) s = kiln_gguf_get_u64(g, "train.world", &world);
    kiln_str kind = {0};
    if (!s) s = kiln_gguf_get_str(g, "train.optim", &kind);
    const bool eight = kind.len == 9 && memcmp(kind.ptr, "adamw8bit", 9) == 0;
    if (!s && eight != cfg->eight_bit)
        s = kiln_fail(KILN_ERR_INVALID, "%s: checkpoint was trained with %s; resume it with the same optimizer", path,
                      eight ? "8-bit AdamW (--optim adamw8bit)" : "AdamW (--optim adamw)");
    /* the counters index arrays and bound loops: absurd ones (a damaged or hand-made file) are refused here */
    const uint64_t big = (uint64_t)1 << 62;
    if (!s && (u[0] > (uint64_t)1e12 || u[1] > big || u[2] > big || u[4] < 1 || u[4] > (1u << 20) || u[5] < 2 || u[5] > (1u << 20) ||
               u[6] > big || u[7] > u[0] || u[8] > u[0] || world < 1 || world > 4096))
        s = kiln_fail(KILN_ERR_FORMAT, "%s: checkpoint's run keys are out of range (step %llu, tokens_seen %llu, data_pos %llu, B %llu, "
                      "T %llu, world %llu, optim_step %llu, n_skipped %llu, n_embed_skipped %llu)", path, (unsigned long long)u[0],
                      (unsigned long long)u[1], (unsigned long long)u[2], (unsigned long long)u[4], (unsigned long long)u[5],
                      (unsigned long long)world, (unsigned long long)u[7], (unsigned long long)u[8], (unsigned long long)u[6]);
    if (s) {
        kiln_model_free(src);
        return s;
    }
    *st = (kiln_train_state){.step = (int64_t)u[0], .tokens_seen = (int64_t)u[1], .data_pos = (int64_t)u[2], .seed = u[3],
                             .B = (int64_t)u[4], .T = (int64_t)u[5], .n_embed_skipped = (int64_t)u[6], .world = (int64_t)world,
                             .n_skipped = (int64_t)u[8]};
    *cn = (kiln_train_counters){.opt_step = (int64_t)u[7], .n_embed_skipped = (int64_t)u[6]};
    *out = src;
    return KILN_OK;
}

/* Weights into the trainer: a non-finite one (a damaged checkpoint, a diverged model to fine-tune) is refused. */
static kiln_status to_trainer(void *ctx, int64_t offset, const float *x, int64_t n) {
    kiln_trainer_impl *t = ctx;
    const int64_t i = bad_value(KILN_PART_PARAMS, x, n);
    if (i >= 0)
        return kiln_fail(KILN_ERR_FORMAT, "weight '%s' holds %g at element %lld of the parameters; refusing to train from it",
                         param_name(t->m, offset + i), (double)x[i], (long long)(offset + i));
    return t->ops->set_state(t, KILN_PART_PARAMS, offset, n, x);
}

kiln_status kiln_trainer_load_random(kiln_trainer_impl *t, uint64_t seed) {
    return kiln_llama_train_stream_random(t->m, seed, to_trainer, t);
}

kiln_status kiln_trainer_load_model(kiln_trainer_impl *t, const kiln_model *src) {
    return kiln_llama_train_stream_model(t->m, src, to_trainer, t);
}

kiln_status kiln_train_restore(kiln_trainer_impl *t, const kiln_model *src, const kiln_train_counters *cn) {
    TRY(kiln_trainer_load_model(t, src));
    int n_files;
    ckpt_tensor *ts = file_tensors(t->m, true, t->cfg.adam.eight_bit, &n_files);
    if (!ts) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    kiln_status s = KILN_OK;
    for (int i = t->m->n_tensors; i < n_files && !s; i++) { /* the moments, each whole from the mmap */
        const kiln_tensor_view *v = NULL;
        if (!(s = find_flat(src->gguf, ts[i].name, ts[i].type, ts[i].ne[0], &v)) &&
            !(s = check_chunk(kiln_gguf_path(src->gguf), &ts[i], v->data, 0, ts[i].ne[0], true)))
            s = t->ops->set_state(t, ts[i].part, 0, ts[i].ne[0], v->data);
    }
    free(ts);
    return s ? s : t->ops->set_counters(t, cn);
}

kiln_status kiln_train_load_checkpoint(const char *path, bool mixed, const kiln_adamw_cfg *cfg, kiln_llama_train **out_m,
                                       kiln_adamw *opt, kiln_train_state *st) {
    *out_m = NULL;
    kiln_model *src;
    kiln_train_counters cn;
    kiln_llama_config c;
    kiln_llama_train *m = NULL;
    kiln_param_segment *segs = NULL;
    bool opt_ready = false;
    kiln_status s = kiln_train_open_checkpoint(path, cfg, &src, st, &cn);
    if (s) return s;
    if ((s = kiln_llama_train_check_model(src, &c)) || (s = kiln_llama_train_new(&c, mixed, &m))) goto fail;
    if (!(segs = malloc((size_t)m->n_tensors * sizeof *segs))) {
        s = kiln_fail(KILN_ERR_NOMEM, "out of memory");
        goto fail;
    }
    kiln_train_segments(m, segs);
    if ((s = kiln_adamw_init(opt, cfg, m->n_params, segs, m->n_tensors))) goto fail;
    opt_ready = true;
    kiln_cpu_trainer host;
    if ((s = kiln_train_restore(kiln_trainer_cpu_borrow(&host, m, opt), src, &cn))) goto fail;
    kiln_llama_train_refresh_mirror(m);
    opt->n_skipped = st->n_skipped;
    free(segs);
    kiln_model_free(src);
    *out_m = m;
    return KILN_OK;
fail:
    if (opt_ready) kiln_adamw_free(opt);
    free(segs);
    kiln_llama_train_free(m);
    kiln_model_free(src);
    return s;
}
