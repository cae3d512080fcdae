#!/usr/bin/env bash
# test_train_faults.sh: `kiln train` when things go wrong (issue 17), through the CLI: numeric flags refused with the
# flag named and nothing written; a log on a full disk (/dev/full); -o in a folder it cannot write, refused before
# step 1; a disk that fills at the second checkpoint (a small tmpfs when mount works, else an LD_PRELOAD shim that
# answers ENOSPC) ending in one error line, the first checkpoint whole and resumable and the export still written;
# and SIGKILL at random moments of a run that checkpoints every step, ten times, each resume continuing from a whole
# checkpoint. KILN_BIN is the kiln under test (make test sets it).
cd "$(dirname "$0")/.." || exit 1
. tests/test.sh
KILN=${KILN_BIN:-build/kiln}
tmp=$(mktemp -d /tmp/kiln-faults-XXXXXX) || exit 1
mnt=$tmp/mnt
trap 'mountpoint -q "$mnt" 2>/dev/null && umount "$mnt"; rm -rf "$tmp"' EXIT

# A corpus, a tokenizer trained on it and shards, once for every test.
setup() {
    awk 'BEGIN { srand(5); split("the king queen said to my lord and good night sweet prince", w, " ");
                 for (i = 0; i < 6000; i++) printf "%s%s", w[int(rand() * 12) + 1], (i % 13 == 12) ? ".\n" : " " }' >"$tmp/corpus.txt" &&
        "$KILN" tokenizer train "$tmp/corpus.txt" --vocab 300 -o "$tmp/tok.gguf" >/dev/null 2>&1 &&
        "$KILN" data "$tmp/corpus.txt" -t "$tmp/tok.gguf" -o "$tmp/data" --val-fraction 0.1 >/dev/null 2>&1
}
SMALL=(-C 32 -L 2 --heads 4 --kv-heads 2 -F 64 -B 2 -T 16 --eval-batches 0 -j 1)
train() { "$KILN" train --data "$tmp/data" -t "$tmp/tok.gguf" "$@"; }
# Succeeds when the command fails.
fails() { ! "$@"; }
# The number of lines of file $1 that start with "kiln:" (the CLI's errors).
errors() { grep -c '^kiln:' "$1"; }

