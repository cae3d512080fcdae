#!/usr/bin/env bash
# test_llamacpp_peer.sh: kiln's logits beside llama.cpp's runtime on the same GGUF and the same token ids (issue 18:
# "and llama.cpp, where it knows the architecture"). KILN_LLAMA_CPP names a llama.cpp CMake build folder (libllama
# under bin/ or src/; llama.h under its include/ or its source tree's, found from CMakeCache.txt); without it the
# test skips. tests/ref/llamacpp_logits.c is compiled here against it and the build's libkiln (KILN_BUILD) and runs
# one engine a process, on the CPU (2 threads; llama.cpp with n_ubatch 16, f16 K/V, flash attention off).
#   - The 9 architectures of tests/ref/hf_oracle.py (shrunk published configs, random weights; its folders under
#     KILN_BUILD/hf, made again with python3 when missing or older than the script), converted by `kiln convert hf`
#     to F32 and quantized by `kiln quantize` to Q4_K_M: the 80 tokens of the oracle.
#   - The real models of tests/ref/fetch_models.sh (KILN_CACHE) as they are, on a fixed prompt tokenized by llama.cpp.
# Per case: err = max |kiln - llama.cpp| / max |llama.cpp| over every position's logits within the bound below, the
# argmax equal at every input position, and the 8 greedy tokens equal (a quantized file: equal up to a step where
# llama.cpp's own top1-top2 margin is under the largest logit difference measured, where either pick is right).
# Each case also prints both engines' error against transformers (the oracle's logits.bin); tests/ref/
# llamacpp_peer.txt holds the table of a run. A file llama.cpp refuses as an unknown architecture is a skip naming it.
cd "$(dirname "$0")/.." || exit 1
root=$PWD
build=${KILN_BUILD:-build}
case $build in /*) ;; *) build=$root/$build ;; esac
kiln=${KILN_BIN:-$build/kiln}
cache=${KILN_CACHE:-$HOME/.cache/kiln}
lcpp=${KILN_LLAMA_CPP:-}
if [ -z "$lcpp" ]; then
    echo "skip llamacpp_peer: KILN_LLAMA_CPP (a llama.cpp build folder with libllama) is not set"
    exit 0
fi

# Bounds on err, kiln against llama.cpp. F32: both engines compute in float32 with an f16 cache, so only the order
# of the sums differs: measured 1.1e-4 at worst (the oracle's archs). Q4_K_M and the real quantized files: both round
# each quantized matmul's input to 8-bit blocks (Q8_K / Q8_1), but not to the same bits (kiln's AVX2 kernels and
# ggml's differ in rounding details), and that noise grows through the layers: measured 2.2e-2 at worst on the
# shrunk archs and 5.3e-2 on the real models (gemma3 270m, 18 layers). A wrong RoPE layout, a missing norm or a
# scale left out lands at 0.3 and more (tests/test_hf_oracle.c).
bound_f32=2e-3
bound_quant=0.1

libdir=
for d in "$lcpp/bin" "$lcpp/src" "$lcpp/lib" "$lcpp"; do
    if [ -e "$d/libllama.so" ]; then libdir=$d; break; fi
done
src=$lcpp
[ -f "$lcpp/CMakeCache.txt" ] && src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$lcpp/CMakeCache.txt")
inc=
for d in "$lcpp/include" "$src/include"; do
    if [ -f "$d/llama.h" ]; then inc=$d; break; fi
done
if [ -z "$libdir" ] || [ -z "$inc" ] || [ ! -f "$src/ggml/include/ggml.h" ]; then
    echo "FAIL llamacpp_peer: KILN_LLAMA_CPP=$lcpp has no libllama.so (bin/, src/, lib/) or no llama.h and ggml.h"
    exit 1
fi
# the commit llama.cpp's build recorded (common/build-info.cpp), for the table
commit=$(sed -n 's/.*LLAMA_COMMIT = "\([^"]*\)".*/\1/p' "$lcpp/common/build-info.cpp" 2>/dev/null)
work=$build/llamacpp_peer
mkdir -p "$work" || exit 1
harness=$work/llamacpp_logits
if [ -e "$build/libkiln.so" ]; then klib=("-L$build" "-Wl,-rpath,$build" -lkiln)
else klib=("$build/libkiln.a" -lpcre2-8 -lutf8proc -ljansson -lpthread -lm); fi # SAN=1 builds no shared library
san=; [ "${KILN_SAN:-0}" = 1 ] && san="-fsanitize=address,undefined -fno-omit-frame-pointer"
if ! ${CC:-cc} -std=c11 -O2 -Wall -Wextra $san -Iinclude -I"$inc" -I"$src/ggml/include" tests/ref/llamacpp_logits.c \
    -o "$harness" -L"$libdir" -Wl,-rpath,"$libdir" -lllama -lggml -lggml-base "${klib[@]}" -lm 2>"$work/cc.err"; then
    echo "FAIL llamacpp_peer: tests/ref/llamacpp_logits.c does not build: $(head -c 1500 "$work/cc.err" | tr '\n' ' ')"
    exit 1
