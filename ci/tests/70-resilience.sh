#!/bin/bash
# Resilience: the harness over softroce, 2 ranks on 127.0.70.x (one device each), while
# softroce-ctl breaks rank 1's link:
#   * sendrecv and all_reduce while rank 1's port goes down for 1 s and back, three times: the run
#     completes, every result is checked (#wrong 0), both ends WARN each loss and each recovery;
#   * the link blackholed for 0.3 s (more than NCCL_IB_TIMEOUT x NCCL_IB_RETRY_CNT: the QPs fail)
#     and healed: the run completes, checked;
#   * blackholed past FERROCE_RECOVERY_TIMEOUT_SEC: both ranks fail with the "could not be
#     recovered" WARN within the bound, no hang;
#   * the peer killed while a recovery is in progress: rank 0 fails within a few seconds (its
#     side channel closed), far inside the recovery bound;
#   * a fused device of 2 members per rank, sendrecv and all_reduce while one member's port
#     goes down for 1 s and back, three times: the QPs move to the other member and back, all
#     checked; after the last failback the member that flapped carries data again (its QPs'
#     bytes sent grow, read from softroce's counters); and one member's path blackholed for 3 s (its port up): its QPs move to the other member
#     and are tried on it again after a doubling wait, the run completes, checked;
#   * the fused device active-standby (FERROCE_ACTIVE_STANDBY=1): while healthy the standby
#     member carries only its probes' zero-length writes; the primary's port flaps three times
#     (the QPs move to the standby and back), then the standby's path is blackholed for 3 s (its
#     probes fail and say so, the data stays on the primary): the run completes, checked;
#   * the fused device's failover and failback through 3 flaps again on InfiniBand ports
#     (SOFTROCE_LINK_LAYER=ib), every connection addressing its peer by LID;
#   * the flaps, the blackholes and the kill again with 1 % packet loss.
# Every run is bounded by `timeout`; the launcher kills its ranks, this script whatever is left.
set -u
# shellcheck source-path=SCRIPTDIR source=lib/softroce.sh
. "$(dirname "$0")/lib/softroce.sh"
H=$ROOT/target/release/harness
SR=$LIB
CTL=$SR/softroce-ctl

need "$H/all_reduce_perf" "$H/sendrecv_perf" "$ROOT/target/release/libnccl-net-ferroce.so" "$SR/libibverbs.so.1" "$CTL"

export SOFTROCE_CTL_DIR=$D/ctl
export LD_LIBRARY_PATH=$SR:$ROOT/target/release
export NCCL_SOCKET_IFNAME=lo
# Retries run out in 4 x 16.8 ms: a broken link is noticed fast.
export NCCL_IB_TIMEOUT=12 NCCL_IB_RETRY_CNT=3
BASE=127.0.70
R1=$BASE.2

# start NAME OUT PROGRAM ARGS...: the harness in the background (pid in $PID)
start() {
    local name=$1 out=$2
    shift 2
    echo "== $name: $(basename "$1") ${*:2}"
    timeout -k 5 120 "$@" --addr-base $BASE --timeout 110 >"$out" 2>&1 &
    PID=$!
    PIDS="$PIDS $PID"
}

# flaps ADDR N: N times port-down for 1 s, then port-up and 1 s of traffic
flaps() {
    for _ in $(seq "$2"); do
        "$CTL" "$1" port-down >/dev/null && sleep 1 && "$CTL" "$1" port-up >/dev/null && sleep 1 || return 1
    done
}

# wrong FILE: the sum of the #wrong column of every row
wrong() { awk '$1 ~ /^[0-9]+$/ && NF >= 9 {w += $9; n++} END {if (n == 0) print "no rows"; else print w}' "$1"; }
# figures FILE: what the recovery WARNs of a run say (time to recover, what was sent again)
figures() {
    python3 - "$1" <<'EOF'
import re, sys
t = open(sys.argv[1], errors="replace").read()
ms = [int(m) for m in re.findall(r"recovered over new QPs \(local QPNs [^)]*\) in (\d+) ms", t)]
chains = [(int(a), int(b)) for a, b in re.findall(r"chains posted again: (\d+) \((\d+) bytes\)", t)]
cts = [int(n) for n in re.findall(r"CTS entries written again: (\d+)", t)]
if ms:
    print(f"recovered in {min(ms)}-{max(ms)} ms; {sum(c for c, _ in chains)} chains ({sum(b for _, b in chains)} bytes) posted again; {sum(cts)} CTS entries written again")
EOF
}
# count FILE WORDS: lines of FILE containing WORDS
count() { grep -c -- "$2" "$1"; }

