/* train.c: kiln.h's trainer and the training loop behind `kiln train`. A kiln_trainer is a model and its optimizer
 * on the trainer implementation picked once from opts.device (src/train/trainer.h: the CPU's or the GPU's), with
 * the tokenizer its outputs carry and the run's position. Each optimizer step zeroes the gradients, runs the step's
 * micro-batches of B x T tokens (forward, fused loss, backward), then one AdamW step at the schedule's learning rate;
 * a non-finite loss or gradient skips the update and is counted.
 *
 * kiln_train_run adds the data and the outputs: every eval_interval steps it scores eval_batches validation batches
 * (always from the start of the validation split, so evaluations compare); every ckpt_interval steps it writes a
 * checkpoint (checkpoint.c has the format). Progress goes to a callback (the CLI prints it) and to a JSONL log.
 * tests/test_train.c runs it end to end: resume equals an uninterrupted run bit for bit; tests/test_trainer_api.c
 * steps a trainer through kiln.h alone.
 *
 * Data parallel (one process per GPU, tools/launch.h; issue #9): every rank reads the same global batch of
 * B x world sequences and trains on its own B of them, so the loss, the gradient (summed over the ranks by the
 * trainer) and every decision are the same on all ranks; rank 0 alone writes the log, checkpoints and exports,
 * but every rank takes part in the collectives those need. */
#include "trainer.h"
#include "cuda/cuda.h"
#include "cuda/dist.h"
#include "data.h"
#include "rendezvous.h"
#include "status.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

