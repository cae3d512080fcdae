/* test_cuda_util.h: what the GPU kernel tests share: device and host buffers that a test frees in one call
 * (release_all, at the start of each test and case), and poisoning device memory with 0xFF bytes (NaN as f32,
 * f16 and bf16; -1 as int32) so that an output a kernel forgets to write fails its comparison; and the f32
 * comparison with a diagnostic that the elementwise tests state their bounds in. */
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

/* got against ref (n): NMSE, the largest |difference| and where, and the reference's largest magnitude. A NaN on
 * one side only counts as an infinite difference; NaN on both as none. */
typedef struct gpu_diff {
    double nmse, maxabs, scale;
    int64_t worst; /* index of the largest difference */
} gpu_diff;

static inline gpu_diff gpu_compare(const float *got, const float *ref, int64_t n) {
    gpu_diff d = {0, 0, 0, -1};
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = isnan(got[i]) != isnan(ref[i]) ? INFINITY : isnan(ref[i]) ? 0.0 : fabs((double)got[i] - ref[i]);
        num += e * e, den += (double)ref[i] * ref[i];
        if (fabs(ref[i]) > d.scale) d.scale = fabs(ref[i]);
        if (e > d.maxabs || d.worst < 0) d.maxabs = e, d.worst = i;
    }
    d.nmse = den > 0 ? num / den : num;
    return d;
}

/* True when max-abs <= rel_maxabs * max(scale, scale_floor) and NMSE <= nmse_bound; otherwise msg says where. */
static inline int gpu_within(const char *what, const float *got, const float *ref, int64_t n, double rel_maxabs,
                             double nmse_bound, double scale_floor, char *msg, size_t msg_n) {
    gpu_diff d = gpu_compare(got, ref, n);
    double s = d.scale > scale_floor ? d.scale : scale_floor;
    if (d.maxabs <= rel_maxabs * s && d.nmse <= nmse_bound) return 1;
    snprintf(msg, msg_n, "%s: nmse %.3g (bound %.3g), max-abs %.3g (bound %.3g = %.3g * scale %.3g) at %lld: gpu %.9g ref %.9g",
             what, d.nmse, nmse_bound, d.maxabs, rel_maxabs * s, rel_maxabs, s, (long long)d.worst,
             d.worst >= 0 ? got[d.worst] : 0.0, d.worst >= 0 ? ref[d.worst] : 0.0);
    return 0;
}

#endif
