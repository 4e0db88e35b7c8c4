#!/bin/bash
# `make bench` (the main job): the plugin's nccl-tests-style numbers on this host, next to
# perftest over the same fabric, and the ratios the project targets:
#   P1 = plugin sendrecv throughput at >= 4 MiB / ib_write_bw (4 MiB)          target >= 0.97
#        ib_write_bw streams 4 MiB writes into one 4 MiB buffer, so P1 uses sendrecv_perf -O
#        (rank 0 -> 1 only, iterations streamed) with 4 MiB messages into a 4 MiB buffer; the
#        larger rows of the one-way table use buffers beyond a small host's L3 and are slower
#        for that reason alone (the NIC's copies miss the cache)
#   P2 = plugin 8-byte half round trip (ping-pong median) / ib_write_lat       target <= 1.25
#   P3 = all_reduce busbw at 64 MiB / sendrecv busbw at 64 MiB (2 ranks)       target >= 0.90
#   P7 = all_reduce time(S) / (2 x sendrecv time(S/2)), 2 ranks, S = 64 KiB .. 4 MiB (one
#        reduce-scatter and one all-gather step of S/2 each, so 1.0 is the model)  target <= 1.10
#   P8 = sendrecv_perf 8 B time (both ranks send and receive each iteration) / ib_write_lat
#        (one network trip: the eager path, FERROCE_EAGER_MAX)                   target <= 1.30
#   E1, E2 = sendrecv_perf and all_reduce_perf 8 B time, eager path on / off (FERROCE_EAGER_MAX=0)
#        in the same round; E2 target <= 0.50 (the 8-byte all_reduce time halved)
#   I1, I2 = over softroce, one round of the one-way 4 MiB throughput and the 8-byte ping-pong on
#        InfiniBand ports (SOFTROCE_LINK_LAYER=ib) / the same on RoCE ports; no target
# and the verbs work per message: post calls, WRs, signaled completions, CQ polls,
# packets, CTS writes, with the targets <= 1 post call per QP a message uses (each side), <= 1
# signaled completion per QP per send, <= 1 CTS write per irecv (ci/work-counts.py); and
#   F1 = file descriptors per connection at 1024 connections between two processes (scale_bench:
#        all both processes opened for them, the comms of the pair sharing one side-channel link)
#                                                                                target <= 0.10
# BENCH_ROUNDS (7) rounds each run the plugin and perftest back to back; a ratio is the median of
# the rounds' ratios, so that load from other processes (which drifts) hits both sides alike.
# Fabric: the real RDMA devices `ibv_devices` lists, else softroce (each process its own
# 127.0.50.x / 127.0.51.x address). Every process is time-bounded and cleaned up.
# Knobs: BENCH_MAX (largest size, default 64M), BENCH_ITERS (default 20), BENCH_OUT (results
# folder, default target/bench), BENCH_ROUNDS (7), BENCH_DIAG=0 skips the diagnosis runs,
# BENCH_SCALE=0 skips the 1024-connection scale benchmark, BENCH_IB=0 the InfiniBand round, BENCH_FABRIC=softroce uses softroce
# even where RDMA devices exist.
# Exit status: 0 when everything ran and every result was correct (targets missed are reported,
# not failed); 1 when a part could not run or a result was wrong.
set -u
# --baseline-plugin PATH: afterwards, ferroce against that plugin side by side (bench-compare.sh).
BASELINE=""
if [ "${1:-}" = --baseline-plugin ]; then
    BASELINE=${2:?--baseline-plugin needs a path}
    BASELINE=$(cd "$(dirname "$BASELINE")" && pwd)/$(basename "$BASELINE")
