#!/bin/sh
# A close that loses nothing, under loss (docs/design/data-path.md#closing). Three cases, each
# under 1 % and 5 % loss with as much reordering and duplication (SOFTROCE_LOSS,
# SOFTROCE_REORDER, SOFTROCE_DUP) and NCCL_IB_TIMEOUT=14 (a lost last acknowledgement exhausts
# the 7 retries in about 0.5 s, well within each run):
#   * eager, cts: the two-process close cases of 40-datapath.sh. The receiver takes 20 messages
#     on comm 0 and closes it (odd runs at once, even runs after 0.5 s as in 40-datapath.sh);
#     the sender's sends for those 20 must complete, the ones after must fail with one WARN
#     that says the peer closed the connection and what they waited for (the eager path on:
#     the receiver's answer to an eager message, or when the receiver closed at once perhaps
#     its buffer; off: its buffer), and comm 1 must finish;
#   * last: both ends move 30 messages per comm and the receiver closes as soon as it took the
#     last one: the sender must finish every send with no error and no WARN (before wire
#     version 7 a lost last acknowledgement failed it with "transport retry counter exceeded").
#   CLOSE_RUNS=N    runs of each case at each loss rate (default 20: make test)
#   CLOSE_LOSSES="0.01 0.05"   the loss rates
#   CLOSE_CASES="eager cts last"  the cases
#   CLOSE_BUDGET_SEC=S         stop starting runs after S seconds (default 900); what ran counts
#   CLOSE_LOGDIR=DIR           keep the logs of failed runs there
#   CLOSE_SLOT=1               the upper half of the addresses (two campaigns at once)
#   CLOSE_ENV="VAR=x ..."      more settings for both ends (FERROCE_WIRE_VERSION=6: as before
#                              version 7, where a lost last acknowledgement fails the sender)
#
# The campaign of docs/reliability.md: CLOSE_RUNS=200 CLOSE_BUDGET_SEC=100000 ci/tests/41-close-loss.sh
# Addresses 127.0.43.x. Prints one line per case and loss rate (runs, failures), then
# "close-loss: N passed, M failed"; non-zero exit on any failure.
set -u
cd "$(dirname "$0")/../.."
R=target/release
PLUGIN=$PWD/$R/libnccl-net-ferroce.so
T=$PWD/$R/c_shim/datapath_test
runs=${CLOSE_RUNS:-20}
losses=${CLOSE_LOSSES:-0.01 0.05}
budget=${CLOSE_BUDGET_SEC:-900}
if [ ! -x "$T" ] || [ ! -f "$PLUGIN" ] || [ ! -f $R/softroce/libibverbs.so.1 ]; then
    echo "FAILED: build first (make build: plugin, softroce, c_shim)"
    echo "close-loss: 0 passed, 1 failed"
    exit 1
fi
export LD_LIBRARY_PATH="$PWD/$R/softroce${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_SOCKET_IFNAME=lo FERROCE_CONNECT_TIMEOUT_SEC=30
tmp=$(mktemp -d)
rp=""
cleanup() {
    [ -n "$rp" ] && kill -9 "$rp" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT INT TERM
addr=0
slot=${CLOSE_SLOT:-0}
# Sets $A to the next address of 127.0.43.1-124 (CLOSE_SLOT=1: .125-.248, for a second run at
# the same time); runs are sequential, so reuse is safe.
next_addr() {
    addr=$((addr % 124 + 1))
    A="127.0.43.$((addr + slot * 124))"
}
start=$(date +%s)
pass=0
fail=0
st="FERROCE_STATS=$tmp/stats"
mkdir -p "$tmp/stats"
common="-g 100 -S 224 -1 -D -c 2 -t 30"

# one NAME ENVS RECV-OPTS SEND-OPTS: one run of the pair; 0 when both ends passed.
one() {
    name=$1 envs=$2 ropts=$3 sopts=$4
    next_addr; a=$A; next_addr; b=$A
    h="$tmp/handle"
    rm -f "$h"
    env $envs SOFTROCE_ADDR=$a timeout 120 "$T" "$PLUGIN" 12 recv "$h" $ropts >"$tmp/recv" 2>&1 &
    rp=$!
    env $envs SOFTROCE_ADDR=$b timeout 120 "$T" "$PLUGIN" 12 send "$h" $sopts >"$tmp/send" 2>&1
    src=$?
    wait $rp
    rrc=$?
    rp=""
    [ $src -eq 0 ] && [ $rrc -eq 0 ] && return 0
    echo "    FAILED run ($name): receiver rc $rrc, sender rc $src"
    grep -h "FAIL\|WARN" "$tmp/send" "$tmp/recv" | head -6 | cut -c1-400
    if [ -n "${CLOSE_LOGDIR:-}" ]; then
        mkdir -p "$CLOSE_LOGDIR"
        k=$(date +%s%N)
        cp "$tmp/send" "$CLOSE_LOGDIR/$k.send"
        cp "$tmp/recv" "$CLOSE_LOGDIR/$k.recv"
    fi
    return 1
}

for loss in $losses; do
    faults="SOFTROCE_LOSS=$loss SOFTROCE_REORDER=$loss SOFTROCE_DUP=$loss NCCL_IB_TIMEOUT=14 ${CLOSE_ENV:-}"
    for c in ${CLOSE_CASES:-eager cts last}; do
        n=0 bad=0
        while [ $n -lt "$runs" ] && [ $(( $(date +%s) - start )) -lt "$budget" ]; do
            n=$((n + 1))
            wait_ms=$(( n % 2 == 1 ? 0 : 500 ))
            case $c in
                # Closed at once, the receiver's report may come before the sender's next
                # eager messages go: then the isend fails (no buffer), not their answer.
                eager) envs="$st $faults" ropts="$common -A 20 -a $wait_ms" sopts="$common -A 20 -w 4 -W $( [ $wait_ms -gt 0 ] && echo answer || echo closed) -E 1" ;;
                cts) envs="$st $faults FERROCE_EAGER_MAX=0" ropts="$common -A 20 -a $wait_ms" sopts="$common -A 20 -w 4 -W buffer -E 0" ;;
                *) envs="$st $faults" ropts="-g 30 -S 224 -1 -D -c 2 -t 30" sopts="$ropts" ;;
            esac
            one "$c close, loss $loss, run $n" "$envs" "$ropts" "$sopts" || bad=$((bad + 1))
        done
        echo "--- $c close, loss/reorder/dup $loss: $n runs, $bad failed ($(( $(date +%s) - start )) s so far)"
        if [ $bad -eq 0 ] && [ $n -gt 0 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); fi
    done
done
echo "close-loss: $pass passed, $fail failed"
[ $fail -eq 0 ]
