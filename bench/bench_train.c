/* bench_train.c: `kiln bench train`, CPU training throughput. A llama config (the peer script's "small" or
 * "124m", or kiln's bundled "tiny") with random weights trains on random tokens for a few steps: forward,
 * loss, backward and an AdamW step, timed per step after warm-up. Reported: tokens/s, achieved GFLOP/s with
 * llm.c's 6N + 6LCT FLOPs per token (N without the embedding, which is a lookup), peak RSS, and the training
 * state in bytes per parameter (master, mirror, gradients, moments) beside the activation memory per token.
 *
 * The peer, with --peer PYTHON: bench/bench_train_torch.py, the same model in PyTorch on the CPU with the same
 * threads (it imports ../shared/bench/torch_llama_train.py's model), run in this process's run and compared.
 *
 * --gpu trains on CUDA device 0 (src/cuda/trainer.cu) and reports MFU against H200 dense bf16's 989 TFLOP/s as
 * llm.c counts it, and the fraction of the bf16 GEMM rate measured in the same run (the training matmul at
 * 8192^3). With --peer PYTHON its peer, ../shared/bench/torch_llama_train.py --compile (--peer-script to point
 * elsewhere) with the same config, B and T, runs after kiln's steps in the same process run, and the ratio is
 * reported; --max-batch adds the largest B the trainer accepts at this T; --recompute trains with activation
 * recomputation (KILN_CUDA_TRAIN_RECOMPUTE). --nproc N (issue #9) measures one GPU, then N ranks (one process per
 * GPU, -B sequences each, data parallel over NCCL; --zero1 shards the moments) and reports the global tokens/s and
 * the per-GPU efficiency against the one-GPU figure; with --peer, PyTorch DDP on as many GPUs
 * (bench/torch_ddp_train.py) is the peer, and the one-GPU peer gives its efficiency.
 *
 * Both devices are driven through the trainer interface (src/train/trainer.h) that `kiln train` uses; the file stays
 * on the internal headers for that interface, the CUDA flags and the GEMM roof's kernel. */
#include "bench/bench.h"
#include "tools/cli.h"
#include "train/trainer.h"
#include "cuda/cuda.h"
#include "cuda/dist.h"
#include "train/rendezvous.h"
#include "tools/launch.h"
#include "status.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

typedef struct bench_config {
    const char *name;
    int64_t V, C, L, NH, NKV, F, T;
} bench_config;

static const bench_config configs[] = {
    {"tiny", 4096, 256, 4, 8, 4, 704, 256},     /* the bundled default model's shape */
    {"small", 16384, 384, 6, 6, 2, 1024, 512},  /* ../shared/bench/torch_llama_train.py "small" */
    {"124m", 32000, 768, 12, 12, 4, 2048, 1024},/* its "124m" */
    {"350m", 32000, 1024, 24, 16, 4, 2816, 1024},/* its "350m" */
};

/* Runs a peer's command line and reads its JSON line: tokens_per_s (NAN when it fails) and the torch version. */
static double run_peer(const char *cmd, char *ver, size_t nver) {
    FILE *p = popen(cmd, "r");
    if (!p) return NAN;
    char line[4096];
    double tok = NAN;
    while (fgets(line, sizeof line, p)) {
        const char *k = strstr(line, "\"tokens_per_s\":");
        if (k) tok = atof(k + 15);
        const char *v = strstr(line, "\"torch\": \"");
        if (v) snprintf(ver, nver, "%.*s", (int)strcspn(v + 10, "\""), v + 10);
    }
    return pclose(p) == 0 ? tok : NAN;
}

static double peer_tok_s(const char *python, const bench_config *c, int64_t B, int64_t T, int steps, int threads, char *ver, size_t nver) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s bench/bench_train_torch.py --config %s --B %lld --T %lld --steps %d --threads %d", python, c->name,
             (long long)B, (long long)T, steps, threads);
    return run_peer(cmd, ver, nver);
}

/* The GPU peer: ../shared/bench/torch_llama_train.py (or `script`) --compile with the same config, B and T, run
 * by this process after kiln's own steps, so both figures come from one command on one machine. */
static double peer_gpu_tok_s(const char *python, const char *script, const bench_config *c, int64_t B, int64_t T, char *ver,
                             size_t nver) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s %s --config %s --B %lld --T %lld --compile", python, script, c->name, (long long)B, (long long)T);
    return run_peer(cmd, ver, nver);
}

