/* cli.c: what the CLI's commands share (tools/cli.h): the one-line error exit, the escaped output, the number parsers
 * and the option table reader. It uses the public API only and nothing of the commands; tests/test_cli.sh runs every
 * command's bad values through $KILN_BIN, and tests/test_chat.c the chat flags. */
#include "kiln.h"
#include "tools/cli.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int kiln_cli_die(kiln_status s) {
    const char *msg = kiln_last_error();
    fprintf(stderr, "kiln: %s\n", *msg ? msg : kiln_status_name(s));
    return 1;
}

/* Writes the n bytes of s to f with control bytes (C0, DEL, the UTF-8-encoded C1 range) and bytes >= 0x80 that are
 * not well-formed UTF-8 as \xNN and each byte of `also` after a backslash, so a string from a file, the network or
 * argv cannot move the cursor or clear the terminal. Returns the bytes written. */
static size_t put_escaped_n(FILE *f, const char *s, size_t n, const char *also) {
    size_t w = 0;
    for (const unsigned char *p = (const unsigned char *)s, *end = p + n; p < end; p++) {
        unsigned c = *p;
        if (c && strchr(also, (int)c)) w += (size_t)fprintf(f, "\\%c", c);
        else if (c == '\n' && *also) w += (size_t)fprintf(f, "\\n");
        else if (c == '\t' && *also) w += (size_t)fprintf(f, "\\t");
        else if (c < 0x20 || c == 0x7f || c >= 0x80) {
            /* keep well-formed multi-byte UTF-8 (Turkish text, emoji) but not C1 controls (U+0080..U+009F) */
            size_t k = c >= 0xf0 && c < 0xf5 ? 4 : c >= 0xe0 && c < 0xf0 ? 3 : c >= 0xc2 && c < 0xe0 ? 2 : 0;
            bool ok = k > 0 && k <= (size_t)(end - p) && !(c == 0xc2 && p[1] < 0xa0);
            for (size_t j = 1; ok && j < k; j++) ok = (p[j] & 0xc0) == 0x80;
            if (ok) {
                w += fwrite(p, 1, k, f);
                p += k - 1;
            } else
                w += (size_t)fprintf(f, "\\x%02x", c);
        } else
            w += fputc((int)c, f) != EOF;
    }
    return w;
}

void kiln_cli_put_escaped(FILE *f, const char *s) { put_escaped_n(f, s, strlen(s), "\\'"); }

void kiln_cli_put_quoted(FILE *f, const char *s, size_t n) {
    fputc('"', f);
    put_escaped_n(f, s, n, "\\\"");
    fputc('"', f);
}

void kiln_cli_put_padded(FILE *f, const char *s, int width) {
    for (size_t w = put_escaped_n(f, s, strlen(s), "\\'"); w < (size_t)(width > 0 ? width : 0); w++) fputc(' ', f);
}

static void put_message(const char *fmt, va_list ap) {
    char buf[1024];
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    fputs("kiln: ", stderr);
    put_escaped_n(stderr, buf, n < 0 ? 0 : (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1, "");
    fputc('\n', stderr);
}

int kiln_cli_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    put_message(fmt, ap);
    va_end(ap);
    return 1;
}

