#!/usr/bin/env bash
# test_serve.sh: `kiln serve` end to end, on loopback. Each server is started with --port 0 (its port read from the
# "listening on" line of its stderr), waited for on /health, checked by tests/serve/checks.py (the openai package,
# llama-server's and Ollama's routes, greedy output against `kiln generate`, concurrency with cancelled streams, slot
# persistence across a restart, a load past the queue, SIGTERM during a stream) and stopped with SIGTERM, which must
# end it with status 0. The checks print their own ok/FAIL/skip lines. Servers, in order:
#   default  the bundled model, 4 slots, --metrics, --api-key, --slot-save-path: the API, routes, concurrency, a save
#   smollm   SmolLM2 (~/.cache/kiln; skipped without it), 2 slots: the openai client and greedy output on a real
#            model, and a slot saved from another model (the foreign file the default model must refuse)
#   restart  the default server again: the restores, then SIGTERM in the middle of a stream
#   lookup   the bundled model with --lookup, 4 slots: speculative greedy text against plain decoding's and generate's
#   selfdraft  the bundled model with itself as -md: the same, every draft taken
#   draft    the bundled model with its trained draft (models/shakespeare-draft.gguf), 6 slots: the same, some
#            drafts refused, and more slots than a step's rows for drafts
#   smollm_lookup  SmolLM2 with --lookup, 2 slots (skipped without it): the same on a real model
#   load     1 slot (SmolLM2 where it is, else the bundled model with longer requests): 503s with Retry-After
#   bench    `kiln bench serve -m` on the bundled model (the server it starts itself): its JSON, table and flag errors
# Needs python3 with the openai package (pip install openai); skips without it, or without `kiln serve`.
cd "$(dirname "$0")/.." || exit 1
. tests/test.sh
KILN=${KILN_BIN:-build/kiln}
DEFAULT=models/shakespeare.gguf
SMOLLM=${KILN_SMOLLM:-$HOME/.cache/kiln/smollm2-135m-instruct-q4_1.gguf}
KEY=kiln-test-key-0123456789
tmp=$(mktemp -d) || exit 1
SRV_PID=
trap '[ -n "$SRV_PID" ] && kill -9 "$SRV_PID" 2>/dev/null; rm -rf "$tmp"' EXIT
mkdir -p "$tmp/slots"

if ! python3 -c 'import openai' 2>/dev/null; then
    echo "skip test_serve: python3's openai package is absent (pip install openai)"; exit 0
fi
if ! "$KILN" serve --version >/dev/null 2>&1; then
    echo "skip test_serve: $KILN has no serve command"; exit 0
fi

# health_status PORT: the status code of GET /health on 127.0.0.1:PORT (bash's /dev/tcp: no curl needed), or nothing.
health_status() {
    timeout 5 bash -c 'exec 3<>/dev/tcp/127.0.0.1/$1 && printf "GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n" >&3 &&
        read -r _ code _ <&3 && echo "$code"' _ "$1" 2>/dev/null
}

# start_server NAME ARGS...: starts `kiln serve ARGS --port 0` and waits (30 s at most) for its port and /health;
# sets SRV_PID and SRV_URL. On failure prints "FAIL serve_NAME_start" with the log's tail and returns 1.
start_server() {
    local name=$1; shift
    SRV_LOG=$tmp/$name.log
    "$KILN" serve "$@" --port 0 2>"$SRV_LOG" >"$tmp/$name.out" &
    SRV_PID=$!
    local port= i
    for i in $(seq 1 300); do
        port=$(sed -n 's|.*listening on http://127\.0\.0\.1:\([0-9][0-9]*\).*|\1|p' "$SRV_LOG" | head -n1)
        [ -n "$port" ] && break
        kill -0 "$SRV_PID" 2>/dev/null || break
        sleep 0.1
    done
    SRV_URL=http://127.0.0.1:$port
    for i in $(seq 1 100); do
        [ -n "$port" ] && [ "$(health_status "$port")" = 200 ] && return 0
        kill -0 "$SRV_PID" 2>/dev/null || break
        sleep 0.1
    done
    echo "FAIL serve_${name}_start: kiln serve $* did not come up: $(tail -n 3 "$SRV_LOG" | tr '\n' ' ' | head -c 600)"
    test_n_failed_=$((test_n_failed_ + 1))
    kill -9 "$SRV_PID" 2>/dev/null; wait "$SRV_PID" 2>/dev/null; SRV_PID=
    return 1
}

# stop_server NAME [signalled]: SIGTERM (unless the checks sent it: a second one may mean "now"), then the exit
# status must be 0 within 30 s ("ok/FAIL serve_NAME_exit").
stop_server() {
    local name=$1 i rc
    [ "${2:-}" = signalled ] || kill -TERM "$SRV_PID" 2>/dev/null
    for i in $(seq 1 300); do kill -0 "$SRV_PID" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$SRV_PID" 2>/dev/null; then
        echo "FAIL serve_${name}_exit: still running 30 s after SIGTERM"; test_n_failed_=$((test_n_failed_ + 1))
        kill -9 "$SRV_PID"; wait "$SRV_PID" 2>/dev/null
    else
        wait "$SRV_PID"; rc=$?
        if [ "$rc" -eq 0 ]; then echo "ok serve_${name}_exit"
        else echo "FAIL serve_${name}_exit: status $rc after SIGTERM: $(tail -n 2 "$SRV_LOG" | tr '\n' ' ' | head -c 400)"
             test_n_failed_=$((test_n_failed_ + 1)); fi
    fi
    SRV_PID=
}

