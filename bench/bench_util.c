/* bench_util.c: timing, medians, JSON output and the list flags (-p 128,512) shared by the benchmark drivers. */
#include "bench/bench.h"
#include "tools/cli.h"

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

int kiln_bench_parse_list(const char *cmd, const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *out, int max_items,
                          int *n) {
    char *copy = strdup(s), *rest = copy;
    if (!copy) return -kiln_cli_error("out of memory");
    int rc = 0;
    *n = 0;
    for (char *item; rc == 0 && (item = strsep(&rest, ","));) {
        if (*n == max_items) rc = -kiln_cli_error("%s: %s takes at most %d values, got '%s'", cmd, opt, max_items, s);
        else if (!kiln_cli_parse_int(cmd, opt, item, lo, hi, &out[*n])) rc = -1;
        else ++*n;
    }
    free(copy);
    return rc;
}