# checked_through_flaps NAME PROGRAM ARGS...: the run through 3 flaps of rank 1's port
checked_through_flaps() {
    local name=$1 out=$D/$1.out
    shift
    start "$name" "$out" "$@"
    local pid=$PID
    if ! wait_dev $R1 20; then
        ko "$name: rank 1's device never came up" "$out"
        return
    fi
    sleep 0.5
    flaps $R1 3 || ko "$name: softroce-ctl port-down/port-up failed" "$out"
    wait "$pid"
    local rc=$? lost recovered
    lost=$(count "$out" "recovering over new QPs")
    recovered=$(count "$out" "recovered over new QPs")
    if [ $rc -eq 0 ] && [ "$(wrong "$out")" = 0 ] && [ "$lost" -ge 3 ] && [ "$recovered" -ge 3 ]; then
        ok "$name: rc 0, #wrong 0, $lost losses and $recovered recoveries WARNed through 3 flaps; $(figures "$out")"
    else
        ko "$name (rc $rc, #wrong $(wrong "$out"), $lost lost, $recovered recovered)" "$out"
    fi
}

SR_ARGS=(-N 2 -b 1M -e 1M -n 16000 -w 1)
AR_ARGS=(-N 2 -b 4M -e 4M -n 5000 -w 1)

checked_through_flaps sendrecv-flaps env FERROCE_RECOVERY_TIMEOUT_SEC=30 "$H/sendrecv_perf" "${SR_ARGS[@]}"
checked_through_flaps all_reduce-flaps env FERROCE_RECOVERY_TIMEOUT_SEC=30 "$H/all_reduce_perf" "${AR_ARGS[@]}"
checked_through_flaps sendrecv-flaps-1pct-loss env SOFTROCE_LOSS=0.01 FERROCE_RECOVERY_TIMEOUT_SEC=30 NCCL_IB_RETRY_CNT=7 "$H/sendrecv_perf" -N 2 -b 1M -e 1M -n 12000 -w 1

# row FILE SIZE FIELD: the FIELD-th column of the table's row of SIZE bytes (6 time, 8 busbw)
row() { awk -v s="$2" -v f="$3" '$1 == s && NF >= 9 {v = $f} END {print v}' "$1"; }

