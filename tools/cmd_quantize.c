/* cmd_quantize.c: `kiln inspect FILE.gguf [--all]` (the metadata, the tensor table, and the types in it that kiln
 * cannot run with the command that converts them) and `kiln quantize IN OUT --type T [--dry-run] [-t N]` (llama.cpp's
 * mixes, src/model/quantize.c; --dry-run prints each tensor's new type and the file's size without writing it).
 * Progress rewrites one line when stderr is a terminal and prints plain lines otherwise. tests/test_quantize.c and
 * tests/test_cli.sh run both. */
#include "kiln.h"
#include "tools/cli.h"
#include "tools/cmd.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---------------------------------------------------------------- inspect */

/* Prints a string value from a file, escaped and cut at max bytes. */
static void print_str(kiln_str s, size_t max) {
    size_t n = s.len < max ? (size_t)s.len : max;
    kiln_cli_put_quoted(stdout, s.ptr, n);
    if (n < s.len) printf("...(%" PRIu64 " bytes)", s.len);
}

static void print_value(const kiln_gguf_value *v, bool all, int depth) {
    switch (v->type) {
    case KILN_GGUF_STRING: print_str(v->str, all ? SIZE_MAX : 200); break;
    case KILN_GGUF_BOOL: printf("%s", v->u64 ? "true" : "false"); break;
    case KILN_GGUF_FLOAT32: printf("%.7g", v->f64); break;
    case KILN_GGUF_FLOAT64: printf("%.17g", v->f64); break;
    case KILN_GGUF_INT8:
    case KILN_GGUF_INT16:
    case KILN_GGUF_INT32:
    case KILN_GGUF_INT64: printf("%" PRId64, v->i64); break;
    case KILN_GGUF_ARRAY: {
        /* long arrays are summarized: their type, length and first few elements */
        uint64_t show = all ? v->arr.n : (v->arr.n < 8 ? v->arr.n : 5);
        printf("[%s x %" PRIu64 "] [", kiln_gguf_vtype_name(v->arr.type), v->arr.n);
        for (uint64_t i = 0; i < show; i++) {
            if (i) printf(", ");
            if (v->arr.items) print_value(&v->arr.items[i], all, depth + 1);
            else {
                kiln_gguf_value e = {.type = v->arr.type};
                if (v->arr.type == KILN_GGUF_FLOAT32 || v->arr.type == KILN_GGUF_FLOAT64) e.f64 = kiln_gguf_arr_f64(v, i);
                else if (v->arr.type == KILN_GGUF_INT8 || v->arr.type == KILN_GGUF_INT16 || v->arr.type == KILN_GGUF_INT32 ||
                         v->arr.type == KILN_GGUF_INT64)
                    e.i64 = kiln_gguf_arr_i64(v, i);
                else e.u64 = kiln_gguf_arr_u64(v, i);
                print_value(&e, all, depth + 1);
            }
        }
        if (show < v->arr.n) printf(", ...");
        printf("]");
        break;
    }
    default: printf("%" PRIu64, v->u64); break;
    }
}

static void human_bytes(char *out, size_t n, double b) {
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (b >= 1024 && i < 4) b /= 1024, i++;
    snprintf(out, n, i ? "%.2f %s" : "%.0f %s", b, u[i]);
}

/* The types of g's tensors that kiln cannot run, and the command that converts the file: kiln's q4_k_m of it, when
 * kiln can read every tensor (its plan says so), else of the model's F16 file. Nothing when kiln runs every one. */
static void print_unrunnable(const kiln_gguf *g, const char *path) {
    int64_t count[KILN_TYPE_COUNT] = {0}, n = 0;
    for (int64_t i = 0; i < kiln_gguf_n_tensors(g); i++) {
        kiln_type t = kiln_gguf_tensor_at(g, i)->type;
        if (!kiln_type_runnable(t)) count[t]++, n++;
    }
    if (!n) return;
    printf("\nkiln cannot run %" PRId64 " of these tensors:", n);
    for (int t = 0, first = 1; t < KILN_TYPE_COUNT; t++)
        if (count[t]) printf("%s %s (%" PRId64 ")", first ? "" : ",", kiln_type_name((kiln_type)t), count[t]), first = 0;
    printf("; it runs");
    for (int t = 0; t < KILN_TYPE_COUNT; t++)
        if (kiln_type_runnable((kiln_type)t)) printf(" %s", kiln_type_name((kiln_type)t));
    kiln_quantize_plan plan;
    bool convertible = kiln_quantize_plan_make(path, KILN_FTYPE_MOSTLY_Q4_K_M, &plan) == KILN_OK && plan.n_inconvertible == 0;
    kiln_quantize_plan_free(&plan);
    printf("\n%s: kiln quantize ", convertible ? "convert the file with" : "kiln cannot read them to convert them; convert the model's F16 file with");
    kiln_cli_put_escaped(stdout, convertible ? path : "MODEL-F16.gguf");
    printf(" OUT.gguf --type q4_k_m\n");
}

