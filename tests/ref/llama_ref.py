#!/usr/bin/env python3
"""llama_ref.py: an independent float64 numpy forward pass of a llama-architecture GGUF, and the golden fixtures
that tests/test_smollm.c checks kiln's forward against.

It shares no code with kiln: weights are read and dequantized by the PyPI `gguf` package (llama.cpp's gguf-py:
GGUFReader + gguf.quants.dequantize), token ids come from the HF `tokenizers` library (Rust) built from the
GGUF's own vocabulary and merges, and the forward below is written from the llama architecture as llama.cpp
runs it, in float64 throughout (no activation quantization, no f16 KV cache):

  x = token_embd[ids]                                            (T, C)
  per layer l:
    h = rmsnorm(x) * attn_norm                                   eps = llama.attention.layer_norm_rms_epsilon
    q, k, v = h Wq^T, h Wk^T, h Wv^T                             (T, NH*HS), (T, NKV*HS), (T, NKV*HS)
    q, k = rope(q), rope(k)                                      see rope() for the layout
    a_h = softmax(q_h k_g^T / sqrt(HS) + causal mask) v_g        g = h // (NH/NKV)  (GQA)
    x = x + concat(a_h) Wo^T
    h = rmsnorm(x) * ffn_norm
    x = x + (silu(h Wgate^T) * (h Wup^T)) Wdown^T                SwiGLU
  logits = (rmsnorm(x) * output_norm) Wout^T                     Wout = output.weight, else token_embd (tied)

RoPE layout. HF llama applies rotate_half (pairs x[i], x[i+HS/2]); llama.cpp's convert_hf_to_gguf.py permutes
the rows of HF's q/k weights so that GGUF llama files use the "normal" layout instead: adjacent pairs
(x[2i], x[2i+1]) rotated by theta_i = pos * base^(-2i/n_rot). --check-rope runs both layouts on a prompt and
prints the next-token predictions and the corpus perplexity of each. On SmolLM2 Q4_1 the adjacent-pair layout
gives a perplexity of 44.9 on the first 256 tokens of tinyshakespeare, the NeoX layout 264.6 (both still put
" Paris" first after "The capital of France is": position information matters less for that one token).

Fixtures written next to this script (regenerate after `bash tests/ref/fetch_models.sh`):

  python3 -m venv /tmp/refvenv && /tmp/refvenv/bin/pip install gguf numpy tokenizers
  /tmp/refvenv/bin/python tests/ref/llama_ref.py            # writes the fixtures (about a minute)
  /tmp/refvenv/bin/python tests/ref/llama_ref.py --check-rope
  /tmp/refvenv/bin/python tests/ref/llama_ref.py --error-model   # what test_smollm.c's bounds rest on

  smollm2_golden.txt     line-oriented text, documented in its header: provenance (model sha256, gguf/numpy/
                         tokenizers versions), for each prompt its text (hex), its token ids, a greedy
                         continuation by this reference up to 32 positions, and per position the top-5 ids and
                         logits and the RMS of all V logits; the perplexity of the first 256 tokens of
                         tinyshakespeare in one window, with those token ids.
  smollm2_logits_f16.bin all V logits (float16, little-endian) at the last position of prompt 0, for a
                         full-vocabulary error measure.
"""
import argparse
import hashlib
import os
import sys

import numpy as np

from gguf import GGUFReader
from gguf.quants import dequantize

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_MODEL = os.path.join(os.environ.get("KILN_CACHE", os.path.expanduser("~/.cache/kiln")),
                             "smollm2-135m-instruct-q4_1.gguf")
DEFAULT_CORPUS = os.path.join(HERE, "..", "..", "..", "shared", "data", "corpora", "english", "tinyshakespeare.txt")

# Prompts: plain text, code, and the model's chat template (parsed with special tokens).
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
]
N_POS = 32          # positions per prompt: the prompt, then the reference's own greedy continuation
TOP_K = 5
PPL_TOKENS = 256    # one window, scored on its 255 next-token predictions
PPL_PREFIX_BYTES = 2048  # the corpus prefix that is tokenized; its first PPL_TOKENS ids are the window
FULL_LOGITS_PROMPT = 0


# ---------------------------------------------------------------- model

