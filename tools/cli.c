/* cli.c: what the CLI's commands share (tools/cli.h): the one-line error exit and the flag parsers. It uses the public
 * API only and nothing of the commands; the CLI tests (tests/test_chat.c, which run $KILN_BIN) exercise it. */
#include "kiln.h"
#include "tools/cli.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int kiln_cli_die(kiln_status s) {
    const char *msg = kiln_last_error();
    fprintf(stderr, "kiln: %s\n", *msg ? msg : kiln_status_name(s));
    return 1;
}

/* Writes s to f with control bytes, quotes, backslashes and bytes >= 0x80 that are not valid UTF-8 escaped, so a
 * string from a file, the network or argv cannot move the cursor or clear the terminal. */
void kiln_cli_put_escaped(FILE *f, const char *s) {
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        unsigned c = *p;
        if (c == '\\' || c == '\'') fprintf(f, "\\%c", c);
        else if (c == '\n') fputs("\\n", f);
        else if (c == '\t') fputs("\\t", f);
        else if (c < 0x20 || c == 0x7f || c >= 0x80) {
            /* keep well-formed multi-byte UTF-8 (Turkish text, emoji) but not C1 controls (U+0080..U+009F) */
            int n = c >= 0xf0 && c < 0xf5 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 && c < 0xe0 ? 2 : 0;
            bool ok = n > 0 && !(c == 0xc2 && p[1] < 0xa0);
            for (int k = 1; ok && k < n; k++) ok = (p[k] & 0xc0) == 0x80;
            if (ok) {
                fwrite(p, 1, (size_t)n, f);
                p += n - 1;
            } else
                fprintf(f, "\\x%02x", c);
        } else
            fputc((int)c, f);
    }
}

static void bad_value(const char *cmd, const char *flag, const char *what, double lo, double hi, const char *arg) {
    fprintf(stderr, "kiln: %s: %s needs %s in [%.17g, %.17g], got '", cmd, flag, what, lo, hi);
    kiln_cli_put_escaped(stderr, arg);
    fputs("'\n", stderr);
}

/* A decimal number as people write one: an optional sign, digits, an optional fraction and exponent. No hex
 * ("0x10"), no "nan"/"inf", no leading space, nothing after it. */
static bool decimal_syntax(const char *s, bool integer) {
    const char *p = s;
    if (*p == '-' || *p == '+') p++;
    const char *d = p;
    while (*p >= '0' && *p <= '9') p++;
    bool digits = p > d;
    if (!integer && *p == '.') {
        const char *f = ++p;
        while (*p >= '0' && *p <= '9') p++;
        digits = digits || p > f;
    }
    if (!digits) return false;
    if (!integer && (*p == 'e' || *p == 'E')) {
        p++;
        if (*p == '-' || *p == '+') p++;
        const char *e = p;
        while (*p >= '0' && *p <= '9') p++;
        if (p == e) return false;
    }
    return *p == 0;
}

bool kiln_cli_parse_num(const char *cmd, const char *flag, const char *arg, double lo, double hi, double *out) {
    double v = 0;
    bool ok = arg && decimal_syntax(arg, false);
    if (ok) {
        errno = 0;
        v = strtod(arg, NULL);
        ok = isfinite(v) && v >= lo && v <= hi;
    }
    if (!ok) {
        bad_value(cmd, flag, "a finite number", lo, hi, arg ? arg : "");
        return false;
    }
    *out = v;
    return true;
}

bool kiln_cli_parse_int(const char *cmd, const char *flag, const char *arg, int64_t lo, int64_t hi, int64_t *out) {
    long long v = 0;
    bool ok = arg && decimal_syntax(arg, true);
    if (ok) {
        errno = 0;
        v = strtoll(arg, NULL, 10);
        ok = errno == 0 && v >= lo && v <= hi;
    }
    if (!ok) {
        bad_value(cmd, flag, "an integer", (double)lo, (double)hi, arg ? arg : "");
        return false;
    }
    *out = v;
    return true;
}