kiln_train_opts kiln_train_defaults(void) {
    kiln_train_opts o;
    memset(&o, 0, sizeof o);
    o.dims.rope_base = 10000.0f;
    o.dims.rms_eps = 1e-5f;
    o.B = 8;
    o.T = 256;
    o.grad_accum = 1;
    o.steps = 1000;
    o.lr = (kiln_lr_schedule){.lr = 1e-3f, .min_lr = 1e-4f, .warmup = 100, .total = 1000, .decay = KILN_LR_COSINE};
    o.adam = kiln_adamw_defaults();
    o.seed = 1337;
    o.device = (kiln_device){KILN_DEVICE_CPU, 0};
    o.eval_interval = 100;
    o.eval_batches = 20;
    return o;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---------------------------------------------------------------- the options */

/* One numeric option and its allowed range. */
typedef struct opt_range {
    const char *field; /* as kiln_train_opts spells it */
    double value, lo, hi;
} opt_range;

#define MAX_STEPS 1e12 /* a trillion steps: past any run, far below where int64 token counts overflow */

/* Every number of o finite and in its range, the field named; run: kiln_train_run's fields too. The ranges are
 * wide (what no run needs is refused, nothing plausible is) but bound the products the run computes. */
static kiln_status check_opts(const kiln_train_opts *o, bool run) {
    const kiln_adamw_cfg *a = &o->adam;
    const double steps = (double)o->steps, total = o->lr.total > 0 ? (double)o->lr.total : steps;
    const opt_range r[] = {
        {"B", (double)o->B, 1, 1 << 20},
        {"T", (double)o->T, 2, 1 << 20},
        {"steps", steps, 1, MAX_STEPS},
        {"grad_accum", run ? (double)o->grad_accum : 1, 1, 1 << 20},
        {"time_budget_s", o->time_budget_s, 0, 1e10},
        {"stop_after", (double)o->stop_after, 0, MAX_STEPS},
        {"lr.lr", o->lr.lr, 0, 10},
        {"lr.min_lr", o->lr.min_lr, 0, o->lr.decay == KILN_LR_CONSTANT ? 10 : o->lr.lr},
        {"lr.total", (double)o->lr.total, 0, MAX_STEPS},
        {"lr.warmup", (double)o->lr.warmup, 0, total},
        {"lr.decay", (double)o->lr.decay, KILN_LR_COSINE, KILN_LR_CONSTANT},
        {"adam.beta1", a->beta1, 0, 1},
        {"adam.beta2", a->beta2, 0, 1},
        {"adam.eps", a->eps, 1e-30, 1},
        {"adam.weight_decay", a->weight_decay, 0, 10},
        {"adam.grad_clip", a->grad_clip, -1e30, 1e30},
        {"label_smoothing", o->label_smoothing, 0, 1},
        {"z_loss", o->z_loss, 0, 10},
        {"n_threads", o->n_threads, 0, 4096},
        {"dims.rope_base", o->dims.rope_base, 0, 1e12},
        {"dims.rms_eps", o->dims.rms_eps, 0, 1},
        {"eval_interval", (double)o->eval_interval, 0, MAX_STEPS},
        {"eval_batches", (double)o->eval_batches, 0, 1e9},
        {"ckpt_interval", (double)o->ckpt_interval, 0, MAX_STEPS},
    };
    for (size_t i = 0; i < sizeof r / sizeof r[0]; i++)
        if (!(isfinite(r[i].value) && r[i].value >= r[i].lo && r[i].value <= r[i].hi))
            return kiln_fail(KILN_ERR_INVALID, "train: opts.%s is %g; it must be a finite number in [%g, %g]", r[i].field, r[i].value,
                             r[i].lo, r[i].hi);
    /* the open ends of the intervals above */
    if (a->beta1 >= 1 || a->beta2 >= 1 || o->label_smoothing >= 1)
        return kiln_fail(KILN_ERR_INVALID, "train: opts.adam.beta1 (%g), adam.beta2 (%g) and label_smoothing (%g) must be below 1",
                         (double)a->beta1, (double)a->beta2, (double)o->label_smoothing);
    if ((double)o->lr.lr * (double)a->weight_decay >= 1)
        return kiln_fail(KILN_ERR_INVALID, "train: opts.lr.lr x adam.weight_decay is %g; it must be below 1 (the decay would flip the "
                         "weights' sign)", (double)o->lr.lr * (double)a->weight_decay);
    /* a global batch's ids are counted and indexed in int64 and held in one host array */
    if ((double)o->B * (double)o->T * (run ? (double)o->grad_accum : 1) > (double)(1 << 30))
        return kiln_fail(KILN_ERR_INVALID, "train: a step of B x T x grad_accum = %g tokens is too large (at most 2^30)",
                         (double)o->B * (double)o->T * (double)(run ? o->grad_accum : 1));
    return KILN_OK;
}

/* ---------------------------------------------------------------- the trainer */

struct kiln_trainer {
    kiln_train_opts o;        /* the caller's options (its strings are borrowed) */
    kiln_lr_schedule sched;   /* o.lr with the total filled in */
    kiln_pool *pool;
    kiln_gguf *tok_gguf;      /* NULL: no tokenizer (a new model with dims.n_vocab set) */
    kiln_tokenizer *tok;
    kiln_trainer_impl *impl;  /* the model, its gradients and optimizer, on the CPU or the GPU */
    kiln_train_state st;
    kiln_rank_info ri;        /* this process's rank (world 1: not distributed) */
    kiln_dist *dist;          /* world > 1: the NCCL communicator */
};

static void trainer_close(kiln_trainer *tr, bool failed) {
    if (!tr) return;
    /* a failed rank aborts first: its peers' collectives fail instead of waiting for it, and its own unmatched
     * collective ends, so freeing the trainer's memory (which waits for the device) cannot block */
    if (failed) kiln_dist_abort(tr->dist);
    else kiln_dist_free(tr->dist);
    kiln_trainer_impl_free(tr->impl);
    kiln_tokenizer_free(tr->tok);
    kiln_gguf_close(tr->tok_gguf);
    kiln_pool_free(tr->pool);
    free(tr);
}

void kiln_trainer_free(kiln_trainer *t) { trainer_close(t, false); }

/* The model's config: the checkpoint's (src and the run's state from it), init_from's (src), or the options'. */
static kiln_status model_config(kiln_trainer *tr, kiln_model **src, kiln_train_counters *cn, kiln_llama_config *c) {
    const kiln_train_opts *o = &tr->o;
    if (o->resume) {
        TRY(kiln_train_open_checkpoint(o->resume, &o->adam, src, &tr->st, cn));
        TRY(kiln_llama_train_check_model(*src, c));
        /* The global batch (B per rank x ranks) and T fix the data order and the schedule, so they must stay; how the
         * batch is split over GPUs may change (2 ranks of B 8 resume as 4 of B 4, or 1 of B 16): the checkpoint holds
         * whole moments, which each rank shards again. */
        const kiln_train_state *st = &tr->st;
        if (st->B * st->world != o->B * tr->ri.world || st->T != o->T)
            return kiln_fail(KILN_ERR_INVALID, "%s: checkpoint was trained with a global batch of %lld sequences (%lld rank(s) x B=%lld) of "
                             "T=%lld; resume with the same (B x --nproc, T), not %lld x B=%lld of T=%lld", o->resume,
                             (long long)(st->B * st->world), (long long)st->world, (long long)st->B, (long long)st->T,
                             (long long)tr->ri.world, (long long)o->B, (long long)o->T);
        if (st->step > o->steps) /* the schedule spans steps: a checkpoint past it belongs to a longer run */
            return kiln_fail(KILN_ERR_INVALID, "%s: checkpoint is at step %lld, past this run's %lld steps; resume with at least "
                             "as many", o->resume, (long long)st->step, (long long)o->steps);
        tr->st.B = o->B, tr->st.world = tr->ri.world; /* this run's split, for its checkpoints */
        return KILN_OK;
    }
    tr->st = (kiln_train_state){.seed = o->seed, .B = o->B, .T = o->T, .world = tr->ri.world};
    if (o->init_from) {
        TRY(kiln_model_load(o->init_from, src));
        return kiln_llama_train_check_model(*src, c);
    }
    const kiln_model_dims *d = &o->dims;
    *c = (kiln_llama_config){.n_vocab = d->n_vocab ? d->n_vocab : tr->tok ? kiln_tokenizer_n_vocab(tr->tok) : 0,
                             .n_embd = d->n_embd, .n_layer = d->n_layer, .n_head = d->n_head, .n_head_kv = d->n_head_kv,
                             .n_ff = d->n_ff, .n_ctx_train = d->n_ctx ? d->n_ctx : o->T, .rope_base = d->rope_base,
                             .rms_eps = d->rms_eps, .tied = d->tied};
    return KILN_OK;
}

/* need_tok: the run reads data, whose shards must match a tokenizer; a kiln_trainer of the caller's ids may have
 * none (a new model with dims.n_vocab, or a checkpoint or init_from file without tokenizer keys). */
static kiln_status trainer_setup(kiln_trainer *tr, const kiln_train_opts *o, bool need_tok) {
    kiln_status s;
    TRY(check_opts(o, false));
    const char *tok_path = o->tokenizer ? o->tokenizer : o->resume ? o->resume : o->init_from;
    if (!tok_path && o->dims.n_vocab <= 0) return kiln_fail(KILN_ERR_INVALID, "a new model needs a tokenizer (-t TOKENIZER.gguf)");
    if (o->device.kind != KILN_DEVICE_CPU && o->device.kind != KILN_DEVICE_CUDA)
        return kiln_fail(KILN_ERR_INVALID, "train: unknown device kind %d", (int)o->device.kind);
    const bool gpu = o->device.kind == KILN_DEVICE_CUDA;
    tr->o = *o;
    tr->sched = o->lr;
    if (tr->sched.total <= 0) tr->sched.total = o->steps;
    if ((s = kiln_pool_create(o->n_threads, &tr->pool))) return s;
    if (tok_path && (s = kiln_data_tokenizer_gguf(tok_path, &tr->tok_gguf))) return s; /* kiln data applies the same check */
    if (tok_path && !need_tok && !o->tokenizer && !kiln_gguf_find(tr->tok_gguf, "tokenizer.ggml.model")) {
        kiln_gguf_close(tr->tok_gguf);
        tr->tok_gguf = NULL;
    }
    if (tr->tok_gguf && (s = kiln_tokenizer_load_gguf(tr->tok_gguf, &tr->tok))) return s;
    if ((s = kiln_rank_from_env(&tr->ri))) return s; /* before the model: a resume checks the checkpoint's world */

    kiln_model *src = NULL;
    kiln_train_counters cn = {0};
    kiln_llama_config c;
    kiln_llama_train *layout = NULL;
    s = model_config(tr, &src, &cn, &c);
    /* the layout normalizes the config (and refuses a bad one) before the checks below */
    if (!s && !(s = kiln_llama_train_layout(&c, &layout))) {
        c = layout->cfg;
        kiln_llama_train_free(layout);
        if (tr->tok && c.n_vocab < kiln_tokenizer_n_vocab(tr->tok))
            s = kiln_fail(KILN_ERR_INVALID, "the model's vocab (%lld) is smaller than the tokenizer's (%d)", (long long)c.n_vocab,
                          kiln_tokenizer_n_vocab(tr->tok));
        else if (o->T > c.n_ctx_train)
            s = kiln_fail(KILN_ERR_INVALID, "T=%lld exceeds the model's context length %lld", (long long)o->T, (long long)c.n_ctx_train);
    }
    if (!s && tr->ri.world > 1) { /* the ranks meet: rank 0 makes the NCCL id and leaves it in the rendezvous folder */
        if (!gpu) s = kiln_fail(KILN_ERR_INVALID, "rank %d of %d: data-parallel training runs on GPUs: add --gpu", tr->ri.rank, tr->ri.world);
        else s = kiln_dist_join(&tr->ri, 300.0, &tr->dist);
    }
    if (!s) {
        const kiln_trainer_cfg tc = {
            .mixed = o->mixed, .adam = o->adam, .label_smoothing = o->label_smoothing, .z_loss = o->z_loss, .B = o->B, .T = o->T,
            .pool = tr->pool, .device = o->device.index, .dist = tr->dist,
            .cuda_flags = (o->deterministic ? KILN_CUDA_TRAIN_DETERMINISTIC : 0u) | (o->recompute ? KILN_CUDA_TRAIN_RECOMPUTE : 0u) |
                          (o->zero1 ? KILN_CUDA_TRAIN_ZERO1 : 0u)};
        s = gpu ? kiln_trainer_cuda_new(&c, &tc, &tr->impl) : kiln_trainer_cpu_new(&c, &tc, &tr->impl);
    }
    /* the weights (and a checkpoint's moments) stream into the trainer: no host copy of the model on the GPU */
    if (!s && o->resume) s = kiln_train_restore(tr->impl, src, &cn);
    else if (!s && o->init_from) s = kiln_trainer_load_model(tr->impl, src);
    else if (!s) s = kiln_trainer_load_random(tr->impl, o->seed);
    kiln_model_free(src);
    return s;
}

static kiln_status trainer_open(const kiln_train_opts *o, bool need_tok, kiln_trainer **out) {
    *out = NULL;
    kiln_trainer *tr = calloc(1, sizeof *tr);
    if (!tr) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    kiln_status s = trainer_setup(tr, o, need_tok);
    if (s) {
        trainer_close(tr, true);
        return s;
    }
    *out = tr;
    return KILN_OK;
}

kiln_status kiln_trainer_new(const kiln_train_opts *o, kiln_trainer **out) { return trainer_open(o, false, out); }

int64_t kiln_trainer_steps_done(const kiln_trainer *t) { return t->st.step; }

/* One optimizer step over n_micro micro-batches (micro-batch a: this rank's rows at inputs + a * stride) of
 * counted targets over every rank: the mean loss into *loss, the update's norm and skip into *res, its rate *lr. */
static kiln_status optimizer_step(kiln_trainer *tr, const int32_t *inputs, const int32_t *targets, int64_t n_micro, int64_t stride,
                                  int64_t counted, double *loss, kiln_adamw_result *res, float *lr) {
    kiln_trainer_impl *t = tr->impl;
    kiln_status s = t->ops->zero_grads(t);
    double loss_sum = 0;
    for (int64_t a = 0; a < n_micro && !s; a++) {
        int64_t k;
        double l;
        if (a == n_micro - 1) t->ops->reduce_next(t); /* overlap the gradient's sum over the ranks */
        s = t->ops->step(t, inputs + a * stride, targets + a * stride, counted ? 1.0f / (float)counted : 0.0f, &l, &k);
        loss_sum += l;
    }
    if (s) return s;
    *loss = counted ? loss_sum / (double)counted : 0;
    *lr = kiln_lr_at(&tr->sched, tr->st.step);
    *res = (kiln_adamw_result){.grad_norm = NAN, .skipped = true, .bad_at = -1}; /* the guard at the loss: nothing is updated */
    if (isfinite(*loss) && (s = t->ops->optimizer_step(t, *lr, res))) return s;
    if (res->skipped) tr->st.n_skipped++;
    tr->st.step++;
    tr->st.tokens_seen += n_micro * tr->o.B * tr->ri.world * tr->o.T;
    return KILN_OK;
}

kiln_status kiln_trainer_step(kiln_trainer *t, const int32_t *inputs, const int32_t *targets, double *loss) {
    if (t->ri.world > 1)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "kiln_trainer_step trains in one process; data-parallel training runs through kiln_train_run");
    kiln_adamw_result res;
    float lr;
    return optimizer_step(t, inputs, targets, 1, 0, kiln_count_targets(targets, t->o.B * t->o.T), loss, &res, &lr);
}

