#!/usr/bin/env bash
# test_cuda_host.sh: the CUDA backend's block decoders (src/cuda/matvec_pieces.cuh, gemm_dq.cuh, blocks.cuh) compiled
# for the host with stand-ins for the CUDA intrinsics and checked against the reference dequantization on random
# blocks (tests/cuda_host.cpp says how), so a machine without a GPU still checks every type's bit layout. Needs a C++
# compiler; links the build's libkiln.a (KILN_BUILD; KILN_SAN=1: with the sanitizers). Run by `make test`.
root=$(cd "$(dirname "$0")/.." && pwd)
build=${KILN_BUILD:-$root/build}
cxx=${CXX:-c++}
cc=${CC:-cc}
if ! command -v "$cxx" >/dev/null 2>&1; then echo "skip test_cuda_host: no C++ compiler ($cxx)"; exit 0; fi
if [ ! -f "$build/libkiln.a" ]; then echo "FAIL test_cuda_host: $build/libkiln.a is missing"; exit 1; fi
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/stub" && touch "$tmp/stub/cuda_fp16.h" "$tmp/stub/cuda_bf16.h" "$tmp/stub/cuda_runtime.h"
inc="-I$root/include -I$root/src -I$root/src/core -I$root/tests"
# a SAN=1 build's library needs the sanitizers at link time (and the harness gets them too)
san=; [ "${KILN_SAN:-0}" = 1 ] && san="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
# -ffp-contract=off: the decoders' __fmul_rn/__fadd_rn order must not become FMAs here either
if ! "$cc" -std=c11 -D_GNU_SOURCE -O1 -ffp-contract=off $san $inc -c "$root/tests/cuda_host_ref.c" -o "$tmp/ref.o" 2>"$tmp/err" ||
   ! "$cxx" -std=c++17 -O1 -ffp-contract=off -Wall -Wno-unused-function $san -I"$tmp/stub" $inc "$root/tests/cuda_host.cpp" "$tmp/ref.o" \
     "$build/libkiln.a" -lpcre2-8 -lutf8proc -lpthread -lm -o "$tmp/cuda_host" 2>>"$tmp/err"; then
  echo "FAIL test_cuda_host: the host build of the decoders failed: $(head -c 2000 "$tmp/err" | tr '\n' ' ')"
  exit 1
fi
"$tmp/cuda_host"
