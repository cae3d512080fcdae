#!/usr/bin/env bash
# test_deps.sh: tools/check_deps.py on this build (no circles among kiln's files, no edge up the layers, tools/ on
# the public API only), and first on made-up trees that must fail: two files calling each other, a core file
# calling the CPU backend, a tool including an internal header. Run by `make test` (KILN_BUILD: the build folder).
root=$(cd "$(dirname "$0")/.." && pwd)
build=${KILN_BUILD:-$root/build}
check="$root/tools/check_deps.py"
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT

# tree DIR PATH:SOURCE...: sources laid out as kiln's under DIR, each .c compiled into DIR/build.
tree() {
  local d=$1; shift
  mkdir -p "$d/include" "$d/build"
  for spec in "$@"; do
    local path=${spec%%:*} src=${spec#*:}
    mkdir -p "$d/$(dirname "$path")" "$d/build/$(dirname "$path")"
    printf '%s\n' "$src" > "$d/$path"
    case $path in *.c) cc -c -I"$d/include" -I"$d/src" -I"$d" "$d/$path" -o "$d/build/${path%.c}.o" || return 1;; esac
  done
}
expect_fail() { # name dir pattern
  local out; out=$(python3 "$check" --root "$2" --build "$2/build" 2>&1)
  if [ $? -ne 0 ] && printf '%s\n' "$out" | grep -q "$3"; then echo "ok $1"
  else echo "FAIL $1: check_deps did not report '$3':"; printf '%s\n' "$out"; fi
}

tree "$tmp/cycle" 'src/cpu/a.c:void b(void); void a(void) { b(); }' 'src/cpu/b.c:void a(void); void b(void) { a(); }'
expect_fail deps_finds_a_call_cycle "$tmp/cycle" 'calls cycle among src/cpu/a.c, src/cpu/b.c'
tree "$tmp/up" 'src/core/q.c:void simd(void); void q(void) { simd(); }' 'src/cpu/s.c:void simd(void) {}'
expect_fail deps_finds_core_calling_cpu "$tmp/up" 'src/core/q.c (layer 0) -> src/cpu/s.c (layer 3): simd'
tree "$tmp/inc" 'include/kiln.h:' 'src/train/data.h:' 'tools/t.c:#include "kiln.h"
#include "train/data.h"'
expect_fail deps_finds_tool_including_internals "$tmp/inc" 'tools/t.c: #include "train/data.h" is not the public API'
tree "$tmp/hdr" 'src/tok/x.h:#include "tok/y.h"' 'src/tok/y.h:#include "tok/x.h"'
expect_fail deps_finds_an_include_cycle "$tmp/hdr" 'includes cycle among src/tok/x.h, src/tok/y.h'

out=$(python3 "$check" --root "$root" --build "$build" 2>&1)
if [ $? -eq 0 ]; then echo "ok deps_kiln_is_layered"; else echo "FAIL deps_kiln_is_layered:"; printf '%s\n' "$out"; fi
