/* test_cuda.c: the CUDA kernels against the scalar CPU reference on fresh random blocks.
 * Skips with a reason when kiln was built without CUDA or the machine has no GPU. */
#include "cuda/cuda.h"
#include "quants.h"
#include "test.h"

/* Random raw blocks: random bytes everywhere, then every f16 scale field set to a finite half. */
static void random_blocks(kiln_type t, uint8_t *buf, int64_t n_blocks, unsigned long long *seed) {
    size_t bs = kiln_type_block_bytes(t);
    for (size_t i = 0; i < bs * (size_t)n_blocks; i++) buf[i] = (uint8_t)test_rng_next(seed);
    for (int64_t b = 0; b < n_blocks; b++) {
        uint8_t *p = buf + (size_t)b * bs;
        kiln_fp16 d = kiln_f32_to_fp16(test_rng_f32(seed) * 0.01f), m = kiln_f32_to_fp16(test_rng_f32(seed) * 0.01f);
        switch (t) {
        case KILN_TYPE_F16: /* every element: keep finite */
            for (size_t i = 0; i < bs; i += 2) memcpy(p + i, &(kiln_fp16){kiln_f32_to_fp16(test_rng_f32(seed) * 100.0f)}, 2);
            break;
        case KILN_TYPE_Q4_0:
        case KILN_TYPE_Q8_0: memcpy(p, &d, 2); break;
        case KILN_TYPE_Q4_1:
        case KILN_TYPE_Q4_K:
        case KILN_TYPE_Q5_K: memcpy(p, &d, 2), memcpy(p + 2, &m, 2); break;
        case KILN_TYPE_Q6_K: memcpy(p + bs - 2, &d, 2); break;
        default: break;
        }
    }
}

static void test_dequantize_matches_cpu(void) {
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device (or kiln built without CUDA)");
    const kiln_type types[] = {KILN_TYPE_F32, KILN_TYPE_F16, KILN_TYPE_BF16, KILN_TYPE_Q4_0, KILN_TYPE_Q4_1,
                               KILN_TYPE_Q8_0, KILN_TYPE_Q4_K, KILN_TYPE_Q5_K, KILN_TYPE_Q6_K};
    unsigned long long seed = 7;
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        kiln_type t = types[ti];
        int64_t n_blocks = 1037 * (kiln_type_block_size(t) == 1 ? 256 : 1); /* odd count, not a multiple of the launch size */
        int64_t k = n_blocks * kiln_type_block_size(t);
        uint8_t *x = malloc(kiln_type_row_bytes(t, k));
        float *cpu = malloc((size_t)k * 4), *gpu = malloc((size_t)k * 4);
        random_blocks(t, x, n_blocks, &seed);
        if (t == KILN_TYPE_F32)
            for (int64_t i = 0; i < k; i++) ((float *)x)[i] = test_rng_f32(&seed);
        kiln_get_to_float(t, KILN_SIMD_SCALAR)(x, cpu, k);
        kiln_status s = kiln_cuda_dequantize_host(t, x, gpu, k);
        int64_t bad = -1;
        for (int64_t i = 0; s == KILN_OK && i < k && bad < 0; i++)
            if (memcmp(&cpu[i], &gpu[i], 4) != 0) bad = i;
        float c = bad >= 0 ? cpu[bad] : 0, g = bad >= 0 ? gpu[bad] : 0;
        free(x), free(cpu), free(gpu);
        CHECK(s == KILN_OK, "%s: %s", kiln_type_name(t), kiln_last_error());
        CHECK(bad < 0, "%s: element %lld: cpu %.9g gpu %.9g", kiln_type_name(t), (long long)bad, c, g);
    }
    float y[32];
    CHECK(kiln_cuda_dequantize_host(KILN_TYPE_Q4_0, y, y, 33) == KILN_ERR_INVALID);
}

static void test_describe(void) {
    char buf[256];
    if (kiln_cuda_device_count() == 0) {
        /* without a device the seam answers with an error, never a crash or a made-up description */
        CHECK(kiln_cuda_device_describe(buf, sizeof buf) != KILN_OK);
        SKIP("no CUDA device (or kiln built without CUDA)");
    }
    CHECK(kiln_cuda_device_describe(buf, sizeof buf) == KILN_OK, "%s", kiln_last_error());
    printf("# device: %s\n", buf);
}

int main(void) {
    RUN(test_dequantize_matches_cpu);
    RUN(test_describe);
    TEST_EXIT();
}