void kiln_cli_note(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    put_message(fmt, ap);
    va_end(ap);
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

bool kiln_cli_progress_tty(void) { return isatty(STDERR_FILENO); }

void kiln_cli_progress(void *user, const kiln_progress *p) {
    (void)user;
    /* without a terminal every line stays, so write one a percent at most (a 10,000-window run writes 100 lines) */
    static const char *last_stage;
    static int64_t last_pct = -1;
    const bool tty = kiln_cli_progress_tty(), last = p->done == p->total;
    if (!tty) {
        int64_t pct = p->total > 0 ? (int64_t)((double)p->done * 100.0 / (double)p->total) : 0;
        if (p->stage != last_stage || pct < last_pct) last_pct = -1;
        last_stage = p->stage;
        if (pct == last_pct && !last) return;
        last_pct = pct;
    }
    const char *start = tty ? "\r" : "";
    if (strcmp(p->stage, "tokenizer") == 0)
        fprintf(stderr, "%s[%6lld/%6lld merges]", start, (long long)p->done, (long long)p->total);
    else if (strcmp(p->stage, "perplexity") == 0)
        fprintf(stderr, "%s[%lld/%lld] ppl %.4f", start, (long long)p->done, (long long)p->total, p->metric);
    else if (strcmp(p->stage, "data") == 0)
        fprintf(stderr, "%s[%.1f/%.1f MiB]", start, (double)p->done / (1 << 20), (double)p->total / (1 << 20));
    else
        fprintf(stderr, "%s[%s %lld/%lld]", start, p->stage, (long long)p->done, (long long)p->total);
    if (last || !tty) fputc('\n', stderr);
    fflush(stderr);
}

/* ---------------------------------------------------------------- stop strings */

bool kiln_cli_stream_add(kiln_cli_stream *g, const char *s, size_t n, kiln_status *err) {
    if (g->n + n > g->cap) {
        size_t cap = g->cap ? g->cap : 256;
        while (cap < g->n + n) cap *= 2;
        char *p = realloc(g->p, cap);
        if (!p) {
            *err = KILN_ERR_NOMEM;
            return false;
        }
        g->p = p, g->cap = cap;
    }
    if (n) memcpy(g->p + g->n, s, n);
    g->n += n;
    size_t end = g->n, hold = 0; /* end: where the earliest stop string begins; hold: a possible start kept back */
    for (int i = 0; g->stops && i < g->stops->n; i++) {
        const char *stop = g->stops->v[i];
        size_t k = strlen(stop);
        /* a stop string not found before ends after the printed bytes: search from where it could begin */
        for (size_t at = g->printed > k ? g->printed - k : 0; k && at + k <= g->n; at++)
            if (at < end && memcmp(g->p + at, stop, k) == 0) {
                end = at;
                break;
            }
        for (size_t h = k - (k > 0); h > hold; h--) /* the longest tail of the text that begins the stop string */
            if (h <= g->n && memcmp(g->p + g->n - h, stop, h) == 0) {
                hold = h;
                break;
            }
    }
    const bool stopped = end < g->n;
    size_t upto = stopped ? end : g->n - hold;
    if (upto > g->printed) {
        fwrite(g->p + g->printed, 1, upto - g->printed, stdout);
        fflush(stdout);
        g->printed = upto;
    }
    return stopped;
}

void kiln_cli_stream_flush(kiln_cli_stream *g) {
    if (g->n == g->printed) return;
    fwrite(g->p + g->printed, 1, g->n - g->printed, stdout);
    fflush(stdout);
    g->printed = g->n;
}

/* ---------------------------------------------------------------- options */

_Static_assert(_Generic((int32_t)0, int: 1, default: 0), "KILN_CLI_INT writes int32_t fields as int");

static const kiln_cli_opt *find_opt(const kiln_cli_opt *opts, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (strcmp(opts[i].name, name) == 0) return &opts[i];
    return NULL;
}

/* Levenshtein distance of a and b[0..nb), capped at 8 (longer names are not worth suggesting). */
static int edit_distance(const char *a, const char *b, size_t nb) {
    size_t na = strlen(a);
    if (na > 40 || nb > 40) return 8;
    int row[41];
    for (size_t j = 0; j <= nb; j++) row[j] = (int)j;
    for (size_t i = 1; i <= na; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= nb; j++) {
            int up = row[j], best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            diag = up, row[j] = best;
        }
    }
    return row[nb] < 8 ? row[nb] : 8;
}

/* The name in opts nearest to arg, when it is close (at most 2 edits, and at most a third of its length), or NULL. */
static const char *nearest_opt(const kiln_cli_opt *opts, int n, const char *arg) {
    int third = (int)strlen(arg) / 3, best = (third < 2 ? third : 2) + 1;
    const char *near = NULL;
    for (int i = 0; i < n; i++) {
        int d = edit_distance(arg, opts[i].name, strlen(opts[i].name));
        if (d < best) best = d, near = opts[i].name;
    }
    return near;
}

/* The int64 bounds of an option: its double lo/hi, cut to what an int64_t holds (2^63 itself does not). */
static int64_t i64_bound(double v) { return v >= 0x1p63 ? INT64_MAX : v <= -0x1p63 ? INT64_MIN : (int64_t)v; }