fi
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
REL=$ROOT/target/release
H=$REL/harness
SR=$REL/softroce
OUT=${BENCH_OUT:-$ROOT/target/bench}
MAX=${BENCH_MAX:-64M}
ITERS=${BENCH_ITERS:-20}
mkdir -p "$OUT"
rm -f "$OUT"/*.csv "$OUT"/*.txt "$OUT"/*.svg 2>/dev/null
SUMMARY=$OUT/summary.txt
PROBLEMS=()
PIDS=""
cleanup() {
    for p in $PIDS; do kill "$p" 2>/dev/null; done
    wait 2>/dev/null
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say() { echo "$*" | tee -a "$SUMMARY"; }
problem() {
    PROBLEMS+=("$1")
    echo "bench: COULD NOT RUN: $1" >&2
}
: >"$SUMMARY"

# ---- what to run on --------------------------------------------------------------------------
for f in "$REL/libnccl-net-ferroce.so" "$H/all_reduce_perf" "$H/sendrecv_perf" "$H/scale_bench"; do
    [ -e "$f" ] || { echo "bench: missing $f: run make build first" >&2; exit 1; }
done
real_devs=$(env -u LD_LIBRARY_PATH ibv_devices 2>/dev/null | awk 'NR > 2 && NF >= 1 {print $1}' | grep -v '^softroce' || true)
[ "${BENCH_FABRIC:-auto}" = softroce ] && real_devs=""
if [ -n "$real_devs" ]; then
    FABRIC="RDMA devices: $(echo $real_devs)"
    export LD_LIBRARY_PATH=$REL${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    PT_DEV=$(echo "$real_devs" | head -n 1)
    PT_SENV=""
    PT_CENV=""
    PT_HOST=127.0.0.1
    SOFTROCE_FLAG="--softroce 0"
    PT_MODES=("")
else
    [ -e "$SR/libibverbs.so.1" ] || { echo "bench: no RDMA device and no $SR/libibverbs.so.1 (run make build)" >&2; exit 1; }
    FABRIC="softroce (userspace RoCEv2 over UDP on loopback; no RDMA device on this host)"
    export LD_LIBRARY_PATH=$SR:$REL${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    PT_DEV=softroce0
    PT_SENV="SOFTROCE_ADDR=127.0.51.1"
    PT_CENV="SOFTROCE_ADDR=127.0.51.2"
    PT_HOST=127.0.51.1
    SOFTROCE_FLAG="--softroce 1 --addr-base 127.0.50"
    PT_MODES=("" "SOFTROCE_INLINE_RX=0")
fi
say "# ferroce make bench — $(date -u '+%Y-%m-%d %H:%M UTC') — $(git rev-parse --short HEAD 2>/dev/null || echo '?') — $(nproc) CPUs"
say "# fabric: $FABRIC"

# run_harness_ NAME TIMEOUT PROGRAM ARGS...: runs one harness program, output to the terminal and $OUT/NAME.txt
run_harness_() {
    local name=$1 t=$2 prog=$3
    shift 3
    echo
    echo "== $name: $(basename "$prog") $*"
    # shellcheck disable=SC2086
    timeout -k 5 "$t" "$prog" $SOFTROCE_FLAG --timeout $((t - 5)) "$@" 2>&1 | tee "$OUT/$name.txt"
    local rc=${PIPESTATUS[0]}
    if [ "$rc" -ne 0 ]; then
        local why
        why=$(grep -m1 -E 'error:|WARN|timeout|FAILED' "$OUT/$name.txt" | sed 's/^ *//')
        problem "$name (exit $rc): ${why:-see $OUT/$name.txt}"
        return 1
    fi
    return 0
}

# value of column COL (1-based) in the row of SIZE bytes of a harness table
row_val() { awk -v s="$2" -v c="$3" '$1 == s && $1 ~ /^[0-9]+$/ {print $c; exit}' "$1" 2>/dev/null; }

# ---- 0. can the plugin move data at all? -----------------------------------------------------
PLUGIN_OK=1
echo
echo "== smoke: one 8-byte exchange through the plugin"
# shellcheck disable=SC2086
if ! timeout -k 5 60 "$H/sendrecv_perf" $SOFTROCE_FLAG --timeout 55 -N 2 -b 8 -e 8 -n 1 -w 0 >"$OUT/smoke.txt" 2>&1; then
    PLUGIN_OK=0
    problem "the plugin cannot move data here, so none of its benchmarks ran (perftest still runs): $(grep -m1 -E 'WARN|error:' "$OUT/smoke.txt" | sed 's/^ *//')"
else
    echo "   ok"
fi
run_harness() { # NAME TIMEOUT PROGRAM ARGS... (only when the smoke test passed)
    [ "$PLUGIN_OK" = 1 ] || return 1
    run_harness_ "$@"
}