fi
echo "  llama.cpp ${commit:-(commit unknown)} from $libdir; kiln $("$kiln" --version 2>&1 | head -1)"
table=$work/table.txt
: >"$table"

# field LINE KEY: the words after "KEY:" in the harness's output
field() { printf '%s\n' "$1" | sed -n "s/^$2: *//p"; }
# json_ids FILE KEY: a list of ints from the one-line oracle.json
json_ids() { sed -n "s/.*\"$2\": \[\([^]]*\)\].*/\1/p" "$1" | tr -d ','; }

# peer NAME MODEL BOUND QUANT ORACLE_DIR (IDS | -p TEXT): one case; ORACLE_DIR "-" for none
peer() {
    local name=$1 model=$2 bound=$3 quant=$4 odir=$5; shift 5
    local ll lk
    if ! ll=$("$harness" "$model" "$work/$name.llama.bin" "$@" 2>"$work/$name.llama.err"); then
        if grep -q "unknown model architecture" "$work/$name.llama.err"; then
            echo "skip llamacpp_peer_$name: llama.cpp does not know the architecture: $(grep -m1 'unknown model architecture' "$work/$name.llama.err")"
        else echo "FAIL llamacpp_peer_$name: llama.cpp cannot run kiln's file: $(tail -c 600 "$work/$name.llama.err" | tr '\n' ' ')"; fi
        return
    fi
    local ids; ids=$(field "$ll" tokens)
    # shellcheck disable=SC2086 # the ids are words
    if ! lk=$("$harness" --kiln "$model" "$work/$name.kiln.bin" $ids 2>"$work/$name.kiln.err"); then
        echo "FAIL llamacpp_peer_$name: kiln: $(tail -c 600 "$work/$name.kiln.err" | tr '\n' ' ')"
        return
    fi
    local T V cmp err agree abs
    T=$(echo "$ids" | wc -w)
    V=$(( $(stat -c %s "$work/$name.llama.bin") / 4 / T ))
    cmp=$("$harness" --compare "$work/$name.kiln.bin" "$work/$name.llama.bin" "$V") || { echo "FAIL llamacpp_peer_$name: compare"; return; }
    read -r _ err _ agree _ abs <<<"$cmp"
    local vs_hf="-" ll_hf="-"
    if [ "$odir" != - ]; then
        vs_hf=$("$harness" --compare "$work/$name.kiln.bin" "$odir/logits.bin" "$V" | cut -d' ' -f2)
        ll_hf=$("$harness" --compare "$work/$name.llama.bin" "$odir/logits.bin" "$V" | cut -d' ' -f2)
    fi
    # greedy: the first step where the engines differ, and llama.cpp's margin there
    local -a gl gk mg
    read -ra gl <<<"$(field "$ll" greedy)"; read -ra gk <<<"$(field "$lk" greedy)"; read -ra mg <<<"$(field "$ll" margin)"
    local k=0
    while [ $k -lt ${#gl[@]} ] && [ "${gl[$k]}" = "${gk[$k]:-}" ]; do k=$((k + 1)); done
    local greedy="$k/${#gl[@]}"
    printf '  %-22s err %s (bound %s)  argmax %s  greedy %s  | vs transformers: kiln %s, llama.cpp %s\n' \
        "$name" "$err" "$bound" "$agree" "$greedy" "$vs_hf" "$ll_hf"
    printf '%-22s %-10s %-10s %-7s %-5s %-10s %s\n' "$name" "$err" "$vs_hf" "$agree" "$greedy" "$ll_hf" "$T" >>"$table"
    if ! awk -v e="$err" -v b="$bound" 'BEGIN { exit !(e + 0 <= b + 0 && e == e + 0) }'; then
        echo "FAIL llamacpp_peer_$name: logit error $err against llama.cpp's over the bound $bound"
    elif [ "${agree%/*}" != "$T" ] && [ "$quant" = 0 ]; then
        echo "FAIL llamacpp_peer_$name: the argmax differs from llama.cpp's at $((T - ${agree%/*})) of $T positions"
    elif [ $k -lt ${#gl[@]} ] && { [ "$quant" = 0 ] || ! awk -v m="${mg[$k]}" -v a="$abs" 'BEGIN { exit !(m + 0 <= a + 0) }'; }; then
        echo "FAIL llamacpp_peer_$name: greedy token $k is ${gk[$k]:-none}, llama.cpp's ${gl[$k]} (its margin ${mg[$k]}, the logits differ by up to $abs)"
    else echo "ok llamacpp_peer_$name"; fi
}

# ---- the oracle's architectures
archs="llama3 mistral qwen2 qwen3 phi3 gemma2 gemma3 smollm3 olmo2"
hf=$build/hf
stale=0
for a in $archs; do [ -f "$hf/$a/oracle.json" ] && [ ! tests/ref/hf_oracle.py -nt "$hf/$a/oracle.json" ] || stale=1; done
have_py=0
python3 -c 'import torch, transformers, tokenizers, sentencepiece, safetensors' >/dev/null 2>&1 && have_py=1
if [ $stale = 1 ] && [ $have_py = 1 ] && ! python3 tests/ref/hf_oracle.py "$hf" >"$hf.log" 2>&1; then
    echo "FAIL llamacpp_peer: tests/ref/hf_oracle.py failed (see $hf.log)"
elif [ $stale = 1 ] && [ $have_py = 0 ]; then
    echo "skip llamacpp_peer_archs: python3 lacks torch, transformers, tokenizers, sentencepiece or safetensors (tests/ref/hf_oracle.py)"
else
    for a in $archs; do
        f32=$work/$a-f32.gguf q4=$work/$a-q4_k_m.gguf from=$hf/$a
        # llama.cpp's vocab loader (src/llama-vocab.cpp, the per-token attributes) looks up "<|endoftext|>" with
        # token_to_id.at() in any file whose general.name holds "phi3" or "phi-3", and the shrunk vocab has no such
        # token (Phi-3's own has it, id 32000): the load ends in "unordered_map::at". general.name is the folder's
        # name, so phi3 converts from a link with another name.
        if [ "$a" = phi3 ]; then ln -sfn "$hf/$a" "$work/shrunk-p3" && from=$work/shrunk-p3; fi
        if ! "$kiln" convert hf "$from" -o "$f32" --type f32 >"$work/$a.convert" 2>&1; then
            echo "FAIL llamacpp_peer_${a}_f32: kiln convert hf: $(tail -c 400 "$work/$a.convert" | tr '\n' ' ')"
            continue
        fi
        # shellcheck disable=SC2046
        peer "${a}_f32" "$f32" $bound_f32 0 "$hf/$a" $(json_ids "$hf/$a/oracle.json" tokens)
        if ! "$kiln" quantize "$f32" "$q4" --type q4_k_m >"$work/$a.quantize" 2>&1; then
            echo "FAIL llamacpp_peer_${a}_q4_k_m: kiln quantize: $(tail -c 400 "$work/$a.quantize" | tr '\n' ' ')"
            continue
        fi
        # shellcheck disable=SC2046
        peer "${a}_q4_k_m" "$q4" $bound_quant 1 "$hf/$a" $(json_ids "$hf/$a/oracle.json" tokens)
    done
fi

# ---- the real models, as downloaded
prompt="The capital of France is Paris. It is known for"
for m in smollm2-135m-instruct-q4_1 qwen2.5-coder-0.5b-instruct-q4_k_m gemma3-270m-q4_k_m; do
    if [ ! -f "$cache/$m.gguf" ]; then
        echo "skip llamacpp_peer_$m: $cache/$m.gguf is missing (bash tests/ref/fetch_models.sh)"
        continue
    fi
    peer "$m" "$cache/$m.gguf" $bound_quant 1 - -p "$prompt"
done
