#!/usr/bin/env bash
# test_preflight.sh: make's preflight on a machine that lacks a dependency. The machine is simulated with the real
# compiler and its real include path, less the header: each directory of the compiler's search list that holds it
# is replaced by a directory of symlinks to everything else (with -nostdinc, so only those are searched). The stamp
# goes to a temporary BUILD, so the real build is not touched. KILN_CC is the compiler of the build under test.
cd "$(dirname "$0")/.." || exit 1
. tests/test.sh
CC=${KILN_CC:-cc}
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT

# CFLAGS for $CC whose include path is the real one without the headers named as arguments.
cflags_without() {
    local flags="-nostdinc" d f e farm
    while read -r d; do
        d=${d%% (*}
        for f in "$@"; do
            if [ -e "$d/$f" ]; then
                farm=$(mktemp -d -p "$tmp")
                for e in "$d"/*; do ln -s "$e" "$farm/"; done
                for e in "$@"; do rm -f "$farm/$e"; done
                d=$farm
                break
            fi
        done
        flags="$flags -isystem $d"
    done < <("$CC" -E -v -x c /dev/null 2>&1 |
             sed -n '/^#include <...> search starts here:/,/^End of search list/{//!p}')
    echo "$flags"
}

# preflight OUTFILE MAKE-ARGS...: runs the preflight target into a fresh BUILD; output to OUTFILE, make's status back.
# With a CFLAGS argument (cflags_without's, which lists every directory the compiler searches, C_INCLUDE_PATH's
# too) the include variables are unset, so that list is the whole search path.
preflight() {
    local out=$1; shift
    rm -rf "$tmp/build"
    local unset=()
    case " $* " in *" CFLAGS="*) unset=(-u CPATH -u C_INCLUDE_PATH) ;; esac
    env "${unset[@]}" make --no-print-directory BUILD="$tmp/build" "$@" preflight >"$out" 2>&1
}

# refused STATUS: make's status must be an error.
refused() { check "make exited 0: $(cat "$tmp/out")" [ "$1" -ne 0 ]; }

# The one line that names what is missing comes first; no compiler diagnostics follow; no stamp is left.
expect_refusal() {
    local out=$1 line=$2
    check "$(cat "$out")" [ "$(head -n 1 "$out")" = "$line" ]
    check "a second kiln: line: $(cat "$out")" [ "$(grep -c '^kiln:' "$out")" -eq 1 ]
    check "compiler output leaked: $(cat "$out")" [ "$(grep -c 'error:\|#include' "$out")" -eq 0 ]
    check "a stamp was left" [ -z "$(ls "$tmp/build"/preflight-* 2>/dev/null)" ]
}

test_preflight_passes() {
    check "$(cat "$tmp/out" 2>/dev/null)" preflight "$tmp/out" ${KILN_CUDA:+CUDA=$KILN_CUDA}
    check "no stamp" [ -n "$(ls "$tmp/build"/preflight-*.ok 2>/dev/null)" ]
    # the stamp is made once: a second make probes nothing
    check "a second preflight ran" make --no-print-directory -q BUILD="$tmp/build" ${KILN_CUDA:+CUDA=$KILN_CUDA} preflight
}

test_missing_pcre2() {
    local flags; flags=$(cflags_without pcre2.h)
    check "the compiler cannot build a program with: $flags" \
        sh -c "printf '#include <stdio.h>\nint main(void) { return 0; }\n' | $CC $flags -x c - -o /dev/null"
    preflight "$tmp/out" CUDA=0 CC="$CC" CFLAGS="$flags"
    refused $?
    expect_refusal "$tmp/out" "kiln: pcre2.h not found: apt install libpcre2-dev"
}

test_missing_pcre2_and_utf8proc() {
    preflight "$tmp/out" CUDA=0 CC="$CC" CFLAGS="$(cflags_without pcre2.h utf8proc.h)"
    refused $?
    expect_refusal "$tmp/out" "kiln: pcre2.h, utf8proc.h not found: apt install libpcre2-dev libutf8proc-dev"
}

test_missing_compiler() {
    preflight "$tmp/out" CUDA=0 CC="$tmp/no-such-cc"
    refused $?
    expect_refusal "$tmp/out" "kiln: C compiler $tmp/no-such-cc not found: apt install gcc"
}

# CUDA=1 with a CUDA_HOME that holds nothing and the toolkit's headers taken off the include path too (some machines
# link them into /usr/local/include); nvcc itself is /bin/true, as the preflight only looks for it, so this runs on
# machines without CUDA as well.
test_missing_cuda_toolkit() {
    local flags; flags=$(cflags_without cuda_runtime.h cublasLt.h)
    mkdir -p "$tmp/nocuda"
    preflight "$tmp/out" CUDA=1 NCCL=0 NVCC=true CUDA_HOME="$tmp/nocuda" CC="$CC" CFLAGS="$flags"
    refused $?
    expect_refusal "$tmp/out" "kiln: cuda_runtime.h or libcudart.so not found: it is part of the CUDA toolkit (NVIDIA's cuda-toolkit package, or Debian's nvidia-cuda-toolkit) in $tmp/nocuda; or build with CUDA=0"
    preflight "$tmp/out" CUDA=1 NCCL=0 NVCC="$tmp/no-such-nvcc" CUDA_HOME="$tmp/nocuda" CC="$CC" CFLAGS="$flags"
    refused $?
    expect_refusal "$tmp/out" "kiln: $tmp/no-such-nvcc not found (CUDA=1): install the CUDA toolkit (NVIDIA's cuda-toolkit package, or Debian's nvidia-cuda-toolkit) in $tmp/nocuda, or build with CUDA=0"
}

# clean needs none of the dependencies: it never reaches the preflight
test_clean_needs_no_deps() {
    make --no-print-directory -n BUILD="$tmp/build" CC="$tmp/no-such-cc" clean >"$tmp/out" 2>&1
    local rc=$?
    check "make -n clean failed: $(cat "$tmp/out")" [ $rc -eq 0 ]
    check "clean runs the preflight: $(cat "$tmp/out")" [ "$(grep -c 'preflight\|probe' "$tmp/out")" -eq 0 ]
}

run test_preflight_passes
run test_missing_pcre2
run test_missing_pcre2_and_utf8proc
run test_missing_compiler
run test_missing_cuda_toolkit
run test_clean_needs_no_deps
test_exit