# A fused device of 2 members per rank (--vdev 2: rank 0 on .1,.2, rank 1 on .3,.4) while
# rank 1's second member (.4) flaps 3 times: the QPs move to the member that is up (failover)
# and back once its port is (failback). Both sizes of the sendrecv run (768 KiB, then 1 MiB)
# are sized to last 12 s each unflapped, so that it still runs after the flaps (6.5 s from
# its start): then .4's QPs must carry data again, read from rank 1's softroce counters.
VNIC=(-N 2 --vdev 2 -w 1)
M1=$BASE.4
start "sendrecv 2 members unflapped" "$D/v2.out" env FERROCE_RECOVERY_TIMEOUT_SEC=30 "$H/sendrecv_perf" "${VNIC[@]}" -b 768K -e 1M -i 256K -n 500
wait "$PID"
T768=$(row "$D/v2.out" 786432 6)
# iterations for the first size to last 12 s unflapped (this host is noisy: a flapped run can
# be faster than the unflapped one it is sized by, and the second size adds as much again)
ITERS=$(awk -v t="$T768" 'BEGIN {n = t > 0 ? int(12e6 / t) : 0; print (n < 2000 ? 2000 : n)}')
# tx_bytes ADDR: the bytes the QPs of the device at ADDR have sent so far (softroce's counters)
tx_bytes() { "$CTL" "$1" counters | awk '/^qp / {for (i = 3; i <= NF; i++) {split($i, kv, "="); if (kv[1] == "tx_bytes") b += kv[2]}} END {printf "%.0f\n", b}'; }
# member_carries ADDR: whether the device at ADDR sends at least 1 MiB within one second, in
# one of 5 one-second windows (the last failback may still be under way in the first)
member_carries() {
    local before after
    for _ in 1 2 3 4 5; do
        before=$(tx_bytes "$1") && sleep 1 && after=$(tx_bytes "$1") || return 1
        CARRIED=$((after - before))
        [ "$CARRIED" -ge 1048576 ] && return 0
    done
    return 1
}
failover_run() {
    local name=$1 out=$D/$1.out check_after=$2
    shift 2
    start "$name" "$out" "$@"
    local pid=$PID carries=skip
    if wait_dev $M1 20; then
        sleep 0.5
        flaps $M1 3 || ko "$name: softroce-ctl port-down/port-up failed" "$out"
        if [ "$check_after" = after ]; then
            CARRIED=0
            member_carries $M1 && carries=yes || carries=no
        fi
    else
        ko "$name: rank 1's second member never came up" "$out"
    fi
    wait "$pid"
    local rc=$? back left
    back=$(count "$out" "moving its QPs back to it (failback)")
    left=$(count "$out" "failover: .* left out until")
    if [ $rc -eq 0 ] && [ "$(wrong "$out")" = 0 ] && [ "$back" -ge 3 ] && [ "$left" -ge 3 ]; then
        ok "$name: rc 0, #wrong 0 through 3 flaps of a member: $left recoveries over the member that stayed up, $back failbacks WARNed; $(figures "$out")"
    else
        ko "$name (rc $rc, #wrong $(wrong "$out"), $left failovers, $back failbacks)" "$out"
    fi
    case $carries in
    yes) ok "$name: after the last failback the member that flapped ($M1) carries data again ($CARRIED bytes sent in a second)" ;;
    no) ko "$name: after the last failback the member that flapped ($M1) sent $CARRIED bytes in a second (1 MiB wanted, in one of 5 seconds): its QPs did not come back" "$out" ;;
    esac
}
failover_run vnic-sendrecv-flaps after env FERROCE_RECOVERY_TIMEOUT_SEC=30 "$H/sendrecv_perf" "${VNIC[@]}" -b 768K -e 1M -i 256K -n "$ITERS"
# Long enough for the 3 flaps (6 s) on a quiet host too (4 MiB takes ~2 ms here then).
failover_run vnic-all_reduce-flaps - env FERROCE_RECOVERY_TIMEOUT_SEC=30 "$H/all_reduce_perf" "${VNIC[@]}" -b 4M -e 4M -n 6000

# The same failover with every softroce port InfiniBand (SOFTROCE_LINK_LAYER=ib: LIDs from
# softroce's subnet-manager stand-in, docs/softroce.md#infiniband-mode): checked as above, and
# the plugin's INFO lines (NCCL_DEBUG=INFO) must show every connection addressing its peer's
# member by LID without a GRH, so that the run cannot pass on RoCE ports.
failover_run vnic-sendrecv-flaps-ib - env SOFTROCE_LINK_LAYER=ib NCCL_DEBUG=INFO FERROCE_RECOVERY_TIMEOUT_SEC=30 "$H/sendrecv_perf" "${VNIC[@]}" -b 1M -e 1M -n "$ITERS"
out=$D/vnic-sendrecv-flaps-ib.out
conns=$(grep -acE '(send|recv) connection with' "$out")
by_lid=$(grep -acE '(send|recv) connection with .*, InfiniBand LID 0x[0-9a-f]+ -> DLID 0x[0-9a-f]+, no GRH,' "$out")
if [ "$conns" -gt 0 ] && [ "$conns" = "$by_lid" ]; then
    ok "the failover above ran on InfiniBand ports: $by_lid of $conns connections address their peer by LID, no GRH"
else
    ko "the InfiniBand failover: $by_lid of $conns connections by LID without a GRH" "$out"
fi