int kiln_cmd_inspect(int argc, char **argv) {
    const char *path = NULL;
    bool all = false;
    const kiln_cli_opt opts[] = {{"--all", KILN_CLI_FLAG, &all, 0, 0}};
    int n_pos;
    if (!kiln_cli_parse_args("inspect", argc, argv, opts, 1, &path, 1, &n_pos)) return 1;
    if (!path) {
        fprintf(stderr, "kiln: usage: kiln inspect FILE.gguf [--all]\n");
        return 1;
    }
    kiln_gguf *g;
    kiln_status s = kiln_gguf_open(path, &g);
    if (s) return kiln_cli_die(s);
    char hb[32];
    human_bytes(hb, sizeof hb, (double)kiln_gguf_file_size(g));
    kiln_cli_put_escaped(stdout, path);
    printf(": GGUF v%u, %" PRId64 " keys, %" PRId64 " tensors, alignment %zu, data at byte %" PRIu64 ", %s\n",
           kiln_gguf_version(g), kiln_gguf_n_kv(g), kiln_gguf_n_tensors(g), kiln_gguf_alignment(g), kiln_gguf_data_offset(g), hb);
    printf("\nmetadata:\n");
    for (int64_t i = 0; i < kiln_gguf_n_kv(g); i++) {
        const kiln_gguf_kv *kv = kiln_gguf_kv_at(g, i);
        fputs("  ", stdout);
        kiln_cli_put_padded(stdout, kv->key, 44);
        printf(" %-5s ", kiln_gguf_vtype_name(kv->value.type));
        print_value(&kv->value, all, 0);
        putchar('\n');
    }
    int64_t nt = kiln_gguf_n_tensors(g);
    if (nt) {
        printf("\ntensors:\n  %5s  %-40s %-7s %-28s %12s %14s %6s\n", "#", "name", "type", "shape", "bytes", "offset", "bpw");
        uint64_t total_elems = 0, total_bytes = 0;
        for (int64_t i = 0; i < nt; i++) {
            const kiln_tensor_view *t = kiln_gguf_tensor_at(g, i);
            char shape[64];
            int n = snprintf(shape, sizeof shape, "[");
            uint64_t elems = 1;
            for (int d = 0; d < t->n_dims; d++) {
                n += snprintf(shape + n, sizeof shape - (size_t)n, d ? ", %" PRId64 : "%" PRId64, t->ne[d]);
                elems *= (uint64_t)t->ne[d];
            }
            snprintf(shape + n, sizeof shape - (size_t)n, "]");
            printf("  %5" PRId64 "  ", i);
            kiln_cli_put_padded(stdout, t->name, 40);
            printf(" %-7s %-28s %12zu %14" PRIu64 " %6.2f\n", kiln_type_name(t->type), shape,
                   t->nbytes, t->offset, 8.0 * (double)t->nbytes / (double)elems);
            total_elems += elems;
            total_bytes += t->nbytes;
        }
        human_bytes(hb, sizeof hb, (double)total_bytes);
        printf("\ntotal: %" PRId64 " tensors, %" PRIu64 " elements (%.3f M), %" PRIu64 " bytes (%s), %.3f bits per weight\n", nt,
               total_elems, (double)total_elems / 1e6, total_bytes, hb, 8.0 * (double)total_bytes / (double)total_elems);
        print_unrunnable(g, path);
    }
    kiln_gguf_close(g);
    return 0;
}

/* ---------------------------------------------------------------- quantize */

/* "121 f32, 24 q5_0, 30 q6_K": a plan's tensors per output type, in type-id order. */
static void print_mix(FILE *f, const kiln_quantize_plan *p) {
    for (int t = 0, first = 1; t < KILN_TYPE_COUNT; t++)
        if (p->n_of_type[t]) fprintf(f, "%s%" PRId64 " %s", first ? "" : ", ", p->n_of_type[t], kiln_type_name((kiln_type)t)), first = 0;
}

/* "105528416 bytes (100.64 MiB, 5.07 bits per weight)": a plan's file size. */
static void print_size(FILE *f, const kiln_quantize_plan *p) {
    uint64_t data = 0;
    for (int64_t i = 0; i < p->n_tensors; i++) data += p->tensors[i].bytes;
    char hb[32];
    human_bytes(hb, sizeof hb, (double)p->file_bytes);
    fprintf(f, "%" PRIu64 " bytes (%s, %.2f bits per weight)", p->file_bytes, hb,
            p->n_elements ? 8.0 * (double)data / (double)p->n_elements : 0.0);
}

