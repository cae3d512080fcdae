/* tensors.c: the one list of a llama layer's tensors (model.h's kiln_layer_tensor): GGUF name, shape rule, the
 * config flag that needs it, and how training treats it. The named fields of kiln_llama_layer follow the same
 * order, which the static assertion below and tests/test_arch.c's binding checks hold to. */
#include "model.h"

#include <stddef.h>
#include <stdio.h>

const kiln_tensor_spec kiln_layer_tensors[KILN_LT_COUNT] = {
    [KILN_LT_ATTN_NORM] = {"attn_norm.weight", KILN_DIM_C, KILN_DIM_ONE, KILN_NEED_PRE_NORM, false, false},
    [KILN_LT_WQ] = {"attn_q.weight", KILN_DIM_C, KILN_DIM_Q, KILN_NEED_ALWAYS, true, false},
    [KILN_LT_WK] = {"attn_k.weight", KILN_DIM_C, KILN_DIM_KV, KILN_NEED_ALWAYS, true, false},
    [KILN_LT_WV] = {"attn_v.weight", KILN_DIM_C, KILN_DIM_KV, KILN_NEED_ALWAYS, true, false},
    [KILN_LT_WO] = {"attn_output.weight", KILN_DIM_Q, KILN_DIM_C, KILN_NEED_ALWAYS, true, true},
    [KILN_LT_FFN_NORM] = {"ffn_norm.weight", KILN_DIM_C, KILN_DIM_ONE, KILN_NEED_PRE_NORM, false, false},
    [KILN_LT_W_GATE] = {"ffn_gate.weight", KILN_DIM_C, KILN_DIM_F, KILN_NEED_ALWAYS, true, false},
    [KILN_LT_W_UP] = {"ffn_up.weight", KILN_DIM_C, KILN_DIM_F, KILN_NEED_ALWAYS, true, false},
    [KILN_LT_W_DOWN] = {"ffn_down.weight", KILN_DIM_F, KILN_DIM_C, KILN_NEED_ALWAYS, true, true},
    [KILN_LT_BQ] = {"attn_q.bias", KILN_DIM_Q, KILN_DIM_ONE, KILN_NEED_QKV_BIAS, false, false},
    [KILN_LT_BK] = {"attn_k.bias", KILN_DIM_KV, KILN_DIM_ONE, KILN_NEED_QKV_BIAS, false, false},
    [KILN_LT_BV] = {"attn_v.bias", KILN_DIM_KV, KILN_DIM_ONE, KILN_NEED_QKV_BIAS, false, false},
    [KILN_LT_Q_NORM] = {"attn_q_norm.weight", KILN_DIM_QNORM, KILN_DIM_ONE, KILN_NEED_QK_NORM, false, false},
    [KILN_LT_K_NORM] = {"attn_k_norm.weight", KILN_DIM_KNORM, KILN_DIM_ONE, KILN_NEED_QK_NORM, false, false},
    [KILN_LT_ATTN_GATE] = {"attn_gate.weight", KILN_DIM_C, KILN_DIM_Q, KILN_NEED_OUTPUT_GATE, true, false},
    [KILN_LT_POST_ATTN_NORM] = {"post_attention_norm.weight", KILN_DIM_C, KILN_DIM_ONE, KILN_NEED_SANDWICH_NORM, false, false},
    [KILN_LT_POST_FFN_NORM] = {"post_ffw_norm.weight", KILN_DIM_C, KILN_DIM_ONE, KILN_NEED_SANDWICH_NORM, false, false},
};

/* the named fields alias t[] in the table's order */
_Static_assert(offsetof(kiln_llama_layer, post_ffn_norm) == offsetof(kiln_llama_layer, t[KILN_LT_POST_FFN_NORM]) &&
                   offsetof(kiln_llama_layer, wo) == offsetof(kiln_llama_layer, t[KILN_LT_WO]) &&
                   offsetof(kiln_llama_layer, bq) == offsetof(kiln_llama_layer, t[KILN_LT_BQ]) &&
                   offsetof(kiln_llama_layer, w_attn_gate) == offsetof(kiln_llama_layer, t[KILN_LT_ATTN_GATE]),
               "kiln_llama_layer's fields follow kiln_layer_tensor");

int64_t kiln_dim_size(const kiln_llama_config *c, kiln_dim d) {
    switch (d) {
    case KILN_DIM_ONE: return 1;
    case KILN_DIM_C: return c->n_embd;
    case KILN_DIM_Q: return c->n_head * c->head_dim;
    case KILN_DIM_KV: return c->n_head_kv * c->head_dim;
    case KILN_DIM_F: return c->n_ff;
    case KILN_DIM_HS: return c->head_dim;
    case KILN_DIM_QNORM: return c->qk_norm_full ? c->n_head * c->head_dim : c->head_dim;
    case KILN_DIM_KNORM: return c->qk_norm_full ? c->n_head_kv * c->head_dim : c->head_dim;
    }
    return 0;
}

bool kiln_layer_has(const kiln_llama_config *c, kiln_layer_tensor i) {
    switch (kiln_layer_tensors[i].need) {
    case KILN_NEED_ALWAYS: return true;
    case KILN_NEED_QKV_BIAS: return c->qkv_bias;
    case KILN_NEED_QK_NORM: return c->qk_norm;
    case KILN_NEED_OUTPUT_GATE: return c->output_gate;
    case KILN_NEED_SANDWICH_NORM: return c->sandwich_norm;
    case KILN_NEED_PRE_NORM: return !c->no_pre_norm;
    }
    return false;
}

const char *kiln_layer_tensor_name(char *buf, size_t n, int64_t l, kiln_layer_tensor i) {
    snprintf(buf, n, "blk.%lld.%s", (long long)l, kiln_layer_tensors[i].suffix);
    return buf;
}

int64_t kiln_layer_tensor_elems(const kiln_llama_config *c, kiln_layer_tensor i) {
    return kiln_dim_size(c, kiln_layer_tensors[i].ne0) * kiln_dim_size(c, kiln_layer_tensors[i].ne1);
}