# checks NAME ARGS... -- CHECK...: checks.py against the running server; its FAIL lines count, and so does a
# crash that printed none.
checks() {
    local name=$1; shift
    local out rc
    out=$(python3 tests/serve/checks.py --url "$SRV_URL" --kiln "$KILN" --prefix "serve_$name" "$@" 2>&1); rc=$?
    printf '%s\n' "$out" | grep -E '^(ok|FAIL|skip) '
    local n; n=$(printf '%s\n' "$out" | grep -c '^FAIL ')
    if [ "$rc" -ne 0 ] && [ "$n" -eq 0 ]; then
        echo "FAIL serve_${name}_checks: checks.py exited with status $rc: $(printf '%s\n' "$out" | tail -n 3 | tr '\n' ' ' | head -c 600)"
        n=1
    fi
    test_n_failed_=$((test_n_failed_ + n))
}

# The server's own log must hold no raw control byte but newlines (what came from the network is escaped).
check_log() {
    local name=$1
    if [ "$(tr -d '\n' <"$SRV_LOG" | tr -cd '\000-\037\177' | wc -c)" -eq 0 ]; then echo "ok serve_${name}_log_escaped"
    else echo "FAIL serve_${name}_log_escaped: a raw control byte in kiln serve's stderr"; test_n_failed_=$((test_n_failed_ + 1)); fi
}

D_ARGS=(-m "$DEFAULT" -np 4 -c 1024 -t 1 --metrics --api-key "$KEY" --slot-save-path "$tmp/slots")
# the bundled model has no chat template (the server falls back to chatml, as llama-server does)
D_CHECK=(--model "$DEFAULT" --no-template --api-key "$KEY" --slots 4 --slot-ctx 256 --metrics --state "$tmp/state.json" --save-dir "$tmp/slots")

if start_server default "${D_ARGS[@]}"; then
    checks default "${D_CHECK[@]}" -- models chat chat_stream completions usage_counts schemas errors routes auth greedy_generate \
        sample_generate greedy_chat completion completion_probs completion_stream tokenize_roundtrip apply_template props slots metrics \
        grammar schema ollama concurrency persist_save
    check_log default
    stop_server default
fi

if [ -s "$SMOLLM" ]; then
    S_ARGS=(-m "$SMOLLM" -np 2 -c 1024 -t 2 --slot-save-path "$tmp/slots")
    if start_server smollm "${S_ARGS[@]}"; then
        # SmolLM2's slot file lands in the same folder: the restart's restore finds it as the default model's foreign file
        checks smollm --model "$SMOLLM" --slots 2 --slot-ctx 512 -- models chat chat_stream completions usage_counts errors \
            greedy_generate sample_generate greedy_chat completion completion_probs tokenize_roundtrip grammar schema ollama persist_foreign
        stop_server smollm
    fi
else
    echo "skip serve_smollm: $SMOLLM not found (tests/ref/fetch_models.sh fetches it)"
fi

if start_server restart "${D_ARGS[@]}"; then
    checks restart "${D_CHECK[@]}" -- persist_restore slots
    checks restart "${D_CHECK[@]}" --pid "$SRV_PID" -- sigterm
    stop_server restart signalled
fi

# Speculative decoding on the bundled model: prompt lookup, then the model as its own draft (every draft taken). The
# greedy text equals plain decoding's and kiln generate's, with 4 slots speculating at once.
SPEC_CHECKS=(spec_props spec_greedy spec_ends spec_probs spec_concurrent spec_sample)
if start_server lookup -m "$DEFAULT" -np 4 -c 1024 -t 1 --metrics --lookup; then
    checks lookup --model "$DEFAULT" --slots 4 --slot-ctx 256 --metrics --spec lookup -- "${SPEC_CHECKS[@]}" greedy_generate completion
    stop_server lookup
fi
if start_server selfdraft -m "$DEFAULT" -md "$DEFAULT" -np 4 -c 1024 -t 1 --metrics --draft-max 8; then
    checks selfdraft --model "$DEFAULT" --slots 4 --slot-ctx 256 --metrics --spec draft_model --self-draft -- "${SPEC_CHECKS[@]}" \
        greedy_generate completion
    stop_server selfdraft
fi
# the bundled model's trained draft (models/shakespeare-draft.gguf): some drafts refused, so the draft's cache is cut
# back and caught up again; 6 slots, more than a step has rows for drafts (4 x --draft-max)
if [ -s models/shakespeare-draft.gguf ] && start_server draft -m "$DEFAULT" -md models/shakespeare-draft.gguf -np 6 -c 1536 -t 1 --metrics; then
    checks draft --model "$DEFAULT" --slots 6 --slot-ctx 256 --metrics --spec draft_model -- "${SPEC_CHECKS[@]}" concurrency
    stop_server draft