bool kiln_cli_parse_u64(const char *cmd, const char *flag, const char *arg, uint64_t *out) {
    unsigned long long v = 0;
    bool ok = arg && *arg >= '0' && *arg <= '9' && decimal_syntax(arg, true);
    if (ok) {
        errno = 0;
        v = strtoull(arg, NULL, 10);
        ok = errno == 0;
    }
    if (!ok) {
        fprintf(stderr, "kiln: %s: %s needs an unsigned 64-bit integer, got '", cmd, flag);
        kiln_cli_put_escaped(stderr, arg ? arg : "");
        fputs("'\n", stderr);
        return false;
    }
    *out = v;
    return true;
}

bool kiln_cli_gpu_flag(const char *f, kiln_session_params *sess) {
    if (strcmp(f, "--gpu") != 0) return false;
    sess->n_gpu_layers = INT32_MAX;
    return true;
}

int kiln_cli_sampling_opt(const char *cmd, const char *f, const char *a, kiln_sampler_params *sp, kiln_session_params *sess) {
    double v;
    int64_t n;
    bool ok;
    if (strcmp(f, "-t") == 0) ok = kiln_cli_parse_int(cmd, f, a, 0, 4096, &n), sess->n_threads = (int)n;
    else if (strcmp(f, "-c") == 0) ok = kiln_cli_parse_int(cmd, f, a, 0, INT32_MAX, &n), sess->n_ctx = n;
    else if (strcmp(f, "-ngl") == 0 || strcmp(f, "--n-gpu-layers") == 0)
        ok = kiln_cli_parse_int(cmd, f, a, 0, INT32_MAX, &n), sess->n_gpu_layers = (int)n;
    else if (strcmp(f, "--temp") == 0) ok = kiln_cli_parse_num(cmd, f, a, 0, 1e9, &v), sp->temp = (float)v;
    else if (strcmp(f, "--top-k") == 0) ok = kiln_cli_parse_int(cmd, f, a, 0, INT32_MAX, &n), sp->top_k = (int32_t)n;
    else if (strcmp(f, "--top-p") == 0) ok = kiln_cli_parse_num(cmd, f, a, 0, 1, &v), sp->top_p = (float)v;
    else if (strcmp(f, "--min-p") == 0) ok = kiln_cli_parse_num(cmd, f, a, 0, 1, &v), sp->min_p = (float)v;
    else if (strcmp(f, "--repeat-penalty") == 0) ok = kiln_cli_parse_num(cmd, f, a, 1e-6, 1e9, &v), sp->repeat_penalty = (float)v;
    else if (strcmp(f, "--repeat-last-n") == 0) ok = kiln_cli_parse_int(cmd, f, a, 0, INT32_MAX, &n), sp->repeat_last_n = (int32_t)n;
    else if (strcmp(f, "--seed") == 0) ok = kiln_cli_parse_u64(cmd, f, a, &sp->seed);
    else
        return 0;
    return ok ? 1 : -1;
}

void kiln_cli_progress(void *user, const kiln_progress *p) {
    if (strcmp(p->stage, "tokenizer") == 0)
        fprintf(stderr, "\r[%6lld/%6lld merges]", (long long)p->done, (long long)p->total);
    else if (strcmp(p->stage, "perplexity") == 0)
        fprintf(stderr, "\r[%lld/%lld] ppl %.4f", (long long)p->done, (long long)p->total, p->metric);
    else if (strcmp(p->stage, "data") == 0)
        fprintf(stderr, "\r[%.1f/%.1f MiB]", (double)p->done / (1 << 20), (double)p->total / (1 << 20));
    else
        fprintf(stderr, "\r[%s %lld/%lld]", p->stage, (long long)p->done, (long long)p->total);
    if (p->done == p->total) fputc('\n', stderr);
    fflush(stderr);
}
