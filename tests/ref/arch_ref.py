#!/usr/bin/env python3
"""arch_ref.py: small synthetic GGUFs that exercise each architecture flag of kiln's one forward (#6), with the
float64 numpy reference logits that tests/test_arch.c checks kiln against.

Each fixture is a random model with F32 weights (tiny widths) written with the PyPI `gguf` package (llama.cpp's
gguf-py GGUFWriter). The reference forward below shares no code with kiln; it follows the graphs of llama.cpp's
src/models/<arch>.cpp for llama, qwen2, qwen3, mistral3, phi3, gemma2, gemma3, smollm3 and olmo2, plus Muse's own features, in float64, except that k and v go
through float16 as they enter the cache (kiln's cache is f16), so the bound in test_arch.c can be tight. The
reference then lives in the same file, next to the model, so one fixture is one file:

  ref.tokens  metadata, array of int32: the token sequence
  ref.logits  tensor (T, V) f32: the reference logits of every position

The forward, per layer l (each step only where its flag is on):

  x = token_embd[ids]  (* sqrt(C): gemma2, gemma3)
  h = rmsnorm(x) * attn_norm                                       eps = layer_norm_rms_epsilon; olmo2: h = x
  q, k, v = h Wq^T (+ bq), h Wk^T (+ bk), h Wv^T (+ bv)            biases: qwen2 (or attn_q.bias present); phi3: one
                                                                   attn_qkv of rows q, k, v
  q_h, k_g = rmsnorm(q_h) * attn_q_norm, rmsnorm(k_g) * attn_k_norm per head over HS (gemma3, qwen3, or tensors
                                                                   present); olmo2: over the whole q and k
  q, k = rope(q, base_l), rope(k, base_l)                          the first rope_dim of each head (phi3: partial);
                                                                   skipped on nope_layers and smollm3's (l+1) % 4 == 0;
                                                                   base_l = the local base on sliding layers; NeoX
                                                                   halves except llama, mistral3, smollm3
  a_h = softmax(cap tanh(q_h k_g^T * scale / cap) + mask) v_g      scale: attention.scale, else 1/sqrt(HS); cap:
                                                                   gemma2's attn_logit_softcapping (50), else none;
                                                                   mask: causal, and on sliding layers j > p - W
  a = a * sigmoid(h Wgate^T)                                       attention.output_gate (attn_gate.weight)
  o = a Wo^T;  o = rmsnorm(o) * post_attention_norm                sandwich (eps = layer_norm_rms_epsilon_post)
  x = x + o
  h = rmsnorm(x) * ffn_norm  (olmo2: h = x)
  f = (act(h Wg^T) * h Wu^T) Wd^T, act silu or gelu_tanh (gemma); phi3: ffn_up's rows are gate then up
  f = rmsnorm(f) * post_ffw_norm (sandwich: gemma, olmo2, Muse)
  x = x + f
  logits = (rmsnorm(x) * output_norm) Wout^T;  logits *= logit_scale;  logits = cap tanh(logits / cap)

Regenerate (deterministic: seeded):
  python3 -m venv /tmp/archenv && /tmp/archenv/bin/pip install gguf numpy
  /tmp/archenv/bin/python tests/ref/arch_ref.py
"""
import os

import numpy as np
import gguf

HERE = os.path.dirname(os.path.abspath(__file__))

