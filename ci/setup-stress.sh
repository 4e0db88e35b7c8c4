#!/bin/bash
# ci/setup-stress.sh --rounds N [--procs P] [--threads T] [--comms C] [--iters I] [--hogs H]:
# the connection-setup stress campaign (docs/setup-stress.md). Each round starts P rank
# processes over softroce (127.0.87.x), T threads each, every thread listening, connecting and
# accepting C comms with every other rank in each direction, I times (each setup closed before
# the next), under H busy-loop CPU hogs (default 2 x cores); every comm carries one checked
# message. Prints one line per round, the failures with the process, thread and WARN lines, and
# "setup stress: F failed rounds of N". Exit status 0 only when no round failed; the logs of a
# failed round are kept (the line says where). Builds the test binary if needed (cargo).
set -u
cd "$(dirname "$0")/.." || exit 1
rounds=10
while [ $# -gt 0 ]; do
    case $1 in
        --rounds) rounds=${2:?--rounds needs a value}; shift 2 ;;
        --procs) export SETUP_STRESS_PROCS=${2:?}; shift 2 ;;
        --threads) export SETUP_STRESS_THREADS=${2:?}; shift 2 ;;
        --comms) export SETUP_STRESS_COMMS=${2:?}; shift 2 ;;
        --iters) export SETUP_STRESS_ITERS=${2:?}; shift 2 ;;
        --hogs) export SETUP_STRESS_HOGS=${2:?}; shift 2 ;;
        *) echo "usage: $0 --rounds N [--procs P] [--threads T] [--comms C] [--iters I] [--hogs H]"; exit 2 ;;
    esac
done
for f in target/release/softroce/libibverbs.so.1 target/release/softroce/softroce-ctl; do
    [ -e "$f" ] || { echo "setup-stress: missing $f (run make build)"; exit 1; }
done
# each round is bounded by SETUP_STRESS_ROUND_SEC (90 s); the whole campaign by that per round
limit=$((rounds * ${SETUP_STRESS_ROUND_SEC:-90} + 300))
FERROCE_TEST_SOFTROCE=1 SETUP_STRESS_ROUNDS=$rounds timeout -k 10 "$limit" \
    cargo test --release -q --test setup_stress_softroce -- --ignored --exact setup_stress_campaign --nocapture 2>&1 |
    grep -v '^$'
rc=${PIPESTATUS[0]}
[ "$rc" -eq 124 ] && echo "setup-stress: FAIL: the campaign did not end within $limit s"
exit "$rc"