# ---- 1. the plugin's tables (NCCL-like pipeline: 512 KiB steps, 8 in flight per comm) --------
run_harness sendrecv 240 "$H/sendrecv_perf" -N 2 -b 8 -e "$MAX" -f 2 -n "$ITERS" -w 2 --csv "$OUT/sendrecv.csv"
run_harness all_reduce 300 "$H/all_reduce_perf" -N 2 -b 8 -e "$MAX" -f 2 -n "$ITERS" -w 2 --csv "$OUT/all_reduce.csv"
# one way (rank 0 -> rank 1), 4 MiB messages as ib_write_bw -s 4M sends them
run_harness sendrecv_oneway 120 "$H/sendrecv_perf" -N 2 -O --chunk 4M -b 4M -e "$MAX" -f 2 -n "$ITERS" -w 2 --csv "$OUT/sendrecv_oneway.csv"
run_harness pingpong 120 "$H/sendrecv_perf" -N 2 -P -b 8 -e 8 -n 2000 -w 100

# ---- 1b. verbs work per message: softroce's counters and the plugin's own
# statistics (FERROCE_STATS) around each size's timed iterations; the targets are PASS/FAIL lines
# with their figure (a FAIL is reported, not an error of the bench)
for w in sendrecv all_reduce; do
    if FERROCE_STATS=$OUT/work-stats run_harness "work_$w" 180 "$H/${w}_perf" -N 2 -b 4 -e 4M -f 16 -n "$ITERS" -w 2 --stats; then
        say "# verbs work, $w 2 ranks, NCCL_IB_QPS_PER_CONNECTION=${NCCL_IB_QPS_PER_CONNECTION:-1}"
        python3 "$ROOT/ci/work-counts.py" table "$w" "$OUT/work_$w.txt" | tee -a "$SUMMARY"
        QPS=${NCCL_IB_QPS_PER_CONNECTION:-1} python3 "$ROOT/ci/work-counts.py" targets "$w" "$OUT/work_$w.txt" | tee -a "$SUMMARY" ||
            problem "work_$w: no plugin figures in $OUT/work_$w.txt"
    fi
done

# ---- 2. perftest over the same fabric ---------------------------------------------------------
# perftest PORT NAME TOOL ARGS...: server in the background, client in front, both bounded.
perftest() {
    local port=$1 name=$2 tool=$3
    shift 3
    command -v "$tool" >/dev/null || { problem "$name: $tool not installed (apt-get install perftest)"; return 1; }
    # shellcheck disable=SC2086
    env $PT_SENV timeout -k 5 60 "$tool" -d "$PT_DEV" -p "$port" "$@" >"$OUT/$name.server.txt" 2>&1 &
    local spid=$!
    PIDS="$PIDS $spid"
    for _ in $(seq 100); do
        ss -ltnH "sport = :$port" 2>/dev/null | grep -q . && break
        sleep 0.05
    done
    # shellcheck disable=SC2086
    env $PT_CENV timeout -k 5 60 "$tool" -d "$PT_DEV" -p "$port" "$@" "$PT_HOST" >"$OUT/$name.txt" 2>&1
    local crc=$?
    wait "$spid"
    local src=$?
    if [ $crc -ne 0 ] || [ $src -ne 0 ]; then
        problem "$name: client exit $crc, server exit $src ($(tail -n 2 "$OUT/$name.txt" | tr '\n' ' '))"
        return 1
    fi
}
show_perftest() { # NAME TOOL ARGS...
    local name=$1
    shift
    echo
    echo "== $name: $* -d $PT_DEV (server $PT_SENV, client $PT_CENV)"
    perftest 28561 "$@" && grep -E '^ *#bytes|^ *[0-9]+ +[0-9]+ ' "$OUT/$name.txt"
}
show_perftest ib_write_bw ib_write_bw ib_write_bw -s 4194304 -n 1000
show_perftest ib_write_bw_bidir ib_write_bw_bidir ib_write_bw -s 4194304 -n 1000 -b
show_perftest ib_write_lat ib_write_lat ib_write_lat -s 8 -n 5000

