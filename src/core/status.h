/* status.h: how library code reports a failure. kiln_fail() (declared in kiln.h) formats a one-line message
 * into a thread-local buffer (read back with kiln_last_error) and returns the status, so call sites read
 * `return kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s' at byte %llu: ...", ...)`. */
#ifndef KILN_STATUS_H
#define KILN_STATUS_H

#include "kiln.h"

#ifdef __cplusplus
extern "C" { /* the CUDA backend's .cu files include it too */
#endif

void kiln_clear_error(void);

/* Overflow-checked size arithmetic: false when the result does not fit. */
static inline bool kiln_mul_ok(uint64_t a, uint64_t b, uint64_t *out) { return !__builtin_mul_overflow(a, b, out); }
static inline bool kiln_add_ok(uint64_t a, uint64_t b, uint64_t *out) { return !__builtin_add_overflow(a, b, out); }

#ifdef __cplusplus
}
#endif

/* TRY(call): return the status of a call that failed. The one early-return helper of library code; code that must
 * clean up on failure uses `if ((s = call)) goto done` instead. */
#define TRY(call)                       \
    do {                                \
        kiln_status try_s_ = (call);    \
        if (try_s_ != KILN_OK) return try_s_; \
    } while (0)

#endif
