#!/usr/bin/env bash
# test_workbench.sh: the workbench's job API (kiln serve --workbench, no model) end to end on loopback, by
# tests/serve/workbench.py (the standard library only): a corpus uploaded, a tokenizer trained, shards made, ~50 steps
# of the tiny preset trained on the CPU with its SSE events checked live, a second run stopped mid-way, a job that
# fails with the library's error; then the server is restarted on the same data folder (SIGTERM must end it with
# status 0) and every job must be listed with its final state, and `kiln generate` must run the first run's export.
# The corpus is a slice of ../shared/data/corpora/english where it is, else words from a fixed seed.
cd "$(dirname "$0")/.." || exit 1
. tests/test.sh
KILN=${KILN_BIN:-build/kiln}
KEY=kiln-wb-key-0123456789
tmp=$(mktemp -d) || exit 1
SRV_PID=
trap '[ -n "$SRV_PID" ] && kill -9 "$SRV_PID" 2>/dev/null; rm -rf "$tmp"' EXIT

if ! "$KILN" serve --version >/dev/null 2>&1; then
    echo "skip test_workbench: $KILN has no serve command"; exit 0
fi

# start NAME: kiln serve --workbench --port 0 over $tmp/wb; waits (30 s at most) for its "listening on" line.
start() {
    SRV_LOG=$tmp/$1.log
    "$KILN" serve --workbench --port 0 --data-dir "$tmp/wb" --api-key "$KEY" 2>"$SRV_LOG" &
    SRV_PID=$!
    local i port=
    for i in $(seq 1 300); do
        port=$(sed -n 's|.*listening on http://127\.0\.0\.1:\([0-9][0-9]*\).*|\1|p' "$SRV_LOG" | head -n1)
        [ -n "$port" ] && break
        kill -0 "$SRV_PID" 2>/dev/null || break
        sleep 0.1
    done
    if [ -z "$port" ]; then
        echo "FAIL workbench_${1}_start: $(tail -n 3 "$SRV_LOG" | tr '\n' ' ' | head -c 600)"; test_n_failed_=$((test_n_failed_ + 1))
        SRV_PID=; return 1
    fi
    SRV_URL=http://127.0.0.1:$port
}

# stop NAME: SIGTERM, then status 0 within 30 s.
stop() {
    local i rc
    kill -TERM "$SRV_PID" 2>/dev/null
    for i in $(seq 1 300); do kill -0 "$SRV_PID" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$SRV_PID" 2>/dev/null; then
        echo "FAIL workbench_${1}_exit: still running 30 s after SIGTERM"; test_n_failed_=$((test_n_failed_ + 1)); kill -9 "$SRV_PID"
    else
        wait "$SRV_PID"; rc=$?
        if [ "$rc" -eq 0 ]; then echo "ok workbench_${1}_exit"
        else echo "FAIL workbench_${1}_exit: status $rc: $(tail -n 2 "$SRV_LOG" | tr '\n' ' ' | head -c 400)"; test_n_failed_=$((test_n_failed_ + 1)); fi
    fi
    SRV_PID=
}

# checks PHASE: workbench.py's lines; its FAILs count, and so does a crash that printed none.
checks() {
    local out rc n
    out=$(python3 tests/serve/workbench.py --url "$SRV_URL" --kiln "$KILN" --api-key "$KEY" --state "$tmp/state.json" "$1" 2>&1); rc=$?
    printf '%s\n' "$out" | grep -E '^(ok|FAIL|skip) '
    n=$(printf '%s\n' "$out" | grep -c '^FAIL ')
    if [ "$rc" -ne 0 ] && [ "$n" -eq 0 ]; then
        echo "FAIL workbench_${1}_checks: status $rc: $(printf '%s\n' "$out" | tail -n 3 | tr '\n' ' ' | head -c 600)"; n=1
    fi
    test_n_failed_=$((test_n_failed_ + n))
}

# beyond loopback the workbench needs a key: refused at the start, with the flag named
out=$("$KILN" serve --workbench --host 0.0.0.0 --port 0 --data-dir "$tmp/refused" 2>&1); rc=$?
if [ "$rc" -ne 0 ] && printf '%s' "$out" | grep -q 'needs --api-key' && [ ! -e "$tmp/refused" ]; then echo "ok workbench_beyond_loopback_needs_key"
else echo "FAIL workbench_beyond_loopback_needs_key: status $rc: $(printf '%s' "$out" | head -c 300)"; test_n_failed_=$((test_n_failed_ + 1)); fi

if start first; then
    checks before
    stop first
    if start second; then
        checks after
        stop second
    fi
fi
test_exit
