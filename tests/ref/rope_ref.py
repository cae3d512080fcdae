#!/usr/bin/env python3
"""rope_ref.py: small GGUFs with RoPE scaling (linear, YaRN, Llama 3's frequency factors from the tensor and from
the keys, Phi-3's LongRoPE, gemma3's linear scaling on global layers) and their float64 numpy reference logits,
which tests/test_rope.c checks kiln's model load and session against.

The model and its forward are arch_ref.py's (same weights generator, same float64 forward with f16 k/v); only the
rotation differs. Each scaling kind is written here from its published definition, sharing no code with kiln:

  angle of pair i at position p:  theta_i = p * base^(-2i/d) * m_i,  cos and sin multiplied by mscale
  linear     m_i = 1 / factor                                         (llama.cpp: freq_scale = 1 / factor)
  YaRN       m_i = (1 - mix_i) / factor + mix_i, mix_i = 1 - clip((i - lo) / max(0.001, hi - lo), 0, 1) * ext,
             lo = max(0, floor(dim(beta_fast))), hi = min(d - 1, ceil(dim(beta_slow))),
             dim(b) = d ln(orig / (2 pi b)) / (2 ln base)             (YaRN paper; ggml_rope_yarn_corr_dims)
             mscale = 0.1 ln(factor) + 1
  factors    m_i = 1 / ff_i: rope_freqs.weight, or HF's llama3 rule (transformers _compute_llama3_parameters),
             or LongRoPE's long (context > orig) / short factors with mscale sqrt(1 + ln(ctx/orig) / ln(orig))
  gemma3     linear on the global layers only (llama.cpp: sliding layers keep rope_freq_scale_train_swa = 1)

Each fixture holds ref.tokens and ref.logits (T, V) (the file's scaling, the session's context = context_length);
some hold more references under other names (ref.logits_<what>), documented in FIXTURES.

Regenerate (deterministic: seeded): python3 tests/ref/rope_ref.py   (needs numpy and gguf)
"""
import math
import os
import sys