/* Parses value a of option o (typed as name, which the errors use) into its out. */
static bool set_opt(const char *cmd, const kiln_cli_opt *o, const char *name, const char *a) {
    int64_t n;
    double v;
    switch (o->kind) {
    case KILN_CLI_FLAG: *(bool *)o->out = true; return true;
    case KILN_CLI_STR: *(const char **)o->out = a; return true;
    case KILN_CLI_LIST: {
        kiln_cli_list *l = o->out;
        if (l->n == KILN_CLI_LIST_MAX) return !kiln_cli_error("%s: %s is given more than %d times", cmd, name, KILN_CLI_LIST_MAX);
        l->v[l->n++] = a;
        return true;
    }
    case KILN_CLI_U64: return kiln_cli_parse_u64(cmd, name, a, o->out);
    case KILN_CLI_INT:
    case KILN_CLI_I64:
        if (!kiln_cli_parse_int(cmd, name, a, i64_bound(o->lo), i64_bound(o->hi), &n)) return false;
        if (o->kind == KILN_CLI_INT) *(int *)o->out = (int)n;
        else *(int64_t *)o->out = n;
        return true;
    case KILN_CLI_FLOAT:
    case KILN_CLI_DOUBLE:
        if (!kiln_cli_parse_num(cmd, name, a, o->lo, o->hi, &v)) return false;
        if (o->kind == KILN_CLI_FLOAT) *(float *)o->out = (float)v;
        else *(double *)o->out = v;
        return true;
    case KILN_CLI_KV_TYPE:
        if (kiln_kv_type_from_name(a, o->out) == KILN_OK) return true;
        return !kiln_cli_error("%s: %s: unknown KV cache type '%s' (f16, f32, bf16, q8_0, q4_0)", cmd, name, a);
    }
    return false;
}

bool kiln_cli_is_option(const char *arg) { return arg[0] == '-' && arg[1] != 0; }

const char *kiln_cli_value(const char *cmd, int argc, char **argv, int *i) {
    if (*i + 1 < argc) return argv[++*i];
    kiln_cli_error("%s: %s needs a value", cmd, argv[*i]);
    return NULL;
}

bool kiln_cli_version(const char *arg) {
    if (strcmp(arg, "--version") != 0) return false;
    printf("kiln %s\n", KILN_VERSION);
    return true;
}

int kiln_cli_unknown(const char *cmd, const char *arg) {
    return kiln_cli_error(kiln_cli_is_option(arg) ? "%s: unknown option '%s'" : "%s: unexpected argument '%s'", cmd, arg);
}

bool kiln_cli_parse_args(const char *cmd, int argc, char **argv, const kiln_cli_opt *opts, int n_opts, const char **pos,
                         int max_pos, int *n_pos) {
    *n_pos = 0;
    bool options = true;
    for (int i = 0; i < argc; i++) {
        const kiln_cli_opt *o = NULL;
        if (options && strcmp(argv[i], "--") == 0) {
            options = false;
            continue;
        }
        if (options && kiln_cli_is_option(argv[i])) {
            const char *name = argv[i];
            if (!(o = find_opt(opts, n_opts, name))) {
                if (kiln_cli_version(name)) exit(0);
                const char *near = nearest_opt(opts, n_opts, name);
                if (!near) return !kiln_cli_unknown(cmd, name);
                return !kiln_cli_error("%s: unknown option '%s' (did you mean %s?)", cmd, name, near);
            }
            const char *a = o->kind == KILN_CLI_FLAG ? NULL : kiln_cli_value(cmd, argc, argv, &i);
            if ((o->kind != KILN_CLI_FLAG && !a) || !set_opt(cmd, o, name, a)) return false;
        } else if (*n_pos == max_pos)
            return !kiln_cli_error("%s: unexpected argument '%s'%s", cmd, argv[i], options ? "" : " after --");
        else
            pos[(*n_pos)++] = argv[i];
    }
    return true;
}

int kiln_cli_sampling_opts(kiln_cli_opt *o, kiln_sampler_params *sp, kiln_session_params *sess) {
    const kiln_cli_opt t[KILN_CLI_N_SAMPLING] = {
        {"-t", KILN_CLI_INT, &sess->n_threads, 0, 4096},
        {"--threads", KILN_CLI_INT, &sess->n_threads, 0, 4096},
        {"-c", KILN_CLI_I64, &sess->n_ctx, 0, INT32_MAX},
        {"--ctx-size", KILN_CLI_I64, &sess->n_ctx, 0, INT32_MAX},
        {"-b", KILN_CLI_I64, &sess->n_batch, 1, INT32_MAX},
        {"--batch-size", KILN_CLI_I64, &sess->n_batch, 1, INT32_MAX},
        {"-ngl", KILN_CLI_INT, &sess->n_gpu_layers, 0, INT32_MAX},
        {"--gpu-layers", KILN_CLI_INT, &sess->n_gpu_layers, 0, INT32_MAX},
        {"--n-gpu-layers", KILN_CLI_INT, &sess->n_gpu_layers, 0, INT32_MAX},
        {"--temp", KILN_CLI_FLOAT, &sp->temp, 0, 1e9},
        {"--temperature", KILN_CLI_FLOAT, &sp->temp, 0, 1e9},
        {"--top-k", KILN_CLI_INT, &sp->top_k, 0, INT32_MAX},
        {"--top-p", KILN_CLI_FLOAT, &sp->top_p, 0, 1},
        {"--min-p", KILN_CLI_FLOAT, &sp->min_p, 0, 1},
        {"--repeat-penalty", KILN_CLI_FLOAT, &sp->repeat_penalty, 1e-6, 1e9},
        {"--repeat-last-n", KILN_CLI_INT, &sp->repeat_last_n, -1, INT32_MAX}, /* -1: the whole context */
        {"--presence-penalty", KILN_CLI_FLOAT, &sp->presence_penalty, -1e9, 1e9},
        {"--frequency-penalty", KILN_CLI_FLOAT, &sp->frequency_penalty, -1e9, 1e9},
        {"--seed", KILN_CLI_U64, &sp->seed, 0, 0},
        {"-s", KILN_CLI_U64, &sp->seed, 0, 0},
    };
    memcpy(o, t, sizeof t);
    return KILN_CLI_N_SAMPLING;
}

