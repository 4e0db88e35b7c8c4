# The result bookkeeping every ci/tests script shares (sourced, not run): PASS/FAIL counters,
# ok NAME, ko NAME [FILE...] (the tail of each file it names, to show why), need FILE... (a
# missing build output is a failure, never a skip) and finish (the "N passed, M failed" line
# run-tests.sh reads, and the exit status).
# shellcheck shell=bash
PASS=0
FAIL=0
ok() { PASS=$((PASS + 1)); echo "   PASS $1"; }
ko() {
    FAIL=$((FAIL + 1))
    echo "   FAIL $1"
    shift
    for f in "$@"; do
        [ -e "$f" ] && { echo "   --- $(basename "$f"):"; tail -n 30 "$f" | sed 's/^/   | /'; }
    done
}
need() {
    for f in "$@"; do
        if [ ! -e "$f" ]; then
            echo "missing $f (run make build)"
            echo "0 passed, 1 failed"
            exit 1
        fi
    done
}
finish() {
    echo "$PASS passed, $FAIL failed"
    [ "$FAIL" -eq 0 ]
    exit $?
}
