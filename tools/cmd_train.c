/* cmd_train.c: `kiln train`, the CLI over kiln.h's kiln_train_run. It parses the options, prints a progress line
 * per step and the validation results to stderr, and exits 1 with a one-line error. */
#include "kiln.h"
#include "tools/cmd.h"
#include "tools/launch.h"

#include <math.h>
#include <stddef.h>
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
            "                 and AdamW; --deterministic: the same bits every run, so a resume repeats an uninterrupted run\n"
            "                 (on a Hopper GPU at head size 64 every run is: that attention backward is also the faster);\n"
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

static void on_progress(void *user, const kiln_progress *pr) {
    const kiln_train_progress *p = pr->train;
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

/* True when argument *i is the option `name` and has a value, which it steps over. */
static bool opt(int argc, char **argv, int *i, const char *name) {
    if (strcmp(argv[*i], name) != 0 || *i + 1 >= argc) return false;
    ++*i;
    return true;
}

/* A numeric flag of kiln train: where its value goes and the range kiln_cli_parse_num/_int enforce. */
typedef enum { NUM_I64, NUM_INT, NUM_F32, NUM_F64 } num_kind;
typedef struct num_flag {
    const char *name, *alt;
    num_kind kind;
    double lo, hi;
    size_t at; /* offsetof in kiln_train_opts */
    bool below_hi; /* the range is [lo, hi): hi itself is refused */
} num_flag;

#define AT(f) offsetof(kiln_train_opts, f)
/* Wide ranges (nothing plausible is refused) that keep out what no run means: a negative clip or time, smoothing
 * past 1, warmup or steps beyond 1e12 (the library checks the same, and warmup against the steps). */
static const num_flag num_flags[] = {
    {"-V", NULL, NUM_I64, 0, 1 << 24, AT(dims.n_vocab), false},
    {"-C", NULL, NUM_I64, 1, 1 << 16, AT(dims.n_embd), false},
    {"-L", NULL, NUM_I64, 1, 1024, AT(dims.n_layer), false},
    {"--heads", NULL, NUM_I64, 1, 4096, AT(dims.n_head), false},
    {"--kv-heads", NULL, NUM_I64, 1, 4096, AT(dims.n_head_kv), false},
    {"-F", NULL, NUM_I64, 1, 1 << 20, AT(dims.n_ff), false},
    {"--rope-base", NULL, NUM_F32, 1, 1e12, AT(dims.rope_base), false},
    {"-B", NULL, NUM_I64, 1, 1 << 20, AT(B), false},
    {"-T", NULL, NUM_I64, 2, 1 << 20, AT(T), false},
    {"--accum", NULL, NUM_I64, 1, 1 << 20, AT(grad_accum), false},
    {"--steps", NULL, NUM_I64, 1, 1e12, AT(steps), false},
    {"--time", NULL, NUM_F64, 0, 1e10, AT(time_budget_s), false},
    {"--stop-after", NULL, NUM_I64, 0, 1e12, AT(stop_after), false},
    {"--lr", NULL, NUM_F32, 0, 10, AT(lr.lr), false},
    {"--min-lr", NULL, NUM_F32, 0, 10, AT(lr.min_lr), false},
    {"--warmup", NULL, NUM_I64, 0, 1e12, AT(lr.warmup), false},
    {"--wd", NULL, NUM_F32, 0, 10, AT(adam.weight_decay), false},
    {"--clip", NULL, NUM_F32, 0, 1e30, AT(adam.grad_clip), false},
    {"--beta1", NULL, NUM_F32, 0, 1, AT(adam.beta1), true},
    {"--beta2", NULL, NUM_F32, 0, 1, AT(adam.beta2), true},
    {"--label-smoothing", NULL, NUM_F32, 0, 1, AT(label_smoothing), true},
    {"--z-loss", NULL, NUM_F32, 0, 10, AT(z_loss), false},
    {"--eval-every", NULL, NUM_I64, 0, 1e12, AT(eval_interval), false},
    {"--eval-batches", NULL, NUM_I64, 0, 1e9, AT(eval_batches), false},
    {"--ckpt-every", NULL, NUM_I64, 0, 1e12, AT(ckpt_interval), false},
    {"-j", "--threads", NUM_INT, 0, 4096, AT(n_threads), false},
};
#undef AT

/* When argument *i is a numeric flag with a value, parses it into o (stepping over the value): 1 parsed, -1 after
 * printing why the value is bad, 0 when it is no numeric flag. */
static int num_opt(int argc, char **argv, int *i, kiln_train_opts *o) {
    for (size_t k = 0; k < sizeof num_flags / sizeof num_flags[0]; k++) {
        const num_flag *f = &num_flags[k];
        if (!opt(argc, argv, i, f->name) && !(f->alt && opt(argc, argv, i, f->alt))) continue;
        const char *v = argv[*i];
        char *dst = (char *)o + f->at;
        if (f->kind == NUM_I64 || f->kind == NUM_INT) {
            int64_t n;
            if (!kiln_cli_parse_int("train", argv[*i - 1], v, (int64_t)f->lo, (int64_t)f->hi, &n)) return -1;
            if (f->kind == NUM_I64) memcpy(dst, &n, sizeof n);
            else *(int *)(void *)dst = (int)n;
            return 1;
        }
        double x;
        if (!kiln_cli_parse_num("train", argv[*i - 1], v, f->lo, f->hi, &x)) return -1;
        if (f->below_hi && x >= f->hi) {
            fprintf(stderr, "kiln: train: %s needs a number in [%g, %g), got '", argv[*i - 1], f->lo, f->hi);
            kiln_cli_put_escaped(stderr, v);
            fputs("'\n", stderr);
            return -1;
        }
        if (f->kind == NUM_F32) *(float *)(void *)dst = (float)x;
        else *(double *)(void *)dst = x;
        return 1;
    }
    return 0;
}

/* `kiln train --nproc N`: this executable run as N ranks (tools/launch.h) with the same arguments less
 * "--nproc N" (argv[nproc_at], argv[nproc_at + 1]); a rank that fails stops the others. */
int kiln_cmd_train(int argc, char **argv) {
    kiln_train_opts o = kiln_train_defaults();
    o.dims.n_embd = 256, o.dims.n_layer = 4, o.dims.n_head = 8, o.dims.n_head_kv = 4, o.dims.n_ff = 704;
    bool warmup_set = false, min_lr_set = false;
    int nproc_at = -1; /* the index of --nproc in argv */
    int64_t nproc = 1;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        const int num = strcmp(a, "--") == 0 ? 0 : num_opt(argc, argv, &i, &o);
        if (num < 0) return 1;
        if (num > 0) {
            warmup_set |= strcmp(a, "--warmup") == 0;
            min_lr_set |= strcmp(a, "--min-lr") == 0;
            continue;
        }
        if (strcmp(a, "--") == 0) {
            if (i + 1 < argc) {
                fprintf(stderr, "kiln: train: unexpected argument '");
                kiln_cli_put_escaped(stderr, argv[i + 1]);
                fputs("' (kiln train takes options only)\n", stderr);
                return 1;
            }
            break;
        }
        if (opt(argc, argv, &i, "--data")) o.data_dir = v;
        else if (opt(argc, argv, &i, "-t") || opt(argc, argv, &i, "--tokenizer")) o.tokenizer = v;
        else if (opt(argc, argv, &i, "--init-from")) o.init_from = v;
        else if (opt(argc, argv, &i, "--resume")) o.resume = v;
        else if (opt(argc, argv, &i, "--schedule")) {
            if (strcmp(v, "cosine") == 0) o.lr.decay = KILN_LR_COSINE;
            else if (strcmp(v, "linear") == 0) o.lr.decay = KILN_LR_LINEAR;
            else if (strcmp(v, "constant") == 0) o.lr.decay = KILN_LR_CONSTANT;
            else {
                fprintf(stderr, "kiln: train: unknown schedule '");
                kiln_cli_put_escaped(stderr, v);
                fputs("' (cosine, linear, constant)\n", stderr);
                return 1;
            }
        } else if (opt(argc, argv, &i, "--optim")) {
            if (strcmp(v, "adamw") == 0) o.adam.eight_bit = false;
            else if (strcmp(v, "adamw8bit") == 0) o.adam.eight_bit = true;
            else {
                fprintf(stderr, "kiln: train: unknown optimizer '");
                kiln_cli_put_escaped(stderr, v);
                fputs("' (adamw, adamw8bit)\n", stderr);
                return 1;
            }
        } else if (opt(argc, argv, &i, "--nproc")) {
            if (!kiln_cli_parse_int("train", "--nproc", v, 1, 4096, &nproc)) return 1;
            nproc_at = i - 1;
        } else if (strcmp(a, "--mixed") == 0) o.mixed = true;
        else if (strcmp(a, "--gpu") == 0) o.device = (kiln_device){KILN_DEVICE_CUDA, 0};
        else if (strcmp(a, "--deterministic") == 0) o.deterministic = true;
        else if (strcmp(a, "--recompute") == 0) o.recompute = true;
        else if (strcmp(a, "--zero1") == 0) o.zero1 = true;
        else if (strcmp(a, "--tied") == 0) o.dims.tied = true;
        else if (opt(argc, argv, &i, "--ckpt")) o.ckpt_path = v;
        else if (opt(argc, argv, &i, "-o")) o.out_path = v;
        else if (strcmp(a, "--out-best") == 0) o.out_best = true;
        else if (opt(argc, argv, &i, "--log")) o.log_path = v;
        else if (opt(argc, argv, &i, "--name")) o.name = v;
        else if (opt(argc, argv, &i, "--seed")) {
            if (!kiln_cli_parse_u64("train", "--seed", v, &o.seed)) return 1;
        } else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage();
            return 0;
        } else {
            fprintf(stderr, "kiln: train: unknown or incomplete option '");
            kiln_cli_put_escaped(stderr, a);
            fputs("'\n", stderr);
            usage();
            return 1;
        }
    }
    if (!o.data_dir) {
        fprintf(stderr, "kiln: train: --data DIR is required (shards from kiln data)\n");
        return 1;
    }
    /* the launcher; its ranks (KILN_RANK set) train, whatever --nproc says */
    if (nproc > 1 && !getenv("KILN_RANK")) {
        if (o.device.kind != KILN_DEVICE_CUDA) { /* said before N processes start, each to say it */
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
    if (o.lr.warmup > o.steps) {
        fprintf(stderr, "kiln: train: --warmup %lld is longer than the run's %lld steps\n", (long long)o.lr.warmup, (long long)o.steps);
        return 1;
    }
    if (o.lr.decay != KILN_LR_CONSTANT && o.lr.min_lr > o.lr.lr) {
        fprintf(stderr, "kiln: train: --min-lr %g is above --lr %g\n", (double)o.lr.min_lr, (double)o.lr.lr);
        return 1;
    }
    bool first = true;
    kiln_status s = kiln_train_run(&o, on_progress, &first);
    if (s) return kiln_cli_die(s);
    if (o.out_path && !(getenv("KILN_RANK") && atoi(getenv("KILN_RANK")) != 0)) fprintf(stderr, "train: wrote %s\n", o.out_path);
    return 0;
}
