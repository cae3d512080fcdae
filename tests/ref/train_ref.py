#!/usr/bin/env python3
"""train_ref.py: the reference dump tests/test_train.c holds kiln's trainer against.

An independent llama forward, loss and AdamW written here in JAX at float64; the gradients come from
jax.grad (automatic differentiation), so they share nothing with kiln's hand-written backward. It writes
tests/ref/train_ref.gguf (with the PyPI `gguf` package) holding:

  - a llama-architecture model (llama.* keys, F32 tensors named as GGUF llama files name them), drawn from
    numpy's default_rng(SEED) and rounded to float32 so kiln starts from exactly these weights;
  - ref.inputs / ref.targets (I32, B*T): one batch; target -1 at one position is ignored by the loss;
  - ref.loss (f64 key): the mean loss over counted targets, with label smoothing and z-loss as in ref.*;
  - ref.grad.<name> (F32): d(mean loss)/d(<name>) for every parameter;
  - ref.step_inputs / ref.step_targets (I32, STEPS*B*T) and ref.step_losses (f64 array, STEPS): the losses
    seen by STEPS AdamW steps, one batch each, from the weights above.

Definitions (kiln's, see src/cpu/ops.h):
  rmsnorm(x) = x / sqrt(mean(x^2) + eps) * w
  RoPE: adjacent pairs (x[2i], x[2i+1]) rotated by pos * base^(-2i/HS), pos = t within each sequence
  attention: causal, GQA (query head h reads kv head h // (NH/NKV)), scale 1/sqrt(HS)
  FFN: down(silu(gate(x)) * up(x)); logits = rmsnorm(x_L) Wout^T (untied)
  loss per counted row, z = logsumexp(logits), eps = label smoothing:
    (1-eps) (z - logit[target]) + eps mean_j (z - logit[j]) + z_loss z^2
  AdamW (decoupled): g *= min(1, clip / ||g||); m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
    p = p - lr (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps_adam) - lr wd p  (wd only on the matrices but the
    embedding; norms and token_embd take none)

Run:  python3 -m venv /tmp/jaxenv && /tmp/jaxenv/bin/pip install jax numpy gguf
      /tmp/jaxenv/bin/python tests/ref/train_ref.py
"""
import os
import sys

import numpy as np
import jax
import jax.numpy as jnp

jax.config.update("jax_enable_x64", True)
import gguf  # noqa: E402

SEED = 1234
V, C, L, NH, NKV, F = 67, 32, 2, 4, 2, 72
HS = C // NH
B, T = 2, 9
EPS, BASE = 1e-5, 10000.0
LABEL_SMOOTHING, Z_LOSS = 0.1, 1e-4
LR, B1, B2, ADAM_EPS, WD, CLIP = 3e-3, 0.9, 0.95, 1e-8, 0.1, 0.5
STEPS = 10


def names():
    out = [("token_embd.weight", (V, C))]
    for l in range(L):
        p = f"blk.{l}."
        out += [(p + "attn_norm.weight", (C,)), (p + "attn_q.weight", (NH * HS, C)), (p + "attn_k.weight", (NKV * HS, C)),
                (p + "attn_v.weight", (NKV * HS, C)), (p + "attn_output.weight", (C, NH * HS)), (p + "ffn_norm.weight", (C,)),
                (p + "ffn_gate.weight", (F, C)), (p + "ffn_up.weight", (F, C)), (p + "ffn_down.weight", (C, F))]
    out += [("output_norm.weight", (C,)), ("output.weight", (V, C))]
    return out


def decays(name):
    return not (name.endswith("norm.weight") or name == "token_embd.weight")


def init(rng):
    params = {}
    for name, shape in names():
        if len(shape) == 1:
            w = 1.0 + 0.1 * rng.standard_normal(shape)  # not all ones, so the norm gradients are exercised
        else:
            w = 0.3 * rng.standard_normal(shape)  # larger than a real init, so every path carries signal
        params[name] = np.asarray(w, dtype=np.float32).astype(np.float64)
    return params


def rmsnorm(x, w):
    return x / jnp.sqrt(jnp.mean(x * x, axis=-1, keepdims=True) + EPS) * w


