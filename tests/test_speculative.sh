#!/usr/bin/env bash
# test_speculative.sh: kiln generate's speculative decoding (tools/kiln.c generate_spec) on the bundled model. Greedy
# output with --lookup, with the model as its own draft (-md, every draft taken) and with a random draft of the same
# vocab (kiln synth: almost every draft refused) must equal plain greedy output byte for byte, for several prompts
# and draft sizes; the stats line must report the rounds and acceptances. Sampling with a draft model: a seeded run
# repeats itself, the model as its own draft (q = p) takes every draft, a random draft runs to -n. What is refused
# (penalties, both drafters, a grammar, a draft of another vocab) exits 1 with one line naming why.
cd "$(dirname "$0")/.." || exit 1
. tests/test.sh
KILN=${KILN_BIN:-build/kiln}
MODEL=models/shakespeare.gguf
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT

gen() { "$KILN" generate -m "$MODEL" --temp 0 -t 1 "$@" 2>"$tmp/err"; }

test_spec_equals_greedy() {
    [ -f "$MODEL" ] || skip "$MODEL is missing"
    "$KILN" synth --vocab "$MODEL" --dim 64 --layers 2 --heads 2 --kv-heads 2 --ff 128 --ctx 512 --type f32 --seed 5 \
        -o "$tmp/rand.gguf" 2>/dev/null || check "kiln synth of a random draft failed" false
    local p want got mode
    for p in "ROMEO:" "First Citizen:" "JULIET: O Romeo, Romeo"; do
        want=$(gen -p "$p" -n 96) || check "plain generate failed: $(cat "$tmp/err")" false
        for mode in "--lookup" "--lookup --draft-max 3 --lookup-ngram 2" "-md $MODEL" "-md $MODEL --draft-max 5" \
                    "-md $tmp/rand.gguf --draft-max 4" "--lookup --draft-min 4"; do
            # shellcheck disable=SC2086
            got=$(gen -p "$p" -n 96 $mode) || check "generate $mode failed: $(cat "$tmp/err")" false
            check "'$p' with $mode: the text differs from plain greedy: '$got' vs '$want'" [ "$got" == "$want" ]
            check "'$p' with $mode: no stats line: $(cat "$tmp/err")" grep -q "kiln: speculative (.*): [0-9]* rounds, [0-9]* drafted, [0-9]* accepted" "$tmp/err"
        done
    done
    gen -p "ROMEO:" -n 96 -md "$MODEL" >/dev/null
    check "the model as its own draft: not every draft taken: $(grep speculative "$tmp/err")" grep -q "accepted (100.0%)" "$tmp/err"
}

test_spec_sample_draft_model() {
    [ -f "$MODEL" ] || skip "$MODEL is missing"
    "$KILN" synth --vocab "$MODEL" --dim 64 --layers 2 --heads 2 --kv-heads 2 --ff 128 --ctx 512 --type f32 --seed 5 \
        -o "$tmp/rand.gguf" 2>/dev/null || check "kiln synth of a random draft failed" false
    local a b
    a=$("$KILN" generate -m "$MODEL" -p "ROMEO:" -n 80 --temp 0.8 --seed 3 -t 1 -md "$MODEL" 2>"$tmp/err") ||
        check "sampling with -md failed: $(cat "$tmp/err")" false
    check "the model as its own sampled draft: not every draft taken: $(grep speculative "$tmp/err")" grep -q "accepted (100.0%)" "$tmp/err"
    b=$("$KILN" generate -m "$MODEL" -p "ROMEO:" -n 80 --temp 0.8 --seed 3 -t 1 -md "$MODEL" 2>/dev/null)
    check "a seeded sampled run with -md differs from itself" [ "$a" == "$b" ]
    "$KILN" generate -m "$MODEL" -p "ROMEO:" -n 80 --temp 0.8 --seed 3 -t 1 -md "$tmp/rand.gguf" --draft-max 4 >/dev/null 2>"$tmp/err" ||
        check "sampling with a random -md failed: $(cat "$tmp/err")" false
    check "random sampled draft: no 80 tokens: $(cat "$tmp/err")" grep -q "generated 80 tokens" "$tmp/err"
}

test_spec_refusals() {
    [ -f "$MODEL" ] || skip "$MODEL is missing"
    "$KILN" synth --vocab-size 100 --dim 32 --layers 1 --heads 2 --kv-heads 2 --ff 64 --ctx 64 --type f32 -o "$tmp/other.gguf" 2>/dev/null
    local args want
    while IFS='|' read -r want args; do
        # shellcheck disable=SC2086
        "$KILN" generate -m "$MODEL" -p "x" -n 8 $args >"$tmp/out" 2>"$tmp/err"
        local rc=$?
        check "generate $args: exit status $rc, not 1" [ "$rc" -eq 1 ]
        check "generate $args: stderr is not one line naming '$want': $(cat "$tmp/err")" grep -qF -- "$want" "$tmp/err"
        check "generate $args: stderr has $(wc -l <"$tmp/err") lines" [ "$(wc -l <"$tmp/err")" -eq 1 ]
    done <<EOF2
penalties|--lookup --temp 0 --repeat-penalty 1.1
not both|--temp 0 --lookup -md $MODEL
grammar|--temp 0 --lookup --grammar root::="a"
--draft-min is more than --draft-max|--temp 0 --lookup --draft-min 9 --draft-max 4
must share a tokenizer|--temp 0 -md $tmp/other.gguf
--draft-max|--temp 0 --lookup --draft-max 0
EOF2
}

run test_spec_equals_greedy
run test_spec_sample_draft_model
run test_spec_refusals
test_exit