# name, arch, dims and flags. 'meta' is the extra metadata under the arch prefix; 'tensors' the optional tensors.
FIXTURES = [
    # qwen2: q/k/v biases, NeoX RoPE, GQA
    dict(name="arch_qwen2", arch="qwen2", V=64, C=32, L=2, NH=4, NKV=2, HS=8, F=48, T=12,
         rope_base=1e6, eps=1e-6, meta={}, tied=False),
    # gemma3: sqrt(C) embedding scale, head size from key_length (!= C / NH), per-head QK norm, sandwich norms,
    # GeGLU, tied head, sliding window 4 on layers 0-4 and 6 (layer 5 global), local RoPE base 10000 vs 1e6.
    # T = 20 tokens, five windows: the sliding layers' ring cache wraps several times.
    dict(name="arch_gemma3", arch="gemma3", V=48, C=24, L=7, NH=2, NKV=1, HS=8, F=32, T=20,
         rope_base=1e6, eps=1e-6, meta={"attention.sliding_window": 4}, tied=True),
    # Muse on a llama file: no RoPE on layer 1, sigmoid output gate, sandwich norms with their own epsilon, logit
    # scale then softcap, sliding window 5 on even layers (pattern 2) with a local RoPE base of 500, and an
    # attention scale of 0.25 (llama.cpp's attention.scale; 1/sqrt(HS) = 0.354 otherwise).
    dict(name="arch_muse", arch="llama", V=64, C=32, L=3, NH=4, NKV=4, HS=8, F=40, T=16,
         rope_base=10000.0, eps=1e-5,
         meta={"attention.nope_layers": [1], "attention.output_gate": True,
               "attention.layer_norm_rms_epsilon_post": 1e-2, "logit_scale": 0.5, "final_logit_softcapping": 3.0,
               "attention.sliding_window": 5, "attention.sliding_window_pattern": 2, "rope.local.freq_base": 500.0,
               "attention.scale": 0.25},
         tied=False, sandwich=True, gate=True),
    # qwen3: per-head QK norm, NeoX RoPE, no biases, head size from key_length (16, not C/NH = 8), GQA
    dict(name="arch_qwen3", arch="qwen3", V=64, C=32, L=2, NH=4, NKV=2, HS=16, F=48, T=12,
         rope_base=1e6, eps=1e-6, meta={}, tied=True),
    # Mistral 7B v0.1 as its llama file: every layer slides (window 4, no pattern key), GQA, interleaved RoPE
    dict(name="arch_mistral", arch="llama", V=64, C=32, L=2, NH=4, NKV=1, HS=8, F=48, T=14,
         rope_base=1e6, eps=1e-5, meta={"attention.sliding_window": 4}, tied=False),
    # mistral3 (Ministral 3 / Mistral Small 3 text): llama's graph under its own name
    dict(name="arch_mistral3", arch="mistral3", V=64, C=32, L=2, NH=4, NKV=2, HS=8, F=40, T=10,
         rope_base=1e6, eps=1e-5, meta={}, tied=False),
    # phi3: fused attn_qkv and ffn_up (gate then up), partial rotary (rope_dim 4 of HS 8, NeoX), sliding window 5 on
    # every layer, LongRoPE factor tensors present (all ones: the same model whichever set applies)
    dict(name="arch_phi3", arch="phi3", V=64, C=32, L=2, NH=4, NKV=4, HS=8, F=40, T=14, rope_dim=4,
         rope_base=10000.0, eps=1e-5, meta={"attention.sliding_window": 5}, tied=False, fused=True),
    # gemma2: attention softcap 2 (scores reach ~4 here, so it bites), final softcap 3, sliding window 4 on even
    # layers (llama.cpp's pattern 2), attention.scale 0.2 (query_pre_attn_scalar), sandwich norms, GeGLU, sqrt(C)
    # embedding scale, tied head, HS from key_length
    dict(name="arch_gemma2", arch="gemma2", V=48, C=24, L=4, NH=2, NKV=1, HS=8, F=32, T=14,
         rope_base=10000.0, eps=1e-6,
         meta={"attention.sliding_window": 4, "attn_logit_softcapping": 2.0, "final_logit_softcapping": 3.0,
               "attention.scale": 0.2},
         tied=True),
    # smollm3: llama-like, no RoPE on layers 3 and 7 ((l + 1) % 4 == 0, llama.cpp's n_no_rope_layer_step)
    dict(name="arch_smollm3", arch="smollm3", V=64, C=16, L=8, NH=2, NKV=1, HS=8, F=24, T=10,
         rope_base=10000.0, eps=1e-6, meta={}, tied=True),
    # olmo2: no pre-norms, post-norms on each block's output, QK norm over the whole q (NH*HS) and k (NKV*HS), NeoX
    dict(name="arch_olmo2", arch="olmo2", V=64, C=32, L=2, NH=4, NKV=2, HS=8, F=40, T=12,
         rope_base=500000.0, eps=1e-6, meta={}, tied=False),
]

