#!/bin/sh
# Runs every ci/tests/*.sh in name order (each is self-contained, time-bounded and cleans up),
# and fails if any failed. Prints one summary line.
set -u
cd "$(dirname "$0")/.."
pass=0
fail=0
failed=""
for t in ci/tests/*.sh; do
    [ -x "$t" ] || continue
    echo "=== $t"
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
