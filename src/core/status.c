/* status.c: status names and the thread-local last-error message. */
#include "status.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

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

/* The message is made safe to print: names and strings in it may come from a file or the network, so control
 * bytes (C0, DEL and the UTF-8-encoded C1 range) and malformed UTF-8 become \xNN and an escape sequence inside a
 * GGUF cannot reach the user's terminal through an error. Well-formed UTF-8 text stays as it is. */
static void escape_in_place(char *buf, size_t cap) {
    char tmp[sizeof last_error];
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)buf; *p && o + 5 < sizeof tmp; p++) {
        unsigned c = *p;
        int n = 1;
        bool ok = c >= 0x20 && c < 0x7f;
        if (c >= 0x80) {
            n = c >= 0xf0 && c < 0xf5 ? 4 : c >= 0xe0 && c < 0xf0 ? 3 : c >= 0xc2 && c < 0xe0 ? 2 : 0;
            ok = n > 0 && !(c == 0xc2 && p[1] < 0xa0);
            for (int k = 1; ok && k < n; k++) ok = (p[k] & 0xc0) == 0x80;
        }
        if (ok && o + (size_t)n < sizeof tmp) {
            memcpy(tmp + o, p, (size_t)n);
            o += (size_t)n;
            p += n - 1;
        } else if (ok)
            break;
        else
            o += (size_t)snprintf(tmp + o, sizeof tmp - o, "\\x%02x", c);
    }
    tmp[o] = 0;
    snprintf(buf, cap, "%s", tmp);
}

kiln_status kiln_fail(kiln_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    escape_in_place(last_error, sizeof last_error);
    return s;
}