GEMMA = ("gemma2", "gemma3")
NORM_ROPE = ("llama", "mistral3", "smollm3")  # llama.cpp's LLAMA_ROPE_TYPE_NORM: interleaved pairs


def f16(a):
    return a.astype(np.float16).astype(np.float64)


def rmsnorm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope(x, pos, nh, hs, base, neox, rd=None):
    """x (T, nh*hs), the first rd (default hs) of each head rotated: theta_i = pos * base^(-2i/rd); pairs (2i, 2i+1),
    or (i, i + rd/2) with neox (ggml's partial NeoX rotation); the rest of the head passes through."""
    rd = rd or hs
    x = x.reshape(len(pos), nh, hs).copy()
    half = rd // 2
    theta = pos[:, None] * base ** (-2.0 * np.arange(half) / rd)  # (T, half)
    c, s = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    if neox:
        a, b = x[..., :half].copy(), x[..., half:rd].copy()
        x[..., :half], x[..., half:rd] = a * c - b * s, a * s + b * c
    else:
        a, b = x[..., 0:rd:2].copy(), x[..., 1:rd:2].copy()
        x[..., 0:rd:2], x[..., 1:rd:2] = a * c - b * s, a * s + b * c
    return x.reshape(len(pos), nh * hs)


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def silu(x):
    return x / (1 + np.exp(-x))


def layer_flags(fx):
    meta = fx["meta"]
    arch = fx["arch"]
    W = meta.get("attention.sliding_window", 4096 if arch == "gemma2" else 0)
    P = meta.get("attention.sliding_window_pattern", {"gemma3": 6, "gemma2": 2, "olmo2": 4}.get(arch, 0))
    local = meta.get("rope.local.freq_base", 10000.0 if arch == "gemma3" else fx["rope_base"])
    out = []
    for l in range(fx["L"]):
        slides = W > 0 and (P <= 1 or l % P < P - 1)
        nope = l in meta.get("attention.nope_layers", []) or (arch == "smollm3" and (l + 1) % 4 == 0)
        out.append(dict(window=W if slides else 0, base=local if slides else fx["rope_base"], nope=nope))
    return out


