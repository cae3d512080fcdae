/* test_cuda.c: the CUDA kernels against the scalar CPU reference on fresh random blocks (for Q5_1, Q2_K, Q3_K,
 * IQ4_NL and IQ4_XS, test_blocks_ggml.h's dequantizer, written from GGML's layouts), bit for bit.
 * Skips with a reason when kiln was built without CUDA or the machine has no GPU. */
#include "cuda/cuda.h"
#include "quants.h"
#include "test.h"
#include "test_blocks.h"
#include "test_blocks_ggml.h"

static void test_dequantize_matches_cpu(void) {
    if (kiln_cuda_device_count() == 0) SKIP("no CUDA device (or kiln built without CUDA)");
    const kiln_type types[] = {KILN_TYPE_F32,  KILN_TYPE_F16,  KILN_TYPE_BF16, KILN_TYPE_Q4_0, KILN_TYPE_Q4_1,
                               KILN_TYPE_Q5_0, KILN_TYPE_Q8_0, KILN_TYPE_Q4_K, KILN_TYPE_Q5_K, KILN_TYPE_Q6_K,
                               KILN_TYPE_Q5_1, KILN_TYPE_Q2_K, KILN_TYPE_Q3_K, KILN_TYPE_IQ4_NL, KILN_TYPE_IQ4_XS};
    unsigned long long seed = 7;
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        kiln_type t = types[ti];
        int64_t n_blocks = 1037 * (kiln_type_block_size(t) == 1 ? 256 : 1); /* odd count, not a multiple of the launch size */
        int64_t k = n_blocks * kiln_type_block_size(t);
        uint8_t *x = malloc(kiln_type_row_bytes(t, k));
        float *cpu = malloc((size_t)k * 4), *gpu = malloc((size_t)k * 4);
        test_random_blocks(t, x, k, 100.0f, 0.0f, &seed);
        test_ggml_fix_scales(t, x, k, 0.01f, 0.0f, &seed);
        if (t == KILN_TYPE_F32)
            for (int64_t i = 0; i < k; i++) ((float *)x)[i] = test_rng_f32(&seed);
        test_ggml_to_float(t, x, cpu, k); /* the CPU reference; test_blocks_ggml.h's for the types it lacks */
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

/* Without a device (or without CUDA) the check refuses with the reason; with one, this machine's GPU is at least the
 * CUDA_ARCH the tests were built for, or the check names both and the make line that fits. */
static void test_check_device(void) {
    kiln_status st = kiln_cuda_check_device();
    if (kiln_cuda_device_count() == 0) {
        CHECK(st == KILN_ERR_UNSUPPORTED, "%s", kiln_status_name(st));
        CHECK(strstr(kiln_last_error(), "CUDA") != NULL, "%s", kiln_last_error());
        SKIP("no CUDA device (or kiln built without CUDA)");
    }
    CHECK(st == KILN_OK || (st == KILN_ERR_UNSUPPORTED && strstr(kiln_last_error(), "rebuild with make CUDA_ARCH=sm_")),
          "%s: %s", kiln_status_name(st), kiln_last_error());
    if (st) SKIP("%s", kiln_last_error());
}

int main(void) {
    RUN(test_dequantize_matches_cpu);
    RUN(test_describe);
    RUN(test_check_device);
    TEST_EXIT();
}