# ---- 3. ratios: the plugin and perftest measured alternately, median of ROUNDS rounds ---------
# This host may be shared and has few cores: a figure alone drifts with the load, so each ratio
# compares medians of runs made side by side.
ROUNDS=${BENCH_ROUNDS:-7}
# perftest reports MB/sec with MB = 2^20 bytes; the harness reports GB/s = 1e9 bytes/s.
pt_bw() { awk -v s="$2" '$1 == s {printf "%.4f", $4 * 1048576 / 1e9; exit}' "$OUT/$1.txt" 2>/dev/null; }
pt_lat() { awk '$1 == 8 && NF >= 5 {print $5; exit}' "$OUT/$1.txt" 2>/dev/null; }
# pt_best bw|lat PORT NAME SIZE TOOL ARGS...: sets PTV to the better figure of the perftest runs
# made under each of PT_MODES (over softroce: its inline receiving on, as the plugin runs, and
# off; ib_write_lat spins on memory without yielding and is faster with the engine receiving
# alone), so that no softroce setting handicaps the baseline.
pt_best() {
    local kind=$1 port=$2 name=$3 size=$4
    shift 4
    local best="" v mode save_s=$PT_SENV save_c=$PT_CENV
    for mode in "${PT_MODES[@]}"; do
        PT_SENV="$save_s $mode"
        PT_CENV="$save_c $mode"
        v=""
        if perftest "$port" "$name" "$@"; then
            if [ "$kind" = bw ]; then v=$(pt_bw "$name" "$size"); else v=$(pt_lat "$name"); fi
        fi
        best=$(awk -v a="$best" -v b="$v" -v k="$kind" 'BEGIN {
            if (a == "") print b; else if (b == "") print a
            else if (k == "bw") print (b + 0 > a + 0 ? b : a); else print (b + 0 < a + 0 ? b : a) }')
    done
    PT_SENV=$save_s
    PT_CENV=$save_c
    PTV=$best
}
# quiet harness run NAME SIZE COL PROGRAM ARGS...: sets HV to column COL of the SIZE row (or "")
hv() {
    local name=$1 size=$2 col=$3
    shift 3
    HV=""
    [ "$PLUGIN_OK" = 1 ] || return 1
    # shellcheck disable=SC2086
    timeout -k 5 120 "$@" $SOFTROCE_FLAG --timeout 110 >"$OUT/$name.txt" 2>&1
    local rc=$?
    if [ $rc -eq 0 ]; then
        HV=$(awk -v s="$size" -v c="$col" '$1 == s {print $c; exit}' "$OUT/$name.txt")
    else
        local keep="$OUT/$name.failed.$(date +%H%M%S).txt"
        cp "$OUT/$name.txt" "$keep"
        problem "$name (exit $rc, output in $keep): $(grep -v '^#' "$OUT/$name.txt" | grep -m1 -E 'error:|WARN|signal|timeout' || tail -n 1 "$OUT/$name.txt")"
    fi
}
median() { tr ' ' '\n' | grep -E '^[0-9.]+$' | sort -g | awk '{v[NR] = $1} END {if (NR) print v[int((NR + 1) / 2)]}'; }
W_BW="" O_BW="" W_LAT="" P_LAT="" S64="" A64="" P_LAT_ST="" O_BW_ST="" SR8="" SR8_OFF="" AR8="" AR8_OFF=""
# P7: per size S, each round's all_reduce time(S) and 2 x sendrecv time(S/2) (out-of-place us)
P7_SIZES="65536 262144 1048576 4194304"
declare -A P7_AR P7_SR
row_time() { awk -v s="$2" '$1 == s {print $6; exit}' "$OUT/$1.txt" 2>/dev/null; }
echo
echo "== ratio rounds ($ROUNDS): ib_write_bw 4M | plugin one-way 4 MiB | ib_write_lat 8 | plugin ping-pong 8 | sendrecv 64M | all_reduce 64M"
for r in $(seq "$ROUNDS"); do
    pt_best bw 28562 r_wbw 4194304 ib_write_bw -s 4194304 -n 500
    W_BW="$W_BW ${PTV:--}"
    # 4 MiB messages into a 4 MiB buffer, streamed: what ib_write_bw -s 4M does (1 GiB here)
    hv r_oneway 4194304 8 "$H/sendrecv_perf" -N 2 -O --chunk 4M -b 4M -e 4M -n 256 -w 4 -c 0
    O_BW="$O_BW ${HV:--}"
    pt_best lat 28563 r_wlat 8 ib_write_lat -s 8 -n 2000
    W_LAT="$W_LAT ${PTV:--}"
    hv r_pingpong 8 6 "$H/sendrecv_perf" -N 2 -P -b 8 -e 8 -n 2000 -w 100 -c 0
    P_LAT="$P_LAT ${HV:--}"
    hv r_sendrecv 67108864 8 "$H/sendrecv_perf" -N 2 -b 64M -e 64M -n 12 -w 1 -c 0
    S64="$S64 ${HV:--}"
    hv r_all_reduce 67108864 8 "$H/all_reduce_perf" -N 2 -b 64M -e 64M -n 12 -w 1 -c 0
    A64="$A64 ${HV:--}"
    # The cost of the plugin's statistics (FERROCE_STATS): the same two runs with them on.
    hv r_pingpong_stats 8 6 env FERROCE_STATS="$OUT/stats" "$H/sendrecv_perf" -N 2 -P -b 8 -e 8 -n 2000 -w 100 -c 0
    P_LAT_ST="$P_LAT_ST ${HV:--}"
    hv r_oneway_stats 4194304 8 env FERROCE_STATS="$OUT/stats" "$H/sendrecv_perf" -N 2 -O --chunk 4M -b 4M -e 4M -n 256 -w 4 -c 0
    O_BW_ST="$O_BW_ST ${HV:--}"
    # 8 bytes each way per iteration: with the eager path one network trip, without it two (the
    # receiver's CTS, then the data); the same runs with it off, in the same round.
    hv r_sr8 8 6 "$H/sendrecv_perf" -N 2 -b 8 -e 8 -n 2000 -w 100 -c 0
    SR8="$SR8 ${HV:--}"
    hv r_sr8_off 8 6 env FERROCE_EAGER_MAX=0 "$H/sendrecv_perf" -N 2 -b 8 -e 8 -n 2000 -w 100 -c 0
    SR8_OFF="$SR8_OFF ${HV:--}"
    hv r_ar8 8 6 "$H/all_reduce_perf" -N 2 -b 8 -e 8 -n 2000 -w 100 -c 0
    AR8="$AR8 ${HV:--}"
    hv r_ar8_off 8 6 env FERROCE_EAGER_MAX=0 "$H/all_reduce_perf" -N 2 -b 8 -e 8 -n 2000 -w 100 -c 0
    AR8_OFF="$AR8_OFF ${HV:--}"
    hv r_p7_all_reduce 65536 6 "$H/all_reduce_perf" -N 2 -b 64K -e 4M -f 4 -n "$ITERS" -w 2 -c 0
    hv r_p7_sendrecv 32768 6 "$H/sendrecv_perf" -N 2 -b 32K -e 2M -f 4 -n "$ITERS" -w 2 -c 0
    for s in $P7_SIZES; do
        a=$(row_time r_p7_all_reduce "$s")
        h=$(row_time r_p7_sendrecv $((s / 2)))
        P7_AR[$s]="${P7_AR[$s]:-} ${a:--}"
        P7_SR[$s]="${P7_SR[$s]:-} $(awk -v t="$h" 'BEGIN {if (t ~ /^[0-9.]+$/) printf "%.2f", 2 * t; else print "-"}')"
    done
    echo "   round $r: $(echo $W_BW | awk '{print $NF}') | $(echo $O_BW | awk '{print $NF}') GB/s | $(echo $W_LAT | awk '{print $NF}') | $(echo $P_LAT | awk '{print $NF}') us | $(echo $S64 | awk '{print $NF}') | $(echo $A64 | awk '{print $NF}') GB/s"
