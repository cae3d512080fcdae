/* data.h: token shards, their manifest and the loader that feeds training batches from them.
 *
 * A shard file (DIR/train_000.bin, DIR/train_001.bin, ..., DIR/val_000.bin) is a 64-byte little-endian header
 *   u32 magic "KSHD" (0x4448534b), u32 version (1), u64 tokenizer fingerprint, u64 token count,
 *   u32 bytes per token (2 or 4), u32 vocab size, then zeros to byte 64,
 * followed by the tokens (uint16 when the vocab fits, else uint32). The fingerprint is a 64-bit hash of the
 * tokenizer's tokens, token types and merges (kiln_tokenizer_fingerprint), so a loader can refuse shards made
 * by another tokenizer before the first step: the specification's vocab fingerprint preflight.
 *
 * The manifest, DIR/manifest.txt, is what makes a folder whole: kiln data writes it last, atomically, so a run
 * stopped early (a full disk, a kill) leaves a folder without one, which the loader refuses. It is ASCII, every
 * line ending in '\n', fields separated by one space, numbers decimal without sign or leading zeros:
 *   kiln-shards 1
 *   fingerprint HHHHHHHHHHHHHHHH          the tokenizer's, 16 lowercase hex digits
 *   shards NTRAIN NVAL
 *   train_000.bin TOKENS BYTES HASH       one line a shard: train_000 .. train_{NTRAIN-1}, then val_000 ..
 *   ...
 *   end
 * HASH is kiln_shard_hash of the whole file (header and tokens), 16 lowercase hex digits. */
#ifndef KILN_TRAIN_DATA_H
#define KILN_TRAIN_DATA_H

#include "kiln.h"

#define KILN_SHARD_MAGIC 0x4448534bu
#define KILN_SHARD_VERSION 1
#define KILN_SHARD_HEADER 64
#define KILN_MANIFEST_NAME "manifest.txt"
#define KILN_MANIFEST_VERSION 1
#define KILN_MANIFEST_MAX_SHARDS 1000000 /* of a split: 100M tokens each is 10^14 tokens, far past any corpus */

/* A 64-bit hash of n bytes: four lanes over 32-byte blocks of little-endian 64-bit words (so the multiplies of
 * one block overlap: several GB/s), each lane h = rotl(h ^ w * K1, 31) * K2, the lanes, the tail and the length
 * folded together, then splitmix64's finalizer. Not cryptographic: it catches a changed, truncated or swapped
 * shard, not an adversary. */
uint64_t kiln_shard_hash(const void *p, size_t n);

typedef struct kiln_manifest_shard {
    int64_t n_tokens;
    uint64_t size, hash; /* the file's bytes and their kiln_shard_hash */
} kiln_manifest_shard;

typedef struct kiln_manifest {
    uint64_t fingerprint;
    int n_train, n_val;
    kiln_manifest_shard *shards; /* (n_train + n_val) train's first, each split in index order */
} kiln_manifest;

/* Parses a manifest's text (len bytes, not NUL-terminated). Every deviation from the layout above is
 * KILN_ERR_FORMAT naming path and the line. */
kiln_status kiln_manifest_parse(const char *text, size_t len, const char *path, kiln_manifest *out);
void kiln_manifest_free(kiln_manifest *m); /* accepts NULL and a zeroed manifest */

/* Opens path as the GGUF a training tokenizer comes from: the one check kiln data and kiln train share, so that
 * kiln data never writes shards kiln train then refuses. It must be a regular file in GGUF format (checkpoints and
 * the exported model copy its tokenizer.ggml.* keys); a llama2.c tokenizer.bin, which kiln_tokenizer_load_file
 * reads too, is KILN_ERR_UNSUPPORTED saying so. */
kiln_status kiln_data_tokenizer_gguf(const char *path, kiln_gguf **out);

typedef struct kiln_loader kiln_loader;

/* Opens the shards of split ("train" or "val") in dir as dir's manifest lists them. Refused, each error naming the
 * file: no manifest (KILN_ERR_NOT_FOUND), a malformed one or a manifest of another tokenizer (KILN_ERR_FORMAT,
 * KILN_ERR_INVALID), a listed shard missing, of another size or hash (KILN_ERR_FORMAT), a shard-named file
 * (train_N.bin, val_N.bin) the manifest does not list (KILN_ERR_FORMAT). Each shard's header is checked (magic,
 * version, bytes per token, token count against the file size and the manifest: KILN_ERR_FORMAT), that each
 * fingerprint equals `fingerprint` (a mismatch is KILN_ERR_INVALID naming the shard and both fingerprints) and that
 * every token is < n_vocab (KILN_ERR_RANGE naming the file, token and index). A split the manifest lists no shard
 * of is KILN_ERR_NOT_FOUND. The shards are mmapped. */
kiln_status kiln_loader_open(const char *dir, const char *split, uint64_t fingerprint, int64_t n_vocab, kiln_loader **out);
void kiln_loader_free(kiln_loader *l);
int64_t kiln_loader_n_tokens(const kiln_loader *l);
/* The next batch: B rows of T+1 consecutive tokens read sequentially through the concatenated shards
 * (wrapping to the start at the end); inputs (B*T) get tokens 0..T-1 of each row, targets (B*T) 1..T.
 * Consecutive rows advance by T tokens. Needs at least T+1 tokens in total. */
kiln_status kiln_loader_next(kiln_loader *l, int64_t B, int64_t T, int32_t *inputs, int32_t *targets);
/* The read position (token index into the concatenation), for checkpoints; set_pos restores it. */
int64_t kiln_loader_pos(const kiln_loader *l);
kiln_status kiln_loader_set_pos(kiln_loader *l, int64_t pos);

#endif
