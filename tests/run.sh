#!/usr/bin/env bash
# Runs every test program given and prints the summary line "N passed, N failed, N skipped".
# Each program prints "ok X", "FAIL X: ..." or "skip X: ..." per test; a program that exits abnormally
# without reporting a failure counts as one failed test.
pass=0; fail=0; skip=0
for t in "$@"; do
  out=$("$t" 2>&1); rc=$?
  printf '%s\n' "$out" | grep -E '^(ok|FAIL|skip) ' | sed "s|^|[$(basename "$t")] |"
  p=$(printf '%s\n' "$out" | grep -c '^ok ')
  f=$(printf '%s\n' "$out" | grep -c '^FAIL ')
  s=$(printf '%s\n' "$out" | grep -c '^skip ')
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
    echo "[$(basename "$t")] FAIL exited with status $rc:"; printf '%s\n' "$out" | tail -n 20
    f=1
  fi
  pass=$((pass + p)); fail=$((fail + f)); skip=$((skip + s))
done
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
