#!/usr/bin/env python3
"""bench_cpu_peers.py: kiln's CPU inference beside llama.cpp's and ik_llama.cpp's llama-bench, interleaved.

Not part of CI (it needs both peers built and minutes of quiet CPU). Run from the repository root:

    python3 bench/bench_cpu_peers.py --kiln build/kiln --peer llama.cpp=/tmp/lcpp/build/bin/llama-bench \\
        --peer ik=/tmp/ik/build/bin/llama-bench --peer "ik -rtr=/tmp/ik/build/bin/llama-bench -rtr 1" -t 1,2 -r 3

Each --peer is NAME=COMMAND: a llama-bench binary and any extra flags of its own (ik_llama.cpp's -rtr 1 repacks
the weights at load, as kiln always does). Build them from source, native, CPU only, for example:

    cmake -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF && cmake --build build -j --target llama-bench

(llama.cpp: the sources in the llama-cpp-python sdist on PyPI, vendor/llama.cpp; ik_llama.cpp: github.com/ikawrakow/ik_llama.cpp.)

Cases: pp128, pp512 and tg64 (-p and -n), as llama-bench defines them: prefill of P tokens from an empty cache,
and N single-token decodes; tok/s. Every engine runs each (model, threads) with one repetition per process, and the
engines take turns: kiln, peer 1, peer 2, kiln, ... for -r rounds, so a slow phase of the VM hits all of them.
Reported: the median over rounds and the spread (min-max), and kiln's median over each peer's median.

The machine must be quiet: around each run the driver reads /proc/stat and its children's CPU time (as
bench_llama.py does); a run during which other processes (or the hypervisor's steal) kept more than --busy of a
core busy (default 0.1) is run again after --retry-wait seconds, up to --retries times, then the whole script
refuses to report (exit 3) rather than print a figure it cannot trust.

Default models: ~/.cache/kiln/{smollm2-135m-instruct-q4_1, gemma3-270m-q4_k_m, qwen2.5-coder-0.5b-instruct-q4_k_m}.gguf
(tests/ref/fetch_models.sh) and 124m synthetics in Q4_K_M, Q8_0, Q2_K and Q3_K_M (kiln synth, in /tmp/kiln-bench).
Output: one JSON object per (model, threads, case) on stdout, then a table.
"""
import argparse
import json
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_llama import cpu_busy_s, own_cpu_s, default_models  # noqa: E402

CACHE = Path.home() / ".cache/kiln"
# The 124m synthetics: the two common mixes, and the 2- and 3-bit ones (llama-quantize's Q2_K and Q3_K_M: Q2_K and
# Q3_K rows, with Q4_K and Q6_K where llama-quantize keeps more bits).
SYNTH_TYPES = ("q4_k_m", "q8_0", "q2_k", "q3_k_m")
REAL = ["smollm2-135m-instruct-q4_1.gguf", "gemma3-270m-q4_k_m.gguf", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"]


def timed(cmd):
    """Runs cmd; returns (stdout, cores other processes kept busy meanwhile)."""
    b0, o0, w0 = cpu_busy_s(), own_cpu_s(), time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    others = max(0.0, (cpu_busy_s() - b0) - (own_cpu_s() - o0)) / (time.perf_counter() - w0)
    if p.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)} exited {p.returncode}: {p.stderr.strip()[-1500:]}")
    return p.stdout, others


def run_kiln(a, model, t):
    cmd = [a.kiln, "bench", "-m", str(model), "-t", str(t), "-p", ",".join(map(str, a.p)), "-n", str(a.n), "-r", "1",
           "--json-only"]
    out, busy = timed(cmd)
    recs = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
    return {r["test"]: r["best_tps"] for r in recs}, busy


def run_peer(cmd, model, t, a):
    argv = shlex.split(cmd) + ["-m", str(model), "-t", str(t), "-p", ",".join(map(str, a.p)), "-n", str(a.n), "-r", "1",
                               "-o", "json"]
    out, busy = timed(argv)
    res = {}
    for r in json.loads(out[out.index("["):]):
        name = f"pp{r['n_prompt']}" if r["n_gen"] == 0 else f"tg{r['n_gen']}"
        res[name] = r["avg_ts"]
    return res, busy