test_numeric_flags_refused() {
    local f v i=0
    for fv in "--lr nan" "--lr abc" "--lr inf" "--clip -1" "--time -5" "--label-smoothing 5" "--warmup 1e12" "--steps abc" \
              "--steps 0" "--beta1 1" "--beta2 -0.1" "-B 0" "-T 1" "--seed -3" "-j x" "--wd 1e3" "--eval-every 2.5" "--min-lr -1"; do
        f=${fv%% *} v=${fv#* }
        i=$((i + 1))
        train "${SMALL[@]}" --steps 3 "$f" "$v" -o "$tmp/flag$i.gguf" >/dev/null 2>"$tmp/flag.err"
        check "$fv: accepted (status 0)" [ $? -ne 0 ]
        check "$fv: said '$(head -c 300 "$tmp/flag.err")'" grep -q -- "$f" "$tmp/flag.err"
        check "$fv: more than one line: $(head -c 300 "$tmp/flag.err")" [ "$(wc -l <"$tmp/flag.err")" -eq 1 ]
        check "$fv: wrote an export" [ ! -e "$tmp/flag$i.gguf" ]
    done
    # warmup past the run, and a floor above the peak, are refused too (they parse, but mean nothing)
    train "${SMALL[@]}" --steps 3 --warmup 5 -o "$tmp/w.gguf" >/dev/null 2>"$tmp/flag.err"
    check "--warmup 5 of 3 steps accepted" [ $? -ne 0 ]
    check "--warmup 5: $(cat "$tmp/flag.err")" grep -q -- "--warmup" "$tmp/flag.err"
}

test_log_on_full_disk() {
    [ -w /dev/full ] || skip "no writable /dev/full"
    train "${SMALL[@]}" --steps 3 --log /dev/full -o "$tmp/lf.gguf" >/dev/null 2>"$tmp/lf.err"
    check "a run whose log cannot be written exited 0" [ $? -ne 0 ]
    check "the error does not name the log: $(cat "$tmp/lf.err")" grep -q '^kiln: /dev/full: cannot write the log' "$tmp/lf.err"
    check "more than one error line: $(cat "$tmp/lf.err")" [ "$(errors "$tmp/lf.err")" -eq 1 ]
}

test_unwritable_output_refused_first() {
    local ro=$tmp/ro
    mkdir -p "$ro"
    if [ "$(id -u)" -ne 0 ]; then
        chmod 555 "$ro"
    elif ! mount -t tmpfs -o size=1m,ro tmpfs "$ro" 2>/dev/null; then
        skip "root without mount: no folder root cannot write"
    fi
    train "${SMALL[@]}" --steps 50 -o "$ro/out.gguf" >/dev/null 2>"$tmp/ro.err"
    local rc=$?
    mountpoint -q "$ro" && umount "$ro"
    check "a read-only -o was accepted" [ $rc -ne 0 ]
    check "said: $(cat "$tmp/ro.err")" grep -q "cannot write the export" "$tmp/ro.err"
    check "trained before failing: $(head -c 300 "$tmp/ro.err")" fails grep -q '^step ' "$tmp/ro.err"
}

# A disk without room for one checkpoint (statvfs against the checkpoint's size) is refused before step 1.
test_no_room_refused_first() {
    local small=$tmp/small
    mkdir -p "$small"
    mount -t tmpfs -o size=256k tmpfs "$small" 2>/dev/null || skip "mount -t tmpfs is not allowed here"
    train -C 64 -L 2 --heads 4 --kv-heads 2 -F 128 -B 2 -T 16 --eval-batches 0 -j 1 --steps 50 --ckpt "$small/c.gguf" \
        -o "$tmp/room.gguf" >/dev/null 2>"$tmp/room.err"
    local rc=$?
    umount "$small"
    check "a checkpoint on a 256 KiB disk was accepted" [ $rc -ne 0 ]
    check "said: $(cat "$tmp/room.err")" grep -q "MB free; the checkpoint (--ckpt) needs about" "$tmp/room.err"
    check "trained before failing: $(head -c 300 "$tmp/room.err")" fails grep -q '^step ' "$tmp/room.err"
}

# The shim for machines without mount: write() to a temp file of the GGUF writer (a name with ".tmp.") fails with
# ENOSPC once KILN_TEST_ENOSPC_BYTES bytes have gone to such files in this process.
build_enospc_shim() {
    cat >"$tmp/enospc.c" <<'EOF'
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
static long long written;
ssize_t write(int fd, const void *buf, size_t n) {
    static ssize_t (*real)(int, const void *, size_t);
    if (!real) real = (ssize_t (*)(int, const void *, size_t))dlsym(RTLD_NEXT, "write");
    char link[64], target[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t k = readlink(link, target, sizeof target - 1);
    if (k > 0 && (target[k] = 0, strstr(target, ".tmp."))) {
        const char *lim = getenv("KILN_TEST_ENOSPC_BYTES");
        if (lim && written + (long long)n > atoll(lim)) {
            errno = ENOSPC;
            return -1;
        }
        written += (long long)n;
    }
    return real(fd, buf, n);
}
EOF
    ${KILN_CC:-cc} -shared -fPIC -O1 -o "$tmp/enospc.so" "$tmp/enospc.c" -ldl 2>/dev/null
}

test_disk_full_at_second_checkpoint() {
    local args=(-C 64 -L 2 --heads 4 --kv-heads 2 -F 128 -B 2 -T 16 --eval-batches 0 -j 1 --steps 4 --ckpt-every 1)
    # the checkpoint's size, from a run on the ordinary disk
    train "${args[@]}" --ckpt "$tmp/size.ckpt.gguf" >/dev/null 2>&1
    check "the sizing run failed" [ -s "$tmp/size.ckpt.gguf" ]
    local size dir env=() how
    size=$(stat -c %s "$tmp/size.ckpt.gguf")
    mkdir -p "$mnt"
    # room for the preflight's estimate (the checkpoint plus 1 MiB), not for a second checkpoint beside the first
    if mount -t tmpfs -o size=$((size + 1048576 + 65536)) tmpfs "$mnt" 2>/dev/null; then
        how=tmpfs
    elif build_enospc_shim; then
        how=shim env=(env LD_PRELOAD="$tmp/enospc.so" KILN_TEST_ENOSPC_BYTES=$((size + size / 2)))
    else
        skip "neither mount -t tmpfs nor a C compiler for an ENOSPC shim"
    fi
    dir=$mnt
    "${env[@]}" "$KILN" train --data "$tmp/data" -t "$tmp/tok.gguf" "${args[@]}" --ckpt "$dir/full.ckpt.gguf" \
        -o "$tmp/full.out.gguf" >/dev/null 2>"$tmp/full.err"
    local rc=$?
    check "$how: a run that could not checkpoint exited 0" [ $rc -ne 0 ]
    check "$how: not one error line: $(grep '^kiln:' "$tmp/full.err" | head -c 600)" [ "$(errors "$tmp/full.err")" -eq 1 ]
    check "$how: the error: $(grep '^kiln:' "$tmp/full.err" | head -c 600)" grep -q "^kiln: .*full.ckpt.gguf.*exported to" "$tmp/full.err"
    check "$how: the final export is missing" "$KILN" inspect "$tmp/full.out.gguf" >/dev/null 2>&1
    check "$how: a temp file was left: $(ls "$dir")" [ -z "$(ls "$dir" | grep '\.tmp\.')" ]
    check "$how: the first checkpoint is not whole" "$KILN" inspect "$dir/full.ckpt.gguf" >/dev/null 2>&1
    # with room again the checkpoint resumes (the resume checks every tensor and key)
    cp "$dir/full.ckpt.gguf" "$tmp/resume.ckpt.gguf"
    mountpoint -q "$mnt" && umount "$mnt"
    train "${args[@]}" --resume "$tmp/resume.ckpt.gguf" --ckpt "$tmp/resume.ckpt.gguf" -o "$tmp/resumed.gguf" >/dev/null 2>"$tmp/res.err"
    check "$how: the resume failed: $(tail -c 400 "$tmp/res.err")" [ $? -eq 0 ]
}

# SIGKILL at ten random moments of a run that writes a checkpoint after every step: after each, the checkpoint on
# disk is whole (old or new), the next run resumes from it, and the run finally completes.
test_sigkill_during_checkpoints() {
    local args=(-C 64 -L 2 --heads 4 --kv-heads 2 -F 128 -B 2 -T 16 --eval-batches 0 -j 1 --steps 5000 --ckpt-every 1)
    local ck=$tmp/kill.ckpt.gguf it pid resumed=0 delay
    RANDOM=17
    for it in $(seq 1 10); do
        local from=()
        [ -e "$ck" ] && from=(--resume "$ck")
        [ -e "$ck" ] && resumed=$((resumed + 1))
        "$KILN" train --data "$tmp/data" -t "$tmp/tok.gguf" "${args[@]}" "${from[@]}" --ckpt "$ck" >/dev/null 2>"$tmp/kill.err" &
        pid=$!
        delay=$(printf '0.%03d' $((RANDOM % 700 + 150)))
        sleep "$delay"
        kill -9 "$pid" 2>/dev/null
        { wait "$pid"; } 2>/dev/null
        local rc=$?
        check "iteration $it: the run was not killed (status $rc): $(tail -c 400 "$tmp/kill.err")" [ $rc -eq 137 ]
        if [ -e "$ck" ]; then
            check "iteration $it: the checkpoint on disk is not whole" "$KILN" inspect "$ck" >/dev/null 2>&1
        fi
    done
    check "no checkpoint was ever resumed" [ $resumed -gt 0 ]
    # the last run resumes for half a second (its checkpoint and export are written when the time is up)
    train "${args[@]}" --resume "$ck" --ckpt "$ck" --time 0.5 -o "$tmp/kill.out.gguf" >/dev/null 2>"$tmp/kill.err"
    check "the final resume failed: $(tail -c 400 "$tmp/kill.err")" [ $? -eq 0 ]
    check "the final run left a temp file: $(ls "$tmp" | grep kill)" [ -z "$(ls "$tmp" | grep 'kill.ckpt.gguf.tmp.')" ]
}

if ! [ -x "$KILN" ]; then
    echo "skip test_train_faults: $KILN is not built"
    exit 0
fi
if ! setup; then
    echo "FAIL test_train_faults_setup: could not make the corpus, tokenizer and shards"
    exit 1
fi
run test_numeric_flags_refused
run test_log_on_full_disk
run test_unwritable_output_refused_first
run test_no_room_refused_first
run test_disk_full_at_second_checkpoint
run test_sigkill_during_checkpoints
test_exit