done
wbw=$(echo $W_BW | median)
ow=$(echo $O_BW | median)
wlat=$(echo $W_LAT | median)
pp=$(echo $P_LAT | median)
sr64=$(echo $S64 | median)
ar64=$(echo $A64 | median)
wbwb=$(awk '$1 == 4194304 {printf "%.4f", $4 * 1048576 / 1e9 / 2; exit}' "$OUT/ib_write_bw_bidir.txt" 2>/dev/null)
sr_best=$(awk '$1 ~ /^[0-9]+$/ && $1 >= 4194304 && $8 > b {b = $8} END {if (b) print b}' "$OUT/sendrecv.txt" 2>/dev/null)

# ratio NAME "NUMS" "DENS" OP TARGET TEXT: the ratio of each round's pair (measured back to back,
# so load drift cancels), and their median
ratio() {
    local name=$1 nums=$2 dens=$3 op=$4 target=$5 text=$6
    local rs
    rs=$(awk -v n="$nums" -v d="$dens" 'BEGIN {
        k = split(n, a, " "); split(d, b, " ")
        for (i = 1; i <= k; i++) if (a[i] ~ /^[0-9.]+$/ && b[i] ~ /^[0-9.]+$/ && b[i] > 0) printf "%.3f ", a[i] / b[i]
    }')
    local med
    med=$(echo $rs | median)
    if [ -z "$med" ]; then
        say "$(printf '%-3s %-58s n/a (no round has both figures)' "$name" "$text")"
        return
    fi
    awk -v r="$med" -v op="$op" -v t="$target" -v name="$name" -v text="$text" -v rs="$rs" 'BEGIN {
        ok = (op == ">=") ? (r >= t) : (r <= t)
        printf "%-3s %-58s %6.3f  (target %s %.2f: %s; rounds: %s)\n", name, text, r, op, t, ok ? "met" : "MISSED", rs
    }' | tee -a "$SUMMARY"
}
echo
say "# $ROUNDS rounds, each running the plugin and perftest back to back (GB/s = 1e9 bytes/s; us)"
[ "${#PT_MODES[@]}" -gt 1 ] && say "# perftest figures: the better of softroce's inline receiving on and off (SOFTROCE_INLINE_RX=0) in each round"
say "ib_write_bw 4 MiB                            median ${wbw:-n/a} GB/s  (rounds:$W_BW)"
say "plugin one way 4 MiB (streamed)              median ${ow:-n/a} GB/s  (rounds:$O_BW)"
say "ib_write_lat 8 B t_typical                   median ${wlat:-n/a} us  (rounds:$W_LAT)"
say "plugin ping-pong 8 B, median RTT / 2         median ${pp:-n/a} us  (rounds:$P_LAT)"
say "sendrecv_perf 2 ranks 64 MiB (two-way)       median ${sr64:-n/a} GB/s  (rounds:$S64)"
say "all_reduce_perf 2 ranks 64 MiB busbw         median ${ar64:-n/a} GB/s  (rounds:$A64)"
say "# ratios: median over the rounds of each round's ratio"
ratio P1 "$O_BW" "$W_BW" ">=" 0.97 "plugin one-way throughput / ib_write_bw"
ratio P2 "$P_LAT" "$W_LAT" "<=" 1.25 "plugin 8-byte half round trip / ib_write_lat"
ratio P3 "$A64" "$S64" ">=" 0.90 "all_reduce busbw 64 MiB / sendrecv 64 MiB"
for s in $P7_SIZES; do
    ratio P7 "${P7_AR[$s]}" "${P7_SR[$s]}" "<=" 1.10 "all_reduce time($((s / 1024)) KiB) / 2 x sendrecv time($((s / 2048)) KiB)"