kiln_status kiln_trainer_save(kiln_trainer *t, const char *path) {
    return kiln_train_write(t->impl, t->tok_gguf, t->o.name, &t->st, t->ri.rank == 0, path);
}

kiln_status kiln_trainer_export(kiln_trainer *t, const char *path) {
    return kiln_train_write(t->impl, t->tok_gguf, t->o.name, NULL, t->ri.rank == 0, path);
}

/* ---------------------------------------------------------------- the run */

/* On resume, the log keeps only the lines up to the checkpoint's step, so it reads as one run. A log that is not a
 * regular file (a pipe, /dev/full) is left alone. */
static kiln_status trim_log(const char *path, int64_t step) {
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) return KILN_OK; /* no log yet, or nothing to trim */
    FILE *f = fopen(path, "r");
    if (!f) return KILN_OK;
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *o = fopen(tmp, "w");
    if (!o) {
        fclose(f);
        return kiln_fail(KILN_ERR_IO, "%s: cannot write", tmp);
    }
    char line[4096];
    while (fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "\"step\":");
        if (p && strtoll(p + 7, NULL, 10) > step) continue;
        fputs(line, o);
    }
    fclose(f);
    bool ok = !ferror(o);
    ok = fclose(o) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        return kiln_fail(KILN_ERR_IO, "%s: cannot rewrite the log", path);
    }
    return KILN_OK;
}