def forward(fx, w, ids):
    arch, meta = fx["arch"], fx["meta"]
    C, NH, NKV, HS, eps = fx["C"], fx["NH"], fx["NKV"], fx["HS"], fx["eps"]
    post_eps = meta.get("attention.layer_norm_rms_epsilon_post", eps)
    gemma, neox = arch in GEMMA, arch not in NORM_ROPE
    Q, KV, F, rd = NH * HS, NKV * HS, fx["F"], fx.get("rope_dim", HS)
    cap_attn = meta.get("attn_logit_softcapping", 50.0 if arch == "gemma2" else 0.0)
    T = len(ids)
    pos = np.arange(T, dtype=np.float64)
    x = w["token_embd.weight"][ids].copy()
    if gemma:
        x *= np.float64(np.float32(np.sqrt(np.float32(C))))
    for l, lf in enumerate(layer_flags(fx)):
        p = f"blk.{l}."
        h = rmsnorm(x, w[p + "attn_norm.weight"], eps) if p + "attn_norm.weight" in w else x  # olmo2: no pre-norm
        if p + "attn_qkv.weight" in w:  # phi3: rows q, then k, then v
            qkv = h @ w[p + "attn_qkv.weight"].T
            q, k, v = qkv[:, :Q], qkv[:, Q:Q + KV], qkv[:, Q + KV:]
        else:
            q, k, v = h @ w[p + "attn_q.weight"].T, h @ w[p + "attn_k.weight"].T, h @ w[p + "attn_v.weight"].T
        if p + "attn_q.bias" in w:
            q, k, v = q + w[p + "attn_q.bias"], k + w[p + "attn_k.bias"], v + w[p + "attn_v.bias"]
        if p + "attn_q_norm.weight" in w and len(w[p + "attn_q_norm.weight"]) == Q:  # olmo2: over the whole q, k
            q, k = rmsnorm(q, w[p + "attn_q_norm.weight"], eps), rmsnorm(k, w[p + "attn_k_norm.weight"], eps)
        elif p + "attn_q_norm.weight" in w:
            q = rmsnorm(q.reshape(T, NH, HS), w[p + "attn_q_norm.weight"], eps).reshape(T, NH * HS)
            k = rmsnorm(k.reshape(T, NKV, HS), w[p + "attn_k_norm.weight"], eps).reshape(T, NKV * HS)
        if not lf["nope"]:
            q, k = rope(q, pos, NH, HS, lf["base"], neox, rd), rope(k, pos, NKV, HS, lf["base"], neox, rd)
        k, v = f16(k), f16(v)
        j, t = np.arange(T)[None, :], np.arange(T)[:, None]
        masked = (j > t) | ((j <= t - lf["window"]) if lf["window"] else False)
        a = np.zeros((T, NH * HS))
        for hh in range(NH):
            g = hh // (NH // NKV)
            s = q[:, hh * HS:(hh + 1) * HS] @ k[:, g * HS:(g + 1) * HS].T * meta.get("attention.scale", 1 / np.sqrt(HS))
            if cap_attn:
                s = cap_attn * np.tanh(s / cap_attn)
            s = np.where(masked, -np.inf, s)
            pr = np.exp(s - s.max(axis=1, keepdims=True))
            pr /= pr.sum(axis=1, keepdims=True)
            a[:, hh * HS:(hh + 1) * HS] = pr @ v[:, g * HS:(g + 1) * HS]
        if p + "attn_gate.weight" in w:
            a = a / (1 + np.exp(-(h @ w[p + "attn_gate.weight"].T)))
        o = a @ w[p + "attn_output.weight"].T
        if p + "post_attention_norm.weight" in w:
            o = rmsnorm(o, w[p + "post_attention_norm.weight"], post_eps)
        x = x + o
        h = rmsnorm(x, w[p + "ffn_norm.weight"], eps) if p + "ffn_norm.weight" in w else x
        act = gelu_tanh if gemma else silu
        if p + "ffn_gate.weight" in w:
            g_, u_ = h @ w[p + "ffn_gate.weight"].T, h @ w[p + "ffn_up.weight"].T
        else:  # phi3: ffn_up holds gate then up (llama.cpp's LLM_FFN_SWIGLU: silu of the first half)
            gu = h @ w[p + "ffn_up.weight"].T
            g_, u_ = gu[:, :F], gu[:, F:]
        f = (act(g_) * u_) @ w[p + "ffn_down.weight"].T
        if p + "post_ffw_norm.weight" in w:
            f = rmsnorm(f, w[p + "post_ffw_norm.weight"], post_eps)
        x = x + f
    out = w["output.weight"] if "output.weight" in w else w["token_embd.weight"]
    logits = rmsnorm(x, w["output_norm.weight"], eps) @ out.T
    logits *= meta.get("logit_scale", 1.0)
    cap = meta.get("final_logit_softcapping", 30.0 if arch == "gemma2" else 0.0)
    if cap:
        logits = cap * np.tanh(logits / cap)
    return logits


