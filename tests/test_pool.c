/* test_pool.c: the persistent thread pool runs every job on every thread exactly once, back to back (the
 * spinning path) and after pauses long enough for the workers to fall asleep (the condition-variable path). */
#include "pool.h"
#include "test.h"

#include <stdatomic.h>
#include <time.h>

typedef struct {
    _Atomic long hits[8];
    _Atomic long total;
} counts;

static void job(void *ctx, int ith, int nth) {
    counts *c = ctx;
    atomic_fetch_add(&c->hits[ith], 1);
    atomic_fetch_add(&c->total, nth);
}

static void run_jobs(int threads, int jobs, long pause_ns) {
    kiln_pool *p;
    CHECK(kiln_pool_create(threads, &p) == KILN_OK);
    int n = kiln_pool_size(p);
    counts c = {0};
    for (int j = 0; j < jobs; j++) {
        kiln_pool_run(p, job, &c);
        for (int i = 0; i < n; i++) CHECK(atomic_load(&c.hits[i]) == j + 1, "thread %d ran %ld jobs of %d", i, atomic_load(&c.hits[i]), j + 1);
        if (pause_ns) nanosleep(&(struct timespec){0, pause_ns}, NULL);
    }
    kiln_pool_free(p);
    CHECK(atomic_load(&c.total) == (long)jobs * n * n);
}

static void test_back_to_back(void) {
    for (int t = 1; t <= 4; t++) run_jobs(t, 3000, 0);
}

static void test_after_sleep(void) {
    for (int t = 2; t <= 3; t++) run_jobs(t, 30, 5000000); /* 5 ms pauses: workers go to sleep in between */
}

int main(void) {
    RUN(test_back_to_back);
    RUN(test_after_sleep);
    TEST_EXIT();
}
