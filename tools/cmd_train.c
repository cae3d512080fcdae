/* cmd_train.c: `kiln train`, the CLI over kiln_train_run (src/train/train.c). It parses the options, prints a
 * progress line per step and the validation results to stderr, and exits 1 with a one-line error. */
#include "kiln.h"
#include "cuda/cuda.h"
#include "tools/cmd.h"
#include "tools/launch.h"
#include "train/train.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void usage(void) {
    fprintf(stderr,
            "usage: kiln train --data DIR [-t TOKENIZER.gguf] [--init-from MODEL.gguf | --resume CKPT.gguf]\n"
            "  model (new):   [-V VOCAB] [-C WIDTH] [-L LAYERS] [--heads NH] [--kv-heads NKV] [-F FFN] [--rope-base B] [--tied]\n"
            "  batch:         [-B SEQS] [-T TOKENS] [--accum N]\n"
            "  length:        [--steps N] [--time SECONDS] [--stop-after STEP] (the schedule spans --steps)\n"
            "  optimizer:     [--lr LR] [--min-lr LR] [--warmup N] [--schedule cosine|linear|constant]\n"
            "                 [--optim adamw|adamw8bit] [--wd W] [--clip C] [--beta1 B] [--beta2 B]\n"
            "  precision:     [--mixed] (bf16 compute mirror of fp32 master weights)\n"
            "  device:        [--gpu [--deterministic] [--recompute]] (CUDA device 0: bf16 matmuls, fp32 master weights\n"
            "                 and AdamW; --deterministic: the same bits every run, so a resume repeats an uninterrupted run;\n"
            "                 --recompute: recompute norm and SwiGLU outputs in the backward, ~26%% less activation memory)\n"
            "                 [--nproc N [--zero1]] (N processes, one per GPU, data parallel over NCCL, -B sequences each;\n"
            "                 --zero1 shards the AdamW moments over the ranks)\n"
            "  loss:          [--label-smoothing E] [--z-loss Z]\n"
            "  eval, output:  [--eval-every N] [--eval-batches N] [--ckpt PATH] [--ckpt-every N] [-o OUT.gguf] [--out-best]\n"
            "                 [--log LOG.jsonl] [--name NAME] [--seed S] [-j THREADS]\n");
}

static void fmt_time(char *buf, size_t n, double s) {
    if (!(s >= 0) || s > 1e7) snprintf(buf, n, "?");
    else if (s >= 3600) snprintf(buf, n, "%dh%02dm", (int)(s / 3600), (int)(s / 60) % 60);
    else if (s >= 60) snprintf(buf, n, "%dm%02ds", (int)(s / 60), (int)s % 60);
    else snprintf(buf, n, "%.0fs", s);
}

static void on_progress(void *user, const kiln_train_progress *p) {
    bool *first = user;
    if (*first) {
        *first = false;
        fprintf(stderr, "train: %lld parameters; state %.1f MB (%.1f bytes/param); activations %.1f MB\n", (long long)p->n_params,
                (double)p->state_bytes / 1e6, (double)p->state_bytes / (double)p->n_params, (double)p->act_bytes / 1e6);
    }
    char eta[32], el[32];
    fmt_time(eta, sizeof eta, p->eta_s);
    fmt_time(el, sizeof el, p->elapsed_s);
    if (!isnan(p->val_loss)) {
        fprintf(stderr, "step %lld/%lld | val loss %.4f | val ppl %.2f\n", (long long)p->step, (long long)p->steps, p->val_loss,
                p->val_ppl);
        return;
    }
    fprintf(stderr, "step %lld/%lld | loss %.4f | lr %.2e | grad norm %.3f | %.0f tok/s | %s elapsed | ETA %s%s%s\n",
            (long long)p->step, (long long)p->steps, p->loss, p->lr, p->grad_norm, p->tok_per_s, el, eta,
            p->n_skipped ? " | skipped steps " : "", p->checkpoint ? " | checkpoint" : "");
}

/* `kiln train --nproc N`: this executable run as N ranks (tools/launch.h) with the same arguments less
 * "--nproc N" (argv[nproc_at], argv[nproc_at + 1]); a rank that fails stops the others. */