/* ---------------------------------------------------------------- KV-cache types (llama.cpp's flags) */

int kiln_cli_kv_opts(kiln_cli_opt *o, kiln_session_params *sess) {
    const kiln_cli_opt t[KILN_CLI_N_KV] = {
        {"-ctk", KILN_CLI_KV_TYPE, &sess->type_k, 0, 0},
        {"--cache-type-k", KILN_CLI_KV_TYPE, &sess->type_k, 0, 0},
        {"-ctv", KILN_CLI_KV_TYPE, &sess->type_v, 0, 0},
        {"--cache-type-v", KILN_CLI_KV_TYPE, &sess->type_v, 0, 0},
    };
    memcpy(o, t, sizeof t);
    return KILN_CLI_N_KV;
}

int kiln_cli_kv_opt(const char *cmd, const char *f, const char *a, kiln_session_params *sess) {
    kiln_cli_opt t[KILN_CLI_N_KV];
    const kiln_cli_opt *o = find_opt(t, kiln_cli_kv_opts(t, sess), f);
    if (!o) return 0;
    if (!a) return -kiln_cli_error("%s: %s needs a value", cmd, f);
    return set_opt(cmd, o, f, a) ? 1 : -1;
}

/* ---------------------------------------------------------------- RoPE overrides (llama.cpp's flags) */

void kiln_cli_rope_init(kiln_cli_rope *r) { *r = (kiln_cli_rope){.ov = kiln_rope_overrides_default()}; }

int kiln_cli_rope_opts(kiln_cli_opt *o, kiln_cli_rope *r) {
    const kiln_cli_opt t[KILN_CLI_N_ROPE] = {
        {"--rope-scaling", KILN_CLI_STR, &r->scaling, 0, 0},
        {"--rope-scale", KILN_CLI_FLOAT, &r->rope_scale, 1e-6, 1e6},
        {"--rope-freq-base", KILN_CLI_FLOAT, &r->ov.freq_base, 1e-6, 1e12},
        {"--rope-freq-scale", KILN_CLI_FLOAT, &r->ov.freq_scale, 1e-6, 1e6},
        {"--yarn-orig-ctx", KILN_CLI_I64, &r->ov.yarn_orig_ctx, 0, INT32_MAX},
        {"--yarn-ext-factor", KILN_CLI_FLOAT, &r->ov.yarn_ext_factor, -1, 1e3}, /* negative: the file's, as llama.cpp */
        {"--yarn-attn-factor", KILN_CLI_FLOAT, &r->ov.yarn_attn_factor, 1e-6, 1e3},
        {"--yarn-beta-slow", KILN_CLI_FLOAT, &r->ov.yarn_beta_slow, 1e-6, 1e6},
        {"--yarn-beta-fast", KILN_CLI_FLOAT, &r->ov.yarn_beta_fast, 1e-6, 1e6},
    };
    memcpy(o, t, sizeof t);
    return KILN_CLI_N_ROPE;
}

int kiln_cli_rope_opt(const char *cmd, const char *f, const char *a, kiln_cli_rope *r) {
    kiln_cli_opt t[KILN_CLI_N_ROPE];
    const kiln_cli_opt *o = find_opt(t, kiln_cli_rope_opts(t, r), f);
    if (!o) return 0;
    if (!a) return -kiln_cli_error("%s: %s needs a value", cmd, f);
    return set_opt(cmd, o, f, a) ? 1 : -1;
}

