/* data.h: token shards and the loader that feeds training batches from them.
 *
 * A shard file (DIR/train_000.bin, DIR/train_001.bin, ..., DIR/val_000.bin) is a 64-byte little-endian header
 *   u32 magic "KSHD" (0x4448534b), u32 version (1), u64 tokenizer fingerprint, u64 token count,
 *   u32 bytes per token (2 or 4), u32 vocab size, then zeros to byte 64,
 * followed by the tokens (uint16 when the vocab fits, else uint32). The fingerprint is a 64-bit hash of the
 * tokenizer's tokens, token types and merges (kiln_tokenizer_fingerprint), so a loader can refuse shards made
 * by another tokenizer before the first step: the specification's vocab fingerprint preflight. */
#ifndef KILN_TRAIN_DATA_H
#define KILN_TRAIN_DATA_H

#include "kiln.h"

#define KILN_SHARD_MAGIC 0x4448534bu
#define KILN_SHARD_VERSION 1
#define KILN_SHARD_HEADER 64

typedef struct kiln_loader kiln_loader;

/* Opens the shards of split ("train" or "val") in dir, SPLIT_000.bin upwards to the first missing index,
 * checking each header (magic, version, bytes per token, token count against the file size: KILN_ERR_FORMAT
 * naming the file), that each fingerprint equals `fingerprint` (a mismatch is KILN_ERR_INVALID naming the shard
 * and both fingerprints) and that every token is < n_vocab (KILN_ERR_RANGE naming the file, token and index).
 * No shard is KILN_ERR_NOT_FOUND. The shards are mmapped. */
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
