/* plot.c: `kiln plot`, a training log (JSONL) to an SVG of the train and validation loss against the step.
 *
 * The log is read line by line with a small scanner for flat JSON objects: keys are strings, values numbers,
 * strings, true/false/null or nested objects and arrays (skipped). "step" with "loss" makes a training point,
 * "step" with "val_loss" a validation point; nan/inf values (strtod's spellings, which a diverged run may print)
 * are read but not drawn. Axes get "nice" tick values (Heckbert, "Nice numbers for graph labels", Graphics
 * Gems, 1990): the x axis widens to whole ticks, the y axis spans the data plus 5% each side. A long, noisy
 * training curve is drawn raw and faint with an exponential moving average over it. The SVG is self-contained
 * (no scripts, fonts or styles from outside). tests/test_data.c checks the points, ticks, legend and the
 * error for a malformed line. */
#include "kiln.h"
#include "tools/plot.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---------------------------------------------------------------- the log */

typedef struct series {
    double *x, *y; /* (n) step, loss */
    size_t n, cap;
} series;

static bool series_push(series *s, double x, double y) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 256;
        double *nx = realloc(s->x, cap * sizeof *nx);
        if (!nx) return false;
        s->x = nx;
        double *ny = realloc(s->y, cap * sizeof *ny);
        if (!ny) return false;
        s->y = ny, s->cap = cap;
    }
    s->x[s->n] = x, s->y[s->n] = y, s->n++;
    return true;
}

static void series_free(series *s) {
    free(s->x);
    free(s->y);
}

typedef struct scanner {
    const char *p, *end;
    const char *why; /* set on the first error */
} scanner;

static void skip_ws(scanner *s) {
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\r' || *s->p == '\n')) s->p++;
}

/* A JSON string at p ('"' expected); start and len get its raw bytes between the quotes. */
static bool scan_string(scanner *s, const char **start, size_t *len) {
    if (s->p >= s->end || *s->p != '"') return s->why = "expected a string", false;
    const char *b = ++s->p;
    while (s->p < s->end && *s->p != '"') s->p += *s->p == '\\' ? 2 : 1;
    if (s->p >= s->end) return s->why = "unterminated string", false;
    if (start) *start = b, *len = (size_t)(s->p - b);
    s->p++;
    return true;
}

/* Skips a nested object or array, strings inside included. */
static bool skip_nested(scanner *s) {
    int depth = 0;
    while (s->p < s->end) {
        char c = *s->p;
        if (c == '"') {
            if (!scan_string(s, NULL, NULL)) return false;
            continue;
        }
        if (c == '{' || c == '[') depth++;
        else if (c == '}' || c == ']') depth--;
        s->p++;
        if (depth == 0) return true;
    }
    return s->why = "unterminated object or array", false;
}

/* One value; *num gets it and *is_num is set when it is a number. */
static bool scan_value(scanner *s, double *num, bool *is_num) {
    *is_num = false;
    if (s->p >= s->end) return s->why = "expected a value", false;
    if (*s->p == '"') return scan_string(s, NULL, NULL);
    if (*s->p == '{' || *s->p == '[') return skip_nested(s);
    const char *b = s->p;
    while (s->p < s->end && *s->p != ',' && *s->p != '}' && *s->p != ']' && !isspace((unsigned char)*s->p)) s->p++;
    size_t n = (size_t)(s->p - b);
    if (n == 0) return s->why = "expected a value", false;
    if ((n == 4 && !memcmp(b, "true", 4)) || (n == 5 && !memcmp(b, "false", 5)) || (n == 4 && !memcmp(b, "null", 4))) return true;
    char tmp[64];
    if (n >= sizeof tmp) return s->why = "bad value", false;
    memcpy(tmp, b, n);
    tmp[n] = 0;
    char *e;
    *num = strtod(tmp, &e);
    if (e != tmp + n) return s->why = "bad value", false;
    *is_num = true;
    return true;
}

typedef struct log_line {
    bool has_step, has_loss, has_val;
    double step, loss, val;
} log_line;

