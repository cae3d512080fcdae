#!/usr/bin/env python3
"""check_deps.py: kiln's files form layers with no circles. Run by tests/test_deps.sh (`make test`).

Two graphs, both read from what the build really made:
  * calls: file A -> file B when A's object needs an external symbol that B's object defines (nm -u against
    nm --defined-only), over BUILD/src/*/*.o, BUILD/tools/*.o and BUILD/bench/*.o;
  * includes: file A -> header B for each #include "B" in A's source (resolved like the compiler: A's folder, then
    include/, src/, src/core/ and the repository root).
Each must be a DAG: a cycle is printed with the symbols (or includes) that close it. On top of that no edge may
go up the layers below, and tools/ may include only the public API (include/kiln.h), its own
headers and bench/bench.h. Exit status 1 on any violation, 0 otherwise.

  tools/check_deps.py [--root DIR] [--build DIR]
"""
import argparse
import os
import re
import subprocess
import sys

# The layers, lowest first. A file may depend on files of its own layer or of lower layers, never of a higher one
# (a file's layer is its folder's unless FILE_LAYERS says otherwise).
LAYERS = {
    "src/core": 0,                  # formats, types, quant reference, status: names no model or backend
    "src/tok": 1,                   # the tokenizers
    "src/model": 2,                 # the llama family: tensors, loading, quant mixes, the one forward and its seam
    "src/cpu": 3, "src/cuda": 3,    # the backends: they fill the seam (model/backend.h) with their kernels
    "src/infer": 4, "src/train": 4, # sessions, sampling, perplexity; the trainers, their loop and data
    "src/serve": 5,                 # the HTTP server: include/kiln.h only, with tools/ the only code that prints
    "tools": 5, "bench": 5,         # the CLI and the benchmarks linked into it
}
# Files whose folder is their backend but whose work is a higher layer's.
FILE_LAYERS = {
    "src/cuda/trainer.cu": 4,  # a training step on the GPU: the training model and the optimizer (train/optim.h)
}
# tools/ speaks kiln.h only; these files still include internals, each for the reason given.
TOOLS_INTERNAL_OK = {
    "tools/cmd_serve.c": "the server's options and start/stop (src/serve/serve.h), which is no part of libkiln's API",

}
INCLUDE_DIRS = ["include", "src", "src/core", "."]


def layer(path):
    if path in FILE_LAYERS:
        return FILE_LAYERS[path]
    return LAYERS.get(os.path.dirname(path))


def nm(obj, *flags):
    out = subprocess.run(["nm", *flags, obj], capture_output=True, text=True, check=True).stdout
    return [line.split()[-1] for line in out.splitlines() if line.strip()]


def call_graph(build):
    objs = []
    for top in ("src", "tools", "bench"):
        base = os.path.join(build, top)
        for dirpath, _, files in os.walk(base):
            objs += [os.path.join(dirpath, f) for f in files if f.endswith(".o")]
    node = {}  # object -> source path relative to the root
    for o in objs:
        rel = os.path.relpath(o, build)
        node[o] = rel[: -len(".cu.o")] + ".cu" if rel.endswith(".cu.o") else rel[: -len(".o")] + ".c"
    defined = {}
    for o in sorted(objs):
        for sym in nm(o, "-g", "--defined-only"):
            defined.setdefault(sym, node[o])
    edges = {}
    for o in objs:
        a = node[o]
        for sym in nm(o, "-u"):
            b = defined.get(sym)
            if b and b != a:
                edges.setdefault(a, {}).setdefault(b, sym)
        edges.setdefault(a, {})
    return edges


def include_graph(root):
    edges = {}
    for top in ("include", "src", "tools", "bench"):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for f in files:
                if not f.endswith((".c", ".h", ".cu", ".cuh")):
                    continue
                path = os.path.join(dirpath, f)
                a = os.path.relpath(path, root)
                edges.setdefault(a, {})
                with open(path, encoding="utf-8", errors="replace") as fh:
                    for line in fh:
                        m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
                        if not m:
                            continue
                        for d in [os.path.dirname(a)] + INCLUDE_DIRS:
                            cand = os.path.normpath(os.path.join(d, m.group(1)))
                            if os.path.isfile(os.path.join(root, cand)):
                                edges[a].setdefault(cand, "#include \"%s\"" % m.group(1))
                                break
    return edges


def cycles(edges):
    """Tarjan's strongly connected components of more than one node (iterative: no recursion limit)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, {}))))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges.get(w, {})))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def check(edges, what, problems):
    for comp in cycles(edges):
        inside = set(comp)
        why = ["%s -> %s (%s)" % (a, b, s) for a in comp for b, s in sorted(edges[a].items()) if b in inside]
        problems.append("%s cycle among %s:\n    %s" % (what, ", ".join(comp), "\n    ".join(why)))
    for a in sorted(edges):
        for b, s in sorted(edges[a].items()):
            la, lb = layer(a), layer(b)
            if la is not None and lb is not None and lb > la:
                problems.append("%s: %s (layer %d) -> %s (layer %d): %s" % (what, a, la, b, lb, s))


def check_tools_includes(edges, problems):
    for a in sorted(edges):
        if not a.startswith("tools/") or a in TOOLS_INTERNAL_OK:
            continue
        for b, s in sorted(edges[a].items()):
            if b != "include/kiln.h" and not b.startswith("tools/") and b != "bench/bench.h":
                problems.append("includes: %s: %s is not the public API (include/kiln.h), tools/ or bench/bench.h" % (a, s))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=".", help="the repository (sources)")
    ap.add_argument("--build", default="build", help="the build folder with the objects")
    args = ap.parse_args()
    problems = []
    calls = call_graph(args.build)
    if not calls:
        problems.append("calls: no objects under %s (build first)" % args.build)
    check(calls, "calls", problems)
    inc = include_graph(args.root)
    check(inc, "includes", problems)
    check_tools_includes(inc, problems)
    for p in problems:
        print(p)
    print("check_deps: %d files called, %d files read, %d problem(s)" % (len(calls), len(inc), len(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
