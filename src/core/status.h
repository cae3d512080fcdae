/* status.h: how library code reports a failure. kiln_fail() formats a one-line message into a
 * thread-local buffer (read back with kiln_last_error) and returns the status, so call sites read
 * `return kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s' at byte %llu: ...", ...)`. */
#ifndef KILN_STATUS_H
#define KILN_STATUS_H

#include "kiln.h"

#if defined(__GNUC__)
#define KILN_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define KILN_PRINTF(a, b)
#endif

kiln_status kiln_fail(kiln_status s, const char *fmt, ...) KILN_PRINTF(2, 3);
void kiln_clear_error(void);

/* Overflow-checked size arithmetic: false when the result does not fit. */
static inline bool kiln_mul_ok(uint64_t a, uint64_t b, uint64_t *out) { return !__builtin_mul_overflow(a, b, out); }
static inline bool kiln_add_ok(uint64_t a, uint64_t b, uint64_t *out) { return !__builtin_add_overflow(a, b, out); }

#endif