bool kiln_cli_rope_apply(const char *cmd, kiln_cli_rope *r, kiln_model *m) {
    static const struct {
        const char *name;
        kiln_rope_scaling_type type;
    } types[] = {{"none", KILN_ROPE_SCALING_NONE}, {"linear", KILN_ROPE_SCALING_LINEAR}, {"yarn", KILN_ROPE_SCALING_YARN}};
    if (r->scaling) {
        size_t i = 0;
        while (i < sizeof types / sizeof types[0] && strcmp(r->scaling, types[i].name) != 0) i++;
        if (i == sizeof types / sizeof types[0]) {
            kiln_cli_error("%s: --rope-scaling needs none, linear or yarn, got '%s'", cmd, r->scaling);
            return false;
        }
        r->ov.type = types[i].type;
    }
    /* --rope-scale N is --rope-freq-scale 1/N (llama.cpp's); an explicit --rope-freq-scale wins */
    if (r->rope_scale > 0 && !(r->ov.freq_scale > 0)) r->ov.freq_scale = 1.0f / r->rope_scale;
    kiln_status s = kiln_model_set_rope(m, &r->ov);
    if (s) kiln_cli_die(s);
    return !s;
}

/* The bundled default model (models/, trained by kiln on tinyshakespeare: README.md says how): looked up
 * beside the binary (build/kiln -> models/) so it works from any folder, then in the current folder. */
const char *kiln_cli_default_model(char *buf, size_t n) {
    char exe[4096];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len > 0) {
        exe[len] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = 0;
            int w = snprintf(buf, n, "%s/../models/shakespeare.gguf", exe);
            if (w > 0 && (size_t)w < n && access(buf, R_OK) == 0) return buf;
        }
    }
    snprintf(buf, n, "models/shakespeare.gguf");
    return access(buf, R_OK) == 0 ? buf : NULL;
}

/* ---------------------------------------------------------------- files and grammars */

char *kiln_cli_read_file(const char *cmd, const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        kiln_cli_error("%s: %s: cannot open: %s", cmd, path, strerror(errno));
        return NULL;
    }
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n + 65536 + 1 > cap) {
            char *p = realloc(buf, cap = (n + 65536 + 1) * 2);
            if (!p) break;
            buf = p;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0) break;
    }
    bool bad = ferror(f) || !buf || n + 1 > cap;
    fclose(f);
    if (bad) {
        free(buf);
        kiln_cli_error("%s: %s: read failed", cmd, path);
        return NULL;
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

int kiln_cli_grammar_opts(kiln_cli_opt *opts, kiln_cli_grammar *g) {
    opts[0] = (kiln_cli_opt){"--grammar", KILN_CLI_STR, &g->grammar, 0, 0};
    opts[1] = (kiln_cli_opt){"--grammar-file", KILN_CLI_STR, &g->grammar_file, 0, 0};
    opts[2] = (kiln_cli_opt){"--json-schema", KILN_CLI_STR, &g->schema, 0, 0};
    opts[3] = (kiln_cli_opt){"--json-schema-file", KILN_CLI_STR, &g->schema_file, 0, 0};
    return KILN_CLI_N_GRAMMAR;
}

bool kiln_cli_grammar_given(const kiln_cli_grammar *g) { return g->grammar || g->grammar_file || g->schema || g->schema_file; }

bool kiln_cli_grammar_load(const char *cmd, const kiln_cli_grammar *g, kiln_grammar **out) {
    *out = NULL;
    const char *given[4] = {g->grammar, g->grammar_file, g->schema, g->schema_file};
    static const char *names[4] = {"--grammar", "--grammar-file", "--json-schema", "--json-schema-file"};
    int first = -1;
    for (int i = 0; i < 4; i++) {
        if (!given[i]) continue;
        if (first >= 0) {
            kiln_cli_error("%s: %s with %s: give one grammar or JSON schema, not both", cmd, names[first], names[i]);
            return false;
        }
        first = i;
    }
    if (first < 0) return true;
    const char *file = first == 1 || first == 3 ? given[first] : NULL;
    char *text = NULL;
    size_t len = file ? 0 : strlen(given[first]);
    if (file && !(text = kiln_cli_read_file(cmd, file, &len))) return false;
    const char *src = file ? text : given[first];
    kiln_status s = KILN_OK;
    char *gbnf = NULL;
    if (first >= 2) { /* the schema becomes the grammar's text */
        s = kiln_json_schema_to_gbnf(src, len, &gbnf, &len);
        src = gbnf;
    }
    if (!s) s = kiln_grammar_parse(src, len, NULL, out);
    free(text), free(gbnf);
    if (s) {
        if (file) kiln_cli_error("%s: %s: %s", cmd, file, kiln_last_error());
        else kiln_cli_error("%s: %s: %s", cmd, names[first], kiln_last_error());
        *out = NULL;
        return false;
    }
    return true;
}
