/* quantize.c: the generic step of `kiln quantize` (src/model/quantize.c, which picks each tensor's type): a
 * tensor's rows converted to another type. Rows are split across a thread pool; each thread dequantizes a source
 * row to float and quantizes it with the destination type's reference quantizer. tests/test_quantize.c checks a
 * round trip through it. */
#include "pool.h"
#include "quants.h"

typedef struct {
    const kiln_tensor_view *src;
    kiln_type dst_type;
    void *dst;
    size_t dst_row_bytes;
    int64_t n_rows;
    float *const *scratch; /* (nth, ne0) */
    kiln_to_float_fn to_float;
    kiln_from_float_fn from_float;
} convert_job;

static void convert_rows(void *ctx, int ith, int nth) {
    convert_job *j = ctx;
    int64_t ne0 = j->src->ne[0];
    int64_t per = (j->n_rows + nth - 1) / nth;
    int64_t r0 = per * ith, r1 = r0 + per < j->n_rows ? r0 + per : j->n_rows;
    float *row = j->scratch[ith];
    for (int64_t r = r0; r < r1; r++) {
        j->to_float((const uint8_t *)j->src->data + (size_t)r * j->src->nb[1], row, ne0);
        j->from_float(row, (uint8_t *)j->dst + (size_t)r * j->dst_row_bytes, ne0);
    }
}

void kiln_quantize_rows(kiln_pool *pool, const kiln_tensor_view *src, kiln_to_float_fn to_float, kiln_type dst_type, void *dst,
                        float *const *scratch) {
    convert_job j = {.src = src, .dst_type = dst_type, .dst = dst, .dst_row_bytes = kiln_type_row_bytes(dst_type, src->ne[0]),
                     .n_rows = (int64_t)(src->nbytes / src->nb[1]), .scratch = scratch, .to_float = to_float,
                     .from_float = kiln_type_traits_get(dst_type)->from_float_ref};
    kiln_pool_run(pool, convert_rows, &j);
}
