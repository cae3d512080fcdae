/* quantize.c: `kiln quantize` (kiln_quantize_file), converting every weight of a llama-family GGUF file to the
 * block format the model's rules pick for it (src/model/quantize.c), on the CPU: each tensor's rows are converted
 * on the thread pool with the best SIMD level's kernels (kiln_quantize_rows) and streamed through the atomic GGUF
 * writer. A tensor holding a NaN or inf is refused by name before it is converted. tests/test_quantize.c checks the
 * mix rules, a round trip through the reader and the refusal. */
#include "model/quantize.h"
#include "cpu/simd.h"
#include "quants.h"
#include "pool.h"
#include "status.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static bool skip_quant_keys(const char *key) {
    return strcmp(key, "general.file_type") == 0 || strcmp(key, "general.quantization_version") == 0;
}

kiln_status kiln_quantize_file(const char *in_path, const char *out_path, const kiln_quantize_params *p) {
    if (!kiln_ftype_known(p->ftype)) return kiln_fail(KILN_ERR_INVALID, "unknown file type %d", (int)p->ftype);
    kiln_gguf *g = NULL;
    kiln_gguf_writer *w = NULL;
    kiln_pool *pool = NULL;
    kiln_type *types = NULL;
    void *out = NULL;
    float **scratch = NULL;
    kiln_status s;
    if ((s = kiln_gguf_open(in_path, &g))) return s;
    int64_t nt = kiln_gguf_n_tensors(g);
    int n_attn_v, n_ffn_down;
    kiln_quantize_count(g, &n_attn_v, &n_ffn_down);
    bool has_output = kiln_gguf_find_tensor(g, "output.weight") != NULL;
    int64_t max_ne0 = 1;
    size_t max_bytes = 1;
    types = calloc(nt ? (size_t)nt : 1, sizeof *types);
    if (!types) {
        s = kiln_fail(KILN_ERR_NOMEM, "out of memory");
        goto out;
    }
    if ((s = kiln_gguf_writer_new(&w)) || (s = kiln_gguf_writer_copy_kv(w, g, skip_quant_keys)) ||
        (s = kiln_gguf_writer_set_u32(w, "general.file_type", (uint32_t)p->ftype)) ||
        (s = kiln_gguf_writer_set_u32(w, "general.quantization_version", 2)))
        goto out;
    for (int64_t i = 0; i < nt; i++) {
        const kiln_tensor_view *t = kiln_gguf_tensor_at(g, i);
        types[i] = kiln_quantize_choose_type(t, p->ftype, n_attn_v, n_ffn_down, has_output);
        const kiln_type_traits *src = kiln_type_traits_get(t->type), *dst = kiln_type_traits_get(types[i]);
        if (t->type != types[i] && (!src->computable || !dst->from_float_ref)) {
            s = kiln_fail(KILN_ERR_UNSUPPORTED, "%s: tensor '%s': converting %s to %s is not supported", in_path, t->name,
                          kiln_type_name(t->type), kiln_type_name(types[i]));
            goto out;
        }
        if ((s = kiln_gguf_writer_add_tensor(w, t->name, types[i], t->n_dims, t->ne, NULL))) goto out;
        size_t bytes = kiln_type_row_bytes(types[i], t->ne[0]) * (size_t)(t->nbytes / t->nb[1]);
        if (bytes > max_bytes) max_bytes = bytes;
        if (t->ne[0] > max_ne0) max_ne0 = t->ne[0];
    }
    if ((s = kiln_pool_create(p->n_threads, &pool))) goto out;
    int nth = kiln_pool_size(pool);
    out = malloc(max_bytes);
    scratch = calloc((size_t)nth, sizeof *scratch);
    for (int i = 0; scratch && i < nth; i++)
        if (!(scratch[i] = malloc((size_t)max_ne0 * sizeof(float)))) break;
    if (!out || !scratch || !scratch[nth - 1]) {
        s = kiln_fail(KILN_ERR_NOMEM, "out of memory for a %zu-byte output buffer", max_bytes);
        goto out;
    }
    if ((s = kiln_gguf_writer_begin(w, out_path))) goto out;
    kiln_simd level = kiln_simd_best();
    for (int64_t i = 0; i < nt; i++) {
        const kiln_tensor_view *t = kiln_gguf_tensor_at(g, i);
        if (p->progress) p->progress(p->progress_ud, &(kiln_progress){.stage = "quantize", .done = i, .total = nt, .item = t->name, .metric = NAN});
        /* a NaN or inf weight has no quantized form: refuse it by name, and the temp file goes with the writer */
        if ((s = kiln_tensor_check_finite(in_path, t))) goto out;
        if (t->type == types[i]) {
            s = kiln_gguf_writer_write_tensor(w, i, t->data, t->nbytes);
        } else {
            kiln_quantize_rows(pool, t, kiln_get_to_float(t->type, level), types[i], out, scratch);
            s = kiln_gguf_writer_write_tensor(w, i, out, kiln_type_row_bytes(types[i], t->ne[0]) * (size_t)(t->nbytes / t->nb[1]));
        }
        if (s) goto out;
    }
    if (p->progress) p->progress(p->progress_ud, &(kiln_progress){.stage = "quantize", .done = nt, .total = nt, .item = "done", .metric = NAN});
    s = kiln_gguf_writer_finish(w);
out:
    for (int i = 0; scratch && pool && i < kiln_pool_size(pool); i++) free(scratch[i]);
    free(scratch);
    free(out);
    free(types);
    kiln_pool_free(pool);
    kiln_gguf_writer_free(w);
    kiln_gguf_close(g);
    return s;
}