done
ratio P8 "$SR8" "$W_LAT" "<=" 1.30 "sendrecv 8 B time / ib_write_lat"
ratio E1 "$SR8" "$SR8_OFF" "<=" 1.00 "sendrecv 8 B time, eager path on / off"
ratio E2 "$AR8" "$AR8_OFF" "<=" 0.50 "all_reduce 8 B time, eager path on / off"
say "    eager path: FERROCE_EAGER_MAX=${FERROCE_EAGER_MAX:-224 (the default)}; sendrecv 8 B median $(echo $SR8 | median) us (off: $(echo $SR8_OFF | median)), all_reduce 8 B median $(echo $AR8 | median) us (off: $(echo $AR8_OFF | median))"
ratio S1 "$P_LAT_ST" "$P_LAT" "<=" 1.10 "ping-pong 8 B, statistics on / off"
ratio S2 "$O_BW_ST" "$O_BW" ">=" 0.95 "one-way 4 MiB, statistics on / off"
say "    context: sendrecv two-way best >= 4 MiB ${sr_best:-n/a} GB/s vs ib_write_bw -b ${wbwb:-n/a} GB/s per direction"

# ---- 3b. where the time goes (one run each) ---------------------------------------------------
if [ "${BENCH_DIAG:-1}" != 0 ] && [ "$PLUGIN_OK" = 1 ]; then
    echo
    echo "== diagnosis"
    hv d_oneway_512k 33554432 8 "$H/sendrecv_perf" -N 2 -O -b 32M -e 32M -n 8 -w 1 -c 0
    d1=$HV
    hv d_oneway_512k_32 33554432 8 "$H/sendrecv_perf" -N 2 -O --steps 32 -b 32M -e 32M -n 8 -w 1 -c 0
    d2=$HV
    hv d_oneway_4m 33554432 8 "$H/sendrecv_perf" -N 2 -O --chunk 4M -b 32M -e 32M -n 8 -w 1 -c 0
    d3=$HV
    say "one way 32 MiB: ${d3:-n/a} GB/s in 4 MiB messages; in NCCL-sized 512 KiB messages ${d1:-n/a} GB/s with 8 in flight, ${d2:-n/a} GB/s with 32"
    # receives all posted before the timed window: no CTS write travels while it is measured
    nocts=""
    for _ in 1 2 3; do
        hv d_pingpong_nocts 8 6 "$H/sendrecv_perf" -N 2 -P --steps 32 -b 8 -e 8 -n 32 -w 0 -c 0
        nocts="$nocts $HV"
    done
    say "ping-pong 8 B with every receive posted beforehand (no CTS write during the timed window): $(echo $nocts | median) us (runs:$nocts)"
    hv d_stats 33554432 8 "$H/sendrecv_perf" -N 2 -O --chunk 4M -b 32M -e 32M -n 8 -w 1 -c 0 --stats
    grep -E '^# cpu|^#   rank' "$OUT/d_stats.txt" | tee -a "$SUMMARY"
    hv d_stats_ar 67108864 8 "$H/all_reduce_perf" -N 2 -b 64M -e 64M -n 8 -w 1 -c 0 --stats
    grep -E '^# cpu|^#   rank' "$OUT/d_stats_ar.txt" | sed 's/^# cpu during/# all_reduce: cpu during/' | tee -a "$SUMMARY"