def rope(x, nh):  # x (B, T, nh*HS)
    x = x.reshape(B, T, nh, HS // 2, 2)
    pos = jnp.arange(T, dtype=jnp.float64)[:, None]
    theta = pos * BASE ** (-2.0 * jnp.arange(HS // 2, dtype=jnp.float64) / HS)[None, :]  # (T, HS/2)
    cos, sin = jnp.cos(theta)[None, :, None, :], jnp.sin(theta)[None, :, None, :]
    a, b = x[..., 0], x[..., 1]
    return jnp.stack([a * cos - b * sin, a * sin + b * cos], axis=-1).reshape(B, T, nh * HS)


def forward(p, ids):
    x = p["token_embd.weight"][ids]  # (B, T, C)
    mask = jnp.tril(jnp.ones((T, T), dtype=bool))
    for l in range(L):
        w = lambda n: p[f"blk.{l}.{n}.weight"]  # noqa: E731
        h = rmsnorm(x, w("attn_norm"))
        q, k, v = rope(h @ w("attn_q").T, NH), rope(h @ w("attn_k").T, NKV), h @ w("attn_v").T
        q = q.reshape(B, T, NH, HS)
        k = jnp.repeat(k.reshape(B, T, NKV, HS), NH // NKV, axis=2)
        v = jnp.repeat(v.reshape(B, T, NKV, HS), NH // NKV, axis=2)
        s = jnp.einsum("bthd,bshd->bhts", q, k) / np.sqrt(HS)
        s = jnp.where(mask[None, None], s, -jnp.inf)
        a = jnp.einsum("bhts,bshd->bthd", jax.nn.softmax(s, axis=-1), v).reshape(B, T, NH * HS)
        x = x + a @ w("attn_output").T
        h = rmsnorm(x, w("ffn_norm"))
        x = x + (jax.nn.silu(h @ w("ffn_gate").T) * (h @ w("ffn_up").T)) @ w("ffn_down").T
    return rmsnorm(x, p["output_norm.weight"]) @ p["output.weight"].T  # (B, T, V)


def loss_fn(p, ids, targets):
    logits = forward(p, ids).reshape(B * T, V)
    t = targets.reshape(B * T)
    z = jax.scipy.special.logsumexp(logits, axis=-1)
    nll = z - jnp.take_along_axis(logits, jnp.maximum(t, 0)[:, None], axis=-1)[:, 0]
    smooth = z - jnp.mean(logits, axis=-1)
    row = (1 - LABEL_SMOOTHING) * nll + LABEL_SMOOTHING * smooth + Z_LOSS * z * z
    counted = t != -1
    return jnp.sum(jnp.where(counted, row, 0.0)) / jnp.sum(counted)


def batch(rng):
    ids = rng.integers(0, V, size=(B, T)).astype(np.int32)
    targets = rng.integers(0, V, size=(B, T)).astype(np.int32)
    return ids, targets


def main():
    rng = np.random.default_rng(SEED)
    params = init(rng)
    ids, targets = batch(rng)
    targets[1, 3] = -1
    grad_fn = jax.value_and_grad(loss_fn)
    loss, grads = grad_fn(params, ids, targets)

    # AdamW steps, each on a fresh batch
    p = {k: np.array(v) for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in p.items()}
    vv = {k: np.zeros_like(v) for k, v in p.items()}
    step_ids, step_targets, step_losses = [], [], []
    for step in range(1, STEPS + 1):
        si, st = batch(rng)
        step_ids.append(si)
        step_targets.append(st)
        lo, g = grad_fn(p, si, st)
        step_losses.append(float(lo))
        g = {k: np.asarray(x) for k, x in g.items()}
        norm = np.sqrt(sum(float(np.sum(x * x)) for x in g.values()))
        scale = min(1.0, CLIP / norm)
        for k in p:
            gk = g[k] * scale
            m[k] = B1 * m[k] + (1 - B1) * gk
            vv[k] = B2 * vv[k] + (1 - B2) * gk * gk
            mhat, vhat = m[k] / (1 - B1 ** step), vv[k] / (1 - B2 ** step)
            p[k] = p[k] - LR * mhat / (np.sqrt(vhat) + ADAM_EPS) - (LR * WD * p[k] if decays(k) else 0.0)

    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train_ref.gguf")
    w = gguf.GGUFWriter(out, "llama")
    w.add_context_length(64)
    w.add_embedding_length(C)
    w.add_block_count(L)
    w.add_feed_forward_length(F)
    w.add_head_count(NH)
    w.add_head_count_kv(NKV)
    w.add_layer_norm_rms_eps(EPS)
    w.add_rope_freq_base(BASE)
    w.add_vocab_size(V)
    for key, val in [("ref.label_smoothing", LABEL_SMOOTHING), ("ref.z_loss", Z_LOSS), ("ref.lr", LR), ("ref.beta1", B1),
                     ("ref.beta2", B2), ("ref.adam_eps", ADAM_EPS), ("ref.weight_decay", WD), ("ref.grad_clip", CLIP)]:
        w.add_float64(key, val)
    w.add_uint32("ref.B", B)
    w.add_uint32("ref.T", T)
    w.add_uint32("ref.steps", STEPS)
    w.add_float64("ref.loss", float(loss))
    w.add_key_value("ref.step_losses", step_losses, gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.FLOAT64)
    w.add_string("ref.generator", f"tests/ref/train_ref.py (jax {jax.__version__}, numpy {np.__version__}, float64)")
    for name, _ in names():
        w.add_tensor(name, params[name].astype(np.float32))
    w.add_tensor("ref.inputs", ids.reshape(-1))
    w.add_tensor("ref.targets", targets.reshape(-1))
    for name, _ in names():
        w.add_tensor("ref.grad." + name, np.asarray(grads[name]).astype(np.float32))
    w.add_tensor("ref.step_inputs", np.stack(step_ids).reshape(-1))
    w.add_tensor("ref.step_targets", np.stack(step_targets).reshape(-1))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {out}: loss {float(loss):.6f}, step losses {' '.join(f'{x:.4f}' for x in step_losses)}", file=sys.stderr)


if __name__ == "__main__":
    main()
