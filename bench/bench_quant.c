/* bench_quant.c: `kiln bench quant`: single-thread throughput of dequantize (to_float) and vec_dot for every
 * computable weight type at every SIMD level this CPU has, scalar being the peer each SIMD level is compared to.
 *
 * Each case walks a weight matrix of rows of 4096 elements, as a matvec does: dequantize writes each row into
 * one reused float buffer (so it measures reading the weights, not writing 4x as many floats); vec_dot dots
 * each row with one activation row already quantized to the type's vec_dot_type. GB/s counts bytes read: the
 * weights, plus for vec_dot the activation row once per weight row. Two matrix sizes: one well beyond L2
 * (32 MiB by default) and one that fits (256 KiB). memcpy of the same size, single thread, is the physical
 * reference: GB/s there is bytes copied per second (each byte is read once and written once). A case repeats
 * for at least the minimum time (0.2 s, --quick 0.02 s) and reports its best repetition.
 * Output: one JSON object per case on stdout, then a table. */
#include "bench/bench.h"
#include "tools/cli.h"

#include "quants.h"
#include "cpu/simd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define ROW_ELEMS 4096
#define SAMPLE_ROWS 16 /* rows quantized by the reference quantizer, then tiled over the matrix */

static const kiln_type weight_types[] = {KILN_TYPE_F32,  KILN_TYPE_F16,  KILN_TYPE_BF16, KILN_TYPE_Q4_0, KILN_TYPE_Q4_1,
                                         KILN_TYPE_Q8_0, KILN_TYPE_Q4_K, KILN_TYPE_Q5_K, KILN_TYPE_Q6_K};
#define N_TYPES (int)(sizeof weight_types / sizeof weight_types[0])

/* One pass of work over the matrix, and what it reads. */
typedef struct {
    const uint8_t *w; /* rows x row_bytes weights */
    int64_t rows;
    size_t row_bytes;
    const void *act;   /* activation row (vec_dot_type) */
    float *row_out;    /* ROW_ELEMS floats (dequantize) */
    kiln_to_float_fn to_float;
    kiln_vec_dot_fn vec_dot;
    uint8_t *dst;      /* memcpy destination */
    size_t copy_bytes;
} work;

static volatile float sink; /* keeps vec_dot results observable */

static void pass_dequantize(const work *k) {
    for (int64_t r = 0; r < k->rows; r++) k->to_float(k->w + (size_t)r * k->row_bytes, k->row_out, ROW_ELEMS);
}

static void pass_vec_dot(const work *k) {
    float acc = 0.0f, s;
    for (int64_t r = 0; r < k->rows; r++) {
        k->vec_dot(ROW_ELEMS, &s, k->w + (size_t)r * k->row_bytes, k->act);
        acc += s;
    }
    sink = acc;
}

static void pass_memcpy(const work *k) { memcpy(k->dst, k->w, k->copy_bytes); }

/* Best seconds per pass: passes are grouped so one repetition lasts >= 2 ms (timer noise), and repetitions
 * continue until min_time has elapsed and at least 3 were taken. */
static double time_best(void (*pass)(const work *), const work *k, double min_time) {
    double t0 = kiln_bench_now();
    pass(k); /* warm-up: caches, TLB, page faults */
    double one = kiln_bench_now() - t0;
    int64_t group = one >= 2e-3 ? 1 : (int64_t)(2e-3 / (one > 1e-9 ? one : 1e-9)) + 1;
    double best = 1e30, start = kiln_bench_now();
    for (int rep = 0; rep < 3 || kiln_bench_now() - start < min_time; rep++) {
        double a = kiln_bench_now();
        for (int64_t g = 0; g < group; g++) pass(k);
        double t = (kiln_bench_now() - a) / (double)group;
        if (t < best) best = t;
    }
    return best;
}

typedef struct {
    const char *op, *type, *level, *buffer;
    double gbs, frac_memcpy, speedup; /* speedup 0: this is the scalar peer */
} result;

static void *alloc64(size_t n) {
    size_t rounded = (n + 63) / 64 * 64;
    return aligned_alloc(64, rounded ? rounded : 64);
}