/* Reads one flat JSON object; s->why says what was wrong when it returns false. */
static bool scan_line(scanner *s, log_line *out) {
    *out = (log_line){0};
    skip_ws(s);
    if (s->p >= s->end || *s->p != '{') return s->why = "expected '{'", false;
    s->p++;
    skip_ws(s);
    if (s->p < s->end && *s->p == '}') s->p++;
    else
        for (;;) {
            const char *k;
            size_t kn;
            skip_ws(s);
            if (!scan_string(s, &k, &kn)) return false;
            skip_ws(s);
            if (s->p >= s->end || *s->p != ':') return s->why = "expected ':' after a key", false;
            s->p++;
            skip_ws(s);
            double v = 0;
            bool is_num;
            if (!scan_value(s, &v, &is_num)) return false;
            bool *has = NULL;
            double *dst = NULL;
            if (kn == 4 && !memcmp(k, "step", 4)) has = &out->has_step, dst = &out->step;
            else if (kn == 4 && !memcmp(k, "loss", 4)) has = &out->has_loss, dst = &out->loss;
            else if (kn == 8 && !memcmp(k, "val_loss", 8)) has = &out->has_val, dst = &out->val;
            if (has) {
                if (!is_num) return s->why = "\"step\", \"loss\" and \"val_loss\" must be numbers", false;
                *has = true, *dst = v;
            }
            skip_ws(s);
            if (s->p < s->end && *s->p == ',') {
                s->p++;
                continue;
            }
            if (s->p < s->end && *s->p == '}') {
                s->p++;
                break;
            }
            return s->why = "expected ',' or '}'", false;
        }
    skip_ws(s);
    if (s->p != s->end) return s->why = "text after the closing '}'", false;
    return true;
}

