/* quantize.c: `kiln quantize` (kiln_quantize_file), converting every weight of a llama-family GGUF file to the
 * block format the model's rules pick for it (src/model/quantize.c), on the CPU: each tensor's rows are converted
 * on the thread pool with the best SIMD level's kernels (kiln_quantize_rows) and streamed through the atomic GGUF
 * writer, in the order and with the types of the plan (kiln_quantize_plan_gguf). A type without a quantizer (or a
 * source without a dequantizer) is refused before anything is written, by the traits table, so a quantizer added
 * there needs nothing here; a tensor holding a NaN or inf is refused by name before it is converted.
 * tests/test_quantize.c checks the mix rules, a round trip through the reader and the refusals. */
#include "model/quantize.h"
#include "cpu/simd.h"
#include "quants.h"
#include "pool.h"
#include "status.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The first tensor of p that kiln cannot convert yet, as one line naming what is missing: before anything is written. */
static kiln_status refuse_inconvertible(const char *in_path, const kiln_quantize_plan *p) {
    for (int64_t i = 0; i < p->n_tensors; i++) {
        const kiln_quantize_tensor *t = &p->tensors[i];
        if (t->convertible) continue;
        if (!kiln_get_to_float(t->from, KILN_SIMD_SCALAR))
            return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: tensor '%s' is %s, which kiln cannot dequantize to convert it", in_path,
                             t->name, kiln_type_name(t->from));
        return kiln_fail(KILN_ERR_UNSUPPORTED,
                         "%s: tensor '%s' takes %s in %s, which kiln cannot write yet (it has no quantizer for it); %lld "
                         "tensors of the mix do (--dry-run lists every tensor's type)",
                         in_path, t->name, kiln_type_name(t->to), kiln_ftype_name(p->ftype), (long long)p->n_inconvertible);
    }
    return KILN_OK;
}

kiln_status kiln_quantize_file(const char *in_path, const char *out_path, const kiln_quantize_params *p) {
    if (!kiln_ftype_known(p->ftype)) return kiln_fail(KILN_ERR_INVALID, "unknown file type %d", (int)p->ftype);
    kiln_gguf *g = NULL;
    kiln_gguf_writer *w = NULL;
    kiln_pool *pool = NULL;
    kiln_quantize_plan plan = {0};
    void *out = NULL;
    float **scratch = NULL;
    kiln_status s;
    if ((s = kiln_gguf_open(in_path, &g))) return s;
    int64_t nt = kiln_gguf_n_tensors(g);
    if ((s = kiln_quantize_plan_gguf(g, p->ftype, &plan)) || (s = refuse_inconvertible(in_path, &plan)) ||
        (s = kiln_quantize_writer(g, &plan, &w)))
        goto out;
    int64_t max_ne0 = 1;
    size_t max_bytes = 1;
    for (int64_t i = 0; i < nt; i++) {
        if (plan.tensors[i].bytes > SIZE_MAX) {
            s = kiln_fail(KILN_ERR_NOMEM, "%s: tensor '%s' does not fit in memory", in_path, plan.tensors[i].name);
            goto out;
        }
        if (plan.tensors[i].bytes > max_bytes) max_bytes = (size_t)plan.tensors[i].bytes;
        if (plan.tensors[i].ne[0] > max_ne0) max_ne0 = plan.tensors[i].ne[0];
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
        const kiln_quantize_tensor *pt = &plan.tensors[i];
        if (t->type == pt->to) {
            s = kiln_gguf_writer_write_tensor(w, i, t->data, t->nbytes);
        } else {
            kiln_quantize_rows(pool, t, kiln_get_to_float(t->type, level), pt->to, out, scratch);
            s = kiln_gguf_writer_write_tensor(w, i, out, (size_t)pt->bytes);
        }
        if (s) goto out;
    }
    if (p->progress) p->progress(p->progress_ud, &(kiln_progress){.stage = "quantize", .done = nt, .total = nt, .item = "done", .metric = NAN});
    s = kiln_gguf_writer_finish(w);
out:
    for (int i = 0; scratch && pool && i < kiln_pool_size(pool); i++) free(scratch[i]);
    free(scratch);
    free(out);
    kiln_quantize_plan_free(&plan);
    kiln_pool_free(pool);
    kiln_gguf_writer_free(w);
    kiln_gguf_close(g);
    return s;
}