/* ---------------------------------------------------------------- the outputs, checked before step 1 */

/* path's folder into dir (".": none named) and the name after it into *base. */
static void split_path(const char *path, char *dir, size_t n, const char **base) {
    const char *slash = strrchr(path, '/');
    *base = slash ? slash + 1 : path;
    if (!slash) snprintf(dir, n, ".");
    else if (slash == path) snprintf(dir, n, "/");
    else snprintf(dir, n, "%.*s", (int)(slash - path), path);
}

/* The place an output will be (its folder's real path, then its name), for comparing two outputs. */
static bool output_place(const char *path, char *out, size_t n) {
    char dir[PATH_MAX], real[PATH_MAX];
    const char *base;
    split_path(path, dir, sizeof dir, &base);
    if (!realpath(dir, real)) return false;
    return snprintf(out, n, "%s/%s", real, base) < (int)n;
}

/* One output path: not a folder, its folder there and writable, and room in it for bytes (*dev: its device). */
static kiln_status check_output(const char *what, const char *path, uint64_t bytes, dev_t *dev, uint64_t *avail) {
    struct stat sb;
    if (!*path) return kiln_fail(KILN_ERR_INVALID, "train: the %s path is empty", what);
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) return kiln_fail(KILN_ERR_INVALID, "%s: the %s path is a folder", path, what);
    char dir[PATH_MAX];
    const char *base;
    split_path(path, dir, sizeof dir, &base);
    if (!*base) return kiln_fail(KILN_ERR_INVALID, "%s: the %s path names no file", path, what);
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return kiln_fail(KILN_ERR_IO, "%s: the %s's folder %s does not exist", path, what, dir);
    if (access(dir, W_OK | X_OK) != 0)
        return kiln_fail(KILN_ERR_IO, "%s: cannot write the %s into %s: %s", path, what, dir, strerror(errno));
    struct statvfs fs;
    *dev = sb.st_dev;
    *avail = statvfs(dir, &fs) == 0 ? (uint64_t)fs.f_bavail * (uint64_t)fs.f_frsize : UINT64_MAX;
    if (*avail < bytes)
        return kiln_fail(KILN_ERR_IO, "%s: %s has %.1f MB free; the %s needs about %.1f MB", path, dir, (double)*avail / 1e6, what,
                         (double)bytes / 1e6);
    return KILN_OK;
}

