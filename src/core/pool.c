/* pool.c: the persistent thread pool of pool.h.
 *
 * A job is published by bumping an atomic generation counter. Workers spin on it for a short while
 * (about a millisecond) before sleeping on a condition variable, and the caller spins the same way on the
 * count of workers still running: a forward pass dispatches several jobs per layer microseconds apart, and
 * a condition-variable wake-up costs tens of microseconds each time (measured 42 us with 16 threads), which
 * would dominate decode. An idle pool still ends up asleep, costing nothing. */
#include "pool.h"
#include "status.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#define SPIN_LIMIT (1 << 16) /* pause iterations before sleeping: ~1 ms */
#define YIELD_AFTER 256      /* then each iteration also yields, so a spinner never starves the thread it waits for */

struct kiln_pool {
    int n;              /* threads including the caller */
    pthread_t *threads; /* (n - 1) workers */
    pthread_mutex_t mu;
    pthread_cond_t wake, done;
    _Atomic uint64_t generation; /* bumped per job */
    _Atomic int pending;         /* workers still running the current job */
    _Atomic int sleeping;        /* workers blocked on wake */
    _Atomic bool caller_sleeping;
    _Atomic bool quit;
    int spin_limit;      /* SPIN_LIMIT, or 0 when there are more threads than cores: spinning would only steal their time */
    kiln_pool_fn fn; /* the job, written before generation is bumped */
    void *ctx;
};

typedef struct {
    kiln_pool *p;
    int ith;
} worker_arg;

static inline void cpu_relax(int spins) {
    if (spins > YIELD_AFTER) {
        sched_yield();
        return;
    }
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield");
#endif
}

static void *worker(void *arg) {
    worker_arg a = *(worker_arg *)arg;
    free(arg);
    kiln_pool *p = a.p;
    uint64_t seen = 0;
    for (;;) {
        uint64_t g;
        for (int spins = 0; (g = atomic_load_explicit(&p->generation, memory_order_acquire)) == seen && !atomic_load(&p->quit);) {
            if (++spins < p->spin_limit) {
                cpu_relax(spins);
                continue;
            }
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleeping, 1);
            while (atomic_load(&p->generation) == seen && !atomic_load(&p->quit)) pthread_cond_wait(&p->wake, &p->mu);
            atomic_fetch_sub(&p->sleeping, 1);
            pthread_mutex_unlock(&p->mu);
            spins = 0;
        }
        if (atomic_load(&p->quit)) break;
        seen = g;
        p->fn(p->ctx, a.ith, p->n);
        /* seq_cst, paired with the caller setting caller_sleeping before it checks pending: one of the two sees the other */
        if (atomic_fetch_sub(&p->pending, 1) == 1 && atomic_load(&p->caller_sleeping)) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->mu);
        }
    }
    return NULL;
}

int kiln_n_cores(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

kiln_status kiln_pool_create(int n_threads, kiln_pool **out) {
    *out = NULL;
    if (n_threads < 0) return kiln_fail(KILN_ERR_INVALID, "thread count %d is negative", n_threads);
    if (n_threads == 0) n_threads = kiln_n_cores();
    kiln_pool *p = calloc(1, sizeof *p);
    if (!p || !(p->threads = calloc((size_t)n_threads, sizeof *p->threads))) {
        free(p);
        return kiln_fail(KILN_ERR_NOMEM, "out of memory for a pool of %d threads", n_threads);
    }
    p->n = 1;
    p->spin_limit = n_threads <= kiln_n_cores() ? SPIN_LIMIT : 0;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    for (int i = 1; i < n_threads; i++) {
        worker_arg *a = malloc(sizeof *a);
        if (!a) break;
        *a = (worker_arg){p, i};
        if (pthread_create(&p->threads[i - 1], NULL, worker, a) != 0) {
            free(a);
            break;
        }
        p->n++;
    }
    *out = p; /* with fewer threads if the system refused some: still correct, just slower */
    return KILN_OK;
}

void kiln_pool_free(kiln_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->quit, true);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n - 1; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->wake);
    pthread_cond_destroy(&p->done);
    free(p->threads);
    free(p);
}

int kiln_pool_size(const kiln_pool *p) { return p->n; }

void kiln_pool_run(kiln_pool *p, kiln_pool_fn fn, void *ctx) {
    if (p->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    atomic_store_explicit(&p->pending, p->n - 1, memory_order_relaxed);
    /* publish under the mutex so a worker about to sleep either sees the new generation or gets the broadcast */
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
    if (atomic_load(&p->sleeping)) pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    fn(ctx, 0, p->n);
    for (int spins = 0; atomic_load_explicit(&p->pending, memory_order_acquire) > 0;) {
        if (++spins < p->spin_limit) {
            cpu_relax(spins);
            continue;
        }
        pthread_mutex_lock(&p->mu);
        atomic_store(&p->caller_sleeping, true);
        while (atomic_load(&p->pending) > 0) pthread_cond_wait(&p->done, &p->mu);
        atomic_store(&p->caller_sleeping, false);
        pthread_mutex_unlock(&p->mu);
    }
}
