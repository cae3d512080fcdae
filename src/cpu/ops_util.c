/* ops_util.c: what every file of the CPU ops (src/cpu/ops*.c) shares, declared in ops_internal.h: the SIMD level
 * they dispatch on, the pool dispatch, the aligned scratch and the in-job barrier. It calls no op, so the table
 * (ops.c) depends on the op files and they on this, never the reverse. tests/test_ops.c runs every op through it. */
#include "ops_internal.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>


static atomic_int cached_level = -1; /* -1: not read yet */

kiln_simd kiln_cpu_ops_level(void) {
    int l = atomic_load_explicit(&cached_level, memory_order_relaxed);
    if (l < 0) {
        l = (int)kiln_simd_best();
        atomic_store_explicit(&cached_level, l, memory_order_relaxed);
    }
    return (kiln_simd)l;
}

void kiln_cpu_ops_force_level(kiln_simd level) {
    kiln_simd have = kiln_simd_best();
    atomic_store_explicit(&cached_level, (int)(level < have ? level : have), memory_order_relaxed);
}

static atomic_int amx_wanted = -1; /* -1: KILN_AMX not read yet */

bool kiln_cpu_ops_amx(void) {
    int w = atomic_load_explicit(&amx_wanted, memory_order_relaxed);
    if (w < 0) {
        const char *env = getenv("KILN_AMX");
        w = env && strcmp(env, "1") == 0;
        atomic_store_explicit(&amx_wanted, w, memory_order_relaxed);
    }
    return w && kiln_cpu_ops_level() >= KILN_SIMD_AVX512 && kiln_simd_amx();
}

void kiln_cpu_ops_force_amx(bool on) { atomic_store_explicit(&amx_wanted, on ? 1 : 0, memory_order_relaxed); }

int kiln_ops_n_threads(const kiln_ops_ctx *ctx) { return ctx->pool ? kiln_pool_size(ctx->pool) : 1; }

void kiln_ops_run(kiln_ops_ctx *ctx, kiln_pool_fn fn, void *arg, bool parallel) {
    if (parallel && ctx->pool && kiln_pool_size(ctx->pool) > 1)
        kiln_pool_run(ctx->pool, fn, arg);
    else
        fn(arg, 0, 1);
}

void *kiln_ops_scratch(const kiln_ops_ctx *ctx, size_t *bytes) {
    uintptr_t p = (uintptr_t)ctx->scratch;
    size_t pad = (size_t)(-p & (KILN_OPS_ALIGN - 1));
    *bytes = ctx->scratch && ctx->scratch_bytes > pad ? ctx->scratch_bytes - pad : 0;
    return *bytes ? (char *)ctx->scratch + pad : NULL;
}

void kiln_ops_barrier(atomic_int *count, int nth) {
    if (nth <= 1) return;
    atomic_fetch_add_explicit(count, 1, memory_order_acq_rel);
    for (unsigned spins = 0; atomic_load_explicit(count, memory_order_acquire) < nth; spins++) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
        if (spins > 4096) sched_yield();
    }
}
