#!/usr/bin/env bash
# gen_quantize_mix_ref.sh: writes tests/ref/quantize_mix_ref.txt, llama-quantize's choice of type for every tensor
# and the size of the file it writes, for each mix kiln quantize offers, from the models that
# tests/ref/fetch_models.sh puts in KILN_CACHE (default ~/.cache/kiln). tests/test_quantize.c holds kiln's plan of
# the same sources to it: the same type for every tensor, the file size within 1%.
#
#   LLAMA_QUANTIZE=/tmp/llamacpp-build/bin/llama-quantize tests/ref/gen_quantize_mix_ref.sh > tests/ref/quantize_mix_ref.txt
# With DRY_RUN=1 it runs llama-quantize --dry-run (no file written: the types from its log, the tensor data's size);
# MODELS="a.gguf b.gguf" picks the sources.
#
# llama-quantize is built CPU-only from the llama.cpp that llama-cpp-python 0.3.36 vendors (ggml-org/llama.cpp@0c1e57098):
#   cmake -S vendor/llama.cpp -B /tmp/llamacpp-build -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
#     -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DLLAMA_CURL=OFF -DGGML_OPENMP=OFF -DCMAKE_BUILD_TYPE=Release
#   cmake --build /tmp/llamacpp-build -j2 --target llama-quantize
# Reading the files needs the PyPI gguf package.
set -euo pipefail

quantize=${LLAMA_QUANTIZE:-/tmp/llamacpp-build/bin/llama-quantize}
cache=${KILN_CACHE:-$HOME/.cache/kiln}
models=${MODELS:-"smollm2-135m-instruct-q4_1.gguf qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"}
# kiln's names (lower case) and llama-quantize's, in the same order
mixes="f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q2_k q3_k_s q3_k_m q3_k_l q4_k_s q4_k_m q5_k_s q5_k_m q6_k iq4_nl iq4_xs"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

cat <<EOF
# quantize_mix_ref.txt: llama-quantize's type for every tensor, and the size of the file it wrote, for each mix of
# kiln quantize. Made by tests/ref/gen_quantize_mix_ref.sh with llama-quantize of ggml-org/llama.cpp@0c1e57098 (the
# llama.cpp that llama-cpp-python 0.3.36 vendors), built CPU-only, no importance matrix:
#   llama-quantize --allow-requantize IN OUT MIX 2
# The sources are requantized: llama-quantize dequantizes each tensor to f32 first, as kiln does.
#
# model NAME BYTES             a source file in KILN_CACHE (tests/ref/fetch_models.sh) and its size
# mix NAME BYTES               the mix (kiln's name) and the size of llama-quantize's file
# mixdata NAME MIB             the same from llama-quantize --dry-run (DRY_RUN=1): the size of the tensor data it
#                              reports (MiB, 2 decimals), for sources too large to quantize 38 times here
# TENSOR TYPE                  a tensor outside the layers
# blk.*.SUFFIX TYPE*N ...      blk.0.SUFFIX, blk.1.SUFFIX, ... in order: N layers of TYPE, and so on
EOF
for model in $models; do
  in=$cache/$model
  [ -f "$in" ] || { echo "gen_quantize_mix_ref: $in missing (tests/ref/fetch_models.sh fetches it)" >&2; exit 1; }
  echo "model $model $(stat -c %s "$in")"
  for mix in $mixes; do
    if [ "${DRY_RUN:-}" ]; then
      # llama-quantize --dry-run: the types from its log, the size of the tensor data it reports (MiB, 2 decimals)
      "$quantize" --dry-run --allow-requantize "$in" "$tmp/none.gguf" "$(echo "$mix" | tr a-z A-Z)" 2 >"$tmp/log" 2>&1 ||
        { tail -n 5 "$tmp/log" >&2; exit 1; }
      python3 - "$mix" "$tmp/log" <<'PY'
import collections, re, sys
mix, log = sys.argv[1], open(sys.argv[2]).read()
size = re.search(r"quant size\s*=\s*([0-9.]+) MiB", log).group(1)
print(f"mixdata {mix} {size}")
layers = collections.defaultdict(dict)
for m in re.finditer(r"^\[\s*\d+/\s*\d+\]\s+(\S+)\s+-\s+\[[^]]*\], type =\s*(\S+), size =[^\n]*?(?:\((\S+)\))?$", log, re.M):
    name, cur, new = m.group(1), m.group(2), m.group(3) or m.group(2)
    b = re.match(r"blk\.(\d+)\.(.*)$", name)
    if b:
        layers[b.group(2)][int(b.group(1))] = new
    else:
        print(name, new)
for suffix in sorted(layers):
    by_layer = layers[suffix]
    assert sorted(by_layer) == list(range(len(by_layer))), f"blk.*.{suffix} is not in every layer"
    runs = []
    for i in range(len(by_layer)):
        if runs and runs[-1][0] == by_layer[i]:
            runs[-1][1] += 1
        else:
            runs.append([by_layer[i], 1])
    print(f"blk.*.{suffix}", " ".join(f"{t}*{n}" for t, n in runs))
PY
      continue
    fi
    out=$tmp/out.gguf
    "$quantize" --allow-requantize "$in" "$out" "$(echo "$mix" | tr a-z A-Z)" 2 >"$tmp/log" 2>&1 ||
      { tail -n 5 "$tmp/log" >&2; exit 1; }
    echo "mix $mix $(stat -c %s "$out")"
    python3 - "$out" <<'PY'
import collections, re, sys
from gguf import GGUFReader

def kiln_name(t):  # GGML's "Q4_K" is kiln's "q4_K"; "IQ4_XS", "BF16" are "iq4_xs", "bf16"
    n = t.lower()
    return n[:-2] + "_K" if n.endswith("_k") and not n.startswith("iq") else n

layers = collections.defaultdict(dict)
for t in GGUFReader(sys.argv[1]).tensors:
    m = re.match(r"blk\.(\d+)\.(.*)$", t.name)
    if m:
        layers[m.group(2)][int(m.group(1))] = kiln_name(t.tensor_type.name)
    else:
        print(t.name, kiln_name(t.tensor_type.name))
for suffix in sorted(layers):
    by_layer = layers[suffix]
    assert sorted(by_layer) == list(range(len(by_layer))), f"blk.*.{suffix} is not in every layer"
    runs = []
    for i in range(len(by_layer)):
        if runs and runs[-1][0] == by_layer[i]:
            runs[-1][1] += 1
        else:
            runs.append([by_layer[i], 1])
    print(f"blk.*.{suffix}", " ".join(f"{t}*{n}" for t, n in runs))
PY
    rm -f "$out"
  done
done
