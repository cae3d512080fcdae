/* checkpoint.c: a training model to and from GGUF. The weights go out as a standard llama GGUF (F32, llama
 * names, the tokenizer's keys), so `kiln generate` and any GGUF reader load the export; a checkpoint adds the
 * optimizer's moments as flat tensors and the run's position as train.* keys (format in train.h). Writes
 * go through the GGUF writer's temp file + fsync + rename, so a write killed halfway leaves the previous
 * checkpoint in place. tests/test_train.c kills one with SIGKILL mid-write and resumes from what is left. */
#include "train.h"
#include "status.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static bool not_tokenizer_key(const char *key) { return strncmp(key, "tokenizer.", 10) != 0; }

void kiln_train_segments(const kiln_llama_train *m, kiln_param_segment *segs) {
    for (int i = 0; i < m->n_tensors; i++)
        segs[i] = (kiln_param_segment){.offset = m->tensors[i].offset, .n = m->tensors[i].n, .decay = m->tensors[i].decay};
}

kiln_status kiln_train_save(const kiln_llama_train *m, const kiln_gguf *tok_src, const char *name, const kiln_adamw *opt,
                            const kiln_train_state *st, const char *path) {
    const kiln_llama_config *c = &m->cfg;
    kiln_gguf_writer *w;
    kiln_status s = kiln_gguf_writer_new(&w);
    if (s) return s;
#define PUT(call) \
    if ((s = (call))) goto done
    PUT(kiln_gguf_writer_set_str(w, "general.architecture", "llama"));
    PUT(kiln_gguf_writer_set_str(w, "general.name", name ? name : "kiln"));
    PUT(kiln_gguf_writer_set_u32(w, "general.file_type", 0)); /* all F32 */
    PUT(kiln_gguf_writer_set_u32(w, "llama.context_length", (uint32_t)c->n_ctx_train));
    PUT(kiln_gguf_writer_set_u32(w, "llama.embedding_length", (uint32_t)c->n_embd));
    PUT(kiln_gguf_writer_set_u32(w, "llama.block_count", (uint32_t)c->n_layer));
    PUT(kiln_gguf_writer_set_u32(w, "llama.feed_forward_length", (uint32_t)c->n_ff));
    PUT(kiln_gguf_writer_set_u32(w, "llama.attention.head_count", (uint32_t)c->n_head));
    PUT(kiln_gguf_writer_set_u32(w, "llama.attention.head_count_kv", (uint32_t)c->n_head_kv));
    PUT(kiln_gguf_writer_set_u32(w, "llama.rope.dimension_count", (uint32_t)c->rope_dim));
    PUT(kiln_gguf_writer_set_f32(w, "llama.rope.freq_base", c->rope_base));
    PUT(kiln_gguf_writer_set_f32(w, "llama.attention.layer_norm_rms_epsilon", c->rms_eps));
    PUT(kiln_gguf_writer_set_u32(w, "llama.vocab_size", (uint32_t)c->n_vocab));
    if (tok_src) PUT(kiln_gguf_writer_copy_kv(w, tok_src, not_tokenizer_key));
    if (st) {
        PUT(kiln_gguf_writer_set_u64(w, "train.step", (uint64_t)st->step));
        PUT(kiln_gguf_writer_set_u64(w, "train.tokens_seen", (uint64_t)st->tokens_seen));
        PUT(kiln_gguf_writer_set_u64(w, "train.data_pos", (uint64_t)st->data_pos));
        PUT(kiln_gguf_writer_set_u64(w, "train.seed", st->seed));
        PUT(kiln_gguf_writer_set_u64(w, "train.B", (uint64_t)st->B));
        PUT(kiln_gguf_writer_set_u64(w, "train.T", (uint64_t)st->T));
        PUT(kiln_gguf_writer_set_u64(w, "train.world", (uint64_t)(st->world > 0 ? st->world : 1)));
        PUT(kiln_gguf_writer_set_u64(w, "train.n_embed_skipped", (uint64_t)st->n_embed_skipped));
        PUT(kiln_gguf_writer_set_bool(w, "train.mixed", m->mirror != NULL));
    }
    if (opt) {
        PUT(kiln_gguf_writer_set_str(w, "train.optim", opt->cfg.eight_bit ? "adamw8bit" : "adamw"));
        PUT(kiln_gguf_writer_set_u64(w, "train.optim_step", (uint64_t)opt->step));
        PUT(kiln_gguf_writer_set_u64(w, "train.n_skipped", (uint64_t)opt->n_skipped));
    }
    for (int i = 0; i < m->n_tensors; i++) {
        const kiln_train_tensor *t = &m->tensors[i];
        PUT(kiln_gguf_writer_add_tensor(w, t->name, KILN_TYPE_F32, t->n_dims, t->ne, m->params + t->offset));
    }
    if (opt) {
        int64_t n = m->n_params, nb = (n + KILN_ADAMW8_BLOCK - 1) / KILN_ADAMW8_BLOCK;
        if (opt->cfg.eight_bit) {
            PUT(kiln_gguf_writer_add_tensor(w, "optim.m8", KILN_TYPE_I8, 1, &n, opt->m8));
            PUT(kiln_gguf_writer_add_tensor(w, "optim.v8", KILN_TYPE_I8, 1, &n, opt->v8));
            PUT(kiln_gguf_writer_add_tensor(w, "optim.m_scale", KILN_TYPE_F32, 1, &nb, opt->m_scale));
            PUT(kiln_gguf_writer_add_tensor(w, "optim.v_scale", KILN_TYPE_F32, 1, &nb, opt->v_scale));
        } else {
            PUT(kiln_gguf_writer_add_tensor(w, "optim.m", KILN_TYPE_F32, 1, &n, opt->m));
            PUT(kiln_gguf_writer_add_tensor(w, "optim.v", KILN_TYPE_F32, 1, &n, opt->v));
        }
    }
    s = kiln_gguf_writer_write_file(w, path);
done:
#undef PUT
    kiln_gguf_writer_free(w);
    return s;
}

