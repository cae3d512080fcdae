/* cli.c: what the CLI's commands share (tools/cli.h): the one-line error exit and the flag parsers. It uses the public
 * API only and nothing of the commands; the CLI tests (tests/test_chat.c, which run $KILN_BIN) exercise it. */
#include "kiln.h"
#include "tools/cli.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int kiln_cli_die(kiln_status s) {
    const char *msg = kiln_last_error();
    fprintf(stderr, "kiln: %s\n", *msg ? msg : kiln_status_name(s));
    return 1;
}

bool kiln_cli_parse_num(const char *cmd, const char *flag, const char *arg, double lo, double hi, double *out) {
    char *end;
    double v = strtod(arg, &end);
    if (end == arg || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "kiln: %s: %s needs a number in [%g, %g], got '%s'\n", cmd, flag, lo, hi, arg);
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
    bool ok;
    if (strcmp(f, "-t") == 0) ok = kiln_cli_parse_num(cmd, f, a, 0, 4096, &v), sess->n_threads = (int)v;
    else if (strcmp(f, "-c") == 0) ok = kiln_cli_parse_num(cmd, f, a, 0, INT32_MAX, &v), sess->n_ctx = (int64_t)v;
    else if (strcmp(f, "-ngl") == 0 || strcmp(f, "--n-gpu-layers") == 0)
        ok = kiln_cli_parse_num(cmd, f, a, 0, INT32_MAX, &v), sess->n_gpu_layers = (int)v;
    else if (strcmp(f, "--temp") == 0) ok = kiln_cli_parse_num(cmd, f, a, 0, 1e9, &v), sp->temp = (float)v;
    else if (strcmp(f, "--top-k") == 0) ok = kiln_cli_parse_num(cmd, f, a, 0, INT32_MAX, &v), sp->top_k = (int32_t)v;
    else if (strcmp(f, "--top-p") == 0) ok = kiln_cli_parse_num(cmd, f, a, 0, 1, &v), sp->top_p = (float)v;
    else if (strcmp(f, "--min-p") == 0) ok = kiln_cli_parse_num(cmd, f, a, 0, 1, &v), sp->min_p = (float)v;
    else if (strcmp(f, "--repeat-penalty") == 0) ok = kiln_cli_parse_num(cmd, f, a, 1e-6, 1e9, &v), sp->repeat_penalty = (float)v;
    else if (strcmp(f, "--repeat-last-n") == 0) ok = kiln_cli_parse_num(cmd, f, a, 0, INT32_MAX, &v), sp->repeat_last_n = (int32_t)v;
    else if (strcmp(f, "--seed") == 0) {
        char *end;
        errno = 0;
        sp->seed = strtoull(a, &end, 10);
        ok = *a >= '0' && *a <= '9' && !*end && !errno;
        if (!ok) fprintf(stderr, "kiln: %s: --seed needs an unsigned 64-bit integer, got '%s'\n", cmd, a);
    } else
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