# A member whose port stays up while its path to the peer's member drops everything (rank 1's
# .4 to rank 0's .2 blackholed for 3 s, then healed): the QPs of the member that stopped
# answering move to the others, are tried on it again after a wait that doubles, and the run
# completes, checked.
echo "== fused device: one member's path blackholed for 3 s, then healed"
out=$D/vnic-blackhole.out
start "sendrecv, a member's path blackholed" "$out" env FERROCE_RECOVERY_TIMEOUT_SEC=30 "$H/sendrecv_perf" "${VNIC[@]}" -b 1M -e 1M -n 12000
pid=$PID
wait_dev $M1 20 && sleep 0.5 && "$CTL" $M1 blackhole $BASE.2 >/dev/null && sleep 3 && "$CTL" $M1 heal >/dev/null
wait "$pid"
rc=$?
left=$(count "$out" "failover: .* left out until")
retried=$(count "$out" "the wait after its path stopped answering is over")
if [ $rc -eq 0 ] && [ "$(wrong "$out")" = 0 ] && [ "$left" -ge 1 ] && [ "$retried" -ge 1 ]; then
    ok "a member's path blackholed 3 s: rc 0, #wrong 0, $left recoveries left a member out, $retried tried it again after the wait; $(figures "$out")"
else
    ko "a member's path blackholed (rc $rc, #wrong $(wrong "$out"), $left left out, $retried tried again)" "$out"
fi

# Active-standby: every QP on each rank's first member (rank 1's .3), the second (.4) connected
# and probed. Read from rank 1's softroce counters before the faults: the standby's QPs (one
# probe per comm) posted writes but moved no payload, the primary moved the data. Then the
# primary's port flaps 3 times (failover to the standby, failback), then the standby's path to
# rank 0's .2 is blackholed for 3 s: its probes fail with a WARN, a failover would pass it over.
echo "== fused device active-standby: the primary's port flaps, then the standby's path is blackholed"
P1=$BASE.3
out=$D/standby.out
T1M=$(row "$D/v2.out" 1048576 6)
SB_ITERS=$(awk -v t="$T1M" 'BEGIN {n = t > 0 ? int(16e6 / t) : 0; print (n < 4000 ? 4000 : n)}')
start "sendrecv, active-standby" "$out" env FERROCE_ACTIVE_STANDBY=1 FERROCE_RECOVERY_TIMEOUT_SEC=30 "$H/sendrecv_perf" "${VNIC[@]}" -b 1M -e 1M -n "$SB_ITERS"
pid=$PID
standby_qps="" standby_bytes="" standby_posts="" primary_bytes=""
if wait_dev $M1 20; then
    sleep 1.5
    # "qp N: ... send_wrs=W ... tx_bytes=B ...": per QP of the device; payload bytes are what
    # write_imm (data) and write WRs carry, so a probe-only QP has no write_imm and few bytes.
    read -r standby_qps standby_posts standby_bytes < <("$CTL" $M1 counters | awk '/^qp / {n++; for (i = 3; i <= NF; i++) {split($i, kv, "="); if (kv[1] == "send_wrs") w += kv[2]; if (kv[1] == "write_imm_wrs") m += kv[2]; if (kv[1] == "tx_bytes") b += kv[2]}} END {printf "%d %d %.0f\n", n, w, (m > 0 ? -1 : b)}')
    primary_bytes=$(tx_bytes $P1)
    flaps $P1 3 || ko "active-standby: softroce-ctl port-down/port-up failed" "$out"
    "$CTL" $M1 blackhole $BASE.2 >/dev/null && sleep 3 && "$CTL" $M1 heal >/dev/null
else
    ko "active-standby: rank 1's second member never came up" "$out"
fi
wait "$pid"
rc=$?
left=$(count "$out" "failover: .* left out until")
back=$(count "$out" "moving its QPs back to it (failback)")
unanswered=$(count "$out" "standby member .* does not answer")
echo "   before the faults: rank 1's standby has $standby_qps QPs, $standby_posts probe writes, $standby_bytes bytes sent (-1: it carried data); its primary sent $primary_bytes bytes"
if [ "$standby_qps" = 2 ] && [ "${standby_posts:-0}" -ge 2 ] && [ "${standby_bytes:--1}" -ge 0 ] && [ "$standby_bytes" -lt 65536 ] && [ "${primary_bytes:-0}" -ge 1048576 ]; then
    ok "active-standby: the standby carried only its probes ($standby_qps probe QPs, $standby_posts zero-length writes, $standby_bytes bytes of headers), the primary $primary_bytes bytes"
else
    ko "active-standby: the standby's QPs ($standby_qps, 2 wanted), probe writes $standby_posts, bytes $standby_bytes, primary bytes $primary_bytes" "$out"
