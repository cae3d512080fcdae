# test.sh: the shell twin of test.h, sourced by the tests/test_*.sh scripts. A test is a function; run NAME runs
# it in a subshell and prints "ok NAME", "FAIL NAME: why" or "skip NAME: reason" for tests/run.sh to count. Inside
# a test, check COND... WHY fails it when the command COND fails, skip REASON ends it as skipped, and
# test_exit ends the script with status 1 when any test failed.
test_n_failed_=0

check() { # check MESSAGE COMMAND...: runs COMMAND; if it fails, the test fails with MESSAGE
    local why=$1; shift
    "$@" && return 0
    echo "$why" >"$test_msg_file_"
    exit 1
}
skip() {
    echo "$*" >"$test_msg_file_"
    exit 77
}
run() {
    test_msg_file_=$(mktemp)
    (set -u; "$1"); local rc=$?
    local msg; msg=$(head -c 2000 "$test_msg_file_" | tr '\n' ' ' | sed 's/ *$//')
    rm -f "$test_msg_file_"
    case $rc in
    0) echo "ok $1" ;;
    77) echo "skip $1: $msg" ;;
    *) echo "FAIL $1: ${msg:-exited with status $rc}"; test_n_failed_=$((test_n_failed_ + 1)) ;;
    esac
}
test_exit() { [ "$test_n_failed_" -eq 0 ]; exit; }