/* Fills rows x row_bytes with SAMPLE_ROWS rows quantized by the reference quantizer, tiled. */
static int fill_weights(kiln_type t, uint8_t *w, int64_t rows, size_t row_bytes) {
    const kiln_type_traits *tt = kiln_type_traits_get(t);
    float *x = malloc(sizeof(float) * ROW_ELEMS * SAMPLE_ROWS);
    if (!x) return -1;
    uint64_t s = 0x9E3779B97F4A7C15ull;
    for (int64_t i = 0; i < (int64_t)ROW_ELEMS * SAMPLE_ROWS; i++) {
        s ^= s >> 12, s ^= s << 25, s ^= s >> 27;
        /* sum of 4 uniforms: roughly normal, enough for realistic scales */
        uint64_t r = s * 0x2545F4914F6CDD1Dull;
        x[i] = ((float)(r & 0xffff) + (float)(r >> 16 & 0xffff) + (float)(r >> 32 & 0xffff) + (float)(r >> 48)) / 65536.0f - 2.0f;
    }
    const int64_t sample = rows < SAMPLE_ROWS ? rows : SAMPLE_ROWS;
    for (int64_t r = 0; r < sample; r++) tt->from_float_ref(x + r * ROW_ELEMS, w + (size_t)r * row_bytes, ROW_ELEMS);
    for (int64_t r = sample; r < rows; r++) memcpy(w + (size_t)r * row_bytes, w + (size_t)(r % sample) * row_bytes, row_bytes);
    free(x);
    return 0;
}

/* Cache size in bytes from glibc's sysconf, 0 where unknown. */
static long cache_bytes(int level) {
#if defined(_SC_LEVEL2_CACHE_SIZE) && defined(_SC_LEVEL3_CACHE_SIZE)
    long v = sysconf(level == 2 ? _SC_LEVEL2_CACHE_SIZE : _SC_LEVEL3_CACHE_SIZE);
    return v > 0 ? v : 0;
#else
    (void)level;
    return 0;
#endif
}

static void usage(FILE *f) {
    fprintf(f, "usage: kiln bench quant [--quick] [--big-mib N]\n"
               "  single-thread dequantize and vec_dot GB/s per weight type and SIMD level, vs scalar and memcpy\n"
               "  --quick      0.02 s per case instead of 0.2 s\n"
               "  --big-mib N  size of the beyond-L2 weight matrix (default 32)\n");
}

