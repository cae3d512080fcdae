#!/usr/bin/env bash
# spec_synth.sh: speculative decoding's speed on the GPU for a pair too large to train here: a synthetic llama2-7b
# target (Q4_K_M) with a synthetic tinyllama-1.1b draft (the same 32000-token vocab), both with random weights
# (kiln synth --fast), so their drafts would all be refused: `kiln bench spec --simulate-accept A` takes each draft
# with probability A instead, at the rates real pairs reach (docs/speculative.md), while every forward still runs.
#
# Usage: bench/spec_synth.sh [A...]      (run from the repository root; default A: 0.6 0.7 0.8)
#   KILN       the kiln binary, default build/kiln (built with CUDA beforehand: this script builds nothing)
#   DIR        where the two models are written (about 4.5 GB), default a temporary folder removed at the end
#   DRAFT_TYPE the draft's type, default q4_k_m;  N tokens per case, default 128;  DRAFT_MAX default 2,4,8
#   GPU        --gpu (default) or empty for the CPU
set -euo pipefail
KILN=${KILN:-build/kiln}
N=${N:-128}
DRAFT_MAX=${DRAFT_MAX:-2,4,8}
DRAFT_TYPE=${DRAFT_TYPE:-q4_k_m}
GPU=${GPU---gpu}
if [ -z "${DIR:-}" ]; then
    DIR=$(mktemp -d)
    trap 'rm -rf "$DIR"' EXIT
fi
[ $# -gt 0 ] || set -- 0.6 0.7 0.8
[ -f "$DIR/target-7b.gguf" ] || "$KILN" synth --shape llama2-7b --type q4_k_m --fast -o "$DIR/target-7b.gguf"
[ -f "$DIR/draft-1.1b.gguf" ] || "$KILN" synth --shape tinyllama-1.1b --type "$DRAFT_TYPE" --fast --seed 2 -o "$DIR/draft-1.1b.gguf"
for a in "$@"; do
    # shellcheck disable=SC2086
    "$KILN" bench spec -m "$DIR/target-7b.gguf" -md "$DIR/draft-1.1b.gguf" $GPU -n "$N" --draft-max "$DRAFT_MAX" \
        --simulate-accept "$a" --reps 3
done
