/* train.c: the training loop. Each step zeroes the gradients, runs grad_accum micro-batches of B x T tokens
 * (forward, fused loss, backward), then one AdamW step at the schedule's learning rate; a non-finite loss or
 * gradient skips the update and is counted. Every eval_interval steps it scores eval_batches validation
 * batches (always from the start of the validation split, so evaluations compare); every ckpt_interval
 * steps it writes a checkpoint. Progress goes to a callback (the CLI prints it) and to a JSONL log.
 * tests/test_train.c runs it end to end: resume equals an uninterrupted run bit for bit.
 *
 * Data parallel (one process per GPU, tools/launch.h; issue #9): every rank reads the same global batch of
 * B x world sequences and trains on its own B of them, so the loss, the gradient (summed over the ranks by the
 * trainer) and every decision are the same on all ranks; rank 0 alone writes the log, checkpoints and exports,
 * but every rank takes part in the collectives those need. */
#include "train.h"
#include "cuda/cuda.h"
#include "cuda/dist.h"
#include "data.h"
#include "rendezvous.h"
#include "status.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

kiln_train_opts kiln_train_defaults(void) {
    kiln_train_opts o;
    memset(&o, 0, sizeof o);
    o.cfg.rope_base = 10000.0f;
    o.cfg.rms_eps = 1e-5f;
    o.B = 8;
    o.T = 256;
    o.grad_accum = 1;
    o.steps = 1000;
    o.lr = (kiln_lr_schedule){.lr = 1e-3f, .min_lr = 1e-4f, .warmup = 100, .total = 1000, .decay = KILN_LR_COSINE};
    o.adam = kiln_adamw_defaults();
    o.seed = 1337;
    o.eval_interval = 100;
    o.eval_batches = 20;
    return o;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* On resume, the log keeps only the lines up to the checkpoint's step, so it reads as one run. */
static kiln_status trim_log(const char *path, int64_t step) {
    FILE *f = fopen(path, "r");
    if (!f) return KILN_OK; /* no log yet */
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
    bool ok = fclose(o) == 0;
    if (!ok || rename(tmp, path) != 0) return kiln_fail(KILN_ERR_IO, "%s: cannot rewrite the log", path);
    return KILN_OK;
}

typedef struct run {
    const kiln_train_opts *o;
    kiln_cuda_trainer *gpu; /* with o->gpu: the model, its gradients and AdamW state on the GPU */
    kiln_pool *pool;
    kiln_gguf *tok_gguf;
    kiln_tokenizer *tok;
    kiln_llama_train *m;
    kiln_adamw opt;
    bool opt_ready;
    kiln_loader *train, *val;
    kiln_train_state st;
    int32_t *inputs, *targets; /* (grad_accum, world*B*T): the global batch */
    FILE *log;
    kiln_rank_info ri;         /* this process's rank (world 1: not distributed) */
    kiln_dist *dist;           /* world > 1: the NCCL communicator */
} run;

static void run_free(run *r, bool failed) {
    if (r->log) fclose(r->log);
    /* a failed rank aborts first: its peers' collectives fail instead of waiting for it, and its own unmatched
     * collective ends, so freeing the trainer's memory (which waits for the device) cannot block */
    if (failed) kiln_dist_abort(r->dist);
    else kiln_dist_free(r->dist);
    kiln_cuda_trainer_free(r->gpu);
    free(r->inputs);
    free(r->targets);
    kiln_loader_free(r->train);
    kiln_loader_free(r->val);
    if (r->opt_ready) kiln_adamw_free(&r->opt);
    kiln_llama_train_free(r->m);
    kiln_tokenizer_free(r->tok);
    kiln_gguf_close(r->tok_gguf);
    kiln_pool_free(r->pool);
}

/* The model and optimizer: resumed, fine-tuned from a GGUF, or new from dimensions. */
static kiln_status setup_model(run *r) {
    const kiln_train_opts *o = r->o;
    kiln_status s;
    if (o->resume) {
        if ((s = kiln_train_load_checkpoint(o->resume, o->mixed, &o->adam, &r->m, &r->opt, &r->st))) return s;
        r->opt_ready = true;
        /* The global batch (B per rank x ranks) and T fix the data order and the schedule, so they must stay; how the
         * batch is split over GPUs may change (2 ranks of B 8 resume as 4 of B 4, or 1 of B 16): the checkpoint holds
         * whole moments, which each rank shards again. */
        if (r->st.B * r->st.world != o->B * r->ri.world || r->st.T != o->T)
            return kiln_fail(KILN_ERR_INVALID, "%s: checkpoint was trained with a global batch of %lld sequences (%lld rank(s) x B=%lld) of "
                             "T=%lld; resume with the same (B x --nproc, T), not %lld x B=%lld of T=%lld", o->resume,
                             (long long)(r->st.B * r->st.world), (long long)r->st.world, (long long)r->st.B, (long long)r->st.T,
                             (long long)r->ri.world, (long long)o->B, (long long)o->T);
        r->st.B = o->B, r->st.world = r->ri.world; /* this run's split, for its checkpoints */
        return KILN_OK;
    }
    if (o->init_from) {
        kiln_model *src;
        if ((s = kiln_model_load(o->init_from, &src))) return s;
        s = kiln_llama_train_from_model(src, o->mixed, &r->m);
        kiln_model_free(src);
        if (s) return s;
    } else {
        kiln_llama_config c = o->cfg;
        if (c.n_vocab == 0) c.n_vocab = kiln_tokenizer_n_vocab(r->tok);
        c.n_ctx_train = o->T;
        if ((s = kiln_llama_train_new(&c, o->mixed, &r->m))) return s;
        kiln_llama_train_init_random(r->m, o->seed);
    }
    kiln_param_segment *segs = malloc((size_t)r->m->n_tensors * sizeof *segs);
    if (!segs) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    kiln_train_segments(r->m, segs);
    s = kiln_adamw_init(&r->opt, &o->adam, r->m->n_params, segs, r->m->n_tensors);
    free(segs);
    if (s) return s;
    r->opt_ready = true;
    r->st = (kiln_train_state){.seed = o->seed, .B = o->B, .T = o->T, .world = r->ri.world};
    return KILN_OK;
}

static kiln_status setup(run *r) {
    const kiln_train_opts *o = r->o;
    kiln_status s;
    if (o->B <= 0 || o->T <= 1 || o->grad_accum <= 0 || o->steps <= 0 || o->eval_batches < 0)
        return kiln_fail(KILN_ERR_INVALID, "B, steps and grad_accum must be positive and T at least 2");
    if (!o->data_dir) return kiln_fail(KILN_ERR_INVALID, "no data: pass the shard folder written by kiln data");
    const char *tok_path = o->tokenizer ? o->tokenizer : o->resume ? o->resume : o->init_from;
    if (!tok_path) return kiln_fail(KILN_ERR_INVALID, "a new model needs a tokenizer (-t TOKENIZER.gguf)");
    if ((s = kiln_pool_create(o->n_threads, &r->pool))) return s;
    if ((s = kiln_gguf_open(tok_path, &r->tok_gguf)) || (s = kiln_tokenizer_load_gguf(r->tok_gguf, &r->tok))) return s;
    if ((s = kiln_rank_from_env(&r->ri))) return s; /* before the model: a resume checks the checkpoint's world */
    if ((s = setup_model(r))) return s;
    kiln_llama_train *m = r->m;
    if (m->cfg.n_vocab < kiln_tokenizer_n_vocab(r->tok))
        return kiln_fail(KILN_ERR_INVALID, "the model's vocab (%lld) is smaller than the tokenizer's (%d)",
                         (long long)m->cfg.n_vocab, kiln_tokenizer_n_vocab(r->tok));
    if (o->T > m->cfg.n_ctx_train)
        return kiln_fail(KILN_ERR_INVALID, "T=%lld exceeds the model's context length %lld", (long long)o->T,
                         (long long)m->cfg.n_ctx_train);
    m->label_smoothing = o->label_smoothing;
    m->z_loss = o->z_loss;
    if (r->ri.world > 1) { /* the ranks meet: rank 0 makes the NCCL id and leaves it in the rendezvous folder */
        if (!o->gpu) return kiln_fail(KILN_ERR_INVALID, "rank %d of %d: data-parallel training runs on GPUs: add --gpu", r->ri.rank, r->ri.world);
        if ((s = kiln_dist_join(&r->ri, 300.0, &r->dist))) return s;
    }
    if (o->gpu) { /* the GPU holds the activations, gradients and moments; the host keeps the model for checkpoints */
        if (o->adam.eight_bit) return kiln_fail(KILN_ERR_UNSUPPORTED, "--gpu trains with fp32 AdamW; 8-bit moments are CPU-only for now");
        const unsigned flags = (o->deterministic ? KILN_CUDA_TRAIN_DETERMINISTIC : 0u) | (o->recompute ? KILN_CUDA_TRAIN_RECOMPUTE : 0u) |
                               (o->zero1 ? KILN_CUDA_TRAIN_ZERO1 : 0u);
        if ((s = kiln_cuda_trainer_new(m, o->B, o->T, flags, r->dist, &r->gpu))) return s;
        if (o->resume && (s = kiln_cuda_trainer_set_state(r->gpu, r->opt.m, r->opt.v, r->opt.step))) return s;
        m->act_bytes = kiln_cuda_trainer_bytes(r->gpu);
    } else if ((s = kiln_llama_train_reserve(m, o->B, o->T, kiln_pool_size(r->pool))))
        return s;

    /* the vocab fingerprint preflight: every shard must come from this tokenizer */
    uint64_t fp = kiln_tokenizer_fingerprint(r->tok);
    if ((s = kiln_loader_open(o->data_dir, "train", fp, m->cfg.n_vocab, &r->train))) return s;
    /* a missing validation split (KILN_ERR_NOT_FOUND) only turns evaluation off; a bad one is an error */
    if (o->eval_batches > 0 && (s = kiln_loader_open(o->data_dir, "val", fp, m->cfg.n_vocab, &r->val)) && s != KILN_ERR_NOT_FOUND)
        return s;
    if (o->resume && (s = kiln_loader_set_pos(r->train, r->st.data_pos))) return s;

    size_t n = (size_t)(o->grad_accum * o->B * r->ri.world * o->T);
    r->inputs = malloc(n * sizeof *r->inputs);
    r->targets = malloc(n * sizeof *r->targets);
    if (!r->inputs || !r->targets) return kiln_fail(KILN_ERR_NOMEM, "out of memory for batches");
    if (o->log_path && r->ri.rank == 0) {
        if (o->resume && (s = trim_log(o->log_path, r->st.step))) return s;
        r->log = fopen(o->log_path, o->resume ? "a" : "w");
        if (!r->log) return kiln_fail(KILN_ERR_IO, "%s: cannot open the log for writing", o->log_path);
    }
    return KILN_OK;
}

/* One micro-batch's forward, loss and (grad_scale != 0) backward, on the GPU or the CPU. */
static kiln_status train_step(run *r, const int32_t *inputs, const int32_t *targets, float grad_scale, double *loss_sum,
                              int64_t *counted) {
    if (r->gpu) return kiln_cuda_trainer_step(r->gpu, inputs, targets, grad_scale, loss_sum, counted);
    *loss_sum = kiln_llama_train_step(r->m, &kiln_cpu_ops, r->pool, inputs, targets, grad_scale, counted);
    return KILN_OK;
}

/* With --gpu, the device's weights, moments and counters into the host model and optimizer, for a checkpoint or
 * an export. */
static kiln_status sync_host(run *r) {
    if (!r->gpu) return KILN_OK;
    kiln_status s = kiln_cuda_trainer_get_state(r->gpu, r->m->params, r->opt.m, r->opt.v, &r->opt.step, &r->m->n_embed_skipped);
    if (!s) kiln_llama_train_refresh_mirror(r->m);
    r->st.n_embed_skipped = r->m->n_embed_skipped;
    return s;
}

/* Mean loss over eval_batches validation batches from the start of the split. */
static kiln_status evaluate(run *r, double *val_loss) {
    const kiln_train_opts *o = r->o;
    kiln_status s = kiln_loader_set_pos(r->val, 0);
    double sum = 0;
    int64_t count = 0;
    const int64_t own = (int64_t)r->ri.rank * o->B * o->T; /* this rank's rows of the global batch */
    for (int64_t i = 0; i < o->eval_batches && !s; i++) {
        if ((s = kiln_loader_next(r->val, o->B * r->ri.world, o->T, r->inputs, r->targets))) break;
        int64_t k;
        double l;
        if ((s = train_step(r, r->inputs + own, r->targets + own, 0.0f, &l, &k))) break;
        sum += l;
        count += k;
    }
    *val_loss = count ? sum / (double)count : NAN;
    return s;
}

static size_t state_bytes(const run *r) {
    size_t n = (size_t)r->m->n_params;
    size_t moments = r->o->adam.eight_bit ? 2 * n + 2 * sizeof(float) * (n / KILN_ADAMW8_BLOCK + 1) : 2 * n * sizeof(float);
    return n * sizeof(float) * 2 + (r->m->mirror ? n * 2 : 0) + moments;
}

kiln_status kiln_train_run(const kiln_train_opts *o, kiln_train_progress_fn progress, void *user) {
    run r = {.o = o};
    kiln_status s = setup(&r);
    kiln_llama_train *m = r.m;
    const int64_t BT = o->B * o->T, GBT = BT * r.ri.world; /* a micro-batch's rows: this rank's, all ranks' */
    const int64_t own = (int64_t)r.ri.rank * BT;
    const bool lead = r.ri.rank == 0; /* writes the log, checkpoints and exports, and reports progress */
    if (!lead) progress = NULL;
    kiln_lr_schedule sched = o->lr;
    if (sched.total <= 0) sched.total = o->steps;
    double t0 = now_s();
    int64_t first_step = r.st.step;
    double best_val = INFINITY;
    bool exported = false;
    while (!s && r.st.step < o->steps) {
        double ts = now_s();
        /* load every micro-batch first: the gradient is of the mean over all their counted targets */
        for (int64_t a = 0; a < o->grad_accum && !s; a++)
            s = kiln_loader_next(r.train, o->B * r.ri.world, o->T, r.inputs + a * GBT, r.targets + a * GBT);
        if (s) break;
        int64_t counted = kiln_count_targets(r.targets, o->grad_accum * GBT); /* over the global batch */
        if (r.gpu) s = kiln_cuda_trainer_zero_grads(r.gpu);
        else memset(m->grads, 0, (size_t)m->n_params * sizeof *m->grads);
        double loss_sum = 0;
        for (int64_t a = 0; a < o->grad_accum && !s; a++) {
            int64_t k;
            double l;
            if (r.gpu && a == o->grad_accum - 1) kiln_cuda_trainer_reduce_next(r.gpu); /* overlap the gradient's sum */
            s = train_step(&r, r.inputs + a * GBT + own, r.targets + a * GBT + own, counted ? 1.0f / (float)counted : 0.0f, &l, &k);
            loss_sum += l;
        }
        if (s) break;
        double loss = counted ? loss_sum / (double)counted : 0;
        float lr = kiln_lr_at(&sched, r.st.step);
        kiln_adamw_result res = {.grad_norm = NAN, .skipped = true};
        if (isfinite(loss) && r.gpu) {
            if ((s = kiln_cuda_trainer_adamw(r.gpu, &o->adam, lr, &res.grad_norm, &res.skipped))) break;
            if (res.skipped) r.opt.n_skipped++;
        } else if (isfinite(loss))
            res = kiln_adamw_step(&r.opt, r.pool, m->params, m->grads, m->mirror, lr);
        else
            r.opt.n_skipped++; /* the guard at the loss: nothing is updated */
        r.st.step++;
        r.st.tokens_seen += o->grad_accum * GBT;
        r.st.data_pos = kiln_loader_pos(r.train);
        r.st.n_embed_skipped = m->n_embed_skipped;

        double t1 = now_s(), elapsed = t1 - t0;
        kiln_train_progress p = {.step = r.st.step, .steps = o->steps, .loss = loss, .lr = lr, .grad_norm = res.grad_norm,
                                 .tok_per_s = (double)(o->grad_accum * GBT) / (t1 - ts), .elapsed_s = elapsed,
                                 .val_loss = NAN, .val_ppl = NAN, .n_skipped = r.opt.n_skipped, .n_params = m->n_params,
                                 .state_bytes = state_bytes(&r), .act_bytes = m->act_bytes};
        p.eta_s = elapsed / (double)(r.st.step - first_step) * (double)(o->steps - r.st.step);
        bool out_of_time = (o->time_budget_s > 0 && elapsed >= o->time_budget_s) || (o->stop_after > 0 && r.st.step >= o->stop_after);
        if (o->time_budget_s > 0 && r.gpu && (s = kiln_cuda_trainer_agree(r.gpu, &out_of_time))) break; /* rank 0's clock decides */
        bool last = r.st.step == o->steps || out_of_time;
        if (r.log) {
            fprintf(r.log, "{\"step\": %lld, \"loss\": %.6f, \"lr\": %.6g, \"grad_norm\": %.6g, \"tok_s\": %.1f, \"elapsed_s\": %.3f%s}\n",
                    (long long)r.st.step, loss, lr, res.grad_norm, p.tok_per_s, elapsed, res.skipped ? ", \"skipped\": true" : "");
            fflush(r.log);
        }
        bool ckpt = o->ckpt_path && (last || (o->ckpt_interval > 0 && r.st.step % o->ckpt_interval == 0));
        if (ckpt && ((s = sync_host(&r)) || (lead && (s = kiln_train_save(m, r.tok_gguf, o->name, &r.opt, &r.st, o->ckpt_path))))) break;
        p.checkpoint = ckpt;
        if (progress) progress(user, &p);

        if (r.val && (last || (o->eval_interval > 0 && r.st.step % o->eval_interval == 0))) {
            double vl;
            if ((s = evaluate(&r, &vl))) break;
            p.val_loss = vl;
            p.val_ppl = exp(vl);
            if (r.log) {
                fprintf(r.log, "{\"step\": %lld, \"val_loss\": %.6f, \"val_ppl\": %.4f}\n", (long long)r.st.step, vl, p.val_ppl);
                fflush(r.log);
            }
            if (o->out_path && o->out_best && vl < best_val) {
                best_val = vl;
                if ((s = sync_host(&r)) || (lead && (s = kiln_train_save(m, r.tok_gguf, o->name, NULL, NULL, o->out_path)))) break;
                exported = true;
            }
            if (progress) progress(user, &p);
        }
        if (out_of_time) break;
    }
    /* with out_best the export is the best evaluated model; without a validation split, the last one */
    if (!s && o->out_path && !(o->out_best && exported) && !(s = sync_host(&r)) && lead)
        s = kiln_train_save(m, r.tok_gguf, o->name, NULL, NULL, o->out_path);
    run_free(&r, s != KILN_OK);
    return s;
}