fi

# ---- 3c. one round on InfiniBand ports (softroce only) --------------------------------------
# softroce's InfiniBand mode (SOFTROCE_LINK_LAYER=ib, docs/softroce.md#infiniband-mode): a
# round's one-way 4 MiB and 8-byte ping-pong runs, each right after the same run on RoCE ports;
# the ratios are for information (no target: the IB carriage is an emulation). An 8-byte exchange
# at NCCL_DEBUG=INFO first checks that the plugin's connections addressed their peer by LID.
if [ -z "$real_devs" ] && [ "${BENCH_IB:-1}" != 0 ] && [ "$PLUGIN_OK" = 1 ]; then
    echo
    echo "== one round on InfiniBand ports (softroce's IB mode)"
    # shellcheck disable=SC2086
    SOFTROCE_LINK_LAYER=ib NCCL_DEBUG=INFO timeout -k 5 60 "$H/sendrecv_perf" $SOFTROCE_FLAG --timeout 55 -N 2 -b 8 -e 8 -n 1 -w 0 >"$OUT/ib_smoke.txt" 2>&1
    if grep -qE 'connection with .*, InfiniBand LID 0x[0-9a-f]+ -> DLID 0x[0-9a-f]+, no GRH' "$OUT/ib_smoke.txt"; then
        hv ib_oneway_roce 4194304 8 "$H/sendrecv_perf" -N 2 -O --chunk 4M -b 4M -e 4M -n 256 -w 4 -c 0
        bw_roce=$HV
        hv ib_oneway 4194304 8 env SOFTROCE_LINK_LAYER=ib "$H/sendrecv_perf" -N 2 -O --chunk 4M -b 4M -e 4M -n 256 -w 4 -c 0
        bw_ib=$HV
        hv ib_pingpong_roce 8 6 "$H/sendrecv_perf" -N 2 -P -b 8 -e 8 -n 2000 -w 100 -c 0
        lat_roce=$HV
        hv ib_pingpong 8 6 env SOFTROCE_LINK_LAYER=ib "$H/sendrecv_perf" -N 2 -P -b 8 -e 8 -n 2000 -w 100 -c 0
        lat_ib=$HV
        awk -v bi="$bw_ib" -v br="$bw_roce" -v li="$lat_ib" -v lr="$lat_roce" 'BEGIN {
            n = "^[0-9.]+$"
            if (bi ~ n && br ~ n && br > 0) printf "I1  %-58s %6.3f  (InfiniBand %s GB/s, RoCE %s GB/s; one round)\n", "one-way 4 MiB throughput, InfiniBand / RoCE ports", bi / br, bi, br
            else printf "I1  %-58s n/a\n", "one-way 4 MiB throughput, InfiniBand / RoCE ports"
            if (li ~ n && lr ~ n && lr > 0) printf "I2  %-58s %6.3f  (InfiniBand %s us, RoCE %s us; one round)\n", "ping-pong 8 B half round trip, InfiniBand / RoCE ports", li / lr, li, lr
            else printf "I2  %-58s n/a\n", "ping-pong 8 B half round trip, InfiniBand / RoCE ports"
        }' | tee -a "$SUMMARY"
    else
        problem "the InfiniBand round: the plugin's connections did not address their peer by LID on softroce's IB ports (see $OUT/ib_smoke.txt)"
    fi
