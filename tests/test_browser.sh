#!/usr/bin/env bash
# test_browser.sh: the workbench's page end to end in headless Chromium (tests/serve/browser.py, Selenium) against
# `kiln serve --workbench --api-key KEY` on loopback over a fresh data folder: the key typed into the page, a corpus
# uploaded, a tokenizer trained and measured, the live tokenize box, shards, 50 steps of the tiny preset with the
# chart growing, a reload that follows a running job again and stops it, and text generated from the run with its
# top-5 tooltip (and, with SmolLM2-135M-Instruct in ~/.cache/kiln, a chat turn). A screenshot of each tab (1280x900)
# goes to $KILN_SCREENSHOTS (default: the temp folder, removed).
# Skips with one line where chromium, chromedriver or selenium is missing.
cd "$(dirname "$0")/.." || exit 1
. tests/test.sh
KILN=${KILN_BIN:-build/kiln}
KEY=kiln-browser-key-0123456789
CHROMIUM=${KILN_CHROMIUM:-/usr/bin/chromium}
CHROMEDRIVER=${KILN_CHROMEDRIVER:-/usr/bin/chromedriver}
tmp=$(mktemp -d) || exit 1
SRV_PID=
trap '[ -n "$SRV_PID" ] && kill -9 "$SRV_PID" 2>/dev/null; rm -rf "$tmp"' EXIT

if ! "$KILN" serve --version >/dev/null 2>&1; then
    echo "skip test_browser: $KILN has no serve command"; exit 0
fi
[ -x "$CHROMIUM" ] || { echo "skip test_browser: no chromium at $CHROMIUM (apt install chromium)"; exit 0; }
[ -x "$CHROMEDRIVER" ] || { echo "skip test_browser: no chromedriver at $CHROMEDRIVER (apt install chromium-driver)"; exit 0; }
python3 -c 'import selenium' 2>/dev/null || { echo "skip test_browser: the python package selenium is missing (pip install selenium)"; exit 0; }

# The chat check's model: SmolLM2-135M-Instruct (tests/ref/fetch_models.sh) linked into the data folder's models/.
CHAT_MODEL=$HOME/.cache/kiln/smollm2-135m-instruct-q4_1.gguf
CHAT_ARG=
if [ -f "$CHAT_MODEL" ]; then
    mkdir -p "$tmp/wb/models" && ln -s "$CHAT_MODEL" "$tmp/wb/models/smollm2-chat.gguf" && CHAT_ARG=--chat-model=smollm2-chat.gguf
fi

# start: kiln serve --workbench --port 0 over $tmp/wb; waits (30 s at most) for its "listening on" line.
start() {
    SRV_LOG=$tmp/serve.log
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
        echo "FAIL browser_start: $(tail -n 3 "$SRV_LOG" | tr '\n' ' ' | head -c 600)"; test_n_failed_=$((test_n_failed_ + 1))
        SRV_PID=; return 1
    fi
    SRV_URL=http://127.0.0.1:$port
}

# stop: SIGTERM, then status 0 within 30 s.
stop() {
    local i rc
    kill -TERM "$SRV_PID" 2>/dev/null
    for i in $(seq 1 300); do kill -0 "$SRV_PID" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$SRV_PID" 2>/dev/null; then
        echo "FAIL browser_exit: still running 30 s after SIGTERM"; test_n_failed_=$((test_n_failed_ + 1)); kill -9 "$SRV_PID"
    else
        wait "$SRV_PID"; rc=$?
        if [ "$rc" -eq 0 ]; then echo "ok browser_exit"
        else echo "FAIL browser_exit: status $rc: $(tail -n 2 "$SRV_LOG" | tr '\n' ' ' | head -c 400)"; test_n_failed_=$((test_n_failed_ + 1)); fi
    fi
    SRV_PID=
}

# checks: browser.py's lines; its FAILs count, and so does a crash that printed none.
checks() {
    local out rc n
    out=$(python3 tests/serve/browser.py --url "$SRV_URL" --api-key "$KEY" --tmp "$tmp" --shots "${KILN_SCREENSHOTS:-$tmp/shots}" \
          --chromium "$CHROMIUM" --chromedriver "$CHROMEDRIVER" $CHAT_ARG "$@" 2>&1); rc=$?
    printf '%s\n' "$out" | grep -E '^(ok|FAIL|skip|note) '
    n=$(printf '%s\n' "$out" | grep -c '^FAIL ')
    if [ "$rc" -ne 0 ] && [ "$n" -eq 0 ]; then
        echo "FAIL browser_checks: status $rc: $(printf '%s\n' "$out" | tail -n 3 | tr '\n' ' ' | head -c 600)"; n=1
    fi
    test_n_failed_=$((test_n_failed_ + n))
}

if start; then
    checks "$@"
    stop
fi
test_exit