def quiet(fn, a, what):
    for attempt in range(a.retries + 1):
        res, busy = fn()
        if busy <= a.busy:
            return res, busy
        print(f"# {what}: other processes kept {busy:.2f} cores busy; again in {a.retry_wait} s", file=sys.stderr)
        time.sleep(a.retry_wait)
    sys.exit(f"bench_cpu_peers.py: {what}: the machine stayed busy ({busy:.2f} cores besides the benchmark, limit "
             f"{a.busy}); refusing to report")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kiln", default="build/kiln")
    ap.add_argument("--peer", action="append", default=[], help="NAME=COMMAND (a llama-bench and its own flags)")
    ap.add_argument("--models", help="comma-separated GGUF paths (default: the real models and the 124m synthetics)")
    ap.add_argument("--data", default=str(Path(__file__).resolve().parent.parent.parent / "shared/data"))
    ap.add_argument("-t", default="1,2")
    ap.add_argument("-p", default="128,512")
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("-r", type=int, default=3)
    ap.add_argument("--busy", type=float, default=0.1)
    ap.add_argument("--retries", type=int, default=5)
    ap.add_argument("--retry-wait", type=float, default=10.0)
    a = ap.parse_args()
    a.p = [int(x) for x in a.p.split(",") if int(x) > 0]
    peers = []
    for spec in a.peer:
        name, _, cmd = spec.partition("=")
        if not cmd:
            sys.exit(f"bench_cpu_peers.py: --peer {spec!r}: want NAME=COMMAND")
        peers.append((name, cmd))
    if a.models:
        models = [Path(m) for m in a.models.split(",")]
    else:
        models = [CACHE / m for m in REAL if (CACHE / m).exists()]
        synth, notes = default_models(a.kiln, Path(a.data) / "vocab/ggml-vocab-llama-spm.gguf", SYNTH_TYPES)
        models += [Path(m) for m in synth if Path(m) not in models]
        for n in notes:
            print("#", n, file=sys.stderr)
    cases = [f"pp{p}" for p in a.p] + ([f"tg{a.n}"] if a.n else [])
    rows = []
    for model in models:
        for t in (int(x) for x in a.t.split(",")):
            got = {"kiln": {c: [] for c in cases}}
            for name, _ in peers:
                got[name] = {c: [] for c in cases}
            for rnd in range(a.r):
                res, _ = quiet(lambda: run_kiln(a, model, t), a, f"kiln {model.name} t={t}")
                for c in cases:
                    got["kiln"][c].append(res.get(c))
                for name, cmd in peers:
                    try:
                        res, _ = quiet(lambda: run_peer(cmd, model, t, a), a, f"{name} {model.name} t={t}")
                    except RuntimeError as e:  # a peer that cannot load this model (llama.cpp without gemma3)
                        print(f"# {name} {model.name}: {str(e).splitlines()[-1][:300]}", file=sys.stderr)
                        res = {}
                    for c in cases:
                        got[name][c].append(res.get(c))
            for c in cases:
                rec = {"bench": "cpu_peers", "model": model.name, "threads": t, "test": c, "rounds": a.r}
                for eng, by in got.items():
                    v = [x for x in by[c] if x is not None]
                    rec[eng] = {"median_tps": round(statistics.median(v), 2), "min_tps": round(min(v), 2),
                                "max_tps": round(max(v), 2)} if v else None
                for name, _ in peers:
                    if rec["kiln"] and rec[name]:
                        rec[f"ratio_vs_{name}"] = round(rec["kiln"]["median_tps"] / rec[name]["median_tps"], 3)
                print(json.dumps(rec), flush=True)
                rows.append(rec)
    names = ["kiln"] + [n for n, _ in peers]
    head = f"{'model':42} {'test':6} {'t':>2} " + " ".join(f"{n + ' tok/s (min-max)':>28}" for n in names) + \
        "".join(f" {'vs ' + n:>12}" for n in names[1:])
    print("\n" + head)
    for r in rows:
        cells = []
        for n in names:
            e = r[n]
            cells.append(f"{e['median_tps']:>9.1f} ({e['min_tps']:.1f}-{e['max_tps']:.1f})".rjust(28) if e else f"{'-':>28}")
        ratios = "".join(f" {(str(r[f'ratio_vs_{n}']) + 'x') if f'ratio_vs_{n}' in r else '-':>12}" for n in names[1:])
        print(f"{r['model'][:42]:42} {r['test']:6} {r['threads']:>2} " + " ".join(cells) + ratios)


if __name__ == "__main__":
    main()
