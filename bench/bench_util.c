/* bench_util.c: timing, medians and JSON output shared by the benchmark drivers. */
#include "bench/bench.h"

#include <math.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

double kiln_bench_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The mean of the middle two for even n. */
double kiln_bench_median(double *t, int n) {
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

const char *kiln_bench_json_num(char *buf, size_t n, double v, int prec) {
    if (isfinite(v)) snprintf(buf, n, "%.*f", prec, v);
    else snprintf(buf, n, "null");
    return buf;
}

const char *kiln_bench_base_name(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

/* Quotes, backslashes and control bytes escaped; other bytes as they are (paths are UTF-8). */
void kiln_bench_json_str(const char *s) {
    putchar('"');
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') printf("\\%c", *p);
        else if (*p < 0x20) printf("\\u%04x", *p);
        else putchar(*p);
    }
    putchar('"');
}

int kiln_bench_parse_list(const char *opt, const char *s, long lo, long hi, int64_t *out, int max_items, int *n) {
    *n = 0;
    for (const char *p = s;;) {
        char *end;
        const long v = strtol(p, &end, 10);
        if (end == p || (*end && *end != ',') || v < lo || v > hi || *n == max_items) {
            fprintf(stderr, "kiln bench: %s: '%s' is not a list of at most %d integers between %ld and %ld\n", opt, s, max_items, lo, hi);
            return -1;
        }
        out[(*n)++] = v;
        if (!*end) return 0;
        p = end + 1;
    }
}
