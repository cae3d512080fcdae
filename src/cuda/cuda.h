/* cuda.h: the C seam of kiln's CUDA backend (the .cu files of src/cuda, compiled by nvcc for CUDA_ARCH + PTX).
 * Built without nvcc, none.c supplies the same functions answering KILN_ERR_UNSUPPORTED, so callers and
 * tests need no #ifdefs. Kernels are checked against the scalar CPU reference by tests/test_cuda.c,
 * which skips with a reason on a machine without a GPU. */
#ifndef KILN_CUDA_H
#define KILN_CUDA_H

#include "kiln.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Usable CUDA devices: 0 when built without CUDA, without a driver, or without a GPU. */
int kiln_cuda_device_count(void);
/* KILN_OK when the current device (0, or the one kiln_dist_init chose) can run this build's kernels: its compute
 * capability is at least the CUDA_ARCH they were built for. Otherwise KILN_ERR_UNSUPPORTED naming the device, its
 * capability and the make CUDA_ARCH=sm_XX that fits it; also without a device. The engine and trainer call it
 * first. */
kiln_status kiln_cuda_check_device(void);
/* "NVIDIA H200, sm_90, 139.8 GiB" into buf. */
kiln_status kiln_cuda_device_describe(char *buf, size_t n);
/* Dequantizes k elements of type t (a whole number of blocks) on the GPU. x and y are device pointers;
 * stream is a cudaStream_t or NULL for the default stream. Results equal the CPU scalar reference bit for bit. */
kiln_status kiln_cuda_dequantize(kiln_type t, const void *x, float *y, int64_t k, void *stream);
/* The same from and to host memory, through temporary device buffers (for tests and tools). */
kiln_status kiln_cuda_dequantize_host(kiln_type t, const void *x, float *y, int64_t k);

/* Device memory for tests and tools (runtime.cu): plain cudaMalloc, never managed memory. kiln_cuda_free
 * accepts NULL. upload/download are synchronous; sync waits for the default stream and returns any kernel's
 * error. */
kiln_status kiln_cuda_alloc(void **p, size_t bytes);
void kiln_cuda_free(void *p);
kiln_status kiln_cuda_upload(void *dst, const void *h_src, size_t bytes);
kiln_status kiln_cuda_download(void *h_dst, const void *src, size_t bytes);
kiln_status kiln_cuda_sync(void);

/* ---------------------------------------------------------------- inference (engine.cu)
 * The CUDA backend of the forward's seam is kiln_cuda_backend (src/model/backend.h); sessions run on it. */
/* The device-to-device copy bandwidth, bytes read plus written per second / 1e9 (the decode roofline). */
kiln_status kiln_cuda_copy_bandwidth(double *gb_per_s);

/* ---------------------------------------------------------------- training (trainer.cu, issue #8)
 * A kiln_llama_train's layout (src/train/llama_train.h) on a GPU for batches of B x T: its fp32 master weights,
 * gradients, AdamW moments and bf16 mirror on the device, the activations of one batch, the forward, loss, backward
 * and a fused AdamW (train_kernels.h). The host keeps no copy of any of them: the state streams through
 * kiln_cuda_trainer_read and _write (src/train/trainer_cuda.c puts this behind src/train/trainer.h). The memory is
 * checked against the free VRAM before anything is allocated. */
typedef struct kiln_cuda_trainer kiln_cuda_trainer;
struct kiln_llama_train;
struct kiln_adamw_cfg;

/* flags: KILN_CUDA_TRAIN_DETERMINISTIC makes every reduction of a step run in a fixed order, so the same inputs give
 * the same bits and a resumed run repeats an uninterrupted one (without it the attention backward sums dq by float
 * atomics: faster, last-bit differences from run to run). KILN_CUDA_TRAIN_RECOMPUTE keeps neither the two norms'
 * bf16 outputs nor the SwiGLU output per layer (one shared copy of each) and recomputes them in the backward from
 * the saved residuals, rstd and gate|up: the same bits, ~26% less activation memory, three more memory-bound
 * passes a layer. */
#define KILN_CUDA_TRAIN_DETERMINISTIC 1u
#define KILN_CUDA_TRAIN_RECOMPUTE 2u
/* With dist (data parallel over NCCL, src/cuda/dist.h; NULL or a world of 1: one GPU) each rank trains on its own
 * B x T rows and every step's loss and counts come back summed over the ranks. The gradient is summed over the
 * ranks before the update: in buckets during the backward of the micro-batch that kiln_cuda_trainer_reduce_next
 * marks, else in one piece in kiln_cuda_trainer_adamw. KILN_CUDA_TRAIN_ZERO1 shards the AdamW moments: the
 * gradient is reduce-scattered (in the same buckets, each summed into the ranks that own its parts), each rank
 * updates its shard with the global norm's clip, then the bf16 parameters are all-gathered, and the fp32 masters
 * of the tensors the forward reads in fp32 (the embedding, the norms). */