/* -o and --ckpt before step 1: each writable with room for one of its kind (both, where they share a disk), and
 * not the same file, so a run never trains to its last step to find it cannot save. */
static kiln_status check_outputs(const kiln_train_opts *o, const kiln_trainer *tr) {
    const uint64_t n = (uint64_t)tr->impl->m->n_params, meta = 1u << 20; /* keys and the tokenizer's vocab */
    const uint64_t moments = o->adam.eight_bit ? 2 * n + 8 * (n / KILN_ADAMW8_BLOCK + 1) : 8 * n;
    const uint64_t out_bytes = 4 * n + meta, ckpt_bytes = 4 * n + moments + meta;
    dev_t out_dev = 0, ckpt_dev = 0;
    uint64_t avail;
    if (o->out_path) TRY(check_output("export (-o)", o->out_path, out_bytes, &out_dev, &avail));
    if (o->ckpt_path) TRY(check_output("checkpoint (--ckpt)", o->ckpt_path, ckpt_bytes, &ckpt_dev, &avail));
    if (!o->out_path || !o->ckpt_path) return KILN_OK;
    char a[PATH_MAX + 256], b[PATH_MAX + 256];
    struct stat sa, sb;
    bool same = strcmp(o->out_path, o->ckpt_path) == 0 ||
                (output_place(o->out_path, a, sizeof a) && output_place(o->ckpt_path, b, sizeof b) && strcmp(a, b) == 0) ||
                (stat(o->out_path, &sa) == 0 && stat(o->ckpt_path, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino);
    if (same) return kiln_fail(KILN_ERR_INVALID, "%s: -o and --ckpt are the same file; the export would overwrite the checkpoint", o->out_path);
    if (out_dev == ckpt_dev && avail < out_bytes + ckpt_bytes) /* avail: the checkpoint's disk, both being on it */
        return kiln_fail(KILN_ERR_IO, "%s: the disk has %.1f MB free; the checkpoint and the export need about %.1f MB", o->ckpt_path,
                         (double)avail / 1e6, (double)(out_bytes + ckpt_bytes) / 1e6);
    return KILN_OK;
}

/* Removes the temp files (PATH.tmp.<pid>, src/core/gguf_write.c) that killed runs left beside path: only those
 * whose process is gone (kill(pid, 0) fails with ESRCH), never a live one's. */
static void remove_stale_temps(const char *path) {
    char dir[PATH_MAX], file[PATH_MAX + 256];
    const char *base;
    split_path(path, dir, sizeof dir, &base);
    const size_t bl = strlen(base);
    DIR *d = opendir(dir);
    if (!d) return;
    for (struct dirent *e; (e = readdir(d));) {
        const char *tail = e->d_name + bl;
        if (strncmp(e->d_name, base, bl) != 0 || strncmp(tail, ".tmp.", 5) != 0) continue;
        char *end;
        errno = 0;
        const long pid = strtol(tail + 5, &end, 10);
        if (*end || end == tail + 5 || errno || pid <= 0 || pid > INT_MAX || pid == (long)getpid()) continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue; /* alive, or not ours to judge */
        snprintf(file, sizeof file, "%s/%s", dir, e->d_name);
        unlink(file);
    }
    closedir(d);
}

typedef struct run {
    const kiln_train_opts *o;
    kiln_trainer *tr;
    kiln_loader *train, *val;
    int32_t *inputs, *targets; /* (grad_accum, world*B*T): the global batch */
    FILE *log;
} run;

/* One line of the JSONL log, flushed, so a full disk is an error at the step it happens, not an empty log. */
static kiln_status log_line(run *r, const char *fmt, ...) {
    if (!r->log) return KILN_OK;
    va_list ap;
    va_start(ap, fmt);
    errno = 0;
    int n = vfprintf(r->log, fmt, ap);
    va_end(ap);
    if (n < 0 || fflush(r->log) != 0 || ferror(r->log))
        return kiln_fail(KILN_ERR_IO, "%s: cannot write the log: %s", r->o->log_path, strerror(errno ? errno : EIO));
    return KILN_OK;
}

/* Closes the log; a failed close (the last buffered bytes lost) is an error. */
static kiln_status log_close(run *r) {
    if (!r->log) return KILN_OK;
    errno = 0;
    bool ok = !ferror(r->log);
    ok = fclose(r->log) == 0 && ok;
    r->log = NULL;
    return ok ? KILN_OK : kiln_fail(KILN_ERR_IO, "%s: cannot write the log: %s", r->o->log_path, strerror(errno ? errno : EIO));
}

static void run_free(run *r, bool failed) {
    if (r->log) fclose(r->log);
    trainer_close(r->tr, failed);
    free(r->inputs);
    free(r->targets);
    kiln_loader_free(r->train);
    kiln_loader_free(r->val);
}

static kiln_status setup(run *r) {
    const kiln_train_opts *o = r->o;
    kiln_status s;
    TRY(check_opts(o, true));
    if (!o->data_dir) return kiln_fail(KILN_ERR_INVALID, "no data: pass the shard folder written by kiln data");
    if (!o->tokenizer && !o->resume && !o->init_from) return kiln_fail(KILN_ERR_INVALID, "a new model needs a tokenizer (-t TOKENIZER.gguf)");
    if ((s = trainer_open(o, true, &r->tr))) return s;
    const kiln_trainer *tr = r->tr;
    const int64_t V = tr->impl->m->cfg.n_vocab;
    if (tr->ri.rank == 0) {
        TRY(check_outputs(o, tr));
        if (o->out_path) remove_stale_temps(o->out_path);
        if (o->ckpt_path) remove_stale_temps(o->ckpt_path);
    }

    /* the vocab fingerprint preflight: every shard must come from this tokenizer */
    uint64_t fp = kiln_tokenizer_fingerprint(tr->tok);
    if ((s = kiln_loader_open(o->data_dir, "train", fp, V, &r->train))) return s;
    /* a missing validation split (KILN_ERR_NOT_FOUND) only turns evaluation off; a bad one is an error */
    if (o->eval_batches > 0 && (s = kiln_loader_open(o->data_dir, "val", fp, V, &r->val)) && s != KILN_ERR_NOT_FOUND) return s;
    if (o->resume && (s = kiln_loader_set_pos(r->train, tr->st.data_pos))) return s;

    size_t n = (size_t)(o->grad_accum * o->B * tr->ri.world * o->T);
    r->inputs = malloc(n * sizeof *r->inputs);
    r->targets = malloc(n * sizeof *r->targets);
    if (!r->inputs || !r->targets) return kiln_fail(KILN_ERR_NOMEM, "out of memory for batches");
    if (o->log_path && tr->ri.rank == 0) {
        if (o->resume && (s = trim_log(o->log_path, tr->st.step))) return s;
        r->log = fopen(o->log_path, o->resume ? "a" : "w");
        if (!r->log) return kiln_fail(KILN_ERR_IO, "%s: cannot open the log for writing", o->log_path);
    }
    return KILN_OK;
}

/* Mean loss over eval_batches validation batches from the start of the split. */
static kiln_status evaluate(run *r, double *val_loss) {
    const kiln_train_opts *o = r->o;
    kiln_trainer_impl *t = r->tr->impl;
    const kiln_rank_info *ri = &r->tr->ri;
    kiln_status s = kiln_loader_set_pos(r->val, 0);
    double sum = 0;
    int64_t count = 0;
    const int64_t own = (int64_t)ri->rank * o->B * o->T; /* this rank's rows of the global batch */
    for (int64_t i = 0; i < o->eval_batches && !s; i++) {
        if ((s = kiln_loader_next(r->val, o->B * ri->world, o->T, r->inputs, r->targets))) break;
        int64_t k;
        double l;
        if ((s = t->ops->step(t, r->inputs + own, r->targets + own, 0.0f, &l, &k))) break;
        sum += l;
        count += k;
    }
    *val_loss = count ? sum / (double)count : NAN;
    return s;
}

static size_t state_bytes(const kiln_trainer *tr) {
    size_t n = (size_t)tr->impl->m->n_params;
    size_t moments = tr->o.adam.eight_bit ? 2 * n + 2 * sizeof(float) * (n / KILN_ADAMW8_BLOCK + 1) : 2 * n * sizeof(float);
    return n * sizeof(float) * 2 + (tr->o.mixed ? n * 2 : 0) + moments;
}

/* The run's end after an output failed (status failed, its message in why): the final export is still tried, so
 * the weights trained so far are not lost, and the error says what became of them. */
static kiln_status export_after_failure(kiln_trainer *tr, const kiln_train_opts *o, kiln_status failed, const char *why) {
    if (!o->out_path || tr->ri.world > 1) return failed; /* data parallel: the ranks are no longer in step */
    char first[1024];
    snprintf(first, sizeof first, "%s", why);
    if (kiln_trainer_export(tr, o->out_path) == KILN_OK)
        return kiln_fail(failed, "%s (the weights of step %lld were exported to %s)", first, (long long)tr->st.step, o->out_path);
    return kiln_fail(failed, "%s; the final export failed too: %s", first, kiln_last_error());
}

/* While *o->pause is set and no stop is asked: a "paused" report, then polls every 20 ms; "resumed" when it goes on.
 * The seconds it waited. */
static double wait_paused(const kiln_train_opts *o, kiln_progress_fn progress, void *user, int64_t step) {
    double t = now_s();
    if (progress) progress(user, &(kiln_progress){.stage = "paused", .done = step, .total = o->steps, .metric = NAN});
    while (__atomic_load_n(o->pause, __ATOMIC_RELAXED) && !(o->cancel && __atomic_load_n(o->cancel, __ATOMIC_RELAXED)))
        nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
    if (progress) progress(user, &(kiln_progress){.stage = "resumed", .done = step, .total = o->steps, .metric = NAN});
    return now_s() - t;
}

kiln_status kiln_train_run(const kiln_train_opts *o, kiln_progress_fn progress, void *user) {
    run r = {.o = o};
    kiln_status s = setup(&r);
    kiln_trainer *tr = r.tr;
    const int64_t world = tr ? tr->ri.world : 1, BT = o->B * o->T, GBT = BT * world; /* a micro-batch's rows: this rank's, all ranks' */
    const int64_t own = tr ? (int64_t)tr->ri.rank * BT : 0;
    const bool lead = !tr || tr->ri.rank == 0; /* writes the log, checkpoints and exports, and reports progress */
    if (!lead) progress = NULL;
    double t0 = now_s();
    const int64_t first_step = tr ? tr->st.step : 0, skipped0 = tr ? tr->st.n_skipped : 0;
    double best_val = INFINITY;
    bool exported = false;
    kiln_status out_failed = KILN_OK; /* a checkpoint or the log could not be written: stop, still export */
    while (!s && !out_failed && tr->st.step < o->steps) {
        if (o->pause && world == 1 && __atomic_load_n(o->pause, __ATOMIC_RELAXED)) t0 += wait_paused(o, progress, user, tr->st.step);
        double ts = now_s();
        /* load every micro-batch first: the gradient is of the mean over all their counted targets */
        for (int64_t a = 0; a < o->grad_accum && !s; a++)
            s = kiln_loader_next(r.train, o->B * world, o->T, r.inputs + a * GBT, r.targets + a * GBT);
        if (s) break;
        int64_t counted = kiln_count_targets(r.targets, o->grad_accum * GBT); /* over the global batch */
        double loss;
        kiln_adamw_result res;
        float lr;
        if ((s = optimizer_step(tr, r.inputs + own, r.targets + own, o->grad_accum, GBT, counted, &loss, &res, &lr))) break;
        tr->st.data_pos = kiln_loader_pos(r.train);

        double t1 = now_s(), elapsed = t1 - t0;
        kiln_train_progress p = {.step = tr->st.step, .steps = o->steps, .loss = loss, .lr = lr, .grad_norm = res.grad_norm,
                                 .tok_per_s = (double)(o->grad_accum * GBT) / (t1 - ts), .elapsed_s = elapsed,
                                 .val_loss = NAN, .val_ppl = NAN, .n_skipped = tr->st.n_skipped, .n_params = tr->impl->m->n_params,
                                 .state_bytes = state_bytes(tr), .act_bytes = tr->impl->ops->act_bytes(tr->impl)};
        p.eta_s = elapsed / (double)(tr->st.step - first_step) * (double)(o->steps - tr->st.step);
        bool out_of_time = (o->time_budget_s > 0 && elapsed >= o->time_budget_s) || (o->stop_after > 0 && tr->st.step >= o->stop_after) ||
                           (o->cancel && __atomic_load_n(o->cancel, __ATOMIC_RELAXED)); /* a stop asked by another thread */
        if (o->time_budget_s > 0 && (s = tr->impl->ops->agree(tr->impl, &out_of_time))) break; /* rank 0's clock decides */
        bool last = tr->st.step == o->steps || out_of_time;
        out_failed = log_line(&r, "{\"step\": %lld, \"loss\": %.6f, \"lr\": %.6g, \"grad_norm\": %.6g, \"tok_s\": %.1f, \"elapsed_s\": %.3f%s}\n",
                              (long long)tr->st.step, loss, lr, res.grad_norm, p.tok_per_s, elapsed, res.skipped ? ", \"skipped\": true" : "");
        bool ckpt = o->ckpt_path && (last || (o->ckpt_interval > 0 && tr->st.step % o->ckpt_interval == 0));
        if (!out_failed && ckpt && (out_failed = kiln_trainer_save(tr, o->ckpt_path)) && world > 1) s = out_failed;
        if (out_failed) break;
        p.checkpoint = ckpt;
        if (progress) progress(user, &(kiln_progress){.stage = "train", .done = p.step, .total = p.steps, .metric = loss, .train = &p});

        if (r.val && (last || (o->eval_interval > 0 && tr->st.step % o->eval_interval == 0))) {
            double vl;
            if ((s = evaluate(&r, &vl))) break;
            p.val_loss = vl;
            p.val_ppl = exp(vl);
            if ((out_failed = log_line(&r, "{\"step\": %lld, \"val_loss\": %.6f, \"val_ppl\": %.4f}\n", (long long)tr->st.step, vl,
                                       p.val_ppl)))
                break;
            if (o->out_path && o->out_best && vl < best_val) {
                best_val = vl;
                if ((s = kiln_trainer_export(tr, o->out_path))) break;
                exported = true;
            }
            if (progress) progress(user, &(kiln_progress){.stage = "eval", .done = p.step, .total = p.steps, .metric = vl, .train = &p});
        }
        if (out_of_time) break;
    }
    if (!s && !out_failed) out_failed = log_close(&r);
    if (!s && out_failed) {
        s = o->out_best && exported ? out_failed : export_after_failure(tr, o, out_failed, kiln_last_error());
    } else if (!s && o->out_path && !(o->out_best && exported)) {
        /* with out_best the export is the best evaluated model; without a validation split, the last one */
        s = kiln_trainer_export(tr, o->out_path);
    }
    /* a run that skipped most of its steps learned little and is likely diverging: the caller must not take it as done */
    const int64_t ran = tr ? tr->st.step - first_step : 0, skipped = tr ? tr->st.n_skipped - skipped0 : 0;
    if (!s && ran > 0 && 2 * skipped > ran)
        s = kiln_fail(KILN_ERR_RANGE, "train: %lld of the run's %lld steps were skipped (a non-finite loss, gradient or updated weight); "
                      "the outputs hold the last finite weights", (long long)skipped, (long long)ran);
    run_free(&r, s != KILN_OK);
    return s;
}