/* --dry-run: the plan as a table, then its mix and size; a tensor kiln cannot convert yet is marked. */
static void print_plan(const char *in, const kiln_quantize_plan *p) {
    printf("%5s  %-40s %-28s %-7s    %-7s %12s\n", "#", "name", "shape", "from", "to", "bytes");
    for (int64_t i = 0; i < p->n_tensors; i++) {
        const kiln_quantize_tensor *t = &p->tensors[i];
        char shape[64];
        int n = snprintf(shape, sizeof shape, "[");
        for (int d = 0; d < t->n_dims; d++) n += snprintf(shape + n, sizeof shape - (size_t)n, d ? ", %" PRId64 : "%" PRId64, t->ne[d]);
        snprintf(shape + n, sizeof shape - (size_t)n, "]");
        printf("%5" PRId64 "  ", i);
        kiln_cli_put_padded(stdout, t->name, 40);
        printf(" %-28s %-7s -> %-7s %12" PRIu64 "%s\n", shape, kiln_type_name(t->from), kiln_type_name(t->to), t->bytes,
               t->convertible ? "" : "  (kiln cannot convert this yet)");
    }
    printf("\n%s mix of ", kiln_ftype_name(p->ftype));
    kiln_cli_put_escaped(stdout, in);
    printf(": %" PRId64 " tensors: ", p->n_tensors);
    print_mix(stdout, p);
    printf("\nsize: ");
    print_size(stdout, p);
    printf(", from %" PRIu64 " bytes\n", p->in_file_bytes);
    if (p->n_inconvertible)
        printf("a real run stops: kiln cannot convert %" PRId64 " of these tensors yet (marked above)\n", p->n_inconvertible);
}

typedef struct {
    double t0;
    bool tty; /* stderr is a terminal: one line rewritten in place; otherwise a plain line per tensor */
    const kiln_quantize_plan *plan;
} quantize_progress_state;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The tensor name comes from the file: bytes outside printable ASCII are written as \xNN, at most 48 columns. */
static void quantize_progress(void *ud, const kiln_progress *p) {
    const quantize_progress_state *st = ud;
    if (p->done == p->total) {
        if (st->tty) fputc('\n', stderr);
        return;
    }
    char name[49];
    size_t n = 0;
    for (const unsigned char *c = (const unsigned char *)(p->item ? p->item : ""); *c && n + 4 < sizeof name; c++)
        n += (size_t)snprintf(name + n, sizeof name - n, *c >= 0x20 && *c < 0x7f ? "%c" : "\\x%02x", *c);
    name[n] = 0;
    const char *to = p->done < st->plan->n_tensors ? kiln_type_name(st->plan->tensors[p->done].to) : "";
    fprintf(stderr, "%s[%3" PRId64 "/%3" PRId64 "] %6.1fs %-48s %-7s%s", st->tty ? "\r" : "", p->done + 1, p->total,
            now_s() - st->t0, name, to, st->tty ? "" : "\n");
    fflush(stderr);
}

int kiln_cmd_quantize(int argc, char **argv) {
    int threads = 0, pos = 0;
    bool dry_run = false, plan_flag = false;
    const char *args[3] = {0}, *type = NULL;
    const kiln_cli_opt opts[] = {{"-t", KILN_CLI_INT, &threads, 0, 4096},
                                 {"--type", KILN_CLI_STR, &type, 0, 0},
                                 {"--dry-run", KILN_CLI_FLAG, &dry_run, 0, 0},
                                 {"--plan", KILN_CLI_FLAG, &plan_flag, 0, 0}};
    if (!kiln_cli_parse_args("quantize", argc, argv, opts, 4, args, 3, &pos)) return 1;
    dry_run = dry_run || plan_flag;
    if (pos == 3 && type) return kiln_cli_error("quantize: the type is given twice ('%s' and --type '%s')", args[2], type);
    if (pos == 3) type = args[2];
    if (!type || pos < (dry_run ? 1 : 2)) {
        fprintf(stderr, "kiln: usage: kiln quantize IN.gguf OUT.gguf --type TYPE [-t THREADS] [--dry-run]  (TYPE: %s)\n",
                kiln_ftype_names());
        return 1;
    }
    kiln_quantize_plan plan;
    kiln_ftype ftype;
    kiln_status s = kiln_ftype_from_name(type, &ftype);
    if (!s) s = kiln_quantize_plan_make(args[0], ftype, &plan);
    if (s) return kiln_cli_die(s);
    if (dry_run) {
        print_plan(args[0], &plan);
        kiln_quantize_plan_free(&plan);
        return 0;
    }
    quantize_progress_state st = {.t0 = now_s(), .tty = isatty(STDERR_FILENO) == 1, .plan = &plan};
    kiln_quantize_params p = {.ftype = ftype, .n_threads = threads, .progress = quantize_progress, .progress_ud = &st};
    s = kiln_quantize_file(args[0], args[1], &p);
    if (s) {
        kiln_quantize_plan_free(&plan);
        return kiln_cli_die(s);
    }
    fputs("kiln: wrote ", stderr);
    kiln_cli_put_escaped(stderr, args[1]);
    fprintf(stderr, " (%s) in %.1fs: ", kiln_ftype_name(ftype), now_s() - st.t0);
    print_size(stderr, &plan);
    fputs("; ", stderr);
    print_mix(stderr, &plan);
    fputc('\n', stderr);
    kiln_quantize_plan_free(&plan);
    return 0;
}
