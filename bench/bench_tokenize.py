#!/usr/bin/env python3
"""bench_tokenize.py: kiln's tokenizer against HuggingFace `tokenizers`, same vocab, same text, same run.

Run from the repository root, after `make build/kiln`:

    python3 bench/bench_tokenize.py --kiln build/kiln --data ../shared/data

Needs `pip install tokenizers gguf numpy` (a venv outside the repository will do:
`python3 -m venv /tmp/tokbench && /tmp/tokbench/bin/pip install tokenizers gguf numpy`, then run the command
above with /tmp/tokbench/bin/python). transformers is not needed.

Cases:
  encode  SPM (ggml-vocab-llama-spm.gguf) and BPE (ggml-vocab-gpt-2.gguf) on english/tinyshakespeare.txt and
          turkish/tr_boun-ud-test.txt. kiln runs as `kiln bench tokenize` (a subprocess, its JSON parsed); the peer
          is a `tokenizers.Tokenizer` built here from the same GGUF file, read with gguf's GGUFReader:
            gpt2 vocab: models.BPE(vocab, merges from tokenizer.ggml.merges) + pre_tokenizers.ByteLevel(
                        add_prefix_space=False) (its default regex is GPT-2's) + decoders.ByteLevel;
            llama vocab: the Llama fast tokenizer: models.BPE(byte_fallback=True, fuse_unk=True) with merges derived
                        from the scores (as transformers' generate_merges does for SentencePiece vocabs), normalizer
                        Prepend("▁") + Replace(" ", "▁"), no pre-tokenizer, decoder Replace/ByteFallback/Fuse.
          Both encode the whole file as one string, no special tokens added or parsed, one thread. Each side
          repeats until 1 s has passed and at least 3 runs were made (--min-time, --reps); best and median kept.
          kiln's ids are compared with HF's id for id: the ratio means something only when they do the same work.
  train   kiln_bpe_train to a 4096-token vocab on turkish/manpages-tr_2.0.6-2_rendered.txt + tr_boun-ud-dev.txt
          (kiln: -t 1) against tokenizers' BpeTrainer(vocab_size=4096, min_frequency=2, specials <unk> <s> </s> <pad>,
          the 256-byte initial alphabet) on the same files, pre-tokenized as kiln does: Split(Llama-3 regex) +
          ByteLevel(add_prefix_space=False, use_regex=False); plain ByteLevel (GPT-2's regex) is timed too (JSON). The HF trainer is
          multi-threaded by default: RAYON_NUM_THREADS=1 is set before tokenizers is imported, so it runs on one.
          The two vocabs are compared (shared tokens) so a much smaller job on one side would show.

Output: one JSON object per case on stdout (kiln's and the peer's figures, the ratio), then a table.
The ratio is kiln / HF on MB/s (encode) and HF time / kiln time (train): > 1 means kiln is faster. Goal: >= 1.0x.
"""
import os

# Before tokenizers is imported: its Rayon pool reads these once. One thread for the peer, as for kiln.
os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["RAYON_RS_NUM_CPUS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

try:
    import numpy as np
    from gguf import GGUFReader
    import tokenizers
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
except ImportError as e:
    sys.exit(f"bench_tokenize.py: {e}; install the peer with: pip install tokenizers gguf numpy "
             f"(e.g. python3 -m venv /tmp/tokbench && /tmp/tokbench/bin/pip install tokenizers gguf numpy)")

REPO = Path(__file__).resolve().parent.parent
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]  # kiln_bpe_train's default specials

ENCODE_CASES = [  # (case name, vocab file, text file under corpora/)
    ("spm/tinyshakespeare", "ggml-vocab-llama-spm.gguf", "english/tinyshakespeare.txt"),
    ("bpe/tinyshakespeare", "ggml-vocab-gpt-2.gguf", "english/tinyshakespeare.txt"),
    ("spm/tr_boun-ud-test", "ggml-vocab-llama-spm.gguf", "turkish/tr_boun-ud-test.txt"),
    ("bpe/tr_boun-ud-test", "ggml-vocab-gpt-2.gguf", "turkish/tr_boun-ud-test.txt"),
]
# kiln_bpe_train's pre-tokenizer (src/tok/bpe_train.c): Llama-3's split, as HF writes it for llama-bpe vocabs
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
TRAIN_CORPUS = ["turkish/manpages-tr_2.0.6-2_rendered.txt", "turkish/tr_boun-ud-dev.txt"]


# ---------------------------------------------------------------- the peer, built from the GGUF file

