#!/usr/bin/env bash
# fetch_grammars.sh: puts the GBNF grammar files that llama.cpp ships (grammars/*.gbnf: arithmetic, c, chess,
# english, japanese, json, json_arr, list) into KILN_CACHE/llama.cpp-grammars (default ~/.cache/kiln), outside the
# repository: tests/test_grammar.c parses each and checks that it accepts and refuses what llama.cpp's does. They
# come from the llama-cpp-python 0.3.16 sdist on PyPI (50 MB; its vendor/llama.cpp/grammars), each checked against
# the sha256 below. Idempotent; a failed download prints one line and leaves no files (the test then skips) and
# exits 0; a file that does not match its hash is an error (exit 1).
set -euo pipefail
cache=${KILN_CACHE:-$HOME/.cache/kiln}
dir=$cache/llama.cpp-grammars
sums='dd91e1ef7bb0178e398036c6f5251c694b79c43cb2d223784f4dcf3020994776  arithmetic.gbnf
556cdbde93b832c9283896d68837fd3025e772677b36dc18f066b194fb99698c  c.gbnf
de1a656bb4cf0fda3991f0d3f1bcde338c0d82a60f7e0e8cabb2ba0c73002e5f  chess.gbnf
96a248f563c5780af621b63d59c64e8d4823cb3b9b3e7f487eb8f8b3d11b0dcf  english.gbnf
69fc177180f2b15d085d811aa41e360bb85c962d424d7c17dc936c04ca668e00  japanese.gbnf
1a3e3469892957861029adcd24ad0c886b778a942dd4a18cc146238ad56474dd  json.gbnf
f817496d5ee08aaa7dac4fdee59cbecfcf99367088b63e4b1c02d6f632c39206  json_arr.gbnf
7e8b142784f991511650e5f0e82d18a123558f09e9d19a056d10718a6986a150  list.gbnf'
if [ -d "$dir" ] && (cd "$dir" && printf '%s\n' "$sums" | sha256sum --quiet -c - >/dev/null 2>&1); then
    echo "fetch_grammars: $dir present and verified"
    exit 0
fi
mkdir -p "$cache"
tmp=$(mktemp -d "$cache/.grammars.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
if ! timeout 600 python3 -m pip download -q --no-deps --no-binary :all: llama-cpp-python==0.3.16 -d "$tmp" >/dev/null 2>&1; then
    echo "fetch_grammars: could not download the llama-cpp-python 0.3.16 sdist from PyPI: the grammar-file tests will skip"
    exit 0
fi
tar xzf "$tmp"/llama_cpp_python-0.3.16.tar.gz -C "$tmp" --wildcards '*/vendor/llama.cpp/grammars/*.gbnf'
mkdir -p "$tmp/out"
cp "$tmp"/llama_cpp_python-0.3.16/vendor/llama.cpp/grammars/*.gbnf "$tmp/out/"
if ! (cd "$tmp/out" && printf '%s\n' "$sums" | sha256sum --quiet -c -); then
    echo "fetch_grammars: the grammar files do not match their sha256" >&2
    exit 1
fi
rm -rf "$dir"
mv "$tmp/out" "$dir"
echo "fetch_grammars: $dir fetched and verified"
