#!/bin/bash
# Connection setup under load (docs/setup-stress.md): a bounded campaign of ci/setup-stress.sh,
# 4 rank processes over softroce (127.0.87.x), 4 threads each, connecting and accepting with
# every other rank in both directions over the shared side-channel links, 3 setups a round each
# closed before the next, under 2 x cores busy-loop CPU hogs; every comm carries one checked
# message. One check per round; a failed round shows its processes, threads and WARN lines. Then
# the campaign must catch a broken setup: when one rank goes away after publishing its handles
# (SETUP_STRESS_QUIT_RANK), the round must fail and name the other rank's process and thread.
# (A connector that gives up telling its listener why is a test of the cargo stage:
# tests/setup_stress_softroce.rs, a_connector_that_gives_up_tells_the_listener_why.)
set -u
cd "$(dirname "$0")/../.." || exit 1
# shellcheck source=ci/tests/lib/checks.sh
. ci/tests/lib/checks.sh
need target/release/softroce/libibverbs.so.1
T=$(mktemp -d /tmp/ferroce-85-setup-stress.XXXXXX) || exit 1
# the campaign keeps a failed round's logs under TMPDIR: here, removed on exit
export TMPDIR=$T
trap 'rm -rf "$T"' EXIT
ROUNDS=${SETUP_STRESS_CI_ROUNDS:-20}
SETUP_STRESS_ROUND_SEC=60 ci/setup-stress.sh --rounds "$ROUNDS" --procs 4 --threads 4 --comms 2 --iters 3 >"$T/out" 2>&1
rc=$?
cat "$T/out"
for r in $(seq 0 $((ROUNDS - 1))); do
    if grep -q "^round $r: ok" "$T/out"; then ok "round $r"; else ko "round $r" "$T/out"; fi
done
if [ "$rc" -eq 0 ] && grep -q "^setup stress: 0 failed rounds of $ROUNDS " "$T/out"; then
    ok "campaign of $ROUNDS rounds"
else
    ko "campaign of $ROUNDS rounds (exit $rc)" "$T/out"
fi
echo "== a setup that cannot finish in time must fail the round"
SETUP_STRESS_CONNECT_TIMEOUT_SEC=2 SETUP_STRESS_QUIT_RANK=1 SETUP_STRESS_ROUND_SEC=30 \
    ci/setup-stress.sh --rounds 1 --procs 2 --threads 1 --comms 1 --iters 1 --hogs 0 >"$T/broken" 2>&1
rc=$?
if [ "$rc" -ne 0 ] && grep -q "^setup stress: 1 failed rounds of 1 " "$T/broken" && grep -qE "FAIL rank 0 thread 0: " "$T/broken"; then
    ok "a broken setup is reported with its process and thread"
else
    ko "a broken setup is reported with its process and thread (exit $rc)" "$T/broken"
fi
finish