def gguf_tokenizer_fields(path):
    """tokenizer.ggml.* of a GGUF file as Python values (strings decoded, arrays as lists)."""
    r = GGUFReader(str(path))
    out = {}
    for key, f in r.fields.items():
        if not key.startswith("tokenizer.ggml."):
            continue
        name = key[len("tokenizer.ggml."):]
        if f.types and f.types[0].name == "ARRAY":
            if f.types[-1].name == "STRING":
                out[name] = [bytes(f.parts[i]).decode("utf-8") for i in f.data]
            else:
                out[name] = [f.parts[i][0].item() for i in f.data]
        elif f.types and f.types[0].name == "STRING":
            out[name] = bytes(f.parts[f.data[0]]).decode("utf-8")
        else:
            out[name] = f.parts[f.data[0]][0].item()
    return out


def spm_merges(tokens, scores):
    """Merges implied by a SentencePiece vocab: every split of a token into two tokens, ranked by the merged
    token's score, best first (ties: shorter left, then shorter right piece first, as transformers'
    generate_merges(vocab, vocab_scores) orders them; within one token by the pieces' ids). llama.cpp's SPM merges
    any adjacent pair whose concatenation is a token, highest score first -- the same set, the same order."""
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = []
    for tok, score in zip(tokens, scores):
        local = []
        for k in range(1, len(tok)):
            left, right = tok[:k], tok[k:]
            if left in vocab and right in vocab:
                local.append((left, right, score))
        local.sort(key=lambda m: (vocab[m[0]], vocab[m[1]]))
        merges.extend(local)
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return vocab, [(m[0], m[1]) for m in merges]


def build_peer(vocab_path):
    """A tokenizers.Tokenizer doing what kiln does with this GGUF vocab; returns (tokenizer, family)."""
    f = gguf_tokenizer_fields(vocab_path)
    family = f.get("model")
    tokens = f["tokens"]
    if family == "gpt2":
        pre = f.get("pre", "default")
        if pre not in ("gpt-2", "default"):
            raise SystemExit(f"bench_tokenize.py: {vocab_path}: pre-tokenizer '{pre}' has no peer here (gpt-2 only)")
        vocab = {t: i for i, t in enumerate(tokens)}
        merges = [tuple(m.split(" ", 1)) for m in f["merges"]]
        tk = Tokenizer(models.BPE(vocab=vocab, merges=merges))
        tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)  # use_regex: GPT-2's split
        tk.decoder = decoders.ByteLevel()
    elif family == "llama":
        vocab, merges = spm_merges(tokens, f["scores"])
        unk = tokens[f["unknown_token_id"]] if "unknown_token_id" in f else "<unk>"
        tk = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=unk, fuse_unk=True, byte_fallback=True))
        norm = [normalizers.Replace(" ", "\u2581")]
        if f.get("add_space_prefix", True):  # llama.cpp's default for SPM vocabs
            norm.insert(0, normalizers.Prepend("\u2581"))
        tk.normalizer = normalizers.Sequence(norm)
        tk.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    else:
        raise SystemExit(f"bench_tokenize.py: {vocab_path}: tokenizer.ggml.model '{family}' has no peer here")
    # Special tokens are not added: kiln runs with parse_special = false, so "<s>" in the text is plain text.
    return tk, family


def check_vectors(tk, vocab_path):
    """The peer against llama.cpp's reference ids (NAME.gguf.inp/.out, no BOS/EOS): (matched, total)."""
    inp, out = Path(str(vocab_path) + ".inp"), Path(str(vocab_path) + ".out")
    if not inp.exists() or not out.exists():
        return None
    texts = inp.read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")
    if texts and texts[-1].endswith("\n__ggml_vocab_test__"):
        texts[-1] = texts[-1][: -len("\n__ggml_vocab_test__")]
    want = out.read_text(encoding="utf-8").split("\n")
    n = min(len(texts), len(want))
    ok = sum(tk.encode(texts[i], add_special_tokens=False).ids == [int(x) for x in want[i].split()] for i in range(n))
    return ok, n


def time_reps(fn, reps, min_time):
    """Runs fn until min_time seconds and >= 3 runs (or exactly reps); returns (sorted times, last result)."""
    times, out, start = [], None, time.perf_counter()
    while (len(times) < reps) if reps else (len(times) < 3 or time.perf_counter() - start < min_time):
        a = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - a)
    return sorted(times), out


# ---------------------------------------------------------------- kiln, as a subprocess

def run_kiln(kiln, args):
    cmd = [str(kiln), "bench", "tokenize", *map(str, args), "--json-only"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}: {p.stderr.strip()}")
    lines = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
    if len(lines) != 1:
        raise RuntimeError(f"{' '.join(cmd)}: expected one JSON line, got {len(lines)}")
    return lines[0]