fi
if [ -s "$SMOLLM" ] && start_server smollm_lookup -m "$SMOLLM" -np 2 -c 1024 -t 2 --metrics --lookup; then
    checks smollm_lookup --model "$SMOLLM" --slots 2 --slot-ctx 512 --metrics --spec lookup -- "${SPEC_CHECKS[@]}"
    stop_server smollm_lookup
fi
# A draft of another vocab, and contradicting flags, are refused with one line naming the problem.
test_serve_spec_flags() {
    local a want
    # each case: the flags, then a word the first line of the error must hold
    for a in "--lookup -md $DEFAULT|not both" "--lookup --draft-min 5 --draft-max 4|--draft-min" "--lookup-ngram 0|--lookup-ngram" \
             "--draft-max 0|--draft-max"; do
        want=${a#*|}; a=${a%|*}
        # shellcheck disable=SC2086
        "$KILN" serve -m "$DEFAULT" $a --port 0 >"$tmp/out" 2>"$tmp/err"
        check "serve $a: status $?, not 1" [ $? -eq 1 ]
        check "serve $a: the first line does not say '$want': $(head -n 1 "$tmp/err")" grep -qF -- "$want" <(head -n 1 "$tmp/err")
    done
    if [ -s "$SMOLLM" ]; then
        "$KILN" serve -m "$DEFAULT" -md "$SMOLLM" --port 0 >"$tmp/out" 2>"$tmp/err"
        check "serve -md of another vocab: status $?, not 1" [ $? -eq 1 ]
        check "serve -md of another vocab: $(cat "$tmp/err")" grep -q "vocab" "$tmp/err"
    fi
}
run test_serve_spec_flags

# The load: one slot and a queue of 2 (--queue), 16 clients: more than both.
if [ -s "$SMOLLM" ]; then L_ARGS=(-m "$SMOLLM" -t 2); L_N=24; else L_ARGS=(-m "$DEFAULT" -t 1); L_N=400; fi
if start_server load "${L_ARGS[@]}" -np 1 -c 512 --queue 2; then
    checks load --slots 1 --load-clients 16 --load-n "$L_N" -- load
    stop_server load
fi
# kiln bench serve against a kiln serve it starts: one JSON object per case with every stream's tokens and no error,
# percentiles in order, then the table; bad flags are refused naming the flag.
test_serve_bench() {
    "$KILN" bench serve -m "$DEFAULT" -np 2 -t 1 -c 1,2 -n 8 >"$tmp/bench.out" 2>"$tmp/bench.err"
    check "kiln bench serve: status $?: $(head -c 400 "$tmp/bench.err")" [ $? -eq 0 ]
    check "kiln bench serve: $(head -c 600 "$tmp/bench.out")" python3 -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
assert [r["clients"] for r in rows] == [1, 2], rows
for r in rows:
    assert r["engine"] == "kiln" and r["errors"] == 0 and r["tokens"] == 8 * r["clients"], r
    assert r["tok_s"] > 0 and 0 < r["ttft_p50_ms"] <= r["ttft_p99_ms"] and 0 <= r["itl_p50_ms"] <= r["itl_p99_ms"], r
# events that come in one read share a time: gaps of 0 are real, and on a loaded machine the 8 tokens of one client may all
# come in one read (seen with the binary of main too), so only some row must show a gap
assert any(r["itl_p99_ms"] > 0 for r in rows), rows
assert any(l.split()[:1] == ["2"] for l in open(sys.argv[1]) if not l.startswith("{")), "no table row for 2 clients"
' "$tmp/bench.out"
    # --sample: the requests sample (seeded), and every stream still has its n tokens
    "$KILN" bench serve -m "$DEFAULT" -np 2 -t 1 -c 2 -n 8 --sample >"$tmp/bench.out" 2>"$tmp/bench.err"
    check "kiln bench serve --sample: status $?: $(head -c 400 "$tmp/bench.err")" [ $? -eq 0 ]
    check "kiln bench serve --sample: $(head -c 600 "$tmp/bench.out")" python3 -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
assert len(rows) == 1 and rows[0]["sampling"] == "sampled" and rows[0]["errors"] == 0 and rows[0]["tokens"] == 16, rows
' "$tmp/bench.out"
    local a
    for a in "-c 0" "-c 1,x" "-n 0" "-np 0" "-r 1.5"; do
        # shellcheck disable=SC2086
        "$KILN" bench serve -m "$DEFAULT" $a >"$tmp/out" 2>"$tmp/err"
        check "bench serve $a: status $?, not 1" [ $? -eq 1 ]
        check "bench serve $a: the error does not name ${a%% *}: $(cat "$tmp/err")" grep -qF -- "${a%% *}" "$tmp/err"
        check "bench serve $a: stdout $(head -c 200 "$tmp/out")" [ ! -s "$tmp/out" ]
    done
    "$KILN" bench serve >"$tmp/out" 2>"$tmp/err"
    check "bench serve without --url or -m: status $?" [ $? -eq 1 ]
}
run test_serve_bench
test_exit
