#!/usr/bin/env python3
"""gemma_ref.py: an independent float64 numpy forward pass of a gemma3-architecture GGUF (Gemma 3 270M), and the
golden fixtures that tests/test_gemma3.c checks kiln's forward against.

It shares no code with kiln: weights are read and dequantized by the PyPI `gguf` package (llama.cpp's gguf-py:
GGUFReader + gguf.quants.dequantize), token ids come from the HF `tokenizers` library (Rust) built from the GGUF's
own vocabulary and scores (see hf_tokenizer), and the forward below follows llama.cpp's gemma3 graph
(src/models/gemma3.cpp, hparams in src/llama-model.cpp) in float64 throughout:

  x = token_embd[ids] * sqrt(C)                                  (T, C)  embedding scale, tokens only
  per layer l:
    h = rmsnorm(x) * attn_norm                                   eps = gemma3.attention.layer_norm_rms_epsilon
    q, k, v = h Wq^T, h Wk^T, h Wv^T                             (T, NH*HS), (T, NKV*HS), (T, NKV*HS)
    q, k = rmsnorm(q_h) * attn_q_norm, rmsnorm(k_h) * attn_k_norm  per head, over HS
    q, k = rope(q), rope(k)                                      NeoX layout (pairs i, i+HS/2); base below
    a_h = softmax((q_h / sqrt(HS)) k_g^T + mask) v_g             g = h // (NH/NKV); mask below
    x = x + rmsnorm(concat(a_h) Wo^T) * post_attention_norm
    h = rmsnorm(x) * ffn_norm
    x = x + rmsnorm((gelu_tanh(h Wgate^T) * (h Wup^T)) Wdown^T) * post_ffw_norm     GeGLU
  logits = (rmsnorm(x) * output_norm) token_embd^T               tied: the file has no output.weight

Every norm multiplies by the stored weight as is: convert_hf_to_gguf.py already added the 1 of Gemma's
(1 + w) RMSNorm (post_attention_norm has entries of exactly 0.0, HF's -1). Layers alternate 5 local, 1 global
(llama.cpp set_swa_pattern(6): layer l is local when l % 6 < 5, so 5, 11, 17 are global). Local layers see keys at
distance < gemma3.attention.sliding_window (512; LLAMA_SWA_TYPE_STANDARD masks p_q - p_k >= n_swa) and rotate with
base 10000 (llama.cpp's rope_freq_base_train_swa); global layers see the whole causal prefix and rotate with
gemma3.rope.freq_base (1e6). The query scale is llama.cpp's f_attention_scale = 1/sqrt(HS) = 1/16 for every
size but 27B (HF's query_pre_attn_scalar = 256 = HS for 270M). llama.cpp's gemma3 graph softcaps the final logits
only in its non-sliding-window variant; this file uses sliding windows and has no final_logit_softcapping key, so
there is no softcap. ggml's GELU is the tanh form (its f16 table is an implementation shortcut; here it is exact).

Sanity (the pretrained 270M, not -it): "The capital of France is" continues greedily with " the capital of the
country of France. It is the largest city in France and the second largest city in Europe." (" Paris" is third
at the first step, 0.8 below " the"); the perplexity of BOS + 639 tokens of tinyshakespeare is 39.02 (SmolLM2-135M:
44.9 on 256). --check scores deliberate bugs against the fixtures (numbers in tests/test_gemma3.c). The HF ids
equal `kiln tokenize --add-special --parse-special --ids` on every prompt, the 1095-token long text, and a
mixed-script/tab/newline-run sample.

Fixtures written next to this script (regenerate after `bash tests/ref/fetch_models.sh`):

  python3 -m venv /tmp/gemmaenv && /tmp/gemmaenv/bin/pip install gguf numpy tokenizers
  /tmp/gemmaenv/bin/python tests/ref/gemma_ref.py                # writes the fixtures (a few minutes)
  /tmp/gemmaenv/bin/python tests/ref/gemma_ref.py --check       # greedy text, and bug variants scored
  /tmp/gemmaenv/bin/python tests/ref/gemma_ref.py --error-model # what test_gemma3.c's bounds rest on

  gemma3_golden.txt      line-oriented text in smollm2_golden.txt's format (kiln-golden-1), documented in its
                         header, plus a long prompt: the first LONG_TOKENS tokens (BOS + text) of tinyshakespeare,
                         whose text is embedded (hex) so that CI needs no shared data, its ids, and per-position
                         top-5 lines for positions 0..31 and LONG_FROM..end (past the 512-token sliding window),
                         and the perplexity of the whole long prompt.
  gemma3_logits_f16.bin  all V logits (float16, little-endian) at the last position of prompt 0.
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
                             "gemma3-270m-q4_k_m.gguf")
DEFAULT_CORPUS = os.path.join(HERE, "..", "..", "..", "shared", "data", "corpora", "english", "tinyshakespeare.txt")

# Prompts: plain text, code, and Gemma's turn markup (control tokens, parsed with parse_special). Each is
# encoded with BOS (add_special): Gemma is trained with <bos> at position 0 and is far off without it.
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:",
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
]
N_POS = 32          # positions per prompt: the prompt, then the reference's own greedy continuation
TOP_K = 5
LONG_TOKENS = 640   # BOS + the first 639 tokens of tinyshakespeare: 128 positions past the 512 sliding window
LONG_PREFIX_BYTES = 4096  # the corpus prefix that is tokenized (cut at a line end below)
LONG_FROM = 496     # per-position lines for 0..N_POS-1 and LONG_FROM..LONG_TOKENS-1
FULL_LOGITS_PROMPT = 0
LOCAL_ROPE_BASE = 10000.0  # llama.cpp: hparams.rope_freq_base_train_swa for LLM_ARCH_GEMMA3
SWA_PATTERN = 6            # llama.cpp: hparams.set_swa_pattern(6)


# ---------------------------------------------------------------- model

class Gemma3:
    def __init__(self, path):
        r = GGUFReader(path)
        self.path = path

        def kv(key, default=None):
            return r.fields[key].contents() if key in r.fields else default

        arch = kv("general.architecture")
        if arch != "gemma3":
            raise SystemExit(f"{path}: general.architecture is {arch!r}, not 'gemma3'")
        self.L = int(kv("gemma3.block_count"))
        self.C = int(kv("gemma3.embedding_length"))
        self.NH = int(kv("gemma3.attention.head_count"))
        self.NKV = int(kv("gemma3.attention.head_count_kv"))
        self.HS = int(kv("gemma3.attention.key_length", self.C // self.NH))
        assert int(kv("gemma3.attention.value_length", self.HS)) == self.HS
        self.eps = float(kv("gemma3.attention.layer_norm_rms_epsilon"))
        self.rope_base = float(kv("gemma3.rope.freq_base", 10000.0))
        self.n_rot = int(kv("gemma3.rope.dimension_count", self.HS))
        self.n_swa = int(kv("gemma3.attention.sliding_window"))
        if "gemma3.final_logit_softcapping" in r.fields or "gemma3.rope.scaling.type" in r.fields:
            raise SystemExit(f"{path}: softcap or RoPE scaling keys present; this reference does not model them")
        self.vocab = [str(t) for t in kv("tokenizer.ggml.tokens")]
        self.scores = [float(s) for s in kv("tokenizer.ggml.scores")]
        self.token_type = [int(t) for t in kv("tokenizer.ggml.token_type")]
        self.bos = int(kv("tokenizer.ggml.bos_token_id"))
        # Every weight dequantized once to float64, stored as GGUF rows: a (out, in) matrix for y = x W^T.
        self.w, self.wtype = {}, {}
        for t in r.tensors:
            a = dequantize(t.data, t.tensor_type).astype(np.float64)
            shape = tuple(int(d) for d in reversed(t.shape))  # GGUF ne is innermost first
            self.w[t.name] = a.reshape(shape)
            self.wtype[t.name] = t.tensor_type.name
        self.V = self.w["token_embd.weight"].shape[0]
        assert "output.weight" not in self.w, "untied output: not Gemma 3 270M"

    def is_local(self, l):
        return l % SWA_PATTERN < SWA_PATTERN - 1

    def rmsnorm(self, x, g):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * g

    def rope(self, x, pos, base, neox=True):
        """x (T, n_heads, HS) rotated in place over its first n_rot dims; pos (T,)."""
        half = self.n_rot // 2
        theta = pos[:, None] * base ** (-2.0 * np.arange(half) / self.n_rot)  # (T, half)
        cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
        if neox:  # llama.cpp LLAMA_ROPE_TYPE_NEOX for gemma3: pairs (x[i], x[i + n_rot/2])
            i0, i1 = np.arange(half), np.arange(half) + half
        else:     # the llama "normal" layout, adjacent pairs: a bug here (--check)
            i0, i1 = 2 * np.arange(half), 2 * np.arange(half) + 1
        x0, x1 = x[..., i0].copy(), x[..., i1].copy()
        x[..., i0] = x0 * cos - x1 * sin
        x[..., i1] = x0 * sin + x1 * cos
        return x

    def forward(self, ids, last_only=False, emulate=False, variant=None):
        """T x V logits of the sequence ids from position 0 (only the last row with last_only).
        emulate: round the input of every matmul to 8 bits (as the weight type's activation blocks do) and K, V
        to f16, as a quantized engine does (see error_model). variant: a deliberate bug, for --check."""
        act = q8_roundtrip if emulate else (lambda a, wname: a)
        kv = f16_roundtrip if emulate else (lambda a: a)
        ids = np.asarray(ids, dtype=np.int64)
        T, NH, NKV, HS = len(ids), self.NH, self.NKV, self.HS
        pos = np.arange(T, dtype=np.float64)
        dist = pos[:, None] - pos[None, :]                       # (T, T) query pos - key pos
        causal = np.where(dist >= 0, 0.0, -np.inf)
        window = self.n_swa + (1 if variant == "window+1" else 0)
        local = np.where((dist >= 0) & (dist < window), 0.0, -np.inf)
        x = self.w["token_embd.weight"][ids] * (1.0 if variant == "no-embd-scale" else np.sqrt(self.C))
        for l in range(self.L):
            def mm(h, n):
                name = f"blk.{l}.{n}.weight"
                return act(h, self.wtype[name]) @ self.w[name].T
            w = lambda n: self.w[f"blk.{l}.{n}.weight"]  # noqa: E731
            windowed = self.is_local(l) and variant != "no-window"
            base = LOCAL_ROPE_BASE if self.is_local(l) and variant != "one-base" else self.rope_base
            h = self.rmsnorm(x, w("attn_norm"))
            q = self.rmsnorm(mm(h, "attn_q").reshape(T, NH, HS), w("attn_q_norm"))
            k = self.rmsnorm(mm(h, "attn_k").reshape(T, NKV, HS), w("attn_k_norm"))
            v = kv(mm(h, "attn_v").reshape(T, NKV, HS))
            neox = variant != "norm-rope"
            q = self.rope(q, pos, base, neox) / np.sqrt(HS)
            k = kv(self.rope(k, pos, base, neox))
            g = np.arange(NH) // (NH // NKV)                            # KV head of each query head
            s = np.einsum("thd,uhd->htu", q, k[:, g]) + (local if windowed else causal)  # (NH, T, T)
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            p = s / s.sum(axis=-1, keepdims=True)
            a = np.einsum("htu,uhd->thd", p, v[:, g]).reshape(T, NH * HS)
            x = x + self.rmsnorm(mm(a, "attn_output"), w("post_attention_norm"))
            h = self.rmsnorm(x, w("ffn_norm"))
            gate = mm(h, "ffn_gate")
            x = x + self.rmsnorm(mm(gelu_tanh(gate) * mm(h, "ffn_up"), "ffn_down"), w("post_ffw_norm"))
        if last_only:
            x = x[-1:]
        h = self.rmsnorm(x, self.w["output_norm.weight"])
        return act(h, self.wtype["token_embd.weight"]) @ self.w["token_embd.weight"].T


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def q8_roundtrip(x, wtype):
    """x (T, n) through ggml's activation blocks for a weight of type wtype: Q8_K (256 values, float32 scale) for
    the k-quants, Q8_0/Q8_1 (32 values, f16 scale) otherwise; d = max|x|/127, q = round(x/d) half away from
    zero, in float32 as ggml's quantize_row_q8_*_ref."""
    kquant = wtype.endswith("_K")
    n = 256 if kquant else 32
    xs = x.astype(np.float32).reshape(x.shape[0], -1, n)
    d = np.abs(xs).max(axis=-1, keepdims=True) / np.float32(127)
    inv = np.where(d > 0, np.float32(1) / np.where(d > 0, d, 1), 0).astype(np.float32)
    v = xs * inv
    q = np.sign(v) * np.floor(np.abs(v) + 0.5)
    ds = d.astype(np.float64) if kquant else d.astype(np.float16).astype(np.float64)
    return (q * ds).reshape(x.shape)


def f16_roundtrip(x):
    return x.astype(np.float16).astype(np.float64)


# ---------------------------------------------------------------- tokenizer

def hf_tokenizer(m):
    """HF tokenizers' BPE from the GGUF's SentencePiece vocabulary, reproducing llama.cpp's SPM tokenizer:
    spaces become U+2581 (no prefix space: tokenizer.ggml.add_space_prefix is false), the text is not
    pre-split, and adjacent pieces merge highest score first whenever their concatenation is a token. As a BPE
    that is a merge (a, b) for every normal token a+b with a and b in the vocabulary, ranked by the score of
    a+b (scores are -rank here, all distinct), which is how HF converts SentencePiece BPE models. Characters
    outside the vocabulary fall back to <0xXX> byte tokens. Control tokens (type 3, <bos>, <start_of_turn>)
    are special tokens, matched only with parse_special; user-defined ones (type 4: "\\n", runs of newlines and
    tabs, <start_of_image>) are matched always, as llama.cpp's tokenizer_st_partition does."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers
    vocab = {t: i for i, t in enumerate(m.vocab)}
    merges = []
    for i, (t, ty) in enumerate(zip(m.vocab, m.token_type)):
        if ty != 1 or len(t) < 2:
            continue
        for k in range(1, len(t)):
            a, b = t[:k], t[k:]
            if a in vocab and b in vocab:
                merges.append((-m.scores[i], i, k, a, b))
    merges.sort()
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[(a, b) for *_, a, b in merges], unk_token="<unk>",
                               fuse_unk=False, byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_tokens([AddedToken(t, normalized=False, special=False)
                    for t, ty in zip(m.vocab, m.token_type) if ty == 4])
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True)
                            for t, ty in zip(m.vocab, m.token_type) if ty == 3])
    return tok


def encode(m, tok, text):
    """BOS then the text's ids, control tokens parsed (kiln: add_special and parse_special)."""
    return [m.bos] + tok.encode(text, add_special_tokens=False).ids


# ---------------------------------------------------------------- fixtures

def log_softmax(z):
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def perplexity_of(logits, ids):
    lp = log_softmax(logits)
    return float(np.exp(-lp[np.arange(len(ids) - 1), ids[1:]].mean()))


def greedy_extend(m, ids, n):
    ids = list(ids)
    while len(ids) < n:
        ids.append(int(np.argmax(m.forward(ids, last_only=True)[-1])))
    return ids


def long_text(corpus):
    """The first LONG_PREFIX_BYTES bytes of the corpus cut back to the last line end."""
    with open(corpus, "rb") as f:
        raw = f.read(LONG_PREFIX_BYTES)
    return raw[:raw.rindex(b"\n") + 1].decode("utf-8")


def long_ids(m, tok, text):
    ids = encode(m, tok, text)
    assert len(ids) >= LONG_TOKENS, f"{len(text)} bytes give only {len(ids)} tokens"
    return ids[:LONG_TOKENS]


def pos_line(key, p, z):
    top = np.argsort(-z, kind="stable")[:TOP_K]
    rms = np.sqrt(np.mean(z * z))
    return f"{key} {p} {rms:.7g} " + " ".join(f"{int(i)} {np.float32(z[i]):.7g}" for i in top)


def write_fixtures(m, tok, corpus):
    import tokenizers
    with open(m.path, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    lines = [
        "# gemma3_golden.txt: golden logits of Gemma 3 270M Q4_K_M from tests/ref/gemma_ref.py (float64 numpy",
        "# forward of llama.cpp's gemma3 graph; weights dequantized by the gguf package; ids from HF tokenizers).",
        "# Read by tests/test_gemma3.c. Lines: key value...; per prompt: 'prompt HEX' (UTF-8 text, encoded with",
        "# add_special (BOS) and parse_special), 'prompt_ids N id...' (BOS included), 'ids N id...' (the prompt then",
        "# the reference's greedy continuation), then one line per position 'pos P RMS id1 logit1 ... id5 logit5'",
        "# (RMS of all V logits; top-5 by logit, descending). 'long_text HEX': a prefix of tinyshakespeare (cut at a",
        "# line end), 'long_ids N id...': BOS and its first N-1 tokens, 'long_pos P RMS ...' lines as 'pos' for",
        "# positions 0..31 and 496..639 (the window of the local layers is 512), 'long_ppl N PPL': perplexity of the",
        "# long ids in one window from position 0, over its N-1 next-token predictions.",
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
        pids = encode(m, tok, text)
        ids = greedy_extend(m, pids, N_POS)
        logits = m.forward(ids)
        lines.append(f"prompt {text.encode('utf-8').hex()}")
        lines.append(f"prompt_ids {len(pids)} " + " ".join(map(str, pids)))
        lines.append(f"ids {len(ids)} " + " ".join(map(str, ids)))
        for p in range(len(ids)):
            lines.append(pos_line("pos", p, logits[p]))
        print(f"prompt {pi}: {text!r} -> {tok.decode(ids[len(pids):])!r}", file=sys.stderr)
        if pi == FULL_LOGITS_PROMPT:
            logits[-1].astype("<f2").tofile(os.path.join(HERE, "gemma3_logits_f16.bin"))
            lines.append(f"full_logits gemma3_logits_f16.bin {pi} {len(ids) - 1}")
    text = long_text(corpus)
    lids = long_ids(m, tok, text)
    logits = m.forward(lids)
    ppl = perplexity_of(logits, lids)
    print(f"perplexity of BOS + {LONG_TOKENS - 1} tokens of {os.path.basename(corpus)}: {ppl:.6f}", file=sys.stderr)
    lines.append(f"long_corpus corpora/english/{os.path.basename(corpus)}")
    lines.append(f"long_text {text.encode('utf-8').hex()}")
    lines.append(f"long_ids {len(lids)} " + " ".join(map(str, lids)))
    for p in list(range(N_POS)) + list(range(LONG_FROM, LONG_TOKENS)):
        lines.append(pos_line("long_pos", p, logits[p]))
    lines.append(f"long_ppl {LONG_TOKENS} {ppl:.9g}")
    with open(os.path.join(HERE, "gemma3_golden.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


def pkg_version(name):
    from importlib.metadata import version
    return version(name)


def read_golden():
    g = {"prompts": [], "pos": [], "long_pos": []}
    with open(os.path.join(HERE, "gemma3_golden.txt")) as f:
        for line in f:
            w = line.split()
            if not w or w[0].startswith("#"):
                continue
            if w[0] == "ids":
                g["prompts"].append([int(x) for x in w[2:]])
            elif w[0] in ("pos", "long_pos"):
                g[w[0]].append((int(w[1]), float(w[2]), [int(x) for x in w[3::2]],
                                np.array([float(x) for x in w[4::2]])))
            elif w[0] == "long_ids":
                g["long_ids"] = [int(x) for x in w[2:]]
            elif w[0] == "long_ppl":
                g["ppl"] = float(w[2])
            elif w[0] == "full_logits":
                g["full"] = (w[1], int(w[2]), int(w[3]))
    return g


def score(m, g, full, **kw):
    """tests/test_gemma3.c's measures of forward(**kw) against the fixtures."""
    se = ss = rms_max = margin_max = 0.0
    se_past = ss_past = 0.0  # the long prompt's positions past the sliding window, on their own
    flips = []
    it = iter(g["pos"])
    seqs = [(pi, ids, [next(it) for _ in ids]) for pi, ids in enumerate(g["prompts"])]
    seqs.append(("long", g["long_ids"], g["long_pos"]))
    full_err = None
    for pi, ids, rows in seqs:
        z = m.forward(ids, **kw)
        for t, rms, top, lg in rows:
            se += np.sum((z[t, top] - lg) ** 2)
            ss += rms * rms * len(top)
            if pi == "long" and t >= m.n_swa:
                se_past += np.sum((z[t, top] - lg) ** 2)
                ss_past += rms * rms * len(top)
            rms_max = max(rms_max, abs(np.sqrt(np.mean(z[t] ** 2)) - rms) / rms)
            margin_max = max(margin_max, abs((z[t, top[0]] - z[t, top[1]]) - (lg[0] - lg[1])))
            if np.argmax(z[t]) != top[0]:
                flips.append(f"{pi}:{t} (margin {lg[0] - lg[1]:.3f})")
        if pi == g["full"][1]:
            full_err = np.linalg.norm(z[g["full"][2]] - full) / np.linalg.norm(full)
        if pi == "long":
            ppl = perplexity_of(z, ids)
    return (f"top-5 error {np.sqrt(se / ss):.4f} (past the window {np.sqrt(se_past / ss_past):.4f}), max RMS error {rms_max:.4f}, full-logit error {full_err:.4f}, "
            f"max top1-top2 margin change {margin_max:.3f}, perplexity {ppl:.4f} ({100 * (ppl / g['ppl'] - 1):+.2f}%), "
            f"top-1 differs at {len(flips)}: {', '.join(flips[:8])}")


def error_model(m):
    """What an engine that quantizes activations should score on tests/test_gemma3.c's measures: this forward
    with emulate=True (8-bit activations, f16 K/V) against the fixtures."""
    g = read_golden()
    full = np.fromfile(os.path.join(HERE, g["full"][0]), dtype="<f2").astype(np.float64)
    print("8-bit activations + f16 KV: " + score(m, g, full, emulate=True))


def check(m, tok):
    """Sanity: greedy text and perplexity of this forward, then the same measures for deliberate bugs."""
    ids = encode(m, tok, PROMPTS[0])
    out = greedy_extend(m, ids, len(ids) + 16)
    print(f"{PROMPTS[0]!r} -> {tok.decode(out[len(ids):])!r}")
    g = read_golden()
    full = np.fromfile(os.path.join(HERE, g["full"][0]), dtype="<f2").astype(np.float64)
    for variant in ("norm-rope", "no-window", "window+1", "one-base", "no-embd-scale"):
        print(f"{variant}: " + score(m, g, full, variant=variant))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--corpus", default=os.environ.get("KILN_DATA") and
                    os.path.join(os.environ["KILN_DATA"], "corpora", "english", "tinyshakespeare.txt") or DEFAULT_CORPUS)
    ap.add_argument("--check", action="store_true", help="greedy text and bug variants scored against the fixtures")
    ap.add_argument("--error-model", action="store_true",
                    help="score an 8-bit-activation forward against the fixtures")
    ap.add_argument("--tokenize", metavar="TEXT", help="print the reference's ids for TEXT (BOS, parse_special)")
    a = ap.parse_args()
    if not os.path.exists(a.model):
        raise SystemExit(f"{a.model} not found: run `bash tests/ref/fetch_models.sh` first")
    m = Gemma3(a.model)
    tok = hf_tokenizer(m)
    if a.tokenize is not None:
        print(" ".join(map(str, encode(m, tok, a.tokenize))))
    elif a.check:
        check(m, tok)
    elif a.error_model:
        error_model(m)
    else:
        write_fixtures(m, tok, a.corpus)


if __name__ == "__main__":
    main()