def first_mismatch(a, b):
    n = min(len(a), len(b))
    if n:
        diff = np.nonzero(np.asarray(a[:n]) != np.asarray(b[:n]))[0]
        if diff.size:
            return int(diff[0])
    return None if len(a) == len(b) else n


# ---------------------------------------------------------------- cases

def encode_case(name, vocab_path, text_path, kiln, reps, min_time, tmp):
    text_bytes = text_path.read_bytes()
    text = text_bytes.decode("utf-8")  # the texts are valid UTF-8; HF takes str, kiln bytes: the same bytes
    nbytes = len(text_bytes)
    t0 = time.perf_counter()
    tk, family = build_peer(vocab_path)
    build_s = time.perf_counter() - t0
    vec = check_vectors(tk, vocab_path)
    hf_times, enc = time_reps(lambda: tk.encode(text, add_special_tokens=False), reps, min_time)
    hf_ids = enc.ids
    rec = {"bench": "tokenize", "case": "encode", "name": name, "vocab": vocab_path.name, "model": family,
           "text": text_path.name, "bytes": nbytes, "threads": 1,
           "hf": {"impl": f"tokenizers {tokenizers.__version__}", "build_s": round(build_s, 3), "reps": len(hf_times),
                  "best_s": hf_times[0], "median_s": statistics.median(hf_times),
                  "best_mbs": round(nbytes / hf_times[0] / 1e6, 3),
                  "median_mbs": round(nbytes / statistics.median(hf_times) / 1e6, 3), "tokens": len(hf_ids),
                  "reference_vectors_matched": f"{vec[0]}/{vec[1]}" if vec else None}}
    if kiln:
        ids_path = Path(tmp) / "ids.bin"
        args = ["-m", vocab_path, "--text", text_path, "--ids-out", ids_path]
        args += ["--reps", reps] if reps else ["--min-time", min_time]
        k = run_kiln(kiln, args)
        kiln_ids = np.fromfile(ids_path, dtype=np.int32)
        mis = first_mismatch(kiln_ids, hf_ids)
        rec["kiln"] = {key: k[key] for key in ("reps", "load_s", "best_s", "median_s", "best_mbs", "median_mbs",
                                               "tokens", "bytes_per_token", "ids_fnv1a")}
        rec["ids_equal"] = mis is None
        if mis is not None:
            # where in the text: HF's offsets are into the original string (characters)
            at = enc.offsets[min(mis, len(hf_ids) - 1)][0] if hf_ids else 0
            rec["first_mismatch"] = {"token_index": mis, "char_offset": at, "context": text[max(0, at - 20): at + 20],
                                     "kiln": kiln_ids[mis: mis + 8].tolist(), "hf": hf_ids[mis: mis + 8]}
        rec["ratio_best"] = round(k["best_mbs"] / rec["hf"]["best_mbs"], 3)
        rec["ratio_median"] = round(k["median_mbs"] / rec["hf"]["median_mbs"], 3)
    return rec