class Llama:
    def __init__(self, path):
        r = GGUFReader(path)
        self.path = path

        def kv(key):
            return r.fields[key].contents()

        arch = kv("general.architecture")
        if arch != "llama":
            raise SystemExit(f"{path}: general.architecture is {arch!r}, not 'llama'")
        self.L = int(kv("llama.block_count"))
        self.C = int(kv("llama.embedding_length"))
        self.NH = int(kv("llama.attention.head_count"))
        self.NKV = int(kv("llama.attention.head_count_kv"))
        self.HS = self.C // self.NH
        self.eps = float(kv("llama.attention.layer_norm_rms_epsilon"))
        self.rope_base = float(kv("llama.rope.freq_base")) if "llama.rope.freq_base" in r.fields else 10000.0
        self.n_rot = int(kv("llama.rope.dimension_count")) if "llama.rope.dimension_count" in r.fields else self.HS
        self.vocab = [str(t) for t in kv("tokenizer.ggml.tokens")]
        self.merges = [str(m) for m in kv("tokenizer.ggml.merges")]
        self.token_type = [int(t) for t in kv("tokenizer.ggml.token_type")]
        self.pre = kv("tokenizer.ggml.pre")
        # Every weight dequantized once to float64, stored as GGUF rows: a (out, in) matrix for y = x W^T.
        self.w = {}
        for t in r.tensors:
            a = dequantize(t.data, t.tensor_type).astype(np.float64)
            shape = tuple(int(d) for d in reversed(t.shape))  # GGUF ne is innermost first
            self.w[t.name] = a.reshape(shape)
        self.V = self.w["token_embd.weight"].shape[0]
        self.out = self.w.get("output.weight", self.w["token_embd.weight"])

    def rmsnorm(self, x, g):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * g

    def rope(self, x, pos, neox):
        """x (T, n_heads, HS) rotated in place over its first n_rot dims; pos (T,)."""
        half = self.n_rot // 2
        theta = pos[:, None] * self.rope_base ** (-2.0 * np.arange(half) / self.n_rot)  # (T, half)
        cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
        if neox:
            i0, i1 = np.arange(half), np.arange(half) + half
        else:  # llama.cpp's normal layout: adjacent pairs
            i0, i1 = 2 * np.arange(half), 2 * np.arange(half) + 1
        x0, x1 = x[..., i0].copy(), x[..., i1].copy()
        x[..., i0] = x0 * cos - x1 * sin
        x[..., i1] = x0 * sin + x1 * cos
        return x

    def forward(self, ids, neox=False, emulate=False):
        """All T x V logits of the sequence ids, from position 0. emulate: round the input of every matmul to
        8 bits and K, V to f16, as a quantized engine does (see error_model)."""
        act = q8_roundtrip if emulate else (lambda a: a)
        kv = f16_roundtrip if emulate else (lambda a: a)
        ids = np.asarray(ids, dtype=np.int64)
        T, NH, NKV, HS = len(ids), self.NH, self.NKV, self.HS
        pos = np.arange(T, dtype=np.float64)
        mask = np.triu(np.full((T, T), -np.inf), k=1)
        x = self.w["token_embd.weight"][ids].copy()
        for l in range(self.L):
            w = lambda n: self.w[f"blk.{l}.{n}.weight"]  # noqa: E731
            h = act(self.rmsnorm(x, w("attn_norm")))
            q = self.rope((h @ w("attn_q").T).reshape(T, NH, HS), pos, neox)
            k = kv(self.rope((h @ w("attn_k").T).reshape(T, NKV, HS), pos, neox))
            v = kv((h @ w("attn_v").T).reshape(T, NKV, HS))
            g = np.arange(NH) // (NH // NKV)                            # KV head of each query head
            s = np.einsum("thd,uhd->htu", q, k[:, g]) / np.sqrt(HS) + mask  # (NH, T, T)
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            p = s / s.sum(axis=-1, keepdims=True)
            a = np.einsum("htu,uhd->thd", p, v[:, g]).reshape(T, NH * HS)
            x = x + act(a) @ w("attn_output").T
            h = act(self.rmsnorm(x, w("ffn_norm")))
            gate = h @ w("ffn_gate").T
            x = x + act((gate / (1.0 + np.exp(-gate))) * (h @ w("ffn_up").T)) @ w("ffn_down").T
        return act(self.rmsnorm(x, self.w["output_norm.weight"])) @ self.out.T


def q8_roundtrip(x):
    """x (T, n) through ggml's Q8_0/Q8_1 activation blocks: 32 values, d = max|x|/127 stored as f16,
    q = round(x/d) half away from zero, in float32 as ggml's quantize_row_q8_*_ref. (Q8_1's f16 block sum s
    is not modelled: its rounding is far below the 8-bit error.)"""
    xs = x.astype(np.float32).reshape(x.shape[0], -1, 32)
    d = np.abs(xs).max(axis=-1, keepdims=True) / np.float32(127)
    inv = np.where(d > 0, np.float32(1) / np.where(d > 0, d, 1), 0).astype(np.float32)
    v = xs * inv
    q = np.sign(v) * np.floor(np.abs(v) + 0.5)
    return (q * d.astype(np.float16).astype(np.float64)).reshape(x.shape)


