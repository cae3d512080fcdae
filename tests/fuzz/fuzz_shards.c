/* fuzz_shards.c: libFuzzer harness for the shard manifest and the shard loader (src/train/data.c,
 * `make fuzz-shards FUZZ_SECONDS=N`). Each input is used three ways:
 *   1. parsed as a manifest from memory (kiln_manifest_parse);
 *   2. written as DIR/manifest.txt beside one fixed valid shard, and the folder opened with the loader (the
 *      manifest's checks against the folder: counts, names, sizes, hashes, unlisted files);
 *   3. written as DIR/train_000.bin with a manifest that lists it truthfully (its size and hash), so the loader's
 *      header and token checks see arbitrary bytes; when it opens, batches are read across the wrap.
 * A failure must be a status with a message, never a crash or a read outside a mapping (ASan). Inputs that
 * crash land in tests/fuzz/crashes/. */
#include "train/data.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[64];

static void put(const char *name, const void *p, size_t n) {
    char path[128];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, n, f) != n || fclose(f) != 0) __builtin_trap();
}

static void put_le(unsigned char *p, uint64_t v, int n) {
    for (int i = 0; i < n; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* The fixed shard of mode 2: 8 tokens of fingerprint 42, vocab 1000. */
static unsigned char valid[KILN_SHARD_HEADER + 16];

static void remove_dir(void) {
    char path[128];
    snprintf(path, sizeof path, "%s/manifest.txt", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/train_000.bin", dir);
    unlink(path);
    rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    snprintf(dir, sizeof dir, "/tmp/kiln-fuzz-shards-XXXXXX");
    if (!mkdtemp(dir)) __builtin_trap();
    atexit(remove_dir);
    put_le(valid, KILN_SHARD_MAGIC, 4);
    put_le(valid + 4, KILN_SHARD_VERSION, 4);
    put_le(valid + 8, 42, 8);
    put_le(valid + 16, 8, 8);
    put_le(valid + 24, 2, 4);
    put_le(valid + 28, 1000, 4);
    for (int i = 0; i < 8; i++) put_le(valid + KILN_SHARD_HEADER + 2 * i, (uint64_t)(i * 97), 2);
    return 0;
}

/* Opens the folder's train split and, when it opens, reads batches through it. */
static void load(void) {
    kiln_loader *l;
    if (kiln_loader_open(dir, "train", 42, 1 << 20, &l) != KILN_OK) {
        if (!kiln_last_error()[0]) __builtin_trap(); /* every refusal says why */
        return;
    }
    int64_t n = kiln_loader_n_tokens(l);
    if (n < 1) __builtin_trap();
    int32_t in[3 * 8], tg[3 * 8];
    int64_t T = n - 1 < 8 ? n - 1 : 8;
    if (T >= 1) {
        if (kiln_loader_next(l, 3, T, in, tg) != KILN_OK) __builtin_trap();
        for (int64_t i = 0; i < 3 * T; i++)
            if (in[i] < 0 || in[i] >= 1 << 20 || tg[i] < 0 || tg[i] >= 1 << 20) __builtin_trap();
        if (kiln_loader_set_pos(l, n - 1) != KILN_OK || kiln_loader_next(l, 1, T, in, tg) != KILN_OK) __builtin_trap();
    }
    kiln_loader_free(l);
}

/* The token count a shard's header says (bytes 16..23), 0 when there is no header. */
static unsigned long long header_count(const uint8_t *p, size_t n) {
    unsigned long long v = 0;
    for (int i = 7; i >= 0 && n >= 24; i--) v = v << 8 | p[16 + i];
    return v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kiln_manifest m;
    if (kiln_manifest_parse((const char *)data, size, "fuzz", &m) == KILN_OK) {
        for (int i = 0; i < m.n_train + m.n_val; i++)
            if (m.shards[i].n_tokens < 0) __builtin_trap();
        kiln_manifest_free(&m);
    }

    put("manifest.txt", data, size);
    put("train_000.bin", valid, sizeof valid);
    load();

    put("train_000.bin", data, size);
    char text[256];
    int n = snprintf(text, sizeof text, "kiln-shards 1\nfingerprint %016llx\nshards 1 0\ntrain_000.bin %llu %zu %016llx\nend\n", 42ull,
                     header_count(data, size),
                     size, (unsigned long long)kiln_shard_hash(data, size));
    put("manifest.txt", text, (size_t)n);
    load();
    return 0;
}
