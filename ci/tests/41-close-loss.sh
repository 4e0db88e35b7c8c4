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
#   CLOSE_RUNS=N    runs of each case at each loss rate (default 8)
#   CLOSE_LOSSES="0.01 0.05"   the loss rates
#   CLOSE_CASES="eager cts last"  the cases
#   CLOSE_BUDGET_SEC=S         stop starting runs after S seconds (default 900); what ran counts
#   CLOSE_LOGDIR=DIR           keep the logs of failed runs there
#   CLOSE_SLOT=1               the upper half of the addresses (two campaigns at once)
#   CLOSE_ENV="VAR=x ..."      more settings for both ends (FERROCE_WIRE_VERSION=6: as before
#                              version 7, where a lost last acknowledgement fails the sender)
# Each case at each loss rate is one chain of sequential runs, and the chains run at the same
# time: a run spends its time waiting (the 0.5 s close delay, retransmission timeouts), about
# 5 s of CPU in the 80 s the chains took one after another, so together they take about as long
# as the longest chain (make test: about 20 s).
#
# The campaign of docs/reliability.md: CLOSE_RUNS=200 CLOSE_BUDGET_SEC=100000 ci/tests/41-close-loss.sh
# Addresses 127.0.43.x, a block of them per chain. Prints one line per case and loss rate (runs,
# failures), then "close-loss: N passed, M failed"; non-zero exit on any failure.
set -u
cd "$(dirname "$0")/../.." || exit 1
R=target/release
PLUGIN=$PWD/$R/libnccl-net-ferroce.so
T=$PWD/$R/c_shim/datapath_test
runs=${CLOSE_RUNS:-8}
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
chains=""
cleanup() {
    # shellcheck disable=SC2086
    [ -n "$chains" ] && kill $chains 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT INT TERM
slot=${CLOSE_SLOT:-0}
n_chains=0
for loss in $losses; do for c in ${CLOSE_CASES:-eager cts last}; do n_chains=$((n_chains + 1)); done; done
# Each chain has a block of 127.0.43.1-124 (CLOSE_SLOT=1: .125-.248) to itself; its runs are
# sequential, so reusing its block's addresses is safe.
block=$((124 / n_chains))
if [ "$block" -lt 2 ]; then
    echo "FAILED: $n_chains chains leave fewer than 2 addresses each"
    echo "close-loss: 0 passed, 1 failed"
    exit 1
fi
start=$(date +%s)
common="-g 100 -S 224 -1 -D -c 2 -t 30"

# one DIR NAME ENVS RECV-OPTS SEND-OPTS: one run of the pair at addresses $a, $b; 0 when both
# ends passed.
one() {
    dir=$1 name=$2 envs=$3 ropts=$4 sopts=$5
    h="$dir/handle"
    rm -f "$h"
    # shellcheck disable=SC2086 # $envs and the options are word lists
    env $envs SOFTROCE_ADDR=$a timeout 120 "$T" "$PLUGIN" 12 recv "$h" $ropts >"$dir/recv" 2>&1 &
    rp=$!
    # shellcheck disable=SC2086
    env $envs SOFTROCE_ADDR=$b timeout 120 "$T" "$PLUGIN" 12 send "$h" $sopts >"$dir/send" 2>&1
    src=$?
    wait $rp
    rrc=$?
    [ $src -eq 0 ] && [ $rrc -eq 0 ] && return 0
    echo "    FAILED run ($name): receiver rc $rrc, sender rc $src"
    grep -h "FAIL\|WARN" "$dir/send" "$dir/recv" | head -6 | cut -c1-400
    if [ -n "${CLOSE_LOGDIR:-}" ]; then
        mkdir -p "$CLOSE_LOGDIR"
        k=$(date +%s%N)
        cp "$dir/send" "$CLOSE_LOGDIR/$k.send"
        cp "$dir/recv" "$CLOSE_LOGDIR/$k.recv"
    fi
    return 1
}

# chain K LOSS CASE: the runs of one case at one loss rate, in $tmp/K/ with address block K;
# its report in $tmp/K/report, "ok" or "failed" in $tmp/K/result.
chain() {
    k=$1 loss=$2 c=$3
    dir=$tmp/$k
    mkdir -p "$dir/stats"
    first=$((slot * 124 + (k - 1) * block + 1))
    faults="SOFTROCE_LOSS=$loss SOFTROCE_REORDER=$loss SOFTROCE_DUP=$loss NCCL_IB_TIMEOUT=14 ${CLOSE_ENV:-}"
    st="FERROCE_STATS=$dir/stats"
    n=0 bad=0 pair=0
    while [ $n -lt "$runs" ] && [ $(($(date +%s) - start)) -lt "$budget" ]; do
        n=$((n + 1))
        a=127.0.43.$((first + pair * 2))
        b=127.0.43.$((first + pair * 2 + 1))
        pair=$(((pair + 1) % (block / 2)))
        wait_ms=$((n % 2 == 1 ? 0 : 500))
        case $c in
            # Closed at once, the receiver's report may come before the sender's next
            # eager messages go: then the isend fails (no buffer), not their answer.
            eager) envs="$st $faults" ropts="$common -A 20 -a $wait_ms" sopts="$common -A 20 -w 4 -W $([ $wait_ms -gt 0 ] && echo answer || echo closed) -E 1" ;;
            cts) envs="$st $faults FERROCE_EAGER_MAX=0" ropts="$common -A 20 -a $wait_ms" sopts="$common -A 20 -w 4 -W buffer -E 0" ;;
            *) envs="$st $faults" ropts="-g 30 -S 224 -1 -D -c 2 -t 30" sopts="$ropts" ;;
        esac
        one "$dir" "$c close, loss $loss, run $n" "$envs" "$ropts" "$sopts" || bad=$((bad + 1))
    done
    echo "--- $c close, loss/reorder/dup $loss: $n runs, $bad failed ($(($(date +%s) - start)) s so far)"
    if [ $bad -eq 0 ] && [ $n -gt 0 ]; then echo ok >"$dir/result"; else echo failed >"$dir/result"; fi
}

k=0
for loss in $losses; do
    for c in ${CLOSE_CASES:-eager cts last}; do
        k=$((k + 1))
        mkdir -p "$tmp/$k"
        chain $k "$loss" "$c" >"$tmp/$k/report" 2>&1 &
        chains="$chains $!"
    done
done
# shellcheck disable=SC2086
wait $chains
chains=""
pass=0
fail=0
for i in $(seq "$n_chains"); do
    cat "$tmp/$i/report"
    if [ "$(cat "$tmp/$i/result" 2>/dev/null)" = ok ]; then pass=$((pass + 1)); else fail=$((fail + 1)); fi
done
echo "close-loss: $pass passed, $fail failed"
[ $fail -eq 0 ]