fi

# ---- 4. plot ----------------------------------------------------------------------------------
csvs=$(ls "$OUT"/sendrecv.csv "$OUT"/sendrecv_oneway.csv "$OUT"/all_reduce.csv 2>/dev/null)
if [ -n "$csvs" ]; then
    refs=()
    [ -n "$wbw" ] && refs+=(--ref "ib_write_bw 4 MiB=$wbw")
    [ -n "$wbwb" ] && refs+=(--ref "ib_write_bw -b per dir.=$wbwb")
    # shellcheck disable=SC2086
    if python3 "$ROOT/nccl-tests-harness/plot_svg.py" -o "$OUT/busbw.svg" --title "ferroce over $(echo "$FABRIC" | cut -d' ' -f1): busbw vs size, 2 ranks" "${refs[@]}" $csvs >/dev/null; then
        say "plot: $OUT/busbw.svg"
    else
        problem "plot: plot_svg.py failed"
    fi
else
    say "plot: none (no harness results)"
fi

# ---- 5. scale: 1024 connections ---------------------------------------------------------------
if [ "${BENCH_SCALE:-1}" != 0 ] && [ "$PLUGIN_OK" = 1 ]; then
    SOFTROCE_FLAG=${SOFTROCE_FLAG/127.0.50/127.0.52}
    if run_harness scale 240 "$H/scale_bench" -N 2 --conns 1024; then
        grep '^scale_bench ' "$OUT/scale.txt" >>"$SUMMARY"
        # F1: side-channel descriptors per connection, the comms of a process pair
        # sharing one link (wire version 6)
        awk '/^scale_bench conns=/ {
            for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
            printf "F1  %-58s %6.3f  (target <= 0.10: %s; %s per peer process)\n",
                "file descriptors per connection, 1024 connections", v["fds_per_conn"],
                v["fds_per_conn"] <= 0.10 ? "met" : "MISSED", v["fds_per_peer"]
        }' "$OUT/scale.txt" | tee -a "$SUMMARY"
    fi
    # the same with every recv comm in rank 0 and every send comm in rank 1: each side's cost
    if run_harness scale_split 240 "$H/scale_bench" -N 2 -O --conns 1024; then
        grep '^scale_bench ' "$OUT/scale_split.txt" >>"$SUMMARY"
    fi
fi

if [ -n "$BASELINE" ]; then
    echo
    # Ten rounds at least: the ratios' 95 % intervals are bootstrapped over rounds.
    if ci/bench-compare.sh --baseline-plugin "$BASELINE" --rounds "${BENCH_COMPARE_ROUNDS:-10}" --max "$MAX" --out "$OUT"; then
        cat "$OUT/compare.txt" >>"$SUMMARY"
    else
        problem "the comparison with $BASELINE (ci/bench-compare.sh) failed"
    fi
fi

echo
say "# results in $OUT (tables *.txt, CSV, summary.txt, busbw.svg)"
if [ ${#PROBLEMS[@]} -gt 0 ]; then
    say "# NOT RUN / FAILED (${#PROBLEMS[@]}):"
    for p in "${PROBLEMS[@]}"; do say "#   - $p"; done
    exit 1
fi
exit 0