def train_case(files, vocab_size, kiln, tmp):
    corpus_bytes = sum(p.stat().st_size for p in files)
    rec = {"bench": "tokenize", "case": "train", "algo": "bpe", "corpus": [p.name for p in files],
           "corpus_bytes": corpus_bytes, "vocab_size": vocab_size, "min_frequency": 2}

    def hf_train(pre):
        tk = Tokenizer(models.BPE())
        tk.pre_tokenizer = pre
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=SPECIALS,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
        a = time.perf_counter()
        tk.train([str(p) for p in files], trainer)
        return time.perf_counter() - a, tk.get_vocab()

    # The peer splits as kiln_bpe_train does (Llama-3's regex, then the byte-level alphabet); GPT-2's regex
    # (ByteLevel's own) is timed as well, for reference.
    hf_s, hf_vocab = hf_train(pre_tokenizers.Sequence([
        pre_tokenizers.Split(tokenizers.Regex(LLAMA3_REGEX), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]))
    gpt2_s, _ = hf_train(pre_tokenizers.ByteLevel(add_prefix_space=False))
    rec["hf"] = {"impl": f"tokenizers {tokenizers.__version__} BpeTrainer", "threads": 1, "rayon_num_threads": 1,
                 "pre_tokenizer": "Split(llama-3 regex) + ByteLevel(use_regex=False)", "seconds": round(hf_s, 3),
                 "n_vocab_out": len(hf_vocab), "seconds_bytelevel_gpt2_regex": round(gpt2_s, 3)}
    if kiln:
        out = Path(tmp) / "kiln-bpe.gguf"
        k = run_kiln(kiln, ["--train", *files, "--vocab", vocab_size, "-t", 1, "--out", out])
        kiln_tokens = gguf_tokenizer_fields(out)["tokens"]
        shared = len(set(kiln_tokens) & set(hf_vocab))
        rec["kiln"] = {"threads": k["threads"], "seconds": round(k["best_s"], 3), "n_vocab_out": k["n_vocab_out"]}
        rec["shared_tokens"] = shared
        rec["ratio"] = round(hf_s / k["best_s"], 3)
    return rec


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kiln", type=Path, default=REPO / "build/kiln", help="the kiln binary (default build/kiln)")
    ap.add_argument("--data", type=Path, default=REPO.parent / "shared/data", help="the shared data folder")
    ap.add_argument("--reps", type=int, default=0, help="exact repetitions per encode case (default: >= 1 s, >= 3)")
    ap.add_argument("--min-time", type=float, default=1.0, help="seconds of repetitions per encode case and side")
    ap.add_argument("--peer-only", action="store_true", help="run the HuggingFace side alone (no kiln binary)")
    ap.add_argument("--no-train", action="store_true", help="leave out the training case")
    ap.add_argument("--vocab-size", type=int, default=4096, help="training case vocab size (default 4096)")
    a = ap.parse_args()

    vocab_dir, corpora = a.data / "vocab", a.data / "corpora"
    if not vocab_dir.is_dir() or not corpora.is_dir():
        sys.exit(f"bench_tokenize.py: {a.data} has no vocab/ and corpora/ folders (pass --data)")
    kiln = None if a.peer_only else a.kiln
    if kiln and not kiln.exists():
        sys.exit(f"bench_tokenize.py: {kiln} not found: `make build/kiln` first, or pass --kiln or --peer-only")

    recs = []
    with tempfile.TemporaryDirectory(prefix="kiln-tokbench-") as tmp:
        for name, vocab, text in ENCODE_CASES:
            r = encode_case(name, vocab_dir / vocab, corpora / text, kiln, a.reps, a.min_time, tmp)
            print(json.dumps(r, ensure_ascii=False), flush=True)
            recs.append(r)
        if not a.no_train:
            r = train_case([corpora / p for p in TRAIN_CORPUS], a.vocab_size, kiln, tmp)
            print(json.dumps(r, ensure_ascii=False), flush=True)
            recs.append(r)

    def f(x, fmt):
        return fmt % x if x is not None else "-"

    print(f"\nkiln bench tokenize vs HuggingFace tokenizers {tokenizers.__version__}, single thread "
          f"(RAYON_NUM_THREADS=1), same vocab, same text, same run")
    print("encode: whole text as one string, no special tokens; MB/s = 1e6 input bytes/s, best of the repetitions "
          "(median in the JSON); ratio = kiln/HF, goal >= 1.0x\n")
    print(f"{'case':<22} {'kiln MB/s':>10} {'HF MB/s':>9} {'kiln/HF':>8} {'med k/HF':>8} {'kiln tok':>9} "
          f"{'HF tok':>9} {'B/tok':>6}  ids equal")
    for r in recs:
        if r["case"] != "encode":
            continue
        k = r.get("kiln", {})
        eq = ("yes" if r["ids_equal"] else f"NO, first at token {r['first_mismatch']['token_index']}") if k else "-"
        print(f"{r['name']:<22} {f(k.get('best_mbs'), '%.2f'):>10} {r['hf']['best_mbs']:>9.2f} "
              f"{f(r.get('ratio_best'), '%.2fx'):>8} {f(r.get('ratio_median'), '%.2fx'):>8} "
              f"{f(k.get('tokens'), '%d'):>9} {r['hf']['tokens']:>9} {r['bytes'] / r['hf']['tokens']:>6.2f}  {eq}")
    for r in recs:
        if r["case"] != "train":
            continue
        k = r.get("kiln", {})
        print(f"\ntrain: byte-level BPE to {r['vocab_size']} tokens, min frequency 2, on {' + '.join(r['corpus'])} "
              f"({r['corpus_bytes'] / 1e6:.2f} MB); one thread each; ratio = HF s / kiln s")
        print(f"{'case':<22} {'kiln s':>10} {'HF s':>9} {'HF/kiln':>8} {'shared tokens':>14}")
        print(f"{'bpe-train/' + str(r['vocab_size']):<22} {f(k.get('seconds'), '%.2f'):>10} {r['hf']['seconds']:>9.2f} "
              f"{f(r.get('ratio'), '%.2fx'):>8} "
              f"{(str(r['shared_tokens']) + '/' + str(k['n_vocab_out'])) if k else '-':>14}")


if __name__ == "__main__":
    main()
