/* test_cuda_util.h: what the GPU kernel tests share: device and host buffers that a test frees in one call
 * (release_all, at the start of each test and case), and poisoning device memory with 0xFF bytes (NaN as f32,
 * f16 and bf16; -1 as int32) so that an output a kernel forgets to write fails its comparison. */
#ifndef KILN_TEST_CUDA_UTIL_H
#define KILN_TEST_CUDA_UTIL_H

#include "cuda/cuda.h"
#include "test.h"

#include <stdint.h>

#define COUNT(a) (int)(sizeof a / sizeof a[0])

static void *dev_ptrs[64], *host_ptrs[64];
static int n_dev, n_host;

static inline void release_all(void) {
    while (n_dev > 0) kiln_cuda_free(dev_ptrs[--n_dev]);
    while (n_host > 0) free(host_ptrs[--n_host]);
}

/* bytes of device memory at byte offset off into a fresh allocation (off > 0 makes a misaligned pointer); NULL
 * when the GPU has no room. */
static inline void *dev_at(size_t bytes, size_t off) {
    void *p = NULL;
    if (n_dev == COUNT(dev_ptrs) || kiln_cuda_alloc(&p, bytes + off) != KILN_OK) return NULL;
    dev_ptrs[n_dev++] = p;
    return (uint8_t *)p + off;
}

static inline void *dev(size_t bytes) { return dev_at(bytes, 0); }

static inline void *host(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p || n_host == COUNT(host_ptrs)) abort();
    return host_ptrs[n_host++] = p;
}

static inline kiln_status poison(void *d, size_t bytes) {
    void *h = malloc(bytes ? bytes : 1);
    if (!h) return KILN_ERR_NOMEM;
    memset(h, 0xff, bytes);
    kiln_status s = kiln_cuda_upload(d, h, bytes);
    free(h);
    return s;
}

#endif
