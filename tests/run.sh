#!/usr/bin/env bash
# Runs every test program given and prints the summary line "N passed, N failed, N skipped".
# Each program prints "ok X", "FAIL X: ..." or "skip X: ..." per test; a program that exits abnormally
# without reporting a failure counts as one failed test.
#
# Programs run KILN_TEST_JOBS at a time (default: the cores, nproc), each with its output captured, and are reported
# in the order given. They are independent: temporary files carry the pid or come from mktemp, and servers listen on
# port 0. The GPU programs (test_cuda_*, test_dist*) run one at a time after the others, alone on the device.
jobs=${KILN_TEST_JOBS:-$(nproc 2>/dev/null || echo 1)}
case $jobs in '' | *[!0-9]* | 0) jobs=1 ;; esac
dir=$(mktemp -d "${TMPDIR:-/tmp}/kiln-run-XXXXXX") || exit 1
trap 'rm -rf "$dir"' EXIT

# start I PROGRAM: runs it in the background into $dir/I.out and $dir/I.rc.
start() { ( "$2" >"$dir/$1.out" 2>&1; echo $? >"$dir/$1.rc" ) & }

progs=("$@")
serial=()
for i in "${!progs[@]}"; do
  case $(basename "${progs[$i]}") in
  test_cuda_* | test_dist*) serial+=("$i"); continue ;;
  esac
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
  start "$i" "${progs[$i]}"
done
wait
for i in "${serial[@]}"; do
  start "$i" "${progs[$i]}"
  wait
done

pass=0; fail=0; skip=0
for i in "${!progs[@]}"; do
  t=${progs[$i]}
  out=$(cat "$dir/$i.out" 2>/dev/null); rc=$(cat "$dir/$i.rc" 2>/dev/null || echo 127)
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