int kiln_cmd_train(int argc, char **argv) {
    kiln_train_opts o = kiln_train_defaults();
    o.cfg.n_embd = 256, o.cfg.n_layer = 4, o.cfg.n_head = 8, o.cfg.n_head_kv = 4, o.cfg.n_ff = 704;
    bool warmup_set = false, min_lr_set = false;
    int nproc_at = -1; /* the index of --nproc in argv */
    double nproc = 1;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define OPT(name) (strcmp(a, name) == 0 && v && ++i)
        if (OPT("--data")) o.data_dir = v;
        else if (OPT("-t") || (strcmp(a, "--tokenizer") == 0 && v && ++i)) o.tokenizer = v;
        else if (OPT("--init-from")) o.init_from = v;
        else if (OPT("--resume")) o.resume = v;
        else if (OPT("-V")) o.cfg.n_vocab = atoll(v);
        else if (OPT("-C")) o.cfg.n_embd = atoll(v);
        else if (OPT("-L")) o.cfg.n_layer = atoll(v);
        else if (OPT("--heads")) o.cfg.n_head = atoll(v);
        else if (OPT("--kv-heads")) o.cfg.n_head_kv = atoll(v);
        else if (OPT("-F")) o.cfg.n_ff = atoll(v);
        else if (OPT("--rope-base")) o.cfg.rope_base = (float)atof(v);
        else if (OPT("-B")) o.B = atoll(v);
        else if (OPT("-T")) o.T = atoll(v);
        else if (OPT("--accum")) o.grad_accum = atoll(v);
        else if (OPT("--steps")) o.steps = atoll(v);
        else if (OPT("--time")) o.time_budget_s = atof(v);
        else if (OPT("--stop-after")) o.stop_after = atoll(v);
        else if (OPT("--lr")) o.lr.lr = (float)atof(v);
        else if (OPT("--min-lr")) o.lr.min_lr = (float)atof(v), min_lr_set = true;
        else if (OPT("--warmup")) o.lr.warmup = atoll(v), warmup_set = true;
        else if (OPT("--schedule")) {
            if (strcmp(v, "cosine") == 0) o.lr.decay = KILN_LR_COSINE;
            else if (strcmp(v, "linear") == 0) o.lr.decay = KILN_LR_LINEAR;
            else if (strcmp(v, "constant") == 0) o.lr.decay = KILN_LR_CONSTANT;
            else {
                fprintf(stderr, "kiln: train: unknown schedule '%s' (cosine, linear, constant)\n", v);
                return 1;
            }
        } else if (OPT("--optim")) {
            if (strcmp(v, "adamw") == 0) o.adam.eight_bit = false;
            else if (strcmp(v, "adamw8bit") == 0) o.adam.eight_bit = true;
            else {
                fprintf(stderr, "kiln: train: unknown optimizer '%s' (adamw, adamw8bit)\n", v);
                return 1;
            }
        } else if (OPT("--nproc")) {
            if (!kiln_cli_parse_num("train", "--nproc", v, 1, 4096, &nproc)) return 1;
            if (nproc != (int)nproc) {
                fprintf(stderr, "kiln: train: --nproc needs a whole number of processes, got '%s'\n", v);
                return 1;
            }
            nproc_at = i - 1;
        } else if (OPT("--wd")) o.adam.weight_decay = (float)atof(v);
        else if (OPT("--clip")) o.adam.grad_clip = (float)atof(v);
        else if (OPT("--beta1")) o.adam.beta1 = (float)atof(v);
        else if (OPT("--beta2")) o.adam.beta2 = (float)atof(v);
        else if (strcmp(a, "--mixed") == 0) o.mixed = true;
        else if (strcmp(a, "--gpu") == 0) o.gpu = true;
        else if (strcmp(a, "--deterministic") == 0) o.deterministic = true;
        else if (strcmp(a, "--recompute") == 0) o.recompute = true;
        else if (strcmp(a, "--zero1") == 0) o.zero1 = true;
        else if (strcmp(a, "--tied") == 0) o.cfg.tied = true;
        else if (OPT("--label-smoothing")) o.label_smoothing = (float)atof(v);
        else if (OPT("--z-loss")) o.z_loss = (float)atof(v);
        else if (OPT("--eval-every")) o.eval_interval = atoll(v);
        else if (OPT("--eval-batches")) o.eval_batches = atoll(v);
        else if (OPT("--ckpt")) o.ckpt_path = v;
        else if (OPT("--ckpt-every")) o.ckpt_interval = atoll(v);
        else if (OPT("-o")) o.out_path = v;
        else if (strcmp(a, "--out-best") == 0) o.out_best = true;
        else if (OPT("--log")) o.log_path = v;
        else if (OPT("--name")) o.name = v;
        else if (OPT("--seed")) o.seed = strtoull(v, NULL, 10);
        else if (OPT("-j") || (strcmp(a, "--threads") == 0 && v && ++i)) o.n_threads = atoi(v);
        else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage();
            return 0;
        } else {
            fprintf(stderr, "kiln: train: unknown or incomplete option '%s'\n", a);
            usage();
            return 1;
        }
#undef OPT
    }
    if (!o.data_dir) {
        fprintf(stderr, "kiln: train: --data DIR is required (shards from kiln data)\n");
        return 1;
    }
    /* the launcher; its ranks (KILN_RANK set) train, whatever --nproc says */
    if (nproc > 1 && !getenv("KILN_RANK")) {
        if (!o.gpu) { /* said before N processes start, each to say it */
            fprintf(stderr, "kiln: train: --nproc %d trains on %d GPUs: add --gpu\n", (int)nproc, (int)nproc);
            return 1;
        }
        const int n_dev = kiln_cuda_device_count();
        if (n_dev < (int)nproc) {
            fprintf(stderr, "kiln: train: --nproc %d needs %d GPUs; this machine has %d\n", (int)nproc, (int)nproc, n_dev);
            return 1;
        }
        const char *cmd[] = {"train"};
        const kiln_status ls = kiln_launch_self(cmd, 1, argc, argv, nproc_at, (int)nproc);
        return ls ? kiln_cli_die(ls) : 0;
    }
    o.lr.total = o.steps;
    if (!warmup_set) o.lr.warmup = o.steps / 10;
    if (!min_lr_set) o.lr.min_lr = o.lr.lr / 10;
    bool first = true;
    kiln_status s = kiln_train_run(&o, on_progress, &first);
    if (s) return kiln_cli_die(s);
    if (o.out_path && !(getenv("KILN_RANK") && atoi(getenv("KILN_RANK")) != 0)) fprintf(stderr, "train: wrote %s\n", o.out_path);
    return 0;
}