static kiln_status get_u64(const kiln_gguf *g, const char *key, uint64_t *out) { return kiln_gguf_get_u64(g, key, out); }

/* Copies a flat optimizer tensor of the expected type and element count. */
static kiln_status read_flat(const kiln_gguf *g, const char *name, kiln_type type, int64_t n, void *dst) {
    const kiln_tensor_view *t = kiln_gguf_find_tensor(g, name);
    if (!t) return kiln_fail(KILN_ERR_NOT_FOUND, "%s: checkpoint has no tensor '%s'", kiln_gguf_path(g), name);
    if (t->type != type || t->ne[0] != n || t->n_dims != 1)
        return kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s' is %s [%lld], expected %s [%lld]", kiln_gguf_path(g), name,
                         kiln_type_name(t->type), (long long)t->ne[0], kiln_type_name(type), (long long)n);
    memcpy(dst, t->data, t->nbytes);
    return KILN_OK;
}

kiln_status kiln_train_load_checkpoint(const char *path, bool mixed, const kiln_adamw_cfg *cfg, kiln_llama_train **out_m,
                                       kiln_adamw *opt, kiln_train_state *st) {
    *out_m = NULL;
    kiln_model *src = NULL;
    kiln_llama_train *m = NULL;
    kiln_param_segment *segs = NULL;
    bool opt_ready = false;
    kiln_status s = kiln_model_load(path, &src);
    if (s) return s;
    const kiln_gguf *g = src->gguf;
    if ((s = kiln_llama_train_from_model(src, mixed, &m))) goto fail;
    uint64_t u[8];
    const char *keys[] = {"train.step", "train.tokens_seen", "train.data_pos", "train.seed",
                          "train.B", "train.T", "train.n_embed_skipped", "train.optim_step"};
    for (int i = 0; i < 8; i++)
        if ((s = get_u64(g, keys[i], &u[i]))) goto fail;
    *st = (kiln_train_state){.step = (int64_t)u[0], .tokens_seen = (int64_t)u[1], .data_pos = (int64_t)u[2],
                             .seed = u[3], .B = (int64_t)u[4], .T = (int64_t)u[5], .n_embed_skipped = (int64_t)u[6]};
    m->n_embed_skipped = st->n_embed_skipped;
    uint64_t world = 1; /* optional: checkpoints from before data-parallel training have no world */
    if (kiln_gguf_find(g, "train.world") && (s = get_u64(g, "train.world", &world))) goto fail;
    st->world = (int64_t)world;
    kiln_str kind;
    if ((s = kiln_gguf_get_str(g, "train.optim", &kind))) goto fail;
    bool eight = kind.len == 9 && memcmp(kind.ptr, "adamw8bit", 9) == 0;
    if (eight != cfg->eight_bit) {
        s = kiln_fail(KILN_ERR_INVALID, "%s: checkpoint was trained with %s; resume it with the same optimizer", path,
                      eight ? "8-bit AdamW (--optim adamw8bit)" : "AdamW (--optim adamw)");
        goto fail;
    }
    segs = malloc((size_t)m->n_tensors * sizeof *segs);
    if (!segs) {
        s = kiln_fail(KILN_ERR_NOMEM, "out of memory");
        goto fail;
    }
    kiln_train_segments(m, segs);
    if ((s = kiln_adamw_init(opt, cfg, m->n_params, segs, m->n_tensors))) goto fail;
    opt_ready = true;
    opt->step = (int64_t)u[7];
    uint64_t skipped;
    if ((s = get_u64(g, "train.n_skipped", &skipped))) goto fail;
    opt->n_skipped = (int64_t)skipped;
    int64_t n = m->n_params, nb = (n + KILN_ADAMW8_BLOCK - 1) / KILN_ADAMW8_BLOCK;
    if (eight) {
        if ((s = read_flat(g, "optim.m8", KILN_TYPE_I8, n, opt->m8)) || (s = read_flat(g, "optim.v8", KILN_TYPE_I8, n, opt->v8)) ||
            (s = read_flat(g, "optim.m_scale", KILN_TYPE_F32, nb, opt->m_scale)) ||
            (s = read_flat(g, "optim.v_scale", KILN_TYPE_F32, nb, opt->v_scale)))
            goto fail;
    } else if ((s = read_flat(g, "optim.m", KILN_TYPE_F32, n, opt->m)) || (s = read_flat(g, "optim.v", KILN_TYPE_F32, n, opt->v)))
        goto fail;
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
