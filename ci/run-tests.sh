#!/bin/sh
# Runs every ci/tests/*.sh in name order (each is self-contained, time-bounded and cleans up),
# and fails if any failed. A script without its run bit is a failure, not a silent skip (a
# `git add` without `chmod +x` would otherwise drop it from every run). Prints one summary line.
set -u
cd "$(dirname "$0")/.." || exit 1
pass=0
fail=0
failed=""
for t in ci/tests/*.sh; do
    echo "=== $t"
    if [ ! -x "$t" ]; then
        fail=$((fail + 1))
        failed="$failed $t"
        echo "=== $t: FAILED (not executable: chmod +x it)"
        continue
    fi
    start=$(date +%s)
    if "$t"; then
        pass=$((pass + 1))
        echo "=== $t: ok ($(( $(date +%s) - start )) s)"
    else
        fail=$((fail + 1))
        failed="$failed $t"
        echo "=== $t: FAILED ($(( $(date +%s) - start )) s)"
    fi
done
[ -z "$failed" ] || echo "failed scripts:$failed"
echo "test scripts: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
