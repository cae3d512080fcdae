/* test.h: the tiny harness every tests/test_*.c uses.
 *
 * A test is a function; RUN(fn) runs it and prints one line: "ok NAME", "FAIL NAME: file:line: why" or
 * "skip NAME: reason". tests/run.sh counts those lines across all test programs; a program that crashes
 * counts as one failure. CHECK returns from the test on the first failed condition. */
#ifndef KILN_TEST_H
#define KILN_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* unused in a program that prints its own lines (test_hf_oracle.c) */
#define TEST_UNUSED_ __attribute__((unused))
static int test_failed_ TEST_UNUSED_;  /* set by CHECK in the running test */
static int test_skipped_ TEST_UNUSED_; /* set by SKIP */
static char test_msg_[1024] TEST_UNUSED_;
static int test_n_failed_ TEST_UNUSED_;

#define CHECK(cond, ...)                                                                        \
    do {                                                                                        \
        if (!(cond)) {                                                                          \
            int n_ = snprintf(test_msg_, sizeof test_msg_, "%s:%d: %s", __FILE__, __LINE__, #cond); \
            if (n_ > 0 && (size_t)n_ < sizeof test_msg_)                                        \
                snprintf(test_msg_ + n_, sizeof test_msg_ - (size_t)n_, " " __VA_ARGS__);      \
            test_failed_ = 1;                                                                   \
            return;                                                                             \
        }                                                                                       \
    } while (0)

#define SKIP(...)                                                   \
    do {                                                            \
        snprintf(test_msg_, sizeof test_msg_, __VA_ARGS__);         \
        test_skipped_ = 1;                                          \
        return;                                                     \
    } while (0)

/* KILN_TEST_ONLY=substring runs only the tests whose name holds it (for a developer's quick run; unset in make test) */
#define RUN(fn)                                                         \
    do {                                                                \
        const char *only_ = getenv("KILN_TEST_ONLY");                   \
        if (only_ && *only_ && !strstr(#fn, only_)) break;              \
        test_failed_ = test_skipped_ = 0;                               \
        test_msg_[0] = 0;                                               \
        fn();                                                           \
        if (test_failed_) {                                             \
            printf("FAIL %s: %s\n", #fn, test_msg_);                    \
            test_n_failed_++;                                           \
        } else if (test_skipped_)                                       \
            printf("skip %s: %s\n", #fn, test_msg_);                    \
        else                                                            \
            printf("ok %s\n", #fn);                                     \
        fflush(stdout);                                                 \
    } while (0)

#define TEST_EXIT() return test_n_failed_ ? 1 : 0

/* Root of the shared data folder (../shared/data from the repo root), overridable by KILN_DATA. */
static inline const char *test_data_dir(void) {
    const char *d = getenv("KILN_DATA");
    return d && *d ? d : "../shared/data";
}

/* Deterministic random numbers for tests: xorshift64*, seeded per test. */
static inline unsigned long long test_rng_next(unsigned long long *s) {
    *s ^= *s >> 12; *s ^= *s << 25; *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1DULL;
}
static inline float test_rng_f32(unsigned long long *s) { /* uniform in [-1, 1) */
    return (float)((test_rng_next(s) >> 40) * (1.0 / 8388608.0)) - 1.0f;
}
static inline float test_rng_normal(unsigned long long *s) { /* Box-Muller */
    double u1 = ((test_rng_next(s) >> 11) + 1) * (1.0 / 9007199254740993.0);
    double u2 = (test_rng_next(s) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

#endif