static kiln_status read_log(const char *path, series *train, series *val) {
    FILE *f = fopen(path, "rb");
    if (!f) return kiln_fail(KILN_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    kiln_status s = KILN_OK;
    for (long lineno = 1; (n = getline(&line, &cap, f)) >= 0; lineno++) {
        scanner sc = {line, line + n, NULL};
        skip_ws(&sc);
        if (sc.p == sc.end) continue; /* blank line */
        log_line ll;
        if (!scan_line(&sc, &ll)) {
            s = kiln_fail(KILN_ERR_FORMAT, "%s:%ld: malformed log line: %s at column %ld", path, lineno, sc.why, (long)(sc.p - line) + 1);
            break;
        }
        if (!ll.has_step) continue;
        if ((ll.has_loss && isfinite(ll.loss) && !series_push(train, ll.step, ll.loss)) ||
            (ll.has_val && isfinite(ll.val) && !series_push(val, ll.step, ll.val))) {
            s = kiln_fail(KILN_ERR_NOMEM, "%s:%ld: out of memory for the points", path, lineno);
            break;
        }
    }
    if (!s && ferror(f)) s = kiln_fail(KILN_ERR_IO, "%s: read failed", path);
    free(line);
    fclose(f);
    if (!s && train->n + val->n == 0) s = kiln_fail(KILN_ERR_FORMAT, "%s: no points to plot (no line has \"step\" with a finite \"loss\" or \"val_loss\")", path);
    return s;
}

/* ---------------------------------------------------------------- ticks */

/* Heckbert's rounded nice number: x to 1, 2, 5 or 10 times a power of ten. */
static double nice_num(double x) {
    double e = floor(log10(x)), f = x / pow(10, e);
    return (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * pow(10, e);
}

/* The tick spacing for about n ticks over [lo, hi] (hi > lo): the rounded nice number near (hi - lo) / (n - 1),
 * stepped down (5 -> 2 -> 1 -> 0.5) while fewer than 4 of its multiples fall inside, so a tight axis still gets
 * enough labels (Heckbert's loose labels, nice(nice(range) / (n - 1)), leave two on an axis from 1.3 to 11.5). */
static double tick_step(double lo, double hi, int n) {
    double d = nice_num((hi - lo) / (n - 1));
    for (int k = 0; k < 8 && floor(hi / d + 1e-6) - ceil(lo / d - 1e-6) + 1 < 4; k++) {
        double m = d / pow(10, floor(log10(d) + 1e-9));
        d *= m > 4.5 ? 0.4 : 0.5; /* 5 -> 2, 2 -> 1, 1 -> 0.5 */
    }
    return d;
}

/* The multiples of d within [lo, hi] (to a millionth of d), at most max of them, into out. Counted, not
 * accumulated, so no rounding drift and no endless loop where v + d == v. */
static int tick_values(double lo, double hi, double d, double *out, int max) {
    double first = ceil(lo / d - 1e-6);
    int n = 0;
    for (int i = 0; n < max; i++) {
        double v = (first + i) * d;
        if (v > hi + 1e-6 * d) break;
        out[n++] = fabs(v) < 1e-9 * d ? 0.0 : v; /* no "-0" label */
    }
    return n;
}

/* Digits after the point that a tick spacing d needs. */
static int tick_digits(double d) {
    int k = (int)-floor(log10(d) + 1e-9);
    return k > 0 ? k : 0;
}

/* ---------------------------------------------------------------- SVG */

enum { W = 800, H = 480, LEFT = 72, RIGHT = 24, TOP = 48, BOTTOM = 56 };
#define TRAIN_COLOR "#1f77b4"
#define VAL_COLOR "#ff7f0e"

typedef struct frame {
    double x0, x1, y0, y1; /* data range drawn */
} frame;

static double px(const frame *fr, double x) { return LEFT + (x - fr->x0) / (fr->x1 - fr->x0) * (W - LEFT - RIGHT); }
static double py(const frame *fr, double y) { return TOP + (fr->y1 - y) / (fr->y1 - fr->y0) * (H - TOP - BOTTOM); }

static void put_escaped(FILE *f, const char *s) {
    for (; *s; s++) {
        switch (*s) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        default:
            if ((unsigned char)*s >= 0x20 || *s == '\t') fputc(*s, f);
        }
    }
}

static void polyline(FILE *f, const frame *fr, const double *x, const double *y, size_t n, const char *cls, const char *style) {
    fprintf(f, "<polyline class=\"%s\" fill=\"none\" %s points=\"", cls, style);
    for (size_t i = 0; i < n; i++) fprintf(f, "%s%.2f,%.2f", i ? " " : "", px(fr, x[i]), py(fr, y[i]));
    fputs("\"/>\n", f);
}

/* Exponential moving average with the start-up bias removed (as Adam's moments): s_i = b s_{i-1} + (1-b) y_i,
 * divided by 1 - b^(i+1), so the first points are not pulled towards 0. */
static void ema(const double *y, size_t n, double beta, double *out) {
    double s = 0, bp = 1;
    for (size_t i = 0; i < n; i++) {
        s = beta * s + (1 - beta) * y[i];
        bp *= beta;
        out[i] = s / (1 - bp);
    }
}

static void write_svg(FILE *f, const series *train, const series *val, const char *title, const double *smooth) {
    /* data ranges over both series */
    double xmin = INFINITY, xmax = -INFINITY, ymin = INFINITY, ymax = -INFINITY;
    const series *all[2] = {train, val};
    for (int k = 0; k < 2; k++)
        for (size_t i = 0; i < all[k]->n; i++) {
            xmin = fmin(xmin, all[k]->x[i]), xmax = fmax(xmax, all[k]->x[i]);
            ymin = fmin(ymin, all[k]->y[i]), ymax = fmax(ymax, all[k]->y[i]);
        }
    if (xmax <= xmin) xmin -= 1, xmax += 1;
    if (ymax <= ymin) {
        double d = fabs(ymin) > 0 ? 0.1 * fabs(ymin) : 1;
        ymin -= d, ymax += d;
    }
    /* x: widened to whole ticks (steps start at round numbers); y: the data plus 5% */
    double dx = tick_step(xmin, xmax, 6);
    frame fr = {floor(xmin / dx) * dx, ceil(xmax / dx) * dx, ymin - 0.05 * (ymax - ymin), ymax + 0.05 * (ymax - ymin)};
    double dy = tick_step(fr.y0, fr.y1, 6);

    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
               "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\"12\">\n"
               "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
            W, H, W, H);
    fprintf(f, "<text class=\"title\" x=\"%d\" y=\"28\" text-anchor=\"middle\" font-size=\"16\" font-weight=\"bold\">", W / 2);
    put_escaped(f, title);
    fputs("</text>\n", f);

    /* grid and tick labels */
    double xt[32], yt[32];
    int nxt = tick_values(fr.x0, fr.x1, dx, xt, 32), nyt = tick_values(fr.y0, fr.y1, dy, yt, 32);
    fputs("<g class=\"grid\" stroke=\"#e0e0e0\" stroke-width=\"1\">\n", f);
    for (int i = 0; i < nxt; i++) fprintf(f, "<line x1=\"%.2f\" y1=\"%d\" x2=\"%.2f\" y2=\"%d\"/>\n", px(&fr, xt[i]), TOP, px(&fr, xt[i]), H - BOTTOM);
    for (int i = 0; i < nyt; i++) fprintf(f, "<line x1=\"%d\" y1=\"%.2f\" x2=\"%d\" y2=\"%.2f\"/>\n", LEFT, py(&fr, yt[i]), W - RIGHT, py(&fr, yt[i]));
    fputs("</g>\n<g class=\"ticks\" fill=\"#333\">\n", f);
    for (int i = 0; i < nxt; i++)
        fprintf(f, "<text class=\"xtick\" x=\"%.2f\" y=\"%d\" text-anchor=\"middle\">%.*f</text>\n", px(&fr, xt[i]), H - BOTTOM + 18, tick_digits(dx), xt[i]);
    for (int i = 0; i < nyt; i++)
        fprintf(f, "<text class=\"ytick\" x=\"%d\" y=\"%.2f\" text-anchor=\"end\" dominant-baseline=\"middle\">%.*f</text>\n", LEFT - 8, py(&fr, yt[i]),
                tick_digits(dy), yt[i]);
    fputs("</g>\n", f);
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#333\"/>\n", LEFT, TOP, W - LEFT - RIGHT, H - TOP - BOTTOM);
    fprintf(f, "<text class=\"xlabel\" x=\"%d\" y=\"%d\" text-anchor=\"middle\" font-size=\"13\">step</text>\n", LEFT + (W - LEFT - RIGHT) / 2, H - 14);
    fprintf(f, "<text class=\"ylabel\" x=\"18\" y=\"%d\" text-anchor=\"middle\" font-size=\"13\" transform=\"rotate(-90 18 %d)\">loss</text>\n",
            TOP + (H - TOP - BOTTOM) / 2, TOP + (H - TOP - BOTTOM) / 2);

    /* curves, clipped to the plot area */
    fprintf(f, "<clipPath id=\"plot\"><rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\"/></clipPath>\n<g clip-path=\"url(#plot)\">\n", LEFT, TOP,
            W - LEFT - RIGHT, H - TOP - BOTTOM);
    if (train->n) {
        polyline(f, &fr, train->x, train->y, train->n, "train",
                 smooth ? "stroke=\"" TRAIN_COLOR "\" stroke-opacity=\"0.3\" stroke-width=\"1\"" : "stroke=\"" TRAIN_COLOR "\" stroke-width=\"1.5\"");
        if (smooth) polyline(f, &fr, train->x, smooth, train->n, "train-ema", "stroke=\"" TRAIN_COLOR "\" stroke-width=\"2\"");
    }
    if (val->n) {
        polyline(f, &fr, val->x, val->y, val->n, "val", "stroke=\"" VAL_COLOR "\" stroke-width=\"1.5\"");
        fputs("<g class=\"val-markers\" fill=\"" VAL_COLOR "\">\n", f);
        for (size_t i = 0; i < val->n; i++) fprintf(f, "<circle cx=\"%.2f\" cy=\"%.2f\" r=\"3\"/>\n", px(&fr, val->x[i]), py(&fr, val->y[i]));
        fputs("</g>\n", f);
    }
    fputs("</g>\n", f);

    /* legend, top right inside the plot, with each curve's last value */
    int n_items = (train->n ? 1 : 0) + (smooth ? 1 : 0) + (val->n ? 1 : 0), lw = 190, lx = W - RIGHT - lw - 10, ly = TOP + 10;
    fprintf(f, "<g class=\"legend\">\n<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"white\" fill-opacity=\"0.85\" stroke=\"#bbb\"/>\n", lx, ly, lw,
            8 + 18 * n_items);
    int row = 0;
    if (train->n) {
        int y = ly + 14 + 18 * row++;
        fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"" TRAIN_COLOR "\" stroke-width=\"2\"%s/>\n", lx + 8, y, lx + 32, y,
                smooth ? " stroke-opacity=\"0.3\"" : "");
        fprintf(f, "<text x=\"%d\" y=\"%d\" dominant-baseline=\"middle\">train (last %.4g)</text>\n", lx + 40, y, train->y[train->n - 1]);
    }
    if (smooth) {
        int y = ly + 14 + 18 * row++;
        fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"" TRAIN_COLOR "\" stroke-width=\"2\"/>\n", lx + 8, y, lx + 32, y);
        fprintf(f, "<text x=\"%d\" y=\"%d\" dominant-baseline=\"middle\">train, smoothed (%.4g)</text>\n", lx + 40, y, smooth[train->n - 1]);
    }
    if (val->n) {
        int y = ly + 14 + 18 * row++;
        fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"" VAL_COLOR "\" stroke-width=\"2\"/>\n", lx + 8, y, lx + 32, y);
        fprintf(f, "<circle cx=\"%d\" cy=\"%d\" r=\"3\" fill=\"" VAL_COLOR "\"/>\n", lx + 20, y);
        fprintf(f, "<text x=\"%d\" y=\"%d\" dominant-baseline=\"middle\">val (last %.4g)</text>\n", lx + 40, y, val->y[val->n - 1]);
    }
    fputs("</g>\n</svg>\n", f);
}

