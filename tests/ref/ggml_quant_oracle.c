/* ggml_quant_oracle.c: a driver for llama.cpp's own quantizers, the oracle gen_dequant_fixtures.py uses for the
 * types gguf-py cannot quantize (Q2_K, Q3_K, IQ4_NL, IQ4_XS). It is linked against llama.cpp's unmodified
 * ggml/src/ggml-quants.c (the script compiles both; nothing of it is in kiln) and calls the entry points
 * llama-quantize reaches without an importance matrix: quantize_<type>(src, dst, nrow, n_per_row, NULL).
 *
 *   ggml_quant_oracle TYPE N_PER_ROW < floats.f32 > blocks.bin
 *
 * The four ggml functions ggml-quants.c calls that live elsewhere in libggml are given here: only the row size
 * and an abort are ever reached on these paths. */
#include "ggml.h"
#include "ggml-quants.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef size_t (*quantize_fn)(const float *src, void *dst, int64_t nrow, int64_t n_per_row, const float *imatrix);

static const struct { const char *name; enum ggml_type type; int64_t blck; size_t bytes; quantize_fn fn; } types[] = {
    {"q5_1", GGML_TYPE_Q5_1, 32, 24, quantize_q5_1},     {"q2_K", GGML_TYPE_Q2_K, 256, 84, quantize_q2_K},
    {"q3_K", GGML_TYPE_Q3_K, 256, 110, quantize_q3_K},   {"iq4_nl", GGML_TYPE_IQ4_NL, 32, 18, quantize_iq4_nl},
    {"iq4_xs", GGML_TYPE_IQ4_XS, 256, 136, quantize_iq4_xs},
};
#define N_TYPES (sizeof types / sizeof types[0])

void ggml_abort(const char *file, int line, const char *fmt, ...) {
    fprintf(stderr, "ggml_abort at %s:%d (%s)\n", file, line, fmt);
    abort();
}

size_t ggml_type_size(enum ggml_type t) {
    for (size_t i = 0; i < N_TYPES; i++)
        if (types[i].type == t) return types[i].bytes;
    abort();
}

int64_t ggml_blck_size(enum ggml_type t) {
    for (size_t i = 0; i < N_TYPES; i++)
        if (types[i].type == t) return types[i].blck;
    abort();
}

size_t ggml_row_size(enum ggml_type t, int64_t ne) { return ggml_type_size(t) * (size_t)(ne / ggml_blck_size(t)); }

const char *ggml_type_name(enum ggml_type t) {
    for (size_t i = 0; i < N_TYPES; i++)
        if (types[i].type == t) return types[i].name;
    return "?";
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s TYPE N_PER_ROW < floats > blocks\n", argv[0]);
        return 2;
    }
    size_t ti = 0;
    while (ti < N_TYPES && strcmp(types[ti].name, argv[1]) != 0) ti++;
    const int64_t n_per_row = atoll(argv[2]);
    if (ti == N_TYPES || n_per_row <= 0 || n_per_row % types[ti].blck != 0) {
        fprintf(stderr, "bad type or row length\n");
        return 2;
    }
    size_t cap = 1 << 20, n = 0;
    float *x = malloc(cap * sizeof *x);
    size_t got;
    while (x && (got = fread(x + n, sizeof *x, cap - n, stdin)) > 0)
        if ((n += got) == cap) x = realloc(x, (cap *= 2) * sizeof *x);
    if (!x || n % (size_t)n_per_row != 0) {
        fprintf(stderr, "input is not whole rows\n");
        return 2;
    }
    const int64_t nrow = (int64_t)n / n_per_row;
    const size_t out_bytes = (size_t)nrow * ggml_row_size(types[ti].type, n_per_row);
    void *y = calloc(1, out_bytes);
    if (!y) return 1;
    types[ti].fn(x, y, nrow, n_per_row, NULL);
    fwrite(y, 1, out_bytes, stdout);
    free(x), free(y);
    return 0;
}
