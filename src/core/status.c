/* status.c: status names and the thread-local last-error message. */
#include "status.h"

#include <stdarg.h>
#include <stdio.h>

static _Thread_local char last_error[1024];

const char *kiln_status_name(kiln_status s) {
    switch (s) {
    case KILN_OK: return "ok";
    case KILN_ERR_IO: return "i/o error";
    case KILN_ERR_FORMAT: return "format error";
    case KILN_ERR_NOMEM: return "out of memory";
    case KILN_ERR_INVALID: return "invalid argument";
    case KILN_ERR_UNSUPPORTED: return "not supported";
    case KILN_ERR_NOT_FOUND: return "not found";
    case KILN_ERR_RANGE: return "out of range";
    }
    return "unknown status";
}

const char *kiln_last_error(void) { return last_error; }

void kiln_clear_error(void) { last_error[0] = '\0'; }

kiln_status kiln_fail(kiln_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return s;
}