fi
if [ $rc -eq 0 ] && [ "$(wrong "$out")" = 0 ] && [ "$left" -ge 3 ] && [ "$back" -ge 3 ] && [ "$unanswered" -ge 1 ]; then
    ok "active-standby: rc 0, #wrong 0 through 3 flaps of the primary ($left recoveries onto the standby, $back failbacks) and the standby's blackholed path ($unanswered probe failures WARNed); $(figures "$out")"
else
    ko "active-standby (rc $rc, #wrong $(wrong "$out"), $left failovers, $back failbacks, $unanswered probe failures)" "$out"
fi

# broken_links LOSS: the healed blackhole, the permanent one and the peer killed during a
# recovery, with SOFTROCE_LOSS=LOSS
broken_links() {
    local LOSS=$1 TAG="" SUFFIX="" out pid rc took victim launcher t0
    if [ "$LOSS" != 0 ]; then TAG=" (loss $LOSS)" SUFFIX=-loss; fi
    echo "== blackhole 0.3 s and heal$TAG"
    out=$D/heal$SUFFIX.out
    start "sendrecv, blackhole healed" "$out" env SOFTROCE_LOSS=$LOSS FERROCE_RECOVERY_TIMEOUT_SEC=30 "$H/sendrecv_perf" -N 2 -b 1M -e 1M -n 2000 -w 1
    pid=$PID
    wait_dev $R1 20 && sleep 0.5 && "$CTL" $R1 blackhole $BASE.1 >/dev/null && sleep 0.3 && "$CTL" $R1 heal >/dev/null
    wait "$pid"
    rc=$?
    if [ $rc -eq 0 ] && [ "$(wrong "$out")" = 0 ] && grep -q "recovered over new QPs" "$out"; then
        ok "blackhole 0.3 s then heal$TAG: rc 0, #wrong 0; $(figures "$out")"
    else
        ko "blackhole then heal$TAG (rc $rc, #wrong $(wrong "$out"))" "$out"
    fi

    echo "== blackhole past FERROCE_RECOVERY_TIMEOUT_SEC=3$TAG"
    out=$D/bound$SUFFIX.out
    start "sendrecv, blackhole for good" "$out" env SOFTROCE_LOSS=$LOSS FERROCE_RECOVERY_TIMEOUT_SEC=3 "$H/sendrecv_perf" -N 2 -b 1M -e 1M -n 100000 -w 1
    pid=$PID
    wait_dev $R1 20 && sleep 0.5 && "$CTL" $R1 blackhole $BASE.1 >/dev/null
    t0=$(date +%s)
    wait "$pid"
    rc=$?
    took=$(($(date +%s) - t0))
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $took -le 20 ] && grep -q "could not be recovered within" "$out"; then
        ok "blackhole for good$TAG: the run fails after $took s (bound 3 s) with the 'could not be recovered' WARN"
    else
        ko "blackhole for good$TAG (rc $rc after $took s)" "$out"
    fi

    echo "== the peer killed during a recovery$TAG"
    out=$D/kill$SUFFIX.out
    start "sendrecv, peer killed while recovering" "$out" env SOFTROCE_LOSS=$LOSS FERROCE_RECOVERY_TIMEOUT_SEC=60 "$H/sendrecv_perf" -N 2 -b 1M -e 1M -n 100000 -w 1
    pid=$PID
    victim=""
    if wait_dev $R1 20; then
        sleep 0.5
        "$CTL" $R1 blackhole $BASE.1 >/dev/null
        sleep 1
        # rank 1: the launcher (timeout's child) forks its ranks in rank order
        launcher=$(pgrep -P "$pid" | head -n 1)
        victim=$(pgrep -P "$launcher" | sort -n | sed -n 2p)
        [ -n "$victim" ] && kill -9 "$victim"
    fi
    t0=$(date +%s)
    wait "$pid"
    rc=$?
    took=$(($(date +%s) - t0))
    if [ -n "$victim" ] && [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $took -le 15 ] && grep -q "closed the connection" "$out"; then
        ok "peer killed during a recovery$TAG: rank 0 fails $took s later (recovery bound 60 s) naming the closed connection"
    else
        ko "peer killed during a recovery$TAG (victim '${victim}', rc $rc after $took s)" "$out"
    fi
}

broken_links 0
broken_links 0.01

finish
