/* fuzz_gguf.c: libFuzzer harness for the GGUF reader (`make fuzz FUZZ_SECONDS=N`).
 * Each input is parsed as a GGUF image; when it parses, every accessor is exercised so that a view
 * pointing outside the image would be caught by AddressSanitizer, and every tensor goes through the load-time
 * finite check (src/core/finite.c), which reads the scale fields of every block. Crashes go to tests/fuzz/crashes/;
 * each one found is copied to tests/fuzz/regress/ and replayed by tests/test_gguf.c forever. */
#include "kiln.h"
#include "quants.h"

#include <stdint.h>
#include <string.h>

static volatile uint64_t sink;

static void touch_value(const kiln_gguf_value *v, int depth) {
    if (v->type == KILN_GGUF_STRING && v->str.len) sink += (uint8_t)v->str.ptr[v->str.len - 1];
    if (v->type != KILN_GGUF_ARRAY || depth > 16) return;
    if (v->arr.items)
        for (uint64_t i = 0; i < v->arr.n; i++) touch_value(&v->arr.items[i], depth + 1);
    else if (v->arr.n && kiln_gguf_vtype_size(v->arr.type))
        sink += (uint64_t)kiln_gguf_arr_f64(v, v->arr.n - 1);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kiln_gguf *g;
    if (kiln_gguf_open_memory(data, size, "fuzz", &g) != KILN_OK) return 0;
    for (int64_t i = 0; i < kiln_gguf_n_kv(g); i++) touch_value(&kiln_gguf_kv_at(g, i)->value, 0);
    for (int64_t i = 0; i < kiln_gguf_n_tensors(g); i++) {
        const kiln_tensor_view *t = kiln_gguf_tensor_at(g, i);
        if (t->nbytes) sink += ((const uint8_t *)t->data)[0] + ((const uint8_t *)t->data)[t->nbytes - 1];
        if (kiln_gguf_find_tensor(g, t->name) != t) __builtin_trap();
        sink += kiln_tensor_check_finite("fuzz", t);
    }
    uint32_t u;
    kiln_str s;
    (void)kiln_gguf_get_u32(g, "general.alignment", &u);
    (void)kiln_gguf_get_str(g, "general.architecture", &s);
    kiln_gguf_close(g);
    return 0;
}