/* The data-parallel peer: bench/torch_ddp_train.py (PyTorch DDP over NCCL, the one-GPU peer's model and step,
 * --compile) on nproc GPUs through torch.distributed.run, B x T rows per GPU: its global tokens/s. */
static double peer_ddp_tok_s(const char *python, const char *script, const bench_config *c, int64_t B, int64_t T, int nproc) {
    char cmd[1536], ver[64];
    snprintf(cmd, sizeof cmd, "%s -m torch.distributed.run --standalone --nproc_per_node %d bench/torch_ddp_train.py --model-script %s "
             "--config %s --B %lld --T %lld --compile", python, nproc, script, c->name, (long long)B, (long long)T);
    return run_peer(cmd, ver, sizeof ver);
}

#ifdef KILN_CUDA
#include "cuda/train_kernels.h"
/* The GEMM roof of this device, measured in this run: the training matmul (cuBLASLt, bf16 in and out, fp32
 * accumulate) at 8192^3 on values in [-1, 1), best of 3 rounds of 10 after warm-up. TFLOP/s, or NAN. */
static double measure_gemm_tflops(void) {
    const int64_t n = 8192;
    const size_t bytes = (size_t)(n * n) * 2;
    void *a = NULL, *w = NULL, *y = NULL;
    kiln_cuda_blas *b = NULL;
    uint16_t *h = malloc(bytes);
    double best = 1e30;
    if (h && !kiln_cuda_alloc(&a, bytes) && !kiln_cuda_alloc(&w, bytes) && !kiln_cuda_alloc(&y, bytes) && !kiln_cuda_blas_new(&b)) {
        uint64_t r = 7;
        for (int64_t i = 0; i < n * n; i++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            float f = (float)((double)(r >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
            uint32_t u;
            memcpy(&u, &f, 4);
            h[i] = (uint16_t)(u >> 16);
        }
        bool ok = !kiln_cuda_upload(a, h, bytes) && !kiln_cuda_upload(w, h, bytes);
        for (int round = -1; ok && round < 3; round++) {
            const double t0 = kiln_bench_now();
            for (int i = 0; ok && i < 10; i++) ok = !kiln_cuda_linear_forward_train(b, y, false, false, a, w, n, n, n, NULL);
            ok = ok && !kiln_cuda_sync();
            const double t = (kiln_bench_now() - t0) / 10;
            if (round >= 0 && t < best) best = t;
        }
        if (!ok) best = 1e30;
    }
    kiln_cuda_blas_free(b);
    kiln_cuda_free(a), kiln_cuda_free(w), kiln_cuda_free(y);
    free(h);
    return best < 1e30 ? 2.0 * (double)n * (double)n * (double)n / best * 1e-12 : NAN;
}
#else
static double measure_gemm_tflops(void) { return NAN; }
#endif

/* The largest B (at this T) the GPU trainer accepts: kiln_cuda_trainer_new refuses a batch whose buffers exceed the
 * free memory before it allocates anything, so each probe is cheap. Doubling, then bisection. */
static int64_t largest_batch(const kiln_llama_config *mc, const kiln_trainer_cfg *tc) {
    kiln_trainer_cfg probe = *tc;
    kiln_trainer_impl *g = NULL;
    int64_t lo = 0, hi = 1;
    for (;; hi *= 2) {
        probe.B = hi;
        if (kiln_trainer_cuda_new(mc, &probe, &g) != KILN_OK) break;
        kiln_trainer_impl_free(g);
        lo = hi;
        if (hi >= 65535) return lo;
    }
    while (hi - lo > 1) {
        probe.B = lo + (hi - lo) / 2;
        if (kiln_trainer_cuda_new(mc, &probe, &g) == KILN_OK) kiln_trainer_impl_free(g), lo = probe.B;
        else hi = probe.B;
    }
    return lo;
}

/* Times steps optimizer steps of trainer g at lr on random tokens (seeded by rank, so the ranks of a data-parallel
 * run see different rows): t (steps) seconds each after `warmups` untimed ones (on the GPU: cuBLASLt plans,
 * first-touch allocations), *loss the last step's mean (over every rank's rows). */
static kiln_status time_steps(kiln_trainer_impl *g, const bench_config *c, int64_t B, int64_t T, int world, int rank, int warmups,
                              float lr, int steps, double *t, double *loss) {
    int32_t *in = malloc((size_t)(B * T) * sizeof *in), *tg = malloc((size_t)(B * T) * sizeof *tg);
    kiln_status s = in && tg ? KILN_OK : kiln_fail(KILN_ERR_NOMEM, "out of memory");
    uint64_t r = 42 + (uint64_t)rank;
    for (int64_t i = 0; !s && i < B * T; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        in[i] = (int32_t)((r >> 33) % (uint64_t)c->V);
        tg[i] = (int32_t)((r >> 13) % (uint64_t)c->V);
    }
    const float scale = 1.0f / (float)(B * T * world);
    for (int i = -warmups; !s && i < steps; i++) {
        double t0 = kiln_bench_now();
        int64_t k;
        kiln_adamw_result res;
        g->ops->reduce_next(g); /* data parallel: the gradient's sum overlaps the backward */
        if (!(s = g->ops->zero_grads(g)) && !(s = g->ops->step(g, in, tg, scale, loss, &k)))
            s = g->ops->optimizer_step(g, lr, &res); /* it synchronizes: the step is done */
        *loss /= (double)(B * T * world);
        if (i >= 0) t[i] = kiln_bench_now() - t0;
    }
    free(in), free(tg);
    return s;
}

/* --gpu: the same steps on the GPU trainer, then the PyTorch peer when python is given. *tok_out and *peer_out
 * (either may be NULL) get kiln's and the peer's tokens/s. */
static int bench_gpu(const bench_config *c, const kiln_llama_config *mc, const kiln_trainer_cfg *tc, int steps, const char *python,
                     const char *script, bool max_batch, double *tok_out, double *peer_out) {
    const int64_t B = tc->B, T = tc->T;
    const unsigned flags = tc->cuda_flags;
    kiln_trainer_impl *g = NULL;
    kiln_status s = kiln_trainer_cuda_new(mc, tc, &g);
    double *t = malloc((size_t)steps * sizeof *t), loss = 0;
    if (!s && !t) s = kiln_fail(KILN_ERR_NOMEM, "out of memory");
    if (!s) s = kiln_trainer_load_random(g, 1);
    if (!s) s = time_steps(g, c, B, T, 1, 0, 2, 3e-4f, steps, t, &loss);
    const size_t bytes = g ? g->ops->act_bytes(g) : 0;
    const int64_t n_params = g ? g->m->n_params : 0, n_embd = g ? g->m->tensors[g->m->tok_embd].n : 0;
    kiln_trainer_impl_free(g);
    if (!s) {
        const int64_t bmax = max_batch ? largest_batch(mc, tc) : 0;
        const double roof = measure_gemm_tflops();
        char ver[64] = "";
        const double peer = python ? peer_gpu_tok_s(python, script, c, B, T, ver, sizeof ver) : NAN;
        double med = kiln_bench_median(t, steps), tok_s = (double)(B * T) / med;
        double n_mat = (double)(n_params - n_embd);
        double flops_tok = 6 * n_mat + 6.0 * (double)(c->L * T * c->C), tflops = tok_s * flops_tok * 1e-12;
        char dev[128] = "";
        kiln_cuda_device_describe(dev, sizeof dev);
        char j[4][32];
        printf("{\"bench\": \"train_gpu\", \"device\": \"%s\", \"config\": \"%s\", \"optim\": \"%s\", \"recompute\": %s, \"B\": %lld, \"T\": %lld, \"params\": %lld, "
               "\"loss\": %.4f, \"ms_per_step\": %.2f, \"tokens_per_s\": %.0f, \"tflops\": %.1f, \"mfu\": %.4f, \"peak_tflops\": 989, "
               "\"gemm_tflops\": %s, \"of_gemm\": %s, \"gpu_bytes\": %zu, \"largest_B\": %lld, \"peer\": \"pytorch %s torch.compile (%s)\", \"peer_tokens_per_s\": %s, "
               "\"ratio\": %s}\n",
               dev, c->name, tc->adam.eight_bit ? "adamw8bit" : "adamw", (flags & KILN_CUDA_TRAIN_RECOMPUTE) ? "true" : "false", (long long)B, (long long)T, (long long)n_params, loss, med * 1e3, tok_s, tflops, tflops / 989.0,
               kiln_bench_json_num(j[0], 32, roof, 1), kiln_bench_json_num(j[1], 32, tflops / roof, 3), bytes, (long long)bmax, ver,
               python ? script : "not run", kiln_bench_json_num(j[2], 32, peer, 0), kiln_bench_json_num(j[3], 32, tok_s / peer, 3));
        char peer_cell[32] = "-", ratio_cell[32] = "-"; /* no peer run: a dash, not nan */
        if (isfinite(peer)) snprintf(peer_cell, sizeof peer_cell, "%.0f", peer), snprintf(ratio_cell, sizeof ratio_cell, "%.2fx", tok_s / peer);
        printf("\n| config | B x T | params | ms/step | tok/s | TFLOP/s | MFU (989) | of measured GEMM | GPU memory | largest B | "
               "PyTorch compiled tok/s | ratio |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n"
               "| %s%s | %lld x %lld | %.1fM | %.2f | %.0f | %.1f | %.1f%% | %.1f%% of %.0f | %.2f GiB | %lld | %s | %s |\n",
               c->name, tc->adam.eight_bit ? " (8-bit AdamW)" : "", (long long)B, (long long)T, (double)n_params / 1e6, med * 1e3, tok_s, tflops, 100 * tflops / 989.0,
               100 * tflops / roof, roof, (double)bytes / 1073741824.0, (long long)bmax, peer_cell, ratio_cell);
        if (tok_out) *tok_out = tok_s;
        if (peer_out) *peer_out = peer;
    }
    free(t);
    return s ? kiln_cli_die(s) : 0;
}

/* A rank of `bench train --gpu --nproc N` (issue #9): B x T rows per GPU, the gradient summed over the ranks in
 * buckets during the backward (or ZeRO-1); rank 0 reports the global tokens/s and the per-GPU efficiency against
 * the one-GPU figure the launcher measured first (KILN_BENCH_BASE_TOK_S), beside the peer's (PyTorch DDP on as
 * many GPUs, KILN_BENCH_PEER_TOK_S, and its one-GPU figure, KILN_BENCH_PEER_BASE_TOK_S). Frees m and pool. */
static int bench_gpu_rank(const bench_config *c, const kiln_llama_config *mc, const kiln_trainer_cfg *tc_in, int steps) {
    const int64_t B = tc_in->B, T = tc_in->T;
    const unsigned flags = tc_in->cuda_flags;
    kiln_trainer_cfg tc = *tc_in;
    kiln_rank_info ri;
    kiln_dist *d = NULL;
    kiln_trainer_impl *g = NULL;
    double *t = malloc((size_t)steps * sizeof *t), loss = 0;
    kiln_status s = t ? kiln_rank_from_env(&ri) : kiln_fail(KILN_ERR_NOMEM, "out of memory");
    if (!s) s = kiln_dist_join(&ri, 300.0, &d);
    tc.dist = d;
    if (!s) s = kiln_trainer_cuda_new(mc, &tc, &g);
    if (!s) s = kiln_trainer_load_random(g, 1);
    if (!s) s = time_steps(g, c, B, T, ri.world, ri.rank, 2, 3e-4f, steps, t, &loss);
    const size_t bytes = g ? g->ops->act_bytes(g) : 0;
    const int64_t n_params = g ? g->m->n_params : 0, n_embd = g ? g->m->tensors[g->m->tok_embd].n : 0;
    if (s) kiln_dist_abort(d), d = NULL; /* before the trainer's free, which waits for the device */
    kiln_trainer_impl_free(g);
    if (!s && ri.rank == 0) {
        const double med = kiln_bench_median(t, steps), tok_s = (double)(B * T * ri.world) / med;
        const char *base_s = getenv("KILN_BENCH_BASE_TOK_S"), *peer_s = getenv("KILN_BENCH_PEER_TOK_S");
        const char *peer_base_s = getenv("KILN_BENCH_PEER_BASE_TOK_S");
        const double base = base_s ? atof(base_s) : NAN, eff = tok_s / ((double)ri.world * base);
        const double peer = peer_s ? atof(peer_s) : NAN, peer_base = peer_base_s ? atof(peer_base_s) : NAN;
        const double peer_eff = peer / ((double)ri.world * peer_base);
        const double n_mat = (double)(n_params - n_embd);
        const double tflops = tok_s * (6 * n_mat + 6.0 * (double)(c->L * T * c->C)) * 1e-12;
        char j[6][32];
        printf("{\"bench\": \"train_gpu_dp\", \"config\": \"%s\", \"gpus\": %d, \"zero1\": %s, \"B_per_gpu\": %lld, \"T\": %lld, "
               "\"loss\": %.4f, \"ms_per_step\": %.2f, \"tokens_per_s\": %.0f, \"tflops\": %.1f, \"mfu_per_gpu\": %.4f, "
               "\"one_gpu_tokens_per_s\": %s, \"efficiency\": %s, \"gpu_bytes_per_rank\": %zu, \"peer\": \"pytorch DDP torch.compile%s\", "
               "\"peer_tokens_per_s\": %s, \"peer_one_gpu_tokens_per_s\": %s, \"peer_efficiency\": %s, \"ratio\": %s}\n",
               c->name, ri.world, (flags & KILN_CUDA_TRAIN_ZERO1) ? "true" : "false", (long long)B, (long long)T, loss, med * 1e3, tok_s,
               tflops, tflops / ri.world / 989.0, kiln_bench_json_num(j[0], 32, base, 0), kiln_bench_json_num(j[1], 32, eff, 3), bytes,
               isfinite(peer) ? "" : " (not run)", kiln_bench_json_num(j[2], 32, peer, 0), kiln_bench_json_num(j[3], 32, peer_base, 0),
               kiln_bench_json_num(j[4], 32, peer_eff, 3), kiln_bench_json_num(j[5], 32, tok_s / peer, 3));
        printf("\n| config | GPUs | B x T per GPU | ZeRO-1 | ms/step | tok/s | per GPU | one GPU | efficiency | GPU memory per rank | "
               "PyTorch DDP tok/s | its efficiency | ratio |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
               "| %s | %d | %lld x %lld | %s | %.2f | %.0f | %.0f | %.0f | %.1f%% | %.2f GiB | %.0f | %.1f%% | %.2fx |\n",
               c->name, ri.world, (long long)B, (long long)T, (flags & KILN_CUDA_TRAIN_ZERO1) ? "yes" : "no", med * 1e3, tok_s,
               tok_s / ri.world, base, 100 * eff, (double)bytes / 1073741824.0, peer, 100 * peer_eff, tok_s / peer);
    }
    kiln_dist_free(d);
    free(t);
    return s ? kiln_cli_die(s) : 0;
}

/* The CPU: the same steps on the CPU trainer (kiln_llama_train and kiln_adamw), then the PyTorch peer when python
 * is given. */
static int bench_cpu(const bench_config *c, const kiln_llama_config *mc, const kiln_trainer_cfg *tc, int steps, int threads,
                     const char *python) {
    const int64_t B = tc->B, T = tc->T;
    const bool mixed = tc->mixed, eight_bit = tc->adam.eight_bit;
    kiln_trainer_impl *g = NULL;
    double *t = malloc((size_t)steps * sizeof *t), loss = 0;
    kiln_status s = t ? kiln_trainer_cpu_new(mc, tc, &g) : kiln_fail(KILN_ERR_NOMEM, "out of memory");
    if (!s) s = kiln_trainer_load_random(g, 1);
    if (!s) s = time_steps(g, c, B, T, 1, 0, 1, 1e-4f, steps, t, &loss); /* one warm-up step */
    if (s) {
        kiln_trainer_impl_free(g);
        free(t);
        return kiln_cli_die(s);
    }
    const kiln_llama_train *m = g->m;
    const size_t act_bytes = g->ops->act_bytes(g);
    double best = t[0];
    for (int i = 1; i < steps; i++) best = t[i] < best ? t[i] : best;
    double med = kiln_bench_median(t, steps);
    double tok_s = (double)(B * T) / med;
    double n_mat = (double)(m->n_params - m->tensors[m->tok_embd].n); /* padding is < 16 floats a tensor */
    double flops_tok = 6 * n_mat + 6.0 * (double)(c->L * T * c->C);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double n = (double)m->n_params;
    double moments = eight_bit ? 2 + 8.0 / KILN_ADAMW8_BLOCK : 8;
    double bpp = 4 + (mixed ? 2 : 0) + 4 + moments;
    char ver[64] = "";
    double peer = python ? peer_tok_s(python, c, B, T, steps, threads, ver, sizeof ver) : NAN;

    char jp[32], jr[32];
    printf("{\"bench\": \"train\", \"config\": \"%s\", \"B\": %lld, \"T\": %lld, \"threads\": %d, \"mixed\": %s, \"optim\": \"%s\", "
           "\"params\": %lld, \"loss\": %.4f, \"ms_per_step\": %.1f, \"ms_best\": %.1f, \"tokens_per_s\": %.1f, \"gflops\": %.2f, "
           "\"peak_rss_mb\": %.1f, \"state_bytes_per_param\": %.2f, \"activation_bytes_per_token\": %.0f, "
           "\"peer\": \"pytorch-cpu %s\", \"peer_tokens_per_s\": %s, \"ratio\": %s}\n",
           c->name, (long long)B, (long long)T, threads, mixed ? "true" : "false", eight_bit ? "adamw8bit" : "adamw",
           (long long)m->n_params, loss, med * 1e3, best * 1e3, tok_s, tok_s * flops_tok * 1e-9, (double)ru.ru_maxrss / 1024, bpp,
           (double)act_bytes / (double)(B * T), python ? ver : "(not run)", kiln_bench_json_num(jp, sizeof jp, peer, 1),
           kiln_bench_json_num(jr, sizeof jr, tok_s / peer, 3));
    printf("\n| config | B x T | threads | params | ms/step | tok/s | GFLOP/s | peer tok/s | ratio | peak RSS | state B/param | act B/token |\n"
           "|---|---|---|---|---|---|---|---|---|---|---|---|\n"
           "| %s%s%s | %lld x %lld | %d | %.2fM | %.1f | %.0f | %.1f | %.0f | %.2f | %.0f MB | %.1f | %.0f |\n",
           c->name, mixed ? " bf16" : "", eight_bit ? " 8bit" : "", (long long)B, (long long)T, threads, n / 1e6, med * 1e3, tok_s,
           tok_s * flops_tok * 1e-9, peer, tok_s / peer, (double)ru.ru_maxrss / 1024, bpp, (double)act_bytes / (double)(B * T));
    free(t);
    kiln_trainer_impl_free(g);
    return 0;
}

int kiln_bench_train(int argc, char **argv) {
    const char *cfg_name = "tiny", *python = NULL, *script = "../shared/bench/torch_llama_train.py";
    bool max_batch = false, recompute = false, zero1 = false;
    int nproc = 1, nproc_at = -1;
    int64_t B = 8, T = 0;
    int threads = 0, steps = 5;
    bool mixed = false, eight_bit = false, gpu = false;
    const char *who = "bench train";
    /* the valueless options, then those with a value: a string, or an integer in [lo, hi] (int64_t or int) */
    const struct { const char *name; bool *flag; } flags[] = {
        {"--mixed", &mixed}, {"--8bit", &eight_bit}, {"--gpu", &gpu}, {"--max-batch", &max_batch}, {"--recompute", &recompute},
        {"--zero1", &zero1},
    };
    const struct { const char *name; const char **str; int64_t *i64; int *i32; int64_t lo, hi; } opts[] = {
        {"--config", &cfg_name, NULL, NULL, 0, 0}, {"--peer", &python, NULL, NULL, 0, 0},
        {"--peer-script", &script, NULL, NULL, 0, 0},
        {"-B", NULL, &B, NULL, 1, INT32_MAX},            {"-T", NULL, &T, NULL, 0, INT32_MAX},
        {"-t", NULL, NULL, &threads, 0, 4096},           {"--steps", NULL, NULL, &steps, 1, 1000000},
        {"--nproc", NULL, NULL, &nproc, 1, 4096},
    };
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v;
        if (strcmp(a, "--") == 0) { /* ends the options; bench train takes no other argument */
            if (i + 1 < argc) return kiln_cli_error("%s: unexpected argument '%s'", who, argv[i + 1]);
            break;
        }
        size_t f = 0, o = 0;
        while (f < sizeof flags / sizeof flags[0] && strcmp(a, flags[f].name) != 0) f++;
        while (o < sizeof opts / sizeof opts[0] && strcmp(a, opts[o].name) != 0) o++;
        if (f < sizeof flags / sizeof flags[0]) *flags[f].flag = true;
        else if (o == sizeof opts / sizeof opts[0]) {
            return kiln_cli_error("%s: %s '%s' (usage: kiln bench train [--config tiny|small|124m|350m] [-B B] [-T T] "
                                  "[-t THREADS] [--steps N] [--mixed] [--8bit] [--peer PYTHON] [--gpu [--peer-script PY] "
                                  "[--max-batch] [--recompute] [--nproc N [--zero1]]])",
                                  who, kiln_cli_is_option(a) ? "unknown option" : "unexpected argument", a);
        } else {
            if (strcmp(a, "--nproc") == 0) nproc_at = i; /* the ranks run without it */
            int64_t n;
            if (!(v = kiln_cli_value(who, argc, argv, &i))) return 1;
            if (opts[o].str) *opts[o].str = v;
            else if (!kiln_cli_parse_int(who, a, v, opts[o].lo, opts[o].hi, &n)) return 1;
            else if (opts[o].i64) *opts[o].i64 = n;
            else *opts[o].i32 = (int)n;
        }
    }
    const bench_config *c = NULL;
    for (size_t i = 0; i < sizeof configs / sizeof configs[0]; i++)
        if (strcmp(configs[i].name, cfg_name) == 0) c = &configs[i];
    if (!c) return kiln_cli_error("%s: unknown config '%s' (tiny, small, 124m, 350m)", who, cfg_name);
    if (T <= 0) T = c->T;
    kiln_llama_config mc = {.n_vocab = c->V, .n_embd = c->C, .n_layer = c->L, .n_head = c->NH, .n_head_kv = c->NKV,
                            .n_ff = c->F, .n_ctx_train = T, .rope_base = 10000.0f, .rms_eps = 1e-5f};
    kiln_pool *pool;
    kiln_status s = kiln_pool_create(threads, &pool);
    if (s) return kiln_cli_die(s);
    threads = kiln_pool_size(pool);
    kiln_trainer_cfg tc = {.mixed = mixed, .adam = kiln_adamw_defaults(), .B = B, .T = T, .pool = pool,
                           .cuda_flags = (recompute ? KILN_CUDA_TRAIN_RECOMPUTE : 0u) | (zero1 ? KILN_CUDA_TRAIN_ZERO1 : 0u)};
    tc.adam.eight_bit = eight_bit;
    int rc = -1;
    if (gpu && getenv("KILN_RANK")) rc = bench_gpu_rank(c, &mc, &tc, steps); /* a rank (its --nproc is gone) */
    else if (nproc > 1 && !gpu) {
        fprintf(stderr, "kiln: bench train: --nproc %d measures data-parallel training on GPUs: add --gpu\n", nproc);
        rc = 1;
    } else if (gpu && nproc > 1) { /* one GPU first (its own report), then the ranks, which compare with it */
        if (kiln_cuda_device_count() < nproc) {
            fprintf(stderr, "kiln: bench train: --nproc %d needs %d GPUs; this machine has %d\n", nproc, nproc, kiln_cuda_device_count());
            rc = 1;
        } else {
            double base = NAN, peer_base = NAN;
            kiln_trainer_cfg one = tc;
            one.cuda_flags &= ~KILN_CUDA_TRAIN_ZERO1;
            rc = bench_gpu(c, &mc, &one, steps, python, script, false, &base, &peer_base);
            if (!rc) {
                const double peer = python ? peer_ddp_tok_s(python, script, c, B, T, nproc) : NAN;
                const char *const names[3] = {"KILN_BENCH_BASE_TOK_S", "KILN_BENCH_PEER_TOK_S", "KILN_BENCH_PEER_BASE_TOK_S"};
                const double vals[3] = {base, peer, peer_base};
                for (int k = 0; k < 3; k++) {
                    char buf[64];
                    snprintf(buf, sizeof buf, "%.1f", vals[k]);
                    setenv(names[k], buf, 1);
                }
                const char *cmd[] = {"bench", "train"};
                const kiln_status ls = kiln_launch_self(cmd, 2, argc, argv, nproc_at, nproc);
                rc = ls ? kiln_cli_die(ls) : 0;
            }
        }
    } else if (gpu)
        rc = bench_gpu(c, &mc, &tc, steps, python, script, max_batch, NULL, NULL);
    if (rc >= 0) {
        kiln_pool_free(pool);
        return rc;
    }
    rc = bench_cpu(c, &mc, &tc, steps, threads, python);
    kiln_pool_free(pool);
    return rc;
}