#define KILN_CUDA_TRAIN_ZERO1 4u
/* KILN_CUDA_TRAIN_ADAM8 keeps 8-bit AdamW moments (src/train/optim.c's codes: 2 bytes a parameter and 8 per 256
 * instead of 8 bytes), updated bit for bit as the CPU's kiln_adamw_step does. */
#define KILN_CUDA_TRAIN_ADAM8 8u
struct kiln_dist;
/* The trainer takes the current device of the calling thread (kiln_cuda_set_device, or kiln_dist_init's). m's
 * params, when not NULL, are uploaded; else the parameters start at zero for kiln_cuda_trainer_write. m must outlive
 * the trainer. */
kiln_status kiln_cuda_trainer_new(const struct kiln_llama_train *m, int64_t B, int64_t T, unsigned flags, struct kiln_dist *dist,
                                  kiln_cuda_trainer **out);
void kiln_cuda_trainer_free(kiln_cuda_trainer *t); /* accepts NULL */
/* cudaSetDevice(index) for this thread, after checking that the device exists. */
kiln_status kiln_cuda_set_device(int index);
size_t kiln_cuda_trainer_bytes(const kiln_cuda_trainer *t);
/* As kiln_llama_train_step: forward of inputs (B*T ids), the loss against targets (-1 ignored), and when
 * grad_scale != 0 the backward, grads += grad_scale * d(sum of losses)/d(params) on the device. */
kiln_status kiln_cuda_trainer_step(kiln_cuda_trainer *t, const int32_t *inputs, const int32_t *targets, float grad_scale,
                                   double *loss_sum, int64_t *n_counted);
kiln_status kiln_cuda_trainer_zero_grads(kiln_cuda_trainer *t);
/* Data parallel: the next kiln_cuda_trainer_step is the optimizer step's last micro-batch, so its backward sums
 * each bucket of the gradient over the ranks as soon as it is final, overlapped with the rest of the backward. */
void kiln_cuda_trainer_reduce_next(kiln_cuda_trainer *t);
/* Data parallel: *flag becomes rank 0's (a collective: every rank calls it at the same point). */
kiln_status kiln_cuda_trainer_agree(kiln_cuda_trainer *t, bool *flag);
/* One AdamW update at lr, fp32 or 8-bit as cfg->eight_bit says (it must match KILN_CUDA_TRAIN_ADAM8 at new);
 * *skipped when the gradient or a would-be weight was non-finite (nothing changed). */
kiln_status kiln_cuda_trainer_adamw(kiln_cuda_trainer *t, const struct kiln_adamw_cfg *cfg, float lr, double *grad_norm,
                                    bool *skipped);
/* The device's params and grads (n_params floats each, either may be NULL) into host memory. */
kiln_status kiln_cuda_trainer_download(kiln_cuda_trainer *t, float *params, float *grads);

/* The state a checkpoint streams, each over the flat buffer's n_params elements: the params (f32) and the moments,
 * fp32 (M, V) or 8-bit (M8 int8, V8 uint8, and M_SCALE, V_SCALE: f32, one per KILN_ADAMW8_BLOCK elements). */
typedef enum kiln_cuda_train_part {
    KILN_CUDA_TRAIN_PARAMS,
    KILN_CUDA_TRAIN_M,
    KILN_CUDA_TRAIN_V,
    KILN_CUDA_TRAIN_M8,
    KILN_CUDA_TRAIN_V8,
    KILN_CUDA_TRAIN_M_SCALE,
    KILN_CUDA_TRAIN_V_SCALE,
} kiln_cuda_train_part;
/* Makes part readable on this rank: with ZeRO-1 it gathers the parameters, or the moments' shards into the gradient
 * buffer (dead until the next zero_grads: one of m and v at a time). A collective; nothing to do otherwise. */
kiln_status kiln_cuda_trainer_gather(kiln_cuda_trainer *t, kiln_cuda_train_part part);
/* Elements [first, first + n) of part into host dst, after kiln_cuda_trainer_gather of part. */
kiln_status kiln_cuda_trainer_read(kiln_cuda_trainer *t, kiln_cuda_train_part part, int64_t first, int64_t n, void *dst);
/* The same range from host src, which may go on return. With ZeRO-1 a rank keeps the moments of its shard (every
 * rank is given all of them). Writing params refreshes the mirror before the next step or update. */
kiln_status kiln_cuda_trainer_write(kiln_cuda_trainer *t, kiln_cuda_train_part part, int64_t first, int64_t n, const void *src);
/* The count of applied updates and of skipped non-finite embedding-gradient rows (summed over the ranks: a
 * collective), and their inverse for a resume. */
kiln_status kiln_cuda_trainer_get_counters(kiln_cuda_trainer *t, int64_t *opt_step, int64_t *n_embed_skipped);
kiln_status kiln_cuda_trainer_set_counters(kiln_cuda_trainer *t, int64_t opt_step, int64_t n_embed_skipped);

#ifdef __cplusplus
}
#endif
#endif
