#!/usr/bin/env bash
# test_install.sh: `make install` into a temporary PREFIX (and a DESTDIR), then a program from outside the tree,
# tests/install/hello_kiln.c, built with pkg-config against the installed kiln twice, with libkiln.a and with
# libkiln.so, each run on models/shakespeare.gguf: both must write text, the same text. The install reuses the
# build under test (KILN_BUILD and KILN_CUDA, from the `make test` that runs this, whose other make variables come
# through MAKEFLAGS), so it compiles nothing new; KILN_CC is that build's compiler.
cd "$(dirname "$0")/.." || exit 1
. tests/test.sh
CC=${KILN_CC:-cc}
BUILD=${KILN_BUILD:-build}
MAKEVARS=(BUILD="$BUILD" ${KILN_CUDA:+CUDA=$KILN_CUDA})
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
PREFIX=$tmp/prefix
VERSION=$(sed -n 's/^#define KILN_VERSION "\(.*\)"$/\1/p' include/kiln.h)
MAJOR=$(sed -n 's/^#define KILN_VERSION_MAJOR \([0-9]*\)$/\1/p' include/kiln.h)

installed() { [ -e "$PREFIX/lib/pkgconfig/kiln.pc" ]; }
needs() {
    [ "${KILN_SAN:-0}" = 0 ] || skip "the sanitizer build (SAN=1) has no shared library; the plain build's make test installs"
    command -v pkg-config >/dev/null || skip "pkg-config not found (apt install pkg-config)"
    installed || skip "make install failed (test_install_files says why)"
}

test_install_files() {
    [ "${KILN_SAN:-0}" = 0 ] || skip "the sanitizer build (SAN=1) has no shared library; the plain build's make test installs"
    make --no-print-directory "${MAKEVARS[@]}" PREFIX="$PREFIX" install >"$tmp/out" 2>&1
    local rc=$?
    check "make install: status $rc: $(tail -n 5 "$tmp/out")" [ $rc -eq 0 ]
    local f
    for f in lib/libkiln.a "lib/libkiln.so.$VERSION" include/kiln.h lib/pkgconfig/kiln.pc; do
        check "$f not installed" [ -f "$PREFIX/$f" ]
    done
    check "libkiln.so.$MAJOR -> $(readlink "$PREFIX/lib/libkiln.so.$MAJOR")" [ "$(readlink "$PREFIX/lib/libkiln.so.$MAJOR")" = "libkiln.so.$VERSION" ]
    check "libkiln.so -> $(readlink "$PREFIX/lib/libkiln.so")" [ "$(readlink "$PREFIX/lib/libkiln.so")" = "libkiln.so.$MAJOR" ]
    if command -v readelf >/dev/null; then
        check "soname: $(readelf -d "$PREFIX/lib/libkiln.so.$VERSION" | grep SONAME)" \
            grep -q "Library soname: \[libkiln.so.$MAJOR\]" <(readelf -d "$PREFIX/lib/libkiln.so.$VERSION")
    fi
    check "kiln.pc: $(cat "$PREFIX/lib/pkgconfig/kiln.pc")" grep -qx "prefix=$PREFIX" "$PREFIX/lib/pkgconfig/kiln.pc"
    check "kiln.pc: $(cat "$PREFIX/lib/pkgconfig/kiln.pc")" grep -qx "Version: $VERSION" "$PREFIX/lib/pkgconfig/kiln.pc"
}

# hello MODE: builds hello_kiln against the installed kiln, MODE static (libkiln.a and Libs.private) or shared.
hello() {
    export PKG_CONFIG_PATH=$PREFIX/lib/pkgconfig
    local cflags libs
    if [ "$1" = static ]; then
        libs=$(pkg-config --static --libs kiln) && libs=${libs/-lkiln/-l:libkiln.a} # the archive, though the .so is there
    else
        libs=$(pkg-config --libs kiln)
    fi
    cflags=$(pkg-config --cflags kiln)
    check "pkg-config kiln failed: $(pkg-config --libs kiln 2>&1)" [ -n "$libs" ] && [ -n "$cflags" ]
    $CC -std=c11 -Wall -Wextra -o "$tmp/hello_$1" tests/install/hello_kiln.c $cflags $libs >"$tmp/cc_$1" 2>&1
    local rc=$?
    check "cc tests/install/hello_kiln.c $cflags $libs: $(head -n 5 "$tmp/cc_$1")" [ $rc -eq 0 ]
    if command -v readelf >/dev/null; then
        local needed; needed=$(readelf -d "$tmp/hello_$1" | grep NEEDED)
        if [ "$1" = static ]; then check "linked to libkiln.so: $needed" [ "$(grep -c libkiln <<<"$needed")" -eq 0 ]
        else check "not linked to libkiln.so.$MAJOR: $needed" grep -q "\[libkiln.so.$MAJOR\]" <<<"$needed"; fi
    fi
    LD_LIBRARY_PATH=$PREFIX/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "$tmp/hello_$1" models/shakespeare.gguf "ROMEO:" 20 7 \
        >"$tmp/text_$1" 2>"$tmp/err_$1"
    rc=$?
    check "hello_$1: status $rc: $(cat "$tmp/err_$1")" [ $rc -eq 0 ]
    check "hello_$1 wrote no text after the prompt: $(cat "$tmp/text_$1")" [ "$(head -c 64 "$tmp/text_$1" | wc -c)" -gt 12 ]
}

test_hello_static() { needs; hello static; }
test_hello_shared() { needs; hello shared; }
test_same_text() {
    needs
    [ -s "$tmp/text_static" ] && [ -s "$tmp/text_shared" ] || skip "a hello_kiln build failed (above)"
    check "static: $(cat "$tmp/text_static") / shared: $(cat "$tmp/text_shared")" cmp -s "$tmp/text_static" "$tmp/text_shared"
}

# Ten training steps through the public trainer API, in the same runs: the loss must fall.
test_train_steps() {
    needs
    [ -s "$tmp/text_static" ] || skip "the static hello_kiln build failed (above)"
    local line; line=$(grep '^train: ' "$tmp/text_static")
    check "no training line in: $(cat "$tmp/text_static")" [ -n "$line" ]
    check "not ten steps, or the loss did not fall: $line" \
        awk '/^train: 10 steps, loss/ { if ($7 + 0 < $5 + 0) ok = 1 } END { exit !ok }' <<<"$line"
}

test_destdir() {
    needs
    make --no-print-directory "${MAKEVARS[@]}" PREFIX=/opt/kiln DESTDIR="$tmp/stage" install >"$tmp/out" 2>&1
    local rc=$?
    check "make install DESTDIR: status $rc: $(tail -n 5 "$tmp/out")" [ $rc -eq 0 ]
    check "nothing in DESTDIR/opt/kiln" [ -f "$tmp/stage/opt/kiln/lib/libkiln.a" ] && [ -f "$tmp/stage/opt/kiln/include/kiln.h" ]
    check "kiln.pc names DESTDIR: $(cat "$tmp/stage/opt/kiln/lib/pkgconfig/kiln.pc")" \
        grep -qx "prefix=/opt/kiln" "$tmp/stage/opt/kiln/lib/pkgconfig/kiln.pc"
    make --no-print-directory "${MAKEVARS[@]}" PREFIX=/opt/kiln DESTDIR="$tmp/stage" uninstall >"$tmp/out" 2>&1
    check "make uninstall left: $(find "$tmp/stage" -type f -o -type l)" [ -z "$(find "$tmp/stage" -type f -o -type l)" ]
}

run test_install_files
run test_hello_static
run test_hello_shared
run test_train_steps
run test_same_text
run test_destdir
test_exit