import numpy as np
import gguf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import arch_ref  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def yarn_mults(d, base, factor, orig, beta_fast=32.0, beta_slow=1.0, ext=1.0):
    def dim(b):
        return d * math.log(orig / (2 * math.pi * b)) / (2 * math.log(base))
    lo, hi = max(0.0, math.floor(dim(beta_fast))), min(d - 1.0, math.ceil(dim(beta_slow)))
    i = np.arange(d // 2, dtype=np.float64)
    mix = (1 - np.clip((i - lo) / max(0.001, hi - lo), 0, 1)) * ext
    return (1 - mix) / factor + mix, 0.1 * math.log(factor) + 1


def llama3_divisors(d, base, factor, low, high, orig):
    out = []
    for i in range(d // 2):
        freq = base ** (-2.0 * i / d)
        wl = 2 * math.pi / freq
        if wl < orig / high:
            out.append(1.0)
        elif wl > orig / low:
            out.append(factor)
        else:
            smooth = (orig / wl - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out)


def scaled_rope(tables):
    """arch_ref.rope's signature; tables[base] = (m (d/2), mscale), a base absent from it is unscaled."""
    def rope(x, pos, nh, hs, base, neox):
        m, ms = tables.get(base, (np.ones(hs // 2), 1.0))
        x = x.reshape(len(pos), nh, hs).copy()
        half = hs // 2
        theta = pos[:, None] * base ** (-2.0 * np.arange(half) / hs) * m
        c, s = ms * np.cos(theta)[:, None, :], ms * np.sin(theta)[:, None, :]
        if neox:
            a, b = x[..., :half].copy(), x[..., half:].copy()
            x[..., :half], x[..., half:] = a * c - b * s, a * s + b * c
        else:
            a, b = x[..., 0::2].copy(), x[..., 1::2].copy()
            x[..., 0::2], x[..., 1::2] = a * c - b * s, a * s + b * c
        return x.reshape(len(pos), nh * hs)
    return rope


def base_fx(name, arch="llama", **kw):
    fx = dict(name=name, arch=arch, V=16, C=16, L=2, NH=2, NKV=1, HS=16, F=16, T=48, rope_base=500.0, eps=1e-5,
              meta={}, tied=False, ctx=64)
    fx.update(kw)
    return fx


D = 16  # rope_dim = HS
FF_TENSOR = np.random.default_rng(7).uniform(1.0, 8.0, D // 2).astype(np.float32)
LONG = np.random.default_rng(8).uniform(1.0, 6.0, D // 2).astype(np.float32)
SHORT = np.random.default_rng(9).uniform(1.0, 1.5, D // 2).astype(np.float32)

# name -> fixture, the references {suffix: (tables, T)} ("" is ref.logits), extra tensors
FIXTURES = [
    # linear factor 4 (llama, interleaved); ref.logits_none: --rope-scaling none; ref.logits_fs2: freq_scale 0.5
    # (C = NH * HS, as kiln's trainer needs: tests/test_rope.c trains from it too)
    (base_fx("rope_linear", C=32, meta={"rope.scaling.type": "linear", "rope.scaling.factor": 4.0}),
     {"": ({500.0: (np.full(D // 2, 0.25), 1.0)}, 48), "_none": ({}, 48), "_fs2": ({500.0: (np.full(D // 2, 0.5), 1.0)}, 48)},
     {}),
    # YaRN factor 4 from an original context of 32 (qwen2: NeoX, biases); positions 32..47 are past it
    (base_fx("rope_yarn", arch="qwen2", meta={"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0,
                                              "rope.scaling.original_context_length": 32}),
     {"": ({500.0: yarn_mults(D, 500.0, 4.0, 32)}, 48)}, {}),
    # Llama 3.1-style rope_freqs.weight, no scaling keys
    (base_fx("rope_freqs", meta={}), {"": ({500.0: (1 / FF_TENSOR.astype(np.float64), 1.0)}, 48)},
     {"rope_freqs.weight": FF_TENSOR}),
    # HF's llama3 rope_type from kiln's keys (no tensor): factor 8, low 1, high 4, original context 32
    (base_fx("rope_llama3", meta={"rope.scaling.type": "llama3", "rope.scaling.factor": 8.0,
                                  "rope.scaling.low_freq_factor": 1.0, "rope.scaling.high_freq_factor": 4.0,
                                  "rope.scaling.original_context_length": 32}),
     {"": ({500.0: (1 / llama3_divisors(D, 500.0, 8.0, 1.0, 4.0, 32), 1.0)}, 48)}, {}),
    # LongRoPE: context 64 > original 32 takes the long factors (ref.logits); a session of 32 positions the short
    # ones (ref.logits_short, 32 tokens); mscale from the context ratio (no attn_factor key)
    (base_fx("rope_longrope", meta={"rope.scaling.type": "longrope", "rope.scaling.original_context_length": 32}),
     {"": ({500.0: (1 / LONG.astype(np.float64), math.sqrt(1 + math.log(2) / math.log(32)))}, 48),
      "_short": ({500.0: (1 / SHORT.astype(np.float64), math.sqrt(1 + math.log(2) / math.log(32)))}, 32)},
     {"rope_factors_long.weight": LONG, "rope_factors_short.weight": SHORT}),
    # gemma3 linear factor 8: layer 0 slides (base 10000, unscaled), layer 1 is global (base 1e6, scaled)
    (base_fx("rope_gemma3", arch="gemma3", NH=2, NKV=1, HS=16, rope_base=1e6, eps=1e-6, tied=True,
             meta={"attention.sliding_window": 6, "attention.sliding_window_pattern": 2,
                   "rope.scaling.type": "linear", "rope.scaling.factor": 8.0}),
     {"": ({1e6: (np.full(D // 2, 0.125), 1.0)}, 48)}, {}),
]


def write(fx, refs, extra, seed):
    rng = np.random.default_rng(seed)
    w = arch_ref.make_weights(fx, rng)
    ids = rng.integers(0, fx["V"], fx["T"]).astype(np.int32)
    w64 = {k: v.astype(np.float64) for k, v in w.items()}
    logits = {}
    for suffix, (tables, T) in refs.items():
        arch_ref.rope = scaled_rope(tables)
        logits[suffix] = arch_ref.forward(fx, w64, ids[:T])
    A = fx["arch"]
    path = os.path.join(HERE, fx["name"] + ".gguf")
    wr = gguf.GGUFWriter(path, A)
    wr.add_uint32(f"{A}.embedding_length", fx["C"])
    wr.add_uint32(f"{A}.block_count", fx["L"])
    wr.add_uint32(f"{A}.attention.head_count", fx["NH"])
    wr.add_uint32(f"{A}.attention.head_count_kv", fx["NKV"])
    wr.add_uint32(f"{A}.feed_forward_length", fx["F"])
    wr.add_uint32(f"{A}.context_length", fx["ctx"])
    wr.add_float32(f"{A}.rope.freq_base", fx["rope_base"])
    wr.add_float32(f"{A}.attention.layer_norm_rms_epsilon", fx["eps"])
    if fx["HS"] * fx["NH"] != fx["C"]:
        wr.add_uint32(f"{A}.attention.key_length", fx["HS"])
        wr.add_uint32(f"{A}.attention.value_length", fx["HS"])
    for k, v in fx["meta"].items():
        if isinstance(v, str):
            wr.add_string(f"{A}.{k}", v)
        elif isinstance(v, int):
            wr.add_uint32(f"{A}.{k}", v)
        else:
            wr.add_float32(f"{A}.{k}", v)
    wr.add_array("ref.tokens", [int(i) for i in ids])
    for name, t in list(w.items()) + list(extra.items()):
        wr.add_tensor(name, t)
    for suffix, lg in logits.items():
        wr.add_tensor("ref.logits" + suffix, lg.astype(np.float32))
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    print(f"{path}: {os.path.getsize(path)} bytes, refs {list(logits)}, max|logit| {np.abs(logits['']).max():.3f}")


if __name__ == "__main__":
    for i, (fx, refs, extra) in enumerate(FIXTURES):
        write(fx, refs, extra, 2000 + i)
