/* fuzz_checkpoint.c: libFuzzer harness for the checkpoint loader (`make fuzz-ckpt FUZZ_SECONDS=N`).
 * Each input is written to a temp file (the loader maps a path) and resumed by kiln_train_load_checkpoint with
 * fp32 and with 8-bit AdamW, through the same reader and validation a `kiln train --resume` uses: the GGUF, the
 * llama config, the run's keys, the weights and the moments. A load either fails with a message or yields a state
 * whose every weight and moment is finite (what resume promises), else the harness traps. The corpus is seeded by
 * LLVMFuzzerInitialize with tiny real checkpoints (fp32 and 8-bit) when KILN_FUZZ_SEED_DIR names a folder. */
#include "kiln.h"
#include "train/llama_train.h"
#include "train/optim.h"
#include "train/trainer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char path[64];

/* A tiny model's checkpoint into dir/seed-NAME.gguf. */
static void write_seed(const char *dir, bool eight_bit) {
    kiln_llama_config c = {.n_vocab = 16, .n_embd = 8, .n_layer = 1, .n_head = 2, .n_head_kv = 1, .n_ff = 16, .n_ctx_train = 8,
                           .rope_base = 10000.0f, .rms_eps = 1e-5f};
    kiln_llama_train *m;
    if (kiln_llama_train_new(&c, false, &m) != KILN_OK) return;
    kiln_llama_train_init_random(m, 7);
    kiln_param_segment *segs = malloc((size_t)m->n_tensors * sizeof *segs);
    kiln_adamw_cfg cfg = kiln_adamw_defaults();
    cfg.eight_bit = eight_bit;
    kiln_adamw opt;
    if (segs) {
        kiln_train_segments(m, segs);
        if (kiln_adamw_init(&opt, &cfg, m->n_params, segs, m->n_tensors) == KILN_OK) {
            float *g = calloc((size_t)m->n_params, sizeof *g);
            for (int64_t i = 0; g && i < m->n_params; i++) g[i] = (float)((i * 37) % 11) * 0.01f - 0.05f;
            if (g) kiln_adamw_step(&opt, NULL, m->params, g, NULL, 1e-3f); /* nonzero moments */
            free(g);
            kiln_train_state st = {.step = 1, .tokens_seen = 16, .data_pos = 16, .seed = 7, .B = 2, .T = 8, .world = 1};
            char out[4096];
            snprintf(out, sizeof out, "%s/seed-%s.gguf", dir, eight_bit ? "adamw8bit" : "adamw");
            if (kiln_train_save(m, NULL, "seed", &opt, &st, out) != KILN_OK) fprintf(stderr, "seed: %s\n", kiln_last_error());
            kiln_adamw_free(&opt);
        }
    }
    free(segs);
    kiln_llama_train_free(m);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    snprintf(path, sizeof path, "/tmp/kiln-fuzz-ckpt-%d.gguf", (int)getpid());
    const char *dir = getenv("KILN_FUZZ_SEED_DIR");
    if (dir && *dir) write_seed(dir, false), write_seed(dir, true);
    return 0;
}

static bool all_finite(const float *x, int64_t n, bool nonneg) {
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i]) || (nonneg && x[i] < 0)) return false;
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    const bool ok = fwrite(data, 1, size, f) == size;
    if (fclose(f) != 0 || !ok) return 0;
    for (int eight = 0; eight < 2; eight++) {
        kiln_adamw_cfg cfg = kiln_adamw_defaults();
        cfg.eight_bit = eight;
        kiln_llama_train *m = NULL;
        kiln_adamw opt;
        kiln_train_state st;
        if (kiln_train_load_checkpoint(path, false, &cfg, &m, &opt, &st) != KILN_OK) {
            if (strchr(kiln_last_error(), '\n')) __builtin_trap(); /* errors are one line */
            continue;
        }
        const int64_t n = m->n_params, nb = (n + KILN_ADAMW8_BLOCK - 1) / KILN_ADAMW8_BLOCK;
        bool good = all_finite(m->params, n, false) && st.step >= 0 && st.B >= 1 && st.T >= 2;
        if (eight) good = good && all_finite(opt.m_scale, nb, true) && all_finite(opt.v_scale, nb, true);
        else good = good && all_finite(opt.m, n, false) && all_finite(opt.v, n, true);
        if (!good) __builtin_trap();
        kiln_adamw_free(&opt);
        kiln_llama_train_free(m);
    }
    unlink(path);
    return 0;
}