def f16_roundtrip(x):
    return x.astype(np.float16).astype(np.float64)


# ---------------------------------------------------------------- tokenizer

def hf_tokenizer(m):
    """HF tokenizers' byte-level BPE from the GGUF vocabulary and merges. The pre-tokenizer is that of
    SmolLM2's tokenizer.json (llama.cpp's "smollm": single digits, then GPT-2's regex); control tokens
    (<|im_start|> etc.) are added as special tokens so they are matched in the text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    if m.pre != "smollm":
        raise SystemExit(f"tokenizer.ggml.pre is {m.pre!r}: only 'smollm' is set up here")
    vocab = {t: i for i, t in enumerate(m.vocab)}
    merges = [tuple(s.split(" ", 1)) for s in m.merges]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([t for t, ty in zip(m.vocab, m.token_type) if ty == 3])
    return tok


def encode(tok, text):
    return tok.encode(text, add_special_tokens=False).ids


# ---------------------------------------------------------------- fixtures

def log_softmax(z):
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def perplexity(m, ids, neox=False):
    lp = log_softmax(m.forward(ids, neox))
    nll = -lp[np.arange(len(ids) - 1), ids[1:]]
    return float(np.exp(nll.mean()))


def greedy_extend(m, ids, n):
    ids = list(ids)
    while len(ids) < n:
        ids.append(int(np.argmax(m.forward(ids)[-1])))
    return ids


def corpus_ids(tok, corpus):
    with open(corpus, "rb") as f:
        text = f.read(PPL_PREFIX_BYTES).decode("utf-8")
    ids = encode(tok, text)
    assert len(ids) >= PPL_TOKENS, f"{PPL_PREFIX_BYTES} bytes of {corpus} give only {len(ids)} tokens"
    return ids[:PPL_TOKENS]


def write_fixtures(m, tok, corpus):
    import tokenizers
    with open(m.path, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    lines = [
        "# smollm2_golden.txt: golden logits of SmolLM2-135M-Instruct Q4_1 from tests/ref/llama_ref.py (float64 numpy",
        "# forward; weights dequantized by the gguf package; ids from HF tokenizers). Read by tests/test_smollm.c.",
        "# Lines: key value...; per prompt: 'prompt HEX' (UTF-8 text, encoded with parse_special, no BOS),",
        "# 'prompt_ids N id...', 'ids N id...' (the prompt then the reference's greedy continuation), then one line per",
        "# position 'pos P RMS id1 logit1 ... id5 logit5' (RMS of all V logits; top-5 by logit, descending).",
        "# 'ppl N BYTES PPL' with 'ppl_ids N id...': the first N tokens of the first BYTES bytes of CORPUS, one window",
        "# from position 0, perplexity over its N-1 next-token predictions.",
        "format kiln-golden-1",
        f"model {os.path.basename(m.path)}",
        f"model_sha256 {sha}",
        f"gguf_version {pkg_version('gguf')}",
        f"numpy_version {np.__version__}",
        f"tokenizers_version {tokenizers.__version__}",
        f"n_vocab {m.V}",
        f"top_k {TOP_K}",
    ]
    for pi, text in enumerate(PROMPTS):
        pids = encode(tok, text)
        ids = greedy_extend(m, pids, N_POS)
        logits = m.forward(ids)
        lines.append(f"prompt {text.encode('utf-8').hex()}")
        lines.append(f"prompt_ids {len(pids)} " + " ".join(map(str, pids)))
        lines.append(f"ids {len(ids)} " + " ".join(map(str, ids)))
        for p in range(len(ids)):
            z = logits[p]
            top = np.argsort(-z, kind="stable")[:TOP_K]
            rms = np.sqrt(np.mean(z * z))
            lines.append(f"pos {p} {rms:.7g} " + " ".join(f"{int(i)} {np.float32(z[i]):.7g}" for i in top))
        print(f"prompt {pi}: {text!r} -> {tok.decode(ids[len(pids):])!r}", file=sys.stderr)
        if pi == FULL_LOGITS_PROMPT:
            logits[-1].astype("<f2").tofile(os.path.join(HERE, "smollm2_logits_f16.bin"))
            lines.append(f"full_logits smollm2_logits_f16.bin {pi} {len(ids) - 1}")
    cids = corpus_ids(tok, corpus)
    ppl = perplexity(m, cids)
    print(f"perplexity of the first {PPL_TOKENS} tokens of {os.path.basename(corpus)}: {ppl:.6f}", file=sys.stderr)
    lines.append(f"ppl_corpus corpora/english/{os.path.basename(corpus)}")
    lines.append(f"ppl {PPL_TOKENS} {PPL_PREFIX_BYTES} {ppl:.9g}")
    lines.append(f"ppl_ids {len(cids)} " + " ".join(map(str, cids)))
    with open(os.path.join(HERE, "smollm2_golden.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


def pkg_version(name):
    from importlib.metadata import version
    return version(name)


def check_rope(m, tok, corpus):
    for neox in (False, True):
        ids = encode(tok, PROMPTS[0])
        z = m.forward(ids, neox)[-1]
        top = np.argsort(-z)[:5]
        print(f"{'neox' if neox else 'adjacent pairs'}: {PROMPTS[0]!r} -> "
              + ", ".join(f"{tok.decode([int(i)])!r} {z[i]:.2f}" for i in top)
              + f"; perplexity {perplexity(m, corpus_ids(tok, corpus), neox):.2f}")


def read_golden():
    g = {"prompts": [], "pos": []}
    with open(os.path.join(HERE, "smollm2_golden.txt")) as f:
        for line in f:
            w = line.split()
            if not w or w[0].startswith("#"):
                continue
            if w[0] == "ids":
                g["prompts"].append([int(x) for x in w[2:]])
            elif w[0] == "pos":
                g["pos"].append((float(w[2]), [int(x) for x in w[3::2]], np.array([float(x) for x in w[4::2]])))
            elif w[0] == "ppl_ids":
                g["ppl_ids"] = [int(x) for x in w[2:]]
            elif w[0] == "ppl":
                g["ppl"] = float(w[3])
            elif w[0] == "full_logits":
                g["full"] = (w[1], int(w[2]), int(w[3]))
    return g


def error_model(m):
    """What an engine that quantizes activations should score on tests/test_smollm.c's measures: this
    forward with emulate=True (8-bit activations, f16 K/V) against the fixtures, and, as what a bug looks
    like, the exact forward with the NeoX RoPE layout."""
    g = read_golden()
    full = np.fromfile(os.path.join(HERE, g["full"][0]), dtype="<f2").astype(np.float64)
    for name, kw in (("8-bit activations + f16 KV", {"emulate": True}), ("NeoX RoPE (a bug)", {"neox": True})):
        se = ss = rms_max = margin_max = 0.0
        flips = []
        it = iter(g["pos"])
        for pi, ids in enumerate(g["prompts"]):
            z = m.forward(ids, **kw)
            for t in range(len(ids)):
                rms, top, lg = next(it)
                se += np.sum((z[t, top] - lg) ** 2)
                ss += rms * rms * len(top)
                rms_max = max(rms_max, abs(np.sqrt(np.mean(z[t] ** 2)) - rms) / rms)
                margin_max = max(margin_max, abs((z[t, top[0]] - z[t, top[1]]) - (lg[0] - lg[1])))
                if np.argmax(z[t]) != top[0]:
                    flips.append(f"{pi}:{t} (margin {lg[0] - lg[1]:.3f})")
            if pi == g["full"][1]:
                full_err = np.linalg.norm(z[g["full"][2]] - full) / np.linalg.norm(full)
        ids = g["ppl_ids"]
        lp = log_softmax(m.forward(ids, **kw))
        ppl = float(np.exp(-lp[np.arange(len(ids) - 1), ids[1:]].mean()))
        print(f"{name}: top-5 error {np.sqrt(se / ss):.4f}, max RMS error {rms_max:.4f}, full-logit error "
              f"{full_err:.4f}, max top1-top2 margin change {margin_max:.3f}, perplexity {ppl:.4f} "
              f"({100 * (ppl / g['ppl'] - 1):+.2f}%), top-1 differs at {len(flips)}: {', '.join(flips[:8])}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--corpus", default=os.environ.get("KILN_DATA") and
                    os.path.join(os.environ["KILN_DATA"], "corpora", "english", "tinyshakespeare.txt") or DEFAULT_CORPUS)
    ap.add_argument("--check-rope", action="store_true", help="compare the two RoPE layouts instead of writing fixtures")
    ap.add_argument("--error-model", action="store_true",
                    help="score an 8-bit-activation forward and a NeoX-RoPE forward against the fixtures")
    a = ap.parse_args()
    if not os.path.exists(a.model):
        raise SystemExit(f"{a.model} not found: run `bash tests/ref/fetch_models.sh` first")
    m = Llama(a.model)
    tok = hf_tokenizer(m)
    if a.check_rope:
        check_rope(m, tok, a.corpus)
    elif a.error_model:
        error_model(m)
    else:
        write_fixtures(m, tok, a.corpus)


if __name__ == "__main__":
    main()