int kiln_bench_quant(int argc, char **argv) {
    double min_time = 0.2;
    int64_t big_mib = 32;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v;
        if (strcmp(a, "--") == 0) { /* ends the options; bench quant takes no other argument */
            if (i + 1 < argc) return kiln_cli_error("bench quant: unexpected argument '%s'", argv[i + 1]);
            break;
        }
        if (strcmp(a, "--quick") == 0) min_time = 0.02;
        else if (strcmp(a, "--big-mib") == 0) {
            if (!(v = kiln_cli_value("bench quant", argc, argv, &i)) || !kiln_cli_parse_int("bench quant", a, v, 1, 4096, &big_mib))
                return 1;
        } else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        } else
            return kiln_cli_unknown("bench quant", a);
    }

    const kiln_simd have = kiln_simd_detect();
    char big_label[32];
    snprintf(big_label, sizeof big_label, "%lldMiB", (long long)big_mib);
    const struct { const char *label; size_t bytes; } sizes[2] = {
        {big_label, (size_t)big_mib << 20}, /* beyond L2: streams from L3 or DRAM */
        {"256KiB", (size_t)256 << 10},      /* fits L2 */
    };

    /* Buffers sized for the largest case: the weights (memcpy source too) and a copy destination. */
    const size_t max_bytes = sizes[0].bytes + (size_t)ROW_ELEMS * 4;
    uint8_t *w = alloc64(max_bytes), *dst = alloc64(max_bytes), *act = alloc64((size_t)ROW_ELEMS * 4);
    float *row_out = alloc64(sizeof(float) * ROW_ELEMS), *xact = alloc64(sizeof(float) * ROW_ELEMS);
    result *res = calloc((size_t)N_TYPES * 2 * 2 * KILN_SIMD_COUNT, sizeof *res);
    int status = 0;
    if (!w || !dst || !act || !row_out || !xact || !res) {
        fprintf(stderr, "kiln bench quant: out of memory allocating %zu bytes of buffers\n", 2 * max_bytes);
        status = 1;
        goto done;
    }
    memset(dst, 0, max_bytes);
    for (int i = 0; i < ROW_ELEMS; i++) xact[i] = (float)((i * 7919) % 2001 - 1000) / 1000.0f;

    double memcpy_gbs[2];
    for (int si = 0; si < 2; si++) {
        memset(w, 1, sizes[si].bytes);
        work k = {.w = w, .dst = dst, .copy_bytes = sizes[si].bytes};
        const double t = time_best(pass_memcpy, &k, min_time);
        memcpy_gbs[si] = (double)sizes[si].bytes / t / 1e9;
        printf("{\"bench\":\"quant\",\"op\":\"memcpy\",\"buffer\":\"%s\",\"bytes\":%zu,\"threads\":1,\"best_s\":%.6e,"
               "\"gbs\":%.3f,\"l2_bytes\":%ld,\"l3_bytes\":%ld}\n", sizes[si].label, sizes[si].bytes, t, memcpy_gbs[si],
               cache_bytes(2), cache_bytes(3));
    }

    int nres = 0;
    for (int ti = 0; ti < N_TYPES; ti++) {
        const kiln_type t = weight_types[ti];
        const kiln_type_traits *tt = kiln_type_traits_get(t), *ty = kiln_type_traits_get(tt->vec_dot_type);
        const size_t row_bytes = kiln_type_row_bytes(t, ROW_ELEMS), act_bytes = kiln_type_row_bytes(tt->vec_dot_type, ROW_ELEMS);
        ty->from_float_ref(xact, act, ROW_ELEMS);
        for (int si = 0; si < 2; si++) {
            const int64_t rows = (int64_t)((sizes[si].bytes + row_bytes - 1) / row_bytes);
            if (fill_weights(t, w, rows, row_bytes) != 0) {
                fprintf(stderr, "kiln bench quant: out of memory quantizing %s sample rows\n", tt->name);
                status = 1;
                goto done;
            }
            for (int op = 0; op < 2; op++) {
                const size_t pass_bytes = (size_t)rows * (row_bytes + (op ? act_bytes : 0));
                double scalar_gbs = 0.0;
                for (int lv = 0; lv <= (int)have; lv++) {
                    work k = {.w = w, .rows = rows, .row_bytes = row_bytes, .act = act, .row_out = row_out,
                              .to_float = tt->to_float[lv], .vec_dot = tt->vec_dot[lv]};
                    if (op ? !k.vec_dot : !k.to_float) continue;
                    const double sec = time_best(op ? pass_vec_dot : pass_dequantize, &k, min_time);
                    const double gbs = (double)pass_bytes / sec / 1e9;
                    if (lv == KILN_SIMD_SCALAR) scalar_gbs = gbs;
                    result *r = &res[nres++];
                    *r = (result){op ? "vec_dot" : "dequantize", tt->name, kiln_simd_name((kiln_simd)lv), sizes[si].label,
                                  gbs, gbs / memcpy_gbs[si], lv == KILN_SIMD_SCALAR || scalar_gbs == 0.0 ? 0.0 : gbs / scalar_gbs};
                    printf("{\"bench\":\"quant\",\"op\":\"%s\",\"type\":\"%s\",\"level\":\"%s\",\"buffer\":\"%s\","
                           "\"weight_bytes\":%zu,\"row_elems\":%d,\"rows\":%lld,\"bytes_per_pass\":%zu,\"threads\":1,"
                           "\"best_s\":%.6e,\"gbs\":%.3f,\"weight_gbs\":%.3f,\"gelem_s\":%.3f,\"memcpy_gbs\":%.3f,"
                           "\"frac_memcpy\":%.3f,\"peer\":\"scalar\",\"speedup_vs_scalar\":%.2f}\n",
                           r->op, r->type, r->level, r->buffer, (size_t)rows * row_bytes, ROW_ELEMS, (long long)rows,
                           pass_bytes, sec, gbs, (double)rows * row_bytes / sec / 1e9,
                           (double)rows * ROW_ELEMS / sec / 1e9, memcpy_gbs[si], r->frac_memcpy,
                           lv == KILN_SIMD_SCALAR ? 1.0 : r->speedup);
                    fflush(stdout);
                }
            }
        }
    }

    printf("\nkiln bench quant: single thread, rows of %d elements, best of >= %.2f s per case; CPU level %s\n",
           ROW_ELEMS, min_time, kiln_simd_name(have));
    printf("L2 %ld KiB, L3 %ld MiB per sysconf (0: unknown); a buffer that fits L3 is not a DRAM measurement\n",
           cache_bytes(2) >> 10, cache_bytes(3) >> 20);
    printf("GB/s = bytes read per second (weights; vec_dot adds the activation row per weight row)\n");
    printf("memcpy both reads and writes each byte, so a kernel that only reads can exceed 100%% of it\n");
    printf("memcpy (bytes copied/s): %s %.1f GB/s, %s %.1f GB/s\n\n", sizes[0].label, memcpy_gbs[0], sizes[1].label, memcpy_gbs[1]);
    printf("%-6s %-10s %-7s %-7s %9s %9s %10s\n", "type", "op", "buffer", "level", "GB/s", "/memcpy", "vs scalar");
    for (int i = 0; i < nres; i++) {
        const result *r = &res[i];
        char sp[16];
        if (r->speedup > 0.0) snprintf(sp, sizeof sp, "%.2fx", r->speedup);
        else snprintf(sp, sizeof sp, "peer");
        printf("%-6s %-10s %-7s %-7s %9.2f %8.0f%% %10s\n", r->type, r->op, r->buffer, r->level, r->gbs,
               100.0 * r->frac_memcpy, sp);
    }

done:
    free(w);
    free(dst);
    free(act);
    free(row_out);
    free(xact);
    free(res);
    return status;
}