/* Training curves of at least this many points are drawn raw and faint under a smoothed line. */
#define SMOOTH_MIN_POINTS 64

kiln_status kiln_plot_loss_svg(const char *log_path, const char *svg_path, const char *title) {
    if (!log_path || !svg_path) return kiln_fail(KILN_ERR_INVALID, "plot: no log or output path");
    series train = {0}, val = {0};
    double *smooth = NULL;
    char *tmp = NULL;
    kiln_status s = read_log(log_path, &train, &val);
    if (!s && train.n >= SMOOTH_MIN_POINTS) {
        /* a span of about 1/32 of the curve: beta = 1 - 2/(span+1), the usual span-to-EMA relation */
        double span = fmin(fmax((double)train.n / 32, 2), 200);
        if (!(smooth = malloc(train.n * sizeof *smooth))) s = kiln_fail(KILN_ERR_NOMEM, "plot: out of memory");
        else ema(train.y, train.n, 1 - 2 / (span + 1), smooth);
    }
    if (!s) {
        /* written beside the target and renamed over it, so a viewer never reads half a plot */
        size_t tl = strlen(svg_path) + 32;
        FILE *f = NULL;
        if (!(tmp = malloc(tl))) s = kiln_fail(KILN_ERR_NOMEM, "plot: out of memory");
        else {
            snprintf(tmp, tl, "%s.tmp.%ld", svg_path, (long)getpid());
            if (!(f = fopen(tmp, "wb"))) s = kiln_fail(KILN_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
        }
        if (f) {
            write_svg(f, &train, &val, title && *title ? title : "training loss", smooth);
            bool bad = ferror(f) != 0;
            if (fclose(f) != 0 || bad) s = kiln_fail(KILN_ERR_IO, "%s: write failed", tmp);
            else if (rename(tmp, svg_path) != 0) s = kiln_fail(KILN_ERR_IO, "%s: rename from %s failed: %s", svg_path, tmp, strerror(errno));
            if (s) unlink(tmp);
        }
    }
    free(tmp);
    free(smooth);
    series_free(&train);
    series_free(&val);
    return s;
}
