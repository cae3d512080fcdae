/* pool.h: a persistent thread pool. Workers are created once and sleep on a condition variable
 * between jobs; kiln_pool_run hands every thread (the caller is thread 0) the same function with
 * its index, so work is split by (ith, nth) without queues. */
#ifndef KILN_POOL_H
#define KILN_POOL_H

#include "kiln.h"

typedef struct kiln_pool kiln_pool;
typedef void (*kiln_pool_fn)(void *ctx, int ith, int nth);

/* n_threads counts the caller; 0 means one per online core. */
kiln_status kiln_pool_create(int n_threads, kiln_pool **out);
void kiln_pool_free(kiln_pool *p); /* accepts NULL */
int kiln_pool_size(const kiln_pool *p);
/* Runs fn(ctx, ith, nth) for ith in 0..nth-1, one per thread, and returns when all are done. */
void kiln_pool_run(kiln_pool *p, kiln_pool_fn fn, void *ctx);
int kiln_n_cores(void);

#endif
