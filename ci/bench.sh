#!/bin/bash
# `make bench` (the main job): the plugin's nccl-tests-style numbers on this host, next to
# perftest over the same fabric, and the ratios the project targets (issue 5):
#   P1 = plugin sendrecv throughput (best row >= 4 MiB) / ib_write_bw         target >= 0.97
#        (ib_write_bw is one-way, so P1 uses sendrecv_perf -O, rank 0 -> rank 1 only; the
#        two-way exchange is also compared with ib_write_bw -b, per direction)
#   P2 = plugin 8-byte half round trip (ping-pong median) / ib_write_lat       target <= 1.25
#   P3 = all_reduce busbw at 64 MiB / sendrecv throughput at 64 MiB (2 ranks)  target >= 0.90
# Fabric: the real RDMA devices `ibv_devices` lists, else softroce (each process its own
# 127.0.50.x / 127.0.51.x address). Every process is time-bounded and cleaned up.
# Knobs: BENCH_MAX (largest size, default 64M), BENCH_ITERS (default 20), BENCH_OUT (results
# folder, default target/bench), BENCH_SCALE=0 skips the 1024-connection scale benchmark.
# Exit status: 0 when everything ran and every result was correct (targets missed are reported,
# not failed); 1 when a part could not run or a result was wrong.
set -u
cd "$(dirname "$0")/.."
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
if [ -n "$real_devs" ]; then
    FABRIC="RDMA devices: $(echo $real_devs)"
    export LD_LIBRARY_PATH=$REL${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    PT_DEV=$(echo "$real_devs" | head -n 1)
    PT_SENV=""
    PT_CENV=""
    PT_HOST=127.0.0.1
    SOFTROCE_FLAG="--softroce 0"
else
    [ -e "$SR/libibverbs.so.1" ] || { echo "bench: no RDMA device and no $SR/libibverbs.so.1 (run make build)" >&2; exit 1; }
    FABRIC="softroce (userspace RoCEv2 over UDP on loopback; no RDMA device on this host)"
    export LD_LIBRARY_PATH=$SR:$REL${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    PT_DEV=softroce0
    PT_SENV="SOFTROCE_ADDR=127.0.51.1"
    PT_CENV="SOFTROCE_ADDR=127.0.51.2"
    PT_HOST=127.0.51.1
    SOFTROCE_FLAG="--softroce 1 --addr-base 127.0.50"
fi
say "# ferroce make bench — $(date -u '+%Y-%m-%d %H:%M UTC') — $(git rev-parse --short HEAD 2>/dev/null || echo '?') — $(nproc) CPUs"
say "# fabric: $FABRIC"

# run_harness NAME TIMEOUT PROGRAM ARGS...: runs one harness program, output to the terminal and $OUT/NAME.txt
run_harness() {
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

# ---- 1. the plugin: sendrecv, ping-pong latency, allreduce ------------------------------------
run_harness sendrecv 240 "$H/sendrecv_perf" -N 2 -b 8 -e "$MAX" -f 2 -n "$ITERS" -w 2 --csv "$OUT/sendrecv.csv"
sr_ok=$?
run_harness sendrecv_oneway 120 "$H/sendrecv_perf" -N 2 -O -b 4M -e "$MAX" -f 2 -n "$ITERS" -w 2 --csv "$OUT/sendrecv_oneway.csv"
run_harness pingpong 120 "$H/sendrecv_perf" -N 2 -P -b 8 -e 8 -n 2000 -w 100 --csv "$OUT/pingpong.csv"
pp_ok=$?
run_harness all_reduce 300 "$H/all_reduce_perf" -N 2 -b 8 -e "$MAX" -f 2 -n "$ITERS" -w 2 --csv "$OUT/all_reduce.csv"
ar_ok=$?

# ---- 2. perftest over the same fabric ---------------------------------------------------------
# perftest PORT NAME TOOL ARGS...: server in the background, client in front, both bounded.
perftest() {
    local port=$1 name=$2 tool=$3
    shift 3
    echo
    echo "== $name: $tool -d $PT_DEV $* (server $PT_SENV, client $PT_CENV)"
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
    grep -E '^ *#bytes|^ *[0-9]+ +[0-9]+ ' "$OUT/$name.txt"
    if [ $crc -ne 0 ] || [ $src -ne 0 ]; then
        problem "$name: client exit $crc, server exit $src ($(tail -n 2 "$OUT/$name.txt" | tr '\n' ' '))"
        return 1
    fi
}
perftest 28561 ib_write_bw ib_write_bw -s 4194304 -n 1000
perftest 28562 ib_write_bw_bidir ib_write_bw -s 4194304 -n 1000 -b
perftest 28563 ib_write_lat ib_write_lat -s 8 -n 5000

# ---- 3. ratios --------------------------------------------------------------------------------
# perftest reports MB/sec with MB = 2^20 bytes; the harness reports GB/s = 1e9 bytes/s.
wbw=$(awk '$1 == 4194304 {printf "%.4f", $4 * 1048576 / 1e9; exit}' "$OUT/ib_write_bw.txt" 2>/dev/null)
wbwb=$(awk '$1 == 4194304 {printf "%.4f", $4 * 1048576 / 1e9 / 2; exit}' "$OUT/ib_write_bw_bidir.txt" 2>/dev/null)
wlat=$(awk '$1 == 8 && NF >= 5 {print $5; exit}' "$OUT/ib_write_lat.txt" 2>/dev/null)
# best row >= 4 MiB (busbw = column 8), and which size
best_row() { awk '$1 ~ /^[0-9]+$/ && $1 >= 4194304 && $8 > b {b = $8; s = $1} END {if (s) print b, s}' "$1" 2>/dev/null; }
read -r sr_best sr_best_size < <(best_row "$OUT/sendrecv.txt")
read -r ow_best ow_best_size < <(best_row "$OUT/sendrecv_oneway.txt")
sr64=$(row_val "$OUT/sendrecv.txt" 67108864 8)
ar64=$(row_val "$OUT/all_reduce.txt" 67108864 8)
pp=$(row_val "$OUT/pingpong.txt" 8 6)

ratio() { # ratio NAME NUM DEN OP TARGET TEXT
    local name=$1 num=$2 den=$3 op=$4 target=$5 text=$6
    if [ -z "$num" ] || [ -z "$den" ]; then
        say "$(printf '%-3s %-72s n/a (%s)' "$name" "$text" "missing: $([ -z "$num" ] && echo plugin figure) $([ -z "$den" ] && echo reference figure)")"
        return
    fi
    awk -v n="$num" -v d="$den" -v op="$op" -v t="$target" -v name="$name" -v text="$text" 'BEGIN {
        r = (d > 0) ? n / d : 0
        ok = (op == ">=") ? (r >= t) : (r <= t)
        printf "%-3s %-75s %6.3f   (target %s %.2f: %s)\n", name, text " = " n " / " d, r, op, t, ok ? "met" : "MISSED"
    }' | tee -a "$SUMMARY"
}
echo
say "# results (GB/s = 1e9 bytes/s; latency in us)"
say "sendrecv_perf -O one way, best >= 4 MiB: ${ow_best:-n/a} GB/s${ow_best_size:+ at $ow_best_size B}"
say "sendrecv_perf 2 ranks, best >= 4 MiB : ${sr_best:-n/a} GB/s${sr_best_size:+ at $sr_best_size B}; at 64 MiB: ${sr64:-n/a} GB/s"
say "all_reduce_perf 2 ranks busbw, 64 MiB: ${ar64:-n/a} GB/s"
say "ping-pong 8 B, median round trip / 2 : ${pp:-n/a} us"
say "ib_write_bw 4 MiB                    : ${wbw:-n/a} GB/s (bidirectional, per direction: ${wbwb:-n/a} GB/s)"
say "ib_write_lat 8 B t_typical           : ${wlat:-n/a} us"
ratio P1 "$ow_best" "$wbw" ">=" 0.97 "sendrecv one-way throughput (>= 4 MiB) / ib_write_bw"
ratio P2 "$pp" "$wlat" "<=" 1.25 "8-byte half round trip / ib_write_lat"
ratio P3 "$ar64" "$sr64" ">=" 0.90 "all_reduce busbw 64 MiB / sendrecv 64 MiB"
ratio P1b "$sr_best" "$wbwb" ">=" 0.97 "sendrecv two-way (>= 4 MiB) / ib_write_bw -b per direction"

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
if [ "${BENCH_SCALE:-1}" != 0 ]; then
    SOFTROCE_FLAG=${SOFTROCE_FLAG/127.0.50/127.0.52}
    if run_harness scale 240 "$H/scale_bench" -N 2 --conns 1024; then
        grep '^scale_bench ' "$OUT/scale.txt" >>"$SUMMARY"
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
