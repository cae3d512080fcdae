/* pool.c: the persistent thread pool of pool.h. A job is published by bumping a generation counter
 * under the mutex; each worker runs it once and the last one to finish signals the caller. */
#include "pool.h"
#include "status.h"

#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

struct kiln_pool {
    int n;                /* threads including the caller */
    pthread_t *threads;   /* (n - 1) workers */
    pthread_mutex_t mu;
    pthread_cond_t wake, done;
    uint64_t generation;  /* bumped per job */
    int pending;          /* workers still running the current job */
    bool quit;
    kiln_pool_fn fn;
    void *ctx;
};

typedef struct {
    kiln_pool *p;
    int ith;
} worker_arg;

static void *worker(void *arg) {
    worker_arg a = *(worker_arg *)arg;
    free(arg);
    kiln_pool *p = a.p;
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->quit && p->generation == seen) pthread_cond_wait(&p->wake, &p->mu);
        if (p->quit) break;
        seen = p->generation;
        kiln_pool_fn fn = p->fn;
        void *ctx = p->ctx;
        pthread_mutex_unlock(&p->mu);
        fn(ctx, a.ith, p->n);
        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0) pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
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
    p->quit = true;
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
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->pending = p->n - 1;
    p->generation++;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    fn(ctx, 0, p->n);
    pthread_mutex_lock(&p->mu);
    while (p->pending > 0) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