def make_weights(fx, rng):
    V, C, NH, NKV, HS, F = fx["V"], fx["C"], fx["NH"], fx["NKV"], fx["HS"], fx["F"]
    Q, KV = NH * HS, NKV * HS
    arch = fx["arch"]
    gemma = arch in GEMMA

    def mat(o, i):  # (o rows of i), scaled so activations stay O(1)
        return (rng.standard_normal((o, i)) / np.sqrt(i)).astype(np.float32)

    def norm(n):  # gemma3's GGUF norms hold 1 + w already (llama.cpp's converter adds 1): used as stored
        return (1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32)

    # a tied head's logits grow with the embedding's scale: 0.2 keeps them O(1)
    w = {"token_embd.weight": (rng.standard_normal((V, C)) * (0.2 if gemma or fx["tied"] else 1.0)).astype(np.float32),
         "output_norm.weight": norm(C)}
    if not fx["tied"]:
        w["output.weight"] = mat(V, C)
    for l in range(fx["L"]):
        p = f"blk.{l}."
        if arch != "olmo2":
            w[p + "attn_norm.weight"] = norm(C)
        if fx.get("fused"):
            w[p + "attn_qkv.weight"] = mat(Q + 2 * KV, C)
        else:
            w[p + "attn_q.weight"], w[p + "attn_k.weight"], w[p + "attn_v.weight"] = mat(Q, C), mat(KV, C), mat(KV, C)
        w[p + "attn_output.weight"] = mat(C, Q)
        if arch != "olmo2":
            w[p + "ffn_norm.weight"] = norm(C)
        if fx.get("fused"):
            w[p + "ffn_up.weight"] = mat(2 * F, C)
        else:
            w[p + "ffn_gate.weight"], w[p + "ffn_up.weight"] = mat(F, C), mat(F, C)
        w[p + "ffn_down.weight"] = mat(C, F)
        if fx["arch"] == "qwen2":
            for n, d in (("q", Q), ("k", KV), ("v", KV)):
                w[p + f"attn_{n}.bias"] = (0.5 * rng.standard_normal(d)).astype(np.float32)
        if arch in ("gemma3", "qwen3"):
            w[p + "attn_q_norm.weight"], w[p + "attn_k_norm.weight"] = norm(HS), norm(HS)
        if arch == "olmo2":
            w[p + "attn_q_norm.weight"], w[p + "attn_k_norm.weight"] = norm(Q), norm(KV)
        if gemma or arch == "olmo2" or fx.get("sandwich"):
            w[p + "post_attention_norm.weight"], w[p + "post_ffw_norm.weight"] = norm(C), norm(C)
        if fx.get("gate"):
            w[p + "attn_gate.weight"] = mat(Q, C)
    if "rope_dim" in fx:  # LongRoPE's factors (phi3), ones: the rotation is the unscaled one whichever applies
        w["rope_factors_long.weight"] = np.ones(fx["rope_dim"] // 2, dtype=np.float32)
        w["rope_factors_short.weight"] = np.ones(fx["rope_dim"] // 2, dtype=np.float32)
    return w


def write(fx, seed):
    rng = np.random.default_rng(seed)
    w = make_weights(fx, rng)
    ids = rng.integers(0, fx["V"], fx["T"]).astype(np.int32)
    logits = forward(fx, {k: v.astype(np.float64) for k, v in w.items()}, ids)
    A = fx["arch"]
    path = os.path.join(HERE, fx["name"] + ".gguf")
    wr = gguf.GGUFWriter(path, A)
    wr.add_uint32(f"{A}.embedding_length", fx["C"])
    wr.add_uint32(f"{A}.block_count", fx["L"])
    wr.add_uint32(f"{A}.attention.head_count", fx["NH"])
    wr.add_uint32(f"{A}.attention.head_count_kv", fx["NKV"])
    wr.add_uint32(f"{A}.feed_forward_length", fx["F"])
    wr.add_uint32(f"{A}.context_length", 64)
    wr.add_float32(f"{A}.rope.freq_base", fx["rope_base"])
    wr.add_float32(f"{A}.attention.layer_norm_rms_epsilon", fx["eps"])
    if fx["HS"] * fx["NH"] != fx["C"]:
        wr.add_uint32(f"{A}.attention.key_length", fx["HS"])
        wr.add_uint32(f"{A}.attention.value_length", fx["HS"])
    if "rope_dim" in fx:
        wr.add_uint32(f"{A}.rope.dimension_count", fx["rope_dim"])
    for k, v in fx["meta"].items():
        if isinstance(v, bool):
            wr.add_bool(f"{A}.{k}", v)
        elif isinstance(v, int):
            wr.add_uint32(f"{A}.{k}", v)
        elif isinstance(v, float):
            wr.add_float32(f"{A}.{k}", v)
        else:
            wr.add_array(f"{A}.{k}", [int(i) for i in v])
    wr.add_array("ref.tokens", [int(i) for i in ids])
    for name, t in w.items():
        wr.add_tensor(name, t)
    wr.add_tensor("ref.logits", logits.astype(np.float32))
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    print(f"{path}: {os.path.getsize(path)} bytes, T={fx['T']}, max|logit| {np.abs(logits).max():.3f}")


if __name__ == "__main__":
    for i, fx in enumerate(FIXTURES):
        write(fx, 1000 + i)
